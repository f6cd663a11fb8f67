/* strata/router_metrics.h — strata-router's Prometheus metrics (router/metrics.c;
 * docs/metrics.md): RPC counters and latencies, per-cluster health, tablet-map refreshes,
 * retries, failovers, balancer moves, process CPU and memory, served as GET /metrics on the
 * router's event_base. */
#ifndef STRATA_ROUTER_METRICS_H
#define STRATA_ROUTER_METRICS_H

#include "strata/metrics.h"
#include "strata/router.h"

/* Serves GET /metrics on host:port (port 0 = ephemeral; *bound_port, may be NULL, receives
 * it). NULL with err (UNAVAILABLE) when the address cannot be bound. Loop thread; free with
 * metrics_http_free before rtr_close. */
metrics_http *rtr_metrics_start(rtr_ctx *r, const char *host, uint16_t port, uint16_t *bound_port,
                                st_err *err);
/* Renders the whole page (what GET /metrics serves). Loop thread. */
void rtr_metrics_render(rtr_ctx *r, prom_out *o);

#endif
