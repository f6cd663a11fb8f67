/* sst.c — SSTable writer, reader and two-level iterator (see sst.h, docs/formats/sstable.md).
 *
 * File layout: data blocks | filter block | meta block | index block | footer (80 bytes).
 * Each block carries the 5-byte trailer of block.h. The footer is checked (magic, masked crc,
 * version, handle bounds) and the whole index is validated when a table opens, so the read path
 * can trust every block handle it takes from the index; data blocks are checked (crc, restart
 * array, entry bounds) every time they are read from disk. */
#include "sst.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "block.h"
#include "bloom.h"
#include "cache.h"
#include "key.h"

#define STO_SST_MAGIC 0x31545353415453ull /* "STASST1\0" little endian */
#define STO_SST_FORMAT_VERSION 1u
#define STO_SST_FOOTER_BYTES 80
#define STO_SST_BLOCK_BYTES_DEFAULT (16u << 10)
#define STO_SST_DCTX_POOL_MAX 16         /* idle decompression contexts kept per table */
#define STO_SST_INDEX_RESTART_INTERVAL 1 /* index keys uncompressed: pure binary search */
#define SST_STACK_READ_BYTES (24u << 10)
#define SST_FP_STRIDE 16 /* fingerprints per entry of the top level (128 bytes) */
#define SST_FP_MIN_ENTRIES                                                                         \
    64 /* smaller indexes are searched directly */ /* blocks up to this size are read into the     \
                                                      stack */
/* A scan that has asked for SST_READAHEAD_AFTER consecutive blocks reads the next ones with one
 * pread per window instead of one per block; the window starts at SST_READAHEAD_MIN_BYTES and
 * doubles up to SST_READAHEAD_BYTES (short scans do not copy much more than they use). */
#define SST_READAHEAD_AFTER 2
#define SST_READAHEAD_MIN_BYTES (16u << 10)
#define SST_READAHEAD_BYTES (128u << 10)

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

static void encode_footer(const sst_footer *f, uint8_t *p) {
    const sst_handle *hs[3] = {&f->index, &f->filter, &f->meta};
    for (int i = 0; i < 3; i++) {
        st_put_fixed64(p + 16 * i, hs[i]->off);
        st_put_fixed64(p + 16 * i + 8, hs[i]->size);
    }
    st_put_fixed64(p + FOOTER_ENTRIES, f->entries);
    st_put_fixed64(p + FOOTER_DATA_END, f->data_end);
    st_put_fixed32(p + FOOTER_VERSION, f->version);
    st_put_fixed32(p + FOOTER_CRC, st_crc_mask(st_crc32c(0, p, FOOTER_CRC)));
    st_put_fixed64(p + FOOTER_MAGIC, STO_SST_MAGIC);
}

static bool handle_ok(sst_handle h, uint64_t lo, uint64_t hi) {
    return h.off >= lo && h.off <= hi && h.size <= hi - h.off &&
           h.size + STO_BLOCK_TRAILER_BYTES <= hi - h.off && h.size <= STO_BLOCK_BYTES_MAX;
}

static st_code decode_footer(const uint8_t *p, uint64_t file_bytes, sst_footer *f, st_err *err) {
    if (st_get_fixed64(p + FOOTER_MAGIC) != STO_SST_MAGIC)
        return st_err_set(err, ST_DATA_LOSS, "bad magic number: not an SSTable or truncated");
    uint32_t want = st_crc_unmask(st_get_fixed32(p + FOOTER_CRC));
    if (st_crc32c(0, p, FOOTER_CRC) != want)
        return st_err_set(err, ST_DATA_LOSS, "footer checksum mismatch");
    sst_handle *hs[3] = {&f->index, &f->filter, &f->meta};
    for (int i = 0; i < 3; i++) {
        hs[i]->off = st_get_fixed64(p + 16 * i);
        hs[i]->size = st_get_fixed64(p + 16 * i + 8);
    }
    f->entries = st_get_fixed64(p + FOOTER_ENTRIES);
    f->data_end = st_get_fixed64(p + FOOTER_DATA_END);
    f->version = st_get_fixed32(p + FOOTER_VERSION);
    if (f->version != STO_SST_FORMAT_VERSION)
        return st_err_set(err, ST_DATA_LOSS, "unsupported format version %u (this build reads %u)",
                          f->version, STO_SST_FORMAT_VERSION);
    uint64_t limit = file_bytes - STO_SST_FOOTER_BYTES;
    if (f->data_end > limit || !handle_ok(f->index, f->data_end, limit) ||
        !handle_ok(f->filter, f->data_end, limit) || !handle_ok(f->meta, f->data_end, limit))
        return st_err_set(err, ST_DATA_LOSS, "footer block handles point outside the file");
    return ST_OK;
}

/* ======================== writer ======================== */

struct sto_sst_writer {
    st_env *env;
    char *path;
    st_wfile *f;
    size_t block_bytes;
    int zstd_level;
    ZSTD_CCtx *cctx;
    sto_block_builder data, index;
    sto_bloom_builder bloom;
    st_buf first_key, last_key, last_row, sealed, scratch;
    uint64_t offset, entries;
    uint64_t entry_bytes; /* keys and values added so far (data_restart_interval) */
    st_code failed;       /* sticky I/O or memory failure */
};

/* Entries of data blocks restart their key prefix compression about every this many bytes
 * (every STO_BLOCK_RESTART_INTERVAL entries at most, every 2 at least). A seek binary-searches
 * the restarts, then parses entries one by one: with ~1 KB values a 16 KiB block had a single
 * restart, so every point read parsed and copied ~8 keys per table it looked at (~10% of a
 * node's CPU per read). Small entries keep the usual interval, and so their prefix compression. */
#define SST_RESTART_SPAN_BYTES 2048

/* The restart interval for the current data block, from the table's mean entry so far. */
static int data_restart_interval(const sto_sst_writer *w) {
    uint64_t mean = w->entries ? w->entry_bytes / w->entries : 0;
    uint64_t n = mean ? SST_RESTART_SPAN_BYTES / mean : STO_BLOCK_RESTART_INTERVAL;
    if (n > STO_BLOCK_RESTART_INTERVAL)
        n = STO_BLOCK_RESTART_INTERVAL;
    return n < 2 ? 2 : (int)n;
}

