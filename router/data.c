/* data.c — data API forwarding other than ReadRows (read.c) and MutateRows (mutate_rows.c):
 * single-row requests go to the node owning the row; SampleRowKeys asks every node holding
 * tablets and merges. A node that no longer owns the rows ("strata-not-owner:") makes the router
 * refresh the cluster's tablet map and retry, bounded (RTR_RETRIES_MAX) with backoff, without the
 * client seeing it. */
#include "data.h"
#include "instance.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Common start of a data request: the table is known and the clusters to try are planned
 * (failover.c; row: the key of a single-row request, for row affinity, else empty). */
bool rtr_data_route(rtr_ctx *r, rpc_call *call, const char *table, const char *profile,
                    rtr_access access, st_slice row, rtr_plan *plan) {
    if (!rtr_table_or_fail(r, call, table))
        return false;
    st_err err = {0};
    if (rtr_route_plan(r, profile ? profile : "", access, row, plan, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    return true;
}

/* A view's name in a message, cut to a readable length. */
#define VIEW_NAME_ARGS(s) (int)((s).len < 200 ? (s).len : 200), (const char *)(s).data

bool rtr_data_view_refused(rpc_call *call, st_slice req, uint32_t authorized_field,
                           uint32_t materialized_field) {
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    rtr_wire_field f;
    bool bad;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.wire_type != 2 || f.bytes.len == 0 || f.num == 0)
            continue;
        /* Serving the whole table instead would bypass the rows and columns a view limits. */
        if (f.num == authorized_field) {
            rtr_fail(call, ST_UNIMPLEMENTED,
                     "authorized views are not supported: name the table in table_name "
                     "(authorized_view_name '%.*s')",
                     VIEW_NAME_ARGS(f.bytes));
            return true;
        }
        if (f.num == materialized_field) {
            rtr_fail(call, ST_UNIMPLEMENTED,
                     "materialized views are not supported: read the table in table_name "
                     "(materialized_view_name '%.*s')",
                     VIEW_NAME_ARGS(f.bytes));
            return true;
        }
    }
    return false; /* a malformed request is judged by the unpacking that follows */
}

/* A multi-cluster write gets its server timestamps here, before the first forwarding, so a
 * retry on another cluster writes identical cells (docs/router.md, "Failover"). *req then
 * points into the call's arena. False after failing the call. */
bool rtr_data_stamp(rtr_ctx *r, rpc_call *call, bool rows, st_slice *req) {
    st_buf out;
    st_buf_init(&out);
    size_t n = 0;
    st_code rc = rtr_stamp_mutations(*req, rows, rtr_fo_write_ts(r), &out, &n);
    if (rc == ST_OK && n > 0) {
        void *p = st_arena_dup(rpc_call_arena(call), out.data, out.len);
        if (p)
            *req = st_slice_make(p, out.len);
        else
            rc = ST_RESOURCE_EXHAUSTED;
    }
    st_buf_free(&out);
    if (rc != ST_OK)
        rtr_fail(call, rc,
                 rc == ST_INVALID_ARGUMENT ? "malformed mutation request" : "out of memory");
    return rc == ST_OK;
}

/* SetCell with timestamp -1 takes the server's time: a retry after the node may already have
 * applied it would add a second version, so such writes are not retried on UNAVAILABLE. */
bool rtr_muts_idempotent(Google__Bigtable__V2__Mutation *const *m, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (m[i]->mutation_case == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL &&
            m[i]->set_cell->timestamp_micros == -1)
            return false;
    return true;
}

/* ---- single-row requests ---- */

