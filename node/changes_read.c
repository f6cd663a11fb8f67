/* changes_read.c — the read side of change streams on the node (docs/changestreams.md, Reading):
 * GenerateInitialChangeStreamPartitions (one partition per local tablet) and ReadChangeStream
 * for a partition within one local tablet (usually equal to it).
 *
 * The reader keeps a position `pos` (what its tokens say: every record of the partition with
 * stamp <= pos.w was sent, and during a catch-up scan the records in (w, h] of rows up to
 * pos.key too) and works in two modes:
 *   - live: the ring (node_cs_ring_scan) gives the records with stamps in (w, resolved]; a
 *     watcher wakes the reader when new ones resolve;
 *   - catch-up: when the ring does not reach back to w, a snapshot of the tablet is scanned in
 *     key order for records with stamps in (w, h], h the resolved stamp when the scan began.
 *     Stored records may hold SetCell values by reference (NODE_CS_REC_REFS): the scan holds a
 *     row's records (its system cells come first) until it has passed the row's user cells,
 *     which give those values as the cells have them now (none for a cell gone since); a row
 *     with more records than a hold takes is looked up with an iterator of its own.
 * Each record waits in `pending` until the reader knows which token it may carry: in live mode a
 * write's records share its stamp, so only the last of them may say "1.stamp"; in a scan only the
 * last record of a row may name that row. Between records the reader stops when the call's queue
 * is full (and resumes from rpc_call_set_writable_cb) or when the turn did its share of work
 * (then the next turn is a timer, so other calls run in between), as ReadRows does (read.c).
 * Live mode stops only between two writes' records, so one write's records (bounded by one
 * request's size) are queued at once, except that the last record of a write, and any record a
 * scan sends, may stop between two of its messages (a 100 MiB cell): the next turn resumes it
 * before anything else is sent (resume_record).
 *
 * A router asks for batches (BTU_CS_BATCH_HEADER): a turn's DataChange messages then go out as
 * one message holding them framed for the client (batch_flush), so the call queues once per turn.
 *
 * Heartbeats go out every heartbeat_duration without other tokens; the stream ends with
 * CloseStream OK once the position passes end_time, and with CloseStream OUT_OF_RANGE (new
 * partitions and a token for each) when its tablet split, merged or moved away. A cancelled call
 * (client gone, deadline, node closing) frees everything from its cancel callback. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "changes.h"
#include "changes_msg.h"
#include "repl_glue.h"
#include "strata/cstoken.h"

#define CS_HEARTBEAT_US_DEFAULT (5 * 1000000LL)
/* heartbeat_duration is raised to this, and lowered to the max, so a stream cannot spin. */
#define CS_HEARTBEAT_US_MIN (100 * 1000LL)
#define CS_HEARTBEAT_US_MAX (24 * 3600 * 1000000LL)
/* Work per loop turn: records sent, cells scanned, bytes queued, block bytes read. */
#define CS_TURN_RECORDS 1000
#define CS_TURN_CELLS 20000
#define CS_TURN_SEND_BYTES ((size_t)1 << 20)
#define CS_TURN_BLOCK_BYTES ((uint64_t)8 << 20)
/* A scan holds at most this many records (or record bytes) of one row before it looks their
 * values up and sends them (a row with a long history in the window). */
#define CS_HOLD_RECORDS 256
#define CS_HOLD_BYTES ((size_t)1 << 20)
#define CS_HOLD_ARENA_BYTES 8192 /* a row's records and values: one block in the common case */
/* Past end_time while writes are still in flight: look again this soon. */
#define CS_END_RECHECK_US 10000
/* The next turn after the loop's next poll of the sockets (read.c, READ_TURN_DELAY_US). */
#define CS_TURN_DELAY_US 1
/* Reader turns of one node run back to back for at most CS_BURST_US before the loop serves its
 * sockets; a gap of CS_BURST_GAP_US between turns ends a burst (turn_may_run). */
#define CS_BURST_US 20000
#define CS_BURST_GAP_US 500
/* One record's decoding and message structs (values are not copied into it): a small block,
 * rewound after every record and kept for the reader's life (st_arena_reset), so a record costs
 * no malloc; a record that needed more gives the extra blocks back at once. */
#define CS_ARENA_BLOCK_BYTES ((size_t)8 << 10)
/* Buffers above this are freed after use instead of kept for the next record. */
#define CS_BUF_KEEP_BYTES ((size_t)1 << 20)

/* Results of the work functions besides ST_OK (caught up) and the call's error codes; never a
 * status of the call. */
#define CS_MORE ST_ABORTED         /* the turn's share is done: go on in the next turn */
#define CS_BLOCKED ST_OUT_OF_RANGE /* the call's queue is full: go on once it drains */
#define CS_AGAIN ST_ALREADY_EXISTS /* switched between live and catch-up: go on at once */

/* A record waiting for its token: during a ring scan its value is read where the ring holds it
 * (in_ring); one still waiting when the scan stops is copied into value, since the ring may
 * change before the next turn. */
typedef struct cs_rec {
    bool set, in_ring;
    bool body; /* the value is the record's DataChange body (node_cs_rec.body) */
    int64_t stamp;
    st_slice ring_value;
    st_buf value;
} cs_rec;

/* A catch-up scan holds a row's records until it has passed the row's user cells, which give
 * the values the records hold by reference (NODE_CS_REC_REFS). */
typedef struct cs_held {
    int64_t stamp;
    sto_row_mut row; /* decoded in cs_hold.arena */
} cs_held;

typedef struct cs_ref {
    sto_mut *m; /* a SetCell of a held record whose value is to be found (in cs_hold.arena) */
} cs_ref;

typedef struct cs_reader cs_reader;

typedef struct cs_hold {
    st_arena arena; /* the records, their decodings and the values found */
    cs_held *v;
    size_t n, cap;
    /* A flush paused inside a record (cs_out): v[0..sent) went out, and the flush goes on with
     * last_pos as it began. */
    bool flushing;
    size_t sent;
    void (*last_pos)(cs_reader *r);
    /* The held SetCells by reference, sorted by family, qualifier and timestamp before the
     * first lookup (a row's cells each find theirs by a binary search: a row may hold 100,000
     * of them); unresolved: those no cell has matched yet. */
    cs_ref *refs;
    size_t n_refs, cap_refs, unresolved;
    bool sorted;
    size_t bytes;
} cs_hold;

