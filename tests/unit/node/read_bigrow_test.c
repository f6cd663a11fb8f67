/*
 * A row of many small cells is read in many turns of the node's loop, not in one piece: its
 * cells are scanned at most NODE_READ_TURN_CELLS per turn, and the complete row is encoded as
 * many per turn (node/read.c, row_emit). The node and the clients share one event_base on the
 * main thread and nothing is timed: a second client reads a one-cell row again and again while
 * the big row is read, and must be answered several times before the big read ends. When the
 * whole row was scanned in one turn (the cells of a memtable cost no block reads, which were
 * the only bound inside a row) the second client waited for all of it. Also that the row comes
 * back whole (one message, every cell, commit_row on the last), between the rows around it, and
 * that request stats count what was seen.
 *
 * To measure by hand: BIGROW_CELLS=N reads a row of N cells instead, and BIGROW_PORT=P uses the
 * node listening on 127.0.0.1:P (with an empty data directory) instead of one in the process, so
 * its log shows what the reads cost its loop without this process's clients sharing it.
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

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "btclient.h"
#include "read.h"
#include "sto_test_util.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"

#define TABLE "projects/p/instances/i/tables/t"
#define S(lit) ST_SLICE_LIT(lit)
#define TIMEOUT_MS 600000
/* The big row: enough cells for many turns of both kinds. */
#define BIG_CELLS (20 * NODE_READ_TURN_CELLS)
#define MUTATIONS_PER_CALL 100000

typedef struct env {
    struct event_base *base;
    node_ctx *node; /* NULL: the node at BIGROW_PORT */
    uint16_t port;
    char addr[64];
    char dir[512];
    int setup_failures;
    size_t cells;
} env;

static env E;

/* Cells first..first+n-1 of row "big": qualifier qNNNNNNNN, value "v". */
static st_code write_cells(const bt_client *bc, bt_muts *m, size_t first, size_t n) {
    bt_muts_reset(m);
    for (size_t i = 0; i < n; i++) {
        char q[16];
        snprintf(q, sizeof q, "q%08zu", first + i);
        bt_muts_set(m, "f", st_slice_cstr(q), 1000, S("v"));
    }
    return bt_mutate_row(bc, "t", S("big"), m, NULL);
}

/* Rows "a" and "c" with one cell "q" = "v", and "big" with E.cells cells. */
static void *setup_main(void *arg) {
    (void)arg;
    bt_client bc;
    bt_client_init(&bc, E.addr);
    bc.timeout_ms = TIMEOUT_MS;
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "f", S("q"), 1000, S("v"));
    st_code rc = bt_create_table(&bc, "t", "f", NULL);
    if (rc == ST_OK)
        rc = bt_mutate_row(&bc, "t", S("a"), &m, NULL);
    if (rc == ST_OK)
        rc = bt_mutate_row(&bc, "t", S("c"), &m, NULL);
    for (size_t i = 0; rc == ST_OK && i < E.cells; i += MUTATIONS_PER_CALL) {
        size_t n = E.cells - i < MUTATIONS_PER_CALL ? E.cells - i : MUTATIONS_PER_CALL;
        rc = write_cells(&bc, &m, i, n);
    }
    bt_muts_deinit(&m);
    if (rc != ST_OK)
        E.setup_failures++;
    event_base_loopbreak(E.base);
    return NULL;
}

/* ---- reads on the node's own loop ---- */

typedef struct read_opts {
    const char *key; /* one row; NULL: every row */
    const Google__Bigtable__V2__RowFilter *filter;
    int64_t rows_limit;
    bool stats;
} read_opts;

typedef struct reads {
    rpc_client *client, *probe_client;
    st_buf req, probe_req;
    size_t msgs, chunks, rows, commits_out_of_place;
    char keys[8][8]; /* row keys in the order read */
    int64_t cells_seen, cells_returned;
    bool done, probe;
    st_code code;
    size_t probes_done; /* the second client's reads answered while the big read went on */
    st_code probe_code;
} reads;

static void pack_request(st_buf *out, const read_opts *o) {
    ProtobufCBinaryData key = {o->key ? strlen(o->key) : 0, (uint8_t *)o->key};
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.n_row_keys = o->key ? 1 : 0;
    rs.row_keys = &key;
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = TABLE;
    req.rows = &rs;
    req.filter = (Google__Bigtable__V2__RowFilter *)o->filter;
    req.rows_limit = o->rows_limit;
    if (o->stats)
        req.request_stats_view =
            GOOGLE__BIGTABLE__V2__READ_ROWS_REQUEST__REQUEST_STATS_VIEW__REQUEST_STATS_FULL;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    assert_int_equal(st_buf_reserve(out, len), ST_OK);
    out->len = protobuf_c_message_pack(&req.base, out->data);
}

