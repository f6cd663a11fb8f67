/* shipper.c — one shipper per (this node, peer cluster): reads the commit log in order from the
 * acknowledged position, skips records that must not travel (replicated ones: no echo; GC
 * deletes: each cluster collects its own garbage; tablets whose table is gone), batches the rest
 * (REPL_BATCH_ROWS_MAX records / REPL_BATCH_BYTES_MAX bytes), sends each batch's rows to the peer
 * nodes owning them (Replication/Apply, one call per node), and advances the acknowledged
 * position over a batch once every call of it, and of every batch before it, succeeded.
 *
 * Window: at most inflight_max batches are read and unacknowledged; acks advance in log order.
 * Failures: a batch with a failed call is resent whole (Apply is idempotent) after an
 * exponential backoff; "strata-not-owner", UNAVAILABLE and NOT_FOUND first refresh the map of
 * the peer's tablets (Node/ListTablets on each of its nodes; a one-node peer needs no map).
 * Durability: the acknowledged position goes to DIR/peer-<id>.pos and to the storage log holder
 * "repl:<id>" at most every hold_interval_ms, file first (a crash between the two leaves the
 * holder behind the file, which only keeps more log). After a restart shipping resumes at the
 * recorded position; batches acknowledged after it are shipped again, harmlessly. The recorded
 * position only ever trails the acknowledged one, so rows may be re-sent, never skipped.
 *
 * Everything runs on the loop but the recording of the position: the loop hands it to a
 * recorder thread of the shipper, so the two fsyncs never stall the loop (close records the
 * last position itself). RPC callbacks only record results and schedule the pump (a zero-delay
 * event), so no client is created or freed inside its own callback. Log records are read raw
 * (sto_log_reader_next_raw) and only their heads decoded: the payload is the wire's encoding. */
#include "repl_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/storage.h" /* sto_row_mut_peek/_decode/_encode */
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

#define PATH_APPLY "/strata.internal.v1.Replication/Apply"
#define PATH_LIST_TABLETS "/strata.internal.v1.Node/ListTablets"
#define POS_FILE_BYTES_MAX 64

enum { B_FREE = 0, B_SENDING, B_FAILED, B_DONE };

typedef struct ship_row {
    const char *table; /* in the batch arena */
    st_slice row;      /* in the batch arena */
    st_slice enc;      /* the row mutation, log payload encoding */
    uint64_t lsn, commit_ts_us;
    uint32_t dest; /* index of the peer node */
} ship_row;

typedef struct ship_batch {
    repl_shipper *s;
    int state;
    uint64_t first_lsn, next_lsn; /* covers records [first_lsn, next_lsn) */
    ship_row *rows;               /* batch_rows_max entries, allocated once */
    size_t n_rows;
    size_t bytes;
    st_arena arena;
    uint64_t last_tablet; /* the tablet of the last row taken and its table, in the arena */
    const char *last_table;
    uint32_t pending; /* Apply calls outstanding */
    bool failed;
} ship_batch;

typedef struct peer_tablet {
    char *table;
    st_buf start, end; /* [start, end); empty end = unbounded */
    uint32_t dest;
} peer_tablet;

typedef struct refresh_arg {
    repl_shipper *s;
    uint32_t dest;
} refresh_arg;

struct repl_shipper {
    repl_ctx *r;
    char id[ST_TOPO_ID_MAX + 1];
    uint32_t cluster_num;
    char addrs[ST_TOPO_NODES_MAX][ST_TOPO_ADDR_MAX + 1];
    size_t n_nodes;
    char holder[ST_TOPO_ID_MAX + 16];
    char pos_path[ST_TOPO_PATH_MAX + ST_TOPO_ID_MAX + 32];

    sto_log_reader *reader; /* read raw: records are shipped as stored, not decoded */
    uint64_t read_next;     /* next lsn to read */
    uint64_t acked_next;    /* records below are on the peer (or were not to be shipped) */
    int64_t persisted_at_us;

    /* The recorder thread writes the position file and the holder (each with an fsync) off the
     * loop. Under pmu: durable_next (what the file and the holder say), want (the position
     * the loop asked it to record; 0 = nothing), stop. wmu serialises the writes of the thread
     * and of forced (synchronous) persists. */
    pthread_mutex_t pmu, wmu;
    pthread_cond_t pcv;
    pthread_t pthread;
    bool pthread_ok, sync_ok;
    uint64_t durable_next, want;
    bool stop;
    st_buf scratch;
    st_arena scratch_arena; /* decoding a record that must be re-encoded */

    ship_batch batches[REPL_INFLIGHT_BATCHES_MAX]; /* a ring: head, count */
    size_t head, count;

    peer_tablet *map, *new_map;
    size_t n_map, n_new_map;
    bool map_stale, refresh_ok;
    uint32_t refreshing; /* ListTablets calls outstanding */
    int64_t map_at_us;
    refresh_arg refresh_args[ST_TOPO_NODES_MAX];

