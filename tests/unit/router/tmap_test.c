/*
 * Proves the router's tablet map and its ReadRows walk: maps built from unordered, overlapping
 * reports keep the writable copy and drop overlaps (but a move's source, flagged moving, wins over
 * the target's partial copy); row lookup finds the covering tablet and
 * reports gaps; and the walk of a row set over tablets (forward and reversed), driven the way
 * read.c drives it (step, then move the position to the tablet's edge), visits tablets in strict
 * key order, sends each tablet only ranges inside it, and covers exactly the rows of the row set
 * — checked against brute-force membership over a small key universe with random tablet
 * boundaries and random row sets. Resuming from a mid-tablet position (after the last row
 * delivered) never revisits rows. A point read (row keys only, at most
 * BTU_ROWSET_POINT_KEYS_MAX) is told from a scan, which the router sends on another connection.
 * Randomized tests take STRATA_SEED.
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

#define S(lit) ST_SLICE_LIT(lit)
#define UNIVERSE_MAX 64

static rtr_tablet_in tin(const char *table, const char *start, const char *end, uint32_t node,
                         bool ro) {
    return (rtr_tablet_in){table, st_slice_cstr(start), st_slice_cstr(end), 0, node, ro, false,
                           false};
}

/* The source of a move in progress, as ListTablets reports it (read_only and moving). */
static rtr_tablet_in tin_moving(const char *table, const char *start, const char *end,
                                uint32_t node) {
    rtr_tablet_in t = tin(table, start, end, node, true);
    t.moving = true;
    return t;
}

static void test_tmap_build_sorts_and_drops_overlaps(void **state) {
    (void)state;
    rtr_tablet_in in[] = {
        tin("t2", "", "", 0, false),   tin("t1", "m", "", 1, false),
        tin("t1", "", "g", 0, false),  tin("t1", "g", "m", 1, true), /* moving away */
        tin("t1", "g", "m", 0, false),                               /* the move's target: wins */
        tin("t1", "h", "k", 1, false),                               /* stale overlap: dropped */
    };
    rtr_tmap *m = rtr_tmap_build(in, sizeof in / sizeof in[0]);
    assert_non_null(m);
    assert_int_equal(m->n_tables, 2);
    const rtr_tmap_table *t = rtr_tmap_find(m, "t1");
    assert_non_null(t);
    assert_int_equal(t->n, 3);
    assert_true(st_slice_eq(t->v[1].start, S("g")));
    assert_int_equal(t->v[1].node, 0);
    assert_false(t->v[1].read_only);
    assert_null(rtr_tmap_find(m, "t3"));
    assert_int_equal(rtr_tmap_row(t, S("a")), 0);
    assert_int_equal(rtr_tmap_row(t, S("g")), 1);
    assert_int_equal(rtr_tmap_row(t, S("l\xff")), 1);
    assert_int_equal(rtr_tmap_row(t, S("m")), 2);
    assert_int_equal(rtr_tmap_row(t, S("zzz")), 2);
    rtr_tmap_free(m);
}

/* During a move both nodes list the range; the target's copy is partial until the move ends, so
 * the source (flagged moving) wins whatever order the reports come in; once the source is gone
 * the target serves. */
static void test_tmap_build_prefers_move_source(void **state) {
    (void)state;
    rtr_tablet_in in[] = {
        tin("t", "", "g", 0, false),
        tin("t", "g", "m", 2, false), /* the target's fresh copy */
        tin_moving("t", "g", "m", 1),
        tin("t", "m", "", 2, false),
    };
    for (int order = 0; order < 2; order++) {
        if (order == 1) { /* reports in the other order */
            rtr_tablet_in tmp = in[1];
            in[1] = in[2];
            in[2] = tmp;
        }
        rtr_tmap *m = rtr_tmap_build(in, 4);
        assert_non_null(m);
        const rtr_tmap_table *t = rtr_tmap_find(m, "t");
        assert_int_equal(t->n, 3);
        size_t k = rtr_tmap_row(t, S("h"));
        assert_int_equal(k, 1);
        assert_int_equal(t->v[k].node, 1);
        assert_true(t->v[k].moving);
        rtr_tmap_free(m);
    }
    rtr_tablet_in after[] = {tin("t", "", "g", 0, false), tin("t", "g", "m", 2, false),
                             tin("t", "m", "", 2, false)};
    rtr_tmap *m = rtr_tmap_build(after, 3);
    const rtr_tmap_table *t = rtr_tmap_find(m, "t");
    assert_int_equal(t->v[rtr_tmap_row(t, S("h"))].node, 2);
    assert_false(t->v[1].moving);
    rtr_tmap_free(m);
}

