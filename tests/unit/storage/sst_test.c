/*
 * Proves SSTables round-trip: tables written from random sorted entries (compressible and
 * incompressible values, with and without a block cache, small and default block sizes, ~1 KB
 * values whose blocks restart every two entries) read back
 * identically against a sorted array — full forward, full reverse, random seeks followed by
 * next/prev walks across block boundaries — plus the edge cases (empty table, one entry, a 5 MB
 * value bigger than a block, out-of-order keys rejected), the row bloom filter, block sampling,
 * obsolete-file removal and concurrent readers; the index search over keys sharing long prefixes,
 * and the concatenating iterator over disjoint tables read as one stream. Corruption: random byte
 * flips and truncations of a written file make opening or iterating fail with ST_DATA_LOSS, or
 * return correct data — never a crash or wrong data (run under ASan). sto_sst_verify, the full
 * check of a file made elsewhere: a table this writer made passes, a version above the bound and
 * a key that is not an ikey are refused naming the entry (keys out of order cannot be written by
 * the writer: backup_forged_sst_test forges them).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "block.h"
#include "key.h"
#include "sst.h"
#include "strata/storage.h"

typedef struct ent {
    uint8_t *k, *v;
    size_t kl, vl;
} ent;

typedef struct fixture {
    st_env *env;
    char dir[512];
    char path[600];
    st_rng rng;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    f->env = st_env_posix();
    const char *base = getenv("STRATA_TEST_TMP");
    snprintf(f->dir, sizeof(f->dir), "%s/sst_test_%d", base && *base ? base : "/tmp",
             (int)getpid());
    assert_int_equal(f->env->ops->mkdirs(f->env, f->dir, NULL), ST_OK);
    snprintf(f->path, sizeof(f->path), "%s/t.sst", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    f->env->ops->remove(f->env, f->path, NULL);
    rmdir(f->dir);
    free(f);
    return 0;
}

static int ent_cmp(const void *a, const void *b) {
    const ent *x = a, *y = b;
    return st_slice_cmp(st_slice_make(x->k, x->kl), st_slice_make(y->k, y->kl));
}

static st_slice ek(const ent *e) {
    return st_slice_make(e->k, e->kl);
}
static st_slice ev(const ent *e) {
    return st_slice_make(e->v, e->vl);
}

/* n random entries, sorted and deduplicated; values are text-like (compressible) or random. */
static ent *make_entries(st_rng *r, size_t *n, bool compressible, size_t vmax) {
    ent *es = calloc(*n, sizeof(*es));
    for (size_t i = 0; i < *n; i++) {
        es[i].kl = 4 + st_rng_below(r, 28);
        es[i].k = malloc(es[i].kl);
        for (size_t j = 0; j < es[i].kl; j++)
            es[i].k[j] = (uint8_t)(j < 2 ? 'a' + st_rng_below(r, 4) : st_rng_next(r));
        es[i].vl = st_rng_below(r, vmax + 1);
        es[i].v = malloc(es[i].vl + 1);
        for (size_t j = 0; j < es[i].vl; j++)
            es[i].v[j] =
                compressible ? (uint8_t)("value text "[j % 11] + (i % 3)) : (uint8_t)st_rng_next(r);
    }
    qsort(es, *n, sizeof(*es), ent_cmp);
    size_t m = 0;
    for (size_t i = 0; i < *n; i++) {
        if (m > 0 && ent_cmp(&es[m - 1], &es[i]) == 0) {
            free(es[i].k);
            free(es[i].v);
            continue;
        }
        es[m++] = es[i];
    }
    *n = m;
    return es;
}

static void free_entries(ent *es, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(es[i].k);
        free(es[i].v);
    }
    free(es);
}

static uint64_t write_table(fixture *f, const ent *es, size_t n, const sto_sst_options *o) {
    sto_sst_writer *w;
    st_err err;
    assert_int_equal(sto_sst_writer_new(f->env, f->path, o, &w, &err), ST_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sto_sst_writer_add(w, ek(&es[i]), ev(&es[i]), &err), ST_OK);
    uint64_t bytes = 0;
    assert_int_equal(sto_sst_writer_finish(w, &bytes, &err), ST_OK);
    return bytes;
}

static void assert_at(sto_kviter *it, const ent *e) {
    assert_true(it->ops->valid(it));
    assert_true(st_slice_eq(it->ops->key(it), ek(e)));
    assert_true(st_slice_eq(it->ops->value(it), ev(e)));
}

