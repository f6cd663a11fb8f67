/* The gRPC client's connection: one HTTP/2 connection (rpc_client) carrying many concurrent calls
 * (client_call.c) on a caller-provided event_base.
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

#include "client_internal.h"

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

static void client_fail(rpc_client *c, const char *why);

/* ---- output ---- */

static bool client_flush(rpc_client *c) {
    do {
        int rv = nghttp2_session_send(c->session);
        if (rv != 0) {
            snprintf(c->fail_msg, sizeof(c->fail_msg), "HTTP/2 send failed: %s",
                     nghttp2_strerror(rv));
            return false;
        }
    } while (c->connected && h2_out_write_now(c->bev, &c->wbuf) &&
             nghttp2_session_want_write(c->session));
    return true;
}

static void flush_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_client *c = arg;
    if (!c->dead && c->held_head)
        rpc_ccall_held_run(c); /* cancelled ones end, and streams freed go to the next */
    if (!c->dead && !client_flush(c))
        client_fail(c, c->fail_msg);
    else if (!c->dead && c->draining && c->n_calls == 0)
        client_fail(c, "drained after the server's GOAWAY");
}

/* User code queued output: flush it from the loop (re-activating an active event is a no-op). */
void rpc_client_kick(rpc_client *c) {
    if (!c->dead)
        event_active(c->flush_ev, EV_TIMEOUT, 0);
}

static ssize_t send_cb(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data) {
    (void)session;
    (void)flags;
    rpc_client *c = user_data;
    h2_wbuf *wbuf = rpc_client_wbuf(c);
    if (h2_out_len(c->bev, wbuf) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (!h2_out_add(c->bev, wbuf, data, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

/* ---- input ---- */

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    rpc_client *c = user_data;
    /* GOAWAY: the server finishes the streams up to last_stream_id and takes no new ones (a
     * restart, or its protection against too many stream resets). Later calls need another
     * connection: the owner sees the client as not alive and dials one, while the calls the
     * server accepted finish here. nghttp2 closes the refused streams with REFUSED_STREAM. */
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK))
        c->ping_sent_us = 0;
    if (frame->hd.type == NGHTTP2_GOAWAY)
        c->goaway_clean = c->goaway_clean || frame->goaway.error_code == NGHTTP2_NO_ERROR;
    if (frame->hd.type == NGHTTP2_GOAWAY && !c->draining) {
        c->draining = true;
        st_log(ST_LOG_INFO, "rpc",
               "msg=\"server sent GOAWAY: finishing its streams on this connection, new calls "
               "go to a new one\" peer=%s error=%s last_stream=%d",
               c->peer, nghttp2_http2_strerror(frame->goaway.error_code),
               frame->goaway.last_stream_id);
        rpc_ccall_held_run(c); /* the held calls will not go on this connection */
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
    for (rpc_ccall *call = c->calls; call; call = call->next) {
        /* Frames queued before the connect are only in our buffer: a connect that failed sent
         * nothing, so these calls are neither lost in a drop nor possibly processed. */
        call->sent = call->sent && c->connected;
        sent += call->sent;
    }
    bool drop = !c->silent && !c->goaway_clean; /* what the two say is no crash under a call */
    c->lost = drop ? sent : 0;
    for (rpc_ccall *call = c->calls; call; call = call->next) {
        call->lost_with = call->sent && drop ? sent : 0;
        call->unprocessed = call->unprocessed || !call->sent;
    }
    while (c->calls)
        rpc_ccall_complete(c->calls, c->calls->deadline_hit ? ST_DEADLINE_EXCEEDED : ST_UNAVAILABLE,
                           msg);
    if (c->read_ev)
        event_free(c->read_ev); /* before the bufferevent closes the socket */
    c->read_ev = NULL;
    if (c->ka_ev)
        event_free(c->ka_ev);
    c->ka_ev = NULL;
    if (c->hs_ev)
        event_free(c->hs_ev);
    c->hs_ev = NULL;
    if (c->session)
        nghttp2_session_del(c->session);
    c->session = NULL;
    h2_tls_close(c->bev, &c->wbuf);
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

static bool client_established(rpc_client *c);

static bool client_tls_established(void *arg) {
    rpc_client *c = arg;
    if (c->hs_ev)
        event_free(c->hs_ev);
    c->hs_ev = NULL;
    return client_established(c);
}

/* TLS: ciphertext read from the socket, decrypted into client_feed. */
static bool client_tls_feed(void *arg, const uint8_t *data, size_t len) {
    rpc_client *c = arg;
    static const h2_tls_sink sink_fns = {client_feed, client_tls_established, NULL};
    h2_tls_sink sink = sink_fns;
    sink.arg = c;
    unsigned long e;
    h2_tls_result r = h2_tls_recv(c->bev, &c->wbuf, data, len, &sink, &e);
    if (r == H2_TLS_FAILED) {
        char tls_why[512], why[600];
        h2_tls_why(&c->wbuf, e, tls_why, sizeof tls_why);
        snprintf(why, sizeof why, "%s: %s", c->connected ? "TLS error" : "TLS handshake failed",
                 tls_why);
        client_fail(c, why);
    } else if (r == H2_TLS_EOF) {
        client_fail(c, "connection closed by the server (TLS close_notify)");
    }
    return r == H2_TLS_OK && !c->dead;
}

/* The read event's callback (see h2_sock_read). */
static void client_sock_read_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    rpc_client *c = arg;
    switch (h2_sock_read(fd, c->wbuf.ssl ? client_tls_feed : client_feed, c)) {
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
        if (!c->dead) /* a callback refused without saying why */
            client_fail(c, "connection ended");
        break;
    }
}

/* Connected socket: from now on read it directly instead of through the bufferevent. */
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
        rpc_client_kick(c);
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

/* rpc_client_opts.peer_role: the server's certificate names the role this client expects (a
 * node dialling a router's address by mistake, or a certificate of the wrong kind, stops here
 * with a message naming both). */
static bool client_role_ok(rpc_client *c, char *why, size_t cap) {
    if (!c->opts.peer_role || !c->wbuf.ssl)
        return true;
    char role[RPC_ROLE_MAX + 1];
    rpc_tls_peer_role(c->wbuf.ssl, role, sizeof role);
    if (strcmp(role, c->opts.peer_role) == 0)
        return true;
    snprintf(why, cap,
             "the server's certificate names role '%s', not '%s' (subject OU): give that server "
             "a certificate for its role",
             role[0] ? role : "(none)", c->opts.peer_role);
    return false;
}

/* Connected (TLS: the handshake finished): checks the peer, then HTTP/2 goes out. False when
 * the client failed. */
static bool client_established(rpc_client *c) {
    c->connected = true;
    keepalive_start(c, bufferevent_getfd(c->bev));
    char why[RPC_ROLE_MAX * 2 + 160];
    if (c->wbuf.ssl && !h2_tls_alpn_h2(&c->wbuf))
        client_fail(c, "TLS ALPN did not select h2");
    else if (!client_role_ok(c, why, sizeof why))
        client_fail(c, why);
    else if (!c->wbuf.ssl && !client_read_direct(c))
        client_fail(c, "cannot watch the socket");
    else if (!c->dead && !client_flush(c))
        client_fail(c, c->fail_msg);
    return !c->dead;
}

static void client_handshake_timeout_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    client_fail(arg, "TLS handshake timed out");
}

/* TCP connected, TLS to do: the socket is read directly from now on, the handshake starts and
 * must end within the connect timeout. */
static bool client_tls_start(rpc_client *c) {
    int64_t ms = c->opts.connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    c->hs_ev = event_new(c->base, -1, 0, client_handshake_timeout_cb, c);
    return c->hs_ev && event_add(c->hs_ev, &tv) == 0 && client_read_direct(c) && !c->dead &&
           h2_tls_connect(c->bev, &c->wbuf);
}

static void client_event_cb(struct bufferevent *bev, short events, void *arg) {
    rpc_client *c = arg;
    if (events & BEV_EVENT_CONNECTED) {
        bufferevent_set_timeouts(bev, NULL, NULL); /* connected: calls carry their own deadlines */
        int one = 1;
        if (!c->is_unix) /* a TCP option; Unix sockets have no Nagle */
            setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (!c->wbuf.ssl)
            client_established(c);
        else if (!client_tls_start(c) && !c->dead)
            client_fail(c, "cannot start the TLS handshake");
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
        client_fail(c, why);
    }
}

static bool client_session_new(rpc_client *c) {
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return false;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    rpc_ccall_session_callbacks(cbs);
    nghttp2_option *opt = h2_session_option();
    if (opt) /* the calls give flow-control credit back themselves (rpc_ccall_pause) */
        nghttp2_option_set_no_auto_window_update(opt, 1);
    int rv =
        opt ? nghttp2_session_client_new3(&c->session, cbs, c, opt, h2_mem()) : NGHTTP2_ERR_NOMEM;
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rv != 0)
        return false;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
         (uint32_t)(c->opts.stream_window_bytes > 0 ? c->opts.stream_window_bytes
                                                    : H2_CLIENT_STREAM_WINDOW_BYTES)},
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
    return c;
}

