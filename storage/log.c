/* log.c — the node's commit log: segments of checksummed records, a commit thread doing group
 * commit, recovery with torn-tail handling, trimming and cursors. Format: docs/formats/log.md.
 *
 * Threads. Appenders encode their rows and queue them (bounded by STO_LOG_QUEUE_BYTES_MAX). One
 * commit thread takes everything queued as a group, assigns lsns, writes the group with one
 * write and one fdatasync, runs the done callbacks in order and only then publishes the new
 * durable end to cursors. The writer state (open file, next lsn) belongs to the commit thread;
 * sto_log_replay may touch it only before the first append. Everything else is under `mu`. */
#include "log.h"
#include "rowmut.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOG_SEG_MAGIC 0x474c5453u /* "STLG" */
#define LOG_SEG_VERSION 3u        /* 3: the header records the segment's reserved size */
#define LOG_SEG_VERSION_V2 2u     /* read too: its reserved size is unknown */
#define LOG_SEG_HDR_BYTES 24
#define LOG_REC_HDR_BYTES 24
#define LOG_SEGMENTS_MAX 65536 /* live segments; trim keeps far fewer */
#define LOG_PATH_MAX 4096
#define LOG_READ_CHUNK ((size_t)256 << 10) /* read-ahead of the record reader */
#define LOG_NAME_DIGITS 20

_Static_assert(LOG_SEG_HDR_BYTES == 4 + 4 + 8 + 4 + 4, "segment header layout");
_Static_assert(STO_LOG_SEGMENT_BYTES_MAX <= UINT32_MAX, "segment size fits its u32 field");
_Static_assert(LOG_REC_HDR_BYTES == 4 + 4 + 8 + 8, "record header layout");
_Static_assert(STO_LOG_RECORD_BYTES_MAX <= UINT32_MAX, "record length fits its u32 field");

/* One segment file. last_lsn is the last record readers may see (first_lsn - 1 when none);
 * good_bytes ends that record, UINT64_MAX when unknown (an old segment not scanned: read it by
 * lsn up to last_lsn). */
typedef struct log_seg {
    uint64_t first_lsn;
    uint64_t last_lsn;
    uint64_t good_bytes;
    uint64_t bytes; /* file size as far as known, for sto_log_bytes */
} log_seg;

/* One sto_log_append call: its framed records, lsn and crc filled in by the commit thread. */
typedef struct log_entry {
    struct log_entry *next;
    sto_log_done_fn done;
    void *arg;
    size_t n_records;
    uint64_t first_lsn;
    st_buf buf;
    /* sto_log_append_wait: the entry lives on its appender's stack; waiter is signalled when the
     * group holding it finished (finished set) or when the appender may lead the next group. */
    pthread_cond_t *waiter;
    bool finished; /* under mu */
} log_entry;

typedef enum log_wstate {
    W_UNPOSITIONED, /* neither replayed nor appended yet */
    W_REOPEN,       /* positioned at the clean end (wbytes) of the last segment, not open yet */
    W_NEW_SEGMENT,  /* the next group goes into a new segment named next_lsn */
    W_OPEN,
} log_wstate;

struct sto_log {
    st_env *env;
    bool sync;
    bool accept_data_loss;
    size_t segment_bytes;
    char dir[LOG_PATH_MAX];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* commit thread: entries queued or closing */
    pthread_cond_t space_cv; /* appenders: queue room */

    /* Under mu. */
    log_seg *segs;
    size_t n_segs, cap_segs;
    log_entry *head, *tail;
    size_t queued_bytes;  /* queued and in flight */
    uint64_t durable_lsn; /* published to cursors after the done callbacks */
    bool closing, appends_started, replaying;
    /* Bumped (atomically, under mu) whenever segments leave the list or one is replaced, so a
     * cursor can keep reading without the lock until the list changes under it. */
    uint64_t segs_gen;
    /* A group is being written, by the commit thread or by a leading sto_log_append_wait caller
     * (writer); the writer state below belongs to whoever set this. */
    bool writing;
    pthread_t writer;
    st_code failed; /* sticky: positioning found the last segment corrupt */
    /* Trimmed segments whose files are still to be removed (first lsns, oldest first), by the
     * remover thread (started by the first trim) or, when it cannot start, by the trimmer. */
    uint64_t *rm;
    size_t n_rm, cap_rm;
    uint64_t rm_asked, rm_done; /* removals ever queued / finished (done or given up) */
    uint64_t rm_failed_at;      /* rm_done after the last batch that failed (0: none) */
    st_code rm_code;            /* that failure */
    st_err rm_err;
    bool rm_started;
    pthread_t rm_thread;
    pthread_cond_t rm_cv;      /* remover: removals queued or closing */
    pthread_cond_t rm_done_cv; /* sto_log_trim(_wait) callers: a batch finished */
    st_err failed_err;
    sto_log_stats stats;

    /* The current writer only (see writing; sto_log_replay before any append). */
    log_wstate wstate;
    st_wfile *wf;
    uint64_t next_lsn;
    uint64_t wbytes; /* bytes written to the open segment */
    st_buf group;
};

/* ---- paths and headers ---- */

static void seg_path(const sto_log *log, uint64_t first_lsn, char *out) {
    /* sto_log_open checked that the directory leaves room for the name. */
    int n = snprintf(out, LOG_PATH_MAX, "%s/%020" PRIu64 ".log", log->dir, first_lsn);
    ST_ASSERT(n > 0 && n < LOG_PATH_MAX);
}

