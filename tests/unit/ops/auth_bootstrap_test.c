/* auth_bootstrap_test.c — ops_auth_bootstrap, which `strata up --secure` runs: it writes
 * DIR/tokens ("ROLE TOKEN" lines, admin first, mode 0600) and DIR/principals (the router's
 * --auth-file, mode 0600, hashes only), where each token finds the principal of its role, which
 * holds that role on the whole instance; a second run replaces both (old tokens stop working). */
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

#include "auth.h"
#include "strata/auth.h"

static void check_dir(const char *dir, char toks[3][ST_AUTH_TOKEN_LEN + 1]) {
    static const char *const roles[] = {"admin", "writer", "reader"};
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokens", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    for (int i = 0; i < 3; i++) {
        char role[16];
        assert_int_equal(fscanf(f, "%15s %68s", role, toks[i]), 2);
        assert_string_equal(role, roles[i]);
        assert_int_equal(strlen(toks[i]), ST_AUTH_TOKEN_LEN);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/principals", dir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    st_auth_db db;
    st_auth_db_init(&db);
    st_err err = {0};
    assert_int_equal(st_auth_load(path, &db, &err), ST_OK);
    assert_int_equal(db.n_principals, 3);
    for (int i = 0; i < 3; i++) {
        uint8_t h[ST_AUTH_HASH_BYTES];
        st_auth_hash(st_slice_cstr(toks[i]), h);
        const st_auth_principal *p = st_auth_find_hash(&db, h);
        assert_non_null(p);
        assert_string_equal(p->name, roles[i]);
        assert_int_equal(st_auth_file_role(&db, p->name, NULL), st_auth_role_parse(roles[i]));
    }
    st_auth_db_free(&db);
}

static void test_auth_bootstrap_files(void **state) {
    (void)state;
    char dir[] = "/tmp/auth-boot-XXXXXX";
    assert_non_null(mkdtemp(dir));
    st_err err = {0};
    char first[3][ST_AUTH_TOKEN_LEN + 1], second[3][ST_AUTH_TOKEN_LEN + 1];
    assert_int_equal(ops_auth_bootstrap(dir, &err), ST_OK);
    check_dir(dir, first);
    assert_int_equal(ops_auth_bootstrap(dir, &err), ST_OK);
    check_dir(dir, second);
    for (int i = 0; i < 3; i++)
        assert_string_not_equal(first[i], second[i]);
    char path[256];
    snprintf(path, sizeof path, "%s/tokens", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/principals", dir);
    unlink(path);
    rmdir(dir);
    /* A folder that does not exist: an error that names the file. */
    assert_int_not_equal(ops_auth_bootstrap("/nonexistent-strata-dir", &err), ST_OK);
    assert_non_null(strstr(err.msg, "/nonexistent-strata-dir/principals"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_auth_bootstrap_files)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
