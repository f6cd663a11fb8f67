/* backup_admin.c — strata.internal.v1.BackupAdmin, the router's side of `strata backup export`
 * and `import` (docs/backups.md): where the pieces of a backup are (DescribeBackup), and the
 * record of an imported backup, CREATING while the CLI sends the files to the nodes
 * (BeginImport) and READY once every piece is sealed where planned (FinishImport). An import
 * never finished is deleted by the sweep after RTR_BK_IMPORT_KEEP_US (backup_ops.c). */
#include "backup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/cstoken.h"

typedef Strata__Internal__V1__BackupPiece pb_piece;

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *p) {
    (void)data;
    (void)p;
}

static rtr_pb_bkrec *find_or_fail(rtr_ctx *r, rpc_call *call, const char *name, size_t *ci) {
    char id[RTR_BK_ID_MAX + 1];
    st_err err = {0};
    if (rtr_bk_parse_name(&r->topo, name, ci, id, sizeof id, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return NULL;
    }
    rtr_pb_bkrec *rec = rtr_bk_find(r, name, rpc_call_arena(call));
    if (!rec || !rtr_bk_shown(r, rec)) {
        rtr_fail(call, ST_NOT_FOUND, "Backup %s not found.", name);
        return NULL;
    }
    return rec;
}

/* The layout answer: the record's backup, schema and pieces with their nodes' addresses. */
static void reply_layout(rtr_ctx *r, rpc_call *call, rtr_pb_bkrec *rec, size_t ci) {
    st_arena *a = rpc_call_arena(call);
    Strata__Internal__V1__BackupLayout out;
    strata__internal__v1__backup_layout__init(&out);
    out.backup = rec->backup;
    out.schema = rec->schema;
    out.pieces = st_arena_alloc(a, (rec->n_pieces + 1) * sizeof *out.pieces);
    if (!out.pieces) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < rec->n_pieces; i++) {
        Strata__Internal__V1__PieceLocation *pl = st_arena_alloc(a, sizeof *pl);
        rtr_node *n = rtr_bk_node(&r->clusters[ci], rec->pieces[i]->node_num);
        if (!pl) {
            rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        strata__internal__v1__piece_location__init(pl);
        pl->piece = rec->pieces[i];
        pl->node = n ? n->addr : (char *)"";
        out.pieces[out.n_pieces++] = pl;
    }
    rtr_reply(call, &out.base);
}

/* ---- a backup not READY ---- */

/* An import's record: CREATING without an operation (CreateBackup and CopyBackup name theirs). */
static bool import_unfinished(const rtr_pb_bkrec *rec) {
    return (!rec->operation || !rec->operation[0]) &&
           rec->backup->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
}

/* The command that deletes backup `name`: `strata backup` takes the topology's first cluster
 * unless given --cluster, so a backup of another cluster is named with it (without it the
 * command looks in the first cluster and answers NOT_FOUND). */
static void delete_cmd(const rtr_ctx *r, const char *name, char *out, size_t cap) {
    const char *cl = strstr(name, "/clusters/"), *id = strrchr(name, '/');
    size_t n = cl ? strcspn(cl + 10, "/") : 0;
    bool first = !cl || (strlen(r->topo.clusters[0].id) == n &&
                         !strncmp(cl + 10, r->topo.clusters[0].id, n));
    if (first)
        snprintf(out, cap, "`strata backup delete %s`", id ? id + 1 : name);
    else
        snprintf(out, cap, "`strata backup --cluster %.*s delete %s`", (int)n, cl + 10,
                 id ? id + 1 : name);
}

/* An import still CREATING may be running (another CLI importing now) or cut short, and one cut
 * short never becomes READY; its age lets the operator tell which before deleting it, since
 * nothing else does. err: "<what> <name><tail>: ..." with code; running: what to do while that
 * import runs. */
static st_code import_advice(const rtr_ctx *r, const rtr_pb_bkrec *rec, st_code code,
                             const char *what, const char *tail, const char *running, st_err *err) {
    char del[RTR_BK_NAME_MAX + 64];
    delete_cmd(r, rec->backup->name, del, sizeof del);
    return st_err_set(err, code,
                      "%s %s%s: an import of it began %lld s ago and has not finished (state "
                      "CREATING). If that import is still running, %s; if it was cut short it "
                      "never becomes READY: delete it with %s and import again (an unfinished "
                      "import is deleted 24 h after it began)",
                      what, rec->backup->name, tail,
                      (long long)((st_wall_us() - rec->created_us) / 1000000), running, del);
}

st_code rtr_bk_not_ready(const rtr_ctx *r, const rtr_pb_bkrec *rec, const char *then, st_err *err) {
    if (!import_unfinished(rec))
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "backup %s is still being created (state CREATING): %s once it is "
                          "READY (GetBackup shows its state)",
                          rec->backup->name, then);
    char running[128];
    snprintf(running, sizeof running, "%s once it is READY", then);
    return import_advice(r, rec, ST_FAILED_PRECONDITION, "backup", "", running, err);
}