struct cs_reader {
    int64_t wm_sent; /* the last low watermark sent (watermark) */
    size_t kept;     /* the request's bytes, kept with the call (n->cs_kept_bytes) */
    node_ctx *n;
    rpc_call *call;
    char table[NODE_TABLE_NAME_MAX + 1];
    uint32_t table_tag; /* btu_cs_table_tag(table), in every token */
    uint64_t tablet_id;
    int64_t since_us; /* the table's cs_since_us when the stream began */
    st_buf start, end;
    bool has_end;
    int64_t end_us;
    int64_t hb_us, hb_due; /* heartbeat interval; st_mono_us of the next one */
    btu_cs_pos pos;
    bool scanning;
    int64_t scan_h;
    sto_snapshot *snap;
    sto_iter *it;
    st_buf scan_from;
    st_buf scan_row; /* the row of the scan's last cell (empty before the first) */
    uint64_t snap_bytes;
    cs_rec pending;
    cs_hold hold;
    int64_t turn_records, turn_cells;
    size_t turn_sent;
    uint64_t turn_blocks;
    st_code stop; /* why the ring scan stopped: CS_MORE or CS_BLOCKED */
    st_err fail;  /* a failure inside the ring callback */
    node_cs_watcher watcher;
    bool watching, waiting_writable, writable_cb_set;
    bool put_off;           /* its last turn waited for the loop (turn_may_run) ... */
    uint64_t put_off_burst; /* ... in this burst */
    struct event *timer;
    st_arena arena; /* one record's decoding and messages */
    st_buf msg;
    /* The router asked for batches (BTU_CS_BATCH_HEADER): a turn's DataChange messages gather
     * in batch (the outer message's headroom and head, then each message framed) and go out as
     * one message when the turn ends, when a heartbeat or CloseStream follows, or once it holds
     * BTU_CS_BATCH_BYTES (batch_flush). */
    bool batching;
    size_t batch_max; /* the frames a batch may hold: BTU_CS_BATCH_BYTES, less under a smaller
                       * --max-message-bytes, since the batch goes out as one message */
    st_buf batch;
    char token[BTU_CS_TOKEN_MAX];
    bool token_live; /* token holds the live token of token_w */
    int64_t token_w;
    /* A live token's text up to its W ("1." or "2.C.Y."): the next live token with the same
     * cluster and bound only writes its W after it. */
    size_t token_head;
    bool token_has_y;
    uint32_t token_cluster;
    int64_t token_y;
    /* A record of several messages goes out over several turns (docs/changestreams.md, Sending
     * large records): out_pos is the first chunk of the record being sent that has not gone
     * out (chunk 0: no record is in the middle of being sent), kept so that each turn encodes
     * only what it sends, out_pause whether the sending code may
     * pause the record now. The record is pending's (live) or the hold's (a scan). */
    node_cs_pos out_pos;
    bool out_pause;
    /* The scan's cell read before a flush paused: handled first in the next turn. */
    bool stashed;
    sto_cell stash;
    st_buf stash_buf;
};

static void cs_turn(cs_reader *r);
static void cs_turn_run(cs_reader *r);

/* ---- small helpers ---- */

static st_slice S(const st_buf *b) {
    return st_buf_slice(b);
}

static bool buf_set(st_buf *b, st_slice s) {
    st_buf_reset(b);
    return st_buf_append(b, s.data, s.len) == ST_OK;
}

static void buf_recycle(st_buf *b) {
    if (b->cap > CS_BUF_KEEP_BYTES)
        st_buf_free(b);
    else
        st_buf_reset(b);
}

/* Formats the current position's token. Live tokens mostly differ from the last one in their W
 * only (the bound moves four times a second): the rest of the text is kept. */
static void token_format(cs_reader *r) {
    const btu_cs_pos *p = &r->pos;
    bool same_head = r->token_live && !p->scan && p->w >= 0 && p->has_y == r->token_has_y &&
                     (!p->has_y || (p->cluster == r->token_cluster && p->y == r->token_y));
    if (same_head) {
        size_t k = r->token_head + btu_cs_dec(r->token + r->token_head, (uint64_t)p->w);
        r->token[k] = 0;
    } else {
        btu_cs_token_format(p, r->token);
        r->token_head = (size_t)(strrchr(r->token, '.') - r->token) + 1; /* live: W is last */
    }
    r->token_live = !p->scan && p->w >= 0;
    r->token_w = p->w;
    r->token_has_y = p->has_y;
    r->token_cluster = p->cluster;
    r->token_y = p->y;
}

/* The current position's token. Live, the records of one write share it: formatted once. With
 * peer clusters it carries this cluster's number and the applied bound at the position (a
 * version 2 token), so that another cluster can resume from it (docs/changestreams.md,
 * Failover); a bound set earlier stays valid as the position moves on. */
static const char *token_text(cs_reader *r) {
    if (r->pos.scan || !r->token_live || r->token_w != r->pos.w) {
        int64_t y = node_repl_applied_bound(r->n, r->pos.w);
        /* A bound this cluster gave the position before (the request's token, an earlier
         * token of this reader) still holds at a later position: keep the larger one. */
        if (y != INT64_MAX && r->pos.has_y && r->pos.cluster == r->n->opts.cluster_num &&
            r->pos.y > y)
            y = r->pos.y;
        if (y == INT64_MAX)
            r->pos.has_y = false; /* nothing is replicated here: a version 1 token */
        else
            btu_cs_pos_set_bound(&r->pos, r->n->opts.cluster_num, y);
        r->pos.has_table = true; /* refused if handed to another table's stream */
        r->pos.table = r->table_tag;
        token_format(r);
    }
    return r->token;
}

/* The low watermark sent with the position: no record still to come has an earlier commit time.
 * This cluster's own writes come at stamps above the position, and a write's stamp is at or
 * below its rows' commit times (write_stamp). Writes of other clusters come when replication
 * brings them, with their origin's commit time: with peer clusters the watermark is also held at
 * the applied bound Y the position's token carries (every write committed elsewhere at or before
 * Y was applied here at or below the position), so it waits for a peer that is behind or cut off
 * instead of passing the writes it has not delivered yet. While the node knows no bound (0: its
 * first poll of the peers has not answered, a peer has been unreachable since the node started,
 * or the position predates every bound it kept) the watermark holds where the stream had it: a
 * node that just started has the largest backlog of replicated writes still to come, committed
 * long before its position. A stream that has sent none yet sends 0 (no estimate) then, unless
 * its token's bound (this cluster's, kept by token_text) says more. A stream's watermark never
 * goes back. */
static int64_t watermark(cs_reader *r) {
    (void)token_text(r); /* the position's bound, looked up once per position */
    int64_t wm = r->pos.w;
    if (r->pos.has_y && r->pos.cluster == r->n->opts.cluster_num) {
        if (r->pos.y == 0)
            wm = r->wm_sent; /* no bound known: hold */
        else if (r->pos.y < wm)
            wm = r->pos.y;
    }
    if (wm < r->wm_sent)
        wm = r->wm_sent;
    r->wm_sent = wm;
    return wm;
}

/* ---- lifecycle ---- */

static void scan_free(cs_reader *r) {
    if (r->it)
        sto_iter_free(r->it);
    if (r->snap)
        sto_snapshot_free(r->snap);
    r->it = NULL;
    r->snap = NULL;
    r->scanning = false;
}

static void cs_free(cs_reader *r) {
    node_cs_readers_add(r->n, -1);
    r->n->cs_kept_bytes -= r->kept;
    if (r->watching)
        node_cs_unwatch(r->n, &r->watcher);
    if (r->timer)
        event_free(r->timer);
    scan_free(r);
    st_buf_free(&r->start);
    st_buf_free(&r->end);
    st_buf_free(&r->scan_from);
    st_buf_free(&r->scan_row);
    st_buf_free(&r->pending.value);
    st_buf_free(&r->stash_buf);
    st_arena_deinit(&r->hold.arena);
    free(r->hold.v);
    free(r->hold.refs);
    st_buf_free(&r->msg);
    st_buf_free(&r->batch);
    st_arena_deinit(&r->arena);
    free(r);
}

static st_code batch_flush(cs_reader *r);

static void cs_end(cs_reader *r, st_code code, const char *msg) {
    if (code != ST_CANCELLED)
        (void)batch_flush(r); /* what was sent before the end goes out before it */
    if (code != ST_OK && code != ST_CANCELLED)
        st_log(ST_LOG_DEBUG, "changes", "table=%s code=%s msg=\"%s\"", r->table, st_code_name(code),
               msg ? msg : "");
    rpc_call_finish(r->call, code, msg);
    cs_free(r);
}

static void on_cancel(rpc_call *call, void *arg) {
    (void)call;
    cs_end(arg, ST_CANCELLED, NULL); /* never inside a turn: the RPC layer calls it from the loop */
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    cs_turn(arg);
}

