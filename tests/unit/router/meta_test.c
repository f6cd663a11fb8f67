/*
 * Proves the metadata records the router keeps in the instance: the cache inserts in order,
 * replaces, finds and deletes tables and app profiles separately; row keys encode and parse
 * back ("table/<name>", "profile/<id>"), and keys that are not records are ignored; and a
 * metadata ReadRows answer — whole rows, one cell each, a value split over chunks, a second older
 * version — fills the cache with the latest value of each record; and merging a second
 * cluster's copy takes only its newer versions of records the first copy holds; and records
 * are refused past their kind's size bound with a message naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router_internal.h"

#define S(lit) ST_SLICE_LIT(lit)

static void test_meta_records_put_find_del(void **state) {
    (void)state;
    rtr_meta m = {0};
    assert_int_equal(
        rtr_meta_put(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/b", S("B")), ST_OK);
    assert_int_equal(
        rtr_meta_put(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/a", S("A")), ST_OK);
    assert_int_equal(rtr_meta_put(&m, RTR_META_KIND_PROFILE, "default", S("P")), ST_OK);
    assert_int_equal(m.n_tables, 2);
    assert_string_equal(m.tables[0].name, "projects/p/instances/i/tables/a");
    assert_int_equal(
        rtr_meta_put(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/a", S("A2")), ST_OK);
    const rtr_meta_rec *r =
        rtr_meta_find(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/a");
    assert_non_null(r);
    assert_int_equal(r->len, 2);
    assert_memory_equal(r->pb, "A2", 2);
    assert_null(rtr_meta_find(&m, RTR_META_KIND_TABLE, "default"));
    assert_non_null(rtr_meta_find(&m, RTR_META_KIND_PROFILE, "default"));
    rtr_meta_del(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/a");
    rtr_meta_del(&m, RTR_META_KIND_TABLE, "absent");
    assert_int_equal(m.n_tables, 1);
    assert_null(rtr_meta_find(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/a"));
    rtr_meta_free(&m);
    assert_int_equal(m.n_tables + m.n_profiles, 0);
}

static void test_meta_row_keys_round_trip(void **state) {
    (void)state;
    st_buf k;
    st_buf_init(&k);
    char name[RTR_TABLE_NAME_MAX + 1];
    rtr_meta_kind kind;
    assert_int_equal(rtr_meta_row_key(RTR_META_KIND_TABLE, "projects/p/instances/i/tables/t", &k),
                     ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&k), S("table/projects/p/instances/i/tables/t")));
    assert_true(rtr_meta_parse_row_key(st_buf_slice(&k), &kind, name, sizeof name));
    assert_int_equal(kind, RTR_META_KIND_TABLE);
    assert_string_equal(name, "projects/p/instances/i/tables/t");
    assert_int_equal(rtr_meta_row_key(RTR_META_KIND_PROFILE, "batch", &k), ST_OK);
    assert_true(rtr_meta_parse_row_key(st_buf_slice(&k), &kind, name, sizeof name));
    assert_int_equal(kind, RTR_META_KIND_PROFILE);
    assert_string_equal(name, "batch");
    assert_true(rtr_meta_parse_row_key(S("backup/x"), &kind, name, sizeof name));
    assert_int_equal(kind, RTR_META_KIND_BACKUP);
    assert_int_equal(rtr_meta_row_key(RTR_META_KIND_OP, "operations/a/1", &k), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&k), S("op/operations/a/1")));
    assert_true(rtr_meta_parse_row_key(st_buf_slice(&k), &kind, name, sizeof name));
    assert_int_equal(kind, RTR_META_KIND_OP);
    assert_false(rtr_meta_parse_row_key(S("later/x"), &kind, name, sizeof name));
    assert_false(rtr_meta_parse_row_key(S("table/"), &kind, name, sizeof name));
    assert_false(rtr_meta_parse_row_key(S("table/a\0b"), &kind, name, sizeof name));
    st_buf_free(&k);
}

static ProtobufCBinaryData bin(const char *s) {
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
}

static void test_meta_feed_takes_latest_cell_of_each_row(void **state) {
    (void)state;
    Google__Protobuf__StringValue fam;
    Google__Protobuf__BytesValue q;
    google__protobuf__string_value__init(&fam);
    google__protobuf__bytes_value__init(&q);
    fam.value = RTR_META_FAMILY;
    q.value = bin(RTR_META_QUALIFIER);
    Google__Bigtable__V2__ReadRowsResponse__CellChunk c[6], *pc[6];
    for (int i = 0; i < 6; i++) {
        google__bigtable__v2__read_rows_response__cell_chunk__init(&c[i]);
        pc[i] = &c[i];
    }
    /* row 1: value "schema-1" split over two chunks, then an older version "old" */
    c[0].row_key = bin("table/projects/p/instances/i/tables/t1");
    c[0].family_name = &fam;
    c[0].qualifier = &q;
    c[0].timestamp_micros = 2000;
    c[0].value = bin("schema");
    c[0].value_size = 8;
    c[1].value = bin("-1");
    c[2].timestamp_micros = 1000;
    c[2].value = bin("old");
    c[2].row_status_case =
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    c[2].commit_row = true;
    /* row 2: a profile */
    c[3].row_key = bin("profile/default");
    c[3].family_name = &fam;
    c[3].qualifier = &q;
    c[3].value = bin("prof");
    c[3].row_status_case =
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    c[3].commit_row = true;
    /* row 3: not a record: ignored */
    c[4].row_key = bin("zzz/other");
    c[4].family_name = &fam;
    c[4].qualifier = &q;
    c[4].value = bin("x");
    c[4].row_status_case =
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    c[4].commit_row = true;
    Google__Bigtable__V2__ReadRowsResponse r;
    google__bigtable__v2__read_rows_response__init(&r);
    r.chunks = pc;
    r.n_chunks = 5;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__read_rows_response__pack(&r, buf);
    rtr_meta m = {0};
    assert_int_equal(rtr_meta_feed(&m, st_slice_make(buf, len)), ST_OK);
    assert_int_equal(m.n_tables, 1);
    assert_int_equal(m.n_profiles, 1);
    const rtr_meta_rec *t =
        rtr_meta_find(&m, RTR_META_KIND_TABLE, "projects/p/instances/i/tables/t1");
    assert_non_null(t);
    assert_int_equal(t->len, 8);
    assert_memory_equal(t->pb, "schema-1", 8);
    assert_int_equal(t->ts_us, 2000); /* the latest cell's timestamp, for merges */
    assert_int_equal(rtr_meta_find(&m, RTR_META_KIND_PROFILE, "default")->len, 4);
    uint8_t junk[] = {0x0a, 0x7f};
    assert_int_equal(rtr_meta_feed(&m, st_slice_make(junk, sizeof junk)), ST_INTERNAL);
    rtr_meta_free(&m);
}

