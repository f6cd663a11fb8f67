/* rowread.c — visibility: from merged (ikey, value) entries to visible cells (the reader behind
 * sto_iter) and to the entries a compaction keeps. Both run the same per-row state machine
 * (vis_*), fed entries in ikey order, which within a row puts every tombstone before what it may
 * cover: row tombstones, then per family its tombstones, then per column its tombstones and its
 * cells newest first. Rules: docs/formats/keys.md.
 *
 * The state machine works on encoded prefixes (memcmp to notice a new row, family or column) and
 * unescapes a component only when it changes, into buffers reused for the whole scan, so reading
 * a cell allocates nothing. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "key.h"
#include "rowread.h"

/* One column tombstone of the current column. */
typedef struct vis_col_del {
    uint64_t version;
    int64_t start_us, end_us;
} vis_col_del;

/* A column may hold any number of tombstones (one mutation can write 100,000 disjoint ranges),
 * and comparing every pair would make each read of the row quadratic. So: a new tombstone is
 * compared for redundancy with the last VIS_DELS_REDUNDANT_WINDOW kept ones only (a redundant
 * tombstone left unmarked is merely kept, which changes no answer); and a cell is checked
 * against the kept tombstones one by one only up to VIS_DELS_SCAN_MAX of them, past which
 * vis_col_hidden sweeps them in O(log n) per cell (see there). */
#define VIS_DELS_REDUNDANT_WINDOW 16
#define VIS_DELS_SCAN_MAX 16

/* What an entry is worth, given everything before it in its row. */
typedef enum vis_verdict {
    VIS_CELL,           /* visible cell */
    VIS_HIDDEN,         /* covered by a tombstone of the row */
    VIS_SHADOWED,       /* same cell as an earlier entry with a higher version */
    VIS_GC_AGE,         /* garbage whatever other tables hold (the rule says so from ts alone) */
    VIS_GC_VERSIONS,    /* garbage because of max-versions: certain only in a full compaction */
    VIS_TOMB,           /* tombstone that hides something no other kept tombstone does */
    VIS_TOMB_REDUNDANT, /* tombstone implied by an earlier one of the same or wider scope */
} vis_verdict;

typedef struct vis_state {
    const sto_gc_set *gc;
    int64_t now_us;
    bool want_qual;    /* unescape qualifiers (the reader returns them; compaction does not) */
    uint64_t row_thr;  /* entries of the row with a lower version are hidden */
    st_buf fam_prefix; /* ikey prefix through enc(family); empty = no family yet */
    st_buf fam_name;
    uint64_t fam_thr; /* max(row_thr, family tombstones); a system family starts from 0 */
    const sto_gc_rule *rule;
    st_buf col_prefix; /* ikey prefix through enc(qualifier); empty = no column yet */
    st_buf qual;
    vis_col_del *dels; /* the column's tombstones that are not redundant; grows with the data */
    size_t n_dels, cap_dels;
    /* The sweep over dels (vis_col_hidden), for columns with more than VIS_DELS_SCAN_MAX. */
    bool sweep_on;     /* dels is sorted by end descending; heap and sweep_next are valid */
    int64_t sweep_ts;  /* the timestamp of the last cell swept */
    size_t sweep_next; /* dels[0, sweep_next) have entered the heap (end_us > sweep_ts) */
    vis_col_del *heap; /* max-heap by version of tombstones with end_us > sweep_ts */
    size_t n_heap, cap_heap;
    bool have_ts; /* last_ts holds the previous cell's timestamp in this column */
    int64_t last_ts;
    int64_t rank; /* visible cells of the column so far (for max-versions) */
} vis_state;

static void vis_init(vis_state *vs, const sto_gc_set *gc, int64_t now_us, bool want_qual) {
    memset(vs, 0, sizeof *vs);
    vs->gc = gc;
    vs->now_us = now_us;
    vs->want_qual = want_qual;
    st_buf_init(&vs->fam_prefix);
    st_buf_init(&vs->fam_name);
    st_buf_init(&vs->col_prefix);
    st_buf_init(&vs->qual);
}

static void vis_deinit(vis_state *vs) {
    st_buf_free(&vs->fam_prefix);
    st_buf_free(&vs->fam_name);
    st_buf_free(&vs->col_prefix);
    st_buf_free(&vs->qual);
    free(vs->dels);
    free(vs->heap);
}

static void vis_row_start(vis_state *vs) {
    vs->row_thr = 0;
    st_buf_reset(&vs->fam_prefix);
    st_buf_reset(&vs->col_prefix);
}

static bool vis_prefix_eq(const st_buf *b, st_slice key, size_t len) {
    return b->len == len && memcmp(b->data, key.data, len) == 0;
}

static st_code vis_set_prefix(st_buf *b, st_slice key, size_t len) {
    st_buf_reset(b);
    return st_buf_append(b, key.data, len);
}