static void writer_free(sto_sst_writer *w) {
    sto_block_builder_deinit(&w->data);
    sto_block_builder_deinit(&w->index);
    sto_bloom_builder_deinit(&w->bloom);
    st_buf_free(&w->first_key);
    st_buf_free(&w->last_key);
    st_buf_free(&w->last_row);
    st_buf_free(&w->sealed);
    st_buf_free(&w->scratch);
    ZSTD_freeCCtx(w->cctx);
    free(w->path);
    free(w);
}

st_code sto_sst_writer_new(st_env *env, const char *path, const sto_sst_options *o,
                           sto_sst_writer **out, st_err *err) {
    sto_sst_writer *w = calloc(1, sizeof(*w));
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating SSTable %s", path);
    }
    w->env = env;
    w->block_bytes = o && o->block_bytes ? o->block_bytes : STO_SST_BLOCK_BYTES_DEFAULT;
    w->zstd_level = o && o->zstd_level ? o->zstd_level : STO_SST_ZSTD_LEVEL_DEFAULT;
    sto_block_builder_init(&w->data, STO_BLOCK_RESTART_INTERVAL);
    sto_block_builder_init(&w->index, STO_SST_INDEX_RESTART_INTERVAL);
    sto_bloom_builder_init(&w->bloom, o ? o->bloom_bits_per_key : 0);
    if (w->zstd_level != STO_BLOCK_ZSTD_NONE && !(w->cctx = ZSTD_createCCtx())) {
        writer_free(w);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating SSTable %s", path);
    }
    st_code rc = env->ops->wopen(env, path, &w->f, err);
    if (rc != ST_OK) {
        st_err_prefix(err, "creating SSTable: ");
        writer_free(w);
        return rc;
    }
    *out = w;
    return ST_OK;
}

static st_code writer_fail(sto_sst_writer *w, st_code rc, st_err *err) {
    w->failed = rc;
    st_err_prefix(err, "writing SSTable %s: ", w->path);
    return rc;
}

/* Seals contents (compressing when level > 0) and appends it; *h receives its handle. */
static st_code write_block(sto_sst_writer *w, st_slice contents, int level, sst_handle *h,
                           st_err *err) {
    st_code rc = sto_block_seal(contents, w->cctx, level, &w->sealed, err);
    if (rc == ST_OK)
        rc = w->env->ops->append(w->f, w->sealed.data, w->sealed.len, err);
    if (rc != ST_OK)
        return rc;
    h->off = w->offset;
    h->size = w->sealed.len - STO_BLOCK_TRAILER_BYTES;
    w->offset += w->sealed.len;
    return ST_OK;
}

static st_code add_index_entry(sto_sst_writer *w, sst_handle h) {
    uint8_t v[2 * ST_VARINT64_MAX];
    size_t n = st_put_varint64(v, h.off);
    n += st_put_varint64(v + n, h.size);
    return sto_block_builder_add(&w->index, st_buf_slice(&w->last_key), st_slice_make(v, n));
}

static st_code flush_data_block(sto_sst_writer *w, st_err *err) {
    st_slice contents;
    sst_handle h;
    st_code rc = sto_block_builder_finish(&w->data, &contents);
    if (rc != ST_OK)
        return st_err_set(err, rc, "out of memory finishing a data block");
    rc = write_block(w, contents, w->zstd_level, &h, err);
    if (rc != ST_OK)
        return rc;
    /* The index key is the block's last key in full, so for_each_block can report real keys. */
    if ((rc = add_index_entry(w, h)) != ST_OK)
        return st_err_set(err, rc, "out of memory growing the index");
    sto_block_builder_reset(&w->data);
    return ST_OK;
}

/* Adds the row of key to the bloom filter the first time the row is seen. */
static st_code add_row_to_bloom(sto_sst_writer *w, st_slice key) {
    size_t plen = sto_key_row_prefix_len(key);
    st_slice row = plen ? st_slice_make(key.data, plen) : key; /* not an ikey: the whole key */
    if (w->entries > 0 && st_slice_eq(row, st_buf_slice(&w->last_row)))
        return ST_OK;
    st_buf_reset(&w->last_row);
    st_code rc = st_buf_append(&w->last_row, row.data, row.len);
    return rc != ST_OK ? rc : sto_bloom_builder_add(&w->bloom, row);
}

st_code sto_sst_writer_add(sto_sst_writer *w, st_slice ikey, st_slice value, st_err *err) {
    if (w->failed != ST_OK)
        return st_err_set(err, w->failed, "SSTable %s failed earlier; abandon it", w->path);
    if (w->entries > 0 && st_slice_cmp(ikey, st_buf_slice(&w->last_key)) <= 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "SSTable %s: keys must be added in strictly increasing order", w->path);
    st_code rc = add_row_to_bloom(w, ikey);
    if (rc == ST_OK)
        rc = sto_block_builder_add(&w->data, ikey, value);
    if (rc == ST_INVALID_ARGUMENT)
        return st_err_set(err, rc, "SSTable %s: entry of %zu + %zu bytes is too large", w->path,
                          ikey.len, value.len);
    if (rc == ST_OK && w->entries == 0)
        rc = st_buf_append(&w->first_key, ikey.data, ikey.len);
    if (rc == ST_OK) {
        st_buf_reset(&w->last_key);
        rc = st_buf_append(&w->last_key, ikey.data, ikey.len);
    }
    if (rc != ST_OK)
        return writer_fail(w, st_err_set(err, rc, "out of memory"), err);
    w->entries++;
    w->entry_bytes += ikey.len + value.len;
    if (w->data.entries == 1) /* a block's first entry: the rest read the interval */
        w->data.restart_interval = data_restart_interval(w);
    if (sto_block_builder_size(&w->data) >= w->block_bytes &&
        (rc = flush_data_block(w, err)) != ST_OK)
        return writer_fail(w, rc, err);
    return ST_OK;
}

uint64_t sto_sst_writer_bytes(sto_sst_writer *w) {
    return w->offset + (sto_block_builder_empty(&w->data) ? 0 : sto_block_builder_size(&w->data));
}

/* Meta block: varint-length-prefixed smallest and largest ikeys, then the entry count. */
static st_code write_meta(sto_sst_writer *w, sst_handle *h, st_err *err) {
    st_buf *m = &w->scratch;
    st_buf_reset(m);
    st_code rc = st_buf_append_varint64(m, w->first_key.len);
    if (rc == ST_OK)
        rc = st_buf_append(m, w->first_key.data, w->first_key.len);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(m, w->last_key.len);
    if (rc == ST_OK)
        rc = st_buf_append(m, w->last_key.data, w->last_key.len);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(m, w->entries);
    if (rc != ST_OK)
        return st_err_set(err, rc, "out of memory building the meta block");
    return write_block(w, st_buf_slice(m), 0, h, err);
}

