/* cache.h — the block cache's handle API, used by the sst*.c files (private to the SSTable module;
 * the constructor and stats are in sst.h).
 *
 * Entries are keyed by (sst id, block offset) and charged by their decompressed size. A lookup or
 * insert returns a referenced handle; the value stays valid until sto_cache_release even if the
 * entry is evicted or replaced meanwhile. Thread-safe: 16 shards, each with its own mutex. */
#ifndef STO_CACHE_H
#define STO_CACHE_H

#include "sst.h"

#define STO_CACHE_SHARDS 16

typedef struct sto_cache_handle sto_cache_handle;
typedef void (*sto_cache_deleter)(void *value);

/* Public only so a value can carry its own handle (sto_cache_insert_embedded); the fields are
 * the cache's. */
struct sto_cache_handle {
    uint64_t id, off, hash;
    void *value;
    size_t charge;
    sto_cache_deleter deleter;
    uint32_t refs; /* readers + 1 while in the cache */
    bool in_cache;
    bool embedded; /* lives inside memory that deleter frees */
    bool cold;     /* released to the LRU's old end until a lookup hits it (see insert) */
    sto_cache_handle *next_hash;
    sto_cache_handle *prev, *next; /* lru or in_use list */
};

/* NULL on a miss (counted). */
sto_cache_handle *sto_cache_lookup(sto_cache *c, uint64_t id, uint64_t off);
/* Inserts value (replacing any entry with the same key) and returns a handle on it; the cache
 * calls deleter(value) once the entry is evicted and released. With capacity 0 nothing is kept:
 * the handle works and the value is deleted at release. c may be NULL in these three calls,
 * meaning no cache (lookups miss, handles are private). NULL only when memory runs out, in which
 * case nothing was inserted and the caller still owns value. */
sto_cache_handle *sto_cache_insert(sto_cache *c, uint64_t id, uint64_t off, void *value,
                                   size_t charge, sto_cache_deleter deleter);
/* The same with the handle in caller memory (mem), typically inside the value, that the deleter
 * frees: a block read then costs one allocation, not two. Never fails. Added by the SSTable
 * module (performance). */
/* cold: the value is read by a sequential scan and is not expected back; once released it goes
 * to the old end of the LRU (evicted next) instead of the new end, unless a lookup hits it first.
 * A scan then evicts its own previous block (still in the CPU's cache: cheap) instead of the
 * oldest entry (cold memory: the costliest part of an insert), and leaves point reads' blocks
 * alone, as midpoint insertion does in other engines' buffer pools. */
sto_cache_handle *sto_cache_insert_embedded(sto_cache *c, sto_cache_handle *mem, uint64_t id,
                                            uint64_t off, void *value, size_t charge,
                                            sto_cache_deleter deleter, bool cold);
void *sto_cache_value(sto_cache_handle *h);
void sto_cache_release(sto_cache *c, sto_cache_handle *h);
/* Whether a value of this charge may be inserted: not when it exceeds a shard's capacity, as it
 * would evict every other entry of its shard and then itself at release. c may be NULL. */
bool sto_cache_admits(const sto_cache *c, size_t charge);
/* Counts a block read from disk (sto_cache_read_stats); c may be NULL. */
void sto_cache_note_read(sto_cache *c, size_t bytes);

/* zstd decompression contexts (~96 KiB each) are costly to create, so each thread keeps the last
 * one it put back (freed when the thread ends), and the cache that all tables of a db share also
 * keeps up to STO_CACHE_DCTX_MAX idle ones. get never returns NULL unless memory runs out; c may
 * be NULL (no pool: only the thread's own context is kept). */
#define STO_CACHE_DCTX_MAX 16
void *sto_cache_dctx_get(sto_cache *c);
void sto_cache_dctx_put(sto_cache *c, void *dctx);

/* Block memory recycling (helper addition). Blocks are allocated by whichever thread reads them
 * and freed by whichever thread evicts them; with glibc's per-thread arenas the memory freed in
 * one arena is not reused by another, so a busy cache held about twice its capacity in RSS.
 * Buffers come in STO_CACHE_BUF_CLASS_BYTES steps up to STO_CACHE_BUF_POOLED_MAX; freed ones
 * wait in a pool (at most capacity / STO_CACHE_POOL_FRACTION bytes, split over
 * STO_CACHE_POOL_SHARDS) for the next block read, by any thread. c NULL: plain malloc/free. */
#define STO_CACHE_BUF_CLASS_BYTES 512
#define STO_CACHE_BUF_POOLED_MAX ((size_t)64 << 10)
#define STO_CACHE_POOL_FRACTION 16
#define STO_CACHE_POOL_SHARDS 4
/* The size a buffer of `bytes` really takes (what to charge). */
size_t sto_cache_buf_size(size_t bytes);
void *sto_cache_buf_get(sto_cache *c, size_t bytes);
void sto_cache_buf_put(sto_cache *c, void *p, size_t bytes); /* bytes as given to get */

#endif
