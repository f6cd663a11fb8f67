/* profiles.c — app profiles: the routing policy of stored records, Bigtable's validation rules,
 * the CreateAppProfile / GetAppProfile / ListAppProfiles / UpdateAppProfile / DeleteAppProfile
 * handlers, and rtr_profile_route, which picks the cluster for every data request.
 *
 * A profile is stored as a serialized google.bigtable.admin.v2.AppProfile (full name, etag,
 * description, routing policy, isolation) in the metadata record "profile/<id>". Routing scans
 * the stored bytes of the request's profile (no allocation), so a change written through this
 * router applies to its next request; other routers apply it after their next metadata reload.
 * When no "default" record is stored (before the first router wrote it, or a reload from a
 * cluster that missed the write) the built-in default applies: single-cluster routing to the
 * first cluster with transactional writes allowed. */
#include "failover.h"
#include "instance.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ---- */

bool rtr_name_match(const char *name, const char *const *lits, size_t n, st_slice *vars) {
    const char *p = name;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *slash = strchr(p, '/');
        bool last = i + 1 == n;
        if (last != (slash == NULL))
            return false;
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0)
            return false;
        if (lits[i]) {
            if (strlen(lits[i]) != len || memcmp(lits[i], p, len) != 0)
                return false;
        } else {
            vars[k++] = st_slice_make(p, len);
        }
        p += len + 1;
    }
    return true;
}

static bool slice_is(st_slice s, const char *c) {
    return st_slice_eq(s, st_slice_cstr(c));
}

static st_code check_instance_parts(const st_topology *t, const char *name, st_slice project,
                                    st_slice instance, bool allow_any, st_err *err) {
    if (slice_is(project, t->project) &&
        (slice_is(instance, t->instance) || (allow_any && slice_is(instance, "-"))))
        return ST_OK;
    return st_err_set(err, ST_NOT_FOUND,
                      "instance in '%s' not found: this Strata instance is "
                      "projects/%s/instances/%s",
                      name, t->project, t->instance);
}

st_code rtr_check_instance(const st_topology *t, const char *parent, bool allow_any, st_err *err) {
    static const char *const lits[] = {"projects", NULL, "instances", NULL};
    st_slice v[2];
    if (strlen(parent) > RTR_TABLE_NAME_MAX || !rtr_name_match(parent, lits, 4, v))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid instance name '%s': expected "
                          "projects/<project>/instances/<instance>",
                          parent);
    return check_instance_parts(t, parent, v[0], v[1], allow_any, err);
}

bool rtr_profile_id_valid(const char *id) {
    return btu_id_valid(id, RTR_PROFILE_ID_MAX, false);
}

st_code rtr_profile_parse_name(const st_topology *t, const char *name, char *id, size_t cap,
                               st_err *err) {
    static const char *const lits[] = {"projects", NULL, "instances", NULL, "appProfiles", NULL};
    st_slice v[3];
    if (strlen(name) > RTR_PROFILE_NAME_MAX || !rtr_name_match(name, lits, 6, v) || v[2].len >= cap)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid app profile name '%s': expected "
                          "projects/<project>/instances/<instance>/appProfiles/<id>",
                          name);
    memcpy(id, v[2].data, v[2].len);
    id[v[2].len] = '\0';
    if (!rtr_profile_id_valid(id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid app profile id '%s': use 1-%d of [-_.a-zA-Z0-9], not "
                          "starting with '-' or '.'",
                          id, RTR_PROFILE_ID_MAX);
    return check_instance_parts(t, name, v[0], v[1], false, err);
}

/* ---- routing policy scan ---- */

static st_code copy_id(st_slice s, char *out, st_err *err) {
    if (s.len > ST_TOPO_ID_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "cluster id longer than %d bytes",
                          ST_TOPO_ID_MAX);
    memcpy(out, s.data, s.len);
    out[s.len] = '\0';
    return ST_OK;
}

static st_code scan_single(st_slice msg, rtr_policy *out, st_err *err) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num == 1 && f.wire_type == 2 && copy_id(f.bytes, out->cluster_id, err) != ST_OK)
            return ST_INVALID_ARGUMENT;
        if (f.num == 2 && f.wire_type == 0)
            out->allow_transactional_writes = f.varint != 0;
    }
    return bad ? st_err_set(err, ST_INVALID_ARGUMENT, "malformed single_cluster_routing") : ST_OK;
}

