/* bloom.h — the SSTable bloom filter over row keys (private to the SSTable module; format:
 * docs/formats/sstable.md).
 *
 * A filter is a bit array followed by one byte: the number of probes k. Each key is hashed once
 * with st_hash64 (which mixes every input byte into every output bit, so keys that differ only
 * in their last byte still get unrelated bit positions — LevelDB's 32-bit hash is weak there) and
 * the k bit positions are derived by double hashing from the two 32-bit halves. */
#ifndef STO_BLOOM_H
#define STO_BLOOM_H

#include "strata/base.h"

#define STO_BLOOM_SEED 0x5354524154414246ull /* "STRATABF" */
#define STO_BLOOM_PROBES_MAX 30
/* A filter has at most this many bits, so its block stays under STO_BLOCK_BYTES_MAX (128 MiB):
 * ~107 M rows at 10 bits/key; bigger tables get a denser (less selective) filter. */
#define STO_BLOOM_BITS_MAX ((1u << 30) - 64)

typedef struct sto_bloom_builder {
    uint64_t *hashes;
    size_t n, cap;
    int bits_per_key;
} sto_bloom_builder;

void sto_bloom_builder_init(sto_bloom_builder *b, int bits_per_key); /* <= 0: 10 */
void sto_bloom_builder_deinit(sto_bloom_builder *b);
st_code sto_bloom_builder_add(sto_bloom_builder *b, st_slice key); /* ST_RESOURCE_EXHAUSTED */
/* Appends the filter for every key added so far to out. */
st_code sto_bloom_builder_finish(sto_bloom_builder *b, st_buf *out);

/* True when the filter is well formed (checked once when a table opens). */
bool sto_bloom_valid(st_slice filter);
/* False only when key was certainly not added. A malformed or empty filter says true. */
bool sto_bloom_may_contain(st_slice filter, st_slice key);

#endif
