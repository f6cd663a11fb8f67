/* move.c — MoveTablet: copies a local tablet's visible cells (with their timestamps) to another
 * node, then drops the tablet here. Asynchronous on the loop thread, in steps chained by RPC
 * completions and a per-move timer, so no step holds the loop for long:
 *
 *   mark moving (writes now get strata-not-owner; reads go on)
 *   -> PutTable on the target (the table's schema) -> CreateTablet (same range; the target picks
 *   its own id) -> wait until every write started before the mark has finished (storage completes
 *   writes in order, so a counter suffices) -> snapshot + iterator -> MutateRows batches of
 *   SetCell with explicit timestamps (MOVE_BATCH_CELLS / MOVE_BATCH_BYTES each) -> drop here and
 *   answer with the target's Tablet.
 *
 * On failure the tablet stays here and writable again, the call gets the error, and the target's
 * half-filled tablet is dropped (best effort). A move outlives a cancelled MoveTablet call. */
#include "admin.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "strata/internal/v1/node.pb-c.h"

#define MOVE_BATCH_CELLS 10000            /* SetCells per MutateRows (NODE_MUTATIONS_MAX caps) */
#define MOVE_BATCH_BYTES ((size_t)4 << 20) /* cell bytes per MutateRows (one cell may exceed) */
#define MOVE_RPC_TIMEOUT_MS 120000
#define MOVE_DRAIN_POLL_MS 1
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
    st_buf target_tablet; /* the target's CreateTablet answer (a Tablet message) */
    uint64_t target_id;
    bool target_created;
    bool aborting;     /* node_close: callbacks do nothing */
    bool answered;     /* the MoveTablet call is finished */
    bool entry_failed; /* the target refused a copied row */
    sto_snapshot *snap;
    sto_iter *it;
    st_arena arena; /* the batch being built and sent */
    uint64_t cells_copied;
};

static void move_run(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_move *m = arg;
    m->step(m);
}

/* Runs step(m) from the loop after delay_ms (never inside an rpc_client callback's stack). */
static void move_defer(node_move *m, move_step_fn step, int delay_ms) {
    m->step = step;
    struct timeval tv = {0, delay_ms * 1000};
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
    if (m->snap)
        sto_snapshot_free(m->snap);
    if (m->ev)
        event_free(m->ev);
    st_buf_free(&m->target_tablet);
    st_arena_deinit(&m->arena);
    free(m);
}

static void move_unmark(node_move *m) {
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (tab)
        tab->moving = false;
}

static void cleanup_done(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " target=%s: could not drop the partial "
               "copy %" PRIu64 ": %s", m->id, m->target, m->target_id, msg ? msg : "");
    move_defer(m, move_free, 0);
}

/* Ends a failed move: the tablet serves writes again, the caller hears why, the target's partial
 * copy goes. */
static void move_fail(node_move *m, st_code code, const char *msg) {
    st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " target=%s failed after %" PRIu64 " cells: %s",
           m->id, m->target, m->cells_copied, msg);
    m->answered = true;
    move_unmark(m);
    node_fail(m->call, code == ST_OK ? ST_INTERNAL : code, "moving tablet %" PRIu64 " to %s: %s",
              m->id, m->target, msg);
    if (m->target_created) {
        Strata__Internal__V1__DropTabletRequest req;
        strata__internal__v1__drop_tablet_request__init(&req);
        req.id = m->target_id;
        uint8_t buf[16];
        size_t len = protobuf_c_message_pack(&req.base, buf);
        if (rpc_client_unary(m->client, NODE_SVC "DropTablet", st_slice_make(buf, len), NULL, 0,
                             MOVE_RPC_TIMEOUT_MS, cleanup_done, m) == ST_OK)
            return;
    }
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

/* ---- the end ---- */

