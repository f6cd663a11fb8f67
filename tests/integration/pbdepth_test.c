/* pbdepth_test.c — proves that deeply nested messages cannot crash strata-node or strata-router.
 * A real node and a router in front of it are sent RowFilters (chain, interleave, condition) in
 * ReadRows and in CheckAndMutateRow's predicate, and GC rules (union, intersection) in CreateTable
 * and ModifyColumnFamilies, nested 10, 100, 1,000, 5,000 and 50,000 levels, on the router's port
 * and on the node's own port, plus PutTable (the internal node service) and replication Apply on
 * the node (member of cluster east, applying cluster west's writes). 10 levels are valid requests
 * and succeed; deeper ones end with INVALID_ARGUMENT
 * "message nesting exceeds 64 levels", and after each the process is still running and answers a
 * plain ReadRows. The bytes are built without recursion (tests/support/pbnest.h): protobuf-c
 * itself could not pack them. Before the bound, 5,000 levels crashed both processes. Requests of
 * millions of empty elements (MutateRows entries, MutateRow mutations, unknown fields) are
 * refused INVALID_ARGUMENT by both, which stay within 1 GiB of memory.
 * Usage: pbdepth_test PATH/TO/strata-node PATH/TO/strata-router [TEST-PATTERN] */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "btclient.h"
#include "pbnest.h"
#include "strata/rpc.h"

#define DATA_SVC "/google.bigtable.v2.Bigtable/"
#define ADMIN_SVC "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define INSTANCE "projects/p/instances/i"
#define TABLE INSTANCE "/tables/t"
#define TOO_DEEP "message nesting exceeds 64 levels"
#define CALL_TIMEOUT_MS 60000

static const size_t depths[] = {10, 100, 1000, 5000, 50000};
#define N_DEPTHS (sizeof depths / sizeof depths[0])

typedef struct fixture {
    char dir[BT_PATH_MAX - 64];
    bt_proc east, west, router; /* one node per cluster: the east node applies west's writes */
    bt_client via_router, via_node;
} fixture;

static const char *g_node_bin, *g_router_bin; /* argv, constant for the run */

static st_slice S(const char *s) {
    return st_slice_cstr(s);
}

static void start(bt_proc *p, char *const argv[], const char *log) {
    st_err err = {0};
    if (bt_proc_start(p, argv, log, &err) != ST_OK)
        fail_msg("starting %s: %s", argv[0], err.msg);
}

/* strata-node as member 1 of cluster `num` (1 east, 2 west) of the topology, on `port`. */
static void start_node(fixture *f, bt_proc *p, int num, uint16_t port, const char *topo) {
    char data[BT_PATH_MAX], log[BT_PATH_MAX], listen[32], cluster[8];
    snprintf(data, sizeof data, "%s/n%d", f->dir, num);
    snprintf(log, sizeof log, "%s/n%d.log", f->dir, num);
    snprintf(listen, sizeof listen, "127.0.0.1:%u", (unsigned)port);
    snprintf(cluster, sizeof cluster, "%d", num);
    char *argv[] = {(char *)g_node_bin,
                    "--data",
                    data,
                    "--listen",
                    listen,
                    "--node-num",
                    "1",
                    "--config",
                    (char *)topo,
                    "--cluster-num",
                    cluster,
                    NULL};
    start(p, argv, log);
}

