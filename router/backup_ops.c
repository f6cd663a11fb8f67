/* backup_ops.c — long-running operations of backups kept in the metadata table, and the sweep
 * (docs/backups.md, "Operations").
 *
 * An operation of CreateBackup, CopyBackup or RestoreTable is the record "op/<name>"
 * (OperationRecord): written when it starts (not done, with this router as owner and a lease),
 * rewritten every RTR_BK_SWEEP_MS while it runs (lease and progress) and when it ends (done,
 * with the response or the error). GetOperation and ListOperations read these records, so an
 * operation can be polled on any router and after a restart.
 *
 * The sweep, every RTR_BK_SWEEP_MS on every router (each step is idempotent):
 *   - renews the leases of this router's operations;
 *   - finishes an operation that is not done whose owner is an earlier run of this router, or
 *     whose lease ran out (its router died): its partial work is removed and it ends with
 *     ABORTED — unless its work had committed (backup READY, table recorded), then it ends done;
 *   - deletes backups whose expire_time passed, imports never finished after
 *     RTR_BK_IMPORT_KEEP_US, and CREATING backups whose operation is gone or failed;
 *   - forgets finished operations older than RTR_BK_OP_KEEP_US. */
#include "backup.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- operations ---- */

const char *rtr_bk_owner(rtr_ctx *r) {
    return r->bk->owner;
}

st_code rtr_bk_op_pack(const char *name, const char *meta_type, st_slice meta, bool done,
                       st_code code, const char *message, const char *resp_type, st_slice resp,
                       st_buf *out) {
    Google__Protobuf__Any md, rs;
    google__protobuf__any__init(&md);
    google__protobuf__any__init(&rs);
    md.type_url = (char *)meta_type;
    md.value = (ProtobufCBinaryData){meta.len, (uint8_t *)meta.data};
    Google__Rpc__Status st;
    google__rpc__status__init(&st);
    Google__Longrunning__Operation op;
    google__longrunning__operation__init(&op);
    op.name = (char *)name;
    op.metadata = &md;
    op.done = done;
    if (done && code != ST_OK) {
        st.code = (int32_t)code;
        st.message = (char *)(message ? message : st_code_name(code));
        op.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
        op.error = &st;
    } else if (done) {
        rs.type_url = (char *)resp_type;
        rs.value = (ProtobufCBinaryData){resp.len, (uint8_t *)resp.data};
        op.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
        op.response = &rs;
    }
    size_t len = google__longrunning__operation__get_packed_size(&op);
    st_buf_reset(out);
    if (st_buf_reserve(out, len ? len : 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__longrunning__operation__pack(&op, out->data);
    return ST_OK;
}

bool rtr_bk_op_of_record(st_slice rec, st_slice *op) {
    const uint8_t *p = rec.data, *end = rtr_slice_end(rec);
    rtr_wire_field f;
    bool bad = false, found = false;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 1 && f.wire_type == 2) {
            *op = f.bytes;
            found = true;
        }
    return found && !bad;
}

static void store_logged(void *arg, st_code code, const char *msg) {
    char *name = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "could not store operation %s: %s", name,
               msg ? msg : st_code_name(code));
    free(name);
}

