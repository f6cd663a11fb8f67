/*
 * Proves that a DropRowRange on a table without change streams and a tablet move of the same
 * table exclude each other on a node (node/admin.c, node/move.c): two in-process cluster members
 * (S: node 1, the source; T: node 2, the target) share one event_base on the main thread, the
 * tests run on a client thread. Without streams the drop deletes on a job thread, below
 * node_write, so a move's drain of in-flight writes does not wait for it:
 *
 * - A move sent while the drop's job is held must not copy the tablet meanwhile: it waits for
 *   the job and copies no dropped row. Before, the move copied every row during the job and the
 *   target served them after the drop answered OK (100 of 100 rows).
 * - A drop sent while a move holds between its copy and the activation (S waits MOVE_HOLD_MS
 *   there) must answer only once the move ended: the tablet has left S then, and the copy's
 *   rows are the router's next round's (docs/cluster.md). Before, the drop answered at once
 *   with the tablet still moving and its copy, taken before, about to be activated.
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
#include <time.h>

#include "btclient.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "node_internal.h"
#include "sto_test_util.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/node.h"
#include "strata/rpc.h"

#define PARENT "projects/p/instances/i/tables/"
#define TIMEOUT_MS 60000
#define ADMIN "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BT "/google.bigtable.v2.Bigtable/"
#define IN "/strata.internal.v1.Node/"
#define ROWS 100
#define MOVE_HOLD_MS 1500 /* S between a move's copy and its activation (STRATA_TEST_MOVE) */
/* How long the first test gives a move to (wrongly) finish while the drop's job is held. Only
 * the old code's failure depends on it: the fixed move waits for the job however long this is. */
#define MOVE_GRACE_MS 4000

typedef struct node_env {
    node_ctx *node;
    char addr[64];
    char dir[512];
} node_env;

static struct event_base *g_base;
static node_env S, T;

/* ---- RPC helpers ---- */

static st_code call(const node_env *e, const char *path, const ProtobufCMessage *req, st_buf *resp,
                    st_err *status) {
    return bt_call_pb(e->addr, path, req, TIMEOUT_MS, resp, status);
}

/* Table name on S with family f (no change streams) and one tablet over every row: its id. */
static uint64_t table_on_s(const char *name) {
    st_err status;
    assert_int_equal(bt_node_put_table(S.addr, name, "f", 0, TIMEOUT_MS, &status), ST_OK);
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = (char *)name;
    Strata__Internal__V1__Tablet *t =
        (void *)bt_call_unpack(S.addr, IN "CreateTablet", &req.base,
                               &strata__internal__v1__tablet__descriptor, TIMEOUT_MS, &status);
    assert_non_null(t);
    uint64_t id = t->id;
    protobuf_c_message_free_unpacked(&t->base, NULL);
    return id;
}

/* ROWS rows of one cell each, written to table on S (a full name under PARENT). */
static void write_rows(const char *table) {
    bt_client c;
    bt_client_init(&c, S.addr);
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "f", ST_SLICE_LIT("q"), -1, ST_SLICE_LIT("v"));
    for (int i = 0; i < ROWS; i++) {
        char key[16];
        snprintf(key, sizeof key, "r%05d", i);
        st_err status;
        assert_int_equal(bt_mutate_row(&c, table + strlen(PARENT), st_slice_cstr(key), &m, &status),
                         ST_OK);
    }
    bt_muts_deinit(&m);
}

/* The rows of a full scan of table on node e. */
static size_t count_rows(const node_env *e, const char *table) {
    bt_client c;
    bt_client_init(&c, e->addr);
    bt_read_req req = {0};
    st_buf dump;
    st_buf_init(&dump);
    size_t rows = 0;
    st_err status;
    assert_int_equal(bt_read_dump(&c, table + strlen(PARENT), &req, &dump, &rows, &status), ST_OK);
    st_buf_free(&dump);
    return rows;
}

/* The tablets of table on node e: how many, how many moving away, how many incoming copies. */
typedef struct listed {
    size_t n, moving, incoming;
} listed;

static listed list(const node_env *e, const char *table) {
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    req.table_name = (char *)table;
    st_err status;
    Strata__Internal__V1__ListTabletsResponse *r = (void *)bt_call_unpack(
        e->addr, IN "ListTablets", &req.base,
        &strata__internal__v1__list_tablets_response__descriptor, TIMEOUT_MS, &status);
    assert_non_null(r);
    listed l = {0, 0, 0};
    for (size_t i = 0; i < r->n_tablets; i++) {
        l.n++;
        l.moving += r->tablets[i]->moving;
        l.incoming += r->tablets[i]->incoming;
    }
    strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    return l;
}

/* ---- calls on threads of their own; the gate holding jobs ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_entered, g_released;

static void hold_job(void) {
    pthread_mutex_lock(&g_mu);
    g_entered = true;
    pthread_cond_broadcast(&g_cv);
    while (!g_released)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

typedef struct bg_call {
    const char *table;
    uint64_t id; /* the tablet a move moves */
    st_code rc;
    bool done; /* under g_mu */
    pthread_t th;
} bg_call;

