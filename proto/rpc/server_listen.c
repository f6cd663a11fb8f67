/* server_listen.c — the server's listeners (TCP and Unix-domain) and accepting: the process's
 * connection limit (a connection still in its handshake, else the longest idle one, closed to
 * make room, a GOAWAY for connections past it when none is idle), and pausing the listeners when
 * accept() runs out of descriptors instead of retrying at once. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <event2/listener.h>
#include <nghttp2/nghttp2.h>

#include "server_internal.h"

#define ACCEPT_BACKOFF_MS_MIN 100u  /* first pause of the listeners after accept() starved */
#define ACCEPT_BACKOFF_MS_MAX 3200u /* the pause doubles up to this */

/* ---- accepting ---- */

/* At connections_max with every connection busy: a SETTINGS and a GOAWAY written straight to the
 * new socket (no session is made for it), then closed, so a client learns it was refused rather
 * than cut off. A TLS client gets only the close: plaintext frames would read to it as a server
 * speaking no TLS at all ("wrong version number"), sending its operator after certificates
 * instead of the limit. */
static void conn_refuse(rpc_server *srv, int fd, bool tls) {
    static const char debug[] = "server at its connection limit (--max-connections)";
    STAT_ADD(srv, conns_refused, 1); /* counted before the peer can see the close */
    uint8_t f[9 + 9 + 8 + sizeof debug - 1] = {0};
    f[3] = NGHTTP2_SETTINGS; /* an empty SETTINGS: the server preface */
    size_t glen = 8 + sizeof debug - 1;
    f[9 + 1] = (uint8_t)(glen >> 8);
    f[9 + 2] = (uint8_t)glen;
    f[9 + 3] = NGHTTP2_GOAWAY; /* last stream 0, NO_ERROR: nothing was processed */
    memcpy(f + 9 + 9 + 8, debug, sizeof debug - 1);
    ssize_t w = tls ? 0 : send(fd, f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
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

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr,
                      int addrlen, void *arg) {
    (void)l;
    (void)addrlen;
    rpc_server *srv = arg;
    srv->accept_backoff_ms = 0;
    /* At the limit, the oldest connection still in its handshake makes room, else the longest
     * idle one: a crowd of connections that hold no call (opened and left, or kept with PINGs)
     * cannot lock new clients out, and a connect flood that never speaks only displaces itself,
     * not established clients between calls. Only when every connection has a call open is the
     * new one refused. */
    if (!rpc_conn_slot_take(srv->limits.connections_max) &&
        !(h2_conn_evict_idle(srv) && rpc_conn_slot_take(srv->limits.connections_max))) {
        conn_refuse(srv, fd,
                    srv->opts.ssl_ctx && !(addr->sa_family == AF_UNIX && srv->opts.unix_peer_role));
        return;
    }
    h2_conn_open(srv, fd, addr);
}

/* Adds a new listener to the server (the accept pause timer made with the first); false, with
 * the listener freed, when out of memory. */
static bool listener_keep(rpc_server *s, struct evconnlistener *l, st_err *err) {
    if (!s->accept_ev && !(s->accept_ev = evtimer_new(s->base, accept_resume_cb, s))) {
        evconnlistener_free(l);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding a listener");
        return false;
    }
    evconnlistener_set_error_cb(l, accept_error_cb);
    s->listeners[s->listeners_len++] = l;
    return true;
}

/* A TCP socket bound to host:port (SO_REUSEADDR, as a listener's), not listening yet. */
static st_code bind_tcp(const char *host, uint16_t port, int *fd_out, uint16_t *bound_port,
                        st_err *err) {
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
    int fd = -1, e = 0, one = 1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)) {
            e = errno;
            close(fd);
            fd = -1;
        } else if (fd < 0) {
            e = errno;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return st_err_set(err, ST_UNAVAILABLE, "cannot listen on %s:%u: %s; is the port in use?",
                          host ? host : "*", port, strerror(e));
    if (bound_port) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                               : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    *fd_out = fd;
    return ST_OK;
}

