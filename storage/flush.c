/* flush.c — frozen memtables to SSTables, oldest first per tablet, on the background workers (or
 * in the caller for sto_tablet_flush and splits). A tablet's flushed_lsn advances when its SSTable
 * is installed; the manifest rewrite that follows makes it durable and lets the log shrink.
 * A failed flush (full disk) keeps the memtable, records the error for stalled writers and is
 * retried with exponential backoff. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

/* ---- buffered SSTable output ----
 *
 * The SSTable writer appends one sealed block (a few KB) at a time; through this env each append
 * is a copy into a STO_SST_WBUF_BYTES buffer, written out when it fills and before every sync and
 * close, so the kernel sees a few large writes instead of one per block (per-call work of
 * write(2) and the inode update was ~9% of a sequential load's CPU). Only what the writer uses
 * is offered: creating, appending, syncing, closing and removing files; reads are refused. */

struct st_wfile {
    st_env *inner_env;
    st_wfile *inner;
    size_t len;
    st_code failed; /* sticky: a failed write-out fails every later call */
    uint8_t buf[];
};

static st_env *wbuf_inner(st_env *env) {
    return ((sto_wbuf_env *)(void *)env)->inner;
}

static st_code wbuf_wrap(st_env *inner_env, st_wfile *inner, st_wfile **out, st_err *err) {
    st_wfile *f = malloc(sizeof *f + STO_SST_WBUF_BYTES);
    if (!f) {
        inner_env->ops->wclose(inner, NULL);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening a table file");
    }
    *f = (st_wfile){inner_env, inner, 0, ST_OK};
    *out = f;
    return ST_OK;
}

static st_code wbuf_wopen(st_env *env, const char *path, st_wfile **out, st_err *err) {
    st_env *in = wbuf_inner(env);
    st_wfile *inner;
    st_code rc = in->ops->wopen(in, path, &inner, err);
    return rc == ST_OK ? wbuf_wrap(in, inner, out, err) : rc;
}

static st_code wbuf_wopen_append(st_env *env, const char *path, st_wfile **out, st_err *err) {
    st_env *in = wbuf_inner(env);
    st_wfile *inner;
    st_code rc = in->ops->wopen_append(in, path, &inner, err);
    return rc == ST_OK ? wbuf_wrap(in, inner, out, err) : rc;
}

static st_code wbuf_drain(st_wfile *f, st_err *err) {
    if (f->failed == ST_OK && f->len > 0)
        f->failed = f->inner_env->ops->append(f->inner, f->buf, f->len, err);
    else if (f->failed != ST_OK)
        st_err_set(err, f->failed, "an earlier write of this table file failed");
    f->len = 0;
    return f->failed;
}

static st_code wbuf_append(st_wfile *f, const void *data, size_t len, st_err *err) {
    if (f->len + len > STO_SST_WBUF_BYTES && wbuf_drain(f, err) != ST_OK)
        return f->failed;
    if (len >= STO_SST_WBUF_BYTES) { /* too big to buffer: straight through */
        if (f->failed == ST_OK)
            f->failed = f->inner_env->ops->append(f->inner, data, len, err);
        return f->failed;
    }
    memcpy(f->buf + f->len, data, len);
    f->len += len;
    return ST_OK;
}

static st_code wbuf_sync(st_wfile *f, st_err *err) {
    st_code rc = wbuf_drain(f, err);
    return rc == ST_OK ? f->inner_env->ops->sync(f->inner, err) : rc;
}

static st_code wbuf_wclose(st_wfile *f, st_err *err) {
    st_code rc = wbuf_drain(f, err);
    st_code rc2 = f->inner_env->ops->wclose(f->inner, rc == ST_OK ? err : NULL);
    free(f);
    return rc != ST_OK ? rc : rc2;
}

