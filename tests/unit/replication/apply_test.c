/* apply_test.c — proves the receiving side of replication converges: a random set of row
 * mutations from two origin clusters (SetCells with colliding cells and equal commit timestamps,
 * and every delete kind) is encoded as the shipper sends it, prepared by repl_apply_prepare and
 * written to real storage engines in temporary directories in different random orders, with
 * repeats and flushes in between; the full dumps (sto_iter over the tablet) must be identical.
 * Also checks that the origin's version, commit timestamp and origin are kept, that the log
 * records carry STO_ROW_REPLICATED, and that malformed rows are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "strata/storage.h"
#include "strata/replication.h"
#include "sto_test_util.h"

#define TABLE "projects/p/instances/i/tables/t"
#define TABLET 7
#define OPS_MAX 400
#define MUTS_PER_ROW_MAX 4

/* ---- a fake node: one table, one tablet covering every row ---- */
static st_code fake_route(void *node, const char *table, st_slice row, uint64_t *tablet_id,
                          st_err *err) {
    (void)node;
    if (strcmp(table, TABLE) != 0)
        return st_err_set(err, ST_NOT_FOUND, "table \"%s\" not found", table);
    if (row.len && row.data[0] == 'z')
        return st_err_set(err, ST_FAILED_PRECONDITION, "strata-not-owner: not here");
    *tablet_id = TABLET;
    return ST_OK;
}

static const repl_node_ops fake_ops = {.route = fake_route};

typedef struct fixture {
    char dir[512];
    sto_db *db;
} fixture;

