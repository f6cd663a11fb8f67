/* tablet.c — tablets: create, drop, split, GC rules, DropRowRange, manual flush/compaction,
 * snapshots and iterators, and sampling (SampleRowKeys, split points).
 *
 * Split and drop stop new records for the tablet at its gate, wait until the records already in
 * the log are applied, and (split) flush everything, so every record of the old tablet id is
 * below the flushed point the manifest records: recovery never has to route a record to a
 * child. Children list the parent's SSTables (no copy) and read them through a range wrapper. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

#define DROP_PREFIX_BATCH 256        /* rows deleted per write by sto_tablet_drop_prefix */
#define MID_SCAN_ENTRIES_MAX 1000000 /* entries scanned for a split point of a tiny tablet */

/* ---- create / get / list / info ---- */

#define TABLE_NAME_MAX 1024 /* bytes of the opaque table name kept per tablet */

static st_code check_range(st_slice table, st_slice start, st_slice end, st_err *err) {
    if (table.len > TABLE_NAME_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "table name over %d bytes", TABLE_NAME_MAX);
    if (start.len > STO_ROW_KEY_MAX || end.len > STO_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "tablet bounds are row keys of <= %d bytes",
                          STO_ROW_KEY_MAX);
    if (end.len && st_slice_cmp(start, end) >= 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "tablet start must sort before its end");
    return ST_OK;
}

typedef struct add_arg {
    sto_tablet *t[2];
    int n;
    uint64_t remove_id;
    bool remove;
} add_arg;

static st_code add_edit(sto_mf_state *st, void *arg, st_err *err) {
    add_arg *a = arg;
    if (a->remove)
        sto_mf_remove_tablet(st, a->remove_id);
    for (int i = 0; i < a->n; i++) {
        sto_tablet *t = a->t[i];
        uint64_t stack[64], *files = t->n_ssts > 64 ? malloc(t->n_ssts * 8) : stack;
        if (!files)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
        for (size_t j = 0; j < t->n_ssts; j++)
            files[j] = t->ssts[j].f->number;
        st_code rc =
            sto_mf_add_tablet(st, t->id, st_buf_slice(&t->table), st_buf_slice(&t->start),
                              st_buf_slice(&t->end), t->flushed_lsn, files, t->n_ssts, err);
        if (files != stack)
            free(files);
        if (rc != ST_OK)
            return rc;
    }
    return ST_OK;
}

static uint64_t current_lsn(sto_db *db) {
    uint64_t a = atomic_load(&db->applied_lsn), d = sto_log_last_durable_lsn(db->log);
    return a > d ? a : d;
}

st_code sto_tablet_create(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                          sto_tablet **out, st_err *err) {
    st_code rc = check_range(table, start, end, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&db->meta_mu);
    pthread_mutex_lock(&db->mu);
    bool exists = sto_db_find_locked(db, id) != NULL;
    pthread_mutex_unlock(&db->mu);
    sto_tablet *t = NULL;
    if (exists)
        rc = st_err_set(err, ST_ALREADY_EXISTS, "tablet %" PRIu64 " already exists", id);
    else
        rc = sto_tablet_alloc(db, id, table, start, end, &t, err);
    if (rc == ST_OK) {
        /* Records of an earlier tablet with this id are all below the current lsn. */
        t->flushed_lsn = t->last_applied_lsn = current_lsn(db);
        add_arg a = {{t, NULL}, 1, 0, false};
        rc = sto_manifest_write(db, add_edit, &a, err);
    }
    if (rc == ST_OK) {
        pthread_mutex_lock(&db->mu);
        rc = sto_db_insert_locked(db, t, err);
        pthread_mutex_unlock(&db->mu);
    }
    pthread_mutex_unlock(&db->meta_mu);
    if (rc != ST_OK) {
        sto_tablet_release(t);
        return rc;
    }
    if (out)
        *out = t;
    return ST_OK;
}

st_code sto_tablet_get(sto_db *db, uint64_t id, sto_tablet **out) {
    pthread_mutex_lock(&db->mu);
    sto_tablet *t = sto_db_find_locked(db, id);
    pthread_mutex_unlock(&db->mu);
    if (!t)
        return ST_NOT_FOUND;
    *out = t;
    return ST_OK;
}

