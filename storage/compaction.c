/* compaction.c — merges a tablet's SSTables in the background so their number stays bounded.
 *
 * Size-tiered over sorted runs: a tablet's list (newest first) is grouped into runs of
 * consecutive tables with pairwise disjoint key ranges, as reads group them (one concatenating
 * iterator per run), so a sequentially written tablet is one run however many tables it has.
 * Runs of similar size (each within 2x of the smallest of its tier, and all runs under
 * STO_SMALL_SST_BYTES together) form a tier; a tier with compaction_trigger or more runs is
 * merged into one. Runs of STO_SETTLED_SST_BYTES or more (settled) stay out of the small tiers
 * and of stalls, and tier among themselves by the same rule, so repeated overwrites of a big
 * key range are merged too; a single run is never rewritten into itself. When the small runs still
 * reach write_stall_tables - 2, all runs are merged; every tablet with tables also gets a full
 * compaction (everything rewritten, which also drops max-versions garbage and old tombstones)
 * once per STO_FULL_COMPACTION_PERIOD_US. Since entries are ordered by version, not by table,
 * any subset of tables can be merged.
 *
 * Reads pay for compactions too (STO_READ_SEEK_BYTES): heavy overwrites leave every row in
 * several runs that the tiers above may never merge (too few, or too unlike in size), and a
 * point read seeks each of them and the memtable. Once a tablet's reads have wasted about what
 * compacting it costs, it is compacted whole; a write-idle tablet has its memtable frozen and
 * flushed first, so its reads end on one table. A tablet due by its run count whose runs form no
 * tier is not due again until its list changes, so the other reasons still reach it.
 *
 * Trivial moves: an input table that overlaps no other input is not rewritten; outputs are cut
 * around it, and outputs and moved tables go last in the list, sorted, as one run. Old
 * tombstones are dropped only when every table of the tablet is rewritten (a moved table could
 * hold what they cover).
 *
 * A tablet that shares a split parent's tables reads them through sto_range_iter_new, so its
 * compactions rewrite only its own rows; the shared file goes when no tablet lists it any more.
 * Output is cut into files near sto_options.compaction_output_bytes at row boundaries. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

sto_kviter *sto_tablet_sst_merge(sto_tablet *t, sto_tsst *files, size_t n) {
    sto_kviter **kids = calloc(n ? n : 1, sizeof *kids);
    if (!kids)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        /* scan iterators: a compaction must not evict the blocks point reads use */
        sto_kviter *it = sto_sst_iter_new_scan(files[i].f->sst);
        if (it && files[i].wrap)
            it = sto_range_iter_new(it, st_buf_slice(&t->lo), st_buf_slice(&t->hi));
        if (it && files[i].nosys) /* restored: its outputs carry no foreign history */
            it = sto_nosys_iter_new(it);
        if (!it)
            break;
        kids[k++] = it;
    }
    sto_kviter *m = NULL;
    if (k == n)
        m = sto_merge_iter_new(kids, n);
    else
        for (size_t i = 0; i < k; i++)
            kids[i]->ops->free(kids[i]);
    free(kids);
    return m;
}

/* ---- sorted runs ---- */

/* A stretch of consecutive tables of a tablet's list (newest first) with pairwise disjoint key
 * ranges: the read path merges one concatenation per run (tablet_snapshot.c), so runs, not tables,
 * are what reads pay for and what triggers and stalls count. */
typedef struct run_desc {
    size_t start, n;
    uint64_t bytes;
} run_desc;

/* Where x would go in sorted[0, m) (pairwise disjoint, ascending): true when x overlaps none,
 * with *at its insertion point. Disjoint ranges sorted by smallest are sorted by largest too, so
 * only the two neighbours can overlap x. */
static bool fits_run(sto_sst *const *sorted, size_t m, const sto_sst *x, size_t *at) {
    st_slice lo = sto_sst_smallest(x), hi = sto_sst_largest(x);
    size_t a = 0, b = m; /* first table whose smallest key is above lo */
    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (st_slice_cmp(sto_sst_smallest(sorted[mid]), lo) <= 0)
            a = mid + 1;
        else
            b = mid;
    }
    *at = a;
    if (a > 0 && st_slice_cmp(sto_sst_largest(sorted[a - 1]), lo) >= 0)
        return false;
    return a == m || st_slice_cmp(hi, sto_sst_smallest(sorted[a])) < 0;
}

