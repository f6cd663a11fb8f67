/* metrics_http.c — GET /metrics over HTTP/1.x on the process's own event_base (strata/metrics.h).
 * Pages are rendered on demand by the owner's callback.
 *
 * A small server of its own rather than libevent's evhttp, so that what scrapers can hold is
 * bounded like the gRPC listener's: evhttp kept every connection a peer opened for as long as a
 * byte arrived every few seconds, and retried a failing accept() at once. Here:
 *   - at most conns_max connections (METRICS_HTTP_CONNECTIONS_MAX, fewer under a small
 *     ulimit -n); at the cap the oldest connection done with (its answer written), or open for
 *     evict_grace_ms without a complete request (a slowloris), is closed to admit the new one;
 *     when there is none the new one gets a 503, so scrapers arriving in a burst, accepted
 *     before their requests are read, never close one another silently;
 *   - each request must be complete within request_ms of its accept, whatever trickles in, and
 *     its answer written within METRICS_HTTP_TIMEOUT_S; one request per connection
 *     ("Connection: close"), so neither deadline is ever renewed;
 *   - accept() out of descriptors pauses the listener (100 ms doubling to 3.2 s) instead of
 *     retrying at once. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "strata/metrics.h"

#define ACCEPT_BACKOFF_MS_MIN 100u  /* first pause of the listener after accept() starved */
#define ACCEPT_BACKOFF_MS_MAX 3200u /* the pause doubles up to this */
#define METRICS_HTTP_CONNECTIONS_MIN 4u

typedef struct mconn mconn;

struct metrics_http {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *resume_ev; /* ends a pause of the listener */
    uint32_t backoff_ms;
    metrics_render_fn render;
    void *arg;
    uint32_t conns_max;
    uint32_t request_ms;
    uint32_t evict_grace_ms;
    mconn *head, *tail; /* open connections, oldest first */
    metrics_http_stats stats;
};

struct mconn {
    metrics_http *m;
    struct bufferevent *bev;
    struct event *timer; /* the request's deadline, then the answer's */
    int64_t opened_us;   /* st_mono_us at accept */
    bool answered;       /* the request was read and its answer queued */
    bool shut;           /* the answer is written and our side shut: waiting for the peer's close */
    bool peer_done;      /* the peer shut its side while the answer was being written */
    mconn *prev, *next;
};

/* ---- connections ---- */

static void conn_close(mconn *c) {
    metrics_http *m = c->m;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        m->tail = c->prev;
    m->stats.open--;
    if (c->timer)
        event_free(c->timer);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

static void conn_arm(mconn *c, uint32_t ms) {
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    event_add(c->timer, &tv);
}

/* Queues the answer (a body of len bytes, left out for HEAD) and the close that follows it. */
static void conn_answer(mconn *c, int minor, int code, const char *reason, const char *ctype,
                        const char *extra, const void *body, size_t len, bool head) {
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out,
                        "HTTP/1.%d %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                        "Connection: close\r\n\r\n",
                        minor, code, reason, ctype, len, extra ? extra : "");
    if (!head && len > 0)
        evbuffer_add(out, body, len);
    c->answered = true;
    conn_arm(c, METRICS_HTTP_TIMEOUT_S * 1000u);
}

static void conn_answer_text(mconn *c, int minor, int code, const char *reason, const char *extra,
                             const char *text) {
    conn_answer(c, minor, code, reason, "text/plain; charset=utf-8", extra, text, strlen(text),
                false);
}

static void conn_answer_page(mconn *c, int minor, bool head) {
    metrics_http *m = c->m;
    st_buf page;
    st_buf_init(&page);
    prom_out o;
    prom_out_init(&o, &page);
    m->render(&o, m->arg);
    if (o.rc != ST_OK) {
        st_buf_free(&page);
        st_log(ST_LOG_WARN, "metrics", "msg=\"metrics page not rendered\" code=%s",
               st_code_name(o.rc));
        conn_answer_text(
            c, minor, 500, "Internal Server Error", NULL,
            "the metrics page could not be built (out of memory or over its size limit)\n");
        return;
    }
    conn_answer(c, minor, 200, "OK", PROM_CONTENT_TYPE, NULL, page.data, page.len, head);
    st_buf_free(&page);
}

