/* memtable_test — proves the skiplist memtable keeps entries in memcmp order, hides entries newer
 * than an iterator's snapshot lsn in every movement, replaces an equal key while older snapshots
 * keep the older value, keeps both right on the fast path of keys above the last one (sequential
 * loads) mixed with smaller keys and replaces, turns row mutations into the right entries, and lets
 * a reader thread iterate while the single writer inserts (checked against a sorted model; the
 * threaded test is meant to run under TSan/ASan too). Keys of any length and bytes (shared
 * prefixes, prefixes of each other, 0x00 and 0xff at every position) keep st_slice_cmp's order
 * in iteration and seeks (the search compares 8 bytes at a time), and the memory count includes
 * the values, which live apart from the nodes. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "key.h"
#include "memtable.h"

#define KEY_LEN 8

static void make_key(uint8_t *buf, uint64_t v) {
    st_put_be64(buf, v);
}

static void test_memtable_sorted_iteration(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_memtable_sorted_iteration"));
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    assert_true(sto_memtable_empty(m));
    enum { N = 3000, SPACE = 10000 };
    static bool present[SPACE];
    memset(present, 0, sizeof present);
    size_t bytes0 = sto_memtable_bytes(m);
    for (int i = 0; i < N; i++) {
        uint64_t v = st_rng_below(&rng, SPACE);
        uint8_t k[KEY_LEN];
        make_key(k, v);
        assert_int_equal(sto_memtable_put(m, st_slice_make(k, KEY_LEN), st_slice_make(k, KEY_LEN),
                                          (uint64_t)i + 1),
                         ST_OK);
        present[v] = true;
    }
    assert_false(sto_memtable_empty(m));
    assert_true(sto_memtable_bytes(m) > bytes0);
    assert_int_equal(sto_memtable_max_lsn(m), N);
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    /* Forward matches the model. */
    uint64_t v = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it), v++) {
        while (!present[v])
            v++;
        assert_int_equal(st_get_be64(it->ops->key(it).data), v);
        assert_true(st_slice_eq(it->ops->key(it), it->ops->value(it)));
    }
    /* Backward too. */
    int64_t w = SPACE - 1;
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it), w--) {
        while (!present[w])
            w--;
        assert_int_equal(st_get_be64(it->ops->key(it).data), (uint64_t)w);
    }
    /* Seeks land on the first key >= target. */
    for (int i = 0; i < 500; i++) {
        uint64_t t = st_rng_below(&rng, SPACE + 10);
        uint8_t k[KEY_LEN];
        make_key(k, t);
        it->ops->seek(it, st_slice_make(k, KEY_LEN));
        uint64_t want = t;
        while (want < SPACE && !present[want])
            want++;
        if (want >= SPACE) {
            assert_false(it->ops->valid(it));
            continue;
        }
        assert_true(it->ops->valid(it));
        assert_int_equal(st_get_be64(it->ops->key(it).data), want);
    }
    assert_int_equal(it->ops->status(it, NULL), ST_OK);
    it->ops->free(it);
    sto_memtable_unref(m);
}

static void test_memtable_snapshot_lsn_filter(void **state) {
    (void)state;
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    /* Key i at lsn i for even i, lsn 100 + i for odd i. */
    for (uint64_t i = 0; i < 20; i++) {
        uint8_t k[KEY_LEN];
        make_key(k, i);
        uint64_t lsn = i % 2 ? 100 + i : i + 1;
        assert_int_equal(sto_memtable_put(m, st_slice_make(k, KEY_LEN), ST_SLICE_LIT("v"), lsn),
                         ST_OK);
    }
    sto_kviter *it = sto_memtable_iter_new(m, 50);
    int n = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it), n++)
        assert_int_equal(st_get_be64(it->ops->key(it).data) % 2, 0);
    assert_int_equal(n, 10);
    n = 0;
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it), n++)
        assert_int_equal(st_get_be64(it->ops->key(it).data) % 2, 0);
    assert_int_equal(n, 10);
    uint8_t k[KEY_LEN];
    make_key(k, 19); /* odd, invisible, and last */
    it->ops->seek(it, st_slice_make(k, KEY_LEN));
    assert_false(it->ops->valid(it));
    make_key(k, 7);
    it->ops->seek(it, st_slice_make(k, KEY_LEN));
    assert_int_equal(st_get_be64(it->ops->key(it).data), 8);
    it->ops->prev(it);
    assert_int_equal(st_get_be64(it->ops->key(it).data), 6);
    it->ops->free(it);
    /* A snapshot before everything sees nothing. */
    it = sto_memtable_iter_new(m, 0);
    it->ops->seek_first(it);
    assert_false(it->ops->valid(it));
    it->ops->seek_last(it);
    assert_false(it->ops->valid(it));
    it->ops->free(it);
    sto_memtable_unref(m);
}

