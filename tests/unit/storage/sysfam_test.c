/* sysfam_test — proves the storage rules for system families (names starting with 0x00, where the
 * node keeps a row's change history): plain iterators never show them, STO_ITER_SYSTEM shows
 * only them (forward and reverse), a row tombstone (DeleteFromRow, DropRowRange) leaves them in
 * reads, flushes and compactions while family / column deletes and GC rules act on them as on any
 * family, and a split child sees only its own rows' system cells. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sto_test_util.h"

#define SYS ST_SLICE_LIT("\0changes")
#define HOUR_US ((int64_t)3600 * 1000000)
#define DAY_US (24 * HOUR_US)
#define T0_US (1000 * HOUR_US) /* the fake clock's start */
/* Versions are commit times near the clock, so tombstones stay within their grace period. */
#define V(us) STO_VERSION(T0_US + (us), 0)

typedef struct fixture {
    char dir[512];
    sto_options o;
    st_clock clock;
    sto_db *db;
    sto_tablet *t;
    st_buf out;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* only explicit compactions here */
    f->o.write_stall_tables = 200;
    st_clock_fake_init(&f->clock, T0_US);
    f->o.clock = &f->clock;
    st_buf_init(&f->out);
    if (tu_db_open_fresh(f->dir, sizeof f->dir, "sysfam_test", &f->o, &f->db) != ST_OK)
        return -1;
    st_err err;
    if (sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), &f->t,
                          &err) != ST_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_db_close_rm(f->db, f->dir);
    st_buf_free(&f->out);
    free(f);
    return 0;
}

static sto_mut set_mut(st_slice fam, const char *qual, int64_t ts, const char *val) {
    sto_mut m = tu_set_mut("x", qual, ts, val);
    m.family = fam;
    return m;
}

static void write_row(fixture *f, uint64_t tablet, const char *row, const sto_mut *muts, size_t n,
                      uint64_t version) {
    sto_row_mut r = tu_row(tablet, row, muts, n, version);
    st_err err;
    assert_int_equal(sto_write(f->db, &r, 1, NULL, &err), ST_OK);
}

static void set_sys(fixture *f, uint64_t tablet, const char *row, const char *qual, int64_t ts,
                    uint64_t version) {
    sto_mut m = set_mut(SYS, qual, ts, "rec");
    write_row(f, tablet, row, &m, 1, version);
}

/* Every cell of tablet id the iterator with these flags returns, as text in f->out. */
static const char *dump(fixture *f, uint64_t id, unsigned flags, bool reverse) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, id, &t), ST_OK);
    st_buf_reset(&f->out);
    sto_snapshot *s;
    st_err err;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_OK);
    sto_iter *it;
    assert_int_equal(sto_iter_new_flags(s, NULL, reverse, flags, &it, &err), ST_OK);
    sto_cell c;
    st_code rc;
    while ((rc = sto_iter_next(it, &c, &err)) == ST_OK)
        tu_append_cell(&f->out, &c);
    assert_int_equal(rc, ST_NOT_FOUND);
    sto_iter_free(it);
    sto_snapshot_free(s);
    st_buf_append_byte(&f->out, 0);
    return (const char *)f->out.data;
}

static const char *dump_user(fixture *f, uint64_t id) {
    assert_int_equal(tu_dump(f->db, id, &f->out), ST_OK);
    return (const char *)f->out.data;
}

static void flush(fixture *f, uint64_t id) {
    st_err err;
    assert_int_equal(sto_tablet_flush(f->db, id, &err), ST_OK);
}

static void compact(fixture *f, uint64_t id) {
    st_err err;
    assert_int_equal(sto_tablet_compact(f->db, id, &err), ST_OK);
}

