/* log_recover.c — reading the commit log back at open (docs/formats/log.md, reading rules):
 * scanning segments, telling a torn tail from damage (a later group after a bad record, a last
 * segment cut short), positioning appends after the last good record, and sto_log_replay. */
#include "log_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scanning segments (replay and positioning) ---- */

typedef st_code (*replay_fn)(const sto_log_record *rec, void *arg);

typedef struct scan_result {
    uint64_t last_lsn;   /* last good record (first_lsn - 1 when none) */
    uint64_t good_bytes; /* end of that record; 0 when the header is bad */
    uint64_t file_bytes;
    uint64_t data_off; /* where the segment's records start */
    bool ckpt;         /* it has checkpoint slots (version 4) */
    /* The last segment has bytes other than reserved zeros after good_bytes (or was cut short):
     * appends go to a new segment. Not torn: they continue at good_bytes. */
    bool torn;
    uint64_t skip_lsn, skip_off; /* the last damaged stretch skipped (log_seg.skip_lsn) */
    uint64_t unneeded_next;      /* after the last one nobody needed (sto_log_readable_from) */
} scan_result;

typedef struct scan_ctx {
    sto_log *log;
    rec_reader rd;
    st_arena arena;
    uint64_t from_lsn;
    replay_fn fn;
    void *arg;
    bool dropped;       /* a cut-short last segment's loss was accepted */
    uint64_t seg_first; /* of the segment being scanned */
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
    if (r->limit < LOG_SEG_HDR_BYTES || log_reader_fill(r, 0, LOG_SEG_HDR_BYTES, &h, &e) != ST_OK ||
        !h)
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
            st_code rc = log_reader_fill(r, *y, m, &p, err);
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

/* Which good record a search after a bad one looks for: lsn lo..hi, of a group that begins after
 * lsn group_after. */
typedef struct find_want {
    uint64_t lo, hi, group_after;
} find_want;

/* True when the header at h could be such a record, given that the bad record at bad_off was
 * lsn torn_first: its group does not begin after it, and the records torn_first .. lsn-1 (each
 * at least a header long) fit between bad_off and y. */
static bool tail_wanted(const uint8_t *h, uint64_t y, uint64_t bad_off, uint64_t torn_first,
                        const find_want *w, uint64_t limit) {
    uint64_t lsn = st_get_fixed64(h + 8), group_first = st_get_fixed64(h + 16);
    uint32_t len = st_get_fixed32(h + 4);
    return lsn >= w->lo && lsn <= w->hi && group_first > w->group_after && group_first <= lsn &&
           lsn - torn_first <= (y - bad_off) / LOG_REC_HDR_BYTES &&
           len <= STO_LOG_RECORD_BYTES_MAX && len <= limit - y - LOG_REC_HDR_BYTES;
}

/* Finds the first good record w asks for after the bad record (lsn last + 1) at bad_off: *found,
 * its offset *at and view *v. Records may start at any offset, so every offset is tried (cheap
 * header checks first, then the checksum); the work is bounded by the segment's size, and zero
 * runs (preallocation) are skipped in bulk. */
static st_code good_after_find(rec_reader *r, uint64_t bad_off, uint64_t last, const find_want *w,
                               bool *found, uint64_t *at, rec_view *v, st_err *err) {
    *found = false;
    for (uint64_t y = bad_off + 1;; y++) {
        st_code rc = tail_skip_zeros(r, &y, err);
        if (rc != ST_OK)
            return rc;
        if (y > r->limit || r->limit - y < LOG_REC_HDR_BYTES)
            return ST_OK; /* nothing wanted follows */
        const uint8_t *h = NULL;
        if ((rc = log_reader_fill(r, y, LOG_REC_HDR_BYTES, &h, err)) != ST_OK)
            return rc;
        if (!h)
            return ST_OK;
        if (!tail_wanted(h, y, bad_off, last + 1, w, r->limit))
            continue;
        rec_status st;
        if ((rc = log_reader_next(r, y, &st, v, err)) != ST_OK)
            return rc;
        if (st != REC_OK)
            continue;
        *found = true;
        *at = y;
        return ST_OK;
    }
}

/* A bad record at bad_off follows good records up to lsn last (log_impl.h). A crash during a
 * group's write (before its fdatasync returned: never acknowledged) leaves any mix of good and bad
 * records of that one group, but a group is written only after the previous one's sync returned. So
 * a good record of a LATER group anywhere after bad_off proves the bad record was durable and
 * acknowledged: damage, not a torn tail. Finds the first such record. */
st_code log_later_group_find(rec_reader *r, uint64_t bad_off, uint64_t last, bool *found,
                             uint64_t *at, rec_view *v, st_err *err) {
    find_want w = {.lo = last + 2, .hi = UINT64_MAX, .group_after = last + 1};
    return good_after_find(r, bad_off, last, &w, found, at, v, err);
}

/* A damaged stretch of records, lsn last+1 .. v->lsn-1 in bytes bad_off .. at, that replay does
 * not need (every tablet's flushed point has passed it: its rows are in SSTables). When no log
 * holder needs it either, the trim would have removed it were it not in a segment still needed
 * for later records: a warning. When a holder (a peer cluster's shipper) had not read it yet,
 * the operator accepted that loss (accepted): an error naming it, and the stretch becomes a
 * hole that readers jump (log_hole), the records before it staying readable. The scan goes on at
 * the later record; readers are kept from the stretch (log_seg.skip_lsn). */
static st_code scan_skip_damage(scan_ctx *c, scan_result *res, uint64_t bad_off, uint64_t last,
                                const char *why, uint64_t at, const rec_view *v, bool accepted,
                                st_err *err) {
    bool known = false; /* a segment scanned twice (replay, then positioning) */
    for (size_t i = 0; i < c->log->n_holes; i++)
        known |= c->log->holes[i].lsn == last + 1;
    if (accepted && !known) {
        log_hole *h = realloc(c->log->holes, (c->log->n_holes + 1) * sizeof *h);
        if (!h)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        c->log->holes = h;
        h[c->log->n_holes++] = (log_hole){last + 1, v->lsn, c->seg_first, at};
        st_log(ST_LOG_ERROR, "log",
               "event=log_data_loss_accepted reason=holders segment=%s bad_offset=%" PRIu64
               " resume_offset=%" PRIu64 " first_lsn=%" PRIu64 " last_lsn=%" PRIu64
               " needed_from=%" PRIu64 " damage=\"%s\" msg=\"damaged commit log records whose "
               "rows are in SSTables but that a log holder (a peer cluster's shipper) had not "
               "read are skipped: the holder reads the records before them, then loses lsn "
               "%" PRIu64 "..%" PRIu64 "\"",
               c->rd.path, bad_off, at, last + 1, v->lsn - 1, c->log->needed_from, why, last + 1,
               v->lsn - 1);
    } else if (!accepted) {
        st_log(ST_LOG_WARN, "log",
               "event=log_damage_skipped segment=%s bad_offset=%" PRIu64 " resume_offset=%" PRIu64
               " first_lsn=%" PRIu64 " last_lsn=%" PRIu64 " needed_from=%" PRIu64 " reason=\"%s\" "
               "msg=\"damaged commit log records that no tablet and no log holder needs any more "
               "(their rows are in SSTables); skipped, and no reader can ask for them\"",
               c->rd.path, bad_off, at, last + 1, v->lsn - 1, c->log->needed_from, why);
        res->unneeded_next = v->lsn;
    }
    res->skip_lsn = v->lsn;
    res->skip_off = at;
    return ST_OK;
}

/* Sets *zero when every byte of [off, limit) is zero: reserved space no record reached. */
static st_code tail_zero(rec_reader *r, uint64_t off, bool *zero, st_err *err) {
    *zero = true;
    while (off < r->limit) {
        uint64_t left = r->limit - off;
        size_t m = left < LOG_READ_CHUNK ? (size_t)left : LOG_READ_CHUNK;
        const uint8_t *p = NULL;
        st_code rc = log_reader_fill(r, off, m, &p, err);
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

/* "lsn A" or "lsn A..B". */
static const char *lsn_range(char *buf, size_t cap, uint64_t a, uint64_t b) {
    if (a == b)
        snprintf(buf, cap, "lsn %" PRIu64, a);
    else
        snprintf(buf, cap, "lsn %" PRIu64 "..%" PRIu64, a, b);
    return buf;
}

/* Good records after the bad one at res->good_bytes, up to lsn ck: the first such record's lsn
 * *first (0 when none) and the last of the unbroken run from it, *last. Every record up to ck was
 * acknowledged, so these are acknowledged records that dropping the tail would drop too. */
static st_code ckpt_intact_after(scan_ctx *c, const scan_result *res, uint64_t ck, uint64_t *first,
                                 uint64_t *last, st_err *err) {
    find_want w = {.lo = res->last_lsn + 2, .hi = ck, .group_after = 0};
    rec_view v = {0};
    uint64_t at = 0;
    bool found = false;
    *first = *last = 0;
    st_code rc = good_after_find(&c->rd, res->good_bytes, res->last_lsn, &w, &found, &at, &v, err);
    if (rc != ST_OK || !found)
        return rc;
    *first = *last = v.lsn;
    while (*last < ck) {
        rec_status st;
        if ((rc = log_reader_next(&c->rd, v.next_off, &st, &v, err)) != ST_OK)
            return rc;
        if (st != REC_OK || v.lsn != *last + 1)
            break;
        *last = v.lsn;
    }
    return ST_OK;
}

/* The last segment's checkpoint says records up to lsn C were durable, that is acknowledged
 * (a slot is written only with an lsn whose group's fdatasync had returned), but its good
 * records end at L < C: records that were acknowledged read back as zeros or garbage (a lost or
 * overwritten page, a flipped byte). Good records may follow the damage (*first..*last): they
 * were acknowledged too, and the message says how many dropping the tail would lose. ST_DATA_LOSS
 * unless the log accepts the loss (then, as for a cut, appends go to a new segment). */
static st_code scan_ckpt_lost(scan_ctx *c, scan_result *res, st_err *err) {
    const char *path = c->rd.path;
    uint64_t l = res->last_lsn, ck = c->rd.ckpt_lsn, x = res->good_bytes, first, last;
    res->torn = true; /* never append after damaged records */
    st_code rc = ckpt_intact_after(c, res, ck, &first, &last, err);
    if (rc != ST_OK)
        return rc;
    uint64_t intact = first ? last - first + 1 : 0;
    char bad[64], good[64];
    if (!c->log->accept_data_loss && intact)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: its checkpoint says records up to lsn %" PRIu64
                          " were made durable (acknowledged), but %s at byte %" PRIu64
                          " is damaged while %s after it (%" PRIu64 " acknowledged record(s)) "
                          "read back intact: restore the file or the node from a replica; "
                          "--accept-data-loss would drop lsn %" PRIu64 "..%" PRIu64
                          ", those %" PRIu64 " intact acknowledged record(s) included",
                          path, ck, lsn_range(bad, sizeof bad, l + 1, first - 1), x,
                          lsn_range(good, sizeof good, first, last), intact, l + 1, ck, intact);
    if (!c->log->accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: its checkpoint says records up to lsn %" PRIu64
                          " were made durable, but its records end at lsn %" PRIu64
                          " (byte %" PRIu64 "): lsn %" PRIu64 "..%" PRIu64 " at least, which were "
                          "acknowledged, read back as zeros or garbage: restore the file or the "
                          "node from a replica, or start with --accept-data-loss to drop them",
                          path, ck, l, x, l + 1, ck);
    st_log(ST_LOG_ERROR, "log",
           "event=log_data_loss_accepted segment=%s reason=checkpoint checkpoint_lsn=%" PRIu64
           " kept_last_lsn=%" PRIu64 " kept_bytes=%" PRIu64 " dropped_from_lsn=%" PRIu64
           " dropped_records=at_least_%" PRIu64 " dropped_intact_records=%" PRIu64
           " msg=\"acknowledged records after lsn %" PRIu64 " are unreadable or follow an "
           "unreadable one and are dropped; appends continue from lsn %" PRIu64
           " in a new segment\"",
           path, ck, l, x, l + 1, ck - l, intact, l, l + 1);
    c->dropped = true;
    return ST_OK;
}

/* What follows the last segment's good records: only reserved zeros (appends may continue
 * there) or torn bytes; whether the file was cut short; and whether its checkpoint names
 * records it no longer holds. */
static st_code scan_tail(scan_ctx *c, scan_result *res, st_err *err) {
    bool zero = true;
    st_code rc = tail_zero(&c->rd, res->good_bytes, &zero, err);
    if (rc != ST_OK)
        return rc;
    res->torn = !zero;
    if (c->rd.reserved > 0 && res->file_bytes < c->rd.reserved)
        rc = scan_cut_short(c, res, zero, err);
    if (rc == ST_OK && !c->dropped && c->rd.ckpt_lsn > res->last_lsn)
        rc = scan_ckpt_lost(c, res, err);
    return rc;
}

/* The last segment's header is bad (why): *empty when a crash during its creation explains it
 * (its space may have been reserved already): records go in only after the header is durable,
 * so such a file holds nothing but zeros after a header that is short, cut or zero. Anything
 * else is a header wiped over records (why says so). */
static st_code seg_created_empty(scan_ctx *c, const scan_result *res, bool *empty, const char **why,
                                 st_err *err) {
    *empty = false;
    if (res->file_bytes > LOG_SEG_HDR_BYTES && !c->rd.hdr_partial && !seg_header_zero(&c->rd))
        return ST_OK;
    bool zero = true;
    st_code rc = ST_OK;
    if (res->file_bytes > LOG_SEG_HDR_BYTES)
        rc = tail_zero(&c->rd, LOG_SEG_HDR_BYTES, &zero, err);
    if (rc == ST_OK && !zero)
        *why = "the segment header is zeros or cut but data follows it";
    *empty = rc == ST_OK && zero;
    return rc;
}

/* A bad record at off after good records up to lsn last. In the last segment, without a good
 * record of a later group after it, it starts the torn tail (*later false: the log ends here).
 * Such a record after it (or, in an earlier segment, any bad record) means damaged records:
 * skipped when they all lie below what anyone needs, or below what replay needs when the
 * operator accepted data loss (*later true, *off the later record's offset, res->skip_lsn its
 * lsn), else ST_DATA_LOSS. */
static st_code scan_bad_record(scan_ctx *c, scan_result *res, bool is_last, uint64_t stop_lsn,
                               uint64_t *off_io, uint64_t last, const char *why, bool *later,
                               st_err *err) {
    uint64_t off = *off_io, at = 0, need = c->log->needed_from;
    /* Records below the replay point are in SSTables: only log holders may need them (known
     * only when the caller said who needs what: needed_from). */
    uint64_t flushed_below = need > 0 && c->fn ? c->from_lsn : need;
    rec_view v = {0};
    bool found = false;
    st_code rc = ST_OK;
    *later = false;
    if (is_last || last + 1 < flushed_below)
        rc = log_later_group_find(&c->rd, off, last, &found, &at, &v, err);
    if (rc != ST_OK || (is_last && !found))
        return rc;
    bool own = found && (is_last || v.lsn <= stop_lsn);
    bool holders_only = own && v.lsn > need && v.lsn <= flushed_below;
    if ((own && v.lsn <= need) || (holders_only && c->log->accept_data_loss)) {
        if ((rc = scan_skip_damage(c, res, off, last, why, at, &v, holders_only, err)) != ST_OK)
            return rc;
        *later = true;
        *off_io = at;
        return ST_OK;
    }
    if (holders_only)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s at offset %" PRIu64 ": records lsn %" PRIu64
                          "..%" PRIu64 " are damaged; their rows are in SSTables, but a log holder "
                          "(a peer cluster's shipper, from lsn %" PRIu64 ") has not read them, so "
                          "the peer lacks them and restoring this node from it would lose them. "
                          "Start with --accept-data-loss to skip them (then copy the tables over "
                          "to the peer, e.g. by backup and restore)",
                          c->rd.path, why, off, last + 1, v.lsn - 1, need);
    if (found && is_last)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s at offset %" PRIu64 " (lsn %" PRIu64
                          " expected), but a good record of a later group (lsn %" PRIu64
                          ", group from lsn %" PRIu64 ") follows at offset %" PRIu64
                          ": acknowledged records are damaged, not a torn tail; restore the "
                          "node from a replica",
                          c->rd.path, why, off, last + 1, v.lsn, v.group_first, at);
    return st_err_set(err, ST_DATA_LOSS,
                      "commit log segment %s: %s at offset %" PRIu64 " (lsn %" PRIu64
                      " expected) before the end of the log; restore "
                      "the node from a replica",
                      c->rd.path, why, off, last + 1);
}

/* Reads one segment's records in order. For a non-last segment, records first..stop_lsn must all
 * be good and later bytes are ignored; in the last segment the first bad record ends the log,
 * unless a good record of a later group follows it; damaged records that nobody needs are skipped
 * (scan_bad_record). */
static st_code scan_segment(scan_ctx *c, uint64_t first_lsn, bool is_last, uint64_t stop_lsn,
                            scan_result *res, st_err *err) {
    const char *why;
    memset(res, 0, sizeof *res);
    res->last_lsn = first_lsn - 1;
    c->seg_first = first_lsn;
    st_code rc = log_reader_open_seg(&c->rd, c->log, first_lsn, &res->file_bytes, &why, err);
    if (rc != ST_OK)
        return rc;
    res->data_off = c->rd.data_off;
    res->ckpt = c->rd.ckpt;
    bool empty = false;
    if (why && is_last && (rc = seg_created_empty(c, res, &empty, &why, err)) != ST_OK)
        return rc;
    if (empty) {
        res->torn = true;
        return ST_OK;
    }
    if (why)
        return st_err_set(err, ST_DATA_LOSS,
                          "commit log segment %s: %s; restore the node from "
                          "a replica",
                          c->rd.path, why);
    uint64_t off = c->rd.data_off;
    res->good_bytes = off;
    for (uint64_t expect = first_lsn; is_last || expect <= stop_lsn; expect++) {
        rec_status st;
        rec_view v = {0};
        if ((rc = log_reader_next(&c->rd, off, &st, &v, err)) != ST_OK)
            return rc;
        if (st == REC_OK && v.lsn != expect) {
            st = REC_BAD;
            v.why = "record has an unexpected lsn";
        }
        if (st == REC_BAD) {
            bool later = false;
            rc = scan_bad_record(c, res, is_last, stop_lsn, &off, expect - 1, v.why, &later, err);
            if (rc != ST_OK)
                return rc;
            if (!later)
                break; /* the last segment's torn tail */
            expect = res->skip_lsn - 1;
            continue;
        }
        if (st == REC_END && is_last)
            break;
        if (st == REC_END)
            return st_err_set(err, ST_DATA_LOSS,
                              "commit log segment %s ends after lsn %" PRIu64
                              " but the next segment starts at lsn %" PRIu64 ": records are "
                              "missing; restore the node from a replica",
                              c->rd.path, expect - 1, stop_lsn + 1);
        if (c->fn && v.lsn >= c->from_lsn && (rc = scan_deliver(c, &v, err)) != ST_OK)
            return rc;
        res->last_lsn = v.lsn;
        off = res->good_bytes = v.next_off;
    }
    return is_last ? scan_tail(c, res, err) : ST_OK;
}

/* ---- positioning ---- */

/* Under mu: keeps readers of segment s from the damaged records its scan skipped. */
static void seg_note_skip(sto_log *log, log_seg *s, const scan_result *res) {
    s->skip_lsn = res->skip_lsn;
    s->skip_off = res->skip_off;
    if (res->unneeded_next > log->readable_from)
        log->readable_from = res->unneeded_next;
}

/* Sets the writer after a scan of the last segment (or an empty directory). */
static void position_apply(sto_log *log, bool have_seg, const scan_result *res) {
    pthread_mutex_lock(&log->mu);
    if (!have_seg || log->n_segs == 0) {
        log->next_lsn = log->durable_lsn + 1;
        log->wstate = W_NEW_SEGMENT;
    } else {
        log_seg *s = &log->segs[log->n_segs - 1];
        seg_note_skip(log, s, res);
        s->last_lsn = res->last_lsn;
        s->good_bytes = res->good_bytes;
        s->bytes = res->file_bytes;
        log->durable_lsn = res->last_lsn;
        log->next_lsn = res->last_lsn + 1;
        log->wbytes = res->good_bytes;
        log->wfirst = s->first_lsn;
        log->wdata = res->data_off;
        log->wckpt = res->ckpt;
        /* Records read back after a crash may still be only in the page cache of a process
         * that died before its fdatasync: no checkpoint names them until a group of this
         * process has been synced after them. */
        log->ckpt_lsn = res->last_lsn;
        log->ckpt_n = 0;
        /* Appending after the last record needs a way to write inside the file when zeros
         * follow it (wopen_at); a torn tail is never overwritten. */
        bool reopen = !res->torn && res->good_bytes >= LOG_SEG_HDR_BYTES &&
                      (res->good_bytes == res->file_bytes || log->env->ops->wopen_at);
        log->wstate = reopen ? W_REOPEN : W_NEW_SEGMENT;
    }
    pthread_mutex_unlock(&log->mu);
}

/* Scans only the last segment to find where appends go (appends without a replay). */
st_code log_position_lazily(sto_log *log, st_err *err) {
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
        log_reader_close(&c.rd);
        st_arena_deinit(&c.arena);
    }
    if (rc == ST_OK)
        position_apply(log, have, &res);
    return rc;
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
            seg_note_skip(log, &log->segs[i], &res);
            pthread_mutex_unlock(&log->mu);
        }
    }
    position_apply(log, n > 0, &res);
    return ST_OK;
}