static st_code scan_multi(st_slice msg, rtr_policy *out, st_err *err) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num == 1 && f.wire_type == 2) {
            if (out->n_cluster_ids == ST_TOPO_CLUSTERS_MAX)
                return st_err_set(err, ST_INVALID_ARGUMENT, "more than %d cluster ids",
                                  ST_TOPO_CLUSTERS_MAX);
            if (copy_id(f.bytes, out->cluster_ids[out->n_cluster_ids++], err) != ST_OK)
                return ST_INVALID_ARGUMENT;
        } else if (f.num == 3 && f.wire_type == 2) {
            out->row_affinity = true;
        }
    }
    return bad ? st_err_set(err, ST_INVALID_ARGUMENT, "malformed multi_cluster_routing_use_any")
               : ST_OK;
}

st_code rtr_policy_parse(st_slice pb, rtr_policy *out, st_err *err) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = pb.data, *end = rtr_slice_end(pb);
    rtr_wire_field f;
    bool bad, data_boost = false;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        /* isolation oneof: priority 7, data_boost_isolation_read_only 10, standard_isolation 11;
         * the last member on the wire wins. */
        if (f.num == 7 || f.num == 10 || f.num == 11)
            data_boost = f.num == 10 && f.wire_type == 2;
        if ((f.num != 5 && f.num != 6) || f.wire_type != 2)
            continue;
        /* A oneof: the last member on the wire wins. */
        memset(out, 0, sizeof *out);
        out->kind = f.num == 6 ? RTR_ROUTING_SINGLE : RTR_ROUTING_MULTI;
        st_code rc = f.num == 6 ? scan_single(f.bytes, out, err) : scan_multi(f.bytes, out, err);
        if (rc != ST_OK)
            return rc;
    }
    out->data_boost = data_boost;
    return bad ? st_err_set(err, ST_INVALID_ARGUMENT, "malformed app profile") : ST_OK;
}

/* ---- validation ---- */

static const st_topo_cluster *topo_cluster(const st_topology *t, const char *id) {
    for (size_t i = 0; i < t->n_clusters; i++)
        if (strcmp(t->clusters[i].id, id) == 0)
            return &t->clusters[i];
    return NULL;
}

/* "east, west" for messages. */
static void cluster_list(const st_topology *t, char *out, size_t cap) {
    size_t off = 0;
    out[0] = '\0';
    for (size_t i = 0; i < t->n_clusters && off < cap; i++) {
        int n = snprintf(out + off, cap - off, "%s%s", i ? ", " : "", t->clusters[i].id);
        if (n < 0)
            break;
        off += (size_t)n;
    }
}

static st_code unknown_cluster(const st_topology *t, const char *id, st_err *err) {
    char list[256];
    cluster_list(t, list, sizeof list);
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "cluster '%s' does not exist in projects/%s/instances/%s (clusters: %s)", id,
                      t->project, t->instance, list);
}

static st_code
validate_multi(const st_topology *t,
               const Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny *m,
               st_err *err) {
    if (!m)
        return ST_OK;
    if (m->n_cluster_ids > t->n_clusters)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "multi_cluster_routing_use_any lists %zu clusters; the instance has %zu",
                          m->n_cluster_ids, t->n_clusters);
    for (size_t i = 0; i < m->n_cluster_ids; i++) {
        if (!topo_cluster(t, m->cluster_ids[i]))
            return unknown_cluster(t, m->cluster_ids[i], err);
        for (size_t j = 0; j < i; j++)
            if (strcmp(m->cluster_ids[i], m->cluster_ids[j]) == 0)
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "cluster '%s' is listed twice in multi_cluster_routing_use_any",
                                  m->cluster_ids[i]);
    }
    return ST_OK;
}

