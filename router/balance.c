/* balance.c — the tablet balancer. Nodes split tablets that pass the size threshold, and both
 * halves stay where the parent was (docs/cluster.md); spreading them is the router's job. Every
 * rtr_opts.balance_ms (2 s by default), per cluster, the balancer asks every node for its tablets
 * (ListTablets) and, when the node with the most tablets of the instance's tables holds at least
 * two more than the node with the fewest, asks it to MoveTablet one of them to that node: from
 * the table spread worst between the two, its smallest tablet (the newest on ties — small tablets
 * are mostly fresh split halves, cheap to copy). One move per cluster at a time; when a move
 * finishes the tablet map is refreshed and the next look follows at once, so a node that split
 * into many tablets is evened out move after move.
 *
 * Only one router of an instance balances (by default the first [router] of the topology):
 * two balancers would undo each other's moves. A cluster where a node did not answer, or where a
 * tablet is already moving (another router's move, or one whose call this router gave up on), is
 * left alone until the next look. The metadata table stays on the first node of each cluster.
 *
 * Requests during a move: the source refuses writes (strata-not-owner) and keeps serving reads;
 * the tablet map prefers the source (the `moving` flag of ListTablets, and for this router's own
 * move the hint in rtr_bal_cluster), and writes are retried (RTR_RETRIES_NOT_OWNER_MAX, about 30 s
 * of backoff) until the source has dropped the tablet and the map names the target. */
#include "router_internal.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "strata/internal/v1/node.pb-c.h"

#define BAL_RETRY_STALE_MS 100 /* next look after a move named a tablet that split meanwhile */

typedef Strata__Internal__V1__Tablet pb_tablet;
typedef Strata__Internal__V1__ListTabletsResponse pb_list;

static void bal_check(rtr_cluster *c);

static void bal_idle(rtr_cluster *c) {
    c->bal.busy = false;
    c->bal.moving = false;
}

static void bal_check_later(void *arg) {
    rtr_cluster *c = arg;
    if (!c->ctx->closing)
        bal_check(c);
}

/* ---- the choice (pure) ---- */

static int tab_cmp(const void *a, const void *b) {
    const rtr_bal_tablet *const *x = a, *const *y = b;
    return strcmp((*x)->table, (*y)->table);
}

/* Better candidate: smaller, then newer (a higher id from the same node is a later tablet). */
static bool better(const rtr_bal_tablet *a, const rtr_bal_tablet *b) {
    if (!b)
        return true;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes;
    return a->id > b->id;
}

/* Over the runs of one table in v (sorted by table): the table with the largest src-dst
 * difference that has a movable tablet on src, and its best tablet. */
static const rtr_bal_tablet *pick_in_runs(const rtr_bal_tablet *const *v, size_t n, uint32_t src) {
    const rtr_bal_tablet *pick = NULL;
    long pick_diff = 0;
    for (size_t i = 0, j; i < n; i = j) {
        long diff = 0;
        const rtr_bal_tablet *best = NULL;
        for (j = i; j < n && strcmp(v[j]->table, v[i]->table) == 0; j++) {
            bool on_src = v[j]->node == src;
            diff += on_src ? 1 : -1;
            if (on_src && !v[j]->read_only && better(v[j], best))
                best = v[j];
        }
        if (best && (!pick || diff > pick_diff || (diff == pick_diff && better(best, pick)))) {
            pick = best;
            pick_diff = diff;
        }
    }
    return pick;
}

size_t rtr_bal_choose(const rtr_bal_tablet *v, size_t n, size_t n_nodes, uint32_t *dst) {
    size_t count[ST_TOPO_NODES_MAX] = {0};
    if (n_nodes < 2 || n_nodes > ST_TOPO_NODES_MAX)
        return SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (v[i].moving)
            return SIZE_MAX; /* one move per cluster, whoever started it */
        if (v[i].node < n_nodes)
            count[v[i].node]++;
    }
    uint32_t src = 0, lo = 0;
    for (uint32_t i = 1; i < n_nodes; i++) {
        if (count[i] > count[src])
            src = i;
        if (count[i] < count[lo])
            lo = i;
    }
    if (count[src] < count[lo] + 2)
        return SIZE_MAX;
    size_t k = 0;
    const rtr_bal_tablet **pair = malloc((count[src] + count[lo] + 1) * sizeof *pair);
    if (!pair)
        return SIZE_MAX;
    for (size_t i = 0; i < n; i++)
        if (v[i].node == src || v[i].node == lo)
            pair[k++] = &v[i];
    qsort(pair, k, sizeof *pair, tab_cmp);
    const rtr_bal_tablet *pick = pick_in_runs(pair, k, src);
    free(pair);
    *dst = lo;
    return pick ? (size_t)(pick - v) : SIZE_MAX;
}

