/*
 * Proves the write side of change streams (docs/changestreams.md) in in-process nodes that share
 * one event_base on the main thread while the tests run on a client thread and talk gRPC:
 * - UpdateTable: retention outside 1..7 days and unknown mask paths are INVALID_ARGUMENT, a
 *   valid one answers a done Operation holding the Table, GetTable shows the config, deletion
 *   protection refuses DeleteTable, the config mask without a config turns streams off;
 *   turning streams on maps the ring (pages faulted in) before any write reaches it;
 * - every row mutation of a table with streams on adds one record cell (family "\0changes",
 *   qualifier be64(stamp) be32(index), timestamp = stamp) for MutateRow, MutateRows,
 *   CheckAndMutateRow and ReadModifyWriteRow, with strictly increasing stamps above the commit
 *   times; a DeleteFromRow record holds one DeleteFromFamily per family; tables without streams
 *   get none; user reads never see the records;
 * - the history of a deleted row survives a flush and a full compaction;
 * - DropRowRange writes one record per dropped row;
 * - a compaction that drops cells by a GC rule leads to a GC record (STO_ROW_GC, one
 *   DeleteFromColumn [ts, ts+1) per cell);
 * - a replicated row keeps only this node's record (its origin's record cell is removed);
 * - a replicated delete that leaves a newer cell of its row (durable, or in flight when the
 *   delete is prepared) records that cell as a SetCell after the delete;
 * - the record cell comes first in the row storage gets (memtable append path);
 * - the ring keeps the newest records within its size, answers MISS for evicted ones and never
 *   keeps a record larger than itself;
 * - the resolved stamp stays below a write in flight and passes it once durable, and the ring
 *   holds the record then (and answers MISS for stamps before the node started);
 * - a tablet move copies the history to the target without making new records, and records the
 *   target makes afterwards have higher stamps;
 * - records survive kill -9 of a node process (forked before the test threads start) and a
 *   restart.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "btclient.h"
#include "changes.h"
#include "google/longrunning/operations.pb-c.h"
#include "sto_test_util.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"
#include "tu_tmp.h"

#define PARENT "projects/p/instances/i"
#define TBL(x) PARENT "/tables/" x
#define TIMEOUT_MS 60000
#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define IN "/strata.internal.v1.Node/"
#define DAY_S (24 * 3600)
#define RECS_MAX 64

typedef struct node_env {
    node_ctx *node;
    char addr[64];
    char dir[512];
} node_env;

static struct event_base *g_base;
static node_env S, A, B; /* S standalone; A, B cluster members 1 and 2 */
static node_env R;       /* standalone, with a 4 KiB ring */
#define SMALL_RING_BYTES 4096

/* ---- RPC helpers ---- */

static st_code call(const node_env *e, const char *path, const ProtobufCMessage *req, st_buf *resp,
                    st_err *status) {
    return bt_call_pb(e->addr, path, req, TIMEOUT_MS, resp, status);
}

/* A Table message with families fams (NULL-terminated; rule: max versions `versions`, 0 = none)
 * and retention (days; 0 = no config). Storage for the messages is in *tb. */
typedef struct table_pb {
    Google__Bigtable__Admin__V2__Table t;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e[4], *ep[4];
    Google__Bigtable__Admin__V2__ColumnFamily cf[4];
    Google__Bigtable__Admin__V2__GcRule rule;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cs;
    Google__Protobuf__Duration d;
} table_pb;

static void table_pb_init(table_pb *tb, const char *name, const char *const *fams, int versions,
                          int64_t retention_s) {
    memset(tb, 0, sizeof *tb);
    google__bigtable__admin__v2__table__init(&tb->t);
    google__bigtable__admin__v2__gc_rule__init(&tb->rule);
    if (versions) {
        tb->rule.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
        tb->rule.max_num_versions = versions;
    }
    tb->t.name = (char *)name;
    for (size_t i = 0; fams && fams[i]; i++) {
        google__bigtable__admin__v2__table__column_families_entry__init(&tb->e[i]);
        google__bigtable__admin__v2__column_family__init(&tb->cf[i]);
        tb->cf[i].gc_rule = &tb->rule;
        tb->e[i].key = (char *)fams[i];
        tb->e[i].value = &tb->cf[i];
        tb->ep[i] = &tb->e[i];
        tb->t.n_column_families++;
    }
    tb->t.column_families = tb->ep;
    if (retention_s) {
        google__bigtable__admin__v2__change_stream_config__init(&tb->cs);
        google__protobuf__duration__init(&tb->d);
        tb->d.seconds = retention_s;
        tb->cs.retention_period = &tb->d;
        tb->t.change_stream_config = &tb->cs;
    }
}

static void create_table(const node_env *e, const char *id, const char *const *fams, int versions,
                         int64_t retention_s) {
    table_pb tb;
    table_pb_init(&tb, NULL, fams, versions, retention_s);
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = PARENT;
    req.table_id = (char *)id;
    req.table = &tb.t;
    st_err status;
    assert_int_equal(call(e, TA "CreateTable", &req.base, NULL, &status), ST_OK);
}

static void set_cell(Google__Bigtable__V2__Mutation *m, Google__Bigtable__V2__Mutation__SetCell *sc,
                     const char *fam, const char *qual, const char *value, int64_t ts) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = (char *)fam;
    sc->column_qualifier = (ProtobufCBinaryData){strlen(qual), (uint8_t *)qual};
    sc->value = (ProtobufCBinaryData){strlen(value), (uint8_t *)value};
    sc->timestamp_micros = ts;
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

static st_code mutate_one(const node_env *e, const char *table, const char *key,
                          Google__Bigtable__V2__Mutation *m) {
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &m;
    st_err status;
    return call(e, BT "MutateRow", &req.base, NULL, &status);
}

static st_code put(const node_env *e, const char *table, const char *key, const char *fam,
                   const char *qual, const char *value, int64_t ts) {
    Google__Bigtable__V2__Mutation m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell(&m, &sc, fam, qual, value, ts);
    return mutate_one(e, table, key, &m);
}

static st_code delete_row(const node_env *e, const char *table, const char *key) {
    Google__Bigtable__V2__Mutation m;
    Google__Bigtable__V2__Mutation__DeleteFromRow d;
    google__bigtable__v2__mutation__init(&m);
    google__bigtable__v2__mutation__delete_from_row__init(&d);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
    m.delete_from_row = &d;
    return mutate_one(e, table, key, &m);
}

