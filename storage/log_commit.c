/* log_commit.c — group commit: the writer (whoever writes the current group: the commit thread
 * or a leading sto_log_append_wait caller) creates, reopens and rolls segments, writes each
 * group with one write and one fdatasync, acknowledges it and publishes it to cursors; and the
 * commit thread itself. The writer state (open file, next lsn) belongs to the current writer;
 * sto_log_replay may touch it only before the first append. */
#include "log_impl.h"

#include <stdlib.h>
#include <time.h>

/* ---- the writer (commit thread) ---- */

void log_writer_close_file(sto_log *log) {
    if (log->wf)
        log->env->ops->wclose(log->wf, NULL);
    log->wf = NULL;
}

/* Opens the new segment file at path with its space reserved: an fdatasync after writing inside
 * the file's size costs about half of one that must also record a new size. Best effort (no
 * space, no support: appends extend the file); *reserved is the size reserved, 0 when it could
 * not be, which the header records so that recovery can tell a file cut short from a torn
 * write. Recovery tells records from the zeros by their checksums and lsns. */
static st_code segment_open_file(sto_log *log, const char *path, st_wfile **f, uint32_t *reserved,
                                 st_err *err) {
    *reserved = 0;
    st_code rc = log->env->ops->wopen(log->env, path, f, err);
    if (rc != ST_OK)
        return rc;
    if (log->env->ops->preallocate &&
        log->env->ops->preallocate(*f, log->segment_bytes, NULL) == ST_OK)
        *reserved = (uint32_t)log->segment_bytes;
    return ST_OK;
}

/* Creates segment first_lsn with its header, durable (file and directory entry) before any record
 * goes in, so a crash cannot lose a segment that holds acknowledged records. A leftover file of
 * that name can only be a last segment without a good record, and is truncated. */
st_code log_segment_create(sto_log *log, uint64_t first_lsn, st_err *err) {
    char path[LOG_PATH_MAX];
    uint8_t hdr[LOG_SEG_PAGE_BYTES];
    pthread_mutex_lock(&log->mu);
    bool full = log->n_segs >= LOG_SEGMENTS_MAX;
    pthread_mutex_unlock(&log->mu);
    if (full)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "commit log %s has %d segments; flush "
                          "tablets so the log can be trimmed",
                          log->dir, LOG_SEGMENTS_MAX);
    log_writer_close_file(log);
    log_seg_path(log, first_lsn, path);
    st_wfile *f;
    uint32_t reserved;
    st_code rc = segment_open_file(log, path, &f, &reserved, err);
    if (rc != ST_OK)
        return rc;
    log_seg_header_make(hdr, first_lsn, reserved);
    rc = log->env->ops->append(f, hdr, sizeof hdr, err);
    if (rc == ST_OK && log->sync)
        rc = log->env->ops->sync(f, err);
    if (rc == ST_OK && log->sync)
        rc = log->env->ops->sync_dir(log->env, log->dir, err);
    if (rc != ST_OK) {
        log->env->ops->wclose(f, NULL);
        return rc;
    }
    pthread_mutex_lock(&log->mu);
    log_seg s = {first_lsn, first_lsn - 1, LOG_SEG_PAGE_BYTES, LOG_SEG_PAGE_BYTES, 0, 0};
    if (log->n_segs > 0 && log->segs[log->n_segs - 1].first_lsn == first_lsn) {
        log->segs[log->n_segs - 1] = s;
        __atomic_add_fetch(&log->segs_gen, 1, __ATOMIC_RELEASE);
    } else {
        ST_ASSERT(log->n_segs == 0 || log->segs[log->n_segs - 1].first_lsn < first_lsn);
        if (!log_segs_push(log, s))
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding log segment");
    }
    if (rc == ST_OK)
        log->stats.segments_created++;
    pthread_mutex_unlock(&log->mu);
    if (rc != ST_OK) {
        log->env->ops->wclose(f, NULL);
        return rc;
    }
    log->wf = f;
    log->wbytes = log->wdata = LOG_SEG_PAGE_BYTES;
    log->wfirst = first_lsn;
    log->wckpt = log->env->ops->pwrite != NULL;
    log->ckpt_lsn = first_lsn - 1; /* the segment's existence already says that much */
    log->ckpt_n = 0;
    log->wstate = W_OPEN;
    return ST_OK;
}

/* Opens the last segment for appends at wbytes, the end of its last record: only reserved zeros
 * follow it (position_apply checked), which the next group overwrites. */
