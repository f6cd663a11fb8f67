/*
 * Proves ReadRows works end to end through a real node: a node is opened on an event_base (run on
 * the main thread) with a table pre-split into three tablets; a client thread writes rows over
 * gRPC (MutateRows, plus one row holding a 3 MiB value) and reads them back with
 * rpc_blocking_stream, feeding every response to a chunk reader that enforces the Go client's
 * rules (including "no row left open at the end of a message") and reassembles rows. Checked:
 * full scans forward and reversed (about 6 MB, so several batches, turns and writable waits),
 * row sets of keys and ranges across tablet boundaries, rows_limit, filters (including one that
 * drops most rows, with last_scanned_row_key when the client announces it), request stats, and
 * the request errors (reverse scan without the feature flag, a bad range, an unknown table).
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
#include "sto_test_util.h"
#include "strata/node.h"
#include "strata/rpc.h"

#define TABLE "projects/p/instances/i/tables/t"
#define N_ROWS 2000
#define VALUE_BYTES 1500
#define BIG_ROW 100
#define BIG_BYTES (3u << 20)
#define TIMEOUT_MS 60000
/* base64 FeatureFlags: reverse_scans (1); reverse_scans + last_scanned_row_responses (4) */
#define FF_REVERSE "CAE="
#define FF_REVERSE_LAST_SCANNED "CAEgAQ=="

typedef struct env {
    struct event_base *base;
    node_ctx *node;
    char addr[64];
    char dir[512];
} env;

static env E;

/* ---- a streaming chunk reader with the Go chunkReader's rules ---- */

typedef struct got_row {
    char key[16];
    size_t cells;
    size_t value_bytes;
    uint64_t hash;
    char labels[32];
} got_row;

typedef struct reader {
    bool reversed;
    int state; /* 0 new row, 1 row in progress, 2 cell in progress */
    char cur_key[16];
    size_t cur_cells, cur_bytes;
    uint64_t cur_hash;
    char cur_labels[32];
    char last[16];
    bool have_last;
    got_row *rows;
    size_t n, cap;
    char last_scanned[16];
    bool has_stats;
    int64_t stats_rows_seen, stats_rows_returned;
    size_t messages;
    char err[200];
} reader;

static void rd_init(reader *r, bool reversed) {
    memset(r, 0, sizeof *r);
    r->reversed = reversed;
}

static void rd_bad(reader *r, const char *msg) {
    if (!r->err[0])
        snprintf(r->err, sizeof r->err, "%s (message %zu)", msg, r->messages);
}