st_code rtr_profile_validate(const st_topology *t, const rtr_pb_profile *p, st_err *err) {
    if (p->description && strlen(p->description) > RTR_PROFILE_DESC_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "app profile description longer than %d bytes",
                          RTR_PROFILE_DESC_MAX);
    const Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting *s = NULL;
    switch (p->routing_policy_case) {
    case GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING:
        s = p->single_cluster_routing;
        if (!s || !s->cluster_id || !s->cluster_id[0])
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "single_cluster_routing.cluster_id must be set");
        if (!topo_cluster(t, s->cluster_id))
            return unknown_cluster(t, s->cluster_id, err);
        break;
    case GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_MULTI_CLUSTER_ROUTING_USE_ANY: {
        st_code rc = validate_multi(t, p->multi_cluster_routing_use_any, err);
        if (rc != ST_OK)
            return rc;
        break;
    }
    default:
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the app profile must set a routing policy: single_cluster_routing or "
                          "multi_cluster_routing_use_any");
    }
    /* enums are open in proto3: a value no Bigtable release defines would be stored and handed
     * back as it came (Cloud Bigtable refuses it) */
    int prio = 0, owner = 0; /* 0, UNSPECIFIED, when not given */
    if (p->isolation_case == GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_PRIORITY)
        prio = (int)p->priority;
    if (p->isolation_case ==
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_STANDARD_ISOLATION &&
        p->standard_isolation)
        prio = (int)p->standard_isolation->priority;
    if (p->isolation_case ==
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_DATA_BOOST_ISOLATION_READ_ONLY &&
        p->data_boost_isolation_read_only)
        owner = (int)p->data_boost_isolation_read_only->compute_billing_owner;
    if (prio > (int)GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__PRIORITY__PRIORITY_HIGH || prio < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "unknown priority %d: give PRIORITY_LOW (1), PRIORITY_MEDIUM (2) or "
                          "PRIORITY_HIGH (3)",
                          prio);
    if (owner >
            (int)
                GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__DATA_BOOST_ISOLATION_READ_ONLY__COMPUTE_BILLING_OWNER__HOST_PAYS ||
        owner < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "unknown compute_billing_owner %d: give HOST_PAYS (1)", owner);
    if (p->isolation_case ==
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_DATA_BOOST_ISOLATION_READ_ONLY &&
        (!s || s->allow_transactional_writes))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "data_boost_isolation_read_only needs single_cluster_routing without "
                          "allow_transactional_writes");
    return ST_OK;
}

st_code rtr_profile_apply_mask(rtr_pb_profile *dst, const rtr_pb_profile *src, char *const *paths,
                               size_t n_paths, st_err *err) {
    bool desc = n_paths == 0, routing = n_paths == 0, isolation = n_paths == 0;
    for (size_t i = 0; i < n_paths; i++) {
        const char *p = paths[i];
        if (strcmp(p, "description") == 0)
            desc = true;
        else if (strcmp(p, "single_cluster_routing") == 0 ||
                 strcmp(p, "multi_cluster_routing_use_any") == 0)
            routing = true;
        else if (strcmp(p, "priority") == 0 || strcmp(p, "standard_isolation") == 0 ||
                 strcmp(p, "data_boost_isolation_read_only") == 0)
            isolation = true;
        else
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "update_mask path '%s' cannot be updated: use description, "
                              "single_cluster_routing, multi_cluster_routing_use_any, "
                              "standard_isolation or data_boost_isolation_read_only",
                              p);
    }
    if (desc)
        dst->description = src->description;
    if (routing) {
        dst->routing_policy_case = src->routing_policy_case;
        if (src->routing_policy_case ==
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING)
            dst->single_cluster_routing = src->single_cluster_routing;
        else
            dst->multi_cluster_routing_use_any = src->multi_cluster_routing_use_any;
    }
    if (isolation) {
        dst->isolation_case = src->isolation_case;
        switch (src->isolation_case) {
        case GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_PRIORITY:
            dst->priority = src->priority;
            break;
        case GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_STANDARD_ISOLATION:
            dst->standard_isolation = src->standard_isolation;
            break;
        default:
            dst->data_boost_isolation_read_only = src->data_boost_isolation_read_only;
        }
    }
    return ST_OK;
}

static void default_policy(const st_topology *t, rtr_policy *pol) {
    memset(pol, 0, sizeof *pol);
    pol->kind = RTR_ROUTING_SINGLE;
    snprintf(pol->cluster_id, sizeof pol->cluster_id, "%s", t->clusters[0].id);
    pol->allow_transactional_writes = true;
}

