/* changes.c — change streams on the router (docs/changestreams.md, "The router").
 *
 * GenerateInitialChangeStreamPartitions answers one partition per tablet of the table in the
 * cluster of the (single-cluster) app profile, from a freshly refreshed tablet map.
 *
 * ReadChangeStream: a partition within one tablet (usually equal to it) goes to the node that
 * holds it and every answer streams through until the node ends the stream (asked for batches, the
 * node sends a turn's records as one message of framed responses, appended to the client's call
 * as they are: rcs_emit). A partition that
 * spans several tablets (a split, or a range the client chose) is answered by the router, on a
 * tablet map refreshed first (a map older than the split would name tablets that no longer
 * exist): CloseStream OUT_OF_RANGE with the partition's piece in each overlapping tablet as a
 * new partition and, for each, a continuation token for that piece derived from the request. A
 * node's own CloseStream starts a refresh of the map. Flow control as in read.c: answers wait in a
 * backlog, counted in the queued-response budget, while the client is slow; once the process is
 * past that budget while the client has not taken what it was sent, or the backlog passes
 * RTR_READ_BACKLOG_BYTES, the node call is paused with HTTP/2 flow control (rpc_ccall_pause: the
 * node's stream stalls after the change stream links' window, RTR_CS_STREAM_WINDOW_BYTES) and
 * resumed once the client took the backlog. A slow client never costs a cancelled node call (a node
 * closes a connection that resets too many streams). At most
 * --max-change-streams streams are relayed at once (RESOURCE_EXHAUSTED past it), which with the
 * budget bounds the router's memory (docs/changestreams.md, "Router memory"). A node answering
 * strata-not-owner makes the router refresh the map and decide again (forward, or CloseStream);
 * a lost node connection ends the stream with UNAVAILABLE (the client resumes from its last
 * token). */
#include "failover.h"
#include "instance.h"
#include "router_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/rpc/status.pb-c.h"
#include "strata/cstoken.h"

typedef Google__Bigtable__V2__RowRange pb_range;
typedef Google__Bigtable__V2__StreamContinuationToken pb_token;
typedef Google__Bigtable__V2__StreamPartition pb_partition;
typedef Google__Bigtable__V2__ReadChangeStreamRequest pb_rcs_req;

/* ---- partitions: key ranges [start, end), empty end = unbounded (strata/cstoken.h) ---- */

static bool range_overlaps(btu_key_range x, btu_key_range y) {
    return (x.end.len == 0 || st_slice_cmp(y.start, x.end) < 0) &&
           (y.end.len == 0 || st_slice_cmp(x.start, y.end) < 0);
}

static btu_key_range range_intersect(btu_key_range x, btu_key_range y) {
    btu_key_range o;
    o.start = st_slice_cmp(x.start, y.start) >= 0 ? x.start : y.start;
    o.end = btu_end_cmp(x.end, y.end) <= 0 ? x.end : y.end;
    return o;
}

static btu_key_range tablet_range(const rtr_tablet *tb) {
    return (btu_key_range){tb->start, tb->end};
}

/* A StreamPartition of r shaped as Cloud Bigtable's, arena memory (keys not copied). */
static pb_partition *partition_pb(st_arena *a, btu_key_range r) {
    pb_partition *p = st_arena_alloc(a, sizeof *p);
    pb_range *rr = st_arena_alloc(a, sizeof *rr);
    if (!p || !rr)
        return NULL;
    btu_cs_partition_set(p, rr, r.start, r.end);
    return p;
}

/* The tablets of t overlapping part: [*first, *first + *n). covered: they hold every row of
 * part without a gap. */
static void overlapping(const rtr_tmap_table *t, btu_key_range part, size_t *first, size_t *n,
                        bool *covered) {
    *first = 0;
    *n = 0;
    *covered = false;
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        if (!range_overlaps(part, tablet_range(&t->v[i])))
            continue;
        if (*n == 0)
            *first = i;
        (*n)++;
    }
    if (*n == 0)
        return;
    const rtr_tablet *v = &t->v[*first];
    bool ok =
        st_slice_cmp(v[0].start, part.start) <= 0 && btu_end_cmp(v[*n - 1].end, part.end) >= 0;
    for (size_t i = 1; ok && i < *n; i++)
        ok = v[i - 1].end.len && st_slice_eq(v[i - 1].end, v[i].start);
    *covered = ok;
}

/* Where the request starts (docs/changestreams.md, "Tokens"): its continuation tokens, checked
 * and merged by the codec (one token as it is; several by their smallest W); start_time T as
 * "1.(T-1)"; no start at all as the router's clock now minus one. INVALID_ARGUMENT for bad
 * tokens or times. A start_time before the retention window is refused too, but into *stale
 * (its code set) with ST_OK returned: the node names the table's real bound (see rcs_op). */
