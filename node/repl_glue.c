/* repl_glue.c — the node's side of replication (replication/): reads the topology
 * (--config), starts a repl_ctx with the node's write path as its callbacks, serves
 * strata.internal.v1.Replication (Apply, GetPositions), and gives GenerateConsistencyToken and
 * CheckConsistency their cross-cluster meaning when the node has peer clusters. Without a
 * topology, or with only its own cluster, the node behaves exactly as before. Loop thread. */
#include "repl_glue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "changes.h"
#include "node_internal.h"

#ifndef STRATA_REPLICATION
/* Built without replication/ (a partial STRATA_DIRS): the node serves one cluster only. */
st_code node_repl_start(node_ctx *n, st_err *err) {
    if (n->opts.config_path && n->opts.config_path[0])
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "this strata-node was built without replication; --config needs it");
    return ST_OK;
}
void node_repl_stop(node_ctx *n) {
    (void)n;
}
void node_repl_notify(node_ctx *n) {
    (void)n;
}
void node_repl_tablet_named(node_ctx *n, uint64_t id, const char *table) {
    (void)n;
    (void)id;
    (void)table;
}
st_code node_repl_tablet_retire(node_ctx *n, uint64_t id, const char *table, st_err *err) {
    (void)n;
    (void)id;
    (void)table;
    (void)err;
    return ST_OK;
}
void node_repl_tablet_retire_done(node_ctx *n, uint64_t id, bool gone) {
    (void)n;
    (void)id;
    (void)gone;
}
void node_repl_table_dropped(node_ctx *n, const char *table) {
    (void)n;
    (void)table;
}
bool node_repl_table_shipping(node_ctx *n, const char *table) {
    (void)n;
    (void)table;
    return false;
}
bool node_repl_shipped(node_ctx *n, uint64_t lsn, uint32_t *behind) {
    (void)n;
    (void)lsn;
    (void)behind;
    return true;
}
const char *node_repl_cluster_id(node_ctx *n, uint32_t cluster_num) {
    (void)n;
    (void)cluster_num;
    return NULL;
}
int64_t node_repl_applied_bound(node_ctx *n, int64_t w) {
    (void)n;
    (void)w;
    return INT64_MAX;
}
void node_repl_h_generate_consistency_token(rpc_call *call, st_slice req, void *arg) {
    node_h_generate_consistency_token(call, req, arg);
}
void node_repl_h_check_consistency(rpc_call *call, st_slice req, void *arg) {
    node_h_check_consistency(call, req, arg);
}
#else

#include "strata/replication.h"
#include "strata/topology.h"

/* ---- the node as replication sees it ---- */

static st_code glue_route(void *node, const char *table, st_slice row, uint64_t *tablet_id,
                          st_err *err) {
    node_ctx *n = node;
    st_err local = {0};
    node_tablet *tab = node_write_tablet(n, table, row, err ? err : &local);
    if (!tab)
        return err ? err->code : local.code;
    *tablet_id = tab->id;
    return ST_OK;
}

static bool glue_table_exists(void *node, const char *table) {
    return node_tablets_find(node, table) != NULL;
}

typedef struct glue_write {
    repl_write_done_fn done;
    void *arg;
} glue_write;

static void glue_write_done(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)n;
    glue_write *w = arg;
    w->done(code, msg, w->arg);
    free(w);
}

static st_code glue_write_rows(void *node, const sto_row_mut *rows, size_t count, st_err *err,
                               repl_write_done_fn done, void *arg) {
    glue_write *w = malloc(sizeof *w);
    if (!w)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory applying a batch");
    w->done = done;
    w->arg = arg;
    st_code rc = node_write(node, rows, count, err, glue_write_done, w);
    if (rc != ST_OK)
        free(w);
    return rc;
}

/* The hybrid logical clock moves past replicated commit times, so a local write after seeing a
 * remote one gets a higher version (and ReadModifyWriteRow never goes back in time); not by
 * an absurd step (node_clock_observe). */
static void glue_observe_ts(void *node, uint64_t commit_ts_us) {
    int64_t ts = commit_ts_us > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)commit_ts_us;
    node_clock_observe(node, ts, "replication", NULL);
}

