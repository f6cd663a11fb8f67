/* log_append.c — the appenders' side of group commit: encoding rows into framed records (lsn and
 * checksum left to the writer), queueing them within STO_LOG_QUEUE_BYTES_MAX, and
 * sto_log_append_wait's leader-based commit (the caller writes the group itself when no group
 * is in flight). */
#include "log_impl.h"
#include "rowmut.h"

#include <stdlib.h>

/* ---- appends ---- */

/* Each appending thread keeps its encode buffer between sto_log_append_wait calls (freed when the
 * thread ends): a malloc and free of a record-sized buffer per write, and the cold cache lines of
 * a fresh one, were a visible part of an unsynced write's cost. */
#define LOG_ENC_BUF_KEEP_BYTES ((size_t)64 << 10) /* larger buffers are freed, not kept */

typedef struct enc_cache {
    st_tl_cache tl; /* first: the drain gets the cache */
    st_buf buf;     /* empty while lent out */
} enc_cache;

static void enc_cache_drain(st_tl_cache *c) {
    st_buf_free(&((enc_cache *)c)->buf);
}

static _Thread_local enc_cache enc_tl = {.tl.drain = enc_cache_drain};

/* Moves this thread's kept buffer (if any) into *out, emptied. */
static void enc_buf_take(st_buf *out) {
    *out = enc_tl.buf;
    out->len = 0;
    st_buf_init(&enc_tl.buf);
}

/* Keeps buf for this thread's next append, or frees it. */
static void enc_buf_give(st_buf *buf) {
    if (enc_tl.buf.data || buf->cap > LOG_ENC_BUF_KEEP_BYTES || !st_tl_cache_ready(&enc_tl.tl)) {
        st_buf_free(buf);
        return;
    }
    enc_tl.buf = *buf;
    enc_tl.buf.len = 0;
    st_buf_init(buf);
}

/* Room for n rows' records, reserved at once: a batch of many rows (a replicated one) grown
 * record by record was copied over and over by realloc. Best effort: a row the encoder refuses
 * gets its error from the encoder. */
static void entry_reserve(log_entry *e, const sto_row_mut *rows, size_t n) {
    size_t total = 0, bound;
    for (size_t i = 0; i < n; i++)
        if (rows[i].n_muts <= STO_ROW_MUTS_MAX && sto_row_mut_bound(&rows[i], &bound) &&
            bound <= STO_LOG_RECORD_BYTES_MAX)
            total += LOG_REC_HDR_BYTES + bound;
    (void)st_buf_reserve(&e->buf, total);
}

/* Frames n rows as records with lsn and crc left for the commit thread. */
static st_code entry_encode(log_entry *e, const sto_row_mut *rows, size_t n, st_err *err) {
    entry_reserve(e, rows, n);
    for (size_t i = 0; i < n; i++) {
        size_t at = e->buf.len;
        uint8_t zero[LOG_REC_HDR_BYTES] = {0};
        st_code rc = st_buf_append(&e->buf, zero, sizeof zero);
        if (rc == ST_OK)
            rc = sto_row_mut_encode(&e->buf, &rows[i]);
        if (rc == ST_INVALID_ARGUMENT)
            return st_err_set(err, rc,
                              "row mutation %zu: bad mutation type, row key over %d "
                              "bytes or over %u mutations",
                              i, STO_ROW_KEY_MAX, STO_ROW_MUTS_MAX);
        if (rc != ST_OK)
            return st_err_set(err, rc, "out of memory encoding a log record");
        size_t len = e->buf.len - at - LOG_REC_HDR_BYTES;
        if (len > STO_LOG_RECORD_BYTES_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "row mutation %zu encodes to %zu bytes, "
                              "over the log record limit of %u",
                              i, len, STO_LOG_RECORD_BYTES_MAX);
        st_put_fixed32(e->buf.data + at + 4, (uint32_t)len);
    }
    e->n_records = n;
    return ST_OK;
}

