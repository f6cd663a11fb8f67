/*
 * Proves what `strata changes` prints and keeps, apart from the network: TIME arguments (RFC
 * 3339 with fractions and offsets, `now`, relative forms) and the RFC 3339 µs output; the JSON
 * line of a change (printable UTF-8 as escaped strings, anything else base64 under "_b64",
 * GC records, delete ranges); base64 against RFC 4648's vectors; and the checkpoint file: a
 * round trip of binary keys and tokens, refused for another table, a damaged line or a FIFO,
 * and no temporary file left behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "changes.h"
#include "tu_tmp.h"

static void test_time_parse(void **state) {
    (void)state;
    int64_t t;
    assert_true(ops_cs_time_parse("1970-01-01T00:00:00Z", 0, &t));
    assert_int_equal(t, 0);
    assert_true(ops_cs_time_parse("2026-12-04T20:39:37Z", 0, &t));
    assert_int_equal(t, 1796416777LL * 1000000);
    assert_true(ops_cs_time_parse("2026-12-04T20:39:37.123456Z", 0, &t));
    assert_int_equal(t, 1796416777LL * 1000000 + 123456);
    assert_true(ops_cs_time_parse("2026-12-04T20:39:37.5Z", 0, &t));
    assert_int_equal(t, 1796416777LL * 1000000 + 500000);
    assert_true(ops_cs_time_parse("2026-12-04T21:39:37+01:00", 0, &t));
    assert_int_equal(t, 1796416777LL * 1000000);
    assert_true(ops_cs_time_parse("2026-12-04T19:09:37-01:30", 0, &t));
    assert_int_equal(t, 1796416777LL * 1000000);
    assert_true(ops_cs_time_parse("2000-02-29T00:00:00Z", 0, &t));
    assert_int_equal(t, 951782400LL * 1000000);
    assert_true(ops_cs_time_parse("2024-02-29T00:00:00Z", 0, &t));
    assert_true(ops_cs_time_parse("2026-12-31T23:59:59Z", 0, &t));
    int64_t now = 1000LL * 1000000;
    assert_true(ops_cs_time_parse("now", now, &t));
    assert_int_equal(t, now);
    assert_true(ops_cs_time_parse("-10m", now, &t));
    assert_int_equal(t, now - 600LL * 1000000);
    assert_true(ops_cs_time_parse("-500ms", now, &t));
    assert_int_equal(t, now - 500000);
    assert_true(ops_cs_time_parse("+2h", now, &t));
    assert_int_equal(t, now + 7200LL * 1000000);
    assert_true(ops_cs_time_parse("-1d", now, &t));
    assert_int_equal(t, now - 86400LL * 1000000);
    const char *bad[] = {"", "yesterday", "-10", "-m", "-10x", "2026-12-04", "2026-12-04T20:39:37",
                         "2026-13-04T20:39:37Z", "2026-12-04T20:39:37.Z",
                         "2026-12-04T20:39:37+1:00", "2026-12-04T20:39:37Zjunk",
                         "2026-12-04 20:39:37Z",
                         /* days a month does not have: they used to roll over silently
                          * (February 30 read as March 2) */
                         "2026-02-29T00:00:00Z", "2026-02-30T00:00:00Z", "2100-02-29T00:00:00Z",
                         "2026-04-31T00:00:00Z", "2026-11-31T00:00:00Z",
                         /* signs and blanks are not digits */
                         "2026-+1-04T20:39:37Z", "+026-12-04T20:39:37Z", "2026-12-04T+1:39:37Z",
                         "2026-12-04T20:39:37+-1:00", "2026-12-04T20:39:37+01:+0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(ops_cs_time_parse(bad[i], now, &t));
}

static void test_time_format(void **state) {
    (void)state;
    char out[OPS_CS_TIME_MAX];
    ops_cs_time_format(0, out);
    assert_string_equal(out, "1970-01-01T00:00:00.000000Z");
    ops_cs_time_format(1796416777LL * 1000000 + 42, out);
    assert_string_equal(out, "2026-12-04T20:39:37.000042Z");
    int64_t back;
    assert_true(ops_cs_time_parse(out, 0, &back));
    assert_int_equal(back, 1796416777LL * 1000000 + 42);
    ops_cs_time_format(-1, out);
    assert_string_equal(out, "1969-12-31T23:59:59.999999Z");
}

static void b64(const char *in, const char *want) {
    st_buf b;
    st_buf_init(&b);
    ops_cs_base64(&b, st_slice_cstr(in));
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    st_buf_free(&b);
}

