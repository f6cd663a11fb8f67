/*
 * Proves DropRowRange runs its storage work off the node's loop thread: a standalone node runs on
 * an event_base on the main thread and a client thread talks gRPC to it. A job hook holds the
 * drop's worker thread; while it is held the loop must still answer a MutateRow and a ReadRows
 * (the rows to be dropped are still there), and once released the call answers OK with only the
 * rows outside the prefix left. Before the drop ran on a job the call answered without any job
 * (the whole scan and its durable writes held the loop), which this test reports as a failure.
 * With change streams on, DropRowRange deletes batch by batch on the loop: checked across
 * batches, tablets and the end of the prefix, and for a whole table. DeleteTable drops its
 * tablets from storage on a job as well.
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

#include "btclient.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "node_internal.h"
#include "strata/internal/v1/node.pb-c.h"
#include "sto_test_util.h"
#include "strata/node.h"
#include "strata/rpc.h"

#define PARENT "projects/p/instances/i"
#define TABLE PARENT "/tables/t"
#define TIMEOUT_MS 60000
#define ADMIN "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BT "/google.bigtable.v2.Bigtable/"
#define CS_ROWS 700 /* rows dropped with change streams on: batches of 256 over two tablets */

static struct event_base *g_base;
static node_ctx *g_node;
static char g_addr[64], g_dir[512];

/* ---- the job gate: entered by the job's thread, released by the test ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_entered, g_released, g_answered;

static void hold_job(void) {
    pthread_mutex_lock(&g_mu);
    g_entered = true;
    pthread_cond_broadcast(&g_cv);
    while (!g_released)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* ---- RPC helpers ---- */

static st_code unary(const char *path, const ProtobufCMessage *req, st_err *status) {
    return bt_call_pb(g_addr, path, req, TIMEOUT_MS, NULL, status);
}

/* A table with families f and g, split at split (NULL: one tablet), change streams kept
 * retention_s. */
static void create_table(const char *id, const char *split, int64_t retention_s) {
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry fam[2];
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *fams[2] = {&fam[0], &fam[1]};
    for (int i = 0; i < 2; i++) {
        google__bigtable__admin__v2__table__column_families_entry__init(&fam[i]);
        fam[i].key = i ? "g" : "f";
        fam[i].value = &cf;
    }
    Google__Bigtable__Admin__V2__Table table;
    google__bigtable__admin__v2__table__init(&table);
    table.n_column_families = 2;
    table.column_families = fams;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cs;
    Google__Protobuf__Duration d;
    if (retention_s) {
        google__bigtable__admin__v2__change_stream_config__init(&cs);
        google__protobuf__duration__init(&d);
        d.seconds = retention_s;
        cs.retention_period = &d;
        table.change_stream_config = &cs;
    }
    Google__Bigtable__Admin__V2__CreateTableRequest__Split sp;
    google__bigtable__admin__v2__create_table_request__split__init(&sp);
    Google__Bigtable__Admin__V2__CreateTableRequest__Split *splits[1] = {&sp};
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = PARENT;
    req.table_id = (char *)id;
    req.table = &table;
    if (split) {
        sp.key = (ProtobufCBinaryData){strlen(split), (uint8_t *)split};
        req.n_initial_splits = 1;
        req.initial_splits = splits;
    }
    st_err status;
    assert_int_equal(unary(ADMIN "CreateTable", &req.base, &status), ST_OK);
}

static void mutate_cell(const char *table, const char *key, const char *family) {
    Google__Bigtable__V2__Mutation__SetCell sc;
    google__bigtable__v2__mutation__set_cell__init(&sc);
    sc.family_name = (char *)family;
    sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc.timestamp_micros = -1;
    sc.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    Google__Bigtable__V2__Mutation m;
    google__bigtable__v2__mutation__init(&m);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &sc;
    Google__Bigtable__V2__Mutation *ms[1] = {&m};
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = ms;
    st_err status;
    assert_int_equal(unary(BT "MutateRow", &req.base, &status), ST_OK);
}

static void mutate_row(const char *table, const char *key) {
    mutate_cell(table, key, "f");
}

typedef struct counts {
    size_t rows, cells;
} counts;

static void count_chunks(st_slice msg, void *arg) {
    counts *c = arg;
    Google__Bigtable__V2__ReadRowsResponse *r =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(r);
    for (size_t i = 0; i < r->n_chunks; i++) {
        c->cells += r->chunks[i]->qualifier != NULL; /* every cell here is one chunk */
        c->rows += r->chunks[i]->row_status_case ==
                   GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    }
    google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
}

