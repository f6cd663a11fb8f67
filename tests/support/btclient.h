/* btclient.h — a small blocking Cloud Bigtable client for Strata's integration tests.
 *
 * It speaks the real gRPC API (through strata_rpc's blocking helpers and the protobuf-c code of
 * strata_pb), so the same calls drive strata-node and the official emulator. ReadRows answers are
 * reassembled from CellChunks by a reader that enforces the chunk rules the Go client's
 * chunkReader enforces, and rows can be dumped as canonical text so two servers' answers compare
 * with one strcmp. It also starts and stops server processes (strata-node, cbtemulator) on free
 * loopback ports.
 *
 * Every call is blocking and returns the call's gRPC status (transport failures are UNAVAILABLE);
 * the optional st_err receives code and message. Not thread-safe per client; test code only. */
#ifndef STRATA_TEST_BTCLIENT_H
#define STRATA_TEST_BTCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/base.h"

#define BT_ADDR_MAX 128
#define BT_NAME_MAX 512
#define BT_PATH_MAX 1024
#define BT_ARGV_MAX 32
#define BT_TIMEOUT_MS_DEFAULT 120000
#define BT_START_WAIT_MS_MAX                                                                       \
    60000 /* hang guard while a spawned server starts, not a timing test                           \
           */

typedef Google__Bigtable__V2__RowFilter bt_filter;
typedef Google__Bigtable__V2__Mutation bt_mutation;

typedef struct bt_client {
    char addr[BT_ADDR_MAX]; /* "host:port" */
    char instance[128];     /* "projects/p/instances/i" */
    int64_t timeout_ms;     /* per call deadline, <= 0 none */
    char app_profile[64];   /* app_profile_id of data requests; "" = none (the default profile) */
} bt_client;

/* Instance "projects/p/instances/i" at addr. */
void bt_client_init(bt_client *c, const char *addr);
/* "projects/p/instances/i/tables/<table>" into out. */
void bt_table_name(const bt_client *c, const char *table, char out[BT_NAME_MAX]);

/* ---- table admin ----
 * families: NULL or a cbt-like list "cf1:maxversions=2,cf2:never,cf3:maxage=1d||maxversions=1,
 * cf4:maxage=10s&&maxversions=2,cf5" (family without rule = no GC). Units of maxage: s m h d.
 * Families are created in the listed order (the emulator returns families in creation order). */
st_code bt_create_table(const bt_client *c, const char *table, const char *families, st_err *st);
/* The same with initial splits: splits is a NULL-terminated list of row keys (NULL = none). */
st_code bt_create_table_split(const bt_client *c, const char *table, const char *families,
                              const char *const *splits, st_err *st);
st_code bt_delete_table(const bt_client *c, const char *table, st_err *st);
/* One ModifyColumnFamilies create of `family` with the rule text above ("" = none). */
st_code bt_create_family(const bt_client *c, const char *table, const char *family,
                         const char *gc_rule, st_err *st);

/* A single-cluster-routing app profile `id` to cluster_id (instance admin, ignore_warnings). */
st_code bt_create_app_profile(const bt_client *c, const char *id, const char *cluster_id,
                              st_err *st);
/* GenerateConsistencyToken, then CheckConsistency every 100 ms until consistent, at most
 * max_checks times (*checks, may be NULL, receives how many): what `cbt waitforreplication`
 * does. DEADLINE_EXCEEDED when it never was consistent. */
st_code bt_wait_consistent(const bt_client *c, const char *table, int max_checks, int *checks,
                           st_err *st);

/* ---- mutation lists (own their memory) ---- */
typedef struct bt_muts {
    st_arena arena;
    bt_mutation **v;
    size_t n, cap;
} bt_muts;

void bt_muts_init(bt_muts *m);
void bt_muts_deinit(bt_muts *m);
void bt_muts_reset(bt_muts *m);
/* The data of family/qualifier/value is copied. ts -1 = server time, as in the API. */
void bt_muts_set(bt_muts *m, const char *family, st_slice qualifier, int64_t ts_us, st_slice value);
/* Time range [start, end); end 0 = infinity; start == end == 0 sends no range (whole column). */
void bt_muts_del_column(bt_muts *m, const char *family, st_slice qualifier, int64_t start_us,
                        int64_t end_us);
