/* backup_names_test — proves the checks every name from the wire passes before it becomes part of
 * a path under <data>/backups (node/backup_store.c): backup names, piece ids and file names that
 * could leave the tree ("..", "/", a leading dot), over-long ones and malformed ones are
 * INVALID_ARGUMENT; well-formed ones parse into their parts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backup.h"

static void test_backup_names(void **state) {
    (void)state;
    bk_name b;
    assert_int_equal(
        bk_name_parse("projects/p-1/instances/my-inst/clusters/c_1/backups/b.2", &b, NULL), ST_OK);
    assert_string_equal(b.project, "p-1");
    assert_string_equal(b.instance, "my-inst");
    assert_string_equal(b.cluster, "c_1");
    assert_string_equal(b.id, "b.2");
    const char *bad[] = {
        "",
        "projects/p/instances/i/clusters/c/backups/",
        "projects/p/instances/i/clusters/c/backups/..",
        "projects/p/instances/i/clusters/c/backups/.hidden",
        "projects/p/instances/i/clusters/c/backups/-x",
        "projects/p/instances/../clusters/c/backups/b",
        "projects/p/instances/i/clusters/./backups/b",
        "projects/p/instances/i/clusters/c/backups/b/x",
        "projects/p/instances/i/clusters/c/backups/a/../../x",
        "projects/p/instances/i/clusters/c/backups/b ",
        "projects/p/instances/i/clusters/c/backups/b\\x",
        "projects/p/instances/i/backups/b",
        "projects/p/instances/i/clusters/c/tables/b",
        "/projects/p/instances/i/clusters/c/backups/b",
        "projects//instances/i/clusters/c/backups/b",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_err err = {0};
        assert_int_equal(bk_name_parse(bad[i], &b, &err), ST_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "invalid backup name"));
    }
    char name[400];
    char id[NODE_BK_NAME_MAX + 2];
    memset(id, 'x', sizeof id - 1);
    id[sizeof id - 1] = '\0'; /* 65 bytes */
    snprintf(name, sizeof name, "projects/p/instances/i/clusters/c/backups/%s", id);
    assert_int_equal(bk_name_parse(name, &b, NULL), ST_INVALID_ARGUMENT);
    id[NODE_BK_NAME_MAX] = '\0'; /* 64 bytes */
    snprintf(name, sizeof name, "projects/p/instances/i/clusters/c/backups/%s", id);
    assert_int_equal(bk_name_parse(name, &b, NULL), ST_OK);
}

static void test_piece_and_file_names(void **state) {
    (void)state;
    assert_int_equal(bk_piece_check("p0", NULL), ST_OK);
    assert_int_equal(bk_piece_check("A_b-9", NULL), ST_OK);
    const char *bad_pieces[] = {"", ".", "..", "a.b", "a/b", "../x", "p.tmp", "p.in", "p ", "é"};
    for (size_t i = 0; i < sizeof bad_pieces / sizeof bad_pieces[0]; i++)
        assert_int_equal(bk_piece_check(bad_pieces[i], NULL), ST_INVALID_ARGUMENT);
    char longp[NODE_BK_NAME_MAX + 2];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(bk_piece_check(longp, NULL), ST_INVALID_ARGUMENT);
    assert_int_equal(bk_file_check("00000000000000000042.sst", NULL), ST_OK);
    assert_int_equal(bk_file_check("x-1_y.sst", NULL), ST_OK);
    const char *bad_files[] = {"",         ".sst",    "..sst",       "PIECE", "a.sst.tmp",
                               "../a.sst", "a/b.sst", "a.b.sst",     "a.SST", "PIECE.tmp",
                               ".hid.sst", "a.sst/",  "/etc/passwd", "a"};
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++)
        assert_int_equal(bk_file_check(bad_files[i], NULL), ST_INVALID_ARGUMENT);
    char longf[NODE_BK_NAME_MAX + 8];
    memset(longf, 'a', NODE_BK_NAME_MAX + 1);
    strcpy(longf + NODE_BK_NAME_MAX + 1, ".sst");
    assert_int_equal(bk_file_check(longf, NULL), ST_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backup_names),
        cmocka_unit_test(test_piece_and_file_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