static void arm(cs_reader *r, int64_t delay_us) {
    if (delay_us < CS_TURN_DELAY_US)
        delay_us = CS_TURN_DELAY_US;
    struct timeval tv = {(time_t)(delay_us / 1000000), (suseconds_t)(delay_us % 1000000)};
    event_add(r->timer, &tv);
}

/* New records: the turn runs from the loop right after the write's completion (which acks the
 * write first), not after the next poll of the sockets: a timer, even of 1 us, waits for the
 * poll's millisecond timeout when nothing else is ready. Once per completion, so a busy table
 * does not starve the loop (the turn's own continuation is a timer). */
static void on_watch(node_cs_watcher *w) {
    cs_reader *r = (cs_reader *)((char *)w - offsetof(cs_reader, watcher));
    if (!r->waiting_writable && !r->put_off) /* a reader put off runs once the loop polled */
        event_active(r->timer, EV_TIMEOUT, 0);
}

static void on_writable(rpc_call *call, void *arg) {
    (void)call;
    cs_reader *r = arg;
    if (!r->waiting_writable)
        return;
    r->waiting_writable = false;
    cs_turn(r);
}

/* ---- sending ---- */

/* Sends the batch as one message: its head (BTU_CS_BATCH_TAG and the frames' length as a varint
 * of exactly 5 bytes) is written now, in the room left for it. Nothing to do when empty. */
static st_code batch_flush(cs_reader *r) {
    const size_t head = RPC_SEND_HEADROOM + BTU_CS_BATCH_HEAD_BYTES;
    if (r->batch.len <= head)
        return ST_OK;
    size_t n = r->batch.len - head;
    uint8_t *h = r->batch.data + RPC_SEND_HEADROOM;
    h[0] = BTU_CS_BATCH_TAG;
    for (int i = 0; i < 4; i++)
        h[1 + i] = (uint8_t)(((n >> (7 * i)) & 0x7f) | 0x80);
    h[5] = (uint8_t)((n >> 28) & 0x7f);
    st_code rc = rpc_call_send_buf(r->call, &r->batch);
    buf_recycle(&r->batch);
    return rc == ST_OK ? ST_OK : ST_CANCELLED;
}

/* Adds the message in msg (rpc_call_send_buf's layout) to the batch, framed as the client is to
 * receive it; a batch that would pass batch_max with it goes out first, and one that reaches it
 * goes out after it. A message that alone is larger goes out plain, after the batch. */