/* The path of a request target is exactly /metrics: origin form "/metrics" (then "?query" or
 * "#fragment" may follow), or absolute form "http://host/metrics..." / "https://...". Only a
 * target starting with the scheme is absolute: a "://" later in the path or the query is not. */
static bool target_is_metrics(const char *t, size_t len) {
    const char *end = t + len;
    size_t skip = 0;
    if (len >= 7 && strncasecmp(t, "http://", 7) == 0)
        skip = 7;
    else if (len >= 8 && strncasecmp(t, "https://", 8) == 0)
        skip = 8;
    if (skip) { /* the authority ends at the path, the query or the fragment */
        t += skip;
        while (t < end && *t != '/' && *t != '?' && *t != '#')
            t++;
    }
    size_t n = 0;
    while (t + n < end && t[n] != '?' && t[n] != '#')
        n++;
    return n == 8 && memcmp(t, "/metrics", 8) == 0;
}

/* The request's head (request line and headers, len bytes ending with an empty line) arrived:
 * answers it. Headers are not needed: every answer closes the connection. */
static void conn_request(mconn *c, const char *p, size_t len) {
    while (len >= 2 && (p[0] == '\r' || p[0] == '\n')) { /* empty lines before the request */
        p++;
        len--;
    }
    const char *eol = memchr(p, '\n', len);
    size_t line = eol ? (size_t)(eol - p) : len;
    if (line > 0 && p[line - 1] == '\r')
        line--;
    const char *sp1 = memchr(p, ' ', line);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(p + line - sp1 - 1)) : NULL;
    const char *ver = sp2 ? sp2 + 1 : NULL;
    size_t ver_len = ver ? (size_t)(p + line - ver) : 0;
    if (!sp2 || ver_len != 8 || memcmp(ver, "HTTP/1.", 7) != 0 || ver[7] < '0' || ver[7] > '9') {
        conn_answer_text(c, 1, 400, "Bad Request", NULL, "bad request line\n");
        return;
    }
    int minor = ver[7] == '0' ? 0 : 1;
    size_t mlen = (size_t)(sp1 - p);
    bool get = mlen == 3 && memcmp(p, "GET", 3) == 0;
    bool head = mlen == 4 && memcmp(p, "HEAD", 4) == 0;
    if (!get && !head)
        conn_answer_text(c, minor, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
                         "only GET /metrics is served here\n");
    else if (!target_is_metrics(sp1 + 1, (size_t)(sp2 - sp1 - 1)))
        conn_answer_text(c, minor, 404, "Not Found", NULL, "not found: metrics are at /metrics\n");
    else
        conn_answer_page(c, minor, head);
}