static void test_tmap_row_reports_gaps(void **state) {
    (void)state;
    rtr_tablet_in in[] = {tin("t", "", "c", 0, false), tin("t", "f", "", 1, false)};
    rtr_tmap *m = rtr_tmap_build(in, 2);
    const rtr_tmap_table *t = rtr_tmap_find(m, "t");
    assert_int_equal(rtr_tmap_row(t, S("b")), 0);
    assert_int_equal(rtr_tmap_row(t, S("c")), SIZE_MAX);
    assert_int_equal(rtr_tmap_row(t, S("e")), SIZE_MAX);
    assert_int_equal(rtr_tmap_row(t, S("f")), 1);
    assert_int_equal(rtr_tmap_row(NULL, S("f")), SIZE_MAX);
    /* The walk stops at the gap with ST_UNAVAILABLE and names the key. */
    btu_key_range all = {{NULL, 0}, {NULL, 0}};
    btu_rowset rs = {&all, 1};
    st_arena a;
    st_arena_init(&a, 1024);
    btu_rowset sub;
    size_t k;
    st_slice gap;
    assert_int_equal(rtr_read_step(&rs, false, true, S("c"), t, &a, &sub, &k, &gap),
                     ST_UNAVAILABLE);
    assert_true(st_slice_eq(gap, S("c")));
    assert_int_equal(rtr_read_step(&rs, true, true, S("f"), t, &a, &sub, &k, &gap), ST_UNAVAILABLE);
    assert_int_equal(rtr_read_step(&rs, true, true, S("c"), t, &a, &sub, &k, &gap), ST_OK);
    assert_int_equal(k, 0);
    st_arena_deinit(&a);
    rtr_tmap_free(m);
}

/* ---- randomized walk against brute force ---- */

static const char *universe[UNIVERSE_MAX];
static size_t n_universe;

static void universe_init(void) {
    static char store[UNIVERSE_MAX][4];
    const char *alpha = "abcd";
    n_universe = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(store[n_universe], 4, "%c", alpha[i]);
        universe[n_universe] = store[n_universe];
        n_universe++;
        for (int j = 0; j < 4; j++) {
            snprintf(store[n_universe], 4, "%c%c", alpha[i], alpha[j]);
            universe[n_universe] = store[n_universe];
            n_universe++;
        }
    }
}

static bool in_range(const btu_key_range *r, st_slice k) {
    return st_slice_cmp(r->start, k) <= 0 && (r->end.len == 0 || st_slice_cmp(k, r->end) < 0);
}

static bool in_set(const btu_rowset *rs, st_slice k) {
    for (size_t i = 0; i < rs->n; i++)
        if (in_range(&rs->v[i], k))
            return true;
    return false;
}

static const char *pick(st_rng *rng) {
    return st_rng_below(rng, 5) == 0 ? "" : universe[st_rng_below(rng, n_universe)];
}