/* reserved: the file's preallocated size, 0 when it could not be reserved. */
static void seg_header_make(uint8_t *h, uint64_t first_lsn, uint32_t reserved) {
    st_put_fixed32(h, LOG_SEG_MAGIC);
    st_put_fixed32(h + 4, LOG_SEG_VERSION);
    st_put_fixed64(h + 8, first_lsn);
    st_put_fixed32(h + 16, reserved);
    st_put_fixed32(h + 20, st_crc_mask(st_crc32c(0, h, 20)));
}

/* Checks a header read from disk (version 3, or 2 whose reserved size is unknown: *reserved 0);
 * on failure returns false with the reason in why. */
static bool seg_header_ok(const uint8_t *h, size_t got, uint64_t first_lsn, uint64_t *reserved,
                          const char **why) {
    uint32_t version = got >= LOG_SEG_HDR_BYTES ? st_get_fixed32(h + 4) : 0;
    size_t crc_at = version == LOG_SEG_VERSION_V2 ? 16 : 20;
    *reserved = 0;
    if (got < LOG_SEG_HDR_BYTES)
        *why = "truncated segment header";
    else if (st_get_fixed32(h) != LOG_SEG_MAGIC)
        *why = "bad magic in segment header";
    else if (st_crc_unmask(st_get_fixed32(h + crc_at)) != st_crc32c(0, h, crc_at))
        *why = "checksum mismatch in segment header";
    else if (version != LOG_SEG_VERSION && version != LOG_SEG_VERSION_V2)
        *why = "unknown segment format version";
    else if (st_get_fixed64(h + 8) != first_lsn)
        *why = "segment header names a different first lsn than the file name";
    else {
        *reserved = version == LOG_SEG_VERSION ? st_get_fixed32(h + 16) : 0;
        return true;
    }
    return false;
}

/* ---- record reader: sequential reads through a read-ahead window ---- */

typedef struct rec_reader {
    st_env *env;
    st_rfile *f;
    char path[LOG_PATH_MAX];
    uint64_t limit;    /* bytes that may be read */
    uint64_t reserved; /* the open segment's preallocated size from its header (0: unknown) */
    uint64_t win_off;  /* file offset of win.data[0] */
    st_buf win;
} rec_reader;

typedef enum rec_status { REC_OK, REC_END, REC_BAD } rec_status;

/* One record as read: lsn, payload (valid until the next read), and where the next one starts. */
typedef struct rec_view {
    uint64_t lsn;
    uint64_t group_first; /* first lsn of the group the record was written with */
    st_slice payload;
    uint64_t next_off;
    const char *why; /* REC_BAD: what was wrong */
} rec_view;

static void reader_close(rec_reader *r) {
    if (r->f)
        r->env->ops->rclose(r->f);
    r->f = NULL;
    st_buf_free(&r->win);
    r->win_off = 0;
}

static st_code reader_open(rec_reader *r, st_env *env, const char *path, st_err *err) {
    reader_close(r);
    r->env = env;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->limit = 0;
    r->reserved = 0;
    return env->ops->ropen(env, path, &r->f, err);
}

/* Makes [off, off + n) available in the window; *out is NULL when the file is shorter. */
static st_code reader_fill(rec_reader *r, uint64_t off, size_t n, const uint8_t **out,
                           st_err *err) {
    if (off >= r->win_off && off - r->win_off + n <= r->win.len) {
        *out = r->win.data + (off - r->win_off);
        return ST_OK;
    }
    size_t want = n > LOG_READ_CHUNK ? n : LOG_READ_CHUNK;
    if (want > r->limit - off)
        want = (size_t)(r->limit - off);
    st_buf_reset(&r->win);
    r->win_off = off;
    if (st_buf_reserve(&r->win, want) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading log segment %s",
                          r->path);
    size_t got = 0;
    st_code rc = r->env->ops->pread(r->f, off, r->win.data, want, &got, err);
    if (rc != ST_OK)
        return rc;
    r->win.len = got;
    *out = got >= n ? r->win.data : NULL;
    return ST_OK;
}

/* Reads the record at off (callers guarantee off <= limit). I/O errors are returned; a record
 * that is short, too long or fails its checksum is REC_BAD, the exact end is REC_END. */
static st_code reader_next(rec_reader *r, uint64_t off, rec_status *st, rec_view *v, st_err *err) {
    const uint8_t *h = NULL;
    *st = REC_BAD;
    if (off == r->limit) {
        *st = REC_END;
        return ST_OK;
    }
    if (r->limit - off < LOG_REC_HDR_BYTES) {
        v->why = "truncated record header";
        return ST_OK;
    }
    st_code rc = reader_fill(r, off, LOG_REC_HDR_BYTES, &h, err);
    if (rc != ST_OK || !h) {
        v->why = "file shorter than expected";
        return rc;
    }
    uint32_t len = st_get_fixed32(h + 4);
    if (len > STO_LOG_RECORD_BYTES_MAX || len > r->limit - off - LOG_REC_HDR_BYTES) {
        v->why = len > STO_LOG_RECORD_BYTES_MAX ? "record length too large" : "truncated record";
        return ST_OK;
    }
    rc = reader_fill(r, off, LOG_REC_HDR_BYTES + (size_t)len, &h, err);
    if (rc != ST_OK || !h) {
        v->why = "file shorter than expected";
        return rc;
    }
    if (st_crc_unmask(st_get_fixed32(h)) !=
        st_crc32c(0, h + 4, LOG_REC_HDR_BYTES - 4 + (size_t)len)) {
        v->why = "record checksum mismatch";
        return ST_OK;
    }
    v->lsn = st_get_fixed64(h + 8);
    v->group_first = st_get_fixed64(h + 16);
    v->payload = st_slice_make(h + LOG_REC_HDR_BYTES, len);
    v->next_off = off + LOG_REC_HDR_BYTES + len;
    *st = REC_OK;
    return ST_OK;
}

