/* log_cursor.c — reading the commit log in order from any position while appends go on
 * (replication, change streams). A cursor sees only records whose done callbacks ran, and takes
 * the log's lock only when it runs out of what it last learned. */
#include "log_impl.h"

#include <inttypes.h>
#include <stdlib.h>

/* ---- cursors ---- */

struct sto_log_cursor {
    sto_log *log;
    uint64_t next_lsn;
    uint64_t seg_first; /* segment open in rd (0 = none) */
    uint64_t off;       /* offset of the next record to read in it */
    uint64_t seg_size;  /* its size when opened (the limit for segments of unknown length) */
    /* Records up to avail_last are durable and in the open segment, as the log said when the
     * cursor last asked it (under its lock) while segs_gen was gen: until either runs out the
     * cursor reads without taking the lock (one lock per run of records, not per record). */
    uint64_t avail_last, gen;
    uint64_t seen_lsn; /* the last record read in the open segment (its first lsn - 1: none) */
    rec_reader rd;
    st_arena arena;
};

st_code sto_log_cursor_open(sto_log *log, uint64_t from_lsn, sto_log_cursor **out, st_err *err) {
    if (from_lsn == 0)
        from_lsn = 1;
    pthread_mutex_lock(&log->mu);
    uint64_t oldest = log->n_segs ? log->segs[0].first_lsn : log->durable_lsn + 1;
    uint64_t readable = log->readable_from;
    pthread_mutex_unlock(&log->mu);
    /* Like trimmed records: recovery found them damaged and skipped them (docs/formats/log.md). */
    if (from_lsn < readable && readable > oldest)
        return st_err_set(err, ST_OUT_OF_RANGE,
                          "commit log records before lsn %" PRIu64
                          " cannot be read (asked from %" PRIu64 "): damaged records among "
                          "them were skipped when the node started, when nobody needed them "
                          "(event=log_damage_skipped)",
                          readable, from_lsn);
    if (from_lsn < oldest)
        return st_err_set(err, ST_OUT_OF_RANGE,
                          "commit log records before lsn %" PRIu64
                          " were trimmed (asked from %" PRIu64 ")",
                          oldest, from_lsn);
    sto_log_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening a log cursor");
    c->log = log;
    c->next_lsn = from_lsn;
    st_arena_init(&c->arena, 4096);
    *out = c;
    return ST_OK;
}

void sto_log_cursor_close(sto_log_cursor *c) {
    if (!c)
        return;
    log_reader_close(&c->rd);
    st_arena_deinit(&c->arena);
    free(c);
}

/* Finds the segment holding the cursor's next lsn and how far it may read in it. */
static st_code cursor_locate(sto_log_cursor *c, log_seg *seg, uint64_t *durable, st_err *err) {
    sto_log *log = c->log;
    st_code rc = ST_OK;
    pthread_mutex_lock(&log->mu);
    *durable = log->durable_lsn;
    c->gen = log->segs_gen;
    ptrdiff_t i = log_segs_find(log, c->next_lsn);
    if (c->next_lsn > log->durable_lsn)
        rc = st_err_set(err, ST_NOT_FOUND, "caught up with the durable end of the log");
    else if (i < 0 || log->segs[i].last_lsn < c->next_lsn)
        rc = st_err_set(err, ST_OUT_OF_RANGE,
                        "commit log record %" PRIu64 " was trimmed while "
                        "the cursor was reading",
                        c->next_lsn);
    else
        *seg = log->segs[i];
    pthread_mutex_unlock(&log->mu);
    return rc;
}

static st_code cursor_switch(sto_log_cursor *c, uint64_t first_lsn, st_err *err) {
    const char *why;
    c->seg_first = 0;
    st_code rc = log_reader_open_seg(&c->rd, c->log, first_lsn, &c->seg_size, &why, err);
    if (rc != ST_OK)
        return rc;
    if (why)
        return st_err_set(err, ST_DATA_LOSS, "commit log segment %s: %s", c->rd.path, why);
    c->seg_first = first_lsn;
    c->off = c->rd.data_off;
    c->seen_lsn = first_lsn - 1;
    return ST_OK;
}

/* Asks the log how far the cursor may read without asking again, opening the segment that
 * holds its next lsn. */
static st_code cursor_refresh(sto_log_cursor *c, st_err *err) {
    log_seg seg = {0};
    uint64_t durable = 0;
    c->avail_last = 0;
    st_code rc = cursor_locate(c, &seg, &durable, err);
    if (rc == ST_OK && seg.first_lsn != c->seg_first) {
        rc = cursor_switch(c, seg.first_lsn, err);
        /* Damaged records recovery skipped lie before skip_off: read from there (cursors never
         * ask for the records before skip_lsn, see sto_log_cursor_open). */
        if (rc == ST_OK && seg.skip_lsn && c->next_lsn >= seg.skip_lsn) {
            c->off = seg.skip_off;
            c->seen_lsn = seg.skip_lsn - 1;
        }
    }
    if (rc != ST_OK)
        return rc;
    /* Only the durable part of the segment; an old segment of unknown extent is read up to its
     * size, and lsns keep the cursor from going past its last needed record. */
    c->rd.limit = seg.good_bytes != UINT64_MAX ? seg.good_bytes : c->seg_size;
    c->avail_last = durable < seg.last_lsn ? durable : seg.last_lsn;
    return ST_OK;
}

