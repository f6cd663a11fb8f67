/* sst_blocks.c — reading an SSTable's blocks: one pread (or a read-ahead window for scans), the
 * checksum and decompression, then the block cache (see sst_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "sst_impl.h"

#define SST_STACK_READ_BYTES (24u << 10) /* blocks up to this size are read into the stack */
/* A scan that has asked for SST_READAHEAD_AFTER consecutive blocks reads the next ones with one
 * pread per window instead of one per block; the window starts at SST_READAHEAD_MIN_BYTES and
 * doubles up to SST_READAHEAD_BYTES (short scans do not copy much more than they use). */
#define SST_READAHEAD_AFTER 2
#define SST_READAHEAD_MIN_BYTES (16u << 10)
#define SST_READAHEAD_BYTES (128u << 10)

st_code sst_read_exact(sto_sst *t, uint64_t off, void *buf, size_t len, st_err *err) {
    size_t got = 0;
    st_code rc = t->env->ops->pread(t->file, off, buf, len, &got, err);
    if (rc != ST_OK)
        return rc;
    if (got != len)
        return st_err_set(err, ST_DATA_LOSS, "short read: %zu of %zu bytes at offset %llu", got,
                          len, (unsigned long long)off);
    return ST_OK;
}

static void *pool_alloc(void *arg, size_t bytes) {
    return sto_cache_buf_get(arg, bytes);
}

static void pool_release(void *arg, void *p, size_t bytes) {
    sto_cache_buf_put(arg, p, bytes);
}

/* Checks and decompresses the sealed block raw[0, n) (n includes the trailer) into *mem, of
 * which the first `prefix` bytes are left for the caller; raw is not kept. pooled: the memory
 * comes from the cache's block pool (give it back with sto_cache_buf_put(t->cache, *mem,
 * *bytes)), else from malloc (free it). */
static st_code unseal_copy(sto_sst *t, const uint8_t *raw, size_t n, size_t prefix, bool pooled,
                           uint8_t **mem, size_t *bytes, st_slice *contents, st_err *err) {
    sto_block_allocator pool = {pool_alloc, pool_release, t->cache};
    const sto_block_allocator *a = pooled ? &pool : NULL;
    uint8_t *owned = NULL;
    st_code rc;
    if (n >= STO_BLOCK_TRAILER_BYTES && raw[n - STO_BLOCK_TRAILER_BYTES] != STO_BLOCK_NONE) {
        void *d = sto_cache_dctx_get(t->cache);
        rc = sto_block_unseal_with(raw, n, d, prefix, a, contents, &owned, bytes, err);
        sto_cache_dctx_put(t->cache, d);
    } else {
        rc = sto_block_unseal_with(raw, n, NULL, prefix, a, contents, &owned, bytes, err);
    }
    if (rc != ST_OK)
        return rc;
    if (!owned) { /* stored uncompressed: copy out of raw */
        *bytes = prefix + contents->len + 1;
        if (!(owned = pooled ? sto_cache_buf_get(t->cache, *bytes) : malloc(*bytes)))
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading a block");
        memcpy(owned + prefix, contents->data, contents->len);
        *contents = st_slice_make(owned + prefix, contents->len);
    }
    *mem = owned;
    return ST_OK;
}

/* Small blocks are read into a stack buffer, so a compressed block costs one allocation, not
 * two. */
st_code sst_read_block_into(sto_sst *t, sst_handle h, size_t prefix, bool pooled, uint8_t **mem,
                            size_t *bytes, st_slice *contents, st_err *err) {
    size_t n = (size_t)h.size + STO_BLOCK_TRAILER_BYTES;
    uint8_t stack[SST_STACK_READ_BYTES];
    uint8_t *raw = n <= sizeof stack ? stack : malloc(n);
    if (!raw)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading a %zu-byte block", n);
    st_code rc = sst_read_exact(t, h.off, raw, n, err);
    if (rc == ST_OK)
        rc = unseal_copy(t, raw, n, prefix, pooled, mem, bytes, contents, err);
    if (raw != stack)
        free(raw);
    return rc;
}

