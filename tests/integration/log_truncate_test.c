/* log_truncate_test.c — proves that a real strata-node refuses to start when its active commit
 * log segment was cut short (truncated from outside after a kill -9: acknowledged writes at its
 * end are gone), naming the file and the lost records, and that --accept-data-loss starts it with
 * the rows before the cut, logging what was dropped; a later plain start works again. The rows
 * are written one acknowledged MutateRow at a time through the C test client, the node is
 * killed with SIGKILL, and the segment is cut 100 bytes before the end of its records.
 * Usage: log_truncate_test PATH/TO/strata-node */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include <cmocka.h>

#include "btclient.h"

#define ROWS 200
#define VALUE_BYTES 1000

static const char *g_node_bin; /* argv[1], constant for the run */

static st_code node_start(bt_proc *p, const char *data, bool accept, st_err *err) {
    char log[BT_PATH_MAX + 8];
    snprintf(log, sizeof log, "%s.log", data);
    char *argv[] = {(char *)g_node_bin,
                    "--data",
                    (char *)data,
                    "--listen",
                    "127.0.0.1:0",
                    accept ? "--accept-data-loss" : NULL,
                    NULL};
    return bt_proc_start(p, argv, log, err);
}

static void write_rows(const bt_client *c) {
    st_err st;
    if (bt_create_table(c, "t", "cf", &st) != ST_OK)
        fail_msg("CreateTable: %s", st.msg);
    char value[VALUE_BYTES];
    memset(value, 'v', sizeof value); /* nonzero to its last byte: the records' end is findable */
    bt_muts m;
    bt_muts_init(&m);
    for (int i = 0; i < ROWS; i++) {
        char key[32];
        snprintf(key, sizeof key, "row%05d", i);
        bt_muts_reset(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("q"), 1000, st_slice_make(value, sizeof value));
        st_code rc = bt_mutate_row(c, "t", st_slice_cstr(key), &m, &st);
        if (rc != ST_OK)
            fail_msg("MutateRow %s: %s %s", key, st_code_name(rc), st.msg);
    }
    bt_muts_deinit(&m);
}

static void count_row(const bt_row *row, void *arg) {
    (void)row;
    (*(size_t *)arg)++;
}

static size_t count_rows(const bt_client *c) {
    size_t n = 0;
    bt_read_req req = {0};
    st_err st;
    st_code rc = bt_read_rows(c, "t", &req, count_row, &n, &st);
    if (rc != ST_OK)
        fail_msg("ReadRows: %s %s", st_code_name(rc), st.msg);
    return n;
}

/* The newest segment of data/storage/log into path. */
static void active_segment(const char *data, char *path, size_t cap) {
    char dir[BT_PATH_MAX + 16], best[256] = "";
    snprintf(dir, sizeof dir, "%s/storage/log", data);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".log") && strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    assert_true(best[0] != '\0');
    snprintf(path, cap, "%s/%s", dir, best);
}

/* Offset just after the last nonzero byte of the file: where its records end. */
static off_t records_end(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    off_t end = 0, off = 0;
    int ch;
    while ((ch = getc(f)) != EOF) {
        off++;
        if (ch != 0)
            end = off;
    }
    fclose(f);
    return end;
}

static bool file_has(const char *path, const char *needle) {
    st_buf b;
    st_buf_init(&b);
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        st_buf_append(&b, chunk, n);
    fclose(f);
    st_buf_append(&b, "", 1);
    bool found = strstr((const char *)b.data, needle) != NULL;
    st_buf_free(&b);
    return found;
}

static void test_log_truncate_refuses_then_accepts(void **state) {
    (void)state;
    char dir[BT_PATH_MAX / 2], data[BT_PATH_MAX / 2 + 16], seg[BT_PATH_MAX + 300];
    char log[BT_PATH_MAX + 8];
    bt_tmpdir(dir, sizeof dir, "log_truncate");
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s.log", data);
    bt_proc node = {0};
    bt_client c;
    st_err err = {0};
    if (node_start(&node, data, false, &err) != ST_OK)
        fail_msg("starting strata-node: %s", err.msg);
    bt_client_init(&c, node.addr);
    write_rows(&c);
    assert_int_equal(count_rows(&c), ROWS);
    bt_proc_stop(&node, SIGKILL, NULL);

    active_segment(data, seg, sizeof seg);
    off_t end = records_end(seg);
    struct stat sb;
    assert_int_equal(stat(seg, &sb), 0);
    assert_true(end > 100);
    if (sb.st_size == end) { /* no preallocation on this file system: a cut is a torn write */
        fprintf(stderr, "note: log segments are not preallocated here, skipped\n");
        bt_rmrf(dir);
        skip();
    }
    assert_int_equal(truncate(seg, end - 100), 0);

    /* Refuses, naming the file; the log says what to do. */
    st_code rc = node_start(&node, data, false, &err);
    if (rc == ST_OK) {
        bt_proc_stop(&node, SIGKILL, NULL);
        fail_msg("strata-node started on a commit log cut short");
    }
    assert_true(file_has(log, seg));
    assert_true(file_has(log, "cut short"));
    assert_true(file_has(log, "--accept-data-loss"));

    /* Starts with --accept-data-loss: the rows before the cut are there, the drop is logged. */
    if (node_start(&node, data, true, &err) != ST_OK)
        fail_msg("strata-node --accept-data-loss: %s", err.msg);
    bt_client_init(&c, node.addr);
    size_t n = count_rows(&c);
    fprintf(stderr, "kept %zu of %d acknowledged rows\n", n, ROWS);
    assert_true(n < ROWS && n + 2 >= ROWS); /* the cut took the last row's record */
    assert_true(file_has(log, "event=log_data_loss_accepted"));
    bt_proc_stop(&node, SIGTERM, NULL);

    /* A plain start works again: the damage was accepted once. */
    if (node_start(&node, data, false, &err) != ST_OK)
        fail_msg("strata-node after the accepted loss: %s", err.msg);
    bt_client_init(&c, node.addr);
    assert_int_equal(count_rows(&c), n);
    bt_proc_stop(&node, SIGTERM, NULL);
    if (!getenv("STRATA_KEEP_TMP"))
        bt_rmrf(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/strata-node\n", argv[0]);
        return 2;
    }
    g_node_bin = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_truncate_refuses_then_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
