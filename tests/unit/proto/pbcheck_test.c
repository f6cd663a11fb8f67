/* pbcheck_test.c — btu_pb_check, the scan that bounds protobuf nesting before protobuf-c unpacks
 * (proto/bt/pbcheck.c). Proves that nesting exactly at the limit passes and one level more is
 * refused, for RowFilters and GC rules alone and inside the requests that carry them; that
 * 100,000 levels are refused without recursion; that every kind of malformed input it refuses is
 * refused by protobuf-c too (so it never turns away a message protobuf-c would take); that unknown
 * fields are skipped whatever they hold; and that packed repeated fields are checked the way
 * protobuf-c reads them (through a descriptor written here, since our .proto files have none);
 * that what unpacking would allocate is bounded (millions of empty elements are refused, the
 * API's largest requests of small cells are not); and that btu_pb_unpack_lift leaves a bytes field
 * in place and checks the rest the same way; that requests' strings must be UTF-8; and that a
 * request's singular message field (a oneof member included) must come in one piece, in every
 * message the services take. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "pbnest.h"
#include "strata/btutil.h"

#define ROW_FILTER (&google__bigtable__v2__row_filter__descriptor)
#define GC_RULE (&google__bigtable__admin__v2__gc_rule__descriptor)
#define READ_ROWS (&google__bigtable__v2__read_rows_request__descriptor)

/* Checks bytes against desc; on ST_OK also unpacks them with protobuf-c (safe: bounded depth). */
static st_code check(const ProtobufCMessageDescriptor *desc, const st_buf *b, unsigned max,
                     st_err *err) {
    st_err_clear(err);
    st_code rc = btu_pb_check(desc, st_slice_make(b->data, b->len), max, err);
    if (rc == ST_OK) {
        ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, b->len, b->data);
        assert_non_null(m);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return rc;
}

static void assert_too_deep(st_code rc, const st_err *err, unsigned max) {
    char want[64];
    snprintf(want, sizeof want, "message nesting exceeds %u levels", max);
    assert_int_equal(rc, ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err->msg, want));
}

/* levels nested messages alternating RowFilter.chain and Chain.filters (both field 1). */
static void chain_levels(st_buf *b, size_t levels) {
    bt_nest_step step = {1, st_slice_make(NULL, 0)};
    st_buf_reset(b);
    bt_nest(b, &step, 1, levels - 1, st_slice_make(NULL, 0));
}

static void test_pbcheck_depth_at_and_over_the_limit(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    st_err err;
    chain_levels(&b, BTU_PB_DEPTH_MAX);
    assert_int_equal(check(ROW_FILTER, &b, BTU_PB_DEPTH_MAX, &err), ST_OK);
    chain_levels(&b, BTU_PB_DEPTH_MAX + 1);
    assert_too_deep(check(ROW_FILTER, &b, BTU_PB_DEPTH_MAX, &err), &err, BTU_PB_DEPTH_MAX);
    /* 0 and anything above BTU_PB_DEPTH_MAX mean BTU_PB_DEPTH_MAX. */
    assert_too_deep(check(ROW_FILTER, &b, 0, &err), &err, BTU_PB_DEPTH_MAX);
    assert_too_deep(check(ROW_FILTER, &b, 1000, &err), &err, BTU_PB_DEPTH_MAX);
    /* A smaller limit. */
    chain_levels(&b, 3);
    assert_int_equal(check(ROW_FILTER, &b, 3, &err), ST_OK);
    chain_levels(&b, 4);
    assert_too_deep(check(ROW_FILTER, &b, 3, &err), &err, 3);
    st_buf_free(&b);
}

/* A ReadRowsRequest whose filter (field 3) is a rule of `kind` nested `depth` deep. */
static void read_rows_with(st_buf *b, bt_nest_kind kind, size_t depth) {
    st_buf f;
    st_buf_init(&f);
    bt_nest_rule(&f, kind, depth);
    st_buf_reset(b);
    bt_pb_put_bytes(b, 1, st_slice_make((const uint8_t *)"projects/p/instances/i/tables/t", 31));
    bt_pb_put_bytes(b, 3, st_slice_make(f.data, f.len));
    st_buf_free(&f);
}

