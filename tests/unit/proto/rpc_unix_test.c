/* rpc_unix_test proves gRPC over Unix-domain sockets (rpc_server_listen_unix,
 * rpc_client_new_unix, "unix:PATH" in the blocking helpers), the link strata-router uses to a
 * strata-node on the same host: a real server on a background thread listening on both TCP and a
 * socket file, unary and streaming calls (one large message among them) through the socket from
 * the blocking helpers and the async client, then the socket file's life: a stale file left by a
 * dead server is replaced, a live server's is not taken over, a non-socket or a too-long path is
 * refused, the file goes with the server, and a client to a missing socket fails its call with
 * UNAVAILABLE without ever connecting. No timing assertions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "strata/rpc.h"

#define STREAM_MSGS 50
#define BIG_BYTES ((size_t)3 << 20) /* several HTTP/2 windows' worth */

/* ---- the service ---- */

static void h_echo(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    rpc_call_finish(call, rpc_call_send(call, req), NULL);
}

/* Answers STREAM_MSGS messages "m<i>", then one of BIG_BYTES bytes of 'x'. */
static void h_stream(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    char m[16];
    st_code rc = ST_OK;
    for (int i = 0; i < STREAM_MSGS && rc == ST_OK; i++) {
        int n = snprintf(m, sizeof m, "m%d", i);
        rc = rpc_call_send(call, st_slice_make((const uint8_t *)m, (size_t)n));
    }
    uint8_t *big = malloc(BIG_BYTES);
    if (!big)
        rc = ST_RESOURCE_EXHAUSTED;
    if (rc == ST_OK) {
        memset(big, 'x', BIG_BYTES);
        rc = rpc_call_send(call, st_slice_make(big, BIG_BYTES));
    }
    free(big);
    rpc_call_finish(call, rc, NULL);
}

typedef struct fixture {
    struct event_base *base;
    rpc_server *srv;
    pthread_t th;
    char dir[256];
    char sock[300];
    char addr[320]; /* "unix:" + sock */
} fixture;

static void *loop_thread(void *arg) {
    fixture *f = arg;
    event_base_dispatch(f->base);
    return NULL;
}

/* A fresh directory under $STRATA_TEST_TMP (else /tmp) for the socket files. */
static void make_dir(fixture *f) {
    const char *root = getenv("STRATA_TEST_TMP");
    if (!root || !*root)
        root = "/tmp";
    mkdir(root, 0755);
    snprintf(f->dir, sizeof f->dir, "%s/rpcunix.XXXXXX", root);
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/s.sock", f->dir);
    snprintf(f->addr, sizeof f->addr, "%s%s", RPC_UNIX_PREFIX, f->sock);
}

static rpc_server *server_new(struct event_base *base) {
    st_err err = {0};
    rpc_server *s = rpc_server_new(base, NULL, &err);
    assert_non_null(s);
    assert_int_equal(rpc_server_add_method(s, "/t.T/Echo", h_echo, NULL), ST_OK);
    assert_int_equal(rpc_server_add_method(s, "/t.T/Stream", h_stream, NULL), ST_OK);
    return s;
}

static fixture *fixture_start(void) {
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    make_dir(f);
    st_err err = {0};
    f->base = event_base_new();
    assert_non_null(f->base);
    f->srv = server_new(f->base);
    uint16_t port = 0;
    assert_int_equal(rpc_server_listen(f->srv, "127.0.0.1", 0, &port, &err), ST_OK);
    assert_int_equal(rpc_server_listen_unix(f->srv, f->sock, &err), ST_OK);
    assert_int_equal(pthread_create(&f->th, NULL, loop_thread, f), 0);
    return f;
}

static void loop_stop(void *arg) {
    event_base_loopbreak(arg);
}

static void fixture_stop(fixture *f) {
    assert_int_equal(rpc_server_post(f->srv, loop_stop, f->base), ST_OK);
    pthread_join(f->th, NULL);
    rpc_server_free(f->srv);
    event_base_loop(f->base, EVLOOP_NONBLOCK);
    event_base_free(f->base);
    assert_int_equal(access(f->sock, F_OK), -1); /* the server removed its socket file */
    rmdir(f->dir);
    free(f);
}

/* ---- calls through the socket ---- */

typedef struct stream_seen {
    int n;
    bool order_ok;
    size_t big_len;
} stream_seen;

static void on_stream_msg(st_slice msg, void *arg) {
    stream_seen *s = arg;
    char want[16];
    int n = snprintf(want, sizeof want, "m%d", s->n);
    if (s->n < STREAM_MSGS)
        s->order_ok &= msg.len == (size_t)n && memcmp(msg.data, want, msg.len) == 0;
    else
        s->big_len = msg.len;
    s->n++;
}

static void test_rpc_unix_unary_and_stream(void **state) {
    (void)state;
    fixture *f = fixture_start();
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    const char *hello = "hello over a unix socket";
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Echo", st_slice_cstr(hello), NULL, 0,
                                        10000, &resp, &status),
                     ST_OK);
    assert_int_equal(resp.len, strlen(hello));
    assert_memory_equal(resp.data, hello, resp.len);
    stream_seen seen = {0, true, 0};
    assert_int_equal(rpc_blocking_stream(f->addr, NULL, "/t.T/Stream", st_slice_cstr(""), NULL, 0,
                                         30000, on_stream_msg, &seen, &status),
                     ST_OK);
    assert_int_equal(seen.n, STREAM_MSGS + 1);
    assert_true(seen.order_ok);
    assert_int_equal(seen.big_len, BIG_BYTES);
    /* an unknown method still ends only its stream, as over TCP */
    assert_int_equal(rpc_blocking_unary(f->addr, NULL, "/t.T/Nope", st_slice_cstr("x"), NULL, 0,
                                        10000, &resp, &status),
                     ST_UNIMPLEMENTED);
    st_buf_free(&resp);
    fixture_stop(f);
}

