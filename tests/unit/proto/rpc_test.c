/* rpc_test proves the gRPC-over-HTTP/2 layer end to end: a real server on a loopback ephemeral
 * port (its event_base on a background thread) and real clients in this process — the async
 * client on a main-thread event_base, the blocking helpers, and a raw nghttp2 client that shapes
 * DATA frames by hand (split messages, truncated prefixes, compressed flags, wrong headers).
 * It checks framing, unary and streaming calls, many streams per connection, flow control with a
 * slow reader (the server's queue stays bounded), deadlines, cancellation, size limits, bad input
 * that must end one stream or one connection while others are still served, and TLS with ALPN h2
 * on a certificate generated at run time. No wall-clock performance assertions. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "raw_h2.h"
#include "frame.h" /* the deframer and wire encodings (private to proto/rpc) */
#include "strata/rpc.h"

/* ---- small helpers ---- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (without a wall-clock assertion: up to a generous bound) for *flag to become non-zero. */
static bool wait_flag(int *flag) {
    for (int i = 0; i < 30000; i++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE))
            return true;
        sleep_ms(1);
    }
    return false;
}

/* ---- the test service ---- */

typedef struct svc_state {
    int never_started;
    int never_cancelled;
    int stream_cancelled;
    uint64_t stream_produced; /* bytes queued by the streaming handler */
    rpc_server *srv;
} svc_state;

static void h_echo(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    rpc_call_finish(call, rpc_call_send(call, req), NULL);
}

/* Replies with the x-goog-request-params and authorization metadata, "|"-joined. */
static void h_meta(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    const char *a = rpc_call_header(call, "x-goog-request-params");
    const char *b = rpc_call_header(call, "authorization");
    char out[512];
    snprintf(out, sizeof(out), "%s|%s|%s", a ? a : "-", b ? b : "-", rpc_call_path(call));
    rpc_call_send(call, st_slice_cstr(out));
    rpc_call_finish(call, ST_OK, NULL);
}

static void h_fail(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    rpc_call_finish(call, ST_NOT_FOUND,
                    "row \xc3\xbc"
                    "ber 100% gone\nnext line");
}

static void never_cancel(rpc_call *call, void *arg) {
    svc_state *st = arg;
    __atomic_store_n(&st->never_cancelled, 1, __ATOMIC_RELEASE);
    rpc_call_send(call, ST_SLICE_LIT("late")); /* must be a safe no-op */
    rpc_call_finish(call, ST_OK, NULL);        /* releases the handler's reference */
}

static void h_never(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    svc_state *st = arg;
    rpc_call_set_cancel_cb(call, never_cancel, st);
    __atomic_store_n(&st->never_started, 1, __ATOMIC_RELEASE);
}

/* Server streaming: request = total bytes (8, LE) + chunk bytes (4, LE). Produces only while the
 * call is writable, resuming from the writable callback. */
typedef struct stream_job {
    svc_state *st;
    uint64_t total, sent;
    uint32_t chunk;
    uint8_t *buf;
} stream_job;

static void stream_job_end(rpc_call *call, stream_job *job, st_code code) {
    free(job->buf);
    free(job);
    rpc_call_finish(call, code, NULL);
}

static void stream_pump(rpc_call *call, void *arg) {
    stream_job *job = arg;
    while (job->sent < job->total && rpc_call_writable(call)) {
        uint64_t n = job->total - job->sent < job->chunk ? job->total - job->sent : job->chunk;
        memset(job->buf, (int)(job->sent / job->chunk) & 0xff, n);
        st_code rc = rpc_call_send(call, st_slice_make(job->buf, n));
        if (rc != ST_OK) {
            stream_job_end(call, job, rc);
            return;
        }
        job->sent += n;
        __atomic_fetch_add(&job->st->stream_produced, n, __ATOMIC_RELAXED);
    }
    if (job->sent == job->total)
        stream_job_end(call, job, ST_OK);
}

static void stream_cancel(rpc_call *call, void *arg) {
    stream_job *job = arg;
    __atomic_store_n(&job->st->stream_cancelled, 1, __ATOMIC_RELEASE);
    stream_job_end(call, job, ST_CANCELLED);
}

static void h_stream(rpc_call *call, st_slice req, void *arg) {
    if (req.len != 12) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "want 12 bytes");
        return;
    }
    stream_job *job = calloc(1, sizeof(*job));
    job->st = arg;
    job->total = st_get_fixed64(req.data);
    job->chunk = st_get_fixed32(req.data + 8);
    job->buf = malloc(job->chunk ? job->chunk : 1);
    rpc_call_set_cancel_cb(call, stream_cancel, job);
    rpc_call_set_writable_cb(call, stream_pump, job);
    stream_pump(call, job);
}

/* Asynchronous completion: a worker thread "does the work" and posts the finish to the loop. */
typedef struct async_job {
    rpc_server *srv;
    rpc_call *call;
    st_buf data;
} async_job;

static void async_finish_on_loop(void *arg) {
    async_job *job = arg;
    rpc_call_send(job->call, st_buf_slice(&job->data));
    rpc_call_finish(job->call, ST_OK, NULL);
    st_buf_free(&job->data);
    free(job);
}

static void *async_worker(void *arg) {
    async_job *job = arg;
    sleep_ms(2);
    st_code rc = rpc_server_post(job->srv, async_finish_on_loop, job);
    ST_ASSERT(rc == ST_OK);
    return NULL;
}

static void h_async(rpc_call *call, st_slice req, void *arg) {
    svc_state *st = arg;
    async_job *job = calloc(1, sizeof(*job));
    job->srv = st->srv;
    job->call = call;
    st_buf_init(&job->data);
    st_buf_append(&job->data, req.data, req.len);
    pthread_t th;
    pthread_create(&th, NULL, async_worker, job);
    pthread_detach(th);
}

/* ---- server fixture: the loop runs on its own thread ---- */

typedef struct fixture {
    struct event_base *base;
    rpc_server *srv;
    uint16_t port;
    pthread_t th;
    char addr[64];
    svc_state st;
} fixture;

static void *loop_thread(void *arg) {
    fixture *f = arg;
    event_base_dispatch(f->base);
    return NULL;
}

static fixture *fixture_start(const rpc_server_opts *opts) {
    fixture *f = calloc(1, sizeof(*f));
    st_err err = {0};
    f->base = event_base_new();
    assert_non_null(f->base);
    f->srv = rpc_server_new(f->base, opts, &err);
    assert_non_null(f->srv);
    f->st.srv = f->srv;
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Echo", h_echo, &f->st), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Echo", h_echo, &f->st), ST_ALREADY_EXISTS);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Meta", h_meta, &f->st), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Fail", h_fail, &f->st), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Never", h_never, &f->st), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Stream", h_stream, &f->st), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/t.T/Async", h_async, &f->st), ST_OK);
    assert_int_equal(rpc_server_listen(f->srv, "127.0.0.1", 0, &f->port, &err), ST_OK);
    assert_true(f->port != 0);
    snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%u", f->port);
    assert_int_equal(pthread_create(&f->th, NULL, loop_thread, f), 0);
    return f;
}

static void loop_stop(void *arg) {
    event_base_loopbreak(arg);
}

static void fixture_stop(fixture *f) {
    assert_int_equal(rpc_server_post(f->srv, loop_stop, f->base), ST_OK);
    pthread_join(f->th, NULL);
    rpc_server_free(f->srv);
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    event_base_free(f->base);
    free(f);
}

/* ---- a raw HTTP/2 client with hand-shaped DATA frames (raw_h2.h) ---- */

static int tcp_connect(uint16_t port) {
    int fd = raw_tcp_connect(port, 0);
    assert_true(fd >= 0);
    return fd;
}

/* One call with the given body cut into DATA frames of `chunk` bytes, the usual request headers
 * then n_extra more (appended as given); returns grpc-status, the response's DATA into
 * resp_data and its headers into out when given. */