static uint64_t mix(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void rd_chunk(reader *r, const Google__Bigtable__V2__ReadRowsResponse__CellChunk *c) {
    bool commit = c->row_status_case ==
                  GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    if (c->row_status_case ==
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_RESET_ROW) {
        rd_bad(r, "reset_row");
        return;
    }
    if (commit && c->value_size > 0) {
        rd_bad(r, "commit inside a split cell");
        return;
    }
    if (r->state == 0) {
        if (!c->row_key.len || !c->family_name || !c->qualifier || c->row_key.len >= 16) {
            rd_bad(r, "missing key field for new row");
            return;
        }
        char k[16] = {0};
        memcpy(k, c->row_key.data, c->row_key.len);
        if (r->have_last && (r->reversed ? strcmp(r->last, k) <= 0 : strcmp(r->last, k) >= 0)) {
            rd_bad(r, "out of order row key");
            return;
        }
        memcpy(r->cur_key, k, sizeof k);
        r->cur_cells = r->cur_bytes = 0;
        r->cur_hash = 14695981039346656037ull;
        r->cur_labels[0] = 0;
    } else if (r->state == 1) {
        if (c->row_key.len && (c->row_key.len != strlen(r->cur_key) ||
                               memcmp(c->row_key.data, r->cur_key, c->row_key.len) != 0)) {
            rd_bad(r, "new row key during a row");
            return;
        }
        if (c->family_name && !c->qualifier) {
            rd_bad(r, "family without qualifier");
            return;
        }
    } else if (c->row_key.len || c->family_name || c->qualifier || c->timestamp_micros ||
               c->n_labels) {
        rd_bad(r, "key parts inside a split cell");
        return;
    }
    if (r->state != 2) {
        r->cur_cells++;
        for (size_t i = 0; i < c->n_labels; i++)
            snprintf(r->cur_labels, sizeof r->cur_labels, "%s", c->labels[i]);
    }
    r->cur_bytes += c->value.len;
    r->cur_hash = mix(r->cur_hash, c->value.data, c->value.len);
    r->state = c->value_size > 0 ? 2 : 1;
    if (commit) {
        if (r->n == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 256;
            r->rows = realloc(r->rows, r->cap * sizeof *r->rows);
        }
        got_row *g = &r->rows[r->n++];
        memcpy(g->key, r->cur_key, sizeof g->key);
        g->cells = r->cur_cells;
        g->value_bytes = r->cur_bytes;
        g->hash = r->cur_hash;
        memcpy(g->labels, r->cur_labels, sizeof g->labels);
        memcpy(r->last, r->cur_key, sizeof r->last);
        r->have_last = true;
        r->state = 0;
    }
}

static void rd_message(st_slice msg, void *arg) {
    reader *r = arg;
    Google__Bigtable__V2__ReadRowsResponse *m =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    if (!m) {
        rd_bad(r, "undecodable response");
        return;
    }
    for (size_t i = 0; i < m->n_chunks; i++)
        rd_chunk(r, m->chunks[i]);
    if (m->last_scanned_row_key.len && m->last_scanned_row_key.len < 16) {
        memset(r->last_scanned, 0, sizeof r->last_scanned);
        memcpy(r->last_scanned, m->last_scanned_row_key.data, m->last_scanned_row_key.len);
    }
    if (m->request_stats && m->request_stats->full_read_stats_view &&
        m->request_stats->full_read_stats_view->read_iteration_stats) {
        r->has_stats = true;
        r->stats_rows_seen =
            m->request_stats->full_read_stats_view->read_iteration_stats->rows_seen_count;
        r->stats_rows_returned =
            m->request_stats->full_read_stats_view->read_iteration_stats->rows_returned_count;
    }
    if (r->state != 0)
        rd_bad(r, "invalid state for end of stream: a row spans messages");
    r->messages++;
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
}

/* ---- the data ---- */

static void row_key(int i, char out[16]) {
    snprintf(out, 16, "r%05d", i);
}

static void fill_value(int i, int col, uint8_t *v, size_t n) {
    for (size_t j = 0; j < n; j++)
        v[j] = (uint8_t)(i * 7 + col * 13 + j);
}

/* Expected (cells, bytes, hash) of row i with no filter: q0, q1 (and big for BIG_ROW). */
static void expect_row(int i, size_t *cells, size_t *bytes, uint64_t *hash) {
    static uint8_t v[VALUE_BYTES];
    uint64_t h = 14695981039346656037ull;
    size_t b = 0, c = 0;
    if (i == BIG_ROW) {
        uint8_t *big = malloc(BIG_BYTES);
        fill_value(i, 9, big, BIG_BYTES);
        h = mix(h, big, BIG_BYTES);
        b += BIG_BYTES;
        c++;
        free(big);
    }
    for (int col = 0; col < 2; col++) {
        fill_value(i, col, v, VALUE_BYTES);
        h = mix(h, v, VALUE_BYTES);
        b += VALUE_BYTES;
        c++;
    }
    *cells = c;
    *bytes = b;
    *hash = h;
}

/* ---- RPC helpers ---- */

static st_code unary(const char *path, const ProtobufCMessage *req, st_err *status) {
    return bt_call_pb(E.addr, path, req, TIMEOUT_MS, NULL, status);
}

static void ignore_msg(st_slice msg, void *arg) {
    (void)msg;
    (void)arg;
}

static st_code read_rows(const Google__Bigtable__V2__ReadRowsRequest *req, const char *features,
                         reader *r, st_err *status) {
    size_t len = protobuf_c_message_get_packed_size(&req->base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&req->base, buf);
    rpc_metadata md = {"bigtable-features", features};
    st_code rc = rpc_blocking_stream(E.addr, NULL, "/google.bigtable.v2.Bigtable/ReadRows",
                                     st_slice_make(buf, len), &md, features ? 1 : 0, TIMEOUT_MS,
                                     r ? rd_message : ignore_msg, r, status);
    free(buf);
    return rc;
}

static void create_table(void) {
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
    Google__Bigtable__Admin__V2__CreateTableRequest__Split s1, s2;
    google__bigtable__admin__v2__create_table_request__split__init(&s1);
    google__bigtable__admin__v2__create_table_request__split__init(&s2);
    s1.key = (ProtobufCBinaryData){6, (uint8_t *)"r00500"};
    s2.key = (ProtobufCBinaryData){6, (uint8_t *)"r01200"};
    Google__Bigtable__Admin__V2__CreateTableRequest__Split *splits[2] = {&s1, &s2};
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = "projects/p/instances/i";
    req.table_id = "t";
    req.table = &table;
    req.n_initial_splits = 2;
    req.initial_splits = splits;
    st_err status;
    assert_int_equal(
        unary("/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable", &req.base, &status),
        ST_OK);
}

/* One SetCell mutation for row i, column q, with a fresh value buffer. */
static void set_cell(Google__Bigtable__V2__Mutation *m, Google__Bigtable__V2__Mutation__SetCell *sc,
                     int i, int col, const char *qual, size_t bytes) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(sc);
    uint8_t *v = malloc(bytes);
    fill_value(i, col, v, bytes);
    sc->family_name = "f";
    sc->column_qualifier = (ProtobufCBinaryData){strlen(qual), (uint8_t *)qual};
    sc->timestamp_micros = 1000 * (int64_t)(i + 1);
    sc->value = (ProtobufCBinaryData){bytes, v};
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

static void write_rows(void) {
    size_t n = N_ROWS;
    Google__Bigtable__V2__MutateRowsRequest__Entry *entries = calloc(n, sizeof *entries);
    Google__Bigtable__V2__MutateRowsRequest__Entry **ep = calloc(n, sizeof *ep);
    Google__Bigtable__V2__Mutation *muts = calloc(3 * n, sizeof *muts);
    Google__Bigtable__V2__Mutation__SetCell *cells = calloc(3 * n, sizeof *cells);
    Google__Bigtable__V2__Mutation **mp = calloc(3 * n, sizeof *mp);
    char(*keys)[16] = calloc(n, 16);
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&entries[i]);
        row_key((int)i, keys[i]);
        entries[i].row_key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        size_t k = 0;
        set_cell(&muts[3 * i + k], &cells[3 * i + k], (int)i, 0, "q0", VALUE_BYTES), k++;
        set_cell(&muts[3 * i + k], &cells[3 * i + k], (int)i, 1, "q1", VALUE_BYTES), k++;
        if (i == BIG_ROW)
            set_cell(&muts[3 * i + k], &cells[3 * i + k], (int)i, 9, "big", BIG_BYTES), k++;
        for (size_t j = 0; j < k; j++)
            mp[3 * i + j] = &muts[3 * i + j];
        entries[i].mutations = &mp[3 * i];
        entries[i].n_mutations = k;
        ep[i] = &entries[i];
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = TABLE;
    req.n_entries = n;
    req.entries = ep;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    st_err status;
    assert_int_equal(rpc_blocking_stream(E.addr, NULL, "/google.bigtable.v2.Bigtable/MutateRows",
                                         st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, ignore_msg,
                                         NULL, &status),
                     ST_OK);
    free(buf);
    for (size_t i = 0; i < 3 * n; i++)
        free(cells[i].value.data);
    free(entries);
    free(ep);
    free(muts);
    free(cells);
    free(mp);
    free(keys);
}