    struct event *ev_pump, *ev_backoff, *ev_persist;
    bool backing_off;
    uint32_t backoff_ms;

    uint64_t bytes_read, records_read; /* for estimating the bytes of unread records */
    int64_t caught_up_wall_us;         /* when the shipper last had nothing to send */
    int64_t last_send_us, pump_at_us;  /* monotonic: last new batch sent; pending pump due */
    uint64_t rows_shipped, records_skipped, batches_sent, rpcs_failed, map_refreshes;
    char last_error[256];
};

static void schedule_pump(repl_shipper *s, uint32_t delay_ms) {
    if (s->r->closing)
        return;
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    int64_t at = st_mono_us() + (int64_t)delay_ms * 1000;
    /* A pending pump that is due no later stays: only a sooner one replaces it. */
    if (evtimer_pending(s->ev_pump, NULL) && s->pump_at_us <= at)
        return;
    s->pump_at_us = at;
    evtimer_add(s->ev_pump, &tv);
}

static void set_error(repl_shipper *s, st_code code, const char *msg) {
    /* Cut on purpose: a status line, not the whole message. */
    int n = snprintf(s->last_error, sizeof s->last_error, "%s: ", st_code_name(code));
    if (n > 0 && (size_t)n < sizeof s->last_error)
        snprintf(s->last_error + n, sizeof s->last_error - (size_t)n, "%.*s",
                 (int)(sizeof s->last_error - (size_t)n - 1), msg ? msg : "");
}

static void start_backoff(repl_shipper *s) {
    if (s->backing_off || s->r->closing)
        return;
    uint32_t min = s->r->o.backoff_min_ms, max = s->r->o.backoff_max_ms;
    s->backoff_ms = s->backoff_ms ? (s->backoff_ms >= max / 2 ? max : s->backoff_ms * 2) : min;
    s->backing_off = true;
    struct timeval tv = {s->backoff_ms / 1000, (s->backoff_ms % 1000) * 1000};
    evtimer_add(s->ev_backoff, &tv);
    st_log(ST_LOG_DEBUG, "repl", "peer=%s backoff_ms=%u error=\"%s\"", s->id, s->backoff_ms,
           s->last_error);
}

/* ---- the durable position ---- */

static st_code pos_read(repl_shipper *s, uint64_t *lsn, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_env_read_all(st_env_posix(), s->pos_path, &b, err);
    if (rc == ST_OK) {
        char text[POS_FILE_BYTES_MAX + 1];
        unsigned long long v = 0;
        size_t n = b.len < POS_FILE_BYTES_MAX ? b.len : POS_FILE_BYTES_MAX;
        if (n)
            memcpy(text, b.data, n);
        text[n] = '\0';
        if (sscanf(text, "repl-position v1 %llu", &v) != 1 || v == 0)
            rc = st_err_set(err, ST_DATA_LOSS,
                            "replication position file %s is malformed; remove it to ship the "
                            "whole log again",
                            s->pos_path);
        *lsn = v;
    }
    st_buf_free(&b);
    return rc;
}

static uint64_t durable_get(repl_shipper *s) {
    pthread_mutex_lock(&s->pmu);
    uint64_t v = s->durable_next;
    pthread_mutex_unlock(&s->pmu);
    return v;
}

/* Writes lsn to the position file, then to the holder (a crash between the two leaves the
 * holder behind the file, which only keeps more log). Any thread; never moves backwards. */
