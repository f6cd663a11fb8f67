/*
 * Proves a long ReadRows leaves room for other clients even when it returns nothing: a row set
 * of one existing row followed by many ranges that hold no rows (each one a seek, no row or cell
 * to count) is read in turns bounded by ranges (NODE_READ_TURN_RANGES), and a point read from
 * another connection, sent once the long read's first row arrived, completes while the long read
 * is still going. The node and both clients share one event_base on the main thread, so the order
 * of events is deterministic: nothing is timed. Also that a read returning little but reading
 * much from disk (rows whose big cells a filter drops, each in its own SSTable block) ends its
 * turns on NODE_READ_TURN_BLOCK_BYTES, flushing the rows it has at each turn's end. Without the
 * bound, the whole row set would be read in one turn, and its first row would arrive only with its
 * end.
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
#include "read.h"
#include "sto_test_util.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"

#define TABLE "projects/p/instances/i/tables/t"
#define EMPTY_RANGES (40 * NODE_READ_TURN_RANGES)
#define TIMEOUT_MS 60000
/* Rows kNN with a small cell and a big compressible one, flushed to an SSTable. */
#define BIG_ROWS 40
#define BIG_CELL_BYTES ((size_t)1 << 20)

typedef struct env {
    struct event_base *base;
    node_ctx *node;
    char addr[64];
    char dir[512];
    int setup_failures;
} env;

static env E;

/* ---- setup through blocking calls, from a thread while the loop runs ---- */

static st_code unary(const char *path, const ProtobufCMessage *req) {
    st_err status;
    st_code rc = bt_call_pb(E.addr, path, req, TIMEOUT_MS, NULL, &status);
    if (rc != ST_OK)
        fprintf(stderr, "%s: %s\n", path, status.msg);
    return rc;
}

static st_code create_table(void) {
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry fam;
    google__bigtable__admin__v2__table__column_families_entry__init(&fam);
    fam.key = "f";
    fam.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *fams[1] = {&fam};
    Google__Bigtable__Admin__V2__Table table;
    google__bigtable__admin__v2__table__init(&table);
    table.n_column_families = 1;
    table.column_families = fams;
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = "projects/p/instances/i";
    req.table_id = "t";
    req.table = &table;
    return unary("/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable", &req.base);
}

