/*
 * Proves multi-cluster routing's pure parts and its plans: without row affinity clusters are
 * tried nearest zone first, then in topology order, restricted to the profile's cluster_ids;
 * healthy clusters go first with the preference order kept; with row affinity every row key has
 * one stable first-choice cluster, rows spread over the clusters, and when a cluster fails only
 * its rows move (checked over many random keys, seed from STRATA_SEED); plans built from stored
 * profiles follow reported request failures and advance cluster by cluster, single-cluster plans
 * never advance; per-attempt deadlines leave time for the next cluster; and the SetCell
 * timestamp rewrite replaces exactly the timestamps -1 of MutateRow and MutateRows requests,
 * leaving every other byte's meaning intact, while write timestamps never go backwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "failover.h"

#define S(lit) ST_SLICE_LIT(lit)

typedef Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny pb_multi;
typedef Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny__RowAffinity pb_aff;

static uint64_t seed_state;
static uint64_t rnd(void) { /* xorshift64 */
    seed_state ^= seed_state << 13;
    seed_state ^= seed_state >> 7;
    seed_state ^= seed_state << 17;
    return seed_state;
}

static rtr_policy multi_policy(bool affinity) {
    rtr_policy p;
    memset(&p, 0, sizeof p);
    p.kind = RTR_ROUTING_MULTI;
    p.row_affinity = affinity;
    return p;
}

static void test_failover_prefer_order_and_subset(void **state) {
    (void)state;
    rtr_fo_in in[4] = {{"east", false, true},
                       {"west", false, true},
                       {"north", true, true},
                       {"south", false, true}};
    rtr_policy pol = multi_policy(false);
    size_t out[4];
    /* Nearest (the router's zone) first, then topology order. */
    assert_int_equal(rtr_fo_prefer(in, 4, &pol, S(""), out), 4);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 0);
    assert_int_equal(out[2], 1);
    assert_int_equal(out[3], 3);
    /* cluster_ids restricts (their order on the wire does not matter). */
    snprintf(pol.cluster_ids[0], sizeof pol.cluster_ids[0], "south");
    snprintf(pol.cluster_ids[1], sizeof pol.cluster_ids[1], "west");
    pol.n_cluster_ids = 2;
    assert_int_equal(rtr_fo_prefer(in, 4, &pol, S("row"), out), 2);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 3);
    /* Healthy first, order kept in each group. */
    size_t pref[4] = {2, 0, 1, 3}, ord[4];
    in[2].healthy = false;
    in[1].healthy = false;
    rtr_fo_healthy_first(in, pref, 4, ord);
    assert_int_equal(ord[0], 0);
    assert_int_equal(ord[1], 3);
    assert_int_equal(ord[2], 2);
    assert_int_equal(ord[3], 1);
}

static void test_failover_row_affinity_sticks_and_spreads(void **state) {
    (void)state;
    seed_state = st_test_seed("failover_row_affinity") | 1;
    rtr_fo_in in[3] = {{"east", false, true}, {"west", false, true}, {"north", true, true}};
    rtr_policy pol = multi_policy(true);
    size_t first_count[3] = {0}, moved_wrongly = 0;
    for (int i = 0; i < 3000; i++) {
        char key[32];
        snprintf(key, sizeof key, "user%016llx", (unsigned long long)rnd());
        st_slice row = st_slice_cstr(key);
        size_t a[3], b[3], h[3];
        assert_int_equal(rtr_fo_prefer(in, 3, &pol, row, a), 3);
        assert_int_equal(rtr_fo_prefer(in, 3, &pol, row, b), 3);
        assert_memory_equal(a, b, sizeof a); /* stable */
        first_count[a[0]]++;
        /* West fails: rows that preferred another cluster keep it; west's rows move to their
         * second choice. */
        in[1].healthy = false;
        rtr_fo_healthy_first(in, a, 3, h);
        in[1].healthy = true;
        size_t want = a[0] == 1 ? a[1] : a[0];
        moved_wrongly += h[0] != want;
    }
    assert_int_equal(moved_wrongly, 0);
    for (size_t c = 0; c < 3; c++) /* ~1000 each; a broken hash would starve a cluster */
        assert_true(first_count[c] > 700);
    /* Without a row key (multi-row requests) the zone order applies. */
    size_t o[3];
    assert_int_equal(rtr_fo_prefer(in, 3, &pol, S(""), o), 3);
    assert_int_equal(o[0], 2);
}

