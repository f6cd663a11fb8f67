/* admin.c — the table admin API on the router. Schemas live in the metadata table (meta.c) and are
 * pushed to every node of every cluster with PutTable; tablets are created with CreateTablet,
 * one per initial-split interval per cluster, round robin over the cluster's nodes.
 *
 * Order of effects (a router may die between any two steps): CreateTable and
 * ModifyColumnFamilies change the nodes first and write the metadata record last, so the record
 * is the commit point; DeleteTable removes the record first, then drops the nodes' copies. A
 * failure before the commit point rolls the nodes back (best effort). */
#include "router_internal.h"
#include "instance.h" /* rtr_check_instance */
#include "backup.h"   /* rtr_bk_cluster_states */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/cstoken.h"
#include "strata/internal/v1/node.pb-c.h"

/* A family drop first waits for replication to catch up (drop_sync): a check every
 * RTR_DROP_SYNC_MS, at most RTR_DROP_SYNC_ROUNDS times, then UNAVAILABLE. */
#define RTR_DROP_SYNC_MS 50
#define RTR_DROP_SYNC_ROUNDS 600

/* Split intervals whose tablets CreateTable creates at a time in each cluster (create_tablets). */
#define RTR_CREATE_TABLETS_BATCH 16

typedef Google__Bigtable__Admin__V2__Table pb_table;
typedef Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry pb_family;

typedef struct adm_op adm_op;
struct adm_op {
    rtr_ctx *r;
    rpc_call *call;
    char name[RTR_TABLE_NAME_MAX + 1];
    pb_table *table;  /* the schema being written (call arena) */
    pb_table *next;   /* ModifyColumnFamilies: the schema to write once table is recorded */
    char **tokens;    /* ModifyColumnFamilies dropping families: each node's consistency token */
    int sync_rounds;  /* CheckConsistency rounds asked so far (drop_sync) */
    st_buf table_pb;  /* serialized table */
    st_buf put_req;   /* serialized PutTableRequest */
    bool create;      /* CreateTable (else ModifyColumnFamilies or UpdateTable) */
    bool update;      /* UpdateTable: answers an Operation */
    int64_t start_us; /* UpdateTable: when the request arrived (wall clock) */
    st_buf old_put;   /* UpdateTable: PutTableRequest of the schema before, for a rollback */
    ProtobufCBinaryData *splits;
    size_t n_splits;
    size_t tablets_from;     /* CreateTable: the next split interval to create */
    ProtobufCMessage *reply; /* sent on success (call arena) */
    /* CreateTable: holds the table id's claim (rtr_bk_reserve_table) with this token */
    bool claimed;
    char claim[RTR_OP_NAME_MAX + 1];
    bool gated; /* holds the table's gate (admin_gate.c) */
};

static adm_op *op_new(rtr_ctx *r, rpc_call *call, const char *name) {
    adm_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    op->r = r;
    op->call = call;
    snprintf(op->name, sizeof op->name, "%s", name);
    st_buf_init(&op->table_pb);
    st_buf_init(&op->put_req);
    st_buf_init(&op->old_put);
    return op;
}

static void reply_update_op(adm_op *op);

static void claim_released(void *arg, st_code code, const char *msg) {
    (void)arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "releasing a CreateTable claim: %s", msg ? msg : "?");
}

static void op_finish(adm_op *op, st_code code, const char *msg) {
    if (op->claimed) /* the record is written (or the tablets dropped): the id is settled */
        rtr_bk_unclaim(op->r, op->name, op->claim, claim_released, NULL);
    if (op->create && op->claim[0])
        rtr_bk_create_end(op->r, op->claim);
    if (code == ST_OK && op->update)
        reply_update_op(op);
    else if (code == ST_OK && op->reply)
        rtr_reply(op->call, op->reply);
    else
        rpc_call_finish(op->call, code, msg);
    if (op->gated)
        rtr_gate_leave(op->r, op->call);
    st_buf_free(&op->table_pb);
    st_buf_free(&op->put_req);
    st_buf_free(&op->old_put);
    free(op);
}

static pb_table *unpack_table(rpc_call *call, const rtr_meta_rec *rec) {
    return (pb_table *)rtr_unpack(call, &google__bigtable__admin__v2__table__descriptor,
                                  st_slice_make(rec->pb, rec->len));
}

static size_t count_nodes(const rtr_ctx *r) {
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += r->clusters[c].n_nodes;
    return n;
}

/* Calls path on every node of every cluster (skipping the very first node when skip_first). */
static void fan_nodes(adm_op *op, const char *path, st_slice req, bool skip_first,
                      rtr_fan_done_fn done) {
    rtr_ctx *r = op->r;
    rtr_fan *f = rtr_fan_new(r, count_nodes(r), RTR_ADMIN_TIMEOUT_MS, done, op);
    if (!f) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++, k++) {
            if (skip_first && k == 0) {
                f->res[0].code = ST_OK;
                continue;
            }
            rtr_fan_call(f, k, &r->clusters[c].nodes[i], path, req);
        }
    rtr_fan_seal(f);
}

static void free_fan(rtr_fan *f, void *arg) {
    (void)arg;
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].code != ST_OK)
            st_log(ST_LOG_WARN, "router", "DropTable on %s failed: %s",
                   f->res[i].node ? f->res[i].node->addr : "?", f->res[i].err.msg);
    rtr_fan_free(f);
}

/* DropTableRequest{name} into buf (RTR_TABLE_NAME_MAX + 16 bytes). */
static st_slice pack_drop(const char *name, uint8_t *buf) {
    Strata__Internal__V1__DropTableRequest req;
    strata__internal__v1__drop_table_request__init(&req);
    req.name = (char *)name;
    return st_slice_make(buf, strata__internal__v1__drop_table_request__pack(&req, buf));
}

/* DropTable on every node, not waited for (rollback and DeleteTable's cleanup). */
static void drop_everywhere(rtr_ctx *r, const char *name) {
    uint8_t buf[RTR_TABLE_NAME_MAX + 16];
    st_slice drop = pack_drop(name, buf);
    rtr_fan *f = rtr_fan_new(r, count_nodes(r), RTR_ADMIN_TIMEOUT_MS, free_fan, NULL);
    if (!f)
        return;
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            rtr_fan_call(f, k++, &r->clusters[c].nodes[i], RTR_NODE "DropTable", drop);
    rtr_fan_seal(f);
}

static void rollback_fail(adm_op *op, st_code code, const char *msg) {
    drop_everywhere(op->r, op->name);
    op_finish(op, code, msg);
}

/* Serializes op->table and the PutTableRequest carrying it. */
static st_code pack_schema(adm_op *op) {
    size_t len = google__bigtable__admin__v2__table__get_packed_size(op->table);
    Strata__Internal__V1__PutTableRequest put;
    strata__internal__v1__put_table_request__init(&put);
    put.table = op->table;
    size_t plen = strata__internal__v1__put_table_request__get_packed_size(&put);
    if (st_buf_reserve(&op->table_pb, len) != ST_OK || st_buf_reserve(&op->put_req, plen) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    op->table_pb.len = google__bigtable__admin__v2__table__pack(op->table, op->table_pb.data);
    op->put_req.len = strata__internal__v1__put_table_request__pack(&put, op->put_req.data);
    return ST_OK;
}

/* ---- names and schema checks (the node's rules and messages) ---- */

static int family_cmp(const void *a, const void *b) {
    return strcmp((*(pb_family *const *)a)->key, (*(pb_family *const *)b)->key);
}

/* Families sorted by name, each with a GC rule (empty = keep everything, as the node reports). */
static st_code normalize_families(pb_table *t, st_arena *a, st_err *err) {
    for (size_t i = 0; i < t->n_column_families; i++) {
        pb_family *e = t->column_families[i];
        if (!btu_family_valid(e->key))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid column family name '%s': use 1-64 of [-_.a-zA-Z0-9]",
                              e->key);
        if (!e->value) {
            e->value = st_arena_alloc(a, sizeof *e->value);
            if (!e->value)
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
            google__bigtable__admin__v2__column_family__init(e->value);
        }
        if (!e->value->gc_rule) {
            e->value->gc_rule = st_arena_alloc(a, sizeof *e->value->gc_rule);
            if (!e->value->gc_rule)
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
            google__bigtable__admin__v2__gc_rule__init(e->value->gc_rule);
        }
    }
    if (t->n_column_families > 1)
        qsort(t->column_families, t->n_column_families, sizeof *t->column_families, family_cmp);
    for (size_t i = 1; i < t->n_column_families; i++)
        if (strcmp(t->column_families[i - 1]->key, t->column_families[i]->key) == 0)
            return st_err_set(err, ST_ALREADY_EXISTS, "column family %s already exists",
                              t->column_families[i]->key);
    return ST_OK;
}