void rtr_bk_op_store(rtr_ctx *r, const char *name, st_slice op, bool done_op, int64_t created_us,
                     rtr_meta_done_fn done, void *arg) {
    if (rtr_ops_put(rtr_inst_of(r)->ops, name, op) != ST_OK)
        st_log(ST_LOG_WARN, "router", "could not keep operation %s: out of memory", name);
    st_buf rec;
    st_buf_init(&rec);
    st_code rc = rtr_wire_put_bytes(&rec, 1, op);
    if (rc == ST_OK && !done_op) {
        rc = rtr_wire_put_bytes(&rec, 2, st_slice_cstr(rtr_bk_owner(r)));
        if (rc == ST_OK)
            rc = rtr_wire_put_varint(&rec, 3,
                                     (uint64_t)(st_wall_us() + (int64_t)RTR_BK_LEASE_MS * 1000));
    }
    if (rc == ST_OK)
        rc = rtr_wire_put_varint(&rec, 4, (uint64_t)created_us);
    if (!done) {
        done = store_logged;
        arg = strdup(name);
    }
    if (rc != ST_OK) {
        st_buf_free(&rec);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_slice s = st_buf_slice(&rec);
    rtr_meta_write(r, RTR_META_KIND_OP, name, &s, done, arg);
    st_buf_free(&rec);
}

/* ---- deleting a backup ---- */

typedef struct bk_del {
    rtr_ctx *r;
    char *name;
    char *incarnation; /* the record's operation: what a late delete may remove */
    size_t cluster;
    rtr_meta_done_fn done;
    void *arg;
} bk_del;

/* A delete of a backup's pieces that a node missed (down, unreachable). The router re-sends it,
 * limited to the deleted backup's making, at every sweep until the node answers: a newer backup
 * of the same id made meanwhile keeps its pieces. Kept in memory only (docs/backups.md). */
typedef struct bk_leftover {
    struct bk_leftover *next;
    char *name, *incarnation;
    size_t cluster, node;
} bk_leftover;

/* What a fan of DeleteBackupPieces works for (the request's strings). */
typedef struct del_fan {
    char *name, *incarnation;
    size_t cluster;
    bool retry; /* a late delete of one leftover */
} del_fan;

static void del_fan_free(del_fan *d) {
    if (d) {
        free(d->name);
        free(d->incarnation);
        free(d);
    }
}

static del_fan *del_fan_new(const char *name, const char *incarnation, size_t cluster) {
    del_fan *d = calloc(1, sizeof *d);
    if (d) {
        d->name = strdup(name);
        d->incarnation = strdup(incarnation ? incarnation : "");
        d->cluster = cluster;
    }
    if (d && (!d->name || !d->incarnation)) {
        del_fan_free(d);
        d = NULL;
    }
    return d;
}

static bool leftover_is(const bk_leftover *l, const char *name, const char *making, size_t cluster,
                        size_t node) {
    return l->cluster == cluster && l->node == node && strcmp(l->name, name) == 0 &&
           strcmp(l->incarnation, making) == 0;
}

void rtr_bk_leftover_note(rtr_ctx *r, const char *backup, const char *making, size_t cluster,
                          size_t node) {
    if (r->closing || !r->bk || !making || !making[0])
        return; /* nothing limits a delete without a making to the pieces that were missed */
    for (bk_leftover *l = r->bk->leftovers; l; l = l->next)
        if (leftover_is(l, backup, making, cluster, node))
            return;
    bk_leftover *l = calloc(1, sizeof *l);
    if (l && (l->name = strdup(backup)) && (l->incarnation = strdup(making))) {
        *l = (bk_leftover){r->bk->leftovers, l->name, l->incarnation, cluster, node};
        r->bk->leftovers = l;
        return;
    }
    if (l)
        free(l->name);
    free(l);
}

/* Unlinks *pp and frees it. */
static void leftover_remove(bk_leftover **pp) {
    bk_leftover *l = *pp;
    *pp = l->next;
    free(l->name);
    free(l->incarnation);
    free(l);
}

static void leftover_drop(rtr_ctx *r, const del_fan *d, size_t node) {
    for (bk_leftover **pp = &r->bk->leftovers; *pp; pp = &(*pp)->next)
        if (leftover_is(*pp, d->name, d->incarnation, d->cluster, node)) {
            leftover_remove(pp);
            return;
        }
}

void rtr_bk_leftovers_free(rtr_ctx *r) {
    while (r->bk && r->bk->leftovers)
        leftover_remove(&r->bk->leftovers);
}

static void pieces_deleted(rtr_fan *f, void *arg) {
    del_fan *d = arg;
    rtr_ctx *r = f->ctx;
    for (size_t i = 0; i < f->n; i++) {
        if (!f->res[i].node)
            continue;
        size_t node = (size_t)(f->res[i].node - r->clusters[d->cluster].nodes);
        bool keep = !r->closing && r->bk && d->incarnation[0];
        if (f->res[i].code == ST_OK && keep && d->retry) {
            st_log(ST_LOG_INFO, "router", "late delete of backup %s (making %s) on %s done",
                   d->name, d->incarnation, f->res[i].node->addr);
            leftover_drop(r, d, node);
        } else if (f->res[i].code != ST_OK && !d->retry) {
            st_log(ST_LOG_WARN, "router", "deleting the pieces of backup %s on %s failed: %s (%s)",
                   d->name, f->res[i].node->addr, f->res[i].err.msg,
                   keep ? "the sweep retries it while this router runs"
                        : "they stay on that node's disk; a later backup of the same id does "
                          "not use them, docs/backups.md");
            if (keep)
                rtr_bk_leftover_note(r, d->name, d->incarnation, d->cluster, node);
        }
    }
    rtr_fan_free(f);
    del_fan_free(d);
}

/* DeleteBackupPieces of d's backup on the nodes [from, to) of its cluster (d goes with the fan). */
static void pieces_delete(rtr_ctx *r, del_fan *d, size_t from, size_t to) {
    rtr_cluster *c = &r->clusters[d->cluster];
    Strata__Internal__V1__DeleteBackupPiecesRequest req;
    strata__internal__v1__delete_backup_pieces_request__init(&req);
    req.backup = d->name;
    req.incarnation = d->retry ? d->incarnation : "";
    uint8_t buf[RTR_BK_NAME_MAX + RTR_OP_NAME_MAX + 32];
    size_t len = strata__internal__v1__delete_backup_pieces_request__pack(&req, buf);
    rtr_fan *f = rtr_fan_new(r, to - from, RTR_ADMIN_TIMEOUT_MS, pieces_deleted, d);
    if (!f) {
        del_fan_free(d);
        return;
    }
    for (size_t i = from; i < to; i++)
        rtr_fan_call(f, i - from, &c->nodes[i], RTR_NODE "DeleteBackupPieces",
                     st_slice_make(buf, len));
    rtr_fan_seal(f);
}

/* From the sweep: every delete a node missed, again, limited to its making. */
static void leftovers_retry(rtr_ctx *r) {
    for (bk_leftover *l = r->bk->leftovers; l; l = l->next) {
        del_fan *d = del_fan_new(l->name, l->incarnation, l->cluster);
        if (!d)
            return;
        d->retry = true;
        pieces_delete(r, d, l->node, l->node + 1);
    }
}

static void del_recorded(void *arg, st_code code, const char *msg) {
    bk_del *d = arg;
    rtr_ctx *r = d->r;
    if (code == ST_OK && !r->closing) {
        del_fan *f = del_fan_new(d->name, d->incarnation, d->cluster);
        if (f)
            pieces_delete(r, f, 0, r->clusters[d->cluster].n_nodes);
    }
    if (d->done)
        d->done(d->arg, code, msg);
    free(d->name);
    free(d->incarnation);
    free(d);
}

/* The operation that made the backup's record (empty for an import or a record not found). */
static char *record_making(rtr_ctx *r, const char *name) {
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_BACKUP, name);
    st_arena a;
    st_arena_init(&a, 4096);
    rtr_pb_bkrec *rec = m ? rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), &a) : NULL;
    char *out = strdup(rec && rec->operation ? rec->operation : "");
    st_arena_deinit(&a);
    return out;
}