static st_code pos_record(repl_shipper *s, uint64_t lsn) {
    pthread_mutex_lock(&s->wmu);
    st_code rc = ST_OK;
    if (lsn > durable_get(s)) {
        char text[POS_FILE_BYTES_MAX];
        int len = snprintf(text, sizeof text, "repl-position v1 %" PRIu64 "\n", lsn);
        st_err err = {0};
        rc = st_env_write_atomic(st_env_posix(), s->pos_path, text, (size_t)len, &err);
        if (rc == ST_OK)
            rc = sto_log_hold(s->r->o.db, s->holder, lsn, &err);
        if (rc != ST_OK) /* shipping goes on; a restart would resend more; retried later */
            st_log(ST_LOG_WARN, "repl", "peer=%s recording position %" PRIu64 " failed: %s", s->id,
                   lsn, err.msg);
        pthread_mutex_lock(&s->pmu);
        if (rc == ST_OK)
            s->durable_next = lsn;
        pthread_mutex_unlock(&s->pmu);
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

static void *recorder_main(void *arg) {
    repl_shipper *s = arg;
    pthread_mutex_lock(&s->pmu);
    for (;;) {
        while (!s->stop && s->want <= s->durable_next)
            pthread_cond_wait(&s->pcv, &s->pmu);
        if (s->stop)
            break;
        uint64_t lsn = s->want;
        pthread_mutex_unlock(&s->pmu);
        st_code rc = pos_record(s, lsn);
        pthread_mutex_lock(&s->pmu);
        if (rc != ST_OK && s->want == lsn)
            s->want = 0; /* the loop's timer asks again */
    }
    pthread_mutex_unlock(&s->pmu);
    return NULL;
}

static void persist_timer_arm(repl_shipper *s) {
    if (!evtimer_pending(s->ev_persist, NULL)) {
        struct timeval tv = {s->r->o.hold_interval_ms / 1000,
                             (s->r->o.hold_interval_ms % 1000) * 1000};
        evtimer_add(s->ev_persist, &tv);
    }
}

/* At most every hold_interval_ms the recorder thread is asked to record acked_next (the loop
 * never waits for an fsync); forced (close, tests) or without the thread, it is recorded here
 * before returning. The timer runs while the recorded position is behind. */
void repl_shipper_persist(repl_shipper *s, bool force) {
    if (s->acked_next == durable_get(s))
        return;
    int64_t now = st_mono_us();
    bool due = now - s->persisted_at_us >= (int64_t)s->r->o.hold_interval_ms * 1000;
    if (force || (due && !s->pthread_ok)) {
        s->persisted_at_us = now;
        (void)pos_record(s, s->acked_next);
    } else if (due) {
        s->persisted_at_us = now;
        pthread_mutex_lock(&s->pmu);
        if (s->want < s->acked_next) {
            s->want = s->acked_next;
            pthread_cond_signal(&s->pcv);
        }
        pthread_mutex_unlock(&s->pmu);
    }
    if (!s->r->closing && !force)
        persist_timer_arm(s);
}

static void on_persist(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_shipper *s = arg;
    if (!s->r->closing)
        repl_shipper_persist(s, false);
}

/* ---- the peer's tablet map ---- */

static void map_free(peer_tablet *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(m[i].table);
        st_buf_free(&m[i].start);
        st_buf_free(&m[i].end);
    }
    free(m);
}

static int map_cmp(const void *a, const void *b) {
    const peer_tablet *x = a, *y = b;
    int c = strcmp(x->table, y->table);
    return c ? c : st_slice_cmp(st_buf_slice(&x->start), st_buf_slice(&y->start));
}

/* The peer node whose tablet covers (table, row); -1 when none does. */
static int map_lookup(const repl_shipper *s, const char *table, st_slice row) {
    size_t lo = 0, hi = s->n_map;
    while (lo < hi) { /* first entry > (table, row) */
        size_t mid = (lo + hi) / 2;
        const peer_tablet *t = &s->map[mid];
        int c = strcmp(t->table, table);
        if (c < 0 || (c == 0 && st_slice_cmp(st_buf_slice(&t->start), row) <= 0))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const peer_tablet *t = &s->map[lo - 1];
    if (strcmp(t->table, table) != 0 ||
        (t->end.len && st_slice_cmp(row, st_buf_slice(&t->end)) >= 0))
        return -1;
    return (int)t->dest;
}

static void refresh_add(repl_shipper *s, const Strata__Internal__V1__ListTabletsResponse *resp,
                        uint32_t dest) {
    for (size_t i = 0; i < resp->n_tablets && s->refresh_ok; i++) {
        const Strata__Internal__V1__Tablet *t = resp->tablets[i];
        if (s->n_new_map >= REPL_PEER_TABLETS_MAX) {
            s->refresh_ok = false;
            set_error(s, ST_RESOURCE_EXHAUSTED, "peer tablet map over its maximum");
            return;
        }
        peer_tablet *v = realloc(s->new_map, (s->n_new_map + 1) * sizeof *v);
        if (!v) {
            s->refresh_ok = false;
            return;
        }
        s->new_map = v;
        peer_tablet *e = &v[s->n_new_map];
        memset(e, 0, sizeof *e);
        e->dest = dest;
        e->table = strdup(t->table_name ? t->table_name : "");
        s->n_new_map++;
        if (!e->table || st_buf_append(&e->start, t->start_key.data, t->start_key.len) != ST_OK ||
            st_buf_append(&e->end, t->end_key.data, t->end_key.len) != ST_OK)
            s->refresh_ok = false;
    }
}

/* One ListTablets call (or the starter's hold) is over; the last one swaps the maps in. */
static void refresh_release(repl_shipper *s) {
    if (--s->refreshing > 0 || s->r->closing)
        return;
    if (s->refresh_ok) {
        if (s->n_new_map > 1) /* qsort's base must not be NULL */
            qsort(s->new_map, s->n_new_map, sizeof *s->new_map, map_cmp);
        map_free(s->map, s->n_map);
        s->map = s->new_map;
        s->n_map = s->n_new_map;
        s->map_stale = false;
        s->map_at_us = st_mono_us();
        s->map_refreshes++;
    } else {
        map_free(s->new_map, s->n_new_map);
        start_backoff(s);
    }
    s->new_map = NULL;
    s->n_new_map = 0;
    schedule_pump(s, 0);
}

static void refresh_done(st_code code, const char *message, st_slice resp, void *arg) {
    refresh_arg *ra = arg;
    repl_shipper *s = ra->s;
    Strata__Internal__V1__ListTabletsResponse *m = NULL;
    if (code == ST_OK &&
        !(m = (void *)btu_pb_unpack(&strata__internal__v1__list_tablets_response__descriptor, NULL,
                                    resp, NULL))) {
        code = ST_INTERNAL;
        message = "malformed ListTabletsResponse";
    }
    if (code != ST_OK) {
        s->refresh_ok = false;
        if (!s->r->closing) {
            set_error(s, code, message);
            s->rpcs_failed++;
        }
    } else if (!s->r->closing) {
        refresh_add(s, m, ra->dest);
    }
    if (m)
        strata__internal__v1__list_tablets_response__free_unpacked(m, NULL);
    refresh_release(s);
}

static void start_refresh(repl_shipper *s) {
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    uint8_t buf[16];
    size_t len = strata__internal__v1__list_tablets_request__pack(&req, buf);
    s->refresh_ok = true;
    s->refreshing = 1; /* held while starting the calls */
    for (size_t i = 0; i < s->n_nodes; i++) {
        st_err err = {0};
        rpc_client *c = repl_conn_get(s->r, s->addrs[i], &err);
        s->refresh_args[i] = (refresh_arg){s, (uint32_t)i};
        if (!c ||
            rpc_client_unary(c, PATH_LIST_TABLETS, st_slice_make(buf, len), NULL, 0,
                             s->r->o.rpc_timeout_ms, refresh_done, &s->refresh_args[i]) != ST_OK) {
            s->refresh_ok = false;
            set_error(s, ST_UNAVAILABLE, c ? "could not start ListTablets" : err.msg);
            continue;
        }
        s->refreshing++;
    }
    refresh_release(s);
}

/* ---- batches ---- */

static void batch_reset(ship_batch *b) {
    st_arena_deinit(&b->arena);
    st_arena_init(&b->arena, 64 << 10);
    b->n_rows = 0;
    b->bytes = 0;
    b->last_tablet = 0;
    b->last_table = NULL;
    b->pending = 0;
    b->failed = false;
    b->state = B_FREE;
}

static void batch_complete(repl_shipper *s, ship_batch *b) {
    if (b->failed) {
        b->state = B_FAILED;
        start_backoff(s);
    } else {
        b->state = B_DONE;
        s->backoff_ms = 0;
        s->rows_shipped += b->n_rows;
    }
    schedule_pump(s, 0);
}

static bool refresh_worthy(st_code code, const char *msg) {
    return code == ST_UNAVAILABLE || code == ST_NOT_FOUND || code == ST_DEADLINE_EXCEEDED ||
           st_is_not_owner(code, msg);
}

static void apply_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)resp;
    ship_batch *b = arg;
    repl_shipper *s = b->s;
    if (code != ST_OK) {
        b->failed = true;
        if (code != ST_CANCELLED || !s->r->closing) {
            s->rpcs_failed++;
            set_error(s, code, message);
            if (refresh_worthy(code, message))
                s->map_stale = true;
        }
    }
    if (--b->pending == 0 && !s->r->closing)
        batch_complete(s, b);
}

