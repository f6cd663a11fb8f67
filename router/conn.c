/* conn.c — the router's links to its nodes: one rpc_client per node (through the node's Unix
 * socket when it has one on this host, else TCP), replaced with a backoff when it dies, plus
 * one for scans (rtr_node_call_scan) and clients of their own for change streams
 * (rtr_node_call_long); fan-out
 * of calls to many nodes; delayed callbacks; the per-cluster tablet-map refresh (ListTablets on
 * every node), coalesced so a burst of "not owner" answers costs one refresh. */
#include "router_internal.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/internal/v1/node.pb-c.h"

/* ---- clients ---- */

/* Frees the buried clients that have no call left. A client the node sent GOAWAY on is no longer
 * used for new calls but still finishes those the node accepted: it stays buried (looked at
 * again every RTR_DRAIN_CHECK_MS) until they ended. At close everything goes. */
static void graveyard_sweep(rtr_ctx *r, bool all) {
    size_t k = 0;
    for (size_t i = 0; i < r->n_graveyard; i++) {
        rpc_client *c = r->graveyard[i];
        if (all || rpc_client_calls(c) == 0)
            rpc_client_free(c);
        else
            r->graveyard[k++] = c;
    }
    r->n_graveyard = k;
}

static void graveyard_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_ctx *r = arg;
    graveyard_sweep(r, false);
    struct timeval tv = {0, RTR_DRAIN_CHECK_MS * 1000};
    if (r->n_graveyard > 0 && r->graveyard_ev)
        event_add(r->graveyard_ev, &tv);
}

/* A dead client may be the one whose callback we are inside: free it later, from the loop. */
static void bury(rtr_ctx *r, rpc_client *c) {
    if (r->n_graveyard == r->cap_graveyard) {
        size_t cap = r->cap_graveyard ? 2 * r->cap_graveyard : 8;
        rpc_client **g = realloc(r->graveyard, cap * sizeof *g);
        if (!g) {
            st_log(ST_LOG_ERROR, "router", "out of memory: leaking a dead node client");
            return;
        }
        r->graveyard = g;
        r->cap_graveyard = cap;
    }
    r->graveyard[r->n_graveyard++] = c;
    if (!r->graveyard_ev)
        r->graveyard_ev = event_new(r->base, -1, 0, graveyard_cb, r);
    if (r->graveyard_ev)
        event_active(r->graveyard_ev, 0, 0);
}

/* The node's Unix socket, when the router may use it (docs/router.md, "Unix sockets"): the one
 * in the data directory of its topology entry (st_topo_node_sock_path), if that is a socket on
 * this host. A node on another host has no such file here (or no data directory in this
 * router's topology), so it is reached over TCP. */
