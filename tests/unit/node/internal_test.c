/*
 * Proves a strata-node works as a cluster member through its internal service
 * (strata.internal.v1.Node): two in-process nodes (node numbers 1 and 2, the second with a tiny
 * size-based split threshold) share one event_base on the main thread; the tests run on a client
 * thread and talk gRPC with rpc_blocking_unary / rpc_blocking_stream. Checked: PutTable,
 * ListTablets, CreateTablet (ids carry the node number, a retry is idempotent, overlaps are
 * refused); every data path answers rows no local tablet covers with FAILED_PRECONDITION
 * "strata-not-owner:" (MutateRow, MutateRows, CheckAndMutateRow, ReadModifyWriteRow, ReadRows);
 * SplitTablet then reads across both halves; automatic splits under a write load make several
 * tablets and every row reads back; MoveTablet copies a tablet's cells to the other node
 * keeping each cell's timestamp and version (the source's storage read before the move against
 * the target's commit log, read with sto_log_reader: same cells, same versions, every record
 * STO_ROW_REPLICATED, a row written by two mutations arrives as two row mutations), a CopyRows
 * with an older version loses against a copied cell and a newer one wins, a copied commit time
 * ten years ahead does not move the target's clock (one five seconds ahead does), and the source
 * answers strata-not-owner; a move's incoming copy is refused to clients and moves until activated;
 * DropTablet and DropTable.
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
#include <unistd.h>

#include "btclient.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "sto_test_util.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/storage.h"

#define TABLE "projects/p/instances/i/tables/t"
#define TABLE2 "projects/p/instances/i/tables/grow"
#define TIMEOUT_MS 60000
#define SPLIT_ROWS 200
#define GROW_VALUE_BYTES 2000
#define GROW_BATCH 50
#define GROW_TABLETS_MIN 4
#define NOT_OWNER "strata-not-owner:"
#define FF_REVERSE "CAE=" /* FeatureFlags.reverse_scans */
#define IN "/strata.internal.v1.Node/"
#define BT "/google.bigtable.v2.Bigtable/"
#define CLUSTER_NUM 3 /* both nodes' cluster: the tiebreaker bits of their versions */
#define MOVE_CELLS_MAX 1000

typedef struct node_env {
    node_ctx *node;
    char addr[64];
    char dir[512];
} node_env;

static struct event_base *g_base;
static node_env A, B; /* A: node 1; B: node 2, splits above 64 KiB */

/* ---- RPC helpers ---- */

static st_code call(const node_env *e, const char *path, const ProtobufCMessage *req, st_buf *resp,
                    st_err *status) {
    return bt_call_pb(e->addr, path, req, TIMEOUT_MS, resp, status);
}

static void assert_not_owner(st_code rc, const st_err *status) {
    assert_int_equal(rc, ST_FAILED_PRECONDITION);
    assert_true(strncmp(status->msg, NOT_OWNER, strlen(NOT_OWNER)) == 0);
}

static void put_table(const node_env *e, const char *name) {
    st_err status;
    assert_int_equal(bt_node_put_table(e->addr, name, "f", 3, TIMEOUT_MS, &status), ST_OK);
}

/* CreateTablet [start, end), a move's incoming copy or its activation when incoming is given;
 * returns the id (0 when refused, *rc says why), *incoming_out what the answer says. */
static uint64_t create_tablet_in(const node_env *e, const char *table, const char *start,
                                 const char *end, bool incoming, st_code *rc_out,
                                 bool *incoming_out) {
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = (char *)table;
    req.incoming = incoming;
    req.start_key = (ProtobufCBinaryData){strlen(start), (uint8_t *)start};
    req.end_key = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    st_code rc = call(e, IN "CreateTablet", &req.base, &resp, &status);
    uint64_t id = 0;
    if (rc == ST_OK) {
        Strata__Internal__V1__Tablet *t =
            strata__internal__v1__tablet__unpack(NULL, resp.len, resp.data);
        assert_non_null(t);
        id = t->id;
        if (incoming_out)
            *incoming_out = t->incoming;
        strata__internal__v1__tablet__free_unpacked(t, NULL);
    }
    st_buf_free(&resp);
    if (rc_out)
        *rc_out = rc;
    return id;
}

/* CreateTablet [start, end); returns the id (0 when refused, *rc says why). */
static uint64_t create_tablet(const node_env *e, const char *table, const char *start,
                              const char *end, st_code *rc_out) {
    return create_tablet_in(e, table, start, end, false, rc_out, NULL);
}

/* ListTablets of one table (caller frees with ..._free_unpacked). */
static Strata__Internal__V1__ListTabletsResponse *list_tablets(const node_env *e,
                                                               const char *table) {
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    req.table_name = (char *)table;
    st_err status;
    Strata__Internal__V1__ListTabletsResponse *r = (void *)bt_call_unpack(
        e->addr, IN "ListTablets", &req.base,
        &strata__internal__v1__list_tablets_response__descriptor, TIMEOUT_MS, &status);
    assert_non_null(r);
    return r;
}

static size_t tablet_count(const node_env *e, const char *table) {
    Strata__Internal__V1__ListTabletsResponse *r = list_tablets(e, table);
    size_t n = r->n_tablets;
    strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    return n;
}

/* ---- data helpers ---- */