void bt_muts_del_family(bt_muts *m, const char *family);
void bt_muts_del_row(bt_muts *m);

st_code bt_mutate_row(const bt_client *c, const char *table, st_slice row, const bt_muts *m,
                      st_err *st);

typedef struct bt_entry {
    st_slice row;
    const bt_muts *muts;
} bt_entry;
/* codes[i] receives entry i's status (ST_UNKNOWN if the server sent none for it); msgs (may be
 * NULL) receives their messages, each up to ST_ERR_MSG_MAX bytes. The return value is the call's
 * status. */
st_code bt_mutate_rows(const bt_client *c, const char *table, const bt_entry *entries, size_t n,
                       st_code *codes, st_err *msgs, st_err *st);
/* pred may be NULL (= "row has any cell"); either list may be NULL (empty). */
st_code bt_check_and_mutate(const bt_client *c, const char *table, st_slice row,
                            const bt_filter *pred, const bt_muts *on_true, const bt_muts *on_false,
                            bool *matched, st_err *st);

typedef struct bt_rmw_rule {
    const char *family;
    st_slice qualifier;
    bool append; /* true: append `value`; false: add `increment` to a big-endian int64 */
    st_slice value;
    int64_t increment;
} bt_rmw_rule;
/* On ST_OK, dump (may be NULL; appended to) receives the returned row as canonical text
 * (bt_dump_row), timestamps shown only if with_ts (RMW timestamps are server-assigned). */
st_code bt_read_modify_write(const bt_client *c, const char *table, st_slice row,
                             const bt_rmw_rule *rules, size_t n, st_buf *dump, bool with_ts,
                             st_err *st);

/* Packs req and calls path on addr (no metadata) with a deadline of timeout_ms; resp (NULL:
 * discarded) receives the answer, st (cleared first) the status. For tests that call methods
 * this client has no function for. */
st_code bt_call_pb(const char *addr, const char *path, const ProtobufCMessage *req, int timeout_ms,
                   st_buf *resp, st_err *st);
/* bt_call_pb, then the answer unpacked as resp_desc's message (free it with
 * protobuf_c_message_free_unpacked); NULL when the call failed (st says why) or the answer does
 * not parse. */
ProtobufCMessage *bt_call_unpack(const char *addr, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 st_err *st);
/* PutTable of a node's internal service (strata.internal.v1.Node): table `name` (full name) with
 * the one family `family`, keeping at most max_versions versions (0: no GC rule), no change
 * streams. For tests that drive a node without the router. */
st_code bt_node_put_table(const char *addr, const char *name, const char *family,
                          uint32_t max_versions, int timeout_ms, st_err *st);

/* Appends one "key<TAB>offset\n" line (key escaped like row keys) per SampleRowKeys answer. */
st_code bt_sample_row_keys(const bt_client *c, const char *table, st_buf *dump, size_t *n_keys,
                           st_err *st);

/* ---- ReadRows ---- */
typedef struct bt_cell {
    st_slice family;
    st_slice qualifier;
    int64_t ts_us;
    st_slice labels; /* the cell's labels joined with ',' (labels cannot contain ',') */
    size_t n_labels;
    st_slice value;
} bt_cell;

typedef struct bt_row {
    st_slice key;
    const bt_cell *cells;
    size_t n_cells;
} bt_row;

/* Called once per committed row; everything is valid during the call only. */
typedef void (*bt_row_fn)(const bt_row *row, void *arg);

typedef struct bt_read_req {
    const Google__Bigtable__V2__RowSet *rows; /* NULL = whole table */
    const bt_filter *filter;                  /* NULL = none */
    int64_t rows_limit;                       /* 0 = all */
    bool reversed;
    bool no_reverse_feature; /* true: omit the bigtable-features reverse_scans header */
} bt_read_req;

/* The chunk reader: feeds ReadRowsResponse chunks, emits committed rows, and rejects chunk
 * sequences the Go client rejects (see btclient.c). Usable on its own for unit tests. */
typedef struct bt_chunk_reader bt_chunk_reader;
bt_chunk_reader *bt_chunk_reader_new(bool reversed, bt_row_fn fn, void *arg);
void bt_chunk_reader_free(bt_chunk_reader *r);
/* ST_OK, or INTERNAL with a message naming the broken rule (the reader then stays failed). */
st_code bt_chunk_reader_feed(bt_chunk_reader *r,
                             const Google__Bigtable__V2__ReadRowsResponse__CellChunk *chunk,
                             st_err *err);