static int raw_h2_call_ex(uint16_t port, const char *path, const char *content_type,
                          const nghttp2_nv *extra, size_t n_extra, const uint8_t *body, size_t len,
                          size_t chunk, st_buf *resp_data, raw_call *out) {
    raw_call r = {
        .fd = tcp_connect(port), .body = body, .body_len = len, .chunk = chunk, .grpc_status = -1};
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, false);
    assert_non_null(s);
    nghttp2_nv nva[8] = {
        {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
        {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), 0},
        {(uint8_t *)":authority", (uint8_t *)"localhost", 10, 9, 0},
        {(uint8_t *)"content-type", (uint8_t *)content_type, 12, strlen(content_type), 0},
    };
    assert_true(n_extra <= 3);
    for (size_t i = 0; i < n_extra; i++)
        nva[5 + i] = extra[i];
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 5 + n_extra, &prd, NULL) > 0);
    uint8_t buf[16384];
    while (!r.closed) {
        if (nghttp2_session_send(s) != 0)
            break;
        ssize_t n = recv(r.fd, buf, sizeof(buf), 0);
        if (n <= 0 || nghttp2_session_mem_recv(s, buf, (size_t)n) < 0)
            break;
    }
    nghttp2_session_del(s);
    close(r.fd);
    if (resp_data)
        st_buf_append(resp_data, r.data.data, r.data.len);
    st_buf_free(&r.data);
    if (out)
        *out = r;
    return r.grpc_status;
}

static int raw_h2_call(uint16_t port, const char *path, const char *content_type,
                       const uint8_t *body, size_t len, size_t chunk, st_buf *resp_data) {
    return raw_h2_call_ex(port, path, content_type, NULL, 0, body, len, chunk, resp_data, NULL);
}

static size_t frame_msg(uint8_t *out, const void *msg, size_t len) {
    rpc_frame_prefix(out, (uint32_t)len);
    memcpy(out + 5, msg, len);
    return 5 + len;
}

/* ---- tests: pure functions ---- */

typedef struct collected {
    size_t n;
    size_t lens[8];
    uint8_t first[8];
} collected;

static st_code collect(st_slice msg, void *arg) {
    collected *c = arg;
    if (c->n < 8) {
        c->lens[c->n] = msg.len;
        c->first[c->n] = msg.len ? msg.data[0] : 0;
    }
    c->n++;
    return ST_OK;
}

static void test_rpc_deframer_any_split(void **state) {
    (void)state;
    static uint8_t big[3000];
    memset(big, 'b', sizeof(big));
    uint8_t wire[5 + 0 + 5 + 1 + 5 + sizeof(big)];
    size_t len = frame_msg(wire, "", 0);
    len += frame_msg(wire + len, "a", 1);
    len += frame_msg(wire + len, big, sizeof(big));
    uint64_t seed = st_test_seed("test_rpc_deframer_any_split");
    st_rng rng;
    st_rng_seed(&rng, seed);
    for (int round = 0; round < 200; round++) {
        rpc_deframer d;
        rpc_deframer_init(&d, 4096);
        collected c = {0};
        for (size_t off = 0; off < len;) {
            size_t n = round == 0 ? 1 : 1 + (size_t)st_rng_below(&rng, 700);
            if (n > len - off)
                n = len - off;
            assert_int_equal(rpc_deframer_feed(&d, wire + off, n, NULL, collect, &c), ST_OK);
            off += n;
        }
        assert_int_equal(rpc_deframer_finish(&d, NULL), ST_OK);
        assert_int_equal(c.n, 3);
        assert_int_equal(c.lens[0], 0);
        assert_int_equal(c.lens[1], 1);
        assert_int_equal(c.first[1], 'a');
        assert_int_equal(c.lens[2], sizeof(big));
        assert_int_equal(c.first[2], 'b');
        rpc_deframer_deinit(&d);
    }
}

/* The reassembly buffer follows the bytes that arrived, never the announced length alone (a
 * stream announcing 200 MiB and sending 10 bytes must not map 200 MiB), and a message that
 * arrives whole ends in a buffer of exactly its size. */
static void test_rpc_deframer_grows_with_arrivals(void **state) {
    (void)state;
    static uint8_t chunk[7000];
    memset(chunk, 'c', sizeof chunk);
    rpc_deframer d;
    rpc_deframer_init(&d, (size_t)256 << 20);
    uint8_t pre[5];
    rpc_frame_prefix(pre, 200u << 20);
    collected c = {0};
    assert_int_equal(rpc_deframer_feed(&d, pre, 5, NULL, collect, &c), ST_OK);
    assert_int_equal(rpc_deframer_feed(&d, chunk, 10, NULL, collect, &c), ST_OK);
    assert_true(d.msg.cap <= (size_t)64 << 10);
    for (int i = 0; i < 150; i++) /* about 1 MiB */
        assert_int_equal(rpc_deframer_feed(&d, chunk, sizeof chunk, NULL, collect, &c), ST_OK);
    assert_true(d.msg.cap <= (size_t)2 << 20);
    rpc_deframer_deinit(&d);
    size_t whole = (size_t)300 << 10;
    rpc_deframer_init(&d, (size_t)1 << 20);
    rpc_frame_prefix(pre, (uint32_t)whole);
    assert_int_equal(rpc_deframer_feed(&d, pre, 5, NULL, collect, &c), ST_OK);
    for (size_t off = 0; off < whole; off += sizeof chunk) {
        size_t n = whole - off < sizeof chunk ? whole - off : sizeof chunk;
        assert_int_equal(rpc_deframer_feed(&d, chunk, n, NULL, collect, &c), ST_OK);
        if (off + n < whole)
            assert_true(d.msg.cap < 2 * (5 + off + n) + ((size_t)64 << 10));
    }
    assert_int_equal(c.n, 1);
    assert_int_equal(c.lens[0], whole);
    rpc_deframer_deinit(&d);
}

static void test_rpc_deframer_rejects_bad_input(void **state) {
    (void)state;
    rpc_deframer d;
    st_err err = {0};
    uint8_t comp[] = {1, 0, 0, 0, 1, 'x'};
    rpc_deframer_init(&d, 100);
    assert_int_equal(rpc_deframer_feed(&d, comp, sizeof(comp), &err, NULL, NULL), ST_UNIMPLEMENTED);
    rpc_deframer_deinit(&d);
    uint8_t flag[] = {7, 0, 0, 0, 0};
    rpc_deframer_init(&d, 100);
    assert_int_equal(rpc_deframer_feed(&d, flag, sizeof(flag), &err, NULL, NULL), ST_INTERNAL);
    rpc_deframer_deinit(&d);
    uint8_t huge[] = {0, 0, 0, 0, 101};
    rpc_deframer_init(&d, 100);
    assert_int_equal(rpc_deframer_feed(&d, huge, sizeof(huge), &err, NULL, NULL),
                     ST_RESOURCE_EXHAUSTED);
    rpc_deframer_deinit(&d);
    uint8_t cut[] = {0, 0, 0, 0, 9, 'a'};
    rpc_deframer_init(&d, 100);
    assert_int_equal(rpc_deframer_feed(&d, cut, 3, &err, NULL, NULL), ST_OK);
    assert_int_equal(rpc_deframer_finish(&d, &err), ST_INTERNAL);
    assert_int_equal(rpc_deframer_feed(&d, cut + 3, 3, &err, NULL, NULL), ST_OK);
    assert_int_equal(rpc_deframer_finish(&d, &err), ST_INTERNAL);
    rpc_deframer_deinit(&d);
}

