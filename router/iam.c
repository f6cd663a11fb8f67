/* iam.c — IAM policies of the instance and of its tables: GetIamPolicy, SetIamPolicy and
 * TestIamPermissions of BigtableInstanceAdmin and BigtableTableAdmin (google.iam.v1 messages).
 * A policy is a record "iam/<resource name>" of the metadata table (meta.c), so every router of
 * the instance enforces it (after its next metadata reload). Bindings name Bigtable's roles
 * (roles/bigtable.reader, .user, .admin) and members "user:NAME" or "serviceAccount:NAME", NAME
 * a principal of the auth file (auth.c). The etag is a hash of the bindings and the previous
 * etag: a SetIamPolicy carrying an etag other than the current one ends ABORTED. The store is a
 * compare-and-set (CheckAndMutateRow) on the first cluster's metadata: it succeeds only if the
 * record there is still the one this router compared the etag with, so of two routers setting
 * with the same etag at once exactly one wins and the other ends ABORTED too. A policy is
 * bounded (bindings without members dropped, IAM_MEMBERS_MAX members, IAM_POLICY_BYTES_MAX
 * bytes), since every router re-reads every record of the metadata table every second. */
#include "router_internal.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/iam/v1/iam_policy.pb-c.h"
#include "google/iam/v1/policy.pb-c.h"
#include "strata/auth.h"

#define RTR_IA_PATH "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
/* Etags are ASCII: the Node.js client turns them into an ASCII string and back. */
#define IAM_ETAG_BYTES 16     /* hex digits of a SHA-256 prefix */
#define IAM_ETAG_EMPTY "ACAB" /* of a resource without a policy, as Cloud Bigtable answers */
#define IAM_MEMBERS_MAX 1500  /* as Cloud IAM's limit on members in one policy */
/* A stored policy's serialized bytes. Cloud IAM takes policies of "a few tens of KB"; every
 * router reads every policy of the instance every second (meta.c), so the bound is theirs too.
 * 1,500 members of typical names take about 40 KB. */
#define IAM_POLICY_BYTES_MAX (64 * 1024)

typedef Google__Iam__V1__Policy pb_policy;
typedef Google__Iam__V1__Binding pb_binding;

/* ---- the role a policy gives a principal (pure, no allocation) ---- */

static bool member_is(st_slice m, const char *principal) {
    static const char *const kinds[] = {"user:", "serviceAccount:"};
    size_t n = strlen(principal);
    for (size_t i = 0; i < 2; i++) {
        size_t k = strlen(kinds[i]);
        if (m.len == k + n && !memcmp(m.data, kinds[i], k) && !memcmp(m.data + k, principal, n))
            return true;
    }
    return false;
}

/* The role of one Binding message when principal is among its members. */
static st_role binding_role(st_slice b, const char *principal) {
    const uint8_t *p = b.data, *end = rtr_slice_end(b);
    rtr_wire_field f;
    bool bad = false, member = false;
    char role[32] = "";
    while (rtr_wire_next(&p, end, &f, &bad)) {
        if (f.num == 1 && f.wire_type == 2 && f.bytes.len < sizeof role) {
            memcpy(role, f.bytes.data, f.bytes.len);
            role[f.bytes.len] = '\0';
        } else if (f.num == 2 && f.wire_type == 2 && member_is(f.bytes, principal))
            member = true;
    }
    return member && !bad && !strncmp(role, "roles/", 6) ? st_auth_role_parse(role) : ST_ROLE_NONE;
}

st_role rtr_iam_role(st_slice policy, const char *principal) {
    const uint8_t *p = policy.data, *end = rtr_slice_end(policy);
    rtr_wire_field f;
    bool bad = false;
    st_role best = ST_ROLE_NONE;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 4 && f.wire_type == 2) {
            st_role r = binding_role(f.bytes, principal);
            best = r > best ? r : best;
        }
    return best;
}

/* ---- resources ---- */

/* The resource of an instance-admin IAM call must be this instance; of a table-admin call, an
 * existing table of it. false after failing the call. */
