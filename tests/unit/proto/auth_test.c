/* auth_test.c — the auth file, tokens and permissions (proto/auth, strata/auth.h): the file
 * round-trips through st_auth_format, every malformed line is refused with its line number
 * (a grant whose principal line was deleted is ignored instead, so deleting revokes),
 * a token finds its principal by hash and nothing else does, the bearer header parser accepts
 * RFC 6750's form only, grants on the instance and on one table combine as documented, the
 * method table gives every public method a known permission and none to internal services, and
 * saved files are owner-only. */
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

#include "strata/auth.h"

static st_code parse(const char *text, st_auth_db *db, st_err *err) {
    st_auth_db_init(db);
    return st_auth_parse(st_slice_cstr(text), db, err);
}

static void test_auth_round_trip(void **state) {
    (void)state;
    st_auth_db db;
    st_auth_db_init(&db);
    char tok[ST_AUTH_TOKEN_LEN + 1];
    uint8_t h1[ST_AUTH_HASH_BYTES], h2[ST_AUTH_HASH_BYTES];
    st_err err = {0};
    assert_int_equal(st_auth_token_new(tok, sizeof tok, h1, &err), ST_OK);
    assert_int_equal(strlen(tok), ST_AUTH_TOKEN_LEN);
    assert_int_equal(strncmp(tok, ST_AUTH_TOKEN_PREFIX, 4), 0);
    assert_int_equal(st_auth_principal_add(&db, "alice", h1, &err), ST_OK);
    assert_int_equal(st_auth_token_new(tok, sizeof tok, h2, &err), ST_OK);
    assert_int_equal(st_auth_principal_add(&db, "svc@x.io", h2, &err), ST_OK);
    assert_int_equal(st_auth_principal_add(&db, "alice", h2, &err), ST_ALREADY_EXISTS);
    assert_int_equal(st_auth_grant_add(&db, "alice", ST_ROLE_ADMIN, NULL, &err), ST_OK);
    assert_int_equal(st_auth_grant_add(&db, "svc@x.io", ST_ROLE_WRITER, "t1", &err), ST_OK);
    assert_int_equal(st_auth_grant_add(&db, "bob", ST_ROLE_READER, NULL, &err), ST_NOT_FOUND);
    st_buf text;
    st_buf_init(&text);
    assert_int_equal(st_auth_format(&db, &text), ST_OK);
    st_auth_db again;
    st_auth_db_init(&again);
    assert_int_equal(st_auth_parse(st_buf_slice(&text), &again, &err), ST_OK);
    assert_int_equal(again.n_principals, 2);
    assert_int_equal(again.n_grants, 2);
    assert_string_equal(again.principals[1].name, "svc@x.io");
    assert_memory_equal(again.principals[1].hash, h2, ST_AUTH_HASH_BYTES);
    assert_int_equal(again.grants[1].role, ST_ROLE_WRITER);
    assert_string_equal(again.grants[1].table, "t1");
    /* Removing a principal removes its grants. */
    assert_int_equal(st_auth_principal_remove(&again, "alice", &err), ST_OK);
    assert_int_equal(again.n_grants, 1);
    st_buf_free(&text);
    st_auth_db_free(&db);
    st_auth_db_free(&again);
}

static void test_auth_parse_errors(void **state) {
    (void)state;
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"", "empty auth file"},
        {"principal a sha256:00\n", "line 1: the file must start with"},
        {"strata-auth 2\n", "line 1: the file must start with"},
        {"strata-auth 1\nprincipal a sha256:zz\n", "line 2: the token hash must be sha256"},
        {"strata-auth 1\nprincipal a/b sha256:"
         "0000000000000000000000000000000000000000000000000000000000000000\n",
         "line 2: bad principal name"},
        {"strata-auth 1\nprincipal a sha256:"
         "0000000000000000000000000000000000000000000000000000000000000000\n"
         "principal b sha256:"
         "0000000000000000000000000000000000000000000000000000000000000000\n",
         "line 3: principals a and b have the same token"},
        {"strata-auth 1\nprincipal a sha256:"
         "0000000000000000000000000000000000000000000000000000000000000000\n"
         "grant a owner\n",
         "line 3: unknown role 'owner'"},
        {"strata-auth 1\nprincipal a sha256:"
         "0000000000000000000000000000000000000000000000000000000000000000\n"
         "grant a reader -bad\n",
         "line 3: bad table id"},
        {"strata-auth 1\nfoo bar baz qux quux\n", "line 2: too many words"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_auth_db db;
        st_err err = {0};
        assert_int_not_equal(parse(bad[i].text, &db, &err), ST_OK);
        if (!strstr(err.msg, bad[i].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, err.msg, bad[i].msg);
        assert_int_equal(db.n_principals, 0);
        st_auth_db_free(&db);
    }
}

