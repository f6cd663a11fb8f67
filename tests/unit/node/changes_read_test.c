/*
 * Proves the read side of change streams (node/changes_read.c) where it needs what only an
 * in-process node gives (a compaction on demand, cluster members, tablet moves), with nodes
 * sharing one event_base on the main thread and the tests on a client thread talking gRPC:
 * - a compaction that drops cells by a GC rule shows in the stream as a GARBAGE_COLLECTION
 *   record without source cluster, after the USER records (source "strata", the default of a
 *   node without topology or --cluster-id);
 * - a cluster member answers strata-not-owner for a partition that no tablet of its holds,
 *   and GenerateInitialChangeStreamPartitions gives its own tablets only (none: no partition);
 * - a tablet moved away while streaming ends the stream with CloseStream OUT_OF_RANGE naming
 *   the partition itself (its rows are elsewhere now) with a token, from which the target node
 *   goes on: the rows written before the move are not sent again, one written after it is;
 * - a client that does not read holds the node's queued response bytes near the call's queue
 *   bound (1 MiB) while 20 MiB of history wait, and then gets every record; so does a live
 *   stream's client that stops reading while 20 writes of 1 MiB are made, and it then gets
 *   every record and the heartbeats after them;
 * - records read back from storage carry the values they hold by reference as the cells have
 *   them then (written, overwritten at the same timestamp, deleted or hidden by a GC rule), and
 *   the values they keep inline (small, or deleted by the same row mutation) as written;
 * - one record of 12 MiB written while a live client does not read, from the ring (node S) and
 *   from storage (node R, whose ring is smaller than the record, as a cell over the 64 MiB ring
 *   is in production): the node queues about the call's bound, not the record (its messages go
 *   out over several turns), and the client then gets the whole value, once;
 * - a stream asked for batches (x-strata-cs-batch, as the router asks) gets a turn's records
 *   in one message of framed messages, and those are byte for byte the messages the same
 *   stream without the header gets one by one (which holds no batch).
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
#include "changes.h"
#include "raw_h2.h"
#include "strata/cstoken.h"
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
#define RECS_MAX 32

typedef struct node_env {
    node_ctx *node;
    char addr[64];
    char dir[512];
} node_env;

static struct event_base *g_base;
static node_env S, A, B; /* S standalone; A, B cluster members 1 and 2 */

static st_code call(const node_env *e, const char *path, const ProtobufCMessage *req, st_buf *resp,
                    st_err *status) {
    return bt_call_pb(e->addr, path, req, TIMEOUT_MS, resp, status);
}

/* A Table with family f (max versions `versions`, 0 = no rule) and a retention of a day. */
typedef struct table_pb {
    Google__Bigtable__Admin__V2__Table t;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e, *ep;
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    Google__Bigtable__Admin__V2__GcRule rule;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cs;
    Google__Protobuf__Duration d;
} table_pb;

static void table_pb_init(table_pb *tb, const char *name, int versions) {
    memset(tb, 0, sizeof *tb);
    google__bigtable__admin__v2__table__init(&tb->t);
    google__bigtable__admin__v2__gc_rule__init(&tb->rule);
    if (versions) {
        tb->rule.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
        tb->rule.max_num_versions = versions;
    }
    tb->t.name = (char *)name;
    google__bigtable__admin__v2__table__column_families_entry__init(&tb->e);
    google__bigtable__admin__v2__column_family__init(&tb->cf);
    tb->cf.gc_rule = &tb->rule;
    tb->e.key = "f";
    tb->e.value = &tb->cf;
    tb->ep = &tb->e;
    tb->t.column_families = &tb->ep;
    tb->t.n_column_families = 1;
    google__bigtable__admin__v2__change_stream_config__init(&tb->cs);
    google__protobuf__duration__init(&tb->d);
    tb->d.seconds = DAY_S;
    tb->cs.retention_period = &tb->d;
    tb->t.change_stream_config = &tb->cs;
}

static st_code put(const node_env *e, const char *table, const char *key, int64_t ts) {
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    google__bigtable__v2__mutation__init(&m);
    google__bigtable__v2__mutation__set_cell__init(&sc);
    sc.family_name = "f";
    sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    sc.timestamp_micros = ts;
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &sc;
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &mp;
    st_err status;
    return call(e, BT "MutateRow", &req.base, NULL, &status);
}

/* ---- streams ---- */

typedef struct rec {
    int type;
    char source[32], row[32];
    int mut_case;
    char token[128];
    /* the record's first SetCell: its value's length and byte (-1: bytes differ) */
    bool has_set;
    size_t set_len;
    int set_byte;
    int n_chunks;
} rec;

typedef struct stream {
    rec recs[RECS_MAX];
    size_t n_recs, heartbeats;
    size_t n_done; /* every record, also past RECS_MAX */
    bool closed;
    int close_code;
    size_t n_new, n_tok;
    char tok_text[128];
    bool new_whole, tok_whole; /* the first new partition / token partition is [ , ) */
    /* on the first heartbeat, once */
    void (*on_heartbeat)(struct stream *s);
    int stop_after_heartbeats;
} stream;

static bool whole(const Google__Bigtable__V2__StreamPartition *p) {
    return p &&
           (!p->row_range ||
            (p->row_range->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY__NOT_SET &&
             p->row_range->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY__NOT_SET));
}