/* Every local write with a commit time at or below the result is durable: with none in flight,
 * the clock (a write commits above it and above now - 1, taking its commit time and entering
 * storage in one turn of the loop); else unknown. */
static int64_t glue_commit_floor(void *node) {
    node_ctx *n = node;
    if (__atomic_load_n(&n->writes_in_flight, __ATOMIC_RELAXED) != 0)
        return 0;
    int64_t now = st_wall_us() - 1;
    return now > n->hlc_last_us ? now : n->hlc_last_us;
}

static int64_t glue_cs_resolved(void *node) {
    return node_cs_resolved(node);
}

static const repl_node_ops glue_ops = {.route = glue_route,
                                       .write = glue_write_rows,
                                       .observe_ts = glue_observe_ts,
                                       .table_exists = glue_table_exists,
                                       .commit_floor = glue_commit_floor,
                                       .cs_resolved = glue_cs_resolved};

int64_t node_repl_applied_bound(node_ctx *n, int64_t w) {
    return repl_applied_bound(n->repl, w);
}

const char *node_repl_cluster_id(node_ctx *n, uint32_t cluster_num) {
    if (!n->repl || cluster_num == 0)
        return NULL;
    const st_topology *t = repl_topology(n->repl);
    return cluster_num <= t->n_clusters ? t->clusters[cluster_num - 1].id : NULL;
}

/* ---- start, stop ---- */

st_code node_repl_start(node_ctx *n, st_err *err) {
    if (!n->opts.config_path || !n->opts.config_path[0])
        return ST_OK;
    st_topology *topo = calloc(1, sizeof *topo);
    if (!topo)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the topology");
    st_code rc = st_topology_load(n->opts.config_path, topo, err);
    if (rc == ST_OK && (n->opts.cluster_num == 0 || n->opts.cluster_num > topo->n_clusters))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "--config %s needs --cluster-num 1..%zu (this node's cluster, in file "
                        "order)",
                        n->opts.config_path, topo->n_clusters);
    if (rc == ST_OK) {
        char state[sizeof n->data_dir + 16];
        snprintf(state, sizeof state, "%s/replication", n->data_dir);
        repl_opts o;
        memset(&o, 0, sizeof o);
        o.topo = topo;
        o.cluster_num = n->opts.cluster_num;
        o.node_num = n->opts.node_num;
        o.state_dir = state;
        o.db = n->db;
        o.base = n->base;
        o.ops = &glue_ops;
        o.node = n;
        o.client_opts = &n->peer_opts; /* mutual TLS to the peer clusters' nodes, if on */
        rc = repl_open(&o, &n->repl, err);
    }
    if (rc == ST_OK)
        rc = repl_register(n->repl, n->rpc, err);
    free(topo);
    return rc;
}

void node_repl_stop(node_ctx *n) {
    repl_close(n->repl);
    n->repl = NULL;
}

void node_repl_tablet_named(node_ctx *n, uint64_t id, const char *table) {
    repl_tablet_named(n->repl, id, table);
}

st_code node_repl_tablet_retire(node_ctx *n, uint64_t id, const char *table, st_err *err) {
    return repl_tablet_retire(n->repl, id, table, err);
}

void node_repl_tablet_retire_done(node_ctx *n, uint64_t id, bool gone) {
    repl_tablet_retire_done(n->repl, id, gone);
}

void node_repl_table_dropped(node_ctx *n, const char *table) {
    repl_table_dropped(n->repl, table);
}

bool node_repl_table_shipping(node_ctx *n, const char *table) {
    return repl_table_shipping(n->repl, table);
}

void node_repl_notify(node_ctx *n) {
    if (n->repl)
        repl_notify_commit(n->repl);
}

bool node_repl_shipped(node_ctx *n, uint64_t lsn, uint32_t *behind) {
    if (!n->repl)
        return true;
    repl_node_positions pos;
    repl_positions_local(n->repl, &pos);
    for (size_t i = 0; i < pos.n_peers; i++)
        if (pos.peer_acked_next[i] <= lsn) {
            *behind = pos.peer_cluster[i];
            return false;
        }
    return true;
}

/* ---- consistency tokens ---- */

#define GATHER_TIMEOUT_MS 10000

typedef struct token_op {
    node_ctx *n;
    rpc_call *call;
    repl_token token; /* CheckConsistency: the decoded token */
} token_op;

