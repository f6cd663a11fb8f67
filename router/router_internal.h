/* router_internal.h — what the router's modules share (private to router/).
 *
 * Everything runs on the router's one event-loop thread. The router holds no data: it caches
 *   - the topology (clusters and their nodes, from the file),
 *   - the instance metadata (tables and app profiles) read from the metadata table,
 *   - per cluster, one rpc_client per node and the tablet map learnt with ListTablets,
 * and forwards requests. See docs/router.md for the design and its limits.
 *
 * Modules: router.c (open/close, startup, method table, request helpers, routing),
 * conn.c (node clients with reconnect backoff, fan-out of unary calls, timers, tablet-map
 * refresh), tmap.c (the tablet map and the row-set walk over it: pure), wire.c (protobuf wire
 * scanning and request rewriting, MutateRows grouping and merging, SampleRowKeys merging: pure),
 * meta.c (metadata records, load and store), admin.c (table admin API), data.c (MutateRow,
 * CheckAndMutateRow, ReadModifyWriteRow, SampleRowKeys, PingAndWarm; data.h), mutate_rows.c
 * (MutateRows), read.c
 * (ReadRows across tablets with flow control and transparent resumption), changes.c (change
 * streams: partitions, ReadChangeStream relayed to the node or closed for a stale partition),
 * balance.c (the tablet balancer: MoveTablet from the fullest node to the emptiest, one move per
 * cluster at a time), health.c and failover.c (cluster health probes; multi-cluster plans,
 * failover, idempotent writes, the query-of-death guard: failover.h), instance.c, profiles.c and
 * operations.c (instance admin, app profiles and routing by them, long-running operations:
 * instance.h). App profiles are records of the metadata table (rtr_ctx.meta.profiles, written with
 * rtr_meta_write(RTR_META_KIND_PROFILE, ...)). auth.c (bearer tokens and roles checked before every
 * handler: --auth-file), iam.c (IAM policies, records of the metadata table) and audit.c (the
 * --audit-log writer thread): docs/security.md. */
#ifndef ROUTER_INTERNAL_H
#define ROUTER_INTERNAL_H

#include <protobuf-c/protobuf-c.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/auth.h"
#include "strata/btutil.h"
#include "strata/router.h"
#include "strata/rpc.h"
#include "strata/topology.h"

struct event;

/* ---- names and limits ---- */
#define RTR_META_TABLE "projects/_strata/instances/_strata/tables/metadata"
#define RTR_META_FAMILY "m"
#define RTR_META_QUALIFIER "v"
/* The row (this prefix and the cluster id) a router writes into a cluster's metadata copy it had
 * to create while another cluster's copy existed (the cluster's first node lost its data), and
 * deletes once it copied every record there: loads skip a copy holding the row naming its own
 * cluster. Named per cluster because the metadata table replicates: the other copies receive
 * the row too and must not take it for theirs (meta.c, docs/router.md). */
#define RTR_META_SEED_PREFIX "seed/pending/"
#define RTR_META_TABLE_PREFIX "table/"
#define RTR_META_PROFILE_PREFIX "profile/"
#define RTR_META_BACKUP_PREFIX "backup/"
#define RTR_META_OP_PREFIX "op/"
#define RTR_META_IAM_PREFIX "iam/" /* then the resource: instance or table full name */
#define RTR_META_REFRESH_MS_DEFAULT 1000
#define RTR_META_RECORDS_MAX 100000 /* tables + profiles in the instance */
/* One record's serialized bytes: every router reads every record of every cluster's copy every
 * meta_refresh_ms, so a record's size is paid by every router and metadata node each second.
 * Backup records list their pieces (a few hundred bytes each: tables of thousands of tablets
 * make records of megabytes), so they get a larger bound (rtr_meta_record_check). */
#define RTR_META_RECORD_BYTES_MAX ((size_t)1 << 20)
#define RTR_META_BACKUP_RECORD_BYTES_MAX ((size_t)16 << 20)
#define RTR_NODE_TIMEOUT_MS_DEFAULT 60000 /* unary calls without a client deadline */
#define RTR_ADMIN_TIMEOUT_MS 30000        /* internal admin calls */
#define RTR_START_TIMEOUT_MS 15000        /* rtr_open waits this long for the nodes */
#define RTR_RETRIES_MAX 6                 /* transparent retries of one request (part) */
#define RTR_RETRIES_NOT_OWNER_MAX 64      /* ... when a node said strata-not-owner */
#define RTR_RETRY_BACKOFF_MS 20           /* first retry delay, doubling */
#define RTR_RETRY_BACKOFF_MAX_MS 500      /* ... up to this: 6 tries ~1.1 s, 64 ~30 s */
#define RTR_BALANCE_MS_DEFAULT 2000       /* tablet balancer period */
#define RTR_MOVE_TIMEOUT_MS 600000        /* one MoveTablet call (copies a tablet) */
#define RTR_INTERNAL_TABLE_PREFIX "projects/_strata/" /* never balanced */
/* leftover.c: every node's tables are compared with the metadata this often; a table found
 * without a record is dropped once found so on consecutive rounds this far apart. */
#define RTR_LEFTOVER_MS 5000
#define RTR_LEFTOVER_APART_MS 3000
#define RTR_RECONNECT_BACKOFF_MIN_MS 50
#define RTR_RECONNECT_BACKOFF_MAX_MS 2000
#define RTR_NODE_KEEPALIVE_MS 250 /* PING period on node links with calls open (health.c) */
#define RTR_DRAIN_CHECK_MS 100    /* a node connection closing after GOAWAY: is it done? */
/* Long calls (change streams) per node: at most this many on one connection, below the node's
 * default SETTINGS_MAX_CONCURRENT_STREAMS (256), and at most this many such connections. */
#define RTR_LONG_CALLS_PER_CLIENT 192
#define RTR_LONG_CLIENTS_MAX 64
/* Change streams (changes.c; docs/changestreams.md, "Router memory"): the default of
 * --max-change-streams, the HTTP/2 stream window of the change stream links to the nodes (what a
 * node may still send on a paused stream; large enough that a group commit's burst of records
 * goes out without waiting for a WINDOW_UPDATE, docs/changestreams.md, "Syscalls and wake-ups
 * per change") and the largest spare buffer a stream keeps. */