static void on_data(stream *s,
                    const Google__Bigtable__V2__ReadChangeStreamResponse__DataChange *d) {
    if (!d->done) /* the records here fit one message each */
        return;
    rec spare;
    memset(&spare, 0, sizeof spare);
    s->n_done++;
    rec *r = s->n_recs < RECS_MAX ? &s->recs[s->n_recs++] : &spare;
    r->type = d->type;
    snprintf(r->source, sizeof r->source, "%s", d->source_cluster_id);
    snprintf(r->row, sizeof r->row, "%.*s", (int)d->row_key.len, (const char *)d->row_key.data);
    r->mut_case = d->n_chunks ? (int)d->chunks[0]->mutation->mutation_case : 0;
    snprintf(r->token, sizeof r->token, "%s", d->token);
    r->n_chunks = (int)d->n_chunks;
    for (size_t i = 0; i < d->n_chunks && !r->has_set; i++) {
        const Google__Bigtable__V2__Mutation *m = d->chunks[i]->mutation;
        if (m->mutation_case != GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL)
            continue;
        ProtobufCBinaryData v = m->set_cell->value;
        r->has_set = true;
        r->set_len = v.len;
        r->set_byte = v.len ? v.data[0] : 0;
        for (size_t k = 1; k < v.len; k++)
            if (v.data[k] != v.data[0])
                r->set_byte = -1;
    }
}

static void on_msg(st_slice msg, void *arg) {
    stream *s = arg;
    Google__Bigtable__V2__ReadChangeStreamResponse *r =
        google__bigtable__v2__read_change_stream_response__unpack(NULL, msg.len, msg.data);
    if (!r)
        return;
    switch (r->stream_record_case) {
    case GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE:
        on_data(s, r->data_change);
        break;
    case GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT:
        if (s->heartbeats++ == 0 && s->on_heartbeat)
            s->on_heartbeat(s);
        break;
    case GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM: {
        const Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream *c = r->close_stream;
        s->closed = true;
        s->close_code = c->status ? c->status->code : 0;
        s->n_new = c->n_new_partitions;
        s->n_tok = c->n_continuation_tokens;
        s->new_whole = s->n_new && whole(c->new_partitions[0]);
        s->tok_whole = s->n_tok && whole(c->continuation_tokens[0]->partition);
        if (s->n_tok)
            snprintf(s->tok_text, sizeof s->tok_text, "%s", c->continuation_tokens[0]->token);
        break;
    }
    default:
        break;
    }
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
}

typedef struct req_opts {
    const char *table;
    const char *start, *end; /* partition; NULL = unbounded */
    int64_t start_us;
    const char *token; /* for the whole partition */
    int64_t end_us;
    int64_t hb_ms;
} req_opts;

static st_code read_stream(const node_env *e, const req_opts *o, stream *s, st_err *status) {
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = (char *)o->table;
    Google__Bigtable__V2__StreamPartition p, tp;
    Google__Bigtable__V2__RowRange rr, trr;
    btu_cs_partition_set(&p, &rr, st_slice_cstr(o->start ? o->start : ""),
                         st_slice_cstr(o->end ? o->end : ""));
    req.partition = &p;
    Google__Protobuf__Timestamp st, et;
    Google__Bigtable__V2__StreamContinuationTokens toks;
    Google__Bigtable__V2__StreamContinuationToken tok, *tokp = &tok;
    if (o->start_us) {
        btu_cs_time_set(&st, o->start_us);
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
        req.start_time = &st;
    } else if (o->token) {
        google__bigtable__v2__stream_continuation_tokens__init(&toks);
        google__bigtable__v2__stream_continuation_token__init(&tok);
        btu_cs_partition_set(&tp, &trr, st_slice_cstr(""), st_slice_cstr(""));
        tok.partition = &tp;
        tok.token = (char *)o->token;
        toks.tokens = &tokp;
        toks.n_tokens = 1;
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS;
        req.continuation_tokens = &toks;
    }
    if (o->end_us) {
        btu_cs_time_set(&et, o->end_us);
        req.end_time = &et;
    }
    Google__Protobuf__Duration hb;
    google__protobuf__duration__init(&hb);
    if (o->hb_ms) {
        hb.nanos = (int32_t)o->hb_ms * 1000000;
        req.heartbeat_duration = &hb;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    memset(status, 0, sizeof *status);
    st_code rc = rpc_blocking_stream(e->addr, NULL, BT "ReadChangeStream", st_slice_make(buf, len),
                                     NULL, 0, TIMEOUT_MS, on_msg, s, status);
    free(buf);
    return rc;
}

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

/* ---- tests ---- */

static void test_cs_read_gc_record(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, NULL, 1); /* max versions 1 */
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = PARENT;
    req.table_id = "gc";
    req.table = &tb.t;
    st_err status;
    assert_int_equal(call(&S, TA "CreateTable", &req.base, NULL, &status), ST_OK);
    int64_t t0 = st_wall_us() + 1000;
    while (st_wall_us() <= t0)
        usleep(500);
    uint64_t ids[16];
    assert_int_equal(table_tablets(&S, TBL("gc"), ids), 1);
    for (int64_t ts = 1000; ts <= 3000; ts += 1000) {
        assert_int_equal(put(&S, TBL("gc"), "k", ts), ST_OK);
        assert_int_equal(sto_tablet_flush(node_db(S.node), ids[0], NULL), ST_OK);
    }
    assert_int_equal(sto_tablet_compact(node_db(S.node), ids[0], NULL), ST_OK);
    /* The GC record is written after the compaction reports: read until it is there. */
    stream *s = calloc(1, sizeof *s);
    for (int i = 0; i < 5000; i++) {
        memset(s, 0, sizeof *s);
        req_opts o = {.table = TBL("gc"), .start_us = t0, .end_us = st_wall_us()};
        assert_int_equal(read_stream(&S, &o, s, &status), ST_OK);
        if (s->n_recs >= 4)
            break;
        usleep(1000);
    }
    assert_int_equal(s->n_recs, 4);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s->recs[i].type, 1); /* USER */
        assert_string_equal(s->recs[i].source, "strata");
    }
    assert_int_equal(s->recs[3].type, 2); /* GARBAGE_COLLECTION */
    assert_string_equal(s->recs[3].source, "");
    assert_int_equal(s->recs[3].mut_case,
                     GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN);
    assert_true(s->closed);
    free(s);
}

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

