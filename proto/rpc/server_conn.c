/* server_conn.c — h2_conn, one per connection: a bufferevent, an nghttp2 session, its calls,
 * and ONE close function (h2_conn_close) that every failure reaches. Output stops at
 * H2_CONN_OUTPUT_HIGH_WATER_BYTES and resumes when the socket drains. A periodic timer enforces
 * the process's handshake, idle and slow-request timeouts (rpc_limits). */
#include <stdatomic.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <nghttp2/nghttp2.h>

#include "server_internal.h"

/* ---- connection output ---- */

/* Where send_cb queues output (see h2_out_add). */
h2_wbuf *h2_conn_wbuf(h2_conn *conn) {
    return &conn->wbuf;
}

/* wbuf may reference bytes of calls' response queues (send_data_cb): write them out before a
 * queue is compacted or handed back to a caller (or freed, if it cannot be retired). Only ever
 * needed inside a flush (a cancel callback sending), as h2_conn_flush writes after every pass. */
void h2_conn_out_settle(h2_conn *conn) {
    if (h2_out_pinned(h2_conn_wbuf(conn)))
        h2_out_write_now(conn->bev, &conn->wbuf);
}

bool h2_conn_flush(h2_conn *conn) {
    int rv;
    do {
        rv = nghttp2_session_send(conn->session);
        if (rv != 0) {
            RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"h2 send failed\" err=\"%s\"", nghttp2_strerror(rv));
            return false;
        }
    } while (h2_out_write_now(conn->bev, &conn->wbuf) && nghttp2_session_want_write(conn->session));
    if (!nghttp2_session_want_read(conn->session) && !nghttp2_session_want_write(conn->session) &&
        h2_out_len(conn->bev, h2_conn_wbuf(conn)) == 0)
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
void h2_conn_kick(h2_conn *conn) {
    event_active(conn->flush_ev, EV_TIMEOUT, 0);
}

static ssize_t send_cb(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data) {
    (void)session;
    (void)flags;
    h2_conn *conn = user_data;
    if (h2_out_len(conn->bev, h2_conn_wbuf(conn)) >= H2_CONN_OUTPUT_HIGH_WATER_BYTES)
        return NGHTTP2_ERR_WOULDBLOCK; /* resumed by the write callback */
    if (!h2_out_add(conn->bev, h2_conn_wbuf(conn), data, length))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)length;
}

/* ---- connections ---- */

static void conn_hs_leave(h2_conn *conn) {
    if (!conn->hs_listed)
        return;
    rpc_server *srv = conn->srv;
    if (conn->hs_prev)
        conn->hs_prev->hs_next = conn->hs_next;
    else
        srv->hs_head = conn->hs_next;
    if (conn->hs_next)
        conn->hs_next->hs_prev = conn->hs_prev;
    else
        srv->hs_tail = conn->hs_prev;
    conn->hs_prev = conn->hs_next = NULL;
    conn->hs_listed = false;
}

/* A new connection: last in its server's handshake list (accepted_us only goes forward). */
static void conn_hs_enter(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    conn->hs_prev = srv->hs_tail;
    if (srv->hs_tail)
        srv->hs_tail->hs_next = conn;
    else
        srv->hs_head = conn;
    srv->hs_tail = conn;
    conn->hs_listed = true;
}

void h2_conn_handshake_done(h2_conn *conn) {
    conn->ready = true;
    conn_hs_leave(conn);
}

void h2_conn_close(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    h2_wbuf_drop(&conn->wbuf); /* unwritten output is lost anyway; it must not pin the calls */
    while (conn->calls)
        rpc_call_detach(conn->calls); /* nghttp2_session_del runs no stream-close callbacks */
    h2_conn_idle_leave(conn);         /* after the calls: the last one ending lists it again */
    conn_hs_leave(conn);
    if (conn->read_ev)
        event_free(conn->read_ev); /* before the bufferevent closes the socket */
    if (conn->session)
        nghttp2_session_del(conn->session);
    h2_tls_close(conn->bev, &conn->wbuf);
    if (conn->bev)
        bufferevent_free(conn->bev);
    if (conn->flush_ev)
        event_free(conn->flush_ev);
    if (conn->timer_ev)
        event_free(conn->timer_ev);
    h2_wbuf_free(&conn->wbuf);
    if (conn->slot)
        rpc_conn_slot_put();
    if (conn->memo) {
        OPENSSL_cleanse(conn->memo, conn->memo_size); /* it may hold a credential */
        free(conn->memo);
    }
    STAT_SUB(srv, conns_open, 1);
    free(conn);
}

