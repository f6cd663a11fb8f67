/* db.c — the node's engine: open and recovery, close, the tablet map, SSTable file bookkeeping,
 * background workers, statistics and the commit log as a source (readers, holders). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

void sto_options_default(sto_options *o) {
    memset(o, 0, sizeof *o);
    o->sync = true;
    o->memtable_bytes = 32u << 20;
    o->memtable_budget_bytes = 256u << 20;
    o->block_cache_bytes = 64u << 20;
    o->block_bytes = 16u << 10;
    o->bloom_bits_per_key = 10;
    o->zstd_level = STO_SST_ZSTD_LEVEL_DEFAULT;
    o->compaction_trigger = 4;
    o->write_stall_tables = 20;
    o->compaction_output_bytes = STO_COMPACT_OUTPUT_BYTES;
    o->log_segment_bytes = 64u << 20;
    o->log_max_unflushed_bytes = 512u << 20;
    o->tombstone_grace_us = 7LL * 24 * 3600 * 1000000;
    o->background_threads = 2;
}

int64_t sto_db_now_us(sto_db *db) {
    return st_clock_now(db->clock);
}

/* ---- tablet map ---- */

static size_t tablet_pos_locked(sto_db *db, uint64_t id) {
    size_t lo = 0, hi = db->n_tablets;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (db->tablets[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

sto_tablet *sto_db_find_locked(sto_db *db, uint64_t id) {
    size_t i = tablet_pos_locked(db, id);
    return i < db->n_tablets && db->tablets[i]->id == id ? db->tablets[i] : NULL;
}

static st_code grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return ST_OK;
    size_t ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    *arr = p;
    *cap = ncap;
    return ST_OK;
}

st_code sto_db_insert_locked(sto_db *db, sto_tablet *t, st_err *err) {
    if (db->n_tablets >= STO_TABLETS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "node holds %d tablets, the maximum",
                          STO_TABLETS_MAX);
    if (grow((void **)&db->tablets, &db->cap_tablets, db->n_tablets + 1, sizeof(sto_tablet *)) ||
        grow((void **)&db->dead, &db->cap_dead, db->n_dead + db->n_tablets + 1,
             sizeof(sto_tablet *)))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding a tablet");
    size_t i = tablet_pos_locked(db, t->id);
    memmove(&db->tablets[i + 1], &db->tablets[i], (db->n_tablets - i) * sizeof(sto_tablet *));
    db->tablets[i] = t;
    db->n_tablets++;
    return ST_OK;
}

void sto_db_remove_locked(sto_db *db, sto_tablet *t) {
    size_t i = tablet_pos_locked(db, t->id);
    ST_ASSERT(i < db->n_tablets && db->tablets[i] == t);
    memmove(&db->tablets[i], &db->tablets[i + 1], (db->n_tablets - i - 1) * sizeof(sto_tablet *));
    db->n_tablets--;
    t->dead = true;
    /* insert reserved room for every live tablet, so this cannot fail */
    ST_ASSERT(db->n_dead < db->cap_dead);
    db->dead[db->n_dead++] = t;
}

static st_code buf_set(st_buf *b, st_slice s) {
    st_buf_reset(b);
    return st_buf_append(b, s.data ? s.data : (const uint8_t *)"", s.len);
}

st_code sto_tablet_alloc(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                         sto_tablet **out, st_err *err) {
    sto_tablet *t = calloc(1, sizeof *t);
    if (!t)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating tablet %" PRIu64, id);
    t->db = db;
    t->id = id;
    t->last_full_us = sto_db_now_us(db);
    st_buf_init(&t->table);
    st_buf_init(&t->start);
    st_buf_init(&t->end);
    st_buf_init(&t->lo);
    st_buf_init(&t->hi);
    /* Writer preference: a split or drop must not starve behind a stream of writers (who take
     * the gates of a batch in id order and never hold one while waiting for a split). */
    pthread_rwlockattr_t ga;
    pthread_rwlockattr_init(&ga);
    pthread_rwlockattr_setkind_np(&ga, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&t->gate, &ga);
    pthread_rwlockattr_destroy(&ga);
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->report_mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    atomic_init(&t->inflight, 0);
    atomic_init(&t->n_ssts_hint, 0);
    atomic_init(&t->n_small_hint, 0);
    atomic_init(&t->n_settled_hint, 0);
    atomic_init(&t->n_runs_hint, 0);
    atomic_init(&t->no_tier_hint, false);
    atomic_init(&t->bytes_hint, 0);
    atomic_init(&t->read_debt, 0);
    atomic_init(&t->mem_debt, 0);
    atomic_init(&t->n_imm_hint, 0);
    atomic_init(&t->ro_hint, false);
    st_code rc = buf_set(&t->table, table);
    if (rc == ST_OK)
        rc = buf_set(&t->start, start);
    if (rc == ST_OK)
        rc = buf_set(&t->end, end);
    if (rc == ST_OK && start.len)
        rc = sto_key_encode_row_prefix(&t->lo, start);
    if (rc == ST_OK && end.len)
        rc = sto_key_encode_row_prefix(&t->hi, end);
    if (rc == ST_OK)
        rc = sto_memtable_new(&t->active);
    if (rc == ST_OK)
        rc = sto_gc_set_new(NULL, 0, &t->gc);
    if (rc != ST_OK) {
        sto_tablet_release(t);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating tablet %" PRIu64, id);
    }
    *out = t;
    return ST_OK;
}

/* Frees the tablet and its memtables; file references must have been dropped already. */
void sto_tablet_release(sto_tablet *t) {
    if (!t)
        return;
    if (t->active)
        sto_memtable_unref(t->active);
    for (size_t i = 0; i < t->n_imm; i++)
        sto_memtable_unref(t->imm[i].m);
    free(t->imm);
    sto_tablet_drop_snapset(t);
    free(t->ssts);
    if (t->gc)
        sto_gc_set_unref(t->gc);
    st_buf_free(&t->table);
    st_buf_free(&t->start);
    st_buf_free(&t->end);
    st_buf_free(&t->lo);
    st_buf_free(&t->hi);
    pthread_rwlock_destroy(&t->gate);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->report_mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void sto_tablet_mark_read_only(sto_tablet *t, st_code code, const char *msg) {
    pthread_mutex_lock(&t->mu);
    if (!t->read_only) {
        t->read_only = true;
        snprintf(t->ro_msg, sizeof t->ro_msg, "%s", msg ? msg : "");
        st_log(ST_LOG_ERROR, "storage",
               "event=tablet_read_only tablet=%" PRIu64 " code=%s reason=\"%s\"", t->id,
               st_code_name(code), t->ro_msg);
    }
    atomic_store(&t->ro_hint, true);
    pthread_mutex_unlock(&t->mu);
}

/* ---- files ---- */

void sto_db_sst_path(const sto_db *db, uint64_t number, char *out, size_t cap) {
    snprintf(out, cap, "%s/sst/%020" PRIu64 ".sst", db->dir, number);
}

uint64_t sto_db_new_file_number(sto_db *db) {
    pthread_mutex_lock(&db->mu);
    uint64_t n = db->next_file++;
    pthread_mutex_unlock(&db->mu);
    return n;
}

st_code sto_file_new(sto_db *db, uint64_t number, sto_file **out, st_err *err) {
    sto_file *f = calloc(1, sizeof *f);
    if (!f)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening an SSTable");
    f->number = number;
    char path[STO_PATH_MAX + 64];
    sto_db_sst_path(db, number, path, sizeof path);
    st_code rc = sto_sst_open(db->env, path, number, db->cache, &f->sst, err);
    if (rc != ST_OK) {
        free(f);
        return rc;
    }
    f->bytes = sto_sst_file_bytes(f->sst);
    *out = f;
    return ST_OK;
}

void sto_file_drop_ref(sto_db *db, sto_file *f) {
    ST_ASSERT(f->tablet_refs > 0);
    if (--f->tablet_refs > 0)
        return;
    sto_restored_forget(db, f);
    if (grow((void **)&db->obsolete, &db->cap_obsolete, db->n_obsolete + 1, sizeof(sto_file *)) ==
        ST_OK) {
        db->obsolete[db->n_obsolete++] = f;
        return;
    }
    /* No memory to queue it: keep the file (an orphan removed at the next open). */
    if (f->sst)
        sto_sst_unref(f->sst);
    free(f);
}

void sto_db_release_obsolete(sto_db *db) {
    for (size_t i = 0; i < db->n_obsolete; i++) {
        sto_file *f = db->obsolete[i];
        if (f->sst) {
            sto_sst_mark_obsolete(f->sst);
            sto_sst_unref(f->sst);
        }
        free(f);
    }
    db->n_obsolete = 0;
}

void sto_tablet_update_hints_locked(sto_tablet *t) {
    sto_tablet_drop_snapset(t); /* the table list changed: the next snapshot shares a new set */
    t->list_gen++;
    atomic_store(&t->n_ssts_hint, (int)t->n_ssts);
    int small, settled, runs;
    sto_compaction_count_runs(t->ssts, t->n_ssts, STO_SETTLED_SST_BYTES(t->db), &small, &settled,
                              &runs);
    atomic_store(&t->n_small_hint, small);
    atomic_store(&t->n_settled_hint, settled);
    atomic_store(&t->n_runs_hint, runs);
    atomic_store(&t->no_tier_hint, false);
    uint64_t bytes = 0;
    for (size_t i = 0; i < t->n_ssts; i++)
        bytes += t->ssts[i].f->bytes;
    atomic_store(&t->bytes_hint, bytes);
    atomic_store(&t->n_imm_hint, (int)t->n_imm);
}

sto_tsst sto_tsst_of(const sto_tablet *t, sto_file *f) {
    return (sto_tsst){f, sto_tsst_needs_wrap(t, f), f->number < t->sys_floor};
}

bool sto_tsst_needs_wrap(const sto_tablet *t, const sto_file *f) {
    if (!f->sst)
        return false;
    st_slice lo = st_buf_slice(&t->lo), hi = st_buf_slice(&t->hi);
    if (lo.len && st_slice_cmp(sto_sst_smallest(f->sst), lo) < 0)
        return true;
    if (hi.len && st_slice_cmp(sto_sst_largest(f->sst), hi) >= 0)
        return true;
    return false;
}

/* ---- workers ---- */

void sto_db_kick(sto_db *db) {
    pthread_mutex_lock(&db->mu);
    pthread_cond_broadcast(&db->bg_cv);
    pthread_mutex_unlock(&db->mu);
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t us) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + (us % 1000000) * 1000;
    ts.tv_sec += (time_t)(us / 1000000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Flushes first (they unblock writers and let the log shrink), then compactions. The timed
 * wait is the backstop for retries after failures and for memory/log pressure checks. */
static void *worker_main(void *arg) {
    sto_db *db = arg;
    pthread_mutex_lock(&db->mu);
    while (!db->stopping) {
        pthread_mutex_unlock(&db->mu);
        sto_flush_check_pressure(db);
        pthread_mutex_lock(&db->mu);
        if (db->stopping)
            break;
        if (sto_flush_pick_and_run(db))
            continue;
        if (sto_compaction_pick_and_run(db))
            continue;
        timed_wait(&db->bg_cv, &db->mu, 100000);
    }
    pthread_mutex_unlock(&db->mu);
    return NULL;
}

static st_code start_workers(sto_db *db, st_err *err) {
    int n = db->o.background_threads > 0 ? db->o.background_threads : 1;
    if (n > 64)
        n = 64;
    db->workers = calloc((size_t)n, sizeof(pthread_t));
    if (!db->workers)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting workers");
    for (int i = 0; i < n; i++) {
        if (pthread_create(&db->workers[i], NULL, worker_main, db) != 0)
            return st_err_set(err, ST_INTERNAL, "cannot start a background thread");
        db->n_workers++;
    }
    return ST_OK;
}

static void stop_workers(sto_db *db) {
    pthread_mutex_lock(&db->mu);
    db->stopping = true;
    pthread_cond_broadcast(&db->bg_cv);
    pthread_cond_broadcast(&db->stall_cv);
    pthread_mutex_unlock(&db->mu);
    for (int i = 0; i < db->n_workers; i++)
        pthread_join(db->workers[i], NULL);
    db->n_workers = 0;
    free(db->workers);
    db->workers = NULL;
}

/* ---- open / close ---- */

static st_code replay_fn(const sto_log_record *rec, void *arg) {
    return sto_replay_apply(arg, rec);
}

/* Two engines on one directory would each replay, write and delete the other's files (an
 * acknowledged write through one is lost when the other removes "orphan" files and rewrites the
 * manifest): the directory is locked for as long as the engine is open. */
static st_code lock_dir(sto_db *db, st_err *err) {
    if (!db->env->ops->lock)
        return ST_OK;
    char path[STO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/LOCK", db->dir);
    int64_t pid = 0;
    st_code rc = db->env->ops->lock(db->env, path, &db->lock, &pid, err);
    char who[64];
    if (rc == ST_FAILED_PRECONDITION)
        st_err_set(err, rc,
                   "storage directory %s is in use by another process (%s): stop it, or "
                   "open another directory",
                   db->dir, st_lock_holder_str(who, sizeof who, pid));
    return rc;
}

static st_code db_init(sto_db *db, const char *dir, const sto_options *opts, st_err *err) {
    /* first, so sto_db_close can undo any partial open */
    pthread_mutex_init(&db->meta_mu, NULL);
    pthread_mutex_init(&db->mu, NULL);
    pthread_cond_init(&db->bg_cv, NULL);
    pthread_cond_init(&db->stall_cv, NULL);
    if (strlen(dir) >= STO_PATH_MAX - 64)
        return st_err_set(err, ST_INVALID_ARGUMENT, "storage directory path too long");
    snprintf(db->dir, sizeof db->dir, "%s", dir);
    if (opts)
        db->o = *opts;
    else
        sto_options_default(&db->o);
    db->env = db->o.env ? db->o.env : st_env_posix();
    db->clock = db->o.clock ? db->o.clock : st_clock_system();
    if (db->o.compaction_output_bytes == 0)
        db->o.compaction_output_bytes = STO_COMPACT_OUTPUT_BYTES;
    if (db->o.memtable_bytes == 0 || db->o.compaction_trigger < 2 || db->o.write_stall_tables < 2)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "bad storage options: memtable_bytes must be > 0, compaction_trigger "
                          "and write_stall_tables >= 2");
    atomic_init(&db->applied_lsn, 0);
    atomic_init(&db->mem_bytes, 0);
    atomic_init(&db->flushes, 0);
    atomic_init(&db->compactions, 0);
    atomic_init(&db->stalls_us, 0);
    db->next_file = 1;
    if (!db->o.sync)
        st_log(ST_LOG_WARN, "storage",
               "event=unsafe_options sync=false msg=\"writes are acknowledged before they are "
               "durable: a crash loses recent writes\"");
    char sub[STO_PATH_MAX + 16];
    snprintf(sub, sizeof sub, "%s/sst", db->dir);
    st_code rc = db->env->ops->mkdirs(db->env, sub, err);
    if (rc == ST_OK)
        rc = lock_dir(db, err);
    if (rc == ST_OK)
        rc = sto_cache_new(db->o.block_cache_bytes, &db->cache);
    return rc;
}

/* The manifest proves records up to the highest flushed point or holder position were written;
 * a log that ends before that lost them (a segment cut short or removed from outside, or an
 * unsynced tail lost with sync=false). With sync on, and unless the operator accepted data loss,
 * the open fails: starting would serve a table without those rows as if nothing happened. */
static st_code log_end_check(sto_db *db, uint64_t last, st_err *err) {
    uint64_t known = 0;
    for (size_t i = 0; i < db->n_tablets; i++)
        if (db->tablets[i]->flushed_lsn > known)
            known = db->tablets[i]->flushed_lsn;
    for (size_t i = 0; i < db->n_holders; i++)
        if (db->holders[i].lsn > 0 && db->holders[i].lsn - 1 > known)
            known = db->holders[i].lsn - 1;
    if (db->mf_log_last > known) /* the log's durable end when the manifest was written */
        known = db->mf_log_last;
    if (known <= last)
        return ST_OK;
    if (db->o.sync && !db->o.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "the manifest of %s names commit log records up to lsn %" PRIu64
                          " but the log in %s/log ends at %" PRIu64
                          " (segments removed or cut short): restore this node's data from a "
                          "replica or a backup, or start with --accept-data-loss to serve what "
                          "remains",
                          db->dir, known, db->dir, last);
    st_log(ST_LOG_WARN, "storage",
           "event=log_records_lost log_last_lsn=%" PRIu64 " manifest_lsn=%" PRIu64
           " lost_at_least=%" PRIu64 " msg=\"the manifest names records the commit log no "
           "longer holds\"",
           last, known, known - last);
    return ST_OK;
}

static st_code count_fn(const char *name, void *arg) {
    size_t *n = arg;
    size_t len = strlen(name);
    if (name[0] != '.' && !(len > 4 && strcmp(name + len - 4, ".tmp") == 0))
        (*n)++;
    return ST_OK;
}

static size_t count_files(sto_db *db, const char *sub) {
    char path[STO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", db->dir, sub);
    size_t n = 0;
    st_err e;
    db->env->ops->list(db->env, path, count_fn, &n, &e);
    return n;
}

/* A directory without a MANIFEST is new, unless it holds log segments or SSTables: then the
 * MANIFEST (the tablet list) was removed, and opening would start empty while the old files
 * are never read again. Refused unless the operator accepted data loss. */
static st_code manifest_missing_check(sto_db *db, st_err *err) {
    char path[STO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", db->dir);
    bool have = true;
    st_code rc = db->env->ops->exists(db->env, path, &have, err);
    if (rc != ST_OK || have)
        return rc;
    size_t segs = count_files(db, "log"), ssts = count_files(db, "sst");
    if (segs == 0 && ssts == 0)
        return ST_OK;
    if (!db->o.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s has no MANIFEST but holds %zu commit log segment(s) and %zu "
                          "SSTable(s): the MANIFEST was removed and the tablets it listed cannot "
                          "be found; restore this node's data from a replica or a backup, or "
                          "start with --accept-data-loss to start empty (the old files are "
                          "deleted)",
                          db->dir, segs, ssts);
    st_log(ST_LOG_ERROR, "storage",
           "event=manifest_missing_accepted segments=%zu ssts=%zu msg=\"%s is missing: every "
           "tablet and row it listed is lost; starting empty\"",
           segs, ssts, path);
    return ST_OK;
}

/* The manifest names the oldest log segment its trim kept (with sync on; written only after the
 * segment was durable). A log whose oldest segment is newer, or that has none, lost segments to
 * something else (files removed from outside): the records in them, acknowledged and maybe
 * never flushed, are gone. Refused unless the operator accepted data loss. */
static st_code log_segments_check(sto_db *db, st_err *err) {
    uint64_t want = db->mf_log_first, oldest = sto_log_segment_first(db->log, 0);
    if (want == 0 || (oldest != 0 && oldest <= want))
        return ST_OK;
    char has[64] = "has no segment";
    if (oldest)
        snprintf(has, sizeof has, "starts at segment %020" PRIu64 ".log", oldest);
    if (db->o.sync && !db->o.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "the manifest of %s needs commit log segment %s/log/%020" PRIu64
                          ".log and later ones, but the log %s (segments removed): restore this "
                          "node's data from a replica or a backup, or start with "
                          "--accept-data-loss to serve what remains",
                          db->dir, db->dir, want, has);
    st_log(ST_LOG_ERROR, "storage",
           "event=log_segments_missing manifest_log_first=%" PRIu64 " log_oldest=%" PRIu64
           " msg=\"commit log segments the manifest needs were removed: the records in them "
           "are lost\"",
           want, oldest);
    return ST_OK;
}

/* The lowest lsn anyone still needs, known from the manifest before the log is read: replay
 * starts at replay_from (every tablet's flushed point), and each log holder (a peer cluster's
 * shipper, from the first record the peer has not acknowledged) reads from its position. Damage
 * wholly below it costs nothing and does not stop the open (docs/formats/log.md). A holder's
 * position in the manifest is never ahead of the one the holder keeps elsewhere (the shipper
 * writes its position file first), so this errs towards keeping. */
static uint64_t log_needed_from(const sto_db *db, uint64_t replay_from) {
    uint64_t need = replay_from;
    for (size_t i = 0; i < db->n_holders; i++)
        if (db->holders[i].lsn < need)
            need = db->holders[i].lsn;
    return need;
}

/* Holders below damaged records the replay skipped although they needed them (the operator
 * accepted that loss: the log refuses it otherwise) stay where they are: they still get every
 * intact record, and their readers jump the damaged ones (sto_log_hole). Until a holder has
 * passed them, a restart counts them as needed again and needs the flag again
 * (docs/operations.md). */
static void holders_report_holes(sto_db *db) {
    uint64_t lo = 0, hi = 0;
    for (size_t k = 0; sto_log_hole(db->log, k, &lo, &hi); k++)
        for (size_t i = 0; i < db->n_holders; i++) {
            uint64_t h = db->holders[i].lsn;
            if (h >= hi)
                continue;
            st_log(ST_LOG_ERROR, "storage",
                   "event=log_holder_records_lost holder=%s holder_lsn=%" PRIu64
                   " lost_first=%" PRIu64 " lost_last=%" PRIu64
                   " msg=\"the holder had not read damaged log records that were skipped "
                   "(accepted data loss): it loses lsn %" PRIu64 "..%" PRIu64 " and gets every "
                   "other record; copy the affected tables to that cluster (backup and restore). "
                   "Until it has passed them a restart needs --accept-data-loss again\"",
                   db->holders[i].name, h, h > lo ? h : lo, hi - 1, h > lo ? h : lo, hi - 1);
        }
}

static st_code db_recover(sto_db *db, st_err *err) {
    uint64_t from = 1;
    st_code rc = manifest_missing_check(db, err);
    if (rc == ST_OK)
        rc = sto_manifest_load(db, &from, err);
    if (rc != ST_OK)
        return rc;
    char logdir[STO_PATH_MAX + 16];
    snprintf(logdir, sizeof logdir, "%s/log", db->dir);
    sto_log_options lo = {.env = db->env,
                          .sync = db->o.sync,
                          .segment_bytes = db->o.log_segment_bytes,
                          .accept_data_loss = db->o.accept_data_loss,
                          .needed_from = log_needed_from(db, from)};
    rc = sto_log_open(logdir, &lo, &db->log, err);
    if (rc == ST_OK)
        rc = log_segments_check(db, err);
    if (rc != ST_OK)
        return rc;
    uint64_t oldest = sto_log_oldest_lsn(db->log);
    if (from < oldest)
        from = oldest;
    rc = sto_log_replay(db->log, from, replay_fn, db, err);
    if (rc != ST_OK) {
        st_err_prefix(err,
                      "replaying the commit log: "); /* short: damage errors name their segment, and
                                                        the advice at their end must fit */
        return rc;
    }
    holders_report_holes(db);
    uint64_t last = sto_log_last_durable_lsn(db->log);
    atomic_store(&db->applied_lsn, last);
    rc = log_end_check(db, last, err);
    if (rc != ST_OK)
        return rc;
    /* A flushed point beyond the log's end (unsynced tail lost with sync=false, or a damaged log
     * directory) would make new records look flushed: those tablets' data is all in SSTables. */
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        if (t->flushed_lsn > last) {
            st_log(ST_LOG_WARN, "storage",
                   "event=flushed_point_clamped tablet=%" PRIu64 " flushed=%" PRIu64
                   " log_end=%" PRIu64,
                   t->id, t->flushed_lsn, last);
            t->flushed_lsn = t->last_applied_lsn = last;
        }
    }
    return sto_manifest_remove_orphans(db, err);
}

/* Flushes the memtables the replay froze (they were full) before serving, as LevelDB turns its
 * log into a table at open: otherwise those flushes, and the compactions they trigger, compete
 * with the first requests for CPU and disk. Single-threaded (no workers yet). A failure (full
 * disk) does not fail the open: the data is in the log and the workers retry the flush. */
static void flush_replayed(sto_db *db) {
    for (size_t i = 0; i < db->n_tablets; i++) {
        sto_tablet *t = db->tablets[i];
        st_err e;
        if (atomic_load(&t->n_imm_hint) > 0 && sto_tablet_flush_imms(db, t, &e) != ST_OK)
            st_log(ST_LOG_WARN, "storage", "event=open_flush_failed tablet=%" PRIu64 " msg=\"%s\"",
                   t->id, e.msg);
    }
}

st_code sto_db_open(const char *dir, const sto_options *opts, sto_db **out, st_err *err) {
    sto_db *db = calloc(1, sizeof *db);
    if (!db)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening the engine");
    st_code rc = db_init(db, dir, opts, err);
    if (rc == ST_OK)
        rc = db_recover(db, err);
    if (rc == ST_OK) {
        /* Record the recovered state (and each tablet's replay point) before serving. */
        pthread_mutex_lock(&db->meta_mu);
        rc = sto_manifest_write(db, NULL, NULL, err);
        pthread_mutex_unlock(&db->meta_mu);
    }
    if (rc == ST_OK)
        flush_replayed(db);
    if (rc == ST_OK)
        rc = start_workers(db, err);
    if (rc != ST_OK) {
        sto_db_close(db);
        return rc;
    }
    *out = db;
    return ST_OK;
}

static void free_tablet_files(sto_db *db, sto_tablet *t) {
    for (size_t i = 0; i < t->n_ssts; i++)
        sto_file_drop_ref(db, t->ssts[i].f);
    t->n_ssts = 0;
}

void sto_db_close(sto_db *db) {
    if (!db)
        return;
    stop_workers(db);
    if (db->log) {
        sto_log_close(db->log);
        db->log = NULL;
    }
    pthread_mutex_lock(&db->meta_mu);
    for (size_t i = 0; i < db->n_tablets; i++) {
        free_tablet_files(db, db->tablets[i]);
        sto_tablet_release(db->tablets[i]);
    }
    for (size_t i = 0; i < db->n_dead; i++)
        sto_tablet_release(db->dead[i]);
    /* Files still queued were never made unreferenced durably: drop our refs, keep the files
     * (the next open removes what the manifest does not list). */
    for (size_t i = 0; i < db->n_obsolete; i++) {
        if (db->obsolete[i]->sst)
            sto_sst_unref(db->obsolete[i]->sst);
        free(db->obsolete[i]);
    }
    pthread_mutex_unlock(&db->meta_mu);
    free(db->obsolete);
    free(db->restored);
    free(db->tablets);
    free(db->dead);
    if (db->cache)
        sto_cache_free(db->cache);
    pthread_mutex_destroy(&db->meta_mu);
    pthread_mutex_destroy(&db->mu);
    pthread_cond_destroy(&db->bg_cv);
    pthread_cond_destroy(&db->stall_cv);
    if (db->lock)
        db->env->ops->unlock(db->lock); /* last: nothing of this engine touches the files now */
    free(db);
}

/* ---- statistics ---- */

void sto_db_stats(sto_db *db, sto_stats *out) {
    memset(out, 0, sizeof *out);
    long long mem = atomic_load(&db->mem_bytes);
    out->memtable_bytes = mem > 0 ? (uint64_t)mem : 0;
    sto_cache_stats(db->cache, &out->cache_bytes, &out->cache_hits, &out->cache_misses);
    sto_cache_read_stats(db->cache, &out->blocks_read, &out->block_bytes_read);
    out->log_bytes = sto_log_bytes(db->log);
    out->flushes = atomic_load(&db->flushes);
    out->compactions = atomic_load(&db->compactions);
    out->stalls_us = atomic_load(&db->stalls_us);
    pthread_mutex_lock(&db->mu);
    for (size_t i = 0; i < db->n_tablets; i++)
        out->sst_count += (uint64_t)atomic_load(&db->tablets[i]->n_ssts_hint);
    pthread_mutex_unlock(&db->mu);
}

/* ---- the commit log as a source ---- */

struct sto_log_reader {
    sto_log_cursor *c;
};

st_code sto_log_reader_open(sto_db *db, uint64_t from_lsn, sto_log_reader **out, st_err *err) {
    sto_log_reader *r = calloc(1, sizeof *r);
    if (!r)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening a log reader");
    st_code rc = sto_log_cursor_open(db->log, from_lsn, &r->c, err);
    if (rc != ST_OK) {
        free(r);
        return rc;
    }
    *out = r;
    return ST_OK;
}

st_code sto_log_reader_next(sto_log_reader *r, sto_log_record *rec, st_err *err) {
    return sto_log_cursor_next(r->c, rec, err);
}

st_code sto_log_reader_next_raw(sto_log_reader *r, uint64_t *lsn, st_slice *payload, st_err *err) {
    return sto_log_cursor_next_raw(r->c, lsn, payload, err);
}

void sto_log_reader_close(sto_log_reader *r) {
    if (!r)
        return;
    sto_log_cursor_close(r->c);
    free(r);
}

typedef struct hold_arg {
    const char *name;
    uint64_t lsn;
    bool remove;
} hold_arg;

static st_code hold_edit(sto_mf_state *st, void *arg, st_err *err) {
    hold_arg *h = arg;
    return sto_mf_set_holder(st, h->name, h->lsn, h->remove, err);
}

/* Holders live in db->holders; the manifest is written with the edit first, then memory
 * follows, so memory never claims more than is durable. */
static st_code hold_change(sto_db *db, const char *holder, uint64_t lsn, bool remove, st_err *err) {
    if (!holder || !holder[0] || strlen(holder) >= STO_HOLDER_NAME_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "log holder name must be 1..%d bytes",
                          STO_HOLDER_NAME_MAX - 1);
    /* Records recovery skipped as damaged when nobody needed them can never be read: holding
     * them would only make the next start count them as needed and refuse it. */
    uint64_t readable = db->log ? sto_log_readable_from(db->log) : 0;
    if (!remove && lsn < readable)
        lsn = readable;
    hold_arg h = {holder, lsn, remove};
    pthread_mutex_lock(&db->meta_mu);
    st_code rc = sto_manifest_write(db, hold_edit, &h, err);
    if (rc == ST_OK) {
        pthread_mutex_lock(&db->mu);
        size_t i = 0;
        while (i < db->n_holders && strcmp(db->holders[i].name, holder) != 0)
            i++;
        if (remove && i < db->n_holders) {
            db->holders[i] = db->holders[--db->n_holders];
        } else if (!remove) {
            if (i == db->n_holders)
                db->n_holders++;
            snprintf(db->holders[i].name, sizeof db->holders[i].name, "%s", holder);
            db->holders[i].lsn = lsn;
        }
        pthread_mutex_unlock(&db->mu);
    }
    pthread_mutex_unlock(&db->meta_mu);
    return rc;
}

st_code sto_log_hold(sto_db *db, const char *holder, uint64_t lsn, st_err *err) {
    return hold_change(db, holder, lsn, false, err);
}

st_code sto_log_release(sto_db *db, const char *holder, st_err *err) {
    return hold_change(db, holder, 0, true, err);
}

bool sto_log_tail_dropped_at_open(sto_db *db) {
    return sto_log_tail_dropped(db->log);
}

/* The log publishes its durable point after the done callbacks ran, so a write already
 * acknowledged (and applied) may be ahead of it for a moment: report the larger. */
uint64_t sto_log_last_lsn(sto_db *db) {
    uint64_t d = sto_log_last_durable_lsn(db->log), a = atomic_load(&db->applied_lsn);
    return a > d ? a : d;
}
