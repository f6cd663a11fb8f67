/* mutate_rows.c — MutateRows forwarding: one sub-request per node owning some of the entries,
 * the per-entry results mapped back to the caller's indexes and streamed to the client as each
 * node call ends (a message per finished node, the rest at the end); entries a node no longer owns
 * ("strata-not-owner:") are retried after a tablet-map refresh, bounded (RTR_RETRIES_MAX) with
 * backoff, without the client seeing it. */
#include "data.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/rpc/status.pb-c.h"

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
    bool *sent; /* the entry's status went to the client (mr_stream_group) */
    bool idempotent;
    int attempts;
    uint64_t gen;
    size_t groups_pending;
    uint64_t fp;             /* rtr_qod_fingerprint of the client's request (before stamping) */
    bool moved_once;         /* moved on once after a node connection dropped under it */
    struct mr_group *groups; /* node calls in flight */
    bool stalled;            /* they were cancelled because their cluster turned unhealthy */
    rtr_inflight link;       /* multi-cluster: in its cluster's in-flight list during a round */
    rtr_fence fence;         /* multi-cluster: groups that may still apply (failover.h) */
    rtr_unserved unserved;   /* no node of the cluster served some entries' rows (failover.h) */
} mr_op;

typedef struct mr_group {
    mr_op *op;
    rtr_node *node;
    size_t *idx;
    size_t n;
    rpc_ccall *call;
    struct mr_group *prev, *next; /* in op->groups */
    uint64_t conn_id;             /* node's rtr_node.conn_id when the call was sent */
    int64_t fence_us;             /* multi-cluster: the node refuses the call after this */
    char fence_text[RTR_FENCE_TEXT_BYTES];
} mr_group;

static void mr_round(void *arg);

/* Sends the statuses of the entries idx[0..n) (the caller's indexes, ascending) in one message
 * and marks them sent. A failure to queue it (the client went away) is the final status's to
 * report. */
static st_code mr_send_statuses(mr_op *op, const size_t *idx, size_t n) {
    st_arena *a = rpc_call_arena(op->call);
    Google__Bigtable__V2__MutateRowsResponse resp;
    google__bigtable__v2__mutate_rows_response__init(&resp);
    resp.entries = st_arena_alloc(a, n * sizeof *resp.entries);
    Google__Bigtable__V2__MutateRowsResponse__Entry *ents = st_arena_alloc(a, n * sizeof *ents);
    Google__Rpc__Status *sts = st_arena_alloc(a, n * sizeof *sts);
    if (!resp.entries || !ents || !sts)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t k = 0; k < n; k++) {
        size_t i = idx[k];
        google__bigtable__v2__mutate_rows_response__entry__init(&ents[k]);
        google__rpc__status__init(&sts[k]);
        sts[k].code = (int32_t)op->res[i].code;
        sts[k].message = (char *)(op->res[i].message ? op->res[i].message : "");
        ents[k].index = (int64_t)i;
        ents[k].status = &sts[k];
        resp.entries[k] = &ents[k];
    }
    resp.n_entries = n;
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    uint8_t *buf = st_arena_alloc(a, len ? len : 1);
    if (!buf)
        return ST_RESOURCE_EXHAUSTED;
    protobuf_c_message_pack(&resp.base, buf);
    st_code rc = rpc_call_send(op->call, st_slice_make(buf, len));
    for (size_t k = 0; rc == ST_OK && k < n; k++)
        op->sent[idx[k]] = true;
    return rc;
}

/* The statuses of a finished group's entries that are settled for good go to the client now
 * rather than with the rest: a node that hangs must not withhold the answers of entries other
 * nodes applied (a client deadline would lose them, and the client would send them again). An
 * entry is settled once final: nothing sends it again (mr_owners) nor changes its status. */
static void mr_stream_group(mr_op *op, const size_t *gidx, size_t gn) {
    size_t *idx = malloc(gn * sizeof *idx);
    size_t n = 0;
    for (size_t k = 0; idx && k < gn; k++)
        if (op->res[gidx[k]].final && !op->sent[gidx[k]])
            idx[n++] = gidx[k];
    if (n > 0) /* the group's indexes ascend (mr_round) */
        mr_send_statuses(op, idx, n);
    free(idx); /* out of memory: they go with the last message */
}

