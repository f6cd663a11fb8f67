/* The gRPC server, shaped like nghttp2's examples/libevent-server.c, in layers:
 *   rpc_server — listeners, the method table, a cross-thread post queue (eventfd);
 *   h2_conn    — one per connection: a bufferevent, an nghttp2 session, its calls, and ONE close
 *                function (h2_conn_close) that every failure reaches. Output stops at
 *                H2_CONN_OUTPUT_HIGH_WATER_BYTES and resumes when the socket drains;
 *   rpc_call   — one per stream: arena, headers, deadline, request deframer, response queue.
 *
 * Lifetime of a call: the stream holds one reference until nghttp2 closes the stream (or the
 * connection dies); the handler holds one from dispatch until rpc_call_finish. Whatever is left
 * after the stream is gone is "detached": sends and finishes on it are no-ops. */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/listener.h>
#include <nghttp2/nghttp2.h>

#include "rpc_internal.h"
#include "rpc_metrics.h"

#define STAT_ADD(srv, field, n)                                                                    \
    __atomic_fetch_add(&(srv)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED)
#define STAT_SUB(srv, field, n)                                                                    \
    __atomic_fetch_sub(&(srv)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED)
#define RPC_LISTENERS_MAX 8
#define RPC_METHODS_MAX 1024
#define ACCEPT_BACKOFF_MS_MIN 100u  /* first pause of the listeners after accept() starved */
#define ACCEPT_BACKOFF_MS_MAX 3200u /* the pause doubles up to this */
#define CONN_TICK_MS_MIN 5u         /* connection timers fire at most this often */
#define CONN_TICK_MS_MAX 60000u

typedef struct rpc_method_ent {
    char *path;
    rpc_handler_fn handler;
    void *arg;
} rpc_method_ent;

typedef rpc_post post_item;

typedef struct h2_conn h2_conn;

struct rpc_server {
    struct event_base *base;
    rpc_server_opts opts; /* defaults filled in */
    rpc_method_ent *methods;
    size_t methods_len;
    struct evconnlistener *listeners[RPC_LISTENERS_MAX];
    size_t listeners_len;
    /* Unix-domain listeners' socket files, removed by rpc_server_free when still ours (same
     * device and inode as bound: a later server may have replaced the file meanwhile). */
    struct {
        char *path;
        dev_t dev;
        ino_t ino;
    } unix_files[RPC_LISTENERS_MAX];
    size_t unix_len;
    h2_conn *conns;
    pthread_mutex_t post_mu;
    post_item *post_head, *post_tail;
    size_t post_len;
    int post_fd;
    struct event *post_ev;
    rpc_server_stats stats;   /* updated and read with __atomic builtins */
    rpc_metrics metrics;      /* per-method counters and latencies (loop thread; rpc_metrics.h) */
    rpc_limits limits;        /* the process's limits when created; connections_max resolved */
    struct timeval conn_tick; /* period of each connection's timer (zero: no timer) */
    /* accept() failed for lack of descriptors or memory: the listeners pause and accept_ev
     * resumes them after accept_backoff_ms, which doubles while failures go on. */
    struct event *accept_ev;
    uint32_t accept_backoff_ms;
    bool accept_paused;
};

struct h2_conn {
    rpc_server *srv;
    const h2_transport *tp;
    struct bufferevent *bev;
    nghttp2_session *session;
    rpc_call *calls;
    size_t request_bytes; /* request bytes buffered by this connection's calls */
    /* API calls (send, finish) only queue frames and activate this event, which flushes from the
     * loop: so no API function re-enters user callbacks or closes the connection under them. */
    struct event *flush_ev;
    /* plain socket: output goes to wbuf and h2_conn_flush writes it itself (h2_out_write_now),
     * read_ev reads it (h2_sock_read); the bufferevent only writes what the socket would not
     * take at once. Large DATA payloads in wbuf are references into their call's `out`, written
     * before anything frees, moves or overwrites those bytes (conn_out_settle). */
    bool direct;
    h2_wbuf wbuf;
    struct event *read_ev;
    /* Periodic: the handshake, idle and slow-request timeouts (conn_timer_cb). */
    struct event *timer_ev;
    int64_t accepted_us;   /* st_mono_us */
    int64_t idle_since_us; /* when its last call ended (or it became ready) */
    bool ready;            /* the client's preface and SETTINGS arrived */
    bool slot;             /* holds one of the process's connection slots */
    h2_conn *prev, *next;
};

typedef struct call_hdr {
    const char *name;
    const char *value;
} call_hdr;

struct rpc_call {
    int refs;
    h2_conn *conn; /* NULL once detached */
    int32_t stream_id;
    st_arena arena;
    const rpc_method_ent *method;
    const char *path;
    size_t hdrs_len;
    size_t hdr_bytes;
    size_t hdr_text_used; /* of hdr_text */
    st_err early;         /* a header problem found while parsing, reported at END_HEADERS */
    int http_status;
    bool saw_post, saw_content_type;
    int64_t deadline_us;
    struct event *deadline_ev; /* NULL, or the timer at the end of the call's allocation */
    rpc_deframer deframer;
    st_buf request;
    size_t request_skip;     /* bytes before the message in request (a taken deframer buffer) */
    size_t request_bytes;    /* reserved in conn->request_bytes (given back when detached) */
    size_t mem_reserved;     /* reserved in the process's budget (given back when released) */
    size_t request_received; /* request DATA bytes so far */
    int64_t slow_mark_us;    /* the slow-request check's window start ... */
    size_t slow_mark_bytes;  /* ... and request_received then */
    bool dispatched, finished, cancelled, headers_sent, handler_ref, was_full;
    bool metered;     /* recorded in the server's metrics (once, at its final status) */
    int64_t start_us; /* st_mono_us when its headers began: the latency metric's start */
    st_code status;
    const char *status_msg; /* percent-encoded, in the arena */
    st_buf out;             /* framed response bytes; [out_off, out.len) still queued */
    size_t out_off;
    void (*on_cancel)(rpc_call *, void *);
    void *on_cancel_arg;
    void (*on_writable)(rpc_call *, void *);
    void *on_writable_arg;
    struct event *notify_ev;
    rpc_call *prev, *next;
    char code_text[12], http_text[12]; /* grpc-status and :status values of the final HEADERS */
    /* Not zeroed by call_new (only [0, hdrs_len) and [0, hdr_text_used) are ever read): */
    call_hdr hdrs[RPC_HEADERS_COUNT_MAX];
    /* Request header names and values, NUL-terminated; the arena takes what does not fit. A
     * typical request's headers fit, so most calls allocate nothing for them. */
    char hdr_text[1024];
};

static void h2_conn_close(h2_conn *conn);
static void call_finish_internal(rpc_call *call, st_code code, const char *msg);
static h2_wbuf *conn_wbuf(h2_conn *conn);
static void conn_out_settle(h2_conn *conn);

/* Response headers are handed to nghttp2 without copies (H2_NV): every name and value is a
 * literal or lives in the call (status texts, the arena's grpc-message), which outlasts the
 * HEADERS frame: the call is released only after its stream closed, and nghttp2 drops a frame of
 * a closed stream without reading it. */

/* ---- calls ---- */

/* Released calls are kept per thread for the next streams (a call is a few KiB, beyond malloc's
 * per-thread cache, and each also held a request and a response buffer): a forwarded unary call
 * then allocates neither its call nor, usually, its buffers. Per thread rather than per server
 * because a call may outlive its server (rpc_server_free); freed at thread exit. */
