/* mutate.c — MutateRow and MutateRows: validation (Bigtable's limits and error texts), the
 * protobuf -> storage conversion, row locks, and the durable write through group commit. */
#include "node_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Google__Bigtable__V2__Mutation pb_mut;

/* ---- one mutation ---- */

static st_code check_family(const node_table *meta, const char *family, st_err *err) {
    if (!node_table_family((node_table *)meta, st_slice_cstr(family)))
        return st_err_set(err, ST_NOT_FOUND,
                          "Requested column family not found: \"%s\" is not a family of table %s",
                          family, meta->name);
    return ST_OK;
}

static st_code check_ts(int64_t ts, const char *what, st_err *err) {
    if (ts < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s must not be negative, got %lld", what,
                          (long long)ts);
    if (ts % 1000 != 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Timestamp granularity mismatch. Expected a multiple of 1000 "
                          "(millisecond granularity), but got %lld.",
                          (long long)ts);
    return ST_OK;
}

static st_code set_cell_from_pb(const node_table *meta,
                                const Google__Bigtable__V2__Mutation__SetCell *s,
                                int64_t server_ts_us, sto_mut *out, st_err *err) {
    st_code rc = check_family(meta, s->family_name, err);
    if (rc != ST_OK)
        return rc;
    if (s->column_qualifier.len > NODE_QUALIFIER_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "column qualifier longer than %d bytes",
                          NODE_QUALIFIER_MAX);
    if (s->value.len > NODE_VALUE_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "cell value longer than %u bytes (100 MiB)",
                          NODE_VALUE_MAX);
    int64_t ts = s->timestamp_micros;
    if (ts == -1)
        ts = server_ts_us;
    else if ((rc = check_ts(ts, "SetCell timestamp_micros", err)) != ST_OK)
        return rc;
    out->type = STO_MUT_SET_CELL;
    out->family = st_slice_cstr(s->family_name);
    out->qualifier = st_slice_make(s->column_qualifier.data, s->column_qualifier.len);
    out->ts_us = ts;
    out->value = st_slice_make(s->value.data, s->value.len);
    return ST_OK;
}

static st_code del_column_from_pb(const node_table *meta,
                                  const Google__Bigtable__V2__Mutation__DeleteFromColumn *d,
                                  sto_mut *out, st_err *err) {
    st_code rc = check_family(meta, d->family_name, err);
    if (rc != ST_OK)
        return rc;
    int64_t start = 0, end = 0;
    if (d->time_range) {
        start = d->time_range->start_timestamp_micros;
        end = d->time_range->end_timestamp_micros;
        if ((rc = check_ts(start, "time_range start", err)) != ST_OK ||
            (rc = check_ts(end, "time_range end", err)) != ST_OK)
            return rc;
        if (end != 0 && end <= start)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "time_range end (%lld) must be after its start (%lld)",
                              (long long)end, (long long)start);
    }
    out->type = STO_MUT_DEL_COLUMN;
    out->family = st_slice_cstr(d->family_name);
    out->qualifier = st_slice_make(d->column_qualifier.data, d->column_qualifier.len);
    out->ts_start_us = start;
    out->ts_end_us = end == 0 ? STO_TS_END_INF : end;
    return ST_OK;
}

st_code node_mutation_from_pb(node_ctx *n, const node_table *meta, const pb_mut *m,
                              int64_t server_ts_us, sto_mut *out, st_err *err) {
    (void)n;
    memset(out, 0, sizeof *out);
    switch (m->mutation_case) {
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL:
        return set_cell_from_pb(meta, m->set_cell, server_ts_us, out, err);
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN:
        return del_column_from_pb(meta, m->delete_from_column, out, err);
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY: {
        st_code rc = check_family(meta, m->delete_from_family->family_name, err);
        out->type = STO_MUT_DEL_FAMILY;
        out->family = st_slice_cstr(m->delete_from_family->family_name);
        return rc;
    }
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW:
        out->type = STO_MUT_DEL_ROW;
        return ST_OK;
    default:
        /* add_to_cell 5, merge_to_cell 6 upstream: a valid request Strata cannot carry out */
        if (btu_pb_has_unknown(&m->base, 5) || btu_pb_has_unknown(&m->base, 6))
            return st_err_set(err, ST_UNIMPLEMENTED,
                              "AddToCell and MergeToCell (aggregate column families) are not "
                              "supported: use SetCell, or ReadModifyWriteRow to increment");
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "mutation has no supported kind set (SetCell, DeleteFromColumn, "
                          "DeleteFromFamily, DeleteFromRow)");
    }
}

