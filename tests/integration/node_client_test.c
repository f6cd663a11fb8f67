/* node_client_test.c — proves that a real strata-node process, driven over gRPC by the C test
 * client (tests/support/btclient), stores and answers like Cloud Bigtable: every mutation kind,
 * a 20 MiB cell and a 64 MiB ReadRows answer, the documented error codes, MutateRows per-entry
 * statuses, CheckAndMutateRow, ReadModifyWriteRow, SampleRowKeys, and durability across a clean
 * stop (SIGTERM) and a crash (SIGKILL right after acknowledged writes). Every ReadRows answer goes
 * through the validating chunk reader, which is itself first checked on hand-made chunk streams.
 * Usage: node_client_test PATH/TO/strata-node */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "btclient.h"

#define BIG_CELL_BYTES ((size_t)20 << 20)
#define BIG_READ_CELL_BYTES ((size_t)8 << 20)
#define BIG_READ_CELLS 8 /* 8 x 8 MiB = a 64 MiB answer */
#define RESTART_ROWS 300

/* The node under test; one process for the whole group, restarted by the restart tests. */
typedef struct fixture {
    const char *bin;
    char dir[BT_PATH_MAX - 16];
    char data[BT_PATH_MAX];
    bt_proc node;
    bt_client c;
} fixture;

static const char *g_node_bin; /* argv[1], constant for the run */

static st_slice S(const char *s) {
    return st_slice_cstr(s);
}

static void node_up(fixture *f) {
    st_err err = {0};
    st_code rc = bt_node_start(&f->node, f->bin, f->data, &err);
    if (rc != ST_OK)
        fail_msg("starting strata-node: %s", err.msg);
    bt_client_init(&f->c, f->node.addr);
}

static int group_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->bin = g_node_bin;
    bt_tmpdir(f->dir, sizeof f->dir, "node_client");
    snprintf(f->data, sizeof f->data, "%s/data", f->dir);
    node_up(f);
    *state = f;
    return 0;
}

static int group_teardown(void **state) {
    fixture *f = *state;
    bt_proc_stop(&f->node, SIGTERM, NULL);
    if (!getenv("STRATA_KEEP_TMP"))
        bt_rmrf(f->dir);
    free(f);
    return 0;
}

static void create(fixture *f, const char *table, const char *families) {
    st_err st;
    st_code rc = bt_create_table(&f->c, table, families, &st);
    if (rc != ST_OK)
        fail_msg("CreateTable %s: %s %s", table, st_code_name(rc), st.msg);
}

static void must_ok(st_code rc, const st_err *st, const char *what) {
    if (rc != ST_OK)
        fail_msg("%s: %s %s", what, st_code_name(rc), st->msg);
}

static void expect_code(st_code got, st_code want, const st_err *st, const char *what) {
    if (got != want)
        fail_msg("%s: expected %s, got %s (%s)", what, st_code_name(want), st_code_name(got),
                 st->msg);
}

/* The whole table as canonical text. */
static char *dump_table(fixture *f, const char *table, const bt_read_req *req) {
    st_buf out;
    st_buf_init(&out);
    st_err st;
    bt_read_req all = {0};
    st_code rc = bt_read_dump(&f->c, table, req ? req : &all, &out, NULL, &st);
    must_ok(rc, &st, "ReadRows");
    st_buf_append_byte(&out, '\0');
    return (char *)out.data;
}

static void expect_dump(fixture *f, const char *table, const bt_read_req *req, const char *want) {
    char *got = dump_table(f, table, req);
    if (strcmp(got, want) != 0) {
        print_error("table %s\n--- expected\n%s--- got\n%s", table, want, got);
        free(got);
        fail();
    }
    free(got);
}

typedef struct dump_ctx_t {
    st_buf *out;
} dump_ctx_t;

static void dump_cb(const bt_row *row, void *arg) {
    bt_dump_row(((dump_ctx_t *)arg)->out, row, true);
}

