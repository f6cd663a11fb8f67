/*
 * The pure parts of the router's backups (router/backup_filter.c): backup ids and names,
 * expire_time bounds, invalid Timestamps, ListBackups' filter language (comparisons over every
 * documented field, AND / OR / NOT, parentheses, times) and order_by (default start_time desc, ties
 * by name); and the gate the backup sweep takes for its deletes (router/admin_gate.c,
 * rtr_gate_take).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backup.h"
#include "router_internal.h"

static st_topology topo(void) {
    st_topology t;
    memset(&t, 0, sizeof t);
    strcpy(t.project, "p");
    strcpy(t.instance, "i");
    strcpy(t.clusters[0].id, "east");
    strcpy(t.clusters[1].id, "west");
    t.n_clusters = 2;
    return t;
}

static void test_ids_and_names(void **state) {
    (void)state;
    assert_true(rtr_bk_id_valid("nightly_1.a-b"));
    assert_true(rtr_bk_id_valid("_x"));
    assert_false(rtr_bk_id_valid("-x"));
    assert_false(rtr_bk_id_valid(".x"));
    assert_false(rtr_bk_id_valid(""));
    assert_false(rtr_bk_id_valid("a/b"));
    assert_true(rtr_bk_id_valid("12345678901234567890123456789012345678901234567890"));
    assert_false(rtr_bk_id_valid("123456789012345678901234567890123456789012345678901"));
    st_topology t = topo();
    size_t ci;
    char id[RTR_BK_ID_MAX + 1];
    st_err err = {0};
    assert_int_equal(rtr_bk_parse_name(&t, "projects/p/instances/i/clusters/west/backups/b1", &ci,
                                       id, sizeof id, &err),
                     ST_OK);
    assert_int_equal(ci, 1);
    assert_string_equal(id, "b1");
    assert_int_equal(rtr_bk_parse_name(&t, "projects/p/instances/i/clusters/north/backups/b1", &ci,
                                       id, sizeof id, &err),
                     ST_NOT_FOUND);
    assert_int_equal(rtr_bk_parse_name(&t, "projects/p/instances/x/clusters/east/backups/b1", &ci,
                                       id, sizeof id, &err),
                     ST_NOT_FOUND);
    assert_int_equal(rtr_bk_parse_name(&t, "projects/p/instances/i/clusters/east/backups/-b", &ci,
                                       id, sizeof id, &err),
                     ST_INVALID_ARGUMENT);
    assert_int_equal(
        rtr_bk_parse_name(&t, "projects/p/instances/i/clusters/east", &ci, id, sizeof id, &err),
        ST_INVALID_ARGUMENT);
    assert_int_equal(rtr_bk_parse_cluster(&t, "projects/p/instances/i/clusters/-", true, &ci, &err),
                     ST_OK);
    assert_int_equal(ci, SIZE_MAX);
    assert_int_equal(
        rtr_bk_parse_cluster(&t, "projects/p/instances/i/clusters/-", false, &ci, &err),
        ST_NOT_FOUND);
}

static void test_expire_bounds(void **state) {
    (void)state;
    int64_t now = 1700000000LL * 1000000;
    st_err err = {0};
    assert_int_equal(
        rtr_bk_check_expire(now + RTR_BK_EXPIRE_MIN_US, now, RTR_BK_EXPIRE_MAX_US, &err), ST_OK);
    assert_int_equal(
        rtr_bk_check_expire(now + RTR_BK_EXPIRE_MAX_US, now, RTR_BK_EXPIRE_MAX_US, &err), ST_OK);
    /* the minimum computed by a client a moment before the request arrived */
    assert_int_equal(rtr_bk_check_expire(now + RTR_BK_EXPIRE_MIN_US - RTR_BK_EXPIRE_SLACK_US, now,
                                         RTR_BK_EXPIRE_MAX_US, &err),
                     ST_OK);
    assert_int_equal(rtr_bk_check_expire(now + RTR_BK_EXPIRE_MIN_US - RTR_BK_EXPIRE_SLACK_US - 1,
                                         now, RTR_BK_EXPIRE_MAX_US, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "6 hours and 90 days"));
    assert_int_equal(
        rtr_bk_check_expire(now + 31 * RTR_BK_DAY_US, now, RTR_BK_COPY_EXPIRE_MAX_US, &err),
        ST_INVALID_ARGUMENT);
    assert_int_equal(rtr_bk_check_expire(0, now, RTR_BK_EXPIRE_MAX_US, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "must be set"));
    /* a Timestamp outside its range or with bad nanos is no time at all: refused, and seconds
     * whose microseconds overflow int64 cannot wrap into the window */
    Google__Protobuf__Timestamp t = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    /* 18446744073710e6 is 2^64 + 448384: these microseconds wrap to a day from now + 0.45 s */
    t.seconds = now / 1000000 + 86400 + 18446744073710LL;
    assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err),
                     ST_INVALID_ARGUMENT);
    t.seconds = -99999999999999LL;
    assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err),
                     ST_INVALID_ARGUMENT);
    t.seconds = now / 1000000 + 86400;
    t.nanos = -5;
    assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err),
                     ST_INVALID_ARGUMENT);
    t.nanos = 1000000000;
    assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err),
                     ST_INVALID_ARGUMENT);
    t.nanos = 999999999;
    assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err), ST_OK);
}