static void test_rpc_timeout_and_message_encodings(void **state) {
    (void)state;
    int64_t us;
    assert_true(rpc_timeout_parse("100m", 4, &us));
    assert_int_equal(us, 100000);
    assert_true(rpc_timeout_parse("5S", 2, &us));
    assert_int_equal(us, 5000000);
    assert_true(rpc_timeout_parse("2H", 2, &us));
    assert_int_equal(us, 7200000000LL);
    assert_true(rpc_timeout_parse("1500n", 5, &us));
    assert_int_equal(us, 2);
    assert_false(rpc_timeout_parse("m", 1, &us));
    assert_false(rpc_timeout_parse("123456789S", 10, &us));
    assert_false(rpc_timeout_parse("10x", 3, &us));
    assert_false(rpc_timeout_parse("1-S", 3, &us));
    char t[16];
    rpc_timeout_format(250000, t);
    assert_true(rpc_timeout_parse(t, strlen(t), &us));
    assert_true(us >= 250000);
    assert_string_equal(t, "250000u");
    rpc_timeout_format(0, t);
    assert_string_equal(t, "1u");
    rpc_timeout_format(99999999, t);
    assert_string_equal(t, "99999999u");
    rpc_timeout_format(100000000, t);
    assert_string_equal(t, "100000m");
    rpc_timeout_format(100000001, t); /* rounded up, never shortened */
    assert_string_equal(t, "100001m");
    rpc_timeout_format(INT64_MAX, t);
    assert_string_equal(t, "99999999H"); /* capped at 8 digits */
    rpc_timeout_format(INT64_C(1) << 50, t);
    assert_true(rpc_timeout_parse(t, strlen(t), &us));
    assert_true(us >= (INT64_C(1) << 50));
    char enc[64], dec[64];
    rpc_percent_encode("a%b\n\xc3\xbc", enc, sizeof(enc));
    assert_string_equal(enc, "a%25b%0A%C3%BC");
    rpc_percent_decode(enc, strlen(enc), dec, sizeof(dec));
    assert_string_equal(dec, "a%b\n\xc3\xbc");
    rpc_percent_decode("bad%zz%4", 8, dec, sizeof(dec));
    assert_string_equal(dec, "bad%zz%4");
}

/* ---- tests: calls ---- */

static void test_rpc_unary_echo_and_metadata(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("hello"), NULL, 0,
                                        5000, &resp, &status),
                     ST_OK);
    assert_int_equal(resp.len, 5);
    assert_memory_equal(resp.data, "hello", 5);
    /* An empty message is a message: a 5-byte prefix with length 0. */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(NULL, 0), NULL, 0,
                                        0, &resp, &status),
                     ST_OK);
    assert_int_equal(resp.len, 0);
    rpc_metadata md[] = {{"x-goog-request-params", "table_name=projects/p/t"},
                         {"authorization", "Bearer tok"}};
    assert_int_equal(
        rpc_blocking_unary(f->addr, NULL, "/t.T/Meta", ST_SLICE_LIT("x"), md, 2, 0, &resp, &status),
        ST_OK);
    assert_int_equal(resp.len, strlen("table_name=projects/p/t|Bearer tok|/t.T/Meta"));
    assert_memory_equal(resp.data, "table_name=projects/p/t|Bearer tok|/t.T/Meta", resp.len);
    /* Asynchronous completion through rpc_server_post from a worker thread. */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Async", ST_SLICE_LIT("later"), NULL, 0,
                                        0, &resp, &status),
                     ST_OK);
    assert_memory_equal(resp.data, "later", 5);
    st_buf_free(&resp);
    fixture_stop(f);
}

/* Calls and their buffers are reused (per-thread caches in client.c and server.c) and headers go
 * to nghttp2 without copies: every call must still carry its own metadata, path and deadline,
 * whatever the sizes of the requests before it. Metadata names are sent lower-cased. */
static void test_rpc_reused_calls_keep_their_headers(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    st_buf resp, big;
    st_buf_init(&resp);
    st_buf_init(&big);
    assert_int_equal(st_buf_reserve(&big, 100000), ST_OK);
    memset(big.data, 'b', 100000);
    big.len = 100000;
    for (int i = 0; i < 40; i++) {
        char value[32], want[96];
        snprintf(value, sizeof value, "v%d", i);
        rpc_metadata md[] = {{"X-Goog-Request-Params", value}};
        st_slice req = i % 3 == 0 ? st_buf_slice(&big) : ST_SLICE_LIT("x");
        st_err status = {0};
        assert_int_equal(rpc_blocking_unary(f->addr, NULL, i % 2 ? "/t.T/Meta" : "/t.T/Meta2", req,
                                            md, 1, i % 4 ? 5000 : 0, &resp, &status),
                         i % 2 ? ST_OK : ST_UNIMPLEMENTED);
        if (i % 2 == 0) {
            assert_non_null(strstr(status.msg, "/t.T/Meta2"));
            continue;
        }
        snprintf(want, sizeof want, "%s|-|/t.T/Meta", value);
        assert_int_equal(resp.len, strlen(want));
        assert_memory_equal(resp.data, want, resp.len);
    }
    st_buf_free(&big);
    st_buf_free(&resp);
    fixture_stop(f);
}

static void test_rpc_status_message_and_unknown_method(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Fail", ST_SLICE_LIT("x"), NULL, 0, 0,
                                        NULL, &status),
                     ST_NOT_FOUND);
    assert_string_equal(status.msg, "row \xc3\xbc"
                                    "ber 100% gone\nnext line");
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Nope", ST_SLICE_LIT("x"), NULL, 0, 0,
                                        NULL, &status),
                     ST_UNIMPLEMENTED);
    assert_non_null(strstr(status.msg, "/t.T/Nope"));
    /* Nobody listening: UNAVAILABLE, not a hang. */
    char dead[64];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    snprintf(dead, sizeof(dead), "127.0.0.1:%u", ntohs(sa.sin_port));
    assert_int_equal(
        rpc_blocking_unary(dead, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0, 0, NULL, &status),
        ST_UNAVAILABLE);
    close(fd);
    fixture_stop(f);
}

static void test_rpc_message_size_limits(void **state) {
    (void)state;
    rpc_server_opts opts = {.message_bytes_max = 1 << 20};
    fixture *f = fixture_start(&opts);
    size_t n = 2u << 20;
    uint8_t *big = calloc(1, n);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, n), NULL, 0,
                                        0, NULL, &status),
                     ST_RESOURCE_EXHAUSTED);
    print_message("oversized: %s\n", status.msg);
    /* The response side: the client's own limit. */
    rpc_client_opts copts = {.message_bytes_max = 1000};
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", st_slice_make(big, 5000),
                                        NULL, 0, 0, NULL, &status),
                     ST_RESOURCE_EXHAUSTED);
    /* The server still serves. */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, 1000), NULL,
                                        0, 0, NULL, &status),
                     ST_OK);
    free(big);
    fixture_stop(f);
}

static void test_rpc_20mib_round_trip(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    size_t n = 20u << 20;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i * 131 + (i >> 13));
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_make(big, n), NULL, 0,
                                        0, &resp, &status),
                     ST_OK);
    assert_int_equal(resp.len, n);
    assert_true(memcmp(resp.data, big, n) == 0);
    st_buf_free(&resp);
    free(big);
    fixture_stop(f);
}

/* Many concurrent calls on one connection, mixing synchronous and asynchronous handlers. */
typedef struct many_ctx {
    int done, ok;
    struct event_base *base;
    int expect;
} many_ctx;

typedef struct one_call {
    many_ctx *m;
    char want[32];
} one_call;

static void many_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    one_call *oc = arg;
    if (code == ST_OK && resp.len == strlen(oc->want) && memcmp(resp.data, oc->want, resp.len) == 0)
        oc->m->ok++;
    if (++oc->m->done == oc->m->expect)
        event_base_loopbreak(oc->m->base);
}

/* N calls on one connection of a client with copts to a server with sopts. */
static void many_streams_over(const rpc_server_opts *sopts, const rpc_client_opts *copts) {
    fixture *f = fixture_start(sopts);
    enum { N = 600 }; /* more than SETTINGS_MAX_CONCURRENT_STREAMS: nghttp2 queues the rest */
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, copts, NULL);
    assert_non_null(c);
    many_ctx m = {.base = base, .expect = N};
    one_call *calls = calloc(N, sizeof(*calls));
    for (int i = 0; i < N; i++) {
        calls[i].m = &m;
        snprintf(calls[i].want, sizeof(calls[i].want), "msg-%d", i);
        assert_int_equal(rpc_client_unary(c, i % 3 ? "/t.T/Echo" : "/t.T/Async",
                                          st_slice_cstr(calls[i].want), NULL, 0, 30000, many_done,
                                          &calls[i]),
                         ST_OK);
    }
    while (m.done < N && event_base_dispatch(base) == 0)
        ;
    assert_int_equal(m.ok, N);
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    assert_int_equal(stats.conns_accepted, 1);
    assert_true(stats.calls_started >= N);
    assert_true(rpc_client_alive(c));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    free(calls);
    fixture_stop(f);
}

static void test_rpc_many_concurrent_streams(void **state) {
    (void)state;
    many_streams_over(NULL, NULL);
}