static bool node_unix_path(const rtr_node *n, char *out, size_t cap) {
    struct stat st;
    return !n->ctx->opts.no_unix &&
           st_topo_node_sock_path(n->cluster->topo->nodes[n->idx].data_dir, out, cap) &&
           stat(out, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* A new client for n: through its Unix socket when there is one, else TCP. After a Unix client
 * that never connected (a socket file left by a node that died, while a restarted one may serve
 * TCP only), one attempt goes over TCP before the socket is tried again. */
static rpc_client *node_dial_via(rtr_node *n, bool via_unix, int32_t window, st_err *err) {
    /* Frequent PINGs while calls are open: a live node then always sends something within about
     * RTR_NODE_KEEPALIVE_MS, which is how health.c tells a silent link from a slow request. */
    struct ssl_ctx_st *tls = n->ctx->opts.node_ssl_ctx;
    /* With mutual TLS the node must prove it is a node of the topology's host. */
    const rpc_client_opts opts = {.keepalive_ms = RTR_NODE_KEEPALIVE_MS,
                                  .ssl_ctx = tls,
                                  .peer_role = tls ? RPC_ROLE_NODE : NULL,
                                  .stream_window_bytes = window};
    char path[RPC_UNIX_PATH_MAX + 1];
    if (!via_unix || !node_unix_path(n, path, sizeof path))
        return rpc_client_new(n->ctx->base, n->host, n->port, &opts, err);
    st_log(ST_LOG_DEBUG, "router", "node=%s via unix:%s", n->addr, path);
    /* A node's socket is plaintext even with mutual TLS: it lives in the node's owner-only
     * data directory, which only this user can enter (docs/security.md, Unix sockets). */
    const rpc_client_opts uopts = {.keepalive_ms = RTR_NODE_KEEPALIVE_MS,
                                   .stream_window_bytes = window};
    return rpc_client_new_unix(n->ctx->base, path, &uopts, err);
}

static rpc_client *node_dial(rtr_node *n, st_err *err) {
    char path[RPC_UNIX_PATH_MAX + 1];
    bool skip = n->unix_skip;
    n->unix_skip = false;
    n->via_unix = !skip && node_unix_path(n, path, sizeof path);
    return node_dial_via(n, n->via_unix, 0, err);
}

/* A live client for node, or NULL while the reconnect backoff runs. */
static rpc_client *node_client(rtr_node *n, st_err *err) {
    rtr_ctx *r = n->ctx;
    if (n->client && rpc_client_alive(n->client)) {
        /* A connection that outlived its backoff window is healthy: the next failure starts the
         * backoff afresh. */
        if (n->backoff_ms && st_mono_us() > n->retry_at_us + n->backoff_ms * 1000)
            n->backoff_ms = 0;
        return n->client;
    }
    int64_t now = st_mono_us();
    if (n->client) {
        n->unix_skip = n->via_unix && !rpc_client_connected(n->client);
        /* The node said GOAWAY (a restart, or too many stream resets): it is up, so the next
         * connection is dialled at once, without a backoff. */
        if (rpc_client_draining(n->client)) {
            n->retry_at_us = now;
            n->backoff_ms = 0;
        }
        if (rpc_client_silent(n->client) && !n->mute_since_us) {
            n->mute_since_us = now;
            st_log(ST_LOG_WARN, "router",
                   "node=%s cluster=%s silent: no answer to a keepalive PING within %d ms; calls "
                   "to it fail at once until it answers again",
                   n->addr, n->cluster->topo->id, RPC_KEEPALIVE_TIMEOUT_MS_DEFAULT);
        }
        bury(r, n->client);
        n->client = NULL;
    }
    if (now < n->retry_at_us) {
        st_err_set(err, ST_UNAVAILABLE, "node %s is unreachable (reconnecting in %lld ms)", n->addr,
                   (long long)((n->retry_at_us - now) / 1000));
        return NULL;
    }
    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RTR_RECONNECT_BACKOFF_MIN_MS;
    if (n->backoff_ms > RTR_RECONNECT_BACKOFF_MAX_MS)
        n->backoff_ms = RTR_RECONNECT_BACKOFF_MAX_MS;
    n->retry_at_us = now + n->backoff_ms * 1000;
    n->client = node_dial(n, err);
    n->conn_id++;
    if (!n->client)
        st_err_prefix(err, "node %s: ", n->addr);
    return n->client;
}

/* True (err set) while the node is mute: its last connection went silent, and the one dialled
 * since (c, NULL during the reconnect backoff) has received nothing. A frozen process (SIGSTOP, a
 * hung host) keeps its listening socket, so a new connection is accepted by the kernel and a call
 * sent on it waited for another keepalive timeout; a request retried inside a single-cluster
 * profile thus waited tens of seconds before its UNAVAILABLE. Its calls are refused instead, and
 * the idle connection stays open (no calls, no PINGs): the node's first frame on it (the SETTINGS
 * every HTTP/2 server sends at once) lifts the refusal when the node answers again. */
static bool node_mute(rtr_node *n, const rpc_client *c, st_err *err) {
    if (!n->mute_since_us)
        return false;
    int64_t now = st_mono_us();
    if (c && rpc_client_last_read_us(c) > 0) {
        st_log(ST_LOG_INFO, "router", "node=%s answers again after %lld ms silent", n->addr,
               (long long)((now - n->mute_since_us) / 1000));
        n->mute_since_us = 0;
        return false;
    }
    st_err_set(err, ST_UNAVAILABLE,
               "node %s of cluster %s went silent %lld ms ago (no answer to a keepalive PING "
               "within %d ms: a frozen or overloaded process, or a network partition) and has "
               "not answered since; requests to its rows fail at once until it answers again: "
               "retry later, or restart the node",
               n->addr, n->cluster->topo->id, (long long)((now - n->mute_since_us) / 1000),
               RPC_KEEPALIVE_TIMEOUT_MS_DEFAULT);
    return true;
}

/* A long-call client of node with room for one more call: the first such live one, else a new
 * one (the same transport as the regular client, which is live: the node is reachable). Its
 * streams have a smaller window (RTR_CS_STREAM_WINDOW_BYTES): a change stream paused for a slow
 * client lets its node send only that much more, and a router relays many of them. */
static rpc_client *node_long_client(rtr_node *n, st_err *err) {
    size_t k = 0;
    for (size_t i = 0; i < n->n_long; i++) { /* dead ones go: their calls already ended */
        rpc_client *c = n->long_clients[i];
        if (rpc_client_alive(c))
            n->long_clients[k++] = c;
        else
            bury(n->ctx, c);
    }
    n->n_long = k;
    for (size_t i = 0; i < n->n_long; i++)
        if (rpc_client_calls(n->long_clients[i]) < RTR_LONG_CALLS_PER_CLIENT)
            return n->long_clients[i];
    if (n->n_long == RTR_LONG_CLIENTS_MAX) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED,
                   "this router already relays %d change streams from node %s: close some, or "
                   "read through another router",
                   RTR_LONG_CLIENTS_MAX * RTR_LONG_CALLS_PER_CLIENT, n->addr);
        return NULL;
    }
    rpc_client *c = node_dial_via(n, n->via_unix, RTR_CS_STREAM_WINDOW_BYTES, err);
    if (!c)
        st_err_prefix(err, "node %s: ", n->addr);
    else
        n->long_clients[n->n_long++] = c;
    return c;
}