/* Splits l[0, n) into runs greedily, as the read path groups tables (a table starts a new run
 * when it overlaps one of the current run); runs[] and scratch hold n entries each. A table
 * that could not be opened (sst NULL) is a run of its own. Returns the number of runs. */
static size_t split_runs(const sto_tsst *l, size_t n, run_desc *runs, sto_sst **scratch) {
    size_t nr = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        sto_sst *x = l[i].f->sst;
        size_t at = 0;
        bool join = nr > 0 && x && m > 0 && fits_run(scratch, m, x, &at);
        if (!join) {
            runs[nr++] = (run_desc){i, 0, 0};
            m = 0;
            at = 0;
        }
        run_desc *r = &runs[nr - 1];
        r->n++;
        r->bytes += l[i].f->bytes;
        if (!x) {
            m = 0; /* nothing may join an unreadable table */
            continue;
        }
        memmove(&scratch[at + 1], &scratch[at], (m - at) * sizeof *scratch);
        scratch[at] = x;
        m++;
    }
    return nr;
}

static int cmp_run_bytes(const void *a, const void *b) {
    uint64_t x = ((const run_desc *)a)->bytes, y = ((const run_desc *)b)->bytes;
    return x < y ? -1 : x > y;
}

/* runs[i, to) sorted by size: one past the last run of the tier that starts at i, the runs
 * within 2x of runs[i] (and with small_too, any under STO_SMALL_SST_BYTES). */
static size_t tier_end(const run_desc *runs, size_t i, size_t to, bool small_too) {
    size_t j = i + 1;
    while (j < to && (runs[j].bytes <= 2 * runs[i].bytes ||
                      (small_too && runs[j].bytes < STO_SMALL_SST_BYTES)))
        j++;
    return j;
}

void sto_compaction_count_runs(const sto_tsst *l, size_t n, uint64_t settled_bytes, int *small,
                               int *settled, int *n_runs) {
    run_desc *runs = malloc((n ? n : 1) * (sizeof *runs + sizeof(sto_sst *)));
    *small = *settled = 0;
    *n_runs = (int)n;
    if (!runs) { /* counting tables overestimates: stalls and compactions come early, not late */
        for (size_t i = 0; i < n; i++)
            *small += l[i].f->bytes < settled_bytes;
        return;
    }
    size_t nr = split_runs(l, n, runs, (sto_sst **)(void *)(runs + (n ? n : 1)));
    *n_runs = (int)nr;
    qsort(runs, nr, sizeof *runs, cmp_run_bytes);
    size_t i = 0;
    while (i < nr && runs[i].bytes < settled_bytes)
        i++;
    *small = (int)i;
    while (i < nr) { /* the largest tier of settled runs (choose_tier's grouping) */
        size_t j = tier_end(runs, i, nr, false);
        if ((int)(j - i) > *settled)
            *settled = (int)(j - i);
        i = j;
    }
    free(runs);
}

/* ---- choosing inputs ---- */

static int cmp_smallest(const void *a, const void *b) {
    const sto_tsst *x = a, *y = b;
    return st_slice_cmp(sto_sst_smallest(x->f->sst), sto_sst_smallest(y->f->sst));
}

/* Small (unsettled) runs at which a full compaction is forced: just below the stall point, so
 * writers rarely wait; never below 2. */
static int force_full_at(const sto_db *db) {
    int n = db->o.write_stall_tables - 2;
    return n < 2 ? 2 : n;
}

/* Whether a tablet with this many small runs, and this many settled runs in its largest tier,
 * has compaction work. */
static bool due(const sto_db *db, int n_small, int n_settled) {
    return n_small >= db->o.compaction_trigger || n_small >= force_full_at(db) ||
           n_settled >= db->o.compaction_trigger;
}

/* Groups runs[from, to) (sorted by size) into tiers (tier_end). Moves the first tier of
 * compaction_trigger or more runs to the front of runs and returns its size; 0 when none. */
static size_t first_tier(const sto_db *db, run_desc *runs, size_t from, size_t to, bool small_too) {
    for (size_t i = from; i < to;) {
        size_t j = tier_end(runs, i, to, small_too);
        size_t count = j - i;
        if ((int)count >= db->o.compaction_trigger) {
            if (count > STO_COMPACT_INPUTS_MAX)
                count = STO_COMPACT_INPUTS_MAX;
            memmove(runs, &runs[i], count * sizeof *runs);
            return count;
        }
        i = j;
    }
    return 0;
}

