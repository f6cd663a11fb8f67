/*
 * Proves that SSTable blocks round-trip: entries built with prefix compression and restart points
 * come back identical through seal/unseal (compressed and not) and parse, and the block iterator
 * agrees with a sorted array on seek (hits, misses, before and after every key), next, prev
 * across restart boundaries, seek_first and seek_last. Also proves that a damaged block (flipped
 * checksum, bad restart array, truncated entries) is reported as ST_DATA_LOSS.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zstd.h>

#include "block.h"

#define N_KEYS 1000

typedef struct kv {
    char key[32];
    char val[64];
} kv;

/* Keys share long prefixes ("key-000123-...") so prefix compression has work to do. */
static void make_kvs(kv *kvs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        snprintf(kvs[i].key, sizeof(kvs[i].key), "key-%06zu-%s", i * 2, (i % 3) ? "x" : "yy");
        snprintf(kvs[i].val, sizeof(kvs[i].val), "value-%zu-%0*d", i, (int)(i % 40), 0);
    }
}

static st_slice ks(const kv *e) {
    return st_slice_cstr(e->key);
}
static st_slice vs(const kv *e) {
    return st_slice_cstr(e->val);
}

/* Builds, seals (with zstd when level > 0), unseals and parses a block of kvs. */
static uint8_t *build_block(const kv *kvs, size_t n, int interval, int level, sto_block *b,
                            uint8_t **owned) {
    sto_block_builder bb;
    sto_block_builder_init(&bb, interval);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sto_block_builder_add(&bb, ks(&kvs[i]), vs(&kvs[i])), ST_OK);
    st_slice contents;
    size_t estimate = sto_block_builder_size(&bb);
    assert_int_equal(sto_block_builder_finish(&bb, &contents), ST_OK);
    assert_int_equal(contents.len, estimate);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    st_buf sealed;
    st_buf_init(&sealed);
    assert_int_equal(sto_block_seal(contents, cctx, level, &sealed, NULL), ST_OK);
    if (level > 0 && n > 10)
        assert_int_equal(sealed.data[sealed.len - 5], STO_BLOCK_ZSTD);
    st_slice c;
    st_err err;
    assert_int_equal(sto_block_unseal(sealed.data, sealed.len, dctx, 0, &c, owned, &err), ST_OK);
    assert_int_equal(c.len, contents.len);
    assert_memory_equal(c.data, contents.data, c.len);
    assert_int_equal(sto_block_parse(c, b, &err), ST_OK);
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
    sto_block_builder_deinit(&bb);
    return sealed.data; /* keeps c alive for uncompressed blocks */
}

static void assert_at(sto_block_iter *it, const kv *e) {
    assert_true(sto_block_iter_valid(it));
    assert_true(st_slice_eq(sto_block_iter_key(it), ks(e)));
    assert_true(st_slice_eq(it->value, vs(e)));
}

static void check_iteration(const sto_block *b, const kv *kvs, size_t n) {
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, b);
    size_t i = 0;
    for (sto_block_iter_seek_first(&it); sto_block_iter_valid(&it); sto_block_iter_next(&it))
        assert_at(&it, &kvs[i++]);
    assert_int_equal(i, n);
    for (sto_block_iter_seek_last(&it); sto_block_iter_valid(&it); sto_block_iter_prev(&it))
        assert_at(&it, &kvs[--i]);
    assert_int_equal(i, 0);
    assert_int_equal(it.status, ST_OK);
    char probe[40];
    for (size_t j = 0; j < n; j++) {
        sto_block_iter_seek(&it, ks(&kvs[j])); /* exact hit */
        assert_at(&it, &kvs[j]);
        /* prev then next crosses restart boundaries for j % interval == 0 */
        sto_block_iter_prev(&it);
        if (j == 0) {
            assert_false(sto_block_iter_valid(&it));
        } else {
            assert_at(&it, &kvs[j - 1]);
            sto_block_iter_next(&it);
            assert_at(&it, &kvs[j]);
        }
        /* a key just before kvs[j] ("key-000010-" < "key-000010-x") lands on kvs[j] */
        snprintf(probe, sizeof(probe), "key-%06zu-", j * 2);
        sto_block_iter_seek(&it, st_slice_cstr(probe));
        assert_at(&it, &kvs[j]);
        /* an odd number sits between two keys: lands on the next one or the end */
        snprintf(probe, sizeof(probe), "key-%06zu", j * 2 + 1);
        sto_block_iter_seek(&it, st_slice_cstr(probe));
        if (j + 1 < n)
            assert_at(&it, &kvs[j + 1]);
        else
            assert_false(sto_block_iter_valid(&it));
    }
    sto_block_iter_seek(&it, ST_SLICE_LIT("a"));
    if (n)
        assert_at(&it, &kvs[0]);
    sto_block_iter_seek(&it, ST_SLICE_LIT("z"));
    assert_false(sto_block_iter_valid(&it));
    assert_int_equal(it.status, ST_OK);
    sto_block_iter_deinit(&it);
}

