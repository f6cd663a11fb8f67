/* server_call.c — rpc_call, one per stream: its arena, request headers, deadline, request
 * deframer and response queue; the rpc_call_* API of strata/rpc.h; and the nghttp2 callbacks
 * that turn a stream's frames into a call and its responses into frames.
 *
 * Lifetime of a call: the stream holds one reference until nghttp2 closes the stream (or the
 * connection dies); the handler holds one from dispatch until rpc_call_finish. Whatever is left
 * after the stream is gone is "detached": sends and finishes on it are no-ops. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "server_internal.h"

static void call_finish_internal(rpc_call *call, st_code code, const char *msg);
static void budget_forget(rpc_server *srv, rpc_call *call);

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
    if (call->held) /* the handler did not give them back: they go with the call */
        rpc_queued_sub(call->held);
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
    if (!conn->calls)
        h2_conn_idle_leave(conn); /* a connection with a call open is never evicted */
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
void rpc_call_detach(rpc_call *call) {
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
        h2_conn_idle_mark(conn);
    conn->request_bytes -= call->request_bytes;
    call->request_bytes = 0;
    STAT_SUB(srv, queued_bytes, call->out.len - call->out_off);
    rpc_queued_sub(call->out.len - call->out_off);
    budget_forget(srv, call); /* after the queue's bytes left the budget: the next may go */
    STAT_SUB(srv, calls_active, 1);
    /* The queue's last frames may be referenced by wbuf (a stream closes when its trailers went
     * into wbuf, before the write): keep its memory until then instead of writing now. */
    if (h2_out_pinned(h2_conn_wbuf(conn)) && call->out.data) {
        if (h2_wbuf_retire(&conn->wbuf, call->out.data))
            st_buf_init(&call->out);
        else
            h2_conn_out_settle(conn);
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
const char *rpc_call_peer(const rpc_call *call) {
    return call->conn ? call->conn->peer : "";
}
uint64_t rpc_call_conn_serial(const rpc_call *call) {
    return call && call->conn ? call->conn->serial : 0;
}
st_arena *rpc_call_arena(rpc_call *call) {
    return &call->arena;
}

void rpc_call_request_kept(rpc_call *call) {
    size_t n = call->request_bytes < call->mem_reserved ? call->request_bytes : call->mem_reserved;
    if (call->conn)
        call->conn->request_bytes -= call->request_bytes;
    call->request_bytes = 0;
    rpc_mem_release(n);
    call->mem_reserved -= n;
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

/* ---- the queued-response budget ----
 * Past --max-queued-response-bytes a call that has bytes queued (or held: rpc_call_hold) waits
 * in the server's list of waiters, which are woken one at a time, oldest first, as queued bytes
 * leave the process; a woken call may queue one message (budget_granted), then the next is
 * woken if there is still room. A call holding nothing may still queue one message: a client
 * that reads keeps being served while stalled ones fill the budget, and a call whose client
 * does not read can take that way once (its message then stays queued). The process thus holds
 * at most the budget, plus one message per call whose client stopped reading, plus the one that
 * crossed the budget. */

static bool budget_over(const rpc_server *srv) {
    return rpc_queued_response_bytes() >= srv->limits.queued_response_bytes_max;
}

static void waiter_unlink(rpc_server *srv, rpc_call *call) {
    if (!call->budget_waiting)
        return;
    if (call->wait_prev)
        call->wait_prev->wait_next = call->wait_next;
    else
        srv->waiters_head = call->wait_next;
    if (call->wait_next)
        call->wait_next->wait_prev = call->wait_prev;
    else
        srv->waiters_tail = call->wait_prev;
    call->wait_prev = call->wait_next = NULL;
    call->budget_waiting = false;
}

static void waiter_push(rpc_server *srv, rpc_call *call) {
    if (call->budget_waiting)
        return;
    call->budget_waiting = true;
    call->wait_prev = srv->waiters_tail;
    call->wait_next = NULL;
    if (srv->waiters_tail)
        srv->waiters_tail->wait_next = call;
    else
        srv->waiters_head = call;
    srv->waiters_tail = call;
}

/* Wakes the oldest waiter when the budget has room and no woken call is still to produce. */
static void budget_kick(rpc_server *srv) {
    if (srv->budget_woken || !srv->waiters_head || budget_over(srv))
        return;
    rpc_call *call = srv->waiters_head;
    waiter_unlink(srv, call);
    call->budget_granted = true;
    srv->budget_woken = call;
    event_active(call->notify_ev, EV_TIMEOUT, 0);
}

/* The call leaves the budget's bookkeeping (it finished or its stream is gone). */
static void budget_forget(rpc_server *srv, rpc_call *call) {
    waiter_unlink(srv, call);
    call->budget_granted = false;
    if (srv->budget_woken == call) {
        srv->budget_woken = NULL;
        budget_kick(srv);
    }
}

/* Whether the budget lets call queue a message now. A call that may not and will be told about
 * room (it has a writable callback) joins the waiters; while some wait, a call holding bytes
 * joins them even under the budget, so that nobody overtakes them. */
static bool budget_allows(rpc_call *call) {
    rpc_server *srv = call->conn->srv;
    if (call->budget_granted)
        return true;
    if (!call->budget_waiting && !srv->waiters_head && !srv->budget_woken && !budget_over(srv))
        return true;
    if (rpc_call_queued_bytes(call) == 0 && call->held == 0)
        return true; /* holds nothing: one message (see above) */
    if (call->notify_ev) {
        waiter_push(srv, call);
        budget_kick(srv); /* room already (bytes left without a kick): the oldest goes */
    }
    return call->budget_granted;
}

bool rpc_call_has_room(const rpc_call *call) {
    if (!call->conn || call->finished)
        return false;
    return rpc_call_queued_bytes(call) < call->conn->srv->opts.send_queue_bytes_max;
}

bool rpc_call_writable(rpc_call *call) {
    return rpc_call_has_room(call) && budget_allows(call);
}

bool rpc_call_over_budget(const rpc_call *call) {
    rpc_limits l;
    if (call->conn)
        return budget_over(call->conn->srv);
    rpc_limits_get(&l);
    return rpc_queued_response_bytes() >= l.queued_response_bytes_max;
}

void rpc_call_hold(rpc_call *call, size_t n) {
    call->held += n;
    rpc_queued_add(n);
}

void rpc_call_unhold(rpc_call *call, size_t n) {
    ST_ASSERT(n <= call->held);
    call->held -= n;
    rpc_queued_sub(n);
    if (call->conn)
        budget_kick(call->conn->srv);
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
    h2_conn *conn = call->conn;
    if (conn && conn->srv->budget_woken == call) { /* its turn is over: the next waiter's */
        call->budget_granted = false;
        conn->srv->budget_woken = NULL;
        budget_kick(conn->srv);
    }
    rpc_call_unref(call);
}

void rpc_call_set_writable_cb(rpc_call *call, void (*on_writable)(rpc_call *, void *), void *arg) {
    call->on_writable = on_writable;
    call->on_writable_arg = arg;
    if (call->conn && !call->notify_ev)
        call->notify_ev = event_new(call->conn->srv->base, -1, 0, call_notify_cb, call);
    /* Room already: say so from the loop, so a producer that registers late is not stranded
     * (without room from the budget, the call joins its waiters here). */
    if (call->notify_ev && rpc_call_writable(call))
        event_active(call->notify_ev, EV_TIMEOUT, 0);
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
    rpc_queued_sub(n);
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
    budget_kick(conn->srv);
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
    h2_wbuf *wbuf = h2_conn_wbuf(conn);
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

/* Every response names the only message encoding this server accepts: gRPC clients that honour
 * grpc-accept-encoding then stop compressing (HPACK indexes it: a byte per response). */
#define ACCEPT_ENCODING_NV H2_NV("grpc-accept-encoding", "identity")

static int submit_headers(h2_conn *conn, rpc_call *call, bool with_body) {
    nghttp2_data_provider prd = {.source = {.ptr = call}, .read_callback = data_read_cb};
    nghttp2_nv nva[] = {H2_NV(":status", "200"), H2_NV("content-type", "application/grpc"),
                        ACCEPT_ENCODING_NV};
    call->headers_sent = true;
    return nghttp2_submit_response(conn->session, call->stream_id, nva, 3, with_body ? &prd : NULL);
}

/* A response with no messages: one HEADERS frame carrying the status (gRPC "trailers-only"). */
static int submit_trailers_only(h2_conn *conn, rpc_call *call) {
    const char *code = status_text(call->code_text, (int)call->status);
    const char *http = status_text(call->http_text, call->http_status);
    nghttp2_nv nva[] = {H2_NV(":status", http), H2_NV("content-type", "application/grpc"),
                        ACCEPT_ENCODING_NV, H2_NV("grpc-status", code),
                        H2_NV("grpc-message", call->status_msg)};
    call->headers_sent = true;
    return nghttp2_submit_response(conn->session, call->stream_id, nva, call->status_msg[0] ? 5 : 4,
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
    budget_forget(conn->srv, call);
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
/* Whether len more bytes may join the call's queue: the queue's bound (send_queue_bytes_max plus
 * one maximum message). */
static st_code call_queue_check(const rpc_call *call, size_t len) {
    h2_conn *conn = call->conn;
    if (!conn || call->finished || call->cancelled)
        return ST_CANCELLED;
    const rpc_server_opts *o = &conn->srv->opts;
    if (rpc_call_queued_bytes(call) + len > o->send_queue_bytes_max + o->message_bytes_max)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* A message of len bytes: within the message maximum, and the queue's bound. */
static st_code call_send_check(const rpc_call *call, size_t len) {
    st_code rc = call_queue_check(call, len);
    if (rc == ST_OK && len > call->conn->srv->opts.message_bytes_max)
        rc = ST_RESOURCE_EXHAUSTED;
    return rc;
}

/* n framed bytes were added to the call's queue: count them and get them sent. */
static st_code call_queued(rpc_call *call, size_t n) {
    h2_conn *conn = call->conn;
    rpc_server *srv = conn->srv;
    uint64_t now = STAT_ADD(srv, queued_bytes, n) + n;
    rpc_queued_add(n);
    call->budget_granted = false; /* a woken waiter queues one message */
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

/* Before bytes are appended to the queue: once its sent front is half of it, the unsent rest
 * moves to the start, so a long stream's queue does not grow without end. */
static void out_compact(rpc_call *call) {
    size_t queued = rpc_call_queued_bytes(call);
    h2_conn_out_settle(call->conn); /* the queue may be moved below */
    if (call->out_off > 0 && call->out_off >= call->out.len / 2) {
        memmove(call->out.data, call->out.data + call->out_off, queued);
        call->out.len = queued;
        call->out_off = 0;
    }
}

st_code rpc_call_send(rpc_call *call, st_slice msg) {
    st_code rc = call_send_check(call, msg.len);
    if (rc != ST_OK)
        return rc;
    out_compact(call);
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
    h2_conn_out_settle(call->conn); /* the old queue's memory goes back to the caller */
    rpc_frame_prefix(msg->data, (uint32_t)len);
    st_buf old = call->out;
    call->out = *msg;
    call->out_off = 0;
    *msg = old;
    st_buf_reset(msg);
    return call_queued(call, RPC_SEND_HEADROOM + len);
}

/* Whether frames may be queued as they are: ST_OK, or rpc_call_send_framed's error. */
static st_code call_framed_check(const rpc_call *call, st_slice frames) {
    /* each message against the message maximum (rpc_frames_check), their sum against the queue */
    st_code rc = call_queue_check(call, frames.len);
    if (rc != ST_OK)
        return rc;
    if (!rpc_frames_check(frames, call->conn->srv->opts.message_bytes_max, NULL, NULL))
        return ST_INVALID_ARGUMENT;
    return ST_OK;
}

st_code rpc_call_send_framed(rpc_call *call, st_slice frames) {
    st_code rc = call_framed_check(call, frames);
    if (rc != ST_OK || frames.len == 0)
        return rc;
    out_compact(call);
    if (st_buf_append(&call->out, frames.data, frames.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return call_queued(call, frames.len);
}

st_code rpc_call_send_framed_buf(rpc_call *call, st_buf *buf, size_t off) {
    if (off > buf->len)
        return ST_INVALID_ARGUMENT;
    st_slice frames = st_slice_make(buf->data + off, buf->len - off);
    if (rpc_call_queued_bytes(call) > 0 || frames.len == 0) { /* behind others: copied */
        st_code rc = rpc_call_send_framed(call, frames);
        if (rc == ST_OK)
            st_buf_reset(buf);
        return rc;
    }
    st_code rc = call_framed_check(call, frames);
    if (rc != ST_OK)
        return rc;
    h2_conn_out_settle(call->conn); /* the old queue's memory goes back to the caller */
    st_buf old = call->out;
    call->out = *buf;
    call->out_off = off;
    *buf = old;
    st_buf_reset(buf);
    return call_queued(call, frames.len);
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

/* Classifies a request's content-type (RPC_CT_*). gRPC's is "application/grpc", optionally
 * with "+CODEC" and ";parameters"; media types compare case-insensitively (RFC 9110, 8.3.1).
 * The server speaks only the proto codec ("application/grpc" means proto too): another codec is
 * a gRPC request it cannot decode, not a foreign media type. */
static uint8_t content_type_kind(const uint8_t *v, size_t len, char *codec, size_t codec_size) {
    static const char base[] = "application/grpc";
    size_t n = sizeof(base) - 1;
    if (len < n || strncasecmp((const char *)v, base, n) != 0)
        return RPC_CT_BAD;
    if (len == n || v[n] == ';')
        return RPC_CT_PROTO;
    if (v[n] != '+')
        return RPC_CT_BAD;
    const uint8_t *sub = v + n + 1;
    size_t sublen = 0;
    while (n + 1 + sublen < len && sub[sublen] != ';')
        sublen++;
    if (sublen == 5 && strncasecmp((const char *)sub, "proto", 5) == 0)
        return RPC_CT_PROTO;
    size_t keep = sublen < codec_size - 1 ? sublen : codec_size - 1;
    for (size_t i = 0; i < keep; i++)
        codec[i] = sub[i] >= 0x20 && sub[i] < 0x7f ? (char)sub[i] : '?';
    codec[keep] = 0;
    return RPC_CT_CODEC;
}

/* Reserves n bytes of request metadata beyond the call's inline text in the process's budget
 * (--max-buffered-request-bytes), given back when the call is released: many streams with large
 * metadata and no message would otherwise hold memory outside the budget. False (the call is
 * refused at END_HEADERS) when it does not fit. */
static bool header_reserve(rpc_call *call, size_t n) {
    rpc_server *srv = call->conn->srv;
    size_t max = srv->limits.buffered_request_bytes_max;
    if (rpc_mem_reserve(n, max, call->mem_reserved)) {
        call->mem_reserved += n;
        return true;
    }
    st_err_set(&call->early, ST_RESOURCE_EXHAUSTED,
               "the server is buffering %zu KiB of requests and this request's metadata would pass "
               "its limit of %zu KiB (--max-buffered-request-bytes): retry later or send less "
               "metadata",
               rpc_mem_buffered() >> 10, max >> 10);
    STAT_ADD(srv, calls_refused_memory, 1);
    return false;
}

/* HTTP/2 forbids NUL, CR and LF in field names and values (RFC 9113, 8.2.1), and nghttp2 does
 * not check them here (no_http_messaging): headers are kept as C strings, so "Bearer TOKEN\0x"
 * would read as "Bearer TOKEN". Such a request is malformed and refused whole. */
static bool header_bytes_ok(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] == 0 || p[i] == '\r' || p[i] == '\n')
            return false;
    return true;
}

static void header_store(rpc_call *call, const uint8_t *name, size_t namelen, const uint8_t *value,
                         size_t valuelen) {
    bool name_ok = header_bytes_ok(name, namelen);
    if (!name_ok || !header_bytes_ok(value, valuelen)) {
        if (call->early.code == ST_OK)
            st_err_set(&call->early, ST_INVALID_ARGUMENT,
                       "request metadata %s%.*s%s holds a NUL, CR or LF byte, which HTTP/2 forbids "
                       "in names and values: send printable ASCII (binary values base64-encoded "
                       "under a '-bin' key)",
                       name_ok ? "'" : "", name_ok ? (int)(namelen < 64 ? namelen : 64) : 4,
                       name_ok ? (const char *)name : "name", name_ok ? "'" : "");
        return;
    }
    call->hdr_bytes += namelen + valuelen + 32;
    size_t max = call->conn ? call->conn->srv->limits.header_bytes_max : RPC_HEADER_BYTES_MAX;
    if (call->hdrs_len == RPC_HEADERS_COUNT_MAX || call->hdr_bytes > max) {
        if (call->early.code == ST_OK)
            st_err_set(&call->early, ST_RESOURCE_EXHAUSTED,
                       "request metadata exceeds %u entries or %zu bytes (the server's "
                       "--max-header-bytes): send less metadata",
                       RPC_HEADERS_COUNT_MAX, max);
        return;
    }
    if (call->early.code == ST_RESOURCE_EXHAUSTED)
        return; /* refused: nothing more is stored */
    char *n, *v;
    size_t need = namelen + valuelen + 2;
    if (need <= sizeof(call->hdr_text) - call->hdr_text_used) {
        n = call->hdr_text + call->hdr_text_used;
        v = n + namelen + 1;
        call->hdr_text_used += need;
    } else {
        if (!header_reserve(call, need))
            return;
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

/* RFC 9113 (8.3) makes a request that repeats a pseudo-header malformed; nghttp2 does not check
 * it here (no_http_messaging). Kept as the last value, a second :path would run another method
 * than the one a proxy or a log reading the first saw: such a request is refused whole. */
static void pseudo_header_seen(rpc_call *call, const uint8_t *name, size_t namelen) {
    static const char *const names[] = {":method", ":path", ":scheme", ":authority"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strlen(names[i]) != namelen || memcmp(names[i], name, namelen) != 0)
            continue;
        if ((call->pseudo_seen & (1u << i)) && call->early.code == ST_OK)
            st_err_set(&call->early, ST_INVALID_ARGUMENT,
                       "the request repeats the %s pseudo-header, which HTTP/2 forbids: send "
                       "each pseudo-header once",
                       names[i]);
        call->pseudo_seen |= (uint8_t)(1u << i);
        return;
    }
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
    if (namelen > 0 && name[0] == ':')
        pseudo_header_seen(call, name, namelen);
    if (namelen == 7 && memcmp(name, ":method", 7) == 0) {
        call->saw_post = valuelen == 4 && memcmp(value, "POST", 4) == 0;
        return 0;
    }
    if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        call->content_type = content_type_kind(value, valuelen, call->codec, sizeof call->codec);
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
    call->headers_done = true;
    if (!call->saw_post) {
        call->http_status = 405;
        call_fail(call, ST_UNIMPLEMENTED, "gRPC requires the POST method");
        return;
    }
    if (call->content_type == RPC_CT_BAD) {
        call->http_status = 415;
        call_fail(call, ST_INVALID_ARGUMENT, "content-type must be application/grpc");
        return;
    }
    if (call->content_type == RPC_CT_CODEC) {
        /* As gRPC's own servers answer: HTTP 200, INTERNAL. */
        char msg[128];
        snprintf(msg, sizeof msg,
                 "no codec registered for content-subtype '%s': this server speaks only "
                 "application/grpc+proto",
                 call->codec);
        call_fail(call, ST_INTERNAL, msg);
        return;
    }
    if (call->early.code != ST_OK) {
        call_fail(call, call->early.code, call->early.msg);
        return;
    }
    /* The guard sees unknown methods too (rpc_call_method_known): a server requiring
     * credentials refuses a probe without them before saying which methods exist. */
    call->method = call->path ? rpc_server_method_find(conn->srv, call->path) : NULL;
    if (call->path && conn->srv->guard) {
        st_err gerr = {0};
        st_code grc = conn->srv->guard(call, call->path, conn->srv->guard_arg, &gerr);
        if (grc != ST_OK) {
            call_fail(call, grc, gerr.msg[0] ? gerr.msg : "refused by the server");
            return;
        }
    }
    if (!call->method) {
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
    size_t n = rpc_frame_len(p);
    return n > d->bytes_max ? 0 : 5 + n;
}

/* Fails call because the budget cannot hold its request of size bytes (announced, prefix
 * included). */
static void call_refuse_memory(h2_conn *conn, rpc_call *call, size_t size) {
    size_t max = conn->srv->limits.buffered_request_bytes_max;
    char msg[256];
    snprintf(msg, sizeof msg,
             "the server is buffering %zu MiB of requests and this %zu MiB request would pass "
             "its limit of %zu MiB (--max-buffered-request-bytes): retry later or send smaller "
             "requests",
             rpc_mem_buffered() >> 20, (size + (1 << 20) - 1) >> 20, max >> 20);
    STAT_ADD(conn->srv, calls_refused_memory, 1);
    call_fail(call, ST_RESOURCE_EXHAUSTED, msg);
}

static void call_refuse_conn(rpc_call *call) {
    call_fail(call, ST_RESOURCE_EXHAUSTED,
              "this connection buffers too many request bytes: spread large requests over "
              "several connections or send them one after another");
}

/* At the message's prefix: refuses a request of announced bytes that the bytes already
 * buffered leave no room for, before it sends them. Nothing is reserved here: a length costs
 * its sender nothing, so reserving it would let one stream that announces a large message and
 * trickles it hold the whole budget against every other call. False when refused. */
static bool call_admit(h2_conn *conn, rpc_call *call, size_t announced) {
    size_t max = conn->srv->limits.buffered_request_bytes_max;
    size_t cur = rpc_mem_buffered();
    if (conn->request_bytes + announced > H2_CONN_REQUEST_BYTES_MAX) {
        call_refuse_conn(call);
        return false;
    }
    if (cur > call->mem_reserved && (announced > max || cur > max - announced)) {
        call_refuse_memory(conn, call, announced);
        return false;
    }
    return true;
}

/* Grows the call's reservation to the request bytes it has received, in its connection's and
 * the process's budgets, so that the budget follows what is buffered. When the new bytes do not
 * fit, the call is failed and its share given back: pausing its stream instead (no more
 * flow-control window) would let large requests that each hold part of the budget wait on one
 * another until the slow-request rule ends them all. False when refused. */
static bool call_reserve(h2_conn *conn, rpc_call *call, size_t want) {
    if (want <= call->request_bytes)
        return true;
    size_t more = want - call->request_bytes;
    if (conn->request_bytes + more > H2_CONN_REQUEST_BYTES_MAX) {
        call_refuse_conn(call);
        return false;
    }
    if (!rpc_mem_reserve(more, conn->srv->limits.buffered_request_bytes_max, call->mem_reserved)) {
        call_refuse_memory(conn, call, call->announced_bytes > want ? call->announced_bytes : want);
        return false;
    }
    conn->request_bytes += more;
    call->request_bytes += more;
    call->mem_reserved += more;
    return true;
}

/* The deframer refuses every compressed message (this server decompresses none): name the
 * encoding the client compressed with, so that it knows which setting to turn off. */
static void compressed_error(const rpc_call *call, st_err *err) {
    const char *enc = rpc_call_header(call, "grpc-encoding");
    if (enc && enc[0] && strcmp(enc, "identity") != 0)
        st_err_set(err, ST_UNIMPLEMENTED,
                   "grpc-encoding \"%.64s\" is not supported: send uncompressed messages "
                   "(identity)",
                   enc);
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                         const uint8_t *data, size_t len, void *user_data) {
    (void)flags;
    h2_conn *conn = user_data;
    rpc_call *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call || call->finished || call->dispatched)
        return 0; /* nghttp2 still returns the flow-control window */
    size_t announced = request_announced(call, data, len);
    if (announced) {
        call->announced_bytes = announced;
        if (!call_admit(conn, call, announced))
            return 0;
    }
    call->request_received += len;
    if (!call_reserve(conn, call, call->request_received))
        return 0;
    st_err err = {0};
    st_code rc = rpc_deframer_feed(&call->deframer, data, len, &err, request_msg, call);
    if (rc == ST_INVALID_ARGUMENT && err.code == ST_OK)
        st_err_set(&err, rc, "more than one request message: client streaming is unsupported");
    if (rc == ST_UNIMPLEMENTED)
        compressed_error(call, &err);
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
    /* An empty message leaves request.data NULL: no NULL + 0 (undefined behaviour). */
    const uint8_t *msg = call->request.data ? call->request.data + call->request_skip : NULL;
    st_slice req = st_slice_make(msg, call->request.len - call->request_skip);
    rpc_server *srv = call->conn->srv;
    if (srv->gate && !srv->gate(call, req, srv->gate_arg))
        return; /* the gate finished the call */
    call->method->handler(call, req, call->method->arg);
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    h2_conn *conn = user_data;
    if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK) &&
        !conn->ready) { /* the preface (checked by nghttp2) and the first SETTINGS are in */
        h2_conn_handshake_done(conn);
        if (!conn->calls)
            h2_conn_idle_mark(conn);
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
        rpc_call_detach(call);
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

void rpc_calls_end(h2_conn *conn, st_code code, const char *why) {
    for (rpc_call *call = conn->calls, *next; call; call = next) {
        next = call->next; /* detaching waits for the flush: the list holds still here */
        if (call->finished)
            continue;
        rpc_call_ref(call);
        call_finish_internal(call, code, why);
        call_run_cancel(call);
        rpc_call_unref(call);
    }
}

/* ---- slow requests ---- */

/* Ends the calls whose request has not brought the minimum rate over a whole window: a client
 * trickling a request in holds its buffers and a stream slot for as long as it likes otherwise. */
bool rpc_calls_check_slow(h2_conn *conn, int64_t now) {
    const rpc_limits *lim = &conn->srv->limits;
    int64_t window_us = (int64_t)lim->slow_request_window_ms * 1000;
    uint64_t need = (uint64_t)lim->request_bytes_per_s_min * lim->slow_request_window_ms / 1000;
    if (need == 0)
        need = 1; /* at least some progress in each window */
    for (rpc_call *call = conn->calls, *next; call; call = next) {
        next = call->next;
        if (call->dispatched || now - call->slow_mark_us < window_us ||
            (call->finished && call->headers_done))
            continue;
        if (!call->headers_done) { /* stalled inside a header block: nothing else can pass */
            STAT_ADD(conn->srv, calls_slow, 1);
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: %s\"",
                            "request headers incomplete after the slow-request window");
            return false;
        }
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
    return true;
}

void rpc_call_session_callbacks(nghttp2_session_callbacks *cbs) {
    nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
}

bool rpc_call_method_known(const rpc_call *call) {
    return call->method != NULL;
}

void *rpc_call_conn_memo(rpc_call *call, size_t size) {
    h2_conn *conn = call->conn;
    if (!conn || size == 0)
        return NULL;
    if (!conn->memo) {
        conn->memo = calloc(1, size);
        conn->memo_size = conn->memo ? size : 0;
    }
    return conn->memo_size == size ? conn->memo : NULL;
}

const char *rpc_call_peer_role(rpc_call *call) {
    h2_conn *conn = call->conn;
    if (!conn)
        return "";
    if (!conn->role_known) {
        SSL *ssl = conn->wbuf.ssl;
        if (!ssl || !rpc_tls_peer_role(ssl, conn->peer_role, sizeof conn->peer_role))
            conn->peer_role[0] = '\0';
        conn->role_known = true; /* a connection's peer certificate never changes */
    }
    return conn->peer_role;
}