typedef struct async_ctx {
    struct event_base *base;
    int done;
    st_code code;
    st_slice want;
    bool same;
} async_ctx;

static void async_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    async_ctx *a = arg;
    a->code = code;
    a->same = st_slice_eq(resp, a->want);
    a->done++;
    event_base_loopbreak(a->base);
}

/* The async client the router uses: several calls on one connection. */
static void test_rpc_unix_async_client(void **state) {
    (void)state;
    fixture *f = fixture_start();
    struct event_base *base = event_base_new();
    assert_non_null(base);
    st_err err = {0};
    rpc_client *c = rpc_client_new_unix(base, f->sock, NULL, &err);
    assert_non_null(c);
    for (int i = 0; i < 3; i++) {
        async_ctx a = {base, 0, ST_UNKNOWN, st_slice_cstr("ping"), false};
        assert_int_equal(rpc_client_unary(c, "/t.T/Echo", a.want, NULL, 0, 10000, async_done, &a),
                         ST_OK);
        while (!a.done)
            event_base_loop(base, EVLOOP_ONCE);
        assert_int_equal(a.code, ST_OK);
        assert_true(a.same);
    }
    assert_true(rpc_client_alive(c));
    assert_true(rpc_client_connected(c));
    rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    fixture_stop(f);
}

/* ---- the socket file ---- */

/* A socket file nobody accepts on, as a killed server leaves it. */
static void make_stale_socket(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
}

static void test_rpc_unix_socket_file_lifecycle(void **state) {
    (void)state;
    fixture *f = fixture_start(); /* live on f->sock */
    struct event_base *base = event_base_new();
    assert_non_null(base);
    rpc_server *s2 = server_new(base);
    st_err err = {0};
    /* a live server's socket is not taken over */
    assert_int_equal(rpc_server_listen_unix(s2, f->sock, &err), ST_UNAVAILABLE);
    assert_non_null(strstr(err.msg, "another process"));
    /* a stale one is replaced, and served */
    char stale[320], plain[320], longp[200];
    snprintf(stale, sizeof stale, "%s/stale.sock", f->dir);
    make_stale_socket(stale);
    assert_int_equal(rpc_server_listen_unix(s2, stale, &err), ST_OK);
    /* not a socket; too long; empty */
    snprintf(plain, sizeof plain, "%s/plain", f->dir);
    FILE *fp = fopen(plain, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(rpc_server_listen_unix(s2, plain, &err), ST_UNAVAILABLE);
    memset(longp, 'a', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(rpc_server_listen_unix(s2, longp, &err), ST_INVALID_ARGUMENT);
    assert_int_equal(rpc_server_listen_unix(s2, "", &err), ST_INVALID_ARGUMENT);
    assert_null(rpc_client_new_unix(base, longp, NULL, &err));
    assert_int_equal(err.code, ST_INVALID_ARGUMENT);
    rpc_server_free(s2);
    event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(access(stale, F_OK), -1);  /* removed with s2 */
    assert_int_equal(access(f->sock, F_OK), 0); /* f's untouched */
    assert_int_equal(access(plain, F_OK), 0);   /* never ours */
    unlink(plain);
    event_base_free(base);
    fixture_stop(f);
}

static void done_record(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    async_ctx *a = arg;
    a->code = code;
    a->done++;
    event_base_loopbreak(a->base);
}

/* A missing or stale socket: the call fails with UNAVAILABLE and the client never connected
 * (what makes strata-router try TCP next). */
static void test_rpc_unix_client_refused(void **state) {
    (void)state;
    fixture f = {0};
    make_dir(&f);
    struct event_base *base = event_base_new();
    assert_non_null(base);
    for (int stale = 0; stale < 2; stale++) {
        if (stale)
            make_stale_socket(f.sock);
        st_err err = {0};
        rpc_client *c = rpc_client_new_unix(base, f.sock, NULL, &err);
        async_ctx a = {base, 0, ST_UNKNOWN, st_slice_cstr(""), false};
        if (c) {
            assert_non_null(rpc_client_call(c, "/t.T/Echo", st_slice_cstr("x"), NULL, 0, 10000,
                                            NULL, done_record, &a));
            while (!a.done)
                event_base_loop(base, EVLOOP_ONCE);
            assert_int_equal(a.code, ST_UNAVAILABLE);
            assert_false(rpc_client_alive(c));
            assert_false(rpc_client_connected(c));
            rpc_client_free(c);
        } else {
            assert_int_equal(err.code, ST_UNAVAILABLE);
        }
        st_err status = {0};
        assert_int_equal(rpc_blocking_unary(f.addr, NULL, "/t.T/Echo", st_slice_cstr("x"), NULL, 0,
                                            10000, NULL, &status),
                         ST_UNAVAILABLE);
    }
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    unlink(f.sock);
    rmdir(f.dir);
}

int main(void) {
    /* As strata-node and strata-router do: a peer that closed (the stale-socket probe connects
     * to a live server and leaves) must not kill the writer. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_unix_unary_and_stream),
        cmocka_unit_test(test_rpc_unix_async_client),
        cmocka_unit_test(test_rpc_unix_socket_file_lifecycle),
        cmocka_unit_test(test_rpc_unix_client_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
