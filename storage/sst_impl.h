/* sst_impl.h — private to the SSTable files (storage/sst*.c): the format's constants, the open
 * table, the data block as the cache holds it, and the calls the files make of each other.
 * Format: docs/formats/sstable.md; contract: sst.h.
 *
 * sst.c opens a table (footer, hot blocks, accessors), sst_index.c checks and searches its
 * index, sst_blocks.c reads data blocks through the cache, sst_keep.c keeps a read's last
 * uncached block, sst_iter.c is the two-level iterator, sst_concat.c reads disjoint tables as
 * one stream and sst_write.c writes new tables. */
#ifndef STO_SST_IMPL_H
#define STO_SST_IMPL_H

#include "sst.h"

#include <stdatomic.h>

#include "block.h"
#include "cache.h"

#define STO_SST_MAGIC 0x31545353415453ull /* "STASST1\0" little endian */
#define STO_SST_FORMAT_VERSION 1u
#define STO_SST_FOOTER_BYTES 80
#define SST_FP_STRIDE 16      /* fingerprints per entry of the top level (128 bytes) */
#define SST_FP_MIN_ENTRIES 64 /* smaller indexes are searched directly */

typedef struct sst_handle {
    uint64_t off, size; /* size excludes the trailer */
} sst_handle;

typedef struct sst_footer {
    sst_handle index, filter, meta;
    uint64_t entries;
    uint64_t data_end; /* end of the last data block */
    uint32_t version;
} sst_footer;

/* Footer byte layout (little endian): index off/size, filter off/size, meta off/size (u64 each),
 * entries u64, data_end u64, version u32, masked crc32c of bytes [0, 68) u32, magic u64. */
enum {
    FOOTER_ENTRIES = 48,
    FOOTER_DATA_END = 56,
    FOOTER_VERSION = 64,
    FOOTER_CRC = 68,
    FOOTER_MAGIC = 72,
};
_Static_assert(FOOTER_MAGIC + 8 == STO_SST_FOOTER_BYTES, "footer layout must fill 80 bytes");

struct sto_sst {
    st_env *env;
    char *path;
    uint64_t id;
    sto_cache *cache;
    st_rfile *file;
    uint64_t file_bytes, entries, data_end;
    uint8_t *index_mem, *filter_mem, *meta_mem; /* hot blocks, kept out of the cache */
    sto_block index;
    st_slice filter, smallest, largest;
    size_t mem_bytes;
    /* Index search accelerator (in memory only): every index key starts with fp_prefix (a slice
     * of the first index key); fp[i] is the next 8 bytes of index key i, big-endian, zero-padded.
     * NULL for small indexes or when an index entry is not its own restart point. */
    uint64_t *fp;
    uint64_t *fp_top; /* fp[j * SST_FP_STRIDE] for each j: the search's first, cache-hot level */
    uint32_t n_top;
    /* With fp: offs[i] is the offset of data block i, offs[n] = data_end (blocks are contiguous,
     * sst_validate_index checked it), so iterators move between blocks by number without decoding
     * index entries (each one a cache miss in a big index). */
    uint64_t *offs;
    st_slice fp_prefix;
    /* Every snapshot takes and drops a reference from whichever thread reads: the counter gets a
     * cache line of its own, so the line holding the fields above stays shared by the readers'
     * cores instead of moving with each reference. */
    char pad_before[64];
    atomic_int refs;
    atomic_bool obsolete;
    char pad_after[64 - sizeof(atomic_int) - sizeof(atomic_bool)];
};

/* A parsed data block; its contents follow the struct in the same allocation, which came from
 * the block pool of `pool` (the table's cache). */
typedef struct sst_blk {
    sto_block block;
    sto_cache *pool;
    size_t bytes;            /* as asked from the pool */
    sto_cache_handle handle; /* the block's cache entry (sto_cache_insert_embedded) */
} sst_blk;

/* An iterator's read-ahead window (sequential scans); win is allocated at the first use. */
typedef struct sst_readahead {
    st_buf win; /* file bytes [win_off, win_off + win.len) */
    uint64_t win_off;
    uint64_t next_off; /* where the block after the last one asked for starts */
    int run;           /* consecutive blocks asked for in file order */
    size_t size;       /* the next window's size (0 = SST_READAHEAD_MIN_BYTES) */
} sst_readahead;

/* ---- sst.c ---- */

/* True when the block at h, with its trailer, lies inside [lo, hi) and is not over the size
 * limit of a block. */
bool sst_handle_ok(sst_handle h, uint64_t lo, uint64_t hi);

/* ---- sst_index.c ---- */

/* Decodes an index entry's value; false when it is malformed. */
bool sst_decode_handle(st_slice v, sst_handle *h);
/* Checks every index entry once at open: ordered keys and in-bounds, ordered data blocks. */
st_code sst_validate_index(sto_sst *t, st_err *err);
/* Builds t's fingerprints (t->fp, fp_top, offs) when the index suits them; else leaves fp NULL. */
void sst_fp_build(sto_sst *t);
/* The index of the first index entry whose key is >= target (n_restarts when none); t->fp set. */
uint32_t sst_fp_search(const sto_sst *t, st_slice target);

/* ---- sst_blocks.c ---- */

st_code sst_read_exact(sto_sst *t, uint64_t off, void *buf, size_t len, st_err *err);
/* Reads, checks and decompresses the block at h into *mem, of which the first `prefix` bytes
 * are left for the caller. pooled: the memory comes from the cache's block pool (give it back
 * with sto_cache_buf_put(t->cache, *mem, *bytes)), else from malloc (free it). */
st_code sst_read_block_into(sto_sst *t, sst_handle h, size_t prefix, bool pooled, uint8_t **mem,
                            size_t *bytes, st_slice *contents, st_err *err);
/* Returns a handle on the data block at h, from the cache, from keep (may be NULL) or read from
 * disk; *owner receives the cache the handle must be released to (NULL for a block read but not
 * cached). ra (NULL = none) tracks sequential reads for read-ahead. */
st_code sst_get_block(sto_sst *t, bool fill_cache, sto_sst_keep *keep, sst_readahead *ra,
                      sst_handle h, sto_cache_handle **out, sto_cache **owner, st_err *err);

/* ---- sst_keep.c ---- */

/* Leaves the private block h in the slot, dropping the one it replaces. */
void sst_keep_put(sto_sst_keep *k, sto_cache_handle *h);
/* The kept block (id, off), taken out of the slot (k may be NULL), or NULL. */
sto_cache_handle *sst_keep_take(sto_sst_keep *k, uint64_t id, uint64_t off);

#endif
