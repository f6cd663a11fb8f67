/* rpc_limits_test proves the servers' process-wide limits (rpc_limits in strata/rpc.h) against a
 * real server on a loopback ephemeral port (its loop on a background thread), with small limits:
 * large concurrent requests past the buffered-bytes budget are refused with RESOURCE_EXHAUSTED
 * while the admitted ones complete; at the connection limit the longest idle connection is closed
 * to admit a new one, and a new connection finding every connection busy gets a GOAWAY; idle
 * connections, connections that never finish the HTTP/2 preface, and requests that trickle in are
 * closed or ended after their timeouts; and a server out of file descriptors (RLIMIT_NOFILE lowered
 * in a forked child) pauses accepting instead of spinning, logs a bounded number of lines, and
 * serves again once descriptors are free. Waits poll; the only assertions on counts over time allow
 * orders of magnitude of slack. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "raw_h2.h"
#include "frame.h" /* the deframer and wire encodings (private to proto/rpc) */
#include "strata/rpc.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the test service ---- */

#define HOLD_MAX 16

typedef struct svc {
    rpc_server *srv;
    rpc_call *held[HOLD_MAX]; /* loop thread */
    int held_n;               /* atomic for the test thread */
} svc;

static void h_echo(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    rpc_call_finish(call, rpc_call_send(call, req), NULL);
}

/* Keeps the call (and so its request's memory) until hold_release. */
static void h_hold(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    svc *sv = arg;
    int n = __atomic_load_n(&sv->held_n, __ATOMIC_RELAXED);
    if (n == HOLD_MAX) {
        rpc_call_finish(call, ST_INTERNAL, "hold table full");
        return;
    }
    sv->held[n] = call;
    __atomic_store_n(&sv->held_n, n + 1, __ATOMIC_RELEASE);
}

static void hold_release(void *arg) { /* on the loop */
    svc *sv = arg;
    int n = __atomic_load_n(&sv->held_n, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++)
        rpc_call_finish(sv->held[i], rpc_call_send(sv->held[i], ST_SLICE_LIT("ok")), NULL);
    __atomic_store_n(&sv->held_n, 0, __ATOMIC_RELEASE);
}

/* Streams FLOOD_MSG-byte messages while the call is writable, waiting for room otherwise,
 * until the client goes away. flood_waiting counts the calls that had to wait. */
#define FLOOD_MSG ((size_t)64 << 10)
static int flood_waiting; /* atomic for the test thread */

typedef struct flood {
    bool waited;
} flood;

static void flood_cancel(rpc_call *call, void *arg) {
    free(arg);
    rpc_call_finish(call, ST_CANCELLED, NULL); /* gives the handler's reference back */
}

static void flood_pump(rpc_call *call, void *arg) {
    static uint8_t msg[FLOOD_MSG];
    flood *fl = arg;
    while (rpc_call_writable(call))
        if (rpc_call_send(call, st_slice_make(msg, sizeof msg)) != ST_OK)
            break;
    if (!fl->waited) {
        fl->waited = true;
        __atomic_fetch_add(&flood_waiting, 1, __ATOMIC_RELEASE);
        rpc_call_set_writable_cb(call, flood_pump, fl);
    }
}

/* One 1-byte gRPC message per stream; src->ptr points to the stream's "sent" flag. */
static ssize_t flood_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length,
                          uint32_t *flags, nghttp2_data_source *src, void *u) {
    (void)s;
    (void)sid;
    (void)u;
    static const uint8_t body[6] = {0, 0, 0, 0, 1, 'x'};
    bool *sent = src->ptr;
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (*sent || length < sizeof body)
        return 0;
    *sent = true;
    memcpy(buf, body, sizeof body);
    return (ssize_t)sizeof body;
}

static void h_flood(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    flood *fl = calloc(1, sizeof *fl);
    rpc_call_set_cancel_cb(call, flood_cancel, fl);
    flood_pump(call, fl);
}

typedef struct fixture {
    struct event_base *base;
    uint16_t port;
    pthread_t th;
    char addr[64];
    svc sv;
} fixture;

static void *loop_thread(void *arg) {
    fixture *f = arg;
    event_base_dispatch(f->base);
    return NULL;
}

static void fixture_setup(fixture *f) {
    st_err err = {0};
    f->base = event_base_new();
    assert_non_null(f->base);
    f->sv.srv = rpc_server_new(f->base, NULL, &err);
    assert_non_null(f->sv.srv);
    assert_int_equal(rpc_server_add_method(f->sv.srv, "/t.T/Echo", h_echo, &f->sv), ST_OK);
    assert_int_equal(rpc_server_add_method(f->sv.srv, "/t.T/Hold", h_hold, &f->sv), ST_OK);
    assert_int_equal(rpc_server_add_method(f->sv.srv, "/t.T/Flood", h_flood, NULL), ST_OK);
    assert_int_equal(rpc_server_listen(f->sv.srv, "127.0.0.1", 0, &f->port, &err), ST_OK);
    snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%u", f->port);
}

/* A server with limits l (applied for this server only: the defaults come back at stop). */
static fixture *fixture_start(const rpc_limits *l) {
    fixture *f = calloc(1, sizeof(*f));
    rpc_limits_set(l);
    fixture_setup(f);
    assert_int_equal(pthread_create(&f->th, NULL, loop_thread, f), 0);
    return f;
}

static void loop_stop(void *arg) {
    event_base_loopbreak(arg);
}

static void fixture_stop(fixture *f) {
    assert_int_equal(rpc_server_post(f->sv.srv, loop_stop, f->base), ST_OK);
    pthread_join(f->th, NULL);
    rpc_server_free(f->sv.srv);
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    event_base_free(f->base);
    free(f);
    rpc_limits d;
    rpc_limits_default(&d);
    rpc_limits_set(&d);
}

static rpc_server_stats stats_of(fixture *f) {
    rpc_server_stats st;
    rpc_server_stats_get(f->sv.srv, &st);
    return st;
}

