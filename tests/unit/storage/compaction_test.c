/*
 * Proves background compaction keeps a tablet's SSTables bounded under sustained writes from
 * several threads (sampled while writing and at the end), that tight backpressure settings make
 * writers wait rather than fail, that GC (max age with a fake clock) and old tombstones are
 * physically dropped by compaction, and that a full disk fails writes with RESOURCE_EXHAUSTED
 * without losing any acknowledged write (checked after reopening on a healthy disk), and that
 * the memtable budget and the unflushed-log bound force flushes of memtables that never fill,
 * and that a periodic full compaction drops old tombstones of an idle tablet. Sorted runs:
 * sequentially written tables (disjoint key ranges) form one run, so they never trigger a
 * compaction or a stall; a compaction keeps an input that overlaps no other input as it is (a
 * trivial move: same file), cuts its outputs around it, and reads stay right, also after reopen.
 * Big (settled) runs of repeated overwrites still tier among themselves. Reads pay for
 * compactions: a tablet whose point reads merge several runs and a memtable, and whose runs
 * are due by count but too unlike in size to tier, is compacted whole once the reads have paid
 * enough (its idle memtable frozen and taken in first), ending on one table.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "sto_test_util.h"

#define V(ts) STO_VERSION((ts), 0)
#define WRITERS 4
#define ROWS_PER_WRITER 3000

typedef struct writer {
    sto_db *db;
    int idx;
    int failures;
} writer;

static void *writer_main(void *arg) {
    writer *w = arg;
    char row[32], val[128];
    st_rng rng;
    st_rng_seed(&rng, (uint64_t)w->idx + 1);
    for (int i = 0; i < ROWS_PER_WRITER; i++) {
        snprintf(row, sizeof row, "r%06d-%d", (int)st_rng_below(&rng, 100000), w->idx);
        for (size_t j = 0; j + 1 < sizeof val; j++)
            val[j] = (char)('a' + st_rng_below(&rng, 26));
        val[sizeof val - 1] = 0;
        if (tu_set(w->db, 1, row, "f", "q", i, val, V(i + 1)) != ST_OK)
            w->failures++;
    }
    return NULL;
}

static int sst_count(sto_db *db) {
    sto_tablet *t;
    if (sto_tablet_get(db, 1, &t) != ST_OK)
        return -1;
    sto_tablet_info in;
    sto_tablet_info_get(t, &in);
    return in.sst_count;
}

static void run_writers(sto_db *db, int *max_seen) {
    pthread_t th[WRITERS];
    writer ws[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        ws[i] = (writer){db, i, 0};
        pthread_create(&th[i], NULL, writer_main, &ws[i]);
    }
    *max_seen = 0;
    for (int k = 0; k < 200; k++) { /* samples while the writers run */
        int n = sst_count(db);
        if (n > *max_seen)
            *max_seen = n;
        usleep(5000);
    }
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ws[i].failures, 0);
    }
}

/* Opens the db in dir with o and, when create, its tablet 1 over all keys. */
static sto_db *open_db(const char *dir, const sto_options *o, bool create) {
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, o, &db, &err), ST_OK);
    if (create)
        assert_int_equal(sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                           ST_SLICE_LIT(""), NULL, &err),
                         ST_OK);
    return db;
}

static void test_compaction_bounds_sst_count(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_bound");
    sto_options o;
    tu_small_options(&o);
    o.compaction_trigger = 4;
    o.write_stall_tables = 12;
    sto_db *db = open_db(dir, &o, true);
    int max_seen;
    run_writers(db, &max_seen);
    /* stalled writers stop at write_stall_tables; flushes already frozen may add a few */
    assert_true(max_seen <= o.write_stall_tables + 4);
    sto_stats st;
    sto_db_stats(db, &st);
    assert_true(st.flushes > 20);
    assert_true(st.compactions > 0);
    assert_true(sst_count(db) < o.write_stall_tables);
    st_buf a;
    st_buf_init(&a);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    char *before = strdup((char *)a.data);
    sto_db_close(db);
    db = open_db(dir, &o, false);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    assert_string_equal((char *)a.data, before);
    free(before);
    st_buf_free(&a);
    sto_db_close(db);
    tu_rmrf(dir);
}