typedef struct fwd_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    rtr_plan plan;
    rtr_node *node; /* of the attempt in flight */
    const char *path;
    st_slice req, row;
    const char *table;
    bool idempotent;
    bool moved_once;  /* moved on once after a node connection dropped under it */
    uint64_t conn_id; /* op->node's rtr_node.conn_id when this attempt was sent */
    bool map_checked; /* the table had no tablet here: the map was refreshed once since */
    int attempts;
    uint64_t gen;
    uint64_t fp;         /* rtr_qod_fingerprint of the client's request */
    st_slice resp;       /* the node's answer, in the call's arena */
    rpc_ccall *inflight; /* the node call of the attempt */
    bool stalled;        /* cancelled because its cluster turned unhealthy */
    rtr_inflight link;   /* multi-cluster: in its cluster's in-flight list during a node call */
    rtr_fence fence;     /* multi-cluster: attempts that may still apply (failover.h) */
    int64_t attempt_fence_us;
    char fence_text[RTR_FENCE_TEXT_BYTES];
    st_err last;
    rtr_unserved unserved; /* no node of the cluster served the row (failover.h) */
    /* A peeked table name (longer ones go to the call's arena); small enough that the op stays
     * within malloc's per-thread cache (about 1 KiB). */
    char table_buf[160];
} fwd_op;

static void fwd_send(void *arg);

static void fwd_finish(fwd_op *op, st_code code, const char *msg) {
    rtr_inflight_unlink(&op->link);
    if (code == ST_OK) {
        rtr_qod_served(op->r, op->fp);
        st_code rc = rpc_call_send(op->call, op->resp);
        rpc_call_finish(op->call, rc, rc == ST_OK ? NULL : "could not send the response");
    } else {
        rpc_call_finish(op->call, code, msg);
    }
    free(op);
}

static void fwd_after_backoff(void *arg) {
    fwd_op *op = arg;
    if (op->r->closing || rpc_call_cancelled(op->call)) {
        fwd_finish(op, op->last.code, op->last.msg);
        return;
    }
    if (op->plan.multi) { /* every cluster failed: start over, healthy ones first */
        rtr_plan_restart(op->r, &op->plan);
        op->c = rtr_plan_cluster(op->r, &op->plan);
    }
    /* The map changed since this try: use it. A cluster that refuses gets no refresh either. */
    if (op->c->map_gen != op->gen || rtr_health_cluster_refuses(op->r, op->c->idx)) {
        fwd_send(op);
        return;
    }
    if (rtr_cluster_refresh(op->c, fwd_send, op) != ST_OK)
        fwd_finish(op, op->last.code, op->last.msg);
}

static void fwd_retry(fwd_op *op) {
    if (op->last.code == ST_UNAVAILABLE && rtr_plan_dark(op->r, &op->plan)) {
        rtr_plan_unreachable(op->r, &op->plan, op->c, &op->last, &op->last);
        fwd_finish(op, op->last.code, op->last.msg);
        return;
    }
    if (!rtr_retry_allowed(op->attempts, op->last.code, op->last.msg) || op->r->closing ||
        rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), fwd_after_backoff, op) != ST_OK)
        fwd_finish(op, op->last.code, op->last.msg);
}

/* Moves a multi-cluster request to its plan's next cluster; false when there is none. */
static bool fwd_failover(fwd_op *op) {
    if (op->r->closing || !rtr_plan_next(op->r, &op->plan, op->last.code))
        return false;
    op->c = rtr_plan_cluster(op->r, &op->plan);
    fwd_send(op);
    return true;
}

static void fwd_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    fwd_op *op = arg;
    /* A unary answer is one small message: the call's arena holds it until the call ends. */
    void *p = msg.len ? st_arena_dup(rpc_call_arena(op->call), msg.data, msg.len) : NULL;
    if (msg.len && !p) {
        rpc_ccall_cancel(call);
        return;
    }
    op->resp = st_slice_make(p, msg.len);
}

/* Its cluster turned unhealthy while the attempt was out: move it on now (fwd_done). */
static void fwd_move(rtr_inflight *f) {
    fwd_op *op = (fwd_op *)((char *)f - offsetof(fwd_op, link));
    if (op->inflight && !op->stalled) {
        op->stalled = true;
        rpc_ccall_cancel(op->inflight);
    }
}

/* An attempt failed with code (op->last holds the message): the next cluster, a retry, or the
 * end. */