static void set1(fixture *f, const char *table, const char *row, const char *fam, const char *qual,
                 int64_t ts, const char *val) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, fam, S(qual), ts, S(val));
    st_err st;
    must_ok(bt_mutate_row(&f->c, table, S(row), &m, &st), &st, "MutateRow");
    bt_muts_deinit(&m);
}

static void test_node_client_every_mutation_kind(void **state) {
    fixture *f = *state;
    /* maxage counts from the cell timestamp: 100 years keeps these 1970 timestamps. */
    create(f, "kinds", "cf1:maxversions=5,cf2:maxage=36500d||maxversions=3");
    bt_muts m;
    bt_muts_init(&m);
    st_err st;
    for (int ts = 1000; ts <= 4000; ts += 1000) {
        char v[16];
        snprintf(v, sizeof v, "a%d", ts);
        bt_muts_set(&m, "cf1", S("a"), ts, S(v));
    }
    bt_muts_set(&m, "cf1", S("b"), 1000, S("b1"));
    bt_muts_set(&m, "cf2", S(""), 2000, S("empty-qual"));
    bt_muts_set(&m, "cf2", S("z"), 3000, st_slice_make("\x00\xff", 2));
    must_ok(bt_mutate_row(&f->c, "kinds", S("r1"), &m, &st), &st, "MutateRow r1");
    bt_muts_reset(&m);
    bt_muts_set(&m, "cf1", S("a"), 5000, S("x"));
    bt_muts_set(&m, "cf2", S("q"), 6000, S("y"));
    must_ok(bt_mutate_row(&f->c, "kinds", S("r2"), &m, &st), &st, "MutateRow r2");
    must_ok(bt_mutate_row(&f->c, "kinds", S("r3"), &m, &st), &st, "MutateRow r3");
    expect_dump(f, "kinds", NULL,
                "r1\tcf1\ta\t4000\t\t6134303030\n"
                "r1\tcf1\ta\t3000\t\t6133303030\n"
                "r1\tcf1\ta\t2000\t\t6132303030\n"
                "r1\tcf1\ta\t1000\t\t6131303030\n"
                "r1\tcf1\tb\t1000\t\t6231\n"
                "r1\tcf2\t\t2000\t\t656d7074792d7175616c\n"
                "r1\tcf2\tz\t3000\t\t00ff\n"
                "r2\tcf1\ta\t5000\t\t78\n"
                "r2\tcf2\tq\t6000\t\t79\n"
                "r3\tcf1\ta\t5000\t\t78\n"
                "r3\tcf2\tq\t6000\t\t79\n");
    /* DeleteFromColumn over [2000, 4000) removes 2000 and 3000 only. */
    bt_muts_reset(&m);
    bt_muts_del_column(&m, "cf1", S("a"), 2000, 4000);
    bt_muts_del_column(&m, "cf1", S("b"), 0, 0);
    bt_muts_del_family(&m, "cf2");
    must_ok(bt_mutate_row(&f->c, "kinds", S("r1"), &m, &st), &st, "MutateRow deletes");
    bt_muts_reset(&m);
    bt_muts_del_row(&m);
    must_ok(bt_mutate_row(&f->c, "kinds", S("r2"), &m, &st), &st, "DeleteFromRow");
    /* A delete with an open-ended range: [1000, inf) in r3's cf2:q removes its only cell. */
    bt_muts_reset(&m);
    bt_muts_del_column(&m, "cf2", S("q"), 1000, 0);
    must_ok(bt_mutate_row(&f->c, "kinds", S("r3"), &m, &st), &st, "DeleteFromColumn open");
    expect_dump(f, "kinds", NULL,
                "r1\tcf1\ta\t4000\t\t6134303030\n"
                "r1\tcf1\ta\t1000\t\t6131303030\n"
                "r3\tcf1\ta\t5000\t\t78\n");
    /* Reversed read: rows descending, row contents unchanged. */
    bt_read_req rev = {.reversed = true};
    expect_dump(f, "kinds", &rev,
                "r3\tcf1\ta\t5000\t\t78\n"
                "r1\tcf1\ta\t4000\t\t6134303030\n"
                "r1\tcf1\ta\t1000\t\t6131303030\n");
    bt_muts_deinit(&m);
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

typedef struct big_ctx {
    size_t rows, cells, bytes;
    bool ok;
    const uint8_t *expect; /* pattern for seed = cell index, regenerated per cell */
    uint8_t *scratch;
    size_t cell_bytes;
} big_ctx;

static void big_row(const bt_row *row, void *arg) {
    big_ctx *b = arg;
    b->rows++;
    for (size_t i = 0; i < row->n_cells; i++) {
        unsigned idx = 0;
        if (sscanf((const char *)row->cells[i].qualifier.data, "c%u", &idx) != 1 ||
            row->cells[i].value.len != b->cell_bytes) {
            b->ok = false;
            continue;
        }
        fill_pattern(b->scratch, b->cell_bytes, idx);
        if (memcmp(b->scratch, row->cells[i].value.data, b->cell_bytes) != 0)
            b->ok = false;
        b->cells++;
        b->bytes += row->cells[i].value.len;
    }
}

static void test_node_client_large_values(void **state) {
    fixture *f = *state;
    create(f, "big", "cf");
    st_err st;
    bt_muts m;
    bt_muts_init(&m);
    uint8_t *v = malloc(BIG_CELL_BYTES);
    fill_pattern(v, BIG_CELL_BYTES, 20);
    bt_muts_set(&m, "cf", S("c20"), 1000, st_slice_make(v, BIG_CELL_BYTES));
    must_ok(bt_mutate_row(&f->c, "big", S("huge"), &m, &st), &st, "MutateRow 20 MiB");
    big_ctx b = {.ok = true, .scratch = malloc(BIG_CELL_BYTES), .cell_bytes = BIG_CELL_BYTES};
    bt_read_req one = {0};
    st_arena a;
    st_arena_init(&a, 4096);
    Google__Bigtable__V2__RowSet *rs = bt_rowset_new(&a);
    bt_rowset_add_key(&a, rs, S("huge"));
    one.rows = rs;
    must_ok(bt_read_rows(&f->c, "big", &one, big_row, &b, &st), &st, "ReadRows 20 MiB");
    assert_true(b.ok);
    assert_int_equal(b.cells, 1);
    free(b.scratch);
    /* 8 cells of 8 MiB over 4 rows: one 64 MiB answer, streamed in chunks. */
    for (unsigned i = 0; i < BIG_READ_CELLS; i++) {
        char row[16], qual[16];
        snprintf(row, sizeof row, "m%u", i / 2);
        snprintf(qual, sizeof qual, "c%u", 100 + i);
        bt_muts_reset(&m);
        fill_pattern(v, BIG_READ_CELL_BYTES, 100 + i);
        bt_muts_set(&m, "cf", S(qual), 1000, st_slice_make(v, BIG_READ_CELL_BYTES));
        must_ok(bt_mutate_row(&f->c, "big", S(row), &m, &st), &st, "MutateRow 8 MiB");
    }
    big_ctx b2 = {
        .ok = true, .scratch = malloc(BIG_READ_CELL_BYTES), .cell_bytes = BIG_READ_CELL_BYTES};
    bt_read_req range = {0};
    Google__Bigtable__V2__RowSet *rs2 = bt_rowset_new(&a);
    st_slice lo = S("m"), hi = S("n");
    bt_rowset_add_range(&a, rs2, &lo, true, &hi, false);
    range.rows = rs2;
    must_ok(bt_read_rows(&f->c, "big", &range, big_row, &b2, &st), &st, "ReadRows 64 MiB");
    assert_true(b2.ok);
    assert_int_equal(b2.rows, BIG_READ_CELLS / 2);
    assert_int_equal(b2.cells, BIG_READ_CELLS);
    assert_int_equal(b2.bytes, (size_t)BIG_READ_CELLS * BIG_READ_CELL_BYTES);
    free(b2.scratch);
    free(v);
    st_arena_deinit(&a);
    bt_muts_deinit(&m);
}

static void test_node_client_error_codes(void **state) {
    fixture *f = *state;
    create(f, "errs", "cf");
    st_err st;
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("q"), 1000, S("v"));
    expect_code(bt_mutate_row(&f->c, "no-such-table", S("r"), &m, &st), ST_NOT_FOUND, &st,
                "MutateRow unknown table");
    bt_read_req all = {0};
    st_buf out;
    st_buf_init(&out);
    expect_code(bt_read_dump(&f->c, "no-such-table", &all, &out, NULL, &st), ST_NOT_FOUND, &st,
                "ReadRows unknown table");
    expect_code(bt_mutate_row(&f->c, "errs", S(""), &m, &st), ST_INVALID_ARGUMENT, &st,
                "MutateRow empty row key");
    char *longkey = malloc(4097);
    memset(longkey, 'k', 4096);
    longkey[4096] = '\0';
    expect_code(bt_mutate_row(&f->c, "errs", S(longkey), &m, &st), ST_OK, &st,
                "MutateRow 4096-byte key");
    longkey[4096] = 'k';
    expect_code(bt_mutate_row(&f->c, "errs", st_slice_make(longkey, 4097), &m, &st),
                ST_INVALID_ARGUMENT, &st, "MutateRow 4097-byte key");
    free(longkey);
    bt_muts_reset(&m);
    bt_muts_set(&m, "nofam", S("q"), 1000, S("v"));
    expect_code(bt_mutate_row(&f->c, "errs", S("r"), &m, &st), ST_NOT_FOUND, &st,
                "MutateRow unknown family");
    bt_muts_reset(&m);
    expect_code(bt_mutate_row(&f->c, "errs", S("r"), &m, &st), ST_INVALID_ARGUMENT, &st,
                "MutateRow no mutations");
    for (int i = 0; i < 100001; i++)
        bt_muts_set(&m, "cf", S("q"), 1000 * (int64_t)(i + 1), S("v"));
    expect_code(bt_mutate_row(&f->c, "errs", S("r"), &m, &st), ST_INVALID_ARGUMENT, &st,
                "MutateRow 100001 mutations");
    bt_muts_reset(&m);
    bt_muts_set(&m, "cf", S("q"), 1500, S("v"));
    expect_code(bt_mutate_row(&f->c, "errs", S("r"), &m, &st), ST_INVALID_ARGUMENT, &st,
                "MutateRow timestamp not a multiple of 1000 (millisecond table)");
    st_arena a;
    st_arena_init(&a, 4096);
    bt_read_req bad = {
        .filter = bt_filter_bytes(&a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER,
                                  S("(unclosed"))};
    expect_code(bt_read_dump(&f->c, "errs", &bad, &out, NULL, &st), ST_INVALID_ARGUMENT, &st,
                "ReadRows invalid regex");
    bt_read_req unk = {
        .filter = bt_filter_bytes(&a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER,
                                  S("[z-a]"))};
    expect_code(bt_read_dump(&f->c, "errs", &unk, &out, NULL, &st), ST_INVALID_ARGUMENT, &st,
                "ReadRows invalid value regex");
    st_buf_free(&out);
    st_arena_deinit(&a);
    bt_muts_deinit(&m);
}