static bool resource_check(rtr_ctx *r, rpc_call *call, const char *resource, bool table) {
    if (!table) {
        if (resource && !strcmp(resource, rtr_auth_instance(r)))
            return true;
        rtr_fail(call, ST_NOT_FOUND, "instance \"%.300s\" not found: this Strata instance is %s",
                 resource ? resource : "", rtr_auth_instance(r));
        return false;
    }
    if (resource && strstr(resource, "/backups/")) {
        rtr_fail(call, ST_UNIMPLEMENTED,
                 "IAM policies of backups are not supported: set them on the instance");
        return false;
    }
    return rtr_table_or_fail(r, call, resource ? resource : "") != NULL;
}

/* The stored policy of resource, or an empty one (version 1, the etag of nothing). NULL after
 * failing the call (a stored record that does not parse). */
static pb_policy *policy_load(rtr_ctx *r, rpc_call *call, const char *resource) {
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, RTR_META_KIND_IAM, resource);
    if (rec)
        return (pb_policy *)rtr_unpack(call, &google__iam__v1__policy__descriptor,
                                       st_slice_make(rec->pb, rec->len));
    pb_policy *p = st_arena_alloc(rpc_call_arena(call), sizeof *p);
    if (!p) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    google__iam__v1__policy__init(p);
    p->version = 1;
    p->etag = (ProtobufCBinaryData){strlen(IAM_ETAG_EMPTY), (uint8_t *)IAM_ETAG_EMPTY};
    return p;
}

/* ---- GetIamPolicy ---- */

static void get_policy(rpc_call *call, st_slice req_bytes, rtr_ctx *r, bool table) {
    Google__Iam__V1__GetIamPolicyRequest *req =
        (void *)rtr_unpack(call, &google__iam__v1__get_iam_policy_request__descriptor, req_bytes);
    if (!req || !resource_check(r, call, req->resource, table))
        return;
    pb_policy *p = policy_load(r, call, req->resource);
    if (p)
        rtr_reply(call, &p->base);
}

static void h_get_instance_policy(rpc_call *call, st_slice req, void *arg) {
    get_policy(call, req, arg, false);
}
static void h_get_table_policy(rpc_call *call, st_slice req, void *arg) {
    get_policy(call, req, arg, true);
}

/* ---- SetIamPolicy ---- */

/* Bindings without members grant nothing: they are dropped, as Cloud IAM drops them, so that
 * they neither take room in the stored policy (150,000 of them made a 3.75 MB record) nor escape
 * the member limit. What is left has at most IAM_MEMBERS_MAX bindings. */
static void bindings_drop_empty(pb_policy *p) {
    size_t n = 0;
    for (size_t i = 0; i < p->n_bindings; i++)
        if (p->bindings[i]->n_members)
            p->bindings[n++] = p->bindings[i];
    p->n_bindings = n;
}

static st_code bindings_check(const pb_policy *p, st_err *err) {
    size_t members = 0;
    for (size_t i = 0; i < p->n_bindings; i++) {
        const pb_binding *b = p->bindings[i];
        if (strncmp(b->role, "roles/", 6) || st_auth_role_parse(b->role) == ST_ROLE_NONE)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "role \"%.100s\" is not supported: use roles/bigtable.reader, "
                              "roles/bigtable.user or roles/bigtable.admin",
                              b->role);
        /* A condition (field 3) narrows a grant; ignoring it would grant the role always. */
        if (b->base.n_unknown_fields)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "the binding of role \"%.100s\" carries a condition or another "
                              "field Strata does not support: bindings apply unconditionally "
                              "here, so remove the condition",
                              b->role);
        for (size_t j = 0; j < b->n_members; j++) {
            const char *m = b->members[j];
            const char *colon = strchr(m, ':');
            bool kind_ok = colon && (!strncmp(m, "user:", 5) || !strncmp(m, "serviceAccount:", 15));
            if (!kind_ok || !st_auth_name_valid(colon + 1))
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "member \"%.100s\" is not supported: use user:NAME or "
                                  "serviceAccount:NAME with NAME a principal of the auth file",
                                  m);
        }
        if ((members += b->n_members) > IAM_MEMBERS_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "more than %d members in one policy (each occurrence of a member "
                              "counts, as in Cloud IAM): grant roles to fewer principals, or "
                              "grant a role on the instance instead of on each table",
                              IAM_MEMBERS_MAX);
    }
    return ST_OK;
}

