/* router.c — strata-router's life cycle (open: connect, learn the tablet maps, bootstrap and load
 * the metadata, listen; close), its method table, and the helpers handlers share. */
#include "router_internal.h"
#include "instance.h" /* instance admin, app profiles, operations */
#include "failover.h" /* cluster health, multi-cluster routing */
#include "backup.h"   /* backups, their operations, BackupAdmin */

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- method table ---- */

typedef struct method {
    const char *path;
    rpc_handler_fn fn;
} method;

static const method methods[] = {
    {RTR_BT "ReadRows", rtr_h_read_rows},
    {RTR_BT "SampleRowKeys", rtr_h_sample_row_keys},
    {RTR_BT "MutateRow", rtr_h_mutate_row},
    {RTR_BT "MutateRows", rtr_h_mutate_rows},
    {RTR_BT "CheckAndMutateRow", rtr_h_check_and_mutate_row},
    {RTR_BT "ReadModifyWriteRow", rtr_h_read_modify_write_row},
    {RTR_BT "PingAndWarm", rtr_h_ping_and_warm},
    {RTR_TA "CreateTable", rtr_h_create_table},
    {RTR_TA "GetTable", rtr_h_get_table},
    {RTR_TA "ListTables", rtr_h_list_tables},
    {RTR_TA "DeleteTable", rtr_h_delete_table},
    {RTR_TA "ModifyColumnFamilies", rtr_h_modify_column_families},
    {RTR_TA "DropRowRange", rtr_h_drop_row_range},
    {RTR_TA "GenerateConsistencyToken", rtr_h_generate_consistency_token},
    {RTR_TA "CheckConsistency", rtr_h_check_consistency},
    {RTR_TA "UpdateTable", rtr_h_update_table},
    {RTR_BT "GenerateInitialChangeStreamPartitions", rtr_h_generate_partitions},
    {RTR_BT "ReadChangeStream", rtr_h_read_change_stream},
    /* Instance admin (GetInstance, ListClusters, app profiles) and google.longrunning.Operations:
     * rtr_instance_open (instance.c). */
};

static st_code register_methods(rtr_ctx *r, st_err *err) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st_code rc = rpc_server_add_method(r->rpc, methods[i].path, methods[i].fn, r);
        if (rc != ST_OK)
            return st_err_set(err, rc, "registering %s failed", methods[i].path);
    }
    st_code rc = rtr_instance_open(r, err);        /* instance.c */
    return rc == ST_OK ? rtr_bk_open(r, err) : rc; /* backup.c */
}

/* ---- request helpers ---- */

/* protobuf-c allocator over the call's arena: freed when the call is released. */
static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *p) {
    (void)data;
    (void)p;
}

/* Every request is scanned by btu_pb_check first: protobuf-c recurses once per nested message, and
 * a RowFilter or GC rule nested thousands of levels deep would overflow the stack. A request's
 * strings must be UTF-8 too (btu_pb_unpack_request). */
static ProtobufCMessage *unpack_checked(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                                        st_slice bytes, bool request, st_err *err) {
    ProtobufCAllocator alloc = {arena_alloc, arena_free, rpc_call_arena(call)};
    return request ? btu_pb_unpack_request(desc, &alloc, bytes, err)
                   : btu_pb_unpack(desc, &alloc, bytes, err);
}

ProtobufCMessage *rtr_unpack_try(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                                 st_slice bytes) {
    return unpack_checked(call, desc, bytes, false, NULL);
}

ProtobufCMessage *rtr_unpack(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                             st_slice bytes) {
    st_err err = {0};
    ProtobufCMessage *m = unpack_checked(call, desc, bytes, true, &err);
    if (!m)
        rtr_fail(call, ST_INVALID_ARGUMENT, "could not parse the %s request: %s", desc->short_name,
                 err.msg);
    return m;
}

void rtr_reply(rpc_call *call, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = st_arena_alloc(rpc_call_arena(call), len ? len : 1);
    if (!buf) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(msg, buf);
    st_code rc = rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, rc, rc == ST_OK ? NULL : "could not send the response");
}