/* Sorts runs[0, nr) by size and returns how many of the first ones form the tier to merge (0 =
 * none due): a tier of small runs first, else one of settled runs (the two never mix, so a
 * small run is not merged into a big one before its own tier is due). */
static size_t choose_tier(const sto_db *db, run_desc *runs, size_t nr) {
    qsort(runs, nr, sizeof *runs, cmp_run_bytes);
    size_t small = 0;
    while (small < nr && runs[small].bytes < STO_SETTLED_SST_BYTES(db))
        small++;
    size_t n = first_tier(db, runs, 0, small, true);
    return n ? n : first_tier(db, runs, small, nr, false);
}

/* Trivial moves: orders in[0, n) so that the tables overlapping another input come first and the
 * ones that overlap none come last, sorted by smallest key: those are kept as they are, not
 * rewritten (LevelDB's trivial move). Sorted by smallest key, a table overlaps an earlier one iff
 * its smallest key is at most the largest key seen so far, and a later one iff the next smallest
 * key is at most its largest. Returns how many are rewritten; n (no moves) if memory runs out. */
static size_t split_moves(sto_tsst *in, size_t n) {
    sto_tsst *tmp = malloc((n ? n : 1) * (sizeof *tmp + sizeof(bool)));
    if (!tmp)
        return n;
    bool *moved = (bool *)(void *)(tmp + (n ? n : 1));
    qsort(in, n, sizeof *in, cmp_smallest);
    st_slice reach = {NULL, 0};
    for (size_t i = 0; i < n; i++) {
        st_slice lo = sto_sst_smallest(in[i].f->sst), hi = sto_sst_largest(in[i].f->sst);
        bool before = i > 0 && st_slice_cmp(lo, reach) <= 0;
        bool after = i + 1 < n && st_slice_cmp(sto_sst_smallest(in[i + 1].f->sst), hi) <= 0;
        moved[i] = !before && !after;
        if (i == 0 || st_slice_cmp(hi, reach) > 0)
            reach = hi;
    }
    size_t k = 0, rw = 0;
    for (size_t i = 0; i < n; i++)
        if (!moved[i])
            tmp[k++] = in[i];
    rw = k;
    for (size_t i = 0; i < n; i++)
        if (moved[i])
            tmp[k++] = in[i];
    memcpy(in, tmp, n * sizeof *in);
    free(tmp);
    return rw;
}

/* The inputs of one compaction. */
typedef struct pick_set {
    sto_tsst *in; /* rewritten [0, n_rw), then moved [n_rw, n_in) sorted by smallest key */
    size_t n_rw, n_in;
    bool full;     /* every table of the tablet is rewritten: old tombstones may go */
    bool none_due; /* choose found nothing to merge (not for want of memory) */
} pick_set;

/* Chooses from all[0, total) (the tablet's list, newest first): with force_all everything,
 * rewritten; else all runs when the small ones reach force_full_at, or else a tier of small runs,
 * with trivial moves. False when nothing is due (or memory runs out: retried later). */
static bool choose(const sto_db *db, const sto_tsst *all, size_t total, bool force_all,
                   pick_set *ps) {
    size_t cap = total ? total : 1;
    ps->in = malloc(cap * sizeof *ps->in);
    run_desc *runs = malloc(cap * (sizeof *runs + sizeof(sto_sst *)));
    size_t k = 0, pick = 0;
    if (ps->in && runs && force_all) {
        memcpy(ps->in, all, total * sizeof *all);
        k = pick = total;
    } else if (ps->in && runs) {
        size_t nr = split_runs(all, total, runs, (sto_sst **)(void *)(runs + cap));
        int small = 0;
        for (size_t i = 0; i < nr; i++)
            small += runs[i].bytes < STO_SETTLED_SST_BYTES(db);
        pick = small >= force_full_at(db) ? nr : choose_tier(db, runs, nr);
        if (pick < 2)
            pick = 0;
        for (size_t r = 0; r < pick; r++)
            for (size_t i = 0; i < runs[r].n; i++)
                ps->in[k++] = all[runs[r].start + i];
    }
    ps->none_due = ps->in && runs && pick == 0;
    free(runs);
    if (pick == 0) {
        free(ps->in);
        ps->in = NULL;
        return false;
    }
    ps->n_in = k;
    ps->n_rw = force_all ? k : split_moves(ps->in, k);
    ps->full = ps->n_rw == total;
    return true;
}

