/* backup.c — the backup admin API on the router: CreateBackup, GetBackup, ListBackups,
 * UpdateBackup, DeleteBackup, RestoreTable and CopyBackup (validation and records here; the work
 * of the long-running ones in backup_job.c), GetTable's cluster states, and the module's hooks.
 * docs/backups.md ("API") says what each call does and where Strata differs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* qsort_r */
#endif
#include "backup.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/cstoken.h"

typedef Google__Bigtable__Admin__V2__Table pb_table;

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *p) {
    (void)data;
    (void)p;
}

/* ---- records ---- */

rtr_pb_bkrec *rtr_bk_rec_unpack(st_slice pb, st_arena *a) {
    ProtobufCAllocator al = {arena_alloc, arena_free, a};
    rtr_pb_bkrec *rec = (rtr_pb_bkrec *)btu_pb_unpack(
        &strata__internal__v1__backup_record__descriptor, &al, pb, NULL);
    return rec && rec->backup ? rec : NULL;
}

rtr_pb_bkrec *rtr_bk_find(rtr_ctx *r, const char *name, st_arena *a) {
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name);
    return m ? rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), a) : NULL;
}

bool rtr_bk_shown(rtr_ctx *r, const rtr_pb_bkrec *rec) {
    if (rec->backup->state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING ||
        !rec->operation || !rec->operation[0])
        return true;
    st_slice op; /* as GetOperation finds it: this router's memory first, then the records */
    if (rtr_ops_get(rtr_inst_of(r)->ops, rec->operation, &op))
        return rtr_bk_visible(rec, &op);
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_OP, rec->operation);
    if (m && rtr_bk_op_of_record(st_slice_make(m->pb, m->len), &op))
        return rtr_bk_visible(rec, &op);
    /* CREATING with no operation anywhere: a compare-and-set applied after its answer was lost
     * (its creation was refused, its operation deleted); the sweep deletes it too. The operation
     * is always recorded before the backup, so a live creation is never hidden this way. */
    return false;
}

typedef struct bk_file_ref {
    uint32_t node;
    const Strata__Internal__V1__BackupFile *f;
} bk_file_ref;

static int file_ref_cmp(const void *pa, const void *pb) {
    const bk_file_ref *a = pa, *b = pb;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    int c = strcmp(a->f->name, b->f->name);
    if (c)
        return c;
    if (a->f->size != b->f->size)
        return a->f->size < b->f->size ? -1 : 1;
    return a->f->crc32c < b->f->crc32c ? -1 : a->f->crc32c > b->f->crc32c;
}

int64_t rtr_bk_stored_bytes(Strata__Internal__V1__BackupPiece *const *pieces, size_t n) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += pieces[i]->n_files;
    bk_file_ref *v = total ? malloc(total * sizeof *v) : NULL;
    uint64_t sum = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < pieces[i]->n_files; j++) {
            if (v)
                v[k++] = (bk_file_ref){pieces[i]->node_num, pieces[i]->files[j]};
            else /* out of memory: the pieces' sum, as before */
                sum += pieces[i]->files[j]->size;
        }
    if (v) {
        qsort(v, k, sizeof *v, file_ref_cmp);
        for (size_t i = 0; i < k; i++)
            if (i == 0 || file_ref_cmp(&v[i - 1], &v[i]) != 0)
                sum += v[i].f->size;
        free(v);
    }
    return sum > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)sum;
}

typedef struct place_ref {
    const Strata__Internal__V1__BackupFile *f;
    uint32_t node;
    size_t piece;
} place_ref;

static int place_ref_cmp(const void *pa, const void *pb) {
    const place_ref *a = pa, *b = pb;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    return file_ref_cmp(&(bk_file_ref){0, a->f}, &(bk_file_ref){0, b->f});
}

static size_t uf_root(size_t *up, size_t i) {
    while (up[i] != i) {
        up[i] = up[up[i]];
        i = up[i];
    }
    return i;
}

typedef struct place_group {
    size_t root;
    uint64_t bytes;
    size_t pieces;
} place_group;

static int place_group_cmp(const void *pa, const void *pb) {
    const place_group *a = pa, *b = pb;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->pieces != b->pieces)
        return a->pieces > b->pieces ? -1 : 1;
    return (a->root > b->root) - (a->root < b->root);
}

