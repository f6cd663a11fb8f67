/*
 * Proves the ReadChangeStreamResponse encoders of the node (node/changes_msg.c) shape records as
 * the official Java client requires: one message for a small record with every field; a value
 * over the chunk size split into chunks with chunk_info across messages, the first message
 * carrying the record's metadata and the later ones only type CONTINUATION and chunks, the last
 * done + token + watermark; GC records without a source cluster; DeleteFromRow expanded to
 * DeleteFromFamily; messages bounded by the value budget; Heartbeat and CloseStream fields.
 * Messages are decoded back with protobuf-c and checked field by field, and each must be the
 * bytes protobuf-c packs for what it decoded (the DataChange encoder writes wire bytes itself);
 * test_changes_msg_wire_forms goes through the fields' edge values that way. A record paused
 * after each message (NODE_CS_PAUSE) and resumed from the chunk it names is sent as the same
 * messages as in one go.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "changes_msg.h"
#include "strata/rpc.h"

typedef Google__Bigtable__V2__ReadChangeStreamResponse cs_resp;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__DataChange cs_data;

#define MSGS_MAX 64

typedef struct sink {
    cs_resp *msgs[MSGS_MAX];
    size_t n;
    size_t max_bytes; /* largest message seen */
    st_code fail_at;  /* return this code ... */
    size_t fail_n;    /* ... for message number fail_n (1-based; 0 = never) */
    bool pause;       /* take each message and pause after it (NODE_CS_PAUSE) */
    size_t calls;     /* node_cs_encode_change calls encode made */
    size_t arena_max; /* most scratch one call took (arena bytes) */
    st_buf first;     /* the bytes of the first message of the last record encoded */
    size_t first_at;  /* its index in msgs */
} sink;

static st_code collect(st_buf *msg, void *arg) {
    sink *s = arg;
    assert_true(msg->len >= RPC_SEND_HEADROOM);
    if (s->fail_n && s->n + 1 == s->fail_n)
        return s->fail_at;
    size_t len = msg->len - RPC_SEND_HEADROOM;
    if (s->n == s->first_at) {
        st_buf_reset(&s->first);
        assert_int_equal(st_buf_append(&s->first, msg->data, msg->len), ST_OK);
    }
    if (len > s->max_bytes)
        s->max_bytes = len;
    cs_resp *r = google__bigtable__v2__read_change_stream_response__unpack(
        NULL, len, msg->data + RPC_SEND_HEADROOM);
    assert_non_null(r);
    /* DataChange messages are written without protobuf-c: they must be exactly what protobuf-c
     * packs for the same message. */
    size_t re_len = google__bigtable__v2__read_change_stream_response__get_packed_size(r);
    assert_int_equal(re_len, len);
    uint8_t *re = malloc(re_len ? re_len : 1);
    assert_non_null(re);
    google__bigtable__v2__read_change_stream_response__pack(r, re);
    assert_memory_equal(re, msg->data + RPC_SEND_HEADROOM, len);
    free(re);
    assert_true(s->n < MSGS_MAX);
    s->msgs[s->n++] = r;
    st_buf_reset(msg);
    return s->pause ? NODE_CS_PAUSE : ST_OK;
}

static void sink_free(sink *s) {
    for (size_t i = 0; i < s->n; i++)
        google__bigtable__v2__read_change_stream_response__free_unpacked(s->msgs[i], NULL);
    s->n = 0;
    st_buf_free(&s->first);
}

static cs_data *dc(sink *s, size_t i) {
    assert_int_equal(s->msgs[i]->stream_record_case,
                     GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE);
    return s->msgs[i]->data_change;
}

static st_slice S(const char *s) {
    return st_slice_cstr(s);
}

/* A record of one message encoded once without its end (node_cs_encode_body, as the write side
 * does for the ring) and finished with the token and watermark (node_cs_encode_prebuilt, as each
 * reader does) is the same bytes as node_cs_encode_change's message; any other record is refused
 * with NOT_FOUND and nothing written. */