/* Sends the rows going to peer node dest as one Apply call. */
static st_code send_dest(repl_shipper *s, ship_batch *b, uint32_t dest, size_t count, st_err *err) {
    Strata__Internal__V1__ReplicatedRow *rows = calloc(count, sizeof *rows);
    Strata__Internal__V1__ReplicatedRow **ptrs = calloc(count, sizeof *ptrs);
    st_code rc = ST_RESOURCE_EXHAUSTED;
    uint8_t *buf = NULL;
    if (!rows || !ptrs) {
        st_err_set(err, rc, "out of memory building an Apply request");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n_rows; i++) {
        if (b->rows[i].dest != dest)
            continue;
        strata__internal__v1__replicated_row__init(&rows[k]);
        rows[k].table_name = (char *)b->rows[i].table;
        rows[k].row_mutation.data = (uint8_t *)b->rows[i].enc.data;
        rows[k].row_mutation.len = b->rows[i].enc.len;
        rows[k].origin_lsn = b->rows[i].lsn;
        ptrs[k] = &rows[k];
        k++;
    }
    Strata__Internal__V1__ApplyRequest req;
    strata__internal__v1__apply_request__init(&req);
    req.source_cluster = s->r->o.cluster_num;
    req.source_node = s->r->o.node_num;
    req.n_rows = k;
    req.rows = ptrs;
    size_t len = strata__internal__v1__apply_request__get_packed_size(&req);
    if (!(buf = malloc(len ? len : 1))) {
        st_err_set(err, rc, "out of memory building an Apply request");
        goto out;
    }
    strata__internal__v1__apply_request__pack(&req, buf);
    rpc_client *c = repl_conn_get(s->r, s->addrs[dest], err);
    rc = c ? rpc_client_unary(c, PATH_APPLY, st_slice_make(buf, len), NULL, 0,
                              s->r->o.rpc_timeout_ms, apply_done, b)
           : (err ? err->code : ST_UNAVAILABLE);
    if (c && rc != ST_OK)
        st_err_set(err, ST_UNAVAILABLE, "could not start an Apply call to %s", s->addrs[dest]);
out:
    free(buf);
    free(rows);
    free(ptrs);
    return rc;
}