static void ignore_msg(st_slice msg, void *arg) {
    (void)msg;
    (void)arg;
}

static st_code mutate_two(const node_env *e, const char *table, const char *k1, const char *k2) {
    Google__Bigtable__V2__Mutation m[2], *mp[2] = {&m[0], &m[1]};
    Google__Bigtable__V2__Mutation__SetCell sc[2];
    set_cell(&m[0], &sc[0], "f", "a", "one", 1000);
    set_cell(&m[1], &sc[1], "f", "a", "two", 1000);
    Google__Bigtable__V2__MutateRowsRequest__Entry ents[2], *ep[2] = {&ents[0], &ents[1]};
    const char *keys[2] = {k1, k2};
    for (int i = 0; i < 2; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&ents[i]);
        ents[i].row_key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        ents[i].n_mutations = 1;
        ents[i].mutations = &mp[i];
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)table;
    req.n_entries = 2;
    req.entries = ep;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    st_err status;
    st_code rc = rpc_blocking_stream(e->addr, NULL, BT "MutateRows", st_slice_make(buf, len), NULL,
                                     0, TIMEOUT_MS, ignore_msg, NULL, &status);
    free(buf);
    return rc;
}

/* ---- reading records from storage ---- */

typedef struct rec {
    char row[32];
    int64_t stamp, ts;
    uint32_t index;
    uint64_t commit_ts;
    uint32_t flags, origin;
    size_t n_muts;
    sto_mut_type types[8];
    char fams[8][8];
} rec;

typedef struct tablet_ids {
    const char *table;
    uint64_t ids[16];
    size_t n;
} tablet_ids;

static void collect_id(const sto_tablet_info *info, void *arg) {
    tablet_ids *t = arg;
    if (st_slice_eq(info->table, st_slice_cstr(t->table)) && t->n < 16)
        t->ids[t->n++] = info->id;
}

static size_t table_tablets(const node_env *e, const char *table, uint64_t *ids) {
    tablet_ids t = {.table = table};
    sto_tablet_list(node_db(e->node), collect_id, &t);
    memcpy(ids, t.ids, t.n * sizeof *ids);
    return t.n;
}

static void rec_fill(rec *r, const sto_cell *c) {
    snprintf(r->row, sizeof r->row, "%.*s", (int)c->row.len, (const char *)c->row.data);
    assert_int_equal(c->qualifier.len, NODE_CS_QUALIFIER_LEN);
    r->stamp = (int64_t)st_get_be64(c->qualifier.data);
    const uint8_t *q = c->qualifier.data + 8;
    r->index = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
    r->ts = c->ts_us;
    st_arena a;
    st_arena_init(&a, 4096);
    sto_row_mut m;
    assert_true(sto_row_mut_decode(c->value, &m, &a));
    assert_true(st_slice_eq(m.row, c->row));
    assert_int_equal(m.tablet_id, 0);
    r->commit_ts = m.commit_ts_us;
    r->flags = m.flags;
    r->origin = m.origin;
    r->n_muts = m.n_muts;
    for (size_t i = 0; i < m.n_muts && i < 8; i++) {
        r->types[i] = m.muts[i].type;
        snprintf(r->fams[i], sizeof r->fams[i], "%.*s", (int)m.muts[i].family.len,
                 (const char *)m.muts[i].family.data);
    }
    st_arena_deinit(&a);
}

/* Records of table's rows starting with prefix (all tablets of e), sorted by stamp. */
static size_t records(const node_env *e, const char *table, const char *prefix, rec *out) {
    uint64_t ids[16];
    size_t n_ids = table_tablets(e, table, ids), n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        sto_tablet *t;
        assert_int_equal(sto_tablet_get(node_db(e->node), ids[i], &t), ST_OK);
        sto_snapshot *s;
        sto_iter *it;
        sto_range all = {0};
        assert_int_equal(sto_snapshot_new(t, &s, NULL), ST_OK);
        assert_int_equal(sto_iter_new_flags(s, &all, false, STO_ITER_SYSTEM, &it, NULL), ST_OK);
        sto_cell c;
        while (sto_iter_next(it, &c, NULL) == ST_OK) {
            assert_true(st_slice_eq(c.family, st_slice_make(NODE_CS_FAMILY, NODE_CS_FAMILY_LEN)));
            if (c.row.len < strlen(prefix) || memcmp(c.row.data, prefix, strlen(prefix)) != 0)
                continue;
            assert_true(n < RECS_MAX);
            rec_fill(&out[n++], &c);
        }
        sto_iter_free(it);
        sto_snapshot_free(s);
    }
    for (size_t i = 1; i < n; i++) /* insertion sort by stamp */
        for (size_t j = i; j > 0 && out[j].stamp < out[j - 1].stamp; j--) {
            rec x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return n;
}

/* Visible user cells of table's rows starting with prefix on e. */
static size_t user_cells(const node_env *e, const char *table, const char *prefix) {
    uint64_t ids[16];
    size_t n_ids = table_tablets(e, table, ids), n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        sto_tablet *t;
        assert_int_equal(sto_tablet_get(node_db(e->node), ids[i], &t), ST_OK);
        sto_snapshot *s;
        sto_iter *it;
        sto_range all = {0};
        assert_int_equal(sto_snapshot_new(t, &s, NULL), ST_OK);
        assert_int_equal(sto_iter_new(s, &all, false, &it, NULL), ST_OK);
        sto_cell c;
        while (sto_iter_next(it, &c, NULL) == ST_OK)
            n += c.row.len >= strlen(prefix) && memcmp(c.row.data, prefix, strlen(prefix)) == 0;
        sto_iter_free(it);
        sto_snapshot_free(s);
    }
    return n;
}

/* ---- running code on the loop thread ---- */

typedef struct loop_job {
    void (*fn)(struct loop_job *j);
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    void *arg;
} loop_job;

static void job_run(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    loop_job *j = arg;
    j->fn(j);
}