static void fwd_after_failure(fwd_op *op, st_code code) {
    bool move = (op->idempotent && rtr_fo_error(code)) ||
                rtr_plan_moves_off_replica(&op->plan, code); /* refused there, nothing written */
    if (move && fwd_failover(op))
        return;
    if (rtr_retryable(code, op->last.msg, op->idempotent)) {
        fwd_retry(op);
        return;
    }
    fwd_finish(op, code, op->last.msg);
}

static void fwd_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    fwd_op *op = arg;
    op->inflight = NULL;
    rtr_inflight_unlink(&op->link);
    if (op->stalled && code == ST_CANCELLED) {
        code = ST_DEADLINE_EXCEEDED;
        message = "its cluster turned unhealthy while the request was out";
    }
    op->stalled = false;
    if (code == ST_OK) {
        fwd_finish(op, ST_OK, NULL);
        return;
    }
    st_err_set(&op->last, code, "%s", message ? message : "");
    /* Never processed: any request may go again. Refused by the node's GOAWAY, the node is not
     * to blame; never sent because the connect failed, it is unreachable. */
    rtr_call_fate fate = rtr_call_fate_of(call, code);
    rtr_fence_ended(&op->fence, op->attempt_fence_us, code, fate == RTR_CALL_SENT);
    if (fate == RTR_CALL_REFUSED) {
        fwd_retry(op);
        return;
    }
    rtr_health_report(op->node, code);
    if (fate == RTR_CALL_UNREACHED) {
        if (!fwd_failover(op))
            fwd_retry(op);
        return;
    }
    size_t lost = code == ST_UNAVAILABLE ? rpc_ccall_conn_lost(call) : 0;
    if (lost > 0) { /* the node's connection dropped under the call: a query of death? */
        rtr_qod_verdict v =
            rtr_qod_dropped(op->r, op->fp, lost, op->node, rtr_qod_drop_id(op->node, op->conn_id),
                            st_mono_us(), &op->moved_once, &op->last);
        if (v != RTR_QOD_GO) {
            fwd_finish(op, op->last.code, op->last.msg);
            return;
        }
    }
    fwd_after_failure(op, code);
}

/* A cluster none of whose nodes answers is not sent to (health.c): the next cluster of a
 * multi-cluster plan, or UNAVAILABLE at once. False when op went on that way. */
static bool fwd_gate(fwd_op *op) {
    rtr_plan_gate g = rtr_plan_gate_check(op->r, &op->plan, &op->last);
    rtr_cluster *c = rtr_plan_cluster(op->r, &op->plan);
    if (c != op->c)
        op->map_checked = false;
    op->c = c;
    if (g == RTR_GATE_END)
        fwd_finish(op, op->last.code, op->last.msg);
    else if (g == RTR_GATE_RETRY)
        fwd_retry(op);
    return g == RTR_GATE_GO;
}

/* No node of op->c serves the row: the plan's next cluster, a wait for a move, or the error. */
static void fwd_unserved(fwd_op *op) {
    rtr_unserved_act a = rtr_unserved_check(&op->plan, op->c, op->table, "this row", st_mono_us(),
                                            &op->unserved, &op->last);
    if (a == RTR_UNSERVED_MOVE && fwd_failover(op))
        return;
    if (a == RTR_UNSERVED_END)
        fwd_finish(op, op->last.code, op->last.msg);
    else
        fwd_retry(op);
}

