/* operations.c — google.longrunning.Operations on the router. Admin calls that return an
 * operation (UpdateAppProfile, UpdateTable; backups later) finish before they answer, so every
 * operation is done when first returned; the router keeps the last RTR_OPS_MAX of them in memory so
 * that GetOperation / ListOperations / WaitOperation find them. They are not shared between routers
 * and do not survive a restart: a client polling another router gets NOT_FOUND (see
 * docs/router.md). */
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
    rtr_fail(call, ST_NOT_FOUND,
             "operation %s not found: this router keeps its last %d operations in memory, and "
             "only those it started",
             name, RTR_OPS_MAX);
}

/* GetOperation and WaitOperation: every kept operation is done, so waiting returns at once. */
static void get_op(rpc_call *call, rtr_ctx *r, const char *name) {
    st_slice pb;
    if (!name[0]) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "name must be set");
        return;
    }
    if (!rtr_ops_get(rtr_inst_of(r)->ops, name, &pb)) {
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

/* Operations whose name starts with the request's name ("operations/projects/p/instances/i"),
 * newest first; page_token is the decimal count of operations already returned. filter is
 * not supported (INVALID_ARGUMENT when set). */
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
    char *end = NULL;
    unsigned long long skip = req->page_token[0] ? strtoull(req->page_token, &end, 10) : 0;
    if (end && *end) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "invalid page_token '%s'", req->page_token);
        return;
    }
    size_t max =
        req->page_size > 0 && req->page_size < RTR_OPS_MAX ? (size_t)req->page_size : RTR_OPS_MAX;
    const rtr_ops *o = rtr_inst_of(r)->ops;
    size_t plen = strlen(req->name);
    uint64_t below = UINT64_MAX;
    size_t matched = 0, sent = 0;
    st_buf out;
    st_buf_init(&out);
    st_code rc = ST_OK;
    /* Newest first: repeatedly take the largest seq below the previous one (n is bounded). */
    for (;;) {
        const op_rec *best = NULL;
        for (size_t i = 0; i < o->n; i++)
            if (o->v[i].seq < below && strncmp(o->v[i].name, req->name, plen) == 0 &&
                (!best || o->v[i].seq > best->seq))
                best = &o->v[i];
        if (!best || rc != ST_OK)
            break;
        below = best->seq;
        if (matched++ < skip)
            continue;
        if (sent == max) {
            char tok[32];
            snprintf(tok, sizeof tok, "%zu", matched - 1);
            rc = rtr_wire_put_bytes(&out, 2, st_slice_cstr(tok));
            break;
        }
        rc = rtr_wire_put_bytes(&out, 1, st_slice_make(best->pb, best->len));
        sent++;
    }
    if (rc == ST_OK)
        reply_bytes(call, st_buf_slice(&out));
    else
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_buf_free(&out);
}

void rtr_h_delete_operation(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Longrunning__DeleteOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__delete_operation_request__descriptor, bytes);
    if (!req)
        return;
    if (!rtr_ops_delete(rtr_inst_of(r)->ops, req->name)) {
        fail_unknown(call, req->name);
        return;
    }
    reply_bytes(call, st_slice_make(NULL, 0));
}

/* Cancelling a finished operation changes nothing (google.longrunning allows that). */
void rtr_h_cancel_operation(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Longrunning__CancelOperationRequest *req =
        (void *)rtr_unpack(call, &google__longrunning__cancel_operation_request__descriptor, bytes);
    if (!req)
        return;
    st_slice pb;
    if (!rtr_ops_get(rtr_inst_of(r)->ops, req->name, &pb)) {
        fail_unknown(call, req->name);
        return;
    }
    reply_bytes(call, st_slice_make(NULL, 0));
}
