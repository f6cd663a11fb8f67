/* bloom.c — a standard bloom filter with double hashing (see bloom.h). */
#include "bloom.h"

#include <stdlib.h>
#include <string.h>

void sto_bloom_builder_init(sto_bloom_builder *b, int bits_per_key) {
    memset(b, 0, sizeof(*b));
    b->bits_per_key = bits_per_key > 0 ? bits_per_key : 10;
}

void sto_bloom_builder_deinit(sto_bloom_builder *b) {
    free(b->hashes);
    memset(b, 0, sizeof(*b));
}

st_code sto_bloom_builder_add(sto_bloom_builder *b, st_slice key) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        uint64_t *h = realloc(b->hashes, cap * sizeof(*h));
        if (!h)
            return ST_RESOURCE_EXHAUSTED;
        b->hashes = h;
        b->cap = cap;
    }
    b->hashes[b->n++] = st_hash64(key.data, key.len, STO_BLOOM_SEED);
    return ST_OK;
}

/* Maps a 32-bit value onto [0, nbits) without a division (Lemire's multiply-shift). */
static inline uint32_t reduce(uint32_t x, uint32_t nbits) {
    return (uint32_t)(((uint64_t)x * nbits) >> 32);
}

static int probes_for(int bits_per_key) {
    int k = (int)(bits_per_key * 0.69); /* ln 2 minimises the false-positive rate */
    if (k < 1)
        k = 1;
    return k > STO_BLOOM_PROBES_MAX ? STO_BLOOM_PROBES_MAX : k;
}

st_code sto_bloom_builder_finish(sto_bloom_builder *b, st_buf *out) {
    uint64_t bits = (uint64_t)b->n * (uint64_t)b->bits_per_key;
    if (bits < 64)
        bits = 64; /* tiny filters have a high FP rate: spend a few bytes more */
    if (bits > STO_BLOOM_BITS_MAX)
        bits = STO_BLOOM_BITS_MAX;
    size_t nbytes = (size_t)((bits + 7) / 8);
    uint32_t nbits = (uint32_t)(nbytes * 8);
    int k = probes_for(b->bits_per_key);
    size_t start = out->len;
    if (st_buf_reserve(out, nbytes + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    uint8_t *arr = out->data + start;
    memset(arr, 0, nbytes);
    for (size_t i = 0; i < b->n; i++) {
        uint32_t h = (uint32_t)b->hashes[i], delta = (uint32_t)(b->hashes[i] >> 32) | 1u;
        for (int j = 0; j < k; j++) {
            uint32_t pos = reduce(h, nbits);
            arr[pos >> 3] |= (uint8_t)(1u << (pos & 7));
            h += delta;
        }
    }
    out->len = start + nbytes;
    st_buf_append_byte(out, (uint8_t)k);
    return ST_OK;
}

bool sto_bloom_valid(st_slice f) {
    if (f.len < 2 || f.len - 1 > STO_BLOOM_BITS_MAX / 8)
        return false;
    uint8_t k = f.data[f.len - 1];
    return k >= 1 && k <= STO_BLOOM_PROBES_MAX;
}

bool sto_bloom_may_contain(st_slice f, st_slice key) {
    if (!sto_bloom_valid(f))
        return true;
    uint32_t nbits = (uint32_t)((f.len - 1) * 8);
    int k = f.data[f.len - 1];
    uint64_t hv = st_hash64(key.data, key.len, STO_BLOOM_SEED);
    uint32_t h = (uint32_t)hv, delta = (uint32_t)(hv >> 32) | 1u;
    /* The probes land on unrelated cache lines of a filter far bigger than the CPU cache: load
     * them all at once (prefetch), then test, instead of paying one memory latency per probe. */
    uint32_t pos[STO_BLOOM_PROBES_MAX];
    for (int j = 0; j < k; j++) {
        pos[j] = reduce(h, nbits);
        __builtin_prefetch(&f.data[pos[j] >> 3]);
        h += delta;
    }
    for (int j = 0; j < k; j++) {
        if (!(f.data[pos[j] >> 3] & (1u << (pos[j] & 7))))
            return false;
    }
    return true;
}
