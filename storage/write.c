/* write.c — the write path: validate, stall while flushing lags, append to the commit log (group
 * commit), and on the log's commit thread apply each durable record to its tablet's active
 * memtable with the record's lsn, then acknowledge.
 *
 * Row atomicity: one row mutation is one log record with one lsn; the commit thread applies it
 * under the tablet's mu and only then publishes it through db->applied_lsn, the bound every
 * snapshot reads under. After a crash a record is either whole in the log (replayed) or torn
 * (discarded, never acknowledged). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

#define WRITE_STACK_TABLETS 16 /* distinct tablets handled without allocating */
/* A row mutation's log record size is estimated before encoding it: its names and values, plus
 * WRITE_MUT_OVERHEAD_BYTES per mutation (type, timestamps, varint lengths: well under that), and
 * must stay WRITE_RECORD_SLACK_BYTES under STO_LOG_RECORD_BYTES_MAX (the record's header, row
 * key framing, version and origin fields), so a row that passes the check always fits. */
#define WRITE_MUT_OVERHEAD_BYTES 64
#define WRITE_RECORD_SLACK_BYTES 4096
/* A stalled writer wakes at least this often to look again (closing, background failures), even
 * if no one signals stall_cv. */
#define WRITE_STALL_RECHECK_NS (50 * 1000000L)
#define WRITE_NS_PER_S 1000000000L
/* Arena block for the copies of an async write's rows (most batches fit in one). */
#define WRITE_ASYNC_ARENA_BLOCK_BYTES (64u << 10)

typedef struct write_ctx {
    sto_db *db;
    const sto_row_mut *rows;
    size_t n;
    sto_tablet **tabs; /* per row */
    sto_tablet *tabs_stack[WRITE_STACK_TABLETS];
    /* sto_write: filled by finish before sto_log_append_wait returns (see sto_write) */
    atomic_bool released; /* finish touches c no more */
    st_code code;
    st_err err;
    uint64_t lsn;
    /* sto_write_async: rows copied into arena, then done(arg) */
    bool async;
    sto_write_done_fn cb;
    void *cb_arg;
    st_arena arena;
} write_ctx;

/* ---- validation ---- */

static st_code check_mut(const sto_mut *m, st_err *err) {
    if (m->type < STO_MUT_SET_CELL || m->type > STO_MUT_DEL_ROW)
        return st_err_set(err, ST_INVALID_ARGUMENT, "unknown mutation type %d", (int)m->type);
    if (m->type == STO_MUT_DEL_ROW)
        return ST_OK;
    if (m->family.len == 0 || m->family.len > STO_QUALIFIER_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "column family name must be 1..%d bytes",
                          STO_QUALIFIER_MAX);
    if (m->type == STO_MUT_DEL_FAMILY)
        return ST_OK;
    if (m->qualifier.len > STO_QUALIFIER_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "column qualifier is %zu bytes, over %d",
                          m->qualifier.len, STO_QUALIFIER_MAX);
    if (m->type == STO_MUT_DEL_COLUMN) {
        if (m->ts_start_us < 0 || m->ts_end_us < m->ts_start_us)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "DeleteFromColumn time range [%" PRId64 ", %" PRId64 ") is invalid",
                              m->ts_start_us, m->ts_end_us);
        return ST_OK;
    }
    if (m->ts_us < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "cell timestamp %" PRId64 " is negative",
                          m->ts_us);
    if (m->value.len > STO_VALUE_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "cell value is %zu bytes, over %u",
                          m->value.len, STO_VALUE_MAX);
    return ST_OK;
}

st_code sto_validate_mut(const sto_row_mut *r, st_err *err) {
    if (r->row.len == 0 || r->row.len > STO_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "row key is %zu bytes; it must be 1..%d",
                          r->row.len, STO_ROW_KEY_MAX);
    if (r->n_muts > STO_MUTS_PER_ROW_MAX || (r->n_muts && !r->muts))
        return st_err_set(err, ST_INVALID_ARGUMENT, "row mutation has %zu mutations, max %d",
                          r->n_muts, STO_MUTS_PER_ROW_MAX);
    uint64_t bytes = r->row.len;
    for (size_t i = 0; i < r->n_muts; i++) {
        st_code rc = check_mut(&r->muts[i], err);
        if (rc != ST_OK)
            return rc;
        bytes += r->muts[i].family.len + r->muts[i].qualifier.len + r->muts[i].value.len +
                 WRITE_MUT_OVERHEAD_BYTES;
    }
    if (bytes > STO_LOG_RECORD_BYTES_MAX - WRITE_RECORD_SLACK_BYTES) /* one row: one record */
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "row mutation is %llu bytes; one row's mutations must stay under %u",
                          (unsigned long long)bytes,
                          STO_LOG_RECORD_BYTES_MAX - WRITE_RECORD_SLACK_BYTES);
    return ST_OK;
}

