/* data.c — data API forwarding other than ReadRows: single-row requests go to the node owning the
 * row; MutateRows fans out one sub-request per node and merges the per-entry results back into
 * the caller's order; SampleRowKeys asks every node holding tablets and merges. A node that no
 * longer owns the rows ("strata-not-owner:") makes the router refresh the cluster's tablet map
 * and retry, bounded (RTR_RETRIES_MAX) with backoff, without the client seeing it. */
#include "failover.h"
#include "router_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/rpc/status.pb-c.h"

/* Common start of a data request: the table is known and the clusters to try are planned
 * (failover.c; row: the key of a single-row request, for row affinity, else empty). */
static bool data_route(rtr_ctx *r, rpc_call *call, const char *table, const char *profile,
                       bool transactional, st_slice row, rtr_plan *plan) {
    if (!rtr_table_or_fail(r, call, table))
        return false;
    st_err err = {0};
    if (rtr_route_plan(r, profile ? profile : "", transactional, row, plan, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    return true;
}

/* A multi-cluster write gets its server timestamps here, before the first forwarding, so a
 * retry on another cluster writes identical cells (docs/router.md, "Failover"). *req then
 * points into the call's arena. False after failing the call. */
static bool data_stamp(rtr_ctx *r, rpc_call *call, bool rows, st_slice *req) {
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
static bool muts_idempotent(Google__Bigtable__V2__Mutation *const *m, size_t n) {
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
    int64_t drop_us;  /* when it last did (st_mono_us) */
    uint64_t conn_id; /* op->node's rtr_node.conn_id when this attempt was sent */
    bool map_checked; /* the table had no tablet here: the map was refreshed once since */
    int attempts;
    uint64_t gen;
    uint64_t fp;         /* rtr_qod_fingerprint of the client's request */
    st_slice resp;       /* the node's answer, in the call's arena */
    rpc_ccall *inflight; /* the node call of the attempt */
    bool stalled;        /* cancelled because its cluster turned unhealthy */
    rtr_inflight link;   /* multi-cluster: in its cluster's in-flight list during a node call */
    st_err last;
    /* A peeked table name (longer ones go to the call's arena); small enough that the op stays
     * within malloc's per-thread cache (about 1 KiB). */
    char table_buf[160];
} fwd_op;

static void fwd_send(void *arg);

static void fwd_finish(fwd_op *op, st_code code, const char *msg) {
    rtr_inflight_unlink(&op->link);
    if (code == ST_OK) {
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
    if (op->c->map_gen != op->gen) {
        fwd_send(op);
        return;
    } /* the map changed since this try: use it */
    if (rtr_cluster_refresh(op->c, fwd_send, op) != ST_OK)
        fwd_finish(op, op->last.code, op->last.msg);
}

static void fwd_retry(fwd_op *op) {
    if (op->last.code == ST_UNAVAILABLE && rtr_plan_dark(op->r, &op->plan)) {
        rtr_cluster_unreachable(op->c, &op->last, &op->last);
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
    if (op->idempotent && rtr_fo_error(code) && fwd_failover(op))
        return;
    if (rtr_retryable(code, op->last.msg, op->idempotent)) {
        fwd_retry(op);
        return;
    }
    fwd_finish(op, code, op->last.msg);
}

/* A drop under the request alone, RTR_QOD_CORRELATE_MS ago: did another node go down with it? */
static void fwd_qod_settled(void *arg) {
    fwd_op *op = arg;
    if (op->r->closing || rpc_call_cancelled(op->call) ||
        rtr_qod_settle(op->r, op->fp, op->node, op->drop_us, &op->moved_once, &op->last) ==
            RTR_QOD_REFUSE) {
        fwd_finish(op, op->last.code, op->last.msg);
        return;
    }
    fwd_after_failure(op, ST_UNAVAILABLE);
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
    /* Never processed (not sent, or refused by the node's GOAWAY): any request may go again,
     * and the node is not to blame. */
    if (code == ST_UNAVAILABLE && rpc_ccall_unprocessed(call)) {
        fwd_retry(op);
        return;
    }
    rtr_health_report(op->node, code);
    size_t lost = code == ST_UNAVAILABLE ? rpc_ccall_conn_lost(call) : 0;
    if (lost > 0) { /* the node's connection dropped under the call: a query of death? */
        op->drop_us = st_mono_us();
        rtr_qod_verdict v =
            rtr_qod_dropped(op->r, op->fp, lost, op->node, rtr_qod_drop_id(op->node, op->conn_id),
                            op->drop_us, &op->moved_once, &op->last);
        if (v == RTR_QOD_WAIT &&
            rtr_later_add(op->r, RTR_QOD_CORRELATE_MS, fwd_qod_settled, op) == ST_OK)
            return;
        if (v != RTR_QOD_GO) {
            fwd_finish(op, op->last.code, op->last.msg);
            return;
        }
    }
    fwd_after_failure(op, code);
}

static void fwd_send(void *arg) {
    fwd_op *op = arg;
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
        st_err_set(&op->last, ST_UNAVAILABLE, "no node of cluster %s serves this row of table %s",
                   op->c->topo->id, op->table);
        fwd_retry(op);
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
    op->node = &op->c->nodes[t->v[k].node];
    op->inflight = rtr_node_call(op->node, op->path, op->req, md, n_md, timeout, fwd_msg, fwd_done,
                                 op, &op->last);
    op->conn_id = op->node->conn_id;
    if (op->inflight) {
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
    op->fp = fp;
    op->attempts = 0;
    op->gen = 0;
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
    *idempotent = muts_idempotent(req->mutations, req->n_mutations);
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
    if (!mutate_row_parse(call, req_bytes, op->table_buf, sizeof op->table_buf, profile_buf,
                          sizeof profile_buf, &table, &profile, &row, &idempotent) ||
        !data_route(r, call, table, profile, false, row, &plan)) {
        free(op);
        return;
    }
    uint64_t fp = rtr_qod_fingerprint(rpc_call_path(call), req_bytes); /* before stamping */
    if (plan.multi && !idempotent) {
        if (!data_stamp(r, call, false, &req_bytes)) {
            free(op);
            return;
        }
        idempotent = true;
    }
    fwd_start(op, r, call, &plan, table, row, req_bytes, idempotent, fp);
}

void rtr_h_check_and_mutate_row(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__V2__CheckAndMutateRowRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__check_and_mutate_row_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !data_route(r, call, req->table_name, req->app_profile_id, true,
                            st_slice_make(NULL, 0), &plan))
        return;
    fwd_start(malloc(sizeof(fwd_op)), r, call, &plan, req->table_name,
              st_slice_make(req->row_key.data, req->row_key.len), req_bytes, false,
              rtr_qod_fingerprint(rpc_call_path(call), req_bytes));
}

void rtr_h_read_modify_write_row(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__V2__ReadModifyWriteRowRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__read_modify_write_row_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !data_route(r, call, req->table_name, req->app_profile_id, true,
                            st_slice_make(NULL, 0), &plan))
        return;
    fwd_start(malloc(sizeof(fwd_op)), r, call, &plan, req->table_name,
              st_slice_make(req->row_key.data, req->row_key.len), req_bytes, false,
              rtr_qod_fingerprint(rpc_call_path(call), req_bytes));
}

void rtr_h_ping_and_warm(rpc_call *call, st_slice req_bytes, void *arg) {
    (void)arg;
    Google__Bigtable__V2__PingAndWarmRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__ping_and_warm_request__descriptor, req_bytes);
    if (!req)
        return;
    Google__Bigtable__V2__PingAndWarmResponse resp;
    google__bigtable__v2__ping_and_warm_response__init(&resp);
    rtr_reply(call, &resp.base);
}

/* ---- MutateRows ---- */

typedef struct mr_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    rtr_plan plan;
    const char *table;
    st_slice req; /* the request as forwarded (stamped when multi-cluster) */
    st_buf head;
    rtr_entry *entries;
    size_t n;
    rtr_entry_result *res;
    bool idempotent;
    int attempts;
    uint64_t gen;
    size_t groups_pending;
} mr_op;

typedef struct mr_group {
    mr_op *op;
    rtr_node *node;
    size_t *idx;
    size_t n;
} mr_group;

static void mr_round(void *arg);

static void mr_reply(mr_op *op) {
    st_arena *a = rpc_call_arena(op->call);
    Google__Bigtable__V2__MutateRowsResponse resp;
    google__bigtable__v2__mutate_rows_response__init(&resp);
    resp.entries = st_arena_alloc(a, op->n * sizeof *resp.entries);
    Google__Bigtable__V2__MutateRowsResponse__Entry *ents = st_arena_alloc(a, op->n * sizeof *ents);
    Google__Rpc__Status *sts = st_arena_alloc(a, op->n * sizeof *sts);
    if (!resp.entries || !ents || !sts) {
        rpc_call_finish(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        for (size_t i = 0; i < op->n; i++) {
            google__bigtable__v2__mutate_rows_response__entry__init(&ents[i]);
            google__rpc__status__init(&sts[i]);
            sts[i].code = (int32_t)op->res[i].code;
            sts[i].message = (char *)(op->res[i].message ? op->res[i].message : "");
            ents[i].index = (int64_t)i;
            ents[i].status = &sts[i];
            resp.entries[i] = &ents[i];
        }
        resp.n_entries = op->n;
        rtr_reply(op->call, &resp.base);
    }
    st_buf_free(&op->head);
    free(op);
}

static void mr_after_backoff(void *arg) {
    mr_op *op = arg;
    if (op->r->closing || rpc_call_cancelled(op->call)) {
        mr_reply(op);
        return;
    }
    if (op->plan.multi) { /* every cluster failed: start over, healthy ones first */
        rtr_plan_restart(op->r, &op->plan);
        op->c = rtr_plan_cluster(op->r, &op->plan);
    }
    if (op->c->map_gen != op->gen) {
        mr_round(op);
        return;
    }
    if (rtr_cluster_refresh(op->c, mr_round, op) != ST_OK)
        mr_reply(op);
}

/* After a round: entries left non-final are retried (bounded), else the answer goes out. */
static void mr_round_over(mr_op *op) {
    bool again = false, not_owner = false, lost = false;
    for (size_t i = 0; i < op->n; i++)
        if (!op->res[i].final) {
            again = true;
            not_owner = not_owner || st_is_not_owner(op->res[i].code, op->res[i].message);
            lost = lost || rtr_fo_error(op->res[i].code);
        }
    /* Entries a cluster could not take move to the plan's next cluster at once (multi-cluster
     * profiles; the entries are idempotent: their timestamps were assigned before). */
    if (lost && !op->r->closing && rtr_plan_next(op->r, &op->plan, ST_UNAVAILABLE)) {
        op->c = rtr_plan_cluster(op->r, &op->plan);
        mr_round(op);
        return;
    }
    st_code why = not_owner ? ST_FAILED_PRECONDITION : ST_UNAVAILABLE;
    if (!again || (!not_owner && rtr_plan_dark(op->r, &op->plan)) ||
        !rtr_retry_allowed(op->attempts, why, not_owner ? ST_NOT_OWNER_PREFIX : NULL) ||
        op->r->closing ||
        rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), mr_after_backoff, op) != ST_OK)
        mr_reply(op);
}

static void mr_msg(rpc_ccall *call, st_slice msg, void *arg) {
    mr_group *g = arg;
    mr_op *op = g->op;
    if (rtr_mutate_rows_merge(msg, g->idx, g->n, op->res, rpc_call_arena(op->call)) != ST_OK)
        rpc_ccall_cancel(call);
}

/* Settles the group's entries after its call ended. Entries the node answered (final) keep their
 * status, except per-entry "not owner" answers, which are retried; entries it did not answer take
 * the call's status, non-final (retried) when that status is retryable. */
static void mr_group_status(mr_group *g, st_code code, const char *message, bool unprocessed) {
    mr_op *op = g->op;
    bool retry = code != ST_OK && (unprocessed || rtr_retryable(code, message, op->idempotent) ||
                                   (op->plan.multi && op->idempotent && rtr_fo_error(code)));
    const char *m =
        message ? st_arena_dup(rpc_call_arena(op->call), message, strlen(message) + 1) : NULL;
    for (size_t i = 0; i < g->n; i++) {
        rtr_entry_result *res = &op->res[g->idx[i]];
        if (res->final) {
            if (rtr_retryable(res->code, res->message, false))
                res->final = false;
            continue;
        }
        if (code == ST_OK) {
            *res = (rtr_entry_result){ST_INTERNAL, "the node sent no status for this entry", true};
            continue;
        }
        *res = (rtr_entry_result){code, m ? m : "", !retry};
    }
}

static void mr_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    mr_group *g = arg;
    mr_op *op = g->op;
    bool unprocessed = code == ST_UNAVAILABLE && rpc_ccall_unprocessed(call);
    if (!unprocessed)
        rtr_health_report(g->node, code);
    mr_group_status(g, code, message, unprocessed);
    free(g->idx);
    free(g);
    if (--op->groups_pending == 0)
        mr_round_over(op);
}