bool sto_family_is_system(st_slice family) {
    return family.len > 0 && family.data[0] == STO_SYSTEM_FAMILY_BYTE;
}

/* Whether the entry (a parsed key) belongs to a system family, from its encoded bytes: enc(family)
 * of a name starting with 0x00 starts with 0x00 0xff (an escaped 0x00). Row tombstones belong to
 * none. The first test is the one that fails for user data. A parsed key has at least two bytes
 * after enc(row) and its tag. */
static inline bool vis_key_system(st_slice key, const sto_key_parts *pt) {
    return key.data[pt->row_end + 1] == 0x00 && pt->kind != STO_KEY_ROW_DEL &&
           key.data[pt->row_end + 2] == 0xff;
}

/* Enters the family of key when it differs from the current one. */
static st_code vis_family(vis_state *vs, st_slice key, const sto_key_parts *pt) {
    if (vis_prefix_eq(&vs->fam_prefix, key, pt->fam_end))
        return ST_OK;
    st_code rc = vis_set_prefix(&vs->fam_prefix, key, pt->fam_end);
    if (rc == ST_OK)
        rc = sto_key_unescape(
            st_slice_make(key.data + pt->row_end + 1, pt->fam_end - pt->row_end - 1),
            &vs->fam_name);
    if (rc != ST_OK)
        return rc;
    vs->rule = sto_gc_set_find(vs->gc, st_buf_slice(&vs->fam_name));
    /* Row tombstones do not cover system families (strata/storage.h). */
    vs->fam_thr = vs->row_thr && vis_key_system(key, pt) ? 0 : vs->row_thr;
    st_buf_reset(&vs->col_prefix);
    return ST_OK;
}

/* Enters the column of key when it differs from the current one. */
static st_code vis_column(vis_state *vs, st_slice key, const sto_key_parts *pt) {
    if (vis_prefix_eq(&vs->col_prefix, key, pt->qual_end))
        return ST_OK;
    st_code rc = vis_set_prefix(&vs->col_prefix, key, pt->qual_end);
    if (rc == ST_OK && vs->want_qual)
        rc = sto_key_unescape(
            st_slice_make(key.data + pt->fam_end + 1, pt->qual_end - pt->fam_end - 1), &vs->qual);
    if (rc != ST_OK)
        return rc;
    vs->n_dels = 0;
    vs->sweep_on = false;
    vs->have_ts = false;
    vs->rank = 0;
    return ST_OK;
}

/* A column tombstone matters unless the family threshold or a kept column tombstone with a
 * version at least as high and a wider time range already implies it. Only the last
 * VIS_DELS_REDUNDANT_WINDOW kept tombstones are looked at: one implied by an older kept one is
 * kept too, which is safe (what it hides, the one implying it hides as well, and a full
 * compaction that drops that one by version drops this one too) and costs only its entry. */
static st_code vis_column_del(vis_state *vs, const sto_key_parts *pt, vis_verdict *out) {
    *out = VIS_TOMB_REDUNDANT;
    if (pt->version <= vs->fam_thr || pt->del_start_us >= pt->del_end_us)
        return ST_OK;
    /* Key order puts a column's tombstones before its cells, so the sweep has not started; were
     * that ever broken, restarting it at the next cell keeps the answers right. */
    vs->sweep_on = false;
    size_t from =
        vs->n_dels > VIS_DELS_REDUNDANT_WINDOW ? vs->n_dels - VIS_DELS_REDUNDANT_WINDOW : 0;
    for (size_t i = from; i < vs->n_dels; i++) {
        const vis_col_del *d = &vs->dels[i];
        if (d->version >= pt->version && d->start_us <= pt->del_start_us &&
            pt->del_end_us <= d->end_us)
            return ST_OK;
    }
    if (vs->n_dels == vs->cap_dels) {
        size_t cap = vs->cap_dels ? vs->cap_dels * 2 : 8;
        vis_col_del *d = realloc(vs->dels, cap * sizeof *d);
        if (!d)
            return ST_RESOURCE_EXHAUSTED;
        vs->dels = d;
        vs->cap_dels = cap;
    }
    vs->dels[vs->n_dels++] = (vis_col_del){pt->version, pt->del_start_us, pt->del_end_us};
    *out = VIS_TOMB;
    return ST_OK;
}

static int vis_del_end_desc(const void *a, const void *b) {
    int64_t x = ((const vis_col_del *)a)->end_us, y = ((const vis_col_del *)b)->end_us;
    return (x < y) - (x > y);
}

static void vis_heap_push(vis_state *vs, vis_col_del d) {
    size_t i = vs->n_heap++;
    while (i > 0 && vs->heap[(i - 1) / 2].version < d.version) {
        vs->heap[i] = vs->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    vs->heap[i] = d;
}

static void vis_heap_pop(vis_state *vs) {
    vis_col_del last = vs->heap[--vs->n_heap];
    size_t n = vs->n_heap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && vs->heap[c + 1].version > vs->heap[c].version)
            c++;
        if (vs->heap[c].version <= last.version)
            break;
        vs->heap[i] = vs->heap[c];
        i = c;
    }
    if (n)
        vs->heap[i] = last;
}