static void test_pbcheck_filters_in_requests(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    st_err err;
    /* A filter nested the 20 levels Bigtable allows is far from the limit; in a ReadRowsRequest
     * a filter of depth d nests 2d + 2 messages, so 31 is the deepest that passes the scan (the
     * filter check after unpacking refuses it with its own message). */
    bt_nest_kind kinds[] = {BT_NEST_CHAIN, BT_NEST_INTERLEAVE, BT_NEST_CONDITION};
    for (size_t k = 0; k < 3; k++) {
        read_rows_with(&b, kinds[k], 20);
        assert_int_equal(check(READ_ROWS, &b, 0, &err), ST_OK);
        read_rows_with(&b, kinds[k], 31);
        assert_int_equal(check(READ_ROWS, &b, 0, &err), ST_OK);
        read_rows_with(&b, kinds[k], 32);
        assert_too_deep(check(READ_ROWS, &b, 0, &err), &err, BTU_PB_DEPTH_MAX);
        assert_non_null(strstr(err.msg, "google.bigtable.v2.ReadRowsRequest"));
    }
    st_buf_free(&b);
}

/* ModifyColumnFamiliesRequest{modifications: [{id: "cf", create: {gc_rule: rule}}]}. */
static void modify_with(st_buf *b, bt_nest_kind kind, size_t depth) {
    st_buf rule;
    st_buf_init(&rule);
    bt_nest_rule(&rule, kind, depth);
    st_buf_reset(b);
    bt_pb_put_family(b, 2, "cf", st_slice_make(rule.data, rule.len));
    st_buf_free(&rule);
}

static void test_pbcheck_gc_rules(void **state) {
    (void)state;
    const ProtobufCMessageDescriptor *modify =
        &google__bigtable__admin__v2__modify_column_families_request__descriptor;
    st_buf b;
    st_buf_init(&b);
    st_err err;
    bt_nest_kind kinds[] = {BT_NEST_UNION, BT_NEST_INTERSECTION};
    for (size_t k = 0; k < 2; k++) {
        /* A rule of depth d nests 2d + 1 messages. */
        st_buf_reset(&b);
        bt_nest_rule(&b, kinds[k], (BTU_PB_DEPTH_MAX - 1) / 2);
        assert_int_equal(check(GC_RULE, &b, 0, &err), ST_OK);
        st_buf_reset(&b);
        bt_nest_rule(&b, kinds[k], BTU_PB_DEPTH_MAX / 2);
        assert_too_deep(check(GC_RULE, &b, 0, &err), &err, BTU_PB_DEPTH_MAX);
        /* Inside a request: request, modification, family, then the rule. */
        modify_with(&b, kinds[k], 16);
        assert_int_equal(check(modify, &b, 0, &err), ST_OK);
        modify_with(&b, kinds[k], 5000);
        assert_too_deep(check(modify, &b, 0, &err), &err, BTU_PB_DEPTH_MAX);
    }
    st_buf_free(&b);
}

static void test_pbcheck_very_deep_input_refused_without_recursion(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    st_err err;
    read_rows_with(&b, BT_NEST_CHAIN, 100000); /* about 1.2 MB */
    assert_too_deep(btu_pb_check(READ_ROWS, st_slice_make(b.data, b.len), 0, &err), &err,
                    BTU_PB_DEPTH_MAX);
    assert_null(btu_pb_unpack(READ_ROWS, NULL, st_slice_make(b.data, b.len), &err));
    assert_int_equal(err.code, ST_INVALID_ARGUMENT);
    st_buf_free(&b);
}

