/* read.c — ReadRows across tablets. The row set is walked tablet by tablet in key order (descending
 * when reversed): one node call per tablet carrying only the ranges inside it, its answers
 * forwarded to the client as they come, so rows arrive in strict order and nothing is buffered
 * whole. rows_limit holds across tablets: each call asks for what is still missing.
 *
 * Flow control: answers that arrive while the client's call may not queue them (its own queue is
 * full, or the process is past its queued-response budget) wait in a backlog, counted in that
 * budget (rpc_call_hold). While the process is past the budget and the client has not taken what
 * it was sent (bytes queued or backlogged), or the backlog passes RTR_READ_BACKLOG_BYTES, the node
 * call is paused with HTTP/2 flow control (rpc_ccall_pause; the idle timer is off meanwhile): the
 * node's stream stalls after at most the client's stream window (256 KiB) and goes on once the
 * client has taken those bytes. A paused call holds a stream slot of the node connection, which
 * every call to that node shares: at most RTR_READ_PAUSED_PER_NODE reads stay paused on one node;
 * past that a read parks instead: its node call is cancelled (freeing the slot and the window)
 * and the read goes on after the last row relayed, as a resumption, once its client has taken
 * every byte it was sent. Parks are rationed (a node accepts only so many stream resets per
 * second before it closes the whole connection): with the node's park bucket empty a read
 * pauses past the share.
 *
 * Resumption: "strata-not-owner" answers and lost node connections (after a tablet-map refresh,
 * bounded retries) resume after the last row delivered: the client never sees a row twice, and a
 * row cut short is withdrawn with reset_row first.
 *
 * A table deleted under a read: a read that resumes (after a park, a failure, or on its next
 * tablet) is sent again by table name, and a table created meanwhile under the same name must not
 * continue it. Each node reports when its copy of each table was created (ListTablets); a read
 * pins that for every node of its cluster as it begins, and sends the node's with every node call
 * (BTU_TABLE_CREATED_HEADER). A node whose table is another one refuses NOT_FOUND, and a map
 * that already shows another one fails the read here: the client gets NOT_FOUND, never an OK end
 * after part of the rows or rows of the later table. */
#include "data.h"
#include "failover.h"
#include "router_internal.h"

#include <event2/event.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* RR_PARKED: no node call; the read goes on once its client took what it was sent (rr_unpark). */
typedef enum rr_wait { RR_IDLE, RR_NODE, RR_TIMER, RR_WRITABLE, RR_PARKED } rr_wait;

typedef struct rr_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    rtr_plan plan;
    rtr_node *node; /* of the node call in flight */
    const char *table;
    btu_rowset rs;
    bool reversed;
    int64_t limit;  /* 0 = none */
    st_slice req;   /* the client's request (lives as long as the call) */
    st_buf head;    /* the request minus rows (2) and rows_limit (4), built when first needed */
    bool head_made; /* head holds it */
    bool has_pos;
    st_buf pos;
    st_buf cur_start, cur_end; /* bounds of the tablet being read */
    rtr_rr_track track;
    rpc_ccall *inflight;
    rr_wait wait;
    bool paused;       /* the node call is paused (flow control) until the client takes the backlog;
                          counted in op->node->reads_paused */
    bool parking;      /* the node call was cancelled to park the read (rr_pause) */
    bool limit_hit;    /* rows_limit was reached (the node ends its call by itself), or relaying
                          failed (the node call was cancelled) */
    bool relay_failed; /* relaying failed: op->last says why. op->last alone does not tell, it
                          also keeps the failure of an earlier try that a retry got past */
    bool complete;     /* every row was read: finish once the backlog is out */
    rtr_msgq backlog;  /* messages waiting for the client */
    size_t held;       /* backlog bytes counted in the queued-response budget (rpc_call_hold) */
    st_buf fwd;        /* a node message's buffer taken to pass on without a copy (rr_emit) */
    bool writable_cb;  /* rr_writable is registered (once a backlog formed) */
    int attempts;
    uint64_t gen;
    st_err last;
    /* No node of the cluster served some rows (failover.h). */
    rtr_unserved unserved;
    uint64_t fp;          /* rtr_qod_fingerprint of the client's request */
    bool moved_once;      /* moved on once after a node connection dropped under it */
    uint64_t conn_id;     /* op->node's rtr_node.conn_id when this attempt was sent */
    bool scan_conn;       /* this attempt went on the node's scan connection */
    bool map_checked;     /* the table had no tablet here: the map was refreshed once since */
    rtr_inflight link;    /* multi-cluster: in its cluster's in-flight list during a node call */
    struct event *idle;   /* multi-cluster: a node silent this long is given up (failover.h) */
    bool stalled;         /* the node call was cancelled by the idle timer */
    struct event *repark; /* paused past its node's share with no park token: tries again */
    bool want_stats;      /* REQUEST_STATS_FULL: the node calls' stats are summed (rr_stats_take) */
    uint64_t seen_rows, ret_rows, seen_cells, ret_cells;
    int64_t start_us; /* st_mono_us() at the call's start, for the stats' latency */
    /* Per node of pin_c: when its copy of the table was created, as first seen (0: not yet). */
    const rtr_cluster *pin_c;
    int64_t pinned_us[ST_TOPO_NODES_MAX];
} rr_op;