/* Random contiguous tablets: sorted distinct boundaries from the universe. */
static rtr_tmap *random_map(st_rng *rng) {
    rtr_tablet_in in[8];
    const char *b[8];
    size_t nb = 0;
    size_t want = st_rng_below(rng, 5);
    for (size_t i = 0; i < want; i++) {
        const char *k = universe[st_rng_below(rng, n_universe)];
        bool dup = false;
        for (size_t j = 0; j < nb; j++)
            dup = dup || strcmp(b[j], k) == 0;
        if (!dup)
            b[nb++] = k;
    }
    for (size_t i = 0; i < nb; i++) /* insertion sort */
        for (size_t j = i; j > 0 && strcmp(b[j - 1], b[j]) > 0; j--) {
            const char *x = b[j];
            b[j] = b[j - 1];
            b[j - 1] = x;
        }
    for (size_t i = 0; i <= nb; i++)
        in[i] = tin("t", i ? b[i - 1] : "", i < nb ? b[i] : "", (uint32_t)i, false);
    return rtr_tmap_build(in, nb + 1);
}

static void random_rowset(st_rng *rng, st_arena *a, btu_rowset *rs) {
    size_t n = 1 + st_rng_below(rng, 4);
    rs->v = st_arena_alloc(a, n * sizeof *rs->v);
    for (size_t i = 0; i < n; i++) {
        const char *s = pick(rng), *e = pick(rng);
        if (st_rng_below(rng, 3) == 0) { /* a single key */
            s = universe[st_rng_below(rng, n_universe)];
            btu_key_successor(a, st_slice_cstr(s), &rs->v[i].end);
            rs->v[i].start = st_slice_cstr(s);
            continue;
        }
        rs->v[i] = (btu_key_range){st_slice_cstr(s), st_slice_cstr(e)};
    }
    rs->n = btu_rowset_merge(rs->v, n);
}

/* Walks rs over t as read.c does; marks every universe key a step covers (each at most once)
 * and checks order and containment. Optionally resumes mid-tablet after each tablet's first
 * key, as after a failure. */
static void walk(const btu_rowset *rs, const rtr_tmap_table *t, bool reversed, bool resume,
                 int *seen) {
    st_buf pos;
    st_buf_init(&pos);
    bool has_pos = false;
    int last_tablet = -1;
    bool same_ok = false; /* after a resume the same tablet comes again */
    for (int steps = 0; steps < 100; steps++) {
        st_arena a;
        st_arena_init(&a, 1024);
        btu_rowset sub;
        size_t k;
        st_slice gap;
        st_code rc =
            rtr_read_step(rs, reversed, has_pos, st_buf_slice(&pos), t, &a, &sub, &k, &gap);
        if (rc == ST_NOT_FOUND) {
            st_arena_deinit(&a);
            break;
        }
        assert_int_equal(rc, ST_OK);
        assert_true(sub.n > 0);
        if (last_tablet >= 0 && !same_ok)
            assert_true(reversed ? (int)k < last_tablet : (int)k > last_tablet);
        if (last_tablet >= 0 && same_ok)
            assert_true(reversed ? (int)k <= last_tablet : (int)k >= last_tablet);
        same_ok = false;
        last_tablet = (int)k;
        /* Keys delivered by this step, in scan order. */
        const char *first = NULL;
        for (size_t u0 = 0; u0 < n_universe; u0++) {
            size_t u = reversed ? n_universe - 1 - u0 : u0;
            st_slice key = st_slice_cstr(universe[u]);
            bool hit = false;
            for (size_t i = 0; i < sub.n; i++) {
                hit = hit || in_range(&sub.v[i], key);
                /* every range lies inside the tablet */
                assert_true(st_slice_cmp(t->v[k].start, sub.v[i].start) <= 0);
                assert_true(btu_end_cmp(sub.v[i].end, t->v[k].end) <= 0);
            }
            if (!hit)
                continue;
            if (resume && first) /* pretend the read broke after the first row */
                continue;
            seen[u]++;
            if (!first)
                first = universe[u];
        }
        rtr_tablet tb = t->v[k];
        st_slice next;
        if (resume && first) {
            st_buf_reset(&pos);
            st_buf_append(&pos, first, strlen(first));
            if (!reversed)
                st_buf_append_byte(&pos, 0);
            has_pos = true;
            resume = false; /* resume once per walk, then run normally */
            same_ok = true;
        } else if (!rtr_read_next_pos(&tb, reversed, &next)) {
            st_arena_deinit(&a);
            break;
        } else {
            st_buf_reset(&pos);
            st_buf_append(&pos, next.data, next.len);
            has_pos = true;
        }
        st_arena_deinit(&a);
    }
    st_buf_free(&pos);
}