/* A slow reader of a 64 MiB stream: the producer is paused by flow control, so the server's queue
 * stays under its bound and production never runs far ahead of what the client has read. */
typedef struct slow_ctx {
    fixture *f;
    uint64_t received, messages;
    uint64_t ahead_max; /* produced - received, sampled after pauses */
    bool done;
    st_code code;
    struct event_base *base;
    uint64_t sleep_every; /* messages between two pauses of the reader */
} slow_ctx;

static void slow_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    slow_ctx *s = arg;
    if (msg.len && msg.data[0] != (uint8_t)(s->messages & 0xff))
        s->code = ST_DATA_LOSS;
    s->received += msg.len;
    s->messages++;
    if (s->messages % s->sleep_every == 0) {
        sleep_ms(40); /* the slow part: the loop (and so the socket) is not read meanwhile */
        uint64_t produced = __atomic_load_n(&s->f->st.stream_produced, __ATOMIC_RELAXED);
        if (produced - s->received > s->ahead_max)
            s->ahead_max = produced - s->received;
    }
}

static void slow_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    slow_ctx *s = arg;
    s->done = true;
    if (s->code == ST_OK)
        s->code = code;
    event_base_loopbreak(s->base);
}

/* A stream of total bytes to a client with copts that pauses every sleep_every messages, from a
 * server with opts (send_queue_bytes_max set). */
static void slow_reader_over(const rpc_server_opts *opts, const rpc_client_opts *copts,
                             uint64_t total, uint64_t sleep_every) {
    fixture *f = fixture_start(opts);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, copts, NULL);
    uint32_t chunk = 64u << 10;
    uint8_t req[12];
    st_put_fixed64(req, total);
    st_put_fixed32(req + 8, chunk);
    slow_ctx s = {.f = f, .base = base, .sleep_every = sleep_every};
    assert_non_null(rpc_client_call(c, "/t.T/Stream", st_slice_make(req, 12), NULL, 0, 0, slow_msg,
                                    slow_done, &s));
    while (!s.done && event_base_dispatch(base) == 0)
        ;
    assert_int_equal(s.code, ST_OK);
    assert_int_equal(s.received, total);
    assert_int_equal(s.messages, total / chunk);
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    /* The queue never exceeded its bound plus one message. */
    assert_true(stats.queued_bytes_peak <= opts->send_queue_bytes_max + chunk + 5);
    /* Production ran ahead of the reader by at most the pipes in between (queue, socket output
     * high-water, HTTP/2 windows, kernel socket buffers) — far less than the whole answer. */
    print_message("slow reader: peak queued %llu bytes, producer ahead by at most %llu bytes\n",
                  (unsigned long long)stats.queued_bytes_peak, (unsigned long long)s.ahead_max);
    assert_true(s.ahead_max < total / 2);
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

static void test_rpc_stream_slow_reader_bounded(void **state) {
    (void)state;
    rpc_server_opts opts = {.send_queue_bytes_max = 256 << 10};
    slow_reader_over(&opts, NULL, 64u << 20, 64);
}

/* Many small messages: the server packs several into one DATA frame; the client splits them. */
typedef struct small_ctx {
    uint64_t messages, bytes;
    bool order_ok;
} small_ctx;

static void small_msg(st_slice msg, void *arg) {
    small_ctx *sc = arg;
    if (msg.len != 7 || msg.data[0] != (uint8_t)(sc->messages & 0xff))
        sc->order_ok = false;
    sc->messages++;
    sc->bytes += msg.len;
}

static void test_rpc_stream_many_small_messages(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    uint8_t req[12];
    st_put_fixed64(req, 7 * 5000);
    st_put_fixed32(req + 8, 7);
    small_ctx sc = {.order_ok = true};
    st_err status = {0};
    assert_int_equal(rpc_blocking_stream(f->addr, NULL, "/t.T/Stream", st_slice_make(req, 12), NULL,
                                         0, 0, small_msg, &sc, &status),
                     ST_OK);
    assert_int_equal(sc.messages, 5000);
    assert_int_equal(sc.bytes, 7 * 5000);
    assert_true(sc.order_ok);
    /* A stream of zero messages ends with just the status. */
    st_put_fixed64(req, 0);
    sc = (small_ctx){.order_ok = true};
    assert_int_equal(rpc_blocking_stream(f->addr, NULL, "/t.T/Stream", st_slice_make(req, 12), NULL,
                                         0, 0, small_msg, &sc, &status),
                     ST_OK);
    assert_int_equal(sc.messages, 0);
    fixture_stop(f);
}

/* Cancelling a huge stream midway stops the producer through its cancel callback. */
typedef struct midway_ctx {
    rpc_ccall *call;
    uint64_t messages;
    bool done;
    st_code code;
} midway_ctx;

static void midway_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)msg;
    midway_ctx *m = arg;
    if (++m->messages == 10)
        rpc_ccall_cancel(call); /* from inside a callback: allowed */
}

static void midway_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    midway_ctx *m = arg;
    m->done = true;
    m->code = code;
}

static void test_rpc_stream_cancel_midway(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    uint8_t req[12];
    st_put_fixed64(req, UINT64_C(1) << 40); /* would never end by itself */
    st_put_fixed32(req + 8, 32u << 10);
    midway_ctx m = {0};
    m.call = rpc_client_call(c, "/t.T/Stream", st_slice_make(req, 12), NULL, 0, 0, midway_msg,
                             midway_done, &m);
    assert_non_null(m.call);
    while (!m.done && event_base_loop(base, EVLOOP_ONCE) == 0)
        ;
    assert_int_equal(m.code, ST_CANCELLED);
    assert_true(m.messages >= 10);
    for (int i = 0; i < 30000 && !__atomic_load_n(&f->st.stream_cancelled, __ATOMIC_ACQUIRE); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    assert_true(f->st.stream_cancelled);
    rpc_server_stats stats;
    for (int i = 0; i < 30000; i++) { /* the cancelled call's queue is released */
        rpc_server_stats_get(f->srv, &stats);
        if (stats.calls_active == 0)
            break;
        sleep_ms(1);
    }
    assert_int_equal(stats.calls_active, 0);
    assert_int_equal(stats.queued_bytes, 0);
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

static void test_rpc_deadline_cancels_server_call(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0,
                                        200, NULL, &status),
                     ST_DEADLINE_EXCEEDED);
    assert_true(wait_flag(&f->st.never_cancelled));
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    assert_true(stats.calls_cancelled >= 1);
    fixture_stop(f);
}

/* Deadlines on many calls at once, more than the server's stream limit, so some of them expire
 * while still waiting for a stream slot (their HEADERS never leave the client). */
typedef struct dl_ctx {
    int done, deadline;
} dl_ctx;

static void dl_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    dl_ctx *d = arg;
    d->done++;
    d->deadline += code == ST_DEADLINE_EXCEEDED;
    if (code != ST_DEADLINE_EXCEEDED)
        print_message("queued call ended with %s: %s\n", st_code_name(code), message);
}

static void test_rpc_deadlines_on_queued_calls(void **state) {
    (void)state;
    rpc_server_opts opts = {.streams_max = 8};
    fixture *f = fixture_start(&opts);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    enum { N = 40 };
    dl_ctx d = {0};
    for (int i = 0; i < N; i++)
        assert_non_null(
            rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 300, NULL, dl_done, &d));
    while (d.done < N && event_base_loop(base, EVLOOP_ONCE) == 0)
        ;
    assert_int_equal(d.deadline, N);
    assert_true(rpc_client_alive(c));
    /* The connection is still good for more calls. */
    st_err status = {0};
    (void)status;
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

typedef struct cancel_ctx {
    bool done;
    st_code code;
} cancel_ctx;

static void cancel_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    cancel_ctx *cc = arg;
    cc->done = true;
    cc->code = code;
}

/* Calls past the server's SETTINGS_MAX_CONCURRENT_STREAMS wait in the client without a stream:
 * their deadlines and cancellations end them there, with no frame sent (a RST_STREAM for a
 * stream the server never saw is a connection error, and the server closed the connection with
 * every call on it), and the connection carries on. */
typedef struct held_ctx {
    int done, deadline, cancelled, unprocessed, ok;
} held_ctx;

