/* failover.h — multi-cluster routing with failover, and cluster health (private to router/).
 *
 * Modules: health.c (periodic probes of every node, request failures reported by the data path,
 * the per-cluster verdict "healthy"), failover.c (the candidate list of a request — its "plan" —,
 * row affinity, per-attempt deadlines, and the SetCell timestamp rewrite that makes writes
 * idempotent before they are first forwarded). data.c and read.c follow a plan: on a
 * connection failure, UNAVAILABLE or a per-attempt DEADLINE_EXCEEDED they move the request to
 * the next cluster of the plan. See docs/router.md, "Failover". */
#ifndef ROUTER_FAILOVER_H
#define ROUTER_FAILOVER_H

#include "instance.h"
#include "router_internal.h"

#define RTR_PROBE_MS_DEFAULT 500  /* health probe period (rtr_opts.probe_ms overrides) */
#define RTR_PROBE_TIMEOUT_MS 1000 /* one probe (GetStatus); slower counts as a failure */
#define RTR_PROBE_UP_ROUNDS 2     /* consecutive good probes that bring a node back */
#define RTR_FO_ATTEMPT_MS 5000    /* unary attempt, ReadRows silence: another cluster remains */

/* ---- health.c ---- */
/* Per-node health as the router sees it. A node is down after a failed probe or a request that
 * failed on it with UNAVAILABLE / DEADLINE_EXCEEDED (connection refused, reset, lost, or no
 * answer in time), and up again after RTR_PROBE_UP_ROUNDS consecutive good probes. */
typedef struct rtr_health_node {
    bool down;
    int good;              /* consecutive good probes while down */
    bool probing;          /* a probe is in flight */
    uint64_t failures;     /* probe and request failures, for logs */
    int64_t down_since_us; /* st_mono_us */
} rtr_health_node;

typedef struct rtr_health_cluster {
    bool up;          /* the verdict, updated after every probe and every reported failure */
    uint64_t changes; /* verdict changes, for logs and tests */
} rtr_health_cluster;

/* The module's state, rtr_ctx.fo. */
typedef struct rtr_fo {
    rtr_ctx *ctx;
    struct event *timer;
    int64_t probe_ms;
    rtr_health_cluster clusters[ST_TOPO_CLUSTERS_MAX];
    rtr_health_node nodes[ST_TOPO_CLUSTERS_MAX][ST_TOPO_NODES_MAX];
    int64_t ts_last_us; /* last timestamp assigned to a write (never decreases) */
    uint64_t failovers; /* requests moved to another cluster, for logs */
} rtr_fo;

/* Starts the probes (every probe_ms, rtr_opts.probe_ms or RTR_PROBE_MS_DEFAULT); every node
 * starts up. RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_health_start(rtr_ctx *r, st_err *err);
void rtr_health_stop(rtr_ctx *r); /* frees rtr_ctx.fo; safe when never started */
/* A request part failed on node with code: UNAVAILABLE and DEADLINE_EXCEEDED count against the
 * node (its cluster turns unhealthy at once); other codes are the request's business. */
void rtr_health_report(rtr_node *n, st_code code);
/* The cluster's verdict: every node of the cluster is up (a cluster missing a node cannot serve
 * that node's rows: nodes hold disjoint tablets). Without health state (unit tests, before start)
 * every cluster is healthy. */
bool rtr_health_cluster_up(const rtr_ctx *r, size_t cluster);

/* ---- failover.c: ordering (pure) ---- */
/* One cluster as the ordering sees it. */
typedef struct rtr_fo_in {
    const char *id;
    bool near;    /* in the router's zone (rtr_opts.zone) */
    bool healthy; /* rtr_cluster_healthy */
} rtr_fo_in;

/* Preference order of the clusters a multi-cluster policy allows (its cluster_ids, none = all),
 * health left aside: with row affinity and a row key, by a rendezvous hash of (row, cluster id),
 * so each row has one first-choice cluster and only the rows of a cluster that fails move;
 * otherwise nearest first (same zone as the router), then topology order. Writes cluster indexes
 * into out (capacity n) and returns how many. */
size_t rtr_fo_prefer(const rtr_fo_in *in, size_t n, const rtr_policy *pol, st_slice row,
                     size_t *out);
/* Healthy clusters first, preference order kept within each group (stable): pref[0..n) into
 * out[0..n). */
void rtr_fo_healthy_first(const rtr_fo_in *in, const size_t *pref, size_t n, size_t *out);

/* ---- failover.c: plans ---- */
/* The clusters a request may use, in the order it tries them. Single-cluster profiles have one
 * (multi false): they never fail over by themselves. */
typedef struct rtr_plan {
    bool multi;
    size_t pref[ST_TOPO_CLUSTERS_MAX];  /* preference order (fixed for the request) */
    size_t order[ST_TOPO_CLUSTERS_MAX]; /* pref with the healthy ones first, as of (re)start */
    size_t n;
    size_t cur; /* index into order of the cluster being tried */
} rtr_plan;

/* Plans a request of app_profile_id ("" = default). row: the row key of a single-row request
 * (row affinity), or an empty slice. NOT_FOUND for an unknown profile; FAILED_PRECONDITION when
 * transactional is set and the profile forbids single-row transactions (always on multi-cluster
 * profiles) or when the profile names no cluster of the topology. */
st_code rtr_route_plan(rtr_ctx *r, const char *app_profile_id, bool transactional, st_slice row,
                       rtr_plan *out, st_err *err);
rtr_cluster *rtr_plan_cluster(rtr_ctx *r, const rtr_plan *p);
/* Moves a multi-cluster plan to its next cluster; false (plan unchanged) when none is left or
 * the plan is single-cluster. Logs and counts the move. */
bool rtr_plan_next(rtr_ctx *r, rtr_plan *p, st_code why);
/* Back to the first cluster, healthy ones first as of now (after a backoff, once every
 * candidate failed). */
void rtr_plan_restart(rtr_ctx *r, rtr_plan *p);
/* True for the failures that move a multi-cluster request to the next cluster: UNAVAILABLE
 * (connection refused, reset or lost; node shutting down) and DEADLINE_EXCEEDED. */
bool rtr_fo_error(st_code code);
/* Deadline of one unary attempt: timeout_ms, but when another cluster remains in a multi-cluster
 * plan at most RTR_FO_ATTEMPT_MS and at most half of it, so the next cluster has time too. */
int64_t rtr_plan_attempt_ms(const rtr_plan *p, int64_t timeout_ms);

/* ---- failover.c: idempotent writes ---- */
/* The timestamp the router gives a write's SetCells with timestamp_micros -1: wall clock in
 * microseconds at millisecond granularity, never below the previous one. */
int64_t rtr_fo_write_ts(rtr_ctx *r);
/* Rewrites a MutateRowRequest (rows false) or MutateRowsRequest (rows true): every SetCell whose
 * timestamp_micros is -1 gets ts_us instead; everything else is copied verbatim. *n_stamped (may
 * be NULL) receives how many SetCells changed. INVALID_ARGUMENT for a malformed request,
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_stamp_mutations(st_slice req, bool rows, int64_t ts_us, st_buf *out, size_t *n_stamped);

#endif
