/* node_internal.h — what the node's modules share (private to node/).
 *
 * Threads: everything here runs on the node's event-loop thread, except storage's commit thread,
 * whose completions come back to the loop through node_write's rpc_server_post.
 *
 * Modules: node.c (open/close, tablet map, clock, helpers below), server.c (method table),
 * admin.c (table admin API), mutate.c (MutateRow(s), CheckAndMutateRow, ReadModifyWriteRow,
 * SampleRowKeys, PingAndWarm), rowlock.c (per-row ordering for read-modify-write),
 * read.c (ReadRows: row sets, chunk protocol, filters, flow control), filter_pb.c (RowFilter
 * protobuf -> node_filter), internal.c (the strata.internal.v1.Node service), split.c (tablet
 * splits, size-based splits), move.c (MoveTablet: copying a tablet to another node). */
#ifndef NODE_INTERNAL_H
#define NODE_INTERNAL_H

#include <protobuf-c/protobuf-c.h>

#include "catalog.h"
#include "strata/btutil.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"

/* ---- Bigtable limits we enforce (docs/bigtable.md, Limits) ---- */
#define NODE_ROW_KEY_MAX 4096
#define NODE_QUALIFIER_MAX 16384
#define NODE_VALUE_MAX (100u << 20)
#define NODE_MUTATIONS_MAX 100000
#define NODE_FILTER_BYTES_MAX 20480
#define NODE_LABEL_MAX 15

/* ---- the tablet map: which local tablets hold which rows of a table ---- */
typedef struct node_tablet {
    uint64_t id;
    sto_tablet *st;
    st_buf start, end; /* [start, end); empty end = unbounded */
    bool moving;       /* MoveTablet is copying it away: writes get strata-not-owner, reads work */
    bool incoming;     /* a move's copy not yet activated: only CopyRows writes it (move.c) */
    uint32_t copies;   /* CopyRows writes to it not yet finished (incoming copies) */
    int64_t copy_touch_us;        /* st_mono_us of its creation or last CopyRows (the idle drop) */
    bool written;                 /* written since the size-based split check last looked at it */
    uint8_t split_waits;          /* checks in a row that found its split not yet quick (split.c) */
    uint64_t writes, writes_mark; /* rows written (node_row_prepare); at the last metrics tick */
} node_tablet;

typedef struct node_tablets {
    char name[NODE_TABLE_NAME_MAX + 1];
    /* Sorted by start, never overlapping. A standalone node's tablets cover all rows; a cluster
     * member's may leave gaps (rows served by other nodes), or be none at all. */
    node_tablet *v;
    size_t n;
} node_tablets;

/* Fault settings for tests of moves, from the environment variable STRATA_TEST_MOVE (a comma
 * separated list, read at open; never set in production): hold_ms=N makes a source wait N ms
 * between the end of the copy and the activation; kill=activated makes a source kill itself
 * (SIGKILL) once the target activated its copy, before dropping its own tablet; kill=created
 * makes a target kill itself after creating an incoming copy in storage, before answering;
 * kill=activating / kill=answering make a target kill itself on the activation, before it /
 * after it is durable (before the answer);
 * incoming_idle_ms=N replaces NODE_INCOMING_IDLE_MS; batch_ms=N makes a source wait N ms
 * before each copy batch after the first (a move stays mid-copy that long). */
#define NODE_MOVE_TEST_ENV "STRATA_TEST_MOVE"
typedef struct node_move_test {
    int hold_ms;
    int incoming_idle_ms;
    int batch_ms;
    bool kill_activated, kill_created, kill_activating, kill_answering;
} node_move_test;

/* Tablet ids: (node_num << NODE_TABLET_ID_COUNTER_BITS) | a per-node counter (the catalog's). */
#define NODE_TABLET_ID_COUNTER_BITS 40

/* A tablet out of the map whose drop storage has not made yet (its manifest could not be
 * written, e.g. a full disk): never served again, retried with backoff (move.c,
 * node_drops_retry) and still named where a restart looks for it, so a restart cannot bring it
 * back as a served tablet: in DATA/incoming when it was a move's copy not yet activated, in
 * DATA/outgoing (the move's line) when its range moved to another node (docs/cluster.md). */