/* Makes the records replay read durable: after a process died between a group's write and its
 * fdatasync, they may be only in the page cache, and the engine now treats them as written
 * (the manifest records the log's end, checkpoints will name them). One fdatasync per start, of
 * the last segment (earlier ones were synced before the next was created). */
static st_code sync_recovered(sto_log *log, st_err *err) {
    pthread_mutex_lock(&log->mu);
    bool have = log->n_segs > 0 &&
                log->segs[log->n_segs - 1].last_lsn >= log->segs[log->n_segs - 1].first_lsn;
    uint64_t first = have ? log->segs[log->n_segs - 1].first_lsn : 0;
    uint64_t end = have ? log->segs[log->n_segs - 1].good_bytes : 0;
    pthread_mutex_unlock(&log->mu);
    if (!log->sync || !have)
        return ST_OK;
    char path[LOG_PATH_MAX];
    log_seg_path(log, first, path);
    st_wfile *f;
    st_code rc = log->env->ops->wopen_at ? log->env->ops->wopen_at(log->env, path, end, &f, err)
                                         : log->env->ops->wopen_append(log->env, path, &f, err);
    if (rc != ST_OK)
        return rc;
    rc = log->env->ops->sync(f, err);
    log->env->ops->wclose(f, NULL);
    return rc;
}

