/* changes.h — change streams inside the node (private to node/; design: docs/changestreams.md).
 *
 * Two halves share this header:
 * - the write side (changes_write.c): stamps, the change record cell added to every row
 *   mutation of a table with streams on, the resolved stamp, and a bounded in-memory ring of
 *   recent records with watchers that are woken when records arrive;
 * - the read side (changes_read.c): GenerateInitialChangeStreamPartitions and ReadChangeStream
 *   on the node, which read history from storage (catch-up) and from the ring (live).
 *
 * Everything runs on the node's loop thread. */
#ifndef NODE_CHANGES_H
#define NODE_CHANGES_H

#include "node_internal.h"

/* The system family holding change records (storage hides families starting with 0x00). */
#define NODE_CS_FAMILY "\0changes"
#define NODE_CS_FAMILY_LEN 8
/* Record qualifier: be64(stamp_us) be32(index of the row in its write). */
#define NODE_CS_QUALIFIER_LEN 12

/* A record's flags (beside STO_ROW_GC): its SetCells with an empty value are references to the
 * cell the same row mutation wrote (family, qualifier, timestamp; docs/changestreams.md, Values
 * by reference): readers of the stored record take the value from the row. Records in the ring
 * never have it (they hold every value). */
#define NODE_CS_REC_REFS 0x100u
/* SetCell values of at least this many bytes are stored by reference. */
#define NODE_CS_REF_MIN_BYTES 64
/* Rows with more mutations than this reference only the SetCells that are alone in their column
 * (checking which SetCells a later mutation of the same row mutation overwrites or deletes is
 * quadratic; this is sorted instead). */
#define NODE_CS_REF_MUTS_MAX 256

/* Retention limits of change_stream_config (microseconds). */
#define NODE_CS_RETENTION_MIN_US (24LL * 3600 * 1000000)
#define NODE_CS_RETENTION_MAX_US (7LL * 24 * 3600 * 1000000)

/* ---- write side ---- */

/* The resolved stamp: every record with a stamp <= it is durable and readable from storage
 * (and, when recent enough, from the ring). Never decreases. */
int64_t node_cs_resolved(node_ctx *n);

/* One record as the ring holds it. Slices are valid during the callback only. */
typedef struct node_cs_rec {
    int64_t stamp_us;
    const char *table; /* full table name */
    st_slice row;
    /* The record: its DataChange message but for the end (node_cs_encode_body) when body, else
     * the record cell's value with every value inline (sto_row_mut encoding,
     * docs/changestreams.md). */
    st_slice value;
    bool body;
} node_cs_rec;

typedef enum node_cs_ring_rc {
    NODE_CS_RING_OK = 0, /* every record of the range with stamp in (after, upto] was passed */
    NODE_CS_RING_MISS,   /* the ring does not reach back to `after`: read storage instead */
    NODE_CS_RING_STOP,   /* fn returned false */
} node_cs_ring_rc;

/* Calls fn, in stamp order, for each ring record of table whose row is in [start, end) (empty
 * end = unbounded) with stamp in (after, upto]. NODE_CS_RING_MISS when records with stamps
 * above `after` may exist that the ring no longer (or never did) hold for that range — e.g.
 * older than the node's start or the tablet's arrival here. */
node_cs_ring_rc node_cs_ring_scan(node_ctx *n, const char *table, st_slice start, st_slice end,
                                  int64_t after, int64_t upto,
                                  bool (*fn)(const node_cs_rec *rec, void *arg), void *arg);

/* A watcher is called (on the loop) after new records of its table became resolved. It must
 * not call node_cs_watch/unwatch on other watchers from inside the callback. */
typedef struct node_cs_watcher {
    const char *table;
    void (*fn)(struct node_cs_watcher *w);
    struct node_cs_watcher *prev, *next; /* owned by the ring */
} node_cs_watcher;
void node_cs_watch(node_ctx *n, node_cs_watcher *w);
/* A ReadChangeStream call opens (+1) or ends (-1). While none is open — none since the node
 * started, or none for 10 minutes (CS_RING_GRACE_US) — writes skip the ring (and the encoding
 * of their records with every value): a reader that then asks for earlier records reads them
 * from storage, as for records the ring dropped. */
void node_cs_readers_add(node_ctx *n, int delta);
void node_cs_unwatch(node_ctx *n, node_cs_watcher *w); /* safe on an unwatched watcher */

/* ---- write side: the node's hooks (changes_write.c) ---- */

/* Starts and ends the write side (node_open after the tablets are loaded; node_close once no
 * write is in flight). */
st_code node_cs_open(node_ctx *n, st_err *err);
void node_cs_close(node_ctx *n);

/* The source_cluster_id of records of cluster number origin: from the topology (--config), else
 * --cluster-id; buf (cap bytes) holds a name made up for an unknown cluster. */
const char *node_cs_cluster_id(node_ctx *n, uint32_t origin, char *buf, size_t cap);

/* A fresh stamp: the hybrid logical clock's next value (microseconds), above every version and
 * stamp handed out before. */
int64_t node_cs_next_stamp(node_ctx *n);

/* retention_period of a ChangeStreamConfig (NULL or no period = off, 0): INVALID_ARGUMENT unless
 * between NODE_CS_RETENTION_MIN_US and NODE_CS_RETENTION_MAX_US. */