static void test_node_client_mutate_rows_statuses(void **state) {
    fixture *f = *state;
    create(f, "batch", "cf");
    bt_muts good, bad;
    bt_muts_init(&good);
    bt_muts_init(&bad);
    bt_muts_set(&good, "cf", S("q"), 1000, S("ok"));
    bt_muts_set(&bad, "cf", S("q"), 1000, S("ok"));
    bt_muts_set(&bad, "missing", S("q"), 1000, S("no"));
    bt_entry e[4] = {{S("a"), &good}, {S("b"), &bad}, {S("c"), &good}, {S(""), &good}};
    st_code codes[4];
    st_err msgs[4], st;
    must_ok(bt_mutate_rows(&f->c, "batch", e, 4, codes, msgs, &st), &st, "MutateRows");
    expect_code(codes[0], ST_OK, &msgs[0], "entry 0");
    expect_code(codes[1], ST_NOT_FOUND, &msgs[1], "entry 1 (unknown family)");
    expect_code(codes[2], ST_OK, &msgs[2], "entry 2");
    expect_code(codes[3], ST_INVALID_ARGUMENT, &msgs[3], "entry 3 (empty row key)");
    /* Entry 1 is atomic: its valid SetCell must not have been applied. */
    expect_dump(f, "batch", NULL, "a\tcf\tq\t1000\t\t6f6b\nc\tcf\tq\t1000\t\t6f6b\n");
    bt_muts_deinit(&good);
    bt_muts_deinit(&bad);
}

