/* metrics_test proves the Prometheus rendering of strata/metrics.h: label values and HELP text
 * are escaped as the text format requires, histogram buckets come out cumulative and end with
 * le="+Inf" equal to _count, the RPC server's per-method records land in the right code and
 * latency bucket (bounds inclusive), and, end to end, a real rpc_server on a loopback port
 * counts OK, failed and unknown-method calls, which a GET /metrics on the same event_base then
 * serves (404 for other paths, 405 for other methods). The listener is bounded: at its
 * connection cap the oldest connection still sending its request is closed for a new one, a
 * request trickling in is closed at its deadline whatever arrives, and out of descriptors (a
 * forked child with a low RLIMIT_NOFILE) it pauses accepting instead of spinning and serves
 * again as its deadlines free descriptors. No timing assertions: waits poll with generous
 * bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "rpc_metrics.h"
#include "strata/metrics.h"
#include "strata/rpc.h"

/* The page as a NUL-terminated string (tests only). */
static char *page_str(st_buf *b) {
    st_buf_append_byte(b, 0);
    return (char *)b->data;
}

static void test_metrics_escape_label(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    prom_out o;
    prom_out_init(&o, &b);
    prom_label l[] = {{"table", "a\"b\\c\nd"}, {"plain", "x"}};
    prom_sample_u64(&o, "m_total", l, 2, 7);
    prom_family(&o, "h", "gauge", "back\\slash\nnew \"quote\"");
    prom_sample_u64(&o, "bare", NULL, 0, 3);
    prom_sample_f64(&o, "f", NULL, 0, 0.25);
    assert_int_equal(o.rc, ST_OK);
    const char *want = "m_total{table=\"a\\\"b\\\\c\\nd\",plain=\"x\"} 7\n"
                       "# HELP h back\\\\slash\\nnew \"quote\"\n"
                       "# TYPE h gauge\n"
                       "bare 3\n"
                       "f 0.25\n";
    assert_string_equal(page_str(&b), want);
    st_buf_free(&b);
}

static void test_metrics_histogram_cumulative(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    prom_out o;
    prom_out_init(&o, &b);
    const double bounds[] = {0.001, 0.5, 2};
    const uint64_t counts[] = {1, 0, 2, 3}; /* per bucket; the last is above 2 */
    prom_label l[] = {{"method", "M"}};
    prom_histogram(&o, "lat_seconds", l, 1, bounds, counts, 3, 12.5);
    prom_histogram(&o, "nolabels", NULL, 0, bounds, counts, 3, 1);
    assert_int_equal(o.rc, ST_OK);
    const char *want = "lat_seconds_bucket{method=\"M\",le=\"0.001\"} 1\n"
                       "lat_seconds_bucket{method=\"M\",le=\"0.5\"} 1\n"
                       "lat_seconds_bucket{method=\"M\",le=\"2\"} 3\n"
                       "lat_seconds_bucket{method=\"M\",le=\"+Inf\"} 6\n"
                       "lat_seconds_sum{method=\"M\"} 12.5\n"
                       "lat_seconds_count{method=\"M\"} 6\n"
                       "nolabels_bucket{le=\"0.001\"} 1\n"
                       "nolabels_bucket{le=\"0.5\"} 1\n"
                       "nolabels_bucket{le=\"2\"} 3\n"
                       "nolabels_bucket{le=\"+Inf\"} 6\n"
                       "nolabels_sum 1\n"
                       "nolabels_count 6\n";
    assert_string_equal(page_str(&b), want);
    st_buf_free(&b);
}

/* Value of the first line starting with prefix (-1 if none). */
static long long line_value(const char *page, const char *prefix) {
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            const char *sp = strchr(p + strlen(prefix), ' ');
            return sp ? atoll(sp + 1) : -1;
        }
    return -1;
}

