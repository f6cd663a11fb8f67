/* metrics_test proves the Prometheus rendering of strata/metrics.h: label values and HELP text
 * are escaped as the text format requires, histogram buckets come out cumulative and end with
 * le="+Inf" equal to _count, the RPC server's per-method records land in the right code and
 * latency bucket (bounds inclusive), and, end to end, a real rpc_server on a loopback port
 * counts OK, failed and unknown-method calls, which a GET /metrics on the same event_base then
 * serves (404 for other paths, 405 for other methods). No timing assertions. */
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
#include <pthread.h>
#include <sys/socket.h>
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_escape_label),
        cmocka_unit_test(test_metrics_histogram_cumulative),
        cmocka_unit_test(test_metrics_rpc_record_buckets),
        cmocka_unit_test(test_metrics_http_end_to_end),
        cmocka_unit_test(test_metrics_http_port_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