static void move_finish(node_move *m) {
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(m->n, m->id, &t);
    if (!tab)
        return move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
    st_err err = {0};
    if (node_tablet_drop(m->n, t, (size_t)(tab - t->v), &err) != ST_OK)
        st_log(ST_LOG_WARN, "move", "tablet=%" PRIu64 " copied but not dropped here: %s", m->id,
               err.msg);
    st_log(ST_LOG_INFO, "move", "table=%s tablet=%" PRIu64 " moved to %s as %" PRIu64
           " cells=%" PRIu64, m->table, m->id, m->target, m->target_id, m->cells_copied);
    m->answered = true;
    st_code rc = rpc_call_send(m->call, st_buf_slice(&m->target_tablet));
    rpc_call_finish(m->call, rc == ST_OK ? ST_OK : ST_CANCELLED,
                    rc == ST_OK ? NULL : "response could not be sent");
    move_defer(m, move_free, 0);
}

/* ---- copying: MutateRows batches ---- */

typedef Google__Bigtable__V2__MutateRowsRequest__Entry pb_entry;

typedef struct batch {
    st_arena *a;
    st_buf entries;   /* pb_entry * */
    st_buf mutations; /* Google__Bigtable__V2__Mutation * */
    size_t cells, bytes;
} batch;

static char *arena_str(st_arena *a, st_slice s) {
    char *p = st_arena_alloc(a, s.len + 1);
    if (p) {
        memcpy(p, s.data, s.len);
        p[s.len] = '\0';
    }
    return p;
}

/* Adds one cell as a SetCell with its timestamp; a new entry when the row changes. */
static st_code batch_add(batch *b, const sto_cell *c) {
    size_t n_entries = b->entries.len / sizeof(pb_entry *);
    pb_entry *last = n_entries ? ((pb_entry **)b->entries.data)[n_entries - 1] : NULL;
    if (!last || !st_slice_eq(st_slice_make(last->row_key.data, last->row_key.len), c->row)) {
        last = st_arena_alloc(b->a, sizeof *last);
        uint8_t *key = last ? st_arena_dup(b->a, c->row.data, c->row.len) : NULL;
        if (!key || st_buf_append(&b->entries, &last, sizeof last) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        google__bigtable__v2__mutate_rows_request__entry__init(last);
        last->row_key = (ProtobufCBinaryData){c->row.len, key};
    }
    Google__Bigtable__V2__Mutation *mu = st_arena_alloc(b->a, sizeof *mu);
    Google__Bigtable__V2__Mutation__SetCell *sc = st_arena_alloc(b->a, sizeof *sc);
    char *fam = arena_str(b->a, c->family);
    uint8_t *q = st_arena_dup(b->a, c->qualifier.data, c->qualifier.len);
    uint8_t *v = st_arena_dup(b->a, c->value.data, c->value.len);
    if (!mu || !sc || !fam || (c->qualifier.len && !q) || (c->value.len && !v) ||
        st_buf_append(&b->mutations, &mu, sizeof mu) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    google__bigtable__v2__mutation__init(mu);
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = fam;
    sc->column_qualifier = (ProtobufCBinaryData){c->qualifier.len, q};
    sc->timestamp_micros = c->ts_us;
    sc->value = (ProtobufCBinaryData){c->value.len, v};
    mu->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    mu->set_cell = sc;
    last->n_mutations++;
    b->cells++;
    b->bytes += c->row.len + c->family.len + c->qualifier.len + c->value.len;
    return ST_OK;
}

/* Fills b from the iterator up to the batch limits (checked before each cell, so nothing is
 * left over). ST_OK; b is empty once the tablet is copied. */
static st_code batch_fill(node_move *m, batch *b, st_err *err) {
    st_code rc = ST_OK;
    sto_cell c;
    while (rc == ST_OK && b->cells < MOVE_BATCH_CELLS && b->bytes < MOVE_BATCH_BYTES) {
        rc = sto_iter_next(m->it, &c, err);
        if (rc == ST_NOT_FOUND)
            return ST_OK;
        if (rc == ST_OK)
            rc = batch_add(b, &c);
    }
    if (rc == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, rc, "out of memory building a copy batch");
    return rc;
}

/* The MutateRows request of b, packed into the arena. */
static st_slice batch_pack(node_move *m, batch *b) {
    size_t n_entries = b->entries.len / sizeof(pb_entry *);
    pb_entry **entries = (pb_entry **)b->entries.data;
    Google__Bigtable__V2__Mutation **muts = (Google__Bigtable__V2__Mutation **)b->mutations.data;
    for (size_t i = 0, off = 0; i < n_entries; off += entries[i]->n_mutations, i++)
        entries[i]->mutations = &muts[off];
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = m->table;
    req.entries = entries;
    req.n_entries = n_entries;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = st_arena_alloc(b->a, len ? len : 1);
    if (!buf)
        return st_slice_make(NULL, 0);
    protobuf_c_message_pack(&req.base, buf);
    return st_slice_make(buf, len);
}

static void move_send_batch(node_move *m);

static void rows_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    node_move *m = arg;
    Google__Bigtable__V2__MutateRowsResponse *r =
        google__bigtable__v2__mutate_rows_response__unpack(NULL, msg.len, msg.data);
    bool ok = r != NULL;
    for (size_t i = 0; r && i < r->n_entries; i++)
        if (r->entries[i]->status && r->entries[i]->status->code != 0)
            ok = false;
    if (r)
        google__bigtable__v2__mutate_rows_response__free_unpacked(r, NULL);
    if (!ok)
        m->entry_failed = true;
}

static void rows_done(rpc_ccall *call, st_code code, const char *msg, void *arg) {
    (void)call;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK)
        return move_fail(m, code, msg ? msg : "MutateRows failed on the target");
    if (m->entry_failed)
        return move_fail(m, ST_INTERNAL, "the target refused some copied rows");
    move_defer(m, move_send_batch, 0);
}