/* Whether a kept column tombstone d with d.start_us <= ts < d.end_us and d.version > version
 * exists. Up to VIS_DELS_SCAN_MAX tombstones: one by one. Past that, a sweep that relies on a
 * column's cells coming newest first (key order, docs/formats/keys.md): at the column's first
 * cell the tombstones are sorted by end descending; as ts decreases, those with end > ts join a
 * max-heap by version and stay (end > ts holds for every later, older cell), and the top is
 * dropped while its start > ts (it cannot cover this or any older cell). The top then covers ts
 * and has the highest version of the heap, which holds every tombstone covering ts: the cell is
 * hidden iff that version is above the cell's. O(n log n) per column and O(log n) amortised per
 * cell, instead of O(n) per cell. A cell newer than the last one swept (which key order rules
 * out) is answered one by one, so the answer never depends on that order. */
static st_code vis_col_hidden(vis_state *vs, int64_t ts, uint64_t version, bool *hidden) {
    *hidden = false;
    if (vs->n_dels <= VIS_DELS_SCAN_MAX || (vs->sweep_on && ts > vs->sweep_ts)) {
        for (size_t i = 0; i < vs->n_dels; i++) {
            const vis_col_del *d = &vs->dels[i];
            if (version < d->version && ts >= d->start_us && ts < d->end_us) {
                *hidden = true;
                break;
            }
        }
        return ST_OK;
    }
    if (!vs->sweep_on) {
        if (vs->cap_heap < vs->n_dels) {
            vis_col_del *h = realloc(vs->heap, vs->n_dels * sizeof *h);
            if (!h)
                return ST_RESOURCE_EXHAUSTED;
            vs->heap = h;
            vs->cap_heap = vs->n_dels;
        }
        qsort(vs->dels, vs->n_dels, sizeof *vs->dels, vis_del_end_desc);
        vs->n_heap = 0;
        vs->sweep_next = 0;
        vs->sweep_on = true;
    }
    vs->sweep_ts = ts;
    while (vs->sweep_next < vs->n_dels && vs->dels[vs->sweep_next].end_us > ts)
        vis_heap_push(vs, vs->dels[vs->sweep_next++]);
    while (vs->n_heap > 0 && vs->heap[0].start_us > ts)
        vis_heap_pop(vs);
    *hidden = vs->n_heap > 0 && vs->heap[0].version > version;
    return ST_OK;
}

static st_code vis_cell(vis_state *vs, const sto_key_parts *pt, vis_verdict *out) {
    /* Entries of one cell come highest version first: only the first can count. */
    if (vs->have_ts && vs->last_ts == pt->ts_us) {
        *out = VIS_SHADOWED;
        return ST_OK;
    }
    vs->have_ts = true;
    vs->last_ts = pt->ts_us;
    *out = VIS_HIDDEN;
    if (pt->version < vs->fam_thr)
        return ST_OK;
    bool hidden;
    st_code rc = vis_col_hidden(vs, pt->ts_us, pt->version, &hidden);
    if (rc != ST_OK || hidden)
        return rc;
    vs->rank++;
    *out = VIS_CELL;
    if (!vs->rule)
        return ST_OK;
    if (sto_gc_rule_garbage(vs->rule, vs->rank, pt->ts_us, vs->now_us, false))
        *out = VIS_GC_AGE;
    else if (sto_gc_rule_garbage(vs->rule, vs->rank, pt->ts_us, vs->now_us, true))
        *out = VIS_GC_VERSIONS;
    return ST_OK;
}

/* Classifies one entry of the current row (the caller calls vis_row_start on a new row). */
static st_code vis_feed(vis_state *vs, st_slice key, const sto_key_parts *pt, vis_verdict *out) {
    if (pt->kind == STO_KEY_ROW_DEL) {
        *out = pt->version > vs->row_thr ? VIS_TOMB : VIS_TOMB_REDUNDANT;
        if (pt->version > vs->row_thr)
            vs->row_thr = pt->version;
        return ST_OK;
    }
    st_code rc = vis_family(vs, key, pt);
    if (rc != ST_OK)
        return rc;
    if (pt->kind == STO_KEY_FAMILY_DEL) {
        *out = pt->version > vs->fam_thr ? VIS_TOMB : VIS_TOMB_REDUNDANT;
        if (pt->version > vs->fam_thr)
            vs->fam_thr = pt->version;
        return ST_OK;
    }
    if ((rc = vis_column(vs, key, pt)) != ST_OK)
        return rc;
    if (pt->kind == STO_KEY_COLUMN_DEL)
        return vis_column_del(vs, pt, out);
    return vis_cell(vs, pt, out);
}