void h2_conn_idle_leave(h2_conn *conn) {
    if (!conn->idle_listed)
        return;
    rpc_server *srv = conn->srv;
    if (conn->idle_prev)
        conn->idle_prev->idle_next = conn->idle_next;
    else
        srv->idle_head = conn->idle_next;
    if (conn->idle_next)
        conn->idle_next->idle_prev = conn->idle_prev;
    else
        srv->idle_tail = conn->idle_prev;
    conn->idle_prev = conn->idle_next = NULL;
    conn->idle_listed = false;
}

void h2_conn_idle_mark(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    conn->idle_since_us = st_mono_us();
    h2_conn_idle_leave(conn);
    conn->idle_prev = srv->idle_tail; /* the clock only goes forward: the list stays sorted */
    if (srv->idle_tail)
        srv->idle_tail->idle_next = conn;
    else
        srv->idle_head = conn;
    srv->idle_tail = conn;
    conn->idle_listed = true;
}

/* The peer sent something: a connection without calls is idle only from now on (the idle
 * timeout counts neither open calls nor traffic, e.g. keepalive PINGs). */
static void conn_heard(h2_conn *conn) {
    if (!conn->calls)
        h2_conn_idle_mark(conn);
}

static bool conn_feed(void *arg, const uint8_t *data, size_t len) {
    h2_conn *conn = arg;
    conn_heard(conn);
    ssize_t rv = nghttp2_session_mem_recv(conn->session, data, len);
    if (rv < 0) {
        RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: bad HTTP/2 input\" err=\"%s\"",
                        nghttp2_strerror((int)rv));
        h2_conn_flush(conn); /* try to get the GOAWAY out */
        return false;
    }
    return true;
}

/* A handshake that failed (or a TLS error later): one rate-limited line with OpenSSL's reason and
 * the usual fix, so an operator sees why a client or peer could not connect. */
static void conn_tls_failed(h2_conn *conn, unsigned long e) {
    char why[512];
    h2_tls_why(&conn->wbuf, e, why, sizeof why);
    if (h2_tls_established(&conn->wbuf))
        RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: TLS error\" why=\"%s\"", why);
    else
        RPC_LOG_LIMITED(ST_LOG_INFO,
                        "msg=\"TLS handshake failed\" why=\"%s\" hint=\"clients must speak TLS; "
                        "where client certificates are required they must be signed by the CA "
                        "given to this server and be valid now\"",
                        why);
}

/* The handshake finished: only a client that agreed on h2 goes on. */
static bool conn_tls_established(void *arg) {
    h2_conn *conn = arg;
    if (h2_tls_alpn_h2(&conn->wbuf))
        return true;
    RPC_LOG_LIMITED(ST_LOG_INFO, "msg=\"closing connection: ALPN did not select h2\" %s",
                    "hint=\"the client must offer h2 (gRPC) in ALPN\"");
    return false;
}

/* TLS: ciphertext read from the socket, decrypted into conn_feed. */
static bool conn_tls_feed(void *arg, const uint8_t *data, size_t len) {
    h2_conn *conn = arg;
    static const h2_tls_sink sink_fns = {conn_feed, conn_tls_established, NULL};
    h2_tls_sink sink = sink_fns;
    sink.arg = conn;
    unsigned long e;
    conn_heard(conn);
    h2_tls_result r = h2_tls_recv(conn->bev, &conn->wbuf, data, len, &sink, &e);
    if (r == H2_TLS_FAILED)
        conn_tls_failed(conn, e);
    return r == H2_TLS_OK;
}

/* The read event's callback (see h2_sock_read). */
static void conn_sock_read_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    h2_conn *conn = arg;
    h2_read_result r = h2_sock_read(fd, conn->wbuf.ssl ? conn_tls_feed : conn_feed, conn);
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

/* The bufferevent only writes (what the socket did not take at once): its errors end the
 * connection. */
