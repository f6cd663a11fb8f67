/* rowread_test — proves the row reader applies the visibility rules of docs/formats/keys.md
 * (row / family / time-ranged column deletes bounded by versions, highest version wins among
 * duplicates and is the cell's reported version, each GC rule kind and their nesting), honours
 * ranges with exclusive / inclusive bounds in both directions, skip_row and last_scanned_row, and
 * that the compaction filter keeps exactly what is needed: directed cases, then random row
 * mutations spread over several merged memtables compared with a brute-force model (forward,
 * reverse, random ranges and skips), and compaction outputs (full and partial) read back to the
 * same visible cells. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "key.h"
#include "memtable.h"
#include "rowread.h"

#define MT_MAX 5
#define HOUR_US (3600LL * 1000000)

/* ---- fixture: a few memtables merged, cells dumped as text ---- */

typedef struct fixture {
    sto_memtable *mt[MT_MAX];
    size_t n;
    uint64_t lsn;
} fixture;

static void fx_init(fixture *fx, size_t n) {
    memset(fx, 0, sizeof *fx);
    fx->n = n;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sto_memtable_new(&fx->mt[i]), ST_OK);
}

static void fx_free(fixture *fx) {
    for (size_t i = 0; i < fx->n; i++)
        sto_memtable_unref(fx->mt[i]);
}

static void fx_apply(fixture *fx, size_t which, const char *row, uint64_t version,
                     const sto_mut *muts, size_t n) {
    sto_row_mut r = {.row = st_slice_cstr(row), .muts = muts, .n_muts = n, .version = version};
    assert_int_equal(sto_memtable_apply(fx->mt[which], &r, ++fx->lsn), ST_OK);
}

static sto_kviter *fx_merged(fixture *fx) {
    sto_kviter *kids[MT_MAX];
    for (size_t i = 0; i < fx->n; i++)
        kids[i] = sto_memtable_iter_new(fx->mt[i], UINT64_MAX);
    return sto_merge_iter_new(kids, fx->n);
}

static void dump_bytes(st_buf *out, st_slice s) {
    for (size_t i = 0; i < s.len; i++) {
        char tmp[8];
        uint8_t c = s.data[i];
        if (c >= 0x21 && c < 0x7f && c != '\\')
            snprintf(tmp, sizeof tmp, "%c", c);
        else
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
        st_buf_append(out, tmp, strlen(tmp));
    }
}

static void dump_cell(st_buf *out, st_slice row, st_slice fam, st_slice qual, int64_t ts,
                      st_slice value) {
    char tmp[32];
    dump_bytes(out, row);
    st_buf_append_byte(out, '/');
    dump_bytes(out, fam);
    st_buf_append_byte(out, ':');
    dump_bytes(out, qual);
    snprintf(tmp, sizeof tmp, "@%lld=", (long long)ts);
    st_buf_append(out, tmp, strlen(tmp));
    dump_bytes(out, value);
    st_buf_append_byte(out, ' ');
}

/* Reads it all through a row reader into text; checks last_scanned_row follows the cells. */
static void read_dump(sto_kviter *merged, sto_gc_set *gc, int64_t now, const sto_range *range,
                      bool reverse, st_buf *out) {
    sto_rowreader *r;
    st_err err;
    st_buf_reset(out);
    assert_int_equal(sto_rowreader_new(merged, gc, now, range, reverse,
                                       STO_ITER_USER | STO_ITER_SYSTEM, &r, &err),
                     ST_OK);
    sto_cell c;
    st_code rc;
    while ((rc = sto_rowreader_next(r, &c, &err)) == ST_OK) {
        dump_cell(out, c.row, c.family, c.qualifier, c.ts_us, c.value);
        assert_true(st_slice_eq(sto_rowreader_last_scanned_row(r), c.row));
    }
    assert_int_equal(rc, ST_NOT_FOUND);
    assert_int_equal(sto_rowreader_next(r, &c, &err), ST_NOT_FOUND);
    sto_rowreader_free(r);
    st_buf_append_byte(out, 0);
}

static void expect_read(fixture *fx, sto_gc_set *gc, int64_t now, const sto_range *range,
                        bool reverse, const char *want) {
    st_buf out;
    st_buf_init(&out);
    read_dump(fx_merged(fx), gc, now, range, reverse, &out);
    if (strcmp((const char *)out.data, want) != 0)
        fail_msg("got  \"%s\"\nwant \"%s\"", (const char *)out.data, want);
    st_buf_free(&out);
}

/* The versions of the visible cells, forward, must be want[0..n). */
static void expect_versions(fixture *fx, const uint64_t *want, size_t n) {
    sto_rowreader *r;
    st_err err;
    assert_int_equal(sto_rowreader_new(fx_merged(fx), NULL, 0, NULL, false,
                                       STO_ITER_USER | STO_ITER_SYSTEM, &r, &err),
                     ST_OK);
    sto_cell c;
    size_t i = 0;
    while (sto_rowreader_next(r, &c, &err) == ST_OK) {
        assert_true(i < n);
        assert_int_equal(c.version, want[i]);
        i++;
    }
    assert_int_equal(i, n);
    sto_rowreader_free(r);
}

#define SET(f, q, ts, v)                                                                           \
    {                                                                                              \
        .type = STO_MUT_SET_CELL, .family = ST_SLICE_LIT(f), .qualifier = ST_SLICE_LIT(q),         \
        .ts_us = (ts), .value = ST_SLICE_LIT(v)                                                    \
    }
#define DELCOL(f, q, s, e)                                                                         \
    {                                                                                              \
        .type = STO_MUT_DEL_COLUMN, .family = ST_SLICE_LIT(f), .qualifier = ST_SLICE_LIT(q),       \
        .ts_start_us = (s), .ts_end_us = (e)                                                       \
    }
#define DELFAM(f)                                                                                  \
    { .type = STO_MUT_DEL_FAMILY, .family = ST_SLICE_LIT(f) }
#define DELROW()                                                                                   \
    { .type = STO_MUT_DEL_ROW }
#define APPLY(fx, which, row, version, ...)                                                        \
    do {                                                                                           \
        const sto_mut m_[] = {__VA_ARGS__};                                                        \
        fx_apply(fx, which, row, version, m_, sizeof m_ / sizeof m_[0]);                           \
    } while (0)

/* ---- directed cases ---- */