/* r1: user and system cells; r2: system cells only; r3: user cells only. */
static void write_mixed(fixture *f) {
    sto_mut r1[3] = {set_mut(ST_SLICE_LIT("cf"), "a", 5, "v1"), set_mut(SYS, "q1", 7, "rec1"),
                     set_mut(SYS, "q2", 8, "rec2")};
    write_row(f, 1, "r1", r1, 3, V(10));
    set_sys(f, 1, "r2", "q3", 9, V(11));
    sto_mut r3 = set_mut(ST_SLICE_LIT("cf"), "b", 6, "v3");
    write_row(f, 1, "r3", &r3, 1, V(12));
}

#define USER_CELLS "r1 cf:a@5=v1\nr3 cf:b@6=v3\n"
#define SYS_CELLS "r1 \\x00changes:q1@7=rec1\nr1 \\x00changes:q2@8=rec2\nr2 \\x00changes:q3@9=rec\n"

static void check_mixed(fixture *f) {
    assert_string_equal(dump_user(f, 1), USER_CELLS);
    assert_string_equal(dump(f, 1, STO_ITER_USER, false), USER_CELLS);
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), SYS_CELLS);
    assert_string_equal(dump(f, 1, STO_ITER_USER | STO_ITER_SYSTEM, false),
                        "r1 \\x00changes:q1@7=rec1\nr1 \\x00changes:q2@8=rec2\nr1 cf:a@5=v1\n"
                        "r2 \\x00changes:q3@9=rec\nr3 cf:b@6=v3\n");
    /* Reverse: rows descending, cells of a row still in family order. */
    assert_string_equal(dump(f, 1, STO_ITER_USER, true), "r3 cf:b@6=v3\nr1 cf:a@5=v1\n");
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, true),
                        "r2 \\x00changes:q3@9=rec\n"
                        "r1 \\x00changes:q1@7=rec1\nr1 \\x00changes:q2@8=rec2\n");
    assert_string_equal(dump(f, 1, STO_ITER_USER | STO_ITER_SYSTEM, true),
                        "r3 cf:b@6=v3\nr2 \\x00changes:q3@9=rec\n"
                        "r1 \\x00changes:q1@7=rec1\nr1 \\x00changes:q2@8=rec2\nr1 cf:a@5=v1\n");
}

static void test_iterators_split_user_and_system(void **state) {
    fixture *f = *state;
    assert_true(sto_family_is_system(SYS));
    assert_false(sto_family_is_system(ST_SLICE_LIT("cf")));
    assert_false(sto_family_is_system(ST_SLICE_LIT("")));
    write_mixed(f);
    check_mixed(f); /* memtable */
    flush(f, 1);
    check_mixed(f); /* one SSTable */
    compact(f, 1);
    check_mixed(f);
    /* A point read of a row holding only system cells finds nothing. */
    sto_range r2 = {ST_SLICE_LIT("r2"), false, ST_SLICE_LIT("r2"), true};
    assert_int_equal(tu_dump_range(f->t, &r2, false, &f->out), ST_OK);
    assert_int_equal(f->out.len, 0);
}

/* Many system cells before few user cells and the reverse: whichever kind the iterator skips, it
 * skips all of it (the reader steps, then seeks past the rest), in both directions. */
static void test_skipping_long_runs(void **state) {
    fixture *f = *state;
    char q[16];
    for (int row = 0; row < 3; row++) {
        char rk[8];
        snprintf(rk, sizeof rk, "r%d", row);
        for (int i = 0; i < 40; i++) {
            snprintf(q, sizeof q, "s%02d", i);
            set_sys(f, 1, rk, q, 100 + i, V(100 + i));
            snprintf(q, sizeof q, "u%02d", i);
            sto_mut m = set_mut(ST_SLICE_LIT("cf"), q, 100 + i, "v");
            if (row != 1 || i < 2)
                write_row(f, 1, rk, &m, 1, V(200 + i));
        }
        /* The lowest a user family name can start with: a seek past the system families must
         * not skip it. */
        sto_mut low = set_mut(ST_SLICE_LIT("\x01low"), "q", 1, "v");
        write_row(f, 1, rk, &low, 1, V(300));
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int rev = 0; rev < 2; rev++) {
            dump(f, 1, STO_ITER_USER, rev);
            size_t user = 0, sys = 0;
            for (size_t i = 0; i < f->out.len; i++)
                user += f->out.data[i] == '\n';
            assert_null(strstr((const char *)f->out.data, "changes"));
            dump(f, 1, STO_ITER_SYSTEM, rev);
            for (size_t i = 0; i < f->out.len; i++)
                sys += f->out.data[i] == '\n';
            assert_null(strstr((const char *)f->out.data, " cf:"));
            assert_int_equal(user, 40 + 2 + 40 + 3);
            assert_int_equal(sys, 3 * 40);
        }
        flush(f, 1);
    }
}