/* A router context without connections, as instance_test builds it, plus health state. */
static rtr_ctx *ctx_new(void) {
    rtr_ctx *r = calloc(1, sizeof *r);
    assert_non_null(r);
    snprintf(r->topo.project, sizeof r->topo.project, "p");
    snprintf(r->topo.instance, sizeof r->topo.instance, "i");
    static const char *const ids[] = {"east", "west", "north"};
    r->topo.n_clusters = r->n_clusters = 3;
    r->fo = calloc(1, sizeof *r->fo);
    assert_non_null(r->fo);
    r->fo->ctx = r;
    for (size_t c = 0; c < 3; c++) {
        st_topo_cluster *t = &r->topo.clusters[c];
        snprintf(t->id, sizeof t->id, "%s", ids[c]);
        snprintf(t->zone, sizeof t->zone, "zone-%zu", c);
        t->n_nodes = 2;
        rtr_cluster *cl = &r->clusters[c];
        cl->ctx = r;
        cl->topo = t;
        cl->idx = c;
        cl->n_nodes = 2;
        for (size_t i = 0; i < 2; i++) {
            cl->nodes[i].ctx = r;
            cl->nodes[i].cluster = cl;
            cl->nodes[i].idx = (uint32_t)i;
            snprintf(cl->nodes[i].addr, sizeof cl->nodes[i].addr, "127.0.0.1:%zu",
                     7000 + 10 * c + i);
        }
        r->fo->clusters[c].up = true;
    }
    return r;
}

static void ctx_free(rtr_ctx *r) {
    rtr_meta_free(&r->meta);
    free(r->fo);
    free(r);
}

static void store_multi(rtr_ctx *r, const char *id, char **ids, size_t n, bool affinity) {
    Google__Bigtable__Admin__V2__AppProfile p;
    pb_multi m;
    pb_aff aff;
    google__bigtable__admin__v2__app_profile__init(&p);
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__init(&m);
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__row_affinity__init(
        &aff);
    m.cluster_ids = ids;
    m.n_cluster_ids = n;
    if (affinity) {
        m.affinity_case =
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__MULTI_CLUSTER_ROUTING_USE_ANY__AFFINITY_ROW_AFFINITY;
        m.row_affinity = &aff;
    }
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_MULTI_CLUSTER_ROUTING_USE_ANY;
    p.multi_cluster_routing_use_any = &m;
    uint8_t buf[256];
    size_t len = google__bigtable__admin__v2__app_profile__pack(&p, buf);
    assert_int_equal(rtr_meta_put(&r->meta, RTR_META_KIND_PROFILE, id, st_slice_make(buf, len)),
                     ST_OK);
}

