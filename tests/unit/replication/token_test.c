/* token_test.c — proves consistency tokens round-trip through their canonical text, refuse
 * malformed text, and are satisfied exactly when every node has acknowledged past its token lsn
 * to every other cluster of the topology (a missing or lagging node makes them unsatisfied). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "strata/replication.h"

static const char TOPO[] = "[cluster east]\nnode = 127.0.0.1:7101 /tmp/e0\n"
                           "node = 127.0.0.1:7102 /tmp/e1\n"
                           "[cluster west]\nnode = 127.0.0.1:7201 /tmp/w0\n";

static void test_token_round_trip(void **state) {
    (void)state;
    repl_token t = {.n = 3};
    t.e[0] = (repl_token_entry){3, 77};
    t.e[1] = (repl_token_entry){1, 120};
    t.e[2] = (repl_token_entry){2, 0};
    char text[REPL_TOKEN_CHARS_MAX];
    st_err err;
    assert_int_equal(repl_token_encode(&t, text, sizeof text, &err), ST_OK);
    assert_string_equal(text, "1"
                              "00000001"
                              "00000000000000000120"
                              "00000002"
                              "00000000000000000000"
                              "00000003"
                              "00000000000000000077");
    assert_true(repl_token_is_global(text));
    repl_token u;
    assert_int_equal(repl_token_decode(text, &u, &err), ST_OK);
    assert_int_equal(u.n, 3);
    assert_int_equal(u.e[0].node_num, 1);
    assert_int_equal(u.e[0].lsn, 120);
    assert_int_equal(u.e[2].lsn, 77);
    /* the extremes */
    assert_int_equal(repl_token_decode("1"
                                       "16777215"
                                       "18446744073709551615",
                                       &u, &err),
                     ST_OK);
    assert_int_equal(u.e[0].lsn, UINT64_MAX);
    /* too small a buffer, no entries */
    assert_int_equal(repl_token_encode(&t, text, 30, &err), ST_INVALID_ARGUMENT);
    t.n = 0;
    assert_int_equal(repl_token_encode(&t, text, sizeof text, &err), ST_INVALID_ARGUMENT);
    /* a node's old single-lsn token is not a global one */
    assert_false(repl_token_is_global("12345"));
    assert_false(repl_token_is_global("18446744073709551615"));
}

static void test_token_refuses_malformed(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "1",
        "12",
        "TokenFor-t",
        "2"
        "00000001"
        "00000000000000000120", /* unknown version */
        "1"
        "00000001"
        "0000000000000000012", /* short */
        "1"
        "00000001"
        "000000000000000001200", /* long */
        "1"
        "0000000a"
        "00000000000000000120", /* not a digit */
        "1"
        "00000001"
        "99999999999999999999", /* lsn over 64 bits */
        "1"
        "00000001"
        "00000000000000000001"
        "00000001"
        "00000000000000000002", /* twice */
    };
    repl_token u;
    st_err err;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        assert_int_equal(repl_token_decode(bad[i], &u, &err), ST_INVALID_ARGUMENT);
        assert_true(err.msg[0] != '\0');
    }
}

static repl_node_positions pos(uint32_t node, uint32_t cluster, uint64_t last, uint32_t peer,
                               uint64_t acked) {
    repl_node_positions p;
    memset(&p, 0, sizeof p);
    p.node_num = node;
    p.cluster_num = cluster;
    p.last_lsn = last;
    p.peer_cluster[0] = peer;
    p.peer_acked_next[0] = acked;
    p.n_peers = 1;
    return p;
}

static void test_token_satisfied_when_all_acked(void **state) {
    (void)state;
    st_topology topo;
    st_err err;
    assert_int_equal(st_topology_parse(TOPO, sizeof TOPO - 1, "t", &topo, &err), ST_OK);
    /* nodes 1, 2 in east (cluster 1), node 3 in west (cluster 2) */
    repl_node_positions p[3] = {pos(1, 1, 10, 2, 5), pos(2, 1, 0, 2, 1), pos(3, 2, 7, 1, 8)};
    repl_token t;
    repl_token_from_positions(&topo, p, 3, &t);
    assert_int_equal(t.n, 3);
    assert_false(repl_token_satisfied(&t, &topo, p, 3)); /* node 1 acked < 10 */
    p[0].peer_acked_next[0] = 10;
    assert_false(repl_token_satisfied(&t, &topo, p, 3)); /* must be past lsn 10 */
    p[0].peer_acked_next[0] = 11;
    assert_true(repl_token_satisfied(&t, &topo, p, 3));
    /* node 2 wrote nothing: it needs nothing; node 3 missing: unknown is not consistent */
    assert_false(repl_token_satisfied(&t, &topo, p, 2));
    /* a node reporting no shipper for a peer cluster is not consistent */
    p[2].n_peers = 0;
    assert_false(repl_token_satisfied(&t, &topo, p, 3));
    p[2].n_peers = 1;
    /* an entry for a node no longer in the topology is ignored */
    t.e[t.n++] = (repl_token_entry){42, 1000};
    assert_true(repl_token_satisfied(&t, &topo, p, 3));
}

/* A node that did not answer when the token was made: the check waits until it has shipped
 * everything it holds at check time. */
static void test_token_unknown_node_waits_for_all(void **state) {
    (void)state;
    st_topology topo;
    st_err err;
    assert_int_equal(st_topology_parse(TOPO, sizeof TOPO - 1, "t", &topo, &err), ST_OK);
    repl_node_positions p[3] = {pos(1, 1, 10, 2, 11), pos(3, 2, 7, 1, 8), pos(2, 1, 5, 2, 1)};
    repl_token t;
    repl_token_from_positions(&topo, p, 2, &t); /* node 2 silent */
    assert_int_equal(t.n, 3);
    char text[REPL_TOKEN_CHARS_MAX];
    assert_int_equal(repl_token_encode(&t, text, sizeof text, &err), ST_OK);
    repl_token u;
    assert_int_equal(repl_token_decode(text, &u, &err), ST_OK);
    assert_int_equal(u.e[1].node_num, 2);
    assert_true(u.e[1].lsn == REPL_TOKEN_LSN_UNKNOWN);
    assert_false(repl_token_satisfied(&u, &topo, p, 2)); /* still silent */
    assert_false(repl_token_satisfied(&u, &topo, p, 3)); /* holds lsn 5, acked below 2 */
    p[2].peer_acked_next[0] = 6;
    assert_true(repl_token_satisfied(&u, &topo, p, 3));
    p[2].last_lsn = 9; /* wrote more meanwhile: the check waits for that too */
    assert_false(repl_token_satisfied(&u, &topo, p, 3));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_round_trip),
        cmocka_unit_test(test_token_refuses_malformed),
        cmocka_unit_test(test_token_satisfied_when_all_acked),
        cmocka_unit_test(test_token_unknown_node_waits_for_all),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