st_code sto_log_replay(sto_log *log, uint64_t from_lsn,
                       st_code (*fn)(const sto_log_record *rec, void *arg), void *arg,
                       st_err *err) {
    pthread_mutex_lock(&log->mu);
    bool busy = log->appends_started || log->replaying;
    if (!busy)
        log->replaying = true;
    size_t n = log->n_segs;
    ptrdiff_t i0 = log_segs_find(log, from_lsn);
    pthread_mutex_unlock(&log->mu);
    if (busy)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "commit log %s: replay must come before "
                          "the first append",
                          log->dir);
    scan_ctx c = {.log = log, .from_lsn = from_lsn, .fn = fn, .arg = arg};
    st_arena_init(&c.arena, 4096);
    st_code rc = replay_segments(log, &c, i0 < 0 ? 0 : (size_t)i0, n, err);
    if (rc == ST_OK)
        rc = sync_recovered(log, err);
    /* An accepted loss starts the next segment now (appends have not started: the writer state
     * is the replay's), so the cut segment is an old one from here on, also if no write comes
     * before the next start, which would otherwise refuse it again. An empty log gets its first
     * segment now, for the manifest to name. */
    if (rc == ST_OK && (c.dropped || n == 0))
        rc = log_segment_create(log, log->next_lsn, err);
    if (c.dropped)
        log->tail_dropped = true;
    log_reader_close(&c.rd);
    st_arena_deinit(&c.arena);
    pthread_mutex_lock(&log->mu);
    log->replaying = false;
    pthread_mutex_unlock(&log->mu);
    return rc;
}
