/* ops/hist.c — the bench's latency histogram: log-linear buckets (exact below 128, then 64
 * buckets per power of two), fixed size, so recording is a shift and an increment. */
#include <string.h>

#include "bench.h"

_Static_assert(OPS_HIST_BUCKETS == 3776, "bucket count for 64-bit values with 7 sub-bits");

void ops_hist_init(ops_hist *h) {
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

uint32_t ops_hist_bucket(uint64_t v) {
    if (v < 2u * OPS_HIST_HALF)
        return (uint32_t)v;
    uint32_t msb = 63u - (uint32_t)__builtin_clzll(v);
    uint32_t shift = msb - (OPS_HIST_SUB_BITS - 1); /* >= 1 */
    uint32_t mant = (uint32_t)(v >> shift);         /* in [HALF, 2*HALF) */
    return shift * OPS_HIST_HALF + mant;
}

void ops_hist_bucket_range(uint32_t b, uint64_t *low, uint64_t *high) {
    if (b < 2u * OPS_HIST_HALF) {
        *low = *high = b;
        return;
    }
    uint32_t shift = b / OPS_HIST_HALF - 1;
    uint64_t mant = b % OPS_HIST_HALF + OPS_HIST_HALF;
    *low = mant << shift;
    *high = ((mant + 1) << shift) - 1;
}

void ops_hist_record(ops_hist *h, uint64_t v) {
    h->counts[ops_hist_bucket(v)]++;
    h->total++;
    h->sum += (double)v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

void ops_hist_merge(ops_hist *dst, const ops_hist *src) {
    if (src->total == 0)
        return;
    for (uint32_t i = 0; i < OPS_HIST_BUCKETS; i++)
        dst->counts[i] += src->counts[i];
    dst->total += src->total;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t ops_hist_percentile(const ops_hist *h, double pct) {
    if (h->total == 0)
        return 0;
    if (pct >= 100.0)
        return h->max;
    /* The rank of the wanted value, 1-based: ceil(pct% of total), at least 1. */
    double want_d = pct / 100.0 * (double)h->total;
    uint64_t want = (uint64_t)want_d;
    if ((double)want < want_d)
        want++;
    if (want < 1)
        want = 1;
    uint64_t seen = 0;
    for (uint32_t b = 0; b < OPS_HIST_BUCKETS; b++) {
        seen += h->counts[b];
        if (seen >= want) {
            uint64_t low, high;
            ops_hist_bucket_range(b, &low, &high);
            if (high > h->max)
                high = h->max;
            if (high < h->min)
                high = h->min;
            return high;
        }
    }
    return h->max;
}

double ops_hist_mean(const ops_hist *h) {
    return h->total ? h->sum / (double)h->total : 0.0;
}
