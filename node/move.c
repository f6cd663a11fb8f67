/* move.c — MoveTablet: copies a local tablet's visible cells (with their timestamps and
 * versions) and its tombstones to another node, then drops the tablet here. Asynchronous on the
 * loop thread, in steps chained by RPC completions and a per-move timer, so no step holds the
 * loop for long:
 *
 *   mark moving (writes now get strata-not-owner; reads go on)
 *   -> PutTable on the target (the table's schema) -> CreateTablet incoming (same range; the
 *   target picks its own id) -> wait until every write started before the mark has finished
 * (storage completes writes in order, so a counter suffices) -> snapshot + iterator -> CopyRows
 * batches: per row and version one row mutation of SetCells that keeps the cells' version, commit
 * time and origin, logged by the target as replicated (MOVE_BATCH_CELLS / MOVE_BATCH_BYTES each),
 * then the tombstones the same way (one row mutation of one delete each, with its version)
 *   -> wait (briefly) until every peer cluster has this node's log records of the tablet, else
 *   retire the tablet so they are shipped after the drop -> record the move in DATA/outgoing ->
 *   activate the copy (CreateTablet with `activate`) -> drop here ->
 *   take the record out -> pass this node's clock to the target (an empty CopyRows) -> answer
 *   with the target's Tablet.
 *
 * The copy reads system families too, so the tablet's change history (docs/changestreams.md)
 * moves with it; the target applies the copies without making change records of them, and each
 * CopyRows carries this node's clock so the target's records sort after the copied ones.
 *
 * Also the target's side, CopyRows (node_h_copy_rows).
 *
 * On failure the tablet stays here and writable again, the call gets the error, and the target's
 * half-filled tablet is dropped (best effort). An activation without a clear answer, and a
 * record found at start, are settled by asking the target (move_resolve). A move outlives a
 * cancelled MoveTablet call. Also the idle drop of incoming copies (incoming_check). */
#include "admin.h"
#include "changes.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "strata/storage.h" /* sto_row_mut_encode / decode: the log's row encoding is CopyRows' too */
#include "repl_glue.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/btutil.h"

#define MOVE_BATCH_CELLS 10000             /* cells (so also rows) per CopyRows */
#define MOVE_BATCH_BYTES ((size_t)4 << 20) /* cell bytes per CopyRows (one cell may exceed) */
/* Entries (visible or not) one turn of the tombstone copy looks at, so a tablet of many cells
 * and few tombstones does not hold the loop for its whole scan at once. */
#define MOVE_TOMB_SCAN_MAX 100000
#define MOVE_RPC_TIMEOUT_MS 120000
#define MOVE_DRAIN_POLL_MS 1
/* Before marking a tablet: how often and how long a move looks again while a DropRowRange job of
 * its table runs here (move_begin); then it fails UNAVAILABLE and its caller moves it again
 * later (the balancer at its next look). */
#define MOVE_DROP_POLL_MS 20
#define MOVE_DROP_WAIT_MS 20000
#define MOVE_SHIP_POLL_MS 20
/* Longest wait, after the copy, for the peer clusters to have the tablet's log records. Writes
 * to the tablet are held meanwhile, so it is short: past it the move goes on and the tablet is
 * retired (replication/retired.c), so its records still unshipped reach the peers after the
 * drop, as a split parent's do. The wait only keeps, while the peers keep up, the order in which
 * a peer applies a row's writes made just before the move (here) and just after (on the
 * target). It used to be 10 s and a failed move: two clusters moving the same range at once
 * each refused the other's replicated writes to it, so both moves held writes 10 s and failed. */
#define MOVE_SHIP_WAIT_MS 250
#define NODE_COPY_ROWS_MAX 10000 /* row mutations accepted in one CopyRows */
#define MOVE_RESOLVE_TIMEOUT_MS 10000
#define MOVE_RESOLVE_POLL_MS 1000  /* between questions to an unreachable target */
#define MOVE_RESOLVE_START_MS 5000 /* at most this long at start before the node listens */
#define MOVE_HOST_MAX 256
#define MOVE_ARENA_BLOCK_BYTES ((size_t)256 << 10)

#define NODE_SVC "/strata.internal.v1.Node/"

typedef struct node_move node_move;
typedef void (*move_step_fn)(node_move *m);

struct node_move {
    node_move *next;
    node_ctx *n;
    rpc_call *call; /* the MoveTablet call; finished exactly once */
    uint64_t id;    /* the tablet moving away */
    char table[NODE_TABLE_NAME_MAX + 1];
    char target[MOVE_HOST_MAX + 8];
    rpc_client *client;
    struct event *ev; /* runs `step` (deferred work, polling) */
    move_step_fn step;
    uint64_t drain_until; /* writes_started when the tablet was marked */
    bool marked;          /* this move set the tablet's `moving` (move_begin, resume_one) */
    int64_t begin_us;     /* st_mono_us of the MoveTablet call (the wait in move_begin) */
    st_buf target_tablet; /* the target's CreateTablet answer (a Tablet message) */
    uint64_t target_id;
    bool target_created;
    bool recorded;          /* named in DATA/outgoing: the activation may have happened */
    uint32_t resolve_tries; /* questions to the target about the activation (move_resolve) */
    bool aborting;          /* node_close: callbacks do nothing */
    bool answered;          /* the MoveTablet call is finished */
    bool entry_failed;      /* the target refused a copied row */
    sto_snapshot *snap;
    sto_iter *it;
    sto_tomb_iter *tombs; /* after the cells: the tombstones (move_send_batch) */
    st_arena arena;       /* the batch being built and sent */
    uint32_t batch_rows;  /* row mutations in the batch in flight */
    uint64_t cells_copied;
    uint64_t tombs_copied;
    int64_t ship_wait_from_us; /* st_mono_us when the wait for the shippers began */
    uint64_t ship_lsn;         /* the peers must have the log up to here before the drop */
    bool unshipped;            /* the wait ended with records of the tablet still unshipped */
    bool retired;              /* named in the retired tablets (node_repl_tablet_retire) */
};

void node_move_test_load(node_ctx *n) {
    const char *env = getenv(NODE_MOVE_TEST_ENV);
    node_move_test *t = &n->move_test;
    for (const char *p = env; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strncmp(p, "hold_ms=", 8) == 0)
            t->hold_ms = atoi(p + 8);
        else if (strncmp(p, "incoming_idle_ms=", 17) == 0)
            t->incoming_idle_ms = atoi(p + 17);
        else if (strncmp(p, "batch_ms=", 9) == 0)
            t->batch_ms = atoi(p + 9);
        else if (strncmp(p, "kill=activated", 14) == 0)
            t->kill_activated = true;
        else if (strncmp(p, "kill=created", 12) == 0)
            t->kill_created = true;
        else if (strncmp(p, "kill=activating", 15) == 0)
            t->kill_activating = true;
        else if (strncmp(p, "kill=answering", 14) == 0)
            t->kill_answering = true;
    }
    if (env && *env)
        st_log(ST_LOG_WARN, "move", "%s=%s: test faults in moves (unset it in production)",
               NODE_MOVE_TEST_ENV, env);
}

static void move_run(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_move *m = arg;
    m->step(m);
}