void sto_tablet_info_get(sto_tablet *t, sto_tablet_info *out) {
    memset(out, 0, sizeof *out);
    out->id = t->id;
    out->table = st_buf_slice(&t->table);
    out->start = st_buf_slice(&t->start);
    out->end = st_buf_slice(&t->end);
    pthread_mutex_lock(&t->mu);
    uint64_t bytes = t->active_bytes;
    for (size_t i = 0; i < t->n_imm; i++)
        bytes += t->imm[i].bytes;
    for (size_t i = 0; i < t->n_ssts; i++) {
        sto_file *f = t->ssts[i].f;
        if (!f->sst || !t->ssts[i].wrap) {
            bytes += f->bytes;
            continue;
        }
        uint64_t a = t->lo.len ? sto_sst_approx_offset(f->sst, st_buf_slice(&t->lo)) : 0;
        uint64_t b = t->hi.len ? sto_sst_approx_offset(f->sst, st_buf_slice(&t->hi)) : f->bytes;
        bytes += b > a ? b - a : 0;
    }
    out->approx_bytes = bytes;
    out->flushed_lsn = t->flushed_lsn;
    out->sst_count = (int)t->n_ssts;
    out->read_only = t->read_only;
    pthread_mutex_unlock(&t->mu);
}

/* Copies the tablet pointers first so fn may call back into the engine. Tablet structs stay
 * allocated until close, so the pointers outlive a concurrent split or drop. */
void sto_tablet_list(sto_db *db, void (*fn)(const sto_tablet_info *info, void *arg), void *arg) {
    pthread_mutex_lock(&db->mu);
    size_t n = db->n_tablets;
    sto_tablet **copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy && n)
        memcpy(copy, db->tablets, n * sizeof *copy);
    pthread_mutex_unlock(&db->mu);
    if (!copy)
        return;
    for (size_t i = 0; i < n; i++) {
        sto_tablet_info info;
        sto_tablet_info_get(copy[i], &info);
        fn(&info, arg);
    }
    free(copy);
}

/* ---- exclusive operations (split, drop) ---- */

/* Claims t for a split or drop: no background job runs on it, no new record for it enters the
 * log, and every record already appended is applied. */
static st_code claim_exclusive(sto_db *db, uint64_t id, sto_tablet **out, st_err *err) {
    pthread_mutex_lock(&db->mu);
    sto_tablet *t = sto_db_find_locked(db, id);
    while (t && t->busy) {
        pthread_cond_wait(&db->stall_cv, &db->mu);
        t = sto_db_find_locked(db, id);
    }
    if (!t) {
        pthread_mutex_unlock(&db->mu);
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    }
    t->busy = true;
    while (t->flushing || t->compacting)
        pthread_cond_wait(&db->stall_cv, &db->mu);
    pthread_mutex_unlock(&db->mu);
    pthread_rwlock_wrlock(&t->gate);
    pthread_mutex_lock(&t->mu);
    while (atomic_load(&t->inflight) > 0)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    *out = t;
    return ST_OK;
}

static void release_exclusive(sto_db *db, sto_tablet *t) {
    pthread_mutex_lock(&db->mu);
    if (!t->dead)
        t->busy = false;
    pthread_cond_broadcast(&db->stall_cv);
    pthread_cond_broadcast(&db->bg_cv);
    pthread_mutex_unlock(&db->mu);
    pthread_rwlock_unlock(&t->gate);
}

/* meta_mu held, after the manifest no longer lists t: t's files and memory go. */
static void retire(sto_db *db, sto_tablet *t) {
    pthread_mutex_lock(&db->mu);
    sto_db_remove_locked(db, t);
    pthread_mutex_unlock(&db->mu);
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_ssts;
    sto_tsst *ssts = t->ssts;
    t->ssts = NULL;
    t->n_ssts = t->cap_ssts = 0;
    long long bytes = (long long)t->active_bytes;
    t->active_bytes = 0;
    for (size_t i = 0; i < t->n_imm; i++) {
        bytes += (long long)t->imm[i].bytes;
        sto_memtable_unref(t->imm[i].m);
    }
    t->n_imm = 0;
    atomic_store(&t->n_imm_hint, 0);
    sto_tablet_update_hints_locked(t);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_sub(&db->mem_bytes, bytes);
    for (size_t i = 0; i < n; i++)
        sto_file_drop_ref(db, ssts[i].f);
    free(ssts);
    /* The manifest just written lists none of the queued files. */
    sto_db_release_obsolete(db);
}