/* Every _bucket line of the method: non-decreasing, the last (+Inf) equal to want_count. */
static void check_buckets(const char *page, const char *method, long long want_count) {
    char prefix[160];
    snprintf(prefix, sizeof prefix,
             "strata_rpc_server_handling_seconds_bucket{service=\"t.T\",method=\"%s\",le=", method);
    long long prev = 0, seen = 0, last = -1;
    for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, prefix, strlen(prefix)) != 0)
            continue;
        long long v = atoll(strchr(p, '}') + 2);
        assert_true(v >= prev);
        prev = last = v;
        seen++;
    }
    assert_int_equal(seen, RPC_LATENCY_BUCKETS + 1);
    assert_int_equal(last, want_count);
}

static void test_metrics_rpc_record_buckets(void **state) {
    (void)state;
    rpc_metrics m;
    rpc_metrics_init(&m);
    assert_int_equal(rpc_metrics_add(&m, "/t.T/A"), ST_OK);
    assert_int_equal(rpc_metrics_add(&m, "/t.T/B"), ST_OK);
    rpc_metrics_record(&m, 0, ST_OK, 100);             /* on the first bound: le="0.0001" */
    rpc_metrics_record(&m, 0, ST_OK, 101);             /* just above: le="0.00025" */
    rpc_metrics_record(&m, 0, ST_NOT_FOUND, 70000000); /* above 60 s: +Inf only */
    rpc_metrics_record(&m, 0, (st_code)99, -5);        /* out-of-range code: UNKNOWN; clamp to 0 */
    rpc_metrics_record(&m, SIZE_MAX, ST_UNIMPLEMENTED, 10);
    st_buf b;
    st_buf_init(&b);
    prom_out o;
    prom_out_init(&o, &b);
    rpc_metrics_render(&m, &o);
    assert_int_equal(o.rc, ST_OK);
    const char *page = page_str(&b);
    assert_int_equal(
        line_value(page,
                   "strata_rpc_server_handled_total{service=\"t.T\",method=\"A\",code=\"OK\"}"),
        2);
    assert_int_equal(line_value(page, "strata_rpc_server_handled_total{service=\"t.T\","
                                      "method=\"A\",code=\"NOT_FOUND\"}"),
                     1);
    assert_int_equal(line_value(page, "strata_rpc_server_handled_total{service=\"t.T\","
                                      "method=\"A\",code=\"UNKNOWN\"}"),
                     1);
    /* B was never called: its OK series exists (0), its histogram does not. */
    assert_int_equal(
        line_value(page,
                   "strata_rpc_server_handled_total{service=\"t.T\",method=\"B\",code=\"OK\"}"),
        0);
    assert_null(strstr(page, "method=\"B\",le="));
    assert_int_equal(line_value(page, "strata_rpc_server_handled_total{service=\"unknown\","
                                      "method=\"unknown\",code=\"UNIMPLEMENTED\"}"),
                     1);
    const char *hb = "strata_rpc_server_handling_seconds_bucket{service=\"t.T\",method=\"A\",";
    char key[200];
    snprintf(key, sizeof key, "%sle=\"0.0001\"}", hb);
    assert_int_equal(line_value(page, key), 2); /* 100 us and the clamped -5 */
    snprintf(key, sizeof key, "%sle=\"0.00025\"}", hb);
    assert_int_equal(line_value(page, key), 3);
    snprintf(key, sizeof key, "%sle=\"60\"}", hb);
    assert_int_equal(line_value(page, key), 3);
    snprintf(key, sizeof key, "%sle=\"+Inf\"}", hb);
    assert_int_equal(line_value(page, key), 4);
    check_buckets(page, "A", 4);
    assert_int_equal(line_value(page, "strata_rpc_server_handling_seconds_count{service=\"t.T\","
                                      "method=\"A\"}"),
                     4);
    assert_non_null(strstr(page, "# TYPE strata_rpc_server_handling_seconds histogram\n"));
    st_buf_free(&b);
    rpc_metrics_deinit(&m);
}

/* ---- end to end: rpc_server + GET /metrics on one event_base ---- */

static void h_ok(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    rpc_call_finish(call, rpc_call_send(call, req), NULL);
}

