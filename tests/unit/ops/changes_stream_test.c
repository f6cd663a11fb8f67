/*
 * Proves the change-stream consumer behind `strata changes` (ops/changes_stream.c) follows the
 * protocol, against a fake Bigtable server on the same loop:
 * - every partition from GenerateInitialChangeStreamPartitions is read;
 * - a SetCell value chunked over a DataChange and its CONTINUATION is reassembled;
 * - CloseStream OUT_OF_RANGE with a split opens each child with its token; two children closing
 *   into one merged partition open it once, with both tokens;
 * - a stream ending UNAVAILABLE is reopened from its last token (nothing repeated or skipped);
 * - a partition whose watermark reached the stop time is done; CloseStream OK ends one;
 * - the positions kept for the checkpoint are the last tokens;
 * - a table without streams (FAILED_PRECONDITION) ends the consumer with that code and a hint.
 */
#include <event2/event.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "changes.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define STOP_US 5000000LL
#define TEST_TIMEOUT_S 20

typedef struct fake {
    bool refuse; /* GenerateInitial answers FAILED_PRECONDITION */
    int p2_attempts;
    bool p2_resumed_with_token, merge_two_tokens;
    int merged_opens;
} fake;

typedef struct got {
    char rows[32][16];
    size_t n;
    char value_a[32];
    size_t mods_a;
    bool gc_b;
    st_code code;
    char msg[ST_ERR_MSG_MAX];
    bool done;
    struct event_base *base;
} got;

/* ---- the fake server ---- */

static void send_resp(rpc_call *call, Google__Bigtable__V2__ReadChangeStreamResponse *r) {
    uint8_t buf[4096];
    size_t len = google__bigtable__v2__read_change_stream_response__pack(r, buf);
    assert_true(len < sizeof buf);
    assert_int_equal(rpc_call_send(call, st_slice_make(buf, len)), ST_OK);
}

static void range_set(Google__Bigtable__V2__StreamPartition *sp, Google__Bigtable__V2__RowRange *rr,
                      const char *start, const char *end) {
    google__bigtable__v2__stream_partition__init(sp);
    google__bigtable__v2__row_range__init(rr);
    sp->row_range = rr;
    rr->start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    rr->start_key_closed = (ProtobufCBinaryData){strlen(start), (uint8_t *)start};
    if (*end) {
        rr->end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        rr->end_key_open = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
    }
}

/* One complete single-message change with one SetCell (or a GC DeleteFromColumn). */
static void send_change(rpc_call *call, const char *row, bool gc, const char *token, int64_t wm) {
    Google__Bigtable__V2__Mutation__SetCell sc;
    Google__Bigtable__V2__Mutation__DeleteFromColumn dc;
    Google__Bigtable__V2__Mutation mu;
    google__bigtable__v2__mutation__init(&mu);
    if (gc) {
        google__bigtable__v2__mutation__delete_from_column__init(&dc);
        dc.family_name = "cf";
        dc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
        mu.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN;
        mu.delete_from_column = &dc;
    } else {
        google__bigtable__v2__mutation__set_cell__init(&sc);
        sc.family_name = "cf";
        sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
        sc.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
        mu.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
        mu.set_cell = &sc;
    }
    Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk ch, *chp = &ch;
    google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&ch);
    ch.mutation = &mu;
    Google__Protobuf__Timestamp ts, w;
    google__protobuf__timestamp__init(&ts);
    google__protobuf__timestamp__init(&w);
    ts.seconds = 1;
    w.seconds = wm / 1000000;
    Google__Bigtable__V2__ReadChangeStreamResponse__DataChange d;
    google__bigtable__v2__read_change_stream_response__data_change__init(&d);
    d.type =
        gc ? GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION
           : GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    d.source_cluster_id = gc ? "" : "east";
    d.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    d.commit_timestamp = &ts;
    d.n_chunks = 1;
    d.chunks = &chp;
    d.done = true;
    d.token = (char *)token;
    d.estimated_low_watermark = &w;
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    r.data_change = &d;
    send_resp(call, &r);
}

/* Row "a": "hello " + "world" chunked over a DataChange and its CONTINUATION, plus a
 * DeleteFromFamily in the continuation. */
