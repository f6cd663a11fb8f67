/* tablet_sample.c — where a tablet's data lies: row keys about every N bytes (SampleRowKeys) and
 * the row that halves it (split points), from the SSTables' block indexes and the memtables. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tablet_impl.h"

#define MID_SCAN_ENTRIES_MAX 1000000 /* entries scanned for a split point of a tiny tablet */

typedef struct point {
    st_slice row; /* in the arena */
    uint64_t bytes;
} point;

typedef struct points {
    point *p;
    size_t n, cap;
    st_arena arena;
    st_buf scratch;
    sto_tablet *t;
    uint64_t prev_end;
    bool oom;
} points;

static void points_add(points *ps, st_slice ikey, uint64_t bytes) {
    st_slice row;
    if (ps->oom || !sto_key_row(ikey, &row, &ps->scratch))
        return;
    sto_tablet *t = ps->t;
    if (st_slice_cmp(row, st_buf_slice(&t->start)) < 0 ||
        (t->end.len && st_slice_cmp(row, st_buf_slice(&t->end)) >= 0))
        return; /* a shared table's rows of the sibling */
    if (ps->n == ps->cap) {
        size_t ncap = ps->cap ? ps->cap * 2 : 256;
        point *np = realloc(ps->p, ncap * sizeof *np);
        if (!np) {
            ps->oom = true;
            return;
        }
        ps->p = np;
        ps->cap = ncap;
    }
    void *copy = st_arena_dup(&ps->arena, row.data, row.len ? row.len : 1);
    if (!copy) {
        ps->oom = true;
        return;
    }
    ps->p[ps->n++] = (point){st_slice_make(copy, row.len), bytes};
}

static void block_fn(st_slice last_ikey, uint64_t end_offset, void *arg) {
    points *ps = arg;
    uint64_t bytes = end_offset > ps->prev_end ? end_offset - ps->prev_end : 0;
    ps->prev_end = end_offset;
    points_add(ps, last_ikey, bytes);
}

/* A point every block_bytes of memtable entries, so memtables weigh like the tables they become. */
static void mem_points(points *ps, sto_memtable *m, uint64_t lsn, size_t block_bytes) {
    sto_kviter *it = sto_memtable_iter_new(m, lsn);
    if (!it)
        return;
    uint64_t acc = 0;
    st_slice last = {NULL, 0};
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it)) {
        last = it->ops->key(it);
        acc += last.len + it->ops->value(it).len;
        if (acc >= block_bytes) {
            points_add(ps, last, acc);
            acc = 0;
        }
    }
    if (acc && last.len)
        points_add(ps, last, acc);
    it->ops->free(it);
}

static int cmp_point(const void *a, const void *b) {
    return st_slice_cmp(((const point *)a)->row, ((const point *)b)->row);
}

static st_code collect_points(sto_tablet *t, points *ps, st_err *err) {
    memset(ps, 0, sizeof *ps);
    ps->t = t;
    st_arena_init(&ps->arena, 64 << 10);
    st_buf_init(&ps->scratch);
    sto_snapshot *s;
    st_code rc = sto_snapshot_new(t, &s, err);
    if (rc != ST_OK)
        return rc;
    for (size_t i = 0; i < s->n_ssts; i++) {
        ps->prev_end = 0;
        sto_sst_for_each_block(s->ssts[i].sst, block_fn, ps);
    }
    for (size_t i = 0; i < s->n_mems; i++)
        mem_points(ps, s->mems[i], s->lsn, t->db->o.block_bytes ? t->db->o.block_bytes : 16384);
    sto_snapshot_free(s);
    if (ps->oom)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory sampling row keys");
    if (ps->n)
        qsort(ps->p, ps->n, sizeof *ps->p, cmp_point);
    return ST_OK;
}

static void points_free(points *ps) {
    free(ps->p);
    st_arena_deinit(&ps->arena);
    st_buf_free(&ps->scratch);
}

