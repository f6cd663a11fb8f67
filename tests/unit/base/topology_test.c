/*
 * Proves the topology file parser, checks and writer keep docs/formats/topology.md: the header's
 * example parses to the expected clusters, numbers and defaults; every kind of mistake (bad
 * syntax, unknown keys, bad ids and addresses, duplicates, limits) is rejected with the file name
 * and the right line number; a saved topology loads back identical; st_addr_split handles IPv4,
 * names and bracketed IPv6 and refuses malformed addresses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <unistd.h>

#include "strata/topology.h"

static const char example[] = "# comments and blank lines are ignored\n"
                              "project = p\n"
                              "instance = i\n"
                              "split_bytes = 268435456\n"
                              "\n"
                              "[cluster east]\n"
                              "zone = zone-a\n"
                              "node = 127.0.0.1:7101 /var/lib/strata/east-0\n"
                              "node = 127.0.0.1:7102   /var/lib/strata/east 1  \n"
                              "[cluster west]\n"
                              "  zone = zone-b\n"
                              "node = 127.0.0.1:7201 /var/lib/strata/west-0\n"
                              "[router]\n"
                              "listen = 127.0.0.1:8086\n";

static st_topology topo; /* large (~150 KiB): static, not on the test's stack */

static void test_topology_parses_example(void **state) {
    (void)state;
    st_err err = {0};
    assert_int_equal(st_topology_parse(example, strlen(example), "t", &topo, &err), ST_OK);
    assert_string_equal(topo.project, "p");
    assert_string_equal(topo.instance, "i");
    assert_int_equal(topo.split_bytes, 268435456);
    assert_int_equal(topo.n_clusters, 2);
    const st_topo_cluster *e = st_topology_cluster(&topo, "east");
    const st_topo_cluster *w = st_topology_cluster(&topo, "west");
    assert_non_null(e);
    assert_non_null(w);
    assert_null(st_topology_cluster(&topo, "north"));
    assert_int_equal(e->num, 1);
    assert_int_equal(w->num, 2);
    assert_string_equal(e->zone, "zone-a");
    assert_string_equal(w->zone, "zone-b");
    assert_int_equal(e->n_nodes, 2);
    assert_string_equal(e->nodes[0].addr, "127.0.0.1:7101");
    assert_string_equal(e->nodes[0].data_dir, "/var/lib/strata/east-0");
    assert_string_equal(e->nodes[1].data_dir, "/var/lib/strata/east 1"); /* inner spaces kept */
    /* Node numbers run from 1 in file order across clusters. */
    assert_int_equal(e->nodes[0].num, 1);
    assert_int_equal(e->nodes[1].num, 2);
    assert_int_equal(w->nodes[0].num, 3);
    assert_int_equal(topo.n_routers, 1);
    assert_string_equal(topo.routers[0], "127.0.0.1:8086");
}

static void test_topology_defaults(void **state) {
    (void)state;
    const char *t = "[cluster solo]\nnode = localhost:9000\n";
    st_err err = {0};
    assert_int_equal(st_topology_parse(t, strlen(t), "t", &topo, &err), ST_OK);
    assert_string_equal(topo.project, "p");
    assert_string_equal(topo.instance, "i");
    assert_int_equal(topo.split_bytes, 256LL << 20);
    assert_string_equal(topo.clusters[0].zone, "solo"); /* zone defaults to the cluster id */
    assert_string_equal(topo.clusters[0].nodes[0].data_dir, "");
    assert_int_equal(topo.n_routers, 0);
    /* No trailing newline, CRLF line ends. */
    const char *crlf = "instance = inst\r\n[cluster a]\r\nnode = h:1";
    assert_int_equal(st_topology_parse(crlf, strlen(crlf), "t", &topo, &err), ST_OK);
    assert_string_equal(topo.instance, "inst");
    assert_string_equal(topo.clusters[0].nodes[0].addr, "h:1");
}

/* Parses text, expects INVALID_ARGUMENT and a message starting with "name:line:" that contains
 * the fragment. line 0 means a whole-file error ("name: ..."). */
static void expect_bad(const char *text, int line, const char *fragment) {
    st_err err = {0};
    st_code rc = st_topology_parse(text, strlen(text), "f.topo", &topo, &err);
    if (rc != ST_INVALID_ARGUMENT)
        fail_msg("accepted (rc=%d): %s", rc, text);
    char prefix[64];
    if (line)
        snprintf(prefix, sizeof prefix, "f.topo:%d: ", line);
    else
        snprintf(prefix, sizeof prefix, "f.topo: ");
    if (strncmp(err.msg, prefix, strlen(prefix)) || !strstr(err.msg, fragment))
        fail_msg("message '%s' lacks '%s' or '%s'", err.msg, prefix, fragment);
}

static void test_topology_rejects_with_line_numbers(void **state) {
    (void)state;
    expect_bad("project = p\nbogus\n", 2, "expected 'key = value'");
    expect_bad("colour = red\n", 1, "unknown key 'colour'");
    expect_bad("\n\n[cluster east\n", 3, "closing ']'");
    expect_bad("[zone x]\n", 1, "unknown section");
    expect_bad("[cluster East]\n", 1, "bad cluster id 'East'");
    expect_bad("[cluster 1a]\n", 1, "bad cluster id");
    expect_bad("[cluster a]\nnode = h:1\n[cluster a]\n", 3, "defined twice");
    expect_bad("[cluster a]\nnode = nohost\n", 2, "bad node address");
    expect_bad("[cluster a]\nnode = h:0\n", 2, "bad node address");
    expect_bad("[cluster a]\nnode = h:70000\n", 2, "bad node address");
    expect_bad("[cluster a]\nnode = ::1:80\n", 2, "bad node address");
    expect_bad("[cluster a]\nzone = Z\n", 2, "bad zone");
    expect_bad("[cluster a]\nweight = 3\n", 2, "unknown key 'weight'");
    expect_bad("[cluster a]\nnode =\n", 2, "has no value");
    expect_bad("[router]\nport = 1\n", 2, "unknown key 'port'");
    expect_bad("[router]\nlisten = x\n", 2, "bad router address");
    expect_bad("split_bytes = -5\n", 1, "bad split_bytes");
    expect_bad("split_bytes = 12k\n", 1, "bad split_bytes");
    expect_bad("project = a/b\n", 1, "bad project");
    static const char nul[] = "project = p\n# fine\nproject = a\0b\n";
    st_err err = {0};
    assert_int_equal(st_topology_parse(nul, sizeof nul - 1, "f.topo", &topo, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "f.topo:3: line holds a NUL byte"));
}