/* Runs step(m) from the loop after delay_ms (never inside an rpc_client callback's stack). */
static void move_defer(node_move *m, move_step_fn step, int delay_ms) {
    m->step = step;
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    evtimer_add(m->ev, &tv);
}

static void move_free(node_move *m) {
    node_move **p = &m->n->moves;
    while (*p && *p != m)
        p = &(*p)->next;
    if (*p)
        *p = m->next;
    if (m->client)
        rpc_client_free(m->client); /* outstanding callbacks run now and see `aborting` */
    if (m->it)
        sto_iter_free(m->it);
    sto_tomb_iter_free(m->tombs);
    if (m->snap)
        sto_snapshot_free(m->snap);
    if (m->ev)
        event_free(m->ev);
    st_buf_free(&m->target_tablet);
    st_arena_deinit(&m->arena);
    free(m);
}

static void move_unmark(node_move *m) {
    node_tablet *tab = m->marked ? node_tablet_by_id(m->n, m->id, NULL) : NULL;
    if (tab)
        tab->moving = false;
    m->marked = false;
}

/* ---- DATA/outgoing: moves whose activation may have happened ----
 * One line per move, "<tablet id> <target's tablet id> <target host:port>", written (atomically)
 * before the activation is sent and rewritten once the outcome is known. A source restarted with
 * a line for a tablet it still holds asks the target what became of the copy (move_resolve)
 * before serving the tablet again: killed between the activation and its own drop, it would
 * otherwise serve the range next to the target's activated copy. */

#define OUTGOING_MOVED "moved"

static st_code outgoing_save(node_ctx *n, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    char line[MOVE_HOST_MAX + 64];
    st_code rc = ST_OK;
    for (node_move *m = n->moves; rc == ST_OK && m; m = m->next)
        if (m->recorded) {
            int len = snprintf(line, sizeof line, "%" PRIu64 " %" PRIu64 " %s\n", m->id,
                               m->target_id, m->target);
            rc = st_buf_append(&b, line, (size_t)len);
        }
    /* A tablet moved away whose drop is pending keeps its line, marked "moved" (the activation
     * is known): restarted before the drop, the node drops it at once, never serving it next to
     * the target's. Where the marked line cannot be written, the unmarked one stays and the
     * target is asked again. Older builds read the first three fields only. */
    for (size_t i = 0; rc == ST_OK && i < n->n_drops; i++)
        if (n->drops[i].target_id) {
            const node_drop_pending *d = &n->drops[i];
            int len = snprintf(line, sizeof line, "%" PRIu64 " %" PRIu64 " %s %s\n", d->id,
                               d->target_id, d->target, OUTGOING_MOVED);
            rc = st_buf_append(&b, line, (size_t)len);
        }
    rc = node_data_file_save(n, NODE_OUTGOING_FILE, rc, &b, err);
    st_buf_free(&b);
    return rc;
}

/* Tablet id moved to target (as target_id) but its drop is pending (node_tablet_drop): the
 * pending drop takes over the move's DATA/outgoing line, kept until storage dropped the tablet. */
static void drop_keeps_line(node_ctx *n, uint64_t id, uint64_t target_id, const char *target) {
    node_drop_pending *d = node_drop_pending_find(n, id);
    if (!d)
        return;
    d->target_id = target_id;
    snprintf(d->target, sizeof d->target, "%s", target);
}

static void move_hand_line_to_drop(node_move *m) {
    drop_keeps_line(m->n, m->id, m->target_id, m->target);
}

/* Takes m's line out of DATA/outgoing (the outcome is known). A failure is logged: the next
 * start asks the target again, which is harmless. */
static void move_unrecord(node_move *m) {
    if (!m->recorded)
        return;
    m->recorded = false;
    st_err err = {0};
    if (outgoing_save(m->n, &err) != ST_OK)
        st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 ": %s", m->id, err.msg);
}

/* The tablet's retirement ends: gone, its records stay named until every peer has them; kept
 * here, the entry goes (the live tablet names its table). */
static void move_unretire(node_move *m, bool gone) {
    if (m->retired)
        node_repl_tablet_retire_done(m->n, m->id, gone);
    m->retired = false;
}

/* DropTablet of the target's copy; done runs with m. */
static st_code move_drop_copy(node_move *m, int timeout_ms, rpc_unary_done_fn done) {
    Strata__Internal__V1__DropTabletRequest req;
    strata__internal__v1__drop_tablet_request__init(&req);
    req.id = m->target_id;
    uint8_t buf[16];
    size_t len = protobuf_c_message_pack(&req.base, buf);
    return rpc_client_unary(m->client, NODE_SVC "DropTablet", st_slice_make(buf, len), NULL, 0,
                            timeout_ms, done, m);
}

static void cleanup_done(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "move",
               "tablet=%" PRIu64 " target=%s: could not drop the partial "
               "copy %" PRIu64 ": %s",
               m->id, m->target, m->target_id, msg ? msg : "");
    move_defer(m, move_free, 0);
}

/* Ends a failed move: the tablet serves writes again, the caller hears why, the target's partial
 * copy goes. */
static void move_fail(node_move *m, st_code code, const char *msg) {
    st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " target=%s failed after %" PRIu64 " cells: %s",
           m->id, m->target, m->cells_copied, msg);
    move_unmark(m);
    move_unrecord(m); /* the activation was not sent */
    move_unretire(m, false);
    if (!m->answered)
        node_fail(m->call, code == ST_OK ? ST_INTERNAL : code,
                  "moving tablet %" PRIu64 " to %s: %s", m->id, m->target, msg);
    m->answered = true;
    if (m->target_created && move_drop_copy(m, MOVE_RPC_TIMEOUT_MS, cleanup_done) == ST_OK)
        return;
    move_defer(m, move_free, 0);
}

/* Sends msg to the target as one unary call. */
static void move_unary(node_move *m, const char *method, const ProtobufCMessage *msg,
                       rpc_unary_done_fn done) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    char path[96];
    snprintf(path, sizeof path, NODE_SVC "%s", method);
    st_code rc = buf ? ST_OK : ST_RESOURCE_EXHAUSTED;
    if (rc == ST_OK) {
        protobuf_c_message_pack(msg, buf);
        rc = rpc_client_unary(m->client, path, st_slice_make(buf, len), NULL, 0,
                              MOVE_RPC_TIMEOUT_MS, done, m);
    }
    free(buf);
    if (rc != ST_OK)
        move_fail(m, ST_UNAVAILABLE, "the target's connection is gone");
}

/* CreateTablet of the moving tablet's range on the target: its incoming copy, or (incoming
 * false) the activation of that copy. */
static void move_create(node_move *m, bool incoming, rpc_unary_done_fn done) {
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (!tab) {
        move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
        return;
    }
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = m->table;
    req.start_key = (ProtobufCBinaryData){tab->start.len, tab->start.data};
    req.end_key = (ProtobufCBinaryData){tab->end.len, tab->end.data};
    req.incoming = incoming;
    req.activate = incoming ? 0 : m->target_id; /* never a new tablet in place of a lost copy */
    move_unary(m, "CreateTablet", &req.base, done);
}

/* ---- the end ---- */

