/* tablet.c — tablets: create, drop, split, GC rules, DropRowRange, manual flush/compaction.
 * Snapshots and their iterators are in tablet_snapshot.c, sampling (SampleRowKeys, split
 * points) in tablet_sample.c.
 *
 * Split and drop stop new records for the tablet at its gate, wait until the records already in
 * the log are applied, and (split) flush everything, so every record of the old tablet id is
 * below the flushed point the manifest records: recovery never has to route a record to a
 * child. Children list the parent's SSTables (no copy) and read them through a range wrapper. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tablet_impl.h"

#define DROP_PREFIX_BATCH 256 /* rows deleted per write by sto_tablet_drop_prefix */

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
        st_code rc = sto_mf_add_tablet(st, t->id, st_buf_slice(&t->table), st_buf_slice(&t->start),
                                       st_buf_slice(&t->end), t->flushed_lsn, t->sys_floor, files,
                                       t->n_ssts, err);
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
    out->writes_in_flight = atomic_load(&t->inflight) > 0;
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
    atomic_store(&t->yield_hint, true); /* a compaction of t stops early and is redone later */
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
    atomic_store(&t->yield_hint, false);
    pthread_cond_broadcast(&db->stall_cv);
    pthread_cond_broadcast(&db->bg_cv);
    pthread_mutex_unlock(&db->mu);
    pthread_rwlock_unlock(&t->gate);
}

/* t->mu held, t unlisted: frees its memtables, active one included, and its GC rules now rather
 * than at close. A dead tablet stays allocated until close (other threads may still hold the
 * pointer), so what it kept would grow a long-lived node per dropped or split tablet: a memtable
 * is 80 KiB and more of arena blocks, the GC rules ~4 KiB (node churn, docs/operations.md). A
 * NULL active memtable is what readers take for "gone" (sto_snapshot_new); snapshots hold their
 * own reference on the rules; writers stop at the dead flag under the gate, and flushes and
 * compactions pick no dead tablet, so none touches either again. Returns the frozen memtables'
 * accounted bytes. */
static long long release_memory_locked(sto_tablet *t) {
    long long bytes = 0;
    for (size_t i = 0; i < t->n_imm; i++) {
        bytes += (long long)t->imm[i].bytes;
        sto_memtable_unref(t->imm[i].m);
    }
    t->n_imm = 0;
    free(t->imm);
    t->imm = NULL;
    t->cap_imm = 0;
    if (t->active)
        sto_memtable_unref(t->active);
    t->active = NULL;
    sto_gc_set_unref(t->gc);
    t->gc = NULL;
    return bytes;
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
    long long bytes = (long long)t->active_bytes + release_memory_locked(t);
    t->active_bytes = 0;
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
    c->sys_floor = t->sys_floor; /* restored files stay without their change history */
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
        c->ssts[c->n_ssts++] = sto_tsst_of(c, f);
    }
    c->flushed_lsn = c->last_applied_lsn = t->flushed_lsn;
    sto_gc_set_unref(c->gc);
    c->gc = t->gc;
    sto_gc_set_ref(c->gc);
    c->report_fn = t->report_fn; /* c is not published yet: its own locks are not needed */
    c->report_arg = t->report_arg;
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

/* How long a tablet about to split keeps new compactions away: the running one ends, then the
 * split, and the halves are compacted instead. */
#define SPLIT_HOLD_US (3 * 1000000LL)

st_code sto_tablet_split_ready(sto_db *db, uint64_t id, size_t max_mem_bytes) {
    pthread_mutex_lock(&db->mu);
    sto_tablet *t = sto_db_find_locked(db, id);
    if (!t) {
        pthread_mutex_unlock(&db->mu);
        return ST_NOT_FOUND;
    }
    bool ready = !t->busy && !t->flushing && !t->compacting && atomic_load(&t->n_imm_hint) == 0;
    if (!ready)
        t->split_hold_us = st_mono_us() + SPLIT_HOLD_US;
    /* The tablet stays listed while db->mu is held (a drop or split needs it to unlist t). */
    pthread_mutex_lock(&t->mu);
    bool froze = sto_memtable_bytes(t->active) > max_mem_bytes && sto_tablet_freeze_locked(t);
    pthread_mutex_unlock(&t->mu);
    if (froze) {
        ready = false;
        pthread_cond_broadcast(&db->bg_cv);
    }
    pthread_mutex_unlock(&db->mu);
    return ready ? ST_OK : ST_UNAVAILABLE;
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

void sto_tablet_set_gc_report(sto_tablet *t, sto_gc_report_fn fn, void *arg) {
    pthread_mutex_lock(&t->report_mu); /* waits for a call of the old function to end */
    pthread_mutex_lock(&t->mu);
    t->report_fn = fn;
    t->report_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&t->report_mu);
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
