/* rowmut.c — the encoding of one row mutation (docs/formats/log.md, row mutation payload): the
 * payload of a commit log record, and what replication and tablet moves carry on the wire, so
 * everything that ships a record ships its stored bytes. Declared in strata/storage.h. Decoding
 * checks every length against the bytes left and the limits, so hostile bytes are refused. */
#include "rowmut.h"

#include <string.h>

#define ROWMUT_FORMAT 1

static uint64_t zigzag(int64_t v) {
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}
static int64_t unzigzag(uint64_t v) {
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

/* The encoders below write into room reserved once per row (sto_row_mut_bound), not through an
 * st_buf call per field: a row is encoded on every write's path (its log record, and with change
 * streams on its change record once or twice), with a dozen varints, written inline here. */
static inline uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_bytes(uint8_t *p, st_slice s) {
    p = put_varint(p, s.len);
    if (s.len)
        memcpy(p, s.data, s.len);
    return p + s.len;
}

static uint8_t *put_mut(uint8_t *p, const sto_mut *m) {
    *p++ = (uint8_t)m->type;
    switch (m->type) {
    case STO_MUT_SET_CELL:
        p = put_bytes(put_bytes(p, m->family), m->qualifier);
        p = put_varint(p, zigzag(m->ts_us));
        return put_bytes(p, m->value);
    case STO_MUT_DEL_COLUMN:
        p = put_bytes(put_bytes(p, m->family), m->qualifier);
        p = put_varint(p, zigzag(m->ts_start_us));
        return put_varint(p, zigzag(m->ts_end_us));
    case STO_MUT_DEL_FAMILY:
        return put_bytes(p, m->family);
    case STO_MUT_DEL_ROW:
        return p;
    }
    return p;
}

/* Adds n to *sum; false on overflow. */
static bool bound_add(size_t *sum, size_t n) {
    if (n > SIZE_MAX - *sum)
        return false;
    *sum += n;
    return true;
}

bool sto_row_mut_bound(const sto_row_mut *row, size_t *out) {
    size_t n = 1 + 7 * ST_VARINT64_MAX + row->row.len;
    for (size_t i = 0; i < row->n_muts; i++) {
        const sto_mut *m = &row->muts[i];
        if (!bound_add(&n, 1 + 5 * ST_VARINT64_MAX) || !bound_add(&n, m->family.len) ||
            !bound_add(&n, m->qualifier.len) ||
            !bound_add(&n, m->type == STO_MUT_SET_CELL ? m->value.len : 0))
            return false;
    }
    *out = n;
    return true;
}

static bool mut_type_ok(sto_mut_type t) {
    return t >= STO_MUT_SET_CELL && t <= STO_MUT_DEL_ROW;
}

st_code sto_row_mut_encode(st_buf *out, const sto_row_mut *row) {
    if (row->n_muts > STO_ROW_MUTS_MAX || row->row.len > STO_ROW_KEY_MAX)
        return ST_INVALID_ARGUMENT;
    for (size_t i = 0; i < row->n_muts; i++)
        if (!mut_type_ok(row->muts[i].type))
            return ST_INVALID_ARGUMENT;
    size_t bound;
    if (!sto_row_mut_bound(row, &bound) || st_buf_reserve(out, bound) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    uint8_t *p = out->data + out->len;
    *p++ = ROWMUT_FORMAT;
    p = put_varint(p, row->tablet_id);
    p = put_bytes(p, row->row);
    p = put_varint(p, row->version);
    p = put_varint(p, row->commit_ts_us);
    p = put_varint(p, row->origin);
    p = put_varint(p, row->flags);
    p = put_varint(p, row->n_muts);
    for (size_t i = 0; i < row->n_muts; i++)
        p = put_mut(p, &row->muts[i]);
    ST_ASSERT((size_t)(p - (out->data + out->len)) <= bound);
    out->len = (size_t)(p - out->data);
    return ST_OK;
}

/* st_get_varint64 inline (the same checks), without a bound check per byte when ten bytes are
 * left: readers decode a row per change record they send and per replicated row they apply, and
 * a row's version, commit time and timestamps are 8 and 9 byte varints. */
static inline bool get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *v) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *v = *p;
        *pp = p + 1;
        return true;
    }
    if (end - p < 10)
        return st_get_varint64(pp, end, v);
    uint64_t r = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        uint8_t byte = *p++;
        if (shift == 63 && byte > 1)
            return false;
        r |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *pp = p;
            *v = r;
            return true;
        }
    }
    return false;
}