static void set_cell(Google__Bigtable__V2__Mutation *m, Google__Bigtable__V2__Mutation__SetCell *sc,
                     const uint8_t *value, size_t len, int64_t ts) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = "f";
    sc->column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc->timestamp_micros = ts;
    sc->value = (ProtobufCBinaryData){len, (uint8_t *)value};
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

static st_code mutate_row(const node_env *e, const char *table, const char *key, st_err *status) {
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell(&m, &sc, (const uint8_t *)"v", 1, 1000);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &mp;
    return call(e, BT "MutateRow", &req.base, NULL, status);
}

static void ignore_msg(st_slice msg, void *arg) {
    (void)msg;
    (void)arg;
}

/* MutateRows of keys[0..n): one SetCell each, value = fill(i), timestamp (i+1) ms. */
static st_code mutate_rows(const node_env *e, const char *table, char (*keys)[16], size_t n,
                           size_t value_bytes, st_err *status) {
    Google__Bigtable__V2__MutateRowsRequest__Entry *ents = calloc(n, sizeof *ents);
    Google__Bigtable__V2__MutateRowsRequest__Entry **ep = calloc(n, sizeof *ep);
    Google__Bigtable__V2__Mutation *m = calloc(n, sizeof *m);
    Google__Bigtable__V2__Mutation **mp = calloc(n, sizeof *mp);
    Google__Bigtable__V2__Mutation__SetCell *sc = calloc(n, sizeof *sc);
    uint8_t *values = calloc(n, value_bytes);
    for (size_t i = 0; i < n; i++) {
        memset(values + i * value_bytes, keys[i][strlen(keys[i]) - 1], value_bytes);
        set_cell(&m[i], &sc[i], values + i * value_bytes, value_bytes, 1000 * (int64_t)(i + 1));
        mp[i] = &m[i];
        google__bigtable__v2__mutate_rows_request__entry__init(&ents[i]);
        ents[i].row_key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        ents[i].n_mutations = 1;
        ents[i].mutations = &mp[i];
        ep[i] = &ents[i];
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)table;
    req.n_entries = n;
    req.entries = ep;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    st_code rc = rpc_blocking_stream(e->addr, NULL, BT "MutateRows", st_slice_make(buf, len), NULL,
                                     0, TIMEOUT_MS, ignore_msg, NULL, status);
    free(buf);
    free(ents);
    free(ep);
    free(m);
    free(mp);
    free(sc);
    free(values);
    return rc;
}

/* Rows as read back: key, first cell's timestamp and value length. */
typedef struct got {
    size_t n, cap;
    char (*keys)[16];
    int64_t *ts;
    size_t *value_len;
    char cur[16];
    int64_t cur_ts;
    size_t cur_len;
    bool cur_has_cell;
} got;

static void got_chunk(got *g, const Google__Bigtable__V2__ReadRowsResponse__CellChunk *c) {
    if (c->row_key.len) {
        memset(g->cur, 0, sizeof g->cur);
        memcpy(g->cur, c->row_key.data, c->row_key.len < 15 ? c->row_key.len : 15);
        g->cur_has_cell = false;
        g->cur_len = 0;
    }
    if (!g->cur_has_cell) {
        g->cur_ts = c->timestamp_micros;
        g->cur_has_cell = true;
    }
    g->cur_len += c->value.len;
    if (c->row_status_case !=
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW)
        return;
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->keys = realloc(g->keys, g->cap * sizeof *g->keys);
        g->ts = realloc(g->ts, g->cap * sizeof *g->ts);
        g->value_len = realloc(g->value_len, g->cap * sizeof *g->value_len);
    }
    memcpy(g->keys[g->n], g->cur, sizeof g->cur);
    g->ts[g->n] = g->cur_ts;
    g->value_len[g->n] = g->cur_len;
    g->n++;
}

static void got_msg(st_slice msg, void *arg) {
    Google__Bigtable__V2__ReadRowsResponse *r =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(r);
    for (size_t i = 0; i < r->n_chunks; i++)
        got_chunk(arg, r->chunks[i]);
    google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
}

static void got_free(got *g) {
    free(g->keys);
    free(g->ts);
    free(g->value_len);
    memset(g, 0, sizeof *g);
}

/* ReadRows of [start, end) (NULL start: the whole table). */
static st_code read_range(const node_env *e, const char *table, const char *start, const char *end,
                          bool reversed, got *g, st_err *status) {
    Google__Bigtable__V2__RowRange range, *rp = &range;
    google__bigtable__v2__row_range__init(&range);
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = (char *)table;
    req.reversed = reversed;
    if (start) {
        range.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        range.start_key_closed = (ProtobufCBinaryData){strlen(start), (uint8_t *)start};
        range.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        range.end_key_open = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
        rs.n_row_ranges = 1;
        rs.row_ranges = &rp;
        req.rows = &rs;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&req.base, buf);
    memset(g, 0, sizeof *g);
    rpc_metadata md = {"bigtable-features", FF_REVERSE};
    st_code rc = rpc_blocking_stream(e->addr, NULL, BT "ReadRows", st_slice_make(buf, len), &md, 1,
                                     TIMEOUT_MS, got_msg, g, status);
    free(buf);
    return rc;
}

/* ---- the tests (client thread) ---- */

static uint64_t g_left_id; /* A's tablet [, "m") */

