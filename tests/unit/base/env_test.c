/*
 * Proves the three envs keep the st_env contract storage relies on: one shared contract test runs
 * against the POSIX env (in a temporary directory), the in-memory env and the fault env wrapping
 * it (files, appends, preads, rename/link/remove, listing, the NOT_FOUND code, the whole-file
 * helpers); then the in-memory env's crash simulation is checked (unsynced bytes dropped or
 * garbled, names created/renamed/removed since the last sync_dir revert, old handles dead), its
 * thread safety under concurrent appenders and readers, and the fault env's counted failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <unistd.h>

#include "strata/env.h"

/* ---- helpers ---- */

static void write_file(st_env *env, const char *path, const char *data, bool sync) {
    st_wfile *f;
    st_err err;
    if (env->ops->wopen(env, path, &f, &err) != ST_OK)
        fail_msg("wopen %s: %s", path, err.msg);
    assert_int_equal(env->ops->append(f, data, strlen(data), &err), ST_OK);
    if (sync)
        assert_int_equal(env->ops->sync(f, &err), ST_OK);
    assert_int_equal(env->ops->wclose(f, &err), ST_OK);
}

/* Reads the whole file into a static buffer as a string; NULL when missing. */
static const char *read_file(st_env *env, const char *path) {
    static char out[4096];
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_env_read_all(env, path, &b, NULL);
    if (rc == ST_NOT_FOUND)
        return NULL;
    assert_int_equal(rc, ST_OK);
    assert_true(b.len < sizeof out);
    if (b.len)
        memcpy(out, b.data, b.len);
    out[b.len] = '\0';
    st_buf_free(&b);
    return out;
}

static bool exists(st_env *env, const char *path) {
    bool e = false;
    assert_int_equal(env->ops->exists(env, path, &e, NULL), ST_OK);
    return e;
}

typedef struct names {
    char v[16][64];
    int n;
    int stop_after; /* return ST_ABORTED after this many (0 = never) */
} names;

static st_code names_fn(const char *name, void *arg) {
    names *ns = arg;
    if (ns->n < 16)
        snprintf(ns->v[ns->n++], 64, "%s", name);
    return ns->stop_after && ns->n >= ns->stop_after ? ST_ABORTED : ST_OK;
}

static bool names_has(const names *ns, const char *name) {
    for (int i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], name) == 0)
            return true;
    return false;
}

/* ---- the shared contract ---- */

