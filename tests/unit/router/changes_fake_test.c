/*
 * Proves how the router relays ReadChangeStream (router/changes.c), with a real router (rtr_open)
 * and one fake node (an rpc_server answering the node methods the router uses) on one event loop:
 *   - a partition equal to a tablet goes to its node byte for byte and every answer (records,
 *     heartbeats) reaches the client in order, until the node ends the stream;
 *   - a node answering strata-not-owner after some records makes the router refresh its map and
 *     send the request again from the last token relayed (continuation_tokens in place of
 *     start_time): the client sees each record once and the stream goes on;
 *   - a node that answers strata-not-owner in the middle of a record ends the client's stream
 *     with UNAVAILABLE (resuming would repeat the start of the record);
 *   - a node whose connection drops under the stream ends it with UNAVAILABLE at once;
 *   - GenerateInitialChangeStreamPartitions answers the tablets of the fake node;
 *   - the router asks its node for batches (x-strata-cs-batch), and a batch of framed messages
 *     reaches the client as the same messages a plain stream gives; the router follows the
 *     token of a batch's last record (resuming after it), or of its last complete record when
 *     the batch stops inside one (then a node's end is one in the middle of a record);
 *   - a batch whose inner prefix is malformed (a length past the batch, a flag byte, a message
 *     that is no DataChange, a head whose length is wrong) ends the client's stream with
 *     INTERNAL after what came before it, and the router goes on serving.
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

#include "google/bigtable/admin/v2/instance.pb-c.h"
#include "google/bigtable/admin/v2/table.pb-c.h"
#include "router_internal.h"
#include "strata/cstoken.h"
#include "strata/internal/v1/node.pb-c.h"

#define CF_TABLE "projects/p/instances/i/tables/t"
#define CF_SPLIT "m" /* the table's tablets: [ , m) and [m, ) */
#define CF_TIMEOUT_MS 20000

typedef enum cf_mode {
    CF_STREAM,         /* two records and a heartbeat, then OK */
    CF_NOT_OWNER_ONCE, /* first call: a record, then strata-not-owner; later calls: CF_STREAM */
    CF_NOT_OWNER_MID,  /* the start of a record (not done), then strata-not-owner */
    CF_DROP,           /* a record, then the node goes away */
    CF_BATCH,          /* CF_STREAM with the two records in one batch */
    CF_BATCH_ONCE,     /* first call: a batch of two records, then strata-not-owner */
    CF_BATCH_MID,      /* a batch of a record and the start of another, then strata-not-owner */
    CF_BATCH_BAD,      /* a record, then a batch malformed as `bad` says */
} cf_mode;

typedef enum cf_bad {
    CF_BAD_LENGTH, /* an inner prefix announcing more bytes than the batch holds */
    CF_BAD_FLAG,   /* an inner prefix with flag byte 1 (compressed) */
    CF_BAD_INNER,  /* an inner message that is a Heartbeat */
    CF_BAD_HEAD,   /* the batch's head announcing one byte less than it holds */
} cf_bad;

typedef struct cf_node {
    struct event_base *base;
    rpc_server *srv;
    uint16_t port;
    cf_mode mode;
    int calls;          /* ReadChangeStream calls received */
    char last_req[256]; /* how the last call started: "start_time" or "token=<text>" */
    struct event *die_ev;
    rpc_call *dying;
    cf_bad bad;
    bool asked_batch; /* the last call had x-strata-cs-batch: 1 */
} cf_node;

/* ---- the fake node ---- */

static void cf_send(rpc_call *call, const ProtobufCMessage *m) {
    uint8_t buf[4096];
    size_t len = m ? protobuf_c_message_pack(m, buf) : 0;
    assert_true(len < sizeof buf);
    rpc_call_send(call, st_slice_make(buf, len));
}

static void cf_empty(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    cf_send(call, NULL);
    rpc_call_finish(call, ST_OK, NULL);
}

static void cf_get_status(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    Strata__Internal__V1__NodeStatus st;
    strata__internal__v1__node_status__init(&st);
    st.node_num = 1;
    cf_send(call, &st.base);
    rpc_call_finish(call, ST_OK, NULL);
}

