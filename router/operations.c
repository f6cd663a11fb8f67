/* operations.c — google.longrunning.Operations on the router. UpdateAppProfile and UpdateTable
 * finish before they answer: their operations are done when first returned, and the router keeps
 * the last RTR_OPS_MAX of them in memory only (another router, or this one after a restart,
 * answers NOT_FOUND). The operations of backups (CreateBackup, CopyBackup, RestoreTable) run
 * after the answer and are also records of the metadata table (backup_ops.c): GetOperation and
 * ListOperations find them on every router and after restarts; the in-memory copy, when this
 * router runs the operation, has the freshest progress. See docs/router.md. */
#include "backup.h"
#include "instance.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct op_rec {
    char *name;
    uint8_t *pb;
    size_t len;
    uint64_t seq; /* insertion order: the smallest is dropped first */
} op_rec;

struct rtr_ops {
    op_rec v[RTR_OPS_MAX];
    size_t n;
    uint64_t seq;
    uint64_t last_id; /* last number given to a name */
};

rtr_ops *rtr_ops_new(void) {
    return calloc(1, sizeof(rtr_ops));
}

static void rec_clear(op_rec *e) {
    free(e->name);
    free(e->pb);
    memset(e, 0, sizeof *e);
}

void rtr_ops_free(rtr_ops *o) {
    if (!o)
        return;
    for (size_t i = 0; i < o->n; i++)
        rec_clear(&o->v[i]);
    free(o);
}

/* Numbers from the wall clock (microseconds), kept increasing: names stay unique across restarts
 * of this router and rarely collide with another router's. */
void rtr_ops_name(rtr_ops *o, const char *resource, char out[RTR_OP_NAME_MAX + 1]) {
    uint64_t id = (uint64_t)st_wall_us();
    if (id <= o->last_id)
        id = o->last_id + 1;
    o->last_id = id;
    snprintf(out, RTR_OP_NAME_MAX + 1, "operations/%s/%" PRIu64, resource, id);
}

static op_rec *find(const rtr_ops *o, const char *name) {
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->v[i].name, name) == 0)
            return (op_rec *)&o->v[i];
    return NULL;
}

st_code rtr_ops_put(rtr_ops *o, const char *name, st_slice op_pb) {
    uint8_t *copy = malloc(op_pb.len ? op_pb.len : 1);
    if (!copy)
        return ST_RESOURCE_EXHAUSTED;
    if (op_pb.len)
        memcpy(copy, op_pb.data, op_pb.len);
    op_rec *e = find(o, name);
    if (e) {
        free(e->pb);
        e->pb = copy;
        e->len = op_pb.len;
        return ST_OK;
    }
    char *nm = strdup(name);
    if (!nm) {
        free(copy);
        return ST_RESOURCE_EXHAUSTED;
    }
    if (o->n == RTR_OPS_MAX) {
        size_t oldest = 0;
        for (size_t i = 1; i < o->n; i++)
            if (o->v[i].seq < o->v[oldest].seq)
                oldest = i;
        rec_clear(&o->v[oldest]);
        o->v[oldest] = o->v[--o->n];
    }
    o->v[o->n++] = (op_rec){nm, copy, op_pb.len, ++o->seq};
    return ST_OK;
}

bool rtr_ops_get(const rtr_ops *o, const char *name, st_slice *op_pb) {
    const op_rec *e = find(o, name);
    if (e)
        *op_pb = st_slice_make(e->pb, e->len);
    return e != NULL;
}

bool rtr_ops_delete(rtr_ops *o, const char *name) {
    op_rec *e = find(o, name);
    if (!e)
        return false;
    rec_clear(e);
    *e = o->v[--o->n];
    return true;
}

st_code rtr_op_pack_done(const char *name, const char *metadata_type, st_slice metadata,
                         const char *response_type, st_slice response, st_buf *out) {
    Google__Protobuf__Any meta, resp;
    google__protobuf__any__init(&meta);
    google__protobuf__any__init(&resp);
    meta.type_url = (char *)metadata_type;
    meta.value = (ProtobufCBinaryData){metadata.len, (uint8_t *)metadata.data};
    resp.type_url = (char *)response_type;
    resp.value = (ProtobufCBinaryData){response.len, (uint8_t *)response.data};
    Google__Longrunning__Operation op;
    google__longrunning__operation__init(&op);
    op.name = (char *)name;
    op.metadata = &meta;
    op.done = true;
    op.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
    op.response = &resp;
    size_t len = google__longrunning__operation__get_packed_size(&op);
    st_buf_reset(out);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__longrunning__operation__pack(&op, out->data);
    return ST_OK;
}

/* ---- the Operations service ---- */

static void reply_bytes(rpc_call *call, st_slice msg) {
    st_code rc = rpc_call_send(call, msg);
    rpc_call_finish(call, rc, rc == ST_OK ? NULL : "could not send the response");
}