static void put_table(const node_env *e, const char *name) {
    table_pb tb;
    table_pb_init(&tb, name, 0);
    Strata__Internal__V1__PutTableRequest pt;
    strata__internal__v1__put_table_request__init(&pt);
    pt.table = &tb.t;
    st_err status;
    assert_int_equal(call(e, IN "PutTable", &pt.base, NULL, &status), ST_OK);
}

static void count_part(st_slice msg, void *arg) {
    (void)msg;
    ++*(int *)arg;
}

static int partitions(const node_env *e, const char *table) {
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest req;
    google__bigtable__v2__generate_initial_change_stream_partitions_request__init(&req);
    req.table_name = (char *)table;
    uint8_t buf[256];
    size_t len = protobuf_c_message_pack(&req.base, buf);
    int n = 0;
    st_err status;
    assert_int_equal(rpc_blocking_stream(e->addr, NULL, BT "GenerateInitialChangeStreamPartitions",
                                         st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, count_part,
                                         &n, &status),
                     ST_OK);
    return n;
}

static uint64_t g_move_id;

/* Runs from the stream's first heartbeat: moves the tablet away from A to B. */
static void move_now(stream *s) {
    (void)s;
    Strata__Internal__V1__MoveTabletRequest mv;
    strata__internal__v1__move_tablet_request__init(&mv);
    mv.id = g_move_id;
    mv.target = B.addr;
    st_err status;
    assert_int_equal(call(&A, IN "MoveTablet", &mv.base, NULL, &status), ST_OK);
}

static void test_cs_read_member_and_move(void **state) {
    (void)state;
    put_table(&A, TBL("m"));
    put_table(&B, TBL("m"));
    assert_int_equal(partitions(&B, TBL("m")), 0); /* B holds no tablet of it yet */
    g_move_id = create_tablet(&A, TBL("m"));
    assert_int_equal(partitions(&A, TBL("m")), 1);
    /* No tablet of B holds it: strata-not-owner (the router then asks the right node). */
    stream *s = calloc(1, sizeof *s);
    st_err status;
    req_opts o = {.table = TBL("m"), .start = "a", .end = "b"};
    assert_int_equal(read_stream(&B, &o, s, &status), ST_FAILED_PRECONDITION);
    assert_non_null(strstr(status.msg, "strata-not-owner"));
    /* Stream the whole tablet; the first heartbeat moves it to B. */
    int64_t t0 = st_wall_us();
    assert_int_equal(put(&A, TBL("m"), "m1", 1000), ST_OK);
    assert_int_equal(put(&A, TBL("m"), "m2", 1000), ST_OK);
    memset(s, 0, sizeof *s);
    s->on_heartbeat = move_now;
    o = (req_opts){.table = TBL("m"), .start_us = t0, .hb_ms = 100};
    assert_int_equal(read_stream(&A, &o, s, &status), ST_OK);
    assert_int_equal(s->n_recs, 2);
    assert_true(s->closed);
    assert_int_equal(s->close_code, ST_OUT_OF_RANGE);
    assert_int_equal(s->n_new, 1);
    assert_int_equal(s->n_tok, 1);
    assert_true(s->new_whole && s->tok_whole); /* its rows are elsewhere: the same partition */
    char token[128];
    snprintf(token, sizeof token, "%s", s->tok_text);
    /* B goes on from the token: the moved history is not sent again, a new write is. */
    assert_int_equal(put(&B, TBL("m"), "m3", 1000), ST_OK);
    memset(s, 0, sizeof *s);
    o = (req_opts){.table = TBL("m"), .token = token, .end_us = st_wall_us()};
    assert_int_equal(read_stream(&B, &o, s, &status), ST_OK);
    assert_int_equal(s->n_recs, 1);
    assert_string_equal(s->recs[0].row, "m3");
    assert_true(s->closed);
    assert_int_equal(s->close_code, 0);
    free(s);
}

/* ---- a client that does not read ---- */

#define SLOW_RECORDS 40
#define SLOW_VALUE_BYTES ((size_t)512 << 10)
/* What the node may queue for the one stalled call: its queue bound (1 MiB), the record that
 * crossed it and the messages of a turn, with slack. 20 MiB wait. */
#define SLOW_QUEUED_MAX ((size_t)4 << 20)
/* The live case: records of 1 MiB (each one a turn's whole share of bytes). */
#define LIVE_RECORDS 20
#define LIVE_VALUE_BYTES ((size_t)1 << 20)
#define SLOW_HEARTBEAT_MS 200

#define NVS(n, v)                                                                                  \
    { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0 }