/* A Timestamp that is no valid one (nanos outside 0..999,999,999, seconds outside years
 * 1..9999) is refused as such, for expire_time and hot_to_standard_time alike: its seconds may
 * lie inside the allowed range, so a message naming the range named the wrong problem. */
static void test_invalid_timestamp(void **state) {
    (void)state;
    int64_t now = 1700000000LL * 1000000;
    st_err err = {0};
    Google__Protobuf__Timestamp t = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    static const struct {
        int64_t seconds;
        int32_t nanos;
    } bad[] = {
        {1700000000LL + 86400, 2000000000},
        {1700000000LL + 86400, -1},
        {1700000000LL + 86400, 1999999999},
        {INT64_MAX, 0},
        {253402300800LL, 0},
        {-62135596801LL, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t.seconds = bad[i].seconds;
        t.nanos = bad[i].nanos;
        assert_int_equal(rtr_bk_check_expire(rtr_bk_ts_us(&t), now, RTR_BK_EXPIRE_MAX_US, &err),
                         ST_INVALID_ARGUMENT);
        if (!strstr(err.msg, "expire_time is not a valid timestamp (nanos must be 0 to "
                             "999,999,999; seconds 0001-01-01 to 9999-12-31)"))
            fail_msg("case %zu: %s", i, err.msg);
        assert_int_equal(rtr_bk_check_hot(rtr_bk_ts_us(&t), now, &err), ST_INVALID_ARGUMENT);
        if (!strstr(err.msg, "hot_to_standard_time is not a valid timestamp"))
            fail_msg("case %zu: %s", i, err.msg);
    }
    /* valid ones keep their range checks */
    t.seconds = now / 1000000 + 3600;
    t.nanos = 0;
    assert_int_equal(rtr_bk_check_hot(rtr_bk_ts_us(&t), now, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "at least 24 hours"));
    t.seconds = now / 1000000 + 2 * 86400;
    t.nanos = 999999999;
    assert_int_equal(rtr_bk_check_hot(rtr_bk_ts_us(&t), now, &err), ST_OK);
    assert_int_equal(rtr_bk_check_hot(0, now, &err), ST_OK); /* not set */
}

/* Three backups: b1 (READY, small, 2026-01-01), b2 (CREATING, 2026-01-02), prod (READY, big,
 * 2026-01-03); start times one day apart. */
typedef struct fx {
    rtr_pb_backup b[3];
    Google__Protobuf__Timestamp start[3], exp[3];
} fx;

static void fx_init(fx *f) {
    const char *names[3] = {"projects/p/instances/i/clusters/east/backups/b1",
                            "projects/p/instances/i/clusters/east/backups/b2",
                            "projects/p/instances/i/clusters/west/backups/prod"};
    const char *tables[3] = {"projects/p/instances/i/tables/t", "projects/p/instances/i/tables/t",
                             "projects/p/instances/i/tables/prod_t"};
    for (int i = 0; i < 3; i++) {
        google__bigtable__admin__v2__backup__init(&f->b[i]);
        google__protobuf__timestamp__init(&f->start[i]);
        google__protobuf__timestamp__init(&f->exp[i]);
        f->start[i].seconds = 1767225600 + i * 86400; /* 2026-01-01T00:00:00Z + i days */
        f->exp[i].seconds = f->start[i].seconds + 7 * 86400;
        f->b[i].name = (char *)names[i];
        f->b[i].source_table = (char *)tables[i];
        f->b[i].start_time = &f->start[i];
        f->b[i].expire_time = &f->exp[i];
        f->b[i].state = i == 1 ? GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING
                               : GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
    }
    f->b[0].size_bytes = 100;
    f->b[2].size_bytes = 20000000000LL;
}

/* The matching backups as a string of indexes, e.g. "02". */
static void matches(const char *filter, const fx *f, char *out) {
    st_arena a;
    st_arena_init(&a, 1024);
    rtr_bk_filter *flt;
    st_err err = {0};
    assert_int_equal(rtr_bk_filter_parse(filter, &a, &flt, &err), ST_OK);
    char *o = out;
    for (int i = 0; i < 3; i++)
        if (rtr_bk_filter_match(flt, &f->b[i]))
            *o++ = (char)('0' + i);
    *o = '\0';
    st_arena_deinit(&a);
}

static void test_filter(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    char m[8];
    matches("", &f, m);
    assert_string_equal(m, "012");
    matches("name:prod", &f, m);
    assert_string_equal(m, "2");
    matches("name:\"backups/b\"", &f, m);
    assert_string_equal(m, "01");
    matches("state:READY", &f, m);
    assert_string_equal(m, "02");
    matches("state = creating", &f, m);
    assert_string_equal(m, "1");
    matches("size_bytes > 10000000000", &f, m);
    assert_string_equal(m, "2");
    matches("source_table:prod OR size_bytes = 100", &f, m);
    assert_string_equal(m, "02");
    matches("(name:b) AND (start_time < \"2026-01-02T00:00:00Z\")", &f, m);
    assert_string_equal(m, "0");
    matches("start_time >= 2026-01-02T00:00:00Z expire_time < 2026-01-10T00:00:01+00:00", &f, m);
    assert_string_equal(m, "12");
    matches("NOT state:READY", &f, m);
    assert_string_equal(m, "1");
    matches("-name:b1 AND -name:b2", &f, m);
    assert_string_equal(m, "2");
    matches("end_time < 2030-01-01T00:00:00.5Z", &f, m); /* no end_time: 0 */
    assert_string_equal(m, "012");
    matches("name = \"projects/p/instances/i/clusters/east/backups/b1\"", &f, m);
    assert_string_equal(m, "0");
    /* OR binds tighter than AND. */
    matches("state:CREATING AND name:b2 OR name:prod", &f, m);
    assert_string_equal(m, "1");
    const char *bad[] = {"colour:red",
                         "name",
                         "name:",
                         "state:GONE",
                         "size_bytes > big",
                         "start_time < yesterday",
                         "(name:b",
                         "name:b)",
                         "name ~ b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_arena a;
        st_arena_init(&a, 1024);
        rtr_bk_filter *flt;
        st_err err = {0};
        assert_int_equal(rtr_bk_filter_parse(bad[i], &a, &flt, &err), ST_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "invalid filter"));
        st_arena_deinit(&a);
    }
}

