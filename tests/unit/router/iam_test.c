/* iam_test.c — the pure parts of the router's authorization: the role an IAM policy (the
 * serialized google.iam.v1.Policy of a metadata record) gives a principal, for user: and
 * serviceAccount: members, the highest binding winning, unknown roles and look-alike names giving
 * nothing; IAM records as metadata row keys; and the audit log's JSON line (escaping of bytes a
 * client chose, fields left out when absent), and its rotation by size: no line is cut or lost
 * across FILE and FILE.1, and FILE stays under the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "google/iam/v1/policy.pb-c.h"
#include "router_internal.h"

static st_buf policy(const char *const *roles, const char *const *members, size_t n) {
    Google__Iam__V1__Binding b[8], *bp[8];
    char *m[8];
    Google__Iam__V1__Policy p;
    google__iam__v1__policy__init(&p);
    for (size_t i = 0; i < n; i++) {
        google__iam__v1__binding__init(&b[i]);
        b[i].role = (char *)roles[i];
        m[i] = (char *)members[i];
        b[i].members = &m[i];
        b[i].n_members = 1;
        bp[i] = &b[i];
    }
    p.bindings = bp;
    p.n_bindings = n;
    st_buf out;
    st_buf_init(&out);
    size_t len = google__iam__v1__policy__get_packed_size(&p);
    assert_int_equal(st_buf_reserve(&out, len + 1), ST_OK);
    out.len = google__iam__v1__policy__pack(&p, out.data);
    return out;
}

static void test_iam_role_of_members(void **state) {
    (void)state;
    const char *roles[] = {"roles/bigtable.reader", "roles/bigtable.user", "roles/bigtable.admin",
                           "roles/owner"};
    const char *members[] = {"user:alice", "serviceAccount:alice", "user:bob", "user:carl"};
    st_buf p = policy(roles, members, 4);
    st_slice s = st_buf_slice(&p);
    assert_int_equal(rtr_iam_role(s, "alice"), ST_ROLE_WRITER); /* the highest of two */
    assert_int_equal(rtr_iam_role(s, "bob"), ST_ROLE_ADMIN);
    assert_int_equal(rtr_iam_role(s, "carl"), ST_ROLE_NONE); /* not a Bigtable role */
    assert_int_equal(rtr_iam_role(s, "alic"), ST_ROLE_NONE);
    assert_int_equal(rtr_iam_role(s, "alicex"), ST_ROLE_NONE);
    assert_int_equal(rtr_iam_role(st_slice_make(NULL, 0), "alice"), ST_ROLE_NONE);
    /* Short names ("reader") are the auth file's, not IAM roles. */
    const char *short_role[] = {"admin"};
    st_buf q = policy(short_role, members, 1);
    assert_int_equal(rtr_iam_role(st_buf_slice(&q), "alice"), ST_ROLE_NONE);
    /* Malformed bytes give nothing rather than a guess. */
    uint8_t junk[] = {0x22, 0x05, 0x0a, 0x7f};
    assert_int_equal(rtr_iam_role(st_slice_make(junk, sizeof junk), "alice"), ST_ROLE_NONE);
    st_buf_free(&p);
    st_buf_free(&q);
}

static void test_iam_meta_row_key(void **state) {
    (void)state;
    st_buf key;
    st_buf_init(&key);
    assert_int_equal(rtr_meta_row_key(RTR_META_KIND_IAM, "projects/p/instances/i", &key), ST_OK);
    assert_true(st_slice_eq(st_buf_slice(&key), st_slice_cstr("iam/projects/p/instances/i")));
    rtr_meta_kind kind;
    char name[RTR_TABLE_NAME_MAX + 1];
    assert_true(rtr_meta_parse_row_key(st_buf_slice(&key), &kind, name, sizeof name));
    assert_int_equal(kind, RTR_META_KIND_IAM);
    assert_string_equal(name, "projects/p/instances/i");
    rtr_meta m = {0};
    assert_int_equal(rtr_meta_put(&m, RTR_META_KIND_IAM, name, st_slice_cstr("x")), ST_OK);
    assert_non_null(rtr_meta_find(&m, RTR_META_KIND_IAM, name));
    assert_null(rtr_meta_find(&m, RTR_META_KIND_TABLE, name));
    rtr_meta_free(&m);
    st_buf_free(&key);
}