static st_code write_tail(sto_sst_writer *w, st_err *err) {
    sst_footer f = {.entries = w->entries, .version = STO_SST_FORMAT_VERSION};
    st_code rc = ST_OK;
    if (!sto_block_builder_empty(&w->data) && (rc = flush_data_block(w, err)) != ST_OK)
        return rc;
    f.data_end = w->offset;
    st_buf_reset(&w->scratch);
    if ((rc = sto_bloom_builder_finish(&w->bloom, &w->scratch)) != ST_OK)
        return st_err_set(err, rc, "out of memory building the bloom filter");
    if ((rc = write_block(w, st_buf_slice(&w->scratch), 0, &f.filter, err)) != ST_OK ||
        (rc = write_meta(w, &f.meta, err)) != ST_OK)
        return rc;
    st_slice index;
    if ((rc = sto_block_builder_finish(&w->index, &index)) != ST_OK)
        return st_err_set(err, rc, "out of memory finishing the index");
    if ((rc = write_block(w, index, 0, &f.index, err)) != ST_OK)
        return rc;
    uint8_t footer[STO_SST_FOOTER_BYTES];
    encode_footer(&f, footer);
    if ((rc = w->env->ops->append(w->f, footer, sizeof(footer), err)) != ST_OK)
        return rc;
    w->offset += sizeof(footer);
    return w->env->ops->sync(w->f, err);
}

st_code sto_sst_writer_finish(sto_sst_writer *w, uint64_t *file_bytes, st_err *err) {
    st_code rc = w->failed;
    if (rc != ST_OK)
        st_err_set(err, rc, "SSTable %s failed earlier", w->path);
    else if ((rc = write_tail(w, err)) != ST_OK)
        st_err_prefix(err, "finishing SSTable %s: ", w->path);
    if (rc != ST_OK) {
        sto_sst_writer_abandon(w);
        return rc;
    }
    rc = w->env->ops->wclose(w->f, err);
    w->f = NULL;
    if (rc != ST_OK) {
        w->env->ops->remove(w->env, w->path, NULL);
        writer_free(w);
        return rc;
    }
    if (file_bytes)
        *file_bytes = w->offset;
    writer_free(w);
    return ST_OK;
}

void sto_sst_writer_abandon(sto_sst_writer *w) {
    if (!w)
        return;
    if (w->f)
        w->env->ops->wclose(w->f, NULL);
    w->env->ops->remove(w->env, w->path, NULL);
    writer_free(w);
}

/* ======================== reader ======================== */

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
     * validate_index checked it), so iterators move between blocks by number without decoding
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

static st_code read_exact(sto_sst *t, uint64_t off, void *buf, size_t len, st_err *err) {
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

/* Reads, checks and decompresses the block at h into *mem (see unseal_copy). Small blocks are
 * read into a stack buffer, so a compressed block costs one allocation, not two. */
static st_code read_block_into(sto_sst *t, sst_handle h, size_t prefix, bool pooled, uint8_t **mem,
                               size_t *bytes, st_slice *contents, st_err *err) {
    size_t n = (size_t)h.size + STO_BLOCK_TRAILER_BYTES;
    uint8_t stack[SST_STACK_READ_BYTES];
    uint8_t *raw = n <= sizeof stack ? stack : malloc(n);
    if (!raw)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading a %zu-byte block", n);
    st_code rc = read_exact(t, h.off, raw, n, err);
    if (rc == ST_OK)
        rc = unseal_copy(t, raw, n, prefix, pooled, mem, bytes, contents, err);
    if (raw != stack)
        free(raw);
    return rc;
}

/* The index, filter and meta blocks: malloc'd, kept while the table is open. */
static st_code read_block(sto_sst *t, sst_handle h, size_t prefix, uint8_t **mem,
                          st_slice *contents, st_err *err) {
    size_t bytes;
    return read_block_into(t, h, prefix, false, mem, &bytes, contents, err);
}

static bool decode_handle(st_slice v, sst_handle *h) {
    const uint8_t *p = v.data, *end = v.data + v.len;
    return st_get_varint64(&p, end, &h->off) && st_get_varint64(&p, end, &h->size) && p == end;
}

/* Checks every index entry once at open: ordered keys and in-bounds, ordered data blocks. */
static st_code validate_index(sto_sst *t, st_err *err) {
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &t->index);
    uint64_t next_off = 0, blocks = 0;
    st_buf prev;
    st_buf_init(&prev);
    st_code rc = ST_OK;
    for (sto_block_iter_seek_first(&it); rc == ST_OK && sto_block_iter_valid(&it);
         sto_block_iter_next(&it), blocks++) {
        sst_handle h;
        st_slice k = sto_block_iter_key(&it);
        if (!decode_handle(it.value, &h) || h.off != next_off ||
            !handle_ok(h, next_off, t->data_end) ||
            (blocks && st_slice_cmp(k, st_buf_slice(&prev)) <= 0))
            rc = st_err_set(err, ST_DATA_LOSS, "index entry %llu is invalid",
                            (unsigned long long)blocks);
        next_off = h.off + h.size + STO_BLOCK_TRAILER_BYTES;
        st_buf_reset(&prev);
        if (rc == ST_OK && st_buf_append(&prev, k.data, k.len) != ST_OK)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory checking the index");
    }
    if (rc == ST_OK && it.status != ST_OK)
        rc = st_err_set(err, ST_DATA_LOSS, "index block has a malformed entry");
    if (rc == ST_OK && next_off != t->data_end)
        rc = st_err_set(err, ST_DATA_LOSS, "index does not cover the data blocks");
    sto_block_iter_deinit(&it);
    st_buf_free(&prev);
    return rc;
}

static st_code parse_meta(sto_sst *t, st_slice m, uint64_t footer_entries, st_err *err) {
    const uint8_t *p = m.data, *end = m.data + m.len;
    uint64_t entries;
    if (!st_get_len_prefixed(&p, end, &t->smallest) || !st_get_len_prefixed(&p, end, &t->largest) ||
        !st_get_varint64(&p, end, &entries) || entries != footer_entries)
        return st_err_set(err, ST_DATA_LOSS, "meta block is malformed");
    if (entries > 0 && st_slice_cmp(t->smallest, t->largest) > 0)
        return st_err_set(err, ST_DATA_LOSS, "meta block has smallest key > largest key");
    return ST_OK;
}