void rtr_h_describe_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Strata__Internal__V1__DescribeBackupRequest *req =
        (void *)rtr_unpack(call, &strata__internal__v1__describe_backup_request__descriptor, bytes);
    size_t ci;
    rtr_pb_bkrec *rec = req ? find_or_fail(r, call, req->name, &ci) : NULL;
    if (!rec)
        return;
    if (rec->backup->state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY) {
        st_err err = {0};
        rtr_bk_not_ready(r, rec, "export it", &err);
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    reply_layout(r, call, rec, ci);
}

/* ---- BeginImport ---- */

static bool piece_id_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '-' || s[i] == '_' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return false;
    return true;
}

static int piece_cmp(const void *a, const void *b) {
    const pb_piece *x = *(pb_piece *const *)a, *y = *(pb_piece *const *)b;
    return st_slice_cmp(st_slice_make(x->start_key.data, x->start_key.len),
                        st_slice_make(y->start_key.data, y->start_key.len));
}

static int piece_id_cmp(const void *a, const void *b) {
    return strcmp((*(pb_piece *const *)a)->piece, (*(pb_piece *const *)b)->piece);
}

/* Valid ids, none twice. Sorted by id in a copy, so that an export of 100,000 pieces costs
 * n log n comparisons: comparing every pair kept the router's loop (every client's calls) busy
 * for seconds. */
static st_code check_piece_ids(pb_piece **v, size_t n, st_err *err) {
    pb_piece **by_id = malloc(n * sizeof *by_id);
    if (!by_id)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(by_id, v, n * sizeof *by_id);
    qsort(by_id, n, sizeof *by_id, piece_id_cmp);
    st_code rc = ST_OK;
    for (size_t i = 0; i < n && rc == ST_OK; i++) {
        if (!piece_id_valid(by_id[i]->piece))
            rc = st_err_set(err, ST_INVALID_ARGUMENT,
                            "invalid piece id '%s': use 1-64 of [A-Za-z0-9_-]", by_id[i]->piece);
        else if (i > 0 && strcmp(by_id[i - 1]->piece, by_id[i]->piece) == 0)
            rc = st_err_set(err, ST_INVALID_ARGUMENT, "piece id '%s' appears twice",
                            by_id[i]->piece);
    }
    free(by_id);
    return rc;
}

/* Each piece's size_bytes becomes the sum of its files' sizes, whatever the request said: the
 * backup's size_bytes adds them up, and a sum past INT64_MAX (or a client's own figure) would
 * show as a negative or absurd size in GetBackup and ListBackups filters. */
static st_code sum_piece_sizes(pb_piece **v, size_t n, st_err *err) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sum = 0;
        for (size_t j = 0; j < v[i]->n_files; j++) {
            sum += v[i]->files[j]->size;
            if (v[i]->files[j]->size > INT64_MAX || sum > INT64_MAX || total + sum > INT64_MAX)
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "the file sizes add up past 2^63-1 bytes at file %s of piece "
                                  "%s: the export's manifest is damaged or forged",
                                  v[i]->files[j]->name, v[i]->piece);
        }
        v[i]->size_bytes = sum;
        total += sum;
    }
    return ST_OK;
}

/* Each run of adjacent pieces that hold no file (v sorted by range) becomes its first piece,
 * stretched to the run's end, frozen at the run's latest instant; *n shrinks. A restore makes a
 * tablet of each piece, and an export of a table split into many empty ranges (or a forged one)
 * asked one node for tens of thousands of tablets that hold nothing. */
