/* The gRPC client: one HTTP/2 connection (rpc_client) carrying many concurrent calls (rpc_ccall)
 * on a caller-provided event_base, plus blocking helpers that run their own base.
 *
 * A client whose connection fails is dead for good: client_fail ends every call with UNAVAILABLE
 * and later calls are refused; the owner makes a new client (reconnect policy belongs to the
 * caller, who knows whether a retry is idempotent). */
#include <errno.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <nghttp2/nghttp2.h>

#include "rpc_internal.h"

#define RPC_PEER_NAME_MAX 320 /* "unix:" + a socket path, or host:port */

struct rpc_client {
    struct event_base *base;
    rpc_client_opts opts;
    const h2_transport *tp;
    char *host;                       /* :authority and TLS name: the host, or "unix:PATH" */
    char peer[RPC_PEER_NAME_MAX + 1]; /* for logs and errors: "host:port" or "unix:PATH" */
    struct bufferevent *bev;
    nghttp2_session *session;
    rpc_ccall *calls;
    bool dead;
    bool direct;    /* plain socket: client_flush writes it itself once connected */
    bool connected; /* BEV_EVENT_CONNECTED seen */
    bool is_unix;   /* a Unix-domain socket (rpc_client_new_unix) */
    /* direct and connected: reads the socket itself (h2_sock_read), the bufferevent does not,
     * and output goes to wbuf (h2_out_add) */
    struct event *read_ev;
    h2_wbuf wbuf;
    /* API calls only queue frames and activate this event, which flushes from the loop: so no
     * API function runs a user callback (on_done) before it returns. */
    struct event *flush_ev;
    char fail_msg[256];
    uint32_t timeouts_sent; /* requests sent with grpc-timeout (ccall_submit) */
    /* The server sent GOAWAY: the calls it accepted finish here, new ones are refused
     * (rpc_client_alive is false, so the owner dials a new connection), and the connection
     * closes once the last call ended. */
    bool draining;
    int64_t last_read_us; /* st_mono_us of the last bytes received (0: none yet) */
    /* Keepalive (rpc_client_opts): a timer every keepalive_ms once connected; a PING out since
     * ping_sent_us (0: none) with nothing read since fails the connection after the timeout. */
    struct event *ka_ev;
    int64_t ping_sent_us;
    bool silent;    /* failed by the keepalive: a silent peer, not a drop (rpc_ccall_conn_lost) */
    size_t n_calls; /* calls not yet completed */
};

struct rpc_ccall {
    rpc_client *c;
    int32_t stream_id;
    rpc_deframer deframer;
    rpc_ccall_msg_fn on_msg;
    rpc_ccall_done_fn on_done;
    void *arg;
    const uint8_t *body; /* the framed request, in the call's own allocation */
    size_t body_len, body_off;
    int http_status;
    bool got_status, cancelled, deadline_hit;
    st_code status;
    char message[RPC_GRPC_MESSAGE_MAX];
    st_err local; /* an error found on our side (bad response framing) */
    /* Kept to resubmit a request the server refused before processing it (REFUSED_STREAM, e.g.
     * sent before its SETTINGS_MAX_CONCURRENT_STREAMS arrived), as gRPC clients do. Like the body,
     * they live in the call's one allocation (ccall_alloc). */
    const char *path;
    size_t path_len;
    nghttp2_nv *md; /* lengths known: nghttp2 takes them as they are */
    size_t md_count;
    int64_t deadline_us;   /* st_mono_us; 0 = none */
    char timeout_text[16]; /* the grpc-timeout value of the HEADERS in flight */
    int refused_retries;
    bool unprocessed; /* ended before the server processed it (rpc_ccall_unprocessed) */
    bool sent;        /* its HEADERS went out: the server may be working on it */
    size_t lost_with; /* the connection dropped under it, with this many sent calls (>= 1) */
    struct event *deadline_ev; /* NULL, or the timer inside the call's allocation (added) */
    size_t alloc_bytes;        /* size of the call's allocation (ccall_alloc) */
    rpc_ccall *prev, *next;
};

#define RPC_TIMEOUT_INDEX_EVERY 256u

/* ---- logging connection failures ----
 * A peer that is down makes its owner redial every few hundred milliseconds, each dial failing
 * again: one line per failure would flood the log. Each loop thread logs the first failure of a
 * peer, then at most one line per peer every RPC_FAIL_LOG_EVERY_MS saying how many it skipped.
 * Per-thread state (a fixed table, the oldest entry reused), like the caches below. */
#define RPC_FAIL_LOG_EVERY_MS 10000
#define RPC_FAIL_LOG_PEERS 32

typedef struct fail_log_entry {
    char peer[RPC_PEER_NAME_MAX + 1];
    int64_t last_us; /* 0: free */
    uint64_t skipped;
} fail_log_entry;

static _Thread_local fail_log_entry tl_fail_log[RPC_FAIL_LOG_PEERS];

/* True when this failure of peer is to be logged; *skipped receives how many were not since. */
static bool fail_log_due(const char *peer, uint64_t *skipped) {
    int64_t now = st_mono_us();
    fail_log_entry *e = NULL, *oldest = &tl_fail_log[0];
    for (size_t i = 0; i < RPC_FAIL_LOG_PEERS && !e; i++) {
        fail_log_entry *x = &tl_fail_log[i];
        if (x->last_us && strcmp(x->peer, peer) == 0)
            e = x;
        else if (x->last_us < oldest->last_us)
            oldest = x;
    }
    if (!e) {
        e = oldest;
        snprintf(e->peer, sizeof e->peer, "%s", peer);
        e->last_us = 0;
        e->skipped = 0;
    }
    if (e->last_us && now - e->last_us < (int64_t)RPC_FAIL_LOG_EVERY_MS * 1000) {
        e->skipped++;
        return false;
    }
    *skipped = e->skipped;
    e->skipped = 0;
    e->last_us = now;
    return true;
}

