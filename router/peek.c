/* peek.c — the fields the router routes by, read straight from a request's wire bytes, so the
 * hot data calls (ReadRows, MutateRow) are forwarded without unpacking and re-encoding them:
 * protobuf-c would copy every value, filter and key into the call's arena for nothing. A peek
 * accepts only plain encodings (each singular field at most once, with its declared wire type,
 * and mutations carrying one kind each); anything else returns false and the handler unpacks
 * the request as before, so odd inputs keep exactly the old answers (a SetCell in two pieces is
 * refused there, as btu_pb_unpack_request refuses every message field in pieces). What a peek
 * does not read (a filter, a mutation's body) travels to the node, whose unpacking makes the
 * same checks: the router and the nodes accept and refuse the same bytes. Pure. */
#include "router_internal.h"

#include <string.h>

/* Records a singular length-delimited field; false if it was seen before or has another wire
 * type (protobuf would merge or reject: leave that to protobuf-c). */
static bool peek_bytes(const rtr_wire_field *f, st_slice *out, bool *seen) {
    if (f->wire_type != 2 || *seen)
        return false;
    *seen = true;
    *out = f->bytes;
    return true;
}

/* A string field (table name, app profile id, family name) with a NUL byte inside would become
 * its prefix as a C string: such a request is not peeked, and unpacking refuses it. */
static bool peek_str(const rtr_wire_field *f, st_slice *out, bool *seen) {
    return peek_bytes(f, out, seen) && (!out->len || !memchr(out->data, 0, out->len));
}

static bool peek_varint(const rtr_wire_field *f, uint64_t *out, bool *seen) {
    if (f->wire_type != 0 || *seen)
        return false;
    *seen = true;
    *out = f->varint;
    return true;
}

bool rtr_peek_read_rows(st_slice req, rtr_rr_peek *out) {
    /* ReadRowsRequest: table_name 1, rows 2, filter 3, rows_limit 4, app_profile_id 5,
     * request_stats_view 6, reversed 7; others (authorized_view_name 9, newer fields) travel
     * verbatim. */
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    rtr_wire_field f;
    bool bad = false, seen[8] = {false};
    uint64_t limit = 0, reversed = 0, view = 0;
    st_slice filter;
    memset(out, 0, sizeof *out);
    while (rtr_wire_next(&p, end, &f, &bad)) {
        bool ok = true;
        switch (f.num) {
        case 1:
            ok = peek_str(&f, &out->table, &seen[1]);
            break;
        case 2:
            ok = peek_bytes(&f, &out->rows, &seen[2]);
            break;
        case 3:
            ok = peek_bytes(&f, &filter, &seen[3]);
            break;
        case 4:
            ok = peek_varint(&f, &limit, &seen[4]);
            break;
        case 5:
            ok = peek_str(&f, &out->profile, &seen[5]);
            break;
        case 6:
            ok = peek_varint(&f, &view, &seen[6]);
            break;
        case 7:
            ok = peek_varint(&f, &reversed, &seen[7]);
            break;
        default:
            break;
        }
        if (!ok)
            return false;
    }
    out->has_rows = seen[2];
    out->rows_limit = (int64_t)limit;
    out->reversed = reversed != 0;
    return !bad;
}

/* One Mutation: exactly one field of its oneof (set_cell 1, delete_from_column 2,
 * delete_from_family 3, delete_from_row 4, add_to_cell 5, merge_to_cell 6, newer ones); a
 * SetCell whose timestamp_micros (3) is -1 takes the server's time, so it is not idempotent. */
static bool peek_mutation(st_slice m, bool *idempotent) {
    const uint8_t *p = m.data, *end = rtr_slice_end(m);
    rtr_wire_field f;
    bool bad = false;
    size_t kinds = 0;
    st_slice body = {0};
    bool is_set_cell = false;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.wire_type != 2)
            return false;
        kinds++;
        body = f.bytes;
        is_set_cell = f.num == 1;
    }
    if (bad || kinds != 1)
        return false;
    /* Every kind that names a family has it as field 1 (family_name, a string). */
    p = body.data;
    end = rtr_slice_end(body);
    bool seen_ts = false, seen_family = false;
    uint64_t ts = 0;
    st_slice family;
    while (rtr_wire_next(&p, end, &f, &bad))
        if ((is_set_cell && f.num == 3 && !peek_varint(&f, &ts, &seen_ts)) ||
            (f.num == 1 && f.wire_type == 2 && !peek_str(&f, &family, &seen_family)))
            return false;
    if (bad)
        return false;
    if (seen_ts && (int64_t)ts == -1)
        *idempotent = false;
    return true;
}

bool rtr_peek_mutate_row(st_slice req, rtr_mr_peek *out) {
    /* MutateRowRequest: table_name 1, row_key 2, mutations 3 (repeated), app_profile_id 4;
     * others (authorized_view_name 6, newer fields) travel verbatim. */
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    rtr_wire_field f;
    bool bad = false, seen[5] = {false};
    memset(out, 0, sizeof *out);
    out->idempotent = true;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        bool ok = true;
        switch (f.num) {
        case 1:
            ok = peek_str(&f, &out->table, &seen[1]);
            break;
        case 2:
            ok = peek_bytes(&f, &out->row, &seen[2]);
            break;
        case 3:
            ok = f.wire_type == 2 && peek_mutation(f.bytes, &out->idempotent);
            out->n_mutations++;
            break;
        case 4:
            ok = peek_str(&f, &out->profile, &seen[4]);
            break;
        default:
            break;
        }
        if (!ok)
            return false;
    }
    return !bad;
}

/* One MutateRowsRequest.Entry: row_key 1, mutations 2 (repeated). */
static bool peek_entry(st_slice e, rtr_mrs_peek *out) {
    const uint8_t *p = e.data, *end = rtr_slice_end(e);
    rtr_wire_field f;
    bool bad = false, seen_row = false;
    st_slice row = {0};
    while (rtr_wire_next(&p, end, &f, &bad)) {
        bool ok = true;
        if (f.num == 1) {
            ok = peek_bytes(&f, &row, &seen_row);
        } else if (f.num == 2) {
            ok = f.wire_type == 2 && peek_mutation(f.bytes, &out->idempotent);
            out->n_mutations++;
        }
        if (!ok)
            return false;
    }
    if (out->n_entries == 0)
        out->first_row = row;
    out->n_entries++;
    return !bad;
}

bool rtr_peek_mutate_rows(st_slice req, rtr_mrs_peek *out) {
    /* MutateRowsRequest: table_name 1, entries 2 (repeated), app_profile_id 3; others
     * (authorized_view_name 5, newer fields) travel verbatim. */
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    rtr_wire_field f;
    bool bad = false, seen[4] = {false};
    memset(out, 0, sizeof *out);
    out->idempotent = true;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        bool ok = true;
        switch (f.num) {
        case 1:
            ok = peek_str(&f, &out->table, &seen[1]);
            break;
        case 2:
            ok = f.wire_type == 2 && peek_entry(f.bytes, out);
            break;
        case 3:
            ok = peek_str(&f, &out->profile, &seen[3]);
            break;
        default:
            break;
        }
        if (!ok)
            return false;
    }
    return !bad;
}

char *rtr_peek_str(st_arena *a, st_slice s) {
    char *p = st_arena_alloc(a, s.len + 1);
    if (!p)
        return NULL;
    if (s.len)
        memcpy(p, s.data, s.len);
    p[s.len] = '\0';
    return p;
}
