/*
 * Proves tablet splits are metadata changes that lose nothing: both children list the parent's
 * SSTables (no new files), each reads exactly its half (forward and reverse), the parent id is
 * gone, compactions of one child rewrite only its rows and the shared files go only when neither
 * child lists them, splits survive a reopen (with unflushed writes to children), children split
 * again, writers racing a split see every acknowledged write on the right child, a split waits
 * for a background flush when asked whether it is quick, and a compaction racing a split gives
 * way or finishes without losing a row.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <unistd.h>

#include "sto_test_util.h"

#define V(ts) STO_VERSION((ts), 0)

typedef struct fixture {
    char dir[512];
    sto_options o;
    sto_db *db;
    st_buf a, b;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* only explicit compactions here */
    f->o.write_stall_tables = 200;
    st_buf_init(&f->a);
    st_buf_init(&f->b);
    if (tu_db_open_fresh(f->dir, sizeof f->dir, "split_test", &f->o, &f->db) != ST_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_db_close_rm(f->db, f->dir);
    st_buf_free(&f->a);
    st_buf_free(&f->b);
    free(f);
    return 0;
}

static void reopen(fixture *f) {
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
}

static int count_files(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s/sst | grep -c '\\.sst$'", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = 0;
        pclose(p);
    }
    return n;
}

/* Lines of dump whose row (text before the first space) is in [lo, hi) (hi "" = open). */
static void filter(const char *dump, const char *lo, const char *hi, st_buf *out) {
    st_buf_reset(out);
    const char *p = dump;
    while (*p) {
        const char *nl = strchr(p, '\n');
        const char *sp = strchr(p, ' ');
        size_t rl = (size_t)(sp - p);
        char row[128];
        snprintf(row, sizeof row, "%.*s", (int)rl, p);
        if (strcmp(row, lo) >= 0 && (!*hi || strcmp(row, hi) < 0))
            st_buf_append(out, p, (size_t)(nl - p + 1));
        p = nl + 1;
    }
    st_buf_append_byte(out, 0);
    out->len--;
}

/* Tablet 1 of table "t", covering every row. */
static void create_whole(fixture *f) {
    st_err err;
    assert_int_equal(sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                       ST_SLICE_LIT(""), NULL, &err),
                     ST_OK);
}

static void fill(fixture *f, uint64_t id, int n, int version) {
    char row[16], val[32];
    for (int i = 0; i < n; i++) {
        snprintf(row, sizeof row, "%c%04d", 'a' + i % 26, i);
        snprintf(val, sizeof val, "v%d-%d", version, i);
        assert_int_equal(tu_set(f->db, id, row, "f", "q", version, val, V(version * 10000 + i)),
                         ST_OK);
    }
}

static const char *dump(fixture *f, uint64_t id, st_buf *b) {
    assert_int_equal(tu_dump(f->db, id, b), ST_OK);
    return (const char *)b->data;
}

static void test_split_shares_ssts(void **state) {
    fixture *f = *state;
    st_err err;
    create_whole(f);
    fill(f, 1, 1500, 1);
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    fill(f, 1, 300, 2); /* unflushed at the split: the split flushes it */
    char *all = strdup(dump(f, 1, &f->a));
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("m"), 10, 11, &err), ST_OK);
    sto_tablet *l, *r, *p;
    assert_int_equal(sto_tablet_get(f->db, 1, &p), ST_NOT_FOUND);
    assert_int_equal(sto_tablet_get(f->db, 10, &l), ST_OK);
    assert_int_equal(sto_tablet_get(f->db, 11, &r), ST_OK);
    sto_tablet_info li, ri;
    sto_tablet_info_get(l, &li);
    sto_tablet_info_get(r, &ri);
    assert_int_equal(li.sst_count, ri.sst_count);
    assert_true(li.sst_count >= 1);
    assert_int_equal(count_files(f->dir), li.sst_count); /* the same files, no copies */
    assert_true(st_slice_eq(li.end, ST_SLICE_LIT("m")) && st_slice_eq(ri.start, ST_SLICE_LIT("m")));
    filter(all, "", "m", &f->b);
    assert_string_equal(dump(f, 10, &f->a), (char *)f->b.data);
    filter(all, "m", "", &f->b);
    assert_string_equal(dump(f, 11, &f->a), (char *)f->b.data);
    /* reverse reads of a child stay inside it */
    assert_int_equal(tu_dump_range(l, NULL, true, &f->a), ST_OK);
    assert_true(f->a.len > 0 && f->a.data[0] == 'l');
    assert_int_equal(tu_set(f->db, 1, "a", "f", "q", 1, "v", V(1)), ST_NOT_FOUND);
    assert_int_equal(tu_set(f->db, 10, "n", "f", "q", 1, "v", V(1)), ST_OUT_OF_RANGE);
    assert_int_equal(tu_set(f->db, 11, "n", "f", "q", 1, "v", V(1)), ST_OK);
    assert_int_equal(sto_tablet_split(f->db, 10, ST_SLICE_LIT("n"), 20, 21, &err),
                     ST_INVALID_ARGUMENT);
    assert_int_equal(sto_tablet_split(f->db, 10, ST_SLICE_LIT("c"), 20, 11, &err),
                     ST_ALREADY_EXISTS);
    free(all);
}