static st_code put_big(const char *table, const char *key, const uint8_t *v) {
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    google__bigtable__v2__mutation__init(&m);
    google__bigtable__v2__mutation__set_cell__init(&sc);
    sc.family_name = "f";
    sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc.value = (ProtobufCBinaryData){
        strcmp(table, TBL("big")) == 0 ? SLOW_VALUE_BYTES : LIVE_VALUE_BYTES, (uint8_t *)v};
    sc.timestamp_micros = 1000;
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &sc;
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &mp;
    st_err status;
    return call(&S, BT "MutateRow", &req.base, NULL, &status);
}

/* The gRPC-framed ReadChangeStream request of table from t0 to t_end (0: live, no end, with
 * heartbeats every SLOW_HEARTBEAT_MS). */
static size_t slow_request(uint8_t *out, size_t cap, const char *table, int64_t t0, int64_t t_end) {
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = (char *)table;
    Google__Bigtable__V2__StreamPartition p;
    Google__Bigtable__V2__RowRange rr;
    btu_cs_partition_set(&p, &rr, st_slice_cstr(""), st_slice_cstr(""));
    req.partition = &p;
    Google__Protobuf__Timestamp st, et;
    btu_cs_time_set(&st, t0);
    btu_cs_time_set(&et, t_end);
    req.start_from_case = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
    req.start_time = &st;
    Google__Protobuf__Duration hb;
    google__protobuf__duration__init(&hb);
    hb.nanos = SLOW_HEARTBEAT_MS * 1000000;
    if (t_end)
        req.end_time = &et;
    else
        req.heartbeat_duration = &hb;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    assert_true(len + 5 <= cap);
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
    protobuf_c_message_pack(&req.base, out + 5);
    return len + 5;
}

/* Records (DataChange messages with done) in gRPC-framed response bytes. */
static size_t count_records(const st_buf *data) {
    size_t n = 0;
    for (size_t off = 0; off + 5 <= data->len;) {
        size_t len = (size_t)data->data[off + 1] << 24 | (size_t)data->data[off + 2] << 16 |
                     (size_t)data->data[off + 3] << 8 | data->data[off + 4];
        assert_true(off + 5 + len <= data->len);
        Google__Bigtable__V2__ReadChangeStreamResponse *r =
            google__bigtable__v2__read_change_stream_response__unpack(NULL, len,
                                                                      data->data + off + 5);
        assert_non_null(r);
        n += r->stream_record_case ==
                 GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE &&
             r->data_change->done;
        google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
        off += 5 + len;
    }
    return n;
}