static void test_audit_format(void **state) {
    (void)state;
    rtr_audit_rec rec = {"alice",
                         "127.0.0.1:4000",
                         "/google.bigtable.v2.Bigtable/MutateRow",
                         "projects/p/instances/i/tables/t\"\n\x01\xff",
                         "bigtable.tables.mutateRows",
                         "denied",
                         ST_PERMISSION_DENIED,
                         NULL};
    st_buf out;
    st_buf_init(&out);
    assert_int_equal(rtr_audit_format(&rec, 1764892800123456LL, &out), ST_OK);
    assert_int_equal(st_buf_append_byte(&out, 0), ST_OK);
    assert_string_equal((const char *)out.data,
                        "{\"time\":\"2025-12-05T00:00:00.123Z\",\"principal\":\"alice\","
                        "\"peer\":\"127.0.0.1:4000\",\"method\":\"/google.bigtable.v2.Bigtable/"
                        "MutateRow\",\"resource\":\"projects/p/instances/i/tables/t\\\"\\u000a"
                        "\\u0001\\u00ff\",\"permission\":\"bigtable.tables.mutateRows\","
                        "\"outcome\":\"denied\",\"code\":\"PERMISSION_DENIED\"}\n");
    st_buf_free(&out);
}

static bool file_has(const char *path, const char *needle) {
    char buf[4096] = {0};
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* An audit log moved away (by an operator, logrotate) or removed while the router runs: the next
 * lines go to a new file at the path, not on into the old inode where nobody looks. */
static void test_audit_reopens_moved_file(void **state) {
    (void)state;
    char dir[] = "/tmp/strata-audit-XXXXXX", path[64], moved[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/audit.log", dir);
    snprintf(moved, sizeof moved, "%s/audit.moved", dir);
    st_err err = {0};
    rtr_audit *a = rtr_audit_open(path, 0, &err);
    assert_non_null(a);
    rtr_audit_rec rec = {"alice", "unix",   "/m/first",         "r",
                         NULL,    "denied", ST_UNAUTHENTICATED, NULL};
    rtr_audit_write(a, &rec);
    while (!file_has(path, "/m/first")) /* the writer thread's turn */
        usleep(1000);
    assert_int_equal(rename(path, moved), 0);
    rec.method = "/m/second";
    rtr_audit_write(a, &rec);
    while (!file_has(path, "/m/second") && !file_has(moved, "/m/second"))
        usleep(1000);
    assert_true(file_has(path, "/m/second"));
    assert_int_equal(unlink(path), 0); /* removed outright */
    rec.method = "/m/third";
    rtr_audit_write(a, &rec);
    rtr_audit_close(a); /* writes what is queued */
    assert_true(file_has(path, "/m/third"));
    unlink(path);
    unlink(moved);
    rmdir(dir);
}

/* Lines of path, each checked to be one whole audit line; -1 when the file is absent. */
static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        assert_true(line[0] == '{' && strstr(line, "\"code\":\"OK\"}\n"));
        n++;
    }
    fclose(f);
    return n;
}

static void test_audit_rotation(void **state) {
    (void)state;
    char dir[] = "/tmp/audit-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64], old[70];
    snprintf(path, sizeof path, "%s/audit.log", dir);
    snprintf(old, sizeof old, "%s.1", path);
    st_err err = {0};
    rtr_audit *a = rtr_audit_open(path, 4096, &err);
    assert_non_null(a);
    rtr_audit_rec rec = {"admin",
                         "127.0.0.1:1",
                         "/google.bigtable.admin.v2.BigtableTableAdmin/"
                         "CreateTable",
                         "projects/p/instances/i",
                         "bigtable.tables.create",
                         "allowed",
                         ST_OK,
                         NULL};
    for (int i = 0; i < 100; i++) /* about 250 bytes each: several rotations */
        rtr_audit_write(a, &rec);
    rtr_audit_close(a); /* writes what is still queued */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size <= 4096);
    assert_int_equal(st.st_mode & 0777, 0600);
    int now = count_lines(path), before = count_lines(old);
    assert_true(now > 0 && before > 0);
    assert_true(now + before <= 100); /* older rotations were replaced */
    unlink(path);
    unlink(old);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iam_role_of_members), cmocka_unit_test(test_iam_meta_row_key),
        cmocka_unit_test(test_audit_format),        cmocka_unit_test(test_audit_reopens_moved_file),
        cmocka_unit_test(test_audit_rotation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
