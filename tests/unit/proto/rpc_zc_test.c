/* rpc_zc_test proves the send path that avoids copying large payloads: rpc_call_send_buf (the
 * buffer is handed over when the call's queue is empty, copied behind queued messages otherwise,
 * untouched on error), DATA payloads written to the socket straight from the call's queue, and
 * rpc_ccall_msg_take (a received message's buffer handed on). A real server on a loopback
 * ephemeral port (its loop on a background thread) streams messages of many sizes (empty, around
 * the 4 KiB reference threshold and the 16 KiB frame size, several MiB) with recognisable
 * contents; clients check every byte and the order: several streams on one connection, and a
 * raw HTTP/2 client with a tiny receive buffer that stops reading for a while, so the server's
 * writes are partial and the rest goes through the bufferevent. Large request bodies (sent by the
 * client from the call's own allocation) are echoed intact, also beside a cancelled one. No
 * wall-clock assertions. rpc_call_send_framed(_buf) queue messages a proxy received already framed
 * (the buffer handed over from an offset, or copied behind queued ones) and refuse, queueing
 * nothing, bytes that are not whole plain messages within the maximum. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
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

#include "raw_h2.h"
#include "frame.h" /* the deframer and wire encodings (private to proto/rpc) */
#include "strata/rpc.h"

#define ZC_MESSAGE_BYTES_MAX ((size_t)8 << 20)

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Message i of a Big stream: its size (cycling through a list) and byte at offset off. */
static const size_t big_sizes[] = {
    (size_t)3 << 20, 1,      4090, 4091,  4092, 16379, 16384, 65539, (size_t)5 << 20, 0,
    (size_t)1 << 20, 777777, 2,    20000,
};
#define BIG_SIZES_N (sizeof big_sizes / sizeof big_sizes[0])

static size_t big_size(uint32_t i) {
    return big_sizes[i % BIG_SIZES_N];
}

static uint8_t big_byte(uint32_t i, size_t off) {
    return (uint8_t)(i * 151u + off * 7u + (off >> 12));
}

/* Index of the first wrong byte of message i, or SIZE_MAX when it is right. */
static size_t big_check(uint32_t i, st_slice msg) {
    if (msg.len != big_size(i))
        return 0;
    for (size_t off = 0; off < msg.len; off++)
        if (msg.data[off] != big_byte(i, off))
            return off;
    return SIZE_MAX;
}

/* ---- the service ---- */

/* What h_sendbuf saw (written on the server thread before its response goes out). */
typedef struct sendbuf_seen {
    st_code rc_swap, rc_copy, rc_short, rc_big;
    bool swap_emptied, swap_changed_memory, swap_queued_right;
    bool copy_emptied, copy_kept_memory;
    bool short_untouched, big_untouched;
} sendbuf_seen;
static sendbuf_seen seen;
/* Set (release) once the handler filled `seen`; the test reads `seen` after an acquire load.
 * The reply already orders the two threads, but through a socket no sanitizer can see. */
static atomic_bool seen_ready;

/* Fills b with the headroom and message i of a Big stream. */
static void big_fill(st_buf *b, uint32_t i) {
    size_t n = big_size(i);
    st_buf_reset(b);
    ST_ASSERT(st_buf_reserve(b, RPC_SEND_HEADROOM + n) == ST_OK);
    b->len = RPC_SEND_HEADROOM + n;
    memset(b->data, 0xee, RPC_SEND_HEADROOM); /* any value: the server writes the prefix */
    for (size_t off = 0; off < n; off++)
        b->data[RPC_SEND_HEADROOM + off] = big_byte(i, off);
}

/* Sends Big messages 0 and 1 with rpc_call_send_buf (an empty queue, then a non-empty one) and
 * tries the error cases; records what happened in `seen`. */