static void conn_event_cb(struct bufferevent *bev, short events, void *arg) {
    (void)bev;
    h2_conn *conn = arg;
    if (events & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        h2_conn_close(conn);
}

static bool h2_session_start(h2_conn *conn) {
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return false;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    rpc_call_session_callbacks(cbs);
    nghttp2_option *opt = h2_session_option();
    if (opt && conn->unix_owner)
        nghttp2_option_set_stream_reset_rate_limit(opt, H2_UNIX_OWNER_RESET_BURST,
                                                   H2_UNIX_OWNER_RESETS_PER_S);
    int rv = opt ? nghttp2_session_server_new3(&conn->session, cbs, conn, opt, h2_mem())
                 : NGHTTP2_ERR_NOMEM;
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rv != 0)
        return false;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, conn->srv->opts.streams_max},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)H2_STREAM_WINDOW_BYTES},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)conn->srv->limits.header_bytes_max},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    if (nghttp2_submit_settings(conn->session, NGHTTP2_FLAG_NONE, iv, 4) != 0 ||
        nghttp2_session_set_local_window_size(conn->session, NGHTTP2_FLAG_NONE, 0,
                                              H2_CONN_WINDOW_BYTES) != 0)
        return false;
    return h2_conn_flush(conn);
}

/* ---- connection timeouts ---- */

/* Queues a GOAWAY: streams above the last one processed are refused, so a client may retry
 * them elsewhere; those below finish. */
static bool goaway_submit(h2_conn *conn, const char *why) {
    int32_t last = nghttp2_session_get_last_proc_stream_id(conn->session);
    return nghttp2_submit_goaway(conn->session, NGHTTP2_FLAG_NONE, last, NGHTTP2_NO_ERROR,
                                 (const uint8_t *)why, strlen(why)) == 0;
}

/* Ends a connection politely: its GOAWAY written if the socket takes it, then closed. */
static void conn_goaway_close(h2_conn *conn, const char *why) {
    if (goaway_submit(conn, why))
        h2_conn_flush(conn);
    h2_conn_close(conn);
}

void h2_conn_goaway(h2_conn *conn, const char *why) {
    if (!conn->ready) { /* no call yet, and nothing could carry a GOAWAY through a handshake */
        h2_conn_close(conn);
        return;
    }
    (void)goaway_submit(conn, why);
    h2_conn_kick(conn); /* the flush closes it once nothing is left to exchange */
}

bool h2_conn_evict_idle(rpc_server *srv) {
    h2_conn *conn = srv->hs_head;
    if (conn) { /* a peer that has not finished its handshake never outranks a client */
        STAT_ADD(srv, conns_evicted, 1);
        RPC_LOG_LIMITED(ST_LOG_INFO,
                        "msg=\"at the connection limit: closing the oldest connection still in "
                        "its handshake to admit a new one\" max=%u age_ms=%lld peer=%s "
                        "hint=\"many connections that never complete TLS or the HTTP/2 preface "
                        "are a connect flood or a client speaking the wrong protocol\"",
                        srv->limits.connections_max,
                        (long long)((st_mono_us() - conn->accepted_us) / 1000), conn->peer);
        h2_conn_close(conn); /* nothing to say a GOAWAY in yet */
        return true;
    }
    conn = srv->idle_head; /* every connection listed here is established */
    if (!conn)
        return false;
    STAT_ADD(srv, conns_evicted, 1);
    RPC_LOG_LIMITED(ST_LOG_INFO,
                    "msg=\"at the connection limit: closing the longest idle connection to admit "
                    "a new one\" max=%u idle_ms=%lld peer=%s hint=\"raise --max-connections (and "
                    "ulimit -n) if clients keep many idle connections\"",
                    srv->limits.connections_max,
                    (long long)((st_mono_us() - conn->idle_since_us) / 1000), conn->peer);
    /* a client that reads it reconnects on its next call */
    conn_goaway_close(conn, "server at its connection limit: closing idle connections");
    return true;
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
    if (!conn->tick_ready) { /* the handshake timeout is done with: tick at the ready period */
        conn->tick_ready = true;
        const struct timeval *tv = &srv->conn_tick_ready;
        if (tv->tv_sec == 0 && tv->tv_usec == 0)
            event_del(conn->timer_ev);
        else
            event_add(conn->timer_ev, tv);
    }
    if (!conn->calls && lim->idle_timeout_ms &&
        now - conn->idle_since_us >= (int64_t)lim->idle_timeout_ms * 1000) {
        STAT_ADD(srv, conns_idle_closed, 1);
        conn_goaway_close(conn, "idle");
        return;
    }
    if (lim->slow_request_window_ms && !rpc_calls_check_slow(conn, now))
        conn_goaway_close(conn, "slow request headers");
}

