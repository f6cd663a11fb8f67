/* ops/bench_storm.h — the handshake storm of `strata bench --storm` (bench_storm.c). Private to
 * ops/. */
#ifndef STRATA_OPS_BENCH_STORM_H
#define STRATA_OPS_BENCH_STORM_H

#include <pthread.h>

#include "bench_run.h"

typedef struct bench_storm {
    const bench_cfg *cfg;
    const bench_target *t;
    pthread_t th[BENCH_STORM_THREADS];
    size_t n_th;
    bool started;
    int64_t start_ns, end_ns; /* end_ns: when the last thread finished (atomic) */
    uint32_t claimed;         /* connections taken by the threads (atomic) */
    uint32_t running;         /* threads still connecting (atomic) */
    uint64_t ok, failed;      /* atomics */
    bool has_error;           /* error holds the first failure (atomic flag) */
    char error[160];
} bench_storm;

/* Monotonic nanoseconds (the run's clock). */
int64_t bench_now_ns(void);
/* Starts cfg->storm connections to t on BENCH_STORM_THREADS threads. */
st_code bench_storm_start(bench_storm *s, const bench_cfg *cfg, const bench_target *t, st_err *err);
/* True from the start until the last connection is done (any thread). */
bool bench_storm_running(const bench_storm *s);
/* Waits for the threads and copies the storm's figures into res. */
void bench_storm_join(bench_storm *s, bench_result *res);

#endif