void rtr_bk_place(Strata__Internal__V1__BackupPiece *const *v, size_t n, size_t n_nodes,
                  size_t *slot) {
    size_t nref = 0;
    for (size_t i = 0; i < n; i++)
        nref += v[i]->n_files;
    size_t *up = malloc((n ? n : 1) * sizeof *up);
    place_ref *refs = malloc((nref ? nref : 1) * sizeof *refs);
    place_group *g = malloc((n ? n : 1) * sizeof *g);
    uint64_t *load = calloc(n_nodes ? n_nodes : 1, sizeof *load);
    size_t *count = calloc(n_nodes ? n_nodes : 1, sizeof *count);
    if (!up || !refs || !g || !load || !count || n_nodes == 0) {
        for (size_t i = 0; i < n; i++)
            slot[i] = n_nodes ? i % n_nodes : 0;
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        up[i] = i;
        for (size_t j = 0; j < v[i]->n_files; j++)
            refs[k++] = (place_ref){v[i]->files[j], v[i]->node_num, i};
    }
    qsort(refs, nref, sizeof *refs, place_ref_cmp);
    for (size_t i = 1; i < nref; i++)
        if (place_ref_cmp(&refs[i - 1], &refs[i]) == 0) {
            size_t a = uf_root(up, refs[i - 1].piece), b = uf_root(up, refs[i].piece);
            if (a != b) /* the root stays the group's first piece */
                up[a > b ? a : b] = a < b ? a : b;
        }
    for (size_t i = 0; i < n; i++) { /* a group's bytes and pieces at its root, which precedes it */
        size_t r = uf_root(up, i);
        g[i] = (place_group){i, 0, 0};
        g[r].pieces++;
        for (size_t j = 0; j < v[i]->n_files; j++)
            g[r].bytes += v[i]->files[j]->size;
    }
    size_t ng = 0; /* the roots, in place at the front */
    for (size_t i = 0; i < n; i++)
        if (up[i] == i)
            g[ng++] = (place_group){i, g[i].bytes, g[i].pieces};
    qsort(g, ng, sizeof *g, place_group_cmp);
    for (size_t x = 0; x < ng; x++) {
        /* Fewest bytes, then fewest pieces: each piece becomes a tablet at a restore, and pieces
         * holding nothing (all of equal bytes) went to the first node, every one of them. */
        size_t best = 0;
        for (size_t m = 1; m < n_nodes; m++)
            if (load[m] < load[best] || (load[m] == load[best] && count[m] < count[best]))
                best = m;
        load[best] += g[x].bytes;
        count[best] += g[x].pieces;
        slot[g[x].root] = best;
    }
    for (size_t i = 0; i < n; i++)
        slot[i] = slot[uf_root(up, i)];
out:
    free(up);
    free(refs);
    free(g);
    free(load);
    free(count);
}

st_code rtr_bk_rec_pack(const rtr_pb_bkrec *rec, st_buf *out) {
    size_t len = strata__internal__v1__backup_record__get_packed_size(rec);
    st_buf_reset(out);
    if (st_buf_reserve(out, len ? len : 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = strata__internal__v1__backup_record__pack(rec, out->data);
    return ST_OK;
}

rtr_node *rtr_bk_node(rtr_cluster *c, uint32_t num) {
    for (size_t i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].num == num)
            return &c->nodes[i];
    return NULL;
}

static Google__Protobuf__Timestamp *ts_new(st_arena *a, int64_t us) {
    Google__Protobuf__Timestamp *t = st_arena_alloc(a, sizeof *t);
    if (t)
        btu_cs_time_set(t, us);
    return t;
}

static void reply_pb(rpc_call *call, const ProtobufCMessage *m) {
    rtr_reply(call, m);
}

static void fail_err(rpc_call *call, const st_err *err) {
    rtr_fail(call, err->code, "%s", err->msg);
}

static void fail_not_found(rpc_call *call, const char *name) {
    rtr_fail(call, ST_NOT_FOUND, "Backup %s not found.", name);
}

/* The stored record of a backup named by a request, or NULL after failing the call. */
static rtr_pb_bkrec *rec_or_fail(rtr_ctx *r, rpc_call *call, const char *name, size_t *cluster) {
    char id[RTR_BK_ID_MAX + 1];
    st_err err = {0};
    size_t ci;
    if (rtr_bk_parse_name(&r->topo, name, &ci, id, sizeof id, &err) != ST_OK) {
        fail_err(call, &err);
        return NULL;
    }
    if (cluster)
        *cluster = ci;
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name);
    if (!m) {
        fail_not_found(call, name);
        return NULL;
    }
    rtr_pb_bkrec *rec = rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), rpc_call_arena(call));
    if (!rec)
        rtr_fail(call, ST_INTERNAL, "the stored record of backup %s is unreadable", name);
    else if (!rtr_bk_shown(r, rec)) { /* its creation failed: the record is being deleted */
        fail_not_found(call, name);
        return NULL;
    }
    return rec;
}

static bool ready_or_fail(const rtr_ctx *r, rpc_call *call, const rtr_pb_bkrec *rec,
                          const char *what) {
    if (rec->backup->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY)
        return true;
    st_err err = {0};
    rtr_bk_not_ready(r, rec, what, &err);
    rtr_fail(call, err.code, "%s", err.msg);
    return false;
}

/* ---- GetTable: cluster states ---- */

/* One GOOGLE_DEFAULT_ENCRYPTION entry, shared by every cluster state of an answer. */
static Google__Bigtable__Admin__V2__EncryptionInfo **default_encryption(st_arena *a) {
    Google__Bigtable__Admin__V2__EncryptionInfo **v = st_arena_alloc(a, sizeof *v);
    Google__Bigtable__Admin__V2__EncryptionInfo *e = st_arena_alloc(a, sizeof *e);
    if (!v || !e)
        return NULL;
    google__bigtable__admin__v2__encryption_info__init(e);
    e->encryption_type =
        GOOGLE__BIGTABLE__ADMIN__V2__ENCRYPTION_INFO__ENCRYPTION_TYPE__GOOGLE_DEFAULT_ENCRYPTION;
    v[0] = e;
    return v;
}