static void req_init(Google__Bigtable__V2__ReadRowsRequest *req) {
    google__bigtable__v2__read_rows_request__init(req);
    req->table_name = TABLE;
}

static void check_full_rows(const reader *r, bool reversed) {
    assert_int_equal(r->n, N_ROWS);
    for (int k = 0; k < N_ROWS; k++) {
        int i = reversed ? N_ROWS - 1 - k : k;
        char key[16];
        row_key(i, key);
        assert_string_equal(r->rows[k].key, key);
        size_t cells, bytes;
        uint64_t hash;
        if (i % 97 == 0 || i == BIG_ROW) { /* spot checks: hashing every row is slow */
            expect_row(i, &cells, &bytes, &hash);
            assert_int_equal(r->rows[k].cells, cells);
            assert_int_equal(r->rows[k].value_bytes, bytes);
            assert_true(r->rows[k].hash == hash);
        }
    }
}

/* ---- the tests (run in the client thread) ---- */

static void test_readrows_e2e_full_scan(void **state) {
    (void)state;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    req.request_stats_view =
        GOOGLE__BIGTABLE__V2__READ_ROWS_REQUEST__REQUEST_STATS_VIEW__REQUEST_STATS_FULL;
    reader r;
    rd_init(&r, false);
    st_err status;
    assert_int_equal(read_rows(&req, NULL, &r, &status), ST_OK);
    if (r.err[0])
        fail_msg("%s", r.err);
    check_full_rows(&r, false);
    assert_true(r.messages > 3);
    assert_true(r.has_stats);
    assert_int_equal(r.stats_rows_returned, N_ROWS);
    free(r.rows);
}

