/*
 * Proves the bench's response checks accept every legal answer and reject wrong ones. Responses
 * are built with the generated protobuf-c code (so the hand-written wire reader is checked
 * against the real encoding): rows in one message or spread over several, a cell split over
 * chunks (value_size), a reset row, extra fields; and failures: a wrong key, a short value,
 * missing or extra rows, a row left open, garbage bytes. MutateRows: all entries OK across
 * messages passes; a failed entry, a repeated or missing index, an out-of-range index fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"
#include "google/bigtable/v2/bigtable.pb-c.h"

#define VAL 40

typedef Google__Bigtable__V2__ReadRowsResponse__CellChunk chunk_t;

typedef struct resp_builder {
    chunk_t chunks[32];
    chunk_t *ptrs[32];
    Google__Protobuf__StringValue fam;
    Google__Protobuf__BytesValue qual;
    char keys[32][OPS_KEY_BYTES + 1];
    size_t n;
    uint8_t value[4 * VAL];
    uint8_t out[16384];
} resp_builder;

static void rb_init(resp_builder *b) {
    memset(b, 0, sizeof(*b));
    google__protobuf__string_value__init(&b->fam);
    b->fam.value = "f";
    google__protobuf__bytes_value__init(&b->qual);
    b->qual.value = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    memset(b->value, 'v', sizeof(b->value));
}

/* A chunk: key_index < 0 = continuation (no key); value of vlen bytes; value_size > 0 marks a
 * split cell; commit / reset. */
static void rb_chunk(resp_builder *b, long key_index, size_t vlen, int32_t value_size, bool commit,
                     bool reset) {
    chunk_t *c = &b->chunks[b->n];
    google__bigtable__v2__read_rows_response__cell_chunk__init(c);
    if (key_index >= 0) {
        size_t kl = ops_key_format(b->keys[b->n], (uint64_t)key_index);
        c->row_key = (ProtobufCBinaryData){kl, (uint8_t *)b->keys[b->n]};
        c->family_name = &b->fam;
        c->qualifier = &b->qual;
        c->timestamp_micros = 1000;
    }
    c->value = (ProtobufCBinaryData){vlen, b->value};
    c->value_size = value_size;
    if (commit) {
        c->row_status_case =
            GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
        c->commit_row = 1;
    } else if (reset) {
        c->row_status_case =
            GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_RESET_ROW;
        c->reset_row = 1;
    }
    b->ptrs[b->n] = c;
    b->n++;
}

/* Packs chunks [from, to) as one ReadRowsResponse. */
static st_slice rb_pack(resp_builder *b, size_t from, size_t to) {
    Google__Bigtable__V2__ReadRowsResponse r;
    google__bigtable__v2__read_rows_response__init(&r);
    r.n_chunks = to - from;
    r.chunks = &b->ptrs[from];
    r.last_scanned_row_key = (ProtobufCBinaryData){3, (uint8_t *)"zzz"};
    assert_true(google__bigtable__v2__read_rows_response__get_packed_size(&r) <= sizeof(b->out));
    size_t len = google__bigtable__v2__read_rows_response__pack(&r, b->out);
    return st_slice_make(b->out, len);
}

static void test_verify_rows_in_one_message(void **state) {
    (void)state;
    resp_builder *b = malloc(sizeof(*b));
    rb_init(b);
    for (long i = 5; i < 10; i++)
        rb_chunk(b, i, VAL, 0, true, false);
    ops_rowcheck c;
    ops_rowcheck_begin(&c, 5, 5, VAL);
    assert_true(ops_rowcheck_feed(&c, rb_pack(b, 0, b->n)));
    assert_true(ops_rowcheck_finish(&c));
    assert_int_equal(c.rows_done, 5);
    assert_int_equal(c.bytes_done, 5 * (OPS_KEY_BYTES + VAL));
    free(b);
}

static void test_verify_split_cells_messages_and_reset(void **state) {
    (void)state;
    resp_builder *b = malloc(sizeof(*b));
    rb_init(b);
    rb_chunk(b, 0, 10, VAL, false, false); /* row 0: a cell in three pieces */
    rb_chunk(b, -1, 10, VAL, false, false);
    rb_chunk(b, -1, VAL - 20, 0, true, false);
    rb_chunk(b, 1, VAL, 0, false, false); /* row 1: sent, then reset */
    rb_chunk(b, -1, 0, 0, false, true);
    rb_chunk(b, 1, VAL, 0, false, false); /* row 1 again, two cells */
    rb_chunk(b, -1, VAL, 0, true, false);
    ops_rowcheck c;
    ops_rowcheck_begin(&c, 0, 2, VAL);
    /* Each chunk in its own message. */
    for (size_t i = 0; i < b->n; i++)
        assert_true(ops_rowcheck_feed(&c, rb_pack(b, i, i + 1)));
    assert_true(ops_rowcheck_finish(&c));
    assert_int_equal(c.rows_done, 2);
    free(b);
}