/* Index of the first entry >= target. */
static size_t lower_bound(const ent *es, size_t n, st_slice target) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (st_slice_cmp(ek(&es[mid]), target) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void check_iter(sto_kviter *it, const ent *es, size_t n, st_rng *r, int seeks);

static void check_table(sto_sst *t, const ent *es, size_t n, st_rng *r, int seeks) {
    sto_kviter *it = sto_sst_iter_new(t);
    assert_non_null(it);
    check_iter(it, es, n, r, seeks);
}

/* Walks it fully both ways, then seeks (present keys and random probes) with random walks. */
static void check_iter(sto_kviter *it, const ent *es, size_t n, st_rng *r, int seeks) {
    size_t i = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it))
        assert_at(it, &es[i++]);
    assert_int_equal(i, n);
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it))
        assert_at(it, &es[--i]);
    assert_int_equal(i, 0);
    uint8_t probe[40];
    for (int s = 0; s < seeks && n > 0; s++) {
        st_slice target;
        if (s % 2) {
            target = ek(&es[st_rng_below(r, n)]);
        } else {
            size_t len = 1 + st_rng_below(r, sizeof(probe) - 1);
            for (size_t j = 0; j < len; j++)
                probe[j] = (uint8_t)(j < 2 ? 'a' + st_rng_below(r, 5) : st_rng_next(r));
            target = st_slice_make(probe, len);
        }
        size_t want = lower_bound(es, n, target);
        it->ops->seek(it, target);
        if (want == n) {
            assert_false(it->ops->valid(it));
            continue;
        }
        assert_at(it, &es[want]);
        int steps = (int)st_rng_below(r, 40);
        size_t pos = want;
        for (int k = 0; k < steps; k++) { /* random walk */
            if (st_rng_below(r, 2)) {
                it->ops->next(it);
                if (++pos == n) {
                    assert_false(it->ops->valid(it));
                    break;
                }
            } else {
                it->ops->prev(it);
                if (pos-- == 0) {
                    assert_false(it->ops->valid(it));
                    break;
                }
            }
            assert_at(it, &es[pos]);
        }
    }
    assert_int_equal(it->ops->status(it, NULL), ST_OK);
    it->ops->free(it);
}

static void round_trip(fixture *f, size_t n, bool compressible, size_t vmax, size_t block_bytes,
                       size_t cache_bytes) {
    ent *es = make_entries(&f->rng, &n, compressible, vmax);
    sto_sst_options o = {.block_bytes = block_bytes, .bloom_bits_per_key = 10, .zstd_level = 1};
    uint64_t bytes = write_table(f, es, n, &o);
    sto_cache *cache = NULL;
    if (cache_bytes)
        assert_int_equal(sto_cache_new(cache_bytes, &cache), ST_OK);
    sto_sst *t;
    st_err err;
    assert_int_equal(sto_sst_open(f->env, f->path, 1, cache, &t, &err), ST_OK);
    assert_int_equal(sto_sst_file_bytes(t), bytes);
    assert_int_equal(sto_sst_entries(t), n);
    assert_true(st_slice_eq(sto_sst_smallest(t), ek(&es[0])));
    assert_true(st_slice_eq(sto_sst_largest(t), ek(&es[n - 1])));
    check_table(t, es, n, &f->rng, 2000);
    check_table(t, es, n, &f->rng, 500); /* second pass: from the cache */
    sto_sst_unref(t);
    sto_cache_free(cache);
    free_entries(es, n);
}

static void test_sst_round_trip_random_compressible(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_round_trip_random_compressible"));
    round_trip(f, 50000, true, 200, 0, 4 << 20);
}

static void test_sst_round_trip_random_incompressible(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_round_trip_random_incompressible"));
    round_trip(f, 50000, false, 100, 0, 0);
}

static void test_sst_round_trip_small_blocks(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_round_trip_small_blocks"));
    round_trip(f, 5000, true, 50, 256, 64 << 10); /* many blocks, a cache smaller than them */
    round_trip(f, 3000, false, 50, 1, 0);         /* one entry per block */
}

/* Values near 1 KB: data blocks restart their prefix compression every two entries or so (not
 * every 16), which every seek, next and prev must still read right. */
static void test_sst_round_trip_big_values_dense_restarts(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_round_trip_big_values_dense_restarts"));
    round_trip(f, 3000, false, 2000, 0, 0);
    round_trip(f, 3000, true, 2000, 0, 1 << 20);
}

