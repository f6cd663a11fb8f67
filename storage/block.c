/* block.c — building, sealing, parsing and iterating SSTable blocks (see block.h and
 * docs/formats/sstable.md). Every offset and length read from a block is checked against the
 * block's bounds before use: a malformed block yields ST_DATA_LOSS, never a read out of bounds. */
#include "block.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

/* ---- building ---- */

void sto_block_builder_init(sto_block_builder *b, int restart_interval) {
    memset(b, 0, sizeof(*b));
    st_buf_init(&b->buf);
    st_buf_init(&b->last_key);
    b->restart_interval = restart_interval > 0 ? restart_interval : STO_BLOCK_RESTART_INTERVAL;
    sto_block_builder_reset(b);
}

void sto_block_builder_deinit(sto_block_builder *b) {
    st_buf_free(&b->buf);
    st_buf_free(&b->last_key);
    free(b->restarts);
    memset(b, 0, sizeof(*b));
}

void sto_block_builder_reset(sto_block_builder *b) {
    st_buf_reset(&b->buf);
    st_buf_reset(&b->last_key);
    b->n_restarts = 0;
    b->counter = 0;
    b->entries = 0;
}

size_t sto_block_builder_size(const sto_block_builder *b) {
    size_t n = b->n_restarts ? b->n_restarts : 1;
    return b->buf.len + 4 * n + 4;
}

static st_code push_restart(sto_block_builder *b, uint32_t off) {
    if (b->n_restarts == b->cap_restarts) {
        size_t cap = b->cap_restarts ? b->cap_restarts * 2 : 64;
        uint32_t *r = realloc(b->restarts, cap * sizeof(*r));
        if (!r)
            return ST_RESOURCE_EXHAUSTED;
        b->restarts = r;
        b->cap_restarts = cap;
    }
    b->restarts[b->n_restarts++] = off;
    return ST_OK;
}

static size_t common_prefix(st_slice a, st_slice b) {
    size_t n = a.len < b.len ? a.len : b.len, i = 0;
    while (i < n && a.data[i] == b.data[i])
        i++;
    return i;
}

