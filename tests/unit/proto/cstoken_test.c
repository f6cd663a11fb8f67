/*
 * Proves the change-stream token codec shared by the node and the router (proto/bt/cstoken.c):
 * "1.W" and "1.W.H.K" parse and format back to the same text, every other text is refused with
 * INVALID_ARGUMENT; version 2 tokens ("2.C.Y.W", "2.C.Y.W.H.K") carry the issuing cluster and its
 * applied bound Y, and start at Y on any other cluster; partitions become [start, end) ranges;
 * several tokens are accepted only when their partitions tile the request's partition exactly, and
 * then start at the smallest W; one token keeps its scan position; Timestamps convert with the
 * documented rounding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "strata/cstoken.h"

static st_slice S(const char *s) {
    return st_slice_cstr(s);
}

static void roundtrip(const char *text) {
    btu_cs_pos p;
    st_err err = {0};
    assert_int_equal(btu_cs_token_parse(S(text), &p, &err), ST_OK);
    char out[BTU_CS_TOKEN_MAX];
    size_t n = btu_cs_token_format(&p, out);
    assert_int_equal(n, strlen(text));
    assert_string_equal(out, text);
}

static void test_cstoken_parse_live_and_scan(void **state) {
    (void)state;
    btu_cs_pos p;
    assert_int_equal(btu_cs_token_parse(S("1.1733300000000000"), &p, NULL), ST_OK);
    assert_false(p.scan);
    assert_int_equal(p.w, 1733300000000000LL);
    assert_int_equal(btu_cs_token_parse(S("1.5.9.00ff61"), &p, NULL), ST_OK);
    assert_true(p.scan);
    assert_int_equal(p.w, 5);
    assert_int_equal(p.h, 9);
    assert_int_equal(p.key_len, 3);
    assert_memory_equal(p.key,
                        "\x00\xff"
                        "a",
                        3);
    roundtrip("1.0");
    roundtrip("1.9223372036854775807");
    roundtrip("1.0.1.00");
    roundtrip("1.17.9223372036854775807.6b6579");
}

static void test_cstoken_refuses_anything_else(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "1",
        "1.",
        "2.5",
        "0.5",
        "1.05",
        "1.-5",
        "1.+5",
        " 1.5",
        "1.5 ",
        "1.5.",
        "1.5.9",
        "1.5.9.",
        "1.5.9.6",
        "1.5.9.6A",
        "1.5.9.zz",
        "1.5.5.61",
        "1.9.5.61",
        "1.5.09.61",
        "1.5.9.61.",
        "1.5.9..61",
        "1..5",
        "1.5..9.61",
        "1.5x",
        "10.5",
        "1.1e3",
        "1.0x10",
        "1.9223372036854775808",
        "1.18446744073709551616",
        "1.00000000000000000001",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        btu_cs_pos p;
        st_err err = {0};
        if (btu_cs_token_parse(S(bad[i]), &p, &err) != ST_INVALID_ARGUMENT)
            fail_msg("accepted token '%s'", bad[i]);
        assert_non_null(strstr(err.msg, "expected 1.W, 1.W.H.K, 2.C.Y.W or 2.C.Y.W.H.K"));
    }
    /* A NUL inside, and a key one byte over the row key limit. */
    btu_cs_pos p;
    assert_int_equal(btu_cs_token_parse(st_slice_make("1.5\0", 4), &p, NULL), ST_INVALID_ARGUMENT);
    size_t n = 2 * BTU_ROW_KEY_MAX + 2;
    char *t = malloc(16 + n + 1);
    assert_non_null(t);
    strcpy(t, "1.1.2.");
    memset(t + 6, 'a', n);
    t[6 + n] = 0;
    assert_int_equal(btu_cs_token_parse(S(t), &p, NULL), ST_INVALID_ARGUMENT);
    t[6 + n - 2] = 0; /* exactly BTU_ROW_KEY_MAX bytes: fine, and formats back */
    roundtrip(t);
    free(t);
}