/* Index keys sharing a long prefix and, in runs, the 8 bytes after it: the fingerprint search of
 * the index must still find the first entry >= any target (one entry per block, so the index
 * has an entry per key). */
static void test_sst_index_search_with_shared_prefixes(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_index_search_with_shared_prefixes"));
    size_t n = 3000;
    ent *es = calloc(n, sizeof(*es));
    for (size_t i = 0; i < n; i++) {
        char k[64];
        int len = snprintf(k, sizeof k, "common-prefix/%c%c%c%c%c%c%c%c/%u", 'a' + (int)(i / 1000),
                           'x', 'x', 'x', 'x', 'x', 'x', 'a' + (int)st_rng_below(&f->rng, 3),
                           (unsigned)st_rng_below(&f->rng, 100000));
        es[i].kl = (size_t)len - (st_rng_below(&f->rng, 4) == 0 ? 7 : 0); /* some short keys */
        es[i].k = malloc(es[i].kl);
        memcpy(es[i].k, k, es[i].kl);
        es[i].vl = 3;
        es[i].v = malloc(4);
        memcpy(es[i].v, "val", 4);
    }
    qsort(es, n, sizeof(*es), ent_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && ent_cmp(&es[m - 1], &es[i]) == 0) {
            free(es[i].k);
            free(es[i].v);
            continue;
        }
        es[m++] = es[i];
    }
    n = m;
    sto_sst_options o = {.block_bytes = 1, .bloom_bits_per_key = 10, .zstd_level = 1};
    write_table(f, es, n, &o);
    sto_sst *t;
    st_err err;
    assert_int_equal(sto_sst_open(f->env, f->path, 1, NULL, &t, &err), ST_OK);
    check_table(t, es, n, &f->rng, 3000);
    sto_kviter *it = sto_sst_iter_new(t); /* targets around the common prefix */
    it->ops->seek(it, ST_SLICE_LIT("common"));
    assert_at(it, &es[0]);
    it->ops->seek(it, ST_SLICE_LIT("common-prefix/"));
    assert_at(it, &es[0]);
    it->ops->seek(it, ST_SLICE_LIT("a"));
    assert_at(it, &es[0]);
    it->ops->seek(it, ST_SLICE_LIT("common-prefix0"));
    assert_false(it->ops->valid(it));
    it->ops->seek(it, ST_SLICE_LIT("common-prefix/b"));
    assert_at(it, &es[lower_bound(es, n, ST_SLICE_LIT("common-prefix/b"))]);
    it->ops->free(it);
    sto_sst_unref(t);
    free_entries(es, n);
}

static sto_kviter *no_wrap(sto_kviter *child, st_slice lo, st_slice hi) {
    (void)lo;
    (void)hi;
    return child;
}

/* Disjoint tables given in any order read as one stream through the concatenating iterator,
 * forward, backward and after seeks that land in any table or between tables. */
static void test_sst_concat_iterator_over_disjoint_tables(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_concat_iterator_over_disjoint_tables"));
    size_t n = 6000;
    ent *es = make_entries(&f->rng, &n, true, 60);
    enum { PARTS = 4 };
    size_t cut[PARTS + 1] = {0, n / 7, n / 2, n / 2 + 1, n};
    sto_sst *tabs[PARTS];
    sto_cache *cache;
    assert_int_equal(sto_cache_new(256 << 10, &cache), ST_OK);
    sto_sst_options o = {.block_bytes = 512, .bloom_bits_per_key = 10, .zstd_level = 1};
    for (int p = 0; p < PARTS; p++) {
        snprintf(f->path, sizeof f->path, "%s/c%d.sst", f->dir, p);
        write_table(f, es + cut[p], cut[p + 1] - cut[p], &o);
        st_err err;
        assert_int_equal(
            sto_sst_open(f->env, f->path, 10 + (uint64_t)p, cache, &tabs[PARTS - 1 - p], &err),
            ST_OK);
        sto_sst_mark_obsolete(tabs[PARTS - 1 - p]); /* removes the file at the last unref */
    }
    for (int p = 0; p + 1 < PARTS; p++)
        assert_true(sto_sst_disjoint(tabs[p], tabs[p + 1]));
    bool wrap[PARTS] = {false, true, false, false};
    sto_kviter *it = sto_sst_concat_iter_new(tabs, wrap, PARTS, st_slice_make(NULL, 0),
                                             st_slice_make(NULL, 0), no_wrap, NULL);
    assert_non_null(it);
    for (int p = 0; p < PARTS; p++)
        sto_sst_unref(tabs[p]); /* the iterator holds its own references */
    check_iter(it, es, n, &f->rng, 2000);
    sto_cache_free(cache);
    snprintf(f->path, sizeof f->path, "%s/t.sst", f->dir);
    free_entries(es, n);
}