static st_code writer_reopen(sto_log *log, st_err *err) {
    char path[LOG_PATH_MAX];
    pthread_mutex_lock(&log->mu);
    log_seg_path(log, log->segs[log->n_segs - 1].first_lsn, path);
    uint64_t size = log->segs[log->n_segs - 1].bytes;
    pthread_mutex_unlock(&log->mu);
    st_code rc = log->env->ops->wopen_at
                     ? log->env->ops->wopen_at(log->env, path, log->wbytes, &log->wf, err)
                     : log->env->ops->wopen_append(log->env, path, &log->wf, err);
    if (rc != ST_OK)
        return rc;
    if (!log->env->ops->wopen_at)
        log->wckpt = false; /* a file opened for appending cannot be written in place */
    log->wstate = W_OPEN;
    pthread_mutex_lock(&log->mu);
    log->stats.segments_reused += log->wbytes < size; /* reserved space taken up again */
    pthread_mutex_unlock(&log->mu);
    return ST_OK;
}

/* The segment a roll leaves: still open, so that once the next segment is durable its
 * checkpoint can name the next segment's first lsn. Recovery checks the slots of the last
 * segment only, so this one's matter only if the segments after it disappear (removed from
 * outside): then it is the last, its checkpoint lies beyond its records, and the loss is
 * ST_DATA_LOSS instead of a log that silently ends early. One fdatasync per roll. */
typedef struct roll_prev {
    st_wfile *wf;
    uint64_t first, ckpt_n;
    bool ckpt;
} roll_prev;

static void roll_detach(sto_log *log, roll_prev *p) {
    *p = (roll_prev){log->wf, log->wfirst, log->ckpt_n, log->wckpt};
    log->wf = NULL;
}

/* created: the next segment (named next_lsn) is durable. Best effort: a failure leaves the old
 * segment without the mark, which only weakens the check above. */
static void roll_finish(sto_log *log, roll_prev *p, bool created) {
    if (!p->wf)
        return;
    if (created && log->sync && p->ckpt) {
        uint8_t slot[LOG_CKPT_BYTES];
        log_ckpt_make(slot, p->first, log->next_lsn);
        st_err e;
        st_err_clear(&e);
        uint64_t off = p->ckpt_n % 2 ? LOG_CKPT_OFF1 : LOG_CKPT_OFF0;
        st_code rc = log->env->ops->pwrite(p->wf, off, slot, sizeof slot, &e);
        if (rc == ST_OK)
            rc = log->env->ops->sync(p->wf, &e);
        if (rc != ST_OK)
            st_log(ST_LOG_WARN, "log", "event=checkpoint_failed code=%s msg=\"%s\"",
                   st_code_name(rc), e.msg);
        pthread_mutex_lock(&log->mu);
        log->stats.ckpt_syncs++;
        pthread_mutex_unlock(&log->mu);
    }
    log->env->ops->wclose(p->wf, NULL);
    p->wf = NULL;
}

/* Gets an open segment with room for group_bytes: positions, reopens or rolls over as needed. */
static st_code writer_ready(sto_log *log, size_t group_bytes, st_err *err) {
    st_code rc = ST_OK;
    if (log->wstate == W_UNPOSITIONED && (rc = log_position_lazily(log, err)) != ST_OK) {
        if (rc == ST_DATA_LOSS) {
            pthread_mutex_lock(&log->mu);
            log->failed = rc;
            log->failed_err = *err;
            pthread_mutex_unlock(&log->mu);
        }
        return rc;
    }
    if (log->wstate == W_REOPEN && (rc = writer_reopen(log, err)) != ST_OK)
        return rc;
    roll_prev prev = {0};
    if (log->wstate == W_OPEN && log->wbytes > log->wdata &&
        log->wbytes + group_bytes > log->segment_bytes) {
        log->wstate = W_NEW_SEGMENT; /* every record in it is durable: just move on */
        roll_detach(log, &prev);
    }
    if (log->wstate == W_NEW_SEGMENT)
        rc = log_segment_create(log, log->next_lsn, err);
    roll_finish(log, &prev, rc == ST_OK);
    return rc;
}

/* Fills lsn and checksum of every record of the group and concatenates them into *out (a group
 * of one entry is written from the entry's own buffer, without the copy). */