static st_code wbuf_ropen(st_env *env, const char *path, st_rfile **out, st_err *err) {
    (void)env;
    (void)out;
    return st_err_set(err, ST_INTERNAL, "reading %s through the table writer's env", path);
}
static st_code wbuf_pread(st_rfile *f, uint64_t off, void *buf, size_t len, size_t *got,
                          st_err *err) {
    (void)f;
    (void)off;
    (void)buf;
    (void)len;
    (void)got;
    return st_err_set(err, ST_INTERNAL, "reading through the table writer's env");
}
static st_code wbuf_rsize(st_rfile *f, uint64_t *size, st_err *err) {
    (void)f;
    (void)size;
    return st_err_set(err, ST_INTERNAL, "reading through the table writer's env");
}
static void wbuf_rclose(st_rfile *f) {
    (void)f;
}
static st_code wbuf_remove(st_env *env, const char *path, st_err *err) {
    return wbuf_inner(env)->ops->remove(wbuf_inner(env), path, err);
}
static st_code wbuf_rename(st_env *env, const char *from, const char *to, st_err *err) {
    return wbuf_inner(env)->ops->rename(wbuf_inner(env), from, to, err);
}
static st_code wbuf_link(st_env *env, const char *from, const char *to, st_err *err) {
    return wbuf_inner(env)->ops->link(wbuf_inner(env), from, to, err);
}
static st_code wbuf_mkdirs(st_env *env, const char *path, st_err *err) {
    return wbuf_inner(env)->ops->mkdirs(wbuf_inner(env), path, err);
}
static st_code wbuf_sync_dir(st_env *env, const char *path, st_err *err) {
    return wbuf_inner(env)->ops->sync_dir(wbuf_inner(env), path, err);
}
static st_code wbuf_exists(st_env *env, const char *path, bool *out, st_err *err) {
    return wbuf_inner(env)->ops->exists(wbuf_inner(env), path, out, err);
}
static st_code wbuf_file_size(st_env *env, const char *path, uint64_t *size, st_err *err) {
    return wbuf_inner(env)->ops->file_size(wbuf_inner(env), path, size, err);
}
static st_code wbuf_list(st_env *env, const char *dir, st_code (*fn)(const char *name, void *arg),
                         void *arg, st_err *err) {
    return wbuf_inner(env)->ops->list(wbuf_inner(env), dir, fn, arg, err);
}
static void wbuf_destroy(st_env *env) {
    (void)env; /* lives in its user's frame */
}

static const st_env_ops wbuf_ops = {
    .wopen = wbuf_wopen,
    .wopen_append = wbuf_wopen_append,
    .append = wbuf_append,
    .sync = wbuf_sync,
    .wclose = wbuf_wclose,
    .ropen = wbuf_ropen,
    .pread = wbuf_pread,
    .rsize = wbuf_rsize,
    .rclose = wbuf_rclose,
    .remove = wbuf_remove,
    .rename = wbuf_rename,
    .link = wbuf_link,
    .mkdirs = wbuf_mkdirs,
    .sync_dir = wbuf_sync_dir,
    .exists = wbuf_exists,
    .file_size = wbuf_file_size,
    .list = wbuf_list,
    .destroy = wbuf_destroy,
};

void sto_wbuf_env_init(sto_wbuf_env *e, st_env *inner) {
    e->base.ops = &wbuf_ops;
    e->inner = inner;
}

/* ---- flushing ---- */

static st_code write_sst(sto_db *db, sto_memtable *m, sto_file **out, st_err *err) {
    uint64_t number = sto_db_new_file_number(db);
    char path[STO_PATH_MAX + 64];
    sto_db_sst_path(db, number, path, sizeof path);
    sto_sst_options so = {db->o.block_bytes, db->o.bloom_bits_per_key, db->o.zstd_level};
    sto_wbuf_env wenv; /* w uses it until finished or abandoned, both below */
    sto_wbuf_env_init(&wenv, db->env);
    sto_sst_writer *w;
    st_code rc = sto_sst_writer_new(&wenv.base, path, &so, &w, err);
    if (rc != ST_OK)
        return rc;
    sto_kviter *it = sto_memtable_iter_new(m, UINT64_MAX);
    if (!it) {
        sto_sst_writer_abandon(w);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory flushing a memtable");
    }
    for (it->ops->seek_first(it); rc == ST_OK && it->ops->valid(it); it->ops->next(it))
        rc = sto_sst_writer_add(w, it->ops->key(it), it->ops->value(it), err);
    if (rc == ST_OK)
        rc = it->ops->status(it, err);
    it->ops->free(it);
    if (rc != ST_OK) {
        sto_sst_writer_abandon(w);
        return rc;
    }
    uint64_t bytes;
    rc = sto_sst_writer_finish(w, &bytes, err);
    if (rc == ST_OK)
        rc = sto_file_new(db, number, out, err);
    if (rc != ST_OK)
        db->env->ops->remove(db->env, path, NULL);
    return rc;
}

