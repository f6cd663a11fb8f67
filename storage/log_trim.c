/* log_trim.c — trimming the commit log: segments leave the list at once and their files are
 * removed in order, by a background thread of the log (started by the first trim) or by the
 * trimmer itself, one directory sync per batch. */
#include "log_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- trimming ---- */

#define LOG_RM_BATCH 64 /* segment files removed per directory sync */

/* Removes the files of segments firsts[0..n) in order, then syncs the directory once. Stops at
 * the first failure: the files left are old segments, which replay skips. */
static st_code rm_files(sto_log *log, const uint64_t *firsts, size_t n, st_err *err) {
    st_code rc = ST_OK;
    size_t i = 0;
    for (; i < n && rc == ST_OK; i++) {
        char path[LOG_PATH_MAX];
        log_seg_path(log, firsts[i], path);
        rc = log->env->ops->remove(log->env, path, err);
        if (rc == ST_NOT_FOUND)
            rc = ST_OK;
    }
    if (i > 0) { /* also after a failure: make the removals that happened durable */
        st_code src = log->env->ops->sync_dir(log->env, log->dir, rc == ST_OK ? err : NULL);
        rc = rc == ST_OK ? src : rc;
    }
    return rc;
}

/* mu held (released meanwhile): removes the oldest queued files, up to LOG_RM_BATCH. */
static void rm_batch_locked(sto_log *log) {
    uint64_t batch[LOG_RM_BATCH];
    size_t n = log->n_rm < LOG_RM_BATCH ? log->n_rm : LOG_RM_BATCH;
    memcpy(batch, log->rm, n * sizeof *batch);
    memmove(log->rm, log->rm + n, (log->n_rm - n) * sizeof *log->rm);
    log->n_rm -= n;
    pthread_mutex_unlock(&log->mu);
    st_err e;
    st_err_clear(&e);
    st_code rc = rm_files(log, batch, n, &e);
    if (rc != ST_OK)
        st_log(ST_LOG_WARN, "log", "event=log_trim_failed code=%s msg=\"%s\"", st_code_name(rc),
               e.msg);
    pthread_mutex_lock(&log->mu);
    log->rm_done += n;
    log->stats.segments_removed += n;
    if (rc != ST_OK) {
        log->rm_failed_at = log->rm_done;
        log->rm_code = rc;
        log->rm_err = e;
    }
    pthread_cond_broadcast(&log->rm_done_cv);
}

static void *rm_main(void *arg) {
    sto_log *log = arg;
    pthread_mutex_lock(&log->mu);
    while (log->n_rm > 0 || !log->closing) {
        if (log->n_rm == 0)
            pthread_cond_wait(&log->rm_cv, &log->mu);
        else
            rm_batch_locked(log);
    }
    pthread_mutex_unlock(&log->mu);
    return NULL;
}

/* mu held: takes whole segments off the list (never the last, which the writer may use) and
 * queues their files for removal; *target is the rm_done value that means they are gone. */
static st_code trim_queue_locked(sto_log *log, uint64_t keep_from, uint64_t *target, st_err *err) {
    size_t k = 0;
    while (k + 1 < log->n_segs && log->segs[k + 1].first_lsn <= keep_from)
        k++;
    if (log->n_rm + k > log->cap_rm) {
        size_t cap = log->cap_rm ? log->cap_rm : 16;
        while (cap < log->n_rm + k)
            cap *= 2;
        uint64_t *rm = realloc(log->rm, cap * sizeof *rm);
        if (!rm)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory trimming the commit log");
        log->rm = rm;
        log->cap_rm = cap;
    }
    for (size_t i = 0; i < k; i++)
        log->rm[log->n_rm++] = log->segs[i].first_lsn;
    memmove(log->segs, log->segs + k, (log->n_segs - k) * sizeof *log->segs);
    log->n_segs -= k;
    if (k)
        __atomic_add_fetch(&log->segs_gen, 1, __ATOMIC_RELEASE);
    log->rm_asked += k;
    *target = log->rm_asked;
    if (k && !log->rm_started && !log->closing)
        log->rm_started = pthread_create(&log->rm_thread, NULL, rm_main, log) == 0;
    if (k)
        pthread_cond_signal(&log->rm_cv);
    return ST_OK;
}

/* mu held: waits until rm_done reaches target, removing files itself when there is no remover
 * thread. The result is the failure of a batch that finished meanwhile, if any. */
static st_code trim_wait_locked(sto_log *log, uint64_t target, st_err *err) {
    uint64_t from = log->rm_done;
    while (log->rm_done < target) {
        if (log->rm_started)
            pthread_cond_wait(&log->rm_done_cv, &log->mu);
        else
            rm_batch_locked(log);
    }
    if (log->rm_failed_at > from && log->rm_failed_at <= target) {
        if (err)
            *err = log->rm_err;
        return log->rm_code;
    }
    return ST_OK;
}

st_code sto_log_trim(sto_log *log, uint64_t keep_from, st_err *err) {
    uint64_t target;
    pthread_mutex_lock(&log->mu);
    st_code rc = trim_queue_locked(log, keep_from, &target, err);
    if (rc == ST_OK)
        rc = trim_wait_locked(log, target, err);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

st_code sto_log_trim_async(sto_log *log, uint64_t keep_from, st_err *err) {
    uint64_t target;
    pthread_mutex_lock(&log->mu);
    st_code rc = trim_queue_locked(log, keep_from, &target, err);
    if (rc == ST_OK && !log->rm_started) /* no remover thread: remove them now */
        rc = trim_wait_locked(log, target, err);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

void sto_log_trim_wait(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    (void)trim_wait_locked(log, log->rm_asked, NULL);
    pthread_mutex_unlock(&log->mu);
}