static void test_auth_find_hash(void **state) {
    (void)state;
    st_auth_db db;
    st_auth_db_init(&db);
    st_err err = {0};
    char toks[20][ST_AUTH_TOKEN_LEN + 1];
    for (int i = 0; i < 20; i++) {
        uint8_t h[ST_AUTH_HASH_BYTES];
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        assert_int_equal(st_auth_token_new(toks[i], sizeof toks[i], h, &err), ST_OK);
        assert_int_equal(st_auth_principal_add(&db, name, h, &err), ST_OK);
    }
    for (int i = 0; i < 20; i++) {
        uint8_t h[ST_AUTH_HASH_BYTES];
        st_auth_hash(st_slice_cstr(toks[i]), h);
        const st_auth_principal *p = st_auth_find_hash(&db, h);
        assert_non_null(p);
        assert_int_equal(p - db.principals, i);
        toks[i][10] ^= 1; /* one character off: no principal */
        st_auth_hash(st_slice_cstr(toks[i]), h);
        assert_null(st_auth_find_hash(&db, h));
    }
    /* Rotation: the old hash no longer finds the principal, the new one does. */
    uint8_t old[ST_AUTH_HASH_BYTES], nh[ST_AUTH_HASH_BYTES];
    memcpy(old, db.principals[3].hash, sizeof old);
    char t[ST_AUTH_TOKEN_LEN + 1];
    assert_int_equal(st_auth_token_new(t, sizeof t, nh, &err), ST_OK);
    assert_int_equal(st_auth_principal_rehash(&db, "p3", nh, &err), ST_OK);
    assert_null(st_auth_find_hash(&db, old));
    assert_ptr_equal(st_auth_find_hash(&db, nh), &db.principals[3]);
    st_auth_db_free(&db);
}

static void test_auth_bearer_parse(void **state) {
    (void)state;
    static const struct {
        const char *header, *token; /* token NULL: refused */
    } cases[] = {
        {"Bearer abc", "abc"},
        {"bearer abc", "abc"},
        {"BEARER\tabc.DEF-_~+/==  ", "abc.DEF-_~+/=="},
        {"Bearer  st1_00ff", "st1_00ff"},
        {"Bearer", NULL},
        {"Bearer ", NULL},
        {"Bearerabc", NULL},
        {"Basic dXNlcjpwYXNz", NULL},
        {"Bearer a b", NULL},
        {"Bearer a=b", NULL},
        {"Bearer ==", NULL},
        {"Bearer \"abc\"", NULL},
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        st_slice tok;
        bool ok = st_auth_bearer_parse(cases[i].header, &tok);
        if (ok != (cases[i].token != NULL))
            fail_msg("case %zu '%s': parsed %d", i, cases[i].header, ok);
        if (ok)
            assert_true(st_slice_eq(tok, st_slice_cstr(cases[i].token)));
    }
    assert_false(st_auth_bearer_parse(NULL, &(st_slice){0}));
    char *big = malloc(ST_AUTH_TOKEN_BYTES_MAX + 16);
    assert_non_null(big);
    memcpy(big, "Bearer ", 7);
    memset(big + 7, 'a', ST_AUTH_TOKEN_BYTES_MAX + 1);
    big[7 + ST_AUTH_TOKEN_BYTES_MAX + 1] = '\0';
    assert_false(st_auth_bearer_parse(big, &(st_slice){0}));
    big[7 + ST_AUTH_TOKEN_BYTES_MAX] = '\0';
    assert_true(st_auth_bearer_parse(big, &(st_slice){0}));
    free(big);
}

static void test_auth_file_role(void **state) {
    (void)state;
    st_auth_db db;
    st_err err = {0};
    const char *text = "strata-auth 1\n"
                       "principal a sha256:"
                       "0000000000000000000000000000000000000000000000000000000000000001\n"
                       "principal b sha256:"
                       "0000000000000000000000000000000000000000000000000000000000000002\n"
                       "grant a reader\ngrant a admin t1\ngrant b writer t2\n";
    assert_int_equal(parse(text, &db, &err), ST_OK);
    assert_int_equal(st_auth_file_role(&db, "a", NULL), ST_ROLE_READER);
    assert_int_equal(st_auth_file_role(&db, "a", "t1"), ST_ROLE_ADMIN);
    assert_int_equal(st_auth_file_role(&db, "a", "t2"), ST_ROLE_READER);
    assert_int_equal(st_auth_file_role(&db, "b", NULL), ST_ROLE_NONE);
    assert_int_equal(st_auth_file_role(&db, "b", "t2"), ST_ROLE_WRITER);
    assert_int_equal(st_auth_file_role(&db, "nobody", "t2"), ST_ROLE_NONE);
    assert_int_equal(st_auth_grant_remove(&db, "a", "t1", &err), ST_OK);
    assert_int_equal(st_auth_file_role(&db, "a", "t1"), ST_ROLE_READER);
    assert_int_equal(st_auth_grant_remove(&db, "a", "t1", &err), ST_NOT_FOUND);
    st_auth_db_free(&db);
}

/* A principal's line deleted by hand, its grant lines left: the file still loads (so a reload
 * revokes the principal instead of keeping the old file in force) and those grants give nothing. */