#define NODE_DROP_TARGET_MAX 264
typedef struct node_drop_pending {
    uint64_t id;
    bool incoming;                     /* a move's copy: named in DATA/incoming */
    uint64_t target_id;                /* moved away: its DATA/outgoing line, when nonzero */
    char target[NODE_DROP_TARGET_MAX]; /* ... and the target's host:port */
    int64_t next_try_us;               /* st_mono_us of the next attempt */
    int backoff_ms;                    /* doubles per failed attempt, up to a minute */
} node_drop_pending;

struct node_ctx {
    node_opts opts;
    char data_dir[4096];
    st_lock *data_lock; /* data_dir/LOCK (node.c) */
    struct event_base *base;
    rpc_server *rpc;
    uint16_t port;
    sto_db *db;
    node_catalog *catalog;
    node_tablets *tables; /* sorted by name, parallel to the catalog's tables */
    size_t n_tables;
    int64_t hlc_last_us; /* hybrid logical clock: last version timestamp handed out */
    struct node_rowlocks *rowlocks;
    bool closing;
    uint64_t writes_in_flight; /* node_write calls whose completion has not run yet */
    /* node_write calls started / completed (loop thread; storage completes them in order), so a
     * move can wait for the writes that passed its ownership check before it snapshots. */
    uint64_t writes_started, writes_finished;
    /* The highest log position of a node_write whose completion ran (loop thread): a move
     * waits for the peer clusters to have everything up to it before dropping its tablet. */
    uint64_t written_lsn_max;
    int64_t start_us;             /* st_mono_us at open (GetStatus uptime) */
    struct event *split_timer;    /* size-based split checks; NULL when split_bytes is 0 */
    struct node_move *moves;      /* MoveTablet copies in progress (move.c) */
    node_move_test move_test;     /* test-only faults (NODE_MOVE_TEST_ENV) */
    struct event *incoming_timer; /* drops incoming copies idle too long (move.c) */
    node_drop_pending *drops;     /* drops storage has not made yet (node_tablet_drop) */
    size_t n_drops;
    struct node_move_waiter *move_waiters; /* DropRowRanges and family purges waiting for a move
                                              to end (admin.c) */
    /* DropRowRange jobs deleting rows in storage right now (streams off, admin.c): no move of a
     * tablet of their tables starts meanwhile (move.c, node_table_dropping). */
    struct drop_prefix_arg *drop_jobs;
    struct repl_ctx *repl;        /* replication (repl_glue.c); NULL without --config */
    struct read_state *read_pool; /* idle ReadRows states kept for reuse (read.c) */
    size_t read_pool_n;
    /* ReadRows turns waiting for the next loop pass, oldest first, and the timer that runs them
     * (read.c, schedule_turn); the loop pass (libevent's cached time) whose turns took
     * read_pass_us so far (read.c, pass_has_room); whether the queue waited in the last pass. */
    struct read_state *read_turns_head, *read_turns_tail;
    size_t read_turns_n;
    struct event *read_turns_ev;
    bool read_turns_put_off;
    int64_t read_pass_at, read_pass_us;
    struct node_cs *cs;   /* change streams, write side (changes_write.c) */
    size_t cs_kept_bytes; /* open ReadChangeStream calls' requests (changes_read.c) */
    /* Change stream reader turns running back to back (changes_read.c, turn_may_run): since
     * when, when the last one ended (st_mono_us), and which burst it is. */
    int64_t cs_burst_start_us, cs_burst_last_us;
    uint64_t cs_burst;
    struct node_backups *backups; /* backup pieces being made, pulls (backup.c) */
    int jobs;                     /* node_job threads whose answer has not run yet (job.c) */
    /* How this node dials its peers (replication, moves, backups): with mutual TLS it presents
     * the node certificate (opts.client_ssl_ctx) and requires a strata-node certificate back. */
    rpc_client_opts peer_opts;
};

/* access.c: the roles (bit mask) allowed to call path when the node requires client
 * certificates, and the server guard enforcing them (rpc_guard_fn). */
