/* txn.c — single-row transactions (CheckAndMutateRow, ReadModifyWriteRow) and SampleRowKeys.
 * A transaction holds its row lock from the read until its write is durable, so it sees every
 * write queued before it and none after (node_internal.h, row locks). */
#include "filter_pb.h"
#include "node_internal.h"

#include <stdlib.h>
#include <string.h>

#define SAMPLE_EVERY_BYTES ((uint64_t)64 << 20) /* SampleRowKeys granularity inside a tablet */

/* ---- reading one row ---- */

st_code node_row_each(node_tablet *tab, st_slice row, st_code (*fn)(const sto_cell *c, void *arg),
                      void *arg, st_err *err) {
    sto_snapshot *snap;
    st_code rc = sto_snapshot_new(tab->st, &snap, err);
    if (rc != ST_OK)
        return rc;
    sto_range range = {.start = row, .end = row, .end_inclusive = true};
    sto_iter *it;
    rc = sto_iter_new(snap, &range, false, &it, err);
    if (rc == ST_OK) {
        sto_cell c;
        while ((rc = sto_iter_next(it, &c, err)) == ST_OK && (rc = fn(&c, arg)) == ST_OK) {
        }
        if (rc == ST_NOT_FOUND)
            rc = ST_OK;
        sto_iter_free(it);
    }
    sto_snapshot_free(snap);
    return rc;
}

typedef struct row_copy {
    st_arena *arena;
    node_row_cell *cells;
    size_t n, cap;
} row_copy;

static st_code copy_cell(const sto_cell *c, void *arg) {
    row_copy *out = arg;
    if (out->n == out->cap) {
        size_t ncap = out->cap ? out->cap * 2 : 16;
        node_row_cell *v = st_arena_alloc(out->arena, ncap * sizeof *v);
        if (!v)
            return ST_RESOURCE_EXHAUSTED;
        if (out->cap)
            memcpy(v, out->cells, out->cap * sizeof *v);
        out->cells = v;
        out->cap = ncap;
    }
    node_row_cell *cell = &out->cells[out->n++];
    cell->family =
        st_slice_make(st_arena_dup(out->arena, c->family.data, c->family.len), c->family.len);
    cell->qualifier = st_slice_make(st_arena_dup(out->arena, c->qualifier.data, c->qualifier.len),
                                    c->qualifier.len);
    cell->value =
        st_slice_make(st_arena_dup(out->arena, c->value.data, c->value.len), c->value.len);
    cell->ts_us = c->ts_us;
    if ((c->family.len && !cell->family.data) || (c->value.len && !cell->value.data) ||
        (c->qualifier.len && !cell->qualifier.data))
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

st_code node_read_row(node_tablet *tab, st_slice row, st_arena *arena, node_row_cell **cells,
                      size_t *n_cells, st_err *err) {
    row_copy out = {.arena = arena};
    st_code code = node_row_each(tab, row, copy_cell, &out, err);
    *cells = out.cells;
    *n_cells = out.n;
    if (code == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, code, "out of memory reading a row");
    return code;
}

/* ---- CheckAndMutateRow ---- */

typedef struct cam_op {
    rpc_call *call;
    const char *table;
    st_slice row;
    node_filter *predicate; /* prepared; NULL = the row has any cell */
    sto_mut *on_true, *on_false;
    size_t n_true, n_false;
    bool matched;
} cam_op;

static void cam_reply(cam_op *op) {
    Google__Bigtable__V2__CheckAndMutateRowResponse resp;
    google__bigtable__v2__check_and_mutate_row_response__init(&resp);
    resp.predicate_matched = op->matched;
    node_reply(op->call, &resp.base);
}

static void cam_durable(node_ctx *n, st_code code, const char *msg, void *arg) {
    cam_op *op = arg;
    node_rowlock_release(n, op->table, op->row);
    node_filter_release(op->predicate);
    if (code != ST_OK) {
        node_fail(op->call, code, "%s", msg ? msg : "write failed");
        return;
    }
    cam_reply(op);
}

/* Evaluates the predicate on the row as it is now. */
static st_code cam_match(node_tablet *tab, cam_op *op, st_err *err) {
    st_arena scratch;
    st_arena_init(&scratch, 64 << 10);
    node_row_cell *cells;
    size_t count;
    st_code rc = node_read_row(tab, op->row, &scratch, &cells, &count, err);
    node_cell *nc = rc == ST_OK ? st_arena_alloc(&scratch, (count + 1) * sizeof *nc) : NULL;
    if (rc == ST_OK && !nc)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == ST_OK) {
        size_t value_bytes = 0;
        for (size_t i = 0; i < count; i++) {
            nc[i] = (node_cell){
                cells[i].family, cells[i].qualifier, cells[i].ts_us, cells[i].value, NULL, 0};
            value_bytes += cells[i].value.len;
        }
        st_rng rng;
        st_rng_seed(&rng, (uint64_t)st_mono_us());
        node_filter_ctx fctx = {.arena = &scratch, .rng = &rng};
        const node_cell *const *out;
        size_t out_n = 0;
        /* Runs on the loop in one piece, so its work is bounded (docs/filters.md); refused before
         * anything is written: the client learns the predicate was not evaluated. */
        rc =
            node_filter_row_work_check(node_filter_cost_of(op->predicate), count, value_bytes, err);
        if (rc == ST_OK)
            rc = node_filter_eval(op->predicate, op->row, nc, count, &fctx, &out, &out_n, err);
        op->matched = rc == ST_OK && out_n > 0;
    }
    st_arena_deinit(&scratch);
    return rc;
}