/* Does another profile allow single-row transactions on a cluster other than `cluster`? */
static bool txn_elsewhere(const rtr_meta *m, const st_topology *t, const char *id,
                          const char *cluster, char *other, size_t other_cap) {
    rtr_policy pol;
    bool default_seen = false;
    for (size_t i = 0; i < m->n_profiles; i++) {
        const rtr_meta_rec *rec = &m->profiles[i];
        default_seen |= strcmp(rec->name, RTR_PROFILE_DEFAULT) == 0;
        if (strcmp(rec->name, id) == 0 ||
            rtr_policy_parse(st_slice_make(rec->pb, rec->len), &pol, NULL) != ST_OK)
            continue;
        if (pol.kind == RTR_ROUTING_SINGLE && pol.allow_transactional_writes &&
            strcmp(pol.cluster_id, cluster) != 0) {
            snprintf(other, other_cap, "'%s' (cluster %s)", rec->name, pol.cluster_id);
            return true;
        }
    }
    if (default_seen || strcmp(id, RTR_PROFILE_DEFAULT) == 0)
        return false;
    default_policy(t, &pol);
    if (strcmp(pol.cluster_id, cluster) == 0)
        return false;
    snprintf(other, other_cap, "'default' (cluster %s)", pol.cluster_id);
    return true;
}

st_code rtr_profile_warnings(const rtr_meta *m, const st_topology *t, const char *id,
                             const rtr_pb_profile *p, st_err *err) {
    if (p->routing_policy_case !=
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING ||
        !p->single_cluster_routing || !p->single_cluster_routing->allow_transactional_writes)
        return ST_OK;
    char other[ST_TOPO_ID_MAX * 2 + RTR_PROFILE_ID_MAX + 32];
    if (!txn_elsewhere(m, t, id, p->single_cluster_routing->cluster_id, other, sizeof other))
        return ST_OK;
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "app profile '%s' would allow single-row transactions on cluster %s while "
                      "app profile %s allows them on another cluster: concurrent transactions "
                      "on one row in two clusters lose updates. Set ignore_warnings (cbt: "
                      "force=true) to proceed",
                      id, p->single_cluster_routing->cluster_id, other);
}

void rtr_profile_new_etag(st_slice content, char out[RTR_PROFILE_ETAG_MAX + 1]) {
    static uint64_t counter;
    uint64_t h = st_hash64(content.data, content.len, (uint64_t)st_wall_us() ^ (++counter << 48));
    snprintf(out, RTR_PROFILE_ETAG_MAX + 1, "%016" PRIx64, h);
}

static st_code pack_profile(const rtr_pb_profile *p, st_buf *out) {
    size_t len = google__bigtable__admin__v2__app_profile__get_packed_size(p);
    st_buf_reset(out);
    if (st_buf_reserve(out, len ? len : 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__admin__v2__app_profile__pack(p, out->data);
    return ST_OK;
}

st_code rtr_profile_default_pb(const st_topology *t, st_buf *out) {
    char name[RTR_PROFILE_NAME_MAX + 1], etag[RTR_PROFILE_ETAG_MAX + 1];
    snprintf(name, sizeof name, "projects/%s/instances/%s/appProfiles/%s", t->project, t->instance,
             RTR_PROFILE_DEFAULT);
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting s;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&s);
    s.cluster_id = (char *)t->clusters[0].id;
    s.allow_transactional_writes = true;
    rtr_pb_profile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    p.name = name;
    p.description = (char *)"Default app profile";
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p.single_cluster_routing = &s;
    /* A deterministic etag: every router shows the built-in default identically. */
    if (pack_profile(&p, out) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    snprintf(etag, sizeof etag, "%016" PRIx64, st_hash64(out->data, out->len, 0));
    p.etag = etag;
    return pack_profile(&p, out);
}

bool rtr_profile_lookup(const rtr_ctx *r, const char *id, st_buf *scratch, st_slice *out) {
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, RTR_META_KIND_PROFILE, id);
    if (rec) {
        *out = st_slice_make(rec->pb, rec->len);
        return true;
    }
    if (strcmp(id, RTR_PROFILE_DEFAULT) != 0 || rtr_profile_default_pb(&r->topo, scratch) != ST_OK)
        return false;
    *out = st_buf_slice(scratch);
    return true;
}

/* ---- routing ---- */

bool rtr_cluster_healthy(const rtr_cluster *c) {
    /* The probes' verdict (health.c) when they run; the links' state in any case. */
    if (!rtr_health_cluster_up(c->ctx, c->idx) || rtr_health_cluster_silent(c->ctx, c->idx))
        return false;
    int64_t now = st_mono_us();
    for (size_t i = 0; i < c->n_nodes; i++) {
        const rtr_node *n = &c->nodes[i];
        if ((n->client && rpc_client_alive(n->client)) || now >= n->retry_at_us)
            return true;
    }
    return false;
}

st_code rtr_profile_policy(const rtr_ctx *r, const char *id, rtr_policy *pol, st_err *err) {
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, RTR_META_KIND_PROFILE, id);
    st_err perr = {0};
    if (rec) {
        if (rtr_policy_parse(st_slice_make(rec->pb, rec->len), pol, &perr) != ST_OK)
            return st_err_set(err, ST_INTERNAL, "stored app profile '%s' is unreadable: %s", id,
                              perr.msg);
        return ST_OK;
    }
    if (strcmp(id, RTR_PROFILE_DEFAULT) == 0) {
        default_policy(&r->topo, pol);
        return ST_OK;
    }
    return st_err_set(err, ST_NOT_FOUND,
                      "App profile projects/%s/instances/%s/appProfiles/%s "
                      "not found.",
                      r->topo.project, r->topo.instance, id);
}

