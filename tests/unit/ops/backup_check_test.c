/*
 * Proves `strata backup verify` and `import` refuse a MANIFEST whose lines parse but whose fields
 * cannot describe a backup (ops/backup_check.c): end before start, backup_type 0 (unspecified) or
 * unknown, expire not after end, a HOT time on a STANDARD backup, names that are not Bigtable
 * names of one instance, pieces leaving part of the key space out, frozen instants far outside
 * [start, end], sizes past int64. Each is INVALID_ARGUMENT and the error names the manifest and
 * the field. The manifests carry a correct `end` checksum line, as a forged one would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "backup_dir.h"

/* body + its `end` line, parsed as "DIR/MANIFEST". */
static st_code parse_body(const char *body, st_err *err) {
    st_buf text;
    st_buf_init(&text);
    assert_int_equal(st_buf_append(&text, body, strlen(body)), ST_OK);
    uint8_t sha[32];
    char shahex[65], end[128];
    unsigned n = 0;
    assert_int_equal(EVP_Digest(text.data, text.len, sha, &n, EVP_sha256(), NULL), 1);
    ops_bk_hex(sha, 32, shahex);
    snprintf(end, sizeof end, "end %08x %s\n", st_crc32c(0, text.data, text.len), shahex);
    assert_int_equal(st_buf_append(&text, end, strlen(end)), ST_OK);
    ops_bk_manifest m;
    st_code rc = ops_bk_manifest_parse((const char *)text.data, text.len, "DIR/MANIFEST", &m, err);
    ops_bk_manifest_deinit(&m);
    st_buf_free(&text);
    return rc;
}

#define V "strata-backup-export 2\n"
#define B "backup projects/p/instances/i/clusters/c/backups/b\n"
#define T "source_table projects/p/instances/i/tables/t\n"
#define TY "backup_type 1\n"
#define TIMES "start_us 1796420000000000\nend_us 1796420000180000\nexpire_us 1797024800000000\n"
#define S "schema 0a0174\n"
#define SHA "0000000000000000000000000000000000000000000000000000000000000000"
#define P0 "piece p - 6d 1796420000050000\nfile x 1 00000000 " SHA "\n"
#define P1 "piece q 6d - 1796420000060000\n"
#define GOOD V B T TY TIMES S P0 P1

static void test_backup_check_good(void **state) {
    (void)state;
    st_err err = {0};
    assert_int_equal(parse_body(GOOD, &err), ST_OK);
    /* HOT with its time; one piece covering everything; no files at all */
    assert_int_equal(parse_body(V B T "backup_type 2\n" TIMES "hot_to_standard_us "
                                      "1796506400000000\n" S "piece p - - 1796420000050000\n",
                                &err),
                     ST_OK);
    /* start == end (a backup of an empty table can take no time on a coarse clock) */
    assert_int_equal(
        parse_body(V B T TY "start_us 5\nend_us 5\nexpire_us 6\n" S "piece p - - 5\n", &err),
        ST_OK);
}

static void test_backup_check_refused(void **state) {
    (void)state;
    static const struct {
        const char *body, *field;
    } bad[] = {
        {V B T TY "start_us 1796420000180000\nend_us 1796420000000000\nexpire_us "
                  "1797024800000000\n" S P0 P1,
         "end_us"},
        {V B T "backup_type 0\n" TIMES S P0 P1, "backup_type"},
        {V B T "backup_type 3\n" TIMES S P0 P1, "backup_type"},
        {V B T TY "start_us 0\nend_us 1796420000180000\nexpire_us 1797024800000000\n" S P0 P1,
         "start_us"},
        {V B T TY "start_us 1796420000000000\nend_us 1796420000180000\nexpire_us "
                  "1796420000100000\n" S P0 P1,
         "expire_us"},
        {V B T TY "start_us 1796420000000000\nend_us 1796420000180000\nexpire_us "
                  "9223372036854775807\n" S P0 P1,
         "expire_us"},
        {V B T TY TIMES "hot_to_standard_us 1796506400000000\n" S P0 P1, "hot_to_standard_us"},
        {V B T "backup_type 2\n" TIMES "hot_to_standard_us 5\n" S P0 P1, "hot_to_standard_us"},
        {V "backup projects/p/instances/i/clusters/c/tables/b\n" T TY TIMES S P0 P1, "backup"},
        {V "backup projects/p/instances/i/clusters/c/backups/-b\n" T TY TIMES S P0 P1, "backup"},
        {V "backup projects/p/instances/i/clusters/c/backups/b/x\n" T TY TIMES S P0 P1, "backup"},
        {V "backup projects/p/instances/i/clusters//backups/b\n" T TY TIMES S P0 P1, "backup"},
        {V "backup projects/p/instances/i/clusters/c/backups/"
           "b23456789012345678901234567890123456789012345678901\n" T TY TIMES S P0 P1,
         "backup"},
        {V B "source_table projects/p/instances/j/tables/t\n" TY TIMES S P0 P1, "source_table"},
        {V B "source_table projects/p/instances/i/tables/.t\n" TY TIMES S P0 P1, "source_table"},
        {V B "source_table projects/p/instances/i/backups/t\n" TY TIMES S P0 P1, "source_table"},
        {V B T TY TIMES S, "piece"},
        {V B T TY TIMES S "piece p 61 6d 1796420000050000\n" P1, "piece p"},
        {V B T TY TIMES S P0, "piece p"},
        {V B T TY TIMES S P0 "piece q 6e - 1796420000060000\n", "piece q"},
        {V B T TY TIMES S "piece p - 6d 1\n" P1, "frozen_us"},
        {V B T TY TIMES S "piece p - 6d 1796430000000000\n" P1, "frozen_us"},
        {V B T TY TIMES S "piece p - 6d 1796420000050000\nfile x 9223372036854775807 00000000 " SHA
                          "\nfile y 9223372036854775807 00000000 " SHA "\n" P1,
         "file y"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_err err = {0};
        st_code rc = parse_body(bad[i].body, &err);
        if (rc != ST_INVALID_ARGUMENT)
            fail_msg("manifest %zu accepted (%d): %s", i, rc, bad[i].body);
        if (!strstr(err.msg, "DIR/MANIFEST") || !strstr(err.msg, bad[i].field))
            fail_msg("manifest %zu: error '%s' does not name DIR/MANIFEST and '%s'", i, err.msg,
                     bad[i].field);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backup_check_good),
        cmocka_unit_test(test_backup_check_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