static void move_send_clock(node_move *m);
static void move_answer(node_move *m);
static void move_activate(node_move *m);
static void move_resolve_start(node_move *m, st_code code, const char *msg);

static void move_finish(node_move *m) {
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(m->n, m->id, &t);
    if (!tab) {
        move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
        return;
    }
    st_err err = {0};
    bool dropped = node_tablet_drop(m->n, t, (size_t)(tab - t->v), &err) == ST_OK;
    if (!dropped) {
        st_log(ST_LOG_WARN, "move",
               "tablet=%" PRIu64 " copied but not dropped here yet (no longer served): %s", m->id,
               err.msg);
        move_hand_line_to_drop(m);
    }
    move_unretire(m, dropped);
    move_unrecord(m);
    st_log(ST_LOG_INFO, "move",
           "table=%s tablet=%" PRIu64 " moved to %s as %" PRIu64 " cells=%" PRIu64
           " tombstones=%" PRIu64,
           m->table, m->id, m->target, m->target_id, m->cells_copied, m->tombs_copied);
    move_send_clock(m);
}

/* After the drop, the target's clock moves past this node's once more: every change stream
 * position this node handed out for the tablet is below it, so records the target makes from
 * now on sort after them. A failure is logged only: the tablet is the target's already. */
static void clock_done(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " target=%s: could not pass the clock: %s",
               m->id, m->target, msg ? msg : st_code_name(code));
    move_answer(m);
}

static void move_send_clock(node_move *m) {
    Strata__Internal__V1__CopyRowsRequest req;
    strata__internal__v1__copy_rows_request__init(&req);
    req.tablet_id = m->target_id;
    req.clock_us = node_cs_next_stamp(m->n);
    uint8_t buf[32];
    size_t len = protobuf_c_message_pack(&req.base, buf);
    if (rpc_client_unary(m->client, NODE_SVC "CopyRows", st_slice_make(buf, len), NULL, 0,
                         MOVE_RPC_TIMEOUT_MS, clock_done, m) != ST_OK)
        move_answer(m);
}

static void move_answer(node_move *m) {
    if (!m->answered) {
        st_code rc = rpc_call_send(m->call, st_buf_slice(&m->target_tablet));
        rpc_call_finish(m->call, rc == ST_OK ? ST_OK : ST_CANCELLED,
                        rc == ST_OK ? NULL : "response could not be sent");
    }
    m->answered = true;
    move_defer(m, move_free, 0);
}

/* The target's CreateTablet answer, NULL when the call failed or the answer is unreadable. */
static Strata__Internal__V1__Tablet *answer_tablet(st_code code, st_slice resp) {
    return code == ST_OK
               ? (void *)btu_pb_unpack(&strata__internal__v1__tablet__descriptor, NULL, resp, NULL)
               : NULL;
}

/* The target's answer to the activation: its tablet, now served (no longer incoming). */
static void activate_done(st_code code, const char *msg, st_slice resp, void *arg) {
    node_move *m = arg;
    if (m->aborting)
        return;
    Strata__Internal__V1__Tablet *t = answer_tablet(code, resp);
    bool ok = t && t->id == m->target_id && !t->incoming;
    if (t)
        strata__internal__v1__tablet__free_unpacked(t, NULL);
    if (!ok) { /* it may still have activated (an answer lost): the target is asked */
        move_resolve_start(m, code == ST_OK ? ST_ABORTED : code,
                           code == ST_OK ? "the target did not activate its copy"
                           : msg         ? msg
                                         : "");
        return;
    }
    if (m->n->move_test.kill_activated)
        raise(SIGKILL); /* a test of a source killed between the activation and its drop */
    st_buf_reset(&m->target_tablet);
    if (st_buf_append(&m->target_tablet, resp.data, resp.len) != ST_OK) {
        move_fail(m, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    move_finish(m);
}

/* The copy is complete and the peers have the tablet's writes: the target starts serving its
 * copy (a CreateTablet of the same range, not incoming), then this node drops its own. Until the
 * activation the target's copy takes no client write and routers leave it out, so a source
 * killed before it keeps the range and nothing is acknowledged on a partial copy; a target
 * restarted before it drops the copy (docs/cluster.md, Moves). */
static void move_activate(node_move *m) {
    if (!rpc_client_alive(m->client)) { /* so the activation cannot have been sent */
        move_fail(m, ST_UNAVAILABLE, "the connection to the target failed");
        return;
    }
    st_err err = {0};
    /* Records of the tablet a peer has not acknowledged yet: the shippers keep its table's name
     * after the drop, across restarts too (the retired tablets file), and send them later. */
    if (m->unshipped) {
        if (node_repl_tablet_retire(m->n, m->id, m->table, &err) != ST_OK) {
            move_fail(m, err.code, err.msg);
            return;
        }
        m->retired = true;
    }
    m->recorded = true;
    if (outgoing_save(m->n, &err) != ST_OK) {
        m->recorded = false;
        move_fail(m, err.code, err.msg);
        return;
    }
    move_create(m, false, activate_done);
}

/* Before the drop: do the peer clusters have every log record of the tablet? Its last one is at
 * or below both positions read here (every write to it finished before the snapshot). The
 * shippers name a record's table through the live tablet, and the target never ships the copy
 * (it is replicated), so records still unshipped after MOVE_SHIP_WAIT_MS are kept named by
 * retiring the tablet (move_activate). The wait never fails the move: a peer cluster may lag
 * for any length of time, and a peer moving the same range refuses this node's replicated
 * writes to it until its own move ended. */
static void move_wait_shipped(node_move *m) {
    int64_t now = st_mono_us();
    if (m->ship_wait_from_us == 0) { /* fixed once, so a busy log is not a moving target */
        m->ship_wait_from_us = now;
        m->ship_lsn = sto_log_last_lsn(m->n->db);
        if (m->n->written_lsn_max > m->ship_lsn)
            m->ship_lsn = m->n->written_lsn_max;
    }
    uint32_t behind = 0;
    if (node_repl_shipped(m->n, m->ship_lsn, &behind)) {
        move_activate(m);
        return;
    }
    if (now - m->ship_wait_from_us > (int64_t)MOVE_SHIP_WAIT_MS * 1000) {
        st_log(ST_LOG_INFO, "move",
               "table=%s tablet=%" PRIu64 ": peer cluster %u lacks some of the tablet's writes; "
               "they are shipped after the move",
               m->table, m->id, behind);
        m->unshipped = true;
        move_activate(m);
        return;
    }
    move_defer(m, move_wait_shipped, MOVE_SHIP_POLL_MS);
}

/* ---- the activation's outcome, asked of the target ----
 * After an activation without a clear answer, and at start for each DATA/outgoing line: the
 * tablet stays marked moving (reads go on, writes get strata-not-owner) while the target is
 * asked, once a second, for its tablets of the table:
 *   - the copy listed and active, or active tablets over the range (the copy split since): the
 *     activation happened; the tablet is dropped here;
 *   - the copy listed incoming: dropped there (DropTablet); the tablet stays here;
 *   - nothing over the range: the copy never became active (a target restarted drops its
 *     incoming copies); the tablet stays here. */

static bool pb_overlaps(const Strata__Internal__V1__Tablet *t, st_slice start, st_slice end) {
    st_slice ts = st_slice_make(t->start_key.data, t->start_key.len);
    st_slice te = st_slice_make(t->end_key.data, t->end_key.len);
    return (te.len == 0 || st_slice_cmp(start, te) < 0) &&
           (end.len == 0 || st_slice_cmp(ts, end) < 0);
}

static void move_resolve(node_move *m);

/* The activation did not happen: the tablet serves writes here again. */
static void resolve_kept(node_move *m) {
    st_log(ST_LOG_WARN, "move",
           "table=%s tablet=%" PRIu64 ": the copy on %s was not activated; the tablet stays here",
           m->table, m->id, m->target);
    move_unmark(m);
    move_unrecord(m);
    move_unretire(m, false);
    move_defer(m, move_free, 0);
}

/* The activation happened: the tablet is the target's. */
static void resolve_moved(node_move *m) {
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(m->n, m->id, &t);
    st_err err = {0};
    bool kept = tab && node_tablet_drop(m->n, t, (size_t)(tab - t->v), &err) != ST_OK;
    if (kept) {
        st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 ": not dropped yet (no longer served): %s",
               m->id, err.msg);
        move_hand_line_to_drop(m);
    }
    move_unretire(m, !kept);
    st_log(ST_LOG_WARN, "move",
           "table=%s tablet=%" PRIu64 ": the copy on %s was activated; dropped here", m->table,
           m->id, m->target);
    move_unrecord(m);
    move_send_clock(m);
}

static void resolve_retry(node_move *m, const char *why) {
    if (m->resolve_tries++ % 30 == 0)
        st_log(ST_LOG_WARN, "move",
               "tablet=%" PRIu64 " stays read-only until %s answers whether it activated the "
               "move's copy: %s",
               m->id, m->target, why);
    move_defer(m, move_resolve, MOVE_RESOLVE_POLL_MS);
}

static void resolve_dropped(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code == ST_OK || code == ST_NOT_FOUND)
        resolve_kept(m);
    else
        resolve_retry(m, msg ? msg : st_code_name(code));
}

