/* gc_report_test — proves sto_tablet_set_gc_report: a compaction reports exactly the cells of
 * user families its GC rules drop (max versions, max age), not cells hidden by deletes, not
 * overwritten duplicates, not system-family cells; the report comes once the compaction is
 * installed (before sto_tablet_compact returns), in batches of at most STO_GC_REPORT_BATCH; a
 * split child reports only its own rows; clearing the function stops the reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <time.h>

#include "sto_test_util.h"

#define SYS ST_SLICE_LIT("\0changes")
#define HOUR_US ((int64_t)3600 * 1000000)
#define T0_US (1000 * HOUR_US) /* the fake clock */
#define V(us) STO_VERSION(T0_US + (us), 0)

typedef struct fixture {
    char dir[512];
    sto_options o;
    st_clock clock;
    sto_db *db;
    st_buf report; /* one line per reported cell */
    int calls;
    size_t max_batch;
    pthread_mutex_t mu; /* reports may come from a storage worker */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* only explicit compactions here */
    f->o.write_stall_tables = 200;
    st_clock_fake_init(&f->clock, T0_US);
    f->o.clock = &f->clock;
    st_buf_init(&f->report);
    pthread_mutex_init(&f->mu, NULL);
    if (tu_db_open_fresh(f->dir, sizeof f->dir, "gc_report_test", &f->o, &f->db) != ST_OK)
        return -1;
    sto_tablet *t;
    st_err err;
    if (sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), &t,
                          &err) != ST_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_db_close_rm(f->db, f->dir);
    st_buf_free(&f->report);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return 0;
}

static void on_report(uint64_t tablet_id, const sto_gc_dropped *cells, size_t n, void *arg) {
    fixture *f = arg;
    pthread_mutex_lock(&f->mu);
    f->calls++;
    if (n > f->max_batch)
        f->max_batch = n;
    for (size_t i = 0; i < n; i++) {
        char head[32];
        int k = snprintf(head, sizeof head, "%" PRIu64 " ", tablet_id);
        st_buf_append(&f->report, head, (size_t)k);
        sto_cell c = {cells[i].row,   cells[i].family,  cells[i].qualifier,
                      cells[i].ts_us, ST_SLICE_LIT(""), 0};
        tu_append_cell(&f->report, &c);
    }
    pthread_mutex_unlock(&f->mu);
}

static const char *report_text(fixture *f) {
    st_buf_append_byte(&f->report, 0);
    f->report.len--;
    return (const char *)f->report.data;
}

static sto_tablet *tablet(fixture *f, uint64_t id) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, id, &t), ST_OK);
    return t;
}

static void write_row(fixture *f, uint64_t tablet, const char *row, const sto_mut *muts, size_t n,
                      uint64_t version) {
    sto_row_mut r = tu_row(tablet, row, muts, n, version);
    st_err err;
    assert_int_equal(sto_write(f->db, &r, 1, NULL, &err), ST_OK);
}

static void set1(fixture *f, uint64_t tablet, const char *row, st_slice fam, const char *qual,
                 int64_t ts, uint64_t version) {
    sto_mut m = tu_set_mut("x", qual, ts, "v");
    m.family = fam;
    write_row(f, tablet, row, &m, 1, version);
}

static void flush(fixture *f, uint64_t id) {
    st_err err;
    assert_int_equal(sto_tablet_flush(f->db, id, &err), ST_OK);
}

static void compact(fixture *f, uint64_t id) {
    st_err err;
    assert_int_equal(sto_tablet_compact(f->db, id, &err), ST_OK);
}

static void set_rules(fixture *f, uint64_t id) {
    sto_family_gc g[3] = {
        {ST_SLICE_LIT("ver"), {.kind = STO_GC_MAX_VERSIONS, .max_versions = 2}},
        {ST_SLICE_LIT("age"), {.kind = STO_GC_MAX_AGE, .max_age_us = HOUR_US}},
        {SYS, {.kind = STO_GC_MAX_AGE, .max_age_us = HOUR_US}},
    };
    st_err err;
    assert_int_equal(sto_tablet_set_gc(tablet(f, id), g, 3, &err), ST_OK);
}

