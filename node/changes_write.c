/* changes_write.c — the write side of change streams (docs/changestreams.md): the stamp of each
 * write, the record cell added to every row mutation of a table with streams on, the resolved
 * stamp, the ring of recent records and its watchers, and the GC records storage's compactions
 * ask for. Loop thread, except node_cs_write_lost and the GC report (storage threads). */
#include "changes.h"
#include "changes_msg.h"
#include "repl_glue.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The ring's bound: records of this many bytes stay in memory for live readers. One buffer,
 * mapped with its pages faulted in as soon as a table has streams on (ring_alloc), so keeping
 * records costs no allocation and no page fault per write. */
#define CS_RING_BYTES ((size_t)64 << 20)
/* A record in the ring: le32 lengths of its table name (with its NUL), row and value, le32 1 when
 * the value is a DataChange body (node_cs_rec.body); then the name, the row, the value. */
#define CS_REC_HEAD 16
/* After the last ReadChangeStream call of the node ends, the ring is filled on for this long: a
 * consumer that reconnects (a retry, a router pausing a slow client, new partitions after a
 * split) finds the writes made in between in memory, not by scanning its tablet again. */
#define CS_RING_GRACE_US (10LL * 60 * 1000000)

/* Writes kept for reuse on the loop: a node's writes mostly have one shape, so most take a kept
 * write (its arrays in a block of CS_POOL_WRITE_BYTES, its record buffer with the capacity the
 * last one needed) instead of allocating both and freeing both again at completion. */
#define CS_POOL_MAX 256
#define CS_POOL_WRITE_BYTES ((size_t)4096)
#define CS_POOL_DATA_BYTES ((size_t)16 << 10) /* larger record buffers are not kept */

/* One write's records: built by node_cs_write_prepare, kept by the ring once durable. */
struct node_cs_write {
    size_t alloc; /* bytes allocated for it and its arrays (CS_POOL_WRITE_BYTES: reusable) */
    int64_t stamp;
    bool ringless;     /* no stream was open when it was built: the ring skips it */
    bool queued;       /* in node_cs.fifo (loop thread) */
    int lost;          /* atomic: 1 its completion never reaches the loop, 2 popped from the fifo */
    size_t n;          /* records */
    size_t n_rows;     /* rows */
    node_cs_rec *recs; /* pointing into data once the write is built */
    st_buf data;       /* table names, row keys, qualifiers, record values */
    sto_row_mut *rows; /* what storage gets (allocated with w) */
    sto_mut *muts;
};

/* One durable write's records in the ring's buffer. */
typedef struct cs_block {
    int64_t stamp;
    size_t off, len;
} cs_block;

/* Rows of a table that arrived here (a move's copy) at a stamp. */
typedef struct cs_arrival {
    char *table;
    st_buf start, end;
    int64_t stamp;
} cs_arrival;

/* Cells a compaction dropped, on their way from a storage thread to the loop. */
typedef struct cs_gc_batch {
    struct cs_gc_batch *next, *prev; /* node_cs.gc_pending */
    node_ctx *n;
    uint64_t tablet_id;
    sto_gc_dropped *cells; /* slices point into data */
    size_t n_cells;
    uint8_t *data;
} cs_gc_batch;

typedef struct node_cs {
    int64_t start_stamp;  /* records at or below it may predate this process */
    int64_t resolved;     /* the last resolved stamp handed out */
    int64_t last_stamp;   /* the last stamp handed out (write_stamp, node_cs_next_stamp) */
    int64_t evicted_upto; /* the ring dropped every record at or below it */
    int64_t lost_stamp;   /* atomic: highest stamp whose completion never reached the loop */
    /* writes in flight with records, oldest first (a circular queue): their stamps give the
     * resolved stamp, their rows what a replicated delete finds (node_cs_inflight_each) */
    node_cs_write **fifo;
    size_t fifo_head, fifo_n, fifo_cap;
    /* the ring: durable writes' records in one circular buffer, and its blocks oldest first (a
     * circular queue) */
    uint8_t *ring;
    size_t ring_bytes; /* its size (CS_RING_BYTES) */
    size_t ring_tail;  /* where the next block goes */
    cs_block *blocks;
    size_t blk_head, blk_n, blk_cap;
    cs_arrival *arrivals;
    size_t n_arrivals;
    node_cs_watcher *watchers;
    size_t tables_on;      /* tables with streams on */
    size_t readers;        /* ReadChangeStream calls open */
    int64_t ring_until;    /* st_mono_us until which the ring is filled without a reader (0: a
                              reader was never seen) */
    size_t hint_t, hint_j; /* the last tablet found by id: n->tables[hint_t].v[hint_j] */
    st_buf scratch;        /* sto_mut: a record's mutations while encoding */
    st_buf kept;           /* sto_mut: the SetCells a record of a replicated delete restores */
    st_arena kept_arena;   /* their names and values */
    node_cs_write *pool[CS_POOL_MAX]; /* completed writes kept for reuse */
    size_t pool_n;
    /* GC batches posted to the loop and not yet run (freed at close if the loop never runs
     * them); the lock is taken by storage threads too. */
    pthread_mutex_t gc_lock;
    cs_gc_batch *gc_pending;
} node_cs;

/* ---- clock, config ---- */

/* source_cluster_id of records when the node knows no cluster names (docs/operations.md). */
#define CS_CLUSTER_ID_DEFAULT "strata"

const char *node_cs_cluster_id(node_ctx *n, uint32_t origin, char *buf, size_t cap) {
    const char *id = node_repl_cluster_id(n, origin);
    if (id)
        return id;
    if (origin == 0 || origin == n->opts.cluster_num)
        return n->opts.cluster_id && n->opts.cluster_id[0] ? n->opts.cluster_id
                                                           : CS_CLUSTER_ID_DEFAULT;
    snprintf(buf, cap, "cluster-%u", origin);
    return buf;
}

int64_t node_cs_next_stamp(node_ctx *n) {
    int64_t now = st_wall_us();
    n->hlc_last_us = now > n->hlc_last_us ? now : n->hlc_last_us + 1;
    if (n->cs)
        n->cs->last_stamp = n->hlc_last_us;
    return n->hlc_last_us;
}

/* A write's stamp orders it in this cluster's history and is the position its records leave a
 * reader at, which is also the low watermark the reader sends. Its rows got their commit times
 * (versions) just before, on this loop, and a stamp taken after them would pass them: a reader
 * at the stamp of a write of several rows, or at the resolved stamp below one in flight, sent a
 * watermark above commit times still to come. So the stamp is the earliest commit time of the
 * write's own rows when that is above every stamp and resolved stamp handed out, else (rows
 * replicated from another cluster, a drop's rows of a version taken at its call) the next
 * stamp. */
static int64_t write_stamp(node_ctx *n, const sto_row_mut *rows, size_t count,
                           node_table *const *metas) {
    node_cs *cs = n->cs;
    int64_t first = INT64_MAX;
    for (size_t i = 0; i < count; i++)
        if (metas[i] && !(rows[i].flags & STO_ROW_REPLICATED) &&
            (int64_t)rows[i].commit_ts_us < first)
            first = (int64_t)rows[i].commit_ts_us;
    int64_t floor = cs->last_stamp > cs->resolved ? cs->last_stamp : cs->resolved;
    if (first == INT64_MAX || first <= floor)
        return node_cs_next_stamp(n);
    cs->last_stamp = first;
    return first;
}

