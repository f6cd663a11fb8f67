/* repl_glue.h — the node's side of replication (repl_glue.c; private to node/). */
#ifndef NODE_REPL_GLUE_H
#define NODE_REPL_GLUE_H

#include "strata/base.h"
#include "strata/rpc.h"

typedef struct node_ctx node_ctx;

/* With opts.config_path set: loads the topology, starts shipping to every other cluster and
 * registers strata.internal.v1.Replication on the node's server. A no-op without a config.
 * INVALID_ARGUMENT for a bad topology or a cluster number outside it. */
st_code node_repl_start(node_ctx *n, st_err *err);
/* Stops shipping (positions recorded); safe when never started. Call with no loop turn between
 * it and rpc_server_free (the Apply handler's context goes). */
void node_repl_stop(node_ctx *n);

/* True when every peer cluster has every record of this node's log up to lsn (each shipper's
 * acknowledged position is past it), or the node has no peer clusters. Otherwise false, with
 * *behind set to the number of a peer cluster still missing some. A tablet moving away waits
 * for this before it is dropped: the shippers name a record's table through the live tablet, so
 * records of a dropped tablet would never reach the peers. Loop thread. */
bool node_repl_shipped(node_ctx *n, uint64_t lsn, uint32_t *behind);

/* A tablet was made here (create, split): replication learns its table at once (see
 * repl_tablet_named). No-op without replication. */
void node_repl_tablet_named(node_ctx *n, uint64_t id, const char *table);
/* Around a split or a move of tablet id (repl_tablet_retire, repl_tablet_retire_done) and after a
 * table was deleted (repl_table_dropped). No-ops without replication. */
st_code node_repl_tablet_retire(node_ctx *n, uint64_t id, const char *table, st_err *err);
void node_repl_tablet_retire_done(node_ctx *n, uint64_t id, bool gone);
void node_repl_table_dropped(node_ctx *n, const char *table);
/* Whether an Apply call carrying rows of the dropped table is still under way to a peer
 * (repl_table_shipping). False without replication. */
bool node_repl_table_shipping(node_ctx *n, const char *table);

/* The id of cluster number cluster_num in the topology (--config); NULL without one, or for a
 * number outside it. Change streams name a record's origin cluster with it. */
const char *node_repl_cluster_id(node_ctx *n, uint32_t cluster_num);

/* The applied bound of a change-stream token at position w (repl_applied_bound): every write
 * another cluster committed at or before it had a stamp at or below w here. INT64_MAX without
 * peer clusters, 0 while not known. */
int64_t node_repl_applied_bound(node_ctx *n, int64_t w);

/* A local write is durable: wakes idle shippers (repl_notify_commit). No-op without replication. */
void node_repl_notify(node_ctx *n);

/* GenerateConsistencyToken / CheckConsistency: cross-cluster tokens (docs/formats/replication.md)
 * when the node has peer clusters, else the node's single-cluster handlers. */
void node_repl_h_generate_consistency_token(rpc_call *call, st_slice req, void *arg);
void node_repl_h_check_consistency(rpc_call *call, st_slice req, void *arg);

#endif
