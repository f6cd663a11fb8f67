/*
 * Proves the wire-level reader of ReadChangeStreamResponse (ops_cs_wire_decode), which the
 * bench's consumer uses instead of unpacking each DataChange: against messages protobuf-c packs,
 * it finds the row key, commit time, tiebreaker, cluster, done, token and low watermark; checks
 * chunked values within a message (offsets and sizes must add up, a value left open is
 * reported); leaves heartbeats and CloseStream to the full decoder; and answers BAD, never
 * crashing or reading past the end, for every truncation of a message and for garbage bytes
 * (whenever protobuf-c refuses the bytes, so does it).
 */
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

typedef Google__Bigtable__V2__ReadChangeStreamResponse resp_t;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__DataChange dc_t;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk chunk_t;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk__ChunkInfo info_t;

#define MAX_CHUNKS 4

/* A DataChange of n SetCell chunks; infos[i] NULL = no ChunkInfo. */
typedef struct dc_msg {
    resp_t r;
    dc_t dc;
    Google__Protobuf__Timestamp commit, wm;
    chunk_t ch[MAX_CHUNKS];
    chunk_t *chp[MAX_CHUNKS];
    Google__Bigtable__V2__Mutation mu[MAX_CHUNKS];
    Google__Bigtable__V2__Mutation__SetCell sc[MAX_CHUNKS];
    uint8_t packed[8192];
    size_t len;
} dc_msg;

static void dc_build(dc_msg *m, const char *row, size_t n, const size_t *value_lens,
                     info_t *const *infos, bool done, const char *token) {
    static uint8_t value[2048];
    memset(value, 'v', sizeof value);
    memset(m, 0, sizeof *m);
    google__bigtable__v2__read_change_stream_response__init(&m->r);
    google__bigtable__v2__read_change_stream_response__data_change__init(&m->dc);
    google__protobuf__timestamp__init(&m->commit);
    google__protobuf__timestamp__init(&m->wm);
    m->commit.seconds = 1796416777;
    m->commit.nanos = 123456000;
    m->wm.seconds = 1796416776;
    m->wm.nanos = 5000;
    m->dc.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    m->dc.source_cluster_id = "c1";
    m->dc.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    m->dc.commit_timestamp = &m->commit;
    m->dc.tiebreaker = 7;
    m->dc.done = done;
    m->dc.token = (char *)token;
    m->dc.estimated_low_watermark = &m->wm;
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&m->ch[i]);
        google__bigtable__v2__mutation__init(&m->mu[i]);
        google__bigtable__v2__mutation__set_cell__init(&m->sc[i]);
        m->sc[i].family_name = "f";
        m->sc[i].column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
        m->sc[i].timestamp_micros = 1000;
        m->sc[i].value = (ProtobufCBinaryData){value_lens[i], value};
        m->mu[i].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
        m->mu[i].set_cell = &m->sc[i];
        m->ch[i].mutation = &m->mu[i];
        m->ch[i].chunk_info = infos ? infos[i] : NULL;
        m->chp[i] = &m->ch[i];
    }
    m->dc.n_chunks = n;
    m->dc.chunks = m->chp;
    m->r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    m->r.data_change = &m->dc;
    assert_true(google__bigtable__v2__read_change_stream_response__get_packed_size(&m->r) <=
                sizeof m->packed);
    m->len = google__bigtable__v2__read_change_stream_response__pack(&m->r, m->packed);
}

static st_slice slice_of(const dc_msg *m) {
    return (st_slice){m->packed, m->len};
}

static void info_set(info_t *i, int32_t size, int32_t offset, bool last) {
    google__bigtable__v2__read_change_stream_response__mutation_chunk__chunk_info__init(i);
    i->chunked_value_size = size;
    i->chunked_value_offset = offset;
    i->last_chunk = last;
}

static bool slice_is(st_slice s, const char *text) {
    return s.len == strlen(text) && memcmp(s.data, text, s.len) == 0;
}

