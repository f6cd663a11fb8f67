/* repl_internal.h — what replication's files share (private to replication/).
 * ctx.c: the per-node context, client pool, tablet names, GetPositions, gather;
 * shipper.c, shipper_pos.c, shipper_batch.c: one shipper per peer cluster (shipper_internal.h says
 * which part is where); apply.c: the receiving side (Apply); order.c: the order in which each
 * sending node's Apply calls start. */
#ifndef REPL_INTERNAL_H
#define REPL_INTERNAL_H

#include <event2/event.h>

#include "strata/replication.h"

typedef struct repl_shipper repl_shipper;

/* A pooled client to one node address (any cluster). */
typedef struct repl_conn {
    char addr[ST_TOPO_ADDR_MAX + 1];
    rpc_client *client;
} repl_conn;

/* tablet id -> table name, for log records (which name tablets only). Sorted by id. */
typedef struct repl_name {
    uint64_t id;
    char *table;
} repl_name;

/* A split parent whose records may still be unshipped (retired.c): lsn is the log's last lsn
 * once the split is done (every record of the tablet is at or below it), 0 while it runs. */
typedef struct repl_retired {
    uint64_t id, lsn;
    char *table;
} repl_retired;

/* The applied bound of change-stream tokens (applied.c): pairs of (this node's resolved stamp,
 * the bound Y that held then), in a ring in increasing order of both. */
typedef struct repl_applied_pair {
    int64_t stamp, y;
} repl_applied_pair;

typedef struct repl_applied {
    repl_applied_pair *pairs; /* REPL_APPLIED_PAIRS_MAX, allocated at the first pair */
    size_t head, n;
    struct event *ev;     /* the next round */
    bool polling;         /* a round is due or under way */
    int64_t want_mono_us; /* the last repl_applied_bound call */
    uint32_t pending;     /* GetPositions calls of the round outstanding */
    bool failed;          /* a peer node of the round did not answer */
    int64_t y;            /* the smallest acknowledged commit time of the round so far */
} repl_applied;

/* One Apply call (apply.c), kept in its call's arena; parked by order.c until the call of the
 * same source node it must follow has started here. */
typedef struct repl_apply_op {
    struct repl_ctx *r;
    rpc_call *call;
    const struct Strata__Internal__V1__ApplyRequest *req;
    size_t src; /* repl_order index of its source node; REPL_ORDER_NONE: unordered */
    uint64_t after_lsn, next_lsn;      /* the request's */
    struct repl_apply_op *prev, *next; /* repl_order.parked while parked */
    int64_t parked_us;                 /* monotonic; 0 = not parked */
} repl_apply_op;

#define REPL_ORDER_SOURCES (ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX)
#define REPL_ORDER_NONE ((size_t)-1)

/* The order of Apply calls (order.c): per source node, the end of its furthest batch whose
 * write started here (0: none since this process started, or since such a write failed), and
 * the calls waiting for an earlier batch of their source, oldest first. */
typedef struct repl_order {
    uint64_t started_next[REPL_ORDER_SOURCES];
    uint8_t parked_of[REPL_ORDER_SOURCES]; /* calls parked per source node */
    repl_apply_op *head, *tail;
    size_t n_parked;
    uint64_t expired; /* refused after waiting REPL_APPLY_PARK_MS */
    struct event *ev; /* refuses calls parked for REPL_APPLY_PARK_MS */
    bool releasing;
} repl_order;

struct repl_ctx {
    repl_opts o; /* pointers below replace the caller's */
    st_topology topo;
    repl_node_ops ops;
    rpc_client_opts client_opts;
    bool has_client_opts;
    char state_dir[ST_TOPO_PATH_MAX + 1];
    repl_shipper *shippers[ST_TOPO_CLUSTERS_MAX];
    size_t n_shippers;
    repl_conn conns[REPL_TOKEN_NODES_MAX];
    size_t n_conns;
    repl_name *names;
    size_t n_names;
    repl_retired *retired;
    size_t n_retired;
    bool closing;
    bool link_cut[ST_TOPO_CLUSTERS_MAX + 1]; /* by cluster number (repl_links_set) */
    repl_applied applied;
    repl_order order;
};

/* The pooled client for addr, (re)created when absent or dead; NULL with err when it cannot be
 * made. Never call from inside a client callback (it may free a dead client). */
rpc_client *repl_conn_get(repl_ctx *r, const char *addr, st_err *err);
/* The table of a tablet id: looks in the remembered names, then refreshes them from storage
 * once (refresh=true). NULL when unknown (the tablet and its table are gone). */
const char *repl_tablet_table(repl_ctx *r, uint64_t tablet_id, bool refresh);
/* Learns every live tablet's table from storage. */
void repl_names_refresh(repl_ctx *r);
/* Forgets every tablet of table (it was deleted): its records still in the log are not shipped,
 * least of all into a table created again under the same name. */
void repl_names_forget(repl_ctx *r, const char *table);

/* retired.c: loads <state_dir>/retired-tablets (after the shippers opened: their recorded
 * positions prune it) and names its tablets; frees the list at close. */
st_code repl_retired_load(repl_ctx *r, st_err *err);
void repl_retired_free(repl_ctx *r);

/* shipper.c */
st_code repl_shipper_open(repl_ctx *r, const st_topo_cluster *peer, repl_shipper **out,
                          st_err *err);
/* Cancels outstanding calls and frees; call after the clients are freed (their callbacks run). */
void repl_shipper_close(repl_shipper *s);
/* Records the acknowledged position durably now if it moved (close, tests). */
void repl_shipper_persist(repl_shipper *s, bool force);
void repl_shipper_stats(repl_shipper *s, repl_peer_stats *out);
uint32_t repl_shipper_cluster_num(const repl_shipper *s);
/* The shipper's link was cut or restored: a restored one ends its backoff and pumps at once. */
void repl_shipper_link_changed(repl_shipper *s);
/* Pumps at the next loop turn unless backing off or refreshing its map. */
void repl_shipper_wake(repl_shipper *s);

/* applied.c: frees the applied bound's state (after the clients: their callbacks run first). */
void repl_applied_close(repl_ctx *r);

/* apply.c */
void repl_h_apply(rpc_call *call, st_slice req, void *arg);
/* Starts writing op's rows (order.c calls it when op's turn comes); finishes the call itself. */
void repl_apply_start(repl_ctx *r, repl_apply_op *op);

/* order.c: Apply calls of one source node start in the order of its log (docs/formats/
 * replication.md, Apply order). admit starts op now or parks it; started and failed report
 * what became of a started op (failed: before its write started, or its write failed after);
 * close refuses the parked calls. */
void repl_order_admit(repl_ctx *r, repl_apply_op *op);
void repl_order_started(repl_ctx *r, const repl_apply_op *op);
void repl_order_failed(repl_ctx *r, const repl_apply_op *op, bool write_started);
void repl_order_close(repl_ctx *r);
void repl_h_get_positions(rpc_call *call, st_slice req, void *arg);
/* ctx.c */
void repl_h_set_links(rpc_call *call, st_slice req, void *arg);

#endif