/* The last message (the statuses not sent yet, in the caller's order), then the OK trailer. */
static void mr_reply(mr_op *op) {
    size_t *idx = malloc(op->n * sizeof *idx);
    size_t n = 0;
    st_code rc = idx ? ST_OK : ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; idx && i < op->n; i++)
        if (!op->sent[i])
            idx[n++] = i;
    if (rc == ST_OK && n > 0)
        rc = mr_send_statuses(op, idx, n);
    free(idx);
    if (rc == ST_OK)
        rpc_call_finish(op->call, ST_OK, NULL);
    else
        rpc_call_finish(op->call, rc,
                        rc == ST_RESOURCE_EXHAUSTED ? "out of memory"
                                                    : "could not send the response");
    rtr_inflight_unlink(&op->link);
    st_buf_free(&op->head);
    free(op);
}

/* Its cluster turned unhealthy (or a node's link went silent) during the round: the calls still
 * out are cancelled, and their entries move to the next cluster (mr_done, mr_round_over). */
static void mr_move(rtr_inflight *f) {
    mr_op *op = (mr_op *)((char *)f - offsetof(mr_op, link));
    if (op->stalled)
        return;
    op->stalled = true;
    for (mr_group *g = op->groups; g; g = g->next)
        rpc_ccall_cancel(g->call);
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
    if (op->c->map_gen != op->gen || rtr_health_cluster_refuses(op->r, op->c->idx)) {
        mr_round(op);
        return;
    }
    if (rtr_cluster_refresh(op->c, mr_round, op) != ST_OK)
        mr_reply(op);
}

