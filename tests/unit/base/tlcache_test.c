/* tlcache_test proves st_tl_at_thread_exit: the drains a thread registers run when it exits
 * (each once, with its argument), a thread's registrations stop at ST_TL_DRAINS_MAX, and another
 * thread's drains are its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>

#include "strata/base.h"

static void count_drain(void *arg) {
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED);
}

typedef struct job {
    int counters[ST_TL_DRAINS_MAX + 1];
    int accepted;
} job;

static void *register_all(void *arg) {
    job *j = arg;
    for (int i = 0; i <= ST_TL_DRAINS_MAX; i++)
        if (st_tl_at_thread_exit(count_drain, &j->counters[i]))
            j->accepted++;
    return NULL;
}

static void test_tlcache_drains_run_at_thread_exit(void **state) {
    (void)state;
    job a = {0}, b = {0};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, register_all, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, register_all, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.accepted, ST_TL_DRAINS_MAX);
    assert_int_equal(b.accepted, ST_TL_DRAINS_MAX);
    for (int i = 0; i < ST_TL_DRAINS_MAX; i++) {
        assert_int_equal(a.counters[i], 1);
        assert_int_equal(b.counters[i], 1);
    }
    assert_int_equal(a.counters[ST_TL_DRAINS_MAX], 0); /* refused: never run */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tlcache_drains_run_at_thread_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