static void cf_list_tablets(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    Strata__Internal__V1__Tablet t[3], *tp[3];
    for (size_t i = 0; i < 3; i++) {
        strata__internal__v1__tablet__init(&t[i]);
        t[i].id = i + 1;
        t[i].table_name = i ? (char *)CF_TABLE : (char *)RTR_META_TABLE;
        tp[i] = &t[i];
    }
    t[1].end_key = (ProtobufCBinaryData){1, (uint8_t *)CF_SPLIT};
    t[2].start_key = (ProtobufCBinaryData){1, (uint8_t *)CF_SPLIT};
    Strata__Internal__V1__ListTabletsResponse resp;
    strata__internal__v1__list_tablets_response__init(&resp);
    resp.n_tablets = 3;
    resp.tablets = tp;
    cf_send(call, &resp.base);
    rpc_call_finish(call, ST_OK, NULL);
}

/* A metadata row: one committed cell holding m. */
static void cf_send_record(rpc_call *call, const char *key, const ProtobufCMessage *m) {
    uint8_t val[1024];
    size_t vlen = protobuf_c_message_pack(m, val);
    Google__Bigtable__V2__ReadRowsResponse__CellChunk ch, *chp = &ch;
    google__bigtable__v2__read_rows_response__cell_chunk__init(&ch);
    Google__Protobuf__StringValue fam;
    google__protobuf__string_value__init(&fam);
    fam.value = "m";
    Google__Protobuf__BytesValue q;
    google__protobuf__bytes_value__init(&q);
    q.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    ch.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    ch.family_name = &fam;
    ch.qualifier = &q;
    ch.value = (ProtobufCBinaryData){vlen, val};
    ch.row_status_case =
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    ch.commit_row = true;
    Google__Bigtable__V2__ReadRowsResponse resp;
    google__bigtable__v2__read_rows_response__init(&resp);
    resp.n_chunks = 1;
    resp.chunks = &chp;
    cf_send(call, &resp.base);
}

/* The metadata: table t with change streams on (1 day), profile default single-cluster to c1. */
static void cf_read_rows(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    Google__Protobuf__Duration d;
    google__protobuf__duration__init(&d);
    d.seconds = 86400;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cfg;
    google__bigtable__admin__v2__change_stream_config__init(&cfg);
    cfg.retention_period = &d;
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.name = CF_TABLE;
    t.change_stream_config = &cfg;
    cf_send_record(call, RTR_META_TABLE_PREFIX CF_TABLE, &t.base);
    Google__Bigtable__Admin__V2__AppProfile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting single;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&single);
    single.cluster_id = "c1";
    p.name = "projects/p/instances/i/appProfiles/default";
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p.single_cluster_routing = &single;
    cf_send_record(call, RTR_META_PROFILE_PREFIX "default", &p.base);
    rpc_call_finish(call, ST_OK, NULL);
}

/* A DataChange message for row; token set (and done) on a record's last message. */
static size_t cf_pack_change(uint8_t *buf, const char *row, const char *token) {
    Google__Bigtable__V2__ReadChangeStreamResponse__DataChange dc;
    google__bigtable__v2__read_change_stream_response__data_change__init(&dc);
    dc.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    dc.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    dc.source_cluster_id = "c1";
    if (token) {
        dc.done = true;
        dc.token = (char *)token;
    }
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    r.data_change = &dc;
    return protobuf_c_message_pack(&r.base, buf);
}

static void cf_send_change(rpc_call *call, const char *row, const char *token) {
    uint8_t buf[512];
    rpc_call_send(call, st_slice_make(buf, cf_pack_change(buf, row, token)));
}

/* A batch (strata/cstoken.h) of the records rows[i] with tokens[i] (NULL: not done), each framed
 * as the client is to receive it, malformed as bad says when broken. */
