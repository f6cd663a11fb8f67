/*
 * Proves the bloom filter has no false negatives and a false-positive rate near theory (~1% at
 * 10 bits per key): for random keys, for keys that differ from the added ones only in their last
 * byte (where LevelDB's 32-bit hash is weak), and for enc(row) prefixes as the SSTable adds them.
 * Also proves that malformed filters are detected and answer "maybe" rather than crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bloom.h"

#define N_KEYS 100000
#define KEY_BYTES 16

static void build(sto_bloom_builder *b, const uint8_t *keys, size_t n, size_t klen, st_buf *out) {
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sto_bloom_builder_add(b, st_slice_make(keys + i * klen, klen)), ST_OK);
    assert_int_equal(sto_bloom_builder_finish(b, out), ST_OK);
    assert_true(sto_bloom_valid(st_buf_slice(out)));
}

static void test_bloom_no_false_negatives_and_low_fp(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_bloom_no_false_negatives_and_low_fp"));
    uint8_t *keys = malloc((size_t)N_KEYS * KEY_BYTES);
    for (size_t i = 0; i < (size_t)N_KEYS * KEY_BYTES; i++)
        keys[i] = (uint8_t)st_rng_next(&rng);
    sto_bloom_builder b;
    sto_bloom_builder_init(&b, 10);
    st_buf f;
    st_buf_init(&f);
    build(&b, keys, N_KEYS, KEY_BYTES, &f);
    for (size_t i = 0; i < N_KEYS; i++)
        assert_true(sto_bloom_may_contain(st_buf_slice(&f),
                                          st_slice_make(keys + i * KEY_BYTES, KEY_BYTES)));
    /* Probes differing from a present key only in the last byte. */
    size_t fp_last = 0, fp_rand = 0;
    uint8_t probe[KEY_BYTES];
    for (size_t i = 0; i < N_KEYS; i++) {
        memcpy(probe, keys + i * KEY_BYTES, KEY_BYTES);
        probe[KEY_BYTES - 1] ^= (uint8_t)(1 + (i % 255));
        fp_last += sto_bloom_may_contain(st_buf_slice(&f), st_slice_make(probe, KEY_BYTES));
        for (size_t j = 0; j < KEY_BYTES; j++)
            probe[j] = (uint8_t)st_rng_next(&rng);
        fp_rand += sto_bloom_may_contain(st_buf_slice(&f), st_slice_make(probe, KEY_BYTES));
    }
    fprintf(stderr, "bloom fp: last-byte %.3f%% random %.3f%% (%zu bytes)\n",
            100.0 * (double)fp_last / N_KEYS, 100.0 * (double)fp_rand / N_KEYS, f.len);
    assert_true(fp_last < N_KEYS / 50); /* < 2% */
    assert_true(fp_rand < N_KEYS / 50);
    st_buf_free(&f);
    sto_bloom_builder_deinit(&b);
    free(keys);
}

/* Sequential row keys encoded as enc(row) = row 0x00 0x01, differing only near the end. */
static void test_bloom_sequential_row_prefixes(void **state) {
    (void)state;
    enum { N = 50000, L = 16 };
    uint8_t *keys = malloc((size_t)N * L);
    for (size_t i = 0; i < N; i++) { /* "user0000000000" + 2 * i, then enc()'s terminator */
        snprintf((char *)keys + i * L, L, "user%010zu", 2 * i);
        keys[i * L + 14] = 0;
        keys[i * L + 15] = 1;
    }
    sto_bloom_builder b;
    sto_bloom_builder_init(&b, 10);
    st_buf f;
    st_buf_init(&f);
    build(&b, keys, N, L, &f);
    size_t fp = 0;
    uint8_t probe[L];
    for (size_t i = 0; i < N; i++) {
        assert_true(sto_bloom_may_contain(st_buf_slice(&f), st_slice_make(keys + i * L, L)));
        snprintf((char *)probe, L, "user%010zu", 2 * i + 1);
        probe[14] = 0;
        probe[15] = 1;
        fp += sto_bloom_may_contain(st_buf_slice(&f), st_slice_make(probe, L));
    }
    fprintf(stderr, "bloom fp sequential: %.3f%%\n", 100.0 * (double)fp / N);
    assert_true(fp < N / 50);
    st_buf_free(&f);
    sto_bloom_builder_deinit(&b);
    free(keys);
}

static void test_bloom_empty_and_tiny(void **state) {
    (void)state;
    sto_bloom_builder b;
    sto_bloom_builder_init(&b, 10);
    st_buf f;
    st_buf_init(&f);
    assert_int_equal(sto_bloom_builder_finish(&b, &f), ST_OK);
    assert_true(sto_bloom_valid(st_buf_slice(&f)));
    size_t hits = 0;
    char k[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        hits += sto_bloom_may_contain(st_buf_slice(&f), st_slice_cstr(k));
    }
    assert_int_equal(hits, 0); /* an empty filter rejects everything */
    st_buf_reset(&f);
    assert_int_equal(sto_bloom_builder_add(&b, ST_SLICE_LIT("one")), ST_OK);
    assert_int_equal(sto_bloom_builder_finish(&b, &f), ST_OK);
    assert_true(sto_bloom_may_contain(st_buf_slice(&f), ST_SLICE_LIT("one")));
    st_buf_free(&f);
    sto_bloom_builder_deinit(&b);
}

static void test_bloom_malformed_says_maybe(void **state) {
    (void)state;
    uint8_t bad_k[9] = {0};
    bad_k[8] = 0; /* zero probes */
    assert_false(sto_bloom_valid(st_slice_make(bad_k, sizeof(bad_k))));
    assert_true(sto_bloom_may_contain(st_slice_make(bad_k, sizeof(bad_k)), ST_SLICE_LIT("x")));
    bad_k[8] = 200; /* too many probes */
    assert_false(sto_bloom_valid(st_slice_make(bad_k, sizeof(bad_k))));
    assert_false(sto_bloom_valid(st_slice_make(bad_k, 1)));
    assert_true(sto_bloom_may_contain(st_slice_make(NULL, 0), ST_SLICE_LIT("x")));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bloom_no_false_negatives_and_low_fp),
        cmocka_unit_test(test_bloom_sequential_row_prefixes),
        cmocka_unit_test(test_bloom_empty_and_tiny),
        cmocka_unit_test(test_bloom_malformed_says_maybe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