static void check_body(const node_cs_change *c, size_t value_bytes, const st_buf *one_msg,
                       size_t msgs) {
    st_buf body, msg;
    st_buf_init(&body);
    st_buf_init(&msg);
    st_buf_append(&body, "x", 1); /* appended after what the buffer holds */
    st_code rc = node_cs_encode_body(c, value_bytes, &body);
    bool shaped = msgs == 1 && c->row->n_muts <= NODE_CS_BODY_CHUNKS_MAX;
    for (size_t i = 0; i < c->row->n_muts; i++)
        shaped = shaped && c->row->muts[i].type != STO_MUT_DEL_ROW;
    assert_int_equal(rc, shaped ? ST_OK : ST_NOT_FOUND);
    if (rc == ST_OK) {
        assert_int_equal(node_cs_encode_prebuilt(&msg, st_slice_make(body.data + 1, body.len - 1),
                                                 c->token ? c->token : "", c->watermark_us),
                         ST_OK);
        assert_int_equal(msg.len, one_msg->len);
        assert_memory_equal(msg.data, one_msg->data, msg.len);
    } else {
        assert_int_equal(body.len, 1);
    }
    st_buf_free(&body);
    st_buf_free(&msg);
}

static st_code encode(const node_cs_change *c, size_t value_bytes, sink *s) {
    st_arena a;
    st_buf msg;
    st_arena_init(&a, 4096);
    st_buf_init(&msg);
    node_cs_pos pos = {0};
    st_code rc;
    s->first_at = s->n;
    do { /* a paused record goes on from the chunk it names, as the reader does in a later turn */
        s->calls++;
        rc = node_cs_encode_change(c, value_bytes, &a, &msg, collect, s, &pos);
        if (a.total_bytes > s->arena_max)
            s->arena_max = a.total_bytes;
        st_arena_reset(&a); /* as the reader does after each call */
    } while (rc == NODE_CS_PAUSE);
    if (rc == ST_OK)
        check_body(c, value_bytes, &s->first, s->n - s->first_at);
    st_arena_deinit(&a);
    st_buf_free(&msg);
    return rc;
}

static void test_changes_msg_small_record(void **state) {
    (void)state;
    sto_mut m[3] = {
        {.type = STO_MUT_SET_CELL,
         .family = S("cf"),
         .qualifier = S("q"),
         .ts_us = 7000,
         .value = S("v")},
        {.type = STO_MUT_DEL_COLUMN,
         .family = S("cf"),
         .qualifier = S("q"),
         .ts_start_us = 0,
         .ts_end_us = STO_TS_END_INF},
        {.type = STO_MUT_DEL_FAMILY, .family = S("g")},
    };
    sto_row_mut row = {
        .row = S("r1"), .muts = m, .n_muts = 3, .commit_ts_us = 1700000000123456, .origin = 2};
    node_cs_change c = {&row, false, "east", "1.42", 41000001, NULL, 0};
    sink s = {0};
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &s), ST_OK);
    assert_int_equal(s.n, 1);
    cs_data *d = dc(&s, 0);
    assert_int_equal(d->type,
                     GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER);
    assert_string_equal(d->source_cluster_id, "east");
    assert_memory_equal(d->row_key.data, "r1", 2);
    assert_int_equal(d->commit_timestamp->seconds, 1700000000);
    assert_int_equal(d->commit_timestamp->nanos, 123456000);
    assert_int_equal(d->tiebreaker, 2);
    assert_true(d->done);
    assert_string_equal(d->token, "1.42");
    assert_int_equal(d->estimated_low_watermark->seconds, 41);
    assert_int_equal(d->estimated_low_watermark->nanos, 1000);
    assert_int_equal(d->n_chunks, 3);
    assert_null(d->chunks[0]->chunk_info);
    assert_int_equal(d->chunks[0]->mutation->set_cell->timestamp_micros, 7000);
    assert_string_equal(d->chunks[0]->mutation->set_cell->family_name, "cf");
    const Google__Bigtable__V2__Mutation__DeleteFromColumn *dcol =
        d->chunks[1]->mutation->delete_from_column;
    assert_non_null(dcol);
    assert_int_equal(dcol->time_range->end_timestamp_micros, 0); /* unbounded */
    assert_string_equal(d->chunks[2]->mutation->delete_from_family->family_name, "g");
    sink_free(&s);
}

