/* backup.h — Cloud Bigtable backups on the router (private to router/; docs/backups.md).
 * Modules: backup_filter.c (pure: names, ids, expiry rules, ListBackups filter and order_by),
 * backup.c (records, CreateBackup / GetBackup / ListBackups / UpdateBackup / DeleteBackup /
 * RestoreTable / CopyBackup handlers, GetTable's cluster states), backup_job.c (the work of the
 * long-running operations: the consistent freeze of every tablet, copies, restores),
 * backup_ops.c (operations kept in the metadata table, leases, the periodic sweep that finishes
 * the operations of a dead router and deletes expired backups), backup_admin.c (the BackupAdmin
 * service of the `strata backup` CLI).
 *
 * A backup is the metadata record "backup/<full name>" (strata.internal.v1.BackupRecord) plus its
 * pieces on the nodes of its cluster. Operations of backups are records "op/<name>"
 * (OperationRecord) so that they outlive the router that started them. */
#ifndef ROUTER_BACKUP_H
#define ROUTER_BACKUP_H

#include "instance.h"
#include "router_internal.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/router_records.pb-c.h"

#define RTR_BA "/strata.internal.v1.BackupAdmin/"

#define RTR_BK_ID_MAX 50 /* backup ids: [_a-zA-Z0-9][-_.a-zA-Z0-9]*, as Cloud Bigtable */
#define RTR_BK_NAME_MAX (RTR_TABLE_NAME_MAX + 64)
#define RTR_BK_HOUR_US (3600LL * 1000000)
#define RTR_BK_DAY_US (24 * RTR_BK_HOUR_US)
#define RTR_BK_EXPIRE_MIN_US (6 * RTR_BK_HOUR_US)      /* expire_time: 6 hours ... */
#define RTR_BK_EXPIRE_SLACK_US (10 * 1000000LL)        /* ... less up to 10 s of transit */
#define RTR_BK_EXPIRE_MAX_US (90 * RTR_BK_DAY_US)      /* ... to 90 days after creation */
#define RTR_BK_COPY_EXPIRE_MAX_US (30 * RTR_BK_DAY_US) /* copies: at most 30 days */
#define RTR_BK_HOT_MIN_US (24 * RTR_BK_HOUR_US)        /* hot_to_standard_time: 24 h at least */
#define RTR_BK_IMPORT_EXPIRE_US (7 * RTR_BK_DAY_US)    /* an import whose expire_time passed */
#define RTR_BK_PAGE_MAX 1000                           /* backups per ListBackups page */
#define RTR_BK_STALL_MS 30000 /* a range no node could freeze (or a piece not copied) this long */
#define RTR_BK_RETRY_MS 200   /* pause between rounds of a backup that hit a split or move */
#define RTR_BK_CALL_TIMEOUT_MS 600000 /* one BackupTablet, PullBackupPiece or CreateTablet */
#define RTR_BK_PARALLEL 8             /* node calls of one operation at a time */
/* Pieces of an import once runs of empty ones are merged: an export holds at most as many
 * (docs/formats/backup-export.md), a node at most as many tablets, and a restore makes a
 * tablet of each piece. */
#define RTR_BK_IMPORT_PIECES_MAX 100000
#define RTR_BK_SWEEP_MS 10000 /* leases renewed, dead operations and expired backups */
#define RTR_BK_LEASE_MS 60000 /* an operation whose router is silent this long is dead */
#define RTR_BK_OP_KEEP_US (7 * RTR_BK_DAY_US)       /* finished operations kept this long */
#define RTR_BK_IMPORT_KEEP_US (24 * RTR_BK_HOUR_US) /* an import never finished: deleted */

typedef Google__Bigtable__Admin__V2__Backup rtr_pb_backup;
typedef Strata__Internal__V1__BackupRecord rtr_pb_bkrec;