st_code sto_tablet_sample_keys(sto_tablet *t, uint64_t every_bytes,
                               void (*fn)(st_slice row, uint64_t offset_bytes, void *arg),
                               void *arg, st_err *err) {
    points ps;
    st_code rc = collect_points(t, &ps, err);
    if (rc == ST_OK) {
        uint64_t acc = 0, last_emit = 0;
        st_slice prev = {NULL, 0};
        for (size_t i = 0; i < ps.n; i++) {
            acc += ps.p[i].bytes;
            if (acc - last_emit >= every_bytes && !(prev.data && st_slice_eq(prev, ps.p[i].row))) {
                fn(ps.p[i].row, acc, arg);
                last_emit = acc;
                prev = ps.p[i].row;
            }
        }
    }
    points_free(&ps);
    return rc;
}

/* Small tablets: the middle distinct row by count, from a scan of all entries. */
static st_code mid_by_scan(sto_tablet *t, st_buf *out, st_err *err) {
    sto_snapshot *s;
    st_code rc = sto_snapshot_new(t, &s, err);
    if (rc != ST_OK)
        return rc;
    key_bounds none = {{NULL, 0, 0}, {NULL, 0, 0}, false};
    size_t rows = 0, target = 0;
    rc = ST_NOT_FOUND;
    for (int pass = 0; pass < 2 && rc == ST_NOT_FOUND; pass++) {
        sto_kviter *it = tablet_snapshot_merge(s, &none, NULL);
        if (!it) {
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory finding a split point");
            break;
        }
        st_buf prev;
        st_buf_init(&prev);
        size_t seen = 0, entries = 0;
        for (it->ops->seek_first(it); it->ops->valid(it) && entries < MID_SCAN_ENTRIES_MAX;
             it->ops->next(it), entries++) {
            st_slice k = it->ops->key(it);
            st_slice p = st_slice_make(k.data, sto_key_row_prefix_len(k));
            if (seen && st_slice_eq(p, st_buf_slice(&prev)))
                continue;
            seen++;
            st_buf_reset(&prev);
            st_buf_append(&prev, p.data, p.len);
            if (pass == 1 && seen == target + 1) {
                st_slice row;
                st_buf scratch;
                st_buf_init(&scratch);
                if (sto_key_row(k, &row, &scratch)) {
                    st_buf_reset(out);
                    rc = st_buf_append(out, row.data, row.len);
                }
                st_buf_free(&scratch);
                break;
            }
        }
        st_code st = it->ops->status(it, err);
        it->ops->free(it);
        st_buf_free(&prev);
        if (st != ST_OK)
            rc = st;
        if (pass == 0) {
            rows = seen;
            if (rows < 2)
                break;
            target = rows / 2;
        }
    }
    sto_snapshot_free(s);
    if (rc == ST_NOT_FOUND)
        st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " has fewer than two rows", t->id);
    return rc;
}

st_code sto_tablet_mid_key(sto_tablet *t, st_buf *out, st_err *err) {
    points ps;
    st_code rc = collect_points(t, &ps, err);
    if (rc == ST_OK) {
        uint64_t total = 0, acc = 0;
        for (size_t i = 0; i < ps.n; i++)
            total += ps.p[i].bytes;
        rc = ST_NOT_FOUND;
        for (size_t i = 0; i < ps.n && rc == ST_NOT_FOUND; i++) {
            acc += ps.p[i].bytes;
            /* the row must leave data on both sides: above the first point's row */
            if (acc * 2 >= total && i > 0 && st_slice_cmp(ps.p[i].row, ps.p[0].row) > 0 &&
                i + 1 < ps.n) {
                st_buf_reset(out);
                rc = st_buf_append(out, ps.p[i].row.data, ps.p[i].row.len);
            }
        }
    }
    points_free(&ps);
    if (rc == ST_NOT_FOUND)
        return mid_by_scan(t, out, err);
    return rc;
}