st_code rtr_bk_cluster_states(rtr_ctx *r, pb_table *t, st_arena *a, bool encryption) {
    size_t n = r->n_clusters;
    Google__Bigtable__Admin__V2__Table__ClusterStatesEntry **v = st_arena_alloc(a, n * sizeof *v);
    Google__Bigtable__Admin__V2__EncryptionInfo **enc = encryption ? default_encryption(a) : NULL;
    if (!v || (encryption && !enc))
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        v[i] = st_arena_alloc(a, sizeof *v[i]);
        Google__Bigtable__Admin__V2__Table__ClusterState *cs = st_arena_alloc(a, sizeof *cs);
        if (!v[i] || !cs)
            return ST_RESOURCE_EXHAUSTED;
        google__bigtable__admin__v2__table__cluster_states_entry__init(v[i]);
        google__bigtable__admin__v2__table__cluster_state__init(cs);
        cs->replication_state =
            GOOGLE__BIGTABLE__ADMIN__V2__TABLE__CLUSTER_STATE__REPLICATION_STATE__READY;
        cs->encryption_info = enc;
        cs->n_encryption_info = enc ? 1 : 0;
        v[i]->key = (char *)r->clusters[i].topo->id;
        v[i]->value = cs;
    }
    t->cluster_states = v;
    t->n_cluster_states = n;
    return ST_OK;
}

/* ---- CreateBackup ---- */

static st_code check_type(const rtr_pb_backup *b, int64_t now, st_err *err) {
    if (b->backup_type !=
            GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__BACKUP_TYPE_UNSPECIFIED &&
        b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD &&
        b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "unknown backup_type %d: use STANDARD, HOT or leave it unset",
                          (int)b->backup_type);
    if (b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT) {
        if (b->hot_to_standard_time)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "hot_to_standard_time applies to HOT backups only: set "
                              "backup_type HOT or leave it unset");
        return ST_OK;
    }
    return rtr_bk_check_hot(rtr_bk_ts_us(b->hot_to_standard_time), now, err);
}

/* ALREADY_EXISTS for a backup id in use; a record hidden because its creation failed is still
 * being deleted for a moment. */
static st_code taken(rtr_ctx *r, const char *name, st_err *err) {
    st_arena a;
    st_arena_init(&a, 4096);
    rtr_pb_bkrec *rec = rtr_bk_find(r, name, &a);
    bool hidden = rec && !rtr_bk_shown(r, rec);
    st_arena_deinit(&a);
    if (hidden)
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "Backup %s already exists: its failed creation is being cleaned up; "
                          "retry in a few seconds",
                          name);
    return st_err_set(err, ST_ALREADY_EXISTS, "Backup %s already exists.", name);
}

static st_code create_check(rtr_ctx *r, const Google__Bigtable__Admin__V2__CreateBackupRequest *req,
                            size_t *ci, char *name, size_t cap, int64_t now, st_err *err) {
    if (rtr_bk_parse_cluster(&r->topo, req->parent, false, ci, err) != ST_OK)
        return err->code;
    if (!rtr_bk_id_valid(req->backup_id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup id '%s': use 1-%d of [-_.a-zA-Z0-9], starting with a "
                          "letter, a digit or '_'",
                          req->backup_id, RTR_BK_ID_MAX);
    if (!req->backup || !req->backup->source_table || !req->backup->source_table[0])
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup.source_table must be set: the full name of the table to back "
                          "up");
    snprintf(name, cap, "%s/backups/%s", req->parent, req->backup_id);
    if (rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name) || rtr_bk_job_of_backup(r, name) ||
        rtr_bk_import_pending(r, name))
        return taken(r, name, err);
    if (rtr_check_table_name(r, req->backup->source_table, err) != ST_OK)
        return err->code;
    if (!rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, req->backup->source_table))
        return st_err_set(err, ST_NOT_FOUND, "table \"%s\" not found", req->backup->source_table);
    if (rtr_bk_check_expire(rtr_bk_ts_us(req->backup->expire_time), now, RTR_BK_EXPIRE_MAX_US,
                            err) != ST_OK)
        return err->code;
    return check_type(req->backup, now, err);
}

/* Packs a message into a fresh arena buffer. */
static st_slice pack_arena(st_arena *a, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = st_arena_alloc(a, len ? len : 1);
    if (!buf)
        return st_slice_make(NULL, 0);
    return st_slice_make(buf, protobuf_c_message_pack(m, buf));
}