static bool check_fails(resp_builder *b, uint64_t first, uint64_t rows) {
    ops_rowcheck c;
    ops_rowcheck_begin(&c, first, rows, VAL);
    bool ok = ops_rowcheck_feed(&c, rb_pack(b, 0, b->n));
    ok = ops_rowcheck_finish(&c) && ok;
    if (!ok)
        assert_true(c.msg[0] != '\0');
    return !ok;
}

static void test_verify_rejects_wrong_answers(void **state) {
    (void)state;
    resp_builder *b = malloc(sizeof(*b));
    rb_init(b); /* wrong key */
    rb_chunk(b, 4, VAL, 0, true, false);
    assert_true(check_fails(b, 3, 1));
    rb_init(b); /* short value */
    rb_chunk(b, 3, VAL - 1, 0, true, false);
    assert_true(check_fails(b, 3, 1));
    rb_init(b); /* nothing back */
    assert_true(check_fails(b, 3, 1));
    rb_init(b); /* a row too many */
    rb_chunk(b, 3, VAL, 0, true, false);
    rb_chunk(b, 4, VAL, 0, true, false);
    assert_true(check_fails(b, 3, 1));
    rb_init(b); /* row never committed */
    rb_chunk(b, 3, VAL, 0, false, false);
    assert_true(check_fails(b, 3, 1));
    rb_init(b); /* a gap */
    rb_chunk(b, 3, VAL, 0, true, false);
    rb_chunk(b, 5, VAL, 0, true, false);
    assert_true(check_fails(b, 3, 2));
    free(b);
    /* garbage: a truncated length-delimited field */
    static const uint8_t junk[] = {0x0a, 0x20, 0x01};
    ops_rowcheck c;
    ops_rowcheck_begin(&c, 0, 1, VAL);
    assert_false(ops_rowcheck_feed(&c, st_slice_make(junk, sizeof(junk))));
    assert_false(ops_rowcheck_finish(&c));
}

/* ---- MutateRows ---- */

static st_slice bulk_pack(uint8_t *out, size_t cap, const int64_t *idx, const int32_t *codes,
                          size_t n) {
    Google__Bigtable__V2__MutateRowsResponse__Entry e[16], *ep[16];
    Google__Rpc__Status st[16];
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__mutate_rows_response__entry__init(&e[i]);
        google__rpc__status__init(&st[i]);
        st[i].code = codes[i];
        st[i].message = codes[i] ? "nope" : "";
        e[i].index = idx[i];
        e[i].status = &st[i];
        ep[i] = &e[i];
    }
    Google__Bigtable__V2__MutateRowsResponse r;
    google__bigtable__v2__mutate_rows_response__init(&r);
    r.n_entries = n;
    r.entries = ep;
    assert_true(google__bigtable__v2__mutate_rows_response__get_packed_size(&r) <= cap);
    return st_slice_make(out, google__bigtable__v2__mutate_rows_response__pack(&r, out));
}

static void test_verify_mutate_rows_entries(void **state) {
    (void)state;
    uint8_t buf[1024];
    static const int32_t ok[4] = {0, 0, 0, 0};
    ops_bulkcheck c;
    /* all four OK, over two messages, out of order */
    ops_bulkcheck_begin(&c, 4);
    int64_t i1[] = {2, 0}, i2[] = {3, 1};
    assert_true(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), i1, ok, 2)));
    assert_true(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), i2, ok, 2)));
    assert_true(ops_bulkcheck_finish(&c));
    /* one failed entry: its code is reported */
    int64_t all[] = {0, 1, 2, 3};
    int32_t codes[] = {0, 14, 0, 0};
    ops_bulkcheck_begin(&c, 4);
    assert_true(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), all, codes, 4)));
    assert_false(ops_bulkcheck_finish(&c));
    assert_int_equal(c.first_error, ST_UNAVAILABLE);
    /* missing */
    ops_bulkcheck_begin(&c, 4);
    assert_true(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), all, ok, 3)));
    assert_false(ops_bulkcheck_finish(&c));
    /* repeated */
    int64_t rep[] = {0, 1, 1, 2};
    ops_bulkcheck_begin(&c, 4);
    assert_false(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), rep, ok, 4)));
    assert_false(ops_bulkcheck_finish(&c));
    /* out of range */
    int64_t big[] = {7};
    ops_bulkcheck_begin(&c, 4);
    assert_false(ops_bulkcheck_feed(&c, bulk_pack(buf, sizeof(buf), big, ok, 1)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_rows_in_one_message),
        cmocka_unit_test(test_verify_split_cells_messages_and_reset),
        cmocka_unit_test(test_verify_rejects_wrong_answers),
        cmocka_unit_test(test_verify_mutate_rows_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
