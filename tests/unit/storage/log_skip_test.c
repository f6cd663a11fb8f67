/*
 * Damaged commit log records that nobody needs do not stop the engine's start: a flipped byte
 * in a record at or below every tablet's flushed point and every log holder's position is
 * skipped with a warning, every acknowledged row still reads, readers cannot ask for the
 * skipped records (ST_OUT_OF_RANGE, as for trimmed ones) and read every later one, and the
 * damaged segment stays accepted once it is no longer the last one. A flip in a record that
 * replay needs (after the flushed point) is still ST_DATA_LOSS, with or without
 * accept_data_loss; one that only a log holder (a peer cluster's shipper) has not passed is
 * ST_DATA_LOSS unless accept_data_loss (then the holder's reader jumps those records and loses
 * only them). A reader walking
 * a segment that recovery did not read goes past damage below the records it was asked for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>

#include "sto_test_util.h"

#define V(ts) STO_VERSION((ts), 0)
#define ROWS 200 /* per phase; one write (one log group) per row */

static int count_segments(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/log", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".log") != NULL;
    closedir(d);
    return n;
}

/* Bytes up to the last nonzero one: the records of a segment without its preallocated zeros
 * (every record here ends with a value byte 'v'). */
static long used_bytes(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    long used = 0, at = 0;
    int ch;
    while ((ch = fgetc(f)) != EOF) {
        at++;
        if (ch != 0)
            used = at;
    }
    fclose(f);
    return used;
}

static void write_rows(sto_db *db, const char *prefix, int n, int ts0, size_t val_bytes) {
    char row[32], val[8192];
    assert_true(val_bytes < sizeof val);
    memset(val, 'v', val_bytes);
    val[val_bytes] = 0;
    for (int i = 0; i < n; i++) {
        snprintf(row, sizeof row, "%s%05d", prefix, i);
        assert_int_equal(tu_set(db, 1, row, "f", "q", ts0 + i, val, V(ts0 + i + 1)), ST_OK);
    }
}

static void options(sto_options *o) {
    tu_small_options(o);
    o->memtable_bytes = 64 << 20;   /* only the explicit flush below */
    o->log_segment_bytes = 1 << 20; /* everything in one segment until the roll below */
}

typedef struct layout {
    char dir[512], seg[700];
    long a_lo, a_hi; /* bytes of the flushed rows' records (lsn 1..ROWS) */
    long b_lo, b_hi; /* bytes of the unflushed rows' records (lsn ROWS+1..2*ROWS) */
    st_buf want;     /* every acknowledged row */
} layout;

/* ROWS rows, flushed into an SSTable (flushed point lsn ROWS), then ROWS more left in the log
 * only; with hold, a log holder (a peer that acknowledged nothing) holds from lsn 1. */
static void make_db(layout *l, bool hold) {
    sto_options o;
    options(&o);
    tu_tmpdir(l->dir, sizeof l->dir, "log_skip");
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(l->dir, &o, &db, &err), ST_OK);
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    if (hold)
        assert_int_equal(sto_log_hold(db, "repl:west", 1, &err), ST_OK);
    assert_true(tu_first_log_segment(l->dir, l->seg, sizeof l->seg));
    l->a_lo = 4096;
    write_rows(db, "a", ROWS, 0, 200);
    l->a_hi = used_bytes(l->seg);
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    l->b_lo = used_bytes(l->seg);
    write_rows(db, "b", ROWS, ROWS, 200);
    l->b_hi = used_bytes(l->seg);
    assert_int_equal(sto_log_last_lsn(db), 2 * ROWS);
    st_buf_init(&l->want);
    assert_int_equal(tu_dump(db, 1, &l->want), ST_OK);
    sto_db_close(db);
    assert_int_equal(count_segments(l->dir), 1);
}

static void check_rows(sto_db *db, const char *want) {
    st_buf d;
    st_buf_init(&d);
    assert_int_equal(tu_dump(db, 1, &d), ST_OK);
    assert_string_equal((char *)d.data, want);
    st_buf_free(&d);
}

/* A reader below the skipped records gets ST_OUT_OF_RANGE; one from the replay point reads
 * every later record in order, with nothing left out. */
