/* health.c — which clusters are healthy. Every probe period (500 ms) the router sends
 * strata.internal.v1.Node/GetStatus to every node with a short deadline, over the same
 * connection its requests use (so a probe also redials a node whose connection died). A node is
 * down after one failed probe, or as soon as a request part fails on it with UNAVAILABLE or
 * DEADLINE_EXCEEDED (the data path reports it); it is up again after RTR_PROBE_UP_ROUNDS
 * consecutive good probes, so a flapping node does not pull traffic back and forth. A cluster is
 * healthy while all its nodes are up: nodes hold disjoint tablets, so a cluster missing one
 * cannot serve that node's rows, and a multi-cluster request is better served whole elsewhere. */
#include "failover.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static rtr_health_node *hnode(rtr_fo *fo, const rtr_node *n) {
    return &fo->nodes[n->cluster->idx][n->idx];
}

/* Multi-cluster parts waiting on the cluster go to their next cluster now: a silent node would
 * otherwise hold them until their own attempt deadline. move only cancels their node call (its
 * done callback runs later, from the loop), so the list stays as it is here. */
static void cluster_move_parts(const rtr_cluster *c) {
    for (rtr_inflight *f = c->inflight; f; f = f->next)
        f->move(f);
}

/* Recomputes a cluster's verdict and logs a change. */
static void cluster_update(rtr_fo *fo, const rtr_cluster *c, const char *why) {
    bool up = true;
    for (size_t i = 0; i < c->n_nodes; i++)
        up = up && !fo->nodes[c->idx][i].down;
    rtr_health_cluster *hc = &fo->clusters[c->idx];
    if (up == hc->up)
        return;
    hc->up = up;
    hc->changes++;
    if (!up)
        cluster_move_parts(c);
    st_log(up ? ST_LOG_INFO : ST_LOG_WARN, "router", "cluster=%s health=%s%s%s", c->topo->id,
           up ? "up" : "down", why ? " why=" : "", why ? why : "");
}

static void node_down(rtr_fo *fo, const rtr_node *n, const char *why) {
    rtr_health_node *h = hnode(fo, n);
    h->failures++;
    h->good = 0;
    if (h->down)
        return;
    h->down = true;
    h->down_since_us = st_mono_us();
    st_log(ST_LOG_DEBUG, "router", "node=%s down why=%s", n->addr, why);
    char *msg = fo->clusters[n->cluster->idx].why; /* the latest reason, for errors */
    snprintf(msg, sizeof fo->clusters[0].why, "node %s: %s", n->addr, why);
    cluster_update(fo, n->cluster, msg);
}

static void node_good(rtr_fo *fo, const rtr_node *n) {
    rtr_health_node *h = hnode(fo, n);
    if (!h->down || ++h->good < RTR_PROBE_UP_ROUNDS)
        return;
    h->down = false;
    h->good = 0;
    st_log(ST_LOG_DEBUG, "router", "node=%s up after_ms=%lld", n->addr,
           (long long)((st_mono_us() - h->down_since_us) / 1000));
    cluster_update(fo, n->cluster, NULL);
    rtr_leftover_kick(n->ctx); /* it may hold tables deleted while it was down */
}

/* True while the node's connection is up and has received bytes within the probe deadline: a
 * call that timed out there waited behind the node's other work (a busy node, many streams on
 * the connection), which is no reason to move traffic away. A silent connection is detected by
 * the rpc client's keepalive PINGs instead. */
static bool link_answering(const rpc_client *c) {
    return c && rpc_client_alive(c) &&
           rpc_client_last_read_us(c) > st_mono_us() - RTR_PROBE_TIMEOUT_MS * 1000;
}

/* Either connection: a scan times out on the scan connection. */
static bool node_answering(const rtr_node *n) {
    return link_answering(n->client) || link_answering(n->scan_client);
}

void rtr_health_report(rtr_node *n, st_code code) {
    rtr_fo *fo = n->ctx->fo;
    if (!fo || n->ctx->closing || !rtr_fo_error(code))
        return;
    if (code == ST_DEADLINE_EXCEEDED && node_answering(n))
        return;
    node_down(fo, n, code == ST_UNAVAILABLE ? "request unavailable" : "request deadline");
}

void rtr_inflight_link(rtr_cluster *c, rtr_inflight *f) {
    rtr_inflight_unlink(f);
    f->on = c;
    f->prev = NULL;
    f->next = c->inflight;
    if (c->inflight)
        c->inflight->prev = f;
    c->inflight = f;
}

void rtr_inflight_unlink(rtr_inflight *f) {
    if (!f->on)
        return;
    if (f->prev)
        f->prev->next = f->next;
    else
        f->on->inflight = f->next;
    if (f->next)
        f->next->prev = f->prev;
    f->on = NULL;
    f->prev = f->next = NULL;
}