static void fail_unknown(rpc_call *call, const char *name) {
    if (!name || !name[0]) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "name must be set: the operation's name, as its starting call answered it");
        return;
    }
    rtr_fail(call, ST_NOT_FOUND,
             "operation %s not found: backup operations are kept for 7 days; others only by "
             "the router that started them, its last %d",
             name, RTR_OPS_MAX);
}

/* The operation in memory, else a stored one (backups). */
static bool find_any(rtr_ctx *r, const char *name, st_slice *pb) {
    if (rtr_ops_get(rtr_inst_of(r)->ops, name, pb))
        return true;
    const rtr_meta_rec *m = rtr_meta_find(&r->meta, RTR_META_KIND_OP, name);
    return m && rtr_bk_op_of_record(st_slice_make(m->pb, m->len), pb);
}

/* GetOperation and WaitOperation: waiting returns at once (WaitOperation may answer an
 * operation not yet done, as google.longrunning allows). */
static void get_op(rpc_call *call, rtr_ctx *r, const char *name) {
    st_slice pb;
    if (!name[0]) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "name must be set");
        return;
    }
    if (!find_any(r, name, &pb)) {
        fail_unknown(call, name);
        return;
    }
    reply_bytes(call, pb);
}

void rtr_h_get_operation(rpc_call *call, st_slice bytes, void *arg) {
    Google__Longrunning__GetOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__get_operation_request__descriptor, bytes);
    if (req)
        get_op(call, arg, req->name);
}

void rtr_h_wait_operation(rpc_call *call, st_slice bytes, void *arg) {
    Google__Longrunning__WaitOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__wait_operation_request__descriptor, bytes);
    if (req)
        get_op(call, arg, req->name);
}

typedef struct op_ref {
    const char *name;
    uint64_t id; /* the name's last number: the router's clock when it was made */
    st_slice pb;
} op_ref;

static uint64_t name_id(const char *name) {
    const char *slash = strrchr(name, '/');
    return slash ? strtoull(slash + 1, NULL, 10) : 0;
}