#define CALL_CACHE_MAX 128
#define CALL_CACHE_BUF_BYTES_MAX ((size_t)64 << 10) /* larger buffers are freed, not kept */

typedef struct call_cache {
    rpc_call *head; /* linked by next */
    size_t n;
    bool registered; /* for draining at thread exit */
} call_cache;

static _Thread_local call_cache tl_call_cache;

static void call_cache_drain(void *arg) {
    call_cache *cc = arg;
    while (cc->head) {
        rpc_call *call = cc->head;
        cc->head = call->next;
        st_buf_free(&call->request);
        st_buf_free(&call->out);
        free(call);
    }
    cc->n = 0;
}

/* Keeps buf's memory for the next call when it is small, else frees it. */
static void call_buf_keep(st_buf *buf) {
    if (buf->cap > CALL_CACHE_BUF_BYTES_MAX)
        st_buf_free(buf);
    else
        st_buf_reset(buf);
}

static void call_release(rpc_call *call) {
    h2_loop_calls(-1);
    if (call->mem_reserved)
        rpc_mem_release(call->mem_reserved);
    rpc_deframer_deinit(&call->deframer);
    st_arena_deinit(&call->arena);
    call_cache *cc = &tl_call_cache;
    if (!cc->registered) { /* first use on this thread: drain the cache at thread exit */
        cc->registered = RPC_TL_CACHE_ON && rpc_tl_at_thread_exit(call_cache_drain, cc);
        if (!cc->registered)
            cc = NULL;
    }
    if (!cc || cc->n >= CALL_CACHE_MAX) {
        st_buf_free(&call->request);
        st_buf_free(&call->out);
        free(call);
        return;
    }
    call_buf_keep(&call->request);
    call_buf_keep(&call->out);
    call->next = cc->head;
    cc->head = call;
    cc->n++;
}

void rpc_call_ref(rpc_call *call) {
    call->refs++;
}

void rpc_call_unref(rpc_call *call) {
    ST_ASSERT(call->refs > 0);
    if (--call->refs == 0)
        call_release(call);
}

/* Where a call's deadline timer lives in its allocation. */
static size_t call_timer_offset(void) {
    return (sizeof(rpc_call) + 15) & ~(size_t)15;
}

static rpc_call *call_new(h2_conn *conn, int32_t stream_id) {
    call_cache *cc = &tl_call_cache;
    rpc_call *call = cc->head;
    st_buf request, out;
    if (call) {
        cc->head = call->next;
        cc->n--;
        request = call->request; /* kept memory, len 0 */
        out = call->out;
    } else {
        call = malloc(call_timer_offset() + event_get_struct_event_size());
        if (!call)
            return NULL;
        st_buf_init(&request);
        st_buf_init(&out);
    }
    memset(call, 0, offsetof(rpc_call, hdrs));
    call->request = request;
    call->out = out;
    call->refs = 1; /* the stream's */
    call->conn = conn;
    call->stream_id = stream_id;
    call->http_status = 200;
    call->start_us = st_mono_us();
    call->slow_mark_us = call->start_us;
    st_arena_init(&call->arena, RPC_CALL_ARENA_BLOCK_BYTES);
    rpc_deframer_init(&call->deframer, conn->srv->opts.message_bytes_max);
    call->next = conn->calls;
    if (conn->calls)
        conn->calls->prev = call;
    conn->calls = call;
    STAT_ADD(conn->srv, calls_started, 1);
    STAT_ADD(conn->srv, calls_active, 1);
    h2_loop_calls(1);
    return call;
}

/* Records the call's final status and latency in the server's metrics, once. */
static void call_meter(rpc_server *srv, rpc_call *call, st_code code) {
    if (call->metered)
        return;
    call->metered = true;
    size_t idx = call->method ? (size_t)(call->method - srv->methods) : SIZE_MAX;
    rpc_metrics_record(&srv->metrics, idx, code, st_mono_us() - call->start_us);
}

static void call_run_cancel(rpc_call *call) {
    if (call->cancelled)
        return;
    call->cancelled = true;
    if (call->on_cancel) {
        rpc_call_ref(call);
        call->on_cancel(call, call->on_cancel_arg);
        rpc_call_unref(call);
    }
}

/* The stream is gone (closed normally, reset, or its connection died). */
static void call_detach(rpc_call *call) {
    h2_conn *conn = call->conn;
    if (!conn)
        return;
    rpc_server *srv = conn->srv;
    if (call->prev)
        call->prev->next = call->next;
    else
        conn->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    call->prev = call->next = NULL;
    if (!conn->calls)
        conn->idle_since_us = st_mono_us();
    conn->request_bytes -= call->request_bytes;
    call->request_bytes = 0;
    STAT_SUB(srv, queued_bytes, call->out.len - call->out_off);
    STAT_SUB(srv, calls_active, 1);
    /* The queue's last frames may be referenced by wbuf (a stream closes when its trailers went
     * into wbuf, before the write): keep its memory until then instead of writing now. */
    if (h2_out_pinned(conn_wbuf(conn)) && call->out.data) {
        if (h2_wbuf_retire(&conn->wbuf, call->out.data))
            st_buf_init(&call->out);
        else
            conn_out_settle(conn);
    }
    call_buf_keep(&call->out); /* nothing references it now: the next call may reuse it */
    call->out_off = 0;
    if (call->deadline_ev)
        event_del(call->deadline_ev);
    if (call->notify_ev)
        event_free(call->notify_ev);
    call->deadline_ev = call->notify_ev = NULL;
    call->conn = NULL;
    if (!call->finished) {
        STAT_ADD(srv, calls_cancelled, 1);
        call_meter(srv, call, ST_CANCELLED);
        call_run_cancel(call);
    }
    rpc_call_unref(call);
}

const char *rpc_call_header(const rpc_call *call, const char *name) {
    for (size_t i = 0; i < call->hdrs_len; i++) /* first byte first: most names differ there */
        if (call->hdrs[i].name[0] == name[0] && strcmp(call->hdrs[i].name, name) == 0)
            return call->hdrs[i].value;
    return NULL;
}

const char *rpc_call_path(const rpc_call *call) {
    return call->path ? call->path : "";
}
st_arena *rpc_call_arena(rpc_call *call) {
    return &call->arena;
}
int64_t rpc_call_deadline_us(const rpc_call *call) {
    return call->deadline_us;
}
bool rpc_call_cancelled(const rpc_call *call) {
    return call->cancelled || !call->conn;
}
size_t rpc_call_queued_bytes(const rpc_call *call) {
    return call->out.len - call->out_off;
}

bool rpc_call_writable(const rpc_call *call) {
    return call->conn && !call->finished &&
           rpc_call_queued_bytes(call) < call->conn->srv->opts.send_queue_bytes_max;
}

void rpc_call_set_cancel_cb(rpc_call *call, void (*on_cancel)(rpc_call *, void *), void *arg) {
    call->on_cancel = on_cancel;
    call->on_cancel_arg = arg;
}

static void call_notify_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_call *call = arg;
    if (!call->conn || call->finished || call->cancelled || !call->on_writable)
        return;
    rpc_call_ref(call);
    call->on_writable(call, call->on_writable_arg);
    rpc_call_unref(call);
}