#define RTR_CS_STREAMS_MAX_DEFAULT 1024
#define RTR_CS_STREAM_WINDOW_BYTES ((int32_t)128 << 10)
#define RTR_CS_SPARE_BYTES ((size_t)128 << 10)
/* ReadRows node calls paused for clients that stop reading hold a stream slot (and window) of
 * their node connection: at most RTR_READ_PAUSED_PER_NODE per node stay paused (a quarter of a
 * node's default 256 streams per connection); past it a read parks instead: its node call is
 * cancelled and issued again, after the last row relayed, once its client took what it was sent
 * (read.c). A park resets a stream, which nodes allow a peer a burst of 1000 of, then 33 a
 * second: parks take tokens of a bucket per node (RTR_READ_PARK_BURST, refilled at
 * RTR_READ_PARK_PER_S); with none left a read pauses past the share and tries again every
 * RTR_READ_REPARK_MS. */
#define RTR_READ_PAUSED_PER_NODE 64
#define RTR_READ_REPARK_MS 1000
#define RTR_READ_PARK_BURST 800
#define RTR_READ_PARK_PER_S 25
/* Over a node's Unix socket the node allows its owner's processes 1,000,000 resets, then
 * 100,000 a second (H2_UNIX_OWNER_RESET_BURST): a park there costs no waiting. */
#define RTR_READ_PARK_UNIX_BURST 500000
#define RTR_READ_PARK_UNIX_PER_S 50000
#define RTR_READ_BACKLOG_BYTES ((size_t)4 << 20) /* ReadRows bytes held when the client is slow */
#define RTR_TABLETS_MAX ((size_t)1 << 20)        /* tablets in one cluster's map */
#define RTR_WAITERS_MAX 65536                    /* requests parked on one map refresh */
#define RTR_SPLITS_MAX 1000                      /* CreateTable initial_splits */
#define RTR_TABLE_NAME_MAX 512
#define RTR_MUTATIONS_MAX 100000
#define RTR_FORWARD_HEADERS_MAX 4

typedef struct rtr_cluster rtr_cluster;
typedef struct rtr_node rtr_node;
typedef struct rtr_fan rtr_fan;

/* ---- the tablet map (tmap.c, pure) ---- */
typedef struct rtr_tablet {
    st_slice start, end; /* [start, end); empty end = unbounded; memory of the map's arena */
    uint64_t id;
    uint32_t node; /* index into the cluster's nodes */
    bool read_only;
    bool moving; /* being moved away: reads go here, writes wait for the move to end */
    bool stale;  /* kept from the previous map: its node did not answer the last refresh */
} rtr_tablet;

typedef struct rtr_tmap_table {
    const char *name;
    rtr_tablet *v; /* sorted by start, disjoint; gaps possible while tablets move */
    size_t n;
} rtr_tmap_table;

/* When a node's copy of a table was created (ListTablets' tables; the node's clock): a table
 * deleted and created again under its name has another, which is how a read that resumes tells
 * (read.c). */
typedef struct rtr_table_created {
    const char *table;
    uint32_t node; /* index into the cluster's nodes */
    int64_t us;
} rtr_table_created;

/* Immutable once built; a refresh builds a new one and frees the old. */
typedef struct rtr_tmap {
    st_arena arena;
    rtr_tmap_table *tables; /* sorted by name */
    size_t n_tables;
    rtr_table_created *created; /* sorted by table, then node */
    size_t n_created;
} rtr_tmap;

/* One tablet as a node reported it (input of rtr_tmap_build; memory borrowed). */
typedef struct rtr_tablet_in {
    const char *table;
    st_slice start, end;
    uint64_t id;
    uint32_t node;
    bool read_only;
    bool moving; /* the source of a move in progress (read_only is set too) */
    bool stale;  /* kept from the previous map (its node did not answer) */
} rtr_tablet_in;

/* Builds a map from reported tablets (any order). Where tablets overlap (a move in progress, a
 * stale report) the earlier-starting one wins and the other is dropped; between equal starts the
 * source of a move (`moving`: the only complete copy until the move ends), then a writable one,
 * then a read-only one.
 * NULL when memory runs out or there are more than RTR_TABLETS_MAX. Free with rtr_tmap_free. */
rtr_tmap *rtr_tmap_build(const rtr_tablet_in *in, size_t n);
void rtr_tmap_free(rtr_tmap *m); /* NULL is fine */
const rtr_tmap_table *rtr_tmap_find(const rtr_tmap *m, const char *table);
/* Sets m's creation times from v (names copied into m); false when memory runs out. */
bool rtr_tmap_set_created(rtr_tmap *m, const rtr_table_created *v, size_t n);
/* When node's copy of table was created, as the map was built; 0 when not known. */
int64_t rtr_tmap_created_us(const rtr_tmap *m, const char *table, uint32_t node);
/* Whether t's tablets hold every row: from the empty key to the unbounded end, without a gap. */
bool rtr_tmap_covers_all(const rtr_tmap_table *t);
/* Index of the tablet holding row, or SIZE_MAX (no tablet covers it). */
size_t rtr_tmap_row(const rtr_tmap_table *t, st_slice row);

/* The ReadRows walk. The position is a key: forward, the rows still to read are >= pos
 * (has_pos false: all); reversed, the rows still to read are < pos (has_pos false: all). The
 * next step is the tablet holding the first (forward) or last (reversed) row still wanted; *sub
 * receives the ranges of rs inside that tablet and the position (arena memory). Returns ST_OK,
 * ST_NOT_FOUND when nothing is left, ST_UNAVAILABLE when no tablet covers the next row (*gap
 * receives that key), ST_RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_read_step(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                      const rtr_tmap_table *t, st_arena *a, btu_rowset *sub, size_t *tablet,
                      st_slice *gap);
/* rtr_read_step in two halves: the tablet of the next step (same codes, no allocation), then the
 * ranges of rs inside tablet tb (ST_OK or ST_RESOURCE_EXHAUSTED). */
st_code rtr_read_locate(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                        const rtr_tmap_table *t, size_t *tablet, st_slice *gap);
st_code rtr_read_collect(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                         const rtr_tablet *tb, st_arena *a, btu_rowset *sub);
/* True when tablet tb holds every row rs can select (rs non-empty): a first step there may send
 * the client's request unchanged. */
bool rtr_read_covers(const btu_rowset *rs, const rtr_tablet *tb);
/* The position after a finished step on tablet tb: forward its end, reversed its start; false
 * when that bound is unbounded (the walk is over). */
bool rtr_read_next_pos(const rtr_tablet *tb, bool reversed, st_slice *pos);

/* ---- protobuf wire helpers (wire.c, pure) ---- */
typedef struct rtr_wire_field {
    uint32_t num;
    uint32_t wire_type; /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t varint;    /* wire type 0 */
    st_slice bytes;     /* wire type 2: the payload; others: the raw value bytes */
    st_slice raw;       /* the whole field: tag and value */
} rtr_wire_field;