static void test_rowread_delete_kinds(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 2);
    APPLY(&fx, 0, "a", 10, SET("f", "x", 10, "x10"), SET("f", "x", 20, "x20"),
          SET("f", "y", 5, "y5"), SET("g", "z", 1, "z1"));
    APPLY(&fx, 0, "b", 10, SET("f", "x", 1, "b1"));
    APPLY(&fx, 0, "c", 10, SET("f", "x", 1, "c1"));
    expect_read(&fx, NULL, 0, NULL, false,
                "a/f:x@20=x20 a/f:x@10=x10 a/f:y@5=y5 a/g:z@1=z1 b/f:x@1=b1 c/f:x@1=c1 ");
    APPLY(&fx, 1, "a", 20, DELFAM("g"), DELCOL("f", "x", 15, 25));
    APPLY(&fx, 1, "b", 20, DELROW());
    APPLY(&fx, 1, "c", 5, DELROW()); /* lower version: hides nothing */
    expect_read(&fx, NULL, 0, NULL, false, "a/f:x@10=x10 a/f:y@5=y5 c/f:x@1=c1 ");
    /* Later writes (higher version) show through the deletes. */
    APPLY(&fx, 0, "a", 30, SET("f", "x", 20, "again"), SET("g", "z", 1, "z-new"));
    APPLY(&fx, 0, "b", 30, SET("f", "n", 3, "new"));
    expect_read(&fx, NULL, 0, NULL, false,
                "a/f:x@20=again a/f:x@10=x10 a/f:y@5=y5 a/g:z@1=z-new b/f:n@3=new c/f:x@1=c1 ");
    /* Column delete with an unbounded end and one of another qualifier. */
    APPLY(&fx, 1, "a", 40, DELCOL("f", "x", 0, STO_TS_END_INF), DELCOL("f", "nope", 0, 100));
    expect_read(&fx, NULL, 0, NULL, false, "a/f:y@5=y5 a/g:z@1=z-new b/f:n@3=new c/f:x@1=c1 ");
    /* A time range that ends where a cell is leaves it (end is exclusive). */
    APPLY(&fx, 1, "c", 50, DELCOL("f", "x", 0, 1));
    expect_read(&fx, NULL, 0, NULL, false, "a/f:y@5=y5 a/g:z@1=z-new b/f:n@3=new c/f:x@1=c1 ");
    APPLY(&fx, 1, "c", 50, DELCOL("f", "x", 1, 2));
    expect_read(&fx, NULL, 0, NULL, false, "a/f:y@5=y5 a/g:z@1=z-new b/f:n@3=new ");
    fx_free(&fx);
}

static void test_rowread_duplicates_highest_version_wins(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 3);
    APPLY(&fx, 0, "r", 10, SET("f", "q", 7, "old"));
    APPLY(&fx, 1, "r", 20, SET("f", "q", 7, "new"));
    APPLY(&fx, 2, "r", 15, SET("f", "q", 7, "mid"));
    APPLY(&fx, 2, "s", 20, SET("f", "q", 7, "s-new"));
    APPLY(&fx, 0, "s", 10, SET("f", "q", 7, "s-old"));
    APPLY(&fx, 0, "t", 10, SET("f", "q", 7, "replayed"));
    APPLY(&fx, 1, "t", 10, SET("f", "q", 7, "replayed")); /* the same mutation twice */
    expect_read(&fx, NULL, 0, NULL, false, "r/f:q@7=new s/f:q@7=s-new t/f:q@7=replayed ");
    expect_read(&fx, NULL, 0, NULL, true, "t/f:q@7=replayed s/f:q@7=s-new r/f:q@7=new ");
    /* Each cell comes with the version of the entry that won (sto_cell.version). */
    expect_versions(&fx, (const uint64_t[]){20, 20, 10}, 3);
    /* A delete between the versions hides the old one but not the winner. */
    APPLY(&fx, 0, "r", 17, DELCOL("f", "q", 0, 100));
    expect_read(&fx, NULL, 0, NULL, false, "r/f:q@7=new s/f:q@7=s-new t/f:q@7=replayed ");
    APPLY(&fx, 0, "r", 21, DELFAM("f"));
    expect_read(&fx, NULL, 0, NULL, false, "s/f:q@7=s-new t/f:q@7=replayed ");
    fx_free(&fx);
}

static sto_gc_set *gc_one(const char *fam, sto_gc_rule rule) {
    sto_family_gc f = {.family = st_slice_cstr(fam), .rule = rule};
    sto_gc_set *g;
    assert_int_equal(sto_gc_set_new(&f, 1, &g), ST_OK);
    return g;
}

static void test_rowread_gc_rules(void **state) {
    (void)state;
    const int64_t now = 100 * HOUR_US;
    fixture fx;
    fx_init(&fx, 2);
    /* f:q has cells at hours 95..99 (age 5h..1h); g:q the same, and no rule. */
    for (int h = 95; h <= 99; h++) {
        char v[8];
        snprintf(v, sizeof v, "h%d", h);
        sto_mut m[2] = {
            {.type = STO_MUT_SET_CELL,
             .family = ST_SLICE_LIT("f"),
             .qualifier = ST_SLICE_LIT("q"),
             .ts_us = h * HOUR_US,
             .value = st_slice_cstr(v)},
            {.type = STO_MUT_SET_CELL,
             .family = ST_SLICE_LIT("g"),
             .qualifier = ST_SLICE_LIT("q"),
             .ts_us = h * HOUR_US,
             .value = st_slice_cstr(v)},
        };
        fx_apply(&fx, (size_t)h % 2, "r", (uint64_t)h, m, 2);
    }
    char want[512];
    const char *g_all = "r/g:q@356400000000=h99 r/g:q@352800000000=h98 r/g:q@349200000000=h97 "
                        "r/g:q@345600000000=h96 r/g:q@342000000000=h95 ";
#define F99 "r/f:q@356400000000=h99 "
#define F98 "r/f:q@352800000000=h98 "
#define F97 "r/f:q@349200000000=h97 "
#define F96 "r/f:q@345600000000=h96 "
    sto_gc_rule v2 = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 2};
    sto_gc_rule age = {.kind = STO_GC_MAX_AGE, .max_age_us = 3 * HOUR_US + 1};
    sto_gc_rule v1 = {.kind = STO_GC_MAX_VERSIONS, .max_versions = 1};
    sto_gc_rule kids[2] = {v2, age};
    struct {
        sto_gc_rule rule;
        const char *f;
    } cases[] = {
        {v2, F99 F98},
        {age, F99 F98 F97},
        {{.kind = STO_GC_UNION, .children = kids, .n_children = 2}, F99 F98},
        {{.kind = STO_GC_INTERSECTION, .children = kids, .n_children = 2}, F99 F98 F97},
        {{.kind = STO_GC_NONE}, F99 F98 F97 F96 "r/f:q@342000000000=h95 "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sto_gc_set *g = gc_one("f", cases[i].rule);
        snprintf(want, sizeof want, "%s%s", cases[i].f, g_all);
        expect_read(&fx, g, now, NULL, false, want);
        sto_gc_set_unref(g);
    }
    /* Nested: union(max_versions 1, intersection(max_versions 2, max_age)) = newest only. */
    sto_gc_rule inner = {.kind = STO_GC_INTERSECTION, .children = kids, .n_children = 2};
    sto_gc_rule nest_kids[2] = {v1, inner};
    sto_gc_set *g =
        gc_one("f", (sto_gc_rule){.kind = STO_GC_UNION, .children = nest_kids, .n_children = 2});
    snprintf(want, sizeof want, "%s%s", F99, g_all);
    expect_read(&fx, g, now, NULL, false, want);
    sto_gc_set_unref(g);
    /* intersection(max_versions 1, union(...)) keeps what either keeps under the union. */
    sto_gc_rule uni = {.kind = STO_GC_UNION, .children = kids, .n_children = 2};
    sto_gc_rule nest2_kids[2] = {v1, uni};
    g = gc_one("f",
               (sto_gc_rule){.kind = STO_GC_INTERSECTION, .children = nest2_kids, .n_children = 2});
    snprintf(want, sizeof want, "%s%s", F99 F98, g_all);
    expect_read(&fx, g, now, NULL, false, want);
    /* max_versions counts visible cells only: deleting the newest brings up the third. */
    APPLY(&fx, 0, "r", 200, DELCOL("f", "q", 99 * HOUR_US, 99 * HOUR_US + 1));
    sto_gc_set_unref(g);
    g = gc_one("f", v2);
    snprintf(want, sizeof want, "%s%s", F98 F97, g_all);
    expect_read(&fx, g, now, NULL, false, want);
    sto_gc_set_unref(g);
    fx_free(&fx);
}

