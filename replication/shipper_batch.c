/* shipper_batch.c — the shipper's batches (shipper.c says how they move): the map of the peer's
 * tablets (Node/ListTablets), reading log records into a batch, choosing each row's peer node,
 * and the Apply calls that send a batch. */
#include "shipper_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/storage.h" /* sto_row_mut_peek/_decode/_encode */
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

/* ---- the peer's tablet map ---- */

void shipper_map_free(peer_tablet *m, size_t n) {
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
        if (t->incoming)
            continue; /* a move's copy, refusing writes until its source activates it */
        if (s->n_new_map >= REPL_PEER_TABLETS_MAX) {
            s->refresh_ok = false;
            shipper_set_error(s, ST_RESOURCE_EXHAUSTED, "peer tablet map over its maximum");
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
        shipper_map_free(s->map, s->n_map);
        s->map = s->new_map;
        s->n_map = s->n_new_map;
        s->map_stale = false;
        s->map_at_us = st_mono_us();
        s->map_refreshes++;
    } else {
        shipper_map_free(s->new_map, s->n_new_map);
        shipper_start_backoff(s);
    }
    s->new_map = NULL;
    s->n_new_map = 0;
    shipper_schedule_pump(s, 0);
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
            shipper_set_error(s, code, message);
            s->rpcs_failed++;
        }
    } else if (!s->r->closing) {
        refresh_add(s, m, ra->dest);
    }
    if (m)
        strata__internal__v1__list_tablets_response__free_unpacked(m, NULL);
    refresh_release(s);
}

void shipper_start_refresh(repl_shipper *s) {
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
            shipper_set_error(s, ST_UNAVAILABLE, c ? "could not start ListTablets" : err.msg);
            continue;
        }
        s->refreshing++;
    }
    refresh_release(s);
}

/* ---- batches ---- */

void shipper_batch_reset(ship_batch *b) {
    st_arena_deinit(&b->arena);
    st_arena_init(&b->arena, 64 << 10);
    b->n_rows = 0;
    b->bytes = 0;
    b->last_tablet = 0;
    b->last_table = NULL;
    b->pending = 0;
    b->failed = false;
    b->unacked_dests = 0;
    b->state = B_FREE;
}

static void batch_complete(repl_shipper *s, ship_batch *b) {
    if (b->failed) {
        b->state = B_FAILED;
        shipper_start_backoff(s);
    } else {
        b->state = B_DONE;
        s->backoff_ms = 0;
        s->rows_shipped += b->n_rows;
    }
    shipper_schedule_pump(s, 0);
}

static bool refresh_worthy(st_code code, const char *msg) {
    return code == ST_UNAVAILABLE || code == ST_NOT_FOUND || code == ST_DEADLINE_EXCEEDED ||
           st_is_not_owner(code, msg);
}

static void apply_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)resp;
    ship_call *c = arg;
    ship_batch *b = c->b;
    repl_shipper *s = b->s;
    if (code != ST_OK) {
        b->failed = true;
        if (code != ST_CANCELLED || !s->r->closing) {
            s->rpcs_failed++;
            shipper_set_error(s, code, message);
            if (refresh_worthy(code, message))
                s->map_stale = true;
        }
    } else {
        for (size_t i = 0; i < b->n_rows; i++)
            if (b->rows[i].dest == c->dest)
                b->rows[i].acked = true;
        b->unacked_dests &= ~((uint64_t)1 << c->dest);
    }
    if (--b->pending == 0 && !s->r->closing)
        batch_complete(s, b);
}

/* The end of the latest batch before b with rows for peer node dest that it has not
 * acknowledged; 0 when there is none (ApplyRequest.after_lsn). */
