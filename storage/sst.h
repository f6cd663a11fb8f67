/* sst.h — immutable sorted tables, their blocks, bloom filter and the block cache (private to
 * storage/; format: docs/formats/sstable.md).
 *
 * An SSTable is data blocks (restart-point prefix compression, zstd when it saves space, each with
 * a crc32c trailer), a bloom filter over row keys (the enc(row) prefix of each ikey), an index
 * block (last ikey of each data block -> offset, size), and a fixed-size footer with the offsets,
 * entry count, smallest/largest ikey lengths, a magic number and a checksum. Every read checks
 * checksums; a mismatch or a malformed block is ST_DATA_LOSS, never a crash. */
#ifndef STO_SST_H
#define STO_SST_H

#include "kviter.h"
#include "strata/env.h"

typedef struct sto_cache sto_cache;
typedef struct sto_sst_writer sto_sst_writer;
typedef struct sto_sst sto_sst;

/* A sharded LRU of decompressed blocks, bounded by capacity_bytes (charged by block size). */
st_code sto_cache_new(size_t capacity_bytes, sto_cache **out);
void sto_cache_free(sto_cache *c);
void sto_cache_stats(sto_cache *c, uint64_t *bytes, uint64_t *hits, uint64_t *misses);
/* Data blocks the tables sharing c read from disk (each checked and, when stored compressed,
 * decompressed) and their uncompressed bytes: what reads cost beyond the cache. */
void sto_cache_read_stats(sto_cache *c, uint64_t *blocks, uint64_t *bytes);

/* zstd's fast level -3: on 4 KiB blocks of 2:1-compressible values it compressed in ~5 us
 * against ~8 us at level 1 (flushes and compactions spend a quarter of their CPU here),
 * decompressed as fast, and stored ~3% more bytes. */
#define STO_SST_ZSTD_LEVEL_DEFAULT (-3)

typedef struct sto_sst_options {
    size_t block_bytes;     /* target uncompressed data block size; 0 = 16 KiB */
    int bloom_bits_per_key; /* <= 0: 10 (~1% false positives) */
    int zstd_level; /* 0 = STO_SST_ZSTD_LEVEL_DEFAULT; STO_BLOCK_ZSTD_NONE (block.h): none */
} sto_sst_options;

/* Writes a new table at path; keys must be added in strictly increasing memcmp order. */
st_code sto_sst_writer_new(st_env *env, const char *path, const sto_sst_options *o,
                           sto_sst_writer **out, st_err *err);
st_code sto_sst_writer_add(sto_sst_writer *w, st_slice ikey, st_slice value, st_err *err);
uint64_t sto_sst_writer_bytes(sto_sst_writer *w); /* estimated file size so far */
/* Writes index, filter and footer, syncs and closes; frees w in every case. */
st_code sto_sst_writer_finish(sto_sst_writer *w, uint64_t *file_bytes, st_err *err);
void sto_sst_writer_abandon(sto_sst_writer *w); /* closes and removes the partial file */

/* Opens a table; id must be unique per process lifetime (it keys the cache). Refcounted. */
st_code sto_sst_open(st_env *env, const char *path, uint64_t id, sto_cache *cache, sto_sst **out,
                     st_err *err);
void sto_sst_ref(sto_sst *t);
void sto_sst_unref(sto_sst *t); /* closes at zero */
/* When set, the file is removed when the last reference goes (obsolete after compaction). */
void sto_sst_mark_obsolete(sto_sst *t);

uint64_t sto_sst_file_bytes(const sto_sst *t);
/* Memory the open table keeps outside the block cache (its index, filter and meta blocks), so
 * the db can report it. Added by the SSTable module. */
size_t sto_sst_memory_bytes(const sto_sst *t);
uint64_t sto_sst_entries(const sto_sst *t);
st_slice sto_sst_smallest(const sto_sst *t); /* ikeys; valid while t lives */
st_slice sto_sst_largest(const sto_sst *t);
/* False when the bloom filter proves row_prefix (enc(row), key.h) absent. */
bool sto_sst_may_contain_row(sto_sst *t, st_slice row_prefix);
/* Approximate byte offset of the first entry >= ikey (SampleRowKeys, split points). */
uint64_t sto_sst_approx_offset(sto_sst *t, st_slice ikey);
/* Calls fn with the last key of each data block and its end offset (sampling). */
void sto_sst_for_each_block(sto_sst *t,
                            void (*fn)(st_slice last_ikey, uint64_t end_offset, void *arg),
                            void *arg);

