/* tablet_snapshot.c — snapshots of a tablet (its memtables and a shared list of its SSTables at
 * one lsn) and the iterators that read them: a merge of the memtables and of the runs of tables
 * that may hold the range, read through the row reader. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tablet_impl.h"

/* The tablet's SSTables as snapshots read them, immutable and shared: a snapshot takes one
 * reference on the set instead of one on every table. With ~64 tables after a sequential load
 * and two reader threads, the per-table counters bouncing between cores were 7% of a point
 * read's CPU (LevelDB shares its Version the same way). The tablet holds one reference while its
 * list is unchanged; sto_tablet_update_hints_locked drops it whenever the list changes. */
struct sto_snapset {
    atomic_size_t refs;
    size_t n;
    snap_sst ssts[];
};

static void snapset_unref(sto_snapset *ss) {
    if (!ss || atomic_fetch_sub(&ss->refs, 1) != 1)
        return;
    for (size_t i = 0; i < ss->n; i++)
        sto_sst_unref(ss->ssts[i].sst);
    free(ss);
}

void sto_tablet_drop_snapset(sto_tablet *t) {
    snapset_unref(t->snapset);
    t->snapset = NULL;
}

/* t->mu held: the shared set, built when the list changed since the last one; NULL when out of
 * memory. The caller owns one reference. */
static sto_snapset *snapset_get_locked(sto_tablet *t) {
    if (!t->snapset) {
        sto_snapset *ss = malloc(sizeof *ss + t->n_ssts * sizeof(snap_sst));
        if (!ss)
            return NULL;
        atomic_init(&ss->refs, 1); /* the tablet's */
        ss->n = t->n_ssts;
        for (size_t i = 0; i < t->n_ssts; i++) {
            sto_sst_ref(t->ssts[i].f->sst);
            ss->ssts[i] = (snap_sst){t->ssts[i].f->sst, t->ssts[i].wrap, t->ssts[i].nosys};
        }
        t->snapset = ss;
    }
    atomic_fetch_add(&t->snapset->refs, 1);
    return t->snapset;
}

struct sto_iter {
    sto_tablet *t;
    sto_rowreader *rr;
    /* what a compaction would save this read (compaction.c's read-triggered compaction): sorted
     * runs beyond the first, and memtables merged with other sources */
    int extra_runs, extra_mems;
};

void sto_snapshot_free(sto_snapshot *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->n_mems; i++)
        sto_memtable_unref(s->mems[i]);
    sto_sst_keep_deinit(&s->keep);
    snapset_unref(s->set);
    if (s->gc)
        sto_gc_set_unref(s->gc);
    free(s); /* mems and ssts live in the same allocation */
}

/* t->mu held: refs on everything the snapshot reads. */
static void snapshot_fill(sto_tablet *t, sto_snapshot *s) {
    sto_db *db = t->db;
    s->lsn = atomic_load(&db->applied_lsn);
    for (size_t i = t->n_imm; i > 0; i--) { /* newest first */
        sto_memtable_ref(t->imm[i - 1].m);
        s->mems[s->n_mems++] = t->imm[i - 1].m;
    }
    sto_memtable_ref(t->active);
    s->mems[s->n_mems++] = t->active;
    s->ssts = s->set->ssts;
    s->n_ssts = s->set->n;
    s->gc = t->gc;
    sto_gc_set_ref(s->gc);
}

