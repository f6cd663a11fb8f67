/* admin.c — the table admin API of a node: tables, column families with GC rules, DropRowRange
 * and consistency tokens. Admin calls are rare and run to completion on the loop thread. */
#include "admin.h"
#include "changes.h"
#include "repl_glue.h"
#include "strata/btutil.h"

#include "google/longrunning/operations.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

typedef Google__Bigtable__Admin__V2__GcRule pb_gc;
typedef Google__Bigtable__Admin__V2__Table pb_table;

#define ADMIN_SPLITS_MAX 1000 /* initial_splits accepted by CreateTable */

/* An import's schema is checked against these limits before it reaches a node (btutil.h). */
_Static_assert(NODE_GC_DEPTH_MAX == BTU_GC_DEPTH_MAX && NODE_GC_NODES_MAX == BTU_GC_RULES_MAX &&
                   NODE_FAMILIES_MAX == BTU_FAMILIES_MAX,
               "the node's schema limits and btu_schema_check's must agree");

/* ---- GC rules: protobuf <-> catalog ---- */

st_code node_gc_from_pb(const pb_gc *r, node_gc *out, int depth, st_err *err) {
    memset(out, 0, sizeof *out);
    if (!r)
        return ST_OK;
    if (depth > NODE_GC_DEPTH_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "GC rule nested deeper than %d levels",
                          NODE_GC_DEPTH_MAX);
    pb_gc *const *kids;
    size_t n_kids;
    st_code rc = btu_gc_rule_level(r, &kids, &n_kids, err);
    if (rc != ST_OK)
        return rc;
    switch (r->rule_case) {
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS:
        out->kind = STO_GC_MAX_VERSIONS;
        out->max_versions = r->max_num_versions;
        return ST_OK;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_AGE:
        out->kind = STO_GC_MAX_AGE;
        out->max_age_us = r->max_age->seconds * 1000000 + r->max_age->nanos / 1000;
        return ST_OK;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_INTERSECTION:
        out->kind = STO_GC_INTERSECTION;
        break;
    case GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_UNION:
        out->kind = STO_GC_UNION;
        break;
    default:
        return ST_OK; /* unset: no rule */
    }
    if (n_kids > NODE_GC_NODES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "GC rule has more than %d parts",
                          NODE_GC_NODES_MAX);
    out->children = calloc(n_kids ? n_kids : 1, sizeof *out->children);
    if (!out->children)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading a GC rule");
    out->n_children = n_kids;
    for (size_t i = 0; i < n_kids; i++) {
        rc = node_gc_from_pb(kids[i], &out->children[i], depth + 1, err);
        if (rc != ST_OK) {
            node_gc_free(out);
            return rc;
        }
    }
    return ST_OK;
}

static pb_gc *gc_to_pb(const node_gc *g, st_arena *a) {
    pb_gc *r = st_arena_alloc(a, sizeof *r);
    if (!r)
        return NULL;
    google__bigtable__admin__v2__gc_rule__init(r);
    if (g->kind == STO_GC_MAX_VERSIONS) {
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
        r->max_num_versions = (int32_t)g->max_versions;
    } else if (g->kind == STO_GC_MAX_AGE) {
        Google__Protobuf__Duration *d = st_arena_alloc(a, sizeof *d);
        if (!d)
            return NULL;
        google__protobuf__duration__init(d);
        d->seconds = g->max_age_us / 1000000;
        d->nanos = (int32_t)(g->max_age_us % 1000000) * 1000;
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_AGE;
        r->max_age = d;
    } else if (g->kind == STO_GC_UNION || g->kind == STO_GC_INTERSECTION) {
        pb_gc **kids = st_arena_alloc(a, (g->n_children + 1) * sizeof *kids);
        if (!kids)
            return NULL;
        for (size_t i = 0; i < g->n_children; i++)
            if (!(kids[i] = gc_to_pb(&g->children[i], a)))
                return NULL;
        if (g->kind == STO_GC_UNION) {
            Google__Bigtable__Admin__V2__GcRule__Union *u = st_arena_alloc(a, sizeof *u);
            if (!u)
                return NULL;
            google__bigtable__admin__v2__gc_rule__union__init(u);
            u->n_rules = g->n_children;
            u->rules = kids;
            r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_UNION;
            r->union_ = u;
        } else {
            Google__Bigtable__Admin__V2__GcRule__Intersection *x = st_arena_alloc(a, sizeof *x);
            if (!x)
                return NULL;
            google__bigtable__admin__v2__gc_rule__intersection__init(x);
            x->n_rules = g->n_children;
            x->rules = kids;
            r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_INTERSECTION;
            r->intersection = x;
        }
    }
    return r;
}

pb_table *node_table_to_pb(const node_table *t, bool names_only, st_arena *a) {
    pb_table *pt = st_arena_alloc(a, sizeof *pt);
    if (!pt)
        return NULL;
    google__bigtable__admin__v2__table__init(pt);
    pt->name = (char *)t->name;
    if (names_only)
        return pt;
    pt->granularity = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__TIMESTAMP_GRANULARITY__MILLIS;
    pt->deletion_protection = t->deletion_protection;
    if (t->cs_retention_us > 0 && !(pt->change_stream_config = node_cs_config_to_pb(t, a)))
        return NULL;
    pt->column_families = st_arena_alloc(a, (t->n_families + 1) * sizeof *pt->column_families);
    if (!pt->column_families)
        return NULL;
    for (size_t i = 0; i < t->n_families; i++) {
        Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *e = st_arena_alloc(a, sizeof *e);
        Google__Bigtable__Admin__V2__ColumnFamily *cf = st_arena_alloc(a, sizeof *cf);
        if (!e || !cf)
            return NULL;
        google__bigtable__admin__v2__table__column_families_entry__init(e);
        google__bigtable__admin__v2__column_family__init(cf);
        e->key = (char *)t->families[i].name;
        /* Always a rule, empty for "keep everything": cbt prints that as no policy, as it does for
         * the emulator (a missing rule prints "<never>"). */
        if (!(cf->gc_rule = gc_to_pb(&t->families[i].gc, a)))
            return NULL;
        e->value = cf;
        pt->column_families[pt->n_column_families++] = e;
    }
    return pt;
}

/* ---- names ---- */

/* "projects/P/instances/I" followed by "/tables/T" makes a table name. */
static st_code check_parent(const char *parent, st_err *err) {
    char probe[NODE_TABLE_NAME_MAX + 16];
    snprintf(probe, sizeof probe, "%s/tables/x", parent);
    if (node_check_table_name(probe, NULL) != ST_OK)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid parent '%s': expected projects/<project>/instances/<instance>",
                          parent);
    return ST_OK;
}

/* ---- CreateTable ---- */

st_code node_table_families_from_pb(node_table *t, const pb_table *spec, st_err *err) {
    for (size_t i = 0; spec && i < spec->n_column_families; i++) {
        const char *fam = spec->column_families[i]->key;
        if (!btu_family_valid(fam))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid column family name '%s': use 1-64 of [-_.a-zA-Z0-9]", fam);
        node_gc gc;
        const Google__Bigtable__Admin__V2__ColumnFamily *cf = spec->column_families[i]->value;
        st_code rc = node_gc_from_pb(cf ? cf->gc_rule : NULL, &gc, 0, err);
        if (rc == ST_OK)
            rc = node_table_family_set(t, fam, &gc, err);
        node_gc_free(&gc);
        if (rc != ST_OK)
            return rc;
    }
    return ST_OK;
}

/* Creates the table's tablets: one per split interval. A cluster member creates none: its
 * tablets come from the internal service (CreateTablet). */
