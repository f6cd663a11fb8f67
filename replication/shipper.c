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

void shipper_schedule_pump(repl_shipper *s, uint32_t delay_ms) {
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

void shipper_set_error(repl_shipper *s, st_code code, const char *msg) {
    /* Cut on purpose: a status line, not the whole message. */
    s->last_code = code;
    int n = snprintf(s->last_error, sizeof s->last_error, "%s: ", st_code_name(code));
    if (n > 0 && (size_t)n < sizeof s->last_error)
        snprintf(s->last_error + n, sizeof s->last_error - (size_t)n, "%.*s",
                 (int)(sizeof s->last_error - (size_t)n - 1), msg ? msg : "");
}

/* Records the shipper needs cannot be read (damaged: docs/formats/log.md): unlike a peer that
 * does not answer, this does not pass by itself, and the peer gets nothing more until the operator
 * acts. Said at ERROR once a retry (a fresh reader) fails again at the same lsn — a first failure
 * can be a passing one, a reader meeting a record as it is being written — and then at most once
 * per REPL_DATA_LOSS_LOG_US per peer; the message (in last_error, shown by `strata status`) names
 * the segment and the lsns. */
static void shipper_warn_data_loss(repl_shipper *s) {
    if (s->last_code != ST_DATA_LOSS)
        return;
    if (s->data_loss_lsn != s->read_next) {
        s->data_loss_lsn = s->read_next;
        return;
    }
    int64_t now = st_mono_us();
    if (s->data_loss_logged_us && now - s->data_loss_logged_us < REPL_DATA_LOSS_LOG_US)
        return;
    s->data_loss_logged_us = now;
    st_log(ST_LOG_ERROR, "repl",
           "event=repl_log_unreadable peer=%s read_next=%" PRIu64 " error=\"%s\" msg=\"replication "
           "to this peer is stopped: commit log records it has not received are damaged; the "
           "peer lacks their rows and every later one. Copy the tables to that cluster (backup "
           "and restore) and see docs/operations.md, damaged commit log\"",
           s->id, s->read_next, s->last_error);
}

void shipper_start_backoff(repl_shipper *s) {
    if (s->backing_off || s->r->closing)
        return;
    uint32_t min = s->r->o.backoff_min_ms, max = s->r->o.backoff_max_ms;
    s->backoff_ms = s->backoff_ms ? (s->backoff_ms >= max / 2 ? max : s->backoff_ms * 2) : min;
    s->backing_off = true;
    struct timeval tv = {s->backoff_ms / 1000, (s->backoff_ms % 1000) * 1000};
    evtimer_add(s->ev_backoff, &tv);
    st_log(ST_LOG_DEBUG, "repl", "peer=%s backoff_ms=%u error=\"%s\"", s->id, s->backoff_ms,
           s->last_error);
    shipper_warn_data_loss(s);
}

static void retire(repl_shipper *s) {
    while (s->count && s->batches[s->head].state == B_DONE) {
        ship_batch *b = &s->batches[s->head];
        s->acked_next = b->next_lsn;
        for (size_t i = 0; i < b->n_rows; i++)
            if ((int64_t)b->rows[i].commit_ts_us > s->acked_commit_us)
                s->acked_commit_us = (int64_t)b->rows[i].commit_ts_us;
        shipper_batch_reset(b);
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
        shipper_start_refresh(s);
        return;
    }
    for (size_t i = 0; i < s->count && !s->backing_off; i++) {
        ship_batch *b = &s->batches[(s->head + i) % REPL_INFLIGHT_BATCHES_MAX];
        if (b->state == B_FAILED && b->pending == 0)
            shipper_send_batch(s, b);
    }
    bool caught_up = false;
    while (!s->backing_off && s->count < s->r->o.inflight_max) {
        /* New batches go at most every REPL_SEND_GAP_US: a durable local write wakes the
         * shipper, and one Apply (one fdatasync on the peer) per write halved a single
         * writer's throughput with both clusters on one disk. The gap gathers the writes of
         * about a millisecond into one batch, adding at most that to the lag. */
        int64_t gap = st_mono_us() - s->last_send_us;
        if (gap < REPL_SEND_GAP_US) {
            shipper_schedule_pump(s, 1);
            break;
        }
        ship_batch *b = &s->batches[(s->head + s->count) % REPL_INFLIGHT_BATCHES_MAX];
        st_err err = {0};
        st_code rc = shipper_read_batch(s, b, &err);
        if (rc == ST_NOT_FOUND) {
            caught_up = true;
            break;
        }
        if (rc != ST_OK) {
            shipper_set_error(s, rc, err.msg);
            shipper_start_backoff(s);
            break;
        }
        s->count++;
        if (b->n_rows == 0) {
            b->state = B_DONE; /* nothing to ship in it: acknowledged at once, in order */
        } else {
            s->last_send_us = st_mono_us();
            shipper_send_batch(s, b);
        }
        retire(s);
    }
    if (s->count == 0 && caught_up) {
        s->caught_up_wall_us = st_wall_us();
        /* Every durable record is acknowledged: so is every write committed up to the node's
         * commit floor (none in flight), though none was shipped since. */
        int64_t floor = s->r->ops.commit_floor ? s->r->ops.commit_floor(s->r->o.node) : 0;
        if (floor > s->acked_commit_us)
            s->acked_commit_us = floor;
        if (s->last_error[0] && !s->backing_off) {
            s->last_error[0] = '\0';
            s->last_code = ST_OK;
        }
    }
    repl_shipper_persist(s, false);
    if (caught_up)
        shipper_schedule_pump(s, s->r->o.poll_ms);
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
    s->ev_persist = evtimer_new(r->o.base, shipper_on_persist, s);
    uint64_t start = 1;
    st_err perr = {0};
    st_code rc = shipper_pos_read(s, &start, &perr);
    if (rc == ST_NOT_FOUND) {
        start = 1;
        rc = ST_OK;
    } else if (rc == ST_OK) {
        rc = shipper_pos_check(s, &start, &perr);
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
    s->pthread_ok = pthread_create(&s->pthread, NULL, shipper_recorder_main, s) == 0;
    s->caught_up_wall_us = st_wall_us();
    st_log(ST_LOG_INFO, "repl", "shipper peer=%s nodes=%zu resumes at lsn=%" PRIu64, s->id,
           s->n_nodes, start);
    shipper_schedule_pump(s, 0);
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
    shipper_map_free(s->map, s->n_map);
    shipper_map_free(s->new_map, s->n_new_map);
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
        shipper_schedule_pump(s, 0);
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
    shipper_schedule_pump(s, 0);
}

void repl_shipper_stats(repl_shipper *s, repl_peer_stats *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->cluster_id, sizeof out->cluster_id, "%s", s->id);
    out->cluster_num = s->cluster_num;
    out->acked_next_lsn = s->acked_next;
    out->acked_commit_us = s->acked_commit_us;
    out->durable_next_lsn = shipper_durable_get(s);
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
    out->last_code = s->last_code;
    snprintf(out->last_error, sizeof out->last_error, "%s", s->last_error);
}