static bool covers(const sto_tablet *t, st_slice row) {
    if (st_slice_cmp(row, st_buf_slice(&t->start)) < 0)
        return false;
    return t->end.len == 0 || st_slice_cmp(row, st_buf_slice(&t->end)) < 0;
}

/* db->mu held. */
static st_code lookup_row(sto_db *db, const sto_row_mut *r, sto_tablet **out, st_err *err) {
    sto_tablet *t = sto_db_find_locked(db, r->tablet_id);
    if (!t)
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node",
                          r->tablet_id);
    if (!covers(t, r->row))
        return st_err_set(err, ST_OUT_OF_RANGE, "row is outside tablet %" PRIu64 "'s range", t->id);
    if (atomic_load(&t->ro_hint)) {
        pthread_mutex_lock(&t->mu);
        st_err_set(err, ST_DATA_LOSS, "tablet %" PRIu64 " is read-only after corruption: %s", t->id,
                   t->ro_msg);
        pthread_mutex_unlock(&t->mu);
        return ST_DATA_LOSS;
    }
    *out = t;
    return ST_OK;
}

/* ---- stalls ---- */

/* sto_write stalls at the configured bounds: a tablet's frozen memtables and small tables, and
 * all memtables of the node at twice memtable_budget_bytes (the budget itself only triggers
 * flushes). sto_write_async, usually called from an event loop that must keep serving, stalls
 * only at twice those bounds: memory and table counts stay bounded, but ordinary backpressure
 * does not freeze the loop. */
static bool stalled(sto_db *db, sto_tablet *t, bool async) {
    int k = async ? 2 : 1;
    long long mem = atomic_load(&db->mem_bytes);
    return atomic_load(&t->n_imm_hint) > k * STO_IMM_STALL_MAX ||
           atomic_load(&t->n_small_hint) >= k * db->o.write_stall_tables ||
           (mem > 0 && (unsigned long long)mem > 2ull * (unsigned)k * db->o.memtable_budget_bytes);
}

/* db->mu held. Blocks while the tablet has too much unflushed or uncompacted data; fails only
 * when the background work that would end the stall is itself failing (full disk). */
static st_code wait_stall(sto_db *db, sto_tablet *t, bool async, st_err *err) {
    if (!stalled(db, t, async))
        return ST_OK;
    int64_t t0 = st_mono_us();
    st_code rc = ST_OK;
    pthread_cond_broadcast(&db->bg_cv);
    while (rc == ST_OK && stalled(db, t, async) && !t->dead) {
        if (db->stopping)
            rc = st_err_set(err, ST_UNAVAILABLE, "the storage engine is closing");
        else if (t->bg_code != ST_OK)
            rc = st_err_set(
                err, t->bg_code == ST_RESOURCE_EXHAUSTED ? ST_RESOURCE_EXHAUSTED : ST_UNAVAILABLE,
                "tablet %" PRIu64 " cannot take writes: background flush or "
                "compaction is failing (%s); free disk space",
                t->id, t->bg_msg);
        else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += WRITE_STALL_RECHECK_NS;
            if (ts.tv_nsec >= WRITE_NS_PER_S) {
                ts.tv_sec++;
                ts.tv_nsec -= WRITE_NS_PER_S;
            }
            pthread_cond_timedwait(&db->stall_cv, &db->mu, &ts);
        }
    }
    atomic_fetch_add(&db->stalls_us, (uint64_t)(st_mono_us() - t0));
    return rc;
}

/* ---- applying on the commit thread ---- */

