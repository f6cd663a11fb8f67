/* wire.c — protobuf wire-format helpers for forwarding: requests are rewritten at the byte level
 * (fields the router does not touch — filters, unknown newer fields — travel verbatim), MutateRows
 * is split into per-node sub-requests and its answers merged back into the caller's order,
 * ReadRows answers are scanned for committed rows, SampleRowKeys answers are merged. Pure. */
#include "router_internal.h"

#include <stdlib.h>
#include <string.h>

#include "google/rpc/status.pb-c.h"

bool rtr_wire_next(const uint8_t **p, const uint8_t *end, rtr_wire_field *f, bool *bad) {
    const uint8_t *start = *p;
    uint64_t tag;
    *bad = false;
    if (*p >= end)
        return false;
    if (!rtr_wire_varint(p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
        goto fail;
    f->num = (uint32_t)(tag >> 3);
    f->wire_type = (uint32_t)(tag & 7);
    f->varint = 0;
    const uint8_t *v = *p;
    switch (f->wire_type) {
    case 0:
        if (!rtr_wire_varint(p, end, &f->varint))
            goto fail;
        break;
    case 1:
    case 5: {
        size_t w = f->wire_type == 1 ? 8 : 4;
        if ((size_t)(end - *p) < w)
            goto fail;
        *p += w;
        break;
    }
    case 2: {
        uint64_t len;
        if (!rtr_wire_varint(p, end, &len) || len > (uint64_t)(end - *p))
            goto fail;
        f->bytes = st_slice_make(*p, (size_t)len);
        *p += len;
        f->raw = st_slice_make(start, (size_t)(*p - start));
        return true;
    }
    default:
        goto fail;
    }
    f->bytes = st_slice_make(v, (size_t)(*p - v));
    f->raw = st_slice_make(start, (size_t)(*p - start));
    return true;
fail:
    *bad = true;
    *p = end;
    return false;
}

static bool skipped(uint32_t num, const uint32_t *skip, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (skip[i] == num)
            return true;
    return false;
}

st_code rtr_wire_copy_except(st_buf *out, st_slice msg, const uint32_t *skip, size_t n_skip) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad = false;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (!skipped(f.num, skip, n_skip) && st_buf_append(out, f.raw.data, f.raw.len) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    return bad ? ST_INVALID_ARGUMENT : ST_OK;
}

static st_code put_tag(st_buf *out, uint32_t num, uint32_t wt) {
    return st_buf_append_varint64(out, ((uint64_t)num << 3) | wt);
}

st_code rtr_wire_put_bytes(st_buf *out, uint32_t num, st_slice v) {
    if (put_tag(out, num, 2) != ST_OK || st_buf_append_varint64(out, v.len) != ST_OK ||
        st_buf_append(out, v.data, v.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

st_code rtr_wire_put_varint(st_buf *out, uint32_t num, uint64_t v) {
    if (put_tag(out, num, 0) != ST_OK || st_buf_append_varint64(out, v) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* RowRange: start_key_closed = 1, end_key_open = 3 (empty bounds omitted = unbounded). */
static size_t range_bytes(const btu_key_range *r) {
    size_t b = 0;
    if (r->start.len)
        b += 1 + st_varint_len(r->start.len) + r->start.len;
    if (r->end.len)
        b += 1 + st_varint_len(r->end.len) + r->end.len;
    return b;
}

st_code rtr_wire_put_rowset(st_buf *out, uint32_t num, const btu_rowset *rs) {
    size_t total = 0;
    for (size_t i = 0; i < rs->n; i++) {
        size_t b = range_bytes(&rs->v[i]);
        total += 1 + st_varint_len(b) + b; /* RowSet.row_ranges = 2 */
    }
    if (put_tag(out, num, 2) != ST_OK || st_buf_append_varint64(out, total) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < rs->n; i++) {
        const btu_key_range *r = &rs->v[i];
        if (put_tag(out, 2, 2) != ST_OK || st_buf_append_varint64(out, range_bytes(r)) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        if (r->start.len && rtr_wire_put_bytes(out, 1, r->start) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        if (r->end.len && rtr_wire_put_bytes(out, 3, r->end) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

/* ---- MutateRows ---- */

/* The timestamp_micros (field 3) of a SetCell; false when absent (0) or malformed. */
static bool set_cell_ts(st_slice set_cell, int64_t *ts) {
    const uint8_t *p = set_cell.data, *end = rtr_slice_end(set_cell);
    rtr_wire_field f;
    bool bad = false, found = false;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 3 && f.wire_type == 0) {
            *ts = (int64_t)f.varint;
            found = true;
        }
    return found && !bad;
}

/* What makes mutation i invalid whatever the table: a SetCell (Mutation field 1) timestamp the
 * node would refuse, as text in a (NULL: none, or out of memory: the node then answers). */
static const char *mutation_invalid(st_slice mutation, size_t i, st_arena *a) {
    const uint8_t *p = mutation.data, *end = rtr_slice_end(mutation);
    rtr_wire_field f;
    bool bad = false;
    int64_t ts;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num != 1 || f.wire_type != 2 || !set_cell_ts(f.bytes, &ts) || ts == -1)
            continue;
        if (ts < 0)
            return st_arena_printf(a,
                                   "Error in element #%zu : SetCell timestamp_micros must not be "
                                   "negative, got %lld",
                                   i, (long long)ts);
        if (ts % 1000 != 0)
            return st_arena_printf(a,
                                   "Error in element #%zu : Timestamp granularity mismatch. "
                                   "Expected a multiple of 1000 (millisecond granularity), but "
                                   "got %lld.",
                                   i, (long long)ts);
    }
    return NULL;
}

const char *rtr_mutations_invalid(st_slice msg, uint32_t field, st_arena *a) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad = false;
    size_t n_muts = 0;
    const char *invalid = NULL;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num != field)
            continue;
        if (f.wire_type == 2 && !invalid)
            invalid = mutation_invalid(f.bytes, n_muts, a);
        n_muts++;
    }
    return n_muts == 0 ? "No mutations provided" : invalid;
}

/* The row key (field 1) of a MutateRowsRequest.Entry, and what makes it invalid (rtr_entry). */
static bool entry_scan(st_slice entry, rtr_entry *out, st_arena *a) {
    const uint8_t *p = entry.data, *end = rtr_slice_end(entry);
    rtr_wire_field f;
    bool bad = false;
    out->row = st_slice_make(NULL, 0);
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 1 && f.wire_type == 2)
            out->row = f.bytes;
    if (out->row.len == 0)
        out->invalid = "row key must not be empty";
    else if (out->row.len > BTU_ROW_KEY_MAX)
        out->invalid =
            st_arena_printf(a, "row key longer than %d bytes (%zu)", BTU_ROW_KEY_MAX, out->row.len);
    else
        out->invalid = rtr_mutations_invalid(entry, 2, a);
    return !bad;
}

st_code rtr_mutate_rows_split(st_slice req, st_arena *a, st_buf *out_head, rtr_entry **entries,
                              size_t *n) {
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    rtr_wire_field f;
    bool bad = false;
    size_t count = 0;
    while (rtr_wire_next(&p, end, &f, &bad))
        count += f.num == 2;
    if (bad)
        return ST_INVALID_ARGUMENT;
    rtr_entry *v = st_arena_alloc(a, (count ? count : 1) * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    size_t k = 0;
    for (p = req.data; rtr_wire_next(&p, end, &f, &bad);) {
        if (f.num != 2) {
            if (st_buf_append(out_head, f.raw.data, f.raw.len) != ST_OK)
                return ST_RESOURCE_EXHAUSTED;
            continue;
        }
        if (f.wire_type != 2 || !entry_scan(f.bytes, &v[k], a))
            return ST_INVALID_ARGUMENT;
        v[k++].raw = f.bytes;
    }
    *entries = v;
    *n = k;
    return ST_OK;
}

st_code rtr_mutate_rows_build(st_buf *out, st_slice head, const rtr_entry *entries,
                              const size_t *idx, size_t n) {
    size_t total = head.len;
    for (size_t i = 0; i < n; i++) /* one allocation: 100 entries of 1 KB grew it 8 times */
        total += 1 + st_varint_len(entries[idx[i]].raw.len) + entries[idx[i]].raw.len;
    if (st_buf_reserve(out, total) != ST_OK || st_buf_append(out, head.data, head.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++)
        if (rtr_wire_put_bytes(out, 2, entries[idx[i]].raw) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* google.rpc.Status: code 1 (int32), message 2 (string); details 3 are not kept. Later
 * occurrences overwrite earlier ones, as protobuf merges. */
static st_code merge_status(st_slice st, rtr_entry_result *r, st_arena *a) {
    const uint8_t *p = st.data, *end = rtr_slice_end(st);
    rtr_wire_field f;
    bool bad = false;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num == 1) {
            if (f.wire_type != 0)
                return ST_INTERNAL;
            r->code = (st_code)(int32_t)f.varint;
        } else if (f.num == 2) {
            if (f.wire_type != 2)
                return ST_INTERNAL;
            const uint8_t *nul = memchr(f.bytes.data, 0, f.bytes.len); /* C string: up to NUL */
            size_t len = nul ? (size_t)(nul - f.bytes.data) : f.bytes.len;
            r->message = "";
            if (len > 0) {
                char *m = st_arena_alloc(a, len + 1);
                if (!m)
                    return ST_RESOURCE_EXHAUSTED;
                memcpy(m, f.bytes.data, len);
                m[len] = '\0';
                r->message = m;
            }
        }
    }
    return bad ? ST_INTERNAL : ST_OK;
}

/* One MutateRowsResponse.Entry: index 1 (int64), status 2. */
static st_code merge_entry(st_slice e, const size_t *idx, size_t n, rtr_entry_result *res,
                           st_arena *a) {
    const uint8_t *p = e.data, *end = rtr_slice_end(e);
    rtr_wire_field f;
    bool bad = false;
    int64_t index = 0;
    st_slice status[4];
    size_t n_status = 0;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num == 1) {
            if (f.wire_type != 0)
                return ST_INTERNAL;
            index = (int64_t)f.varint;
        } else if (f.num == 2) {
            if (f.wire_type != 2 || n_status == sizeof status / sizeof status[0])
                return ST_INTERNAL;
            status[n_status++] = f.bytes;
        }
    }
    if (bad || index < 0 || (uint64_t)index >= n)
        return ST_INTERNAL;
    rtr_entry_result *r = &res[idx[index]];
    r->code = ST_OK;
    r->message = "";
    for (size_t i = 0; i < n_status; i++) {
        st_code rc = merge_status(status[i], r, a);
        if (rc != ST_OK)
            return rc;
    }
    r->final = true;
    return ST_OK;
}

st_code rtr_mutate_rows_merge(st_slice resp, const size_t *idx, size_t n, rtr_entry_result *res,
                              st_arena *a) {
    /* Scanned, not unpacked: a 100-entry answer would cost 300 allocations. MutateRowsResponse:
     * entries 1; rate_limit_info 3 is not used. */
    const uint8_t *p = resp.data, *end = rtr_slice_end(resp);
    rtr_wire_field f;
    bool bad = false;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num != 1)
            continue;
        st_code rc = f.wire_type == 2 ? merge_entry(f.bytes, idx, n, res, a) : ST_INTERNAL;
        if (rc != ST_OK)
            return rc;
    }
    return bad ? ST_INTERNAL : ST_OK;
}

/* ---- ReadRows answers ---- */

void rtr_rr_track_init(rtr_rr_track *t) {
    memset(t, 0, sizeof *t);
    st_buf_init(&t->row);
    st_buf_init(&t->last);
}

void rtr_rr_track_deinit(rtr_rr_track *t) {
    st_buf_free(&t->row);
    st_buf_free(&t->last);
}

static st_code set_buf(st_buf *b, st_slice v) {
    st_buf_reset(b);
    return st_buf_append(b, v.data, v.len);
}

/* What one response message changes, as slices into it (or into t->row): applied once at its
 * end, so a 100-row answer copies two keys, not two hundred. */
typedef struct track_msg {
    st_slice row;   /* key of the row being received */
    bool row_moved; /* row points into the message */
    st_slice best;  /* the latest committed key (or last_scanned_row_key) in scan order */
    bool has_best;
} track_msg;

static void track_candidate(track_msg *m, st_slice key, bool reversed) {
    if (m->has_best) {
        int c = st_slice_cmp(key, m->best);
        if (reversed ? c >= 0 : c <= 0)
            return;
    }
    m->best = key;
    m->has_best = true;
}

static st_code track_chunk(rtr_rr_track *t, track_msg *m, st_slice chunk, bool reversed) {
    const uint8_t *p = chunk.data, *end = rtr_slice_end(chunk);
    uint32_t num, wt;
    uint64_t v;
    st_slice b;
    int rc;
    while ((rc = rtr_wire_scan(&p, end, &num, &wt, &v, &b)) == 1) {
        if (num == 1 && wt == 2 && b.len) {
            m->row = b;
            m->row_moved = true;
            t->row_open = true;
        } else if (num == 8 && v) { /* reset_row */
            t->row_open = false;
        } else if (num == 9 && v) { /* commit_row */
            t->row_open = false;
            t->committed++;
            track_candidate(m, m->row, reversed);
        }
    }
    return rc < 0 ? ST_INTERNAL : ST_OK;
}

/* A key later in scan order than the last one recorded becomes the resume point. */
static st_code track_last(rtr_rr_track *t, st_slice key, bool reversed) {
    if (t->has_last) {
        int c = st_slice_cmp(key, st_buf_slice(&t->last));
        if (reversed ? c >= 0 : c <= 0)
            return ST_OK;
    }
    t->has_last = true;
    return set_buf(&t->last, key);
}

st_code rtr_rr_track_feed(rtr_rr_track *t, st_slice msg, bool reversed) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    track_msg m = {.row = st_buf_slice(&t->row)};
    uint32_t num, wt;
    uint64_t v;
    st_slice b;
    int rc;
    while ((rc = rtr_wire_scan(&p, end, &num, &wt, &v, &b)) == 1) {
        st_code sc = ST_OK;
        if (num == 1 && wt == 2)
            sc = track_chunk(t, &m, b, reversed);
        else if (num == 2 && wt == 2 && b.len && !t->row_open)
            track_candidate(&m, b, reversed); /* last_scanned_row_key */
        if (sc != ST_OK)
            return sc;
    }
    if (rc < 0)
        return ST_INTERNAL;
    /* best may point into t->row: record it before t->row changes. */
    if (m.has_best && track_last(t, m.best, reversed) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (m.row_moved && set_buf(&t->row, m.row) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* ---- SampleRowKeys ---- */

static int sample_cmp(const void *a, const void *b) {
    const rtr_sample *x = a, *y = b;
    return btu_end_cmp(x->key, y->key); /* the empty key (end of table) last */
}

st_code rtr_samples_merge(rtr_sample *const *per_node, const size_t *counts,
                          const st_slice *end_keys, size_t n_nodes, st_arena *a, rtr_sample **out,
                          size_t *n_out) {
    size_t total = 1;
    for (size_t i = 0; i < n_nodes; i++)
        total += counts[i];
    rtr_sample *v = st_arena_alloc(a, total * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    size_t n = 0;
    for (size_t i = 0; i < n_nodes; i++) {
        int64_t prev = 0;
        for (size_t j = 0; j < counts[i]; j++) {
            rtr_sample s = per_node[i][j];
            int64_t delta = s.offset >= prev ? s.offset - prev : 0;
            prev = s.offset > prev ? s.offset : prev;
            v[n].key = s.key.len ? s.key : end_keys[i];
            v[n++].offset = delta;
        }
    }
    v[n++] = (rtr_sample){st_slice_make(NULL, 0), 0}; /* the table's end, always present */
    qsort(v, n, sizeof *v, sample_cmp);
    size_t w = 0;
    int64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += v[i].offset;
        if (w > 0 && btu_end_cmp(v[w - 1].key, v[i].key) == 0) {
            v[w - 1].offset = acc;
            continue;
        }
        v[w].key = v[i].key;
        v[w++].offset = acc;
    }
    *out = v;
    *n_out = w;
    return ST_OK;
}

st_code rtr_msgq_push(rtr_msgq *q, st_slice msg) {
    if (st_buf_append_varint64(&q->buf, msg.len) != ST_OK ||
        st_buf_append(&q->buf, msg.data, msg.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

st_code rtr_msgq_drain(rtr_msgq *q, rpc_call *call, bool counted) {
    while (rtr_msgq_bytes(q) > 0 && (counted ? rpc_call_has_room(call) : rpc_call_writable(call))) {
        const uint8_t *p = q->buf.data + q->off;
        st_slice msg;
        if (!st_get_len_prefixed(&p, q->buf.data + q->buf.len, &msg))
            return ST_INTERNAL;
        q->off = (size_t)(p - q->buf.data);
        st_code rc = rpc_call_send(call, msg);
        if (rc != ST_OK)
            return rc;
    }
    if (rtr_msgq_bytes(q) == 0) {
        st_buf_reset(&q->buf);
        q->off = 0;
    }
    return ST_OK;
}