static void fill_rows(fixture *fx) {
    APPLY(fx, 0, "a", 1, SET("f", "1", 1, "a1"), SET("g", "1", 1, "a2"));
    APPLY(fx, 1, "b", 1, SET("f", "1", 2, "b1"), SET("f", "1", 1, "b2"));
    APPLY(fx, 0, "c", 1, SET("f", "1", 1, "c1"));
    APPLY(fx, 1, "d", 1, SET("f", "1", 1, "d1"), SET("f", "2", 1, "d2"));
}

static void test_rowread_reverse_order(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 2);
    fill_rows(&fx);
    expect_read(&fx, NULL, 0, NULL, true,
                "d/f:1@1=d1 d/f:2@1=d2 c/f:1@1=c1 b/f:1@2=b1 b/f:1@1=b2 a/f:1@1=a1 a/g:1@1=a2 ");
    /* A row whose cells are all deleted is passed over in both directions. */
    APPLY(&fx, 0, "c", 5, DELROW());
    expect_read(&fx, NULL, 0, NULL, true,
                "d/f:1@1=d1 d/f:2@1=d2 b/f:1@2=b1 b/f:1@1=b2 a/f:1@1=a1 a/g:1@1=a2 ");
    fx_free(&fx);
}

static void test_rowread_ranges(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 2);
    fill_rows(&fx);
    const char *A = "a/f:1@1=a1 a/g:1@1=a2 ", *B = "b/f:1@2=b1 b/f:1@1=b2 ", *C = "c/f:1@1=c1 ",
               *D = "d/f:1@1=d1 d/f:2@1=d2 ";
    struct {
        const char *start;
        bool sx;
        const char *end;
        bool ei;
        const char *rows; /* forward */
    } cases[] = {
        {"b", false, "c", false, "b"},  {"b", true, "c", true, "c"},
        {"b", false, "c", true, "bc"},  {"b", true, "c", false, ""},
        {"b", false, "", false, "bcd"}, {"", false, "c", false, "ab"},
        {"", false, "", false, "abcd"}, {"bb", false, "cc", false, "c"},
        {"0", true, "z", true, "abcd"}, {"d", false, "a", false, ""},
        {"a", true, "d", false, "bc"},  {"c", false, "c", true, "c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sto_range r = {.start = st_slice_cstr(cases[i].start),
                       .start_exclusive = cases[i].sx,
                       .end = st_slice_cstr(cases[i].end),
                       .end_inclusive = cases[i].ei};
        char fwd[256] = "", rev[256] = "";
        size_t n = strlen(cases[i].rows);
        for (size_t j = 0; j < n; j++) {
            char c = cases[i].rows[j], cr = cases[i].rows[n - 1 - j];
            strcat(fwd, c == 'a' ? A : c == 'b' ? B : c == 'c' ? C : D);
            strcat(rev, cr == 'a' ? A : cr == 'b' ? B : cr == 'c' ? C : D);
        }
        expect_read(&fx, NULL, 0, &r, false, fwd);
        expect_read(&fx, NULL, 0, &r, true, rev);
    }
    fx_free(&fx);
}

static void test_rowread_skip_row_and_last_scanned(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 2);
    fill_rows(&fx);
    APPLY(&fx, 1, "c", 9, DELROW()); /* c: scanned, nothing visible */
    APPLY(&fx, 1, "e", 9, DELROW());
    APPLY(&fx, 0, "e", 1, SET("f", "1", 1, "e1")); /* e: the last row, all deleted */
    for (int rev = 0; rev < 2; rev++) {
        sto_rowreader *r;
        sto_cell c;
        assert_int_equal(sto_rowreader_new(fx_merged(&fx), NULL, 0, NULL, rev,
                                           STO_ITER_USER | STO_ITER_SYSTEM, &r, NULL),
                         ST_OK);
        assert_int_equal(sto_rowreader_last_scanned_row(r).len, 0);
        sto_rowreader_skip_row(r); /* before any cell: nothing to skip */
        assert_int_equal(sto_rowreader_next(r, &c, NULL), ST_OK);
        assert_true(st_slice_eq(c.row, rev ? ST_SLICE_LIT("d") : ST_SLICE_LIT("a")));
        assert_true(st_slice_eq(c.value, rev ? ST_SLICE_LIT("d1") : ST_SLICE_LIT("a1")));
        sto_rowreader_skip_row(r);
        assert_int_equal(sto_rowreader_next(r, &c, NULL), ST_OK);
        assert_true(st_slice_eq(c.value, ST_SLICE_LIT("b1")));
        sto_rowreader_skip_row(r);
        assert_int_equal(sto_rowreader_next(r, &c, NULL), ST_OK);
        /* Forward passes c (all deleted) to reach d; reverse passed c before b. */
        assert_true(st_slice_eq(c.value, rev ? ST_SLICE_LIT("a1") : ST_SLICE_LIT("d1")));
        assert_true(st_slice_eq(sto_rowreader_last_scanned_row(r), c.row));
        sto_rowreader_skip_row(r);
        assert_int_equal(sto_rowreader_next(r, &c, NULL), ST_NOT_FOUND);
        /* Forward ends having scanned e (nothing visible); reverse ends at a. */
        assert_true(st_slice_eq(sto_rowreader_last_scanned_row(r),
                                rev ? ST_SLICE_LIT("a") : ST_SLICE_LIT("e")));
        sto_rowreader_free(r);
    }
    fx_free(&fx);
}

