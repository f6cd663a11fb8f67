/* sst_index.c — an SSTable's index: checked once when the table opens, then searched by every
 * seek, through in-memory fingerprints when the index is big (see sst_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "sst_impl.h"

bool sst_decode_handle(st_slice v, sst_handle *h) {
    const uint8_t *p = v.data, *end = v.data + v.len;
    return st_get_varint64(&p, end, &h->off) && st_get_varint64(&p, end, &h->size) && p == end;
}

st_code sst_validate_index(sto_sst *t, st_err *err) {
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
        if (!sst_decode_handle(it.value, &h) || h.off != next_off ||
            !sst_handle_ok(h, next_off, t->data_end) ||
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
void sst_fp_build(sto_sst *t) {
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
        if (i >= n || it.current != sto_block_restart_offset(b, i) ||
            !sst_decode_handle(it.value, &h))
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
uint32_t sst_fp_search(const sto_sst *t, st_slice target) {
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