/* Tablets the balancer counts and may move: of tables the instance knows, not internal. */
static bool balanced_table(const rtr_ctx *r, const char *table) {
    return strncmp(table, RTR_INTERNAL_TABLE_PREFIX, strlen(RTR_INTERNAL_TABLE_PREFIX)) != 0 &&
           rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, table) != NULL;
}

typedef struct bal_pick {
    const pb_tablet *t; /* NULL: nothing to move */
    uint32_t src, dst;
} bal_pick;

/* Decides the move of one cluster from every node's ListTablets answer. */
static void bal_decide(const rtr_cluster *c, pb_list *const *lists, bal_pick *p) {
    *p = (bal_pick){0};
    size_t total = 0, n = 0;
    for (size_t i = 0; i < c->n_nodes; i++)
        total += lists[i]->n_tablets;
    rtr_bal_tablet *v = malloc((total + 1) * sizeof *v);
    const pb_tablet **src = malloc((total + 1) * sizeof *src);
    bool moving = false;
    for (size_t i = 0; v && src && i < c->n_nodes; i++)
        for (size_t k = 0; k < lists[i]->n_tablets; k++) {
            const pb_tablet *t = lists[i]->tablets[k];
            moving = moving || t->moving; /* a move of any table, the metadata's too */
            if (balanced_table(c->ctx, t->table_name) && !t->incoming) {
                src[n] = t;
                v[n++] = (rtr_bal_tablet){t->table_name, t->id,        t->approx_bytes,
                                          (uint32_t)i,   t->read_only, t->moving};
            }
        }
    uint32_t dst = 0;
    size_t k = v && src && !moving ? rtr_bal_choose(v, n, c->n_nodes, &dst) : SIZE_MAX;
    if (k != SIZE_MAX)
        *p = (bal_pick){src[k], v[k].node, dst};
    free(v);
    free(src);
}

/* ---- the move ---- */

static void bal_refreshed(void *arg) {
    rtr_cluster *c = arg;
    bal_idle(c);
    if (!c->ctx->closing)
        bal_check(c); /* the next move follows at once while the cluster is uneven */
}

static void bal_move_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    rtr_cluster *c = arg;
    rtr_ctx *r = c->ctx;
    rtr_bal_cluster *b = &c->bal;
    if (r->closing) {
        bal_idle(c);
        return;
    }
    long long ms = (long long)((st_mono_us() - b->started_us) / 1000);
    b->moving = false; /* the target's copy is complete (or gone): the map may take it */
    if (code == ST_OK) {
        r->bal_moves++;
        st_log(ST_LOG_INFO, "balance",
               "cluster=%s table=%s tablet=%" PRIu64 " bytes=%" PRIu64 " %s -> %s in %lld ms "
               "(moves=%" PRIu64 ")",
               c->topo->id, b->table, b->id, b->bytes, c->nodes[b->source].addr,
               c->nodes[b->target].addr, ms, r->bal_moves);
        if (rtr_cluster_refresh(c, bal_refreshed, c) != ST_OK)
            bal_idle(c);
        return;
    }
    r->bal_failed++;
    /* A tablet that split or was dropped after the look is no fault: look again soon. */
    bool stale = code == ST_NOT_FOUND;
    st_log(stale ? ST_LOG_INFO : ST_LOG_WARN, "balance",
           "cluster=%s table=%s tablet=%" PRIu64 " %s -> %s not moved after %lld ms: %s: %s",
           c->topo->id, b->table, b->id, c->nodes[b->source].addr, c->nodes[b->target].addr, ms,
           st_code_name(code), message ? message : "");
    bal_idle(c);
    if (stale && rtr_later_add(r, BAL_RETRY_STALE_MS, bal_check_later, c) != ST_OK)
        st_log(ST_LOG_WARN, "balance", "out of memory: next look at the next period");
}

static void bal_move_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    (void)msg; /* the target's Tablet: the map refresh learns it */
    (void)arg;
}