void rpc_call_set_writable_cb(rpc_call *call, void (*on_writable)(rpc_call *, void *), void *arg) {
    call->on_writable = on_writable;
    call->on_writable_arg = arg;
    if (call->conn && !call->notify_ev)
        call->notify_ev = event_new(call->conn->srv->base, -1, 0, call_notify_cb, call);
    /* Room already: say so from the loop, so a producer that registers late is not stranded. */
    if (call->notify_ev && rpc_call_writable(call))
        event_active(call->notify_ev, EV_TIMEOUT, 0);
}

/* ---- connection output ---- */

/* Where send_cb queues output (see h2_out_add). */
static h2_wbuf *conn_wbuf(h2_conn *conn) {
    return conn->direct ? &conn->wbuf : NULL;
}

/* wbuf may reference bytes of calls' response queues (send_data_cb): write them out before a
 * queue is compacted or handed back to a caller (or freed, if it cannot be retired). Only ever
 * needed inside a flush (a cancel callback sending), as h2_conn_flush writes after every pass. */
static void conn_out_settle(h2_conn *conn) {
    if (h2_out_pinned(conn_wbuf(conn)))
        h2_out_write_now(conn->bev, &conn->wbuf);
}

static bool h2_conn_flush(h2_conn *conn) {
    int rv;
    do {
        rv = nghttp2_session_send(conn->session);
        if (rv != 0) {
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"h2 send failed\" err=\"%s\"", nghttp2_strerror(rv));
            return false;
        }
    } while (conn->direct && h2_out_write_now(conn->bev, &conn->wbuf) &&
             nghttp2_session_want_write(conn->session));
    if (!nghttp2_session_want_read(conn->session) && !nghttp2_session_want_write(conn->session) &&
        h2_out_len(conn->bev, conn_wbuf(conn)) == 0)
        return false; /* GOAWAY exchanged and everything written: done */
    return true;
}

static void conn_flush_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    h2_conn *conn = arg;
    if (!h2_conn_flush(conn))
        h2_conn_close(conn);
}

/* User code queued output: flush it from the loop (re-activating an active event is a no-op). */
static void h2_conn_kick(h2_conn *conn) {
    event_active(conn->flush_ev, EV_TIMEOUT, 0);
}

