/* failover.h — multi-cluster routing with failover, and cluster health (private to router/).
 *
 * Modules: health.c (periodic probes of every node, request failures reported by the data path,
 * the per-cluster verdict "healthy"), failover.c (the candidate list of a request — its "plan" —,
 * row affinity, per-attempt deadlines, and the SetCell timestamp rewrite that makes writes
 * idempotent before they are first forwarded). data.c and read.c follow a plan: on a
 * connection failure, UNAVAILABLE, a per-attempt DEADLINE_EXCEEDED or a damaged replica
 * (DATA_LOSS) they move the request to the next cluster of the plan. See docs/router.md,
 * "Failover". */
#ifndef ROUTER_FAILOVER_H
#define ROUTER_FAILOVER_H

#include "instance.h"
#include "router_internal.h"

#define RTR_PROBE_MS_DEFAULT 500  /* health probe period (rtr_opts.probe_ms overrides) */
#define RTR_PROBE_TIMEOUT_MS 1000 /* one probe (GetStatus); slower counts as a failure */
#define RTR_PROBE_UP_ROUNDS 2     /* consecutive good probes that bring a node back */
#define RTR_FO_ATTEMPT_MS 5000    /* unary attempt, ReadRows silence: another cluster remains */
/* Silent links (health.c): node connections PING every RTR_NODE_KEEPALIVE_MS
 * (router_internal.h) while calls are open, so a live node always sends something within about
 * that; a connection with calls open that received nothing for RTR_SILENT_MS (looked at every
 * RTR_SILENCE_TICK_MS) is silent, and multi-cluster request parts leave its cluster at once. */
#define RTR_SILENT_MS 500
#define RTR_SILENCE_TICK_MS 100
/* Query-of-death guard (failover.c, docs/router.md "Queries of death"). */
#define RTR_QOD_SUSPECTS_MAX 256        /* requests remembered after a connection drop */
#define RTR_QOD_REPEAT_REFUSE_MS 600000 /* refused after a second drop under it */
#define RTR_QOD_FORGET_MS 600000        /* a suspect with one drop is forgotten after this */

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
    int64_t busy_since_us; /* first silence tick that saw calls open on its link (0: none) */
    bool silent;           /* calls open, nothing received for RTR_SILENT_MS */
} rtr_health_node;

typedef struct rtr_health_cluster {
    bool up;          /* the verdict, updated after every probe and every reported failure */
    uint64_t changes; /* verdict changes, for logs and tests */
    char why[ST_TOPO_ADDR_MAX + 64]; /* why it last turned unhealthy, for errors */
    size_t silent;                   /* nodes whose link is silent (rtr_health_node.silent) */
} rtr_health_cluster;

/* A request that was in flight when a node connection dropped (failover.c). */
typedef struct rtr_qod_suspect {
    uint64_t fp;                     /* rtr_qod_fingerprint; 0: free slot */
    uint32_t drops;                  /* connection drops it was alone in */
    uint32_t crowd;                  /* connection drops it was in with other calls */
    uint64_t last_drop;              /* rtr_qod_drop_id of the last drop counted */
    int64_t last_us;                 /* st_mono_us of the last drop */
    int64_t refuse_until;            /* st_mono_us; 0: not refused */
    char node[ST_TOPO_ADDR_MAX + 1]; /* the node of the last drop, for the message */
} rtr_qod_suspect;