/* ---- index search through fingerprints ----
 * A point read's cost was dominated by the binary search of the index of a big table: ~15
 * cache-missing key decodes and memcmps. The fingerprints of one 8-byte word per entry
 * narrow the search to the entries that share the target's word, usually one or two. */

static uint64_t fp_of(st_slice k, size_t cp) {
    uint64_t v = 0;
    for (size_t i = 0; i < 8; i++)
        v = (v << 8) | (cp + i < k.len ? k.data[cp + i] : 0u);
    return v;
}

/* Keys ordered by memcmp that all start with the same cp bytes have non-decreasing
 * fingerprints, so fp[i] < fp(target) proves key i < target and fp[i] > fp(target) proves
 * key i > target. Any surprise (an entry that is not its own restart) leaves fp NULL. */
static void fp_build(sto_sst *t) {
    const sto_block *b = &t->index;
    uint32_t n = b->restarts ? b->n_restarts : 0;
    st_slice first, last;
    if (n < SST_FP_MIN_ENTRIES || !sto_block_restart_key(b, 0, &first) ||
        !sto_block_restart_key(b, n - 1, &last))
        return;
    size_t cp = 0;
    while (cp < first.len && cp < last.len && first.data[cp] == last.data[cp])
        cp++;
    uint32_t n_top = (n + SST_FP_STRIDE - 1) / SST_FP_STRIDE;
    size_t words = (size_t)n + n_top + (size_t)n + 1; /* fp, fp_top, offs */
    uint64_t *fp = malloc(words * sizeof *fp);
    if (!fp)
        return; /* plain binary search then */
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, b);
    uint32_t i = 0;
    for (sto_block_iter_seek_first(&it); sto_block_iter_valid(&it); sto_block_iter_next(&it), i++) {
        sst_handle h;
        if (i >= n || it.current != sto_block_restart_offset(b, i) || !decode_handle(it.value, &h))
            break;
        fp[i] = fp_of(sto_block_iter_key(&it), cp);
        fp[(size_t)n + n_top + i] = h.off;
    }
    bool ok = i == n && it.status == ST_OK;
    sto_block_iter_deinit(&it);
    if (!ok) {
        free(fp);
        return;
    }
    t->fp = fp;
    t->fp_top = fp + n;
    t->n_top = n_top;
    for (uint32_t j = 0; j < n_top; j++)
        t->fp_top[j] = fp[(size_t)j * SST_FP_STRIDE];
    t->offs = t->fp_top + n_top;
    t->offs[n] = t->data_end;
    t->fp_prefix = st_slice_make(first.data, cp);
    t->mem_bytes += words * sizeof *fp;
}

/* The index of the first entry whose key is >= target (n when none). */
static uint32_t fp_search(const sto_sst *t, st_slice target) {
    const sto_block *b = &t->index;
    uint32_t n = b->n_restarts;
    size_t cp = t->fp_prefix.len;
    int c = memcmp(target.data, t->fp_prefix.data, target.len < cp ? target.len : cp);
    if (c < 0 || (c == 0 && target.len < cp))
        return 0; /* below every key */
    if (c > 0)
        return n; /* above every key */
    uint64_t f = fp_of(target, cp);
    /* First the top level (every SST_FP_STRIDE-th fingerprint, small enough to stay in the CPU
     * cache), then one stride of fp (two cache lines): a binary search over all of fp missed
     * the cache at nearly every step on big tables. */
    uint32_t lo = 0, hi = t->n_top; /* first top >= f */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->fp_top[mid] < f)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0) {                                    /* else fp[0] >= f: the answer is 0 */
        hi = lo < t->n_top ? lo * SST_FP_STRIDE : n; /* fp[hi] >= f or hi == n */
        lo = (lo - 1) * SST_FP_STRIDE + 1;           /* fp[lo - 1] < f */
    }
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->fp[mid] < f)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t end = lo; /* first fp > f */
    while (end < n && t->fp[end] == f && end - lo < 4)
        end++;
    if (end < n && t->fp[end] == f) {
        uint32_t l2 = end, h2 = n;
        while (l2 < h2) {
            uint32_t mid = l2 + (h2 - l2) / 2;
            if (t->fp[mid] <= f)
                l2 = mid + 1;
            else
                h2 = mid;
        }
        end = l2;
    }
    while (lo < end) { /* keys in [lo, end) share the word: compare them in full */
        uint32_t mid = lo + (end - lo) / 2;
        st_slice k;
        if (!sto_block_restart_key(b, mid, &k))
            return mid; /* cannot happen after fp_build; the block iterator reports it */
        if (st_slice_cmp(k, target) < 0)
            lo = mid + 1;
        else
            end = mid;
    }
    return lo;
}

static st_code load_hot_blocks(sto_sst *t, const sst_footer *f, st_err *err) {
    st_slice c;
    st_code rc = read_block(t, f->index, 0, &t->index_mem, &c, err);
    if (rc == ST_OK)
        t->mem_bytes += c.len;
    if (rc == ST_OK && (rc = sto_block_parse(c, &t->index, err)) == ST_OK)
        rc = validate_index(t, err);
    if (rc == ST_OK)
        fp_build(t);
    if (rc == ST_OK &&
        (rc = read_block(t, f->filter, 0, &t->filter_mem, &t->filter, err)) == ST_OK) {
        t->mem_bytes += t->filter.len;
        if (!sto_bloom_valid(t->filter))
            rc = st_err_set(err, ST_DATA_LOSS, "bloom filter block is malformed");
    }
    if (rc == ST_OK && (rc = read_block(t, f->meta, 0, &t->meta_mem, &c, err)) == ST_OK) {
        t->mem_bytes += c.len;
        rc = parse_meta(t, c, f->entries, err);
    }
    return rc;
}

static void sst_destroy(sto_sst *t) {
    if (t->file)
        t->env->ops->rclose(t->file);
    if (atomic_load(&t->obsolete) && t->path) {
        st_err e;
        if (t->env->ops->remove(t->env, t->path, &e) != ST_OK)
            st_log(ST_LOG_WARN, "sst", "event=remove_failed path=%s err=\"%s\"", t->path, e.msg);
    }
    free(t->index_mem);
    free(t->fp);
    free(t->filter_mem);
    free(t->meta_mem);
    free(t->path);
    free(t);
}