static st_code batch_add(cs_reader *r, st_buf *msg) {
    const size_t head = RPC_SEND_HEADROOM + BTU_CS_BATCH_HEAD_BYTES;
    size_t len = msg->len - RPC_SEND_HEADROOM;
    if (r->batch.len > head && r->batch.len - head + msg->len > r->batch_max &&
        batch_flush(r) != ST_OK)
        return ST_CANCELLED;
    if (msg->len > r->batch_max)
        return rpc_call_send_buf(r->call, msg) == ST_OK ? ST_OK : ST_CANCELLED;
    if (r->batch.len < head) {
        st_buf_reset(&r->batch);
        if (st_buf_reserve(&r->batch, head + msg->len) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        r->batch.len = head;
    }
    rpc_frame_prefix(msg->data, (uint32_t)len);
    if (st_buf_append(&r->batch, msg->data, msg->len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    st_buf_reset(msg);
    if (r->batch.len - head >= r->batch_max)
        return batch_flush(r);
    return ST_OK;
}

static st_code emit(st_buf *msg, void *arg) {
    cs_reader *r = arg;
    size_t len = msg->len;
    st_code src = r->batching ? batch_add(r, msg) : rpc_call_send_buf(r->call, msg);
    if (src == ST_RESOURCE_EXHAUSTED && r->batching)
        return src;
    if (src != ST_OK)
        return ST_CANCELLED;
    r->turn_sent += len;
    /* One message per turn past the turn's share, none past the call's bound: a record of
     * 100 MiB is not copied out in one turn, and its messages leave as the client reads. */
    if (r->out_pause && (r->turn_sent >= CS_TURN_SEND_BYTES || !rpc_call_writable(r->call)))
        return NODE_CS_PAUSE;
    return ST_OK;
}

/* The families a DeleteFromRow stands for (the table's now), in the record's arena. */
static st_code row_families(cs_reader *r, const sto_row_mut *row, node_cs_change *c) {
    bool del_row = false;
    for (size_t i = 0; i < row->n_muts; i++)
        del_row = del_row || row->muts[i].type == STO_MUT_DEL_ROW;
    node_table *meta = del_row ? node_catalog_find(r->n->catalog, r->table) : NULL;
    if (!meta || meta->n_families == 0)
        return ST_OK;
    const char **v = st_arena_alloc(&r->arena, meta->n_families * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < meta->n_families; i++)
        v[i] = meta->families[i].name;
    c->families = v;
    c->n_families = meta->n_families;
    return ST_OK;
}

static st_code damaged(cs_reader *r, int64_t stamp, st_err *err) {
    return st_err_set(err, ST_DATA_LOSS,
                      "the change record at stamp %" PRId64 " of a row of table %s is damaged "
                      "and cannot be decoded; check the node's storage (docs/operations.md)",
                      stamp, r->table);
}

static void arena_recycle(cs_reader *r) {
    st_arena_reset(&r->arena);
}

/* Sends a record the ring holds as its DataChange body (one message) with the token of the
 * current position. It never pauses inside: a message past the turn's share ends the turn after
 * it, as the last message of any record does. */
static st_code send_body(cs_reader *r, st_slice body, st_err *err) {
    st_code rc = node_cs_encode_prebuilt(&r->msg, body, token_text(r), watermark(r));
    if (rc == ST_OK && (rc = emit(&r->msg, r)) == NODE_CS_PAUSE)
        rc = ST_OK;
    if (rc != ST_OK)
        st_err_set(err, rc,
                   rc == ST_CANCELLED ? "the call ended while sending"
                                      : "out of memory encoding a change record");
    buf_recycle(&r->msg);
    r->turn_records++;
    r->hb_due = st_mono_us() + r->hb_us;
    return rc;
}

/* Sends one decoded record with the token of the current position, from chunk out_pos (a record
 * paused in an earlier turn goes on where it stopped). With out_pause the record may pause
 * between two messages: CS_MORE or CS_BLOCKED then (out_pos says where it goes on), and nothing
 * else may be sent on the call until it is resumed with the same record and position. */
static st_code send_change(cs_reader *r, const sto_row_mut *row, st_err *err) {
    char buf[32];
    node_cs_change c = {row,
                        (row->flags & STO_ROW_GC) != 0,
                        node_cs_cluster_id(r->n, row->origin, buf, sizeof buf),
                        token_text(r),
                        watermark(r),
                        NULL,
                        0};
    node_cs_pos pos = r->out_pos;
    st_code rc = row_families(r, row, &c);
    if (rc == ST_OK)
        rc = node_cs_encode_change(&c, NODE_CS_MSG_VALUE_BYTES, &r->arena, &r->msg, emit, r, &pos);
    r->out_pos = rc == NODE_CS_PAUSE ? pos : (node_cs_pos){0};
    if (rc == NODE_CS_PAUSE)
        rc = rpc_call_writable(r->call) ? CS_MORE : CS_BLOCKED;
    else if (rc != ST_OK)
        st_err_set(err, rc,
                   rc == ST_CANCELLED ? "the call ended while sending"
                                      : "out of memory encoding a change record");
    arena_recycle(r);
    buf_recycle(&r->msg);
    if (r->out_pos.chunk == 0)
        r->turn_records++;
    r->hb_due = st_mono_us() + r->hb_us;
    return rc;
}

static bool paused(st_code rc) {
    return rc == CS_MORE || rc == CS_BLOCKED;
}

static st_code pending_keep(cs_reader *r, st_err *err);

/* Sends the pending record (from the ring: every value inline) with the token of the current
 * position. A record paused (send_change) stays pending, copied out of the ring, which may
 * change before it goes on. */
static st_code send_pending(cs_reader *r, st_err *err) {
    cs_rec *p = &r->pending;
    if (!p->set)
        return ST_OK;
    sto_row_mut row;
    st_slice value = p->in_ring ? p->ring_value : S(&p->value);
    st_code rc;
    if (p->body) {
        rc = send_body(r, value, err);
    } else if (sto_row_mut_decode(value, &row, &r->arena)) {
        rc = send_change(r, &row, err); /* rewinds the arena */
    } else {
        rc = damaged(r, p->stamp, err);
        arena_recycle(r);
    }
    if (paused(rc)) {
        st_code krc = pending_keep(r, err);
        return krc == ST_OK ? rc : krc;
    }
    p->set = false;
    if (!p->in_ring)
        buf_recycle(&p->value);
    return rc;
}

/* send_pending where the record may pause: it closes its write (the position already names its
 * stamp), so the next turn resumes it before the ring is read again from that stamp. */
static st_code send_pending_pausable(cs_reader *r, st_err *err) {
    r->out_pause = true;
    st_code rc = send_pending(r, err);
    r->out_pause = false;
    return rc;
}

/* ---- a scanned row's records and the values they reference ---- */

static void hold_clear(cs_hold *h) {
    st_arena_deinit(&h->arena);
    h->n = h->n_refs = h->unresolved = h->bytes = h->sent = 0;
    h->sorted = false;
    h->flushing = false;
    h->last_pos = NULL;
}

/* Holds the stored record value of stamp (its SetCells by reference become refs). */
static st_code hold_add(cs_reader *r, int64_t stamp, st_slice value, st_err *err) {
    cs_hold *h = &r->hold;
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        cs_held *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            goto oom;
        h->v = v;
        h->cap = cap;
    }
    cs_held *x = &h->v[h->n];
    const void *copy = st_arena_dup(&h->arena, value.data, value.len);
    if (!copy && value.len)
        goto oom;
    if (!sto_row_mut_decode(st_slice_make(copy, value.len), &x->row, &h->arena))
        return damaged(r, stamp, err);
    x->stamp = stamp;
    for (size_t i = 0; (x->row.flags & NODE_CS_REC_REFS) && i < x->row.n_muts; i++) {
        if (x->row.muts[i].type != STO_MUT_SET_CELL || x->row.muts[i].value.len > 0)
            continue;
        if (h->n_refs == h->cap_refs) {
            size_t cap = h->cap_refs ? 2 * h->cap_refs : 16;
            cs_ref *v = realloc(h->refs, cap * sizeof *v);
            if (!v)
                goto oom;
            h->refs = v;
            h->cap_refs = cap;
        }
        h->refs[h->n_refs++] = (cs_ref){(sto_mut *)&x->row.muts[i]};
        h->unresolved++;
        h->sorted = false;
    }
    h->n++;
    h->bytes += value.len;
    return ST_OK;
oom:
    return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                      "out of memory reading change records; resume from the last continuation "
                      "token");
}

/* Orders SetCells by family, qualifier and timestamp. */
static int cell_cmp(st_slice fa, st_slice qa, int64_t ta, const sto_mut *b) {
    int c = st_slice_cmp(fa, b->family);
    if (c == 0)
        c = st_slice_cmp(qa, b->qualifier);
    return c ? c : (ta > b->ts_us) - (ta < b->ts_us);
}

static int ref_cmp(const void *a, const void *b) {
    const sto_mut *x = ((const cs_ref *)a)->m;
    return cell_cmp(x->family, x->qualifier, x->ts_us, ((const cs_ref *)b)->m);
}

/* A user cell of the held row: the value of every held SetCell that references it (same
 * family, qualifier and timestamp: the value the cell has now, docs/changestreams.md). A row's
 * cells are distinct, so each reference is matched at most once. */
static st_code hold_match(cs_hold *h, const sto_cell *c, st_err *err) {
    if (!h->sorted) {
        qsort(h->refs, h->n_refs, sizeof *h->refs, ref_cmp);
        h->sorted = true;
    }
    size_t lo = 0, hi = h->n_refs; /* the first reference at or after the cell */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cell_cmp(c->family, c->qualifier, c->ts_us, h->refs[mid].m) > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const void *v = NULL; /* one copy of the value for every record naming the cell */
    for (; lo < h->n_refs && cell_cmp(c->family, c->qualifier, c->ts_us, h->refs[lo].m) == 0;
         lo++) {
        if (!v && c->value.len && !(v = st_arena_dup(&h->arena, c->value.data, c->value.len)))
            return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                              "out of memory reading a referenced value; resume from the last "
                              "continuation token");
        h->refs[lo].m->value = st_slice_make(v, c->value.len);
        h->unresolved -= h->unresolved > 0;
    }
    return ST_OK;
}

/* Finds the held values in the row's user cells with an iterator of its own (the scan has not
 * reached them yet). */
static st_code hold_lookup(cs_reader *r, st_err *err) {
    sto_range range = {S(&r->scan_row), false, S(&r->scan_row), true};
    sto_iter *it = NULL;
    st_code rc = sto_iter_new_flags(r->snap, &range, false, STO_ITER_USER, &it, err);
    sto_cell c;
    while (rc == ST_OK && r->hold.unresolved && (rc = sto_iter_next(it, &c, err)) == ST_OK)
        rc = hold_match(&r->hold, &c, err);
    if (it)
        sto_iter_free(it);
    return rc == ST_NOT_FOUND ? ST_OK : rc;
}

/* Sends the held records, each with the current position's token; last_pos (when given) moves
 * the position past the row first for the last one (or at once when none is held: both only
 * ever set the position from the scan's row, so doing it again on a resumed flush changes
 * nothing). A SetCell whose cell is gone keeps its empty value. A record may pause (CS_MORE,
 * CS_BLOCKED): the hold is kept and the next turn's hold_flush goes on from it. */
static st_code hold_flush(cs_reader *r, void (*last_pos)(cs_reader *r), st_err *err) {
    cs_hold *h = &r->hold;
    st_code rc = ST_OK;
    if (h->n == 0 && last_pos)
        last_pos(r);
    r->out_pause = true;
    while (rc == ST_OK && h->sent < h->n) {
        if (h->sent + 1 == h->n && last_pos)
            last_pos(r);
        rc = send_change(r, &h->v[h->sent].row, err);
        if (rc == ST_OK)
            h->sent++;
    }
    r->out_pause = false;
    if (paused(rc)) {
        h->flushing = true;
        h->last_pos = last_pos;
        return rc;
    }
    hold_clear(h);
    return rc;
}

/* A record paused in an earlier turn goes on before anything else is sent on the call. ST_OK
 * once no record is paused. */
static st_code resume_record(cs_reader *r, st_err *err) {
    if (r->out_pos.chunk == 0)
        return ST_OK;
    if (!rpc_call_writable(r->call))
        return CS_BLOCKED;
    if (r->hold.flushing)
        return hold_flush(r, r->hold.last_pos, err);
    return send_pending_pausable(r, err);
}