static void round_trip(int interval, int level, size_t n) {
    kv *kvs = calloc(N_KEYS, sizeof(*kvs));
    make_kvs(kvs, N_KEYS);
    sto_block b;
    uint8_t *owned = NULL;
    uint8_t *sealed = build_block(kvs, n, interval, level, &b, &owned);
    check_iteration(&b, kvs, n);
    free(owned);
    free(sealed);
    free(kvs);
}

static void test_block_round_trip_uncompressed(void **state) {
    (void)state;
    round_trip(16, 0, N_KEYS);
}

static void test_block_round_trip_zstd(void **state) {
    (void)state;
    round_trip(16, 1, N_KEYS);
}

static void test_block_restart_intervals(void **state) {
    (void)state;
    int intervals[] = {1, 2, 3, 16, 1000};
    size_t sizes[] = {1, 2, 15, 16, 17, 33, 200};
    for (size_t i = 0; i < sizeof(intervals) / sizeof(intervals[0]); i++)
        for (size_t j = 0; j < sizeof(sizes) / sizeof(sizes[0]); j++)
            round_trip(intervals[i], i % 2, sizes[j]);
}

static void test_block_prefix_compression_saves_space(void **state) {
    (void)state;
    kv *kvs = calloc(N_KEYS, sizeof(*kvs));
    make_kvs(kvs, N_KEYS);
    sto_block_builder a, b;
    sto_block_builder_init(&a, 1);
    sto_block_builder_init(&b, 16);
    for (size_t i = 0; i < N_KEYS; i++) {
        assert_int_equal(sto_block_builder_add(&a, ks(&kvs[i]), vs(&kvs[i])), ST_OK);
        assert_int_equal(sto_block_builder_add(&b, ks(&kvs[i]), vs(&kvs[i])), ST_OK);
    }
    /* Keys are ~13 bytes sharing ~7: interval 16 stores far fewer key bytes. */
    assert_true(sto_block_builder_size(&b) + 4 * N_KEYS < sto_block_builder_size(&a));
    sto_block_builder_deinit(&a);
    sto_block_builder_deinit(&b);
    free(kvs);
}

static void test_block_empty(void **state) {
    (void)state;
    sto_block_builder bb;
    sto_block_builder_init(&bb, 16);
    assert_true(sto_block_builder_empty(&bb));
    st_slice c;
    assert_int_equal(sto_block_builder_finish(&bb, &c), ST_OK);
    sto_block b;
    assert_int_equal(sto_block_parse(c, &b, NULL), ST_OK);
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &b);
    sto_block_iter_seek_first(&it);
    assert_false(sto_block_iter_valid(&it));
    sto_block_iter_seek_last(&it);
    assert_false(sto_block_iter_valid(&it));
    sto_block_iter_seek(&it, ST_SLICE_LIT("k"));
    assert_false(sto_block_iter_valid(&it));
    assert_int_equal(it.status, ST_OK);
    sto_block_iter_deinit(&it);
    sto_block_builder_deinit(&bb);
}

static void test_block_corrupt_checksum_and_type(void **state) {
    (void)state;
    sto_block_builder bb;
    sto_block_builder_init(&bb, 16);
    assert_int_equal(sto_block_builder_add(&bb, ST_SLICE_LIT("a"), ST_SLICE_LIT("1")), ST_OK);
    st_slice c;
    assert_int_equal(sto_block_builder_finish(&bb, &c), ST_OK);
    st_buf sealed;
    st_buf_init(&sealed);
    assert_int_equal(sto_block_seal(c, NULL, 0, &sealed, NULL), ST_OK);
    st_err err;
    uint8_t *owned;
    st_slice out;
    for (size_t i = 0; i < sealed.len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            sealed.data[i] ^= (uint8_t)(1u << bit);
            assert_int_equal(sto_block_unseal(sealed.data, sealed.len, NULL, 0, &out, &owned, &err),
                             ST_DATA_LOSS);
            sealed.data[i] ^= (uint8_t)(1u << bit);
        }
    }
    assert_int_equal(sto_block_unseal(sealed.data, 3, NULL, 0, &out, &owned, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "trailer"));
    st_buf_free(&sealed);
    sto_block_builder_deinit(&bb);
}