static void count_stats(reads *r, const Google__Bigtable__V2__RequestStats *st) {
    if (st == NULL ||
        st->stats_view_case != GOOGLE__BIGTABLE__V2__REQUEST_STATS__STATS_VIEW_FULL_READ_STATS_VIEW)
        return;
    const Google__Bigtable__V2__ReadIterationStats *it =
        st->full_read_stats_view->read_iteration_stats;
    r->cells_seen = it->cells_seen_count;
    r->cells_returned = it->cells_returned_count;
}

static void on_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    reads *r = arg;
    Google__Bigtable__V2__ReadRowsResponse *resp =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(resp);
    r->chunks += resp->n_chunks;
    for (size_t i = 0; i < resp->n_chunks; i++) {
        const Google__Bigtable__V2__ReadRowsResponse__CellChunk *c = resp->chunks[i];
        if (c->row_key.len && r->rows < 8)
            snprintf(r->keys[r->rows], sizeof r->keys[0], "%.*s", (int)c->row_key.len,
                     (const char *)c->row_key.data);
        bool commit =
            c->row_status_case ==
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW &&
            c->commit_row;
        /* a message ends with a whole row: commit_row on its last chunk, and on no chunk but
         * one a new row follows */
        bool last = i + 1 == resp->n_chunks;
        if (commit ? !(last || resp->chunks[i + 1]->row_key.len) : last)
            r->commits_out_of_place++;
        if (commit)
            r->rows++;
    }
    count_stats(r, resp->request_stats);
    google__bigtable__v2__read_rows_response__free_unpacked(resp, NULL);
    r->msgs++;
}

static void probe_done(rpc_ccall *call, st_code code, const char *message, void *arg);

/* The second client's next read of row "a", unless the big read is over. */
static void probe_next(reads *r) {
    if (r->done)
        return;
    assert_non_null(rpc_client_call(r->probe_client, "/google.bigtable.v2.Bigtable/ReadRows",
                                    st_buf_slice(&r->probe_req), NULL, 0, TIMEOUT_MS, NULL,
                                    probe_done, r));
}

static void probe_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    reads *r = arg;
    if (r->done) /* cancelled by rpc_client_free */
        return;
    if (code != ST_OK)
        r->probe_code = code;
    r->probes_done++;
    probe_next(r);
}

static void on_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    if (code != ST_OK)
        fprintf(stderr, "read: %s\n", message ? message : "");
    reads *r = arg;
    r->done = true;
    r->code = code;
    event_base_loopbreak(E.base);
}

/* Reads as o says; with probe, the second client reads row "a" over and over meanwhile. */
static void read_once(const read_opts *o, bool probe, reads *r) {
    memset(r, 0, sizeof *r);
    st_buf_init(&r->req);
    st_buf_init(&r->probe_req);
    pack_request(&r->req, o);
    read_opts po = {.key = "a"};
    pack_request(&r->probe_req, &po);
    st_err err;
    r->client = rpc_client_new(E.base, "127.0.0.1", E.port, NULL, &err);
    r->probe_client = rpc_client_new(E.base, "127.0.0.1", E.port, NULL, &err);
    assert_non_null(r->client);
    assert_non_null(r->probe_client);
    assert_non_null(rpc_client_call(r->client, "/google.bigtable.v2.Bigtable/ReadRows",
                                    st_buf_slice(&r->req), NULL, 0, TIMEOUT_MS, on_msg, on_done,
                                    r));
    if (probe)
        probe_next(r);
    int64_t start_us = st_mono_us();
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    print_message("%zu messages, %zu chunks, %zu rows in %lld ms; other client answered %zu "
                  "times\n",
                  r->msgs, r->chunks, r->rows, (long long)(st_mono_us() - start_us) / 1000,
                  r->probes_done);
    rpc_client_free(r->client);
    rpc_client_free(r->probe_client);
    event_base_loop(E.base, EVLOOP_NONBLOCK);
    st_buf_free(&r->req);
    st_buf_free(&r->probe_req);
}

/* The whole row in one message, while the other client is answered again and again. */
static void test_big_row_whole_while_others_served(void **state) {
    (void)state;
    read_opts o = {.key = "big"};
    reads r;
    read_once(&o, true, &r);
    assert_int_equal(r.code, ST_OK);
    assert_int_equal(r.probe_code, ST_OK);
    assert_int_equal(r.msgs, 1);
    assert_int_equal(r.rows, 1);
    assert_int_equal(r.chunks, E.cells);
    assert_int_equal(r.commits_out_of_place, 0);
    assert_true(r.probes_done >= 2);
}