static void test_base64(void **state) {
    (void)state;
    b64("", "");
    b64("f", "Zg==");
    b64("fo", "Zm8=");
    b64("foo", "Zm9v");
    b64("foob", "Zm9vYg==");
    b64("fooba", "Zm9vYmE=");
    b64("foobar", "Zm9vYmFy");
}

static void test_printable(void **state) {
    (void)state;
    assert_true(ops_cs_bytes_printable(st_slice_cstr("plain \"quoted\" \\ text")));
    assert_true(
        ops_cs_bytes_printable(st_slice_cstr("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80")));
    assert_false(ops_cs_bytes_printable(st_slice_make("a\0b", 3)));
    assert_false(ops_cs_bytes_printable(st_slice_cstr("tab\there")));
    assert_false(ops_cs_bytes_printable(st_slice_cstr("del\x7f")));
    assert_false(ops_cs_bytes_printable(st_slice_cstr("\xc0\xaf")));         /* overlong */
    assert_false(ops_cs_bytes_printable(st_slice_cstr("\xed\xa0\x80")));     /* surrogate */
    assert_false(ops_cs_bytes_printable(st_slice_cstr("\xf4\x90\x80\x80"))); /* > U+10FFFF */
    assert_false(ops_cs_bytes_printable(st_slice_cstr("\xe2\x82")));         /* truncated */
    assert_false(ops_cs_bytes_printable(st_slice_cstr("\xff")));
}

static void test_json_user_change(void **state) {
    (void)state;
    ops_cs_mod mods[3] = {
        {.op = OPS_CS_SET,
         .family = st_slice_cstr("cf"),
         .qualifier = st_slice_cstr("q\"1"),
         .value = st_slice_make("\x00\x01\xff", 3),
         .timestamp_us = 1700000000000000LL},
        {.op = OPS_CS_DELETE_COLUMN,
         .family = st_slice_cstr("cf"),
         .qualifier = st_slice_cstr("old"),
         .start_us = 5,
         .end_us = 10},
        {.op = OPS_CS_DELETE_FAMILY, .family = st_slice_cstr("gone")},
    };
    ops_cs_change c = {.row = st_slice_cstr("row\\1"),
                       .type = OPS_CS_USER,
                       .cluster = "east",
                       .commit_us = 1796416777LL * 1000000 + 7,
                       .tiebreaker = 1,
                       .mods = mods,
                       .n_mods = 3};
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(ops_cs_json(&b, &c), ST_OK);
    const char *want = "{\"row\":\"row\\\\1\",\"type\":\"USER\",\"cluster\":\"east\","
                       "\"commit_time\":\"2026-12-04T20:39:37.000007Z\",\"tiebreaker\":1,\"mods\":["
                       "{\"op\":\"set\",\"family\":\"cf\",\"qualifier\":\"q\\\"1\",\"timestamp\":"
                       "1700000000000000,\"value_b64\":\"AAH/\"},"
                       "{\"op\":\"delete_column\",\"family\":\"cf\",\"qualifier\":\"old\","
                       "\"start_timestamp\":5,\"end_timestamp\":10},"
                       "{\"op\":\"delete_family\",\"family\":\"gone\"}]}";
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    st_buf_free(&b);
}

static void test_json_gc_binary_row(void **state) {
    (void)state;
    ops_cs_mod m = {.op = OPS_CS_DELETE_COLUMN,
                    .family = st_slice_cstr("cf"),
                    .qualifier = st_slice_make("\x01", 1)};
    ops_cs_change c = {.row = st_slice_make("\x00\x10", 2),
                       .type = OPS_CS_GC,
                       .cluster = "",
                       .commit_us = 0,
                       .mods = &m,
                       .n_mods = 1};
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(ops_cs_json(&b, &c), ST_OK);
    const char *want = "{\"row_b64\":\"ABA=\",\"type\":\"GARBAGE_COLLECTION\",\"cluster\":\"\","
                       "\"commit_time\":\"1970-01-01T00:00:00.000000Z\",\"tiebreaker\":0,"
                       "\"mods\":[{\"op\":\"delete_column\",\"family\":\"cf\","
                       "\"qualifier_b64\":\"AQ==\"}]}";
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    st_buf_free(&b);
}

static void pos_init(ops_cs_pos *p, const void *s, size_t sl, const void *e, size_t el,
                     const char *tok, int64_t us) {
    memset(p, 0, sizeof *p);
    st_buf_append(&p->start, s, sl);
    st_buf_append(&p->end, e, el);
    p->token = tok ? strdup(tok) : NULL;
    p->start_us = us;
}