static void test_sst_compression_shrinks_file(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, 7);
    size_t n = 5000;
    ent *es = make_entries(&f->rng, &n, true, 500);
    sto_sst_options plain = {.zstd_level = STO_BLOCK_ZSTD_NONE}, zstd = {.zstd_level = 1};
    uint64_t a = write_table(f, es, n, &plain);
    uint64_t b = write_table(f, es, n, &zstd);
    assert_true(b < a / 2);
    free_entries(es, n);
}

static void test_sst_empty_table(void **state) {
    fixture *f = *state;
    write_table(f, NULL, 0, NULL);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 2, NULL, &t, NULL), ST_OK);
    assert_int_equal(sto_sst_entries(t), 0);
    assert_int_equal(sto_sst_smallest(t).len, 0);
    assert_false(sto_sst_may_contain_row(t, ST_SLICE_LIT("row")));
    sto_kviter *it = sto_sst_iter_new(t);
    it->ops->seek_first(it);
    assert_false(it->ops->valid(it));
    it->ops->seek_last(it);
    assert_false(it->ops->valid(it));
    it->ops->seek(it, ST_SLICE_LIT("x"));
    assert_false(it->ops->valid(it));
    assert_int_equal(it->ops->status(it, NULL), ST_OK);
    it->ops->free(it);
    assert_int_equal(sto_sst_approx_offset(t, ST_SLICE_LIT("x")), 0);
    sto_sst_unref(t);
}

/* Cells r0000..r0299 f:q (versions at 1000 + i us) and a row tombstone of r0100 at 5000 us,
 * through small blocks: verify passes with a bound at 5000 us, is refused one below it. */
static void test_sst_verify(void **state) {
    fixture *f = *state;
    enum { N = 300 };
    ent es[N + 1];
    st_buf b;
    st_buf_init(&b);
    for (size_t i = 0; i <= N; i++) {
        char row[16];
        snprintf(row, sizeof row, "r%04zu", i < N ? i : (size_t)100);
        sto_key k = {.kind = i < N ? STO_KEY_CELL : STO_KEY_ROW_DEL,
                     .row = st_slice_cstr(row),
                     .family = ST_SLICE_LIT("f"),
                     .qualifier = ST_SLICE_LIT("q"),
                     .ts_us = 1000,
                     .version = STO_VERSION(i < N ? 1000 + i : 5000, 1)};
        st_buf_reset(&b);
        assert_int_equal(sto_key_encode(&b, &k), ST_OK);
        es[i] = (ent){.k = malloc(b.len), .kl = b.len, .v = malloc(1), .vl = 1};
        memcpy(es[i].k, b.data, b.len);
        es[i].v[0] = 'v';
    }
    st_buf_free(&b);
    qsort(es, N + 1, sizeof *es, ent_cmp);
    sto_sst_options o = {.block_bytes = 512};
    write_table(f, es, N + 1, &o);
    sto_sst *t;
    st_err err;
    assert_int_equal(sto_sst_open(f->env, f->path, 3, NULL, &t, &err), ST_OK);
    assert_int_equal(sto_sst_verify(t, STO_VERSION(5000, STO_ORIGIN_MAX), NULL, &err), ST_OK);
    assert_int_equal(sto_sst_verify(t, STO_VERSION(4999, STO_ORIGIN_MAX), NULL, &err),
                     ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "version time 5000 us is past the allowed 4999"));
    assert_non_null(strstr(err.msg, "data block "));
    sto_sst_unref(t);
    for (size_t i = 0; i <= N; i++) {
        free(es[i].k);
        free(es[i].v);
    }
    ent raw[2] = {{(uint8_t *)"a", (uint8_t *)"1", 1, 1}, {(uint8_t *)"b", (uint8_t *)"2", 1, 1}};
    write_table(f, raw, 2, NULL);
    assert_int_equal(sto_sst_open(f->env, f->path, 4, NULL, &t, &err), ST_OK);
    assert_int_equal(sto_sst_verify(t, UINT64_MAX, NULL, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "entry 0: malformed internal key"));
    sto_sst_unref(t);
    write_table(f, NULL, 0, NULL);
    assert_int_equal(sto_sst_open(f->env, f->path, 5, NULL, &t, &err), ST_OK);
    assert_int_equal(sto_sst_verify(t, 0, NULL, &err), ST_OK);
    sto_sst_unref(t);
}