static ssize_t send_cb(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data) {
    (void)session;
    (void)flags;
    h2_conn *conn = user_data;
    if (h2_out_len(conn->bev, conn_wbuf(conn)) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK; /* resumed by the write callback */
    if (!h2_out_add(conn->bev, conn_wbuf(conn), data, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

/* ---- responses ---- */

/* Decimal text of a non-negative status (gRPC codes, HTTP statuses) into buf[12]: every call
 * ends with one, so no snprintf. */
static const char *status_text(char buf[12], int v) {
    char *p = buf + 11;
    unsigned u = v < 0 ? 0u : (unsigned)v;
    *p = 0;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u && p > buf);
    return p;
}

static int submit_trailers(h2_conn *conn, rpc_call *call) {
    const char *code = status_text(call->code_text, (int)call->status);
    nghttp2_nv nva[] = {H2_NV("grpc-status", code), H2_NV("grpc-message", call->status_msg)};
    size_t n = call->status_msg[0] ? 2 : 1;
    return nghttp2_submit_trailer(conn->session, call->stream_id, nva, n);
}

/* Response bytes [out_off, out_off + n) went out in a DATA frame: drop them from the queue and
 * tell a producer waiting for room. */
static void call_out_consumed(h2_conn *conn, rpc_call *call, size_t n) {
    call->out_off += n;
    STAT_SUB(conn->srv, queued_bytes, n);
    size_t left = call->out.len - call->out_off;
    if (left == 0) {
        st_buf_reset(&call->out);
        call->out_off = 0;
    }
    size_t bound = conn->srv->opts.send_queue_bytes_max;
    if (call->notify_ev && !call->finished && ((call->was_full && left < bound / 2) || left == 0)) {
        call->was_full = false;
        event_active(call->notify_ev, EV_TIMEOUT, 0);
    }
}

/* DATA frames are NO_COPY: nghttp2 only sizes them here and send_data_cb writes the frame header
 * and the bytes straight from the call's queue into the socket's output (large payloads are not
 * even copied there: see h2_out_add_ref), saving a copy through nghttp2's own frame buffer. */
static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf,
                            size_t length, uint32_t *data_flags, nghttp2_data_source *source,
                            void *user_data) {
    (void)session;
    (void)stream_id;
    (void)buf;
    h2_conn *conn = user_data;
    rpc_call *call = source->ptr;
    size_t avail = call->out.len - call->out_off;
    if (avail == 0) {
        if (!call->finished)
            return NGHTTP2_ERR_DEFERRED; /* resumed by rpc_call_send / rpc_call_finish */
        *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (submit_trailers(conn, call) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    return (ssize_t)(avail < length ? avail : length);
}

/* Sends one NO_COPY DATA frame sized by data_read_cb: the bytes are still the first `length` of
 * the call's queue (rpc_call_send only appends, and its compaction keeps them first). nghttp2
 * drops the frame instead of calling here when the stream closed meanwhile. */
static int send_data_cb(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *source, void *user_data) {
    (void)session;
    h2_conn *conn = user_data;
    rpc_call *call = source->ptr;
    h2_wbuf *wbuf = conn_wbuf(conn);
    if (h2_out_len(conn->bev, wbuf) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK; /* retried with the same frame once the socket drains */
    if (frame->data.padlen != 0 || length > call->out.len - call->out_off)
        return NGHTTP2_ERR_CALLBACK_FAILURE; /* we never pad; the queue never shrinks under us */
    /* A large payload is referenced where it lies: it stays put until h2_conn_flush writes
     * (call_out_consumed only moves out_off, or resets an emptied queue keeping its memory). */
    if (!h2_out_add(conn->bev, wbuf, framehd, 9) ||
        !h2_out_add_ref(conn->bev, wbuf, call->out.data + call->out_off, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    call_out_consumed(conn, call, length);
    return 0;
}

static int submit_headers(h2_conn *conn, rpc_call *call, bool with_body) {
    nghttp2_data_provider prd = {.source = {.ptr = call}, .read_callback = data_read_cb};
    nghttp2_nv nva[] = {H2_NV(":status", "200"), H2_NV("content-type", "application/grpc")};
    call->headers_sent = true;
    return nghttp2_submit_response(conn->session, call->stream_id, nva, 2, with_body ? &prd : NULL);
}

/* A response with no messages: one HEADERS frame carrying the status (gRPC "trailers-only"). */
static int submit_trailers_only(h2_conn *conn, rpc_call *call) {
    const char *code = status_text(call->code_text, (int)call->status);
    const char *http = status_text(call->http_text, call->http_status);
    nghttp2_nv nva[] = {H2_NV(":status", http), H2_NV("content-type", "application/grpc"),
                        H2_NV("grpc-status", code), H2_NV("grpc-message", call->status_msg)};
    call->headers_sent = true;
    return nghttp2_submit_response(conn->session, call->stream_id, nva, call->status_msg[0] ? 4 : 3,
                                   NULL);
}

static void call_finish_internal(rpc_call *call, st_code code, const char *msg) {
    if (call->finished)
        return;
    call->finished = true;
    call->status = code;
    if (call->conn)
        call_meter(call->conn->srv, call, code);
    if (!msg || !msg[0]) {
        call->status_msg = ""; /* most calls: no message, nothing to keep */
    } else {
        char enc[RPC_GRPC_MESSAGE_MAX];
        rpc_percent_encode(msg, enc, sizeof(enc));
        char *dup = st_arena_dup(&call->arena, enc, strlen(enc) + 1);
        call->status_msg = dup ? dup : "";
    }
    if (call->deadline_ev)
        event_del(call->deadline_ev);
    h2_conn *conn = call->conn;
    if (!conn)
        return;
    int rv = call->headers_sent ? nghttp2_session_resume_data(conn->session, call->stream_id)
                                : submit_trailers_only(conn, call);
    (void)rv; /* resume fails harmlessly when the provider is not deferred */
    h2_conn_kick(conn);
}

/* The layer itself ends a stream with an error (bad request). */
static void call_fail(rpc_call *call, st_code code, const char *msg) {
    if (call->finished)
        return;
    if (call->conn)
        STAT_ADD(call->conn->srv, bad_streams, 1);
    RPC_LOG_LIMITED(ST_LOG_DEBUG, "msg=\"stream failed\" code=%s detail=\"%s\"", st_code_name(code),
                    msg);
    call_finish_internal(call, code, msg);
}

/* Whether a message of len bytes may be queued now: ST_OK, or rpc_call_send's error. */
static st_code call_send_check(const rpc_call *call, size_t len) {
    h2_conn *conn = call->conn;
    if (!conn || call->finished || call->cancelled)
        return ST_CANCELLED;
    const rpc_server_opts *o = &conn->srv->opts;
    if (len > o->message_bytes_max ||
        rpc_call_queued_bytes(call) + len > o->send_queue_bytes_max + o->message_bytes_max)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* n framed bytes were added to the call's queue: count them and get them sent. */
static st_code call_queued(rpc_call *call, size_t n) {
    h2_conn *conn = call->conn;
    rpc_server *srv = conn->srv;
    uint64_t now = STAT_ADD(srv, queued_bytes, n) + n;
    uint64_t peak = __atomic_load_n(&srv->stats.queued_bytes_peak, __ATOMIC_RELAXED);
    if (now > peak)
        __atomic_store_n(&srv->stats.queued_bytes_peak, now, __ATOMIC_RELAXED);
    if (rpc_call_queued_bytes(call) >= srv->opts.send_queue_bytes_max)
        call->was_full = true;
    int rv = call->headers_sent ? nghttp2_session_resume_data(conn->session, call->stream_id)
                                : submit_headers(conn, call, true);
    if (rv != 0 && !call->headers_sent)
        return ST_INTERNAL;
    h2_conn_kick(conn);
    return ST_OK;
}

st_code rpc_call_send(rpc_call *call, st_slice msg) {
    st_code rc = call_send_check(call, msg.len);
    if (rc != ST_OK)
        return rc;
    size_t queued = rpc_call_queued_bytes(call);
    conn_out_settle(call->conn); /* the queue may be moved below */
    if (call->out_off > 0 && call->out_off >= call->out.len / 2) {
        memmove(call->out.data, call->out.data + call->out_off, queued);
        call->out.len = queued;
        call->out_off = 0;
    }
    uint8_t prefix[RPC_SEND_HEADROOM];
    rpc_frame_prefix(prefix, (uint32_t)msg.len);
    if (st_buf_reserve(&call->out, RPC_SEND_HEADROOM + msg.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    st_buf_append(&call->out, prefix, RPC_SEND_HEADROOM);
    st_buf_append(&call->out, msg.data, msg.len);
    return call_queued(call, RPC_SEND_HEADROOM + msg.len);
}

st_code rpc_call_send_buf(rpc_call *call, st_buf *msg) {
    if (msg->len < RPC_SEND_HEADROOM)
        return ST_INVALID_ARGUMENT;
    size_t len = msg->len - RPC_SEND_HEADROOM;
    st_code rc = call_send_check(call, len);
    if (rc != ST_OK)
        return rc;
    if (rpc_call_queued_bytes(call) > 0) { /* behind other messages: copied as usual */
        rc = rpc_call_send(call, st_slice_make(msg->data + RPC_SEND_HEADROOM, len));
        if (rc == ST_OK)
            st_buf_reset(msg);
        return rc;
    }
    conn_out_settle(call->conn); /* the old queue's memory goes back to the caller */
    rpc_frame_prefix(msg->data, (uint32_t)len);
    st_buf old = call->out;
    call->out = *msg;
    call->out_off = 0;
    *msg = old;
    st_buf_reset(msg);
    return call_queued(call, RPC_SEND_HEADROOM + len);
}

void rpc_call_finish(rpc_call *call, st_code code, const char *message) {
    if (!call->cancelled)
        call_finish_internal(call, code, message);
    if (call->handler_ref) {
        call->handler_ref = false;
        rpc_call_unref(call);
    }
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_call *call = arg;
    if (call->finished || !call->conn)
        return;
    h2_conn *conn = call->conn;
    rpc_call_ref(call);
    STAT_ADD(conn->srv, calls_cancelled, 1);
    call_finish_internal(call, ST_DEADLINE_EXCEEDED, "deadline exceeded");
    call_run_cancel(call);
    rpc_call_unref(call);
}

/* ---- requests ---- */

static const rpc_method_ent *method_find(const rpc_server *srv, const char *path) {
    for (size_t i = 0; i < srv->methods_len; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return &srv->methods[i];
    return NULL;
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    h2_conn *conn = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    rpc_call *call = call_new(conn, frame->hd.stream_id);
    if (!call)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM for this one */
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
    return 0;
}

static bool content_type_ok(const uint8_t *v, size_t len) {
    static const char ct[] = "application/grpc";
    size_t n = sizeof(ct) - 1;
    return len >= n && memcmp(v, ct, n) == 0 && (len == n || v[n] == '+' || v[n] == ';');
}

static void header_store(rpc_call *call, const uint8_t *name, size_t namelen, const uint8_t *value,
                         size_t valuelen) {
    call->hdr_bytes += namelen + valuelen + 32;
    if (call->hdrs_len == RPC_HEADERS_COUNT_MAX || call->hdr_bytes > RPC_HEADER_BYTES_MAX) {
        if (call->early.code == ST_OK)
            st_err_set(&call->early, ST_RESOURCE_EXHAUSTED,
                       "request metadata exceeds %u entries or %zu bytes", RPC_HEADERS_COUNT_MAX,
                       RPC_HEADER_BYTES_MAX);
        return;
    }
    char *n, *v;
    size_t need = namelen + valuelen + 2;
    if (need <= sizeof(call->hdr_text) - call->hdr_text_used) {
        n = call->hdr_text + call->hdr_text_used;
        v = n + namelen + 1;
        call->hdr_text_used += need;
    } else {
        n = st_arena_alloc(&call->arena, namelen + 1);
        v = st_arena_alloc(&call->arena, valuelen + 1);
    }
    if (!n || !v) {
        st_err_set(&call->early, ST_RESOURCE_EXHAUSTED, "out of memory for request metadata");
        return;
    }
    memcpy(n, name, namelen);
    n[namelen] = 0;
    memcpy(v, value, valuelen);
    v[valuelen] = 0;
    call->hdrs[call->hdrs_len++] = (call_hdr){n, v};
    if (namelen == 5 && memcmp(n, ":path", 5) == 0)
        call->path = v;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data) {
    (void)flags;
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* request trailers carry nothing we use */
    rpc_call *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!call)
        return 0;
    if (namelen == 7 && memcmp(name, ":method", 7) == 0) {
        call->saw_post = valuelen == 4 && memcmp(value, "POST", 4) == 0;
        return 0;
    }
    if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        call->saw_content_type = content_type_ok(value, valuelen);
        return 0;
    }
    if (namelen == 12 && memcmp(name, "grpc-timeout", 12) == 0) {
        int64_t us;
        if (!rpc_timeout_parse((const char *)value, valuelen, &us))
            st_err_set(&call->early, ST_INVALID_ARGUMENT, "malformed grpc-timeout");
        else
            call->deadline_us = st_mono_us() + us;
        return 0;
    }
    header_store(call, name, namelen, value, valuelen);
    return 0;
}

/* END_HEADERS of a request: decide whether this stream can become a call at all. */
static void request_headers_done(h2_conn *conn, rpc_call *call) {
    if (!call->saw_post) {
        call->http_status = 405;
        call_fail(call, ST_UNIMPLEMENTED, "gRPC requires the POST method");
        return;
    }
    if (!call->saw_content_type) {
        call->http_status = 415;
        call_fail(call, ST_INVALID_ARGUMENT, "content-type must be application/grpc");
        return;
    }
    if (call->early.code != ST_OK) {
        call_fail(call, call->early.code, call->early.msg);
        return;
    }
    if (!call->path || !(call->method = method_find(conn->srv, call->path))) {
        char msg[300];
        snprintf(msg, sizeof(msg), "unknown method %.200s", call->path ? call->path : "(none)");
        call_fail(call, ST_UNIMPLEMENTED, msg);
        return;
    }
    if (call->deadline_us) {
        int64_t left = call->deadline_us - st_mono_us();
        struct timeval tv = {0, 0};
        if (left > 0) {
            tv.tv_sec = (time_t)(left / 1000000);
            tv.tv_usec = (suseconds_t)(left % 1000000);
        }
        /* The timer lives after the call struct (call_new allocated room for it): no malloc. */
        struct event *ev = (struct event *)((char *)call + call_timer_offset());
        if (evtimer_assign(ev, conn->srv->base, deadline_cb, call) == 0)
            call->deadline_ev = ev;
        if (!call->deadline_ev || evtimer_add(call->deadline_ev, &tv) != 0)
            call_fail(call, ST_RESOURCE_EXHAUSTED, "cannot arm the deadline timer");
    }
}

static st_code request_msg(st_slice msg, void *arg) {
    rpc_call *call = arg;
    if (call->deframer.messages > 1)
        return ST_INVALID_ARGUMENT; /* client streaming is not supported */
    if (call->request.len == 0 && rpc_deframer_take(&call->deframer, &call->request)) {
        /* Took the reassembled buffer instead of copying a possibly huge message. */
        call->request_skip = (size_t)(msg.data - call->request.data);
        return ST_OK;
    }
    return st_buf_append(&call->request, msg.data, msg.len);
}

/* The request's size as its gRPC prefix announces it (prefix included), when this chunk
 * completes the prefix of the first message; else 0. An oversized length is left to the
 * deframer, which refuses it. */
static size_t request_announced(const rpc_call *call, const uint8_t *data, size_t len) {
    const rpc_deframer *d = &call->deframer;
    if (d->messages > 0 || d->prefix_len >= 5 || d->prefix_len + len < 5)
        return 0;
    uint8_t p[5];
    memcpy(p, d->prefix, d->prefix_len);
    memcpy(p + d->prefix_len, data, 5 - d->prefix_len);
    size_t n = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
    return n > d->bytes_max ? 0 : 5 + n;
}

/* Grows the call's reservation to want bytes, in its connection's and the process's budgets.
 * The whole announced message is reserved when its prefix arrives, so a call that does not fit
 * is refused before it buffers anything, and the ones admitted can complete. False when refused
 * (the call is failed). */
static bool call_reserve(h2_conn *conn, rpc_call *call, size_t want) {
    if (want <= call->request_bytes)
        return true;
    size_t more = want - call->request_bytes;
    size_t max = conn->srv->limits.buffered_request_bytes_max;
    if (conn->request_bytes + more > H2_CONN_REQUEST_BYTES_MAX) {
        call_fail(call, ST_RESOURCE_EXHAUSTED,
                  "this connection buffers too many request bytes: spread large requests over "
                  "several connections or send them one after another");
        return false;
    }
    if (!rpc_mem_reserve(more, max)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the server is buffering %zu MiB of requests and its limit is %zu MiB "
                 "(--max-buffered-request-bytes): retry later or send smaller requests",
                 rpc_mem_buffered() >> 20, max >> 20);
        STAT_ADD(conn->srv, calls_refused_memory, 1);
        call_fail(call, ST_RESOURCE_EXHAUSTED, msg);
        return false;
    }
    conn->request_bytes += more;
    call->request_bytes += more;
    call->mem_reserved += more;
    return true;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                         const uint8_t *data, size_t len, void *user_data) {
    (void)flags;
    h2_conn *conn = user_data;
    rpc_call *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call || call->finished || call->dispatched)
        return 0; /* nghttp2 still returns the flow-control window */
    size_t announced = request_announced(call, data, len);
    call->request_received += len;
    size_t want = call->request_received > announced ? call->request_received : announced;
    if (!call_reserve(conn, call, want))
        return 0;
    st_err err = {0};
    st_code rc = rpc_deframer_feed(&call->deframer, data, len, &err, request_msg, call);
    if (rc == ST_INVALID_ARGUMENT && err.code == ST_OK)
        st_err_set(&err, rc, "more than one request message: client streaming is unsupported");
    if (rc != ST_OK)
        call_fail(call, rc, err.msg);
    return 0;
}

/* END_STREAM from the client: the request is complete; run the handler. */
static void request_done(rpc_call *call) {
    if (call->finished || call->dispatched)
        return;
    st_err err = {0};
    if (rpc_deframer_finish(&call->deframer, &err) != ST_OK) {
        call_fail(call, err.code, err.msg);
        return;
    }
    if (call->deframer.messages != 1) {
        call_fail(call, ST_INTERNAL, "request carried no message");
        return;
    }
    call->dispatched = true;
    call->handler_ref = true;
    rpc_call_ref(call);
    call->method->handler(call,
                          st_slice_make(call->request.data + call->request_skip,
                                        call->request.len - call->request_skip),
                          call->method->arg);
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    h2_conn *conn = user_data;
    if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK) &&
        !conn->ready) { /* the preface (checked by nghttp2) and the first SETTINGS are in */
        conn->ready = true;
        conn->idle_since_us = st_mono_us();
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    rpc_call *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!call)
        return 0;
    rpc_call_ref(call);
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        request_headers_done(conn, call);
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) && call->conn)
        request_done(call);
    rpc_call_unref(call);
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data) {
    (void)error_code;
    (void)user_data;
    rpc_call *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (call) {
        nghttp2_session_set_stream_user_data(session, stream_id, NULL);
        call_detach(call);
    }
    return 0;
}

static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    (void)user_data;
    /* Once our END_STREAM is out, a client still sending (e.g. an oversized request we refused)
     * is told to stop with RST_STREAM(NO_ERROR), as gRPC servers do. */
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) == 0)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                  NGHTTP2_NO_ERROR);
    return 0;
}