static void h_not_found(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    rpc_call_finish(call, ST_NOT_FOUND, "no such \"thing\"");
}

typedef struct e2e {
    struct event_base *base;
    rpc_server *srv;
    metrics_http *http;
    pthread_t th;
} e2e;

static void render_page(prom_out *o, void *arg) {
    e2e *e = arg;
    rpc_server_metrics_render(e->srv, o);
    prom_process(o);
}

static void *loop_thread(void *arg) {
    event_base_dispatch(((e2e *)arg)->base);
    return NULL;
}

static void loop_stop(void *arg) {
    event_base_loopbreak(arg);
}

/* A whole HTTP/1.0 exchange on a blocking socket; the response into out. */
static void http_get(uint16_t port, const char *request, st_buf *out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    size_t len = strlen(request);
    assert_int_equal(send(fd, request, len, MSG_NOSIGNAL), (ssize_t)len);
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        st_buf_append(out, buf, (size_t)n);
    close(fd);
    st_buf_append_byte(out, 0);
}

static void test_metrics_http_end_to_end(void **state) {
    (void)state;
    e2e e = {0};
    st_err err = {0};
    e.base = event_base_new();
    assert_non_null(e.base);
    e.srv = rpc_server_new(e.base, NULL, &err);
    assert_non_null(e.srv);
    assert_int_equal(rpc_server_add_method(e.srv, "/t.T/Ok", h_ok, NULL), ST_OK);
    assert_int_equal(rpc_server_add_method(e.srv, "/t.T/NotFound", h_not_found, NULL), ST_OK);
    uint16_t port = 0, mport = 0;
    assert_int_equal(rpc_server_listen(e.srv, "127.0.0.1", 0, &port, &err), ST_OK);
    e.http = metrics_http_start(e.base, "127.0.0.1", 0, render_page, &e, &mport, &err);
    assert_non_null(e.http);
    assert_true(mport != 0);
    assert_int_equal(pthread_create(&e.th, NULL, loop_thread, &e), 0);

    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    st_buf resp;
    st_buf_init(&resp);
    for (int i = 0; i < 3; i++) {
        st_buf_reset(&resp);
        assert_int_equal(rpc_blocking_unary(addr, NULL, "/t.T/Ok", st_slice_cstr("x"), NULL, 0,
                                            10000, &resp, NULL),
                         ST_OK);
    }
    assert_int_equal(rpc_blocking_unary(addr, NULL, "/t.T/NotFound", st_slice_cstr("x"), NULL, 0,
                                        10000, &resp, NULL),
                     ST_NOT_FOUND);
    assert_int_equal(rpc_blocking_unary(addr, NULL, "/t.T/Nope", st_slice_cstr("x"), NULL, 0, 10000,
                                        &resp, NULL),
                     ST_UNIMPLEMENTED);
    st_buf_free(&resp);

    st_buf page;
    st_buf_init(&page);
    http_get(mport, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n", &page);
    const char *p = (const char *)page.data;
    assert_non_null(strstr(p, "HTTP/1.0 200"));
    assert_non_null(strstr(p, "Content-Type: text/plain; version=0.0.4"));
    const char *body = strstr(p, "\r\n\r\n");
    assert_non_null(body);
    assert_int_equal(line_value(body + 4, "strata_rpc_server_handled_total{service=\"t.T\","
                                          "method=\"Ok\",code=\"OK\"}"),
                     3);
    assert_int_equal(line_value(body + 4, "strata_rpc_server_handled_total{service=\"t.T\","
                                          "method=\"NotFound\",code=\"NOT_FOUND\"}"),
                     1);
    assert_int_equal(line_value(body + 4, "strata_rpc_server_handled_total{service=\"unknown\","
                                          "method=\"unknown\",code=\"UNIMPLEMENTED\"}"),
                     1);
    check_buckets(body + 4, "Ok", 3);
    assert_true(line_value(body + 4, "strata_rpc_server_connections_accepted_total") >= 5);
    assert_non_null(strstr(body, "\nprocess_resident_memory_bytes "));
    assert_non_null(strstr(body, "\nprocess_cpu_seconds_total "));

    st_buf_reset(&page);
    http_get(mport, "GET /other HTTP/1.0\r\n\r\n", &page);
    assert_non_null(strstr((const char *)page.data, "HTTP/1.0 404"));
    st_buf_reset(&page);
    http_get(mport, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", &page);
    assert_non_null(strstr((const char *)page.data, "HTTP/1.0 405"));
    st_buf_reset(&page);
    http_get(mport, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", &page);
    assert_non_null(strstr((const char *)page.data, "HTTP/1.0 200"));
    st_buf_free(&page);

    assert_int_equal(rpc_server_post(e.srv, loop_stop, e.base), ST_OK);
    pthread_join(e.th, NULL);
    metrics_http_free(e.http);
    rpc_server_free(e.srv);
    event_base_loop(e.base, EVLOOP_NONBLOCK);
    event_base_free(e.base);
}

static void test_metrics_http_port_in_use(void **state) {
    (void)state;
    struct event_base *base = event_base_new();
    uint16_t port = 0;
    st_err err = {0};
    metrics_http *a = metrics_http_start(base, "127.0.0.1", 0, NULL, NULL, &port, &err);
    assert_non_null(a);
    metrics_http *b = metrics_http_start(base, "127.0.0.1", port, NULL, NULL, NULL, &err);
    assert_null(b);
    assert_int_equal(err.code, ST_UNAVAILABLE);
    metrics_http_free(a);
    event_base_free(base);
}

/* ---- the listener's bounds ---- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A blocking loopback connection with a 30 s receive timeout (a hang fails the test). */
static int tcp_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A slowloris: a request whose headers never end. */
static int trickler(uint16_t port) {
    static const char start[] = "GET /metrics HTTP/1.1\r\nX: ";
    int fd = tcp_connect(port);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, start, sizeof start - 1, MSG_NOSIGNAL), (ssize_t)sizeof start - 1);
    return fd;
}

/* The server closed fd (EOF or reset; not the receive timeout). */
static bool closed_by_server(int fd, int flags) {
    char buf[512];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, flags)) > 0)
        ;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