void rtr_bk_delete(rtr_ctx *r, const char *name, rtr_meta_done_fn done, void *arg) {
    size_t ci;
    char id[RTR_BK_ID_MAX + 1];
    bk_del *d = calloc(1, sizeof *d);
    if (d) {
        d->name = strdup(name);
        d->incarnation = record_making(r, name);
    }
    if (!d || !d->name || !d->incarnation ||
        rtr_bk_parse_name(&r->topo, name, &ci, id, sizeof id, NULL) != ST_OK) {
        if (d) {
            free(d->name);
            free(d->incarnation);
        }
        free(d);
        if (done)
            done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *d = (bk_del){r, d->name, d->incarnation, ci, done, arg};
    rtr_meta_write(r, RTR_META_KIND_BACKUP, name, NULL, del_recorded, d);
}

/* ---- the sweep ---- */

typedef struct sweep_item {
    char *name;
    int what;     /* 0 reap the operation, 1 delete the backup, 2 forget the operation */
    st_slice rec; /* reap: a copy of the record */
    uint8_t *copy;
} sweep_item;

bool rtr_bk_owner_is_past_me(const rtr_ctx *r, const char *owner) {
    const char *me = r->bk->owner;
    const char *slash = strrchr(me, '/');
    size_t n = slash ? (size_t)(slash - me) + 1 : strlen(me);
    return strncmp(owner, me, n) == 0 && strcmp(owner, me) != 0;
}

/* What to do with one operation record (-1: nothing). */
static int sweep_op(rtr_ctx *r, const rtr_meta_rec *m, int64_t now) {
    Strata__Internal__V1__OperationRecord *rec =
        (void *)btu_pb_unpack(&strata__internal__v1__operation_record__descriptor, NULL,
                              st_slice_make(m->pb, m->len), NULL);
    if (!rec)
        return -1;
    int what = -1;
    bool done = rec->operation && rec->operation->done;
    if (done && rec->created_us + RTR_BK_OP_KEEP_US < now)
        what = 2;
    else if (!done && !rtr_bk_job_exists(r, m->name) &&
             (rtr_bk_owner_is_past_me(r, rec->owner) || rec->lease_until_us < now))
        what = 0;
    protobuf_c_message_free_unpacked(&rec->base, NULL);
    return what;
}

/* Expired, an import abandoned, or CREATING without a live operation. */
static bool backup_stale(rtr_ctx *r, const rtr_meta_rec *m, int64_t now) {
    st_arena a;
    st_arena_init(&a, 4096);
    rtr_pb_bkrec *rec = rtr_bk_rec_unpack(st_slice_make(m->pb, m->len), &a);
    bool stale = false;
    if (rec && !rtr_bk_busy(r, m->name)) {
        const rtr_pb_backup *b = rec->backup;
        int64_t exp = rtr_bk_ts_us(b->expire_time);
        if (b->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY)
            stale = exp && exp < now + r->bk->expiry_ahead_us;
        else if (!rec->operation[0])
            stale = rec->created_us + RTR_BK_IMPORT_KEEP_US < now;
        else if (rec->created_us + (int64_t)RTR_BK_LEASE_MS * 1000 < now) {
            /* gone, or ended failed by a router that died before deleting the record */
            const rtr_meta_rec *op = rtr_meta_find(&r->meta, RTR_META_KIND_OP, rec->operation);
            stale = (!op || !rtr_bk_shown(r, rec)) && !rtr_bk_job_exists(r, rec->operation);
        }
    }
    st_arena_deinit(&a);
    return stale;
}

static st_code add_item(sweep_item **v, size_t *n, const rtr_meta_rec *m, int what) {
    sweep_item *nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (!nv)
        return ST_RESOURCE_EXHAUSTED;
    *v = nv;
    sweep_item *it = &nv[*n];
    memset(it, 0, sizeof *it);
    it->name = strdup(m->name);
    it->what = what;
    if (what == 0 && (it->copy = malloc(m->len ? m->len : 1)))
        memcpy(it->copy, m->pb, m->len);
    it->rec = st_slice_make(it->copy, m->len);
    if (!it->name || (what == 0 && !it->copy)) {
        free(it->name);
        free(it->copy);
        return ST_RESOURCE_EXHAUSTED;
    }
    (*n)++;
    return ST_OK;
}

static void forget_done(void *arg, st_code code, const char *msg) {
    (void)code;
    (void)msg;
    free(arg);
}

/* Collects first, acts after: the actions change r->meta (possibly at once). */
/* The sweep's delete holds the backup's gate: an UpdateBackup or DeleteBackup running now makes
 * the sweep leave the backup for its next round (which looks at the record as that call left
 * it), and one arriving during the delete waits and then finds the backup gone. */
typedef struct sweep_del {
    rtr_ctx *r;
} sweep_del;

static void sweep_deleted(void *arg, st_code code, const char *msg) {
    sweep_del *d = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "expired backup not deleted (next sweep retries): %s",
               msg ? msg : st_code_name(code));
    rtr_gate_leave(d->r, d);
    free(d);
}

