/* instance.c — google.bigtable.admin.v2.BigtableInstanceAdmin's read side, answered from the
 * topology (the instance is the topology's project/instance; its clusters are the topology's,
 * always READY with serve_nodes = their node count and SSD storage), plus the hooks router.c
 * calls: registering this module's methods (instance admin, app profiles, Operations), writing
 * the default app profile at first start, and freeing the module's state (rtr_ctx.inst).
 * Creating, changing or deleting instances and clusters is done by editing the topology, not
 * through the API (the methods are not registered: UNIMPLEMENTED). */
#include "instance.h"

#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Google__Bigtable__Admin__V2__Instance pb_instance;
typedef Google__Bigtable__Admin__V2__Cluster pb_cluster;

rtr_inst *rtr_inst_of(rtr_ctx *r) {
    return r->inst;
}

/* ---- messages from the topology (call arena) ---- */

static pb_instance *make_instance(rpc_call *call, const st_topology *t) {
    st_arena *a = rpc_call_arena(call);
    pb_instance *in = st_arena_alloc(a, sizeof *in);
    if (!in)
        return NULL;
    google__bigtable__admin__v2__instance__init(in);
    in->name = st_arena_printf(a, "projects/%s/instances/%s", t->project, t->instance);
    in->display_name = (char *)t->instance;
    in->state = GOOGLE__BIGTABLE__ADMIN__V2__INSTANCE__STATE__READY;
    in->type = GOOGLE__BIGTABLE__ADMIN__V2__INSTANCE__TYPE__PRODUCTION;
    return in->name ? in : NULL;
}

static pb_cluster *make_cluster(rpc_call *call, const st_topology *t, const st_topo_cluster *c) {
    st_arena *a = rpc_call_arena(call);
    pb_cluster *cl = st_arena_alloc(a, sizeof *cl);
    if (!cl)
        return NULL;
    google__bigtable__admin__v2__cluster__init(cl);
    cl->name =
        st_arena_printf(a, "projects/%s/instances/%s/clusters/%s", t->project, t->instance, c->id);
    cl->location = st_arena_printf(a, "projects/%s/locations/%s", t->project, c->zone);
    cl->state = GOOGLE__BIGTABLE__ADMIN__V2__CLUSTER__STATE__READY;
    cl->serve_nodes = (int32_t)c->n_nodes;
    cl->node_scaling_factor =
        GOOGLE__BIGTABLE__ADMIN__V2__CLUSTER__NODE_SCALING_FACTOR__NODE_SCALING_FACTOR_1X;
    cl->default_storage_type = GOOGLE__BIGTABLE__ADMIN__V2__STORAGE_TYPE__SSD;
    return cl->name && cl->location ? cl : NULL;
}

/* ---- handlers ---- */

void rtr_h_get_instance(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GetInstanceRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__get_instance_request__descriptor, bytes);
    if (!req)
        return;
    st_err err = {0};
    if (rtr_check_instance(&r->topo, req->name, false, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    pb_instance *in = make_instance(call, &r->topo);
    if (!in) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_reply(call, &in->base);
}

void rtr_h_list_instances(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ListInstancesRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__list_instances_request__descriptor, bytes);
    if (!req)
        return;
    static const char *const lits[] = {"projects", NULL};
    st_slice project;
    if (!rtr_name_match(req->parent, lits, 2, &project)) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "invalid parent '%s': expected projects/<project>",
                 req->parent);
        return;
    }
    Google__Bigtable__Admin__V2__ListInstancesResponse resp;
    google__bigtable__admin__v2__list_instances_response__init(&resp);
    pb_instance *in = NULL;
    /* One instance per topology: another project simply has none here. */
    if (st_slice_eq(project, st_slice_cstr(r->topo.project))) {
        if (!(in = make_instance(call, &r->topo))) {
            rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        resp.n_instances = 1;
        resp.instances = &in;
    }
    rtr_reply(call, &resp.base);
}

void rtr_h_get_cluster(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GetClusterRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__get_cluster_request__descriptor, bytes);
    if (!req)
        return;
    static const char *const lits[] = {"projects", NULL, "instances", NULL, "clusters", NULL};
    st_slice v[3];
    if (strlen(req->name) > RTR_TABLE_NAME_MAX || !rtr_name_match(req->name, lits, 6, v)) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "invalid cluster name '%s': expected "
                 "projects/<project>/instances/<instance>/clusters/<cluster>",
                 req->name);
        return;
    }
    const st_topo_cluster *c = NULL;
    for (size_t i = 0; i < r->topo.n_clusters && !c; i++)
        if (st_slice_eq(v[2], st_slice_cstr(r->topo.clusters[i].id)))
            c = &r->topo.clusters[i];
    if (!st_slice_eq(v[0], st_slice_cstr(r->topo.project)) ||
        !st_slice_eq(v[1], st_slice_cstr(r->topo.instance)) || !c) {
        rtr_fail(call, ST_NOT_FOUND, "Cluster %s not found.", req->name);
        return;
    }
    pb_cluster *cl = make_cluster(call, &r->topo, c);
    if (!cl) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_reply(call, &cl->base);
}