static void move_send_batch(node_move *m) {
    st_arena_deinit(&m->arena);
    st_arena_init(&m->arena, MOVE_ARENA_BLOCK_BYTES);
    batch b = {.a = &m->arena};
    st_buf_init(&b.entries);
    st_buf_init(&b.mutations);
    st_err err = {0};
    st_code rc = batch_fill(m, &b, &err);
    st_slice req = rc == ST_OK && b.cells ? batch_pack(m, &b) : st_slice_make(NULL, 0);
    size_t cells = b.cells;
    st_buf_free(&b.entries);
    st_buf_free(&b.mutations);
    if (rc != ST_OK)
        return move_fail(m, rc, err.msg[0] ? err.msg : "reading the tablet failed");
    if (cells == 0)
        return move_finish(m);
    m->cells_copied += cells;
    if (!req.data ||
        !rpc_client_call(m->client, "/google.bigtable.v2.Bigtable/MutateRows", req, NULL, 0,
                         MOVE_RPC_TIMEOUT_MS, rows_msg, rows_done, m))
        move_fail(m, ST_UNAVAILABLE, "could not send a copy batch to the target");
}

/* ---- before the copy: schema, tablet, in-flight writes ---- */

static void move_copy_start(node_move *m) {
    if (__atomic_load_n(&m->n->writes_finished, __ATOMIC_RELAXED) < m->drain_until)
        return move_defer(m, move_copy_start, MOVE_DRAIN_POLL_MS);
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (!tab)
        return move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
    st_err err = {0};
    sto_range all = {0};
    st_code rc = sto_snapshot_new(tab->st, &m->snap, &err);
    if (rc == ST_OK)
        rc = sto_iter_new(m->snap, &all, false, &m->it, &err);
    if (rc != ST_OK)
        return move_fail(m, rc, err.msg);
    move_send_batch(m);
}