bool sto_tablet_freeze_locked(sto_tablet *t) {
    if (sto_memtable_empty(t->active))
        return false;
    if (t->n_imm == t->cap_imm) {
        size_t ncap = t->cap_imm ? t->cap_imm * 2 : 4;
        sto_imm *p = realloc(t->imm, ncap * sizeof *p);
        if (!p)
            return false;
        t->imm = p;
        t->cap_imm = ncap;
    }
    sto_memtable *fresh;
    if (sto_memtable_new(&fresh) != ST_OK)
        return false;
    t->imm[t->n_imm++] = (sto_imm){t->active, t->last_applied_lsn, t->active_bytes};
    t->active = fresh;
    t->active_bytes = 0;
    t->active_first_lsn = 0;
    atomic_store(&t->n_imm_hint, (int)t->n_imm);
    return true;
}

/* t->mu held. Applies and accounts memory; freezes a full memtable. */
static st_code apply_locked(sto_db *db, sto_tablet *t, const sto_row_mut *row, uint64_t lsn,
                            bool *froze) {
    /* active_bytes is what this memtable added to db->mem_bytes so far (0 while empty, then its
     * whole arena), and what the flush of the frozen memtable subtracts again. */
    st_code rc = sto_memtable_apply(t->active, row, lsn);
    size_t after = sto_memtable_bytes(t->active);
    /* The arena grows in blocks: most writes leave it as it was and skip the shared counter. */
    if (after != t->active_bytes)
        atomic_fetch_add(&db->mem_bytes, (long long)after - (long long)t->active_bytes);
    t->active_bytes = after;
    if (t->active_first_lsn == 0)
        t->active_first_lsn = lsn;
    if (lsn > t->last_applied_lsn)
        t->last_applied_lsn = lsn;
    if (after >= db->o.memtable_bytes)
        *froze = sto_tablet_freeze_locked(t) || *froze;
    return rc;
}

static st_code apply_one(sto_db *db, sto_tablet *t, const sto_row_mut *row, uint64_t lsn,
                         bool *froze) {
    pthread_mutex_lock(&t->mu);
    st_code rc = apply_locked(db, t, row, lsn, froze);
    if (atomic_fetch_sub(&t->inflight, 1) == 1)
        pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (rc != ST_OK)
        sto_tablet_mark_read_only(t, rc,
                                  "out of memory applying a durable write; reopen the engine "
                                  "to replay it from the commit log");
    return rc;
}

