/*
 * Proves the app-profile and operations logic of the router without a network: resource names
 * parse as Bigtable's (and other instances are NOT_FOUND); profile ids follow Bigtable's regex;
 * the routing policy scanned from stored bytes matches what protobuf-c encoded (random profiles,
 * STRATA_SEED), with oneof last-wins and malformed input rejected; validation, update masks and
 * the ignore_warnings safety check behave as documented; the built-in default profile is single-
 * cluster routing to the first cluster with transactional writes; routing picks the profile's
 * cluster, refuses single-row transactions where the profile forbids them with Bigtable's
 * message, answers NOT_FOUND for unknown profiles, and follows a changed record at once; and
 * the operations store keeps, replaces, evicts (bounded) and encodes finished operations.
 * Routing runs on a hand-built rtr_ctx whose nodes have no connection.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "instance.h"

typedef Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting pb_single;
typedef Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny pb_multi;

static void topo_init(st_topology *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->project, sizeof t->project, "p");
    snprintf(t->instance, sizeof t->instance, "i");
    static const char *const ids[] = {"east", "west", "north"};
    for (size_t c = 0; c < 3; c++) {
        snprintf(t->clusters[c].id, sizeof t->clusters[c].id, "%s", ids[c]);
        snprintf(t->clusters[c].zone, sizeof t->clusters[c].zone, "zone-%zu", c);
        t->clusters[c].n_nodes = 1;
        snprintf(t->clusters[c].nodes[0].addr, sizeof t->clusters[c].nodes[0].addr, "127.0.0.1:%zu",
                 7000 + c);
    }
    t->n_clusters = 3;
}

/* A router context with no connections: enough for routing and lookups. */
static rtr_ctx *ctx_new(void) {
    rtr_ctx *r = calloc(1, sizeof *r);
    assert_non_null(r);
    topo_init(&r->topo);
    r->n_clusters = r->topo.n_clusters;
    for (size_t c = 0; c < r->n_clusters; c++) {
        r->clusters[c].ctx = r;
        r->clusters[c].topo = &r->topo.clusters[c];
        r->clusters[c].idx = c;
        r->clusters[c].n_nodes = 1;
        r->clusters[c].nodes[0].ctx = r;
        r->clusters[c].nodes[0].cluster = &r->clusters[c];
    }
    return r;
}

static void ctx_free(rtr_ctx *r) {
    rtr_meta_free(&r->meta);
    free(r);
}

static void pack(const Google__Bigtable__Admin__V2__AppProfile *p, st_buf *out) {
    size_t len = google__bigtable__admin__v2__app_profile__get_packed_size(p);
    st_buf_reset(out);
    assert_int_equal(st_buf_reserve(out, len + 1), ST_OK);
    out->len = google__bigtable__admin__v2__app_profile__pack(p, out->data);
}

/* Profile helpers: single-cluster or multi-cluster routing. */
static void mk_single(rtr_pb_profile *p, pb_single *s, const char *cluster, bool txn) {
    google__bigtable__admin__v2__app_profile__init(p);
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(s);
    s->cluster_id = (char *)cluster;
    s->allow_transactional_writes = txn;
    p->routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p->single_cluster_routing = s;
}

static void mk_multi(rtr_pb_profile *p, pb_multi *m, char **ids, size_t n) {
    google__bigtable__admin__v2__app_profile__init(p);
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__init(m);
    m->cluster_ids = ids;
    m->n_cluster_ids = n;
    p->routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_MULTI_CLUSTER_ROUTING_USE_ANY;
    p->multi_cluster_routing_use_any = m;
}

static void store(rtr_ctx *r, const char *id, const rtr_pb_profile *p) {
    st_buf b;
    st_buf_init(&b);
    pack(p, &b);
    assert_int_equal(rtr_meta_put(&r->meta, RTR_META_KIND_PROFILE, id, st_buf_slice(&b)), ST_OK);
    st_buf_free(&b);
}