/* Puts a record as a load would have read it: with its cell timestamp. */
static void put_at(rtr_meta *m, const char *name, const char *v, int64_t ts) {
    assert_int_equal(rtr_meta_put(m, RTR_META_KIND_PROFILE, name, st_slice_cstr(v)), ST_OK);
    ((rtr_meta_rec *)rtr_meta_find(m, RTR_META_KIND_PROFILE, name))->ts_us = ts;
}

static void test_meta_merge_takes_newer_versions_only(void **state) {
    (void)state;
    rtr_meta first = {0}, other = {0};
    put_at(&first, "moved", "east", 10); /* stale: the failover wrote 20 while it was down */
    put_at(&first, "same", "a", 30);     /* newer than the other copy's */
    put_at(&first, "kept", "k", 5);      /* the other copy lacks it */
    put_at(&other, "moved", "west", 20);
    put_at(&other, "same", "old", 25);
    put_at(&other, "gone", "g", 40); /* the first copy lacks it: maybe deleted, not added */
    assert_int_equal(rtr_meta_merge_newer(&first, &other), ST_OK);
    const rtr_meta_rec *r = rtr_meta_find(&first, RTR_META_KIND_PROFILE, "moved");
    assert_int_equal(r->len, 4);
    assert_memory_equal(r->pb, "west", 4);
    assert_int_equal(r->ts_us, 20);
    r = rtr_meta_find(&first, RTR_META_KIND_PROFILE, "same");
    assert_memory_equal(r->pb, "a", 1);
    assert_non_null(rtr_meta_find(&first, RTR_META_KIND_PROFILE, "kept"));
    assert_null(rtr_meta_find(&first, RTR_META_KIND_PROFILE, "gone"));
    assert_int_equal(first.n_profiles, 3);
    rtr_meta_free(&first);
    rtr_meta_free(&other);
}

static void test_meta_record_check_bounds_each_kind(void **state) {
    (void)state;
    st_err err = {0};
    assert_int_equal(rtr_meta_record_check(RTR_META_KIND_IAM, "t", RTR_META_RECORD_BYTES_MAX, &err),
                     ST_OK);
    assert_int_equal(
        rtr_meta_record_check(RTR_META_KIND_IAM, "t", RTR_META_RECORD_BYTES_MAX + 1, &err),
        ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "more than the 1048576 a record may take"));
    assert_non_null(strstr(err.msg, "fewer principals"));
    /* A backup's record lists its pieces: a larger bound. */
    assert_int_equal(
        rtr_meta_record_check(RTR_META_KIND_BACKUP, "b", RTR_META_RECORD_BYTES_MAX + 1, &err),
        ST_OK);
    assert_int_equal(rtr_meta_record_check(RTR_META_KIND_BACKUP, "b",
                                           RTR_META_BACKUP_RECORD_BYTES_MAX + 1, &err),
                     ST_INVALID_ARGUMENT);
    for (int k = 0; k < RTR_META_KINDS; k++)
        assert_int_equal(rtr_meta_record_check((rtr_meta_kind)k, "x",
                                               RTR_META_BACKUP_RECORD_BYTES_MAX + 1, &err),
                         ST_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_records_put_find_del),
        cmocka_unit_test(test_meta_row_keys_round_trip),
        cmocka_unit_test(test_meta_feed_takes_latest_cell_of_each_row),
        cmocka_unit_test(test_meta_merge_takes_newer_versions_only),
        cmocka_unit_test(test_meta_record_check_bounds_each_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