/* Request headers are handed to nghttp2 without copies (H2_NV): every name and value is a
 * literal, or lives in the client (host) or in the call's allocation (path, metadata, timeout),
 * which outlast the HEADERS frame (nghttp2 drops a frame it will not send without reading it).
 * Names are lower case, as HTTP/2 requires (nghttp2 would otherwise lower-case its copy). */

static void client_fail(rpc_client *c, const char *why);
static void client_kick(rpc_client *c);
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);

/* ---- the per-thread cache of call allocations ----
 * A call is one allocation of a few KiB (ccall_alloc), beyond malloc's per-thread cache: ended
 * calls' allocations are kept per thread for the next calls (a proxy starts one per request).
 * Sizes are rounded up so that requests of similar sizes share them; freed at thread exit. */
#define CCALL_CACHE_MAX 128
#define CCALL_CACHE_BYTES_MAX ((size_t)16 << 10) /* larger allocations are freed, not kept */
#define CCALL_ALLOC_ROUND ((size_t)1 << 10)

typedef struct ccall_cache {
    rpc_ccall *head; /* linked by next */
    size_t n;
    bool registered; /* for draining at thread exit */
} ccall_cache;

static _Thread_local ccall_cache tl_ccall_cache;

static void ccall_cache_drain(void *arg) {
    ccall_cache *cc = arg;
    while (cc->head) {
        rpc_ccall *call = cc->head;
        cc->head = call->next;
        free(call);
    }
    cc->n = 0;
}

/* An allocation of at least bytes (*got: its size); NULL when out of memory. */
static void *ccall_mem_get(size_t bytes, size_t *got) {
    ccall_cache *cc = &tl_ccall_cache;
    rpc_ccall *cached = cc->head;
    if (cached && cached->alloc_bytes >= bytes) {
        cc->head = cached->next;
        cc->n--;
        *got = cached->alloc_bytes;
        return cached;
    }
    if (bytes <= CCALL_CACHE_BYTES_MAX)
        bytes = (bytes + CCALL_ALLOC_ROUND - 1) & ~(CCALL_ALLOC_ROUND - 1);
    *got = bytes;
    return malloc(bytes);
}

/* Frees an ended call's allocation, or keeps it for the next call. */
static void ccall_mem_put(rpc_ccall *call) {
    ccall_cache *cc = &tl_ccall_cache;
    if (!cc->registered) { /* first use on this thread: drain the cache at thread exit */
        cc->registered = RPC_TL_CACHE_ON && rpc_tl_at_thread_exit(ccall_cache_drain, cc);
        if (!cc->registered)
            cc = NULL;
    }
    if (!cc || cc->n >= CCALL_CACHE_MAX || call->alloc_bytes > CCALL_CACHE_BYTES_MAX) {
        free(call);
        return;
    }
    call->next = cc->head;
    cc->head = call;
    cc->n++;
}

/* ---- call completion ---- */

static void ccall_complete(rpc_ccall *call, st_code code, const char *message) {
    rpc_client *c = call->c;
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    c->n_calls--;
    if (call->deadline_ev)
        event_del(call->deadline_ev);
    if (c->session && call->stream_id > 0)
        nghttp2_session_set_stream_user_data(c->session, call->stream_id, NULL);
    call->on_done(call, code, message ? message : "", call->arg);
    rpc_deframer_deinit(&call->deframer);
    /* wbuf may still reference the request body (a stream can end while its frames are queued,
     * e.g. cancelled): the allocation then goes when they are written. */
    if (!h2_out_pinned(&c->wbuf) || !h2_wbuf_retire(&c->wbuf, call)) {
        if (h2_out_pinned(&c->wbuf))
            h2_out_write_now(c->bev, &c->wbuf);
        ccall_mem_put(call); /* written or never referenced: reusable */
    }
    h2_loop_calls(-1);
    if (c->draining && c->n_calls == 0)
        client_kick(c); /* flush_cb closes the drained connection */
}

/* gRPC's mapping of HTTP status when no grpc-status arrived. */
static st_code http_to_code(int http) {
    switch (http) {
    case 400:
        return ST_INTERNAL;
    case 401:
        return ST_UNAUTHENTICATED;
    case 403:
        return ST_PERMISSION_DENIED;
    case 404:
        return ST_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return ST_UNAVAILABLE;
    default:
        return ST_UNKNOWN;
    }
}

static st_code h2_error_to_code(uint32_t e) {
    switch (e) {
    case NGHTTP2_REFUSED_STREAM:
        return ST_UNAVAILABLE;
    case NGHTTP2_CANCEL:
        return ST_CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM:
        return ST_RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY:
        return ST_PERMISSION_DENIED;
    default:
        return ST_INTERNAL;
    }
}

static void ccall_stream_closed(rpc_ccall *call, uint32_t error_code) {
    if (call->local.code != ST_OK)
        ccall_complete(call, call->local.code, call->local.msg);
    else if (call->deadline_hit)
        ccall_complete(call, ST_DEADLINE_EXCEEDED, "deadline exceeded");
    else if (call->cancelled)
        ccall_complete(call, ST_CANCELLED, "cancelled by the client");
    else if (call->got_status && call->status == ST_OK && call->deframer.prefix_len != 0)
        ccall_complete(call, ST_INTERNAL, "response ended inside a message");
    else if (call->got_status)
        ccall_complete(call, call->status, call->message);
    else if (call->http_status != 0 && call->http_status != 200)
        ccall_complete(call, http_to_code(call->http_status), "HTTP error without grpc-status");
    else {
        char msg[96];
        snprintf(msg, sizeof(msg), "stream closed without status (HTTP/2 error %s)",
                 nghttp2_http2_strerror(error_code));
        ccall_complete(call, h2_error_to_code(error_code), msg);
    }
}