/* A partition with the given bounds (NULL = unset), allocated from a. */
static Google__Bigtable__V2__StreamPartition *part(st_arena *a, const char *start, bool s_open,
                                                   const char *end, bool e_closed) {
    Google__Bigtable__V2__StreamPartition *p = st_arena_alloc(a, sizeof *p);
    Google__Bigtable__V2__RowRange *r = st_arena_alloc(a, sizeof *r);
    google__bigtable__v2__stream_partition__init(p);
    google__bigtable__v2__row_range__init(r);
    p->row_range = r;
    if (start) {
        ProtobufCBinaryData k = {strlen(start), (uint8_t *)(uintptr_t)start};
        r->start_key_case = s_open ? GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN
                                   : GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        if (s_open)
            r->start_key_open = k;
        else
            r->start_key_closed = k;
    }
    if (end) {
        ProtobufCBinaryData k = {strlen(end), (uint8_t *)(uintptr_t)end};
        r->end_key_case = e_closed ? GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED
                                   : GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        if (e_closed)
            r->end_key_closed = k;
        else
            r->end_key_open = k;
    }
    return p;
}

static void test_cstoken_partition_range(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 4096);
    btu_key_range r;
    st_err err = {0};
    assert_int_equal(btu_cs_partition_range(NULL, "partition", &a, &r, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "partition is missing"));
    Google__Bigtable__V2__StreamPartition whole = GOOGLE__BIGTABLE__V2__STREAM_PARTITION__INIT;
    assert_int_equal(btu_cs_partition_range(&whole, "partition", &a, &r, NULL), ST_OK);
    assert_int_equal(r.start.len, 0);
    assert_int_equal(r.end.len, 0);
    assert_int_equal(btu_cs_partition_range(part(&a, "b", true, "d", true), "p", &a, &r, NULL),
                     ST_OK);
    assert_true(st_slice_eq(r.start, st_slice_make("b\0", 2)));
    assert_true(st_slice_eq(r.end, st_slice_make("d\0", 2)));
    assert_int_equal(btu_cs_partition_range(part(&a, "d", false, "b", false), "p", &a, &r, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "selects no row"));
    assert_int_equal(btu_cs_partition_range(part(&a, "b", false, "b", false), "p", &a, &r, NULL),
                     ST_INVALID_ARGUMENT);
    /* What btu_cs_partition_set builds reads back as the same range. */
    Google__Bigtable__V2__StreamPartition p;
    Google__Bigtable__V2__RowRange rr;
    btu_cs_partition_set(&p, &rr, S("k1"), S(""));
    assert_int_equal(btu_cs_partition_range(&p, "p", &a, &r, NULL), ST_OK);
    assert_true(st_slice_eq(r.start, S("k1")));
    assert_int_equal(r.end.len, 0);
    assert_int_equal(rr.end_key_case, GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY__NOT_SET);
    /* A range closed at a row key of the longest length ends just above it: that bound, one
     * byte longer than a row key, reads back (a CloseStream hands it out), and only that one. */
    char *k = st_arena_alloc(&a, BTU_ROW_KEY_MAX + 2);
    memset(k, 'z', BTU_ROW_KEY_MAX);
    k[BTU_ROW_KEY_MAX] = 0;
    k[BTU_ROW_KEY_MAX + 1] = 0;
    Google__Bigtable__V2__StreamPartition *closed = part(&a, "c", false, "", false);
    closed->row_range->end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED;
    closed->row_range->end_key_closed = (ProtobufCBinaryData){BTU_ROW_KEY_MAX, (uint8_t *)k};
    assert_int_equal(btu_cs_partition_range(closed, "p", &a, &r, NULL), ST_OK);
    assert_int_equal(r.end.len, BTU_ROW_KEY_MAX + 1);
    btu_cs_partition_set(&p, &rr, r.start, r.end);
    btu_key_range again;
    assert_int_equal(btu_cs_partition_range(&p, "p", &a, &again, &err), ST_OK);
    assert_true(btu_cs_range_eq(&r, &again));
    rr.end_key_open.data[BTU_ROW_KEY_MAX] = 'z'; /* not the key above a row key */
    assert_int_equal(btu_cs_partition_range(&p, "p", &a, &again, &err), ST_INVALID_ARGUMENT);
    st_arena_deinit(&a);
}