/* Polls (up to a generous bound, no wall-clock assertion) until *v reaches want. */
static bool wait_u64(fixture *f, size_t off, uint64_t want) {
    for (int i = 0; i < 30000; i++) {
        rpc_server_stats st = stats_of(f);
        uint64_t v;
        memcpy(&v, (const char *)&st + off, sizeof v);
        if (v == want)
            return true;
        sleep_ms(1);
    }
    return false;
}
#define WAIT_STAT(f, field, want) wait_u64(f, offsetof(rpc_server_stats, field), want)

/* ---- raw sockets ---- */

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* A connection that sent the client preface and an empty SETTINGS frame. */
static int raw_ready_conn(uint16_t port) {
    int fd = raw_tcp_connect(port, 0);
    assert_true(fd >= 0);
    uint8_t settings[9] = {0, 0, 0, NGHTTP2_SETTINGS, 0, 0, 0, 0, 0};
    assert_int_equal(send(fd, preface, 24, MSG_NOSIGNAL), 24);
    assert_int_equal(send(fd, settings, 9, MSG_NOSIGNAL), 9);
    return fd;
}

/* Reads until the server closes: true on EOF (false: an error or the 30 s receive timeout).
 * *goaway: a GOAWAY frame was among the frames read. */
static bool read_to_eof(int fd, bool *goaway) {
    st_buf in;
    st_buf_init(&in);
    uint8_t buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        st_buf_append(&in, buf, (size_t)n);
    *goaway = false;
    for (size_t off = 0; off + 9 <= in.len;) {
        size_t len =
            ((size_t)in.data[off] << 16) | ((size_t)in.data[off + 1] << 8) | in.data[off + 2];
        if (in.data[off + 3] == NGHTTP2_GOAWAY)
            *goaway = true;
        off += 9 + len;
    }
    st_buf_free(&in);
    return n == 0;
}

static void send_ping(int fd) {
    uint8_t ping[17] = {0, 0, 8, NGHTTP2_PING, 0, 0, 0, 0, 0};
    assert_int_equal(send(fd, ping, sizeof ping, MSG_NOSIGNAL), (ssize_t)sizeof ping);
}

static void drain(int fd) {
    uint8_t buf[512];
    while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
        ;
}

/* Reads frames until a PING ACK (true) or the end of the connection (false). */
static bool ping_acked(int fd) {
    uint8_t hd[9], body[256];
    for (;;) {
        if (recv(fd, hd, 9, MSG_WAITALL) != 9)
            return false;
        size_t len = ((size_t)hd[0] << 16) | ((size_t)hd[1] << 8) | hd[2];
        for (size_t left = len; left > 0;) {
            size_t want = left < sizeof body ? left : sizeof body;
            if (recv(fd, body, want, MSG_WAITALL) != (ssize_t)want)
                return false;
            left -= want;
        }
        if (hd[3] == NGHTTP2_GOAWAY)
            return false;
        if (hd[3] == NGHTTP2_PING && (hd[4] & NGHTTP2_FLAG_ACK))
            return true;
    }
}

/* ---- async clients on the test thread ---- */

typedef struct results {
    int done, ok, exhausted;
    char message[256];
} results;

static void on_unary(st_code code, const char *message, st_slice resp, void *arg) {
    (void)resp;
    results *r = arg;
    r->done++;
    if (code == ST_OK)
        r->ok++;
    if (code == ST_RESOURCE_EXHAUSTED) {
        r->exhausted++;
        snprintf(r->message, sizeof r->message, "%s", message ? message : "");
    }
}