st_code node_cs_retention_from_pb(const Google__Bigtable__Admin__V2__ChangeStreamConfig *c,
                                  int64_t *retention_us, st_err *err);
/* Sets a table's retention (0 = off) in its catalog entry: turning streams on stamps cs_since_us,
 * turning them off clears it. The caller saves the catalog and pushes GC rules. */
void node_cs_set_retention(node_ctx *n, node_table *meta, int64_t retention_us);
/* The table's ChangeStreamConfig (NULL when streams are off), in arena a. */
Google__Bigtable__Admin__V2__ChangeStreamConfig *node_cs_config_to_pb(const node_table *meta,
                                                                      st_arena *a);
/* Recounts the tables with streams on (after a table is added, dropped or changed) and keeps
 * each of their tablets' GC reports registered. */
void node_cs_tables_changed(node_ctx *n);
/* As node_cs_tables_changed for one new tablet st of the table meta (the table's count of
 * streams is unchanged by a tablet). */
void node_cs_tablet_added(node_ctx *n, const node_table *meta, sto_tablet *st);
/* Unregisters every tablet's GC report (node_close, before the server goes). */
void node_cs_stop_reports(node_ctx *n);

/* How node_write treats its rows. */
typedef enum node_write_kind {
    NODE_WRITE_RECORD = 0, /* a change: rows of tables with streams on get a record */
    NODE_WRITE_COPY,       /* a tablet move's copy: applied as given, no record */
    NODE_WRITE_GC,         /* GC records: each row's mutations are the record's content (the
                              cells storage dropped); only the record cell is applied */
} node_write_kind;

/* node_write with a mode (node_write is NODE_WRITE_RECORD). */
st_code node_write_mode(node_ctx *n, const sto_row_mut *rows, size_t count, node_write_kind mode,
                        st_err *err, node_write_done_fn done, void *arg);

/* What node_write keeps of one write for change streams: its stamp, its records. */
typedef struct node_cs_write node_cs_write;
/* Adds the record cells to rows (a copy in *out, valid until node_cs_write_done/abort; rows
 * themselves when nothing is added, with *w NULL). */
st_code node_cs_write_prepare(node_ctx *n, const sto_row_mut *rows, size_t count,
                              node_write_kind mode, const sto_row_mut **out, node_cs_write **w,
                              st_err *err);
/* Just before storage gets the write (loop thread): its stamp is in flight. */
void node_cs_write_started(node_ctx *n, node_cs_write *w);
/* Storage refused it at once (loop thread): no longer in flight; w is freed. */
void node_cs_write_abort(node_ctx *n, node_cs_write *w);
/* Its completion (loop thread): durable records go to the ring, watchers are woken, w is freed
 * or kept by the ring. */
void node_cs_write_done(node_ctx *n, node_cs_write *w, st_code code);
/* Its completion could not reach the loop (storage thread): the ring will answer MISS for the
 * stamps up to it; w is freed (by the loop, once past it, when it is in flight there). */
void node_cs_write_lost(node_ctx *n, node_cs_write *w);
/* Calls fn with the rows of each write with records still in flight (given to storage, not yet
 * completed), oldest first, stopping at the first code other than ST_OK, which it returns. The
 * rows' bytes are their callers', valid until the write's done runs (node_write). */
st_code node_cs_inflight_each(node_ctx *n,
                              st_code (*fn)(const sto_row_mut *rows, size_t count, void *arg),
                              void *arg);

/* ---- replicated deletes (changes_survive.c) ---- */

/* Whether row r came by replication and holds a delete of user cells: only such a row can find,
 * when it is applied here, cells of a higher version that its mutations do not change. */
bool node_cs_row_deletes(const sto_row_mut *r);
/* Appends to out (sto_mut) a SetCell for each cell of rows[i]'s row that one of its mutations
 * reaches (a delete's range, or a SetCell's coordinates) and that stays as it is because its
 * version is higher: the row as storage has it, then the writes in flight, then rows[0..i-1].
 * Names and values the read copied go to arena. ST_RESOURCE_EXHAUSTED, or a read's error. */
st_code node_cs_survivors(node_ctx *n, const sto_row_mut *rows, size_t i, st_arena *arena,
                          st_buf *out, st_err *err);

/* Sets the ring's size before its first record (tests: eviction with little data); ignored once
 * the ring holds records. */
void node_cs_set_ring_bytes(node_ctx *n, size_t bytes);
/* Whether the ring's buffer is mapped (resident): from the moment a table has streams on, not at
 * the first record (tests). */
bool node_cs_ring_mapped(const node_ctx *n);

/* Rows of table in [start, end) arrived on this node (a move's copy): the ring answers MISS for
 * them below a fresh stamp taken now. */
void node_cs_range_arrived(node_ctx *n, const char *table, st_slice start, st_slice end);

/* The table's tablets here changed (a split, a tablet dropped after its move), the table was
 * deleted, or its streams were turned off or on: its readers are woken, so each sees at once
 * whether its partition still holds (CloseStream, NOT_FOUND, FAILED_PRECONDITION) instead of at
 * its next heartbeat, up to a day later; after a move no write reaches this node to wake it. */
void node_cs_table_changed(node_ctx *n, const char *table);

/* ---- read side ---- */

/* The data API handlers (registered in server.c). */
void node_h_generate_partitions(rpc_call *call, st_slice req, void *arg);
void node_h_read_change_stream(rpc_call *call, st_slice req, void *arg);

#endif
