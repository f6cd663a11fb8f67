/* instance.h — instance admin, app profiles and long-running operations on the router (private to
 * router/). Modules: instance.c (GetInstance, ListInstances, GetCluster, ListClusters from the
 * topology; the hooks router.c calls: method registration, startup, close), profiles.c (app
 * profile records, validation, CRUD handlers, and request routing by profile), operations.c
 * (recently finished google.longrunning.Operations kept in memory, and the Operations service).
 *
 * App profiles are records "profile/<id>" of the metadata table (meta.c); the cache rtr_ctx.meta
 * is what routing reads, so a change made through this router takes effect for its next request,
 * and other routers see it at their next metadata reload (meta_refresh_ms). See docs/router.md. */
#ifndef ROUTER_INSTANCE_H
#define ROUTER_INSTANCE_H

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "router_internal.h"

#define RTR_IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define RTR_LRO "/google.longrunning.Operations/"

#define RTR_PROFILE_DEFAULT "default"
#define RTR_PROFILE_ID_MAX 50     /* as backup ids; Bigtable documents no limit (inference) */
#define RTR_PROFILE_DESC_MAX 4096 /* description bytes */
#define RTR_PROFILE_NAME_MAX (RTR_TABLE_NAME_MAX + 64)
#define RTR_PROFILE_ETAG_MAX 32
#define RTR_LIST_PAGE_MAX 1000 /* app profiles per ListAppProfiles page */
#define RTR_OPS_MAX 1024       /* finished operations kept for GetOperation */
#define RTR_OP_NAME_MAX (RTR_PROFILE_NAME_MAX + 64)
#define RTR_TXN_DENIED_MSG "Single-row transactions are not allowed by this app profile"
#define RTR_TYPE_URL_PREFIX "type.googleapis.com/"

typedef Google__Bigtable__Admin__V2__AppProfile rtr_pb_profile;

/* ---- routing policy of a stored profile (profiles.c, pure) ---- */
typedef enum rtr_routing {
    RTR_ROUTING_NONE = 0,
    RTR_ROUTING_SINGLE,
    RTR_ROUTING_MULTI,
} rtr_routing;

typedef struct rtr_policy {
    rtr_routing kind;
    char cluster_id[ST_TOPO_ID_MAX + 1];                        /* single */
    bool allow_transactional_writes;                            /* single */
    char cluster_ids[ST_TOPO_CLUSTERS_MAX][ST_TOPO_ID_MAX + 1]; /* multi; none = all */
    size_t n_cluster_ids;
    bool row_affinity;
    bool data_boost; /* isolation data_boost_isolation_read_only: reads only */
} rtr_policy;

/* Scans a serialized AppProfile for its routing policy and isolation (no allocation).
 * INVALID_ARGUMENT for a malformed message, a cluster id longer than ST_TOPO_ID_MAX, or more than
 * ST_TOPO_CLUSTERS_MAX cluster ids. */
st_code rtr_policy_parse(st_slice profile_pb, rtr_policy *out, st_err *err);

/* ---- names (profiles.c, pure) ---- */
/* Matches name against segments: lits[i] non-NULL must equal segment i, NULL segments are
 * variables (non-empty, collected in order into vars). Exactly n segments separated by '/'. */
bool rtr_name_match(const char *name, const char *const *lits, size_t n, st_slice *vars);
/* Checks that parent is the topology's instance ("-" as instance id matches when allow_any).
 * INVALID_ARGUMENT for a malformed name, NOT_FOUND for another instance. */
st_code rtr_check_instance(const st_topology *t, const char *parent, bool allow_any, st_err *err);
/* [_a-zA-Z0-9][-_.a-zA-Z0-9]*, at most RTR_PROFILE_ID_MAX characters. */
bool rtr_profile_id_valid(const char *id);
/* Parses "projects/P/instances/I/appProfiles/ID" of the topology's instance into id (cap >=
 * RTR_PROFILE_ID_MAX + 1). INVALID_ARGUMENT / NOT_FOUND as rtr_check_instance. */
st_code rtr_profile_parse_name(const st_topology *t, const char *name, char *id, size_t cap,
                               st_err *err);

/* ---- validation and updates (profiles.c, pure) ---- */
/* Bigtable's rules: a routing policy is set; single-cluster names a cluster of the topology;
 * multi-cluster names distinct clusters of the topology (none = all); Data Boost isolation only
 * with single-cluster routing without transactional writes; description at most
 * RTR_PROFILE_DESC_MAX bytes. INVALID_ARGUMENT with a sentence otherwise. */
st_code rtr_profile_validate(const st_topology *t, const rtr_pb_profile *p, st_err *err);
/* Applies an update: for every path of the mask (description, single_cluster_routing,
 * multi_cluster_routing_use_any, priority, standard_isolation, data_boost_isolation_read_only;
 * an empty mask replaces all of them), dst takes src's value (pointers are shared, not copied).
 * INVALID_ARGUMENT for an unknown path. */