static int group_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char log[BT_PATH_MAX], topo[BT_PATH_MAX];
    bt_tmpdir(f->dir, sizeof f->dir, "pbdepth");
    uint16_t east = bt_free_port(), west = bt_free_port();
    snprintf(topo, sizeof topo, "%s/topology", f->dir);
    FILE *t = fopen(topo, "w");
    assert_non_null(t);
    fprintf(t,
            "project = p\ninstance = i\n[cluster east]\nzone = zone-a\nnode = 127.0.0.1:%u "
            "%s/n1\n[cluster west]\nzone = zone-b\nnode = 127.0.0.1:%u %s/n2\n",
            (unsigned)east, f->dir, (unsigned)west, f->dir);
    fclose(t);
    start_node(f, &f->east, 1, east, topo);
    start_node(f, &f->west, 2, west, topo);
    snprintf(log, sizeof log, "%s/router.log", f->dir);
    char *router_argv[] = {(char *)g_router_bin, "--config", topo, "--listen", "127.0.0.1:0", NULL};
    start(&f->router, router_argv, log);
    bt_client_init(&f->via_router, f->router.addr);
    bt_client_init(&f->via_node, f->east.addr);
    st_err err = {0};
    if (bt_create_table(&f->via_router, "t", "cf:maxversions=1", &err) != ST_OK)
        fail_msg("CreateTable t: %s", err.msg);
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("q"), 1000, S("v"));
    if (bt_mutate_row(&f->via_router, "t", S("r"), &m, &err) != ST_OK)
        fail_msg("MutateRow: %s", err.msg);
    bt_muts_deinit(&m);
    *state = f;
    return 0;
}

static int group_teardown(void **state) {
    fixture *f = *state;
    bt_proc_stop(&f->router, SIGTERM, NULL);
    bt_proc_stop(&f->east, SIGTERM, NULL);
    bt_proc_stop(&f->west, SIGTERM, NULL);
    bt_rmrf(f->dir);
    free(f);
    return 0;
}

/* ---- requests, built as bytes ---- */

static void put_msg(st_buf *out, uint32_t num, const st_buf *m) {
    bt_pb_put_bytes(out, num, st_slice_make(m->data, m->len));
}

/* ReadRowsRequest{table_name, filter, rows_limit: 1}. */
static void read_rows_req(st_buf *out, const st_buf *filter) {
    bt_pb_put_bytes(out, 1, S(TABLE));
    if (filter)
        put_msg(out, 3, filter);
    bt_pb_put_varint(out, 4, 1);
}

/* CheckAndMutateRowRequest{table_name, row_key "r", predicate_filter, true_mutations: set_cell}. */
static void check_and_mutate_req(st_buf *out, const st_buf *filter) {
    st_buf cell, mut;
    st_buf_init(&cell);
    st_buf_init(&mut);
    bt_pb_put_bytes(&cell, 1, S("cf"));
    bt_pb_put_bytes(&cell, 2, S("q"));
    bt_pb_put_varint(&cell, 3, 2000);
    bt_pb_put_bytes(&cell, 4, S("w"));
    put_msg(&mut, 1, &cell);
    bt_pb_put_bytes(out, 1, S(TABLE));
    bt_pb_put_bytes(out, 2, S("r"));
    put_msg(out, 4, &mut);
    put_msg(out, 6, filter);
    st_buf_free(&cell);
    st_buf_free(&mut);
}

/* Table{name (if any), column_families: {"cf": {gc_rule}}}. */
static void table_with(st_buf *out, const char *name, const st_buf *rule) {
    if (name)
        bt_pb_put_bytes(out, 1, S(name));
    bt_pb_put_family(out, 3, "cf", st_slice_make(rule->data, rule->len));
}

static void create_table_req(st_buf *out, const char *id, const st_buf *rule) {
    st_buf table;
    st_buf_init(&table);
    table_with(&table, NULL, rule);
    bt_pb_put_bytes(out, 1, S(INSTANCE));
    bt_pb_put_bytes(out, 2, S(id));
    put_msg(out, 3, &table);
    st_buf_free(&table);
}

/* ModifyColumnFamiliesRequest{name, modifications: [{id, create: {gc_rule}}]}. */
static void modify_req(st_buf *out, const char *family, const st_buf *rule) {
    bt_pb_put_bytes(out, 1, S(TABLE));
    bt_pb_put_family(out, 2, family, st_slice_make(rule->data, rule->len));
}

/* ---- calls and checks ---- */

static st_code call(const bt_client *c, const char *path, const st_buf *req, st_err *st) {
    st_buf resp;
    st_buf_init(&resp);
    st_err_clear(st);
    st_slice body = st_slice_make(req->data, req->len);
    st_code rc = strstr(path, "/ReadRows") ? rpc_blocking_stream(c->addr, NULL, path, body, NULL, 0,
                                                                 CALL_TIMEOUT_MS, NULL, NULL, st)
                                           : rpc_blocking_unary(c->addr, NULL, path, body, NULL, 0,
                                                                CALL_TIMEOUT_MS, &resp, st);
    st_buf_free(&resp);
    return rc;
}