st_code sto_block_builder_add(sto_block_builder *b, st_slice key, st_slice value) {
    size_t shared = 0;
    bool restart = b->entries == 0 || b->counter >= b->restart_interval;
    if (!restart)
        shared = common_prefix(st_buf_slice(&b->last_key), key);
    size_t unshared = key.len - shared;
    uint8_t hdr[3 * ST_VARINT64_MAX];
    size_t h = st_put_varint64(hdr, shared);
    h += st_put_varint64(hdr + h, unshared);
    h += st_put_varint64(hdr + h, value.len);
    /* Bound the block so its offsets fit in 32 bits and a reader's size limit accepts it. */
    uint64_t after = (uint64_t)b->buf.len + h + unshared + value.len + 4 * (b->n_restarts + 2);
    if (after > STO_BLOCK_BYTES_MAX)
        return ST_INVALID_ARGUMENT;
    /* Reserve everything first so a failure leaves the builder unchanged. */
    if (st_buf_reserve(&b->buf, h + unshared + value.len) != ST_OK ||
        st_buf_reserve(&b->last_key, key.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (restart) {
        if (push_restart(b, (uint32_t)b->buf.len) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        b->counter = 0;
    }
    st_buf_append(&b->buf, hdr, h);
    st_buf_append(&b->buf, key.data + shared, unshared);
    st_buf_append(&b->buf, value.data, value.len);
    b->last_key.len = shared;
    st_buf_append(&b->last_key, key.data + shared, unshared);
    b->counter++;
    b->entries++;
    return ST_OK;
}

st_code sto_block_builder_finish(sto_block_builder *b, st_slice *contents) {
    if (b->n_restarts == 0 && push_restart(b, 0) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (st_buf_reserve(&b->buf, 4 * b->n_restarts + 4) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < b->n_restarts; i++)
        st_buf_append_fixed32(&b->buf, b->restarts[i]);
    st_buf_append_fixed32(&b->buf, (uint32_t)b->n_restarts);
    *contents = st_buf_slice(&b->buf);
    return ST_OK;
}

/* ---- sealing: compression and the checksum trailer ---- */

st_code sto_block_seal(st_slice contents, void *cctx, int zstd_level, st_buf *out, st_err *err) {
    st_buf_reset(out);
    size_t bound = ZSTD_compressBound(contents.len);
    if (st_buf_reserve(out, (bound > contents.len ? bound : contents.len) +
                                STO_BLOCK_TRAILER_BYTES) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory sealing a %zu-byte block",
                          contents.len);
    uint8_t type = STO_BLOCK_NONE;
    if (cctx && zstd_level != STO_BLOCK_ZSTD_NONE && contents.len > 0) {
        size_t n =
            ZSTD_compressCCtx(cctx, out->data, bound, contents.data, contents.len, zstd_level);
        /* Compression costs every later read a decompression: keep it only when it pays. */
        if (!ZSTD_isError(n) && n <= contents.len - contents.len / 8) {
            type = STO_BLOCK_ZSTD;
            out->len = n;
        }
    }
    if (type == STO_BLOCK_NONE)
        st_buf_append(out, contents.data, contents.len);
    st_buf_append_byte(out, type);
    uint32_t crc = st_crc_mask(st_crc32c(0, out->data, out->len));
    st_buf_append_fixed32(out, crc);
    return ST_OK;
}

static void *heap_alloc(void *arg, size_t bytes) {
    (void)arg;
    return malloc(bytes);
}

static void heap_release(void *arg, void *p, size_t bytes) {
    (void)arg;
    (void)bytes;
    free(p);
}

static const sto_block_allocator heap_allocator = {heap_alloc, heap_release, NULL};

static st_code unseal_zstd(const uint8_t *src, size_t n, void *dctx, size_t prefix,
                           const sto_block_allocator *a, st_slice *contents, uint8_t **owned,
                           size_t *owned_bytes, st_err *err) {
    unsigned long long size = ZSTD_getFrameContentSize(src, n);
    if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR ||
        size > STO_BLOCK_BYTES_MAX)
        return st_err_set(err, ST_DATA_LOSS, "compressed block has a bad frame header");
    size_t bytes = prefix + (size_t)size + 1;
    uint8_t *mem = a->alloc(a->arg, bytes);
    if (!mem)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory decompressing a block");
    uint8_t *dst = mem + prefix;
    size_t got = ZSTD_decompressDCtx(dctx, dst, (size_t)size, src, n);
    if (ZSTD_isError(got) || got != size) {
        a->release(a->arg, mem, bytes);
        return st_err_set(err, ST_DATA_LOSS, "compressed block does not decompress (%s)",
                          ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short output");
    }
    *contents = st_slice_make(dst, (size_t)size);
    *owned = mem;
    *owned_bytes = bytes;
    return ST_OK;
}

st_code sto_block_unseal_with(const uint8_t *raw, size_t len, void *dctx, size_t prefix,
                              const sto_block_allocator *a, st_slice *contents, uint8_t **owned,
                              size_t *owned_bytes, st_err *err) {
    *owned = NULL;
    *owned_bytes = 0;
    if (len < STO_BLOCK_TRAILER_BYTES)
        return st_err_set(err, ST_DATA_LOSS, "block of %zu bytes is shorter than its trailer", len);
    size_t n = len - STO_BLOCK_TRAILER_BYTES;
    uint32_t want = st_crc_unmask(st_get_fixed32(raw + n + 1));
    uint32_t got = st_crc32c(0, raw, n + 1);
    if (want != got)
        return st_err_set(err, ST_DATA_LOSS, "block checksum mismatch (stored %08x, computed %08x)",
                          want, got);
    switch (raw[n]) {
    case STO_BLOCK_NONE:
        *contents = st_slice_make(raw, n);
        return ST_OK;
    case STO_BLOCK_ZSTD:
        if (!dctx)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                              "out of memory for a decompression context");
        return unseal_zstd(raw, n, dctx, prefix, a ? a : &heap_allocator, contents, owned,
                           owned_bytes, err);
    default:
        return st_err_set(err, ST_DATA_LOSS, "block has unknown compression type %u", raw[n]);
    }
}

st_code sto_block_unseal(const uint8_t *raw, size_t len, void *dctx, size_t prefix,
                         st_slice *contents, uint8_t **owned, st_err *err) {
    size_t bytes;
    return sto_block_unseal_with(raw, len, dctx, prefix, NULL, contents, owned, &bytes, err);
}

/* ---- parsing ---- */

st_code sto_block_parse(st_slice c, sto_block *b, st_err *err) {
    if (c.len < 4 || c.len > STO_BLOCK_BYTES_MAX)
        return st_err_set(err, ST_DATA_LOSS, "block of %zu bytes has no room for its restarts",
                          c.len);
    uint32_t n = st_get_fixed32(c.data + c.len - 4);
    if (n == 0 || n > (c.len - 4) / 4)
        return st_err_set(err, ST_DATA_LOSS, "block claims %u restart points in %zu bytes", n,
                          c.len);
    uint32_t restarts = (uint32_t)(c.len - 4 - 4 * (size_t)n);
    const uint8_t *arr = c.data + restarts;
    /* Restarts must increase and point inside the entries (an empty block has one at 0). */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = st_get_fixed32(arr + 4 * (size_t)i);
        bool ok = restarts == 0
                      ? (n == 1 && r == 0)
                      : (r < restarts &&
                         (i == 0 ? r == 0 : r > st_get_fixed32(arr + 4 * (size_t)(i - 1))));
        if (!ok)
            return st_err_set(err, ST_DATA_LOSS, "block restart point %u (offset %u) is invalid", i,
                              r);
    }
    b->data = c.data;
    b->restarts = restarts;
    b->n_restarts = n;
    return ST_OK;
}

/* ---- iterating ---- */

static inline uint32_t restart_at(const sto_block *b, uint32_t i) {
    return st_get_fixed32(b->data + b->restarts + 4 * (size_t)i);
}

/* Decodes the three varints of the entry at p (limit: end of entries); NULL when malformed. */
static inline const uint8_t *decode_header(const uint8_t *p, const uint8_t *limit, uint64_t *shared,
                                           uint64_t *unshared, uint64_t *vlen) {
    if (limit - p >= 3 && (p[0] | p[1] | p[2]) < 128) { /* the common case: one byte each */
        *shared = p[0];
        *unshared = p[1];
        *vlen = p[2];
        p += 3;
    } else if (!st_get_varint64(&p, limit, shared) || !st_get_varint64(&p, limit, unshared) ||
               !st_get_varint64(&p, limit, vlen)) {
        return NULL;
    }
    if (*unshared > (uint64_t)(limit - p) || *vlen > (uint64_t)(limit - p) - *unshared)
        return NULL;
    return p;
}

void sto_block_iter_init(sto_block_iter *it) {
    memset(it, 0, sizeof(*it));
    st_buf_init(&it->key);
}

void sto_block_iter_deinit(sto_block_iter *it) {
    st_buf_free(&it->key);
    it->b = NULL;
}

static void mark_invalid(sto_block_iter *it) {
    it->current = it->b->restarts;
    it->next_off = it->b->restarts;
    it->restart_index = it->b->n_restarts;
    it->key.len = 0;
    it->value = st_slice_make(NULL, 0);
}

static void corrupt(sto_block_iter *it, st_code code) {
    it->status = code;
    mark_invalid(it);
}

void sto_block_iter_set(sto_block_iter *it, const sto_block *b) {
    it->b = b;
    it->status = ST_OK;
    mark_invalid(it);
}

/* Moves to the entry at next_off; false at the end or on corruption. */
static bool parse_next(sto_block_iter *it) {
    const sto_block *b = it->b;
    it->current = it->next_off;
    if (it->current >= b->restarts) {
        mark_invalid(it);
        return false;
    }
    const uint8_t *limit = b->data + b->restarts;
    uint64_t shared, unshared, vlen;
    const uint8_t *p = decode_header(b->data + it->current, limit, &shared, &unshared, &vlen);
    if (!p || shared > it->key.len) {
        corrupt(it, ST_DATA_LOSS);
        return false;
    }
    it->key.len = (size_t)shared;
    if (st_buf_append(&it->key, p, (size_t)unshared) != ST_OK) {
        corrupt(it, ST_RESOURCE_EXHAUSTED);
        return false;
    }
    it->value = st_slice_make(p + unshared, (size_t)vlen);
    it->next_off = (uint32_t)(p + unshared + vlen - b->data);
    while (it->restart_index + 1 < b->n_restarts &&
           restart_at(b, it->restart_index + 1) <= it->current)
        it->restart_index++;
    return true;
}

static void seek_to_restart(sto_block_iter *it, uint32_t i) {
    it->key.len = 0;
    it->restart_index = i;
    it->next_off = restart_at(it->b, i);
}

/* The full key stored at restart i (shared must be 0 there); false when malformed. */
static bool key_at_restart(const sto_block *b, uint32_t i, st_slice *key) {
    uint64_t shared, unshared, vlen;
    const uint8_t *p =
        decode_header(b->data + restart_at(b, i), b->data + b->restarts, &shared, &unshared, &vlen);
    if (!p || shared != 0)
        return false;
    *key = st_slice_make(p, (size_t)unshared);
    return true;
}

bool sto_block_restart_key(const sto_block *b, uint32_t i, st_slice *key) {
    return b->restarts > 0 && i < b->n_restarts && key_at_restart(b, i, key);
}

uint32_t sto_block_restart_offset(const sto_block *b, uint32_t i) {
    ST_ASSERT(i < b->n_restarts);
    return restart_at(b, i);
}

void sto_block_iter_seek(sto_block_iter *it, st_slice target) {
    const sto_block *b = it->b;
    it->status = ST_OK;
    if (b->restarts == 0) {
        mark_invalid(it);
        return;
    }
    /* Binary search for the last restart whose key is < target, then scan forward. */
    uint32_t left = 0, right = b->n_restarts - 1;
    while (left < right) {
        uint32_t mid = left + (right - left + 1) / 2;
        st_slice k;
        if (!key_at_restart(b, mid, &k)) {
            corrupt(it, ST_DATA_LOSS);
            return;
        }
        if (st_slice_cmp(k, target) < 0)
            left = mid;
        else
            right = mid - 1;
    }
    seek_to_restart(it, left);
    while (parse_next(it)) {
        if (st_slice_cmp(st_buf_slice(&it->key), target) >= 0)
            return;
    }
}

void sto_block_iter_seek_first(sto_block_iter *it) {
    it->status = ST_OK;
    seek_to_restart(it, 0);
    parse_next(it);
}

void sto_block_iter_seek_last(sto_block_iter *it) {
    it->status = ST_OK;
    seek_to_restart(it, it->b->n_restarts - 1);
    while (parse_next(it) && it->next_off < it->b->restarts) {
    }
}

void sto_block_iter_next(sto_block_iter *it) {
    if (sto_block_iter_valid(it))
        parse_next(it);
}

void sto_block_iter_prev(sto_block_iter *it) {
    if (!sto_block_iter_valid(it))
        return;
    /* Entries only decode forward: back up to the restart before the current entry and scan. */
    uint32_t original = it->current;
    uint32_t r = it->restart_index < it->b->n_restarts ? it->restart_index : it->b->n_restarts - 1;
    while (restart_at(it->b, r) >= original) {
        if (r == 0) {
            mark_invalid(it);
            return;
        }
        r--;
    }
    seek_to_restart(it, r);
    while (parse_next(it) && it->next_off < original) {
    }
}