static void test_rowread_corrupt_key_is_data_loss(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 1);
    APPLY(&fx, 0, "a", 1, SET("f", "1", 1, "a1"));
    assert_int_equal(
        sto_memtable_put(fx.mt[0], ST_SLICE_LIT("b\x00\x01\x07junk"), ST_SLICE_LIT(""), 9), ST_OK);
    sto_rowreader *r;
    sto_cell c;
    st_err err;
    assert_int_equal(sto_rowreader_new(fx_merged(&fx), NULL, 0, NULL, false,
                                       STO_ITER_USER | STO_ITER_SYSTEM, &r, NULL),
                     ST_OK);
    assert_int_equal(sto_rowreader_next(r, &c, &err), ST_OK);
    assert_int_equal(sto_rowreader_next(r, &c, &err), ST_DATA_LOSS);
    assert_int_equal(sto_rowreader_next(r, &c, &err), ST_DATA_LOSS); /* sticky */
    assert_true(strlen(err.msg) > 0);
    sto_rowreader_free(r);
    sto_kviter *ci = sto_compact_iter_new(fx_merged(&fx), NULL, 0, true, 0);
    ci->ops->seek_first(ci);
    assert_true(ci->ops->valid(ci));
    ci->ops->next(ci);
    assert_false(ci->ops->valid(ci));
    assert_int_equal(ci->ops->status(ci, &err), ST_DATA_LOSS);
    ci->ops->free(ci);
    fx_free(&fx);
}

/* ---- random data against a brute-force model ---- */

#define M_ENTRIES_MAX 4096

static const char *const M_ROWS[] = {"a", "a\0", "ab", "b", "b\xff", "\0", "c"};
static const size_t M_ROW_LEN[] = {1, 2, 2, 1, 2, 1, 1};
static const char *const M_FAMS[] = {"f", "g"};
static const char *const M_QUALS[] = {"", "q", "q\0", "r"};
static const size_t M_QUAL_LEN[] = {0, 1, 2, 1};
#define N_ROWS 7
#define TS_SPAN 6

typedef struct m_entry {
    sto_mut_type type; /* SET_CELL or a delete */
    int row, fam, qual;
    int64_t ts, start, end;
    uint64_t version;
    char value[24];
} m_entry;

typedef struct m_world {
    m_entry e[M_ENTRIES_MAX];
    size_t n;
} m_world;

static st_slice m_row(int i) {
    return st_slice_make(M_ROWS[i], M_ROW_LEN[i]);
}
static st_slice m_qual(int i) {
    return st_slice_make(M_QUALS[i], M_QUAL_LEN[i]);
}
static st_slice m_fam(int i) {
    return st_slice_cstr(M_FAMS[i]);
}

static bool m_covers(const m_entry *d, const m_entry *c) {
    if (d->row != c->row || d->type == STO_MUT_SET_CELL)
        return false;
    if (d->type == STO_MUT_DEL_ROW)
        return true;
    if (d->fam != c->fam)
        return false;
    return d->type == STO_MUT_DEL_FAMILY ||
           (d->qual == c->qual && c->ts >= d->start && c->ts < d->end);
}

/* Applies one row mutation (me[i] as muts[i], all of one row and version) to a random memtable
 * of fx, maybe replays it into another, and records it in the model with Bigtable's in-order
 * meaning. */
static void m_apply(m_world *w, fixture *fx, st_rng *rng, const m_entry *me, const sto_mut *muts,
                    size_t n) {
    sto_row_mut r = {.row = m_row(me[0].row), .muts = muts, .n_muts = n, .version = me[0].version};
    size_t which = (size_t)st_rng_below(rng, fx->n);
    assert_int_equal(sto_memtable_apply(fx->mt[which], &r, ++fx->lsn), ST_OK);
    if (fx->n > 1 && st_rng_below(rng, 8) == 0) /* a replay of the same mutation elsewhere */
        assert_int_equal(sto_memtable_apply(fx->mt[(which + 1) % fx->n], &r, ++fx->lsn), ST_OK);
    for (size_t i = 0; i < n; i++) {
        bool dropped = false;
        for (size_t j = i + 1; j < n && me[i].type == STO_MUT_SET_CELL; j++) {
            bool same_cell = me[j].type == STO_MUT_SET_CELL && me[j].fam == me[i].fam &&
                             me[j].qual == me[i].qual && me[j].ts == me[i].ts;
            if (same_cell || m_covers(&me[j], &me[i]))
                dropped = true;
        }
        if (!dropped) {
            assert_true(w->n < M_ENTRIES_MAX);
            w->e[w->n++] = me[i];
        }
    }
}

/* One random row mutation, applied to a random memtable (and maybe replayed into another), and
 * recorded in the model. */
static void m_mutate(m_world *w, fixture *fx, st_rng *rng, uint64_t version) {
    sto_mut muts[5];
    m_entry me[5];
    int row = (int)st_rng_below(rng, N_ROWS);
    size_t n = 1 + (size_t)st_rng_below(rng, 5);
    for (size_t i = 0; i < n; i++) {
        m_entry *e = &me[i];
        memset(e, 0, sizeof *e);
        unsigned k = (unsigned)st_rng_below(rng, 20);
        e->type = k < 13   ? STO_MUT_SET_CELL
                  : k < 17 ? STO_MUT_DEL_COLUMN
                  : k < 19 ? STO_MUT_DEL_FAMILY
                           : STO_MUT_DEL_ROW;
        e->row = row;
        e->fam = (int)st_rng_below(rng, 2);
        e->qual = (int)st_rng_below(rng, 4);
        e->ts = (int64_t)st_rng_below(rng, TS_SPAN) * 1000;
        e->start = (int64_t)st_rng_below(rng, TS_SPAN) * 1000 - 500;
        e->end = st_rng_below(rng, 4) == 0 ? STO_TS_END_INF
                                           : e->start + (int64_t)st_rng_below(rng, 4) * 1000;
        e->version = version;
        snprintf(e->value, sizeof e->value, "v%llu.%zu", (unsigned long long)version, i);
        muts[i] = (sto_mut){.type = e->type,
                            .family = m_fam(e->fam),
                            .qualifier = m_qual(e->qual),
                            .ts_us = e->ts,
                            .ts_start_us = e->start,
                            .ts_end_us = e->end,
                            .value = st_slice_cstr(e->value)};
    }
    m_apply(w, fx, rng, me, muts, n);
}