/* What the target's ListTablets answer says about the copy (see above). */
static void resolve_listed(st_code code, const char *msg, st_slice resp, void *arg) {
    node_move *m = arg;
    if (m->aborting)
        return;
    Strata__Internal__V1__ListTabletsResponse *r =
        code == ST_OK
            ? (void *)btu_pb_unpack(&strata__internal__v1__list_tablets_response__descriptor, NULL,
                                    resp, NULL)
            : NULL;
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (!r || !tab) {
        if (r)
            strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
        if (!tab) { /* gone here already (the drop ran before a kill): nothing to decide */
            move_unrecord(m);
            move_defer(m, move_free, 0);
        } else {
            resolve_retry(m, msg ? msg : "unreadable ListTablets answer");
        }
        return;
    }
    bool copy_incoming = false, active = false;
    for (size_t i = 0; i < r->n_tablets; i++) {
        const Strata__Internal__V1__Tablet *t = r->tablets[i];
        if (t->id == m->target_id && t->incoming)
            copy_incoming = true;
        else if (!t->incoming && pb_overlaps(t, st_buf_slice(&tab->start), st_buf_slice(&tab->end)))
            active = true;
    }
    strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    if (active) {
        resolve_moved(m);
    } else if (copy_incoming) {
        if (move_drop_copy(m, MOVE_RESOLVE_TIMEOUT_MS, resolve_dropped) != ST_OK)
            resolve_retry(m, "the target's connection is gone");
    } else {
        resolve_kept(m);
    }
}

static rpc_client *move_dial(node_ctx *n, const char *target, st_err *err);

static void move_resolve(node_move *m) {
    if (!rpc_client_alive(m->client)) { /* a failed connection stays failed: dial again */
        st_err err = {0};
        rpc_client *c = move_dial(m->n, m->target, &err);
        if (!c) {
            resolve_retry(m, err.msg);
            return;
        }
        rpc_client_free(m->client);
        m->client = c;
    }
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    req.table_name = m->table;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf)
        protobuf_c_message_pack(&req.base, buf);
    if (!buf || rpc_client_unary(m->client, NODE_SVC "ListTablets", st_slice_make(buf, len), NULL,
                                 0, MOVE_RESOLVE_TIMEOUT_MS, resolve_listed, m) != ST_OK)
        resolve_retry(m, buf ? "the target's connection is gone" : "out of memory");
    free(buf);
}

/* The activation's answer was an error or never came: the call hears it, the tablet stays
 * marked, and the target is asked what became of the copy. */
static void move_resolve_start(node_move *m, st_code code, const char *msg) {
    st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " target=%s: activation unconfirmed: %s", m->id,
           m->target, msg);
    if (!m->answered)
        node_fail(m->call, code, "moving tablet %" PRIu64 " to %s: %s", m->id, m->target, msg);
    m->answered = true;
    move_defer(m, move_resolve, 0);
}

/* ---- copying: CopyRows batches ----
 * Every visible cell keeps the version of the row mutation that wrote it (sto_cell.version),
 * and with it its commit time and origin (the version's high and low bits), so the copy takes
 * the same place in conflict order as the original: a delete or a newer write that reaches the
 * target by replication wins or loses against it exactly as at the source. The target logs the
 * rows as replicated, so its shippers never send them to the peer clusters again. */

/* One cell of the row being gathered (copied: the iterator's slices do not outlive a call). */
typedef struct copy_cell {
    st_slice family, qualifier, value;
    int64_t ts_us;
    uint64_t version;
} copy_cell;

typedef struct batch {
    st_arena *a;
    st_buf rows;    /* ProtobufCBinaryData: encoded row mutations */
    st_buf row;     /* the row key of `pending` */
    st_buf pending; /* copy_cell: the current row's cells not yet encoded */
    st_buf enc;     /* encoding scratch */
    st_buf muts;    /* sto_mut scratch */
    size_t cells, bytes;
} batch;

static int cell_version_cmp(const void *a, const void *b) {
    const copy_cell *x = a, *y = b;
    return x->version < y->version ? -1 : x->version > y->version;
}

/* One row mutation of muts[0, n) with version v (its commit time and origin), encoded into the
 * batch. */
static st_code batch_encode_row(batch *b, st_slice key, const sto_mut *muts, size_t n, uint64_t v) {
    sto_row_mut row = {.row = key,
                       .muts = muts,
                       .n_muts = n,
                       .version = v,
                       .commit_ts_us = (uint64_t)STO_VERSION_TS_US(v),
                       .origin = (uint32_t)(v & ((1u << STO_VERSION_TIEBREAK_BITS) - 1)),
                       .flags = STO_ROW_REPLICATED};
    st_buf_reset(&b->enc);
    ProtobufCBinaryData bin;
    if (sto_row_mut_encode(&b->enc, &row) != ST_OK ||
        !(bin.data = st_arena_dup(b->a, b->enc.data, b->enc.len)))
        return ST_RESOURCE_EXHAUSTED;
    bin.len = b->enc.len;
    return st_buf_append(&b->rows, &bin, sizeof bin);
}