void rtr_h_create_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__CreateBackupRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__create_backup_request__descriptor, bytes);
    if (!req)
        return;
    btu_pb_drop_unknown(&req->base); /* nothing stored carries what no field reads */
    st_arena *a = rpc_call_arena(call);
    int64_t now = st_wall_us();
    char name[RTR_BK_NAME_MAX + 1], op[RTR_OP_NAME_MAX + 1];
    size_t ci;
    st_err err = {0};
    /* A bare table id (the Node.js client's cluster.createBackup({table: 'id'})) names a table
     * of this instance. */
    char full[RTR_TABLE_NAME_MAX + 64];
    if (req->backup && req->backup->source_table && req->backup->source_table[0] &&
        !strchr(req->backup->source_table, '/')) {
        snprintf(full, sizeof full, "projects/%s/instances/%s/tables/%s", r->topo.project,
                 r->topo.instance, req->backup->source_table);
        req->backup->source_table = full;
    }
    if (create_check(r, req, &ci, name, sizeof name, now, &err) != ST_OK) {
        fail_err(call, &err);
        return;
    }
    const rtr_meta_rec *trec =
        rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, req->backup->source_table);
    ProtobufCAllocator al = {arena_alloc, arena_free, a};
    pb_table *schema = (pb_table *)btu_pb_unpack(&google__bigtable__admin__v2__table__descriptor,
                                                 &al, st_slice_make(trec->pb, trec->len), NULL);
    rtr_pb_backup *b = req->backup;
    b->name = name;
    b->start_time = ts_new(a, now);
    b->end_time = NULL;
    b->size_bytes = 0;
    b->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    b->source_backup = (char *)"";
    b->encryption_info = NULL;
    if (b->backup_type == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__BACKUP_TYPE_UNSPECIFIED)
        b->backup_type = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD;
    rtr_ops_name(rtr_inst_of(r)->ops, name, op);
    rtr_pb_bkrec rec;
    strata__internal__v1__backup_record__init(&rec);
    rec.backup = b;
    rec.schema = schema;
    rec.operation = op;
    rec.created_us = now;
    Google__Bigtable__Admin__V2__CreateBackupMetadata md;
    google__bigtable__admin__v2__create_backup_metadata__init(&md);
    md.name = name;
    md.source_table = b->source_table;
    md.start_time = b->start_time;
    if (!schema || !b->start_time) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED,
                 "out of memory (or the table's record is unreadable)");
        return;
    }
    bk_job_spec spec = {.kind = BK_CREATE,
                        .op_name = op,
                        .backup = name,
                        .table = b->source_table,
                        .cluster = &r->clusters[ci],
                        .rec = pack_arena(a, &rec.base),
                        .meta_type =
                            RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.CreateBackupMetadata",
                        .meta = pack_arena(a, &md.base),
                        .start_us = now,
                        .call = call};
    st_log(ST_LOG_INFO, "router", "backup %s of table=%s: started (operation %s)", name,
           b->source_table, op);
    rtr_bk_job_start(r, &spec);
}

/* ---- GetBackup, ListBackups ---- */

void rtr_h_get_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GetBackupRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__get_backup_request__descriptor, bytes);
    rtr_pb_bkrec *rec = req ? rec_or_fail(r, call, req->name, NULL) : NULL;
    if (rec)
        reply_pb(call, &rec->backup->base);
}

static int list_cmp(const void *x, const void *y, void *order) {
    return rtr_bk_order_cmp(order, *(rtr_pb_backup *const *)x, *(rtr_pb_backup *const *)y);
}

/* The backups of cluster ci (SIZE_MAX: every cluster) that pass the filter, sorted. */
static st_code list_collect(rtr_ctx *r, size_t ci, const rtr_bk_filter *f, const rtr_bk_order *o,
                            st_arena *a, rtr_pb_backup ***out, size_t *n) {
    rtr_pb_backup **v = st_arena_alloc(a, (r->meta.n_backups + 1) * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    *n = 0;
    for (size_t i = 0; i < r->meta.n_backups; i++) {
        const rtr_meta_rec *m = &r->meta.backups[i];
        size_t c;
        char id[RTR_BK_ID_MAX + 1];
        if (rtr_bk_parse_name(&r->topo, m->name, &c, id, sizeof id, NULL) != ST_OK ||
            (ci != SIZE_MAX && c != ci))
            continue;
        rtr_pb_bkrec *rec = rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), a);
        if (rec && rtr_bk_shown(r, rec) && rtr_bk_filter_match(f, rec->backup))
            v[(*n)++] = rec->backup;
    }
    qsort_r(v, *n, sizeof *v, list_cmp, (void *)o);
    *out = v;
    return ST_OK;
}

/* ListBackups page tokens (rtr_page_token_make): "b1", a CRC32C of parent, filter and order_by,
 * and a Backup holding the sort fields of the last backup returned. The next page starts after
 * where that backup sorts, so backups created or deleted between pages (the last one returned
 * included) do not shift the pages. */
#define BK_TOKEN_PREFIX "b1"

static uint32_t list_query_crc(const Google__Bigtable__Admin__V2__ListBackupsRequest *req) {
    uint32_t crc = st_crc32c(0, req->parent, strlen(req->parent) + 1);
    crc = st_crc32c(crc, req->filter, strlen(req->filter) + 1);
    return st_crc32c(crc, req->order_by, strlen(req->order_by));
}

static char *token_make(st_arena *a, uint32_t crc, const rtr_pb_backup *last) {
    rtr_pb_backup k;
    google__bigtable__admin__v2__backup__init(&k);
    k.name = last->name;
    k.source_table = last->source_table;
    k.state = last->state;
    k.start_time = last->start_time;
    k.end_time = last->end_time;
    k.expire_time = last->expire_time;
    k.size_bytes = last->size_bytes;
    st_slice pb = pack_arena(a, &k.base);
    return pb.data ? rtr_page_token_make(a, BK_TOKEN_PREFIX, crc, pb) : NULL;
}