/* True when idx is every entry in order: the node can take the request as the client sent it. */
static bool mr_all_entries(const mr_op *op, const size_t *idx, size_t n) {
    if (n != op->n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (idx[i] != i)
            return false;
    return true;
}

/* Sends one node's entries; false if the call could not start (entries stay non-final). */
static bool mr_send_group(mr_op *op, rtr_node *node, size_t *idx, size_t n, int64_t timeout) {
    mr_group *g = malloc(sizeof *g);
    st_buf buf;
    st_buf_init(&buf);
    st_err err = {0};
    st_slice req = op->req;
    bool ok = g != NULL;
    if (ok && !mr_all_entries(op, idx, n)) {
        ok = rtr_mutate_rows_build(&buf, st_buf_slice(&op->head), op->entries, idx, n) == ST_OK;
        req = st_buf_slice(&buf);
    }
    if (ok) {
        *g = (mr_group){op, node, idx, n};
        rpc_metadata md[RTR_FORWARD_HEADERS_MAX];
        size_t n_md = rtr_forward_headers(op->call, md);
        op->groups_pending++;
        ok = rtr_node_call(node, RTR_BT "MutateRows", req, md, n_md, timeout, mr_msg, mr_done, g,
                           &err) != NULL;
        if (!ok)
            op->groups_pending--;
    }
    st_buf_free(&buf);
    if (!ok) {
        rtr_health_report(node, ST_UNAVAILABLE);
        for (size_t i = 0; i < n; i++)
            op->res[idx[i]] = (rtr_entry_result){ST_UNAVAILABLE, "node unreachable", false};
        free(g);
        free(idx);
    }
    return ok;
}

/* Owner node of every entry still to send (SIZE_MAX: none known). */
static void mr_owners(mr_op *op, size_t *owner, size_t *count) {
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    for (size_t i = 0; i < op->n; i++) {
        owner[i] = SIZE_MAX;
        if (op->res[i].final)
            continue;
        size_t k = rtr_tmap_row(t, op->entries[i].row);
        if (k == SIZE_MAX) {
            op->res[i] = (rtr_entry_result){ST_UNAVAILABLE, "no node serves this row", false};
            continue;
        }
        owner[i] = t->v[k].node;
        count[owner[i]]++;
    }
}

static void mr_round(void *arg) {
    mr_op *op = arg;
    int64_t timeout;
    if (!rtr_call_timeout(op->call, op->r->opts.node_timeout_ms, &timeout)) {
        rpc_call_finish(op->call, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        st_buf_free(&op->head);
        free(op);
        return;
    }
    timeout = rtr_plan_attempt_ms(&op->plan, timeout);
    op->gen = op->c->map_gen;
    size_t *owner = malloc(op->n * sizeof *owner);
    size_t count[ST_TOPO_NODES_MAX] = {0};
    if (!owner) {
        rpc_call_finish(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
        st_buf_free(&op->head);
        free(op);
        return;
    }
    mr_owners(op, owner, count);
    op->groups_pending++; /* guard: the round ends after every group was sent */
    for (size_t j = 0; j < op->c->n_nodes; j++) {
        size_t *idx = count[j] ? malloc(count[j] * sizeof *idx) : NULL;
        size_t k = 0;
        for (size_t i = 0; idx && i < op->n; i++)
            if (owner[i] == j)
                idx[k++] = i;
        if (idx)
            mr_send_group(op, &op->c->nodes[j], idx, k, timeout);
    }
    free(owner);
    if (--op->groups_pending == 0)
        mr_round_over(op);
}

static st_code mr_check(size_t n_entries, size_t n_mutations, st_err *err) {
    if (n_entries == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "No entries provided");
    if (n_mutations > RTR_MUTATIONS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "Too many mutations: %zu provided; limit %d",
                          n_mutations, RTR_MUTATIONS_MAX);
    return ST_OK;
}

/* The fields a MutateRows is routed and checked by: peeked from the wire when plainly encoded
 * (100 entries' values are not copied), else unpacked. */
static bool mutate_rows_parse(rpc_call *call, st_slice req_bytes, rtr_mrs_peek *pk,
                              const char **table, const char **profile) {
    if (rtr_peek_mutate_rows(req_bytes, pk)) {
        *table = rtr_peek_str(rpc_call_arena(call), pk->table);
        *profile = rtr_peek_str(rpc_call_arena(call), pk->profile);
        if (*table && *profile)
            return true;
    }
    Google__Bigtable__V2__MutateRowsRequest *req =
        (void *)rtr_unpack(call, &google__bigtable__v2__mutate_rows_request__descriptor, req_bytes);
    if (!req)
        return false;
    *pk = (rtr_mrs_peek){.n_entries = req->n_entries, .idempotent = true};
    for (size_t i = 0; i < req->n_entries; i++) {
        pk->n_mutations += req->entries[i]->n_mutations;
        pk->idempotent = pk->idempotent &&
                         muts_idempotent(req->entries[i]->mutations, req->entries[i]->n_mutations);
    }
    if (req->n_entries > 0)
        pk->first_row = st_slice_make(req->entries[0]->row_key.data, req->entries[0]->row_key.len);
    *table = req->table_name;
    *profile = req->app_profile_id;
    return true;
}

void rtr_h_mutate_rows(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    rtr_mrs_peek pk;
    const char *table, *profile;
    rtr_plan plan;
    if (!mutate_rows_parse(call, req_bytes, &pk, &table, &profile))
        return;
    st_slice row = pk.n_entries == 1 ? pk.first_row : st_slice_make(NULL, 0);
    if (!data_route(r, call, table, profile, false, row, &plan))
        return;
    st_err err = {0};
    if (mr_check(pk.n_entries, pk.n_mutations, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    bool idempotent = pk.idempotent;
    if (plan.multi && !idempotent) {
        if (!data_stamp(r, call, true, &req_bytes))
            return;
        idempotent = true;
    }
    st_arena *a = rpc_call_arena(call);
    mr_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (mr_op){.r = r,
                  .call = call,
                  .c = rtr_plan_cluster(r, &plan),
                  .plan = plan,
                  .table = table,
                  .req = req_bytes,
                  .idempotent = idempotent};
    st_buf_init(&op->head);
    st_code rc = rtr_mutate_rows_split(req_bytes, a, &op->head, &op->entries, &op->n);
    if (rc == ST_OK && !(op->res = st_arena_alloc(a, op->n * sizeof *op->res)))
        rc = ST_RESOURCE_EXHAUSTED;
    if (rc != ST_OK) {
        st_buf_free(&op->head);
        free(op);
        rtr_fail(call, rc, "could not split the MutateRows request");
        return;
    }
    memset(op->res, 0, op->n * sizeof *op->res);
    mr_round(op);
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
    if (rtr_fo_error(rc) && !op->r->closing && rtr_plan_next(op->r, &op->plan, rc)) {
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
    Google__Bigtable__V2__SampleRowKeysRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__sample_row_keys_request__descriptor, req_bytes);
    rtr_plan plan;
    if (!req || !data_route(r, call, req->table_name, req->app_profile_id, false,
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
    srk_send(op);
}