static void rr_step(void *arg);

/* The node call is no longer paused. */
static void rr_unpaused(rr_op *op) {
    if (op->paused && op->node->reads_paused > 0)
        op->node->reads_paused--;
    op->paused = false;
    if (op->repark)
        evtimer_del(op->repark);
}

static void rr_free(rr_op *op, st_code code, const char *msg) {
    rr_unpaused(op);
    rtr_inflight_unlink(&op->link);
    if (code == ST_OK)
        rtr_qod_served(op->r, op->fp);
    rpc_call_unhold(op->call, op->held);
    rpc_call_finish(op->call, code, msg);
    st_buf_free(&op->head);
    st_buf_free(&op->pos);
    st_buf_free(&op->cur_start);
    st_buf_free(&op->cur_end);
    st_buf_free(&op->backlog.buf);
    st_buf_free(&op->fwd);
    rtr_rr_track_deinit(&op->track);
    if (op->idle)
        event_free(op->idle);
    if (op->repark)
        event_free(op->repark);
    free(op);
}

/* A multi-cluster read whose node sends nothing for RTR_FO_ATTEMPT_MS while another cluster
 * remains (a stopped process, a partition: no reset ever comes) is cancelled and moves on. The
 * timer restarts with every message, so a long scan that keeps answering is never cut. */
static void rr_give_up(rr_op *op) {
    if (op->wait == RR_NODE && op->inflight) {
        op->stalled = true;
        rpc_ccall_cancel(op->inflight); /* rr_done moves the read on */
    }
}

static void rr_idle_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rr_op *op = arg;
    if (!op->paused) /* a paused node call is silent on purpose */
        rr_give_up(op);
}

/* Its cluster turned unhealthy while the node call was out: move on now (rr_done). */
static void rr_move(rtr_inflight *f) {
    rr_give_up((rr_op *)((char *)f - offsetof(rr_op, link)));
}

static void rr_idle_arm(rr_op *op) {
    if (!op->plan.multi || op->plan.cur + 1 >= op->plan.n)
        return;
    op->link.move = rr_move;
    rtr_inflight_link(op->c, &op->link);
    if (!op->idle && !(op->idle = evtimer_new(op->r->base, rr_idle_cb, op)))
        return; /* out of memory: the client's deadline still bounds the read */
    struct timeval tv = {RTR_FO_ATTEMPT_MS / 1000, (RTR_FO_ATTEMPT_MS % 1000) * 1000};
    evtimer_add(op->idle, &tv);
}

static size_t backlog_bytes(const rr_op *op) {
    return rtr_msgq_bytes(&op->backlog);
}

/* Makes the budget count what the backlog holds now. */
static void rr_hold_sync(rr_op *op) {
    size_t now = backlog_bytes(op);
    if (now > op->held)
        rpc_call_hold(op->call, now - op->held);
    else if (now < op->held)
        rpc_call_unhold(op->call, op->held - now);
    op->held = now;
}

/* Moves backlogged messages into the client's queue while it has room of its own: they are
 * counted in the budget already, so moving them takes nothing more from it. */
static st_code rr_drain(rr_op *op) {
    st_code rc = rtr_msgq_drain(&op->backlog, op->call, true);
    rr_hold_sync(op);
    return rc;
}

static void rr_writable(rpc_call *call, void *arg);

/* from: the node call msg arrived on (NULL: msg is the router's own), whose buffer is handed
 * to the client's call instead of copied when it can be. */
static st_code rr_emit(rr_op *op, rpc_ccall *from, st_slice msg) {
    if (backlog_bytes(op) > 0) {
        st_code rc = rr_drain(op); /* older messages first */
        if (rc != ST_OK)
            return rc;
    }
    if (backlog_bytes(op) == 0 && rpc_call_writable(op->call)) {
        if (from && rpc_ccall_msg_take(from, &op->fwd))
            return rpc_call_send_buf(op->call, &op->fwd);
        return rpc_call_send(op->call, msg);
    }
    if (rtr_msgq_push(&op->backlog, msg) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    rr_hold_sync(op);
    /* Only a read that had to wait asks to hear about room: registering costs an event per call
     * (and one more each time the queue empties). The server remembers that the queue was full,
     * so the notice still comes. */
    if (!op->writable_cb) {
        op->writable_cb = true;
        rpc_call_set_writable_cb(op->call, rr_writable, op);
    }
    return ST_OK;
}

/* Continues once the backlog is out: the next step, or the end. */
static void rr_continue(rr_op *op) {
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rr_free(op, ST_CANCELLED, NULL);
        return;
    }
    st_code rc = rr_drain(op);
    if (rc != ST_OK) {
        rr_free(op, rc, "could not send rows");
        return;
    }
    if (backlog_bytes(op) > 0) {
        op->wait = RR_WRITABLE;
        return;
    }
    if (op->complete) {
        rr_free(op, ST_OK, NULL);
        return;
    }
    rr_step(op);
}

