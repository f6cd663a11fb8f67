/* block.h — SSTable blocks: building, sealing (compression + checksum trailer), parsing and
 * iterating (private to the SSTable module; format: docs/formats/sstable.md).
 *
 * A block's contents are LevelDB-style entries
 *     varint shared | varint unshared | varint value_len | key[shared..] | value
 * with a restart point (shared = 0) every restart_interval entries, then the restart offsets
 * (fixed32 each) and their count (fixed32). On disk the contents (possibly zstd-compressed) are
 * followed by a 5-byte trailer: 1 compression-type byte and a masked crc32c of contents + type. */
#ifndef STO_BLOCK_H
#define STO_BLOCK_H

#include "strata/base.h"

#define STO_BLOCK_TRAILER_BYTES 5
#define STO_BLOCK_NONE 0
#define STO_BLOCK_ZSTD 1
#define STO_BLOCK_RESTART_INTERVAL 16
/* Largest decompressed block we accept: a block holds at most one oversized entry (value up to
 * STO_VALUE_MAX = 100 MiB plus its key) beyond the target size. Anything larger is corruption. */
#define STO_BLOCK_BYTES_MAX (128u << 20)

/* ---- building ---- */
typedef struct sto_block_builder {
    st_buf buf;      /* entries so far */
    st_buf last_key; /* for prefix compression and order checks */
    uint32_t *restarts;
    size_t n_restarts, cap_restarts;
    int restart_interval;
    int counter; /* entries since the last restart */
    size_t entries;
} sto_block_builder;

void sto_block_builder_init(sto_block_builder *b, int restart_interval);
void sto_block_builder_deinit(sto_block_builder *b);
void sto_block_builder_reset(sto_block_builder *b);
/* Keys must be added in increasing order (the caller checks). ST_RESOURCE_EXHAUSTED on OOM,
 * ST_INVALID_ARGUMENT when the block would exceed STO_BLOCK_BYTES_MAX. */
st_code sto_block_builder_add(sto_block_builder *b, st_slice key, st_slice value);
/* Appends the restart array; the returned contents are valid until the next reset. */
st_code sto_block_builder_finish(sto_block_builder *b, st_slice *contents);
size_t sto_block_builder_size(const sto_block_builder *b); /* contents size if finished now */
static inline bool sto_block_builder_empty(const sto_block_builder *b) {
    return b->entries == 0;
}

/* A zstd_level that stores every block uncompressed (any other level, zstd's negative "fast"
 * levels included, is passed to zstd). */
#define STO_BLOCK_ZSTD_NONE (-1000)

/* Writes contents + trailer to out (reset first). With a zstd_level other than
 * STO_BLOCK_ZSTD_NONE and cctx, the block is stored zstd-compressed when that saves at least 1/8
 * of its size. cctx is a ZSTD_CCtx *. */
st_code sto_block_seal(st_slice contents, void *cctx, int zstd_level, st_buf *out, st_err *err);

/* Checks the trailer of a block read from disk (contents + trailer, `len` bytes) and returns its
 * decompressed contents: either a slice of raw (uncompressed blocks) with *owned = NULL, or a
 * fresh malloc'd buffer in *owned (the caller frees it) holding `prefix` bytes left for the
 * caller followed by the contents. dctx is a ZSTD_DCtx *.
 * ST_DATA_LOSS on a checksum mismatch or a malformed block. */
st_code sto_block_unseal(const uint8_t *raw, size_t len, void *dctx, size_t prefix,
                         st_slice *contents, uint8_t **owned, st_err *err);

/* Where sto_block_unseal_with puts decompressed blocks (helper addition: the SSTable reader
 * recycles cache memory through it). release gets the size alloc was asked for. */
typedef struct sto_block_allocator {
    void *(*alloc)(void *arg, size_t bytes);
    void (*release)(void *arg, void *p, size_t bytes);
    void *arg;
} sto_block_allocator;
/* sto_block_unseal with the buffer from a (NULL = malloc); *owned_bytes is its size. */
st_code sto_block_unseal_with(const uint8_t *raw, size_t len, void *dctx, size_t prefix,
                              const sto_block_allocator *a, st_slice *contents, uint8_t **owned,
                              size_t *owned_bytes, st_err *err);

/* ---- reading ---- */
typedef struct sto_block {
    const uint8_t *data;
    uint32_t restarts; /* offset of the restart array = end of the entries */
    uint32_t n_restarts;
} sto_block;

/* Validates the restart array of contents; ST_DATA_LOSS if malformed. b points into contents. */
st_code sto_block_parse(st_slice contents, sto_block *b, st_err *err);

/* An iterator over one block. Key bytes live in an owned buffer reused across blocks, values
 * point into the block. A malformed entry makes it invalid with status ST_DATA_LOSS. */
typedef struct sto_block_iter {
    const sto_block *b;
    uint32_t current;  /* offset of the current entry; b->restarts when invalid */
    uint32_t next_off; /* offset just past the current entry */
    uint32_t restart_index;
    st_buf key;
    st_slice value;
    st_code status;
} sto_block_iter;

/* Restart-point access (the SSTable index search): restart_key gives the full key stored at
 * restart i (false when malformed or i >= n_restarts); restart_offset is its offset in the
 * block. */
bool sto_block_restart_key(const sto_block *b, uint32_t i, st_slice *key);
uint32_t sto_block_restart_offset(const sto_block *b, uint32_t i);

void sto_block_iter_init(sto_block_iter *it);
void sto_block_iter_deinit(sto_block_iter *it);
/* Points it at b (invalid until positioned); keeps the key buffer. */
void sto_block_iter_set(sto_block_iter *it, const sto_block *b);
void sto_block_iter_seek(sto_block_iter *it, st_slice target);
void sto_block_iter_seek_first(sto_block_iter *it);
void sto_block_iter_seek_last(sto_block_iter *it);
void sto_block_iter_next(sto_block_iter *it);
void sto_block_iter_prev(sto_block_iter *it);
static inline bool sto_block_iter_valid(const sto_block_iter *it) {
    return it->b != NULL && it->current < it->b->restarts && it->status == ST_OK;
}
static inline st_slice sto_block_iter_key(const sto_block_iter *it) {
    return st_buf_slice(&it->key);
}

#endif