static void test_memtable_replace_equal_key(void **state) {
    (void)state;
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    st_slice k = ST_SLICE_LIT("key");
    assert_int_equal(sto_memtable_put(m, k, ST_SLICE_LIT("old"), 5), ST_OK);
    sto_kviter *old_it = sto_memtable_iter_new(m, 5);
    assert_int_equal(sto_memtable_put(m, k, ST_SLICE_LIT("newer"), 9), ST_OK);
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    it->ops->seek_first(it);
    assert_true(st_slice_eq(it->ops->value(it), ST_SLICE_LIT("newer")));
    it->ops->next(it);
    assert_false(it->ops->valid(it)); /* one entry, not two */
    old_it->ops->seek_first(old_it);
    assert_true(st_slice_eq(old_it->ops->value(old_it), ST_SLICE_LIT("old")));
    /* The same lsn twice (a repeated SetCell in one row mutation): the later one wins. */
    assert_int_equal(sto_memtable_put(m, k, ST_SLICE_LIT("last"), 9), ST_OK);
    it->ops->seek(it, k);
    assert_true(st_slice_eq(it->ops->value(it), ST_SLICE_LIT("last")));
    it->ops->free(it);
    old_it->ops->free(old_it);
    sto_memtable_unref(m);
}

/* Checks m against the model of test_memtable_tail_inserts: every key with a version <= snap is
 * seen in order, forward and backward, with its newest value <= snap, and seek finds each. */
enum { TAIL_SPACE = 40000 };
typedef struct tail_model {
    uint64_t first_lsn[TAIL_SPACE];  /* 0 = absent */
    uint64_t second_lsn[TAIL_SPACE]; /* 0 = never replaced */
} tail_model;

static uint64_t tail_visible(const tail_model *md, uint64_t v, uint64_t snap) {
    if (md->second_lsn[v] && md->second_lsn[v] <= snap)
        return md->second_lsn[v];
    return md->first_lsn[v] && md->first_lsn[v] <= snap ? md->first_lsn[v] : 0;
}

static void tail_check(sto_memtable *m, const tail_model *md, uint64_t snap) {
    sto_kviter *it = sto_memtable_iter_new(m, snap);
    uint64_t v = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it), v++) {
        while (v < TAIL_SPACE && !tail_visible(md, v, snap))
            v++;
        assert_true(v < TAIL_SPACE);
        assert_int_equal(st_get_be64(it->ops->key(it).data), v);
        assert_int_equal(st_get_be64(it->ops->value(it).data), tail_visible(md, v, snap));
        it->ops->seek(it, it->ops->key(it)); /* seek walks the upper levels too */
        assert_int_equal(st_get_be64(it->ops->key(it).data), v);
    }
    while (v < TAIL_SPACE && !tail_visible(md, v, snap))
        v++;
    assert_int_equal(v, TAIL_SPACE);
    int64_t w = TAIL_SPACE - 1;
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it), w--) {
        while (w >= 0 && !tail_visible(md, (uint64_t)w, snap))
            w--;
        assert_true(w >= 0);
        assert_int_equal(st_get_be64(it->ops->key(it).data), (uint64_t)w);
    }
    it->ops->free(it);
}