static st_code group_build(sto_log *log, log_entry *batch, st_slice *out, st_err *err) {
    uint64_t lsn = log->next_lsn, group_first = log->next_lsn;
    st_buf_reset(&log->group);
    for (log_entry *e = batch; e; e = e->next) {
        e->first_lsn = lsn;
        for (size_t off = 0; off < e->buf.len;) {
            uint8_t *h = e->buf.data + off;
            uint32_t len = st_get_fixed32(h + 4);
            st_put_fixed64(h + 8, lsn++);
            st_put_fixed64(h + 16, group_first);
            st_put_fixed32(h,
                           st_crc_mask(st_crc32c(0, h + 4, LOG_REC_HDR_BYTES - 4 + (size_t)len)));
            off += LOG_REC_HDR_BYTES + (size_t)len;
        }
        if (e == batch && !e->next) {
            *out = st_buf_slice(&e->buf);
            return ST_OK;
        }
        if (st_buf_append(&log->group, e->buf.data, e->buf.len) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory building a log group");
    }
    *out = st_buf_slice(&log->group);
    return ST_OK;
}

/* Writes a checkpoint slot of the open segment saying records up to lsn are durable, for the
 * sync that comes next (docs/formats/log.md, checkpoints). Only with an lsn whose group was
 * synced by this process, and only when it is new: the two slots alternate, so a torn slot
 * leaves the other one's older, still true, value. */
static st_code ckpt_write(sto_log *log, uint64_t lsn, st_err *err) {
    if (!log->sync || !log->wckpt || !log->wf || lsn <= log->ckpt_lsn)
        return ST_OK;
    uint8_t slot[LOG_CKPT_BYTES];
    log_ckpt_make(slot, log->wfirst, lsn);
    uint64_t off = log->ckpt_n % 2 ? LOG_CKPT_OFF1 : LOG_CKPT_OFF0;
    st_code rc = log->env->ops->pwrite(log->wf, off, slot, sizeof slot, err);
    if (rc == ST_OK) {
        log->ckpt_n++;
        log->ckpt_lsn = lsn;
    }
    return rc;
}

/* After a successful write + sync: acknowledge in order, then publish to cursors. */
static void group_succeeded(sto_log *log, log_entry *batch, size_t bytes, uint64_t n) {
    log->wbytes += bytes;
    log->next_lsn += n;
    pthread_mutex_lock(&log->mu);
    log->stats.groups++;
    log->stats.records += n;
    log->last_group_us = st_mono_us();
    log->out_of_space = false;
    pthread_mutex_unlock(&log->mu);
    for (log_entry *e = batch; e; e = e->next)
        if (e->done)
            e->done(ST_OK, e->first_lsn, NULL, e->arg);
    pthread_mutex_lock(&log->mu);
    log_seg *s = &log->segs[log->n_segs - 1];
    s->last_lsn = log->next_lsn - 1;
    s->good_bytes = s->bytes = log->wbytes;
    log->durable_lsn = log->next_lsn - 1;
    pthread_mutex_unlock(&log->mu);
}

/* A failed group: nobody is acknowledged, the segment is abandoned (its failed bytes lie after
 * its last needed record) and a fresh segment named after the failed lsns is tried at once. */
static void group_failed(sto_log *log, log_entry *batch, size_t bytes, st_code rc,
                         const st_err *err) {
    bool opened = log->wstate == W_OPEN;
    log_writer_close_file(log);
    if (log->wstate != W_UNPOSITIONED)
        log->wstate = W_NEW_SEGMENT;
    pthread_mutex_lock(&log->mu);
    if (opened && log->n_segs > 0)
        log->segs[log->n_segs - 1].bytes += bytes;
    log->stats.failed_groups++;
    log->out_of_space = rc == ST_RESOURCE_EXHAUSTED; /* the flush threads free flushed log */
    pthread_mutex_unlock(&log->mu);
    /* a full disk fails every group until space is freed: hundreds a second */
    ST_LOG_LIMITED(ST_LOG_WARN, "log", "event=group_failed code=%s msg=\"%s\"", st_code_name(rc),
                   err->msg);
    for (log_entry *e = batch; e; e = e->next)
        if (e->done)
            e->done(rc, 0, err, e->arg);
    if (opened && log->wstate == W_NEW_SEGMENT)
        log_segment_create(log, log->next_lsn, NULL); /* best effort; retried by the next group */
}

static void group_commit(sto_log *log, log_entry *batch) {
    size_t bytes = 0;
    uint64_t n = 0;
    for (log_entry *e = batch; e; e = e->next) {
        bytes += e->buf.len;
        n += e->n_records;
    }
    st_err err;
    st_err_clear(&err);
    st_code rc = writer_ready(log, bytes, &err);
    st_slice data = {0};
    if (rc == ST_OK)
        rc = group_build(log, batch, &data, &err);
    if (rc == ST_OK)
        rc = log->env->ops->append(log->wf, data.data, data.len, &err);
    /* The previous group was synced: its last lsn goes into a slot, made durable by this
     * group's own fdatasync (no extra sync). */
    if (rc == ST_OK)
        rc = ckpt_write(log, log->next_lsn - 1, &err);
    if (rc == ST_OK && log->sync) {
        rc = log->env->ops->sync(log->wf, &err);
        pthread_mutex_lock(&log->mu);
        log->stats.syncs++;
        pthread_mutex_unlock(&log->mu);
    }
    if (rc == ST_OK)
        group_succeeded(log, batch, bytes, n);
    else
        group_failed(log, batch, bytes, rc, &err);
    if (log->group.cap > STO_LOG_QUEUE_BYTES_MAX)
        st_buf_free(&log->group); /* do not keep a huge single append's buffer around */
}

void log_entry_free(log_entry *e) {
    st_buf_free(&e->buf);
    free(e);
}

/* mu held on entry and exit. Takes everything queued as one group, writes it with mu released,
 * then frees or wakes its entries. The caller has checked that no group is being written. */
void log_run_group_locked(sto_log *log) {
    log_entry *batch = log->head;
    log->head = log->tail = NULL;
    log->writing = true;
    log->writer = pthread_self();
    pthread_mutex_unlock(&log->mu);
    group_commit(log, batch);
    size_t freed = 0;
    log_entry *waiters = NULL;
    for (log_entry *e = batch, *next; e; e = next) {
        next = e->next;
        freed += e->buf.len;
        if (e->waiter) {
            e->next = waiters;
            waiters = e;
        } else {
            log_entry_free(e);
        }
    }
    pthread_mutex_lock(&log->mu);
    for (log_entry *e = waiters, *next; e; e = next) {
        next = e->next; /* e may go as soon as mu is released */
        e->finished = true;
        pthread_cond_signal(e->waiter);
    }
    log->queued_bytes -= freed;
    log->writing = false;
    pthread_cond_broadcast(&log->space_cv);
}

/* mu held, no group being written: wakes whoever should write what is queued next — the
 * appender of the first entry when it waits in sto_log_append_wait (no thread switch to the
 * commit thread), else the commit thread (also when closing, so it can finish). */
void log_hand_off_locked(sto_log *log) {
    if (log->head && log->head->waiter)
        pthread_cond_signal(log->head->waiter);
    else if (log->head || log->closing)
        pthread_cond_signal(&log->work_cv);
}

/* Writes the checkpoint of the last synced group and syncs it (the writer: whoever set
 * writing, or the closer after the commit thread ended). A failure abandons the segment, as a
 * failed group does, so nothing is written after bytes whose state is unknown. */
static void ckpt_sync(sto_log *log, uint64_t lsn) {
    st_err err;
    st_err_clear(&err);
    st_code rc = ckpt_write(log, lsn, &err);
    if (rc == ST_OK)
        rc = log->env->ops->sync(log->wf, &err);
    pthread_mutex_lock(&log->mu);
    log->stats.ckpt_syncs++;
    pthread_mutex_unlock(&log->mu);
    if (rc == ST_OK)
        return;
    st_log(ST_LOG_WARN, "log", "event=checkpoint_failed code=%s msg=\"%s\"", st_code_name(rc),
           err.msg);
    log_writer_close_file(log);
    log->wstate = W_NEW_SEGMENT;
}

/* mu held: a checkpoint is worth a sync of its own: the last group is synced but no slot names
 * it yet. Writer state is read while no group is being written (the last writer released it
 * under mu). */
static bool ckpt_due_locked(const sto_log *log) {
    return log->sync && log->wckpt && log->wstate == W_OPEN && log->wf &&
           log->durable_lsn > log->ckpt_lsn;
}

/* mu held, no group being written, nothing queued: the log has been idle for a while, so the
 * commit thread takes the writer's part and checkpoints the last group. */
static void ckpt_idle_locked(sto_log *log) {
    uint64_t lsn = log->durable_lsn;
    log->writing = true;
    log->writer = pthread_self();
    pthread_mutex_unlock(&log->mu);
    ckpt_sync(log, lsn);
    pthread_mutex_lock(&log->mu);
    log->writing = false;
    log_hand_off_locked(log);
}

/* mu held: waits for work; when a checkpoint is due, wakes up ckpt_idle_us after the last
 * group to write it if nothing came meanwhile. */
static void commit_wait_locked(sto_log *log) {
    if (log->writing || log->closing || log->ckpt_idle_us < 0 || !ckpt_due_locked(log)) {
        pthread_cond_wait(&log->work_cv, &log->mu);
        return;
    }
    int64_t left = log->last_group_us + log->ckpt_idle_us - st_mono_us();
    if (left <= 0) {
        ckpt_idle_locked(log);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + (left % 1000000) * 1000;
    ts.tv_sec += (time_t)(left / 1000000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&log->work_cv, &log->mu, &ts);
}

void log_ckpt_final(sto_log *log) {
    if (ckpt_due_locked(log)) /* the threads have ended: nobody else touches the log */
        ckpt_sync(log, log->durable_lsn);
}

void *log_commit_main(void *arg) {
    sto_log *log = arg;
    pthread_mutex_lock(&log->mu);
    for (;;) {
        while ((!log->head || log->writing) && !(log->closing && !log->writing))
            commit_wait_locked(log);
        if (!log->head)
            break; /* closing and drained */
        log_run_group_locked(log);
    }
    pthread_mutex_unlock(&log->mu);
    return NULL;
}