/* The rows and cells of a full scan of table. */
static counts count_all(const char *table) {
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = (char *)table;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&req.base, buf);
    counts c = {0, 0};
    st_err status;
    assert_int_equal(rpc_blocking_stream(g_addr, NULL, BT "ReadRows", st_slice_make(buf, len), NULL,
                                         0, TIMEOUT_MS, count_chunks, &c, &status),
                     ST_OK);
    free(buf);
    return c;
}

static size_t count_rows(const char *table) {
    return count_all(table).rows;
}

static size_t count_cells(const char *table) {
    return count_all(table).cells;
}

/* DropRowRange of the rows starting with prefix ("": every row). */
static st_code drop_rows(const char *table, const char *prefix) {
    Google__Bigtable__Admin__V2__DropRowRangeRequest req;
    google__bigtable__admin__v2__drop_row_range_request__init(&req);
    req.name = (char *)table;
    if (prefix[0]) {
        req.target_case =
            GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_ROW_KEY_PREFIX;
        req.row_key_prefix = (ProtobufCBinaryData){strlen(prefix), (uint8_t *)prefix};
    } else {
        req.target_case =
            GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_DELETE_ALL_DATA_FROM_TABLE;
        req.delete_all_data_from_table = true;
    }
    st_err status;
    return unary(ADMIN "DropRowRange", &req.base, &status);
}

/* ModifyColumnFamilies: creates family of table, or with drop set drops it. */
static st_code modify_family(const char *table, const char *family, bool drop) {
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification m;
    google__bigtable__admin__v2__modify_column_families_request__modification__init(&m);
    m.id = (char *)family;
    if (drop) {
        m.mod_case =
            GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_DROP;
        m.drop = true;
    } else {
        m.mod_case =
            GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE;
        m.create = &cf;
    }
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification *ms[1] = {&m};
    Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest req;
    google__bigtable__admin__v2__modify_column_families_request__init(&req);
    req.name = (char *)table;
    req.n_modifications = 1;
    req.modifications = ms;
    st_err status;
    return unary(ADMIN "ModifyColumnFamilies", &req.base, &status);
}

/* PutTable (internal service) giving table the one family f: g is dropped with its cells. */
static st_code put_table_f_only(const char *table) {
    st_err status;
    return bt_node_put_table(g_addr, table, "f", 0, TIMEOUT_MS, &status);
}

/* ---- holding a job while the loop is checked ---- */

typedef struct held_call {
    st_code (*fn)(const char *table);
    const char *table;
    st_code rc;
} held_call;