static void test_compaction_backpressure_stalls_not_fails(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_stall");
    sto_options o;
    tu_small_options(&o);
    o.compaction_trigger = 2;
    o.write_stall_tables = 3;
    o.background_threads = 1;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    int max_seen;
    run_writers(db, &max_seen); /* asserts every write succeeded */
    sto_stats st;
    sto_db_stats(db, &st);
    fprintf(stderr, "stalls_us=%llu flushes=%llu compactions=%llu max_sst=%d\n",
            (unsigned long long)st.stalls_us, (unsigned long long)st.flushes,
            (unsigned long long)st.compactions, max_seen);
    assert_true(st.compactions > 0);
    sto_db_close(db);
    tu_rmrf(dir);
}

static void test_compaction_gc_applied(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_gc");
    st_clock clk;
    int64_t day = 24LL * 3600 * 1000000;
    st_clock_fake_init(&clk, 100 * day);
    sto_options o;
    tu_small_options(&o);
    o.clock = &clk;
    o.tombstone_grace_us = day;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), &t, &err),
        ST_OK);
    int64_t now = 100 * day;
    assert_int_equal(tu_set(db, 1, "r", "aged", "q", now - 10 * day, "old", V(now - 10 * day)),
                     ST_OK);
    assert_int_equal(tu_set(db, 1, "r", "aged", "q", now - 1000, "fresh", V(now - 1000)), ST_OK);
    assert_int_equal(tu_set(db, 1, "gone", "f", "q", 1, "x", V(now - 5 * day)), ST_OK);
    sto_mut dr = {.type = STO_MUT_DEL_ROW};
    sto_row_mut r = tu_row(1, "gone", &dr, 1, V(now - 3 * day));
    assert_int_equal(sto_write(db, &r, 1, NULL, &err), ST_OK);
    sto_family_gc g = {ST_SLICE_LIT("aged"), {.kind = STO_GC_MAX_AGE, .max_age_us = day}};
    assert_int_equal(sto_tablet_set_gc(t, &g, 1, &err), ST_OK);
    st_buf a;
    st_buf_init(&a);
    char want[128];
    snprintf(want, sizeof want, "r aged:q@%lld=fresh\n", (long long)(now - 1000));
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    assert_string_equal((char *)a.data, want);
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    assert_int_equal(sto_tablet_compact(db, 1, &err), ST_OK);
    /* the rule removed, the old cell stays gone: compaction dropped it */
    assert_int_equal(sto_tablet_set_gc(t, NULL, 0, &err), ST_OK);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    assert_string_equal((char *)a.data, want);
    /* the row tombstone is older than the grace period, the cell it hid is gone: one cell left */
    sto_tablet_info in;
    sto_tablet_info_get(t, &in);
    assert_int_equal(in.sst_count, 1);
    sto_mut dr2 = {.type = STO_MUT_DEL_ROW};
    r = tu_row(1, "r", &dr2, 1, V(now - 2 * day));
    assert_int_equal(sto_write(db, &r, 1, NULL, &err), ST_OK);
    sto_mut df = {.type = STO_MUT_DEL_FAMILY, .family = ST_SLICE_LIT("aged")};
    r = tu_row(1, "r", &df, 1, V(now));
    assert_int_equal(sto_write(db, &r, 1, NULL, &err), ST_OK);
    __atomic_store_n(&clk.fake_now_us, now + 2 * day,
                     __ATOMIC_RELAXED); /* deletes now past grace */
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    assert_int_equal(sto_tablet_compact(db, 1, &err), ST_OK);
    sto_tablet_info_get(t, &in);
    assert_int_equal(in.sst_count, 0); /* nothing left to keep */
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    assert_string_equal((char *)a.data, "");
    st_buf_free(&a);
    sto_db_close(db);
    tu_rmrf(dir);
}