bool rtr_health_cluster_up(const rtr_ctx *r, size_t cluster) {
    return !r->fo || r->fo->clusters[cluster].up;
}

bool rtr_health_cluster_silent(const rtr_ctx *r, size_t cluster) {
    return r->fo && r->fo->clusters[cluster].silent > 0;
}

bool rtr_health_cluster_dark(const rtr_ctx *r, size_t cluster) {
    if (!r->fo)
        return false;
    for (size_t i = 0; i < r->clusters[cluster].n_nodes; i++)
        if (!r->fo->nodes[cluster][i].down)
            return false;
    return true;
}

bool rtr_health_cluster_refuses(const rtr_ctx *r, size_t cluster) {
    if (!r->fo)
        return false;
    for (size_t i = 0; i < r->clusters[cluster].n_nodes; i++) {
        const rtr_health_node *h = &r->fo->nodes[cluster][i];
        if (!h->down || h->good > 0)
            return false;
    }
    return true;
}

const char *rtr_health_cluster_why(const rtr_ctx *r, size_t cluster) {
    return r->fo ? r->fo->clusters[cluster].why : "";
}

st_code rtr_cluster_unreachable(const rtr_cluster *c, const st_err *last, st_err *err) {
    char why[sizeof last->msg]; /* last may be err itself */
    snprintf(why, sizeof why, "%s", last && last->msg[0] ? last->msg : "none");
    if (strstr(why, " has no reachable node; ")) /* said already (rtr_plan_gate_check) */
        return st_err_set(err, ST_UNAVAILABLE, "%s", why);
    return st_err_set(err, ST_UNAVAILABLE,
                      "cluster %s has no reachable node; its %zu node(s) are down or unreachable "
                      "(last error: %s). Requests routed to it fail at once until one of its "
                      "nodes answers again: retry later, or serve them from another cluster with "
                      "a multi-cluster app profile or by repointing this profile (strata "
                      "failover PROFILE CLUSTER)",
                      c->topo->id, c->n_nodes, why);
}

st_code rtr_table_not_in_cluster(const rtr_cluster *c, const char *table, st_err *err) {
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "table %s has no tablets in cluster %s (a cluster added after the table "
                      "was created holds none): use an app profile routed to a cluster that "
                      "serves the table",
                      table, c->topo->id);
}

rtr_unserved_act rtr_unserved_check(const rtr_plan *p, const rtr_cluster *c, const char *table,
                                    const char *what, int64_t now_us, rtr_unserved *u,
                                    st_err *err) {
    st_err_set(err, ST_FAILED_PRECONDITION,
               "no node of cluster %s serves %s of table %s: a node of %s most likely came back "
               "without its data (an emptied or replaced disk). Route this app profile to "
               "another cluster (strata failover PROFILE CLUSTER) or use a multi-cluster app "
               "profile, and restore that node's data directory; `strata status` names the table",
               c->topo->id, what, table, c->topo->id);
    /* The rows are unsent: nothing of this part can still apply here (no write fence). */
    if (p->multi && p->cur + 1 < p->n)
        return RTR_UNSERVED_MOVE;
    if (u->since_us == 0 || u->cluster != c->idx) {
        *u = (rtr_unserved){
            .since_us = now_us > 0 ? now_us : 1, .gen = c->map_gen, .cluster = c->idx};
        return RTR_UNSERVED_WAIT;
    }
    /* A move's hole lasts one refresh: lost rows are still missing from a later map. */
    if (c->map_gen == u->gen || now_us - u->since_us < (int64_t)RTR_UNSERVED_GRACE_MS * 1000)
        return RTR_UNSERVED_WAIT;
    return RTR_UNSERVED_END;
}

/* ---- probes ---- */

static void probe_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)message;
    rtr_node *n = arg;
    rtr_ctx *r = n->ctx;
    if (r->closing || !r->fo)
        return;
    hnode(r->fo, n)->probing = false;
    /* Any answer, even an error status, means the node is there and serving. A probe that timed
     * out behind busy streams on a connection still receiving says neither. */
    if (code == ST_DEADLINE_EXCEEDED && node_answering(n))
        return;
    if (rtr_call_fate_of(call, code) == RTR_CALL_REFUSED)
        return; /* refused by the node's GOAWAY: the next probe goes on a new connection */
    if (code == ST_UNAVAILABLE || code == ST_DEADLINE_EXCEEDED || code == ST_CANCELLED)
        node_down(r->fo, n, code == ST_UNAVAILABLE ? "probe unavailable" : "probe timeout");
    else
        node_good(r->fo, n);
}