static void job_finish(loop_job *j) {
    pthread_mutex_lock(&j->mu);
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Runs fn on the loop; it (or a later callback) calls job_finish. */
static void on_loop(void (*fn)(loop_job *j), void *arg) {
    loop_job j = {.fn = fn, .arg = arg};
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    struct timeval tv = {0, 0};
    assert_int_equal(event_base_once(g_base, -1, EV_TIMEOUT, job_run, &j, &tv), 0);
    pthread_mutex_lock(&j.mu);
    while (!j.done)
        pthread_cond_wait(&j.cv, &j.mu);
    pthread_mutex_unlock(&j.mu);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
}

/* A stream open (+1) or closed (-1) as far as the ring is concerned: without one the node
 * keeps no records in memory. */
typedef struct readers_job {
    node_ctx *n;
    int delta;
} readers_job;

static void readers_run(loop_job *j) {
    readers_job *r = j->arg;
    node_cs_readers_add(r->n, r->delta);
    job_finish(j);
}

static void readers_add(const node_env *e, int delta) {
    readers_job r = {e->node, delta};
    on_loop(readers_run, &r);
}

typedef struct mapped_job {
    node_ctx *n;
    bool mapped;
} mapped_job;

static void mapped_run(loop_job *j) {
    mapped_job *m = j->arg;
    m->mapped = node_cs_ring_mapped(m->n);
    job_finish(j);
}

static bool ring_mapped(const node_env *e) {
    mapped_job m = {e->node, false};
    on_loop(mapped_run, &m);
    return m.mapped;
}

/* ---- tests ---- */

static const char *const FG[] = {"f", "g", NULL};

static st_code update_table(const node_env *e, const char *name, const char *path,
                            int64_t retention_s, bool protect, st_buf *resp) {
    table_pb tb;
    table_pb_init(&tb, name, NULL, 0, retention_s);
    tb.t.deletion_protection = protect;
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    char *paths[1] = {(char *)path};
    mask.n_paths = 1;
    mask.paths = paths;
    Google__Bigtable__Admin__V2__UpdateTableRequest req;
    google__bigtable__admin__v2__update_table_request__init(&req);
    req.table = &tb.t;
    req.update_mask = &mask;
    st_err status;
    return call(e, TA "UpdateTable", &req.base, resp, &status);
}

/* GetTable's retention in seconds (0 = no config). */
static int64_t get_retention(const node_env *e, const char *name) {
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = (char *)name;
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    assert_int_equal(call(e, TA "GetTable", &req.base, &resp, &status), ST_OK);
    Google__Bigtable__Admin__V2__Table *t =
        google__bigtable__admin__v2__table__unpack(NULL, resp.len, resp.data);
    assert_non_null(t);
    int64_t s = t->change_stream_config && t->change_stream_config->retention_period
                    ? t->change_stream_config->retention_period->seconds
                    : 0;
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    st_buf_free(&resp);
    return s;
}

static void test_cs_update_table(void **state) {
    (void)state;
    create_table(&S, "u", FG, 0, 0);
    assert_int_equal(get_retention(&S, TBL("u")), 0);
    const char *cs = "change_stream_config.retention_period";
    assert_int_equal(update_table(&S, TBL("u"), cs, DAY_S / 2, false, NULL), ST_INVALID_ARGUMENT);
    assert_int_equal(update_table(&S, TBL("u"), cs, 8 * DAY_S, false, NULL), ST_INVALID_ARGUMENT);
    assert_int_equal(update_table(&S, TBL("u"), "granularity", DAY_S, false, NULL),
                     ST_INVALID_ARGUMENT);
    assert_int_equal(get_retention(&S, TBL("u")), 0);
    /* No table with streams on: no ring. Turning them on maps it (pages faulted in) before any
     * write, so no write pays a page fault filling it. */
    assert_false(ring_mapped(&S));
    st_buf resp;
    st_buf_init(&resp);
    assert_int_equal(update_table(&S, TBL("u"), cs, 3 * DAY_S, false, &resp), ST_OK);
    assert_true(ring_mapped(&S));
    Google__Longrunning__Operation *op =
        google__longrunning__operation__unpack(NULL, resp.len, resp.data);
    assert_non_null(op);
    assert_true(op->done);
    assert_int_equal(op->result_case, GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE);
    assert_string_equal(op->metadata->type_url,
                        "type.googleapis.com/google.bigtable.admin.v2.UpdateTableMetadata");
    assert_string_equal(op->response->type_url,
                        "type.googleapis.com/google.bigtable.admin.v2.Table");
    Google__Bigtable__Admin__V2__Table *t = google__bigtable__admin__v2__table__unpack(
        NULL, op->response->value.len, op->response->value.data);
    assert_non_null(t);
    assert_int_equal(t->change_stream_config->retention_period->seconds, 3 * DAY_S);
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&resp);
    assert_int_equal(get_retention(&S, TBL("u")), 3 * DAY_S);
    /* Deletion protection refuses DeleteTable until it is off again. */
    assert_int_equal(update_table(&S, TBL("u"), "deletion_protection", 0, true, NULL), ST_OK);
    assert_int_equal(get_retention(&S, TBL("u")), 3 * DAY_S); /* other fields untouched */
    Google__Bigtable__Admin__V2__DeleteTableRequest del;
    google__bigtable__admin__v2__delete_table_request__init(&del);
    del.name = TBL("u");
    st_err status;
    assert_int_equal(call(&S, TA "DeleteTable", &del.base, NULL, &status), ST_FAILED_PRECONDITION);
    /* ... and the drop of a column family (Cloud Bigtable's protection covers them too). */
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification drop;
    google__bigtable__admin__v2__modify_column_families_request__modification__init(&drop);
    drop.id = "g";
    drop.mod_case =
        GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP;
    drop.drop = true;
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification *mods[1] = {&drop};
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest mcf;
    google__bigtable__admin__v2__modify_column_families_request__init(&mcf);
    mcf.name = TBL("u");
    mcf.n_modifications = 1;
    mcf.modifications = mods;
    assert_int_equal(call(&S, TA "ModifyColumnFamilies", &mcf.base, NULL, &status),
                     ST_FAILED_PRECONDITION);
    assert_non_null(strstr(status.msg, "deletion_protection"));
    assert_int_equal(update_table(&S, TBL("u"), "deletion_protection", 0, false, NULL), ST_OK);
    assert_int_equal(call(&S, TA "ModifyColumnFamilies", &mcf.base, NULL, &status), ST_OK);
    /* The config mask without a config: streams off. */
    assert_int_equal(update_table(&S, TBL("u"), "change_stream_config", 0, false, NULL), ST_OK);
    assert_int_equal(get_retention(&S, TBL("u")), 0);
    assert_int_equal(call(&S, TA "DeleteTable", &del.base, NULL, &status), ST_OK);
}