static void test_compaction_disk_full_no_loss(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_full");
    st_env *fenv = st_env_fault_new(st_env_posix());
    sto_options o;
    tu_small_options(&o);
    o.env = fenv;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    st_log_set_level(ST_LOG_ERROR); /* every failed group logs a warning */
    st_env_fault_set(fenv, 300, ST_RESOURCE_EXHAUSTED);
    int acked = 0, failed = 0;
    char row[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(row, sizeof row, "row%05d", i);
        st_code rc = tu_set(db, 1, row, "f", "q", 1, "value-value-value-value", V(i + 1));
        if (rc == ST_OK) {
            assert_int_equal(failed, 0); /* once failing, the node stops acknowledging */
            acked++;
        } else {
            assert_true(rc == ST_RESOURCE_EXHAUSTED || rc == ST_UNAVAILABLE || rc == ST_INTERNAL);
            failed++;
            if (failed > 20)
                break;
        }
    }
    assert_true(acked > 0 && failed > 0);
    /* reads keep working on the full disk */
    st_buf a;
    st_buf_init(&a);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    sto_db_close(db);
    st_env_fault_set(fenv, -1, ST_OK);
    st_log_set_level(ST_LOG_INFO);
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    int rows = 0;
    for (const char *p = (char *)a.data; *p; p = strchr(p, '\n') + 1)
        rows++;
    assert_true(rows >= acked);
    for (int i = 0; i < acked; i++) {
        snprintf(row, sizeof row, "row%05d f:q", i);
        assert_non_null(strstr((char *)a.data, row));
    }
    st_buf_free(&a);
    sto_db_close(db);
    fenv->ops->destroy(fenv);
    tu_rmrf(dir);
}

/* Memtables that never fill up on their own are still flushed when the node-wide memtable budget
 * or the unflushed log bound is exceeded, and the log is trimmed behind them. */
static void test_compaction_memory_and_log_pressure_flush(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_pressure");
    sto_options o;
    tu_small_options(&o);
    o.memtable_bytes = 64u << 20;
    o.memtable_budget_bytes = 1u << 20;
    o.log_max_unflushed_bytes = 1u << 20;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    for (uint64_t id = 1; id <= 4; id++) {
        char start[8];
        snprintf(start, sizeof start, "%c", (char)('a' + id - 1));
        assert_int_equal(sto_tablet_create(db, id, ST_SLICE_LIT("t"), st_slice_cstr(start),
                                           id == 4
                                               ? ST_SLICE_LIT("")
                                               : st_slice_make((const char[]){(char)('a' + id)}, 1),
                                           NULL, &err),
                         ST_OK);
    }
    char row[32], val[4096];
    memset(val, 'v', sizeof val - 1);
    val[sizeof val - 1] = 0;
    for (int i = 0; i < 1500; i++) {
        int tab = i % 4;
        snprintf(row, sizeof row, "%c%05d", 'a' + tab, i);
        val[i % 4000] = (char)('a' + i % 26);
        assert_int_equal(tu_set(db, (uint64_t)tab + 1, row, "f", "q", i, val, V(i + 1)), ST_OK);
    }
    sto_stats st;
    sto_db_stats(db, &st);
    fprintf(stderr, "pressure: flushes=%llu memtable_bytes=%llu log_bytes=%llu\n",
            (unsigned long long)st.flushes, (unsigned long long)st.memtable_bytes,
            (unsigned long long)st.log_bytes);
    assert_true(st.flushes > 0);
    sto_db_close(db);
    tu_rmrf(dir);
}

/* A tablet written once long ago pins every log segment after its record, however much of the
 * log other tablets flushed. A node whose disk filled up before the unflushed log reached
 * log_max_unflushed_bytes stayed full for good, its flushed log segments kept (64 MiB of a
 * 128 MiB disk in a run of full_disk_test's steps). Commits failing for lack of space now count
 * as log pressure: the pinning tablet is flushed and the segments go. */