static void test_changes_msg_gc_record(void **state) {
    (void)state;
    sto_mut m = {.type = STO_MUT_DEL_COLUMN,
                 .family = S("cf"),
                 .qualifier = S("q"),
                 .ts_start_us = 1000,
                 .ts_end_us = 2000};
    sto_row_mut row = {.row = S("r"), .muts = &m, .n_muts = 1, .commit_ts_us = 5, .origin = 0};
    node_cs_change c = {&row, true, "east", "1.9", 9, NULL, 0};
    sink s = {0};
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &s), ST_OK);
    assert_int_equal(s.n, 1);
    assert_int_equal(
        dc(&s, 0)->type,
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION);
    assert_string_equal(dc(&s, 0)->source_cluster_id, "");
    sink_free(&s);
}

static void test_changes_msg_chunked_value(void **state) {
    (void)state;
    size_t big = 2 * NODE_CS_MSG_VALUE_BYTES + 1000;
    uint8_t *v = malloc(big);
    for (size_t i = 0; i < big; i++)
        v[i] = (uint8_t)(i * 7);
    sto_mut m[2] = {
        {.type = STO_MUT_SET_CELL,
         .family = S("cf"),
         .qualifier = S("big"),
         .ts_us = 1000,
         .value = st_slice_make(v, big)},
        {.type = STO_MUT_SET_CELL,
         .family = S("cf"),
         .qualifier = S("small"),
         .ts_us = 1000,
         .value = S("x")},
    };
    sto_row_mut row = {.row = S("r"), .muts = m, .n_muts = 2, .commit_ts_us = 5, .origin = 1};
    node_cs_change c = {&row, false, "east", "1.5", 5, NULL, 0};
    sink s = {0};
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &s), ST_OK);
    assert_int_equal(s.n, 3);
    size_t off = 0;
    for (size_t i = 0; i < 3; i++) {
        cs_data *d = dc(&s, i);
        bool first = i == 0, last = i == 2;
        assert_int_equal(
            d->type ==
                GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION,
            !first);
        assert_int_equal(d->row_key.len > 0, first);
        assert_int_equal(d->commit_timestamp != NULL, first);
        assert_int_equal(d->source_cluster_id[0] != 0, first);
        assert_int_equal(d->done, last);
        assert_int_equal(d->token[0] != 0, last);
        assert_int_equal(d->estimated_low_watermark != NULL, last);
        const Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk *ch = d->chunks[0];
        assert_non_null(ch->chunk_info);
        assert_int_equal(ch->chunk_info->chunked_value_size, big);
        assert_int_equal(ch->chunk_info->chunked_value_offset, off);
        assert_int_equal(ch->chunk_info->last_chunk, last);
        const ProtobufCBinaryData *piece = &ch->mutation->set_cell->value;
        assert_true(piece->len <= NODE_CS_MSG_VALUE_BYTES);
        assert_memory_equal(piece->data, v + off, piece->len);
        off += piece->len;
    }
    assert_int_equal(off, big);
    /* The small cell rides in the last message, after the last piece. */
    assert_int_equal(dc(&s, 2)->n_chunks, 2);
    assert_null(dc(&s, 2)->chunks[1]->chunk_info);
    assert_true(s.max_bytes < NODE_CS_MSG_VALUE_BYTES + 4096);
    sink_free(&s);
    free(v);
}

/* Paused after every message and resumed: the same messages, one encode call per message. */
static void test_changes_msg_paused_record(void **state) {
    (void)state;
    size_t big = 3 * NODE_CS_MSG_VALUE_BYTES + 17;
    uint8_t *v = malloc(big);
    for (size_t i = 0; i < big; i++)
        v[i] = (uint8_t)(i * 13);
    sto_mut m[3] = {
        {.type = STO_MUT_SET_CELL, .family = S("cf"), .qualifier = S("a"), .value = S("x")},
        {.type = STO_MUT_SET_CELL,
         .family = S("cf"),
         .qualifier = S("big"),
         .ts_us = 1000,
         .value = st_slice_make(v, big)},
        {.type = STO_MUT_DEL_FAMILY, .family = S("cf")},
    };
    sto_row_mut row = {.row = S("r"), .muts = m, .n_muts = 3, .commit_ts_us = 5, .origin = 1};
    node_cs_change c = {&row, false, "east", "1.5", 5, NULL, 0};
    sink whole = {0}, paused = {.pause = true};
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &whole), ST_OK);
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &paused), ST_OK);
    assert_true(whole.n >= 4);
    assert_int_equal(whole.calls, 1);
    assert_int_equal(paused.n, whole.n);
    assert_int_equal(paused.calls, whole.n);
    for (size_t i = 0; i < whole.n; i++) {
        size_t a =
            google__bigtable__v2__read_change_stream_response__get_packed_size(whole.msgs[i]);
        size_t b =
            google__bigtable__v2__read_change_stream_response__get_packed_size(paused.msgs[i]);
        assert_int_equal(a, b);
        uint8_t *x = malloc(a), *y = malloc(b);
        google__bigtable__v2__read_change_stream_response__pack(whole.msgs[i], x);
        google__bigtable__v2__read_change_stream_response__pack(paused.msgs[i], y);
        assert_memory_equal(x, y, a);
        free(x);
        free(y);
    }
    assert_true(dc(&paused, paused.n - 1)->done);
    sink_free(&whole);
    sink_free(&paused);
    free(v);
}