static void test_sst_single_entry(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, 1);
    ent e = {.k = (uint8_t *)"only", .kl = 4, .v = (uint8_t *)"value", .vl = 5};
    write_table(f, &e, 1, NULL);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 3, NULL, &t, NULL), ST_OK);
    check_table(t, &e, 1, &f->rng, 50);
    sto_kviter *it = sto_sst_iter_new(t);
    it->ops->seek(it, ST_SLICE_LIT("a"));
    assert_at(it, &e);
    it->ops->prev(it);
    assert_false(it->ops->valid(it));
    it->ops->seek(it, ST_SLICE_LIT("onlz"));
    assert_false(it->ops->valid(it));
    it->ops->free(it);
    sto_sst_unref(t);
}

static void test_sst_large_values(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_large_values"));
    size_t n = 7;
    ent *es = calloc(n, sizeof(*es));
    size_t sizes[7] = {10, 5u << 20, 3, 70000, 5u << 20, 0, 100};
    for (size_t i = 0; i < n; i++) {
        es[i].kl = 3;
        es[i].k = malloc(3);
        memcpy(es[i].k, (char[]){'k', 'e', (char)('a' + i)}, 3);
        es[i].vl = sizes[i];
        es[i].v = malloc(sizes[i] + 1);
        for (size_t j = 0; j < sizes[i]; j++) /* half random, half compressible */
            es[i].v[j] = (i % 2) ? (uint8_t)st_rng_next(&f->rng) : (uint8_t)(j % 7);
    }
    write_table(f, es, n, NULL);
    sto_cache *cache;
    assert_int_equal(sto_cache_new(1 << 20, &cache), ST_OK); /* blocks bigger than the cache */
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 4, cache, &t, NULL), ST_OK);
    check_table(t, es, n, &f->rng, 30);
    sto_sst_unref(t);
    uint64_t bytes;
    sto_cache_stats(cache, &bytes, NULL, NULL);
    assert_true(bytes <= 1 << 20);
    sto_cache_free(cache);
    free_entries(es, n);
}

static void test_sst_rejects_out_of_order_keys(void **state) {
    fixture *f = *state;
    sto_sst_writer *w;
    st_err err;
    assert_int_equal(sto_sst_writer_new(f->env, f->path, NULL, &w, &err), ST_OK);
    assert_int_equal(sto_sst_writer_add(w, ST_SLICE_LIT("b"), ST_SLICE_LIT("1"), &err), ST_OK);
    assert_int_equal(sto_sst_writer_add(w, ST_SLICE_LIT("b"), ST_SLICE_LIT("2"), &err),
                     ST_INVALID_ARGUMENT);
    assert_int_equal(sto_sst_writer_add(w, ST_SLICE_LIT("a"), ST_SLICE_LIT("2"), &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "increasing"));
    assert_int_equal(sto_sst_writer_add(w, ST_SLICE_LIT("c"), ST_SLICE_LIT("3"), &err), ST_OK);
    assert_true(sto_sst_writer_bytes(w) > 0);
    sto_sst_writer_abandon(w);
    bool exists = true;
    assert_int_equal(f->env->ops->exists(f->env, f->path, &exists, NULL), ST_OK);
    assert_false(exists);
}

/* ikeys shaped like key.h's: enc(row) then a column suffix; the filter is over enc(row). */
static size_t make_ikey(uint8_t *out, uint32_t row, uint32_t col) {
    size_t n = (size_t)sprintf((char *)out, "row%08u", row);
    out[n++] = 0; /* an escaped 0x00 inside the row, to exercise the prefix scan */
    out[n++] = 0xff;
    out[n++] = 0;
    out[n++] = 1;
    out[n++] = 2;
    n += (size_t)sprintf((char *)out + n, "col%04u", col);
    return n;
}

static void test_sst_row_bloom_filter(void **state) {
    fixture *f = *state;
    sto_sst_writer *w;
    assert_int_equal(sto_sst_writer_new(f->env, f->path, NULL, &w, NULL), ST_OK);
    uint8_t k[64];
    for (uint32_t row = 0; row < 20000; row += 2)
        for (uint32_t col = 0; col < 3; col++)
            assert_int_equal(sto_sst_writer_add(w, st_slice_make(k, make_ikey(k, row, col)),
                                                ST_SLICE_LIT("v"), NULL),
                             ST_OK);
    assert_int_equal(sto_sst_writer_finish(w, NULL, NULL), ST_OK);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 5, NULL, &t, NULL), ST_OK);
    size_t fp = 0;
    for (uint32_t row = 0; row < 20000; row++) {
        size_t n = make_ikey(k, row, 0) - 8; /* enc(row): up to and including 0x00 0x01 */
        bool maybe = sto_sst_may_contain_row(t, st_slice_make(k, n));
        if (row % 2 == 0)
            assert_true(maybe);
        else
            fp += maybe;
    }
    assert_true(fp < 10000 / 50); /* < 2%: rows added once each at 10 bits */
    sto_sst_unref(t);
}