/* Converts a row's mutation list into arena memory; checks the row key and count too. */
static st_code row_from_pb(node_ctx *n, const node_table *meta, ProtobufCBinaryData key,
                           pb_mut **muts, size_t n_muts, st_arena *a, sto_row_mut *row,
                           st_err *err) {
    memset(row, 0, sizeof *row);
    if (key.len == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "row key must not be empty");
    if (key.len > NODE_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "row key longer than %d bytes (%zu)",
                          NODE_ROW_KEY_MAX, key.len);
    if (n_muts == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "No mutations provided");
    if (n_muts > NODE_MUTATIONS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "Too many mutations: %zu provided; limit %d",
                          n_muts, NODE_MUTATIONS_MAX);
    sto_mut *out = st_arena_alloc(a, n_muts * sizeof *out);
    if (!out)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    int64_t ts = node_server_ts_us(n);
    for (size_t i = 0; i < n_muts; i++) {
        st_code rc = node_mutation_from_pb(n, meta, muts[i], ts, &out[i], err);
        if (rc != ST_OK) {
            st_err_prefix(err, "Error in element #%zu : ", i);
            return rc;
        }
    }
    row->row = st_slice_make(key.data, key.len);
    row->muts = out;
    row->n_muts = n_muts;
    return ST_OK;
}

/* ---- MutateRow ---- */

typedef struct mutate_op {
    rpc_call *call;
    const char *table;
    sto_row_mut row;
} mutate_op;

static void mutate_durable(node_ctx *n, st_code code, const char *msg, void *arg) {
    mutate_op *op = arg;
    node_rowlock_release(n, op->table, op->row.row);
    if (code != ST_OK) {
        node_fail(op->call, code, "%s", msg ? msg : "write failed");
        return;
    }
    Google__Bigtable__V2__MutateRowResponse resp;
    google__bigtable__v2__mutate_row_response__init(&resp);
    node_reply(op->call, &resp.base);
}

static void mutate_locked(node_ctx *n, void *arg) {
    mutate_op *op = arg;
    st_err err = {0};
    st_code rc = node_write_fence_check(op->call, &err);
    if (rc == ST_OK)
        rc = node_row_prepare(n, op->table, &op->row, &err);
    if (rc == ST_OK)
        rc = node_write(n, &op->row, 1, &err, mutate_durable, op);
    if (rc != ST_OK) {
        node_rowlock_release(n, op->table, op->row.row);
        node_fail(op->call, rc, "%s", err.msg);
    }
}

void node_h_mutate_row(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__MutateRowRequest *req =
        (void *)node_unpack(call, &google__bigtable__v2__mutate_row_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->table_name, &meta))
        return;
    st_arena *a = rpc_call_arena(call);
    mutate_op *op = st_arena_alloc(a, sizeof *op);
    if (!op) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_err err = {0};
    st_code rc =
        row_from_pb(n, meta, req->row_key, req->mutations, req->n_mutations, a, &op->row, &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "Error in Mutation list : %s", err.msg);
        return;
    }
    op->call = call;
    op->table = st_arena_dup(a, meta->name, strlen(meta->name) + 1);
    if (!op->table || node_rowlock_acquire(n, op->table, op->row.row, mutate_locked, op) != ST_OK)
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
}

/* ---- MutateRows ---- */