static void test_node_client_check_and_mutate(void **state) {
    fixture *f = *state;
    create(f, "cam", "cf");
    set1(f, "cam", "r", "cf", "flag", 1000, "on");
    st_arena a;
    st_arena_init(&a, 4096);
    bt_filter *pred =
        bt_filter_bytes(&a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER, S("on"));
    bt_muts t, e;
    bt_muts_init(&t);
    bt_muts_init(&e);
    bt_muts_set(&t, "cf", S("res"), 2000, S("true"));
    bt_muts_set(&e, "cf", S("res"), 2000, S("false"));
    bool matched = false;
    st_err st;
    must_ok(bt_check_and_mutate(&f->c, "cam", S("r"), pred, &t, &e, &matched, &st), &st, "CAM 1");
    assert_true(matched);
    must_ok(bt_check_and_mutate(&f->c, "cam", S("other"), pred, &t, &e, &matched, &st), &st,
            "CAM 2");
    assert_false(matched);
    /* No predicate: "the row has any cell". */
    must_ok(bt_check_and_mutate(&f->c, "cam", S("empty"), NULL, &t, &e, &matched, &st), &st,
            "CAM 3");
    assert_false(matched);
    expect_dump(f, "cam", NULL,
                "empty\tcf\tres\t2000\t\t66616c7365\n"
                "other\tcf\tres\t2000\t\t66616c7365\n"
                "r\tcf\tflag\t1000\t\t6f6e\n"
                "r\tcf\tres\t2000\t\t74727565\n");
    bt_muts_deinit(&t);
    bt_muts_deinit(&e);
    st_arena_deinit(&a);
}