static bool grow_ssts(sto_tablet *t, size_t extra) {
    if (t->n_ssts + extra <= t->cap_ssts)
        return true;
    size_t ncap = t->cap_ssts ? t->cap_ssts * 2 : 8;
    while (ncap < t->n_ssts + extra)
        ncap *= 2;
    sto_tsst *p = realloc(t->ssts, ncap * sizeof *p);
    if (!p)
        return false;
    t->ssts = p;
    t->cap_ssts = ncap;
    return true;
}

/* meta_mu held: the SSTable replaces the oldest frozen memtable in one step under t->mu, so a
 * snapshot sees the data exactly once. */
static st_code install(sto_db *db, sto_tablet *t, sto_file *f, st_err *err) {
    pthread_mutex_lock(&t->mu);
    if (!grow_ssts(t, 1)) {
        pthread_mutex_unlock(&t->mu);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory installing a flush");
    }
    memmove(&t->ssts[1], &t->ssts[0], t->n_ssts * sizeof(sto_tsst));
    f->tablet_refs = 1;
    t->ssts[0] = sto_tsst_of(t, f);
    t->n_ssts++;
    sto_imm imm = t->imm[0];
    memmove(&t->imm[0], &t->imm[1], (t->n_imm - 1) * sizeof(sto_imm));
    t->n_imm--;
    if (imm.upto_lsn > t->flushed_lsn)
        t->flushed_lsn = imm.upto_lsn;
    sto_tablet_update_hints_locked(t);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_sub(&db->mem_bytes, (long long)imm.bytes);
    sto_memtable_unref(imm.m);
    return ST_OK;
}

/* Flushes the oldest frozen memtable of t; the caller holds t's flush claim. *did = false when
 * there was none. */
static st_code flush_one(sto_db *db, sto_tablet *t, bool *did, st_err *err) {
    pthread_mutex_lock(&t->mu);
    *did = t->n_imm > 0;
    sto_memtable *m = *did ? t->imm[0].m : NULL;
    if (m)
        sto_memtable_ref(m);
    pthread_mutex_unlock(&t->mu);
    if (!m)
        return ST_OK;
    sto_file *f = NULL;
    st_code rc = write_sst(db, m, &f, err);
    sto_memtable_unref(m);
    if (rc != ST_OK)
        return rc;
    uint64_t number = f->number; /* f belongs to the tablet once installed */
    pthread_mutex_lock(&db->meta_mu);
    rc = install(db, t, f, err);
    bool installed = rc == ST_OK;
    if (installed) {
        /* On failure the table stays installed in memory and the log untrimmed (the data is safe
         * in it); the error still goes to the caller, so a full disk shows up as one. */
        rc = sto_manifest_write(db, NULL, NULL, err);
    } else {
        sto_sst_mark_obsolete(f->sst);
        sto_sst_unref(f->sst);
        free(f);
    }
    pthread_mutex_unlock(&db->meta_mu);
    if (installed) {
        atomic_fetch_add(&db->flushes, 1);
        st_log(ST_LOG_DEBUG, "storage", "event=flush tablet=%" PRIu64 " file=%" PRIu64, t->id,
               number);
    }
    return rc;
}

/* db->mu held: records a background failure for stalled writers and schedules the retry. */
static void note_result(sto_tablet *t, st_code rc, const st_err *e) {
    if (rc == ST_OK) {
        t->bg_code = ST_OK;
        t->backoff_us = 0;
        t->retry_at_us = 0;
        return;
    }
    t->bg_code = rc;
    snprintf(t->bg_msg, sizeof t->bg_msg, "%s", e->msg);
    t->backoff_us = t->backoff_us ? t->backoff_us * 2 : STO_RETRY_MIN_US;
    if (t->backoff_us > STO_RETRY_MAX_US)
        t->backoff_us = STO_RETRY_MAX_US;
    t->retry_at_us = st_mono_us() + t->backoff_us;
    /* Every tablet retries on its own backoff (at most STO_RETRY_MAX_US): on a full disk a node
     * of many tablets would log a line per tablet every few seconds. */
    ST_LOG_LIMITED(ST_LOG_WARN, "storage",
                   "event=background_failed tablet=%" PRIu64 " code=%s msg=\"%s\"", t->id,
                   st_code_name(rc), e->msg);
}