/* The snapshot with room for n_mems memtables after it (one allocation). */
static sto_snapshot *snapshot_alloc(size_t n_mems) {
    size_t head = (sizeof(sto_snapshot) + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    sto_snapshot *s = malloc(head + n_mems * sizeof *s->mems);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    sto_sst_keep_init(&s->keep);
    s->mems = (sto_memtable **)(void *)((char *)s + head);
    return s;
}

st_code sto_snapshot_new(sto_tablet *t, sto_snapshot **out, st_err *err) {
    st_code rc = ST_OK;
    sto_snapshot *s = NULL;
    pthread_mutex_lock(&t->mu);
    if (t->broken)
        rc = st_err_set(err, ST_DATA_LOSS, "tablet %" PRIu64 " cannot be read: %s", t->id,
                        t->ro_msg);
    else if (!t->active)
        rc = st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is gone", t->id);
    else if (!(s = snapshot_alloc(t->n_imm + 1)) || !(s->set = snapset_get_locked(t))) {
        free(s);
        s = NULL;
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory taking a snapshot");
    }
    if (rc == ST_OK) {
        s->t = t;
        snapshot_fill(t, s);
    }
    pthread_mutex_unlock(&t->mu);
    if (rc != ST_OK)
        return rc;
    *out = s;
    return ST_OK;
}

/* Each thread keeps the buffers of its last read's bounds (freed when the thread ends): two
 * allocations fewer per point read. */
#define BOUNDS_KEEP_BYTES 4096 /* larger buffers are freed, not kept */

typedef struct bounds_cache {
    st_tl_cache tl; /* first: the drain gets the cache */
    st_buf lo, hi;  /* empty while lent out */
} bounds_cache;

static void bounds_cache_drain(st_tl_cache *c) {
    bounds_cache *bc = (bounds_cache *)c;
    st_buf_free(&bc->lo);
    st_buf_free(&bc->hi);
}

static _Thread_local bounds_cache bounds_tl = {.tl.drain = bounds_cache_drain};

static void bounds_take(key_bounds *b) {
    b->lo = bounds_tl.lo;
    b->hi = bounds_tl.hi;
    b->lo.len = b->hi.len = 0;
    st_buf_init(&bounds_tl.lo); /* the cache holds nothing until bounds_free */
    st_buf_init(&bounds_tl.hi);
}

static void bounds_free(key_bounds *b) {
    if (!bounds_tl.lo.data && !bounds_tl.hi.data && b->lo.cap + b->hi.cap <= BOUNDS_KEEP_BYTES &&
        st_tl_cache_ready(&bounds_tl.tl)) {
        bounds_tl.lo = b->lo;
        bounds_tl.hi = b->hi;
        return;
    }
    st_buf_free(&b->lo);
    st_buf_free(&b->hi);
}

static st_code bounds_init(key_bounds *b, const sto_range *r) {
    bounds_take(b);
    b->point = false;
    if (!r)
        return ST_OK;
    st_code rc = ST_OK;
    if (r->start.len)
        rc = sto_key_encode_row_prefix(&b->lo, r->start);
    if (rc == ST_OK && r->end.len) {
        rc = sto_key_encode_row_prefix(&b->hi, r->end);
        if (rc == ST_OK && r->end_inclusive)
            rc = st_buf_append_byte(&b->hi, 0xff);
    }
    b->point =
        r->start.len && r->end_inclusive && !r->start_exclusive && st_slice_eq(r->start, r->end);
    return rc;
}

static bool sst_skippable(sto_sst *sst, const key_bounds *b) {
    if (b->lo.len && st_slice_cmp(sto_sst_largest(sst), st_buf_slice(&b->lo)) < 0)
        return true;
    if (b->hi.len && st_slice_cmp(sto_sst_smallest(sst), st_buf_slice(&b->hi)) >= 0)
        return true;
    if (b->point && !sto_sst_may_contain_row(sst, st_buf_slice(&b->lo)))
        return true;
    return false;
}

/* One child for tabs[0, n): a plain table iterator, or for several tables with pairwise disjoint
 * key ranges a concatenation that opens one table at a time, so a seek reads one block of the
 * run instead of one block per table (sequentially written tablets have many such tables). */
static sto_kviter *run_iter(sto_snapshot *s, sto_sst **tabs, bool *wrap, bool nosys, size_t n) {
    sto_tablet *t = s->t;
    sto_kviter *it;
    if (n > 1) {
        it = sto_sst_concat_iter_new(tabs, wrap, n, st_buf_slice(&t->lo), st_buf_slice(&t->hi),
                                     sto_range_iter_new, &s->keep);
    } else {
        it = sto_sst_iter_new_kept(tabs[0], &s->keep);
        if (it && wrap[0])
            it = sto_range_iter_new(it, st_buf_slice(&t->lo), st_buf_slice(&t->hi));
    }
    if (it && nosys) /* a run of restored tables (runs never mix restored and other tables) */
        it = sto_nosys_iter_new(it);
    return it;
}

/* Children: memtables (lsn-bounded; an empty one holds nothing the snapshot may see, as entries
 * are never removed), then SSTables that may hold rows of the range, grouped into runs of
 * consecutive tables (newest first) with disjoint ranges: equal keys can only come from
 * different runs, so the merge's newest-first tie order is kept. */
sto_kviter *tablet_snapshot_merge(sto_snapshot *s, const key_bounds *b, int counts[2]) {
    size_t cap = s->n_mems + s->n_ssts + 1;
    sto_kviter **kids = malloc(cap * (sizeof(sto_kviter *) + sizeof(sto_sst *) + 2 * sizeof(bool)));
    if (!kids)
        return NULL;
    sto_sst **tabs = (sto_sst **)(void *)(kids + cap);
    bool *wrap = (bool *)(void *)(tabs + cap);
    bool *nosys = wrap + cap;
    size_t k = 0, m = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < s->n_mems; i++) {
        if (sto_memtable_empty(s->mems[i]))
            continue;
        kids[k] = sto_memtable_iter_new(s->mems[i], s->lsn);
        ok = kids[k++] != NULL;
    }
    size_t mems = k;
    for (size_t i = 0; i < s->n_ssts; i++) {
        if (sst_skippable(s->ssts[i].sst, b))
            continue;
        tabs[m] = s->ssts[i].sst;
        nosys[m] = s->ssts[i].nosys;
        wrap[m++] = s->ssts[i].wrap;
    }
    size_t run = 0; /* the current run is tabs[run, i) */
    for (size_t i = 0; ok && i <= m; i++) {
        bool fits = i < m && i - run < STO_SST_CONCAT_MAX && nosys[i] == nosys[run];
        for (size_t j = run; fits && j < i; j++)
            fits = sto_sst_disjoint(tabs[j], tabs[i]);
        if (fits || i == run)
            continue;
        kids[k] = run_iter(s, tabs + run, wrap + run, nosys[run], i - run);
        ok = kids[k++] != NULL;
        run = i;
    }
    sto_kviter *it = NULL;
    if (ok)
        it = sto_merge_iter_new(kids, k);
    else
        for (size_t i = 0; i + 1 < k; i++)
            kids[i]->ops->free(kids[i]);
    free(kids);
    if (counts) {
        counts[0] = (int)mems;
        counts[1] = (int)(k - mems);
    }
    return it;
}