/* Where the head ends (just past its empty line) in p[0, len), or 0 while it is incomplete. */
static size_t head_end(const char *p, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (p[i] != '\n' || i < 2) /* a request line comes first */
            continue;
        if (p[i + 1] == '\n')
            return i + 2;
        if (p[i + 1] == '\r' && i + 2 < len && p[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
    mconn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (c->answered) { /* a body, or what follows the request: not read */
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    size_t len = evbuffer_get_length(in);
    const char *p = (const char *)evbuffer_pullup(in, -1);
    size_t end = p ? head_end(p, len) : 0;
    if (end)
        conn_request(c, p, end);
    else if (len > METRICS_HTTP_HEADERS_BYTES_MAX)
        conn_answer_text(c, 1, 431, "Request Header Fields Too Large", NULL,
                         "request headers too large\n");
    if (c->answered)
        evbuffer_drain(in, len);
}

/* The answer is written: our side is shut, and the connection closes when the peer closes its
 * own (or at the answer's deadline), so that input still arriving does not turn the close into
 * a reset that could lose the answer. */
static void conn_write_cb(struct bufferevent *bev, void *arg) {
    mconn *c = arg;
    if (!c->answered || c->shut || evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        return;
    if (c->peer_done) { /* the peer closed its side already: nothing more to wait for */
        conn_close(c);
        return;
    }
    c->shut = true;
    shutdown(bufferevent_getfd(bev), SHUT_WR);
}

/* A peer that shut its side after its request (HTTP/1.0 style) still gets the whole answer. */
static void conn_event_cb(struct bufferevent *bev, short events, void *arg) {
    mconn *c = arg;
    bool writing = c->answered && !c->shut && evbuffer_get_length(bufferevent_get_output(bev)) > 0;
    if ((events & BEV_EVENT_EOF) && !(events & BEV_EVENT_ERROR) && writing) {
        c->peer_done = true;
        bufferevent_disable(bev, EV_READ);
        return;
    }
    if (events & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_close(c);
}

static void conn_deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    mconn *c = arg;
    if (!c->answered) {
        c->m->stats.timed_out++;
        ST_LOG_LIMITED(ST_LOG_INFO, "metrics",
                       "msg=\"closing a metrics connection: no complete request within its "
                       "deadline\" deadline_ms=%u",
                       c->m->request_ms);
    }
    conn_close(c);
}

static void conn_open(metrics_http *m, int fd) {
    mconn *c = calloc(1, sizeof *c);
    if (c) {
        c->m = m;
        c->bev = bufferevent_socket_new(m->base, fd, BEV_OPT_CLOSE_ON_FREE);
        c->timer = evtimer_new(m->base, conn_deadline_cb, c);
    }
    if (!c || !c->bev || !c->timer) {
        if (c && c->bev)
            bufferevent_free(c->bev);
        else
            close(fd);
        if (c && c->timer)
            event_free(c->timer);
        free(c);
        return;
    }
    c->opened_us = st_mono_us();
    c->prev = m->tail;
    if (m->tail)
        m->tail->next = c;
    else
        m->head = c;
    m->tail = c;
    m->stats.open++;
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    /* Reading stops past the largest head, so a peer cannot make the input grow further. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, METRICS_HTTP_HEADERS_BYTES_MAX + 1);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    conn_arm(c, m->request_ms);
}

/* ---- accepting ---- */

/* At the cap: the oldest connection done with (its answer written, waiting for the peer to
 * close), or still without a complete request evict_grace_ms after its accept, makes room.
 * False when there is none: every connection is being answered or is too young to judge (its
 * request may simply not have been read yet). */
static bool evict_oldest(metrics_http *m) {
    int64_t young = st_mono_us() - (int64_t)m->evict_grace_ms * 1000;
    for (mconn *c = m->head; c; c = c->next) {
        if (c->answered ? !c->shut : c->opened_us > young)
            continue;
        m->stats.evicted++;
        ST_LOG_LIMITED(ST_LOG_INFO, "metrics",
                       "msg=\"metrics listener at its connection cap: closing the oldest "
                       "connection without a complete request (or already answered)\" max=%u "
                       "grace_ms=%u",
                       m->conns_max, m->evict_grace_ms);
        conn_close(c);
        return true;
    }
    return false;
}

/* No connection could make room: a 503 written straight to the new socket, then closed. */
static void refuse(metrics_http *m, int fd) {
    static const char r[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                            "Retry-After: 1\r\nConnection: close\r\n\r\n";
    m->stats.refused++;
    ssize_t w = send(fd, r, sizeof r - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* best effort: the close says it too */
    shutdown(fd, SHUT_WR);
    char sink[512]; /* unread input would turn the close into a reset that loses the 503 */
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
        ;
    close(fd);
    ST_LOG_LIMITED(ST_LOG_WARN, "metrics",
                   "msg=\"refusing a metrics connection: at the connection cap\" max=%u",
                   m->conns_max);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr,
                      int addrlen, void *arg) {
    (void)l;
    (void)addr;
    (void)addrlen;
    metrics_http *m = arg;
    m->backoff_ms = 0;
    m->stats.accepted++;
    if (m->stats.open >= m->conns_max && !evict_oldest(m)) {
        refuse(m, fd);
        return;
    }
    conn_open(m, fd);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    metrics_http *m = arg;
    evconnlistener_enable(m->listener);
}

/* accept() failed. Out of descriptors or memory the pending connection stays queued and the
 * socket stays readable: accepting again at once would spin. The listener pauses for a backoff
 * that doubles while failures go on (reset by the next accepted connection). */
static void accept_error_cb(struct evconnlistener *l, void *arg) {
    metrics_http *m = arg;
    int e = EVUTIL_SOCKET_ERROR();
    m->stats.accept_errors++;
    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM) {
        ST_LOG_LIMITED(ST_LOG_WARN, "metrics", "msg=\"metrics accept failed\" err=\"%s\"",
                       strerror(e));
        return;
    }
    m->backoff_ms = m->backoff_ms == 0                           ? ACCEPT_BACKOFF_MS_MIN
                    : m->backoff_ms >= ACCEPT_BACKOFF_MS_MAX / 2 ? ACCEPT_BACKOFF_MS_MAX
                                                                 : m->backoff_ms * 2;
    ST_LOG_LIMITED(ST_LOG_WARN, "metrics",
                   "msg=\"metrics listener cannot accept: %s; pausing accepts\" pause_ms=%u",
                   strerror(e), m->backoff_ms);
    struct timeval tv = {m->backoff_ms / 1000, (suseconds_t)(m->backoff_ms % 1000) * 1000};
    evconnlistener_disable(l);
    if (event_add(m->resume_ev, &tv) != 0)
        evconnlistener_enable(l); /* cannot pause: better to spin than to stop serving */
}

/* ---- the listener ---- */

/* METRICS_HTTP_CONNECTIONS_MAX, or 1/16 of the process's descriptors when that is fewer (at
 * least METRICS_HTTP_CONNECTIONS_MIN). */
static uint32_t conns_max_auto(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur / 16 >= METRICS_HTTP_CONNECTIONS_MAX)
        return METRICS_HTTP_CONNECTIONS_MAX;
    return rl.rlim_cur / 16 > METRICS_HTTP_CONNECTIONS_MIN ? (uint32_t)(rl.rlim_cur / 16)
                                                           : METRICS_HTTP_CONNECTIONS_MIN;
}

static struct evconnlistener *listen_on(metrics_http *m, const char *host, uint16_t port, int *e) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    *e = EADDRNOTAVAIL;
    if (getaddrinfo(host, portstr, &hints, &res) != 0)
        return NULL;
    struct evconnlistener *l = NULL;
    for (struct addrinfo *ai = res; ai && !l; ai = ai->ai_next) {
        l = evconnlistener_new_bind(m->base, accept_cb, m,
                                    LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE |
                                        LEV_OPT_CLOSE_ON_EXEC,
                                    128, ai->ai_addr, (int)ai->ai_addrlen);
        if (!l)
            *e = errno;
    }
    freeaddrinfo(res);
    return l;
}

static uint16_t bound_port_of(struct evconnlistener *l) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

metrics_http *metrics_http_start(struct event_base *base, const char *host, uint16_t port,
                                 metrics_render_fn render, void *arg, uint16_t *bound_port,
                                 st_err *err) {
    metrics_http *m = calloc(1, sizeof *m);
    if (!m || !(m->resume_ev = evtimer_new(base, accept_resume_cb, m))) {
        free(m);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting the metrics listener");
        return NULL;
    }
    m->base = base;
    m->render = render;
    m->arg = arg;
    m->conns_max = conns_max_auto();
    m->request_ms = METRICS_HTTP_REQUEST_MS;
    m->evict_grace_ms = METRICS_HTTP_EVICT_GRACE_MS;
    const char *h = host && host[0] ? host : "0.0.0.0";
    int e;
    if (!(m->listener = listen_on(m, h, port, &e))) {
        st_err_set(err, ST_UNAVAILABLE,
                   "cannot serve metrics on %s:%u: %s; is the port in use? (choose another "
                   "with --metrics HOST:PORT, 0 for any free port)",
                   h, port, strerror(e));
        metrics_http_free(m);
        return NULL;
    }
    evconnlistener_set_error_cb(m->listener, accept_error_cb);
    if (bound_port)
        *bound_port = bound_port_of(m->listener);
    return m;
}

void metrics_http_set_limits(metrics_http *m, uint32_t conns_max, uint32_t request_ms) {
    if (conns_max)
        m->conns_max = conns_max;
    if (request_ms)
        m->request_ms = request_ms;
}

void metrics_http_set_evict_grace(metrics_http *m, uint32_t grace_ms) {
    m->evict_grace_ms = grace_ms;
}

void metrics_http_stats_get(const metrics_http *m, metrics_http_stats *out) {
    *out = m->stats;
}

void metrics_http_free(metrics_http *m) {
    if (!m)
        return;
    while (m->head)
        conn_close(m->head);
    if (m->listener)
        evconnlistener_free(m->listener);
    if (m->resume_ev)
        event_free(m->resume_ev);
    free(m);
}