/* ---- output ---- */

static bool client_flush(rpc_client *c) {
    do {
        int rv = nghttp2_session_send(c->session);
        if (rv != 0) {
            snprintf(c->fail_msg, sizeof(c->fail_msg), "HTTP/2 send failed: %s",
                     nghttp2_strerror(rv));
            return false;
        }
    } while (c->direct && c->connected && h2_out_write_now(c->bev, &c->wbuf) &&
             nghttp2_session_want_write(c->session));
    return true;
}

static void flush_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_client *c = arg;
    if (!c->dead && !client_flush(c))
        client_fail(c, c->fail_msg);
    else if (!c->dead && c->draining && c->n_calls == 0)
        client_fail(c, "drained after the server's GOAWAY");
}

/* User code queued output: flush it from the loop (re-activating an active event is a no-op). */
static void client_kick(rpc_client *c) {
    if (!c->dead)
        event_active(c->flush_ev, EV_TIMEOUT, 0);
}

static ssize_t send_cb(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data) {
    (void)session;
    (void)flags;
    rpc_client *c = user_data;
    h2_wbuf *wbuf = c->direct && c->connected ? &c->wbuf : NULL;
    if (h2_out_len(c->bev, wbuf) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (!h2_out_add(c->bev, wbuf, data, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

static ssize_t body_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf,
                            size_t length, uint32_t *data_flags, nghttp2_data_source *source,
                            void *user_data) {
    (void)session;
    (void)stream_id;
    (void)user_data;
    (void)buf;
    rpc_ccall *call = source->ptr;
    size_t n = call->body_len - call->body_off;
    if (n > length)
        n = length;
    /* NO_COPY: body_send_cb writes the bytes from the call's allocation (see the server's
     * data_read_cb). */
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (n == call->body_len - call->body_off)
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* Sends one NO_COPY DATA frame of the request body sized by body_read_cb; a large payload is
 * referenced where it lies (h2_out_add_ref), the call's allocation outliving the write. */
static int body_send_cb(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *source, void *user_data) {
    (void)session;
    rpc_client *c = user_data;
    rpc_ccall *call = source->ptr;
    h2_wbuf *wbuf = c->direct && c->connected ? &c->wbuf : NULL;
    if (h2_out_len(c->bev, wbuf) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK; /* retried with the same frame */
    if (frame->data.padlen != 0 || length > call->body_len - call->body_off)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (!h2_out_add(c->bev, wbuf, framehd, 9) ||
        !h2_out_add_ref(c->bev, wbuf, call->body + call->body_off, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    call->body_off += length;
    return 0;
}

/* ---- input ---- */

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data) {
    (void)flags;
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!call)
        return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        call->http_status = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            call->http_status = call->http_status * 10 + (value[i] - '0');
    } else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        int v = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            v = v * 10 + (value[i] >= '0' && value[i] <= '9' ? value[i] - '0' : 0);
        call->got_status = true;
        call->status = v <= 16 ? (st_code)v : ST_UNKNOWN;
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        rpc_percent_decode((const char *)value, valuelen, call->message, sizeof(call->message));
    }
    return 0;
}

static st_code response_msg(st_slice msg, void *arg) {
    rpc_ccall *call = arg;
    if (call->on_msg && !call->cancelled && !call->deadline_hit)
        call->on_msg(call, msg, call->arg);
    return ST_OK;
}

bool rpc_ccall_msg_take(rpc_ccall *call, st_buf *out) {
    return rpc_deframer_take(&call->deframer, out);
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                         const uint8_t *data, size_t len, void *user_data) {
    (void)flags;
    (void)user_data;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call || call->local.code != ST_OK || call->cancelled || call->deadline_hit)
        return 0;
    if (rpc_deframer_feed(&call->deframer, data, len, &call->local, response_msg, call) != ST_OK)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    rpc_client *c = user_data;
    /* GOAWAY: the server finishes the streams up to last_stream_id and takes no new ones (a
     * restart, or its protection against too many stream resets). Later calls need another
     * connection: the owner sees the client as not alive and dials one, while the calls the
     * server accepted finish here. nghttp2 closes the refused streams with REFUSED_STREAM. */
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK))
        c->ping_sent_us = 0;
    if (frame->hd.type == NGHTTP2_GOAWAY && !c->draining) {
        c->draining = true;
        st_log(ST_LOG_INFO, "rpc",
               "msg=\"server sent GOAWAY: finishing its streams on this connection, new calls "
               "go to a new one\" peer=%s error=%s last_stream=%d",
               c->peer, nghttp2_http2_strerror(frame->goaway.error_code),
               frame->goaway.last_stream_id);
    }
    /* Our request may still be going out when the server has answered (e.g. it refused an
     * oversized request): stop sending, as gRPC clients do. */
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        nghttp2_session_get_stream_local_close(session, frame->hd.stream_id) == 0)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                  NGHTTP2_NO_ERROR);
    return 0;
}