/* ---- names, ids, expiry (backup_filter.c, pure) ---- */
/* [_a-zA-Z0-9][-_.a-zA-Z0-9]*, 1..RTR_BK_ID_MAX characters. */
bool rtr_bk_id_valid(const char *id);
/* "projects/P/instances/I/clusters/C" of the topology's instance: the cluster's index in *idx.
 * allow_any: C "-" gives *idx = SIZE_MAX. INVALID_ARGUMENT for a malformed name, NOT_FOUND for
 * another instance or an unknown cluster. */
st_code rtr_bk_parse_cluster(const st_topology *t, const char *name, bool allow_any, size_t *idx,
                             st_err *err);
/* "projects/P/instances/I/clusters/C/backups/B": the cluster index and B (id, cap >=
 * RTR_BK_ID_MAX + 1). Errors as rtr_bk_parse_cluster, and INVALID_ARGUMENT for a bad id. */
st_code rtr_bk_parse_name(const st_topology *t, const char *name, size_t *idx, char *id, size_t cap,
                          st_err *err);
/* expire_us (0: not set; INT64_MIN: no valid Timestamp, from rtr_bk_ts_us) must lie in
 * [from_us + RTR_BK_EXPIRE_MIN_US, from_us + max_us]. INVALID_ARGUMENT naming the bounds
 * otherwise, or saying the Timestamp is not a valid one. */
st_code rtr_bk_check_expire(int64_t expire_us, int64_t from_us, int64_t max_us, st_err *err);
/* A HOT backup's hot_to_standard_us (0: not set; INT64_MIN: no valid Timestamp) must be at
 * least RTR_BK_HOT_MIN_US after now_us. INVALID_ARGUMENT otherwise. */
st_code rtr_bk_check_hot(int64_t hot_us, int64_t now_us, st_err *err);
int64_t rtr_bk_ts_us(const Google__Protobuf__Timestamp *t); /* NULL: 0; invalid: INT64_MIN */

/* ---- ListBackups filter and order_by (backup_filter.c, pure) ---- */
typedef struct rtr_bk_filter rtr_bk_filter;
/* Cloud Bigtable's filter language: comparisons "field OP value" with OP one of < > <= >= != =
 * : (":" = contains for strings, = for the rest) over name, source_table, state, start_time,
 * end_time, expire_time (RFC 3339 times, e.g. 2026-01-02T03:04:05Z) and size_bytes; AND, OR,
 * NOT (or a leading -) and parentheses; juxtaposition is AND. Empty text: everything (*out
 * NULL). INVALID_ARGUMENT with the position otherwise. Memory from a. */
st_code rtr_bk_filter_parse(const char *text, st_arena *a, rtr_bk_filter **out, st_err *err);
bool rtr_bk_filter_match(const rtr_bk_filter *f, const rtr_pb_backup *b); /* NULL f: true */

#define RTR_BK_ORDER_KEYS_MAX 8
typedef enum rtr_bk_field {
    RTR_BK_F_NAME,
    RTR_BK_F_SOURCE_TABLE,
    RTR_BK_F_STATE,
    RTR_BK_F_START,
    RTR_BK_F_END,
    RTR_BK_F_EXPIRE,
    RTR_BK_F_SIZE,
} rtr_bk_field;
typedef struct rtr_bk_order {
    rtr_bk_field field[RTR_BK_ORDER_KEYS_MAX];
    bool desc[RTR_BK_ORDER_KEYS_MAX];
    size_t n;
} rtr_bk_order;
/* "field [desc|asc], ..." over name, source_table, state, start_time, end_time, expire_time,
 * size_bytes; empty: "start_time desc". Ties always end by name. INVALID_ARGUMENT otherwise. */
st_code rtr_bk_order_parse(const char *text, rtr_bk_order *out, st_err *err);
int rtr_bk_order_cmp(const rtr_bk_order *o, const rtr_pb_backup *a, const rtr_pb_backup *b);

/* A backup record is shown (GetBackup, ListBackups, restores, copies, exports) unless it is
 * CREATING and its operation, as GetOperation answers it (op: the serialized Operation, NULL
 * when unknown), ended with an error: a failed backup's operation is recorded done before its
 * record is deleted, so every router hides the backup from the moment its operation reads
 * failed (backup_filter.c, pure). */