/* Opens a segment for reading and checks its header; *bad_why set (rc OK) when it is bad. */
static st_code reader_open_seg(rec_reader *r, sto_log *log, uint64_t first_lsn, uint64_t *size,
                               const char **bad_why, st_err *err) {
    char path[LOG_PATH_MAX];
    seg_path(log, first_lsn, path);
    *bad_why = NULL;
    st_code rc = reader_open(r, log->env, path, err);
    if (rc == ST_OK)
        rc = log->env->ops->rsize(r->f, size, err);
    if (rc != ST_OK)
        return rc;
    r->limit = *size;
    const uint8_t *h = NULL;
    size_t n = *size < LOG_SEG_HDR_BYTES ? (size_t)*size : LOG_SEG_HDR_BYTES;
    if (n > 0 && (rc = reader_fill(r, 0, n, &h, err)) != ST_OK)
        return rc;
    if (!h || !seg_header_ok(h, n, first_lsn, &r->reserved, bad_why))
        *bad_why = *bad_why ? *bad_why : "truncated segment header";
    return ST_OK;
}

/* ---- scanning segments (replay and positioning) ---- */

typedef st_code (*replay_fn)(const sto_log_record *rec, void *arg);

typedef struct scan_result {
    uint64_t last_lsn;   /* last good record (first_lsn - 1 when none) */
    uint64_t good_bytes; /* end of that record; 0 when the header is bad */
    uint64_t file_bytes;
    /* The last segment has bytes other than reserved zeros after good_bytes (or was cut short):
     * appends go to a new segment. Not torn: they continue at good_bytes. */
    bool torn;
} scan_result;

typedef struct scan_ctx {
    sto_log *log;
    rec_reader rd;
    st_arena arena;
    uint64_t from_lsn;
    replay_fn fn;
    void *arg;
    bool dropped; /* a cut-short last segment's loss was accepted */
} scan_ctx;

static st_code scan_deliver(scan_ctx *c, const rec_view *v, st_err *err) {
    sto_log_record rec = {.lsn = v->lsn};
    st_arena_deinit(&c->arena);
    if (!sto_row_mut_decode(v->payload, &rec.row, &c->arena))
        return st_err_set(err, ST_DATA_LOSS,
                          "log record lsn %" PRIu64 " in %s has a good checksum but does not "
                          "decode as a row mutation; restore the node from a replica",
                          v->lsn, c->rd.path);
    st_code rc = c->fn(&rec, c->arg);
    if (rc != ST_OK && err && err->code != rc)
        st_err_set(err, rc, "log replay stopped by its callback at lsn %" PRIu64 " (%s)", v->lsn,
                   st_code_name(rc));
    return rc;
}

/* True when the segment open in r begins with a header's worth of zero bytes: reserved space
 * (sto_log preallocates segments) whose header was never written. */
static bool seg_header_zero(rec_reader *r) {
    const uint8_t *h = NULL;
    st_err e;
    if (r->limit < LOG_SEG_HDR_BYTES || reader_fill(r, 0, LOG_SEG_HDR_BYTES, &h, &e) != ST_OK || !h)
        return false;
    for (size_t i = 0; i < LOG_SEG_HDR_BYTES; i++)
        if (h[i] != 0)
            return false;
    return true;
}

/* Moves *y to the first offset at or after it where a record with a nonzero lsn could start
 * (its lsn field, bytes 8..15, holds a nonzero byte), so zero tails of preallocated segments are
 * crossed a window at a time; *y ends past limit - LOG_REC_HDR_BYTES when there is none. */
static st_code tail_skip_zeros(rec_reader *r, uint64_t *y, st_err *err) {
    while (*y <= r->limit && r->limit - *y >= LOG_REC_HDR_BYTES) {
        const uint8_t *p = NULL;
        size_t m;
        if (*y >= r->win_off && *y - r->win_off + LOG_REC_HDR_BYTES <= r->win.len) {
            /* what the window already holds: no re-read per offset */
            p = r->win.data + (*y - r->win_off);
            m = r->win.len - (size_t)(*y - r->win_off);
        } else {
            uint64_t left = r->limit - *y;
            m = left < LOG_READ_CHUNK ? (size_t)left : LOG_READ_CHUNK;
            st_code rc = reader_fill(r, *y, m, &p, err);
            if (rc != ST_OK)
                return rc;
            if (!p) {
                *y = r->limit; /* the file shrank under us: nothing more to read */
                return ST_OK;
            }
        }
        for (size_t i = 8; i < m; i++)
            if (p[i] != 0) {
                *y += i >= 16 ? i - 15 : 0;
                return ST_OK;
            }
        *y += m - 15; /* no start up to y + m - 16 has a nonzero lsn byte */
    }
    return ST_OK;
}

/* True when the header at h could be a record of a group after the torn one that starts at
 * torn_first at offset bad_off: its group begins later, it is not before its group, and the
 * records torn_first .. lsn-1 (each at least a header long) fit between bad_off and y. */
static bool tail_later_group(const uint8_t *h, uint64_t y, uint64_t bad_off, uint64_t torn_first,
                             uint64_t limit) {
    uint64_t lsn = st_get_fixed64(h + 8), group_first = st_get_fixed64(h + 16);
    uint32_t len = st_get_fixed32(h + 4);
    return group_first > torn_first && group_first <= lsn &&
           lsn - torn_first <= (y - bad_off) / LOG_REC_HDR_BYTES &&
           len <= STO_LOG_RECORD_BYTES_MAX && len <= limit - y - LOG_REC_HDR_BYTES;
}