static bool ccall_submit(rpc_client *c, rpc_ccall *call);

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data) {
    rpc_client *c = user_data;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call)
        return 0;
    bool refused = error_code == NGHTTP2_REFUSED_STREAM && !call->got_status &&
                   call->http_status == 0 && call->deframer.messages == 0 && !call->cancelled &&
                   !call->deadline_hit && call->local.code == ST_OK;
    if (refused && c->draining) { /* refused by GOAWAY: this connection takes no new streams */
        call->unprocessed = true;
        st_err_set(&call->local, ST_UNAVAILABLE,
                   "connection to %s is closing (GOAWAY); the request was not processed", c->peer);
    } else if (refused && call->refused_retries < RPC_REFUSED_RETRIES_MAX) {
        call->refused_retries++;
        call->body_off = 0;
        rpc_deframer_deinit(&call->deframer);
        rpc_deframer_init(&call->deframer, c->opts.message_bytes_max);
        if (ccall_submit(c, call))
            return 0;
    }
    ccall_stream_closed(call, error_code);
    return 0;
}

/* A request whose HEADERS never went out (cancelled or timed out while waiting for a stream slot
 * under the server's SETTINGS_MAX_CONCURRENT_STREAMS): nghttp2 opened no stream, so no close
 * callback will come; complete the call here. */
static int on_frame_not_send(nghttp2_session *session, const nghttp2_frame *frame, int lib_error,
                             void *user_data) {
    (void)session;
    rpc_client *c = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    for (rpc_ccall *call = c->calls; call; call = call->next) {
        if (call->stream_id != frame->hd.stream_id)
            continue;
        st_log(ST_LOG_DEBUG, "rpc", "msg=\"request headers not sent\" stream=%d err=\"%s\"",
               call->stream_id, nghttp2_strerror(lib_error));
        call->unprocessed = true;
        if (!call->cancelled && !call->deadline_hit)
            st_err_set(&call->local, ST_UNAVAILABLE, "request to %s not sent: %s", c->peer,
                       nghttp2_strerror(lib_error));
        ccall_stream_closed(call, NGHTTP2_CANCEL);
        break;
    }
    return 0;
}

/* ---- the connection ---- */

/* The one close function every client failure reaches. */
static void client_fail(rpc_client *c, const char *why) {
    if (c->dead)
        return;
    c->dead = true;
    uint64_t skipped = 0;
    if (fail_log_due(c->peer, &skipped))
        st_log(ST_LOG_INFO, "rpc",
               "msg=\"client connection failed\" peer=%s why=\"%s\" calls=%zu "
               "similar_skipped=%llu",
               c->peer, why, c->n_calls, (unsigned long long)skipped);
    char msg[RPC_PEER_NAME_MAX + 256];
    snprintf(msg, sizeof(msg), "connection to %s failed: %s", c->peer, why);
    h2_wbuf_drop(&c->wbuf); /* lost anyway; it must not pin the calls' requests */
    size_t sent = 0;
    for (rpc_ccall *call = c->calls; call; call = call->next)
        sent += call->sent;
    for (rpc_ccall *call = c->calls; call; call = call->next) {
        call->lost_with = call->sent && !c->silent ? sent : 0;
        call->unprocessed = call->unprocessed || !call->sent;
    }
    while (c->calls)
        ccall_complete(c->calls, c->calls->deadline_hit ? ST_DEADLINE_EXCEEDED : ST_UNAVAILABLE,
                       msg);
    if (c->read_ev)
        event_free(c->read_ev); /* before the bufferevent closes the socket */
    c->read_ev = NULL;
    if (c->ka_ev)
        event_free(c->ka_ev);
    c->ka_ev = NULL;
    if (c->session)
        nghttp2_session_del(c->session);
    c->session = NULL;
    if (c->bev)
        bufferevent_free(c->bev);
    c->bev = NULL;
    h2_wbuf_free(&c->wbuf);
}

static void client_read_cb(struct bufferevent *bev, void *arg) {
    rpc_client *c = arg;
    h2_loop_activity();
    c->last_read_us = st_mono_us();
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n;
    while (!c->dead && (n = evbuffer_get_contiguous_space(in)) > 0) {
        const uint8_t *p = evbuffer_pullup(in, (ssize_t)n);
        ssize_t rv = nghttp2_session_mem_recv(c->session, p, n);
        if (rv < 0) {
            client_fail(c, nghttp2_strerror((int)rv));
            return;
        }
        evbuffer_drain(in, n);
    }
    if (!c->dead && !client_flush(c))
        client_fail(c, c->fail_msg);
}

static bool client_feed(void *arg, const uint8_t *data, size_t len) {
    rpc_client *c = arg;
    c->last_read_us = st_mono_us();
    ssize_t rv = nghttp2_session_mem_recv(c->session, data, len);
    if (rv < 0)
        client_fail(c, nghttp2_strerror((int)rv));
    return !c->dead;
}

/* Direct connections: the read event's callback (see h2_sock_read). */
static void client_sock_read_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    rpc_client *c = arg;
    switch (h2_sock_read(fd, client_feed, c)) {
    case H2_READ_AGAIN:
        if (!client_flush(c))
            client_fail(c, c->fail_msg);
        break;
    case H2_READ_EOF:
        client_fail(c, "connection closed by the server");
        break;
    case H2_READ_ERROR: {
        char why[128];
        snprintf(why, sizeof why, "socket error: %s", strerror(errno));
        client_fail(c, why);
        break;
    }
    case H2_READ_FED:
        break; /* client_feed failed the client */
    }
}

/* Connected plain socket: from now on read it directly instead of through the bufferevent. */
static bool client_read_direct(rpc_client *c) {
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        client_read_cb(c->bev, c); /* whatever the bufferevent had already read */
    if (c->dead)
        return true; /* client_fail said why */
    c->read_ev =
        event_new(c->base, bufferevent_getfd(c->bev), EV_READ | EV_PERSIST, client_sock_read_cb, c);
    return c->read_ev && event_add(c->read_ev, NULL) == 0;
}