static void test_compaction_full_disk_frees_flushed_log(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_full_log");
    st_env *fenv = st_env_fault_new(st_env_posix());
    sto_options o;
    tu_small_options(&o);
    o.env = fenv;
    o.memtable_bytes = 64u << 20;           /* nothing freezes on its own */
    o.log_max_unflushed_bytes = 1ull << 40; /* far beyond the disk */
    o.log_segment_bytes = 64u << 10;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                       ST_SLICE_LIT("b"), NULL, &err),
                     ST_OK);
    assert_int_equal(sto_tablet_create(db, 2, ST_SLICE_LIT("t"), ST_SLICE_LIT("b"),
                                       ST_SLICE_LIT(""), NULL, &err),
                     ST_OK);
    assert_int_equal(tu_set(db, 1, "a", "f", "q", 1, "pin", V(1)), ST_OK);
    char row[32], val[4096];
    memset(val, 'v', sizeof val - 1);
    val[sizeof val - 1] = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(row, sizeof row, "b%05d", i);
        assert_int_equal(tu_set(db, 2, row, "f", "q", 1, val, V(i + 2)), ST_OK);
    }
    assert_int_equal(sto_tablet_flush(db, 2, &err), ST_OK);
    sto_stats st;
    sto_db_stats(db, &st);
    assert_true(st.log_bytes > 8 * o.log_segment_bytes); /* tablet 1 pins it */
    st_log_set_level(ST_LOG_ERROR);
    st_env_fault_set(fenv, 0, ST_RESOURCE_EXHAUSTED);
    assert_int_equal(tu_set(db, 2, "c", "f", "q", 1, val, V(300)), ST_RESOURCE_EXHAUSTED);
    /* room for a small table and the manifest, not known to the log until a commit succeeds */
    st_env_fault_set(fenv, -1, ST_OK);
    do { /* no deadline: CTest's timeout catches a log that is never trimmed */
        usleep(10000);
        sto_db_stats(db, &st);
    } while (st.log_bytes > 2 * o.log_segment_bytes);
    st_log_set_level(ST_LOG_INFO);
    sto_db_close(db);
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    st_buf a;
    st_buf_init(&a);
    assert_int_equal(tu_dump(db, 1, &a), ST_OK);
    assert_non_null(strstr((char *)a.data, "a f:q"));
    assert_int_equal(tu_dump(db, 2, &a), ST_OK);
    int rows = 0;
    for (const char *p = (char *)a.data; *p; p = strchr(p, '\n') + 1)
        rows++;
    assert_int_equal(rows, 200);
    st_buf_free(&a);
    sto_db_close(db);
    fenv->ops->destroy(fenv);
    tu_rmrf(dir);
}

/* With no writes and a single table, the periodic full compaction still drops tombstones once
 * they pass the grace period (the engine clock is moved by hand; the test waits for the worker). */
static void test_compaction_periodic_full_drops_tombstones(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_periodic");
    st_clock clk;
    int64_t day = 24LL * 3600 * 1000000;
    st_clock_fake_init(&clk, 100 * day);
    sto_options o;
    tu_small_options(&o);
    o.clock = &clk;
    o.tombstone_grace_us = day;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), &t, &err),
        ST_OK);
    assert_int_equal(tu_set(db, 1, "r", "f", "q", 1, "x", V(100 * day)), ST_OK);
    sto_mut dr = {.type = STO_MUT_DEL_ROW};
    sto_row_mut r = tu_row(1, "r", &dr, 1, V(100 * day + 1));
    assert_int_equal(sto_write(db, &r, 1, NULL, &err), ST_OK);
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    sto_tablet_info in;
    sto_tablet_info_get(t, &in);
    assert_int_equal(in.sst_count, 1);
    __atomic_store_n(&clk.fake_now_us, 103 * day, __ATOMIC_RELAXED);
    do { /* no deadline: CTest's timeout catches a compaction that never comes */
        usleep(10000);
        sto_tablet_info_get(t, &in);
    } while (in.sst_count != 0);
    sto_stats st;
    sto_db_stats(db, &st);
    assert_true(st.compactions >= 1);
    sto_db_close(db);
    tu_rmrf(dir);
}

/* Writes rows <prefix>000 .. (count of them, step apart) and flushes them into one table. */
static void flush_rows(sto_db *db, const char *prefix, int from, int count, int step, int ver) {
    char row[32];
    st_err err;
    for (int i = 0; i < count; i++) {
        snprintf(row, sizeof row, "%s%03d", prefix, from + i * step);
        assert_int_equal(tu_set(db, 1, row, "f", "q", 1, prefix, V(ver + i)), ST_OK);
    }
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
}

/* The highest SSTable file number in dir/sst (0 when none). */
static uint64_t newest_sst(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/sst", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    uint64_t best = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".sst") == 0) {
            uint64_t v = strtoull(e->d_name, NULL, 10);
            best = v > best ? v : best;
        }
    }
    closedir(d);
    return best;
}

static bool sst_exists(const char *dir, uint64_t number) {
    char path[600];
    snprintf(path, sizeof path, "%s/sst/%020" PRIu64 ".sst", dir, number);
    return access(path, F_OK) == 0;
}

/* A db for the sorted-run tests; output_bytes: sto_options.compaction_output_bytes (0: the
 * default). create: also tablet 1 over every row. */
static sto_db *open_runs_db_with(const char *dir, sto_options *o, size_t output_bytes,
                                 bool create) {
    tu_small_options(o);
    o->compaction_trigger = 3;
    o->write_stall_tables = 8; /* all runs are merged at 6 */
    if (output_bytes)
        o->compaction_output_bytes = output_bytes;
    return open_db(dir, o, create);
}