st_code sto_iter_new(sto_snapshot *s, const sto_range *range, bool reverse, sto_iter **out,
                     st_err *err) {
    return sto_iter_new_flags(s, range, reverse, STO_ITER_USER, out, err);
}

st_code sto_iter_new_flags(sto_snapshot *s, const sto_range *range, bool reverse, unsigned flags,
                           sto_iter **out, st_err *err) {
    if (!(flags & (STO_ITER_USER | STO_ITER_SYSTEM)))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "an iterator must return user families, system families or both "
                          "(flags %#x); pass STO_ITER_USER and/or STO_ITER_SYSTEM",
                          flags);
    key_bounds b;
    int counts[2] = {0, 0};
    st_code rc = bounds_init(&b, range);
    sto_kviter *m = rc == ST_OK ? tablet_snapshot_merge(s, &b, counts) : NULL;
    bounds_free(&b);
    sto_iter *it = calloc(1, sizeof *it);
    if (!m || !it) {
        if (m)
            m->ops->free(m);
        free(it);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a read");
    }
    it->t = s->t;
    it->extra_runs = counts[1] > 1 ? counts[1] - 1 : 0;
    it->extra_mems = counts[1] > 0 || counts[0] > 1 ? counts[0] : 0;
    sto_range all = {{NULL, 0}, false, {NULL, 0}, false};
    rc = sto_rowreader_new(m, s->gc, sto_db_now_us(s->t->db), range ? range : &all, reverse, flags,
                           &it->rr, err);
    if (rc != ST_OK) {
        free(it);
        return rc;
    }
    *out = it;
    return ST_OK;
}

st_code sto_iter_next(sto_iter *it, sto_cell *cell, st_err *err) {
    st_code rc = sto_rowreader_next(it->rr, cell, err);
    if (rc == ST_DATA_LOSS)
        sto_tablet_mark_read_only(it->t, rc, err ? err->msg : "corrupt data met by a read");
    return rc;
}

void sto_iter_skip_row(sto_iter *it) {
    sto_rowreader_skip_row(it->rr);
}

uint64_t sto_snapshot_read_bytes(sto_snapshot *s) {
    return sto_sst_keep_bytes_read(&s->keep);
}

/* Charges the tablet for the sources this read merged beyond one (compaction.c's read-triggered
 * compaction): one unit per extra source for a point read, more for a scan, whose extra cost
 * grows with the rows it crossed (a 100-row scan paid about 11 point reads' worth per source). */