/* The ring's record waits (read in place while the ring scan runs). */
static void pending_set(cs_reader *r, int64_t stamp, st_slice value, bool body) {
    cs_rec *p = &r->pending;
    p->stamp = stamp;
    p->ring_value = value;
    p->body = body;
    p->in_ring = true;
    p->set = true;
}

/* The ring scan stopped with a record waiting: it is copied, the ring may change meanwhile. */
static st_code pending_keep(cs_reader *r, st_err *err) {
    cs_rec *p = &r->pending;
    if (!p->set || !p->in_ring)
        return ST_OK;
    p->in_ring = false;
    if (!buf_set(&p->value, p->ring_value)) {
        p->set = false;
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "out of memory reading a change record; resume from the last "
                          "continuation token");
    }
    return ST_OK;
}

static st_code send_heartbeat(cs_reader *r) {
    st_code rc = batch_flush(r);
    if (rc == ST_OK)
        rc = node_cs_encode_heartbeat(&r->msg, S(&r->start), S(&r->end), token_text(r),
                                      watermark(r));
    if (rc == ST_OK)
        rc = rpc_call_send_buf(r->call, &r->msg);
    buf_recycle(&r->msg);
    r->hb_due = st_mono_us() + r->hb_us;
    return rc;
}

/* ---- the work: live and catch-up ---- */

static bool turn_spent(const cs_reader *r) {
    return r->turn_records >= CS_TURN_RECORDS || r->turn_cells >= CS_TURN_CELLS ||
           r->turn_sent >= CS_TURN_SEND_BYTES || r->turn_blocks >= CS_TURN_BLOCK_BYTES;
}

/* The ring callback: a record's predecessor is sent once it is known whether it closes its
 * write (a higher stamp follows: its token may say "1.stamp"). */
static bool on_ring(const node_cs_rec *rec, void *arg) {
    cs_reader *r = arg;
    if (r->pending.set && rec->stamp_us > r->pending.stamp) {
        btu_cs_pos_live(&r->pos, r->pending.stamp);
        st_code rc = send_pending_pausable(r, &r->fail);
        if (paused(rc))
            r->stop = rc;
        if (rc != ST_OK)
            return false;
        /* Room before the turn's share: a turn that ends for its share with a full queue would
         * leave the next turn to queue on top of it, past the call's bound. */
        r->stop = !rpc_call_writable(r->call) ? CS_BLOCKED : turn_spent(r) ? CS_MORE : ST_OK;
        if (r->stop != ST_OK)
            return false;
    } else if (send_pending(r, &r->fail) != ST_OK) {
        return false;
    }
    pending_set(r, rec->stamp_us, rec->value, rec->body);
    return true;
}

/* Opens the catch-up scan of (pos.w, h], h at most the resolved stamp (a scan position from a
 * token goes on after its key up to its own H). */