static void test_cs_read_slow_client(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, NULL, 0);
    Google__Bigtable__Admin__V2__CreateTableRequest creq;
    google__bigtable__admin__v2__create_table_request__init(&creq);
    creq.parent = PARENT;
    creq.table_id = "big";
    creq.table = &tb.t;
    st_err status;
    assert_int_equal(call(&S, TA "CreateTable", &creq.base, NULL, &status), ST_OK);
    int64_t t0 = st_wall_us() + 1000;
    while (st_wall_us() <= t0)
        usleep(500);
    uint8_t *v = malloc(SLOW_VALUE_BYTES);
    memset(v, 'x', SLOW_VALUE_BYTES);
    for (int i = 0; i < SLOW_RECORDS; i++) {
        char key[16];
        snprintf(key, sizeof key, "b%03d", i);
        assert_int_equal(put_big(TBL("big"), key, v), ST_OK);
    }
    free(v);
    uint8_t body[1024];
    raw_call r = {.fd = raw_tcp_connect((uint16_t)atoi(strchr(S.addr, ':') + 1), 4096),
                  .grpc_status = -1};
    assert_true(r.fd >= 0);
    r.body = body;
    r.body_len = slow_request(body, sizeof body, TBL("big"), t0, st_wall_us());
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, true);
    assert_non_null(s);
    nghttp2_nv nva[] = {NVS(":method", "POST"),
                        NVS(":scheme", "http"),
                        NVS(":path", BT "ReadChangeStream"),
                        NVS(":authority", "t"),
                        NVS("content-type", "application/grpc"),
                        NVS("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 6, &prd, NULL) > 0);
    assert_int_equal(nghttp2_session_send(s), 0);
    /* Not reading: the socket fills, then the call's queue. Watch what the node queues. */
    size_t peak = 0;
    for (int ms = 0; ms < 60000 && peak < SLOW_VALUE_BYTES; ms++) { /* it starts sending */
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
        usleep(1000);
    }
    for (int ms = 0; ms < 300; ms++) { /* a stalled reader would pile up 20 MiB by now */
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
        usleep(1000);
    }
    static uint8_t buf[1 << 16];
    while (!r.closed) {
        ssize_t n = recv(r.fd, buf, sizeof buf, 0);
        assert_true(n > 0);
        assert_true(nghttp2_session_mem_recv(s, buf, (size_t)n) == n);
        assert_int_equal(nghttp2_session_send(s), 0);
    }
    assert_int_equal(r.grpc_status, 0);
    assert_int_equal(count_records(&r.data), SLOW_RECORDS);
    printf("queued response bytes peak with a stalled reader: %zu\n", peak);
    assert_true(peak >= SLOW_VALUE_BYTES);
    assert_true(peak <= SLOW_QUEUED_MAX);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
}

/* Counts the complete messages in data from *off_io on, which moves past them: records
 * (DataChange with done) into *records, and heartbeats into *heartbeats_after, which a record
 * sets back to 0. Only what arrived since the last call is parsed: the client reads 20 MiB a few
 * KiB at a time, and parsing every 1 MiB record again on each read made the case quadratic. */
static void count_live(const st_buf *data, size_t *off_io, size_t *records,
                       size_t *heartbeats_after) {
    for (size_t off = *off_io; off + 5 <= data->len; *off_io = off) {
        size_t len = (size_t)data->data[off + 1] << 24 | (size_t)data->data[off + 2] << 16 |
                     (size_t)data->data[off + 3] << 8 | data->data[off + 4];
        if (off + 5 + len > data->len)
            return; /* still arriving */
        Google__Bigtable__V2__ReadChangeStreamResponse *r =
            google__bigtable__v2__read_change_stream_response__unpack(NULL, len,
                                                                      data->data + off + 5);
        assert_non_null(r);
        if (r->stream_record_case ==
                GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE &&
            r->data_change->done) {
            (*records)++;
            *heartbeats_after = 0;
        } else if (r->stream_record_case ==
                   GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT) {
            (*heartbeats_after)++;
        }
        google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
        off += 5 + len;
    }
}

/* A live stream (no end time) whose client stops reading while LIVE_RECORDS writes of 1 MiB
 * are made: the node queues about the call's bound (each record is a turn's whole share, and a
 * turn must not end for its share with the queue full), then, once the client reads, every
 * record arrives and the heartbeats go on. */
static void test_cs_read_live_slow_client(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, NULL, 0);
    Google__Bigtable__Admin__V2__CreateTableRequest creq;
    google__bigtable__admin__v2__create_table_request__init(&creq);
    creq.parent = PARENT;
    creq.table_id = "live";
    creq.table = &tb.t;
    st_err status;
    assert_int_equal(call(&S, TA "CreateTable", &creq.base, NULL, &status), ST_OK);
    int64_t t0 = st_wall_us();
    uint8_t body[1024];
    raw_call r = {.fd = raw_tcp_connect((uint16_t)atoi(strchr(S.addr, ':') + 1), 4096),
                  .grpc_status = -1};
    assert_true(r.fd >= 0);
    struct timeval tv = {TIMEOUT_MS / 1000, 0}; /* a stream that goes silent fails, not hangs */
    assert_int_equal(setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    r.body = body;
    r.body_len = slow_request(body, sizeof body, TBL("live"), t0, 0);
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, true);
    assert_non_null(s);
    nghttp2_nv nva[] = {NVS(":method", "POST"),
                        NVS(":scheme", "http"),
                        NVS(":path", BT "ReadChangeStream"),
                        NVS(":authority", "t"),
                        NVS("content-type", "application/grpc"),
                        NVS("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 6, &prd, NULL) > 0);
    assert_int_equal(nghttp2_session_send(s), 0);
    /* Not reading while the writes are made (each acknowledged after the node ran its turns). */
    uint8_t *v = malloc(LIVE_VALUE_BYTES);
    memset(v, 'y', LIVE_VALUE_BYTES);
    size_t peak = 0;
    for (int i = 0; i < LIVE_RECORDS; i++) {
        char key[16];
        snprintf(key, sizeof key, "l%03d", i);
        assert_int_equal(put_big(TBL("live"), key, v), ST_OK);
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
    }
    free(v);
    for (int ms = 0; ms < 300; ms++) { /* the reader's turns after the last write */
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
        usleep(1000);
    }
    static uint8_t buf[1 << 16];
    size_t recs = 0, hbs = 0, parsed = 0;
    while (recs < LIVE_RECORDS || hbs < 2) {
        ssize_t n = recv(r.fd, buf, sizeof buf, 0);
        assert_true(n > 0); /* silent for TIMEOUT_MS: the stream hangs */
        assert_true(nghttp2_session_mem_recv(s, buf, (size_t)n) == n);
        assert_int_equal(nghttp2_session_send(s), 0);
        assert_false(r.closed);
        count_live(&r.data, &parsed, &recs, &hbs);
    }
    printf("queued response bytes peak with a stalled live reader: %zu\n", peak);
    assert_int_equal(recs, LIVE_RECORDS);
    assert_true(peak <= SLOW_QUEUED_MAX);
    nghttp2_session_del(s);
    close(r.fd); /* the node cancels the call */
    st_buf_free(&r.data);
}

/* ---- values by reference ---- */

#define REF_VALUE_BYTES 5000 /* above node R's ring: its records are read from storage */
#define R_RING_BYTES 4096
#define REF_ROW_WRITES 300 /* above the 256 records a scan holds of one row */

static node_env R; /* a standalone node with a ring too small for any record here */

/* MutateRow on R of key: for each letter of sets a SetCell f:q at ts (REF_VALUE_BYTES of that
 * letter, or one byte when small), then, when del is 'c', a DeleteFromColumn f:q, when 'r' a
 * DeleteFromRow. */
static void ref_write(const char *key, const char *sets, int64_t ts, bool small, char del) {
    Google__Bigtable__V2__Mutation m[4], *mp[4];
    Google__Bigtable__V2__Mutation__SetCell sc[3];
    Google__Bigtable__V2__Mutation__DeleteFromColumn dc;
    Google__Bigtable__V2__Mutation__DeleteFromRow dr;
    static uint8_t vals[3][REF_VALUE_BYTES];
    size_t n = 0;
    for (size_t i = 0; sets[i] && i < 3; i++, n++) {
        memset(vals[i], sets[i], REF_VALUE_BYTES);
        google__bigtable__v2__mutation__init(&m[n]);
        google__bigtable__v2__mutation__set_cell__init(&sc[i]);
        sc[i].family_name = "f";
        sc[i].column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
        sc[i].value = (ProtobufCBinaryData){small ? 1 : REF_VALUE_BYTES, vals[i]};
        sc[i].timestamp_micros = ts;
        m[n].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
        m[n].set_cell = &sc[i];
    }
    if (del == 'c') {
        google__bigtable__v2__mutation__init(&m[n]);
        google__bigtable__v2__mutation__delete_from_column__init(&dc);
        dc.family_name = "f";
        dc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
        m[n].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN;
        m[n++].delete_from_column = &dc;
    } else if (del == 'r') {
        google__bigtable__v2__mutation__init(&m[n]);
        google__bigtable__v2__mutation__delete_from_row__init(&dr);
        m[n].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
        m[n++].delete_from_row = &dr;
    }
    for (size_t i = 0; i < n; i++)
        mp[i] = &m[i];
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = TBL("refs");
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = n;
    req.mutations = mp;
    st_err status;
    assert_int_equal(call(&R, BT "MutateRow", &req.base, NULL, &status), ST_OK);
}

static void expect_set(const rec *r, const char *row, size_t len, int byte) {
    assert_string_equal(r->row, row);
    assert_true(r->has_set);
    assert_int_equal(r->set_len, len);
    if (len)
        assert_int_equal(r->set_byte, byte);
}

/* Records read back from storage (catch-up) carry the values the cells have when read: the
 * value written, a later value written at the same timestamp, or none for a cell deleted or
 * hidden by the GC rule since; a value the same row mutation deleted stays in the record, and
 * so do values under NODE_CS_REF_MIN_BYTES. */
static void test_cs_read_values_by_reference(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, NULL, 1); /* max versions 1 */
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = PARENT;
    req.table_id = "refs";
    req.table = &tb.t;
    st_err status;
    assert_int_equal(call(&R, TA "CreateTable", &req.base, NULL, &status), ST_OK);
    int64_t t0 = st_wall_us() + 1000;
    while (st_wall_us() <= t0)
        usleep(500);
    ref_write("ra", "A", 1000, false, 0);   /* kept: its value */
    ref_write("rb", "B", 1000, false, 0);   /* overwritten at the same timestamp */
    ref_write("rb", "C", 1000, false, 0);   /*   both records carry C */
    ref_write("rc", "D", 1000, false, 0);   /* deleted later: no value */
    ref_write("rc", "", 0, false, 'r');     /*   DeleteFromRow */
    ref_write("rd", "E", 1000, false, 0);   /* hidden by max versions 1: no value */
    ref_write("rd", "F", 2000, false, 0);   /*   F */
    ref_write("re", "G", 1000, false, 'c'); /* deleted by its own row mutation: G stays */
    ref_write("rf", "H", 1000, true, 0);    /* small: inline */
    ref_write("rf", "", 0, false, 'r');     /*   and deleted: still H */
    stream *s = calloc(1, sizeof *s);
    req_opts o = {.table = TBL("refs"), .start_us = t0, .end_us = st_wall_us()};
    assert_int_equal(read_stream(&R, &o, s, &status), ST_OK);
    assert_true(s->closed);
    assert_int_equal(s->n_recs, 10);
    expect_set(&s->recs[0], "ra", REF_VALUE_BYTES, 'A');
    expect_set(&s->recs[1], "rb", REF_VALUE_BYTES, 'C');
    expect_set(&s->recs[2], "rb", REF_VALUE_BYTES, 'C');
    expect_set(&s->recs[3], "rc", 0, 0);
    assert_int_equal(s->recs[4].mut_case,
                     GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY);
    expect_set(&s->recs[5], "rd", 0, 0);
    expect_set(&s->recs[6], "rd", REF_VALUE_BYTES, 'F');
    expect_set(&s->recs[7], "re", REF_VALUE_BYTES, 'G');
    assert_int_equal(s->recs[7].n_chunks, 2);
    expect_set(&s->recs[8], "rf", 1, 'H');
    assert_string_equal(s->recs[9].row, "rf");

    /* A row with more records in the window than a scan holds: they go out in groups, each
     * looked up in the row by an iterator of its own; all reference one cell (same timestamp),
     * whose value is the last one written. */
    t0 = st_wall_us();
    for (int i = 0; i < REF_ROW_WRITES; i++)
        ref_write("rg", i + 1 == REF_ROW_WRITES ? "Z" : "Y", 1000, false, 0);
    memset(s, 0, sizeof *s);
    o = (req_opts){.table = TBL("refs"), .start_us = t0, .end_us = st_wall_us()};
    assert_int_equal(read_stream(&R, &o, s, &status), ST_OK);
    assert_int_equal(s->n_done, REF_ROW_WRITES);
    for (size_t i = 0; i < s->n_recs; i++)
        expect_set(&s->recs[i], "rg", REF_VALUE_BYTES, 'Z');
    free(s);
}

/* ---- one record larger than a turn's share ---- */

#define HUGE_VALUE_BYTES ((size_t)12 << 20)

static void put_value(const node_env *e, const char *table, const char *key, const uint8_t *v,
                      size_t len) {
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    google__bigtable__v2__mutation__init(&m);
    google__bigtable__v2__mutation__set_cell__init(&sc);
    sc.family_name = "f";
    sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc.value = (ProtobufCBinaryData){len, (uint8_t *)v};
    sc.timestamp_micros = 1000;
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &sc;
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &mp;
    st_err status;
    assert_int_equal(call(e, BT "MutateRow", &req.base, NULL, &status), ST_OK);
}

/* The records in gRPC-framed response bytes (complete messages only, from *off on, which moves
 * past them) and the value bytes their SetCells carry, each checked against v (chunk offsets
 * included). */
static void huge_scan(const st_buf *data, const uint8_t *v, size_t *off_io, size_t *records,
                      size_t *value_bytes) {
    for (size_t off = *off_io; off + 5 <= data->len; *off_io = off) {
        size_t len = (size_t)data->data[off + 1] << 24 | (size_t)data->data[off + 2] << 16 |
                     (size_t)data->data[off + 3] << 8 | data->data[off + 4];
        if (off + 5 + len > data->len)
            return; /* still arriving */
        Google__Bigtable__V2__ReadChangeStreamResponse *r =
            google__bigtable__v2__read_change_stream_response__unpack(NULL, len,
                                                                      data->data + off + 5);
        assert_non_null(r);
        if (r->stream_record_case ==
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE) {
            const Google__Bigtable__V2__ReadChangeStreamResponse__DataChange *d = r->data_change;
            for (size_t i = 0; i < d->n_chunks; i++) {
                const ProtobufCBinaryData *piece = &d->chunks[i]->mutation->set_cell->value;
                size_t at =
                    d->chunks[i]->chunk_info ? d->chunks[i]->chunk_info->chunked_value_offset : 0;
                assert_int_equal(at, *value_bytes);
                assert_true(at + piece->len <= HUGE_VALUE_BYTES);
                assert_memory_equal(piece->data, v + at, piece->len);
                *value_bytes += piece->len;
            }
            *records += d->done;
        }
        google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
        off += 5 + len;
    }
}

static void huge_record(const node_env *e, const char *table, const uint8_t *v) {
    table_pb tb;
    table_pb_init(&tb, NULL, 0);
    Google__Bigtable__Admin__V2__CreateTableRequest creq;
    google__bigtable__admin__v2__create_table_request__init(&creq);
    creq.parent = PARENT;
    creq.table_id = (char *)strrchr(table, '/') + 1;
    creq.table = &tb.t;
    st_err status;
    assert_int_equal(call(e, TA "CreateTable", &creq.base, NULL, &status), ST_OK);
    uint8_t body[1024];
    raw_call r = {.fd = raw_tcp_connect((uint16_t)atoi(strchr(e->addr, ':') + 1), 4096),
                  .grpc_status = -1};
    assert_true(r.fd >= 0);
    struct timeval tv = {TIMEOUT_MS / 1000, 0};
    assert_int_equal(setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    r.body = body;
    r.body_len = slow_request(body, sizeof body, table, st_wall_us(), 0);
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, true);
    assert_non_null(s);
    nghttp2_nv nva[] = {NVS(":method", "POST"),
                        NVS(":scheme", "http"),
                        NVS(":path", BT "ReadChangeStream"),
                        NVS(":authority", "t"),
                        NVS("content-type", "application/grpc"),
                        NVS("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = raw_body};
    assert_true(nghttp2_submit_request(s, NULL, nva, 6, &prd, NULL) > 0);
    assert_int_equal(nghttp2_session_send(s), 0);
    usleep(100 * 1000); /* the stream is open before the write: the record is live */
    put_value(e, table, "h", v, HUGE_VALUE_BYTES);
    /* Not reading: the node sends until the call's queue is full, then waits. Sent in one turn,
     * the whole record would be queued. */
    size_t peak = 0;
    for (int ms = 0; ms < 60000 && peak < ((size_t)1 << 20); ms++) { /* it starts sending */
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
        usleep(1000);
    }
    for (int ms = 0; ms < 300; ms++) { /* the reader's next turns, had it not waited */
        size_t q = rpc_queued_response_bytes();
        peak = q > peak ? q : peak;
        usleep(1000);
    }
    static uint8_t buf[1 << 16];
    size_t recs = 0, bytes = 0, parsed = 0;
    while (recs < 1) {
        ssize_t n = recv(r.fd, buf, sizeof buf, 0);
        assert_true(n > 0); /* silent for TIMEOUT_MS: the stream hangs */
        assert_true(nghttp2_session_mem_recv(s, buf, (size_t)n) == n);
        assert_int_equal(nghttp2_session_send(s), 0);
        assert_false(r.closed);
        huge_scan(&r.data, v, &parsed, &recs, &bytes);
    }
    printf("%s: queued response bytes peak while a %zu-byte record waited: %zu\n", table,
           (size_t)HUGE_VALUE_BYTES, peak);
    assert_int_equal(bytes, HUGE_VALUE_BYTES);
    assert_true(peak <= SLOW_QUEUED_MAX);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
}

static void test_cs_read_huge_record_slow_client(void **state) {
    (void)state;
    uint8_t *v = malloc(HUGE_VALUE_BYTES);
    assert_non_null(v);
    for (size_t i = 0; i < HUGE_VALUE_BYTES; i++)
        v[i] = (uint8_t)(i * 31 + (i >> 20));
    huge_record(&S, TBL("huge"), v); /* from the ring */
    huge_record(&R, TBL("huge"), v); /* from storage: R's ring is smaller than the record */
    free(v);
}

/* ---- harness ---- */

/* The messages of a stream, each as a 4-byte length and its bytes; a batch's messages are
 * unpacked into it as if they had come one by one. */
typedef struct raw_stream {
    st_buf all;
    size_t batches, batched, messages;
    bool bad;
} raw_stream;

static void raw_add(raw_stream *r, const uint8_t *p, size_t len) {
    uint8_t l[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    st_buf_append(&r->all, l, 4);
    st_buf_append(&r->all, p, len);
    r->messages++;
}

static void raw_msg(st_slice msg, void *arg) {
    raw_stream *r = arg;
    if (msg.len == 0 || msg.data[0] != BTU_CS_BATCH_TAG) {
        raw_add(r, msg.data, msg.len);
        return;
    }
    r->batches++;
    uint64_t n = 0;
    for (int i = 0; i < 5; i++)
        n |= (uint64_t)(msg.data[1 + i] & 0x7f) << (7 * i);
    if (msg.len < BTU_CS_BATCH_HEAD_BYTES || n != msg.len - BTU_CS_BATCH_HEAD_BYTES) {
        r->bad = true;
        return;
    }
    const uint8_t *p = msg.data + BTU_CS_BATCH_HEAD_BYTES, *end = msg.data + msg.len;
    while (p < end) {
        size_t len = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
        if (end - p < 5 || p[0] != 0 || len > (size_t)(end - p) - 5 ||
            p[5] != BTU_CS_BATCH_INNER_TAG) {
            r->bad = true;
            return;
        }
        raw_add(r, p + 5, len);
        r->batched++;
        p += 5 + len;
    }
}

static void test_cs_read_batches_hold_the_plain_messages(void **state) {
    (void)state;
    table_pb tb;
    table_pb_init(&tb, NULL, 0);
    Google__Bigtable__Admin__V2__CreateTableRequest creq;
    google__bigtable__admin__v2__create_table_request__init(&creq);
    creq.parent = PARENT;
    creq.table_id = "batch";
    creq.table = &tb.t;
    st_err status;
    assert_int_equal(call(&S, TA "CreateTable", &creq.base, NULL, &status), ST_OK);
    int64_t t0 = st_wall_us() + 1000;
    while (st_wall_us() <= t0)
        usleep(500);
    char key[16];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "k%03d", i);
        assert_int_equal(put(&S, TBL("batch"), key, (1000 + i) * 1000), ST_OK);
    }
    int64_t t1 = st_wall_us();
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = TBL("batch");
    Google__Bigtable__V2__StreamPartition p;
    Google__Bigtable__V2__RowRange rr;
    btu_cs_partition_set(&p, &rr, st_slice_cstr(""), st_slice_cstr(""));
    req.partition = &p;
    Google__Protobuf__Timestamp st, et;
    btu_cs_time_set(&st, t0);
    btu_cs_time_set(&et, t1);
    req.start_from_case = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
    req.start_time = &st;
    req.end_time = &et;
    uint8_t buf[512];
    size_t len = protobuf_c_message_pack(&req.base, buf);
    raw_stream plain = {0}, batched = {0};
    st_buf_init(&plain.all);
    st_buf_init(&batched.all);
    assert_int_equal(rpc_blocking_stream(S.addr, NULL, BT "ReadChangeStream",
                                         st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, raw_msg,
                                         &plain, &status),
                     ST_OK);
    rpc_metadata md = {BTU_CS_BATCH_HEADER, "1"};
    assert_int_equal(rpc_blocking_stream(S.addr, NULL, BT "ReadChangeStream",
                                         st_slice_make(buf, len), &md, 1, TIMEOUT_MS, raw_msg,
                                         &batched, &status),
                     ST_OK);
    assert_false(plain.bad);
    assert_false(batched.bad);
    assert_int_equal(plain.batches, 0);
    assert_int_equal(plain.messages, 201); /* the records and CloseStream */
    assert_true(batched.batches > 0);
    assert_true(batched.batched > batched.batches); /* several records per batch */
    assert_int_equal(batched.messages, plain.messages);
    assert_int_equal(batched.all.len, plain.all.len);
    assert_memory_equal(batched.all.data, plain.all.data, plain.all.len);
    st_buf_free(&plain.all);
    st_buf_free(&batched.all);
}

static int g_failures;

static void *client_main(void *arg) {
    (void)arg;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cs_read_gc_record),
        cmocka_unit_test(test_cs_read_member_and_move),
        cmocka_unit_test(test_cs_read_slow_client),
        cmocka_unit_test(test_cs_read_live_slow_client),
        cmocka_unit_test(test_cs_read_values_by_reference),
        cmocka_unit_test(test_cs_read_huge_record_slow_client),
        cmocka_unit_test(test_cs_read_batches_hold_the_plain_messages),
    };
    g_failures = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_loopbreak(g_base);
    return NULL;
}

