/* backup_job.c — the work behind CreateBackup, CopyBackup and RestoreTable, and the cleanup of
 * an operation that failed or whose router died, which first checks that the name is still the
 * operation's (docs/backups.md, "Consistency", "Restore", "Operations").
 *
 * CreateBackup: start_time is recorded before the first freeze; then rounds: refresh the
 * cluster's tablet map, BackupTablet on the owner of every tablet of the table that does not
 * overlap a piece already frozen; a tablet that split or moved answers NOT_FOUND and the next
 * round freezes what covers its range now (tablets only split and move, so a tablet either lies
 * inside a frozen piece's range or is disjoint from all of them). When the pieces cover the key
 * space exactly once, end_time is recorded and the backup is READY. A range no node froze for
 * RTR_BK_STALL_MS fails the operation, and every piece made is deleted.
 *
 * CopyBackup: PullBackupPiece of every piece onto the destination cluster's nodes (rtr_bk_place:
 * pieces sharing a file on one node). Each pull carries a read ticket for its piece that the
 * router asked the holding node for just before (GrantBackupRead): without one, a node reads
 * no other node's backup.
 * RestoreTable: DropTable of the target first (a half-table of an earlier try that died: it has
 * no record, so nobody sees it), PutTable everywhere, then per piece: in the backup's cluster
 * CreateTablet(restore) on the node holding it; in every other cluster PullBackupPiece onto a
 * node (rtr_bk_place) under a temporary backup name, then CreateTablet(restore) there. The table
 * record is written last: the table is invisible until then. Temporary pieces are deleted after.
 *
 * Every job counts its callbacks in flight (pending): when the router closes, the last callback
 * frees the job without touching the metadata — the next start of a router finishes the
 * operation (backup_ops.c). */
#include "backup.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/cstoken.h"

typedef Strata__Internal__V1__BackupPiece pb_piece;
typedef Google__Bigtable__Admin__V2__Table pb_table;

/* A task's steps. A pull needs a read ticket from the node holding the piece first: a node
 * reads another node's piece only with one (docs/security.md, Internal links). */
typedef enum task_stage {
    TASK_GRANT,  /* GrantBackupRead on from */
    TASK_PULL,   /* PullBackupPiece on to, with the ticket */
    TASK_CREATE, /* CreateTablet(restore) on to (RESTORE only) */
    TASK_DONE,
} task_stage;

typedef struct bk_task {
    bk_job *job;
    size_t piece;   /* in the source record */
    rtr_node *from; /* the node holding the piece; NULL: no pull */
    rtr_node *to;   /* where it is pulled to / restored on */
    const char *as; /* the backup name it gets on `to` */
    int stage;      /* a task_stage */
    int attempts;
    st_buf resp;
    char ticket[80]; /* from's read ticket for the piece (GrantBackupRead), for the pull */
} bk_task;

typedef struct bk_freeze {
    st_slice start, end;
    uint64_t id;
    rtr_node *node;
} bk_freeze;

struct bk_job {
    rtr_ctx *r;
    bk_job *next;
    bk_kind kind;
    char *op_name, *backup, *table, *temp; /* temp: RESTORE's pulled pieces' name suffix */
    rtr_cluster *cluster;
    st_arena arena;
    rtr_pb_bkrec *rec;    /* CREATE, COPY: being built; RESTORE: the source */
    rtr_pb_bkrec *src;    /* COPY: the source */
    st_buf schema;        /* RESTORE: the new table's record */
    ProtobufCMessage *md; /* the operation's metadata */
    const char *md_type;
    Google__Bigtable__Admin__V2__OperationProgress *progress; /* inside md (COPY, RESTORE) */
    rpc_call *call;                                           /* until answered */
    int64_t start_us, created_us, progress_us;
    int pending; /* callbacks in flight */
    bool cancelled, failing, finished;
    bool drop_rec; /* failed CREATE, COPY: the record goes once the operation reads done */
    bool owns;     /* its name was found to be this operation's (owner_check): cleanup may go */
    void (*owner_then)(bk_job *, st_code, const char *, bool found, bool mine);
    st_code fail_code;
    char fail_msg[512];
    st_err last_err;   /* CREATE: the last retryable error */
    pb_piece **pieces; /* CREATE, COPY: made so far */
    size_t n_pieces;
    bk_freeze *freeze; /* CREATE: this round's calls */
    size_t n_freeze;
    bk_task *tasks; /* COPY, RESTORE */
    size_t n_tasks, next_task, done_tasks;
    size_t step;              /* RESTORE: 0 drop, 1 put, 2 tasks, 3 record */
    uint32_t rounds, retried; /* CREATE: freeze rounds; tablets that split, moved or failed */
};

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *p) {
    (void)data;
    (void)p;
}

/* ---- the list of jobs ---- */

static void job_free(bk_job *j) {
    rtr_bk *bk = j->r->bk;
    for (bk_job **p = &bk->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    if (j->call)
        rpc_call_finish(j->call, ST_UNAVAILABLE,
                        "the router is shutting down: retry on another router");
    for (size_t i = 0; i < j->n_tasks; i++)
        st_buf_free(&j->tasks[i].resp);
    free(j->tasks);
    free(j->pieces);
    free(j->freeze);
    free(j->op_name);
    free(j->backup);
    free(j->table);
    free(j->temp);
    st_buf_free(&j->schema);
    st_arena_deinit(&j->arena);
    free(j);
}

void rtr_bk_jobs_free(rtr_ctx *r) {
    while (r->bk->jobs) {
        st_log(ST_LOG_WARN, "router", "operation %s: left unfinished at close",
               r->bk->jobs->op_name);
        job_free(r->bk->jobs);
    }
}

/* A finished job (its operation already reads done, only its record is still being written)
 * holds no name any more: a client that saw the operation end may reuse the name at once. */
bool rtr_bk_busy(rtr_ctx *r, const char *name) {
    for (bk_job *j = r->bk ? r->bk->jobs : NULL; j; j = j->next)
        if (!j->finished && ((j->backup && strcmp(j->backup, name) == 0) ||
                             (j->table && strcmp(j->table, name) == 0)))
            return true;
    return false;
}

const char *rtr_bk_job_of_backup(rtr_ctx *r, const char *backup) {
    for (bk_job *j = r->bk ? r->bk->jobs : NULL; j; j = j->next)
        if ((j->kind == BK_CREATE || j->kind == BK_COPY) && !j->finished &&
            strcmp(j->backup, backup) == 0)
            return j->op_name;
    return NULL;
}

static bk_job *job_by_op(rtr_ctx *r, const char *op) {
    for (bk_job *j = r->bk ? r->bk->jobs : NULL; j; j = j->next)
        if (strcmp(j->op_name, op) == 0)
            return j;
    return NULL;
}

bool rtr_bk_job_cancel(rtr_ctx *r, const char *op_name, const char *why) {
    bk_job *j = job_by_op(r, op_name);
    if (!j || j->kind == BK_REAP)
        return false;
    if (!j->cancelled && !j->failing)
        snprintf(j->fail_msg, sizeof j->fail_msg, "%s", why);
    j->cancelled = true;
    return true;
}

/* A callback of j arrived: false when the job was freed (the router is closing). */
static bool job_back(bk_job *j) {
    j->pending--;
    if (!j->r->closing)
        return true;
    if (j->pending == 0)
        job_free(j);
    return false;
}

/* ---- the operation ---- */

static st_code op_bytes(bk_job *j, bool done, st_code code, const char *msg, const char *rtype,
                        st_slice resp, st_buf *out) {
    size_t len = protobuf_c_message_get_packed_size(j->md);
    uint8_t *m = malloc(len ? len : 1);
    if (!m)
        return ST_RESOURCE_EXHAUSTED;
    protobuf_c_message_pack(j->md, m);
    st_code rc = rtr_bk_op_pack(j->op_name, j->md_type, st_slice_make(m, len), done, code, msg,
                                rtype, resp, out);
    free(m);
    return rc;
}

/* Moves progress to done/total and keeps the running operation for GetOperation. */
static void job_progress(bk_job *j, size_t done, size_t total) {
    if (j->progress && total)
        j->progress->progress_percent = (int32_t)(done * 100 / total);
    st_buf op;
    st_buf_init(&op);
    if (op_bytes(j, false, ST_OK, NULL, NULL, st_slice_make(NULL, 0), &op) == ST_OK)
        rtr_ops_put(rtr_inst_of(j->r)->ops, j->op_name, st_buf_slice(&op));
    st_buf_free(&op);
}

void rtr_bk_jobs_renew(rtr_ctx *r) {
    for (bk_job *j = r->bk->jobs; j; j = j->next) {
        if (j->finished || j->failing || j->call) /* the last two write their record anyway */
            continue;
        st_buf op;
        st_buf_init(&op);
        if (op_bytes(j, false, ST_OK, NULL, NULL, st_slice_make(NULL, 0), &op) == ST_OK)
            rtr_bk_op_store(r, j->op_name, st_buf_slice(&op), false, j->created_us, NULL, NULL);
        st_buf_free(&op);
    }
}

bool rtr_bk_job_exists(rtr_ctx *r, const char *op_name) {
    return job_by_op(r, op_name) != NULL;
}

static void end_step_done(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "operation %s: %s %s failed after it ended: %s", j->op_name,
               j->kind == BK_RESTORE ? "releasing the claim on table" : "deleting the record of",
               j->kind == BK_RESTORE ? j->table : j->backup, msg ? msg : st_code_name(code));
    job_free(j);
}