/* ---- connections ---- */

static void h2_conn_close(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    h2_wbuf_drop(&conn->wbuf); /* unwritten output is lost anyway; it must not pin the calls */
    while (conn->calls)
        call_detach(conn->calls); /* nghttp2_session_del runs no stream-close callbacks */
    if (conn->read_ev)
        event_free(conn->read_ev); /* before the bufferevent closes the socket */
    if (conn->session)
        nghttp2_session_del(conn->session);
    if (conn->bev)
        bufferevent_free(conn->bev);
    if (conn->flush_ev)
        event_free(conn->flush_ev);
    if (conn->timer_ev)
        event_free(conn->timer_ev);
    h2_wbuf_free(&conn->wbuf);
    if (conn->slot)
        rpc_conn_slot_put();
    STAT_SUB(srv, conns_open, 1);
    free(conn);
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
    h2_conn *conn = arg;
    h2_loop_activity();
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n;
    while ((n = evbuffer_get_contiguous_space(in)) > 0) {
        const uint8_t *p = evbuffer_pullup(in, (ssize_t)n);
        ssize_t rv = nghttp2_session_mem_recv(conn->session, p, n);
        if (rv < 0) {
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: bad HTTP/2 input\" err=\"%s\"",
                            nghttp2_strerror((int)rv));
            h2_conn_flush(conn); /* try to get the GOAWAY out */
            h2_conn_close(conn);
            return;
        }
        evbuffer_drain(in, n);
    }
    if (!h2_conn_flush(conn))
        h2_conn_close(conn);
}

