/* ops/keydist.c — row keys and the key distributions of `strata bench`: uniform, sequential,
 * and YCSB's (scrambled) zipfian, ported from YCSB's ZipfianGenerator and
 * ScrambledZipfianGenerator so "zipfian" means the same skew as in published YCSB numbers. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

double ops_rng_double(st_rng *rng) {
    return (double)(st_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

double ops_zeta(uint64_t n, double theta) {
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += 1.0 / pow((double)(i + 1), theta);
    return sum;
}

void ops_zipf_init(ops_zipf *z, uint64_t items, double theta, double zetan) {
    ST_ASSERT(items > 0 && theta > 0 && theta < 1);
    z->items = items;
    z->theta = theta;
    z->zeta2 = ops_zeta(2, theta);
    z->alpha = 1.0 / (1.0 - theta);
    z->zetan = zetan > 0 ? zetan : ops_zeta(items, theta);
    z->eta = (1 - pow(2.0 / (double)items, 1 - theta)) / (1 - z->zeta2 / z->zetan);
}

/* YCSB ZipfianGenerator.nextLong: the first two ranks exactly, the rest by Gray's inversion. */
uint64_t ops_zipf_next(const ops_zipf *z, double u) {
    double uz = u * z->zetan;
    if (uz < 1.0)
        return 0;
    if (uz < 1.0 + pow(0.5, z->theta))
        return z->items > 1 ? 1 : 0;
    double r = (double)z->items * pow(z->eta * u - z->eta + 1, z->alpha);
    uint64_t ret = r >= (double)z->items ? z->items - 1 : (uint64_t)r;
    return ret;
}

uint64_t ops_fnv64(uint64_t v) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int i = 0; i < 8; i++) {
        h ^= v & 0xff;
        v >>= 8;
        h *= 1099511628211ull;
    }
    /* Java's Math.abs on the signed value; Long.MIN_VALUE stays as is there (and is never
     * reduced differently by the caller's modulo of a positive count). */
    int64_t s = (int64_t)h;
    return s < 0 && s != INT64_MIN ? (uint64_t)(-s) : (uint64_t)s;
}

void ops_keygen_init(ops_keygen *g, ops_dist dist, uint64_t n) {
    ST_ASSERT(n > 0);
    g->dist = dist;
    g->n = n;
    g->next = 0;
    if (dist == OPS_DIST_ZIPFIAN)
        ops_zipf_init(&g->zipf, OPS_ZIPF_SCRAMBLED_ITEMS, OPS_ZIPF_THETA, OPS_ZIPF_SCRAMBLED_ZETAN);
}

uint64_t ops_keygen_next(ops_keygen *g, st_rng *rng) {
    switch (g->dist) {
    case OPS_DIST_SEQUENTIAL: {
        uint64_t k = g->next;
        g->next = g->next + 1 >= g->n ? 0 : g->next + 1;
        return k;
    }
    case OPS_DIST_ZIPFIAN:
        return ops_fnv64(ops_zipf_next(&g->zipf, ops_rng_double(rng))) % g->n;
    case OPS_DIST_UNIFORM:
        break;
    }
    return st_rng_below(rng, g->n);
}

size_t ops_key_format(char out[OPS_KEY_BYTES + 1], uint64_t index) {
    ST_ASSERT(index <= OPS_KEY_INDEX_MAX);
    /* "user%012llu" by hand: the verifier formats one key per row it checks, and snprintf was
     * a tenth of the bench's own CPU (it shares the cores with the servers it measures). */
    memcpy(out, "user", 4);
    for (int i = OPS_KEY_BYTES - 1; i >= 4; i--) {
        out[i] = (char)('0' + index % 10);
        index /= 10;
    }
    out[OPS_KEY_BYTES] = '\0';
    return OPS_KEY_BYTES;
}