static void test_internal_put_list_create(void **state) {
    (void)state;
    put_table(&A, TABLE);
    put_table(&A, TABLE); /* an upsert: again is fine */
    assert_int_equal(tablet_count(&A, TABLE), 0);
    st_code rc;
    g_left_id = create_tablet(&A, TABLE, "", "m", &rc);
    assert_int_equal(rc, ST_OK);
    assert_int_equal(g_left_id >> 40, 1); /* node_num in the high bits */
    assert_int_equal(create_tablet(&A, TABLE, "", "m", &rc), g_left_id); /* a retry */
    create_tablet(&A, TABLE, "a", "z", &rc);
    assert_int_equal(rc, ST_FAILED_PRECONDITION);
    create_tablet(&A, TABLE, "z", "b", &rc);
    assert_int_equal(rc, ST_INVALID_ARGUMENT);
    create_tablet(&A, TABLE "x", "", "", &rc);
    assert_int_equal(rc, ST_NOT_FOUND);
    Strata__Internal__V1__ListTabletsResponse *r = list_tablets(&A, TABLE);
    assert_int_equal(r->n_tablets, 1);
    assert_int_equal(r->node_num, 1);
    assert_int_equal(r->tablets[0]->end_key.len, 1);
    assert_string_equal(r->tablets[0]->table_name, TABLE);
    strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    Strata__Internal__V1__GetStatusRequest sreq;
    strata__internal__v1__get_status_request__init(&sreq);
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    assert_int_equal(call(&A, IN "GetStatus", &sreq.base, &resp, &status), ST_OK);
    Strata__Internal__V1__NodeStatus *ns =
        strata__internal__v1__node_status__unpack(NULL, resp.len, resp.data);
    assert_non_null(ns);
    assert_int_equal(ns->node_num, 1);
    assert_int_equal(ns->tablets, 1);
    strata__internal__v1__node_status__free_unpacked(ns, NULL);
    st_buf_free(&resp);
}

static void test_internal_not_owner(void **state) {
    (void)state;
    st_err status;
    assert_int_equal(mutate_row(&A, TABLE, "c", &status), ST_OK);
    assert_not_owner(mutate_row(&A, TABLE, "x", &status), &status);
    char keys[2][16] = {"d", "y"}; /* one covered, one not: the whole call is refused */
    assert_not_owner(mutate_rows(&A, TABLE, keys, 2, 1, &status), &status);
    got g;
    assert_int_equal(read_range(&A, TABLE, "d", "e", false, &g, &status), ST_OK);
    assert_int_equal(g.n, 0); /* "d" was not written */
    got_free(&g);
    assert_not_owner(read_range(&A, TABLE, NULL, NULL, false, &g, &status), &status);
    assert_int_equal(g.n, 0);
    got_free(&g);
    assert_not_owner(read_range(&A, TABLE, "a", "n", true, &g, &status), &status);
    got_free(&g);
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell(&m, &sc, (const uint8_t *)"v", 1, 1000);
    Google__Bigtable__V2__CheckAndMutateRowRequest cam;
    google__bigtable__v2__check_and_mutate_row_request__init(&cam);
    cam.table_name = TABLE;
    cam.row_key = (ProtobufCBinaryData){1, (uint8_t *)"x"};
    cam.n_true_mutations = 1;
    cam.true_mutations = &mp;
    assert_not_owner(call(&A, BT "CheckAndMutateRow", &cam.base, NULL, &status), &status);
    Google__Bigtable__V2__ReadModifyWriteRule rule, *rp = &rule;
    google__bigtable__v2__read_modify_write_rule__init(&rule);
    rule.family_name = "f";
    rule.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"n"};
    rule.rule_case = GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_INCREMENT_AMOUNT;
    rule.increment_amount = 1;
    Google__Bigtable__V2__ReadModifyWriteRowRequest rmw;
    google__bigtable__v2__read_modify_write_row_request__init(&rmw);
    rmw.table_name = TABLE;
    rmw.row_key = (ProtobufCBinaryData){1, (uint8_t *)"x"};
    rmw.n_rules = 1;
    rmw.rules = &rp;
    assert_not_owner(call(&A, BT "ReadModifyWriteRow", &rmw.base, NULL, &status), &status);
    rmw.row_key = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    assert_int_equal(call(&A, BT "ReadModifyWriteRow", &rmw.base, NULL, &status), ST_OK);
    Google__Bigtable__V2__SampleRowKeysRequest srk;
    google__bigtable__v2__sample_row_keys_request__init(&srk);
    srk.table_name = TABLE;
    size_t len = protobuf_c_message_get_packed_size(&srk.base);
    uint8_t buf[256];
    protobuf_c_message_pack(&srk.base, buf);
    assert_int_equal(rpc_blocking_stream(A.addr, NULL, BT "SampleRowKeys", st_slice_make(buf, len),
                                         NULL, 0, TIMEOUT_MS, ignore_msg, NULL, &status),
                     ST_OK);
}

static void split_keys(char (*keys)[16], size_t n) {
    for (size_t i = 0; i < n; i++)
        snprintf(keys[i], 16, "a%04u", (unsigned)(i % 10000));
}

