/* read_plan.c — ReadRows row sets, the walk over tablets and the CellChunk encoder (read.h).
 * Pure functions: no storage, no RPC. Row-set normalisation itself is btu_rowset_from_pb. */
#include "read.h"

#include <stdlib.h>
#include <string.h>

/* ---- row sets: normalisation lives in proto/bt (strata/btutil.h), shared with the router ---- */

static int end_cmp(st_slice a, st_slice b) {
    return btu_end_cmp(a, b);
}
static bool range_is_empty(const node_key_range *r) {
    return btu_range_is_empty(r);
}

/* ---- the walk over tablets ---- */

void node_scan_init(node_scan *s, const node_rowset *rs, bool reversed) {
    memset(s, 0, sizeof *s);
    s->rs = rs;
    s->reversed = reversed;
    st_buf_init(&s->pos);
    st_buf_init(&s->lo);
    st_buf_init(&s->hi);
}

void node_scan_restart(node_scan *s, const node_rowset *rs, bool reversed) {
    s->rs = rs;
    s->reversed = reversed;
    s->done = 0;
    s->has_pos = false;
    st_buf_reset(&s->pos);
    st_buf_reset(&s->lo);
    st_buf_reset(&s->hi);
}

void node_scan_deinit(node_scan *s) {
    st_buf_free(&s->pos);
    st_buf_free(&s->lo);
    st_buf_free(&s->hi);
}

static st_code set_buf(st_buf *b, st_slice v) {
    st_buf_reset(b);
    return st_buf_append(b, v.data, v.len);
}

static st_slice tablet_start(const node_tablet *t) {
    return st_buf_slice(&t->start);
}
static st_slice tablet_end(const node_tablet *t) {
    return st_buf_slice(&t->end);
}

