/* compaction.c — merges a tablet's SSTables in the background so their number stays bounded.
 *
 * Size-tiered: tables of similar size (each within 2x of the smallest of its tier, and all tables
 * under STO_SMALL_SST_BYTES together) form a tier; a tier with compaction_trigger or more tables
 * is merged into one. Tables of STO_SETTLED_SST_BYTES or more (compaction outputs) stay out of
 * tiers, triggers and stalls, so they are not rewritten into themselves. When the small tables
 * still reach write_stall_tables - 2, everything is merged (a full compaction, which also drops
 * max-versions garbage and old tombstones); every tablet with tables also gets a full compaction
 * once per STO_FULL_COMPACTION_PERIOD_US. Since entries are ordered by version, not by table,
 * any subset of tables can be merged.
 *
 * A tablet that shares a split parent's tables reads them through sto_range_iter_new, so its
 * compactions rewrite only its own rows; the shared file goes when no tablet lists it any more.
 * Output is cut into files near STO_COMPACT_OUTPUT_BYTES at row boundaries. */
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

/* ---- choosing inputs ---- */

static int cmp_bytes(const void *a, const void *b) {
    uint64_t x = ((const sto_tsst *)a)->f->bytes, y = ((const sto_tsst *)b)->f->bytes;
    return x < y ? -1 : x > y;
}

/* Small (unsettled) tables at which a full compaction is forced: just below the stall point, so
 * writers rarely wait; never below 2. */
static int force_full_at(const sto_db *db) {
    int n = db->o.write_stall_tables - 2;
    return n < 2 ? 2 : n;
}

/* Whether a tablet with this many small tables has compaction work. */
static bool due(const sto_db *db, int n_small) {
    return n_small >= db->o.compaction_trigger || n_small >= force_full_at(db);
}

/* Sorts all by size and keeps in all[0..*n) the chosen inputs; false when nothing is due. */
static bool choose(const sto_db *db, sto_tsst *all, size_t *n, bool force_all) {
    size_t total = *n, small = 0;
    for (size_t i = 0; i < total; i++)
        small += all[i].f->bytes < STO_SETTLED_SST_BYTES;
    if (force_all || (int)small >= force_full_at(db))
        return total >= 2 || (force_all && total >= 1);
    qsort(all, total, sizeof *all, cmp_bytes);
    total = small; /* the settled tables sort last and stay out of tiers */
    for (size_t i = 0; i < total;) {
        size_t j = i;
        uint64_t base = all[i].f->bytes;
        while (j + 1 < total &&
               (all[j + 1].f->bytes <= 2 * base || all[j + 1].f->bytes < STO_SMALL_SST_BYTES))
            j++;
        size_t count = j - i + 1;
        if ((int)count >= db->o.compaction_trigger) {
            if (count > STO_COMPACT_INPUTS_MAX)
                count = STO_COMPACT_INPUTS_MAX;
            memmove(all, &all[i], count * sizeof *all);
            *n = count;
            return true;
        }
        i = j + 1;
    }
    return false;
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
} out_state;

