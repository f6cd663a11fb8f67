/*
 * Proves the router's byte-level request rewriting and answer merging: copying a message minus
 * some fields keeps every other field verbatim (unknown ones too); a RowSet written by hand
 * decodes with the generated code to the same ranges; a MutateRows request split into entries and
 * rebuilt per node decodes to exactly the chosen entries with the original table and profile;
 * per-node answers (with node-local indexes, in any order) merge back into the caller's order;
 * the ReadRows tracker counts committed rows, follows the last row and last_scanned_row_key in
 * scan order and sees a row left open; and SampleRowKeys answers of several nodes merge into one
 * ascending list ending with the empty key and the total.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "google/rpc/status.pb-c.h"
#include "rtu_fixture.h"

static void test_wire_copy_except_keeps_other_fields(void **state) {
    (void)state;
    rtu_read_rows fx;
    rtu_read_rows_init(&fx);
    Google__Bigtable__V2__ReadRowsRequest *req = &fx.req;
    uint8_t buf[512];
    size_t len = google__bigtable__v2__read_rows_request__pack(req, buf);
    st_buf tag; /* an unknown varint field 99, as a newer client might send */
    st_buf_init(&tag);
    rtr_wire_put_varint(&tag, 99, 5);
    memcpy(buf + len, tag.data, tag.len);
    len += tag.len;
    st_buf_free(&tag);

    st_buf out;
    st_buf_init(&out);
    static const uint32_t skip[] = {2, 4};
    assert_int_equal(rtr_wire_copy_except(&out, st_slice_make(buf, len), skip, 2), ST_OK);
    btu_key_range r[2] = {{S("c"), S("d")}, {S(""), S("")}};
    btu_rowset sub = {r, 1};
    assert_int_equal(rtr_wire_put_rowset(&out, 2, &sub), ST_OK);
    assert_int_equal(rtr_wire_put_varint(&out, 4, 3), ST_OK);
    Google__Bigtable__V2__ReadRowsRequest *m =
        google__bigtable__v2__read_rows_request__unpack(NULL, out.len, out.data);
    assert_non_null(m);
    assert_string_equal(m->table_name, req->table_name);
    assert_string_equal(m->app_profile_id, "prof");
    assert_true(m->reversed);
    assert_int_equal(m->rows_limit, 3);
    assert_int_equal(m->rows->n_row_keys, 0);
    assert_int_equal(m->rows->n_row_ranges, 1);
    const Google__Bigtable__V2__RowRange *rr = m->rows->row_ranges[0];
    assert_int_equal(rr->start_key_case,
                     GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED);
    assert_int_equal(rr->end_key_case, GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN);
    assert_memory_equal(rr->start_key_closed.data, "c", 1);
    assert_memory_equal(rr->end_key_open.data, "d", 1);
    /* the unknown field survived */
    assert_non_null(m->base.unknown_fields);
    assert_int_equal(m->base.n_unknown_fields, 1);
    assert_int_equal(m->base.unknown_fields[0].tag, 99);
    google__bigtable__v2__read_rows_request__free_unpacked(m, NULL);

    /* An unbounded range is a RowRange with no fields: all rows. */
    st_buf_reset(&out);
    sub = (btu_rowset){&r[1], 1};
    assert_int_equal(rtr_wire_put_rowset(&out, 2, &sub), ST_OK);
    m = google__bigtable__v2__read_rows_request__unpack(NULL, out.len, out.data);
    assert_non_null(m);
    assert_int_equal(m->rows->n_row_ranges, 1);
    assert_int_equal(m->rows->row_ranges[0]->start_key_case,
                     GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY__NOT_SET);
    google__bigtable__v2__read_rows_request__free_unpacked(m, NULL);
    /* Malformed input is refused. */
    uint8_t bad[] = {0x0a, 0x10, 'x'};
    assert_int_equal(rtr_wire_copy_except(&out, st_slice_make(bad, sizeof bad), skip, 2),
                     ST_INVALID_ARGUMENT);
    st_buf_free(&out);
}

/* A MutateRows request with n entries whose rows are keys[i]. */
static size_t pack_mutate_rows(const char *const *keys, size_t n, uint8_t *buf) {
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    req.app_profile_id = "ap";
    Google__Bigtable__V2__MutateRowsRequest__Entry ents[8], *pe[8];
    Google__Bigtable__V2__Mutation mut, *pm[1] = {&mut};
    Google__Bigtable__V2__Mutation__DeleteFromRow del;
    google__bigtable__v2__mutation__init(&mut);
    google__bigtable__v2__mutation__delete_from_row__init(&del);
    mut.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
    mut.delete_from_row = &del;
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&ents[i]);
        ents[i].row_key = rtu_bin(keys[i]);
        ents[i].mutations = pm;
        ents[i].n_mutations = 1;
        pe[i] = &ents[i];
    }
    req.entries = pe;
    req.n_entries = n;
    return google__bigtable__v2__mutate_rows_request__pack(&req, buf);
}