/* The insert fast path (a key above the last one links after the per-level tail nodes without a
 * search) must keep order and versions: a sequential load with keys below the last one mixed in
 * (smaller than all, and between others), replaces of the last key at a later lsn (an older
 * snapshot still sees the older value), and ascending inserts again after each of those. */
static void test_memtable_tail_inserts(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_memtable_tail_inserts"));
    static tail_model md;
    memset(&md, 0, sizeof md);
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    uint64_t lsn = 0, next = 1000, last = 0, snap_mid = 0;
    for (int i = 0; i < 12000; i++) {
        uint64_t v;
        unsigned dice = (unsigned)st_rng_below(&rng, 10);
        if (dice == 0 && last) {
            v = st_rng_below(&rng, next); /* below the last key: the search path */
        } else if (dice == 1 && last && !md.second_lsn[last]) {
            v = last; /* equal to the last key: a replace */
        } else {
            v = next;
            next += 1 + st_rng_below(&rng, 2);
            last = v;
        }
        if (md.first_lsn[v] && md.second_lsn[v])
            continue; /* the model keeps two versions */
        uint8_t k[KEY_LEN], val[8];
        make_key(k, v);
        st_put_be64(val, ++lsn);
        assert_int_equal(sto_memtable_put(m, st_slice_make(k, KEY_LEN), st_slice_make(val, 8), lsn),
                         ST_OK);
        if (md.first_lsn[v])
            md.second_lsn[v] = lsn;
        else
            md.first_lsn[v] = lsn;
        if (i == 6000)
            snap_mid = lsn;
    }
    assert_true(next < TAIL_SPACE);
    assert_int_equal(sto_memtable_max_lsn(m), lsn);
    tail_check(m, &md, UINT64_MAX);
    tail_check(m, &md, snap_mid);
    /* A key prefixing the last one sorts before it; one extending it sorts after. */
    assert_int_equal(sto_memtable_put(m, ST_SLICE_LIT("abc"), ST_SLICE_LIT("1"), ++lsn), ST_OK);
    assert_int_equal(sto_memtable_put(m, ST_SLICE_LIT("abcd"), ST_SLICE_LIT("2"), ++lsn), ST_OK);
    assert_int_equal(sto_memtable_put(m, ST_SLICE_LIT("ab"), ST_SLICE_LIT("3"), ++lsn), ST_OK);
    assert_int_equal(sto_memtable_put(m, ST_SLICE_LIT("abcd"), ST_SLICE_LIT("4"), ++lsn), ST_OK);
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    it->ops->seek(it, ST_SLICE_LIT("a"));
    const char *want[][2] = {{"ab", "3"}, {"abc", "1"}, {"abcd", "4"}};
    for (size_t j = 0; j < 3; j++, it->ops->next(it)) {
        assert_true(it->ops->valid(it));
        assert_true(st_slice_eq(it->ops->key(it), st_slice_cstr(want[j][0])));
        assert_true(st_slice_eq(it->ops->value(it), st_slice_cstr(want[j][1])));
    }
    assert_false(it->ops->valid(it));
    it->ops->free(it);
    sto_memtable_unref(m);
}

/* Decodes the entries of m in order into keys (into one scratch per entry). */
static size_t collect(sto_memtable *m, sto_key *keys, st_buf *scratch, size_t max) {
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    size_t n = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it)) {
        assert_true(n < max);
        st_buf tmp;
        st_buf_init(&tmp);
        assert_true(sto_key_decode(it->ops->key(it), &keys[n], &tmp));
        /* Keep the decoded slices alive: copy the key bytes into scratch[n]. */
        st_buf_reset(&scratch[n]);
        st_slice key = it->ops->key(it);
        assert_int_equal(st_buf_append(&scratch[n], key.data, key.len), ST_OK);
        st_buf_free(&tmp);
        assert_true(sto_key_decode(st_buf_slice(&scratch[n]), &keys[n], &tmp));
        n++;
        st_buf_free(&tmp);
    }
    it->ops->free(it);
    return n;
}