static st_code rr_bad_key(st_err *err, st_slice key) {
    return st_err_set(err, ST_DATA_LOSS,
                      "malformed internal key (%zu bytes) in a memtable or SSTable; the tablet's "
                      "data is corrupt: restore it from a replica or backup",
                      key.len);
}

/* ---- the reader ---- */

struct sto_rowreader {
    sto_kviter *it;
    sto_gc_set *gc;
    vis_state vs;
    bool reverse;
    unsigned flags;   /* STO_ITER_USER / STO_ITER_SYSTEM: the families returned */
    unsigned skipped; /* entries of the current row stepped over for their family kind */
    bool has_start, start_excl, has_end, end_incl;
    st_buf start_enc, end_enc; /* enc(range start / end) */
    st_buf seek_key;           /* seek targets are copied here, never passed from the iterator */
    st_buf row_prefix;         /* enc(row) of the row being read */
    st_buf row;                /* that row, unescaped */
    st_buf last_scanned;
    bool started; /* initial positioning done */
    bool in_row;  /* the iterator is inside row_prefix's row, read forward from its start */
    bool advance; /* the iterator sits on the entry of the cell returned last */
    bool skip;    /* skip_row was called: leave the current row first */
    bool done;
    uint64_t rows; /* rows entered (sto_rowreader_rows) */
    st_code code;  /* sticky error */
    st_err err;
};

static st_code rr_fail(sto_rowreader *r, st_code code, st_err *err) {
    r->code = code;
    if (err)
        *err = r->err;
    return code;
}

/* Seeks to enc(row) followed by suffix[0, n). */
static st_code rr_seek_in(sto_rowreader *r, st_slice prefix, const uint8_t *suffix, size_t n) {
    st_buf_reset(&r->seek_key);
    st_code rc = st_buf_append(&r->seek_key, prefix.data, prefix.len);
    if (rc == ST_OK && n)
        rc = st_buf_append(&r->seek_key, suffix, n);
    if (rc != ST_OK)
        return st_err_set(&r->err, rc, "reading rows: out of memory");
    r->it->ops->seek(r->it, st_buf_slice(&r->seek_key));
    return ST_OK;
}

/* Seeks to enc(row) (the row's first entry) or, with after, to enc(row) 0x03, which sorts after
 * every entry of the row and before the next row. */
static st_code rr_seek_row(sto_rowreader *r, st_slice prefix, bool after) {
    static const uint8_t past_row = 0x03;
    return rr_seek_in(r, prefix, &past_row, after ? 1 : 0);
}

/* Positions on the first entry of the range (forward) or the last (reverse). */
static st_code rr_position(sto_rowreader *r) {
    sto_kviter *it = r->it;
    if (!r->reverse) {
        if (!r->has_start) {
            it->ops->seek_first(it);
            return ST_OK;
        }
        return rr_seek_row(r, st_buf_slice(&r->start_enc), false);
    }
    if (!r->has_end) {
        it->ops->seek_last(it);
        return ST_OK;
    }
    st_code rc = rr_seek_row(r, st_buf_slice(&r->end_enc), r->end_incl);
    if (rc != ST_OK)
        return rc;
    if (it->ops->valid(it))
        it->ops->prev(it);
    else if (it->ops->status(it, NULL) == ST_OK)
        it->ops->seek_last(it);
    return ST_OK;
}

/* Reverse: moves from inside the row with this prefix to the last entry of the row before. */
static st_code rr_before_row(sto_rowreader *r, st_slice prefix) {
    st_code rc = rr_seek_row(r, prefix, false);
    if (rc == ST_OK && r->it->ops->valid(r->it))
        r->it->ops->prev(r->it);
    return rc;
}

/* Leaves the current row: forward past its last entry, reverse before its first. */
static st_code rr_leave_row(sto_rowreader *r) {
    r->in_row = false;
    if (r->reverse)
        return rr_before_row(r, st_buf_slice(&r->row_prefix));
    return rr_seek_row(r, st_buf_slice(&r->row_prefix), true);
}

/* Makes the row whose entries start with prefix the current one; reverse, where we stand at its
 * last entry, also moves to its first. */
static st_code rr_start_row(sto_rowreader *r, st_slice prefix) {
    st_code rc = vis_set_prefix(&r->row_prefix, prefix, prefix.len);
    if (rc == ST_OK)
        rc = sto_key_unescape(prefix, &r->row);
    if (rc == ST_OK) {
        st_buf_reset(&r->last_scanned);
        rc = st_buf_append(&r->last_scanned, r->row.data, r->row.len);
    }
    if (rc != ST_OK)
        return st_err_set(&r->err, rc, "reading rows: %s",
                          rc == ST_DATA_LOSS ? "malformed row key" : "out of memory");
    vis_row_start(&r->vs);
    r->in_row = true;
    r->skipped = 0;
    r->rows++;
    return r->reverse ? rr_seek_row(r, st_buf_slice(&r->row_prefix), false) : ST_OK;
}