/* A bad record at c->off while the cursor walks from its segment's start to the record it was
 * asked for: one below it, which this reader does not need (records in a segment older than the
 * one recovery started reading in were not checked at the start: docs/formats/log.md). Goes on at
 * the first good record of a later group after it, when that one is not past the wanted record;
 * else ST_DATA_LOSS, as for any bad record. */
static st_code cursor_seek_past(sto_log_cursor *c, const char *why, st_err *err) {
    bool found = false;
    uint64_t at = 0;
    rec_view v = {0};
    st_code rc = log_later_group_find(&c->rd, c->off, c->seen_lsn, &found, &at, &v, err);
    if (rc != ST_OK)
        return rc;
    if (!found || v.lsn > c->next_lsn) {
        c->avail_last = 0; /* ask the log again next time */
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s at offset %" PRIu64 " (lsn %" PRIu64
                          ") while seeking lsn %" PRIu64 ", and no good record of a later group "
                          "up to it follows",
                          c->rd.path, why, c->off, c->seen_lsn + 1, c->next_lsn);
    }
    st_log(ST_LOG_WARN, "log",
           "event=log_damage_passed segment=%s bad_offset=%" PRIu64 " resume_offset=%" PRIu64
           " first_lsn=%" PRIu64 " last_lsn=%" PRIu64 " reading_from=%" PRIu64
           " reason=\"%s\" msg=\"a reader went past damaged commit log records below the ones "
           "it reads\"",
           c->rd.path, c->off, at, c->seen_lsn + 1, v.lsn - 1, c->next_lsn, why);
    c->off = at;
    c->seen_lsn = v.lsn - 1;
    return ST_OK;
}

/* A bad record at c->off that starts a hole (damaged records skipped with accept_data_loss
 * although a log holder needed them: log_hole): goes on at the good record after it, the records
 * the reader wanted in it being lost (said at ERROR: a peer cluster lacks their rows). false when
 * no hole starts there. Holes are fixed once recovery is over: read without the lock. */
static bool cursor_jump_hole(sto_log_cursor *c) {
    const log_hole *h = NULL;
    for (size_t i = 0; i < c->log->n_holes && !h; i++)
        if (c->log->holes[i].lsn == c->seen_lsn + 1 && c->log->holes[i].seg_first == c->seg_first)
            h = &c->log->holes[i];
    if (!h)
        return false;
    if (c->next_lsn < h->next_lsn) {
        uint64_t lost = c->next_lsn > h->lsn ? c->next_lsn : h->lsn;
        st_log(ST_LOG_ERROR, "log",
               "event=log_hole_passed segment=%s bad_offset=%" PRIu64 " resume_offset=%" PRIu64
               " first_lsn=%" PRIu64 " last_lsn=%" PRIu64 " msg=\"a reader (a peer cluster's "
               "shipper) went past damaged commit log records skipped with --accept-data-loss: "
               "the peer lacks lsn %" PRIu64 "..%" PRIu64 "; copy the affected tables to it "
               "(backup and restore)\"",
               c->rd.path, c->off, h->off, h->lsn, h->next_lsn - 1, lost, h->next_lsn - 1);
        c->next_lsn = h->next_lsn;
    }
    c->off = h->off;
    c->seen_lsn = h->next_lsn - 1;
    return true;
}

st_code sto_log_cursor_next_raw(sto_log_cursor *c, uint64_t *lsn, st_slice *payload, st_err *err) {
    if (c->next_lsn > c->avail_last ||
        __atomic_load_n(&c->log->segs_gen, __ATOMIC_ACQUIRE) != c->gen) {
        st_code rc = cursor_refresh(c, err);
        if (rc != ST_OK)
            return rc;
    }
    for (;;) {
        rec_status st = REC_BAD;
        rec_view v = {0};
        st_code rc;
        if (c->off > c->rd.limit)
            v.why = "read position past the end of the segment";
        else if ((rc = log_reader_next(&c->rd, c->off, &st, &v, err)) != ST_OK)
            return rc;
        if (st == REC_OK && v.lsn > c->next_lsn)
            st = REC_BAD, v.why = "lsn gap";
        if (st == REC_BAD && cursor_jump_hole(c))
            continue;
        if (st == REC_BAD && c->seen_lsn + 1 < c->next_lsn) {
            if ((rc = cursor_seek_past(c, v.why, err)) != ST_OK)
                return rc;
            continue;
        }
        if (st != REC_OK) {
            c->avail_last = 0; /* ask the log again next time */
            return st_err_set(
                err, ST_DATA_LOSS,
                "commit log segment %s: %s at offset %" PRIu64 " while reading lsn %" PRIu64,
                c->rd.path, st == REC_END ? "end of segment" : v.why, c->off, c->next_lsn);
        }
        c->off = v.next_off;
        c->seen_lsn = v.lsn;
        if (v.lsn < c->next_lsn)
            continue; /* skipping from the segment start to from_lsn */
        *lsn = v.lsn;
        *payload = v.payload;
        c->next_lsn++;
        return ST_OK;
    }
}

st_code sto_log_cursor_next(sto_log_cursor *c, sto_log_record *rec, st_err *err) {
    uint64_t lsn = 0;
    st_slice payload;
    st_code rc = sto_log_cursor_next_raw(c, &lsn, &payload, err);
    if (rc != ST_OK)
        return rc;
    st_arena_deinit(&c->arena);
    if (!sto_row_mut_decode(payload, &rec->row, &c->arena)) {
        c->next_lsn--; /* as before: the cursor reports data loss from here on */
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log record %" PRIu64 " in %s does not "
                          "decode as a row mutation",
                          lsn, c->rd.path);
    }
    rec->lsn = lsn;
    return ST_OK;
}