/* Why appends are refused right now (under mu), or ST_OK. */
static st_code append_refusal(sto_log *log, st_err *err) {
    if (log->closing)
        return st_err_set(err, ST_UNAVAILABLE, "commit log %s is closing", log->dir);
    if (log->failed != ST_OK) {
        if (err)
            *err = log->failed_err;
        return log->failed;
    }
    if (log->replaying)
        return st_err_set(err, ST_FAILED_PRECONDITION, "commit log %s is replaying", log->dir);
    return ST_OK;
}

/* mu held: waits for queue room (not on the writer's own thread: a done callback appending must
 * not wait for room only its group can make), then queues e. */
static st_code enqueue_locked(sto_log *log, log_entry *e, st_err *err) {
    st_code rc;
    bool writer = log->writing && pthread_equal(pthread_self(), log->writer);
    while ((rc = append_refusal(log, err)) == ST_OK && !writer && log->queued_bytes > 0 &&
           log->queued_bytes + e->buf.len > STO_LOG_QUEUE_BYTES_MAX) {
        pthread_cond_wait(&log->space_cv, &log->mu);
        writer = log->writing && pthread_equal(pthread_self(), log->writer);
    }
    if (rc != ST_OK)
        return rc;
    log->appends_started = true;
    if (log->tail)
        log->tail->next = e;
    else
        log->head = e;
    log->tail = e;
    log->queued_bytes += e->buf.len;
    if (log->queued_bytes > log->stats.queue_bytes_peak)
        log->stats.queue_bytes_peak = log->queued_bytes;
    log->stats.appends++;
    return ST_OK;
}

st_code sto_log_append(sto_log *log, const sto_row_mut *rows, size_t n, sto_log_done_fn done,
                       void *arg, st_err *err) {
    if (n == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "log append of zero row mutations");
    log_entry *e = calloc(1, sizeof *e);
    if (!e)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory queueing a log append");
    e->done = done;
    e->arg = arg;
    st_code rc = entry_encode(e, rows, n, err);
    if (rc != ST_OK) {
        log_entry_free(e);
        return rc;
    }
    pthread_mutex_lock(&log->mu);
    rc = enqueue_locked(log, e, err);
    if (rc == ST_OK && !log->writing)
        pthread_cond_signal(&log->work_cv); /* else the writer hands off when it finishes */
    pthread_mutex_unlock(&log->mu);
    if (rc != ST_OK)
        log_entry_free(e);
    return rc;
}

/* Leader-based group commit (LevelDB's writer queue): the caller queues its records and, when
 * no group is being written, writes everything queued itself — one write and one fdatasync for
 * all of it — instead of handing off to the commit thread and sleeping until it wakes it. A
 * caller that finds a group in flight sleeps until its records were written by that group's
 * writer or it is handed the lead for the next group. */
st_code sto_log_append_wait(sto_log *log, const sto_row_mut *rows, size_t n, sto_log_done_fn done,
                            void *arg, st_err *err) {
    if (n == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "log append of zero row mutations");
    pthread_cond_t cv;
    log_entry e = {.done = done, .arg = arg, .waiter = &cv};
    enc_buf_take(&e.buf);
    st_code rc = entry_encode(&e, rows, n, err);
    if (rc != ST_OK) {
        enc_buf_give(&e.buf);
        return rc;
    }
    pthread_cond_init(&cv, NULL);
    pthread_mutex_lock(&log->mu);
    if (log->writing && pthread_equal(pthread_self(), log->writer))
        rc = st_err_set(err, ST_FAILED_PRECONDITION,
                        "sto_log_append_wait called from a done callback would wait for itself");
    if (rc == ST_OK)
        rc = enqueue_locked(log, &e, err);
    while (rc == ST_OK && !e.finished) {
        if (!log->writing) { /* e is still queued: nobody else is writing, so lead */
            log_run_group_locked(log);
            log_hand_off_locked(log);
        } else {
            pthread_cond_wait(&cv, &log->mu);
        }
    }
    pthread_mutex_unlock(&log->mu);
    pthread_cond_destroy(&cv);
    enc_buf_give(&e.buf);
    return rc;
}
