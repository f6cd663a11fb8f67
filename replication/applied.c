/* applied.c — the applied bound of change-stream tokens (docs/changestreams.md, Failover).
 *
 * A token names a time W of the cluster that issued it (a stamp: when a change entered that
 * cluster). Read on another cluster, W alone could skip writes that cluster applied before W
 * but the issuing one had not applied yet. The issuing node therefore also writes a bound Y
 * into its tokens: every write committed by another cluster at or before Y had been applied
 * here with a stamp at or below W. The reader on another cluster starts at Y.
 *
 * Where Y comes from: each node's shipper knows up to which commit time the peer cluster holds
 * all of its writes (repl_peer_stats.acked_commit_us, GetPositions' acked_commit_us: the peer
 * acknowledges a row once it is durable there). While someone asks for the bound, this node
 * asks every node of every peer cluster for its positions every REPL_APPLIED_POLL_MS; when all
 * answered, Y = the smallest acked_commit_us towards this cluster, and every write it covers
 * was durable here before the answer, so its stamp is at or below this node's resolved stamp
 * at that moment: the pair (resolved, Y) holds from then on. Pairs are kept in a ring (a new
 * one only when Y grew), and the bound for a position W is the Y of the latest pair whose
 * resolved stamp is at or below W. A peer node that does not answer (down, cut off) stops new
 * pairs: the bound stays where it was, since that node's writes may be missing here.
 * Loop thread only. */
#include "repl_internal.h"

#include <stdlib.h>
#include <string.h>

#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

#define PATH_GET_POSITIONS "/strata.internal.v1.Replication/GetPositions"

static void applied_poll(evutil_socket_t fd, short what, void *arg);

static void applied_schedule(repl_ctx *r, uint32_t delay_ms) {
    repl_applied *a = &r->applied;
    if (!a->ev && !(a->ev = evtimer_new(r->o.base, applied_poll, r))) {
        a->polling = false;
        return;
    }
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    evtimer_add(a->ev, &tv);
    a->polling = true;
}

/* Adds the pair (stamp, y) when it says more than the last one (Y grew). */
static void applied_add(repl_applied *a, int64_t stamp, int64_t y) {
    if (!a->pairs && !(a->pairs = calloc(REPL_APPLIED_PAIRS_MAX, sizeof *a->pairs)))
        return;
    if (a->n) {
        repl_applied_pair *last = &a->pairs[(a->head + a->n - 1) % REPL_APPLIED_PAIRS_MAX];
        if (y <= last->y)
            return;
        if (stamp <= last->stamp) { /* same resolved stamp: the larger bound replaces it */
            last->y = y;
            return;
        }
    }
    if (a->n == REPL_APPLIED_PAIRS_MAX) {
        a->head = (a->head + 1) % REPL_APPLIED_PAIRS_MAX;
        a->n--;
    }
    a->pairs[(a->head + a->n++) % REPL_APPLIED_PAIRS_MAX] = (repl_applied_pair){stamp, y};
}

static void applied_round_done(repl_ctx *r) {
    repl_applied *a = &r->applied;
    if (r->closing)
        return;
    if (!a->failed && r->ops.cs_resolved)
        applied_add(a, r->ops.cs_resolved(r->o.node), a->y);
    if (st_mono_us() - a->want_mono_us < (int64_t)REPL_APPLIED_IDLE_MS * 1000)
        applied_schedule(r, REPL_APPLIED_POLL_MS);
    else
        a->polling = false; /* nobody reads change streams here: the next ask starts again */
}

/* This node's cluster's entry in a peer node's positions: its acknowledged commit time. */
static void applied_one_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    repl_ctx *r = arg;
    repl_applied *a = &r->applied;
    Strata__Internal__V1__Positions *p = NULL;
    if (code == ST_OK)
        p = (void *)btu_pb_unpack(&strata__internal__v1__positions__descriptor, NULL, resp, NULL);
    bool found = false;
    for (size_t i = 0; p && i < p->n_peers && !found; i++) {
        if (p->peers[i]->cluster_num != r->o.cluster_num)
            continue;
        found = true;
        if (p->peers[i]->acked_commit_us < a->y)
            a->y = p->peers[i]->acked_commit_us;
    }
    a->failed = a->failed || !found;
    if (p)
        strata__internal__v1__positions__free_unpacked(p, NULL);
    if (--a->pending == 0)
        applied_round_done(r);
}

/* One round: GetPositions to every node of every peer cluster. */
static void applied_poll(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_ctx *r = arg;
    repl_applied *a = &r->applied;
    if (r->closing)
        return;
    a->y = INT64_MAX;
    a->failed = false;
    a->pending = 1; /* held until every call started */
    Strata__Internal__V1__GetPositionsRequest req;
    strata__internal__v1__get_positions_request__init(&req);
    uint8_t buf[16];
    size_t len = strata__internal__v1__get_positions_request__pack(&req, buf);
    for (size_t c = 0; c < r->topo.n_clusters; c++) {
        const st_topo_cluster *cl = &r->topo.clusters[c];
        for (size_t i = 0; cl->num != r->o.cluster_num && i < cl->n_nodes; i++) {
            rpc_client *client = repl_conn_get(r, cl->nodes[i].addr, NULL);
            a->pending++;
            if (!client ||
                rpc_client_unary(client, PATH_GET_POSITIONS, st_slice_make(buf, len), NULL, 0,
                                 REPL_APPLIED_TIMEOUT_MS, applied_one_done, r) != ST_OK) {
                a->pending--;
                a->failed = true;
            }
        }
    }
    if (--a->pending == 0)
        applied_round_done(r);
}

int64_t repl_applied_bound(repl_ctx *r, int64_t w) {
    if (!r || r->n_shippers == 0)
        return INT64_MAX;
    repl_applied *a = &r->applied;
    a->want_mono_us = st_mono_us();
    if (!a->polling && !r->closing)
        applied_schedule(r, 0);
    /* The latest pair at or below w (stamps increase along the ring). */
    size_t lo = 0, hi = a->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->pairs[(a->head + mid) % REPL_APPLIED_PAIRS_MAX].stamp <= w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == 0 ? 0 : a->pairs[(a->head + lo - 1) % REPL_APPLIED_PAIRS_MAX].y;
}

void repl_applied_close(repl_ctx *r) {
    if (r->applied.ev)
        event_free(r->applied.ev);
    free(r->applied.pairs);
    memset(&r->applied, 0, sizeof r->applied);
}