static void check_readers(sto_db *db) {
    sto_log_reader *r = NULL;
    st_err err;
    assert_int_equal(sto_log_reader_open(db, 1, &r, &err), ST_OUT_OF_RANGE);
    assert_non_null(strstr(err.msg, "damaged"));
    assert_int_equal(sto_log_reader_open(db, ROWS + 1, &r, &err), ST_OK);
    uint64_t lsn = 0, want = ROWS + 1, last = sto_log_last_lsn(db);
    st_slice payload;
    st_code rc;
    while ((rc = sto_log_reader_next_raw(r, &lsn, &payload, &err)) == ST_OK)
        assert_int_equal(lsn, want++);
    assert_int_equal(rc, ST_NOT_FOUND);
    assert_int_equal(want, last + 1);
    sto_log_reader_close(r);
}

/* A flip in a flushed record nobody holds: the start goes on and serves every row, also after
 * more writes, a holder asking for the skipped records, a restart, and a roll that leaves the
 * damaged segment an older one (still needed for the unflushed rows). */
static void test_unneeded_damage_skipped(void **state) {
    (void)state;
    for (int k = 1; k <= 5; k++) { /* spread over the records: headers, lengths, payloads */
        layout l;
        make_db(&l, false);
        assert_true(tu_flip_byte(l.seg, l.a_lo + (l.a_hi - l.a_lo) * k / 6));
        sto_options o;
        options(&o);
        sto_db *db;
        st_err err;
        st_code rc = sto_db_open(l.dir, &o, &db, &err);
        if (rc != ST_OK)
            fail_msg("flip %d: open gave %s: %s", k, st_code_name(rc), err.msg);
        check_rows(db, (char *)l.want.data);
        check_readers(db);
        /* A holder asking for unreadable records holds from the first readable one: it does
         * not make the next start count the damage as needed. */
        assert_int_equal(sto_log_hold(db, "repl:late", 1, &err), ST_OK);
        write_rows(db, "c", 10, 2 * ROWS, 200);
        st_buf want2;
        st_buf_init(&want2);
        assert_int_equal(tu_dump(db, 1, &want2), ST_OK);
        sto_db_close(db);
        assert_int_equal(sto_db_open(l.dir, &o, &db, &err), ST_OK);
        check_rows(db, (char *)want2.data);
        check_readers(db);
        /* Past the segment's size: the damaged one is no longer the last. */
        write_rows(db, "d", 200, 3 * ROWS, 6000);
        assert_int_equal(tu_dump(db, 1, &want2), ST_OK);
        sto_db_close(db);
        assert_true(count_segments(l.dir) > 1);
        assert_int_equal(sto_db_open(l.dir, &o, &db, &err), ST_OK);
        check_rows(db, (char *)want2.data);
        check_readers(db);
        sto_db_close(db);
        st_buf_free(&want2);
        st_buf_free(&l.want);
        tu_rmrf(l.dir);
    }
}

static void expect_refused(const layout *l, bool accept, const char *says) {
    sto_options o;
    options(&o);
    o.accept_data_loss = accept;
    sto_db *db = NULL;
    st_err err;
    assert_int_equal(sto_db_open(l->dir, &o, &db, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, says));
}

/* A flip in a record replay needs (after the flushed point, before the last group): refused,
 * also with accept_data_loss (dropping the intact records after it would lose them). */
static void test_damage_needed_by_replay_refused(void **state) {
    (void)state;
    layout l;
    make_db(&l, false);
    assert_true(tu_flip_byte(l.seg, l.b_lo + (l.b_hi - l.b_lo) / 2));
    expect_refused(&l, false, "later group");
    expect_refused(&l, true, "later group");
    st_buf_free(&l.want);
    tu_rmrf(l.dir);
}

/* A holder's reader from lsn 1 over a hole (damage skipped with accept_data_loss): every record
 * but one stretch [*lo, *hi) in the flushed ones, which the flip damaged; the intact records
 * before it are read too. */