static bool m_gc(const sto_gc_rule *r, int64_t rank, int64_t ts, int64_t now) {
    bool any = false, all = true;
    switch (r->kind) {
    case STO_GC_NONE:
        return false;
    case STO_GC_MAX_VERSIONS:
        return rank > r->max_versions;
    case STO_GC_MAX_AGE:
        return ts < now - r->max_age_us;
    case STO_GC_UNION:
    case STO_GC_INTERSECTION:
        for (size_t i = 0; i < r->n_children; i++) {
            bool g = m_gc(&r->children[i], rank, ts, now);
            any |= g;
            all &= g;
        }
        return r->kind == STO_GC_UNION ? any : (r->n_children > 0 && all);
    }
    return false;
}

/* Visible cells: index of the winning entry per cell, sorted (row, fam, qual, ts desc). */
typedef struct m_view {
    size_t idx[M_ENTRIES_MAX];
    size_t n;
} m_view;

static const m_world *g_sort_world;
static int m_cell_cmp(const void *a, const void *b) {
    const m_entry *x = &g_sort_world->e[*(const size_t *)a],
                  *y = &g_sort_world->e[*(const size_t *)b];
    int c = st_slice_cmp(m_row(x->row), m_row(y->row));
    if (!c)
        c = st_slice_cmp(m_fam(x->fam), m_fam(y->fam));
    if (!c)
        c = st_slice_cmp(m_qual(x->qual), m_qual(y->qual));
    if (!c)
        c = x->ts > y->ts ? -1 : (x->ts < y->ts ? 1 : 0);
    return c;
}

static void m_visible(const m_world *w, const sto_gc_rule *const rules[2], int64_t now, m_view *v) {
    v->n = 0;
    for (size_t i = 0; i < w->n; i++) {
        const m_entry *c = &w->e[i];
        if (c->type != STO_MUT_SET_CELL)
            continue;
        bool lost = false;
        for (size_t j = 0; j < w->n && !lost; j++) {
            const m_entry *o = &w->e[j];
            if (o->type == STO_MUT_SET_CELL) {
                bool same =
                    o->row == c->row && o->fam == c->fam && o->qual == c->qual && o->ts == c->ts;
                lost = same && (o->version > c->version || (o->version == c->version && j < i));
            } else {
                lost = o->version > c->version && m_covers(o, c);
            }
        }
        if (!lost)
            v->idx[v->n++] = i;
    }
    g_sort_world = w;
    qsort(v->idx, v->n, sizeof v->idx[0], m_cell_cmp);
    size_t out = 0;
    int64_t rank = 0;
    for (size_t i = 0; i < v->n; i++) {
        const m_entry *c = &w->e[v->idx[i]];
        const m_entry *p = i ? &w->e[v->idx[i - 1]] : NULL;
        bool same_col = p && p->row == c->row && p->fam == c->fam && p->qual == c->qual;
        rank = same_col ? rank + 1 : 1;
        if (rules[c->fam] && m_gc(rules[c->fam], rank, c->ts, now))
            continue;
        v->idx[out++] = v->idx[i];
    }
    v->n = out;
}

/* Dumps the model's cells of rows in range, rows descending when reverse. */
static void m_dump(const m_world *w, const m_view *v, const sto_range *range, bool reverse,
                   st_buf *out) {
    st_buf_reset(out);
    size_t i = reverse ? v->n : 0;
    while (reverse ? i > 0 : i < v->n) {
        /* [b, e) = the cells of one row */
        size_t b, e;
        if (reverse) {
            e = i;
            b = e - 1;
            while (b > 0 && w->e[v->idx[b - 1]].row == w->e[v->idx[e - 1]].row)
                b--;
            i = b;
        } else {
            b = i;
            e = b + 1;
            while (e < v->n && w->e[v->idx[e]].row == w->e[v->idx[b]].row)
                e++;
            i = e;
        }
        st_slice row = m_row(w->e[v->idx[b]].row);
        int cs = range->start.len ? st_slice_cmp(row, range->start) : 1;
        int ce = range->end.len ? st_slice_cmp(row, range->end) : -1;
        if (cs < 0 || (cs == 0 && range->start_exclusive) || ce > 0 ||
            (ce == 0 && !range->end_inclusive))
            continue;
        for (size_t k = b; k < e; k++) {
            const m_entry *c = &w->e[v->idx[k]];
            dump_cell(out, row, m_fam(c->fam), m_qual(c->qual), c->ts, st_slice_cstr(c->value));
        }
    }
    st_buf_append_byte(out, 0);
}

static void expect_same(const st_buf *got, const st_buf *want, uint64_t seed, int round,
                        const char *what) {
    if (strcmp((const char *)got->data, (const char *)want->data) != 0)
        fail_msg("%s differs (seed %llu round %d)\ngot  %s\nwant %s", what,
                 (unsigned long long)seed, round, (const char *)got->data,
                 (const char *)want->data);
}

/* Random GC rules for the two families (possibly none). */
typedef struct m_rules {
    sto_gc_rule kids[2][2];
    sto_gc_rule top[2];
    const sto_gc_rule *by_fam[2];
    sto_gc_set *set;
} m_rules;

static void m_rules_make(m_rules *mr, st_rng *rng) {
    memset(mr, 0, sizeof *mr);
    sto_family_gc fams[2];
    size_t nf = 0;
    for (int f = 0; f < 2; f++) {
        unsigned k = (unsigned)st_rng_below(rng, 6);
        sto_gc_rule v = {.kind = STO_GC_MAX_VERSIONS,
                         .max_versions = 1 + (int64_t)st_rng_below(rng, 3)};
        sto_gc_rule a = {.kind = STO_GC_MAX_AGE,
                         .max_age_us = (int64_t)st_rng_below(rng, TS_SPAN) * 1000};
        mr->kids[f][0] = v;
        mr->kids[f][1] = a;
        if (k == 0)
            continue;
        mr->top[f] = k == 1   ? v
                     : k == 2 ? a
                              : (sto_gc_rule){.kind = k == 3 ? STO_GC_UNION : STO_GC_INTERSECTION,
                                              .children = mr->kids[f],
                                              .n_children = 2};
        if (k == 5)
            mr->top[f].kind = STO_GC_NONE;
        mr->by_fam[f] = &mr->top[f];
        fams[nf++] = (sto_family_gc){.family = m_fam(f), .rule = mr->top[f]};
    }
    assert_int_equal(sto_gc_set_new(fams, nf, &mr->set), ST_OK);
}