/* The last segment has a bad record at bad_off after good records up to lsn last. A crash during
 * a group's write (before its fdatasync returned: never acknowledged) leaves any mix of good and
 * bad records of that one group, but a group is written only after the previous one's sync
 * returned. So a good record of a LATER group anywhere after bad_off proves the bad record was
 * durable and acknowledged: corruption, ST_DATA_LOSS. Records may start at any offset, so every
 * offset is tried (cheap header checks first, then the checksum); the work is bounded by the
 * segment's size, and zero runs (preallocation) are skipped in bulk. */
static st_code tail_check(scan_ctx *c, uint64_t bad_off, uint64_t last, const char *bad_why,
                          st_err *err) {
    rec_reader *r = &c->rd;
    uint64_t torn_first = last + 1;
    for (uint64_t y = bad_off + 1;; y++) {
        st_code rc = tail_skip_zeros(r, &y, err);
        if (rc != ST_OK)
            return rc;
        if (y > r->limit || r->limit - y < LOG_REC_HDR_BYTES)
            return ST_OK; /* a torn tail: nothing of a later group follows */
        const uint8_t *h = NULL;
        if ((rc = reader_fill(r, y, LOG_REC_HDR_BYTES, &h, err)) != ST_OK)
            return rc;
        if (!h)
            return ST_OK;
        if (!tail_later_group(h, y, bad_off, torn_first, r->limit))
            continue;
        rec_status st;
        rec_view v = {0};
        if ((rc = reader_next(r, y, &st, &v, err)) != ST_OK)
            return rc;
        if (st != REC_OK)
            continue;
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s at offset %" PRIu64 " (lsn %" PRIu64
                          " expected), but a good record of a later group (lsn %" PRIu64
                          ", group from lsn %" PRIu64 ") follows at offset %" PRIu64
                          ": acknowledged records are damaged, not a torn tail; restore the "
                          "node from a replica",
                          r->path, bad_why, bad_off, torn_first, v.lsn, v.group_first, y);
    }
}

/* Sets *zero when every byte of [off, limit) is zero: reserved space no record reached. */
static st_code tail_zero(rec_reader *r, uint64_t off, bool *zero, st_err *err) {
    *zero = true;
    while (off < r->limit) {
        uint64_t left = r->limit - off;
        size_t m = left < LOG_READ_CHUNK ? (size_t)left : LOG_READ_CHUNK;
        const uint8_t *p = NULL;
        st_code rc = reader_fill(r, off, m, &p, err);
        if (rc != ST_OK || !p)
            return rc; /* !p: the file shrank under us, nothing more to read */
        for (size_t i = 0; i < m; i++)
            if (p[i] != 0) {
                *zero = false;
                return ST_OK;
            }
        off += m;
    }
    return ST_OK;
}

/* The last segment is shorter than the size its header says it was created with. Appends never
 * shrink a file and a torn write inside reserved space does not change its size, so something
 * else cut it. Records before good_bytes are whole; if only zeros lie between them and the cut,
 * no record was lost. Otherwise the records from lsn last_lsn + 1 on are: ST_DATA_LOSS, unless
 * the log accepts the loss (then it is logged and appends go to a new segment). */
static st_code scan_cut_short(scan_ctx *c, scan_result *res, bool zero_tail, st_err *err) {
    const char *path = c->rd.path;
    uint64_t x = res->good_bytes, f = res->file_bytes, want = c->rd.reserved, l = res->last_lsn;
    res->torn = true; /* never append to a cut file: its size no longer says anything */
    if (x < f && zero_tail) {
        st_log(ST_LOG_WARN, "log",
               "event=log_segment_short segment=%s file_bytes=%" PRIu64 " created_bytes=%" PRIu64
               " last_lsn=%" PRIu64 " msg=\"the segment was cut short but only reserved space "
               "after its last record went: no record lost\"",
               path, f, want, l);
        return ST_OK;
    }
    if (!c->log->accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s is %" PRIu64 " bytes, created as %" PRIu64
                          ": cut short. Records up to lsn %" PRIu64 " (ending at byte %" PRIu64
                          ") are intact; lsn %" PRIu64 " and later, in bytes %" PRIu64 "..%" PRIu64
                          ", are lost. Restore the file or the node from a replica, or start "
                          "with --accept-data-loss to drop them",
                          path, f, want, l, x, l + 1, x, want);
    st_log(
        ST_LOG_ERROR, "log",
        "event=log_data_loss_accepted segment=%s file_bytes=%" PRIu64 " created_bytes=%" PRIu64
        " kept_last_lsn=%" PRIu64 " kept_bytes=%" PRIu64 " dropped_from_lsn=%" PRIu64
        " dropped_cut_bytes=%" PRIu64 " missing_bytes=%" PRIu64 " dropped_records=%s "
        "msg=\"the segment was cut short: records after lsn %" PRIu64 " are dropped (the "
        "number past the cut is unknown: their bytes are gone); appends continue from lsn %" PRIu64
        " in a new segment\"",
        path, f, want, l, x, l + 1, f - x, want - f, x < f ? "at_least_1" : "unknown", l, l + 1);
    c->dropped = true;
    return ST_OK;
}

/* Reads one segment's records in order. For a non-last segment, records first..stop_lsn must all
 * be good and later bytes are ignored; in the last segment the first bad record ends the log,
 * unless a good record of a later group follows it (tail_check). */