static void assert_set_record(const rec *r, const char *row, const char *fam) {
    assert_string_equal(r->row, row);
    assert_int_equal(r->ts, r->stamp);
    /* the stamp is the earliest commit time of the write's own rows (write_stamp) */
    assert_true((int64_t)r->commit_ts >= r->stamp);
    assert_int_equal(r->flags, 0);
    assert_int_equal(r->n_muts, 1);
    assert_int_equal(r->types[0], STO_MUT_SET_CELL);
    assert_string_equal(r->fams[0], fam);
}

static void test_cs_records_per_method(void **state) {
    (void)state;
    create_table(&S, "r", FG, 0, DAY_S);
    create_table(&S, "off", FG, 0, 0);
    assert_int_equal(put(&S, TBL("r"), "r1", "f", "a", "v1", 1000), ST_OK);
    assert_int_equal(mutate_two(&S, TBL("r"), "r2", "r3"), ST_OK);
    /* CheckAndMutateRow without a predicate: true_mutations apply when the row has cells. */
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell(&m, &sc, "g", "b", "cam", 2000);
    Google__Bigtable__V2__CheckAndMutateRowRequest cam;
    google__bigtable__v2__check_and_mutate_row_request__init(&cam);
    cam.table_name = TBL("r");
    cam.row_key = (ProtobufCBinaryData){2, (uint8_t *)"r1"};
    cam.n_true_mutations = 1;
    cam.true_mutations = &mp;
    st_err status;
    assert_int_equal(call(&S, BT "CheckAndMutateRow", &cam.base, NULL, &status), ST_OK);
    Google__Bigtable__V2__ReadModifyWriteRule rule, *rp = &rule;
    google__bigtable__v2__read_modify_write_rule__init(&rule);
    rule.family_name = "f";
    rule.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    rule.rule_case = GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_APPEND_VALUE;
    rule.append_value = (ProtobufCBinaryData){1, (uint8_t *)"x"};
    Google__Bigtable__V2__ReadModifyWriteRowRequest rmw;
    google__bigtable__v2__read_modify_write_row_request__init(&rmw);
    rmw.table_name = TBL("r");
    rmw.row_key = (ProtobufCBinaryData){2, (uint8_t *)"r4"};
    rmw.n_rules = 1;
    rmw.rules = &rp;
    assert_int_equal(call(&S, BT "ReadModifyWriteRow", &rmw.base, NULL, &status), ST_OK);
    assert_int_equal(delete_row(&S, TBL("r"), "r1"), ST_OK);
    assert_int_equal(put(&S, TBL("off"), "r1", "f", "a", "v1", 1000), ST_OK);

    rec r[RECS_MAX];
    size_t n = records(&S, TBL("r"), "", r);
    assert_int_equal(n, 6);
    assert_set_record(&r[0], "r1", "f");
    assert_set_record(&r[1], "r2", "f");
    assert_set_record(&r[2], "r3", "f");
    assert_int_equal(r[1].stamp, r[2].stamp); /* one write, two rows: indexes 0 and 1 */
    assert_int_equal((int64_t)r[1].commit_ts, r[1].stamp); /* its first row's commit time */
    assert_true(r[2].commit_ts > r[1].commit_ts);
    assert_int_equal(r[1].index, 0);
    assert_int_equal(r[2].index, 1);
    assert_set_record(&r[3], "r1", "g"); /* CheckAndMutateRow */
    assert_set_record(&r[4], "r4", "f"); /* ReadModifyWriteRow */
    assert_string_equal(r[5].row, "r1"); /* DeleteFromRow: one DeleteFromFamily per family */
    assert_int_equal(r[5].n_muts, 2);
    assert_int_equal(r[5].types[0], STO_MUT_DEL_FAMILY);
    assert_int_equal(r[5].types[1], STO_MUT_DEL_FAMILY);
    assert_string_equal(r[5].fams[0], "f");
    assert_string_equal(r[5].fams[1], "g");
    for (size_t i = 1; i < n; i++)
        assert_true(r[i].stamp > r[i - 1].stamp || i == 2);
    assert_int_equal(records(&S, TBL("off"), "", r), 0);
    /* User reads (sto_iter_new) see only user cells: r2, r3, r4's. */
    assert_int_equal(user_cells(&S, TBL("r"), ""), 3);
}

/* After test_cs_records_per_method: r1 is deleted, its history stays through a flush and a
 * compaction. */
static void test_cs_history_survives_compaction(void **state) {
    (void)state;
    rec r[RECS_MAX];
    assert_int_equal(records(&S, TBL("r"), "r1", r), 3);
    uint64_t ids[16];
    size_t n_ids = table_tablets(&S, TBL("r"), ids);
    for (size_t i = 0; i < n_ids; i++) {
        assert_int_equal(sto_tablet_flush(node_db(S.node), ids[i], NULL), ST_OK);
        assert_int_equal(sto_tablet_compact(node_db(S.node), ids[i], NULL), ST_OK);
    }
    assert_int_equal(records(&S, TBL("r"), "r1", r), 3);
    assert_int_equal(user_cells(&S, TBL("r"), "r1"), 0);
}

static void test_cs_drop_row_range(void **state) {
    (void)state;
    create_table(&S, "d", FG, 0, DAY_S);
    assert_int_equal(put(&S, TBL("d"), "p1", "f", "a", "v", 1000), ST_OK);
    assert_int_equal(put(&S, TBL("d"), "p2", "g", "a", "v", 1000), ST_OK);
    assert_int_equal(put(&S, TBL("d"), "q1", "f", "a", "v", 1000), ST_OK);
    Google__Bigtable__Admin__V2__DropRowRangeRequest req;
    google__bigtable__admin__v2__drop_row_range_request__init(&req);
    req.name = TBL("d");
    req.target_case = GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_ROW_KEY_PREFIX;
    req.row_key_prefix = (ProtobufCBinaryData){1, (uint8_t *)"p"};
    st_err status;
    assert_int_equal(call(&S, TA "DropRowRange", &req.base, NULL, &status), ST_OK);
    assert_int_equal(user_cells(&S, TBL("d"), "p"), 0);
    assert_int_equal(user_cells(&S, TBL("d"), "q"), 1);
    rec r[RECS_MAX];
    assert_int_equal(records(&S, TBL("d"), "p", r), 4); /* two puts, two drops */
    for (int i = 2; i < 4; i++) {
        assert_int_equal(r[i].n_muts, 2);
        assert_int_equal(r[i].types[0], STO_MUT_DEL_FAMILY);
        assert_string_equal(r[i].fams[1], "g");
        assert_int_equal(r[i].flags, 0);
    }
    assert_int_equal(records(&S, TBL("d"), "q", r), 1);
}