static void cam_locked(node_ctx *n, void *arg) {
    cam_op *op = arg;
    st_err err = {0};
    node_tablet *tab = node_write_tablet(n, op->table, op->row, &err);
    st_code rc = tab ? cam_match(tab, op, &err) : err.code;
    size_t count = op->matched ? op->n_true : op->n_false;
    if (rc == ST_OK && count == 0) {
        node_rowlock_release(n, op->table, op->row);
        node_filter_release(op->predicate);
        cam_reply(op);
        return;
    }
    if (rc == ST_OK) {
        sto_row_mut row = {
            .row = op->row, .muts = op->matched ? op->on_true : op->on_false, .n_muts = count};
        rc = node_row_prepare(n, op->table, &row, &err);
        if (rc == ST_OK)
            rc = node_write(n, &row, 1, &err, cam_durable, op);
        if (rc == ST_OK)
            return;
    }
    node_rowlock_release(n, op->table, op->row);
    node_filter_release(op->predicate);
    node_fail(op->call, rc, "%s", err.msg);
}

/* Converts one branch's mutations into arena memory. */
static st_code cam_branch(node_ctx *n, const node_table *meta, Google__Bigtable__V2__Mutation **m,
                          size_t count, st_arena *a, sto_mut **out, st_err *err) {
    *out = st_arena_alloc(a, (count + 1) * sizeof **out);
    if (!*out)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    int64_t ts = node_server_ts_us(n);
    for (size_t i = 0; i < count; i++) {
        st_code rc = node_mutation_from_pb(n, meta, m[i], ts, &(*out)[i], err);
        if (rc != ST_OK) {
            st_err_prefix(err, "Error in element #%zu : ", i);
            return rc;
        }
    }
    return ST_OK;
}