static void test_plain_change(void **state) {
    (void)state;
    static dc_msg m;
    size_t lens[2] = {1024, 3};
    dc_build(&m, "cs00000000000042", 2, lens, NULL, true, "tok-42");
    ops_cs_wire_dc dc;
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_int_equal(dc.type, 1);
    assert_true(slice_is(dc.row, "cs00000000000042"));
    assert_true(slice_is(dc.cluster, "c1"));
    assert_true(slice_is(dc.token, "tok-42"));
    assert_int_equal(dc.commit_us, 1796416777LL * 1000000 + 123456);
    assert_int_equal(dc.watermark_us, 1796416776LL * 1000000 + 5);
    assert_int_equal(dc.tiebreaker, 7);
    assert_true(dc.done);
    assert_true(dc.chunks_ok);
    assert_false(dc.chunk_open);
    assert_int_equal(dc.n_chunks, 2);
}

static void test_gc_not_done(void **state) {
    (void)state;
    static dc_msg m;
    size_t lens[1] = {5};
    dc_build(&m, "r", 1, lens, NULL, false, NULL);
    m.dc.type =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION;
    m.dc.estimated_low_watermark = NULL;
    m.len = google__bigtable__v2__read_change_stream_response__pack(&m.r, m.packed);
    ops_cs_wire_dc dc;
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_int_equal(dc.type, 2);
    assert_false(dc.done);
    assert_int_equal(dc.token.len, 0);
    assert_int_equal(dc.watermark_us, 0);
}

static void test_chunked_value(void **state) {
    (void)state;
    static dc_msg m;
    info_t a, b, c;
    ops_cs_wire_dc dc;
    /* one value of 1500 bytes in three chunks within the message: adds up */
    size_t lens[3] = {600, 600, 300};
    info_set(&a, 1500, 0, false);
    info_set(&b, 1500, 600, false);
    info_set(&c, 1500, 1200, true);
    info_t *infos[3] = {&a, &b, &c};
    dc_build(&m, "big", 3, lens, infos, true, "t");
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_true(dc.chunks_ok);
    assert_false(dc.chunk_open);
    /* the value goes on in the next message: open, for the full decoder */
    dc_build(&m, "big", 2, lens, infos, false, NULL);
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_true(dc.chunks_ok);
    assert_true(dc.chunk_open);
    /* an offset that does not follow the bytes received */
    info_set(&b, 1500, 500, false);
    dc_build(&m, "big", 3, lens, infos, true, "t");
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_false(dc.chunks_ok);
    /* a last chunk short of the announced size */
    info_set(&b, 1500, 600, false);
    info_set(&c, 1600, 1200, true);
    dc_build(&m, "big", 3, lens, infos, true, "t");
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_false(dc.chunks_ok);
    /* a continuation's first chunk (offset past 0) is not "ok" here either */
    info_set(&a, 1500, 600, true);
    dc_build(&m, "big", 1, lens, infos, true, "t");
    assert_int_equal(ops_cs_wire_decode(slice_of(&m), &dc), OPS_CS_WIRE_DC);
    assert_false(dc.chunks_ok);
}

static void test_heartbeat_and_close(void **state) {
    (void)state;
    uint8_t buf[512];
    resp_t r;
    google__bigtable__v2__read_change_stream_response__init(&r);
    Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat hb;
    google__bigtable__v2__read_change_stream_response__heartbeat__init(&hb);
    Google__Bigtable__V2__StreamContinuationToken tok;
    google__bigtable__v2__stream_continuation_token__init(&tok);
    tok.token = "hb-token";
    hb.continuation_token = &tok;
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT;
    r.heartbeat = &hb;
    size_t len = google__bigtable__v2__read_change_stream_response__pack(&r, buf);
    ops_cs_wire_dc dc;
    assert_int_equal(ops_cs_wire_decode((st_slice){buf, len}, &dc), OPS_CS_WIRE_OTHER);
    Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream cl;
    google__bigtable__v2__read_change_stream_response__close_stream__init(&cl);
    Google__Rpc__Status st;
    google__rpc__status__init(&st);
    st.code = 11;
    st.message = "split";
    cl.status = &st;
    r.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM;
    r.close_stream = &cl;
    len = google__bigtable__v2__read_change_stream_response__pack(&r, buf);
    assert_int_equal(ops_cs_wire_decode((st_slice){buf, len}, &dc), OPS_CS_WIRE_OTHER);
    /* an empty message has no record: the full decoder says what to do */
    assert_int_equal(ops_cs_wire_decode((st_slice){buf, 0}, &dc), OPS_CS_WIRE_OTHER);
}

