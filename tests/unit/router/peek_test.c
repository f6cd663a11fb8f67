/*
 * Proves the router's request peeking (peek.c) against the generated code: requests packed with
 * protobuf-c peek to the same table, profile, row, rows_limit, reversed flag, entry and mutation
 * counts; a SetCell with timestamp -1 anywhere makes a write non-idempotent; encodings the peek
 * does not take (a singular field twice, a known field with another wire type, a mutation with
 * two kinds, truncated bytes, a NUL byte inside a table name, app profile id or family name) are
 * refused so the handler unpacks them (and refuses the NUL). Also proves
 * rtr_read_covers, which lets a first ReadRows step send the client's bytes unchanged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rtu_fixture.h"

static bool slice_is(st_slice s, const char *want) {
    return s.len == strlen(want) && memcmp(s.data, want, s.len) == 0;
}

static st_slice pack(const ProtobufCMessage *m, uint8_t *buf, size_t cap) {
    size_t n = protobuf_c_message_get_packed_size(m);
    assert_true(n <= cap);
    return st_slice_make(buf, protobuf_c_message_pack(m, buf));
}

static void test_peek_read_rows_matches_generated_code(void **state) {
    (void)state;
    rtu_read_rows fx;
    rtu_read_rows_init(&fx);
    Google__Bigtable__V2__ReadRowsRequest *req = &fx.req;
    uint8_t buf[512];
    st_slice b = pack(&req->base, buf, sizeof buf);
    rtr_rr_peek pk;
    assert_true(rtr_peek_read_rows(b, &pk));
    assert_true(slice_is(pk.table, req->table_name));
    assert_true(slice_is(pk.profile, "prof"));
    assert_true(pk.has_rows);
    assert_int_equal(pk.rows_limit, 7);
    assert_true(pk.reversed);
    Google__Bigtable__V2__RowSet *back =
        google__bigtable__v2__row_set__unpack(NULL, pk.rows.len, pk.rows.data);
    assert_non_null(back);
    assert_int_equal(back->n_row_keys, 2);
    google__bigtable__v2__row_set__free_unpacked(back, NULL);

    /* No rows, no profile: every row of the table, the default profile. */
    google__bigtable__v2__read_rows_request__init(req);
    req->table_name = "projects/p/instances/i/tables/t";
    b = pack(&req->base, buf, sizeof buf);
    assert_true(rtr_peek_read_rows(b, &pk));
    assert_false(pk.has_rows);
    assert_int_equal(pk.profile.len, 0);
    assert_int_equal(pk.rows_limit, 0);
    assert_false(pk.reversed);
}

static void test_peek_read_rows_refuses_odd_encodings(void **state) {
    (void)state;
    /* table_name twice (protobuf: the last wins), rows_limit as bytes, a truncated field. */
    static const uint8_t twice[] = {0x0a, 0x01, 'a', 0x0a, 0x01, 'b'};
    static const uint8_t limit_bytes[] = {0x0a, 0x01, 'a', 0x22, 0x01, 0x05};
    static const uint8_t truncated[] = {0x0a, 0x05, 'a'};
    rtr_rr_peek pk;
    assert_false(rtr_peek_read_rows(st_slice_make(twice, sizeof twice), &pk));
    assert_false(rtr_peek_read_rows(st_slice_make(limit_bytes, sizeof limit_bytes), &pk));
    assert_false(rtr_peek_read_rows(st_slice_make(truncated, sizeof truncated), &pk));
    /* An unknown field travels: the peek still takes the request. */
    static const uint8_t unknown[] = {0x0a, 0x01, 'a', 0xf8, 0x01, 0x01};
    assert_true(rtr_peek_read_rows(st_slice_make(unknown, sizeof unknown), &pk));
    assert_true(slice_is(pk.table, "a"));
}

static void mutation_set_cell(Google__Bigtable__V2__Mutation *m,
                              Google__Bigtable__V2__Mutation__SetCell *sc, int64_t ts) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = "f";
    sc->column_qualifier = rtu_bin("q");
    sc->timestamp_micros = ts;
    sc->value = rtu_bin("value");
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

static void test_peek_mutate_row_finds_row_and_server_time(void **state) {
    (void)state;
    Google__Bigtable__V2__Mutation m[2], *mp[2] = {&m[0], &m[1]};
    Google__Bigtable__V2__Mutation__SetCell sc[2];
    mutation_set_cell(&m[0], &sc[0], 1000);
    mutation_set_cell(&m[1], &sc[1], 2000);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    req.app_profile_id = "prof";
    req.row_key = rtu_bin("row-1");
    req.mutations = mp;
    req.n_mutations = 2;
    uint8_t buf[512];
    rtr_mr_peek pk;
    assert_true(rtr_peek_mutate_row(pack(&req.base, buf, sizeof buf), &pk));
    assert_true(slice_is(pk.table, req.table_name));
    assert_true(slice_is(pk.profile, "prof"));
    assert_true(slice_is(pk.row, "row-1"));
    assert_int_equal(pk.n_mutations, 2);
    assert_true(pk.idempotent);

    sc[1].timestamp_micros = -1; /* server time */
    assert_true(rtr_peek_mutate_row(pack(&req.base, buf, sizeof buf), &pk));
    assert_false(pk.idempotent);

    /* A mutation carrying two kinds (set_cell then delete_from_row): left to protobuf-c. */
    static const uint8_t two_kinds[] = {0x0a, 0x01, 't',  0x12, 0x01, 'r',
                                        0x1a, 0x04, 0x0a, 0x00, 0x22, 0x00};
    assert_false(rtr_peek_mutate_row(st_slice_make(two_kinds, sizeof two_kinds), &pk));
}