static void test_cs_gc_records(void **state) {
    (void)state;
    static const char *const F[] = {"f", NULL};
    create_table(&S, "gc", F, 1, DAY_S); /* max versions 1 */
    uint64_t ids[16];
    assert_int_equal(table_tablets(&S, TBL("gc"), ids), 1);
    for (int64_t ts = 1000; ts <= 3000; ts += 1000) {
        assert_int_equal(put(&S, TBL("gc"), "k", "f", "q", "v", ts), ST_OK);
        assert_int_equal(sto_tablet_flush(node_db(S.node), ids[0], NULL), ST_OK);
    }
    assert_int_equal(sto_tablet_compact(node_db(S.node), ids[0], NULL), ST_OK);
    rec r[RECS_MAX];
    size_t n = 0;
    for (int i = 0; i < 5000 && (n = records(&S, TBL("gc"), "k", r)) < 4; i++)
        usleep(1000);
    assert_int_equal(n, 4);
    const rec *g = &r[3];
    assert_int_equal(g->flags, STO_ROW_GC);
    assert_int_equal(g->origin, 0);
    assert_int_equal(g->n_muts, 2); /* the cells at 1000 and 2000 */
    assert_int_equal(g->types[0], STO_MUT_DEL_COLUMN);
    assert_string_equal(g->fams[0], "f");
}

/* ---- resolved stamp and ring (on the loop) ---- */

typedef struct resolved_probe {
    node_ctx *n;
    int64_t stamp, before, after;
    size_t ring_hits;
    node_cs_ring_rc ring_rc, old_rc;
    bool failed; /* no cmocka asserts on the loop thread: checked on the client */
    loop_job *job;
    sto_mut mut;
    sto_row_mut row;
} resolved_probe;

static bool count_rec(const node_cs_rec *cr, void *arg) {
    resolved_probe *p = arg;
    p->ring_hits += cr->stamp_us == p->stamp && st_slice_eq(cr->row, st_slice_cstr("z1"));
    return true;
}

static void probe_done(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)msg;
    resolved_probe *p = arg;
    p->failed = p->failed || code != ST_OK;
    p->after = node_cs_resolved(n);
    p->ring_rc = node_cs_ring_scan(n, TBL("r"), st_slice_make("", 0), st_slice_make("", 0),
                                   p->stamp - 1, p->after, count_rec, p);
    p->old_rc = node_cs_ring_scan(n, TBL("r"), st_slice_make("", 0), st_slice_make("", 0), 0,
                                  p->after, count_rec, p);
    job_finish(p->job);
}

static void probe_write(loop_job *j) {
    resolved_probe *p = j->arg;
    p->job = j;
    p->mut = tu_set_mut("f", "z", 1000, "v");
    p->row = (sto_row_mut){.row = st_slice_cstr("z1"), .muts = &p->mut, .n_muts = 1};
    st_err err = {0};
    if (node_row_prepare(p->n, TBL("r"), &p->row, &err) != ST_OK ||
        node_write(p->n, &p->row, 1, &err, probe_done, p) != ST_OK) {
        p->failed = true;
        job_finish(j);
        return;
    }
    p->stamp = p->n->hlc_last_us; /* the write's stamp: the clock's last value */
    p->before = node_cs_resolved(p->n);
    p->failed = p->n->hlc_last_us < p->stamp; /* resolved may move the clock, never back */
}

static void test_cs_resolved_and_ring(void **state) {
    (void)state;
    /* With no stream open the write skips the ring: a reader from before it reads storage. */
    resolved_probe q = {.n = S.node};
    on_loop(probe_write, &q);
    assert_false(q.failed);
    assert_int_equal(q.ring_rc, NODE_CS_RING_MISS);
    assert_int_equal(q.ring_hits, 0);
    readers_add(&S, 1);
    resolved_probe p = {.n = S.node};
    on_loop(probe_write, &p);
    readers_add(&S, -1);
    /* The last stream closed just now: the ring goes on for a while (a consumer reconnecting
     * finds the writes made meanwhile in memory). */
    resolved_probe g = {.n = S.node};
    on_loop(probe_write, &g);
    assert_false(g.failed);
    assert_int_equal(g.ring_rc, NODE_CS_RING_OK);
    assert_int_equal(g.ring_hits, 1);
    assert_false(p.failed);
    assert_true(p.before < p.stamp);
    assert_true(p.after >= p.stamp);
    assert_int_equal(p.ring_rc, NODE_CS_RING_OK);
    assert_int_equal(p.ring_hits, 1);
    assert_int_equal(p.old_rc, NODE_CS_RING_MISS); /* before the node started */
    rec r[RECS_MAX];
    assert_int_equal(records(&S, TBL("r"), "z1", r), 3);
    assert_int_equal(r[0].stamp, q.stamp);
    assert_int_equal(r[1].stamp, p.stamp);
    assert_int_equal(r[2].stamp, g.stamp);
}

/* A replicated row mutation arrives with its origin's record cell: the node keeps only its own
 * record (its stamp), with the origin's commit time and origin. */
typedef struct repl_probe {
    node_ctx *n;
    bool failed;
    loop_job *job;
    sto_mut muts[2];
    sto_row_mut row;
    uint8_t qual[NODE_CS_QUALIFIER_LEN];
} repl_probe;

static void repl_done(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)n;
    (void)msg;
    repl_probe *p = arg;
    p->failed = p->failed || code != ST_OK;
    job_finish(p->job);
}