static void test_profiles_names(void **state) {
    (void)state;
    st_topology t;
    topo_init(&t);
    static const char *const lits[] = {"projects", NULL, "instances", NULL};
    st_slice v[2];
    assert_true(rtr_name_match("projects/p/instances/i", lits, 4, v));
    assert_true(st_slice_eq(v[1], st_slice_cstr("i")));
    assert_false(rtr_name_match("projects/p/instances/i/", lits, 4, v));
    assert_false(rtr_name_match("projects//instances/i", lits, 4, v));
    assert_false(rtr_name_match("projects/p/instance/i", lits, 4, v));
    assert_false(rtr_name_match("projects/p/instances", lits, 4, v));

    assert_true(rtr_profile_id_valid("default"));
    assert_true(rtr_profile_id_valid("_a-b.c9"));
    assert_false(rtr_profile_id_valid(""));
    assert_false(rtr_profile_id_valid("-a"));
    assert_false(rtr_profile_id_valid(".a"));
    assert_false(rtr_profile_id_valid("a/b"));
    assert_false(rtr_profile_id_valid("a b"));
    char long_id[RTR_PROFILE_ID_MAX + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_false(rtr_profile_id_valid(long_id));
    long_id[RTR_PROFILE_ID_MAX] = '\0';
    assert_true(rtr_profile_id_valid(long_id));

    char id[RTR_PROFILE_ID_MAX + 1];
    st_err err = {0};
    assert_int_equal(
        rtr_profile_parse_name(&t, "projects/p/instances/i/appProfiles/x1", id, sizeof id, &err),
        ST_OK);
    assert_string_equal(id, "x1");
    assert_int_equal(
        rtr_profile_parse_name(&t, "projects/p/instances/j/appProfiles/x1", id, sizeof id, &err),
        ST_NOT_FOUND);
    assert_int_equal(
        rtr_profile_parse_name(&t, "projects/p/instances/i/profiles/x1", id, sizeof id, &err),
        ST_INVALID_ARGUMENT);
    assert_int_equal(
        rtr_profile_parse_name(&t, "projects/p/instances/i/appProfiles/-x", id, sizeof id, &err),
        ST_INVALID_ARGUMENT);
    assert_int_equal(rtr_check_instance(&t, "projects/p/instances/i", false, &err), ST_OK);
    assert_int_equal(rtr_check_instance(&t, "projects/p/instances/-", false, &err), ST_NOT_FOUND);
    assert_int_equal(rtr_check_instance(&t, "projects/p/instances/-", true, &err), ST_OK);
    assert_int_equal(rtr_check_instance(&t, "projects/q/instances/i", true, &err), ST_NOT_FOUND);
    assert_int_equal(rtr_check_instance(&t, "projects/p", true, &err), ST_INVALID_ARGUMENT);
}

static void test_profiles_policy_parse(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    rtr_pb_profile p;
    pb_single s;
    pb_multi m;
    rtr_policy pol;
    st_err err = {0};
    mk_single(&p, &s, "west", true);
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_OK);
    assert_int_equal(pol.kind, RTR_ROUTING_SINGLE);
    assert_string_equal(pol.cluster_id, "west");
    assert_true(pol.allow_transactional_writes);
    assert_false(pol.data_boost);

    /* Data Boost isolation (read-only) is seen beside the routing policy. */
    Google__Bigtable__Admin__V2__AppProfile__DataBoostIsolationReadOnly db;
    google__bigtable__admin__v2__app_profile__data_boost_isolation_read_only__init(&db);
    mk_single(&p, &s, "west", false);
    p.isolation_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_DATA_BOOST_ISOLATION_READ_ONLY;
    p.data_boost_isolation_read_only = &db;
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_OK);
    assert_true(pol.data_boost);
    assert_string_equal(pol.cluster_id, "west");
    p.isolation_case = GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION__NOT_SET;

    char *ids[] = {"west", "east"};
    mk_multi(&p, &m, ids, 2);
    Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny__RowAffinity aff;
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__row_affinity__init(
        &aff);