/* Turns base until cond(arg) holds (or a generous bound passes). */
static bool run_until(struct event_base *base, bool (*cond)(void *), void *arg) {
    for (int i = 0; i < 30000 && !cond(arg); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    return cond(arg);
}

typedef struct mem_ctx {
    fixture *f;
    results r;
    int calls;
} mem_ctx;

static bool mem_settled(void *arg) { /* every call is either held or ended */
    mem_ctx *m = arg;
    return __atomic_load_n(&m->f->sv.held_n, __ATOMIC_ACQUIRE) + m->r.done == m->calls;
}

static bool mem_all_done(void *arg) {
    mem_ctx *m = arg;
    return m->r.done == m->calls;
}

/* ---- tests ---- */

static void test_rpc_limits_flags(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    st_err err = {0};
    assert_int_equal(rpc_limits_flag(&l, "--max-buffered-request-bytes", "64m", &err), 1);
    assert_int_equal(l.buffered_request_bytes_max, (size_t)64 << 20);
    assert_int_equal(rpc_limits_flag(&l, "--max-connections", "500", &err), 1);
    assert_int_equal(l.connections_max, 500);
    assert_int_equal(rpc_limits_flag(&l, "--idle-timeout-s", "7", &err), 1);
    assert_int_equal(l.idle_timeout_ms, 7000);
    assert_int_equal(rpc_limits_flag(&l, "--handshake-timeout-ms", "250", &err), 1);
    assert_int_equal(l.handshake_timeout_ms, 250);
    assert_int_equal(rpc_limits_flag(&l, "--slow-client-timeout-ms", "0", &err), 1);
    assert_int_equal(l.slow_request_window_ms, 0);
    assert_int_equal(rpc_limits_flag(&l, "--min-request-bytes-per-s", "2k", &err), 1);
    assert_int_equal(l.request_bytes_per_s_min, 2048);
    assert_int_equal(rpc_limits_flag(&l, "--max-queued-response-bytes", "1m", &err), 1);
    assert_int_equal(l.queued_response_bytes_max, (size_t)1 << 20);
    assert_int_equal(rpc_limits_flag(&l, "--poll-us", "5", &err), 0);
    assert_int_equal(rpc_limits_flag(&l, "--max-connections", "0", &err), -1);
    assert_non_null(strstr(err.msg, "--max-connections"));
    assert_int_equal(rpc_limits_flag(&l, "--idle-timeout-s", "-1", &err), -1);
    assert_int_equal(rpc_limits_flag(&l, "--max-buffered-request-bytes", "12q", &err), -1);
    assert_int_equal(rpc_limits_flag(&l, "--max-buffered-request-bytes", NULL, &err), -1);
}

/* --max-header-bytes, --max-message-bytes and --max-streams-per-connection: parsed with their
 * bounds, and a server made after rpc_limits_set applies the first two to requests (the
 * stream limit goes out in SETTINGS: nghttp2 refuses streams past it). */
static void test_rpc_limits_size_flags(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    st_err err = {0};
    assert_int_equal(l.header_bytes_max, RPC_HEADER_BYTES_MAX);
    assert_int_equal(l.streams_per_conn_max, RPC_STREAMS_MAX_DEFAULT);
    assert_int_equal(rpc_limits_flag(&l, "--max-streams-per-connection", "8", &err), 1);
    assert_int_equal(l.streams_per_conn_max, 8);
    assert_int_equal(rpc_limits_flag(&l, "--max-streams-per-connection", "0", &err), -1);
    assert_int_equal(rpc_limits_flag(&l, "--max-header-bytes", "1k", &err), -1);
    assert_non_null(strstr(err.msg, "--max-header-bytes"));
    /* Above 64 KiB nghttp2 could not decode one large value (it closes the connection): refused
     * at startup, saying why. */
    assert_int_equal(rpc_limits_flag(&l, "--max-header-bytes", "64k", &err), 1);
    assert_int_equal(l.header_bytes_max, RPC_HEADER_BYTES_LIMIT);
    assert_int_equal(rpc_limits_flag(&l, "--max-header-bytes", "65537", &err), -1);
    assert_int_equal(rpc_limits_flag(&l, "--max-header-bytes", "1m", &err), -1);
    assert_non_null(strstr(err.msg, "--max-header-bytes"));
    assert_non_null(strstr(err.msg, "65536"));
    assert_non_null(strstr(err.msg, "single metadata name or value longer than 64 KiB"));
    assert_int_equal(l.header_bytes_max, RPC_HEADER_BYTES_LIMIT);
    assert_int_equal(rpc_limits_flag(&l, "--max-header-bytes", "8k", &err), 1);
    assert_int_equal(rpc_limits_flag(&l, "--max-message-bytes", "4k", &err), 1);
    assert_int_equal(l.message_bytes_max, 4096);
    fixture *f = fixture_start(&l);
    static char big[16 << 10];
    memset(big, 'a', sizeof big - 1);
    rpc_metadata md = {"x-big", big};
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), &md, 1,
                                        10000, NULL, &status),
                     ST_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(status.msg, "--max-header-bytes"));
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, 5000), NULL,
                                        0, 10000, NULL, &status),
                     ST_RESOURCE_EXHAUSTED);
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, 4000), NULL,
                                        0, 10000, NULL, &status),
                     ST_OK);
    fixture_stop(f);
}

/* One raw call on s (with r's body) and the optional x-big metadata; its grpc-status. */
static int raw_echo(nghttp2_session *s, raw_call *r, const char *big) {
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/t.T/Echo", 5, 9, 0},
        {(uint8_t *)":authority", (uint8_t *)"localhost", 10, 9, 0},
        {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, 0},
        {(uint8_t *)"x-big", (uint8_t *)big, 5, big ? strlen(big) : 0, 0},
    };
    r->closed = false;
    r->grpc_status = -1;
    r->body_off = 0;
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, big ? 6 : 5, &prd, NULL) > 0);
    uint8_t buf[16384];
    while (!r->closed) {
        if (nghttp2_session_send(s) != 0)
            break;
        ssize_t n = recv(r->fd, buf, sizeof buf, 0);
        if (n <= 0 || nghttp2_session_mem_recv(s, buf, (size_t)n) < 0)
            break;
    }
    return r->grpc_status;
}

/* One metadata value of 70,000 characters, past --max-header-bytes, on a connection: an HPACK
 * encoder Huffman-codes it (about 44 KB on the wire, under nghttp2's 64 KiB per-string decoder
 * limit), so only its call ends, RESOURCE_EXHAUSTED, and the next call on the same connection
 * is served. */
static void test_rpc_limits_one_large_value(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    fixture *f = fixture_start(&l);
    static char big[70001];
    memset(big, 'a', sizeof big - 1);
    static const uint8_t body[] = {0, 0, 0, 0, 1, 'x'};
    raw_call r = {.fd = raw_tcp_connect(f->port, 0), .body = body, .body_len = sizeof body};
    assert_true(r.fd >= 0);
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session_ex(&r, false, (size_t)1 << 20);
    assert_non_null(s);
    assert_int_equal(raw_echo(s, &r, big), ST_RESOURCE_EXHAUSTED);
    assert_int_equal(raw_echo(s, &r, NULL), ST_OK);
    assert_int_equal(stats_of(f).conns_open, 1);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
    fixture_stop(f);
}

/* Four concurrent 3 MiB requests on four connections against a budget of 8 MiB: each call
 * reserves its bytes as they arrive and is refused when they do not fit, giving its share back,
 * so exactly two complete (and are held by the handler) and two are refused; the budget is given
 * back when the calls end. */