/* Largest i with v[i].start <= key (strict: < key); 0 when there is none (callers check). */
static size_t tablet_find(const node_tablet *v, size_t n, st_slice key, bool strict) {
    size_t lo = 0, hi = n; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        int c = st_slice_cmp(tablet_start(&v[mid]), key);
        if (c < 0 || (c == 0 && !strict))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static st_code piece_set(node_scan *s, st_slice lo, st_slice hi, node_key_range *piece) {
    if (set_buf(&s->lo, lo) != ST_OK || set_buf(&s->hi, hi) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    piece->start = st_buf_slice(&s->lo);
    piece->end = st_buf_slice(&s->hi);
    return ST_OK;
}

/* No tablet holds the rows next to key: report key as piece->start. */
static st_code uncovered(node_scan *s, st_slice key, node_key_range *piece) {
    st_code rc = piece_set(s, key, st_slice_make("", 0), piece);
    return rc == ST_OK ? ST_FAILED_PRECONDITION : rc;
}

static st_code scan_next_forward(node_scan *s, const node_tablet *v, size_t n,
                                 node_key_range *piece, size_t *tablet) {
    const node_key_range *r = &s->rs->v[s->done];
    st_slice lo = s->has_pos ? st_buf_slice(&s->pos) : r->start;
    size_t i = n ? tablet_find(v, n, lo, false) : 0;
    if (n == 0 || st_slice_cmp(tablet_start(&v[i]), lo) > 0 ||
        (tablet_end(&v[i]).len > 0 && st_slice_cmp(lo, tablet_end(&v[i])) >= 0))
        return uncovered(s, lo, piece);
    st_slice te = tablet_end(&v[i]);
    st_slice hi = end_cmp(te, r->end) < 0 ? te : r->end;
    if (piece_set(s, lo, hi, piece) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (te.len > 0 && end_cmp(te, r->end) < 0) {
        if (set_buf(&s->pos, te) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        s->has_pos = true;
    } else {
        s->done++;
        s->has_pos = false;
    }
    *tablet = i;
    return ST_OK;
}

static st_code scan_next_reverse(node_scan *s, const node_tablet *v, size_t n,
                                 node_key_range *piece, size_t *tablet) {
    const node_key_range *r = &s->rs->v[s->rs->n - 1 - s->done];
    st_slice hi = s->has_pos ? st_buf_slice(&s->pos) : r->end;
    size_t i = n == 0 ? 0 : hi.len == 0 ? n - 1 : tablet_find(v, n, hi, true);
    if (n == 0 || (hi.len > 0 && st_slice_cmp(tablet_start(&v[i]), hi) >= 0))
        return uncovered(s, hi, piece);
    if (end_cmp(tablet_end(&v[i]), hi) < 0) /* a gap between the tablet's end and hi */
        return uncovered(s, tablet_end(&v[i]), piece);
    st_slice ts = tablet_start(&v[i]);
    st_slice lo = st_slice_cmp(ts, r->start) > 0 ? ts : r->start;
    if (piece_set(s, lo, hi, piece) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (st_slice_cmp(ts, r->start) > 0) {
        if (set_buf(&s->pos, ts) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        s->has_pos = true;
    } else {
        s->done++;
        s->has_pos = false;
    }
    *tablet = i;
    return ST_OK;
}

st_code node_scan_next(node_scan *s, const node_tablet *v, size_t n, node_key_range *piece,
                       size_t *tablet) {
    while (s->done < s->rs->n) {
        st_code rc = s->reversed ? scan_next_reverse(s, v, n, piece, tablet)
                                 : scan_next_forward(s, v, n, piece, tablet);
        if (rc != ST_OK)
            return rc;
        if (!range_is_empty(piece))
            return ST_OK;
    }
    return ST_NOT_FOUND;
}

st_code node_scan_rewind(node_scan *s, st_slice key) {
    st_buf pos;
    st_buf_init(&pos);
    if (st_buf_append(&pos, key.data, key.len) != ST_OK ||
        (s->reversed && st_buf_append_byte(&pos, 0) != ST_OK)) { /* rows < key + "\0" */
        st_buf_free(&pos);
        return ST_RESOURCE_EXHAUSTED;
    }
    if (!s->has_pos) { /* that piece ended its range: the scan had moved to the next one */
        ST_ASSERT(s->done > 0);
        s->done--;
    }
    s->has_pos = true;
    st_buf_free(&s->pos);
    s->pos = pos;
    return ST_OK;
}

st_code node_scan_uncovered(const node_rowset *rs, const node_tablet *v, size_t n, st_buf *key) {
    node_scan s;
    node_scan_init(&s, rs, false);
    node_key_range piece;
    size_t i;
    st_code rc;
    while ((rc = node_scan_next(&s, v, n, &piece, &i)) == ST_OK) {
    }
    if (rc == ST_FAILED_PRECONDITION && set_buf(key, piece.start) != ST_OK)
        rc = ST_RESOURCE_EXHAUSTED;
    node_scan_deinit(&s);
    return rc == ST_NOT_FOUND ? ST_OK : rc;
}

/* ---- the chunk encoder (protobuf wire format, written by hand so values are copied once,
 * straight into the response) ---- */

enum {
    WT_VARINT = 0,
    WT_LEN = 2,
    F_CHUNKS = 1,
    F_LAST_SCANNED = 2,
    C_ROW_KEY = 1,
    C_FAMILY = 2,
    C_QUALIFIER = 3,
    C_TIMESTAMP = 4,
    C_LABELS = 5,
    C_VALUE = 6,
    C_VALUE_SIZE = 7,
    C_COMMIT_ROW = 9,
    WRAPPER_VALUE = 1,
};

#define TAG(field, wt) ((uint8_t)(((field) << 3) | (wt)))

/* One CellChunk, by its fields; NULL / 0 / false = absent. */
typedef struct chunk {
    st_slice key; /* absent when empty */
    const st_slice *family, *qualifier;
    int64_t ts_us;
    const st_slice *labels;
    uint32_t n_labels;
    st_slice value;
    uint64_t value_size;
    bool commit;
} chunk;

static size_t len_field(size_t len) {
    return 1 + st_varint_len(len) + len;
}
static size_t wrapper_bytes(st_slice v) {
    return v.len ? len_field(v.len) : 0;
}

static size_t chunk_body_bytes(const chunk *c) {
    size_t b = 0;
    if (c->key.len)
        b += len_field(c->key.len);
    if (c->family)
        b += len_field(wrapper_bytes(*c->family));
    if (c->qualifier)
        b += len_field(wrapper_bytes(*c->qualifier));
    if (c->ts_us)
        b += 1 + st_varint_len((uint64_t)c->ts_us);
    for (uint32_t i = 0; i < c->n_labels; i++)
        b += len_field(c->labels[i].len);
    if (c->value.len)
        b += len_field(c->value.len);
    if (c->value_size)
        b += 1 + st_varint_len(c->value_size);
    if (c->commit)
        b += 2;
    return b;
}

/* Writers into memory already reserved. */
static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    return p + st_put_varint64(p, v);
}

static uint8_t *put_len(uint8_t *p, int field, st_slice v) {
    *p++ = TAG(field, WT_LEN);
    p = put_varint(p, v.len);
    if (v.len)
        memcpy(p, v.data, v.len);
    return p + v.len;
}

static uint8_t *put_wrapper(uint8_t *p, int field, st_slice v) {
    *p++ = TAG(field, WT_LEN);
    p = put_varint(p, wrapper_bytes(v));
    return v.len ? put_len(p, WRAPPER_VALUE, v) : p;
}

static uint8_t *put_chunk(uint8_t *p, const chunk *c, size_t body) {
    *p++ = TAG(F_CHUNKS, WT_LEN);
    p = put_varint(p, body);
    if (c->key.len)
        p = put_len(p, C_ROW_KEY, c->key);
    if (c->family)
        p = put_wrapper(p, C_FAMILY, *c->family);
    if (c->qualifier)
        p = put_wrapper(p, C_QUALIFIER, *c->qualifier);
    if (c->ts_us) {
        *p++ = TAG(C_TIMESTAMP, WT_VARINT);
        p = put_varint(p, (uint64_t)c->ts_us);
    }
    for (uint32_t i = 0; i < c->n_labels; i++)
        p = put_len(p, C_LABELS, c->labels[i]);
    if (c->value.len)
        p = put_len(p, C_VALUE, c->value);
    if (c->value_size) {
        *p++ = TAG(C_VALUE_SIZE, WT_VARINT);
        p = put_varint(p, c->value_size);
    }
    if (c->commit) {
        *p++ = TAG(C_COMMIT_ROW, WT_VARINT);
        *p++ = 1;
    }
    return p;
}

typedef struct row_sink {
    size_t bytes; /* measuring: total; writing: unused */
    uint8_t *p;   /* NULL while measuring */
} row_sink;

static void sink_chunk(row_sink *s, const chunk *c) {
    size_t body = chunk_body_bytes(c);
    if (s->p)
        s->p = put_chunk(s->p, c, body);
    else
        s->bytes += len_field(body);
}

/* Emits one cell as one or more chunks. `first` carries the row/family/qualifier presence. */
static void sink_cell(row_sink *s, chunk first, const node_cell *cell, bool last_cell,
                      size_t piece) {
    st_slice v = cell->value;
    first.ts_us = cell->ts_us;
    first.labels = cell->labels;
    first.n_labels = cell->n_labels;
    if (v.len <= piece) {
        first.value = v;
        first.commit = last_cell;
        sink_chunk(s, &first);
        return;
    }
    first.value = st_slice_make(v.data, piece);
    first.value_size = v.len;
    sink_chunk(s, &first);
    for (size_t off = piece; off < v.len; off += piece) {
        size_t len = v.len - off < piece ? v.len - off : piece;
        bool final = off + len == v.len;
        chunk c = {.value = st_slice_make(v.data + off, len)};
        c.value_size = final ? 0 : v.len;
        c.commit = final && last_cell;
        sink_chunk(s, &c);
    }
}

/* Cells cells[0..n) of a row, after prev (NULL: they start the row, which carries its key). */
static void sink_cells(row_sink *s, st_slice key, const node_cell *prev,
                       const node_cell *const *cells, size_t n, bool last, size_t piece) {
    for (size_t i = 0; i < n; i++) {
        const node_cell *c = cells[i];
        chunk first = {.key = prev == NULL ? key : st_slice_make(NULL, 0)};
        bool fam_changed = prev == NULL || !st_slice_eq(prev->family, c->family);
        /* The Go chunkReader rejects a family without a qualifier, so a family change always
         * carries the qualifier too. */
        if (fam_changed)
            first.family = &c->family;
        if (fam_changed || !st_slice_eq(prev->qualifier, c->qualifier))
            first.qualifier = &c->qualifier;
        sink_cell(s, first, c, last && i + 1 == n, piece);
        prev = c;
    }
}

static void sink_row(row_sink *s, st_slice key, const node_cell *const *cells, size_t n,
                     size_t piece) {
    sink_cells(s, key, NULL, cells, n, true, piece);
}

size_t node_read_row_encoded_bytes(st_slice key, const node_cell *const *cells, size_t n,
                                   size_t value_chunk_bytes) {
    row_sink s = {0, NULL};
    sink_row(&s, key, cells, n, value_chunk_bytes ? value_chunk_bytes : SIZE_MAX);
    return s.bytes;
}

/* Writes cells as sink_cells does, bytes long (measured by the caller). */
static st_code encode_cells_sized(st_buf *out, st_slice key, const node_cell *prev,
                                  const node_cell *const *cells, size_t n, bool last, size_t piece,
                                  size_t bytes, st_err *err) {
    ST_ASSERT(n > 0 && key.len > 0);
    for (size_t i = 0; i < n; i++)
        if (cells[i]->value.len > INT32_MAX)
            return st_err_set(err, ST_INTERNAL, "a cell value of %zu bytes cannot be encoded",
                              cells[i]->value.len);
    if (st_buf_reserve(out, bytes) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory encoding a %zu-byte row",
                          bytes);
    row_sink s = {0, out->data + out->len};
    sink_cells(&s, key, prev, cells, n, last, piece);
    ST_ASSERT((size_t)(s.p - (out->data + out->len)) == bytes);
    out->len += bytes;
    return ST_OK;
}

st_code node_read_encode_row(st_buf *out, st_slice key, const node_cell *const *cells, size_t n,
                             size_t value_chunk_bytes, st_err *err) {
    size_t piece = value_chunk_bytes ? value_chunk_bytes : SIZE_MAX;
    size_t bytes = node_read_row_encoded_bytes(key, cells, n, value_chunk_bytes);
    return encode_cells_sized(out, key, NULL, cells, n, true, piece, bytes, err);
}

st_code node_read_encode_cells(st_buf *out, st_slice key, const node_cell *prev,
                               const node_cell *const *cells, size_t n, bool last,
                               size_t value_chunk_bytes, st_err *err) {
    size_t piece = value_chunk_bytes ? value_chunk_bytes : SIZE_MAX;
    row_sink m = {0, NULL};
    sink_cells(&m, key, prev, cells, n, last, piece);
    return encode_cells_sized(out, key, prev, cells, n, last, piece, m.bytes, err);
}

st_code node_read_encode_last_scanned(st_buf *out, st_slice key) {
    if (st_buf_reserve(out, len_field(key.len)) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    uint8_t *end = put_len(out->data + out->len, F_LAST_SCANNED, key);
    out->len = (size_t)(end - out->data);
    return ST_OK;
}

size_t node_read_cell_bytes(const node_cell *c) {
    size_t b = c->family.len + c->qualifier.len + c->value.len + sizeof c->ts_us;
    for (uint32_t i = 0; i < c->n_labels; i++)
        b += c->labels[i].len;
    return b;
}
