/*
 * Proves ops_path_absolute gives every command the same absolute instance directory whatever
 * its spelling: relative paths are joined to the working directory, "." and empty components
 * vanish, ".." removes the component before it (never climbing above "/"), trailing slashes
 * go, and a result that does not fit is refused rather than cut. Also that ops_bin_find looks
 * only in --bin-dir when one is given, and that ops_fopen_private creates owner-only files.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "paths.h"

static void expect_abs(const char *in, const char *want) {
    char out[PATH_MAX];
    assert_true(ops_path_absolute(in, out, sizeof out));
    assert_string_equal(out, want);
}

static void test_paths_absolute_normalises(void **state) {
    (void)state;
    expect_abs("/a/b", "/a/b");
    expect_abs("/a//b/", "/a/b");
    expect_abs("/a/./b/.", "/a/b");
    expect_abs("/a/b/../c", "/a/c");
    expect_abs("/..", "/");
    expect_abs("/a/../..", "/");
    expect_abs("/", "/");
}

static void test_paths_relative_joins_cwd(void **state) {
    (void)state;
    char cwd[PATH_MAX], want[PATH_MAX + 16];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/rel/inst", strcmp(cwd, "/") ? cwd : "");
    expect_abs("rel/inst", want);
    expect_abs("./rel/inst/", want);
    expect_abs("rel/x/../inst", want);
}

static void test_paths_too_long_refused(void **state) {
    (void)state;
    char out[8];
    assert_false(ops_path_absolute("/abcdefgh", out, sizeof out));
    assert_true(ops_path_absolute("/abc", out, sizeof out));
    assert_false(ops_path_absolute("", out, sizeof out));
}

static void test_paths_bin_dir_only(void **state) {
    (void)state;
    char out[PATH_MAX];
    assert_false(ops_bin_find("/nonexistent-dir", "node", "sh", out, sizeof out));
    assert_true(ops_bin_find("/bin", "node", "sh", out, sizeof out) ||
                ops_bin_find("/usr/bin", "node", "sh", out, sizeof out));
}

/* Files the commands create in an instance directory are owner-only whatever the umask. */
static void test_paths_fopen_private(void **state) {
    (void)state;
    char dir[] = "/tmp/paths_test.XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f", dir);
    mode_t old = umask(0);
    FILE *f = ops_fopen_private(path);
    umask(old);
    assert_non_null(f);
    assert_true(fputs("x\n", f) >= 0);
    assert_int_equal(fclose(f), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, OPS_FILE_MODE);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_absolute_normalises),
        cmocka_unit_test(test_paths_relative_joins_cwd),
        cmocka_unit_test(test_paths_too_long_refused),
        cmocka_unit_test(test_paths_bin_dir_only),
        cmocka_unit_test(test_paths_fopen_private),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