static void test_rpc_limits_buffered_request_bytes(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.buffered_request_bytes_max = (size_t)8 << 20;
    fixture *f = fixture_start(&l);
    enum { N = 4 };
    size_t n = (size_t)3 << 20;
    uint8_t *big = calloc(1, n);
    struct event_base *base = event_base_new();
    rpc_client *c[N];
    mem_ctx m = {.f = f, .calls = N};
    for (int i = 0; i < N; i++) {
        c[i] = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
        assert_non_null(c[i]);
        assert_int_equal(rpc_client_unary(c[i], "/t.T/Hold", st_slice_make(big, n), NULL, 0, 60000,
                                          on_unary, &m.r),
                         ST_OK);
    }
    assert_true(run_until(base, mem_settled, &m));
    print_message("held=%d refused=%d: %s\n", __atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE),
                  m.r.exhausted, m.r.message);
    assert_int_equal(__atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE), 2);
    assert_int_equal(m.r.exhausted, 2);
    assert_non_null(strstr(m.r.message, "--max-buffered-request-bytes"));
    rpc_server_stats st = stats_of(f);
    assert_int_equal(st.calls_refused_memory, 2);
    assert_true(st.buffered_request_bytes >= 2 * n &&
                st.buffered_request_bytes <= l.buffered_request_bytes_max);
    /* The held calls complete; their reservations go back. */
    assert_int_equal(rpc_server_post(f->sv.srv, hold_release, &f->sv), ST_OK);
    assert_true(run_until(base, mem_all_done, &m));
    assert_int_equal(m.r.ok, 2);
    assert_true(WAIT_STAT(f, buffered_request_bytes, 0));
    /* The server is still up: a small call, and a large one that fits now. */
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("small"), NULL, 0,
                                        0, NULL, &status),
                     ST_OK);
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, n), NULL, 0,
                                        0, NULL, &status),
                     ST_OK);
    for (int i = 0; i < N; i++)
        rpc_client_free(c[i]);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    free(big);
    fixture_stop(f);
}

/* Sixteen streams, each with 48 KiB of metadata and a tiny message, against a budget of 256 KiB:
 * the metadata is reserved in the same budget as request messages, so only the streams whose
 * metadata fits are admitted (held by the handler), the others are refused with
 * RESOURCE_EXHAUSTED naming the flag, and the budget returns to 0 when the calls end. */
static void test_rpc_limits_metadata_bytes(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.buffered_request_bytes_max = (size_t)256 << 10;
    fixture *f = fixture_start(&l);
    enum { N = HOLD_MAX, MD = 3, MD_BYTES = 16 << 10 };
    static char val[MD][MD_BYTES];
    rpc_metadata md[MD];
    for (int i = 0; i < MD; i++) {
        memset(val[i], 'a' + i, MD_BYTES - 1);
        md[i].name = i == 0 ? "x-big-0" : i == 1 ? "x-big-1" : "x-big-2";
        md[i].value = val[i];
    }
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    assert_non_null(c);
    mem_ctx m = {.f = f, .calls = N};
    for (int i = 0; i < N; i++)
        assert_int_equal(
            rpc_client_unary(c, "/t.T/Hold", ST_SLICE_LIT("x"), md, MD, 60000, on_unary, &m.r),
            ST_OK);
    assert_true(run_until(base, mem_settled, &m));
    int held = __atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE);
    rpc_server_stats st = stats_of(f);
    print_message("held=%d refused=%d buffered=%llu: %s\n", held, m.r.exhausted,
                  (unsigned long long)st.buffered_request_bytes, m.r.message);
    assert_true(held >= 1 && held <= 6);
    assert_int_equal(m.r.exhausted, N - held);
    assert_non_null(strstr(m.r.message, "--max-buffered-request-bytes"));
    assert_true(st.buffered_request_bytes > 0 &&
                st.buffered_request_bytes <= l.buffered_request_bytes_max);
    assert_int_equal(rpc_server_post(f->sv.srv, hold_release, &f->sv), ST_OK);
    assert_true(run_until(base, mem_all_done, &m));
    assert_int_equal(m.r.ok, held);
    assert_true(WAIT_STAT(f, buffered_request_bytes, 0));
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("small"), md, MD,
                                        0, NULL, &status),
                     ST_OK);
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* Eight streaming calls whose client never reads, against a queued-response budget of 256 KiB
 * (each call's own bound is 1 MiB): once every call waits for room, the process's queued bytes
 * are within the budget plus one message per call, instead of eight times the per-call bound;
 * they return to 0 when the client goes away. */
static void test_rpc_limits_queued_response_bytes(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.queued_response_bytes_max = (size_t)256 << 10;
    fixture *f = fixture_start(&l);
    enum { N = 8 };
    __atomic_store_n(&flood_waiting, 0, __ATOMIC_RELEASE);
    raw_call r = {.fd = raw_tcp_connect(f->port, 4096), .grpc_status = -1};
    assert_true(r.fd >= 0);
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, false);
    assert_non_null(s);
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/t.T/Flood", 5, 10, 0},
        {(uint8_t *)":authority", (uint8_t *)"localhost", 10, 9, 0},
        {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, 0},
    };
    bool sent[N] = {0};
    for (int i = 0; i < N; i++) {
        nghttp2_data_provider prd = {.source.ptr = &sent[i], .read_callback = flood_body};
        assert_true(nghttp2_submit_request(s, NULL, nva, 5, &prd, NULL) > 0);
    }
    assert_int_equal(nghttp2_session_send(s), 0); /* and never reads */
    for (int i = 0; i < 30000 && __atomic_load_n(&flood_waiting, __ATOMIC_ACQUIRE) < N; i++)
        sleep_ms(1);
    assert_int_equal(__atomic_load_n(&flood_waiting, __ATOMIC_ACQUIRE), N);
    size_t queued = rpc_queued_response_bytes();
    print_message("queued=%zu (budget %zu)\n", queued, l.queued_response_bytes_max);
    assert_true(queued <= l.queued_response_bytes_max + N * (FLOOD_MSG + 5));
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
    assert_true(WAIT_STAT(f, calls_active, 0));
    assert_int_equal(rpc_queued_response_bytes(), 0);
    fixture_stop(f);
}

/* ---- a client pausing one call (rpc_ccall_pause) ---- */

#define PAUSE_AFTER ((size_t)1 << 20)     /* bytes received before the client pauses */
#define RESUMED_MORE ((size_t)4 << 20)    /* bytes it must receive after resuming */
#define CLIENT_WINDOW ((size_t)256 << 10) /* the client's stream window (rpc_ccall_pause) */

