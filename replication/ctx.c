/* ctx.c — the per-node replication context: starts a shipper per peer cluster, pools clients to
 * other nodes, remembers tablet id -> table names for the log's records, and gathers every
 * node's positions for consistency tokens. Loop thread only. */
#include "repl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

#define PATH_GET_POSITIONS "/strata.internal.v1.Replication/GetPositions"

/* ---- clients ---- */

rpc_client *repl_conn_get(repl_ctx *r, const char *addr, st_err *err) {
    repl_conn *c = NULL;
    for (size_t i = 0; i < r->n_conns && !c; i++)
        if (strcmp(r->conns[i].addr, addr) == 0)
            c = &r->conns[i];
    if (!c) {
        if (r->n_conns == REPL_TOKEN_NODES_MAX) {
            st_err_set(err, ST_RESOURCE_EXHAUSTED, "over %d peer connections",
                       REPL_TOKEN_NODES_MAX);
            return NULL;
        }
        c = &r->conns[r->n_conns++];
        snprintf(c->addr, sizeof c->addr, "%s", addr);
        c->client = NULL;
    }
    if (c->client && !rpc_client_alive(c->client)) {
        rpc_client_free(c->client);
        c->client = NULL;
    }
    if (!c->client) {
        char host[ST_TOPO_ADDR_MAX + 1];
        uint16_t port;
        if (!st_addr_split(addr, host, sizeof host, &port)) {
            st_err_set(err, ST_INVALID_ARGUMENT, "bad node address '%s'", addr);
            return NULL;
        }
        c->client =
            rpc_client_new(r->o.base, host, port, r->has_client_opts ? &r->client_opts : NULL, err);
    }
    return c->client;
}

/* ---- tablet names ---- */