static bool conn_feed(void *arg, const uint8_t *data, size_t len) {
    h2_conn *conn = arg;
    ssize_t rv = nghttp2_session_mem_recv(conn->session, data, len);
    if (rv < 0) {
        RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: bad HTTP/2 input\" err=\"%s\"",
                        nghttp2_strerror((int)rv));
        h2_conn_flush(conn); /* try to get the GOAWAY out */
        return false;
    }
    return true;
}

/* Plain sockets: the read event's callback (see h2_sock_read). */
static void conn_sock_read_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    h2_conn *conn = arg;
    h2_read_result r = h2_sock_read(fd, conn_feed, conn);
    if (r == H2_READ_ERROR)
        RPC_LOG_LIMITED(ST_LOG_DEBUG, "msg=\"closing connection: read failed\" errno=%d", errno);
    if (r != H2_READ_AGAIN || !h2_conn_flush(conn))
        h2_conn_close(conn);
}

static void conn_write_cb(struct bufferevent *bev, void *arg) {
    (void)bev;
    h2_conn *conn = arg;
    if (!h2_conn_flush(conn))
        h2_conn_close(conn);
}

static void conn_event_cb(struct bufferevent *bev, short events, void *arg) {
    h2_conn *conn = arg;
    if (events & BEV_EVENT_CONNECTED) {
        bufferevent_set_timeouts(bev, NULL, NULL); /* handshake done: idle is fine from now */
        if (!conn->tp->negotiated_h2(bev)) {
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: ALPN did not select h2\" %s",
                            "hint=\"the client must offer h2 (gRPC) in ALPN\"");
            h2_conn_close(conn);
        }
        return;
    }
    if (events & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        h2_conn_close(conn);
}

static bool h2_session_start(h2_conn *conn) {
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return false;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_option *opt = h2_session_option();
    int rv = opt ? nghttp2_session_server_new3(&conn->session, cbs, conn, opt, h2_mem())
                 : NGHTTP2_ERR_NOMEM;
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rv != 0)
        return false;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, conn->srv->opts.streams_max},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)H2_STREAM_WINDOW_BYTES},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)RPC_HEADER_BYTES_MAX},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    if (nghttp2_submit_settings(conn->session, NGHTTP2_FLAG_NONE, iv, 4) != 0 ||
        nghttp2_session_set_local_window_size(conn->session, NGHTTP2_FLAG_NONE, 0,
                                              H2_CONN_WINDOW_BYTES) != 0)
        return false;
    return h2_conn_flush(conn);
}

/* ---- connection timeouts ---- */

/* Ends a connection politely: GOAWAY (streams above the last one processed are refused, so a
 * client may retry them elsewhere), written if the socket takes it, then closed. */
static void conn_goaway_close(h2_conn *conn, const char *why) {
    int32_t last = nghttp2_session_get_last_proc_stream_id(conn->session);
    if (nghttp2_submit_goaway(conn->session, NGHTTP2_FLAG_NONE, last, NGHTTP2_NO_ERROR,
                              (const uint8_t *)why, strlen(why)) == 0)
        h2_conn_flush(conn);
    h2_conn_close(conn);
}

/* Ends the calls whose request has not brought the minimum rate over a whole window: a client
 * trickling a request in holds its buffers and a stream slot for as long as it likes otherwise. */
static void conn_check_slow(h2_conn *conn, int64_t now) {
    const rpc_limits *lim = &conn->srv->limits;
    int64_t window_us = (int64_t)lim->slow_request_window_ms * 1000;
    uint64_t need = (uint64_t)lim->request_bytes_per_s_min * lim->slow_request_window_ms / 1000;
    if (need == 0)
        need = 1; /* at least some progress in each window */
    for (rpc_call *call = conn->calls, *next; call; call = next) {
        next = call->next;
        if (call->finished || call->dispatched || now - call->slow_mark_us < window_us)
            continue;
        if (call->request_received - call->slow_mark_bytes < need) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "the request arrived slower than %u bytes/s over %u ms "
                     "(--min-request-bytes-per-s): send it at once, not in a trickle",
                     lim->request_bytes_per_s_min, lim->slow_request_window_ms);
            STAT_ADD(conn->srv, calls_slow, 1);
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"ending a call: request too slow\" received=%zu",
                            call->request_received);
            call_fail(call, ST_RESOURCE_EXHAUSTED, msg);
            continue;
        }
        call->slow_mark_us = now;
        call->slow_mark_bytes = call->request_received;
    }
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    h2_conn *conn = arg;
    rpc_server *srv = conn->srv;
    const rpc_limits *lim = &srv->limits;
    int64_t now = st_mono_us();
    if (!conn->ready) {
        if (lim->handshake_timeout_ms &&
            now - conn->accepted_us >= (int64_t)lim->handshake_timeout_ms * 1000) {
            STAT_ADD(srv, conns_handshake_closed, 1);
            RPC_LOG_LIMITED(ST_LOG_INFO,
                            "msg=\"closing connection: no HTTP/2 preface and SETTINGS within "
                            "the handshake timeout\" timeout_ms=%u",
                            lim->handshake_timeout_ms);
            h2_conn_close(conn);
        }
        return;
    }
    if (!conn->calls && lim->idle_timeout_ms &&
        now - conn->idle_since_us >= (int64_t)lim->idle_timeout_ms * 1000) {
        STAT_ADD(srv, conns_idle_closed, 1);
        conn_goaway_close(conn, "idle");
        return;
    }
    if (lim->slow_request_window_ms)
        conn_check_slow(conn, now);
}

/* ---- accepting ---- */

/* At connections_max: a SETTINGS and a GOAWAY written straight to the new socket (no session is
 * made for it), then closed, so a client learns it was refused rather than cut off. */