static st_code create_tablets(node_ctx *n, const char *name, const ProtobufCBinaryData *splits,
                              size_t n_splits, st_err *err) {
    node_tablets *t = node_tables_add(n, name);
    if (!t)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating table");
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && !node_in_cluster(n) && i <= n_splits; i++) {
        st_slice start =
            i ? st_slice_make(splits[i - 1].data, splits[i - 1].len) : st_slice_make("", 0);
        st_slice end =
            i < n_splits ? st_slice_make(splits[i].data, splits[i].len) : st_slice_make("", 0);
        t = node_tablets_find(n, name);
        rc = node_tablet_create(n, t, start, end, err);
    }
    return rc;
}

static void drop_table_tablets(node_ctx *n, const char *name) {
    node_tablets *t = node_tablets_find(n, name);
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        sto_tablet_drop(n->db, t->v[i].id, NULL);
    node_tables_remove(n, t);
}

void node_h_create_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__CreateTableRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__create_table_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err = {0};
    char name[NODE_TABLE_NAME_MAX + 64];
    if (check_parent(req->parent, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (!btu_table_id_valid(req->table_id)) {
        node_fail(call, ST_INVALID_ARGUMENT,
                  "invalid table id '%s': use 1-%d of [-_.a-zA-Z0-9], not starting with - or .",
                  req->table_id, BTU_TABLE_ID_MAX);
        return;
    }
    snprintf(name, sizeof name, "%s/tables/%s", req->parent, req->table_id);
    if (node_check_table_name(name, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (node_catalog_find(n->catalog, name)) {
        node_fail(call, ST_ALREADY_EXISTS, "table \"%s\" already exists", name);
        return;
    }
    ProtobufCBinaryData *splits = NULL;
    size_t n_splits = 0;
    node_table *t = NULL;
    st_code rc =
        btu_splits_from_pb(req, ADMIN_SPLITS_MAX, rpc_call_arena(call), &splits, &n_splits, &err);
    if (rc == ST_OK)
        rc = node_catalog_add(n->catalog, name, st_wall_us(), &t, &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    t->deletion_protection = req->table && req->table->deletion_protection;
    int64_t retention = 0;
    rc = node_cs_retention_from_pb(req->table ? req->table->change_stream_config : NULL, &retention,
                                   &err);
    node_cs_set_retention(n, t, retention);
    if (rc == ST_OK)
        rc = node_table_families_from_pb(t, req->table, &err);
    if (rc == ST_OK)
        rc = node_catalog_save(n->catalog, &err);
    if (rc == ST_OK)
        rc = create_tablets(n, name, splits, n_splits, &err);
    if (rc == ST_OK)
        rc = node_table_push_gc(n, node_catalog_find(n->catalog, name), &err);
    if (rc != ST_OK) {
        drop_table_tablets(n, name);
        node_catalog_remove(n->catalog, name, NULL);
        node_catalog_save(n->catalog, NULL);
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "admin", "created table=%s tablets=%zu", name,
           node_tablets_find(n, name)->n);
    pb_table *pt =
        node_table_to_pb(node_catalog_find(n->catalog, name), false, rpc_call_arena(call));
    if (!pt) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &pt->base);
}

/* ---- GetTable, ListTables, DeleteTable ---- */

void node_h_get_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__GetTableRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__get_table_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->name, &meta))
        return;
    bool names_only = req->view == GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY;
    pb_table *pt = node_table_to_pb(meta, names_only, rpc_call_arena(call));
    if (!pt) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &pt->base);
}

void node_h_list_tables(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__ListTablesRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__list_tables_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err;
    if (check_parent(req->parent, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_arena *a = rpc_call_arena(call);
    Google__Bigtable__Admin__V2__ListTablesResponse resp;
    google__bigtable__admin__v2__list_tables_response__init(&resp);
    size_t count = node_catalog_count(n->catalog);
    resp.tables = st_arena_alloc(a, (count + 1) * sizeof *resp.tables);
    if (!resp.tables) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t plen = strlen(req->parent);
    bool full = req->view != GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__VIEW_UNSPECIFIED &&
                req->view != GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY;
    for (size_t i = 0; i < count; i++) {
        node_table *t = node_catalog_at(n->catalog, i);
        if (strncmp(t->name, req->parent, plen) != 0 || strncmp(t->name + plen, "/tables/", 8))
            continue;
        pb_table *pt = node_table_to_pb(t, !full, a);
        if (!pt) {
            node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        resp.tables[resp.n_tables++] = pt;
    }
    node_reply(call, &resp.base);
}

/* ---- dropping a table ----
 * Dropping a tablet in storage waits for a flush of it that is running (a memtable's worth of
 * SSTable written), so the table's tablets are unmapped on the loop (no call reaches them from
 * then on) and dropped from storage on a job; the call is answered once they are gone. */

typedef struct table_drop {
    char *name;
    uint64_t *ids;
    size_t n_ids;
} table_drop;

static void table_drop_free(table_drop *d) {
    free(d->name);
    free(d->ids);
    free(d);
}

static void table_drop_work(node_job *j) {
    table_drop *d = j->arg;
    for (size_t i = 0; i < d->n_ids; i++)
        sto_tablet_drop(j->n->db, d->ids[i], NULL);
}

static void table_drop_reply(rpc_call *call) {
    Google__Protobuf__Empty empty;
    google__protobuf__empty__init(&empty);
    node_reply(call, &empty.base);
}

/* A DropTable answer held until no Apply call with rows of the table is under way to a peer:
 * the router gives the peers a table created again under the name only after every node
 * answered its DropTable, so such a call cannot reach the new table there
 * (docs/formats/replication.md, Tablets that vanish). */
typedef struct drop_hold {
    node_ctx *n;
    rpc_call *call;
    char *name;
    struct event *ev;
    int64_t until_us; /* monotonic: answered then in any case */
} drop_hold;

#define NODE_DROP_HOLD_POLL_MS 5
#define NODE_DROP_HOLD_MS_MAX 10000 /* beyond an Apply call's usual life; never forever */

static void drop_hold_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    drop_hold *h = arg;
    bool shipping = node_repl_table_shipping(h->n, h->name);
    if (shipping && st_mono_us() < h->until_us) {
        struct timeval tv = {0, NODE_DROP_HOLD_POLL_MS * 1000};
        evtimer_add(h->ev, &tv);
        return;
    }
    if (shipping)
        st_log(ST_LOG_WARN, "admin",
               "table=%s dropped; an Apply call with its rows was still under way to a peer after "
               "%d ms",
               h->name, NODE_DROP_HOLD_MS_MAX);
    table_drop_reply(h->call);
    event_free(h->ev);
    free(h->name);
    free(h);
}

/* On the loop, after the storage drops: as before them, nothing of the table is left to ship. */
static void table_drop_finish(node_ctx *n, rpc_call *call, const char *name) {
    node_repl_table_dropped(n, name);
    node_cs_tables_changed(n);
    st_log(ST_LOG_INFO, "admin", "deleted table=%s", name);
    if (!node_repl_table_shipping(n, name)) {
        table_drop_reply(call);
        return;
    }
    drop_hold *h = calloc(1, sizeof *h);
    if (h && (h->name = strdup(name)) && (h->ev = evtimer_new(n->base, drop_hold_tick, h))) {
        h->n = n;
        h->call = call;
        h->until_us = st_mono_us() + (int64_t)NODE_DROP_HOLD_MS_MAX * 1000;
        drop_hold_tick(-1, 0, h);
        return;
    }
    if (h)
        free(h->name);
    free(h);
    table_drop_reply(call); /* out of memory: answered as before */
}

static void table_drop_done(node_job *j) {
    table_drop *d = j->arg;
    table_drop_finish(j->n, j->call, d->name);
    table_drop_free(d);
    free(j);
}

/* The table's tablet ids of this moment. */
static table_drop *table_drop_new(node_ctx *n, const char *name) {
    node_tablets *t = node_tablets_find(n, name);
    size_t count = t ? t->n : 0;
    table_drop *d = calloc(1, sizeof *d);
    if (d) {
        d->name = strdup(name);
        d->ids = calloc(count ? count : 1, sizeof *d->ids);
    }
    if (!d || !d->name || !d->ids) {
        if (d)
            table_drop_free(d);
        return NULL;
    }
    for (size_t i = 0; i < count; i++)
        d->ids[i] = t->v[i].id;
    d->n_ids = count;
    return d;
}

st_code node_table_drop_start(node_ctx *n, rpc_call *call, const char *name, st_err *err) {
    table_drop *d = table_drop_new(n, name);
    if (!d)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory deleting table %s", name);
    /* Catalog first: a crash after it leaves orphan tablets, which the next start drops. */
    st_code rc = node_catalog_remove(n->catalog, name, err);
    if (rc == ST_OK)
        rc = node_catalog_save(n->catalog, err);
    if (rc != ST_OK) {
        table_drop_free(d);
        return rc;
    }
    node_tablets *t = node_tablets_find(n, name);
    if (t) /* no call reaches its tablets from now on */
        node_tables_remove(n, t);
    node_job *j = calloc(1, sizeof *j);
    if (j) {
        *j = (node_job){
            .n = n, .call = call, .work = table_drop_work, .done = table_drop_done, .arg = d};
        if (node_job_start(j, NULL) == ST_OK)
            return ST_OK;
        free(j);
    }
    table_drop_work(&(node_job){.n = n, .arg = d}); /* no thread: here, as before */
    table_drop_finish(n, call, name);
    table_drop_free(d);
    return ST_OK;
}

void node_h_delete_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__DeleteTableRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__delete_table_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->name, &meta))
        return;
    if (meta->deletion_protection) {
        node_fail(call, ST_FAILED_PRECONDITION,
                  "table %s has deletion protection; turn it off before deleting", req->name);
        return;
    }
    st_err err;
    if (node_table_drop_start(n, call, req->name, &err) != ST_OK)
        node_fail(call, err.code, "%s", err.msg);
}