static void fwd_send(void *arg) {
    fwd_op *op = arg;
    int64_t wait_ms = rtr_fence_wait_ms(&op->fence);
    if (wait_ms > 0) { /* an earlier attempt may still apply until then */
        if (op->r->closing || rtr_later_add(op->r, wait_ms, fwd_send, op) != ST_OK)
            fwd_finish(op, op->last.code, op->last.msg);
        return;
    }
    if (!fwd_gate(op))
        return;
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    if ((!t || t->n == 0) && !op->map_checked) { /* a stale map? look once */
        op->map_checked = true;
        if (rtr_cluster_refresh(op->c, fwd_send, op) != ST_OK)
            fwd_finish(op, ST_RESOURCE_EXHAUSTED, "too many requests wait for a tablet map");
        return;
    }
    if (!t || t->n == 0) { /* the cluster does not serve the table */
        rtr_table_not_in_cluster(op->c, op->table, &op->last);
        op->map_checked = false;
        if (!fwd_failover(op))
            fwd_finish(op, op->last.code, op->last.msg);
        return;
    }
    size_t k = rtr_tmap_row(t, op->row);
    op->gen = op->c->map_gen;
    if (k == SIZE_MAX) {
        fwd_unserved(op);
        return;
    }
    int64_t timeout;
    if (!rtr_call_timeout(op->call, op->r->opts.node_timeout_ms, &timeout)) {
        fwd_finish(op, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        return;
    }
    timeout = rtr_plan_attempt_ms(&op->plan, timeout);
    rpc_metadata md[RTR_FORWARD_HEADERS_MAX];
    size_t n_md = rtr_forward_headers(op->call, md);
    op->attempt_fence_us = 0;
    if (op->plan.multi && op->idempotent)
        rtr_fence_attempt(timeout, &op->attempt_fence_us, op->fence_text, md, &n_md);
    op->node = &op->c->nodes[t->v[k].node];
    op->inflight = rtr_node_call(op->node, op->path, op->req, md, n_md, timeout, fwd_msg, fwd_done,
                                 op, &op->last);
    op->conn_id = op->node->conn_id;
    if (op->inflight) {
        rpc_ccall_set_owner(op->inflight, rpc_call_conn_serial(op->call));
        if (op->plan.multi && op->idempotent && op->plan.cur + 1 < op->plan.n) {
            op->link.move = fwd_move;
            rtr_inflight_link(op->c, &op->link);
        }
        return;
    }
    rtr_health_report(op->node, ST_UNAVAILABLE);
    if (!fwd_failover(op)) /* it never reached the node: safe to move or retry */
        fwd_retry(op);
}

/* Takes op (malloc'ed, not zeroed: filled in here; NULL when out of memory): table may point
 * into op->table_buf, which is why the fields are set one by one. */
static void fwd_start(fwd_op *op, rtr_ctx *r, rpc_call *call, const rtr_plan *plan,
                      const char *table, st_slice row, st_slice req, bool idempotent, uint64_t fp) {
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_err err = {0};
    if (rtr_qod_refused(r, fp, &err)) {
        free(op);
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (row.len == 0) {
        free(op);
        rtr_fail(call, ST_INVALID_ARGUMENT, "row key must not be empty");
        return;
    }
    op->r = r;
    op->call = call;
    op->c = rtr_plan_cluster(r, plan);
    op->plan = *plan;
    op->node = NULL;
    op->path = rpc_call_path(call);
    op->req = req;
    op->row = row;
    op->table = table;
    op->idempotent = idempotent;
    op->moved_once = false;
    op->map_checked = false;
    op->inflight = NULL;
    op->stalled = false;
    op->link = (rtr_inflight){0};
    op->fence = (rtr_fence){0};
    op->attempt_fence_us = 0;
    op->fp = fp;
    op->attempts = 0;
    op->gen = 0;
    op->unserved = (rtr_unserved){0};
    op->resp = st_slice_make(NULL, 0);
    st_err_clear(&op->last);
    fwd_send(op);
}

/* s as a C string: in buf when it fits (cap bytes with the NUL), else in the call's arena. The
 * hot single-row requests thus allocate nothing for their table and profile names. */
static const char *peek_cstr(rpc_call *call, st_slice s, char *buf, size_t cap) {
    if (s.len >= cap)
        return rtr_peek_str(rpc_call_arena(call), s);
    if (s.len)
        memcpy(buf, s.data, s.len);
    buf[s.len] = '\0';
    return buf;
}

/* The fields a MutateRow is routed by: peeked from the wire when plainly encoded (the value is
 * not copied), else unpacked. */
static bool mutate_row_parse(rpc_call *call, st_slice req_bytes, char *table_buf, size_t table_cap,
                             char *profile_buf, size_t profile_cap, const char **table,
                             const char **profile, st_slice *row, bool *idempotent) {
    rtr_mr_peek pk;
    if (rtr_peek_mutate_row(req_bytes, &pk)) {
        *table = peek_cstr(call, pk.table, table_buf, table_cap);
        *profile = peek_cstr(call, pk.profile, profile_buf, profile_cap);
        *row = pk.row;
        *idempotent = pk.idempotent;
        if (*table && *profile)
            return true;
    }
    Google__Bigtable__V2__MutateRowRequest *req =
        (void *)rtr_unpack(call, &google__bigtable__v2__mutate_row_request__descriptor, req_bytes);
    if (!req)
        return false;
    *table = req->table_name;
    *profile = req->app_profile_id;
    *row = st_slice_make(req->row_key.data, req->row_key.len);
    *idempotent = rtr_muts_idempotent(req->mutations, req->n_mutations);
    return true;
}

void rtr_h_mutate_row(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    const char *table, *profile;
    char profile_buf[128];
    st_slice row;
    bool idempotent;
    rtr_plan plan;
    fwd_op *op = malloc(sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (rtr_data_view_refused(call, req_bytes, 6, 0) || /* MutateRowRequest */
        !mutate_row_parse(call, req_bytes, op->table_buf, sizeof op->table_buf, profile_buf,
                          sizeof profile_buf, &table, &profile, &row, &idempotent) ||
        !rtr_data_route(r, call, table, profile, RTR_ACCESS_WRITE, row, &plan)) {
        free(op);
        return;
    }
    /* Refused here, as for MutateRows entries: the same answer whether or not the node is up. */
    const char *invalid =
        row.len ? rtr_mutations_invalid(req_bytes, 3, rpc_call_arena(call)) : NULL;
    if (invalid) {
        free(op);
        rtr_fail(call, ST_INVALID_ARGUMENT, "%s", invalid);
        return;
    }
    uint64_t fp = rtr_qod_fingerprint(rpc_call_path(call), req_bytes); /* before stamping */
    if (plan.multi && !idempotent) {
        if (!rtr_data_stamp(r, call, false, &req_bytes)) {
            free(op);
            return;
        }
        idempotent = true;
    }
    fwd_start(op, r, call, &plan, table, row, req_bytes, idempotent, fp);
}

void rtr_h_check_and_mutate_row(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    if (rtr_data_view_refused(call, req_bytes, 9, 0)) /* CheckAndMutateRowRequest */
        return;
    Google__Bigtable__V2__CheckAndMutateRowRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__check_and_mutate_row_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !rtr_data_route(r, call, req->table_name, req->app_profile_id, RTR_ACCESS_TXN,
                                st_slice_make(NULL, 0), &plan))
        return;
    fwd_start(malloc(sizeof(fwd_op)), r, call, &plan, req->table_name,
              st_slice_make(req->row_key.data, req->row_key.len), req_bytes, false,
              rtr_qod_fingerprint(rpc_call_path(call), req_bytes));
}

void rtr_h_read_modify_write_row(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    if (rtr_data_view_refused(call, req_bytes, 6, 0)) /* ReadModifyWriteRowRequest */
        return;
    Google__Bigtable__V2__ReadModifyWriteRowRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__read_modify_write_row_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !rtr_data_route(r, call, req->table_name, req->app_profile_id, RTR_ACCESS_TXN,
                                st_slice_make(NULL, 0), &plan))
        return;
    fwd_start(malloc(sizeof(fwd_op)), r, call, &plan, req->table_name,
              st_slice_make(req->row_key.data, req->row_key.len), req_bytes, false,
              rtr_qod_fingerprint(rpc_call_path(call), req_bytes));
}

/* The instance is checked as in every other call, so a client (or `strata status`) pinging an
 * address that another instance's router holds learns it instead of an OK. */
void rtr_h_ping_and_warm(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__V2__PingAndWarmRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__ping_and_warm_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err;
    if (rtr_check_instance(&r->topo, req->name ? req->name : "", false, &err) != ST_OK) {
        rtr_fail(call, err.code, "PingAndWarm: %s", err.msg);
        return;
    }
    Google__Bigtable__V2__PingAndWarmResponse resp;
    google__bigtable__v2__ping_and_warm_response__init(&resp);
    rtr_reply(call, &resp.base);
}

/* ---- SampleRowKeys ---- */

typedef struct srk_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    rtr_plan plan;
    const char *table;
    st_slice req;
    int attempts;
    uint32_t nodes[ST_TOPO_NODES_MAX]; /* fan slot -> node index */
} srk_op;

