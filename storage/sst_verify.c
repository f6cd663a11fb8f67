/* sst_verify.c — a full check of a table made elsewhere (an imported backup's file) before a
 * tablet lists it. Opening checks the footer, index, filter and meta blocks; reads check each
 * block's checksum and structure; neither checks what a writer on this engine guarantees by
 * construction and a reader relies on: entries in strictly increasing order inside each block,
 * well-formed ikeys, and versions no later than the writer's clock. Format:
 * docs/formats/sstable.md ("Verifying a file made elsewhere"). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "key.h"
#include "sst_impl.h"
#include "strata/storage.h"

typedef struct verify_state {
    uint64_t version_max;
    uint64_t newest;  /* the highest version seen */
    uint64_t entries; /* seen so far */
    st_buf first;     /* the first entry's ikey */
    st_buf prev;      /* the previous entry's ikey */
} verify_state;

/* Checks one entry against the ones before it; n is its number in the file. */
static st_code verify_entry(verify_state *v, st_slice k, st_err *err) {
    sto_key_parts p;
    if (!sto_key_parse(k, &p))
        return st_err_set(err, ST_DATA_LOSS, "entry %" PRIu64 ": malformed internal key",
                          v->entries);
    if (v->entries && st_slice_cmp(k, st_buf_slice(&v->prev)) <= 0)
        return st_err_set(err, ST_DATA_LOSS,
                          "entry %" PRIu64 ": key not above the previous one (out of order)",
                          v->entries);
    if (p.version > v->version_max)
        return st_err_set(
            err, ST_DATA_LOSS,
            "entry %" PRIu64 ": version time %" PRId64 " us is past the allowed %" PRId64,
            v->entries, STO_VERSION_TS_US(p.version), STO_VERSION_TS_US(v->version_max));
    if (p.version > v->newest)
        v->newest = p.version;
    st_buf_reset(&v->prev);
    if (st_buf_append(&v->prev, k.data, k.len) != ST_OK ||
        (v->entries == 0 && st_buf_append(&v->first, k.data, k.len) != ST_OK))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory verifying a table");
    v->entries++;
    return ST_OK;
}

/* Checks every entry of data block h, whose last key the index says is index_key. */
static st_code verify_block(sto_sst *t, verify_state *v, sst_handle h, st_slice index_key,
                            uint64_t blk, st_err *err) {
    uint8_t *mem = NULL;
    size_t bytes;
    st_slice contents;
    sto_block b;
    st_code rc = sst_read_block_into(t, h, 0, false, &mem, &bytes, &contents, err);
    if (rc == ST_OK)
        rc = sto_block_parse(contents, &b, err);
    sto_block_iter it;
    sto_block_iter_init(&it);
    if (rc == ST_OK) {
        sto_block_iter_set(&it, &b);
        for (sto_block_iter_seek_first(&it); rc == ST_OK && sto_block_iter_valid(&it);
             sto_block_iter_next(&it))
            rc = verify_entry(v, sto_block_iter_key(&it), err);
    }
    if (rc == ST_OK && it.status != ST_OK)
        rc = st_err_set(err, ST_DATA_LOSS, "malformed entry");
    /* Seeks pick a block by its index key: a block ending elsewhere hides or misplaces rows. */
    if (rc == ST_OK && st_slice_cmp(st_buf_slice(&v->prev), index_key) != 0)
        rc = st_err_set(err, ST_DATA_LOSS, "last key is not the one its index entry names");
    if (rc != ST_OK)
        st_err_prefix(err, "data block %" PRIu64 ", ", blk);
    sto_block_iter_deinit(&it);
    free(mem);
    return rc;
}

/* The entry count and the meta block's key range (which reads use to skip the table) must be
 * what the blocks hold. */
static st_code verify_totals(const sto_sst *t, const verify_state *v, st_err *err) {
    if (v->entries != t->entries)
        return st_err_set(err, ST_DATA_LOSS,
                          "the footer says %" PRIu64 " entries, the data blocks hold %" PRIu64,
                          t->entries, v->entries);
    if (v->entries && (st_slice_cmp(st_buf_slice(&v->first), t->smallest) != 0 ||
                       st_slice_cmp(st_buf_slice(&v->prev), t->largest) != 0))
        return st_err_set(err, ST_DATA_LOSS,
                          "the meta block's smallest or largest key is not the data's first or "
                          "last key");
    return ST_OK;
}

st_code sto_sst_verify(sto_sst *t, uint64_t version_max, uint64_t *newest, st_err *err) {
    verify_state v = {.version_max = version_max};
    st_buf_init(&v.first);
    st_buf_init(&v.prev);
    sto_block_iter ix;
    sto_block_iter_init(&ix);
    sto_block_iter_set(&ix, &t->index);
    st_code rc = ST_OK;
    uint64_t blk = 0;
    for (sto_block_iter_seek_first(&ix); rc == ST_OK && sto_block_iter_valid(&ix);
         sto_block_iter_next(&ix), blk++) {
        sst_handle h;
        if (!sst_decode_handle(ix.value, &h)) /* checked at open */
            rc = st_err_set(err, ST_DATA_LOSS, "index entry %" PRIu64 " is invalid", blk);
        if (rc == ST_OK)
            rc = verify_block(t, &v, h, sto_block_iter_key(&ix), blk, err);
    }
    if (rc == ST_OK)
        rc = verify_totals(t, &v, err);
    if (newest)
        *newest = v.newest;
    sto_block_iter_deinit(&ix);
    st_buf_free(&v.first);
    st_buf_free(&v.prev);
    return rc;
}