st_code sto_tablet_flush_imms(sto_db *db, sto_tablet *t, st_err *err) {
    pthread_mutex_lock(&db->mu);
    while (t->flushing)
        pthread_cond_wait(&db->stall_cv, &db->mu);
    t->flushing = true;
    pthread_mutex_unlock(&db->mu);
    st_code rc = ST_OK;
    bool did = true;
    st_err e;
    st_err_clear(&e);
    while (rc == ST_OK && did)
        rc = flush_one(db, t, &did, &e);
    pthread_mutex_lock(&db->mu);
    note_result(t, rc, &e);
    t->flushing = false;
    pthread_cond_broadcast(&db->stall_cv);
    pthread_cond_broadcast(&db->bg_cv);
    pthread_mutex_unlock(&db->mu);
    if (rc != ST_OK && err)
        *err = e;
    return rc;
}

bool sto_flush_pick_and_run(sto_db *db) {
    sto_tablet *best = NULL;
    int64_t now = st_mono_us();
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        int n = atomic_load(&t->n_imm_hint);
        if (n == 0 || t->flushing || t->busy || t->dead || t->retry_at_us > now)
            continue;
        if (!best || n > atomic_load(&best->n_imm_hint))
            best = t;
    }
    if (!best)
        return false;
    best->flushing = true;
    pthread_mutex_unlock(&db->mu);
    bool did;
    st_err e;
    st_err_clear(&e);
    st_code rc = flush_one(db, best, &did, &e);
    pthread_mutex_lock(&db->mu);
    note_result(best, rc, &e);
    best->flushing = false;
    pthread_cond_broadcast(&db->stall_cv);
    return true;
}

/* ---- memory and log pressure ---- */

/* db->mu held. The tablet to freeze: the largest active memtable (memory pressure) or the one
 * holding the oldest unflushed record in the older half of the live log (log pressure). */
static sto_tablet *pressure_victim(sto_db *db, bool mem, uint64_t old_below) {
    sto_tablet *victim = NULL;
    size_t best_bytes = 0;
    uint64_t best_lsn = UINT64_MAX;
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        if (t->busy)
            continue;
        pthread_mutex_lock(&t->mu);
        size_t bytes = t->active_bytes;
        uint64_t first = t->active_first_lsn;
        pthread_mutex_unlock(&t->mu);
        if (mem && bytes > best_bytes) {
            victim = t;
            best_bytes = bytes;
        } else if (!mem && first && first < old_below && first < best_lsn) {
            victim = t;
            best_lsn = first;
        }
    }
    return victim;
}

static bool any_imm_locked(sto_db *db) {
    for (size_t i = 0; i < db->n_tablets; i++)
        if (atomic_load(&db->tablets[i]->n_imm_hint) > 0)
            return true;
    return false;
}

/* Whether the log must shrink: past log_max_unflushed_bytes, or its commits fail for lack of
 * space. A tablet written once long ago (the instance's metadata) keeps every segment after
 * its record until the bound; a disk that fills up before that would stay full for good,
 * holding segments whose records other tablets flushed. Flushing the tablets with the oldest
 * records lets the trim after the flush give that space back, at the cost of a small table. */
static bool log_over_bound(sto_db *db) {
    if (db->o.log_max_unflushed_bytes && sto_log_bytes(db->log) > db->o.log_max_unflushed_bytes)
        return true;
    return sto_log_out_of_space(db->log);
}

void sto_flush_check_pressure(sto_db *db) {
    if (atomic_load(&db->manifest_dirty)) { /* peek; rechecked under meta_mu */
        pthread_mutex_lock(&db->meta_mu);
        if (atomic_load(&db->manifest_dirty)) {
            st_err e;
            sto_manifest_write(db, NULL, NULL, &e);
        }
        pthread_mutex_unlock(&db->meta_mu);
    }
    long long mem = atomic_load(&db->mem_bytes);
    bool mem_over = mem > 0 && (size_t)mem > db->o.memtable_budget_bytes;
    bool log_over = log_over_bound(db);
    if (!mem_over && !log_over)
        return;
    uint64_t oldest = sto_log_oldest_lsn(db->log), last = sto_log_last_durable_lsn(db->log);
    if (!mem_over && last < oldest)
        return;
    if (last < oldest)
        last = oldest;
    pthread_mutex_lock(&db->mu);
    sto_tablet *v = NULL;
    if (!any_imm_locked(db))
        v = pressure_victim(db, mem_over, oldest + (last - oldest) / 2 + 1);
    bool froze = false;
    if (v) {
        pthread_mutex_lock(&v->mu);
        froze = sto_tablet_freeze_locked(v);
        pthread_mutex_unlock(&v->mu);
    }
    pthread_mutex_unlock(&db->mu);
    (void)froze;
}