static void cf_send_batch(rpc_call *call, const char *const *rows, const char *const *tokens,
                          size_t n, bool broken, cf_bad bad) {
    uint8_t buf[4096];
    size_t len = BTU_CS_BATCH_HEAD_BYTES;
    for (size_t i = 0; i < n; i++) {
        size_t m = cf_pack_change(buf + len + 5, rows[i], tokens[i]);
        buf[len] = 0;
        buf[len + 1] = buf[len + 2] = 0;
        buf[len + 3] = (uint8_t)(m >> 8);
        buf[len + 4] = (uint8_t)m;
        if (broken && i == n - 1 && bad == CF_BAD_LENGTH)
            buf[len + 4] = (uint8_t)(m + 1);
        if (broken && i == n - 1 && bad == CF_BAD_FLAG)
            buf[len] = 1;
        len += 5 + m;
    }
    if (broken && bad == CF_BAD_INNER)
        buf[BTU_CS_BATCH_HEAD_BYTES + 5] = (2 << 3) | 2; /* field 2: a Heartbeat */
    size_t n_frames = len - BTU_CS_BATCH_HEAD_BYTES - (broken && bad == CF_BAD_HEAD ? 1 : 0);
    buf[0] = BTU_CS_BATCH_TAG;
    for (int i = 0; i < 4; i++)
        buf[1 + i] = (uint8_t)(((n_frames >> (7 * i)) & 0x7f) | 0x80);
    buf[5] = (uint8_t)((n_frames >> 28) & 0x7f);
    rpc_call_send(call, st_slice_make(buf, len));
}

static void cf_send_heartbeat(rpc_call *call, const char *token) {
    Google__Bigtable__V2__StreamContinuationToken tk;
    google__bigtable__v2__stream_continuation_token__init(&tk);
    tk.token = (char *)token;
    Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat hb;
    google__bigtable__v2__read_change_stream_response__heartbeat__init(&hb);
    hb.continuation_token = &tk;
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT;
    r.heartbeat = &hb;
    cf_send(call, &r.base);
}

static void cf_die_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    cf_node *n = arg;
    rpc_server_free(n->srv); /* connections close: the router sees them drop */
    n->srv = NULL;
    if (n->dying)
        rpc_call_finish(n->dying, ST_OK, NULL); /* only releases it */
    n->dying = NULL;
}

static void cf_cancelled(rpc_call *call, void *arg) {
    (void)arg;
    rpc_call_finish(call, ST_CANCELLED, NULL); /* only releases it */
}

static void cf_read_change_stream(rpc_call *call, st_slice req, void *arg) {
    cf_node *n = arg;
    Google__Bigtable__V2__ReadChangeStreamRequest *r =
        google__bigtable__v2__read_change_stream_request__unpack(NULL, req.len, req.data);
    assert_non_null(r);
    if (r->start_from_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS)
        snprintf(n->last_req, sizeof n->last_req, "token=%s",
                 r->continuation_tokens->n_tokens == 1 ? r->continuation_tokens->tokens[0]->token
                                                       : "several");
    else
        snprintf(n->last_req, sizeof n->last_req, "start_time");
    google__bigtable__v2__read_change_stream_request__free_unpacked(r, NULL);
    n->calls++;
    const char *b = rpc_call_header(call, BTU_CS_BATCH_HEADER);
    n->asked_batch = b && strcmp(b, "1") == 0;
    static const char *const rows[] = {"a", "b"};
    if (n->mode == CF_BATCH_ONCE && n->calls == 1) {
        static const char *const tokens[] = {"1.10", "1.15"};
        cf_send_batch(call, rows, tokens, 2, false, CF_BAD_LENGTH);
        rpc_call_finish(call, ST_FAILED_PRECONDITION, ST_NOT_OWNER_PREFIX " tablet moved");
        return;
    }
    if (n->mode == CF_BATCH_MID) {
        static const char *const tokens[] = {"1.10", NULL};
        cf_send_batch(call, rows, tokens, 2, false, CF_BAD_LENGTH);
        rpc_call_finish(call, ST_FAILED_PRECONDITION, ST_NOT_OWNER_PREFIX " tablet moved");
        return;
    }
    if (n->mode == CF_BATCH_BAD) {
        static const char *const tokens[] = {"1.20", "1.30"};
        cf_send_change(call, "a", "1.10");
        cf_send_batch(call, rows, tokens, 2, true, n->bad);
        rpc_call_set_cancel_cb(call, cf_cancelled, NULL); /* the router must end it itself */
        return;
    }
    if (n->mode == CF_BATCH) {
        static const char *const brows[] = {"b", "c"};
        static const char *const tokens[] = {"1.20", "1.30"};
        cf_send_batch(call, brows, tokens, 2, false, CF_BAD_LENGTH);
        cf_send_heartbeat(call, "1.40");
        rpc_call_finish(call, ST_OK, NULL);
        return;
    }
    if (n->mode == CF_NOT_OWNER_ONCE && n->calls == 1) {
        cf_send_change(call, "a", "1.10");
        rpc_call_finish(call, ST_FAILED_PRECONDITION, ST_NOT_OWNER_PREFIX " tablet moved");
        return;
    }
    if (n->mode == CF_NOT_OWNER_MID) {
        cf_send_change(call, "a", NULL);
        rpc_call_finish(call, ST_FAILED_PRECONDITION, ST_NOT_OWNER_PREFIX " tablet moved");
        return;
    }
    if (n->mode == CF_DROP) {
        cf_send_change(call, "a", "1.10");
        n->dying = call;
        event_active(n->die_ev, EV_TIMEOUT, 0);
        return;
    }
    cf_send_change(call, "b", "1.20");
    cf_send_change(call, "c", "1.30");
    cf_send_heartbeat(call, "1.40");
    rpc_call_finish(call, ST_OK, NULL);
}

