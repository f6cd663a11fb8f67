/* metrics_http.c — GET /metrics over HTTP/1.1 with libevent's evhttp, on the process's own
 * event_base (strata/metrics.h). Pages are rendered on demand by the owner's callback. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "strata/metrics.h"

struct metrics_http {
    struct evhttp *http;
    metrics_render_fn render;
    void *arg;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text) {
    struct evbuffer *body = evbuffer_new();
    if (body)
        evbuffer_add(body, text, strlen(text));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; charset=utf-8");
    evhttp_send_reply(req, code, reason, body);
    if (body)
        evbuffer_free(body);
}

/* True when the request's path (query ignored) is exactly /metrics. */
static bool path_is_metrics(struct evhttp_request *req) {
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    return path && strcmp(path, "/metrics") == 0;
}

static void on_request(struct evhttp_request *req, void *arg) {
    metrics_http *m = arg;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        reply_text(req, 405, "Method Not Allowed", "only GET /metrics is served here\n");
        return;
    }
    if (!path_is_metrics(req)) {
        reply_text(req, HTTP_NOTFOUND, "Not Found", "not found: metrics are at /metrics\n");
        return;
    }
    st_buf page;
    st_buf_init(&page);
    prom_out o;
    prom_out_init(&o, &page);
    m->render(&o, m->arg);
    struct evbuffer *body = o.rc == ST_OK ? evbuffer_new() : NULL;
    if (!body || evbuffer_add(body, page.data, page.len) != 0) {
        st_buf_free(&page);
        if (body)
            evbuffer_free(body);
        st_log(ST_LOG_WARN, "metrics", "msg=\"metrics page not rendered\" code=%s",
               st_code_name(o.rc != ST_OK ? o.rc : ST_RESOURCE_EXHAUSTED));
        reply_text(req, HTTP_INTERNAL, "Internal Server Error",
                   "the metrics page could not be built (out of memory or over its size limit)\n");
        return;
    }
    st_buf_free(&page);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", PROM_CONTENT_TYPE);
    evhttp_send_reply(req, HTTP_OK, "OK", body);
    evbuffer_free(body);
}

static uint16_t bound_port_of(struct evhttp_bound_socket *bs) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

metrics_http *metrics_http_start(struct event_base *base, const char *host, uint16_t port,
                                 metrics_render_fn render, void *arg, uint16_t *bound_port,
                                 st_err *err) {
    metrics_http *m = calloc(1, sizeof *m);
    if (!m || !(m->http = evhttp_new(base))) {
        free(m);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting the metrics listener");
        return NULL;
    }
    m->render = render;
    m->arg = arg;
    evhttp_set_timeout(m->http, METRICS_HTTP_TIMEOUT_S);
    evhttp_set_max_headers_size(m->http, METRICS_HTTP_HEADERS_BYTES_MAX);
    evhttp_set_max_body_size(m->http, 0); /* scrapes carry no body */
    evhttp_set_gencb(m->http, on_request, m);
    const char *h = host && host[0] ? host : "0.0.0.0";
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(m->http, h, port);
    if (!bs) {
        st_err_set(err, ST_UNAVAILABLE,
                   "cannot serve metrics on %s:%u: %s; is the port in use? (choose another "
                   "with --metrics HOST:PORT, 0 for any free port)",
                   h, port, strerror(errno));
        metrics_http_free(m);
        return NULL;
    }
    if (bound_port)
        *bound_port = bound_port_of(bs);
    return m;
}

void metrics_http_free(metrics_http *m) {
    if (!m)
        return;
    if (m->http)
        evhttp_free(m->http);
    free(m);
}