static void client_write_cb(struct bufferevent *bev, void *arg) {
    (void)bev;
    rpc_client *c = arg;
    if (!c->dead && !client_flush(c))
        client_fail(c, c->fail_msg);
}

/* The keepalive tick: fails a connection silent since its PING for the timeout, and sends a
 * PING while calls are open and none is out. */
static void keepalive_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_client *c = arg;
    if (c->dead || !c->session)
        return;
    int64_t now = st_mono_us();
    if (c->ping_sent_us && c->last_read_us < c->ping_sent_us &&
        now - c->ping_sent_us >= c->opts.keepalive_timeout_ms * 1000) {
        char why[96];
        snprintf(why, sizeof why, "no answer to a keepalive PING within %lld ms",
                 (long long)c->opts.keepalive_timeout_ms);
        c->silent = true;
        client_fail(c, why);
        return;
    }
    if (c->ping_sent_us && c->last_read_us >= c->ping_sent_us)
        c->ping_sent_us = 0; /* bytes arrived: the peer is there (its ACK follows) */
    if (c->ping_sent_us || c->n_calls == 0)
        return;
    if (nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, NULL) == 0) {
        c->ping_sent_us = now;
        client_kick(c);
    }
}

/* Connected: the keepalive timer, and TCP_USER_TIMEOUT on TCP sockets. */
static void keepalive_start(rpc_client *c, int fd) {
    if (c->opts.keepalive_ms < 0)
        return;
    unsigned int user_timeout = (unsigned int)c->opts.keepalive_timeout_ms;
    if (!c->is_unix)
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
    c->ka_ev = event_new(c->base, -1, EV_PERSIST, keepalive_cb, c);
    int64_t ms = c->opts.keepalive_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (c->ka_ev)
        event_add(c->ka_ev, &tv);
}

static void client_event_cb(struct bufferevent *bev, short events, void *arg) {
    rpc_client *c = arg;
    if (events & BEV_EVENT_CONNECTED) {
        bufferevent_set_timeouts(bev, NULL, NULL); /* connected: calls carry their own deadlines */
        int one = 1;
        if (!c->is_unix) /* a TCP option; Unix sockets have no Nagle */
            setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->connected = true;
        keepalive_start(c, bufferevent_getfd(bev));
        if (!c->tp->negotiated_h2(bev))
            client_fail(c, "TLS ALPN did not select h2");
        else if (c->direct && !client_read_direct(c))
            client_fail(c, "cannot watch the socket");
        else if (!c->dead && !client_flush(c))
            client_fail(c, c->fail_msg);
        return;
    }
    if (events & BEV_EVENT_EOF) {
        client_fail(c, "connection closed by the server");
    } else if (events & BEV_EVENT_TIMEOUT) {
        client_fail(c, c->connected ? "timed out" : "connect timed out");
    } else if (events & BEV_EVENT_ERROR) {
        char why[160];
        int e = EVUTIL_SOCKET_ERROR();
        snprintf(why, sizeof why, "%s%s%s", c->connected ? "socket error" : "connect failed",
                 e ? ": " : "", e ? evutil_socket_error_to_string(e) : "");
        if (c->opts.ssl_ctx && c->connected) /* a TLS failure leaves no socket error */
            snprintf(why, sizeof why, "socket or TLS error%s%s", e ? ": " : "",
                     e ? evutil_socket_error_to_string(e) : "");
        client_fail(c, why);
    }
}

static bool client_session_new(rpc_client *c) {
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return false;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_send_data_callback(cbs, body_send_cb);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, on_frame_not_send);
    nghttp2_option *opt = h2_session_option();
    int rv =
        opt ? nghttp2_session_client_new3(&c->session, cbs, c, opt, h2_mem()) : NGHTTP2_ERR_NOMEM;
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rv != 0)
        return false;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)H2_STREAM_WINDOW_BYTES},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    return nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 3) == 0 &&
           nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0,
                                                 H2_CONN_WINDOW_BYTES) == 0;
}

/* The client before its connect: options, transport, name (host or "unix:PATH", for logs and
 * TLS). NULL when memory runs out. */
static rpc_client *client_alloc(struct event_base *base, const char *name,
                                const rpc_client_opts *opts, st_err *err) {
    h2_logging_init();
    rpc_client *c = calloc(1, sizeof(*c));
    if (c)
        snprintf(c->peer, sizeof c->peer, "%s", name);
    if (!c || !(c->host = strdup(name))) {
        free(c);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating an RPC client");
        return NULL;
    }
    c->base = base;
    if (opts)
        c->opts = *opts;
    if (!c->opts.message_bytes_max)
        c->opts.message_bytes_max = RPC_MESSAGE_BYTES_MAX_DEFAULT;
    if (c->opts.message_bytes_max > UINT32_MAX)
        c->opts.message_bytes_max = UINT32_MAX;
    if (c->opts.keepalive_ms == 0)
        c->opts.keepalive_ms = RPC_KEEPALIVE_MS_DEFAULT;
    if (c->opts.keepalive_timeout_ms <= 0)
        c->opts.keepalive_timeout_ms = RPC_KEEPALIVE_TIMEOUT_MS_DEFAULT;
    if (c->opts.connect_timeout_ms <= 0)
        c->opts.connect_timeout_ms = RPC_CONNECT_TIMEOUT_MS_DEFAULT;
    c->tp = c->opts.ssl_ctx ? &h2_transport_tls : &h2_transport_plain;
    c->direct = c->opts.ssl_ctx == NULL;
    return c;
}