static void env_contract(st_env *env, const char *root) {
    char dir[512], a[600], b[600], c[600];
    st_err err;
    snprintf(dir, sizeof dir, "%s/x/y", root);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(c, sizeof c, "%s/c", dir);
    assert_int_equal(env->ops->mkdirs(env, dir, &err), ST_OK);
    assert_int_equal(env->ops->mkdirs(env, dir, &err), ST_OK); /* idempotent */
    assert_true(exists(env, dir));
    assert_false(exists(env, a));

    /* Missing files are ST_NOT_FOUND everywhere. */
    st_rfile *r;
    st_wfile *w;
    uint64_t size;
    assert_int_equal(env->ops->ropen(env, a, &r, &err), ST_NOT_FOUND);
    assert_int_equal(env->ops->file_size(env, a, &size, &err), ST_NOT_FOUND);
    assert_int_equal(env->ops->remove(env, a, &err), ST_NOT_FOUND);
    assert_int_equal(env->ops->rename(env, a, b, &err), ST_NOT_FOUND);

    /* Write, append at the end, read back with preads. */
    write_file(env, a, "hello", true);
    assert_int_equal(env->ops->wopen_append(env, a, &w, &err), ST_OK);
    assert_int_equal(env->ops->append(w, " world", 6, &err), ST_OK);
    assert_int_equal(env->ops->sync(w, &err), ST_OK);
    assert_int_equal(env->ops->wclose(w, &err), ST_OK);
    assert_int_equal(env->ops->file_size(env, a, &size, &err), ST_OK);
    assert_int_equal(size, 11);
    assert_int_equal(env->ops->ropen(env, a, &r, &err), ST_OK);
    char buf[32];
    size_t got;
    assert_int_equal(env->ops->pread(r, 6, buf, 5, &got, &err), ST_OK);
    assert_int_equal(got, 5);
    assert_memory_equal(buf, "world", 5);
    assert_int_equal(env->ops->pread(r, 8, buf, 10, &got, &err), ST_OK);
    assert_int_equal(got, 3); /* short only at the end */
    assert_int_equal(env->ops->pread(r, 100, buf, 10, &got, &err), ST_OK);
    assert_int_equal(got, 0);
    assert_int_equal(env->ops->rsize(r, &size, &err), ST_OK);
    assert_int_equal(size, 11);
    env->ops->rclose(r);

    /* wopen truncates. */
    write_file(env, b, "old contents", true);
    write_file(env, b, "new", true);
    assert_string_equal(read_file(env, b), "new");

    /* rename replaces atomically; link adds a name; remove drops one. */
    assert_int_equal(env->ops->rename(env, a, b, &err), ST_OK);
    assert_false(exists(env, a));
    assert_string_equal(read_file(env, b), "hello world");
    assert_int_equal(env->ops->link(env, b, c, &err), ST_OK);
    assert_string_equal(read_file(env, c), "hello world");
    assert_int_equal(env->ops->remove(env, b, &err), ST_OK);
    assert_false(exists(env, b));
    assert_string_equal(read_file(env, c), "hello world");
    assert_int_equal(env->ops->sync_dir(env, dir, &err), ST_OK);

    /* Listing: names only, no . or .., stops at the first non-OK return. */
    write_file(env, a, "1", false);
    names ns = {.n = 0};
    assert_int_equal(env->ops->list(env, dir, names_fn, &ns, &err), ST_OK);
    assert_int_equal(ns.n, 2);
    assert_true(names_has(&ns, "a") && names_has(&ns, "c"));
    names stop = {.n = 0, .stop_after = 1};
    assert_int_equal(env->ops->list(env, dir, names_fn, &stop, &err), ST_ABORTED);
    assert_int_equal(stop.n, 1);
    names up = {.n = 0};
    snprintf(b, sizeof b, "%s/x", root);
    assert_int_equal(env->ops->list(env, b, names_fn, &up, &err), ST_OK);
    assert_int_equal(up.n, 1);
    assert_string_equal(up.v[0], "y");
    snprintf(b, sizeof b, "%s/nope", root);
    assert_int_equal(env->ops->list(env, b, names_fn, &up, &err), ST_NOT_FOUND);

    /* Whole-file helpers. */
    snprintf(b, sizeof b, "%s/atomic", dir);
    assert_int_equal(st_env_write_atomic(env, b, "v1", 2, &err), ST_OK);
    assert_int_equal(st_env_write_atomic(env, b, "v22", 3, &err), ST_OK);
    assert_string_equal(read_file(env, b), "v22");
    snprintf(c, sizeof c, "%s/atomic.tmp", dir);
    assert_false(exists(env, c));

    /* Cleanup so the POSIX run leaves nothing behind. */
    env->ops->remove(env, a, NULL);
    env->ops->remove(env, b, NULL);
    snprintf(c, sizeof c, "%s/c", dir);
    env->ops->remove(env, c, NULL);
}