static void m_random_range(st_rng *rng, sto_range *r) {
    memset(r, 0, sizeof *r);
    int a = (int)st_rng_below(rng, N_ROWS + 1), b = (int)st_rng_below(rng, N_ROWS + 1);
    if (a < N_ROWS)
        r->start = m_row(a);
    if (b < N_ROWS)
        r->end = m_row(b);
    r->start_exclusive = st_rng_below(rng, 2);
    r->end_inclusive = st_rng_below(rng, 2);
}

/* Reads with random skip_row calls, mirrored on the model's cell list. */
static void check_skips(fixture *fx, const m_world *w, const m_view *v, const m_rules *mr,
                        int64_t now, bool reverse, st_rng *rng) {
    st_buf want;
    st_buf_init(&want);
    sto_range all = {0};
    m_dump(w, v, &all, reverse, &want);
    /* Recover the row order of the dump by walking the model the same way. */
    sto_rowreader *r;
    assert_int_equal(sto_rowreader_new(fx_merged(fx), mr->set, now, NULL, reverse,
                                       STO_ITER_USER | STO_ITER_SYSTEM, &r, NULL),
                     ST_OK);
    size_t n = v->n;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    assert_non_null(order);
    size_t k = 0;
    for (size_t i = reverse ? n : 0; reverse ? i > 0 : i < n;) {
        size_t b, e;
        if (reverse) {
            e = i;
            b = e - 1;
            while (b > 0 && w->e[v->idx[b - 1]].row == w->e[v->idx[e - 1]].row)
                b--;
            i = b;
        } else {
            b = i;
            e = b + 1;
            while (e < n && w->e[v->idx[e]].row == w->e[v->idx[b]].row)
                e++;
            i = e;
        }
        for (size_t j = b; j < e; j++)
            order[k++] = v->idx[j];
    }
    sto_cell c;
    size_t j = 0;
    while (sto_rowreader_next(r, &c, NULL) == ST_OK) {
        assert_true(j < n);
        const m_entry *m = &w->e[order[j]];
        assert_true(st_slice_eq(c.value, st_slice_cstr(m->value)));
        if (st_rng_below(rng, 3) == 0) {
            sto_rowreader_skip_row(r);
            while (j < n && w->e[order[j]].row == m->row)
                j++;
        } else {
            j++;
        }
    }
    assert_int_equal(j, n);
    free(order);
    sto_rowreader_free(r);
    st_buf_free(&want);
}

/* Copies every entry the compaction filter keeps into a new memtable. */
static sto_memtable *compact_into(sto_kviter *merged, const m_rules *mr, int64_t now, bool full,
                                  uint64_t bound, size_t *kept) {
    sto_memtable *out;
    assert_int_equal(sto_memtable_new(&out), ST_OK);
    sto_kviter *ci = sto_compact_iter_new(merged, mr->set, now, full, bound);
    st_buf prev;
    st_buf_init(&prev);
    *kept = 0;
    for (ci->ops->seek_first(ci); ci->ops->valid(ci); ci->ops->next(ci)) {
        st_slice k = ci->ops->key(ci);
        assert_true(*kept == 0 || st_slice_cmp(st_buf_slice(&prev), k) < 0);
        st_buf_reset(&prev);
        st_buf_append(&prev, k.data, k.len);
        assert_int_equal(sto_memtable_put(out, k, ci->ops->value(ci), 1), ST_OK);
        (*kept)++;
    }
    assert_int_equal(ci->ops->status(ci, NULL), ST_OK);
    ci->ops->free(ci);
    st_buf_free(&prev);
    return out;
}

static size_t count_entries(fixture *fx) {
    sto_kviter *it = fx_merged(fx);
    size_t n = 0;
    for (it->ops->seek_first(it); it->ops->valid(it); it->ops->next(it))
        n++;
    it->ops->free(it);
    return n;
}

/* Full compaction of everything, and a partial one of the first memtables only: reading the
 * result (with the untouched memtables) must give the model's cells. */
static void check_compactions(fixture *fx, const m_rules *mr, int64_t now, const st_buf *want,
                              uint64_t seed, int round, uint64_t max_version, st_rng *rng,
                              size_t *dropped) {
    st_buf got;
    st_buf_init(&got);
    sto_range all = {0};
    uint64_t bounds[3] = {0, st_rng_below(rng, max_version + 2), UINT64_MAX};
    size_t kept;
    fixture out;
    memset(&out, 0, sizeof out);
    out.n = 1;
    out.mt[0] = compact_into(fx_merged(fx), mr, now, true, bounds[st_rng_below(rng, 3)], &kept);
    *dropped += count_entries(fx) - kept;
    read_dump(fx_merged(&out), mr->set, now, &all, false, &got);
    expect_same(&got, want, seed, round, "full compaction");
    fx_free(&out);

    /* Partial: compact memtables [0, split) into one; keep the others as they are. */
    size_t split = 1 + (size_t)st_rng_below(rng, fx->n);
    fixture part;
    memset(&part, 0, sizeof part);
    part.n = split;
    for (size_t i = 0; i < split; i++)
        part.mt[i] = fx->mt[i];
    fixture mix;
    memset(&mix, 0, sizeof mix);
    mix.mt[0] = compact_into(fx_merged(&part), mr, now, false, UINT64_MAX, &kept);
    mix.n = 1;
    for (size_t i = split; i < fx->n; i++) {
        mix.mt[mix.n++] = fx->mt[i];
        sto_memtable_ref(fx->mt[i]);
    }
    read_dump(fx_merged(&mix), mr->set, now, &all, false, &got);
    expect_same(&got, want, seed, round, "partial compaction");
    fx_free(&mix);
    st_buf_free(&got);
}