static void test_internal_split_then_read(void **state) {
    (void)state;
    char(*keys)[16] = calloc(SPLIT_ROWS, 16);
    split_keys(keys, SPLIT_ROWS);
    st_err status;
    assert_int_equal(mutate_rows(&A, TABLE, keys, SPLIT_ROWS, 100, &status), ST_OK);
    Strata__Internal__V1__SplitTabletRequest req;
    strata__internal__v1__split_tablet_request__init(&req);
    req.id = g_left_id;
    st_buf resp;
    st_buf_init(&resp);
    assert_int_equal(call(&A, IN "SplitTablet", &req.base, &resp, &status), ST_OK);
    Strata__Internal__V1__SplitTabletResponse *sr =
        strata__internal__v1__split_tablet_response__unpack(NULL, resp.len, resp.data);
    assert_non_null(sr);
    assert_true(sr->left->end_key.len > 0);
    assert_int_equal(sr->left->end_key.len, sr->right->start_key.len);
    assert_int_equal(sr->right->end_key.len, 1);
    g_left_id = sr->left->id;
    strata__internal__v1__split_tablet_response__free_unpacked(sr, NULL);
    st_buf_free(&resp);
    assert_int_equal(tablet_count(&A, TABLE), 2);
    req.id = 12345; /* unknown */
    assert_int_equal(call(&A, IN "SplitTablet", &req.base, NULL, &status), ST_NOT_FOUND);
    for (int rev = 0; rev < 2; rev++) {
        got g;
        assert_int_equal(read_range(&A, TABLE, "a", "b", rev, &g, &status), ST_OK);
        assert_int_equal(g.n, SPLIT_ROWS);
        for (size_t i = 0; i < SPLIT_ROWS; i++)
            assert_string_equal(g.keys[rev ? SPLIT_ROWS - 1 - i : i], keys[i]);
        got_free(&g);
    }
    free(keys);
}

static void test_internal_auto_split(void **state) {
    (void)state;
    put_table(&B, TABLE2);
    st_code rc;
    create_tablet(&B, TABLE2, "", "", &rc);
    assert_int_equal(rc, ST_OK);
    char(*keys)[16] = calloc(GROW_BATCH, 16);
    size_t written = 0;
    st_err status;
    /* Write until the split timer has made several tablets (no time limit: ctest's timeout). */
    while (tablet_count(&B, TABLE2) < GROW_TABLETS_MIN) {
        for (size_t i = 0; i < GROW_BATCH; i++) /* spread over the key space */
            snprintf(keys[i], 16, "k%02zu-%06zu", (written + i) % 97, written + i);
        assert_int_equal(mutate_rows(&B, TABLE2, keys, GROW_BATCH, GROW_VALUE_BYTES, &status),
                         ST_OK);
        written += GROW_BATCH;
        usleep(2000);
    }
    got g;
    assert_int_equal(read_range(&B, TABLE2, NULL, NULL, false, &g, &status), ST_OK);
    assert_int_equal(g.n, written);
    for (size_t i = 1; i < g.n; i++)
        assert_true(strcmp(g.keys[i - 1], g.keys[i]) < 0);
    for (size_t i = 0; i < g.n; i++)
        assert_int_equal(g.value_len[i], GROW_VALUE_BYTES);
    got_free(&g);
    free(keys);
}

/* ---- moves: what storage holds ---- */

typedef struct cell_ver {
    char row[16];
    char qual[8];
    int64_t ts;
    uint64_t version;
} cell_ver;

/* The visible cells of a tablet, read from the node's storage (thread-safe) on this thread. */
static size_t storage_cells(node_env *e, uint64_t tablet_id, cell_ver *out, size_t cap) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(node_db(e->node), tablet_id, &t), ST_OK);
    sto_snapshot *snap;
    sto_iter *it;
    st_err err;
    sto_range all = {0};
    assert_int_equal(sto_snapshot_new(t, &snap, &err), ST_OK);
    assert_int_equal(sto_iter_new(snap, &all, false, &it, &err), ST_OK);
    size_t n = 0;
    sto_cell c;
    st_code rc;
    while ((rc = sto_iter_next(it, &c, &err)) == ST_OK) {
        assert_true(n < cap);
        memset(&out[n], 0, sizeof out[n]);
        memcpy(out[n].row, c.row.data, c.row.len < 15 ? c.row.len : 15);
        memcpy(out[n].qual, c.qualifier.data, c.qualifier.len < 7 ? c.qualifier.len : 7);
        out[n].ts = c.ts_us;
        out[n].version = c.version;
        n++;
    }
    assert_int_equal(rc, ST_NOT_FOUND);
    sto_iter_free(it);
    sto_snapshot_free(snap);
    return n;
}

/* The cells the target wrote for tablet_id, from its commit log (which a later split of that
 * tablet does not change): every record is flagged replicated and keeps a version whose origin
 * and commit time it carries too. The row `multi` arrives as exactly two row mutations (it was
 * written by two). Returns the number of cells. */
static size_t target_log_cells(node_env *e, uint64_t tablet_id, cell_ver *out, size_t cap,
                               const char *multi) {
    sto_log_reader *r;
    st_err err;
    assert_int_equal(sto_log_reader_open(node_db(e->node), 1, &r, &err), ST_OK);
    sto_log_record rec;
    size_t n = 0, multi_records = 0;
    st_code rc;
    while ((rc = sto_log_reader_next(r, &rec, &err)) == ST_OK) {
        if (rec.row.tablet_id != tablet_id)
            continue;
        assert_true(rec.row.flags & STO_ROW_REPLICATED);
        assert_int_equal(rec.row.origin, CLUSTER_NUM);
        assert_int_equal(rec.row.version, STO_VERSION(rec.row.commit_ts_us, CLUSTER_NUM));
        for (size_t i = 0; i < rec.row.n_muts; i++) {
            const sto_mut *mu = &rec.row.muts[i];
            assert_int_equal(mu->type, STO_MUT_SET_CELL);
            assert_true(n < cap);
            memset(&out[n], 0, sizeof out[n]);
            memcpy(out[n].row, rec.row.row.data, rec.row.row.len < 15 ? rec.row.row.len : 15);
            memcpy(out[n].qual, mu->qualifier.data, mu->qualifier.len < 7 ? mu->qualifier.len : 7);
            out[n].ts = mu->ts_us;
            out[n].version = rec.row.version;
            n++;
        }
        if (rec.row.row.len == strlen(multi) && !memcmp(rec.row.row.data, multi, strlen(multi)))
            multi_records++;
    }
    assert_int_equal(rc, ST_NOT_FOUND);
    sto_log_reader_close(r);
    assert_int_equal(multi_records, 2);
    return n;
}