/* Reads every data block of t and checks what opening and reading do not: every entry's ikey is
 * well formed (key.h) and greater than the one before it, each block ends with the key its index
 * entry names, the footer's entry count and the meta block's smallest and largest keys match the
 * data, and no entry's version is above version_max. For files made elsewhere, before a tablet
 * lists them (sto_backup_file_verify), and for files no tablet lists at open (newest, when not
 * NULL, gets the highest version of any entry). ST_DATA_LOSS saying what was wrong and where; an
 * I/O error is the env's code. Format: docs/formats/sstable.md. */
st_code sto_sst_verify(sto_sst *t, uint64_t version_max, uint64_t *newest, st_err *err);

/* What the iterators of one read share (a tablet snapshot embeds one): the last data block they
 * read that the block cache did not keep, and how much they read from disk.
 *
 * A block larger than a cache shard is not cached (it would evict the whole shard, then itself).
 * Without this slot, a read that seeks into such a block again and again (a ReadRows of many
 * empty ranges, each landing just before a row with a 100 MiB value) would read and decompress
 * the whole block on every seek. An iterator that lets go of an uncached block leaves it here; the
 * next iterator of the same read that needs that block takes it back instead of reading it. At
 * most one block is held, until the next one replaces it or sto_sst_keep_deinit. Thread-safe
 * (the slot is an atomic pointer); fields private to sst_keep.c. */
typedef struct sto_sst_keep {
    _Atomic(void *) slot;    /* the kept block's cache handle (private, not cached) */
    _Atomic(uint64_t) bytes; /* uncompressed bytes of the data blocks read from disk */
} sto_sst_keep;
void sto_sst_keep_init(sto_sst_keep *k);
void sto_sst_keep_deinit(sto_sst_keep *k); /* frees the kept block */
uint64_t sto_sst_keep_bytes_read(sto_sst_keep *k);

/* An iterator over the table (holds a reference on t); NULL when memory runs out. Data blocks
 * are read through the cache given to sto_sst_open (NULL cache: read and dropped per block). */
sto_kviter *sto_sst_iter_new(sto_sst *t);
/* The same, sharing blocks the cache does not keep through k (may be NULL = none), which must
 * outlive the iterator. */
sto_kviter *sto_sst_iter_new_kept(sto_sst *t, sto_sst_keep *k);
/* The same, except that blocks it reads from disk are not added to the cache (cached ones are
 * still used): for compactions and long scans, so they do not evict what point reads need.
 * Added by the SSTable module. */
sto_kviter *sto_sst_iter_new_scan(sto_sst *t);

/* Tables with pairwise disjoint ikey ranges read as one stream (sorted by smallest key here),
 * opening one table at a time, lazily, where a seek lands: what a merge over them costs one
 * table's block per seek. wrap[i] (may be NULL = none) restricts table i with wrap_fn(child,
 * lo, hi) (sto_range_iter_new; bounds copied). Takes references on the tables. NULL when memory
 * runs out, n is 0 or over STO_SST_CONCAT_MAX. Added by the SSTable module (performance). */
#define STO_SST_CONCAT_MAX 100000
typedef sto_kviter *(*sto_sst_wrap_fn)(sto_kviter *child, st_slice lo, st_slice hi);
/* keep (may be NULL) is passed to the tables' iterators (sto_sst_iter_new_kept). */
sto_kviter *sto_sst_concat_iter_new(sto_sst *const *tables, const bool *wrap, size_t n, st_slice lo,
                                    st_slice hi, sto_sst_wrap_fn wrap_fn, sto_sst_keep *keep);
/* True when the two tables' ikey ranges do not overlap. */
bool sto_sst_disjoint(const sto_sst *a, const sto_sst *b);

#endif