/* Every process still runs, and c answers a plain ReadRows. */
static void assert_alive(fixture *f, const bt_client *c, const char *after) {
    bt_proc *procs[] = {&f->east, &f->west, &f->router};
    static const char *names[] = {"strata-node (east)", "strata-node (west)", "strata-router"};
    for (size_t i = 0; i < 3; i++) {
        int status;
        if (procs[i]->pid && waitpid(procs[i]->pid, &status, WNOHANG) == procs[i]->pid) {
            procs[i]->pid = 0;
            fail_msg("%s died after %s (%s %d); log: %s", names[i], after,
                     WIFSIGNALED(status) ? "signal" : "exit",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                     procs[i]->log_path);
        }
    }
    st_buf req;
    st_buf_init(&req);
    read_rows_req(&req, NULL);
    st_err st;
    st_code rc = call(c, DATA_SVC "ReadRows", &req, &st);
    st_buf_free(&req);
    if (rc != ST_OK)
        fail_msg("plain ReadRows at %s after %s: %s: %s", c->addr, after, st_code_name(rc), st.msg);
}

/* Sends req to c, then checks that every process is alive (a crash fails the test at once).
 * Returns whether the answer was the right one: OK at depth 10, INVALID_ARGUMENT naming the
 * nesting bound deeper down. */
static bool expect(fixture *f, const bt_client *c, const char *path, const st_buf *req,
                   size_t depth, const char *what) {
    char after[256];
    snprintf(after, sizeof after, "%s nested %zu deep (%zu bytes) to the %s %s", what, depth,
             req->len, c == &f->via_router ? "router" : "node", path);
    st_err st;
    st_code rc = call(c, path, req, &st);
    assert_alive(f, c, after);
    bool ok = depth <= 10 ? rc == ST_OK : rc == ST_INVALID_ARGUMENT && strstr(st.msg, TOO_DEEP);
    print_message("%s%s: %s %s\n", ok ? "" : "WRONG ANSWER: ", after, st_code_name(rc), st.msg);
    return ok;
}

static const struct {
    bt_nest_kind kind;
    const char *name;
} filter_kinds[] = {{BT_NEST_CHAIN, "chain"},
                    {BT_NEST_INTERLEAVE, "interleave"},
                    {BT_NEST_CONDITION, "condition"}},
  gc_kinds[] = {{BT_NEST_UNION, "union"}, {BT_NEST_INTERSECTION, "intersection"}};

typedef void (*build_fn)(st_buf *out, const st_buf *rule, size_t depth, const char *kind);

/* Every depth and kind, to the router and to the node. */
static void run(fixture *f, const char *path, bool gc, build_fn build, const char *what) {
    const bt_client *targets[] = {&f->via_router, &f->via_node};
    size_t n_kinds = gc ? 2 : 3, wrong = 0;
    for (size_t t = 0; t < 2; t++)
        for (size_t d = 0; d < N_DEPTHS; d++)
            for (size_t k = 0; k < n_kinds; k++) {
                bt_nest_kind kind = gc ? gc_kinds[k].kind : filter_kinds[k].kind;
                const char *name = gc ? gc_kinds[k].name : filter_kinds[k].name;
                st_buf rule, req;
                st_buf_init(&rule);
                st_buf_init(&req);
                bt_nest_rule(&rule, kind, depths[d]);
                char label[64];
                snprintf(label, sizeof label, "%s%zu%s", t ? "n" : "r", d, name);
                build(&req, &rule, depths[d], label);
                char desc[128];
                snprintf(desc, sizeof desc, "%s %s", what, name);
                wrong += !expect(f, targets[t], path, &req, depths[d], desc);
                st_buf_free(&rule);
                st_buf_free(&req);
            }
    assert_int_equal(wrong, 0); /* the WRONG ANSWER lines above say which */
}