static void render_small(prom_out *o, void *arg) {
    (void)arg;
    prom_printf(o, "up 1\n");
}

typedef struct bounded {
    e2e e;
    uint16_t port;
} bounded;

/* A listener whose loop is not running yet (bounded_run starts it). */
static void bounded_make(bounded *b, uint32_t conns_max, uint32_t request_ms) {
    st_err err = {0};
    b->e.base = event_base_new();
    b->e.srv = rpc_server_new(b->e.base, NULL, &err); /* only to stop the loop (rpc_server_post) */
    assert_non_null(b->e.srv);
    b->e.http = metrics_http_start(b->e.base, "127.0.0.1", 0, render_small, NULL, &b->port, &err);
    assert_non_null(b->e.http);
    metrics_http_set_limits(b->e.http, conns_max, request_ms);
}

static void bounded_run(bounded *b) {
    assert_int_equal(pthread_create(&b->e.th, NULL, loop_thread, &b->e), 0);
}

static void bounded_start(bounded *b, uint32_t conns_max, uint32_t request_ms) {
    bounded_make(b, conns_max, request_ms);
    bounded_run(b);
}

/* Stops the loop (so the listener's stats may be read here) and returns them. */
static metrics_http_stats bounded_stop(bounded *b) {
    assert_int_equal(rpc_server_post(b->e.srv, loop_stop, b->e.base), ST_OK);
    pthread_join(b->e.th, NULL);
    metrics_http_stats st;
    metrics_http_stats_get(b->e.http, &st);
    metrics_http_free(b->e.http);
    rpc_server_free(b->e.srv);
    event_base_loop(b->e.base, EVLOOP_NONBLOCK);
    event_base_free(b->e.base);
    return st;
}