typedef struct sample {
    uint64_t last_end;
    size_t blocks;
    st_buf last_key;
} sample;

static void on_block(st_slice last_ikey, uint64_t end_offset, void *arg) {
    sample *s = arg;
    assert_true(end_offset > s->last_end);
    assert_true(s->blocks == 0 || st_slice_cmp(last_ikey, st_buf_slice(&s->last_key)) > 0);
    s->last_end = end_offset;
    s->blocks++;
    st_buf_reset(&s->last_key);
    st_buf_append(&s->last_key, last_ikey.data, last_ikey.len);
}

static void test_sst_sampling_and_offsets(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_sampling_and_offsets"));
    size_t n = 5000;
    ent *es = make_entries(&f->rng, &n, false, 100);
    sto_sst_options o = {.block_bytes = 1024};
    uint64_t bytes = write_table(f, es, n, &o);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 6, NULL, &t, NULL), ST_OK);
    sample s = {0};
    st_buf_init(&s.last_key);
    sto_sst_for_each_block(t, on_block, &s);
    assert_true(s.blocks > 100);
    assert_true(st_slice_eq(st_buf_slice(&s.last_key), ek(&es[n - 1])));
    assert_true(s.last_end < bytes);
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i += 97) {
        uint64_t off = sto_sst_approx_offset(t, ek(&es[i]));
        assert_true(off >= prev);
        prev = off;
    }
    assert_int_equal(sto_sst_approx_offset(t, ST_SLICE_LIT("\xff\xff\xff")), s.last_end);
    assert_true(sto_sst_memory_bytes(t) > 0);
    st_buf_free(&s.last_key);
    sto_sst_unref(t);
    free_entries(es, n);
}

static void test_sst_scan_iterator_does_not_fill_cache(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, st_test_seed("test_sst_scan_iterator_does_not_fill_cache"));
    size_t n = 3000;
    ent *es = make_entries(&f->rng, &n, true, 100);
    sto_sst_options o = {.block_bytes = 1024};
    write_table(f, es, n, &o);
    sto_cache *cache;
    assert_int_equal(sto_cache_new(8 << 20, &cache), ST_OK);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 11, cache, &t, NULL), ST_OK);
    sto_kviter *it = sto_sst_iter_new_scan(t);
    size_t i = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it))
        assert_at(it, &es[i++]);
    assert_int_equal(i, n);
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it))
        assert_at(it, &es[--i]);
    it->ops->free(it);
    uint64_t bytes, hits;
    sto_cache_stats(cache, &bytes, &hits, NULL);
    assert_int_equal(bytes, 0);
    check_table(t, es, n, &f->rng, 100); /* a normal iterator fills it */
    sto_cache_stats(cache, &bytes, &hits, NULL);
    assert_true(bytes > 0);
    uint64_t before = hits;
    it = sto_sst_iter_new_scan(t); /* and a scan uses what is cached */
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it))
        i++;
    it->ops->free(it);
    sto_cache_stats(cache, NULL, &hits, NULL);
    assert_true(hits > before);
    sto_sst_unref(t);
    sto_cache_free(cache);
    free_entries(es, n);
}

static void test_sst_obsolete_file_removed_at_last_unref(void **state) {
    fixture *f = *state;
    ent e = {.k = (uint8_t *)"k", .kl = 1, .v = (uint8_t *)"v", .vl = 1};
    write_table(f, &e, 1, NULL);
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 7, NULL, &t, NULL), ST_OK);
    sto_kviter *it = sto_sst_iter_new(t); /* holds a reference */
    sto_sst_mark_obsolete(t);
    sto_sst_unref(t);
    bool exists = false;
    assert_int_equal(f->env->ops->exists(f->env, f->path, &exists, NULL), ST_OK);
    assert_true(exists);
    it->ops->seek_first(it);
    assert_at(it, &e);
    it->ops->free(it);
    assert_int_equal(f->env->ops->exists(f->env, f->path, &exists, NULL), ST_OK);
    assert_false(exists);
}