/* The scan client of node, dialled anew (same transport as the regular client, which is live)
 * when it died. */
static rpc_client *node_scan_client(rtr_node *n, st_err *err) {
    if (n->scan_client && rpc_client_alive(n->scan_client))
        return n->scan_client;
    if (n->scan_client)
        bury(n->ctx, n->scan_client);
    n->scan_client = node_dial_via(n, n->via_unix, 0, err);
    n->scan_conn_id++;
    if (!n->scan_client)
        st_err_prefix(err, "node %s: ", n->addr);
    return n->scan_client;
}

typedef enum { CALL_REGULAR, CALL_LONG, CALL_SCAN } call_kind;

/* Starts a call on node's regular client, or on a long-call or the scan client (which need the
 * regular one too: reachability and the reconnect backoff). */
static rpc_ccall *node_call(rtr_node *node, call_kind kind, const char *path, st_slice req,
                            const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                            rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg,
                            st_err *err) {
    if (node->ctx->closing) {
        st_err_set(err, ST_UNAVAILABLE, "the router is shutting down");
        return NULL;
    }
    rpc_client *c = node_client(node, err);
    if (node_mute(node, c, err))
        return NULL;
    if (c && kind == CALL_LONG)
        c = node_long_client(node, err);
    else if (c && kind == CALL_SCAN)
        c = node_scan_client(node, err);
    if (!c)
        return NULL;
    rpc_ccall *call = rpc_client_call(c, path, req, md, md_count, timeout_ms, on_msg, on_done, arg);
    if (!call)
        st_err_set(err, ST_UNAVAILABLE, "node %s: could not start %s", node->addr, path);
    return call;
}

rpc_ccall *rtr_node_call(rtr_node *node, const char *path, st_slice req, const rpc_metadata *md,
                         size_t md_count, int64_t timeout_ms, rpc_ccall_msg_fn on_msg,
                         rpc_ccall_done_fn on_done, void *arg, st_err *err) {
    return node_call(node, CALL_REGULAR, path, req, md, md_count, timeout_ms, on_msg, on_done, arg,
                     err);
}

rpc_ccall *rtr_node_call_scan(rtr_node *node, const char *path, st_slice req,
                              const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                              rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg,
                              uint64_t *conn_id, st_err *err) {
    rpc_ccall *call =
        node_call(node, CALL_SCAN, path, req, md, md_count, timeout_ms, on_msg, on_done, arg, err);
    /* Apart from the regular connections' ids in rtr_qod_drop_id's 40 bits. */
    *conn_id = node->scan_conn_id | (uint64_t)1 << 39;
    return call;
}