/* The version of the last local (not copied) write of row in e's commit log, 0 when the reader
 * does not see one yet. */
static uint64_t local_version_once(node_env *e, const char *row) {
    sto_log_reader *r;
    st_err err;
    assert_int_equal(sto_log_reader_open(node_db(e->node), 1, &r, &err), ST_OK);
    sto_log_record rec;
    uint64_t v = 0;
    while (sto_log_reader_next(r, &rec, &err) == ST_OK)
        if (!(rec.row.flags & STO_ROW_REPLICATED) && rec.row.row.len == strlen(row) &&
            !memcmp(rec.row.row.data, row, strlen(row)))
            v = rec.row.version;
    sto_log_reader_close(r);
    return v;
}

/* As local_version_once, waiting for the record: without sync the reader's durable end follows
 * an acknowledged write a moment later. */
static uint64_t last_local_version(node_env *e, const char *row) {
    uint64_t v = 0;
    for (int i = 0; i < 1000 && (v = local_version_once(e, row)) == 0; i++)
        usleep(10000);
    assert_true(v != 0);
    return v;
}

/* True when the two lists hold the same cells with the same timestamps and versions. */
static bool same_cells(const cell_ver *a, size_t na, const cell_ver *b, size_t nb) {
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++) {
        bool found = false;
        for (size_t j = 0; j < nb && !found; j++)
            found = !strcmp(a[i].row, b[j].row) && !strcmp(a[i].qual, b[j].qual) &&
                    a[i].ts == b[j].ts && a[i].version == b[j].version;
        if (!found)
            return false;
    }
    return true;
}

/* CopyRows of one SetCell (f:q at ts, value) with version to tablet_id. */
static st_code copy_cell(node_env *e, uint64_t tablet_id, const char *row, int64_t ts,
                         const char *value, uint64_t version, st_err *status) {
    sto_mut mu = {.type = STO_MUT_SET_CELL,
                  .family = st_slice_cstr("f"),
                  .qualifier = st_slice_cstr("q"),
                  .ts_us = ts,
                  .value = st_slice_cstr(value)};
    sto_row_mut rm = {.row = st_slice_cstr(row),
                      .muts = &mu,
                      .n_muts = 1,
                      .version = version,
                      .commit_ts_us = (uint64_t)STO_VERSION_TS_US(version),
                      .origin = (uint32_t)(version & 1023)};
    st_buf enc;
    st_buf_init(&enc);
    assert_int_equal(sto_row_mut_encode(&enc, &rm), ST_OK);
    ProtobufCBinaryData bin = {enc.len, enc.data};
    Strata__Internal__V1__CopyRowsRequest req;
    strata__internal__v1__copy_rows_request__init(&req);
    req.tablet_id = tablet_id;
    req.n_rows = 1;
    req.rows = &bin;
    st_code rc = call(e, IN "CopyRows", &req.base, NULL, status);
    st_buf_free(&enc);
    return rc;
}

/* As copy_cell, to the node's tablet of TABLE that holds row, else to the one that starts with
 * the empty key. B may split it at any moment (its split size is tiny), so a tablet gone, or no
 * longer holding row, in between is looked up again. */
static st_code copy_cell_first(node_env *e, const char *row, int64_t ts, const char *value,
                               uint64_t version, st_err *status) {
    st_code rc = ST_NOT_FOUND;
    st_slice r = st_slice_cstr(row);
    for (int tries = 0; tries < 100; tries++) {
        Strata__Internal__V1__ListTabletsResponse *l = list_tablets(e, TABLE);
        uint64_t id = 0, first = 0;
        for (size_t i = 0; i < l->n_tablets; i++) {
            const Strata__Internal__V1__Tablet *t = l->tablets[i];
            st_slice start = {t->start_key.data, t->start_key.len};
            st_slice end = {t->end_key.data, t->end_key.len};
            if (st_slice_cmp(start, r) <= 0 && (end.len == 0 || st_slice_cmp(r, end) < 0))
                id = t->id;
            if (start.len == 0)
                first = t->id;
        }
        bool held = id != 0;
        if (!held)
            id = first;
        strata__internal__v1__list_tablets_response__free_unpacked(l, NULL);
        assert_true(id != 0);
        rc = copy_cell(e, id, row, ts, value, version, status);
        bool split_away =
            rc == ST_NOT_FOUND || (held && rc == ST_FAILED_PRECONDITION &&
                                   strncmp(status->msg, NOT_OWNER, strlen(NOT_OWNER)) == 0);
        if (!split_away)
            break;
    }
    return rc;
}