/* One row mutation of SetCells sharing a version, encoded into the batch. */
static st_code batch_encode(batch *b, const copy_cell *cells, size_t n) {
    st_buf_reset(&b->muts);
    for (size_t i = 0; i < n; i++) {
        sto_mut mu = {.type = STO_MUT_SET_CELL,
                      .family = cells[i].family,
                      .qualifier = cells[i].qualifier,
                      .ts_us = cells[i].ts_us,
                      .value = cells[i].value};
        if (st_buf_append(&b->muts, &mu, sizeof mu) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    }
    return batch_encode_row(b, st_buf_slice(&b->row), (const sto_mut *)b->muts.data, n,
                            cells[0].version);
}

/* Encodes the gathered cells of the current row: one row mutation per version. */
static st_code batch_flush_row(batch *b) {
    size_t n = b->pending.len / sizeof(copy_cell);
    copy_cell *cells = (copy_cell *)b->pending.data;
    if (n > 1)
        qsort(cells, n, sizeof *cells, cell_version_cmp);
    st_code rc = ST_OK;
    for (size_t i = 0, j; rc == ST_OK && i < n; i = j) {
        for (j = i + 1; j < n && cells[j].version == cells[i].version; j++) {
        }
        rc = batch_encode(b, &cells[i], j - i);
    }
    st_buf_reset(&b->pending);
    return rc;
}

/* Adds one cell to the current row, flushing the previous row first when the row changes. */
static st_code batch_add(batch *b, const sto_cell *c) {
    if (b->pending.len && !st_slice_eq(st_buf_slice(&b->row), c->row)) {
        st_code rc = batch_flush_row(b);
        if (rc != ST_OK)
            return rc;
    }
    if (b->pending.len == 0) {
        st_buf_reset(&b->row);
        if (st_buf_append(&b->row, c->row.data, c->row.len) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
    }
    copy_cell cc = {.ts_us = c->ts_us, .version = c->version};
    cc.family = st_slice_make(st_arena_dup(b->a, c->family.data, c->family.len), c->family.len);
    cc.qualifier =
        st_slice_make(st_arena_dup(b->a, c->qualifier.data, c->qualifier.len), c->qualifier.len);
    cc.value = st_slice_make(st_arena_dup(b->a, c->value.data, c->value.len), c->value.len);
    if ((c->family.len && !cc.family.data) || (c->qualifier.len && !cc.qualifier.data) ||
        (c->value.len && !cc.value.data) || st_buf_append(&b->pending, &cc, sizeof cc) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    b->cells++;
    b->bytes += c->row.len + c->family.len + c->qualifier.len + c->value.len;
    return ST_OK;
}

/* Fills b from the iterator up to the batch limits (checked before each cell, so nothing is
 * left over; a row cut by a limit continues in the next batch, which is harmless: each row
 * mutation stands on its own). ST_OK; b is empty once the tablet is copied. */
static st_code batch_fill(node_move *m, batch *b, st_err *err) {
    st_code rc = ST_OK;
    sto_cell c;
    while (rc == ST_OK && b->cells < MOVE_BATCH_CELLS && b->bytes < MOVE_BATCH_BYTES) {
        rc = sto_iter_next(m->it, &c, err);
        if (rc == ST_NOT_FOUND) {
            rc = ST_OK;
            break;
        }
        if (rc == ST_OK)
            rc = batch_add(b, &c);
    }
    if (rc == ST_OK)
        rc = batch_flush_row(b);
    if (rc == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, rc, "out of memory building a copy batch");
    return rc;
}

/* Fills b with the tombstones that follow, each as a row mutation of its one delete with its
 * version: a delete then covers at the target exactly what it covered here, also the older
 * writes that reach the target later by replication from a peer cluster (one that applied them
 * before this delete, so it hides them too). Without them such a write became visible on the
 * target only, and the clusters differed for good. A tombstone and the cells of its own write
 * share a version, and a delete never covers its own version, so the order of the copies does
 * not matter. *end once the scan is over; b may stay empty meanwhile (MOVE_TOMB_SCAN_MAX). */
static st_code batch_fill_tombs(node_move *m, batch *b, bool *end, st_err *err) {
    size_t scan = MOVE_TOMB_SCAN_MAX;
    *end = false;
    while (b->cells < MOVE_BATCH_CELLS && b->bytes < MOVE_BATCH_BYTES && scan > 0) {
        sto_tombstone t;
        bool found = false;
        st_code rc = sto_tomb_iter_next(m->tombs, &scan, &t, &found, err);
        if (rc == ST_NOT_FOUND) {
            *end = true;
            return ST_OK;
        }
        if (rc != ST_OK)
            return rc;
        if (!found)
            return ST_OK; /* the next turn goes on */
        if (batch_encode_row(b, t.row, &t.mut, 1, t.version) != ST_OK)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory building a copy batch");
        b->cells++;
        b->bytes += t.row.len + t.mut.family.len + t.mut.qualifier.len;
    }
    return ST_OK;
}

/* The CopyRows request of b, packed into the arena. */
static st_slice batch_pack(node_move *m, batch *b) {
    Strata__Internal__V1__CopyRowsRequest req;
    strata__internal__v1__copy_rows_request__init(&req);
    req.tablet_id = m->target_id;
    req.clock_us = node_cs_next_stamp(m->n);
    req.rows = (ProtobufCBinaryData *)b->rows.data;
    req.n_rows = b->rows.len / sizeof(ProtobufCBinaryData);
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = st_arena_alloc(b->a, len ? len : 1);
    if (!buf)
        return st_slice_make(NULL, 0);
    protobuf_c_message_pack(&req.base, buf);
    return st_slice_make(buf, len);
}

static void move_send_batch(node_move *m);

static void copy_done(st_code code, const char *msg, st_slice resp, void *arg) {
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK) {
        move_fail(m, code, msg ? msg : "CopyRows failed on the target");
        return;
    }
    Strata__Internal__V1__CopyRowsResponse *r = (void *)btu_pb_unpack(
        &strata__internal__v1__copy_rows_response__descriptor, NULL, resp, NULL);
    bool ok = r && r->applied == m->batch_rows;
    if (r)
        strata__internal__v1__copy_rows_response__free_unpacked(r, NULL);
    if (!ok) {
        move_fail(m, ST_INTERNAL, "the target did not apply every copied row");
        return;
    }
    move_defer(m, move_send_batch, m->n->move_test.batch_ms); /* 0 but in tests */
}

static void move_send_batch(node_move *m) {
    st_arena_deinit(&m->arena);
    st_arena_init(&m->arena, MOVE_ARENA_BLOCK_BYTES);
    batch b = {.a = &m->arena};
    st_buf_init(&b.rows);
    st_buf_init(&b.row);
    st_buf_init(&b.pending);
    st_buf_init(&b.enc);
    st_buf_init(&b.muts);
    st_err err = {0};
    bool tombs = m->tombs != NULL, end = false;
    st_code rc = tombs ? batch_fill_tombs(m, &b, &end, &err) : batch_fill(m, &b, &err);
    st_slice req = rc == ST_OK && b.cells ? batch_pack(m, &b) : st_slice_make(NULL, 0);
    size_t cells = b.cells;
    m->batch_rows = (uint32_t)(b.rows.len / sizeof(ProtobufCBinaryData));
    st_buf_free(&b.rows);
    st_buf_free(&b.row);
    st_buf_free(&b.pending);
    st_buf_free(&b.enc);
    st_buf_free(&b.muts);
    if (rc != ST_OK) {
        move_fail(m, rc, err.msg[0] ? err.msg : "reading the tablet failed");
        return;
    }
    if (cells == 0 && !tombs) { /* the cells are copied: then the tombstones */
        rc = sto_tomb_iter_new(m->snap, &m->tombs, &err);
        if (rc != ST_OK)
            move_fail(m, rc, err.msg);
        else
            move_defer(m, move_send_batch, 0);
        return;
    }
    if (cells == 0 && !end) { /* a turn's scan found none: the loop takes other work first */
        move_defer(m, move_send_batch, 0);
        return;
    }
    if (cells == 0) { /* copied: a test may hold the move here (NODE_MOVE_TEST_ENV) */
        move_defer(m, move_wait_shipped, m->n->move_test.hold_ms);
        return;
    }
    if (tombs)
        m->tombs_copied += cells;
    else
        m->cells_copied += cells;
    if (!req.data || rpc_client_unary(m->client, NODE_SVC "CopyRows", req, NULL, 0,
                                      MOVE_RPC_TIMEOUT_MS, copy_done, m) != ST_OK)
        move_fail(m, ST_UNAVAILABLE, "could not send a copy batch to the target");
}

/* ---- before the copy: schema, tablet, in-flight writes ---- */

static void move_copy_start(node_move *m) {
    if (__atomic_load_n(&m->n->writes_finished, __ATOMIC_RELAXED) < m->drain_until) {
        move_defer(m, move_copy_start, MOVE_DRAIN_POLL_MS);
        return;
    }
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (!tab) {
        move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
        return;
    }
    st_err err = {0};
    sto_range all = {0};
    st_code rc = sto_snapshot_new(tab->st, &m->snap, &err);
    /* System families too: a tablet's change history moves with its rows. */
    if (rc == ST_OK)
        rc =
            sto_iter_new_flags(m->snap, &all, false, STO_ITER_USER | STO_ITER_SYSTEM, &m->it, &err);
    if (rc != ST_OK) {
        move_fail(m, rc, err.msg);
        return;
    }
    move_send_batch(m);
}

static void create_done(st_code code, const char *msg, st_slice resp, void *arg) {
    node_move *m = arg;
    if (m->aborting)
        return;
    Strata__Internal__V1__Tablet *t = answer_tablet(code, resp);
    if (!t) {
        move_fail(m, code == ST_OK ? ST_INTERNAL : code,
                  msg ? msg : "unreadable CreateTablet answer");
        return;
    }
    m->target_id = t->id;
    strata__internal__v1__tablet__free_unpacked(t, NULL);
    /* Ids are unique across the instance: the same id back means the target is this node (its
     * CreateTablet found the tablet itself), which must not be dropped as a partial copy. */
    if (m->target_id == m->id) {
        move_fail(m, ST_INVALID_ARGUMENT, "the target is this node");
        return;
    }
    m->target_created = true;
    if (st_buf_append(&m->target_tablet, resp.data, resp.len) != ST_OK) {
        move_fail(m, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    move_defer(m, move_copy_start, 0);
}

static void put_done(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK) {
        move_fail(m, code, msg ? msg : "PutTable failed on the target");
        return;
    }
    move_create(m, true, create_done); /* not served there until activated (move_activate) */
}

static void move_put_table(node_move *m) {
    node_table *meta = node_catalog_find(m->n->catalog, m->table);
    Google__Bigtable__Admin__V2__Table *pt = meta ? node_table_to_pb(meta, false, &m->arena) : NULL;
    if (!pt) {
        move_fail(m, meta ? ST_RESOURCE_EXHAUSTED : ST_ABORTED,
                  meta ? "out of memory" : "the table was dropped during the move");
        return;
    }
    Strata__Internal__V1__PutTableRequest req;
    strata__internal__v1__put_table_request__init(&req);
    req.table = pt;
    move_unary(m, "PutTable", &req.base, put_done);
}

/* ---- the handler ---- */

/* A connection to target ("host:port"); NULL with err set. */
static rpc_client *move_dial(node_ctx *n, const char *target, st_err *err) {
    char host[MOVE_HOST_MAX];
    uint16_t port;
    if (!st_addr_split(target, host, sizeof host, &port) || port == 0) {
        st_err_set(err, ST_INVALID_ARGUMENT, "target '%s' is not host:port", target);
        return NULL;
    }
    return rpc_client_new(n->base, host, port, &n->peer_opts, err);
}

static node_move *move_new(node_ctx *n, rpc_call *call, const node_tablets *t,
                           const node_tablet *tab, const char *target, st_err *err) {
    node_move *m = calloc(1, sizeof *m);
    if (!m || !(m->ev = evtimer_new(n->base, move_run, m))) {
        free(m);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a move");
        return NULL;
    }
    m->n = n;
    m->call = call;
    m->id = tab->id;
    snprintf(m->table, sizeof m->table, "%s", t->name);
    snprintf(m->target, sizeof m->target, "%s", target);
    st_buf_init(&m->target_tablet);
    st_arena_init(&m->arena, MOVE_ARENA_BLOCK_BYTES);
    m->client = move_dial(n, target, err);
    if (!m->client) {
        move_free(m);
        return NULL;
    }
    return m;
}

/* Marks the tablet moving and starts the move, once no DropRowRange job of its table runs here
 * (node_table_dropping): the job's deletes bypass node_write, so the drain of in-flight writes
 * would not wait for them, and a copy taken while it runs keeps rows it deletes only here
 * (docs/cluster.md, "DropRowRange on a node during a move"). A drop does not start while the
 * tablet is marked, so once marked the move runs as before. */
static void move_begin(node_move *m) {
    node_ctx *n = m->n;
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(n, m->id, &t);
    if (!tab) {
        move_fail(m, ST_NOT_FOUND, "the tablet is no longer served here (split or dropped)");
        return;
    }
    if (tab->moving || tab->incoming) {
        move_fail(m, ST_FAILED_PRECONDITION,
                  tab->moving ? "already moving" : "a move's copy, not yet activated");
        return;
    }
    if (node_table_dropping(n, t->name)) {
        if (st_mono_us() - m->begin_us > (int64_t)MOVE_DROP_WAIT_MS * 1000) {
            move_fail(m, ST_UNAVAILABLE,
                      "a DropRowRange of its table kept deleting rows here; move it again later");
            return;
        }
        if (m->step != move_begin)
            st_log(ST_LOG_INFO, "move",
                   "table=%s tablet=%" PRIu64 " to %s: waits for a DropRowRange of the table",
                   t->name, m->id, m->target);
        move_defer(m, move_begin, MOVE_DROP_POLL_MS);
        return;
    }
    tab->moving = true;
    m->marked = true;
    m->drain_until = n->writes_started;
    st_log(ST_LOG_INFO, "move", "table=%s tablet=%" PRIu64 " to %s: started", t->name, m->id,
           m->target);
    move_put_table(m);
}

void node_h_move_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__MoveTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__move_tablet_request__descriptor, req_bytes);
    if (!req)
        return;
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(n, req->id, &t);
    if (!tab) {
        node_fail(call, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by node %u", req->id,
                  n->opts.node_num);
        return;
    }
    if (tab->moving || tab->incoming) {
        node_fail(call, ST_FAILED_PRECONDITION, "tablet %" PRIu64 " is %s", req->id,
                  tab->moving ? "already moving" : "a move's copy, not yet activated");
        return;
    }
    st_err err = {0};
    node_move *m = move_new(n, call, t, tab, req->target, &err);
    if (!m) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    m->begin_us = st_mono_us();
    m->next = n->moves;
    n->moves = m;
    move_begin(m);
}

/* One DATA/outgoing line: the tablet, if still here, stays marked moving until the target has
 * said what became of its copy (move_resolve); a line marked moved (the activation was known,
 * the drop failed) drops it at once. */
static bool resume_one(node_ctx *n, uint64_t id, uint64_t target_id, const char *target,
                       bool moved) {
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(n, id, &t);
    if (!tab)
        return true; /* dropped before the kill */
    st_err err = {0};
    if (moved) {
        st_log(ST_LOG_WARN, "move",
               "table=%s tablet=%" PRIu64 ": moved to %s as %" PRIu64 " before a restart, its "
               "drop had failed; dropped now, not served",
               t->name, id, target, target_id);
        if (node_tablet_drop(n, t, (size_t)(tab - t->v), &err) != ST_OK)
            drop_keeps_line(n, id, target_id, target);
        return true;
    }
    tab->moving = true;
    node_move *m = move_new(n, NULL, t, tab, target, &err);
    if (!m) {
        st_log(ST_LOG_ERROR, "move",
               "tablet=%" PRIu64 " stays read-only: cannot ask %s whether it activated the "
               "move's copy: %s",
               id, target, err.msg);
        return false;
    }
    m->target_id = target_id;
    m->marked = m->recorded = m->answered = true;
    m->next = n->moves;
    n->moves = m;
    st_log(ST_LOG_INFO, "move",
           "table=%s tablet=%" PRIu64 ": asking %s whether it activated the move's copy", m->table,
           id, target);
    move_defer(m, move_resolve, 0);
    return true;
}

static bool resume_pending(const node_ctx *n) {
    for (const node_move *m = n->moves; m; m = m->next)
        if (m->recorded)
            return true;
    return false;
}

static void resume_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    *(bool *)arg = true;
}