static st_code scan_start(cs_reader *r, int64_t h, st_err *err) {
    node_tablet *tab = node_tablet_by_id(r->n, r->tablet_id, NULL);
    if (!tab)
        return st_err_set(err, ST_UNAVAILABLE,
                          "the partition's tablet left this node; resume from the last "
                          "continuation token");
    st_slice from = S(&r->start);
    st_buf_reset(&r->scan_from);
    /* A scan token past what this node has resolved (another node's clock) or past end_time:
     * records up to its H may still be in flight here, so its scan starts over from W. */
    if (r->pos.scan && r->pos.h > h)
        btu_cs_pos_live(&r->pos, r->pos.w);
    if (r->pos.scan) {
        h = r->pos.h;
        if (st_buf_append(&r->scan_from, r->pos.key, r->pos.key_len) != ST_OK ||
            st_buf_append_byte(&r->scan_from, 0) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a scan");
        if (st_slice_cmp(S(&r->scan_from), from) > 0)
            from = S(&r->scan_from);
    }
    st_code rc = sto_snapshot_new(tab->st, &r->snap, err);
    sto_range range = {from, false, S(&r->end), false};
    if (rc == ST_OK)
        rc = sto_iter_new_flags(r->snap, &range, false, STO_ITER_SYSTEM | STO_ITER_USER, &r->it,
                                err);
    if (rc != ST_OK) {
        scan_free(r);
        return rc;
    }
    r->snap_bytes = 0;
    r->scan_h = h;
    r->scanning = true;
    st_buf_reset(&r->scan_row);
    return ST_OK;
}

static st_code live(cs_reader *r, st_err *err) {
    int64_t upto = node_cs_resolved(r->n);
    if (r->has_end && upto > r->end_us)
        upto = r->end_us;
    if (upto <= r->pos.w)
        return ST_OK;
    if (!rpc_call_writable(r->call))
        return CS_BLOCKED; /* a turn after CS_MORE or a heartbeat may find the queue full */
    r->stop = ST_OK;
    st_err_clear(&r->fail);
    node_cs_ring_rc rc =
        node_cs_ring_scan(r->n, r->table, S(&r->start), S(&r->end), r->pos.w, upto, on_ring, r);
    if (rc == NODE_CS_RING_STOP && r->fail.code == ST_OK)
        pending_keep(r, &r->fail);
    if (r->fail.code != ST_OK) {
        *err = r->fail;
        return err->code;
    }
    if (rc == NODE_CS_RING_MISS) {
        r->pending.set = false; /* the scan reads it again */
        st_code src = scan_start(r, upto, err);
        return src == ST_OK ? CS_AGAIN : src;
    }
    if (rc == NODE_CS_RING_STOP)
        return r->stop;
    btu_cs_pos_live(&r->pos, upto);
    return send_pending_pausable(r, err);
}

/* The stamp of a change record cell; false for any other cell. */
static bool record_stamp(const sto_cell *c, int64_t *stamp) {
    if (c->family.len != NODE_CS_FAMILY_LEN ||
        memcmp(c->family.data, NODE_CS_FAMILY, NODE_CS_FAMILY_LEN) != 0 ||
        c->qualifier.len != NODE_CS_QUALIFIER_LEN)
        return false;
    *stamp = (int64_t)st_get_be64(c->qualifier.data);
    return true;
}

/* The scan is over: every record in (w, scan_h] was sent. */
static void pos_scan_done(cs_reader *r) {
    btu_cs_pos_live(&r->pos, r->scan_h);
}

static st_code scan_end(cs_reader *r, st_err *err) {
    scan_free(r);
    st_code rc = hold_flush(r, pos_scan_done, err); /* the last row's user cells were passed */
    return rc == ST_OK ? CS_AGAIN : rc;
}

/* Marks every record of the scan's current row (and of the rows before it) in (w, scan_h] as
 * sent. */
static void pos_row_done(cs_reader *r) {
    st_slice row = S(&r->scan_row);
    r->pos.scan = true;
    r->pos.h = r->scan_h;
    r->pos.key_len = row.len; /* row keys are at most BTU_ROW_KEY_MAX bytes */
    memcpy(r->pos.key, row.data, row.len);
}

/* The scan reached a new row: the one before it is complete (its user cells gave the values
 * its records reference), so its records go out, the last with a token naming that row (and
 * without a record the position moves past it all the same). */
static st_code scan_next_row(cs_reader *r, st_slice row, st_err *err) {
    if (r->scan_row.len > 0 && r->scan_row.len <= BTU_ROW_KEY_MAX) {
        st_code rc = hold_flush(r, pos_row_done, err);
        if (rc != ST_OK)
            return rc;
    }
    if (!buf_set(&r->scan_row, row))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory scanning change records");
    return ST_OK;
}

/* A record of the current row: held until the row's user cells are passed; a full hold is
 * looked up and sent first, with the position before the row. */
static st_code scan_record(cs_reader *r, int64_t stamp, st_slice value, st_err *err) {
    st_code rc = ST_OK;
    if (r->hold.n >= CS_HOLD_RECORDS || r->hold.bytes >= CS_HOLD_BYTES) {
        rc = hold_lookup(r, err);
        if (rc == ST_OK)
            rc = hold_flush(r, NULL, err);
    }
    return rc == ST_OK ? hold_add(r, stamp, value, err) : rc;
}

/* One cell of the scan. CS_MORE or CS_BLOCKED when a flush it made paused inside a record: the
 * cell is then handled again once the flush is done (which leaves nothing to flush for it). */
static st_code scan_cell(cs_reader *r, const sto_cell *c, st_err *err) {
    st_code rc;
    if (!st_slice_eq(c->row, S(&r->scan_row)) && (rc = scan_next_row(r, c->row, err)) != ST_OK)
        return rc;
    if (!sto_family_is_system(c->family)) /* after the row's records */
        return r->hold.unresolved ? hold_match(&r->hold, c, err) : ST_OK;
    int64_t stamp;
    if (!record_stamp(c, &stamp) || stamp <= r->pos.w || stamp > r->scan_h)
        return ST_OK;
    return scan_record(r, stamp, c->value, err);
}

/* Keeps the scan's current cell for the next turn (the iterator moves on meanwhile only when
 * the cell was handled). */
static st_code stash_cell(cs_reader *r, const sto_cell *c, st_err *err) {
    st_buf *b = &r->stash_buf;
    st_buf_reset(b);
    if (st_buf_reserve(b, c->row.len + c->family.len + c->qualifier.len + c->value.len) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "out of memory scanning change records; resume from the last "
                          "continuation token");
    r->stash = *c;
    st_slice *parts[] = {&r->stash.row, &r->stash.family, &r->stash.qualifier, &r->stash.value};
    for (size_t i = 0; i < 4; i++) {
        uint8_t *at = b->data + b->len;
        if (parts[i]->len)
            memcpy(at, parts[i]->data, parts[i]->len);
        b->len += parts[i]->len;
        *parts[i] = st_slice_make(at, parts[i]->len);
    }
    r->stashed = true;
    return ST_OK;
}

/* The scan's next cell: the stashed one first. ST_NOT_FOUND at the end. */
static st_code scan_next(cs_reader *r, sto_cell *c, bool *from_stash, st_err *err) {
    *from_stash = r->stashed;
    if (r->stashed) {
        r->stashed = false;
        *c = r->stash;
        return ST_OK;
    }
    st_code rc = sto_iter_next(r->it, c, err);
    uint64_t bytes = sto_snapshot_read_bytes(r->snap);
    r->turn_blocks += bytes - r->snap_bytes;
    r->snap_bytes = bytes;
    if (rc == ST_OK)
        r->turn_cells++;
    return rc;
}

static st_code scan(cs_reader *r, st_err *err) {
    for (;;) {
        if (turn_spent(r))
            return CS_MORE;
        if (!rpc_call_writable(r->call))
            return CS_BLOCKED;
        sto_cell c;
        bool from_stash;
        st_code rc = scan_next(r, &c, &from_stash, err);
        if (rc == ST_NOT_FOUND)
            return scan_end(r, err);
        if (rc != ST_OK)
            return rc;
        rc = scan_cell(r, &c, err);
        if (paused(rc)) {
            st_code src = from_stash ? ST_OK : stash_cell(r, &c, err);
            r->stashed = true;
            return src == ST_OK ? rc : src;
        }
        if (rc != ST_OK)
            return rc;
    }
}

static st_code work(cs_reader *r, st_err *err) {
    for (;;) {
        st_code rc = r->scanning ? scan(r, err) : live(r, err);
        if (rc != CS_AGAIN)
            return rc;
        if (turn_spent(r))
            return CS_MORE;
    }
}

/* ---- closing ---- */

static st_slice end_min(st_slice a, st_slice b) {
    return btu_end_cmp(a, b) <= 0 ? a : b;
}

/* [start, end) as pieces: its overlap with each local tablet, and the rows no local tablet
 * holds (the router knows who holds them); new partition = token partition = the piece, so a
 * client never gets a partition its tokens do not cover. out has room for 2 * t->n + 1 pieces;
 * returns the count. */
static size_t pieces_of(const node_tablets *t, st_slice start, st_slice end, node_cs_piece *out) {
    size_t k = 0, i = 0;
    st_slice cur = start;
    for (;;) {
        while (i < t->n && t->v[i].end.len && st_slice_cmp(S(&t->v[i].end), cur) <= 0)
            i++;
        bool next = i < t->n && (end.len == 0 || st_slice_cmp(S(&t->v[i].start), end) < 0);
        st_slice e;
        if (next && st_slice_cmp(S(&t->v[i].start), cur) <= 0) {
            e = end_min(S(&t->v[i].end), end);
            out[k++] = (node_cs_piece){cur, e, cur, e};
            i++;
        } else {
            e = next ? S(&t->v[i].start) : end;
            out[k++] = (node_cs_piece){cur, e, cur, e};
        }
        if (e.len == 0 || btu_end_cmp(e, end) == 0)
            return k;
        cur = e;
    }
}

/* Sends CloseStream (code, pieces of the partition with the current token) and ends the call
 * with OK, as Cloud Bigtable ends a stream it closes. */
static void close_stream(cs_reader *r, st_code code, const char *msg, const node_tablets *t) {
    node_cs_piece *pieces = NULL;
    size_t n = 0;
    if (t) {
        pieces = malloc((2 * t->n + 1) * sizeof *pieces);
        if (!pieces) {
            cs_end(r, ST_RESOURCE_EXHAUSTED, "out of memory closing the stream");
            return;
        }
        n = pieces_of(t, S(&r->start), S(&r->end), pieces);
    }
    r->pending.set = false; /* not sent: the new partitions' readers send it */
    hold_clear(&r->hold);
    st_code rc = batch_flush(r);
    if (rc == ST_OK)
        rc = node_cs_encode_close(&r->msg, code, msg, pieces, n, token_text(r));
    free(pieces);
    if (rc == ST_OK)
        rc = rpc_call_send_buf(r->call, &r->msg);
    if (rc == ST_RESOURCE_EXHAUSTED)
        cs_end(r, rc, "out of memory closing the stream");
    else
        cs_end(r, rc == ST_OK ? ST_OK : ST_CANCELLED, NULL);
}

static void close_moved(cs_reader *r, const node_tablets *t) {
    close_stream(r, ST_OUT_OF_RANGE,
                 "the partition's tablet split, merged or moved: read the new partitions from the "
                 "continuation tokens given",
                 t);
}

/* ---- turns ---- */

/* Whether the stream may go on: its table, streams and tablet are as when it began. ST_OK, or
 * CS_MORE when the tablet changed (close with new partitions), or the code that ends the call. */
static st_code still_valid(cs_reader *r, node_tablets **t, st_err *err) {
    if (r->n->closing)
        return st_err_set(err, ST_UNAVAILABLE,
                          "the node is shutting down; resume from the last continuation token");
    node_table *meta = node_catalog_find(r->n->catalog, r->table);
    *t = meta ? node_tablets_find(r->n, r->table) : NULL;
    if (!*t)
        return st_err_set(err, ST_NOT_FOUND,
                          "table \"%s\" was deleted while its change stream was read; its "
                          "history is gone with it",
                          r->table);
    if (meta->cs_retention_us == 0 || meta->cs_since_us != r->since_us)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "change streams of table %s were turned off (or off and on again) "
                          "while reading: the history this stream read is gone; start a new "
                          "stream from GenerateInitialChangeStreamPartitions",
                          r->table);
    /* Splits give new ids, moves drop the tablet: the same id still holding the partition
     * means unchanged. */
    for (size_t i = 0; i < (*t)->n; i++) {
        const node_tablet *tab = &(*t)->v[i];
        if (tab->id == r->tablet_id)
            return st_slice_cmp(S(&tab->start), S(&r->start)) <= 0 &&
                           btu_end_cmp(S(&r->end), S(&tab->end)) <= 0
                       ? ST_OK
                       : CS_MORE;
    }
    return CS_MORE;
}