static void test_failover_plan_follows_health(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    st_err err = {0};
    rtr_plan p;
    store_multi(r, "any", NULL, 0, false);
    assert_int_equal(rtr_route_plan(r, "any", RTR_ACCESS_READ, S(""), &p, &err), ST_OK);
    assert_true(p.multi);
    assert_int_equal(p.n, 3);
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[0]);
    assert_int_equal(rtr_route_plan(r, "any", RTR_ACCESS_TXN, S(""), &p, &err),
                     ST_FAILED_PRECONDITION);
    assert_string_equal(err.msg, RTR_TXN_DENIED_MSG);

    /* A request failing on one node of east takes east out: east goes last. */
    rtr_health_report(&r->clusters[0].nodes[1], ST_UNAVAILABLE);
    assert_false(rtr_health_cluster_up(r, 0));
    assert_false(rtr_cluster_healthy(&r->clusters[0]));
    assert_int_equal(rtr_route_plan(r, "any", RTR_ACCESS_READ, S(""), &p, &err), ST_OK);
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[1]);
    assert_true(rtr_plan_next(r, &p, ST_UNAVAILABLE));
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[2]);
    assert_true(rtr_plan_next(r, &p, ST_DEADLINE_EXCEEDED));
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[0]);
    assert_false(rtr_plan_next(r, &p, ST_UNAVAILABLE)); /* none left */
    assert_int_equal(r->fo->failovers, 2);
    /* Other codes are the request's business, not the cluster's. */
    rtr_health_report(&r->clusters[1].nodes[0], ST_NOT_FOUND);
    assert_true(rtr_health_cluster_up(r, 1));

    /* A subset; the preferred one down, the plan restarted after it is back. */
    char *ids[] = {"north", "west"};
    store_multi(r, "sub", ids, 2, false);
    assert_int_equal(rtr_route_plan(r, "sub", RTR_ACCESS_READ, S(""), &p, &err), ST_OK);
    assert_int_equal(p.n, 2);
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[1]);
    rtr_health_report(&r->clusters[1].nodes[0], ST_DEADLINE_EXCEEDED);
    rtr_plan_restart(r, &p);
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[2]);

    /* Single-cluster profiles (the built-in default: east) never move, even to healthy ones. */
    assert_int_equal(rtr_route_plan(r, "", RTR_ACCESS_TXN, S("row"), &p, &err), ST_OK);
    assert_false(p.multi);
    assert_ptr_equal(rtr_plan_cluster(r, &p), &r->clusters[0]);
    assert_false(rtr_plan_next(r, &p, ST_UNAVAILABLE));
    assert_int_equal(rtr_plan_attempt_ms(&p, 60000), 60000);
    assert_int_equal(rtr_route_plan(r, "nosuch", RTR_ACCESS_READ, S(""), &p, &err), ST_NOT_FOUND);
    ctx_free(r);
}

static void test_failover_row_affinity_plan(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    st_err err = {0};
    rtr_plan p, q;
    store_multi(r, "aff", NULL, 0, true);
    /* Find a row whose first choice is west, then take west out: it moves, and comes back. */
    char key[32];
    for (int i = 0;; i++) {
        assert_true(i < 1000);
        snprintf(key, sizeof key, "row%d", i);
        assert_int_equal(rtr_route_plan(r, "aff", RTR_ACCESS_READ, st_slice_cstr(key), &p, &err),
                         ST_OK);
        if (rtr_plan_cluster(r, &p) == &r->clusters[1])
            break;
    }
    rtr_health_report(&r->clusters[1].nodes[0], ST_UNAVAILABLE);
    assert_int_equal(rtr_route_plan(r, "aff", RTR_ACCESS_READ, st_slice_cstr(key), &q, &err),
                     ST_OK);
    assert_ptr_equal(rtr_plan_cluster(r, &q), &r->clusters[p.order[1]]);
    r->fo->nodes[1][0].down = false;
    r->fo->clusters[1].up = true;
    assert_int_equal(rtr_route_plan(r, "aff", RTR_ACCESS_READ, st_slice_cstr(key), &q, &err),
                     ST_OK);
    assert_ptr_equal(rtr_plan_cluster(r, &q), &r->clusters[1]);
    ctx_free(r);
}

static void test_failover_attempt_deadline(void **state) {
    (void)state;
    rtr_plan p = {.multi = true, .n = 2, .cur = 0};
    assert_int_equal(rtr_plan_attempt_ms(&p, 60000), RTR_FO_ATTEMPT_MS); /* capped */
    assert_int_equal(rtr_plan_attempt_ms(&p, 4000), 2000); /* half: the next one gets time */
    assert_int_equal(rtr_plan_attempt_ms(&p, 1), 1);
    p.cur = 1; /* the last cluster gets all that is left */
    assert_int_equal(rtr_plan_attempt_ms(&p, 4000), 4000);
    assert_true(rtr_fo_error(ST_UNAVAILABLE));
    assert_true(rtr_fo_error(ST_DEADLINE_EXCEEDED));
    assert_false(rtr_fo_error(ST_FAILED_PRECONDITION));
    assert_false(rtr_fo_error(ST_NOT_FOUND));
}

/* A damaged replica (DATA_LOSS) moves a multi-cluster part on while another cluster remains,
 * but is no health verdict, and a single-cluster plan keeps the error. */
