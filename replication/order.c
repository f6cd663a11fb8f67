/* order.c — Apply calls of one source node start here in the order of its log.
 *
 * Cells converge whatever order replicated rows arrive in (versions decide), but a node's change
 * stream gives each row's records in the order its writes started here, so two writes of one row
 * applied out of their origin's order would come out of the stream swapped. A shipper keeps up to
 * REPL_INFLIGHT_BATCHES_MAX batches in flight, and two of them can reach this node out of order:
 * the smaller one's request completes first when both share the connection's bandwidth, or the
 * first one fails (a full memtable, a moved tablet) and is sent again after the second was applied.
 *
 * So each call names the batch it must follow (ApplyRequest.after_lsn: the end of the source's
 * latest earlier batch with rows for this node that this node has not acknowledged; 0 when there
 * is none), and this node starts it only once it started a batch of that source ending there or
 * later (started_next). Until then the call waits here, at most REPL_APPLY_PARK_MS, then it is
 * refused ABORTED and the source sends its batches again in order. A write that fails after it
 * started resets its source (started_next 0), so nothing that follows it starts before it is sent
 * again; a failure before its write started refuses the calls waiting behind it at once.
 * Loop thread only. */
#include "repl_internal.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdlib.h>

static bool turn_came(const repl_order *o, const repl_apply_op *op) {
    return op->src == REPL_ORDER_NONE || op->after_lsn == 0 ||
           o->started_next[op->src] >= op->after_lsn;
}

static void unlink_op(repl_order *o, repl_apply_op *op) {
    if (op->prev)
        op->prev->next = op->next;
    else
        o->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        o->tail = op->prev;
    op->prev = op->next = NULL;
    op->parked_us = 0;
    o->n_parked--;
    o->parked_of[op->src]--;
    rpc_call_set_cancel_cb(op->call, NULL, NULL);
}

static void refuse(repl_order *o, repl_apply_op *op, const char *why) {
    unlink_op(o, op);
    rpc_call_finish(op->call, ST_ABORTED, why);
}

/* The client went away (connection lost, deadline) while the call waited: it ends here. */
static void on_cancel(rpc_call *call, void *arg) {
    repl_apply_op *op = arg;
    unlink_op(&op->r->order, op);
    rpc_call_finish(call, ST_CANCELLED, NULL);
}

static void schedule_expiry(repl_ctx *r) {
    repl_order *o = &r->order;
    if (!o->head || (o->ev && evtimer_pending(o->ev, NULL)))
        return;
    int64_t due = o->head->parked_us + (int64_t)REPL_APPLY_PARK_MS * 1000 - st_mono_us();
    if (due < 0)
        due = 0;
    struct timeval tv = {(time_t)(due / 1000000), (suseconds_t)(due % 1000000)};
    if (o->ev)
        evtimer_add(o->ev, &tv);
}

static void on_expiry(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_ctx *r = arg;
    repl_order *o = &r->order;
    int64_t limit = st_mono_us() - (int64_t)REPL_APPLY_PARK_MS * 1000;
    uint64_t before = o->expired;
    for (; o->head && o->head->parked_us <= limit; o->expired++)
        refuse(o, o->head,
               "an earlier batch of the sending node did not reach this node in time; its "
               "shipper sends the batches again in order");
    if (o->expired > before)
        st_log(ST_LOG_WARN, "repl",
               "refused %" PRIu64 " Apply call(s) whose earlier batch did not come within %d ms "
               "(%" PRIu64 " so far): their shipper backs off and sends them again in order, "
               "which delays replication from it",
               o->expired - before, REPL_APPLY_PARK_MS, o->expired);
    schedule_expiry(r);
}

static void park(repl_ctx *r, repl_apply_op *op) {
    repl_order *o = &r->order;
    if (o->n_parked >= REPL_APPLY_PARKED_MAX ||
        o->parked_of[op->src] >= REPL_INFLIGHT_BATCHES_MAX || r->closing ||
        (!o->ev && !(o->ev = evtimer_new(r->o.base, on_expiry, r)))) {
        rpc_call_finish(op->call, ST_ABORTED,
                        "too many batches wait for earlier ones of their sending node; its "
                        "shipper sends them again in order");
        return;
    }
    op->parked_us = st_mono_us();
    op->next = NULL;
    op->prev = o->tail;
    if (o->tail)
        o->tail->next = op;
    else
        o->head = op;
    o->tail = op;
    o->n_parked++;
    o->parked_of[op->src]++;
    rpc_call_set_cancel_cb(op->call, on_cancel, op);
    schedule_expiry(r);
}

void repl_order_admit(repl_ctx *r, repl_apply_op *op) {
    op->prev = op->next = NULL;
    op->parked_us = 0;
    if (turn_came(&r->order, op))
        repl_apply_start(r, op);
    else
        park(r, op);
}

/* Starts the parked calls whose turn came, the one with the lowest after_lsn first: each start
 * may move its source on and so free further calls. */
static void release(repl_ctx *r) {
    repl_order *o = &r->order;
    if (o->releasing)
        return; /* a start inside the loop below: the loop looks again */
    o->releasing = true;
    for (;;) {
        repl_apply_op *best = NULL;
        for (repl_apply_op *op = o->head; op; op = op->next)
            if (turn_came(o, op) && (!best || op->after_lsn < best->after_lsn))
                best = op;
        if (!best)
            break;
        unlink_op(o, best);
        repl_apply_start(r, best);
    }
    o->releasing = false;
}

void repl_order_started(repl_ctx *r, const repl_apply_op *op) {
    if (op->src == REPL_ORDER_NONE)
        return;
    uint64_t *at = &r->order.started_next[op->src];
    if (op->next_lsn > *at)
        *at = op->next_lsn;
    release(r);
}

void repl_order_failed(repl_ctx *r, const repl_apply_op *op, bool write_started) {
    repl_order *o = &r->order;
    if (op->src == REPL_ORDER_NONE)
        return;
    if (write_started)
        o->started_next[op->src] = 0; /* what follows waits for it to be sent again */
    /* Calls of the source still waiting may wait for this one: the source sends them again. */
    for (repl_apply_op *w = o->head, *next; w; w = next) {
        next = w->next;
        if (w->src == op->src && !turn_came(o, w))
            refuse(o, w,
                   "an earlier batch of the sending node failed here; its shipper sends the "
                   "batches again in order");
    }
}

void repl_order_close(repl_ctx *r) {
    repl_order *o = &r->order;
    while (o->head) {
        repl_apply_op *op = o->head;
        unlink_op(o, op);
        rpc_call_finish(op->call, ST_UNAVAILABLE, "replication is shutting down");
    }
    if (o->ev)
        event_free(o->ev);
    o->ev = NULL;
}

uint64_t repl_apply_expired(const repl_ctx *r) {
    return r->order.expired;
}