static void test_changes_msg_budget_and_del_row(void **state) {
    (void)state;
    sto_mut m[41];
    for (size_t i = 0; i < 40; i++)
        m[i] = (sto_mut){.type = STO_MUT_SET_CELL,
                         .family = S("cf"),
                         .qualifier = S("q"),
                         .ts_us = 1000,
                         .value = S("0123456789")};
    m[40] = (sto_mut){.type = STO_MUT_DEL_ROW};
    const char *fams[2] = {"a", "b"};
    sto_row_mut row = {.row = S("r"), .muts = m, .n_muts = 41, .commit_ts_us = 5};
    node_cs_change c = {&row, false, "east", "1.5", 5, fams, 2};
    sink s = {0};
    /* 200 bytes a message: a few chunks each (each costs its names, value and 32 bytes). */
    assert_int_equal(encode(&c, 200, &s), ST_OK);
    assert_true(s.n > 5);
    size_t chunks = 0;
    for (size_t i = 0; i < s.n; i++) {
        assert_true(dc(&s, i)->n_chunks >= 1);
        chunks += dc(&s, i)->n_chunks;
    }
    assert_int_equal(chunks, 42); /* DeleteFromRow became two DeleteFromFamily */
    cs_data *last = dc(&s, s.n - 1);
    assert_string_equal(last->chunks[last->n_chunks - 1]->mutation->delete_from_family->family_name,
                        "b");
    assert_string_equal(last->chunks[last->n_chunks - 2]->mutation->delete_from_family->family_name,
                        "a");
    sink_free(&s);
    /* No mutation: nothing is sent. A failing emit stops the encoding with its code. */
    row.n_muts = 0;
    assert_int_equal(encode(&c, 200, &s), ST_OK);
    assert_int_equal(s.n, 0);
    row.n_muts = 41;
    s.fail_at = ST_CANCELLED;
    s.fail_n = 2;
    assert_int_equal(encode(&c, 200, &s), ST_CANCELLED);
    assert_int_equal(s.n, 1);
    sink_free(&s);
}

static void same_msgs(const sink *x, const sink *y) {
    assert_int_equal(x->n, y->n);
    for (size_t i = 0; i < x->n; i++) {
        size_t a = google__bigtable__v2__read_change_stream_response__get_packed_size(x->msgs[i]);
        size_t b = google__bigtable__v2__read_change_stream_response__get_packed_size(y->msgs[i]);
        assert_int_equal(a, b);
        uint8_t *p = malloc(a), *q = malloc(b);
        google__bigtable__v2__read_change_stream_response__pack(x->msgs[i], p);
        google__bigtable__v2__read_change_stream_response__pack(y->msgs[i], q);
        assert_memory_equal(p, q, a);
        free(p);
        free(q);
    }
}

/* A record of 200,000 mods (2,000 DeleteFromRow over 100 families, a value of three chunks in
 * the middle) paused after every message comes out as in one go, every chunk in order, and each
 * call's scratch stays within one message's chunks: a resumed record is not cut into chunks again
 * from its start (it took the whole record's chunk array, some 27 MB, per call). */