static void conn_refuse(rpc_server *srv, int fd) {
    static const char debug[] = "server at its connection limit (--max-connections)";
    STAT_ADD(srv, conns_refused, 1); /* counted before the peer can see the close */
    uint8_t f[9 + 9 + 8 + sizeof debug - 1] = {0};
    f[3] = NGHTTP2_SETTINGS; /* an empty SETTINGS: the server preface */
    size_t glen = 8 + sizeof debug - 1;
    f[9 + 1] = (uint8_t)(glen >> 8);
    f[9 + 2] = (uint8_t)glen;
    f[9 + 3] = NGHTTP2_GOAWAY; /* last stream 0, NO_ERROR: nothing was processed */
    memcpy(f + 9 + 9 + 8, debug, sizeof debug - 1);
    ssize_t w = send(fd, f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* best effort: the close says it too */
    shutdown(fd, SHUT_WR);
    uint8_t sink[512]; /* unread input would turn the close into a reset that loses the GOAWAY */
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
        ;
    close(fd);
    RPC_LOG_LIMITED(ST_LOG_WARN,
                    "msg=\"refusing connection: at the connection limit\" max=%u "
                    "hint=\"raise --max-connections (and ulimit -n) or add servers\"",
                    srv->limits.connections_max);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_server *srv = arg;
    srv->accept_paused = false;
    for (size_t i = 0; i < srv->listeners_len; i++)
        evconnlistener_enable(srv->listeners[i]);
}

/* accept() failed. Out of descriptors or memory, the pending connection stays queued and the
 * listening socket stays readable: accepting again at once would spin. The listeners pause for a
 * backoff that doubles while failures go on (reset by the next accepted connection). */
static void accept_error_cb(struct evconnlistener *l, void *arg) {
    (void)l;
    rpc_server *srv = arg;
    int e = EVUTIL_SOCKET_ERROR();
    STAT_ADD(srv, accept_errors, 1);
    bool starved = e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
    if (!starved) {
        RPC_LOG_LIMITED(ST_LOG_WARN, "msg=\"accept failed\" err=\"%s\"", strerror(e));
        return;
    }
    srv->accept_backoff_ms = srv->accept_backoff_ms == 0 ? ACCEPT_BACKOFF_MS_MIN
                             : srv->accept_backoff_ms >= ACCEPT_BACKOFF_MS_MAX / 2
                                 ? ACCEPT_BACKOFF_MS_MAX
                                 : srv->accept_backoff_ms * 2;
    RPC_LOG_LIMITED(ST_LOG_WARN,
                    "msg=\"cannot accept connections: %s; pausing accepts\" pause_ms=%u "
                    "hint=\"raise ulimit -n or lower --max-connections\"",
                    strerror(e), srv->accept_backoff_ms);
    if (srv->accept_paused)
        return;
    struct timeval tv = {srv->accept_backoff_ms / 1000, (srv->accept_backoff_ms % 1000) * 1000};
    for (size_t i = 0; i < srv->listeners_len; i++)
        evconnlistener_disable(srv->listeners[i]);
    srv->accept_paused = true;
    if (event_add(srv->accept_ev, &tv) != 0)
        accept_resume_cb(-1, 0, srv); /* cannot pause: better to spin than to stop serving */
}

/* Arms the connection's periodic timer (the timeouts), when any timeout is on. */
static bool conn_timer_start(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    if (srv->conn_tick.tv_sec == 0 && srv->conn_tick.tv_usec == 0)
        return true;
    conn->timer_ev = event_new(srv->base, -1, EV_PERSIST, conn_timer_cb, conn);
    return conn->timer_ev && event_add(conn->timer_ev, &srv->conn_tick) == 0;
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr,
                      int addrlen, void *arg) {
    (void)l;
    (void)addrlen;
    rpc_server *srv = arg;
    srv->accept_backoff_ms = 0;
    if (!rpc_conn_slot_take(srv->limits.connections_max)) {
        conn_refuse(srv, fd);
        return;
    }
    h2_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        rpc_conn_slot_put();
        close(fd);
        return;
    }
    conn->srv = srv;
    conn->slot = true;
    conn->accepted_us = st_mono_us();
    conn->tp = srv->opts.ssl_ctx ? &h2_transport_tls : &h2_transport_plain;
    conn->direct = srv->opts.ssl_ctx == NULL;
    conn->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = conn;
    srv->conns = conn;
    STAT_ADD(srv, conns_accepted, 1);
    STAT_ADD(srv, conns_open, 1);
    int one = 1;
    if (!addr || addr->sa_family != AF_UNIX) /* a TCP option; Unix sockets have no Nagle */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conn->flush_ev = event_new(srv->base, -1, 0, conn_flush_cb, conn);
    conn->bev = conn->tp->bev_new(srv->base, fd, srv->opts.ssl_ctx, true, NULL);
    if (!conn->bev || !conn->flush_ev || !conn_timer_start(conn)) {
        h2_conn_close(conn);
        return;
    }
    bufferevent_setcb(conn->bev, conn_read_cb, conn_write_cb, conn_event_cb, conn);
    bufferevent_setwatermark(conn->bev, EV_WRITE, H2_CONN_OUTPUT_HIGH_WATER_BYTES / 2, 0);
    /* A direct connection reads with its own event and arms the bufferevent's write event only
     * while the socket is full. (A TLS handshake that never ends: the handshake timeout.) */
    bool armed;
    if (conn->direct) {
        conn->read_ev = event_new(srv->base, bufferevent_getfd(conn->bev), EV_READ | EV_PERSIST,
                                  conn_sock_read_cb, conn);
        armed = conn->read_ev && event_add(conn->read_ev, NULL) == 0;
    } else {
        armed = bufferevent_enable(conn->bev, EV_READ | EV_WRITE) == 0;
    }
    if (!armed || !h2_session_start(conn))
        h2_conn_close(conn);
}

/* ---- the server ---- */

static void post_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    rpc_server *srv = arg;
    uint64_t v;
    h2_loop_activity();
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        st_log(ST_LOG_WARN, "rpc", "msg=\"eventfd read failed\" errno=%d", errno);
    pthread_mutex_lock(&srv->post_mu);
    post_item *it = srv->post_head;
    srv->post_head = srv->post_tail = NULL;
    srv->post_len = 0;
    pthread_mutex_unlock(&srv->post_mu);
    while (it) {
        post_item *next = it->next;
        void (*fn)(void *) = it->fn;
        void *fn_arg = it->arg;
        if (it->owned)
            free(it);
        fn(fn_arg); /* may free an embedded item: it is not touched from here on */
        it = next;
    }
}

/* Queues a filled-in item (any thread). */
static st_code post_enqueue(rpc_server *s, post_item *item) {
    item->next = NULL;
    pthread_mutex_lock(&s->post_mu);
    if (s->post_len >= RPC_POST_QUEUE_MAX) {
        pthread_mutex_unlock(&s->post_mu);
        return ST_RESOURCE_EXHAUSTED;
    }
    bool was_empty = s->post_head == NULL;
    if (s->post_tail)
        s->post_tail->next = item;
    else
        s->post_head = item;
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
    *item = (rpc_post){fn, arg, NULL, false};
    return post_enqueue(s, item);
}

st_code rpc_server_post(rpc_server *s, void (*fn)(void *arg), void *arg) {
    post_item *it = malloc(sizeof(*it));
    if (!it)
        return ST_RESOURCE_EXHAUSTED;
    *it = (post_item){fn, arg, NULL, true};
    st_code rc = post_enqueue(s, it);
    if (rc != ST_OK)
        free(it);
    return rc;
}

/* Copies the process's limits and derives the connections' timer period: half the shortest
 * timeout, so each fires at most half its length late. */