static Google__Bigtable__V2__StreamContinuationToken *tok(st_arena *a, const char *start,
                                                          const char *end, const char *text) {
    Google__Bigtable__V2__StreamContinuationToken *t = st_arena_alloc(a, sizeof *t);
    google__bigtable__v2__stream_continuation_token__init(t);
    t->partition = part(a, start, false, end, false);
    t->token = (char *)(uintptr_t)text;
    return t;
}

static st_code merge(st_arena *a, Google__Bigtable__V2__StreamContinuationToken **v, size_t n,
                     const char *start, const char *end, btu_cs_pos *pos, st_err *err) {
    btu_key_range want;
    assert_int_equal(btu_cs_partition_range(part(a, start, false, end, false), "p", a, &want, NULL),
                     ST_OK);
    return btu_cs_tokens_merge(v, n, &want, btu_cs_table_tag(S("t")), a, pos, err);
}

/* Tokens a stream hands out name their table: accepted for it, refused for any other. */
static void test_cstoken_table_tag(void **state) {
    (void)state;
    uint32_t tag = btu_cs_table_tag(S("t"));
    assert_int_equal(btu_cs_table_tag(S("projects/p/instances/i/tables/t")), tag);
    assert_int_not_equal(btu_cs_table_tag(S("u")), tag);
    btu_cs_pos p;
    btu_cs_pos_live(&p, 5);
    p.has_table = true;
    p.table = tag;
    char text[BTU_CS_TOKEN_MAX], other[BTU_CS_TOKEN_MAX];
    btu_cs_token_format(&p, text);
    assert_int_equal(text[0], 't');
    roundtrip(text);
    roundtrip("t0000000a.2.3.4.5.9.6b");
    p.table = btu_cs_table_tag(S("u"));
    btu_cs_token_format(&p, other);
    st_arena a;
    st_arena_init(&a, 4096);
    btu_cs_pos pos;
    st_err err = {0};
    Google__Bigtable__V2__StreamContinuationToken *v[2] = {tok(&a, "", "", text)};
    assert_int_equal(merge(&a, v, 1, "", "", &pos, &err), ST_OK);
    assert_int_equal(pos.w, 5);
    v[0] = tok(&a, "", "", other);
    assert_int_equal(merge(&a, v, 1, "", "", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "another table"));
    v[0] = tok(&a, "", "m", text);
    v[1] = tok(&a, "m", "", other);
    assert_int_equal(merge(&a, v, 2, "", "", &pos, &err), ST_INVALID_ARGUMENT);
    v[1] = tok(&a, "m", "", "1.7"); /* untagged tokens stay valid */
    assert_int_equal(merge(&a, v, 2, "", "", &pos, &err), ST_OK);
    static const char *const bad[] = {"t.1.5",
                                      "t0000000.1.5",
                                      "t0000000g.1.5",
                                      "t0000000A.1.5",
                                      "t00000000",
                                      "t00000000.",
                                      "t00000000.3.5",
                                      "t00000000t0000000.1.5",
                                      "t00000000.t00000000.1.5",
                                      " t00000000.1.5",
                                      NULL};
    for (size_t i = 0; bad[i]; i++)
        if (btu_cs_token_parse(S(bad[i]), &p, &err) != ST_INVALID_ARGUMENT)
            fail_msg("accepted '%s'", bad[i]);
    st_arena_deinit(&a);
}

static void test_cstoken_merge_one(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 4096);
    btu_cs_pos pos;
    st_err err = {0};
    Google__Bigtable__V2__StreamContinuationToken *v[1] = {tok(&a, "b", "d", "1.5.9.63")};
    assert_int_equal(merge(&a, v, 1, "b", "d", &pos, &err), ST_OK);
    assert_true(pos.scan); /* one token: the scan goes on where it was */
    assert_int_equal(pos.h, 9);
    assert_int_equal(merge(&a, v, 1, "b", "e", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "do not cover the partition"));
    assert_int_equal(merge(&a, v, 1, "a", "d", &pos, NULL), ST_INVALID_ARGUMENT);
    assert_int_equal(merge(&a, v, 1, "b", NULL, &pos, NULL), ST_INVALID_ARGUMENT);
    assert_int_equal(merge(&a, v, 0, "b", "d", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "no token"));
    v[0] = tok(&a, "b", "d", "1.x");
    assert_int_equal(merge(&a, v, 1, "b", "d", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "'1.x'"));
    v[0]->partition = NULL;
    assert_int_equal(merge(&a, v, 1, "b", "d", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "continuation_tokens[0].partition is missing"));
    st_arena_deinit(&a);
}

