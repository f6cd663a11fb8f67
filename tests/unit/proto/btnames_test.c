/*
 * Proves the name checks the node and the router share (proto/bt): btu_pb_check refuses a NUL byte
 * in any string field of a serialized request, nested ones included, naming the field, while NULs
 * in bytes fields (row keys, values) are fine; btu_table_name_parse accepts exactly
 * projects/P/instances/I/tables/T with Bigtable's table id rule.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/btutil.h"

static void put_len(st_buf *b, uint32_t field, const void *d, size_t n) {
    assert_int_equal(st_buf_append_byte(b, (uint8_t)(field << 3 | 2)), ST_OK);
    assert_int_equal(st_buf_append_byte(b, (uint8_t)n), ST_OK); /* n < 128 here */
    assert_int_equal(st_buf_append(b, d, n), ST_OK);
}

static void test_btnames_nul_in_table_name(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    put_len(&b, 1, "t\0x", 3);
    st_err err = {0};
    assert_int_equal(btu_pb_check(&google__bigtable__v2__mutate_row_request__descriptor,
                                  st_buf_slice(&b), 0, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "field table_name of google.bigtable.v2.MutateRowRequest"));
    assert_non_null(strstr(err.msg, "NUL"));
    st_buf_free(&b);
}

static void test_btnames_nul_in_nested_family(void **state) {
    (void)state;
    st_buf set, mut, req;
    st_buf_init(&set);
    st_buf_init(&mut);
    st_buf_init(&req);
    put_len(&set, 1, "cf\0", 3); /* family_name: string */
    put_len(&set, 2, "q\0q", 3); /* column_qualifier: bytes, NUL allowed */
    put_len(&mut, 1, set.data, set.len);
    put_len(&req, 1, "t", 1);
    put_len(&req, 2, "r\0w", 3); /* row_key: bytes */
    put_len(&req, 3, mut.data, mut.len);
    st_err err = {0};
    assert_int_equal(btu_pb_check(&google__bigtable__v2__mutate_row_request__descriptor,
                                  st_buf_slice(&req), 0, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "field family_name of google.bigtable.v2.Mutation.SetCell"));
    /* The same without the NUL in the family: nothing to report. */
    st_buf_reset(&set);
    st_buf_reset(&mut);
    st_buf_reset(&req);
    put_len(&set, 1, "cf", 2);
    put_len(&set, 2, "q\0q", 3);
    put_len(&mut, 1, set.data, set.len);
    put_len(&req, 2, "r\0w", 3);
    put_len(&req, 3, mut.data, mut.len);
    assert_int_equal(btu_pb_check(&google__bigtable__v2__mutate_row_request__descriptor,
                                  st_buf_slice(&req), 0, &err),
                     ST_OK);
    st_buf_free(&set);
    st_buf_free(&mut);
    st_buf_free(&req);
}

static void test_btnames_table_name_parse(void **state) {
    (void)state;
    st_slice p, i, t;
    assert_int_equal(
        btu_table_name_parse("projects/p/instances/i/tables/_t-1.x", 512, &p, &i, &t, NULL), ST_OK);
    assert_true(st_slice_eq(p, st_slice_cstr("p")) && st_slice_eq(i, st_slice_cstr("i")) &&
                st_slice_eq(t, st_slice_cstr("_t-1.x")));
    const char *bad[] = {"projects/p/instances/i/tables/-t",
                         "projects/p/instances/i/tables/.t",
                         "projects/p/instances/i/tables/t!",
                         "projects/p/instances/i/tables/",
                         "projects/p/instances/i/tables/a/b",
                         "projects//instances/i/tables/t",
                         "project/p/instances/i/tables/t",
                         "projects/p/instances/i/tables/"
                         "012345678901234567890123456789012345678901234567890"};
    st_err err;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        assert_int_equal(btu_table_name_parse(bad[k], 512, NULL, NULL, NULL, &err),
                         ST_INVALID_ARGUMENT);
    assert_int_equal(
        btu_table_name_parse("projects/p/instances/i/tables/t", 10, NULL, NULL, NULL, &err),
        ST_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_btnames_nul_in_table_name),
        cmocka_unit_test(test_btnames_nul_in_nested_family),
        cmocka_unit_test(test_btnames_table_name_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