/* Sets up the bufferevent and the session and starts connecting to sa (named `where` in
 * errors); frees c on failure. */
static rpc_client *client_connect(rpc_client *c, const struct sockaddr *sa, socklen_t sa_len,
                                  const char *where, st_err *err) {
    const char *sni = c->opts.server_name ? c->opts.server_name : c->host;
    c->flush_ev = event_new(c->base, -1, 0, flush_cb, c);
    c->bev = c->tp->bev_new(c->base, -1, c->opts.ssl_ctx, false, sni);
    if (!c->flush_ev || !c->bev || !client_session_new(c)) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot set up a connection to %s", c->host);
        rpc_client_free(c);
        return NULL;
    }
    bufferevent_setcb(c->bev, client_read_cb, client_write_cb, client_event_cb, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, H2_CONN_OUTPUT_HIGH_WATER_BYTES / 2, 0);
    int64_t ms = c->opts.connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    bufferevent_set_timeouts(c->bev, &tv, &tv);
    int rv = bufferevent_socket_connect(c->bev, sa, (int)sa_len);
    if (rv != 0 || bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0) {
        st_err_set(err, ST_UNAVAILABLE, "cannot connect to %s", where);
        rpc_client_free(c);
        return NULL;
    }
    return c;
}

rpc_client *rpc_client_new(struct event_base *base, const char *host, uint16_t port,
                           const rpc_client_opts *opts, st_err *err) {
    rpc_client *c = client_alloc(base, host, opts, err);
    if (!c)
        return NULL;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%u", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        st_err_set(err, ST_UNAVAILABLE, "cannot resolve %s: %s", host, gai_strerror(gai));
        rpc_client_free(c);
        return NULL;
    }
    char where[RPC_PEER_NAME_MAX - 16];
    snprintf(where, sizeof(where), "%s:%u", host, port);
    snprintf(c->peer, sizeof c->peer, "%s", where);
    c = client_connect(c, res->ai_addr, res->ai_addrlen, where, err);
    freeaddrinfo(res);
    return c;
}

rpc_client *rpc_client_new_unix(struct event_base *base, const char *path,
                                const rpc_client_opts *opts, st_err *err) {
    struct sockaddr_un sa;
    socklen_t len;
    if (!h2_unix_addr(path, &sa, &len)) {
        st_err_set(err, ST_INVALID_ARGUMENT, "socket path '%s' is empty or longer than %d bytes",
                   path, RPC_UNIX_PATH_MAX);
        return NULL;
    }
    char name[sizeof(RPC_UNIX_PREFIX) + RPC_UNIX_PATH_MAX];
    snprintf(name, sizeof(name), "%s%s", RPC_UNIX_PREFIX, path);
    rpc_client *c = client_alloc(base, name, opts, err);
    if (!c)
        return NULL;
    c->is_unix = true;
    return client_connect(c, (struct sockaddr *)&sa, len, name, err);
}

void rpc_client_free(rpc_client *c) {
    if (!c)
        return;
    h2_wbuf_drop(&c->wbuf); /* output not yet written is dropped (and pins no request) */
    while (c->calls)
        ccall_complete(c->calls, ST_CANCELLED, "client closed");
    if (c->read_ev)
        event_free(c->read_ev);
    if (c->ka_ev)
        event_free(c->ka_ev);
    if (c->session)
        nghttp2_session_del(c->session);
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->flush_ev)
        event_free(c->flush_ev);
    h2_wbuf_free(&c->wbuf);
    free(c->host);
    free(c);
}

bool rpc_client_alive(const rpc_client *c) {
    return !c->dead && !c->draining;
}

bool rpc_client_draining(const rpc_client *c) {
    return c->draining && !c->dead;
}

size_t rpc_client_calls(const rpc_client *c) {
    return c->n_calls;
}

int64_t rpc_client_last_read_us(const rpc_client *c) {
    return c->last_read_us;
}

bool rpc_ccall_unprocessed(const rpc_ccall *call) {
    return call->unprocessed;
}

size_t rpc_ccall_conn_lost(const rpc_ccall *call) {
    return call->lost_with;
}

/* Marks a call whose request HEADERS went out (the server may be processing it from now on). */
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (call)
        call->sent = true;
    return 0;
}

bool rpc_client_connected(const rpc_client *c) {
    return c->connected;
}

/* ---- calls ---- */

static void ccall_deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_ccall *call = arg;
    rpc_client *c = call->c;
    call->deadline_hit = true;
    if (call->stream_id > 0 && c->session)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    client_kick(c);
}

void rpc_ccall_cancel(rpc_ccall *call) {
    if (call->cancelled || call->deadline_hit)
        return;
    call->cancelled = true;
    rpc_client *c = call->c;
    if (call->stream_id > 0 && c->session)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    client_kick(c);
}