/* Whether the node call must pause: the process is past its queued-response budget while the
 * client has not taken what it was sent (bytes queued or backlogged: the next message would
 * wait here), or the backlog is past the read's own bound. */
static bool rr_should_pause(rr_op *op) {
    size_t b = backlog_bytes(op);
    if (b > RTR_READ_BACKLOG_BYTES)
        return true;
    return (b > 0 || rpc_call_queued_bytes(op->call) > 0) && rpc_call_over_budget(op->call);
}

/* Takes one token of node's park bucket (a stream reset it may be sent); false when empty. */
static bool rr_park_token(rtr_node *n) {
    int64_t now = st_mono_us();
    double burst = n->via_unix ? RTR_READ_PARK_UNIX_BURST : RTR_READ_PARK_BURST;
    double per_s = n->via_unix ? RTR_READ_PARK_UNIX_PER_S : RTR_READ_PARK_PER_S;
    if (n->park_at_us == 0)
        n->park_tokens = burst;
    else
        n->park_tokens += (double)(now - n->park_at_us) * per_s / 1e6;
    if (n->park_tokens > burst)
        n->park_tokens = burst;
    n->park_at_us = now > 0 ? now : 1;
    if (n->park_tokens < 1)
        return false;
    n->park_tokens -= 1;
    return true;
}

/* Cancels the node call of a read whose client does not take what it is sent: the read parks
 * (rr_done). */
static void rr_park(rr_op *op, rpc_ccall *call) {
    st_log(ST_LOG_DEBUG, "router", "read table=%s parked: client slow, backlog=%zu bytes",
           op->table, backlog_bytes(op));
    rr_unpaused(op);
    op->parking = true;
    rpc_ccall_cancel(call);
}

static void rr_repark_arm(rr_op *op);

/* A read paused past its node's share when the park bucket was empty parks once there is a
 * token, unless the node is back within its share meanwhile. */
static void rr_repark_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rr_op *op = arg;
    if (op->wait != RR_NODE || !op->paused || !op->inflight ||
        op->node->reads_paused <= RTR_READ_PAUSED_PER_NODE)
        return;
    if (rr_park_token(op->node))
        rr_park(op, op->inflight);
    else
        rr_repark_arm(op);
}

static void rr_repark_arm(rr_op *op) {
    if (!op->repark && !(op->repark = evtimer_new(op->r->base, rr_repark_cb, op)))
        return; /* out of memory: it stays paused */
    struct timeval tv = {RTR_READ_REPARK_MS / 1000, (RTR_READ_REPARK_MS % 1000) * 1000};
    evtimer_add(op->repark, &tv);
}

/* The client does not take what it is sent: the node call pauses (flow control), or, when its
 * node already has its share of paused reads, is cancelled and the read parks. */
static void rr_pause(rr_op *op, rpc_ccall *call) {
    if (!op->writable_cb) { /* rr_writable resumes it once the client took its bytes */
        op->writable_cb = true;
        rpc_call_set_writable_cb(op->call, rr_writable, op);
    }
    if (op->idle) /* the node falls silent on purpose: not a reason to move on */
        evtimer_del(op->idle);
    bool over = op->node->reads_paused >= RTR_READ_PAUSED_PER_NODE;
    if (over && rr_park_token(op->node)) {
        rr_park(op, call);
        return;
    }
    st_log(ST_LOG_DEBUG, "router", "read table=%s paused: client slow, backlog=%zu bytes",
           op->table, backlog_bytes(op));
    op->paused = true;
    op->node->reads_paused++;
    rpc_ccall_pause(call);
    if (over)
        rr_repark_arm(op);
}

/* A parked read goes on once its client has taken every byte it was sent: a read whose client
 * takes a little at a time does not make its node start and cancel a call each time. */
static void rr_unpark(rr_op *op) {
    st_code rc = rr_drain(op);
    if (rc != ST_OK) {
        rr_free(op, rc, "could not send rows");
        return;
    }
    if (backlog_bytes(op) == 0 && rpc_call_queued_bytes(op->call) == 0) {
        op->wait = RR_IDLE;
        rr_continue(op);
    }
}

static void rr_resume(rr_op *op) {
    rr_unpaused(op);
    rpc_ccall_resume(op->inflight);
    if (op->idle)
        rr_idle_arm(op);
}

static void rr_writable(rpc_call *call, void *arg) {
    (void)call;
    rr_op *op = arg;
    if (op->wait == RR_WRITABLE) {
        op->wait = RR_IDLE;
        rr_continue(op);
    } else if (op->wait == RR_PARKED) {
        rr_unpark(op);
    } else if (op->wait == RR_NODE) {
        st_code rc = rr_drain(op);
        if (rc != ST_OK && op->inflight)
            rpc_ccall_cancel(op->inflight);
        else if (op->paused && op->inflight && !rr_should_pause(op))
            rr_resume(op);
    }
}

