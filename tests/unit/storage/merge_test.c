/* merge_test — proves the merging iterator yields the union of its children in (key, child index)
 * order forward and the exact reverse backward, across any mix of seeks and direction changes,
 * and that the range wrapper restricts to [lo, hi): random children (with keys shared between
 * children) are walked by random operations and compared step by step with a sorted array
 * model. Also: a failing child makes the merge invalid with its error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kviter.h"

/* ---- an array-backed child iterator ---- */

typedef struct arr_entry {
    uint8_t key[4];
    size_t key_len;
    uint8_t value[2]; /* child index, entry index */
} arr_entry;

typedef struct arr_iter {
    sto_kviter base;
    const arr_entry *e; /* sorted, distinct keys */
    size_t n;
    long pos;     /* -1 or n = invalid */
    long fail_at; /* positioning on this index fails (ST_DATA_LOSS); -1 = never */
    bool failed;
} arr_iter;

static st_slice arr_k(const arr_entry *e) {
    return st_slice_make(e->key, e->key_len);
}

static void arr_check_fail(arr_iter *a) {
    if (a->pos >= 0 && a->pos == a->fail_at)
        a->failed = true;
}
static void arr_seek(sto_kviter *b, st_slice t) {
    arr_iter *a = (arr_iter *)b;
    a->pos = 0;
    while ((size_t)a->pos < a->n && st_slice_cmp(arr_k(&a->e[a->pos]), t) < 0)
        a->pos++;
    arr_check_fail(a);
}
static void arr_seek_first(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    a->pos = 0;
    arr_check_fail(a);
}
static void arr_seek_last(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    a->pos = (long)a->n - 1;
    arr_check_fail(a);
}
static void arr_next(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    assert_false(a->failed);
    a->pos++;
    arr_check_fail(a);
}
static void arr_prev(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    assert_false(a->failed);
    a->pos--;
    arr_check_fail(a);
}
static bool arr_valid(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    return !a->failed && a->pos >= 0 && (size_t)a->pos < a->n;
}
static st_slice arr_key(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    assert_true(arr_valid(b));
    return arr_k(&a->e[a->pos]);
}
static st_slice arr_value(sto_kviter *b) {
    arr_iter *a = (arr_iter *)b;
    return st_slice_make(a->e[a->pos].value, 2);
}
static st_code arr_status(sto_kviter *b, st_err *err) {
    arr_iter *a = (arr_iter *)b;
    return a->failed ? st_err_set(err, ST_DATA_LOSS, "injected failure") : ST_OK;
}
static void arr_free(sto_kviter *b) {
    free(b);
}

static const sto_kviter_ops arr_ops = {arr_seek,   arr_seek_first, arr_seek_last, arr_next,
                                       arr_prev,   arr_valid,      arr_key,       arr_value,
                                       arr_status, arr_free};

static sto_kviter *arr_new(const arr_entry *e, size_t n) {
    arr_iter *a = calloc(1, sizeof *a);
    assert_non_null(a);
    a->base.ops = &arr_ops;
    a->e = e;
    a->n = n;
    a->pos = -1;
    a->fail_at = -1;
    return &a->base;
}

/* ---- the model ---- */

#define KIDS_MAX 12
#define PER_KID_MAX 60

typedef struct model {
    arr_entry kid[KIDS_MAX][PER_KID_MAX];
    size_t kid_n[KIDS_MAX];
    size_t n_kids;
    const arr_entry *all[KIDS_MAX * PER_KID_MAX]; /* sorted by (key, child) */
    size_t n_all;
} model;

static int entry_cmp(const void *a, const void *b) {
    const arr_entry *x = *(const arr_entry *const *)a, *y = *(const arr_entry *const *)b;
    int c = st_slice_cmp(arr_k(x), arr_k(y));
    return c ? c : (int)x->value[0] - (int)y->value[0];
}
static int plain_cmp(const void *a, const void *b) {
    return st_slice_cmp(arr_k(a), arr_k(b));
}

static void rand_key(st_rng *rng, arr_entry *e) {
    e->key_len = 1 + (size_t)st_rng_below(rng, 3);
    for (size_t i = 0; i < e->key_len; i++)
        e->key[i] = (uint8_t)st_rng_below(rng, 4); /* tiny alphabet: many shared keys */
}

static void model_build(model *m, st_rng *rng) {
    memset(m, 0, sizeof *m);
    m->n_kids = (size_t)st_rng_below(rng, KIDS_MAX + 1);
    for (size_t k = 0; k < m->n_kids; k++) {
        size_t want = (size_t)st_rng_below(rng, PER_KID_MAX);
        arr_entry tmp[PER_KID_MAX];
        for (size_t i = 0; i < want; i++)
            rand_key(rng, &tmp[i]);
        qsort(tmp, want, sizeof tmp[0], plain_cmp);
        size_t n = 0;
        for (size_t i = 0; i < want; i++) /* distinct keys within a child */
            if (n == 0 || plain_cmp(&tmp[i], &m->kid[k][n - 1]) != 0)
                m->kid[k][n++] = tmp[i];
        for (size_t i = 0; i < n; i++) {
            m->kid[k][i].value[0] = (uint8_t)k;
            m->kid[k][i].value[1] = (uint8_t)i;
            m->all[m->n_all++] = &m->kid[k][i];
        }
        m->kid_n[k] = n;
    }
    qsort(m->all, m->n_all, sizeof m->all[0], entry_cmp);
}