bool rtr_bk_visible(const rtr_pb_bkrec *rec, const st_slice *op);

/* ---- records (backup.c) ---- */
/* A stored backup record unpacked into a (NULL for a corrupt one). */
rtr_pb_bkrec *rtr_bk_rec_unpack(st_slice pb, st_arena *a);
rtr_pb_bkrec *rtr_bk_find(rtr_ctx *r, const char *name, st_arena *a);
/* rtr_bk_visible with the operation as this router's GetOperation answers it. */
bool rtr_bk_shown(rtr_ctx *r, const rtr_pb_bkrec *rec);
st_code rtr_bk_rec_pack(const rtr_pb_bkrec *rec, st_buf *out);
/* A backup's size_bytes: the bytes of its distinct files. Pieces of one node share files (a
 * split's children keep their parent's SSTables), so a file listed by several pieces of a node
 * counts once; a sum of the pieces' sizes made a split table's backup many times its size. */
int64_t rtr_bk_stored_bytes(Strata__Internal__V1__BackupPiece *const *pieces, size_t n);
/* The node (an index below n_nodes) of each of the n pieces in slot: pieces that list the same
 * file (their node_num, the file's name, size and CRC32C: the halves of a split keep their
 * parent's SSTables whole) together, so the destination stores the file once and links it into
 * the others; each such group, largest first, on the node with the fewest bytes so far (of
 * those, the fewest pieces: a restore makes a tablet of each). Spread
 * round robin instead, a shared file was written once per node a sharer landed on. Used by
 * BeginImport (node_num 0: by content), CopyBackup and the pulls of a restore into the other
 * clusters. */
void rtr_bk_place(Strata__Internal__V1__BackupPiece *const *pieces, size_t n, size_t n_nodes,
                  size_t *slot);
/* GetTable and ListTables with REPLICATION_VIEW, ENCRYPTION_VIEW or FULL: every cluster READY (a
 * table exists in every cluster from its creation); with encryption, each cluster's
 * encryption_info says GOOGLE_DEFAULT_ENCRYPTION (Strata has no customer-managed keys). */
st_code rtr_bk_cluster_states(rtr_ctx *r, Google__Bigtable__Admin__V2__Table *t, st_arena *a,
                              bool encryption);
/* The node of a piece: the node numbered num in cluster c (NULL when the topology lost it). */
rtr_node *rtr_bk_node(rtr_cluster *c, uint32_t num);

/* ---- jobs (backup_job.c): the work of CreateBackup, CopyBackup and RestoreTable ---- */
typedef struct bk_job bk_job;
typedef enum bk_kind { BK_CREATE, BK_COPY, BK_RESTORE, BK_REAP } bk_kind;
/* What a job starts from; strings are copied. */
typedef struct bk_job_spec {
    bk_kind kind;
    const char *op_name;
    const char *backup;    /* CREATE, COPY: the backup made; RESTORE: the source */
    const char *table;     /* RESTORE: the new table */
    rtr_cluster *cluster;  /* CREATE, COPY: the backup's cluster */
    st_slice rec;          /* CREATE, COPY: the record written (CREATING); RESTORE: the source */
    st_slice schema;       /* RESTORE: the new table's record (Table with restore_info) */
    const char *meta_type; /* the operation's metadata type url */
    st_slice meta;         /* its metadata (serialized) */
    int64_t start_us;
    rpc_call *call; /* answered with the running Operation once the records are written */
} bk_job_spec;
/* Starts a job: writes the operation record (not done), then for CREATE and COPY the backup
 * record, then answers spec->call with the Operation and goes on; a failed write fails the call
 * instead. */
void rtr_bk_job_start(rtr_ctx *r, const bk_job_spec *spec);
/* True while a job of this router works on name (a backup made, copied or restored from, or a
 * table being restored). */
bool rtr_bk_busy(rtr_ctx *r, const char *name);
/* Stops a job at its next step (CancelOperation, DeleteBackup of a backup being made): it fails
 * with CANCELLED and cleans up. False when no job of this router runs op_name. */
