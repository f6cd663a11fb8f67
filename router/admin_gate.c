/* router/admin_gate.c — one schema change of a table at a time (docs/router.md, Schema changes
 * of one table run one at a time).
 *
 * ModifyColumnFamilies, UpdateTable and DeleteTable read the table's record, change it, and push
 * the whole result to every node and to the record. Two of them running at once would each start
 * from the record as it was, and the later push would undo the earlier: twelve concurrent
 * `cbt createfamily` calls on one table all succeeded and left five families. So each table has
 * a gate: the call holding it runs; a call that finds it taken waits in its queue (its request
 * kept in the call's arena) and its handler runs again from the start, on the record as the call
 * ahead left it, once that call has answered. A waiting call that is cancelled, or whose deadline
 * passes, is dropped when its turn comes.
 *
 * A gate is keyed by a full resource name: a table's SetIamPolicy (iam.c) waits at the table's
 * gate too, and changes of an app profile (profiles.c) and UpdateBackup / DeleteBackup
 * (backup.c) use gates keyed by the profile's or the backup's name; the backup sweep deletes an
 * expired backup only while holding its gate (rtr_gate_take), so an UpdateBackup answered OK is
 * never undone by a delete already under way. */
#include <stdlib.h>
#include <string.h>

#include "router_internal.h"

/* Calls that may wait for one table's gate; beyond, UNAVAILABLE (retry later). */
#define RTR_GATE_WAIT_MAX 256

typedef struct gate_wait {
    rtr_ctx *r;
    rtr_gate *gate;
    rpc_call *call;
    rtr_gate_fn fn;
    st_slice req; /* in the call's arena */
    struct gate_wait *next;
} gate_wait;

struct rtr_gate {
    char *table;
    const void *owner; /* the call running now (or the backup sweep's delete, rtr_gate_take) */
    gate_wait *head, *tail;
    size_t n_wait;
    struct rtr_gate *next;
};

static rtr_gate **gate_slot(rtr_ctx *r, const char *table) {
    rtr_gate **p = &r->gates;
    while (*p && strcmp((*p)->table, table) != 0)
        p = &(*p)->next;
    return p;
}

static bool gate_wait_add(rtr_ctx *r, rtr_gate *g, rpc_call *call, st_slice req, rtr_gate_fn fn) {
    if (g->n_wait >= RTR_GATE_WAIT_MAX) {
        rtr_fail(call, ST_UNAVAILABLE,
                 "%u changes of %s are already waiting for the one running: retry later",
                 RTR_GATE_WAIT_MAX, g->table);
        return false;
    }
    st_arena *a = rpc_call_arena(call);
    gate_wait *w = st_arena_alloc(a, sizeof *w);
    void *copy = req.len ? st_arena_dup(a, req.data, req.len) : NULL;
    if (!w || (req.len && !copy)) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory queueing a schema change");
        return false;
    }
    *w = (gate_wait){r, g, call, fn, st_slice_make(copy, req.len), NULL};
    if (g->tail)
        g->tail->next = w;
    else
        g->head = w;
    g->tail = w;
    g->n_wait++;
    return true;
}

/* A gate held by owner put in the free slot; false when out of memory. */
static bool gate_new(rtr_gate **slot, const char *name, const void *owner) {
    rtr_gate *g = calloc(1, sizeof *g);
    char *copy = strdup(name);
    if (!g || !copy) {
        free(g);
        free(copy);
        return false;
    }
    g->table = copy;
    g->owner = owner;
    *slot = g;
    return true;
}

bool rtr_gate_enter(rtr_ctx *r, const char *table, rpc_call *call, st_slice req, rtr_gate_fn fn) {
    rtr_gate **slot = gate_slot(r, table);
    rtr_gate *g = *slot;
    if (g && g->owner == call)
        return true; /* its turn came (gate_run) */
    if (g) {
        gate_wait_add(r, g, call, req, fn);
        return false;
    }
    if (!gate_new(slot, table, call)) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    return true;
}

bool rtr_gate_take(rtr_ctx *r, const char *name, const void *owner) {
    rtr_gate **slot = gate_slot(r, name);
    return !*slot && gate_new(slot, name, owner);
}

static void gate_next(rtr_ctx *r, rtr_gate *g);

/* The next waiting call's turn: its handler runs again (it enters the gate it now owns). */
static void gate_run(void *arg) {
    gate_wait *w = arg; /* in the call's arena: read before the call is answered */
    rtr_ctx *r = w->r;
    rtr_gate *g = w->gate;
    if (r->closing || rpc_call_cancelled(w->call)) {
        rpc_call_finish(w->call, r->closing ? ST_UNAVAILABLE : ST_CANCELLED,
                        r->closing ? "the router is shutting down" : NULL);
        gate_next(r, g);
        return;
    }
    w->fn(w->call, w->req, r);
}

/* The gate's owner answered: the next waiting call owns it, or it goes. */
static void gate_next(rtr_ctx *r, rtr_gate *g) {
    gate_wait *w = g->head;
    if (!w) {
        rtr_gate **slot = gate_slot(r, g->table);
        *slot = g->next;
        free(g->table);
        free(g);
        return;
    }
    g->head = w->next;
    if (!g->head)
        g->tail = NULL;
    g->n_wait--;
    g->owner = w->call;
    /* from the loop: the caller is still answering its own call */
    if (rtr_later_add(r, 0, gate_run, w) != ST_OK)
        gate_run(w);
}

void rtr_gate_leave(rtr_ctx *r, const void *owner) {
    rtr_gate *g = r->gates;
    while (g && g->owner != owner)
        g = g->next;
    if (g)
        gate_next(r, g);
}

void rtr_gates_close(rtr_ctx *r) {
    while (r->gates) {
        rtr_gate *g = r->gates;
        r->gates = g->next;
        for (gate_wait *w = g->head, *next; w; w = next) {
            next = w->next; /* w goes with its call */
            rpc_call_finish(w->call, ST_UNAVAILABLE, "the router is shutting down");
        }
        free(g->table);
        free(g);
    }
}