/* One past the last byte of s: s.data for an empty slice, which may be NULL (an empty gRPC
 * message arrives as NULL, 0) where NULL + 0 would be undefined behaviour. */
static inline const uint8_t *rtr_slice_end(st_slice s) {
    return s.len ? s.data + s.len : s.data;
}
/* Whole gRPC messages a router call holds while its client is slow (read.c, changes.c), oldest
 * first: each prefixed with its varint length in buf, consumed from off. */
typedef struct rtr_msgq {
    st_buf buf;
    size_t off;
} rtr_msgq;
static inline size_t rtr_msgq_bytes(const rtr_msgq *q) {
    return q->buf.len - q->off;
}
/* Appends a copy of msg; RESOURCE_EXHAUSTED without memory. */
st_code rtr_msgq_push(rtr_msgq *q, st_slice msg);
/* Sends queued messages to call, oldest first, while it takes them: while it has room of its own
 * when counted (the messages are counted in the queued-response budget already, so moving them
 * takes nothing more from it), else while it is writable. The code of a failed send. */
st_code rtr_msgq_drain(rtr_msgq *q, rpc_call *call, bool counted);
/* Varints of one byte (tags, short lengths, booleans) dominate the messages the router scans on
 * every response (ReadRows chunks): decode those inline, the rest through base. */
static inline bool rtr_wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    const uint8_t *q = *p;
    if (q < end && q[0] < 0x80) {
        *v = q[0];
        *p = q + 1;
        return true;
    }
    if (end - q >= 2 && q[1] < 0x80) { /* two bytes: lengths up to 16 KiB (values, keys) */
        *v = (uint64_t)(q[0] & 0x7f) | (uint64_t)q[1] << 7;
        *p = q + 2;
        return true;
    }
    return st_get_varint64(p, end, v);
}

/* The hot loops (ReadRows rows, change stream messages): a lean field reader (no rtr_wire_field
 * to fill). 1: a field, 0: the end,
 * -1: malformed (the same rules as rtr_wire_next). *v holds a varint's value, *b a
 * length-delimited payload. */