static void set_cell(Google__Bigtable__V2__Mutation *m, Google__Bigtable__V2__Mutation__SetCell *sc,
                     const char *qual, const uint8_t *value, size_t len) {
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = "f";
    sc->column_qualifier = (ProtobufCBinaryData){strlen(qual), (uint8_t *)qual};
    sc->timestamp_micros = 1000;
    sc->value = (ProtobufCBinaryData){len, (uint8_t *)value};
    google__bigtable__v2__mutation__init(m);
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

/* Row key with a cell "q" = "value", and with big (may be NULL) a cell "big" = big. */
static st_code write_row(const char *key, const uint8_t *big) {
    Google__Bigtable__V2__Mutation__SetCell sc[2];
    Google__Bigtable__V2__Mutation m[2];
    Google__Bigtable__V2__Mutation *mp[2] = {&m[0], &m[1]};
    set_cell(&m[0], &sc[0], "q", (const uint8_t *)"value", 5);
    if (big)
        set_cell(&m[1], &sc[1], "big", big, BIG_CELL_BYTES);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = TABLE;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = big ? 2 : 1;
    req.mutations = mp;
    return unary("/google.bigtable.v2.Bigtable/MutateRow", &req.base);
}

static void *setup_main(void *arg) {
    (void)arg;
    uint8_t *big = malloc(BIG_CELL_BYTES);
    for (size_t i = 0; i < BIG_CELL_BYTES; i++)
        big[i] = (uint8_t)('a' + (i / 64) % 4); /* compressible: stored zstd-compressed */
    st_code rc = create_table();
    if (rc == ST_OK)
        rc = write_row("a", NULL);
    for (int i = 0; rc == ST_OK && i < BIG_ROWS; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%02d", i);
        rc = write_row(key, big);
    }
    if (rc == ST_OK)
        rc = write_row("z", NULL);
    if (rc != ST_OK)
        E.setup_failures++;
    free(big);
    event_base_loopbreak(E.base);
    return NULL;
}

static void flush_one(const sto_tablet_info *info, void *arg) {
    st_err err;
    if (sto_tablet_flush(arg, info->id, &err) != ST_OK) {
        fprintf(stderr, "flush: %s\n", err.msg);
        E.setup_failures++;
    }
}

/* ---- the two reads, on the node's own loop ---- */

typedef struct reads {
    rpc_client *long_client, *point_client;
    st_buf long_req, point_req;
    size_t long_msgs, point_msgs;
    size_t long_rows; /* rows the long read returned (commit_row chunks) */
    bool long_done, point_started, point_done;
    st_code long_code, point_code;
    bool long_done_before_point; /* the long read had ended when the point read did */
    bool count_only;             /* no point read: just count the long read's messages */
} reads;

/* A ReadRowsRequest for the row "a" plus, when ranges, EMPTY_RANGES ranges [bNNNNN, bNNNNN~)
 * that hold no rows. */
static void pack_request(st_buf *out, bool ranges) {
    size_t n = ranges ? EMPTY_RANGES : 0;
    Google__Bigtable__V2__RowRange *rr = calloc(n + 1, sizeof *rr);
    Google__Bigtable__V2__RowRange **rp = calloc(n + 1, sizeof *rp);
    char(*keys)[2][24] = calloc(n + 1, sizeof *keys); /* any size_t fits: no truncation */
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__row_range__init(&rr[i]);
        snprintf(keys[i][0], sizeof keys[i][0], "b%06zu", i);
        snprintf(keys[i][1], sizeof keys[i][1], "b%06zu~", i);
        rr[i].start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        rr[i].start_key_closed = (ProtobufCBinaryData){strlen(keys[i][0]), (uint8_t *)keys[i][0]};
        rr[i].end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        rr[i].end_key_open = (ProtobufCBinaryData){strlen(keys[i][1]), (uint8_t *)keys[i][1]};
        rp[i] = &rr[i];
    }
    ProtobufCBinaryData key = {1, (uint8_t *)"a"};
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.n_row_keys = 1;
    rs.row_keys = &key;
    rs.n_row_ranges = n;
    rs.row_ranges = rp;
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = TABLE;
    req.rows = &rs;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    assert_int_equal(st_buf_reserve(out, len), ST_OK);
    out->len = protobuf_c_message_pack(&req.base, out->data);
    free(rr);
    free(rp);
    free(keys);
}

static void maybe_stop(reads *r) {
    if (r->long_done && (r->point_done || !r->point_started))
        event_base_loopbreak(E.base);
}

static void point_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    (void)msg;
    ((reads *)arg)->point_msgs++;
}

static void point_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    reads *r = arg;
    r->point_done = true;
    r->point_code = code;
    r->long_done_before_point = r->long_done;
    maybe_stop(r);
}

/* Sent from the loop once the long read's first row arrived: the long read is under way. */
static void start_point(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    reads *r = arg;
    r->point_started = rpc_client_call(r->point_client, "/google.bigtable.v2.Bigtable/ReadRows",
                                       st_buf_slice(&r->point_req), NULL, 0, TIMEOUT_MS, point_msg,
                                       point_done, r) != NULL;
    maybe_stop(r);
}

static void long_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    reads *r = arg;
    Google__Bigtable__V2__ReadRowsResponse *resp =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(resp);
    for (size_t i = 0; i < resp->n_chunks; i++)
        if (resp->chunks[i]->row_status_case ==
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW &&
            resp->chunks[i]->commit_row)
            r->long_rows++;
    google__bigtable__v2__read_rows_response__free_unpacked(resp, NULL);
    if (r->long_msgs++ == 0 && !r->count_only) {
        struct timeval now = {0, 0};
        assert_int_equal(event_base_once(E.base, -1, EV_TIMEOUT, start_point, r, &now), 0);
    }
}

static void long_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)message;
    reads *r = arg;
    r->long_done = true;
    r->long_code = code;
    maybe_stop(r);
}

