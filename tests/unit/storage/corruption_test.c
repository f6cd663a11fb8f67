/*
 * Proves damaged files give clear errors and never a crash, and that the damage stays in its
 * tablet: bytes flipped at random places in one tablet's SSTables (many seeded rounds on copies
 * of a closed db) make that tablet's reads either correct or ST_DATA_LOSS (then the tablet turns
 * read-only and refuses writes) while the other tablet reads and writes normally; a missing
 * SSTable does the same; a flipped byte in the commit log either is a torn tail (open succeeds)
 * or ST_DATA_LOSS with a message, and in the last log segment a flip before the final write is
 * ST_DATA_LOSS (never a silent loss of the later acknowledged writes) while one inside it loses at
 * most that write; a damaged manifest fails the open with ST_DATA_LOSS naming it.
 * STRATA_SEED replays the flips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>

#include "sto_test_util.h"

#define V(ts) STO_VERSION((ts), 0)
#define ROUNDS 25
#define MAX_FILES 32

typedef struct files {
    char name[MAX_FILES][256];
    int n;
} files;

static void list_ssts(const char *dir, files *out) {
    char path[600];
    snprintf(path, sizeof path, "%s/sst", dir);
    out->n = 0;
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && out->n < MAX_FILES)
        if (strstr(e->d_name, ".sst"))
            snprintf(out->name[out->n++], sizeof out->name[0], "%s", e->d_name);
    closedir(d);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void copy_dir(const char *from, const char *to) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp -r %s/. %s", from, to);
    assert_int_equal(system(cmd), 0);
}

#define FILL_BATCH 100

/* Rows prefix00000.. written in batches of FILL_BATCH row mutations per sto_write. */
static void fill(sto_db *db, uint64_t id, const char *prefix, int n) {
    static char rows[FILL_BATCH][32], vals[FILL_BATCH][64];
    sto_mut m[FILL_BATCH];
    sto_row_mut r[FILL_BATCH];
    for (int i = 0; i < n; i += FILL_BATCH) {
        int k = 0;
        for (; k < FILL_BATCH && i + k < n; k++) {
            snprintf(rows[k], sizeof rows[k], "%s%05d", prefix, i + k);
            snprintf(vals[k], sizeof vals[k], "value-%d-%s", (i + k) * 7919, prefix);
            m[k] = tu_set_mut("f", "q", i + k, vals[k]);
            r[k] = tu_row(id, rows[k], &m[k], 1, V(i + k + 1));
        }
        st_err err;
        assert_int_equal(sto_write(db, r, (size_t)k, NULL, &err), ST_OK);
    }
}

typedef struct pristine {
    char dir[512];
    files a_files; /* SSTables of tablet 1 (rows "a...") */
    char want_a[1 << 17], want_b[1 << 17];
} pristine;

/* Tablet 1 = [ "", "m" ) flushed on its own, tablet 2 = [ "m", "" ) flushed after. */
static void make_pristine(pristine *p) {
    tu_tmpdir(p->dir, sizeof p->dir, "corruption_src");
    sto_options o;
    tu_small_options(&o);
    o.compaction_trigger = 100;
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(p->dir, &o, &db, &err), ST_OK);
    assert_int_equal(sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                       ST_SLICE_LIT("m"), NULL, &err),
                     ST_OK);
    assert_int_equal(sto_tablet_create(db, 2, ST_SLICE_LIT("t"), ST_SLICE_LIT("m"),
                                       ST_SLICE_LIT(""), NULL, &err),
                     ST_OK);
    fill(db, 1, "a", 1500);
    assert_int_equal(sto_tablet_flush(db, 1, &err), ST_OK);
    list_ssts(p->dir, &p->a_files);
    fill(db, 2, "x", 1500);
    assert_int_equal(sto_tablet_flush(db, 2, &err), ST_OK);
    st_buf d;
    st_buf_init(&d);
    assert_int_equal(tu_dump(db, 1, &d), ST_OK);
    assert_true(d.len < sizeof p->want_a);
    memcpy(p->want_a, d.data, d.len + 1);
    assert_int_equal(tu_dump(db, 2, &d), ST_OK);
    memcpy(p->want_b, d.data, d.len + 1);
    st_buf_free(&d);
    sto_db_close(db);
}