static uint64_t after_lsn(const repl_shipper *s, const ship_batch *b, uint32_t dest) {
    size_t pos = ((size_t)(b - s->batches) + REPL_INFLIGHT_BATCHES_MAX - s->head) %
                 REPL_INFLIGHT_BATCHES_MAX;
    while (pos-- > 0) {
        const ship_batch *e = &s->batches[(s->head + pos) % REPL_INFLIGHT_BATCHES_MAX];
        if (e->unacked_dests & ((uint64_t)1 << dest))
            return e->next_lsn;
    }
    return 0;
}

/* Sends the rows going to peer node dest (but those it acknowledged before) as one Apply, which
 * may have none (a mark that the batch passed, see shipper_send_batch). */
static st_code send_dest(repl_shipper *s, ship_batch *b, uint32_t dest, size_t count, st_err *err) {
    Strata__Internal__V1__ReplicatedRow *rows = calloc(count ? count : 1, sizeof *rows);
    Strata__Internal__V1__ReplicatedRow **ptrs = calloc(count ? count : 1, sizeof *ptrs);
    st_code rc = ST_RESOURCE_EXHAUSTED;
    uint8_t *buf = NULL;
    if (!rows || !ptrs) {
        st_err_set(err, rc, "out of memory building an Apply request");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n_rows; i++) {
        if (b->rows[i].dest != dest || b->rows[i].acked)
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
    req.next_lsn = b->next_lsn;
    req.after_lsn = after_lsn(s, b, dest);
    size_t len = strata__internal__v1__apply_request__get_packed_size(&req);
    if (!(buf = malloc(len ? len : 1))) {
        st_err_set(err, rc, "out of memory building an Apply request");
        goto out;
    }
    strata__internal__v1__apply_request__pack(&req, buf);
    rpc_client *c = repl_conn_get(s->r, s->addrs[dest], err);
    b->calls[dest] = (ship_call){b, dest};
    rc = c ? rpc_client_unary(c, PATH_APPLY, st_slice_make(buf, len), NULL, 0,
                              s->r->o.rpc_timeout_ms, apply_done, &b->calls[dest])
           : (err ? err->code : ST_UNAVAILABLE);
    if (c && rc != ST_OK)
        st_err_set(err, ST_UNAVAILABLE, "could not start an Apply call to %s", s->addrs[dest]);
out:
    free(buf);
    free(rows);
    free(ptrs);
    return rc;
}

/* Whether row r still belongs to a live table here. The table's name is not enough: a table
 * deleted here and created again under the same name exists, but the row's tablet was dropped
 * with the old one (tablet ids are never reused), and its name forgotten (repl_table_dropped).
 * A split parent's name is kept (retired.c), so its rows still go. */
static bool row_table_live(repl_shipper *s, const ship_row *r) {
    const char *named = repl_tablet_table(s->r, r->tablet_id, false);
    if (!named || strcmp(named, r->table) != 0)
        return false;
    return !s->r->ops.table_exists || s->r->ops.table_exists(s->r->o.node, r->table);
}

/* Removes the rows of tables deleted here since they were read, also when a table of the same
 * name was created since: the peers deleted that table too, and would refuse the rows for ever
 * or, once the new table exists there, take them into it. */
static void drop_deleted_tables(repl_shipper *s, ship_batch *b) {
    size_t kept = 0;
    for (size_t i = 0; i < b->n_rows; i++) {
        if (row_table_live(s, &b->rows[i])) {
            b->rows[kept++] = b->rows[i];
            continue;
        }
        s->records_skipped++;
        st_log(ST_LOG_DEBUG, "repl",
               "peer=%s lsn=%" PRIu64 ": tablet %" PRIu64 " of table %s deleted, not shipped",
               s->id, b->rows[i].lsn, b->rows[i].tablet_id, b->rows[i].table);
    }
    b->n_rows = kept;
}

bool shipper_table_in_flight(const repl_shipper *s, const char *table) {
    for (size_t k = 0; k < s->count; k++) {
        const ship_batch *b = &s->batches[(s->head + k) % REPL_INFLIGHT_BATCHES_MAX];
        if (b->state != B_SENDING || b->pending == 0)
            continue;
        for (size_t i = 0; i < b->n_rows; i++)
            if (!b->rows[i].acked && strcmp(b->rows[i].table, table) == 0)
                return true;
    }
    return false;
}

/* Routes the batch's rows and starts one Apply per peer node they go to. */
void shipper_send_batch(repl_shipper *s, ship_batch *b) {
    drop_deleted_tables(s, b);
    b->state = B_SENDING;
    b->failed = false;
    b->pending = 1; /* held while starting the calls */
    /* Rows acknowledged by a call before keep their node: the rest are routed afresh. */
    size_t per_dest[ST_TOPO_NODES_MAX] = {0};
    uint64_t waited_on = b->unacked_dests; /* later batches' calls may wait for it there */
    b->unacked_dests = 0;
    for (size_t i = 0; i < b->n_rows; i++) {
        if (b->rows[i].acked)
            continue;
        int d = s->n_nodes == 1 ? 0 : map_lookup(s, b->rows[i].table, b->rows[i].row);
        if (d < 0) {
            s->map_stale = true;
            b->failed = true;
            b->unacked_dests = UINT64_MAX; /* not all known: later batches wait for it */
            shipper_set_error(s, ST_FAILED_PRECONDITION,
                              "no tablet of the peer cluster covers a row; refreshing its map");
            break;
        }
        b->rows[i].dest = (uint32_t)d;
        b->unacked_dests |= (uint64_t)1 << d;
        per_dest[d]++;
    }
    /* A node that had rows of it before and has none now (its tablets moved) gets an Apply of
     * no rows: the calls of later batches waiting there for this one start then, instead of
     * being refused after REPL_APPLY_PARK_MS. */
    uint64_t nodes = s->n_nodes >= 64 ? UINT64_MAX : ((uint64_t)1 << s->n_nodes) - 1;
    uint64_t marks = b->failed ? 0 : waited_on & ~b->unacked_dests & nodes;
    b->unacked_dests |= marks; /* until the empty Apply is acknowledged */
    for (uint32_t d = 0; !b->failed && d < s->n_nodes; d++) {
        st_err err = {0};
        if (!per_dest[d] && !(marks & ((uint64_t)1 << d)))
            continue;
        if (send_dest(s, b, d, per_dest[d], &err) != ST_OK) {
            b->failed = true;
            s->map_stale = true;
            shipper_set_error(s, err.code, err.msg);
        } else {
            b->pending++;
        }
    }
    s->batches_sent++;
    if (--b->pending == 0)
        batch_complete(s, b);
}

/* Opens the log reader at read_next. When the records there were trimmed (replication was
 * configured after the log had moved on) or skipped as damaged at the node's start (no holder
 * needed them then: docs/formats/log.md), starts at the oldest record still readable: the others
 * cannot be shipped, and the operator is told why. */
static st_code reader_open(repl_shipper *s, st_err *err) {
    sto_db *db = s->r->o.db;
    st_err why = {0};
    st_code rc = sto_log_reader_open(db, s->read_next, &s->reader, &why);
    if (rc != ST_OK && err)
        *err = why;
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
           "peer=%s: log records %" PRIu64 "..%" PRIu64 " cannot be shipped (%s); the peer "
           "lacks them (copy the data over, e.g. by backup and restore)",
           s->id, s->read_next, lo - 1, why.msg);
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
    r->tablet_id = row.tablet_id;
    r->dest = 0;
    r->acked = false;
    b->n_rows++;
    b->bytes += enc.len;
    return ST_OK;
}

/* Reads the next records into b. ST_NOT_FOUND when there were none. */
st_code shipper_read_batch(repl_shipper *s, ship_batch *b, st_err *err) {
    if (!s->reader) {
        st_code rc = reader_open(s, err);
        if (rc != ST_OK)
            return rc;
    }
    shipper_batch_reset(b);
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