/* Bytes of data blocks one scan of tablet 1 with these flags reads from disk, on a fresh open
 * (empty block cache). */
static uint64_t scan_bytes(fixture *f, unsigned flags) {
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, 1, &t), ST_OK);
    sto_snapshot *s;
    st_err err;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_OK);
    sto_iter *it;
    assert_int_equal(sto_iter_new_flags(s, NULL, false, flags, &it, &err), ST_OK);
    sto_cell c;
    while (sto_iter_next(it, &c, &err) == ST_OK)
        ;
    sto_iter_free(it);
    uint64_t n = sto_snapshot_read_bytes(s);
    sto_snapshot_free(s);
    return n;
}

/* A system-only scan of rows with big user cells reads the row's first blocks, not all of them:
 * after a few user entries it seeks to the next row. */
static void test_system_scan_skips_user_blocks(void **state) {
    fixture *f = *state;
    char val[1500];
    memset(val, 'v', sizeof val - 1);
    val[sizeof val - 1] = 0;
    for (int row = 0; row < 20; row++) {
        char rk[8], q[8];
        snprintf(rk, sizeof rk, "r%02d", row);
        set_sys(f, 1, rk, "s", 1, V(1));
        for (int i = 0; i < 30; i++) {
            snprintf(q, sizeof q, "u%02d", i);
            sto_mut m = set_mut(ST_SLICE_LIT("cf"), q, 1, val);
            write_row(f, 1, rk, &m, 1, V(2));
        }
    }
    flush(f, 1);
    uint64_t sys = scan_bytes(f, STO_ITER_SYSTEM), user = scan_bytes(f, STO_ITER_USER);
    assert_true(sys > 0);
    assert_true(sys * 3 < user);
    f->t = NULL; /* the reopen made a new tablet object */
}

static void test_row_delete_keeps_system_cells(void **state) {
    fixture *f = *state;
    write_mixed(f);
    flush(f, 1); /* the tombstone lands in a newer table than the cells */
    sto_mut del = {.type = STO_MUT_DEL_ROW};
    write_row(f, 1, "r1", &del, 1, V(20));
    write_row(f, 1, "r2", &del, 1, V(20));
    /* A system cell written with a row delete after it in the same mutation stays too. */
    sto_mut both[3] = {set_mut(ST_SLICE_LIT("cf"), "c", 30, "gone"),
                       set_mut(SYS, "q4", 30, "r4"),
                       {.type = STO_MUT_DEL_ROW}};
    write_row(f, 1, "r4", both, 3, V(30));
    const char *sys = "r1 \\x00changes:q1@7=rec1\nr1 \\x00changes:q2@8=rec2\n"
                      "r2 \\x00changes:q3@9=rec\nr4 \\x00changes:q4@30=r4\n";
    for (int step = 0; step < 3; step++) {
        assert_string_equal(dump_user(f, 1), "r3 cf:b@6=v3\n");
        assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), sys);
        if (step == 0)
            flush(f, 1);
        else
            compact(f, 1); /* full: the row tombstones are within the grace, so they stay */
    }
    /* Past the grace a full compaction drops the row tombstones: the system cells are still there
     * and the user cells do not come back. */
    f->clock.fake_now_us += 8 * DAY_US;
    compact(f, 1);
    assert_string_equal(dump_user(f, 1), "r3 cf:b@6=v3\n");
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), sys);
    /* Family and column deletes act on system families as on any family. */
    sto_mut dcol = {.type = STO_MUT_DEL_COLUMN,
                    .family = SYS,
                    .qualifier = ST_SLICE_LIT("q1"),
                    .ts_start_us = 0,
                    .ts_end_us = STO_TS_END_INF};
    write_row(f, 1, "r1", &dcol, 1, V(8 * DAY_US + 40));
    sto_mut dfam = {.type = STO_MUT_DEL_FAMILY, .family = SYS};
    write_row(f, 1, "r2", &dfam, 1, V(8 * DAY_US + 40));
    const char *left = "r1 \\x00changes:q2@8=rec2\nr4 \\x00changes:q4@30=r4\n";
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), left);
    flush(f, 1);
    compact(f, 1);
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), left);
}

