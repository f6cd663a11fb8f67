/* apply.c — the receiving side of replication: Apply turns each replicated row into a row
 * mutation that keeps its origin's version, commit timestamp and origin cluster, marks it
 * STO_ROW_REPLICATED (so it is never shipped onward) and writes the batch through the node's
 * write path, answering once it is durable. Storage's versions make this idempotent and
 * order-independent for the cells: a SetCell keeps the highest version of a cell, a delete
 * covers only lower versions; the change stream's order is kept by order.c, which starts each
 * source node's calls in its log's order. Also GetPositions. Loop thread only. */
#include "repl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/storage.h" /* sto_row_mut_decode: the log's row mutation encoding is the wire's too */
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

st_code repl_apply_prepare(const repl_node_ops *ops, void *node, const char *table,
                           st_slice encoded, st_arena *arena, sto_row_mut *out, st_err *err) {
    memset(out, 0, sizeof *out);
    if (!table || !table[0])
        return st_err_set(err, ST_INVALID_ARGUMENT, "replicated row without a table name");
    if (!sto_row_mut_decode(encoded, out, arena))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "replicated row of table %s: malformed row mutation encoding", table);
    if (out->row.len == 0 || out->row.len > STO_ROW_KEY_MAX || out->n_muts == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "replicated row of table %s: empty or oversized row key, or no "
                          "mutations",
                          table);
    if (out->origin == 0 || out->origin > STO_ORIGIN_MAX ||
        out->version != STO_VERSION(out->commit_ts_us, out->origin))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "replicated row of table %s: origin cluster %u and version %llu do "
                          "not match its commit timestamp %llu",
                          table, out->origin, (unsigned long long)out->version,
                          (unsigned long long)out->commit_ts_us);
    st_code rc = ops->route(node, table, out->row, &out->tablet_id, err);
    if (rc != ST_OK)
        return rc;
    out->flags = (out->flags & ~(uint32_t)STO_ROW_GC) | STO_ROW_REPLICATED;
    return ST_OK;
}

/* ---- Apply ---- */

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *ptr) {
    (void)data;
    (void)ptr;
}

static void reply(rpc_call *call, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = st_arena_alloc(rpc_call_arena(call), len ? len : 1);
    if (!buf) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory building the response");
        return;
    }
    protobuf_c_message_pack(msg, buf);
    st_code rc = rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, rc, rc == ST_OK ? NULL : "response could not be sent");
}

static void apply_durable(st_code code, const char *msg, void *arg) {
    repl_apply_op *op = arg;
    if (code != ST_OK) {
        repl_order_failed(op->r, op, true);
        rpc_call_finish(op->call, code, msg);
        return;
    }
    Strata__Internal__V1__ApplyResponse resp;
    strata__internal__v1__apply_response__init(&resp);
    resp.applied = (uint32_t)op->req->n_rows;
    reply(op->call, &resp.base);
}

/* Routes the rows now (a call that waited its turn may find its tablets split or moved) and
 * starts their write: ST_OK, or the code and message that refuse the call. */
static st_code apply_write(repl_ctx *r, repl_apply_op *op, st_err *err) {
    const Strata__Internal__V1__ApplyRequest *req = op->req;
    if (r->closing)
        return st_err_set(err, ST_UNAVAILABLE, "replication is shutting down");
    if (repl_link_cut(r, req->source_cluster))
        return st_err_set(err, ST_UNAVAILABLE,
                          "strata-link-cut: replication from this cluster is cut (`strata chaos "
                          "partition`); `strata chaos heal` restores it");
    st_arena *arena = rpc_call_arena(op->call);
    sto_row_mut *rows = st_arena_alloc(arena, (req->n_rows ? req->n_rows : 1) * sizeof *rows);
    if (!rows)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory applying a batch");
    uint64_t max_ts = 0;
    for (size_t i = 0; i < req->n_rows; i++) {
        const Strata__Internal__V1__ReplicatedRow *rr = req->rows[i];
        st_code rc = repl_apply_prepare(&r->ops, r->o.node, rr->table_name,
                                        st_slice_make(rr->row_mutation.data, rr->row_mutation.len),
                                        arena, &rows[i], err);
        if (rc != ST_OK)
            return rc;
        if (rows[i].commit_ts_us > max_ts)
            max_ts = rows[i].commit_ts_us;
    }
    if (req->n_rows == 0) {
        apply_durable(ST_OK, NULL, op);
        return ST_OK;
    }
    if (r->ops.observe_ts)
        r->ops.observe_ts(r->o.node, max_ts);
    return r->ops.write(r->o.node, rows, req->n_rows, err, apply_durable, op);
}