/* The new policy's etag: a hash of its bindings and the current etag, so that every change
 * gives a new one. */
static void etag_next(rpc_call *call, pb_policy *p, const pb_policy *cur) {
    p->etag = (ProtobufCBinaryData){0, NULL};
    size_t len = protobuf_c_message_get_packed_size(&p->base);
    uint8_t *buf = st_arena_alloc(rpc_call_arena(call), len + cur->etag.len + IAM_ETAG_BYTES);
    if (!buf)
        return;
    protobuf_c_message_pack(&p->base, buf);
    if (cur->etag.len)
        memcpy(buf + len, cur->etag.data, cur->etag.len);
    uint8_t digest[SHA256_DIGEST_LENGTH];
    SHA256(buf, len + cur->etag.len, digest);
    uint8_t *tag = buf + len + cur->etag.len;
    for (size_t i = 0; i < IAM_ETAG_BYTES; i++)
        tag[i] = (uint8_t) "0123456789abcdef"[(digest[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    p->etag = (ProtobufCBinaryData){IAM_ETAG_BYTES, tag};
}

typedef struct set_op {
    rpc_call *call;
    rtr_ctx *r;
    const char *resource;
    pb_policy *policy;
    st_slice pb; /* the new policy's bytes */
    bool had;    /* this router's copy had a record: the compare expects it */
} set_op;

static void set_recorded(void *arg, st_code code, const char *msg) {
    set_op *op = arg; /* in the call's arena: read before the call is answered */
    rtr_ctx *r = op->r;
    rpc_call *call = op->call;
    if (code != ST_OK)
        rtr_fail(call, code, "could not store the policy: %s", msg ? msg : "");
    else
        rtr_reply(call, &op->policy->base);
    rtr_gate_leave(r, call);
}

/* ---- the compare-and-set in the metadata table ---- */

/* The compare-and-set stores the policy only if the first cluster's record still holds what this
 * router read (none: there is no record). */
static void cas_done(void *arg, st_code code, const char *message, bool matched) {
    set_op *op = arg;
    /* With a record expected, stored when the predicate matched; without, when it did not. */
    bool stored = matched == op->had;
    rtr_ctx *r = op->r;
    rpc_call *call = op->call;
    if (code == ST_OK && stored) {
        /* Every cluster's copy and this router's cache, as any metadata write. */
        rtr_meta_write(r, RTR_META_KIND_IAM, op->resource, &op->pb, set_recorded, op);
        return;
    }
    if (code != ST_OK)
        rtr_fail(call, code,
                 "could not store the policy in the metadata of cluster %s (the first of the "
                 "topology, where policy changes are compared and set): %s; retry when it is "
                 "reachable",
                 r->clusters[0].topo->id, message);
    else
        rtr_fail(call, ST_ABORTED,
                 "the policy of %s was changed concurrently (through another router): read it "
                 "again with GetIamPolicy, apply the change and set it again",
                 op->resource);
    rtr_gate_leave(r, call);
}

/* Stores op's policy if the first cluster's record still holds what this router read; false when
 * the call was answered without a compare. */
static bool cas_send(set_op *op) {
    rtr_ctx *r = op->r;
    st_code rc =
        rtr_meta_cas_cached(r, RTR_META_KIND_IAM, op->resource, &op->pb, cas_done, op, &op->had);
    if (rc == ST_OK)
        return true;
    rtr_fail(op->call, rc != ST_UNAVAILABLE ? ST_RESOURCE_EXHAUSTED : ST_UNAVAILABLE,
             rc != ST_UNAVAILABLE ? "out of memory storing the policy"
                                  : "no tablet of the metadata table is known in cluster %s, where "
                                    "policy changes are compared and set: retry when it is "
                                    "reachable",
             r->clusters[0].topo->id);
    return false;
}

static void h_set_table_policy(rpc_call *call, st_slice req, void *arg);

/* p serialized into the call's arena, at most IAM_POLICY_BYTES_MAX bytes; false after failing
 * the call. */
static bool policy_pack(rpc_call *call, const pb_policy *p, st_slice *out) {
    size_t len = protobuf_c_message_get_packed_size(&p->base);
    if (len > IAM_POLICY_BYTES_MAX) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "the policy would take %zu bytes, more than the %d a policy may take: grant "
                 "roles to fewer principals, or to principals of shorter names",
                 len, IAM_POLICY_BYTES_MAX);
        return false;
    }
    uint8_t *buf = st_arena_alloc(rpc_call_arena(call), len ? len : 1);
    if (!buf) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    protobuf_c_message_pack(&p->base, buf);
    *out = st_slice_make(buf, len);
    return true;
}

/* SetIamPolicyRequest.update_mask: only the fields it names change, "bindings, etag" when it is
 * unset or empty. *bindings tells whether the request's bindings replace the stored ones (the
 * etag is renewed by every set). Strata models no audit configuration (admin calls go to the
 * --audit-log file), so a mask naming audit_configs is refused rather than a change dropped. */
static st_code mask_check(const Google__Protobuf__FieldMask *mask, bool *bindings, st_err *err) {
    *bindings = !mask || mask->n_paths == 0;
    for (size_t i = 0; mask && i < mask->n_paths; i++) {
        const char *path = mask->paths[i];
        if (strcmp(path, "bindings") == 0)
            *bindings = true;
        else if (strcmp(path, "audit_configs") == 0 || strcmp(path, "auditConfigs") == 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "update_mask names audit_configs, which Strata does not keep (its "
                              "audit log is the router's --audit-log file): leave it out of the "
                              "mask");
        else if (strcmp(path, "etag") != 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "update_mask path \"%.100s\" is not supported: name bindings "
                              "and etag, or leave the mask empty (the same)",
                              path);
    }
    return ST_OK;
}

/* Sets the policy of req's resource; false when answered without a store. */
static bool set_start(rpc_call *call, rtr_ctx *r, Google__Iam__V1__SetIamPolicyRequest *req,
                      bool table) {
    if (!resource_check(r, call, req->resource, table))
        return false;
    st_err err = {0};
    if (!req->policy) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "SetIamPolicy needs a policy");
        return false;
    }
    bool bindings;
    bindings_drop_empty(req->policy);
    if (mask_check(req->update_mask, &bindings, &err) != ST_OK ||
        (bindings && bindings_check(req->policy, &err) != ST_OK)) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    pb_policy *cur = policy_load(r, call, req->resource);
    if (!cur)
        return false;
    const ProtobufCBinaryData *e = &req->policy->etag;
    if (e->len && (e->len != cur->etag.len || memcmp(e->data, cur->etag.data, e->len))) {
        rtr_fail(call, ST_ABORTED,
                 "the policy of %s changed since it was read (etag mismatch): read it again "
                 "with GetIamPolicy, apply the change and set it again",
                 req->resource);
        return false;
    }
    bool checked = e->len != 0; /* before etag_next replaces the request's etag (e) */
    pb_policy *p = req->policy;
    p->version = 1;
    if (!bindings) { /* a mask leaving them out keeps every grant */
        p->n_bindings = cur->n_bindings;
        p->bindings = cur->bindings;
    }
    /* Fields Strata does not model (audit_configs) are outside every accepted mask: they keep
     * their stored values, as the default mask says. */
    p->base.n_unknown_fields = cur->base.n_unknown_fields;
    p->base.unknown_fields = cur->base.unknown_fields;
    etag_next(call, p, cur);
    set_op *op = st_arena_alloc(rpc_call_arena(call), sizeof *op);
    st_slice pb;
    if (!op || !p->etag.len) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    if (!policy_pack(call, p, &pb))
        return false;
    *op = (set_op){call, r, req->resource, p, pb, false};
    st_log(ST_LOG_INFO, "router", "msg=\"IAM policy set\" resource=%s bindings=%zu", req->resource,
           p->n_bindings);
    if (checked)
        return cas_send(op);
    /* no etag: replace whatever is there, as Cloud IAM does */
    rtr_meta_write(r, RTR_META_KIND_IAM, req->resource, &op->pb, set_recorded, op);
    return true;
}