static void open_node(node_env *e, const char *name, uint32_t num) {
    tu_tmpdir(e->dir, sizeof e->dir, name);
    node_opts o;
    node_opts_default(&o);
    o.data_dir = e->dir;
    o.listen_port = 0;
    o.sync = false;
    o.node_num = num;
    st_err err;
    if (node_open(g_base, &o, &e->node, &err) != ST_OK) {
        fprintf(stderr, "node_open: %s\n", err.msg);
        exit(1);
    }
    snprintf(e->addr, sizeof e->addr, "127.0.0.1:%u", node_port(e->node));
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    g_base = event_base_new();
    open_node(&S, "csr_s", 0);
    open_node(&A, "csr_a", 1);
    open_node(&B, "csr_b", 2);
    open_node(&R, "csr_r", 0);
    node_cs_set_ring_bytes(R.node, R_RING_BYTES); /* no record yet: main thread is fine */
    pthread_t th;
    pthread_create(&th, NULL, client_main, NULL);
    event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
    pthread_join(th, NULL);
    node_close(S.node);
    node_close(A.node);
    node_close(B.node);
    node_close(R.node);
    event_base_free(g_base);
    tu_rmrf(S.dir);
    tu_rmrf(A.dir);
    tu_rmrf(B.dir);
    tu_rmrf(R.dir);
    return g_failures;
}