static void test_changes_msg_huge_record_resumed(void **state) {
    (void)state;
    enum { FAMS = 100, ROWS = 2000 };
    char names[FAMS][4];
    const char *fams[FAMS];
    for (size_t i = 0; i < FAMS; i++) {
        snprintf(names[i], sizeof names[i], "f%02zu", i);
        fams[i] = names[i];
    }
    size_t big = 2 * NODE_CS_MSG_VALUE_BYTES + 5;
    uint8_t *v = calloc(1, big);
    sto_mut *m = calloc(ROWS + 2, sizeof *m);
    assert_non_null(v);
    assert_non_null(m);
    for (size_t i = 0; i < ROWS + 2; i++)
        m[i] = (sto_mut){.type = STO_MUT_DEL_ROW};
    m[ROWS / 2] = (sto_mut){.type = STO_MUT_SET_CELL,
                            .family = S("f07"),
                            .qualifier = S("big"),
                            .ts_us = 3000,
                            .value = st_slice_make(v, big)};
    m[ROWS + 1] = (sto_mut){.type = STO_MUT_DEL_COLUMN,
                            .family = S("f01"),
                            .qualifier = S("q"),
                            .ts_start_us = 1000,
                            .ts_end_us = 2000};
    sto_row_mut row = {.row = S("r"), .muts = m, .n_muts = ROWS + 2, .commit_ts_us = 9};
    node_cs_change c = {&row, false, "east", "1.9", 9, fams, FAMS};
    sink whole = {0}, paused = {.pause = true};
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &whole), ST_OK);
    assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &paused), ST_OK);
    assert_int_equal(whole.calls, 1);
    assert_true(paused.n > 20);
    assert_int_equal(paused.calls, paused.n);
    same_msgs(&whole, &paused);
    assert_true(paused.arena_max <= 8u << 20);
    /* Every chunk in the record's order. */
    size_t mut = 0, sub = 0, total = 0;
    for (size_t i = 0; i < paused.n; i++) {
        cs_data *d = dc(&paused, i);
        assert_int_equal(d->done, i + 1 == paused.n);
        for (size_t k = 0; k < d->n_chunks; k++, total++) {
            Google__Bigtable__V2__Mutation *x = d->chunks[k]->mutation;
            if (mut == ROWS / 2) {
                assert_non_null(x->set_cell);
                assert_int_equal(d->chunks[k]->chunk_info->chunked_value_offset,
                                 sub * NODE_CS_MSG_VALUE_BYTES);
                if (++sub == 3)
                    mut++, sub = 0;
            } else if (mut == ROWS + 1) {
                assert_non_null(x->delete_from_column);
                mut++;
            } else {
                assert_non_null(x->delete_from_family);
                assert_string_equal(x->delete_from_family->family_name, fams[sub]);
                if (++sub == FAMS)
                    mut++, sub = 0;
            }
        }
    }
    assert_int_equal(mut, ROWS + 2);
    assert_int_equal(total, ROWS * FAMS + 3 + 1);
    sink_free(&whole);
    sink_free(&paused);
    free(m);
    free(v);
}

/* Every field's edge values (empty strings and keys, zero and large times, a negative nanos
 * part, unbounded and bounded DeleteFromColumn ends, DeleteFromFamily, a value exactly at and
 * one past the chunk size, an origin past 127) come out as protobuf-c packs them (collect). */
static void test_changes_msg_wire_forms(void **state) {
    (void)state;
    static uint8_t big[300];
    memset(big, 'v', sizeof big);
    sto_mut m[7] = {
        {.type = STO_MUT_SET_CELL, .family = S("f"), .qualifier = S(""), .ts_us = 0},
        {.type = STO_MUT_SET_CELL,
         .family = S("fam"),
         .qualifier = S("q"),
         .ts_us = 1733000000123456LL,
         .value = st_slice_make(big, 256)},
        {.type = STO_MUT_SET_CELL,
         .family = S("fam"),
         .qualifier = S("q2"),
         .ts_us = 7,
         .value = st_slice_make(big, 257)},
        {.type = STO_MUT_DEL_COLUMN,
         .family = S("f"),
         .qualifier = S("c"),
         .ts_start_us = 0,
         .ts_end_us = STO_TS_END_INF},
        {.type = STO_MUT_DEL_COLUMN,
         .family = S("f"),
         .qualifier = S(""),
         .ts_start_us = 5,
         .ts_end_us = 900000000000LL},
        {.type = STO_MUT_DEL_FAMILY, .family = S("f")},
        {.type = STO_MUT_DEL_ROW},
    };
    const char *fams[1] = {"only"};
    int64_t times[] = {0, 1, 999999, 1000000, 1733000000123456LL, -1500000};
    for (size_t t = 0; t < sizeof times / sizeof times[0]; t++) {
        for (int gc = 0; gc < 2; gc++) {
            sto_row_mut row = {.row = t % 2 ? S("row-key") : S(""),
                               .muts = m,
                               .n_muts = 7,
                               .commit_ts_us = (uint64_t)times[t],
                               .origin = (uint32_t)(t * 100)};
            node_cs_change c = {
                &row, gc, t == 3 ? NULL : "east", t == 2 ? "" : "1.5.9.ab", times[t], fams, 1};
            sink s = {0};
            assert_int_equal(encode(&c, 256, &s), ST_OK);
            assert_true(s.n >= 2);
            size_t chunks = 0;
            for (size_t i = 0; i < s.n; i++)
                chunks += dc(&s, i)->n_chunks;
            assert_int_equal(chunks, 8); /* the 257-byte value in two chunks */
            sink_free(&s);
            assert_int_equal(encode(&c, NODE_CS_MSG_VALUE_BYTES, &s), ST_OK);
            assert_int_equal(s.n, 1);
            assert_int_equal(dc(&s, 0)->n_chunks, 7);
            assert_int_equal(dc(&s, 0)->tiebreaker, (int32_t)(t * 100));
            sink_free(&s);
        }
    }
}