static void *held_main(void *arg) {
    held_call *h = arg;
    h->rc = h->fn(h->table);
    pthread_mutex_lock(&g_mu);
    g_answered = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* Starts h on a thread with jobs held; true once a job holds (the call has not answered), false
 * when the call answered without a job (its work ran on the loop thread). */
static bool held_start(held_call *h, pthread_t *th) {
    g_entered = g_released = g_answered = false;
    node_job_test_hook = hold_job;
    pthread_create(th, NULL, held_main, h);
    pthread_mutex_lock(&g_mu);
    while (!g_entered && !g_answered)
        pthread_cond_wait(&g_cv, &g_mu);
    bool on_job = g_entered && !g_answered;
    pthread_mutex_unlock(&g_mu);
    return on_job;
}

static void held_end(pthread_t th) {
    pthread_mutex_lock(&g_mu);
    g_released = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(th, NULL);
    node_job_test_hook = NULL;
}

static st_code drop_prefix_a(const char *table) {
    return drop_rows(table, "a");
}

/* ---- the tests ---- */

static void test_drop_row_range_leaves_the_loop_free(void **state) {
    (void)state;
    create_table("t", NULL, 0);
    const char *rows[] = {"a1", "a2", "a3", "b1"};
    for (size_t i = 0; i < 4; i++)
        mutate_row(TABLE, rows[i]);
    held_call h = {.fn = drop_prefix_a, .table = TABLE};
    pthread_t th;
    bool on_job = held_start(&h, &th);
    if (on_job) { /* the drop is held on its thread: the loop still serves writes and reads */
        mutate_row(TABLE, "b2");
        assert_int_equal(count_rows(TABLE), 5);
    }
    held_end(th);
    assert_true(on_job); /* else DropRowRange did its scan and writes on the loop thread */
    assert_int_equal(h.rc, ST_OK);
    assert_int_equal(count_rows(TABLE), on_job ? 2 : 1); /* b1 (and b2) */
}

static st_code drop_family_g(const char *table) {
    return modify_family(table, "g", true);
}

/* Dropping a family deletes its cells on a job (ModifyColumnFamilies, then PutTable as a router
 * sends it): meanwhile the loop takes writes; afterwards a family of that name created again is
 * empty. */
static void test_drop_family_leaves_the_loop_free(void **state) {
    (void)state;
    const char *table = PARENT "/tables/fam";
    create_table("fam", NULL, 0);
    const char *rows[] = {"r1", "r2", "r3"};
    for (size_t i = 0; i < 3; i++) {
        mutate_cell(table, rows[i], "f");
        mutate_cell(table, rows[i], "g");
    }
    assert_int_equal(count_cells(table), 6);
    held_call h = {.fn = drop_family_g, .table = table};
    pthread_t th;
    bool on_job = held_start(&h, &th);
    if (on_job)
        mutate_cell(table, "r4", "f");
    held_end(th);
    assert_true(on_job); /* else the purge scanned and wrote on the loop thread */
    assert_int_equal(h.rc, ST_OK);
    assert_int_equal(modify_family(table, "g", false), ST_OK);
    assert_int_equal(count_cells(table), 4); /* f of r1-r4 */

    mutate_cell(table, "r1", "g");
    h = (held_call){.fn = put_table_f_only, .table = table};
    on_job = held_start(&h, &th);
    if (on_job)
        mutate_cell(table, "r5", "f");
    held_end(th);
    assert_true(on_job);
    assert_int_equal(h.rc, ST_OK);
    assert_int_equal(modify_family(table, "g", false), ST_OK);
    assert_int_equal(count_cells(table), 5); /* f of r1-r5 */
}

/* With change streams on, the rows go batch by batch through the write path, each batch
 * scanning on from where the last stopped: across batches, tablets and the prefix's end. */
static void test_drop_row_range_in_batches(void **state) {
    (void)state;
    const char *table = PARENT "/tables/cs";
    create_table("cs", "k300", 86400);
    char key[16];
    for (int i = 0; i < CS_ROWS; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        mutate_row(table, key);
    }
    mutate_row(table, "a");
    mutate_row(table, "m");
    assert_int_equal(drop_rows(table, "k"), ST_OK);
    assert_int_equal(count_rows(table), 2);
    assert_int_equal(drop_rows(table, "k"), ST_OK); /* nothing left to drop */
    assert_int_equal(drop_rows(table, ""), ST_OK);
    assert_int_equal(count_rows(table), 0);
}

static st_code delete_table(const char *table) {
    Google__Bigtable__Admin__V2__DeleteTableRequest req;
    google__bigtable__admin__v2__delete_table_request__init(&req);
    req.name = (char *)table;
    st_err status;
    return unary(ADMIN "DeleteTable", &req.base, &status);
}

/* DeleteTable drops its tablets from storage on a job (a drop waits for a running flush of the
 * tablet): meanwhile the loop serves another table, and the deleted one is gone at once. */
static void test_delete_table_leaves_the_loop_free(void **state) {
    (void)state;
    const char *gone = PARENT "/tables/gone", *kept = PARENT "/tables/kept";
    create_table("gone", "m", 0);
    create_table("kept", NULL, 0);
    mutate_row(gone, "a");
    mutate_row(gone, "z");
    mutate_row(kept, "a");
    held_call h = {.fn = delete_table, .table = gone};
    pthread_t th;
    bool on_job = held_start(&h, &th);
    if (on_job) {
        mutate_row(kept, "b");
        assert_int_equal(count_rows(kept), 2);
        assert_int_equal(delete_table(gone), ST_NOT_FOUND); /* out of the catalog already */
    }
    held_end(th);
    assert_true(on_job); /* else the tablets were dropped on the loop thread */
    assert_int_equal(h.rc, ST_OK);
    create_table("gone", NULL, 0); /* the name is free: a new, empty table */
    assert_int_equal(count_rows(gone), 0);
    assert_int_equal(count_rows(kept), 2);
}

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drop_row_range_leaves_the_loop_free),
        cmocka_unit_test(test_drop_row_range_in_batches),
        cmocka_unit_test(test_drop_family_leaves_the_loop_free),
        cmocka_unit_test(test_delete_table_leaves_the_loop_free),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(g_base);
    return NULL;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as strata-node's main does: a client hanging up is not fatal */
    evthread_use_pthreads();
    tu_tmpdir(g_dir, sizeof g_dir, "offloop");
    g_base = event_base_new();
    node_opts o;
    node_opts_default(&o);
    o.data_dir = g_dir;
    o.listen_port = 0;
    o.sync = false;
    st_err err;
    if (node_open(g_base, &o, &g_node, &err) != ST_OK) {
        fprintf(stderr, "node_open: %s\n", err.msg);
        return 1;
    }
    snprintf(g_addr, sizeof g_addr, "127.0.0.1:%u", node_port(g_node));
    pthread_t th;
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(g_node);
    event_base_free(g_base);
    tu_rmrf(g_dir);
    return g_failures;
}