static void test_tmap_walk_matches_brute_force(void **state) {
    (void)state;
    universe_init();
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_tmap_walk_matches_brute_force"));
    for (int iter = 0; iter < 3000; iter++) {
        rtr_tmap *m = random_map(&rng);
        assert_non_null(m);
        const rtr_tmap_table *t = rtr_tmap_find(m, "t");
        st_arena a;
        st_arena_init(&a, 1024);
        btu_rowset rs;
        random_rowset(&rng, &a, &rs);
        for (int mode = 0; mode < 4; mode++) {
            int seen[UNIVERSE_MAX] = {0};
            walk(&rs, t, mode & 1, mode & 2, seen);
            for (size_t u = 0; u < n_universe; u++)
                assert_int_equal(seen[u], in_set(&rs, st_slice_cstr(universe[u])) ? 1 : 0);
        }
        st_arena_deinit(&a);
        rtr_tmap_free(m);
    }
}

/* btu_rowset_is_point over the row set of keys[0..n) plus, with range, the range [b, c). */
static bool point_of(const char *const *keys, size_t n, bool range) {
    ProtobufCBinaryData k[BTU_ROWSET_POINT_KEYS_MAX + 1];
    for (size_t i = 0; i < n; i++)
        k[i] = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)(uintptr_t)keys[i]};
    Google__Bigtable__V2__RowRange r, *rp = &r;
    google__bigtable__v2__row_range__init(&r);
    r.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    r.start_key_closed = (ProtobufCBinaryData){1, (uint8_t *)"b"};
    r.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
    r.end_key_open = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    Google__Bigtable__V2__RowSet pb = GOOGLE__BIGTABLE__V2__ROW_SET__INIT;
    pb.n_row_keys = n;
    pb.row_keys = k;
    pb.n_row_ranges = range ? 1 : 0;
    pb.row_ranges = &rp;
    st_arena a;
    st_arena_init(&a, 1024);
    btu_rowset rs;
    st_err err;
    assert_int_equal(btu_rowset_from_pb(&pb, &a, &rs, &err), ST_OK);
    bool point = btu_rowset_is_point(&rs, BTU_ROWSET_POINT_KEYS_MAX);
    st_arena_deinit(&a);
    return point;
}

static void test_rowset_point_reads_and_scans(void **state) {
    (void)state;
    static const char *const two[] = {"r2", "r1"};
    assert_true(point_of(two, 2, false));
    assert_false(point_of(two, 2, true));   /* a range besides the keys */
    assert_false(point_of(NULL, 0, false)); /* every row */
    assert_false(point_of(NULL, 0, true));
    const char *many[BTU_ROWSET_POINT_KEYS_MAX + 1];
    char text[BTU_ROWSET_POINT_KEYS_MAX + 1][8];
    for (size_t i = 0; i <= BTU_ROWSET_POINT_KEYS_MAX; i++) {
        snprintf(text[i], sizeof text[i], "k%03zu", i);
        many[i] = text[i];
    }
    assert_true(point_of(many, BTU_ROWSET_POINT_KEYS_MAX, false));
    assert_false(point_of(many, BTU_ROWSET_POINT_KEYS_MAX + 1, false));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tmap_build_sorts_and_drops_overlaps),
        cmocka_unit_test(test_tmap_build_prefers_move_source),
        cmocka_unit_test(test_tmap_row_reports_gaps),
        cmocka_unit_test(test_tmap_walk_matches_brute_force),
        cmocka_unit_test(test_rowset_point_reads_and_scans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