/* ---- UpdateTable ----
 * Change stream config and deletion protection. A long-running operation in the API; here it
 * is done when it answers (the router applies it to every node first). */

#define UT_MASK_CS "change_stream_config"
#define UT_MASK_CS_RETENTION "change_stream_config.retention_period"
#define UT_MASK_PROTECTION "deletion_protection"
#define TYPE_URL_PREFIX "type.googleapis.com/google.bigtable.admin.v2."

typedef struct update_spec {
    bool set_retention, set_protection;
    int64_t retention_us;
    bool protection;
} update_spec;

static st_code update_spec_from_pb(const Google__Bigtable__Admin__V2__UpdateTableRequest *req,
                                   update_spec *u, st_err *err) {
    memset(u, 0, sizeof *u);
    if (!req->table || !req->update_mask || req->update_mask->n_paths == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "UpdateTable needs a table and an update_mask (change_stream_config, "
                          "change_stream_config.retention_period or deletion_protection)");
    for (size_t i = 0; i < req->update_mask->n_paths; i++) {
        const char *p = req->update_mask->paths[i];
        if (strcmp(p, UT_MASK_CS) == 0 || strcmp(p, UT_MASK_CS_RETENTION) == 0)
            u->set_retention = true;
        else if (strcmp(p, UT_MASK_PROTECTION) == 0)
            u->set_protection = true;
        else
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "update_mask path '%s' is not supported; use change_stream_config, "
                              "change_stream_config.retention_period or deletion_protection",
                              p);
    }
    u->protection = req->table->deletion_protection;
    return u->set_retention
               ? node_cs_retention_from_pb(req->table->change_stream_config, &u->retention_us, err)
               : ST_OK;
}

/* Applies u to the table (catalog saved, GC rules pushed). */
st_code node_table_update(node_ctx *n, node_table *meta, bool set_retention, int64_t retention_us,
                          bool set_protection, bool protection, st_err *err) {
    node_table saved = *meta;
    if (set_retention)
        node_cs_set_retention(n, meta, retention_us);
    if (set_protection)
        meta->deletion_protection = protection;
    st_code rc = node_catalog_save(n->catalog, err);
    if (rc != ST_OK) {
        meta->cs_retention_us = saved.cs_retention_us;
        meta->cs_since_us = saved.cs_since_us;
        meta->deletion_protection = saved.deletion_protection;
        return rc;
    }
    return node_table_push_gc(n, meta, err);
}

/* The done Operation answering UpdateTable: UpdateTableMetadata and the Table. */
static st_code update_operation(node_ctx *n, const node_table *meta, int64_t start_us, st_arena *a,
                                Google__Longrunning__Operation *op) {
    pb_table *pt = node_table_to_pb(meta, false, a);
    char *name = st_arena_alloc(a, NODE_TABLE_NAME_MAX + 64);
    Google__Protobuf__Timestamp *ts = st_arena_alloc(a, 2 * sizeof *ts);
    Google__Protobuf__Any *any = st_arena_alloc(a, 2 * sizeof *any);
    if (!pt || !name || !ts || !any)
        return ST_RESOURCE_EXHAUSTED;
    /* The name only identifies the operation; the node keeps no operations (it is done). */
    snprintf(name, NODE_TABLE_NAME_MAX + 64, "operations/%s/%" PRId64, meta->name, start_us);
    int64_t end_us = st_wall_us();
    for (int i = 0; i < 2; i++) {
        google__protobuf__timestamp__init(&ts[i]);
        ts[i].seconds = (i ? end_us : start_us) / 1000000;
        ts[i].nanos = (int32_t)((i ? end_us : start_us) % 1000000) * 1000;
        google__protobuf__any__init(&any[i]);
    }
    Google__Bigtable__Admin__V2__UpdateTableMetadata md;
    google__bigtable__admin__v2__update_table_metadata__init(&md);
    md.name = (char *)meta->name;
    md.start_time = &ts[0];
    md.end_time = &ts[1];
    size_t md_len = protobuf_c_message_get_packed_size(&md.base);
    size_t t_len = protobuf_c_message_get_packed_size(&pt->base);
    uint8_t *md_buf = st_arena_alloc(a, md_len + 1), *t_buf = st_arena_alloc(a, t_len + 1);
    if (!md_buf || !t_buf)
        return ST_RESOURCE_EXHAUSTED;
    any[0].type_url = TYPE_URL_PREFIX "UpdateTableMetadata";
    any[0].value = (ProtobufCBinaryData){protobuf_c_message_pack(&md.base, md_buf), md_buf};
    any[1].type_url = TYPE_URL_PREFIX "Table";
    any[1].value = (ProtobufCBinaryData){protobuf_c_message_pack(&pt->base, t_buf), t_buf};
    google__longrunning__operation__init(op);
    op->name = name;
    op->metadata = &any[0];
    op->done = true;
    op->result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
    op->response = &any[1];
    (void)n;
    return ST_OK;
}