/* The last backup of the previous page, or NULL (INVALID_ARGUMENT in err) for a token that is
 * not one of ours or belongs to another parent, filter or order_by. */
static rtr_pb_backup *token_parse(rtr_ctx *r, st_arena *a, const char *tok, uint32_t crc,
                                  st_err *err) {
    st_slice pb;
    rtr_token_rc trc = rtr_page_token_parse(a, tok, BK_TOKEN_PREFIX, crc, &pb);
    if (trc == RTR_TOKEN_OTHER) {
        st_err_set(err, ST_INVALID_ARGUMENT,
                   "page_token belongs to a listing with another parent, filter or order_by: "
                   "repeat the request of the previous page with its next_page_token");
        return NULL;
    }
    bool ok = trc == RTR_TOKEN_OK;
    ProtobufCAllocator al = {arena_alloc, arena_free, a};
    rtr_pb_backup *b = ok ? (rtr_pb_backup *)btu_pb_unpack(
                                &google__bigtable__admin__v2__backup__descriptor, &al, pb, NULL)
                          : NULL;
    size_t ci;
    char id[RTR_BK_ID_MAX + 1];
    if (b && rtr_bk_parse_name(&r->topo, b->name, &ci, id, sizeof id, NULL) == ST_OK)
        return b;
    st_err_set(err, ST_INVALID_ARGUMENT,
               "invalid page_token: pass the next_page_token of the previous page unchanged, or "
               "an empty one for the first page");
    return NULL;
}

/* The index in the sorted v of the first backup after last (NULL: 0). */
static size_t list_resume(const rtr_bk_order *o, rtr_pb_backup **v, size_t n,
                          const rtr_pb_backup *last) {
    size_t lo = 0, hi = last ? n : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rtr_bk_order_cmp(o, v[mid], last) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void rtr_h_list_backups(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ListBackupsRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__list_backups_request__descriptor, bytes);
    if (!req)
        return;
    st_arena *a = rpc_call_arena(call);
    st_err err = {0};
    size_t ci;
    rtr_bk_filter *f;
    rtr_bk_order o;
    rtr_pb_backup *last = NULL;
    uint32_t crc = list_query_crc(req);
    if (rtr_bk_parse_cluster(&r->topo, req->parent, true, &ci, &err) != ST_OK ||
        rtr_bk_filter_parse(req->filter, a, &f, &err) != ST_OK ||
        rtr_bk_order_parse(req->order_by, &o, &err) != ST_OK ||
        (req->page_token[0] && !(last = token_parse(r, a, req->page_token, crc, &err)))) {
        fail_err(call, &err);
        return;
    }
    if (req->page_size < 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "negative page_size %d: use 0 (the default, %d) or more", req->page_size,
                 RTR_BK_PAGE_MAX);
        return;
    }
    size_t max = req->page_size > 0 && req->page_size < RTR_BK_PAGE_MAX ? (size_t)req->page_size
                                                                        : RTR_BK_PAGE_MAX;
    rtr_pb_backup **v;
    size_t n;
    if (list_collect(r, ci, f, &o, a, &v, &n) != ST_OK) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t skip = list_resume(&o, v, n, last);
    Google__Bigtable__Admin__V2__ListBackupsResponse resp;
    google__bigtable__admin__v2__list_backups_response__init(&resp);
    resp.backups = v + skip;
    resp.n_backups = n - skip < max ? n - skip : max;
    if (skip + resp.n_backups < n &&
        !(resp.next_page_token = token_make(a, crc, v[skip + resp.n_backups - 1]))) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    reply_pb(call, &resp.base);
}

/* ---- UpdateBackup ---- */

typedef struct bk_write {
    rtr_ctx *r;
    rpc_call *call;
    st_buf pb;
    rtr_pb_backup *reply; /* call arena */
} bk_write;

static void update_written(void *arg, st_code code, const char *msg) {
    bk_write *w = arg;
    if (code == ST_OK)
        reply_pb(w->call, &w->reply->base);
    else
        rtr_fail(w->call, code, "could not store the backup's new expire_time: %s",
                 msg ? msg : st_code_name(code));
    rtr_gate_leave(w->r, w->call);
    st_buf_free(&w->pb);
    free(w);
}

/* UpdateBackup holding the backup's gate: false when answered without a write. */
static bool update_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__UpdateBackupRequest *req) {
    rtr_pb_bkrec *rec = rec_or_fail(r, call, req->backup->name, NULL);
    if (!rec)
        return false;
    st_err err = {0};
    bool copy = rec->backup->source_backup && rec->backup->source_backup[0];
    /* Bounded from the backup's creation (its copy or import here), as Cloud Bigtable bounds it,
     * not from now: a backup 2 days old takes at most 88 more days. */
    int64_t created = rec->created_us ? rec->created_us : st_wall_us();
    if (rtr_bk_check_expire(rtr_bk_ts_us(req->backup->expire_time), created,
                            copy ? RTR_BK_COPY_EXPIRE_MAX_US : RTR_BK_EXPIRE_MAX_US,
                            &err) != ST_OK) {
        fail_err(call, &err);
        return false;
    }
    rec->backup->expire_time = req->backup->expire_time;
    bk_write *w = calloc(1, sizeof *w);
    if (!w) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    *w = (bk_write){r, call, {0}, rec->backup};
    st_buf_init(&w->pb);
    if (rtr_bk_rec_pack(rec, &w->pb) != ST_OK) {
        update_written(w, ST_RESOURCE_EXHAUSTED, "out of memory");
        return true; /* answered, gate left */
    }
    st_slice pb = st_buf_slice(&w->pb);
    rtr_meta_write(r, RTR_META_KIND_BACKUP, rec->backup->name, &pb, update_written, w);
    return true;
}