static void test_rowread_random_vs_model(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("test_rowread_random_vs_model");
    st_rng rng;
    st_rng_seed(&rng, seed);
    m_world *w = malloc(sizeof *w);
    m_view *v = malloc(sizeof *v);
    assert_non_null(w);
    assert_non_null(v);
    st_buf got, want;
    st_buf_init(&got);
    st_buf_init(&want);
    size_t dropped = 0;
    for (int round = 0; round < 1500; round++) {
        fixture fx;
        fx_init(&fx, 1 + (size_t)st_rng_below(&rng, 4));
        w->n = 0;
        size_t n_muts = 1 + (size_t)st_rng_below(&rng, 60);
        /* Distinct versions in random order: arrival order is not version order. */
        uint64_t versions[64];
        for (size_t i = 0; i < n_muts; i++)
            versions[i] = i + 1;
        for (size_t i = n_muts; i > 1; i--) {
            size_t j = (size_t)st_rng_below(&rng, i);
            uint64_t t = versions[i - 1];
            versions[i - 1] = versions[j];
            versions[j] = t;
        }
        for (size_t i = 0; i < n_muts; i++)
            m_mutate(w, &fx, &rng, versions[i]);
        m_rules mr;
        m_rules_make(&mr, &rng);
        int64_t now = (int64_t)st_rng_below(&rng, TS_SPAN + 2) * 1000;
        m_visible(w, mr.by_fam, now, v);
        for (int k = 0; k < 4; k++) {
            sto_range range = {0};
            if (k >= 2)
                m_random_range(&rng, &range);
            bool reverse = k % 2;
            m_dump(w, v, &range, reverse, &want);
            read_dump(fx_merged(&fx), mr.set, now, &range, reverse, &got);
            expect_same(&got, &want, seed, round, reverse ? "reverse read" : "forward read");
        }
        check_skips(&fx, w, v, &mr, now, st_rng_below(&rng, 2), &rng);
        sto_range all = {0};
        m_dump(w, v, &all, false, &want);
        check_compactions(&fx, &mr, now, &want, seed, round, n_muts, &rng, &dropped);
        sto_gc_set_unref(mr.set);
        fx_free(&fx);
    }
    assert_true(dropped > 0); /* the filter did drop things */
    st_buf_free(&got);
    st_buf_free(&want);
    free(w);
    free(v);
}

/* Many column tombstones per column, where the reader stops checking a cell against each kept
 * tombstone and sweeps them (rowread.c, vis_col_hidden), and compares a new tombstone with only
 * the last few kept ones: random rows of one or two columns with up to hundreds of tombstones
 * (disjoint, overlapping or repeating ranges, some unbounded; versions in random order; a
 * mutation's deletes share its version) and cells (timestamps on and off range bounds, the same
 * timestamp written by several mutations), against the model's plain rule, forward, reverse,
 * with skips and through compactions. */
static void test_rowread_many_column_tombstones_vs_model(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("test_rowread_many_column_tombstones_vs_model");
    st_rng rng;
    st_rng_seed(&rng, seed);
    m_world *w = malloc(sizeof *w);
    m_view *v = malloc(sizeof *v);
    assert_non_null(w);
    assert_non_null(v);
    st_buf got, want;
    st_buf_init(&got);
    st_buf_init(&want);
    size_t dropped = 0;
    for (int round = 0; round < 300; round++) {
        fixture fx;
        fx_init(&fx, 1 + (size_t)st_rng_below(&rng, 4));
        w->n = 0;
        int row = (int)st_rng_below(&rng, N_ROWS);
        unsigned mode = (unsigned)st_rng_below(&rng, 3); /* disjoint, overlapping, repeating */
        int n_fams = 1 + (int)st_rng_below(&rng, 2), n_quals = 1 + (int)st_rng_below(&rng, 2);
        size_t n_muts = 1 + (size_t)st_rng_below(&rng, 60);
        uint64_t versions[64];
        for (size_t i = 0; i < n_muts; i++)
            versions[i] = i + 1;
        for (size_t i = n_muts; i > 1; i--) {
            size_t j = (size_t)st_rng_below(&rng, i);
            uint64_t t = versions[i - 1];
            versions[i - 1] = versions[j];
            versions[j] = t;
        }
        for (size_t m = 0; m < n_muts; m++) {
            sto_mut muts[12];
            m_entry me[12];
            size_t n = 1 + (size_t)st_rng_below(&rng, 12);
            for (size_t i = 0; i < n; i++) {
                m_entry *e = &me[i];
                memset(e, 0, sizeof *e);
                unsigned k = (unsigned)st_rng_below(&rng, 40);
                e->type = k < 24   ? STO_MUT_DEL_COLUMN
                          : k < 38 ? STO_MUT_SET_CELL
                          : k < 39 ? STO_MUT_DEL_FAMILY
                                   : STO_MUT_DEL_ROW;
                e->row = row;
                e->fam = (int)st_rng_below(&rng, (uint64_t)n_fams);
                e->qual = (int)st_rng_below(&rng, (uint64_t)n_quals);
                /* Cells on every half unit, so some sit exactly on a range's start or end. */
                e->ts = (int64_t)st_rng_below(&rng, 140) * 500;
                if (mode == 0) { /* disjoint unit ranges [2u, 2u + 1) */
                    e->start = (int64_t)st_rng_below(&rng, 35) * 2000;
                    e->end = e->start + 1000;
                } else if (mode == 1) { /* anything: overlapping, nested, empty, unbounded */
                    e->start = (int64_t)st_rng_below(&rng, 70) * 1000 - 500;
                    e->end = st_rng_below(&rng, 10) == 0
                                 ? STO_TS_END_INF
                                 : e->start + (int64_t)st_rng_below(&rng, 20) * 500;
                } else { /* few distinct ranges, each deleted again and again */
                    unsigned r = (unsigned)st_rng_below(&rng, 24);
                    e->start = (int64_t)(r % 8) * 7000;
                    e->end = r >= 20 ? STO_TS_END_INF : e->start + (int64_t)(1 + r / 8) * 3000;
                }
                e->version = versions[m];
                snprintf(e->value, sizeof e->value, "v%llu.%zu", (unsigned long long)e->version, i);
                muts[i] = (sto_mut){.type = e->type,
                                    .family = m_fam(e->fam),
                                    .qualifier = m_qual(e->qual),
                                    .ts_us = e->ts,
                                    .ts_start_us = e->start,
                                    .ts_end_us = e->end,
                                    .value = st_slice_cstr(e->value)};
            }
            m_apply(w, &fx, &rng, me, muts, n);
        }
        m_rules mr;
        m_rules_make(&mr, &rng);
        int64_t now = (int64_t)st_rng_below(&rng, 72) * 1000;
        m_visible(w, mr.by_fam, now, v);
        sto_range all = {0};
        for (int reverse = 0; reverse < 2; reverse++) {
            m_dump(w, v, &all, reverse, &want);
            read_dump(fx_merged(&fx), mr.set, now, &all, reverse, &got);
            expect_same(&got, &want, seed, round, reverse ? "reverse read" : "forward read");
        }
        check_skips(&fx, w, v, &mr, now, st_rng_below(&rng, 2), &rng);
        m_dump(w, v, &all, false, &want);
        check_compactions(&fx, &mr, now, &want, seed, round, n_muts, &rng, &dropped);
        sto_gc_set_unref(mr.set);
        fx_free(&fx);
    }
    assert_true(dropped > 0);
    st_buf_free(&got);
    st_buf_free(&want);
    free(w);
    free(v);
}