static void test_cstoken_merge_several(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 4096);
    btu_cs_pos pos;
    st_err err = {0};
    /* Out of order on purpose: [c, inf), [, b), [b, c) tile everything. */
    Google__Bigtable__V2__StreamContinuationToken *v[3] = {
        tok(&a, "c", NULL, "1.30"), tok(&a, NULL, "b", "1.20.40.61"), tok(&a, "b", "c", "1.25")};
    assert_int_equal(merge(&a, v, 3, NULL, NULL, &pos, &err), ST_OK);
    assert_false(pos.scan); /* merged: the smallest W, live */
    assert_int_equal(pos.w, 20);
    /* Not the request's ends. */
    assert_int_equal(merge(&a, v, 3, "a", NULL, &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "first token"));
    assert_int_equal(merge(&a, v, 3, NULL, "z", &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "last token"));
    /* A gap: [, b) and [c, inf) alone. */
    Google__Bigtable__V2__StreamContinuationToken *gap[2] = {v[0], v[1]};
    assert_int_equal(merge(&a, gap, 2, NULL, NULL, &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "gap"));
    /* An overlap: [, c) with [b, c). */
    Google__Bigtable__V2__StreamContinuationToken *ov[3] = {tok(&a, NULL, "c", "1.1"), v[2], v[0]};
    assert_int_equal(merge(&a, ov, 3, NULL, NULL, &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "overlap"));
    /* The same partition twice. */
    Google__Bigtable__V2__StreamContinuationToken *twice[2] = {v[2], v[2]};
    assert_int_equal(merge(&a, twice, 2, "b", "c", &pos, &err), ST_INVALID_ARGUMENT);
    /* An unbounded partition that is not the last. */
    Google__Bigtable__V2__StreamContinuationToken *unb[2] = {tok(&a, "a", NULL, "1.1"),
                                                             tok(&a, "b", NULL, "1.1")};
    assert_int_equal(merge(&a, unb, 2, "a", NULL, &pos, &err), ST_INVALID_ARGUMENT);
    /* One bad token text among good ones. */
    Google__Bigtable__V2__StreamContinuationToken *badt[2] = {tok(&a, NULL, "b", "1.1"),
                                                              tok(&a, "b", NULL, "1.01")};
    assert_int_equal(merge(&a, badt, 2, NULL, NULL, &pos, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "'1.01'"));
    st_arena_deinit(&a);
}

/* Version 2: the issuing cluster C and its applied bound Y <= W. */
static void test_cstoken_v2(void **state) {
    (void)state;
    btu_cs_pos p;
    assert_int_equal(btu_cs_token_parse(S("2.3.1733299999000000.1733300000000000"), &p, NULL),
                     ST_OK);
    assert_true(p.has_y);
    assert_false(p.scan);
    assert_int_equal(p.cluster, 3);
    assert_int_equal(p.y, 1733299999000000LL);
    assert_int_equal(p.w, 1733300000000000LL);
    /* Read on its own cluster it starts at W, on any other at Y. */
    assert_int_equal(btu_cs_pos_start(&p, 3), 1733300000000000LL);
    assert_int_equal(btu_cs_pos_start(&p, 1), 1733299999000000LL);
    assert_int_equal(btu_cs_token_parse(S("2.1.4.5.9.00ff61"), &p, NULL), ST_OK);
    assert_true(p.has_y && p.scan);
    assert_int_equal(p.y, 4);
    assert_int_equal(p.w, 5);
    assert_int_equal(p.h, 9);
    assert_int_equal(p.key_len, 3);
    roundtrip("2.0.0.0");
    roundtrip("2.4294967295.9223372036854775807.9223372036854775807");
    roundtrip("2.2.5.5");
    roundtrip("2.2.0.17.9223372036854775807.6b6579");
    /* A version 1 token has no bound: it starts at W anywhere (as before version 2). */
    assert_int_equal(btu_cs_token_parse(S("1.7"), &p, NULL), ST_OK);
    assert_false(p.has_y);
    assert_int_equal(btu_cs_pos_start(&p, 2), 7);
    static const char *const bad[] = {
        "2.5",         "2.1.5",        "2.1.6.5",      "2.4294967296.1.5", "2.01.1.5",
        "2.1.01.5",    "2.1..5",       "2..1.5",       "2.1.1.5.",         "2.1.1.5.9",
        "2.1.1.5.9.6", "2.1.1.5.5.61", "2.-1.1.5",     "2.1.1.5 ",         "2.1.1",
        "2.1.1.",      "3.1.1.5",      "2.1.2.1.5.61", "2.1.1.5.9.6A",     "2.1.1.5.9.61.",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_err err = {0};
        if (btu_cs_token_parse(S(bad[i]), &p, &err) != ST_INVALID_ARGUMENT)
            fail_msg("accepted token '%s'", bad[i]);
        assert_non_null(strstr(err.msg, "2.C.Y.W"));
    }
    /* The longest token fits BTU_CS_TOKEN_MAX and formats back. */
    size_t n = 2 * BTU_ROW_KEY_MAX;
    char *t = malloc(90 + n + 1);
    assert_non_null(t);
    int k = snprintf(t, 90, "tffffffff.2.4294967295.9223372036854775806.9223372036854775806.%s.",
                     "9223372036854775807");
    memset(t + k, 'f', n);
    t[k + (int)n] = 0;
    assert_true(strlen(t) + 1 == BTU_CS_TOKEN_MAX);
    roundtrip(t);
    free(t);
}