typedef struct rows_op {
    rpc_call *call;
    const char *table;
    size_t n_entries;
    st_code *codes; /* per entry */
    const char **msgs;
    sto_row_mut *rows; /* the valid entries */
    size_t *row_entry; /* rows[i] is entry row_entry[i] */
    size_t n_rows;
    st_slice *locks; /* distinct row keys, sorted: taken in this order, so no deadlock */
    size_t n_locks, locked;
} rows_op;

static void rows_release(node_ctx *n, rows_op *op) {
    for (size_t i = 0; i < op->locked; i++)
        node_rowlock_release(n, op->table, op->locks[i]);
    op->locked = 0;
}

static void rows_reply(rows_op *op) {
    st_arena *a = rpc_call_arena(op->call);
    Google__Bigtable__V2__MutateRowsResponse resp;
    google__bigtable__v2__mutate_rows_response__init(&resp);
    resp.entries = st_arena_alloc(a, op->n_entries * sizeof *resp.entries);
    Google__Bigtable__V2__MutateRowsResponse__Entry *ents =
        st_arena_alloc(a, op->n_entries * sizeof *ents);
    Google__Rpc__Status *sts = st_arena_alloc(a, op->n_entries * sizeof *sts);
    if (!resp.entries || !ents || !sts) {
        node_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < op->n_entries; i++) {
        google__bigtable__v2__mutate_rows_response__entry__init(&ents[i]);
        google__rpc__status__init(&sts[i]);
        sts[i].code = (int32_t)op->codes[i];
        sts[i].message = (char *)(op->msgs[i] ? op->msgs[i] : "");
        ents[i].index = (int64_t)i;
        ents[i].status = &sts[i];
        resp.entries[i] = &ents[i];
    }
    resp.n_entries = op->n_entries;
    node_reply(op->call, &resp.base);
}

static void rows_durable(node_ctx *n, st_code code, const char *msg, void *arg) {
    rows_op *op = arg;
    rows_release(n, op);
    if (code != ST_OK) {
        const char *m =
            st_arena_dup(rpc_call_arena(op->call), msg ? msg : "", strlen(msg ? msg : "") + 1);
        for (size_t i = 0; i < op->n_rows; i++) {
            op->codes[op->row_entry[i]] = code;
            op->msgs[op->row_entry[i]] = m;
        }
    }
    rows_reply(op);
}

/* A row no writable local tablet holds fails the whole call with strata-not-owner, nothing
 * written, so a router refreshes its map and resends the entries to their owners. */
static void rows_write(node_ctx *n, rows_op *op) {
    st_err err = {0};
    st_code rc = node_write_fence_check(op->call, &err);
    if (rc != ST_OK) { /* the whole call, so that the router sends every entry elsewhere */
        rows_release(n, op);
        node_fail(op->call, rc, "%s", err.msg);
        return;
    }
    for (size_t i = 0; rc == ST_OK && i < op->n_rows; i++)
        rc = node_row_prepare(n, op->table, &op->rows[i], &err);
    if (rc == ST_FAILED_PRECONDITION) {
        rows_release(n, op);
        node_fail(op->call, rc, "%s", err.msg);
        return;
    }
    if (rc == ST_OK && (rc = node_write(n, op->rows, op->n_rows, &err, rows_durable, op)) == ST_OK)
        return;
    rows_durable(n, rc, err.msg, op);
}

static void rows_lock_granted(node_ctx *n, void *arg);