/* A filter of many comparisons: up to 256 parse and match; more, or a filter over 8 KiB, is
 * INVALID_ARGUMENT at once. A chain of 300 000 ORs used to take the router's memory (each value
 * took the rest of the filter's length) and then its stack (matching recursed once per
 * comparison). */
static void test_filter_size(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    size_t cap = 300000 * 12 + 1;
    char *big = malloc(cap), *p = big;
    assert_non_null(big);
    for (int i = 0; i < 256; i++)
        p += sprintf(p, "%sname:prod", i ? " OR " : "");
    char m[8];
    matches(big, &f, m);
    assert_string_equal(m, "2");
    p = big;
    for (int i = 0; i < 300000; i++)
        p += sprintf(p, "%sname:b", i ? " OR " : "");
    const char *bad[] = {big, big + strlen(big) - 257 * 10 + 4};
    for (size_t i = 0; i < 2; i++) {
        st_arena a;
        st_arena_init(&a, 1024);
        rtr_bk_filter *flt;
        st_err err = {0};
        assert_int_equal(rtr_bk_filter_parse(bad[i], &a, &flt, &err), ST_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "invalid filter"));
        st_arena_deinit(&a);
    }
    free(big);
}

static void order(const char *text, const fx *f, char *out) {
    rtr_bk_order o;
    st_err err = {0};
    assert_int_equal(rtr_bk_order_parse(text, &o, &err), ST_OK);
    int idx[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) /* insertion sort: three items */
        for (int k = i; k > 0 && rtr_bk_order_cmp(&o, &f->b[idx[k - 1]], &f->b[idx[k]]) > 0; k--) {
            int t = idx[k];
            idx[k] = idx[k - 1];
            idx[k - 1] = t;
        }
    for (int i = 0; i < 3; i++)
        out[i] = (char)('0' + idx[i]);
    out[3] = '\0';
}