static void held_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)message;
    held_ctx *h = arg;
    h->done++;
    h->deadline += code == ST_DEADLINE_EXCEEDED;
    h->cancelled += code == ST_CANCELLED;
    h->ok += code == ST_OK;
    h->unprocessed += rpc_ccall_unprocessed(call);
}

static void held_unary_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    (void)resp;
    held_ctx *h = arg;
    h->done++;
    h->ok += code == ST_OK;
}

static void held_wait(struct event_base *base, held_ctx *h, int n) {
    while (h->done < n && event_base_loop(base, EVLOOP_ONCE) == 0)
        ;
}

static void test_rpc_held_calls_end_without_frames(void **state) {
    (void)state;
    rpc_server_opts opts = {.streams_max = 8};
    fixture *f = fixture_start(&opts);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    held_ctx first = {0}, busy = {0}, held = {0}, after = {0};
    /* One call first, so the server's SETTINGS (8 streams) are known. */
    assert_int_equal(rpc_client_unary(c, "/t.T/Echo", ST_SLICE_LIT("a"), NULL, 0, 30000,
                                      held_unary_done, &first),
                     ST_OK);
    held_wait(base, &first, 1);
    assert_int_equal(first.ok, 1);
    rpc_ccall *never[8];
    for (int i = 0; i < 8; i++)
        assert_non_null(never[i] = rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0,
                                                   NULL, held_done, &busy));
    enum { N = 20 };
    for (int i = 0; i < N; i++) {
        assert_non_null(rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 200, NULL,
                                        held_done, &held));
        rpc_ccall *k =
            rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0, NULL, held_done, &held);
        assert_non_null(k);
        rpc_ccall_cancel(k);
    }
    held_wait(base, &held, 2 * N);
    assert_int_equal(held.deadline, N);
    assert_int_equal(held.cancelled, N);
    assert_int_equal(held.unprocessed, 2 * N);
    assert_int_equal(busy.done, 0); /* the calls with a stream go on */
    assert_true(rpc_client_alive(c));
    for (int i = 0; i < 8; i++)
        rpc_ccall_cancel(never[i]);
    held_wait(base, &busy, 8);
    assert_int_equal(rpc_client_unary(c, "/t.T/Echo", ST_SLICE_LIT("b"), NULL, 0, 30000,
                                      held_unary_done, &after),
                     ST_OK);
    held_wait(base, &after, 1);
    assert_int_equal(after.ok, 1);
    assert_true(rpc_client_alive(c));
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    assert_int_equal(stats.conns_accepted, 1);
    assert_int_equal(stats.calls_started, 1 + 8 + 1); /* the held calls never reached it */
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* Held calls go out by owner, the one with the fewest streams first: with the server's 8 streams
 * taken by one owner and 20 more of its calls waiting, another owner's call goes out with the
 * next stream that frees, not after the 20 (its 5 s deadline would end it first). */
static void test_rpc_held_calls_take_turns_by_owner(void **state) {
    (void)state;
    rpc_server_opts opts = {.streams_max = 8};
    fixture *f = fixture_start(&opts);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    held_ctx first = {0}, busy = {0}, greedy = {0}, other = {0};
    assert_int_equal(rpc_client_unary(c, "/t.T/Echo", ST_SLICE_LIT("a"), NULL, 0, 30000,
                                      held_unary_done, &first),
                     ST_OK);
    held_wait(base, &first, 1);
    rpc_ccall *never[8], *waiting[20];
    for (int i = 0; i < 8; i++) {
        assert_non_null(never[i] = rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0,
                                                   NULL, held_done, &busy));
        rpc_ccall_set_owner(never[i], 1);
    }
    for (int i = 0; i < 20; i++) {
        assert_non_null(waiting[i] = rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0,
                                                     NULL, held_done, &greedy));
        rpc_ccall_set_owner(waiting[i], 1);
    }
    rpc_ccall *mine =
        rpc_client_call(c, "/t.T/Echo", ST_SLICE_LIT("b"), NULL, 0, 5000, NULL, held_done, &other);
    assert_non_null(mine);
    rpc_ccall_set_owner(mine, 2);
    rpc_ccall_cancel(never[0]);
    held_wait(base, &busy, 1);
    held_wait(base, &other, 1);
    assert_int_equal(other.ok, 1);
    assert_int_equal(greedy.done, 0);
    for (int i = 1; i < 8; i++)
        rpc_ccall_cancel(never[i]);
    for (int i = 0; i < 20; i++)
        rpc_ccall_cancel(waiting[i]);
    held_wait(base, &busy, 8);
    held_wait(base, &greedy, 20);
    assert_int_equal(greedy.cancelled, 20);
    assert_true(rpc_client_alive(c));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* An owner arriving behind a crowd of owners that each wait with one call gets one of the next
 * two streams that free (its express turn), not the stream after all of theirs. */
static void test_rpc_held_calls_newest_owner_goes_soon(void **state) {
    (void)state;
    rpc_server_opts opts = {.streams_max = 8};
    fixture *f = fixture_start(&opts);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    held_ctx first = {0}, busy = {0}, crowd = {0}, other = {0};
    assert_int_equal(rpc_client_unary(c, "/t.T/Echo", ST_SLICE_LIT("a"), NULL, 0, 30000,
                                      held_unary_done, &first),
                     ST_OK);
    held_wait(base, &first, 1);
    enum { CROWD = 20 };
    rpc_ccall *never[8], *waiting[CROWD];
    for (int i = 0; i < 8; i++)
        assert_non_null(never[i] = rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0,
                                                   NULL, held_done, &busy));
    for (int i = 0; i < CROWD; i++) { /* one call per owner, as one connection per scan */
        assert_non_null(waiting[i] = rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0,
                                                     NULL, held_done, &crowd));
        rpc_ccall_set_owner(waiting[i], 100 + (uint64_t)i);
    }
    rpc_ccall *mine =
        rpc_client_call(c, "/t.T/Echo", ST_SLICE_LIT("b"), NULL, 0, 5000, NULL, held_done, &other);
    assert_non_null(mine);
    rpc_ccall_set_owner(mine, 7);
    for (int i = 0; i < 2; i++) {
        rpc_ccall_cancel(never[i]);
        held_wait(base, &busy, i + 1);
    }
    held_wait(base, &other, 1);
    assert_int_equal(other.ok, 1);
    for (int i = 2; i < 8; i++)
        rpc_ccall_cancel(never[i]);
    for (int i = 0; i < CROWD; i++)
        rpc_ccall_cancel(waiting[i]);
    held_wait(base, &busy, 8);
    held_wait(base, &crowd, CROWD);
    assert_true(rpc_client_alive(c));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* rpc_server_post_item: entries embedded in the poster's objects run on the loop in posting order,
 * interleaved with rpc_server_post's own; an entry's function may free the object holding it
 * (ASan checks the server does not touch it afterwards). */
#define POST_ITEMS 2000

typedef struct post_obj {
    rpc_post post;
    int idx;
} post_obj;

typedef struct post_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int order[POST_ITEMS];
    int n;
} post_log;

static post_log plog = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0};

static void post_record(int idx) {
    pthread_mutex_lock(&plog.mu);
    plog.order[plog.n++] = idx;
    pthread_cond_signal(&plog.cv);
    pthread_mutex_unlock(&plog.mu);
}

static void post_obj_run(void *arg) {
    post_obj *o = arg;
    post_record(o->idx);
    free(o); /* frees the embedded entry too */
}

static void post_plain_run(void *arg) {
    post_record((int)(intptr_t)arg);
}

static int post_failures; /* cmocka asserts belong to the main thread: counted here */

static void *post_thread(void *arg) {
    rpc_server *srv = arg;
    for (int i = 0; i < POST_ITEMS; i++) {
        if (i % 3 == 0) {
            if (rpc_server_post(srv, post_plain_run, (void *)(intptr_t)i) != ST_OK)
                post_failures++;
            continue;
        }
        post_obj *o = malloc(sizeof *o);
        if (o == NULL) {
            post_failures++;
            continue;
        }
        o->idx = i;
        if (rpc_server_post_item(srv, &o->post, post_obj_run, o) != ST_OK) {
            post_failures++;
            free(o);
        }
    }
    return NULL;
}