/* Setting a bound: lowered to W, kept by formatting; btu_cs_pos_live drops it. */
static void test_cstoken_v2_set_bound(void **state) {
    (void)state;
    btu_cs_pos p;
    char out[BTU_CS_TOKEN_MAX];
    btu_cs_pos_live(&p, 100);
    btu_cs_pos_set_bound(&p, 2, 250);
    assert_int_equal(p.y, 100);
    btu_cs_token_format(&p, out);
    assert_string_equal(out, "2.2.100.100");
    btu_cs_pos_set_bound(&p, 2, 40);
    btu_cs_token_format(&p, out);
    assert_string_equal(out, "2.2.40.100");
    btu_cs_pos_set_bound(&p, 1, -5);
    assert_int_equal(p.y, 0);
    btu_cs_pos_live(&p, 100);
    assert_false(p.has_y);
    btu_cs_token_format(&p, out);
    assert_string_equal(out, "1.100");
}

static void test_cstoken_v2_merge(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 4096);
    btu_cs_pos pos;
    /* One token keeps its cluster, bound and scan. */
    Google__Bigtable__V2__StreamContinuationToken *one[1] = {tok(&a, "b", "d", "2.1.3.5.9.63")};
    assert_int_equal(merge(&a, one, 1, "b", "d", &pos, NULL), ST_OK);
    assert_true(pos.has_y && pos.scan);
    assert_int_equal(pos.cluster, 1);
    assert_int_equal(pos.y, 3);
    /* One cluster: the smallest W and the smallest Y. */
    Google__Bigtable__V2__StreamContinuationToken *same[2] = {tok(&a, NULL, "b", "2.1.10.30"),
                                                              tok(&a, "b", NULL, "2.1.15.20")};
    assert_int_equal(merge(&a, same, 2, NULL, NULL, &pos, NULL), ST_OK);
    assert_true(pos.has_y);
    assert_false(pos.scan);
    assert_int_equal(pos.cluster, 1);
    assert_int_equal(pos.w, 20);
    assert_int_equal(pos.y, 10);
    assert_int_equal(btu_cs_pos_start(&pos, 1), 20);
    assert_int_equal(btu_cs_pos_start(&pos, 2), 10);
    /* Two clusters, or versions mixed: the smallest of everything, wherever it is read. */
    Google__Bigtable__V2__StreamContinuationToken *two[2] = {tok(&a, NULL, "b", "2.1.10.30"),
                                                             tok(&a, "b", NULL, "2.2.15.20")};
    assert_int_equal(merge(&a, two, 2, NULL, NULL, &pos, NULL), ST_OK);
    assert_false(pos.has_y);
    assert_int_equal(pos.w, 10);
    Google__Bigtable__V2__StreamContinuationToken *mixed[2] = {tok(&a, NULL, "b", "1.8"),
                                                               tok(&a, "b", NULL, "2.1.15.20")};
    assert_int_equal(merge(&a, mixed, 2, NULL, NULL, &pos, NULL), ST_OK);
    assert_false(pos.has_y);
    assert_int_equal(pos.w, 8);
    mixed[0] = tok(&a, NULL, "b", "1.30");
    assert_int_equal(merge(&a, mixed, 2, NULL, NULL, &pos, NULL), ST_OK);
    assert_int_equal(pos.w, 15);
    st_arena_deinit(&a);
}

