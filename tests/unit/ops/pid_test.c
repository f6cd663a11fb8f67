/* pid_test.c — ops_inst_pid_alive and ops_inst_pid_wait_gone on a process killed with SIGKILL:
 * from the moment kill() returns it counts as stopped (it lives on for a moment, freeing its
 * memory, and `strata up` must start its replacement instead of leaving it alone), and
 * ops_inst_pid_wait_gone returns once it is gone (a zombie not yet reaped counts as gone: its
 * files are closed). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "instance.h"

#define CHILD_BYTES ((size_t)256 << 20) /* memory the child frees while it dies */

/* A child named like a Strata process, holding CHILD_BYTES of touched memory; it says it is
 * ready on the pipe and sleeps. */
static pid_t spawn(void) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_NAME, "strata-pidtest");
        char *mem = malloc(CHILD_BYTES);
        if (mem)
            memset(mem, 1, CHILD_BYTES);
        char c = 'r';
        if (write(fds[1], &c, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    return pid;
}

static void test_killed_is_stopped(void **state) {
    (void)state;
    for (int round = 0; round < 5; round++) {
        pid_t pid = spawn();
        assert_true(ops_inst_pid_alive(pid));
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_false(ops_inst_pid_alive(pid)); /* at once: SIGKILL pending, or exiting */
        assert_true(ops_inst_pid_wait_gone(pid, 30000));
        assert_false(ops_inst_pid_alive(pid));
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        assert_true(ops_inst_pid_wait_gone(pid, 0)); /* reaped */
    }
}

static void test_running_is_alive(void **state) {
    (void)state;
    pid_t pid = spawn();
    assert_true(ops_inst_pid_alive(pid));
    assert_false(ops_inst_pid_wait_gone(pid, 100)); /* it runs: not gone */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_false(ops_inst_pid_alive(getpid())); /* this test's name is not a Strata process's */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_is_stopped),
        cmocka_unit_test(test_running_is_alive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