/* At an entry of a row not yet entered: enters it when it is in range, steps over it when it is
 * out of range on the side we come from (*moved), or ends the scan (r->done). */
static st_code rr_enter_row(sto_rowreader *r, st_slice prefix, bool *moved) {
    int cs = r->has_start ? st_slice_cmp(prefix, st_buf_slice(&r->start_enc)) : 1;
    int ce = r->has_end ? st_slice_cmp(prefix, st_buf_slice(&r->end_enc)) : -1;
    bool before_start = cs < 0 || (cs == 0 && r->start_excl);
    bool after_end = ce > 0 || (ce == 0 && !r->end_incl);
    *moved = false;
    if (r->reverse ? before_start : after_end) {
        r->done = true;
        return ST_OK;
    }
    if (before_start || after_end) {
        *moved = true;
        /* prefix points into the iterator's key: keep a copy that outlives the seek. */
        st_code rc = vis_set_prefix(&r->row_prefix, prefix, prefix.len);
        if (rc != ST_OK)
            return st_err_set(&r->err, rc, "reading rows: out of memory");
        return r->reverse ? rr_before_row(r, st_buf_slice(&r->row_prefix))
                          : rr_seek_row(r, st_buf_slice(&r->row_prefix), true);
    }
    return rr_start_row(r, prefix);
}

static void rr_fill(sto_rowreader *r, const sto_key_parts *pt, sto_cell *cell) {
    cell->row = st_buf_slice(&r->row);
    cell->family = st_buf_slice(&r->vs.fam_name);
    cell->qualifier = st_buf_slice(&r->vs.qual);
    cell->ts_us = pt->ts_us;
    cell->value = r->it->ops->value(r->it);
    cell->version = pt->version; /* the first entry of the coordinate: its highest version */
}

/* The iterator is not valid: an error, the end of the scan, or (reverse) the end of a row. */
static st_code rr_at_end(sto_rowreader *r, bool *again) {
    st_code rc = r->it->ops->status(r->it, &r->err);
    *again = false;
    if (rc != ST_OK)
        return rc;
    if (r->reverse && r->in_row) {
        *again = true;
        return rr_leave_row(r);
    }
    r->done = true;
    return ST_NOT_FOUND;
}

/* Handles an entry of a row other than the one being read. */
static st_code rr_new_row(sto_rowreader *r, st_slice key, size_t plen) {
    if (r->in_row && r->reverse)
        return rr_leave_row(r);
    bool moved;
    r->in_row = false;
    return rr_enter_row(r, st_slice_make(key.data, plen), &moved);
}

/* Whether the reader returns the family kind of this entry (row tombstones always count). */
static inline bool rr_wanted(const sto_rowreader *r, st_slice key, const sto_key_parts *pt) {
    if (r->flags == STO_ITER_USER) /* the common case: one byte compare for user entries */
        return !vis_key_system(key, pt);
    if (r->flags == STO_ITER_SYSTEM)
        return pt->kind == STO_KEY_ROW_DEL || vis_key_system(key, pt);
    return true;
}

/* Steps over an entry of a family kind the reader does not return; past RR_SKIP_STEPS of them in
 * a row it seeks instead (a seek costs a few steps). A row's system entries come before its user
 * entries, so a reader of user families seeks to enc(row) 0x02 0x01, the first key a user family
 * can have, and a reader of system families, once it meets a user family, leaves the row. */
#define RR_SKIP_STEPS 4
static st_code rr_skip_entry(sto_rowreader *r, st_slice key, const sto_key_parts *pt) {
    if (++r->skipped <= RR_SKIP_STEPS) {
        r->it->ops->next(r->it);
        return ST_OK;
    }
    r->skipped = 0;
    if (!vis_key_system(key, pt))
        return rr_leave_row(r);
    static const uint8_t first_user[2] = {0x02, 0x01};
    return rr_seek_in(r, st_buf_slice(&r->row_prefix), first_user, sizeof first_user);
}

/* Scans entries until a visible cell (ST_OK), the end (ST_NOT_FOUND) or an error. */
static st_code rr_scan(sto_rowreader *r, sto_cell *cell) {
    sto_kviter *it = r->it;
    for (;;) {
        st_code rc;
        if (!it->ops->valid(it)) {
            bool again;
            rc = rr_at_end(r, &again);
            if (rc != ST_OK || !again)
                return rc;
            continue;
        }
        st_slice key = it->ops->key(it);
        sto_key_parts pt;
        if (!sto_key_parse(key, &pt))
            return rr_bad_key(&r->err, key);
        if (!r->in_row || !vis_prefix_eq(&r->row_prefix, key, pt.row_end)) {
            if ((rc = rr_new_row(r, key, pt.row_end)) != ST_OK)
                return rc;
            if (r->done)
                return ST_NOT_FOUND;
            if (!r->in_row || r->reverse)
                continue; /* the iterator moved: look again */
        }
        if (!rr_wanted(r, key, &pt)) {
            if ((rc = rr_skip_entry(r, key, &pt)) != ST_OK)
                return rc;
            continue;
        }
        vis_verdict v;
        if ((rc = vis_feed(&r->vs, key, &pt, &v)) != ST_OK)
            return st_err_set(&r->err, rc, "reading rows: out of memory");
        if (v == VIS_CELL) {
            rr_fill(r, &pt, cell);
            r->advance = true;
            return ST_OK;
        }
        it->ops->next(it);
    }
}

