/* rowset.c — RowSet normalisation (btutil.h), moved from node/read_plan.c. Pure functions. */
#include "strata/btutil.h"

#include <stdlib.h>
#include <string.h>

st_code btu_key_successor(st_arena *arena, st_slice k, st_slice *out) {
    uint8_t *p = st_arena_alloc(arena, k.len + 1);
    if (p == NULL)
        return ST_RESOURCE_EXHAUSTED;
    if (k.len > 0)
        memcpy(p, k.data, k.len);
    p[k.len] = 0;
    *out = st_slice_make(p, k.len + 1);
    return ST_OK;
}

bool btu_rowset_is_point(const btu_rowset *rs, size_t max) {
    if (rs->n == 0 || rs->n > max)
        return false;
    for (size_t i = 0; i < rs->n; i++) {
        st_slice a = rs->v[i].start, b = rs->v[i].end;
        if (a.len == 0 || b.len != a.len + 1 || b.data[a.len] != 0 ||
            memcmp(a.data, b.data, a.len) != 0)
            return false;
    }
    return true;
}

static st_slice bin(ProtobufCBinaryData b) {
    return st_slice_make(b.data, b.len);
}

int btu_end_cmp(st_slice a, st_slice b) {
    if (a.len == 0 || b.len == 0)
        return (a.len == 0) - (b.len == 0);
    return st_slice_cmp(a, b);
}

static int range_start_cmp(const void *a, const void *b) {
    const btu_key_range *x = a, *y = b;
    return st_slice_cmp(x->start, y->start); /* empty sorts first, as -inf should */
}

bool btu_range_is_empty(const btu_key_range *r) {
    return r->end.len > 0 && st_slice_cmp(r->start, r->end) >= 0;
}

size_t btu_rowset_merge(btu_key_range *v, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!btu_range_is_empty(&v[i]))
            v[w++] = v[i];
    n = w;
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, range_start_cmp);
    w = 0;
    for (size_t i = 1; i < n; i++) {
        btu_key_range *cur = &v[w];
        /* Touching ranges merge too: [a, b) and [b, c) are [a, c). */
        if (cur->end.len == 0 || st_slice_cmp(v[i].start, cur->end) <= 0) {
            if (btu_end_cmp(v[i].end, cur->end) > 0)
                cur->end = v[i].end;
        } else {
            v[++w] = v[i];
        }
    }
    return w + 1;
}

static st_code range_from_pb(const Google__Bigtable__V2__RowRange *r, size_t i, st_arena *arena,
                             btu_key_range *out, st_err *err) {
    st_slice s = {NULL, 0}, e = {NULL, 0};
    bool s_open = r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
    bool e_closed = r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED;
    if (r->start_key_case != GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY__NOT_SET)
        s = bin(s_open ? r->start_key_open : r->start_key_closed);
    if (r->end_key_case != GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY__NOT_SET)
        e = bin(e_closed ? r->end_key_closed : r->end_key_open);
    if (s.len > BTU_ROW_KEY_MAX || e.len > BTU_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field 'row_ranges' : Error in element #%zu : a row key is "
                          "limited to %d bytes",
                          i, BTU_ROW_KEY_MAX);
    if (s.len > 0 && s_open && btu_key_successor(arena, s, &s) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the row set");
    if (e.len > 0 && e_closed && btu_key_successor(arena, e, &e) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the row set");
    /* Production rejects empty ranges such as [a, a) (java-bigtable-hbase#928); [a, a] is one
     * row and fine. */
    if (e.len > 0 && st_slice_cmp(s, e) >= 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field 'row_ranges' : Error in element #%zu : start_key must "
                          "be less than end_key",
                          i);
    out->start = s;
    out->end = e;
    return ST_OK;
}

st_code btu_rowset_from_pb(const Google__Bigtable__V2__RowSet *rs, st_arena *arena, btu_rowset *out,
                           st_err *err) {
    size_t total = rs ? rs->n_row_keys + rs->n_row_ranges : 0;
    out->v = NULL;
    out->n = 0;
    if (total > BTU_ROWSET_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the row set holds %zu keys and ranges; at most %zu are allowed", total,
                          BTU_ROWSET_MAX);
    out->v = st_arena_alloc(arena, (total ? total : 1) * sizeof *out->v);
    if (out->v == NULL)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the row set");
    if (total == 0) { /* no keys, no ranges: every row */
        out->v[0] = (btu_key_range){{NULL, 0}, {NULL, 0}};
        out->n = 1;
        return ST_OK;
    }
    size_t n = 0;
    for (size_t i = 0; i < rs->n_row_keys; i++) {
        st_slice k = bin(rs->row_keys[i]);
        if (k.len > BTU_ROW_KEY_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field 'row_keys' : Error in element #%zu : a row key is "
                              "limited to %d bytes, got %zu",
                              i, BTU_ROW_KEY_MAX, k.len);
        if (k.len == 0)
            continue; /* no row has an empty key */
        out->v[n].start = k;
        if (btu_key_successor(arena, k, &out->v[n].end) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the row set");
        n++;
    }
    for (size_t i = 0; i < rs->n_row_ranges; i++) {
        st_code rc = range_from_pb(rs->row_ranges[i], i, arena, &out->v[n], err);
        if (rc != ST_OK)
            return rc;
        n++;
    }
    out->n = btu_rowset_merge(out->v, n);
    return ST_OK;
}