st_code node_cs_retention_from_pb(const Google__Bigtable__Admin__V2__ChangeStreamConfig *c,
                                  int64_t *retention_us, st_err *err) {
    *retention_us = 0;
    if (!c || !c->retention_period)
        return ST_OK;
    const Google__Protobuf__Duration *d = c->retention_period;
    if (d->seconds < 0 || d->nanos < 0 || d->seconds > NODE_CS_RETENTION_MAX_US / 1000000)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "change_stream_config.retention_period must be between 1 and 7 days");
    int64_t us = d->seconds * 1000000 + d->nanos / 1000;
    if (us < NODE_CS_RETENTION_MIN_US || us > NODE_CS_RETENTION_MAX_US)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "change_stream_config.retention_period must be between 1 and 7 days, "
                          "got %" PRId64 " s",
                          d->seconds);
    *retention_us = us;
    return ST_OK;
}

void node_cs_set_retention(node_ctx *n, node_table *meta, int64_t retention_us) {
    if (retention_us > 0 && meta->cs_retention_us == 0)
        meta->cs_since_us = node_cs_next_stamp(n);
    if (retention_us <= 0)
        meta->cs_since_us = 0;
    meta->cs_retention_us = retention_us > 0 ? retention_us : 0;
    node_cs_table_changed(n, meta->name);
}

Google__Bigtable__Admin__V2__ChangeStreamConfig *node_cs_config_to_pb(const node_table *meta,
                                                                      st_arena *a) {
    if (meta->cs_retention_us <= 0)
        return NULL;
    Google__Bigtable__Admin__V2__ChangeStreamConfig *c = st_arena_alloc(a, sizeof *c);
    Google__Protobuf__Duration *d = st_arena_alloc(a, sizeof *d);
    if (!c || !d)
        return NULL;
    google__bigtable__admin__v2__change_stream_config__init(c);
    google__protobuf__duration__init(d);
    d->seconds = meta->cs_retention_us / 1000000;
    d->nanos = (int32_t)(meta->cs_retention_us % 1000000) * 1000;
    c->retention_period = d;
    return c;
}

static void gc_report(uint64_t tablet_id, const sto_gc_dropped *cells, size_t n_cells, void *arg);

/* The ring's buffer, every page faulted in here (MAP_POPULATE) rather than by the first lap of
 * writes, which would pay about 1 µs per write in page faults on the loop until the ring was
 * full once. Called when a table turns streams on (node start, UpdateTable): one ~10 ms pass
 * over 64 MiB, not on any write's path. */
static st_code ring_alloc(node_cs *cs) {
    void *p = mmap(NULL, cs->ring_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return ST_RESOURCE_EXHAUSTED;
    cs->ring = p;
    return ST_OK;
}

static void ring_free(node_cs *cs) {
    if (cs->ring)
        munmap(cs->ring, cs->ring_bytes);
    cs->ring = NULL;
}

void node_cs_tables_changed(node_ctx *n) {
    if (!n->cs || n->closing)
        return;
    size_t on = 0;
    for (size_t i = 0; i < node_catalog_count(n->catalog); i++) {
        const node_table *meta = node_catalog_at(n->catalog, i);
        on += meta->cs_retention_us > 0;
        node_tablets *t = node_tablets_find(n, meta->name);
        for (size_t j = 0; t && j < t->n; j++)
            sto_tablet_set_gc_report(t->v[j].st, meta->cs_retention_us > 0 ? gc_report : NULL,
                                     meta->cs_retention_us > 0 ? n : NULL);
    }
    n->cs->tables_on = on;
    if (on && !n->cs->ring && ring_alloc(n->cs) != ST_OK)
        st_log(ST_LOG_WARN, "changes",
               "event=ring_alloc_failed bytes=%zu: no memory for the change ring now; it is "
               "tried again at the first record (free memory on the host if this repeats)",
               n->cs->ring_bytes);
}

void node_cs_tablet_added(node_ctx *n, const node_table *meta, sto_tablet *st) {
    if (!n->cs || n->closing)
        return;
    bool on = meta->cs_retention_us > 0;
    sto_tablet_set_gc_report(st, on ? gc_report : NULL, on ? n : NULL);
}

void node_cs_stop_reports(node_ctx *n) {
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++)
            sto_tablet_set_gc_report(n->tables[i].v[j].st, NULL, NULL);
}

/* ---- open, close ---- */

st_code node_cs_open(node_ctx *n, st_err *err) {
    node_cs *cs = calloc(1, sizeof *cs);
    if (!cs)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting change streams");
    st_buf_init(&cs->scratch);
    st_buf_init(&cs->kept);
    st_arena_init(&cs->kept_arena, 4096);
    pthread_mutex_init(&cs->gc_lock, NULL);
    n->cs = cs;
    cs->ring_bytes = CS_RING_BYTES;
    cs->start_stamp = node_cs_next_stamp(n);
    cs->resolved = cs->start_stamp;
    node_cs_tables_changed(n);
    return ST_OK;
}

/* Frees w outright (any thread). */
static void write_free(node_cs_write *w) {
    if (!w)
        return;
    st_buf_free(&w->data);
    free(w);
}

/* Done with w (loop thread): kept for the next write when it is of the reusable size. */
static void write_release(node_cs *cs, node_cs_write *w) {
    if (!w)
        return;
    if (w->alloc != CS_POOL_WRITE_BYTES || cs->pool_n == CS_POOL_MAX) {
        write_free(w);
        return;
    }
    if (w->data.cap > CS_POOL_DATA_BYTES)
        st_buf_free(&w->data);
    cs->pool[cs->pool_n++] = w;
}

void node_cs_close(node_ctx *n) {
    node_cs *cs = n->cs;
    if (!cs)
        return;
    ring_free(cs);
    free(cs->blocks);
    for (size_t i = 0; i < cs->fifo_n; i++) {
        node_cs_write *w = cs->fifo[(cs->fifo_head + i) % cs->fifo_cap];
        if (__atomic_load_n(&w->lost, __ATOMIC_ACQUIRE))
            write_free(w);
    }
    free(cs->fifo);
    for (size_t i = 0; i < cs->n_arrivals; i++) {
        free(cs->arrivals[i].table);
        st_buf_free(&cs->arrivals[i].start);
        st_buf_free(&cs->arrivals[i].end);
    }
    free(cs->arrivals);
    st_buf_free(&cs->scratch);
    st_buf_free(&cs->kept);
    st_arena_deinit(&cs->kept_arena);
    while (cs->pool_n)
        write_free(cs->pool[--cs->pool_n]);
    while (cs->gc_pending) {
        cs_gc_batch *b = cs->gc_pending;
        cs->gc_pending = b->next;
        free(b);
    }
    pthread_mutex_destroy(&cs->gc_lock);
    free(cs);
    n->cs = NULL;
}

/* ---- building a write's records ---- */

/* The table of the local tablet with this id (NULL when none). The last hit is tried first: a
 * write's rows mostly go to one tablet. */