typedef struct pause_ctx {
    size_t pause_after; /* bytes received before the client pauses the call */
    size_t got, at_pause;
    bool paused, done;
    st_code code;
} pause_ctx;

static void pause_msg(rpc_ccall *call, st_slice msg, void *arg) {
    pause_ctx *p = arg;
    p->got += msg.len;
    if (!p->paused && p->got >= p->pause_after) {
        p->paused = true;
        p->at_pause = p->got;
        rpc_ccall_pause(call);
    }
}

static void pause_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    pause_ctx *p = arg;
    p->done = true;
    p->code = code;
}

/* Turns the client's loop until pred(p) holds (bounded: a hang guard, not a deadline). */
static bool pause_spin(struct event_base *base, pause_ctx *p, bool (*pred)(const pause_ctx *)) {
    for (int i = 0; i < 30000 && !pred(p); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    return pred(p);
}

static bool pause_is_paused(const pause_ctx *p) {
    return p->paused || p->done;
}
static bool pause_resumed_enough(const pause_ctx *p) {
    return p->done || p->got >= p->at_pause + CLIENT_WINDOW + RESUMED_MORE;
}
static bool pause_is_done(const pause_ctx *p) {
    return p->done;
}

/* A paused call gets at most its stream window more (the server's stream stalls: no reset, the
 * call stays open) and, resumed, streams on. The server floods 64 KiB messages for as long as
 * the client takes them. */
static void test_rpc_client_pause(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    fixture *f = fixture_start(&l);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    assert_non_null(c);
    pause_ctx p = {.pause_after = PAUSE_AFTER};
    rpc_ccall *call =
        rpc_client_call(c, "/t.T/Flood", ST_SLICE_LIT("x"), NULL, 0, 0, pause_msg, pause_done, &p);
    assert_non_null(call);
    assert_true(pause_spin(base, &p, pause_is_paused));
    assert_false(p.done);
    /* Until nothing more arrives: the server has used up the window it was given. */
    size_t last = p.got;
    for (int quiet = 0, i = 0; quiet < 300 && i < 30000 && !p.done; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        quiet = p.got == last ? quiet + 1 : 0;
        last = p.got;
        sleep_ms(1);
    }
    print_message("received %zu bytes before the pause, %zu after it\n", p.at_pause,
                  p.got - p.at_pause);
    assert_false(p.done);
    assert_true(p.got - p.at_pause <= CLIENT_WINDOW + 2 * (FLOOD_MSG + 5));
    assert_int_equal(stats_of(f).calls_cancelled, 0); /* stalled, not reset */
    assert_int_equal(stats_of(f).calls_active, 1);
    rpc_ccall_resume(call);
    assert_true(pause_spin(base, &p, pause_resumed_enough));
    assert_false(p.done);
    rpc_ccall_cancel(call);
    assert_true(pause_spin(base, &p, pause_is_done));
    assert_int_equal(p.code, ST_CANCELLED);
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    assert_true(WAIT_STAT(f, calls_active, 0));
    fixture_stop(f);
}

static bool pause_b_flowed(const pause_ctx *p) {
    return p->done || p->got >= ((size_t)8 << 20);
}

/* One call whose client stopped reading fills the queued-response budget (256 KiB: its own queue
 * alone passes it); another call of the same client, read as it comes, keeps streaming: past the
 * budget a call holding nothing still queues one message at a time. The process's queued bytes
 * stay within the stalled call's own bound plus the budget and a message or two. */
static void test_rpc_limits_reader_served_past_budget(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.queued_response_bytes_max = (size_t)256 << 10;
    fixture *f = fixture_start(&l);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    assert_non_null(c);
    pause_ctx a = {.pause_after = 1}, b = {.pause_after = SIZE_MAX};
    rpc_ccall *ca =
        rpc_client_call(c, "/t.T/Flood", ST_SLICE_LIT("x"), NULL, 0, 0, pause_msg, pause_done, &a);
    assert_non_null(ca);
    assert_true(pause_spin(base, &a, pause_is_paused));
    for (int i = 0; i < 30000 && rpc_queued_response_bytes() < l.queued_response_bytes_max; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    assert_true(rpc_queued_response_bytes() >= l.queued_response_bytes_max);
    rpc_ccall *cb =
        rpc_client_call(c, "/t.T/Flood", ST_SLICE_LIT("x"), NULL, 0, 0, pause_msg, pause_done, &b);
    assert_non_null(cb);
    assert_true(pause_spin(base, &b, pause_b_flowed));
    assert_false(a.done);
    assert_false(b.done);
    size_t queued = rpc_queued_response_bytes();
    print_message("a reader got %zu bytes while the budget was full; queued=%zu\n", b.got, queued);
    assert_true(queued <= ((size_t)1 << 20) + l.queued_response_bytes_max + 3 * (FLOOD_MSG + 5));
    rpc_ccall_cancel(ca);
    rpc_ccall_cancel(cb);
    assert_true(pause_spin(base, &a, pause_is_done));
    assert_true(pause_spin(base, &b, pause_is_done));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    assert_true(WAIT_STAT(f, calls_active, 0));
    assert_int_equal(rpc_queued_response_bytes(), 0);
    fixture_stop(f);
}

static bool one_done(void *arg) {
    return ((results *)arg)->done == 1;
}

/* Turns base (a client's loop) until the handler holds n calls (or a generous bound passes). */
static bool held_reach(struct event_base *base, fixture *f, int n) {
    for (int i = 0; i < 30000 && __atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE) < n; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    return __atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE) == n;
}

/* Past the connection limit with a call open on every connection, a new connection gets
 * SETTINGS + GOAWAY and is closed (nothing is idle, nothing is closed for it); once the calls
 * ended, new ones are served again. */
static void test_rpc_limits_connection_limit(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.connections_max = 3;
    fixture *f = fixture_start(&l);
    struct event_base *base = event_base_new();
    rpc_client *c[3];
    results r = {0};
    for (int i = 0; i < 3; i++) {
        c[i] = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
        assert_non_null(c[i]);
        assert_int_equal(
            rpc_client_unary(c[i], "/t.T/Hold", ST_SLICE_LIT("h"), NULL, 0, 60000, on_unary, &r),
            ST_OK);
    }
    assert_true(held_reach(base, f, 3));
    assert_int_equal(stats_of(f).conns_open, 3);
    int extra = raw_tcp_connect(f->port, 0);
    assert_true(extra >= 0);
    bool goaway;
    assert_true(read_to_eof(extra, &goaway));
    assert_true(goaway);
    close(extra);
    assert_int_equal(stats_of(f).conns_refused, 1);
    assert_int_equal(stats_of(f).conns_evicted, 0);
    assert_int_equal(rpc_server_post(f->sv.srv, hold_release, &f->sv), ST_OK);
    for (int i = 0; i < 30000 && r.done < 3; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    assert_int_equal(r.ok, 3);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0, 0,
                                        NULL, &status),
                     ST_OK);
    for (int i = 0; i < 3; i++)
        rpc_client_free(c[i]);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* At the connection limit a crowd of idle connections does not lock new clients out. A
 * connection still in its handshake goes first, whatever its age against the established ones;
 * then the established connection idle the longest (no call open, nothing heard for the longest
 * time) is closed with a GOAWAY to admit the new one. A PING counts as hearing from the peer, a
 * connection with a call open is never closed, and nothing is refused. */
static void test_rpc_limits_connection_limit_evicts_idle(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.connections_max = 4;
    fixture *f = fixture_start(&l);
    struct event_base *base = event_base_new();
    rpc_client *busy = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    assert_non_null(busy);
    results r = {0};
    assert_int_equal(
        rpc_client_unary(busy, "/t.T/Hold", ST_SLICE_LIT("h"), NULL, 0, 60000, on_unary, &r),
        ST_OK);
    assert_true(held_reach(base, f, 1));
    int a = raw_ready_conn(f->port);
    send_ping(a);
    assert_true(ping_acked(a));
    int b = raw_ready_conn(f->port);
    send_ping(b);
    assert_true(ping_acked(b));
    int hs = raw_tcp_connect(f->port, 0); /* sends nothing: still in its handshake */
    assert_true(hs >= 0);
    assert_true(WAIT_STAT(f, conns_open, 4));
    send_ping(a); /* a was heard last: b has been idle longest of the established ones */
    assert_true(ping_acked(a));
    bool goaway;
    int n1 = raw_ready_conn(f->port); /* hs, the youngest, goes: it never finished its handshake */
    assert_true(read_to_eof(hs, &goaway));
    assert_true(WAIT_STAT(f, conns_evicted, 1));
    send_ping(n1);
    assert_true(ping_acked(n1));
    int n2 = raw_ready_conn(f->port); /* every connection established: b, idle longest, goes */
    assert_true(read_to_eof(b, &goaway));
    assert_true(goaway);
    assert_true(WAIT_STAT(f, conns_evicted, 2));
    send_ping(n2);
    assert_true(ping_acked(n2));
    st_err status = {0}; /* a client's call: a is idle longest now */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0, 0,
                                        NULL, &status),
                     ST_OK);
    assert_true(read_to_eof(a, &goaway));
    assert_true(goaway);
    assert_int_equal(stats_of(f).conns_evicted, 3);
    assert_int_equal(stats_of(f).conns_refused, 0);
    /* The busy connection kept its call through it all. */
    send_ping(n1);
    assert_true(ping_acked(n1));
    assert_int_equal(rpc_server_post(f->sv.srv, hold_release, &f->sv), ST_OK);
    assert_true(run_until(base, one_done, &r));
    assert_int_equal(r.ok, 1);
    close(a);
    close(b);
    close(hs);
    close(n1);
    close(n2);
    rpc_client_free(busy);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* A flood of TCP connections that never send the HTTP/2 preface, at the connection limit, only
 * displaces itself (oldest first): established clients idle between calls keep their
 * connections. Before, each new socket closed the longest idle connection, which was the
 * established client's, so a connect flood cut legitimate clients off. */