static void test_env_posix_contract(void **state) {
    (void)state;
    const char *tmp = getenv("STRATA_TEST_TMP");
    char root[256];
    snprintf(root, sizeof root, "%s/env_test_%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    st_env *env = st_env_posix();
    env_contract(env, root);
    char p[512];
    snprintf(p, sizeof p, "%s/x/y", root);
    assert_int_equal(rmdir(p), 0);
    snprintf(p, sizeof p, "%s/x", root);
    assert_int_equal(rmdir(p), 0);
    assert_int_equal(rmdir(root), 0);
    env->ops->destroy(env); /* a no-op for the shared env */
}

static void test_env_mem_contract(void **state) {
    (void)state;
    st_env *env = st_env_mem_new();
    env_contract(env, "/root");
    env_contract(env, "rel"); /* relative paths work too */
    /* Creating a file in a missing directory fails like POSIX. */
    st_wfile *w;
    assert_int_equal(env->ops->wopen(env, "/missing/f", &w, NULL), ST_NOT_FOUND);
    env->ops->destroy(env);
}

static void test_env_fault_contract_when_healthy(void **state) {
    (void)state;
    st_env *mem = st_env_mem_new(), *env = st_env_fault_new(mem);
    env_contract(env, "/root");
    assert_int_equal(st_env_fault_count(env), 0);
    env->ops->destroy(env);
    mem->ops->destroy(mem);
}

/* ---- crash simulation ---- */

static void test_env_mem_crash_drops_unsynced(void **state) {
    (void)state;
    st_env *env = st_env_mem_new();
    assert_int_equal(env->ops->mkdirs(env, "/d", NULL), ST_OK);
    write_file(env, "/d/synced", "durable", true);
    assert_int_equal(env->ops->sync_dir(env, "/d", NULL), ST_OK);
    /* Synced prefix, unsynced tail. */
    st_wfile *w;
    assert_int_equal(env->ops->wopen_append(env, "/d/synced", &w, NULL), ST_OK);
    assert_int_equal(env->ops->append(w, "+lost", 5, NULL), ST_OK);
    st_rfile *r;
    assert_int_equal(env->ops->ropen(env, "/d/synced", &r, NULL), ST_OK);
    st_env_mem_crash(env, false, 1);
    /* Handles from before the crash belong to a dead process. */
    assert_int_equal(env->ops->append(w, "x", 1, NULL), ST_INTERNAL);
    assert_int_equal(env->ops->sync(w, NULL), ST_INTERNAL);
    char buf[8];
    size_t got;
    assert_int_equal(env->ops->pread(r, 0, buf, 1, &got, NULL), ST_INTERNAL);
    env->ops->rclose(r);
    assert_int_equal(env->ops->wclose(w, NULL), ST_OK);
    assert_string_equal(read_file(env, "/d/synced"), "durable");
    env->ops->destroy(env);
}

static void test_env_mem_crash_reverts_names(void **state) {
    (void)state;
    st_env *env = st_env_mem_new();
    assert_int_equal(env->ops->mkdirs(env, "/d", NULL), ST_OK);
    write_file(env, "/d/kept", "k", true);
    write_file(env, "/d/old", "o", true);
    write_file(env, "/d/doomed", "x", true);
    assert_int_equal(env->ops->sync_dir(env, "/d", NULL), ST_OK);
    /* Changes after the last sync_dir: all of them revert. */
    write_file(env, "/d/new", "n", true);
    assert_int_equal(env->ops->rename(env, "/d/old", "/d/renamed", NULL), ST_OK);
    assert_int_equal(env->ops->remove(env, "/d/doomed", NULL), ST_OK);
    assert_int_equal(env->ops->link(env, "/d/kept", "/d/alias", NULL), ST_OK);
    st_env_mem_crash(env, false, 2);
    assert_false(exists(env, "/d/new"));
    assert_false(exists(env, "/d/renamed"));
    assert_false(exists(env, "/d/alias"));
    assert_string_equal(read_file(env, "/d/old"), "o");
    assert_string_equal(read_file(env, "/d/doomed"), "x");
    assert_string_equal(read_file(env, "/d/kept"), "k");
    assert_true(exists(env, "/d")); /* directories are durable at once */
    /* The same changes with a sync_dir survive. */
    write_file(env, "/d/new", "n", true);
    assert_int_equal(env->ops->rename(env, "/d/old", "/d/renamed", NULL), ST_OK);
    assert_int_equal(env->ops->remove(env, "/d/doomed", NULL), ST_OK);
    assert_int_equal(env->ops->sync_dir(env, "/d", NULL), ST_OK);
    st_env_mem_crash(env, true, 3);
    assert_string_equal(read_file(env, "/d/new"), "n");
    assert_string_equal(read_file(env, "/d/renamed"), "o");
    assert_false(exists(env, "/d/old"));
    assert_false(exists(env, "/d/doomed"));
    /* A synced file in a directory never synced is gone; sync_dir of another dir does not help. */
    assert_int_equal(env->ops->mkdirs(env, "/e", NULL), ST_OK);
    write_file(env, "/e/f", "f", true);
    assert_int_equal(env->ops->sync_dir(env, "/d", NULL), ST_OK);
    st_env_mem_crash(env, false, 4);
    assert_false(exists(env, "/e/f"));
    env->ops->destroy(env);
}

static void test_env_mem_crash_garbles_tail(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("test_env_mem_crash_garbles_tail");
    int shorter = 0, changed = 0;
    for (int i = 0; i < 200; i++) {
        st_env *env = st_env_mem_new();
        write_file(env, "f", "0123456789", true);
        assert_int_equal(env->ops->sync_dir(env, ".", NULL), ST_OK);
        st_wfile *w;
        assert_int_equal(env->ops->wopen_append(env, "f", &w, NULL), ST_OK);
        assert_int_equal(env->ops->append(w, "abcdefghijklmnopqrst", 20, NULL), ST_OK);
        assert_int_equal(env->ops->wclose(w, NULL), ST_OK);
        st_env_mem_crash(env, true, seed + (uint64_t)i);
        const char *s = read_file(env, "f");
        size_t len = strlen(s); /* random bytes may hold a NUL: compare by size instead */
        uint64_t size;
        assert_int_equal(env->ops->file_size(env, "f", &size, NULL), ST_OK);
        assert_true(size >= 10 && size <= 30);
        assert_true(len >= 10 || len == size);
        assert_memory_equal(s, "0123456789", 10);
        shorter += size < 30;
        changed += size == 30 ? memcmp(s + 10, "abcdefghijklmnopqrst", 20) != 0 : 1;
        /* What survived a crash is durable: a second crash keeps it. */
        st_env_mem_crash(env, true, seed);
        uint64_t size2;
        assert_int_equal(env->ops->file_size(env, "f", &size2, NULL), ST_OK);
        assert_int_equal(size2, size);
        env->ops->destroy(env);
    }
    assert_true(shorter > 0 && changed > 0);
}

/* ---- thread safety ---- */

#define MT_THREADS 4
#define MT_APPENDS 2000

typedef struct mt_arg {
    st_env *env;
    int id;
} mt_arg;

static void *mt_main(void *p) {
    mt_arg *a = p;
    char path[32];
    snprintf(path, sizeof path, "/mt/f%d", a->id);
    st_wfile *w;
    st_rfile *r;
    if (a->env->ops->wopen(a->env, path, &w, NULL) != ST_OK ||
        a->env->ops->ropen(a->env, path, &r, NULL) != ST_OK)
        abort();
    for (int i = 0; i < MT_APPENDS; i++) {
        uint8_t b = (uint8_t)(i * 7 + a->id);
        if (a->env->ops->append(w, &b, 1, NULL) != ST_OK)
            abort();
        uint8_t back;
        size_t got;
        if (a->env->ops->pread(r, (uint64_t)i, &back, 1, &got, NULL) != ST_OK || got != 1 ||
            back != b)
            abort();
        if (i % 100 == 0 && a->env->ops->sync_dir(a->env, "/mt", NULL) != ST_OK)
            abort();
    }
    a->env->ops->rclose(r);
    a->env->ops->wclose(w, NULL);
    return NULL;
}

static void test_env_mem_threads(void **state) {
    (void)state;
    st_env *env = st_env_mem_new();
    assert_int_equal(env->ops->mkdirs(env, "/mt", NULL), ST_OK);
    pthread_t th[MT_THREADS];
    mt_arg args[MT_THREADS];
    for (int i = 0; i < MT_THREADS; i++) {
        args[i] = (mt_arg){env, i};
        assert_int_equal(pthread_create(&th[i], NULL, mt_main, &args[i]), 0);
    }
    for (int i = 0; i < MT_THREADS; i++)
        pthread_join(th[i], NULL);
    uint64_t size;
    assert_int_equal(env->ops->file_size(env, "/mt/f3", &size, NULL), ST_OK);
    assert_int_equal(size, MT_APPENDS);
    env->ops->destroy(env);
}

/* ---- fault injection ---- */

static void test_env_fault_counts_and_fails(void **state) {
    (void)state;
    st_env *mem = st_env_mem_new(), *env = st_env_fault_new(mem);
    st_err err;
    st_wfile *w;
    /* wopen and one append pass, then everything counted fails. */
    st_env_fault_set(env, 2, ST_RESOURCE_EXHAUSTED);
    assert_int_equal(env->ops->wopen(env, "f", &w, &err), ST_OK);
    assert_int_equal(env->ops->append(w, "ok", 2, &err), ST_OK);
    assert_int_equal(env->ops->append(w, "no", 2, &err), ST_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "free disk space"));
    assert_int_equal(env->ops->sync(w, &err), ST_RESOURCE_EXHAUSTED);
    st_wfile *w2;
    assert_int_equal(env->ops->wopen(env, "g", &w2, &err), ST_RESOURCE_EXHAUSTED);
    assert_int_equal(env->ops->wopen_append(env, "f", &w2, &err), ST_RESOURCE_EXHAUSTED);
    assert_int_equal(st_env_fault_count(env), 4);
    /* Uncounted calls pass through while faulting; a failed append wrote nothing. */
    assert_int_equal(env->ops->sync_dir(env, ".", &err), ST_OK);
    assert_int_equal(env->ops->link(env, "f", "f2", &err), ST_OK);
    assert_string_equal(read_file(env, "f"), "ok");
    /* EIO flavour, then healthy again. */
    st_env_fault_set(env, 0, ST_INTERNAL);
    assert_int_equal(env->ops->append(w, "x", 1, &err), ST_INTERNAL);
    assert_int_equal(st_env_fault_count(env), 5);
    st_env_fault_set(env, -1, ST_OK);
    assert_int_equal(env->ops->append(w, "!", 1, &err), ST_OK);
    assert_int_equal(env->ops->sync(w, &err), ST_OK);
    assert_int_equal(env->ops->wclose(w, &err), ST_OK);
    assert_string_equal(read_file(env, "f"), "ok!");
    assert_int_equal(env->ops->rename(env, "f", "h", &err), ST_OK);
    assert_int_equal(env->ops->remove(env, "h", &err), ST_OK);
    assert_int_equal(st_env_fault_count(env), 5);
    env->ops->destroy(env);
    mem->ops->destroy(mem);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_posix_contract),
        cmocka_unit_test(test_env_mem_contract),
        cmocka_unit_test(test_env_fault_contract_when_healthy),
        cmocka_unit_test(test_env_mem_crash_drops_unsynced),
        cmocka_unit_test(test_env_mem_crash_reverts_names),
        cmocka_unit_test(test_env_mem_crash_garbles_tail),
        cmocka_unit_test(test_env_mem_threads),
        cmocka_unit_test(test_env_fault_counts_and_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