static bool ccall_submit(rpc_client *c, rpc_ccall *call) {
    char *timeout = call->timeout_text;
    timeout[0] = '\0';
    nghttp2_nv fixed[] = {
        H2_NV(":method", "POST"),
        H2_NV(":scheme", c->opts.ssl_ctx ? "https" : "http"),
        {(uint8_t *)":path", (uint8_t *)call->path, 5, call->path_len, H2_NV_NO_COPY},
        H2_NV(":authority", c->host),
        H2_NV("content-type", "application/grpc"),
        H2_NV("te", "trailers"),
        {(uint8_t *)"grpc-timeout", (uint8_t *)timeout, 12, 0, H2_NV_NO_COPY}};
    size_t nfixed = 6;
    if (call->deadline_us) {
        rpc_timeout_format(call->deadline_us - st_mono_us(), timeout);
        fixed[6].valuelen = strlen(timeout);
        /* Its value differs on every call: indexing it each time would churn both ends' HPACK
         * tables (an insertion, an eviction, and a chain of same-name entries for the encoder
         * to compare against, per call), never indexing it would send the name as a literal.
         * One call in RPC_TIMEOUT_INDEX_EVERY puts it in the table; the others refer to that
         * entry's name and send only the value. */
        if (c->timeouts_sent++ % RPC_TIMEOUT_INDEX_EVERY != 0)
            fixed[6].flags |= NGHTTP2_NV_FLAG_NO_INDEX;
        nfixed = 7;
    }
    nghttp2_nv nva[7 + RPC_HEADERS_COUNT_MAX];
    memcpy(nva, fixed, nfixed * sizeof(nghttp2_nv));
    memcpy(nva + nfixed, call->md, call->md_count * sizeof(nghttp2_nv));
    nghttp2_data_provider prd = {.source = {.ptr = call}, .read_callback = body_read_cb};
    call->stream_id =
        nghttp2_submit_request(c->session, NULL, nva, nfixed + call->md_count, &prd, call);
    return call->stream_id > 0;
}

static size_t align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* One allocation per call: the call, its deadline timer, its metadata (as nghttp2_nv), the framed
 * request and the path and metadata text, so a call costs one malloc and a refused request can
 * be resubmitted. The call's fields are zeroed; NULL when out of memory or oversized. */
static rpc_ccall *ccall_alloc(const char *path, st_slice request, const rpc_metadata *md,
                              size_t md_count, bool timer) {
    if (md_count > RPC_HEADERS_COUNT_MAX)
        return NULL;
    size_t path_len = strlen(path), text = path_len + 1;
    for (size_t i = 0; i < md_count; i++)
        text += strlen(md[i].name) + strlen(md[i].value) + 2;
    size_t ev_off = align16(sizeof(rpc_ccall));
    size_t nv_off = ev_off + (timer ? align16(event_get_struct_event_size()) : 0);
    size_t body_off = nv_off + align16(md_count * sizeof(nghttp2_nv));
    if (request.len > SIZE_MAX - body_off - 5 - text - CCALL_ALLOC_ROUND)
        return NULL;
    size_t got;
    uint8_t *p = ccall_mem_get(body_off + 5 + request.len + text, &got);
    if (!p)
        return NULL;
    rpc_ccall *call = (rpc_ccall *)p;
    memset(call, 0, sizeof(*call));
    call->alloc_bytes = got;
    if (timer)
        call->deadline_ev = (struct event *)(p + ev_off);
    uint8_t *body = p + body_off;
    rpc_frame_prefix(body, (uint32_t)request.len);
    if (request.len)
        memcpy(body + 5, request.data, request.len);
    call->body = body;
    call->body_len = 5 + request.len;
    char *t = (char *)body + call->body_len;
    memcpy(t, path, path_len + 1);
    call->path = t;
    call->path_len = path_len;
    t += path_len + 1;
    call->md = (nghttp2_nv *)(p + nv_off);
    call->md_count = md_count;
    for (size_t i = 0; i < md_count; i++) {
        size_t nl = strlen(md[i].name), vl = strlen(md[i].value);
        for (size_t k = 0; k <= nl; k++) /* lower case: nghttp2 takes the name as it is */
            t[k] = (char)(md[i].name[k] >= 'A' && md[i].name[k] <= 'Z' ? md[i].name[k] + 32
                                                                       : md[i].name[k]);
        memcpy(t + nl + 1, md[i].value, vl + 1);
        call->md[i] = (nghttp2_nv){(uint8_t *)t, (uint8_t *)t + nl + 1, nl, vl, H2_NV_NO_COPY};
        t += nl + vl + 2;
    }
    return call;
}

rpc_ccall *rpc_client_call(rpc_client *c, const char *path, st_slice request,
                           const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                           rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg) {
    if (c->dead || c->draining || request.len > UINT32_MAX)
        return NULL;
    rpc_ccall *call = ccall_alloc(path, request, md, md_count, timeout_ms > 0);
    if (!call)
        return NULL;
    call->c = c;
    call->on_msg = on_msg;
    call->on_done = on_done;
    call->arg = arg;
    rpc_deframer_init(&call->deframer, c->opts.message_bytes_max);
    bool ok = true;
    if (timeout_ms > 0) {
        call->deadline_us = st_mono_us() + timeout_ms * 1000;
        struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
        if (evtimer_assign(call->deadline_ev, c->base, ccall_deadline_cb, call) != 0)
            call->deadline_ev = NULL; /* never assigned: nothing to delete */
        ok = call->deadline_ev && evtimer_add(call->deadline_ev, &tv) == 0;
    }
    if (!ok || !ccall_submit(c, call)) {
        if (call->deadline_ev)
            event_del(call->deadline_ev); /* harmless if it was never added */
        rpc_deframer_deinit(&call->deframer);
        free(call);
        return NULL;
    }
    h2_loop_calls(1);
    c->n_calls++;
    call->next = c->calls;
    if (c->calls)
        c->calls->prev = call;
    c->calls = call;
    client_kick(c);
    return call;
}

/* ---- unary ---- */

typedef struct unary_ctx {
    rpc_unary_done_fn on_done;
    void *arg;
    st_buf resp;
    uint64_t messages;
} unary_ctx;