static node_tablets *tablet_table(node_ctx *n, uint64_t id) {
    node_cs *cs = n->cs;
    if (cs->hint_t < n->n_tables) {
        node_tablets *t = &n->tables[cs->hint_t];
        if (cs->hint_j < t->n && t->v[cs->hint_j].id == id)
            return t;
    }
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++)
            if (n->tables[i].v[j].id == id) {
                cs->hint_t = i;
                cs->hint_j = j;
                return &n->tables[i];
            }
    return NULL;
}

static bool is_system(const sto_mut *m) {
    return m->type != STO_MUT_DEL_ROW && m->family.len > 0 && m->family.data[0] == 0;
}

/* A replicated row carries its origin's record cells: they are not this cluster's history. */
static bool has_foreign_records(const sto_row_mut *r) {
    if (!(r->flags & STO_ROW_REPLICATED))
        return false;
    for (size_t i = 0; i < r->n_muts; i++)
        if (is_system(&r->muts[i]))
            return true;
    return false;
}

/* The table meta of row r when it gets a record, else NULL. */
static node_table *row_meta(node_ctx *n, const sto_row_mut *r, node_write_kind mode) {
    if (mode == NODE_WRITE_COPY || (n->cs->tables_on == 0 && mode != NODE_WRITE_GC))
        return NULL;
    node_tablets *t = tablet_table(n, r->tablet_id);
    node_table *meta = t ? node_catalog_find(n->catalog, t->name) : NULL;
    return meta && meta->cs_retention_us > 0 ? meta : NULL;
}

/* Whether row r's DeleteFromRows can each become one DeleteFromFamily per family of the table
 * within a row mutation's bound (STO_ROW_MUTS_MAX). A write of that many mutations is valid
 * (the API's limit is the same), so its record must not refuse it: it then keeps them as
 * DeleteFromRow, which readers expand to the families the table has when they read it. */
static bool del_rows_expand(const node_table *meta, const sto_row_mut *r) {
    size_t total = 0;
    for (size_t i = 0; i < r->n_muts; i++)
        total += r->muts[i].type == STO_MUT_DEL_ROW ? meta->n_families : 1;
    return total <= STO_ROW_MUTS_MAX;
}

/* The mutations a record holds for row r: the user's (a DeleteFromRow as one DeleteFromFamily
 * per family of the table, del_rows_expand), into cs->scratch. */
static st_code record_muts(node_cs *cs, const node_table *meta, const sto_row_mut *r) {
    st_buf_reset(&cs->scratch);
    bool expand = del_rows_expand(meta, r);
    for (size_t i = 0; i < r->n_muts; i++) {
        const sto_mut *m = &r->muts[i];
        if (is_system(m))
            continue;
        if (m->type != STO_MUT_DEL_ROW || !expand) {
            if (st_buf_append(&cs->scratch, m, sizeof *m) != ST_OK)
                return ST_RESOURCE_EXHAUSTED;
            continue;
        }
        for (size_t f = 0; f < meta->n_families; f++) {
            sto_mut d = {.type = STO_MUT_DEL_FAMILY,
                         .family = st_slice_cstr(meta->families[f].name)};
            if (st_buf_append(&cs->scratch, &d, sizeof d) != ST_OK)
                return ST_RESOURCE_EXHAUSTED;
        }
    }
    return ST_OK;
}

/* Whether SetCell muts[i] leaves its cell as written: no later mutation of the same row
 * mutation overwrites it (same timestamp) or deletes it. */
static bool cell_kept(const sto_mut *muts, size_t n, size_t i) {
    const sto_mut *s = &muts[i];
    for (size_t j = i + 1; j < n; j++) {
        const sto_mut *m = &muts[j];
        if (m->type == STO_MUT_DEL_ROW) /* kept unexpanded (del_rows_expand) */
            return false;
        if (!st_slice_eq(m->family, s->family))
            continue;
        if (m->type == STO_MUT_DEL_FAMILY)
            return false;
        if (!st_slice_eq(m->qualifier, s->qualifier))
            continue;
        if (m->type == STO_MUT_SET_CELL && m->ts_us == s->ts_us)
            return false;
        if (m->type == STO_MUT_DEL_COLUMN && s->ts_us >= m->ts_start_us &&
            (m->ts_end_us == STO_TS_END_INF || s->ts_us < m->ts_end_us))
            return false;
    }
    return true;
}

/* A mutation of a large row mutation and its index, sorted by its names (values_to_refs_many). */
typedef struct mut_at {
    const sto_mut *m;
    size_t i;
} mut_at;