static st_code scan_segment(scan_ctx *c, uint64_t first_lsn, bool is_last, uint64_t stop_lsn,
                            scan_result *res, st_err *err) {
    const char *why;
    memset(res, 0, sizeof *res);
    res->last_lsn = first_lsn - 1;
    st_code rc = reader_open_seg(&c->rd, c->log, first_lsn, &res->file_bytes, &why, err);
    if (rc != ST_OK)
        return rc;
    if (why && is_last && (res->file_bytes <= LOG_SEG_HDR_BYTES || seg_header_zero(&c->rd))) {
        /* A crash while the segment was being created (its space may have been reserved
         * already): records go in only after the header is durable, so it holds none. */
        res->torn = true;
        return ST_OK;
    }
    if (why)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s; restore the node from "
                          "a replica",
                          c->rd.path, why);
    uint64_t off = LOG_SEG_HDR_BYTES;
    res->good_bytes = off;
    for (uint64_t expect = first_lsn; is_last || expect <= stop_lsn; expect++) {
        rec_status st;
        rec_view v = {0};
        if ((rc = reader_next(&c->rd, off, &st, &v, err)) != ST_OK)
            return rc;
        if (st == REC_OK && v.lsn != expect) {
            st = REC_BAD;
            v.why = "record has an unexpected lsn";
        }
        if (st != REC_OK && is_last) {
            if (st == REC_BAD && (rc = tail_check(c, off, expect - 1, v.why, err)) != ST_OK)
                return rc;
            break;
        }
        if (st == REC_END)
            return st_err_set(err, ST_DATA_LOSS,
                              "commit log segment %s ends after lsn %" PRIu64
                              " but the next segment starts at lsn %" PRIu64 ": records are "
                              "missing; restore the node from a replica",
                              c->rd.path, expect - 1, stop_lsn + 1);
        if (st == REC_BAD)
            return st_err_set(err, ST_DATA_LOSS,
                              "commit log segment %s: %s at offset %" PRIu64 " (lsn %" PRIu64
                              " expected) before the end of the log; restore "
                              "the node from a replica",
                              c->rd.path, v.why, off, expect);
        if (c->fn && v.lsn >= c->from_lsn && (rc = scan_deliver(c, &v, err)) != ST_OK)
            return rc;
        res->last_lsn = v.lsn;
        off = res->good_bytes = v.next_off;
    }
    if (!is_last)
        return ST_OK;
    bool zero = true;
    if ((rc = tail_zero(&c->rd, res->good_bytes, &zero, err)) != ST_OK)
        return rc;
    res->torn = !zero;
    if (c->rd.reserved > 0 && res->file_bytes < c->rd.reserved)
        return scan_cut_short(c, res, zero, err);
    return ST_OK;
}

/* ---- the segment list (under mu) ---- */

static bool segs_push(sto_log *log, log_seg s) {
    if (log->n_segs == log->cap_segs) {
        size_t cap = log->cap_segs ? log->cap_segs * 2 : 16;
        log_seg *v = realloc(log->segs, cap * sizeof *v);
        if (!v)
            return false;
        log->segs = v;
        log->cap_segs = cap;
    }
    log->segs[log->n_segs++] = s;
    return true;
}