size_t rtr_node_lost_beside(const rtr_node *node) {
    const rpc_client *c = node->client;
    if (!c)
        return 0;
    return rpc_client_alive(c) || rpc_client_draining(c) ? rpc_client_calls(c) : rpc_client_lost(c);
}

rpc_ccall *rtr_node_call_long(rtr_node *node, const char *path, st_slice req,
                              const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                              rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg,
                              st_err *err) {
    return node_call(node, CALL_LONG, path, req, md, md_count, timeout_ms, on_msg, on_done, arg,
                     err);
}

rtr_call_fate rtr_call_fate_of(const rpc_ccall *call, st_code code) {
    if (code != ST_UNAVAILABLE || !rpc_ccall_unprocessed(call))
        return RTR_CALL_SENT;
    return rpc_ccall_connected(call) ? RTR_CALL_REFUSED : RTR_CALL_UNREACHED;
}

void rtr_node_disconnect_all(rtr_ctx *r) {
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++) {
            rtr_node *n = &r->clusters[c].nodes[i];
            if (n->client)
                rpc_client_free(n->client); /* runs outstanding done callbacks (CANCELLED) */
            n->client = NULL;
            if (n->scan_client)
                rpc_client_free(n->scan_client);
            n->scan_client = NULL;
            for (size_t k = 0; k < n->n_long; k++)
                rpc_client_free(n->long_clients[k]);
            n->n_long = 0;
        }
    graveyard_sweep(r, true);
    if (r->graveyard_ev)
        event_free(r->graveyard_ev);
    r->graveyard_ev = NULL;
    free(r->graveyard);
    r->graveyard = NULL;
    r->cap_graveyard = 0;
}

/* ---- fan-out ---- */

typedef struct fan_slot {
    rtr_fan *f;
    size_t i;
} fan_slot;

rtr_node *rtr_node_at(rtr_ctx *r, size_t k) {
    for (size_t c = 0; c < r->n_clusters; c++) {
        if (k < r->clusters[c].n_nodes)
            return &r->clusters[c].nodes[k];
        k -= r->clusters[c].n_nodes;
    }
    return NULL;
}

rtr_fan *rtr_fan_new(rtr_ctx *r, size_t n, int64_t timeout_ms, rtr_fan_done_fn done, void *arg) {
    rtr_fan *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->res = calloc(n ? n : 1, sizeof *f->res);
    if (!f->res) {
        free(f);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        f->res[i].code = ST_CANCELLED; /* a slot never called reads as cancelled */
        st_buf_init(&f->res[i].msgs);
    }
    f->ctx = r;
    f->n = n;
    f->timeout_ms = timeout_ms;
    f->done = done;
    f->arg = arg;
    return f;
}

static void fan_check(rtr_fan *f) {
    if (f->sealed && f->pending == 0)
        f->done(f, f->arg);
}

static void fan_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    fan_slot *s = arg;
    rtr_fan_res *res = &s->f->res[s->i];
    if (st_buf_append_varint64(&res->msgs, msg.len) != ST_OK ||
        st_buf_append(&res->msgs, msg.data, msg.len) != ST_OK) {
        res->code = ST_RESOURCE_EXHAUSTED;
        rpc_ccall_cancel(call);
    }
}

static void fan_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    fan_slot *s = arg;
    rtr_fan *f = s->f;
    rtr_fan_res *res = &f->res[s->i];
    free(s);
    res->unsent = code != ST_OK && rtr_call_fate_of(call, code) != RTR_CALL_SENT;
    if (res->code != ST_RESOURCE_EXHAUSTED)
        res->code = code;
    if (code != ST_OK)
        st_err_set(&res->err, code, "%s", message ? message : "");
    f->pending--;
    fan_check(f);
}