/* The first cluster of the request's plan (failover.c): multi-cluster profiles give the
 * nearest healthy cluster among theirs, else the first of them. */
st_code rtr_profile_route(rtr_ctx *r, const char *app_profile_id, bool transactional,
                          rtr_cluster **out, st_err *err) {
    rtr_plan plan;
    st_code rc = rtr_route_plan(r, app_profile_id, transactional ? RTR_ACCESS_TXN : RTR_ACCESS_READ,
                                st_slice_make(NULL, 0), &plan, err);
    if (rc == ST_OK)
        *out = rtr_plan_cluster(r, &plan);
    return rc;
}

/* ---- handlers ---- */

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *p) {
    (void)data;
    (void)p;
}

/* A stored profile unpacked into the call's arena; NULL (after failing the call) when corrupt. */
static rtr_pb_profile *unpack_stored(rpc_call *call, const char *id, st_slice pb) {
    ProtobufCAllocator a = {arena_alloc, arena_free, rpc_call_arena(call)};
    rtr_pb_profile *p =
        (void *)btu_pb_unpack(&google__bigtable__admin__v2__app_profile__descriptor, &a, pb, NULL);
    if (!p)
        rtr_fail(call, ST_INTERNAL, "stored app profile '%s' is unreadable", id);
    return p;
}

static void reply_bytes(rpc_call *call, st_slice msg) {
    st_code rc = rpc_call_send(call, msg);
    rpc_call_finish(call, rc, rc == ST_OK ? NULL : "could not send the response");
}

static void fail_not_found(rpc_call *call, const rtr_ctx *r, const char *id) {
    rtr_fail(call, ST_NOT_FOUND, "App profile projects/%s/instances/%s/appProfiles/%s not found.",
             r->topo.project, r->topo.instance, id);
}

typedef enum prof_kind { PROF_CREATE, PROF_UPDATE, PROF_DELETE } prof_kind;

/* One profile write in flight: the metadata write, then the answer. */
typedef struct prof_op {
    rtr_ctx *r;
    rpc_call *call;
    prof_kind kind;
    char id[RTR_PROFILE_ID_MAX + 1];
    st_buf pb; /* the stored profile (create, update) */
    bool had;  /* compared: this router's copy had a record, the compare expects it */
} prof_op;