static void inflight_drop(sto_tablet *t) {
    pthread_mutex_lock(&t->mu);
    if (atomic_fetch_sub(&t->inflight, 1) == 1)
        pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* What ctx_init set up, not c itself (a sync write's context lives on its caller's stack). */
static void ctx_deinit(write_ctx *c) {
    if (c->tabs != c->tabs_stack)
        free(c->tabs);
    if (c->async)
        st_arena_deinit(&c->arena);
}

/* A context from ctx_new. */
static void ctx_free(write_ctx *c) {
    ctx_deinit(c);
    free(c);
}

static void finish(write_ctx *c, st_code code, const st_err *err, uint64_t lsn) {
    if (c->async) {
        c->cb(code, lsn, code == ST_OK ? NULL : err, c->cb_arg);
        ctx_free(c);
        return;
    }
    c->code = code;
    c->lsn = lsn;
    if (code != ST_OK && err)
        c->err = *err;
    atomic_store_explicit(&c->released, true, memory_order_release); /* last touch of c */
}

static void commit_done(st_code code, uint64_t first_lsn, const st_err *err, void *arg) {
    write_ctx *c = arg;
    sto_db *db = c->db;
    if (code != ST_OK) {
        for (size_t i = 0; i < c->n; i++)
            inflight_drop(c->tabs[i]);
        finish(c, code, err, 0);
        return;
    }
    bool froze = false;
    st_code rc = ST_OK;
    for (size_t i = 0; i < c->n; i++) {
        st_code r = apply_one(db, c->tabs[i], &c->rows[i], first_lsn + i, &froze);
        if (r != ST_OK)
            rc = r;
    }
    uint64_t last = first_lsn + c->n - 1;
    uint64_t cur = atomic_load(&db->applied_lsn);
    while (cur < last && !atomic_compare_exchange_weak(&db->applied_lsn, &cur, last)) {
    }
    if (froze)
        sto_db_kick(db);
    st_err e;
    st_err_clear(&e);
    if (rc != ST_OK)
        st_err_set(&e, rc, "out of memory applying a durable write");
    finish(c, rc, &e, last);
}

/* ---- the calls ---- */

static int cmp_tablet_id(const void *a, const void *b) {
    uint64_t x = (*(sto_tablet *const *)a)->id, y = (*(sto_tablet *const *)b)->id;
    return x < y ? -1 : x > y;
}

/* Looks up every row's tablet, waits out stalls, and fills the sorted distinct list. */
static st_code prepare(sto_db *db, write_ctx *c, sto_tablet **uniq, size_t *n_uniq, st_err *err) {
    st_code rc = ST_OK;
    pthread_mutex_lock(&db->mu);
    for (size_t i = 0; i < c->n && rc == ST_OK; i++)
        rc = lookup_row(db, &c->rows[i], &c->tabs[i], err);
    size_t k = 0;
    if (rc == ST_OK) {
        memcpy(uniq, c->tabs, c->n * sizeof(sto_tablet *));
        qsort(uniq, c->n, sizeof(sto_tablet *), cmp_tablet_id);
        for (size_t i = 0; i < c->n; i++)
            if (k == 0 || uniq[k - 1] != uniq[i])
                uniq[k++] = uniq[i];
        for (size_t i = 0; i < k && rc == ST_OK; i++)
            rc = wait_stall(db, uniq[i], c->async, err);
    }
    pthread_mutex_unlock(&db->mu);
    *n_uniq = k;
    return rc;
}

/* Holds the gates of all tablets (id order) across the append, so a split or drop sees every
 * record it must wait for in the inflight counts. */
static st_code append(sto_db *db, write_ctx *c, sto_tablet **uniq, size_t n_uniq, st_err *err) {
    st_code rc = ST_OK;
    for (size_t i = 0; i < n_uniq; i++)
        pthread_rwlock_rdlock(&uniq[i]->gate);
    for (size_t i = 0; i < n_uniq && rc == ST_OK; i++)
        if (uniq[i]->dead)
            rc = st_err_set(err, ST_NOT_FOUND,
                            "tablet %" PRIu64 " was split or dropped; look up the row again",
                            uniq[i]->id);
    if (rc == ST_OK) {
        for (size_t i = 0; i < c->n; i++)
            atomic_fetch_add(&c->tabs[i]->inflight, 1);
        /* A sync write leads its group itself when no other is being written (no hand-off to
         * the commit thread and back); commit_done has run when it returns OK. */
        rc = c->async ? sto_log_append(db->log, c->rows, c->n, commit_done, c, err)
                      : sto_log_append_wait(db->log, c->rows, c->n, commit_done, c, err);
        if (rc != ST_OK)
            for (size_t i = 0; i < c->n; i++)
                inflight_drop(c->tabs[i]);
    }
    for (size_t i = 0; i < n_uniq; i++)
        pthread_rwlock_unlock(&uniq[i]->gate);
    return rc;
}

/* Validates the rows and sets up c (caller memory); on failure nothing needs freeing. */
static st_code ctx_init(write_ctx *c, sto_db *db, const sto_row_mut *rows, size_t n, st_err *err) {
    if (n == 0 || n > STO_WRITE_ROWS_MAX || !rows)
        return st_err_set(err, ST_INVALID_ARGUMENT, "a write needs 1..%d row mutations",
                          STO_WRITE_ROWS_MAX);
    for (size_t i = 0; i < n; i++) {
        st_code rc = sto_validate_mut(&rows[i], err);
        if (rc != ST_OK)
            return rc;
    }
    /* Field by field: zeroing the whole context (its error text, its stack of tablets) showed
     * in a write's cost. err is written only with a failure code. */
    c->db = db;
    c->rows = rows;
    c->n = n;
    c->code = ST_OK;
    c->err.code = ST_OK;
    c->err.msg[0] = '\0';
    c->lsn = 0;
    c->async = false;
    c->cb = NULL;
    c->cb_arg = NULL;
    memset(&c->arena, 0, sizeof c->arena);
    c->tabs = n <= WRITE_STACK_TABLETS ? c->tabs_stack : calloc(n, sizeof(sto_tablet *));
    if (!c->tabs)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory queuing a write");
    atomic_init(&c->released, false);
    return ST_OK;
}

/* A heap context, for writes that outlive their call (sto_write_async); ctx_free frees it. */
static st_code ctx_new(sto_db *db, const sto_row_mut *rows, size_t n, write_ctx **out,
                       st_err *err) {
    write_ctx *c = malloc(sizeof *c);
    if (!c)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory queuing a write");
    st_code rc = ctx_init(c, db, rows, n, err);
    if (rc != ST_OK) {
        free(c);
        return rc;
    }
    *out = c;
    return ST_OK;
}

/* Validates, stalls, appends. On success the commit thread owns c (finish frees async ones). */
static st_code submit(sto_db *db, write_ctx *c, st_err *err) {
    sto_tablet *stack[WRITE_STACK_TABLETS];
    sto_tablet **uniq = c->n <= WRITE_STACK_TABLETS ? stack : malloc(c->n * sizeof(sto_tablet *));
    if (!uniq)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory queuing a write");
    size_t n_uniq = 0;
    st_code rc = prepare(db, c, uniq, &n_uniq, err);
    if (rc == ST_OK)
        rc = append(db, c, uniq, n_uniq, err);
    if (uniq != stack)
        free(uniq);
    return rc;
}

st_code sto_write(sto_db *db, const sto_row_mut *rows, size_t n, uint64_t *lsn_out, st_err *err) {
    /* A sync write appends with sto_log_append_wait, which returns only after finish ran for
     * c (on this thread when it led the group, else on the group's writer, which wakes this one
     * only afterwards): no lock or wait on c is needed, and c can live on this stack. */
    write_ctx ctx, *c = &ctx;
    st_code rc = ctx_init(c, db, rows, n, err);
    if (rc != ST_OK)
        return rc;
    rc = submit(db, c, err);
    if (rc == ST_OK) {
        ST_ASSERT(atomic_load_explicit(&c->released, memory_order_acquire));
        rc = c->code;
        if (rc != ST_OK && err)
            *err = c->err;
        if (rc == ST_OK && lsn_out)
            *lsn_out = c->lsn;
    }
    ctx_deinit(c);
    return rc;
}

static st_slice arena_slice(st_arena *a, st_slice s, bool *ok) {
    if (!s.len)
        return st_slice_make("", 0);
    void *p = st_arena_dup(a, s.data, s.len);
    if (!p)
        *ok = false;
    return st_slice_make(p, s.len);
}

/* Deep copy: the caller's buffers may be gone before the commit thread applies the rows. */
static st_code copy_rows(write_ctx *c, const sto_row_mut *rows, size_t n, st_err *err) {
    st_arena_init(&c->arena, WRITE_ASYNC_ARENA_BLOCK_BYTES);
    c->async = true;
    bool ok = true;
    sto_row_mut *dst = st_arena_alloc(&c->arena, n * sizeof *dst);
    for (size_t i = 0; ok && dst && i < n; i++) {
        dst[i] = rows[i];
        dst[i].row = arena_slice(&c->arena, rows[i].row, &ok);
        sto_mut *m = rows[i].n_muts ? st_arena_alloc(&c->arena, rows[i].n_muts * sizeof *m) : NULL;
        if (rows[i].n_muts && !m)
            ok = false;
        for (size_t j = 0; ok && j < rows[i].n_muts; j++) {
            m[j] = rows[i].muts[j];
            m[j].family = arena_slice(&c->arena, m[j].family, &ok);
            m[j].qualifier = arena_slice(&c->arena, m[j].qualifier, &ok);
            m[j].value = arena_slice(&c->arena, m[j].value, &ok);
        }
        dst[i].muts = m;
    }
    if (!ok || !dst)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory copying a write");
    c->rows = dst;
    return ST_OK;
}

st_code sto_write_async(sto_db *db, const sto_row_mut *rows, size_t n, st_err *err,
                        sto_write_done_fn done, void *arg) {
    write_ctx *c = NULL;
    st_code rc = ctx_new(db, rows, n, &c, err);
    if (rc != ST_OK)
        return rc;
    rc = copy_rows(c, rows, n, err);
    c->cb = done;
    c->cb_arg = arg;
    if (rc == ST_OK)
        rc = submit(db, c, err);
    if (rc != ST_OK)
        ctx_free(c);
    return rc;
}

/* ---- recovery ---- */

st_code sto_replay_apply(sto_db *db, const sto_log_record *rec) {
    sto_tablet *t = sto_db_find_locked(db, rec->row.tablet_id);
    /* Records of dropped tablets, and of split parents (which were flushed up to their last
     * record before the split), are skipped. */
    if (!t || rec->lsn <= t->flushed_lsn)
        return ST_OK;
    bool froze = false;
    pthread_mutex_lock(&t->mu);
    st_code rc = apply_locked(db, t, &rec->row, rec->lsn, &froze);
    pthread_mutex_unlock(&t->mu);
    return rc;
}