static st_code start_pos(const pb_rcs_req *req, const btu_key_range *part, int64_t retention_us,
                         st_arena *a, btu_cs_pos *out, st_err *err, st_err *stale) {
    st_code rc = btu_cs_check_times(req, err); /* before a CloseStream can answer */
    if (rc != ST_OK)
        return rc;
    if (req->start_from_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS) {
        const Google__Bigtable__V2__StreamContinuationTokens *t = req->continuation_tokens;
        return btu_cs_tokens_merge(t ? t->tokens : NULL, t ? t->n_tokens : 0, part,
                                   btu_cs_table_tag(st_slice_cstr(req->table_name)), a, out, err);
    }
    int64_t us = st_wall_us();
    if (req->start_from_case ==
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME &&
        req->start_time) {
        int64_t now = us;
        rc = btu_cs_time_us(req->start_time, "start_time", true, &us, err);
        /* as the node does, before a CloseStream hands out tokens at that time: a node moves a
         * token past what it has resolved back to it (delivering writes made before the start),
         * and refuses one older than its history as a token, not as the start_time it was */
        if (rc == ST_OK)
            rc = btu_cs_start_time_check(us, now, INT64_MIN, req->table_name, err); /* future */
        if (rc != ST_OK)
            return rc;
        if (us < now - retention_us)
            btu_cs_start_time_check(us, now, now - retention_us, req->table_name, stale);
    }
    btu_cs_pos_live(out, us > 0 ? us - 1 : 0);
    return ST_OK;
}

/* ---- checks shared by both methods ---- */

/* The table exists and has change streams on, the profile uses single-cluster routing: its
 * cluster, and the table's retention into *retention_us (may be NULL). Fails the call
 * otherwise. */
static rtr_cluster *cs_route(rtr_ctx *r, rpc_call *call, const char *table, const char *profile,
                             int64_t *retention_us) {
    const rtr_meta_rec *rec = rtr_table_or_fail(r, call, table);
    if (!rec)
        return NULL;
    const char *id = profile[0] ? profile : RTR_PROFILE_DEFAULT;
    rtr_policy pol;
    rtr_cluster *c = NULL;
    st_err err = {0};
    if (rtr_profile_policy(r, id, &pol, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return NULL;
    }
    if (pol.kind == RTR_ROUTING_MULTI) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "app profile '%s' uses multi-cluster routing, and change streams need an app "
                 "profile with single-cluster routing (each cluster has its own history): use "
                 "or create a profile routed to one cluster",
                 id);
        return NULL;
    }
    if (rtr_profile_route(r, id, false, &c, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return NULL;
    }
    Google__Bigtable__Admin__V2__Table *t = (void *)rtr_unpack_try(
        call, &google__bigtable__admin__v2__table__descriptor, st_slice_make(rec->pb, rec->len));
    if (!t) {
        rtr_fail(call, ST_INTERNAL, "the stored schema of table %s is unreadable", table);
        return NULL;
    }
    if (!rtr_cs_enabled(t)) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "change streams are off for table %s: turn them on with UpdateTable "
                 "(change_stream_config.retention_period of 1 to 7 days)",
                 table);
        return NULL;
    }
    if (retention_us) {
        const Google__Protobuf__Duration *d = t->change_stream_config->retention_period;
        *retention_us = d->seconds * 1000000 + d->nanos / 1000;
    }
    return c;
}

/* ---- GenerateInitialChangeStreamPartitions ---- */

typedef struct gp_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    const char *table; /* call arena */
    int attempts;
} gp_op;

static void gp_refresh(void *arg);

static void gp_end(gp_op *op, st_code code, const char *msg) {
    rpc_call_finish(op->call, code, msg);
    free(op);
}

/* One partition per tablet, in key order. */
static void gp_answer(gp_op *op, const rtr_tmap_table *t) {
    st_arena *a = rpc_call_arena(op->call);
    for (size_t i = 0; i < t->n; i++) {
        Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse resp;
        google__bigtable__v2__generate_initial_change_stream_partitions_response__init(&resp);
        resp.partition = partition_pb(a, tablet_range(&t->v[i]));
        size_t len =
            resp.partition
                ? google__bigtable__v2__generate_initial_change_stream_partitions_response__get_packed_size(
                      &resp)
                : 0;
        uint8_t *buf = len ? st_arena_alloc(a, len) : NULL;
        if (!buf) {
            gp_end(op, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        google__bigtable__v2__generate_initial_change_stream_partitions_response__pack(&resp, buf);
        st_code rc = rpc_call_send(op->call, st_slice_make(buf, len));
        if (rc != ST_OK) {
            gp_end(op, rc, "could not send the partitions");
            return;
        }
    }
    gp_end(op, ST_OK, NULL);
}

static void gp_refreshed(void *arg) {
    gp_op *op = arg;
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        gp_end(op, ST_CANCELLED, NULL);
        return;
    }
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->table);
    if (!t || t->n == 0) {
        st_err err = {0};
        rtr_table_not_in_cluster(op->c, op->table, &err);
        gp_end(op, err.code, err.msg);
        return;
    }
    size_t first, n;
    bool covered;
    overlapping(t, (btu_key_range){st_slice_make(NULL, 0), st_slice_make(NULL, 0)}, &first, &n,
                &covered);
    if (covered) {
        gp_answer(op, t);
        return;
    }
    /* A gap: a tablet between two nodes (a move ending). Look again shortly. */
    if (op->attempts >= RTR_RETRIES_MAX ||
        rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), gp_refresh, op) != ST_OK) {
        char msg[RTR_TABLE_NAME_MAX + 256];
        snprintf(msg, sizeof msg,
                 "the tablets of table %s in cluster %s do not cover every row (a tablet is "
                 "being moved): retry",
                 op->table, op->c->topo->id);
        gp_end(op, ST_UNAVAILABLE, msg);
    }
}