static void merge_empty(pb_piece **v, size_t *n) {
    size_t out = 0;
    for (size_t i = 0; i < *n; i++) {
        pb_piece *last = out ? v[out - 1] : NULL;
        if (last && last->n_files == 0 && v[i]->n_files == 0) {
            last->end_key = v[i]->end_key;
            if (v[i]->frozen_us > last->frozen_us)
                last->frozen_us = v[i]->frozen_us;
            continue;
        }
        v[out++] = v[i];
    }
    *n = out;
}

/* Pieces with valid distinct ids that cover the key space exactly once, their sizes summed,
 * runs of empty ones merged, at most RTR_BK_IMPORT_PIECES_MAX left. */
static st_code check_pieces(pb_piece **v, size_t *np, st_err *err) {
    size_t n = *np;
    if (n == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "an import needs at least one piece");
    if (check_piece_ids(v, n, err) != ST_OK || sum_piece_sizes(v, n, err) != ST_OK)
        return err->code;
    qsort(v, n, sizeof *v, piece_cmp);
    st_slice at = st_slice_make(NULL, 0);
    for (size_t i = 0; i < n; i++) {
        if (!st_slice_eq(st_slice_make(v[i]->start_key.data, v[i]->start_key.len), at) ||
            (i > 0 && at.len == 0))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "the pieces do not cover the key space exactly once (piece '%s' "
                              "starts where no piece ends): the export's manifest is damaged",
                              v[i]->piece);
        at = st_slice_make(v[i]->end_key.data, v[i]->end_key.len);
    }
    if (at.len)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the pieces do not reach the end of the key space: the export's "
                          "manifest is damaged");
    merge_empty(v, np);
    if (*np > RTR_BK_IMPORT_PIECES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the export's %zu pieces are still %zu once runs of empty ones are "
                          "merged: a restore makes a tablet of each, and an import takes at most "
                          "%d (what an export holds at most): the export's manifest is damaged or "
                          "forged",
                          n, *np, RTR_BK_IMPORT_PIECES_MAX);
    return ST_OK;
}

typedef struct imp_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_pb_bkrec *rec; /* call arena */
    size_t cluster;
    bool finish;
    st_buf pb;
    struct imp_op *next; /* BeginImport: in r->bk->imports until its record is written */
} imp_op;

/* The record of a BeginImport reaches r->meta only when its write completes: until then its
 * name is in r->bk->imports, so a second BeginImport (or CreateBackup) of it meanwhile is
 * ALREADY_EXISTS instead of both importing into the same pieces. */
bool rtr_bk_import_pending(rtr_ctx *r, const char *backup) {
    for (imp_op *o = r->bk ? r->bk->imports : NULL; o; o = o->next)
        if (strcmp(o->rec->backup->name, backup) == 0)
            return true;
    return false;
}

static void imp_unlist(imp_op *op) {
    for (imp_op **p = op->r->bk ? &op->r->bk->imports : NULL; p && *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            return;
        }
}

static void imp_written(void *arg, st_code code, const char *msg) {
    imp_op *op = arg;
    imp_unlist(op);
    if (code == ST_ALREADY_EXISTS && !op->finish) /* another router's import or backup won */
        rtr_fail(op->call, code,
                 "Backup %s already exists (created through another router meanwhile): import "
                 "under another id (--as ID)",
                 op->rec->backup->name);
    else if (code != ST_OK)
        rtr_fail(op->call, code, "could not record backup %s: %s", op->rec->backup->name,
                 msg ? msg : st_code_name(code));
    else if (op->finish)
        rtr_reply(op->call, &op->rec->backup->base);
    else
        reply_layout(op->r, op->call, op->rec, op->cluster);
    if (op->finish)
        rtr_gate_leave(op->r, op->call); /* FinishImport held the backup's gate */
    st_buf_free(&op->pb);
    free(op);
}

