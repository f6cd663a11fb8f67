/* tomb_iter_test — proves sto_tomb_iter, the tombstone scan a tablet move copies with the cells
 * (docs/cluster.md, Moves): it returns every kind of tombstone (row, family, column with its
 * time range) with its version, rows ascending, each once even when the memtable and an SSTable
 * both hold it; stepping over cells only; the same list when each call may look at one entry
 * only; and a split child's scan sees only the tombstones of its own rows (the children share
 * the parent's SSTables). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sto_test_util.h"

#define HOUR_US ((int64_t)3600 * 1000000)
#define T0_US (1000 * HOUR_US) /* the fake clock's start */
/* Versions are commit times near the clock, so tombstones stay within their grace period. */
#define V(us) STO_VERSION(T0_US + (us), 2)

typedef struct fixture {
    char dir[512];
    sto_options o;
    st_clock clock;
    sto_db *db;
    st_buf out;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* no compaction drops anything here */
    f->o.write_stall_tables = 200;
    st_clock_fake_init(&f->clock, T0_US);
    f->o.clock = &f->clock;
    st_buf_init(&f->out);
    if (tu_db_open_fresh(f->dir, sizeof f->dir, "tomb_iter_test", &f->o, &f->db) != ST_OK)
        return -1;
    st_err err;
    sto_tablet *t;
    if (sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), &t,
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

static void write_mut(fixture *f, const char *row, sto_mut m, uint64_t version) {
    sto_row_mut r = tu_row(1, row, &m, 1, version);
    st_err err;
    assert_int_equal(sto_write(f->db, &r, 1, NULL, &err), ST_OK);
}

static sto_mut del(int type, const char *fam, const char *qual, int64_t start, int64_t end) {
    sto_mut m;
    memset(&m, 0, sizeof m);
    m.type = type;
    if (fam)
        m.family = st_slice_cstr(fam);
    if (qual)
        m.qualifier = st_slice_cstr(qual);
    m.ts_start_us = start;
    m.ts_end_us = end;
    return m;
}

/* Every tombstone of tablet id as text in f->out, each call allowed to look at `step` entries. */
static const char *scan(fixture *f, uint64_t id, size_t step) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, id, &t), ST_OK);
    sto_snapshot *s;
    sto_tomb_iter *it;
    st_err err;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_OK);
    assert_int_equal(sto_tomb_iter_new(s, &it, &err), ST_OK);
    st_buf_reset(&f->out);
    st_code rc;
    for (int calls = 0; calls < 10000; calls++) {
        size_t left = step;
        sto_tombstone tb;
        bool found;
        rc = sto_tomb_iter_next(it, &left, &tb, &found, &err);
        if (rc != ST_OK)
            break;
        if (!found) {
            assert_int_equal(left, 0);
            continue;
        }
        char line[160];
        int n = snprintf(
            line, sizeof line, "%.*s %d %.*s:%.*s [%" PRId64 ",%" PRId64 ") v%" PRIu64 "\n",
            (int)tb.row.len, (const char *)tb.row.data, tb.mut.type, (int)tb.mut.family.len,
            (const char *)tb.mut.family.data, (int)tb.mut.qualifier.len,
            (const char *)tb.mut.qualifier.data, tb.mut.ts_start_us, tb.mut.ts_end_us,
            (uint64_t)STO_VERSION_TS_US(tb.version) - (uint64_t)T0_US);
        assert_int_equal(STO_VERSION(STO_VERSION_TS_US(tb.version), 2), tb.version);
        st_buf_append(&f->out, line, (size_t)n);
    }
    assert_int_equal(rc, ST_NOT_FOUND);
    sto_tomb_iter_free(it);
    sto_snapshot_free(s);
    st_buf_append_byte(&f->out, 0);
    return (const char *)f->out.data;
}

/* Cells and every kind of delete in rows a..e, some in an SSTable, some in the memtable, one
 * delete in both. */
static void fill(fixture *f) {
    write_mut(f, "a", tu_set_mut("cf", "q", 5, "x"), V(1));
    write_mut(f, "a", del(STO_MUT_DEL_ROW, NULL, NULL, 0, 0), V(2));
    write_mut(f, "b", del(STO_MUT_DEL_FAMILY, "cf", NULL, 0, 0), V(3));
    write_mut(f, "c", del(STO_MUT_DEL_COLUMN, "cf", "q", 10, 20), V(4));
    write_mut(f, "c", tu_set_mut("cf", "q", 15, "y"), V(1));
    write_mut(f, "d", tu_set_mut("cf", "q", 5, "z"), V(1));
    st_err err;
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    write_mut(f, "b", del(STO_MUT_DEL_FAMILY, "cf", NULL, 0, 0), V(3)); /* again: in both */
    write_mut(f, "c", del(STO_MUT_DEL_COLUMN, "cf", "q", 0, STO_TS_END_INF), V(5));
    write_mut(f, "e", del(STO_MUT_DEL_ROW, NULL, NULL, 0, 0), V(6));
    write_mut(f, "f", tu_set_mut("cf", "q", 5, "w"), V(7));
}

static const char *const ALL = "a 4 : [0,0) v2\n"
                               "b 3 cf: [0,0) v3\n"
                               "c 2 cf:q [0,9223372036854775807) v5\n"
                               "c 2 cf:q [10,20) v4\n"
                               "e 4 : [0,0) v6\n";

static void test_tomb_iter_every_kind_once(void **state) {
    fixture *f = *state;
    fill(f);
    assert_string_equal(scan(f, 1, 1000), ALL);
}

static void test_tomb_iter_one_entry_per_call(void **state) {
    fixture *f = *state;
    fill(f);
    assert_string_equal(scan(f, 1, 1), ALL);
    assert_string_equal(scan(f, 1, 2), ALL);
}

static void test_tomb_iter_split_children(void **state) {
    fixture *f = *state;
    fill(f);
    st_err err;
    assert_int_equal(sto_tablet_split(f->db, 1, ST_SLICE_LIT("c"), 2, 3, &err), ST_OK);
    assert_string_equal(scan(f, 2, 1000), "a 4 : [0,0) v2\n"
                                          "b 3 cf: [0,0) v3\n");
    assert_string_equal(scan(f, 3, 1000), "c 2 cf:q [0,9223372036854775807) v5\n"
                                          "c 2 cf:q [10,20) v4\n"
                                          "e 4 : [0,0) v6\n");
}

static void test_tomb_iter_none(void **state) {
    fixture *f = *state;
    write_mut(f, "a", tu_set_mut("cf", "q", 5, "x"), V(1));
    assert_string_equal(scan(f, 1, 1), "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tomb_iter_every_kind_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tomb_iter_one_entry_per_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tomb_iter_split_children, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tomb_iter_none, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