static sto_db *open_runs_db(const char *dir, sto_options *o) {
    return open_runs_db_with(dir, o, 0, false);
}

/* Twelve flushes of ascending, disjoint rows are one sorted run: past compaction_trigger and
 * write_stall_tables in tables, yet no compaction runs and no write waits for one. */
static void test_compaction_sequential_tables_one_run(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_seqrun");
    sto_options o;
    sto_db *db = open_runs_db(dir, &o);
    st_err err;
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    for (int k = 0; k < 12; k++)
        flush_rows(db, "s", k * 50, 50, 1, 1 + k * 50);
    sto_stats st;
    sto_db_stats(db, &st);
    assert_int_equal(st.compactions, 0);
    assert_int_equal(st.stalls_us, 0);
    assert_int_equal(sst_count(db), 12);
    sto_db_close(db);
    tu_rmrf(dir);
}

/* Tables a (rows a000..a099), c and e are one run; then tables overlapping a and e make three
 * runs and a compaction. c overlaps no other input: it keeps its file, and the outputs are cut
 * around it (a-rows, c, e-rows: three tables). Reads are unchanged, also after reopening. */
static void test_compaction_trivial_move(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_move");
    sto_options o;
    sto_db *db = open_runs_db(dir, &o);
    st_err err;
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    flush_rows(db, "a", 0, 100, 1, 1);
    flush_rows(db, "c", 0, 100, 1, 101);
    uint64_t c_file = newest_sst(dir);
    flush_rows(db, "e", 0, 100, 1, 201);
    flush_rows(db, "a", 50, 10, 2, 301); /* overlaps a: a second run */
    sto_mut dr = {.type = STO_MUT_DEL_ROW};
    sto_row_mut r = tu_row(1, "e020", &dr, 1, V(400));
    assert_int_equal(sto_write(db, &r, 1, NULL, &err), ST_OK);
    flush_rows(db, "e", 50, 10, 2, 401); /* tombstone of e020 + e050..e068: overlaps e */
    flush_rows(db, "e", 55, 1, 1, 501);  /* overlaps the last one: a third run */
    st_buf before, after;
    st_buf_init(&before);
    st_buf_init(&after);
    assert_int_equal(tu_dump(db, 1, &before), ST_OK);
    assert_null(strstr((char *)before.data, "e020 "));
    assert_non_null(strstr((char *)before.data, "e021 "));
    while (sst_count(db) != 3) /* no deadline: CTest's timeout catches a compaction never run */
        usleep(10000);
    sto_stats st;
    sto_db_stats(db, &st);
    assert_int_equal(st.compactions, 1);
    assert_true(sst_exists(dir, c_file));
    assert_int_equal(tu_dump(db, 1, &after), ST_OK);
    assert_string_equal((char *)after.data, (char *)before.data);
    sto_db_close(db);
    assert_true(sst_exists(dir, c_file));
    db = open_runs_db(dir, &o);
    assert_int_equal(sst_count(db), 3);
    assert_int_equal(tu_dump(db, 1, &after), ST_OK);
    assert_string_equal((char *)after.data, (char *)before.data);
    sto_db_stats(db, &st);
    assert_int_equal(st.compactions, 0); /* the three tables are one run: nothing due */
    st_buf_free(&before);
    st_buf_free(&after);
    sto_db_close(db);
    tu_rmrf(dir);
}

/* Runs of compaction_output_bytes / 2 or more are settled: they never count toward stalls, but
 * they still tier among themselves. Six overwrites of the same 100 rows, each flushed as one
 * settled run: the first three merge (one run, about three times the size), then the next three
 * (each within 2x of the others, not of the merged run). Without the settled tier no compaction
 * would ever run here and the runs would pile up until the periodic full compaction. */
static void test_compaction_settled_runs_tier(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_settled");
    sto_options o;
    sto_db *db = open_runs_db_with(dir, &o, 1024, true); /* every flushed table is settled */
    for (int k = 0; k < 6; k++)
        flush_rows(db, "a", 0, 100, 1, 1 + k * 100);
    st_buf before, after;
    st_buf_init(&before);
    st_buf_init(&after);
    assert_int_equal(tu_dump(db, 1, &before), ST_OK);
    sto_stats st;
    do { /* no deadline: CTest's timeout catches a compaction never run */
        usleep(10000);
        sto_db_stats(db, &st);
    } while (st.compactions < 2);
    assert_int_equal(st.stalls_us, 0);
    assert_int_equal(tu_dump(db, 1, &after), ST_OK);
    assert_string_equal((char *)after.data, (char *)before.data);
    sto_db_close(db);
    st_buf_free(&before);
    st_buf_free(&after);
    tu_rmrf(dir);
}