static void imp_store(rtr_ctx *r, rpc_call *call, rtr_pb_bkrec *rec, size_t ci, bool finish) {
    imp_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (imp_op){r, call, rec, ci, finish, {0}, NULL};
    st_buf_init(&op->pb);
    if (!finish && r->bk) {
        op->next = r->bk->imports;
        r->bk->imports = op;
    }
    if (rtr_bk_rec_pack(rec, &op->pb) != ST_OK) {
        imp_written(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_slice s = st_buf_slice(&op->pb);
    if (finish)
        rtr_meta_write(r, RTR_META_KIND_BACKUP, rec->backup->name, &s, imp_written, op);
    else /* only if no router recorded that id first */
        rtr_bk_meta_create(r, RTR_META_KIND_BACKUP, rec->backup->name, s, imp_written, op);
}

/* The times and type of the imported backup, as the CLI's manifest check (ops/backup_check.c)
 * has them: a client that skipped it must not record a backup that ends before it starts.
 * BACKUP_TYPE_UNSPECIFIED stays accepted (STANDARD) for clients that predate the field. */
static st_code import_fields(const rtr_pb_backup *b, st_err *err) {
    int64_t st = rtr_bk_ts_us(b->start_time), en = rtr_bk_ts_us(b->end_time);
    if (!b->start_time || st <= 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup.start_time must be set, after 1970 (from the export's manifest: "
                          "export it again)");
    if (!b->end_time || en < st)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup.end_time (%lld us) is before backup.start_time (%lld us): the "
                          "export's manifest is damaged or forged; export it again",
                          (long long)en, (long long)st);
    if (b->backup_type !=
            GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__BACKUP_TYPE_UNSPECIFIED &&
        b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD &&
        b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup.backup_type %d is not STANDARD (1) or HOT (2): the export's "
                          "manifest is damaged or forged; export it again",
                          (int)b->backup_type);
    return ST_OK;
}

/* ALREADY_EXISTS for a backup id that has a record (import_advice for an unfinished import). */
static st_code import_exists(const rtr_ctx *r, const rtr_meta_rec *m, const char *name,
                             st_err *err) {
    st_arena a;
    st_arena_init(&a, 4096);
    rtr_pb_bkrec *rec = rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), &a);
    if (rec && import_unfinished(rec))
        import_advice(r, rec, ST_ALREADY_EXISTS, "Backup", " already exists",
                      "let it end or import under another id (--as ID)", err);
    else
        st_err_set(err, ST_ALREADY_EXISTS,
                   "Backup %s already exists: import under another id (--as ID)", name);
    st_arena_deinit(&a);
    return ST_ALREADY_EXISTS;
}

static st_code import_check(rtr_ctx *r, Strata__Internal__V1__BeginImportRequest *req, size_t *ci,
                            char *name, size_t cap, st_err *err) {
    if (rtr_bk_parse_cluster(&r->topo, req->parent, false, ci, err) != ST_OK)
        return err->code;
    if (!rtr_bk_id_valid(req->backup_id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup id '%s': use 1-%d of [-_.a-zA-Z0-9], starting with a "
                          "letter, a digit or '_' (import --as ID)",
                          req->backup_id, RTR_BK_ID_MAX);
    snprintf(name, cap, "%s/backups/%s", req->parent, req->backup_id);
    if (rtr_bk_job_of_backup(r, name) || rtr_bk_import_pending(r, name))
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "Backup %s is being made or imported right now: import under another "
                          "id (--as ID)",
                          name);
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name);
    if (m)
        return import_exists(r, m, name, err);
    if (!req->backup || !req->schema)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup and schema must be set (from the export's manifest)");
    if (import_fields(req->backup, err) != ST_OK)
        return err->code;
    st_err why = {0};
    if (btu_schema_check(req->schema, &why) != ST_OK) /* else every restore of it would fail */
        return st_err_set(err, why.code,
                          "schema: %s (no table could have it: the export's manifest is damaged "
                          "or forged; export it again)",
                          why.msg);
    return check_pieces(req->pieces, &req->n_pieces, err);
}

