/* sets_removed_test — proves sto_memtable_sets_removed (which SetCells of a row mutation a later
 * delete of the same mutation removes) decides exactly as the plain rule it replaced (kept below
 * as the reference: every later mutation checked for each SetCell) on random row mutations of
 * SetCells, DeleteFromColumn (bounded, unbounded, empty and negative ranges), DeleteFromFamily and
 * DeleteFromRow over a few families (one of them a system family, which a row delete does not
 * cover), and that the largest row mutations settle: 99,999 SetCells followed by one delete, and
 * 50,000 SetCells interleaved with 50,000 deletes of the same column. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memtable.h"

/* The reference rule: a later row delete (but for system families), a later family delete of the
 * cell's family, or a later column delete of its column whose range holds its timestamp. */
static bool ref_set_is_deleted_later(const sto_row_mut *row, size_t i) {
    const sto_mut *s = &row->muts[i];
    size_t last_row_del = SIZE_MAX, last_del = SIZE_MAX;
    for (size_t j = 0; j < row->n_muts; j++) {
        if (row->muts[j].type == STO_MUT_DEL_ROW)
            last_row_del = j;
        if (row->muts[j].type != STO_MUT_SET_CELL)
            last_del = j;
    }
    if (last_row_del != SIZE_MAX && last_row_del > i && !sto_family_is_system(s->family))
        return true;
    if (last_del == SIZE_MAX || last_del < i)
        return false;
    for (size_t j = i + 1; j <= last_del; j++) {
        const sto_mut *d = &row->muts[j];
        if (d->type == STO_MUT_SET_CELL || !st_slice_eq(d->family, s->family))
            continue;
        if (d->type == STO_MUT_DEL_FAMILY)
            return true;
        if (d->type == STO_MUT_DEL_COLUMN && st_slice_eq(d->qualifier, s->qualifier) &&
            s->ts_us >= d->ts_start_us && s->ts_us < d->ts_end_us)
            return true;
    }
    return false;
}

static const st_slice FAMS[] = {{(const uint8_t *)"cf", 2},
                                {(const uint8_t *)"cg", 2},
                                {(const uint8_t *)"c", 1},
                                {(const uint8_t *)"\0sys", 4}};
static const st_slice QUALS[] = {{(const uint8_t *)"q", 1},
                                 {(const uint8_t *)"r", 1},
                                 {(const uint8_t *)"qq", 2},
                                 {(const uint8_t *)"", 0}};
#define N_FAMS (sizeof FAMS / sizeof FAMS[0])
#define N_QUALS (sizeof QUALS / sizeof QUALS[0])

static int64_t rand_bound(st_rng *rng) {
    return (int64_t)st_rng_below(rng, 14) - 2; /* -2 .. 11 */
}

static void random_mut(st_rng *rng, sto_mut *m, unsigned del_pct) {
    memset(m, 0, sizeof *m);
    m->family = FAMS[st_rng_below(rng, N_FAMS)];
    m->qualifier = QUALS[st_rng_below(rng, N_QUALS)];
    if (st_rng_below(rng, 100) >= del_pct) {
        m->type = STO_MUT_SET_CELL;
        m->ts_us = (int64_t)st_rng_below(rng, 10);
        return;
    }
    uint64_t k = st_rng_below(rng, 10);
    if (k < 6) {
        m->type = STO_MUT_DEL_COLUMN;
        m->ts_start_us = rand_bound(rng);
        m->ts_end_us = st_rng_below(rng, 3) == 0 ? STO_TS_END_INF : rand_bound(rng);
        if (st_rng_below(rng, 4) == 0) /* the whole column, as the API's default range */
            m->ts_start_us = 0, m->ts_end_us = STO_TS_END_INF;
    } else if (k < 9) {
        m->type = STO_MUT_DEL_FAMILY;
        m->qualifier = st_slice_make(NULL, 0);
    } else {
        m->type = STO_MUT_DEL_ROW;
        m->family = m->qualifier = st_slice_make(NULL, 0);
    }
}

static void check_against_ref(const sto_row_mut *row) {
    bool *removed;
    assert_int_equal(sto_memtable_sets_removed(row, &removed), ST_OK);
    size_t n_removed = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        if (row->muts[i].type != STO_MUT_SET_CELL)
            continue;
        bool got = removed && removed[i];
        if (got != ref_set_is_deleted_later(row, i))
            fail_msg("mutation %zu of %zu: removed=%d, reference says %d", i, row->n_muts, got,
                     !got);
        n_removed += got;
    }
    if (!removed) /* nothing allocated only when no delete follows a SetCell */
        assert_int_equal(n_removed, 0);
    free(removed);
}

static void test_sets_removed_matches_reference(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_sets_removed_matches_reference"));
    enum { ROUNDS = 20000, MAX_MUTS = 40 };
    sto_mut muts[MAX_MUTS];
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = (size_t)st_rng_below(&rng, MAX_MUTS + 1);
        unsigned del_pct = (unsigned)st_rng_below(&rng, 80);
        for (size_t i = 0; i < n; i++)
            random_mut(&rng, &muts[i], del_pct);
        sto_row_mut row = {.row = ST_SLICE_LIT("r"), .muts = muts, .n_muts = n, .version = 1};
        check_against_ref(&row);
    }
}