/* ---- writing outputs ---- */

typedef struct outputs {
    sto_file **f;
    size_t n, cap;
} outputs;

static void outputs_discard(outputs *o) {
    for (size_t i = 0; i < o->n; i++) {
        sto_sst_mark_obsolete(o->f[i]->sst);
        sto_sst_unref(o->f[i]->sst);
        free(o->f[i]);
    }
    free(o->f);
}

static st_code finish_output(sto_db *db, sto_sst_writer *w, uint64_t number, outputs *o,
                             st_err *err) {
    uint64_t bytes;
    st_code rc = sto_sst_writer_finish(w, &bytes, err);
    if (rc == ST_OK && o->n == o->cap) {
        size_t ncap = o->cap ? o->cap * 2 : 4;
        sto_file **p = realloc(o->f, ncap * sizeof *p);
        if (!p)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory in compaction");
        else {
            o->f = p;
            o->cap = ncap;
        }
    }
    if (rc == ST_OK)
        rc = sto_file_new(db, number, &o->f[o->n], err);
    if (rc == ST_OK) {
        o->n++;
        return ST_OK;
    }
    char path[STO_PATH_MAX + 64];
    sto_db_sst_path(db, number, path, sizeof path);
    db->env->ops->remove(db->env, path, NULL);
    return rc;
}

typedef struct out_state {
    sto_sst_writer *w;
    uint64_t number;
    st_buf last_row; /* enc(row) of the last key written */
    st_env *env;     /* buffered writes (flush.c) */
    /* Moved tables (sorted by smallest key) that no output may straddle, so outputs and moved
     * tables form one run; fence: the first one not yet passed. No rewritten key falls inside
     * one (a moved table overlaps no rewritten table). */
    const sto_tsst *moved;
    size_t n_moved, fence;
} out_state;

/* Whether key passed a moved table since the last key: the current output must end there. */
static bool passes_fence(out_state *s, st_slice key) {
    bool passed = false;
    while (s->fence < s->n_moved &&
           st_slice_cmp(key, sto_sst_smallest(s->moved[s->fence].f->sst)) > 0) {
        s->fence++;
        passed = true;
    }
    return passed;
}