static void test_node_client_read_modify_write(void **state) {
    fixture *f = *state;
    create(f, "rmw", "cf");
    st_err st;
    st_buf out;
    st_buf_init(&out);
    bt_rmw_rule inc = {.family = "cf", .qualifier = S("n"), .increment = 5};
    must_ok(bt_read_modify_write(&f->c, "rmw", S("r"), &inc, 1, &out, false, &st), &st, "RMW 1");
    inc.increment = -7;
    must_ok(bt_read_modify_write(&f->c, "rmw", S("r"), &inc, 1, &out, false, &st), &st, "RMW 2");
    bt_rmw_rule app[2] = {{.family = "cf", .qualifier = S("s"), .append = true, .value = S("ab")},
                          {.family = "cf", .qualifier = S("s"), .append = true, .value = S("cd")}};
    must_ok(bt_read_modify_write(&f->c, "rmw", S("r"), app, 2, &out, false, &st), &st, "RMW 3");
    st_buf_append_byte(&out, '\0');
    assert_string_equal((char *)out.data, "r\tcf\tn\t*\t\t0000000000000005\n"
                                          "r\tcf\tn\t*\t\tfffffffffffffffe\n"
                                          "r\tcf\ts\t*\t\t61626364\n");
    set1(f, "rmw", "r", "cf", "odd", 1000, "abc");
    inc.qualifier = S("odd");
    expect_code(bt_read_modify_write(&f->c, "rmw", S("r"), &inc, 1, NULL, false, &st),
                ST_FAILED_PRECONDITION, &st, "increment of a 3-byte value");
    inc.family = "nofam";
    expect_code(bt_read_modify_write(&f->c, "rmw", S("r"), &inc, 1, NULL, false, &st), ST_NOT_FOUND,
                &st, "RMW unknown family");
    st_buf_free(&out);
}