static void test_failover_damaged_replica_moves_on(void **state) {
    (void)state;
    rtr_plan p = {.multi = true, .n = 2, .cur = 0};
    assert_true(rtr_plan_moves_off_replica(&p, ST_DATA_LOSS));
    assert_false(rtr_plan_moves_off_replica(&p, ST_INTERNAL));
    assert_false(rtr_plan_moves_off_replica(&p, ST_FAILED_PRECONDITION));
    assert_false(rtr_fo_error(ST_DATA_LOSS)); /* the node stays up */
    p.cur = 1;                                /* the last cluster's error goes to the client */
    assert_false(rtr_plan_moves_off_replica(&p, ST_DATA_LOSS));
    rtr_plan single = {.multi = false, .n = 1, .cur = 0};
    assert_false(rtr_plan_moves_off_replica(&single, ST_DATA_LOSS));
}

/* ---- the SetCell timestamp rewrite ---- */

typedef Google__Bigtable__V2__Mutation pb_mut;

static void set_cell(pb_mut *m, Google__Bigtable__V2__Mutation__SetCell *s, int64_t ts) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(s);
    s->family_name = "cf";
    s->column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    s->timestamp_micros = ts;
    s->value = (ProtobufCBinaryData){3, (uint8_t *)"val"};
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = s;
}

static void test_failover_stamp_mutate_row(void **state) {
    (void)state;
    pb_mut m[3];
    Google__Bigtable__V2__Mutation__SetCell s[2];
    Google__Bigtable__V2__Mutation__DeleteFromRow dr;
    set_cell(&m[0], &s[0], -1);
    set_cell(&m[1], &s[1], 5000);
    google__bigtable__v2__mutation__init(&m[2]);
    google__bigtable__v2__mutation__delete_from_row__init(&dr);
    m[2].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
    m[2].delete_from_row = &dr;
    pb_mut *mp[3] = {&m[0], &m[1], &m[2]};
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    req.app_profile_id = "any";
    req.row_key = (ProtobufCBinaryData){3, (uint8_t *)"row"};
    req.mutations = mp;
    req.n_mutations = 3;
    uint8_t buf[512];
    size_t len = google__bigtable__v2__mutate_row_request__pack(&req, buf);

    st_buf out;
    st_buf_init(&out);
    size_t n = 0;
    assert_int_equal(rtr_stamp_mutations(st_slice_make(buf, len), false, 1234000, &out, &n), ST_OK);
    assert_int_equal(n, 1);
    Google__Bigtable__V2__MutateRowRequest *got =
        google__bigtable__v2__mutate_row_request__unpack(NULL, out.len, out.data);
    assert_non_null(got);
    assert_string_equal(got->table_name, req.table_name);
    assert_string_equal(got->app_profile_id, "any");
    assert_int_equal(got->n_mutations, 3);
    assert_int_equal(got->mutations[0]->set_cell->timestamp_micros, 1234000);
    assert_memory_equal(got->mutations[0]->set_cell->value.data, "val", 3);
    assert_string_equal(got->mutations[0]->set_cell->family_name, "cf");
    assert_int_equal(got->mutations[1]->set_cell->timestamp_micros, 5000); /* explicit: kept */
    assert_int_equal(got->mutations[2]->mutation_case,
                     GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW);
    google__bigtable__v2__mutate_row_request__free_unpacked(got, NULL);

    /* Nothing to stamp: the bytes are unchanged. */
    s[0].timestamp_micros = 0; /* 0 is an explicit timestamp, not server time */
    len = google__bigtable__v2__mutate_row_request__pack(&req, buf);
    st_buf_reset(&out);
    assert_int_equal(rtr_stamp_mutations(st_slice_make(buf, len), false, 1234000, &out, &n), ST_OK);
    assert_int_equal(n, 0);
    assert_int_equal(out.len, len);
    assert_memory_equal(out.data, buf, len);
    /* Malformed input is refused. */
    st_buf_reset(&out);
    assert_int_equal(rtr_stamp_mutations(S("\x1a\x05\x0a"), false, 1, &out, &n),
                     ST_INVALID_ARGUMENT);
    st_buf_free(&out);
}