static void rr_cancelled(rpc_call *call, void *arg) {
    (void)call;
    rr_op *op = arg;
    if (op->wait == RR_NODE && op->inflight)
        rpc_ccall_cancel(op->inflight); /* rr_done cleans up */
    else if (op->wait == RR_WRITABLE || op->wait == RR_IDLE || op->wait == RR_PARKED)
        rr_free(op, ST_CANCELLED, NULL);
    /* RR_TIMER: the timer (or refresh) callback sees the cancellation. */
}

/* ---- request_stats (REQUEST_STATS_FULL): one for the whole read ----
 * Every node call ends with the stats of its own part. Passed on as they came, a read over
 * several tablets gave the client one per tablet, and the client kept the last: a scan that
 * returned 100 rows reported 0 returned (the last tablet's). They are summed here instead and sent
 * once, alone in the read's last message. */
#define RR_STATS_VIEW_FIELD 6 /* ReadRowsRequest.request_stats_view */
#define RR_STATS_FULL 2       /* RequestStatsView.REQUEST_STATS_FULL */
#define RR_STATS_FIELD BTU_READ_STATS_FIELD

static bool rr_wants_stats(st_slice req) {
    const uint8_t *p = req.data, *end = rtr_slice_end(req);
    uint32_t num, wt;
    uint64_t v;
    st_slice b;
    bool full = false;
    while (rtr_wire_scan(&p, end, &num, &wt, &v, &b) == 1)
        if (num == RR_STATS_VIEW_FIELD && wt == 0)
            full = v == RR_STATS_FULL;
    return full;
}

/* Adds the request_stats msg carries to op's sums; true when it carried some. */
static bool rr_stats_take(rr_op *op, st_slice msg) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    uint32_t num, wt;
    uint64_t v;
    st_slice b;
    bool has = false;
    while (rtr_wire_scan(&p, end, &num, &wt, &v, &b) == 1) {
        if (num != RR_STATS_FIELD || wt != 2)
            continue;
        has = true;
        Google__Bigtable__V2__RequestStats *rs =
            google__bigtable__v2__request_stats__unpack(NULL, b.len, b.data);
        const Google__Bigtable__V2__ReadIterationStats *it =
            rs && rs->full_read_stats_view ? rs->full_read_stats_view->read_iteration_stats : NULL;
        if (it) {
            op->seen_rows += (uint64_t)it->rows_seen_count;
            op->ret_rows += (uint64_t)it->rows_returned_count;
            op->seen_cells += (uint64_t)it->cells_seen_count;
            op->ret_cells += (uint64_t)it->cells_returned_count;
        }
        if (rs)
            google__bigtable__v2__request_stats__free_unpacked(rs, NULL);
    }
    return has;
}

/* The summed stats as the read's last message. */
static st_code rr_stats_emit(rr_op *op) {
    btu_read_stats st = {(int64_t)op->seen_rows, (int64_t)op->ret_rows, (int64_t)op->seen_cells,
                         (int64_t)op->ret_cells};
    uint8_t buf[BTU_READ_STATS_BYTES_MAX];
    size_t len = btu_read_stats_pack(&st, st_mono_us() - op->start_us, buf);
    return rr_emit(op, NULL, st_slice_make(buf, len));
}

/* The read is over: the stats when asked for, then OK once the backlog is out. */
static void rr_end(rr_op *op) {
    if (op->want_stats && rr_stats_emit(op) != ST_OK) {
        rr_free(op, ST_RESOURCE_EXHAUSTED, "out of memory building request stats");
        return;
    }
    op->want_stats = false;
    op->complete = true;
    rr_continue(op);
}

/* msg (a node's) to the client, without its request_stats when the read sums them. */
static st_code rr_relay(rr_op *op, rpc_ccall *call, st_slice msg) {
    if (!op->want_stats || !rr_stats_take(op, msg))
        return rr_emit(op, call, msg);
    static const uint32_t stats_field[] = {RR_STATS_FIELD};
    st_buf rest;
    st_buf_init(&rest);
    st_code rc = rtr_wire_copy_except(&rest, msg, stats_field, 1);
    if (rc == ST_OK && rest.len > 0)
        rc = rr_emit(op, NULL, st_buf_slice(&rest));
    st_buf_free(&rest);
    return rc;
}

static bool rr_limit_reached(const rr_op *op) {
    return op->limit > 0 && op->track.committed >= (uint64_t)op->limit;
}