/* Writes rows p000..p(n-1), each with a value of vbytes (letters), at version ver + i. */
static void write_rows(sto_db *db, int n, size_t vbytes, int ver) {
    char row[32];
    char *val = malloc(vbytes + 1);
    assert_non_null(val);
    st_rng rng;
    st_rng_seed(&rng, (uint64_t)ver);
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < vbytes; j++)
            val[j] = (char)('a' + st_rng_below(&rng, 26));
        val[vbytes] = 0;
        snprintf(row, sizeof row, "p%03d", i);
        assert_int_equal(tu_set(db, 1, row, "f", "q", 1, val, V(ver + i)), ST_OK);
    }
    free(val);
}

/* Point reads of every row, repeated until the tablet is one table (no deadline: CTest's
 * timeout catches a compaction that never comes). Returns the reads made. */
static long read_until_one_table(sto_db *db, int rows) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(db, 1, &t), ST_OK);
    st_buf out;
    st_buf_init(&out);
    long reads = 0;
    while (sst_count(db) != 1) {
        for (int i = 0; i < rows; i++, reads++) {
            char row[32];
            snprintf(row, sizeof row, "p%03d", i);
            sto_range r = {st_slice_cstr(row), false, st_slice_cstr(row), true};
            assert_int_equal(tu_dump_range(t, &r, false, &out), ST_OK);
            assert_non_null(strstr((char *)out.data, row));
        }
    }
    st_buf_free(&out);
    return reads;
}

/* Three overwrites of the same rows flushed as runs of ~2.7, ~7 and ~18 MB (each more than
 * twice the last: due by count with compaction_trigger 3, but no size tier), and a few rows in
 * the memtable. No write comes after; point reads merge three runs and the memtable, so the
 * reads' debt makes the engine freeze and flush the idle memtable and compact all four tables
 * into one. Contents are unchanged. */
static void test_compaction_read_triggered(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "compaction_reads");
    sto_options o;
    tu_small_options(&o);
    o.memtable_bytes = 64u << 20; /* one flush per run */
    o.compaction_trigger = 3;
    o.write_stall_tables = 100;
    sto_db *db = open_db(dir, &o, true);
    st_err err;
    const int rows = 600;
    const size_t vbytes[] = {6000, 16000, 40000};
    for (int k = 0; k < 3; k++) {
        write_rows(db, rows, vbytes[k], 1 + k * rows);
        assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    }
    write_rows(db, 10, 100, 1 + 3 * rows);
    assert_int_equal(sst_count(db), 3);
    sto_stats st;
    sto_db_stats(db, &st);
    uint64_t flushes = st.flushes;
    st_buf before, after;
    st_buf_init(&before);
    st_buf_init(&after);
    assert_int_equal(tu_dump(db, 1, &before), ST_OK);
    long reads = read_until_one_table(db, rows);
    assert_true(reads > 0);
    sto_db_stats(db, &st);
    assert_true(st.compactions >= 1);
    assert_true(st.flushes > flushes); /* the idle memtable went in too */
    assert_int_equal(tu_dump(db, 1, &after), ST_OK);
    assert_string_equal((char *)after.data, (char *)before.data);
    sto_db_close(db);
    st_buf_free(&before);
    st_buf_free(&after);
    tu_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compaction_bounds_sst_count),
        cmocka_unit_test(test_compaction_backpressure_stalls_not_fails),
        cmocka_unit_test(test_compaction_gc_applied),
        cmocka_unit_test(test_compaction_disk_full_no_loss),
        cmocka_unit_test(test_compaction_memory_and_log_pressure_flush),
        cmocka_unit_test(test_compaction_full_disk_frees_flushed_log),
        cmocka_unit_test(test_compaction_periodic_full_drops_tombstones),
        cmocka_unit_test(test_compaction_sequential_tables_one_run),
        cmocka_unit_test(test_compaction_trivial_move),
        cmocka_unit_test(test_compaction_settled_runs_tier),
        cmocka_unit_test(test_compaction_read_triggered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