st_code node_moves_resume(node_ctx *n, st_err *err) {
    char path[sizeof n->data_dir + sizeof NODE_OUTGOING_FILE + 1];
    snprintf(path, sizeof path, "%s/%s", n->data_dir, NODE_OUTGOING_FILE);
    st_buf b;
    st_buf_init(&b);
    st_err rerr = {0};
    if (st_env_read_all(st_env_posix(), path, &b, &rerr) != ST_OK || b.len == 0) {
        st_buf_free(&b);
        return ST_OK; /* no file, or no move was activating */
    }
    st_code rc = st_buf_append(&b, "", 1);
    bool all = true; /* a line not taken up is not dropped from the file by this save */
    for (char *p = (char *)b.data; rc == ST_OK && *p;) {
        unsigned long long id, target_id;
        char target[MOVE_HOST_MAX + 8], mark[8] = "";
        char *eol = p + strcspn(p, "\n");
        bool last = *eol == '\0';
        *eol = '\0'; /* the optional mark is read from this line only */
        if (sscanf(p, "%llu %llu %263s %7s", &id, &target_id, target, mark) >= 3)
            all = resume_one(n, id, target_id, target, strcmp(mark, OUTGOING_MOVED) == 0) && all;
        p = last ? eol : eol + 1;
    }
    st_buf_free(&b);
    if (rc == ST_OK && all)
        rc = outgoing_save(n, err); /* the lines of tablets no longer here go */
    /* Before the node listens, as long as the targets answer promptly: until then the tablets
     * are read-only here, and their reads may miss writes the target took meanwhile. */
    bool late = false;
    struct event *ev = evtimer_new(n->base, resume_deadline, &late);
    struct timeval tv = {MOVE_RESOLVE_START_MS / 1000, 0};
    if (ev && evtimer_add(ev, &tv) == 0)
        while (!late && resume_pending(n))
            event_base_loop(n->base, EVLOOP_ONCE);
    if (ev)
        event_free(ev);
    return rc;
}