static void test_rpc_post_item_in_order(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, post_thread, f->srv), 0);
    pthread_join(th, NULL);
    assert_int_equal(post_failures, 0);
    pthread_mutex_lock(&plog.mu);
    while (plog.n < POST_ITEMS)
        pthread_cond_wait(&plog.cv, &plog.mu);
    pthread_mutex_unlock(&plog.mu);
    for (int i = 0; i < POST_ITEMS; i++)
        assert_int_equal(plog.order[i], i);
    fixture_stop(f);
}

static void test_rpc_client_cancel_reaches_handler(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    struct event_base *base = event_base_new();
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, NULL, NULL);
    cancel_ctx cc = {0};
    rpc_ccall *call =
        rpc_client_call(c, "/t.T/Never", ST_SLICE_LIT("x"), NULL, 0, 0, NULL, cancel_done, &cc);
    assert_non_null(call);
    for (int i = 0; i < 30000 && !__atomic_load_n(&f->st.never_started, __ATOMIC_ACQUIRE); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    assert_true(f->st.never_started);
    rpc_ccall_cancel(call);
    while (!cc.done && event_base_loop(base, EVLOOP_ONCE) == 0)
        ;
    assert_int_equal(cc.code, ST_CANCELLED);
    /* Keep the client's loop turning so the RST_STREAM leaves its output buffer. */
    for (int i = 0; i < 30000 && !__atomic_load_n(&f->st.never_cancelled, __ATOMIC_ACQUIRE); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        sleep_ms(1);
    }
    assert_true(f->st.never_cancelled);
    /* The connection carries on. */
    assert_true(rpc_client_alive(c));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

static void test_rpc_bad_frames_end_stream_or_connection(void **state) {
    (void)state;
    fixture *f = fixture_start(NULL);
    /* Garbage instead of the HTTP/2 preface: that connection is closed. */
    int fd = tcp_connect(f->port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01\x02garbage";
    assert_int_equal(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    uint8_t buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        ;
    assert_int_equal(n, 0); /* EOF, not the 30 s receive timeout */
    close(fd);

    uint8_t body[64];
    st_buf resp;
    st_buf_init(&resp);
    /* A truncated gRPC prefix ends that stream with INTERNAL. */
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "application/grpc",
                                 (const uint8_t *)"\0\0\0", 3, 1, NULL),
                     ST_INTERNAL);
    /* A truncated message body, too. */
    size_t len = frame_msg(body, "hello", 5);
    assert_int_equal(
        raw_h2_call(f->port, "/t.T/Echo", "application/grpc", body, len - 2, 100, NULL),
        ST_INTERNAL);
    /* One message split into 1-byte DATA frames is reassembled. */
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "application/grpc", body, len, 1, &resp),
                     ST_OK);
    assert_int_equal(resp.len, len);
    assert_memory_equal(resp.data, body, len);
    /* Two messages in one frame: client streaming is not supported. */
    size_t len2 = len + frame_msg(body + len, "again", 5);
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "application/grpc", body, len2, 1000, NULL),
                     ST_INVALID_ARGUMENT);
    /* A compressed message without negotiated compression; named when the client named it, and
     * every response says which encoding the server accepts. */
    body[0] = 1;
    raw_call out;
    assert_int_equal(raw_h2_call_ex(f->port, "/t.T/Echo", "application/grpc", NULL, 0, body, len,
                                    1000, NULL, &out),
                     ST_UNIMPLEMENTED);
    assert_non_null(strstr(out.grpc_message, "no grpc-encoding names its compression"));
    assert_string_equal(out.accept_encoding, "identity");
    nghttp2_nv gzip = {(uint8_t *)"grpc-encoding", (uint8_t *)"gzip", 13, 4, 0};
    assert_int_equal(raw_h2_call_ex(f->port, "/t.T/Echo", "application/grpc", &gzip, 1, body, len,
                                    1000, NULL, &out),
                     ST_UNIMPLEMENTED);
    assert_string_equal(out.grpc_message,
                        "grpc-encoding \"gzip\" is not supported: send uncompressed messages "
                        "(identity)");
    body[0] = 0;
    /* An uncompressed message may come with grpc-encoding named (the flag says per message). */
    assert_int_equal(raw_h2_call_ex(f->port, "/t.T/Echo", "application/grpc", &gzip, 1, body, len,
                                    1000, NULL, &out),
                     ST_OK);
    assert_string_equal(out.accept_encoding, "identity");
    /* A repeated pseudo-header makes the request malformed (RFC 9113, 8.3): refused, not run
     * with the last value. */
    nghttp2_nv path2 = {(uint8_t *)":path", (uint8_t *)"/t.T/Fail", 5, 9, 0};
    assert_int_equal(raw_h2_call_ex(f->port, "/t.T/Echo", "application/grpc", &path2, 1, body, len,
                                    1000, NULL, &out),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(out.grpc_message, "repeats the :path pseudo-header"));
    nghttp2_nv method2 = {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0};
    assert_int_equal(raw_h2_call_ex(f->port, "/t.T/Echo", "application/grpc", &method2, 1, body,
                                    len, 1000, NULL, &out),
                     ST_INVALID_ARGUMENT);
    /* Wrong content-type. */
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "text/plain", body, len, 1000, NULL),
                     ST_INVALID_ARGUMENT);
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "application/grpcx", body, len, 1000, NULL),
                     ST_INVALID_ARGUMENT);
    /* The proto codec, named or not, in any case (media types are case-insensitive). */
    assert_int_equal(
        raw_h2_call(f->port, "/t.T/Echo", "application/grpc+proto", body, len, 1000, NULL), ST_OK);
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "APPLICATION/GRPC", body, len, 1000, NULL),
                     ST_OK);
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "Application/gRPC+Proto;charset=x", body,
                                 len, 1000, NULL),
                     ST_OK);
    /* Another codec is refused as gRPC servers do (INTERNAL), not decoded as protobuf. */
    st_buf refused;
    st_buf_init(&refused);
    assert_int_equal(
        raw_h2_call(f->port, "/t.T/Echo", "application/grpc+json", body, len, 1000, &refused),
        ST_INTERNAL);
    assert_int_equal(refused.len, 0);
    st_buf_free(&refused);
    assert_int_equal(raw_h2_call(f->port, "/t.T/Echo", "application/grpc+", body, len, 1000, NULL),
                     ST_INTERNAL);
    /* And a second, ordinary client is still served. */
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("still"), NULL, 0,
                                        0, &resp, &status),
                     ST_OK);
    assert_memory_equal(resp.data, "still", 5);
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    assert_true(stats.bad_streams >= 5);
    st_buf_free(&resp);
    fixture_stop(f);
}

/* ---- TLS with a self-signed certificate made at run time ---- */

/* A self-signed certificate for localhost valid from now + not_before_s to now + not_after_s. */
static void make_cert_valid(EVP_PKEY **key_out, X509 **cert_out, long not_before_s,
                            long not_after_s) {
    EVP_PKEY *key = EVP_EC_gen("P-256");
    assert_non_null(key);
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), not_before_s);
    X509_gmtime_adj(X509_getm_notAfter(x), not_after_s);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1,
                               0);
    X509_set_issuer_name(x, name);
    X509V3_CTX v3;
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext =
        X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    assert_non_null(ext);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    assert_true(X509_sign(x, key, EVP_sha256()) > 0);
    *key_out = key;
    *cert_out = x;
}

static void make_cert(EVP_PKEY **key_out, X509 **cert_out) {
    make_cert_valid(key_out, cert_out, -60, 3600);
}

/* A server context with a fresh certificate, and a client context trusting it. */
typedef struct tls_pair {
    EVP_PKEY *key;
    X509 *cert;
    SSL_CTX *sctx, *cctx;
} tls_pair;