/* Ten slowloris connections against a cap of 4 (no grace: any connection without a complete
 * request may be closed): each new one closes the oldest still sending its request, so the first
 * six are closed and the last four held; a scrape then closes the oldest of those and is
 * answered. Before, every connection was kept (as long as bytes kept coming, and here until the
 * 10 s inactivity timeout closed them all). */
static void test_metrics_http_connection_cap(void **state) {
    (void)state;
    bounded b = {0};
    bounded_make(&b, 4, 600000);
    metrics_http_set_evict_grace(b.e.http, 0);
    bounded_run(&b);
    enum { N = 10 };
    int fd[N];
    for (int i = 0; i < N; i++)
        fd[i] = trickler(b.port);
    st_buf page;
    st_buf_init(&page);
    http_get(b.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &page);
    assert_non_null(strstr((const char *)page.data, "HTTP/1.1 200"));
    assert_non_null(strstr((const char *)page.data, "up 1"));
    st_buf_free(&page);
    for (int i = 0; i < N - 3; i++)
        assert_true(closed_by_server(fd[i], 0));
    for (int i = N - 3; i < N; i++)
        assert_false(closed_by_server(fd[i], MSG_DONTWAIT));
    metrics_http_stats st = bounded_stop(&b);
    print_message("accepted=%llu open=%llu evicted=%llu refused=%llu\n",
                  (unsigned long long)st.accepted, (unsigned long long)st.open,
                  (unsigned long long)st.evicted, (unsigned long long)st.refused);
    assert_int_equal(st.accepted, N + 1);
    assert_int_equal(st.evicted, N - 3);
    assert_int_equal(st.refused, 0);
    for (int i = 0; i < N; i++)
        close(fd[i]);
}

/* A request trickling in, a byte every 20 ms (each resetting an inactivity timeout), is closed
 * at its absolute deadline; a scrape is answered afterwards. */
static void test_metrics_http_request_deadline(void **state) {
    (void)state;
    bounded b = {0};
    bounded_start(&b, 0, 300);
    int fd = trickler(b.port);
    bool closed = false;
    for (int i = 0; i < 1500 && !closed; i++) { /* up to 30 s */
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1)
            break; /* closed: the reset says so */
        sleep_ms(20);
        closed = closed_by_server(fd, MSG_DONTWAIT);
    }
    assert_true(closed || closed_by_server(fd, 0));
    close(fd);
    st_buf page;
    st_buf_init(&page);
    http_get(b.port, "HEAD /metrics HTTP/1.0\r\n\r\n", &page);
    assert_non_null(strstr((const char *)page.data, "HTTP/1.0 200"));
    assert_null(strstr((const char *)page.data, "up 1")); /* HEAD: no body */
    st_buf_free(&page);
    metrics_http_stats st = bounded_stop(&b);
    assert_int_equal(st.timed_out, 1);
}

/* A burst of complete scrapes over the cap, all accepted before any request is read (they
 * wait in the backlog until the loop starts): each gets 200 or 503, none a silent close. The
 * connections are younger than the eviction grace, so the ones past the cap are refused rather
 * than closing older ones whose requests simply had not been read. Before, each accept past the
 * cap closed the oldest connection unanswered. */
static void test_metrics_http_burst_answered(void **state) {
    (void)state;
    enum { CAP = 4, N = 10 };
    static const char get[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    bounded b = {0};
    bounded_make(&b, CAP, 600000);
    int fd[N];
    for (int i = 0; i < N; i++) {
        fd[i] = tcp_connect(b.port); /* completes in the kernel's backlog */
        assert_true(fd[i] >= 0);
        assert_int_equal(send(fd[i], get, sizeof get - 1, MSG_NOSIGNAL), (ssize_t)sizeof get - 1);
    }
    bounded_run(&b);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        st_buf in;
        st_buf_init(&in);
        char buf[4096];
        ssize_t n;
        while ((n = recv(fd[i], buf, sizeof buf, 0)) > 0)
            st_buf_append(&in, buf, (size_t)n);
        st_buf_append_byte(&in, 0);
        const char *p = (const char *)in.data;
        print_message("scrape %d: %.24s\n", i, p);
        if (strncmp(p, "HTTP/1.1 200", 12) == 0)
            ok++;
        else if (strncmp(p, "HTTP/1.1 503", 12) == 0 && strstr(p, "Retry-After: 1\r\n"))
            busy++;
        st_buf_free(&in);
        close(fd[i]);
    }
    metrics_http_stats st = bounded_stop(&b);
    assert_int_equal(ok + busy, N);
    assert_int_equal(ok, CAP);
    assert_int_equal(st.refused, N - CAP);
    assert_int_equal(st.evicted, 0);
}

