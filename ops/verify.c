/* ops/verify.c — checks every bench response without unpacking it into protobuf-c structs: a
 * minimal wire reader walks ReadRowsResponse chunks (the CellChunk state machine) and
 * MutateRowsResponse entries, so verification costs no allocation on the hot path. */
#include <stdio.h>
#include <string.h>

#include "bench.h"

/* One-byte varints (tags, short lengths, flags) inline; longer ones through base. The verifier
 * walks every field of every row the bench reads, on the cores the servers use. */
static inline bool pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    if (*p < end && **p < 0x80) {
        *v = *(*p)++;
        return true;
    }
    return st_get_varint64(p, end, v);
}

static inline int pb_next(const uint8_t **p, const uint8_t *end, ops_pb_field *f) {
    if (*p >= end)
        return 0;
    uint64_t tag;
    if (!pb_varint(p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
        return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wire = (uint32_t)(tag & 7);
    f->v = 0;
    f->s = st_slice_make(NULL, 0);
    switch (f->wire) {
    case 0:
        return pb_varint(p, end, &f->v) ? 1 : -1;
    case 1:
        if (end - *p < 8)
            return -1;
        f->v = st_get_fixed64(*p);
        *p += 8;
        return 1;
    case 2: {
        uint64_t len;
        if (!pb_varint(p, end, &len) || len > (uint64_t)(end - *p))
            return -1;
        f->s = st_slice_make(*p, (size_t)len);
        *p += len;
        return 1;
    }
    case 5:
        if (end - *p < 4)
            return -1;
        f->v = st_get_fixed32(*p);
        *p += 4;
        return 1;
    default:
        return -1; /* groups (3, 4) are not used by Bigtable; 6, 7 do not exist */
    }
}

int ops_pb_next(const uint8_t **p, const uint8_t *end, ops_pb_field *f) {
    return pb_next(p, end, f);
}

__attribute__((format(printf, 2, 3))) static bool check_fail(ops_rowcheck *c, const char *fmt,
                                                             ...) {
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
        va_end(ap);
        c->failed = true;
    }
    return false;
}

void ops_rowcheck_begin(ops_rowcheck *c, uint64_t first, uint64_t rows, uint64_t value_bytes) {
    memset(c, 0, sizeof(*c));
    c->first = first;
    c->rows = rows;
    c->value_bytes = value_bytes;
}

/* The fields of one CellChunk that matter here. */
typedef struct chunk_view {
    bool has_key, reset, commit;
    st_slice key, value;
    uint64_t value_size;
} chunk_view;

static bool chunk_parse(st_slice in, chunk_view *v) {
    memset(v, 0, sizeof(*v));
    const uint8_t *p = in.data, *end = in.data + in.len;
    ops_pb_field f;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 1) {
        if (f.num == 1 && f.wire == 2) {
            v->key = f.s;
            v->has_key = f.s.len > 0;
        } else if (f.num == 6 && f.wire == 2) {
            v->value = f.s;
        } else if (f.num == 7 && f.wire == 0) {
            v->value_size = f.v;
        } else if (f.num == 8 && f.wire == 0) {
            v->reset = f.v != 0;
        } else if (f.num == 9 && f.wire == 0) {
            v->commit = f.v != 0;
        }
    }
    return rc == 0;
}

/* A committed row: it must be the next expected key and hold well-sized cells. */
static bool row_commit(ops_rowcheck *c) {
    if (c->in_cell)
        return check_fail(c, "row committed inside a split cell");
    if (c->row_cells == 0)
        return check_fail(c, "row committed without cells");
    if (c->rows_done >= c->rows)
        return check_fail(c, "more rows than the %llu requested", (unsigned long long)c->rows);
    char want[OPS_KEY_BYTES + 1];
    size_t wl = ops_key_format(want, c->first + c->rows_done);
    if (c->row_key_len != wl || memcmp(c->row_key, want, wl) != 0)
        return check_fail(c, "row %llu: got key '%.*s', want '%s'",
                          (unsigned long long)c->rows_done, (int)c->row_key_len, c->row_key, want);
    c->rows_done++;
    c->bytes_done += c->row_key_len + c->row_bytes;
    c->in_row = false;
    return true;
}