/* UpdateAppProfile's answer: a finished operation, also kept for GetOperation. */
static void reply_update_op(prof_op *op) {
    rtr_ctx *r = op->r;
    char resource[RTR_PROFILE_NAME_MAX + 1], name[RTR_OP_NAME_MAX + 1];
    snprintf(resource, sizeof resource, "projects/%s/instances/%s/appProfiles/%s", r->topo.project,
             r->topo.instance, op->id);
    rtr_inst *in = rtr_inst_of(r);
    rtr_ops_name(in->ops, resource, name);
    st_buf out;
    st_buf_init(&out);
    st_code rc = rtr_op_pack_done(
        name, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.UpdateAppProfileMetadata",
        st_slice_make(NULL, 0), RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.AppProfile",
        st_buf_slice(&op->pb), &out);
    if (rc == ST_OK && rtr_ops_put(in->ops, name, st_buf_slice(&out)) != ST_OK)
        st_log(ST_LOG_WARN, "router", "could not keep operation %s: out of memory", name);
    if (rc == ST_OK)
        reply_bytes(op->call, st_buf_slice(&out));
    else
        rtr_fail(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_buf_free(&out);
}

static void prof_written(void *arg, st_code code, const char *message) {
    prof_op *op = arg;
    if (code != ST_OK)
        rtr_fail(op->call, code, "could not store app profile '%s': %s", op->id,
                 message ? message : st_code_name(code));
    else if (op->kind == PROF_CREATE)
        reply_bytes(op->call, st_buf_slice(&op->pb));
    else if (op->kind == PROF_UPDATE)
        reply_update_op(op);
    else
        reply_bytes(op->call, st_slice_make(NULL, 0)); /* google.protobuf.Empty */
    st_log(ST_LOG_INFO, "router", "app profile %s %s: %s", op->id,
           op->kind == PROF_CREATE   ? "create"
           : op->kind == PROF_UPDATE ? "update"
                                     : "delete",
           st_code_name(code));
    rtr_gate_leave(op->r, op->call);
    st_buf_free(&op->pb);
    free(op);
}

/* The compare-and-set of a create or an etag-checked update: stored in every cluster only if the
 * first cluster's record is still the one this router read, so that another router's change in
 * between is not overwritten (docs/router.md, App profiles). */
static void prof_compared(void *arg, st_code code, const char *message, bool matched) {
    prof_op *op = arg;
    if (code != ST_OK) {
        prof_written(op, code, message);
    } else if (matched != op->had) {
        bool create = op->kind == PROF_CREATE;
        prof_written(op, create ? ST_ALREADY_EXISTS : ST_ABORTED,
                     create ? "it was created through another router meanwhile"
                            : "it was changed through another router meanwhile: read it again "
                              "and retry");
    } else {
        st_slice pb = st_buf_slice(&op->pb);
        rtr_meta_write(op->r, RTR_META_KIND_PROFILE, op->id, &pb, prof_written, op);
    }
}

static void prof_compare(prof_op *op) {
    st_slice pb = st_buf_slice(&op->pb);
    st_code rc =
        rtr_meta_cas_cached(op->r, RTR_META_KIND_PROFILE, op->id, &pb, prof_compared, op, &op->had);
    if (rc != ST_OK)
        prof_written(op, rc,
                     rc == ST_UNAVAILABLE ? "the first cluster's metadata, where profile changes "
                                            "are compared, is not reachable: retry"
                                          : "out of memory");
}

/* Gives p its full name and a new etag, serializes it and writes the record (p NULL: delete);
 * compare: only if the first cluster's record is still this router's (prof_compare).
 * False: the call was answered without a write (the caller leaves the gate). */
static bool prof_store(rtr_ctx *r, rpc_call *call, prof_kind kind, const char *id,
                       rtr_pb_profile *p, bool compare) {
    prof_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    *op = (prof_op){.r = r, .call = call, .kind = kind};
    snprintf(op->id, sizeof op->id, "%s", id);
    st_buf_init(&op->pb);
    if (p) {
        char name[RTR_PROFILE_NAME_MAX + 1], etag[RTR_PROFILE_ETAG_MAX + 1];
        snprintf(name, sizeof name, "projects/%s/instances/%s/appProfiles/%s", r->topo.project,
                 r->topo.instance, id);
        p->name = name;
        p->etag = (char *)"";
        st_code rc = pack_profile(p, &op->pb);
        if (rc == ST_OK) {
            rtr_profile_new_etag(st_buf_slice(&op->pb), etag);
            p->etag = etag;
            rc = pack_profile(p, &op->pb);
        }
        if (rc != ST_OK) {
            st_buf_free(&op->pb);
            free(op);
            rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return false;
        }
    }
    st_slice pb = st_buf_slice(&op->pb);
    if (compare)
        prof_compare(op);
    else
        rtr_meta_write(r, RTR_META_KIND_PROFILE, id, p ? &pb : NULL, prof_written, op);
    return true;
}

/* Whether call may change profile id now: changes of one profile run one at a time, each on
 * the record as the one before left it (admin_gate.c; docs/router.md, App profiles). Else the
 * call waits and fn runs again when its turn comes, or it was answered. */
static bool prof_gate(rtr_ctx *r, rpc_call *call, const char *id, st_slice bytes, rtr_gate_fn fn) {
    char name[RTR_PROFILE_NAME_MAX + 1];
    snprintf(name, sizeof name, "projects/%s/instances/%s/appProfiles/%s", r->topo.project,
             r->topo.instance, id);
    return rtr_gate_enter(r, name, call, bytes, fn);
}

/* Validation plus, unless ignored, the safety warning; fails the call and returns false. */
static bool prof_check(rtr_ctx *r, rpc_call *call, const char *id, const rtr_pb_profile *p,
                       bool ignore_warnings) {
    st_err err = {0};
    if (rtr_profile_validate(&r->topo, p, &err) == ST_OK &&
        (ignore_warnings || rtr_profile_warnings(&r->meta, &r->topo, id, p, &err) == ST_OK))
        return true;
    rtr_fail(call, err.code, "%s", err.msg);
    return false;
}

/* CreateAppProfile holding the profile's gate: false when answered without a write. */
static bool create_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__CreateAppProfileRequest *req) {
    st_buf scratch;
    st_buf_init(&scratch);
    st_slice old;
    bool exists = rtr_profile_lookup(r, req->app_profile_id, &scratch, &old);
    st_buf_free(&scratch);
    if (exists) {
        rtr_fail(call, ST_ALREADY_EXISTS,
                 "App profile projects/%s/instances/%s/appProfiles/%s already exists.",
                 r->topo.project, r->topo.instance, req->app_profile_id);
        return false;
    }
    return prof_check(r, call, req->app_profile_id, req->app_profile, req->ignore_warnings) &&
           prof_store(r, call, PROF_CREATE, req->app_profile_id, req->app_profile, true);
}