static void blk_delete(void *v) {
    sst_blk *b = v;
    sto_cache_buf_put(b->pool, b, b->bytes);
}

/* Reads the sealed block at h (n bytes with its trailer) into *mem through the window: a scan in
 * file order reads SST_READAHEAD_BYTES per pread once it is SST_READAHEAD_AFTER blocks long. */
static st_code read_block_ahead(sto_sst *t, sst_readahead *ra, sst_handle h, size_t prefix,
                                uint8_t **mem, size_t *bytes, st_slice *c, st_err *err) {
    size_t n = (size_t)h.size + STO_BLOCK_TRAILER_BYTES;
    bool inside = h.off >= ra->win_off && h.off - ra->win_off + n <= ra->win.len;
    if (!inside && ra->run >= SST_READAHEAD_AFTER && n < SST_READAHEAD_BYTES) {
        size_t size = ra->size ? ra->size : SST_READAHEAD_MIN_BYTES;
        ra->size = size * 2 <= SST_READAHEAD_BYTES ? size * 2 : SST_READAHEAD_BYTES;
        if (size < n)
            size = n;
        uint64_t want = t->data_end - h.off < size ? t->data_end - h.off : size;
        ra->win.len = 0; /* reserve counts from len */
        if (want >= n && st_buf_reserve(&ra->win, (size_t)want) == ST_OK) {
            size_t got = 0;
            st_code rc = t->env->ops->pread(t->file, h.off, ra->win.data, (size_t)want, &got, err);
            if (rc != ST_OK)
                return rc;
            ra->win.len = got;
            ra->win_off = h.off;
            inside = got >= n;
        }
    }
    if (inside)
        return unseal_copy(t, ra->win.data + (h.off - ra->win_off), n, prefix, true, mem, bytes, c,
                           err);
    return sst_read_block_into(t, h, prefix, true, mem, bytes, c, err);
}

static void note_read(sto_sst *t, sto_sst_keep *k, size_t bytes) {
    sto_cache_note_read(t->cache, bytes);
    if (k)
        atomic_fetch_add_explicit(&k->bytes, bytes, memory_order_relaxed);
}

st_code sst_get_block(sto_sst *t, bool fill_cache, sto_sst_keep *keep, sst_readahead *ra,
                      sst_handle h, sto_cache_handle **out, sto_cache **owner, st_err *err) {
    if (ra) {
        ra->run = h.off == ra->next_off ? ra->run + 1 : 0;
        ra->next_off = h.off + h.size + STO_BLOCK_TRAILER_BYTES;
    }
    sto_cache_handle *ch = sst_keep_take(keep, t->id, h.off);
    if (ch) {
        *out = ch;
        *owner = NULL;
        return ST_OK;
    }
    if ((ch = sto_cache_lookup(t->cache, t->id, h.off)) != NULL) {
        *out = ch;
        *owner = t->cache;
        return ST_OK;
    }
    uint8_t *mem;
    size_t bytes = 0;
    st_slice c;
    st_code rc = ra ? read_block_ahead(t, ra, h, sizeof(sst_blk), &mem, &bytes, &c, err)
                    : sst_read_block_into(t, h, sizeof(sst_blk), true, &mem, &bytes, &c, err);
    if (rc != ST_OK)
        return rc;
    note_read(t, keep, c.len);
    sst_blk *b = (sst_blk *)(void *)mem;
    b->pool = t->cache;
    b->bytes = bytes;
    if ((rc = sto_block_parse(c, &b->block, err)) != ST_OK) {
        blk_delete(b);
        return rc;
    }
    /* Charged by what the block really takes, its header and pool rounding included. */
    size_t charge = sto_cache_buf_size(bytes);
    sto_cache *cache = fill_cache && sto_cache_admits(t->cache, charge) ? t->cache : NULL;
    /* Blocks past the first of a sequential run are a scan's: cached cold. */
    ch = sto_cache_insert_embedded(cache, &b->handle, t->id, h.off, b, charge, blk_delete,
                                   ra && ra->run > 0);
    *out = ch;
    *owner = cache;
    return ST_OK;
}