/* A node's answer: entry j (its local index) gets code codes[j]; listed in reverse. */
static size_t pack_answer(const st_code *codes, size_t n, uint8_t *buf) {
    Google__Bigtable__V2__MutateRowsResponse resp;
    google__bigtable__v2__mutate_rows_response__init(&resp);
    Google__Bigtable__V2__MutateRowsResponse__Entry ents[8], *pe[8];
    Google__Rpc__Status sts[8];
    for (size_t i = 0; i < n; i++) {
        size_t j = n - 1 - i;
        google__bigtable__v2__mutate_rows_response__entry__init(&ents[i]);
        google__rpc__status__init(&sts[i]);
        sts[i].code = codes[j];
        sts[i].message = codes[j] ? "bad" : "";
        ents[i].index = (int64_t)j;
        ents[i].status = &sts[i];
        pe[i] = &ents[i];
    }
    resp.entries = pe;
    resp.n_entries = n;
    return google__bigtable__v2__mutate_rows_response__pack(&resp, buf);
}

/* Entries invalid whatever their table are named by the split, so the router answers them itself
 * (INVALID_ARGUMENT even while their node is down); valid ones, -1 timestamps included, are not. */
static void test_wire_mutate_rows_split_names_invalid_entries(void **state) {
    (void)state;
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = "projects/p/instances/i/tables/t";
    enum { N = 6 };
    static char long_key[BTU_ROW_KEY_MAX + 1];
    memset(long_key, 'k', sizeof long_key);
    const char *keys[N] = {"ok", "", "nomuts", "neg", "micros", "server"};
    int64_t ts[N] = {1000, 1000, 0, -5000, 1234, -1};
    Google__Bigtable__V2__MutateRowsRequest__Entry ents[N + 1], *pe[N + 1];
    Google__Bigtable__V2__Mutation mut[N + 1], *pm[N + 1];
    Google__Bigtable__V2__Mutation__SetCell sc[N + 1];
    for (size_t i = 0; i <= N; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&ents[i]);
        google__bigtable__v2__mutation__init(&mut[i]);
        google__bigtable__v2__mutation__set_cell__init(&sc[i]);
        sc[i].family_name = "f";
        sc[i].timestamp_micros = i < N ? ts[i] : 0;
        mut[i].mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
        mut[i].set_cell = &sc[i];
        pm[i] = &mut[i];
        const char *k = i < N ? keys[i] : long_key;
        size_t klen = i < N ? strlen(k) : sizeof long_key;
        ents[i].row_key = (ProtobufCBinaryData){klen, (uint8_t *)k};
        ents[i].mutations = &pm[i];
        ents[i].n_mutations = i == 2 ? 0 : 1;
        pe[i] = &ents[i];
    }
    req.entries = pe;
    req.n_entries = N + 1;
    size_t len = google__bigtable__v2__mutate_rows_request__get_packed_size(&req);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    st_arena a;
    st_arena_init(&a, 4096);
    st_buf head;
    st_buf_init(&head);
    rtr_entry *e;
    size_t n;
    assert_int_equal(rtr_mutate_rows_split(st_slice_make(buf, len), &a, &head, &e, &n), ST_OK);
    assert_int_equal(n, N + 1);
    assert_null(e[0].invalid);
    assert_string_equal(e[1].invalid, "row key must not be empty");
    assert_string_equal(e[2].invalid, "No mutations provided");
    assert_non_null(strstr(e[3].invalid, "must not be negative, got -5000"));
    assert_non_null(strstr(e[4].invalid, "Timestamp granularity mismatch"));
    assert_null(e[5].invalid);
    assert_non_null(strstr(e[6].invalid, "row key longer than 4096 bytes (4097)"));
    /* A MutateRowRequest (mutations are its field 3) gets the same checks. */
    Google__Bigtable__V2__MutateRowRequest one;
    google__bigtable__v2__mutate_row_request__init(&one);
    one.table_name = req.table_name;
    one.row_key = ents[0].row_key;
    uint8_t one_buf[256];
    size_t one_len = google__bigtable__v2__mutate_row_request__pack(&one, one_buf);
    assert_string_equal(rtr_mutations_invalid(st_slice_make(one_buf, one_len), 3, &a),
                        "No mutations provided");
    one.mutations = &pm[4]; /* timestamp 1234 */
    one.n_mutations = 1;
    one_len = google__bigtable__v2__mutate_row_request__pack(&one, one_buf);
    assert_non_null(strstr(rtr_mutations_invalid(st_slice_make(one_buf, one_len), 3, &a),
                           "Timestamp granularity mismatch"));
    one.mutations = &pm[5]; /* -1: the server's time */
    one_len = google__bigtable__v2__mutate_row_request__pack(&one, one_buf);
    assert_null(rtr_mutations_invalid(st_slice_make(one_buf, one_len), 3, &a));
    st_buf_free(&head);
    st_arena_deinit(&a);
    free(buf);
}