/* Each input is refused as malformed, and protobuf-c refuses it too. */
static void test_pbcheck_malformed_refused_like_protobuf_c(void **state) {
    (void)state;
    static const struct {
        const char *what;
        uint8_t bytes[16];
        size_t len;
    } cases[] = {
        {"one-byte tag of field 0", {0x00, 0x00}, 2},
        {"one-byte tag of field 0, wire type 2", {0x02, 0x00}, 2},
        {"tag over 5 bytes", {0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 6},
        {"truncated tag", {0x80}, 1},
        {"truncated varint", {0x50, 0x80}, 2},
        {"varint over 10 bytes",
         {0x50, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
         12},
        {"truncated 64-bit value", {0x71, 1, 2, 3}, 4},
        {"truncated 32-bit value", {0x75, 1, 2}, 3},
        {"length past the end", {0x0a, 0x05, 0x00}, 3},
        {"length over 2^31", {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, 6},
        {"length prefix over 5 bytes", {0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 7},
        /* The inner Chain.filters claims 5 bytes: there are 5 bytes left in the buffer, but
         * none left in the enclosing chain (2 bytes long). */
        {"submessage past its parent's end",
         {0x0a, 0x02, 0x0a, 0x05, 0x12, 0x03, 0x88, 0x01, 0x01},
         9},
        {"start group", {0x0b, 0x0c}, 2},
        {"end group", {0x0c}, 1},
        {"wire type 6", {0x0e, 0x00}, 2},
        {"wire type 7", {0x0f, 0x00}, 2},
        {"bad tag deep inside", {0x0a, 0x04, 0x0a, 0x02, 0x00, 0x00}, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        st_err err;
        print_message("case: %s\n", cases[i].what);
        st_slice s = st_slice_make(cases[i].bytes, cases[i].len);
        assert_int_equal(btu_pb_check(ROW_FILTER, s, 0, &err), ST_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "malformed google.bigtable.v2.RowFilter"));
        assert_null(protobuf_c_message_unpack(ROW_FILTER, NULL, s.len, s.data));
    }
}

static void test_pbcheck_unknown_fields_skipped(void **state) {
    (void)state;
    st_buf deep, b;
    st_buf_init(&deep);
    st_buf_init(&b);
    st_err err;
    chain_levels(&deep, 10000);
    /* Unknown fields of every wire type, one holding 10,000 levels of chain bytes: protobuf-c
     * keeps them as bytes and never parses them, so neither do we. Field numbers past 2^29 are
     * unknown fields to protobuf-c too. */
    bt_pb_put_bytes(&b, 99, st_slice_make(deep.data, deep.len));
    bt_pb_put_varint(&b, 100, 12345);
    /* fixed64 field 2^32 - 1, fixed32 field 31 */
    static const uint8_t odd[] = {0xf9, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5,
                                  6,    7,    8,    0xfd, 0x01, 1, 2, 3, 4};
    assert_int_equal(st_buf_append(&b, odd, sizeof odd), ST_OK);
    bt_pb_put_varint(&b, 17, 1); /* pass_all_filter */
    assert_int_equal(check(ROW_FILTER, &b, 0, &err), ST_OK);
    /* Field number 0 in a two-byte tag: protobuf-c takes it as an unknown field, then packs it
     * into a one-byte tag that it refuses itself. The spec forbids it: refused. */
    static const uint8_t field0[] = {0x80, 0x00, 0x07};
    assert_int_equal(btu_pb_check(ROW_FILTER, st_slice_make(field0, sizeof field0), 0, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "field number 0"));
    /* The same deep bytes as a known message field are refused. */
    st_buf_reset(&b);
    bt_pb_put_bytes(&b, 1, st_slice_make(deep.data, deep.len));
    assert_too_deep(check(ROW_FILTER, &b, 0, &err), &err, BTU_PB_DEPTH_MAX);
    st_buf_free(&deep);
    st_buf_free(&b);
}

/* A message with packed-capable repeated fields and a message field of its own type, described
 * by hand as protoc-c would: fields sorted by number, one range 1..5. */
typedef struct t_msg {
    ProtobufCMessage base;
    size_t n_ints;
    int32_t *ints;
    size_t n_fixed;
    uint32_t *fixed;
    size_t n_dbl;
    double *dbl;
    size_t n_flags;
    protobuf_c_boolean *flags;
    struct t_msg *child;
} t_msg;

static const ProtobufCMessageDescriptor t_desc;
#define T_REPEATED(nm, num, ty, n_member, member)                                                  \
    {                                                                                              \
        .name = nm, .id = num, .label = PROTOBUF_C_LABEL_REPEATED, .type = ty,                     \
        .quantifier_offset = offsetof(t_msg, n_member), .offset = offsetof(t_msg, member),         \
        .flags = PROTOBUF_C_FIELD_FLAG_PACKED                                                      \
    }
static const ProtobufCFieldDescriptor t_fields[] = {
    T_REPEATED("ints", 1, PROTOBUF_C_TYPE_INT32, n_ints, ints),
    T_REPEATED("fixed", 2, PROTOBUF_C_TYPE_FIXED32, n_fixed, fixed),
    T_REPEATED("dbl", 3, PROTOBUF_C_TYPE_DOUBLE, n_dbl, dbl),
    T_REPEATED("flags", 4, PROTOBUF_C_TYPE_BOOL, n_flags, flags),
    {.name = "child",
     .id = 5,
     .label = PROTOBUF_C_LABEL_NONE,
     .type = PROTOBUF_C_TYPE_MESSAGE,
     .offset = offsetof(t_msg, child),
     .descriptor = &t_desc},
};
static const unsigned t_by_name[] = {4, 2, 1, 3, 0};
static const ProtobufCIntRange t_ranges[] = {{1, 0}, {0, 5}};
static const ProtobufCMessageDescriptor t_desc = {
    .magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    .name = "test.Packed",
    .short_name = "Packed",
    .c_name = "TPacked",
    .package_name = "test",
    .sizeof_message = sizeof(t_msg),
    .n_fields = 5,
    .fields = t_fields,
    .fields_sorted_by_name = t_by_name,
    .n_field_ranges = 1,
    .field_ranges = t_ranges,
};

static st_code check_bytes(const uint8_t *p, size_t n, st_err *err) {
    st_err_clear(err);
    st_code rc = btu_pb_check(&t_desc, st_slice_make(p, n), 0, err);
    ProtobufCMessage *m = protobuf_c_message_unpack(&t_desc, NULL, n, p);
    if (rc != ST_OK)
        assert_null(m); /* refused here, refused by protobuf-c */
    else
        assert_non_null(m);
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

static void test_pbcheck_packed_fields(void **state) {
    (void)state;
    st_err err;
    /* Packed ints (1, 300, -1 as 10 bytes), 2 fixed32s, 1 double, 2 bools, then unpacked ints
     * and a child holding packed ints. */
    static const uint8_t ok[] = {0x0a, 0x0d, 0x01, 0xac, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff, 0xff, 0xff, 0xff, 0x01, 0x12, 0x08, 1,    0,    0,
                                 0,    2,    0,    0,    0,    0x1a, 0x08, 0,    0,    0,
                                 0,    0,    0,    0xf0, 0x3f, 0x22, 0x02, 0x01, 0x00, 0x08,
                                 0x07, 0x2a, 0x03, 0x0a, 0x01, 0x05};
    assert_int_equal(check_bytes(ok, sizeof ok, &err), ST_OK);
    static const uint8_t empty_packed[] = {0x0a, 0x00, 0x12, 0x00};
    assert_int_equal(check_bytes(empty_packed, sizeof empty_packed, &err), ST_OK);
    static const uint8_t ragged32[] = {0x12, 0x05, 1, 0, 0, 0, 2};
    assert_int_equal(check_bytes(ragged32, sizeof ragged32, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "packed"));
    static const uint8_t ragged64[] = {0x1a, 0x04, 0, 0, 0, 0};
    assert_int_equal(check_bytes(ragged64, sizeof ragged64, &err), ST_INVALID_ARGUMENT);
    static const uint8_t open_varint[] = {0x0a, 0x02, 0x01, 0x80};
    assert_int_equal(check_bytes(open_varint, sizeof open_varint, &err), ST_INVALID_ARGUMENT);
    static const uint8_t nested_ragged[] = {0x2a, 0x04, 0x12, 0x02, 1, 0};
    assert_int_equal(check_bytes(nested_ragged, sizeof nested_ragged, &err), ST_INVALID_ARGUMENT);
    /* The self-nesting child field: at the limit and past it (ok is two levels itself). */
    st_buf b;
    st_buf_init(&b);
    bt_nest_step step = {5, st_slice_make(NULL, 0)};
    bt_nest(&b, &step, 1, BTU_PB_DEPTH_MAX - 2, st_slice_make(ok, sizeof ok));
    assert_int_equal(check_bytes(b.data, b.len, &err), ST_OK);
    st_buf_reset(&b);
    bt_nest(&b, &step, 1, BTU_PB_DEPTH_MAX - 1, st_slice_make(ok, sizeof ok));
    assert_int_equal(btu_pb_check(&t_desc, st_slice_make(b.data, b.len), 0, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "field child of test.Packed"));
    st_buf_free(&b);
}

static void test_pbcheck_packed_requests_pass(void **state) {
    (void)state;
    /* A request packed by protobuf-c, with a filter and a row set, passes and unpacks. */
    Google__Bigtable__V2__RowFilter leaf = GOOGLE__BIGTABLE__V2__ROW_FILTER__INIT;
    leaf.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    leaf.cells_per_column_limit_filter = 1;
    Google__Bigtable__V2__RowFilter *subs[2] = {&leaf, &leaf};
    Google__Bigtable__V2__RowFilter__Chain chain = GOOGLE__BIGTABLE__V2__ROW_FILTER__CHAIN__INIT;
    chain.n_filters = 2;
    chain.filters = subs;
    Google__Bigtable__V2__RowFilter root = GOOGLE__BIGTABLE__V2__ROW_FILTER__INIT;
    root.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    root.chain = &chain;
    ProtobufCBinaryData keys[2] = {{1, (uint8_t *)"a"}, {1, (uint8_t *)"b"}};
    Google__Bigtable__V2__RowSet rows = GOOGLE__BIGTABLE__V2__ROW_SET__INIT;
    rows.n_row_keys = 2;
    rows.row_keys = keys;
    Google__Bigtable__V2__ReadRowsRequest req = GOOGLE__BIGTABLE__V2__READ_ROWS_REQUEST__INIT;
    req.table_name = "projects/p/instances/i/tables/t";
    req.filter = &root;
    req.rows = &rows;
    req.rows_limit = 7;
    uint8_t buf[256];
    size_t n = google__bigtable__v2__read_rows_request__pack(&req, buf);
    st_err err;
    ProtobufCMessage *m = btu_pb_unpack(READ_ROWS, NULL, st_slice_make(buf, n), &err);
    assert_non_null(m);
    assert_int_equal(((Google__Bigtable__V2__ReadRowsRequest *)m)->rows_limit, 7);
    protobuf_c_message_free_unpacked(m, NULL);
    /* The empty encoding is every field at its default. */
    assert_int_equal(btu_pb_check(READ_ROWS, st_slice_make(NULL, 0), 0, &err), ST_OK);
}

/* btu_pb_unpack_lift: the bytes field is left in the input (its last occurrence), the other
 * fields unpacked and checked as btu_pb_unpack does. */
static size_t pack_mutate(const char *table, const char *key, uint8_t *out) {
    Google__Bigtable__V2__MutateRowRequest r = GOOGLE__BIGTABLE__V2__MUTATE_ROW_REQUEST__INIT;
    Google__Bigtable__V2__Mutation m = GOOGLE__BIGTABLE__V2__MUTATION__INIT;
    Google__Bigtable__V2__Mutation__DeleteFromRow d =
        GOOGLE__BIGTABLE__V2__MUTATION__DELETE_FROM_ROW__INIT;
    Google__Bigtable__V2__Mutation *ms[] = {&m};
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
    m.delete_from_row = &d;
    r.table_name = (char *)table;
    r.app_profile_id = "p";
    r.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    r.mutations = ms;
    r.n_mutations = 1;
    return google__bigtable__v2__mutate_row_request__pack(&r, out);
}

static void test_pb_unpack_lift(void **state) {
    (void)state;
    const ProtobufCMessageDescriptor *desc = &google__bigtable__v2__mutate_row_request__descriptor;
    uint8_t buf[512];
    st_slice lifted;
    st_err err = {0};
    size_t n = pack_mutate("t", "the-key", buf);
    Google__Bigtable__V2__MutateRowRequest *r =
        (void *)btu_pb_unpack_lift(desc, NULL, st_slice_make(buf, n), 2, &lifted, &err);
    assert_non_null(r);
    assert_int_equal(lifted.len, 7);
    assert_memory_equal(lifted.data, "the-key", 7);
    assert_true(lifted.data > buf && lifted.data + lifted.len <= buf + n); /* not copied */
    assert_string_equal(r->table_name, "t");
    assert_string_equal(r->app_profile_id, "p");
    assert_int_equal(r->row_key.len, 0);
    assert_int_equal(r->n_mutations, 1);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* twice: the last occurrence counts, as protobuf-c would take it */
    size_t m = pack_mutate("u", "second", buf + n);
    r = (void *)btu_pb_unpack_lift(desc, NULL, st_slice_make(buf, n + m), 2, &lifted, &err);
    assert_non_null(r);
    assert_int_equal(lifted.len, 6);
    assert_memory_equal(lifted.data, "second", 6);
    assert_string_equal(r->table_name, "u");
    assert_int_equal(r->n_mutations, 2);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* absent: empty, the message as btu_pb_unpack gives it */
    r = (void *)btu_pb_unpack_lift(desc, NULL, st_slice_make(buf, n), 9, &lifted, &err);
    assert_non_null(r);
    assert_int_equal(lifted.len, 0);
    assert_int_equal(r->row_key.len, 7);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* truncated, and a NUL inside a string of the other fields: refused */
    assert_null(btu_pb_unpack_lift(desc, NULL, st_slice_make(buf, n - 1), 2, &lifted, &err));
    assert_int_equal(err.code, ST_INVALID_ARGUMENT);
    n = pack_mutate("t\001x", "k", buf);
    uint8_t *nul = memchr(buf, 1, n);
    assert_non_null(nul);
    *nul = 0;
    st_err_clear(&err);
    assert_null(btu_pb_unpack_lift(desc, NULL, st_slice_make(buf, n), 2, &lifted, &err));
    assert_int_equal(err.code, ST_INVALID_ARGUMENT);
    assert_int_equal(lifted.len, 0);
}

/* btu_pb_unpack_request refuses a string field that is not UTF-8 (RFC 3629: overlong forms,
 * surrogates, code points past U+10FFFF, stray or missing continuation bytes), naming the field,
 * and takes every valid one up to 4 bytes a character; btu_pb_unpack (stored records) takes both.
 */
static void test_pbcheck_request_strings_utf8(void **state) {
    (void)state;
    static const char *const good[] = {"",
                                       "abc",
                                       "caf\xc3\xa9",
                                       "\xe2\x9c\x93",
                                       "\xed\x9f\xbf",
                                       "\xee\x80\x80",
                                       "\xf0\x9d\x84\x9e",
                                       "\xf4\x8f\xbf\xbf"};
    static const char *const bad[] = {"\x80",
                                      "a\xff",
                                      "\xc0\xaf",
                                      "\xc1\xbf",
                                      "\xe0\x80\xaf",
                                      "\xed\xa0\x80",
                                      "\xf0\x80\x80\xaf",
                                      "\xf4\x90\x80\x80",
                                      "\xf5\x80\x80\x80",
                                      "\xe2\x82",
                                      "\xe2\x82x",
                                      "\xc3"};
    const ProtobufCMessageDescriptor *desc =
        &google__bigtable__admin__v2__create_table_request__descriptor;
    for (size_t i = 0; i < sizeof good / sizeof good[0] + sizeof bad / sizeof bad[0]; i++) {
        bool ok = i < sizeof good / sizeof good[0];
        Google__Bigtable__Admin__V2__CreateTableRequest req;
        google__bigtable__admin__v2__create_table_request__init(&req);
        req.parent = "projects/p/instances/i";
        req.table_id = (char *)(ok ? good[i] : bad[i - sizeof good / sizeof good[0]]);
        uint8_t buf[128];
        size_t n = google__bigtable__admin__v2__create_table_request__pack(&req, buf);
        st_err err = {0};
        ProtobufCMessage *m = btu_pb_unpack_request(desc, NULL, st_slice_make(buf, n), &err);
        if (ok != (m != NULL))
            fail_msg("table id %zu: %s", i, err.msg);
        if (!ok) {
            assert_int_equal(err.code, ST_INVALID_ARGUMENT);
            assert_non_null(strstr(err.msg, "field table_id of"));
            assert_non_null(strstr(err.msg, "not valid UTF-8"));
        }
        protobuf_c_message_free_unpacked(m, NULL);
        m = btu_pb_unpack(desc, NULL, st_slice_make(buf, n), &err);
        assert_non_null(m);
        protobuf_c_message_free_unpacked(m, NULL);
    }
}

/* The unpacked-size bound: the API's largest requests of small cells pass (100,000 SetCells in
 * one MutateRow, 100,000 one-cell MutateRows entries), a few million empty entries, empty
 * mutations or unknown fields do not. */
static void test_pbcheck_wide_messages(void **state) {
    (void)state;
    static const ProtobufCMessageDescriptor *rows_desc =
        &google__bigtable__v2__mutate_rows_request__descriptor;
    static const ProtobufCMessageDescriptor *row_desc =
        &google__bigtable__v2__mutate_row_request__descriptor;
    st_buf cell, mut, entry, b;
    st_buf_init(&cell);
    st_buf_init(&mut);
    st_buf_init(&entry);
    st_buf_init(&b);
    bt_pb_put_bytes(&cell, 1, st_slice_cstr("cf"));
    bt_pb_put_bytes(&cell, 2, st_slice_cstr("q"));
    bt_pb_put_varint(&cell, 3, 1000);
    bt_pb_put_bytes(&mut, 1, st_slice_make(cell.data, cell.len)); /* Mutation.set_cell */
    bt_pb_put_bytes(&entry, 1, st_slice_cstr("row-key-0001"));
    bt_pb_put_bytes(&entry, 2, st_slice_make(mut.data, mut.len));
    st_err err;
    bt_pb_put_bytes(&b, 1, st_slice_cstr("projects/p/instances/i/tables/t"));
    for (size_t i = 0; i < 100000; i++)
        bt_pb_put_bytes(&b, 2, st_slice_make(entry.data, entry.len));
    assert_int_equal(check(rows_desc, &b, 0, &err), ST_OK);
    st_buf_reset(&b);
    bt_pb_put_bytes(&b, 1, st_slice_cstr("projects/p/instances/i/tables/t"));
    bt_pb_put_bytes(&b, 2, st_slice_cstr("row"));
    for (size_t i = 0; i < 100000; i++)
        bt_pb_put_bytes(&b, 3, st_slice_make(mut.data, mut.len));
    assert_int_equal(check(row_desc, &b, 0, &err), ST_OK);
    static const struct {
        const ProtobufCMessageDescriptor *const *desc;
        uint8_t elem[2];
    } wide[] = {{&rows_desc, {0x12, 0x00}}, {&row_desc, {0x1a, 0x00}}, {&row_desc, {0x78, 0x00}}};
    for (size_t k = 0; k < sizeof wide / sizeof wide[0]; k++) {
        st_buf_reset(&b);
        for (size_t i = 0; i < 2000000; i++)
            assert_int_equal(st_buf_append(&b, wide[k].elem, 2), ST_OK);
        st_err_clear(&err);
        assert_int_equal(btu_pb_check(*wide[k].desc, st_slice_make(b.data, b.len), 0, &err),
                         ST_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "too many small elements"));
    }
    st_buf_free(&cell);
    st_buf_free(&mut);
    st_buf_free(&entry);
    st_buf_free(&b);
}

/* req unpacked as a request: NULL with INVALID_ARGUMENT naming field `what` when refuse, else
 * taken. Stored records (btu_pb_unpack) are taken either way, as before. */
static void expect_pieces(const ProtobufCMessageDescriptor *desc, const st_buf *req, bool refuse,
                          const char *what) {
    st_err err = {0};
    ProtobufCMessage *m =
        btu_pb_unpack_request(desc, NULL, st_slice_make(req->data, req->len), &err);
    if (refuse != (m == NULL))
        fail_msg("%s: %s", what, m ? "taken" : err.msg);
    if (refuse) {
        assert_int_equal(err.code, ST_INVALID_ARGUMENT);
        if (!strstr(err.msg, what) || !strstr(err.msg, "occurs more than once"))
            fail_msg("%s: %s", what, err.msg);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    m = btu_pb_unpack(desc, NULL, st_slice_make(req->data, req->len), &err);
    protobuf_c_message_free_unpacked(m, NULL);
}

/* A MutateRowRequest of table t, row r, holding the one Mutation mut. */
static void mutate_row_of(st_buf *out, const st_buf *mut) {
    st_buf_reset(out);
    bt_pb_put_bytes(out, 1, st_slice_cstr("projects/p/instances/i/tables/t"));
    bt_pb_put_bytes(out, 2, st_slice_cstr("r"));
    bt_pb_put_bytes(out, 3, st_slice_make(mut->data, mut->len));
}

/* A SetCell split over two occurrences of Mutation.set_cell (protobuf-c kept the last piece only:
 * a cell without the first piece's qualifier and value was stored and acknowledged), a
 * CreateTableRequest.table in two pieces, and a RowFilter.Condition.predicate_filter repeated
 * deep in a filter are refused; repeated fields, a scalar given twice (the last wins) and two
 * different members of one oneof (the last wins) are taken as protobuf-c takes them. */
static void test_pbcheck_request_message_fields_once(void **state) {
    (void)state;
    st_buf a, b, mut, req;
    st_buf_init(&a);
    st_buf_init(&b);
    st_buf_init(&mut);
    st_buf_init(&req);
    const ProtobufCMessageDescriptor *mr = &google__bigtable__v2__mutate_row_request__descriptor;
    bt_pb_put_bytes(&a, 2, st_slice_cstr("qq")); /* SetCell: qualifier and value */
    bt_pb_put_bytes(&a, 4, st_slice_cstr("val"));
    bt_pb_put_bytes(&b, 1, st_slice_cstr("cf")); /* family and timestamp */
    bt_pb_put_varint(&b, 3, 5000);
    bt_pb_put_bytes(&mut, 1, st_slice_make(a.data, a.len));
    bt_pb_put_bytes(&mut, 1, st_slice_make(b.data, b.len));
    mutate_row_of(&req, &mut);
    expect_pieces(mr, &req, true, "message field set_cell of google.bigtable.v2.Mutation");
    st_buf_reset(&mut); /* set_cell, then delete_from_row: the oneof takes the last */
    bt_pb_put_bytes(&mut, 1, st_slice_make(b.data, b.len));
    bt_pb_put_bytes(&mut, 4, st_slice_make(NULL, 0));
    mutate_row_of(&req, &mut);
    bt_pb_put_bytes(&req, 3, st_slice_make(mut.data, mut.len)); /* repeated mutations */
    bt_pb_put_bytes(&req, 2, st_slice_cstr("r2"));              /* a scalar again */
    expect_pieces(mr, &req, false, "mutations");
    /* CreateTableRequest.table (3) as {granularity 4} then {deletion_protection 9}. */
    st_buf_reset(&req);
    bt_pb_put_bytes(&req, 1, st_slice_cstr("projects/p/instances/i"));
    bt_pb_put_bytes(&req, 2, st_slice_cstr("t"));
    st_buf_reset(&a);
    bt_pb_put_varint(&a, 4, 1);
    bt_pb_put_bytes(&req, 3, st_slice_make(a.data, a.len));
    st_buf_reset(&a);
    bt_pb_put_varint(&a, 9, 1);
    bt_pb_put_bytes(&req, 3, st_slice_make(a.data, a.len));
    expect_pieces(&google__bigtable__admin__v2__create_table_request__descriptor, &req, true,
                  "message field table of google.bigtable.admin.v2.CreateTableRequest");
    /* ReadRowsRequest.filter = chain{filters: [condition{predicate, predicate}]}. */
    st_buf_reset(&a);
    bt_pb_put_bytes(&a, 1, st_slice_make(NULL, 0)); /* Condition.predicate_filter */
    bt_pb_put_bytes(&a, 1, st_slice_make(NULL, 0));
    st_buf_reset(&b);
    bt_pb_put_bytes(&b, 3, st_slice_make(a.data, a.len)); /* RowFilter.condition */
    st_buf_reset(&a);
    bt_pb_put_bytes(&a, 1, st_slice_make(b.data, b.len)); /* Chain.filters */
    st_buf_reset(&b);
    bt_pb_put_bytes(&b, 1, st_slice_make(a.data, a.len)); /* RowFilter.chain */
    st_buf_reset(&req);
    bt_pb_put_bytes(&req, 1, st_slice_cstr("projects/p/instances/i/tables/t"));
    bt_pb_put_bytes(&req, 3, st_slice_make(b.data, b.len));
    expect_pieces(READ_ROWS, &req, true,
                  "message field predicate_filter of google.bigtable.v2.RowFilter.Condition");
    st_buf_free(&a);
    st_buf_free(&b);
    st_buf_free(&mut);
    st_buf_free(&req);
}

/* Every message a service takes, and every message inside one, declares at most
 * BTU_PB_FIELDS_MAX fields: the scan's bit per field then covers every singular message field. */
static void test_pbcheck_request_messages_fit_the_field_bits(void **state) {
    (void)state;
    static const ProtobufCServiceDescriptor *const services[] = {
        &google__bigtable__v2__bigtable__descriptor,
        &google__bigtable__admin__v2__bigtable_table_admin__descriptor,
        &google__bigtable__admin__v2__bigtable_instance_admin__descriptor,
        &google__longrunning__operations__descriptor,
        &strata__internal__v1__node__descriptor,
        &strata__internal__v1__replication__descriptor,
        &strata__internal__v1__backup_admin__descriptor,
    };
    const ProtobufCMessageDescriptor *seen[512];
    size_t n = 0;
    for (size_t s = 0; s < sizeof services / sizeof services[0]; s++)
        for (unsigned m = 0; m < services[s]->n_methods; m++) {
            const ProtobufCMessageDescriptor *in = services[s]->methods[m].input;
            bool dup = false;
            for (size_t k = 0; k < n && !dup; k++)
                dup = seen[k] == in;
            if (!dup && n < 512)
                seen[n++] = in;
        }
    for (size_t i = 0; i < n; i++) { /* seen grows as the walk finds submessages */
        if (seen[i]->n_fields > BTU_PB_FIELDS_MAX)
            fail_msg("%s declares %u fields", seen[i]->name, seen[i]->n_fields);
        for (unsigned f = 0; f < seen[i]->n_fields; f++) {
            const ProtobufCFieldDescriptor *fd = &seen[i]->fields[f];
            if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
                continue;
            bool dup = false;
            for (size_t k = 0; k < n && !dup; k++)
                dup = seen[k] == fd->descriptor;
            assert_true(dup || n < 512);
            if (!dup)
                seen[n++] = fd->descriptor;
        }
    }
    assert_true(n > 100); /* the walk reached the requests' submessages */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pbcheck_depth_at_and_over_the_limit),
        cmocka_unit_test(test_pbcheck_filters_in_requests),
        cmocka_unit_test(test_pbcheck_gc_rules),
        cmocka_unit_test(test_pbcheck_very_deep_input_refused_without_recursion),
        cmocka_unit_test(test_pbcheck_malformed_refused_like_protobuf_c),
        cmocka_unit_test(test_pbcheck_unknown_fields_skipped),
        cmocka_unit_test(test_pbcheck_packed_fields),
        cmocka_unit_test(test_pbcheck_packed_requests_pass),
        cmocka_unit_test(test_pb_unpack_lift),
        cmocka_unit_test(test_pbcheck_wide_messages),
        cmocka_unit_test(test_pbcheck_request_strings_utf8),
        cmocka_unit_test(test_pbcheck_request_message_fields_once),
        cmocka_unit_test(test_pbcheck_request_messages_fit_the_field_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