void node_h_update_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    int64_t start_us = st_wall_us();
    Google__Bigtable__Admin__V2__UpdateTableRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__update_table_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err = {0};
    update_spec u;
    if (update_spec_from_pb(req, &u, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    node_table *meta;
    if (!node_table_or_fail(n, call, req->table->name, &meta))
        return;
    if (node_table_update(n, meta, u.set_retention, u.retention_us, u.set_protection, u.protection,
                          &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "admin",
           "updated table=%s change_stream_retention_us=%" PRId64 " deletion_protection=%d",
           meta->name, meta->cs_retention_us, (int)meta->deletion_protection);
    Google__Longrunning__Operation op;
    if (update_operation(n, meta, start_us, rpc_call_arena(call), &op) != ST_OK) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory building the operation");
        return;
    }
    node_reply(call, &op.base);
}

/* ---- ModifyColumnFamilies ---- */

typedef Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification pb_mod;

/* Checks every modification against the families as they will be when it applies, so the
 * request is applied all or nothing. */
static st_code check_mods(const node_table *t, pb_mod **mods, size_t n_mods, st_err *err) {
    const char **names = calloc(t->n_families + n_mods + 1, sizeof *names);
    if (!names)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    size_t count = 0;
    for (size_t i = 0; i < t->n_families; i++)
        names[count++] = t->families[i].name;
    st_code rc = ST_OK;
    for (size_t m = 0; rc == ST_OK && m < n_mods; m++) {
        const char *id = mods[m]->id;
        size_t at = count;
        for (size_t i = 0; i < count; i++)
            if (names[i] && strcmp(names[i], id) == 0)
                at = i;
        switch (mods[m]->mod_case) {
        case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE:
            if (!btu_family_valid(id))
                rc = st_err_set(err, ST_INVALID_ARGUMENT,
                                "invalid column family name '%s': use 1-64 of [-_.a-zA-Z0-9]", id);
            else if (at < count)
                rc = st_err_set(err, ST_ALREADY_EXISTS, "column family %s already exists", id);
            else
                names[count++] = id;
            break;
        case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_UPDATE:
            if (at == count)
                rc = st_err_set(err, ST_NOT_FOUND, "column family %s not found", id);
            break;
        case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP:
            if (!btu_mod_drops(mods[m]))
                break;
            if (at == count)
                rc = st_err_set(err, ST_NOT_FOUND, "column family %s not found", id);
            else
                names[at] = NULL;
            break;
        default:
            rc = st_err_set(err, ST_INVALID_ARGUMENT, "modification of %s has no action", id);
        }
    }
    free(names);
    return rc;
}

#define PURGE_BATCH_ROWS 256 /* rows per durable write of a family purge */
#define PURGE_ROUNDS_MAX 4   /* passes over a table whose tablets split or move meanwhile */

/* Writes the DeleteFromFamily of each row in keys (offs[i]: where row i starts) at version: one
 * durable write for the batch rather than one fsync per row. */
static st_code purge_flush(sto_db *db, uint64_t id, const sto_mut *del, uint64_t version,
                           uint32_t origin, const st_buf *keys, const size_t *offs, size_t n_rows,
                           st_err *err) {
    if (n_rows == 0)
        return ST_OK;
    sto_row_mut rows[PURGE_BATCH_ROWS];
    for (size_t i = 0; i < n_rows; i++)
        rows[i] = (sto_row_mut){
            .tablet_id = id,
            .row = st_slice_make(keys->data + offs[i],
                                 (i + 1 < n_rows ? offs[i + 1] : keys->len) - offs[i]),
            .muts = del,
            .n_muts = 1,
            .version = version,
            .commit_ts_us = (uint64_t)STO_VERSION_TS_US(version),
            .origin = origin,
            .flags = STO_ROW_REPLICATED};
    return sto_write(db, rows, n_rows, NULL, err);
}

/* Deletes family's cells in tablet id (st) at version. Thread-safe: storage only. */
static st_code purge_tablet(sto_db *db, uint64_t id, sto_tablet *st, const char *family,
                            uint64_t version, uint32_t origin, st_err *err) {
    sto_mut del = {.type = STO_MUT_DEL_FAMILY, .family = st_slice_cstr(family)};
    sto_snapshot *snap = NULL;
    sto_iter *it = NULL;
    sto_range all = {0};
    st_code rc = sto_snapshot_new(st, &snap, err);
    if (rc == ST_OK)
        rc = sto_iter_new(snap, &all, false, &it, err);
    st_buf keys;
    st_buf_init(&keys);
    size_t offs[PURGE_BATCH_ROWS], n_rows = 0;
    sto_cell cell;
    while (rc == ST_OK && (rc = sto_iter_next(it, &cell, err)) == ST_OK) {
        if (!st_slice_eq(cell.family, del.family))
            continue;
        offs[n_rows++] = keys.len;
        if (st_buf_append(&keys, cell.row.data, cell.row.len) != ST_OK)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory purging a family");
        sto_iter_skip_row(it);
        if (rc == ST_OK && n_rows == PURGE_BATCH_ROWS) {
            rc = purge_flush(db, id, &del, version, origin, &keys, offs, n_rows, err);
            n_rows = 0;
            st_buf_reset(&keys);
        }
    }
    if (rc == ST_NOT_FOUND)
        rc = purge_flush(db, id, &del, version, origin, &keys, offs, n_rows, err);
    st_buf_free(&keys);
    sto_iter_free(it);
    if (snap)
        sto_snapshot_free(snap);
    return rc;
}

/* Writes a DeleteFromFamily for every row of the table holding cells of family, so a dropped
 * family's data is gone (and does not come back if the family is created again). A schema
 * change, not a data change: every node of every cluster purges its own rows when the router
 * pushes the schema, so these deletes are not shipped to peers (STO_ROW_REPLICATED) and, written
 * below node_write, leave no change-stream record (change streams do not capture schema changes,
 * docs/changestreams.md). */
st_code node_family_purge(node_ctx *n, node_tablets *t, const char *family, st_err *err) {
    uint64_t version = node_next_version(n);
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < t->n; i++)
        rc = purge_tablet(n->db, t->v[i].id, t->v[i].st, family, version, n->opts.cluster_num, err);
    return rc;
}

/* ---- waiting for a move to end ----
 * A DropRowRange or a family purge that meets a tablet of its table being moved looks again
 * every MOVE_WAIT_POLL_MS, for at most MOVE_WAIT_MS, and then fails UNAVAILABLE (each says below
 * why it waits). Waiters are listed on the node, so node_close can end them. */
#define MOVE_WAIT_POLL_MS 20
#define MOVE_WAIT_MS 20000 /* below a router's 30 s for an admin call to a node */

struct node_move_waiter {
    node_ctx *n;
    void (*again)(node_move_waiter *w);   /* the next look */
    void (*closing)(node_move_waiter *w); /* the node closes: the call ends UNAVAILABLE */
    struct event *ev;
    int64_t from_us;        /* st_mono_us when the wait began; 0 when not waiting */
    node_move_waiter *next; /* in n->move_waiters while ev is pending */
};

static void waiter_unlist(node_move_waiter *w) {
    if (!w->n)
        return;
    node_move_waiter **p = &w->n->move_waiters;
    while (*p && *p != w)
        p = &(*p)->next;
    if (*p)
        *p = w->next;
    w->next = NULL;
}

static void waiter_free(node_move_waiter *w) {
    waiter_unlist(w);
    if (w->ev)
        event_free(w->ev);
    w->ev = NULL;
}

static void waiter_fire(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_move_waiter *w = arg;
    waiter_unlist(w);
    w->again(w);
}

/* Schedules w->again in MOVE_WAIT_POLL_MS (ST_OK); UNAVAILABLE once w has waited MOVE_WAIT_MS,
 * RESOURCE_EXHAUSTED when out of memory: nothing is scheduled then, the caller ends its call. */
static st_code waiter_wait(node_move_waiter *w) {
    int64_t now = st_mono_us();
    if (w->from_us == 0)
        w->from_us = now;
    if (now - w->from_us > (int64_t)MOVE_WAIT_MS * 1000)
        return ST_UNAVAILABLE;
    if (!w->ev && !(w->ev = evtimer_new(w->n->base, waiter_fire, w)))
        return ST_RESOURCE_EXHAUSTED;
    struct timeval tv = {0, MOVE_WAIT_POLL_MS * 1000};
    evtimer_add(w->ev, &tv);
    w->next = w->n->move_waiters;
    w->n->move_waiters = w;
    return ST_OK;
}