static int ref_cmp(const void *a, const void *b) {
    const op_ref *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* Whether op names an operation of resource (the request's name, "operations/<resource>") or
 * of a resource under it: op is resource + "/" + more. A string prefix would let backup "b" list
 * the operations of backups "b1" and "bx". */
static bool op_under(const char *op, const char *resource, size_t rlen) {
    return strncmp(op, resource, rlen) == 0 && op[rlen] == '/' && op[rlen + 1];
}

/* Kept and stored operations of resource (rlen bytes; op_under), each once, newest first. */
static op_ref *collect(rtr_ctx *r, const char *resource, size_t rlen, size_t *n) {
    const rtr_ops *o = rtr_inst_of(r)->ops;
    op_ref *v = malloc((o->n + r->meta.n_ops + 1) * sizeof *v);
    *n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (op_under(o->v[i].name, resource, rlen))
            v[(*n)++] = (op_ref){o->v[i].name, name_id(o->v[i].name),
                                 st_slice_make(o->v[i].pb, o->v[i].len)};
    for (size_t i = 0; i < r->meta.n_ops; i++) {
        const rtr_meta_rec *m = &r->meta.ops[i];
        st_slice pb;
        if (op_under(m->name, resource, rlen) && !find(o, m->name) &&
            rtr_bk_op_of_record(st_slice_make(m->pb, m->len), &pb))
            v[(*n)++] = (op_ref){m->name, name_id(m->name), pb};
    }
    qsort(v, *n, sizeof *v, ref_cmp);
    return v;
}

/* Page tokens (rtr_page_token_make): "o1", a CRC32C of the request's name, and the name of the
 * last operation returned; the next page starts after where that operation sorts, so operations
 * started or deleted between pages do not shift the pages (as ListBackups' tokens, docs/backups.md
 * "Pages"). */
#define OPS_TOKEN_PREFIX "o1"

/* The name of the previous page's last operation (arena memory) into *last, or INVALID_ARGUMENT
 * for a token that is not one of ours, or one of a listing of another resource. */
static st_code token_parse(st_arena *a, const char *tok, uint32_t crc, const char *resource,
                           size_t rlen, const char **last, st_err *err) {
    st_slice name;
    rtr_token_rc trc = rtr_page_token_parse(a, tok, OPS_TOKEN_PREFIX, crc, &name);
    if (trc == RTR_TOKEN_OTHER)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "page_token belongs to a listing of another name: repeat the request of "
                          "the previous page with its next_page_token");
    if (trc == RTR_TOKEN_OK && !memchr(name.data, 0, name.len) &&
        op_under((const char *)name.data, resource, rlen)) {
        *last = (const char *)name.data;
        return ST_OK;
    }
    return st_err_set(err, trc == RTR_TOKEN_NOMEM ? ST_RESOURCE_EXHAUSTED : ST_INVALID_ARGUMENT,
                      "invalid page_token: pass the next_page_token of the previous page "
                      "unchanged, or an empty one for the first page");
}

/* The index in the sorted v of the first operation after last (NULL: 0). */
static size_t list_resume(const op_ref *v, size_t n, const char *last) {
    if (!last)
        return 0;
    op_ref key = {last, name_id(last), {0}};
    size_t i = 0;
    while (i < n && ref_cmp(&v[i], &key) <= 0)
        i++;
    return i;
}

/* One page of v from skip: at most max operations, and the token of the next page when more
 * follow. */
static st_code list_page(st_arena *a, const op_ref *v, size_t n, size_t skip, size_t max,
                         uint32_t crc, st_buf *out) {
    st_code rc = ST_OK;
    for (size_t i = skip; rc == ST_OK && i < n; i++) {
        if (i - skip == max) {
            char *tok = rtr_page_token_make(a, OPS_TOKEN_PREFIX, crc, st_slice_cstr(v[i - 1].name));
            rc = tok ? rtr_wire_put_bytes(out, 2, st_slice_cstr(tok)) : ST_RESOURCE_EXHAUSTED;
            break;
        }
        rc = rtr_wire_put_bytes(out, 1, v[i].pb);
    }
    return rc;
}

/* The operations of the request's name ("operations/<resource>": those named
 * "operations/<resource>/<n>" and those of resources under it, op_under), newest first, in
 * pages (token_parse). filter is not supported (INVALID_ARGUMENT when set). */
void rtr_h_list_operations(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Longrunning__ListOperationsRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__list_operations_request__descriptor, bytes);
    if (!req)
        return;
    if (req->filter[0]) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "ListOperations filters are not supported");
        return;
    }
    if (req->page_size < 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "negative page_size %d: use 0 (the default, %d) or more", req->page_size,
                 RTR_OPS_MAX);
        return;
    }
    size_t rlen = strlen(req->name);
    while (rlen && req->name[rlen - 1] == '/') /* "operations/x/" is "operations/x" */
        rlen--;
    if (!rlen) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "name must be set: operations/<resource>, e.g. operations/projects/P/instances/I "
                 "for every operation of the instance");
        return;
    }
    uint32_t crc = st_crc32c(0, req->name, rlen);
    st_arena *a = rpc_call_arena(call);
    const char *last = NULL;
    st_err err = {0};
    if (req->page_token[0] &&
        token_parse(a, req->page_token, crc, req->name, rlen, &last, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    size_t max =
        req->page_size > 0 && req->page_size < RTR_OPS_MAX ? (size_t)req->page_size : RTR_OPS_MAX;
    size_t n;
    op_ref *v = collect(r, req->name, rlen, &n);
    st_buf out;
    st_buf_init(&out);
    st_code rc =
        v ? list_page(a, v, n, list_resume(v, n, last), max, crc, &out) : ST_RESOURCE_EXHAUSTED;
    if (rc == ST_OK)
        reply_bytes(call, st_buf_slice(&out));
    else
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_buf_free(&out);
    free(v);
}

static void deleted(void *arg, st_code code, const char *msg) {
    rpc_call *call = arg;
    if (code == ST_OK)
        reply_bytes(call, st_slice_make(NULL, 0));
    else
        rtr_fail(call, code, "could not delete the operation's record: %s",
                 msg ? msg : st_code_name(code));
}

/* A running operation cannot be deleted (cancel it first); a stored one loses its record. */
void rtr_h_delete_operation(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Longrunning__DeleteOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__delete_operation_request__descriptor, bytes);
    if (!req)
        return;
    st_slice pb;
    if (!find_any(r, req->name, &pb)) {
        fail_unknown(call, req->name);
        return;
    }
    Google__Longrunning__Operation *op =
        (void *)rtr_unpack_try(call, &google__longrunning__operation__descriptor, pb);
    if (op && !op->done) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "operation %s is still running: cancel it (CancelOperation) or wait for it",
                 req->name);
        return;
    }
    rtr_ops_delete(rtr_inst_of(r)->ops, req->name);
    if (rtr_meta_find(&r->meta, RTR_META_KIND_OP, req->name))
        rtr_meta_write(r, RTR_META_KIND_OP, req->name, NULL, deleted, call);
    else
        reply_bytes(call, st_slice_make(NULL, 0));
}

/* A running backup operation of this router stops at its next step and cleans up (it ends with
 * CANCELLED); one run by another router is cancelled there. Cancelling a finished operation
 * changes nothing (google.longrunning allows that). */
void rtr_h_cancel_operation(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Longrunning__CancelOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__cancel_operation_request__descriptor, bytes);
    if (!req)
        return;
    st_slice pb;
    if (!find_any(r, req->name, &pb)) {
        fail_unknown(call, req->name);
        return;
    }
    if (rtr_bk_job_cancel(r, req->name, "CancelOperation"))
        st_log(ST_LOG_INFO, "router", "operation %s: cancel requested", req->name);
    reply_bytes(call, st_slice_make(NULL, 0));
}
