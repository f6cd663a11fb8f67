/* The gRPC server, shaped like nghttp2's examples/libevent-server.c, in layers:
 *   rpc_server — this file: the method table, a cross-thread post queue (eventfd), stats;
 *                its listeners are in server_listen.c;
 *   h2_conn    — server_conn.c: one per connection;
 *   rpc_call   — server_call.c: one per stream.
 * server_internal.h holds the structures they share. */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server_internal.h"

/* ---- the server ---- */

static void post_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    rpc_server *srv = arg;
    uint64_t v;
    h2_loop_activity();
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        st_log(ST_LOG_WARN, "rpc", "msg=\"eventfd read failed\" errno=%d", errno);
    pthread_mutex_lock(&srv->post_mu);
    rpc_post *it = srv->post_head;
    srv->post_head = srv->post_tail = NULL;
    srv->post_len = 0;
    pthread_mutex_unlock(&srv->post_mu);
    while (it) {
        post_fields f = post_get(it);
        if (f.owned)
            free(it);
        f.fn(f.arg); /* may free an embedded item: it is not touched from here on */
        it = f.next;
    }
}

/* Queues a filled-in item (any thread). */
static st_code post_enqueue(rpc_server *s, rpc_post *item) {
    pthread_mutex_lock(&s->post_mu);
    if (s->post_len >= RPC_POST_QUEUE_MAX) {
        pthread_mutex_unlock(&s->post_mu);
        return ST_RESOURCE_EXHAUSTED;
    }
    bool was_empty = s->post_head == NULL;
    if (s->post_tail) {
        post_fields tail = post_get(s->post_tail);
        tail.next = item;
        post_set(s->post_tail, tail);
    } else {
        s->post_head = item;
    }
    s->post_tail = item;
    s->post_len++;
    pthread_mutex_unlock(&s->post_mu);
    /* Only the post that makes the queue non-empty wakes the loop: post_cb reads the eventfd
     * before it empties the queue under the lock, so a non-empty queue always has a wake-up (or a
     * drain) still to come. A group commit completing many writes costs one syscall, not one
     * per write. */
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w = write(s->post_fd, &one, sizeof(one));
        (void)w; /* EAGAIN means the counter is already non-zero: the loop will wake anyway */
    }
    return ST_OK;
}

st_code rpc_server_post_item(rpc_server *s, rpc_post *item, void (*fn)(void *arg), void *arg) {
    post_set(item, (post_fields){fn, arg, NULL, false});
    return post_enqueue(s, item);
}

st_code rpc_server_post(rpc_server *s, void (*fn)(void *arg), void *arg) {
    rpc_post *it = malloc(sizeof(*it));
    if (!it)
        return ST_RESOURCE_EXHAUSTED;
    post_set(it, (post_fields){fn, arg, NULL, true});
    st_code rc = post_enqueue(s, it);
    if (rc != ST_OK)
        free(it);
    return rc;
}

/* Half the shortest of the n timeouts t (0s are off), bounded, as a timeval; zero when all
 * are off. Half, so that each timeout is enforced at most half its length late. */
static struct timeval tick_of(const uint32_t *t, size_t n) {
    uint32_t tick = UINT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (t[i] && t[i] / 2 < tick)
            tick = t[i] / 2;
    if (tick == UINT32_MAX)
        return (struct timeval){0, 0};
    if (tick < CONN_TICK_MS_MIN)
        tick = CONN_TICK_MS_MIN;
    if (tick > CONN_TICK_MS_MAX)
        tick = CONN_TICK_MS_MAX;
    return (struct timeval){tick / 1000, (suseconds_t)(tick % 1000) * 1000};
}

/* Copies the process's limits and derives the connections' timer periods: until the client's
 * preface arrived every timeout counts, afterwards only the idle and slow-request ones. */
static void server_limits_init(rpc_server *s) {
    rpc_limits_get(&s->limits);
    if (!s->limits.connections_max)
        s->limits.connections_max = rpc_connections_max_auto();
    uint32_t t[] = {s->limits.idle_timeout_ms, s->limits.slow_request_window_ms,
                    s->limits.handshake_timeout_ms};
    s->conn_tick = tick_of(t, 3);
    s->conn_tick_ready = tick_of(t, 2);
}