static void test_sst_missing_and_short_files(void **state) {
    fixture *f = *state;
    sto_sst *t;
    st_err err;
    assert_int_equal(sto_sst_open(f->env, f->path, 8, NULL, &t, &err), ST_NOT_FOUND);
    assert_int_equal(st_env_write_atomic(f->env, f->path, "short", 5, NULL), ST_OK);
    assert_int_equal(sto_sst_open(f->env, f->path, 8, NULL, &t, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, f->path));
}

/* Disk full or EIO on the Nth append/sync/open, for every N: the writer reports the env's code,
 * leaves no file behind, and a run without faults still produces a readable table. */
static void test_sst_write_failures_are_reported(void **state) {
    fixture *f = *state;
    st_rng_seed(&f->rng, 11);
    size_t n = 300;
    ent *es = make_entries(&f->rng, &n, true, 100);
    st_env *fe = st_env_fault_new(f->env);
    assert_non_null(fe);
    sto_sst_options o = {.block_bytes = 1024};
    bool succeeded = false;
    for (int64_t fail_at = 0; !succeeded; fail_at++) {
        st_code want = fail_at % 2 ? ST_RESOURCE_EXHAUSTED : ST_INTERNAL;
        st_env_fault_set(fe, fail_at, want);
        sto_sst_writer *w = NULL;
        st_err err;
        st_code rc = sto_sst_writer_new(fe, f->path, &o, &w, &err);
        for (size_t i = 0; rc == ST_OK && i < n; i++)
            rc = sto_sst_writer_add(w, ek(&es[i]), ev(&es[i]), &err);
        if (rc == ST_OK) {
            rc = sto_sst_writer_finish(w, NULL, &err);
        } else if (w) {
            assert_int_equal(sto_sst_writer_add(w, ST_SLICE_LIT("\xff"), ST_SLICE_LIT(""), &err),
                             rc);
            sto_sst_writer_abandon(w);
        }
        st_env_fault_set(fe, -1, ST_OK);
        bool exists = true;
        assert_int_equal(f->env->ops->exists(f->env, f->path, &exists, NULL), ST_OK);
        if (rc == ST_OK) {
            succeeded = true;
            assert_true(exists);
        } else {
            assert_int_equal(rc, want);
            assert_non_null(strstr(err.msg, "SSTable"));
            assert_false(exists);
        }
    }
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 10, NULL, &t, NULL), ST_OK);
    check_table(t, es, n, &f->rng, 100);
    sto_sst_unref(t);
    fe->ops->destroy(fe);
    free_entries(es, n);
}

/* ---- corruption ---- */

/* Opens the table at f->path and checks that whatever it yields is a correct prefix (forward)
 * or suffix (backward) of es, ending at the full table or at an error. */
/* Returns 0 when opening failed, 1 when a read failed, 2 when everything read back. */
static int check_damaged(fixture *f, const ent *es, size_t n, sto_cache *cache, uint64_t id) {
    sto_sst *t;
    st_err err;
    st_code rc = sto_sst_open(f->env, f->path, id, cache, &t, &err);
    if (rc != ST_OK) {
        assert_true(rc == ST_DATA_LOSS || rc == ST_INTERNAL);
        assert_non_null(strstr(err.msg, "SSTable"));
        return 0;
    }
    bool failed = false;
    sto_kviter *it = sto_sst_iter_new(t);
    size_t i = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it))
        assert_at(it, &es[i++]);
    rc = it->ops->status(it, &err);
    assert_true(rc == ST_OK ? i == n : rc == ST_DATA_LOSS);
    failed |= rc != ST_OK;
    it->ops->free(it);
    it = sto_sst_iter_new(t);
    i = n;
    for (it->ops->seek_last(it); it->ops->valid(it); it->ops->prev(it))
        assert_at(it, &es[--i]);
    rc = it->ops->status(it, &err);
    assert_true(rc == ST_OK ? i == 0 : rc == ST_DATA_LOSS);
    failed |= rc != ST_OK;
    for (size_t s = 0; s < n && rc == ST_OK; s += n / 7 + 1) {
        it->ops->seek(it, ek(&es[s]));
        if (it->ops->valid(it))
            assert_at(it, &es[s]);
        rc = it->ops->status(it, &err);
    }
    if (failed)
        assert_non_null(strstr(err.msg, f->path));
    it->ops->free(it);
    sto_sst_unref(t);
    return failed ? 1 : 2;
}