static void cf_start(cf_node *n, struct event_base *base) {
    memset(n, 0, sizeof *n);
    n->base = base;
    st_err err = {0};
    n->srv = rpc_server_new(base, NULL, &err);
    assert_non_null(n->srv);
    n->die_ev = event_new(base, -1, 0, cf_die_cb, n);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "ListTablets", cf_list_tablets, n),
                     ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "GetStatus", cf_get_status, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "PutTable", cf_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "CreateTablet", cf_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_BT "MutateRow", cf_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_BT "ReadRows", cf_read_rows, n), ST_OK);
    assert_int_equal(
        rpc_server_add_method(n->srv, RTR_BT "ReadChangeStream", cf_read_change_stream, n), ST_OK);
    assert_int_equal(rpc_server_listen(n->srv, "127.0.0.1", 0, &n->port, &err), ST_OK);
}

/* ---- the fixture: node, router, a client ---- */

typedef struct fixture {
    struct event_base *base;
    cf_node node;
    rtr_ctx *r;
    rpc_client *client;
} fixture;

static void fx_open(fixture *fx, cf_mode mode) {
    memset(fx, 0, sizeof *fx);
    fx->base = event_base_new();
    assert_non_null(fx->base);
    cf_start(&fx->node, fx->base);
    fx->node.mode = mode;
    char text[256];
    snprintf(text, sizeof text,
             "project = p\ninstance = i\n[cluster c1]\nzone = z1\nnode = 127.0.0.1:%u\n",
             fx->node.port);
    st_topology topo;
    st_err err = {0};
    assert_int_equal(st_topology_parse(text, strlen(text), "test", &topo, &err), ST_OK);
    rtr_opts o;
    rtr_opts_default(&o);
    o.topo = &topo;
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.balance = RTR_BALANCE_OFF;
    o.no_unix = true;
    o.probe_ms = 100;
    assert_int_equal(rtr_open(fx->base, &o, &fx->r, &err), ST_OK);
    fx->client = rpc_client_new(fx->base, "127.0.0.1", rtr_port(fx->r), NULL, &err);
    assert_non_null(fx->client);
}

static void fx_close(fixture *fx) {
    rpc_client_free(fx->client);
    rtr_close(fx->r);
    if (fx->node.srv)
        rpc_server_free(fx->node.srv);
    event_free(fx->node.die_ev);
    for (int i = 0; i < 10; i++)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    event_base_free(fx->base);
}

/* What the client saw: one line per message ("change a 1.10", "heartbeat 1.40", ...). */
typedef struct cs_res {
    bool done;
    st_code code;
    char msg[RPC_GRPC_MESSAGE_MAX];
    char seen[1024];
} cs_res;