/* Routes the batch's rows and starts one Apply per peer node they go to. */
/* Removes the rows of tables deleted here since they were read (see repl_node_ops). */
static void drop_deleted_tables(repl_shipper *s, ship_batch *b) {
    if (!s->r->ops.table_exists)
        return;
    size_t kept = 0;
    for (size_t i = 0; i < b->n_rows; i++) {
        if (s->r->ops.table_exists(s->r->o.node, b->rows[i].table)) {
            b->rows[kept++] = b->rows[i];
            continue;
        }
        s->records_skipped++;
        st_log(ST_LOG_DEBUG, "repl", "peer=%s lsn=%" PRIu64 ": table %s deleted, not shipped",
               s->id, b->rows[i].lsn, b->rows[i].table);
    }
    b->n_rows = kept;
}

static void send_batch(repl_shipper *s, ship_batch *b) {
    drop_deleted_tables(s, b);
    b->state = B_SENDING;
    b->failed = false;
    b->pending = 1; /* held while starting the calls */
    size_t per_dest[ST_TOPO_NODES_MAX] = {0};
    for (size_t i = 0; i < b->n_rows; i++) {
        int d = s->n_nodes == 1 ? 0 : map_lookup(s, b->rows[i].table, b->rows[i].row);
        if (d < 0) {
            s->map_stale = true;
            b->failed = true;
            set_error(s, ST_FAILED_PRECONDITION,
                      "no tablet of the peer cluster covers a row; refreshing its map");
            break;
        }
        b->rows[i].dest = (uint32_t)d;
        per_dest[d]++;
    }
    for (uint32_t d = 0; !b->failed && d < s->n_nodes; d++) {
        st_err err = {0};
        if (!per_dest[d])
            continue;
        if (send_dest(s, b, d, per_dest[d], &err) != ST_OK) {
            b->failed = true;
            s->map_stale = true;
            set_error(s, err.code, err.msg);
        } else {
            b->pending++;
        }
    }
    s->batches_sent++;
    if (--b->pending == 0)
        batch_complete(s, b);
}

/* Opens the log reader at read_next. When the records there were trimmed (replication was
 * configured after the log had moved on), starts at the oldest record still stored: what was
 * trimmed cannot be shipped, and the operator is told. */