static void build_read(st_buf *out, const st_buf *rule, size_t depth, const char *label) {
    (void)depth;
    (void)label;
    read_rows_req(out, rule);
}

static void build_cam(st_buf *out, const st_buf *rule, size_t depth, const char *label) {
    (void)depth;
    (void)label;
    check_and_mutate_req(out, rule);
}

/* Each CreateTable names a new table, each ModifyColumnFamilies a new family. */
static void build_create(st_buf *out, const st_buf *rule, size_t depth, const char *label) {
    (void)depth;
    create_table_req(out, label, rule);
}

static void build_modify(st_buf *out, const st_buf *rule, size_t depth, const char *label) {
    (void)depth;
    modify_req(out, label, rule);
}

static void test_pbdepth_read_rows_filters(void **state) {
    run(*state, DATA_SVC "ReadRows", false, build_read, "ReadRows filter");
}

static void test_pbdepth_check_and_mutate_predicates(void **state) {
    run(*state, DATA_SVC "CheckAndMutateRow", false, build_cam, "CheckAndMutateRow predicate");
}

static void test_pbdepth_create_table_gc_rules(void **state) {
    run(*state, ADMIN_SVC "CreateTable", true, build_create, "CreateTable GC rule");
}

static void test_pbdepth_modify_families_gc_rules(void **state) {
    run(*state, ADMIN_SVC "ModifyColumnFamilies", true, build_modify,
        "ModifyColumnFamilies GC rule");
}

/* The node's internal service: PutTable carries a whole Table (what the router pushes). */
static void test_pbdepth_node_put_table(void **state) {
    fixture *f = *state;
    size_t wrong = 0;
    for (size_t d = 0; d < N_DEPTHS; d++) {
        st_buf rule, table, req;
        st_buf_init(&rule);
        st_buf_init(&table);
        st_buf_init(&req);
        bt_nest_rule(&rule, BT_NEST_UNION, depths[d]);
        char name[128];
        snprintf(name, sizeof name, INSTANCE "/tables/put%zu", d);
        table_with(&table, name, &rule);
        put_msg(&req, 1, &table);
        wrong += !expect(f, &f->via_node, "/strata.internal.v1.Node/PutTable", &req, depths[d],
                         "PutTable GC rule union");
        st_buf_free(&rule);
        st_buf_free(&table);
        st_buf_free(&req);
    }
    assert_int_equal(wrong, 0); /* the WRONG ANSWER lines above say which */
}

/* Replication Apply has no recursive message: 50,000 levels hidden in an unknown field of a row
 * are skipped unparsed, and bytes protobuf-c cannot parse are refused up front. */
static void test_pbdepth_replication_apply(void **state) {
    fixture *f = *state;
    st_buf deep, row, req;
    st_buf_init(&deep);
    st_buf_init(&row);
    st_buf_init(&req);
    bt_nest_rule(&deep, BT_NEST_CHAIN, 50000);
    put_msg(&row, 99, &deep);
    bt_pb_put_varint(&req, 1, 2); /* from the west cluster */
    bt_pb_put_varint(&req, 2, 1);
    put_msg(&req, 3, &row);
    st_err st;
    st_code rc = call(&f->via_node, "/strata.internal.v1.Replication/Apply", &req, &st);
    print_message("Apply with a deep unknown field: %s %s\n", st_code_name(rc), st.msg);
    assert_alive(f, &f->via_node, "Apply with a deep unknown field");
    assert_int_equal(rc, ST_INVALID_ARGUMENT);   /* the row names no table */
    static const uint8_t group[] = {0x1b, 0x1c}; /* field 3 as a group */
    st_buf_reset(&req);
    assert_int_equal(st_buf_append(&req, group, sizeof group), ST_OK);
    rc = call(&f->via_node, "/strata.internal.v1.Replication/Apply", &req, &st);
    assert_int_equal(rc, ST_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "malformed strata.internal.v1.ApplyRequest"));
    assert_alive(f, &f->via_node, "Apply with a group");
    st_buf_free(&deep);
    st_buf_free(&row);
    st_buf_free(&req);
}