static void test_rpc_limits_connect_flood_spares_established(void **state) {
    (void)state;
    enum { FLOOD = 24 };
    rpc_limits l;
    rpc_limits_default(&l);
    l.connections_max = 4;
    fixture *f = fixture_start(&l);
    int legit[2];
    for (int i = 0; i < 2; i++) {
        legit[i] = raw_ready_conn(f->port);
        send_ping(legit[i]);
        assert_true(ping_acked(legit[i]));
    }
    int mute[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        mute[i] = raw_tcp_connect(f->port, 0); /* sends nothing */
        assert_true(mute[i] >= 0);
        assert_true(WAIT_STAT(f, conns_accepted, (uint64_t)(2 + i + 1)));
    }
    assert_true(WAIT_STAT(f, conns_evicted, FLOOD - 2));
    assert_int_equal(stats_of(f).conns_refused, 0);
    for (int i = 0; i < 2; i++) { /* both established connections still served */
        send_ping(legit[i]);
        assert_true(ping_acked(legit[i]));
    }
    bool goaway;
    for (int i = 0; i < FLOOD - 2; i++) /* the oldest flood sockets were closed */
        assert_true(read_to_eof(mute[i], &goaway));
    uint8_t byte;
    for (int i = FLOOD - 2; i < FLOOD; i++) { /* the two newest are still open */
        drain(mute[i]);
        assert_int_equal(recv(mute[i], &byte, 1, MSG_DONTWAIT), -1);
    }
    assert_int_equal(stats_of(f).conns_open, 4);
    for (int i = 0; i < FLOOD; i++)
        close(mute[i]);
    for (int i = 0; i < 2; i++)
        close(legit[i]);
    fixture_stop(f);
}

/* A connection without calls or traffic is closed after the idle timeout; one with a call open
 * (held longer than the timeout), or one sending PINGs, is not. */