static void h_sendbuf(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    st_buf a, b;
    st_buf_init(&a);
    st_buf_init(&b);
    big_fill(&a, 2); /* 4090 bytes */
    uint8_t *a_mem = a.data;
    seen.rc_swap = rpc_call_send_buf(call, &a);
    seen.swap_emptied = a.len == 0;
    seen.swap_changed_memory = a.data != a_mem;
    seen.swap_queued_right = rpc_call_queued_bytes(call) == RPC_SEND_HEADROOM + big_size(2);
    big_fill(&b, 3);
    uint8_t *b_mem = b.data;
    seen.rc_copy = rpc_call_send_buf(call, &b);
    seen.copy_emptied = b.len == 0;
    seen.copy_kept_memory = b.data == b_mem;
    st_buf_reset(&a);
    st_buf_append(&a, "abc", 3); /* shorter than the headroom */
    seen.rc_short = rpc_call_send_buf(call, &a);
    seen.short_untouched = a.len == 3 && memcmp(a.data, "abc", 3) == 0;
    st_buf_reset(&b);
    st_buf_reserve(&b, RPC_SEND_HEADROOM + ZC_MESSAGE_BYTES_MAX + 1);
    b.len = RPC_SEND_HEADROOM + ZC_MESSAGE_BYTES_MAX + 1;
    seen.rc_big = rpc_call_send_buf(call, &b);
    seen.big_untouched = b.len == RPC_SEND_HEADROOM + ZC_MESSAGE_BYTES_MAX + 1;
    st_buf_free(&a);
    st_buf_free(&b);
    atomic_store_explicit(&seen_ready, true, memory_order_release);
    rpc_call_finish(call, ST_OK, NULL);
}

/* Appends message i of a Big stream with its gRPC prefix (flag byte `flag`). */
static void framed_add(st_buf *b, uint32_t i, uint8_t flag) {
    size_t n = big_size(i);
    uint8_t p[5] = {flag, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    ST_ASSERT(st_buf_append(b, p, 5) == ST_OK);
    for (size_t off = 0; off < n; off++) {
        uint8_t c = big_byte(i, off);
        ST_ASSERT(st_buf_append(b, &c, 1) == ST_OK);
    }
}

typedef struct framed_seen {
    st_code rc_swap, rc_copy, rc_cut, rc_flag, rc_big;
    bool swap_emptied, swap_queued_right, refused_queued_nothing;
} framed_seen;
static framed_seen fseen;

/* Sends Big messages 4-6 framed, from offset 7 of a buffer (an empty queue: handed over), then
 * message 7 framed (copied behind), and tries malformed frames; records what happened. */
static void h_sendframed(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    st_buf a, b;
    st_buf_init(&a);
    st_buf_init(&b);
    ST_ASSERT(st_buf_append(&a, "0123456", 7) == ST_OK); /* a head the proxy skips */
    for (uint32_t i = 4; i <= 6; i++)
        framed_add(&a, i, 0);
    size_t framed = a.len - 7;
    fseen.rc_swap = rpc_call_send_framed_buf(call, &a, 7);
    fseen.swap_emptied = a.len == 0;
    fseen.swap_queued_right = rpc_call_queued_bytes(call) == framed;
    framed_add(&b, 7, 0);
    fseen.rc_copy = rpc_call_send_framed(call, st_buf_slice(&b));
    size_t queued = rpc_call_queued_bytes(call);
    st_buf_reset(&b);
    framed_add(&b, 8, 0);
    b.len--; /* the last message cut short */
    fseen.rc_cut = rpc_call_send_framed(call, st_buf_slice(&b));
    st_buf_reset(&b);
    framed_add(&b, 1, 0);
    framed_add(&b, 2, 1); /* compressed */
    fseen.rc_flag = rpc_call_send_framed_buf(call, &b, 0);
    st_buf_reset(&b);
    uint8_t over[5 + 16] = {
        0, (uint8_t)((ZC_MESSAGE_BYTES_MAX + 1) >> 24), (uint8_t)((ZC_MESSAGE_BYTES_MAX + 1) >> 16),
        (uint8_t)((ZC_MESSAGE_BYTES_MAX + 1) >> 8), (uint8_t)(ZC_MESSAGE_BYTES_MAX + 1)};
    fseen.rc_big = rpc_call_send_framed(call, st_slice_make(over, sizeof over));
    fseen.refused_queued_nothing = rpc_call_queued_bytes(call) == queued;
    st_buf_free(&a);
    st_buf_free(&b);
    atomic_store_explicit(&seen_ready, true, memory_order_release);
    rpc_call_finish(call, ST_OK, NULL);
}

/* Big: request = first message index (4, LE) + message count (4, LE). Produces with
 * rpc_call_send_buf while writable, reusing the buffer each send hands back. */
typedef struct big_job {
    uint32_t next, end;
    st_buf buf;
} big_job;

static void big_end(rpc_call *call, big_job *job, st_code code) {
    st_buf_free(&job->buf);
    free(job);
    rpc_call_finish(call, code, NULL);
}

static void big_pump(rpc_call *call, void *arg) {
    big_job *job = arg;
    while (job->next < job->end && rpc_call_writable(call)) {
        big_fill(&job->buf, job->next);
        st_code rc = rpc_call_send_buf(call, &job->buf);
        if (rc != ST_OK) {
            big_end(call, job, rc);
            return;
        }
        job->next++;
    }
    if (job->next == job->end)
        big_end(call, job, ST_OK);
}

static void big_cancel(rpc_call *call, void *arg) {
    big_end(call, arg, ST_CANCELLED);
}

static void h_big(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    if (req.len != 8) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "want 8 bytes");
        return;
    }
    big_job *job = calloc(1, sizeof(*job));
    job->next = st_get_fixed32(req.data);
    job->end = job->next + st_get_fixed32(req.data + 4);
    st_buf_init(&job->buf);
    rpc_call_set_cancel_cb(call, big_cancel, job);
    rpc_call_set_writable_cb(call, big_pump, job);
    big_pump(call, job);
}