static void test_block_malformed_contents(void **state) {
    (void)state;
    st_err err;
    sto_block b;
    uint8_t bad1[] = {1, 2, 3};                                   /* too short */
    uint8_t bad2[] = {0, 0, 0, 0, 9, 0, 0, 0};                    /* restart count too big */
    uint8_t bad3[] = {0, 1, 1, 'k', 'v', 7, 0, 0, 0, 1, 0, 0, 0}; /* restart past entries */
    assert_int_equal(sto_block_parse(st_slice_make(bad1, 3), &b, &err), ST_DATA_LOSS);
    assert_int_equal(sto_block_parse(st_slice_make(bad2, 8), &b, &err), ST_DATA_LOSS);
    assert_int_equal(sto_block_parse(st_slice_make(bad3, sizeof(bad3)), &b, &err), ST_DATA_LOSS);
    /* Parses, but the entry claims a value running past the entries. */
    uint8_t bad4[] = {0, 1, 9, 'k', 'v', 0, 0, 0, 0, 1, 0, 0, 0};
    assert_int_equal(sto_block_parse(st_slice_make(bad4, sizeof(bad4)), &b, &err), ST_OK);
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &b);
    sto_block_iter_seek_first(&it);
    assert_false(sto_block_iter_valid(&it));
    assert_int_equal(it.status, ST_DATA_LOSS);
    sto_block_iter_seek(&it, ST_SLICE_LIT("k"));
    assert_int_equal(it.status, ST_DATA_LOSS);
    /* shared > 0 at a restart point is malformed too */
    uint8_t bad5[] = {3, 1, 1, 'k', 'v', 0, 0, 0, 0, 1, 0, 0, 0};
    assert_int_equal(sto_block_parse(st_slice_make(bad5, sizeof(bad5)), &b, &err), ST_OK);
    sto_block_iter_set(&it, &b);
    sto_block_iter_seek_first(&it);
    assert_int_equal(it.status, ST_DATA_LOSS);
    sto_block_iter_deinit(&it);
}

/* Random bytes under a valid restart array: the iterator may find garbage entries but must
 * stay in bounds (run under ASan) and end either at the end or with ST_DATA_LOSS. */
static void test_block_random_garbage_is_safe(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_block_random_garbage_is_safe"));
    uint8_t buf[300];
    for (int round = 0; round < 2000; round++) {
        size_t len = 4 + st_rng_below(&rng, sizeof(buf) - 4);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)st_rng_next(&rng);
        st_put_fixed32(buf + len - 4, (uint32_t)(1 + st_rng_below(&rng, 3)));
        sto_block b;
        if (sto_block_parse(st_slice_make(buf, len), &b, NULL) != ST_OK)
            continue;
        sto_block_iter it;
        sto_block_iter_init(&it);
        sto_block_iter_set(&it, &b);
        /* Entries take at least 3 bytes, so a walk that has not ended within the block's length
         * in steps is looping. */
        int steps = 0;
        for (sto_block_iter_seek_first(&it); sto_block_iter_valid(&it) && steps < 1000; steps++)
            sto_block_iter_next(&it);
        assert_true(steps < (int)len);
        assert_true(it.status == ST_OK || it.status == ST_DATA_LOSS);
        steps = 0;
        for (sto_block_iter_seek_last(&it); sto_block_iter_valid(&it) && steps < 1000; steps++)
            sto_block_iter_prev(&it);
        assert_true(steps < (int)len);
        assert_true(it.status == ST_OK || it.status == ST_DATA_LOSS);
        sto_block_iter_seek(&it, st_slice_make(buf, 5));
        assert_true(it.status == ST_OK || it.status == ST_DATA_LOSS);
        assert_true(sto_block_iter_valid(&it) == (it.status == ST_OK && it.b && it.key.len > 0) ||
                    !sto_block_iter_valid(&it));
        sto_block_iter_deinit(&it);
    }
}

static void test_block_incompressible_stays_raw(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, 42);
    uint8_t data[4096];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)st_rng_next(&rng);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    st_buf sealed;
    st_buf_init(&sealed);
    assert_int_equal(sto_block_seal(st_slice_make(data, sizeof(data)), cctx, 3, &sealed, NULL),
                     ST_OK);
    assert_int_equal(sealed.len, sizeof(data) + STO_BLOCK_TRAILER_BYTES);
    assert_int_equal(sealed.data[sizeof(data)], STO_BLOCK_NONE);
    st_buf_free(&sealed);
    ZSTD_freeCCtx(cctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_round_trip_uncompressed),
        cmocka_unit_test(test_block_round_trip_zstd),
        cmocka_unit_test(test_block_restart_intervals),
        cmocka_unit_test(test_block_prefix_compression_saves_space),
        cmocka_unit_test(test_block_empty),
        cmocka_unit_test(test_block_corrupt_checksum_and_type),
        cmocka_unit_test(test_block_malformed_contents),
        cmocka_unit_test(test_block_random_garbage_is_safe),
        cmocka_unit_test(test_block_incompressible_stays_raw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