st_code sto_rowreader_next(sto_rowreader *r, sto_cell *cell, st_err *err) {
    if (r->code != ST_OK)
        return rr_fail(r, r->code, err);
    if (r->done)
        return ST_NOT_FOUND;
    st_code rc = ST_OK;
    if (!r->started) {
        rc = rr_position(r);
        r->started = true;
    } else if (r->skip && r->in_row) {
        rc = rr_leave_row(r);
    } else if (r->advance) {
        r->it->ops->next(r->it);
    }
    r->skip = r->advance = false;
    if (rc == ST_OK)
        rc = rr_scan(r, cell);
    if (rc != ST_OK && rc != ST_NOT_FOUND)
        return rr_fail(r, rc, err);
    return rc;
}

void sto_rowreader_skip_row(sto_rowreader *r) {
    r->skip = r->advance;
}

st_slice sto_rowreader_last_scanned_row(sto_rowreader *r) {
    return st_buf_slice(&r->last_scanned);
}

uint64_t sto_rowreader_rows(const sto_rowreader *r) {
    return r->rows;
}

/* ---- reuse ----
 * A point read creates and frees a reader; its calloc and the first growth of its ten buffers
 * were a third of the allocations of a read. Each thread keeps the last reader it freed (buffers
 * included, unless they grew past RR_KEEP_BYTES) for its next read; the thread's end frees it. */
#define RR_KEEP_BYTES (16u << 10)

static void rr_destroy(void *p) {
    sto_rowreader *r = p;
    vis_deinit(&r->vs);
    st_buf_free(&r->start_enc);
    st_buf_free(&r->end_enc);
    st_buf_free(&r->row_prefix);
    st_buf_free(&r->row);
    st_buf_free(&r->last_scanned);
    st_buf_free(&r->seek_key);
    free(r);
}

static _Thread_local st_tl_stash rr_tl = ST_TL_STASH_INIT(1, rr_destroy);

static size_t rr_kept_bytes(const sto_rowreader *r) {
    const st_buf *bs[] = {&r->start_enc,     &r->end_enc,  &r->row_prefix,    &r->row,
                          &r->last_scanned,  &r->seek_key, &r->vs.fam_prefix, &r->vs.fam_name,
                          &r->vs.col_prefix, &r->vs.qual};
    size_t n = (r->vs.cap_dels + r->vs.cap_heap) * sizeof *r->vs.dels;
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++)
        n += bs[i]->cap;
    return n;
}

/* A reader with every field as calloc + init would leave it, its buffers kept (emptied). */
static sto_rowreader *rr_take(void) {
    sto_rowreader *r = st_tl_stash_take(&rr_tl);
    if (!r)
        return NULL;
    sto_rowreader keep = *r;
    memset(r, 0, sizeof *r);
    st_buf *mine[] = {&r->start_enc,     &r->end_enc,  &r->row_prefix,    &r->row,
                      &r->last_scanned,  &r->seek_key, &r->vs.fam_prefix, &r->vs.fam_name,
                      &r->vs.col_prefix, &r->vs.qual};
    const st_buf *kept[] = {&keep.start_enc,     &keep.end_enc,      &keep.row_prefix,
                            &keep.row,           &keep.last_scanned, &keep.seek_key,
                            &keep.vs.fam_prefix, &keep.vs.fam_name,  &keep.vs.col_prefix,
                            &keep.vs.qual};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) {
        *mine[i] = *kept[i];
        mine[i]->len = 0;
    }
    r->vs.dels = keep.vs.dels;
    r->vs.cap_dels = keep.vs.cap_dels;
    r->vs.heap = keep.vs.heap;
    r->vs.cap_heap = keep.vs.cap_heap;
    return r;
}

void sto_rowreader_free(sto_rowreader *r) {
    if (!r)
        return;
    if (r->it)
        r->it->ops->free(r->it);
    r->it = NULL;
    sto_gc_set_unref(r->gc);
    r->gc = NULL;
    if (rr_kept_bytes(r) > RR_KEEP_BYTES || !st_tl_stash_put(&rr_tl, r))
        rr_destroy(r);
}