/* Tablet 2 is intact: reads match and it takes writes. */
static void check_other_tablet(sto_db *db, const pristine *p) {
    st_buf d;
    st_buf_init(&d);
    assert_int_equal(tu_dump(db, 2, &d), ST_OK);
    assert_string_equal((char *)d.data, p->want_b);
    assert_int_equal(tu_set(db, 2, "zz", "f", "q", 1, "after", V(99999)), ST_OK);
    st_buf_free(&d);
}

/* Tablet 1 is either intact or reports DATA_LOSS and then refuses writes. */
static int check_damaged_tablet(sto_db *db, const pristine *p) {
    st_buf d;
    st_buf_init(&d);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(db, 1, &t), ST_OK);
    st_code rc = tu_dump_range(t, NULL, false, &d);
    int bad = 0;
    if (rc == ST_OK) {
        /* a flip the checksums cannot see (bloom bits) may only hide rows from point reads */
        assert_string_equal((char *)d.data, p->want_a);
    } else {
        assert_int_equal(rc, ST_DATA_LOSS);
        sto_tablet_info in;
        sto_tablet_info_get(t, &in);
        assert_true(in.read_only);
        assert_int_equal(tu_set(db, 1, "b", "f", "q", 1, "v", V(1)), ST_DATA_LOSS);
        bad = 1;
    }
    /* point reads of every 100th row: correct, empty (bloom damage), or an error; no crash */
    for (int i = 0; i < 1500; i += 100) {
        char row[16];
        snprintf(row, sizeof row, "a%05d", i);
        sto_range r = {st_slice_cstr(row), false, st_slice_cstr(row), true};
        rc = tu_dump_range(t, &r, false, &d);
        assert_true(rc == ST_OK || rc == ST_DATA_LOSS);
    }
    st_buf_free(&d);
    return bad;
}

static void test_corruption_sst_flips(void **state) {
    (void)state;
    st_log_set_level(ST_LOG_ERROR + 1); /* every round logs the damage it meets */
    pristine *p = calloc(1, sizeof *p);
    make_pristine(p);
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("corruption_test"));
    sto_options o;
    tu_small_options(&o);
    o.compaction_trigger = 100;
    int detected = 0;
    for (int round = 0; round < ROUNDS; round++) {
        char dir[512];
        tu_tmpdir(dir, sizeof dir, "corruption_round");
        copy_dir(p->dir, dir);
        const char *victim = p->a_files.name[st_rng_below(&rng, (uint64_t)p->a_files.n)];
        char path[1200];
        snprintf(path, sizeof path, "%s/sst/%s", dir, victim);
        long size = file_size(path);
        for (int k = 0; k < 3; k++)
            assert_true(tu_flip_byte(path, (long)st_rng_below(&rng, (uint64_t)size)));
        sto_db *db;
        st_err err;
        assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
        detected += check_damaged_tablet(db, p);
        check_other_tablet(db, p);
        sto_db_close(db);
        tu_rmrf(dir);
    }
    st_log_set_level(ST_LOG_INFO);
    fprintf(stderr, "corruption_test: %d of %d rounds detected damage\n", detected, ROUNDS);
    assert_true(detected > 0);
    tu_rmrf(p->dir);
    free(p);
}