static void test_memtable_apply_row_mutation(void **state) {
    (void)state;
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    sto_mut muts[] = {
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("a"),
         .ts_us = 10,
         .value = ST_SLICE_LIT("gone")}, /* covered by the DEL_COLUMN below */
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("b"),
         .ts_us = 10,
         .value = ST_SLICE_LIT("v1")},
        {.type = STO_MUT_DEL_COLUMN,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("a"),
         .ts_start_us = 5,
         .ts_end_us = STO_TS_END_INF},
        {.type = STO_MUT_DEL_COLUMN,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("z"),
         .ts_start_us = 7,
         .ts_end_us = 7}, /* empty range: nothing */
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("a"),
         .ts_us = 20,
         .value = ST_SLICE_LIT("after")}, /* after the delete: kept */
        {.type = STO_MUT_DEL_FAMILY, .family = ST_SLICE_LIT("g")},
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("b"),
         .ts_us = 10,
         .value = ST_SLICE_LIT("v2")}, /* same cell again: replaces v1 */
    };
    sto_row_mut row = {.row = ST_SLICE_LIT("row"), .muts = muts, .n_muts = 7, .version = 42};
    assert_int_equal(sto_memtable_apply(m, &row, 3), ST_OK);
    sto_key keys[16];
    st_buf scratch[16];
    for (int i = 0; i < 16; i++)
        st_buf_init(&scratch[i]);
    size_t n = collect(m, keys, scratch, 16);
    assert_int_equal(n, 4);
    assert_int_equal(keys[0].kind, STO_KEY_COLUMN_DEL); /* f:a tombstone */
    assert_int_equal(keys[0].del_start_us, 5);
    assert_int_equal(keys[0].del_end_us, STO_TS_END_INF);
    assert_int_equal(keys[1].kind, STO_KEY_CELL); /* f:a@20 */
    assert_int_equal(keys[1].ts_us, 20);
    assert_int_equal(keys[2].kind, STO_KEY_CELL); /* f:b@10 */
    assert_true(st_slice_eq(keys[2].qualifier, ST_SLICE_LIT("b")));
    assert_int_equal(keys[3].kind, STO_KEY_FAMILY_DEL);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(keys[i].version, 42);
    sto_kviter *it = sto_memtable_iter_new(m, 3);
    it->ops->seek_first(it);
    it->ops->next(it);
    it->ops->next(it);
    assert_true(st_slice_eq(it->ops->value(it), ST_SLICE_LIT("v2")));
    it->ops->free(it);

    /* A row delete after cells drops them; before cells keeps them. */
    sto_mut muts2[] = {
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("x"),
         .ts_us = 1,
         .value = ST_SLICE_LIT("dropped")},
        {.type = STO_MUT_DEL_ROW},
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("y"),
         .ts_us = 1,
         .value = ST_SLICE_LIT("kept")},
    };
    sto_row_mut row2 = {.row = ST_SLICE_LIT("s2"), .muts = muts2, .n_muts = 3, .version = 50};
    assert_int_equal(sto_memtable_apply(m, &row2, 4), ST_OK);
    n = collect(m, keys, scratch, 16);
    assert_int_equal(n, 6);
    assert_int_equal(keys[4].kind, STO_KEY_ROW_DEL);
    assert_true(st_slice_eq(keys[5].qualifier, ST_SLICE_LIT("y")));

    /* A bad mutation writes nothing. */
    sto_mut bad[] = {
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("q"),
         .ts_us = 1,
         .value = ST_SLICE_LIT("v")},
        {.type = STO_MUT_SET_CELL,
         .family = ST_SLICE_LIT("f"),
         .qualifier = ST_SLICE_LIT("q"),
         .ts_us = -5,
         .value = ST_SLICE_LIT("v")},
    };
    sto_row_mut row3 = {.row = ST_SLICE_LIT("r3"), .muts = bad, .n_muts = 2, .version = 60};
    assert_int_equal(sto_memtable_apply(m, &row3, 5), ST_INVALID_ARGUMENT);
    assert_int_equal(collect(m, keys, scratch, 16), 6);
    assert_int_equal(sto_memtable_max_lsn(m), 4);
    for (int i = 0; i < 16; i++)
        st_buf_free(&scratch[i]);
    sto_memtable_unref(m);
}

