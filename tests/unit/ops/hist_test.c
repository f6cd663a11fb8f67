/*
 * Proves the bench's latency histogram reports percentiles a reader can trust: every value falls
 * inside its bucket, buckets tile the 64-bit range without gaps, a bucket is at most 1/64 of its
 * values wide (so a percentile is within 1.6%), small values are exact, and on random samples
 * each percentile is within that bound of the exact order statistic computed by sorting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

static void test_hist_buckets_tile_the_range(void **state) {
    (void)state;
    uint64_t prev_high = 0;
    for (uint32_t b = 0; b < OPS_HIST_BUCKETS; b++) {
        uint64_t low, high;
        ops_hist_bucket_range(b, &low, &high);
        if (b > 0)
            assert_true(low == prev_high + 1);
        assert_true(low <= high);
        assert_int_equal(ops_hist_bucket(low), b);
        assert_int_equal(ops_hist_bucket(high), b);
        /* Width at most 1/64 of the bucket's low end (exact below 128). */
        if (low >= 128)
            assert_true((high - low + 1) * 64 <= low);
        prev_high = high;
    }
    assert_true(prev_high == UINT64_MAX);
}

static void test_hist_value_in_its_bucket(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_hist_value_in_its_bucket"));
    for (int i = 0; i < 100000; i++) {
        uint64_t v = st_rng_next(&rng) >> st_rng_below(&rng, 64);
        uint64_t low, high;
        ops_hist_bucket_range(ops_hist_bucket(v), &low, &high);
        assert_true(low <= v && v <= high);
    }
}

static void test_hist_small_values_exact(void **state) {
    (void)state;
    ops_hist h;
    ops_hist_init(&h);
    assert_int_equal(ops_hist_percentile(&h, 50), 0);
    for (uint64_t v = 1; v <= 100; v++)
        ops_hist_record(&h, v);
    assert_int_equal(h.total, 100);
    assert_int_equal(h.min, 1);
    assert_int_equal(h.max, 100);
    assert_int_equal(ops_hist_percentile(&h, 50), 50);
    assert_int_equal(ops_hist_percentile(&h, 90), 90);
    assert_int_equal(ops_hist_percentile(&h, 99), 99);
    assert_int_equal(ops_hist_percentile(&h, 99.9), 100);
    assert_int_equal(ops_hist_percentile(&h, 100), 100);
    assert_int_equal(ops_hist_percentile(&h, 0.001), 1);
    assert_true(ops_hist_mean(&h) > 50.49 && ops_hist_mean(&h) < 50.51);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The exact order statistic for pct: the ceil(pct% * n)-th smallest. */
static uint64_t exact_pct(const uint64_t *sorted, size_t n, double pct) {
    double want = pct / 100.0 * (double)n;
    size_t k = (size_t)want;
    if ((double)k < want)
        k++;
    if (k < 1)
        k = 1;
    return sorted[k - 1];
}

static void test_hist_percentiles_match_sorting(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_hist_percentiles_match_sorting"));
    enum { N = 200000 };
    uint64_t *vals = malloc(N * sizeof(*vals));
    assert_non_null(vals);
    ops_hist a, b, all;
    ops_hist_init(&a);
    ops_hist_init(&b);
    ops_hist_init(&all);
    for (size_t i = 0; i < N; i++) {
        /* Latency-like: mostly 50us..1ms in ns, with a long tail. */
        uint64_t v = 50000 + st_rng_below(&rng, 950000);
        if (st_rng_below(&rng, 100) == 0)
            v *= 1 + st_rng_below(&rng, 100);
        vals[i] = v;
        ops_hist_record(i % 2 ? &a : &b, v);
        ops_hist_record(&all, v);
    }
    ops_hist_merge(&a, &b);
    assert_int_equal(a.total, N);
    assert_memory_equal(a.counts, all.counts, sizeof(a.counts));
    qsort(vals, N, sizeof(*vals), cmp_u64);
    static const double pcts[] = {1, 10, 50, 90, 99, 99.9, 99.99, 100};
    for (size_t i = 0; i < sizeof(pcts) / sizeof(pcts[0]); i++) {
        uint64_t want = exact_pct(vals, N, pcts[i]);
        uint64_t got = ops_hist_percentile(&a, pcts[i]);
        /* Reported as the bucket's top: never below the truth, at most 1/64 above. */
        assert_true(got >= want);
        assert_true((got - want) * 64 <= want);
    }
    assert_true(a.min == vals[0] && a.max == vals[N - 1]);
    free(vals);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hist_buckets_tile_the_range),
        cmocka_unit_test(test_hist_value_in_its_bucket),
        cmocka_unit_test(test_hist_small_values_exact),
        cmocka_unit_test(test_hist_percentiles_match_sorting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