/* Sets up the bufferevent and the session and starts connecting to sa (named `where` in
 * errors); frees c on failure. */
static rpc_client *client_connect(rpc_client *c, const struct sockaddr *sa, socklen_t sa_len,
                                  const char *where, st_err *err) {
    const char *sni = c->opts.server_name ? c->opts.server_name : c->host;
    c->flush_ev = event_new(c->base, -1, 0, flush_cb, c);
    c->bev = bufferevent_socket_new(c->base, -1, BEV_OPT_CLOSE_ON_FREE);
    bool tls_ok =
        !c->opts.ssl_ctx || (c->bev && h2_tls_attach(&c->wbuf, c->opts.ssl_ctx, false, sni));
    if (!c->flush_ev || !c->bev || !tls_ok || !client_session_new(c)) {
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
        rpc_ccall_complete(c->calls, ST_CANCELLED, "client closed");
    if (c->read_ev)
        event_free(c->read_ev);
    if (c->ka_ev)
        event_free(c->ka_ev);
    if (c->hs_ev)
        event_free(c->hs_ev);
    if (c->session)
        nghttp2_session_del(c->session);
    h2_tls_close(c->bev, &c->wbuf);
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

size_t rpc_client_lost(const rpc_client *c) {
    return c->lost;
}

int64_t rpc_client_last_read_us(const rpc_client *c) {
    return c->last_read_us;
}

bool rpc_client_silent(const rpc_client *c) {
    return c->silent;
}

bool rpc_client_connected(const rpc_client *c) {
    return c->connected;
}