static void test_drop_prefix_keeps_system_cells(void **state) {
    fixture *f = *state;
    write_mixed(f);
    flush(f, 1);
    st_err err;
    assert_int_equal(sto_tablet_drop_prefix(f->db, 1, ST_SLICE_LIT(""), V(50), &err), ST_OK);
    assert_string_equal(dump_user(f, 1), "");
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), SYS_CELLS);
    flush(f, 1);
    compact(f, 1);
    assert_string_equal(dump_user(f, 1), "");
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), SYS_CELLS);
}

static void set_gc(sto_tablet *t, st_slice fam, sto_gc_rule rule) {
    sto_family_gc g = {fam, rule};
    st_err err;
    assert_int_equal(sto_tablet_set_gc(t, &g, 1, &err), ST_OK);
}

static void test_gc_max_age_trims_system_family(void **state) {
    fixture *f = *state;
    int64_t now = T0_US;
    set_sys(f, 1, "r1", "old", now - 2 * HOUR_US, V(1));
    set_sys(f, 1, "r1", "new", now - HOUR_US / 2, V(2));
    flush(f, 1);
    set_gc(f->t, SYS, (sto_gc_rule){.kind = STO_GC_MAX_AGE, .max_age_us = HOUR_US});
    char want[128];
    snprintf(want, sizeof want, "r1 \\x00changes:new@%" PRId64 "=rec\n", now - HOUR_US / 2);
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), want); /* reads hide it already */
    compact(f, 1);
    /* Gone from the files: without the rule the old record does not come back. */
    set_gc(f->t, SYS, (sto_gc_rule){.kind = STO_GC_NONE});
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM, false), want);
}

static void test_split_child_sees_its_system_cells(void **state) {
    fixture *f = *state;
    const char *rows[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        sto_mut m[2] = {set_mut(ST_SLICE_LIT("cf"), "u", 1, "v"), set_mut(SYS, "s", 2, "rec")};
        write_row(f, 1, rows[i], m, 2, V(1 + i));
    }
    flush(f, 1);
    st_err err;
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("c"), 2, 3, &err), ST_OK);
    for (int pass = 0; pass < 2; pass++) {
        assert_string_equal(dump(f, 2, STO_ITER_SYSTEM, false),
                            "a \\x00changes:s@2=rec\nb \\x00changes:s@2=rec\n");
        assert_string_equal(dump(f, 3, STO_ITER_SYSTEM, true),
                            "d \\x00changes:s@2=rec\nc \\x00changes:s@2=rec\n");
        assert_string_equal(dump_user(f, 3), "c cf:u@1=v\nd cf:u@1=v\n");
        compact(f, 2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_iterators_split_user_and_system, setup, teardown),
        cmocka_unit_test_setup_teardown(test_skipping_long_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_system_scan_skips_user_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_delete_keeps_system_cells, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_prefix_keeps_system_cells, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_max_age_trims_system_family, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_child_sees_its_system_cells, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