static st_code open_file(sto_sst *t, st_err *err) {
    st_code rc = t->env->ops->ropen(t->env, t->path, &t->file, err);
    if (rc == ST_OK)
        rc = t->env->ops->rsize(t->file, &t->file_bytes, err);
    if (rc != ST_OK)
        return rc;
    if (t->file_bytes < STO_SST_FOOTER_BYTES)
        return st_err_set(err, ST_DATA_LOSS, "file of %llu bytes is too short for a footer",
                          (unsigned long long)t->file_bytes);
    uint8_t buf[STO_SST_FOOTER_BYTES];
    sst_footer f;
    if ((rc = read_exact(t, t->file_bytes - sizeof(buf), buf, sizeof(buf), err)) != ST_OK ||
        (rc = decode_footer(buf, t->file_bytes, &f, err)) != ST_OK)
        return rc;
    t->entries = f.entries;
    t->data_end = f.data_end;
    return load_hot_blocks(t, &f, err);
}

st_code sto_sst_open(st_env *env, const char *path, uint64_t id, sto_cache *cache, sto_sst **out,
                     st_err *err) {
    sto_sst *t = calloc(1, sizeof(*t));
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening SSTable %s", path);
    }
    t->env = env;
    t->id = id;
    t->cache = cache;
    atomic_init(&t->refs, 1);
    atomic_init(&t->obsolete, false);
    st_code rc = open_file(t, err);
    if (rc != ST_OK) {
        st_err_prefix(err, "opening SSTable %s: ", path);
        sst_destroy(t);
        return rc;
    }
    *out = t;
    return ST_OK;
}

void sto_sst_ref(sto_sst *t) {
    atomic_fetch_add(&t->refs, 1);
}

void sto_sst_unref(sto_sst *t) {
    if (t && atomic_fetch_sub(&t->refs, 1) == 1)
        sst_destroy(t);
}

void sto_sst_mark_obsolete(sto_sst *t) {
    atomic_store(&t->obsolete, true);
}
uint64_t sto_sst_file_bytes(const sto_sst *t) {
    return t->file_bytes;
}
size_t sto_sst_memory_bytes(const sto_sst *t) {
    return t->mem_bytes + sizeof(*t);
}
uint64_t sto_sst_entries(const sto_sst *t) {
    return t->entries;
}
st_slice sto_sst_smallest(const sto_sst *t) {
    return t->smallest;
}
st_slice sto_sst_largest(const sto_sst *t) {
    return t->largest;
}

bool sto_sst_may_contain_row(sto_sst *t, st_slice row_prefix) {
    return sto_bloom_may_contain(t->filter, row_prefix);
}

uint64_t sto_sst_approx_offset(sto_sst *t, st_slice ikey) {
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &t->index);
    sto_block_iter_seek(&it, ikey);
    sst_handle h;
    uint64_t off = t->data_end;
    if (sto_block_iter_valid(&it) && decode_handle(it.value, &h))
        off = h.off;
    sto_block_iter_deinit(&it);
    return off;
}

void sto_sst_for_each_block(sto_sst *t,
                            void (*fn)(st_slice last_ikey, uint64_t end_offset, void *arg),
                            void *arg) {
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &t->index);
    sst_handle h;
    for (sto_block_iter_seek_first(&it); sto_block_iter_valid(&it); sto_block_iter_next(&it)) {
        if (decode_handle(it.value, &h))
            fn(sto_block_iter_key(&it), h.off + h.size + STO_BLOCK_TRAILER_BYTES, arg);
    }
    sto_block_iter_deinit(&it);
}

/* ======================== data blocks through the cache ======================== */

/* A parsed data block; its contents follow the struct in the same allocation, which came from
 * the block pool of `pool` (the table's cache). */
typedef struct sst_blk {
    sto_block block;
    sto_cache *pool;
    size_t bytes;            /* as asked from the pool */
    sto_cache_handle handle; /* the block's cache entry (sto_cache_insert_embedded) */
} sst_blk;

static void blk_delete(void *v) {
    sst_blk *b = v;
    sto_cache_buf_put(b->pool, b, b->bytes);
}

/* An iterator's read-ahead window (sequential scans); win is allocated at the first use. */
typedef struct sst_readahead {
    st_buf win; /* file bytes [win_off, win_off + win.len) */
    uint64_t win_off;
    uint64_t next_off; /* where the block after the last one asked for starts */
    int run;           /* consecutive blocks asked for in file order */
    size_t size;       /* the next window's size (0 = SST_READAHEAD_MIN_BYTES) */
} sst_readahead;

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
    return read_block_into(t, h, prefix, true, mem, bytes, c, err);
}

/* ---- the keep slot (sst.h) ---- */

void sto_sst_keep_init(sto_sst_keep *k) {
    atomic_init(&k->slot, NULL);
    atomic_init(&k->bytes, 0);
}

/* h: a private handle (not in any cache), or NULL. */
static void keep_drop(sto_cache_handle *h) {
    if (h)
        sto_cache_release(NULL, h);
}

void sto_sst_keep_deinit(sto_sst_keep *k) {
    keep_drop(atomic_exchange(&k->slot, NULL));
}

uint64_t sto_sst_keep_bytes_read(sto_sst_keep *k) {
    return atomic_load_explicit(&k->bytes, memory_order_relaxed);
}

/* Leaves the private block h in the slot, dropping the one it replaces. */
static void keep_put(sto_sst_keep *k, sto_cache_handle *h) {
    keep_drop(atomic_exchange(&k->slot, h));
}

/* The kept block (id, off), taken out of the slot, or NULL. Another block found there is put
 * back (unless the slot was refilled meanwhile: then the newer one stays). */
static sto_cache_handle *keep_take(sto_sst_keep *k, uint64_t id, uint64_t off) {
    if (!k || !atomic_load_explicit(&k->slot, memory_order_relaxed))
        return NULL;
    sto_cache_handle *h = atomic_exchange(&k->slot, NULL);
    if (!h || (h->id == id && h->off == off))
        return h;
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&k->slot, &none, h))
        keep_drop(h);
    return NULL;
}

static void note_read(sto_sst *t, sto_sst_keep *k, size_t bytes) {
    sto_cache_note_read(t->cache, bytes);
    if (k)
        atomic_fetch_add_explicit(&k->bytes, bytes, memory_order_relaxed);
}