#define ROW_AFFINITY                                                                               \
    GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__MULTI_CLUSTER_ROUTING_USE_ANY__AFFINITY_ROW_AFFINITY
    m.affinity_case = ROW_AFFINITY;
    m.row_affinity = &aff;
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_OK);
    assert_int_equal(pol.kind, RTR_ROUTING_MULTI);
    assert_int_equal(pol.n_cluster_ids, 2);
    assert_string_equal(pol.cluster_ids[1], "east");
    assert_true(pol.row_affinity);

    /* A oneof: a single_cluster_routing appended after the multi one wins. */
    st_buf tail;
    st_buf_init(&tail);
    mk_single(&p, &s, "north", false);
    pack(&p, &tail);
    assert_int_equal(st_buf_append(&b, tail.data, tail.len), ST_OK);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_OK);
    assert_int_equal(pol.kind, RTR_ROUTING_SINGLE);
    assert_string_equal(pol.cluster_id, "north");
    assert_false(pol.allow_transactional_writes);

    /* No policy; truncated bytes; too many cluster ids. */
    google__bigtable__admin__v2__app_profile__init(&p);
    p.description = (char *)"x";
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_OK);
    assert_int_equal(pol.kind, RTR_ROUTING_NONE);
    mk_single(&p, &s, "west", true);
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_slice_make(b.data, b.len - 1), &pol, &err),
                     ST_INVALID_ARGUMENT);
    char *many[ST_TOPO_CLUSTERS_MAX + 1];
    for (size_t i = 0; i < ST_TOPO_CLUSTERS_MAX + 1; i++)
        many[i] = (char *)"c";
    mk_multi(&p, &m, many, ST_TOPO_CLUSTERS_MAX + 1);
    pack(&p, &b);
    assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, &err), ST_INVALID_ARGUMENT);
    st_buf_free(&tail);
    st_buf_free(&b);
}

/* Random profiles encoded by protobuf-c scan back to the same policy. */
static void test_profiles_policy_parse_random(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_profiles_policy_parse_random"));
    static char *const names[] = {"east", "west", "north", "a", "zone-9"};
    st_buf b;
    st_buf_init(&b);
    for (int iter = 0; iter < 500; iter++) {
        rtr_pb_profile p;
        pb_single s;
        pb_multi m;
        char *ids[ST_TOPO_CLUSTERS_MAX];
        bool single = st_rng_below(&rng, 2) == 0;
        size_t n = (size_t)st_rng_below(&rng, ST_TOPO_CLUSTERS_MAX + 1);
        for (size_t i = 0; i < n; i++)
            ids[i] = names[st_rng_below(&rng, 5)];
        if (single)
            mk_single(&p, &s, names[st_rng_below(&rng, 5)], st_rng_below(&rng, 2) == 0);
        else
            mk_multi(&p, &m, ids, n);
        p.description = st_rng_below(&rng, 2) ? (char *)"some description" : (char *)"";
        p.etag = (char *)"0123";
        pack(&p, &b);
        rtr_policy pol;
        assert_int_equal(rtr_policy_parse(st_buf_slice(&b), &pol, NULL), ST_OK);
        assert_int_equal(pol.kind, single ? RTR_ROUTING_SINGLE : RTR_ROUTING_MULTI);
        if (single) {
            assert_string_equal(pol.cluster_id, s.cluster_id);
            assert_int_equal(pol.allow_transactional_writes, s.allow_transactional_writes);
            continue;
        }
        assert_int_equal(pol.n_cluster_ids, n);
        for (size_t i = 0; i < n; i++)
            assert_string_equal(pol.cluster_ids[i], ids[i]);
    }
    st_buf_free(&b);
}