static void gp_refresh(void *arg) {
    gp_op *op = arg;
    if (rtr_cluster_refresh(op->c, gp_refreshed, op) != ST_OK)
        gp_end(op, ST_RESOURCE_EXHAUSTED, "too many requests wait for a tablet map");
}

void rtr_h_generate_partitions(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__generate_initial_change_stream_partitions_request__descriptor,
        req_bytes);
    rtr_cluster *c = req ? cs_route(r, call, req->table_name, req->app_profile_id, NULL) : NULL;
    if (!c)
        return;
    gp_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (gp_op){r, call, c, req->table_name, 0};
    gp_refresh(op); /* partitions must be the tablets of now: the map is refreshed first */
}

/* ---- ReadChangeStream ---- */

typedef enum rcs_wait { RCS_IDLE, RCS_NODE, RCS_TIMER, RCS_WRITABLE } rcs_wait;

typedef struct rcs_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    const pb_rcs_req *req; /* call arena */
    st_slice req_bytes;
    btu_key_range part;
    btu_cs_pos start; /* where the request starts */
    rtr_node *node;   /* of the node call in flight */
    rpc_ccall *inflight;
    rcs_wait wait;
    rtr_msgq backlog; /* messages waiting for the client */
    st_buf fwd;
    bool writable_cb;
    st_buf token;   /* the last token relayed (record end or heartbeat), NUL-terminated */
    bool in_record; /* part of a DataChange was relayed, its last message not yet */
    bool paused;    /* the node call is paused (flow control) until the client takes the backlog */
    size_t held;    /* backlog bytes counted in the queued-response budget (rpc_call_hold) */
    bool closed;    /* the node sent CloseStream */
    bool complete;  /* finish with end once the backlog is out */
    st_err end;
    int attempts;
    uint64_t gen;
    bool map_checked; /* the map was refreshed once before answering CloseStream */
    /* The start_time is before the retention window (stale: the router's refusal). The
     * history also begins when streams were turned on, which only the nodes know, so a node
     * holding the partition's first rows is asked (it checks the start before the partition)
     * and its refusal is relayed; anything else it answers ends the call with stale. */
    bool probe;
    st_err stale;
} rcs_op;

static void rcs_step(rcs_op *op);

static void rcs_free(rcs_op *op, st_code code, const char *msg) {
    op->r->cs_streams--;
    op->r->cs_kept_bytes -= op->req_bytes.len;
    rpc_call_unhold(op->call, op->held);
    rpc_call_finish(op->call, code, msg);
    st_buf_free(&op->backlog.buf);
    st_buf_free(&op->fwd);
    st_buf_free(&op->token);
    free(op);
}

static size_t rcs_backlog(const rcs_op *op) {
    return rtr_msgq_bytes(&op->backlog);
}

/* Makes the budget count what the backlog holds now. An emptied backlog, or a spare buffer
 * (rpc_call_send_buf's swap), larger than RTR_CS_SPARE_BYTES is freed: a stream that was slow
 * once must not keep its peak in memory for the rest of its life (uncounted by the budget). */
static void rcs_hold_sync(rcs_op *op) {
    size_t now = rcs_backlog(op);
    if (now > op->held)
        rpc_call_hold(op->call, now - op->held);
    else if (now < op->held)
        rpc_call_unhold(op->call, op->held - now);
    op->held = now;
    if (now == 0 && op->backlog.buf.cap > RTR_CS_SPARE_BYTES)
        st_buf_free(&op->backlog.buf);
    if (op->fwd.cap > RTR_CS_SPARE_BYTES)
        st_buf_free(&op->fwd);
}

/* Moves backlogged messages into the client's queue while it has room of its own: they are
 * counted in the budget already, so moving them takes nothing more from it. */
static st_code rcs_drain(rcs_op *op) {
    st_code rc = rtr_msgq_drain(&op->backlog, op->call, true);
    rcs_hold_sync(op);
    return rc;
}

static void rcs_writable(rpc_call *call, void *arg);

/* Queues msg's messages behind the backlog (a backlog holds whole messages): msg itself, or
 * each message of a batch's frames (framed). */