/* Writes two more cells (f:q2, f:q3) to row in one mutation: a second version in that row. */
static void mutate_row_two_cells(const node_env *e, const char *row) {
    Google__Bigtable__V2__Mutation m[2], *mp[2] = {&m[0], &m[1]};
    Google__Bigtable__V2__Mutation__SetCell sc[2];
    set_cell(&m[0], &sc[0], (const uint8_t *)"x", 1, 5000);
    set_cell(&m[1], &sc[1], (const uint8_t *)"y", 1, 5000);
    sc[0].column_qualifier = (ProtobufCBinaryData){2, (uint8_t *)"q2"};
    sc[1].column_qualifier = (ProtobufCBinaryData){2, (uint8_t *)"q3"};
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = TABLE;
    req.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    req.n_mutations = 2;
    req.mutations = mp;
    st_err status;
    assert_int_equal(call(e, BT "MutateRow", &req.base, NULL, &status), ST_OK);
}

static void test_internal_move(void **state) {
    (void)state;
    /* A's left half of [, "m") goes to B, with one row written by two mutations. */
    mutate_row_two_cells(&A, "a0000");
    cell_ver *src = calloc(MOVE_CELLS_MAX, sizeof *src), *dst = calloc(MOVE_CELLS_MAX, sizeof *dst);
    size_t n_src = storage_cells(&A, g_left_id, src, MOVE_CELLS_MAX);
    assert_true(n_src > 3);
    for (size_t i = 0; i < n_src; i++)
        assert_int_equal(src[i].version & 1023, CLUSTER_NUM);
    Strata__Internal__V1__ListTabletsResponse *before = list_tablets(&A, TABLE);
    assert_int_equal(before->n_tablets, 2);
    ProtobufCBinaryData split = before->tablets[0]->end_key;
    char mid[16] = {0};
    memcpy(mid, split.data, split.len < 15 ? split.len : 15);
    strata__internal__v1__list_tablets_response__free_unpacked(before, NULL);
    Strata__Internal__V1__MoveTabletRequest req;
    strata__internal__v1__move_tablet_request__init(&req);
    req.id = g_left_id;
    req.target = B.addr;
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    assert_int_equal(call(&A, IN "MoveTablet", &req.base, &resp, &status), ST_OK);
    Strata__Internal__V1__Tablet *t =
        strata__internal__v1__tablet__unpack(NULL, resp.len, resp.data);
    assert_non_null(t);
    assert_int_equal(t->id >> 40, 2); /* B allocated it */
    uint64_t target_id = t->id;
    assert_int_equal(t->start_key.len, 0);
    assert_int_equal(t->end_key.len, strlen(mid));
    strata__internal__v1__tablet__free_unpacked(t, NULL);
    st_buf_free(&resp);
    assert_int_equal(tablet_count(&A, TABLE), 1);
    assert_true(tablet_count(&B, TABLE) >= 1); /* B may have split it since (64 KiB) */
    /* B wrote the same cells with the same timestamps and versions, as replicated rows. */
    size_t n_dst = target_log_cells(&B, target_id, dst, MOVE_CELLS_MAX, "a0000");
    assert_true(same_cells(src, n_src, dst, n_dst));
    /* A copy with an older version of a moved cell loses (a newer one wins, below). src[0] is
     * a0000 f:q (value 100 bytes; the row's q2 and q3 hold one byte each). */
    assert_string_equal(src[0].qual, "q");
    assert_int_equal(copy_cell_first(&B, "a0000", src[0].ts, "old",
                                     src[0].version - (1u << STO_VERSION_TIEBREAK_BITS), &status),
                     ST_OK);
    got g;
    assert_int_equal(read_range(&B, TABLE, "a0000", "a0001", false, &g, &status), ST_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.value_len[0], 100 + 2); /* the row's value bytes: f:q, q2, q3 */
    got_free(&g);
    /* Rows outside the tablet and unknown tablets are refused. */
    assert_not_owner(copy_cell_first(&B, "zz", 1000, "v", src[0].version, &status), &status);
    assert_int_equal(copy_cell(&B, target_id + 1000, "a0000", 1000, "v", src[0].version, &status),
                     ST_NOT_FOUND);
    /* The rows moved with their timestamps; the source no longer owns them. */
    assert_int_equal(read_range(&B, TABLE, "a", mid, false, &g, &status), ST_OK);
    size_t n_left = g.n;
    assert_true(n_left > 0 && n_left < SPLIT_ROWS);
    char keys[SPLIT_ROWS][16];
    split_keys(keys, SPLIT_ROWS);
    for (size_t i = 0; i < n_left; i++) {
        assert_string_equal(g.keys[i], keys[i]);
        assert_int_equal(g.ts[i], 1000 * (int64_t)(i + 1));
        assert_int_equal(g.value_len[i], i == 0 ? 100 + 2 : 100);
    }
    got_free(&g);
    assert_int_equal(copy_cell_first(&B, "a0000", src[0].ts, "new",
                                     src[0].version + (1u << STO_VERSION_TIEBREAK_BITS), &status),
                     ST_OK);
    assert_int_equal(read_range(&B, TABLE, "a0000", "a0001", false, &g, &status), ST_OK);
    assert_int_equal(g.value_len[0], 3 + 2);
    got_free(&g);
    /* A copied commit time ten years ahead is stored but does not move B's clock (its later
     * writes keep versions of now); one a few seconds ahead, a host's clock skew, does. */
    const int64_t hour_us = 3600LL * 1000000, wall_us = st_wall_us();
    assert_int_equal(copy_cell_first(&B, "a0001", 1000, "far",
                                     STO_VERSION(wall_us + 87600 * hour_us, CLUSTER_NUM), &status),
                     ST_OK);
    assert_int_equal(mutate_row(&B, TABLE, "a0002", &status), ST_OK);
    assert_true(STO_VERSION_TS_US(last_local_version(&B, "a0002")) < wall_us + hour_us);
    assert_int_equal(copy_cell_first(&B, "a0001", 1000, "near",
                                     STO_VERSION(wall_us + 5000000, CLUSTER_NUM), &status),
                     ST_OK);
    assert_int_equal(mutate_row(&B, TABLE, "a0003", &status), ST_OK);
    assert_true(STO_VERSION_TS_US(last_local_version(&B, "a0003")) > wall_us + 5000000);
    free(src);
    free(dst);
    assert_not_owner(read_range(&A, TABLE, "a", mid, false, &g, &status), &status);
    got_free(&g);
    assert_not_owner(mutate_row(&A, TABLE, "a0000", &status), &status);
    assert_int_equal(mutate_row(&B, TABLE, "a0000", &status), ST_OK);
    assert_int_equal(read_range(&A, TABLE, mid, "b", false, &g, &status), ST_OK);
    assert_int_equal(g.n, SPLIT_ROWS - n_left);
    got_free(&g);
    req.id = 999; /* unknown tablet */
    assert_int_equal(call(&A, IN "MoveTablet", &req.base, NULL, &status), ST_NOT_FOUND);
    /* A move to the node itself is refused and leaves the tablet in place, writable. */
    Strata__Internal__V1__ListTabletsResponse *left = list_tablets(&A, TABLE);
    req.id = left->tablets[0]->id;
    strata__internal__v1__list_tablets_response__free_unpacked(left, NULL);
    req.target = A.addr;
    assert_int_equal(call(&A, IN "MoveTablet", &req.base, NULL, &status), ST_INVALID_ARGUMENT);
    assert_int_equal(tablet_count(&A, TABLE), 1);
    assert_int_equal(mutate_row(&A, TABLE, "c", &status), ST_OK);
}