static void sweep_delete(rtr_ctx *r, const char *name) {
    sweep_del *d = malloc(sizeof *d);
    if (!d)
        return;
    d->r = r;
    if (!rtr_gate_take(r, name, d)) {
        free(d);
        return;
    }
    st_log(ST_LOG_INFO, "router", "backup %s expired (or was abandoned): deleting it", name);
    rtr_bk_delete(r, name, sweep_deleted, d);
}

void rtr_bk_sweep(rtr_ctx *r) {
    if (!r->bk || !r->meta_loaded)
        return;
    rtr_bk_jobs_renew(r);
    leftovers_retry(r);
    int64_t now = st_wall_us();
    sweep_item *v = NULL;
    size_t n = 0;
    for (size_t i = 0; i < r->meta.n_ops; i++) {
        int what = sweep_op(r, &r->meta.ops[i], now);
        if (what >= 0 && add_item(&v, &n, &r->meta.ops[i], what) != ST_OK)
            break;
    }
    for (size_t i = 0; i < r->meta.n_backups; i++)
        if (backup_stale(r, &r->meta.backups[i], now) &&
            add_item(&v, &n, &r->meta.backups[i], 1) != ST_OK)
            break;
    for (size_t i = 0; i < n; i++) {
        if (v[i].what == 0) {
            rtr_bk_reap(r, v[i].name, v[i].rec);
        } else if (v[i].what == 1) {
            sweep_delete(r, v[i].name);
        } else {
            char *nm = strdup(v[i].name);
            if (nm)
                rtr_meta_write(r, RTR_META_KIND_OP, v[i].name, NULL, forget_done, nm);
            rtr_ops_delete(rtr_inst_of(r)->ops, v[i].name);
        }
        free(v[i].name);
        free(v[i].copy);
    }
    free(v);
}