static void test_wire_mutate_rows_group_and_merge_in_caller_order(void **state) {
    (void)state;
    const char *keys[] = {"k0", "k1", "k2", "k3", "k4"};
    uint8_t buf[1024];
    size_t len = pack_mutate_rows(keys, 5, buf);
    st_arena a;
    st_arena_init(&a, 4096);
    st_buf head;
    st_buf_init(&head);
    rtr_entry *e;
    size_t n;
    assert_int_equal(rtr_mutate_rows_split(st_slice_make(buf, len), &a, &head, &e, &n), ST_OK);
    assert_int_equal(n, 5);
    for (size_t i = 0; i < n; i++)
        assert_true(st_slice_eq(e[i].row, st_slice_cstr(keys[i])));
    /* Two nodes: odd entries and even entries. */
    size_t odd[] = {1, 3}, even[] = {0, 2, 4};
    st_buf sub;
    st_buf_init(&sub);
    assert_int_equal(rtr_mutate_rows_build(&sub, st_buf_slice(&head), e, odd, 2), ST_OK);
    Google__Bigtable__V2__MutateRowsRequest *m =
        google__bigtable__v2__mutate_rows_request__unpack(NULL, sub.len, sub.data);
    assert_non_null(m);
    assert_string_equal(m->table_name, "projects/p/instances/i/tables/t");
    assert_string_equal(m->app_profile_id, "ap");
    assert_int_equal(m->n_entries, 2);
    assert_memory_equal(m->entries[0]->row_key.data, "k1", 2);
    assert_memory_equal(m->entries[1]->row_key.data, "k3", 2);
    assert_int_equal(m->entries[1]->n_mutations, 1);
    google__bigtable__v2__mutate_rows_request__free_unpacked(m, NULL);

    rtr_entry_result res[5];
    memset(res, 0, sizeof res);
    st_code c_odd[] = {ST_OK, ST_NOT_FOUND}, c_even[] = {ST_INVALID_ARGUMENT, ST_OK, ST_OK};
    len = pack_answer(c_odd, 2, buf);
    assert_int_equal(rtr_mutate_rows_merge(st_slice_make(buf, len), odd, 2, res, &a), ST_OK);
    len = pack_answer(c_even, 3, buf);
    assert_int_equal(rtr_mutate_rows_merge(st_slice_make(buf, len), even, 3, res, &a), ST_OK);
    st_code want[] = {ST_INVALID_ARGUMENT, ST_OK, ST_OK, ST_NOT_FOUND, ST_OK};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(res[i].code, want[i]);
        assert_true(res[i].final);
    }
    assert_string_equal(res[3].message, "bad");
    /* An index outside the sub-request is the node's bug, reported as INTERNAL. */
    len = pack_answer(c_even, 3, buf);
    assert_int_equal(rtr_mutate_rows_merge(st_slice_make(buf, len), odd, 2, res, &a), ST_INTERNAL);
    st_buf_free(&sub);
    st_buf_free(&head);
    st_arena_deinit(&a);
}

/* ReadRowsResponse bytes: rows[i] committed (or left open when open_last and i is last). */
static size_t pack_rows(const char *const *rows, size_t n, bool open_last, const char *scanned,
                        uint8_t *buf) {
    Google__Bigtable__V2__ReadRowsResponse r;
    google__bigtable__v2__read_rows_response__init(&r);
    Google__Bigtable__V2__ReadRowsResponse__CellChunk ch[8], *pc[8];
    Google__Protobuf__StringValue fam;
    Google__Protobuf__BytesValue q;
    google__protobuf__string_value__init(&fam);
    google__protobuf__bytes_value__init(&q);
    fam.value = "f";
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__read_rows_response__cell_chunk__init(&ch[i]);
        ch[i].row_key = rtu_bin(rows[i]);
        ch[i].family_name = &fam;
        ch[i].qualifier = &q;
        ch[i].value = rtu_bin("v");
        if (!(open_last && i == n - 1)) {
            ch[i].row_status_case =
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
            ch[i].commit_row = true;
        }
        pc[i] = &ch[i];
    }
    r.chunks = pc;
    r.n_chunks = n;
    if (scanned)
        r.last_scanned_row_key = rtu_bin(scanned);
    return google__bigtable__v2__read_rows_response__pack(&r, buf);
}