static void test_sets_removed_no_delete_allocates_nothing(void **state) {
    (void)state;
    sto_mut muts[3] = {
        {.type = STO_MUT_DEL_COLUMN, .family = FAMS[0], .qualifier = QUALS[0], .ts_end_us = 9},
        {.type = STO_MUT_SET_CELL, .family = FAMS[0], .qualifier = QUALS[0], .ts_us = 1},
        {.type = STO_MUT_SET_CELL, .family = FAMS[1], .qualifier = QUALS[0], .ts_us = 1},
    };
    sto_row_mut row = {.row = ST_SLICE_LIT("r"), .muts = muts, .n_muts = 3, .version = 1};
    bool *removed = (bool *)&row; /* must be overwritten */
    assert_int_equal(sto_memtable_sets_removed(&row, &removed), ST_OK);
    assert_null(removed);
}

/* 99,999 SetCells of distinct columns, then one delete: of another column (nothing removed), of
 * another family (nothing), of the cells' family (all), or of the row (all). */
static void test_sets_removed_many_sets_one_delete(void **state) {
    (void)state;
    enum { N = 100000 };
    sto_mut *muts = calloc(N, sizeof *muts);
    char(*quals)[16] = calloc(N, sizeof *quals);
    assert_non_null(muts);
    assert_non_null(quals);
    for (size_t i = 0; i + 1 < N; i++) {
        int len = snprintf(quals[i], sizeof quals[i], "q%zu", i);
        muts[i] = (sto_mut){.type = STO_MUT_SET_CELL,
                            .family = FAMS[0],
                            .qualifier = st_slice_make(quals[i], (size_t)len),
                            .ts_us = 1000};
    }
    const sto_mut last[] = {
        {.type = STO_MUT_DEL_COLUMN,
         .family = FAMS[0],
         .qualifier = ST_SLICE_LIT("zz"),
         .ts_start_us = 0,
         .ts_end_us = STO_TS_END_INF},
        {.type = STO_MUT_DEL_FAMILY, .family = FAMS[1]},
        {.type = STO_MUT_DEL_FAMILY, .family = FAMS[0]},
        {.type = STO_MUT_DEL_ROW},
    };
    const bool all_removed[] = {false, false, true, true};
    for (size_t c = 0; c < sizeof last / sizeof last[0]; c++) {
        muts[N - 1] = last[c];
        sto_row_mut row = {.row = ST_SLICE_LIT("r"), .muts = muts, .n_muts = N, .version = 1};
        bool *removed;
        assert_int_equal(sto_memtable_sets_removed(&row, &removed), ST_OK);
        assert_non_null(removed);
        for (size_t i = 0; i + 1 < N; i++)
            assert_int_equal(removed[i], all_removed[c]);
        free(removed);
    }
    free(quals);
    free(muts);
}

/* 50,000 SetCells and 50,000 DeleteFromColumn of one column, interleaved, with bounded ranges,
 * unbounded ones and empty ones; checked against a backward walk over the few timestamps. */
static void test_sets_removed_many_deletes_one_column(void **state) {
    (void)state;
    enum { N = 100000, TS = 50 };
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_sets_removed_many_deletes_one_column"));
    sto_mut *muts = calloc(N, sizeof *muts);
    assert_non_null(muts);
    for (size_t i = 0; i < N; i++) {
        muts[i].family = FAMS[0];
        muts[i].qualifier = QUALS[0];
        if (i % 2 == 0) {
            muts[i].type = STO_MUT_SET_CELL;
            muts[i].ts_us = (int64_t)st_rng_below(&rng, TS);
            continue;
        }
        muts[i].type = STO_MUT_DEL_COLUMN;
        int64_t s = (int64_t)st_rng_below(&rng, TS), len = (int64_t)st_rng_below(&rng, 4);
        muts[i].ts_start_us = s;
        muts[i].ts_end_us = i % 1001 == 1 ? STO_TS_END_INF : s + len; /* len 0: empty */
    }
    sto_row_mut row = {.row = ST_SLICE_LIT("r"), .muts = muts, .n_muts = N, .version = 1};
    bool *removed;
    assert_int_equal(sto_memtable_sets_removed(&row, &removed), ST_OK);
    assert_non_null(removed);
    bool covered[TS] = {false};
    for (size_t i = N; i-- > 0;) {
        if (muts[i].type == STO_MUT_SET_CELL) {
            assert_int_equal(removed[i], covered[muts[i].ts_us]);
            continue;
        }
        for (int64_t t = 0; t < TS; t++)
            if (t >= muts[i].ts_start_us && t < muts[i].ts_end_us)
                covered[t] = true;
    }
    free(removed);
    free(muts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sets_removed_matches_reference),
        cmocka_unit_test(test_sets_removed_no_delete_allocates_nothing),
        cmocka_unit_test(test_sets_removed_many_sets_one_delete),
        cmocka_unit_test(test_sets_removed_many_deletes_one_column),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