static void test_changes_msg_heartbeat_and_close(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(node_cs_encode_heartbeat(&b, S("a"), S(""), "1.77", 77), ST_OK);
    cs_resp *r = google__bigtable__v2__read_change_stream_response__unpack(
        NULL, b.len - RPC_SEND_HEADROOM, b.data + RPC_SEND_HEADROOM);
    assert_non_null(r);
    assert_int_equal(r->stream_record_case,
                     GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT);
    assert_string_equal(r->heartbeat->continuation_token->token, "1.77");
    assert_memory_equal(
        r->heartbeat->continuation_token->partition->row_range->start_key_closed.data, "a", 1);
    assert_int_equal(r->heartbeat->continuation_token->partition->row_range->end_key_case,
                     GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY__NOT_SET);
    assert_int_equal(r->heartbeat->estimated_low_watermark->nanos, 77000);
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
    node_cs_piece p[2] = {{S(""), S("m"), S("c"), S("m")}, {S("m"), S("x"), S("m"), S("p")}};
    assert_int_equal(node_cs_encode_close(&b, ST_OUT_OF_RANGE, "split", p, 2, "1.5"), ST_OK);
    r = google__bigtable__v2__read_change_stream_response__unpack(NULL, b.len - RPC_SEND_HEADROOM,
                                                                  b.data + RPC_SEND_HEADROOM);
    assert_non_null(r);
    const Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream *cs = r->close_stream;
    assert_int_equal(cs->status->code, ST_OUT_OF_RANGE);
    assert_int_equal(cs->n_new_partitions, 2);
    assert_int_equal(cs->n_continuation_tokens, 2);
    assert_int_equal(cs->new_partitions[0]->row_range->start_key_case,
                     GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY__NOT_SET);
    assert_memory_equal(cs->continuation_tokens[0]->partition->row_range->start_key_closed.data,
                        "c", 1);
    assert_memory_equal(cs->continuation_tokens[1]->partition->row_range->end_key_open.data, "p",
                        1);
    assert_string_equal(cs->continuation_tokens[1]->token, "1.5");
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
    assert_int_equal(node_cs_encode_close(&b, ST_OK, NULL, NULL, 0, "1.5"), ST_OK);
    r = google__bigtable__v2__read_change_stream_response__unpack(NULL, b.len - RPC_SEND_HEADROOM,
                                                                  b.data + RPC_SEND_HEADROOM);
    assert_non_null(r);
    assert_int_equal(r->close_stream->n_continuation_tokens, 0);
    assert_int_equal(r->close_stream->status->code, 0);
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
    st_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_changes_msg_small_record),
        cmocka_unit_test(test_changes_msg_gc_record),
        cmocka_unit_test(test_changes_msg_chunked_value),
        cmocka_unit_test(test_changes_msg_paused_record),
        cmocka_unit_test(test_changes_msg_budget_and_del_row),
        cmocka_unit_test(test_changes_msg_huge_record_resumed),
        cmocka_unit_test(test_changes_msg_wire_forms),
        cmocka_unit_test(test_changes_msg_heartbeat_and_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