static void read_around_hole(sto_db *db, uint64_t *lo, uint64_t *hi) {
    sto_log_reader *r = NULL;
    st_err err;
    assert_int_equal(sto_log_reader_open(db, 1, &r, &err), ST_OK);
    uint64_t lsn = 0, next = 1;
    st_slice payload;
    st_code rc;
    *lo = *hi = 0;
    while ((rc = sto_log_reader_next_raw(r, &lsn, &payload, &err)) == ST_OK) {
        if (lsn != next) {
            assert_int_equal(*lo, 0); /* one hole */
            *lo = next;
            *hi = lsn;
        }
        next = lsn + 1;
    }
    if (rc != ST_NOT_FOUND)
        fail_msg("reader: %s: %s", st_code_name(rc), err.msg);
    assert_int_equal(next, sto_log_last_lsn(db) + 1);
    sto_log_reader_close(r);
    assert_true(*lo > ROWS / 4 && *lo < *hi && *hi <= ROWS);
}

/* A flip in a flushed record that a peer cluster's shipper still has to send: refused, saying
 * that restoring from the peer would lose the rows and how to skip; with accept_data_loss the
 * node starts with every row, and the holder's reader gets every record but the damaged ones:
 * a hole, not a floor. The holder stays below them, so a restart needs the flag again until it
 * has passed them. */
static void test_damage_needed_by_holder(void **state) {
    (void)state;
    layout l;
    make_db(&l, true);
    assert_true(tu_flip_byte(l.seg, l.a_lo + (l.a_hi - l.a_lo) / 2));
    expect_refused(&l, false, "log holder");
    expect_refused(&l, false, "--accept-data-loss");
    sto_options o;
    options(&o);
    o.accept_data_loss = true;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(l.dir, &o, &db, &err), ST_OK);
    check_rows(db, (char *)l.want.data);
    uint64_t lo, hi;
    read_around_hole(db, &lo, &hi);
    sto_db_close(db);
    expect_refused(&l, false, "log holder");
    assert_int_equal(sto_db_open(l.dir, &o, &db, &err), ST_OK);
    read_around_hole(db, &lo, &hi);
    assert_int_equal(sto_log_hold(db, "repl:west", hi, &err), ST_OK); /* shipped past it */
    sto_db_close(db);
    o.accept_data_loss = false;
    assert_int_equal(sto_db_open(l.dir, &o, &db, &err), ST_OK);
    check_rows(db, (char *)l.want.data);
    sto_db_close(db);
    st_buf_free(&l.want);
    tu_rmrf(l.dir);
}

/* A holder in an older segment than the replay point's, which recovery does not read: a flip
 * in that segment below the holder's position does not stop the holder's reader, which goes
 * past it to every record it needs. */
static void test_holder_reads_past_old_damage(void **state) {
    (void)state;
    sto_options o;
    options(&o);
    char dir[512], seg[700];
    tu_tmpdir(dir, sizeof dir, "log_skip_old");
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    assert_true(tu_first_log_segment(dir, seg, sizeof seg));
    write_rows(db, "a", ROWS, 0, 200);
    long a_hi = used_bytes(seg);
    assert_int_equal(sto_log_hold(db, "repl:west", ROWS - 10, &err), ST_OK);
    write_rows(db, "d", 200, ROWS, 6000); /* rolls into a second segment */
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    write_rows(db, "e", 10, ROWS + 200, 200);
    st_buf want;
    st_buf_init(&want);
    assert_int_equal(tu_dump(db, 1, &want), ST_OK);
    sto_db_close(db);
    assert_true(count_segments(dir) > 1);
    assert_true(tu_flip_byte(seg, 4096 + (a_hi - 4096) / 4));
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    check_rows(db, (char *)want.data);
    sto_log_reader *r = NULL;
    assert_int_equal(sto_log_reader_open(db, ROWS - 10, &r, &err), ST_OK);
    uint64_t lsn = 0, next = ROWS - 10;
    st_slice payload;
    st_code rc;
    while ((rc = sto_log_reader_next_raw(r, &lsn, &payload, &err)) == ST_OK)
        assert_int_equal(lsn, next++);
    if (rc != ST_NOT_FOUND)
        fail_msg("reader: %s: %s", st_code_name(rc), err.msg);
    assert_int_equal(next, sto_log_last_lsn(db) + 1);
    sto_log_reader_close(r);
    sto_db_close(db);
    st_buf_free(&want);
    tu_rmrf(dir);
}

int main(void) {
    st_log_set_level(ST_LOG_ERROR + 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unneeded_damage_skipped),
        cmocka_unit_test(test_damage_needed_by_replay_refused),
        cmocka_unit_test(test_damage_needed_by_holder),
        cmocka_unit_test(test_holder_reads_past_old_damage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