void node_h_check_and_mutate_row(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__CheckAndMutateRowRequest *req = (void *)node_unpack(
        call, &google__bigtable__v2__check_and_mutate_row_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->table_name, &meta))
        return;
    if (req->row_key.len == 0 || req->row_key.len > NODE_ROW_KEY_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "row key must be 1 to %d bytes", NODE_ROW_KEY_MAX);
        return;
    }
    if (req->n_true_mutations + req->n_false_mutations == 0) {
        node_fail(call, ST_INVALID_ARGUMENT,
                  "No mutations provided: set true_mutations or false_mutations");
        return;
    }
    if (req->n_true_mutations > NODE_MUTATIONS_MAX || req->n_false_mutations > NODE_MUTATIONS_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "Too many mutations: limit %d per branch",
                  NODE_MUTATIONS_MAX);
        return;
    }
    st_arena *a = rpc_call_arena(call);
    cam_op *op = st_arena_alloc(a, sizeof *op);
    if (!op) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    memset(op, 0, sizeof *op);
    st_err err = {0};
    st_code rc =
        cam_branch(n, meta, req->true_mutations, req->n_true_mutations, a, &op->on_true, &err);
    if (rc == ST_OK)
        rc = cam_branch(n, meta, req->false_mutations, req->n_false_mutations, a, &op->on_false,
                        &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "Error in Mutation list : %s", err.msg);
        return;
    }
    if ((rc = node_filter_from_pb(req->predicate_filter, a, &op->predicate, &err)) != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    op->call = call;
    op->row = st_slice_make(req->row_key.data, req->row_key.len);
    op->n_true = req->n_true_mutations;
    op->n_false = req->n_false_mutations;
    op->table = st_arena_dup(a, meta->name, strlen(meta->name) + 1);
    if (!op->table || node_rowlock_acquire(n, op->table, op->row, cam_locked, op) != ST_OK) {
        node_filter_release(op->predicate);
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
}

/* ---- ReadModifyWriteRow ---- */

typedef struct rmw_result {
    st_slice family, qualifier;
    st_buf value;
    int64_t ts_us;
} rmw_result;

typedef struct rmw_op {
    rpc_call *call;
    const char *table;
    st_slice row;
    Google__Bigtable__V2__ReadModifyWriteRule **rules;
    size_t n_rules;
    rmw_result *res;
    size_t n_res;
} rmw_op;

static void rmw_free_results(rmw_op *op) {
    for (size_t i = 0; i < op->n_res; i++)
        st_buf_free(&op->res[i].value);
    op->n_res = 0;
}

static int res_cmp(const void *a, const void *b) {
    const rmw_result *x = a, *y = b;
    int c = st_slice_cmp(x->family, y->family);
    return c ? c : st_slice_cmp(x->qualifier, y->qualifier);
}

/* The response: the row with just the cells the rules wrote, grouped by family and column. */
static void rmw_reply(rmw_op *op) {
    st_arena *a = rpc_call_arena(op->call);
    qsort(op->res, op->n_res, sizeof *op->res, res_cmp);
    Google__Bigtable__V2__Row *row = st_arena_alloc(a, sizeof *row);
    Google__Bigtable__V2__Family **fams = st_arena_alloc(a, (op->n_res + 1) * sizeof *fams);
    if (!row || !fams) {
        node_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    google__bigtable__v2__row__init(row);
    row->key = (ProtobufCBinaryData){op->row.len, (uint8_t *)op->row.data};
    row->families = fams;
    for (size_t i = 0; i < op->n_res; i++) {
        rmw_result *r = &op->res[i];
        Google__Bigtable__V2__Family *f = row->n_families ? fams[row->n_families - 1] : NULL;
        if (!f || !st_slice_eq(st_slice_cstr(f->name), r->family)) {
            f = st_arena_alloc(a, sizeof *f);
            char *name = st_arena_alloc(a, r->family.len + 1);
            f->columns = st_arena_alloc(a, (op->n_res + 1) * sizeof *f->columns);
            if (!f || !name || !f->columns) {
                node_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
                return;
            }
            Google__Bigtable__V2__Column **cols = f->columns;
            google__bigtable__v2__family__init(f);
            f->columns = cols;
            memcpy(name, r->family.data, r->family.len);
            name[r->family.len] = '\0';
            f->name = name;
            fams[row->n_families++] = f;
        }
        Google__Bigtable__V2__Column *col = st_arena_alloc(a, sizeof *col);
        Google__Bigtable__V2__Cell *cell = st_arena_alloc(a, sizeof *cell);
        Google__Bigtable__V2__Cell **cells = st_arena_alloc(a, sizeof *cells);
        if (!col || !cell || !cells) {
            node_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        google__bigtable__v2__column__init(col);
        google__bigtable__v2__cell__init(cell);
        col->qualifier = (ProtobufCBinaryData){r->qualifier.len, (uint8_t *)r->qualifier.data};
        cell->timestamp_micros = r->ts_us;
        cell->value = (ProtobufCBinaryData){r->value.len, r->value.data};
        cells[0] = cell;
        col->cells = cells;
        col->n_cells = 1;
        f->columns[f->n_columns++] = col;
    }
    Google__Bigtable__V2__ReadModifyWriteRowResponse resp;
    google__bigtable__v2__read_modify_write_row_response__init(&resp);
    resp.row = row;
    node_reply(op->call, &resp.base);
}

static void rmw_durable(node_ctx *n, st_code code, const char *msg, void *arg) {
    rmw_op *op = arg;
    node_rowlock_release(n, op->table, op->row);
    if (code != ST_OK)
        node_fail(op->call, code, "%s", msg ? msg : "write failed");
    else
        rmw_reply(op);
    rmw_free_results(op);
}

/* A column and where it was met: a rule's index, or a cell's position in the row. */
typedef struct rmw_key {
    st_slice family, qualifier;
    size_t at;
} rmw_key;

static int rmw_key_cmp(const void *pa, const void *pb) {
    const rmw_key *a = pa, *b = pb;
    int c = st_slice_cmp(a->family, b->family);
    if (c == 0)
        c = st_slice_cmp(a->qualifier, b->qualifier);
    return c ? c : (a->at > b->at) - (a->at < b->at);
}

/* One result per column the rules name, in family and qualifier order (the order a Row lists
 * them), each starting from its column's newest stored cell; slot[i] is rule i's result. Both
 * sides are sorted and merged, so a request of 100,000 rules on a row of many cells costs
 * n log n: comparing each rule with every earlier result and every cell held the node's loop
 * for a minute. */
static st_code rmw_columns(rmw_op *op, node_row_cell *cells, size_t count, size_t *slot,
                           st_arena *a, st_err *err) {
    rmw_key *rk = st_arena_alloc(a, op->n_rules * sizeof *rk);
    rmw_key *ck = st_arena_alloc(a, (count ? count : 1) * sizeof *ck);
    if (!rk || !ck)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < op->n_rules; i++)
        rk[i] = (rmw_key){
            st_slice_cstr(op->rules[i]->family_name),
            st_slice_make(op->rules[i]->column_qualifier.data, op->rules[i]->column_qualifier.len),
            i};
    for (size_t i = 0; i < count; i++)
        ck[i] = (rmw_key){cells[i].family, cells[i].qualifier, i};
    qsort(rk, op->n_rules, sizeof *rk, rmw_key_cmp);
    qsort(ck, count, sizeof *ck, rmw_key_cmp); /* a column's newest cell first: rows list so */
    size_t c = 0;
    for (size_t i = 0; i < op->n_rules; i++) {
        if (i == 0 || st_slice_cmp(rk[i].family, rk[i - 1].family) ||
            st_slice_cmp(rk[i].qualifier, rk[i - 1].qualifier)) {
            rmw_result *r = &op->res[op->n_res++];
            memset(r, 0, sizeof *r);
            r->family = rk[i].family;
            r->qualifier = rk[i].qualifier;
            r->ts_us = -1; /* no cell yet */
            rmw_key want = {r->family, r->qualifier, 0};
            while (c < count && rmw_key_cmp(&ck[c], &want) < 0)
                c++;
            if (c < count && !st_slice_cmp(ck[c].family, r->family) &&
                !st_slice_cmp(ck[c].qualifier, r->qualifier)) {
                const node_row_cell *cell = &cells[ck[c].at];
                if (st_buf_append(&r->value, cell->value.data, cell->value.len) != ST_OK)
                    return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
                r->ts_us = cell->ts_us;
            }
        }
        slot[rk[i].at] = op->n_res - 1;
    }
    return ST_OK;
}

static st_code rmw_apply(node_ctx *n, rmw_op *op, node_row_cell *cells, size_t count, st_arena *a,
                         st_err *err) {
    int64_t now = node_server_ts_us(n);
    size_t *slot = st_arena_alloc(a, op->n_rules * sizeof *slot);
    if (!slot)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_code rc = rmw_columns(op, cells, count, slot, a, err);
    if (rc != ST_OK)
        return rc;
    for (size_t i = 0; i < op->n_rules; i++) {
        const Google__Bigtable__V2__ReadModifyWriteRule *rule = op->rules[i];
        rmw_result *r = &op->res[slot[i]];
        if (rule->rule_case ==
            GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_INCREMENT_AMOUNT) {
            if (r->value.len != 8 && !(r->ts_us < 0 && r->value.len == 0))
                /* Cloud Bigtable's code and wording: the request is fine, the cell is not. */
                return st_err_set(err, ST_FAILED_PRECONDITION,
                                  "Cannot increment a value of %zu bytes (rule #%zu, family=%s). "
                                  "The increment operation can only be performed on 64-bit "
                                  "values",
                                  r->value.len, i, rule->family_name);
            uint64_t v = r->value.len == 8 ? st_get_be64(r->value.data) : 0;
            v += (uint64_t)rule->increment_amount;
            uint8_t be[8];
            st_put_be64(be, v);
            st_buf_reset(&r->value);
            if (st_buf_append(&r->value, be, 8) != ST_OK)
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        } else if (st_buf_append(&r->value, rule->append_value.data, rule->append_value.len) !=
                   ST_OK) {
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        }
        if (r->value.len > NODE_VALUE_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT, "resulting value exceeds 100 MiB");
        r->ts_us = r->ts_us > now ? r->ts_us : now;
    }
    return ST_OK;
}

static void rmw_locked(node_ctx *n, void *arg) {
    rmw_op *op = arg;
    st_err err = {0};
    st_arena scratch;
    st_arena_init(&scratch, 64 << 10);
    node_row_cell *cells = NULL;
    size_t count = 0;
    node_tablet *tab = node_write_tablet(n, op->table, op->row, &err);
    st_code rc = tab ? node_read_row(tab, op->row, &scratch, &cells, &count, &err) : err.code;
    if (rc == ST_OK)
        rc = rmw_apply(n, op, cells, count, &scratch, &err);
    st_arena_deinit(&scratch);
    sto_mut *muts =
        rc == ST_OK ? st_arena_alloc(rpc_call_arena(op->call), op->n_res * sizeof *muts) : NULL;
    if (rc == ST_OK && !muts)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == ST_OK) {
        for (size_t i = 0; i < op->n_res; i++)
            muts[i] = (sto_mut){.type = STO_MUT_SET_CELL,
                                .family = op->res[i].family,
                                .qualifier = op->res[i].qualifier,
                                .ts_us = op->res[i].ts_us,
                                .value = st_buf_slice(&op->res[i].value)};
        sto_row_mut row = {.row = op->row, .muts = muts, .n_muts = op->n_res};
        rc = node_row_prepare(n, op->table, &row, &err);
        if (rc == ST_OK)
            rc = node_write(n, &row, 1, &err, rmw_durable, op);
        if (rc == ST_OK)
            return;
    }
    node_rowlock_release(n, op->table, op->row);
    rmw_free_results(op);
    node_fail(op->call, rc, "%s", err.msg);
}

void node_h_read_modify_write_row(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__ReadModifyWriteRowRequest *req = (void *)node_unpack(
        call, &google__bigtable__v2__read_modify_write_row_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->table_name, &meta))
        return;
    if (req->row_key.len == 0 || req->row_key.len > NODE_ROW_KEY_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "row key must be 1 to %d bytes", NODE_ROW_KEY_MAX);
        return;
    }
    if (req->n_rules == 0 || req->n_rules > NODE_MUTATIONS_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "give 1 to %d rules", NODE_MUTATIONS_MAX);
        return;
    }
    for (size_t i = 0; i < req->n_rules; i++) {
        const Google__Bigtable__V2__ReadModifyWriteRule *r = req->rules[i];
        st_err err = {0};
        if (node_table_family(meta, st_slice_cstr(r->family_name)) == NULL) {
            node_fail(call, ST_NOT_FOUND,
                      "Requested column family not found: \"%s\" is not a family of %s",
                      r->family_name, meta->name);
            return;
        }
        if (r->rule_case != GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_APPEND_VALUE &&
            r->rule_case != GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_INCREMENT_AMOUNT) {
            node_fail(call, ST_INVALID_ARGUMENT,
                      "rule #%zu sets neither append_value nor increment_amount", i);
            return;
        }
        if (r->column_qualifier.len > NODE_QUALIFIER_MAX) {
            node_fail(call, ST_INVALID_ARGUMENT, "column qualifier longer than %d bytes",
                      NODE_QUALIFIER_MAX);
            return;
        }
        (void)err;
    }
    st_arena *a = rpc_call_arena(call);
    rmw_op *op = st_arena_alloc(a, sizeof *op);
    if (!op || !(op->res = st_arena_alloc(a, req->n_rules * sizeof *op->res))) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    op->call = call;
    op->row = st_slice_make(req->row_key.data, req->row_key.len);
    op->rules = req->rules;
    op->n_rules = req->n_rules;
    op->n_res = 0;
    op->table = st_arena_dup(a, meta->name, strlen(meta->name) + 1);
    if (!op->table || node_rowlock_acquire(n, op->table, op->row, rmw_locked, op) != ST_OK)
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
}

