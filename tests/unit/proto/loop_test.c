/* rpc_loop_run (proto/rpc/loop.c): runs callbacks like event_base_dispatch with and without busy
 * polling, ends on loopbreak and when no events are left; --poll-us parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <event2/event.h>
#include <unistd.h>

#include "strata/rpc.h"

typedef struct ping {
    struct event_base *base;
    struct event *ev;
    int fds[2];
    int seen;
    int want;
} ping;

/* Each byte read writes the next one, so the loop always has one message in flight, as a
 * 1 x 1 conversation does; the last one breaks the loop. */
static void on_read(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    ping *p = arg;
    char c;
    if (read(fd, &c, 1) != 1)
        return;
    if (++p->seen == p->want) {
        event_base_loopbreak(p->base);
        return;
    }
    assert_int_equal(write(p->fds[1], "x", 1), 1);
}

static void run_pings(unsigned spin_us) {
    ping p = {.base = event_base_new(), .want = 1000};
    assert_non_null(p.base);
    assert_int_equal(pipe(p.fds), 0);
    evutil_make_socket_nonblocking(p.fds[0]);
    p.ev = event_new(p.base, p.fds[0], EV_READ | EV_PERSIST, on_read, &p);
    event_add(p.ev, NULL);
    assert_int_equal(write(p.fds[1], "x", 1), 1);
    assert_int_equal(rpc_loop_run(p.base, spin_us), 0);
    assert_int_equal(p.seen, p.want);
    event_free(p.ev);
    close(p.fds[0]);
    close(p.fds[1]);
    event_base_free(p.base);
}

static void test_runs_until_break(void **state) {
    (void)state;
    run_pings(0);
    run_pings(50);
    run_pings(RPC_LOOP_POLL_US_MAX);
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (*(int *)arg)++;
}

/* With nothing left to wait for, the loop returns (as event_base_dispatch does). */
static void test_returns_when_empty(void **state) {
    (void)state;
    for (unsigned spin = 0; spin <= 50; spin += 50) {
        struct event_base *base = event_base_new();
        int fired = 0;
        struct timeval tv = {0, 1000};
        event_base_once(base, -1, EV_TIMEOUT, on_timer, &fired, &tv);
        assert_int_equal(rpc_loop_run(base, spin), 0);
        assert_int_equal(fired, 1);
        event_base_free(base);
    }
}

static void test_poll_parse(void **state) {
    (void)state;
    unsigned v = 7;
    assert_true(rpc_loop_poll_parse("0", &v));
    assert_int_equal(v, 0);
    assert_true(rpc_loop_poll_parse("10000", &v));
    assert_int_equal(v, 10000);
    assert_false(rpc_loop_poll_parse("10001", &v));
    assert_false(rpc_loop_poll_parse("-1", &v));
    assert_false(rpc_loop_poll_parse("", &v));
    assert_false(rpc_loop_poll_parse("5us", &v));
    assert_false(rpc_loop_poll_parse("99999999999999999999999", &v));
    assert_int_equal(v, 10000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_until_break),
        cmocka_unit_test(test_returns_when_empty),
        cmocka_unit_test(test_poll_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