st_code rpc_server_bind(rpc_server *s, const char *host, uint16_t port, uint16_t *bound_port,
                        st_err *err) {
    if (s->listeners_len + s->bound_len >= RPC_LISTENERS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "too many listeners (max %d)",
                          RPC_LISTENERS_MAX);
    int fd = -1; /* set when bind_tcp succeeds (the compiler cannot see it at -O3) */
    st_code rc = bind_tcp(host, port, &fd, bound_port, err);
    if (rc == ST_OK)
        s->bound[s->bound_len++] = fd;
    return rc;
}

st_code rpc_server_listen_bound(rpc_server *s, st_err *err) {
    while (s->bound_len > 0) {
        int fd = s->bound[0];
        struct evconnlistener *l = evconnlistener_new(
            s->base, accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
        if (!l)
            return st_err_set(err, ST_UNAVAILABLE, "cannot listen on a bound socket: %s",
                              strerror(errno));
        memmove(s->bound, s->bound + 1, --s->bound_len * sizeof s->bound[0]);
        if (!listener_keep(s, l, err))
            return ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

st_code rpc_server_listen(rpc_server *s, const char *host, uint16_t port, uint16_t *bound_port,
                          st_err *err) {
    st_code rc = rpc_server_bind(s, host, port, bound_port, err);
    return rc == ST_OK ? rpc_server_listen_bound(s, err) : rc;
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

/* rpc_server_opts.unix_peer_role: the socket replaces TLS with file permissions, so its
 * directory must be closed to other users. */
static st_code unix_owner_only(const rpc_server *s, const char *path, st_err *err) {
    if (!s->opts.ssl_ctx || !s->opts.unix_peer_role)
        return ST_OK;
    char dir[RPC_UNIX_PATH_MAX + 1];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    struct stat st;
    if (stat(dir, &st) != 0)
        return st_err_set(err, ST_UNAVAILABLE, "cannot stat %s, the directory of socket %s: %s",
                          dir, path, strerror(errno));
    if ((st.st_mode & 077) || st.st_uid != geteuid())
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "the Unix socket %s carries no TLS and relies on its directory %s being "
                          "this user's alone, but it is mode %03o owned by uid %u: chmod 700 it "
                          "(or put the socket elsewhere, or drop the socket)",
                          path, dir, (unsigned)(st.st_mode & 0777), (unsigned)st.st_uid);
    return ST_OK;
}

st_code rpc_server_listen_unix(rpc_server *s, const char *path, st_err *err) {
    if (s->listeners_len + s->bound_len >= RPC_LISTENERS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "too many listeners (max %d)",
                          RPC_LISTENERS_MAX);
    struct sockaddr_un sa;
    socklen_t len;
    if (!h2_unix_addr(path, &sa, &len))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "socket path '%s' is empty or longer than %d bytes", path,
                          RPC_UNIX_PATH_MAX);
    st_code rc = unix_owner_only(s, path, err);
    if (rc == ST_OK)
        rc = unix_clear_stale(path, &sa, len, err);
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
    if (!listener_keep(s, l, err)) { /* forget the path kept above */
        s->unix_len--;
        unlink(path);
        free(s->unix_files[s->unix_len].path);
        return ST_RESOURCE_EXHAUSTED;
    }
    return ST_OK;
}

void rpc_server_listeners_free(rpc_server *s) {
    for (size_t i = 0; i < s->listeners_len; i++)
        evconnlistener_free(s->listeners[i]);
    s->listeners_len = 0;
    for (size_t i = 0; i < s->bound_len; i++)
        close(s->bound[i]);
    s->bound_len = 0;
    unix_paths_remove(s);
    if (s->accept_ev)
        event_free(s->accept_ev);
    s->accept_ev = NULL;
}

/* New connections wrap their sockets with ctx from now on. A TLS connection's SSL holds its own
 * reference to the context it was made with, so connections already open keep theirs until they
 * close, and the caller may free the context it replaced. */
bool rpc_server_set_ssl_ctx(rpc_server *s, struct ssl_ctx_st *ctx) {
    if (!s->opts.ssl_ctx || !ctx)
        return false; /* the transport (plain or TLS) is fixed when the server is made */
    s->opts.ssl_ctx = ctx;
    return true;
}