static void wait_writable(cs_reader *r) {
    r->waiting_writable = true;
    if (!r->writable_cb_set) {
        r->writable_cb_set = true;
        rpc_call_set_writable_cb(r->call, on_writable, r);
    }
}

/* Caught up: end at end_time, heartbeat when due, then sleep until a record, the next heartbeat
 * or end_time. */
static void idle(cs_reader *r) {
    if (r->has_end && r->pos.w >= r->end_us) {
        close_stream(r, ST_OK, NULL, NULL);
        return;
    }
    int64_t now = st_mono_us();
    if (now >= r->hb_due) {
        if (!rpc_call_writable(r->call)) {
            wait_writable(r);
            return;
        }
        if (send_heartbeat(r) != ST_OK) {
            cs_end(r, ST_CANCELLED, NULL);
            return;
        }
    }
    if (!r->watching) {
        node_cs_watch(r->n, &r->watcher);
        r->watching = true;
    }
    int64_t delay = r->hb_due - now;
    if (r->has_end) {
        int64_t to_end = r->end_us - st_wall_us();
        delay = to_end < CS_END_RECHECK_US ? (delay < CS_END_RECHECK_US ? delay : CS_END_RECHECK_US)
                                           : (to_end < delay ? to_end : delay);
    }
    arm(r, delay);
}

/* Whether r's turn may run now, else it was put off: one write can wake every reader of its
 * table (hundreds of streams, each turn sending up to CS_TURN_SEND_BYTES), and their turns
 * would otherwise run in one pass of the loop, holding writes, reads and the router's health
 * checks for as long (seconds under AddressSanitizer). Turns that follow each other within
 * CS_BURST_GAP_US form a burst; past CS_BURST_US of it, the remaining turns go to a timer,
 * which fires once the loop has polled its sockets. The first of them to fire starts the next
 * burst, so a reader is never put off twice in a row by the same burst. */
static bool turn_may_run(cs_reader *r) {
    node_ctx *n = r->n;
    int64_t now = st_mono_us();
    bool fresh = now - n->cs_burst_last_us > CS_BURST_GAP_US ||
                 (r->put_off && r->put_off_burst == n->cs_burst);
    r->put_off = false;
    if (fresh) {
        n->cs_burst++;
        n->cs_burst_start_us = now;
        return true;
    }
    if (now - n->cs_burst_start_us <= CS_BURST_US)
        return true;
    r->put_off = true;
    r->put_off_burst = n->cs_burst;
    arm(r, CS_TURN_DELAY_US);
    return false;
}

static void cs_turn(cs_reader *r) {
    if (rpc_call_cancelled(r->call)) {
        cs_end(r, ST_CANCELLED, NULL);
        return;
    }
    if (r->waiting_writable || !turn_may_run(r))
        return; /* on_writable or the timer goes on */
    node_ctx *n = r->n;
    cs_turn_run(r); /* may free r */
    n->cs_burst_last_us = st_mono_us();
}

static void cs_turn_run(cs_reader *r) {
    st_err err;
    st_err_clear(&err);
    r->turn_records = r->turn_cells = 0;
    r->turn_sent = 0;
    r->turn_blocks = 0;
    st_code rc = resume_record(r, &err); /* a record is never cut by anything else */
    if (rc == ST_OK) {
        node_tablets *t = NULL;
        rc = still_valid(r, &t, &err);
        if (rc == CS_MORE) {
            st_arena_deinit(&r->arena);
            close_moved(r, t);
            return;
        }
        if (rc == ST_OK)
            rc = work(r, &err);
    }
    /* The turn's records go out together; a call that ended meanwhile ends the reader. */
    if (batch_flush(r) != ST_OK && (rc == ST_OK || rc == CS_MORE || rc == CS_BLOCKED))
        rc = st_err_set(&err, ST_CANCELLED, "the call ended while sending");
    st_arena_reset(&r->arena); /* one block at most, reused by the next turn */
    if (rc == CS_BLOCKED) {
        wait_writable(r);
    } else if (rc == CS_MORE) {
        if (r->out_pos.chunk == 0 && st_mono_us() >= r->hb_due && rpc_call_writable(r->call) &&
            send_heartbeat(r) != ST_OK)
            cs_end(r, ST_CANCELLED, NULL);
        else
            arm(r, CS_TURN_DELAY_US);
    } else if (rc == ST_OK) {
        idle(r);
    } else {
        cs_end(r, err.code != ST_OK ? err.code : rc, err.code != ST_OK ? err.msg : NULL);
    }
}

/* ---- the handlers ---- */

static st_code streams_on(const node_table *meta, st_err *err) {
    if (meta->cs_retention_us > 0)
        return ST_OK;
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "change streams are not enabled on table %s: turn them on with UpdateTable "
                      "(change_stream_config.retention_period) first",
                      meta->name);
}