static st_code rr_set_range(sto_rowreader *r, const sto_range *range) {
    if (!range)
        return ST_OK;
    r->has_start = range->start.len > 0;
    r->start_excl = range->start_exclusive;
    r->has_end = range->end.len > 0;
    r->end_incl = range->end_inclusive;
    st_code rc = ST_OK;
    if (r->has_start)
        rc = sto_key_encode_row_prefix(&r->start_enc, range->start);
    if (rc == ST_OK && r->has_end)
        rc = sto_key_encode_row_prefix(&r->end_enc, range->end);
    return rc;
}

st_code sto_rowreader_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us,
                          const sto_range *range, bool reverse, unsigned flags, sto_rowreader **out,
                          st_err *err) {
    if (!merged)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "creating a row reader: out of memory");
    sto_rowreader *r = rr_take();
    if (!r && (r = calloc(1, sizeof *r)) != NULL) {
        vis_init(&r->vs, NULL, 0, true);
        st_buf_init(&r->start_enc);
        st_buf_init(&r->end_enc);
        st_buf_init(&r->row_prefix);
        st_buf_init(&r->row);
        st_buf_init(&r->last_scanned);
        st_buf_init(&r->seek_key);
    }
    if (!r) {
        merged->ops->free(merged);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "creating a row reader: out of memory");
    }
    r->it = merged;
    r->gc = gc;
    if (gc)
        sto_gc_set_ref(gc);
    r->reverse = reverse;
    r->flags = flags & (STO_ITER_USER | STO_ITER_SYSTEM);
    r->vs.gc = gc;
    r->vs.now_us = now_us;
    r->vs.want_qual = true;
    if (rr_set_range(r, range) != ST_OK) {
        sto_rowreader_free(r);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "creating a row reader: out of memory");
    }
    *out = r;
    return ST_OK;
}

/* ---- the compaction filter ---- */

typedef struct compact_iter {
    sto_kviter base;
    sto_kviter *in;
    sto_gc_set *gc;
    vis_state vs;
    bool full;
    uint64_t drop_below;
    st_buf row_prefix;
    bool in_row;
    sto_gc_report_buf *report; /* NULL: no report */
    st_buf row_raw, qual_raw;  /* unescaped row and qualifier of a reported cell */
    bool row_raw_ok;           /* row_raw holds the current row */
    st_code code;              /* sticky error of the filter itself */
    st_err err;
} compact_iter;

static bool ci_keep(const compact_iter *c, vis_verdict v, const sto_key_parts *pt) {
    switch (v) {
    case VIS_CELL:
        return true;
    case VIS_GC_VERSIONS:
        return !c->full;
    case VIS_TOMB:
        return !(c->full && pt->version < c->drop_below);
    case VIS_HIDDEN:
    case VIS_SHADOWED:
    case VIS_GC_AGE:
    case VIS_TOMB_REDUNDANT:
        return false;
    }
    return true;
}

static st_code ci_append_part(st_buf *b, st_slice part) {
    st_code rc = st_buf_append_fixed32(b, (uint32_t)part.len);
    return rc == ST_OK ? st_buf_append(b, part.data, part.len) : rc;
}

/* Adds a cell of a user family the compaction drops as GC garbage to the report. A cell that
 * does not fit (max_bytes, or no memory) is counted, not stored: the report is best effort, and
 * the compaction goes on. */
static void ci_report(compact_iter *c, st_slice key, const sto_key_parts *pt) {
    sto_gc_report_buf *r = c->report;
    st_code rc = ST_OK;
    if (!c->row_raw_ok)
        rc = sto_key_unescape(st_slice_make(key.data, pt->row_end), &c->row_raw);
    c->row_raw_ok = rc == ST_OK;
    if (rc == ST_OK)
        rc = sto_key_unescape(
            st_slice_make(key.data + pt->fam_end + 1, pt->qual_end - pt->fam_end - 1),
            &c->qual_raw);
    st_slice fam = st_buf_slice(&c->vs.fam_name);
    size_t need = 3 * 4 + 8 + c->row_raw.len + fam.len + c->qual_raw.len;
    if (rc != ST_OK || r->data.len + need > r->max_bytes) {
        r->cut++;
        return;
    }
    size_t at = r->data.len;
    rc = ci_append_part(&r->data, st_buf_slice(&c->row_raw));
    if (rc == ST_OK)
        rc = ci_append_part(&r->data, fam);
    if (rc == ST_OK)
        rc = ci_append_part(&r->data, st_buf_slice(&c->qual_raw));
    if (rc == ST_OK)
        rc = st_buf_append_fixed64(&r->data, (uint64_t)pt->ts_us);
    if (rc != ST_OK) {
        r->data.len = at;
        r->cut++;
        return;
    }
    r->cells++;
}

static bool gc_report_part(const sto_gc_report_buf *r, size_t *pos, st_slice *out) {
    if (r->data.len - *pos < 4)
        return false;
    uint32_t n = st_get_fixed32(r->data.data + *pos);
    if (r->data.len - *pos - 4 < n)
        return false;
    *out = st_slice_make(r->data.data + *pos + 4, n);
    *pos += 4 + (size_t)n;
    return true;
}