void node_move_waiters_abort(node_ctx *n) {
    while (n->move_waiters) {
        node_move_waiter *w = n->move_waiters;
        waiter_unlist(w);
        w->closing(w);
    }
}

/* ---- purges on a job thread ----
 * A purge scans every row of the table: seconds for a large one (300,000 rows held the loop for
 * 66 s when each row was its own durable write), so schema changes that drop families purge on
 * a job. The caller has already taken the families out of the catalog in memory, so no write to
 * them arrives meanwhile; one version, taken on the loop at the start, covers every delete, so a
 * family created again meanwhile keeps its new cells. A tablet split or dropped meanwhile leaves
 * no trace in storage's view of the old tablet: the table's tablets are then purged again.
 *
 * Moves: a purge also writes into a tablet moving away and into a move's incoming copy, and the
 * copy may or may not carry those deletes. So a purge that ends while a tablet of the table is
 * moving or incoming waits for the move to end (as above) and purges the table's tablets
 * again: on the target the activated copy is then purged like any tablet, so no cell of the
 * dropped family comes back with it (to show again in a family created anew under its name). */
typedef struct purge_arg {
    node_move_waiter wait; /* first: waiter_fire's w is the purge */
    char table[NODE_TABLE_NAME_MAX + 1];
    char (*fams)[NODE_FAMILY_NAME_MAX + 1];
    size_t n_fams;
    uint64_t version;
    int round;
    uint64_t *ids;
    sto_tablet **sts;
    size_t n_ids;
    node_purge_done_fn done;
    void *done_arg;
    rpc_call *call; /* while waiting for a move of one of the table's tablets to end */
} purge_arg;

static void purge_arg_free(purge_arg *a) {
    waiter_free(&a->wait);
    free(a->fams);
    free(a->ids);
    free(a->sts);
    free(a);
}

static void purge_work(node_job *j) {
    purge_arg *a = j->arg;
    j->rc = ST_OK;
    for (size_t i = 0; j->rc == ST_OK && i < a->n_ids; i++)
        for (size_t f = 0; j->rc == ST_OK && f < a->n_fams; f++)
            j->rc = purge_tablet(j->n->db, a->ids[i], a->sts[i], a->fams[f], a->version,
                                 j->n->opts.cluster_num, &j->err);
}

/* True when a tablet the job purged is no longer served (split, dropped or moved meanwhile). */
static bool purge_vanished(node_ctx *n, const purge_arg *a) {
    for (size_t i = 0; i < a->n_ids; i++)
        if (!node_tablet_by_id(n, a->ids[i], NULL))
            return true;
    return false;
}

static st_code purge_start(node_ctx *n, rpc_call *call, purge_arg *a, st_err *err);

/* Ends the purge: its families' purging entries end (a failed purge puts them back) and its
 * caller's done answers. */
static void purge_finish(node_ctx *n, rpc_call *call, purge_arg *a, st_code rc, const char *msg) {
    node_table *meta = node_catalog_find(n->catalog, a->table);
    for (size_t f = 0; meta && f < a->n_fams; f++)
        node_table_purge_end(meta, a->fams[f], rc != ST_OK);
    a->done(n, call, rc, rc == ST_OK ? NULL : msg, a->done_arg);
    purge_arg_free(a);
}

static bool table_in_move(node_ctx *n, const char *table) {
    node_tablets *t = node_tablets_find(n, table);
    for (size_t i = 0; t && i < t->n; i++)
        if (t->v[i].moving || t->v[i].incoming)
            return true;
    return false;
}

static void purge_again(node_move_waiter *w) {
    purge_arg *a = (purge_arg *)w;
    st_err err = {0};
    if (purge_start(w->n, a->call, a, &err) != ST_OK)
        purge_finish(w->n, a->call, a, err.code, err.msg);
}

static void purge_closing(node_move_waiter *w) {
    purge_arg *a = (purge_arg *)w;
    purge_finish(w->n, a->call, a, ST_UNAVAILABLE,
                 "the node is shutting down; retry dropping the family");
}

/* Purges the table again in a moment, as one of its tablets is moving (see above), or ends the
 * purge UNAVAILABLE once it has waited long enough. */
static void purge_wait_move(node_ctx *n, rpc_call *call, purge_arg *a) {
    a->wait = (node_move_waiter){n, purge_again, purge_closing, a->wait.ev, a->wait.from_us, NULL};
    a->call = call;
    st_code rc = waiter_wait(&a->wait);
    if (rc == ST_RESOURCE_EXHAUSTED) {
        purge_finish(n, call, a, rc, "out of memory dropping a family");
    } else if (rc != ST_OK) {
        char msg[NODE_TABLE_NAME_MAX + 96];
        snprintf(msg, sizeof msg, "a tablet of %s is still being moved; retry dropping the family",
                 a->table);
        purge_finish(n, call, a, rc, msg);
    }
}

static void purge_done(node_job *j) {
    purge_arg *a = j->arg;
    node_ctx *n = j->n;
    rpc_call *call = j->call;
    st_code rc = j->rc;
    st_err err = j->err;
    free(j);
    if ((rc == ST_OK || rc == ST_NOT_FOUND) && table_in_move(n, a->table)) {
        purge_wait_move(n, call, a);
        return;
    }
    a->wait.from_us = 0;
    if (rc == ST_NOT_FOUND || (rc == ST_OK && purge_vanished(n, a))) {
        rc = ST_OK;
        if (++a->round < PURGE_ROUNDS_MAX) {
            if ((rc = purge_start(n, call, a, &err)) == ST_OK)
                return;
        } else {
            rc = st_err_set(&err, ST_UNAVAILABLE,
                            "the tablets of %s kept splitting or moving while a dropped "
                            "family's cells were deleted; retry",
                            a->table);
        }
    }
    purge_finish(n, call, a, rc, err.msg);
}

/* Captures the table's tablets of this moment and starts a job over them; a is the job's. */
static st_code purge_start(node_ctx *n, rpc_call *call, purge_arg *a, st_err *err) {
    node_tablets *t = node_tablets_find(n, a->table);
    size_t count = t ? t->n : 0;
    node_job *j = calloc(1, sizeof *j);
    uint64_t *ids = calloc(count ? count : 1, sizeof *ids);
    sto_tablet **sts = calloc(count ? count : 1, sizeof *sts);
    if (!j || !ids || !sts) {
        free(j);
        free(ids);
        free(sts);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory dropping a family");
    }
    free(a->ids);
    free(a->sts);
    a->ids = ids;
    a->sts = sts;
    for (size_t i = 0; i < count; i++) {
        ids[i] = t->v[i].id;
        sts[i] = t->v[i].st;
    }
    a->n_ids = count;
    *j = (node_job){.n = n, .call = call, .work = purge_work, .done = purge_done, .arg = a};
    st_code rc = node_job_start(j, err);
    if (rc != ST_OK)
        free(j);
    return rc;
}

st_code node_family_purge_start(node_ctx *n, rpc_call *call, const char *table,
                                const char *const *fams, size_t n_fams, node_purge_done_fn done,
                                void *arg, st_err *err) {
    purge_arg *a = calloc(1, sizeof *a);
    if (a)
        a->fams = calloc(n_fams ? n_fams : 1, sizeof *a->fams);
    if (!a || !a->fams) {
        free(a);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory dropping a family");
    }
    snprintf(a->table, sizeof a->table, "%s", table);
    for (size_t i = 0; i < n_fams; i++)
        snprintf(a->fams[i], sizeof a->fams[i], "%s", fams[i]);
    a->n_fams = n_fams;
    a->version = node_next_version(n);
    a->done = done;
    a->done_arg = arg;
    st_code rc = purge_start(n, call, a, err);
    if (rc != ST_OK)
        purge_arg_free(a);
    return rc;
}