static void srk_send(void *arg);

static void srk_finish(srk_op *op, st_code code, const char *msg) {
    rpc_call_finish(op->call, code, msg);
    free(op);
}

static void srk_after_backoff(void *arg) {
    srk_op *op = arg;
    if (op->plan.multi) {
        rtr_plan_restart(op->r, &op->plan);
        op->c = rtr_plan_cluster(op->r, &op->plan);
    }
    if (!op->r->closing && rtr_health_cluster_refuses(op->r, op->c->idx)) {
        srk_send(op); /* no refresh of a cluster none of whose nodes answers */
        return;
    }
    if (op->r->closing || rtr_cluster_refresh(op->c, srk_send, op) != ST_OK)
        srk_finish(op, ST_UNAVAILABLE, "the router is shutting down");
}

/* Parses one node's answers into samples (keys copied into the call arena). */
static st_code srk_parse(const rtr_fan_res *res, st_arena *a, rtr_sample **out, size_t *n) {
    size_t off = 0, cap = 0;
    st_slice msg;
    *out = NULL;
    *n = 0;
    while (rtr_fan_next_msg(res, &off, &msg)) {
        Google__Bigtable__V2__SampleRowKeysResponse *m = (void *)btu_pb_unpack(
            &google__bigtable__v2__sample_row_keys_response__descriptor, NULL, msg, NULL);
        if (!m)
            return ST_INTERNAL;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            rtr_sample *v = st_arena_alloc(a, cap * sizeof *v);
            if (v && *n)
                memcpy(v, *out, *n * sizeof *v);
            *out = v;
        }
        void *key = m->row_key.len ? st_arena_dup(a, m->row_key.data, m->row_key.len) : NULL;
        bool ok = *out && (key || m->row_key.len == 0);
        if (ok)
            (*out)[(*n)++] = (rtr_sample){st_slice_make(key, m->row_key.len), m->offset_bytes};
        google__bigtable__v2__sample_row_keys_response__free_unpacked(m, NULL);
        if (!ok)
            return ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

static void srk_reply(srk_op *op, rtr_fan *f) {
    st_arena *a = rpc_call_arena(op->call);
    rtr_sample *per[ST_TOPO_NODES_MAX];
    size_t counts[ST_TOPO_NODES_MAX];
    st_slice ends[ST_TOPO_NODES_MAX];
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    for (size_t i = 0; i < f->n; i++) {
        if (srk_parse(&f->res[i], a, &per[i], &counts[i]) != ST_OK) {
            srk_finish(op, ST_INTERNAL, "a node sent unreadable samples");
            return;
        }
        ends[i] = st_slice_make(NULL, 0);
        for (size_t k = 0; t && k < t->n; k++) /* end of the node's last tablet */
            if (t->v[k].node == op->nodes[i])
                ends[i] = t->v[k].end;
    }
    rtr_sample *all;
    size_t n;
    if (rtr_samples_merge(per, counts, ends, f->n, a, &all, &n) != ST_OK) {
        srk_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_code rc = ST_OK;
    for (size_t i = 0; i < n && rc == ST_OK; i++) {
        Google__Bigtable__V2__SampleRowKeysResponse m;
        google__bigtable__v2__sample_row_keys_response__init(&m);
        m.row_key = (ProtobufCBinaryData){all[i].key.len, (uint8_t *)all[i].key.data};
        m.offset_bytes = all[i].offset;
        uint8_t *buf = st_arena_alloc(a, all[i].key.len + 32);
        rc = buf ? rpc_call_send(
                       op->call,
                       st_slice_make(buf,
                                     google__bigtable__v2__sample_row_keys_response__pack(&m, buf)))
                 : ST_RESOURCE_EXHAUSTED;
    }
    srk_finish(op, rc, rc == ST_OK ? NULL : "could not send the samples");
}

static void srk_done(rtr_fan *f, void *arg) {
    srk_op *op = arg;
    st_err err = {0};
    st_code rc = rtr_fan_first_error(f, &err);
    if (rc == ST_OK) {
        srk_reply(op, f);
        rtr_fan_free(f);
        return;
    }
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].node)
            rtr_health_report(f->res[i].node, f->res[i].code);
    rtr_fan_free(f);
    bool move = rtr_fo_error(rc) || rtr_plan_moves_off_replica(&op->plan, rc);
    if (move && !op->r->closing && rtr_plan_next(op->r, &op->plan, rc)) {
        op->c = rtr_plan_cluster(op->r, &op->plan);
        srk_send(op);
        return;
    }
    if (rtr_retryable(rc, err.msg, true) && op->attempts < RTR_RETRIES_MAX && !op->r->closing &&
        rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), srk_after_backoff, op) == ST_OK)
        return;
    srk_finish(op, rc, err.msg);
}