/* Returns a handle on the data block at h, from the cache, from keep (may be NULL) or read from
 * disk; *owner receives the cache the handle must be released to (NULL for a block read but not
 * cached). ra (NULL = none) tracks sequential reads for read-ahead. */
static st_code get_block(sto_sst *t, bool fill_cache, sto_sst_keep *keep, sst_readahead *ra,
                         sst_handle h, sto_cache_handle **out, sto_cache **owner, st_err *err) {
    if (ra) {
        ra->run = h.off == ra->next_off ? ra->run + 1 : 0;
        ra->next_off = h.off + h.size + STO_BLOCK_TRAILER_BYTES;
    }
    sto_cache_handle *ch = keep_take(keep, t->id, h.off);
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
                    : read_block_into(t, h, sizeof(sst_blk), true, &mem, &bytes, &c, err);
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

/* ======================== the two-level iterator ======================== */

typedef struct sst_iter {
    sto_kviter base;
    sto_sst *t;
    bool fill_cache;    /* false for scans that should not evict what point reads need */
    sto_sst_keep *keep; /* where uncached blocks go when let go (NULL = dropped) */
    sto_block_iter index_it, data_it; /* index_it unused when t->offs is set */
    uint32_t bi;          /* with t->offs: the current block's number (n_restarts = none) */
    sto_cache_handle *ch; /* current data block */
    sto_cache *ch_owner;  /* where ch is released: t->cache, or NULL for a private block */
    uint64_t blk_off;
    sst_readahead ra;
    st_code status;
    st_err err;
} sst_iter;

static void release_block(sst_iter *it) {
    if (it->ch && it->keep && !it->ch_owner) /* a private block: not in the cache */
        keep_put(it->keep, it->ch);
    else if (it->ch)
        sto_cache_release(it->ch_owner, it->ch);
    it->ch = NULL;
    it->data_it.b = NULL;
}

static void iter_fail(sst_iter *it, st_code rc) {
    if (it->status == ST_OK) {
        it->status = rc;
        st_err_prefix(&it->err, "reading SSTable %s: ", it->t->path);
    }
    release_block(it);
}

/* ---- the position among the data blocks: a block number with t->offs, else index_it ---- */

static void pos_seek(sst_iter *it, st_slice target) {
    if (it->t->offs)
        it->bi = fp_search(it->t, target);
    else
        sto_block_iter_seek(&it->index_it, target); /* small index: no fingerprints */
}

static void pos_first(sst_iter *it) {
    if (it->t->offs)
        it->bi = 0; /* offs implies at least SST_FP_MIN_ENTRIES blocks */
    else
        sto_block_iter_seek_first(&it->index_it);
}

static void pos_last(sst_iter *it) {
    if (it->t->offs)
        it->bi = it->t->index.n_restarts - 1;
    else
        sto_block_iter_seek_last(&it->index_it);
}

static void pos_next(sst_iter *it) {
    if (!it->t->offs)
        sto_block_iter_next(&it->index_it);
    else if (it->bi < it->t->index.n_restarts)
        it->bi++;
}

static void pos_prev(sst_iter *it) {
    uint32_t n = it->t->index.n_restarts;
    if (!it->t->offs)
        sto_block_iter_prev(&it->index_it);
    else
        it->bi = it->bi == 0 || it->bi >= n ? n : it->bi - 1;
}

/* The handle of the block at the position: 1, 0 past the end, -1 (status set) on corruption. */
static int pos_handle(sst_iter *it, sst_handle *h) {
    const sto_sst *t = it->t;
    if (t->offs) {
        if (it->bi >= t->index.n_restarts)
            return 0;
        h->off = t->offs[it->bi];
        h->size = t->offs[it->bi + 1] - h->off - STO_BLOCK_TRAILER_BYTES;
        return 1;
    }
    if (!sto_block_iter_valid(&it->index_it)) {
        if (it->index_it.status == ST_OK)
            return 0;
        iter_fail(it, st_err_set(&it->err, ST_DATA_LOSS, "malformed index entry"));
        return -1;
    }
    if (!decode_handle(it->index_it.value, h)) {
        iter_fail(it, st_err_set(&it->err, ST_DATA_LOSS, "malformed block handle in the index"));
        return -1;
    }
    return 1;
}

/* Points data_it at the block at the position; false at the end or on error. */
static bool load_data_block(sst_iter *it) {
    sst_handle h;
    int got = pos_handle(it, &h);
    if (got <= 0) {
        release_block(it);
        return false;
    }
    if (it->ch && it->blk_off == h.off) {
        sto_block_iter_set(&it->data_it, &((sst_blk *)sto_cache_value(it->ch))->block);
        return true;
    }
    release_block(it);
    st_code rc =
        get_block(it->t, it->fill_cache, it->keep, &it->ra, h, &it->ch, &it->ch_owner, &it->err);
    if (rc != ST_OK) {
        st_err_prefix(&it->err, "block at offset %llu: ", (unsigned long long)h.off);
        iter_fail(it, rc);
        return false;
    }
    it->blk_off = h.off;
    sto_block_iter_set(&it->data_it, &((sst_blk *)sto_cache_value(it->ch))->block);
    return true;
}

/* A data-block iterator that stopped on a malformed entry fails the whole iterator. */
static bool data_ok(sst_iter *it) {
    if (it->data_it.b && it->data_it.status != ST_OK) {
        st_code rc = it->data_it.status;
        iter_fail(it, st_err_set(&it->err, rc, "malformed entry in the block at offset %llu",
                                 (unsigned long long)it->blk_off));
        return false;
    }
    return it->status == ST_OK;
}

static bool data_valid(sst_iter *it) {
    return it->status == ST_OK && it->data_it.b && sto_block_iter_valid(&it->data_it);
}

static void skip_forward(sst_iter *it) {
    while (data_ok(it) && !data_valid(it)) {
        pos_next(it);
        if (!load_data_block(it))
            return;
        sto_block_iter_seek_first(&it->data_it);
    }
}

static void skip_backward(sst_iter *it) {
    while (data_ok(it) && !data_valid(it)) {
        pos_prev(it);
        if (!load_data_block(it))
            return;
        sto_block_iter_seek_last(&it->data_it);
    }
}

static void it_seek(sto_kviter *base, st_slice target) {
    sst_iter *it = (sst_iter *)base;
    if (it->status != ST_OK)
        return;
    pos_seek(it, target);
    if (load_data_block(it)) {
        sto_block_iter_seek(&it->data_it, target);
        skip_forward(it);
    }
}

static void it_seek_first(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    if (it->status != ST_OK)
        return;
    pos_first(it);
    if (load_data_block(it)) {
        sto_block_iter_seek_first(&it->data_it);
        skip_forward(it);
    }
}

static void it_seek_last(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    if (it->status != ST_OK)
        return;
    pos_last(it);
    if (load_data_block(it)) {
        sto_block_iter_seek_last(&it->data_it);
        skip_backward(it);
    }
}

static void it_next(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    if (!data_valid(it))
        return;
    sto_block_iter_next(&it->data_it);
    skip_forward(it);
}

static void it_prev(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    if (!data_valid(it))
        return;
    sto_block_iter_prev(&it->data_it);
    skip_backward(it);
}

static bool it_valid(sto_kviter *base) {
    return data_valid((sst_iter *)base);
}

static st_slice it_key(sto_kviter *base) {
    return sto_block_iter_key(&((sst_iter *)base)->data_it);
}

static st_slice it_value(sto_kviter *base) {
    return ((sst_iter *)base)->data_it.value;
}

static st_code it_status(sto_kviter *base, st_err *err) {
    sst_iter *it = (sst_iter *)base;
    if (it->status != ST_OK && err)
        *err = it->err;
    return it->status;
}

/* ---- iterator reuse ----
 * A point read creates and frees a table iterator; each thread keeps up to SST_ITER_KEEP freed
 * ones (with their key buffers) for its next reads, so a read allocates nothing here. The
 * thread's end frees them. */
#define SST_ITER_KEEP 4
#define SST_ITER_KEEP_WIN_BYTES (32u << 10) /* bigger buffers are not kept */

typedef struct sst_iter_stash {
    struct sst_iter *v[SST_ITER_KEEP];
    int n;
} sst_iter_stash;

static pthread_key_t stash_key;
static bool stash_key_ok;
static pthread_once_t stash_once = PTHREAD_ONCE_INIT;

static void iter_destroy(sst_iter *it) {
    sto_block_iter_deinit(&it->index_it);
    sto_block_iter_deinit(&it->data_it);
    st_buf_free(&it->ra.win);
    free(it);
}

static void stash_free(void *p) {
    sst_iter_stash *st = p;
    for (int i = 0; i < st->n; i++)
        iter_destroy(st->v[i]);
    free(st);
}

static void stash_key_init(void) {
    stash_key_ok = pthread_key_create(&stash_key, stash_free) == 0;
}

static sst_iter_stash *stash_get(bool create) {
    pthread_once(&stash_once, stash_key_init);
    if (!stash_key_ok)
        return NULL;
    sst_iter_stash *st = pthread_getspecific(stash_key);
    if (!st && create && (st = calloc(1, sizeof *st)) != NULL &&
        pthread_setspecific(stash_key, st) != 0) {
        free(st);
        st = NULL;
    }
    return st;
}

static void it_free(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    release_block(it);
    sto_sst_unref(it->t);
    it->t = NULL;
    if (it->ra.win.cap > SST_ITER_KEEP_WIN_BYTES)
        st_buf_free(&it->ra.win);
    bool small = it->index_it.key.cap <= SST_ITER_KEEP_WIN_BYTES &&
                 it->data_it.key.cap <= SST_ITER_KEEP_WIN_BYTES;
    sst_iter_stash *st = small ? stash_get(true) : NULL;
    if (st && st->n < SST_ITER_KEEP) {
        st->v[st->n++] = it;
        return;
    }
    iter_destroy(it);
}

static const sto_kviter_ops sst_iter_ops = {
    .seek = it_seek,
    .seek_first = it_seek_first,
    .seek_last = it_seek_last,
    .next = it_next,
    .prev = it_prev,
    .valid = it_valid,
    .key = it_key,
    .value = it_value,
    .status = it_status,
    .free = it_free,
};

/* A kept iterator, reset to what calloc + init would give (buffers kept, emptied). */
static sst_iter *iter_take(void) {
    sst_iter_stash *st = stash_get(false);
    if (!st || st->n == 0)
        return NULL;
    sst_iter *it = st->v[--st->n];
    st_buf ik = it->index_it.key, dk = it->data_it.key, win = it->ra.win;
    memset(it, 0, sizeof *it);
    it->index_it.key = ik;
    it->data_it.key = dk;
    it->ra.win = win;
    it->index_it.key.len = it->data_it.key.len = it->ra.win.len = 0;
    return it;
}

static sto_kviter *iter_new(sto_sst *t, bool fill_cache, sto_sst_keep *keep) {
    sst_iter *it = iter_take();
    if (!it) {
        if (!(it = calloc(1, sizeof(*it))))
            return NULL;
        sto_block_iter_init(&it->index_it);
        sto_block_iter_init(&it->data_it);
        st_buf_init(&it->ra.win);
    }
    it->base.ops = &sst_iter_ops;
    it->t = t;
    it->fill_cache = fill_cache;
    it->keep = keep;
    sto_sst_ref(t);
    it->ra.next_off = UINT64_MAX;
    sto_block_iter_set(&it->index_it, &t->index);
    return &it->base;
}

sto_kviter *sto_sst_iter_new(sto_sst *t) {
    return iter_new(t, true, NULL);
}
sto_kviter *sto_sst_iter_new_kept(sto_sst *t, sto_sst_keep *k) {
    return iter_new(t, true, k);
}
sto_kviter *sto_sst_iter_new_scan(sto_sst *t) {
    return iter_new(t, false, NULL);
}

/* ======================== concatenation of disjoint tables ======================== */

/* Tables with disjoint key ranges, ascending, read as one stream with only the table under the
 * position open: a seek reads a block of one table instead of one block of every table a
 * merge would hold (LevelDB's level iterator). */
typedef struct concat_iter {
    sto_kviter base;
    sto_sst **tabs;
    bool *wrap;
    size_t n, cur; /* cur: index of the open child (meaningless when child is NULL) */
    sto_kviter *child;
    st_buf lo, hi;
    sto_sst_wrap_fn wrap_fn;
    sto_sst_keep *keep;
    st_code status;
    st_err err;
} concat_iter;

static void cc_fail(concat_iter *c, st_code rc, const char *what) {
    if (c->status == ST_OK) {
        c->status = rc;
        st_err_set(&c->err, rc, "%s", what);
    }
}

static void cc_close(concat_iter *c) {
    if (c->child)
        c->child->ops->free(c->child);
    c->child = NULL;
}

/* Opens table i as the child; false (status set) when memory runs out. */
static bool cc_open(concat_iter *c, size_t i) {
    cc_close(c);
    sto_kviter *it = sto_sst_iter_new_kept(c->tabs[i], c->keep);
    if (it && c->wrap[i])
        it = c->wrap_fn(it, st_buf_slice(&c->lo), st_buf_slice(&c->hi));
    if (!it) {
        cc_fail(c, ST_RESOURCE_EXHAUSTED, "out of memory opening an SSTable iterator");
        return false;
    }
    c->child = it;
    c->cur = i;
    return true;
}

/* A child at its end moves on to the next table; a child with an error stops everything. */
static void cc_skip_forward(concat_iter *c) {
    while (c->child && !c->child->ops->valid(c->child)) {
        if (c->child->ops->status(c->child, NULL) != ST_OK || c->cur + 1 >= c->n) {
            if (c->child->ops->status(c->child, NULL) == ST_OK)
                cc_close(c);
            return;
        }
        if (!cc_open(c, c->cur + 1))
            return;
        c->child->ops->seek_first(c->child);
    }
}

static void cc_skip_backward(concat_iter *c) {
    while (c->child && !c->child->ops->valid(c->child)) {
        if (c->child->ops->status(c->child, NULL) != ST_OK || c->cur == 0) {
            if (c->child->ops->status(c->child, NULL) == ST_OK)
                cc_close(c);
            return;
        }
        if (!cc_open(c, c->cur - 1))
            return;
        c->child->ops->seek_last(c->child);
    }
}

static bool cc_ok(concat_iter *c) {
    if (c->status != ST_OK)
        return false;
    if (c->child && c->child->ops->status(c->child, NULL) != ST_OK)
        return false;
    return true;
}

static void cc_seek(sto_kviter *base, st_slice target) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c))
        return;
    size_t lo = 0, hi = c->n; /* first table whose largest key is >= target */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (st_slice_cmp(sto_sst_largest(c->tabs[mid]), target) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == c->n) {
        cc_close(c);
        return;
    }
    if (!(c->child && c->cur == lo) && !cc_open(c, lo))
        return;
    c->child->ops->seek(c->child, target);
    cc_skip_forward(c);
}