void rtr_h_update_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__UpdateBackupRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__update_backup_request__descriptor, bytes);
    if (!req)
        return;
    btu_pb_drop_unknown(&req->base); /* nothing stored carries what no field reads */
    if (!req->backup || !req->update_mask || req->update_mask->n_paths == 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "backup (with its name) and update_mask must be set; the only field that can "
                 "be updated is expire_time");
        return;
    }
    for (size_t i = 0; i < req->update_mask->n_paths; i++)
        if (strcmp(req->update_mask->paths[i], "expire_time") != 0) {
            rtr_fail(call, ST_INVALID_ARGUMENT,
                     "update_mask path '%s' cannot be updated: the only field that can be "
                     "updated is expire_time",
                     req->update_mask->paths[i]);
            return;
        }
    /* One change of a backup at a time: an update read before a delete must not write the
     * record back after it (docs/backups.md, "Changes of one backup"). */
    if (rtr_gate_enter(r, req->backup->name, call, bytes, rtr_h_update_backup) &&
        !update_start(r, call, req))
        rtr_gate_leave(r, call);
}

/* ---- DeleteBackup ---- */

typedef struct bk_del_call {
    rtr_ctx *r;
    rpc_call *call;
} bk_del_call;

static void delete_done(void *arg, st_code code, const char *msg) {
    bk_del_call *d = arg; /* in the call's arena: read before the call is answered */
    rtr_ctx *r = d->r;
    rpc_call *call = d->call;
    if (code != ST_OK) {
        rtr_fail(call, code, "could not delete the backup's record: %s",
                 msg ? msg : st_code_name(code));
    } else {
        Google__Protobuf__Empty e;
        google__protobuf__empty__init(&e);
        reply_pb(call, &e.base);
    }
    rtr_gate_leave(r, call);
}

/* DeleteBackup holding the backup's gate: false when answered without a delete. */
static bool delete_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__DeleteBackupRequest *req) {
    rtr_pb_bkrec *rec = rec_or_fail(r, call, req->name, NULL);
    if (!rec)
        return false;
    const char *maker = rtr_bk_job_of_backup(r, req->name);
    if (!maker && rtr_bk_busy(r, req->name)) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "backup %s is being restored or copied: delete it once that operation is done "
                 "(ListOperations shows it)",
                 req->name);
        return false;
    }
    bk_del_call *d = st_arena_alloc(rpc_call_arena(call), sizeof *d);
    if (!d) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    *d = (bk_del_call){r, call};
    if (maker) /* a backup still being made: its operation stops and cleans up */
        rtr_bk_job_cancel(r, maker, "the backup was deleted while it was being created");
    st_log(ST_LOG_INFO, "router", "backup %s: deleted", req->name);
    rtr_bk_delete(r, req->name, delete_done, d);
    return true;
}

void rtr_h_delete_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__DeleteBackupRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__delete_backup_request__descriptor, bytes);
    if (req && rtr_gate_enter(r, req->name, call, bytes, rtr_h_delete_backup) &&
        !delete_start(r, call, req))
        rtr_gate_leave(r, call);
}

/* ---- RestoreTable ---- */

static st_code restore_check(rtr_ctx *r,
                             const Google__Bigtable__Admin__V2__RestoreTableRequest *req,
                             char *table, size_t cap, st_err *err) {
    if (rtr_check_instance(&r->topo, req->parent, false, err) != ST_OK) {
        if (err->code == ST_NOT_FOUND) /* one router serves one instance */
            return st_err_set(err, ST_NOT_FOUND,
                              "instance %.300s is not served by this router, which serves "
                              "projects/%s/instances/%s only: to restore into another instance, "
                              "run `strata backup restore ID --to TABLE --target HOST:PORT` with "
                              "that instance's router (or --target DIR, its `strata up` "
                              "directory)",
                              req->parent, r->topo.project, r->topo.instance);
        return err->code;
    }
    if (!btu_table_id_valid(req->table_id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid table id '%s': use 1-%d of [-_.a-zA-Z0-9], not starting "
                          "with - or .",
                          req->table_id, BTU_TABLE_ID_MAX);
    snprintf(table, cap, "%s/tables/%s", req->parent, req->table_id);
    if (rtr_check_table_name(r, table, err) != ST_OK)
        return err->code;
    if (rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, table) || rtr_bk_busy(r, table))
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "table \"%s\" already exists (or is being restored): restore into a "
                          "new table id",
                          table);
    if (req->source_case != GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP ||
        !req->backup[0])
        return st_err_set(err, ST_INVALID_ARGUMENT, "backup must be set: the full backup name");
    return ST_OK;
}