static void test_split_compaction_of_children(void **state) {
    fixture *f = *state;
    st_err err;
    create_whole(f);
    fill(f, 1, 800, 1);
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    fill(f, 1, 800, 2);
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    char *all = strdup(dump(f, 1, &f->a));
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("k"), 2, 3, &err), ST_OK);
    int shared = count_files(f->dir);
    assert_int_equal(sto_tablet_compact(f->db, 2, &err), ST_OK);
    /* the left child has its own file now; the right still reads the shared ones */
    assert_int_equal(count_files(f->dir), shared + 1);
    filter(all, "", "k", &f->b);
    assert_string_equal(dump(f, 2, &f->a), (char *)f->b.data);
    filter(all, "k", "", &f->b);
    assert_string_equal(dump(f, 3, &f->a), (char *)f->b.data);
    assert_int_equal(sto_tablet_compact(f->db, 3, &err), ST_OK);
    assert_int_equal(count_files(f->dir), 2);
    assert_string_equal(dump(f, 3, &f->a), (char *)f->b.data);
    sto_tablet *l;
    assert_int_equal(sto_tablet_get(f->db, 2, &l), ST_OK);
    sto_tablet_info li;
    sto_tablet_info_get(l, &li);
    assert_int_equal(li.sst_count, 1);
    reopen(f);
    assert_string_equal(dump(f, 3, &f->a), (char *)f->b.data);
    filter(all, "", "k", &f->b);
    assert_string_equal(dump(f, 2, &f->a), (char *)f->b.data);
    free(all);
}

static void test_split_reopen(void **state) {
    fixture *f = *state;
    st_err err;
    assert_int_equal(sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT("b"),
                                       ST_SLICE_LIT("y"), NULL, &err),
                     ST_OK);
    char row[16];
    for (int i = 0; i < 400; i++) {
        snprintf(row, sizeof row, "%c%04d", 'b' + i % 23, i);
        assert_int_equal(tu_set(f->db, 1, row, "f", "q", 1, "x", V(i + 1)), ST_OK);
    }
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("h"), 1, 2, &err), ST_OK);
    assert_int_equal(sto_tablet_split(f->db, 2, ST_SLICE_LIT("p"), 2, 3, &err), ST_OK);
    /* unflushed writes to the children, replayed from the log after reopen */
    assert_int_equal(tu_set(f->db, 1, "c", "f", "q", 2, "left", V(9000)), ST_OK);
    assert_int_equal(tu_set(f->db, 2, "i", "f", "q", 2, "mid", V(9001)), ST_OK);
    assert_int_equal(tu_set(f->db, 3, "x", "f", "q", 2, "right", V(9002)), ST_OK);
    char *d1 = strdup(dump(f, 1, &f->a)), *d2 = strdup(dump(f, 2, &f->a)),
         *d3 = strdup(dump(f, 3, &f->a));
    reopen(f);
    assert_string_equal(dump(f, 1, &f->a), d1);
    assert_string_equal(dump(f, 2, &f->a), d2);
    assert_string_equal(dump(f, 3, &f->a), d3);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, 3, &t), ST_OK);
    sto_tablet_info info;
    sto_tablet_info_get(t, &info);
    assert_true(st_slice_eq(info.start, ST_SLICE_LIT("p")) &&
                st_slice_eq(info.end, ST_SLICE_LIT("y")));
    free(d1);
    free(d2);
    free(d3);
}

/* ---- writers racing splits ---- */

#define RACE_WRITERS 4
#define RACE_ROWS 400

typedef struct racer {
    fixture *f;
    int idx;
    int acked;
} racer;

/* The tablet covering a row after the splits below: ids by range. */
static uint64_t route(sto_db *db, const char *row) {
    static const uint64_t ids[] = {1, 2, 3, 4, 5};
    for (size_t i = 0; i < 5; i++) {
        sto_tablet *t;
        if (sto_tablet_get(db, ids[i], &t) != ST_OK)
            continue;
        sto_tablet_info in;
        sto_tablet_info_get(t, &in);
        st_slice r = st_slice_cstr(row);
        if (st_slice_cmp(r, in.start) >= 0 && (!in.end.len || st_slice_cmp(r, in.end) < 0))
            return ids[i];
    }
    return 0;
}