st_code sto_tablet_drop(sto_db *db, uint64_t id, st_err *err) {
    sto_tablet *t;
    st_code rc = claim_exclusive(db, id, &t, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&db->meta_mu);
    add_arg a = {{NULL, NULL}, 0, id, true};
    rc = sto_manifest_write(db, add_edit, &a, err);
    if (rc == ST_OK)
        retire(db, t);
    pthread_mutex_unlock(&db->meta_mu);
    release_exclusive(db, t);
    return rc;
}

/* A child of t covering [start, end), listing t's files (shared). meta_mu held. */
static st_code make_child(sto_db *db, sto_tablet *t, uint64_t id, st_slice start, st_slice end,
                          sto_tablet **out, st_err *err) {
    sto_tablet *c;
    st_code rc = sto_tablet_alloc(db, id, st_buf_slice(&t->table), start, end, &c, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&t->mu);
    c->ssts = calloc(t->n_ssts ? t->n_ssts : 1, sizeof(sto_tsst));
    if (!c->ssts) {
        pthread_mutex_unlock(&t->mu);
        sto_tablet_release(c);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory splitting a tablet");
    }
    c->cap_ssts = t->n_ssts ? t->n_ssts : 1;
    for (size_t i = 0; i < t->n_ssts; i++) {
        sto_file *f = t->ssts[i].f;
        f->tablet_refs++;
        c->ssts[c->n_ssts++] = (sto_tsst){f, sto_tsst_needs_wrap(c, f)};
    }
    c->flushed_lsn = c->last_applied_lsn = t->flushed_lsn;
    sto_gc_set_unref(c->gc);
    c->gc = t->gc;
    sto_gc_set_ref(c->gc);
    c->read_only = t->read_only;
    c->broken = t->broken;
    memcpy(c->ro_msg, t->ro_msg, sizeof c->ro_msg);
    atomic_store(&c->ro_hint, t->read_only);
    sto_tablet_update_hints_locked(c);
    pthread_mutex_unlock(&t->mu);
    *out = c;
    return ST_OK;
}

static void unmake_child(sto_tablet *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->n_ssts; i++)
        c->ssts[i].f->tablet_refs--; /* the parent still lists them: never reaches zero */
    c->n_ssts = 0;
    sto_tablet_release(c);
}

static st_code check_split(sto_db *db, uint64_t id, st_slice split_row, uint64_t left_id,
                           uint64_t right_id, st_err *err) {
    if (left_id == right_id)
        return st_err_set(err, ST_INVALID_ARGUMENT, "split children need distinct ids");
    if (split_row.len == 0 || split_row.len > STO_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "split row must be 1..%d bytes",
                          STO_ROW_KEY_MAX);
    pthread_mutex_lock(&db->mu);
    sto_tablet *t = sto_db_find_locked(db, id);
    st_code rc = ST_OK;
    if (!t)
        rc = st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    else if (st_slice_cmp(split_row, st_buf_slice(&t->start)) <= 0 ||
             (t->end.len && st_slice_cmp(split_row, st_buf_slice(&t->end)) >= 0))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "split row must lie strictly inside tablet %" PRIu64, id);
    else if ((left_id != id && sto_db_find_locked(db, left_id)) ||
             (right_id != id && sto_db_find_locked(db, right_id)))
        rc = st_err_set(err, ST_ALREADY_EXISTS, "a split child id is already in use");
    pthread_mutex_unlock(&db->mu);
    return rc;
}