static void test_checkpoint_round_trip(void **state) {
    (void)state;
    char dir[4096], path[4200], tmp[4300];
    tu_tmpdir(dir, sizeof dir, "ckpt");
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ops_cs_pos in[3];
    pos_init(&in[0], "", 0, "m\x00\xff", 3, "1.123.456.6d", 0);
    pos_init(&in[1], "m\x00\xff", 3, "", 0, NULL, 1796416777000000LL);
    pos_init(&in[2], "a b", 3, "c", 1, "token with spaces", 0);
    const char *table = "projects/p/instances/i/tables/t";
    st_err err = {0};
    assert_int_equal(ops_cs_ckpt_write(path, table, in, 3, &err), ST_OK);
    assert_int_not_equal(access(tmp, F_OK), 0);
    ops_cs_pos *out;
    size_t n;
    assert_int_equal(ops_cs_ckpt_read(path, table, &out, &n, &err), ST_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(out[i].start.len, in[i].start.len);
        assert_memory_equal(out[i].start.data, in[i].start.data, in[i].start.len);
        assert_int_equal(out[i].end.len, in[i].end.len);
        assert_memory_equal(out[i].end.data, in[i].end.data, in[i].end.len);
        if (in[i].token)
            assert_string_equal(out[i].token, in[i].token);
        else
            assert_null(out[i].token);
        assert_int_equal(out[i].start_us, in[i].start_us);
        ops_cs_pos_free(&out[i]);
    }
    free(out);
    /* another table's checkpoint is refused */
    assert_int_equal(ops_cs_ckpt_read(path, "projects/p/instances/i/tables/other", &out, &n, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "not a checkpoint of table"));
    /* a damaged line names itself */
    FILE *f = fopen(path, "a");
    fputs("t zz - 31\n", f);
    fclose(f);
    assert_int_equal(ops_cs_ckpt_read(path, table, &out, &n, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "line 5"));
    /* a missing file is NOT_FOUND: the first run starts from --from */
    snprintf(tmp, sizeof tmp, "%s/none", dir);
    assert_int_equal(ops_cs_ckpt_read(tmp, table, &out, &n, &err), ST_NOT_FOUND);
    /* a FIFO is refused as not a file (opening it used to wait for a writer, for good) */
    snprintf(tmp, sizeof tmp, "%s/fifo", dir);
    assert_int_equal(mkfifo(tmp, 0600), 0);
    assert_int_equal(ops_cs_ckpt_read(tmp, table, &out, &n, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "not a regular file"));
    for (size_t i = 0; i < 3; i++)
        ops_cs_pos_free(&in[i]);
    tu_rmrf(dir);
}

/* A checkpoint must cover every row exactly once, in any order of its lines. */
static void test_checkpoint_check(void **state) {
    (void)state;
    ops_cs_pos v[3];
    pos_init(&v[0], "m", 1, "t", 1, "1.5", 0);
    pos_init(&v[1], "t", 1, "", 0, "1.6", 0);
    pos_init(&v[2], "", 0, "m", 1, NULL, 7);
    st_err err = {0};
    assert_int_equal(ops_cs_ckpt_check("ck", v, 3, &err), ST_OK);
    assert_int_equal(ops_cs_ckpt_check("ck", v, 2, &err), ST_INVALID_ARGUMENT); /* [, m) gone */
    assert_non_null(strstr(err.msg, "does not start"));
    assert_int_equal(ops_cs_ckpt_check("ck", &v[1], 2, &err), ST_INVALID_ARGUMENT); /* [m, t) */
    assert_non_null(strstr(err.msg, "missing"));
    assert_int_equal(ops_cs_ckpt_check("ck", &v[2], 1, &err), ST_INVALID_ARGUMENT); /* [m, ) gone */
    assert_non_null(strstr(err.msg, "does not end"));
    ops_cs_pos dup[2] = {v[2], v[2]};
    dup[0].end = v[1].end; /* [, ) and [, m) */
    assert_int_equal(ops_cs_ckpt_check("ck", dup, 2, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "overlap"));
    assert_int_equal(ops_cs_ckpt_check("ck", NULL, 0, &err), ST_INVALID_ARGUMENT);
    for (size_t i = 0; i < 3; i++)
        ops_cs_pos_free(&v[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_time_parse),
        cmocka_unit_test(test_time_format),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_printable),
        cmocka_unit_test(test_json_user_change),
        cmocka_unit_test(test_json_gc_binary_row),
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_checkpoint_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