static st_code add_entry(sto_db *db, out_state *s, outputs *o, st_slice key, st_slice value,
                         st_err *err) {
    size_t plen = sto_key_row_prefix_len(key);
    st_slice prefix = st_slice_make(key.data, plen);
    bool new_row = !st_slice_eq(prefix, st_buf_slice(&s->last_row));
    bool fence = passes_fence(s, key);
    if (s->w &&
        (fence || (new_row && sto_sst_writer_bytes(s->w) >= db->o.compaction_output_bytes))) {
        st_code rc = finish_output(db, s->w, s->number, o, err);
        s->w = NULL;
        if (rc != ST_OK)
            return rc;
    }
    if (!s->w) {
        s->number = sto_db_new_file_number(db);
        char path[STO_PATH_MAX + 64];
        sto_db_sst_path(db, s->number, path, sizeof path);
        sto_sst_options so = {db->o.block_bytes, db->o.bloom_bits_per_key, db->o.zstd_level};
        st_code rc = sto_sst_writer_new(s->env, path, &so, &s->w, err);
        if (rc != ST_OK)
            return rc;
    }
    if (new_row) {
        st_buf_reset(&s->last_row);
        if (st_buf_append(&s->last_row, prefix.data, prefix.len) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory in compaction");
    }
    return sto_sst_writer_add(s->w, key, value, err);
}

/* Entries between looks at the tablet's yield_hint: a split or drop waiting for the compaction
 * (on a server's event loop) waits at most this many entries, not the whole compaction. */
#define YIELD_CHECK_ENTRIES 1024

static st_code write_outputs(sto_db *db, sto_tablet *t, sto_kviter *it, const sto_tsst *moved,
                             size_t n_moved, outputs *o, st_err *err) {
    sto_wbuf_env wenv; /* every writer below is finished or abandoned before return */
    sto_wbuf_env_init(&wenv, db->env);
    out_state s = {NULL, 0, {NULL, 0, 0}, &wenv.base, moved, n_moved, 0};
    st_code rc = ST_OK;
    size_t k = 0;
    for (it->ops->seek_first(it); rc == ST_OK && it->ops->valid(it); it->ops->next(it)) {
        if (++k % YIELD_CHECK_ENTRIES == 0 && atomic_load(&t->yield_hint))
            rc = st_err_set(err, ST_ABORTED,
                            "compaction of tablet %" PRIu64 " gave way to a split or drop", t->id);
        else
            rc = add_entry(db, &s, o, it->ops->key(it), it->ops->value(it), err);
    }
    if (rc == ST_OK)
        rc = it->ops->status(it, err);
    if (s.w) {
        if (rc == ST_OK)
            rc = finish_output(db, s.w, s.number, o, err);
        else
            sto_sst_writer_abandon(s.w);
    }
    st_buf_free(&s.last_row);
    return rc;
}

/* ---- installing ---- */

static bool is_input(const sto_file *f, const sto_tsst *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (in[i].f == f)
            return true;
    return false;
}

/* meta_mu held: replaces the rewritten inputs by the outputs in one step. Outputs and moved
 * tables go last, sorted by smallest key: pairwise disjoint, they form one run there. The other
 * tables keep their order (entries are ordered by version, so order only groups runs). */
static st_code install(sto_db *db, sto_tablet *t, const pick_set *ps, outputs *o, st_err *err) {
    pthread_mutex_lock(&t->mu);
    size_t cap = t->n_ssts + o->n;
    sto_tsst *list = malloc((cap ? cap : 1) * 2 * sizeof *list);
    if (!list) {
        pthread_mutex_unlock(&t->mu);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory installing a compaction");
    }
    sto_tsst *tail = list + (cap ? cap : 1);
    size_t k = 0, m = 0;
    for (size_t i = 0; i < t->n_ssts; i++) {
        const sto_file *f = t->ssts[i].f;
        if (is_input(f, ps->in + ps->n_rw, ps->n_in - ps->n_rw))
            tail[m++] = t->ssts[i];
        else if (!is_input(f, ps->in, ps->n_rw))
            list[k++] = t->ssts[i];
    }
    for (size_t i = 0; i < o->n; i++) {
        o->f[i]->tablet_refs = 1;
        tail[m++] = sto_tsst_of(t, o->f[i]);
    }
    qsort(tail, m, sizeof *tail, cmp_smallest);
    memcpy(list + k, tail, m * sizeof *tail);
    free(t->ssts);
    t->ssts = list;
    t->n_ssts = k + m;
    t->cap_ssts = (cap ? cap : 1) * 2;
    sto_tablet_update_hints_locked(t);
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < ps->n_rw; i++)
        sto_file_drop_ref(db, ps->in[i].f);
    free(o->f);
    o->f = NULL;
    o->n = 0;
    return ST_OK;
}

static uint64_t tombstone_bound(sto_db *db, int64_t now) {
    int64_t b = now - db->o.tombstone_grace_us;
    return b > 0 ? STO_VERSION(b, 0) : 0;
}

/* Merges the rewritten inputs into new files, cut where moved tables lie between them. When t
 * has a GC report function, the cells dropped as GC garbage go to report. */
static st_code rewrite(sto_db *db, sto_tablet *t, const pick_set *ps, outputs *o,
                       sto_gc_report_buf *report, st_err *err) {
    pthread_mutex_lock(&t->mu);
    sto_gc_set *gc = t->gc;
    sto_gc_set_ref(gc);
    bool collect = t->report_fn != NULL;
    pthread_mutex_unlock(&t->mu);
    int64_t now = sto_db_now_us(db);
    sto_kviter *merged = sto_tablet_sst_merge(t, ps->in, ps->n_rw);
    sto_kviter *it =
        merged ? sto_compact_iter_new_report(merged, gc, now, ps->full, tombstone_bound(db, now),
                                             collect ? report : NULL)
               : NULL;
    sto_gc_set_unref(gc);
    if (!it)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a compaction");
    st_code rc = write_outputs(db, t, it, ps->in + ps->n_rw, ps->n_in - ps->n_rw, o, err);
    it->ops->free(it);
    return rc;
}

