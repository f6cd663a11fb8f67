/* sst_iter.c — the two-level iterator over one SSTable: a position among the data blocks (a
 * block number with fingerprints, else an index iterator) and an iterator in the current block.
 * Freed iterators are kept per thread for the next reads. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sst_impl.h"

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
        sst_keep_put(it->keep, it->ch);
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
        it->bi = sst_fp_search(it->t, target);
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
    if (!sst_decode_handle(it->index_it.value, h)) {
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
    st_code rc = sst_get_block(it->t, it->fill_cache, it->keep, &it->ra, h, &it->ch, &it->ch_owner,
                               &it->err);
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

static void iter_destroy(void *p) {
    sst_iter *it = p;
    sto_block_iter_deinit(&it->index_it);
    sto_block_iter_deinit(&it->data_it);
    st_buf_free(&it->ra.win);
    free(it);
}

static _Thread_local st_tl_stash stash = ST_TL_STASH_INIT(SST_ITER_KEEP, iter_destroy);

static void it_free(sto_kviter *base) {
    sst_iter *it = (sst_iter *)base;
    release_block(it);
    sto_sst_unref(it->t);
    it->t = NULL;
    if (it->ra.win.cap > SST_ITER_KEEP_WIN_BYTES)
        st_buf_free(&it->ra.win);
    bool small = it->index_it.key.cap <= SST_ITER_KEEP_WIN_BYTES &&
                 it->data_it.key.cap <= SST_ITER_KEEP_WIN_BYTES;
    if (!small || !st_tl_stash_put(&stash, it))
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
    sst_iter *it = st_tl_stash_take(&stash);
    if (!it)
        return NULL;
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