bool rtr_bk_job_cancel(rtr_ctx *r, const char *op_name, const char *why);
/* The job making backup (a CREATE or COPY), or NULL. */
const char *rtr_bk_job_of_backup(rtr_ctx *r, const char *backup);
/* A BeginImport of backup (full name) is recording it now: the name is taken. */
bool rtr_bk_import_pending(rtr_ctx *r, const char *backup);
/* Deletes a backup: its record, then its pieces on every node of its cluster; done(arg, code,
 * message) runs after the record is gone. */
void rtr_bk_delete(rtr_ctx *r, const char *name, rtr_meta_done_fn done, void *arg);
/* Rewrites the record of every running job of this router (its lease, its progress). */
void rtr_bk_jobs_renew(rtr_ctx *r);
bool rtr_bk_job_exists(rtr_ctx *r, const char *op_name);
/* At close, after every callback ran: frees the jobs left (their records stay not done; the
 * sweep of the next start finishes them). */
void rtr_bk_jobs_free(rtr_ctx *r);
/* Finishes an operation of a dead router as failed, cleaning its partial work (BK_REAP). */
void rtr_bk_reap(rtr_ctx *r, const char *op_name, st_slice op_rec);

/* ---- operations kept in the metadata table (backup_ops.c) ---- */
/* "host:port/<start us>" of this router. */
const char *rtr_bk_owner(rtr_ctx *r);
/* The owner is an earlier run of this router (same address, another start time): dead. */
bool rtr_bk_owner_is_past_me(const rtr_ctx *r, const char *owner);
/* Serializes an Operation: running (done false) or finished with a response or an error
 * (code != ST_OK). */
st_code rtr_bk_op_pack(const char *name, const char *meta_type, st_slice meta, bool done,
                       st_code code, const char *message, const char *resp_type, st_slice resp,
                       st_buf *out);
/* Writes the record of an operation (with this router as owner while not done) and keeps the
 * Operation for GetOperation. done may be NULL. */
void rtr_bk_op_store(rtr_ctx *r, const char *name, st_slice op, bool done_op, int64_t created_us,
                     rtr_meta_done_fn done, void *arg);
/* The Operation inside a stored OperationRecord (false for a corrupt one). */
bool rtr_bk_op_of_record(st_slice rec, st_slice *op);

/* ---- writes that must not race between routers (backup_meta.c) ---- */
/* Creates a record only if the first cluster's metadata holds none under that name (a
 * CheckAndMutateRow there), then writes it to every cluster; done gets ALREADY_EXISTS when
 * another router created it first, UNAVAILABLE when the first cluster cannot be reached. */
void rtr_bk_meta_create(rtr_ctx *r, rtr_meta_kind kind, const char *name, st_slice pb,
                        rtr_meta_done_fn done, void *arg);
/* A restore's claim on its table id ("bkclaim/<table>" = op, in the first cluster): taken only
 * if nobody holds it (ALREADY_EXISTS otherwise), given back only if it still names op. */
void rtr_bk_claim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done, void *arg);
void rtr_bk_unclaim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done,
                    void *arg);
/* Reads, in the first cluster (where names are compared and set, so never a moment old), the
 * record of a backup (kind RTR_META_KIND_BACKUP) or the claim on a table id (RTR_META_KIND_OP,
 * name the table): who holds the name now. UNAVAILABLE (done not called) when that cluster's
 * metadata tablet is not known. */
st_code rtr_bk_first_get(rtr_ctx *r, rtr_meta_kind kind, const char *name, rtr_meta_get_fn done,
                         void *arg);
/* CreateTable and RestoreTable of one table id agree through the claim: both take it (token: the
 * restore's operation name, or a CreateTable's rtr_bk_create_token) for as long as they make
 * tablets, then read the table's record in the first cluster, so exactly one proceeds and the
 * other gets ALREADY_EXISTS, also when its router's copy of the metadata is a moment old. On
 * ALREADY_EXISTS or an error the claim is not held (given back if it was taken); on ST_OK it is,
 * until rtr_bk_unclaim(table, token). A CreateTable claim older than
 * RTR_BK_CREATE_CLAIM_TTL_US (its router died) is released by the next reservation of that id. */