static void test_profiles_validate(void **state) {
    (void)state;
    st_topology t;
    topo_init(&t);
    rtr_pb_profile p;
    pb_single s;
    pb_multi m;
    st_err err = {0};
    mk_single(&p, &s, "west", false);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_OK);
    mk_single(&p, &s, "nowhere", false);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "nowhere"));
    mk_single(&p, &s, "", false);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    google__bigtable__admin__v2__app_profile__init(&p);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "routing policy"));

    mk_multi(&p, &m, NULL, 0);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_OK);
    char *dup[] = {"east", "east"};
    mk_multi(&p, &m, dup, 2);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    char *unknown[] = {"east", "mars"};
    mk_multi(&p, &m, unknown, 2);
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);

    /* Data Boost: read-only single-cluster only. */
    Google__Bigtable__Admin__V2__AppProfile__DataBoostIsolationReadOnly db;
    google__bigtable__admin__v2__app_profile__data_boost_isolation_read_only__init(&db);
    mk_multi(&p, &m, NULL, 0);
    p.isolation_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_DATA_BOOST_ISOLATION_READ_ONLY;
    p.data_boost_isolation_read_only = &db;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    mk_single(&p, &s, "east", false);
    p.isolation_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_DATA_BOOST_ISOLATION_READ_ONLY;
    p.data_boost_isolation_read_only = &db;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_OK);
    db.compute_billing_owner = 7; /* no such owner */
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "compute_billing_owner"));

    /* Isolation priorities: the defined ones only (enums are open on the wire). */
    Google__Bigtable__Admin__V2__AppProfile__StandardIsolation si;
    google__bigtable__admin__v2__app_profile__standard_isolation__init(&si);
    mk_single(&p, &s, "east", false);
    p.isolation_case = GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_STANDARD_ISOLATION;
    p.standard_isolation = &si;
    si.priority = GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__PRIORITY__PRIORITY_HIGH;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_OK);
    si.priority = 99;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "priority 99"));
    p.isolation_case = GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ISOLATION_PRIORITY;
    p.priority = -2;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);

    char *desc = malloc(RTR_PROFILE_DESC_MAX + 2);
    memset(desc, 'd', RTR_PROFILE_DESC_MAX + 1);
    desc[RTR_PROFILE_DESC_MAX + 1] = '\0';
    mk_single(&p, &s, "east", false);
    p.description = desc;
    assert_int_equal(rtr_profile_validate(&t, &p, &err), ST_INVALID_ARGUMENT);
    free(desc);
}

static void test_profiles_apply_mask(void **state) {
    (void)state;
    rtr_pb_profile cur, req;
    pb_single s1, s2;
    pb_multi m;
    mk_single(&cur, &s1, "east", true);
    cur.description = (char *)"old";
    mk_multi(&req, &m, NULL, 0);
    req.description = (char *)"new";
    st_err err = {0};
    char *only_desc[] = {"description"};
    assert_int_equal(rtr_profile_apply_mask(&cur, &req, only_desc, 1, &err), ST_OK);
    assert_string_equal(cur.description, "new");
    assert_int_equal(
        cur.routing_policy_case,
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING);
    char *routing[] = {"multi_cluster_routing_use_any"};
    assert_int_equal(rtr_profile_apply_mask(&cur, &req, routing, 1, &err), ST_OK);
    assert_ptr_equal(cur.multi_cluster_routing_use_any, &m);
    /* Empty mask: everything updatable is replaced. */
    mk_single(&req, &s2, "west", false);
    req.description = (char *)"all";
    assert_int_equal(rtr_profile_apply_mask(&cur, &req, NULL, 0, &err), ST_OK);
    assert_string_equal(cur.description, "all");
    assert_string_equal(cur.single_cluster_routing->cluster_id, "west");
    char *bad[] = {"description", "name"};
    assert_int_equal(rtr_profile_apply_mask(&cur, &req, bad, 2, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "name"));
}