/* Only /metrics is the page: a "://" in the path or the query does not make a target absolute;
 * only one starting with http:// or https:// is. */
static void test_metrics_http_target(void **state) {
    (void)state;
    static const struct {
        const char *target;
        const char *want;
    } cases[] = {
        {"/metrics", "HTTP/1.0 200"},
        {"/metrics?x=1", "HTTP/1.0 200"},
        {"/metrics#a", "HTTP/1.0 200"},
        {"http://h:1/metrics", "HTTP/1.0 200"},
        {"HTTPS://h/metrics?u=1", "HTTP/1.0 200"},
        {"/foo?u=http://x/metrics", "HTTP/1.0 404"},
        {"/a:///metrics", "HTTP/1.0 404"},
        {"x://h/metrics", "HTTP/1.0 404"},
        {"http://h?u=/metrics", "HTTP/1.0 404"},
        {"http://h", "HTTP/1.0 404"},
        {"//metrics", "HTTP/1.0 404"},
        {"/metrics/", "HTTP/1.0 404"},
    };
    bounded b = {0};
    bounded_start(&b, 0, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", cases[i].target);
        st_buf page;
        st_buf_init(&page);
        http_get(b.port, req, &page);
        print_message("%s -> %.12s\n", cases[i].target, (const char *)page.data);
        assert_int_equal(strncmp((const char *)page.data, cases[i].want, 12), 0);
        st_buf_free(&page);
    }
    bounded_stop(&b);
}

/* ---- out of descriptors, in a forked child ---- */

static metrics_http *child_http; /* the child's listener, read by its page (child only) */

static void render_stats(prom_out *o, void *arg) {
    (void)arg;
    metrics_http_stats st;
    metrics_http_stats_get(child_http, &st);
    prom_printf(o, "accept_errors %llu\n", (unsigned long long)st.accept_errors);
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 64;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The child: a metrics listener whose cap (64) is above the descriptors it may open (12 more
 * than it starts with), requests due within 300 ms. Writes its port to wfd, serves until killed. */
static void fd_child(int wfd) {
    struct event_base *base = event_base_new();
    uint16_t port = 0;
    st_err err = {0};
    child_http =
        base ? metrics_http_start(base, "127.0.0.1", 0, render_stats, NULL, &port, &err) : NULL;
    if (!child_http)
        _exit(3);
    metrics_http_set_limits(child_http, 64, 300);
    struct rlimit rl = {(rlim_t)open_fds() + 12, (rlim_t)open_fds() + 12};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        _exit(4);
    if (write(wfd, &port, sizeof port) != sizeof port)
        _exit(5);
    close(wfd);
    event_base_dispatch(base);
    _exit(0);
}

static long child_cpu_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
        return -1;
    return ut + st;
}

#define FD_FLOOD 40

typedef struct fd_result {
    bool flood_ok;    /* every slowloris connection was made */
    bool scraped;     /* a scrape was answered 200 while they kept trickling */
    long long errors; /* accept errors the page reported */
    long cpu;         /* child CPU ticks over the first second of the flood */
} fd_result;