static Google__Bigtable__Admin__V2__BackupInfo *backup_info(st_arena *a, const rtr_pb_backup *b) {
    Google__Bigtable__Admin__V2__BackupInfo *bi = st_arena_alloc(a, sizeof *bi);
    if (!bi)
        return NULL;
    google__bigtable__admin__v2__backup_info__init(bi);
    bi->backup = b->name;
    bi->start_time = b->start_time;
    bi->end_time = b->end_time;
    bi->source_table = b->source_table;
    bi->source_backup = b->source_backup;
    return bi;
}

/* The new table's record: the backup's schema under the new name, with restore_info. */
static st_slice restored_schema(st_arena *a, rtr_pb_bkrec *rec, char *table,
                                Google__Bigtable__Admin__V2__BackupInfo *bi) {
    pb_table *t = rec->schema;
    Google__Bigtable__Admin__V2__RestoreInfo *ri = st_arena_alloc(a, sizeof *ri);
    if (!t || !ri)
        return st_slice_make(NULL, 0);
    google__bigtable__admin__v2__restore_info__init(ri);
    ri->source_type = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_SOURCE_TYPE__BACKUP;
    ri->source_info_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_INFO__SOURCE_INFO_BACKUP_INFO;
    ri->backup_info = bi;
    t->name = table;
    t->restore_info = ri;
    t->n_cluster_states = 0;
    t->deletion_protection = false;
    return pack_arena(a, &t->base);
}

void rtr_h_restore_table(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__RestoreTableRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__restore_table_request__descriptor, bytes);
    if (!req)
        return;
    st_arena *a = rpc_call_arena(call);
    char table[RTR_TABLE_NAME_MAX + 64], op[RTR_OP_NAME_MAX + 1];
    st_err err = {0};
    if (restore_check(r, req, table, sizeof table, &err) != ST_OK) {
        fail_err(call, &err);
        return;
    }
    size_t ci;
    rtr_pb_bkrec *rec = rec_or_fail(r, call, req->backup, &ci);
    if (!rec || !ready_or_fail(r, call, rec, "restore it"))
        return;
    int64_t now = st_wall_us();
    Google__Bigtable__Admin__V2__BackupInfo *bi = backup_info(a, rec->backup);
    Google__Bigtable__Admin__V2__OperationProgress *pr = st_arena_alloc(a, sizeof *pr);
    st_slice rec_pb = pack_arena(a, &rec->base);
    st_slice schema = bi ? restored_schema(a, rec, table, bi) : st_slice_make(NULL, 0);
    if (!bi || !pr || !schema.data || !rec_pb.data) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    google__bigtable__admin__v2__operation_progress__init(pr);
    pr->start_time = ts_new(a, now);
    Google__Bigtable__Admin__V2__RestoreTableMetadata md;
    google__bigtable__admin__v2__restore_table_metadata__init(&md);
    md.name = table;
    md.source_type = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_SOURCE_TYPE__BACKUP;
    md.source_info_case =
        GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_METADATA__SOURCE_INFO_BACKUP_INFO;
    md.backup_info = bi;
    md.progress = pr;
    rtr_ops_name(rtr_inst_of(r)->ops, table, op);
    bk_job_spec spec = {.kind = BK_RESTORE,
                        .op_name = op,
                        .backup = req->backup,
                        .table = table,
                        .cluster = &r->clusters[ci],
                        .rec = rec_pb,
                        .schema = schema,
                        .meta_type =
                            RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.RestoreTableMetadata",
                        .meta = pack_arena(a, &md.base),
                        .start_us = now,
                        .call = call};
    st_log(ST_LOG_INFO, "router", "restore of backup %s into table=%s: started (operation %s)",
           req->backup, table, op);
    rtr_bk_job_start(r, &spec);
}

/* ---- CopyBackup ---- */

static st_code copy_check(rtr_ctx *r, const Google__Bigtable__Admin__V2__CopyBackupRequest *req,
                          size_t *ci, char *name, size_t cap, st_err *err) {
    if (rtr_bk_parse_cluster(&r->topo, req->parent, false, ci, err) != ST_OK)
        return err->code;
    if (!rtr_bk_id_valid(req->backup_id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup id '%s': use 1-%d of [-_.a-zA-Z0-9], starting with a "
                          "letter, a digit or '_'",
                          req->backup_id, RTR_BK_ID_MAX);
    snprintf(name, cap, "%s/backups/%s", req->parent, req->backup_id);
    if (rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name) || rtr_bk_job_of_backup(r, name) ||
        rtr_bk_import_pending(r, name))
        return taken(r, name, err);
    return rtr_bk_check_expire(rtr_bk_ts_us(req->expire_time), st_wall_us(),
                               RTR_BK_COPY_EXPIRE_MAX_US, err);
}