static void srk_send(void *arg) {
    srk_op *op = arg;
    st_err err = {0};
    rtr_plan_gate g = rtr_plan_gate_check(op->r, &op->plan, &err);
    op->c = rtr_plan_cluster(op->r, &op->plan);
    if (g == RTR_GATE_RETRY && op->attempts < RTR_RETRIES_MAX && !op->r->closing &&
        rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), srk_after_backoff, op) == ST_OK)
        return;
    if (g != RTR_GATE_GO) { /* no node of the cluster answers: not sent (health.c) */
        srk_finish(op, err.code, err.msg);
        return;
    }
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    bool holds[ST_TOPO_NODES_MAX] = {false};
    size_t n = 0;
    for (size_t k = 0; t && k < t->n; k++)
        holds[t->v[k].node] = true;
    for (size_t j = 0; j < op->c->n_nodes; j++)
        if (holds[j])
            op->nodes[n++] = (uint32_t)j;
    if (n == 0) { /* no tablet known yet: learn the map first */
        if (op->attempts++ < RTR_RETRIES_MAX && rtr_cluster_refresh(op->c, srk_send, op) == ST_OK)
            return;
        srk_finish(op, ST_UNAVAILABLE, "no node serves this table");
        return;
    }
    int64_t timeout;
    if (!rtr_call_timeout(op->call, op->r->opts.node_timeout_ms, &timeout)) {
        srk_finish(op, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        return;
    }
    rtr_fan *f = rtr_fan_new(op->r, n, timeout, srk_done, op);
    if (!f) {
        srk_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++)
        rtr_fan_call(f, i, &op->c->nodes[op->nodes[i]], RTR_BT "SampleRowKeys", op->req);
    rtr_fan_seal(f);
}

void rtr_h_sample_row_keys(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    if (rtr_data_view_refused(call, req_bytes, 4, 5)) /* SampleRowKeysRequest */
        return;
    Google__Bigtable__V2__SampleRowKeysRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__sample_row_keys_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !rtr_data_route(r, call, req->table_name, req->app_profile_id, RTR_ACCESS_READ,
                                st_slice_make(NULL, 0), &plan))
        return;
    srk_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (srk_op){.r = r,
                   .call = call,
                   .c = rtr_plan_cluster(r, &plan),
                   .plan = plan,
                   .table = req->table_name,
                   .req = req_bytes};
    /* The answer is only as complete as the map: a node asked about a table answers for the
     * tablets it holds, so a tablet moved since this router's last refresh (by another router's
     * balancer: nothing tells this one) would be left out, its rows and bytes missing from the
     * samples. Learn the map first (one ListTablets round, shared with waiting requests). */
    if (rtr_health_cluster_refuses(r, op->c->idx) ||
        rtr_cluster_refresh(op->c, srk_send, op) != ST_OK)
        srk_send(op);
}