static int name_cmp(const void *a, const void *b) {
    const repl_name *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static repl_name *name_find(repl_ctx *r, uint64_t id) {
    repl_name key = {.id = id};
    if (r->n_names == 0)
        return NULL; /* bsearch's base must not be NULL */
    return bsearch(&key, r->names, r->n_names, sizeof key, name_cmp);
}

static void name_add(const sto_tablet_info *info, void *arg) {
    repl_ctx *r = arg;
    if (name_find(r, info->id) || r->n_names >= REPL_TABLET_NAMES_MAX)
        return;
    repl_name *v = realloc(r->names, (r->n_names + 1) * sizeof *v);
    if (!v)
        return;
    r->names = v;
    char *t = malloc(info->table.len + 1);
    if (!t)
        return;
    if (info->table.len)
        memcpy(t, info->table.data, info->table.len);
    t[info->table.len] = '\0';
    /* Insert keeping the order (tablets come in id order, so this is usually an append). */
    size_t i = r->n_names;
    while (i > 0 && v[i - 1].id > info->id) {
        v[i] = v[i - 1];
        i--;
    }
    v[i].id = info->id;
    v[i].table = t;
    r->n_names++;
}

void repl_names_refresh(repl_ctx *r) {
    sto_tablet_list(r->o.db, name_add, r);
}

void repl_names_forget(repl_ctx *r, const char *table) {
    size_t k = 0;
    for (size_t i = 0; i < r->n_names; i++) {
        if (strcmp(r->names[i].table, table) == 0)
            free(r->names[i].table);
        else
            r->names[k++] = r->names[i]; /* keeps the id order */
    }
    r->n_names = k;
}

void repl_notify_commit(repl_ctx *r) {
    for (size_t i = 0; r && i < r->n_shippers; i++)
        repl_shipper_wake(r->shippers[i]);
}

void repl_tablet_named(repl_ctx *r, uint64_t tablet_id, const char *table) {
    if (!r || !table)
        return;
    sto_tablet_info info = {.id = tablet_id, .table = st_slice_cstr(table)};
    name_add(&info, r);
}

const char *repl_tablet_table(repl_ctx *r, uint64_t tablet_id, bool refresh) {
    repl_name *n = name_find(r, tablet_id);
    if (!n && refresh) {
        repl_names_refresh(r);
        n = name_find(r, tablet_id);
    }
    return n ? n->table : NULL;
}

/* ---- open, close ---- */

st_code repl_open(const repl_opts *opts, repl_ctx **out, st_err *err) {
    repl_ctx *r = calloc(1, sizeof *r);
    if (!r)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting replication");
    r->o = *opts;
    r->topo = *opts->topo;
    r->o.topo = &r->topo;
    r->ops = *opts->ops;
    r->o.ops = &r->ops;
    if (opts->client_opts) {
        r->client_opts = *opts->client_opts;
        r->has_client_opts = true;
    }
    r->o.client_opts = NULL;
    snprintf(r->state_dir, sizeof r->state_dir, "%s", opts->state_dir);
    r->o.state_dir = r->state_dir;
#define DEF(f, v)                                                                                  \
    if (!r->o.f)                                                                                   \
    r->o.f = (v)
    DEF(batch_rows_max, REPL_BATCH_ROWS_MAX);
    DEF(batch_bytes_max, REPL_BATCH_BYTES_MAX);
    DEF(inflight_max, REPL_INFLIGHT_BATCHES_MAX);
    DEF(backoff_min_ms, REPL_BACKOFF_MIN_MS);
    DEF(backoff_max_ms, REPL_BACKOFF_MAX_MS);
    DEF(hold_interval_ms, REPL_HOLD_INTERVAL_MS);
    DEF(poll_ms, REPL_POLL_MS);
    DEF(rpc_timeout_ms, REPL_RPC_TIMEOUT_MS);
#undef DEF
    if (r->o.inflight_max > REPL_INFLIGHT_BATCHES_MAX)
        r->o.inflight_max = REPL_INFLIGHT_BATCHES_MAX;
    st_env *env = st_env_posix();
    st_code rc = env->ops->mkdirs(env, r->state_dir, err);
    repl_names_refresh(r);
    for (size_t c = 0; rc == ST_OK && c < r->topo.n_clusters; c++) {
        const st_topo_cluster *cl = &r->topo.clusters[c];
        if (cl->num == r->o.cluster_num)
            continue;
        rc = repl_shipper_open(r, cl, &r->shippers[r->n_shippers], err);
        if (rc == ST_OK)
            r->n_shippers++;
    }
    if (rc == ST_OK)
        rc = repl_retired_load(r, err);
    if (rc != ST_OK) {
        repl_close(r);
        return rc;
    }
    if (r->n_shippers)
        st_log(ST_LOG_INFO, "repl", "shipping to %zu peer cluster(s) from cluster=%u node=%u",
               r->n_shippers, r->o.cluster_num, r->o.node_num);
    *out = r;
    return ST_OK;
}

void repl_close(repl_ctx *r) {
    if (!r)
        return;
    r->closing = true;
    repl_order_close(r);
    /* Freeing the clients runs every outstanding call's done callback (CANCELLED) while the
     * shippers still exist; then the shippers record their positions and go. */
    for (size_t i = 0; i < r->n_conns; i++)
        if (r->conns[i].client)
            rpc_client_free(r->conns[i].client);
    r->n_conns = 0;
    event_base_loop(r->o.base, EVLOOP_NONBLOCK);
    repl_applied_close(r);
    for (size_t i = 0; i < r->n_shippers; i++)
        repl_shipper_close(r->shippers[i]);
    for (size_t i = 0; i < r->n_names; i++)
        free(r->names[i].table);
    free(r->names);
    repl_retired_free(r);
    free(r);
}

size_t repl_peer_count(const repl_ctx *r) {
    return r->n_shippers;
}

void repl_peer_stats_get(repl_ctx *r, size_t i, repl_peer_stats *out) {
    memset(out, 0, sizeof *out);
    if (i < r->n_shippers)
        repl_shipper_stats(r->shippers[i], out);
}

const st_topology *repl_topology(const repl_ctx *r) {
    return &r->topo;
}

void repl_positions_local(repl_ctx *r, repl_node_positions *out) {
    memset(out, 0, sizeof *out);
    out->node_num = r->o.node_num;
    out->cluster_num = r->o.cluster_num;
    out->last_lsn = sto_log_last_lsn(r->o.db);
    for (size_t i = 0; i < r->n_shippers && i < ST_TOPO_CLUSTERS_MAX; i++) {
        repl_peer_stats st;
        repl_shipper_stats(r->shippers[i], &st);
        out->peer_cluster[out->n_peers] = st.cluster_num;
        out->peer_acked_next[out->n_peers] = st.acked_next_lsn;
        out->peer_acked_commit_us[out->n_peers] = st.acked_commit_us;
        out->n_peers++;
    }
}

st_code repl_register(repl_ctx *r, rpc_server *s, st_err *err) {
    st_code rc = rpc_server_add_method(s, "/strata.internal.v1.Replication/Apply", repl_h_apply, r);
    if (rc == ST_OK)
        rc = rpc_server_add_method(s, PATH_GET_POSITIONS, repl_h_get_positions, r);
    if (rc == ST_OK)
        rc = rpc_server_add_method(s, "/strata.internal.v1.Replication/SetLinks", repl_h_set_links,
                                   r);
    if (rc != ST_OK)
        return st_err_set(err, rc, "registering the replication service failed");
    return ST_OK;
}

/* ---- cut links (strata chaos partition) ---- */

bool repl_link_cut(const repl_ctx *r, uint32_t cluster_num) {
    return cluster_num <= ST_TOPO_CLUSTERS_MAX && r->link_cut[cluster_num];
}

st_code repl_links_set(repl_ctx *r, const uint32_t *cut, size_t n, st_err *err) {
    bool next[ST_TOPO_CLUSTERS_MAX + 1] = {false};
    for (size_t i = 0; i < n; i++) {
        bool peer = false;
        for (size_t s = 0; s < r->n_shippers; s++)
            peer |= repl_shipper_cluster_num(r->shippers[s]) == cut[i];
        if (!peer)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "cluster number %u is not a peer cluster of this node", cut[i]);
        next[cut[i]] = true;
    }
    for (size_t s = 0; s < r->n_shippers; s++) {
        uint32_t num = repl_shipper_cluster_num(r->shippers[s]);
        if (next[num] == r->link_cut[num])
            continue;
        r->link_cut[num] = next[num];
        st_log(ST_LOG_WARN, "repl", "link to peer cluster %u %s", num,
               next[num] ? "cut (strata chaos partition)" : "restored");
        repl_shipper_link_changed(r->shippers[s]);
    }
    return ST_OK;
}

