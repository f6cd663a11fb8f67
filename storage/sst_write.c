/* sst_write.c — writing an SSTable: data blocks as entries arrive, then the filter, meta and
 * index blocks and the footer (format: docs/formats/sstable.md). */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "bloom.h"
#include "key.h"
#include "sst_impl.h"

#define STO_SST_BLOCK_BYTES_DEFAULT (16u << 10)
#define STO_SST_INDEX_RESTART_INTERVAL 1 /* index keys uncompressed: pure binary search */

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