static void test_wire_rr_track_counts_rows_and_follows_last_key(void **state) {
    (void)state;
    uint8_t buf[1024];
    rtr_rr_track t;
    rtr_rr_track_init(&t);
    const char *rows1[] = {"a", "b"};
    size_t len = pack_rows(rows1, 2, false, NULL, buf);
    assert_int_equal(rtr_rr_track_feed(&t, st_slice_make(buf, len), false), ST_OK);
    assert_int_equal(t.committed, 2);
    assert_true(t.has_last);
    assert_true(st_slice_eq(st_buf_slice(&t.last), S("b")));
    assert_false(t.row_open);
    /* last_scanned_row_key moves the resume point further */
    len = pack_rows(rows1, 0, false, "d", buf);
    assert_int_equal(rtr_rr_track_feed(&t, st_slice_make(buf, len), false), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&t.last), S("d")));
    const char *rows2[] = {"e", "f"};
    len = pack_rows(rows2, 2, true, NULL, buf);
    assert_int_equal(rtr_rr_track_feed(&t, st_slice_make(buf, len), false), ST_OK);
    assert_int_equal(t.committed, 3);
    assert_true(t.row_open);
    assert_true(st_slice_eq(st_buf_slice(&t.last), S("e")));
    /* Row f ends in the next message: a chunk without a key commits it, then g follows. */
    static const uint8_t commit_f_then_g[] = {0x0a, 0x02, 0x48, 0x01, /* commit */
                                              0x0a, 0x05, 0x0a, 0x01, 'g', 0x48, 0x01};
    assert_int_equal(
        rtr_rr_track_feed(&t, st_slice_make(commit_f_then_g, sizeof commit_f_then_g), false),
        ST_OK);
    assert_int_equal(t.committed, 5);
    assert_false(t.row_open);
    assert_true(st_slice_eq(st_buf_slice(&t.last), S("g")));
    rtr_rr_track_deinit(&t);

    /* Reversed: the resume point is the smallest key. */
    rtr_rr_track_init(&t);
    const char *rows3[] = {"z", "m"};
    len = pack_rows(rows3, 2, false, "x", buf); /* a stale scanned key (above m) is ignored */
    assert_int_equal(rtr_rr_track_feed(&t, st_slice_make(buf, len), true), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&t.last), S("m")));
    uint8_t junk[] = {0x0a, 0x05, 0x0a, 0x09};
    assert_int_equal(rtr_rr_track_feed(&t, st_slice_make(junk, sizeof junk), true), ST_INTERNAL);
    rtr_rr_track_deinit(&t);
}

static void test_wire_samples_merge_across_nodes(void **state) {
    (void)state;
    /* Tablets: node 0 holds [, g) and [p, ); node 1 holds [g, p). Node 0 reports its own
     * samples: c@10, end of [,g) at g@20, end key "" with total 50 (so [p,) holds 30, with an
     * inner sample t@35). Node 1: j@5, "" total 12 (its last tablet ends at p). */
    rtr_sample n0[] = {{S("c"), 10}, {S("g"), 20}, {S("t"), 35}, {S(""), 50}};
    rtr_sample n1[] = {{S("j"), 5}, {S(""), 12}};
    rtr_sample *per[] = {n0, n1};
    size_t counts[] = {4, 2};
    st_slice ends[] = {S(""), S("p")};
    st_arena a;
    st_arena_init(&a, 1024);
    rtr_sample *out;
    size_t n;
    assert_int_equal(rtr_samples_merge(per, counts, ends, 2, &a, &out, &n), ST_OK);
    const char *keys[] = {"c", "g", "j", "p", "t", ""};
    int64_t offs[] = {10, 20, 25, 32, 47, 62};
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++) {
        assert_true(st_slice_eq(out[i].key, st_slice_cstr(keys[i])));
        assert_int_equal(out[i].offset, offs[i]);
    }
    /* No samples at all: just the end of the table. */
    assert_int_equal(rtr_samples_merge(per, (size_t[]){0, 0}, ends, 2, &a, &out, &n), ST_OK);
    assert_int_equal(n, 1);
    assert_int_equal(out[0].key.len, 0);
    assert_int_equal(out[0].offset, 0);
    st_arena_deinit(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_copy_except_keeps_other_fields),
        cmocka_unit_test(test_wire_mutate_rows_group_and_merge_in_caller_order),
        cmocka_unit_test(test_wire_mutate_rows_split_names_invalid_entries),
        cmocka_unit_test(test_wire_rr_track_counts_rows_and_follows_last_key),
        cmocka_unit_test(test_wire_samples_merge_across_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