static void bg_finish(bg_call *b, st_code rc) {
    pthread_mutex_lock(&g_mu);
    b->rc = rc;
    b->done = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void *drop_main(void *arg) {
    bg_call *b = arg;
    Google__Bigtable__Admin__V2__DropRowRangeRequest req;
    google__bigtable__admin__v2__drop_row_range_request__init(&req);
    req.name = (char *)b->table;
    req.target_case =
        GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_DELETE_ALL_DATA_FROM_TABLE;
    req.delete_all_data_from_table = true;
    st_err status;
    bg_finish(b, call(&S, ADMIN "DropRowRange", &req.base, NULL, &status));
    return NULL;
}

static void *move_main(void *arg) {
    bg_call *b = arg;
    Strata__Internal__V1__MoveTabletRequest req;
    strata__internal__v1__move_tablet_request__init(&req);
    req.id = b->id;
    req.target = T.addr;
    st_err status;
    bg_finish(b, call(&S, IN "MoveTablet", &req.base, NULL, &status));
    return NULL;
}

/* Waits until b answered or ms passed; true when it answered. */
static bool answered_within(bg_call *b, int ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_mu);
    while (!b->done && pthread_cond_timedwait(&g_cv, &g_mu, &until) == 0)
        ;
    bool done = b->done;
    pthread_mutex_unlock(&g_mu);
    return done;
}

static void sleep_ms(int ms) {
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* ---- the tests ---- */

static void test_move_waits_for_the_drop_job(void **state) {
    (void)state;
    const char *table = PARENT "held_drop";
    uint64_t id = table_on_s(table);
    write_rows(table);
    bg_call drop = {.table = table}, move = {.table = table, .id = id};
    g_entered = g_released = false;
    node_job_test_hook = hold_job;
    pthread_create(&drop.th, NULL, drop_main, &drop);
    pthread_mutex_lock(&g_mu);
    while (!g_entered && !drop.done)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    assert_false(drop.done); /* the drop deletes on a job, held now */
    pthread_create(&move.th, NULL, move_main, &move);
    bool moved_meanwhile = answered_within(&move, MOVE_GRACE_MS);
    listed during = list(&T, table);
    pthread_mutex_lock(&g_mu);
    g_released = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(drop.th, NULL);
    pthread_join(move.th, NULL);
    node_job_test_hook = NULL;
    assert_int_equal(drop.rc, ST_OK);
    assert_int_equal(move.rc, ST_OK);
    size_t left = count_rows(&T, table);
    printf("move during the drop's job: answered %s the job; the target made its copy %s; "
           "%zu of %d rows on the target\n",
           moved_meanwhile ? "before the end of" : "after", during.n ? "meanwhile" : "after", left,
           ROWS);
    assert_false(moved_meanwhile);
    assert_int_equal(during.n, 0); /* not even an incoming copy while the job ran */
    assert_int_equal(left, 0);
    assert_int_equal(list(&S, table).n, 0);
    assert_int_equal(list(&T, table).n, 1);
}

static void test_drop_waits_for_the_move(void **state) {
    (void)state;
    const char *table = PARENT "held_move";
    uint64_t id = table_on_s(table);
    write_rows(table);
    bg_call move = {.table = table, .id = id};
    pthread_create(&move.th, NULL, move_main, &move);
    while (list(&T, table).incoming == 0 && !answered_within(&move, 0))
        sleep_ms(5);
    assert_false(answered_within(&move, 0)); /* it holds MOVE_HOLD_MS after the copy */
    bg_call drop = {.table = table};
    drop_main(&drop);
    listed at_answer = list(&S, table);
    bool move_ended = answered_within(&move, 0);
    pthread_join(move.th, NULL);
    printf("drop during a held move: answered %s the move's end; the source then listed %zu "
           "tablet(s), %zu moving\n",
           move_ended ? "after" : "before", at_answer.n, at_answer.moving);
    assert_int_equal(drop.rc, ST_OK);
    assert_int_equal(move.rc, ST_OK);
    assert_int_equal(at_answer.moving, 0);
    assert_int_equal(at_answer.n, 0);
    /* The copy was made before the drop ran on S: its rows are the router's next round's. */
    assert_int_equal(count_rows(&T, table), ROWS);
}

/* ---- harness: both nodes on the main thread's base, the tests on a client thread ---- */

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_move_waits_for_the_drop_job),
        cmocka_unit_test(test_drop_waits_for_the_move),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(g_base);
    return NULL;
}

static void open_node(node_env *e, const char *name, uint32_t num, const char *faults) {
    tu_tmpdir(e->dir, sizeof e->dir, name);
    node_opts o;
    node_opts_default(&o);
    o.data_dir = e->dir;
    o.listen_port = 0;
    o.sync = false;
    o.node_num = num;
    o.cluster_num = 3;
    st_err err;
    if (faults)
        setenv(NODE_MOVE_TEST_ENV, faults, 1);
    else
        unsetenv(NODE_MOVE_TEST_ENV);
    if (node_open(g_base, &o, &e->node, &err) != ST_OK) {
        fprintf(stderr, "node_open: %s\n", err.msg);
        exit(1);
    }
    unsetenv(NODE_MOVE_TEST_ENV);
    snprintf(e->addr, sizeof e->addr, "127.0.0.1:%u", node_port(e->node));
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as strata-node's main does: a client hanging up is not fatal */
    evthread_use_pthreads();
    g_base = event_base_new();
    char hold[32];
    snprintf(hold, sizeof hold, "hold_ms=%d", MOVE_HOLD_MS);
    open_node(&S, "drop_move_s", 1, hold);
    open_node(&T, "drop_move_t", 2, NULL);
    pthread_t th;
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(S.node);
    node_close(T.node);
    event_base_free(g_base);
    tu_rmrf(S.dir);
    tu_rmrf(T.dir);
    return g_failures;
}