/* Echo, handing the request's copy over with rpc_call_send_buf. */
static void h_echo(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    st_buf b;
    st_buf_init(&b);
    ST_ASSERT(st_buf_reserve(&b, RPC_SEND_HEADROOM + req.len) == ST_OK);
    b.len = RPC_SEND_HEADROOM;
    st_buf_append(&b, req.data, req.len);
    st_code rc = rpc_call_send_buf(call, &b);
    st_buf_free(&b);
    rpc_call_finish(call, rc, NULL);
}

/* ---- server fixture: the loop runs on its own thread ---- */

typedef struct fixture {
    struct event_base *base;
    rpc_server *srv;
    uint16_t port;
    pthread_t th;
    char addr[64];
} fixture;

static void *loop_thread(void *arg) {
    fixture *f = arg;
    event_base_dispatch(f->base);
    return NULL;
}

static int fixture_setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    st_err err = {0};
    rpc_server_opts opts = {.message_bytes_max = ZC_MESSAGE_BYTES_MAX};
    f->base = event_base_new();
    f->srv = rpc_server_new(f->base, &opts, &err);
    assert_non_null(f->srv);
    assert_int_equal(rpc_server_add_method(f->srv, "/z.Z/SendBuf", h_sendbuf, NULL), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/z.Z/Big", h_big, NULL), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/z.Z/SendFramed", h_sendframed, NULL), ST_OK);
    assert_int_equal(rpc_server_add_method(f->srv, "/z.Z/Echo", h_echo, NULL), ST_OK);
    assert_int_equal(rpc_server_listen(f->srv, "127.0.0.1", 0, &f->port, &err), ST_OK);
    snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%u", f->port);
    assert_int_equal(pthread_create(&f->th, NULL, loop_thread, f), 0);
    *state = f;
    return 0;
}

static void loop_stop(void *arg) {
    event_base_loopbreak(arg);
}

static int fixture_teardown(void **state) {
    fixture *f = *state;
    assert_int_equal(rpc_server_post(f->srv, loop_stop, f->base), ST_OK);
    pthread_join(f->th, NULL);
    rpc_server_free(f->srv);
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    event_base_free(f->base);
    free(f);
    return 0;
}

static void big_request(uint8_t req[8], uint32_t first, uint32_t count) {
    for (int k = 0; k < 4; k++) {
        req[k] = (uint8_t)(first >> (8 * k));
        req[4 + k] = (uint8_t)(count >> (8 * k));
    }
}