void rtr_h_list_clusters(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ListClustersRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__list_clusters_request__descriptor, bytes);
    if (!req)
        return;
    st_err err = {0};
    if (rtr_check_instance(&r->topo, req->parent, true, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    Google__Bigtable__Admin__V2__ListClustersResponse resp;
    google__bigtable__admin__v2__list_clusters_response__init(&resp);
    pb_cluster *v[ST_TOPO_CLUSTERS_MAX];
    for (size_t i = 0; i < r->topo.n_clusters; i++)
        if (!(v[i] = make_cluster(call, &r->topo, &r->topo.clusters[i]))) {
            rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
    resp.n_clusters = r->topo.n_clusters;
    resp.clusters = v;
    rtr_reply(call, &resp.base);
}

/* ---- hooks ---- */

typedef struct method {
    const char *path;
    rpc_handler_fn fn;
} method;

static const method methods[] = {
    {RTR_IA "GetInstance", rtr_h_get_instance},
    {RTR_IA "ListInstances", rtr_h_list_instances},
    {RTR_IA "GetCluster", rtr_h_get_cluster},
    {RTR_IA "ListClusters", rtr_h_list_clusters},
    {RTR_IA "CreateAppProfile", rtr_h_create_app_profile},
    {RTR_IA "GetAppProfile", rtr_h_get_app_profile},
    {RTR_IA "ListAppProfiles", rtr_h_list_app_profiles},
    {RTR_IA "UpdateAppProfile", rtr_h_update_app_profile},
    {RTR_IA "DeleteAppProfile", rtr_h_delete_app_profile},
    {RTR_LRO "GetOperation", rtr_h_get_operation},
    {RTR_LRO "ListOperations", rtr_h_list_operations},
    {RTR_LRO "DeleteOperation", rtr_h_delete_operation},
    {RTR_LRO "CancelOperation", rtr_h_cancel_operation},
    {RTR_LRO "WaitOperation", rtr_h_wait_operation},
};

st_code rtr_instance_open(rtr_ctx *r, st_err *err) {
    rtr_inst *in = calloc(1, sizeof *in);
    if (!in || !(in->ops = rtr_ops_new())) {
        free(in);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
    r->inst = in;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st_code rc = rpc_server_add_method(r->rpc, methods[i].path, methods[i].fn, r);
        if (rc != ST_OK)
            return st_err_set(err, rc, "registering %s failed", methods[i].path);
    }
    return ST_OK;
}

typedef struct start_wait {
    bool done;
    st_code code;
} start_wait;

static void default_written(void *arg, st_code code, const char *message) {
    start_wait *w = arg;
    w->done = true;
    w->code = code;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router",
               "could not store the default app profile (%s): the built-in default applies",
               message ? message : st_code_name(code));
}

st_code rtr_instance_start(rtr_ctx *r, st_err *err) {
    (void)err;
    if (rtr_meta_find(&r->meta, RTR_META_KIND_PROFILE, RTR_PROFILE_DEFAULT))
        return ST_OK;
    st_buf pb;
    st_buf_init(&pb);
    if (rtr_profile_default_pb(&r->topo, &pb) != ST_OK) {
        st_buf_free(&pb);
        return ST_OK; /* the built-in default still routes */
    }
    start_wait w = {false, ST_OK};
    st_slice s = st_buf_slice(&pb);
    rtr_meta_write(r, RTR_META_KIND_PROFILE, RTR_PROFILE_DEFAULT, &s, default_written, &w);
    while (!w.done)
        event_base_loop(r->base, EVLOOP_ONCE);
    if (w.code == ST_OK)
        st_log(ST_LOG_INFO, "router", "created app profile default: single-cluster routing to %s",
               r->topo.clusters[0].id);
    st_buf_free(&pb);
    return ST_OK;
}

void rtr_instance_close(rtr_ctx *r) {
    rtr_inst *in = r->inst;
    if (!in)
        return;
    rtr_ops_free(in->ops);
    free(in);
    r->inst = NULL;
}