static void test_cstoken_times(void **state) {
    (void)state;
    Google__Protobuf__Timestamp t = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    int64_t us;
    t.seconds = 1700000000;
    t.nanos = 123456789;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, NULL), ST_OK);
    assert_int_equal(us, 1700000000123457LL);
    assert_int_equal(btu_cs_time_us(&t, "end_time", false, &us, NULL), ST_OK);
    assert_int_equal(us, 1700000000123456LL);
    t.nanos = 5000;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, NULL), ST_OK);
    assert_int_equal(us, 1700000000000005LL);
    Google__Protobuf__Timestamp back;
    btu_cs_time_set(&back, us);
    assert_int_equal(back.seconds, t.seconds);
    assert_int_equal(back.nanos, t.nanos);
    st_err err = {0};
    t.nanos = -1;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "start_time is out of range"));
    t.nanos = 1000000000;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, NULL), ST_INVALID_ARGUMENT);
    t.nanos = 0;
    t.seconds = -1;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, NULL), ST_INVALID_ARGUMENT);
    t.seconds = 253402300800LL;
    assert_int_equal(btu_cs_time_us(&t, "start_time", true, &us, NULL), ST_INVALID_ARGUMENT);
}

/* The request's time arguments: end before start, bad durations, timestamps out of range. */
static void test_cstoken_check_times(void **state) {
    (void)state;
    Google__Bigtable__V2__ReadChangeStreamRequest req =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__INIT;
    Google__Protobuf__Timestamp start = GOOGLE__PROTOBUF__TIMESTAMP__INIT,
                                end = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    Google__Protobuf__Duration hb = GOOGLE__PROTOBUF__DURATION__INIT;
    st_err err = {0};
    assert_int_equal(btu_cs_check_times(&req, &err), ST_OK); /* nothing given */
    start.seconds = 1700000000;
    start.nanos = 500;
    req.start_from_case = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
    req.start_time = &start;
    end = start;
    req.end_time = &end;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_OK); /* inclusive: equal is fine */
    end.nanos = 0; /* the same microsecond once rounded, but before the start */
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "before start_time"));
    end.seconds = start.seconds - 1;
    end.nanos = 999999999;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    end.nanos = -1;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "end_time is out of range"));
    /* with tokens, end_time is not compared with a start */
    req.start_from_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS;
    req.start_time = NULL;
    end.seconds = 1;
    end.nanos = 0;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_OK);
    req.heartbeat_duration = &hb;
    hb.seconds = 0;
    hb.nanos = 1;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_OK);
    hb.seconds = -1;
    hb.nanos = 0;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "heartbeat_duration"));
    hb.seconds = 0;
    hb.nanos = -5;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    hb.seconds = 2;
    hb.nanos = -5; /* signs differ: not a Duration */
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
    hb.nanos = 1000000000;
    assert_int_equal(btu_cs_check_times(&req, &err), ST_INVALID_ARGUMENT);
}

/* Values where a hand-written decimal routine goes wrong: 0, one digit, each power of ten and its
 * neighbours, the type limits, and pseudo-random values of every length. */
static size_t dec_values(uint64_t *v, size_t cap) {
    size_t n = 0;
    v[n++] = 0;
    v[n++] = UINT64_MAX;
    v[n++] = UINT64_MAX - 1;
    v[n++] = (uint64_t)INT64_MAX;
    v[n++] = (uint64_t)INT64_MAX + 1;
    v[n++] = UINT32_MAX;
    v[n++] = (uint64_t)UINT32_MAX + 1;
    for (uint64_t t = 1;; t *= 10) {
        v[n++] = t - 1;
        v[n++] = t;
        v[n++] = t + 1;
        if (t > UINT64_MAX / 10)
            break;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* xorshift64: the same values on every run */
    while (n < cap) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v[n++] = x >> (x % 64); /* every magnitude, not only 20-digit values */
    }
    return n;
}