static st_code reader_open(repl_shipper *s, st_err *err) {
    sto_db *db = s->r->o.db;
    st_code rc = sto_log_reader_open(db, s->read_next, &s->reader, err);
    if (rc != ST_OUT_OF_RANGE || s->count > 0)
        return rc;
    uint64_t lo = s->read_next, hi = sto_log_last_lsn(s->r->o.db) + 1;
    while (lo < hi) { /* lowest lsn that opens */
        uint64_t mid = lo + (hi - lo) / 2;
        sto_log_reader *t = NULL;
        if (sto_log_reader_open(db, mid, &t, NULL) == ST_OK) {
            sto_log_reader_close(t);
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    st_log(ST_LOG_ERROR, "repl",
           "peer=%s: log records %" PRIu64 "..%" PRIu64 " were trimmed before they were "
           "shipped; the peer lacks them (copy the data over, e.g. by backup and restore)",
           s->id, s->read_next, lo - 1);
    s->read_next = s->acked_next = lo;
    return sto_log_reader_open(db, s->read_next, &s->reader, err);
}

/* The record's row mutation as it goes on the wire (the log payload encoding): the payload
 * itself, or, for a record without an origin, a re-encoding with the origin filled in. */
static st_code ship_encoding(repl_shipper *s, uint64_t lsn, st_slice payload, uint32_t origin,
                             st_slice *enc) {
    st_arena_deinit(&s->scratch_arena);
    st_arena_init(&s->scratch_arena, 4096);
    sto_row_mut row;
    if (!sto_row_mut_decode(payload, &row, &s->scratch_arena)) {
        st_log(ST_LOG_ERROR, "repl", "peer=%s lsn=%" PRIu64 " does not decode", s->id, lsn);
        return ST_DATA_LOSS;
    }
    row.origin = origin;
    st_buf_reset(&s->scratch);
    if (sto_row_mut_encode(&s->scratch, &row) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    *enc = st_buf_slice(&s->scratch);
    return ST_OK;
}

/* The table of a tablet as a string in the batch arena (consecutive rows share one copy);
 * *out is NULL when the tablet is gone. */
static st_code batch_table(repl_shipper *s, ship_batch *b, uint64_t tablet_id, bool *refreshed,
                           const char **out) {
    *out = NULL;
    if (b->last_table && b->last_tablet == tablet_id) {
        *out = b->last_table;
        return ST_OK;
    }
    const char *table = repl_tablet_table(s->r, tablet_id, !*refreshed);
    if (!table) {
        *refreshed = true;
        return ST_OK;
    }
    const char *copy = st_arena_dup(&b->arena, table, strlen(table) + 1);
    if (!copy)
        return ST_RESOURCE_EXHAUSTED;
    b->last_tablet = tablet_id;
    *out = b->last_table = copy;
    return ST_OK;
}

/* Adds the record (lsn, payload: the log's encoding) to the batch when it is to be shipped.
 * Only the head of the row mutation is decoded (sto_row_mut_peek): skipping and routing need
 * no more, and the payload is what the wire carries (docs/formats/replication.md). */
static st_code batch_take(repl_shipper *s, ship_batch *b, uint64_t lsn, st_slice payload,
                          bool *refreshed) {
    sto_row_mut row;
    if (!sto_row_mut_peek(payload, &row)) {
        st_log(ST_LOG_ERROR, "repl", "peer=%s lsn=%" PRIu64 " does not decode", s->id, lsn);
        return ST_DATA_LOSS;
    }
    if (row.flags & (STO_ROW_REPLICATED | STO_ROW_GC)) {
        s->records_skipped++;
        return ST_OK;
    }
    const char *table = NULL;
    if (batch_table(s, b, row.tablet_id, refreshed, &table) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (!table) {
        s->records_skipped++;
        st_log(ST_LOG_DEBUG, "repl", "lsn=%" PRIu64 " tablet=%" PRIu64 " gone: not shipped", lsn,
               row.tablet_id);
        return ST_OK;
    }
    /* Writes storage makes itself (DropRowRange's row deletes) carry the version but no origin:
     * the origin is the version's tiebreaker. A record the peer would refuse whatever happens
     * is not sent (it would stop replication for good): logged and counted instead. */
    uint32_t origin = row.origin;
    if (origin == 0)
        origin = (uint32_t)(row.version & ((1u << STO_VERSION_TIEBREAK_BITS) - 1));
    if (origin == 0 || row.version != STO_VERSION(row.commit_ts_us, origin) || row.n_muts == 0 ||
        row.row.len == 0) {
        s->records_skipped++;
        st_log(ST_LOG_ERROR, "repl",
               "peer=%s lsn=%" PRIu64 ": record without a valid origin/version, not shipped", s->id,
               lsn);
        return ST_OK;
    }
    st_slice enc = payload;
    if (row.origin == 0) {
        st_code rc = ship_encoding(s, lsn, payload, origin, &enc);
        if (rc != ST_OK)
            return rc;
    }
    ship_row *r = &b->rows[b->n_rows];
    uint8_t *copy = st_arena_dup(&b->arena, enc.data, enc.len);
    if (!copy)
        return ST_RESOURCE_EXHAUSTED;
    r->table = table;
    r->enc = st_slice_make(copy, enc.len);
    if (enc.data == payload.data) /* the row key lies inside the copied payload */
        r->row = st_slice_make(copy + (row.row.data - payload.data), row.row.len);
    else if (!(r->row.data = st_arena_dup(&b->arena, row.row.data, row.row.len)))
        return ST_RESOURCE_EXHAUSTED;
    else
        r->row.len = row.row.len;
    r->lsn = lsn;
    r->commit_ts_us = row.commit_ts_us;
    r->dest = 0;
    b->n_rows++;
    b->bytes += enc.len;
    return ST_OK;
}

/* Reads the next records into b. ST_NOT_FOUND when there were none. */
static st_code read_batch(repl_shipper *s, ship_batch *b, st_err *err) {
    if (!s->reader) {
        st_code rc = reader_open(s, err);
        if (rc != ST_OK)
            return rc;
    }
    batch_reset(b);
    b->first_lsn = s->read_next;
    size_t records = 0;
    bool refreshed = false;
    while (records < s->r->o.batch_rows_max && b->bytes < s->r->o.batch_bytes_max) {
        uint64_t lsn = 0;
        st_slice payload = {0};
        st_code rc = sto_log_reader_next_raw(s->reader, &lsn, &payload, err);
        if (rc == ST_NOT_FOUND)
            break;
        if (rc == ST_OK)
            rc = batch_take(s, b, lsn, payload, &refreshed);
        if (rc != ST_OK) {
            /* Reopen at read_next later; what was taken so far is kept (it is whole). */
            sto_log_reader_close(s->reader);
            s->reader = NULL;
            if (records)
                break;
            return rc;
        }
        records++;
        s->records_read++;
        s->bytes_read += payload.len + 24;
        s->read_next = lsn + 1;
    }
    b->next_lsn = s->read_next;
    return records ? ST_OK : ST_NOT_FOUND;
}

/* Moves the acknowledged position over the finished batches at the head of the window. */
static void retire(repl_shipper *s) {
    while (s->count && s->batches[s->head].state == B_DONE) {
        ship_batch *b = &s->batches[s->head];
        s->acked_next = b->next_lsn;
        batch_reset(b);
        s->head = (s->head + 1) % REPL_INFLIGHT_BATCHES_MAX;
        s->count--;
    }
}

static bool map_needed(const repl_shipper *s) {
    if (s->n_nodes <= 1)
        return false;
    return s->map_stale || s->map_at_us == 0 ||
           st_mono_us() - s->map_at_us > (int64_t)REPL_MAP_REFRESH_MS * 1000;
}

static void pump(repl_shipper *s) {
    retire(s);
    repl_shipper_persist(s, false);
    if (s->backing_off || s->refreshing)
        return;
    /* A cut link (strata chaos partition) sends nothing; repl_shipper_link_changed pumps again
     * when it is restored. Calls already under way finish (the peer refuses them). */
    if (repl_link_cut(s->r, s->cluster_num))
        return;
    if (map_needed(s)) {
        start_refresh(s);
        return;
    }
    for (size_t i = 0; i < s->count && !s->backing_off; i++) {
        ship_batch *b = &s->batches[(s->head + i) % REPL_INFLIGHT_BATCHES_MAX];
        if (b->state == B_FAILED && b->pending == 0)
            send_batch(s, b);
    }
    bool caught_up = false;
    while (!s->backing_off && s->count < s->r->o.inflight_max) {
        /* New batches go at most every REPL_SEND_GAP_US: a durable local write wakes the
         * shipper, and one Apply (one fdatasync on the peer) per write halved a single
         * writer's throughput with both clusters on one disk. The gap gathers the writes of
         * about a millisecond into one batch, adding at most that to the lag. */
        int64_t gap = st_mono_us() - s->last_send_us;
        if (gap < REPL_SEND_GAP_US) {
            schedule_pump(s, 1);
            break;
        }
        ship_batch *b = &s->batches[(s->head + s->count) % REPL_INFLIGHT_BATCHES_MAX];
        st_err err = {0};
        st_code rc = read_batch(s, b, &err);
        if (rc == ST_NOT_FOUND) {
            caught_up = true;
            break;
        }
        if (rc != ST_OK) {
            set_error(s, rc, err.msg);
            start_backoff(s);
            break;
        }
        s->count++;
        if (b->n_rows == 0) {
            b->state = B_DONE; /* nothing to ship in it: acknowledged at once, in order */
        } else {
            s->last_send_us = st_mono_us();
            send_batch(s, b);
        }
        retire(s);
    }
    if (s->count == 0 && caught_up) {
        s->caught_up_wall_us = st_wall_us();
        if (s->last_error[0] && !s->backing_off)
            s->last_error[0] = '\0';
    }
    repl_shipper_persist(s, false);
    if (caught_up)
        schedule_pump(s, s->r->o.poll_ms);
}

static void on_pump(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_shipper *s = arg;
    if (!s->r->closing)
        pump(s);
}

static void on_backoff(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_shipper *s = arg;
    s->backing_off = false;
    if (!s->r->closing)
        pump(s);
}

/* ---- open, close, stats ---- */

st_code repl_shipper_open(repl_ctx *r, const st_topo_cluster *peer, repl_shipper **out,
                          st_err *err) {
    repl_shipper *s = calloc(1, sizeof *s);
    if (!s)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a shipper");
    s->r = r;
    snprintf(s->id, sizeof s->id, "%s", peer->id);
    s->cluster_num = peer->num;
    s->n_nodes = peer->n_nodes;
    for (size_t i = 0; i < peer->n_nodes; i++)
        snprintf(s->addrs[i], sizeof s->addrs[i], "%s", peer->nodes[i].addr);
    snprintf(s->holder, sizeof s->holder, REPL_HOLDER_PREFIX "%s", peer->id);
    snprintf(s->pos_path, sizeof s->pos_path, "%s/peer-%s.pos", r->state_dir, peer->id);
    st_buf_init(&s->scratch);
    st_arena_init(&s->scratch_arena, 4096);
    s->sync_ok = pthread_mutex_init(&s->pmu, NULL) == 0;
    s->sync_ok = s->sync_ok && pthread_mutex_init(&s->wmu, NULL) == 0;
    s->sync_ok = s->sync_ok && pthread_cond_init(&s->pcv, NULL) == 0;
    for (size_t i = 0; i < REPL_INFLIGHT_BATCHES_MAX; i++) {
        s->batches[i].s = s;
        st_arena_init(&s->batches[i].arena, 64 << 10);
        s->batches[i].rows = calloc(r->o.batch_rows_max, sizeof(ship_row));
        if (!s->batches[i].rows) {
            *out = s;
            repl_shipper_close(s);
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a shipper");
        }
    }
    s->ev_pump = evtimer_new(r->o.base, on_pump, s);
    s->ev_backoff = evtimer_new(r->o.base, on_backoff, s);
    s->ev_persist = evtimer_new(r->o.base, on_persist, s);
    uint64_t start = 1;
    st_err perr = {0};
    st_code rc = pos_read(s, &start, &perr);
    if (rc == ST_NOT_FOUND) {
        start = 1;
        rc = ST_OK;
    }
    if (rc == ST_OK && (!s->ev_pump || !s->ev_backoff || !s->ev_persist || !s->sync_ok))
        rc = st_err_set(&perr, ST_RESOURCE_EXHAUSTED, "out of memory starting a shipper");
    /* The holder first keeps every record from here on; then shipping starts. */
    if (rc == ST_OK)
        rc = sto_log_hold(r->o.db, s->holder, start, &perr);
    if (rc != ST_OK) {
        repl_shipper_close(s);
        if (err)
            *err = perr;
        return rc;
    }
    s->read_next = s->acked_next = s->durable_next = start;
    /* Without the thread positions are recorded on the loop, as before it existed. */
    s->pthread_ok = pthread_create(&s->pthread, NULL, recorder_main, s) == 0;
    s->caught_up_wall_us = st_wall_us();
    st_log(ST_LOG_INFO, "repl", "shipper peer=%s nodes=%zu resumes at lsn=%" PRIu64, s->id,
           s->n_nodes, start);
    schedule_pump(s, 0);
    *out = s;
    return ST_OK;
}

void repl_shipper_close(repl_shipper *s) {
    if (!s)
        return;
    if (s->pthread_ok) {
        pthread_mutex_lock(&s->pmu);
        s->stop = true;
        pthread_cond_signal(&s->pcv);
        pthread_mutex_unlock(&s->pmu);
        pthread_join(s->pthread, NULL);
        s->pthread_ok = false;
    }
    if (s->ev_persist && s->sync_ok) /* only once everything is set up */
        repl_shipper_persist(s, true);
    if (s->ev_pump)
        event_free(s->ev_pump);
    if (s->ev_backoff)
        event_free(s->ev_backoff);
    if (s->ev_persist)
        event_free(s->ev_persist);
    sto_log_reader_close(s->reader);
    st_arena_deinit(&s->scratch_arena);
    for (size_t i = 0; i < REPL_INFLIGHT_BATCHES_MAX; i++) {
        st_arena_deinit(&s->batches[i].arena);
        free(s->batches[i].rows);
    }
    map_free(s->map, s->n_map);
    map_free(s->new_map, s->n_new_map);
    st_buf_free(&s->scratch);
    if (s->sync_ok) {
        pthread_mutex_destroy(&s->pmu);
        pthread_mutex_destroy(&s->wmu);
        pthread_cond_destroy(&s->pcv);
    }
    free(s);
}

uint32_t repl_shipper_cluster_num(const repl_shipper *s) {
    return s->cluster_num;
}

void repl_shipper_wake(repl_shipper *s) {
    if (!s->backing_off && !s->refreshing)
        schedule_pump(s, 0);
}

void repl_shipper_link_changed(repl_shipper *s) {
    if (s->r->closing || repl_link_cut(s->r, s->cluster_num))
        return;
    /* Restored: catching up starts now, not when a backoff of up to backoff_max_ms ends. */
    if (s->backing_off) {
        evtimer_del(s->ev_backoff);
        s->backing_off = false;
    }
    s->backoff_ms = 0;
    schedule_pump(s, 0);
}

void repl_shipper_stats(repl_shipper *s, repl_peer_stats *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->cluster_id, sizeof out->cluster_id, "%s", s->id);
    out->cluster_num = s->cluster_num;
    out->acked_next_lsn = s->acked_next;
    out->durable_next_lsn = durable_get(s);
    uint64_t last = sto_log_last_lsn(s->r->o.db);
    out->records_behind = last >= s->acked_next ? last - s->acked_next + 1 : 0;
    uint64_t inflight_bytes = 0;
    uint64_t oldest_ts = 0;
    for (size_t i = 0; i < s->count; i++) {
        const ship_batch *b = &s->batches[(s->head + i) % REPL_INFLIGHT_BATCHES_MAX];
        inflight_bytes += b->bytes;
        for (size_t j = 0; j < b->n_rows && !oldest_ts; j++)
            oldest_ts = b->rows[j].commit_ts_us;
    }
    uint64_t unread = last >= s->read_next ? last - s->read_next + 1 : 0;
    uint64_t avg = s->records_read ? s->bytes_read / s->records_read : 64;
    out->bytes_behind = inflight_bytes + unread * avg;
    int64_t now = st_wall_us();
    if (out->records_behind == 0)
        out->time_behind_us = 0;
    else if (oldest_ts && now > (int64_t)oldest_ts)
        out->time_behind_us = (uint64_t)(now - (int64_t)oldest_ts);
    else if (now > s->caught_up_wall_us)
        out->time_behind_us = (uint64_t)(now - s->caught_up_wall_us);
    out->rows_shipped = s->rows_shipped;
    out->records_skipped = s->records_skipped;
    out->batches_sent = s->batches_sent;
    out->rpcs_failed = s->rpcs_failed;
    out->map_refreshes = s->map_refreshes;
    out->inflight_batches = (uint32_t)s->count;
    out->backing_off = s->backing_off;
    out->link_cut = repl_link_cut(s->r, s->cluster_num);
    out->backoff_ms = s->backoff_ms;
    snprintf(out->last_error, sizeof out->last_error, "%s", s->last_error);
}