static void test_readrows_e2e_reversed(void **state) {
    (void)state;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    req.reversed = 1;
    st_err status;
    /* Without the client's reverse_scans feature flag: refused like Cloud Bigtable does. */
    assert_int_equal(read_rows(&req, NULL, NULL, &status), ST_UNIMPLEMENTED);
    assert_non_null(strstr(status.msg, "reverse scans"));
    reader r;
    rd_init(&r, true);
    assert_int_equal(read_rows(&req, FF_REVERSE, &r, &status), ST_OK);
    if (r.err[0])
        fail_msg("%s", r.err);
    check_full_rows(&r, true);
    free(r.rows);
}

static void test_readrows_e2e_row_set_and_limit(void **state) {
    (void)state;
    Google__Bigtable__V2__RowRange ranges[2];
    Google__Bigtable__V2__RowRange *rp[2] = {&ranges[0], &ranges[1]};
    google__bigtable__v2__row_range__init(&ranges[0]);
    google__bigtable__v2__row_range__init(&ranges[1]);
    /* (r00490, r00510]: crosses the split at r00500 */
    ranges[0].start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
    ranges[0].start_key_open = (ProtobufCBinaryData){6, (uint8_t *)"r00490"};
    ranges[0].end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED;
    ranges[0].end_key_closed = (ProtobufCBinaryData){6, (uint8_t *)"r00510"};
    /* [r01195, r01205): crosses r01200 */
    ranges[1].start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    ranges[1].start_key_closed = (ProtobufCBinaryData){6, (uint8_t *)"r01195"};
    ranges[1].end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
    ranges[1].end_key_open = (ProtobufCBinaryData){6, (uint8_t *)"r01205"};
    ProtobufCBinaryData keys[3] = {{6, (uint8_t *)"r00007"},
                                   {6, (uint8_t *)"r00500"},  /* inside range 0 already */
                                   {6, (uint8_t *)"zzzzzz"}}; /* no such row */
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.n_row_keys = 3;
    rs.row_keys = keys;
    rs.n_row_ranges = 2;
    rs.row_ranges = rp;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    req.rows = &rs;
    for (int dir = 0; dir < 2; dir++) {
        req.reversed = dir;
        reader r;
        rd_init(&r, dir);
        st_err status;
        assert_int_equal(read_rows(&req, FF_REVERSE, &r, &status), ST_OK);
        if (r.err[0])
            fail_msg("%s", r.err);
        assert_int_equal(r.n, 1 + 20 + 10);
        assert_string_equal(r.rows[dir ? r.n - 1 : 0].key, "r00007");
        assert_string_equal(r.rows[dir ? 0 : r.n - 1].key, "r01204");
        free(r.rows);
    }
    req.reversed = 0;
    req.rows_limit = 5;
    reader r;
    rd_init(&r, false);
    st_err status;
    assert_int_equal(read_rows(&req, NULL, &r, &status), ST_OK);
    assert_int_equal(r.n, 5);
    assert_string_equal(r.rows[4].key, "r00494");
    free(r.rows);
}