/* A filter that keeps one cell: the row is scanned in turns of NODE_READ_TURN_CELLS cells (one
 * turn before), and what goes out is small, so the other client's answers are not the ones it
 * gets while a big message is on its way. */
static void test_big_row_scanned_in_turns(void **state) {
    (void)state;
    Google__Bigtable__V2__RowFilter f;
    google__bigtable__v2__row_filter__init(&f);
    f.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER;
    f.column_qualifier_regex_filter = (ProtobufCBinaryData){9, (uint8_t *)"q00000007"};
    read_opts o = {.key = "big", .filter = &f};
    reads r;
    read_once(&o, true, &r);
    assert_int_equal(r.code, ST_OK);
    assert_int_equal(r.probe_code, ST_OK);
    assert_int_equal(r.rows, 1);
    assert_int_equal(r.chunks, 1);
    /* one answer per few turns; the row takes E.cells / NODE_READ_TURN_CELLS of them */
    assert_true(r.probes_done >= E.cells / NODE_READ_TURN_CELLS / 5);
}

/* A row-level filter (its result encoded in parts as well). */
static void test_big_row_row_level_filter(void **state) {
    (void)state;
    Google__Bigtable__V2__RowFilter f;
    google__bigtable__v2__row_filter__init(&f);
    f.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    f.cells_per_column_limit_filter = 1;
    read_opts o = {.key = "big", .filter = &f};
    reads r;
    read_once(&o, true, &r);
    assert_int_equal(r.code, ST_OK);
    assert_int_equal(r.rows, 1);
    assert_int_equal(r.chunks, E.cells);
    assert_int_equal(r.commits_out_of_place, 0);
}

/* Rows before and after the big one come back in order, whole; the first cell of "c", read
 * before "big" went out, is not lost. Sending "big" fills the call's queue, so the read then
 * waits for its client with that cell in hand: it lets the iterator go and reads "c" again from
 * its start afterwards (read_release_storage), counted once in the stats. */
static void test_big_row_between_rows(void **state) {
    (void)state;
    read_opts o = {.stats = true};
    reads r;
    read_once(&o, false, &r);
    assert_int_equal(r.code, ST_OK);
    assert_int_equal(r.rows, 3);
    assert_string_equal(r.keys[0], "a");
    assert_string_equal(r.keys[1], "big");
    assert_string_equal(r.keys[2], "c");
    assert_int_equal(r.chunks, E.cells + 2);
    assert_int_equal(r.commits_out_of_place, 0);
    assert_int_equal(r.cells_seen, (int64_t)E.cells + 2);
    assert_int_equal(r.cells_returned, (int64_t)E.cells + 2);
}

/* rows_limit stops after "big": the first cell of "c" was read but is not counted as seen. */
static void test_big_row_rows_limit_stats(void **state) {
    (void)state;
    read_opts o = {.rows_limit = 2, .stats = true};
    reads r;
    read_once(&o, false, &r);
    assert_int_equal(r.code, ST_OK);
    assert_int_equal(r.rows, 2);
    assert_int_equal(r.cells_seen, (int64_t)E.cells + 1);
    assert_int_equal(r.cells_returned, (int64_t)E.cells + 1);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    const char *c = getenv("BIGROW_CELLS");
    E.cells = c ? (size_t)strtoull(c, NULL, 10) : BIG_CELLS;
    tu_tmpdir(E.dir, sizeof E.dir, "read_bigrow");
    E.base = event_base_new();
    const char *port = getenv("BIGROW_PORT");
    if (port) {
        E.port = (uint16_t)atoi(port);
    } else {
        node_opts o;
        node_opts_default(&o);
        o.data_dir = E.dir;
        o.listen_port = 0;
        o.sync = false;
        st_err err;
        if (node_open(E.base, &o, &E.node, &err) != ST_OK) {
            fprintf(stderr, "node_open: %s\n", err.msg);
            return 1;
        }
        E.port = node_port(E.node);
    }
    snprintf(E.addr, sizeof E.addr, "127.0.0.1:%u", E.port);
    pthread_t th;
    pthread_create(&th, NULL, setup_main, NULL);
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    int failures = E.setup_failures;
    if (failures == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_big_row_whole_while_others_served),
            cmocka_unit_test(test_big_row_scanned_in_turns),
            cmocka_unit_test(test_big_row_row_level_filter),
            cmocka_unit_test(test_big_row_between_rows),
            cmocka_unit_test(test_big_row_rows_limit_stats),
        };
        failures = cmocka_run_group_tests(tests, NULL, NULL);
    }
    if (E.node)
        node_close(E.node);
    event_base_free(E.base);
    tu_rmrf(E.dir);
    return failures;
}