/* The operation's end is recorded: only then does a failed backup's record go (until then it
 * is CREATING with an operation that failed, which every router hides), and a restore give
 * back its claim on the table id (its cleanup is over). */
static void final_written(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "operation %s finished but its record was not updated: %s",
               j->op_name, msg ? msg : st_code_name(code));
    if (j->r->closing) {
        job_free(j);
        return;
    }
    if (j->drop_rec) {
        j->pending++;
        rtr_meta_write(j->r, RTR_META_KIND_BACKUP, j->backup, NULL, end_step_done, j);
    } else if (j->kind == BK_RESTORE && j->table) {
        j->pending++;
        rtr_bk_unclaim(j->r, j->table, j->op_name, end_step_done, j);
    } else {
        job_free(j);
    }
}

/* The operation is done: its record says so, then the job goes. */
static void job_end(bk_job *j, st_code code, const char *msg, const char *rtype, st_slice resp) {
    st_buf op;
    st_buf_init(&op);
    j->finished = true;
    if (op_bytes(j, true, code, msg, rtype, resp, &op) != ST_OK) {
        st_buf_free(&op);
        job_free(j);
        return;
    }
    if (j->call) { /* failed before it was answered: the client gets the error itself */
        rpc_call_finish(j->call, code == ST_OK ? ST_INTERNAL : code, msg);
        j->call = NULL;
    }
    st_log(code == ST_OK ? ST_LOG_INFO : ST_LOG_WARN, "router", "operation %s: %s%s%s", j->op_name,
           st_code_name(code), msg ? ": " : "", msg ? msg : "");
    j->pending++;
    rtr_bk_op_store(j->r, j->op_name, st_buf_slice(&op), true, j->created_us, final_written, j);
    st_buf_free(&op);
}

/* ---- cleanup of a failed operation ---- */

static void cleanup_done(bk_job *j);

static void temp_name(const bk_job *j, const rtr_cluster *c, char *out, size_t cap);

/* The failures of a cleanup fan, whose slots i with i % stride == 0 are DeleteBackupPieces (the
 * others DropTable). Slots never called (no node) are not failures. A node that missed a delete
 * of pieces (down, or killed during the operation) would keep them for good, since nothing names
 * them once the operation has ended: the router notes the delete, limited to this operation's
 * making, and its sweep sends it again until the node answers (late deletes). DropTable needs no
 * such note: the node drops a table no record names when it comes back. */
static void cleanup_fan_errors(const bk_job *j, const rtr_fan *f, size_t stride) {
    for (size_t i = 0; i < f->n; i++) {
        rtr_node *node = f->res[i].node;
        if (!node || f->res[i].code == ST_OK)
            continue;
        bool pieces = i % stride == 0;
        st_log(ST_LOG_WARN, "router", "operation %s: cleanup on %s failed: %s%s", j->op_name,
               node->addr, f->res[i].err.msg,
               pieces ? " (the sweep deletes the pieces when the node answers again)" : "");
        if (!pieces)
            continue;
        char name[RTR_BK_NAME_MAX + 1];
        if (j->kind == BK_RESTORE)
            temp_name(j, node->cluster, name, sizeof name);
        else
            snprintf(name, sizeof name, "%s", j->backup);
        rtr_bk_leftover_note(j->r, name, j->op_name, (size_t)(node->cluster - j->r->clusters),
                             node->idx);
    }
}

static void cleanup_fan_done(rtr_fan *f, void *arg) {
    bk_job *j = arg;
    cleanup_fan_errors(j, f, 2);
    rtr_fan_free(f);
    if (job_back(j))
        cleanup_done(j);
}

static size_t pack_delete_pieces(const char *backup, uint8_t *buf, size_t cap) {
    Strata__Internal__V1__DeleteBackupPiecesRequest req;
    strata__internal__v1__delete_backup_pieces_request__init(&req);
    req.backup = (char *)backup;
    ST_ASSERT(strata__internal__v1__delete_backup_pieces_request__get_packed_size(&req) <= cap);
    return strata__internal__v1__delete_backup_pieces_request__pack(&req, buf);
}

/* The temporary name of a restore's pieces pulled into cluster c. */
static void temp_name(const bk_job *j, const rtr_cluster *c, char *out, size_t cap) {
    snprintf(out, cap, "projects/%s/instances/%s/clusters/%s/backups/%s", j->r->topo.project,
             j->r->topo.instance, c->topo->id, j->temp);
}

/* CREATE, COPY: DeleteBackupPieces on every node of the cluster. RESTORE: DropTable of the
 * target everywhere (when no record made it visible) and the temporary pieces of every other
 * cluster. */
static void cleanup_nodes(bk_job *j, void (*done)(rtr_fan *, void *)) {
    rtr_ctx *r = j->r;
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += r->clusters[c].n_nodes;
    bool drop = j->kind == BK_RESTORE && !rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, j->table);
    rtr_fan *f = rtr_fan_new(r, 2 * n, RTR_ADMIN_TIMEOUT_MS, done, j);
    if (!f) {
        cleanup_done(j);
        return;
    }
    j->pending++;
    uint8_t buf[RTR_BK_NAME_MAX + 64], dbuf[RTR_TABLE_NAME_MAX + 16];
    Strata__Internal__V1__DropTableRequest dreq;
    strata__internal__v1__drop_table_request__init(&dreq);
    dreq.name = j->table;
    size_t dlen =
        j->kind == BK_RESTORE ? strata__internal__v1__drop_table_request__pack(&dreq, dbuf) : 0;
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++) {
        rtr_cluster *cl = &r->clusters[c];
        char name[RTR_BK_NAME_MAX + 1];
        bool pieces = j->kind == BK_RESTORE ? cl != j->cluster : cl == j->cluster;
        if (j->kind == BK_RESTORE)
            temp_name(j, cl, name, sizeof name);
        size_t len = pack_delete_pieces(j->kind == BK_RESTORE ? name : j->backup, buf, sizeof buf);
        for (size_t i = 0; i < cl->n_nodes; i++, k += 2) {
            if (pieces)
                rtr_fan_call(f, k, &cl->nodes[i], RTR_NODE "DeleteBackupPieces",
                             st_slice_make(buf, len));
            if (drop)
                rtr_fan_call(f, k + 1, &cl->nodes[i], RTR_NODE "DropTable",
                             st_slice_make(dbuf, dlen));
        }
    }
    rtr_fan_seal(f);
}

/* The operation ends first, the backup's record after (final_written): a router that reads the
 * metadata between the two writes sees the backup CREATING with a failed operation and hides it
 * (GetBackup NOT_FOUND) as the operation already reads failed; never the backup gone while its
 * operation runs. */