static void tls_pair_make(tls_pair *t) {
    make_cert(&t->key, &t->cert);
    t->sctx = SSL_CTX_new(TLS_server_method());
    assert_int_equal(SSL_CTX_use_certificate(t->sctx, t->cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(t->sctx, t->key), 1);
    assert_int_equal(rpc_tls_server_ctx_prepare(t->sctx, NULL), ST_OK);
    t->cctx = SSL_CTX_new(TLS_client_method());
    X509_STORE_add_cert(SSL_CTX_get_cert_store(t->cctx), t->cert);
    SSL_CTX_set_verify(t->cctx, SSL_VERIFY_PEER, NULL);
    assert_int_equal(rpc_tls_client_ctx_prepare(t->cctx, NULL), ST_OK);
}

static void tls_pair_free(tls_pair *t) {
    SSL_CTX_free(t->cctx);
    SSL_CTX_free(t->sctx);
    X509_free(t->cert);
    EVP_PKEY_free(t->key);
}

/* Many concurrent streams over one TLS connection: records carrying frames of many streams,
 * flushes of many frames at once. */
static void test_rpc_tls_many_streams(void **state) {
    (void)state;
    tls_pair t;
    tls_pair_make(&t);
    rpc_server_opts opts = {.ssl_ctx = t.sctx};
    rpc_client_opts copts = {.ssl_ctx = t.cctx};
    many_streams_over(&opts, &copts);
    tls_pair_free(&t);
}

/* A response of many MB over TLS to a client that keeps pausing: the server's socket fills, so
 * ciphertext goes out in partial writes, spills and resumes; every byte arrives in order and the
 * server's queue stays bounded. TLS 1.2 as well as 1.3. */
static void test_rpc_tls_slow_reader(void **state) {
    (void)state;
    tls_pair t;
    tls_pair_make(&t);
    rpc_server_opts opts = {.ssl_ctx = t.sctx, .send_queue_bytes_max = 256 << 10};
    rpc_client_opts copts = {.ssl_ctx = t.cctx};
    slow_reader_over(&opts, &copts, 12u << 20, 16);
    assert_int_equal(SSL_CTX_set_max_proto_version(t.cctx, TLS1_2_VERSION), 1);
    slow_reader_over(&opts, &copts, 4u << 20, 16);
    tls_pair_free(&t);
}

/* Many large responses at once to a client that keeps pausing: more in flight (the streams'
 * windows) than the sockets hold, so the server's socket fills and its ciphertext goes out in
 * partial writes, spills into the bufferevent and resumes. */
typedef struct fill_ctx {
    struct event_base *base;
    int done, ok;
    uint64_t messages, bytes;
    bool order_ok;
} fill_ctx;

typedef struct fill_call {
    fill_ctx *x;
    uint64_t messages;
} fill_call;

static void fill_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    fill_call *fc = arg;
    uint8_t want = (uint8_t)(fc->messages++ & 0xff);
    if (msg.len == 0 || msg.data[0] != want || msg.data[msg.len - 1] != want)
        fc->x->order_ok = false;
    fc->x->bytes += msg.len;
    if (++fc->x->messages % 48 == 0)
        sleep_ms(30); /* the loop, and so the socket, is not read meanwhile */
}

static void fill_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    fill_call *fc = arg;
    fc->x->ok += code == ST_OK;
    fc->x->done++;
}

static void test_rpc_tls_full_socket(void **state) {
    (void)state;
    tls_pair t;
    tls_pair_make(&t);
    rpc_server_opts opts = {.ssl_ctx = t.sctx};
    fixture *f = fixture_start(&opts);
    struct event_base *base = event_base_new();
    rpc_client_opts copts = {.ssl_ctx = t.cctx};
    rpc_client *c = rpc_client_new(base, "127.0.0.1", f->port, &copts, NULL);
    enum { K = 48 };
    uint64_t each = 1u << 20;
    uint8_t req[12];
    st_put_fixed64(req, each);
    st_put_fixed32(req + 8, 32u << 10);
    fill_ctx x = {.base = base, .order_ok = true};
    fill_call calls[K];
    for (int i = 0; i < K; i++) {
        calls[i] = (fill_call){.x = &x};
        assert_non_null(rpc_client_call(c, "/t.T/Stream", st_slice_make(req, 12), NULL, 0, 0,
                                        fill_msg, fill_done, &calls[i]));
    }
    while (x.done < K && event_base_loop(base, EVLOOP_ONCE) == 0)
        ;
    assert_int_equal(x.ok, K);
    assert_true(x.order_ok);
    assert_int_equal(x.bytes, each * K);
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
    tls_pair_free(&t);
}

/* A server that completes the TCP connect but never answers the ClientHello (a listening socket
 * nobody accepts from): the client gives up after its connect timeout and says why. */
static void test_rpc_tls_client_handshake_timeout(void **state) {
    (void)state;
    tls_pair t;
    tls_pair_make(&t);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", ntohs(sa.sin_port));
    rpc_client_opts copts = {.ssl_ctx = t.cctx, .connect_timeout_ms = 300};
    st_err status = {0};
    assert_int_equal(
        rpc_blocking_unary(addr, &copts, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0, 0, NULL, &status),
        ST_UNAVAILABLE);
    assert_non_null(strstr(status.msg, "TLS handshake timed out"));
    close(lfd);
    tls_pair_free(&t);
}

/* The status message of one call by a client of ctx cctx to a TLS server presenting cert/key. */
static void tls_call_fails(EVP_PKEY *key, X509 *cert, SSL_CTX *cctx, st_err *status) {
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    assert_int_equal(SSL_CTX_use_certificate(sctx, cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(sctx, key), 1);
    assert_int_equal(rpc_tls_server_ctx_prepare(sctx, NULL), ST_OK);
    rpc_server_opts opts = {.ssl_ctx = sctx};
    fixture *f = fixture_start(&opts);
    rpc_client_opts copts = {.ssl_ctx = cctx};
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0,
                                        10000, NULL, status),
                     ST_UNAVAILABLE);
    print_message("client: %s\n", status->msg);
    fixture_stop(f);
    SSL_CTX_free(sctx);
}

/* A client (a router's or a node's link to a node) that refuses the server's certificate says
 * why and what to do, not only OpenSSL's "certificate verify failed": expired, not yet valid,
 * signed by a CA the client does not trust. */
static void test_rpc_tls_client_names_cert_problem(void **state) {
    (void)state;
    EVP_PKEY *key;
    X509 *cert;
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
    assert_int_equal(rpc_tls_client_ctx_prepare(cctx, NULL), ST_OK);
    st_err status = {0};

    make_cert_valid(&key, &cert, -7200, -3600); /* expired an hour ago */
    X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), cert);
    tls_call_fails(key, cert, cctx, &status);
    assert_non_null(strstr(status.msg, "certificate has expired"));
    assert_non_null(strstr(status.msg, "issue it a new certificate"));
    X509_free(cert);
    EVP_PKEY_free(key);

    make_cert_valid(&key, &cert, 3600, 7200); /* valid from an hour on */
    X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), cert);
    tls_call_fails(key, cert, cctx, &status);
    assert_non_null(strstr(status.msg, "not yet valid"));
    assert_non_null(strstr(status.msg, "clocks"));
    X509_free(cert);
    EVP_PKEY_free(key);

    make_cert(&key, &cert); /* valid, but nothing the client trusts signed it */
    tls_call_fails(key, cert, cctx, &status);
    assert_non_null(strstr(status.msg, "not signed by a CA this side trusts"));
    assert_non_null(strstr(status.msg, "cluster CA"));
    X509_free(cert);
    EVP_PKEY_free(key);
    SSL_CTX_free(cctx);
}

/* Log lines of the server, for the checks below. */
typedef struct log_watch {
    pthread_mutex_t mu;
    char want[64];
    int seen;
    char line[1024];
} log_watch;