static void cc_seek_first(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c) || c->n == 0 || (!(c->child && c->cur == 0) && !cc_open(c, 0)))
        return;
    c->child->ops->seek_first(c->child);
    cc_skip_forward(c);
}

static void cc_seek_last(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c) || c->n == 0 || (!(c->child && c->cur == c->n - 1) && !cc_open(c, c->n - 1)))
        return;
    c->child->ops->seek_last(c->child);
    cc_skip_backward(c);
}

static bool cc_valid(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->status == ST_OK && c->child && c->child->ops->valid(c->child);
}

static void cc_next(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_valid(base))
        return;
    c->child->ops->next(c->child);
    cc_skip_forward(c);
}

static void cc_prev(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_valid(base))
        return;
    c->child->ops->prev(c->child);
    cc_skip_backward(c);
}

static st_slice cc_key(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->child->ops->key(c->child);
}

static st_slice cc_value(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->child->ops->value(c->child);
}

static st_code cc_status(sto_kviter *base, st_err *err) {
    concat_iter *c = (concat_iter *)base;
    if (c->status != ST_OK) {
        if (err)
            *err = c->err;
        return c->status;
    }
    return c->child ? c->child->ops->status(c->child, err) : ST_OK;
}

static void cc_free(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    cc_close(c);
    for (size_t i = 0; i < c->n; i++)
        sto_sst_unref(c->tabs[i]);
    st_buf_free(&c->lo);
    st_buf_free(&c->hi);
    free(c);
}