void rtr_h_begin_import(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Strata__Internal__V1__BeginImportRequest *req =
        (void *)rtr_unpack(call, &strata__internal__v1__begin_import_request__descriptor, bytes);
    if (!req)
        return;
    st_arena *a = rpc_call_arena(call);
    char *name = st_arena_alloc(a, RTR_BK_NAME_MAX + 1);
    size_t ci;
    st_err err = {0};
    if (!name) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t listed = req->n_pieces; /* before runs of empty pieces are merged */
    if (import_check(r, req, &ci, name, RTR_BK_NAME_MAX + 1, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    int64_t now = st_wall_us();
    rtr_pb_backup *b = req->backup;
    Google__Protobuf__Timestamp *exp = st_arena_alloc(a, sizeof *exp);
    if (!exp) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    int64_t e = rtr_bk_ts_us(b->expire_time);
    if (e < now + RTR_BK_EXPIRE_MIN_US || e > now + RTR_BK_EXPIRE_MAX_US)
        e = now + RTR_BK_IMPORT_EXPIRE_US; /* past or out of bounds here: 7 days from now */
    btu_cs_time_set(exp, e);
    b->name = name;
    b->expire_time = exp;
    b->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    b->source_backup = (char *)"";
    if (b->backup_type == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__BACKUP_TYPE_UNSPECIFIED)
        b->backup_type = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD;
    if (b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT)
        b->hot_to_standard_time = NULL; /* kept as exported for a HOT one, even if past */
    rtr_cluster *c = &r->clusters[ci];
    for (size_t i = 0; i < req->n_pieces; i++)
        req->pieces[i]->backup = name;
    size_t *slot = st_arena_alloc(a, (req->n_pieces ? req->n_pieces : 1) * sizeof *slot);
    if (!slot) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_bk_place(req->pieces, req->n_pieces, c->n_nodes, slot); /* sharers together */
    for (size_t i = 0; i < req->n_pieces; i++)
        req->pieces[i]->node_num = c->nodes[slot[i]].num;
    b->size_bytes = rtr_bk_stored_bytes(req->pieces, req->n_pieces);
    rtr_pb_bkrec *rec = st_arena_alloc(a, sizeof *rec);
    if (!rec) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    strata__internal__v1__backup_record__init(rec);
    rec->backup = b;
    rec->schema = req->schema;
    rec->pieces = req->pieces;
    rec->n_pieces = req->n_pieces;
    rec->operation = (char *)"";
    rec->created_us = now;
    st_log(ST_LOG_INFO, "router",
           "import of backup %s: begun (%zu pieces, %zu once runs of empty ones are merged)", name,
           listed, req->n_pieces);
    imp_store(r, call, rec, ci, false);
}

/* ---- FinishImport ---- */

typedef struct fin_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_pb_bkrec *rec;
    size_t cluster;
} fin_op;

static bool files_equal(const pb_piece *a, const pb_piece *b) {
    if (a->n_files != b->n_files)
        return false;
    for (size_t i = 0; i < a->n_files; i++) {
        const Strata__Internal__V1__BackupFile *x = a->files[i], *y = NULL;
        for (size_t k = 0; k < b->n_files && !y; k++)
            if (strcmp(b->files[k]->name, x->name) == 0)
                y = b->files[k];
        if (!y || y->size != x->size || y->crc32c != x->crc32c)
            return false;
    }
    return true;
}

typedef Strata__Internal__V1__ListBackupPiecesResponse pb_listed;

/* Each node's answer, unpacked once with its pieces sorted by id (NULL: no answer): looking up
 * every piece in a fresh unpack of its node's whole list cost n^2 for an import of n pieces. */
static pb_listed **listed_by_node(rtr_fan *f, size_t n_nodes, st_arena *a) {
    pb_listed **v = st_arena_alloc(a, (n_nodes ? n_nodes : 1) * sizeof *v);
    ProtobufCAllocator al = {arena_alloc, arena_free, a};
    for (size_t i = 0; v && i < n_nodes; i++) {
        size_t off = 0;
        st_slice msg;
        v[i] = f->res[i].code == ST_OK && rtr_fan_next_msg(&f->res[i], &off, &msg)
                   ? (void *)btu_pb_unpack(
                         &strata__internal__v1__list_backup_pieces_response__descriptor, &al, msg,
                         NULL)
                   : NULL;
        if (v[i] && v[i]->n_pieces > 1) /* a node holding none answers pieces NULL */
            qsort(v[i]->pieces, v[i]->n_pieces, sizeof *v[i]->pieces, piece_id_cmp);
    }
    return v;
}

/* The sealed piece id in a node's sorted answer, or NULL. */
static const pb_piece *sealed(const pb_listed *l, const char *id) {
    size_t lo = 0, hi = l ? l->n_pieces : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(l->pieces[mid]->piece, id);
        if (c == 0)
            return l->pieces[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void fin_listed(rtr_fan *f, void *arg) {
    fin_op *op = arg;
    rtr_pb_bkrec *rec = op->rec;
    rtr_cluster *c = &op->r->clusters[op->cluster];
    st_arena *a = rpc_call_arena(op->call);
    pb_listed **listed = listed_by_node(f, c->n_nodes, a);
    for (size_t i = 0; i < rec->n_pieces; i++) {
        const pb_piece *want = rec->pieces[i];
        rtr_node *n = rtr_bk_node(c, want->node_num);
        const pb_piece *got = n && listed ? sealed(listed[n->idx], want->piece) : NULL;
        if (!got || !files_equal(want, got)) {
            rtr_fail(op->call, ST_FAILED_PRECONDITION,
                     "piece %s of backup %s is %s on node %s: send its files again (or delete "
                     "the backup and import again)",
                     want->piece, rec->backup->name,
                     !n                             ? "planned on a node no longer in the topology"
                     : f->res[n->idx].code != ST_OK ? "not readable"
                     : !got                         ? "not sealed"
                                                    : "sealed with other files than planned",
                     n ? n->addr : "?");
            rtr_gate_leave(op->r, op->call);
            rtr_fan_free(f);
            free(op);
            return;
        }
    }
    rtr_fan_free(f);
    rec->backup->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
    Google__Protobuf__Timestamp *t = st_arena_alloc(a, sizeof *t);
    if (t && !rec->backup->end_time) {
        btu_cs_time_set(t, st_wall_us());
        rec->backup->end_time = t;
    }
    st_log(ST_LOG_INFO, "router", "import of backup %s: finished", rec->backup->name);
    imp_store(op->r, op->call, rec, op->cluster, true);
    free(op);
}

/* FinishImport holding the backup's gate: false when answered without starting. */
static bool finish_start(rtr_ctx *r, rpc_call *call,
                         const Strata__Internal__V1__FinishImportRequest *req) {
    size_t ci;
    rtr_pb_bkrec *rec = find_or_fail(r, call, req->name, &ci);
    if (!rec)
        return false;
    if (rec->backup->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY ||
        rec->operation[0]) {
        rtr_fail(call, ST_FAILED_PRECONDITION, "backup %s is not an import in progress (it is %s)",
                 req->name,
                 rec->operation[0] ? "being made by CreateBackup or CopyBackup" : "READY");
        return false;
    }
    rtr_cluster *c = &r->clusters[ci];
    fin_op *op = calloc(1, sizeof *op);
    rtr_fan *f = op ? rtr_fan_new(r, c->n_nodes, RTR_ADMIN_TIMEOUT_MS, fin_listed, op) : NULL;
    if (!f) {
        free(op);
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    *op = (fin_op){r, call, rec, ci};
    Strata__Internal__V1__ListBackupPiecesRequest lr;
    strata__internal__v1__list_backup_pieces_request__init(&lr);
    lr.backup = req->name;
    uint8_t buf[RTR_BK_NAME_MAX + 16];
    size_t len = strata__internal__v1__list_backup_pieces_request__pack(&lr, buf);
    for (size_t i = 0; i < c->n_nodes; i++)
        rtr_fan_call(f, i, &c->nodes[i], RTR_NODE "ListBackupPieces", st_slice_make(buf, len));
    rtr_fan_seal(f);
    return true;
}

/* One change of a backup at a time (docs/backups.md, "Changes of one backup"): a DeleteBackup
 * answered while the pieces were being listed must not see the record written READY after it
 * (pieces gone, every restore failing), nor an UpdateBackup meanwhile be overwritten. */
void rtr_h_finish_import(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Strata__Internal__V1__FinishImportRequest *req =
        (void *)rtr_unpack(call, &strata__internal__v1__finish_import_request__descriptor, bytes);
    if (req && rtr_gate_enter(r, req->name, call, bytes, rtr_h_finish_import) &&
        !finish_start(r, call, req))
        rtr_gate_leave(r, call);
}