static int mut_at_cmp(const void *a, const void *b) {
    const mut_at *x = a, *y = b;
    int c = st_slice_cmp(x->m->family, y->m->family);
    if (c == 0)
        c = st_slice_cmp(x->m->qualifier, y->m->qualifier);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static int fam_at_cmp(const void *a, const void *b) {
    const mut_at *x = a, *y = b;
    int c = st_slice_cmp(x->m->family, y->m->family);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static bool mut_at_same_column(const mut_at *x, const mut_at *y) {
    return st_slice_eq(x->m->family, y->m->family) && st_slice_eq(x->m->qualifier, y->m->qualifier);
}

/* Whether a DeleteFromFamily of family comes after index i: fams sorted by family, then index. */
static bool family_deleted_after(const mut_at *fams, size_t n, st_slice family, size_t i) {
    size_t lo = 0, hi = n; /* the first entry past family */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (st_slice_cmp(fams[mid].m->family, family) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && st_slice_eq(fams[lo - 1].m->family, family) && fams[lo - 1].i > i;
}

/* values_to_refs for a row mutation of more than NODE_CS_REF_MUTS_MAX mutations, in n log n
 * (cell_kept for each SetCell would be quadratic): a SetCell is referenced when it is the only
 * mutation of its column and no DeleteFromFamily of its family or DeleteFromRow follows it.
 * Without references, such a row's record doubled its values, and a row of more than 128 MiB
 * of them passed the log record's bound with streams on only. */
static bool values_to_refs_many(sto_mut *muts, size_t n) {
    mut_at *v = malloc(n * sizeof *v);
    if (!v)
        return false; /* the values stay in the record */
    size_t n_cols = 0, n_fams = n, last_del_row = 0;
    bool del_row = false;
    for (size_t i = 0; i < n; i++) {
        if (muts[i].type == STO_MUT_DEL_ROW) {
            del_row = true;
            last_del_row = i;
        } else if (muts[i].type == STO_MUT_DEL_FAMILY) {
            v[--n_fams] = (mut_at){&muts[i], i};
        } else {
            v[n_cols++] = (mut_at){&muts[i], i};
        }
    }
    mut_at *fams = v + n_fams;
    n_fams = n - n_fams;
    qsort(v, n_cols, sizeof *v, mut_at_cmp);
    qsort(fams, n_fams, sizeof *fams, fam_at_cmp);
    bool any = false;
    for (size_t k = 0; k < n_cols; k++) {
        sto_mut *m = (sto_mut *)v[k].m;
        if (m->type != STO_MUT_SET_CELL || m->value.len < NODE_CS_REF_MIN_BYTES ||
            (k > 0 && mut_at_same_column(&v[k - 1], &v[k])) ||
            (k + 1 < n_cols && mut_at_same_column(&v[k], &v[k + 1])) ||
            (del_row && last_del_row > v[k].i) ||
            family_deleted_after(fams, n_fams, m->family, v[k].i))
            continue;
        m->value = st_slice_make(NULL, 0);
        any = true;
    }
    free(v);
    return any;
}

/* Empties the values the stored record keeps by reference (docs/changestreams.md, Values by
 * reference); whether there was any. */
static bool values_to_refs(sto_mut *muts, size_t n) {
    if (n > NODE_CS_REF_MUTS_MAX)
        return values_to_refs_many(muts, n);
    bool any = false;
    for (size_t i = 0; i < n; i++)
        if (muts[i].type == STO_MUT_SET_CELL && muts[i].value.len >= NODE_CS_REF_MIN_BYTES &&
            cell_kept(muts, n, i)) {
            muts[i].value = st_slice_make(NULL, 0);
            any = true;
        }
    return any;
}

/* Offsets of one record inside w->data while the buffer may still move: the table, the row,
 * the qualifier, the record as the ring keeps it (every value) and as storage keeps it (values
 * by reference; the same bytes when it has none). */
typedef struct rec_ref {
    size_t table, row, row_len, qual, value, value_len, stored, stored_len;
    st_slice origin; /* the stored record when it is the origin's (origin_record), else empty */
    bool body;       /* the ring's is the record's DataChange but for its end (node_cs_rec.body) */
    size_t mut;      /* index of the record's SetCell in w->muts */
} rec_ref;

static st_code append_cstr(st_buf *b, const char *s, size_t *off) {
    *off = b->len;
    return st_buf_append(b, s, strlen(s) + 1);
}

/* The record as the ring keeps it, appended to w->data: the part of its DataChange message that
 * every reader sends alike when it is one message (readers then only add their token and
 * watermark: no decoding, no encoding per reader and record), else its sto_row_mut encoding. */
static st_code ring_encode(node_ctx *n, node_cs_write *w, const sto_row_mut *rec, bool *body) {
    char buf[32];
    node_cs_change c = {.row = rec,
                        .gc = (rec->flags & STO_ROW_GC) != 0,
                        .source_cluster_id = node_cs_cluster_id(n, rec->origin, buf, sizeof buf)};
    st_code rc = node_cs_encode_body(&c, NODE_CS_MSG_VALUE_BYTES, &w->data);
    *body = rc == ST_OK;
    return rc == ST_NOT_FOUND ? sto_row_mut_encode(&w->data, rec) : rc;
}

/* The record cell a replicated row of user mutations came with: the origin cluster's record of
 * the same row mutation, which is what this cluster's own record would hold (the same mutations,
 * version, commit time and origin; values by reference alike), so it is stored again under this
 * cluster's stamp rather than built anew. Empty when there is not exactly one. */
static st_slice origin_record(const sto_row_mut *r) {
    st_slice found = st_slice_make(NULL, 0);
    if (!(r->flags & STO_ROW_REPLICATED))
        return found;
    size_t n_sys = 0, n_user = 0;
    for (size_t i = 0; i < r->n_muts; i++) {
        const sto_mut *m = &r->muts[i];
        if (!is_system(m)) {
            n_user++;
        } else if (++n_sys == 1 && m->type == STO_MUT_SET_CELL && m->value.len > 0 &&
                   st_slice_eq(m->family, st_slice_make(NODE_CS_FAMILY, NODE_CS_FAMILY_LEN)) &&
                   m->qualifier.len == NODE_CS_QUALIFIER_LEN) {
            found = m->value;
        }
    }
    return n_sys == 1 && n_user > 0 ? found : st_slice_make(NULL, 0);
}

static void kept_drop(node_cs *cs, const char *why) {
    st_log(ST_LOG_WARN, "changes",
           "the record of a replicated delete holds only its own mutations (%s): a consumer "
           "applying the stream may delete newer cells of its row that the table keeps",
           why);
    st_buf_reset(&cs->kept);
}

/* Into cs->kept: the SetCells restoring the cells of a higher version that replicated row
 * rows[k] reaches and leaves in place (changes_survive.c), so that its record, applied after the
 * records of the writes that made them, has the row mutation's effect. Without them (a row that
 * could not be read) the record holds the row mutation's own mutations, as a local one. */
static st_code kept_cells(node_ctx *n, const sto_row_mut *rows, uint32_t k, node_write_kind mode,
                          st_err *err) {
    node_cs *cs = n->cs;
    if (cs->kept.cap > CS_POOL_DATA_BYTES) /* a row of many cells: not kept for the next */
        st_buf_free(&cs->kept);
    st_buf_reset(&cs->kept);
    st_arena_reset(&cs->kept_arena);
    if (mode != NODE_WRITE_RECORD || !node_cs_row_deletes(&rows[k]))
        return ST_OK;
    st_err e = {0};
    st_code rc = node_cs_survivors(n, rows, k, &cs->kept_arena, &cs->kept, &e);
    if (rc == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, rc, "%s; retry", e.msg);
    if (rc != ST_OK)
        kept_drop(cs, e.msg);
    return ST_OK;
}

/* Encodes the record of row rows[k] (index k of the write) into w->data. */
static st_code record_build(node_ctx *n, node_cs_write *w, const node_table *meta,
                            const sto_row_mut *rows, node_write_kind mode, uint32_t k, rec_ref *ref,
                            st_err *err) {
    node_cs *cs = n->cs;
    const sto_row_mut *r = &rows[k];
    st_code rc = kept_cells(n, rows, k, mode, err);
    if (rc != ST_OK)
        return rc;
    bool kept = cs->kept.len > 0;
    ref->origin = w->ringless && mode == NODE_WRITE_RECORD && !kept ? origin_record(r)
                                                                    : st_slice_make(NULL, 0);
    if (mode != NODE_WRITE_GC && !ref->origin.len)
        rc = record_muts(cs, meta, r);
    if (kept && (cs->scratch.len + cs->kept.len) / sizeof(sto_mut) > STO_ROW_MUTS_MAX)
        kept_drop(cs, "too many cells to put back for one row mutation");
    if (rc == ST_OK && cs->kept.len) /* after the row's own: they undo what it did not do */
        rc = st_buf_append(&cs->scratch, cs->kept.data, cs->kept.len);
    sto_row_mut rec = {.row = r->row,
                       .version = r->version,
                       .commit_ts_us = r->commit_ts_us,
                       .origin = r->origin,
                       .flags = r->flags & STO_ROW_GC};
    if (mode == NODE_WRITE_GC) {
        rec.muts = r->muts;
        rec.n_muts = r->n_muts;
        rec.flags = STO_ROW_GC;
    } else {
        rec.muts = (const sto_mut *)cs->scratch.data;
        rec.n_muts = cs->scratch.len / sizeof(sto_mut);
    }
    uint8_t qual[NODE_CS_QUALIFIER_LEN];
    st_put_be64(qual, (uint64_t)w->stamp);
    qual[8] = (uint8_t)(k >> 24);
    qual[9] = (uint8_t)(k >> 16);
    qual[10] = (uint8_t)(k >> 8);
    qual[11] = (uint8_t)k;
    if (rc == ST_OK)
        rc = append_cstr(&w->data, meta->name, &ref->table);
    ref->row = w->data.len;
    ref->row_len = r->row.len;
    if (rc == ST_OK)
        rc = st_buf_append(&w->data, r->row.data, r->row.len);
    ref->qual = w->data.len;
    if (rc == ST_OK)
        rc = st_buf_append(&w->data, qual, sizeof qual);
    /* the ring's encoding (every value), unless no stream is open */
    ref->value = w->data.len;
    ref->body = false;
    if (rc == ST_OK && !w->ringless)
        rc = ring_encode(n, w, &rec, &ref->body);
    ref->value_len = w->data.len - ref->value;
    if (ref->origin.len)
        return rc == ST_OK ? ST_OK
                           : st_err_set(err, ST_RESOURCE_EXHAUSTED,
                                        "out of memory building a change record");
    /* storage's (values by reference), when it differs */
    bool refs = rc == ST_OK && mode != NODE_WRITE_GC &&
                values_to_refs((sto_mut *)cs->scratch.data, rec.n_muts);
    if (refs)
        rec.flags |= NODE_CS_REC_REFS;
    ref->stored = ref->value;
    ref->stored_len = ref->value_len;
    if (rc == ST_OK && (refs || w->ringless || ref->body)) {
        ref->stored = w->data.len;
        rc = sto_row_mut_encode(&w->data, &rec);
        ref->stored_len = w->data.len - ref->stored;
    }
    if (rc == ST_INVALID_ARGUMENT)
        return st_err_set(err, rc,
                          "row mutation too large for its change record (more than %u "
                          "mutations)",
                          STO_ROW_MUTS_MAX);
    if (rc != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory building a change record");
    return ST_OK;
}

/* Copies row r into w->rows[i] with its mutations (without foreign records) and, when it gets a
 * record, room for the record's SetCell (ref->mut) in front of them: the record cell's key (the
 * system family) sorts before the row's user cells and after the previous row's, so rows written
 * in key order reach the memtable in key order and take its append path for both cells. */
static void row_copy(node_cs_write *w, size_t i, const sto_row_mut *r, bool recorded,
                     node_write_kind mode, size_t *mi, rec_ref *ref) {
    sto_row_mut *out = &w->rows[i];
    *out = *r;
    out->muts = &w->muts[*mi];
    out->n_muts = 0;
    if (recorded) {
        ref->mut = (*mi)++;
        out->n_muts++;
    }
    /* A replicated row of record cells only stays as it came (storage refuses an empty row). */
    size_t user = 0;
    for (size_t j = 0; j < r->n_muts; j++)
        user += !is_system(&r->muts[j]);
    bool strip = (r->flags & STO_ROW_REPLICATED) && (user > 0 || recorded);
    for (size_t j = 0; mode != NODE_WRITE_GC && j < r->n_muts; j++)
        if (!strip || !is_system(&r->muts[j])) {
            w->muts[(*mi)++] = r->muts[j];
            out->n_muts++;
        }
}

/* Points records and record cells into w->data (final now). */
static void write_finalize(node_cs_write *w, const rec_ref *refs) {
    for (size_t k = 0; k < w->n; k++) {
        const rec_ref *f = &refs[k];
        node_cs_rec *rec = &w->recs[k];
        rec->stamp_us = w->stamp;
        rec->table = (const char *)w->data.data + f->table;
        rec->row = st_slice_make(w->data.data + f->row, f->row_len);
        rec->value = st_slice_make(w->data.data + f->value, f->value_len);
        rec->body = f->body;
        st_slice stored =
            f->origin.len ? f->origin : st_slice_make(w->data.data + f->stored, f->stored_len);
        w->muts[f->mut] =
            (sto_mut){.type = STO_MUT_SET_CELL,
                      .family = st_slice_make(NODE_CS_FAMILY, NODE_CS_FAMILY_LEN),
                      .qualifier = st_slice_make(w->data.data + f->qual, NODE_CS_QUALIFIER_LEN),
                      .ts_us = w->stamp,
                      .value = stored};
    }
}

/* Mutations w needs room for: the rows' own and one record cell each. */
static size_t write_muts(const sto_row_mut *rows, size_t count, node_write_kind mode) {
    size_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += (mode == NODE_WRITE_GC ? 0 : rows[i].n_muts) + 1;
    return total;
}

/* A write and its arrays in one block (all of them pointer-aligned): a kept one when they fit
 * in CS_POOL_WRITE_BYTES. Every array element is written before it is read (write_build). */
static node_cs_write *write_new(node_cs *cs, size_t count, size_t n_muts, size_t n_recs) {
    size_t size = sizeof(node_cs_write) + count * sizeof(sto_row_mut) + n_muts * sizeof(sto_mut) +
                  n_recs * (sizeof(node_cs_rec) + sizeof(rec_ref));
    node_cs_write *w;
    if (size <= CS_POOL_WRITE_BYTES && cs->pool_n) {
        w = cs->pool[--cs->pool_n];
        st_buf_reset(&w->data);
    } else {
        size_t alloc = size <= CS_POOL_WRITE_BYTES ? CS_POOL_WRITE_BYTES : size;
        w = malloc(alloc);
        if (!w)
            return NULL;
        w->alloc = alloc;
        st_buf_init(&w->data);
    }
    w->stamp = 0;
    w->ringless = false;
    w->queued = false;
    w->lost = 0;
    w->n_rows = count;
    w->rows = (sto_row_mut *)(w + 1);
    w->muts = (sto_mut *)(w->rows + count);
    w->recs = (node_cs_rec *)(w->muts + n_muts);
    w->n = n_recs;
    return w;
}

static st_code write_build(node_ctx *n, node_cs_write *w, const sto_row_mut *rows, size_t count,
                           node_table **metas, node_write_kind mode, st_err *err) {
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++) {
        if (!metas[i])
            continue;
        /* room for the record twice (each encoding is about the size of the row's mutations;
         * the stored one without the values it references), so the buffer is allocated once */
        bytes += strlen(metas[i]->name) + 3 * rows[i].row.len + NODE_CS_QUALIFIER_LEN + 128;
        for (size_t j = 0; j < rows[i].n_muts; j++)
            bytes += 2 * (rows[i].muts[j].family.len + rows[i].muts[j].qualifier.len + 32) +
                     rows[i].muts[j].value.len;
    }
    if (st_buf_reserve(&w->data, bytes) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory building change records");
    rec_ref *refs = (rec_ref *)(w->recs + w->n);
    st_code rc = ST_OK;
    size_t mi = 0, k = 0;
    for (size_t i = 0; rc == ST_OK && i < count; i++) {
        row_copy(w, i, &rows[i], metas[i] != NULL, mode, &mi, &refs[k]);
        if (metas[i]) {
            rc = record_build(n, w, metas[i], rows, mode, (uint32_t)i, &refs[k], err);
            k++;
        }
    }
    if (rc == ST_OK)
        write_finalize(w, refs);
    return rc;
}

st_code node_cs_write_prepare(node_ctx *n, const sto_row_mut *rows, size_t count,
                              node_write_kind mode, const sto_row_mut **out, node_cs_write **wp,
                              st_err *err) {
    *out = rows;
    *wp = NULL;
    if (!n->cs || mode == NODE_WRITE_COPY)
        return ST_OK;
    node_table *meta_one[16];
    node_table **metas = count <= 16 ? meta_one : calloc(count, sizeof *metas);
    if (!metas)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory preparing a write");
    size_t recorded = 0;
    bool strip = false;
    for (size_t i = 0; i < count; i++) {
        metas[i] = row_meta(n, &rows[i], mode);
        recorded += metas[i] != NULL;
        strip = strip || has_foreign_records(&rows[i]);
    }
    st_code rc = ST_OK;
    if (recorded || strip) {
        node_cs_write *w = write_new(n->cs, count, write_muts(rows, count, mode), recorded);
        if (!w) {
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory preparing a write");
        } else {
            w->stamp = recorded ? write_stamp(n, rows, count, metas) : 0;
            w->ringless = n->cs->readers == 0 && st_mono_us() >= n->cs->ring_until;
            rc = write_build(n, w, rows, count, metas, mode, err);
            if (rc != ST_OK) {
                write_release(n->cs, w);
            } else {
                *out = w->rows;
                *wp = w;
            }
        }
    }
    if (metas != meta_one)
        free(metas);
    return rc;
}

/* ---- in flight, resolved ---- */

static st_code fifo_push(node_cs *cs, node_cs_write *w) {
    if (cs->fifo_n == cs->fifo_cap) {
        size_t cap = cs->fifo_cap ? cs->fifo_cap * 2 : 64;
        node_cs_write **v = malloc(cap * sizeof *v);
        if (!v)
            return ST_RESOURCE_EXHAUSTED;
        for (size_t i = 0; i < cs->fifo_n; i++)
            v[i] = cs->fifo[(cs->fifo_head + i) % cs->fifo_cap];
        free(cs->fifo);
        cs->fifo = v;
        cs->fifo_head = 0;
        cs->fifo_cap = cap;
    }
    cs->fifo[(cs->fifo_head + cs->fifo_n++) % cs->fifo_cap] = w;
    w->queued = true;
    return ST_OK;
}

/* Storage completes writes in order: a completion at `stamp` finishes every earlier one too
 * (even one whose completion was lost, which only the fifo still holds: freed here). */
static void fifo_pop_upto(node_cs *cs, int64_t stamp) {
    while (cs->fifo_n && cs->fifo[cs->fifo_head]->stamp <= stamp) {
        node_cs_write *w = cs->fifo[cs->fifo_head];
        cs->fifo_head = (cs->fifo_head + 1) % cs->fifo_cap;
        cs->fifo_n--;
        w->queued = false;
        /* 2: popped. Whichever of this and node_cs_write_lost comes second frees it. */
        if (__atomic_exchange_n(&w->lost, 2, __ATOMIC_ACQ_REL) == 1)
            write_free(w);
    }
}

int64_t node_cs_resolved(node_ctx *n) {
    node_cs *cs = n->cs;
    fifo_pop_upto(cs, __atomic_load_n(&cs->lost_stamp, __ATOMIC_ACQUIRE));
    int64_t r;
    if (cs->fifo_n) {
        r = cs->fifo[cs->fifo_head]->stamp - 1;
    } else {
        /* Nothing in flight: now. The clock is moved to it, so later stamps are above. */
        int64_t now = st_wall_us();
        if (now > n->hlc_last_us)
            n->hlc_last_us = now;
        r = n->hlc_last_us;
    }
    if (r > cs->resolved)
        cs->resolved = r;
    return cs->resolved;
}

void node_cs_write_started(node_ctx *n, node_cs_write *w) {
    if (!w || w->n == 0)
        return;
    if (fifo_push(n->cs, w) != ST_OK) {
        /* Without its place in the queue the stamp could be passed while in flight: resolved
         * stays below it until it is done by treating it as lost once it completes. */
        st_log(ST_LOG_ERROR, "changes", "out of memory tracking a write in flight");
        int64_t cur = __atomic_load_n(&n->cs->lost_stamp, __ATOMIC_ACQUIRE);
        if (w->stamp > cur)
            __atomic_store_n(&n->cs->lost_stamp, w->stamp, __ATOMIC_RELEASE);
    }
}

void node_cs_write_abort(node_ctx *n, node_cs_write *w) {
    node_cs *cs = n->cs;
    /* It was the last one started. */
    if (w && w->queued) {
        cs->fifo_n--;
        w->queued = false;
    }
    write_release(cs, w);
}

void node_cs_write_lost(node_ctx *n, node_cs_write *w) {
    if (!w)
        return;
    /* The loop may be reading a queued write's rows (node_cs_inflight_each): it frees it once
     * it pops it. queued is read here after the loop set it before storage got the write. */
    bool queued = w->queued, recorded = w->n > 0;
    int64_t stamp = w->stamp;
    /* Not queued, or queued and already popped (lost 2): nobody else frees it. */
    bool mine = !queued || __atomic_exchange_n(&w->lost, 1, __ATOMIC_ACQ_REL) == 2;
    if (recorded) {
        int64_t cur = __atomic_load_n(&n->cs->lost_stamp, __ATOMIC_ACQUIRE);
        while (stamp > cur && !__atomic_compare_exchange_n(&n->cs->lost_stamp, &cur, stamp, false,
                                                           __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
    }
    if (mine)
        write_free(w);
}

st_code node_cs_inflight_each(node_ctx *n,
                              st_code (*fn)(const sto_row_mut *rows, size_t count, void *arg),
                              void *arg) {
    node_cs *cs = n->cs;
    fifo_pop_upto(cs, __atomic_load_n(&cs->lost_stamp, __ATOMIC_ACQUIRE));
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < cs->fifo_n; i++) {
        const node_cs_write *w = cs->fifo[(cs->fifo_head + i) % cs->fifo_cap];
        if (!__atomic_load_n(&w->lost, __ATOMIC_ACQUIRE))
            rc = fn(w->rows, w->n_rows, arg);
    }
    return rc;
}

/* ---- the ring ---- */

void node_cs_set_ring_bytes(node_ctx *n, size_t bytes) {
    node_cs *cs = n->cs;
    if (cs->blk_n || cs->ring_tail)
        return; /* in use already */
    bool mapped = cs->ring != NULL;
    ring_free(cs);
    cs->ring_bytes = bytes;
    if (mapped)
        (void)ring_alloc(cs); /* else at the first record */
}

bool node_cs_ring_mapped(const node_ctx *n) {
    return n->cs && n->cs->ring;
}

static const cs_block *block_at(node_cs *cs, size_t i) {
    return &cs->blocks[(cs->blk_head + i) % cs->blk_cap];
}

static void ring_evict_oldest(node_cs *cs) {
    const cs_block *b = block_at(cs, 0);
    if (b->stamp > cs->evicted_upto)
        cs->evicted_upto = b->stamp;
    cs->blk_head = (cs->blk_head + 1) % cs->blk_cap;
    cs->blk_n--;
}

/* Room for need bytes at the ring's tail (wrapping to the start when the end is too short),
 * evicting the oldest blocks in the way; their offset. */
static size_t ring_place(node_cs *cs, size_t need) {
    if (cs->ring_tail + need > cs->ring_bytes) {
        /* the blocks of the previous lap past the tail are the oldest: they go first */
        while (cs->blk_n && block_at(cs, 0)->off >= cs->ring_tail)
            ring_evict_oldest(cs);
        cs->ring_tail = 0;
    }
    while (cs->blk_n && block_at(cs, 0)->off >= cs->ring_tail &&
           block_at(cs, 0)->off < cs->ring_tail + need)
        ring_evict_oldest(cs);
    size_t off = cs->ring_tail;
    cs->ring_tail += need;
    return off;
}

static st_code blocks_grow(node_cs *cs) {
    size_t cap = cs->blk_cap ? cs->blk_cap * 2 : 4096;
    cs_block *v = malloc(cap * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < cs->blk_n; i++)
        v[i] = *block_at(cs, i);
    free(cs->blocks);
    cs->blocks = v;
    cs->blk_head = 0;
    cs->blk_cap = cap;
    return ST_OK;
}

/* Copies w's records into the ring. */
static st_code ring_push(node_cs *cs, const node_cs_write *w) {
    if (w->ringless) { /* a reader reaching back to it reads storage */
        if (w->stamp > cs->evicted_upto)
            cs->evicted_upto = w->stamp;
        return ST_OK;
    }
    size_t need = 0;
    for (size_t k = 0; k < w->n; k++)
        need +=
            CS_REC_HEAD + strlen(w->recs[k].table) + 1 + w->recs[k].row.len + w->recs[k].value.len;
    if (need > cs->ring_bytes) { /* never kept: readers of its stamp go to storage */
        while (cs->blk_n)
            ring_evict_oldest(cs);
        if (w->stamp > cs->evicted_upto)
            cs->evicted_upto = w->stamp;
        return ST_OK;
    }
    if (!cs->ring && ring_alloc(cs) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (cs->blk_n == cs->blk_cap && blocks_grow(cs) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    size_t off = ring_place(cs, need);
    uint8_t *p = cs->ring + off;
    for (size_t k = 0; k < w->n; k++) {
        const node_cs_rec *r = &w->recs[k];
        size_t tlen = strlen(r->table) + 1;
        st_put_fixed32(p, (uint32_t)tlen);
        st_put_fixed32(p + 4, (uint32_t)r->row.len);
        st_put_fixed32(p + 8, (uint32_t)r->value.len);
        st_put_fixed32(p + 12, r->body);
        p += CS_REC_HEAD;
        memcpy(p, r->table, tlen);
        p += tlen;
        memcpy(p, r->row.data, r->row.len);
        p += r->row.len;
        memcpy(p, r->value.data, r->value.len);
        p += r->value.len;
    }
    cs->blocks[(cs->blk_head + cs->blk_n++) % cs->blk_cap] =
        (cs_block){.stamp = w->stamp, .off = off, .len = need};
    return ST_OK;
}

static bool write_has_table(const node_cs_write *w, const char *table) {
    for (size_t k = 0; k < w->n; k++)
        if (strcmp(w->recs[k].table, table) == 0)
            return true;
    return false;
}

static void wake_watchers(node_cs *cs, const node_cs_write *w) {
    for (node_cs_watcher *x = cs->watchers, *next; x; x = next) {
        next = x->next; /* x may unwatch itself */
        if (write_has_table(w, x->table))
            x->fn(x);
    }
}

void node_cs_table_changed(node_ctx *n, const char *table) {
    node_cs *cs = n->cs;
    if (!cs)
        return;
    for (node_cs_watcher *x = cs->watchers, *next; x; x = next) {
        next = x->next;
        if (strcmp(x->table, table) == 0)
            x->fn(x);
    }
}

void node_cs_write_done(node_ctx *n, node_cs_write *w, st_code code) {
    if (!w)
        return;
    node_cs *cs = n->cs;
    if (w->n == 0 || code != ST_OK) {
        if (w->n)
            fifo_pop_upto(cs, w->stamp);
        write_release(cs, w);
        return;
    }
    fifo_pop_upto(cs, w->stamp);
    if (ring_push(cs, w) != ST_OK) {
        st_log(ST_LOG_ERROR, "changes", "out of memory keeping recent change records");
        if (w->stamp > cs->evicted_upto)
            cs->evicted_upto = w->stamp;
    }
    if (cs->watchers)
        wake_watchers(cs, w);
    write_release(cs, w);
}

void node_cs_range_arrived(node_ctx *n, const char *table, st_slice start, st_slice end) {
    node_cs *cs = n->cs;
    if (!cs)
        return;
    int64_t stamp = node_cs_next_stamp(n);
    for (size_t i = 0; i < cs->n_arrivals; i++) {
        cs_arrival *a = &cs->arrivals[i];
        if (strcmp(a->table, table) == 0 && st_slice_eq(st_buf_slice(&a->start), start) &&
            st_slice_eq(st_buf_slice(&a->end), end)) {
            a->stamp = stamp;
            return;
        }
    }
    cs_arrival *v = realloc(cs->arrivals, (cs->n_arrivals + 1) * sizeof *v);
    char *name = strdup(table);
    if (!v || !name) {
        free(name);
        if (v)
            cs->arrivals = v;
        st_log(ST_LOG_ERROR, "changes", "out of memory noting a tablet's arrival");
        cs->evicted_upto = stamp; /* the ring then sends every reader to storage */
        return;
    }
    cs->arrivals = v;
    cs_arrival *a = &v[cs->n_arrivals++];
    a->table = name;
    a->stamp = stamp;
    st_buf_init(&a->start);
    st_buf_init(&a->end);
    if (st_buf_append(&a->start, start.data, start.len) != ST_OK ||
        st_buf_append(&a->end, end.data, end.len) != ST_OK)
        cs->evicted_upto = stamp;
}

static bool range_overlaps(st_slice s1, st_slice e1, st_slice s2, st_slice e2) {
    return (e1.len == 0 || st_slice_cmp(s2, e1) < 0) && (e2.len == 0 || st_slice_cmp(s1, e2) < 0);
}

static bool in_range(st_slice row, st_slice start, st_slice end) {
    return st_slice_cmp(row, start) >= 0 && (end.len == 0 || st_slice_cmp(row, end) < 0);
}

/* The stamp below which the ring may lack records of table's rows in [start, end). */
static int64_t ring_floor(node_cs *cs, const char *table, st_slice start, st_slice end) {
    int64_t floor = cs->start_stamp;
    if (cs->evicted_upto > floor)
        floor = cs->evicted_upto;
    int64_t lost = __atomic_load_n(&cs->lost_stamp, __ATOMIC_ACQUIRE);
    if (lost > floor)
        floor = lost;
    for (size_t i = 0; i < cs->n_arrivals; i++) {
        const cs_arrival *a = &cs->arrivals[i];
        if (a->stamp > floor && strcmp(a->table, table) == 0 &&
            range_overlaps(st_buf_slice(&a->start), st_buf_slice(&a->end), start, end))
            floor = a->stamp;
    }
    return floor;
}

/* Index of the first ring block with stamp > after. */
static size_t ring_find(node_cs *cs, int64_t after) {
    size_t lo = 0, hi = cs->blk_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (block_at(cs, mid)->stamp <= after)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

node_cs_ring_rc node_cs_ring_scan(node_ctx *n, const char *table, st_slice start, st_slice end,
                                  int64_t after, int64_t upto,
                                  bool (*fn)(const node_cs_rec *rec, void *arg), void *arg) {
    node_cs *cs = n->cs;
    if (after < ring_floor(cs, table, start, end))
        return NODE_CS_RING_MISS;
    for (size_t i = ring_find(cs, after); i < cs->blk_n; i++) {
        const cs_block *b = block_at(cs, i);
        if (b->stamp > upto)
            break;
        const uint8_t *p = cs->ring + b->off, *end_p = p + b->len;
        while (p < end_p) {
            uint32_t tlen = st_get_fixed32(p), rlen = st_get_fixed32(p + 4),
                     vlen = st_get_fixed32(p + 8);
            node_cs_rec r = {.stamp_us = b->stamp, .table = (const char *)p + CS_REC_HEAD};
            r.row = st_slice_make(p + CS_REC_HEAD + tlen, rlen);
            r.value = st_slice_make(p + CS_REC_HEAD + tlen + rlen, vlen);
            r.body = st_get_fixed32(p + 12) != 0;
            p += CS_REC_HEAD + tlen + rlen + vlen;
            if (strcmp(r.table, table) != 0 || !in_range(r.row, start, end))
                continue;
            if (!fn(&r, arg))
                return NODE_CS_RING_STOP;
        }
    }
    return NODE_CS_RING_OK;
}

/* ---- watchers ---- */

void node_cs_readers_add(node_ctx *n, int delta) {
    if (!n->cs)
        return;
    if (delta > 0)
        n->cs->readers++;
    else if (n->cs->readers > 0 && --n->cs->readers == 0)
        n->cs->ring_until = st_mono_us() + CS_RING_GRACE_US;
}

void node_cs_watch(node_ctx *n, node_cs_watcher *w) {
    node_cs *cs = n->cs;
    w->prev = NULL;
    w->next = cs->watchers;
    if (cs->watchers)
        cs->watchers->prev = w;
    cs->watchers = w;
}

void node_cs_unwatch(node_ctx *n, node_cs_watcher *w) {
    node_cs *cs = n->cs;
    if (!cs)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else if (cs->watchers == w)
        cs->watchers = w->next;
    else
        return; /* not watching */
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

/* ---- GC records ----
 * A compaction's dropped cells come from a storage thread; on the loop each row gets one
 * record (type garbage collection: a DeleteFromColumn [ts, ts + 1) per cell) written as a row
 * mutation holding only the record cell. */

static void gc_batch_unlink(node_cs *cs, cs_gc_batch *b) {
    pthread_mutex_lock(&cs->gc_lock);
    if (b->prev)
        b->prev->next = b->next;
    else
        cs->gc_pending = b->next;
    if (b->next)
        b->next->prev = b->prev;
    pthread_mutex_unlock(&cs->gc_lock);
}

/* The time range of a GC record's DeleteFromColumn: [ts, ts + 1 ms). Cells have millisecond
 * timestamps, so it deletes that one cell, as [ts, ts + 1) did, and unlike that range it is a
 * mutation Bigtable accepts (ranges are in milliseconds too): a consumer that copies the stream
 * into another table can apply GC records as they come. */
#define CS_GC_RANGE_US 1000

static void gc_written(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)n;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "changes", "writing garbage collection records failed: %s",
               msg ? msg : st_code_name(code));
    free(arg);
}

/* The rows of b's cells as GC row mutations (one per row; cells come in key order). */
static size_t gc_rows(node_ctx *n, cs_gc_batch *b, sto_row_mut *rows, sto_mut *muts) {
    size_t count = 0;
    for (size_t i = 0; i < b->n_cells; i++) {
        const sto_gc_dropped *c = &b->cells[i];
        if (count == 0 || !st_slice_eq(rows[count - 1].row, c->row)) {
            uint64_t v = node_next_version(n);
            rows[count++] = (sto_row_mut){.tablet_id = b->tablet_id,
                                          .row = c->row,
                                          .muts = &muts[i],
                                          .version = v,
                                          .commit_ts_us = (uint64_t)STO_VERSION_TS_US(v),
                                          .flags = STO_ROW_GC};
        }
        muts[i] = (sto_mut){.type = STO_MUT_DEL_COLUMN,
                            .family = c->family,
                            .qualifier = c->qualifier,
                            .ts_start_us = c->ts_us,
                            .ts_end_us = c->ts_us + CS_GC_RANGE_US};
        rows[count - 1].n_muts++;
    }
    return count;
}

static void gc_on_loop(void *arg) {
    cs_gc_batch *b = arg;
    node_ctx *n = b->n;
    gc_batch_unlink(n->cs, b);
    node_tablets *t = tablet_table(n, b->tablet_id);
    node_table *meta = t ? node_catalog_find(n->catalog, t->name) : NULL;
    if (!meta || meta->cs_retention_us <= 0 || n->closing) {
        free(b);
        return;
    }
    sto_row_mut *rows = calloc(b->n_cells, sizeof *rows);
    sto_mut *muts = calloc(b->n_cells, sizeof *muts);
    st_err err = {0};
    st_code rc = rows && muts ? ST_OK : ST_RESOURCE_EXHAUSTED;
    if (rc == ST_OK) {
        size_t count = gc_rows(n, b, rows, muts);
        rc = node_write_mode(n, rows, count, NODE_WRITE_GC, &err, gc_written, b);
    }
    if (rc != ST_OK) {
        st_log(ST_LOG_WARN, "changes",
               "garbage collection records of tablet %" PRIu64 " not written: %s", b->tablet_id,
               err.msg[0] ? err.msg : st_code_name(rc));
        free(b);
    }
    free(rows); /* storage copied them; the records keep their own copies */
    free(muts);
}

/* Storage thread: copies the cells and posts them to the loop. */
static void gc_report(uint64_t tablet_id, const sto_gc_dropped *cells, size_t n_cells, void *arg) {
    node_ctx *n = arg;
    size_t bytes = 0;
    for (size_t i = 0; i < n_cells; i++)
        bytes += cells[i].row.len + cells[i].family.len + cells[i].qualifier.len;
    cs_gc_batch *b = malloc(sizeof *b + n_cells * sizeof *b->cells + bytes + 1);
    if (!b || n_cells == 0) {
        if (b == NULL)
            st_log(ST_LOG_ERROR, "changes",
                   "out of memory: %zu GC records of tablet %" PRIu64 " lost", n_cells, tablet_id);
        free(b);
        return;
    }
    b->n = n;
    b->tablet_id = tablet_id;
    b->cells = (sto_gc_dropped *)(b + 1);
    b->n_cells = n_cells;
    b->data = (uint8_t *)(b->cells + n_cells);
    uint8_t *p = b->data;
    for (size_t i = 0; i < n_cells; i++) {
        const sto_gc_dropped *c = &cells[i];
        st_slice parts[3] = {c->row, c->family, c->qualifier};
        for (int k = 0; k < 3; k++) {
            if (parts[k].len)
                memcpy(p, parts[k].data, parts[k].len);
            parts[k] = st_slice_make(p, parts[k].len);
            p += parts[k].len;
        }
        b->cells[i] = (sto_gc_dropped){parts[0], parts[1], parts[2], c->ts_us};
    }
    node_cs *cs = n->cs;
    pthread_mutex_lock(&cs->gc_lock);
    b->prev = NULL;
    b->next = cs->gc_pending;
    if (b->next)
        b->next->prev = b;
    cs->gc_pending = b;
    pthread_mutex_unlock(&cs->gc_lock);
    if (rpc_server_post(n->rpc, gc_on_loop, b) != ST_OK) {
        st_log(ST_LOG_ERROR, "changes",
               "%zu GC records of tablet %" PRIu64 " lost: the loop's "
               "queue is full",
               n_cells, tablet_id);
        gc_batch_unlink(cs, b);
        free(b);
    }
}