static void rr_msg(rpc_ccall *call, st_slice msg, void *arg) {
    rr_op *op = arg;
    if (op->limit_hit && !op->stalled && op->want_stats && op->last.code == ST_OK)
        rr_stats_take(op, msg); /* the node's stats may follow the row that reached the limit */
    if (op->limit_hit || op->stalled || op->parking)
        return;
    if (op->idle && evtimer_pending(op->idle, NULL))
        rr_idle_arm(op); /* the node is alive: restart its silence clock */
    uint64_t committed = op->track.committed;
    st_code rc = rtr_rr_track_feed(&op->track, msg, op->reversed);
    if (rc == ST_OK)
        rc = rr_relay(op, call, msg);
    /* A row delivered is progress, and a retry resumes after it: a later failure (a second
     * restart of the node under a long scan) gets the whole retry budget again. */
    if (rc == ST_OK && op->track.committed > committed)
        op->attempts = 0;
    if (rc != ST_OK) {
        st_err_set(&op->last, rc, "could not relay rows from node");
        op->relay_failed = true;
        op->limit_hit = true; /* stop taking answers; rr_done reports op->last */
        op->complete = false;
        rpc_ccall_cancel(call);
        return;
    }
    /* rows_limit reached: the node call carries the limit too (the client's request, or the
     * rows still allowed), so the node ends the stream by itself right after this row. It is not
     * reset: a node accepts only so many stream resets per second before it closes the whole
     * connection (every read on it then fails), and ending by itself costs it nothing more. */
    if (rr_limit_reached(op))
        op->limit_hit = true;
    else if (!op->paused && rr_should_pause(op))
        rr_pause(op, call);
}

static st_code set_buf(st_buf *b, st_slice v) {
    st_buf_reset(b);
    return st_buf_append(b, v.data, v.len);
}

/* Moves the position past the rows delivered so far (never backwards). */
static st_code rr_resume_pos(rr_op *op) {
    if (!op->track.has_last)
        return ST_OK;
    st_slice last = st_buf_slice(&op->track.last);
    if (!op->reversed) {
        st_buf next;
        st_buf_init(&next);
        st_code rc = st_buf_append(&next, last.data, last.len);
        if (rc == ST_OK)
            rc = st_buf_append_byte(&next, 0); /* the rows after last */
        if (rc == ST_OK &&
            (!op->has_pos || st_slice_cmp(st_buf_slice(&next), st_buf_slice(&op->pos)) > 0)) {
            rc = set_buf(&op->pos, st_buf_slice(&next));
            op->has_pos = true;
        }
        st_buf_free(&next);
        return rc;
    }
    if (op->has_pos && st_slice_cmp(last, st_buf_slice(&op->pos)) >= 0)
        return ST_OK;
    op->has_pos = true;
    return set_buf(&op->pos, last);
}

/* A row cut short by a failure is withdrawn before the read resumes. */
static st_code rr_reset_open_row(rr_op *op) {
    static const uint8_t reset[] = {0x0a, 0x02, 0x40, 0x01}; /* chunks { reset_row: true } */
    if (!op->track.row_open)
        return ST_OK;
    op->track.row_open = false;
    return rr_emit(op, NULL, st_slice_make(reset, sizeof reset));
}

static void rr_refreshed(void *arg) {
    rr_op *op = arg;
    op->wait = RR_IDLE;
    rr_continue(op); /* sees a cancellation itself */
}

static void rr_after_backoff(void *arg) {
    rr_op *op = arg;
    op->wait = RR_IDLE;
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rr_free(op, ST_CANCELLED, NULL);
        return;
    }
    if (op->plan.multi) { /* every cluster failed: start over, healthy ones first */
        rtr_plan_restart(op->r, &op->plan);
        op->c = rtr_plan_cluster(op->r, &op->plan);
    }
    if (op->c->map_gen != op->gen || rtr_health_cluster_refuses(op->r, op->c->idx)) {
        rr_continue(op);
        return;
    } /* the map changed since this try (or the cluster refuses: no refresh): go on */
    op->wait = RR_TIMER;
    if (rtr_cluster_refresh(op->c, rr_refreshed, op) != ST_OK)
        rr_free(op, op->last.code, op->last.msg);
}

static void rr_retry(rr_op *op) {
    if (op->last.code == ST_UNAVAILABLE && rtr_plan_dark(op->r, &op->plan)) {
        rtr_plan_unreachable(op->r, &op->plan, op->c, &op->last, &op->last);
        rr_free(op, op->last.code, op->last.msg);
        return;
    }
    if (!rtr_retry_allowed(op->attempts, op->last.code, op->last.msg) || op->r->closing ||
        rr_resume_pos(op) != ST_OK || rr_reset_open_row(op) != ST_OK) {
        rr_free(op, op->last.code, op->last.msg);
        return;
    }
    op->wait = RR_TIMER;
    if (rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), rr_after_backoff, op) != ST_OK)
        rr_free(op, op->last.code, op->last.msg);
}

/* Moves a multi-cluster read to its plan's next cluster, resuming after the last row delivered
 * (the other cluster holds the same rows once replicated); false when there is none. */
static bool rr_failover(rr_op *op) {
    if (op->r->closing || !rtr_plan_next(op->r, &op->plan, op->last.code))
        return false;
    op->c = rtr_plan_cluster(op->r, &op->plan);
    op->map_checked = false;
    if (rr_resume_pos(op) != ST_OK || rr_reset_open_row(op) != ST_OK)
        rr_free(op, ST_RESOURCE_EXHAUSTED, "out of memory");
    else
        rr_continue(op);
    return true;
}