unsigned node_access_roles(const char *path);
st_code node_access_guard(rpc_call *call, const char *path, void *arg, st_err *err);
/* The caller's certificate names strata-node: another node (a move's source, a shipper, a
 * backup pull), whose calls the handlers of methods shared with routers restrict further. */
bool node_caller_is_node(rpc_call *call);

/* Tablets of a table; NULL if the table is unknown. */
node_tablets *node_tablets_find(node_ctx *n, const char *table);
/* The local tablet covering row; NULL when none does (a cluster member's gap). */
node_tablet *node_tablet_for_row(node_tablets *t, st_slice row);
/* The tablet a write of row goes to: as node_tablet_for_row, but NULL for a moving tablet too;
 * marks the tablet written (size-based splits look at written tablets only). */
node_tablet *node_tablet_for_write(node_tablets *t, st_slice row);
/* Index of the last tablet whose start <= key (0 when none is; t->n must be > 0). */
size_t node_tablet_index(node_tablets *t, st_slice key);
/* Sets err to FAILED_PRECONDITION "strata-not-owner: ..." naming the table and row (or the
 * start of a range); returns the code. */
st_code node_not_owner(node_ctx *n, st_err *err, const char *table, st_slice row);
/* True for a cluster member (node_num != 0): no automatic first tablet, gaps allowed. */
bool node_in_cluster(const node_ctx *n);
/* A fresh tablet id, unique across the instance; the catalog must be saved before it is used. */
uint64_t node_tablet_new_id(node_ctx *n);
/* The tablet with this id and its table; NULL when absent. */
node_tablet *node_tablet_by_id(node_ctx *n, uint64_t id, node_tablets **table);
/* Adds a storage tablet to its table's map (RESOURCE_EXHAUSTED when out of memory). */
st_code node_tablet_map(node_tablets *t, sto_tablet *st);
/* Removes map entry i (storage's tablet is the caller's business). */
void node_tablet_unmap(node_tablets *t, size_t i);
/* Drops map entry i and its storage tablet. The entry leaves the map in any case; when storage
 * fails the tablet becomes a pending drop (n->drops), retried until it succeeds. */
st_code node_tablet_drop(node_ctx *n, node_tablets *t, size_t i, st_err *err);
/* The pending drop of tablet id, NULL when none. */
node_drop_pending *node_drop_pending_find(node_ctx *n, uint64_t id);
/* DATA/incoming: the ids of the tablets that are a move's copy not yet activated, one per line,
 * rewritten (atomically) from the map whenever that set changes; a node that starts with one of
 * them drops it, as its source still owns the range (docs/cluster.md, Moves). */
#define NODE_INCOMING_FILE "incoming"
st_code node_incoming_save(node_ctx *n, st_err *err);
/* Writes b as DATA/name (atomically, synced); built is how building b went (not ST_OK: out of
 * memory, nothing written). */
st_code node_data_file_save(node_ctx *n, const char *name, st_code built, const st_buf *b,
                            st_err *err);
/* Splits tablet i of t at key (empty = sto_tablet_mid_key) into two tablets with fresh ids
 * (ids[0] left, ids[1] right; may be NULL). FAILED_PRECONDITION for a moving tablet or one with
 * too few rows, INVALID_ARGUMENT for a key outside (start, end). Pointers into t->v are
 * invalidated. */
st_code node_tablet_split(node_ctx *n, node_tablets *t, size_t i, st_slice key, uint64_t ids[2],
                          st_err *err);
/* Size-based splits (split.c): starts the check timer when split_bytes is set; stop is safe to
 * call twice. */
st_code node_split_timer_start(node_ctx *n, st_err *err);
void node_split_timer_stop(node_ctx *n);
typedef struct node_move_waiter node_move_waiter; /* admin.c */
/* True while a DropRowRange job deletes rows of table here (streams off, admin.c): a move of
 * one of its tablets waits for it before it starts (move.c). */
bool node_table_dropping(const node_ctx *n, const char *table);
/* Ends the DropRowRanges and family purges waiting for a move (node_close): their calls fail
 * UNAVAILABLE. */