st_code rtr_profile_apply_mask(rtr_pb_profile *dst, const rtr_pb_profile *src, char *const *paths,
                               size_t n_paths, st_err *err);
/* The safety check ignore_warnings skips: p allows single-row transactions on one cluster while
 * another stored profile (other than p's own id) allows them on a different cluster — concurrent
 * transactions on the same row in two clusters lose updates. FAILED_PRECONDITION then. */
st_code rtr_profile_warnings(const rtr_meta *m, const st_topology *t, const char *id,
                             const rtr_pb_profile *p, st_err *err);
/* A fresh etag for a profile version (16 hex digits, unique per write with high probability). */
void rtr_profile_new_etag(st_slice content, char out[RTR_PROFILE_ETAG_MAX + 1]);
/* Serialized default profile: single-cluster routing to the topology's first cluster with
 * transactional writes allowed (Bigtable's default for one-cluster instances). */
st_code rtr_profile_default_pb(const st_topology *t, st_buf *out);
/* The stored (or, for "default" when none is stored, the built-in) profile's bytes; false when
 * there is none. scratch holds the built-in one. */
bool rtr_profile_lookup(const rtr_ctx *r, const char *id, st_buf *scratch, st_slice *out);

/* ---- routing (profiles.c) ---- */
/* A cluster is healthy when the health probes say so (health.c: every node answers) and one of
 * its nodes has a live link or may be dialled now. */
bool rtr_cluster_healthy(const rtr_cluster *c);
/* The routing policy of profile id (the built-in one for "default" when none is stored).
 * NOT_FOUND for an unknown profile, INTERNAL for an unreadable record. */
st_code rtr_profile_policy(const rtr_ctx *r, const char *id, rtr_policy *pol, st_err *err);

/* ---- operations (operations.c) ---- */
typedef struct rtr_ops rtr_ops;
rtr_ops *rtr_ops_new(void);
void rtr_ops_free(rtr_ops *o); /* NULL is fine */
/* A new operation name "operations/<resource>/<n>" (n unique and increasing in this process). */
void rtr_ops_name(rtr_ops *o, const char *resource, char out[RTR_OP_NAME_MAX + 1]);
/* Stores (inserts or replaces) a serialized google.longrunning.Operation under its name; the
 * oldest is dropped beyond RTR_OPS_MAX. RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_ops_put(rtr_ops *o, const char *name, st_slice op_pb);
/* The stored operation, or false. Valid until the next put/delete. */
bool rtr_ops_get(const rtr_ops *o, const char *name, st_slice *op_pb);
bool rtr_ops_delete(rtr_ops *o, const char *name);
/* A finished Operation (done, response Any{type_url, value}, metadata Any{metadata_type,
 * metadata}) serialized into out. */
st_code rtr_op_pack_done(const char *name, const char *metadata_type, st_slice metadata,
                         const char *response_type, st_slice response, st_buf *out);

/* ---- the module's state, rtr_ctx.inst (instance.c) ---- */
typedef struct rtr_inst {
    rtr_ops *ops;
} rtr_inst;
rtr_inst *rtr_inst_of(rtr_ctx *r);

/* ---- hooks called by router.c ---- */
/* Creates rtr_ctx.inst and registers the instance admin and Operations methods.
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code rtr_instance_open(rtr_ctx *r, st_err *err);
/* After the metadata loaded: writes the default profile when none is stored (failure is logged:
 * routing falls back to the built-in default). Runs r's loop until the write finished. */
st_code rtr_instance_start(rtr_ctx *r, st_err *err);
/* Frees rtr_ctx.inst (NULL is fine). */
void rtr_instance_close(rtr_ctx *r);

/* ---- handlers ---- */
void rtr_h_get_instance(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_instances(rpc_call *call, st_slice req, void *arg);
void rtr_h_get_cluster(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_clusters(rpc_call *call, st_slice req, void *arg);
void rtr_h_create_app_profile(rpc_call *call, st_slice req, void *arg);
void rtr_h_get_app_profile(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_app_profiles(rpc_call *call, st_slice req, void *arg);
void rtr_h_update_app_profile(rpc_call *call, st_slice req, void *arg);
void rtr_h_delete_app_profile(rpc_call *call, st_slice req, void *arg);
void rtr_h_get_operation(rpc_call *call, st_slice req, void *arg);
void rtr_h_list_operations(rpc_call *call, st_slice req, void *arg);
void rtr_h_delete_operation(rpc_call *call, st_slice req, void *arg);
void rtr_h_cancel_operation(rpc_call *call, st_slice req, void *arg);
void rtr_h_wait_operation(rpc_call *call, st_slice req, void *arg);

#endif
