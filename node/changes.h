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
    st_slice value; /* the record cell's value (sto_row_mut encoding, docs/changestreams.md) */
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
void node_cs_unwatch(node_ctx *n, node_cs_watcher *w); /* safe on an unwatched watcher */

/* ---- read side ---- */

/* The data API handlers (registered in server.c). */
void node_h_generate_partitions(rpc_call *call, st_slice req, void *arg);
void node_h_read_change_stream(rpc_call *call, st_slice req, void *arg);

#endif