static void unary_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    unary_ctx *u = arg;
    if (u->messages++ == 0 && st_buf_append(&u->resp, msg.data, msg.len) != ST_OK)
        u->messages = UINT64_MAX; /* reported as RESOURCE_EXHAUSTED below */
}

static void unary_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    unary_ctx *u = arg;
    if (code == ST_OK && u->messages == UINT64_MAX) {
        code = ST_RESOURCE_EXHAUSTED;
        message = "out of memory holding the response";
    } else if (code == ST_OK && u->messages != 1) {
        code = ST_INTERNAL;
        message = u->messages == 0 ? "unary response carried no message"
                                   : "unary response carried several messages";
    }
    u->on_done(code, message, code == ST_OK ? st_buf_slice(&u->resp) : st_slice_make(NULL, 0),
               u->arg);
    st_buf_free(&u->resp);
    free(u);
}

st_code rpc_client_unary(rpc_client *c, const char *path, st_slice request, const rpc_metadata *md,
                         size_t md_count, int64_t timeout_ms, rpc_unary_done_fn on_done,
                         void *arg) {
    unary_ctx *u = calloc(1, sizeof(*u));
    if (!u)
        return ST_RESOURCE_EXHAUSTED;
    u->on_done = on_done;
    u->arg = arg;
    st_buf_init(&u->resp);
    if (!rpc_client_call(c, path, request, md, md_count, timeout_ms, unary_msg, unary_done, u)) {
        free(u);
        return !rpc_client_alive(c) ? ST_UNAVAILABLE : ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

/* ---- blocking helpers ---- */

typedef struct blocking_ctx {
    struct event_base *base;
    void (*on_msg)(st_slice msg, void *arg);
    void *arg;
    st_buf *resp;
    uint64_t messages;
    bool done;
    st_code code;
    char message[RPC_GRPC_MESSAGE_MAX];
} blocking_ctx;

static void blocking_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    blocking_ctx *b = arg;
    b->messages++;
    if (b->on_msg)
        b->on_msg(msg, b->arg);
    if (b->resp && b->messages == 1 && st_buf_append(b->resp, msg.data, msg.len) != ST_OK)
        b->messages = UINT64_MAX;
}

static void blocking_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    blocking_ctx *b = arg;
    b->done = true;
    b->code = code;
    snprintf(b->message, sizeof(b->message), "%s", message);
    event_base_loopbreak(b->base);
}

static st_code blocking_run(const char *addr, const rpc_client_opts *opts, const char *path,
                            st_slice request, const rpc_metadata *md, size_t md_count,
                            int64_t timeout_ms, blocking_ctx *b, st_err *status) {
    char host[256];
    uint16_t port = 0;
    bool is_unix = strncmp(addr, RPC_UNIX_PREFIX, strlen(RPC_UNIX_PREFIX)) == 0;
    if (!is_unix && (!st_addr_split(addr, host, sizeof(host), &port) || port == 0))
        return st_err_set(status, ST_INVALID_ARGUMENT,
                          "bad address %s (want host:port or " RPC_UNIX_PREFIX "PATH)", addr);
    b->base = event_base_new();
    if (!b->base)
        return st_err_set(status, ST_RESOURCE_EXHAUSTED, "cannot create an event_base");
    rpc_client *c = is_unix
                        ? rpc_client_new_unix(b->base, addr + strlen(RPC_UNIX_PREFIX), opts, status)
                        : rpc_client_new(b->base, host, port, opts, status);
    if (!c) {
        event_base_free(b->base);
        return status ? status->code : ST_UNAVAILABLE;
    }
    if (!rpc_client_call(c, path, request, md, md_count, timeout_ms, blocking_msg, blocking_done,
                         b)) {
        b->done = true;
        b->code = rpc_client_alive(c) ? ST_RESOURCE_EXHAUSTED : ST_UNAVAILABLE;
        snprintf(b->message, sizeof(b->message), "cannot start the call");
    }
    while (!b->done && event_base_dispatch(b->base) == 0)
        ;
    rpc_client_free(c);
    /* Let libevent run the bufferevent's deferred teardown (finalizers, and for TLS the SSL
     * object) before the base goes away. */
    event_base_loop(b->base, EVLOOP_NONBLOCK);
    event_base_free(b->base);
    if (b->code == ST_OK && b->messages == UINT64_MAX)
        return st_err_set(status, ST_RESOURCE_EXHAUSTED, "out of memory holding the response");
    if (b->code == ST_OK) {
        st_err_clear(status);
        return ST_OK;
    }
    return st_err_set(status, b->code, "%s", b->message);
}

st_code rpc_blocking_unary(const char *addr, const rpc_client_opts *opts, const char *path,
                           st_slice request, const rpc_metadata *md, size_t md_count,
                           int64_t timeout_ms, st_buf *resp, st_err *status) {
    blocking_ctx b = {.resp = resp};
    if (resp)
        st_buf_reset(resp);
    st_code rc = blocking_run(addr, opts, path, request, md, md_count, timeout_ms, &b, status);
    if (rc == ST_OK && b.messages != 1)
        return st_err_set(status, ST_INTERNAL, "unary response carried %llu messages",
                          (unsigned long long)b.messages);
    return rc;
}

st_code rpc_blocking_stream(const char *addr, const rpc_client_opts *opts, const char *path,
                            st_slice request, const rpc_metadata *md, size_t md_count,
                            int64_t timeout_ms, void (*on_msg)(st_slice msg, void *arg), void *arg,
                            st_err *status) {
    blocking_ctx b = {.on_msg = on_msg, .arg = arg};
    return blocking_run(addr, opts, path, request, md, md_count, timeout_ms, &b, status);
}