static void fx_open(fixture *f, const char *name) {
    tu_tmpdir(f->dir, sizeof f->dir, name);
    sto_options o;
    tu_small_options(&o);
    st_err err;
    assert_int_equal(sto_db_open(f->dir, &o, &f->db, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_create(f->db, TABLET, st_slice_cstr(TABLE), st_slice_cstr(""),
                                       st_slice_cstr(""), &t, &err),
                     ST_OK);
}

static void fx_close(fixture *f) {
    sto_db_close(f->db);
    tu_rmrf(f->dir);
}

/* Prepares one encoded replicated row and writes it (durable on return). */
static st_code apply_one(sto_db *db, st_slice enc, st_err *err) {
    st_arena arena;
    st_arena_init(&arena, 4096);
    sto_row_mut row;
    st_code rc = repl_apply_prepare(&fake_ops, NULL, TABLE, enc, &arena, &row, err);
    if (rc == ST_OK)
        rc = sto_write(db, &row, 1, NULL, err);
    st_arena_deinit(&arena);
    return rc;
}

/* ---- random row mutations from two origins ---- */
typedef struct gen_row {
    st_buf enc;
} gen_row;

static const char *const ROWS[] = {"r1", "r2", "r3"};
static const char *const FAMS[] = {"cf1", "cf2"};
static const char *const QUALS[] = {"a", "b"};

static sto_mut random_mut(st_rng *rng, char *val, size_t val_cap) {
    sto_mut m;
    memset(&m, 0, sizeof m);
    uint64_t k = st_rng_below(rng, 10);
    m.family = st_slice_cstr(FAMS[st_rng_below(rng, 2)]);
    m.qualifier = st_slice_cstr(QUALS[st_rng_below(rng, 2)]);
    if (k < 6) { /* SetCell: few timestamps, so cells collide */
        m.type = STO_MUT_SET_CELL;
        m.ts_us = (int64_t)st_rng_below(rng, 4) * 1000;
        snprintf(val, val_cap, "v%llu", (unsigned long long)st_rng_next(rng) % 1000);
        m.value = st_slice_cstr(val);
    } else if (k < 8) {
        m.type = STO_MUT_DEL_COLUMN;
        m.ts_start_us = (int64_t)st_rng_below(rng, 3) * 1000;
        m.ts_end_us = st_rng_below(rng, 2)
                          ? STO_TS_END_INF
                          : m.ts_start_us + 1000 * (int64_t)(1 + st_rng_below(rng, 2));
    } else if (k < 9) {
        m.type = STO_MUT_DEL_FAMILY;
        m.qualifier = st_slice_make(NULL, 0);
    } else {
        m.type = STO_MUT_DEL_ROW;
        m.family = m.qualifier = st_slice_make(NULL, 0);
    }
    return m;
}

/* n row mutations, alternating origins 1 and 2 at random; each origin's commit timestamps
 * strictly increase (as its clock does) but the two origins' often coincide. */
static size_t generate(st_rng *rng, gen_row *out, size_t n) {
    /* Realistic commit times: storage drops tombstones older than tombstone_grace_us (7 days)
     * at flush and compaction, so 1970 timestamps would lose deletes on purpose. */
    uint64_t now = (uint64_t)st_wall_us();
    uint64_t ts[3] = {0, now, now};
    for (size_t i = 0; i < n; i++) {
        uint32_t origin = 1 + (uint32_t)st_rng_below(rng, 2);
        ts[origin] += 1 + st_rng_below(rng, 2);
        sto_mut muts[MUTS_PER_ROW_MAX];
        char vals[MUTS_PER_ROW_MAX][32];
        size_t nm = 1 + st_rng_below(rng, MUTS_PER_ROW_MAX);
        for (size_t j = 0; j < nm; j++)
            muts[j] = random_mut(rng, vals[j], sizeof vals[j]);
        sto_row_mut r;
        memset(&r, 0, sizeof r);
        r.tablet_id = 99; /* the origin's tablet id: the receiver ignores it */
        r.row = st_slice_cstr(ROWS[st_rng_below(rng, 3)]);
        r.muts = muts;
        r.n_muts = nm;
        r.commit_ts_us = ts[origin];
        r.origin = origin;
        r.version = STO_VERSION(ts[origin], origin);
        st_buf_init(&out[i].enc);
        assert_int_equal(sto_row_mut_encode(&out[i].enc, &r), ST_OK);
    }
    return n;
}

static void shuffle(st_rng *rng, size_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        v[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = st_rng_below(rng, i);
        size_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* Applies rows in the order given, repeating some and flushing now and then. */
static void apply_all(st_rng *rng, sto_db *db, gen_row *rows, const size_t *order, size_t n) {
    st_err err;
    for (size_t i = 0; i < n; i++) {
        st_slice enc = st_buf_slice(&rows[order[i]].enc);
        assert_int_equal(apply_one(db, enc, &err), ST_OK);
        if (!getenv("NO_DUP") && st_rng_below(rng, 8) == 0)
            assert_int_equal(apply_one(db, enc, &err), ST_OK); /* a resent batch */
        if (!getenv("NO_FLUSH") && st_rng_below(rng, 60) == 0)
            assert_int_equal(sto_tablet_flush(db, TABLET, &err), ST_OK);
    }
}

/* Debug aid (MINIMIZE=1): dumps of rows applied in order o1 vs o2 differ? */
static bool differs(gen_row *rows, const size_t *o1, const size_t *o2, size_t n) {
    fixture a, b;
    fx_open(&a, "repl-min-a");
    fx_open(&b, "repl-min-b");
    st_err err;
    for (size_t i = 0; i < n; i++) {
        apply_one(a.db, st_buf_slice(&rows[o1[i]].enc), &err);
        apply_one(b.db, st_buf_slice(&rows[o2[i]].enc), &err);
    }
    st_buf da, db;
    st_buf_init(&da);
    st_buf_init(&db);
    tu_dump(a.db, TABLET, &da);
    tu_dump(b.db, TABLET, &db);
    bool d = da.len != db.len || memcmp(da.data, db.data, da.len) != 0;
    if (d && getenv("SHOW"))
        fprintf(stderr, "--- a\n%s--- b\n%s", (char *)da.data, (char *)db.data);
    st_buf_free(&da);
    st_buf_free(&db);
    fx_close(&a);
    fx_close(&b);
    return d;
}

static void print_row(st_slice enc) {
    st_arena ar;
    st_arena_init(&ar, 4096);
    sto_row_mut r;
    sto_row_mut_decode(enc, &r, &ar);
    fprintf(stderr, "row=%.*s ts=%llu origin=%u:", (int)r.row.len, r.row.data,
            (unsigned long long)r.commit_ts_us, r.origin);
    for (size_t i = 0; i < r.n_muts; i++) {
        const sto_mut *m = &r.muts[i];
        fprintf(stderr, " [t%d %.*s:%.*s ts=%lld %lld..%lld %.*s]", m->type, (int)m->family.len,
                m->family.data, (int)m->qualifier.len, m->qualifier.data, (long long)m->ts_us,
                (long long)m->ts_start_us, (long long)m->ts_end_us, (int)m->value.len,
                m->value.data);
    }
    fprintf(stderr, "\n");
    st_arena_deinit(&ar);
}

static void minimize(gen_row *rows, size_t *o1, size_t *o2, size_t n) {
    /* keep a set of row indexes; drop one at a time while the orders still differ */
    bool *keep = calloc(n, sizeof *keep);
    for (size_t i = 0; i < n; i++)
        keep[i] = true;
    size_t *p1 = calloc(n, sizeof *p1), *p2 = calloc(n, sizeof *p2);
    for (size_t drop = 0; drop < n; drop++) {
        keep[drop] = false;
        size_t k1 = 0, k2 = 0;
        for (size_t i = 0; i < n; i++) {
            if (keep[o1[i]])
                p1[k1++] = o1[i];
            if (keep[o2[i]])
                p2[k2++] = o2[i];
        }
        if (!differs(rows, p1, p2, k1))
            keep[drop] = true;
    }
    size_t k1 = 0, k2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (keep[o1[i]])
            p1[k1++] = o1[i];
        if (keep[o2[i]])
            p2[k2++] = o2[i];
    }
    fprintf(stderr, "order a:\n");
    for (size_t i = 0; i < k1; i++)
        print_row(st_buf_slice(&rows[p1[i]].enc));
    fprintf(stderr, "order b:\n");
    for (size_t i = 0; i < k2; i++)
        print_row(st_buf_slice(&rows[p2[i]].enc));
    setenv("SHOW", "1", 1);
    differs(rows, p1, p2, k1);
}

static void test_apply_converges_in_any_order(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("test_apply_converges_in_any_order");
    st_rng rng;
    st_rng_seed(&rng, seed);
    for (int round = 0; round < 6; round++) {
        size_t n = 20 + st_rng_below(&rng, OPS_MAX - 20);
        gen_row *rows = calloc(n, sizeof *rows);
        size_t *o1 = calloc(n, sizeof *o1), *o2 = calloc(n, sizeof *o2);
        assert_non_null(rows);
        generate(&rng, rows, n);
        shuffle(&rng, o1, n);
        shuffle(&rng, o2, n);
        if (getenv("MINIMIZE") && differs(rows, o1, o2, n)) {
            minimize(rows, o1, o2, n);
            fail();
        }
        fixture a, b;
        fx_open(&a, "repl-apply-a");
        fx_open(&b, "repl-apply-b");
        apply_all(&rng, a.db, rows, o1, n);
        apply_all(&rng, b.db, rows, o2, n);
        if (round % 2) { /* compaction must not change what is visible either */
            st_err err;
            assert_int_equal(sto_tablet_compact(a.db, TABLET, &err), ST_OK);
        }
        st_buf da, db;
        st_buf_init(&da);
        st_buf_init(&db);
        assert_int_equal(tu_dump(a.db, TABLET, &da), ST_OK);
        assert_int_equal(tu_dump(b.db, TABLET, &db), ST_OK);
        if (da.len != db.len || memcmp(da.data, db.data, da.len) != 0)
            fprintf(stderr, "seed=%llu round=%d\n--- a\n%s--- b\n%s", (unsigned long long)seed,
                    round, (char *)da.data, (char *)db.data);
        assert_int_equal(da.len, db.len);
        assert_memory_equal(da.data, db.data, da.len);
        st_buf_free(&da);
        st_buf_free(&db);
        fx_close(&a);
        fx_close(&b);
        for (size_t i = 0; i < n; i++)
            st_buf_free(&rows[i].enc);
        free(rows);
        free(o1);
        free(o2);
    }
}

/* Helper: encodes one SetCell row mutation from origin with commit time ts. */
static void encode_set(st_buf *out, const char *row, const char *val, int64_t cell_ts,
                       uint64_t commit_ts, uint32_t origin) {
    sto_mut m = tu_set_mut("cf1", "q", cell_ts, val);
    sto_row_mut r;
    memset(&r, 0, sizeof r);
    r.row = st_slice_cstr(row);
    r.muts = &m;
    r.n_muts = 1;
    r.commit_ts_us = commit_ts;
    r.origin = origin;
    r.version = STO_VERSION(commit_ts, origin);
    st_buf_reset(out);
    assert_int_equal(sto_row_mut_encode(out, &r), ST_OK);
}

static void test_apply_twice_changes_nothing(void **state) {
    (void)state;
    fixture f;
    fx_open(&f, "repl-apply-twice");
    st_buf e, d1, d2;
    st_buf_init(&e);
    st_buf_init(&d1);
    st_buf_init(&d2);
    st_err err;
    encode_set(&e, "row", "east", 5000, 2000000, 1);
    assert_int_equal(apply_one(f.db, st_buf_slice(&e), &err), ST_OK);
    assert_int_equal(tu_dump(f.db, TABLET, &d1), ST_OK);
    assert_int_equal(apply_one(f.db, st_buf_slice(&e), &err), ST_OK);
    assert_int_equal(tu_dump(f.db, TABLET, &d2), ST_OK);
    assert_string_equal((char *)d1.data, (char *)d2.data);
    assert_string_equal((char *)d1.data, "row cf1:q@5000=east\n");
    /* Same cell, same commit time, other cluster: the higher cluster number wins everywhere. */
    encode_set(&e, "row", "west", 5000, 2000000, 2);
    assert_int_equal(apply_one(f.db, st_buf_slice(&e), &err), ST_OK);
    assert_int_equal(tu_dump(f.db, TABLET, &d1), ST_OK);
    assert_string_equal((char *)d1.data, "row cf1:q@5000=west\n");
    /* An older write arriving late loses. */
    encode_set(&e, "row", "old", 5000, 1000000, 2);
    assert_int_equal(apply_one(f.db, st_buf_slice(&e), &err), ST_OK);
    assert_int_equal(tu_dump(f.db, TABLET, &d2), ST_OK);
    assert_string_equal((char *)d2.data, "row cf1:q@5000=west\n");
    st_buf_free(&e);
    st_buf_free(&d1);
    st_buf_free(&d2);
    fx_close(&f);
}

/* The log records of applied rows keep origin, version and commit time and are marked
 * replicated, so a shipper skips them (no echo). */
static void test_apply_logs_origin_and_replicated_flag(void **state) {
    (void)state;
    fixture f;
    fx_open(&f, "repl-apply-flag");
    st_buf e;
    st_buf_init(&e);
    st_err err;
    encode_set(&e, "row", "x", 1000, 3000000, 2);
    assert_int_equal(apply_one(f.db, st_buf_slice(&e), &err), ST_OK);
    sto_log_reader *r;
    assert_int_equal(sto_log_reader_open(f.db, 1, &r, &err), ST_OK);
    sto_log_record rec;
    st_code rc;
    /* The log publishes a group to readers just after its writers were told: wait for it. */
    for (int i = 0; (rc = sto_log_reader_next(r, &rec, &err)) == ST_NOT_FOUND && i < 10000; i++)
        usleep(1000);
    assert_int_equal(rc, ST_OK);
    assert_true(rec.row.flags & STO_ROW_REPLICATED);
    assert_int_equal(rec.row.origin, 2);
    assert_int_equal(rec.row.commit_ts_us, 3000000);
    assert_int_equal(rec.row.version, STO_VERSION(3000000, 2));
    assert_int_equal(rec.row.tablet_id, TABLET);
    sto_log_reader_close(r);
    st_buf_free(&e);
    fx_close(&f);
}

static void test_apply_refuses_bad_rows(void **state) {
    (void)state;
    st_arena arena;
    st_arena_init(&arena, 4096);
    sto_row_mut row;
    st_err err;
    st_buf e;
    st_buf_init(&e);
    /* garbage */
    assert_int_equal(
        repl_apply_prepare(&fake_ops, NULL, TABLE, st_slice_cstr("\x07zz"), &arena, &row, &err),
        ST_INVALID_ARGUMENT);
    /* version not derived from commit time and origin */
    sto_mut m = tu_set_mut("cf1", "q", 0, "v");
    sto_row_mut r;
    memset(&r, 0, sizeof r);
    r.row = st_slice_cstr("row");
    r.muts = &m;
    r.n_muts = 1;
    r.commit_ts_us = 100;
    r.origin = 1;
    r.version = STO_VERSION(101, 1);
    assert_int_equal(sto_row_mut_encode(&e, &r), ST_OK);
    assert_int_equal(
        repl_apply_prepare(&fake_ops, NULL, TABLE, st_buf_slice(&e), &arena, &row, &err),
        ST_INVALID_ARGUMENT);
    /* origin 0 (a standalone node's writes are never shipped) */
    r.origin = 0;
    r.version = STO_VERSION(100, 0);
    st_buf_reset(&e);
    assert_int_equal(sto_row_mut_encode(&e, &r), ST_OK);
    assert_int_equal(
        repl_apply_prepare(&fake_ops, NULL, TABLE, st_buf_slice(&e), &arena, &row, &err),
        ST_INVALID_ARGUMENT);
    /* routing errors pass through: unknown table, not the owner */
    encode_set(&e, "row", "v", 0, 100, 1);
    assert_int_equal(repl_apply_prepare(&fake_ops, NULL, "projects/p/instances/i/tables/x",
                                        st_buf_slice(&e), &arena, &row, &err),
                     ST_NOT_FOUND);
    encode_set(&e, "zrow", "v", 0, 100, 1);
    assert_int_equal(
        repl_apply_prepare(&fake_ops, NULL, TABLE, st_buf_slice(&e), &arena, &row, &err),
        ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "strata-not-owner:"));
    encode_set(&e, "row", "v", 0, 100, 1);
    assert_int_equal(
        repl_apply_prepare(&fake_ops, NULL, TABLE, st_buf_slice(&e), &arena, &row, &err), ST_OK);
    assert_int_equal(row.tablet_id, TABLET);
    assert_true(row.flags & STO_ROW_REPLICATED);
    st_buf_free(&e);
    st_arena_deinit(&arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_converges_in_any_order),
        cmocka_unit_test(test_apply_twice_changes_nothing),
        cmocka_unit_test(test_apply_logs_origin_and_replicated_flag),
        cmocka_unit_test(test_apply_refuses_bad_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
