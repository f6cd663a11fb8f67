/* read.c — the ReadRows handler: validates the request, walks the row set over the table's
 * tablets (one storage snapshot per tablet, taken when the scan reaches it, and again after the
 * read waited for its client: read_release_storage), applies the filter row by row, and streams
 * whole rows as CellChunks (read.h) under the call's flow control.
 *
 * Flow control and fairness. Work happens in turns on the loop thread. A turn ends after it sent
 * one response batch (~NODE_READ_BATCH_BYTES), or scanned NODE_READ_TURN_ROWS rows or
 * NODE_READ_TURN_CELLS cells (fewer under a heavy filter: a turn counts the work of the filter's
 * head on each cell and of its rest on each row, turn_spent), or opened NODE_READ_TURN_RANGES
 * ranges of the row set, or read NODE_READ_TURN_BLOCK_BYTES of blocks from disk (a turn may end
 * inside a row: the row being assembled waits in the state), or encoded NODE_READ_TURN_CELLS cells
 * of a complete row (a row of millions of cells is encoded over many turns, then sent whole:
 * row_emit); the next turn waits in the node's queue of turns for the loop's next pass, after its
 * poll of the sockets, and one pass runs turns for at most about NODE_READ_PASS_US (schedule_turn,
 * on_turns), so other connections' events run in between however many reads are due. When the
 * call's send queue is full the scan keeps its iterator and snapshot and waits for
 * rpc_call_set_writable_cb. A cancelled call (reset, connection loss, deadline) frees everything at
 * the next opportunity.
 *
 * Errors. Request problems: INVALID_ARGUMENT / NOT_FOUND / UNIMPLEMENTED before any data. A row
 * over NODE_READ_ROW_BYTES_MAX: FAILED_PRECONDITION, worded as Cloud Bigtable does. Storage errors
 * (DATA_LOSS, INTERNAL) and filter budget errors (FAILED_PRECONDITION) end the call with their code
 * after the rows already batched are sent (they are whole rows, so the client can resume after
 * them). Nothing here ends the connection or the process. */
#include <event2/event.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filter_pb.h"
#include "read.h"

/* FeatureFlags field numbers (proto/pb/google/bigtable/v2/feature_flags.proto). */
#define FEATURE_REVERSE_SCANS 1
#define FEATURE_LAST_SCANNED_ROW_RESPONSES 4

#define ROW_ARENA_BLOCK_BYTES ((size_t)64 << 10)
/* Row buffers above this are freed between rows, so one huge row does not pin its memory for the
 * rest of the scan; below it they are reused, with no allocation per row. */
#define ROW_BUF_KEEP_BYTES ((size_t)1 << 20)

typedef struct read_state {
    node_ctx *n;
    rpc_call *call;
    char table[NODE_TABLE_NAME_MAX + 1];
    node_rowset rs;      /* in the call's arena */
    node_filter *filter; /* prepared; NULL = whole rows */
    /* The filter's head, applied to each cell as it arrives, so the row holds only what it keeps;
     * its rest (stream.rest, NULL: none) runs over the complete row (node_filter_stream_init). */
    node_filter_stream stream;
    node_filter_cost rest_cost; /* of stream.rest: its work over a row (row_finish) */
    bool reversed, stats_full, last_scanned_ok;
    int64_t rows_limit; /* 0 = none */

    sto_snapshot *snap;
    uint64_t snap_tablet;
    uint64_t snap_bytes; /* sto_snapshot_read_bytes(snap) already added to read_bytes */
    sto_iter *it;
    bool scan_done;

    /* Work done, for the turn bounds: counted over the whole read, compared with the values
     * at the turn's start. work: cells read and the filter run on them (READ_TURN_WORK). */
    int64_t pieces;
    uint64_t read_bytes, work;
    int64_t turn_rows, turn_pieces0;
    uint64_t turn_bytes0, turn_work0;

    bool row_open; /* the row being assembled or sent (its buffers are below) */
    size_t row_bytes;
    size_t row_value_bytes; /* of the cells kept (the work of a value regex grows with them) */
    int64_t row_cells;      /* cells of the open row counted in cells_seen */
    /* A complete row is encoded into rowenc a part per turn (row_emit): emit_out, the filter's
     * result (NULL: the row's cells as assembled), emit_n cells, emit_next encoded so far. */
    bool emitting;
    const node_cell *const *emit_out;
    size_t emit_n, emit_next;
    size_t emit_bytes; /* node_read_cell_bytes of the cells encoded, plus the key */
    /* The first cell of the row after the one going out, counted in cells_seen and not yet
     * added; its slices are the iterator's, valid until its next call. */
    bool pending;
    sto_cell pending_cell;
    st_rng rng;

    bool scanned_unreported;
    int64_t rows_seen, rows_returned, cells_seen, cells_returned;
    int64_t start_us;

    /* When the node's table of this name was created as the read began: one deleted and created
     * again under the read has another, and the read does not go on in it (table_same). */
    int64_t table_created_us;

    bool in_turn, turn_scheduled, waiting_writable, writable_cb_set;
    struct read_state *turn_next; /* in the node's queue of turns for the next pass */
    struct read_state *pool_next; /* in the node's pool of idle states */

    /* Kept when the state goes back to the pool (read_state_get resets everything above this
     * point and empties these), so a read allocates nothing once the pool is warm. */
    node_scan scan;
    st_buf row_key;
    st_buf cellv;       /* node_cell[]; their slices are set from celloff at row_finish */
    st_buf celloff;     /* cell_off[]: where each cell's bytes are in rowdata */
    st_buf rowdata;     /* copies of this row's families, qualifiers and values */
    st_buf cellp;       /* const node_cell *[]: the row's cells as row_finish hands them on */
    st_arena row_arena; /* filter results and scratch (only filters allocate here) */
    st_buf batch;       /* ReadRowsResponse wire bytes: chunks of whole rows */
    st_buf rowenc;      /* the chunks of the row being encoded, after RPC_SEND_HEADROOM bytes */
    st_buf scanned_key; /* last row processed but not returned (filtered out) */
} read_state;