static void test_node_client_sample_row_keys(void **state) {
    fixture *f = *state;
    create(f, "sample", "cf");
    for (int i = 0; i < 100; i++) {
        char row[16];
        snprintf(row, sizeof row, "row%03d", i);
        set1(f, "sample", row, "cf", "q", 1000, "value");
    }
    st_buf out;
    st_buf_init(&out);
    size_t n = 0;
    st_err st;
    must_ok(bt_sample_row_keys(&f->c, "sample", &out, &n, &st), &st, "SampleRowKeys");
    assert_true(n >= 1);
    st_buf_append_byte(&out, '\0');
    /* The last sample is the end of the table: the empty key. */
    const char *last = (const char *)out.data;
    for (const char *p = last; *p; p++)
        if (p[0] == '\n' && p[1])
            last = p + 1;
    assert_true(last[0] == '\t');
    st_buf_free(&out);
}

/* Writes RESTART_ROWS acknowledged rows, stops the node with sig, restarts, and reads back. */
static void restart_with(fixture *f, const char *table, int sig) {
    create(f, table, "cf:maxversions=3");
    for (int i = 0; i < RESTART_ROWS; i++) {
        char row[16], val[32];
        snprintf(row, sizeof row, "k%04d", (i * 7919) % RESTART_ROWS);
        snprintf(val, sizeof val, "value-%d", i);
        set1(f, table, row, "cf", i % 2 ? "odd" : "even", 1000 * (i % 5 + 1), val);
    }
    char *want = dump_table(f, table, NULL);
    assert_non_null(strstr(want, "k0299\t"));
    int status = 0;
    bt_proc_stop(&f->node, sig, &status);
    if (sig == SIGTERM)
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    node_up(f);
    char *got = dump_table(f, table, NULL);
    if (strcmp(want, got) != 0) {
        print_error("after %s restart\n--- before\n%.2000s--- after\n%.2000s",
                    sig == SIGKILL ? "SIGKILL" : "SIGTERM", want, got);
        fail();
    }
    free(want);
    free(got);
}

/* Each restart test writes, after the restart, to the table it created before it: the table is
 * still listed and writable, and the test needs nothing an earlier test left behind. */
static void test_node_client_restart_after_sigterm(void **state) {
    restart_with(*state, "restart_term", SIGTERM);
    set1(*state, "restart_term", "after", "cf", "a", 1000, "x");
}

static void test_node_client_restart_after_sigkill(void **state) {
    restart_with(*state, "restart_kill", SIGKILL);
    set1(*state, "restart_kill", "after", "cf", "a", 1000, "x");
}

/* ---- the chunk reader itself (no server): it must reject what the Go client rejects ---- */

typedef Google__Bigtable__V2__ReadRowsResponse__CellChunk chunk_t;

typedef struct chunk_spec {
    const char *key; /* NULL = empty */
    const char *fam; /* NULL = absent */
    const char *qual;
    int64_t ts;
    const char *value;
    int32_t value_size;
    char status; /* 'c' commit, 'r' reset, 0 none */
    const char *label;
} chunk_spec;