/* CreateTable's families: GC rules within Cloud Bigtable's size limit, no aggregate family
 * (btu_family_check). */
static st_code families_check(const pb_table *t, st_err *err) {
    for (size_t i = 0; i < t->n_column_families; i++)
        if (btu_family_check(t->column_families[i]->key, t->column_families[i]->value, err) !=
            ST_OK)
            return err->code;
    return ST_OK;
}

/* Table fields of the upstream API that Strata does not implement, refused at CreateTable rather
 * than dropped: a user asking for automated backups would believe they are made. Fields 14 and
 * 15 are not in Strata's table.proto, so they arrive as unknown fields. */
static st_code table_spec_check(const pb_table *spec, st_err *err) {
    if (!spec)
        return ST_OK;
    if (spec->automated_backup_config_case ==
        GOOGLE__BIGTABLE__ADMIN__V2__TABLE__AUTOMATED_BACKUP_CONFIG_AUTOMATED_BACKUP_POLICY)
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "table.automated_backup_policy: Strata makes no automated backups; "
                          "create the table without it and back it up with CreateBackup (`strata "
                          "backup create`, e.g. from cron)");
    if (btu_pb_has_unknown(&spec->base, 14))
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "table.tiered_storage_config: Strata has no tiered storage; create the "
                          "table without it");
    if (btu_pb_has_unknown(&spec->base, 15))
        return st_err_set(err, ST_UNIMPLEMENTED,
                          "table.row_key_schema: Strata keeps row keys as plain bytes and has no "
                          "structured row key schema; create the table without it");
    return ST_OK;
}

/* A table holding only the schema fields the router keeps. */
static pb_table *schema_new(st_arena *a, const char *name, const pb_table *spec) {
    pb_table *t = st_arena_alloc(a, sizeof *t);
    if (!t)
        return NULL;
    google__bigtable__admin__v2__table__init(t);
    t->name = st_arena_dup(a, name, strlen(name) + 1);
    t->granularity = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__TIMESTAMP_GRANULARITY__MILLIS;
    if (spec) {
        t->column_families = spec->column_families;
        t->n_column_families = spec->n_column_families;
        t->deletion_protection = spec->deletion_protection;
        t->change_stream_config = spec->change_stream_config; /* checked by rtr_cs_config_check */
    }
    return t->name ? t : NULL;
}

/* ---- change stream configuration (docs/changestreams.md) ---- */

/* Whether d is a google.protobuf.Duration as its definition allows: nanos within
 * +-999,999,999 and, with seconds not zero, of the same sign as seconds. */
static bool duration_valid(const Google__Protobuf__Duration *d) {
    if (d->nanos <= -1000000000 || d->nanos >= 1000000000)
        return false;
    return !(d->seconds > 0 && d->nanos < 0) && !(d->seconds < 0 && d->nanos > 0);
}

st_code rtr_cs_config_check(Google__Bigtable__Admin__V2__ChangeStreamConfig **cfg, st_err *err) {
    if (!*cfg || !(*cfg)->retention_period) {
        *cfg = NULL; /* no retention: change streams off */
        return ST_OK;
    }
    const Google__Protobuf__Duration *d = (*cfg)->retention_period;
    if (btu_cs_retention_ok(d))
        return ST_OK;
    /* An invalid Duration has no value to print: seconds.nanos would show another number. */
    if (!duration_valid(d))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "change_stream_config.retention_period {seconds: %lld, nanos: %d} is not "
                          "a valid Duration (nanos must be within +-999,999,999 and of the sign "
                          "of seconds): give the retention as seconds from %lld (1 day) to %lld "
                          "(7 days), nanos 0 to 999,999,999",
                          (long long)d->seconds, (int)d->nanos, (long long)RTR_CS_RETENTION_MIN_S,
                          (long long)RTR_CS_RETENTION_MAX_S);
    bool neg = d->seconds < 0 || d->nanos < 0; /* valid: both of that sign */
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "change_stream_config.retention_period is %s%llu.%09ds: change stream "
                      "retention must be between 1 day (%llds) and 7 days (%llds); leave "
                      "change_stream_config unset to turn change streams off",
                      neg ? "-" : "",
                      d->seconds < 0 ? 0ULL - (unsigned long long)d->seconds
                                     : (unsigned long long)d->seconds,
                      (int)(d->nanos < 0 ? -d->nanos : d->nanos), (long long)RTR_CS_RETENTION_MIN_S,
                      (long long)RTR_CS_RETENTION_MAX_S);
}

bool rtr_cs_enabled(const Google__Bigtable__Admin__V2__Table *t) {
    return t->change_stream_config && t->change_stream_config->retention_period;
}

/* ---- schema push: PutTable on the first node (it validates GC rules), then on all others ---- */

static void schema_pushed(adm_op *op);

static void restore_done(rtr_fan *f, void *arg) {
    (void)arg;
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].code != ST_OK)
            st_log(ST_LOG_WARN, "router",
                   "PutTable restoring a table's previous schema on %s "
                   "failed: %s",
                   f->res[i].node ? f->res[i].node->addr : "?", f->res[i].err.msg);
    rtr_fan_free(f);
}

/* UpdateTable reached only some nodes: the record still holds the previous table, so the nodes
 * that took the change get the previous table back (best effort, not waited for). */
static void restore_schema(adm_op *op) {
    rtr_ctx *r = op->r;
    rtr_fan *f = rtr_fan_new(r, count_nodes(r), RTR_ADMIN_TIMEOUT_MS, restore_done, NULL);
    if (!f)
        return;
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            rtr_fan_call(f, k++, &r->clusters[c].nodes[i], RTR_NODE "PutTable",
                         st_buf_slice(&op->old_put));
    rtr_fan_seal(f);
}

static void put_rest_done(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    st_err err = {0};
    st_code rc = rtr_fan_first_error(f, &err);
    rtr_fan_free(f);
    if (rc != ST_OK) {
        if (op->update && op->old_put.len)
            restore_schema(op);
        op_finish(op, rc, err.msg);
        return;
    } /* the record still says the old schema */
    schema_pushed(op);
}

/* Frees f; false when one of its calls failed, after finishing op with that failure (its
 * message after `before`, when given). */
static bool fan_ok(rtr_fan *f, adm_op *op, const char *before) {
    st_err err = {0};
    st_code rc = rtr_fan_first_error(f, &err);
    rtr_fan_free(f);
    if (rc == ST_OK)
        return true;
    if (before)
        st_err_prefix(&err, "%s", before);
    op_finish(op, rc, err.msg);
    return false;
}

static void put_probe_done(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    if (fan_ok(f, op, NULL))
        fan_nodes(op, RTR_NODE "PutTable", st_buf_slice(&op->put_req), true, put_rest_done);
}

static void put_probe(adm_op *op) {
    rtr_fan *f = rtr_fan_new(op->r, 1, RTR_ADMIN_TIMEOUT_MS, put_probe_done, op);
    if (!f) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_fan_call(f, 0, &op->r->clusters[0].nodes[0], RTR_NODE "PutTable",
                 st_buf_slice(&op->put_req));
    rtr_fan_seal(f);
}

/* What a schema change that stopped before any node took it says before the node's error. */
#define NO_NODE_CHANGED "the change was made on no node (retry once every node is back): "

static void reach_done(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    if (fan_ok(f, op, NO_NODE_CHANGED))
        put_probe(op);
}

/* False after finishing op: out of memory, or a record the metadata would refuse, checked before
 * any node is changed (rtr_meta_write checks it again, after the nodes). */
static bool schema_packed(adm_op *op) {
    st_err err = {0};
    if (pack_schema(op) != ST_OK)
        st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory");
    else if (rtr_meta_record_check(RTR_META_KIND_TABLE, op->name, op->table_pb.len, &err) == ST_OK)
        return true;
    op_finish(op, err.code, err.msg);
    return false;
}

/* Every node answers GetStatus before the schema goes out, so a node already down fails the
 * change before any node took it. Taken by some nodes only, a change the record does not hold
 * would stay done there: turning streams off deletes a node's history, dropping a family its
 * cells, while the record and the other nodes keep the old schema. A node that dies between the
 * two rounds can still leave it half done. */
static void push_schema(adm_op *op) {
    if (schema_packed(op))
        fan_nodes(op, RTR_NODE "GetStatus", st_slice_make("", 0), false, reach_done);
}

/* ---- CreateTable ---- */

static void create_refreshed(void *arg) {
    op_finish(arg, ST_OK, NULL);
}