/* Queued bytes drain to zero once every call is done (the stats survive the new path). */
static void assert_queue_drained(fixture *f) {
    rpc_server_stats st;
    for (int i = 0; i < 10000; i++) {
        rpc_server_stats_get(f->srv, &st);
        if (st.queued_bytes == 0 && st.calls_active == 0)
            break;
        sleep_ms(1);
    }
    assert_int_equal(st.queued_bytes, 0);
    assert_int_equal(st.calls_active, 0);
    assert_true(st.queued_bytes_peak > 0);
}

/* ---- send_buf with an empty and a non-empty queue, and its errors ---- */

typedef struct collect {
    uint32_t first, got;
    size_t bad_at; /* SIZE_MAX while every message is right */
} collect;

static void collect_msg(st_slice msg, void *arg) {
    collect *c = arg;
    if (c->bad_at == SIZE_MAX && big_check(c->first + c->got, msg) != SIZE_MAX)
        c->bad_at = c->got;
    c->got++;
}

static void test_rpc_zc_send_buf_swaps_or_copies(void **state) {
    fixture *f = *state;
    st_err status = {0};
    collect c = {.first = 2, .bad_at = SIZE_MAX};
    assert_int_equal(rpc_blocking_stream(f->addr, NULL, "/z.Z/SendBuf", ST_SLICE_LIT("x"), NULL, 0,
                                         30000, collect_msg, &c, &status),
                     ST_OK);
    assert_true(atomic_load_explicit(&seen_ready, memory_order_acquire));
    assert_int_equal(c.got, 2);
    assert_int_equal(c.bad_at, SIZE_MAX);
    assert_int_equal(seen.rc_swap, ST_OK);
    assert_true(seen.swap_emptied);
    assert_true(seen.swap_changed_memory); /* the caller got the queue's memory back */
    assert_true(seen.swap_queued_right);
    assert_int_equal(seen.rc_copy, ST_OK);
    assert_true(seen.copy_emptied);
    assert_true(seen.copy_kept_memory); /* copied behind message 0: the buffer stays the caller's */
    assert_int_equal(seen.rc_short, ST_INVALID_ARGUMENT);
    assert_true(seen.short_untouched);
    assert_int_equal(seen.rc_big, ST_RESOURCE_EXHAUSTED);
    assert_true(seen.big_untouched);
    assert_queue_drained(f);
}

static void test_rpc_zc_send_framed_hands_over_or_copies(void **state) {
    fixture *f = *state;
    st_err status = {0};
    atomic_store_explicit(&seen_ready, false, memory_order_release);
    collect c = {.first = 4, .bad_at = SIZE_MAX};
    assert_int_equal(rpc_blocking_stream(f->addr, NULL, "/z.Z/SendFramed", ST_SLICE_LIT("x"), NULL,
                                         0, 30000, collect_msg, &c, &status),
                     ST_OK);
    assert_true(atomic_load_explicit(&seen_ready, memory_order_acquire));
    assert_int_equal(c.got, 4); /* messages 4-7, each whole and in order */
    assert_int_equal(c.bad_at, SIZE_MAX);
    assert_int_equal(fseen.rc_swap, ST_OK);
    assert_true(fseen.swap_emptied);
    assert_true(fseen.swap_queued_right);
    assert_int_equal(fseen.rc_copy, ST_OK);
    assert_int_equal(fseen.rc_cut, ST_INVALID_ARGUMENT);
    assert_int_equal(fseen.rc_flag, ST_INVALID_ARGUMENT);
    assert_int_equal(fseen.rc_big, ST_INVALID_ARGUMENT);
    assert_true(fseen.refused_queued_nothing);
    assert_queue_drained(f);
}

/* ---- several large streams on one connection; the client takes message buffers ---- */

#define ZC_STREAMS 4

typedef struct multi_ctx {
    struct event_base *base;
    collect col[ZC_STREAMS];
    st_code code[ZC_STREAMS];
    int done;
    int taken; /* messages whose buffer rpc_ccall_msg_take handed over */
    bool take_layout_ok;
    st_buf take;
} multi_ctx;

typedef struct multi_call {
    multi_ctx *m;
    int idx;
} multi_call;