/* DATA/incoming of node e, as text ("" when absent). */
static void incoming_file(const node_env *e, char *out, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/incoming", e->dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
}

/* A move's copy (CreateTablet incoming): listed incoming and read_only, recorded in
 * DATA/incoming, refusing client writes and MoveTablet; an incoming CreateTablet over it replaces
 * it; CreateTablet of the same range without incoming activates it (same id, file emptied), and
 * it takes writes. */
static void test_internal_incoming(void **state) {
    (void)state;
    const char *tbl = TABLE "incoming";
    put_table(&B, tbl);
    st_code rc;
    bool inc = false;
    uint64_t first = create_tablet_in(&B, tbl, "", "", true, &rc, &inc);
    assert_int_equal(rc, ST_OK);
    assert_true(inc);
    char text[256], want[64];
    incoming_file(&B, text, sizeof text);
    snprintf(want, sizeof want, "%llu\n", (unsigned long long)first);
    assert_string_equal(text, want);
    Strata__Internal__V1__ListTabletsResponse *r = list_tablets(&B, tbl);
    assert_int_equal(r->n_tablets, 1);
    assert_true(r->tablets[0]->incoming && r->tablets[0]->read_only);
    strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    st_err status;
    assert_not_owner(mutate_row(&B, tbl, "k", &status), &status);
    Strata__Internal__V1__MoveTabletRequest mv;
    strata__internal__v1__move_tablet_request__init(&mv);
    mv.id = first;
    mv.target = A.addr;
    assert_int_equal(call(&B, IN "MoveTablet", &mv.base, NULL, &status), ST_FAILED_PRECONDITION);
    uint64_t second = create_tablet_in(&B, tbl, "", "", true, &rc, &inc);
    assert_int_equal(rc, ST_OK);
    assert_true(second != first && inc); /* the leftover was replaced */
    assert_int_equal(tablet_count(&B, tbl), 1);
    assert_int_equal(create_tablet_in(&B, tbl, "", "", false, &rc, &inc), second);
    assert_int_equal(rc, ST_OK);
    assert_false(inc);
    incoming_file(&B, text, sizeof text);
    assert_string_equal(text, "");
    assert_int_equal(mutate_row(&B, tbl, "k", &status), ST_OK);
}

/* The source's activation of copy id (CreateTablet with `activate`): *rc_out, *incoming_out. */
static void activate_tablet(const node_env *e, const char *table, const char *start,
                            const char *end, uint64_t id, st_code *rc_out, bool *incoming_out) {
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = (char *)table;
    req.activate = id;
    req.start_key = (ProtobufCBinaryData){strlen(start), (uint8_t *)start};
    req.end_key = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
    st_buf resp;
    st_buf_init(&resp);
    st_err status;
    *rc_out = call(e, IN "CreateTablet", &req.base, &resp, &status);
    if (*rc_out == ST_OK) {
        Strata__Internal__V1__Tablet *t =
            strata__internal__v1__tablet__unpack(NULL, resp.len, resp.data);
        assert_non_null(t);
        assert_int_equal(t->id, id);
        *incoming_out = t->incoming;
        strata__internal__v1__tablet__free_unpacked(t, NULL);
    }
    st_buf_free(&resp);
}