/* ---- wide requests: millions of tiny elements ---- */

/* The process's peak resident set in MiB (VmHWM), 0 if unknown. */
static long peak_rss_mib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *fp = fopen(path, "r");
    long kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    if (fp)
        fclose(fp);
    return kb / 1024;
}

/* req plus count copies of the bytes elem. */
static void repeat(st_buf *req, const uint8_t *elem, size_t len, size_t count) {
    assert_int_equal(st_buf_reserve(req, len * count), ST_OK);
    for (size_t i = 0; i < count; i++)
        assert_int_equal(st_buf_append(req, elem, len), ST_OK);
}

/* A request of count empty repeated elements (or unknown varint fields) must be refused
 * INVALID_ARGUMENT with a message holding `want`, by the router and by the node. */
static bool expect_wide(fixture *f, const char *path, const uint8_t *elem, size_t len, size_t count,
                        const char *want) {
    const bt_client *targets[] = {&f->via_router, &f->via_node};
    bool ok = true;
    for (size_t t = 0; t < 2; t++) {
        st_buf req;
        st_buf_init(&req);
        bt_pb_put_bytes(&req, 1, S(TABLE));
        repeat(&req, elem, len, count);
        char after[256];
        snprintf(after, sizeof after, "%s of %zu elements (%zu bytes) to the %s", path, count,
                 req.len, t ? "node" : "router");
        st_err st;
        st_code rc = call(targets[t], path, &req, &st);
        st_buf_free(&req);
        assert_alive(f, targets[t], after);
        bool right = rc == ST_INVALID_ARGUMENT && strstr(st.msg, want);
        print_message("%s%s: %s %s\n", right ? "" : "WRONG ANSWER: ", after, st_code_name(rc),
                      st.msg);
        ok = ok && right;
    }
    return ok;
}

/* An empty MutateRows entry is 2 bytes and took about 100 unpacked: a 48 MiB request of them
 * took 5 GB in the router and 7 GB in the node and held both for a minute. Every such request is
 * now refused before it is laid out, and neither process grows past a few hundred MiB. */
static void test_pbdepth_wide_requests(void **state) {
    fixture *f = *state;
    static const uint8_t entry[] = {0x12, 0x00};    /* MutateRowsRequest.entries {} */
    static const uint8_t mutation[] = {0x1a, 0x00}; /* MutateRowRequest.mutations {} */
    static const uint8_t unknown[] = {0x78, 0x00};  /* field 15, varint 0 */
    size_t wrong = 0;
    wrong += !expect_wide(f, DATA_SVC "MutateRows", entry, 2, 150000, "Too many entries");
    wrong += !expect_wide(f, DATA_SVC "MutateRows", entry, 2, 20000000, "");
    wrong += !expect_wide(f, DATA_SVC "MutateRow", mutation, 2, 16000000, "too many small");
    wrong += !expect_wide(f, DATA_SVC "ReadRows", unknown, 2, 20000000, "too many small");
    assert_int_equal(wrong, 0); /* the WRONG ANSWER lines above say which */
    bt_proc *procs[] = {&f->east, &f->router};
    for (size_t i = 0; i < 2; i++) {
        long mib = peak_rss_mib(procs[i]->pid);
        print_message("%s peak RSS %ld MiB\n", i ? "router" : "node", mib);
        assert_true(mib < 1024);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PATH/TO/strata-node PATH/TO/strata-router [TEST-PATTERN]\n",
                argv[0]);
        return 2;
    }
    if (argc > 3)
        cmocka_set_test_filter(argv[3]); /* e.g. "*create_table*" */
    g_node_bin = argv[1];
    g_router_bin = argv[2];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pbdepth_read_rows_filters),
        cmocka_unit_test(test_pbdepth_check_and_mutate_predicates),
        cmocka_unit_test(test_pbdepth_create_table_gc_rules),
        cmocka_unit_test(test_pbdepth_modify_families_gc_rules),
        cmocka_unit_test(test_pbdepth_node_put_table),
        cmocka_unit_test(test_pbdepth_replication_apply),
        cmocka_unit_test(test_pbdepth_wide_requests),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