/* The module's state, rtr_ctx.fo. */
typedef struct rtr_fo {
    rtr_ctx *ctx;
    struct event *timer;
    struct event *silence_timer; /* every RTR_SILENCE_TICK_MS */
    int64_t probe_ms;
    rtr_health_cluster clusters[ST_TOPO_CLUSTERS_MAX];
    rtr_health_node nodes[ST_TOPO_CLUSTERS_MAX][ST_TOPO_NODES_MAX];
    int64_t ts_last_us; /* last timestamp assigned to a write (never decreases) */
    uint64_t failovers; /* requests moved to another cluster, for logs */
    rtr_qod_suspect qod[RTR_QOD_SUSPECTS_MAX];
    size_t qod_live; /* slots of qod in use */
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
/* True while a node of the cluster has a silent link (calls open, nothing received for
 * RTR_SILENT_MS): multi-cluster plans put the cluster after the healthy ones, and the parts
 * already waiting there were moved on. False without health state. */
bool rtr_health_cluster_silent(const rtr_ctx *r, size_t cluster);
/* True when no node of the cluster is up: each failed its last probe or a request part
 * (killed, unreachable). A request to such a cluster that failed with UNAVAILABLE is not retried
 * further: the client gets rtr_cluster_unreachable at once. False without health state. */
bool rtr_health_cluster_dark(const rtr_ctx *r, size_t cluster);
/* True when requests are not even sent to the cluster: every node is down and none has
 * answered a probe since (a killed, frozen or cut-off cluster). Sending would only wait for the
 * connection's keepalive to give up (a frozen process still accepts connections): the request
 * fails at once instead, or a multi-cluster one moves on. The first good probe of any node lifts
 * it, so a cluster that comes back is served again within a probe period. False without health
 * state. */
bool rtr_health_cluster_refuses(const rtr_ctx *r, size_t cluster);
/* Why the cluster last turned unhealthy ("node HOST:PORT: probe timeout"), "" when unknown. */
const char *rtr_health_cluster_why(const rtr_ctx *r, size_t cluster);
/* Sets err to UNAVAILABLE "cluster X has no reachable node; ..." with last's reason. */
st_code rtr_cluster_unreachable(const rtr_cluster *c, const st_err *last, st_err *err);
/* Sets err to FAILED_PRECONDITION: table has no tablets in cluster c (a cluster added after the
 * table was created holds none). */
st_code rtr_table_not_in_cluster(const rtr_cluster *c, const char *table, st_err *err);

/* Links f into c's in-flight list (unlinking it from another first) / unlinks it (no-op when
 * not linked). When a cluster turns unhealthy, every part linked there is moved at once. */
void rtr_inflight_link(rtr_cluster *c, rtr_inflight *f);
void rtr_inflight_unlink(rtr_inflight *f);

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

/* What a data request does to the table, for the profile's rules. */
typedef enum rtr_access {
    RTR_ACCESS_READ = 0, /* ReadRows, SampleRowKeys, change streams */
    RTR_ACCESS_WRITE,    /* MutateRow, MutateRows */
    RTR_ACCESS_TXN,      /* CheckAndMutateRow, ReadModifyWriteRow: single-row transactions */
} rtr_access;

/* Plans a request of app_profile_id ("" = default). row: the row key of a single-row request
 * (row affinity), or an empty slice. NOT_FOUND for an unknown profile; FAILED_PRECONDITION when
 * the request writes (RTR_ACCESS_WRITE, RTR_ACCESS_TXN) through a Data Boost profile (read-only),
 * when it is a transaction and the profile forbids single-row transactions (always on
 * multi-cluster profiles), or when the profile names no cluster of the topology. */
st_code rtr_route_plan(rtr_ctx *r, const char *app_profile_id, rtr_access access, st_slice row,
                       rtr_plan *out, st_err *err);
rtr_cluster *rtr_plan_cluster(rtr_ctx *r, const rtr_plan *p);
/* Moves a multi-cluster plan to its next cluster; false (plan unchanged) when none is left or
 * the plan is single-cluster. Logs and counts the move. */
bool rtr_plan_next(rtr_ctx *r, rtr_plan *p, st_code why);
/* True when no cluster of the plan has a reachable node (rtr_health_cluster_dark): retrying an
 * UNAVAILABLE request is pointless, the client is told at once. */
bool rtr_plan_dark(const rtr_ctx *r, const rtr_plan *p);
/* Checked before a request part is sent on the plan's current cluster. */
typedef enum rtr_plan_gate {
    RTR_GATE_GO,    /* send on rtr_plan_cluster (the plan may have moved past refusing ones) */
    RTR_GATE_RETRY, /* the last cluster refuses but others of the plan may not: err set
                       (UNAVAILABLE); fail the attempt unsent, as when a call cannot start */
    RTR_GATE_END,   /* every cluster of the plan refuses: end the request with err */
} rtr_plan_gate;
/* A cluster that refuses (rtr_health_cluster_refuses) is not sent to: a multi-cluster plan moves
 * past it; when none is left err gets UNAVAILABLE "cluster X has no reachable node; ...". */
rtr_plan_gate rtr_plan_gate_check(rtr_ctx *r, rtr_plan *p, st_err *err);
/* Sets err to UNAVAILABLE for a request whose plan has no reachable cluster: for a multi-cluster
 * plan "no cluster of this multi-cluster app profile (east, west) has a reachable node; ...",
 * else rtr_cluster_unreachable of the plan's cluster c. */
st_code rtr_plan_unreachable(const rtr_ctx *r, const rtr_plan *p, const rtr_cluster *c,
                             const st_err *last, st_err *err);
/* Back to the first cluster, healthy ones first as of now (after a backoff, once every
 * candidate failed). */
void rtr_plan_restart(rtr_ctx *r, rtr_plan *p);
/* True for the failures that move a multi-cluster request to the next cluster: UNAVAILABLE
 * (connection refused, reset or lost; node shutting down) and DEADLINE_EXCEEDED. */
bool rtr_fo_error(st_code code);
/* True when a multi-cluster plan moves a part that failed with code on to its next cluster
 * although the node stays up: DATA_LOSS, the node's answer for a tablet whose stored data is
 * damaged (a read that met a bad block, a write refused by the tablet that went read-only).
 * That replica stays broken until an operator repairs it; the other clusters hold their own.
 * Not a health verdict (the node serves its other tablets), and for a write not an open
 * outcome: the tablet refuses before the write takes its versions. False for single-cluster
 * plans and on the plan's last cluster, whose error goes to the client. */
bool rtr_plan_moves_off_replica(const rtr_plan *p, st_code code);
/* Deadline of one unary attempt: timeout_ms, but when another cluster remains in a multi-cluster
 * plan at most RTR_FO_ATTEMPT_MS and at most half of it, so the next cluster has time too. */
int64_t rtr_plan_attempt_ms(const rtr_plan *p, int64_t timeout_ms);

/* ---- health.c: rows no node of a cluster serves ----
 * The cluster's tablet map has no tablet for them while it has others of the table (a node came
 * back with an empty data directory, or a refresh fell between the two ends of a tablet move). A
 * request part meeting such rows asks rtr_unserved_check what to do. A move leaves such a hole for
 * one map refresh at most, so a hole seen again after a refresh and RTR_UNSERVED_GRACE_MS is taken
 * for lost data. */
#define RTR_UNSERVED_GRACE_MS 500
typedef struct rtr_unserved {
    int64_t since_us; /* st_mono_us of the first sighting in cluster; 0: none */
    uint64_t gen;     /* the cluster's map_gen then */
    size_t cluster;
} rtr_unserved;
typedef enum rtr_unserved_act {
    RTR_UNSERVED_MOVE, /* multi-cluster: move the part on to the plan's next cluster, unsent */
    RTR_UNSERVED_WAIT, /* retry as usual (backoff, map refresh): a move may be ending */
    RTR_UNSERVED_END,  /* end the request with err: the rows are lost to this cluster */
} rtr_unserved_act;
/* A part of a request on plan p, in its current cluster c, found rows of table (what: "this
 * row", "some rows") without a tablet at now_us (st_mono_us). u is the part's own record, zeroed
 * at its start. err gets FAILED_PRECONDITION naming the cluster and what to do; it is also the
 * error to end with when the retries run out first. */
rtr_unserved_act rtr_unserved_check(const rtr_plan *p, const rtr_cluster *c, const char *table,
                                    const char *what, int64_t now_us, rtr_unserved *u, st_err *err);

/* ---- failover.c: queries of death ----
 * A request whose node connection dropped while it was in flight (reset or EOF, not a clean
 * status) may have killed the node, or the node may have died for another reason (kill -9, out
 * of memory, a lost host), which nothing the router sees tells apart. So:
 *   - the first drop under a request lets it move on (to the next cluster, or retried) once, as
 *     any UNAVAILABLE, whether it was alone on the connection or among other calls;
 *   - a second drop under the same request refuses it with INTERNAL for
 *     RTR_QOD_REPEAT_REFUSE_MS: the same attempt dropped twice, or the request alone on its
 *     connection in a drop for the second time (a later retry of the client);
 *   - the request served once (rtr_qod_served) clears the evidence: a query of death never is.
 * Identical requests lost in one drop (a hot row) count once: one drop is one piece of evidence
 * per fingerprint.
 * So a query of death takes down at most two nodes, not every cluster in turn, and a node killed
 * under a single request costs that request nothing but a retry, however often it happens. */
typedef enum rtr_qod_verdict {
    RTR_QOD_GO,     /* move on or retry as usual */
    RTR_QOD_REFUSE, /* end the request with err */
} rtr_qod_verdict;
uint64_t rtr_qod_fingerprint(const char *path, st_slice req);
/* Names one connection loss: node's connection number conn_id (rtr_node.conn_id when the call
 * was started). Every call lost in that drop gets the same id. */
uint64_t rtr_qod_drop_id(const rtr_node *node, uint64_t conn_id);
/* True (err set: INTERNAL naming the reason) while requests with fingerprint fp are refused. */
bool rtr_qod_refused(rtr_ctx *r, uint64_t fp, st_err *err);
/* A request with fingerprint fp was served: drops it was in before were not its doing. */
void rtr_qod_served(rtr_ctx *r, uint64_t fp);
/* An attempt of request fp ended because node's connection dropped under it (drop id drop,
 * rtr_qod_drop_id) and lost_with sent calls (rpc_ccall_conn_lost) at drop_us (st_mono_us).
 * *moved_once: the request already moved on after such a drop (set here when it may again). */
rtr_qod_verdict rtr_qod_dropped(rtr_ctx *r, uint64_t fp, size_t lost_with, const rtr_node *node,
                                uint64_t drop, int64_t drop_us, bool *moved_once, st_err *err);

/* ---- failover.c: write fences ----
 * A multi-cluster write attempt is sent with a fence (BTU_WRITE_BY_HEADER): its deadline on the
 * wall clock, after which the node refuses it. Before the write goes to any node again after an
 * attempt that may have reached its node and did not succeed, the router waits until that
 * attempt's fence has passed: a delete or a stamped SetCell applied late by a node that was
 * frozen (a paused VM, a stopped process) would otherwise take a version newer than writes the
 * client made, and was acknowledged, after it moved to another cluster. */
typedef struct rtr_fence {
    int64_t pending_us; /* the latest fence of attempts that may still apply; 0: none */
} rtr_fence;
#define RTR_FENCE_TEXT_BYTES 24
/* The fence of an attempt sent now with timeout_ms (0: no deadline; at most RTR_FO_ATTEMPT_MS
 * either way): *attempt_us, and its header in md[*n_md]
 * (md has room for it), its value written into text, which must live as long as the call. */
void rtr_fence_attempt(int64_t timeout_ms, int64_t *attempt_us, char text[RTR_FENCE_TEXT_BYTES],
                       rpc_metadata *md, size_t *n_md);
/* An attempt with fence attempt_us ended with code; sent: it may have reached its node. Only an
 * attempt whose outcome is open (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN, INTERNAL)
 * holds back the resend: a node's refusal (strata-not-owner after a move or split, ...) means
 * nothing was written, and the write goes again at once. */
void rtr_fence_ended(rtr_fence *f, int64_t attempt_us, st_code code, bool sent);
/* Milliseconds to wait before the write may be sent again (0: at once). */
int64_t rtr_fence_wait_ms(const rtr_fence *f);

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