/* An activation names its copy: another id or another range is NOT_FOUND, a copy dropped
 * meanwhile (a restart, or idle) is NOT_FOUND and no tablet is created in its place (one used to
 * be, empty, which its source then took for its activated copy); the copy itself is activated,
 * and a repeated activation answers it again. */
static void test_internal_activate_by_id(void **state) {
    (void)state;
    const char *tbl = TABLE "activate";
    put_table(&B, tbl);
    st_code rc;
    bool inc = true;
    uint64_t copy = create_tablet_in(&B, tbl, "a", "m", true, &rc, &inc);
    assert_int_equal(rc, ST_OK);
    activate_tablet(&B, tbl, "a", "m", copy + 1, &rc, &inc);
    assert_int_equal(rc, ST_NOT_FOUND);
    activate_tablet(&B, tbl, "a", "z", copy, &rc, &inc);
    assert_int_equal(rc, ST_NOT_FOUND);
    Strata__Internal__V1__DropTabletRequest dt;
    strata__internal__v1__drop_tablet_request__init(&dt);
    dt.id = copy;
    st_err status;
    assert_int_equal(call(&B, IN "DropTablet", &dt.base, NULL, &status), ST_OK);
    activate_tablet(&B, tbl, "a", "m", copy, &rc, &inc);
    assert_int_equal(rc, ST_NOT_FOUND);
    assert_int_equal(tablet_count(&B, tbl), 0);
    copy = create_tablet_in(&B, tbl, "a", "m", true, &rc, &inc);
    assert_int_equal(rc, ST_OK);
    for (int i = 0; i < 2; i++) {
        inc = true;
        activate_tablet(&B, tbl, "a", "m", copy, &rc, &inc);
        assert_int_equal(rc, ST_OK);
        assert_false(inc);
    }
    char text[256];
    incoming_file(&B, text, sizeof text);
    assert_string_equal(text, "");
    assert_int_equal(tablet_count(&B, tbl), 1);
}

static void test_internal_drop(void **state) {
    (void)state;
    Strata__Internal__V1__DropTabletRequest dt;
    strata__internal__v1__drop_tablet_request__init(&dt);
    st_err status;
    size_t dropped = 0;
    /* B splits tablets above 64 KiB on a timer: one listed here may be split into two new ids
     * before its DropTablet arrives (NOT_FOUND then); its halves are in the next listing. */
    for (int round = 0; round < 100 && tablet_count(&B, TABLE) > 0; round++) {
        Strata__Internal__V1__ListTabletsResponse *r = list_tablets(&B, TABLE);
        for (size_t i = 0; i < r->n_tablets; i++) {
            dt.id = r->tablets[i]->id;
            st_code rc = call(&B, IN "DropTablet", &dt.base, NULL, &status);
            if (rc == ST_NOT_FOUND)
                continue;
            assert_int_equal(rc, ST_OK);
            dropped++;
            assert_int_equal(call(&B, IN "DropTablet", &dt.base, NULL, &status), ST_NOT_FOUND);
        }
        strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    }
    assert_true(dropped >= 1);
    assert_int_equal(tablet_count(&B, TABLE), 0);
    Strata__Internal__V1__DropTableRequest drop;
    strata__internal__v1__drop_table_request__init(&drop);
    drop.name = TABLE;
    assert_int_equal(call(&A, IN "DropTable", &drop.base, NULL, &status), ST_OK);
    assert_int_equal(call(&A, IN "DropTable", &drop.base, NULL, &status), ST_OK); /* idempotent */
    assert_int_equal(tablet_count(&A, TABLE), 0);
    assert_int_equal(mutate_row(&A, TABLE, "c", &status), ST_NOT_FOUND);
}

/* ---- harness: both nodes on the main thread's base, the tests on a client thread ---- */

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_internal_put_list_create),
        cmocka_unit_test(test_internal_not_owner),
        cmocka_unit_test(test_internal_split_then_read),
        cmocka_unit_test(test_internal_auto_split),
        cmocka_unit_test(test_internal_move),
        cmocka_unit_test(test_internal_incoming),
        cmocka_unit_test(test_internal_activate_by_id),
        cmocka_unit_test(test_internal_drop),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(g_base);
    return NULL;
}

static void open_node(node_env *e, const char *name, uint32_t num, uint64_t split_bytes) {
    tu_tmpdir(e->dir, sizeof e->dir, name);
    node_opts o;
    node_opts_default(&o);
    o.data_dir = e->dir;
    o.listen_port = 0;
    o.sync = false;
    o.node_num = num;
    o.cluster_num = CLUSTER_NUM;
    o.split_bytes = split_bytes;
    o.split_check_ms = 10;
    st_err err;
    if (node_open(g_base, &o, &e->node, &err) != ST_OK) {
        fprintf(stderr, "node_open: %s\n", err.msg);
        exit(1);
    }
    snprintf(e->addr, sizeof e->addr, "127.0.0.1:%u", node_port(e->node));
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as strata-node's main does: a client hanging up is not fatal */
    evthread_use_pthreads();
    g_base = event_base_new();
    open_node(&A, "internal_a", 1, 0);
    open_node(&B, "internal_b", 2, 64 << 10);
    pthread_t th;
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(A.node);
    node_close(B.node);
    event_base_free(g_base);
    tu_rmrf(A.dir);
    tu_rmrf(B.dir);
    return g_failures;
}
