/* strata/node_metrics.h — strata-node's Prometheus metrics (node/metrics.c; docs/metrics.md):
 * RPC counters and latencies, storage, tablets and the hottest one, replication lag per peer
 * cluster, process CPU and memory, served as GET /metrics on the node's event_base. */
#ifndef STRATA_NODE_METRICS_H
#define STRATA_NODE_METRICS_H

#include "strata/metrics.h"
#include "strata/node.h"

/* The hottest tablet is the one with the most rows written in the last full interval. */
#define NODE_METRICS_HOT_INTERVAL_MS 10000

typedef struct node_metrics node_metrics;

/* Starts the hottest-tablet interval timer and, when host is not NULL, the HTTP listener on
 * host:port (port 0 = ephemeral; *bound_port, may be NULL, receives it). UNAVAILABLE when the
 * address cannot be bound. Loop thread; stop it before node_close. */
st_code node_metrics_start(node_ctx *n, const char *host, uint16_t port, node_metrics **out,
                           uint16_t *bound_port, st_err *err);
/* Renders the whole page (what GET /metrics serves). Loop thread. */
void node_metrics_render(node_metrics *m, prom_out *o);
/* Ends the timer and the listener and frees; NULL is fine. */
void node_metrics_stop(node_metrics *m);

#endif