static void test_auth_orphan_grants(void **state) {
    (void)state;
    st_auth_db db;
    st_err err = {0};
    const char *text = "strata-auth 1\n"
                       "principal a sha256:"
                       "0000000000000000000000000000000000000000000000000000000000000001\n"
                       "grant a reader\ngrant ghost admin\ngrant ghost writer t1\n";
    assert_int_equal(parse(text, &db, &err), ST_OK);
    assert_int_equal(db.n_principals, 1);
    assert_int_equal(db.n_grants, 1);
    assert_int_equal(db.n_orphan_grants, 2);
    assert_int_equal(st_auth_file_role(&db, "ghost", NULL), ST_ROLE_NONE);
    assert_int_equal(st_auth_file_role(&db, "ghost", "t1"), ST_ROLE_NONE);
    st_auth_db_free(&db);
}

static void test_auth_methods(void **state) {
    (void)state;
    size_t n;
    const st_auth_method *m = st_auth_methods(&n);
    for (size_t i = 1; i < n; i++) /* st_auth_method_find searches it */
        if (strcmp(m[i - 1].path, m[i].path) >= 0)
            fail_msg("the method table is not sorted at %s", m[i].path);
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(st_auth_method_find(m[i].path), &m[i]);
    size_t n_svc;
    const st_auth_method *svc = st_auth_services(&n_svc);
    for (size_t i = 0; i < n_svc; i++)
        if (svc[i].path[strlen(svc[i].path) - 1] != '/' || !st_auth_perm_find(svc[i].perm))
            fail_msg("bad service entry %s", svc[i].path);
    for (size_t i = 0; i < n; i++) {
        if (m[i].scope == ST_AUTH_SCOPE_ANY)
            continue;
        const st_auth_perm *p = st_auth_perm_find(m[i].perm);
        if (!p)
            fail_msg("%s needs unknown permission %s", m[i].path, m[i].perm);
        /* Everything an admin-only permission guards is audited as an admin call. */
        if (p->role == ST_ROLE_ADMIN && !m[i].admin)
            fail_msg("%s is admin-only but not audited", m[i].path);
        /* TestIamPermissions answers a permission at its own scope: the methods' must agree. */
        if (p->scope != m[i].scope)
            fail_msg("%s checks %s at another scope than the permission's", m[i].path, m[i].perm);
    }
    const st_auth_method *rr = st_auth_method_find("/google.bigtable.v2.Bigtable/ReadRows");
    assert_non_null(rr);
    assert_string_equal(rr->perm, "bigtable.tables.readRows");
    assert_int_equal(st_auth_perm_find(rr->perm)->role, ST_ROLE_READER);
    const st_auth_method *mr = st_auth_method_find("/google.bigtable.v2.Bigtable/MutateRows");
    assert_int_equal(st_auth_perm_find(mr->perm)->role, ST_ROLE_WRITER);
    assert_null(st_auth_method_find("/strata.internal.v1.Node/DropTablet"));
    assert_null(st_auth_method_find("/strata.internal.v1.Replication/SetLinks"));
    assert_null(st_auth_method_find("/google.bigtable.v2.Bigtable/ReadRowsX"));
    assert_non_null(st_auth_method_find("/strata.internal.v1.BackupAdmin/BeginImport"));
    assert_null(st_auth_method_find("/strata.internal.v1.BackupAdmin/"));
    assert_null(st_auth_method_find("/strata.internal.v1.BackupAdmin/a/b"));
    assert_int_equal(st_auth_role_parse("roles/bigtable.user"), ST_ROLE_WRITER);
    assert_int_equal(st_auth_role_parse("roles/bigtable.viewer"), ST_ROLE_NONE);
    assert_string_equal(st_auth_role_iam_name(ST_ROLE_ADMIN), "roles/bigtable.admin");
}

static void test_auth_save_owner_only(void **state) {
    (void)state;
    char dir[] = "/tmp/auth-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/principals", dir);
    st_auth_db db;
    st_err err = {0};
    assert_int_equal(parse("strata-auth 1\n", &db, &err), ST_OK);
    uint8_t h[ST_AUTH_HASH_BYTES] = {1};
    assert_int_equal(st_auth_principal_add(&db, "a", h, &err), ST_OK);
    umask(022);
    assert_int_equal(st_auth_save(path, &db, &err), ST_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    st_auth_db back;
    st_auth_db_init(&back);
    assert_int_equal(st_auth_load(path, &back, &err), ST_OK);
    assert_int_equal(back.n_principals, 1);
    snprintf(path, sizeof path, "%s/absent", dir);
    assert_int_equal(st_auth_load(path, &back, &err), ST_NOT_FOUND);
    st_auth_db_free(&db);
    st_auth_db_free(&back);
    snprintf(path, sizeof path, "%s/principals", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_round_trip),      cmocka_unit_test(test_auth_parse_errors),
        cmocka_unit_test(test_auth_find_hash),       cmocka_unit_test(test_auth_bearer_parse),
        cmocka_unit_test(test_auth_file_role),       cmocka_unit_test(test_auth_methods),
        cmocka_unit_test(test_auth_save_owner_only), cmocka_unit_test(test_auth_orphan_grants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