static st_code add_entry(sto_db *db, out_state *s, outputs *o, st_slice key, st_slice value,
                         st_err *err) {
    size_t plen = sto_key_row_prefix_len(key);
    st_slice prefix = st_slice_make(key.data, plen);
    bool new_row = !st_slice_eq(prefix, st_buf_slice(&s->last_row));
    if (s->w && new_row && sto_sst_writer_bytes(s->w) >= STO_COMPACT_OUTPUT_BYTES) {
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
        st_code rc = sto_sst_writer_new(db->env, path, &so, &s->w, err);
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

static st_code write_outputs(sto_db *db, sto_kviter *it, outputs *o, st_err *err) {
    out_state s = {NULL, 0, {NULL, 0, 0}};
    st_code rc = ST_OK;
    for (it->ops->seek_first(it); rc == ST_OK && it->ops->valid(it); it->ops->next(it))
        rc = add_entry(db, &s, o, it->ops->key(it), it->ops->value(it), err);
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

/* meta_mu held: replaces the inputs by the outputs in one step. */
static st_code install(sto_db *db, sto_tablet *t, const sto_tsst *in, size_t n_in, outputs *o,
                       st_err *err) {
    pthread_mutex_lock(&t->mu);
    size_t cap = t->n_ssts + o->n;
    sto_tsst *list = malloc((cap ? cap : 1) * sizeof *list);
    if (!list) {
        pthread_mutex_unlock(&t->mu);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory installing a compaction");
    }
    size_t k = 0;
    for (size_t i = 0; i < t->n_ssts; i++)
        if (!is_input(t->ssts[i].f, in, n_in))
            list[k++] = t->ssts[i];
    for (size_t i = 0; i < o->n; i++) {
        o->f[i]->tablet_refs = 1;
        list[k++] = (sto_tsst){o->f[i], sto_tsst_needs_wrap(t, o->f[i])};
    }
    free(t->ssts);
    t->ssts = list;
    t->n_ssts = k;
    t->cap_ssts = cap ? cap : 1;
    sto_tablet_update_hints_locked(t);
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < n_in; i++)
        sto_file_drop_ref(db, in[i].f);
    free(o->f);
    o->f = NULL;
    o->n = 0;
    return ST_OK;
}

static uint64_t tombstone_bound(sto_db *db, int64_t now) {
    int64_t b = now - db->o.tombstone_grace_us;
    return b > 0 ? STO_VERSION(b, 0) : 0;
}

/* Merges the chosen inputs of t (the caller holds t's compaction claim). */
static st_code run(sto_db *db, sto_tablet *t, sto_tsst *in, size_t n_in, bool full, st_err *err) {
    pthread_mutex_lock(&t->mu);
    sto_gc_set *gc = t->gc;
    sto_gc_set_ref(gc);
    pthread_mutex_unlock(&t->mu);
    int64_t now = sto_db_now_us(db);
    sto_kviter *merged = sto_tablet_sst_merge(t, in, n_in);
    sto_kviter *it =
        merged ? sto_compact_iter_new(merged, gc, now, full, tombstone_bound(db, now)) : NULL;
    sto_gc_set_unref(gc);
    if (!it)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a compaction");
    outputs o = {NULL, 0, 0};
    st_code rc = write_outputs(db, it, &o, err);
    it->ops->free(it);
    if (rc == ST_OK) {
        atomic_fetch_add(&db->compactions, 1); /* counted before the result becomes visible */
        pthread_mutex_lock(&db->meta_mu);
        rc = install(db, t, in, n_in, &o, err);
        if (rc == ST_OK) {
            st_err e;
            sto_manifest_write(db, NULL, NULL, &e);
        }
        pthread_mutex_unlock(&db->meta_mu);
    }
    outputs_discard(&o);
    if (rc == ST_DATA_LOSS)
        sto_tablet_mark_read_only(t, rc, err ? err->msg : "corrupt SSTable met by compaction");
    return rc;
}

/* Copies t's table list and chooses inputs; returns the number chosen (0 = nothing due). */
static size_t select_inputs(sto_db *db, sto_tablet *t, bool force_all, sto_tsst **out, bool *full) {
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_ssts;
    sto_tsst *all = malloc((n ? n : 1) * sizeof *all);
    bool ok = all && !t->broken;
    if (ok && n)
        memcpy(all, t->ssts, n * sizeof *all);
    pthread_mutex_unlock(&t->mu);
    size_t k = n;
    if (!ok || !choose(db, all, &k, force_all)) {
        free(all);
        return 0;
    }
    *full = k == n;
    *out = all;
    return k;
}

static void release_claim(sto_db *db, sto_tablet *t, st_code rc, bool full, const st_err *e) {
    pthread_mutex_lock(&db->mu);
    t->compacting = false;
    if (full && rc == ST_OK)
        t->last_full_us = sto_db_now_us(db);
    if (rc != ST_OK && rc != ST_DATA_LOSS) {
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

/* db->mu held: the tablet most in need: most small tables first, then one whose periodic full
 * compaction is due (*periodic). */
static sto_tablet *pick(sto_db *db, bool *periodic) {
    sto_tablet *best = NULL;
    int best_n = -1;
    int64_t mono = st_mono_us(), now = sto_db_now_us(db);
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        if (t->compacting || t->busy || t->dead || atomic_load(&t->ro_hint) ||
            t->retry_at_us > mono)
            continue;
        int n = atomic_load(&t->n_small_hint);
        if (due(db, n) && n > best_n) {
            best = t;
            best_n = n;
        } else if (best_n < 0 && !best && atomic_load(&t->n_ssts_hint) > 0 &&
                   now - t->last_full_us >= STO_FULL_COMPACTION_PERIOD_US) {
            best = t;
        }
    }
    *periodic = best && best_n < 0;
    return best;
}

bool sto_compaction_pick_and_run(sto_db *db) {
    bool periodic;
    sto_tablet *best = pick(db, &periodic);
    if (!best)
        return false;
    best->compacting = true;
    if (periodic) /* counted from now even if it fails: no retry storm */
        best->last_full_us = sto_db_now_us(db);
    pthread_mutex_unlock(&db->mu);
    sto_tsst *in = NULL;
    bool full = false;
    size_t n = select_inputs(db, best, periodic, &in, &full);
    st_err e;
    st_err_clear(&e);
    st_code rc = n ? run(db, best, in, n, full, &e) : ST_OK;
    free(in);
    release_claim(db, best, rc, full, &e);
    pthread_mutex_lock(&db->mu);
    return n > 0;
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
    pthread_mutex_unlock(&db->mu);
    sto_tsst *in = NULL;
    bool full = false;
    size_t n = select_inputs(db, t, true, &in, &full);
    st_err e;
    st_err_clear(&e);
    st_code rc = n ? run(db, t, in, n, full, &e) : ST_OK;
    free(in);
    release_claim(db, t, rc, full, &e);
    if (rc != ST_OK && err)
        *err = e;
    return rc;
}