/* After a round: entries left non-final are retried (bounded), else the answer goes out. */
static void mr_round_over(mr_op *op) {
    bool again = false, not_owner = false, lost = false;
    rtr_inflight_unlink(&op->link);
    op->stalled = false;
    for (size_t i = 0; i < op->n; i++)
        if (!op->res[i].final) {
            again = true;
            not_owner = not_owner || st_is_not_owner(op->res[i].code, op->res[i].message);
            lost = lost || rtr_fo_error(op->res[i].code) ||
                   rtr_plan_moves_off_replica(&op->plan, op->res[i].code);
        }
    /* Entries a cluster could not take move to the plan's next cluster at once (multi-cluster
     * profiles; the entries are idempotent: their timestamps were assigned before; a damaged
     * tablet refused its entries before writing them). */
    if (lost && !op->r->closing && rtr_plan_next(op->r, &op->plan, ST_UNAVAILABLE)) {
        op->c = rtr_plan_cluster(op->r, &op->plan);
        mr_round(op);
        return;
    }
    if (!again) /* every entry has its answer: no node died of this request */
        rtr_qod_served(op->r, op->fp);
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
 * status, except per-entry "not owner" answers, which are retried, and DATA_LOSS refusals of a
 * damaged tablet, which a multi-cluster plan sends to its next cluster; entries it did not answer
 * take the call's status, non-final (retried) when that status is retryable. */
static void mr_group_status(mr_group *g, st_code code, const char *message, bool unprocessed) {
    mr_op *op = g->op;
    bool retry = code != ST_OK && (unprocessed || rtr_retryable(code, message, op->idempotent) ||
                                   (op->plan.multi && op->idempotent && rtr_fo_error(code)) ||
                                   rtr_plan_moves_off_replica(&op->plan, code));
    const char *m =
        message ? st_arena_dup(rpc_call_arena(op->call), message, strlen(message) + 1) : NULL;
    for (size_t i = 0; i < g->n; i++) {
        rtr_entry_result *res = &op->res[g->idx[i]];
        if (res->final) {
            if (rtr_retryable(res->code, res->message, false) ||
                rtr_plan_moves_off_replica(&op->plan, res->code))
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

/* The group's entries not settled yet end with err (the query-of-death guard refused them). */
static void mr_group_refuse(mr_group *g, const st_err *err) {
    mr_op *op = g->op;
    const char *m = st_arena_dup(rpc_call_arena(op->call), err->msg, strlen(err->msg) + 1);
    for (size_t i = 0; i < g->n; i++) {
        rtr_entry_result *res = &op->res[g->idx[i]];
        if (!res->final)
            *res = (rtr_entry_result){err->code, m ? m : "", true};
    }
}

static void mr_group_end(mr_group *g) {
    mr_op *op = g->op;
    mr_stream_group(op, g->idx, g->n);
    free(g->idx);
    free(g);
    if (--op->groups_pending == 0)
        mr_round_over(op);
}

/* The group's node connection dropped under it, with lost sent calls: the same query-of-death
 * rule as the other requests (failover.h), applied to the group's entries. True when the group
 * is refused here; false: settle it as usual. */
static bool mr_qod(mr_group *g, size_t lost) {
    mr_op *op = g->op;
    st_err err = {0};
    rtr_qod_verdict v =
        rtr_qod_dropped(op->r, op->fp, lost, g->node, rtr_qod_drop_id(g->node, g->conn_id),
                        st_mono_us(), &op->moved_once, &err);
    if (v == RTR_QOD_GO)
        return false;
    mr_group_refuse(g, &err);
    mr_group_end(g);
    return true;
}

static void mr_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    mr_group *g = arg;
    mr_op *op = g->op;
    if (g->prev)
        g->prev->next = g->next;
    else
        op->groups = g->next;
    if (g->next)
        g->next->prev = g->prev;
    if (op->stalled && code == ST_CANCELLED) {
        code = ST_DEADLINE_EXCEEDED;
        message = "its cluster turned unhealthy while the request was out";
    }
    rtr_call_fate fate = rtr_call_fate_of(call, code);
    bool unprocessed = fate != RTR_CALL_SENT;
    rtr_fence_ended(&op->fence, g->fence_us, code, !unprocessed);
    if (fate != RTR_CALL_REFUSED) /* refused by the node's GOAWAY: the node is up */
        rtr_health_report(g->node, code);
    size_t lost = code == ST_UNAVAILABLE ? rpc_ccall_conn_lost(call) : 0;
    if (lost > 0 && mr_qod(g, lost))
        return;
    mr_group_status(g, code, message, unprocessed);
    mr_group_end(g);
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
        *g = (mr_group){.op = op, .node = node, .idx = idx, .n = n};
        rpc_metadata md[RTR_FORWARD_HEADERS_MAX];
        size_t n_md = rtr_forward_headers(op->call, md);
        if (op->plan.multi && op->idempotent)
            rtr_fence_attempt(timeout, &g->fence_us, g->fence_text, md, &n_md);
        op->groups_pending++;
        g->call = rtr_node_call(node, RTR_BT "MutateRows", req, md, n_md, timeout, mr_msg, mr_done,
                                g, &err);
        g->conn_id = node->conn_id;
        ok = g->call != NULL;
        if (ok)
            rpc_ccall_set_owner(g->call, rpc_call_conn_serial(op->call));
        if (!ok) {
            op->groups_pending--;
        } else {
            g->prev = NULL;
            g->next = op->groups;
            if (op->groups)
                op->groups->prev = g;
            op->groups = g;
        }
    }
    st_buf_free(&buf);
    if (!ok) {
        rtr_health_report(node, ST_UNAVAILABLE);
        const char *m = err.msg[0]
                            ? st_arena_dup(rpc_call_arena(op->call), err.msg, strlen(err.msg) + 1)
                            : NULL;
        for (size_t i = 0; i < n; i++)
            op->res[idx[i]] = (rtr_entry_result){ST_UNAVAILABLE, m ? m : "node unreachable", false};
        free(g);
        free(idx);
    }
    return ok;
}

/* The result of an entry whose row no node of op->c serves (rtr_unserved_check, once per round
 * in *act, message in *msg): open UNAVAILABLE to move a multi-cluster request on at once (the
 * entries are unsent), open FAILED_PRECONDITION to be retried (its code if the retries run
 * out), or final once past the grace. */
static rtr_entry_result mr_unserved(mr_op *op, rtr_unserved_act *act, const char **msg) {
    if (!*msg) {
        st_err err = {0};
        *act = rtr_unserved_check(&op->plan, op->c, op->table, "this row", st_mono_us(),
                                  &op->unserved, &err);
        *msg = st_arena_dup(rpc_call_arena(op->call), err.msg, strlen(err.msg) + 1);
        if (!*msg)
            *msg = "no node serves this row";
    }
    if (*act == RTR_UNSERVED_MOVE)
        return (rtr_entry_result){ST_UNAVAILABLE, *msg, false};
    return (rtr_entry_result){ST_FAILED_PRECONDITION, *msg, *act == RTR_UNSERVED_END};
}

/* Owner node of every entry still to send (SIZE_MAX: none known). */
static void mr_owners(mr_op *op, size_t *owner, size_t *count) {
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    rtr_unserved_act act = RTR_UNSERVED_WAIT;
    const char *unserved = NULL;
    for (size_t i = 0; i < op->n; i++) {
        owner[i] = SIZE_MAX;
        if (op->res[i].final)
            continue;
        size_t k = rtr_tmap_row(t, op->entries[i].row);
        if (k == SIZE_MAX) {
            op->res[i] = mr_unserved(op, &act, &unserved);
            continue;
        }
        owner[i] = t->v[k].node;
        count[owner[i]]++;
    }
}

/* A cluster none of whose nodes answers is not sent to (health.c): the plan moves past it, or
 * the round ends unsent with every entry still open UNAVAILABLE (mr_round_over then answers at
 * once when the whole plan refuses, else retries). False when the round ended that way. */
static bool mr_gate(mr_op *op) {
    st_err err = {0};
    rtr_plan_gate g = rtr_plan_gate_check(op->r, &op->plan, &err);
    op->c = rtr_plan_cluster(op->r, &op->plan);
    if (g == RTR_GATE_GO)
        return true;
    const char *m = st_arena_dup(rpc_call_arena(op->call), err.msg, strlen(err.msg) + 1);
    for (size_t i = 0; i < op->n; i++)
        if (!op->res[i].final)
            op->res[i] = (rtr_entry_result){ST_UNAVAILABLE, m ? m : "", false};
    mr_round_over(op);
    return false;
}

static void mr_round(void *arg) {
    mr_op *op = arg;
    int64_t wait_ms = rtr_fence_wait_ms(&op->fence);
    if (wait_ms > 0) { /* an earlier group may still apply until then */
        if (op->r->closing || rtr_later_add(op->r, wait_ms, mr_round, op) != ST_OK)
            mr_reply(op);
        return;
    }
    if (!mr_gate(op))
        return;
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
    /* Multi-cluster writes (idempotent: stamped) leave a cluster that turns unhealthy at once. */
    if (op->groups && op->plan.multi && op->idempotent && op->plan.cur + 1 < op->plan.n) {
        op->link.move = mr_move;
        rtr_inflight_link(op->c, &op->link);
    }
    if (--op->groups_pending == 0)
        mr_round_over(op);
}

static st_code mr_check(size_t n_entries, size_t n_mutations, st_err *err) {
    if (n_entries == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "No entries provided");
    /* Each entry needs a mutation, so more entries than mutations allowed cannot all be valid;
     * refused here, before the router lays out a routing record per entry. */
    if (n_entries > RTR_MUTATIONS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Too many entries: %zu provided; limit %d (each entry needs at least one "
                          "mutation)",
                          n_entries, RTR_MUTATIONS_MAX);
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
        pk->idempotent = pk->idempotent && rtr_muts_idempotent(req->entries[i]->mutations,
                                                               req->entries[i]->n_mutations);
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
    if (rtr_data_view_refused(call, req_bytes, 5, 0) || /* MutateRowsRequest */
        !mutate_rows_parse(call, req_bytes, &pk, &table, &profile))
        return;
    uint64_t fp = rtr_qod_fingerprint(rpc_call_path(call), req_bytes); /* before stamping */
    st_slice row = pk.n_entries == 1 ? pk.first_row : st_slice_make(NULL, 0);
    if (!rtr_data_route(r, call, table, profile, RTR_ACCESS_WRITE, row, &plan))
        return;
    st_err err = {0};
    if (mr_check(pk.n_entries, pk.n_mutations, &err) != ST_OK || rtr_qod_refused(r, fp, &err)) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    bool idempotent = pk.idempotent;
    if (plan.multi && !idempotent) {
        if (!rtr_data_stamp(r, call, true, &req_bytes))
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
                  .idempotent = idempotent,
                  .fp = fp};
    st_buf_init(&op->head);
    st_code rc = rtr_mutate_rows_split(req_bytes, a, &op->head, &op->entries, &op->n);
    if (rc == ST_OK && (!(op->res = st_arena_alloc(a, op->n * sizeof *op->res)) ||
                        !(op->sent = st_arena_alloc(a, op->n * sizeof *op->sent))))
        rc = ST_RESOURCE_EXHAUSTED;
    if (rc != ST_OK) {
        st_buf_free(&op->head);
        free(op);
        rtr_fail(call, rc, "could not split the MutateRows request");
        return;
    }
    memset(op->res, 0, op->n * sizeof *op->res);
    memset(op->sent, 0, op->n * sizeof *op->sent);
    for (size_t i = 0; i < op->n; i++) /* answered here: the same, whether or not its node is up */
        if (op->entries[i].invalid)
            op->res[i] = (rtr_entry_result){ST_INVALID_ARGUMENT, op->entries[i].invalid, true};
    mr_round(op);
}