/* A table's policy is changed on the table's gate (admin_gate.c), as its schema: a set that read
 * the table before a DeleteTable would store its policy after the delete had forgotten the
 * table's, and a later table of that name would start with it (docs/auth.md). */
static void set_policy(rpc_call *call, st_slice req_bytes, rtr_ctx *r, bool table) {
    Google__Iam__V1__SetIamPolicyRequest *req =
        (void *)rtr_unpack(call, &google__iam__v1__set_iam_policy_request__descriptor, req_bytes);
    if (!req)
        return;
    if (table && !rtr_gate_enter(r, req->resource, call, req_bytes, h_set_table_policy))
        return;
    if (!set_start(call, r, req, table))
        rtr_gate_leave(r, call);
}

static void h_set_instance_policy(rpc_call *call, st_slice req, void *arg) {
    set_policy(call, req, arg, false);
}
static void h_set_table_policy(rpc_call *call, st_slice req, void *arg) {
    set_policy(call, req, arg, true);
}

/* ---- TestIamPermissions ---- */

static void test_permissions(rpc_call *call, st_slice req_bytes, rtr_ctx *r, bool table) {
    Google__Iam__V1__TestIamPermissionsRequest *req = (void *)rtr_unpack(
        call, &google__iam__v1__test_iam_permissions_request__descriptor, req_bytes);
    if (!req)
        return;
    /* Each permission is answered at its own scope, as the calls needing it are checked: on a
     * table, a table permission from the role there (its grants and policy, and the
     * instance's), an instance permission (ListTables, CreateTable, app profiles, backups...)
     * from the instance's role only, so a table's admin is not told it may act on the instance.
     * Without an auth file everyone may do everything. */
    st_role role = ST_ROLE_ADMIN, inst_role = ST_ROLE_ADMIN;
    if (rtr_auth_on(r)) {
        const char *who = rtr_auth_principal(r, call);
        role = who ? rtr_auth_role(r, who, table ? req->resource : NULL) : ST_ROLE_NONE;
        inst_role = who && table ? rtr_auth_role(r, who, NULL) : role;
    }
    /* A principal without a role there gets no permissions whether the table exists or not:
     * NOT_FOUND would tell it which table names exist, which ListTables does not. */
    if (role != ST_ROLE_NONE && !resource_check(r, call, req->resource, table))
        return;
    Google__Iam__V1__TestIamPermissionsResponse resp;
    google__iam__v1__test_iam_permissions_response__init(&resp);
    resp.permissions =
        st_arena_alloc(rpc_call_arena(call), (req->n_permissions + 1) * sizeof *resp.permissions);
    if (!resp.permissions) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < req->n_permissions; i++) {
        const st_auth_perm *p = st_auth_perm_find(req->permissions[i]);
        if (p && p->role <= (p->scope == ST_AUTH_SCOPE_TABLE ? role : inst_role))
            resp.permissions[resp.n_permissions++] = req->permissions[i];
    }
    rtr_reply(call, &resp.base);
}

