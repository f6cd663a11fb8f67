/* strata/metrics.h — Prometheus metrics for every Strata process (docs/metrics.md):
 *   - writers for the Prometheus text exposition format, version 0.0.4 (prom_*),
 *   - the RPC server's per-method counters and latency histograms (rpc_server_metrics_render),
 *   - process CPU and memory from /proc/self (prom_process),
 *   - a tiny HTTP/1.x listener serving GET /metrics on the process's event_base, bounded in
 *     connections, time per request and descriptors (metrics_http.c).
 *
 * Threading: everything runs on the event_base's loop thread (the RPC server records its
 * metrics there too, so nothing here takes a lock). */
#ifndef STRATA_METRICS_H
#define STRATA_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

struct event_base;
struct rpc_server;

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_PAGE_BYTES_MAX ((size_t)16 << 20) /* one rendered /metrics page */
#define METRICS_HTTP_TIMEOUT_S 10                 /* an answer not written within it is dropped */
#define METRICS_HTTP_HEADERS_BYTES_MAX 8192       /* request headers of one scrape */
#define METRICS_HTTP_CONNECTIONS_MAX 64u /* scrapers at once (fewer under a small ulimit -n) */
#define METRICS_HTTP_REQUEST_MS 5000u    /* from accept to the end of the request's headers */
/* At the cap, a connection without a complete request is closed for a new one only once open
 * this long (a burst of scrapers not yet read gets 503s instead of silent closes). */
#define METRICS_HTTP_EVICT_GRACE_MS 1000u

/* ---- the text format ---- */
/* A page being written: the first failure (out of memory, page over METRICS_PAGE_BYTES_MAX) is
 * kept in rc and later writes are skipped, so writers need not check every call. */
typedef struct prom_out {
    st_buf *buf;
    st_code rc;
} prom_out;

typedef struct prom_label {
    const char *name;  /* [a-zA-Z_][a-zA-Z0-9_]* (not checked: names are ours) */
    const char *value; /* any bytes; escaped on output */
} prom_label;

void prom_out_init(prom_out *o, st_buf *buf);
/* Appends raw text (printf style). */
void prom_printf(prom_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "# HELP name help" (help escaped) and "# TYPE name type" (counter, gauge, histogram). Once
 * per metric family, before its samples. */
void prom_family(prom_out *o, const char *name, const char *type, const char *help);
/* Appends a label value escaped as the format requires: \ -> \\, " -> \", newline -> \n. */
void prom_escape_label(prom_out *o, const char *value);
/* One sample: name{l0="v0",...} value. n may be 0 (no braces). */
void prom_sample_u64(prom_out *o, const char *name, const prom_label *l, size_t n, uint64_t v);
void prom_sample_f64(prom_out *o, const char *name, const prom_label *l, size_t n, double v);
/* A histogram's samples: name_bucket{..., le="b"} cumulative for each upper bound, then
 * le="+Inf" (= count), name_sum and name_count. counts[i] holds the observations in
 * (bounds[i-1], bounds[i]] (NOT cumulative); counts[n_bounds] those above the last bound. */
void prom_histogram(prom_out *o, const char *name, const prom_label *l, size_t n,
                    const double *bounds, const uint64_t *counts, size_t n_bounds, double sum);
/* process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds, process_max_fds (the names of Prometheus's client libraries). */
void prom_process(prom_out *o);

/* ---- the RPC server's metrics ---- */
/* Latency bucket upper bounds in microseconds: 100 us to 60 s, roughly x2.5 per step. */
#define RPC_LATENCY_BUCKETS 18
extern const int64_t rpc_latency_bounds_us[RPC_LATENCY_BUCKETS];

/* Appends the server's metrics (strata_rpc_server_*: calls handled by method and final code,
 * latency histograms per method, connection and queue gauges) to the page. Loop thread. */
void rpc_server_metrics_render(struct rpc_server *s, prom_out *o);

/* ---- the HTTP listener ---- */
typedef struct metrics_http metrics_http;
/* Renders the whole page (loop thread, on every scrape). */
typedef void (*metrics_render_fn)(prom_out *o, void *arg);

/* Serves GET (and HEAD) /metrics on host:port (port 0 = ephemeral; *bound_port, may be NULL,
 * receives the port): 200 with the page as PROM_CONTENT_TYPE, 404 for other paths, 405 for
 * other methods, 500 when the page could not be built. UNAVAILABLE when the address cannot be
 * bound. Free with metrics_http_free (before the event_base). */
metrics_http *metrics_http_start(struct event_base *base, const char *host, uint16_t port,
                                 metrics_render_fn render, void *arg, uint16_t *bound_port,
                                 st_err *err);
void metrics_http_free(metrics_http *m); /* NULL is fine */
/* What a listener holds and has closed (loop thread). */
typedef struct metrics_http_stats {
    uint64_t accepted;      /* connections accepted */
    uint64_t open;          /* connections open now (at most the cap) */
    uint64_t evicted;       /* closed at the cap to admit a new one: request incomplete past
                               the grace, or answer written */
    uint64_t refused;       /* closed at accept with a 503: at the cap, none could be closed */
    uint64_t timed_out;     /* closed: request not complete within its deadline */
    uint64_t accept_errors; /* accept() failures (out of descriptors: the listener pauses) */
} metrics_http_stats;
void metrics_http_stats_get(const metrics_http *m, metrics_http_stats *out);
/* Replaces the cap on connections (METRICS_HTTP_CONNECTIONS_MAX, or 1/16 of ulimit -n when
 * fewer, at least 4) and the request deadline (METRICS_HTTP_REQUEST_MS) for connections
 * accepted from now on; 0 keeps a value. Loop thread. */
void metrics_http_set_limits(metrics_http *m, uint32_t conns_max, uint32_t request_ms);
/* Replaces METRICS_HTTP_EVICT_GRACE_MS (0: any connection without a complete request may be
 * closed at the cap, however young). Loop thread. */
void metrics_http_set_evict_grace(metrics_http *m, uint32_t grace_ms);

#endif