/* meta_mu held: children made durable, then swapped in for the parent. */
static st_code split_install(sto_db *db, sto_tablet *t, st_slice split_row, uint64_t left_id,
                             uint64_t right_id, st_err *err) {
    add_arg a = {{NULL, NULL}, 2, t->id, true};
    st_code rc = make_child(db, t, left_id, st_buf_slice(&t->start), split_row, &a.t[0], err);
    if (rc == ST_OK)
        rc = make_child(db, t, right_id, split_row, st_buf_slice(&t->end), &a.t[1], err);
    if (rc == ST_OK)
        rc = sto_manifest_write(db, add_edit, &a, err);
    if (rc != ST_OK) {
        unmake_child(a.t[0]);
        unmake_child(a.t[1]);
        return rc;
    }
    retire(db, t);
    pthread_mutex_lock(&db->mu);
    for (int i = 0; i < 2; i++) {
        /* room was reserved by the parent's slot and insert's dead-list growth */
        st_code r = sto_db_insert_locked(db, a.t[i], NULL);
        ST_ASSERT(r == ST_OK);
    }
    pthread_mutex_unlock(&db->mu);
    return ST_OK;
}

st_code sto_tablet_split(sto_db *db, uint64_t id, st_slice split_row, uint64_t left_id,
                         uint64_t right_id, st_err *err) {
    st_code rc = check_split(db, id, split_row, left_id, right_id, err);
    if (rc != ST_OK)
        return rc;
    sto_tablet *t;
    rc = claim_exclusive(db, id, &t, err);
    if (rc != ST_OK)
        return rc;
    if (atomic_load(&t->ro_hint) && t->broken)
        rc = st_err_set(err, ST_DATA_LOSS, "tablet %" PRIu64 " is damaged: %s", id, t->ro_msg);
    if (rc == ST_OK) {
        pthread_mutex_lock(&t->mu);
        sto_tablet_freeze_locked(t);
        pthread_mutex_unlock(&t->mu);
        rc = sto_tablet_flush_imms(db, t, err);
    }
    if (rc == ST_OK) {
        pthread_mutex_lock(&db->meta_mu);
        rc = split_install(db, t, split_row, left_id, right_id, err);
        pthread_mutex_unlock(&db->meta_mu);
    }
    release_exclusive(db, t);
    return rc;
}

/* ---- GC rules, manual flush and compaction ---- */

st_code sto_tablet_set_gc(sto_tablet *t, const sto_family_gc *fams, size_t n, st_err *err) {
    sto_gc_set *g;
    if (sto_gc_set_new(fams, n, &g) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory copying GC rules");
    pthread_mutex_lock(&t->mu);
    sto_gc_set *old = t->gc;
    t->gc = g;
    pthread_mutex_unlock(&t->mu);
    sto_gc_set_unref(old);
    return ST_OK;
}

st_code sto_tablet_flush(sto_db *db, uint64_t id, st_err *err) {
    sto_tablet *t;
    if (sto_tablet_get(db, id, &t) != ST_OK)
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    pthread_mutex_lock(&t->mu);
    sto_tablet_freeze_locked(t);
    pthread_mutex_unlock(&t->mu);
    return sto_tablet_flush_imms(db, t, err);
}

st_code sto_tablet_compact(sto_db *db, uint64_t id, st_err *err) {
    sto_tablet *t;
    if (sto_tablet_get(db, id, &t) != ST_OK)
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    return sto_compaction_full(db, t, err);
}

/* ---- snapshots and iterators ---- */

typedef struct snap_sst {
    sto_sst *sst;
    bool wrap;
} snap_sst;

/* The tablet's SSTables as snapshots read them, immutable and shared: a snapshot takes one
 * reference on the set instead of one on every table. With ~64 tables after a sequential load
 * and two reader threads, the per-table counters bouncing between cores were 7% of a point
 * read's CPU (LevelDB shares its Version the same way). The tablet holds one reference while its
 * list is unchanged; sto_tablet_update_hints_locked drops it whenever the list changes. */
typedef struct sto_snapset {
    atomic_size_t refs;
    size_t n;
    snap_sst ssts[];
} sto_snapset;

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
            ss->ssts[i] = (snap_sst){t->ssts[i].f->sst, t->ssts[i].wrap};
        }
        t->snapset = ss;
    }
    atomic_fetch_add(&t->snapset->refs, 1);
    return t->snapset;
}

