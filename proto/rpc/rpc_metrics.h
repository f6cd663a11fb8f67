/* rpc_metrics.h — the RPC server's per-method call counters and latency histograms (private to
 * proto/rpc; exposed to the unit test). Kept by the server, written on its loop thread only: one
 * record per call when its final status is known (a handler's finish, the layer's own error, a
 * deadline, or cancellation by the peer or a lost connection). */
#ifndef STRATA_RPC_METRICS_H
#define STRATA_RPC_METRICS_H

#include "strata/metrics.h"
#include "strata/rpc.h"

#define RPC_METRICS_CODES 17 /* gRPC codes 0..16; others count as UNKNOWN */

typedef struct rpc_method_metrics {
    uint64_t codes[RPC_METRICS_CODES];
    uint64_t buckets[RPC_LATENCY_BUCKETS + 1]; /* per bucket, not cumulative; last: above all */
    uint64_t count;
    uint64_t sum_us;
} rpc_method_metrics;

typedef struct rpc_metrics {
    rpc_method_metrics *v; /* parallel to the server's method table */
    char **paths;
    size_t n, cap;
    rpc_method_metrics unknown; /* streams that never reached a registered method */
} rpc_metrics;

void rpc_metrics_init(rpc_metrics *m);
void rpc_metrics_deinit(rpc_metrics *m);
/* Adds the slot of the next registered method (index = registration order); path copied.
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code rpc_metrics_add(rpc_metrics *m, const char *path);
/* One finished call of method idx (SIZE_MAX or out of range: the "unknown" slot). */
void rpc_metrics_record(rpc_metrics *m, size_t idx, st_code code, int64_t latency_us);
/* Renders strata_rpc_server_handled_total and strata_rpc_server_handling_seconds. */
void rpc_metrics_render(const rpc_metrics *m, prom_out *o);

#endif