/* Hands the report of a compaction of t, now installed, to t's report function (the one set
 * now, if any) in batches of STO_GC_REPORT_BATCH cells or STO_GC_REPORT_BATCH_BYTES. */
static void deliver_report(sto_tablet *t, const sto_gc_report_buf *rep) {
    if (rep->cut)
        st_log(ST_LOG_WARN, "storage",
               "event=gc_report_cut tablet=%" PRIu64 " reported=%" PRIu64 " cut=%" PRIu64
               " msg=\"a compaction dropped more GC garbage than its report holds "
               "(STO_GC_REPORT_MAX_BYTES); change streams miss GC records for the cut cells\"",
               t->id, rep->cells, rep->cut);
    if (rep->cells == 0)
        return;
    sto_gc_dropped *batch = malloc(STO_GC_REPORT_BATCH * sizeof *batch);
    if (!batch) {
        st_log(ST_LOG_WARN, "storage",
               "event=gc_report_cut tablet=%" PRIu64 " reported=0 cut=%" PRIu64
               " msg=\"out of memory delivering a GC report\"",
               t->id, rep->cells);
        return;
    }
    pthread_mutex_lock(&t->report_mu);
    pthread_mutex_lock(&t->mu);
    sto_gc_report_fn fn = t->report_fn;
    void *arg = t->report_arg;
    pthread_mutex_unlock(&t->mu);
    size_t pos = 0, n = 0, bytes = 0;
    while (fn && sto_gc_report_next(rep, &pos, &batch[n])) {
        bytes += batch[n].row.len + batch[n].family.len + batch[n].qualifier.len;
        if (++n == STO_GC_REPORT_BATCH || bytes >= STO_GC_REPORT_BATCH_BYTES) {
            fn(t->id, batch, n, arg);
            n = bytes = 0;
        }
    }
    if (fn && n)
        fn(t->id, batch, n, arg);
    pthread_mutex_unlock(&t->report_mu);
    free(batch);
}

/* Runs the chosen compaction of t (the caller holds t's compaction claim). */
static st_code run(sto_db *db, sto_tablet *t, const pick_set *ps, st_err *err) {
    outputs o = {NULL, 0, 0};
    sto_gc_report_buf rep = {.max_bytes = STO_GC_REPORT_MAX_BYTES};
    st_buf_init(&rep.data);
    st_code rc = ps->n_rw ? rewrite(db, t, ps, &o, &rep, err) : ST_OK;
    size_t n_out = o.n;
    if (rc == ST_OK) {
        atomic_fetch_add(&db->compactions, 1); /* counted before the result becomes visible */
        pthread_mutex_lock(&db->meta_mu);
        rc = install(db, t, ps, &o, err);
        if (rc == ST_OK) {
            st_err e;
            sto_manifest_write(db, NULL, NULL, &e);
        }
        pthread_mutex_unlock(&db->meta_mu);
    }
    outputs_discard(&o);
    if (rc == ST_OK)
        deliver_report(t, &rep);
    st_buf_free(&rep.data);
    if (rc == ST_OK)
        st_log(ST_LOG_DEBUG, "storage",
               "event=compaction tablet=%" PRIu64 " rewritten=%zu moved=%zu outputs=%zu full=%d",
               t->id, ps->n_rw, ps->n_in - ps->n_rw, n_out, (int)ps->full);
    if (rc == ST_DATA_LOSS)
        sto_tablet_mark_read_only(t, rc, err ? err->msg : "corrupt SSTable met by compaction");
    return rc;
}

/* Copies t's table list and chooses inputs into *ps; false when nothing is due. When a size-tier
 * pick finds no tier in a list that has not changed since, the tablet is marked no_tier_hint:
 * its run count says due, but only a new list can make a tier. */
static bool select_inputs(sto_db *db, sto_tablet *t, bool force_all, pick_set *ps) {
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_ssts;
    uint64_t gen = t->list_gen;
    sto_tsst *all = malloc((n ? n : 1) * sizeof *all);
    bool ok = all && !t->broken;
    if (ok && n)
        memcpy(all, t->ssts, n * sizeof *all);
    pthread_mutex_unlock(&t->mu);
    bool chosen = ok && choose(db, all, n, force_all, ps);
    free(all);
    if (!chosen && ps->none_due) {
        pthread_mutex_lock(&t->mu);
        if (t->list_gen == gen)
            atomic_store(&t->no_tier_hint, true);
        pthread_mutex_unlock(&t->mu);
    }
    return chosen;
}