static void test_profiles_warnings(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    rtr_pb_profile p, q;
    pb_single s, sq;
    st_err err = {0};
    /* Only the built-in default (east, transactional) exists. */
    mk_single(&p, &s, "east", true);
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "a", &p, &err), ST_OK);
    mk_single(&p, &s, "west", true);
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "a", &p, &err),
                     ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "ignore_warnings"));
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "default", &p, &err), ST_OK);
    mk_single(&p, &s, "west", false);
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "a", &p, &err), ST_OK);
    /* A stored default without transactions, and another profile with them on north. */
    mk_single(&q, &sq, "east", false);
    store(r, "default", &q);
    mk_single(&q, &sq, "north", true);
    store(r, "tx", &q);
    mk_single(&p, &s, "west", true);
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "a", &p, &err),
                     ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "'tx'"));
    assert_int_equal(rtr_profile_warnings(&r->meta, &r->topo, "tx", &p, &err), ST_OK);
    ctx_free(r);
}

static void test_profiles_default(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    st_buf a, b;
    st_buf_init(&a);
    st_buf_init(&b);
    assert_int_equal(rtr_profile_default_pb(&r->topo, &a), ST_OK);
    assert_int_equal(rtr_profile_default_pb(&r->topo, &b), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&a), st_buf_slice(&b))); /* same etag everywhere */
    rtr_pb_profile *p = google__bigtable__admin__v2__app_profile__unpack(NULL, a.len, a.data);
    assert_non_null(p);
    assert_string_equal(p->name, "projects/p/instances/i/appProfiles/default");
    assert_true(p->etag[0] != '\0');
    assert_int_equal(
        p->routing_policy_case,
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING);
    assert_string_equal(p->single_cluster_routing->cluster_id, "east");
    assert_true(p->single_cluster_routing->allow_transactional_writes);
    google__bigtable__admin__v2__app_profile__free_unpacked(p, NULL);

    st_slice got;
    assert_true(rtr_profile_lookup(r, "default", &b, &got));
    assert_true(st_slice_eq(got, st_buf_slice(&a)));
    assert_false(rtr_profile_lookup(r, "other", &b, &got));
    /* A stored default replaces the built-in one. */
    rtr_pb_profile q;
    pb_single s;
    mk_single(&q, &s, "west", false);
    store(r, "default", &q);
    assert_true(rtr_profile_lookup(r, "default", &b, &got));
    assert_false(st_slice_eq(got, st_buf_slice(&a)));
    st_buf_free(&a);
    st_buf_free(&b);
    ctx_free(r);
}

