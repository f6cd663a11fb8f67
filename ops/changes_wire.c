/* ops/changes_wire.c — a ReadChangeStreamResponse read at the wire level (ops/changes.h): the
 * DataChange fields a consumer that only follows keys needs, found by walking the protobuf
 * fields, values skipped where they are instead of unpacked and copied. Field numbers are those
 * of google/bigtable/v2/bigtable.proto (ReadChangeStreamResponse) and data.proto (Mutation). */
#include <stdint.h>
#include <string.h>

#include "changes.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef struct wire {
    const uint8_t *p, *end;
} wire;

typedef struct wire_field {
    uint32_t num, type;
    uint64_t v; /* varint / fixed value */
    st_slice s; /* length-delimited bytes */
} wire_field;

static bool varint(wire *w, uint64_t *out) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        uint8_t b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* The next field; false at the end (*bad set when the bytes are not protobuf). */
static bool field_next(wire *w, wire_field *f, bool *bad) {
    if (w->p >= w->end)
        return false;
    uint64_t key, len;
    if (*w->p < 0x80) /* a field number below 16: the key is one byte */
        key = *w->p++;
    else if (!varint(w, &key))
        return !(*bad = true);
    if ((key >> 3) == 0 || (key >> 3) > UINT32_MAX)
        return !(*bad = true);
    f->num = (uint32_t)(key >> 3);
    f->type = (uint32_t)(key & 7);
    switch (f->type) {
    case WT_VARINT:
        return varint(w, &f->v) || !(*bad = true);
    case WT_I64:
    case WT_I32: {
        size_t n = f->type == WT_I64 ? 8 : 4;
        if ((size_t)(w->end - w->p) < n)
            return !(*bad = true);
        w->p += n;
        return true;
    }
    case WT_LEN:
        if (!varint(w, &len) || len > (uint64_t)(w->end - w->p))
            return !(*bad = true);
        f->s = (st_slice){w->p, (size_t)len};
        w->p += len;
        return true;
    default: /* groups and unknown wire types */
        return !(*bad = true);
    }
}

static wire wire_of(st_slice s) {
    return (wire){s.data, s.data + s.len};
}

/* google.protobuf.Timestamp in microseconds. */
static bool timestamp_us(st_slice s, int64_t *us) {
    wire w = wire_of(s);
    wire_field f;
    bool bad = false;
    int64_t sec = 0, nanos = 0;
    while (field_next(&w, &f, &bad)) {
        if (f.num == 1 && f.type == WT_VARINT)
            sec = (int64_t)f.v;
        else if (f.num == 2 && f.type == WT_VARINT)
            nanos = (int32_t)f.v;
    }
    if (sec > INT64_MAX / 1000000 - 1 || sec < INT64_MIN / 1000000 + 1)
        return false; /* not a time a stream can carry (and no overflow below) */
    *us = sec * 1000000 + nanos / 1000;
    return !bad;
}

/* The length of a Mutation's set_cell value (0 for other mutations). */
static bool mutation_value_len(st_slice s, size_t *len, bool *is_set) {
    wire w = wire_of(s);
    wire_field f, g;
    bool bad = false;
    *len = 0;
    *is_set = false;
    while (field_next(&w, &f, &bad)) {
        if (f.num != 1 || f.type != WT_LEN)
            continue;
        *is_set = true;
        *len = 0;
        wire sc = wire_of(f.s);
        while (field_next(&sc, &g, &bad))
            if (g.num == 4 && g.type == WT_LEN)
                *len = g.s.len;
    }
    return !bad;
}

/* One MutationChunk: its value bytes checked against its ChunkInfo and the chunked value in
 * progress (dc->chunk_open, dc->chunk_got). */
static bool chunk_check(st_slice s, ops_cs_wire_dc *dc) {
    wire w = wire_of(s);
    wire_field f, g;
    bool bad = false, has_info = false, last = false, has_mut = false, is_set = false;
    uint64_t size = 0, offset = 0;
    size_t vlen = 0;
    st_slice mut = {0};
    while (field_next(&w, &f, &bad)) {
        if (f.num == 1 && f.type == WT_LEN) {
            has_info = true;
            wire ci = wire_of(f.s);
            while (field_next(&ci, &g, &bad)) {
                if (g.type != WT_VARINT)
                    continue;
                if (g.num == 1)
                    size = (uint32_t)g.v;
                else if (g.num == 2)
                    offset = (uint32_t)g.v;
                else if (g.num == 3)
                    last = g.v != 0;
            }
        } else if (f.num == 2 && f.type == WT_LEN) {
            has_mut = true;
            mut = f.s;
        }
    }
    if (bad || !has_mut)
        return false;
    if (!dc->chunk_open && !has_info)
        return true; /* a whole mutation: its value is not looked at */
    if (!mutation_value_len(mut, &vlen, &is_set))
        return false;
    if (!has_info || !is_set || offset != dc->chunk_got || (!dc->chunk_open && offset != 0))
        return false;
    dc->chunk_got += vlen;
    if (size == 0)
        size = dc->chunk_size;
    dc->chunk_size = size;
    dc->chunk_open = !last;
    return !last || size == 0 || dc->chunk_got == size;
}

static void dc_field(const wire_field *f, ops_cs_wire_dc *dc, bool *bad) {
    if (f->type == WT_VARINT) {
        if (f->num == 1)
            dc->type = (int)f->v;
        else if (f->num == 5)
            dc->tiebreaker = (int32_t)f->v;
        else if (f->num == 8)
            dc->done = f->v != 0;
        return;
    }
    if (f->type != WT_LEN)
        return;
    switch (f->num) {
    case 2:
        dc->cluster = f->s;
        break;
    case 3:
        dc->row = f->s;
        break;
    case 4:
        *bad = *bad || !timestamp_us(f->s, &dc->commit_us);
        break;
    case 6:
        dc->n_chunks++;
        if (dc->chunks_ok && !chunk_check(f->s, dc))
            dc->chunks_ok = false;
        break;
    case 9:
        dc->token = f->s;
        break;
    case 10:
        *bad = *bad || !timestamp_us(f->s, &dc->watermark_us);
        break;
    default:
        break;
    }
}

ops_cs_wire_rc ops_cs_wire_decode(st_slice msg, ops_cs_wire_dc *dc) {
    memset(dc, 0, sizeof *dc);
    dc->chunks_ok = true;
    wire w = wire_of(msg);
    wire_field f;
    bool bad = false, other = false, seen_dc = false;
    st_slice body = {0};
    while (field_next(&w, &f, &bad)) {
        if (f.type != WT_LEN || f.num < 1 || f.num > 3)
            continue;
        /* the oneof: the last of its members present wins, as protobuf's parsers do */
        other = f.num != 1;
        seen_dc = f.num == 1;
        body = f.s;
    }
    if (bad)
        return OPS_CS_WIRE_BAD;
    if (other || !seen_dc)
        return OPS_CS_WIRE_OTHER;
    wire d = wire_of(body);
    while (field_next(&d, &f, &bad) && !bad)
        dc_field(&f, dc, &bad);
    return bad ? OPS_CS_WIRE_BAD : OPS_CS_WIRE_DC;
}