static void h_test_instance(rpc_call *call, st_slice req, void *arg) {
    test_permissions(call, req, arg, false);
}
static void h_test_table(rpc_call *call, st_slice req, void *arg) {
    test_permissions(call, req, arg, true);
}

/* ---- registration, table deletion ---- */

static void forgotten(void *arg, st_code code, const char *msg) {
    (void)arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router",
               "msg=\"could not delete a deleted table's IAM policy\" "
               "err=\"%s\"",
               msg ? msg : st_code_name(code));
}

void rtr_iam_forget(rtr_ctx *r, const char *table) {
    if (rtr_meta_find(&r->meta, RTR_META_KIND_IAM, table))
        rtr_meta_write(r, RTR_META_KIND_IAM, table, NULL, forgotten, NULL);
}

st_code rtr_iam_register(rtr_ctx *r, st_err *err) {
    static const struct {
        const char *path;
        rpc_handler_fn fn;
    } methods[] = {
        {RTR_IA_PATH "GetIamPolicy", h_get_instance_policy},
        {RTR_IA_PATH "SetIamPolicy", h_set_instance_policy},
        {RTR_IA_PATH "TestIamPermissions", h_test_instance},
        {RTR_TA "GetIamPolicy", h_get_table_policy},
        {RTR_TA "SetIamPolicy", h_set_table_policy},
        {RTR_TA "TestIamPermissions", h_test_table},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st_code rc = rpc_server_add_method(r->rpc, methods[i].path, methods[i].fn, r);
        if (rc != ST_OK)
            return st_err_set(err, rc, "registering %s failed", methods[i].path);
    }
    return ST_OK;
}