static void generate_done(const repl_node_positions *nodes, size_t count, size_t failed,
                          void *arg) {
    token_op *op = arg;
    /* A node that did not answer gets the "unknown" lsn: the check then waits for all it holds
     * when asked, so the token is never consistent early. */
    if (failed)
        st_log(ST_LOG_WARN, "repl", "consistency token: %zu node(s) did not report positions",
               failed);
    repl_token_from_positions(repl_topology(op->n->repl), nodes, count, &op->token);
    char text[REPL_TOKEN_CHARS_MAX];
    st_err err;
    if (repl_token_encode(&op->token, text, sizeof text, &err) != ST_OK) {
        node_fail(op->call, ST_INTERNAL, "%s", err.msg);
    } else {
        Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse resp;
        google__bigtable__admin__v2__generate_consistency_token_response__init(&resp);
        resp.consistency_token = text;
        node_reply(op->call, &resp.base);
    }
    free(op);
}

static bool repl_active(node_ctx *n) {
    return n->repl && repl_peer_count(n->repl) > 0;
}

void node_repl_h_generate_consistency_token(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    if (!repl_active(n)) {
        node_h_generate_consistency_token(call, req_bytes, arg);
        return;
    }
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__generate_consistency_token_request__descriptor,
        req_bytes);
    if (!req || !node_table_or_fail(n, call, req->name, NULL))
        return;
    token_op *op = calloc(1, sizeof *op);
    if (!op) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    op->n = n;
    op->call = call;
    if (repl_positions_gather(n->repl, GATHER_TIMEOUT_MS, generate_done, op) != ST_OK) {
        free(op);
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
}

/* A peer cluster that cannot take replicated writes at all: this node's shipper to it backs off
 * because the peer has no Replication service (UNIMPLEMENTED: its nodes run without --config).
 * Waiting would never end, so CheckConsistency says so instead of "not yet". */
static bool peer_cannot_replicate(node_ctx *n, char *msg, size_t cap) {
    for (size_t i = 0; i < repl_peer_count(n->repl); i++) {
        repl_peer_stats st;
        repl_peer_stats_get(n->repl, i, &st);
        if (st.backing_off && st.last_code == ST_UNIMPLEMENTED) {
            snprintf(msg, cap,
                     "cluster %s does not accept replicated writes (%.120s): its nodes run "
                     "without the instance topology; restart them with --config TOPOLOGY "
                     "--cluster-num %u (as `strata up` does)",
                     st.cluster_id, st.last_error, st.cluster_num);
            return true;
        }
    }
    return false;
}

static void check_done(const repl_node_positions *nodes, size_t count, size_t failed, void *arg) {
    (void)failed; /* a silent node is simply not consistent yet */
    token_op *op = arg;
    Google__Bigtable__Admin__V2__CheckConsistencyResponse resp;
    google__bigtable__admin__v2__check_consistency_response__init(&resp);
    resp.consistent = repl_token_satisfied(&op->token, repl_topology(op->n->repl), nodes, count);
    char msg[ST_ERR_MSG_MAX];
    if (!resp.consistent && peer_cannot_replicate(op->n, msg, sizeof msg))
        node_fail(op->call, ST_FAILED_PRECONDITION, "%s", msg);
    else
        node_reply(op->call, &resp.base);
    free(op);
}

void node_repl_h_check_consistency(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__CheckConsistencyRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__check_consistency_request__descriptor, req_bytes);
    if (!req)
        return;
    if (!repl_active(n) || !repl_token_is_global(req->consistency_token)) {
        node_h_check_consistency(call, req_bytes, arg);
        return;
    }
    if (!node_table_or_fail(n, call, req->name, NULL))
        return;
    token_op *op = calloc(1, sizeof *op);
    if (!op) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    op->n = n;
    op->call = call;
    st_err err;
    if (repl_token_decode(req->consistency_token, &op->token, &err) != ST_OK) {
        free(op);
        node_fail(call, ST_INVALID_ARGUMENT, "%s", err.msg);
        return;
    }
    if (repl_positions_gather(n->repl, GATHER_TIMEOUT_MS, check_done, op) != ST_OK) {
        free(op);
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
}

#endif /* STRATA_REPLICATION */