/* Arms the connection's periodic timer (the timeouts), when any timeout is on. */
static bool conn_timer_start(h2_conn *conn) {
    rpc_server *srv = conn->srv;
    if (srv->conn_tick.tv_sec == 0 && srv->conn_tick.tv_usec == 0)
        return true;
    conn->timer_ev = event_new(srv->base, -1, EV_PERSIST, conn_timer_cb, conn);
    return conn->timer_ev && event_add(conn->timer_ev, &srv->conn_tick) == 0;
}

/* ---- opening ---- */

/* The client's address as rpc_call_peer shows it. */
static void conn_peer_name(const struct sockaddr *addr, char *out, size_t cap) {
    char ip[INET6_ADDRSTRLEN] = "?";
    snprintf(out, cap, "unix");
    if (addr && addr->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%u", ip, ntohs(a->sin_port));
    } else if (addr && addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, cap, "[%s]:%u", ip, ntohs(a->sin6_port));
    }
}

/* A Unix-socket peer of another user id never gets the role the socket stands for (its
 * directory should already keep such peers out). */
static bool conn_unix_same_user(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid())
        return true;
    RPC_LOG_LIMITED(ST_LOG_WARN, "msg=\"closing a Unix-socket connection of another user\" %s",
                    "hint=\"only the server's own user may use its socket\"");
    return false;
}

void h2_conn_open(rpc_server *srv, int fd, const struct sockaddr *addr) {
    h2_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        rpc_conn_slot_put();
        close(fd);
        return;
    }
    conn->srv = srv;
    conn->slot = true;
    conn->accepted_us = st_mono_us();
    static _Atomic uint64_t serials;
    conn->serial = atomic_fetch_add(&serials, 1) + 1;
    conn_peer_name(addr, conn->peer, sizeof conn->peer);
    bool is_unix = addr && addr->sa_family == AF_UNIX;
    bool unix_plain = is_unix && srv->opts.ssl_ctx && srv->opts.unix_peer_role;
    if (unix_plain && !conn_unix_same_user(fd)) {
        free(conn); /* not linked in yet: nothing else to undo */
        rpc_conn_slot_put();
        close(fd);
        return;
    }
    /* Without TLS the socket's owner-only directory keeps other users out as well. */
    conn->unix_owner = is_unix && srv->opts.unix_peer_role;
    if (unix_plain) { /* the socket's permissions stand for a certificate */
        snprintf(conn->peer_role, sizeof conn->peer_role, "%s", srv->opts.unix_peer_role);
        conn->role_known = true;
    }
    conn->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = conn;
    srv->conns = conn;
    h2_conn_idle_mark(conn); /* idle from its accept until its first call */
    conn_hs_enter(conn);     /* and in its handshake until the client's preface and SETTINGS */
    STAT_ADD(srv, conns_accepted, 1);
    STAT_ADD(srv, conns_open, 1);
    int one = 1;
    if (!addr || addr->sa_family != AF_UNIX) /* a TCP option; Unix sockets have no Nagle */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conn->flush_ev = event_new(srv->base, -1, 0, conn_flush_cb, conn);
    conn->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!conn->bev)
        close(fd);
    bool tls = srv->opts.ssl_ctx && !unix_plain;
    if (!conn->bev || !conn->flush_ev || !conn_timer_start(conn) ||
        (tls && !h2_tls_attach(&conn->wbuf, srv->opts.ssl_ctx, true, NULL))) {
        h2_conn_close(conn);
        return;
    }
    bufferevent_setcb(conn->bev, NULL, conn_write_cb, conn_event_cb, conn);
    bufferevent_setwatermark(conn->bev, EV_WRITE, H2_CONN_OUTPUT_HIGH_WATER_BYTES / 2, 0);
    /* The connection reads with its own event and arms the bufferevent's write event only while
     * the socket is full. (A TLS handshake that never ends: the handshake timeout.) */
    conn->read_ev = event_new(srv->base, bufferevent_getfd(conn->bev), EV_READ | EV_PERSIST,
                              conn_sock_read_cb, conn);
    if (!conn->read_ev || event_add(conn->read_ev, NULL) != 0 || !h2_session_start(conn))
        h2_conn_close(conn);
}