static void test_peek_mutate_rows_counts_entries(void **state) {
    (void)state;
    Google__Bigtable__V2__Mutation m[3], *mp[3] = {&m[0], &m[1], &m[2]};
    Google__Bigtable__V2__Mutation__SetCell sc[3];
    for (int i = 0; i < 3; i++)
        mutation_set_cell(&m[i], &sc[i], 1000);
    Google__Bigtable__V2__MutateRowsRequest__Entry e[2], *ep[2] = {&e[0], &e[1]};
    google__bigtable__v2__mutate_rows_request__entry__init(&e[0]);
    google__bigtable__v2__mutate_rows_request__entry__init(&e[1]);
    e[0].row_key = rtu_bin("a");
    e[0].mutations = mp;
    e[0].n_mutations = 1;
    e[1].row_key = rtu_bin("b");
    e[1].mutations = mp + 1;
    e[1].n_mutations = 2;
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    req.app_profile_id = "prof";
    req.entries = ep;
    req.n_entries = 2;
    uint8_t buf[1024];
    rtr_mrs_peek pk;
    assert_true(rtr_peek_mutate_rows(pack(&req.base, buf, sizeof buf), &pk));
    assert_true(slice_is(pk.table, req.table_name));
    assert_true(slice_is(pk.profile, "prof"));
    assert_true(slice_is(pk.first_row, "a"));
    assert_int_equal(pk.n_entries, 2);
    assert_int_equal(pk.n_mutations, 3);
    assert_true(pk.idempotent);
    sc[2].timestamp_micros = -1;
    assert_true(rtr_peek_mutate_rows(pack(&req.base, buf, sizeof buf), &pk));
    assert_false(pk.idempotent);
}

static void test_peek_read_covers(void **state) {
    (void)state;
    btu_key_range v[] = {{S("b"), S("c")}, {S("d"), S("f")}};
    btu_rowset rs = {v, 2};
    rtr_tablet all = {.start = S(""), .end = S("")};
    rtr_tablet inside = {.start = S("a"), .end = S("g")};
    rtr_tablet exact = {.start = S("b"), .end = S("f")};
    rtr_tablet cut = {.start = S("a"), .end = S("e")};
    rtr_tablet late = {.start = S("c"), .end = S("")};
    assert_true(rtr_read_covers(&rs, &all));
    assert_true(rtr_read_covers(&rs, &inside));
    assert_true(rtr_read_covers(&rs, &exact));
    assert_false(rtr_read_covers(&rs, &cut));
    assert_false(rtr_read_covers(&rs, &late));
    btu_key_range open[] = {{S("b"), S("")}};
    btu_rowset rs_open = {open, 1};
    assert_true(rtr_read_covers(&rs_open, &all));
    assert_false(rtr_read_covers(&rs_open, &inside));
    btu_rowset none = {NULL, 0};
    assert_false(rtr_read_covers(&none, &all));
}

/* Hand-encoded: field 1 table name, field 3 one mutation whose set_cell has family "cf". */
static void test_peek_refuses_nul_in_names(void **state) {
    (void)state;
    static const uint8_t table_nul[] = {0x0a, 3, 't', 0, 'x', 0x12, 1, 'r'};
    rtr_mr_peek mr;
    assert_false(rtr_peek_mutate_row(st_slice_make(table_nul, sizeof table_nul), &mr));
    static const uint8_t family_nul[] = {0x0a, 1,    't', 0x12, 1, 'r', 0x1a,
                                         6,    0x0a, 4,   0x0a, 2, 'c', 0};
    assert_false(rtr_peek_mutate_row(st_slice_make(family_nul, sizeof family_nul), &mr));
    static const uint8_t family_ok[] = {0x0a, 1,    't', 0x12, 1, 'r', 0x1a,
                                        6,    0x0a, 4,   0x0a, 2, 'c', 'f'};
    assert_true(rtr_peek_mutate_row(st_slice_make(family_ok, sizeof family_ok), &mr));
    static const uint8_t profile_nul[] = {0x0a, 1, 't', 0x2a, 2, 'p', 0};
    rtr_rr_peek rr;
    assert_false(rtr_peek_read_rows(st_slice_make(profile_nul, sizeof profile_nul), &rr));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peek_read_rows_matches_generated_code),
        cmocka_unit_test(test_peek_read_rows_refuses_odd_encodings),
        cmocka_unit_test(test_peek_mutate_row_finds_row_and_server_time),
        cmocka_unit_test(test_peek_mutate_rows_counts_entries),
        cmocka_unit_test(test_peek_read_covers),
        cmocka_unit_test(test_peek_refuses_nul_in_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