static void probe_node(rtr_fo *fo, rtr_node *n) {
    rtr_health_node *h = hnode(fo, n);
    if (h->probing)
        return; /* the previous one is still out: its deadline decides */
    st_err err = {0};
    /* GetStatusRequest is empty: zero bytes. */
    if (rtr_node_call(n, RTR_NODE "GetStatus", st_slice_make("", 0), NULL, 0, RTR_PROBE_TIMEOUT_MS,
                      NULL, probe_done, n, &err))
        h->probing = true;
    else
        node_down(fo, n, "unreachable"); /* refused, or in its reconnect backoff */
}

static void probe_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_fo *fo = arg;
    rtr_ctx *r = fo->ctx;
    if (r->closing)
        return;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            probe_node(fo, &r->clusters[c].nodes[i]);
}

/* Whether c is a live connection with calls open; *heard then lowered to its last read. */
static bool link_busy(const rpc_client *c, int64_t *heard) {
    if (!c || !rpc_client_alive(c) || rpc_client_calls(c) == 0)
        return false;
    int64_t at = rpc_client_last_read_us(c);
    if (at < *heard)
        *heard = at;
    return true;
}

/* ---- silent links ----
 * The probes need their 1 s deadline to tell a dead node from a busy one; a request waiting on a
 * link that went silent (a partition dropping packets, a frozen process) needs to know sooner.
 * Node connections PING every RTR_NODE_KEEPALIVE_MS while calls are open (conn.c), so a live
 * node always sends something within about that, however long its requests take: nothing for
 * RTR_SILENT_MS with calls open means the link is silent. The node's health is left to the
 * probes (a hiccup of half a second must not refuse single-cluster requests); only multi-cluster
 * parts move, and are placed after healthy clusters, until the link receives again. The regular
 * and the scan connection count alike (a node with only scans open goes silent too): the one
 * that received last the longest ago decides. */
static void silence_check(rtr_fo *fo, rtr_node *n, int64_t now) {
    rtr_health_node *h = hnode(fo, n);
    int64_t heard = INT64_MAX;
    bool busy = link_busy(n->client, &heard);
    busy |= link_busy(n->scan_client, &heard);
    if (!busy)
        h->busy_since_us = 0;
    else if (!h->busy_since_us)
        h->busy_since_us = now;
    if (!busy)
        heard = 0;
    if (heard < h->busy_since_us)
        heard = h->busy_since_us;
    bool silent = busy && now - heard >= (int64_t)RTR_SILENT_MS * 1000;
    if (silent == h->silent)
        return;
    h->silent = silent;
    rtr_health_cluster *hc = &fo->clusters[n->cluster->idx];
    if (!silent) {
        hc->silent--;
        st_log(ST_LOG_DEBUG, "router", "node=%s link no longer silent", n->addr);
        return;
    }
    hc->silent++;
    /* Once the probes have the node down, each redial that hangs goes silent again: say it once. */
    st_log(h->down ? ST_LOG_DEBUG : ST_LOG_INFO, "router",
           "node=%s silent: calls open and nothing received for %d ms; multi-cluster requests "
           "move to other clusters",
           n->addr, RTR_SILENT_MS);
    cluster_move_parts(n->cluster);
}

static void silence_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_fo *fo = arg;
    rtr_ctx *r = fo->ctx;
    if (r->closing)
        return;
    int64_t now = st_mono_us();
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            silence_check(fo, &r->clusters[c].nodes[i], now);
}

static struct event *timer_start(rtr_ctx *r, int64_t ms, event_callback_fn fn, void *arg) {
    struct event *ev = event_new(r->base, -1, EV_PERSIST, fn, arg);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    if (ev && event_add(ev, &tv) != 0) {
        event_free(ev);
        ev = NULL;
    }
    return ev;
}

st_code rtr_health_start(rtr_ctx *r, st_err *err) {
    rtr_fo *fo = calloc(1, sizeof *fo);
    if (!fo)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    fo->ctx = r;
    fo->probe_ms = r->opts.probe_ms > 0 ? r->opts.probe_ms : RTR_PROBE_MS_DEFAULT;
    for (size_t c = 0; c < r->n_clusters; c++)
        fo->clusters[c].up = true;
    fo->timer = timer_start(r, fo->probe_ms, probe_tick, fo);
    fo->silence_timer = timer_start(r, RTR_SILENCE_TICK_MS, silence_tick, fo);
    if (!fo->timer || !fo->silence_timer) {
        if (fo->timer)
            event_free(fo->timer);
        if (fo->silence_timer)
            event_free(fo->silence_timer);
        free(fo);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the health probes");
    }
    r->fo = fo;
    return ST_OK;
}

void rtr_health_stop(rtr_ctx *r) {
    if (!r->fo)
        return;
    if (r->fo->timer)
        event_free(r->fo->timer);
    if (r->fo->silence_timer)
        event_free(r->fo->silence_timer);
    st_log(ST_LOG_DEBUG, "router", "health stopped failovers=%llu",
           (unsigned long long)r->fo->failovers);
    free(r->fo);
    r->fo = NULL;
}