static void log_watch_sink(st_log_level level, const char *module, const char *line, void *arg) {
    (void)level;
    (void)module;
    log_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    if (strstr(line, w->want)) {
        snprintf(w->line, sizeof w->line, "%s", line);
        __atomic_store_n(&w->seen, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&w->mu);
}

/* A client whose certificate has expired is refused, and the server's log says so with the fix
 * (OpenSSL alone says only "certificate verify failed"). Runs before the other TLS tests: the
 * "TLS handshake failed" line is rate-limited per process. */
static void test_rpc_tls_expired_client_cert(void **state) {
    (void)state;
    tls_pair t;
    tls_pair_make(&t);
    EVP_PKEY *ckey;
    X509 *ccert;
    make_cert_valid(&ckey, &ccert, -7200, -3600);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(t.sctx), ccert);
    SSL_CTX_set_verify(t.sctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    assert_int_equal(SSL_CTX_use_certificate(t.cctx, ccert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(t.cctx, ckey), 1);
    static log_watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .want = "TLS handshake failed"};
    st_log_set_sink(log_watch_sink, &w);
    st_log_set_level(ST_LOG_INFO);
    rpc_server_opts opts = {.ssl_ctx = t.sctx};
    fixture *f = fixture_start(&opts);
    rpc_client_opts copts = {.ssl_ctx = t.cctx};
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0,
                                        10000, NULL, &status),
                     ST_UNAVAILABLE);
    assert_non_null(strstr(status.msg, "expired")); /* the client hears it too (the alert) */
    assert_non_null(strstr(status.msg, "the peer refused this process's certificate"));
    assert_true(wait_flag(&w.seen));
    pthread_mutex_lock(&w.mu);
    print_message("server: %s\n", w.line);
    assert_non_null(strstr(w.line, "certificate has expired"));
    assert_non_null(strstr(w.line, "issue it a new certificate"));
    pthread_mutex_unlock(&w.mu);
    fixture_stop(f);
    st_log_set_sink(NULL, NULL);
    st_log_set_level(getenv("RPC_TEST_DEBUG") ? ST_LOG_DEBUG : ST_LOG_WARN);
    X509_free(ccert);
    EVP_PKEY_free(ckey);
    tls_pair_free(&t);
}

static void test_rpc_tls_alpn_h2(void **state) {
    (void)state;
    EVP_PKEY *key;
    X509 *cert;
    make_cert(&key, &cert);
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    assert_int_equal(SSL_CTX_use_certificate(sctx, cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(sctx, key), 1);
    assert_int_equal(rpc_tls_server_ctx_prepare(sctx, NULL), ST_OK);
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), cert);
    SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
    assert_int_equal(rpc_tls_client_ctx_prepare(cctx, NULL), ST_OK);

    rpc_server_opts opts = {.ssl_ctx = sctx};
    fixture *f = fixture_start(&opts);
    rpc_client_opts copts = {.ssl_ctx = cctx};
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", ST_SLICE_LIT("secret"), NULL,
                                        0, 10000, &resp, &status),
                     ST_OK);
    assert_memory_equal(resp.data, "secret", 6);
    /* Large enough to cross many TLS records and HTTP/2 windows. */
    size_t n = 3u << 20;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i ^ (i >> 11));
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", st_slice_make(big, n), NULL,
                                        0, 0, &resp, &status),
                     ST_OK);
    assert_int_equal(resp.len, n);
    assert_true(memcmp(resp.data, big, n) == 0);
    free(big);
    /* A plaintext client to the TLS port fails cleanly, and the server carries on. */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0,
                                        5000, NULL, &status),
                     ST_UNAVAILABLE);
    /* A client that does not trust the certificate is refused. */
    SSL_CTX *untrusting = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(untrusting, SSL_VERIFY_PEER, NULL);
    rpc_tls_client_ctx_prepare(untrusting, NULL);
    rpc_client_opts uopts = {.ssl_ctx = untrusting};
    assert_int_equal(rpc_blocking_unary(f->addr, &uopts, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0,
                                        5000, NULL, &status),
                     ST_UNAVAILABLE);
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", ST_SLICE_LIT("again"), NULL,
                                        0, 10000, &resp, &status),
                     ST_OK);
    st_buf_free(&resp);
    fixture_stop(f);
    SSL_CTX_free(untrusting);
    SSL_CTX_free(cctx);
    SSL_CTX_free(sctx);
    X509_free(cert);
    EVP_PKEY_free(key);
}

/* TLS connections stalled in the handshake, or after it but before the HTTP/2 preface, are
 * closed after the handshake timeout (rpc_limits). */
static void test_rpc_tls_handshake_timeout(void **state) {
    (void)state;
    EVP_PKEY *key;
    X509 *cert;
    make_cert(&key, &cert);
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    assert_int_equal(SSL_CTX_use_certificate(sctx, cert), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(sctx, key), 1);
    assert_int_equal(rpc_tls_server_ctx_prepare(sctx, NULL), ST_OK);
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), cert);
    assert_int_equal(rpc_tls_client_ctx_prepare(cctx, NULL), ST_OK);
    rpc_limits l;
    rpc_limits_default(&l);
    l.handshake_timeout_ms = 300;
    rpc_limits_set(&l);
    rpc_server_opts opts = {.ssl_ctx = sctx};
    fixture *f = fixture_start(&opts);
    /* Half a TLS record header, then nothing. */
    int fd = tcp_connect(f->port);
    assert_int_equal(send(fd, "\x16\x03\x01", 3, MSG_NOSIGNAL), 3);
    uint8_t buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        ;
    assert_int_equal(n, 0); /* EOF, not the 30 s receive timeout */
    close(fd);
    /* A finished TLS handshake, but no HTTP/2 preface. */
    fd = tcp_connect(f->port);
    SSL *ssl = SSL_new(cctx);
    SSL_set_fd(ssl, fd);
    assert_int_equal(SSL_connect(ssl), 1);
    int r;
    errno = 0;
    while ((r = SSL_read(ssl, buf, sizeof(buf))) > 0)
        ;
    assert_true(errno != EAGAIN && errno != EWOULDBLOCK); /* closed, not timed out */
    SSL_free(ssl);
    close(fd);
    rpc_server_stats stats;
    rpc_server_stats_get(f->srv, &stats);
    assert_int_equal(stats.conns_handshake_closed, 2);
    rpc_client_opts copts = {.ssl_ctx = cctx};
    st_err status = {0};
    assert_int_equal(rpc_blocking_unary(f->addr, &copts, "/t.T/Echo", ST_SLICE_LIT("x"), NULL, 0,
                                        10000, NULL, &status),
                     ST_OK);
    fixture_stop(f);
    rpc_limits_default(&l);
    rpc_limits_set(&l);
    SSL_CTX_free(cctx);
    SSL_CTX_free(sctx);
    X509_free(cert);
    EVP_PKEY_free(key);
}

int main(void) {
    /* As strata-node and strata-router do: a peer that closed (a refused or timed-out client
     * connection of these tests) must not kill the in-process server that writes to it. */
    signal(SIGPIPE, SIG_IGN);
    st_log_set_level(getenv("RPC_TEST_DEBUG") ? ST_LOG_DEBUG : ST_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_deframer_any_split),
        cmocka_unit_test(test_rpc_deframer_grows_with_arrivals),
        cmocka_unit_test(test_rpc_deframer_rejects_bad_input),
        cmocka_unit_test(test_rpc_timeout_and_message_encodings),
        cmocka_unit_test(test_rpc_unary_echo_and_metadata),
        cmocka_unit_test(test_rpc_reused_calls_keep_their_headers),
        cmocka_unit_test(test_rpc_status_message_and_unknown_method),
        cmocka_unit_test(test_rpc_message_size_limits),
        cmocka_unit_test(test_rpc_20mib_round_trip),
        cmocka_unit_test(test_rpc_many_concurrent_streams),
        cmocka_unit_test(test_rpc_stream_slow_reader_bounded),
        cmocka_unit_test(test_rpc_stream_many_small_messages),
        cmocka_unit_test(test_rpc_stream_cancel_midway),
        cmocka_unit_test(test_rpc_deadline_cancels_server_call),
        cmocka_unit_test(test_rpc_deadlines_on_queued_calls),
        cmocka_unit_test(test_rpc_held_calls_end_without_frames),
        cmocka_unit_test(test_rpc_held_calls_take_turns_by_owner),
        cmocka_unit_test(test_rpc_held_calls_newest_owner_goes_soon),
        cmocka_unit_test(test_rpc_client_cancel_reaches_handler),
        cmocka_unit_test(test_rpc_post_item_in_order),
        cmocka_unit_test(test_rpc_bad_frames_end_stream_or_connection),
        cmocka_unit_test(test_rpc_tls_expired_client_cert), /* first TLS test: see there */
        cmocka_unit_test(test_rpc_tls_alpn_h2),
        cmocka_unit_test(test_rpc_tls_many_streams),
        cmocka_unit_test(test_rpc_tls_slow_reader),
        cmocka_unit_test(test_rpc_tls_full_socket),
        cmocka_unit_test(test_rpc_tls_client_handshake_timeout),
        cmocka_unit_test(test_rpc_tls_client_names_cert_problem),
        cmocka_unit_test(test_rpc_tls_handshake_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