static void test_rpc_limits_idle_timeout(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.idle_timeout_ms = 300;
    fixture *f = fixture_start(&l);
    struct event_base *base = event_base_new();
    rpc_client *busy = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    results r = {0};
    assert_int_equal(
        rpc_client_unary(busy, "/t.T/Hold", ST_SLICE_LIT("h"), NULL, 0, 60000, on_unary, &r),
        ST_OK);
    while (__atomic_load_n(&f->sv.held_n, __ATOMIC_ACQUIRE) == 0) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    int pinger = raw_ready_conn(f->port); /* no calls, but PINGs: traffic */
    int fd = raw_ready_conn(f->port);
    bool eof = false;
    for (int i = 0; i < 3000 && !eof; i++) { /* until the idle one is closed */
        send_ping(pinger);
        sleep_ms(10);
        drain(pinger);
        uint8_t buf[512];
        ssize_t n;
        while ((n = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
            ;
        eof = n == 0;
    }
    assert_true(eof); /* the idle one: closed */
    close(fd);
    /* The pinging one, older, is still served: its PING is answered. */
    send_ping(pinger);
    assert_true(ping_acked(pinger));
    close(pinger);
    assert_int_equal(stats_of(f).conns_idle_closed, 1);
    /* The busy one, older than the idle one, still has its call. */
    assert_int_equal(rpc_server_post(f->sv.srv, hold_release, &f->sv), ST_OK);
    assert_true(run_until(base, one_done, &r));
    assert_int_equal(r.ok, 1);
    rpc_client_free(busy);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* Connections that send nothing, or half the preface, are closed after the handshake timeout. */
static void test_rpc_limits_handshake_timeout(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.handshake_timeout_ms = 300;
    fixture *f = fixture_start(&l);
    int silent = raw_tcp_connect(f->port, 0);
    int partial = raw_tcp_connect(f->port, 0);
    assert_true(silent >= 0 && partial >= 0);
    assert_int_equal(send(partial, preface, 10, MSG_NOSIGNAL), 10);
    bool goaway;
    assert_true(read_to_eof(silent, &goaway));
    assert_true(read_to_eof(partial, &goaway));
    close(silent);
    close(partial);
    assert_int_equal(stats_of(f).conns_handshake_closed, 2);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0, 0,
                                        NULL, &status),
                     ST_OK);
    fixture_stop(f);
}

/* Sends the first 10 bytes of the body, then nothing more (never END_STREAM). */
static ssize_t trickle_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *u) {
    (void)s;
    (void)sid;
    (void)flags;
    (void)src;
    raw_call *r = u;
    if (r->body_off > 0)
        return NGHTTP2_ERR_DEFERRED;
    size_t n = length < 10 ? length : 10;
    memcpy(buf, r->body, n);
    r->body_off = n;
    return (ssize_t)n;
}

/* A request announcing 100 KB that stops after 10 bytes ends with RESOURCE_EXHAUSTED after the
 * slow-request window; a request stalled inside its header block closes the connection. */
static void test_rpc_limits_slow_request(void **state) {
    (void)state;
    rpc_limits l;
    rpc_limits_default(&l);
    l.slow_request_window_ms = 300;
    fixture *f = fixture_start(&l);
    uint8_t body[64] = {0};
    rpc_frame_prefix(body, 100000);
    raw_call r = {
        .fd = raw_tcp_connect(f->port, 0), .body = body, .body_len = 100005, .grpc_status = -1};
    assert_true(r.fd >= 0);
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, false);
    assert_non_null(s);
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)"/t.T/Echo", 5, 9, 0},
        {(uint8_t *)":authority", (uint8_t *)"localhost", 10, 9, 0},
        {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, 0},
    };
    nghttp2_data_provider prd = {.read_callback = trickle_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 5, &prd, NULL) > 0);
    uint8_t buf[16384];
    while (!r.closed) {
        if (nghttp2_session_send(s) != 0)
            break;
        ssize_t n = recv(r.fd, buf, sizeof(buf), 0);
        if (n <= 0 || nghttp2_session_mem_recv(s, buf, (size_t)n) < 0)
            break;
    }
    assert_true(r.closed);
    assert_int_equal(r.grpc_status, ST_RESOURCE_EXHAUSTED);
    assert_int_equal(stats_of(f).calls_slow, 1);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
    /* A HEADERS frame whose header block never ends (no END_HEADERS, no CONTINUATION): HTTP/2
     * lets nothing else through on that connection, so it is closed. */
    int fd = raw_ready_conn(f->port);
    uint8_t headers[10] = {0, 0, 1, NGHTTP2_HEADERS, 0, 0, 0, 0, 1, 0x83}; /* :method POST */
    assert_int_equal(send(fd, headers, sizeof headers, MSG_NOSIGNAL), (ssize_t)sizeof headers);
    bool goaway;
    assert_true(read_to_eof(fd, &goaway));
    close(fd);
    assert_int_equal(stats_of(f).calls_slow, 2);
    fixture_stop(f);
}

/* ---- out of file descriptors, in a forked child ---- */

static int log_lines; /* the child's lines mentioning accept (its loop thread only) */

static void count_sink(st_log_level level, const char *module, const char *line, void *arg) {
    (void)level;
    (void)module;
    (void)arg;
    if (strstr(line, "accept"))
        log_lines++;
}