rpc_server *rpc_server_new(struct event_base *base, const rpc_server_opts *opts, st_err *err) {
    h2_logging_init();
    rpc_server *s = calloc(1, sizeof(*s));
    if (!s) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating the RPC server");
        return NULL;
    }
    s->base = base;
    if (opts)
        s->opts = *opts;
    server_limits_init(s);
    if (!s->opts.message_bytes_max)
        s->opts.message_bytes_max = s->limits.message_bytes_max;
    if (!s->opts.message_bytes_max)
        s->opts.message_bytes_max = RPC_MESSAGE_BYTES_MAX_DEFAULT;
    if (s->opts.message_bytes_max > UINT32_MAX)
        s->opts.message_bytes_max = UINT32_MAX;
    if (!s->opts.send_queue_bytes_max)
        s->opts.send_queue_bytes_max = RPC_SEND_QUEUE_BYTES_DEFAULT;
    if (!s->opts.streams_max)
        s->opts.streams_max = s->limits.streams_per_conn_max;
    if (!s->opts.streams_max)
        s->opts.streams_max = RPC_STREAMS_MAX_DEFAULT;
    if (s->limits.header_bytes_max < RPC_HEADER_BYTES_MIN)
        s->limits.header_bytes_max = RPC_HEADER_BYTES_MAX;
    if (s->limits.header_bytes_max > RPC_HEADER_BYTES_LIMIT)
        s->limits.header_bytes_max = RPC_HEADER_BYTES_LIMIT; /* what nghttp2 can decode */
    pthread_mutex_init(&s->post_mu, NULL);
    rpc_metrics_init(&s->metrics);
    s->post_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->post_fd < 0 ||
        !(s->post_ev = event_new(base, s->post_fd, EV_READ | EV_PERSIST, post_cb, s)) ||
        event_add(s->post_ev, NULL) != 0) {
        st_err_set(err, ST_INTERNAL, "cannot set up the server's post queue: %s", strerror(errno));
        rpc_server_free(s);
        return NULL;
    }
    return s;
}

void rpc_server_set_gate(rpc_server *s, rpc_gate_fn gate, void *arg) {
    s->gate = gate;
    s->gate_arg = arg;
}

st_code rpc_server_add_method(rpc_server *s, const char *path, rpc_handler_fn handler, void *arg) {
    if (rpc_server_method_find(s, path))
        return ST_ALREADY_EXISTS;
    if (s->methods_len == RPC_METHODS_MAX)
        return ST_RESOURCE_EXHAUSTED;
    rpc_method_ent *m = realloc(s->methods, (s->methods_len + 1) * sizeof(*m));
    if (!m)
        return ST_RESOURCE_EXHAUSTED;
    s->methods = m;
    char *p = strdup(path);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    if (rpc_metrics_add(&s->metrics, path) != ST_OK) { /* its slot: index methods_len */
        free(p);
        return ST_RESOURCE_EXHAUSTED;
    }
    s->methods[s->methods_len++] = (rpc_method_ent){p, handler, arg};
    return ST_OK;
}

void rpc_server_set_guard(rpc_server *s, rpc_guard_fn fn, void *arg) {
    s->guard = fn;
    s->guard_arg = arg;
}

const rpc_method_ent *rpc_server_method_find(const rpc_server *srv, const char *path) {
    for (size_t i = 0; i < srv->methods_len; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return &srv->methods[i];
    return NULL;
}

/* ---- shutting down ---- */

#define RPC_SHUTDOWN_TICK_MS 10

typedef struct shutdown_run {
    rpc_server *s;
    const char *why;
    int64_t end_calls_us; /* the calls still open then end with UNAVAILABLE */
    int64_t give_up_us;   /* rpc_server_free closes whatever is left */
    bool calls_ended;
} shutdown_run;

static void shutdown_tick_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    shutdown_run *run = arg;
    int64_t now = st_mono_us();
    if (!run->calls_ended && now >= run->end_calls_us) {
        run->calls_ended = true;
        for (h2_conn *c = run->s->conns; c; c = c->next)
            rpc_calls_end(c, ST_UNAVAILABLE, run->why);
    }
    if (!run->s->conns || now >= run->give_up_us)
        event_base_loopbreak(run->s->base);
}

void rpc_server_shutdown(rpc_server *s, const char *why, uint32_t grace_ms) {
    rpc_server_listeners_free(s);
    for (h2_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        h2_conn_goaway(c, why);
    }
    if (!s->conns)
        return;
    int64_t now = st_mono_us();
    shutdown_run run = {s, why, now + (int64_t)grace_ms * 500, now + (int64_t)grace_ms * 1000,
                        false};
    struct timeval tick = {0, RPC_SHUTDOWN_TICK_MS * 1000};
    struct event *ev = event_new(s->base, -1, EV_PERSIST, shutdown_tick_cb, &run);
    if (ev && event_add(ev, &tick) == 0)
        event_base_loop(s->base, 0); /* also ends early on loopbreak: a second SIGTERM */
    if (ev)
        event_free(ev);
}

void rpc_server_free(rpc_server *s) {
    if (!s)
        return;
    rpc_server_listeners_free(s);
    while (s->conns)
        h2_conn_close(s->conns);
    if (s->post_ev)
        event_free(s->post_ev);
    if (s->post_fd >= 0)
        close(s->post_fd);
    for (rpc_post *it = s->post_head; it;) {
        post_fields f = post_get(it);
        if (f.owned)
            free(it);
        it = f.next;
    }
    pthread_mutex_destroy(&s->post_mu);
    for (size_t i = 0; i < s->methods_len; i++)
        free(s->methods[i].path);
    free(s->methods);
    rpc_metrics_deinit(&s->metrics);
    free(s);
}