static void repl_write(loop_job *j) {
    repl_probe *p = j->arg;
    p->job = j;
    st_put_be64(p->qual, 5000); /* the origin's stamp */
    memset(p->qual + 8, 0, 4);
    p->muts[0] = tu_set_mut("f", "y", 1000, "v");
    p->muts[1] = (sto_mut){.type = STO_MUT_SET_CELL,
                           .family = st_slice_make(NODE_CS_FAMILY, NODE_CS_FAMILY_LEN),
                           .qualifier = st_slice_make(p->qual, sizeof p->qual),
                           .ts_us = 5000,
                           .value = st_slice_cstr("foreign")};
    st_err err = {0};
    uint64_t id = 0;
    node_tablet *tab = node_write_tablet(p->n, TBL("r"), st_slice_cstr("y1"), &err);
    if (tab)
        id = tab->id;
    p->row = (sto_row_mut){.tablet_id = id,
                           .row = st_slice_cstr("y1"),
                           .muts = p->muts,
                           .n_muts = 2,
                           .version = STO_VERSION(4000, 7),
                           .commit_ts_us = 4000,
                           .origin = 7,
                           .flags = STO_ROW_REPLICATED};
    if (!tab || node_write(p->n, &p->row, 1, &err, repl_done, p) != ST_OK) {
        p->failed = true;
        job_finish(j);
    }
}

static void test_cs_replicated_rows(void **state) {
    (void)state;
    repl_probe p = {.n = S.node};
    on_loop(repl_write, &p);
    assert_false(p.failed);
    rec r[RECS_MAX];
    assert_int_equal(records(&S, TBL("r"), "y1", r), 1);
    assert_true(r[0].stamp > 5000);
    assert_int_equal(r[0].commit_ts, 4000);
    assert_int_equal(r[0].origin, 7);
    assert_int_equal(r[0].flags, 0);
    assert_int_equal(r[0].n_muts, 1);
    assert_string_equal(r[0].fams[0], "f");
}

/* A replicated DeleteFromFamily with a version below a cell of its row (written here before it
 * arrived) leaves that cell; its record puts it back after the delete, so the records applied in
 * order give the row's cells. Row d1: the newer write is durable (read from storage); row d2: it
 * is still in flight when the delete is prepared (the writes in flight). */
typedef struct rdel_probe {
    node_ctx *n;
    const char *row;
    bool failed, in_flight;
    int pending;
    loop_job *job;
    sto_mut set, del, old;
    sto_row_mut local, repl, before;
} rdel_probe;

static void rdel_done(node_ctx *n, st_code code, const char *msg, void *arg) {
    (void)n;
    (void)msg;
    rdel_probe *p = arg;
    p->failed = p->failed || code != ST_OK;
    if (--p->pending == 0)
        job_finish(p->job);
}

static void rdel_send(rdel_probe *p, const sto_row_mut *row) {
    st_err err = {0};
    p->pending++;
    if (node_write(p->n, row, 1, &err, rdel_done, p) != ST_OK) {
        p->failed = true;
        if (--p->pending == 0)
            job_finish(p->job);
    }
}

static void rdel_job(loop_job *j) {
    rdel_probe *p = j->arg;
    p->job = j;
    p->pending = 1; /* this job's own share, released below */
    st_err err = {0};
    node_tablet *tab = node_write_tablet(p->n, TBL("r"), st_slice_cstr(p->row), &err);
    uint64_t id = tab ? tab->id : 0;
    p->set = tu_set_mut("f", "new", 2000, "N");
    p->del = (sto_mut){.type = STO_MUT_DEL_FAMILY, .family = st_slice_cstr("f")};
    uint64_t v = node_next_version(p->n);
    p->local = (sto_row_mut){.tablet_id = id,
                             .row = st_slice_cstr(p->row),
                             .muts = &p->set,
                             .n_muts = 1,
                             .version = v,
                             .commit_ts_us = STO_VERSION_TS_US(v)};
    /* committed on cluster 7 long before the local write */
    p->repl = (sto_row_mut){.tablet_id = id,
                            .row = st_slice_cstr(p->row),
                            .muts = &p->del,
                            .n_muts = 1,
                            .version = STO_VERSION(3000, 7),
                            .commit_ts_us = 3000,
                            .origin = 7,
                            .flags = STO_ROW_REPLICATED};
    rdel_send(p, &p->local);
    if (p->in_flight) /* else it comes in a later job, once the local write is durable */
        rdel_send(p, &p->repl);
    rdel_done(p->n, ST_OK, NULL, p);
}

static void rdel_repl_job(loop_job *j) {
    rdel_probe *p = j->arg;
    p->job = j;
    p->pending = 1;
    rdel_send(p, &p->repl);
    rdel_done(p->n, ST_OK, NULL, p);
}

/* A cell of cluster 7 older than the delete, which the delete removes. */
static void rdel_old_job(loop_job *j) {
    rdel_probe *p = j->arg;
    p->job = j;
    p->pending = 1;
    st_err err = {0};
    node_tablet *tab = node_write_tablet(p->n, TBL("r"), st_slice_cstr(p->row), &err);
    p->old = tu_set_mut("f", "old", 1000, "O");
    p->before = (sto_row_mut){.tablet_id = tab ? tab->id : 0,
                              .row = st_slice_cstr(p->row),
                              .muts = &p->old,
                              .n_muts = 1,
                              .version = STO_VERSION(1000, 7),
                              .commit_ts_us = 1000,
                              .origin = 7,
                              .flags = STO_ROW_REPLICATED};
    rdel_send(p, &p->before);
    rdel_done(p->n, ST_OK, NULL, p);
}

static void test_cs_replicated_delete_keeps_newer(void **state) {
    (void)state;
    const char *rows[] = {"d1", "d2"};
    for (int k = 0; k < 2; k++) {
        rdel_probe p = {.n = S.node, .row = rows[k], .in_flight = k == 1};
        on_loop(rdel_old_job, &p);
        on_loop(rdel_job, &p);
        if (!p.in_flight)
            on_loop(rdel_repl_job, &p);
        assert_false(p.failed);
        rec r[RECS_MAX];
        assert_int_equal(records(&S, TBL("r"), rows[k], r), 3);
        assert_int_equal(r[2].origin, 7);
        assert_int_equal(r[2].commit_ts, 3000);
        assert_int_equal(r[2].n_muts, 2); /* the delete, then the cell it left */
        assert_int_equal(r[2].types[0], STO_MUT_DEL_FAMILY);
        assert_string_equal(r[2].fams[0], "f");
        assert_int_equal(r[2].types[1], STO_MUT_SET_CELL);
        assert_string_equal(r[2].fams[1], "f");
        assert_int_equal(user_cells(&S, TBL("r"), rows[k]), 1); /* f:new only */
    }
}