static void test_corruption_missing_sst(void **state) {
    (void)state;
    st_log_set_level(ST_LOG_ERROR + 1);
    pristine *p = calloc(1, sizeof *p);
    make_pristine(p);
    char path[1200];
    snprintf(path, sizeof path, "%s/sst/%s", p->dir, p->a_files.name[0]);
    assert_int_equal(remove(path), 0);
    sto_options o;
    tu_small_options(&o);
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(p->dir, &o, &db, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(db, 1, &t), ST_OK);
    sto_snapshot *s;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "missing or corrupt"));
    assert_int_equal(tu_set(db, 1, "b", "f", "q", 1, "v", V(1)), ST_DATA_LOSS);
    check_other_tablet(db, p);
    sto_db_close(db);
    /* still reported after another reopen: the file stays listed, nothing is silently lost */
    assert_int_equal(sto_db_open(p->dir, &o, &db, &err), ST_OK);
    assert_int_equal(sto_tablet_get(db, 1, &t), ST_OK);
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_DATA_LOSS);
    sto_db_close(db);
    st_log_set_level(ST_LOG_INFO);
    tu_rmrf(p->dir);
    free(p);
}

static void test_corruption_log_flips(void **state) {
    (void)state;
    st_log_set_level(ST_LOG_ERROR + 1);
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("corruption_test_log"));
    sto_options o;
    tu_small_options(&o);
    o.memtable_bytes = 64 << 20; /* everything stays in the log */
    int data_loss = 0;
    for (int round = 0; round < 10; round++) {
        char dir[512];
        tu_tmpdir(dir, sizeof dir, "corruption_log");
        sto_db *db;
        st_err err;
        assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
        assert_int_equal(sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                           ST_SLICE_LIT(""), NULL, &err),
                         ST_OK);
        fill(db, 1, "a", 300);
        char big[2048];
        memset(big, 'v', sizeof big - 1);
        big[sizeof big - 1] = 0;
        for (int i = 0; i < 200; i++) /* past one log segment, so the flip is not in the tail */
            assert_int_equal(tu_set(db, 1, "b", "f", "q", i, big, V(1000 + i)), ST_OK);
        sto_db_close(db);
        char seg[700];
        assert_true(tu_first_log_segment(dir, seg, sizeof seg));
        long size = file_size(seg);
        assert_true(tu_flip_byte(seg, (long)st_rng_below(&rng, (uint64_t)size)));
        st_err_clear(&err);
        st_code rc = sto_db_open(dir, &o, &db, &err);
        assert_true(rc == ST_OK || rc == ST_DATA_LOSS);
        if (rc == ST_DATA_LOSS) {
            assert_true(strlen(err.msg) > 10);
            data_loss++;
        } else {
            st_buf d;
            st_buf_init(&d);
            assert_int_equal(tu_dump(db, 1, &d), ST_OK); /* a torn tail: what is left reads */
            st_buf_free(&d);
            sto_db_close(db);
        }
        tu_rmrf(dir);
    }
    st_log_set_level(ST_LOG_INFO);
    assert_true(data_loss > 0);
}