static void create_recorded(void *arg, st_code code, const char *msg) {
    adm_op *op = arg;
    if (code != ST_OK) {
        rollback_fail(op, code, msg);
        return;
    }
    st_log(ST_LOG_INFO, "router", "created table=%s tablets_per_cluster=%zu", op->name,
           op->n_splits + 1);
    /* Learn the new tablets now, so the first data request needs no refresh. */
    if (rtr_refresh_all(op->r, create_refreshed, op) != ST_OK)
        op_finish(op, ST_OK, NULL);
}

static void create_tablets(adm_op *op);

static void tablets_done(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    st_err err = {0};
    st_code rc = ST_OK;
    for (size_t i = 0; i < f->n && rc == ST_OK; i++)
        if (f->res[i].code != ST_OK && f->res[i].code != ST_ALREADY_EXISTS) {
            rc = f->res[i].code;
            err = f->res[i].err;
        }
    rtr_fan_free(f);
    if (rc != ST_OK) {
        rollback_fail(op, rc, err.msg);
        return;
    }
    if (op->tablets_from < op->n_splits + 1) {
        create_tablets(op);
        return;
    }
    st_slice pb = st_buf_slice(&op->table_pb);
    rtr_meta_write(op->r, RTR_META_KIND_TABLE, op->name, &pb, create_recorded, op);
}

/* One CreateTablet per split interval per cluster, round robin over the cluster's nodes, at most
 * RTR_CREATE_TABLETS_BATCH intervals at a time: a node creates a tablet on its loop (files,
 * fsync), so hundreds sent at once kept it from answering anything else, the router's keepalive
 * PINGs included, for seconds (the router then dropped the connection and every call on it). */
static void create_tablets(adm_op *op) {
    rtr_ctx *r = op->r;
    size_t from = op->tablets_from, per = op->n_splits + 1 - from;
    if (per > RTR_CREATE_TABLETS_BATCH)
        per = RTR_CREATE_TABLETS_BATCH;
    op->tablets_from = from + per;
    rtr_fan *f = rtr_fan_new(r, per * r->n_clusters, RTR_ADMIN_TIMEOUT_MS, tablets_done, op);
    if (!f) {
        rollback_fail(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = op->name;
    uint8_t *buf = st_arena_alloc(rpc_call_arena(op->call), 2 * BTU_ROW_KEY_MAX + 1024);
    for (size_t c = 0; buf && c < r->n_clusters; c++) {
        rtr_cluster *cl = &r->clusters[c];
        for (size_t i = 0; i < per; i++) {
            size_t k = from + i; /* interval k: [splits[k-1], splits[k]) */
            req.start_key = k ? op->splits[k - 1] : (ProtobufCBinaryData){0, NULL};
            req.end_key = k < op->n_splits ? op->splits[k] : (ProtobufCBinaryData){0, NULL};
            size_t len = strata__internal__v1__create_tablet_request__pack(&req, buf);
            rtr_node *n = &cl->nodes[cl->rr_next++ % cl->n_nodes];
            rtr_fan_call(f, c * per + i, n, RTR_NODE "CreateTablet", st_slice_make(buf, len));
        }
    }
    rtr_fan_seal(f);
}

/* The nodes already have the new schema: a failed record write leaves them ahead of the record
 * until the next ModifyColumnFamilies (logged). */
static void modify_recorded(void *arg, st_code code, const char *msg) {
    adm_op *op = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "table=%s schema pushed but not recorded: %s", op->name, msg);
    if (code == ST_OK && op->next) { /* the drops are done: now the call's whole change */
        op->table = op->next;
        op->next = NULL;
        push_schema(op);
        return;
    }
    op_finish(op, code, msg);
}

static void schema_pushed(adm_op *op) {
    if (op->create) {
        create_tablets(op);
        return;
    }
    /* A DeleteTable that ran meanwhile (the nodes may take long to drop a family's cells) removed
     * the record: writing it now would bring back a table without tablets. */
    if (!rtr_meta_find(&op->r->meta, RTR_META_KIND_TABLE, op->name)) {
        op_finish(op, ST_NOT_FOUND, "the table was deleted while its schema changed");
        return;
    }
    st_slice pb = st_buf_slice(&op->table_pb);
    rtr_meta_write(op->r, RTR_META_KIND_TABLE, op->name, &pb, modify_recorded, op);
}

/* Every node answered the DropTable round: the schema goes out without push_schema's GetStatus
 * round, which would only ask them again. */
static void leftovers_dropped(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    if (fan_ok(f, op, NO_NODE_CHANGED) && schema_packed(op))
        put_probe(op);
}

/* The table id is claimed against a RestoreTable or CreateTable of it through another router
 * (rtr_bk_reserve_table): only then are tablets made, after DropTable of the name on every node.
 * The claim makes whatever a node holds under the name a leftover: the tablets (rows and change
 * history) a DeleteTable could not drop on a node that was down, which the new table would
 * otherwise take over there. */
static void create_reserved(void *arg, st_code code, const char *msg) {
    adm_op *op = arg;
    if (code != ST_OK) {
        char why[RTR_TABLE_NAME_MAX + 160];
        snprintf(why, sizeof why,
                 "table \"%s\" already exists, or is being created or restored through another "
                 "router: use another table id",
                 op->name);
        op_finish(op, code, code == ST_ALREADY_EXISTS ? why : msg);
        return;
    }
    op->claimed = true;
    uint8_t buf[RTR_TABLE_NAME_MAX + 16];
    fan_nodes(op, RTR_NODE "DropTable", pack_drop(op->name, buf), false, leftovers_dropped);
}

static const char *create_check(rtr_ctx *r,
                                const Google__Bigtable__Admin__V2__CreateTableRequest *req,
                                char *name, size_t cap, st_err *err) {
    snprintf(name, cap, "%s/tables/%s", req->parent, req->table_id);
    if (rtr_check_instance(&r->topo, req->parent, false, err) != ST_OK)
        return NULL;
    if (!btu_table_id_valid(req->table_id)) {
        st_err_set(err, ST_INVALID_ARGUMENT,
                   "invalid table id '%s': use 1-%d of [-_.a-zA-Z0-9], not starting with - or .",
                   req->table_id, BTU_TABLE_ID_MAX);
        return NULL;
    }
    if (rtr_check_table_name(r, name, err) != ST_OK)
        return NULL;
    /* Tables keep millisecond timestamps; a number the enum does not name is refused, as the
     * other enums of the API are, rather than stored as MILLIS without a word. */
    int g = req->table ? (int)req->table->granularity : 0;
    if (g !=
            GOOGLE__BIGTABLE__ADMIN__V2__TABLE__TIMESTAMP_GRANULARITY__TIMESTAMP_GRANULARITY_UNSPECIFIED &&
        g != GOOGLE__BIGTABLE__ADMIN__V2__TABLE__TIMESTAMP_GRANULARITY__MILLIS) {
        st_err_set(err, ST_INVALID_ARGUMENT,
                   "table.granularity %d is not a Table.TimestampGranularity: send MILLIS (1) or "
                   "leave it unset",
                   g);
        return NULL;
    }
    if (rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, name) || strcmp(name, RTR_META_TABLE) == 0) {
        st_err_set(err, ST_ALREADY_EXISTS, "table \"%s\" already exists", name);
        return NULL;
    }
    return name;
}