/* Starts MoveTablet of p->t; false when it could not start. */
static bool bal_move(rtr_cluster *c, const bal_pick *p) {
    rtr_bal_cluster *b = &c->bal;
    Strata__Internal__V1__MoveTabletRequest req;
    strata__internal__v1__move_tablet_request__init(&req);
    req.id = p->t->id;
    req.target = c->nodes[p->dst].addr;
    uint8_t buf[32 + ST_TOPO_ADDR_MAX];
    size_t len = strata__internal__v1__move_tablet_request__pack(&req, buf);
    st_buf_reset(&b->start);
    if (st_buf_append(&b->start, p->t->start_key.data, p->t->start_key.len) != ST_OK)
        return false;
    snprintf(b->table, sizeof b->table, "%s", p->t->table_name);
    b->id = p->t->id;
    b->bytes = p->t->approx_bytes;
    b->source = p->src;
    b->target = p->dst;
    b->started_us = st_mono_us();
    b->moving = true; /* before the call: a refresh racing with it already sees the hint */
    st_err err = {0};
    if (!rtr_node_call(&c->nodes[p->src], RTR_NODE "MoveTablet", st_slice_make(buf, len), NULL, 0,
                       RTR_MOVE_TIMEOUT_MS, bal_move_msg, bal_move_done, c, &err)) {
        st_log(ST_LOG_WARN, "balance", "cluster=%s could not start a move: %s", c->topo->id,
               err.msg);
        b->moving = false;
        return false;
    }
    return true;
}

/* ---- the look ---- */

static void bal_listed(rtr_fan *f, void *arg) {
    rtr_cluster *c = arg;
    pb_list *lists[ST_TOPO_NODES_MAX] = {0};
    bool ok = !c->ctx->closing && rtr_fan_first_error(f, NULL) == ST_OK;
    for (size_t i = 0; ok && i < f->n; i++) {
        size_t off = 0;
        st_slice msg;
        ok = rtr_fan_next_msg(&f->res[i], &off, &msg) &&
             (lists[i] =
                  (void *)btu_pb_unpack(&strata__internal__v1__list_tablets_response__descriptor,
                                        NULL, msg, NULL)) != NULL;
    }
    bal_pick p = {0};
    if (ok)
        bal_decide(c, lists, &p);
    if (!p.t || !bal_move(c, &p))
        bal_idle(c);
    for (size_t i = 0; i < f->n; i++)
        if (lists[i])
            strata__internal__v1__list_tablets_response__free_unpacked(lists[i], NULL);
    rtr_fan_free(f);
}

static void bal_check(rtr_cluster *c) {
    if (c->bal.busy || c->n_nodes < 2 || c->ctx->closing)
        return;
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    uint8_t buf[8];
    size_t len = strata__internal__v1__list_tablets_request__pack(&req, buf);
    rtr_fan *f = rtr_fan_new(c->ctx, c->n_nodes, RTR_ADMIN_TIMEOUT_MS, bal_listed, c);
    if (!f)
        return;
    c->bal.busy = true;
    for (size_t i = 0; i < c->n_nodes; i++)
        rtr_fan_call(f, i, &c->nodes[i], RTR_NODE "ListTablets", st_slice_make(buf, len));
    rtr_fan_seal(f);
}

static void bal_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_ctx *r = arg;
    for (size_t i = 0; i < r->n_clusters; i++)
        bal_check(&r->clusters[i]);
}

/* ---- start / stop ---- */

/* True when this router listens on the topology's first [router] address (or there is none). */
static bool first_router(const rtr_ctx *r) {
    if (r->topo.n_routers == 0)
        return true;
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    if (!st_addr_split(r->topo.routers[0], host, sizeof host, &port))
        return false;
    return port == r->port && strcmp(host, r->listen_host) == 0;
}

st_code rtr_balance_start(rtr_ctx *r, st_err *err) {
    r->balance_ms = r->opts.balance_ms > 0 ? r->opts.balance_ms : RTR_BALANCE_MS_DEFAULT;
    r->balancing = r->opts.balance == RTR_BALANCE_ON ||
                   (r->opts.balance == RTR_BALANCE_AUTO && first_router(r));
    if (!r->balancing) {
        st_log(ST_LOG_INFO, "balance", "tablet balancer off here (%s)",
               r->opts.balance == RTR_BALANCE_OFF ? "asked" : "not the topology's first router");
        return ST_OK;
    }
    struct timeval tv = {(time_t)(r->balance_ms / 1000),
                         (suseconds_t)((r->balance_ms % 1000) * 1000)};
    r->bal_timer = event_new(r->base, -1, EV_PERSIST, bal_tick, r);
    if (!r->bal_timer || event_add(r->bal_timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the balancer timer");
    st_log(ST_LOG_INFO, "balance", "tablet balancer on, every %lld ms", (long long)r->balance_ms);
    return ST_OK;
}

void rtr_balance_stop(rtr_ctx *r) {
    if (r->bal_timer)
        event_free(r->bal_timer);
    r->bal_timer = NULL;
}
