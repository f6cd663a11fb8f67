/* tlcache_test proves st_tl_at_thread_exit: the drains a thread registers run when it exits
 * (each once, with its argument), a thread's registrations stop at ST_TL_DRAINS_MAX, and another
 * thread's drains are its own. And st_tl_cache_ready: a per-thread cache is drained at its
 * thread's exit, also when it is used again after that drain (by a later thread-exit
 * destructor), so nothing it keeps is lost. And st_tl_stash: keeps up to its max, hands back the
 * last kept first, frees what it keeps at thread exit. */
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

/* A cache counting what it keeps and how often it was drained (all threads' drains add up). */
static int kept_total, drained_total;

typedef struct count_cache {
    st_tl_cache tl;
    int kept;
} count_cache;

static void count_cache_drain(st_tl_cache *c) {
    count_cache *cc = (count_cache *)c;
    __atomic_fetch_add(&drained_total, cc->kept, __ATOMIC_RELAXED);
    cc->kept = 0;
}

static _Thread_local count_cache tl_count = {.tl.drain = count_cache_drain};

static void count_cache_keep(void) {
    if (st_tl_cache_ready(&tl_count.tl)) {
        tl_count.kept++;
        __atomic_fetch_add(&kept_total, 1, __ATOMIC_RELAXED);
    }
}

static void *keep_twice(void *arg) {
    (void)arg;
    count_cache_keep();
    count_cache_keep();
    return NULL;
}

static pthread_key_t late_key;

/* Runs after the drains (its key is created later): keeps one more in the drained cache. */
static void late_keep(void *arg) {
    (void)arg;
    count_cache_keep();
}

static void *keep_then_late(void *arg) {
    (void)arg;
    count_cache_keep();
    pthread_setspecific(late_key, &late_key);
    return NULL;
}

static void test_tlcache_cache_drained_at_exit_also_after_late_use(void **state) {
    (void)state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, keep_twice, NULL), 0); /* creates the drains' key */
    pthread_join(t, NULL);
    assert_int_equal(kept_total, 2);
    assert_int_equal(drained_total, 2);
    assert_int_equal(pthread_key_create(&late_key, late_keep), 0);
    assert_int_equal(pthread_create(&t, NULL, keep_then_late, NULL), 0);
    pthread_join(t, NULL);
    assert_int_equal(kept_total, 4);
    assert_int_equal(drained_total, 4); /* the late one too */
    pthread_key_delete(late_key);
}

static int stash_freed;

static void stash_free(void *p) {
    (void)p;
    __atomic_fetch_add(&stash_freed, 1, __ATOMIC_RELAXED);
}

static _Thread_local st_tl_stash tl_stash = ST_TL_STASH_INIT(2, stash_free);

static void *use_stash(void *arg) {
    int *objs = arg;
    assert_true(st_tl_stash_put(&tl_stash, &objs[0]));
    assert_true(st_tl_stash_put(&tl_stash, &objs[1]));
    assert_false(st_tl_stash_put(&tl_stash, &objs[2])); /* full at max */
    assert_ptr_equal(st_tl_stash_take(&tl_stash), &objs[1]);
    assert_true(st_tl_stash_put(&tl_stash, &objs[2]));
    return NULL;
}

static void test_tlcache_stash_keeps_max_and_frees_at_exit(void **state) {
    (void)state;
    int objs[3];
    pthread_t t;
    assert_null(st_tl_stash_take(&tl_stash));
    assert_int_equal(pthread_create(&t, NULL, use_stash, objs), 0);
    pthread_join(t, NULL);
    assert_int_equal(stash_freed, 2); /* objs[0] and objs[2], kept at exit */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tlcache_drains_run_at_thread_exit),
        cmocka_unit_test(test_tlcache_cache_drained_at_exit_also_after_late_use),
        cmocka_unit_test(test_tlcache_stash_keeps_max_and_frees_at_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