static void release_claim(sto_db *db, sto_tablet *t, st_code rc, bool full, const st_err *e) {
    pthread_mutex_lock(&db->mu);
    t->compacting = false;
    if (full && rc == ST_OK)
        t->last_full_us = sto_db_now_us(db);
    if (rc != ST_OK && rc != ST_DATA_LOSS && rc != ST_ABORTED) { /* ABORTED: gave way */
        t->bg_code = rc;
        snprintf(t->bg_msg, sizeof t->bg_msg, "%s", e->msg);
        t->backoff_us = t->backoff_us ? t->backoff_us * 2 : STO_RETRY_MIN_US;
        if (t->backoff_us > STO_RETRY_MAX_US)
            t->backoff_us = STO_RETRY_MAX_US;
        t->retry_at_us = st_mono_us() + t->backoff_us;
    } else if (rc == ST_OK && t->bg_code != ST_OK && !t->flushing) {
        t->bg_code = ST_OK;
        t->backoff_us = 0;
        t->retry_at_us = 0;
    }
    pthread_cond_broadcast(&db->stall_cv);
    pthread_mutex_unlock(&db->mu);
}

/* ---- read-triggered compaction ---- */

/* Read units at which t's reads have wasted about what compacting it whole costs. */
static uint64_t read_debt_bound(sto_tablet *t) {
    uint64_t need = atomic_load(&t->bytes_hint) / STO_READ_SEEK_BYTES;
    return need < STO_READ_DEBT_MIN ? STO_READ_DEBT_MIN : need;
}

/* Wakes the workers when a debt crosses half its bound (read_due starts watching writes there),
 * rather than leaving it to their periodic wake-up. */
void sto_tablet_charge_reads(sto_tablet *t, uint64_t run_units, uint64_t mem_units) {
    uint64_t half = read_debt_bound(t) / 2;
    bool kick = false;
    if (run_units) {
        uint64_t was = atomic_fetch_add_explicit(&t->read_debt, run_units, memory_order_relaxed);
        kick = was < half && was + run_units >= half;
    }
    if (mem_units) {
        uint64_t was = atomic_fetch_add_explicit(&t->mem_debt, mem_units, memory_order_relaxed);
        kick = kick || (was < STO_READ_DEBT_MIN / 2 && was + mem_units >= STO_READ_DEBT_MIN / 2);
    }
    if (kick)
        sto_db_kick(t->db);
}

/* db->mu held: whether t, read-hot, should be compacted whole now. Two debts, two remedies:
 *   - reads that merged several sorted runs (read_debt) pay for a full compaction, whether or not
 *     writes go on (the memtable stays what it is either way); it needs two runs or more;
 *   - reads that merged a memtable with other sources (mem_debt, bound STO_READ_DEBT_MIN: a flush
 *     costs little) pay for freezing it, but only once t is write-idle: the flushed table is one
 *     more run, yet a point read skips it by its bloom filter unless the row is there, instead of
 *     searching the skiplist. A compaction of an idle tablet freezes the memtable first too, so
 *     the reads end on one source.
 * Acts only after watching t's writes for STO_WRITE_IDLE_US, from half a debt on (so the watch
 * overlaps the reads that make up the rest). A frozen memtable (*froze) is flushed by the next
 * worker turn; the compaction, if due, comes on the call after. */
static bool read_due(sto_tablet *t, int64_t mono, bool *froze) {
    uint64_t need = read_debt_bound(t);
    uint64_t runs_debt = atomic_load_explicit(&t->read_debt, memory_order_relaxed);
    uint64_t mem_debt = atomic_load_explicit(&t->mem_debt, memory_order_relaxed);
    if (runs_debt < need / 2 && mem_debt < STO_READ_DEBT_MIN / 2) {
        t->idle_check_us = 0;
        return false;
    }
    pthread_mutex_lock(&t->mu);
    uint64_t lsn = t->last_applied_lsn;
    bool window = t->idle_check_us != 0 && mono - t->idle_check_us >= STO_WRITE_IDLE_US;
    bool idle = window && lsn == t->idle_lsn;
    if (t->idle_check_us == 0 || (window && !idle)) { /* (re)start watching */
        t->idle_check_us = mono;
        t->idle_lsn = lsn;
    }
    bool act = window && t->n_imm == 0; /* a pending flush comes first */
    bool compact = act && runs_debt >= need;
    bool freeze = act && idle && (compact || mem_debt >= STO_READ_DEBT_MIN) &&
                  !sto_memtable_empty(t->active) && sto_tablet_freeze_locked(t);
    pthread_mutex_unlock(&t->mu);
    if (freeze)
        atomic_store(&t->mem_debt, 0);
    *froze = *froze || freeze;
    return compact && !freeze && atomic_load(&t->n_runs_hint) >= 2;
}