static void send_chunked(rpc_call *call) {
    Google__Bigtable__V2__Mutation__SetCell sc1, sc2;
    Google__Bigtable__V2__Mutation mu1, mu2, mu3;
    Google__Bigtable__V2__Mutation__DeleteFromFamily df;
    google__bigtable__v2__mutation__set_cell__init(&sc1);
    google__bigtable__v2__mutation__set_cell__init(&sc2);
    google__bigtable__v2__mutation__delete_from_family__init(&df);
    google__bigtable__v2__mutation__init(&mu1);
    google__bigtable__v2__mutation__init(&mu2);
    google__bigtable__v2__mutation__init(&mu3);
    sc1.family_name = "cf";
    sc1.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc1.timestamp_micros = 1000;
    sc1.value = (ProtobufCBinaryData){6, (uint8_t *)"hello "};
    sc2.value = (ProtobufCBinaryData){5, (uint8_t *)"world"};
    df.family_name = "old";
    mu1.mutation_case = mu2.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    mu1.set_cell = &sc1;
    mu2.set_cell = &sc2;
    mu3.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY;
    mu3.delete_from_family = &df;
    Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk__ChunkInfo i1, i2;
    google__bigtable__v2__read_change_stream_response__mutation_chunk__chunk_info__init(&i1);
    google__bigtable__v2__read_change_stream_response__mutation_chunk__chunk_info__init(&i2);
    i1.chunked_value_size = i2.chunked_value_size = 11;
    i2.chunked_value_offset = 6;
    i2.last_chunk = true;
    Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk c1, c2, c3, *p1 = &c1,
                                                                              *p23[2] = {&c2, &c3};
    google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&c1);
    google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&c2);
    google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&c3);
    c1.chunk_info = &i1;
    c1.mutation = &mu1;
    c2.chunk_info = &i2;
    c2.mutation = &mu2;
    c3.mutation = &mu3;
    Google__Protobuf__Timestamp ts;
    google__protobuf__timestamp__init(&ts);
    ts.seconds = 1;
    Google__Bigtable__V2__ReadChangeStreamResponse__DataChange d1, d2;
    google__bigtable__v2__read_change_stream_response__data_change__init(&d1);
    google__bigtable__v2__read_change_stream_response__data_change__init(&d2);
    d1.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    d1.source_cluster_id = "east";
    d1.row_key = (ProtobufCBinaryData){1, (uint8_t *)"a"};
    d1.commit_timestamp = &ts;
    d1.n_chunks = 1;
    d1.chunks = &p1;
    d2.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION;
    d2.n_chunks = 2;
    d2.chunks = p23;
    d2.done = true;
    d2.token = "p1.1";
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    r.data_change = &d1;
    send_resp(call, &r);
    r.data_change = &d2;
    send_resp(call, &r);
}

/* CloseStream OUT_OF_RANGE: tokens (each with its range) and new partitions. */
static void send_close(rpc_call *call, const char *const *tok, size_t n_tok,
                       const char *const *parts, size_t n_parts, int code) {
    Google__Bigtable__V2__StreamContinuationToken t[2], *tp[2];
    Google__Bigtable__V2__StreamPartition tsp[2], np[2], *npp[2];
    Google__Bigtable__V2__RowRange trr[2], nrr[2];
    for (size_t i = 0; i < n_tok; i++) {
        google__bigtable__v2__stream_continuation_token__init(&t[i]);
        range_set(&tsp[i], &trr[i], tok[3 * i], tok[3 * i + 1]);
        t[i].partition = &tsp[i];
        t[i].token = (char *)tok[3 * i + 2];
        tp[i] = &t[i];
    }
    for (size_t i = 0; i < n_parts; i++) {
        range_set(&np[i], &nrr[i], parts[2 * i], parts[2 * i + 1]);
        npp[i] = &np[i];
    }
    Google__Rpc__Status st;
    google__rpc__status__init(&st);
    st.code = code;
    Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream c;
    google__bigtable__v2__read_change_stream_response__close_stream__init(&c);
    c.status = &st;
    c.n_continuation_tokens = n_tok;
    c.continuation_tokens = tp;
    c.n_new_partitions = n_parts;
    c.new_partitions = npp;
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM;
    r.close_stream = &c;
    send_resp(call, &r);
}

static void send_heartbeat(rpc_call *call, int64_t wm) {
    Google__Protobuf__Timestamp w;
    google__protobuf__timestamp__init(&w);
    w.seconds = wm / 1000000;
    Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat hb;
    google__bigtable__v2__read_change_stream_response__heartbeat__init(&hb);
    hb.estimated_low_watermark = &w;
    Google__Bigtable__V2__ReadChangeStreamResponse r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT;
    r.heartbeat = &hb;
    send_resp(call, &r);
}