void node_moves_abort(node_ctx *n) {
    while (n->moves) {
        node_move *m = n->moves;
        m->aborting = true;
        move_unmark(m);
        if (!m->answered)
            node_fail(m->call, ST_UNAVAILABLE,
                      "the node is shutting down; move tablet %" PRIu64 " again", m->id);
        move_free(m);
    }
}

/* ---- the target's side: CopyRows ---- */

typedef struct copy_op {
    rpc_call *call;
    uint32_t n;
    uint64_t tablet_id;
} copy_op;

/* A CopyRows into tablet id starts (delta 1) or ends (-1): an incoming copy is not idle. */
static void copy_track(node_ctx *n, uint64_t id, int delta) {
    node_tablet *tab = node_tablet_by_id(n, id, NULL);
    if (!tab)
        return;
    tab->copies += (uint32_t)delta;
    tab->copy_touch_us = st_mono_us();
}

static void copy_rows_durable(node_ctx *n, st_code code, const char *msg, void *arg) {
    copy_op *op = arg;
    copy_track(n, op->tablet_id, -1);
    if (code != ST_OK) {
        node_fail(op->call, code, "copying rows: %s", msg ? msg : st_code_name(code));
        return;
    }
    Strata__Internal__V1__CopyRowsResponse resp;
    strata__internal__v1__copy_rows_response__init(&resp);
    resp.applied = op->n;
    node_reply(op->call, &resp.base);
}

/* Decodes and checks one copied row for tablet tab of table t (arena: the call's). */
static st_code copy_row_prepare(node_ctx *n, node_tablets *t, const node_tablet *tab,
                                ProtobufCBinaryData in, st_arena *arena, sto_row_mut *out,
                                st_err *err) {
    if (!sto_row_mut_decode(st_slice_make(in.data, in.len), out, arena))
        return st_err_set(err, ST_INVALID_ARGUMENT, "a copied row is not a valid row mutation");
    if (out->row.len == 0 || out->row.len > STO_ROW_KEY_MAX || out->n_muts == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "a copied row has an empty or oversized key, or no mutations");
    if (out->origin > STO_ORIGIN_MAX || out->version != STO_VERSION(out->commit_ts_us, out->origin))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "a copied row's version %llu does not match its commit timestamp %llu "
                          "and origin %u",
                          (unsigned long long)out->version, (unsigned long long)out->commit_ts_us,
                          out->origin);
    node_tablet *w = node_tablet_for_row(t, out->row); /* incoming too: the copy's own target */
    if (!w || w->id != tab->id || w->moving)
        return node_not_owner(n, err, t->name, out->row);
    w->written = true;
    out->tablet_id = tab->id;
    out->flags = STO_ROW_REPLICATED; /* the source ships its own log, never the target */
    return ST_OK;
}

/* The latest time a copied row carries: its commit time, or a change record's stamp (the
 * timestamp of a cell of a system family). */