static void test_failover_stamp_mutate_rows(void **state) {
    (void)state;
    pb_mut m[3];
    Google__Bigtable__V2__Mutation__SetCell s[3];
    set_cell(&m[0], &s[0], -1);
    set_cell(&m[1], &s[1], 7000);
    set_cell(&m[2], &s[2], -1);
    pb_mut *e0m[2] = {&m[0], &m[1]}, *e1m[1] = {&m[2]};
    Google__Bigtable__V2__MutateRowsRequest__Entry e[2];
    for (int i = 0; i < 2; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&e[i]);
        e[i].row_key = (ProtobufCBinaryData){2, (uint8_t *)(i ? "r1" : "r0")};
    }
    e[0].mutations = e0m;
    e[0].n_mutations = 2;
    e[1].mutations = e1m;
    e[1].n_mutations = 1;
    Google__Bigtable__V2__MutateRowsRequest__Entry *ep[2] = {&e[0], &e[1]};
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    req.entries = ep;
    req.n_entries = 2;
    uint8_t buf[512];
    size_t len = google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    st_buf out;
    st_buf_init(&out);
    size_t n = 0;
    assert_int_equal(rtr_stamp_mutations(st_slice_make(buf, len), true, 99000, &out, &n), ST_OK);
    assert_int_equal(n, 2);
    Google__Bigtable__V2__MutateRowsRequest *got =
        google__bigtable__v2__mutate_rows_request__unpack(NULL, out.len, out.data);
    assert_non_null(got);
    assert_int_equal(got->n_entries, 2);
    assert_memory_equal(got->entries[1]->row_key.data, "r1", 2);
    assert_int_equal(got->entries[0]->mutations[0]->set_cell->timestamp_micros, 99000);
    assert_int_equal(got->entries[0]->mutations[1]->set_cell->timestamp_micros, 7000);
    assert_int_equal(got->entries[1]->mutations[0]->set_cell->timestamp_micros, 99000);
    google__bigtable__v2__mutate_rows_request__free_unpacked(got, NULL);
    /* Split into per-node sub-requests afterwards, entries keep their stamped bytes. */
    st_arena a;
    st_arena_init(&a, 1024);
    st_buf head;
    st_buf_init(&head);
    rtr_entry *ents;
    size_t ne;
    assert_int_equal(rtr_mutate_rows_split(st_buf_slice(&out), &a, &head, &ents, &ne), ST_OK);
    assert_int_equal(ne, 2);
    st_buf_free(&head);
    st_arena_deinit(&a);
    st_buf_free(&out);
}

static void test_failover_write_ts_never_decreases(void **state) {
    (void)state;
    rtr_ctx *r = ctx_new();
    int64_t a = rtr_fo_write_ts(r);
    assert_int_equal(a % 1000, 0); /* millisecond granularity */
    int64_t b = rtr_fo_write_ts(r);
    assert_true(b >= a);
    r->fo->ts_last_us = a + 3600LL * 1000000; /* the wall clock "stepped back" an hour */
    assert_int_equal(rtr_fo_write_ts(r), a + 3600LL * 1000000);
    ctx_free(r);
}

/* Write fences (docs/router.md, Write fences): a fence is at most RTR_FO_ATTEMPT_MS ahead, even
 * for an attempt allowed the client's whole deadline; only attempts whose outcome is open hold
 * back the resend, a node's own refusal does not. */
static void test_failover_write_fences(void **state) {
    (void)state;
    rpc_metadata md[2];
    size_t n_md = 0;
    char text[RTR_FENCE_TEXT_BYTES];
    int64_t before = st_wall_us(), fence;
    rtr_fence_attempt(60000, &fence, text, md, &n_md);
    assert_int_equal(n_md, 1);
    assert_string_equal(md[0].name, BTU_WRITE_BY_HEADER);
    assert_int_equal(strtoll(md[0].value, NULL, 10), fence);
    assert_true(fence >= before + (int64_t)RTR_FO_ATTEMPT_MS * 1000);
    assert_true(fence <= st_wall_us() + (int64_t)RTR_FO_ATTEMPT_MS * 1000);
    /* An attempt without a deadline (0) gets the same fence, not one that has passed already. */
    n_md = 0;
    before = st_wall_us();
    rtr_fence_attempt(0, &fence, text, md, &n_md);
    assert_true(fence >= before + (int64_t)RTR_FO_ATTEMPT_MS * 1000);
    rtr_fence f = {0};
    static const st_code refusals[] = {ST_FAILED_PRECONDITION, ST_NOT_FOUND, ST_INVALID_ARGUMENT,
                                       ST_RESOURCE_EXHAUSTED,  ST_DATA_LOSS, ST_OK};
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++)
        rtr_fence_ended(&f, fence, refusals[i], true);
    assert_int_equal(rtr_fence_wait_ms(&f), 0);
    rtr_fence_ended(&f, fence, ST_UNAVAILABLE, false); /* never reached its node */
    assert_int_equal(rtr_fence_wait_ms(&f), 0);
    static const st_code open[] = {ST_UNAVAILABLE, ST_DEADLINE_EXCEEDED, ST_CANCELLED};
    for (size_t i = 0; i < sizeof open / sizeof open[0]; i++) {
        f = (rtr_fence){0};
        rtr_fence_ended(&f, fence, open[i], true);
        int64_t wait = rtr_fence_wait_ms(&f);
        assert_true(wait > 0 && wait <= RTR_FO_ATTEMPT_MS + 1);
    }
}