/* Trickles a byte into every open fd[i] (closed ones are left at -1). */
static void trickle_all(int *fd, int n) {
    for (int i = 0; i < n; i++)
        if (fd[i] >= 0 && send(fd[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
            close(fd[i]);
            fd[i] = -1;
        }
}

/* The parent's side: no assertions here, so the child is always killed before they run. */
static void fd_drive(pid_t pid, uint16_t port, fd_result *r) {
    int fd[FD_FLOOD];
    r->flood_ok = true;
    for (int i = 0; i < FD_FLOOD; i++) {
        static const char start[] = "GET /metrics HTTP/1.1\r\nX: ";
        fd[i] = tcp_connect(port); /* completes in the kernel's backlog */
        r->flood_ok =
            r->flood_ok && fd[i] >= 0 && send(fd[i], start, sizeof start - 1, MSG_NOSIGNAL) > 0;
    }
    long cpu0 = child_cpu_ticks(pid);
    for (int i = 0; i < 10; i++) {
        trickle_all(fd, FD_FLOOD);
        sleep_ms(100);
    }
    r->cpu = child_cpu_ticks(pid) - cpu0;
    /* A scrape behind them in the backlog, while they go on trickling (up to 60 s). */
    static const char get[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    int s = tcp_connect(port);
    st_buf page;
    st_buf_init(&page);
    if (s >= 0 && send(s, get, sizeof get - 1, MSG_NOSIGNAL) == (ssize_t)sizeof get - 1) {
        char buf[4096];
        ssize_t n = -1;
        for (int i = 0; i < 600 && n != 0; i++) {
            trickle_all(fd, FD_FLOOD);
            while ((n = recv(s, buf, sizeof buf, MSG_DONTWAIT)) > 0)
                st_buf_append(&page, buf, (size_t)n);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                break;
            if (n != 0)
                sleep_ms(100);
        }
    }
    st_buf_append_byte(&page, 0);
    const char *p = (const char *)page.data;
    const char *e = strstr(p, "accept_errors ");
    r->scraped = strstr(p, "HTTP/1.1 200") != NULL && e;
    r->errors = e ? atoll(e + 14) : -1;
    st_buf_free(&page);
    if (s >= 0)
        close(s);
    for (int i = 0; i < FD_FLOOD; i++)
        if (fd[i] >= 0)
            close(fd[i]);
}

/* Slowloris connections past the process's descriptors: the listener pauses accepting (a few
 * failed accepts, not a spin), their deadlines free the descriptors, and a scrape queued behind
 * them is answered while they still trickle. Before, the connections held every descriptor for
 * as long as they trickled and accept() failed in a loop (60-100 % of a core). */
static void test_metrics_http_out_of_descriptors(void **state) {
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        fd_child(p[1]);
    }
    close(p[1]);
    uint16_t port = 0;
    bool started = read(p[0], &port, sizeof port) == (ssize_t)sizeof port;
    close(p[0]);
    fd_result r = {0};
    if (started)
        fd_drive(pid, port, &r);
    kill(pid, SIGKILL);
    int ws;
    waitpid(pid, &ws, 0);
    print_message("%d slowloris connections on 12 descriptors: accept errors=%lld child cpu=%ld "
                  "ticks in 1 s\n",
                  FD_FLOOD, r.errors, r.cpu);
    assert_true(started);
    assert_true(r.flood_ok);
    assert_true(r.scraped);
    assert_true(r.errors >= 1);  /* it did run out */
    assert_true(r.errors <= 50); /* paused: a spinning accept fails ~10^5 times a second */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_escape_label),
        cmocka_unit_test(test_metrics_histogram_cumulative),
        cmocka_unit_test(test_metrics_rpc_record_buckets),
        cmocka_unit_test(test_metrics_http_end_to_end),
        cmocka_unit_test(test_metrics_http_port_in_use),
        cmocka_unit_test(test_metrics_http_connection_cap),
        cmocka_unit_test(test_metrics_http_request_deadline),
        cmocka_unit_test(test_metrics_http_burst_answered),
        cmocka_unit_test(test_metrics_http_target),
        cmocka_unit_test(test_metrics_http_out_of_descriptors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