void repl_h_set_links(rpc_call *call, st_slice req_bytes, void *arg) {
    repl_ctx *r = arg;
    st_arena *arena = rpc_call_arena(call);
    st_err err = {0};
    Strata__Internal__V1__SetLinksRequest *req = (void *)btu_pb_unpack(
        &strata__internal__v1__set_links_request__descriptor, NULL, req_bytes, &err);
    if (!req) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, err.msg);
        return;
    }
    uint32_t cut[ST_TOPO_CLUSTERS_MAX];
    size_t n = 0;
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < req->n_cut_cluster_ids; i++) {
        const st_topo_cluster *cl = NULL;
        for (size_t c = 0; c < r->topo.n_clusters && !cl; c++)
            if (strcmp(r->topo.clusters[c].id, req->cut_cluster_ids[i]) == 0)
                cl = &r->topo.clusters[c];
        if (!cl || cl->num == r->o.cluster_num || n == ST_TOPO_CLUSTERS_MAX)
            rc = st_err_set(&err, ST_INVALID_ARGUMENT,
                            "'%s' is not a peer cluster of this node's topology",
                            req->cut_cluster_ids[i]);
        else
            cut[n++] = cl->num;
    }
    strata__internal__v1__set_links_request__free_unpacked(req, NULL);
    if (rc == ST_OK)
        rc = repl_links_set(r, cut, n, &err);
    if (rc != ST_OK) {
        rpc_call_finish(call, rc, err.msg);
        return;
    }
    Strata__Internal__V1__SetLinksResponse resp;
    strata__internal__v1__set_links_response__init(&resp);
    char *ids[ST_TOPO_CLUSTERS_MAX];
    for (size_t c = 0; c < r->topo.n_clusters; c++)
        if (repl_link_cut(r, r->topo.clusters[c].num) &&
            resp.n_cut_cluster_ids < ST_TOPO_CLUSTERS_MAX)
            ids[resp.n_cut_cluster_ids++] = r->topo.clusters[c].id;
    resp.cut_cluster_ids = ids;
    size_t len = strata__internal__v1__set_links_response__get_packed_size(&resp);
    uint8_t *buf = st_arena_alloc(arena, len ? len : 1);
    if (!buf) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    strata__internal__v1__set_links_response__pack(&resp, buf);
    rc = rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, rc, rc == ST_OK ? NULL : "response could not be sent");
}