static void cs_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    cs_res *res = arg;
    Google__Bigtable__V2__ReadChangeStreamResponse *r =
        google__bigtable__v2__read_change_stream_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(r);
    size_t off = strlen(res->seen);
    if (r->stream_record_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE)
        snprintf(res->seen + off, sizeof res->seen - off, "change %.*s %s|",
                 (int)r->data_change->row_key.len, (const char *)r->data_change->row_key.data,
                 r->data_change->token);
    else if (r->stream_record_case ==
             GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT)
        snprintf(res->seen + off, sizeof res->seen - off, "heartbeat %s|",
                 r->heartbeat->continuation_token->token);
    else
        snprintf(res->seen + off, sizeof res->seen - off, "close|");
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
}

static void cs_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    cs_res *res = arg;
    res->done = true;
    res->code = code;
    snprintf(res->msg, sizeof res->msg, "%s", message ? message : "");
}

/* ReadChangeStream of partition [start, end) ("" = unbounded) from a start time. */
static void fx_read(fixture *fx, const char *start, const char *end, cs_res *res) {
    Google__Bigtable__V2__RowRange rr;
    Google__Bigtable__V2__StreamPartition part;
    btu_cs_partition_set(&part, &rr, st_slice_cstr(start), st_slice_cstr(end));
    Google__Protobuf__Timestamp ts;
    google__protobuf__timestamp__init(&ts);
    ts.seconds = st_wall_us() / 1000000 - 10; /* within the table's retention */
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = CF_TABLE;
    req.partition = &part;
    req.start_from_case = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
    req.start_time = &ts;
    uint8_t buf[512];
    size_t len = google__bigtable__v2__read_change_stream_request__pack(&req, buf);
    memset(res, 0, sizeof *res);
    assert_non_null(rpc_client_call(fx->client, RTR_BT "ReadChangeStream", st_slice_make(buf, len),
                                    NULL, 0, CF_TIMEOUT_MS, cs_msg, cs_done, res));
    while (!res->done)
        event_base_loop(fx->base, EVLOOP_ONCE);
}

/* ---- tests ---- */

static void test_changes_relayed_until_the_node_ends(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_STREAM);
    cs_res res;
    fx_read(&fx, "", CF_SPLIT, &res);
    assert_int_equal(res.code, ST_OK);
    assert_string_equal(res.seen, "change b 1.20|change c 1.30|heartbeat 1.40|");
    assert_int_equal(fx.node.calls, 1);
    assert_string_equal(fx.node.last_req, "start_time"); /* the client's request, unchanged */
    fx_close(&fx);
}

static void test_changes_not_owner_resumes_from_last_token(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_NOT_OWNER_ONCE);
    cs_res res;
    fx_read(&fx, CF_SPLIT, "", &res);
    assert_int_equal(res.code, ST_OK);
    assert_string_equal(res.seen, "change a 1.10|change b 1.20|change c 1.30|heartbeat 1.40|");
    assert_int_equal(fx.node.calls, 2);
    assert_string_equal(fx.node.last_req, "token=1.10"); /* resumed after the record relayed */
    fx_close(&fx);
}

static void test_changes_not_owner_mid_record_is_unavailable(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_NOT_OWNER_MID);
    cs_res res;
    fx_read(&fx, CF_SPLIT, "", &res);
    assert_int_equal(res.code, ST_UNAVAILABLE);
    assert_non_null(strstr(res.msg, "middle of a record"));
    assert_int_equal(fx.node.calls, 1);
    fx_close(&fx);
}

static void test_changes_connection_drop_is_unavailable(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_DROP);
    cs_res res;
    fx_read(&fx, "", CF_SPLIT, &res);
    assert_int_equal(res.code, ST_UNAVAILABLE);
    assert_string_equal(res.seen, "change a 1.10|");
    assert_non_null(strstr(res.msg, "resume from the last token"));
    assert_int_equal(fx.node.calls, 1);
    fx_close(&fx);
}

static void part_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    cs_res *res = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse *r =
        google__bigtable__v2__generate_initial_change_stream_partitions_response__unpack(
            NULL, msg.len, msg.data);
    assert_non_null(r);
    const Google__Bigtable__V2__RowRange *rr = r->partition->row_range;
    size_t off = strlen(res->seen);
    snprintf(res->seen + off, sizeof res->seen - off, "%.*s..%.*s|", (int)rr->start_key_closed.len,
             (const char *)rr->start_key_closed.data, (int)rr->end_key_open.len,
             (const char *)rr->end_key_open.data);
    google__bigtable__v2__generate_initial_change_stream_partitions_response__free_unpacked(r,
                                                                                            NULL);
}