struct sto_snapshot {
    sto_tablet *t;
    uint64_t lsn;
    sto_memtable **mems;
    size_t n_mems;
    sto_snapset *set; /* holds the tables ssts points at */
    const snap_sst *ssts;
    size_t n_ssts;
    sto_gc_set *gc;
    sto_sst_keep keep; /* shared by the snapshot's iterators (sst.h): repeated seeks into an
                        * uncached block, one per range of a ReadRows, read it once */
};

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

/* ikey bounds of a read range, for skipping tables that cannot hold any of its rows. */
typedef struct key_bounds {
    st_buf lo, hi;
    bool point; /* a single row: the bloom filter applies */
} key_bounds;

/* Each thread keeps the buffers of its last read's bounds (freed when the thread ends): two
 * allocations fewer per point read. */
static pthread_key_t bounds_key;
static bool bounds_key_ok;
static pthread_once_t bounds_once = PTHREAD_ONCE_INIT;

static void bounds_destroy(void *p) {
    key_bounds *b = p;
    st_buf_free(&b->lo);
    st_buf_free(&b->hi);
    free(b);
}

static void bounds_key_init(void) {
    bounds_key_ok = pthread_key_create(&bounds_key, bounds_destroy) == 0;
}

static void bounds_take(key_bounds *b) {
    pthread_once(&bounds_once, bounds_key_init);
    key_bounds *kept = bounds_key_ok ? pthread_getspecific(bounds_key) : NULL;
    if (kept) {
        *b = *kept;
        b->lo.len = b->hi.len = 0;
        st_buf_init(&kept->lo); /* kept now holds nothing until bounds_free */
        st_buf_init(&kept->hi);
        return;
    }
    st_buf_init(&b->lo);
    st_buf_init(&b->hi);
}