/* Applies m to the catalog entry t in memory; a dropped family is added to *dropped (its cells
 * are deleted afterwards, node_family_purge_start). */
static st_code apply_mod(node_table *t, const pb_mod *m, const char **dropped, size_t *n_dropped,
                         st_err *err) {
    const char *id = m->id;
    if (m->mod_case ==
        GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP) {
        if (!btu_mod_drops(m))
            return ST_OK;
        st_code rc = node_table_purge_begin(t, id, err);
        if (rc == ST_OK)
            dropped[(*n_dropped)++] = id;
        return rc;
    }
    const Google__Bigtable__Admin__V2__ColumnFamily *cf =
        m->mod_case ==
                GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE
            ? m->create
            : m->update;
    node_gc gc;
    st_code rc = node_gc_from_pb(cf ? cf->gc_rule : NULL, &gc, 0, err);
    if (rc == ST_OK)
        rc = node_table_family_set(t, id, &gc, err);
    node_gc_free(&gc);
    return rc;
}

/* The end of ModifyColumnFamilies once the dropped families' cells are gone: the catalog is
 * saved, the GC rules pushed and the table answered. */
static void mcf_finish(node_ctx *n, rpc_call *call, st_code code, const char *msg, void *arg) {
    const char *name = arg;
    st_err err = {0};
    node_table *meta = node_catalog_find(n->catalog, name);
    if (code == ST_OK && !meta)
        code = st_err_set(&err, ST_NOT_FOUND, "table \"%s\" was deleted meanwhile", name);
    else if (code != ST_OK)
        st_err_set(&err, code, "%s", msg);
    if (code == ST_OK)
        code = node_catalog_save(n->catalog, &err);
    if (code == ST_OK)
        code = node_table_push_gc(n, meta, &err);
    if (code != ST_OK) {
        node_fail(call, code, "%s", err.msg);
        return;
    }
    pb_table *pt = node_table_to_pb(meta, false, rpc_call_arena(call));
    if (!pt) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &pt->base);
}

void node_h_modify_column_families(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__modify_column_families_request__descriptor, req_bytes);
    if (!req)
        return;
    node_table *meta;
    if (!node_table_or_fail(n, call, req->name, &meta))
        return;
    st_err err;
    /* GC rules are validated before anything changes, too. */
    for (size_t i = 0; i < req->n_modifications; i++) {
        const pb_mod *m = req->modifications[i];
        const Google__Bigtable__Admin__V2__ColumnFamily *cf =
            m->mod_case ==
                    GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE
                ? m->create
            : m->mod_case ==
                    GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_UPDATE
                ? m->update
                : NULL;
        node_gc gc;
        if (node_gc_from_pb(cf ? cf->gc_rule : NULL, &gc, 0, &err) != ST_OK) {
            node_fail(call, err.code, "%s", err.msg);
            return;
        }
        node_gc_free(&gc);
    }
    st_code rc = btu_drop_protection_check(meta->name, meta->deletion_protection, req, &err);
    if (rc == ST_OK)
        rc = check_mods(meta, req->modifications, req->n_modifications, &err);
    const char **dropped =
        st_arena_alloc(rpc_call_arena(call), (req->n_modifications + 1) * sizeof *dropped);
    size_t n_dropped = 0;
    if (rc == ST_OK && !dropped)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rc == ST_OK && i < req->n_modifications; i++)
        rc = apply_mod(meta, req->modifications[i], dropped, &n_dropped, &err);
    node_tablets *t = node_tablets_find(n, meta->name);
    bool purge = rc == ST_OK && n_dropped && t && t->n;
    if (purge)
        rc = node_family_purge_start(n, call, meta->name, dropped, n_dropped, mcf_finish, req->name,
                                     &err);
    /* Without a purge (or when it could not start) the dropped families' entries end here. */
    for (size_t i = 0; (!purge || rc != ST_OK) && i < n_dropped; i++)
        node_table_purge_end(meta, dropped[i], rc != ST_OK);
    if (rc == ST_OK && !purge)
        mcf_finish(n, call, ST_OK, NULL, req->name);
    if (rc != ST_OK)
        node_fail(call, rc, "%s", err.msg);
}

/* ---- DropRowRange ---- */

/* With change streams on, a dropped row gets a record like a DeleteFromRow: the rows are
 * deleted through node_write (one DeleteFromRow each, DROP_BATCH_ROWS per write) rather than by
 * storage's sto_tablet_drop_prefix. Their history stays (a row delete does not cover it).
 *
 * node_write belongs to the loop thread, so the scan runs there too, one batch at a time: a
 * batch scans at most DROP_BATCH_ROWS rows from where the last one stopped, writes them, and the
 * next starts once that write is done (scanning a whole large table in one turn held the loop for
 * seconds). Each batch looks up the tablet holding its first row again, so a split or a move
 * between batches is followed.
 *
 * Moves (docs/cluster.md, Moves): a move's incoming copy is skipped, as this node does not own
 * its range yet (its source does, and the drop reaches the copy's rows there or, once the copy
 * is activated, here again through the router's next round). A tablet moving away is waited for
 * (as a purge waits for a move, above): its deletes would land in a copy about to be dropped
 * after the snapshot was taken, and a move that fails gives the tablet back, whose rows must
 * then be dropped here. */
#define DROP_BATCH_ROWS 256

typedef struct drop_op {
    node_move_waiter wait; /* first: waiter_fire's w is the drop; wait.n is the node */
    rpc_call *call;
    char table[NODE_TABLE_NAME_MAX + 1];
    st_buf prefix;
    st_buf from; /* the next batch scans rows >= from */
    st_buf keys; /* the batch's rows, end to end; offs[i]: where row i starts */
    size_t offs[DROP_BATCH_ROWS];
    bool finished; /* the batch being written is the last */
} drop_op;

/* A DropRowRange's answer: Empty when code is OK, else the error. */
static void drop_answer(rpc_call *call, st_code code, const char *msg) {
    if (code != ST_OK) {
        node_fail(call, code, "%s", msg);
        return;
    }
    Google__Protobuf__Empty empty;
    google__protobuf__empty__init(&empty);
    node_reply(call, &empty.base);
}

static void drop_end(drop_op *op, st_code code, const char *msg) {
    waiter_free(&op->wait);
    drop_answer(op->call, code, msg);
    st_buf_free(&op->prefix);
    st_buf_free(&op->from);
    st_buf_free(&op->keys);
    free(op);
}

static void drop_batch(drop_op *op);

static void drop_written(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)n;
    drop_op *op = arg;
    if (code != ST_OK)
        drop_end(op, code, msg ? msg : st_code_name(code));
    else if (op->finished)
        drop_end(op, ST_OK, NULL);
    else
        drop_batch(op);
}

/* Writes a DeleteFromRow for each of the n_rows rows in op->keys into tablet id. */
static st_code drop_write(drop_op *op, uint64_t id, size_t n_rows, st_err *err) {
    static const sto_mut del = {.type = STO_MUT_DEL_ROW};
    sto_row_mut rows[DROP_BATCH_ROWS];
    uint64_t version = node_next_version(op->wait.n);
    for (size_t i = 0; i < n_rows; i++)
        rows[i] = (sto_row_mut){
            .tablet_id = id,
            .row = st_slice_make(op->keys.data + op->offs[i],
                                 (i + 1 < n_rows ? op->offs[i + 1] : op->keys.len) - op->offs[i]),
            .muts = &del,
            .n_muts = 1,
            .version = version,
            .commit_ts_us = (uint64_t)STO_VERSION_TS_US(version),
            /* shipped to the peer clusters, as storage's own DropRowRange deletes are */
            .origin = op->wait.n->opts.cluster_num};
    return node_write(op->wait.n, rows, n_rows, err, drop_written, op);
}

