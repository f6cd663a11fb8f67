/*
 * Proves the tablet balancer's choice (rtr_bal_choose, pure): nothing moves while any tablet is
 * moving or while the fullest node holds fewer than two tablets more than the emptiest; otherwise
 * one tablet goes from the fullest node to the emptiest — from the table spread worst between
 * them, its smallest writable tablet (the newest id on ties), never a read-only one. And, applied
 * repeatedly to a random cluster the way the router applies it (move, look again), it ends with
 * every node within one tablet of the others, each step lowering the spread or keeping it, in a
 * bounded number of moves. Randomized test takes STRATA_SEED.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router_internal.h"

#define RANDOM_ROUNDS 200
#define RANDOM_TABLETS_MAX 120
#define RANDOM_NODES_MAX 6

static rtr_bal_tablet tab(const char *table, uint64_t id, uint64_t bytes, uint32_t node) {
    return (rtr_bal_tablet){table, id, bytes, node, false, false};
}

static void test_balance_leaves_even_clusters_alone(void **state) {
    (void)state;
    rtr_bal_tablet v[] = {tab("t", 1, 10, 0), tab("t", 2, 10, 0), tab("t", 3, 10, 1),
                          tab("t", 4, 10, 2)};
    uint32_t dst = 99;
    assert_int_equal(rtr_bal_choose(v, 4, 3, &dst), SIZE_MAX); /* 2 / 1 / 1: one more only */
    assert_int_equal(rtr_bal_choose(v, 3, 2, &dst), SIZE_MAX); /* 2 / 1 */
    assert_int_equal(rtr_bal_choose(v, 3, 1, &dst), SIZE_MAX); /* one node: nowhere to go */
    assert_int_equal(rtr_bal_choose(NULL, 0, 3, &dst), SIZE_MAX);
    assert_int_not_equal(rtr_bal_choose(v, 3, 3, &dst), SIZE_MAX); /* 2 / 1 / 0: two more */
    assert_int_equal(dst, 2);
}

static void test_balance_waits_while_a_tablet_moves(void **state) {
    (void)state;
    rtr_bal_tablet v[] = {tab("t", 1, 10, 0), tab("t", 2, 10, 0), tab("t", 3, 10, 0),
                          tab("t", 4, 10, 1)};
    uint32_t dst;
    assert_int_not_equal(rtr_bal_choose(v, 4, 3, &dst), SIZE_MAX);
    v[3].moving = true;
    assert_int_equal(rtr_bal_choose(v, 4, 3, &dst), SIZE_MAX);
}

static void test_balance_moves_smallest_newest_to_emptiest(void **state) {
    (void)state;
    rtr_bal_tablet v[] = {
        tab("t", 10, 500, 1), tab("t", 11, 200, 1), tab("t", 12, 200, 1), /* 12: newer */
        tab("t", 13, 100, 1), /* smallest, but read-only (corrupt) */
        tab("t", 20, 50, 0),  tab("t", 21, 50, 0),  tab("t", 30, 50, 2),
    };
    v[3].read_only = true;
    uint32_t dst = 99;
    size_t k = rtr_bal_choose(v, sizeof v / sizeof v[0], 3, &dst);
    assert_int_equal(k, 2);
    assert_int_equal(dst, 2);
}

static void test_balance_prefers_worst_spread_table(void **state) {
    (void)state;
    /* Node 0 holds 5, node 1 holds 1. Table a is 2 vs 1 there, table b 3 vs 0: b moves, even
     * though a has the smaller tablet. */
    rtr_bal_tablet v[] = {tab("a", 1, 1, 0),   tab("a", 2, 1, 0),   tab("a", 3, 1, 1),
                          tab("b", 4, 900, 0), tab("b", 5, 800, 0), tab("b", 6, 700, 0),
                          tab("a", 7, 1, 2),   tab("b", 8, 1, 2),   tab("a", 9, 1, 2)};
    uint32_t dst;
    size_t k = rtr_bal_choose(v, sizeof v / sizeof v[0], 3, &dst);
    assert_int_equal(dst, 1);
    assert_int_equal(k, 5); /* b's smallest on node 0 */
}

static size_t spread(const rtr_bal_tablet *v, size_t n, size_t nodes) {
    size_t count[RANDOM_NODES_MAX] = {0}, lo = SIZE_MAX, hi = 0;
    for (size_t i = 0; i < n; i++)
        count[v[i].node]++;
    for (size_t i = 0; i < nodes; i++) {
        lo = count[i] < lo ? count[i] : lo;
        hi = count[i] > hi ? count[i] : hi;
    }
    return hi - lo;
}

static void test_balance_converges_on_random_clusters(void **state) {
    (void)state;
    static const char *const tables[] = {"a", "b", "c"};
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("balance_test"));
    rtr_bal_tablet v[RANDOM_TABLETS_MAX];
    for (int round = 0; round < RANDOM_ROUNDS; round++) {
        size_t nodes = 2 + st_rng_below(&rng, RANDOM_NODES_MAX - 1);
        size_t n = st_rng_below(&rng, RANDOM_TABLETS_MAX + 1);
        uint32_t skew = (uint32_t)st_rng_below(&rng, (uint64_t)nodes); /* most land here */
        for (size_t i = 0; i < n; i++)
            v[i] = tab(tables[st_rng_below(&rng, 3)], i + 1, 1 + st_rng_below(&rng, 1000),
                       st_rng_below(&rng, 4) ? skew : (uint32_t)st_rng_below(&rng, nodes));
        size_t moves = 0, before = spread(v, n, nodes);
        uint32_t dst;
        size_t k;
        while ((k = rtr_bal_choose(v, n, nodes, &dst)) != SIZE_MAX) {
            assert_true(k < n);
            assert_true(dst < nodes && dst != v[k].node);
            v[k].node = dst;
            size_t now = spread(v, n, nodes);
            assert_true(now <= before);
            before = now;
            assert_true(++moves <= n);
        }
        assert_true(spread(v, n, nodes) <= 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balance_leaves_even_clusters_alone),
        cmocka_unit_test(test_balance_waits_while_a_tablet_moves),
        cmocka_unit_test(test_balance_moves_smallest_newest_to_emptiest),
        cmocka_unit_test(test_balance_prefers_worst_spread_table),
        cmocka_unit_test(test_balance_converges_on_random_clusters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