static void server_limits_init(rpc_server *s) {
    rpc_limits_get(&s->limits);
    if (!s->limits.connections_max)
        s->limits.connections_max = rpc_connections_max_auto();
    uint32_t t[] = {s->limits.handshake_timeout_ms, s->limits.idle_timeout_ms,
                    s->limits.slow_request_window_ms};
    uint32_t tick = UINT32_MAX;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i] && t[i] / 2 < tick)
            tick = t[i] / 2;
    if (tick == UINT32_MAX)
        return; /* no timeouts: no timers */
    if (tick < CONN_TICK_MS_MIN)
        tick = CONN_TICK_MS_MIN;
    if (tick > CONN_TICK_MS_MAX)
        tick = CONN_TICK_MS_MAX;
    s->conn_tick.tv_sec = tick / 1000;
    s->conn_tick.tv_usec = (suseconds_t)(tick % 1000) * 1000;
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
    if (!s->opts.message_bytes_max)
        s->opts.message_bytes_max = RPC_MESSAGE_BYTES_MAX_DEFAULT;
    if (s->opts.message_bytes_max > UINT32_MAX)
        s->opts.message_bytes_max = UINT32_MAX;
    if (!s->opts.send_queue_bytes_max)
        s->opts.send_queue_bytes_max = RPC_SEND_QUEUE_BYTES_DEFAULT;
    if (!s->opts.streams_max)
        s->opts.streams_max = RPC_STREAMS_MAX_DEFAULT;
    server_limits_init(s);
    pthread_mutex_init(&s->post_mu, NULL);
    rpc_metrics_init(&s->metrics);
    s->post_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->post_fd < 0 ||
        !(s->post_ev = event_new(base, s->post_fd, EV_READ | EV_PERSIST, post_cb, s)) ||
        event_add(s->post_ev, NULL) != 0 ||
        !(s->accept_ev = evtimer_new(base, accept_resume_cb, s))) {
        st_err_set(err, ST_INTERNAL, "cannot set up the server's post queue: %s", strerror(errno));
        rpc_server_free(s);
        return NULL;
    }
    return s;
}

st_code rpc_server_add_method(rpc_server *s, const char *path, rpc_handler_fn handler, void *arg) {
    if (method_find(s, path))
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

st_code rpc_server_listen(rpc_server *s, const char *host, uint16_t port, uint16_t *bound_port,
                          st_err *err) {
    if (s->listeners_len == RPC_LISTENERS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "too many listeners (max %d)",
                          RPC_LISTENERS_MAX);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%u", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0)
        return st_err_set(err, ST_UNAVAILABLE, "cannot resolve listen address %s: %s",
                          host ? host : "*", gai_strerror(gai));
    struct evconnlistener *l = NULL;
    for (struct addrinfo *ai = res; ai && !l; ai = ai->ai_next)
        l = evconnlistener_new_bind(s->base, accept_cb, s,
                                    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                        LEV_OPT_CLOSE_ON_EXEC,
                                    -1, ai->ai_addr, (int)ai->ai_addrlen);
    freeaddrinfo(res);
    if (!l)
        return st_err_set(err, ST_UNAVAILABLE, "cannot listen on %s:%u: %s; is the port in use?",
                          host ? host : "*", port, strerror(errno));
    evconnlistener_set_error_cb(l, accept_error_cb);
    s->listeners[s->listeners_len++] = l;
    if (bound_port) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&ss, &sl);
        *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                               : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    return ST_OK;
}

/* ---- Unix-domain listeners ---- */

/* A socket file left at path by a server that died without removing it is removed; one some
 * process still accepts on is not taken over. The probe connects without blocking, so a full
 * backlog (EAGAIN) counts as alive. */
static st_code unix_clear_stale(const char *path, const struct sockaddr_un *sa, socklen_t len,
                                st_err *err) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? ST_OK
                               : st_err_set(err, ST_UNAVAILABLE, "cannot check socket %s: %s", path,
                                            strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return st_err_set(err, ST_UNAVAILABLE,
                          "%s exists and is not a socket: remove it or choose another path", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return st_err_set(err, ST_UNAVAILABLE, "cannot create a socket: %s", strerror(errno));
    int rc = connect(fd, (const struct sockaddr *)sa, len), e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS)
        return st_err_set(err, ST_UNAVAILABLE,
                          "another process accepts connections on %s: stop it or choose another "
                          "path",
                          path);
    if (e != ECONNREFUSED && e != ENOENT)
        return st_err_set(err, ST_UNAVAILABLE, "cannot check socket %s: %s", path, strerror(e));
    if (unlink(path) != 0 && errno != ENOENT)
        return st_err_set(err, ST_UNAVAILABLE, "cannot remove the stale socket %s: %s", path,
                          strerror(errno));
    return ST_OK;
}

/* Remembers path (and its inode) for rpc_server_free to remove. */
static st_code unix_path_keep(rpc_server *s, const char *path, st_err *err) {
    struct stat st;
    char *p = strdup(path);
    if (!p || stat(path, &st) != 0) {
        free(p);
        return st_err_set(err, ST_UNAVAILABLE, "cannot stat the new socket %s", path);
    }
    s->unix_files[s->unix_len].path = p;
    s->unix_files[s->unix_len].dev = st.st_dev;
    s->unix_files[s->unix_len].ino = st.st_ino;
    s->unix_len++;
    return ST_OK;
}

static void unix_paths_remove(rpc_server *s) {
    for (size_t i = 0; i < s->unix_len; i++) {
        struct stat st;
        if (stat(s->unix_files[i].path, &st) == 0 && st.st_dev == s->unix_files[i].dev &&
            st.st_ino == s->unix_files[i].ino)
            unlink(s->unix_files[i].path);
        free(s->unix_files[i].path);
    }
    s->unix_len = 0;
}

st_code rpc_server_listen_unix(rpc_server *s, const char *path, st_err *err) {
    if (s->listeners_len == RPC_LISTENERS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "too many listeners (max %d)",
                          RPC_LISTENERS_MAX);
    struct sockaddr_un sa;
    socklen_t len;
    if (!h2_unix_addr(path, &sa, &len))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "socket path '%s' is empty or longer than %d bytes", path,
                          RPC_UNIX_PATH_MAX);
    st_code rc = unix_clear_stale(path, &sa, len, err);
    if (rc != ST_OK)
        return rc;
    struct evconnlistener *l = evconnlistener_new_bind(
        s->base, accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1,
        (struct sockaddr *)&sa, (int)len);
    if (!l)
        return st_err_set(err, ST_UNAVAILABLE, "cannot listen on socket %s: %s", path,
                          strerror(errno));
    if ((rc = unix_path_keep(s, path, err)) != ST_OK) {
        evconnlistener_free(l);
        unlink(path);
        return rc;
    }
    evconnlistener_set_error_cb(l, accept_error_cb);
    s->listeners[s->listeners_len++] = l;
    return ST_OK;
}

void rpc_server_free(rpc_server *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->listeners_len; i++)
        evconnlistener_free(s->listeners[i]);
    unix_paths_remove(s);
    while (s->conns)
        h2_conn_close(s->conns);
    if (s->post_ev)
        event_free(s->post_ev);
    if (s->accept_ev)
        event_free(s->accept_ev);
    if (s->post_fd >= 0)
        close(s->post_fd);
    for (post_item *it = s->post_head, *next; it; it = next) {
        next = it->next;
        if (it->owned)
            free(it);
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
         "Connections refused at the connection limit.", offsetof(rpc_server_stats, conns_refused)},
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