void rtr_bk_reserve_table(rtr_ctx *r, const char *table, const char *token, rtr_meta_done_fn done,
                          void *arg);
#define RTR_BK_CREATE_CLAIM "tablecreate/"
#define RTR_BK_CREATE_CLAIM_TTL_US (15LL * 60 * 1000000)
/* "tablecreate/<now us>/<router>" into out (cap at least RTR_OP_NAME_MAX + 1), and the call is
 * counted as running until rtr_bk_create_end(token): a claim of this run that no running call
 * holds was left by one whose claim's write had an open outcome (it timed out on a frozen node
 * and landed later), and the next reservation of the id releases it. False: out of memory. */
bool rtr_bk_create_token(rtr_ctx *r, char *out, size_t cap);
void rtr_bk_create_end(rtr_ctx *r, const char *token);

/* ---- the module (backup.c): rtr_ctx.bk ---- */
typedef struct rtr_bk {
    bk_job *jobs;
    struct imp_op *imports; /* BeginImports whose record is being written (backup_admin.c) */
    struct event *sweep_timer;
    char owner[ST_TOPO_ADDR_MAX + 40];
    int64_t started_us;
    uint64_t restore_seq;
    int64_t expiry_ahead_us;       /* STRATA_BACKUP_TEST_EXPIRY_AHEAD_S (tests only; 0 otherwise) */
    struct bk_leftover *leftovers; /* deletes a node missed: retried by the sweep (backup_ops.c) */
    char **creating; /* tokens of the CreateTable calls running (rtr_bk_create_token) */
    size_t n_creating, cap_creating;
} rtr_bk;
/* Tests of the expiry sweep: the sweep treats expire times as if this many seconds more had
 * passed (docs/operations.md); read once at start. */
#define RTR_BK_TEST_EXPIRY_ENV "STRATA_BACKUP_TEST_EXPIRY_AHEAD_S"
/* Registers the backup methods (router.c's register_methods). */
st_code rtr_bk_open(rtr_ctx *r, st_err *err);
/* After listening: the owner name and the sweep timer (first sweep at once). */
st_code rtr_bk_start(rtr_ctx *r, st_err *err);
/* Runs the sweep once: leases, dead operations, expired backups (backup_ops.c). */
void rtr_bk_sweep(rtr_ctx *r);
/* A DeleteBackupPieces of backup's pieces of one making (the operation that made them) that node
 * (index in cluster) missed: the sweep sends it again, limited to that making, until the node
 * answers (docs/backups.md, "Late deletes"). A making that is empty is not noted. */
void rtr_bk_leftover_note(rtr_ctx *r, const char *backup, const char *making, size_t cluster,
                          size_t node);
/* Forgets the deletes still to retry (at close). */
void rtr_bk_leftovers_free(rtr_ctx *r);
void rtr_bk_close(rtr_ctx *r);

/* FAILED_PRECONDITION for a call that needs backup rec READY (then: what to do once it is,
 * "restore it"). An unfinished import (CREATING, no operation) may be running in another CLI
 * or have been cut short, which never becomes READY: the message says how old it is and how to
 * delete it, with `strata backup --cluster C delete ID` when C is not the first cluster, the
 * CLI's default (backup_admin.c). */
st_code rtr_bk_not_ready(const rtr_ctx *r, const rtr_pb_bkrec *rec, const char *then, st_err *err);

/* ---- handlers ---- */
void rtr_h_create_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_get_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_backups(rpc_call *call, st_slice req, void *arg);
void rtr_h_update_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_delete_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_restore_table(rpc_call *call, st_slice req, void *arg);
void rtr_h_copy_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_describe_backup(rpc_call *call, st_slice req, void *arg);
void rtr_h_begin_import(rpc_call *call, st_slice req, void *arg);
void rtr_h_finish_import(rpc_call *call, st_slice req, void *arg);

#endif