void rtr_fan_call(rtr_fan *f, size_t i, rtr_node *node, const char *path, st_slice req) {
    rtr_fan_res *res = &f->res[i];
    fan_slot *s = malloc(sizeof *s);
    res->node = node;
    res->code = ST_OK;
    if (!s) {
        res->code = st_err_set(&res->err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *s = (fan_slot){f, i};
    f->pending++;
    if (!rtr_node_call(node, path, req, NULL, 0, f->timeout_ms, fan_msg, fan_done, s, &res->err)) {
        res->code = res->err.code ? res->err.code : ST_UNAVAILABLE;
        res->unsent = true;
        f->pending--;
        free(s);
    }
}

void rtr_fan_seal(rtr_fan *f) {
    f->sealed = true;
    fan_check(f);
}

void rtr_fan_free(rtr_fan *f) {
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        st_buf_free(&f->res[i].msgs);
    free(f->res);
    free(f);
}

bool rtr_fan_next_msg(const rtr_fan_res *res, size_t *off, st_slice *msg) {
    const uint8_t *p = res->msgs.data + *off, *end = res->msgs.data + res->msgs.len;
    if (p >= end || !st_get_len_prefixed(&p, end, msg))
        return false;
    *off = (size_t)(p - res->msgs.data);
    return true;
}

st_code rtr_fan_first_error(const rtr_fan *f, st_err *err) {
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].code != ST_OK) {
            if (err)
                *err = f->res[i].err;
            if (err)
                err->code = f->res[i].code;
            return f->res[i].code;
        }
    return ST_OK;
}

/* ---- delayed callbacks ---- */

struct rtr_later {
    rtr_ctx *ctx;
    rtr_later *prev, *next;
    struct event *ev;
    void (*fn)(void *arg);
    void *arg;
};

static void later_unlink(rtr_later *l) {
    rtr_ctx *r = l->ctx;
    if (l->prev)
        l->prev->next = l->next;
    else
        r->later = l->next;
    if (l->next)
        l->next->prev = l->prev;
}

static void later_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_later *l = arg;
    later_unlink(l);
    void (*fn)(void *) = l->fn;
    void *a = l->arg;
    event_free(l->ev);
    free(l);
    fn(a);
}

st_code rtr_later_add(rtr_ctx *r, int64_t delay_ms, void (*fn)(void *arg), void *arg) {
    rtr_later *l = calloc(1, sizeof *l);
    if (!l)
        return ST_RESOURCE_EXHAUSTED;
    l->ctx = r;
    l->fn = fn;
    l->arg = arg;
    l->ev = evtimer_new(r->base, later_cb, l);
    struct timeval tv = {(time_t)(delay_ms / 1000), (suseconds_t)((delay_ms % 1000) * 1000)};
    if (!l->ev || evtimer_add(l->ev, &tv) != 0) {
        if (l->ev)
            event_free(l->ev);
        free(l);
        return ST_RESOURCE_EXHAUSTED;
    }
    l->next = r->later;
    if (r->later)
        r->later->prev = l;
    r->later = l;
    return ST_OK;
}

void rtr_later_flush(rtr_ctx *r) {
    while (r->later)
        later_cb(-1, 0, r->later);
}

/* ---- tablet-map refresh ---- */

static st_code refresh_start(rtr_cluster *c);

/* Runs the waiters the finished refresh served. Those that asked while it was in flight get the
 * next one: its nodes may have answered before what they wait to see (a move that started, a
 * drop that ended), and a map older than their question would tell them what they knew. */
static void refresh_waiters_run(rtr_cluster *c) {
    size_t n = c->n_served;
    rtr_waiter *w = n ? malloc(n * sizeof *w) : NULL;
    if (n && !w) { /* no memory to split the list: serve everyone with this map */
        n = c->n_waiters;
        w = c->waiters;
        c->waiters = NULL;
        c->n_waiters = c->cap_waiters = 0;
    } else if (n) {
        memcpy(w, c->waiters, n * sizeof *w);
        memmove(c->waiters, c->waiters + n, (c->n_waiters - n) * sizeof *w);
        c->n_waiters -= n;
    }
    c->n_served = 0;
    for (size_t i = 0; i < n; i++)
        w[i].fn(w[i].arg);
    free(w);
    if (!c->refreshing && c->n_waiters > 0 && refresh_start(c) != ST_OK) {
        c->n_served = c->n_waiters; /* no refresh: serve them with this map */
        refresh_waiters_run(c);
    }
}

/* True for the target's copy of the range the balancer is moving in this cluster: partial until
 * the move answers, so it must not win over the source, even over a report of the source taken
 * before the source marked it moving (docs/cluster.md: no writes to the target before the move
 * has answered). */
