/* sst.c — opening an SSTable: the footer, the hot blocks (index, filter, meta) it keeps in
 * memory, its reference count and what it tells about itself (see sst.h,
 * docs/formats/sstable.md; the other SSTable files are listed in sst_impl.h).
 *
 * File layout: data blocks | filter block | meta block | index block | footer (80 bytes).
 * Each block carries the 5-byte trailer of block.h. The footer is checked (magic, masked crc,
 * version, handle bounds) and the whole index is validated when a table opens, so the read path
 * can trust every block handle it takes from the index; data blocks are checked (crc, restart
 * array, entry bounds) every time they are read from disk (sst_blocks.c). */
#include <stdlib.h>
#include <string.h>

#include "bloom.h"
#include "sst_impl.h"

bool sst_handle_ok(sst_handle h, uint64_t lo, uint64_t hi) {
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
    if (f->data_end > limit || !sst_handle_ok(f->index, f->data_end, limit) ||
        !sst_handle_ok(f->filter, f->data_end, limit) ||
        !sst_handle_ok(f->meta, f->data_end, limit))
        return st_err_set(err, ST_DATA_LOSS, "footer block handles point outside the file");
    return ST_OK;
}

static st_code read_block(sto_sst *t, sst_handle h, size_t prefix, uint8_t **mem,
                          st_slice *contents, st_err *err) {
    size_t bytes;
    return sst_read_block_into(t, h, prefix, false, mem, &bytes, contents, err);
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

static st_code load_hot_blocks(sto_sst *t, const sst_footer *f, st_err *err) {
    st_slice c;
    st_code rc = read_block(t, f->index, 0, &t->index_mem, &c, err);
    if (rc == ST_OK)
        t->mem_bytes += c.len;
    if (rc == ST_OK && (rc = sto_block_parse(c, &t->index, err)) == ST_OK)
        rc = sst_validate_index(t, err);
    if (rc == ST_OK)
        sst_fp_build(t);
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
    if ((rc = sst_read_exact(t, t->file_bytes - sizeof(buf), buf, sizeof(buf), err)) != ST_OK ||
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
    if (sto_block_iter_valid(&it) && sst_decode_handle(it.value, &h))
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
        if (sst_decode_handle(it.value, &h))
            fn(sto_block_iter_key(&it), h.off + h.size + STO_BLOCK_TRAILER_BYTES, arg);
    }
    sto_block_iter_deinit(&it);
}