static void test_topology_rejects_whole_file_mistakes(void **state) {
    (void)state;
    expect_bad("project = p\n", 0, "no [cluster ID] section");
    expect_bad("[cluster a]\nzone = z\n", 0, "cluster 'a' has no node");
    expect_bad("[cluster a]\nnode = h:1 /d1\n[cluster b]\nnode = h:1 /d2\n", 0,
               "address h:1 is used by two nodes");
    expect_bad("[cluster a]\nnode = h:1 /d\n[cluster b]\nnode = h:2 /d\n", 0,
               "data directory /d is used by two nodes");
    expect_bad("[cluster a]\nnode = h:1\n[router]\nlisten = h:1\n", 0, "router address h:1");
}

static void test_topology_limits(void **state) {
    (void)state;
    static char text[1 << 16];
    size_t n = 0;
    for (int i = 0; i <= ST_TOPO_CLUSTERS_MAX; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "[cluster c%d]\nnode = h:%d\n", i, i + 1);
    expect_bad(text, 2 * ST_TOPO_CLUSTERS_MAX + 1, "too many clusters");
    n = (size_t)snprintf(text, sizeof text, "[cluster a]\n");
    for (int i = 0; i <= ST_TOPO_NODES_MAX; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "node = h:%d\n", i + 1);
    expect_bad(text, ST_TOPO_NODES_MAX + 2, "too many nodes");
    n = (size_t)snprintf(text, sizeof text, "[cluster a]\nnode = h:1\n[router]\n");
    for (int i = 0; i <= ST_TOPO_ROUTERS_MAX; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "listen = r:%d\n", i + 1);
    expect_bad(text, ST_TOPO_ROUTERS_MAX + 4, "too many routers");
    memset(text, ' ', 3000);
    memcpy(text + 3000, "\n", 2);
    expect_bad(text, 1, "longer than");
}

static void tmp_path(char *out, size_t cap, const char *leaf) {
    const char *base = getenv("STRATA_TEST_TMP");
    snprintf(out, cap, "%s/topology_test_%d_%s", base && *base ? base : "/tmp", (int)getpid(),
             leaf);
}

static void test_topology_save_load_roundtrip(void **state) {
    (void)state;
    static st_topology again;
    st_err err = {0};
    assert_int_equal(st_topology_parse(example, strlen(example), "t", &topo, &err), ST_OK);
    char path[512];
    tmp_path(path, sizeof path, "topology");
    assert_int_equal(st_topology_save(path, &topo, &err), ST_OK);
    assert_int_equal(st_topology_load(path, &again, &err), ST_OK);
    assert_memory_equal(&topo, &again, sizeof topo); /* both zeroed before filling */
    unlink(path);
    assert_int_equal(st_topology_load(path, &again, &err), ST_NOT_FOUND);
    assert_non_null(strstr(err.msg, "does not exist"));
    /* A file with a mistake names its path and line. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[cluster a]\nnode = h:1\nnode = oops\n", f);
    fclose(f);
    assert_int_equal(st_topology_load(path, &again, &err), ST_INVALID_ARGUMENT);
    char want[600];
    snprintf(want, sizeof want, "%s:3: ", path);
    assert_true(!strncmp(err.msg, want, strlen(want)));
    unlink(path);
    /* Saving into a missing directory fails with advice, no crash. */
    tmp_path(path, sizeof path, "missing/topology");
    assert_int_equal(st_topology_save(path, &topo, &err), ST_UNAVAILABLE);
}

static void test_topology_addr_split(void **state) {
    (void)state;
    char host[64];
    uint16_t port = 0;
    assert_true(st_addr_split("127.0.0.1:8086", host, sizeof host, &port));
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8086);
    assert_true(st_addr_split("localhost:0", host, sizeof host, &port));
    assert_string_equal(host, "localhost");
    assert_int_equal(port, 0);
    assert_true(st_addr_split("[::1]:65535", host, sizeof host, &port));
    assert_string_equal(host, "::1");
    assert_int_equal(port, 65535);
    const char *bad[] = {"",       ":80",     "host",  "host:",       "host:65536", "host:8x",
                         "::1:80", "[::1:80", "[]:80", "host:123456", "a b:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (st_addr_split(bad[i], host, sizeof host, &port))
            fail_msg("accepted '%s'", bad[i]);
    char tiny[4];
    assert_false(st_addr_split("longhost:1", tiny, sizeof tiny, &port));
    assert_true(st_addr_split("abc:1", tiny, sizeof tiny, &port));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topology_parses_example),
        cmocka_unit_test(test_topology_defaults),
        cmocka_unit_test(test_topology_rejects_with_line_numbers),
        cmocka_unit_test(test_topology_rejects_whole_file_mistakes),
        cmocka_unit_test(test_topology_limits),
        cmocka_unit_test(test_topology_save_load_roundtrip),
        cmocka_unit_test(test_topology_addr_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