/* Feeds the chunks; returns the index of the first rejected one, n if all were accepted but the
 * stream end was refused, -1 if everything was accepted; *dump receives the committed rows. */
static int feed_chunks(const chunk_spec *cs, int n, bool reversed, st_buf *dump) {
    dump_ctx_t ctx = {dump};
    bt_chunk_reader *r = bt_chunk_reader_new(reversed, dump_cb, &ctx);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        chunk_t c;
        google__bigtable__v2__read_rows_response__cell_chunk__init(&c);
        Google__Protobuf__StringValue fam;
        Google__Protobuf__BytesValue qual;
        char *labels[1] = {(char *)cs[i].label};
        if (cs[i].key)
            c.row_key = (ProtobufCBinaryData){strlen(cs[i].key), (uint8_t *)cs[i].key};
        if (cs[i].fam) {
            google__protobuf__string_value__init(&fam);
            fam.value = (char *)cs[i].fam;
            c.family_name = &fam;
        }
        if (cs[i].qual) {
            google__protobuf__bytes_value__init(&qual);
            qual.value = (ProtobufCBinaryData){strlen(cs[i].qual), (uint8_t *)cs[i].qual};
            c.qualifier = &qual;
        }
        c.timestamp_micros = cs[i].ts;
        if (cs[i].value)
            c.value = (ProtobufCBinaryData){strlen(cs[i].value), (uint8_t *)cs[i].value};
        c.value_size = cs[i].value_size;
        if (cs[i].label) {
            c.n_labels = 1;
            c.labels = labels;
        }
        if (cs[i].status == 'c') {
            c.row_status_case =
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
            c.commit_row = 1;
        } else if (cs[i].status == 'r') {
            c.row_status_case =
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_RESET_ROW;
            c.reset_row = 1;
        }
        if (bt_chunk_reader_feed(r, &c, NULL) != ST_OK)
            bad = i;
    }
    if (bad < 0 && bt_chunk_reader_finish(r, NULL) != ST_OK)
        bad = n;
    bt_chunk_reader_free(r);
    st_buf_append_byte(dump, '\0');
    return bad;
}

#define FEED(arr, rev, dump) feed_chunks(arr, (int)(sizeof arr / sizeof arr[0]), rev, dump)

static void test_node_client_chunk_reader_accepts_valid_streams(void **state) {
    (void)state;
    st_buf d;
    st_buf_init(&d);
    /* Two rows; a split value; a reset row re-sent; an empty family and qualifier name; a
     * second timestamp of the same column (no family/qualifier). */
    const chunk_spec ok[] = {
        {"a", "f", "q", 2000, "x", 0, 0, "lab"},  {NULL, NULL, NULL, 1000, "y", 0, 0, NULL},
        {NULL, "", "", 0, "he", 5, 0, NULL},      {NULL, NULL, NULL, 0, "llo", 0, 'c', NULL},
        {"b", "f", "q", 0, "gone", 0, 0, NULL},   {NULL, NULL, NULL, 0, NULL, 0, 'r', NULL},
        {"b", "f", "q", 0, "kept", 0, 'c', NULL},
    };
    assert_int_equal(FEED(ok, false, &d), -1);
    assert_string_equal((char *)d.data, "a\tf\tq\t2000\tlab\t78\n"
                                        "a\tf\tq\t1000\t\t79\n"
                                        "a\t\t\t0\t\t68656c6c6f\n"
                                        "b\tf\tq\t0\t\t6b657074\n");
    st_buf_reset(&d);
    const chunk_spec rev[] = {{"b", "f", "q", 0, "1", 0, 'c', NULL},
                              {"a", "f", "q", 0, "2", 0, 'c', NULL}};
    assert_int_equal(FEED(rev, true, &d), -1);
    st_buf_free(&d);
}

