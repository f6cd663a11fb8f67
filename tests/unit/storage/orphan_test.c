/*
 * Proves how an open treats SSTables the MANIFEST does not list and never knew (numbered at or
 * after its next_file). A flush or compaction that crashed before its manifest write leaves one
 * whose writes are all in the log or in listed tables: it is removed, as before. An older copy
 * of the MANIFEST and the commit log put back over newer tables (a stale restore) leaves ones
 * holding acknowledged writes newer than anything in the log: the open is refused with
 * ST_DATA_LOSS naming the MANIFEST and the file, which stays; with accept_data_loss the file is
 * set aside (renamed *.aside, never read, never deleted) and the older state is served.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <sys/stat.h>

#include "sto_test_util.h"

#define V(ts) STO_VERSION((ts), 0)

static void sh(const char *fmt, ...) {
    char cmd[3000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Rows <prefix>000.. with versions from v0 on, then the tablet flushed (one SSTable). */
static void fill_flush(sto_db *db, const char *prefix, int n, int64_t v0) {
    for (int i = 0; i < n; i++) {
        char row[32];
        snprintf(row, sizeof row, "%s%03d", prefix, i);
        assert_int_equal(tu_set(db, 1, row, "f", "q", i, "v", V(v0 + i)), ST_OK);
    }
    st_err err;
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
}

static int rows_in(sto_db *db) {
    st_buf d;
    st_buf_init(&d);
    assert_int_equal(tu_dump(db, 1, &d), ST_OK);
    int n = 0;
    for (const char *p = (const char *)d.data; p && (p = strstr(p, "\n")); p++)
        n++;
    st_buf_free(&d);
    return n;
}

typedef struct fixture {
    char dir[512], old[600];
    sto_options o;
    sto_db *db;
} fixture;

/* Tablet 1 with 50 rows "a" flushed; its MANIFEST and log saved in old/ after a clean close. */
static void setup_old(fixture *f) {
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* the old MANIFEST's tables stay on disk */
    assert_int_equal(tu_db_open_fresh(f->dir, sizeof f->dir, "orphan_test", &f->o, &f->db), ST_OK);
    st_err err;
    assert_int_equal(sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                       ST_SLICE_LIT(""), NULL, &err),
                     ST_OK);
    fill_flush(f->db, "a", 50, 1000);
    sto_db_close(f->db);
    f->db = NULL;
    snprintf(f->old, sizeof f->old, "%s.old", f->dir);
    sh("mkdir -p %s && cp -r %s/MANIFEST %s/log %s/", f->old, f->dir, f->dir, f->old);
}

static void teardown(fixture *f) {
    if (f->db)
        sto_db_close(f->db);
    tu_rmrf(f->dir);
    tu_rmrf(f->old);
}

/* The name of the one SSTable in dir/sst that is not in before (a file the old MANIFEST lacks). */
static void newest_sst(const char *dir, char *out, size_t cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/sst", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    char best[256] = "";
    while ((e = readdir(d)))
        if (strlen(e->d_name) == 24 && strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    snprintf(out, cap, "%s/sst/%s", dir, best);
}

/* A copy of a listed table under a number the MANIFEST never gave out: what a compaction that
 * crashed before its manifest write leaves. Its writes are all in the log: removed at open. */
static void test_crashed_output_removed(void **state) {
    (void)state;
    fixture f = {0};
    setup_old(&f);
    char listed[800], orphan[800];
    newest_sst(f.dir, listed, sizeof listed);
    snprintf(orphan, sizeof orphan, "%s/sst/%020d.sst", f.dir, 99999);
    sh("cp %s %s", listed, orphan);
    char torn[800];
    snprintf(torn, sizeof torn, "%s/sst/%020d.sst", f.dir, 99998);
    sh("head -c 100 %s > %s", listed, torn); /* a torn output: removed too */
    st_err err;
    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_OK);
    assert_false(exists(orphan));
    assert_false(exists(torn));
    assert_int_equal(rows_in(f.db), 50);
    teardown(&f);
}

/* The old MANIFEST and log put back after 50 more rows and an overwrite were flushed into a
 * table the old MANIFEST does not list. */