void node_move_waiters_abort(node_ctx *n);
/* Reads NODE_MOVE_TEST_ENV into n->move_test (open). */
void node_move_test_load(node_ctx *n);
/* DATA/outgoing: the moves whose activation was sent and whose outcome is not known yet, one
 * per line (move.c); at open their tablets stay read-only until the target says whether it
 * activated the copy (docs/cluster.md, Moves). */
#define NODE_OUTGOING_FILE "outgoing"
st_code node_moves_resume(node_ctx *n, st_err *err);
/* An incoming copy that took no CopyRows for this long is dropped: its source gave up (killed,
 * stopped, or its DropTablet never arrived). A live source never leaves it idle that long (its
 * calls time out after 2 minutes; it waits at most 250 ms for its peers before the activation). */
#define NODE_INCOMING_IDLE_MS 300000
/* Starts the idle check of incoming copies (open); stop is safe to call twice. */
st_code node_incoming_timer_start(node_ctx *n, st_err *err);
void node_incoming_timer_stop(node_ctx *n);
/* Tries again the pending drops whose time has come (the incoming copy check's timer). */
void node_drops_retry(node_ctx *n);
/* Ends every move in progress (node_close): they fail, their tablets stay here. */
void node_moves_abort(node_ctx *n);
/* Pushes a table's family GC rules to all its tablets (after open and ModifyColumnFamilies). */
st_code node_table_push_gc(node_ctx *n, const node_table *meta, st_err *err);
/* As node_table_push_gc for the one new tablet i of t (its rules and its change-stream GC
 * report): pushing to every tablet of the table for each one created cost n^2 for a table of n. */
st_code node_tablet_push_gc(node_ctx *n, const node_table *meta, node_tablets *t, size_t i,
                            st_err *err);
/* Creates a storage tablet [start, end) for the table and adds it to the map. */
st_code node_tablet_create(node_ctx *n, node_tablets *t, st_slice start, st_slice end, st_err *err);
/* As node_tablet_create; incoming: a move's copy, named in DATA/incoming before it exists. */
st_code node_tablet_create_as(node_ctx *n, node_tablets *t, st_slice start, st_slice end,
                              bool incoming, st_err *err);
/* Adds an empty map entry for a new table (NULL when out of memory); removes one whose tablets
 * were dropped. Pointers to entries are invalidated by both. */
node_tablets *node_tables_add(node_ctx *n, const char *name);
void node_tables_remove(node_ctx *n, node_tablets *t);

/* ---- clock ---- */
/* Server-assigned cell timestamp: now in microseconds at millisecond granularity (Bigtable's
 * default table granularity), never going backwards. */
int64_t node_server_ts_us(node_ctx *n);
/* A fresh version for a local commit: STO_VERSION(hlc_us, cluster_num), strictly increasing. */
uint64_t node_next_version(node_ctx *n);
/* How far ahead of this node's wall clock a time it is handed may lie and still move its clock:
 * a restored piece's freeze instant, the versions of an imported piece's files (past that
 * instant), a replicated or copied commit time. Clocks of healthy nodes differ by far less. */
#define NODE_CLOCK_AHEAD_MAX_US (3600LL * 1000000)
/* Moves the clock past ts_us, a commit time or clock reading that came with data from elsewhere
 * (what: "replication", "a tablet move"; table may be NULL), so later local writes get higher
 * versions. A time more than NODE_CLOCK_AHEAD_MAX_US past the wall clock (a node whose clock is
 * wrong, or data with forged versions) does not move it: following it would give every later
 * write on this node, and every change record, a time from the future. That is logged at error
 * level (rate-limited); the data is applied with its versions all the same. Loop thread. */
void node_clock_observe(node_ctx *n, int64_t ts_us, const char *what, const char *table);

/* ---- request helpers ---- */
/* Unpacks a request with protobuf-c through the call's arena; on failure finishes the call with
 * INVALID_ARGUMENT and returns NULL. */
