/* The gRPC client's calls: one rpc_ccall per HTTP/2 stream on an rpc_client (client.c): its
 * single allocation (cached per thread), submission and resubmission of a refused request, the
 * stream callbacks that feed the response to the caller, completion, deadlines and cancellation,
 * and the unary helper. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "client_internal.h"

#define RPC_TIMEOUT_INDEX_EVERY 256u

/* Request headers are handed to nghttp2 without copies (H2_NV): every name and value is a
 * literal, or lives in the client (host) or in the call's allocation (path, metadata, timeout),
 * which outlast the HEADERS frame (nghttp2 drops a frame it will not send without reading it).
 * Names are lower case, as HTTP/2 requires (nghttp2 would otherwise lower-case its copy). */

static bool ccall_submit(rpc_client *c, rpc_ccall *call);
static void held_unlink(rpc_client *c, rpc_ccall *call);
static void group_open(rpc_ccall *call, bool open);
static void group_leave(rpc_client *c, rpc_ccall *call);

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

void rpc_ccall_complete(rpc_ccall *call, st_code code, const char *message) {
    rpc_client *c = call->c;
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    c->n_calls--;
    if (call->held)
        held_unlink(c, call);
    if (call->group)
        group_leave(c, call);
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
        rpc_client_kick(c); /* flush_cb closes the drained connection */
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
        rpc_ccall_complete(call, call->local.code, call->local.msg);
    else if (call->deadline_hit)
        rpc_ccall_complete(call, ST_DEADLINE_EXCEEDED, "deadline exceeded");
    else if (call->cancelled)
        rpc_ccall_complete(call, ST_CANCELLED, "cancelled by the client");
    else if (call->got_status && call->status == ST_OK && call->deframer.prefix_len != 0)
        rpc_ccall_complete(call, ST_INTERNAL, "response ended inside a message");
    else if (call->got_status)
        rpc_ccall_complete(call, call->status, call->message);
    else if (call->http_status != 0 && call->http_status != 200)
        rpc_ccall_complete(call, http_to_code(call->http_status), "HTTP error without grpc-status");
    else {
        char msg[96];
        snprintf(msg, sizeof(msg), "stream closed without status (HTTP/2 error %s)",
                 nghttp2_http2_strerror(error_code));
        rpc_ccall_complete(call, h2_error_to_code(error_code), msg);
    }
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
    h2_wbuf *wbuf = rpc_client_wbuf(c);
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

/* Automatic WINDOW_UPDATE is off on client sessions (client_session_new): the connection's
 * window is given back as bytes arrive, a stream's once its call took them, unless the call is
 * paused (rpc_ccall_pause): its server then stalls on that stream alone. */
static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                         const uint8_t *data, size_t len, void *user_data) {
    (void)flags;
    (void)user_data;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (nghttp2_session_consume_connection(session, len) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (call && call->local.code == ST_OK && !call->cancelled && !call->deadline_hit &&
        rpc_deframer_feed(&call->deframer, data, len, &call->local, response_msg, call) != ST_OK)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    if (call && call->paused) {
        call->unconsumed += len;
        return 0;
    }
    return nghttp2_session_consume_stream(session, stream_id, len) == 0
               ? 0
               : NGHTTP2_ERR_CALLBACK_FAILURE;
}

void rpc_ccall_pause(rpc_ccall *call) {
    call->paused = true;
}

void rpc_ccall_resume(rpc_ccall *call) {
    if (!call->paused)
        return;
    call->paused = false;
    rpc_client *c = call->c;
    if (call->unconsumed > 0 && c->session && call->stream_id > 0 &&
        nghttp2_session_consume_stream(c->session, call->stream_id, call->unconsumed) == 0)
        rpc_client_kick(c); /* the WINDOW_UPDATE goes out from the loop */
    call->unconsumed = 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data) {
    rpc_client *c = user_data;
    rpc_ccall *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call)
        return 0;
    c->n_open--;
    group_open(call, false);
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
    rpc_ccall_held_run(c); /* a stream is free */
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
        c->n_open--;
        group_open(call, false);
        ccall_stream_closed(call, NGHTTP2_CANCEL);
        rpc_ccall_held_run(c);
        break;
    }
    return 0;
}

bool rpc_ccall_unprocessed(const rpc_ccall *call) {
    return call->unprocessed;
}