static void *race_main(void *arg) {
    racer *rc = arg;
    char row[32];
    for (int i = 0; i < RACE_ROWS; i++) {
        snprintf(row, sizeof row, "%c-w%d-%04d", 'a' + (i * 7 + rc->idx) % 26, rc->idx, i);
        for (;;) {
            uint64_t id = route(rc->f->db, row);
            sto_mut m = tu_set_mut("f", "q", 1, row);
            sto_row_mut r = tu_row(id, row, &m, 1, V(1));
            st_err err;
            st_code c = sto_write(rc->f->db, &r, 1, NULL, &err);
            if (c == ST_OK)
                break;
            if (c != ST_NOT_FOUND && c != ST_OUT_OF_RANGE) {
                fprintf(stderr, "racer: %s\n", err.msg);
                abort();
            }
        }
        rc->acked++;
    }
    return NULL;
}

static void test_split_concurrent_writers(void **state) {
    fixture *f = *state;
    st_err err;
    create_whole(f);
    pthread_t th[RACE_WRITERS];
    racer rs[RACE_WRITERS];
    for (int i = 0; i < RACE_WRITERS; i++) {
        rs[i] = (racer){f, i, 0};
        pthread_create(&th[i], NULL, race_main, &rs[i]);
    }
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("g"), 1, 2, &err), ST_OK);
    assert_int_equal(sto_tablet_split(f->db, 2, ST_SLICE_LIT("p"), 2, 3, &err), ST_OK);
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("c"), 1, 4, &err), ST_OK);
    assert_int_equal(sto_tablet_split(f->db, 3, ST_SLICE_LIT("u"), 3, 5, &err), ST_OK);
    for (int i = 0; i < RACE_WRITERS; i++)
        pthread_join(th[i], NULL);
    reopen(f);
    int rows = 0;
    for (uint64_t id = 1; id <= 5; id++) {
        const char *d = dump(f, id, &f->a);
        for (const char *p = d; *p; p = strchr(p, '\n') + 1)
            rows++;
    }
    assert_int_equal(rows, RACE_WRITERS * RACE_ROWS);
}

/* split_ready: a full memtable is frozen for the background flush (not ready), and once that
 * flush ran the split is ready and quick; an unknown tablet is NOT_FOUND. */
static void test_split_ready(void **state) {
    fixture *f = *state;
    st_err err;
    create_whole(f);
    fill(f, 1, 1500, 1);
    char *all = strdup(dump(f, 1, &f->a));
    assert_int_equal(sto_tablet_split_ready(f->db, 9, 1024), ST_NOT_FOUND);
    assert_int_equal(sto_tablet_split_ready(f->db, 1, 1024), ST_UNAVAILABLE);
    int tries = 0;
    while (sto_tablet_split_ready(f->db, 1, 1024) != ST_OK) {
        assert_true(++tries < 30000); /* the background flush never came */
        usleep(1000);
    }
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, 1, &t), ST_OK);
    sto_tablet_info info;
    sto_tablet_info_get(t, &info);
    assert_true(info.sst_count >= 1); /* flushed in the background, not by the split */
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("m"), 2, 3, &err), ST_OK);
    filter(all, "", "m", &f->b);
    assert_string_equal(dump(f, 2, &f->a), (char *)f->b.data);
    filter(all, "m", "", &f->b);
    assert_string_equal(dump(f, 3, &f->a), (char *)f->b.data);
    free(all);
}

typedef struct compactor {
    fixture *f;
    st_code rc;
} compactor;

static void *compact_main(void *arg) {
    compactor *c = arg;
    st_err err;
    c->rc = sto_tablet_compact(c->f->db, 1, &err);
    return NULL;
}

/* A split while the tablet compacts: the compaction finishes or gives way (ABORTED, its outputs
 * removed), and both halves read exactly the parent's rows, also after a reopen. */
static void test_split_during_compaction(void **state) {
    fixture *f = *state;
    st_err err;
    create_whole(f);
    for (int v = 1; v <= 4; v++) {
        fill(f, 1, 5000, v);
        assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    }
    char *all = strdup(dump(f, 1, &f->a));
    int before = count_files(f->dir);
    compactor c = {f, ST_INTERNAL};
    pthread_t th;
    pthread_create(&th, NULL, compact_main, &c);
    usleep(2000);
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("m"), 2, 3, &err), ST_OK);
    pthread_join(th, NULL);
    assert_true(c.rc == ST_OK || c.rc == ST_ABORTED || c.rc == ST_NOT_FOUND);
    if (c.rc != ST_OK) /* gave way (or came after the split): no output of it is left */
        assert_int_equal(count_files(f->dir), before);
    for (int pass = 0; pass < 2; pass++) {
        filter(all, "", "m", &f->b);
        assert_string_equal(dump(f, 2, &f->a), (char *)f->b.data);
        filter(all, "m", "", &f->b);
        assert_string_equal(dump(f, 3, &f->a), (char *)f->b.data);
        reopen(f);
    }
    free(all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_split_shares_ssts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_compaction_of_children, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_concurrent_writers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_during_compaction, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