static void read_turn(read_state *r);
static void read_fail(read_state *r, const st_err *err);
static read_state *turns_pop(node_ctx *n);

/* ---- lifecycle ---- */

static void read_bufs_free(read_state *r) {
    node_scan_deinit(&r->scan);
    st_buf_free(&r->row_key);
    st_buf_free(&r->cellv);
    st_buf_free(&r->celloff);
    st_buf_free(&r->rowdata);
    st_buf_free(&r->cellp);
    st_buf_free(&r->batch);
    st_buf_free(&r->rowenc);
    st_buf_free(&r->scanned_key);
    st_arena_deinit(&r->row_arena);
}

/* Empties b; frees its memory when it grew large. */
static void buf_recycle(st_buf *b) {
    if (b->cap > ROW_BUF_KEEP_BYTES)
        st_buf_free(b);
    else
        st_buf_reset(b);
}

/* Releases what the read holds and parks the state, buffers included, in the node's pool (at
 * most NODE_READ_POOL_MAX states, each buffer at most ROW_BUF_KEEP_BYTES), or frees it. */
static void read_free(read_state *r) {
    if (r->it)
        sto_iter_free(r->it);
    if (r->snap)
        sto_snapshot_free(r->snap);
    node_filter_release(r->filter);
    node_filter_stream_deinit(&r->stream);
    node_ctx *n = r->n;
    if (n->read_pool_n >= NODE_READ_POOL_MAX) {
        read_bufs_free(r);
        free(r);
        return;
    }
    buf_recycle(&r->scan.pos);
    buf_recycle(&r->scan.lo);
    buf_recycle(&r->scan.hi);
    buf_recycle(&r->row_key);
    buf_recycle(&r->cellv);
    buf_recycle(&r->celloff);
    buf_recycle(&r->rowdata);
    buf_recycle(&r->cellp);
    buf_recycle(&r->batch);
    buf_recycle(&r->rowenc);
    buf_recycle(&r->scanned_key);
    st_arena_deinit(&r->row_arena);
    r->pool_next = n->read_pool;
    n->read_pool = r;
    n->read_pool_n++;
}

/* A zeroed state (buffers empty), from the pool when it has one. */
static read_state *read_state_get(node_ctx *n) {
    read_state *r = n->read_pool;
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r)
            st_arena_init(&r->row_arena, ROW_ARENA_BLOCK_BYTES);
        return r;
    }
    n->read_pool = r->pool_next;
    n->read_pool_n--;
    memset(r, 0, offsetof(read_state, scan));
    return r;
}

void node_read_pool_free(node_ctx *n) {
    /* Reads still queued for a turn belong to calls the server cancelled: their turns end them. */
    while (n->read_turns_head)
        read_turn(turns_pop(n));
    if (n->read_turns_ev)
        event_free(n->read_turns_ev);
    n->read_turns_ev = NULL;
    while (n->read_pool) {
        read_state *r = n->read_pool;
        n->read_pool = r->pool_next;
        read_bufs_free(r);
        free(r);
    }
    n->read_pool_n = 0;
}

/* Ends the call with code/msg and frees the scan. */
static void read_end(read_state *r, st_code code, const char *msg) {
    if (code != ST_OK && code != ST_CANCELLED)
        st_log(ST_LOG_DEBUG, "read", "table=%s code=%s msg=\"%s\"", r->table, st_code_name(code),
               msg ? msg : "");
    rpc_call_finish(r->call, code, msg);
    read_free(r);
}

static void on_cancel(rpc_call *call, void *arg) {
    (void)call;
    read_state *r = arg;
    /* A turn in progress or scheduled sees rpc_call_cancelled and ends the call itself. */
    if (r->in_turn || r->turn_scheduled)
        return;
    read_end(r, ST_CANCELLED, NULL);
}

/* ---- turns ----
 * A read's next turn waits for the loop's next pass, after the loop polled its sockets, so other
 * clients' calls are served between two turns. The turns due run from one node-wide queue, oldest
 * first, until they took NODE_READ_PASS_US of the pass; the others wait for the next pass. A
 * first turn and one resumed by room to send run at once while the pass has time left, so a
 * point read costs no extra pass. So a pass runs one turn over its share (two when the queue was
 * put off in the pass before: at least one queued turn runs every other pass, however many new
 * reads come), however many reads are due: turns over 100 MiB values no longer add up in one
 * pass, and the loop polls its sockets between them. */

/* One microsecond, not a zero timeout: libevent's zero-timeout event runs in the same pass over
 * the active events, before the loop polls again. One microsecond puts it in the timer heap,
 * which the loop looks at only after the poll. */
#define READ_TURN_DELAY_US 1

/* Whether the reads' turns of this pass of the loop took less than NODE_READ_PASS_US. libevent
 * caches the time once a pass, after its poll, so a new cached time is a new pass. */