void rpc_server_stats_get(rpc_server *s, rpc_server_stats *out) {
    out->conns_accepted = __atomic_load_n(&s->stats.conns_accepted, __ATOMIC_RELAXED);
    out->conns_open = __atomic_load_n(&s->stats.conns_open, __ATOMIC_RELAXED);
    out->calls_started = __atomic_load_n(&s->stats.calls_started, __ATOMIC_RELAXED);
    out->calls_active = __atomic_load_n(&s->stats.calls_active, __ATOMIC_RELAXED);
    out->calls_cancelled = __atomic_load_n(&s->stats.calls_cancelled, __ATOMIC_RELAXED);
    out->queued_bytes = __atomic_load_n(&s->stats.queued_bytes, __ATOMIC_RELAXED);
    out->queued_bytes_peak = __atomic_load_n(&s->stats.queued_bytes_peak, __ATOMIC_RELAXED);
    out->bad_streams = __atomic_load_n(&s->stats.bad_streams, __ATOMIC_RELAXED);
    out->calls_refused_memory = __atomic_load_n(&s->stats.calls_refused_memory, __ATOMIC_RELAXED);
    out->calls_slow = __atomic_load_n(&s->stats.calls_slow, __ATOMIC_RELAXED);
    out->conns_refused = __atomic_load_n(&s->stats.conns_refused, __ATOMIC_RELAXED);
    out->conns_evicted = __atomic_load_n(&s->stats.conns_evicted, __ATOMIC_RELAXED);
    out->conns_idle_closed = __atomic_load_n(&s->stats.conns_idle_closed, __ATOMIC_RELAXED);
    out->conns_handshake_closed =
        __atomic_load_n(&s->stats.conns_handshake_closed, __ATOMIC_RELAXED);
    out->accept_errors = __atomic_load_n(&s->stats.accept_errors, __ATOMIC_RELAXED);
    out->buffered_request_bytes = rpc_mem_buffered();
}

void rpc_server_metrics_render(rpc_server *s, prom_out *o) {
    rpc_server_stats st;
    rpc_server_stats_get(s, &st);
    rpc_metrics_render(&s->metrics, o);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } g[] = {
        {"strata_rpc_server_connections_accepted_total", "counter", "Connections accepted.",
         offsetof(rpc_server_stats, conns_accepted)},
        {"strata_rpc_server_connections_open", "gauge", "Connections open now.",
         offsetof(rpc_server_stats, conns_open)},
        {"strata_rpc_server_calls_started_total", "counter", "Streams opened by clients.",
         offsetof(rpc_server_stats, calls_started)},
        {"strata_rpc_server_calls_active", "gauge", "Calls whose stream is open now.",
         offsetof(rpc_server_stats, calls_active)},
        {"strata_rpc_server_calls_cancelled_total", "counter",
         "Calls cancelled by the peer, a lost connection or their deadline.",
         offsetof(rpc_server_stats, calls_cancelled)},
        {"strata_rpc_server_bad_streams_total", "counter",
         "Streams the RPC layer itself ended with an error (malformed or unknown requests).",
         offsetof(rpc_server_stats, bad_streams)},
        {"strata_rpc_server_queued_bytes", "gauge",
         "Response bytes queued in calls, not yet handed to HTTP/2.",
         offsetof(rpc_server_stats, queued_bytes)},
        {"strata_rpc_server_queued_bytes_peak", "gauge", "High-water mark of queued bytes.",
         offsetof(rpc_server_stats, queued_bytes_peak)},
        {"strata_rpc_server_calls_refused_memory_total", "counter",
         "Calls refused because the process buffered its maximum of request bytes.",
         offsetof(rpc_server_stats, calls_refused_memory)},
        {"strata_rpc_server_calls_slow_total", "counter",
         "Calls ended because their request arrived slower than the minimum rate.",
         offsetof(rpc_server_stats, calls_slow)},
        {"strata_rpc_server_connections_refused_total", "counter",
         "Connections refused at the connection limit (every connection had a call open).",
         offsetof(rpc_server_stats, conns_refused)},
        {"strata_rpc_server_connections_evicted_total", "counter",
         "Idle connections closed at the connection limit to admit a new connection.",
         offsetof(rpc_server_stats, conns_evicted)},
        {"strata_rpc_server_connections_idle_closed_total", "counter",
         "Connections closed after the idle timeout.",
         offsetof(rpc_server_stats, conns_idle_closed)},
        {"strata_rpc_server_connections_handshake_closed_total", "counter",
         "Connections closed for not completing the handshake in time.",
         offsetof(rpc_server_stats, conns_handshake_closed)},
        {"strata_rpc_server_accept_errors_total", "counter",
         "accept() failures (out of descriptors: the listeners pause).",
         offsetof(rpc_server_stats, accept_errors)},
        {"strata_rpc_buffered_request_bytes", "gauge",
         "Request bytes buffered by all calls of the process.",
         offsetof(rpc_server_stats, buffered_request_bytes)},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&st + g[i].off, sizeof v);
        prom_family(o, g[i].name, g[i].type, g[i].help);
        prom_sample_u64(o, g[i].name, NULL, 0, v);
    }
}