static bool range_is(const Google__Bigtable__V2__StreamPartition *sp, const char *s,
                     const char *e) {
    const Google__Bigtable__V2__RowRange *r = sp->row_range;
    size_t el = r->end_key_case ? r->end_key_open.len : 0;
    return r->start_key_closed.len == strlen(s) &&
           (!*s || !memcmp(r->start_key_closed.data, s, strlen(s))) && el == strlen(e) &&
           (!el || !memcmp(r->end_key_open.data, e, el));
}

static const char *first_token(const Google__Bigtable__V2__ReadChangeStreamRequest *q) {
    if (q->start_from_case !=
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS ||
        q->continuation_tokens->n_tokens == 0)
        return NULL;
    return q->continuation_tokens->tokens[0]->token;
}

static void h_read(rpc_call *call, st_slice req, void *arg) {
    fake *f = arg;
    Google__Bigtable__V2__ReadChangeStreamRequest *q =
        google__bigtable__v2__read_change_stream_request__unpack(NULL, req.len, req.data);
    assert_non_null(q);
    const char *tok = first_token(q);
    if (range_is(q->partition, "", "m")) {
        if (!tok) { /* P1 from its start time: a chunked change, then a split */
            send_chunked(call);
            const char *toks[] = {"", "g", "p1.1", "g", "m", "p1.1"};
            const char *parts[] = {"", "g", "g", "m"};
            send_close(call, toks, 2, parts, 2, ST_OUT_OF_RANGE);
        } else { /* the merge of both children */
            f->merged_opens++;
            f->merge_two_tokens = q->continuation_tokens->n_tokens == 2;
            send_change(call, "k", false, "m.3", 1000000);
            send_close(call, NULL, 0, NULL, 0, ST_OK);
        }
    } else if (range_is(q->partition, "", "g") || range_is(q->partition, "g", "m")) {
        bool left = range_is(q->partition, "", "g");
        assert_string_equal(tok, "p1.1");
        send_change(call, left ? "b" : "h", left, left ? "c1.2" : "c2.2", 1000000);
        const char *toks[] = {left ? "" : "g", left ? "g" : "m", left ? "c1.2" : "c2.2"};
        const char *parts[] = {"", "m"};
        send_close(call, toks, 1, parts, 1, ST_OUT_OF_RANGE);
    } else if (range_is(q->partition, "m", "")) {
        if (++f->p2_attempts == 1) {
            send_change(call, "n", false, "p2.1", 1000000);
            google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
            rpc_call_finish(call, ST_UNAVAILABLE, "node went away");
            return;
        }
        f->p2_resumed_with_token = tok && !strcmp(tok, "p2.1");
        send_change(call, "o", false, "p2.2", 1000000);
        send_heartbeat(call, STOP_US * 2); /* caught up: the consumer ends this stream */
        google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
        rpc_call_finish(call, ST_OK, NULL);
        return;
    } else {
        fail_msg("unexpected partition");
    }
    google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
    rpc_call_finish(call, ST_OK, NULL);
}

static void h_gen(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    fake *f = arg;
    if (f->refuse) {
        rpc_call_finish(call, ST_FAILED_PRECONDITION, "change streams are off for table t");
        return;
    }
    const char *bounds[] = {"", "m", "m", ""};
    for (int i = 0; i < 2; i++) {
        Google__Bigtable__V2__StreamPartition sp;
        Google__Bigtable__V2__RowRange rr;
        range_set(&sp, &rr, bounds[2 * i], bounds[2 * i + 1]);
        Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse r;
        google__bigtable__v2__generate_initial_change_stream_partitions_response__init(&r);
        r.partition = &sp;
        uint8_t buf[256];
        size_t len =
            google__bigtable__v2__generate_initial_change_stream_partitions_response__pack(&r, buf);
        assert_int_equal(rpc_call_send(call, st_slice_make(buf, len)), ST_OK);
    }
    rpc_call_finish(call, ST_OK, NULL);
}

/* ---- the consumer's side ---- */

static bool on_change(const ops_cs_change *c, void *arg) {
    got *g = arg;
    assert_true(g->n < 32 && c->row.len < 16);
    memcpy(g->rows[g->n], c->row.data, c->row.len);
    g->rows[g->n][c->row.len] = '\0';
    g->n++;
    if (c->row.len == 1 && c->row.data[0] == 'a') {
        g->mods_a = c->n_mods;
        snprintf(g->value_a, sizeof g->value_a, "%.*s", (int)c->mods[0].value.len,
                 (const char *)c->mods[0].value.data);
    }
    if (c->row.len == 1 && c->row.data[0] == 'b')
        g->gc_b = c->type == OPS_CS_GC;
    return true;
}