/* ---- gathering every node's positions ---- */

typedef struct gather {
    repl_ctx *r;
    repl_gather_done_fn done;
    void *arg;
    repl_node_positions nodes[REPL_TOKEN_NODES_MAX];
    size_t n, failed, pending;
    struct event *ev; /* finishes from the loop when nothing is outstanding */
} gather;

static void gather_finish(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    gather *g = arg;
    g->done(g->nodes, g->n, g->failed, g->arg);
    event_free(g->ev);
    free(g);
}

static void positions_from_pb(const Strata__Internal__V1__Positions *p, repl_node_positions *out) {
    memset(out, 0, sizeof *out);
    out->node_num = p->node_num;
    out->cluster_num = p->cluster_num;
    out->last_lsn = p->last_lsn;
    for (size_t i = 0; i < p->n_peers && out->n_peers < ST_TOPO_CLUSTERS_MAX; i++) {
        out->peer_cluster[out->n_peers] = p->peers[i]->cluster_num;
        out->peer_acked_next[out->n_peers] = p->peers[i]->acked_next_lsn;
        out->peer_acked_commit_us[out->n_peers] = p->peers[i]->acked_commit_us;
        out->n_peers++;
    }
}

static void gather_one_done(st_code code, const char *message, st_slice resp, void *arg) {
    gather *g = arg;
    Strata__Internal__V1__Positions *p = NULL;
    if (code == ST_OK)
        p = (void *)btu_pb_unpack(&strata__internal__v1__positions__descriptor, NULL, resp, NULL);
    if (p && g->n < REPL_TOKEN_NODES_MAX)
        positions_from_pb(p, &g->nodes[g->n++]);
    else {
        g->failed++;
        st_log(ST_LOG_DEBUG, "repl", "GetPositions failed code=%s msg=\"%s\"", st_code_name(code),
               message ? message : "");
    }
    if (p)
        strata__internal__v1__positions__free_unpacked(p, NULL);
    if (--g->pending == 0)
        event_active(g->ev, EV_TIMEOUT, 0);
}

st_code repl_positions_gather(repl_ctx *r, int64_t timeout_ms, repl_gather_done_fn done,
                              void *arg) {
    gather *g = calloc(1, sizeof *g);
    if (!g || !(g->ev = event_new(r->o.base, -1, 0, gather_finish, g))) {
        free(g);
        return ST_RESOURCE_EXHAUSTED;
    }
    g->r = r;
    g->done = done;
    g->arg = arg;
    g->pending = 1; /* held until every call started */
    Strata__Internal__V1__GetPositionsRequest req;
    strata__internal__v1__get_positions_request__init(&req);
    uint8_t buf[16];
    size_t len = strata__internal__v1__get_positions_request__pack(&req, buf);
    for (size_t c = 0; c < r->topo.n_clusters; c++) {
        for (size_t i = 0; i < r->topo.clusters[c].n_nodes; i++) {
            const st_topo_node *nd = &r->topo.clusters[c].nodes[i];
            if (nd->num == r->o.node_num && r->topo.clusters[c].num == r->o.cluster_num) {
                repl_positions_local(r, &g->nodes[g->n++]);
                continue;
            }
            rpc_client *cl = repl_conn_get(r, nd->addr, NULL);
            g->pending++;
            if (!cl || rpc_client_unary(cl, PATH_GET_POSITIONS, st_slice_make(buf, len), NULL, 0,
                                        timeout_ms, gather_one_done, g) != ST_OK) {
                g->pending--;
                g->failed++;
            }
        }
    }
    if (--g->pending == 0)
        event_active(g->ev, EV_TIMEOUT, 0);
    return ST_OK;
}