ProtobufCMessage *node_unpack(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                              st_slice bytes);
/* Packs msg and queues it on the call (ST_OK or the rpc_call_send code). */
st_code node_send(rpc_call *call, const ProtobufCMessage *msg);
/* Packs msg, sends it and finishes the call with OK. */
void node_reply(rpc_call *call, const ProtobufCMessage *msg);
/* Finishes the call with code and a printf-style message (also logged at debug). */
void node_fail(rpc_call *call, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* True if the client announced a feature in its bigtable-features header (base64 FeatureFlags),
 * e.g. node_feature(call, 1) for reverse_scans (FeatureFlags field number). */
bool node_feature(rpc_call *call, uint32_t field_number);
/* Splits "projects/P/instances/I/tables/T" checks; INVALID_ARGUMENT with a message if malformed. */
st_code node_check_table_name(const char *name, st_err *err);
/* Finds the table of a data request; on failure finishes the call (NOT_FOUND "table ... not
 * found", or INVALID_ARGUMENT) and returns NULL. */
node_tablets *node_table_or_fail(node_ctx *n, rpc_call *call, const char *table_name,
                                 node_table **meta);

/* ---- writes ---- */
/* Called on the loop thread when a node_write finished. */
typedef void (*node_write_done_fn)(node_ctx *n, st_code code, const char *msg, void *arg);
/* Validates and writes rows (each atomic) through storage's group commit; done runs later on the
 * loop thread. Validation failures are returned directly (done not called). The bytes the rows
 * point to (keys, names, values) stay the caller's and must stay valid until done runs: a
 * replicated delete of the same row reads the writes in flight (node_cs_inflight_each). */
st_code node_write(node_ctx *n, const sto_row_mut *rows, size_t count, st_err *err,
                   node_write_done_fn done, void *arg);

/* The local tablet a write of row goes to (node_tablet_for_write); NULL with err NOT_FOUND when
 * the table is gone, or strata-not-owner when no writable local tablet holds the row. */
node_tablet *node_write_tablet(node_ctx *n, const char *table, st_slice row, st_err *err);
/* Fills in what a row mutation gets at commit: its tablet (as node_write_tablet, same errors), a
 * fresh version, the commit time and the origin. */
st_code node_row_prepare(node_ctx *n, const char *table, sto_row_mut *row, st_err *err);
/* A multi-cluster write carries its router's fence (BTU_WRITE_BY_HEADER, docs/router.md,
 * Failover): DEADLINE_EXCEEDED when this node's clock has passed it, checked just before the
 * write takes its versions, so a write that reaches a node after the router may have sent it to
 * another cluster is never applied. ST_OK without the header. */
st_code node_write_fence_check(rpc_call *call, st_err *err);

/* Converts one data-API mutation to storage's form; strings point into the protobuf message.
 * server_ts_us resolves SetCell timestamp -1. INVALID_ARGUMENT with a message for a bad one
 * (the code for an unknown family follows the emulator; see mutate.c). */
st_code node_mutation_from_pb(node_ctx *n, const node_table *meta,
                              const Google__Bigtable__V2__Mutation *m, int64_t server_ts_us,
                              sto_mut *out, st_err *err);

/* ---- work off the loop thread (job.c) ---- */
typedef struct node_job node_job;
typedef void (*node_job_fn)(node_job *j);
struct node_job {
    node_ctx *n;
    rpc_call *call;
    node_job_fn work, done; /* work on the job's thread, then done on the loop (frees j) */
    void *arg;
    st_code rc;
    st_err err;
    rpc_post post;
};
/* Starts j->work on a thread of its own; j->done(j) runs on the loop afterwards and frees j.
 * RESOURCE_EXHAUSTED when no thread could start (nothing runs). Loop thread only. */
st_code node_job_start(node_job *j, st_err *err);
/* Turns the loop until every job's done has run (node_close, before the server goes). */
void node_jobs_wait(node_ctx *n);
/* Tests only: called first on each job's thread, so a test can hold a job while it checks that
 * the loop still serves calls. NULL in the product. */
extern void (*node_job_test_hook)(void);

/* ---- row locks (rowlock.c) ----
 * Every write holds its rows from node_write until durable; CheckAndMutateRow and
 * ReadModifyWriteRow hold their row from the read until their write is durable. Holders of one
 * row run strictly one after another, in arrival order, so a read-modify-write sees every write
 * queued before it and none after: single-row transactions are atomic. */
typedef struct node_rowlocks node_rowlocks;
typedef void (*node_rowlock_fn)(node_ctx *n, void *arg);
node_rowlocks *node_rowlocks_new(void);
void node_rowlocks_free(node_rowlocks *l); /* NULL is fine */
/* Runs fn(n, arg) on the loop once every earlier holder of (table, row) released it: at once
 * (inside the call) when the row is free. RESOURCE_EXHAUSTED when out of memory (fn not run).
 * The holder must call node_rowlock_release exactly once. Keys are copied. */
st_code node_rowlock_acquire(node_ctx *n, const char *table, st_slice row, node_rowlock_fn fn,
                             void *arg);
void node_rowlock_release(node_ctx *n, const char *table, st_slice row);
/* Takes the lock only if (table, row) is free now; true when taken. */
bool node_rowlock_try(node_ctx *n, const char *table, st_slice row);

/* ---- reading one row (CheckAndMutateRow, ReadModifyWriteRow) ---- */
typedef struct node_row_cell {
    st_slice family, qualifier, value;
    int64_t ts_us;
} node_row_cell;
/* Calls fn with each visible cell of one row of tablet tab, in order, from a snapshot taken now
 * (the cell's bytes live until fn returns); stops at fn's first code other than ST_OK, which it
 * returns. */
st_code node_row_each(node_tablet *tab, st_slice row, st_code (*fn)(const sto_cell *c, void *arg),
                      void *arg, st_err *err);
/* Reads the visible cells of one row of tablet tab (copies into arena). */
st_code node_read_row(node_tablet *tab, st_slice row, st_arena *arena, node_row_cell **cells,
                      size_t *n_cells, st_err *err);

/* ---- ReadRows states (read.c) ---- */
/* Idle states kept for reuse, so a read allocates nothing once the pool is warm; each keeps its
 * buffers (up to 1 MiB each). */
#define NODE_READ_POOL_MAX 64
/* Frees the pool (node_close, once no read is running). */
void node_read_pool_free(node_ctx *n);

/* ---- handlers (server.c registers them; arg is the node_ctx) ---- */
void node_h_read_rows(rpc_call *call, st_slice req, void *arg);
void node_h_sample_row_keys(rpc_call *call, st_slice req, void *arg);
void node_h_mutate_row(rpc_call *call, st_slice req, void *arg);
void node_h_mutate_rows(rpc_call *call, st_slice req, void *arg);
void node_h_check_and_mutate_row(rpc_call *call, st_slice req, void *arg);
void node_h_read_modify_write_row(rpc_call *call, st_slice req, void *arg);
void node_h_ping_and_warm(rpc_call *call, st_slice req, void *arg);

void node_h_create_table(rpc_call *call, st_slice req, void *arg);
void node_h_get_table(rpc_call *call, st_slice req, void *arg);
void node_h_list_tables(rpc_call *call, st_slice req, void *arg);
void node_h_delete_table(rpc_call *call, st_slice req, void *arg);
void node_h_modify_column_families(rpc_call *call, st_slice req, void *arg);
void node_h_drop_row_range(rpc_call *call, st_slice req, void *arg);
void node_h_generate_consistency_token(rpc_call *call, st_slice req, void *arg);
void node_h_check_consistency(rpc_call *call, st_slice req, void *arg);

/* strata.internal.v1.Node (internal.c, move.c) */
void node_h_get_status(rpc_call *call, st_slice req, void *arg);
void node_h_put_table(rpc_call *call, st_slice req, void *arg);
void node_h_drop_table(rpc_call *call, st_slice req, void *arg);
void node_h_list_tablets(rpc_call *call, st_slice req, void *arg);
void node_h_create_tablet(rpc_call *call, st_slice req, void *arg);
void node_h_drop_tablet(rpc_call *call, st_slice req, void *arg);
void node_h_split_tablet(rpc_call *call, st_slice req, void *arg);
void node_h_move_tablet(rpc_call *call, st_slice req, void *arg);
void node_h_copy_rows(rpc_call *call, st_slice req, void *arg);

st_code node_server_register(node_ctx *n, st_err *err);

#endif