static void on_done(st_code code, const char *msg, void *arg) {
    got *g = arg;
    g->code = code;
    snprintf(g->msg, sizeof g->msg, "%s", msg);
    g->done = true;
    event_base_loopbreak(g->base);
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

static bool has_row(const got *g, const char *row) {
    for (size_t i = 0; i < g->n; i++)
        if (!strcmp(g->rows[i], row))
            return true;
    return false;
}

/* Runs a consumer against a fake server until it ends (bounded by TEST_TIMEOUT_S). */
static void run(fake *f, got *g, ops_cs_pos **pos, size_t *n_pos) {
    struct event_base *base = event_base_new();
    g->base = base;
    st_err err = {0};
    rpc_server *srv = rpc_server_new(base, NULL, &err);
    assert_non_null(srv);
    rpc_server_add_method(srv, "/google.bigtable.v2.Bigtable/ReadChangeStream", h_read, f);
    rpc_server_add_method(srv, "/google.bigtable.v2.Bigtable/GenerateInitialChangeStreamPartitions",
                          h_gen, f);
    uint16_t port;
    assert_int_equal(rpc_server_listen(srv, "127.0.0.1", 0, &port, &err), ST_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    ops_cs_opts o = {.addr = addr,
                     .table = "projects/p/instances/i/tables/t",
                     .app_profile = "",
                     .start_us = 1000000,
                     .stop_us = STOP_US,
                     .heartbeat_s = 1,
                     .on_change = on_change,
                     .on_done = on_done,
                     .arg = g};
    ops_cs *cs = ops_cs_new(base, &o, &err);
    assert_non_null(cs);
    assert_int_equal(ops_cs_start(cs, NULL, 0, &err), ST_OK);
    struct event *to = evtimer_new(base, timeout_cb, base);
    struct timeval tv = {TEST_TIMEOUT_S, 0};
    evtimer_add(to, &tv);
    event_base_dispatch(base);
    assert_true(g->done); /* not the timeout */
    if (pos)
        assert_int_equal(ops_cs_positions(cs, pos, n_pos), ST_OK);
    event_free(to);
    ops_cs_free(cs);
    rpc_server_free(srv);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
}

static void test_consumer_follows_protocol(void **state) {
    (void)state;
    fake f = {0};
    got g = {0};
    ops_cs_pos *pos = NULL;
    size_t n = 0;
    run(&f, &g, &pos, &n);
    assert_int_equal(g.code, ST_OK);
    assert_int_equal(g.n, 6); /* a, b, h, k, n, o: each once */
    const char *rows[] = {"a", "b", "h", "k", "n", "o"};
    for (size_t i = 0; i < 6; i++)
        assert_true(has_row(&g, rows[i]));
    assert_string_equal(g.value_a, "hello world");
    assert_int_equal(g.mods_a, 2);
    assert_true(g.gc_b);
    assert_int_equal(f.merged_opens, 1);
    assert_true(f.merge_two_tokens);
    assert_int_equal(f.p2_attempts, 2);
    assert_true(f.p2_resumed_with_token);
    /* positions: the merged partition at m.3, the second at p2.2 */
    assert_int_equal(n, 2);
    bool m3 = false, p22 = false;
    for (size_t i = 0; i < n; i++) {
        assert_non_null(pos[i].token);
        m3 |= !strcmp(pos[i].token, "m.3") && pos[i].start.len == 0 && pos[i].end.len == 1;
        p22 |= !strcmp(pos[i].token, "p2.2") && pos[i].start.len == 1 && pos[i].end.len == 0;
        ops_cs_pos_free(&pos[i]);
    }
    free(pos);
    assert_true(m3 && p22);
}

static void test_consumer_reports_streams_off(void **state) {
    (void)state;
    fake f = {.refuse = true};
    got g = {0};
    run(&f, &g, NULL, NULL);
    assert_int_equal(g.code, ST_FAILED_PRECONDITION);
    assert_non_null(strstr(g.msg, "change streams are off"));
    assert_non_null(strstr(g.msg, "turn change streams on"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consumer_follows_protocol),
        cmocka_unit_test(test_consumer_reports_streams_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