static st_code rcs_backlog_push(rcs_op *op, st_slice msg, bool framed) {
    if (!framed)
        return rtr_msgq_push(&op->backlog, msg);
    for (const uint8_t *p = msg.data, *end = rtr_slice_end(msg); p < end;) {
        size_t len = rpc_frame_len(p);
        if (rtr_msgq_push(&op->backlog, st_slice_make(p + 5, len)) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        p += 5 + len;
    }
    return ST_OK;
}

/* As read.c's rr_emit: straight to the client while it takes messages, else into the backlog.
 * framed: msg is a batch's frames from the node (strata/cstoken.h, BTU_CS_BATCH_HEADER, checked
 * by batch_track), appended to the client's queue as they are framed. */
static st_code rcs_emit(rcs_op *op, rpc_ccall *from, st_slice msg, bool framed) {
    if (rcs_backlog(op) > 0) {
        st_code rc = rcs_drain(op);
        if (rc != ST_OK)
            return rc;
    }
    if (rcs_backlog(op) == 0 && rpc_call_writable(op->call)) {
        bool take = from && rpc_ccall_msg_take(from, &op->fwd);
        size_t off = take ? (size_t)(msg.data - op->fwd.data) : 0;
        st_code rc =
            framed ? (take ? rpc_call_send_framed_buf(op->call, &op->fwd, off)
                           : rpc_call_send_framed(op->call, msg))
                   : (take ? rpc_call_send_buf(op->call, &op->fwd) : rpc_call_send(op->call, msg));
        rcs_hold_sync(op); /* frees a large spare buffer */
        return rc;
    }
    if (rcs_backlog_push(op, msg, framed) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    rcs_hold_sync(op);
    if (!op->writable_cb) {
        op->writable_cb = true;
        rpc_call_set_writable_cb(op->call, rcs_writable, op);
    }
    return ST_OK;
}

/* Ends the stream with code once every message queued reached the client. */
static void rcs_end(rcs_op *op, st_code code, const char *msg) {
    op->complete = true;
    if (op->probe && code != ST_INVALID_ARGUMENT)
        op->end = op->stale;
    else
        st_err_set(&op->end, code, "%s", msg ? msg : "");
}

static void rcs_continue(rcs_op *op) {
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rcs_free(op, ST_CANCELLED, NULL);
        return;
    }
    st_code rc = rcs_drain(op);
    if (rc != ST_OK) {
        rcs_free(op, rc, "could not send the change stream");
        return;
    }
    if (rcs_backlog(op) > 0) {
        op->wait = RCS_WRITABLE;
        return;
    }
    if (op->complete) {
        rcs_free(op, op->end.code, op->end.code == ST_OK ? NULL : op->end.msg);
        return;
    }
    rcs_step(op);
}

/* Whether the node call must pause: the process is past its queued-response budget while the
 * client has not taken what it was sent (bytes queued or backlogged: the next message would
 * wait here), or the backlog is past the stream's own bound. */
static bool rcs_should_pause(rcs_op *op) {
    size_t b = rcs_backlog(op);
    if (b > RTR_READ_BACKLOG_BYTES)
        return true;
    return (b > 0 || rpc_call_queued_bytes(op->call) > 0) && rpc_call_over_budget(op->call);
}

/* Stops returning the node stream's flow-control window: the node stalls after at most
 * RTR_CS_STREAM_WINDOW_BYTES more and its reader waits, with its call, stream and position
 * intact (nothing is reset, no node work is repeated). rcs_writable resumes it. */
static void rcs_pause(rcs_op *op, rpc_ccall *call) {
    st_log(ST_LOG_DEBUG, "router", "change stream table=%s paused: client slow, backlog=%zu",
           op->req->table_name, rcs_backlog(op));
    op->paused = true;
    rpc_ccall_pause(call);
    st_buf_free(&op->fwd); /* no use while the stream waits: one buffer less per idle stream */
    if (!op->writable_cb) {
        op->writable_cb = true;
        rpc_call_set_writable_cb(op->call, rcs_writable, op);
    }
}

static void rcs_writable(rpc_call *call, void *arg) {
    (void)call;
    rcs_op *op = arg;
    if (op->wait == RCS_WRITABLE) {
        op->wait = RCS_IDLE;
        rcs_continue(op);
    } else if (op->wait == RCS_NODE) {
        if (rcs_drain(op) != ST_OK) {
            if (op->inflight)
                rpc_ccall_cancel(op->inflight);
        } else if (op->paused && op->inflight && !rcs_should_pause(op)) {
            op->paused = false;
            rpc_ccall_resume(op->inflight);
        }
    }
}

static void rcs_cancelled(rpc_call *call, void *arg) {
    (void)call;
    rcs_op *op = arg;
    if (op->wait == RCS_NODE && op->inflight)
        rpc_ccall_cancel(op->inflight); /* rcs_done cleans up */
    else if (op->wait == RCS_WRITABLE || op->wait == RCS_IDLE)
        rcs_free(op, ST_CANCELLED, NULL);
    /* RCS_TIMER: the timer (or refresh) callback sees the cancellation. */
}

/* The fields of message m (the lean reader: a relayed change costs the router little beside its
 * bytes): the last length-delimited field tok_num is *tok, a varint field done_num sets *done
 * (done_num 0: none). Malformed bytes end the walk, keeping what was found. */
static void scan_fields(st_slice m, uint32_t tok_num, uint32_t done_num, st_slice *tok,
                        bool *done) {
    const uint8_t *p = m.data, *end = rtr_slice_end(m);
    uint32_t num, wt;
    uint64_t v;
    st_slice b;
    while (rtr_wire_scan(&p, end, &num, &wt, &v, &b) == 1) {
        if (num == tok_num && wt == 2)
            *tok = b;
        else if (num == done_num && wt == 0)
            *done = v != 0;
    }
}

static st_code set_token(rcs_op *op, st_slice tok) {
    st_buf_reset(&op->token);
    if (st_buf_reserve(&op->token, tok.len + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    memcpy(op->token.data, tok.data, tok.len);
    op->token.data[tok.len] = 0;
    op->token.len = tok.len + 1;
    return ST_OK;
}

/* Follows the stream's position in one ReadChangeStreamResponse: a DataChange's last message
 * (done) and a Heartbeat carry the token to resume from; CloseStream ends the node's stream. */
static st_code rcs_track(rcs_op *op, st_slice msg) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    uint32_t num, wt;
    uint64_t v;
    st_slice f;
    int rc;
    while ((rc = rtr_wire_scan(&p, end, &num, &wt, &v, &f)) == 1) {
        if (wt != 2)
            continue;
        st_slice tok = st_slice_make(NULL, 0);
        if (num == 1) { /* DataChange: done = 8, token = 9 */
            bool done = false;
            scan_fields(f, 9, 8, &tok, &done);
            op->in_record = !done;
        } else if (num == 2) { /* Heartbeat: continuation_token = 1, its token = 2 */
            st_slice ct = st_slice_make(NULL, 0);
            bool unused = false;
            scan_fields(f, 1, 0, &ct, &unused);
            if (ct.data)
                scan_fields(ct, 2, 0, &tok, &unused);
        } else if (num == 3) {
            op->closed = true;
        }
        if (tok.len && set_token(op, tok) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    }
    return rc < 0 ? ST_INTERNAL : ST_OK;
}

/* The largest message the router's clients may be sent (--max-message-bytes). */
static size_t rtr_cs_message_max(void) {
    rpc_limits l;
    rpc_limits_get(&l);
    return l.message_bytes_max;
}

/* Whether msg is a batch (its first byte is BTU_CS_BATCH_TAG): 1 with its framed messages in
 * *frames, 0 for a plain message, -1 for a batch whose head does not match its length. */
static int batch_of(st_slice msg, st_slice *frames) {
    if (msg.len == 0 || msg.data[0] != BTU_CS_BATCH_TAG)
        return 0;
    if (msg.len < BTU_CS_BATCH_HEAD_BYTES)
        return -1;
    uint64_t n = 0;
    for (int i = 0; i < 5; i++)
        n |= (uint64_t)(msg.data[1 + i] & 0x7f) << (7 * i);
    if ((msg.data[5] & 0x80) || n != msg.len - BTU_CS_BATCH_HEAD_BYTES)
        return -1;
    *frames = st_slice_make(msg.data + BTU_CS_BATCH_HEAD_BYTES, n);
    return 1;
}

/* Checks a batch's frames (each a complete, uncompressed message of at most max bytes holding
 * a DataChange, at least one) and follows the stream's position in them. Only the last message
 * is read when it ends a record (it carries the batch's last token); a batch that stops inside a
 * record is read whole, since its last token is in an earlier message. INTERNAL when the frames
 * are not so. */
static st_code batch_track(rcs_op *op, st_slice frames, size_t max) {
    const uint8_t *p = frames.data, *end = rtr_slice_end(frames);
    st_slice last = st_slice_make(NULL, 0);
    while (p < end) {
        if (end - p < 6 || p[0] != 0)
            return ST_INTERNAL;
        size_t len = rpc_frame_len(p);
        if (len == 0 || len > (size_t)(end - p) - 5 || p[5] != BTU_CS_BATCH_INNER_TAG)
            return ST_INTERNAL;
        if (len > max)
            return ST_OUT_OF_RANGE; /* well formed, but more than this router may send */
        last = st_slice_make(p + 5, len);
        p += 5 + len;
    }
    if (!last.data)
        return ST_INTERNAL;
    st_code rc = rcs_track(op, last);
    bool whole = op->in_record;
    for (p = frames.data; rc == ST_OK && whole && p < end;) {
        size_t len = rpc_frame_len(p);
        rc = rcs_track(op, st_slice_make(p + 5, len));
        p += 5 + len;
    }
    return rc;
}

/* A live stream never finishes by itself: its principal is checked again with every message
 * (records and heartbeats), so a token rotated or removed, or a role revoked, ends it rather than
 * leaving it reading the table's changes for as long as the client stays connected. */
static bool rcs_still_allowed(rcs_op *op, st_code *code, const char **why) {
    if (!rtr_auth_on(op->r))
        return true;
    const char *p = rtr_auth_principal(op->r, op->call);
    *code = p ? ST_PERMISSION_DENIED : ST_UNAUTHENTICATED;
    *why = p ? "the principal lost bigtable.tables.readChangeStream on the table while its change "
               "stream ran: ask an admin for the role, then resume from the last token"
             : "the bearer token was rotated or removed while the change stream ran: resume from "
               "the last token with a current one";
    return p && rtr_auth_role(op->r, p, op->req->table_name) >= ST_ROLE_READER;
}

static void rcs_msg(rpc_ccall *call, st_slice msg, void *arg) {
    rcs_op *op = arg;
    if (op->complete)
        return;
    if (op->probe) { /* the node took the start_time (its clock is behind): refuse it here */
        rcs_end(op, ST_OK, NULL);
        rpc_ccall_cancel(call);
        return;
    }
    st_code denied;
    const char *why;
    if (!rcs_still_allowed(op, &denied, &why)) {
        rcs_end(op, denied, why);
        rpc_ccall_cancel(call);
        return;
    }
    op->attempts = 0; /* the stream makes progress: retries count afresh */
    st_slice frames;
    int batch = batch_of(msg, &frames);
    size_t max = rtr_cs_message_max();
    st_code bad = batch < 0       ? ST_INTERNAL
                  : batch         ? batch_track(op, frames, max)
                  : msg.len > max ? ST_OUT_OF_RANGE
                                  : ST_OK;
    if (bad != ST_OK) {
        char text[RPC_GRPC_MESSAGE_MAX];
        if (bad == ST_OUT_OF_RANGE) /* the router's own bound, not the node's fault */
            snprintf(text, sizeof text,
                     "a change stream message is larger than this router's --max-message-bytes "
                     "(%zu): a change with values up to 256 KiB per message needs at least 1 MiB; "
                     "restart the router with a larger --max-message-bytes, then resume from the "
                     "last token received",
                     max);
        else
            snprintf(text, sizeof text,
                     "node %s sent a change stream batch that is not well formed (a bad message "
                     "prefix or length): resume from the last token received",
                     op->node ? op->node->addr : "?");
        rcs_end(op, bad == ST_OUT_OF_RANGE ? ST_FAILED_PRECONDITION : ST_INTERNAL, text);
        rpc_ccall_cancel(call);
        return;
    }
    st_code rc = batch ? ST_OK : rcs_track(op, msg);
    if (rc == ST_OK)
        rc = batch ? rcs_emit(op, call, frames, true) : rcs_emit(op, call, msg, false);
    if (rc != ST_OK) {
        rcs_end(op, rc, "could not relay the change stream from its node");
        rpc_ccall_cancel(call);
        return;
    }
    /* A slow client: the node call pauses with flow control (messages already on their way
     * still arrive, into the backlog). Pausing anywhere, even inside a record, is safe: nothing
     * is cut, the node merely waits. */
    if (!op->paused && rcs_should_pause(op))
        rcs_pause(op, call);
}

static void rcs_refreshed(void *arg) {
    rcs_op *op = arg;
    op->wait = RCS_IDLE;
    rcs_continue(op); /* sees a cancellation itself */
}

static void rcs_map_renewed(void *arg) {
    (void)arg;
}

/* Refreshes the cluster's map without waiting for it, so that the next request for the new
 * partitions finds their tablets. Failure is harmless: rcs_step refreshes before a CloseStream. */
static void rcs_map_renew(rtr_cluster *c) {
    if (rtr_cluster_refresh(c, rcs_map_renewed, NULL) != ST_OK)
        st_log(ST_LOG_DEBUG, "router",
               "cluster=%s tablet map refresh after CloseStream not started", c->topo->id);
}

static void rcs_after_backoff(void *arg) {
    rcs_op *op = arg;
    op->wait = RCS_IDLE;
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rcs_free(op, ST_CANCELLED, NULL);
        return;
    }
    if (op->c->map_gen != op->gen) {
        rcs_continue(op); /* the map changed since this try: use it */
        return;
    }
    op->wait = RCS_TIMER;
    if (rtr_cluster_refresh(op->c, rcs_refreshed, op) != ST_OK) {
        op->wait = RCS_IDLE;
        rcs_end(op, ST_RESOURCE_EXHAUSTED, "too many requests wait for a tablet map");
        rcs_continue(op);
    }
}

/* After a backoff and a fresh tablet map, decide again (forward or CloseStream). */
static void rcs_retry(rcs_op *op, st_code code, const char *msg) {
    if (!rtr_retry_allowed(op->attempts, code, msg) || op->r->closing) {
        rcs_end(op, code, msg);
        rcs_continue(op);
        return;
    }
    op->wait = RCS_TIMER;
    if (rtr_later_add(op->r, rtr_backoff_ms(++op->attempts), rcs_after_backoff, op) != ST_OK) {
        op->wait = RCS_IDLE;
        rcs_end(op, code, msg);
        rcs_continue(op);
    }
}

/* How a node call that ended with code leaves the stream: its end (rcs_end), or a retry after
 * a fresh map (returns false: the retry continues the stream). */
static bool rcs_outcome(rcs_op *op, rpc_ccall *call, st_code code, const char *message) {
    if (op->probe) {
        rcs_end(op, code, message); /* the node's refusal, or stale: never retried */
    } else if (code == ST_OK || op->closed) {
        if (op->closed) /* the node split or merged the tablet: see its new tablets now */
            rcs_map_renew(op->c);
        rcs_end(op, code, message);
    } else if (op->in_record) {
        rcs_end(op, ST_UNAVAILABLE,
                "the change stream's node stopped in the middle of a record: resume from the "
                "last token received");
    } else if (rtr_retryable(code, message, false) ||
               (code == ST_UNAVAILABLE && rpc_ccall_unprocessed(call))) {
        rcs_retry(op, code, message); /* the tablet moved or split: a fresh map decides */
        return false;
    } else if (code == ST_UNAVAILABLE) {
        char msg[RPC_GRPC_MESSAGE_MAX];
        rtr_health_report(op->node, code);
        snprintf(msg, sizeof msg,
                 "the connection to node %s failed during the change stream (%s): resume from "
                 "the last token received",
                 op->node->addr, message ? message : "connection lost");
        rcs_end(op, ST_UNAVAILABLE, msg);
    } else {
        rcs_end(op, code, message);
    }
    return true;
}

static void rcs_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    rcs_op *op = arg;
    op->inflight = NULL;
    op->wait = RCS_IDLE;
    if (rpc_call_cancelled(op->call) || op->r->closing) {
        rcs_free(op, ST_CANCELLED, NULL);
        return;
    }
    op->paused = false; /* the node call is over: the next one starts unpaused */
    if (!op->complete && !rcs_outcome(op, call, code, message))
        return;
    rcs_continue(op); /* op->complete: relaying failed, or the stream's end */
}

/* The client's request, or once tokens were relayed the same request resuming from the last
 * one: continuation_tokens = [{the request's partition, token}] instead of start_time (4) or
 * continuation_tokens (6). */
static st_code rcs_request(rcs_op *op, st_buf *out, st_slice *req) {
    *req = op->req_bytes;
    if (!op->token.len)
        return ST_OK;
    static const uint32_t skip[] = {4, 6};
    st_slice part = st_slice_make(NULL, 0);
    const uint8_t *p = op->req_bytes.data, *end = p + op->req_bytes.len;
    rtr_wire_field f;
    bool bad = false;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 3 && f.wire_type == 2)
            part = f.bytes;
    st_buf tok, toks;
    st_buf_init(&tok);
    st_buf_init(&toks);
    st_code rc = rtr_wire_copy_except(out, op->req_bytes, skip, 2);
    if (rc == ST_OK)
        rc = rtr_wire_put_bytes(&tok, 1, part);
    if (rc == ST_OK)
        rc = rtr_wire_put_bytes(&tok, 2, st_slice_make(op->token.data, op->token.len - 1));
    if (rc == ST_OK)
        rc = rtr_wire_put_bytes(&toks, 1, st_buf_slice(&tok));
    if (rc == ST_OK)
        rc = rtr_wire_put_bytes(out, 6, st_buf_slice(&toks));
    st_buf_free(&tok);
    st_buf_free(&toks);
    *req = st_buf_slice(out);
    return rc;
}