static void test_read_turns_point_read_served_during_empty_ranges(void **state) {
    (void)state;
    reads r;
    memset(&r, 0, sizeof r);
    st_buf_init(&r.long_req);
    st_buf_init(&r.point_req);
    pack_request(&r.long_req, true);
    pack_request(&r.point_req, false);
    st_err err;
    uint16_t port = node_port(E.node);
    r.long_client = rpc_client_new(E.base, "127.0.0.1", port, NULL, &err);
    r.point_client = rpc_client_new(E.base, "127.0.0.1", port, NULL, &err);
    assert_non_null(r.long_client);
    assert_non_null(r.point_client);
    assert_non_null(rpc_client_call(r.long_client, "/google.bigtable.v2.Bigtable/ReadRows",
                                    st_buf_slice(&r.long_req), NULL, 0, TIMEOUT_MS, long_msg,
                                    long_done, &r));
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    print_message("long read: %zu messages; point read %s\n", r.long_msgs,
                  !r.point_started           ? "not started before the long read ended"
                  : r.long_done_before_point ? "done after the long read"
                                             : "done while the long read went on");
    assert_int_equal(r.long_code, ST_OK);
    assert_true(r.point_started);
    assert_true(r.point_done);
    assert_int_equal(r.point_code, ST_OK);
    assert_int_equal(r.point_msgs, 1); /* row "a" */
    assert_int_equal(r.long_rows, 1);
    assert_false(r.long_done_before_point);
    rpc_client_free(r.long_client);
    rpc_client_free(r.point_client);
    event_base_loop(E.base, EVLOOP_NONBLOCK);
    st_buf_free(&r.long_req);
    st_buf_free(&r.point_req);
}

/* Rows k00.. with their big cells filtered out: about 1 MiB read from disk per row returned, a
 * few bytes sent. Rows, cells, ranges and the batch size all stay under their turn bounds, so
 * only the block bytes end a turn; each turn's end sends the rows it has. */
static void test_read_turns_bounded_by_block_bytes(void **state) {
    (void)state;
    Google__Bigtable__V2__RowRange range;
    google__bigtable__v2__row_range__init(&range);
    range.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    range.start_key_closed = (ProtobufCBinaryData){1, (uint8_t *)"k"};
    range.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
    range.end_key_open = (ProtobufCBinaryData){1, (uint8_t *)"l"};
    Google__Bigtable__V2__RowRange *rp[1] = {&range};
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.n_row_ranges = 1;
    rs.row_ranges = rp;
    Google__Bigtable__V2__RowFilter filter;
    google__bigtable__v2__row_filter__init(&filter);
    filter.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER;
    filter.column_qualifier_regex_filter = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = TABLE;
    req.rows = &rs;
    req.filter = &filter;
    reads r;
    memset(&r, 0, sizeof r);
    st_buf_init(&r.long_req);
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    assert_int_equal(st_buf_reserve(&r.long_req, len), ST_OK);
    r.long_req.len = protobuf_c_message_pack(&req.base, r.long_req.data);
    st_err err;
    r.long_client = rpc_client_new(E.base, "127.0.0.1", node_port(E.node), NULL, &err);
    assert_non_null(r.long_client);
    r.count_only = true;
    assert_non_null(rpc_client_call(r.long_client, "/google.bigtable.v2.Bigtable/ReadRows",
                                    st_buf_slice(&r.long_req), NULL, 0, TIMEOUT_MS, long_msg,
                                    long_done, &r));
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    size_t per_turn = NODE_READ_TURN_BLOCK_BYTES / BIG_CELL_BYTES;
    print_message("%d rows of %zu-byte cells filtered out: %zu messages\n", BIG_ROWS,
                  BIG_CELL_BYTES, r.long_msgs);
    assert_int_equal(r.long_code, ST_OK);
    assert_int_equal(r.long_rows, BIG_ROWS);
    assert_true(r.long_msgs >= 2); /* one turn would send every row at the end */
    assert_true(r.long_msgs >= BIG_ROWS / (per_turn + 1));
    rpc_client_free(r.long_client);
    event_base_loop(E.base, EVLOOP_NONBLOCK);
    st_buf_free(&r.long_req);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    tu_tmpdir(E.dir, sizeof E.dir, "read_turns");
    E.base = event_base_new();
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
    snprintf(E.addr, sizeof E.addr, "127.0.0.1:%u", node_port(E.node));
    pthread_t th;
    pthread_create(&th, NULL, setup_main, NULL);
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    if (E.setup_failures == 0)
        sto_tablet_list(node_db(E.node), flush_one, node_db(E.node));
    int failures = E.setup_failures;
    if (failures == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_read_turns_point_read_served_during_empty_ranges),
            cmocka_unit_test(test_read_turns_bounded_by_block_bytes),
        };
        failures = cmocka_run_group_tests(tests, NULL, NULL);
    }
    node_close(E.node);
    event_base_free(E.base);
    tu_rmrf(E.dir);
    return failures;
}
