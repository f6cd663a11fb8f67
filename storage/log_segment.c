/* log_segment.c — the segment format of the commit log (docs/formats/log.md): segment paths and
 * headers, the record reader (sequential reads through a read-ahead window, each record's
 * checksum checked), and the list of segments found at open. */
#include "log_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- paths and headers ---- */

void log_seg_path(const sto_log *log, uint64_t first_lsn, char *out) {
    /* sto_log_open checked that the directory leaves room for the name. */
    int n = snprintf(out, LOG_PATH_MAX, "%s/%020" PRIu64 ".log", log->dir, first_lsn);
    ST_ASSERT(n > 0 && n < LOG_PATH_MAX);
}

/* reserved: the file's preallocated size, 0 when it could not be reserved. */
void log_seg_header_make(uint8_t *h, uint64_t first_lsn, uint32_t reserved) {
    memset(h, 0, LOG_SEG_PAGE_BYTES);
    st_put_fixed32(h, LOG_SEG_MAGIC);
    st_put_fixed32(h + 4, LOG_SEG_VERSION);
    st_put_fixed64(h + 8, first_lsn);
    st_put_fixed32(h + 16, reserved);
    st_put_fixed32(h + 20, st_crc_mask(st_crc32c(0, h, 20)));
}

void log_ckpt_make(uint8_t *s, uint64_t first_lsn, uint64_t lsn) {
    st_put_fixed32(s + 4, 0);
    st_put_fixed64(s + 8, first_lsn);
    st_put_fixed64(s + 16, lsn);
    st_put_fixed32(s, st_crc_mask(st_crc32c(0, s + 4, LOG_CKPT_BYTES - 4)));
}

/* The lsn of a checkpoint slot of segment first_lsn, 0 when it is empty or not valid (torn,
 * copied from another segment). */
static uint64_t ckpt_parse(const uint8_t *s, uint64_t first_lsn) {
    uint64_t lsn = st_get_fixed64(s + 16);
    if (st_crc_unmask(st_get_fixed32(s)) != st_crc32c(0, s + 4, LOG_CKPT_BYTES - 4) ||
        st_get_fixed32(s + 4) != 0 || st_get_fixed64(s + 8) != first_lsn || lsn < first_lsn)
        return 0;
    return lsn;
}

/* Checks a header read from disk (version 4 or 3, or 2 whose reserved size is unknown:
 * *reserved 0); on failure returns false with the reason in why. */
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
    else if (version != LOG_SEG_VERSION && version != LOG_SEG_VERSION_V3 &&
             version != LOG_SEG_VERSION_V2)
        *why = "unknown segment format version";
    else if (st_get_fixed64(h + 8) != first_lsn)
        *why = "segment header names a different first lsn than the file name";
    else {
        *reserved = version == LOG_SEG_VERSION_V2 ? 0 : st_get_fixed32(h + 16);
        return true;
    }
    return false;
}

/* ---- record reader: sequential reads through a read-ahead window ---- */

void log_reader_close(rec_reader *r) {
    if (r->f)
        r->env->ops->rclose(r->f);
    r->f = NULL;
    st_buf_free(&r->win);
    r->win_off = 0;
}

static st_code reader_open(rec_reader *r, st_env *env, const char *path, st_err *err) {
    log_reader_close(r);
    r->env = env;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->limit = 0;
    r->reserved = 0;
    r->data_off = LOG_SEG_HDR_BYTES;
    r->ckpt = r->hdr_partial = false;
    r->ckpt_lsn = 0;
    return env->ops->ropen(env, path, &r->f, err);
}

/* Makes [off, off + n) available in the window; *out is NULL when the file is shorter. */
st_code log_reader_fill(rec_reader *r, uint64_t off, size_t n, const uint8_t **out, st_err *err) {
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
st_code log_reader_next(rec_reader *r, uint64_t off, rec_status *st, rec_view *v, st_err *err) {
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
    st_code rc = log_reader_fill(r, off, LOG_REC_HDR_BYTES, &h, err);
    if (rc != ST_OK || !h) {
        v->why = "file shorter than expected";
        return rc;
    }
    uint32_t len = st_get_fixed32(h + 4);
    if (len > STO_LOG_RECORD_BYTES_MAX || len > r->limit - off - LOG_REC_HDR_BYTES) {
        v->why = len > STO_LOG_RECORD_BYTES_MAX ? "record length too large" : "truncated record";
        return ST_OK;
    }
    rc = log_reader_fill(r, off, LOG_REC_HDR_BYTES + (size_t)len, &h, err);
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
st_code log_reader_open_seg(rec_reader *r, sto_log *log, uint64_t first_lsn, uint64_t *size,
                            const char **bad_why, st_err *err) {
    char path[LOG_PATH_MAX];
    log_seg_path(log, first_lsn, path);
    *bad_why = NULL;
    st_code rc = reader_open(r, log->env, path, err);
    if (rc == ST_OK)
        rc = log->env->ops->rsize(r->f, size, err);
    if (rc != ST_OK)
        return rc;
    r->limit = *size;
    const uint8_t *h = NULL;
    size_t n = *size < LOG_SEG_HDR_BYTES ? (size_t)*size : LOG_SEG_HDR_BYTES;
    if (n > 0 && (rc = log_reader_fill(r, 0, n, &h, err)) != ST_OK)
        return rc;
    if (!h || !seg_header_ok(h, n, first_lsn, &r->reserved, bad_why)) {
        *bad_why = *bad_why ? *bad_why : "truncated segment header";
        return ST_OK;
    }
    if (st_get_fixed32(h + 4) != LOG_SEG_VERSION)
        return ST_OK;
    /* Version 4: the header page, with the checkpoint slots, comes whole before any record. */
    if (*size < LOG_SEG_PAGE_BYTES ||
        (rc = log_reader_fill(r, 0, LOG_SEG_PAGE_BYTES, &h, err)) != ST_OK || !h) {
        r->hdr_partial = rc == ST_OK;
        *bad_why = "truncated segment header page";
        return rc;
    }
    uint64_t a = ckpt_parse(h + LOG_CKPT_OFF0, first_lsn),
             b = ckpt_parse(h + LOG_CKPT_OFF1, first_lsn);
    r->ckpt = true;
    r->ckpt_lsn = a > b ? a : b;
    r->data_off = LOG_SEG_PAGE_BYTES;
    return ST_OK;
}

/* ---- the segment list (under mu) ---- */

bool log_segs_push(sto_log *log, log_seg s) {
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
ptrdiff_t log_segs_find(const sto_log *log, uint64_t lsn) {
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
    if (log->n_segs >= LOG_SEGMENTS_MAX ||
        !log_segs_push(log, (log_seg){lsn, 0, UINT64_MAX, 0, 0, 0}))
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

static int seg_cmp(const void *a, const void *b) {
    uint64_t x = ((const log_seg *)a)->first_lsn, y = ((const log_seg *)b)->first_lsn;
    return x < y ? -1 : x > y;
}

/* Lists the segment files at open; non-last segments end where the next begins. */
st_code log_segs_load(sto_log *log, st_err *err) {
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
        log_seg_path(log, s->first_lsn, path);
        if ((rc = log->env->ops->file_size(log->env, path, &s->bytes, err)) != ST_OK)
            return rc;
        s->last_lsn = i + 1 < log->n_segs ? log->segs[i + 1].first_lsn - 1 : s->first_lsn - 1;
    }
    return ST_OK;
}