static void bounds_free(key_bounds *b) {
    key_bounds *kept = bounds_key_ok ? pthread_getspecific(bounds_key) : NULL;
    if (!kept && bounds_key_ok && (kept = calloc(1, sizeof *kept)) != NULL &&
        pthread_setspecific(bounds_key, kept) != 0) {
        free(kept);
        kept = NULL;
    }
    if (kept && !kept->lo.data && !kept->hi.data && b->lo.cap + b->hi.cap <= 4096) {
        kept->lo = b->lo;
        kept->hi = b->hi;
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
static sto_kviter *run_iter(sto_snapshot *s, sto_sst **tabs, bool *wrap, size_t n) {
    sto_tablet *t = s->t;
    if (n > 1)
        return sto_sst_concat_iter_new(tabs, wrap, n, st_buf_slice(&t->lo), st_buf_slice(&t->hi),
                                       sto_range_iter_new, &s->keep);
    sto_kviter *it = sto_sst_iter_new_kept(tabs[0], &s->keep);
    if (it && wrap[0])
        it = sto_range_iter_new(it, st_buf_slice(&t->lo), st_buf_slice(&t->hi));
    return it;
}

/* Children: memtables (lsn-bounded; an empty one holds nothing the snapshot may see, as entries
 * are never removed), then SSTables that may hold rows of the range, grouped into runs of
 * consecutive tables (newest first) with disjoint ranges: equal keys can only come from
 * different runs, so the merge's newest-first tie order is kept. counts (may be NULL) gets the
 * number of memtable children and of SSTable runs. */
static sto_kviter *snapshot_merge(sto_snapshot *s, const key_bounds *b, int counts[2]) {
    size_t cap = s->n_mems + s->n_ssts + 1;
    sto_kviter **kids = malloc(cap * (sizeof(sto_kviter *) + sizeof(sto_sst *) + sizeof(bool)));
    if (!kids)
        return NULL;
    sto_sst **tabs = (sto_sst **)(void *)(kids + cap);
    bool *wrap = (bool *)(void *)(tabs + cap);
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
        wrap[m++] = s->ssts[i].wrap;
    }
    size_t run = 0; /* the current run is tabs[run, i) */
    for (size_t i = 0; ok && i <= m; i++) {
        bool fits = i < m && i - run < STO_SST_CONCAT_MAX;
        for (size_t j = run; fits && j < i; j++)
            fits = sto_sst_disjoint(tabs[j], tabs[i]);
        if (fits || i == run)
            continue;
        kids[k] = run_iter(s, tabs + run, wrap + run, i - run);
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
    key_bounds b;
    int counts[2] = {0, 0};
    st_code rc = bounds_init(&b, range);
    sto_kviter *m = rc == ST_OK ? snapshot_merge(s, &b, counts) : NULL;
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
    rc = sto_rowreader_new(m, s->gc, sto_db_now_us(s->t->db), range ? range : &all, reverse,
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

/* ---- DropRowRange ---- */

/* The smallest key above every key with this prefix (empty = unbounded). */
static void prefix_end(st_slice prefix, st_buf *out) {
    size_t n = prefix.len;
    while (n > 0 && prefix.data[n - 1] == 0xff)
        n--;
    if (n == 0)
        return;
    st_buf_append(out, prefix.data, n);
    out->data[n - 1]++;
}

typedef struct drop_batch {
    st_buf rows[DROP_PREFIX_BATCH];
    size_t n;
} drop_batch;

static st_code drop_flush(sto_db *db, uint64_t id, drop_batch *b, uint64_t version, st_err *err) {
    if (b->n == 0)
        return ST_OK;
    sto_mut del = {.type = STO_MUT_DEL_ROW};
    sto_row_mut rows[DROP_PREFIX_BATCH];
    for (size_t i = 0; i < b->n; i++)
        rows[i] = (sto_row_mut){.tablet_id = id,
                                .row = st_buf_slice(&b->rows[i]),
                                .muts = &del,
                                .n_muts = 1,
                                .version = version,
                                .commit_ts_us = STO_VERSION_TS_US(version)};
    st_code rc = sto_write(db, rows, b->n, NULL, err);
    b->n = 0;
    return rc;
}

/* Scans the rows with the prefix in a snapshot and writes a row delete for each through the
 * normal write path (durable, replicated like any write). Simple and correct; a range tombstone
 * would avoid the scan, at the cost of a new entry kind in every reader. */
static st_code drop_scan(sto_db *db, sto_tablet *t, sto_iter *it, uint64_t version, drop_batch *b,
                         st_err *err) {
    st_code rc;
    sto_cell cell;
    while ((rc = sto_iter_next(it, &cell, err)) == ST_OK) {
        st_buf_reset(&b->rows[b->n]);
        if (st_buf_append(&b->rows[b->n], cell.row.data, cell.row.len) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory in DropRowRange");
        b->n++;
        sto_iter_skip_row(it);
        if (b->n == DROP_PREFIX_BATCH && (rc = drop_flush(db, t->id, b, version, err)) != ST_OK)
            return rc;
    }
    if (rc != ST_NOT_FOUND)
        return rc;
    return drop_flush(db, t->id, b, version, err);
}

st_code sto_tablet_drop_prefix(sto_db *db, uint64_t id, st_slice prefix, uint64_t version,
                               st_err *err) {
    sto_tablet *t;
    if (sto_tablet_get(db, id, &t) != ST_OK)
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    sto_snapshot *s;
    st_code rc = sto_snapshot_new(t, &s, err);
    if (rc != ST_OK)
        return rc;
    st_buf end;
    st_buf_init(&end);
    if (prefix.len)
        prefix_end(prefix, &end);
    sto_range r = {prefix, false, st_buf_slice(&end), false};
    sto_iter *it = NULL;
    drop_batch *b = calloc(1, sizeof *b);
    if (!b)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory in DropRowRange");
    if (rc == ST_OK)
        rc = sto_iter_new(s, &r, false, &it, err);
    if (rc == ST_OK)
        rc = drop_scan(db, t, it, version, b, err);
    sto_iter_free(it);
    sto_snapshot_free(s);
    if (b)
        for (size_t i = 0; i < DROP_PREFIX_BATCH; i++)
            st_buf_free(&b->rows[i]);
    free(b);
    st_buf_free(&end);
    return rc;
}

/* ---- sampling ---- */

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
        sto_kviter *it = snapshot_merge(s, &none, NULL);
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