void rtr_fail(rpc_call *call, st_code code, const char *fmt, ...) {
    char msg[RPC_GRPC_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st_log(ST_LOG_DEBUG, "router", "path=%s code=%s msg=\"%s\"", rpc_call_path(call),
           st_code_name(code), msg);
    rpc_call_finish(call, code, msg);
}

st_code rtr_check_table_name(const rtr_ctx *r, const char *name, st_err *err) {
    st_slice project, instance;
    st_code rc = btu_table_name_parse(name, RTR_TABLE_NAME_MAX, &project, &instance, NULL, err);
    if (rc != ST_OK || !r)
        return rc;
    if (st_slice_eq(project, st_slice_cstr(r->topo.project)) &&
        st_slice_eq(instance, st_slice_cstr(r->topo.instance)))
        return ST_OK;
    return st_err_set(err, ST_NOT_FOUND,
                      "instance projects/%.*s/instances/%.*s not found: this Strata instance is "
                      "projects/%s/instances/%s",
                      (int)project.len, (const char *)project.data, (int)instance.len,
                      (const char *)instance.data, r->topo.project, r->topo.instance);
}

const rtr_meta_rec *rtr_table_or_fail(rtr_ctx *r, rpc_call *call, const char *name) {
    st_err err;
    if (rtr_check_table_name(r, name, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return NULL;
    }
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, name);
    if (!rec)
        rtr_fail(call, ST_NOT_FOUND, "table \"%s\" not found", name);
    return rec;
}

bool rtr_call_timeout(const rpc_call *call, int64_t dflt_ms, int64_t *timeout_ms) {
    int64_t deadline = rpc_call_deadline_us(call);
    if (deadline <= 0) {
        *timeout_ms = dflt_ms;
        return true;
    }
    int64_t left = deadline - st_mono_us();
    if (left <= 0)
        return false;
    *timeout_ms = left < 1000 ? 1 : left / 1000;
    return true;
}

size_t rtr_forward_headers(const rpc_call *call, rpc_metadata *md) {
    static const char *const names[] = {"bigtable-features", "x-goog-request-params"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && n < RTR_FORWARD_HEADERS_MAX; i++) {
        const char *v = rpc_call_header(call, names[i]);
        if (v)
            md[n++] = (rpc_metadata){names[i], v};
    }
    return n;
}

bool rtr_retryable(st_code code, const char *message, bool unavailable_ok) {
    if (st_is_not_owner(code, message))
        return true;
    return unavailable_ok && code == ST_UNAVAILABLE;
}

uint64_t rtr_retries_total;

int64_t rtr_backoff_ms(int attempt) {
    __atomic_fetch_add(&rtr_retries_total, 1, __ATOMIC_RELAXED);
    int64_t ms = RTR_RETRY_BACKOFF_MS;
    for (int i = 1; i < attempt && ms < RTR_RETRY_BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < RTR_RETRY_BACKOFF_MAX_MS ? ms : RTR_RETRY_BACKOFF_MAX_MS;
}

/* A write to a moving tablet is refused until the move ends (docs/cluster.md): the longer budget
 * lets it wait for the move instead of failing while the balancer moves small tablets. */
bool rtr_retry_allowed(int attempts, st_code code, const char *message) {
    int max = st_is_not_owner(code, message) ? RTR_RETRIES_NOT_OWNER_MAX : RTR_RETRIES_MAX;
    return attempts < max;
}

/* ---- open / close ---- */

void rtr_opts_default(rtr_opts *o) {
    memset(o, 0, sizeof *o);
}

static st_code init_clusters(rtr_ctx *r, st_err *err) {
    if (r->topo.n_clusters == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "the topology has no cluster");
    r->n_clusters = r->topo.n_clusters;
    for (size_t c = 0; c < r->n_clusters; c++) {
        rtr_cluster *cl = &r->clusters[c];
        cl->ctx = r;
        cl->topo = &r->topo.clusters[c];
        cl->idx = c;
        cl->n_nodes = cl->topo->n_nodes;
        if (cl->n_nodes == 0)
            return st_err_set(err, ST_INVALID_ARGUMENT, "cluster %s has no node", cl->topo->id);
        if (!(cl->map = rtr_tmap_build(NULL, 0)))
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < cl->n_nodes; i++) {
            rtr_node *n = &cl->nodes[i];
            n->ctx = r;
            n->cluster = cl;
            n->idx = (uint32_t)i;
            n->num = cl->topo->nodes[i].num;
            snprintf(n->addr, sizeof n->addr, "%s", cl->topo->nodes[i].addr);
            if (!st_addr_split(n->addr, n->host, sizeof n->host, &n->port))
                return st_err_set(err, ST_INVALID_ARGUMENT, "bad node address '%s'", n->addr);
        }
    }
    return ST_OK;
}

/* Startup runs the asynchronous machinery on the caller's loop until it settles. */
typedef struct start_state {
    rtr_ctx *r;
    bool done;
    st_code code;
} start_state;

static void start_meta_done(void *arg, st_code code) {
    start_state *s = arg;
    s->code = code;
    s->done = true;
}

static void start_maps_done(void *arg) {
    start_state *s = arg;
    rtr_meta_bootstrap(s->r, start_meta_done, s);
}

static st_code start_once(rtr_ctx *r) {
    start_state s = {r, false, ST_OK};
    if (rtr_refresh_all(r, start_maps_done, &s) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    while (!s.done)
        event_base_loop(r->base, EVLOOP_ONCE);
    return s.code;
}

/* Tries until the metadata loads from some cluster or RTR_START_TIMEOUT_MS passes: nodes
 * started together with the router may need a moment. */
static st_code start_connect(rtr_ctx *r, st_err *err) {
    int64_t until = st_mono_us() + (int64_t)RTR_START_TIMEOUT_MS * 1000;
    for (int attempt = 1;; attempt++) {
        st_code rc = start_once(r);
        if (rc == ST_OK)
            return ST_OK;
        if (st_mono_us() > until)
            return st_err_set(err, rc,
                              "could not read the instance metadata from any cluster (%s); are "
                              "the nodes of the topology running?",
                              st_code_name(rc));
        struct timeval tv = {0, 200 * 1000};
        event_base_loopexit(r->base, &tv);
        event_base_dispatch(r->base);
        st_log(ST_LOG_INFO, "router", "waiting for the nodes (attempt %d)", attempt);
    }
}

/* Claims the listen address before anything touches the nodes, so a second router started on a
 * taken port fails at once; connections are refused until start_listen. */
static st_code start_bind(rtr_ctx *r, st_err *err) {
    char host[ST_TOPO_ADDR_MAX + 1] = "127.0.0.1";
    uint16_t port = 8086;
    if (r->opts.listen_host) {
        snprintf(host, sizeof host, "%s", r->opts.listen_host);
        port = r->opts.listen_port;
    } else if (r->topo.n_routers > 0 &&
               !st_addr_split(r->topo.routers[0], host, sizeof host, &port)) {
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad router listen address '%s'",
                          r->topo.routers[0]);
    }
    snprintf(r->listen_host, sizeof r->listen_host, "%s", host);
    return rpc_server_bind(r->rpc, host, port, &r->port, err);
}

st_code rtr_open(struct event_base *base, const rtr_opts *opts, rtr_ctx **out, st_err *err) {
    *out = NULL;
    rtr_ctx *r = calloc(1, sizeof *r);
    if (!r)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    r->opts = *opts;
    r->topo = *opts->topo;
    r->opts.topo = &r->topo;
    if (!r->opts.change_streams_max)
        r->opts.change_streams_max = RTR_CS_STREAMS_MAX_DEFAULT;
    r->base = base;
    rpc_server_opts so = {.ssl_ctx = opts->ssl_ctx};
    st_code rc = (r->rpc = rpc_server_new(base, &so, err)) ? ST_OK : err ? err->code : ST_INTERNAL;
    if (rc == ST_OK)
        rc = start_bind(r, err);
    if (rc == ST_OK)
        rc = init_clusters(r, err);
    if (rc == ST_OK)
        rc = register_methods(r, err);
    if (rc == ST_OK)
        rc = rtr_auth_open(r, err); /* auth.c: tokens, roles, audit log, IAM methods */
    if (rc == ST_OK)
        rc = start_connect(r, err);
    if (rc == ST_OK)
        rc = rtr_instance_start(r, err); /* the default app profile */
    if (rc == ST_OK)
        rc = rtr_meta_start_timer(r, err);
    if (rc == ST_OK)
        rc = rpc_server_listen_bound(r->rpc, err);
    if (rc == ST_OK)
        rc = rtr_bk_start(r, err); /* needs the listen address: names this router's operations */
    if (rc == ST_OK)
        rc = rtr_balance_start(r, err); /* needs the listen address */
    if (rc == ST_OK)
        rc = rtr_health_start(r, err); /* cluster health probes (failover) */
    if (rc == ST_OK)
        rc = rtr_leftover_start(r, err); /* tables deleted while a node was down */
    if (rc != ST_OK) {
        rtr_close(r);
        return rc;
    }
    st_log(ST_LOG_INFO, "router", "listening port=%u clusters=%zu tables=%zu", r->port,
           r->n_clusters, r->meta.n_tables);
    *out = r;
    return ST_OK;
}

uint16_t rtr_port(const rtr_ctx *r) {
    return r->port;
}
const char *rtr_host(const rtr_ctx *r) {
    return r->listen_host;
}
bool rtr_set_ssl_ctx(rtr_ctx *r, struct ssl_ctx_st *ctx) {
    return rpc_server_set_ssl_ctx(r->rpc, ctx);
}

void rtr_close(rtr_ctx *r) {
    if (!r)
        return;
    r->closing = true;
    rtr_balance_stop(r);
    rtr_leftover_stop(r);
    if (r->meta_timer)
        event_free(r->meta_timer);
    r->meta_timer = NULL;
    /* Server first: its calls become cancelled, so the requests still in flight stop at their
     * next step; then the delayed callbacks and the node clients run out. */
    if (r->rpc)
        rpc_server_free(r->rpc);
    r->rpc = NULL;
    rtr_later_flush(r);
    rtr_node_disconnect_all(r);
    rtr_later_flush(r);
    rtr_gates_close(r);
    for (size_t c = 0; c < r->n_clusters; c++) {
        rtr_tmap_free(r->clusters[c].map);
        free(r->clusters[c].waiters);
        st_buf_free(&r->clusters[c].bal.start);
    }
    rtr_bk_close(r);      /* after the clients: the jobs' last callbacks freed them */
    rtr_leftover_free(r); /* after the clients: its last round ended in their callbacks */
    rtr_meta_free(&r->meta);
    rtr_instance_close(r);
    rtr_health_stop(r); /* after the clients: their last callbacks see r->closing */
    rtr_auth_close(r);
    free(r);
}