static const sto_kviter_ops concat_ops = {
    .seek = cc_seek,
    .seek_first = cc_seek_first,
    .seek_last = cc_seek_last,
    .next = cc_next,
    .prev = cc_prev,
    .valid = cc_valid,
    .key = cc_key,
    .value = cc_value,
    .status = cc_status,
    .free = cc_free,
};

static int cc_cmp_smallest(const void *a, const void *b) {
    const sto_sst *x = *(sto_sst *const *)a, *y = *(sto_sst *const *)b;
    return st_slice_cmp(sto_sst_smallest(x), sto_sst_smallest(y));
}

bool sto_sst_disjoint(const sto_sst *a, const sto_sst *b) {
    return st_slice_cmp(sto_sst_largest(a), sto_sst_smallest(b)) < 0 ||
           st_slice_cmp(sto_sst_largest(b), sto_sst_smallest(a)) < 0;
}

sto_kviter *sto_sst_concat_iter_new(sto_sst *const *tables, const bool *wrap, size_t n, st_slice lo,
                                    st_slice hi, sto_sst_wrap_fn wrap_fn, sto_sst_keep *keep) {
    if (n == 0 || n > STO_SST_CONCAT_MAX)
        return NULL;
    /* One allocation: the iterator, then the tables (sorted), then their wrap flags. */
    concat_iter *c = calloc(1, sizeof *c + n * (sizeof(sto_sst *) + sizeof(bool)));
    if (!c)
        return NULL;
    c->base.ops = &concat_ops;
    c->tabs = (sto_sst **)(void *)(c + 1);
    c->wrap = (bool *)(void *)(c->tabs + n);
    c->n = n;
    c->wrap_fn = wrap_fn;
    c->keep = keep;
    st_buf_init(&c->lo);
    st_buf_init(&c->hi);
    memcpy(c->tabs, tables, n * sizeof *c->tabs);
    qsort(c->tabs, n, sizeof *c->tabs, cc_cmp_smallest);
    bool need_bounds = false;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0; /* the flag travels with its table through the sort */
        while (tables[j] != c->tabs[i])
            j++;
        c->wrap[i] = wrap ? wrap[j] : false;
        need_bounds = need_bounds || c->wrap[i];
        ST_ASSERT(i == 0 || sto_sst_disjoint(c->tabs[i - 1], c->tabs[i]));
    }
    if (need_bounds && (!wrap_fn || (lo.len && st_buf_append(&c->lo, lo.data, lo.len) != ST_OK) ||
                        (hi.len && st_buf_append(&c->hi, hi.data, hi.len) != ST_OK))) {
        st_buf_free(&c->lo);
        st_buf_free(&c->hi);
        free(c);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        sto_sst_ref(c->tabs[i]);
    return &c->base;
}