/* Takes the remaining locks in order; parks on the first busy one and continues when granted. */
static void rows_lock_more(node_ctx *n, void *arg) {
    rows_op *op = arg;
    while (op->locked < op->n_locks) {
        if (node_rowlock_try(n, op->table, op->locks[op->locked])) {
            op->locked++;
            continue;
        }
        if (node_rowlock_acquire(n, op->table, op->locks[op->locked], rows_lock_granted, op) !=
            ST_OK) {
            rows_release(n, op);
            node_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        return;
    }
    rows_write(n, op);
}

static void rows_lock_granted(node_ctx *n, void *arg) {
    rows_op *op = arg;
    op->locked++;
    rows_lock_more(n, op);
}

static int slice_cmp(const void *a, const void *b) {
    return st_slice_cmp(*(const st_slice *)a, *(const st_slice *)b);
}

/* Validates each entry on its own: a bad entry gets its own status, the others are written. */
static st_code rows_prepare(node_ctx *n, const node_table *meta,
                            Google__Bigtable__V2__MutateRowsRequest *req, rows_op *op) {
    st_arena *a = rpc_call_arena(op->call);
    size_t ne = req->n_entries;
    op->codes = st_arena_alloc(a, ne * sizeof *op->codes);
    op->msgs = st_arena_alloc(a, ne * sizeof *op->msgs);
    op->rows = st_arena_alloc(a, ne * sizeof *op->rows);
    op->row_entry = st_arena_alloc(a, ne * sizeof *op->row_entry);
    op->locks = st_arena_alloc(a, ne * sizeof *op->locks);
    if (!op->codes || !op->msgs || !op->rows || !op->row_entry || !op->locks)
        return ST_RESOURCE_EXHAUSTED;
    op->n_entries = ne;
    for (size_t i = 0; i < ne; i++) {
        const Google__Bigtable__V2__MutateRowsRequest__Entry *e = req->entries[i];
        st_err err = {0};
        op->msgs[i] = NULL;
        op->codes[i] = row_from_pb(n, meta, e->row_key, e->mutations, e->n_mutations, a,
                                   &op->rows[op->n_rows], &err);
        if (op->codes[i] != ST_OK) {
            op->msgs[i] = st_arena_dup(a, err.msg, strlen(err.msg) + 1);
            continue;
        }
        op->row_entry[op->n_rows] = i;
        op->locks[op->n_rows] = op->rows[op->n_rows].row;
        op->n_rows++;
    }
    qsort(op->locks, op->n_rows, sizeof *op->locks, slice_cmp);
    for (size_t i = 0; i < op->n_rows; i++)
        if (op->n_locks == 0 || !st_slice_eq(op->locks[op->n_locks - 1], op->locks[i]))
            op->locks[op->n_locks++] = op->locks[i];
    return ST_OK;
}

void node_h_mutate_rows(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__MutateRowsRequest *req = (void *)node_unpack(
        call, &google__bigtable__v2__mutate_rows_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->table_name, &meta))
        return;
    if (req->n_entries == 0) {
        node_fail(call, ST_INVALID_ARGUMENT, "No entries provided");
        return;
    }
    if (req->n_entries > NODE_MUTATIONS_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT,
                  "Too many entries: %zu provided; limit %d (each entry needs at least one "
                  "mutation)",
                  req->n_entries, NODE_MUTATIONS_MAX);
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < req->n_entries; i++)
        total += req->entries[i]->n_mutations;
    if (total > NODE_MUTATIONS_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "Too many mutations: %zu provided; limit %d", total,
                  NODE_MUTATIONS_MAX);
        return;
    }
    st_arena *a = rpc_call_arena(call);
    rows_op *op = st_arena_alloc(a, sizeof *op);
    if (!op) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    memset(op, 0, sizeof *op);
    op->call = call;
    op->table = st_arena_dup(a, meta->name, strlen(meta->name) + 1);
    if (!op->table || rows_prepare(n, meta, req, op) != ST_OK) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (op->n_rows == 0) {
        rows_reply(op);
        return;
    }
    rows_lock_more(n, op);
}

/* ---- PingAndWarm ---- */

void node_h_ping_and_warm(rpc_call *call, st_slice req_bytes, void *arg) {
    (void)arg;
    Google__Bigtable__V2__PingAndWarmRequest *req = (void *)node_unpack(
        call, &google__bigtable__v2__ping_and_warm_request__descriptor, req_bytes);
    if (!req)
        return;
    Google__Bigtable__V2__PingAndWarmResponse resp;
    google__bigtable__v2__ping_and_warm_response__init(&resp);
    node_reply(call, &resp.base);
}