static bool is_move_target(const rtr_cluster *c, uint32_t node,
                           const Strata__Internal__V1__Tablet *t) {
    const rtr_bal_cluster *b = &c->bal;
    return b->moving && node == b->target && !t->moving && strcmp(t->table_name, b->table) == 0 &&
           st_slice_eq(st_slice_make(t->start_key.data, t->start_key.len), st_buf_slice(&b->start));
}

/* Adds the tablets of one ListTablets answer to in[] (grown as needed). */
static bool collect_tablets(const rtr_cluster *c, const rtr_fan_res *res, uint32_t node,
                            rtr_tablet_in **in, size_t *n, size_t *cap,
                            Strata__Internal__V1__ListTabletsResponse **keep) {
    size_t off = 0;
    st_slice msg;
    if (!rtr_fan_next_msg(res, &off, &msg))
        return false;
    Strata__Internal__V1__ListTabletsResponse *m = (void *)btu_pb_unpack(
        &strata__internal__v1__list_tablets_response__descriptor, NULL, msg, NULL);
    if (!m)
        return false;
    *keep = m;
    for (size_t i = 0; i < m->n_tablets; i++) {
        if (m->tablets[i]->incoming)
            continue; /* a move's copy, partial until its source activates it */
        if (*n == *cap) {
            size_t nc = *cap ? 2 * *cap : 64;
            rtr_tablet_in *v = nc <= RTR_TABLETS_MAX ? realloc(*in, nc * sizeof *v) : NULL;
            if (!v)
                return false;
            *in = v;
            *cap = nc;
        }
        const Strata__Internal__V1__Tablet *t = m->tablets[i];
        (*in)[(*n)++] = (rtr_tablet_in){t->table_name,
                                        st_slice_make(t->start_key.data, t->start_key.len),
                                        st_slice_make(t->end_key.data, t->end_key.len),
                                        t->id,
                                        node,
                                        t->read_only || is_move_target(c, node, t),
                                        t->moving,
                                        false};
    }
    return true;
}

/* Tablets of unreachable nodes stay in the map (they most likely still own them, and requests
 * then fail with UNAVAILABLE instead of "no tablet"), unless a reachable node reports them. */
static bool keep_old(const rtr_cluster *c, const rtr_fan *f, rtr_tablet_in **in, size_t *n,
                     size_t *cap) {
    const rtr_tmap *old = c->map;
    for (size_t t = 0; old && t < old->n_tables; t++)
        for (size_t i = 0; i < old->tables[t].n; i++) {
            const rtr_tablet *tb = &old->tables[t].v[i];
            if (f->res[tb->node].code == ST_OK)
                continue;
            if (*n == *cap) {
                size_t nc = *cap ? 2 * *cap : 64;
                rtr_tablet_in *v = nc <= RTR_TABLETS_MAX ? realloc(*in, nc * sizeof *v) : NULL;
                if (!v)
                    return false;
                *in = v;
                *cap = nc;
            }
            /* read_only marks them as second choice against fresh reports. */
            (*in)[(*n)++] = (rtr_tablet_in){
                old->tables[t].name, tb->start, tb->end, tb->id, tb->node, true, false, true};
        }
    return true;
}

/* The creation times of every node's tables into v (NULL: only counted): from its answer
 * (keep[i]), or, for a node that did not answer, as the old map had them. Returns how many. */
static size_t created_of(const rtr_cluster *c, const rtr_fan *f,
                         Strata__Internal__V1__ListTabletsResponse *const *keep,
                         rtr_table_created *v) {
    size_t n = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (f->res[i].code == ST_OK) {
            for (size_t j = 0; keep[i] && j < keep[i]->n_tables; j++, n++)
                if (v)
                    v[n] = (rtr_table_created){keep[i]->tables[j]->name, (uint32_t)i,
                                               keep[i]->tables[j]->created_us};
            continue;
        }
        for (size_t j = 0; c->map && j < c->map->n_created; j++) {
            if (c->map->created[j].node != i)
                continue;
            if (v)
                v[n] = c->map->created[j];
            n++;
        }
    }
    return n;
}

/* Sets the tables' creation times in m (rtr_tmap_set_created); false when memory runs out. */
static bool collect_created(const rtr_cluster *c, const rtr_fan *f,
                            Strata__Internal__V1__ListTabletsResponse *const *keep, rtr_tmap *m) {
    size_t n = created_of(c, f, keep, NULL);
    rtr_table_created *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return false;
    created_of(c, f, keep, v);
    bool ok = rtr_tmap_set_created(m, v, n);
    free(v);
    return ok;
}