/* Path of the last log segment (largest name) into out. */
static void last_log_segment(const char *dir, char *out, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/log", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    out[0] = 0;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".log") && (!out[0] || strcmp(e->d_name, out + strlen(path) + 1) > 0))
            snprintf(out, cap, "%s/%s", path, e->d_name);
    closedir(d);
    assert_true(out[0] != 0);
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

static void dump_copy(sto_db *db, st_buf *out) {
    st_buf_init(out);
    assert_int_equal(tu_dump(db, 1, out), ST_OK);
}

/* A flipped byte in the LAST log segment: in a record that later groups follow it is
 * ST_DATA_LOSS (the acknowledged rows after it would otherwise vanish silently); in the final
 * group (one write) it is ST_DATA_LOSS too, since the engine closed cleanly and the log's close
 * wrote a checkpoint naming that group (a crash before it would have made it a torn tail). */
static void test_corruption_log_flips_last_segment(void **state) {
    (void)state;
    st_log_set_level(ST_LOG_ERROR + 1);
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("corruption_test_log_last"));
    sto_options o;
    tu_small_options(&o);
    o.memtable_bytes = 64 << 20; /* everything stays in the log */
    int data_loss = 0, torn = 0;
    for (int round = 0; round < 12; round++) {
        char dir[512], seg_before[700], seg[700];
        tu_tmpdir(dir, sizeof dir, "corruption_log_last");
        sto_db *db;
        st_err err;
        assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
        assert_int_equal(sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                           ST_SLICE_LIT(""), NULL, &err),
                         ST_OK);
        fill(db, 1, "a", 300);
        char big[2048];
        memset(big, 'v', sizeof big - 1);
        big[sizeof big - 1] = 0;
        for (int i = 0; i < 199; i++)
            assert_int_equal(tu_set(db, 1, "b", "f", "q", i, big, V(1000 + i)), ST_OK);
        st_buf want_minus, want_full; /* without and with the final write */
        dump_copy(db, &want_minus);
        last_log_segment(dir, seg_before, sizeof seg_before);
        long final_start = used_bytes(seg_before);
        assert_int_equal(tu_set(db, 1, "b", "f", "q", 199, big, V(1000 + 199)), ST_OK);
        dump_copy(db, &want_full);
        sto_db_close(db);
        last_log_segment(dir, seg, sizeof seg);
        if (strcmp(seg, seg_before) != 0)
            final_start = 4096; /* the final write opened a segment of its own */
        long used = used_bytes(seg);
        assert_true(used > final_start);
        /* Mostly before the final group, sometimes inside it; in the records, after the
         * segment's header page (whose checkpoint slots tolerate one bad slot). */
        long off = round % 4 == 3
                       ? final_start + (long)st_rng_below(&rng, (uint64_t)(used - final_start))
                       : 4096 + (long)st_rng_below(&rng, (uint64_t)(final_start - 4096));
        assert_true(tu_flip_byte(seg, off));
        st_err_clear(&err);
        st_code rc = sto_db_open(dir, &o, &db, &err);
        if (off < final_start || round % 4 == 3) {
            if (rc != ST_DATA_LOSS)
                fail_msg("round %d: flip at %ld of %s (final group from %ld): open gave %s, "
                         "expected DATA_LOSS",
                         round, off, seg, final_start, st_code_name(rc));
            assert_non_null(strstr(err.msg, ".log"));
            assert_non_null(strstr(err.msg, "restore"));
            data_loss++;
        } else {
            assert_int_equal(rc, ST_OK);
            st_buf d;
            dump_copy(db, &d);
            assert_true(strcmp((char *)d.data, (char *)want_full.data) == 0 ||
                        strcmp((char *)d.data, (char *)want_minus.data) == 0);
            st_buf_free(&d);
            sto_db_close(db);
            torn++;
        }
        st_buf_free(&want_minus);
        st_buf_free(&want_full);
        tu_rmrf(dir);
    }
    st_log_set_level(ST_LOG_INFO);
    fprintf(stderr, "corruption_test: last log segment: %d DATA_LOSS, %d torn final group\n",
            data_loss, torn);
    assert_true(data_loss == 12 && torn == 0);
}

static void test_corruption_manifest(void **state) {
    (void)state;
    pristine *p = calloc(1, sizeof *p);
    make_pristine(p);
    char path[1200];
    snprintf(path, sizeof path, "%s/MANIFEST", p->dir);
    assert_true(tu_flip_byte(path, file_size(path) / 2));
    sto_options o;
    tu_small_options(&o);
    sto_db *db = NULL;
    st_err err;
    assert_int_equal(sto_db_open(p->dir, &o, &db, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "MANIFEST"));
    assert_non_null(strstr(err.msg, "corrupt"));
    tu_rmrf(p->dir);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corruption_sst_flips),
        cmocka_unit_test(test_corruption_missing_sst),
        cmocka_unit_test(test_corruption_log_flips),
        cmocka_unit_test(test_corruption_log_flips_last_segment),
        cmocka_unit_test(test_corruption_manifest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