/* ---- SampleRowKeys ---- */

typedef struct sample_state {
    rpc_call *call;
    uint64_t base_bytes; /* bytes of the tablets before this one */
    st_code rc;
} sample_state;

static void sample_send(rpc_call *call, st_slice key, uint64_t offset, st_code *rc) {
    if (*rc != ST_OK)
        return;
    Google__Bigtable__V2__SampleRowKeysResponse resp;
    google__bigtable__v2__sample_row_keys_response__init(&resp);
    resp.row_key = (ProtobufCBinaryData){key.len, (uint8_t *)key.data};
    resp.offset_bytes = (int64_t)offset;
    *rc = node_send(call, &resp.base);
}

static void sample_one(st_slice row, uint64_t offset_bytes, void *arg) {
    sample_state *s = arg;
    sample_send(s->call, row, s->base_bytes + offset_bytes, &s->rc);
}

void node_h_sample_row_keys(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__SampleRowKeysRequest *req = (void *)node_unpack(
        call, &google__bigtable__v2__sample_row_keys_request__descriptor, req_bytes);
    if (!req)
        return;
    node_tablets *t = node_table_or_fail(n, call, req->table_name, NULL);
    if (!t)
        return;
    /* Each local tablet's internal samples, then its end key: the row keys split the table into
     * pieces of roughly known size; the last response has an empty key and the total. A cluster
     * member answers for its own tablets only (a router merges the answers of the owners). */
    sample_state s = {.call = call, .rc = ST_OK};
    st_err err = {0};
    for (size_t i = 0; i < t->n && s.rc == ST_OK; i++) {
        st_code rc = sto_tablet_sample_keys(t->v[i].st, SAMPLE_EVERY_BYTES, sample_one, &s, &err);
        if (rc != ST_OK) {
            node_fail(call, rc, "%s", err.msg);
            return;
        }
        sto_tablet_info info;
        sto_tablet_info_get(t->v[i].st, &info);
        s.base_bytes += info.approx_bytes;
        if (t->v[i].end.len > 0)
            sample_send(call, st_buf_slice(&t->v[i].end), s.base_bytes, &s.rc);
    }
    sample_send(call, st_slice_make("", 0), s.base_bytes, &s.rc);
    rpc_call_finish(call, s.rc, s.rc == ST_OK ? NULL : "could not send samples");
}