static inline int rtr_wire_scan(const uint8_t **p, const uint8_t *end, uint32_t *num, uint32_t *wt,
                                uint64_t *v, st_slice *b) {
    uint64_t tag;
    if (*p >= end)
        return 0;
    if (!rtr_wire_varint(p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX)
        return -1;
    *num = (uint32_t)(tag >> 3);
    *wt = (uint32_t)(tag & 7);
    *v = 0;
    switch (*wt) {
    case 0:
        return rtr_wire_varint(p, end, v) ? 1 : -1;
    case 1:
    case 5: {
        size_t w = *wt == 1 ? 8 : 4;
        if ((size_t)(end - *p) < w)
            return -1;
        *p += w;
        return 1;
    }
    case 2: {
        uint64_t len;
        if (!rtr_wire_varint(p, end, &len) || len > (uint64_t)(end - *p))
            return -1;
        *b = st_slice_make(*p, (size_t)len);
        *p += len;
        return 1;
    }
    default:
        return -1;
    }
}

/* Reads the field at *p (advancing it); false at end or on malformed input (*p then == end). */
bool rtr_wire_next(const uint8_t **p, const uint8_t *end, rtr_wire_field *f, bool *bad);
/* Appends every field of msg except those numbered in skip[0..n_skip). INVALID_ARGUMENT for a
 * malformed message. */
st_code rtr_wire_copy_except(st_buf *out, st_slice msg, const uint32_t *skip, size_t n_skip);
st_code rtr_wire_put_bytes(st_buf *out, uint32_t num, st_slice v);
st_code rtr_wire_put_varint(st_buf *out, uint32_t num, uint64_t v);
/* Page tokens of the router's listings (pagetoken.c): prefix (at most 15 characters), a CRC32C
 * of the listing's query, the hex of last (where the page ended); arena memory, NULL when memory
 * runs out. */
char *rtr_page_token_make(st_arena *a, const char *prefix, uint32_t crc, st_slice last);
typedef enum {
    RTR_TOKEN_OK,
    RTR_TOKEN_BAD,   /* not a token of this listing kind */
    RTR_TOKEN_OTHER, /* a token of the same kind, for another query */
    RTR_TOKEN_NOMEM,
} rtr_token_rc;
/* Where the previous page ended into *last (arena memory, followed by a 0 byte). */
rtr_token_rc rtr_page_token_parse(st_arena *a, const char *tok, const char *prefix, uint32_t crc,
                                  st_slice *last);
/* A listing's page start for a name-ordered listing: *after is left alone for an empty token
 * (the first page), else set to the name the previous page ended with; INVALID_ARGUMENT for a
 * token not of this prefix and query (crc). */
st_code rtr_page_token_after(st_arena *a, const char *tok, const char *prefix, uint32_t crc,
                             const char **after, st_err *err);
/* Appends a RowSet as field `num` (ranges as start_key_closed / end_key_open). */
st_code rtr_wire_put_rowset(st_buf *out, uint32_t num, const btu_rowset *rs);

/* MutateRows request entries: each entry's raw bytes (the Entry payload) and its row key, and
 * what makes it invalid whatever the table (arena text; NULL: nothing seen, the node checks the
 * rest): an empty or oversized row key, no mutation, a SetCell timestamp that is negative (but
 * -1) or not whole milliseconds. Such an entry is answered INVALID_ARGUMENT by the router itself,
 * so it stays so while its node is down, rather than UNAVAILABLE, which clients retry. */
typedef struct rtr_entry {
    st_slice raw;
    st_slice row;
    const char *invalid;
} rtr_entry;
/* What makes the mutations (field `field` of msg: MutateRowRequest 3, MutateRowsRequest.Entry 2)
 * invalid whatever the table, as text in a: none at all, or a SetCell timestamp that is negative
 * (but -1) or not whole milliseconds. NULL when nothing is seen (the node checks the rest). */
const char *rtr_mutations_invalid(st_slice msg, uint32_t field, st_arena *a);
/* Splits a MutateRowsRequest: entries in order (arena) and every other field (head, appended to
 * out_head). INVALID_ARGUMENT for a malformed request. */
st_code rtr_mutate_rows_split(st_slice req, st_arena *a, st_buf *out_head, rtr_entry **entries,
                              size_t *n);
/* A sub-request: the head, then entries[idx[i]] for i < n. */
st_code rtr_mutate_rows_build(st_buf *out, st_slice head, const rtr_entry *entries,
                              const size_t *idx, size_t n);

/* Result of one caller's entry. */
typedef struct rtr_entry_result {
    st_code code;
    const char *message; /* arena memory or static */
    bool final;
} rtr_entry_result;
/* Applies one MutateRowsResponse of a sub-request whose entry i is the caller's entry idx[i]:
 * marks those results. Returns INTERNAL for a malformed response or an index out of range. */
st_code rtr_mutate_rows_merge(st_slice resp, const size_t *idx, size_t n, rtr_entry_result *res,
                              st_arena *a);

/* ReadRows response scanning: tracks committed rows so a resumed read starts after the last row
 * delivered and rows_limit holds across tablets. */
typedef struct rtr_rr_track {
    st_buf row;    /* key of the row being received (or last committed) */
    bool row_open; /* chunks of an uncommitted row were seen */
    st_buf last;   /* last committed row key (or last_scanned_row_key, whichever is later) */
    bool has_last;
    uint64_t committed; /* rows committed in total */
} rtr_rr_track;
void rtr_rr_track_init(rtr_rr_track *t);
void rtr_rr_track_deinit(rtr_rr_track *t);
/* Scans one ReadRowsResponse. INTERNAL for a malformed one. */
st_code rtr_rr_track_feed(rtr_rr_track *t, st_slice msg, bool reversed);

/* SampleRowKeys merging. Each node's samples (key, cumulative offset) in its order; the merge
 * turns them into deltas, sorts all by key (the empty key last), sums, and accumulates, so the
 * whole table's samples come out in key order with non-decreasing offsets and one final empty
 * key holding the total. end_keys[i] is the end of node i's last tablet (empty = unbounded): a
 * node's own final empty-key sample is placed there. */
typedef struct rtr_sample {
    st_slice key;
    int64_t offset;
} rtr_sample;
st_code rtr_samples_merge(rtr_sample *const *per_node, const size_t *counts,
                          const st_slice *end_keys, size_t n_nodes, st_arena *a, rtr_sample **out,
                          size_t *n_out);

/* ---- request peeking (peek.c, pure) ---- */
/* The routing fields of a ReadRowsRequest, as slices into the request. */
typedef struct rtr_rr_peek {
    st_slice table, profile;
    st_slice rows; /* the RowSet's bytes (has_rows) */
    bool has_rows;
    int64_t rows_limit;
    bool reversed;
} rtr_rr_peek;
/* false when the request is malformed or not plainly encoded (a singular field repeated or with
 * another wire type): unpack it with protobuf-c instead. */
bool rtr_peek_read_rows(st_slice req, rtr_rr_peek *out);

/* The routing fields of a MutateRowRequest. idempotent: no SetCell with timestamp -1. */
typedef struct rtr_mr_peek {
    st_slice table, profile, row;
    size_t n_mutations;
    bool idempotent;
} rtr_mr_peek;
bool rtr_peek_mutate_row(st_slice req, rtr_mr_peek *out);
/* The routing fields of a MutateRowsRequest: counts over all entries, the first entry's row. */
typedef struct rtr_mrs_peek {
    st_slice table, profile, first_row;
    size_t n_entries, n_mutations;
    bool idempotent;
} rtr_mrs_peek;
bool rtr_peek_mutate_rows(st_slice req, rtr_mrs_peek *out);
/* s as a NUL-terminated string in a; NULL when memory runs out. */
char *rtr_peek_str(st_arena *a, st_slice s);

/* ---- metadata records (meta.c) ---- */
typedef struct rtr_meta_rec {
    char *name;  /* full table name, app profile id, full backup name or operation name */
    uint8_t *pb; /* serialized google.bigtable.admin.v2.Table / AppProfile */
    size_t len;
    int64_t ts_us; /* the cell's timestamp as loaded (0: written by this router, not loaded) */
} rtr_meta_rec;

typedef struct rtr_meta {
    rtr_meta_rec *tables; /* sorted by name */
    size_t n_tables;
    rtr_meta_rec *profiles; /* sorted by id; opaque to this module */
    size_t n_profiles;
    rtr_meta_rec *backups; /* by full backup name: strata.internal.v1.BackupRecord (backup.h) */
    size_t n_backups;
    rtr_meta_rec *ops; /* by operation name: strata.internal.v1.OperationRecord (backup.h) */
    size_t n_ops;
    rtr_meta_rec *iams; /* IAM policies (auth.c) by resource name; google.iam.v1.Policy */
    size_t n_iams;
    const char *seed_key; /* set by the loader: this copy's own RTR_META_SEED_PREFIX row */
    bool seed_pending;    /* the copy read holds seed_key: not to be served from */
} rtr_meta;

typedef enum rtr_meta_kind {
    RTR_META_KIND_TABLE,
    RTR_META_KIND_PROFILE,
    RTR_META_KIND_BACKUP,
    RTR_META_KIND_OP,
    RTR_META_KIND_IAM,
} rtr_meta_kind;
#define RTR_META_KINDS 5

void rtr_meta_free(rtr_meta *m);
const rtr_meta_rec *rtr_meta_find(const rtr_meta *m, rtr_meta_kind kind, const char *name);
/* Inserts or replaces (copies name and bytes). RESOURCE_EXHAUSTED when memory runs out or the
 * instance holds RTR_META_RECORDS_MAX records. */
st_code rtr_meta_put(rtr_meta *m, rtr_meta_kind kind, const char *name, st_slice pb);
void rtr_meta_del(rtr_meta *m, rtr_meta_kind kind, const char *name);
/* Replaces each record of base by other's version of it when other's cell is newer (ts_us):
 * a cluster that missed a write while it was down still holds the old version until
 * replication brings it the new one, and must not win over the copies that took the write.
 * Records base lacks are not added (base may have seen their deletion). */
st_code rtr_meta_merge_newer(rtr_meta *base, const rtr_meta *other);
/* The metadata row key of a record ("table/<name>", "profile/<id>"). */
st_code rtr_meta_row_key(rtr_meta_kind kind, const char *name, st_buf *out);
/* Parses a row key; false for keys that are not records (ignored, for forward compatibility). */
bool rtr_meta_parse_row_key(st_slice key, rtr_meta_kind *kind, char *name, size_t name_cap);
/* Feeds one ReadRowsResponse of a metadata read (one cell per row, whole rows per message) into
 * m. INTERNAL for a malformed response. */
st_code rtr_meta_feed(rtr_meta *m, st_slice msg);

/* ---- nodes, clusters, context ---- */
struct rtr_node {
    rtr_ctx *ctx;
    rtr_cluster *cluster;
    uint32_t idx; /* in the cluster */
    uint32_t num; /* instance-wide node number (topology) */
    char addr[ST_TOPO_ADDR_MAX + 1];
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    rpc_client *client;
    uint64_t conn_id;    /* this node's connections dialled so far: names the current one */
    int64_t retry_at_us; /* no new connection before this (st_mono_us) */
    int64_t backoff_ms;
    /* conn.c: st_mono_us when a connection to the node failed silent (no answer to a keepalive
     * PING) with nothing heard from the node since; 0 otherwise. Calls are refused meanwhile. */
    int64_t mute_since_us;
    /* conn.c: the client goes through the node's Unix socket; unix_skip: the last such client
     * never connected (a stale socket file), so the next one tries TCP first */
    bool via_unix, unix_skip;
    /* conn.c: clients for calls that last as long as their client reads (change streams), so
     * they never take the stream slots of the regular client (rtr_node_call_long) */
    rpc_client *long_clients[RTR_LONG_CLIENTS_MAX];
    size_t n_long;
    /* conn.c: the client for scans (rtr_node_call_scan), and its connections dialled so far */
    rpc_client *scan_client;
    uint64_t scan_conn_id;
    /* read.c: ReadRows node calls paused now, and the park bucket (RTR_READ_PAUSED_PER_NODE) */
    uint32_t reads_paused;
    double park_tokens;
    int64_t park_at_us; /* st_mono_us() of the bucket's last refill; 0 = never used (full) */
};

/* The balancer's state in one cluster (balance.c). While `moving`, the target's copy of the
 * range is second choice in the tablet map (conn.c), so requests keep going to the source even
 * if a refresh saw the source before it marked the tablet moving. */
typedef struct rtr_bal_cluster {
    bool busy;               /* a look (ListTablets) or a move is under way */
    bool moving;             /* a MoveTablet is in flight */
    uint32_t source, target; /* node indexes */
    uint64_t id;
    char table[RTR_TABLE_NAME_MAX + 1];
    st_buf start; /* the moving tablet's start key */
    uint64_t bytes;
    int64_t started_us;
} rtr_bal_cluster;

/* A multi-cluster request part in flight in a cluster, another cluster remaining (failover.h):
 * when the cluster turns unhealthy, move(f) sends it on at once instead of waiting for its node
 * to answer or time out. */
typedef struct rtr_inflight rtr_inflight;
struct rtr_inflight {
    rtr_inflight *prev, *next;
    rtr_cluster *on; /* NULL while not linked */
    void (*move)(rtr_inflight *f);
};

typedef struct rtr_waiter {
    void (*fn)(void *arg);
    void *arg;
} rtr_waiter;

struct rtr_cluster {
    rtr_ctx *ctx;
    const st_topo_cluster *topo;
    size_t idx;
    rtr_node nodes[ST_TOPO_NODES_MAX];
    size_t n_nodes;
    rtr_tmap *map;    /* never NULL after open */
    uint64_t map_gen; /* bumped by every refresh */
    rtr_fan *refreshing;
    /* callers of rtr_cluster_refresh; the first n_served asked before the refresh in flight
     * sent its ListTablets, the others wait for the next one */
    rtr_waiter *waiters;
    size_t n_waiters, cap_waiters, n_served;
    uint32_t rr_next;       /* round robin for new tablets */
    rtr_inflight *inflight; /* multi-cluster parts in flight here (health.c moves them) */
    rtr_bal_cluster bal;    /* balance.c */
    /* meta.c: while metadata reads from this cluster fail, when the last warning went out
     * (monotonic; 0 = reads work) and how many failures were not logged since */
    int64_t meta_fail_log_us;
    uint64_t meta_fail_skipped;
};

typedef struct rtr_later rtr_later;

struct rtr_ctx {
    rtr_opts opts;
    uint32_t cs_streams;  /* ReadChangeStream calls relayed now (changes.c) */
    size_t cs_kept_bytes; /* their requests' bytes, kept for their lives (changes.c) */
    st_topology topo;
    struct event_base *base;
    rpc_server *rpc;
    char listen_host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    rtr_cluster clusters[ST_TOPO_CLUSTERS_MAX];
    size_t n_clusters;
    rtr_meta meta;
    uint64_t meta_gen; /* bumped by every local metadata write */
    bool meta_loading;
    bool meta_loaded;
    struct event *meta_timer;
    rtr_later *later;       /* pending delayed callbacks */
    rpc_client **graveyard; /* dead clients, freed from the loop */
    size_t n_graveyard, cap_graveyard;
    struct event *graveyard_ev;
    bool closing;
    bool balancing;     /* this router runs the tablet balancer (balance.c) */
    int64_t balance_ms; /* its period */
    struct event *bal_timer;
    uint64_t bal_moves, bal_failed; /* counters for logs */
    struct rtr_inst *inst;          /* instance admin, app profiles, operations (instance.h) */
    struct rtr_fo *fo;              /* cluster health and failover state (health.c, failover.h) */
    struct rtr_bk *bk;              /* backups and their operations (backup.h) */
    struct rtr_auth *auth;          /* tokens, roles, audit log (auth.c) */
    struct rtr_gate *gates;         /* tables with a schema change running (admin_gate.c) */
    struct rtr_leftover *leftover;  /* tables deleted while a node was down (leftover.c) */
};

/* ---- conn.c ---- */
/* Starts a call on a node (reconnecting first when its client died and the backoff allows).
 * NULL when the call could not start (err says why; UNAVAILABLE) — on_done then never runs. */
rpc_ccall *rtr_node_call(rtr_node *node, const char *path, st_slice req, const rpc_metadata *md,
                         size_t md_count, int64_t timeout_ms, rpc_ccall_msg_fn on_msg,
                         rpc_ccall_done_fn on_done, void *arg, st_err *err);
/* rtr_node_call for a call that lasts as long as its client reads (ReadChangeStream): it goes
 * over a connection of its own kind, so that hundreds of them never hold the stream slots that
 * the node's other calls need. RESOURCE_EXHAUSTED when RTR_LONG_CLIENTS_MAX connections of
 * RTR_LONG_CALLS_PER_CLIENT calls are in use. */
rpc_ccall *rtr_node_call_long(rtr_node *node, const char *path, st_slice req,
                              const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                              rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg,
                              st_err *err);
/* rtr_node_call for a ReadRows that is not a point read (btu_rowset_is_point): it goes over the
 * node's scan connection, so that scans waiting for one of its stream slots (2,000 scans of
 * clients that never read, parked and issued again in turn) never queue ahead of the node's
 * other calls, which the regular connection carries. *conn_id is set to the id of the
 * connection the call went on (for rtr_qod_drop_id). */
rpc_ccall *rtr_node_call_scan(rtr_node *node, const char *path, st_slice req,
                              const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                              rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg,
                              uint64_t *conn_id, st_err *err);
/* For a call lost with the node's scan connection: the calls lost with, or still out on, the
 * node's regular connection, which the same crash takes (or took) too. A scan alone on the
 * scan connection is then not "alone in the drop" when the node died under other calls
 * (rtr_qod_dropped). */
size_t rtr_node_lost_beside(const rtr_node *node);
/* How a node call that ended UNAVAILABLE relates to its node (only inside its on_done):
 * RTR_CALL_SENT: the request may have reached the node (a lost connection, a status);
 * RTR_CALL_REFUSED: the node took the connection but refused the call unprocessed (its GOAWAY):
 *   the node is up, and the request may go again anywhere;
 * RTR_CALL_UNREACHED: the connection never came up (connect refused or timed out): nothing was
 *   sent, so the request may go again anywhere, but the node is unreachable. */
typedef enum rtr_call_fate { RTR_CALL_SENT, RTR_CALL_REFUSED, RTR_CALL_UNREACHED } rtr_call_fate;
rtr_call_fate rtr_call_fate_of(const rpc_ccall *call, st_code code);
void rtr_node_disconnect_all(rtr_ctx *r);
/* The k-th node of the instance, counting every cluster's nodes in topology order (fan-outs to
 * every node); NULL past the last. */
rtr_node *rtr_node_at(rtr_ctx *r, size_t k);

/* Fan-out of calls in parallel; done runs once every call ended (from the loop, or from
 * rtr_fan_seal when every call failed to start). The done callback frees with rtr_fan_free. */
typedef struct rtr_fan_res {
    rtr_node *node;
    st_code code;
    bool unsent; /* failed without reaching the node (connect failed, refused by its GOAWAY) */
    st_err err;  /* message of a failed call */
    st_buf msgs; /* response messages, each prefixed with its varint length */
} rtr_fan_res;
typedef void (*rtr_fan_done_fn)(rtr_fan *f, void *arg);
struct rtr_fan {
    rtr_ctx *ctx;
    size_t n, pending;
    bool sealed;
    int64_t timeout_ms;
    rtr_fan_res *res;
    rtr_fan_done_fn done;
    void *arg;
};
rtr_fan *rtr_fan_new(rtr_ctx *r, size_t n, int64_t timeout_ms, rtr_fan_done_fn done, void *arg);
void rtr_fan_call(rtr_fan *f, size_t i, rtr_node *node, const char *path, st_slice req);
/* No more calls: done runs when they have ended (possibly right now). Last thing the caller does.
 */
void rtr_fan_seal(rtr_fan *f);
void rtr_fan_free(rtr_fan *f);
/* Iterates a result's response messages: start with *off = 0. */
bool rtr_fan_next_msg(const rtr_fan_res *res, size_t *off, st_slice *msg);
/* Code of the first failed call (ST_OK if none); err receives its message. */
st_code rtr_fan_first_error(const rtr_fan *f, st_err *err);

/* Runs fn(arg) after delay_ms from the loop (at close: at once, with r->closing set). */
st_code rtr_later_add(rtr_ctx *r, int64_t delay_ms, void (*fn)(void *arg), void *arg);
void rtr_later_flush(rtr_ctx *r);

/* Refreshes a cluster's tablet map (ListTablets on every node); fn(arg) runs once the refresh that
 * covers this request finished (coalesced with one in flight). RESOURCE_EXHAUSTED when too many
 * requests wait (fn not run). */
st_code rtr_cluster_refresh(rtr_cluster *c, void (*fn)(void *arg), void *arg);
/* Refreshes every cluster; fn runs when all have finished. */
st_code rtr_refresh_all(rtr_ctx *r, void (*fn)(void *arg), void *arg);

/* ---- profiles.c: routing ---- */
/* The cluster that serves a request of app_profile_id ("" = default): the first cluster of its
 * plan (failover.h, rtr_route_plan, for data requests that may move between clusters). NOT_FOUND
 * for an unknown profile; FAILED_PRECONDITION when transactional is set and the profile forbids
 * single-row transactions. */
st_code rtr_profile_route(rtr_ctx *r, const char *app_profile_id, bool transactional,
                          rtr_cluster **out, st_err *err);

/* ---- router.c: helpers for handlers ---- */
/* A request's message, unpacked into the call's arena (strings must be UTF-8:
 * btu_pb_unpack_request); NULL after failing the call INVALID_ARGUMENT saying why. */
ProtobufCMessage *rtr_unpack(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                             st_slice bytes);
/* A message without failing the call (and without the UTF-8 check: stored records too): NULL
 * for a malformed message (or out of memory). */
ProtobufCMessage *rtr_unpack_try(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                                 st_slice bytes);
void rtr_reply(rpc_call *call, const ProtobufCMessage *msg);
void rtr_fail(rpc_call *call, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Table name check (btu_table_name_parse): projects/P/instances/I/tables/T with a valid table id
 * (INVALID_ARGUMENT), and, with r, P/I the instance this router serves (NOT_FOUND otherwise, as
 * Cloud Bigtable answers for an instance that does not exist). */
st_code rtr_check_table_name(const rtr_ctx *r, const char *name, st_err *err);
/* The table's metadata record, or NULL after failing the call (NOT_FOUND "table ... not found",
 * INVALID_ARGUMENT for a malformed name). */
const rtr_meta_rec *rtr_table_or_fail(rtr_ctx *r, rpc_call *call, const char *name);
/* Timeout for a node call made on behalf of call: the client's remaining deadline, else dflt.
 * false when the deadline has passed. */
bool rtr_call_timeout(const rpc_call *call, int64_t dflt_ms, int64_t *timeout_ms);
/* Headers passed through to nodes (bigtable-features, x-goog-request-params). */
size_t rtr_forward_headers(const rpc_call *call, rpc_metadata *md);
/* True for answers after which a request may be retried transparently: a node that no longer
 * owns the rows; UNAVAILABLE too when `unavailable_ok` (idempotent requests). */
bool rtr_retryable(st_code code, const char *message, bool unavailable_ok);
/* Backoff before retry number attempt (1-based): 20 ms doubling, at most 500 ms. Every retry
 * asks for one, so it also counts them in rtr_retries_total (process-wide, for metrics.c). */
int64_t rtr_backoff_ms(int attempt);
extern uint64_t rtr_retries_total;
/* True while another retry is allowed after `attempts` retries that ended with (code, message):
 * RTR_RETRIES_NOT_OWNER_MAX for strata-not-owner (a tablet moving: writes wait until the move
 * ends, seconds for a large tablet), RTR_RETRIES_MAX otherwise. The client's deadline still
 * ends the wait earlier. */
bool rtr_retry_allowed(int attempts, st_code code, const char *message);

/* ---- admin.c: change stream configuration (docs/changestreams.md) ---- */
#define RTR_CS_RETENTION_MIN_S BTU_CS_RETENTION_MIN_S /* change_stream_config.retention_period */
#define RTR_CS_RETENTION_MAX_S BTU_CS_RETENTION_MAX_S /* ... 1 to 7 days, as Cloud Bigtable */
/* A config without retention_period means change streams off: *cfg becomes NULL. A retention
 * outside [1 day, 7 days] is INVALID_ARGUMENT. */
st_code rtr_cs_config_check(Google__Bigtable__Admin__V2__ChangeStreamConfig **cfg, st_err *err);
/* The stored table has change streams on. */
bool rtr_cs_enabled(const Google__Bigtable__Admin__V2__Table *t);

/* ---- balance.c ---- */
/* One tablet as the balancer sees it (memory borrowed). */
typedef struct rtr_bal_tablet {
    const char *table;
    uint64_t id;
    uint64_t bytes;
    uint32_t node; /* index in the cluster */
    bool read_only;
    bool moving;
} rtr_bal_tablet;
/* The balancer's choice in one cluster (pure): SIZE_MAX when nothing should move — a tablet is
 * moving, or the fullest node holds fewer than two tablets more than the emptiest. Else the
 * index in v of the tablet to move, from the fullest node (lowest index on ties) to *dst, the
 * emptiest (lowest index on ties): the table spread worst between the two, its smallest
 * writable tablet, the highest id on ties. */
size_t rtr_bal_choose(const rtr_bal_tablet *v, size_t n, size_t n_nodes, uint32_t *dst);
/* Starts the tablet balancer when this router is the one that balances (rtr_opts.balance; by
 * default the first router of the topology). */
st_code rtr_balance_start(rtr_ctx *r, st_err *err);
void rtr_balance_stop(rtr_ctx *r);

/* ---- meta.c: load and store ---- */
/* Makes sure every reachable cluster has the metadata table (PutTable + CreateTablet), then
 * loads the metadata; done(arg, code) runs when finished. */
void rtr_meta_bootstrap(rtr_ctx *r, void (*done)(void *arg, st_code code), void *arg);
/* Starts the periodic reload. */
st_code rtr_meta_start_timer(rtr_ctx *r, st_err *err);

/* ---- leftover.c ---- */
typedef struct rtr_leftover rtr_leftover;
/* Tables a node holds that the metadata no longer has (a DeleteTable while the node was down)
 * are dropped on it: a round every RTR_LEFTOVER_MS, and one at rtr_leftover_kick (a node is up
 * again). Stop ends the rounds (at close); free after the node clients are gone. */
st_code rtr_leftover_start(rtr_ctx *r, st_err *err);
void rtr_leftover_kick(rtr_ctx *r);
void rtr_leftover_stop(rtr_ctx *r);
void rtr_leftover_free(rtr_ctx *r);
/* INVALID_ARGUMENT, with what to do in err, when a record (kind, name) of len serialized bytes is
 * larger than its kind may be (RTR_META_RECORD_BYTES_MAX; backups
 * RTR_META_BACKUP_RECORD_BYTES_MAX); ST_OK otherwise. Every write below checks it. */
st_code rtr_meta_record_check(rtr_meta_kind kind, const char *name, size_t len, st_err *err);
/* Writes (pb non-NULL) or deletes (pb NULL) one record in every cluster's metadata table and the
 * cache; done(arg, code, message) runs when every cluster answered (OK when at least the first
 * reachable cluster took it; see docs/router.md), or at once when the record is refused
 * (rtr_meta_record_check) or memory runs out. */
typedef void (*rtr_meta_done_fn)(void *arg, st_code code, const char *message);
void rtr_meta_write(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                    rtr_meta_done_fn done, void *arg);
/* matched: the CheckAndMutateRow's predicate_matched (when code is ST_OK). */
typedef void (*rtr_meta_cas_fn)(void *arg, st_code code, const char *message, bool matched);
/* A CheckAndMutateRow on row key of the first cluster's metadata table, the compare-and-set that
 * new backup ids, restore claims and IAM policies go through: the predicate is the row's latest
 * m:v cell, and only when it equals *expect if given; the mutation (SetCell pb, or DeleteFromRow
 * when pb is NULL) runs when the predicate matched if expect is given, when it did not (no
 * record) otherwise. The node runs it under the row's lock, so of two routers comparing against
 * the same state exactly one mutates. ST_OK: sent, done follows (or ran already, with
 * INVALID_ARGUMENT, for a pb that rtr_meta_record_check refuses). Otherwise done is not called:
 * UNAVAILABLE when no tablet of the metadata table is known in the first cluster,
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_meta_cas(rtr_ctx *r, st_slice key, const st_slice *expect, const st_slice *pb,
                     rtr_meta_cas_fn done, void *arg);
/* rtr_meta_cas of record (kind, name) setting pb, expecting what this router's copy holds (no
 * record when it holds none); *had: whether it held one, so the record was as read (and pb
 * stored) when done's matched == *had. It runs in the first healthy cluster (topology order),
 * not always the first: app profiles and IAM policies stay changeable while the first cluster
 * is lost (docs/router.md, App profiles). */
st_code rtr_meta_cas_cached(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                            rtr_meta_cas_fn done, void *arg, bool *had);
/* Reads row key of the first cluster's metadata table there, not from this router's copy (which
 * another router's write of a moment ago may not have reached): found and the row's latest m:v
 * value. Returns as rtr_meta_cas. */
typedef void (*rtr_meta_get_fn)(void *arg, st_code code, const char *message, bool found,
                                st_slice value);
st_code rtr_meta_get(rtr_ctx *r, st_slice key, rtr_meta_get_fn done, void *arg);
/* rtr_meta_get in the copy of cluster number cluster. */
st_code rtr_meta_get_in(rtr_ctx *r, size_t cluster, st_slice key, rtr_meta_get_fn done, void *arg);

/* ---- handlers ---- */
void rtr_h_read_rows(rpc_call *call, st_slice req, void *arg);
void rtr_h_sample_row_keys(rpc_call *call, st_slice req, void *arg);
void rtr_h_mutate_row(rpc_call *call, st_slice req, void *arg);
void rtr_h_mutate_rows(rpc_call *call, st_slice req, void *arg);
void rtr_h_check_and_mutate_row(rpc_call *call, st_slice req, void *arg);
void rtr_h_read_modify_write_row(rpc_call *call, st_slice req, void *arg);
void rtr_h_ping_and_warm(rpc_call *call, st_slice req, void *arg);

void rtr_h_create_table(rpc_call *call, st_slice req, void *arg);
void rtr_h_get_table(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_tables(rpc_call *call, st_slice req, void *arg);
void rtr_h_delete_table(rpc_call *call, st_slice req, void *arg);
void rtr_h_modify_column_families(rpc_call *call, st_slice req, void *arg);
void rtr_h_drop_row_range(rpc_call *call, st_slice req, void *arg);
void rtr_h_generate_consistency_token(rpc_call *call, st_slice req, void *arg);
void rtr_h_check_consistency(rpc_call *call, st_slice req, void *arg);
void rtr_h_update_table(rpc_call *call, st_slice req, void *arg);

/* ---- admin_gate.c: one schema change of a table (or change of an app profile) at a time ---- */

typedef struct rtr_gate rtr_gate;
typedef void (*rtr_gate_fn)(rpc_call *call, st_slice req, void *arg);
/* Whether call may change table (a full table or app profile name) now (it then owns the table's
 * gate until rtr_gate_leave). Else the call waits (fn(call, req, r) runs again when its turn comes)
 * or was answered (UNAVAILABLE: too many waiting; out of memory). */
bool rtr_gate_enter(rtr_ctx *r, const char *table, rpc_call *call, st_slice req, rtr_gate_fn fn);
/* Takes name's gate for owner (not a call: work of the router's own, e.g. the backup sweep)
 * only when nobody holds it; false, with nothing queued, when it is taken (or out of memory).
 * Calls arriving meanwhile wait as for a call; rtr_gate_leave(r, owner) gives it up. */
bool rtr_gate_take(rtr_ctx *r, const char *name, const void *owner);
/* owner answered its call (it may be freed): the next waiting call's turn at its gate, if it
 * held one. */
void rtr_gate_leave(rtr_ctx *r, const void *owner);
/* At close: waiting calls are answered UNAVAILABLE, gates freed. */
void rtr_gates_close(rtr_ctx *r);
/* changes.c: change streams (docs/changestreams.md, "The router") */
void rtr_h_generate_partitions(rpc_call *call, st_slice req, void *arg);
void rtr_h_read_change_stream(rpc_call *call, st_slice req, void *arg);

/* ---- auth.c, iam.c, audit.c: who may call what (docs/security.md) ---- */
#define RTR_AUTH_PATH_MAX 4096
#define RTR_AUTH_CHECK_MS 1000 /* the auth file is checked for changes this often */
#define RTR_AUDIT_PATH_MAX 4096
#define RTR_AUDIT_BYTES_MAX_DEFAULT ((uint64_t)100 << 20) /* rotate the audit log past this */
#define RTR_AUDIT_QUEUE_BYTES_MAX ((size_t)8 << 20)       /* lines waiting for the writer thread */
/* Failed authentications (no principal to hold to account) written per second; the rest are
 * counted and the count goes into the next line written, so a tokenless flood cannot rotate
 * the admin lines out of the log within minutes. */
#define RTR_AUDIT_UNAUTH_PER_SEC 20
typedef struct rtr_auth rtr_auth;
/* Loads --auth-file (a bad file stops startup), opens --audit-log, installs the RPC gate when
 * either is set, and registers the IAM methods (iam.c). */
st_code rtr_auth_open(rtr_ctx *r, st_err *err);
void rtr_auth_close(rtr_ctx *r);
/* True when the router checks tokens (--auth-file). */
bool rtr_auth_on(const rtr_ctx *r);
/* "projects/P/instances/I". */
const char *rtr_auth_instance(const rtr_ctx *r);
/* The principal whose bearer token call carries, or NULL (no auth, no or unknown token); valid
 * until the loop runs again (a reload frees it). */
const char *rtr_auth_principal(rtr_ctx *r, rpc_call *call);
/* The highest role of principal on the instance, or on table (a full name; NULL: instance):
 * the auth file's grants, the instance's IAM policy and the table's. */
st_role rtr_auth_role(rtr_ctx *r, const char *principal, const char *table);
/* iam.c: the role a serialized google.iam.v1.Policy gives principal (members user:NAME or
 * serviceAccount:NAME); the IAM methods; dropping a deleted table's policy. */
st_role rtr_iam_role(st_slice policy, const char *principal);
st_code rtr_iam_register(rtr_ctx *r, st_err *err);
void rtr_iam_forget(rtr_ctx *r, const char *table);

/* One audit line (audit.c); NULL fields are left out. */
typedef struct rtr_audit_rec {
    const char *principal, *peer, *method, *resource, *permission;
    const char *outcome; /* "allowed" | "denied" */
    st_code code;        /* what the check answered */
    const char *message;
} rtr_audit_rec;
typedef struct rtr_audit rtr_audit;
/* A per-second cap on lines of one kind (RTR_AUDIT_UNAUTH_PER_SEC); zero-initialised. */
typedef struct rtr_audit_limit {
    int64_t sec;         /* the second `lines` counts in (monotonic) */
    unsigned lines;      /* lines let through in it */
    uint64_t suppressed; /* refused since the last line let through */
} rtr_audit_limit;
/* Whether one more line may be written at now_us; when true, *suppressed is how many were
 * refused before it (and the count restarts). */
bool rtr_audit_limit_take(rtr_audit_limit *l, int64_t now_us, uint64_t *suppressed);
/* Opens (appends to) path, mode 0600, and starts the writer thread. NULL with err when path
 * cannot be opened. bytes_max 0: RTR_AUDIT_BYTES_MAX_DEFAULT. */
rtr_audit *rtr_audit_open(const char *path, uint64_t bytes_max, st_err *err);
/* Writes what is queued, stops the thread, frees. NULL is fine. */
void rtr_audit_close(rtr_audit *a);
/* Queues one line (never blocks on the disk; drops the line when RTR_AUDIT_QUEUE_BYTES_MAX
 * bytes wait). Any thread. */
void rtr_audit_write(rtr_audit *a, const rtr_audit_rec *rec);
/* The JSON line of rec at wall_us (pure), appended to out. */
st_code rtr_audit_format(const rtr_audit_rec *rec, int64_t wall_us, st_buf *out);

/* ---- paths ---- */
#define RTR_BT "/google.bigtable.v2.Bigtable/"
#define RTR_TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define RTR_NODE "/strata.internal.v1.Node/"

#endif