static void test_readrows_e2e_filters(void **state) {
    (void)state;
    /* chain(row_key_regex "r0199.", apply_label "x", cells_per_row_limit 1) */
    Google__Bigtable__V2__RowFilter f[4];
    for (int i = 0; i < 4; i++)
        google__bigtable__v2__row_filter__init(&f[i]);
    f[0].filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER;
    f[0].row_key_regex_filter = (ProtobufCBinaryData){6, (uint8_t *)"r0199."};
    f[1].filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER;
    f[1].apply_label_transformer = "x";
    f[2].filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_LIMIT_FILTER;
    f[2].cells_per_row_limit_filter = 1;
    Google__Bigtable__V2__RowFilter *subs[3] = {&f[0], &f[1], &f[2]};
    Google__Bigtable__V2__RowFilter__Chain chain;
    google__bigtable__v2__row_filter__chain__init(&chain);
    chain.n_filters = 3;
    chain.filters = subs;
    f[3].filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    f[3].chain = &chain;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    req.filter = &f[3];
    req.reversed = 1;
    reader r;
    rd_init(&r, true);
    st_err status;
    assert_int_equal(read_rows(&req, FF_REVERSE_LAST_SCANNED, &r, &status), ST_OK);
    if (r.err[0])
        fail_msg("%s", r.err);
    assert_int_equal(r.n, 10);
    assert_string_equal(r.rows[0].key, "r01999");
    assert_int_equal(r.rows[0].cells, 1);
    assert_string_equal(r.rows[0].labels, "x");
    /* The scan went on through rows the filter dropped and said how far. */
    assert_true(r.last_scanned[0] != 0);
    assert_true(strcmp(r.last_scanned, "r01990") < 0);
    free(r.rows);
    /* A per-cell filter (family regex matching nothing). */
    google__bigtable__v2__row_filter__init(&f[0]);
    f[0].filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER;
    f[0].family_name_regex_filter = "nope";
    req.filter = &f[0];
    req.reversed = 0;
    rd_init(&r, false);
    assert_int_equal(read_rows(&req, NULL, &r, &status), ST_OK);
    assert_int_equal(r.n, 0);
    free(r.rows);
    /* A filter Bigtable rejects. */
    chain.n_filters = 1;
    req.filter = &f[3];
    assert_int_equal(read_rows(&req, NULL, NULL, &status), ST_INVALID_ARGUMENT);
}

static void test_readrows_e2e_request_errors(void **state) {
    (void)state;
    Google__Bigtable__V2__RowRange range;
    Google__Bigtable__V2__RowRange *rp = &range;
    google__bigtable__v2__row_range__init(&range);
    range.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    range.start_key_closed = (ProtobufCBinaryData){1, (uint8_t *)"b"};
    range.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
    range.end_key_open = (ProtobufCBinaryData){1, (uint8_t *)"a"};
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.n_row_ranges = 1;
    rs.row_ranges = &rp;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    req.rows = &rs;
    st_err status;
    assert_int_equal(read_rows(&req, NULL, NULL, &status), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(status.msg, "start_key must be less than end_key"));
    req_init(&req);
    req.table_name = "projects/p/instances/i/tables/nope";
    assert_int_equal(read_rows(&req, NULL, NULL, &status), ST_NOT_FOUND);
    req_init(&req);
    req.rows_limit = -1;
    assert_int_equal(read_rows(&req, NULL, NULL, &status), ST_INVALID_ARGUMENT);
}

/* A read cut short by its deadline (1 ms: it may also finish in time; both are fine) frees its
 * scan state (checked by the sanitizer builds), and the node keeps serving. */
static void test_readrows_e2e_deadline_mid_scan(void **state) {
    (void)state;
    Google__Bigtable__V2__ReadRowsRequest req;
    req_init(&req);
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&req.base, buf);
    st_err status;
    for (int i = 0; i < 5; i++) {
        st_code rc =
            rpc_blocking_stream(E.addr, NULL, "/google.bigtable.v2.Bigtable/ReadRows",
                                st_slice_make(buf, len), NULL, 0, 1, ignore_msg, NULL, &status);
        assert_true(rc == ST_OK || rc == ST_DEADLINE_EXCEEDED || rc == ST_CANCELLED);
    }
    free(buf);
    reader r;
    rd_init(&r, false);
    assert_int_equal(read_rows(&req, NULL, &r, &status), ST_OK);
    assert_int_equal(r.n, N_ROWS);
    free(r.rows);
}

/* ---- harness: the node on the main thread, the tests on a client thread ---- */

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    create_table();
    write_rows();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readrows_e2e_full_scan),
        cmocka_unit_test(test_readrows_e2e_reversed),
        cmocka_unit_test(test_readrows_e2e_row_set_and_limit),
        cmocka_unit_test(test_readrows_e2e_filters),
        cmocka_unit_test(test_readrows_e2e_request_errors),
        cmocka_unit_test(test_readrows_e2e_deadline_mid_scan),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(E.base);
    return NULL;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as strata-node's main does: a client hanging up is not fatal */
    evthread_use_pthreads();
    tu_tmpdir(E.dir, sizeof E.dir, "readrows_e2e");
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
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(E.base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(E.node);
    event_base_free(E.base);
    tu_rmrf(E.dir);
    return g_failures;
}