/* db->mu held: the tablet most in need: most small runs first (size-tiered), then one whose reads
 * paid for a full compaction, then one whose periodic full compaction is due. *full: compact
 * everything (read-triggered or periodic); *froze: a read-hot idle memtable was frozen. */
static sto_tablet *pick(sto_db *db, bool *full, bool *froze) {
    sto_tablet *best = NULL, *by_reads = NULL, *periodic = NULL;
    int best_n = -1;
    int64_t mono = st_mono_us(), now = sto_db_now_us(db);
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        if (t->compacting || t->busy || t->dead || atomic_load(&t->ro_hint) ||
            t->retry_at_us > mono || t->split_hold_us > mono)
            continue;
        int n = atomic_load(&t->n_small_hint);
        if (!atomic_load(&t->no_tier_hint) && due(db, n, atomic_load(&t->n_settled_hint))) {
            if (n > best_n) {
                best = t;
                best_n = n;
            }
        } else if (read_due(t, mono, froze)) {
            by_reads = by_reads ? by_reads : t;
        } else if (!periodic && atomic_load(&t->n_ssts_hint) > 0 &&
                   now - t->last_full_us >= STO_FULL_COMPACTION_PERIOD_US) {
            periodic = t;
        }
    }
    *full = !best;
    if (!best)
        best = by_reads ? by_reads : periodic;
    if (best == periodic && periodic) /* counted from now even if it fails: no retry storm */
        periodic->last_full_us = now;
    return best;
}

bool sto_compaction_pick_and_run(sto_db *db) {
    bool full, froze = false;
    sto_tablet *best = pick(db, &full, &froze);
    if (!best)
        return froze;
    best->compacting = true;
    best->idle_check_us = 0;
    uint64_t debt = atomic_load(&best->read_debt);
    if (full) { /* what the reads paid for is bought now */
        atomic_store(&best->read_debt, 0);
        atomic_store(&best->mem_debt, 0);
    }
    pthread_mutex_unlock(&db->mu);
    if (full)
        st_log(ST_LOG_DEBUG, "storage",
               "event=compaction_start tablet=%" PRIu64 " full=1 read_debt=%" PRIu64
               " read_debt_bound=%" PRIu64,
               best->id, debt, read_debt_bound(best));
    pick_set ps = {NULL, 0, 0, false, false};
    bool chosen = select_inputs(db, best, full, &ps);
    st_err e;
    st_err_clear(&e);
    st_code rc = chosen ? run(db, best, &ps, &e) : ST_OK;
    free(ps.in);
    release_claim(db, best, rc, ps.full, &e);
    pthread_mutex_lock(&db->mu);
    return chosen;
}

st_code sto_compaction_full(sto_db *db, sto_tablet *t, st_err *err) {
    pthread_mutex_lock(&db->mu);
    /* busy: a split or drop owns the tablet; it ends dead, or free again */
    while ((t->compacting || t->busy) && !t->dead)
        pthread_cond_wait(&db->stall_cv, &db->mu);
    if (t->dead) {
        pthread_mutex_unlock(&db->mu);
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is gone", t->id);
    }
    t->compacting = true;
    atomic_store(&t->read_debt, 0);
    atomic_store(&t->mem_debt, 0);
    pthread_mutex_unlock(&db->mu);
    pick_set ps = {NULL, 0, 0, false, false};
    bool chosen = select_inputs(db, t, true, &ps);
    st_err e;
    st_err_clear(&e);
    st_code rc = chosen ? run(db, t, &ps, &e) : ST_OK;
    free(ps.in);
    release_claim(db, t, rc, ps.full, &e);
    if (rc != ST_OK && err)
        *err = e;
    return rc;
}