static void rcs_send(rcs_op *op, const rtr_tablet *tb) {
    int64_t timeout;
    if (!rtr_call_timeout(op->call, 0, &timeout)) {
        rcs_end(op, ST_DEADLINE_EXCEEDED, "deadline exceeded");
        rcs_continue(op);
        return;
    }
    st_buf buf;
    st_buf_init(&buf);
    st_slice req;
    if (rcs_request(op, &buf, &req) != ST_OK) {
        st_buf_free(&buf);
        rcs_end(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        rcs_continue(op);
        return;
    }
    rpc_metadata md[RTR_FORWARD_HEADERS_MAX];
    size_t n_md = rtr_forward_headers(op->call, md);
    md[n_md++] = (rpc_metadata){BTU_CS_BATCH_HEADER, "1"}; /* a turn's records in one message */
    st_err err = {0};
    op->node = &op->c->nodes[tb->node];
    op->wait = RCS_NODE;
    op->inflight = rtr_node_call_long(op->node, RTR_BT "ReadChangeStream", req, md, n_md, timeout,
                                      rcs_msg, rcs_done, op, &err);
    st_buf_free(&buf);
    if (!op->inflight && err.code == ST_RESOURCE_EXHAUSTED) { /* the node is fine */
        op->wait = RCS_IDLE;
        rcs_end(op, ST_RESOURCE_EXHAUSTED, err.msg);
        rcs_continue(op);
    } else if (!op->inflight) {
        char msg[RPC_GRPC_MESSAGE_MAX];
        op->wait = RCS_IDLE;
        rtr_health_report(op->node, ST_UNAVAILABLE);
        snprintf(msg, sizeof msg,
                 "node %s of cluster %s, which holds the partition, cannot be reached (%s): "
                 "retry from the last token received",
                 op->node->addr, op->c->topo->id, err.msg);
        rcs_end(op, ST_UNAVAILABLE, msg);
        rcs_continue(op);
    }
}

/* The partition is no longer within one tablet: CloseStream OUT_OF_RANGE with, for each tablet
 * it overlaps, the piece of the old partition in that tablet as new partition and a token for
 * that same piece (a client reading the new partitions with the tokens given gets every row of
 * the old partition once, and no rows outside it). */
static void rcs_close(rcs_op *op, const rtr_tablet *v, size_t n) {
    st_arena *a = rpc_call_arena(op->call);
    /* Once tokens were relayed the stream resumes from the last one, else from the request. */
    btu_cs_pos *from = &op->start, last;
    if (op->token.len &&
        btu_cs_token_parse(st_slice_make(op->token.data, op->token.len - 1), &last, NULL) == ST_OK)
        from = &last;
    from->has_table = true; /* as the node's tokens: refused by another table's stream */
    from->table = btu_cs_table_tag(st_slice_cstr(op->req->table_name));
    char *text = st_arena_alloc(a, BTU_CS_TOKEN_MAX);
    if (text)
        btu_cs_token_format(from, text);
    Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream cs;
    google__bigtable__v2__read_change_stream_response__close_stream__init(&cs);
    Google__Rpc__Status status;
    google__rpc__status__init(&status);
    status.code = ST_OUT_OF_RANGE;
    status.message = (char *)"the partition no longer matches one tablet (it was split or merged): "
                             "read the new partitions, starting from these tokens";
    cs.status = &status;
    cs.continuation_tokens = st_arena_alloc(a, n * sizeof *cs.continuation_tokens);
    cs.new_partitions = st_arena_alloc(a, n * sizeof *cs.new_partitions);
    bool ok = text && cs.continuation_tokens && cs.new_partitions;
    for (size_t i = 0; ok && i < n; i++) {
        /* The piece of the old partition in this tablet starts where the old partition was:
         * a token applies to any range. */
        pb_token *tk = st_arena_alloc(a, sizeof *tk);
        ok = tk != NULL;
        if (ok) {
            google__bigtable__v2__stream_continuation_token__init(tk);
            tk->partition = partition_pb(a, range_intersect(op->part, tablet_range(&v[i])));
            tk->token = text;
            cs.new_partitions[i] = partition_pb(a, range_intersect(op->part, tablet_range(&v[i])));
            ok = tk->partition && cs.new_partitions[i];
            cs.continuation_tokens[i] = tk;
        }
    }
    cs.n_continuation_tokens = cs.n_new_partitions = n;
    Google__Bigtable__V2__ReadChangeStreamResponse resp;
    google__bigtable__v2__read_change_stream_response__init(&resp);
    resp.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM;
    resp.close_stream = &cs;
    size_t len = ok ? google__bigtable__v2__read_change_stream_response__get_packed_size(&resp) : 0;
    uint8_t *buf = ok ? st_arena_alloc(a, len) : NULL;
    if (!buf) {
        rcs_end(op, ST_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        google__bigtable__v2__read_change_stream_response__pack(&resp, buf);
        st_code rc = rcs_emit(op, NULL, st_slice_make(buf, len), false);
        rcs_end(op, rc, rc == ST_OK ? NULL : "could not send CloseStream");
    }
    rcs_continue(op);
}

static void rcs_step(rcs_op *op) {
    const rtr_tmap_table *t = rtr_tmap_find(op->c->map, op->req->table_name);
    size_t first, n;
    bool covered;
    overlapping(t, op->part, &first, &n, &covered);
    op->gen = op->c->map_gen;
    if (op->probe && n > 0) {
        rcs_send(op, &t->v[first]);
        return;
    }
    if (op->probe) { /* no node to ask: stale */
        rcs_end(op, ST_OK, NULL);
        rcs_continue(op);
        return;
    }
    if (!covered) {
        char msg[RTR_TABLE_NAME_MAX + 256];
        snprintf(msg, sizeof msg,
                 "no tablet of table %s in cluster %s holds some rows of the partition (a "
                 "tablet is being moved, or the cluster has no copy of the table): retry",
                 op->req->table_name, op->c->topo->id);
        rcs_retry(op, ST_UNAVAILABLE, msg);
        return;
    }
    if (n == 1) { /* one tablet holds the whole partition (maybe more rows): its node reads it */
        rcs_send(op, &t->v[first]);
        return;
    }
    /* The map may predate a split or merge the client already saw (a node's CloseStream):
     * CloseStream from it would name tablets that no longer exist. Decide on a fresh map. */
    if (!op->map_checked) {
        op->map_checked = true;
        op->wait = RCS_TIMER;
        if (rtr_cluster_refresh(op->c, rcs_refreshed, op) == ST_OK)
            return;
        op->wait = RCS_IDLE;
        rcs_end(op, ST_RESOURCE_EXHAUSTED, "too many requests wait for a tablet map: retry");
        rcs_continue(op);
        return;
    }
    rcs_close(op, &t->v[first], n);
}

void rtr_h_read_change_stream(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    st_err err = {0};
    if (btu_cs_request_keepable(req_bytes.len, r->cs_kept_bytes, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    pb_rcs_req *req = (void *)rtr_unpack(
        call, &google__bigtable__v2__read_change_stream_request__descriptor, req_bytes);
    int64_t retention_us = 0;
    rtr_cluster *c =
        req ? cs_route(r, call, req->table_name, req->app_profile_id, &retention_us) : NULL;
    if (!c)
        return;
    st_arena *a = rpc_call_arena(call);
    btu_key_range part;
    if (btu_cs_partition_range(req->partition, "partition", a, &part, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (r->cs_streams >= r->opts.change_streams_max) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED,
                 "this router already relays %" PRIu32 " change streams, its limit "
                 "(strata-router --max-change-streams): close streams that are not read, retry "
                 "later, or read through another router",
                 r->cs_streams);
        return;
    }
    rcs_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (start_pos(req, &part, retention_us, a, &op->start, &err, &op->stale) != ST_OK) {
        free(op);
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    r->cs_streams++; /* rcs_free counts it out */
    r->cs_kept_bytes += req_bytes.len;
    rpc_call_request_kept(call); /* counted in cs_kept_bytes instead */
    op->r = r;
    op->call = call;
    op->c = c;
    op->req = req;
    op->req_bytes = req_bytes;
    op->part = part;
    op->probe = op->stale.code != ST_OK;
    st_buf_init(&op->backlog.buf);
    st_buf_init(&op->fwd);
    st_buf_init(&op->token);
    rpc_call_set_cancel_cb(call, rcs_cancelled, op);
    rcs_step(op);
}