static int64_t copy_row_max_ts(const sto_row_mut *r) {
    int64_t max = (int64_t)r->commit_ts_us;
    for (size_t i = 0; i < r->n_muts; i++) {
        const sto_mut *m = &r->muts[i];
        if (m->type == STO_MUT_SET_CELL && m->family.len && m->family.data[0] == 0 &&
            m->ts_us > max)
            max = m->ts_us;
    }
    return max;
}

void node_h_copy_rows(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__CopyRowsRequest *req =
        (void *)node_unpack(call, &strata__internal__v1__copy_rows_request__descriptor, req_bytes);
    if (!req)
        return;
    if (req->n_rows > NODE_COPY_ROWS_MAX) {
        node_fail(call, ST_INVALID_ARGUMENT, "CopyRows over %d rows", NODE_COPY_ROWS_MAX);
        return;
    }
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(n, req->tablet_id, &t);
    if (!tab) {
        node_fail(call, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by node %u", req->tablet_id,
                  n->opts.node_num);
        return;
    }
    /* A move's source sends rows only into the incoming copy it created (then, once the copy is
     * active, only its clock), so a strata-node certificate writes no rows into a tablet that
     * serves clients through this method. */
    if (req->n_rows && !tab->incoming && node_caller_is_node(call)) {
        node_fail(call, ST_PERMISSION_DENIED,
                  "CopyRows from a client whose certificate names strata-node writes only into a "
                  "move's incoming copy, and tablet %" PRIu64 " is not one (docs/security.md, "
                  "Internal links)",
                  req->tablet_id);
        return;
    }
    st_arena *arena = rpc_call_arena(call);
    copy_op *op = st_arena_alloc(arena, sizeof *op);
    sto_row_mut *rows = st_arena_alloc(arena, (req->n_rows ? req->n_rows : 1) * sizeof *rows);
    if (!op || !rows) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory copying rows");
        return;
    }
    op->call = call;
    op->n = (uint32_t)req->n_rows;
    op->tablet_id = tab->id;
    st_err err = {0};
    int64_t max_ts = req->clock_us;
    for (size_t i = 0; i < req->n_rows; i++) {
        if (copy_row_prepare(n, t, tab, req->rows[i], arena, &rows[i], &err) != ST_OK) {
            node_fail(call, err.code, "%s", err.msg);
            return;
        }
        int64_t ts = copy_row_max_ts(&rows[i]);
        if (ts > max_ts)
            max_ts = ts;
    }
    /* The clock moves past the copied commit times (as for replicated rows), so a write made
     * here after the move gets a higher version than the cells it overwrites, and past the
     * source's clock and the copied change records' stamps, so records made here come after
     * them; not by a step of more than an hour past the wall clock, which only a wrong clock or
     * forged versions make (node_clock_observe). The ring has none of the copied records: it sends
     * readers of the range to storage for anything older than now. */
    node_clock_observe(n, max_ts, "a tablet move", t->name);
    node_cs_range_arrived(n, t->name, st_buf_slice(&tab->start), st_buf_slice(&tab->end));
    copy_track(n, tab->id, 1);
    if (req->n_rows == 0) {
        copy_rows_durable(n, ST_OK, NULL, op);
        return;
    }
    if (node_write_mode(n, rows, req->n_rows, NODE_WRITE_COPY, &err, copy_rows_durable, op) !=
        ST_OK) {
        copy_track(n, op->tablet_id, -1);
        node_fail(call, err.code, "copying rows: %s", err.msg);
    }
}

/* ---- incoming copies abandoned by their source ---- */

static int incoming_idle_ms(const node_ctx *n) {
    return n->move_test.incoming_idle_ms > 0 ? n->move_test.incoming_idle_ms
                                             : NODE_INCOMING_IDLE_MS;
}

/* Drops the incoming copies idle longer than incoming_idle_ms with no CopyRows in flight. */
static void incoming_check(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_ctx *n = arg;
    int64_t now = st_mono_us(), idle_us = (int64_t)incoming_idle_ms(n) * 1000;
    bool dropped = false;
    for (size_t i = 0; i < n->n_tables; i++) {
        node_tablets *t = &n->tables[i];
        for (size_t j = 0; j < t->n;) {
            node_tablet *tab = &t->v[j];
            if (!tab->incoming || tab->copies || now - tab->copy_touch_us <= idle_us) {
                j++;
                continue;
            }
            st_log(ST_LOG_WARN, "move",
                   "table=%s tablet=%" PRIu64 " dropped: a move's copy that took no rows for "
                   "%d ms (its source gave up)",
                   t->name, tab->id, incoming_idle_ms(n));
            (void)node_tablet_drop(n, t, j, NULL);
            dropped = true;
        }
    }
    st_err err = {0};
    if (dropped && node_incoming_save(n, &err) != ST_OK)
        st_log(ST_LOG_WARN, "move", "%s", err.msg);
    node_drops_retry(n);
}

/* ---- drops storage has not made yet (node_tablet_drop) ---- */

#define DROP_RETRY_MAX_MS 60000

/* Removes pending drop i; the files naming it are rewritten (a failure is harmless: the next
 * start finds the tablet gone from storage and ignores the name). */
static void drop_pending_done(node_ctx *n, size_t i) {
    node_drop_pending d = n->drops[i];
    memmove(&n->drops[i], &n->drops[i + 1], (n->n_drops - i - 1) * sizeof *n->drops);
    n->n_drops--;
    st_log(ST_LOG_INFO, "node", "tablet=%" PRIu64 " dropped (a retry of its failed drop)", d.id);
    st_err err = {0};
    if (d.incoming && node_incoming_save(n, &err) != ST_OK)
        st_log(ST_LOG_WARN, "node", "%s", err.msg);
    if (d.target_id && outgoing_save(n, &err) != ST_OK)
        st_log(ST_LOG_WARN, "node", "%s", err.msg);
}

void node_drops_retry(node_ctx *n) {
    int64_t now = st_mono_us();
    for (size_t i = 0; i < n->n_drops;) {
        node_drop_pending *d = &n->drops[i];
        if (now < d->next_try_us) {
            i++;
            continue;
        }
        st_err err = {0};
        st_code rc = sto_tablet_drop(n->db, d->id, &err);
        if (rc == ST_OK || rc == ST_NOT_FOUND) {
            drop_pending_done(n, i);
            continue;
        }
        st_log(ST_LOG_WARN, "node", "tablet=%" PRIu64 ": its drop failed again: %s", d->id,
               err.msg);
        d->backoff_ms =
            d->backoff_ms * 2 < DROP_RETRY_MAX_MS ? d->backoff_ms * 2 : DROP_RETRY_MAX_MS;
        d->next_try_us = now + (int64_t)d->backoff_ms * 1000;
        i++;
    }
}

st_code node_incoming_timer_start(node_ctx *n, st_err *err) {
    int ms = incoming_idle_ms(n) / 4 < 1000 ? incoming_idle_ms(n) / 4 : 1000;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    n->incoming_timer = event_new(n->base, -1, EV_PERSIST, incoming_check, n);
    if (!n->incoming_timer || event_add(n->incoming_timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the incoming copy check");
    return ST_OK;
}

void node_incoming_timer_stop(node_ctx *n) {
    if (n->incoming_timer)
        event_free(n->incoming_timer);
    n->incoming_timer = NULL;
}