/* The rows storage gets: each recorded row's record cell comes first (its system family sorts
 * before the row's user cells, so rows written in key order append to the memtable), followed by
 * the row's own mutations in their order. */
typedef struct order_probe {
    node_ctx *n;
    bool failed, record_first, user_order;
    size_t n_muts;
} order_probe;

static void order_job(loop_job *j) {
    order_probe *p = j->arg;
    st_err err = {0};
    node_tablet *tab = node_write_tablet(p->n, TBL("r"), st_slice_cstr("o1"), &err);
    sto_mut muts[2] = {tu_set_mut("f", "a", 1000, "v1"), tu_set_mut("f", "b", 1000, "v2")};
    sto_row_mut row = {.tablet_id = tab ? tab->id : 0,
                       .row = st_slice_cstr("o1"),
                       .muts = muts,
                       .n_muts = 2,
                       .version = STO_VERSION(1000, 1),
                       .commit_ts_us = 1000};
    const sto_row_mut *out = NULL;
    node_cs_write *w = NULL;
    p->failed = !tab ||
                node_cs_write_prepare(p->n, &row, 1, NODE_WRITE_RECORD, &out, &w, &err) != ST_OK ||
                !w;
    if (!p->failed) {
        p->n_muts = out[0].n_muts;
        st_slice fam = out[0].muts[0].family;
        p->record_first = fam.len == NODE_CS_FAMILY_LEN &&
                          memcmp(fam.data, NODE_CS_FAMILY, NODE_CS_FAMILY_LEN) == 0;
        p->user_order = out[0].n_muts == 3 &&
                        st_slice_eq(out[0].muts[1].qualifier, st_slice_cstr("a")) &&
                        st_slice_eq(out[0].muts[2].qualifier, st_slice_cstr("b"));
        node_cs_write_abort(p->n, w); /* never started: storage does not get it */
    }
    job_finish(j);
}

static void test_cs_record_cell_first(void **state) {
    (void)state;
    order_probe p = {.n = S.node};
    on_loop(order_job, &p);
    assert_false(p.failed);
    assert_int_equal(p.n_muts, 3);
    assert_true(p.record_first);
    assert_true(p.user_order);
}

/* ---- ring eviction (node R, 4 KiB ring) ---- */

typedef struct ring_probe {
    int64_t after, upto;
    node_cs_ring_rc rc;
    char rows[32][8];
    size_t n;
} ring_probe;

static bool ring_collect(const node_cs_rec *cr, void *arg) {
    ring_probe *p = arg;
    if (p->n < 32)
        snprintf(p->rows[p->n++], sizeof p->rows[0], "%.*s", (int)cr->row.len,
                 (const char *)cr->row.data);
    return true;
}

static void ring_scan_job(loop_job *j) {
    ring_probe *p = j->arg;
    p->upto = node_cs_resolved(R.node);
    p->rc = node_cs_ring_scan(R.node, TBL("ring"), st_slice_make("", 0), st_slice_make("", 0),
                              p->after, p->upto, ring_collect, p);
    job_finish(j);
}

static ring_probe ring_scan(int64_t after) {
    ring_probe p = {.after = after};
    on_loop(ring_scan_job, &p);
    return p;
}

static void test_cs_ring_eviction(void **state) {
    (void)state;
    static const char *const F[] = {"f", NULL};
    create_table(&R, "ring", F, 0, DAY_S);
    char value[501];
    memset(value, 'v', 500);
    value[500] = 0;
    readers_add(&R, 1);
    for (int i = 0; i < 20; i++) { /* about 3 laps of the ring */
        char key[8];
        snprintf(key, sizeof key, "w%02d", i);
        assert_int_equal(put(&R, TBL("ring"), key, "f", "a", value, 1000), ST_OK);
    }
    rec r[RECS_MAX];
    assert_int_equal(records(&R, TBL("ring"), "w", r), 20);
    /* The newest records are in the ring, in order; older ones were evicted. */
    ring_probe p = ring_scan(r[16].stamp);
    assert_int_equal(p.rc, NODE_CS_RING_OK);
    assert_int_equal(p.n, 3);
    assert_string_equal(p.rows[0], "w17");
    assert_string_equal(p.rows[2], "w19");
    assert_int_equal(ring_scan(r[2].stamp).rc, NODE_CS_RING_MISS);
    /* A record larger than the ring is never kept: readers from before it go to storage. */
    char big[SMALL_RING_BYTES + 100];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(put(&R, TBL("ring"), "x0", "f", "a", big, 1000), ST_OK);
    assert_int_equal(put(&R, TBL("ring"), "x1", "f", "a", "small", 1000), ST_OK);
    assert_int_equal(records(&R, TBL("ring"), "x", r), 2);
    assert_int_equal(ring_scan(r[0].stamp - 1).rc, NODE_CS_RING_MISS);
    p = ring_scan(r[0].stamp);
    assert_int_equal(p.rc, NODE_CS_RING_OK);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.rows[0], "x1");
    readers_add(&R, -1);
}

/* ---- moves ---- */

static uint64_t create_tablet(const node_env *e, const char *table) {
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = (char *)table;
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    assert_int_equal(call(e, IN "CreateTablet", &req.base, &resp, &status), ST_OK);
    Strata__Internal__V1__Tablet *t =
        strata__internal__v1__tablet__unpack(NULL, resp.len, resp.data);
    uint64_t id = t->id;
    strata__internal__v1__tablet__free_unpacked(t, NULL);
    st_buf_free(&resp);
    return id;
}