/* Every prefix of a message, on a heap copy of exactly that size (ASan sees any read past
 * it): whatever protobuf-c refuses, the wire reader refuses too; what it reads as a change has
 * the same row key. */
static void test_truncations(void **state) {
    (void)state;
    static dc_msg m;
    info_t a, b;
    info_set(&a, 300, 0, false);
    info_set(&b, 300, 200, true);
    info_t *infos[2] = {&a, &b};
    size_t lens[2] = {200, 100};
    dc_build(&m, "cs00000000000001", 2, lens, infos, true, "tok");
    size_t bad = 0;
    for (size_t n = 0; n < m.len; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        assert_non_null(copy);
        memcpy(copy, m.packed, n);
        ops_cs_wire_dc dc;
        ops_cs_wire_rc rc = ops_cs_wire_decode((st_slice){copy, n}, &dc);
        resp_t *u = google__bigtable__v2__read_change_stream_response__unpack(NULL, n, copy);
        if (!u)
            assert_int_equal(rc, OPS_CS_WIRE_BAD);
        if (rc == OPS_CS_WIRE_DC) {
            assert_non_null(u);
            assert_int_equal(dc.row.len, u->data_change->row_key.len);
        }
        bad += rc == OPS_CS_WIRE_BAD;
        if (u)
            google__bigtable__v2__read_change_stream_response__free_unpacked(u, NULL);
        free(copy);
    }
    assert_true(bad > 0);
}

static void test_garbage(void **state) {
    (void)state;
    ops_cs_wire_dc dc;
    static const uint8_t overlong[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t group[] = {0x0b, 0x0c};
    static const uint8_t key_only[] = {0x0a};
    static const uint8_t varint_run[] = {0x08, 0x80, 0x80};
    static const uint8_t inner_bad[] = {0x0a, 0x02, 0x1a, 0x05}; /* row_key longer than its dc */
    static const uint8_t field0[] = {0x00, 0x01};
    assert_int_equal(ops_cs_wire_decode((st_slice){overlong, sizeof overlong}, &dc),
                     OPS_CS_WIRE_BAD);
    assert_int_equal(ops_cs_wire_decode((st_slice){group, sizeof group}, &dc), OPS_CS_WIRE_BAD);
    assert_int_equal(ops_cs_wire_decode((st_slice){key_only, sizeof key_only}, &dc),
                     OPS_CS_WIRE_BAD);
    assert_int_equal(ops_cs_wire_decode((st_slice){varint_run, sizeof varint_run}, &dc),
                     OPS_CS_WIRE_BAD);
    assert_int_equal(ops_cs_wire_decode((st_slice){inner_bad, sizeof inner_bad}, &dc),
                     OPS_CS_WIRE_BAD);
    assert_int_equal(ops_cs_wire_decode((st_slice){field0, sizeof field0}, &dc), OPS_CS_WIRE_BAD);
    /* random bytes: any answer, no crash, no read past the end */
    uint32_t x = 12345;
    for (int round = 0; round < 2000; round++) {
        size_t n = (size_t)(x % 64);
        uint8_t *g = malloc(n ? n : 1);
        assert_non_null(g);
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            g[i] = (uint8_t)(x >> 16);
        }
        (void)ops_cs_wire_decode((st_slice){g, n}, &dc);
        free(g);
        x = x * 1103515245u + 12345u;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_change),  cmocka_unit_test(test_gc_not_done),
        cmocka_unit_test(test_chunked_value), cmocka_unit_test(test_heartbeat_and_close),
        cmocka_unit_test(test_truncations),   cmocka_unit_test(test_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
