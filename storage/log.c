/* log.c — the node's commit log: opening and closing it, and its accessors. Format:
 * docs/formats/log.md; contract: log.h. The work is split by job: log_segment.c (segment format,
 * record reader, segment list), log_recover.c (replay and positioning), log_append.c and
 * log_commit.c (group commit), log_trim.c (segment removal), log_cursor.c (cursors).
 *
 * Threads. Appenders encode their rows and queue them (bounded by STO_LOG_QUEUE_BYTES_MAX). One
 * writer at a time takes everything queued as a group, assigns lsns, writes the group with one
 * write and one fdatasync, runs the done callbacks in order and only then publishes the new
 * durable end to cursors. Everything else is under `mu`. */
#include "log_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- open and close ---- */

st_code sto_log_open(const char *dir, const sto_log_options *opts, sto_log **out, st_err *err) {
    if (strlen(dir) + LOG_NAME_DIGITS + 8 >= LOG_PATH_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "commit log path too long: %.64s...", dir);
    if (opts->segment_bytes > STO_LOG_SEGMENT_BYTES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "commit log segment size %zu is over the maximum %zu; choose a "
                          "smaller log_segment_bytes",
                          opts->segment_bytes, STO_LOG_SEGMENT_BYTES_MAX);
    sto_log *log = calloc(1, sizeof *log);
    if (!log)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening the commit log");
    log->env = opts->env ? opts->env : st_env_posix();
    log->sync = opts->sync;
    log->accept_data_loss = opts->accept_data_loss;
    log->needed_from = opts->needed_from;
    log->ckpt_idle_us =
        opts->checkpoint_idle_us ? opts->checkpoint_idle_us : LOG_CKPT_IDLE_US_DEFAULT;
    log->segment_bytes = opts->segment_bytes ? opts->segment_bytes : STO_LOG_SEGMENT_BYTES_DEFAULT;
    snprintf(log->dir, sizeof log->dir, "%s", dir);
    pthread_mutex_init(&log->mu, NULL);
    pthread_cond_init(&log->work_cv, NULL);
    pthread_cond_init(&log->space_cv, NULL);
    pthread_cond_init(&log->rm_cv, NULL);
    pthread_cond_init(&log->rm_done_cv, NULL);
    log->wstate = W_UNPOSITIONED;
    st_code rc = log->env->ops->mkdirs(log->env, dir, err);
    if (rc == ST_OK)
        rc = log_segs_load(log, err);
    if (rc == ST_OK && pthread_create(&log->thread, NULL, log_commit_main, log) != 0)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot start the commit log thread");
    if (rc != ST_OK) {
        st_err_prefix(err, "opening commit log %s: ", dir);
        free(log->segs);
        pthread_cond_destroy(&log->rm_done_cv);
        pthread_cond_destroy(&log->rm_cv);
        pthread_cond_destroy(&log->space_cv);
        pthread_cond_destroy(&log->work_cv);
        pthread_mutex_destroy(&log->mu);
        free(log);
        return rc;
    }
    if (!log->sync)
        st_log(ST_LOG_WARN, "log",
               "event=open_nosync dir=%s msg=\"commit log without fdatasync: "
               "acknowledged writes can be lost in a crash\"",
               dir);
    *out = log;
    return ST_OK;
}

/* Drains what was queued (every done runs), finishes queued segment file removals (trims), stops
 * the threads and frees. */
void sto_log_close(sto_log *log) {
    if (!log)
        return;
    pthread_mutex_lock(&log->mu);
    log->closing = true;
    pthread_cond_broadcast(&log->work_cv);
    pthread_cond_broadcast(&log->space_cv);
    pthread_cond_broadcast(&log->rm_cv);
    bool rm_started = log->rm_started;
    pthread_mutex_unlock(&log->mu);
    pthread_join(log->thread, NULL);
    if (rm_started) /* it removes what is queued before it ends (trims are over by now) */
        pthread_join(log->rm_thread, NULL);
    log_ckpt_final(log);
    log_writer_close_file(log);
    st_buf_free(&log->group);
    free(log->segs);
    free(log->holes);
    free(log->rm);
    pthread_cond_destroy(&log->rm_done_cv);
    pthread_cond_destroy(&log->rm_cv);
    pthread_cond_destroy(&log->space_cv);
    pthread_cond_destroy(&log->work_cv);
    pthread_mutex_destroy(&log->mu);
    free(log);
}

/* ---- accessors ---- */

bool sto_log_tail_dropped(sto_log *log) {
    return log->tail_dropped;
}

uint64_t sto_log_last_durable_lsn(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    uint64_t v = log->durable_lsn;
    pthread_mutex_unlock(&log->mu);
    return v;
}

uint64_t sto_log_bytes(sto_log *log) {
    uint64_t sum = 0;
    pthread_mutex_lock(&log->mu);
    for (size_t i = 0; i < log->n_segs; i++)
        sum += log->segs[i].bytes;
    pthread_mutex_unlock(&log->mu);
    return sum;
}

bool sto_log_out_of_space(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    bool v = log->out_of_space;
    pthread_mutex_unlock(&log->mu);
    return v;
}

uint64_t sto_log_oldest_lsn(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    uint64_t v = log->n_segs ? log->segs[0].first_lsn : log->durable_lsn + 1;
    pthread_mutex_unlock(&log->mu);
    return v;
}

uint64_t sto_log_readable_from(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    uint64_t v = log->readable_from;
    pthread_mutex_unlock(&log->mu);
    return v;
}

bool sto_log_hole(sto_log *log, size_t i, uint64_t *lsn, uint64_t *next_lsn) {
    if (i >= log->n_holes) /* fixed once recovery is over: no lock */
        return false;
    *lsn = log->holes[i].lsn;
    *next_lsn = log->holes[i].next_lsn;
    return true;
}

uint64_t sto_log_segment_first(sto_log *log, uint64_t lsn) {
    pthread_mutex_lock(&log->mu);
    ptrdiff_t i = log_segs_find(log, lsn);
    uint64_t v = log->n_segs == 0 ? 0 : log->segs[i < 0 ? 0 : i].first_lsn;
    pthread_mutex_unlock(&log->mu);
    return v;
}

void sto_log_stats_get(sto_log *log, sto_log_stats *out) {
    pthread_mutex_lock(&log->mu);
    *out = log->stats;
    pthread_mutex_unlock(&log->mu);
}