static void multi_msg(rpc_ccall *call, st_slice msg, void *arg) {
    multi_call *mc = arg;
    multi_ctx *m = mc->m;
    if (rpc_ccall_msg_take(call, &m->take)) {
        m->taken++;
        /* The headroom, then the very bytes the slice shows; a second take has nothing. */
        if (m->take.len != RPC_SEND_HEADROOM + msg.len ||
            m->take.data + RPC_SEND_HEADROOM != msg.data || rpc_ccall_msg_take(call, &m->take))
            m->take_layout_ok = false;
    }
    collect *c = &m->col[mc->idx];
    if (c->bad_at == SIZE_MAX && big_check(c->first + c->got, msg) != SIZE_MAX)
        c->bad_at = c->got;
    c->got++;
}

static void multi_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    multi_call *mc = arg;
    mc->m->code[mc->idx] = code;
    if (++mc->m->done == ZC_STREAMS)
        event_base_loopbreak(mc->m->base);
}

static void test_rpc_zc_large_streams_intact_in_order(void **state) {
    fixture *f = *state;
    multi_ctx m = {.take_layout_ok = true};
    multi_call mc[ZC_STREAMS];
    m.base = event_base_new();
    st_buf_init(&m.take);
    st_err err = {0};
    rpc_client *c = rpc_client_new(m.base, "127.0.0.1", f->port, NULL, &err);
    assert_non_null(c);
    for (int i = 0; i < ZC_STREAMS; i++) {
        uint8_t req[8];
        m.col[i] = (collect){.first = (uint32_t)i * 5, .bad_at = SIZE_MAX};
        m.code[i] = ST_UNKNOWN;
        mc[i] = (multi_call){&m, i};
        big_request(req, m.col[i].first, BIG_SIZES_N);
        assert_non_null(rpc_client_call(c, "/z.Z/Big", st_slice_make(req, 8), NULL, 0, 60000,
                                        multi_msg, multi_done, &mc[i]));
    }
    event_base_dispatch(m.base);
    for (int i = 0; i < ZC_STREAMS; i++) {
        assert_int_equal(m.code[i], ST_OK);
        assert_int_equal(m.col[i].got, BIG_SIZES_N);
        assert_int_equal(m.col[i].bad_at, SIZE_MAX);
    }
    assert_true(m.taken > 0); /* at least the MiB messages were reassembled, hence taken */
    assert_true(m.take_layout_ok);
    rpc_client_free(c);
    event_base_loop(m.base, EVLOOP_NONBLOCK);
    event_base_free(m.base);
    st_buf_free(&m.take);
    assert_queue_drained(f);
}

/* ---- a slow raw reader: partial writes, the rest through the bufferevent ---- */

/* A socket with a tiny receive buffer, so the server's socket fills at once. */
static int slow_connect(uint16_t port) {
    int fd = raw_tcp_connect(port, 4096);
    assert_true(fd >= 0);
    return fd;
}

#define NVS(n, v)                                                                                  \
    { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0 }

static st_code deframe_msg(st_slice msg, void *arg) {
    collect_msg(msg, arg);
    return ST_OK;
}