void repl_apply_start(repl_ctx *r, repl_apply_op *op) {
    st_err err = {0};
    /* op is answered (and its call released) once durable, maybe inside apply_write: only
     * what repl_order needs is read after it */
    repl_apply_op done = *op;
    if (apply_write(r, op, &err) != ST_OK) {
        repl_order_failed(r, &done, false);
        rpc_call_finish(done.call, err.code, err.msg);
        return;
    }
    repl_order_started(r, &done);
}

/* The source node's index in repl_order, REPL_ORDER_NONE when it names none of the topology's
 * nodes (then its calls are applied as they come). */
static size_t order_source(const Strata__Internal__V1__ApplyRequest *req) {
    if (req->source_cluster == 0 || req->source_cluster > ST_TOPO_CLUSTERS_MAX ||
        req->source_node == 0 || req->source_node > ST_TOPO_NODES_MAX)
        return REPL_ORDER_NONE;
    return (size_t)(req->source_cluster - 1) * ST_TOPO_NODES_MAX + (req->source_node - 1);
}

void repl_h_apply(rpc_call *call, st_slice req_bytes, void *arg) {
    repl_ctx *r = arg;
    st_arena *arena = rpc_call_arena(call);
    ProtobufCAllocator alloc = {arena_alloc, arena_free, arena};
    st_err err = {0};
    Strata__Internal__V1__ApplyRequest *req = (void *)btu_pb_unpack(
        &strata__internal__v1__apply_request__descriptor, &alloc, req_bytes, &err);
    if (!req) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, err.msg);
        return;
    }
    if (req->n_rows > REPL_APPLY_ROWS_MAX) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "ApplyRequest over the row maximum");
        return;
    }
    repl_apply_op *op = st_arena_alloc(arena, sizeof *op);
    if (!op) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory applying a batch");
        return;
    }
    op->r = r;
    op->call = call;
    op->req = req;
    op->src = order_source(req);
    op->after_lsn = req->after_lsn;
    op->next_lsn = req->next_lsn;
    repl_order_admit(r, op);
}

/* ---- GetPositions ---- */

void repl_h_get_positions(rpc_call *call, st_slice req_bytes, void *arg) {
    (void)req_bytes;
    repl_ctx *r = arg;
    st_arena *arena = rpc_call_arena(call);
    Strata__Internal__V1__Positions resp;
    strata__internal__v1__positions__init(&resp);
    resp.node_num = r->o.node_num;
    resp.cluster_num = r->o.cluster_num;
    resp.last_lsn = sto_log_last_lsn(r->o.db);
    resp.n_peers = r->n_shippers;
    resp.peers = st_arena_alloc(arena, (r->n_shippers + 1) * sizeof *resp.peers);
    if (!resp.peers) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < r->n_shippers; i++) {
        repl_peer_stats *st = st_arena_alloc(arena, sizeof *st);
        Strata__Internal__V1__PeerPosition *p = st_arena_alloc(arena, sizeof *p);
        if (!st || !p) {
            rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        repl_shipper_stats(r->shippers[i], st);
        strata__internal__v1__peer_position__init(p);
        p->cluster_num = st->cluster_num;
        p->cluster_id = st->cluster_id;
        p->acked_next_lsn = st->acked_next_lsn;
        p->acked_commit_us = st->acked_commit_us;
        p->records_behind = st->records_behind;
        p->bytes_behind = st->bytes_behind;
        p->time_behind_us = st->time_behind_us;
        p->backing_off = st->backing_off;
        p->last_error = st->last_error;
        p->link_cut = st->link_cut;
        resp.peers[i] = p;
    }
    reply(call, &resp.base);
}
