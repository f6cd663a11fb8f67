/* node_internal.h — what the node's modules share (private to node/).
 *
 * Threads: everything here runs on the node's event-loop thread, except storage's commit thread,
 * whose completions come back to the loop through node_write's rpc_server_post.
 *
 * Modules: node.c (open/close, tablet map, clock, helpers below), server.c (method table),
 * admin.c (table admin API), mutate.c (MutateRow(s), CheckAndMutateRow, ReadModifyWriteRow,
 * SampleRowKeys, PingAndWarm), rowlock.c (per-row ordering for read-modify-write),
 * read.c (ReadRows: row sets, chunk protocol, filters, flow control), filter_pb.c (RowFilter
 * protobuf -> node_filter). */
#ifndef NODE_INTERNAL_H
#define NODE_INTERNAL_H

#include <protobuf-c/protobuf-c.h>

#include "catalog.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"

/* ---- Bigtable limits we enforce (BIGTABLE_SEMANTICS.md §5) ---- */
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
} node_tablet;

typedef struct node_tablets {
    char name[NODE_TABLE_NAME_MAX + 1];
    node_tablet *v; /* sorted by start, contiguous, covering all rows */
    size_t n;
} node_tablets;

struct node_ctx {
    node_opts opts;
    char data_dir[4096];
    struct event_base *base;
    rpc_server *rpc;
    uint16_t port;
    sto_db *db;
    node_catalog *catalog;
    node_tablets *tables; /* sorted by name, parallel to the catalog's tables */
    size_t n_tables;
    int64_t hlc_last_us;  /* hybrid logical clock: last version timestamp handed out */
    struct node_rowlocks *rowlocks;
    bool closing;
    uint64_t writes_in_flight; /* node_write calls whose completion has not run yet */
};

/* Tablets of a table; NULL if the table is unknown. */
node_tablets *node_tablets_find(node_ctx *n, const char *table);
/* The tablet covering row (never NULL for a known table). */
node_tablet *node_tablet_for_row(node_tablets *t, st_slice row);
/* Index of the first tablet whose range may contain rows >= key. */
size_t node_tablet_index(node_tablets *t, st_slice key);
/* Pushes a table's family GC rules to all its tablets (after open and ModifyColumnFamilies). */
st_code node_table_push_gc(node_ctx *n, const node_table *meta, st_err *err);
/* Creates a storage tablet [start, end) for the table and adds it to the map. */
st_code node_tablet_create(node_ctx *n, node_tablets *t, st_slice start, st_slice end,
                           st_err *err);
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
 * loop thread. Validation failures are returned directly (done not called). */
st_code node_write(node_ctx *n, const sto_row_mut *rows, size_t count, st_err *err,
                   node_write_done_fn done, void *arg);

/* Converts one data-API mutation to storage's form; strings point into the protobuf message.
 * server_ts_us resolves SetCell timestamp -1. INVALID_ARGUMENT with a message for a bad one
 * (the code for an unknown family follows the emulator; see mutate.c). */
st_code node_mutation_from_pb(node_ctx *n, const node_table *meta,
                              const Google__Bigtable__V2__Mutation *m, int64_t server_ts_us,
                              sto_mut *out, st_err *err);

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
/* Reads the visible cells of one row (copies into arena). */
st_code node_read_row(node_ctx *n, node_tablets *t, st_slice row, st_arena *arena,
                      node_row_cell **cells, size_t *n_cells, st_err *err);

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

st_code node_server_register(node_ctx *n, st_err *err);

#endif