void rtr_h_create_table(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__CreateTableRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__create_table_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err = {0};
    char name[RTR_TABLE_NAME_MAX + 64];
    st_arena *a = rpc_call_arena(call);
    ProtobufCBinaryData *splits = NULL;
    size_t n_splits = 0;
    pb_table *t = NULL;
    if (!create_check(r, req, name, sizeof name, &err) ||
        table_spec_check(req->table, &err) != ST_OK ||
        btu_splits_from_pb(req, RTR_SPLITS_MAX, a, &splits, &n_splits, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    btu_pb_drop_unknown(&req->base); /* checked above; the schema stored keeps none */
    if (!(t = schema_new(a, name, req->table))) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (rtr_cs_config_check(&t->change_stream_config, &err) != ST_OK ||
        normalize_families(t, a, &err) != ST_OK || families_check(t, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    adm_op *op = op_new(r, call, name);
    if (!op)
        return;
    op->table = t;
    op->create = true;
    op->splits = splits;
    op->n_splits = n_splits;
    op->reply = &t->base;
    if (!rtr_bk_create_token(r, op->claim, sizeof op->claim)) {
        op->claim[0] = '\0';
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rtr_bk_reserve_table(r, name, op->claim, create_reserved, op);
}

/* ---- GetTable, ListTables ---- */

/* What a Table.View shows (table.proto): NAME_ONLY the name; SCHEMA_VIEW (GetTable's default)
 * the stored record (families, granularity, deletion_protection, change_stream_config: the Go
 * client reads the last two from it); REPLICATION_VIEW the name and cluster_states;
 * ENCRYPTION_VIEW the name and cluster_states with their encryption_info; FULL all of it.
 * ListTables' default is NAME_ONLY. A view number the enum does not name (STATS_VIEW of other
 * API versions included: no statistics are kept) is INVALID_ARGUMENT (valid false); it was
 * answered as SCHEMA_VIEW by GetTable and as NAME_ONLY by ListTables. */
typedef struct view_parts {
    bool record, states, encryption, valid;
} view_parts;

static view_parts view_of(Google__Bigtable__Admin__V2__Table__View v, bool list) {
    switch (v) {
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY:
        return (view_parts){false, false, false, true};
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__VIEW_UNSPECIFIED:
        return (view_parts){!list, false, false, true};
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__SCHEMA_VIEW:
        return (view_parts){true, false, false, true};
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__REPLICATION_VIEW:
        return (view_parts){false, true, false, true};
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__ENCRYPTION_VIEW:
        return (view_parts){false, true, true, true};
    case GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__FULL:
        return (view_parts){true, true, true, true};
    default:
        return (view_parts){false, false, false, false};
    }
}

/* The table of rec as view shows it, in the call's arena; NULL after failing the call. */
static pb_table *table_view(rtr_ctx *r, rpc_call *call, const rtr_meta_rec *rec, view_parts view) {
    st_arena *a = rpc_call_arena(call);
    if (!view.valid) {
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "view is not a Table.View this server knows: use NAME_ONLY (1), SCHEMA_VIEW (2), "
                 "REPLICATION_VIEW (3), FULL (4) or ENCRYPTION_VIEW (5)");
        return NULL;
    }
    pb_table *t = view.record ? unpack_table(call, rec) : schema_new(a, rec->name, NULL);
    if (!t) {
        if (!view.record) /* unpack_table finished the call */
            rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (!view.record)
        t->granularity = 0; /* not a field of these views */
    if (view.states && rtr_bk_cluster_states(r, t, a, view.encryption) != ST_OK) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    return t;
}

void rtr_h_get_table(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GetTableRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__get_table_request__descriptor, req_bytes);
    if (!req)
        return;
    const rtr_meta_rec *rec = rtr_table_or_fail(r, call, req->name);
    pb_table *t = rec ? table_view(r, call, rec, view_of(req->view, false)) : NULL;
    if (t)
        rtr_reply(call, &t->base);
}

/* ListTables pages (rtr_page_token_make): "t1", a CRC32C of the parent, and the last table name
 * of the previous page; the next page starts after it (table records are kept sorted by name),
 * so tables made or deleted between pages shift nothing. */
#define TABLES_TOKEN_PREFIX "t1"

static st_code tables_page(st_arena *a, const Google__Bigtable__Admin__V2__ListTablesRequest *req,
                           size_t plen, const char **after, st_err *err) {
    if (req->page_size < 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "page_size must not be negative (0 lists every table)");
    return rtr_page_token_after(a, req->page_token, TABLES_TOKEN_PREFIX,
                                st_crc32c(0, req->parent, plen), after, err);
}

void rtr_h_list_tables(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ListTablesRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__list_tables_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err = {0};
    if (rtr_check_instance(&r->topo, req->parent, false, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_arena *a = rpc_call_arena(call);
    Google__Bigtable__Admin__V2__ListTablesResponse resp;
    google__bigtable__admin__v2__list_tables_response__init(&resp);
    resp.tables = st_arena_alloc(a, (r->meta.n_tables + 1) * sizeof *resp.tables);
    if (!resp.tables) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t plen = strlen(req->parent);
    const char *after = NULL;
    if (tables_page(a, req, plen, &after, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    view_parts view = view_of(req->view, true);
    for (size_t i = 0; i < r->meta.n_tables; i++) {
        const rtr_meta_rec *rec = &r->meta.tables[i];
        if (strncmp(rec->name, req->parent, plen) != 0 ||
            strncmp(rec->name + plen, "/tables/", 8) || (after && strcmp(rec->name, after) <= 0))
            continue;
        if (req->page_size > 0 && resp.n_tables == (size_t)req->page_size) {
            /* more follow: the token names the last table of this page (records are sorted) */
            resp.next_page_token =
                rtr_page_token_make(a, TABLES_TOKEN_PREFIX, st_crc32c(0, req->parent, plen),
                                    st_slice_cstr(resp.tables[resp.n_tables - 1]->name));
            if (!resp.next_page_token) {
                rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
                return;
            }
            break;
        }
        pb_table *t = table_view(r, call, rec, view);
        if (!t)
            return;
        resp.tables[resp.n_tables++] = t;
    }
    rtr_reply(call, &resp.base);
}

/* ---- DeleteTable ---- */

static void delete_recorded(void *arg, st_code code, const char *msg) {
    adm_op *op = arg;
    if (code == ST_OK) {
        drop_everywhere(op->r, op->name);
        rtr_iam_forget(op->r, op->name); /* a table made later under this name starts afresh */
        st_log(ST_LOG_INFO, "router", "deleted table=%s", op->name);
    }
    op_finish(op, code, msg);
}

/* The op of a schema change holding the table's gate, or NULL (answered). */
static adm_op *gated_op(rtr_ctx *r, rpc_call *call, const char *name) {
    adm_op *op = op_new(r, call, name);
    if (op)
        op->gated = true;
    return op;
}

static bool delete_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__DeleteTableRequest *req) {
    const rtr_meta_rec *rec = rtr_table_or_fail(r, call, req->name);
    pb_table *t = rec ? unpack_table(call, rec) : NULL;
    if (!t)
        return false;
    if (t->deletion_protection) {
        rtr_fail(call, ST_FAILED_PRECONDITION,
                 "table %s has deletion protection; turn it off before deleting", req->name);
        return false;
    }
    adm_op *op = gated_op(r, call, req->name);
    if (!op)
        return false;
    Google__Protobuf__Empty *empty = st_arena_alloc(rpc_call_arena(call), sizeof *empty);
    if (!empty) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return true;
    }
    google__protobuf__empty__init(empty);
    op->reply = &empty->base;
    rtr_meta_write(r, RTR_META_KIND_TABLE, op->name, NULL, delete_recorded, op);
    return true;
}

void rtr_h_delete_table(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__DeleteTableRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__delete_table_request__descriptor, req_bytes);
    if (!req)
        rtr_gate_leave(r, call); /* answered: the gate goes on if it was this call's turn */
    else if (rtr_gate_enter(r, req->name, call, req_bytes, rtr_h_delete_table) &&
             !delete_start(r, call, req))
        rtr_gate_leave(r, call);
}

/* ---- ModifyColumnFamilies ---- */

typedef Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification pb_mod;

static long family_index(const pb_table *t, const char *id) {
    for (size_t i = 0; i < t->n_column_families; i++)
        if (strcmp(t->column_families[i]->key, id) == 0)
            return (long)i;
    return -1;
}

static st_code family_add(pb_table *t, const char *id,
                          Google__Bigtable__Admin__V2__ColumnFamily *cf, st_arena *a) {
    pb_family **v = st_arena_alloc(a, (t->n_column_families + 1) * sizeof *v);
    pb_family *e = st_arena_alloc(a, sizeof *e);
    if (!v || !e)
        return ST_RESOURCE_EXHAUSTED;
    google__bigtable__admin__v2__table__column_families_entry__init(e);
    e->key = (char *)id;
    e->value = cf;
    if (t->n_column_families)
        memcpy(v, t->column_families, t->n_column_families * sizeof *v);
    v[t->n_column_families++] = e;
    t->column_families = v;
    return ST_OK;
}

/* An update of family e: its gc_rule, the one field a family update changes (Cloud Bigtable
 * treats a missing or empty update_mask so). A mask naming value_type is
 * UNIMPLEMENTED (value types are not stored, btu_family_check), any other path INVALID_ARGUMENT;
 * fields of the message besides gc_rule are not stored. */
static st_code update_family(Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *e,
                             const pb_mod *m, st_arena *a, st_err *err) {
    for (size_t i = 0; m->update_mask && i < m->update_mask->n_paths; i++) {
        const char *p = m->update_mask->paths[i];
        if (!strcmp(p, "value_type"))
            return st_err_set(err, ST_UNIMPLEMENTED,
                              "column family %s: update_mask names value_type, but Strata does "
                              "not store column family value types (aggregate or not): update "
                              "gc_rule only",
                              m->id);
        if (strcmp(p, "gc_rule") != 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "column family %s: incorrect path '%s' in update_mask (a family "
                              "update changes gc_rule)",
                              m->id, p);
    }
    Google__Bigtable__Admin__V2__GcRule *rule = m->update ? m->update->gc_rule : NULL;
    if (btu_gc_rule_size_check(m->id, rule, err) != ST_OK)
        return err->code;
    Google__Bigtable__Admin__V2__ColumnFamily *cf = st_arena_alloc(a, sizeof *cf);
    if (!cf)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    google__bigtable__admin__v2__column_family__init(cf);
    cf->gc_rule = rule; /* the rule alone: what else the message holds is not stored */
    e->value = cf;
    return ST_OK;
}

/* Applies one modification to t, as the node does: create (ALREADY_EXISTS if present), update and
 * drop (NOT_FOUND if absent). */
static st_code apply_mod(pb_table *t, const pb_mod *m, st_arena *a, st_err *err) {
    long at = family_index(t, m->id);
    switch (m->mod_case) {
    case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE:
        if (!btu_family_valid(m->id))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid column family name '%s': use 1-64 of [-_.a-zA-Z0-9]", m->id);
        if (btu_family_check(m->id, m->create, err) != ST_OK)
            return err->code;
        if (at >= 0)
            return st_err_set(err, ST_ALREADY_EXISTS, "column family %s already exists", m->id);
        return family_add(t, m->id, m->create, a) == ST_OK
                   ? ST_OK
                   : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_UPDATE:
        if (at < 0)
            return st_err_set(err, ST_NOT_FOUND, "column family %s not found", m->id);
        return update_family(t->column_families[at], m, a, err);
    case GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP:
        if (!btu_mod_drops(m))
            return ST_OK;
        if (at < 0)
            return st_err_set(err, ST_NOT_FOUND, "column family %s not found", m->id);
        memmove(&t->column_families[at], &t->column_families[at + 1],
                (t->n_column_families - (size_t)at - 1) * sizeof *t->column_families);
        t->n_column_families--;
        return ST_OK;
    default:
        return st_err_set(err, ST_INVALID_ARGUMENT, "modification of %s has no action", m->id);
    }
}

/* ---- a family drop waits for replication (docs/cluster.md, "Dropping a family") ----
 * A write acknowledged in one cluster before the drop may still be on its way to another. Arriving
 * there after that cluster purged the family, it would survive the drop and show again once the
 * family is created again. So every node's consistency token (its writes so far, replicated to
 * every peer) is taken, and the schema goes out once all of them are reached. */

static void sync_check(void *arg);

/* The fan's CheckConsistency answers: the first failed call's code, else whether every node said
 * consistent (INTERNAL for an unreadable answer). */
static st_code fan_consistent(rtr_fan *f, bool *consistent, st_err *err) {
    st_code rc = rtr_fan_first_error(f, err);
    *consistent = true;
    for (size_t i = 0; rc == ST_OK && i < f->n; i++) {
        size_t off = 0;
        st_slice msg;
        Google__Bigtable__Admin__V2__CheckConsistencyResponse *m = NULL;
        if (rtr_fan_next_msg(&f->res[i], &off, &msg))
            m = (void *)btu_pb_unpack(
                &google__bigtable__admin__v2__check_consistency_response__descriptor, NULL, msg,
                NULL);
        if (!m)
            return st_err_set(err, ST_INTERNAL, "a node sent an unreadable consistency answer");
        *consistent = *consistent && m->consistent;
        google__bigtable__admin__v2__check_consistency_response__free_unpacked(m, NULL);
    }
    return rc;
}

static void sync_checked(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    st_err err = {0};
    bool all;
    st_code rc = fan_consistent(f, &all, &err);
    rtr_fan_free(f);
    if (rc != ST_OK) {
        st_err_prefix(&err, "waiting for replication before dropping column families: ");
        op_finish(op, rc, err.msg);
        return;
    }
    if (all)
        push_schema(op);
    else if (++op->sync_rounds >= RTR_DROP_SYNC_ROUNDS)
        op_finish(op, ST_UNAVAILABLE,
                  "replication between the clusters has not caught up, so the column families "
                  "were not dropped (their cells could come back from another cluster); retry");
    else if (rtr_later_add(op->r, RTR_DROP_SYNC_MS, sync_check, op) != ST_OK)
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
}

static void sync_check(void *arg) {
    adm_op *op = arg;
    size_t n = count_nodes(op->r);
    rtr_fan *f = rtr_fan_new(op->r, n, RTR_ADMIN_TIMEOUT_MS, sync_checked, op);
    if (!f) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st_arena *a = rpc_call_arena(op->call);
    Google__Bigtable__Admin__V2__CheckConsistencyRequest req;
    google__bigtable__admin__v2__check_consistency_request__init(&req);
    req.name = op->name;
    for (size_t k = 0; k < n; k++) {
        req.consistency_token = op->tokens[k];
        size_t len = google__bigtable__admin__v2__check_consistency_request__get_packed_size(&req);
        uint8_t *buf = st_arena_alloc(a, len ? len : 1);
        if (!buf) {
            f->res[k].code = st_err_set(&f->res[k].err, ST_RESOURCE_EXHAUSTED, "out of memory");
            continue;
        }
        google__bigtable__admin__v2__check_consistency_request__pack(&req, buf);
        rtr_fan_call(f, k, rtr_node_at(op->r, k), RTR_TA "CheckConsistency",
                     st_slice_make(buf, len));
    }
    rtr_fan_seal(f);
}

static void sync_tokens(rtr_fan *f, void *arg) {
    adm_op *op = arg;
    st_arena *a = rpc_call_arena(op->call);
    op->tokens = st_arena_alloc(a, (f->n ? f->n : 1) * sizeof *op->tokens);
    for (size_t i = 0; op->tokens && i < f->n && f->res[i].code == ST_OK; i++) {
        size_t off = 0;
        st_slice msg;
        Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse *m = NULL;
        if (rtr_fan_next_msg(&f->res[i], &off, &msg))
            m = (void *)btu_pb_unpack(
                &google__bigtable__admin__v2__generate_consistency_token_response__descriptor, NULL,
                msg, NULL);
        op->tokens[i] =
            m ? st_arena_dup(a, m->consistency_token, strlen(m->consistency_token) + 1) : NULL;
        if (m)
            google__bigtable__admin__v2__generate_consistency_token_response__free_unpacked(m,
                                                                                            NULL);
        if (!op->tokens[i])
            f->res[i].code = st_err_set(&f->res[i].err, ST_INTERNAL,
                                        "a node sent no readable consistency token");
    }
    if (!op->tokens && f->n)
        f->res[0].code = st_err_set(&f->res[0].err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (fan_ok(f, op, "waiting for replication before dropping column families: "))
        sync_check(op);
}

/* push_schema, after replication caught up when the call drops a family of a replicated table. */
static void drop_sync(adm_op *op, bool drops) {
    if (!drops || op->r->n_clusters < 2) {
        push_schema(op);
        return;
    }
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenRequest req;
    google__bigtable__admin__v2__generate_consistency_token_request__init(&req);
    req.name = op->name;
    size_t len =
        google__bigtable__admin__v2__generate_consistency_token_request__get_packed_size(&req);
    uint8_t *buf = st_arena_alloc(rpc_call_arena(op->call), len ? len : 1);
    if (!buf) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    google__bigtable__admin__v2__generate_consistency_token_request__pack(&req, buf);
    fan_nodes(op, RTR_TA "GenerateConsistencyToken", st_slice_make(buf, len), false, sync_tokens);
}

static bool dropped_in(const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req,
                       const char *id) {
    for (size_t i = 0; i < req->n_modifications; i++)
        if (btu_mod_drops(req->modifications[i]) && strcmp(req->modifications[i]->id, id) == 0)
            return true;
    return false;
}

/* A family the call drops and creates again must lose its cells, but the schema before and the
 * one after both hold it, so the nodes would see no drop. Returns the schema before without such
 * families (the nodes purge them, then take the final schema), or NULL when there are none. */
static pb_table *drops_first(pb_table *t, const pb_table *after,
                             const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req) {
    size_t kept = 0;
    for (size_t i = 0; i < t->n_column_families; i++) {
        const char *id = t->column_families[i]->key;
        if (!dropped_in(req, id) || family_index(after, id) < 0)
            t->column_families[kept++] = t->column_families[i];
    }
    bool any = kept < t->n_column_families;
    t->n_column_families = kept;
    return any ? t : NULL;
}

static bool modify_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req) {
    const rtr_meta_rec *rec = rtr_table_or_fail(r, call, req->name);
    pb_table *t = rec ? unpack_table(call, rec) : NULL;
    pb_table *before = rec ? unpack_table(call, rec) : NULL;
    if (!t || !before)
        return false;
    st_arena *a = rpc_call_arena(call);
    st_err err = {0};
    if (btu_drop_protection_check(req->name, t->deletion_protection, req, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    for (size_t i = 0; i < req->n_modifications; i++)
        if (apply_mod(t, req->modifications[i], a, &err) != ST_OK) {
            rtr_fail(call, err.code, "%s", err.msg);
            return false;
        }
    if (normalize_families(t, a, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    adm_op *op = gated_op(r, call, req->name);
    if (!op)
        return false;
    bool drops = false; /* the call drops a family the table has */
    for (size_t i = 0; i < before->n_column_families; i++)
        drops = drops || dropped_in(req, before->column_families[i]->key);
    op->table = drops_first(before, t, req);
    op->next = op->table ? t : NULL;
    if (!op->table)
        op->table = t;
    op->reply = &t->base;
    drop_sync(op, drops);
    return true;
}

void rtr_h_modify_column_families(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__modify_column_families_request__descriptor, req_bytes);
    btu_pb_drop_unknown(req ? &req->base : NULL); /* nothing stored carries what no field reads */
    if (!req)
        rtr_gate_leave(r, call); /* answered: the gate goes on if it was this call's turn */
    else if (rtr_gate_enter(r, req->name, call, req_bytes, rtr_h_modify_column_families) &&
             !modify_start(r, call, req))
        rtr_gate_leave(r, call);
}

/* ---- UpdateTable: change streams and deletion protection ---- */

/* The answer: a finished Operation (metadata UpdateTableMetadata, response the Table), kept for
 * google.longrunning.Operations like UpdateAppProfile's. */
static void reply_update_op(adm_op *op) {
    rtr_inst *in = rtr_inst_of(op->r);
    char name[RTR_OP_NAME_MAX + 1];
    rtr_ops_name(in->ops, op->name, name);
    Google__Protobuf__Timestamp start, end;
    btu_cs_time_set(&start, op->start_us);
    btu_cs_time_set(&end, st_wall_us());
    Google__Bigtable__Admin__V2__UpdateTableMetadata meta;
    google__bigtable__admin__v2__update_table_metadata__init(&meta);
    meta.name = op->name;
    meta.start_time = &start;
    meta.end_time = &end;
    uint8_t mbuf[RTR_TABLE_NAME_MAX + 64];
    size_t mlen = google__bigtable__admin__v2__update_table_metadata__pack(&meta, mbuf);
    st_buf out;
    st_buf_init(&out);
    st_code rc = rtr_op_pack_done(
        name, RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.UpdateTableMetadata",
        st_slice_make(mbuf, mlen), RTR_TYPE_URL_PREFIX "google.bigtable.admin.v2.Table",
        st_buf_slice(&op->table_pb), &out);
    if (rc == ST_OK && rtr_ops_put(in->ops, name, st_buf_slice(&out)) != ST_OK)
        st_log(ST_LOG_WARN, "router", "could not keep operation %s: out of memory", name);
    if (rc == ST_OK) {
        rc = rpc_call_send(op->call, st_buf_slice(&out));
        rpc_call_finish(op->call, rc, rc == ST_OK ? NULL : "could not send the response");
    } else {
        rpc_call_finish(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
    st_buf_free(&out);
}

#define UPDATE_PATHS                                                                               \
    "change_stream_config, change_stream_config.retention_period, deletion_protection"

/* Applies the update mask: t takes src's values for the paths named. INVALID_ARGUMENT for an
 * empty mask, a path UpdateTable does not change, or a retention outside 1-7 days. */
static st_code update_apply(pb_table *t, const pb_table *src, const Google__Protobuf__FieldMask *m,
                            st_err *err) {
    if (!m || m->n_paths == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "update_mask is empty: name the fields to change (" UPDATE_PATHS ")");
    char bad[512] = "";
    for (size_t i = 0; i < m->n_paths; i++) {
        const char *p = m->paths[i];
        if (strcmp(p, "change_stream_config") == 0 ||
            strcmp(p, "change_stream_config.retention_period") == 0) {
            t->change_stream_config = src->change_stream_config;
            if (rtr_cs_config_check(&t->change_stream_config, err) != ST_OK)
                return err->code;
        } else if (strcmp(p, "deletion_protection") == 0) {
            t->deletion_protection = src->deletion_protection;
        } else {
            size_t l = strlen(bad);
            snprintf(bad + l, sizeof bad - l, "%s\"%s\"", l ? ", " : "", p);
        }
    }
    if (bad[0])
        return st_err_set(
            err, ST_INVALID_ARGUMENT,
            "update_mask path(s) %s cannot be changed by UpdateTable: it changes " UPDATE_PATHS
            " (column families: ModifyColumnFamilies)",
            bad);
    return ST_OK;
}

/* UpdateTable: the new table goes to every node of every cluster (PutTable, as
 * ModifyColumnFamilies), then to the metadata record; the answer is a finished Operation. */
static bool update_start(rtr_ctx *r, rpc_call *call,
                         const Google__Bigtable__Admin__V2__UpdateTableRequest *req) {
    int64_t start_us = st_wall_us();
    const rtr_meta_rec *rec = rtr_table_or_fail(r, call, req->table->name);
    pb_table *t = rec ? unpack_table(call, rec) : NULL;
    if (!t)
        return false;
    st_err err = {0};
    if (update_apply(t, req->table, req->update_mask, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return false;
    }
    adm_op *op = gated_op(r, call, req->table->name);
    if (!op)
        return false;
    /* PutTableRequest{table = 1}: the stored bytes as they are. */
    if (rtr_wire_put_bytes(&op->old_put, 1, st_slice_make(rec->pb, rec->len)) != ST_OK) {
        op_finish(op, ST_RESOURCE_EXHAUSTED, "out of memory");
        return true;
    }
    op->table = t;
    op->update = true;
    op->start_us = start_us;
    push_schema(op);
    return true;
}

void rtr_h_update_table(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__UpdateTableRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__update_table_request__descriptor, req_bytes);
    btu_pb_drop_unknown(req ? &req->base : NULL); /* nothing stored carries what no field reads */
    if (!req || !req->table) {
        if (req)
            rtr_fail(call, ST_INVALID_ARGUMENT, "table must be set, with its name");
        rtr_gate_leave(r, call); /* answered: the gate goes on if it was this call's turn */
        return;
    }
    if (rtr_gate_enter(r, req->table->name, call, req_bytes, rtr_h_update_table) &&
        !update_start(r, call, req))
        rtr_gate_leave(r, call);
}

/* ---- DropRowRange: every node holding tablets of the table, in every cluster ----
 * With change streams on, only the cluster of the default app profile (the cluster that accepts
 * the call) drops the rows: its nodes delete them one row at a time and replication carries each
 * delete to the other clusters, so every cluster's stream records a dropped row once, with that
 * cluster as its source, as for a DeleteFromRow sent there (docs/changestreams.md). */

/* A tablet that moves while the nodes drop takes its rows to a node that may have been asked
 * before they arrived (or not at all): after the nodes answered, the maps are refreshed, and when
 * the table's tablets are no longer those the drop was sent to (or one is moving), the drop is
 * sent again to the nodes holding them now, at most DROP_ROUNDS_MAX times. A tablet kept from an
 * earlier map because its node did not answer the refresh (`stale`) counts as moving: that node
 * may have started a move since, whose copy would keep the rows, so the drop is not answered OK
 * on its word. A write acknowledged
 * before the call was made is older than every node's delete; one made after it returned is
 * newer; those made meanwhile may go either way. */
#define DROP_ROUNDS_MAX 8
#define DROP_MOVING_WAIT_MS 100

typedef struct drop_op {
    rtr_ctx *r;
    rpc_call *call;
    st_slice req;
    char name[RTR_TABLE_NAME_MAX + 1];
    const rtr_cluster *only; /* the one cluster asked, or NULL for every cluster */
    uint64_t sent_to;        /* drop_tablets of the maps the last round was sent by */
    int round;
} drop_op;

/* A digest of the table's tablets (id and node) in the clusters asked; *moving when one of them
 * is being moved or was not confirmed by its node in the last refresh. */
static uint64_t drop_tablets(const drop_op *op, bool *moving) {
    const rtr_ctx *r = op->r;
    uint64_t h = 1469598103934665603ULL;
    *moving = false;
    for (size_t c = 0; c < r->n_clusters; c++) {
        if (op->only && op->only != &r->clusters[c])
            continue;
        const rtr_tmap_table *t = rtr_tmap_find(r->clusters[c].map, op->name);
        for (size_t i = 0; t && i < t->n; i++) {
            h = (h ^ t->v[i].id) * 1099511628211ULL;
            h = (h ^ (c << 32 | t->v[i].node)) * 1099511628211ULL;
            *moving |= t->v[i].moving || t->v[i].stale;
        }
    }
    return h;
}

static void drop_send(void *arg);

/* Fresh maps, then the drop again. */
static void drop_resend(void *arg) {
    drop_op *op = arg;
    if (rtr_refresh_all(op->r, drop_send, op) != ST_OK)
        drop_send(op);
}

static void drop_checked(void *arg) {
    drop_op *op = arg;
    bool moving;
    if (drop_tablets(op, &moving) == op->sent_to && !moving) {
        Google__Protobuf__Empty empty;
        google__protobuf__empty__init(&empty);
        rtr_reply(op->call, &empty.base);
        free(op);
    } else if (++op->round >= DROP_ROUNDS_MAX) {
        rpc_call_finish(op->call, ST_UNAVAILABLE,
                        "the table's tablets kept moving during DropRowRange, or a node holding "
                        "them did not list them; retry");
        free(op);
    } else if (!moving || rtr_later_add(op->r, DROP_MOVING_WAIT_MS, drop_resend, op) != ST_OK) {
        drop_send(op);
    }
}

static void drop_done(rtr_fan *f, void *arg) {
    drop_op *op = arg;
    st_err err = {0};
    st_code rc = rtr_fan_first_error(f, &err);
    rtr_fan_free(f);
    if (rc != ST_OK) {
        rpc_call_finish(op->call, rc, err.msg);
        free(op);
    } else if (rtr_refresh_all(op->r, drop_checked, op) != ST_OK) {
        drop_checked(op);
    }
}

static void drop_send(void *arg) {
    drop_op *op = arg;
    rtr_ctx *r = op->r;
    bool holds[ST_TOPO_CLUSTERS_MAX][ST_TOPO_NODES_MAX] = {{false}};
    bool moving;
    size_t n = 0;
    op->sent_to = drop_tablets(op, &moving);
    for (size_t c = 0; c < r->n_clusters; c++) {
        if (op->only && op->only != &r->clusters[c])
            continue;
        const rtr_tmap_table *t = rtr_tmap_find(r->clusters[c].map, op->name);
        for (size_t i = 0; t && i < t->n; i++) {
            n += !holds[c][t->v[i].node];
            holds[c][t->v[i].node] = true;
        }
    }
    rtr_fan *f = rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, drop_done, op);
    if (!f) {
        rpc_call_finish(op->call, ST_RESOURCE_EXHAUSTED, "out of memory");
        free(op);
        return;
    }
    size_t k = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        for (size_t i = 0; i < r->clusters[c].n_nodes; i++)
            if (holds[c][i])
                rtr_fan_call(f, k++, &r->clusters[c].nodes[i], RTR_TA "DropRowRange", op->req);
    rtr_fan_seal(f);
}

/* With change streams on: the cluster of the default profile, which records the drop (see
 * above). Fails the call and frees op when there is none. */
static st_code drop_source(rtr_ctx *r, rpc_call *call, drop_op *op) {
    if (r->n_clusters < 2)
        return ST_OK;
    rtr_cluster *c = NULL;
    st_err err = {0};
    st_code rc = rtr_profile_route(r, RTR_PROFILE_DEFAULT, false, &c, &err);
    if (rc != ST_OK) {
        rtr_fail(call, rc, "%s", err.msg);
        free(op);
        return rc;
    }
    op->only = c;
    return ST_OK;
}

void rtr_h_drop_row_range(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__DropRowRangeRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__drop_row_range_request__descriptor, req_bytes);
    const rtr_meta_rec *rec = req ? rtr_table_or_fail(r, call, req->name) : NULL;
    pb_table *t = rec ? unpack_table(call, rec) : NULL; /* on failure the call is finished */
    if (!t)
        return;
    bool prefix = req->target_case ==
                  GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_ROW_KEY_PREFIX;
    if (prefix && req->row_key_prefix.len == 0) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "row_key_prefix must not be empty");
        return;
    }
    if (!prefix &&
        !(req->target_case ==
              GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_DELETE_ALL_DATA_FROM_TABLE &&
          req->delete_all_data_from_table)) {
        rtr_fail(call, ST_INVALID_ARGUMENT, "set row_key_prefix or delete_all_data_from_table");
        return;
    }
    drop_op *op = calloc(1, sizeof *op);
    if (!op) {
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *op = (drop_op){.r = r, .call = call, .req = req_bytes};
    snprintf(op->name, sizeof op->name, "%s", req->name);
    if (rtr_cs_enabled(t) && drop_source(r, call, op) != ST_OK)
        return;
    /* Fresh maps: every node that holds a tablet of the table must see the drop. */
    if (rtr_refresh_all(r, drop_send, op) != ST_OK)
        drop_send(op);
}

/* ---- consistency tokens ----
 * A token is "strata1:<cluster number>:<part of node 1>,<part of node 2>,...:<tag>" over the
 * nodes of the cluster serving the request, in topology order: each part is what the node
 * answered (its lsn, or with peer clusters every node's lsn: docs/formats/replication.md), and
 * every write acknowledged before the token was made is at or below its node's lsn. The tag
 * (token_tag) ties the token to its table, as Cloud Bigtable's tokens are, and guards its text:
 * CheckConsistency of a token made for another table, altered or written by hand is
 * INVALID_ARGUMENT rather than an answer about the wrong table, or a part read as something a
 * node said. CheckConsistency asks each node about its own part. */

#define TOKEN_PREFIX "strata1:"
/* A node that replicates answers the cross-cluster token of docs/formats/replication.md (never
 * shorter than 29 digits); a node without peers answers its own last lsn (at most 20 digits).
 * In an instance of several clusters the second means the node ships nothing: no token it is
 * part of may ever be reported consistent. */
#define TOKEN_LOCAL_DIGITS_MAX 20
/* The cross-cluster token: "1", then per node of the instance its number in 8 digits and its lsn
 * in 20. */
#define TOKEN_ENTRY_DIGITS 28

/* FAILED_PRECONDITION when the instance has other clusters but node's answer tok shows it does
 * not replicate to them (started by hand without --config): naming the node and the peers. */
static st_code token_node_replicates(const rtr_ctx *r, const rtr_node *node, const char *tok,
                                     st_err *err) {
    if (r->topo.n_clusters < 2 || strlen(tok) > TOKEN_LOCAL_DIGITS_MAX)
        return ST_OK;
    char peers[ST_TOPO_CLUSTERS_MAX * (ST_TOPO_ID_MAX + 2)] = "";
    for (size_t i = 0; i < r->topo.n_clusters; i++)
        if (&r->topo.clusters[i] != node->cluster->topo)
            snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%s%s",
                     peers[0] ? ", " : "", r->topo.clusters[i].id);
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "node %u (%s) of cluster %s does not replicate to cluster %s: it runs "
                      "without the instance topology, so its writes never reach them and "
                      "consistency cannot be reached; restart it with --config TOPOLOGY "
                      "--cluster-num %u --node-num %u (as `strata up` does)",
                      node->num, node->addr, node->cluster->topo->id, peers,
                      node->cluster->topo->num, node->num);
}

typedef struct cons_op {
    rtr_ctx *r;
    rpc_call *call;
    rtr_cluster *c;
    const char *table; /* the table's name (call arena) */
} cons_op;

/* The tag: the CRC32C of the table id (the name's last part, so the same table named through
 * another project or instance path gets the same tag) followed by the len bytes of the token
 * before it. A token cut, altered, joined from others or made for another table fails it. It is
 * a checksum, not a signature: it tells the router's tokens from damaged and hand-made ones. */
static uint32_t token_tag(const char *name, const char *body, size_t len) {
    const char *id = strrchr(name, '/');
    id = id ? id + 1 : name;
    return st_crc32c(st_crc32c(0, id, strlen(id)), body, len);
}

static void token_done(rtr_fan *f, void *arg) {
    cons_op *op = arg;
    st_err err = {0};
    st_code rc = rtr_fan_first_error(f, &err);
    st_buf tok;
    st_buf_init(&tok);
    char head[64];
    snprintf(head, sizeof head, TOKEN_PREFIX "%u:", op->c->topo->num);
    if (rc == ST_OK && st_buf_append(&tok, head, strlen(head)) != ST_OK)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory building a token");
    for (size_t i = 0; rc == ST_OK && i < f->n; i++) {
        size_t off = 0;
        st_slice msg;
        Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse *m = NULL;
        if (rtr_fan_next_msg(&f->res[i], &off, &msg))
            m = (void *)btu_pb_unpack(
                &google__bigtable__admin__v2__generate_consistency_token_response__descriptor, NULL,
                msg, NULL);
        if (!m) {
            rc = st_err_set(&err, ST_INTERNAL, "a node sent an unreadable consistency token");
            break;
        }
        rc = token_node_replicates(op->r, &op->c->nodes[i], m->consistency_token, &err);
        if (rc == ST_OK &&
            ((i && st_buf_append_byte(&tok, ',') != ST_OK) ||
             st_buf_append(&tok, m->consistency_token, strlen(m->consistency_token)) != ST_OK))
            rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory building a token");
        google__bigtable__admin__v2__generate_consistency_token_response__free_unpacked(m, NULL);
    }
    rtr_fan_free(f);
    char tag[16];
    if (rc == ST_OK)
        snprintf(tag, sizeof tag, ":%08x", token_tag(op->table, (const char *)tok.data, tok.len));
    if (rc == ST_OK && st_buf_append(&tok, tag, strlen(tag) + 1) != ST_OK)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (rc != ST_OK) {
        rpc_call_finish(op->call, rc, err.msg);
    } else {
        Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse resp;
        google__bigtable__admin__v2__generate_consistency_token_response__init(&resp);
        resp.consistency_token = (char *)tok.data;
        rtr_reply(op->call, &resp.base);
    }
    st_buf_free(&tok);
    free(op);
}

static cons_op *cons_new(rtr_ctx *r, rpc_call *call, rtr_cluster *c, size_t n, rtr_fan_done_fn done,
                         rtr_fan **f) {
    cons_op *op = calloc(1, sizeof *op);
    *f = op ? rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, done, op) : NULL;
    if (!*f) {
        free(op);
        rtr_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *op = (cons_op){.r = r, .call = call, .c = c};
    return op;
}

void rtr_h_generate_consistency_token(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__generate_consistency_token_request__descriptor,
        req_bytes);
    if (!req || !rtr_table_or_fail(r, call, req->name))
        return;
    rtr_cluster *c;
    st_err err = {0};
    if (rtr_profile_route(r, "", false, &c, &err) != ST_OK) {
        rtr_fail(call, err.code, "%s", err.msg);
        return;
    }
    rtr_fan *f;
    cons_op *op = cons_new(r, call, c, c->n_nodes, token_done, &f);
    if (!op)
        return;
    op->table = req->name; /* the request lives as long as the call */
    for (size_t i = 0; i < c->n_nodes; i++)
        rtr_fan_call(f, i, &c->nodes[i], RTR_TA "GenerateConsistencyToken", req_bytes);
    rtr_fan_seal(f);
}

static void check_reply(cons_op *op, bool consistent) {
    Google__Bigtable__Admin__V2__CheckConsistencyResponse resp;
    google__bigtable__admin__v2__check_consistency_response__init(&resp);
    resp.consistent = consistent;
    rtr_reply(op->call, &resp.base);
    free(op);
}

/* The nodes' answers said consistent: so is the table only if every cluster holds all its rows
 * on fresh maps. A node of a peer cluster started again on an empty data directory holds none of
 * the table's tablets, while its peers' positions say it took every write: without this check
 * the token would pass with that cluster's copy gone (docs/formats/replication.md). */
static void check_covered(void *arg) {
    cons_op *op = arg;
    bool all = true;
    for (size_t i = 0; all && i < op->r->n_clusters; i++)
        all = rtr_tmap_covers_all(rtr_tmap_find(op->r->clusters[i].map, op->table));
    check_reply(op, all);
}

static void check_done(rtr_fan *f, void *arg) {
    cons_op *op = arg;
    st_err err = {0};
    bool consistent;
    st_code rc = fan_consistent(f, &consistent, &err);
    rtr_fan_free(f);
    if (rc != ST_OK) {
        rpc_call_finish(op->call, rc, err.msg);
        free(op);
    } else if (!consistent) {
        check_reply(op, false);
    } else if (rtr_refresh_all(op->r, check_covered, op) != ST_OK) {
        check_covered(op);
    }
}

/* Whether p is a part a node of the instance answers: with peer clusters the cross-cluster
 * token ("1", then whole 28-digit entries, at most one per node an instance may have), else the
 * node's own lsn (token_node_replicates refused anything else when the token was made). */
static bool token_part_ok(const rtr_ctx *r, const char *p) {
    size_t len = strlen(p);
    if (len == 0 || strspn(p, "0123456789") != len)
        return false;
    if (r->topo.n_clusters < 2)
        return len <= TOKEN_LOCAL_DIGITS_MAX;
    return p[0] == '1' && len > 1 && (len - 1) % TOKEN_ENTRY_DIGITS == 0 &&
           (len - 1) / TOKEN_ENTRY_DIGITS <= ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX;
}

/* Parses "strata1:<cluster>:<part>,<part>,...:<tag>" into the cluster and one part per node of
 * it; false for a token this router could not have made for table: another tag (token_tag), an
 * unknown cluster, another number of parts than the cluster has nodes, or a part no node
 * answers (token_part_ok). */
static bool token_parse(rtr_ctx *r, const char *tok, const char *table, rtr_cluster **c,
                        char **parts, size_t *n, st_arena *a) {
    const char *tag = strrchr(tok, ':');
    if (strncmp(tok, TOKEN_PREFIX, strlen(TOKEN_PREFIX)) != 0 || !tag || strlen(tag + 1) != 8 ||
        strspn(tag + 1, "0123456789abcdef") != 8 ||
        strtoul(tag + 1, NULL, 16) != token_tag(table, tok, (size_t)(tag - tok)))
        return false;
    char *end;
    unsigned long num = strtoul(tok + strlen(TOKEN_PREFIX), &end, 10);
    if (*end != ':' || end >= tag)
        return false;
    *c = NULL;
    for (size_t i = 0; i < r->n_clusters; i++)
        if (r->clusters[i].topo->num == num)
            *c = &r->clusters[i];
    char *list = *c ? st_arena_alloc(a, (size_t)(tag - end)) : NULL;
    if (!list)
        return false;
    memcpy(list, end + 1, (size_t)(tag - end - 1));
    list[tag - end - 1] = '\0';
    *n = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (*n == (*c)->n_nodes || !token_part_ok(r, p))
            return false;
        parts[(*n)++] = p;
    }
    return *n == (*c)->n_nodes;
}

void rtr_h_check_consistency(rpc_call *call, st_slice req_bytes, void *arg) {
    rtr_ctx *r = arg;
    Google__Bigtable__Admin__V2__CheckConsistencyRequest *req = (void *)rtr_unpack(
        call, &google__bigtable__admin__v2__check_consistency_request__descriptor, req_bytes);
    if (!req || !rtr_table_or_fail(r, call, req->name))
        return;
    st_arena *a = rpc_call_arena(call);
    rtr_cluster *c;
    char *parts[ST_TOPO_NODES_MAX];
    size_t n;
    if (!token_parse(r, req->consistency_token, req->name, &c, parts, &n, a)) {
        size_t len = strlen(req->consistency_token);
        rtr_fail(call, ST_INVALID_ARGUMENT,
                 "invalid consistency token '%.80s%s': it was not made for table %s by "
                 "GenerateConsistencyToken (it is cut or altered, made for another table or "
                 "by an older router); generate one with GenerateConsistencyToken for this table",
                 req->consistency_token, len > 80 ? "..." : "", req->name);
        return;
    }
    rtr_fan *f;
    cons_op *op = cons_new(r, call, c, n, check_done, &f);
    if (!op)
        return;
    op->table = st_arena_dup(a, req->name, strlen(req->name) + 1);
    if (!op->table)
        op->table = ""; /* no map holds it: answered not consistent */
    for (size_t i = 0; i < n; i++) {
        req->consistency_token = parts[i];
        size_t len = google__bigtable__admin__v2__check_consistency_request__get_packed_size(req);
        uint8_t *buf = st_arena_alloc(a, len ? len : 1);
        if (!buf) {
            f->res[i].code = st_err_set(&f->res[i].err, ST_RESOURCE_EXHAUSTED, "out of memory");
            continue;
        }
        google__bigtable__admin__v2__check_consistency_request__pack(req, buf);
        rtr_fan_call(f, i, &c->nodes[i], RTR_TA "CheckConsistency", st_slice_make(buf, len));
    }
    rtr_fan_seal(f);
}