static void test_rpc_zc_slow_reader_gets_everything_in_order(void **state) {
    fixture *f = *state;
    uint8_t body[13];
    raw_call r = {
        .fd = slow_connect(f->port), .body = body, .body_len = sizeof body, .grpc_status = -1};
    st_buf_init(&r.data);
    uint32_t first = 7, count = 2 * BIG_SIZES_N;
    rpc_frame_prefix(body, 8);
    big_request(body + 5, first, count);
    nghttp2_session *s = raw_session(&r, true);
    assert_non_null(s);
    nghttp2_nv nva[] = {NVS(":method", "POST"),
                        NVS(":scheme", "http"),
                        NVS(":path", "/z.Z/Big"),
                        NVS(":authority", "t"),
                        NVS("content-type", "application/grpc"),
                        NVS("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 6, &prd, NULL) > 0);
    assert_int_equal(nghttp2_session_send(s), 0);
    sleep_ms(200); /* not reading: the server's socket fills and its writes go partial */
    static uint8_t buf[16384];
    for (int rounds = 0; !r.closed; rounds++) {
        size_t want = rounds < 200 ? 1024 : sizeof buf; /* slowly at first */
        ssize_t n = recv(r.fd, buf, want, 0);
        assert_true(n > 0);
        assert_true(nghttp2_session_mem_recv(s, buf, (size_t)n) == n);
        assert_int_equal(nghttp2_session_send(s), 0); /* window updates */
        if (rounds < 200 && rounds % 20 == 0)
            sleep_ms(2);
    }
    assert_int_equal(r.grpc_status, 0);
    rpc_deframer d;
    rpc_deframer_init(&d, ZC_MESSAGE_BYTES_MAX);
    collect c = {.first = first, .bad_at = SIZE_MAX};
    st_err err = {0};
    assert_int_equal(rpc_deframer_feed(&d, r.data.data, r.data.len, &err, deframe_msg, &c), ST_OK);
    assert_int_equal(rpc_deframer_finish(&d, &err), ST_OK);
    assert_int_equal(c.got, count);
    assert_int_equal(c.bad_at, SIZE_MAX);
    rpc_deframer_deinit(&d);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
    assert_queue_drained(f);
}

/* ---- large request bodies: sent from the call's allocation, also when cancelled ---- */

typedef struct echo_ctx {
    struct event_base *base;
    int done;
    st_code code[3];
    bool intact[3];
    st_slice want;
} echo_ctx;

typedef struct echo_call {
    echo_ctx *e;
    int idx;
} echo_call;

static void echo_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    echo_call *ec = arg;
    ec->e->intact[ec->idx] = st_slice_eq(msg, ec->e->want);
}

static void echo_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    echo_call *ec = arg;
    ec->e->code[ec->idx] = code;
    if (++ec->e->done == 3)
        event_base_loopbreak(ec->e->base);
}

static void test_rpc_zc_large_requests_and_cancel(void **state) {
    fixture *f = *state;
    size_t n = (size_t)6 << 20;
    uint8_t *body = malloc(n);
    for (size_t off = 0; off < n; off++)
        body[off] = big_byte(99, off);
    echo_ctx e = {.base = event_base_new(), .want = st_slice_make(body, n)};
    echo_call ec[3] = {{&e, 0}, {&e, 1}, {&e, 2}};
    st_err err = {0};
    rpc_client *c = rpc_client_new(e.base, "127.0.0.1", f->port, NULL, &err);
    assert_non_null(c);
    rpc_ccall *calls[3];
    for (int i = 0; i < 3; i++)
        calls[i] =
            rpc_client_call(c, "/z.Z/Echo", e.want, NULL, 0, 60000, echo_msg, echo_done, &ec[i]);
    rpc_ccall_cancel(calls[1]); /* its body may be half queued: it must still be sent safely */
    event_base_dispatch(e.base);
    assert_int_equal(e.code[0], ST_OK);
    assert_true(e.intact[0]);
    assert_int_equal(e.code[1], ST_CANCELLED);
    assert_int_equal(e.code[2], ST_OK);
    assert_true(e.intact[2]);
    rpc_client_free(c);
    event_base_loop(e.base, EVLOOP_NONBLOCK);
    event_base_free(e.base);
    /* And through the blocking helper, on its own connection. */
    st_buf resp;
    st_buf_init(&resp);
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/z.Z/Echo", st_slice_make(body, n), NULL, 0,
                                        60000, &resp, &err),
                     ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&resp), st_slice_make(body, n)));
    st_buf_free(&resp);
    free(body);
    assert_queue_drained(f);
}

int main(void) {
    /* As strata-node and strata-router do: a peer that closed (a refused or timed-out client
     * connection of these tests) must not kill the in-process server that writes to it. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_zc_send_buf_swaps_or_copies),
        cmocka_unit_test(test_rpc_zc_send_framed_hands_over_or_copies),
        cmocka_unit_test(test_rpc_zc_large_streams_intact_in_order),
        cmocka_unit_test(test_rpc_zc_slow_reader_gets_everything_in_order),
        cmocka_unit_test(test_rpc_zc_large_requests_and_cancel),
    };
    return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}