bool sto_gc_report_next(const sto_gc_report_buf *r, size_t *pos, sto_gc_dropped *out) {
    size_t p = *pos;
    if (!gc_report_part(r, &p, &out->row) || !gc_report_part(r, &p, &out->family) ||
        !gc_report_part(r, &p, &out->qualifier) || r->data.len - p < 8)
        return false;
    out->ts_us = (int64_t)st_get_fixed64(r->data.data + p);
    *pos = p + 8;
    return true;
}

/* Moves the input forward to the next entry to keep (or its end). */
static void ci_settle(compact_iter *c) {
    sto_kviter *in = c->in;
    while (c->code == ST_OK && in->ops->valid(in)) {
        st_slice key = in->ops->key(in);
        sto_key_parts pt;
        if (!sto_key_parse(key, &pt)) {
            c->code = rr_bad_key(&c->err, key);
            return;
        }
        st_code rc = ST_OK;
        if (!c->in_row || !vis_prefix_eq(&c->row_prefix, key, pt.row_end)) {
            rc = vis_set_prefix(&c->row_prefix, key, pt.row_end);
            vis_row_start(&c->vs);
            c->in_row = true;
            c->row_raw_ok = false;
        }
        vis_verdict v = VIS_CELL;
        if (rc == ST_OK)
            rc = vis_feed(&c->vs, key, &pt, &v);
        if (rc != ST_OK) {
            c->code = st_err_set(&c->err, rc, "compaction: out of memory");
            return;
        }
        if (ci_keep(c, v, &pt))
            return;
        if (c->report && (v == VIS_GC_AGE || v == VIS_GC_VERSIONS) && !vis_key_system(key, &pt))
            ci_report(c, key, &pt);
        in->ops->next(in);
    }
}

static void ci_unsupported(compact_iter *c) {
    c->code = st_err_set(&c->err, ST_INTERNAL,
                         "the compaction filter only iterates forward from seek_first (a bug)");
}

static void ci_seek(sto_kviter *b, st_slice target) {
    (void)target;
    ci_unsupported((compact_iter *)b);
}
static void ci_seek_last(sto_kviter *b) {
    ci_unsupported((compact_iter *)b);
}
static void ci_prev(sto_kviter *b) {
    ci_unsupported((compact_iter *)b);
}

static void ci_seek_first(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    c->in->ops->seek_first(c->in);
    c->in_row = false;
    ci_settle(c);
}

static void ci_next(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    ST_ASSERT(c->code == ST_OK && c->in->ops->valid(c->in));
    c->in->ops->next(c->in);
    ci_settle(c);
}

static bool ci_valid(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    return c->code == ST_OK && c->in->ops->valid(c->in);
}
static st_slice ci_key(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    return c->in->ops->key(c->in);
}
static st_slice ci_value(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    return c->in->ops->value(c->in);
}
static st_code ci_status(sto_kviter *b, st_err *err) {
    compact_iter *c = (compact_iter *)b;
    if (c->code != ST_OK) {
        if (err)
            *err = c->err;
        return c->code;
    }
    return c->in->ops->status(c->in, err);
}
static void ci_free(sto_kviter *b) {
    compact_iter *c = (compact_iter *)b;
    if (!c)
        return;
    c->in->ops->free(c->in);
    sto_gc_set_unref(c->gc);
    vis_deinit(&c->vs);
    st_buf_free(&c->row_prefix);
    st_buf_free(&c->row_raw);
    st_buf_free(&c->qual_raw);
    free(c);
}

static const sto_kviter_ops ci_ops = {
    .seek = ci_seek,
    .seek_first = ci_seek_first,
    .seek_last = ci_seek_last,
    .next = ci_next,
    .prev = ci_prev,
    .valid = ci_valid,
    .key = ci_key,
    .value = ci_value,
    .status = ci_status,
    .free = ci_free,
};

sto_kviter *sto_compact_iter_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us, bool full,
                                 uint64_t drop_tombstones_below) {
    return sto_compact_iter_new_report(merged, gc, now_us, full, drop_tombstones_below, NULL);
}

sto_kviter *sto_compact_iter_new_report(sto_kviter *merged, sto_gc_set *gc, int64_t now_us,
                                        bool full, uint64_t drop_tombstones_below,
                                        sto_gc_report_buf *report) {
    if (!merged)
        return NULL;
    compact_iter *c = calloc(1, sizeof *c);
    if (!c) {
        merged->ops->free(merged);
        return NULL;
    }
    c->base.ops = &ci_ops;
    c->in = merged;
    c->gc = gc;
    if (gc)
        sto_gc_set_ref(gc);
    vis_init(&c->vs, gc, now_us, false);
    c->full = full;
    c->drop_below = drop_tombstones_below;
    c->report = report;
    st_buf_init(&c->row_prefix);
    st_buf_init(&c->row_raw);
    st_buf_init(&c->qual_raw);
    return &c->base;
}