void node_h_generate_partitions(rpc_call *call, st_slice bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest *req =
        (Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest *)node_unpack(
            call,
            &google__bigtable__v2__generate_initial_change_stream_partitions_request__descriptor,
            bytes);
    if (!req)
        return;
    node_table *meta;
    node_tablets *t = node_table_or_fail(n, call, req->table_name, &meta);
    if (!t)
        return;
    st_err err;
    if (streams_on(meta, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    /* A standalone node's tablets cover every row; a cluster member's are its share, which the
     * router puts together with the other nodes'. */
    for (size_t i = 0; i < t->n; i++) {
        Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse resp =
            GOOGLE__BIGTABLE__V2__GENERATE_INITIAL_CHANGE_STREAM_PARTITIONS_RESPONSE__INIT;
        Google__Bigtable__V2__StreamPartition p;
        Google__Bigtable__V2__RowRange rr;
        btu_cs_partition_set(&p, &rr, S(&t->v[i].start), S(&t->v[i].end));
        resp.partition = &p;
        if (node_send(call, &resp.base) != ST_OK) {
            rpc_call_finish(call, ST_CANCELLED, NULL);
            return;
        }
    }
    rpc_call_finish(call, ST_OK, NULL);
}

/* Where the stream starts (docs/changestreams.md, Tokens): start_time T is the token 1.(T-1);
 * nothing given is now. INVALID_ARGUMENT for a start in the future or before what the table's
 * history holds (its retention, or when streams were turned on). */
static st_code start_pos(node_ctx *n, const node_table *meta,
                         const Google__Bigtable__V2__ReadChangeStreamRequest *req,
                         const btu_key_range *part, st_arena *a, btu_cs_pos *pos, st_err *err) {
    int64_t now = st_wall_us() > n->hlc_last_us ? st_wall_us() : n->hlc_last_us;
    int64_t oldest = now - meta->cs_retention_us;
    oldest = oldest > meta->cs_since_us ? oldest : meta->cs_since_us;
    char t1[40], t2[40];
    btu_cs_time_text(oldest, t2, sizeof t2);
    if (req->start_from_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME) {
        int64_t t;
        st_code rc = btu_cs_time_us(req->start_time, "start_time", true, &t, err);
        if (rc == ST_OK)
            rc = btu_cs_start_time_check(t, now, oldest, meta->name, err);
        if (rc != ST_OK)
            return rc;
        btu_cs_pos_live(pos, t - 1);
        return ST_OK;
    }
    if (req->start_from_case !=
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS) {
        btu_cs_pos_live(pos, node_cs_resolved(n));
        return ST_OK;
    }
    const Google__Bigtable__V2__StreamContinuationTokens *tk = req->continuation_tokens;
    st_code rc = btu_cs_tokens_merge(tk->tokens, tk->n_tokens, part,
                                     btu_cs_table_tag(st_slice_cstr(meta->name)), a, pos, err);
    /* A token of another cluster (a failover): writes that cluster had not applied by its W
     * may have entered this one before W; they were all committed after its applied bound Y,
     * so the stream starts at Y (records between come again: at least once). A bound older
     * than this history starts at its oldest record. */
    if (rc == ST_OK && pos->has_y && pos->cluster != n->opts.cluster_num) {
        int64_t from = btu_cs_pos_start(pos, n->opts.cluster_num);
        btu_cs_pos_live(pos, from < oldest - 1 && pos->w >= oldest - 1 ? oldest - 1 : from);
    }
    /* A time past what this node has resolved (a token from a node whose clock is ahead):
     * writes this node makes or applies from now on may have stamps below it, so the stream
     * starts at the resolved stamp (records may come twice, none is skipped). */
    int64_t resolved = node_cs_resolved(n);
    if (rc == ST_OK && pos->w > resolved)
        btu_cs_pos_live(pos, resolved);
    if (rc == ST_OK && pos->w < oldest - 1) {
        btu_cs_time_text(pos->w, t1, sizeof t1);
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the continuation token's time %s is before %s, the oldest change "
                          "table %s still holds (its retention, or when change streams were "
                          "turned on): records after it may be gone; start again with start_time",
                          t1, t2, meta->name);
    }
    return rc;
}

/* end_time and heartbeat_duration into r. */
static st_code stream_times(cs_reader *r, const Google__Bigtable__V2__ReadChangeStreamRequest *req,
                            st_err *err) {
    if (req->end_time) {
        st_code rc = btu_cs_time_us(req->end_time, "end_time", false, &r->end_us, err);
        if (rc != ST_OK)
            return rc;
        r->has_end = true;
    }
    r->hb_us = CS_HEARTBEAT_US_DEFAULT;
    const Google__Protobuf__Duration *d = req->heartbeat_duration; /* btu_cs_check_times */
    if (d && (d->seconds > 0 || d->nanos > 0)) {
        int64_t us = d->seconds > CS_HEARTBEAT_US_MAX / 1000000
                         ? CS_HEARTBEAT_US_MAX
                         : d->seconds * 1000000 + d->nanos / 1000;
        r->hb_us = us < CS_HEARTBEAT_US_MIN   ? CS_HEARTBEAT_US_MIN
                   : us > CS_HEARTBEAT_US_MAX ? CS_HEARTBEAT_US_MAX
                                              : us;
    }
    r->hb_due = st_mono_us() + r->hb_us;
    return ST_OK;
}

/* The local tablet holding every row of part; NULL when none does. */
static node_tablet *tablet_holding(node_tablets *t, const btu_key_range *part) {
    if (t->n == 0)
        return NULL;
    node_tablet *tab = &t->v[node_tablet_index(t, part->start)];
    if (st_slice_cmp(S(&tab->start), part->start) <= 0 && btu_end_cmp(part->end, S(&tab->end)) <= 0)
        return tab;
    return NULL;
}

static cs_reader *reader_new(node_ctx *n, rpc_call *call, const node_table *meta) {
    cs_reader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->n = n;
    node_cs_readers_add(n, 1); /* records go to the ring from now on */
    r->call = call;
    snprintf(r->table, sizeof r->table, "%s", meta->name);
    r->table_tag = btu_cs_table_tag(st_slice_cstr(r->table));
    r->since_us = meta->cs_since_us;
    st_arena_init(&r->arena, CS_ARENA_BLOCK_BYTES);
    st_arena_init(&r->hold.arena, CS_HOLD_ARENA_BYTES);
    r->watcher.table = r->table;
    r->watcher.fn = on_watch;
    r->timer = evtimer_new(n->base, on_timer, r);
    if (!r->timer) {
        cs_free(r);
        return NULL;
    }
    return r;
}

/* Validates the request into r (partition, start, times); the code and err on failure. */
static st_code reader_setup(cs_reader *r, const node_table *meta, btu_key_range *part,
                            const Google__Bigtable__V2__ReadChangeStreamRequest *req, st_err *err) {
    st_arena *a = rpc_call_arena(r->call);
    st_code rc = streams_on(meta, err);
    if (rc == ST_OK)
        rc = btu_cs_check_times(req, err);
    if (rc == ST_OK)
        rc = btu_cs_partition_range(req->partition, "partition", a, part, err);
    if (rc == ST_OK)
        rc = start_pos(r->n, meta, req, part, a, &r->pos, err);
    if (rc == ST_OK)
        rc = stream_times(r, req, err);
    return rc;
}

void node_h_read_change_stream(rpc_call *call, st_slice bytes, void *arg) {
    node_ctx *n = arg;
    st_err err;
    st_err_clear(&err);
    if (btu_cs_request_keepable(bytes.len, n->cs_kept_bytes, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    Google__Bigtable__V2__ReadChangeStreamRequest *req =
        (Google__Bigtable__V2__ReadChangeStreamRequest *)node_unpack(
            call, &google__bigtable__v2__read_change_stream_request__descriptor, bytes);
    if (!req)
        return;
    node_table *meta;
    node_tablets *t = node_table_or_fail(n, call, req->table_name, &meta);
    if (!t)
        return;
    btu_key_range part = {{NULL, 0}, {NULL, 0}};
    cs_reader *r = reader_new(n, call, meta);
    if (!r) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory starting the change stream");
        return;
    }
    const char *batch = rpc_call_header(call, BTU_CS_BATCH_HEADER);
    r->batching = batch && strcmp(batch, "1") == 0;
    rpc_limits lim;
    rpc_limits_get(&lim);
    size_t room = lim.message_bytes_max > BTU_CS_BATCH_HEAD_BYTES
                      ? lim.message_bytes_max - BTU_CS_BATCH_HEAD_BYTES
                      : 0;
    r->batch_max = room < BTU_CS_BATCH_BYTES ? room : BTU_CS_BATCH_BYTES;
    r->kept = bytes.len; /* the request stays in the call's memory: cs_free counts it out */
    n->cs_kept_bytes += r->kept;
    rpc_call_request_kept(call);
    if (reader_setup(r, meta, &part, req, &err) != ST_OK || !buf_set(&r->start, part.start) ||
        !buf_set(&r->end, part.end)) {
        cs_end(r, err.code != ST_OK ? err.code : ST_RESOURCE_EXHAUSTED,
               err.code != ST_OK ? err.msg : "out of memory starting the change stream");
        return;
    }
    rpc_call_set_cancel_cb(call, on_cancel, r);
    node_tablet *tab = tablet_holding(t, &part);
    if (!tab && node_in_cluster(n)) {
        node_not_owner(n, &err, r->table, part.start);
        cs_end(r, err.code, err.msg);
        return;
    }
    if (!tab) { /* a standalone node holds every row: the partition is stale (split, merge) */
        close_moved(r, t);
        return;
    }
    r->tablet_id = tab->id;
    cs_turn(r);
}