static void test_cs_move(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, TBL("m"), FG, 0, 2 * DAY_S);
    Strata__Internal__V1__PutTableRequest pt;
    strata__internal__v1__put_table_request__init(&pt);
    pt.table = &tb.t;
    st_err status;
    assert_int_equal(call(&A, IN "PutTable", &pt.base, NULL, &status), ST_OK);
    uint64_t id = create_tablet(&A, TBL("m"));
    for (int i = 0; i < 5; i++) {
        char key[8];
        snprintf(key, sizeof key, "m%d", i);
        assert_int_equal(put(&A, TBL("m"), key, "f", "a", "v", 1000), ST_OK);
    }
    assert_int_equal(delete_row(&A, TBL("m"), "m0"), ST_OK);
    rec src[RECS_MAX], dst[RECS_MAX];
    size_t n_src = records(&A, TBL("m"), "", src);
    assert_int_equal(n_src, 6);
    Strata__Internal__V1__MoveTabletRequest mv;
    strata__internal__v1__move_tablet_request__init(&mv);
    mv.id = id;
    mv.target = B.addr;
    assert_int_equal(call(&A, IN "MoveTablet", &mv.base, NULL, &status), ST_OK);
    assert_int_equal(get_retention(&B, TBL("m")), 2 * DAY_S);
    /* The history arrived as it was: no record for the copies. */
    assert_int_equal(records(&B, TBL("m"), "", dst), n_src);
    for (size_t i = 0; i < n_src; i++) {
        assert_int_equal(dst[i].stamp, src[i].stamp);
        assert_string_equal(dst[i].row, src[i].row);
        assert_int_equal(dst[i].n_muts, src[i].n_muts);
    }
    /* A write on the target sorts after everything copied. */
    assert_int_equal(put(&B, TBL("m"), "m9", "f", "a", "v", 1000), ST_OK);
    assert_int_equal(records(&B, TBL("m"), "", dst), n_src + 1);
    assert_string_equal(dst[n_src].row, "m9");
    assert_true(dst[n_src].stamp > src[n_src - 1].stamp);
}

/* ---- kill -9 ---- */

static node_env K; /* opened in main from the killed process's data */

static void test_cs_survives_kill(void **state) {
    (void)state;
    rec r[RECS_MAX];
    assert_int_equal(records(&K, TBL("k"), "", r), 3);
    assert_string_equal(r[0].row, "k1");
    assert_string_equal(r[1].row, "k2");
    assert_string_equal(r[2].row, "k1");
    assert_int_equal(r[2].types[0], STO_MUT_DEL_FAMILY);
    assert_int_equal(user_cells(&K, TBL("k"), ""), 1);
    /* Stamps made after the restart are above the ones before it. */
    assert_int_equal(put(&K, TBL("k"), "k3", "f", "a", "v", 1000), ST_OK);
    assert_int_equal(records(&K, TBL("k"), "", r), 4);
    assert_string_equal(r[3].row, "k3");
}

/* ---- harness ---- */

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cs_update_table),
        cmocka_unit_test(test_cs_records_per_method),
        cmocka_unit_test(test_cs_history_survives_compaction),
        cmocka_unit_test(test_cs_drop_row_range),
        cmocka_unit_test(test_cs_gc_records),
        cmocka_unit_test(test_cs_resolved_and_ring),
        cmocka_unit_test(test_cs_replicated_rows),
        cmocka_unit_test(test_cs_replicated_delete_keeps_newer),
        cmocka_unit_test(test_cs_record_cell_first),
        cmocka_unit_test(test_cs_ring_eviction),
        cmocka_unit_test(test_cs_move),
        cmocka_unit_test(test_cs_survives_kill),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(g_base);
    return NULL;
}

static void open_node_at(node_env *e, uint32_t num, bool sync) {
    node_opts o;
    node_opts_default(&o);
    o.data_dir = e->dir;
    o.listen_port = 0;
    o.sync = sync;
    o.node_num = num;
    o.cluster_num = num ? 3 : 0;
    st_err err;
    if (node_open(g_base, &o, &e->node, &err) != ST_OK) {
        fprintf(stderr, "node_open: %s\n", err.msg);
        exit(1);
    }
    snprintf(e->addr, sizeof e->addr, "127.0.0.1:%u", node_port(e->node));
}

static void open_node(node_env *e, const char *name, uint32_t num) {
    tu_tmpdir(e->dir, sizeof e->dir, name);
    open_node_at(e, num, false);
}

/* The child: a node with sync on, a table with streams on, three acknowledged writes; then it
 * tells the parent and waits to be killed. */
static int g_pipe[2];

static void *child_client(void *arg) {
    node_env *e = arg;
    static const char *const F[] = {"f", NULL};
    create_table(e, "k", F, 0, DAY_S);
    if (put(e, TBL("k"), "k1", "f", "a", "v", 1000) != ST_OK ||
        put(e, TBL("k"), "k2", "f", "a", "v", 1000) != ST_OK ||
        delete_row(e, TBL("k"), "k1") != ST_OK)
        _exit(3);
    if (write(g_pipe[1], "x", 1) != 1)
        _exit(4);
    for (;;)
        pause();
    return NULL;
}

static void child_main(const char *dir) {
    g_base = event_base_new();
    node_env e;
    snprintf(e.dir, sizeof e.dir, "%s", dir);
    open_node_at(&e, 0, true);
    pthread_t th;
    pthread_create(&th, NULL, child_client, &e);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    _exit(5);
}

/* Runs the child, kills it with SIGKILL once its writes are acknowledged. */
static void run_and_kill(const char *dir) {
    if (pipe(g_pipe) != 0)
        exit(1);
    pid_t pid = fork();
    if (pid == 0)
        child_main(dir);
    char c;
    if (read(g_pipe[0], &c, 1) != 1) {
        fprintf(stderr, "the child node failed before its writes were acknowledged\n");
        exit(1);
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    close(g_pipe[0]);
    close(g_pipe[1]);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    tu_tmpdir(K.dir, sizeof K.dir, "cs_killed");
    run_and_kill(K.dir);
    g_base = event_base_new();
    open_node_at(&K, 0, false);
    open_node(&S, "cs_s", 0);
    open_node(&A, "cs_a", 1);
    open_node(&B, "cs_b", 2);
    open_node(&R, "cs_r", 0);
    node_cs_set_ring_bytes(R.node, SMALL_RING_BYTES); /* no record yet: main thread is fine */
    pthread_t th;
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(S.node);
    node_close(A.node);
    node_close(B.node);
    node_close(K.node);
    node_close(R.node);
    event_base_free(g_base);
    tu_rmrf(S.dir);
    tu_rmrf(A.dir);
    tu_rmrf(B.dir);
    tu_rmrf(K.dir);
    tu_rmrf(R.dir);
    return g_failures;
}