static void test_order_by(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    char m[8];
    order("", &f, m);
    assert_string_equal(m, "210"); /* newest first */
    order("start_time", &f, m);
    assert_string_equal(m, "012");
    order("size_bytes desc", &f, m);
    assert_string_equal(m, "201");
    order("state, name desc", &f, m);
    assert_string_equal(m, "120");
    order(" source_table asc , name ", &f, m);
    assert_string_equal(m, "201");
    rtr_bk_order o;
    st_err err = {0};
    assert_int_equal(rtr_bk_order_parse("colour", &o, &err), ST_INVALID_ARGUMENT);
    assert_int_equal(rtr_bk_order_parse("name sideways", &o, &err), ST_INVALID_ARGUMENT);
}

/* A CREATING backup whose operation ended with an error is hidden; running, succeeded, unknown
 * operations, READY backups and imports (no operation) are shown. */
static void test_visible(void **state) {
    (void)state;
    rtr_pb_backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    rtr_pb_bkrec rec;
    strata__internal__v1__backup_record__init(&rec);
    rec.backup = &b;
    rec.operation = (char *)"operations/x/1";
    uint8_t buf[256];
    st_slice op;
    Google__Rpc__Status st;
    google__rpc__status__init(&st);
    st.code = 1;
    Google__Longrunning__Operation o;
    google__longrunning__operation__init(&o);
    o.name = (char *)"operations/x/1";
    op = st_slice_make(buf, google__longrunning__operation__pack(&o, buf));
    assert_true(rtr_bk_visible(&rec, &op)); /* running */
    o.done = true;
    o.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    o.error = &st;
    op = st_slice_make(buf, google__longrunning__operation__pack(&o, buf));
    assert_false(rtr_bk_visible(&rec, &op)); /* failed: hidden */
    assert_true(rtr_bk_visible(&rec, NULL)); /* operation unknown */
    b.state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
    assert_true(rtr_bk_visible(&rec, &op));
    b.state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    rec.operation = (char *)""; /* an import */
    assert_true(rtr_bk_visible(&rec, &op));
    rec.operation = (char *)"operations/x/1";
    o.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
    o.error = NULL;
    op = st_slice_make(buf, google__longrunning__operation__pack(&o, buf));
    assert_true(rtr_bk_visible(&rec, &op)); /* done without error: its record turns READY */
}

/* The sweep takes a backup's gate only when no call holds it, and gives it back. */
static void test_gate_take(void **state) {
    (void)state;
    rtr_ctx *r = calloc(1, sizeof *r);
    assert_non_null(r);
    int sweep1, sweep2;
    const char *b = "projects/p/instances/i/clusters/east/backups/b";
    assert_true(rtr_gate_take(r, b, &sweep1));
    assert_false(rtr_gate_take(r, b, &sweep2)); /* held: the second sweep leaves it */
    assert_true(rtr_gate_take(r, "projects/p/instances/i/clusters/east/backups/c", &sweep2));
    rtr_gate_leave(r, &sweep1);
    assert_true(rtr_gate_take(r, b, &sweep1)); /* free again */
    rtr_gate_leave(r, &sweep1);
    rtr_gate_leave(r, &sweep2);
    assert_null(r->gates); /* nothing left behind */
    free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_and_names), cmocka_unit_test(test_expire_bounds),
        cmocka_unit_test(test_filter),        cmocka_unit_test(test_filter_size),
        cmocka_unit_test(test_order_by),      cmocka_unit_test(test_visible),
        cmocka_unit_test(test_gate_take),     cmocka_unit_test(test_invalid_timestamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