void sto_iter_free(sto_iter *it) {
    if (!it)
        return;
    if (it->extra_runs + it->extra_mems > 0) {
        uint64_t w = 1 + sto_rowreader_rows(it->rr) / 10;
        sto_tablet_charge_reads(it->t, (uint64_t)it->extra_runs * w, (uint64_t)it->extra_mems * w);
    }
    sto_rowreader_free(it->rr);
    free(it);
}

/* ---- tombstones (a tablet move's copy) ---- */

struct sto_tomb_iter {
    sto_tablet *t;
    sto_kviter *m;
    st_buf scratch; /* components of the key returned last, when they held escaped bytes */
    st_buf last;    /* the key returned last: several sources may hold the same tombstone */
    bool started;
    bool unseen; /* the merge stands at an entry not looked at yet */
};

st_code sto_tomb_iter_new(sto_snapshot *s, sto_tomb_iter **out, st_err *err) {
    key_bounds b;
    st_code rc = bounds_init(&b, NULL);
    sto_kviter *m = rc == ST_OK ? tablet_snapshot_merge(s, &b, NULL) : NULL;
    bounds_free(&b);
    sto_tomb_iter *it = calloc(1, sizeof *it);
    if (!m || !it) {
        if (m)
            m->ops->free(m);
        free(it);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a tombstone scan");
    }
    it->t = s->t;
    it->m = m;
    st_buf_init(&it->scratch);
    st_buf_init(&it->last);
    *out = it;
    return ST_OK;
}

/* The tombstone of decoded key k as a row mutation's delete. */
static void tomb_fill(const sto_key *k, sto_tombstone *out) {
    memset(out, 0, sizeof *out);
    out->row = k->row;
    out->version = k->version;
    out->mut.type = k->kind == STO_KEY_ROW_DEL      ? STO_MUT_DEL_ROW
                    : k->kind == STO_KEY_FAMILY_DEL ? STO_MUT_DEL_FAMILY
                                                    : STO_MUT_DEL_COLUMN;
    if (k->kind != STO_KEY_ROW_DEL)
        out->mut.family = k->family;
    if (k->kind == STO_KEY_COLUMN_DEL) {
        out->mut.qualifier = k->qualifier;
        out->mut.ts_start_us = k->del_start_us;
        out->mut.ts_end_us = k->del_end_us;
    }
}

st_code sto_tomb_iter_next(sto_tomb_iter *it, size_t *entries_left, sto_tombstone *out, bool *found,
                           st_err *err) {
    sto_kviter *m = it->m;
    *found = false;
    if (!it->started) {
        m->ops->seek_first(m);
        it->started = true;
    } else if (!it->unseen && m->ops->valid(m)) {
        m->ops->next(m); /* past the tombstone returned last */
    }
    it->unseen = true;
    for (; m->ops->valid(m); m->ops->next(m)) {
        if (*entries_left == 0)
            return ST_OK; /* *found false: the caller comes back to this entry */
        --*entries_left;
        st_slice key = m->ops->key(m);
        sto_key k;
        if (!sto_key_decode(key, &k, &it->scratch)) {
            sto_tablet_mark_read_only(it->t, ST_DATA_LOSS, "corrupt key met by a tombstone scan");
            return st_err_set(err, ST_DATA_LOSS,
                              "malformed internal key (%zu bytes) in a memtable or SSTable; the "
                              "tablet's data is corrupt: restore it from a replica or backup",
                              key.len);
        }
        if (k.kind != STO_KEY_CELL && !st_slice_eq(key, st_buf_slice(&it->last))) {
            st_buf_reset(&it->last);
            if (st_buf_append(&it->last, key.data, key.len) != ST_OK)
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory in a tombstone scan");
            if (!sto_key_decode(st_buf_slice(&it->last), &k, &it->scratch))
                return st_err_set(err, ST_INTERNAL, "a tombstone's key changed while copied");
            tomb_fill(&k, out);
            it->unseen = false;
            *found = true;
            return ST_OK;
        }
    }
    st_code rc = m->ops->status(m, err);
    return rc == ST_OK ? ST_NOT_FOUND : rc;
}

void sto_tomb_iter_free(sto_tomb_iter *it) {
    if (!it)
        return;
    it->m->ops->free(it->m);
    st_buf_free(&it->scratch);
    st_buf_free(&it->last);
    free(it);
}