static void test_changes_partitions_are_the_tablets(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_STREAM);
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest req;
    google__bigtable__v2__generate_initial_change_stream_partitions_request__init(&req);
    req.table_name = CF_TABLE;
    uint8_t buf[256];
    size_t len =
        google__bigtable__v2__generate_initial_change_stream_partitions_request__pack(&req, buf);
    cs_res res;
    memset(&res, 0, sizeof res);
    assert_non_null(rpc_client_call(fx.client, RTR_BT "GenerateInitialChangeStreamPartitions",
                                    st_slice_make(buf, len), NULL, 0, CF_TIMEOUT_MS, part_msg,
                                    cs_done, &res));
    while (!res.done)
        event_base_loop(fx.base, EVLOOP_ONCE);
    assert_int_equal(res.code, ST_OK);
    assert_string_equal(res.seen, "..m|m..|");
    fx_close(&fx);
}

static void test_changes_batch_reaches_client_as_plain_messages(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_BATCH);
    cs_res res;
    fx_read(&fx, "", CF_SPLIT, &res);
    assert_int_equal(res.code, ST_OK);
    assert_true(fx.node.asked_batch);
    assert_string_equal(res.seen, "change b 1.20|change c 1.30|heartbeat 1.40|");
    fx_close(&fx);
}

static void test_changes_batch_token_is_its_last_record(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_BATCH_ONCE);
    cs_res res;
    fx_read(&fx, CF_SPLIT, "", &res);
    assert_int_equal(res.code, ST_OK);
    assert_string_equal(res.seen,
                        "change a 1.10|change b 1.15|change b 1.20|change c 1.30|heartbeat 1.40|");
    assert_int_equal(fx.node.calls, 2);
    assert_string_equal(fx.node.last_req, "token=1.15");
    fx_close(&fx);
}

static void test_changes_batch_ending_mid_record_is_unavailable(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, CF_BATCH_MID);
    cs_res res;
    fx_read(&fx, CF_SPLIT, "", &res);
    assert_int_equal(res.code, ST_UNAVAILABLE);
    assert_non_null(strstr(res.msg, "middle of a record"));
    assert_int_equal(fx.node.calls, 1);
    fx_close(&fx);
}

static void test_changes_malformed_batch_ends_stream(void **state) {
    (void)state;
    static const cf_bad bads[] = {CF_BAD_LENGTH, CF_BAD_FLAG, CF_BAD_INNER, CF_BAD_HEAD};
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        fixture fx;
        fx_open(&fx, CF_BATCH_BAD);
        fx.node.bad = bads[i];
        cs_res res;
        fx_read(&fx, "", CF_SPLIT, &res);
        assert_int_equal(res.code, ST_INTERNAL);
        assert_non_null(strstr(res.msg, "not well formed"));
        assert_string_equal(res.seen, "change a 1.10|"); /* nothing of the batch */
        fx.node.mode = CF_STREAM;                        /* the router still serves */
        fx_read(&fx, "", CF_SPLIT, &res);
        assert_int_equal(res.code, ST_OK);
        assert_string_equal(res.seen, "change b 1.20|change c 1.30|heartbeat 1.40|");
        fx_close(&fx);
    }
}

int main(void) {
    st_log_set_level(ST_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_changes_relayed_until_the_node_ends),
        cmocka_unit_test(test_changes_not_owner_resumes_from_last_token),
        cmocka_unit_test(test_changes_not_owner_mid_record_is_unavailable),
        cmocka_unit_test(test_changes_connection_drop_is_unavailable),
        cmocka_unit_test(test_changes_partitions_are_the_tablets),
        cmocka_unit_test(test_changes_batch_reaches_client_as_plain_messages),
        cmocka_unit_test(test_changes_batch_token_is_its_last_record),
        cmocka_unit_test(test_changes_batch_ending_mid_record_is_unavailable),
        cmocka_unit_test(test_changes_malformed_batch_ends_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