static void test_stale_manifest_and_log_refused(void **state) {
    (void)state;
    fixture f = {0};
    setup_old(&f);
    char listed[800], copy[800];
    newest_sst(f.dir, listed, sizeof listed);
    st_err err;
    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_OK);
    fill_flush(f.db, "b", 50, 5000);
    sto_db_close(f.db);
    f.db = NULL;
    char newer[800];
    newest_sst(f.dir, newer, sizeof newer);
    sh("rm -rf %s/log && cp -r %s/MANIFEST %s/log %s/", f.dir, f.old, f.old, f.dir);
    /* an unknown table holding only old writes (a newer compaction's output, whose inputs could
     * be gone): with a newer one beside it, it is no crash leftover either, and is kept */
    snprintf(copy, sizeof copy, "%s/sst/%020d.sst", f.dir, 99999);
    sh("cp %s %s", listed, copy);

    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_DATA_LOSS);
    f.db = NULL;
    assert_non_null(strstr(err.msg, "MANIFEST and the commit log are older than sst/"));
    assert_non_null(strstr(err.msg, strrchr(newer, '/') + 1));
    assert_non_null(strstr(err.msg, "--accept-data-loss"));
    assert_true(exists(newer)); /* never deleted */
    assert_true(exists(copy));
    /* refused again: nothing changed on disk */
    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_DATA_LOSS);
    f.db = NULL;
    assert_true(exists(newer));
    assert_true(exists(copy));

    sto_options o = f.o;
    o.accept_data_loss = true;
    assert_int_equal(sto_db_open(f.dir, &o, &f.db, &err), ST_OK);
    char aside[820];
    snprintf(aside, sizeof aside, "%s.aside", newer);
    assert_false(exists(newer));
    assert_true(exists(aside)); /* kept for the operator */
    snprintf(aside, sizeof aside, "%s.aside", copy);
    assert_false(exists(copy));
    assert_true(exists(aside));
    assert_int_equal(rows_in(f.db), 50);
    assert_int_equal(tu_db_reopen(f.dir, &f.o, &f.db), ST_OK); /* no flag needed again */
    assert_true(exists(aside));
    teardown(&f);
}

/* A flushed table can hold versions above every record the log kept: a replicated row carries
 * its origin's commit time, which may be older than local writes already flushed (a peer behind).
 * A crashed compaction's output of that table is still a leftover (its writes are in the listed
 * table): removed, and the open goes on, however old the log's records are. */
static void test_crashed_output_newer_than_log_removed(void **state) {
    (void)state;
    fixture f = {0};
    setup_old(&f); /* rows a, versions 1000.., flushed */
    f.o.log_segment_bytes = 64 << 10;
    st_err err;
    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_OK);
    fill_flush(f.db, "c", 5, 9000); /* newest flushed: 9004 */
    char listed[800], orphan[800];
    newest_sst(f.dir, listed, sizeof listed); /* the table holding 9004 */
    char value[200];
    memset(value, 'x', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    for (int i = 0; i < 2000; i++) { /* late replicated rows, older: the log's segments turn */
        char row[32];
        snprintf(row, sizeof row, "r%04d", i);
        assert_int_equal(tu_set(f.db, 1, row, "f", "q", i, value, V(100 + i)), ST_OK);
    }
    assert_int_equal(sto_tablet_flush(f.db, 1, &err), ST_OK);
    for (int i = 0; i < 10; i++) { /* the log's only records now */
        char row[32];
        snprintf(row, sizeof row, "s%04d", i);
        assert_int_equal(tu_set(f.db, 1, row, "f", "q", i, "v", V(3000 + i)), ST_OK);
    }
    sto_db_close(f.db);
    f.db = NULL;
    assert_true(exists(listed)); /* not compacted away (compaction_trigger) */
    snprintf(orphan, sizeof orphan, "%s/sst/%020d.sst", f.dir, 99999);
    sh("cp %s %s", listed, orphan);
    assert_int_equal(sto_db_open(f.dir, &f.o, &f.db, &err), ST_OK);
    assert_false(exists(orphan));
    assert_int_equal(rows_in(f.db), 2065);
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crashed_output_removed),
        cmocka_unit_test(test_stale_manifest_and_log_refused),
        cmocka_unit_test(test_crashed_output_newer_than_log_removed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