static bool pass_has_room(node_ctx *n) {
    struct timeval tv;
    if (event_base_gettimeofday_cached(n->base, &tv) == 0) {
        int64_t at = (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
        if (at != n->read_pass_at) {
            n->read_pass_at = at;
            n->read_pass_us = 0;
        }
    }
    return n->read_pass_us < NODE_READ_PASS_US;
}

/* Runs one turn of r and counts its time against the pass (r may be freed). */
static void run_turn(read_state *r) {
    node_ctx *n = r->n;
    int64_t t0 = st_mono_us();
    read_turn(r);
    n->read_pass_us += st_mono_us() - t0;
}

static read_state *turns_pop(node_ctx *n) {
    read_state *r = n->read_turns_head;
    n->read_turns_head = r->turn_next;
    if (n->read_turns_head == NULL)
        n->read_turns_tail = NULL;
    n->read_turns_n--;
    r->turn_next = NULL;
    r->turn_scheduled = false;
    return r;
}

static void turns_arm(node_ctx *n) {
    struct timeval soon = {0, READ_TURN_DELAY_US};
    if (!event_pending(n->read_turns_ev, EV_TIMEOUT, NULL))
        event_add(n->read_turns_ev, &soon);
}

/* The turns queued before this pass, oldest first, while the pass has room; turns scheduled
 * by them wait for the next pass. */
static void on_turns(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_ctx *n = arg;
    size_t due = n->read_turns_n;
    for (size_t i = 0; i < due && n->read_turns_head; i++) {
        /* A pass whose share went to turns run at once leaves the queue for the next one, but
         * never twice in a row: the queued reads go on however many new ones come. */
        if (!pass_has_room(n) && (i > 0 || !n->read_turns_put_off)) {
            n->read_turns_put_off = i == 0;
            break;
        }
        n->read_turns_put_off = false;
        run_turn(turns_pop(n));
    }
    if (n->read_turns_head)
        turns_arm(n);
}

/* Queues r's next turn for the next pass of the loop. */
static st_code schedule_turn(read_state *r) {
    node_ctx *n = r->n;
    if (n->read_turns_ev == NULL) {
        n->read_turns_ev = event_new(n->base, -1, 0, on_turns, n);
        if (n->read_turns_ev == NULL)
            return ST_RESOURCE_EXHAUSTED;
    }
    r->turn_next = NULL;
    if (n->read_turns_tail)
        n->read_turns_tail->turn_next = r;
    else
        n->read_turns_head = r;
    n->read_turns_tail = r;
    n->read_turns_n++;
    r->turn_scheduled = true;
    turns_arm(n);
    return ST_OK;
}

/* schedule_turn, the read failed when it cannot be: whether it was scheduled. */
static bool schedule_or_fail(read_state *r) {
    if (schedule_turn(r) == ST_OK)
        return true;
    st_err err;
    st_err_set(&err, ST_RESOURCE_EXHAUSTED, "could not schedule the next part of the read");
    read_fail(r, &err);
    return false;
}

/* A turn that need not wait for a poll (a read's first, or one resumed by room to send): now
 * while this pass has room, else queued. */
static void turn_soon(read_state *r) {
    if (pass_has_room(r->n))
        run_turn(r);
    else
        schedule_or_fail(r);
}

static void on_writable(rpc_call *call, void *arg) {
    (void)call;
    read_state *r = arg;
    if (!r->waiting_writable)
        return;
    r->waiting_writable = false;
    turn_soon(r);
}

/* ---- output ---- */

/* The batch starts with RPC_SEND_HEADROOM free bytes, so rpc_call_send_buf can hand it to the
 * call without copying it (the call's queue is usually empty: a swap). Call before appending. */
static st_code batch_open(read_state *r) {
    static const uint8_t room[RPC_SEND_HEADROOM];
    if (r->batch.len == 0 && st_buf_append(&r->batch, room, sizeof room) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* Bytes of ReadRowsResponse batched. */
static size_t batch_bytes(const read_state *r) {
    return r->batch.len > RPC_SEND_HEADROOM ? r->batch.len - RPC_SEND_HEADROOM : 0;
}

static st_code append_stats(read_state *r) {
    /* A read stopped by rows_limit has read the first cell of the next row, whose row it never
     * saw: not counted, as rows_seen does not count that row (nor the emulator that cell). */
    int64_t unseen = (r->row_open ? r->row_cells : 0) + (r->pending ? 1 : 0);
    btu_read_stats st = {r->rows_seen, r->rows_returned, r->cells_seen - unseen, r->cells_returned};
    if (batch_open(r) != ST_OK || st_buf_reserve(&r->batch, BTU_READ_STATS_BYTES_MAX) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    r->batch.len +=
        btu_read_stats_pack(&st, st_mono_us() - r->start_us, r->batch.data + r->batch.len);
    return ST_OK;
}

/* Sends the batch as one ReadRowsResponse (if non-empty) and empties it. */
static st_code send_batch(read_state *r) {
    if (batch_bytes(r) == 0)
        return ST_OK;
    st_code rc = rpc_call_send_buf(r->call, &r->batch);
    if (rc != ST_RESOURCE_EXHAUSTED) /* kept when the queue is full: sent once it has room */
        st_buf_reset(&r->batch);
    return rc;
}

/* At a turn's end: the rows batched so far, then (if the client takes them) a message telling
 * how far the scan got past rows the filter dropped, so a retry can skip them. */
static st_code flush(read_state *r) {
    st_code rc = send_batch(r);
    if (rc == ST_OK && r->scanned_unreported && r->last_scanned_ok) {
        if (batch_open(r) != ST_OK ||
            node_read_encode_last_scanned(&r->batch, st_buf_slice(&r->scanned_key)) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        r->scanned_unreported = false;
        rc = send_batch(r);
    }
    return rc;
}

/* ---- reading: pieces of the row set, cells, rows ---- */

/* True for [k, k + "\0"): exactly row k (a row key of the request's row set). Storage gets it as
 * the closed range [k, k], which it recognises as a point read and answers through the SSTables'
 * bloom filters instead of seeking every table; the rows selected are the same. */
static bool piece_is_one_row(const node_key_range *p) {
    return p->start.len > 0 && p->end.len == p->start.len + 1 && p->end.data[p->start.len] == 0 &&
           memcmp(p->start.data, p->end.data, p->start.len) == 0;
}

/* When this node's table named table was created; 0 when there is none. */
static int64_t table_created_us(node_ctx *n, const char *table) {
    const node_table *meta = node_catalog_find(n->catalog, table);
    return meta ? meta->create_time_us : 0;
}

static st_code table_gone(const read_state *r, st_err *err) {
    return st_err_set(err, ST_NOT_FOUND,
                      "table \"%s\" was deleted during the read (a table created under its name "
                      "since is another table); read it again",
                      r->table);
}

/* The read's table, unless it was deleted since the read began (it waits for its client between
 * turns: a table created meanwhile under the same name must not continue it). */
static node_tablets *table_same(read_state *r) {
    node_tablets *t = node_tablets_find(r->n, r->table);
    return t && table_created_us(r->n, r->table) == r->table_created_us ? t : NULL;
}

/* Returned by open_next_piece (and so by next_cell and read_row) when the read's table was
 * deleted: err says NOT_FOUND, which the call ends with. Not ST_NOT_FOUND itself: to read_row that
 * is the end of the scan, and the read used to end OK after part of its rows. */
#define READ_TABLE_GONE ST_INTERNAL

static st_code open_next_piece(read_state *r, st_err *err) {
    node_tablets *t = table_same(r);
    if (t == NULL) {
        table_gone(r, err);
        return READ_TABLE_GONE;
    }
    node_key_range piece;
    size_t i;
    st_code rc = node_scan_next(&r->scan, t->v, t->n, &piece, &i);
    if (rc == ST_NOT_FOUND)
        return rc;
    if (rc == ST_FAILED_PRECONDITION) /* the tablet moved away during the read */
        return node_not_owner(r->n, err, r->table, piece.start);
    if (rc != ST_OK)
        return st_err_set(err, rc, "out of memory planning the read");
    node_tablet *tab = &t->v[i];
    r->pieces++;
    if (r->snap == NULL || r->snap_tablet != tab->id) {
        if (r->snap)
            sto_snapshot_free(r->snap);
        r->snap = NULL;
        rc = sto_snapshot_new(tab->st, &r->snap, err);
        if (rc != ST_OK)
            return rc;
        r->snap_tablet = tab->id;
        r->snap_bytes = 0;
    }
    sto_range range = {piece.start, false, piece.end, false};
    if (piece_is_one_row(&piece))
        range = (sto_range){piece.start, false, piece.start, true};
    return sto_iter_new(r->snap, &range, r->reversed, &r->it, err);
}

/* Adds what the snapshot read from disk since the last look to read_bytes. */
static void count_read_bytes(read_state *r) {
    uint64_t now = sto_snapshot_read_bytes(r->snap);
    r->read_bytes += now - r->snap_bytes;
    r->snap_bytes = now;
}

/* A turn's share of work (cell_work, row_finish), in the units of node_filter_weight: a cell
 * read counts at least READ_CELL_WORK_FREE, so a turn without a heavy filter reads
 * NODE_READ_TURN_CELLS cells. */
#define READ_CELL_WORK_FREE 16
#define READ_TURN_WORK ((uint64_t)NODE_READ_TURN_CELLS * READ_CELL_WORK_FREE)

/* Whether the turn has done its share of work, ranges or block reads (checked between two cells,
 * so a row of millions of cells is assembled over many turns; rows are counted in read_turn). */
static bool turn_spent(const read_state *r) {
    return r->work - r->turn_work0 >= READ_TURN_WORK ||
           r->pieces - r->turn_pieces0 >= NODE_READ_TURN_RANGES ||
           r->read_bytes - r->turn_bytes0 >= NODE_READ_TURN_BLOCK_BYTES;
}

/* Returned by next_cell and read_row when the turn must end before the next cell: never a
 * status of the call (storage and filters do not return it to reads). */
#define READ_TURN_OVER ST_ABORTED

/* The next visible cell of the row set; ST_NOT_FOUND at its end, READ_TURN_OVER when the turn
 * is spent (call again in the next turn: the position is kept). */
static st_code next_cell(read_state *r, sto_cell *c, st_err *err) {
    for (;;) {
        if (turn_spent(r))
            return READ_TURN_OVER;
        if (r->it == NULL) {
            st_code rc = open_next_piece(r, err);
            if (rc != ST_OK)
                return rc;
        }
        st_code rc = sto_iter_next(r->it, c, err);
        count_read_bytes(r);
        if (rc != ST_NOT_FOUND)
            return rc;
        sto_iter_free(r->it);
        r->it = NULL;
    }
}

/* Frees the row buffers (a read about to wait: nothing is assembled in them). */
static void row_release(read_state *r) {
    st_buf_free(&r->cellv);
    st_buf_free(&r->celloff);
    st_buf_free(&r->rowdata);
    st_buf_free(&r->cellp);
    st_buf_free(&r->rowenc);
    st_arena_deinit(&r->row_arena);
}

static void row_reset(read_state *r) {
    r->row_open = false;
    r->row_bytes = 0;
    r->row_value_bytes = 0;
    r->emitting = false;
    r->emit_out = NULL;
    buf_recycle(&r->rowenc);
    buf_recycle(&r->cellv);
    buf_recycle(&r->celloff);
    buf_recycle(&r->rowdata);
    buf_recycle(&r->cellp);
    if (r->row_arena.total_bytes > 0) /* deinit leaves it ready for the next row */
        st_arena_deinit(&r->row_arena);
}

/* The row key as printable text for a message (other bytes as '?', long keys cut with "..."). */
static void row_key_text(const read_state *r, char *out, size_t cap) {
    size_t k = 0;
    st_slice rk = st_buf_slice(&r->row_key);
    for (size_t i = 0; i < rk.len && k + 4 < cap; i++)
        out[k++] = rk.data[i] >= 0x20 && rk.data[i] < 0x7f ? (char)rk.data[i] : '?';
    if (k < rk.len) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
}

/* The data the read returns for the row passed NODE_READ_ROW_BYTES_MAX at `bytes`. */
static st_code row_too_large(read_state *r, size_t bytes, st_err *err) {
    char key[100];
    row_key_text(r, key, sizeof key);
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "Error while reading table '%s' : Read returned %zuMiB from row '%s' "
                      "which exceeds the limit of %zuMiB. Make sure you are setting an "
                      "appropriate request filter to retrieve only recent versions and only the "
                      "columns you want.",
                      r->table, bytes >> 20, key, NODE_READ_ROW_BYTES_MAX >> 20);
}

/* The cells the filter's head kept for the part that needs the whole row (stream.rest) passed
 * NODE_READ_ROW_BYTES_MAX: they would be held in memory at once, whatever the rest returns. */
static st_code row_too_large_for_filter(read_state *r, st_err *err) {
    char key[100];
    row_key_text(r, key, sizeof key);
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "Error while reading table '%s' : row '%s' holds more than %zuMiB for the "
                      "row filter's %s, which needs the whole row in memory. Begin the filter "
                      "with a chain of filters that narrow the row cell by cell (family, column, "
                      "timestamp range or value filters, cells_per_column_limit, "
                      "cells_per_row_limit): only the cells they keep are held.",
                      r->table, key, NODE_READ_ROW_BYTES_MAX >> 20,
                      node_filter_kind_name(r->stream.rest->kind));
}

/* What reading a cell with a value of value_len bytes counts against the turn's READ_TURN_WORK:
 * READ_CELL_WORK_FREE, or the work of the filter's head (applied to every cell) when that is
 * more: a filter of 1,800 chained regexes ran 20,000 cells x 1,800 regexes in one turn, tens of
 * seconds. The rest's work is counted when it runs over the row (row_finish). */
static uint64_t cell_work(const read_state *r, size_t value_len) {
    node_filter_cost head = {r->stream.weight, r->stream.value_regexes};
    uint64_t w = r->filter ? node_filter_work(head, 1, value_len) : 0;
    return w > READ_CELL_WORK_FREE ? w : READ_CELL_WORK_FREE;
}

static node_filter_ctx filter_ctx(read_state *r) {
    node_filter_ctx fc = {&r->row_arena, &r->rng, 0};
    return fc;
}

typedef struct cell_off {
    size_t family, qualifier, value;
} cell_off;

/* Appends v to rowdata; *off is where it starts. */
static bool rowdata_add(read_state *r, st_slice v, size_t *off) {
    *off = r->rowdata.len;
    return st_buf_append(&r->rowdata, v.data, v.len) == ST_OK;
}

/* Adds a cell to the open row: through the filter's head when there is a filter (the cells it
 * drops never take memory), its bytes copied into rowdata (the iterator's slices die at its next
 * call). rowdata may move while the row grows, so cells keep offsets until row_finish points them
 * at the final copy. What the row holds is bounded by NODE_READ_ROW_BYTES_MAX: it is what the
 * read returns, or what the filter's rest is given. */
static st_code row_add(read_state *r, const sto_cell *sc, st_err *err) {
    node_cell in = {sc->family, sc->qualifier, sc->ts_us, sc->value, NULL, 0};
    const node_cell *c = &in;
    if (r->filter) {
        node_filter_ctx fc = filter_ctx(r);
        st_code rc =
            node_filter_stream_cell(&r->stream, st_buf_slice(&r->row_key), &in, &fc, &c, err);
        if (rc != ST_OK || c == NULL)
            return rc;
    }
    size_t bytes = node_read_cell_bytes(c);
    size_t held = r->row_bytes + bytes + r->row_key.len;
    if (held > NODE_READ_ROW_BYTES_MAX)
        return r->stream.rest ? row_too_large_for_filter(r, err) : row_too_large(r, held, err);
    node_cell copy = *c;
    cell_off off;
    if (!rowdata_add(r, c->family, &off.family) || !rowdata_add(r, c->qualifier, &off.qualifier) ||
        !rowdata_add(r, c->value, &off.value) ||
        st_buf_append(&r->celloff, &off, sizeof off) != ST_OK ||
        st_buf_append(&r->cellv, &copy, sizeof copy) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory assembling a row");
    r->row_bytes += bytes;
    r->row_value_bytes += c->value.len;
    return ST_OK;
}

static st_code row_start(read_state *r, st_slice key, st_err *err) {
    st_buf_reset(&r->row_key);
    if (st_buf_append(&r->row_key, key.data, key.len) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory assembling a row");
    r->row_open = true;
    node_filter_stream_row_start(&r->stream);
    return ST_OK;
}

/* Points cells [from, to) of the row at their bytes in rowdata, now that the row is complete. */
static void row_cells_settle(read_state *r, size_t from, size_t to) {
    node_cell *cells = (node_cell *)(void *)r->cellv.data;
    const cell_off *off = (const cell_off *)(const void *)r->celloff.data;
    static const uint8_t none[1];
    const uint8_t *base = r->rowdata.data ? r->rowdata.data : none; /* every cell empty */
    for (size_t i = from; i < to; i++) {
        cells[i].family.data = base + off[i].family;
        cells[i].qualifier.data = base + off[i].qualifier;
        cells[i].value.data = base + off[i].value;
    }
}

/* The row went into the batch. */
static st_code row_done(read_state *r) {
    r->rows_returned++;
    r->cells_returned += (int64_t)r->emit_n;
    r->scanned_unreported = false;
    row_reset(r);
    return ST_OK;
}

/* Moves the encoded row into the batch. A row is never split across messages (read.h); a large
 * one goes in a message of its own rather than being copied behind the rows batched. */
static st_code row_commit(read_state *r, st_err *err) {
    size_t enc = r->rowenc.len - RPC_SEND_HEADROOM;
    size_t batched = batch_bytes(r);
    if (batched > 0 &&
        (enc > NODE_READ_BATCH_BYTES ||
         batched + enc + NODE_READ_MESSAGE_SLACK_BYTES > RPC_MESSAGE_BYTES_MAX_DEFAULT) &&
        send_batch(r) != ST_OK)
        return st_err_set(err, ST_CANCELLED, "the call ended while sending");
    if (batch_bytes(r) == 0) {
        st_buf t = r->batch;
        r->batch = r->rowenc;
        r->rowenc = t;
    } else if (st_buf_append(&r->batch, r->rowenc.data + RPC_SEND_HEADROOM, enc) != ST_OK) {
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory encoding a row");
    }
    return row_done(r);
}

/* The next part of the cells going out, as pointers: the filter's result, or the assembled cells
 * settled a part at a time (cellp holds the pointers). */
static const node_cell *const *emit_part(read_state *r, size_t from, size_t to,
                                         const node_cell **prev) {
    if (r->emit_out) {
        *prev = from ? r->emit_out[from - 1] : NULL;
        return r->emit_out + from;
    }
    if (st_buf_reserve(&r->cellp, (to - from) * sizeof(node_cell *)) != ST_OK)
        return NULL;
    row_cells_settle(r, from, to);
    const node_cell *cells = (const node_cell *)(const void *)r->cellv.data;
    const node_cell **v = (const node_cell **)(void *)r->cellp.data;
    for (size_t i = from; i < to; i++)
        v[i - from] = &cells[i];
    *prev = from ? &cells[from - 1] : NULL;
    return v;
}

/* The row, of at most NODE_READ_TURN_CELLS cells, encoded straight into the batch (most rows:
 * no copy through rowenc). When the batch then holds too much for one message, the row comes out
 * again and goes into the next one (that is one row per batch at most). */
static st_code row_emit_whole(read_state *r, const node_cell *const *cells, st_err *err) {
    st_slice key = st_buf_slice(&r->row_key);
    for (int attempt = 0;; attempt++) {
        if (batch_open(r) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory encoding a row");
        size_t before = r->batch.len, batched = batch_bytes(r);
        st_code rc = node_read_encode_cells(&r->batch, key, NULL, cells, r->emit_n, true,
                                            NODE_READ_VALUE_CHUNK_BYTES, err);
        size_t enc = r->batch.len - before;
        if (rc != ST_OK || enc + NODE_READ_MESSAGE_SLACK_BYTES > RPC_MESSAGE_BYTES_MAX_DEFAULT) {
            r->batch.len = before;
            return rc != ST_OK ? rc : row_too_large(r, enc, err);
        }
        bool alone = batched == 0 || attempt > 0;
        if (alone ||
            (enc <= NODE_READ_BATCH_BYTES &&
             batched + enc + NODE_READ_MESSAGE_SLACK_BYTES <= RPC_MESSAGE_BYTES_MAX_DEFAULT))
            break;
        r->batch.len = before;
        if (send_batch(r) != ST_OK)
            return st_err_set(err, ST_CANCELLED, "the call ended while sending");
    }
    return row_done(r);
}

/* Encodes the next NODE_READ_TURN_CELLS cells of the complete row into rowenc, so a row of
 * millions of cells does not hold the loop: READ_TURN_OVER while cells remain, then the row goes
 * into the batch. The size limits are checked as the row is encoded. */
static st_code row_emit(read_state *r, st_err *err) {
    size_t from = r->emit_next;
    size_t to = r->emit_n - from > NODE_READ_TURN_CELLS ? from + NODE_READ_TURN_CELLS : r->emit_n;
    const node_cell *prev;
    const node_cell *const *part = emit_part(r, from, to, &prev);
    if (part == NULL)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory encoding a row");
    for (size_t i = 0; i < to - from; i++)
        r->emit_bytes += node_read_cell_bytes(part[i]);
    if (r->emit_bytes > NODE_READ_ROW_BYTES_MAX)
        return row_too_large(r, r->emit_bytes, err);
    if (from == 0 && to == r->emit_n)
        return row_emit_whole(r, part, err);
    st_code rc =
        node_read_encode_cells(&r->rowenc, st_buf_slice(&r->row_key), prev, part, to - from,
                               to == r->emit_n, NODE_READ_VALUE_CHUNK_BYTES, err);
    if (rc != ST_OK)
        return rc;
    size_t enc = r->rowenc.len - RPC_SEND_HEADROOM;
    if (enc + NODE_READ_MESSAGE_SLACK_BYTES > RPC_MESSAGE_BYTES_MAX_DEFAULT)
        return row_too_large(r, enc, err);
    r->emit_next = to;
    return to < r->emit_n ? READ_TURN_OVER : row_commit(r, err);
}

/* The open row is complete: the part of the filter that needs the whole row runs on it (in one
 * piece, within NODE_FILTER_ROW_WORK_MAX, and its work counts against the turn: an interleave of
 * 300 regexes ran over 1,000 rows in one turn, seconds), then it is encoded and sent (row_emit).
 * A row with no cells left is only remembered for last_scanned_row_key. */
static st_code row_finish(read_state *r, st_err *err) {
    size_t n = r->cellv.len / sizeof(node_cell);
    st_slice key = st_buf_slice(&r->row_key);
    st_code rc = ST_OK;
    r->rows_seen++;
    r->emit_out = NULL;
    r->emit_n = n;
    if (r->stream.rest) {
        row_cells_settle(r, 0, n);
        node_filter_ctx fc = filter_ctx(r);
        r->work += node_filter_work(r->rest_cost, n, r->row_value_bytes);
        rc = node_filter_row_work_check(r->rest_cost, n, r->row_value_bytes, err);
        if (rc == ST_OK)
            rc = node_filter_eval(r->stream.rest, key,
                                  (const node_cell *)(const void *)r->cellv.data, n, &fc,
                                  &r->emit_out, &r->emit_n, err);
    }
    if (rc == ST_OK && r->emit_n == 0) { /* scanned, nothing returned: remember for last_scanned */
        st_buf_reset(&r->scanned_key);
        r->scanned_unreported = st_buf_append(&r->scanned_key, key.data, key.len) == ST_OK;
    }
    if (rc != ST_OK || r->emit_n == 0) {
        row_reset(r);
        return rc;
    }
    static const uint8_t room[RPC_SEND_HEADROOM];
    st_buf_reset(&r->rowenc);
    if (r->emit_n > NODE_READ_TURN_CELLS && st_buf_append(&r->rowenc, room, sizeof room) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory encoding a row");
    r->emitting = true;
    r->emit_next = 0;
    r->emit_bytes = key.len;
    return row_emit(r, err);
}

/* Reads until one row is complete and encoded (or dropped). ST_NOT_FOUND at the end of the scan,
 * READ_TURN_OVER when the turn is spent (the row being assembled or encoded waits for the next
 * turn). */
static st_code read_row(read_state *r, st_err *err) {
    if (r->emitting)
        return row_emit(r, err);
    for (;;) {
        sto_cell c;
        st_code rc = ST_OK;
        if (r->pending) {
            c = r->pending_cell;
            r->pending = false;
        } else {
            rc = next_cell(r, &c, err);
            if (rc == ST_NOT_FOUND)
                return r->row_open ? row_finish(r, err) : ST_NOT_FOUND;
            /* Between two pieces the open row is complete (a row lies in one piece): send it
             * now rather than after the turns the next pieces may take. */
            if (rc == READ_TURN_OVER && r->row_open && r->it == NULL)
                return row_finish(r, err);
            if (rc != ST_OK)
                return rc;
            r->cells_seen++;
            r->work += cell_work(r, c.value.len);
        }
        bool new_row = !r->row_open || !st_slice_eq(c.row, st_buf_slice(&r->row_key));
        if (new_row && r->row_open) { /* c waits while the row before it goes out */
            r->pending_cell = c;
            r->pending = true;
            return row_finish(r, err);
        }
        r->row_cells = new_row ? 1 : r->row_cells + 1;
        if (new_row)
            rc = row_start(r, c.row, err);
        if (rc == ST_OK)
            rc = row_add(r, &c, err);
        if (rc != ST_OK)
            return rc;
    }
}

/* ---- turns ---- */

static bool limit_reached(const read_state *r) {
    return r->rows_limit > 0 && r->rows_returned >= r->rows_limit;
}

/* The scan is over: last batch (with request stats when asked for), then OK. */
static void read_complete(read_state *r) {
    if (r->stats_full && append_stats(r) != ST_OK) {
        read_end(r, ST_RESOURCE_EXHAUSTED, "out of memory building request stats");
        return;
    }
    st_code rc = send_batch(r);
    read_end(r, rc == ST_OK ? ST_OK : rc, rc == ST_OK ? NULL : "the response could not be sent");
}

static void read_fail(read_state *r, const st_err *err) {
    send_batch(r); /* whole rows: the client may keep them and resume after the last */
    read_end(r, err->code == ST_OK ? ST_INTERNAL : err->code, err->msg);
}

/* Lets the storage snapshot and iterator go while the read waits (they hold the block they are in,
 * about a value of a table of large values): the open row is dropped and read again from its
 * first cell once the read goes on, in a new snapshot (each row is read atomically; Bigtable does
 * not promise one snapshot for a whole scan, and the router resumes scans in new calls anyway).
 * Kept when the position cannot be told (no row open inside a piece). */
static void read_release_storage(read_state *r) {
    if (r->emitting) /* the pending cell, if any, lives in the iterator */
        return;
    if (r->it && r->pending) { /* the row after the one just sent: read again from its start */
        if (node_scan_rewind(&r->scan, r->pending_cell.row) != ST_OK)
            return;
        sto_iter_free(r->it);
        r->it = NULL;
        r->pending = false;
        r->cells_seen--;
    }
    if (r->it) {
        if (!r->row_open || node_scan_rewind(&r->scan, st_buf_slice(&r->row_key)) != ST_OK)
            return;
        sto_iter_free(r->it);
        r->it = NULL;
        r->cells_seen -= r->row_cells; /* seen again when the row is read again */
        row_reset(r);
    }
    if (r->snap) {
        sto_snapshot_free(r->snap);
        r->snap = NULL;
    }
}

/* Waits for the call to have room (its own queue, and the process's queued-response budget):
 * the RPC layer calls on_writable once it has. Nothing this read produced stays outside the
 * call's queue meanwhile, and its row buffers and storage iterator are given back, so a read
 * whose client does not read holds no more than what the budget counts, plus its state (a row
 * being encoded does not wait for room, see turn_yield, except when the call's own queue is
 * full: it is kept then). */
static void read_wait(read_state *r) {
    r->waiting_writable = true;
    r->in_turn = false;
    read_release_storage(r);
    if (!r->row_open)
        row_release(r);
    if (r->batch.len == 0)
        st_buf_free(&r->batch);
    /* Registered the first time the read must wait (most reads never do): the RPC layer then
     * calls on_writable from the loop once there is room (at once if there already is). */
    if (!r->writable_cb_set) {
        r->writable_cb_set = true;
        rpc_call_set_writable_cb(r->call, on_writable, r);
    }
}

/* Ends the turn (r->in_turn is still set): sends what the turn batched, then waits for room or
 * schedules the next turn. Frees r when the call ends here. */
static void turn_yield(read_state *r) {
    st_code rc = flush(r);
    if (rc == ST_RESOURCE_EXHAUSTED) { /* the call's own queue is full: the batch waits */
        read_wait(r);
        return;
    }
    if (rc != ST_OK) {
        read_end(r, ST_CANCELLED, NULL);
        return;
    }
    /* A row being encoded goes on whether or not the call has room: it sends nothing until it
     * is complete, and dropping it to wait would start its encoding over. */
    if (!r->emitting && !rpc_call_writable(r->call)) {
        read_wait(r);
        return;
    }
    if (!schedule_or_fail(r))
        return;
    r->in_turn = false;
}

/* Whether the turn should end before the next row. */
static bool turn_done(const read_state *r) {
    return batch_bytes(r) >= NODE_READ_BATCH_BYTES || r->turn_rows >= NODE_READ_TURN_ROWS ||
           turn_spent(r);
}

static void read_turn(read_state *r) {
    r->turn_rows = 0;
    r->turn_work0 = r->work;
    r->turn_pieces0 = r->pieces;
    r->turn_bytes0 = r->read_bytes;
    r->in_turn = true;
    for (;;) {
        if (rpc_call_cancelled(r->call)) {
            read_end(r, ST_CANCELLED, NULL);
            return;
        }
        if (r->scan_done || limit_reached(r)) {
            read_complete(r);
            return;
        }
        /* No room (a scheduled turn, or the first): produce nothing until there is. */
        if (r->turn_rows == 0 && !r->emitting && !rpc_call_writable(r->call)) {
            read_wait(r);
            return;
        }
        if (turn_done(r))
            break;
        st_err err;
        st_err_clear(&err);
        st_code rc = read_row(r, &err);
        if (rc == READ_TURN_OVER)
            break;
        if (rc == ST_NOT_FOUND) {
            r->scan_done = true;
        } else if (rc != ST_OK) {
            if (err.code == ST_OK)
                st_err_set(&err, rc, "the read failed");
            read_fail(r, &err);
            return;
        }
        r->turn_rows++;
    }
    turn_yield(r);
}

/* ---- the handler ---- */

/* Every row of the row set must be held here; otherwise strata-not-owner before any data. */
static st_code check_owned(read_state *r, node_tablets *t, st_err *err) {
    if (t->n == 1 && t->v[0].start.len == 0 && t->v[0].end.len == 0)
        return ST_OK; /* one tablet holds every row (a standalone node's usual map) */
    st_buf key;
    st_buf_init(&key);
    st_code rc = node_scan_uncovered(&r->rs, t->v, t->n, &key);
    if (rc == ST_FAILED_PRECONDITION)
        node_not_owner(r->n, err, r->table, st_buf_slice(&key));
    else if (rc != ST_OK)
        st_err_set(err, rc, "out of memory planning the read");
    st_buf_free(&key);
    return rc;
}

static st_code check_request(node_ctx *n, rpc_call *call,
                             const Google__Bigtable__V2__ReadRowsRequest *req, st_err *err) {
    (void)n;
    if (req->table_name[0] == 0 && req->authorized_view_name[0] != 0)
        return st_err_set(err, ST_UNIMPLEMENTED, "authorized views are not supported");
    if (req->rows_limit < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field 'rows_limit' : must be non-negative, got %lld",
                          (long long)req->rows_limit);
    /* Cloud Bigtable rejects reversed scans from clients that did not announce them
     * (docs/bigtable.md, Request headers). */
    if (req->reversed && !node_feature(call, FEATURE_REVERSE_SCANS))
        return st_err_set(err, ST_UNIMPLEMENTED, "Client doesn't support reverse scans yet");
    return ST_OK;
}

/* Pins the table the read is in. A router resuming a read in a new call names the table it began
 * in (BTU_TABLE_CREATED_HEADER, from ListTablets): another one of that name is refused. */
static st_code pin_table(read_state *r, st_err *err) {
    r->table_created_us = table_created_us(r->n, r->table);
    const char *v = rpc_call_header(r->call, BTU_TABLE_CREATED_HEADER);
    if (!v)
        return ST_OK;
    char *end;
    long long want = strtoll(v, &end, 10);
    if (end == v || *end)
        return st_err_set(err, ST_INVALID_ARGUMENT, "malformed %s header \"%.40s\"",
                          BTU_TABLE_CREATED_HEADER, v);
    return want == r->table_created_us ? ST_OK : table_gone(r, err);
}

static read_state *read_state_new(node_ctx *n, rpc_call *call,
                                  const Google__Bigtable__V2__ReadRowsRequest *req) {
    read_state *r = read_state_get(n);
    if (r == NULL)
        return NULL;
    r->n = n;
    r->call = call;
    size_t len = strnlen(req->table_name, NODE_TABLE_NAME_MAX); /* checked by now anyway */
    memcpy(r->table, req->table_name, len);
    r->table[len] = 0;
    r->reversed = req->reversed;
    r->rows_limit = req->rows_limit;
    r->stats_full = req->request_stats_view ==
                    GOOGLE__BIGTABLE__V2__READ_ROWS_REQUEST__REQUEST_STATS_VIEW__REQUEST_STATS_FULL;
    r->last_scanned_ok = node_feature(call, FEATURE_LAST_SCANNED_ROW_RESPONSES);
    st_rng_seed(&r->rng, (uint64_t)st_mono_us() ^ (uint64_t)(uintptr_t)r);
    r->start_us = st_mono_us();
    return r;
}

void node_h_read_rows(rpc_call *call, st_slice bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__ReadRowsRequest *req =
        (Google__Bigtable__V2__ReadRowsRequest *)node_unpack(
            call, &google__bigtable__v2__read_rows_request__descriptor, bytes);
    if (req == NULL)
        return;
    st_err err;
    st_err_clear(&err);
    if (check_request(n, call, req, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    node_tablets *t = node_table_or_fail(n, call, req->table_name, NULL);
    if (t == NULL)
        return;
    read_state *r = read_state_new(n, call, req);
    if (r == NULL) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory starting the read");
        return;
    }
    st_code rc = node_rowset_from_pb(req->rows, rpc_call_arena(call), &r->rs, &err);
    if (rc == ST_OK)
        rc = node_filter_from_pb(req->filter, rpc_call_arena(call), &r->filter, &err);
    if (rc == ST_OK &&
        node_filter_stream_init(&r->stream, r->filter, rpc_call_arena(call)) != ST_OK)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory preparing the row filter");
    if (rc == ST_OK)
        rc = pin_table(r, &err);
    if (rc == ST_OK)
        rc = check_owned(r, t, &err);
    if (rc != ST_OK) {
        read_end(r, err.code, err.msg);
        return;
    }
    r->rest_cost = node_filter_cost_of(r->stream.rest);
    node_scan_restart(&r->scan, &r->rs, r->reversed);
    rpc_call_set_cancel_cb(call, on_cancel, r);
    turn_soon(r);
}