static void refresh_done(rtr_fan *f, void *arg) {
    rtr_cluster *c = arg;
    rtr_tablet_in *in = NULL;
    size_t n = 0, cap = 0, ok_nodes = 0;
    Strata__Internal__V1__ListTabletsResponse *keep[ST_TOPO_NODES_MAX] = {0};
    bool ok = true;
    for (size_t i = 0; i < f->n && ok; i++) {
        if (f->res[i].code != ST_OK)
            continue;
        ok = collect_tablets(c, &f->res[i], (uint32_t)i, &in, &n, &cap, &keep[i]);
        ok_nodes++;
    }
    ok = ok && keep_old(c, f, &in, &n, &cap);
    rtr_tmap *m = ok ? rtr_tmap_build(in, n) : NULL;
    if (m && !collect_created(c, f, keep, m)) {
        rtr_tmap_free(m);
        m = NULL;
    }
    if (m) {
        rtr_tmap_free(c->map);
        c->map = m;
    } else if (ok_nodes > 0) {
        st_log(ST_LOG_ERROR, "router", "cluster=%s could not build its tablet map", c->topo->id);
    }
    c->map_gen++;
    for (size_t i = 0; i < ST_TOPO_NODES_MAX; i++)
        if (keep[i])
            strata__internal__v1__list_tablets_response__free_unpacked(keep[i], NULL);
    free(in);
    c->refreshing = NULL;
    rtr_fan_free(f);
    refresh_waiters_run(c);
}

static st_code add_waiter(rtr_cluster *c, void (*fn)(void *arg), void *arg) {
    if (c->n_waiters == c->cap_waiters) {
        size_t cap = c->cap_waiters ? 2 * c->cap_waiters : 16;
        rtr_waiter *w = cap <= RTR_WAITERS_MAX ? realloc(c->waiters, cap * sizeof *w) : NULL;
        if (!w)
            return ST_RESOURCE_EXHAUSTED;
        c->waiters = w;
        c->cap_waiters = cap;
    }
    c->waiters[c->n_waiters++] = (rtr_waiter){fn, arg};
    return ST_OK;
}

/* Sends ListTablets to every node of c for the waiters registered so far. */
static st_code refresh_start(rtr_cluster *c) {
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    uint8_t buf[8];
    size_t len = strata__internal__v1__list_tablets_request__pack(&req, buf);
    rtr_fan *f = rtr_fan_new(c->ctx, c->n_nodes, RTR_ADMIN_TIMEOUT_MS, refresh_done, c);
    if (!f)
        return ST_RESOURCE_EXHAUSTED;
    c->refreshing = f;
    c->n_served = c->n_waiters;
    for (size_t i = 0; i < c->n_nodes; i++)
        rtr_fan_call(f, i, &c->nodes[i], RTR_NODE "ListTablets", st_slice_make(buf, len));
    rtr_fan_seal(f);
    return ST_OK;
}

st_code rtr_cluster_refresh(rtr_cluster *c, void (*fn)(void *arg), void *arg) {
    if (add_waiter(c, fn, arg) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (c->refreshing)
        return ST_OK; /* served by the next refresh (refresh_waiters_run) */
    if (refresh_start(c) != ST_OK) {
        c->n_waiters--;
        return ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

typedef struct all_state {
    size_t pending;
    void (*fn)(void *arg);
    void *arg;
} all_state;

static void all_one(void *arg) {
    all_state *s = arg;
    if (--s->pending > 0)
        return;
    void (*fn)(void *) = s->fn;
    void *a = s->arg;
    free(s);
    fn(a);
}

st_code rtr_refresh_all(rtr_ctx *r, void (*fn)(void *arg), void *arg) {
    all_state *s = malloc(sizeof *s);
    if (!s)
        return ST_RESOURCE_EXHAUSTED;
    *s = (all_state){r->n_clusters + 1, fn, arg};
    for (size_t i = 0; i < r->n_clusters; i++)
        if (rtr_cluster_refresh(&r->clusters[i], all_one, s) != ST_OK)
            s->pending--;
    all_one(s); /* the +1 guard: fn runs once, after every cluster answered */
    return ST_OK;
}