static void cleanup_done(bk_job *j) {
    j->drop_rec = (j->kind == BK_CREATE || j->kind == BK_COPY) && j->owns &&
                  rtr_meta_find(&j->r->meta, RTR_META_KIND_BACKUP, j->backup);
    job_end(j, j->fail_code, j->fail_msg, NULL, st_slice_make(NULL, 0));
}

/* ---- who holds the name now ---- */

static void owner_read(void *arg, st_code code, const char *msg, bool found, st_slice value) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    bool mine = false;
    if (code == ST_OK && found && j->kind == BK_RESTORE) {
        mine = value.len == strlen(j->op_name) && memcmp(value.data, j->op_name, value.len) == 0;
    } else if (code == ST_OK && found) {
        rtr_pb_bkrec *rec = rtr_bk_rec_unpack(value, &j->arena);
        mine = rec && rec->operation && strcmp(rec->operation, j->op_name) == 0;
    }
    j->owns = mine;
    j->owner_then(j, code, msg, found, mine);
}

/* The cleanup of a failed operation removes pieces, tablets and records by name, and the name
 * may have gone to another operation since this one took it (its router was taken for dead and
 * its operation finished by a sweep, the backup deleted, and the id created again through
 * another router). So, before anything is removed, who holds the name now is read where names
 * are compared and set, in the first cluster: the backup's record must name this operation
 * (CREATE, COPY), the claim on the table id must hold its name (RESTORE). Serves the live
 * failure (job_fail) and the reaping of a dead router's operation (reap_run) alike. */
static void owner_check(bk_job *j, void (*then)(bk_job *, st_code, const char *, bool, bool)) {
    j->owner_then = then;
    j->pending++;
    st_code rc =
        rtr_bk_first_get(j->r, j->kind == BK_RESTORE ? RTR_META_KIND_OP : RTR_META_KIND_BACKUP,
                         j->kind == BK_RESTORE ? j->table : j->backup, owner_read, j);
    if (rc != ST_OK) {
        j->pending--;
        then(j, rc,
             rc == ST_UNAVAILABLE ? "no tablet of the metadata table is known in the first cluster"
                                  : "out of memory",
             false, false);
    }
}

static const char *owner_what(const bk_job *j) {
    return j->kind == BK_RESTORE ? "the claim on table" : "the record of backup";
}

/* A live operation failed: its partial work is removed unless its name now belongs to another
 * operation (the backup's record names another one, the claim holds another name), or who holds
 * it cannot be read; then it ends with its error and removes nothing. A record or claim that is
 * simply gone (DeleteBackup through another router while the backup was made, a sweep that took
 * this router for dead) still lets it remove what it made under the name, which would otherwise
 * stay for ever: nobody else can have made pieces or tablets under a name no record or claim
 * holds, since a creation writes its record, a restore or CreateTable its claim, before it
 * touches a node. A record of its own left unread is CREATING with a failed operation: hidden,
 * deleted with its pieces by the sweep; a restore's tablets, invisible without a record, are
 * dropped by the next restore into that table id. */
static void fail_owner_checked(bk_job *j, st_code code, const char *msg, bool found, bool mine) {
    if (mine || (code == ST_OK && !found)) {
        cleanup_nodes(j, cleanup_fan_done);
        return;
    }
    const char *name = j->kind == BK_RESTORE ? j->table : j->backup;
    size_t len = strlen(j->fail_msg);
    if (code != ST_OK)
        snprintf(j->fail_msg + len, sizeof j->fail_msg - len,
                 " (%s %s could not be read in the first cluster: %s; nothing was removed)",
                 owner_what(j), name, msg ? msg : st_code_name(code));
    else
        snprintf(j->fail_msg + len, sizeof j->fail_msg - len,
                 " (%s %s names another operation now: nothing was removed)", owner_what(j), name);
    st_log(ST_LOG_WARN, "router", "operation %s failed: %s", j->op_name, j->fail_msg);
    job_end(j, j->fail_code, j->fail_msg, NULL, st_slice_make(NULL, 0));
}

/* Fails the operation once no callback is in flight: cleanup, then the record. */
static void job_fail(bk_job *j, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void job_fail(bk_job *j, st_code code, const char *fmt, ...) {
    if (!j->failing) {
        j->failing = true;
        j->fail_code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->fail_msg, sizeof j->fail_msg, fmt, ap);
        va_end(ap);
    }
    if (j->pending == 0 && j->owns)
        cleanup_nodes(j, cleanup_fan_done);
    else if (j->pending == 0)
        owner_check(j, fail_owner_checked);
}

/* True (after failing the job) when it was cancelled. */
static bool job_cancelled(bk_job *j) {
    if (!j->cancelled)
        return false;
    char why[sizeof j->fail_msg];
    snprintf(why, sizeof why, "%s", j->fail_msg);
    job_fail(j, ST_CANCELLED, "operation cancelled: %s", why[0] ? why : "CancelOperation");
    return true;
}

/* ---- CreateBackup: the freeze rounds ---- */

static bool overlaps(st_slice s1, st_slice e1, st_slice s2, st_slice e2) {
    bool a = e2.len == 0 || st_slice_cmp(s1, e2) < 0;
    bool b = e1.len == 0 || st_slice_cmp(s2, e1) < 0;
    return a && b;
}

static st_slice bin(ProtobufCBinaryData d) {
    return st_slice_make(d.data, d.len);
}

static bool frozen_overlap(const bk_job *j, st_slice s, st_slice e) {
    for (size_t i = 0; i < j->n_pieces; i++)
        if (overlaps(s, e, bin(j->pieces[i]->start_key), bin(j->pieces[i]->end_key)))
            return true;
    return false;
}

static int piece_cmp(const void *a, const void *b) {
    const pb_piece *x = *(pb_piece *const *)a, *y = *(pb_piece *const *)b;
    return st_slice_cmp(bin(x->start_key), bin(y->start_key));
}

/* The pieces cover the key space exactly once. */
static bool covered(bk_job *j) {
    if (j->n_pieces == 0)
        return false;
    qsort(j->pieces, j->n_pieces, sizeof *j->pieces, piece_cmp);
    st_slice at = st_slice_make(NULL, 0);
    for (size_t i = 0; i < j->n_pieces; i++) {
        if (!st_slice_eq(bin(j->pieces[i]->start_key), at))
            return false;
        at = bin(j->pieces[i]->end_key);
        if (at.len == 0)
            return i + 1 == j->n_pieces;
    }
    return false;
}

