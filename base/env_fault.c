/* env_fault.c — an st_env wrapper that injects failures (disk full, EIO), for storage tests.
 *
 * After a budget of appends/syncs/wopens (counted together), each such call fails with the chosen
 * code and writes nothing, until the test sets a new budget. Every other call passes through.
 * The wrapper does not own the base env: destroy frees only the wrapper. */
#include "strata/env.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault_env {
    st_env base;
    st_env *inner;
    pthread_mutex_t mu;
    int64_t ops_until_fail; /* < 0: no faults */
    st_code code;
    uint64_t failed;
} fault_env;

struct st_wfile {
    fault_env *env;
    st_wfile *inner;
    char path[];
};

struct st_rfile {
    fault_env *env;
    st_rfile *inner;
};

static fault_env *fenv(st_env *env) {
    return (fault_env *)env;
}

/* Counts one faultable call; returns non-OK when it must fail. */
static st_code fault_tick(fault_env *e, const char *what, const char *path, st_err *err) {
    pthread_mutex_lock(&e->mu);
    st_code code = ST_OK;
    if (e->ops_until_fail > 0) {
        e->ops_until_fail--;
    } else if (e->ops_until_fail == 0) {
        code = e->code;
        e->failed++;
    }
    pthread_mutex_unlock(&e->mu);
    if (code == ST_OK)
        return ST_OK;
    if (code == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, code,
                          "%s %s: no space left on device (injected); free disk space "
                          "and retry",
                          what, path);
    return st_err_set(err, code, "%s %s: input/output error (injected); check the disk", what,
                      path);
}

static st_code fault_open_w(st_env *env, const char *path, bool append, st_wfile **out,
                            st_err *err) {
    fault_env *e = fenv(env);
    st_code rc = fault_tick(e, "open for writing", path, err);
    if (rc != ST_OK)
        return rc;
    st_wfile *f = malloc(sizeof *f + strlen(path) + 1);
    if (!f)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", path);
    rc = append ? e->inner->ops->wopen_append(e->inner, path, &f->inner, err)
                : e->inner->ops->wopen(e->inner, path, &f->inner, err);
    if (rc != ST_OK) {
        free(f);
        return rc;
    }
    f->env = e;
    strcpy(f->path, path);
    *out = f;
    return ST_OK;
}

static st_code fault_wopen(st_env *env, const char *path, st_wfile **out, st_err *err) {
    return fault_open_w(env, path, false, out, err);
}

static st_code fault_wopen_append(st_env *env, const char *path, st_wfile **out, st_err *err) {
    return fault_open_w(env, path, true, out, err);
}

static st_code fault_append(st_wfile *f, const void *data, size_t len, st_err *err) {
    st_code rc = fault_tick(f->env, "write", f->path, err);
    if (rc != ST_OK)
        return rc;
    return f->env->inner->ops->append(f->inner, data, len, err);
}

/* Passed through, not counted: the log writes only its checkpoints this way, and counting them
 * would move the failure point of every test written before they existed. */
static st_code fault_pwrite(st_wfile *f, uint64_t off, const void *data, size_t len, st_err *err) {
    st_env *in = f->env->inner;
    if (!in->ops->pwrite)
        return st_err_set(err, ST_FAILED_PRECONDITION, "writing in place in %s: not supported",
                          f->path);
    return in->ops->pwrite(f->inner, off, data, len, err);
}

static st_code fault_sync(st_wfile *f, st_err *err) {
    st_code rc = fault_tick(f->env, "fdatasync", f->path, err);
    if (rc != ST_OK)
        return rc;
    return f->env->inner->ops->sync(f->inner, err);
}

static st_code fault_wclose(st_wfile *f, st_err *err) {
    st_code rc = f->env->inner->ops->wclose(f->inner, err);
    free(f);
    return rc;
}

static st_code fault_ropen(st_env *env, const char *path, st_rfile **out, st_err *err) {
    fault_env *e = fenv(env);
    st_rfile *f = malloc(sizeof *f);
    if (!f)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", path);
    st_code rc = e->inner->ops->ropen(e->inner, path, &f->inner, err);
    if (rc != ST_OK) {
        free(f);
        return rc;
    }
    f->env = e;
    *out = f;
    return ST_OK;
}

static st_code fault_pread(st_rfile *f, uint64_t off, void *buf, size_t len, size_t *got,
                           st_err *err) {
    return f->env->inner->ops->pread(f->inner, off, buf, len, got, err);
}

static st_code fault_rsize(st_rfile *f, uint64_t *size, st_err *err) {
    return f->env->inner->ops->rsize(f->inner, size, err);
}

static void fault_rclose(st_rfile *f) {
    f->env->inner->ops->rclose(f->inner);
    free(f);
}

static st_code fault_remove(st_env *env, const char *path, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->remove(in, path, err);
}

static st_code fault_rename(st_env *env, const char *from, const char *to, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->rename(in, from, to, err);
}

static st_code fault_link(st_env *env, const char *from, const char *to, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->link(in, from, to, err);
}

static st_code fault_mkdirs(st_env *env, const char *path, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->mkdirs(in, path, err);
}

static st_code fault_sync_dir(st_env *env, const char *path, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->sync_dir(in, path, err);
}

static st_code fault_exists(st_env *env, const char *path, bool *out, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->exists(in, path, out, err);
}

static st_code fault_file_size(st_env *env, const char *path, uint64_t *size, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->file_size(in, path, size, err);
}

static st_code fault_list(st_env *env, const char *dir, st_code (*fn)(const char *, void *),
                          void *arg, st_err *err) {
    st_env *in = fenv(env)->inner;
    return in->ops->list(in, dir, fn, arg, err);
}

static void fault_destroy(st_env *env) {
    fault_env *e = fenv(env);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static const st_env_ops fault_ops = {
    .wopen = fault_wopen,
    .wopen_append = fault_wopen_append,
    .append = fault_append,
    .pwrite = fault_pwrite,
    .sync = fault_sync,
    .wclose = fault_wclose,
    .ropen = fault_ropen,
    .pread = fault_pread,
    .rsize = fault_rsize,
    .rclose = fault_rclose,
    .remove = fault_remove,
    .rename = fault_rename,
    .link = fault_link,
    .mkdirs = fault_mkdirs,
    .sync_dir = fault_sync_dir,
    .exists = fault_exists,
    .file_size = fault_file_size,
    .list = fault_list,
    .destroy = fault_destroy,
};

st_env *st_env_fault_new(st_env *base) {
    fault_env *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->base.ops = &fault_ops;
    e->inner = base;
    e->ops_until_fail = -1;
    e->code = ST_INTERNAL;
    pthread_mutex_init(&e->mu, NULL);
    return &e->base;
}

void st_env_fault_set(st_env *env, int64_t ops_until_fail, st_code code) {
    fault_env *e = fenv(env);
    pthread_mutex_lock(&e->mu);
    e->ops_until_fail = ops_until_fail;
    e->code = code;
    pthread_mutex_unlock(&e->mu);
}

uint64_t st_env_fault_count(st_env *env) {
    fault_env *e = fenv(env);
    pthread_mutex_lock(&e->mu);
    uint64_t n = e->failed;
    pthread_mutex_unlock(&e->mu);
    return n;
}