/* One mutation of 100,000 disjoint column tombstones [2i + 2, 2i + 3) ms (version 100) on one
 * column, and cells every 7 ms of the span, half older than the tombstones and half newer: each
 * cell is visible iff it is newer or its timestamp is in no range. Read forward and reverse,
 * and compacted (partial: tombstones kept, hidden cells dropped; full with every tombstone past
 * its grace: only the visible cells), read back. Linear per read since the sweep; before it, a
 * read of this row checked every cell and every tombstone against every kept tombstone. */
#define MANY_DELS 100000
#define MANY_SPAN_MS (2 * MANY_DELS + 4)
#define MANY_STEP_MS 7
#define MANY_BATCH 1000

static uint64_t many_version(int64_t j) {
    return (j / MANY_STEP_MS / MANY_BATCH) % 2 ? 150 : 50;
}

static bool many_visible(int64_t j) {
    bool covered = j % 2 == 0 && j >= 2 && j <= 2 * MANY_DELS;
    return many_version(j) > 100 || !covered;
}

/* Reads every cell: they must be the visible ones, in order; returns how many. */
static size_t many_read(sto_kviter *merged, bool reverse) {
    sto_rowreader *r;
    assert_int_equal(sto_rowreader_new(merged, NULL, 0, NULL, reverse, STO_ITER_USER, &r, NULL),
                     ST_OK);
    /* One row, so reverse reads it as forward does: cells newest first, each below `next`. */
    int64_t next = MANY_SPAN_MS;
    size_t n = 0;
    sto_cell c;
    while (sto_rowreader_next(r, &c, NULL) == ST_OK) {
        assert_int_equal(c.ts_us % 1000, 0);
        int64_t j = c.ts_us / 1000;
        assert_true(j < next && j % MANY_STEP_MS == 0);
        for (int64_t k = j + MANY_STEP_MS; k < next; k += MANY_STEP_MS)
            assert_false(many_visible(k)); /* a visible cell was left out */
        assert_true(many_visible(j));
        assert_int_equal(c.version, many_version(j));
        next = j;
        n++;
    }
    for (int64_t k = 0; k < next; k += MANY_STEP_MS)
        assert_false(many_visible(k));
    sto_rowreader_free(r);
    return n;
}

static void test_rowread_many_disjoint_column_tombstones(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 1);
    sto_mut *muts = calloc(MANY_DELS, sizeof *muts);
    assert_non_null(muts);
    for (int64_t i = 0; i < MANY_DELS; i++)
        muts[i] = (sto_mut){.type = STO_MUT_DEL_COLUMN,
                            .family = ST_SLICE_LIT("f"),
                            .qualifier = ST_SLICE_LIT("c"),
                            .ts_start_us = (2 * i + 2) * 1000,
                            .ts_end_us = (2 * i + 3) * 1000};
    fx_apply(&fx, 0, "r", 100, muts, MANY_DELS);
    size_t visible = 0, n = 0;
    for (int64_t j = 0; j < MANY_SPAN_MS; j += MANY_STEP_MS) {
        muts[n++] = (sto_mut){.type = STO_MUT_SET_CELL,
                              .family = ST_SLICE_LIT("f"),
                              .qualifier = ST_SLICE_LIT("c"),
                              .ts_us = j * 1000,
                              .value = ST_SLICE_LIT("v")};
        visible += many_visible(j);
        if (n == MANY_BATCH || j + MANY_STEP_MS >= MANY_SPAN_MS) {
            fx_apply(&fx, 0, "r", many_version(j), muts, n);
            n = 0;
        }
    }
    free(muts);
    assert_true(visible > 0 && visible < MANY_SPAN_MS / MANY_STEP_MS);
    assert_int_equal(many_read(fx_merged(&fx), false), visible);
    assert_int_equal(many_read(fx_merged(&fx), true), visible);

    m_rules none = {0};
    size_t kept;
    fixture out = {.n = 1};
    out.mt[0] = compact_into(fx_merged(&fx), &none, 0, false, UINT64_MAX, &kept);
    assert_int_equal(kept, MANY_DELS + visible);
    assert_int_equal(many_read(fx_merged(&out), false), visible);
    fx_free(&out);
    out.mt[0] = compact_into(fx_merged(&fx), &none, 0, true, UINT64_MAX, &kept);
    assert_int_equal(kept, visible);
    assert_int_equal(many_read(fx_merged(&out), false), visible);
    fx_free(&out);
    fx_free(&fx);
}

static void test_rowread_compaction_drops(void **state) {
    (void)state;
    fixture fx;
    fx_init(&fx, 1);
    APPLY(&fx, 0, "r", 10, SET("f", "q", 1, "a"), SET("f", "q", 2, "b"), SET("f", "q", 3, "c"));
    APPLY(&fx, 0, "r", 5, SET("f", "q", 3, "shadowed"));
    APPLY(&fx, 0, "r", 20, DELCOL("f", "q", 0, 2));          /* hides q@1 */
    APPLY(&fx, 0, "r", 15, DELCOL("f", "q", 0, 2));          /* redundant: same range, lower */
    APPLY(&fx, 0, "s", 30, DELROW(), SET("f", "q", 1, "x")); /* cell kept (written after) */
    APPLY(&fx, 0, "s", 25, DELFAM("f"));                     /* redundant under the row delete */
    sto_gc_set *g = gc_one("f", (sto_gc_rule){.kind = STO_GC_MAX_VERSIONS, .max_versions = 1});
    m_rules mr = {.set = g};
    size_t kept;
    /* Partial: drop hidden q@1, shadowed q@3/v5, the redundant tombstones; keep q@2 (versions
     * unknown), the column tombstone and the row tombstone. */
    sto_memtable *out = compact_into(fx_merged(&fx), &mr, 0, false, UINT64_MAX, &kept);
    assert_int_equal(kept, 5);
    sto_memtable_unref(out);
    /* Full with tombstones below 21 droppable: q@3, s's row tombstone (30) and cell remain. */
    out = compact_into(fx_merged(&fx), &mr, 0, true, 21, &kept);
    assert_int_equal(kept, 3);
    sto_memtable_unref(out);
    sto_gc_set_unref(g);
    fx_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rowread_delete_kinds),
        cmocka_unit_test(test_rowread_duplicates_highest_version_wins),
        cmocka_unit_test(test_rowread_gc_rules),
        cmocka_unit_test(test_rowread_reverse_order),
        cmocka_unit_test(test_rowread_ranges),
        cmocka_unit_test(test_rowread_skip_row_and_last_scanned),
        cmocka_unit_test(test_rowread_corrupt_key_is_data_loss),
        cmocka_unit_test(test_rowread_compaction_drops),
        cmocka_unit_test(test_rowread_random_vs_model),
        cmocka_unit_test(test_rowread_many_column_tombstones_vs_model),
        cmocka_unit_test(test_rowread_many_disjoint_column_tombstones),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