static void test_sst_corruption_never_crashes(void **state) {
    fixture *f = *state;
    uint64_t seed = st_test_seed("test_sst_corruption_never_crashes");
    st_rng_seed(&f->rng, seed);
    size_t n = 400;
    ent *es = make_entries(&f->rng, &n, true, 60);
    sto_sst_options o = {.block_bytes = 512, .zstd_level = 1};
    write_table(f, es, n, &o);
    st_buf good, bad;
    st_buf_init(&good);
    st_buf_init(&bad);
    assert_int_equal(st_env_read_all(f->env, f->path, &good, NULL), ST_OK);
    sto_cache *cache;
    assert_int_equal(sto_cache_new(1 << 20, &cache), ST_OK);
    int outcomes[3] = {0};
    for (uint64_t round = 0; round < 600; round++) {
        st_buf_reset(&bad);
        st_buf_append(&bad, good.data, good.len);
        int flips = 1 + (int)st_rng_below(&f->rng, 4);
        for (int i = 0; i < flips; i++) {
            size_t at = round % 3 == 0 ? bad.len - 1 - st_rng_below(&f->rng, 200)
                                       : st_rng_below(&f->rng, bad.len);
            bad.data[at] ^= (uint8_t)(1 + st_rng_below(&f->rng, 255));
        }
        if (round % 10 == 9)
            bad.len = st_rng_below(&f->rng, bad.len);
        assert_int_equal(st_env_write_atomic(f->env, f->path, bad.data, bad.len, NULL), ST_OK);
        outcomes[check_damaged(f, es, n, cache, 100 + round)]++; /* fresh id: no stale blocks */
    }
    fprintf(stderr, "corruption: %d failed to open, %d failed reading, %d read back fully\n",
            outcomes[0], outcomes[1], outcomes[2]);
    assert_true(outcomes[0] > 0 && outcomes[1] > 0);
    sto_cache_free(cache);
    st_buf_free(&good);
    st_buf_free(&bad);
    free_entries(es, n);
}

/* ---- concurrency ---- */

typedef struct reader {
    sto_sst *t;
    const ent *es;
    size_t n;
    uint64_t seed;
} reader;

static void *read_all(void *arg) {
    reader *r = arg;
    st_rng rng;
    st_rng_seed(&rng, r->seed);
    for (int round = 0; round < 3; round++) {
        sto_kviter *it = sto_sst_iter_new(r->t);
        size_t i = 0;
        for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it), i++)
            ST_ASSERT(st_slice_eq(it->ops->key(it), ek(&r->es[i])));
        ST_ASSERT(i == r->n);
        for (int s = 0; s < 500; s++) {
            size_t j = st_rng_below(&rng, r->n);
            it->ops->seek(it, ek(&r->es[j]));
            ST_ASSERT(it->ops->valid(it) && st_slice_eq(it->ops->value(it), ev(&r->es[j])));
        }
        it->ops->free(it);
    }
    return NULL;
}

static void test_sst_concurrent_readers(void **state) {
    fixture *f = *state;
    uint64_t seed = st_test_seed("test_sst_concurrent_readers");
    st_rng_seed(&f->rng, seed);
    size_t n = 10000;
    ent *es = make_entries(&f->rng, &n, true, 100);
    sto_sst_options o = {.block_bytes = 2048};
    write_table(f, es, n, &o);
    sto_cache *cache;
    assert_int_equal(sto_cache_new(64 << 10, &cache), ST_OK); /* small: constant eviction */
    sto_sst *t;
    assert_int_equal(sto_sst_open(f->env, f->path, 9, cache, &t, NULL), ST_OK);
    pthread_t th[4];
    reader r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (reader){.t = t, .es = es, .n = n, .seed = seed + (uint64_t)i};
        assert_int_equal(pthread_create(&th[i], NULL, read_all, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    sto_sst_unref(t);
    sto_cache_free(cache);
    free_entries(es, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sst_round_trip_random_compressible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_round_trip_random_incompressible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_round_trip_small_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_round_trip_big_values_dense_restarts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sst_index_search_with_shared_prefixes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sst_concat_iterator_over_disjoint_tables, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sst_compression_shrinks_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_empty_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_single_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_large_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_rejects_out_of_order_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_row_bloom_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_sampling_and_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_scan_iterator_does_not_fill_cache, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sst_obsolete_file_removed_at_last_unref, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sst_missing_and_short_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_write_failures_are_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_corruption_never_crashes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sst_concurrent_readers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