/* ---- one writer, one reader ---- */

enum { CONC_N = 100000 };

typedef struct conc_ctx {
    sto_memtable *m;
    atomic_bool reader_started; /* the writer waits for it, so the two really overlap */
    atomic_int passes_during_writes;
    uint64_t keys[CONC_N]; /* key of the entry written at lsn i + 1 */
} conc_ctx;

static void *conc_writer(void *arg) {
    conc_ctx *c = arg;
    while (!atomic_load(&c->reader_started))
        ;
    for (uint64_t i = 0; i < CONC_N; i++) {
        uint8_t k[KEY_LEN], v[KEY_LEN];
        make_key(k, c->keys[i]);
        make_key(v, i + 1);
        ST_ASSERT(sto_memtable_put(c->m, st_slice_make(k, KEY_LEN), st_slice_make(v, KEY_LEN),
                                   i + 1) == ST_OK);
    }
    return NULL;
}

/* Iterates at the latest published lsn: every entry up to it must be there, in order, and
 * nothing later. Returns how many full passes ran. */
static void *conc_reader(void *arg) {
    conc_ctx *c = arg;
    uint64_t snap = 0;
    atomic_store(&c->reader_started, true);
    while (snap < CONC_N) {
        snap = sto_memtable_max_lsn(c->m);
        sto_kviter *it = sto_memtable_iter_new(c->m, snap);
        uint64_t n = 0, prev = 0;
        bool first = true;
        for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it)) {
            uint64_t k = st_get_be64(it->ops->key(it).data);
            uint64_t lsn = st_get_be64(it->ops->value(it).data);
            ST_ASSERT(first || k > prev);
            ST_ASSERT(lsn <= snap && c->keys[lsn - 1] == k);
            prev = k;
            first = false;
            n++;
        }
        ST_ASSERT(n == snap);
        if (snap < CONC_N)
            atomic_fetch_add(&c->passes_during_writes, 1);
        it->ops->free(it);
    }
    return NULL;
}

static void test_memtable_concurrent_reader(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_memtable_concurrent_reader"));
    conc_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    assert_int_equal(sto_memtable_new(&c->m), ST_OK);
    /* Distinct random keys: a random permutation slice of a large space. */
    for (uint64_t i = 0; i < CONC_N; i++)
        c->keys[i] = i * 7919 % 1000003 * 1000 + st_rng_below(&rng, 1000);
    pthread_t w, r;
    assert_int_equal(pthread_create(&r, NULL, conc_reader, c), 0);
    assert_int_equal(pthread_create(&w, NULL, conc_writer, c), 0);
    pthread_join(w, NULL);
    pthread_join(r, NULL);
    fprintf(stderr, "reader passes while writing: %d\n", atomic_load(&c->passes_during_writes));
    sto_memtable_unref(c->m);
    free(c);
}

/* Random keys of 0..40 bytes over a small alphabet with 0x00 and 0xff, often sharing a long
 * prefix, so keys differ before, at and after every 8-byte boundary and some prefix others. */
#define VAR_N 4000
#define VAR_KEY_MAX 40

typedef struct var_key {
    uint8_t b[VAR_KEY_MAX];
    size_t len;
} var_key;

static int var_key_cmp(const void *a, const void *b) {
    const var_key *x = a, *y = b;
    return st_slice_cmp(st_slice_make(x->b, x->len), st_slice_make(y->b, y->len));
}