/* Collects up to DROP_BATCH_ROWS rows with the prefix from op->from to the end of tab and moves
 * op->from past them: just after the last row, or to tab's end once tab has no more. *finished
 * when no row with the prefix is left after them in the table. */
static st_code drop_scan(drop_op *op, node_tablet *tab, size_t *n_rows, bool *finished,
                         st_err *err) {
    st_slice prefix = st_buf_slice(&op->prefix);
    sto_snapshot *snap = NULL;
    sto_iter *it = NULL;
    sto_range r = {.start = st_buf_slice(&op->from), .end = st_buf_slice(&tab->end)};
    st_code rc = sto_snapshot_new(tab->st, &snap, err);
    if (rc == ST_OK)
        rc = sto_iter_new(snap, &r, false, &it, err);
    st_buf_reset(&op->keys);
    *n_rows = 0;
    *finished = false;
    sto_cell c;
    while (rc == ST_OK && *n_rows < DROP_BATCH_ROWS && (rc = sto_iter_next(it, &c, err)) == ST_OK) {
        if (prefix.len &&
            (c.row.len < prefix.len || memcmp(c.row.data, prefix.data, prefix.len) != 0)) {
            *finished = true; /* rows sort: none after this one has the prefix */
            break;
        }
        op->offs[(*n_rows)++] = op->keys.len;
        if (st_buf_append(&op->keys, c.row.data, c.row.len) != ST_OK)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
        sto_iter_skip_row(it);
    }
    bool tablet_done = rc == ST_NOT_FOUND;
    if (rc == ST_NOT_FOUND || (rc == ST_OK && *finished))
        rc = ST_OK;
    sto_iter_free(it);
    if (snap)
        sto_snapshot_free(snap);
    if (rc != ST_OK || *finished)
        return rc;
    st_buf_reset(&op->from);
    if (tablet_done) {
        *finished = tab->end.len == 0;
        return st_buf_append(&op->from, tab->end.data, tab->end.len);
    }
    size_t last = op->offs[*n_rows - 1]; /* the smallest key after the last row */
    if (st_buf_append(&op->from, op->keys.data + last, op->keys.len - last) != ST_OK ||
        st_buf_append(&op->from, "", 1) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
    return ST_OK;
}

/* The tablet holding op->from or, in a gap, the next one (op->from moves to its start); NULL
 * when no tablet is left. */
static node_tablet *drop_next_tablet(drop_op *op, node_tablets *t) {
    st_slice from = st_buf_slice(&op->from);
    node_tablet *tab = node_tablet_for_row(t, from);
    if (tab || t->n == 0)
        return tab;
    size_t i = node_tablet_index(t, from);
    if (st_slice_cmp(st_buf_slice(&t->v[i].start), from) <= 0 && ++i == t->n)
        return NULL;
    tab = &t->v[i];
    st_buf_reset(&op->from);
    return st_buf_append(&op->from, tab->start.data, tab->start.len) == ST_OK ? tab : NULL;
}

/* One batch: scans until it has rows to write (or nothing is left) and writes them; the write's
 * completion starts the next batch. */
static void drop_again(node_move_waiter *w) {
    drop_batch((drop_op *)w);
}

static void drop_closing(node_move_waiter *w) {
    drop_end((drop_op *)w, ST_UNAVAILABLE, "the node is shutting down; retry the DropRowRange");
}

/* Looks again in a moment, as tab is moving away (see above), or ends the call once it has
 * waited long enough. */
static void drop_wait_move(drop_op *op, const node_tablet *tab) {
    st_code rc = waiter_wait(&op->wait);
    if (rc == ST_RESOURCE_EXHAUSTED) {
        drop_end(op, rc, "out of memory dropping rows");
    } else if (rc != ST_OK) {
        char msg[NODE_TABLE_NAME_MAX + 96];
        snprintf(msg, sizeof msg,
                 "tablet %" PRIu64 " of %s is still being moved; retry the DropRowRange", tab->id,
                 op->table);
        drop_end(op, rc, msg);
    }
}

static void drop_batch(drop_op *op) {
    st_err err = {0};
    node_tablets *t = node_tablets_find(op->wait.n, op->table);
    bool finished = false;
    while (t) {
        node_tablet *tab = drop_next_tablet(op, t);
        if (!tab)
            break;
        if (tab->moving) {
            drop_wait_move(op, tab);
            return;
        }
        op->wait.from_us = 0;
        if (tab->incoming) { /* not this node's range yet (see above): on past it */
            st_buf_reset(&op->from);
            if (st_buf_append(&op->from, tab->end.data, tab->end.len) != ST_OK) {
                drop_end(op, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
                return;
            }
            if (tab->end.len == 0)
                break;
            continue;
        }
        size_t n_rows;
        st_code rc = drop_scan(op, tab, &n_rows, &finished, &err);
        op->finished = finished;
        if (rc == ST_OK && n_rows)
            rc = drop_write(op, tab->id, n_rows, &err);
        if (rc != ST_OK) {
            drop_end(op, rc, err.msg);
            return;
        }
        if (n_rows) /* drop_written goes on (and ends the call once finished) */
            return;
        if (finished)
            break;
    }
    drop_end(op, ST_OK, NULL);
}

static void drop_recorded(node_ctx *n, rpc_call *call, const char *table, st_slice prefix) {
    drop_op *op = calloc(1, sizeof *op);
    if (!op || st_buf_append(&op->prefix, prefix.data, prefix.len) != ST_OK ||
        st_buf_append(&op->from, prefix.data, prefix.len) != ST_OK) {
        if (op)
            drop_end(op, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
        else
            node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
        return;
    }
    op->wait = (node_move_waiter){.n = n, .again = drop_again, .closing = drop_closing};
    op->call = call;
    snprintf(op->table, sizeof op->table, "%s", table);
    drop_batch(op);
}

/* Without change streams storage deletes the rows (sto_tablet_drop_prefix): a scan of every
 * row with the prefix and a durable write per DROP_BATCH_ROWS of them, seconds for a large
 * table, so it runs on a job thread. One version for every delete, taken on the loop at the
 * request: a write made meanwhile has a higher one and survives, as it would have after the
 * call. A tablet split or dropped meanwhile is gone from storage (NOT_FOUND); the table's
 * tablets of that moment are then done again (the deletes are idempotent), a few times at most.
 *
 * Moves (docs/cluster.md, "DropRowRange on a node during a move"): the job's deletes bypass
 * node_write, so a move's drain of in-flight writes does not wait for them, and a copy taken
 * while the job runs, or before it starts, keeps rows the job then deletes only here. So a job
 * and a move of the same table exclude each other on this node: the job starts once no tablet of
 * the table is moving away (waiting as above, at most MOVE_WAIT_MS, then UNAVAILABLE), and a
 * move of one of its tablets waits until no job of the table runs (n->drop_jobs, move.c). A tablet
 * that moved away before the job started is the router's: its next round reaches the target. */
#define DROP_PREFIX_ROUNDS_MAX 4

typedef struct drop_prefix_arg {
    node_move_waiter wait; /* first: waiter_fire's w is the drop; wait.n is the node */
    rpc_call *call;
    char table[NODE_TABLE_NAME_MAX + 1];
    st_buf prefix;
    uint64_t version;
    int round;
    uint64_t *ids;
    size_t n_ids;
    bool vanished;                /* a tablet was gone from storage */
    struct drop_prefix_arg *next; /* in n->drop_jobs while the job runs */
} drop_prefix_arg;

/* Answers the call (OK when code is) and frees a. */
static void drop_prefix_end(drop_prefix_arg *a, st_code code, const char *msg) {
    waiter_free(&a->wait);
    drop_answer(a->call, code, msg);
    st_buf_free(&a->prefix);
    free(a->ids);
    free(a);
}

static void drop_prefix_work(node_job *j) {
    drop_prefix_arg *a = j->arg;
    j->rc = ST_OK;
    for (size_t i = 0; j->rc == ST_OK && i < a->n_ids; i++) {
        st_err err = {0};
        st_code rc =
            sto_tablet_drop_prefix(j->n->db, a->ids[i], st_buf_slice(&a->prefix), a->version, &err);
        if (rc == ST_NOT_FOUND)
            a->vanished = true;
        else if (rc != ST_OK)
            j->rc = st_err_set(&j->err, rc, "%s", err.msg);
    }
}

static void drop_prefix_run(drop_prefix_arg *a);

static void drop_prefix_done(node_job *j) {
    drop_prefix_arg *a = j->arg;
    st_code rc = j->rc;
    st_err err = j->err;
    free(j);
    drop_prefix_arg **p = &a->wait.n->drop_jobs;
    while (*p && *p != a)
        p = &(*p)->next;
    if (*p)
        *p = a->next;
    if (rc == ST_OK && a->vanished && node_tablets_find(a->wait.n, a->table)) {
        if (++a->round < DROP_PREFIX_ROUNDS_MAX) {
            drop_prefix_run(a);
            return;
        }
        rc = st_err_set(&err, ST_UNAVAILABLE,
                        "the tablets of %s kept splitting or moving during DropRowRange; retry",
                        a->table);
    }
    drop_prefix_end(a, rc, err.msg);
}

static void drop_prefix_again(node_move_waiter *w) {
    drop_prefix_run((drop_prefix_arg *)w);
}

static void drop_prefix_closing(node_move_waiter *w) {
    drop_prefix_end((drop_prefix_arg *)w, ST_UNAVAILABLE,
                    "the node is shutting down; retry the DropRowRange");
}

/* The first tablet of t moving away, or NULL. */
static const node_tablet *moving_tablet(const node_tablets *t) {
    for (size_t i = 0; t && i < t->n; i++)
        if (t->v[i].moving)
            return &t->v[i];
    return NULL;
}

/* Starts the job over the table's tablets of this moment once none is moving away (see above);
 * ends the call when it cannot. */
static void drop_prefix_run(drop_prefix_arg *a) {
    node_ctx *n = a->wait.n;
    node_tablets *t = node_tablets_find(n, a->table);
    const node_tablet *moving = moving_tablet(t);
    if (moving) {
        st_code rc = waiter_wait(&a->wait);
        char msg[NODE_TABLE_NAME_MAX + 96];
        snprintf(msg, sizeof msg,
                 "tablet %" PRIu64 " of %s is still being moved; retry the DropRowRange",
                 moving->id, a->table);
        if (rc != ST_OK)
            drop_prefix_end(a, rc,
                            rc == ST_RESOURCE_EXHAUSTED ? "out of memory dropping rows" : msg);
        return;
    }
    a->wait.from_us = 0;
    a->vanished = false;
    a->n_ids = 0;
    free(a->ids);
    a->ids = t && t->n ? calloc(t->n, sizeof *a->ids) : NULL;
    node_job *j = calloc(1, sizeof *j);
    st_err err = {0};
    st_code rc = ST_OK;
    if (!j || (t && t->n && !a->ids))
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
    for (size_t i = 0; rc == ST_OK && t && i < t->n; i++)
        if (!t->v[i].incoming) /* not this node's range yet (DropRowRange above) */
            a->ids[a->n_ids++] = t->v[i].id;
    if (rc == ST_OK) {
        *j = (node_job){
            .n = n, .call = a->call, .work = drop_prefix_work, .done = drop_prefix_done, .arg = a};
        rc = node_job_start(j, &err);
    }
    if (rc != ST_OK) {
        free(j);
        drop_prefix_end(a, rc, err.msg);
        return;
    }
    a->next = n->drop_jobs;
    n->drop_jobs = a;
}

static void drop_prefix_start(node_ctx *n, rpc_call *call, const char *table, st_slice prefix) {
    drop_prefix_arg *a = calloc(1, sizeof *a);
    if (!a || st_buf_append(&a->prefix, prefix.data, prefix.len) != ST_OK) {
        if (a)
            st_buf_free(&a->prefix);
        free(a);
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory dropping rows");
        return;
    }
    a->wait =
        (node_move_waiter){.n = n, .again = drop_prefix_again, .closing = drop_prefix_closing};
    a->call = call;
    snprintf(a->table, sizeof a->table, "%s", table);
    a->version = node_next_version(n);
    drop_prefix_run(a);
}

bool node_table_dropping(const node_ctx *n, const char *table) {
    for (const drop_prefix_arg *a = n->drop_jobs; a; a = a->next)
        if (strcmp(a->table, table) == 0)
            return true;
    return false;
}

void node_h_drop_row_range(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__DropRowRangeRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__drop_row_range_request__descriptor, req_bytes);
    if (!req)
        return;
    node_tablets *t = node_table_or_fail(n, call, req->name, NULL);
    if (!t)
        return;
    st_slice prefix = {0};
    if (req->target_case ==
        GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_ROW_KEY_PREFIX) {
        prefix = st_slice_make(req->row_key_prefix.data, req->row_key_prefix.len);
        if (prefix.len == 0) {
            node_fail(call, ST_INVALID_ARGUMENT, "row_key_prefix must not be empty");
            return;
        }
    } else if (
        req->target_case !=
            GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_DELETE_ALL_DATA_FROM_TABLE ||
        !req->delete_all_data_from_table) {
        node_fail(call, ST_INVALID_ARGUMENT, "set row_key_prefix or delete_all_data_from_table");
        return;
    }
    node_table *meta = node_catalog_find(n->catalog, req->name);
    if (meta && meta->cs_retention_us > 0) {
        drop_recorded(n, call, req->name, prefix);
        return;
    }
    drop_prefix_start(n, call, req->name, prefix);
}

/* ---- consistency tokens ----
 * On one node every acknowledged write is already readable, so a token (the log position when it
 * was made) is consistent at once; replication makes CheckConsistency wait for peers. */

void node_h_generate_consistency_token(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__generate_consistency_token_request__descriptor,
        req_bytes);
    if (!req || !node_table_or_fail(n, call, req->name, NULL))
        return;
    char token[32];
    snprintf(token, sizeof token, "%" PRIu64, sto_log_last_lsn(n->db));
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse resp;
    google__bigtable__admin__v2__generate_consistency_token_response__init(&resp);
    resp.consistency_token = token;
    node_reply(call, &resp.base);
}

void node_h_check_consistency(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Google__Bigtable__Admin__V2__CheckConsistencyRequest *req = (void *)node_unpack(
        call, &google__bigtable__admin__v2__check_consistency_request__descriptor, req_bytes);
    if (!req || !node_table_or_fail(n, call, req->name, NULL))
        return;
    char *end = NULL;
    unsigned long long lsn = strtoull(req->consistency_token, &end, 10);
    if (!req->consistency_token[0] || !end || *end) {
        node_fail(call, ST_INVALID_ARGUMENT, "invalid consistency token '%s'",
                  req->consistency_token);
        return;
    }
    Google__Bigtable__Admin__V2__CheckConsistencyResponse resp;
    google__bigtable__admin__v2__check_consistency_response__init(&resp);
    resp.consistent = lsn <= sto_log_last_lsn(n->db);
    node_reply(call, &resp.base);
}