/* pos in the model: index into all, -1 or n_all = invalid. */
static void check_at(sto_kviter *it, const model *m, long pos) {
    if (pos < 0 || (size_t)pos >= m->n_all) {
        assert_false(it->ops->valid(it));
        return;
    }
    assert_true(it->ops->valid(it));
    const arr_entry *e = m->all[pos];
    assert_true(st_slice_eq(it->ops->key(it), arr_k(e)));
    assert_memory_equal(it->ops->value(it).data, e->value, 2);
}

static long model_seek(const model *m, st_slice t, st_slice lo) {
    if (st_slice_cmp(t, lo) < 0)
        t = lo;
    long p = 0;
    while ((size_t)p < m->n_all && st_slice_cmp(arr_k(m->all[p]), t) < 0)
        p++;
    return p;
}

/* Random walk of operations on it against the model restricted to [lo, hi). */
static void walk(sto_kviter *it, const model *m, st_rng *rng, st_slice lo, st_slice hi) {
    long lo_pos = model_seek(m, lo, lo);
    long hi_pos = hi.len ? model_seek(m, hi, hi) : (long)m->n_all;
    long pos = -1;
    for (int step = 0; step < 400; step++) {
        bool valid = pos >= lo_pos && pos < hi_pos;
        unsigned op = (unsigned)st_rng_below(rng, valid ? 6 : 3);
        if (op == 0) {
            arr_entry t;
            rand_key(rng, &t);
            it->ops->seek(it, arr_k(&t));
            pos = model_seek(m, arr_k(&t), lo);
        } else if (op == 1) {
            it->ops->seek_first(it);
            pos = lo_pos;
        } else if (op == 2) {
            it->ops->seek_last(it);
            pos = hi_pos - 1;
        } else if (op < 5) {
            it->ops->next(it);
            pos++;
        } else {
            it->ops->prev(it);
            pos--;
        }
        if (pos < lo_pos || pos >= hi_pos)
            pos = -1;
        check_at(it, m, pos);
    }
    assert_int_equal(it->ops->status(it, NULL), ST_OK);
}

static sto_kviter *merge_of(const model *m) {
    sto_kviter *kids[KIDS_MAX];
    for (size_t k = 0; k < m->n_kids; k++)
        kids[k] = arr_new(m->kid[k], m->kid_n[k]);
    sto_kviter *it = sto_merge_iter_new(kids, m->n_kids);
    assert_non_null(it);
    return it;
}

static void test_merge_random_walk_matches_model(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_merge_random_walk_matches_model"));
    model *m = malloc(sizeof *m);
    assert_non_null(m);
    for (int round = 0; round < 300; round++) {
        model_build(m, &rng);
        sto_kviter *it = merge_of(m);
        walk(it, m, &rng, st_slice_make(NULL, 0), st_slice_make(NULL, 0));
        it->ops->free(it);
    }
    free(m);
}

static void test_merge_range_iter_restricts(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_merge_range_iter_restricts"));
    model *m = malloc(sizeof *m);
    assert_non_null(m);
    for (int round = 0; round < 300; round++) {
        model_build(m, &rng);
        arr_entry lo, hi;
        rand_key(&rng, &lo);
        rand_key(&rng, &hi);
        if (st_rng_below(&rng, 4) == 0)
            lo.key_len = 0;
        if (st_rng_below(&rng, 4) == 0)
            hi.key_len = 0;
        if (hi.key_len && plain_cmp(&lo, &hi) > 0) {
            arr_entry t = lo;
            lo = hi;
            hi = t;
        }
        sto_kviter *it = sto_range_iter_new(merge_of(m), arr_k(&lo), arr_k(&hi));
        assert_non_null(it);
        walk(it, m, &rng, arr_k(&lo), arr_k(&hi));
        it->ops->free(it);
    }
    free(m);
}

static void test_merge_child_failure_stops_merge(void **state) {
    (void)state;
    static arr_entry a[3], b[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (arr_entry){{(uint8_t)(2 * i)}, 1, {0, (uint8_t)i}};
        b[i] = (arr_entry){{(uint8_t)(2 * i + 1)}, 1, {1, (uint8_t)i}};
    }
    sto_kviter *kids[2] = {arr_new(a, 3), arr_new(b, 3)};
    ((arr_iter *)kids[1])->fail_at = 1; /* key 3 */
    sto_kviter *it = sto_merge_iter_new(kids, 2);
    it->ops->seek_first(it);
    assert_int_equal(it->ops->key(it).data[0], 0);
    it->ops->next(it);
    assert_int_equal(it->ops->key(it).data[0], 1);
    it->ops->next(it); /* child 1 moves onto its failing entry */
    assert_false(it->ops->valid(it));
    st_err err;
    assert_int_equal(it->ops->status(it, &err), ST_DATA_LOSS);
    it->ops->free(it);

    sto_kviter *none = sto_merge_iter_new(NULL, 0);
    none->ops->seek_first(none);
    assert_false(none->ops->valid(none));
    none->ops->seek_last(none);
    assert_false(none->ops->valid(none));
    assert_int_equal(none->ops->status(none, NULL), ST_OK);
    none->ops->free(none);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_random_walk_matches_model),
        cmocka_unit_test(test_merge_range_iter_restricts),
        cmocka_unit_test(test_merge_child_failure_stops_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