void rtr_h_copy_backup(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__CopyBackupRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__copy_backup_request__descriptor, bytes);
    if (!req)
        return;
    st_arena *a = rpc_call_arena(call);
    char name[RTR_BK_NAME_MAX + 1], op[RTR_OP_NAME_MAX + 1];
    size_t ci, src_ci;
    st_err err = {0};
    if (copy_check(r, req, &ci, name, sizeof name, &err) != ST_OK) {
        fail_err(call, &err);
        return;
    }
    rtr_pb_bkrec *src = rec_or_fail(r, call, req->source_backup, &src_ci);
    if (!src || !ready_or_fail(r, call, src, "copy it"))
        return;
    if (src->backup->source_backup && src->backup->source_backup[0]) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "backup %s is itself a copy (of %s): copy the original backup instead",
                 req->source_backup, src->backup->source_backup);
        return;
    }
    int64_t now = st_wall_us();
    Google__Bigtable__Admin__V2__BackupInfo *bi = backup_info(a, src->backup);
    Google__Bigtable__Admin__V2__OperationProgress *pr = st_arena_alloc(a, sizeof *pr);
    rtr_pb_backup *b = st_arena_alloc(a, sizeof *b);
    if (!bi || !pr || !b) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_slice src_pb = pack_arena(a, &src->base);
    *b = *src->backup;
    b->name = name;
    b->source_backup = src->backup->name;
    b->expire_time = req->expire_time;
    b->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    rtr_ops_name(rtr_inst_of(r)->ops, name, op);
    rtr_pb_bkrec rec;
    strata__internal__v1__backup_record__init(&rec);
    rec.backup = b;
    rec.schema = src->schema;
    rec.operation = op;
    rec.created_us = now;
    google__bigtable__admin__v2__operation_progress__init(pr);
    pr->start_time = ts_new(a, now);
    Google__Bigtable__Admin__V2__CopyBackupMetadata md;
    google__bigtable__admin__v2__copy_backup_metadata__init(&md);
    md.name = name;
    md.source_backup_info = bi;
    md.progress = pr;
    bk_job_spec spec = {.kind = BK_COPY,
                        .op_name = op,
                        .backup = name,
                        .table = src->backup->name, /* the source backup, for rtr_bk_busy */
                        .cluster = &r->clusters[ci],
                        .rec = pack_arena(a, &rec.base),
                        .schema = src_pb,
                        .meta_type =
                            RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.CopyBackupMetadata",
                        .meta = pack_arena(a, &md.base),
                        .start_us = now,
                        .call = call};
    (void)src_ci;
    st_log(ST_LOG_INFO, "router", "copy of backup %s to %s: started (operation %s)",
           req->source_backup, name, op);
    rtr_bk_job_start(r, &spec);
}

/* ---- the module ---- */

typedef struct method {
    const char *path;
    rpc_handler_fn fn;
} method;

static const method methods[] = {
    {RTR_TA "CreateBackup", rtr_h_create_backup}, {RTR_TA "GetBackup", rtr_h_get_backup},
    {RTR_TA "ListBackups", rtr_h_list_backups},   {RTR_TA "UpdateBackup", rtr_h_update_backup},
    {RTR_TA "DeleteBackup", rtr_h_delete_backup}, {RTR_TA "RestoreTable", rtr_h_restore_table},
    {RTR_TA "CopyBackup", rtr_h_copy_backup},     {RTR_BA "DescribeBackup", rtr_h_describe_backup},
    {RTR_BA "BeginImport", rtr_h_begin_import},   {RTR_BA "FinishImport", rtr_h_finish_import},
};

st_code rtr_bk_open(rtr_ctx *r, st_err *err) {
    if (!(r->bk = calloc(1, sizeof *r->bk)))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st_code rc = rpc_server_add_method(r->rpc, methods[i].path, methods[i].fn, r);
        if (rc != ST_OK)
            return st_err_set(err, rc, "registering %s failed", methods[i].path);
    }
    return ST_OK;
}

static void sweep_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_ctx *r = arg;
    if (!r->closing)
        rtr_bk_sweep(r);
}

st_code rtr_bk_start(rtr_ctx *r, st_err *err) {
    rtr_bk *bk = r->bk;
    bk->started_us = st_wall_us();
    const char *ahead = getenv(RTR_BK_TEST_EXPIRY_ENV);
    if (ahead && atoll(ahead) > 0) {
        bk->expiry_ahead_us = atoll(ahead) * 1000000;
        st_log(ST_LOG_WARN, "router",
               "%s=%s: backups expire %s seconds early (a test setting: unset it in production)",
               RTR_BK_TEST_EXPIRY_ENV, ahead, ahead);
    }
    snprintf(bk->owner, sizeof bk->owner, "%s:%u/%" PRId64, r->listen_host, r->port,
             bk->started_us);
    int64_t ms = RTR_BK_SWEEP_MS;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    bk->sweep_timer = event_new(r->base, -1, EV_PERSIST, sweep_tick, r);
    if (!bk->sweep_timer || event_add(bk->sweep_timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the backup sweep timer");
    rtr_bk_sweep(r); /* operations a previous run of this router left unfinished */
    return ST_OK;
}

void rtr_bk_close(rtr_ctx *r) {
    rtr_bk *bk = r->bk;
    if (!bk)
        return;
    rtr_bk_jobs_free(r);
    rtr_bk_leftovers_free(r);
    for (size_t i = 0; i < bk->n_creating; i++)
        free(bk->creating[i]);
    free(bk->creating);
    if (bk->sweep_timer)
        event_free(bk->sweep_timer);
    free(bk);
    r->bk = NULL;
}