/* Index of the segment that holds lsn (the last one starting at or before it), or -1. */
static ptrdiff_t segs_find(const sto_log *log, uint64_t lsn) {
    size_t lo = 0, hi = log->n_segs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (log->segs[mid].first_lsn <= lsn)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

/* "<20 digits>.log" → its first lsn; 0 for any other name. */
static uint64_t seg_name_lsn(const char *name) {
    if (strlen(name) != LOG_NAME_DIGITS + 4 || strcmp(name + LOG_NAME_DIGITS, ".log") != 0)
        return 0;
    uint64_t v = 0;
    for (int i = 0; i < LOG_NAME_DIGITS; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(name[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    return v;
}

static st_code list_one(const char *name, void *arg) {
    sto_log *log = arg;
    uint64_t lsn = seg_name_lsn(name);
    if (lsn == 0)
        return ST_OK; /* not a segment (a temporary or foreign file) */
    if (log->n_segs >= LOG_SEGMENTS_MAX || !segs_push(log, (log_seg){lsn, 0, UINT64_MAX, 0}))
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

static int seg_cmp(const void *a, const void *b) {
    uint64_t x = ((const log_seg *)a)->first_lsn, y = ((const log_seg *)b)->first_lsn;
    return x < y ? -1 : x > y;
}

/* Lists the segment files at open; non-last segments end where the next begins. */
static st_code segs_load(sto_log *log, st_err *err) {
    st_code rc = log->env->ops->list(log->env, log->dir, list_one, log, err);
    if (rc == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, rc, "commit log %s: more than %d segments or out of memory",
                          log->dir, LOG_SEGMENTS_MAX);
    if (rc != ST_OK)
        return rc;
    if (log->n_segs > 1)
        qsort(log->segs, log->n_segs, sizeof *log->segs, seg_cmp);
    for (size_t i = 0; i < log->n_segs; i++) {
        log_seg *s = &log->segs[i];
        char path[LOG_PATH_MAX];
        seg_path(log, s->first_lsn, path);
        if ((rc = log->env->ops->file_size(log->env, path, &s->bytes, err)) != ST_OK)
            return rc;
        s->last_lsn = i + 1 < log->n_segs ? log->segs[i + 1].first_lsn - 1 : s->first_lsn - 1;
    }
    return ST_OK;
}

/* ---- positioning ---- */

/* Sets the writer after a scan of the last segment (or an empty directory). */
static void position_apply(sto_log *log, bool have_seg, const scan_result *res) {
    pthread_mutex_lock(&log->mu);
    if (!have_seg || log->n_segs == 0) {
        log->next_lsn = log->durable_lsn + 1;
        log->wstate = W_NEW_SEGMENT;
    } else {
        log_seg *s = &log->segs[log->n_segs - 1];
        s->last_lsn = res->last_lsn;
        s->good_bytes = res->good_bytes;
        s->bytes = res->file_bytes;
        log->durable_lsn = res->last_lsn;
        log->next_lsn = res->last_lsn + 1;
        log->wbytes = res->good_bytes;
        /* Appending after the last record needs a way to write inside the file when zeros
         * follow it (wopen_at); a torn tail is never overwritten. */
        bool reopen = !res->torn && res->good_bytes >= LOG_SEG_HDR_BYTES &&
                      (res->good_bytes == res->file_bytes || log->env->ops->wopen_at);
        log->wstate = reopen ? W_REOPEN : W_NEW_SEGMENT;
    }
    pthread_mutex_unlock(&log->mu);
}

/* Scans only the last segment to find where appends go (appends without a replay). */
static st_code position_lazily(sto_log *log, st_err *err) {
    pthread_mutex_lock(&log->mu);
    bool have = log->n_segs > 0;
    uint64_t first = have ? log->segs[log->n_segs - 1].first_lsn : 0;
    pthread_mutex_unlock(&log->mu);
    scan_result res = {0};
    st_code rc = ST_OK;
    if (have) {
        scan_ctx c = {.log = log, .from_lsn = UINT64_MAX};
        st_arena_init(&c.arena, 4096);
        rc = scan_segment(&c, first, true, 0, &res, err);
        reader_close(&c.rd);
        st_arena_deinit(&c.arena);
    }
    if (rc == ST_OK)
        position_apply(log, have, &res);
    return rc;
}

/* ---- the writer (commit thread) ---- */

static void writer_close_file(sto_log *log) {
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
static st_code segment_create(sto_log *log, uint64_t first_lsn, st_err *err) {
    char path[LOG_PATH_MAX];
    uint8_t hdr[LOG_SEG_HDR_BYTES];
    pthread_mutex_lock(&log->mu);
    bool full = log->n_segs >= LOG_SEGMENTS_MAX;
    pthread_mutex_unlock(&log->mu);
    if (full)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "commit log %s has %d segments; flush "
                          "tablets so the log can be trimmed",
                          log->dir, LOG_SEGMENTS_MAX);
    writer_close_file(log);
    seg_path(log, first_lsn, path);
    st_wfile *f;
    uint32_t reserved;
    st_code rc = segment_open_file(log, path, &f, &reserved, err);
    if (rc != ST_OK)
        return rc;
    seg_header_make(hdr, first_lsn, reserved);
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
    log_seg s = {first_lsn, first_lsn - 1, LOG_SEG_HDR_BYTES, LOG_SEG_HDR_BYTES};
    if (log->n_segs > 0 && log->segs[log->n_segs - 1].first_lsn == first_lsn) {
        log->segs[log->n_segs - 1] = s;
        __atomic_add_fetch(&log->segs_gen, 1, __ATOMIC_RELEASE);
    } else {
        ST_ASSERT(log->n_segs == 0 || log->segs[log->n_segs - 1].first_lsn < first_lsn);
        if (!segs_push(log, s))
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
    log->wbytes = LOG_SEG_HDR_BYTES;
    log->wstate = W_OPEN;
    return ST_OK;
}

/* Opens the last segment for appends at wbytes, the end of its last record: only reserved zeros
 * follow it (position_apply checked), which the next group overwrites. */
static st_code writer_reopen(sto_log *log, st_err *err) {
    char path[LOG_PATH_MAX];
    pthread_mutex_lock(&log->mu);
    seg_path(log, log->segs[log->n_segs - 1].first_lsn, path);
    uint64_t size = log->segs[log->n_segs - 1].bytes;
    pthread_mutex_unlock(&log->mu);
    st_code rc = log->env->ops->wopen_at
                     ? log->env->ops->wopen_at(log->env, path, log->wbytes, &log->wf, err)
                     : log->env->ops->wopen_append(log->env, path, &log->wf, err);
    if (rc != ST_OK)
        return rc;
    log->wstate = W_OPEN;
    pthread_mutex_lock(&log->mu);
    log->stats.segments_reused += log->wbytes < size; /* reserved space taken up again */
    pthread_mutex_unlock(&log->mu);
    return ST_OK;
}

/* Gets an open segment with room for group_bytes: positions, reopens or rolls over as needed. */
static st_code writer_ready(sto_log *log, size_t group_bytes, st_err *err) {
    st_code rc = ST_OK;
    if (log->wstate == W_UNPOSITIONED && (rc = position_lazily(log, err)) != ST_OK) {
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
    if (log->wstate == W_OPEN && log->wbytes > LOG_SEG_HDR_BYTES &&
        log->wbytes + group_bytes > log->segment_bytes)
        log->wstate = W_NEW_SEGMENT; /* every record in it is durable: just move on */
    if (log->wstate == W_NEW_SEGMENT)
        rc = segment_create(log, log->next_lsn, err);
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

/* After a successful write + sync: acknowledge in order, then publish to cursors. */
static void group_succeeded(sto_log *log, log_entry *batch, size_t bytes, uint64_t n) {
    log->wbytes += bytes;
    log->next_lsn += n;
    pthread_mutex_lock(&log->mu);
    log->stats.groups++;
    log->stats.records += n;
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
    writer_close_file(log);
    if (log->wstate != W_UNPOSITIONED)
        log->wstate = W_NEW_SEGMENT;
    pthread_mutex_lock(&log->mu);
    if (opened && log->n_segs > 0)
        log->segs[log->n_segs - 1].bytes += bytes;
    log->stats.failed_groups++;
    pthread_mutex_unlock(&log->mu);
    st_log(ST_LOG_WARN, "log", "event=group_failed code=%s msg=\"%s\"", st_code_name(rc), err->msg);
    for (log_entry *e = batch; e; e = e->next)
        if (e->done)
            e->done(rc, 0, err, e->arg);
    if (opened && log->wstate == W_NEW_SEGMENT)
        segment_create(log, log->next_lsn, NULL); /* best effort; retried by the next group */
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

static void entry_free(log_entry *e) {
    st_buf_free(&e->buf);
    free(e);
}

/* mu held on entry and exit. Takes everything queued as one group, writes it with mu released,
 * then frees or wakes its entries. The caller has checked that no group is being written. */
static void run_group_locked(sto_log *log) {
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
            entry_free(e);
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
static void hand_off_locked(sto_log *log) {
    if (log->head && log->head->waiter)
        pthread_cond_signal(log->head->waiter);
    else if (log->head || log->closing)
        pthread_cond_signal(&log->work_cv);
}

static void *commit_main(void *arg) {
    sto_log *log = arg;
    pthread_mutex_lock(&log->mu);
    for (;;) {
        while ((!log->head || log->writing) && !(log->closing && !log->writing))
            pthread_cond_wait(&log->work_cv, &log->mu);
        if (!log->head)
            break; /* closing and drained */
        run_group_locked(log);
    }
    pthread_mutex_unlock(&log->mu);
    return NULL;
}

/* ---- open, close, replay ---- */

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
        rc = segs_load(log, err);
    if (rc == ST_OK && pthread_create(&log->thread, NULL, commit_main, log) != 0)
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
    writer_close_file(log);
    st_buf_free(&log->group);
    free(log->segs);
    free(log->rm);
    pthread_cond_destroy(&log->rm_done_cv);
    pthread_cond_destroy(&log->rm_cv);
    pthread_cond_destroy(&log->space_cv);
    pthread_cond_destroy(&log->work_cv);
    pthread_mutex_destroy(&log->mu);
    free(log);
}

/* Scans segments [i0, n) delivering records >= from_lsn; the last one positions the log. */
static st_code replay_segments(sto_log *log, scan_ctx *c, size_t i0, size_t n, st_err *err) {
    scan_result res = {0};
    for (size_t i = i0; i < n; i++) {
        bool last = i + 1 == n;
        pthread_mutex_lock(&log->mu);
        uint64_t first = log->segs[i].first_lsn;
        uint64_t stop = last ? 0 : log->segs[i + 1].first_lsn - 1;
        pthread_mutex_unlock(&log->mu);
        st_code rc = scan_segment(c, first, last, stop, &res, err);
        if (rc != ST_OK)
            return rc;
        if (!last) {
            pthread_mutex_lock(&log->mu);
            log->segs[i].good_bytes = res.good_bytes;
            pthread_mutex_unlock(&log->mu);
        }
    }
    position_apply(log, n > 0, &res);
    return ST_OK;
}

st_code sto_log_replay(sto_log *log, uint64_t from_lsn,
                       st_code (*fn)(const sto_log_record *rec, void *arg), void *arg,
                       st_err *err) {
    pthread_mutex_lock(&log->mu);
    bool busy = log->appends_started || log->replaying;
    if (!busy)
        log->replaying = true;
    size_t n = log->n_segs;
    ptrdiff_t i0 = segs_find(log, from_lsn);
    pthread_mutex_unlock(&log->mu);
    if (busy)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "commit log %s: replay must come before "
                          "the first append",
                          log->dir);
    scan_ctx c = {.log = log, .from_lsn = from_lsn, .fn = fn, .arg = arg};
    st_arena_init(&c.arena, 4096);
    st_code rc = replay_segments(log, &c, i0 < 0 ? 0 : (size_t)i0, n, err);
    /* An accepted loss starts the next segment now (appends have not started: the writer state
     * is the replay's), so the cut segment is an old one from here on, also if no write comes
     * before the next start, which would otherwise refuse it again. */
    if (rc == ST_OK && c.dropped)
        rc = segment_create(log, log->next_lsn, err);
    reader_close(&c.rd);
    st_arena_deinit(&c.arena);
    pthread_mutex_lock(&log->mu);
    log->replaying = false;
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* ---- appends ---- */

/* Each appending thread keeps its encode buffer between sto_log_append_wait calls (pthread key,
 * freed when the thread ends): a malloc and free of a record-sized buffer per write, and the
 * cold cache lines of a fresh one, were a visible part of an unsynced write's cost. */
#define LOG_ENC_BUF_KEEP_BYTES ((size_t)64 << 10) /* larger buffers are freed, not kept */

static pthread_key_t enc_key;
static bool enc_key_ok;
static pthread_once_t enc_once = PTHREAD_ONCE_INIT;

static void enc_buf_free_at_exit(void *p) {
    st_buf_free(p);
    free(p);
}

static void enc_key_init(void) {
    enc_key_ok = pthread_key_create(&enc_key, enc_buf_free_at_exit) == 0;
}

/* Moves this thread's kept buffer (if any) into *out, emptied. */
static void enc_buf_take(st_buf *out) {
    st_buf_init(out);
    pthread_once(&enc_once, enc_key_init);
    st_buf *kept = enc_key_ok ? pthread_getspecific(enc_key) : NULL;
    if (kept && kept->data) {
        *out = *kept;
        out->len = 0;
        st_buf_init(kept);
    }
}

/* Keeps buf for this thread's next append, or frees it. */
static void enc_buf_give(st_buf *buf) {
    st_buf *kept = enc_key_ok ? pthread_getspecific(enc_key) : NULL;
    if (enc_key_ok && !kept && buf->cap <= LOG_ENC_BUF_KEEP_BYTES &&
        (kept = calloc(1, sizeof *kept)) && pthread_setspecific(enc_key, kept) != 0) {
        free(kept);
        kept = NULL;
    }
    if (!kept || kept->data || buf->cap > LOG_ENC_BUF_KEEP_BYTES) {
        st_buf_free(buf);
        return;
    }
    *kept = *buf;
    kept->len = 0;
    st_buf_init(buf);
}

/* Frames n rows as records with lsn and crc left for the commit thread. */
static st_code entry_encode(log_entry *e, const sto_row_mut *rows, size_t n, st_err *err) {
    for (size_t i = 0; i < n; i++) {
        size_t at = e->buf.len, bound;
        uint8_t zero[LOG_REC_HDR_BYTES] = {0};
        /* One allocation for header and row (the encoder's own reserve then finds room). Best
         * effort: a row the encoder refuses gets its error from the encoder. */
        if (rows[i].n_muts <= STO_ROW_MUTS_MAX && sto_row_mut_bound(&rows[i], &bound) &&
            bound <= STO_LOG_RECORD_BYTES_MAX)
            (void)st_buf_reserve(&e->buf, LOG_REC_HDR_BYTES + bound);
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
        entry_free(e);
        return rc;
    }
    pthread_mutex_lock(&log->mu);
    rc = enqueue_locked(log, e, err);
    if (rc == ST_OK && !log->writing)
        pthread_cond_signal(&log->work_cv); /* else the writer hands off when it finishes */
    pthread_mutex_unlock(&log->mu);
    if (rc != ST_OK)
        entry_free(e);
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
            run_group_locked(log);
            hand_off_locked(log);
        } else {
            pthread_cond_wait(&cv, &log->mu);
        }
    }
    pthread_mutex_unlock(&log->mu);
    pthread_cond_destroy(&cv);
    enc_buf_give(&e.buf);
    return rc;
}

/* ---- accessors and trim ---- */

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

uint64_t sto_log_oldest_lsn(sto_log *log) {
    pthread_mutex_lock(&log->mu);
    uint64_t v = log->n_segs ? log->segs[0].first_lsn : log->durable_lsn + 1;
    pthread_mutex_unlock(&log->mu);
    return v;
}

void sto_log_stats_get(sto_log *log, sto_log_stats *out) {
    pthread_mutex_lock(&log->mu);
    *out = log->stats;
    pthread_mutex_unlock(&log->mu);
}

/* ---- trimming ---- */

#define LOG_RM_BATCH 64 /* segment files removed per directory sync */

/* Removes the files of segments firsts[0..n) in order, then syncs the directory once. Stops at
 * the first failure: the files left are old segments, which replay skips. */
static st_code rm_files(sto_log *log, const uint64_t *firsts, size_t n, st_err *err) {
    st_code rc = ST_OK;
    size_t i = 0;
    for (; i < n && rc == ST_OK; i++) {
        char path[LOG_PATH_MAX];
        seg_path(log, firsts[i], path);
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
    rec_reader rd;
    st_arena arena;
};

st_code sto_log_cursor_open(sto_log *log, uint64_t from_lsn, sto_log_cursor **out, st_err *err) {
    if (from_lsn == 0)
        from_lsn = 1;
    pthread_mutex_lock(&log->mu);
    uint64_t oldest = log->n_segs ? log->segs[0].first_lsn : log->durable_lsn + 1;
    pthread_mutex_unlock(&log->mu);
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
    reader_close(&c->rd);
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
    ptrdiff_t i = segs_find(log, c->next_lsn);
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
    st_code rc = reader_open_seg(&c->rd, c->log, first_lsn, &c->seg_size, &why, err);
    if (rc != ST_OK)
        return rc;
    if (why)
        return st_err_set(err, ST_DATA_LOSS, "commit log segment %s: %s", c->rd.path, why);
    c->seg_first = first_lsn;
    c->off = LOG_SEG_HDR_BYTES;
    return ST_OK;
}

/* Asks the log how far the cursor may read without asking again, opening the segment that
 * holds its next lsn. */
static st_code cursor_refresh(sto_log_cursor *c, st_err *err) {
    log_seg seg = {0};
    uint64_t durable = 0;
    c->avail_last = 0;
    st_code rc = cursor_locate(c, &seg, &durable, err);
    if (rc == ST_OK && seg.first_lsn != c->seg_first)
        rc = cursor_switch(c, seg.first_lsn, err);
    if (rc != ST_OK)
        return rc;
    /* Only the durable part of the segment; an old segment of unknown extent is read up to its
     * size, and lsns keep the cursor from going past its last needed record. */
    c->rd.limit = seg.good_bytes != UINT64_MAX ? seg.good_bytes : c->seg_size;
    c->avail_last = durable < seg.last_lsn ? durable : seg.last_lsn;
    return ST_OK;
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
        else if ((rc = reader_next(&c->rd, c->off, &st, &v, err)) != ST_OK)
            return rc;
        if (st == REC_OK && v.lsn > c->next_lsn)
            st = REC_BAD, v.why = "lsn gap";
        if (st != REC_OK) {
            c->avail_last = 0; /* ask the log again next time */
            return st_err_set(
                err, ST_DATA_LOSS,
                "commit log segment %s: %s at offset %" PRIu64 " while reading lsn %" PRIu64,
                c->rd.path, st == REC_END ? "end of segment" : v.why, c->off, c->next_lsn);
        }
        c->off = v.next_off;
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