bool rpc_ccall_answered(const rpc_ccall *call) {
    /* headers with :status 200 alone are no answer yet: the status may never follow */
    return call->got_status || (call->http_status != 0 && call->http_status != 200);
}

size_t rpc_ccall_conn_lost(const rpc_ccall *call) {
    return call->lost_with;
}

bool rpc_ccall_connected(const rpc_ccall *call) {
    return call->c->connected;
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

/* ---- calls ---- */

static void ccall_deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_ccall *call = arg;
    rpc_client *c = call->c;
    call->deadline_hit = true;
    if (call->held) { /* never sent: nothing to reset */
        call->unprocessed = true;
        rpc_ccall_complete(call, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        return;
    }
    if (call->stream_id > 0 && c->session)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    rpc_client_kick(c);
}

void rpc_ccall_cancel(rpc_ccall *call) {
    if (call->cancelled || call->deadline_hit)
        return;
    call->cancelled = true;
    rpc_client *c = call->c;
    if (call->held)
        c->held_cancelled++; /* ended from the loop (rpc_ccall_held_run) */
    else if (call->stream_id > 0 && c->session)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    rpc_client_kick(c);
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
    if (call->stream_id <= 0)
        return false;
    c->n_open++;
    group_open(call, true);
    return true;
}

/* ---- owners' groups of held calls ---- */

static size_t hold_bucket(uint64_t owner) {
    return (size_t)((owner * 0x9E3779B97F4A7C15ull) >> 58) % RPC_HOLD_BUCKETS;
}

/* The group of owner, created when absent (NULL: out of memory). */
static rpc_hold_group *hold_group(rpc_client *c, uint64_t owner) {
    if (owner == 0)
        return &c->hold_group0;
    rpc_hold_group **slot = &c->hold_hash[hold_bucket(owner)];
    for (rpc_hold_group *g = *slot; g; g = g->hash_next)
        if (g->owner == owner)
            return g;
    rpc_hold_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->owner = owner;
    g->hash_next = *slot;
    *slot = g;
    return g;
}

/* Appends held call to its group's held calls; a group that held none joins the ring last in
 * turn. */
static void group_hold(rpc_client *c, rpc_ccall *call) {
    rpc_hold_group *g = call->group;
    call->group_prev = g->tail;
    call->group_next = NULL;
    if (g->tail) {
        g->tail->group_next = call;
        g->tail = call;
        return;
    }
    g->head = g->tail = call;
    c->hold_newest = g;
    if (!c->hold_ring) {
        g->ring_prev = g->ring_next = g;
        c->hold_ring = g;
        return;
    }
    g->ring_next = c->hold_ring;
    g->ring_prev = c->hold_ring->ring_prev;
    g->ring_prev->ring_next = g;
    c->hold_ring->ring_prev = g;
}

/* Takes held call out of its group's held calls; a group left with none leaves the ring. */
static void group_unhold(rpc_client *c, rpc_ccall *call) {
    rpc_hold_group *g = call->group;
    if (call->group_prev)
        call->group_prev->group_next = call->group_next;
    else
        g->head = call->group_next;
    if (call->group_next)
        call->group_next->group_prev = call->group_prev;
    else
        g->tail = call->group_prev;
    call->group_prev = call->group_next = NULL;
    if (g->head)
        return;
    if (c->hold_newest == g)
        c->hold_newest = NULL;
    if (g->ring_next == g) {
        c->hold_ring = NULL;
    } else {
        g->ring_prev->ring_next = g->ring_next;
        g->ring_next->ring_prev = g->ring_prev;
        if (c->hold_ring == g)
            c->hold_ring = g->ring_next;
    }
    g->ring_prev = g->ring_next = NULL;
}

/* Call's stream opened (true) or closed: its group's count of open streams. */
static void group_open(rpc_ccall *call, bool open) {
    if (call->group_open == open)
        return;
    call->group_open = open;
    if (open)
        call->group->open++;
    else
        call->group->open--;
}

/* Call leaves its group (held, it must have left its held calls); a group left without
 * members is freed, but for group 0. */
static void group_leave(rpc_client *c, rpc_ccall *call) {
    rpc_hold_group *g = call->group;
    group_open(call, false);
    call->group = NULL;
    if (--g->members > 0 || g == &c->hold_group0)
        return;
    rpc_hold_group **slot = &c->hold_hash[hold_bucket(g->owner)];
    while (*slot != g)
        slot = &(*slot)->hash_next;
    *slot = g->hash_next;
    free(g);
}

static void group_join(rpc_ccall *call, rpc_hold_group *g) {
    call->group = g;
    g->members++;
}

void rpc_ccall_set_owner(rpc_ccall *call, uint64_t owner) {
    if (!call->group || call->group->owner == owner)
        return;
    rpc_client *c = call->c;
    rpc_hold_group *g = hold_group(c, owner);
    if (!g)
        return; /* out of memory: it stays with the calls without owner */
    bool open = call->group_open;
    if (call->held)
        group_unhold(c, call);
    group_leave(c, call);
    group_join(call, g);
    group_open(call, open);
    if (call->held)
        group_hold(c, call);
}

/* ---- calls held for a stream ---- */

/* Streams the server lets this client open at once (nghttp2 reports "unlimited" until the
 * server's SETTINGS arrived: requests past its limit are then refused and sent again). */
static size_t streams_max(const rpc_client *c) {
    return nghttp2_session_get_remote_settings(c->session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

static void held_unlink(rpc_client *c, rpc_ccall *call) {
    if (call->held_prev)
        call->held_prev->held_next = call->held_next;
    else
        c->held_head = call->held_next;
    if (call->held_next)
        call->held_next->held_prev = call->held_prev;
    else
        c->held_tail = call->held_prev;
    call->held_prev = call->held_next = NULL;
    group_unhold(c, call);
    call->held = false;
    if (call->cancelled)
        c->held_cancelled--;
}

/* Sends the request now when a stream is free and no call waits before it, else holds it (with
 * the calls without owner until rpc_ccall_set_owner names one). */
static bool ccall_start(rpc_client *c, rpc_ccall *call) {
    group_join(call, &c->hold_group0);
    if (!c->held_head && c->n_open < streams_max(c)) {
        if (ccall_submit(c, call))
            return true;
        group_leave(c, call); /* the caller frees it */
        return false;
    }
    call->held = true;
    call->held_prev = c->held_tail;
    call->held_next = NULL;
    if (c->held_tail)
        c->held_tail->held_next = call;
    else
        c->held_head = call;
    c->held_tail = call;
    group_hold(c, call);
    return true;
}

/* The next held call to send: every other time, the oldest of the group that joined last, once
 * (an owner arriving behind a crowd of owners with one call each); otherwise the oldest of the
 * group with the fewest streams open, the first in turn among equals, whose turn then passes. */
static rpc_ccall *held_next_out(rpc_client *c) {
    c->hold_express_turn = !c->hold_express_turn;
    if (c->hold_express_turn && c->hold_newest) {
        rpc_hold_group *g = c->hold_newest;
        c->hold_newest = NULL;
        return g->head;
    }
    rpc_hold_group *best = c->hold_ring;
    for (rpc_hold_group *g = best->ring_next; g != c->hold_ring && best->open > 0; g = g->ring_next)
        if (g->open < best->open)
            best = g;
    c->hold_ring = best->ring_next;
    return best->head;
}

void rpc_ccall_held_run(rpc_client *c) {
    for (rpc_ccall *call = c->held_head, *next; call && c->held_cancelled > 0; call = next) {
        next = call->held_next;
        if (call->cancelled) {
            call->unprocessed = true;
            rpc_ccall_complete(call, ST_CANCELLED, "cancelled by the client");
        }
    }
    while (c->held_head && (c->draining || c->n_open < streams_max(c))) {
        rpc_ccall *call = held_next_out(c);
        held_unlink(c, call);
        call->unprocessed = true; /* until its HEADERS go out (on_frame_send) */
        if (call->cancelled)      /* by a call ended above */
            rpc_ccall_complete(call, ST_CANCELLED, "cancelled by the client");
        else if (c->draining)
            rpc_ccall_complete(call, ST_UNAVAILABLE,
                               "the connection is closing (GOAWAY); the request was not sent");
        else if (!ccall_submit(c, call))
            rpc_ccall_complete(call, ST_UNAVAILABLE, "the request could not be submitted");
        else
            call->unprocessed = false;
    }
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
    if (!ok || !ccall_start(c, call)) {
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
    rpc_client_kick(c);
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

void rpc_ccall_session_callbacks(nghttp2_session_callbacks *cbs) {
    nghttp2_session_callbacks_set_send_data_callback(cbs, body_send_cb);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, on_frame_not_send);
}