/* Rows no node of a cluster serves (a node back with an empty disk): a multi-cluster part moves
 * on at once while another cluster remains; otherwise it waits until a map refreshed after the
 * first sighting still lacks them and the grace has passed, then ends FAILED_PRECONDITION naming
 * the cluster and the remedy. Times are given, not read from a clock. */
static void test_failover_unserved_rows(void **state) {
    (void)state;
    st_topo_cluster topo = {.id = "east"};
    rtr_cluster c = {.topo = &topo, .idx = 0, .map_gen = 7};
    rtr_plan multi = {.multi = true, .n = 2, .cur = 0}, single = {.n = 1};
    rtr_unserved u = {0};
    st_err err = {0};
    assert_int_equal(rtr_unserved_check(&multi, &c, "t", "this row", 1000, &u, &err),
                     RTR_UNSERVED_MOVE);
    assert_int_equal(err.code, ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "no node of cluster east serves this row of table t"));
    assert_non_null(strstr(err.msg, "strata failover PROFILE CLUSTER"));
    multi.cur = 1; /* the plan's last cluster: as a single-cluster plan */
    assert_int_equal(rtr_unserved_check(&multi, &c, "t", "x", 1000, &u, &err), RTR_UNSERVED_WAIT);
    int64_t t0 = 1000000, grace_us = (int64_t)RTR_UNSERVED_GRACE_MS * 1000;
    u = (rtr_unserved){0};
    assert_int_equal(rtr_unserved_check(&single, &c, "t", "x", t0, &u, &err), RTR_UNSERVED_WAIT);
    /* Past the grace but on the same map: a refresh must confirm it (a move leaves one). */
    assert_int_equal(rtr_unserved_check(&single, &c, "t", "x", t0 + 2 * grace_us, &u, &err),
                     RTR_UNSERVED_WAIT);
    c.map_gen++;
    assert_int_equal(rtr_unserved_check(&single, &c, "t", "x", t0 + grace_us - 1, &u, &err),
                     RTR_UNSERVED_WAIT);
    assert_int_equal(rtr_unserved_check(&single, &c, "t", "x", t0 + grace_us, &u, &err),
                     RTR_UNSERVED_END);
    /* Another cluster starts its own clock. */
    rtr_cluster west = {.topo = &topo, .idx = 1, .map_gen = 9};
    assert_int_equal(rtr_unserved_check(&single, &west, "t", "x", t0 + 3 * grace_us, &u, &err),
                     RTR_UNSERVED_WAIT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover_prefer_order_and_subset),
        cmocka_unit_test(test_failover_row_affinity_sticks_and_spreads),
        cmocka_unit_test(test_failover_plan_follows_health),
        cmocka_unit_test(test_failover_row_affinity_plan),
        cmocka_unit_test(test_failover_attempt_deadline),
        cmocka_unit_test(test_failover_damaged_replica_moves_on),
        cmocka_unit_test(test_failover_stamp_mutate_row),
        cmocka_unit_test(test_failover_stamp_mutate_rows),
        cmocka_unit_test(test_failover_write_ts_never_decreases),
        cmocka_unit_test(test_failover_write_fences),
        cmocka_unit_test(test_failover_unserved_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