void rtr_h_create_app_profile(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__CreateAppProfileRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__create_app_profile_request__descriptor, bytes);
    if (!req)
        return;
    btu_pb_drop_unknown(&req->base); /* nothing stored carries what no field reads */
    st_err err = {0};
    if (rtr_check_instance(&r->topo, req->parent, false, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (!rtr_profile_id_valid(req->app_profile_id)) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "invalid app profile id '%s': use 1-%d of [-_.a-zA-Z0-9], not starting "
                 "with '-' or '.'",
                 req->app_profile_id, RTR_PROFILE_ID_MAX);
        return;
    }
    if (!req->app_profile) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "app_profile must be set");
        return;
    }
    if (prof_gate(r, call, req->app_profile_id, bytes, rtr_h_create_app_profile) &&
        !create_start(r, call, req))
        rtr_gate_leave(r, call);
}

void rtr_h_get_app_profile(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GetAppProfileRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__get_app_profile_request__descriptor, bytes);
    if (!req)
        return;
    char id[RTR_PROFILE_ID_MAX + 1];
    st_err err = {0};
    if (rtr_profile_parse_name(&r->topo, req->name, id, sizeof id, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_buf scratch;
    st_buf_init(&scratch);
    st_slice pb;
    if (rtr_profile_lookup(r, id, &scratch, &pb))
        reply_bytes(call, pb);
    else
        fail_not_found(call, r, id);
    st_buf_free(&scratch);
}

/* ListAppProfiles pages (rtr_page_token_make): "p1", a CRC32C of the parent, and the last id of
 * the previous page; the next page starts after it, so profiles made or deleted between pages
 * shift nothing. A token this listing did not hand out is refused rather than read as an id: a
 * mangled token would otherwise list nothing, or skip profiles, without a word. */
#define PROFILES_TOKEN_PREFIX "p1"

/* Profiles in id order after `after` ("" for the first page), the built-in default merged in
 * when none is stored. The response is assembled on the wire: field 1 is each stored profile's
 * bytes, field 2 the next page token (made in arena a for the parent of CRC32C crc). */
static st_code list_page(const rtr_ctx *r, const char *after, size_t max, st_arena *a, uint32_t crc,
                         st_buf *out) {
    st_buf def;
    st_buf_init(&def);
    bool need_def = !rtr_meta_find(&r->meta, RTR_META_KIND_PROFILE, RTR_PROFILE_DEFAULT);
    st_code rc = need_def ? rtr_profile_default_pb(&r->topo, &def) : ST_OK;
    const char *last = NULL;
    size_t n = 0, i = 0;
    while (rc == ST_OK) {
        bool take_def = need_def && (i == r->meta.n_profiles ||
                                     strcmp(RTR_PROFILE_DEFAULT, r->meta.profiles[i].name) < 0);
        if (!take_def && i == r->meta.n_profiles)
            break;
        const char *id = take_def ? RTR_PROFILE_DEFAULT : r->meta.profiles[i].name;
        st_slice pb = take_def ? st_buf_slice(&def)
                               : st_slice_make(r->meta.profiles[i].pb, r->meta.profiles[i].len);
        if (take_def)
            need_def = false;
        else
            i++;
        if (after[0] && strcmp(id, after) <= 0)
            continue;
        if (n == max) {
            const char *tok =
                rtr_page_token_make(a, PROFILES_TOKEN_PREFIX, crc, st_slice_cstr(last));
            rc = tok ? rtr_wire_put_bytes(out, 2, st_slice_cstr(tok)) : ST_RESOURCE_EXHAUSTED;
            break;
        }
        rc = rtr_wire_put_bytes(out, 1, pb);
        last = id;
        n++;
    }
    st_buf_free(&def);
    return rc;
}

void rtr_h_list_app_profiles(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ListAppProfilesRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__list_app_profiles_request__descriptor, bytes);
    if (!req)
        return;
    st_err err = {0};
    if (rtr_check_instance(&r->topo, req->parent, true, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (req->page_size < 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "page_size must not be negative");
        return;
    }
    size_t max = req->page_size > 0 && req->page_size < RTR_LIST_PAGE_MAX ? (size_t)req->page_size
                                                                          : RTR_LIST_PAGE_MAX;
    st_arena *a = rpc_call_arena(call);
    uint32_t crc = st_crc32c(0, req->parent, strlen(req->parent));
    const char *after = "";
    if (rtr_page_token_after(a, req->page_token, PROFILES_TOKEN_PREFIX, crc, &after, &err) !=
        ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_buf out;
    st_buf_init(&out);
    if (list_page(r, after, max, a, crc, &out) == ST_OK)
        reply_bytes(call, st_buf_slice(&out));
    else
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_buf_free(&out);
}

/* UpdateAppProfile holding the profile's gate: false when answered without a write. */
static bool update_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__UpdateAppProfileRequest *req,
                         const char *id) {
    st_buf scratch;
    st_buf_init(&scratch);
    st_slice pb;
    rtr_pb_profile *cur = NULL;
    if (!rtr_profile_lookup(r, id, &scratch, &pb))
        fail_not_found(call, r, id);
    else
        cur = unpack_stored(call, id, pb);
    st_buf_free(&scratch);
    if (!cur)
        return false;
    /* Optimistic concurrency: an etag that is not the stored one means a change in between. */
    if (req->app_profile->etag[0] && strcmp(req->app_profile->etag, cur->etag) != 0) {
        rtr_fail(call, ST_ABORTED,
                 "app profile '%s' changed since etag %s was read (now %s): read it "
                 "again and retry",
                 id, req->app_profile->etag, cur->etag);
        return false;
    }
    st_err err = {0};
    if (rtr_profile_apply_mask(cur, req->app_profile,
                               req->update_mask ? req->update_mask->paths : NULL,
                               req->update_mask ? req->update_mask->n_paths : 0, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    return prof_check(r, call, id, cur, req->ignore_warnings) &&
           prof_store(r, call, PROF_UPDATE, id, cur, req->app_profile->etag[0] != '\0');
}

void rtr_h_update_app_profile(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__UpdateAppProfileRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__update_app_profile_request__descriptor, bytes);
    if (!req)
        return;
    btu_pb_drop_unknown(&req->base); /* nothing stored carries what no field reads */
    if (!req->app_profile) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "app_profile must be set");
        return;
    }
    char id[RTR_PROFILE_ID_MAX + 1];
    st_err err = {0};
    if (rtr_profile_parse_name(&r->topo, req->app_profile->name, id, sizeof id, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (prof_gate(r, call, id, bytes, rtr_h_update_app_profile) && !update_start(r, call, req, id))
        rtr_gate_leave(r, call);
}

void rtr_h_delete_app_profile(rpc_call *call, st_slice bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__DeleteAppProfileRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__delete_app_profile_request__descriptor, bytes);
    if (!req)
        return;
    char id[RTR_PROFILE_ID_MAX + 1];
    st_err err = {0};
    if (rtr_profile_parse_name(&r->topo, req->name, id, sizeof id, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    /* Requests without a profile id use "default": it must stay. */
    if (strcmp(id, RTR_PROFILE_DEFAULT) == 0) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "the default app profile cannot be deleted: requests without an app "
                 "profile id use it (update it instead)");
        return;
    }
    if (!prof_gate(r, call, id, bytes, rtr_h_delete_app_profile))
        return;
    if (!rtr_meta_find(&r->meta, RTR_META_KIND_PROFILE, id)) {
        fail_not_found(call, r, id);
        rtr_gate_leave(r, call);
    } else if (!prof_store(r, call, PROF_DELETE, id, NULL, false)) {
        rtr_gate_leave(r, call);
    }
}