static bool chunk_apply(ops_rowcheck *c, const chunk_view *v) {
    if (v->reset) {
        c->in_row = c->in_cell = false;
        return true;
    }
    if (!c->in_row) {
        if (!v->has_key)
            return check_fail(c, "first chunk of a row has no row key");
        c->in_row = true;
        c->row_cells = c->row_bytes = 0;
        /* Keys of another length can never match: keep a marker length for the message. */
        c->row_key_len = v->key.len <= OPS_KEY_BYTES ? v->key.len : OPS_KEY_BYTES;
        memcpy(c->row_key, v->key.data, c->row_key_len);
    }
    if (!c->in_cell) {
        c->row_cells++;
        c->cell_len = 0;
    }
    c->cell_len += v->value.len;
    c->row_bytes += v->value.len;
    c->in_cell = v->value_size > 0;
    if (!c->in_cell && c->cell_len != c->value_bytes)
        return check_fail(c, "row '%.*s': a value of %llu bytes, want %llu", (int)c->row_key_len,
                          c->row_key, (unsigned long long)c->cell_len,
                          (unsigned long long)c->value_bytes);
    return v->commit ? row_commit(c) : true;
}

bool ops_rowcheck_feed(ops_rowcheck *c, st_slice msg) {
    if (c->failed)
        return false;
    const uint8_t *p = msg.data, *end = msg.data + msg.len;
    ops_pb_field f;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 1) {
        if (f.num != 1 || f.wire != 2)
            continue; /* last_scanned_row_key, request_stats */
        chunk_view v;
        if (!chunk_parse(f.s, &v))
            return check_fail(c, "malformed CellChunk");
        if (!chunk_apply(c, &v))
            return false;
    }
    if (rc < 0)
        return check_fail(c, "malformed ReadRowsResponse");
    return true;
}

bool ops_rowcheck_finish(ops_rowcheck *c) {
    if (c->failed)
        return false;
    if (c->in_row)
        return check_fail(c, "response ended inside a row");
    if (c->rows_done != c->rows)
        return check_fail(c, "%llu rows came back, want %llu", (unsigned long long)c->rows_done,
                          (unsigned long long)c->rows);
    return true;
}

/* ---- MutateRows ---- */

void ops_bulkcheck_begin(ops_bulkcheck *c, uint32_t entries) {
    ST_ASSERT(entries <= OPS_BULK_ROWS_MAX);
    memset(c, 0, sizeof(*c));
    c->entries = entries;
}

static bool bulk_malformed(ops_bulkcheck *c, const char *what) {
    if (!c->malformed)
        snprintf(c->msg, sizeof(c->msg), "%s", what);
    c->malformed = true;
    return false;
}

/* One MutateRowsResponse.Entry: index (1) and google.rpc.Status (2) with its code (1). */
static bool bulk_entry(ops_bulkcheck *c, st_slice in) {
    const uint8_t *p = in.data, *end = in.data + in.len;
    ops_pb_field f;
    uint64_t index = 0, code = 0;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 1) {
        if (f.num == 1 && f.wire == 0) {
            index = f.v;
        } else if (f.num == 2 && f.wire == 2) {
            const uint8_t *q = f.s.data, *qend = f.s.data + f.s.len;
            ops_pb_field g;
            int rs;
            while ((rs = pb_next(&q, qend, &g)) == 1)
                if (g.num == 1 && g.wire == 0)
                    code = g.v;
            if (rs < 0)
                return bulk_malformed(c, "malformed entry status");
        }
    }
    if (rc < 0)
        return bulk_malformed(c, "malformed MutateRowsResponse entry");
    if (index >= c->entries)
        return bulk_malformed(c, "entry index out of range");
    if (c->seen[index / 8] & (1u << (index % 8)))
        return bulk_malformed(c, "entry index reported twice");
    c->seen[index / 8] |= (uint8_t)(1u << (index % 8));
    c->seen_count++;
    if (code != 0 && c->first_error == ST_OK) {
        c->first_error = code <= ST_UNAUTHENTICATED ? (st_code)code : ST_UNKNOWN;
        snprintf(c->msg, sizeof(c->msg), "entry %llu failed with %s", (unsigned long long)index,
                 st_code_name(c->first_error));
    }
    return true;
}

bool ops_bulkcheck_feed(ops_bulkcheck *c, st_slice msg) {
    if (c->malformed)
        return false;
    const uint8_t *p = msg.data, *end = msg.data + msg.len;
    ops_pb_field f;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 1)
        if (f.num == 1 && f.wire == 2 && !bulk_entry(c, f.s))
            return false;
    if (rc < 0)
        return bulk_malformed(c, "malformed MutateRowsResponse");
    return true;
}

bool ops_bulkcheck_finish(ops_bulkcheck *c) {
    if (c->malformed || c->first_error != ST_OK)
        return false;
    if (c->seen_count != c->entries) {
        snprintf(c->msg, sizeof(c->msg), "%u of %u entries reported", c->seen_count, c->entries);
        c->malformed = true;
        return false;
    }
    return true;
}