static void test_reports_exactly_gc_garbage(void **state) {
    fixture *f = *state;
    st_slice ver = ST_SLICE_LIT("ver"), age = ST_SLICE_LIT("age"), keep = ST_SLICE_LIT("keep");
    /* a ver:q: 4 versions, ts 3 overwritten by a higher version: 2 and 1 are garbage. */
    for (int ts = 1; ts <= 4; ts++)
        set1(f, 1, "a", ver, "q", ts, V(ts));
    flush(f, 1);
    set1(f, 1, "a", ver, "q", 3, V(10));
    /* a ver:d: ts 4 deleted (hidden, not reported), so 3 and 2 are the newest two: 1 is garbage. */
    for (int ts = 1; ts <= 4; ts++)
        set1(f, 1, "a", ver, "d", ts, V(ts));
    sto_mut dcol = {.type = STO_MUT_DEL_COLUMN,
                    .family = ver,
                    .qualifier = ST_SLICE_LIT("d"),
                    .ts_start_us = 4,
                    .ts_end_us = 5};
    write_row(f, 1, "a", &dcol, 1, V(11));
    flush(f, 1);
    /* b age:x: one cell too old (reported), one young; age:y too old but deleted; an old record in
     * the system family goes by its rule without a report; keep has no rule. */
    set1(f, 1, "b", age, "x", T0_US - 2 * HOUR_US, V(20));
    set1(f, 1, "b", age, "x", T0_US - HOUR_US / 2, V(21));
    set1(f, 1, "b", age, "y", T0_US - 3 * HOUR_US, V(22));
    sto_mut dy = dcol;
    dy.family = age;
    dy.qualifier = ST_SLICE_LIT("y");
    dy.ts_start_us = 0;
    dy.ts_end_us = STO_TS_END_INF;
    write_row(f, 1, "b", &dy, 1, V(23));
    set1(f, 1, "b", SYS, "rec", T0_US - 2 * HOUR_US, V(24));
    set1(f, 1, "c", keep, "z", 1, V(25));
    set1(f, 1, "c", keep, "z", 2, V(26));
    set1(f, 1, "c", keep, "z", 3, V(27));
    /* d: a deleted row's garbage is not reported (the delete hid it first). */
    for (int ts = 1; ts <= 3; ts++)
        set1(f, 1, "d", ver, "q", ts, V(30 + ts));
    sto_mut drow = {.type = STO_MUT_DEL_ROW};
    write_row(f, 1, "d", &drow, 1, V(40));
    flush(f, 1);
    set_rules(f, 1);
    sto_tablet_set_gc_report(tablet(f, 1), on_report, f);
    compact(f, 1);
    char want[512];
    snprintf(want, sizeof want,
             "1 a ver:d@1=\n1 a ver:q@2=\n1 a ver:q@1=\n1 b age:x@%" PRId64 "=\n",
             T0_US - 2 * HOUR_US);
    assert_string_equal(report_text(f), want);
    assert_int_equal(f->calls, 1);

    /* Cleared: new garbage goes without a call. */
    sto_tablet_set_gc_report(tablet(f, 1), NULL, NULL);
    for (int ts = 1; ts <= 4; ts++)
        set1(f, 1, "a", ver, "q", ts, V(ts));
    flush(f, 1);
    compact(f, 1);
    assert_int_equal(f->calls, 1);
    assert_string_equal(report_text(f), want);
}

static void test_batches(void **state) {
    fixture *f = *state;
    enum { N = 2502 };
    sto_mut *m = calloc(N, sizeof *m);
    for (int i = 0; i < N; i++) {
        m[i] = tu_set_mut("ver", "q", i + 1, "v");
    }
    write_row(f, 1, "r", m, N, V(1));
    free(m);
    flush(f, 1);
    set_rules(f, 1);
    sto_tablet_set_gc_report(tablet(f, 1), on_report, f);
    compact(f, 1);
    assert_int_equal(f->max_batch, STO_GC_REPORT_BATCH);
    assert_int_equal(f->calls, 3);
    size_t lines = 0;
    for (size_t i = 0; i < f->report.len; i++)
        lines += f->report.data[i] == '\n';
    assert_int_equal(lines, N - 2);
    assert_non_null(strstr(report_text(f), "1 r ver:q@1=\n"));
    assert_null(strstr(report_text(f), "1 r ver:q@2501="));
}

static void test_split_child_reports_its_rows(void **state) {
    fixture *f = *state;
    const char *rows[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        for (int ts = 1; ts <= 3; ts++)
            set1(f, 1, rows[i], ST_SLICE_LIT("ver"), "q", ts, V(ts));
    flush(f, 1);
    set_rules(f, 1);
    sto_tablet_set_gc_report(tablet(f, 1), on_report, f);
    st_err err;
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("c"), 2, 3, &err), ST_OK);
    compact(f, 3); /* the children share the parent's table */
    assert_string_equal(report_text(f), "3 c ver:q@1=\n3 d ver:q@1=\n");
    st_buf_reset(&f->report);
    compact(f, 2);
    assert_string_equal(report_text(f), "2 a ver:q@1=\n2 b ver:q@1=\n");
}

/* A compaction the engine starts by itself reports from its worker thread. */
static void test_background_compaction_reports(void **state) {
    fixture *f = *state;
    f->o.compaction_trigger = 4; /* options are copied at open */
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    set_rules(f, 1);
    sto_tablet_set_gc_report(tablet(f, 1), on_report, f);
    st_slice age = ST_SLICE_LIT("age");
    for (int i = 0; i < 4; i++) { /* four small tables: a tier the workers merge */
        set1(f, 1, "a", age, "x", T0_US - 2 * HOUR_US + i, V(i + 1));
        set1(f, 1, "a", age, "y", T0_US, V(i + 1));
        flush(f, 1);
    }
    int calls = 0;
    for (int i = 0; i < 3000 && calls == 0; i++) { /* up to 30 s on a loaded machine */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&f->mu);
        calls = f->calls;
        pthread_mutex_unlock(&f->mu);
    }
    assert_int_equal(calls, 1);
    char want[512];
    int n = 0;
    for (int i = 3; i >= 0; i--)
        n += snprintf(want + n, sizeof want - (size_t)n, "1 a age:x@%" PRId64 "=\n",
                      T0_US - 2 * HOUR_US + i);
    pthread_mutex_lock(&f->mu);
    assert_string_equal(report_text(f), want);
    pthread_mutex_unlock(&f->mu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reports_exactly_gc_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_child_reports_its_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_background_compaction_reports, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