static void var_key_make(st_rng *rng, var_key *k) {
    static const uint8_t alphabet[] = {0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff, 'u', 's'};
    k->len = (size_t)st_rng_below(rng, VAR_KEY_MAX + 1);
    size_t shared = (size_t)st_rng_below(rng, 2) ? (size_t)st_rng_below(rng, k->len + 1) : 0;
    for (size_t i = 0; i < k->len; i++)
        k->b[i] = i < shared ? (uint8_t)('a' + i % 3) : alphabet[st_rng_below(rng, 8)];
}

static void test_memtable_variable_keys_order(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_memtable_variable_keys_order"));
    static var_key keys[VAR_N], sorted[VAR_N];
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    for (size_t i = 0; i < VAR_N; i++) {
        var_key_make(&rng, &keys[i]);
        assert_int_equal(sto_memtable_put(m, st_slice_make(keys[i].b, keys[i].len),
                                          st_slice_make(keys[i].b, keys[i].len), i + 1),
                         ST_OK);
    }
    memcpy(sorted, keys, sizeof sorted);
    qsort(sorted, VAR_N, sizeof sorted[0], var_key_cmp);
    size_t n = 0; /* distinct keys, in order */
    for (size_t i = 0; i < VAR_N; i++)
        if (n == 0 || var_key_cmp(&sorted[n - 1], &sorted[i]) != 0)
            sorted[n++] = sorted[i];
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    size_t j = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it), j++) {
        assert_true(j < n);
        assert_true(st_slice_eq(it->ops->key(it), st_slice_make(sorted[j].b, sorted[j].len)));
    }
    assert_int_equal(j, n);
    /* A seek lands on the first key >= the target, whatever the target. */
    for (int q = 0; q < 2000; q++) {
        var_key t;
        var_key_make(&rng, &t);
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (var_key_cmp(&sorted[mid], &t) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        it->ops->seek(it, st_slice_make(t.b, t.len));
        if (lo == n) {
            assert_false(it->ops->valid(it));
            continue;
        }
        assert_true(it->ops->valid(it));
        assert_true(st_slice_eq(it->ops->key(it), st_slice_make(sorted[lo].b, sorted[lo].len)));
    }
    it->ops->free(it);
    sto_memtable_unref(m);
}

/* Values are counted: a memtable's bytes cover every value written into it, large ones too. */
static void test_memtable_bytes_count_values(void **state) {
    (void)state;
    sto_memtable *m;
    assert_int_equal(sto_memtable_new(&m), ST_OK);
    size_t big = 300u << 10; /* over an arena block */
    uint8_t *v = malloc(big);
    assert_non_null(v);
    memset(v, 0xab, big);
    uint64_t total = 0;
    for (uint64_t i = 0; i < 64; i++) {
        uint8_t k[KEY_LEN];
        make_key(k, i);
        size_t len = i == 7 ? big : 1000;
        assert_int_equal(
            sto_memtable_put(m, st_slice_make(k, KEY_LEN), st_slice_make(v, len), i + 1), ST_OK);
        total += len + KEY_LEN;
    }
    assert_true(sto_memtable_bytes(m) >= total);
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    uint8_t k7[KEY_LEN];
    make_key(k7, 7);
    it->ops->seek(it, st_slice_make(k7, KEY_LEN));
    assert_true(it->ops->valid(it));
    assert_true(st_slice_eq(it->ops->value(it), st_slice_make(v, big)));
    it->ops->free(it);
    sto_memtable_unref(m);
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memtable_sorted_iteration),
        cmocka_unit_test(test_memtable_snapshot_lsn_filter),
        cmocka_unit_test(test_memtable_replace_equal_key),
        cmocka_unit_test(test_memtable_tail_inserts),
        cmocka_unit_test(test_memtable_apply_row_mutation),
        cmocka_unit_test(test_memtable_concurrent_reader),
        cmocka_unit_test(test_memtable_variable_keys_order),
        cmocka_unit_test(test_memtable_bytes_count_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
