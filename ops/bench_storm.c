/* bench_storm.c — `strata bench --storm N`: N new connections to the target while a workload
 * runs on its established ones, to see whether handshakes stall them. BENCH_STORM_THREADS
 * threads each connect, call PingAndWarm once (so the server completes the TLS handshake and
 * the HTTP/2 session) and close, one connection after the other, until N are done. With --tls
 * every one is a full handshake: the client keeps no session to resume. The run's loop thread
 * reads the counters (atomics) to tell calls made before the storm from those made during it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bench_storm.h"
#include "google/bigtable/v2/bigtable.pb-c.h"

#define STORM_CALL_TIMEOUT_MS 30000

static void storm_note_error(bench_storm *s, st_code rc, const char *msg) {
    bool expected = false;
    if (__atomic_compare_exchange_n(&s->has_error, &expected, true, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        snprintf(s->error, sizeof s->error, "%.20s: %.130s", st_code_name(rc), msg);
}

static void *storm_thread(void *arg) {
    bench_storm *s = arg;
    const bench_target *t = s->t;
    char addr[OPS_ADDR_MAX + 16], name[2 * BENCH_NAME_MAX + 32];
    snprintf(addr, sizeof addr, strchr(t->host, ':') ? "[%s]:%u" : "%s:%u", t->host, t->port);
    snprintf(name, sizeof name, "projects/%s/instances/%s", s->cfg->project, s->cfg->instance);
    Google__Bigtable__V2__PingAndWarmRequest req =
        GOOGLE__BIGTABLE__V2__PING_AND_WARM_REQUEST__INIT;
    req.name = name;
    uint8_t buf[sizeof name + 16];
    size_t len = google__bigtable__v2__ping_and_warm_request__pack(&req, buf);
    rpc_metadata md[2];
    size_t n_md = bench_md_fill(md, "", t);
    while (__atomic_fetch_add(&s->claimed, 1, __ATOMIC_RELAXED) < s->cfg->storm) {
        st_buf resp;
        st_buf_init(&resp);
        st_err st = {0};
        /* md[0] is the empty request-params entry: only the token (if any) is sent */
        st_code rc = rpc_blocking_unary(addr, &t->copts, "/google.bigtable.v2.Bigtable/PingAndWarm",
                                        st_slice_make(buf, len), md + 1, n_md - 1,
                                        STORM_CALL_TIMEOUT_MS, &resp, &st);
        st_buf_free(&resp);
        if (rc == ST_OK || rc == ST_UNIMPLEMENTED) /* connected and answered */
            __atomic_fetch_add(&s->ok, 1, __ATOMIC_RELAXED);
        else {
            __atomic_fetch_add(&s->failed, 1, __ATOMIC_RELAXED);
            storm_note_error(s, rc, st.msg);
        }
    }
    if (__atomic_sub_fetch(&s->running, 1, __ATOMIC_ACQ_REL) == 0)
        __atomic_store_n(&s->end_ns, bench_now_ns(), __ATOMIC_RELEASE);
    return NULL;
}

st_code bench_storm_start(bench_storm *s, const bench_cfg *cfg, const bench_target *t,
                          st_err *err) {
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->t = t;
    s->start_ns = bench_now_ns();
    s->running = BENCH_STORM_THREADS;
    for (size_t i = 0; i < BENCH_STORM_THREADS; i++) {
        if (pthread_create(&s->th[i], NULL, storm_thread, s) != 0) {
            /* the threads that did start finish the storm alone */
            if (__atomic_sub_fetch(&s->running, BENCH_STORM_THREADS - (uint32_t)i,
                                   __ATOMIC_ACQ_REL) == 0)
                s->end_ns = bench_now_ns();
            if (i == 0)
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot start the storm threads");
            break;
        }
        s->n_th++;
    }
    s->started = true;
    return ST_OK;
}

bool bench_storm_running(const bench_storm *s) {
    return s->started && __atomic_load_n(&s->running, __ATOMIC_ACQUIRE) > 0;
}

void bench_storm_join(bench_storm *s, bench_result *res) {
    for (size_t i = 0; i < s->n_th; i++)
        pthread_join(s->th[i], NULL);
    if (!s->started)
        return;
    res->storm_ok = s->ok;
    res->storm_failed = s->failed;
    res->storm_s = (double)(s->end_ns - s->start_ns) / 1e9;
    memcpy(res->storm_error, s->error, sizeof res->storm_error);
}