/* Replies "accept_errors log_lines". */
static void h_stats(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    rpc_server_stats st;
    rpc_server_stats_get(arg, &st);
    char out[64];
    snprintf(out, sizeof out, "%llu %d", (unsigned long long)st.accept_errors, log_lines);
    rpc_call_finish(call, rpc_call_send(call, st_slice_cstr(out)), NULL);
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 64;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The child: a server allowed only a few descriptors more than it starts with. Writes its port
 * to wfd, then serves until killed. */
static void emfile_child(int wfd) {
    rpc_limits l;
    rpc_limits_default(&l);
    l.connections_max = 100000; /* so the descriptors run out first */
    rpc_limits_set(&l);
    st_log_set_sink(count_sink, NULL);
    fixture f = {0};
    f.base = event_base_new();
    st_err err = {0};
    f.sv.srv = rpc_server_new(f.base, NULL, &err);
    if (!f.sv.srv || rpc_server_add_method(f.sv.srv, "/t.T/Echo", h_echo, &f.sv) != ST_OK ||
        rpc_server_add_method(f.sv.srv, "/t.T/Stats", h_stats, f.sv.srv) != ST_OK ||
        rpc_server_listen(f.sv.srv, "127.0.0.1", 0, &f.port, &err) != ST_OK)
        _exit(3);
    struct rlimit rl = {(rlim_t)open_fds() + 12, (rlim_t)open_fds() + 12};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        _exit(4);
    if (write(wfd, &f.port, sizeof f.port) != sizeof f.port)
        _exit(5);
    close(wfd);
    event_base_dispatch(f.base);
    _exit(0);
}

typedef struct stats_reply {
    int done;
    st_code code;
    char text[64];
} stats_reply;

static void on_stats(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    stats_reply *r = arg;
    r->code = code;
    memcpy(r->text, resp.data, resp.len < sizeof r->text - 1 ? resp.len : sizeof r->text - 1);
    r->done = 1;
}

static bool stats_done(void *arg) {
    return ((stats_reply *)arg)->done;
}

/* Over c's one connection, accepted before the descriptors ran out. False when it failed. */
static bool stats_call(struct event_base *base, rpc_client *c, unsigned long long *errors,
                       int *lines) {
    stats_reply r = {0};
    if (rpc_client_unary(c, "/t.T/Stats", ST_SLICE_LIT("s"), NULL, 0, 30000, on_stats, &r) != ST_OK)
        return false;
    return run_until(base, stats_done, &r) && r.code == ST_OK &&
           sscanf(r.text, "%llu %d", errors, lines) == 2;
}

static long child_cpu_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
        return -1;
    return ut + st;
}

#define FLOOD 40

typedef struct emfile_result {
    bool stats_ok; /* both Stats calls answered */
    bool flood_ok; /* every flooding connection was made */
    unsigned long long errors_before, errors;
    int lines;
    st_code recovered; /* a new connection's call once descriptors were free */
} emfile_result;

/* The parent's side: no assertions here, so the child is always killed before they run. */
static void emfile_drive(pid_t pid, uint16_t port, emfile_result *r) {
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", port, NULL, NULL);
    int lines0;
    r->stats_ok = c && stats_call(base, c, &r->errors_before, &lines0);
    int fds[FLOOD];
    r->flood_ok = true;
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = raw_tcp_connect(port, 0); /* completes in the kernel's backlog */
        r->flood_ok = r->flood_ok && fds[i] >= 0;
    }
    long cpu0 = child_cpu_ticks(pid);
    sleep_ms(1000); /* the child is out of descriptors meanwhile */
    long cpu1 = child_cpu_ticks(pid);
    r->stats_ok = r->stats_ok && stats_call(base, c, &r->errors, &r->lines);
    print_message("out of descriptors for 1 s: accept errors=%llu log lines=%d child cpu=%ld "
                  "ticks\n",
                  r->errors, r->lines, cpu1 - cpu0);
    for (int i = 0; i < FLOOD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    /* Descriptors free again: served (after the current pause, at most a few seconds). */
    st_err status = {0};
    r->recovered = ST_UNAVAILABLE;
    for (int i = 0; i < 100 && r->recovered != ST_OK; i++) {
        r->recovered = rpc_blocking_unary(addr, NULL, "/t.T/Echo", ST_SLICE_LIT("back"), NULL, 0,
                                          30000, NULL, &status);
        if (r->recovered != ST_OK)
            sleep_ms(50);
    }
    if (c)
        rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
}

/* With its descriptors used up the server neither spins in accept nor floods the log, and it
 * accepts again once descriptors are free. Without the pause, each failed accept was retried at
 * once and logged ("Error from accept() call"): millions of lines in seconds. */
static void test_rpc_limits_out_of_descriptors(void **state) {
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        emfile_child(p[1]);
    }
    close(p[1]);
    uint16_t port = 0;
    bool started = read(p[0], &port, sizeof port) == (ssize_t)sizeof port;
    close(p[0]);
    emfile_result r = {0};
    if (started)
        emfile_drive(pid, port, &r);
    kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
    assert_true(started);
    assert_true(r.stats_ok);
    assert_true(r.flood_ok);
    assert_int_equal(r.errors_before, 0);
    assert_true(r.lines <= 3);   /* one line per 10 s and call site */
    assert_true(r.errors >= 1);  /* it did run out */
    assert_true(r.errors <= 50); /* paused: a spinning accept fails ~10^5 times a second */
    assert_int_equal(r.recovered, ST_OK);
}

int main(void) {
    /* As strata-node and strata-router do: a peer that closed (a refused or timed-out client
     * connection of these tests) must not kill the in-process server that writes to it. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_limits_out_of_descriptors),
        cmocka_unit_test(test_rpc_limits_flags),
        cmocka_unit_test(test_rpc_limits_buffered_request_bytes),
        cmocka_unit_test(test_rpc_limits_metadata_bytes),
        cmocka_unit_test(test_rpc_limits_queued_response_bytes),
        cmocka_unit_test(test_rpc_client_pause),
        cmocka_unit_test(test_rpc_limits_reader_served_past_budget),
        cmocka_unit_test(test_rpc_limits_connection_limit),
        cmocka_unit_test(test_rpc_limits_connection_limit_evicts_idle),
        cmocka_unit_test(test_rpc_limits_connect_flood_spares_established),
        cmocka_unit_test(test_rpc_limits_idle_timeout),
        cmocka_unit_test(test_rpc_limits_handshake_timeout),
        cmocka_unit_test(test_rpc_limits_slow_request),
        cmocka_unit_test(test_rpc_limits_size_flags),
        cmocka_unit_test(test_rpc_limits_one_large_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