static void test_profiles_route(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    rtr_cluster *c = NULL;
    st_err err = {0};
    /* Empty id = default = built-in: east, transactions allowed. */
    assert_int_equal(rtr_profile_route(r, "", true, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[0]);
    assert_int_equal(rtr_profile_route(r, "nosuch", false, &c, &err), ST_NOT_FOUND);
    assert_non_null(strstr(err.msg, "nosuch"));

    rtr_pb_profile p;
    pb_single s;
    pb_multi m;
    mk_single(&p, &s, "west", false);
    store(r, "w", &p);
    assert_int_equal(rtr_profile_route(r, "w", false, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[1]);
    assert_int_equal(rtr_profile_route(r, "w", true, &c, &err), ST_FAILED_PRECONDITION);
    assert_string_equal(err.msg, RTR_TXN_DENIED_MSG);
    /* Repointing the record takes effect for the next request. */
    mk_single(&p, &s, "north", true);
    store(r, "w", &p);
    assert_int_equal(rtr_profile_route(r, "w", true, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[2]);

    /* Multi-cluster: first healthy listed cluster; never transactions. */
    char *ids[] = {"west", "north"};
    mk_multi(&p, &m, ids, 2);
    store(r, "any", &p);
    assert_int_equal(rtr_profile_route(r, "any", false, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[1]);
    r->clusters[1].nodes[0].retry_at_us = st_mono_us() + 3600LL * 1000000; /* west is down */
    assert_false(rtr_cluster_healthy(&r->clusters[1]));
    assert_int_equal(rtr_profile_route(r, "any", false, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[2]);
    assert_int_equal(rtr_profile_route(r, "any", true, &c, &err), ST_FAILED_PRECONDITION);
    r->clusters[2].nodes[0].retry_at_us = st_mono_us() + 3600LL * 1000000; /* all down */
    assert_int_equal(rtr_profile_route(r, "any", false, &c, &err), ST_OK);
    assert_ptr_equal(c, &r->clusters[1]);

    /* A profile naming a cluster the topology no longer has; an unreadable record. */
    mk_single(&p, &s, "gone", false);
    store(r, "g", &p);
    assert_int_equal(rtr_profile_route(r, "g", false, &c, &err), ST_FAILED_PRECONDITION);
    assert_int_equal(rtr_meta_put(&r->meta, RTR_META_KIND_PROFILE, "bad", ST_SLICE_LIT("\x32\x05")),
                     ST_OK);
    assert_int_equal(rtr_profile_route(r, "bad", false, &c, &err), ST_INTERNAL);
    ctx_free(r);
}

static void test_ops_store(void **state) {
    (void)state;
    rtr_ops *o = rtr_ops_new();
    assert_non_null(o);
    char n1[RTR_OP_NAME_MAX + 1], n2[RTR_OP_NAME_MAX + 1];
    rtr_ops_name(o, "projects/p/instances/i/appProfiles/a", n1);
    rtr_ops_name(o, "projects/p/instances/i/appProfiles/a", n2);
    assert_string_not_equal(n1, n2);
    assert_int_equal(strncmp(n1, "operations/projects/p/instances/i/appProfiles/a/", 48), 0);
    assert_int_equal(rtr_ops_put(o, n1, ST_SLICE_LIT("one")), ST_OK);
    assert_int_equal(rtr_ops_put(o, n1, ST_SLICE_LIT("uno")), ST_OK);
    st_slice got;
    assert_true(rtr_ops_get(o, n1, &got));
    assert_true(st_slice_eq(got, ST_SLICE_LIT("uno")));
    assert_false(rtr_ops_get(o, n2, &got));
    /* Bounded: beyond RTR_OPS_MAX the oldest goes. */
    char name[RTR_OP_NAME_MAX + 1];
    for (int i = 0; i < RTR_OPS_MAX; i++) {
        snprintf(name, sizeof name, "op/%d", i);
        assert_int_equal(rtr_ops_put(o, name, ST_SLICE_LIT("x")), ST_OK);
    }
    assert_false(rtr_ops_get(o, n1, &got));
    assert_true(rtr_ops_get(o, "op/0", &got));
    assert_true(rtr_ops_get(o, name, &got));
    assert_true(rtr_ops_delete(o, "op/0"));
    assert_false(rtr_ops_delete(o, "op/0"));
    assert_false(rtr_ops_get(o, "op/0", &got));
    rtr_ops_free(o);
}

static void test_ops_pack_done(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(rtr_op_pack_done("operations/x/1", "type.googleapis.com/M", ST_SLICE_LIT(""),
                                      "type.googleapis.com/R", ST_SLICE_LIT("resp"), &b),
                     ST_OK);
    Google__Longrunning__Operation *op =
        google__longrunning__operation__unpack(NULL, b.len, b.data);
    assert_non_null(op);
    assert_string_equal(op->name, "operations/x/1");
    assert_true(op->done);
    assert_int_equal(op->result_case, GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE);
    assert_string_equal(op->response->type_url, "type.googleapis.com/R");
    assert_int_equal(op->response->value.len, 4);
    assert_memory_equal(op->response->value.data, "resp", 4);
    assert_string_equal(op->metadata->type_url, "type.googleapis.com/M");
    google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profiles_names),
        cmocka_unit_test(test_profiles_policy_parse),
        cmocka_unit_test(test_profiles_policy_parse_random),
        cmocka_unit_test(test_profiles_validate),
        cmocka_unit_test(test_profiles_apply_mask),
        cmocka_unit_test(test_profiles_warnings),
        cmocka_unit_test(test_profiles_default),
        cmocka_unit_test(test_profiles_route),
        cmocka_unit_test(test_ops_store),
        cmocka_unit_test(test_ops_pack_done),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