/* The tablet's rows are all read: move to the next tablet (or finish). */
static void rr_tablet_done(rr_op *op) {
    rtr_tablet tb = {.start = st_buf_slice(&op->cur_start), .end = st_buf_slice(&op->cur_end)};
    st_slice next;
    op->attempts = 0;
    if (!rtr_read_next_pos(&tb, op->reversed, &next)) {
        rr_end(op);
        return;
    } else if (set_buf(&op->pos, next) != ST_OK) {
        rr_free(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    op->has_pos = true;
    rr_continue(op);
}

/* A node call failed with code (op->last holds the message): the next cluster, a retry, or the
 * end. */
static void rr_after_failure(rr_op *op, st_code code, bool stalled) {
    if (code == ST_UNAVAILABLE || stalled) {
        rtr_health_report(op->node, code);
        if (rr_failover(op))
            return;
    }
    /* A damaged replica of the tablet: the next cluster's goes on after the last row sent. */
    if (rtr_plan_moves_off_replica(&op->plan, code) && rr_failover(op))
        return;
    if (rtr_retryable(code, op->last.msg, true)) {
        rr_retry(op);
        return;
    }
    rr_free(op, code, op->last.msg);
}

static void rr_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    rr_op *op = arg;
    op->inflight = NULL;
    op->wait = RR_IDLE;
    rtr_inflight_unlink(&op->link);
    if (op->idle)
        evtimer_del(op->idle);
    bool stalled = op->stalled;
    op->stalled = false;
    rr_unpaused(op); /* the node call is over: the next one starts unpaused */
    bool parking = op->parking;
    op->parking = false;
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rr_free(op, ST_CANCELLED, NULL);
        return;
    }
    if (op->relay_failed) {
        rr_free(op, op->last.code, op->last.msg);
        return;
    }
    if (op->limit_hit) {
        rr_end(op);
        return;
    }
    if (parking) { /* goes on after the last row relayed, as after a failure, without one */
        if (rr_resume_pos(op) != ST_OK || rr_reset_open_row(op) != ST_OK) {
            rr_free(op, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        op->wait = RR_PARKED;
        rr_unpark(op);
        return;
    }
    if (stalled) {
        code = ST_DEADLINE_EXCEEDED;
        message = "the node sent nothing within the attempt deadline, or its cluster turned "
                  "unhealthy";
    }
    if (code == ST_OK) {
        rr_tablet_done(op);
        return;
    }
    st_err_set(&op->last, code, "%s", message ? message : "");
    /* The client's own deadline passing is not the node's fault: only UNAVAILABLE and the idle
     * timer's deadline move a read. */
    /* A request the node never processed may go again: refused by its GOAWAY (the node is up:
     * retry on a new connection), or never sent because the connect failed (the node is
     * unreachable: marked down, next cluster). */
    rtr_call_fate fate = rtr_call_fate_of(call, code);
    if (fate == RTR_CALL_UNREACHED) /* the connect failed: the node is unreachable */
        rtr_health_report(op->node, code);
    if (fate != RTR_CALL_SENT) {
        if (fate == RTR_CALL_REFUSED || !rr_failover(op))
            rr_retry(op);
        return;
    }
    size_t lost = code == ST_UNAVAILABLE ? rpc_ccall_conn_lost(call) : 0;
    if (lost > 0 && op->scan_conn)
        lost += rtr_node_lost_beside(op->node);
    if (lost > 0) { /* the node's connection dropped under the call: a query of death? */
        rtr_health_report(op->node, code);
        rtr_qod_verdict v =
            rtr_qod_dropped(op->r, op->fp, lost, op->node, rtr_qod_drop_id(op->node, op->conn_id),
                            st_mono_us(), &op->moved_once, &op->last);
        if (v == RTR_QOD_REFUSE) {
            rr_free(op, op->last.code, op->last.msg);
            return;
        }
    }
    rr_after_failure(op, code, stalled);
}

static const uint32_t rr_replaced_fields[] = {2, 4}; /* rows, rows_limit */

/* The node request for one tablet: the original request with the tablet's ranges and the rows
 * still allowed. */
static st_code rr_request(rr_op *op, const btu_rowset *sub, st_buf *out) {
    if (!op->head_made && rtr_wire_copy_except(&op->head, op->req, rr_replaced_fields, 2) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    op->head_made = true;
    if (st_buf_append(out, op->head.data, op->head.len) != ST_OK ||
        rtr_wire_put_rowset(out, 2, sub) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    if (op->limit > 0 &&
        rtr_wire_put_varint(out, 4, (uint64_t)op->limit - op->track.committed) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* The request for tablet tb into out. The first step on a tablet holding every row asked for
 * (the common case: a point read, a scan inside one tablet) sends the client's bytes as they
 * came: nothing to rewrite. */
static st_code rr_build(rr_op *op, const rtr_tablet *tb, st_buf *out, st_slice *req) {
    if (!op->has_pos && op->track.committed == 0 && rtr_read_covers(&op->rs, tb)) {
        *req = op->req;
        return ST_OK;
    }
    st_arena a;
    st_arena_init(&a, 4096);
    btu_rowset sub;
    st_code rc =
        rtr_read_collect(&op->rs, op->reversed, op->has_pos, st_buf_slice(&op->pos), tb, &a, &sub);
    if (rc == ST_OK)
        rc = rr_request(op, &sub, out);
    st_arena_deinit(&a);
    *req = st_buf_slice(out);
    return rc;
}

static void rr_send(rr_op *op, const rtr_tablet *tb) {
    int64_t timeout;
    if (!rtr_call_timeout(op->call, 0, &timeout)) {
        rr_free(op, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        return;
    }
    st_buf buf;
    st_buf_init(&buf);
    st_slice req;
    if (set_buf(&op->cur_start, tb->start) != ST_OK || set_buf(&op->cur_end, tb->end) != ST_OK ||
        rr_build(op, tb, &buf, &req) != ST_OK) {
        st_buf_free(&buf);
        rr_free(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rpc_metadata md[RTR_FORWARD_HEADERS_MAX + 1];
    size_t n_md = rtr_forward_headers(op->call, md);
    char created[24];
    int64_t pin = tb->node < ST_TOPO_NODES_MAX ? op->pinned_us[tb->node] : 0;
    if (pin != 0) {
        snprintf(created, sizeof created, "%lld", (long long)pin);
        md[n_md++] = (rpc_metadata){BTU_TABLE_CREATED_HEADER, created};
    }
    op->wait = RR_NODE;
    op->node = &op->c->nodes[tb->node];
    op->scan_conn = !btu_rowset_is_point(&op->rs, BTU_ROWSET_POINT_KEYS_MAX);
    if (!op->scan_conn) {
        op->inflight = rtr_node_call(op->node, RTR_BT "ReadRows", req, md, n_md, timeout, rr_msg,
                                     rr_done, op, &op->last);
        op->conn_id = op->node->conn_id;
    } else {
        op->inflight = rtr_node_call_scan(op->node, RTR_BT "ReadRows", req, md, n_md, timeout,
                                          rr_msg, rr_done, op, &op->conn_id, &op->last);
    }
    st_buf_free(&buf);
    if (op->inflight) {
        rpc_ccall_set_owner(op->inflight, rpc_call_conn_serial(op->call));
        rr_idle_arm(op);
    }
    if (!op->inflight) {
        op->wait = RR_IDLE;
        rtr_health_report(op->node, ST_UNAVAILABLE);
        if (!rr_failover(op))
            rr_retry(op);
    }
}

/* Pins the table: when each node of the cluster had its copy created, as the map says when the
 * read first steps in the cluster (a read that moves to another cluster pins that one's anew).
 * False when the map now says another for node: the table was deleted and created again since
 * the read began. */
static bool rr_pin(rr_op *op, uint32_t node) {
    const rtr_tmap *m = op->c->map;
    if (op->pin_c != op->c) {
        op->pin_c = op->c;
        for (size_t i = 0; i < ST_TOPO_NODES_MAX; i++)
            op->pinned_us[i] =
                i < op->c->n_nodes ? rtr_tmap_created_us(m, op->table, (uint32_t)i) : 0;
    }
    int64_t now = rtr_tmap_created_us(m, op->table, node);
    if (node >= ST_TOPO_NODES_MAX || now == 0)
        return true;
    if (op->pinned_us[node] == 0) /* not listed by the node then (it was down) */
        op->pinned_us[node] = now;
    return op->pinned_us[node] == now;
}

static void rr_table_gone(rr_op *op) {
    st_err_set(&op->last, ST_NOT_FOUND,
               "table \"%s\" was deleted during the read (a table created under its name since "
               "is another table); read it again",
               op->table);
    rr_free(op, op->last.code, op->last.msg);
}

/* A cluster none of whose nodes answers is not sent to (health.c): the next cluster of a
 * multi-cluster plan (the read resumes there as after a failover), or UNAVAILABLE at once. False
 * when op went on that way. */
static bool rr_gate(rr_op *op) {
    rtr_plan_gate g = rtr_plan_gate_check(op->r, &op->plan, &op->last);
    rtr_cluster *c = rtr_plan_cluster(op->r, &op->plan);
    if (c != op->c)
        op->map_checked = false;
    op->c = c;
    if (g == RTR_GATE_END)
        rr_free(op, op->last.code, op->last.msg);
    else if (g == RTR_GATE_RETRY)
        rr_retry(op);
    return g == RTR_GATE_GO;
}

/* The table has no tablet in the cluster: maybe the map is stale (refreshed once to see), else
 * the cluster does not serve it (added after the table was created): the next cluster of a
 * multi-cluster plan, or a clear error. */
static void rr_no_tablets(rr_op *op) {
    if (!op->map_checked) {
        op->map_checked = true;
        op->wait = RR_TIMER;
        if (rtr_cluster_refresh(op->c, rr_refreshed, op) != ST_OK)
            rr_free(op, ST_RESOURCE_EXHAUSTED, "too many requests wait for a tablet map");
        return;
    }
    rtr_table_not_in_cluster(op->c, op->table, &op->last);
    if (!rr_failover(op))
        rr_free(op, op->last.code, op->last.msg);
}

/* No node of op->c serves the rows the read is at: the plan's next cluster (resuming after the
 * last row delivered), a wait for a move, or the error. */
static void rr_unserved(rr_op *op) {
    rtr_unserved_act a = rtr_unserved_check(&op->plan, op->c, op->table, "some rows", st_mono_us(),
                                            &op->unserved, &op->last);
    if (a == RTR_UNSERVED_MOVE && rr_failover(op))
        return;
    if (a == RTR_UNSERVED_END)
        rr_free(op, op->last.code, op->last.msg);
    else
        rr_retry(op);
}

static void rr_step(void *arg) {
    rr_op *op = arg;
    if (rr_limit_reached(op)) {
        rr_end(op);
        return;
    }
    if (!rr_gate(op))
        return;
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    if (!t || t->n == 0) {
        rr_no_tablets(op);
        return;
    }
    size_t k = 0;
    st_slice gap;
    op->gen = op->c->map_gen;
    st_code rc =
        rtr_read_locate(&op->rs, op->reversed, op->has_pos, st_buf_slice(&op->pos), t, &k, &gap);
    if (rc == ST_OK && !rr_pin(op, t->v[k].node)) {
        rr_table_gone(op);
        return;
    }
    if (rc == ST_OK) {
        rr_send(op, &t->v[k]);
        return;
    }
    if (rc == ST_NOT_FOUND) {
        rr_end(op);
        return;
    }
    if (rc == ST_UNAVAILABLE) {
        rr_unserved(op);
        return;
    }
    if (rc != ST_OK)
        rr_free(op, rc, "out of memory");
}

/* The fields a read is routed by: peeked from the wire when plainly encoded (no unpacking of
 * filters and keys the node reads anyway), else unpacked. */
typedef struct rr_args {
    const char *table, *profile;
    const Google__Bigtable__V2__RowSet *rows; /* NULL: every row */
    int64_t limit;
    bool reversed;
} rr_args;

static bool rr_parse(rpc_call *call, st_slice req_bytes, rr_args *a) {
    rtr_rr_peek pk;
    if (rtr_peek_read_rows(req_bytes, &pk)) {
        st_arena *ar = rpc_call_arena(call);
        a->rows = NULL;
        a->table = rtr_peek_str(ar, pk.table);
        a->profile = rtr_peek_str(ar, pk.profile);
        a->limit = pk.rows_limit;
        a->reversed = pk.reversed;
        if (pk.has_rows)
            a->rows =
                (void *)rtr_unpack_try(call, &google__bigtable__v2__row_set__descriptor, pk.rows);
        if (a->table && a->profile && (a->rows || !pk.has_rows))
            return true;
    }
    Google__Bigtable__V2__ReadRowsRequest *req =
        (void *)rtr_unpack(call, &google__bigtable__v2__read_rows_request__descriptor, req_bytes);
    if (!req)
        return false;
    *a = (rr_args){req->table_name, req->app_profile_id, req->rows, req->rows_limit, req->reversed};
    return true;
}

void rtr_h_read_rows(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    rr_args req;
    rtr_plan plan;
    /* ReadRowsRequest: authorized_view_name 9, materialized_view_name 11 */
    if (rtr_data_view_refused(call, req_bytes, 9, 11) || !rr_parse(call, req_bytes, &req) ||
        !rtr_table_or_fail(r, call, req.table))
        return;
    st_err err = {0};
    /* Row affinity applies to reads of exactly one row key. */
    bool one_row = req.rows && req.rows->n_row_keys == 1 && req.rows->n_row_ranges == 0;
    st_slice row = one_row ? st_slice_make(req.rows->row_keys[0].data, req.rows->row_keys[0].len)
                           : st_slice_make(NULL, 0);
    if (rtr_route_plan(r, req.profile, RTR_ACCESS_READ, row, &plan, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    uint64_t fp = rtr_qod_fingerprint(RTR_BT "ReadRows", req_bytes);
    if (rtr_qod_refused(r, fp, &err)) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (req.limit < 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "rows_limit must not be negative");
        return;
    }
    rr_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (rr_op){.r = r,
                  .call = call,
                  .c = rtr_plan_cluster(r, &plan),
                  .plan = plan,
                  .table = req.table,
                  .reversed = req.reversed,
                  .limit = req.limit,
                  .req = req_bytes,
                  .fp = fp,
                  .want_stats = rr_wants_stats(req_bytes),
                  .start_us = st_mono_us()};
    st_buf_init(&op->head);
    st_buf_init(&op->pos);
    st_buf_init(&op->cur_start);
    st_buf_init(&op->cur_end);
    st_buf_init(&op->backlog.buf);
    st_buf_init(&op->fwd);
    rtr_rr_track_init(&op->track);
    st_code rc = btu_rowset_from_pb(req.rows, rpc_call_arena(call), &op->rs, &err);
    if (rc != ST_OK) {
        rr_free(op, rc, err.msg);
        return;
    }
    rpc_call_set_cancel_cb(call, rr_cancelled, op);
    rr_step(op);
}