static st_code add_piece(bk_job *j, pb_piece *p) {
    pb_piece **v = realloc(j->pieces, (j->n_pieces + 1) * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    v[j->n_pieces++] = p;
    j->pieces = v;
    return ST_OK;
}

static pb_piece *piece_unpack(bk_job *j, st_slice msg) {
    ProtobufCAllocator al = {arena_alloc, arena_free, &j->arena};
    return (pb_piece *)btu_pb_unpack(&strata__internal__v1__backup_piece__descriptor, &al, msg,
                                     NULL);
}

static void create_round(void *arg);
static void create_finish(bk_job *j);

static bool fatal_code(st_code c) {
    return c == ST_INVALID_ARGUMENT || c == ST_UNIMPLEMENTED || c == ST_INTERNAL ||
           c == ST_DATA_LOSS || c == ST_PERMISSION_DENIED || c == ST_ALREADY_EXISTS;
}

/* After a round: done, another round, or failed for good. */
static void create_next(bk_job *j) {
    if (covered(j)) {
        create_finish(j);
        return;
    }
    if (st_mono_us() - j->progress_us > (int64_t)RTR_BK_STALL_MS * 1000 &&
        j->last_err.code == ST_RESOURCE_EXHAUSTED) { /* a node out of disk: its words, whole */
        job_fail(j, ST_RESOURCE_EXHAUSTED, "%s", j->last_err.msg);
        return;
    }
    if (st_mono_us() - j->progress_us > (int64_t)RTR_BK_STALL_MS * 1000) {
        job_fail(j, j->last_err.code ? j->last_err.code : ST_UNAVAILABLE,
                 "no node froze the rest of table %s in cluster %s for %d s (a node down or "
                 "the table's tablets unreachable): %s; retry the backup once every node of "
                 "the cluster is up",
                 j->table, j->cluster->topo->id, RTR_BK_STALL_MS / 1000,
                 j->last_err.msg[0] ? j->last_err.msg : "no tablet covers the rest");
        return;
    }
    j->pending++;
    if (rtr_later_add(j->r, RTR_BK_RETRY_MS, create_round, j) != ST_OK) {
        j->pending--;
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
}

static void freeze_done(rtr_fan *f, void *arg) {
    bk_job *j = arg;
    st_code fatal = ST_OK;
    for (size_t i = 0; i < f->n; i++) {
        rtr_fan_res *res = &f->res[i];
        size_t off = 0;
        st_slice msg;
        pb_piece *p = NULL;
        if (res->code == ST_OK && rtr_fan_next_msg(res, &off, &msg) && (p = piece_unpack(j, msg)) &&
            !frozen_overlap(j, bin(p->start_key), bin(p->end_key))) {
            p->node_num = j->freeze[i].node->num;
            if (add_piece(j, p) == ST_OK)
                j->progress_us = st_mono_us();
            continue;
        }
        if (res->code == ST_OK)
            continue; /* unreadable or overlapping: the range is frozen again next round */
        j->last_err = res->err;
        j->last_err.code = res->code;
        j->retried++;
        if (fatal_code(res->code) && !st_is_not_owner(res->code, res->err.msg))
            fatal = res->code;
    }
    rtr_fan_free(f);
    if (!job_back(j))
        return;
    if (fatal != ST_OK) {
        job_fail(j, fatal, "freezing a tablet of %s on a node failed: %s", j->table,
                 j->last_err.msg);
        return;
    }
    if (!job_cancelled(j))
        create_next(j);
}

static void create_refreshed(void *arg) {
    bk_job *j = arg;
    if (!job_back(j) || job_cancelled(j))
        return;
    if (!rtr_meta_find(&j->r->meta, RTR_META_KIND_TABLE, j->table)) {
        job_fail(j, ST_NOT_FOUND, "table %s was deleted while it was being backed up", j->table);
        return;
    }
    const rtr_tmap_table *t = rtr_tmap_find(j->cluster->map, j->table);
    j->rounds++;
    free(j->freeze);
    j->freeze = calloc(t && t->n ? t->n : 1, sizeof *j->freeze);
    j->n_freeze = 0;
    if (!j->freeze) {
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; t && i < t->n; i++)
        if (!frozen_overlap(j, t->v[i].start, t->v[i].end))
            j->freeze[j->n_freeze++] = (bk_freeze){t->v[i].start, t->v[i].end, t->v[i].id,
                                                   &j->cluster->nodes[t->v[i].node]};
    if (j->n_freeze == 0) {
        create_next(j);
        return;
    }
    rtr_fan *f = rtr_fan_new(j->r, j->n_freeze, RTR_BK_CALL_TIMEOUT_MS, freeze_done, j);
    if (!f) {
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    j->pending++;
    for (size_t i = 0; i < j->n_freeze; i++) {
        char piece[64];
        snprintf(piece, sizeof piece, "n%u-t%" PRIu64, j->freeze[i].node->num, j->freeze[i].id);
        Strata__Internal__V1__BackupTabletRequest req;
        strata__internal__v1__backup_tablet_request__init(&req);
        req.tablet_id = j->freeze[i].id;
        req.backup = j->backup;
        req.piece = piece;
        req.incarnation = j->op_name; /* a leftover piece of an earlier making is not reused */
        uint8_t buf[RTR_BK_NAME_MAX + RTR_OP_NAME_MAX + 128];
        size_t len = strata__internal__v1__backup_tablet_request__pack(&req, buf);
        rtr_fan_call(f, i, j->freeze[i].node, RTR_NODE "BackupTablet", st_slice_make(buf, len));
    }
    rtr_fan_seal(f);
}

static void create_round(void *arg) {
    bk_job *j = arg;
    if (!job_back(j) || job_cancelled(j))
        return;
    j->pending++;
    if (rtr_cluster_refresh(j->cluster, create_refreshed, j) != ST_OK) {
        j->pending--;
        create_next(j);
    }
}

/* ---- finishing CREATE and COPY: the READY record ---- */

static void ready_op_written(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK) {
        job_fail(j, code, "could not record the finished backup: %s",
                 msg ? msg : st_code_name(code));
        return;
    }
    size_t len = google__bigtable__admin__v2__backup__get_packed_size(j->rec->backup);
    uint8_t *b = st_arena_alloc(&j->arena, len ? len : 1);
    if (b)
        google__bigtable__admin__v2__backup__pack(j->rec->backup, b);
    job_end(j, ST_OK, NULL, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Backup",
            st_slice_make(b, b ? len : 0));
}

static void ready_record(bk_job *j) {
    /* Deleted meanwhile (DeleteBackup through another router): not brought back. */
    const rtr_meta_rec *cur = rtr_meta_find(&j->r->meta, RTR_META_KIND_BACKUP, j->backup);
    if (!cur) {
        job_fail(j, ST_CANCELLED, "backup %s was deleted while it was being created", j->backup);
        return;
    }
    rtr_pb_bkrec *now = rtr_bk_rec_unpack(st_slice_make(cur->pb, cur->len), &j->arena);
    if (now && now->backup->expire_time) /* UpdateBackup meanwhile */
        j->rec->backup->expire_time = now->backup->expire_time;
    j->rec->backup->size_bytes = rtr_bk_stored_bytes(j->pieces, j->n_pieces);
    j->rec->backup->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
    j->rec->pieces = j->pieces;
    j->rec->n_pieces = j->n_pieces;
    st_buf pb;
    st_buf_init(&pb);
    if (rtr_bk_rec_pack(j->rec, &pb) != ST_OK) {
        st_buf_free(&pb);
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_slice s = st_buf_slice(&pb);
    j->pending++;
    rtr_meta_write(j->r, RTR_META_KIND_BACKUP, j->backup, &s, ready_op_written, j);
    st_buf_free(&pb);
}

static void create_finish(bk_job *j) {
    Google__Protobuf__Timestamp *end = st_arena_alloc(&j->arena, sizeof *end);
    if (!end) {
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    btu_cs_time_set(end, st_wall_us());
    j->rec->backup->end_time = end;
    ((Google__Bigtable__Admin__V2__CreateBackupMetadata *)j->md)->end_time = end;
    st_log(ST_LOG_INFO, "router",
           "backup %s: %zu pieces frozen in %u rounds (%u tablets split, moved or retried)",
           j->backup, j->n_pieces, j->rounds, j->retried);
    ready_record(j);
}

/* ---- tasks: PullBackupPiece and CreateTablet(restore), RTR_BK_PARALLEL at a time ---- */

static void tasks_pump(bk_job *j);
static void restore_tasks_done(bk_job *j);

static st_code task_request(bk_task *t, st_buf *out, const char **path) {
    bk_job *j = t->job;
    const pb_piece *p = (j->kind == BK_COPY ? j->src : j->rec)->pieces[t->piece];
    const char *src_name = (j->kind == BK_COPY ? j->src : j->rec)->backup->name;
    ProtobufCMessage *m;
    Strata__Internal__V1__GrantBackupReadRequest grant;
    Strata__Internal__V1__PullBackupPieceRequest pull;
    Strata__Internal__V1__CreateTabletRequest ct;
    if (t->stage == TASK_GRANT) {
        strata__internal__v1__grant_backup_read_request__init(&grant);
        grant.backup = (char *)src_name;
        grant.piece = p->piece;
        m = &grant.base;
        *path = RTR_NODE "GrantBackupRead";
    } else if (t->stage == TASK_PULL) {
        strata__internal__v1__pull_backup_piece_request__init(&pull);
        pull.source = t->from->addr;
        pull.source_backup = (char *)src_name;
        pull.piece = p->piece;
        pull.backup = (char *)t->as;
        pull.incarnation = j->op_name;
        pull.ticket = t->ticket;
        m = &pull.base;
        *path = RTR_NODE "PullBackupPiece";
    } else {
        strata__internal__v1__create_tablet_request__init(&ct);
        ct.table_name = j->table;
        ct.start_key = p->start_key;
        ct.end_key = p->end_key;
        ct.restore_backup = (char *)t->as;
        ct.restore_piece = p->piece;
        m = &ct.base;
        *path = RTR_NODE "CreateTablet";
    }
    size_t len = protobuf_c_message_get_packed_size(m);
    st_buf_reset(out);
    if (st_buf_reserve(out, len + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = protobuf_c_message_pack(m, out->data);
    return ST_OK;
}

static rtr_node *task_node(const bk_task *t) {
    return t->stage == TASK_GRANT ? t->from : t->to;
}

static const char *task_method(const bk_task *t) {
    return t->stage == TASK_GRANT  ? "GrantBackupRead"
           : t->stage == TASK_PULL ? "PullBackupPiece"
                                   : "CreateTablet";
}

static void task_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    bk_task *t = arg;
    st_buf_reset(&t->resp);
    st_buf_append(&t->resp, msg.data, msg.len);
}

static void task_start(void *arg);

/* The ticket of GrantBackupRead's answer into t->ticket. */
static st_code task_take_ticket(bk_task *t) {
    st_err err = {0};
    Strata__Internal__V1__GrantBackupReadResponse *r =
        (void *)btu_pb_unpack(&strata__internal__v1__grant_backup_read_response__descriptor, NULL,
                              st_buf_slice(&t->resp), &err);
    if (!r)
        return ST_INTERNAL;
    bool fits = strlen(r->ticket) < sizeof t->ticket;
    if (fits)
        snprintf(t->ticket, sizeof t->ticket, "%s", r->ticket);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return fits ? ST_OK : ST_INTERNAL;
}

static void task_stage_done(bk_task *t) {
    bk_job *j = t->job;
    /* A ticket is no progress: a pull that keeps failing (its node down), each retry after a
     * fresh ticket, must still end the job after RTR_BK_STALL_MS without progress. */
    bool granted = t->stage == TASK_GRANT;
    if (t->stage == TASK_GRANT) {
        if (task_take_ticket(t) != ST_OK) {
            job_fail(j, ST_INTERNAL, "node %s answered GrantBackupRead with an unreadable ticket",
                     t->from->addr);
            return;
        }
        t->stage = TASK_PULL;
    } else if (j->kind == BK_COPY) {
        pb_piece *p = piece_unpack(j, st_buf_slice(&t->resp));
        if (!p || add_piece(j, p) != ST_OK) {
            job_fail(j, ST_INTERNAL, "node %s answered PullBackupPiece with an unreadable piece",
                     t->to->addr);
            return;
        }
        p->node_num = t->to->num;
        t->stage = TASK_DONE;
    } else {
        t->stage++;
    }
    if (!granted)
        j->progress_us = st_mono_us();
    if (t->stage == TASK_DONE) {
        j->done_tasks++;
        job_progress(j, j->done_tasks, j->n_tasks + 1);
    }
}

/* The id at the end of a backup's name. */
static const char *id_of(const char *name) {
    const char *s = strrchr(name, '/');
    return s ? s + 1 : name;
}

/* A task's call failed for good: a fatal code, NOT_FOUND, or no progress for RTR_BK_STALL_MS. */
static void task_fail(bk_task *t, const rpc_ccall *call, st_code code, const char *msg) {
    bk_job *j = t->job;
    const rtr_pb_bkrec *src = j->kind == BK_COPY ? j->src : j->rec;
    const char *step = task_method(t);
    const char *piece = src->pieces[t->piece]->piece;
    if (code == ST_NOT_FOUND) {
        /* the piece is gone from its node (a node never loses a sealed piece by itself), so
         * retrying for the stall bound only delays the same answer */
        job_fail(j, code,
                 "%s of piece %s on node %s failed: %s (the backup is damaged: delete it with "
                 "`strata backup delete %s` and back the table up again)",
                 step, piece, task_node(t)->addr, msg ? msg : st_code_name(code),
                 id_of(src->backup->name));
        return;
    }
    if (fatal_code(code)) {
        job_fail(j, code, "%s of piece %s on node %s failed: %s", step, piece, task_node(t)->addr,
                 msg ? msg : st_code_name(code));
        return;
    }
    /* Given up: the connection's own words ("reconnecting in N ms") would read as if it still
     * tried, so a call that found no connection says only that. */
    const char *what = j->kind == BK_COPY ? "copy" : "restore";
    job_fail(j, code,
             "%s of piece %s on node %s made no progress for %d s, so the %s stopped (last "
             "error: %s); start that node again (`strata status` shows which nodes are down; "
             "`strata up` restarts those of a local instance) and retry the %s: what it made "
             "is removed, so the same %s can be used",
             step, piece, task_node(t)->addr, RTR_BK_STALL_MS / 1000, what,
             !call && code == ST_UNAVAILABLE ? "the node is unreachable"
                                             : (msg ? msg : st_code_name(code)),
             what, j->kind == BK_COPY ? "backup id" : "table id");
}

static void task_done(rpc_ccall *call, st_code code, const char *msg, void *arg) {
    (void)call;
    bk_task *t = arg;
    bk_job *j = t->job;
    if (!job_back(j))
        return;
    if (code == ST_ALREADY_EXISTS && t->stage == TASK_CREATE)
        code = ST_OK; /* the tablet of an earlier attempt of this step */
    if (code == ST_UNIMPLEMENTED && t->stage == TASK_GRANT) {
        st_buf_reset(&t->resp); /* a node of a build before read tickets reads without one */
        code = ST_OK;
    }
    if (code == ST_OK && !j->failing) {
        task_stage_done(t);
    } else if (!j->failing && !fatal_code(code) && code != ST_NOT_FOUND && ++t->attempts &&
               st_mono_us() - j->progress_us <= (int64_t)RTR_BK_STALL_MS * 1000) {
        /* a node restarting or a piece busy: again, until nothing progressed for the bound; a
         * pull with a new ticket (the source may have restarted and forgotten the old one) */
        if (t->stage == TASK_PULL)
            t->stage = TASK_GRANT;
        j->pending++;
        if (rtr_later_add(j->r, rtr_backoff_ms(t->attempts), task_start, t) == ST_OK)
            return;
        j->pending--;
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    } else if (!j->failing) {
        task_fail(t, call, code, msg);
    }
    if (j->failing) {
        job_fail(j, j->fail_code, "%s", j->fail_msg);
        return;
    }
    if (t->stage < TASK_DONE) {
        j->pending++;
        task_start(t);
        return;
    }
    tasks_pump(j);
}

static void task_start(void *arg) {
    bk_task *t = arg;
    bk_job *j = t->job;
    if (!job_back(j))
        return;
    if (j->failing) {
        job_fail(j, j->fail_code, "%s", j->fail_msg);
        return;
    }
    st_buf req;
    st_buf_init(&req);
    const char *path;
    st_err err = {0};
    rpc_ccall *c = NULL;
    if (task_request(t, &req, &path) == ST_OK)
        c = rtr_node_call(task_node(t), path, st_buf_slice(&req), NULL, 0, RTR_BK_CALL_TIMEOUT_MS,
                          task_msg, task_done, t, &err);
    st_buf_free(&req);
    j->pending++;
    if (!c) /* as if the call had failed: retried with backoff */
        task_done(NULL, err.code ? err.code : ST_UNAVAILABLE, err.msg[0] ? err.msg : NULL, t);
}

static void tasks_pump(bk_job *j) {
    if (job_cancelled(j))
        return;
    while (j->next_task < j->n_tasks && j->pending < RTR_BK_PARALLEL) {
        bk_task *t = &j->tasks[j->next_task++];
        j->pending++;
        task_start(t);
        if (j->failing)
            return;
    }
    if (j->done_tasks < j->n_tasks || j->pending)
        return;
    if (j->kind == BK_COPY)
        ready_record(j);
    else
        restore_tasks_done(j);
}

/* ---- CopyBackup ---- */

static void copy_run(bk_job *j) {
    rtr_pb_bkrec *s = j->src;
    rtr_cluster *src_c = NULL;
    size_t ci;
    char id[RTR_BK_ID_MAX + 1];
    if (rtr_bk_parse_name(&j->r->topo, s->backup->name, &ci, id, sizeof id, NULL) == ST_OK)
        src_c = &j->r->clusters[ci];
    j->tasks = calloc(s->n_pieces ? s->n_pieces : 1, sizeof *j->tasks);
    size_t *slot = st_arena_alloc(&j->arena, (s->n_pieces ? s->n_pieces : 1) * sizeof *slot);
    if (!j->tasks || !src_c || !slot) {
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_bk_place(s->pieces, s->n_pieces, j->cluster->n_nodes, slot); /* sharers together */
    for (size_t i = 0; i < s->n_pieces; i++) {
        bk_task *t = &j->tasks[j->n_tasks++];
        *t = (bk_task){.job = j, .piece = i, .as = j->backup, .stage = TASK_GRANT};
        st_buf_init(&t->resp);
        t->from = rtr_bk_node(src_c, s->pieces[i]->node_num);
        t->to = &j->cluster->nodes[slot[i]];
        if (!t->from) {
            job_fail(j, ST_FAILED_PRECONDITION,
                     "node %u holding piece %s of backup %s is no longer in the topology",
                     s->pieces[i]->node_num, s->pieces[i]->piece, s->backup->name);
            return;
        }
    }
    tasks_pump(j);
}

/* ---- RestoreTable ---- */

static void restore_step(bk_job *j);

static void restore_again(void *arg) {
    bk_job *j = arg;
    if (job_back(j) && !job_cancelled(j))
        restore_step(j);
}

static void restore_fan_done(rtr_fan *f, void *arg) {
    bk_job *j = arg;
    st_err err = {0};
    st_code rc = j->step == 1 ? rtr_fan_first_error(f, &err) : ST_OK; /* drops: best effort */
    rtr_fan_free(f);
    if (!job_back(j) || job_cancelled(j))
        return;
    bool stalled = st_mono_us() - j->progress_us > (int64_t)RTR_BK_STALL_MS * 1000;
    if (rc != ST_OK && (fatal_code(rc) || stalled)) {
        job_fail(j, rc,
                 "could not install the schema of %s on every node (retry the restore once every "
                 "node is back; `strata status` shows which is down): %s",
                 j->table, err.msg);
        return;
    }
    if (rc != ST_OK) { /* a node restarting: the step again, after a pause */
        j->pending++;
        if (rtr_later_add(j->r, RTR_BK_RETRY_MS, restore_again, j) != ST_OK) {
            j->pending--;
            job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        }
        return;
    }
    j->progress_us = st_mono_us();
    j->step++;
    restore_step(j);
}

/* Step 0: DropTable of the target on every node; step 1: PutTable with the new schema. */
static void restore_fan(bk_job *j) {
    rtr_ctx *r = j->r;
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += r->clusters[c].n_nodes;
    st_buf req;
    st_buf_init(&req);
    st_code rc;
    if (j->step == 0) {
        Strata__Internal__V1__DropTableRequest d;
        strata__internal__v1__drop_table_request__init(&d);
        d.name = j->table;
        rc = st_buf_reserve(&req, RTR_TABLE_NAME_MAX + 16);
        if (rc == ST_OK)
            req.len = strata__internal__v1__drop_table_request__pack(&d, req.data);
    } else {
        rc = rtr_wire_put_bytes(&req, 1, st_buf_slice(&j->schema)); /* PutTableRequest.table */
    }
    rtr_fan *f = rc == ST_OK ? rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, restore_fan_done, j) : NULL;
    if (!f) {
        st_buf_free(&req);
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    j->pending++;
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            rtr_fan_call(f, k++, &r->clusters[c].nodes[i],
                         j->step == 0 ? RTR_NODE "DropTable" : RTR_NODE "PutTable",
                         st_buf_slice(&req));
    st_buf_free(&req);
    rtr_fan_seal(f);
}

/* One task per piece per cluster: restored on the holder in the backup's cluster, pulled onto a
 * node (rtr_bk_place) and restored there in every other cluster. */
static void restore_tasks(bk_job *j) {
    rtr_ctx *r = j->r;
    rtr_pb_bkrec *s = j->rec;
    j->tasks = calloc(s->n_pieces * r->n_clusters + 1, sizeof *j->tasks);
    char *names = st_arena_alloc(&j->arena, r->n_clusters * (RTR_BK_NAME_MAX + 1));
    size_t *slot = st_arena_alloc(&j->arena, (s->n_pieces ? s->n_pieces : 1) * sizeof *slot);
    if (!j->tasks || !names || !slot) {
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t c = 0; c < r->n_clusters; c++) {
        rtr_cluster *cl = &r->clusters[c];
        char *as = names + c * (RTR_BK_NAME_MAX + 1);
        if (cl == j->cluster)
            snprintf(as, RTR_BK_NAME_MAX + 1, "%s", s->backup->name);
        else
            temp_name(j, cl, as, RTR_BK_NAME_MAX + 1);
        if (cl != j->cluster) /* pieces sharing a file pulled onto one node, linked there */
            rtr_bk_place(s->pieces, s->n_pieces, cl->n_nodes, slot);
        for (size_t i = 0; i < s->n_pieces; i++) {
            bk_task *t = &j->tasks[j->n_tasks++];
            *t = (bk_task){.job = j, .piece = i, .as = as, .stage = TASK_CREATE};
            st_buf_init(&t->resp);
            rtr_node *holder = rtr_bk_node(j->cluster, s->pieces[i]->node_num);
            if (!holder) {
                job_fail(j, ST_FAILED_PRECONDITION,
                         "node %u holding piece %s of backup %s is no longer in the topology",
                         s->pieces[i]->node_num, s->pieces[i]->piece, s->backup->name);
                return;
            }
            t->to = cl == j->cluster ? holder : &cl->nodes[slot[i]];
            if (cl != j->cluster) {
                t->from = holder;
                t->stage = TASK_GRANT;
            }
        }
    }
    tasks_pump(j);
}

static void restore_end(bk_job *j) {
    if (j->progress)
        j->progress->progress_percent = 100;
    if (j->progress && !j->progress->end_time) {
        j->progress->end_time = st_arena_alloc(&j->arena, sizeof *j->progress->end_time);
        if (j->progress->end_time)
            btu_cs_time_set(j->progress->end_time, st_wall_us());
    }
    job_end(j, ST_OK, NULL, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Table",
            st_buf_slice(&j->schema));
}

static void temp_deleted(rtr_fan *f, void *arg) {
    bk_job *j = arg;
    cleanup_fan_errors(j, f, 1);
    rtr_fan_free(f);
    if (job_back(j))
        restore_end(j);
}

/* DeleteBackupPieces of the restore's temporary pieces on the nodes of every cluster but the
 * target's (every cluster when it is not known: where none were pulled the node has none).
 * False when no call was made (nothing to do, or out of memory). */
static bool temp_delete(bk_job *j, void (*done)(rtr_fan *, void *)) {
    rtr_ctx *r = j->r;
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += &r->clusters[c] == j->cluster ? 0 : r->clusters[c].n_nodes;
    rtr_fan *f = n ? rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, done, j) : NULL;
    if (!f)
        return false;
    j->pending++;
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++) {
        if (&r->clusters[c] == j->cluster)
            continue;
        char name[RTR_BK_NAME_MAX + 1];
        uint8_t buf[RTR_BK_NAME_MAX + 64];
        temp_name(j, &r->clusters[c], name, sizeof name);
        size_t blen = pack_delete_pieces(name, buf, sizeof buf);
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            rtr_fan_call(f, k++, &r->clusters[c].nodes[i], RTR_NODE "DeleteBackupPieces",
                         st_slice_make(buf, blen));
    }
    rtr_fan_seal(f);
    return true;
}

static void restore_refreshed(void *arg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    /* The temporary pieces' files are linked into the tablets: the pieces can go. */
    if (!temp_delete(j, temp_deleted))
        restore_end(j);
}

static void restore_recorded(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK) {
        job_fail(j, code, "could not record table %s: %s", j->table,
                 msg ? msg : st_code_name(code));
        return;
    }
    st_log(ST_LOG_INFO, "router", "restored table=%s from backup %s (%zu pieces)", j->table,
           j->backup, j->rec->n_pieces);
    j->pending++;
    if (rtr_refresh_all(j->r, restore_refreshed, j) != ST_OK)
        restore_refreshed(j); /* the pending count it takes is the one above */
}

static void restore_tasks_done(bk_job *j) {
    if (rtr_meta_find(&j->r->meta, RTR_META_KIND_TABLE, j->table)) {
        job_fail(j, ST_ALREADY_EXISTS, "table %s was created by another request meanwhile",
                 j->table);
        return;
    }
    st_slice pb = st_buf_slice(&j->schema);
    j->pending++;
    rtr_meta_write(j->r, RTR_META_KIND_TABLE, j->table, &pb, restore_recorded, j);
}

static void restore_step(bk_job *j) {
    if (j->step < 2) {
        restore_fan(j);
        return;
    }
    job_progress(j, 1, j->rec->n_pieces * j->r->n_clusters + 1);
    restore_tasks(j);
}

/* ---- cleanup of a dead router's operation (BK_REAP) ---- */

/* A restore whose router stopped after recording the table: its temporary pieces were perhaps
 * not deleted yet (they hold links to the table's files and no call names them), so they are
 * deleted now, and the operation ends with the table. */
static void reap_temp_deleted(rtr_fan *f, void *arg) {
    bk_job *j = arg;
    cleanup_fan_errors(j, f, 1);
    rtr_fan_free(f);
    if (!job_back(j))
        return;
    job_end(j, ST_OK, NULL, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Table",
            st_buf_slice(&j->schema));
}

/* The operation holds the name (checked by reap_run): committed work is its response, the rest
 * is removed as a failure's. */
static void reap_owned(bk_job *j) {
    const char *why = "the router running this operation stopped (restart, crash or lost "
                      "connection) before it finished; its partial work was removed: retry the "
                      "request";
    if (j->kind == BK_CREATE || j->kind == BK_COPY) {
        rtr_pb_bkrec *cur = rtr_bk_find(j->r, j->backup, &j->arena);
        if (cur && cur->backup->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY) {
            size_t len = google__bigtable__admin__v2__backup__get_packed_size(cur->backup);
            uint8_t *b = st_arena_alloc(&j->arena, len ? len : 1);
            if (b)
                google__bigtable__admin__v2__backup__pack(cur->backup, b);
            job_end(j, ST_OK, NULL, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Backup",
                    st_slice_make(b, b ? len : 0));
            return;
        }
    } else {
        const rtr_meta_rec *t = rtr_meta_find(&j->r->meta, RTR_META_KIND_TABLE, j->table);
        if (t) { /* the record was written: the restore committed */
            st_buf_reset(&j->schema);
            if (st_buf_append(&j->schema, t->pb, t->len) != ST_OK ||
                !temp_delete(j, reap_temp_deleted))
                job_end(j, ST_OK, NULL, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Table",
                        st_slice_make(t->pb, t->len));
            return;
        }
    }
    job_fail(j, ST_ABORTED, "%s", why);
}

static void reap_owner_checked(bk_job *j, st_code code, const char *msg, bool found, bool mine) {
    const char *name = j->kind == BK_RESTORE ? j->table : j->backup;
    if (code != ST_OK) { /* not reaped: the next sweep tries again */
        st_log(ST_LOG_WARN, "router",
               "operation %s: its router is gone, but %s %s could not be read in the first "
               "cluster (%s); finishing it at a later sweep",
               j->op_name, owner_what(j), name, msg ? msg : st_code_name(code));
        job_free(j);
        return;
    }
    if (mine) {
        reap_owned(j);
        return;
    }
    st_log(ST_LOG_WARN, "router", "operation %s: %s %s %s: nothing of it is removed", j->op_name,
           owner_what(j), name, found ? "names another operation" : "is not there");
    char why[RTR_OP_NAME_MAX + 300];
    snprintf(why, sizeof why,
             "the router running this operation stopped before it finished, and %s is not "
             "this operation's (it was refused, or another operation holds the name): nothing "
             "was removed; retry the request",
             name);
    job_end(j, ST_ABORTED, why, NULL, st_slice_make(NULL, 0));
}

/* An operation whose router is gone: one that was refused (another operation won the name, its
 * own record survived its router) or whose name went to another operation since must not
 * remove that one's work (owner_check): it ends ABORTED with nothing removed. */
static void reap_run(bk_job *j) {
    owner_check(j, reap_owner_checked);
}

/* ---- starting ---- */

static bk_job *job_new(rtr_ctx *r, bk_kind kind, const char *op, const char *backup,
                       const char *table) {
    bk_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->r = r;
    j->kind = kind;
    st_arena_init(&j->arena, 16384);
    st_buf_init(&j->schema);
    j->op_name = strdup(op);
    j->backup = backup ? strdup(backup) : NULL;
    j->table = table ? strdup(table) : NULL;
    const char *slash = strrchr(op, '/');
    char temp[64];
    snprintf(temp, sizeof temp, "restore-%s", slash ? slash + 1 : "0");
    j->temp = strdup(temp);
    j->progress_us = st_mono_us();
    if (!j->op_name || (backup && !j->backup) || (table && !j->table) || !j->temp) {
        job_free(j);
        return NULL;
    }
    j->next = r->bk->jobs;
    r->bk->jobs = j;
    return j;
}

static ProtobufCMessage *md_unpack(bk_job *j, st_slice meta) {
    ProtobufCAllocator al = {arena_alloc, arena_free, &j->arena};
    const ProtobufCMessageDescriptor *d =
        j->kind == BK_CREATE ? &google__bigtable__admin__v2__create_backup_metadata__descriptor
        : j->kind == BK_COPY ? &google__bigtable__admin__v2__copy_backup_metadata__descriptor
                             : &google__bigtable__admin__v2__restore_table_metadata__descriptor;
    ProtobufCMessage *m = btu_pb_unpack(d, &al, meta, NULL);
    if (m && j->kind == BK_COPY)
        j->progress = ((Google__Bigtable__Admin__V2__CopyBackupMetadata *)m)->progress;
    if (m && j->kind == BK_RESTORE)
        j->progress = ((Google__Bigtable__Admin__V2__RestoreTableMetadata *)m)->progress;
    return m;
}

static void job_run(bk_job *j) {
    switch (j->kind) {
    case BK_CREATE:
        j->pending++;
        create_round(j);
        break;
    case BK_COPY:
        copy_run(j);
        break;
    case BK_RESTORE:
        restore_step(j);
        break;
    default:
        reap_run(j);
    }
}

static void answer(bk_job *j) {
    st_buf op;
    st_buf_init(&op);
    st_code rc = op_bytes(j, false, ST_OK, NULL, NULL, st_slice_make(NULL, 0), &op);
    if (rc == ST_OK) {
        rtr_ops_put(rtr_inst_of(j->r)->ops, j->op_name, st_buf_slice(&op));
        rc = rpc_call_send(j->call, st_buf_slice(&op));
    }
    rpc_call_finish(j->call, rc, rc == ST_OK ? NULL : "could not send the response");
    j->call = NULL;
    st_buf_free(&op);
}

static void refused_op_deleted(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    (void)code;
    (void)msg;
    if (job_back(j))
        job_free(j);
}

static void stale_unclaimed(void *arg, st_code code, const char *msg) {
    char *op = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "releasing the table claim of finished operation %s: %s", op,
               msg ? msg : st_code_name(code));
    free(op);
}

/* A restore found its table id claimed: a claim naming a restore of that table that has ended
 * (its release failed, e.g. the first cluster was unreachable then) is released now, so the
 * client's retry succeeds; a claim of a running restore stays (the release compares the name). */
static void release_stale_claims(bk_job *j) {
    rtr_ctx *r = j->r;
    char prefix[RTR_OP_NAME_MAX + 1];
    snprintf(prefix, sizeof prefix, "operations/%s/", j->table);
    size_t n = strlen(prefix);
    for (size_t i = 0; i < r->meta.n_ops; i++) {
        const rtr_meta_rec *m = &r->meta.ops[i];
        st_slice pb;
        if (strncmp(m->name, prefix, n) || !strcmp(m->name, j->op_name) ||
            !rtr_bk_op_of_record(st_slice_make(m->pb, m->len), &pb))
            continue;
        Google__Longrunning__Operation *o =
            google__longrunning__operation__unpack(NULL, pb.len, (const uint8_t *)pb.data);
        bool done = o && o->done;
        if (o)
            google__longrunning__operation__free_unpacked(o, NULL);
        char *name = done ? strdup(m->name) : NULL;
        if (name)
            rtr_bk_unclaim(r, j->table, name, stale_unclaimed, name);
    }
}

/* The backup's record or the restore's claim could not be created (another router took the
 * name first, or the first cluster is unreachable): nothing was done on the nodes, so there is
 * nothing to clean; the call fails and the operation's record goes. */
static void job_refused(bk_job *j, st_code code, const char *msg) {
    char why[640];
    if (code == ST_ALREADY_EXISTS && j->kind == BK_RESTORE)
        snprintf(why, sizeof why,
                 "table \"%s\" already exists (or is being created or restored): restore "
                 "into a new table id",
                 j->table);
    else if (code == ST_ALREADY_EXISTS)
        snprintf(why, sizeof why, "Backup %s already exists.", j->backup);
    else
        snprintf(why, sizeof why, "%s", msg ? msg : st_code_name(code));
    if (code == ST_ALREADY_EXISTS && j->kind == BK_RESTORE)
        release_stale_claims(j);
    char *mine = j->kind == BK_RESTORE && code != ST_ALREADY_EXISTS ? strdup(j->op_name) : NULL;
    if (mine) /* the claim may have been taken though its answer was lost */
        rtr_bk_unclaim(j->r, j->table, mine, stale_unclaimed, mine);
    rpc_call_finish(j->call, code, why);
    j->call = NULL;
    j->finished = true;
    rtr_ops_delete(rtr_inst_of(j->r)->ops, j->op_name);
    j->pending++;
    rtr_meta_write(j->r, RTR_META_KIND_OP, j->op_name, NULL, refused_op_deleted, j);
}

/* The backup's record (CREATE, COPY) or the claim on the table id (RESTORE) is written. */
static void start_rec_written(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK) {
        job_refused(j, code, msg);
        return;
    }
    answer(j);
    job_run(j);
}

static void start_op_written(void *arg, st_code code, const char *msg) {
    bk_job *j = arg;
    if (!job_back(j))
        return;
    if (code != ST_OK) {
        rpc_call_finish(j->call, code, msg ? msg : "could not record the operation");
        j->call = NULL;
        job_free(j);
        return;
    }
    if (j->kind == BK_RESTORE) {
        j->pending++;
        rtr_bk_reserve_table(j->r, j->table, j->op_name, start_rec_written, j);
        return;
    }
    st_buf pb;
    st_buf_init(&pb);
    if (rtr_bk_rec_pack(j->rec, &pb) != ST_OK) {
        st_buf_free(&pb);
        job_fail(j, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_slice s = st_buf_slice(&pb);
    j->pending++;
    rtr_bk_meta_create(j->r, RTR_META_KIND_BACKUP, j->backup, s, start_rec_written, j);
    st_buf_free(&pb);
}

void rtr_bk_job_start(rtr_ctx *r, const bk_job_spec *s) {
    bk_job *j = job_new(r, s->kind, s->op_name, s->backup, s->table);
    if (j) {
        j->cluster = s->cluster;
        j->call = s->call;
        j->start_us = s->start_us;
        j->created_us = s->start_us;
        j->md_type = s->meta_type;
        j->md = md_unpack(j, s->meta);
        j->rec = rtr_bk_rec_unpack(s->rec, &j->arena);
        if (s->kind == BK_COPY)
            j->src = rtr_bk_rec_unpack(s->schema, &j->arena);
        else if (s->kind == BK_RESTORE)
            st_buf_append(&j->schema, s->schema.data, s->schema.len);
    }
    if (!j || !j->md || !j->rec || (s->kind == BK_COPY && !j->src) ||
        (s->kind == BK_RESTORE && j->schema.len != s->schema.len)) {
        if (j) {
            j->call = NULL;
            job_free(j);
        }
        rtr_fail(s->call, ST_RESOURCE_EXHAUSTED, "out of memory starting operation %s", s->op_name);
        return;
    }
    st_buf op;
    st_buf_init(&op);
    if (op_bytes(j, false, ST_OK, NULL, NULL, st_slice_make(NULL, 0), &op) != ST_OK) {
        st_buf_free(&op);
        j->call = NULL;
        job_free(j);
        rtr_fail(s->call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    j->pending++;
    rtr_bk_op_store(r, j->op_name, st_buf_slice(&op), false, j->created_us, start_op_written, j);
    st_buf_free(&op);
}

/* ---- reaping ---- */

void rtr_bk_reap(rtr_ctx *r, const char *op_name, st_slice op_rec) {
    if (job_by_op(r, op_name))
        return;
    Strata__Internal__V1__OperationRecord *rec = (void *)btu_pb_unpack(
        &strata__internal__v1__operation_record__descriptor, NULL, op_rec, NULL);
    Google__Longrunning__Operation *op = rec ? rec->operation : NULL;
    const char *type = op && op->metadata ? op->metadata->type_url : "";
    bk_kind kind = strstr(type, "CreateBackupMetadata")   ? BK_CREATE
                   : strstr(type, "CopyBackupMetadata")   ? BK_COPY
                   : strstr(type, "RestoreTableMetadata") ? BK_RESTORE
                                                          : BK_REAP;
    bk_job *j = NULL;
    if (kind != BK_REAP)
        j = job_new(r, kind, op_name, NULL, NULL);
    if (j) {
        j->md_type = type[0] ? type : NULL;
        j->md = md_unpack(j, st_slice_make(op->metadata->value.data, op->metadata->value.len));
        j->md_type = j->md ? st_arena_dup(&j->arena, type, strlen(type) + 1) : NULL;
        j->created_us = rec->created_us;
    }
    const char *target = NULL;
    if (j && j->md && j->md_type)
        target =
            kind == BK_CREATE ? ((Google__Bigtable__Admin__V2__CreateBackupMetadata *)j->md)->name
            : kind == BK_COPY ? ((Google__Bigtable__Admin__V2__CopyBackupMetadata *)j->md)->name
                              : ((Google__Bigtable__Admin__V2__RestoreTableMetadata *)j->md)->name;
    size_t ci = 0;
    char id[RTR_BK_ID_MAX + 1];
    st_code rc = ST_INTERNAL;
    if (target && kind != BK_RESTORE) {
        rc = rtr_bk_parse_name(&r->topo, target, &ci, id, sizeof id, NULL);
        j->backup = rc == ST_OK ? strdup(target) : NULL;
        rc = j->backup ? ST_OK : ST_INTERNAL;
    } else if (target) {
        size_t bci;
        const char *src =
            ((Google__Bigtable__Admin__V2__RestoreTableMetadata *)j->md)->backup_info
                ? ((Google__Bigtable__Admin__V2__RestoreTableMetadata *)j->md)->backup_info->backup
                : "";
        rc = rtr_bk_parse_name(&r->topo, src, &bci, id, sizeof id, NULL);
        ci = bci;
        j->table = rc == ST_OK ? strdup(target) : NULL;
        rc = j->table ? ST_OK : ST_INTERNAL;
    }
    if (rec)
        protobuf_c_message_free_unpacked(&rec->base, NULL);
    if (!j)
        return;
    if (rc != ST_OK) {
        st_log(ST_LOG_WARN, "router", "operation %s: unreadable record, left as it is", op_name);
        job_free(j);
        return;
    }
    j->kind = kind;
    j->cluster = &r->clusters[ci];
    st_log(ST_LOG_WARN, "router", "operation %s: its router is gone; finishing it", op_name);
    reap_run(j);
}