static void test_cstoken_dec_matches_snprintf(void **state) {
    (void)state;
    uint64_t v[400];
    size_t n = dec_values(v, 400);
    for (size_t i = 0; i < n; i++) {
        char want[32], got[BTU_CS_DEC_MAX + 1];
        snprintf(want, sizeof want, "%llu", (unsigned long long)v[i]);
        size_t len = btu_cs_dec(got, v[i]);
        got[len] = 0;
        assert_int_equal(len, strlen(want));
        assert_string_equal(got, want);
    }
}

/* p formatted as the snprintf formats the token shapes are defined by. */
static void token_by_snprintf(const btu_cs_pos *p, char *out, size_t cap) {
    int n = p->has_y ? snprintf(out, cap, "2.%lu.%lld.%lld", (unsigned long)p->cluster,
                                (long long)p->y, (long long)p->w)
                     : snprintf(out, cap, "1.%lld", (long long)p->w);
    if (p->scan) {
        n += snprintf(out + n, cap - (size_t)n, ".%lld.", (long long)p->h);
        for (size_t i = 0; i < p->key_len; i++)
            n += snprintf(out + n, cap - (size_t)n, "%02x", p->key[i]);
    }
}

static void check_format(const btu_cs_pos *p) {
    char want[BTU_CS_TOKEN_MAX], got[BTU_CS_TOKEN_MAX];
    token_by_snprintf(p, want, sizeof want);
    size_t len = btu_cs_token_format(p, got);
    assert_int_equal(len, strlen(want));
    assert_string_equal(got, want);
    btu_cs_pos back; /* and it is still a token the parser takes back */
    assert_int_equal(btu_cs_token_parse(S(got), &back, NULL), ST_OK);
}

/* Every token shape (1.W, 1.W.H.K, 2.C.Y.W, 2.C.Y.W.H.K) with each number over the value list
 * (cut to the field's range), byte for byte as snprintf formatted it. */
static void test_cstoken_format_matches_snprintf(void **state) {
    (void)state;
    uint64_t v[300];
    size_t n = dec_values(v, 300);
    for (size_t i = 0; i < n; i++) {
        int64_t a = (int64_t)(v[i] & (uint64_t)INT64_MAX), b = (int64_t)(v[n - 1 - i] >> 1);
        int64_t w = a < INT64_MAX ? a : INT64_MAX - 1, lo = b < w ? b : w;
        btu_cs_pos p;
        btu_cs_pos_live(&p, w);
        check_format(&p);
        btu_cs_pos_set_bound(&p, (uint32_t)v[i], lo);
        check_format(&p);
        p.scan = true;
        p.h = w + 1 + (int64_t)(v[(i + 7) % n] % (uint64_t)(INT64_MAX - w));
        p.key_len = i == 0 ? BTU_ROW_KEY_MAX : 1 + i % 40;
        for (size_t k = 0; k < p.key_len; k++)
            p.key[k] = (uint8_t)(v[i] >> (k % 8 * 8));
        check_format(&p);
        p.has_y = false;
        check_format(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cstoken_check_times),
        cmocka_unit_test(test_cstoken_parse_live_and_scan),
        cmocka_unit_test(test_cstoken_refuses_anything_else),
        cmocka_unit_test(test_cstoken_table_tag),
        cmocka_unit_test(test_cstoken_partition_range),
        cmocka_unit_test(test_cstoken_merge_one),
        cmocka_unit_test(test_cstoken_merge_several),
        cmocka_unit_test(test_cstoken_times),
        cmocka_unit_test(test_cstoken_v2),
        cmocka_unit_test(test_cstoken_v2_set_bound),
        cmocka_unit_test(test_cstoken_v2_merge),
        cmocka_unit_test(test_cstoken_dec_matches_snprintf),
        cmocka_unit_test(test_cstoken_format_matches_snprintf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