static void test_node_client_chunk_reader_rejects_protocol_errors(void **state) {
    (void)state;
    st_buf d;
    st_buf_init(&d);
    const chunk_spec no_family[] = {{"a", NULL, "q", 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(no_family, false, &d), 0);
    const chunk_spec no_qualifier[] = {{"a", "f", NULL, 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(no_qualifier, false, &d), 0);
    const chunk_spec order[] = {{"b", "f", "q", 0, "v", 0, 'c', NULL},
                                {"a", "f", "q", 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(order, false, &d), 1);
    const chunk_spec dup[] = {{"b", "f", "q", 0, "v", 0, 'c', NULL},
                              {"b", "f", "q", 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(dup, false, &d), 1);
    const chunk_spec rev_order[] = {{"a", "f", "q", 0, "v", 0, 'c', NULL},
                                    {"b", "f", "q", 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(rev_order, true, &d), 1);
    const chunk_spec reset_between[] = {{"a", "f", "q", 0, "v", 0, 'c', NULL},
                                        {NULL, NULL, NULL, 0, NULL, 0, 'r', NULL}};
    assert_int_equal(FEED(reset_between, false, &d), 1);
    const chunk_spec reset_fields[] = {{"a", "f", "q", 0, "v", 0, 0, NULL},
                                       {NULL, NULL, NULL, 0, "x", 0, 'r', NULL}};
    assert_int_equal(FEED(reset_fields, false, &d), 1);
    const chunk_spec new_key[] = {{"a", "f", "q", 0, "v", 0, 0, NULL},
                                  {"b", "f", "q", 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(new_key, false, &d), 1);
    const chunk_spec fam_alone[] = {{"a", "f", "q", 0, "v", 0, 0, NULL},
                                    {NULL, "g", NULL, 0, "v", 0, 'c', NULL}};
    assert_int_equal(FEED(fam_alone, false, &d), 1);
    const chunk_spec commit_split[] = {{"a", "f", "q", 0, "v", 3, 'c', NULL}};
    assert_int_equal(FEED(commit_split, false, &d), 0);
    const chunk_spec cont_fields[] = {{"a", "f", "q", 0, "v", 3, 0, NULL},
                                      {NULL, NULL, "q", 0, "ww", 0, 'c', NULL}};
    assert_int_equal(FEED(cont_fields, false, &d), 1);
    const chunk_spec cont_label[] = {{"a", "f", "q", 0, "v", 3, 0, NULL},
                                     {NULL, NULL, NULL, 0, "ww", 0, 'c', "l"}};
    assert_int_equal(FEED(cont_label, false, &d), 1);
    const chunk_spec short_split[] = {{"a", "f", "q", 0, "v", 5, 0, NULL},
                                      {NULL, NULL, NULL, 0, "ww", 0, 'c', NULL}};
    assert_int_equal(FEED(short_split, false, &d), 1);
    const chunk_spec unfinished[] = {{"a", "f", "q", 0, "v", 0, 0, NULL}};
    assert_int_equal(FEED(unfinished, false, &d), 1);
    st_buf_free(&d);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/strata-node\n", argv[0]);
        return 2;
    }
    g_node_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_client_chunk_reader_accepts_valid_streams),
        cmocka_unit_test(test_node_client_chunk_reader_rejects_protocol_errors),
        cmocka_unit_test(test_node_client_every_mutation_kind),
        cmocka_unit_test(test_node_client_large_values),
        cmocka_unit_test(test_node_client_error_codes),
        cmocka_unit_test(test_node_client_mutate_rows_statuses),
        cmocka_unit_test(test_node_client_check_and_mutate),
        cmocka_unit_test(test_node_client_read_modify_write),
        cmocka_unit_test(test_node_client_sample_row_keys),
        cmocka_unit_test(test_node_client_restart_after_sigterm),
        cmocka_unit_test(test_node_client_restart_after_sigkill),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