static void create_done(st_code code, const char *msg, st_slice resp, void *arg) {
    node_move *m = arg;
    if (m->aborting)
        return;
    Strata__Internal__V1__Tablet *t =
        code == ST_OK ? strata__internal__v1__tablet__unpack(NULL, resp.len, resp.data) : NULL;
    if (!t)
        return move_fail(m, code == ST_OK ? ST_INTERNAL : code,
                         msg ? msg : "unreadable CreateTablet answer");
    m->target_id = t->id;
    strata__internal__v1__tablet__free_unpacked(t, NULL);
    /* Ids are unique across the instance: the same id back means the target is this node (its
     * CreateTablet found the tablet itself), which must not be dropped as a partial copy. */
    if (m->target_id == m->id)
        return move_fail(m, ST_INVALID_ARGUMENT, "the target is this node");
    m->target_created = true;
    if (st_buf_append(&m->target_tablet, resp.data, resp.len) != ST_OK)
        return move_fail(m, ST_RESOURCE_EXHAUSTED, "out of memory");
    move_defer(m, move_copy_start, 0);
}

static void put_done(st_code code, const char *msg, st_slice resp, void *arg) {
    (void)resp;
    node_move *m = arg;
    if (m->aborting)
        return;
    if (code != ST_OK)
        return move_fail(m, code, msg ? msg : "PutTable failed on the target");
    node_tablet *tab = node_tablet_by_id(m->n, m->id, NULL);
    if (!tab)
        return move_fail(m, ST_ABORTED, "the tablet was dropped during the move");
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = m->table;
    req.start_key = (ProtobufCBinaryData){tab->start.len, tab->start.data};
    req.end_key = (ProtobufCBinaryData){tab->end.len, tab->end.data};
    move_unary(m, "CreateTablet", &req.base, create_done);
}

static void move_put_table(node_move *m) {
    node_table *meta = node_catalog_find(m->n->catalog, m->table);
    Google__Bigtable__Admin__V2__Table *pt = meta ? node_table_to_pb(meta, false, &m->arena) : NULL;
    if (!pt)
        return move_fail(m, meta ? ST_RESOURCE_EXHAUSTED : ST_ABORTED,
                         meta ? "out of memory" : "the table was dropped during the move");
    Strata__Internal__V1__PutTableRequest req;
    strata__internal__v1__put_table_request__init(&req);
    req.table = pt;
    move_unary(m, "PutTable", &req.base, put_done);
}

/* ---- the handler ---- */

static node_move *move_new(node_ctx *n, rpc_call *call, const node_tablets *t,
                           const node_tablet *tab, const char *target, st_err *err) {
    char host[MOVE_HOST_MAX];
    uint16_t port;
    if (!node_parse_addr(target, host, sizeof host, &port)) {
        st_err_set(err, ST_INVALID_ARGUMENT, "target '%s' is not host:port", target);
        return NULL;
    }
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
    m->client = rpc_client_new(n->base, host, port, NULL, err);
    if (!m->client) {
        move_free(m);
        return NULL;
    }
    return m;
}

void node_h_move_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__MoveTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__move_tablet_request__descriptor, req_bytes);
    if (!req)
        return;
    node_tablets *t;
    node_tablet *tab = node_tablet_by_id(n, req->id, &t);
    if (!tab)
        return node_fail(call, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by node %u",
                         req->id, n->opts.node_num);
    if (tab->moving)
        return node_fail(call, ST_FAILED_PRECONDITION, "tablet %" PRIu64 " is already moving",
                         req->id);
    st_err err = {0};
    node_move *m = move_new(n, call, t, tab, req->target, &err);
    if (!m)
        return node_fail(call, err.code, "%s", err.msg);
    tab->moving = true;
    m->drain_until = n->writes_started;
    m->next = n->moves;
    n->moves = m;
    st_log(ST_LOG_INFO, "move", "table=%s tablet=%" PRIu64 " to %s: started", t->name, m->id,
           m->target);
    move_put_table(m);
}

void node_moves_abort(node_ctx *n) {
    while (n->moves) {
        node_move *m = n->moves;
        m->aborting = true;
        move_unmark(m);
        if (!m->answered)
            node_fail(m->call, ST_UNAVAILABLE, "the node is shutting down; move tablet %" PRIu64
                      " again", m->id);
        move_free(m);
    }
}