static bool get_bytes_max(const uint8_t **pp, const uint8_t *end, st_slice *out, size_t max) {
    const uint8_t *p = *pp;
    uint64_t len;
    if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p) || len > max)
        return false;
    *out = st_slice_make(p, (size_t)len);
    *pp = p + len;
    return true;
}

static bool get_zigzag(const uint8_t **p, const uint8_t *end, int64_t *v) {
    uint64_t u;
    if (!get_varint(p, end, &u))
        return false;
    *v = unzigzag(u);
    return true;
}

static bool get_mut(const uint8_t **p, const uint8_t *end, sto_mut *m) {
    memset(m, 0, sizeof *m);
    if (*p >= end)
        return false;
    m->type = (sto_mut_type) * (*p)++;
    switch (m->type) {
    case STO_MUT_SET_CELL:
        return get_bytes_max(p, end, &m->family, SIZE_MAX) &&
               get_bytes_max(p, end, &m->qualifier, STO_QUALIFIER_MAX) &&
               get_zigzag(p, end, &m->ts_us) && m->ts_us >= 0 &&
               get_bytes_max(p, end, &m->value, STO_VALUE_MAX);
    case STO_MUT_DEL_COLUMN:
        return get_bytes_max(p, end, &m->family, SIZE_MAX) &&
               get_bytes_max(p, end, &m->qualifier, STO_QUALIFIER_MAX) &&
               get_zigzag(p, end, &m->ts_start_us) && get_zigzag(p, end, &m->ts_end_us);
    case STO_MUT_DEL_FAMILY:
        return get_bytes_max(p, end, &m->family, SIZE_MAX);
    case STO_MUT_DEL_ROW:
        return true;
    }
    return false; /* unknown type */
}

/* Decodes a row's head (everything before its mutations) into row and leaves *pp at the first
 * mutation; row->n_muts is their count, bounded by the bytes left (each takes at least one). */
static bool row_head_decode(const uint8_t **pp, const uint8_t *end, sto_row_mut *row) {
    const uint8_t *p = *pp;
    uint64_t origin, flags, n;
    memset(row, 0, sizeof *row);
    if (p == end || *p++ != ROWMUT_FORMAT)
        return false;
    if (!get_varint(&p, end, &row->tablet_id) ||
        !get_bytes_max(&p, end, &row->row, STO_ROW_KEY_MAX) ||
        !get_varint(&p, end, &row->version) || !get_varint(&p, end, &row->commit_ts_us) ||
        !get_varint(&p, end, &origin) || origin > UINT32_MAX || !get_varint(&p, end, &flags) ||
        flags > UINT32_MAX || !get_varint(&p, end, &n) || n > STO_ROW_MUTS_MAX ||
        n > (uint64_t)(end - p))
        return false;
    row->origin = (uint32_t)origin;
    row->flags = (uint32_t)flags;
    row->n_muts = (size_t)n;
    *pp = p;
    return true;
}

bool sto_row_mut_peek(st_slice data, sto_row_mut *row) {
    const uint8_t *p = data.data;
    return row_head_decode(&p, data.data + data.len, row);
}

bool sto_row_mut_decode(st_slice data, sto_row_mut *row, st_arena *arena) {
    const uint8_t *p = data.data, *end = data.data + data.len;
    if (!row_head_decode(&p, end, row))
        return false;
    sto_mut *muts = NULL;
    if (row->n_muts > 0 && !(muts = st_arena_alloc(arena, row->n_muts * sizeof *muts)))
        return false;
    for (size_t i = 0; i < row->n_muts; i++)
        if (!get_mut(&p, end, &muts[i]))
            return false;
    if (p != end)
        return false;
    row->muts = muts;
    return true;
}