/* At the end of a successful stream: INTERNAL if a row was left uncommitted. */
st_code bt_chunk_reader_finish(bt_chunk_reader *r, st_err *err);
uint64_t bt_chunk_reader_rows(const bt_chunk_reader *r);

/* Streams the rows through fn. A chunk-rule violation is returned as INTERNAL ("chunk
 * protocol: ...") unless the call itself failed, whose status wins. */
st_code bt_read_rows(const bt_client *c, const char *table, const bt_read_req *req, bt_row_fn fn,
                     void *arg, st_err *st);
/* Same, appending the canonical dump of every row to dump; *n_rows (may be NULL) = rows. */
st_code bt_read_dump(const bt_client *c, const char *table, const bt_read_req *req, st_buf *dump,
                     size_t *n_rows, st_err *st);

/* Canonical text for one row: one line per cell
 *   <row>\t<family>\t<qualifier>\t<ts>\t<labels>\t<value hex>\n
 * with row/qualifier printable ASCII kept and other bytes (and '\\') as \xNN; ts printed as "*"
 * when with_ts is false. Runs of cells with equal (family, qualifier, timestamp) — only Interleave
 * produces them, in unspecified order — are sorted by (labels, value) so such answers compare. */
void bt_dump_row(st_buf *out, const bt_row *row, bool with_ts);
/* Escapes bytes as in the dump (NUL-terminated into out). */
void bt_escape(st_buf *out, st_slice s);

/* ---- filter builders (allocate from the arena) ---- */
bt_filter *bt_filter_new(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind);
/* Regex kinds (row key, family, qualifier, value) and apply_label take text/bytes. */
bt_filter *bt_filter_bytes(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind,
                           st_slice s);
/* cells_per_row_offset/limit, cells_per_column_limit. */
bt_filter *bt_filter_int(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind, int32_t n);
/* Chain or interleave over subs[0..n). */
bt_filter *bt_filter_list(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind,
                          bt_filter *const *subs, size_t n);
/* A RowSet with keys / ranges added by the helpers below (arena-allocated). */
Google__Bigtable__V2__RowSet *bt_rowset_new(st_arena *a);
void bt_rowset_add_key(st_arena *a, Google__Bigtable__V2__RowSet *s, st_slice key);
/* start/end: NULL = unbounded; *_closed chooses the bound kind. */
void bt_rowset_add_range(st_arena *a, Google__Bigtable__V2__RowSet *s, const st_slice *start,
                         bool start_closed, const st_slice *end, bool end_closed);

/* ---- processes ---- */
typedef struct bt_proc {
    pid_t pid; /* 0 when not running */
    char addr[BT_ADDR_MAX];
    char log_path[BT_PATH_MAX];
} bt_proc;

/* Starts argv[0] with stdout+stderr to log_path and waits until the log shows "listening on
 * HOST:PORT" or "running on HOST:PORT" (addr receives HOST:PORT). The child gets SIGKILL if the
 * test process dies. FAILED_PRECONDITION with the log's tail if the process exits first. */
st_code bt_proc_start(bt_proc *p, char *const argv[], const char *log_path, st_err *err);
/* Sends sig and waits for the exit; *wstatus (may be NULL) receives waitpid's status. */
void bt_proc_stop(bt_proc *p, int sig, int *wstatus);
/* strata-node --data data_dir --listen 127.0.0.1:0, log at <data_dir>.log. */
st_code bt_node_start(bt_proc *p, const char *bin, const char *data_dir, st_err *err);
/* cbtemulator -host 127.0.0.1 -port <free port>, log at <log_dir>/emulator.log. */
st_code bt_emulator_start(bt_proc *p, const char *bin, const char *log_dir, st_err *err);
/* $STRATA_EMULATOR, or the Cloud SDK's default path. */
const char *bt_emulator_path(void);
/* A port free at the time of asking (bind to 0 and close). 0 on failure. */
uint16_t bt_free_port(void);

/* A fresh empty directory under $STRATA_TEST_TMP (or /tmp), unique per process and call. */
void bt_tmpdir(char *out, size_t cap, const char *name);
void bt_rmrf(const char *path);

#endif
