/*
 * Proves the RowFilter module follows Bigtable's semantics: every filter kind on small rows whose
 * expected output is written out by hand (cells rendered as "fam:qual@ts=value[labels]"), the
 * sink example from data.proto, labels (a condition's predicate never returns its own), the
 * order of an interleave's copies of one cell, limits and offsets counting them, regex
 * full-match semantics on raw bytes ('.' skips '\n', '\C' is any byte, high bytes are single
 * characters), Bigtable's validation rules and their error messages, hostile regexes and hostile
 * nesting, deterministic row sampling, and the evaluation budget. A randomized test (STRATA_SEED)
 * compares the evaluator, which shares and compacts buffers in place, against a naive model that
 * copies everything, and checks the per-cell streaming path against full evaluation, and so the
 * head of any filter streamed cell by cell with its rest evaluated over what the head kept (the
 * read path's way to hold only those cells of a row).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "filter.h"
#include "regex_cost.h"

#define S(lit) ST_SLICE_LIT(lit)
#define CELLS_MAX 64
#define RENDER_BYTES 4096

typedef struct fixture {
    st_arena arena;
    st_rng rng;
    node_cell cells[CELLS_MAX];
    size_t n;
    char out[RENDER_BYTES];
} fixture;

static fixture *fx_new(void) {
    fixture *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    st_arena_init(&fx->arena, 1 << 16);
    st_rng_seed(&fx->rng, 42);
    return fx;
}

static void fx_free(fixture *fx) {
    st_arena_deinit(&fx->arena);
    free(fx);
}

static void add(fixture *fx, const char *fam, const char *qual, int64_t ts, const char *val) {
    assert_true(fx->n < CELLS_MAX);
    fx->cells[fx->n++] = (node_cell){.family = st_slice_cstr(fam),
                                     .qualifier = st_slice_cstr(qual),
                                     .ts_us = ts,
                                     .value = st_slice_cstr(val)};
}

/* The standard row: two families, versions newest first. */
static void add_standard_row(fixture *fx) {
    add(fx, "a", "x", 3, "v3");
    add(fx, "a", "x", 2, "v2");
    add(fx, "a", "x", 1, "v1");
    add(fx, "a", "y", 5, "w5");
    add(fx, "b", "x", 4, "z4");
    add(fx, "b", "z", 7, "");
}

static void render_cell(char *buf, size_t cap, size_t *len, const node_cell *c) {
    *len += (size_t)snprintf(buf + *len, cap - *len, "%s%.*s:%.*s@%lld=%.*s", *len ? " " : "",
                             (int)c->family.len, (const char *)c->family.data,
                             (int)c->qualifier.len, (const char *)c->qualifier.data,
                             (long long)c->ts_us, (int)c->value.len, (const char *)c->value.data);
    for (uint32_t l = 0; l < c->n_labels; l++)
        *len += (size_t)snprintf(buf + *len, cap - *len, "%s%.*s%s", l ? "," : "[",
                                 (int)c->labels[l].len, (const char *)c->labels[l].data,
                                 l + 1 == c->n_labels ? "]" : "");
    assert_true(*len < cap);
}

/* Prepares f, evaluates it on the fixture row with key `key`, releases it; returns the
 * rendered output. */
static const char *run_key(fixture *fx, node_filter *f, const char *key) {
    st_err err;
    assert_non_null(f);
    if (node_filter_prepare(f, &err) != ST_OK)
        fail_msg("prepare failed: %s", err.msg);
    node_filter_ctx ctx = {.arena = &fx->arena, .rng = &fx->rng};
    const node_cell *const *out;
    size_t n;
    assert_int_equal(
        node_filter_eval(f, st_slice_cstr(key), fx->cells, fx->n, &ctx, &out, &n, &err), ST_OK);
    size_t len = 0;
    fx->out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        render_cell(fx->out, sizeof fx->out, &len, out[i]);
    node_filter_release(f);
    return fx->out;
}

static const char *run(fixture *fx, node_filter *f) {
    return run_key(fx, f, "row");
}

/* Builders over the fixture arena, to keep the trees readable. */
static node_filter *chain2(fixture *fx, node_filter *a, node_filter *b) {
    node_filter *subs[] = {a, b};
    return node_filter_list(&fx->arena, NODE_FILTER_CHAIN, subs, 2);
}
static node_filter *chain3(fixture *fx, node_filter *a, node_filter *b, node_filter *c) {
    node_filter *subs[] = {a, b, c};
    return node_filter_list(&fx->arena, NODE_FILTER_CHAIN, subs, 3);
}
static node_filter *inter2(fixture *fx, node_filter *a, node_filter *b) {
    node_filter *subs[] = {a, b};
    return node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, subs, 2);
}
static node_filter *inter3(fixture *fx, node_filter *a, node_filter *b, node_filter *c) {
    node_filter *subs[] = {a, b, c};
    return node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, subs, 3);
}
static node_filter *kind(fixture *fx, node_filter_kind k) {
    return node_filter_new(&fx->arena, k);
}
static node_filter *rx(fixture *fx, node_filter_kind k, const char *pat) {
    return node_filter_regex(&fx->arena, k, st_slice_cstr(pat));
}
static node_filter *rxn(fixture *fx, node_filter_kind k, const char *pat, size_t len) {
    return node_filter_regex(&fx->arena, k, st_slice_make(pat, len));
}
static node_filter *fam(fixture *fx, const char *pat) {
    return rx(fx, NODE_FILTER_FAMILY_NAME_REGEX, pat);
}
static node_filter *qual(fixture *fx, const char *pat) {
    return rx(fx, NODE_FILTER_COLUMN_QUALIFIER_REGEX, pat);
}
static node_filter *label(fixture *fx, const char *l) {
    return node_filter_label(&fx->arena, st_slice_cstr(l));
}
static node_filter *cnt(fixture *fx, node_filter_kind k, int64_t n) {
    return node_filter_count(&fx->arena, k, n);
}
static node_bound closed(const char *k) {
    return (node_bound){NODE_BOUND_CLOSED, st_slice_cstr(k)};
}
static node_bound open_(const char *k) {
    return (node_bound){NODE_BOUND_OPEN, st_slice_cstr(k)};
}
static const node_bound UNB = {NODE_BOUND_UNBOUNDED, {NULL, 0}};

/* Expects prepare to fail with code and a message containing `needle`. */
static void expect_invalid(node_filter *f, st_code code, const char *needle) {
    st_err err;
    st_err_clear(&err);
    assert_int_equal(node_filter_prepare(f, &err), code);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    /* validate says the same and leaves nothing compiled (ASan checks for leaks). */
    assert_int_equal(node_filter_validate(f, &err), code);
}

static void test_filter_pass_block_and_null(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    const char *all = "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4 b:z@7=";
    assert_string_equal(run(fx, kind(fx, NODE_FILTER_PASS_ALL)), all);
    assert_string_equal(run(fx, kind(fx, NODE_FILTER_BLOCK_ALL)), "");
    /* A NULL filter passes all too. */
    node_filter_ctx ctx = {.arena = &fx->arena, .rng = &fx->rng};
    const node_cell *const *out;
    size_t n;
    assert_int_equal(node_filter_eval(NULL, S("k"), fx->cells, fx->n, &ctx, &out, &n, NULL), ST_OK);
    assert_int_equal(n, fx->n);
    /* An empty row stays empty. */
    assert_int_equal(node_filter_eval(NULL, S("k"), fx->cells, 0, &ctx, &out, &n, NULL), ST_OK);
    assert_int_equal(n, 0);
    fx_free(fx);
}

static void test_filter_chain_is_sequential(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    assert_string_equal(run(fx, chain2(fx, fam(fx, "a"), qual(fx, "x"))),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1");
    /* Order matters: limit then family differs from family then limit. */
    assert_string_equal(
        run(fx, chain2(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 2), fam(fx, "b"))), "");
    assert_string_equal(
        run(fx, chain2(fx, fam(fx, "b"), cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 1))), "b:x@4=z4");
    /* Nested chains. */
    assert_string_equal(run(fx, chain2(fx, chain2(fx, fam(fx, "a"), qual(fx, "x")),
                                       chain2(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 1),
                                              kind(fx, NODE_FILTER_STRIP_VALUE)))),
                        "a:x@2= a:x@1=");
    fx_free(fx);
}

static void test_filter_interleave_merges_in_row_order(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    /* Branch outputs merge into row order; the cell both branches pass appears twice. */
    assert_string_equal(
        run(fx, inter2(fx, qual(fx, "z"), chain2(fx, fam(fx, "a"), qual(fx, "y|z")))),
        "a:y@5=w5 b:z@7=");
    assert_string_equal(run(fx, inter2(fx, qual(fx, "y"), chain2(fx, fam(fx, "a"), qual(fx, "y")))),
                        "a:y@5=w5 a:y@5=w5");
    /* Identical cells keep branch order: labelled 'one' first, then 'two'. */
    assert_string_equal(
        run(fx, inter2(fx, chain2(fx, qual(fx, "y"), label(fx, "one")),
                       chain2(fx, fam(fx, "a|b"), chain2(fx, qual(fx, "y"), label(fx, "two"))))),
        "a:y@5=w5[one] a:y@5=w5[two]");
    /* Three branches interleave by timestamp within a column. */
    assert_string_equal(run(fx, chain2(fx, qual(fx, "x"),
                                       inter3(fx, node_filter_ts_range(&fx->arena, 1, 2),
                                              node_filter_ts_range(&fx->arena, 3, 0),
                                              node_filter_ts_range(&fx->arena, 2, 3)))),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1 b:x@4=z4");
    /* An empty branch contributes nothing. */
    assert_string_equal(run(fx, inter2(fx, kind(fx, NODE_FILTER_BLOCK_ALL), qual(fx, "z"))),
                        "b:z@7=");
    fx_free(fx);
}

static void test_filter_interleave_duplicates_keep_branch_order(void **state) {
    (void)state;
    fixture *fx = fx_new();
    /* One column of many versions through interleave(pass_all, strip_value): each version's two
     * copies come in branch order, the value first, however long the column (the emulator sorts
     * a column's cells with an unstable sort, so its order varies past a dozen cells). */
    static const char *const values[] = {"v9", "v8", "v7", "v6", "v5", "v4", "v3", "v2", "v1"};
    for (int i = 0; i < 9; i++)
        add(fx, "a", "q", 9 - i, values[i]);
    char want[RENDER_BYTES];
    size_t len = 0;
    for (int i = 0; i < 9; i++)
        len += (size_t)snprintf(want + len, sizeof want - len, "%sa:q@%d=%s a:q@%d=", i ? " " : "",
                                9 - i, values[i], 9 - i);
    node_filter *f = inter2(fx, kind(fx, NODE_FILTER_PASS_ALL), kind(fx, NODE_FILTER_STRIP_VALUE));
    assert_string_equal(run(fx, f), want);
    /* Swapping the branches swaps each pair. */
    len = 0;
    for (int i = 0; i < 9; i++)
        len += (size_t)snprintf(want + len, sizeof want - len, "%sa:q@%d= a:q@%d=%s", i ? " " : "",
                                9 - i, 9 - i, values[i]);
    f = inter2(fx, kind(fx, NODE_FILTER_STRIP_VALUE), kind(fx, NODE_FILTER_PASS_ALL));
    assert_string_equal(run(fx, f), want);
    fx_free(fx);
}

static void test_filter_condition_picks_a_branch(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    node_filter *has_b = fam(fx, "b");
    node_filter *cond = node_filter_condition(&fx->arena, has_b, qual(fx, "y"), qual(fx, "z"));
    assert_string_equal(run(fx, cond), "a:y@5=w5");
    cond = node_filter_condition(&fx->arena, fam(fx, "nope"), qual(fx, "y"), qual(fx, "z"));
    assert_string_equal(run(fx, cond), "b:z@7=");
    /* A missing branch outputs nothing. */
    cond = node_filter_condition(&fx->arena, fam(fx, "b"), NULL, qual(fx, "z"));
    assert_string_equal(run(fx, cond), "");
    cond = node_filter_condition(&fx->arena, fam(fx, "nope"), qual(fx, "y"), NULL);
    assert_string_equal(run(fx, cond), "");
    /* The branch sees the condition's input, not the predicate's output. */
    cond = node_filter_condition(&fx->arena, qual(fx, "y"),
                                 cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 1), NULL);
    assert_string_equal(run(fx, cond), "a:x@3=v3");
    /* A missing predicate passes everything, so the true branch runs. */
    cond = node_filter_condition(&fx->arena, NULL, qual(fx, "z"), NULL);
    assert_string_equal(run(fx, cond), "b:z@7=");
    /* The predicate only picks the branch: its cells, labels included, are never returned, at
     * any depth (nested conditions, an interleave of conditions). */
    node_filter *inner = node_filter_condition(&fx->arena, label(fx, "p1"),
                                               chain2(fx, qual(fx, "y"), label(fx, "p2")), NULL);
    cond = node_filter_condition(&fx->arena, inner, qual(fx, "z"), label(fx, "f"));
    assert_string_equal(run(fx, cond), "b:z@7=");
    node_filter *left = node_filter_condition(&fx->arena, label(fx, "p"), qual(fx, "y"), NULL);
    node_filter *right = node_filter_condition(
        &fx->arena, chain2(fx, label(fx, "p"), fam(fx, "nope")), NULL, qual(fx, "z"));
    assert_string_equal(run(fx, inter2(fx, left, right)), "a:y@5=w5 b:z@7=");
    /* Inside a chain the condition sees the narrowed row. */
    cond = node_filter_condition(&fx->arena, fam(fx, "b"), kind(fx, NODE_FILTER_PASS_ALL),
                                 kind(fx, NODE_FILTER_STRIP_VALUE));
    assert_string_equal(run(fx, chain2(fx, fam(fx, "a"), cond)), "a:x@3= a:x@2= a:x@1= a:y@5=");
    fx_free(fx);
}

static void test_filter_sink_bypasses_later_filters(void **state) {
    (void)state;
    fixture *fx = fx_new();
    /* data.proto's example: Chain(FamilyRegex("A"), Interleave(All(), Chain(Label("foo"), Sink())),
     * QualifierRegex("B")). */
    add(fx, "A", "A", 1, "w");
    add(fx, "A", "B", 2, "x");
    add(fx, "B", "B", 4, "z");
    node_filter *f = chain3(fx, fam(fx, "A"),
                            inter2(fx, kind(fx, NODE_FILTER_PASS_ALL),
                                   chain2(fx, label(fx, "foo"), kind(fx, NODE_FILTER_SINK))),
                            qual(fx, "B"));
    assert_string_equal(run(fx, f), "A:A@1=w[foo] A:B@2=x[foo] A:B@2=x");
    /* A sink at the end of a chain outputs its input; the parent sees nothing. */
    f = chain2(fx, fam(fx, "B"), kind(fx, NODE_FILTER_SINK));
    assert_string_equal(run(fx, f), "B:B@4=z");
    f = chain3(fx, fam(fx, "B"), kind(fx, NODE_FILTER_SINK), kind(fx, NODE_FILTER_PASS_ALL));
    assert_string_equal(run(fx, f), "B:B@4=z");
    /* Sink output is merged with the normal output in row order. */
    f = inter2(fx, chain2(fx, fam(fx, "B"), kind(fx, NODE_FILTER_SINK)), qual(fx, "A"));
    assert_string_equal(run(fx, f), "A:A@1=w B:B@4=z");
    /* A bare sink outputs the whole row once. */
    assert_string_equal(run(fx, kind(fx, NODE_FILTER_SINK)), "A:A@1=w A:B@2=x B:B@4=z");
    fx_free(fx);
}

static void test_filter_labels_and_strip(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    assert_string_equal(run(fx, chain2(fx, qual(fx, "z"), label(fx, "l-1"))), "b:z@7=[l-1]");
    assert_string_equal(
        run(fx, chain3(fx, fam(fx, "b"), kind(fx, NODE_FILTER_STRIP_VALUE), label(fx, "x"))),
        "b:x@4=[x] b:z@7=[x]");
    /* Labels accumulate on cells that arrive labelled. */
    static const st_slice pre[] = {{(const uint8_t *)"pre", 3}};
    fx->cells[5].labels = pre;
    fx->cells[5].n_labels = 1;
    assert_string_equal(run(fx, chain2(fx, qual(fx, "z"), label(fx, "post"))), "b:z@7=[pre,post]");
    /* Strip keeps labels. */
    assert_string_equal(run(fx, chain2(fx, qual(fx, "z"), kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "b:z@7=[pre]");
    fx_free(fx);
}

static void test_filter_limits_and_offsets(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 2)), "a:x@3=v3 a:x@2=v2");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 100)),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4 b:z@7=");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 4)), "b:x@4=z4 b:z@7=");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 0)),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4 b:z@7=");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 6)), "");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1)),
                        "a:x@3=v3 a:y@5=w5 b:x@4=z4 b:z@7=");
    assert_string_equal(run(fx, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 2)),
                        "a:x@3=v3 a:x@2=v2 a:y@5=w5 b:x@4=z4 b:z@7=");
    /* Same qualifier in two families is two columns. */
    assert_string_equal(
        run(fx, chain2(fx, qual(fx, "x"), cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1))),
        "a:x@3=v3 b:x@4=z4");
    /* Duplicates from an interleave count separately. */
    node_filter *dup = inter2(fx, qual(fx, "y"), qual(fx, "y|z"));
    assert_string_equal(run(fx, chain2(fx, dup, cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 2))),
                        "a:y@5=w5 a:y@5=w5");
    dup = inter2(fx, qual(fx, "y"), qual(fx, "y|z"));
    assert_string_equal(run(fx, chain2(fx, dup, cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 1))),
                        "a:y@5=w5 b:z@7=");
    dup = inter2(fx, qual(fx, "x"), qual(fx, "x"));
    assert_string_equal(run(fx, chain2(fx, dup, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 3))),
                        "a:x@3=v3 a:x@3=v3 a:x@2=v2 b:x@4=z4 b:x@4=z4");
    fx_free(fx);
}

static void test_filter_ranges(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    add(fx, "b", "zz", 1, "q");
    st_arena *a = &fx->arena;
    assert_string_equal(run(fx, node_filter_column_range(a, S("b"), closed("x"), closed("z"))),
                        "b:x@4=z4 b:z@7=");
    assert_string_equal(run(fx, node_filter_column_range(a, S("b"), open_("x"), open_("zz"))),
                        "b:z@7=");
    assert_string_equal(run(fx, node_filter_column_range(a, S("b"), UNB, UNB)),
                        "b:x@4=z4 b:z@7= b:zz@1=q");
    assert_string_equal(run(fx, node_filter_column_range(a, S("a"), open_("x"), UNB)), "a:y@5=w5");
    assert_string_equal(run(fx, node_filter_column_range(a, S("c"), UNB, UNB)), "");
    /* Timestamps: [start, end), end 0 is infinity. */
    assert_string_equal(run(fx, node_filter_ts_range(a, 2, 4)), "a:x@3=v3 a:x@2=v2");
    assert_string_equal(run(fx, node_filter_ts_range(a, 5, 0)), "a:y@5=w5 b:z@7=");
    assert_string_equal(run(fx, node_filter_ts_range(a, 0, 1)), "");
    /* Values compare as bytes; unbounded start includes the empty value. */
    assert_string_equal(run(fx, node_filter_value_range(a, UNB, open_("v2"))),
                        "a:x@1=v1 b:z@7= b:zz@1=q");
    assert_string_equal(run(fx, node_filter_value_range(a, closed("v2"), closed("w5"))),
                        "a:x@3=v3 a:x@2=v2 a:y@5=w5");
    assert_string_equal(run(fx, node_filter_value_range(a, open_("v3"), UNB)), "a:y@5=w5 b:x@4=z4");
    fx_free(fx);
}

static void test_filter_regex_full_match_on_bytes(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add(fx, "f", "a\nb", 3,
        "x\xff"
        "y"); /* byte order: \n < b < x < \xe9 */
    add(fx, "f", "ab", 1, "");
    add(fx, "f", "axb", 1, "xy");
    add(fx, "f",
        "a\xe9"
        "b",
        2, "\n");
    /* Full match: "a" alone matches none of the qualifiers. */
    assert_string_equal(run(fx, qual(fx, "a")), "");
    /* '.' matches any byte but '\n', including high bytes; '\C' matches any byte. */
    assert_string_equal(run(fx, chain2(fx, qual(fx, "a.b"), kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:axb@1= f:a\xe9"
                        "b@2=");
    assert_string_equal(
        run(fx, chain2(fx, qual(fx, "a\\Cb"), cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 1))),
        "f:a\nb@3=x\xff"
        "y");
    /* A raw high byte in the pattern is one Latin-1 character. */
    assert_string_equal(run(fx, chain2(fx,
                                       qual(fx, "a\xe9"
                                                "b"),
                                       kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:a\xe9"
                        "b@2=");
    assert_string_equal(run(fx, chain2(fx, qual(fx, "a\\xe9b"), kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:a\xe9"
                        "b@2=");
    /* Value regexes: \C* matches everything, .* not a value holding '\n'. */
    assert_string_equal(run(fx, chain2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "\\C*"),
                                       kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:a\nb@3= f:ab@1= f:axb@1= f:a\xe9"
                        "b@2=");
    assert_string_equal(run(fx, chain2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, ".*"),
                                       kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:a\nb@3= f:ab@1= f:axb@1=");
    /* An empty value regex matches only empty values; case matters. */
    assert_string_equal(run(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "")), "f:ab@1=");
    assert_string_equal(run(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "XY")), "");
    /* A NUL byte inside a pattern is a literal. */
    fx->n = 0;
    add(fx, "f", "q", 1, "");
    fx->cells[0].value = st_slice_make("a\0b", 3);
    assert_string_equal(run(fx, chain2(fx, rxn(fx, NODE_FILTER_VALUE_REGEX, "a\0b", 3),
                                       kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:q@1=");
    /* Row key regexes pass or drop the whole row. */
    assert_string_equal(run_key(fx, rx(fx, NODE_FILTER_ROW_KEY_REGEX, "r.w"), "r\nw"), "");
    assert_string_equal(run_key(fx,
                                chain2(fx, rx(fx, NODE_FILTER_ROW_KEY_REGEX, "r\\Cw"),
                                       kind(fx, NODE_FILTER_STRIP_VALUE)),
                                "r\nw"),
                        "f:q@1=");
    assert_string_equal(run_key(fx, rx(fx, NODE_FILTER_ROW_KEY_REGEX, "ro"), "row"), "");
    /* Family regexes. */
    assert_string_equal(run(fx, chain2(fx, fam(fx, "[a-f]"), kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:q@1=");
    fx_free(fx);
}

static void test_filter_invalid_regex_is_invalid_argument(void **state) {
    (void)state;
    fixture *fx = fx_new();
    expect_invalid(rx(fx, NODE_FILTER_ROW_KEY_REGEX, "(a"), ST_INVALID_ARGUMENT,
                   "Error in field 'row_key_regex_filter' : missing ): (a");
    expect_invalid(rx(fx, NODE_FILTER_VALUE_REGEX, "a**"), ST_INVALID_ARGUMENT,
                   "Error in field 'value_regex_filter' : bad repetition operator");
    expect_invalid(
        qual(fx, "[z-a]"), ST_INVALID_ARGUMENT,
        "Error in field 'column_qualifier_regex_filter' : invalid character class range");
    expect_invalid(qual(fx, "\\"), ST_INVALID_ARGUMENT, "trailing \\");
    /* A bad regex deep in a tree fails the whole tree and leaks nothing compiled before it. */
    node_filter *f = chain2(fx, inter2(fx, qual(fx, "ok"), fam(fx, "fine")),
                            chain2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "good"), qual(fx, "(")));
    expect_invalid(f, ST_INVALID_ARGUMENT, "missing )");
    fx_free(fx);
}

static node_filter *deep_chain(fixture *fx, int levels) {
    node_filter *f = kind(fx, NODE_FILTER_PASS_ALL);
    for (int i = 0; i < levels; i++)
        f = chain2(fx, f, qual(fx, "\\C*"));
    return f;
}

static void test_filter_validation_rules(void **state) {
    (void)state;
    fixture *fx = fx_new();
    st_arena *a = &fx->arena;
    add_standard_row(fx);
    expect_invalid(fam(fx, "a:b"), ST_INVALID_ARGUMENT, "must not contain ':'");
    expect_invalid(fam(fx, "[:alpha:]"), ST_INVALID_ARGUMENT, "must not contain ':'");
    expect_invalid(fam(fx, ""), ST_INVALID_ARGUMENT,
                   "Error in field 'family_name_regex_filter' : argument must not be empty");
    expect_invalid(rx(fx, NODE_FILTER_ROW_KEY_REGEX, ""), ST_INVALID_ARGUMENT,
                   "Error in field 'row_key_regex_filter' : argument must not be empty");
    /* Labels: 1..15 of [a-z0-9-]. */
    assert_string_equal(run(fx, chain2(fx, qual(fx, "z"), label(fx, "abcdefghij-1234"))),
                        "b:z@7=[abcdefghij-1234]");
    expect_invalid(label(fx, "abcdefghij-12345"), ST_INVALID_ARGUMENT, "1 to 15 characters");
    expect_invalid(label(fx, ""), ST_INVALID_ARGUMENT, "1 to 15 characters");
    expect_invalid(label(fx, "Upper"), ST_INVALID_ARGUMENT, "got 'Upper'");
    expect_invalid(label(fx, "a_b"), ST_INVALID_ARGUMENT, "[a-z0-9-]");
    /* Rule 2: one label-applying sub-filter per chain, counted through nesting; fine in an
     * interleave. */
    expect_invalid(chain2(fx, label(fx, "a"), label(fx, "b")), ST_INVALID_ARGUMENT,
                   "at most one sub-filter");
    expect_invalid(chain2(fx, label(fx, "a"), inter2(fx, label(fx, "b"), qual(fx, "x"))),
                   ST_INVALID_ARGUMENT, "at most one sub-filter");
    expect_invalid(chain2(fx, node_filter_condition(a, qual(fx, "x"), label(fx, "b"), NULL),
                          chain2(fx, qual(fx, "y"), label(fx, "c"))),
                   ST_INVALID_ARGUMENT, "at most one sub-filter");
    assert_string_equal(run(fx, inter2(fx, chain2(fx, qual(fx, "y"), label(fx, "a")),
                                       chain2(fx, qual(fx, "z"), label(fx, "b")))),
                        "a:y@5=w5[a] b:z@7=[b]");
    /* One labelled sub-filter holding an interleave of labels is fine. */
    assert_string_equal(
        run(fx, chain2(fx, qual(fx, "y"), inter2(fx, label(fx, "a"), label(fx, "b")))),
        "a:y@5=w5[a] a:y@5=w5[b]");
    /* Rule 3: no sink anywhere under a condition. */
    expect_invalid(node_filter_condition(a, kind(fx, NODE_FILTER_SINK), NULL, NULL),
                   ST_INVALID_ARGUMENT, "sink cannot be used within");
    expect_invalid(
        node_filter_condition(a, NULL, NULL, chain2(fx, qual(fx, "x"), kind(fx, NODE_FILTER_SINK))),
        ST_INVALID_ARGUMENT, "sink cannot be used within");
    /* Limits and offsets. */
    expect_invalid(cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, -1), ST_INVALID_ARGUMENT,
                   "Error in field 'cells_per_row_limit_filter' : argument must be > 0");
    expect_invalid(cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 0), ST_INVALID_ARGUMENT, "> 0");
    expect_invalid(cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 0), ST_INVALID_ARGUMENT,
                   "Error in field 'cells_per_column_limit_filter' : argument must be > 0");
    expect_invalid(cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, -5), ST_INVALID_ARGUMENT, ">= 0");
    /* Row sample in (0, 1). */
    expect_invalid(node_filter_row_sample(a, 0.0), ST_INVALID_ARGUMENT, "row_sample_filter");
    expect_invalid(node_filter_row_sample(a, 1.0), ST_INVALID_ARGUMENT, "row_sample_filter");
    expect_invalid(node_filter_row_sample(a, NAN), ST_INVALID_ARGUMENT, "row_sample_filter");
    /* Ranges. */
    expect_invalid(node_filter_ts_range(a, -1, 0), ST_INVALID_ARGUMENT, "must not be negative");
    expect_invalid(node_filter_column_range(a, S(""), UNB, UNB), ST_INVALID_ARGUMENT,
                   "family_name must not be empty");
    /* Chains and interleaves need two filters. */
    node_filter *one[] = {qual(fx, "x")};
    expect_invalid(node_filter_list(a, NODE_FILTER_CHAIN, one, 1), ST_INVALID_ARGUMENT,
                   "Chain must contain at least two RowFilters");
    expect_invalid(node_filter_list(a, NODE_FILTER_INTERLEAVE, NULL, 0), ST_INVALID_ARGUMENT,
                   "Interleave must contain at least two RowFilters");
    /* Depth: NODE_FILTER_DEPTH_MAX levels of nesting pass, one more fails. */
    assert_string_equal(run(fx, deep_chain(fx, NODE_FILTER_DEPTH_MAX)),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4 b:z@7=");
    expect_invalid(deep_chain(fx, NODE_FILTER_DEPTH_MAX + 1), ST_INVALID_ARGUMENT,
                   "nested more than 20 levels");
    fx_free(fx);
}

static void test_filter_hostile_nesting_is_rejected_without_recursion(void **state) {
    (void)state;
    fixture *fx = fx_new();
    /* 200,000 nested chains would overflow a small stack if walked recursively to the bottom. */
    node_filter *f = deep_chain(fx, 200000);
    expect_invalid(f, ST_INVALID_ARGUMENT, "nested more than");
    node_filter_release(f); /* bounded too */
    fx_free(fx);
}

static void test_filter_hostile_regex(void **state) {
    (void)state;
    fixture *fx = fx_new();
    /* Nested repetition past RE2's 1,000 fails with RE2's message; past the compile budget too,
     * before RE2 sees it. */
    expect_invalid(rx(fx, NODE_FILTER_VALUE_REGEX, "a{2}{1000}"), ST_INVALID_ARGUMENT,
                   "bad repetition operator");
    expect_invalid(rx(fx, NODE_FILTER_VALUE_REGEX, "(?:a{2}){1000}"), ST_INVALID_ARGUMENT,
                   "invalid repetition size");
    expect_invalid(rx(fx, NODE_FILTER_VALUE_REGEX, "a{1000}{1000}"), ST_INVALID_ARGUMENT,
                   "to compile");
    /* A legal but enormous program is refused before it is compiled. */
    size_t reps = 1000, one = strlen("[a-z]{1000}");
    char *big = malloc(reps * one + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(big + i * one, "[a-z]{1000}", one);
    big[reps * one] = '\0';
    expect_invalid(rx(fx, NODE_FILTER_VALUE_REGEX, big), ST_INVALID_ARGUMENT, "to compile");
    free(big);
    /* Catastrophic-backtracking patterns stay linear: (a*)*b on 1 MiB of 'a'. */
    size_t len = 1 << 20;
    char *val = malloc(len + 1);
    memset(val, 'a', len);
    val[len] = '\0';
    add(fx, "f", "q", 1, val);
    assert_string_equal(run(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "(a*)*b")), "");
    assert_string_equal(run(fx, chain2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "(a|aa)*"),
                                       kind(fx, NODE_FILTER_STRIP_VALUE))),
                        "f:q@1=");
    free(val);
    fx_free(fx);
}

/* An interleave of n value regexes, each `pattern|i` (distinct, as a client would make them). */
static node_filter *many_regexes(fixture *fx, const char *pattern, size_t n) {
    node_filter **subs = st_arena_alloc(&fx->arena, n * sizeof *subs);
    assert_non_null(subs);
    for (size_t i = 0; i < n; i++) {
        char *p = st_arena_alloc(&fx->arena, strlen(pattern) + 16);
        assert_non_null(p);
        snprintf(p, strlen(pattern) + 16, "%s|%zu", pattern, i);
        subs[i] = rx(fx, NODE_FILTER_VALUE_REGEX, p);
    }
    return node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, subs, n);
}

static void test_filter_compile_work_is_bounded(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    /* 400 regexes (\pL|\pN){300} in 9 KB: the node compiled them for 0.5 to 2 s on its loop. The
     * refusal names the regex where the budget ran out and says what to do. */
    expect_invalid(many_regexes(fx, "(\\pL|\\pN){300}", 400), ST_INVALID_ARGUMENT,
                   "Error in field 'value_regex_filter' : the row filter's regexes up to "
                   "'(\\pL|\\pN){300}|");
    expect_invalid(many_regexes(fx, "(\\pL|\\pN){300}", 400), ST_INVALID_ARGUMENT,
                   "use fewer regexes, shorter repetitions");
    /* Unicode classes cost their parse even without repetition: 3,000 \pL in one regex. */
    char *pl = malloc(3 * 3000 + 1);
    for (size_t i = 0; i < 3000; i++)
        memcpy(pl + 3 * i, "\\pL", 3);
    pl[3 * 3000] = '\0';
    expect_invalid(rx(fx, NODE_FILTER_ROW_KEY_REGEX, pl), ST_INVALID_ARGUMENT,
                   "Error in field 'row_key_regex_filter'");
    free(pl);
    /* The budget is the filter's: in a condition's predicate as anywhere. */
    expect_invalid(node_filter_condition(&fx->arena, many_regexes(fx, "[a-z]{1000}", 60), NULL,
                                         kind(fx, NODE_FILTER_PASS_ALL)),
                   ST_INVALID_ARGUMENT, "more than the 50000 one filter may take");
    /* Ordinary filters pass: 300 regexes of a usual shape, a cbt-like interleave of 100 columns,
     * a few Unicode classes, hexadecimal ids. */
    st_err err;
    node_filter *f = many_regexes(fx, ".*(a|b|c|d|e|f|g|h|x)+.*[0-9]{2,}.*x{5,}.*", 300);
    assert_int_equal(node_filter_prepare(f, &err), ST_OK);
    node_filter_release(f);
    node_filter *cols[100];
    for (size_t i = 0; i < 100; i++)
        cols[i] = chain2(fx, fam(fx, "cf[0-9]"), qual(fx, "col_[0-9a-f]{8}"));
    f = node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, cols, 100);
    assert_int_equal(node_filter_prepare(f, &err), ST_OK);
    node_filter_release(f);
    assert_string_equal(run(fx, chain2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "\\pL\\pN|[a-z]{1,64}"),
                                       many_regexes(fx, "[0-9a-f]{32}", 40))),
                        "");
    assert_string_equal(run(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "\\pL\\pN")),
                        "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4");
    fx_free(fx);
}

/* The estimate follows RE2's reading of the pattern: repetitions multiply what they repeat
 * (nested ones multiply each other), braces that are not a repetition are literals, \Q...\E
 * quotes, Unicode classes cost their parse, and nesting past the limit saturates. */
static void test_filter_regex_cost_reads_the_pattern(void **state) {
    (void)state;
#define COST(lit) node_regex_cost((const uint8_t *)(lit), strlen(lit))
    uint64_t base = NODE_REGEX_COST_BASE;
    assert_int_equal(COST("a"), base + 1 + 1);
    assert_int_equal(COST("a{1000}"), base + 7 + 1000);
    assert_int_equal(COST("a{2,}"), base + 5 + 3);
    assert_int_equal(COST("a{2,9}"), base + 6 + 9);
    assert_int_equal(COST("(?:ab){10}"), base + 10 + 10 * 3); /* ':' and the two letters */
    assert_int_equal(COST("(?:a{10}){10}"), base + 13 + 10 * 11);
    assert_int_equal(COST("ab|c{5}"), base + 7 + 2 + 5);
    assert_int_equal(COST("a\\{1000}"), base + 8 + 7);      /* an escaped brace: literals */
    assert_int_equal(COST("a{x}"), base + 4 + 4);           /* not a repetition */
    assert_int_equal(COST("\\Qa{1000}\\E"), base + 11 + 7); /* quoted */
    assert_int_equal(COST("[a{]{3}"), base + 7 + 3 * 5);    /* a class, repeated */
    assert_int_equal(COST("[]a]"), base + 4 + 5);           /* a leading ] is a member */
    assert_int_equal(COST("\\pL"),
                     base + 3 + NODE_REGEX_COST_UNICODE_PARSE + NODE_REGEX_COST_UNICODE_COPY);
    assert_int_equal(COST("\\p{Greek}{10}"),
                     base + 13 + NODE_REGEX_COST_UNICODE_PARSE + 10 * NODE_REGEX_COST_UNICODE_COPY);
    assert_int_equal(COST("[\\pL0]"),
                     base + 6 + NODE_REGEX_COST_UNICODE_PARSE + 7 + NODE_REGEX_COST_UNICODE_COPY);
    assert_int_equal(COST(".{10}"), base + 5 + 20);
    assert_true(COST("((((a{1000}){1000}){1000}){1000}){1000}") == NODE_REGEX_COST_MAX);
    assert_int_equal(COST("((a"), base + 3 + 1); /* unclosed: RE2 refuses it, still weighed */
    size_t deep = NODE_REGEX_COST_DEPTH_MAX + 1;
    char *p = malloc(deep);
    memset(p, '(', deep);
    assert_true(node_regex_cost((const uint8_t *)p, deep) == NODE_REGEX_COST_MAX);
    free(p);
#undef COST
}

static void test_filter_row_sample_is_deterministic(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    int kept[2] = {0, 0};
    for (int round = 0; round < 2; round++) {
        st_rng_seed(&fx->rng, 7);
        for (int i = 0; i < 1000; i++) {
            node_filter *f = node_filter_row_sample(&fx->arena, 0.25);
            kept[round] += run(fx, f)[0] != '\0';
        }
    }
    assert_int_equal(kept[0], kept[1]);
    assert_in_range(kept[0], 180, 320); /* ~250 of 1000 */
    /* A sample keeps or drops whole rows. */
    const char *all = "a:x@3=v3 a:x@2=v2 a:x@1=v1 a:y@5=w5 b:x@4=z4 b:z@7=";
    for (int i = 0; i < 50; i++) {
        const char *out = run(fx, node_filter_row_sample(&fx->arena, 0.5));
        assert_true(out[0] == '\0' || strcmp(out, all) == 0);
    }
    fx_free(fx);
}

/* The work one evaluation over a row may take counts each regex at its cost and each value
 * regex per byte of value: an interleave of 300 value regexes over 6,000 cells of 58 bytes held
 * the node's loop 0.7 s and must be refused; a light filter over 100,000 cells still fits. */
static void test_filter_row_work_counts_regexes_and_value_bytes(void **state) {
    (void)state;
    fixture *fx = fx_new();
    node_filter *subs[300];
    for (int i = 0; i < 300; i++)
        subs[i] = rx(fx, NODE_FILTER_VALUE_REGEX, ".*x{5,}.*");
    node_filter *heavy = node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, subs, 300);
    node_filter_cost c = node_filter_cost_of(heavy);
    assert_int_equal(c.weight, 1 + 300 * NODE_FILTER_REGEX_WEIGHT);
    assert_int_equal(c.value_regexes, 300);
    st_err err;
    st_err_clear(&err);
    assert_int_equal(node_filter_row_work_check(c, 6000, 6000 * 58, &err), ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "units of work"));
    assert_non_null(strstr(err.msg, "use fewer regexes"));
    /* A condition counts its predicate and both branches. */
    node_filter *cond = node_filter_condition(&fx->arena, rx(fx, NODE_FILTER_VALUE_REGEX, "v"),
                                              kind(fx, NODE_FILTER_PASS_ALL), heavy);
    assert_int_equal(node_filter_cost_of(cond).value_regexes, 301);
    /* The light filter of edges_nodejs_test over 100,000 one-byte values fits. */
    node_filter *light =
        inter2(fx, rx(fx, NODE_FILTER_VALUE_REGEX, "v"), kind(fx, NODE_FILTER_BLOCK_ALL));
    assert_int_equal(node_filter_row_work_check(node_filter_cost_of(light), 100000, 100000, &err),
                     ST_OK);
    /* One value regex over 100 cells: fine over 100-byte values, not over 1 MiB values. */
    node_filter_cost one = node_filter_cost_of(rx(fx, NODE_FILTER_VALUE_REGEX, "v.*"));
    assert_int_equal(node_filter_row_work_check(one, 100, 100 * 100, &err), ST_OK);
    assert_int_equal(node_filter_row_work_check(one, 100, (size_t)100 << 20, &err),
                     ST_FAILED_PRECONDITION);
    assert_true(node_filter_work(one, 100, 400) ==
                100 * NODE_FILTER_REGEX_WEIGHT + 400 / NODE_FILTER_REGEX_BYTES_PER_UNIT);
    fx_free(fx);
}

static void test_filter_budget_stops_exponential_interleaves(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    /* A chain of 6 interleaves of 10 pass_alls each (66 small nodes, far under the 20 KiB size
     * limit) multiplies the row by 10^6. */
    node_filter *tens[10], *levels[6];
    for (int i = 0; i < 10; i++)
        tens[i] = kind(fx, NODE_FILTER_PASS_ALL);
    for (int i = 0; i < 6; i++)
        levels[i] = node_filter_list(&fx->arena, NODE_FILTER_INTERLEAVE, tens, 10);
    node_filter *f = node_filter_list(&fx->arena, NODE_FILTER_CHAIN, levels, 6);
    st_err err;
    assert_int_equal(node_filter_prepare(f, &err), ST_OK);
    node_filter_ctx ctx = {.arena = &fx->arena, .rng = &fx->rng, .cells_max = 100000};
    const node_cell *const *out;
    size_t n;
    assert_int_equal(node_filter_eval(f, S("k"), fx->cells, fx->n, &ctx, &out, &n, &err),
                     ST_FAILED_PRECONDITION);
    assert_non_null(strstr(err.msg, "intermediate cells"));
    node_filter_release(f);
    /* A long chain of narrowing filters over a big row compacts in place and fits easily. */
    st_arena big;
    st_arena_init(&big, 1 << 20);
    size_t rows = 20000;
    node_cell *cells = calloc(rows, sizeof *cells);
    char(*vals)[8] = calloc(rows, 8);
    for (size_t i = 0; i < rows; i++) {
        snprintf(vals[i], 8, "%06zu", i);
        cells[i] =
            (node_cell){S("f"), S("q"), (int64_t)(rows - i), st_slice_cstr(vals[i]), NULL, 0};
    }
    node_filter *subs[400];
    char bounds[400][8];
    for (int i = 0; i < 400; i++) {
        snprintf(bounds[i], 8, "%06d", i);
        subs[i] = node_filter_value_range(&big, open_(bounds[i]), UNB);
    }
    f = node_filter_list(&big, NODE_FILTER_CHAIN, subs, 400);
    assert_int_equal(node_filter_prepare(f, &err), ST_OK);
    node_filter_ctx bctx = {.arena = &big, .rng = &fx->rng, .cells_max = 3 * rows};
    assert_int_equal(node_filter_eval(f, S("k"), cells, rows, &bctx, &out, &n, &err), ST_OK);
    assert_int_equal(n, rows - 400);
    assert_memory_equal(out[0]->value.data, "000400", 6);
    node_filter_release(f);
    st_arena_deinit(&big);
    free(cells);
    free(vals);
    fx_free(fx);
}

/* ---- randomized comparison with a naive model ---- */

typedef struct mlist {
    node_cell *v;
    size_t n;
} mlist;

static mlist m_alloc(st_arena *a, size_t n) {
    mlist l = {st_arena_alloc(a, (n ? n : 1) * sizeof(node_cell)), 0};
    assert_non_null(l.v);
    return l;
}

/* Stable insertion sort: identical cells keep their order. */
static void m_sort(mlist *l) {
    for (size_t i = 1; i < l->n; i++) {
        node_cell c = l->v[i];
        size_t j = i;
        while (j > 0 && node_cell_cmp(&c, &l->v[j - 1]) < 0) {
            l->v[j] = l->v[j - 1];
            j--;
        }
        l->v[j] = c;
    }
}

static void m_append(st_arena *a, mlist *dst, mlist src) {
    mlist n = m_alloc(a, dst->n + src.n);
    memcpy(n.v, dst->v, dst->n * sizeof(node_cell));
    memcpy(n.v + dst->n, src.v, src.n * sizeof(node_cell));
    n.n = dst->n + src.n;
    *dst = n;
}

typedef struct model {
    st_arena *a;
    st_rng *rng;
    st_slice key;
    mlist sink;
} model;

static bool m_keep(model *m, const node_filter *f, const node_cell *c) {
    switch (f->kind) {
    case NODE_FILTER_ROW_KEY_REGEX:
        return node_re2_full_match(f->u.regex.re, m->key.data, m->key.len);
    case NODE_FILTER_FAMILY_NAME_REGEX:
        return node_re2_full_match(f->u.regex.re, c->family.data, c->family.len);
    case NODE_FILTER_COLUMN_QUALIFIER_REGEX:
        return node_re2_full_match(f->u.regex.re, c->qualifier.data, c->qualifier.len);
    case NODE_FILTER_VALUE_REGEX:
        return node_re2_full_match(f->u.regex.re, c->value.data, c->value.len);
    case NODE_FILTER_TIMESTAMP_RANGE:
        return c->ts_us >= f->u.ts_range.start_us &&
               (f->u.ts_range.end_us == 0 || c->ts_us < f->u.ts_range.end_us);
    default: /* column and value ranges: reuse the public per-cell entry point */
        break;
    }
    node_filter_ctx ctx = {.arena = m->a};
    const node_cell *out;
    assert_int_equal(node_filter_cell_apply(f, m->key, c, &ctx, &out, NULL), ST_OK);
    return out != NULL;
}

static mlist m_eval(model *m, const node_filter *f, mlist in) {
    mlist out = m_alloc(m->a, in.n);
    if (f == NULL || in.n == 0) {
        m_append(m->a, &out, in);
        return out;
    }
    switch (f->kind) {
    case NODE_FILTER_PASS_ALL:
        m_append(m->a, &out, in);
        return out;
    case NODE_FILTER_BLOCK_ALL:
        return out;
    case NODE_FILTER_CHAIN:
        out = in;
        for (size_t i = 0; i < f->u.list.count && out.n > 0; i++)
            out = m_eval(m, f->u.list.subs[i], out);
        return out;
    case NODE_FILTER_INTERLEAVE:
        for (size_t i = 0; i < f->u.list.count; i++)
            m_append(m->a, &out, m_eval(m, f->u.list.subs[i], in));
        m_sort(&out);
        return out;
    case NODE_FILTER_CONDITION: {
        mlist p = f->u.cond.predicate ? m_eval(m, f->u.cond.predicate, in) : in;
        const node_filter *next = p.n ? f->u.cond.on_true : f->u.cond.on_false;
        return next ? m_eval(m, next, in) : out;
    }
    case NODE_FILTER_SINK:
        m_append(m->a, &m->sink, in);
        return out;
    case NODE_FILTER_ROW_SAMPLE:
        if ((double)(st_rng_next(m->rng) >> 11) * 0x1p-53 < f->u.probability)
            m_append(m->a, &out, in);
        return out;
    case NODE_FILTER_CELLS_PER_ROW_OFFSET:
        for (size_t i = 0; i < in.n; i++)
            if ((int64_t)i >= f->u.count)
                out.v[out.n++] = in.v[i];
        return out;
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
        for (size_t i = 0; i < in.n && (int64_t)i < f->u.count; i++)
            out.v[out.n++] = in.v[i];
        return out;
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT: {
        int64_t seen = 0;
        for (size_t i = 0; i < in.n; i++) {
            bool same = i > 0 && st_slice_eq(in.v[i].family, in.v[i - 1].family) &&
                        st_slice_eq(in.v[i].qualifier, in.v[i - 1].qualifier);
            seen = same ? seen + 1 : 1;
            if (seen <= f->u.count)
                out.v[out.n++] = in.v[i];
        }
        return out;
    }
    case NODE_FILTER_STRIP_VALUE:
        for (size_t i = 0; i < in.n; i++) {
            out.v[out.n] = in.v[i];
            out.v[out.n++].value = st_slice_make(NULL, 0);
        }
        return out;
    case NODE_FILTER_APPLY_LABEL:
        for (size_t i = 0; i < in.n; i++) {
            st_slice *l = st_arena_alloc(m->a, (in.v[i].n_labels + 1) * sizeof *l);
            if (in.v[i].n_labels)
                memcpy(l, in.v[i].labels, in.v[i].n_labels * sizeof *l);
            l[in.v[i].n_labels] = f->u.label;
            out.v[out.n] = in.v[i];
            out.v[out.n].labels = l;
            out.v[out.n++].n_labels = in.v[i].n_labels + 1;
        }
        return out;
    default:
        for (size_t i = 0; i < in.n; i++)
            if (m_keep(m, f, &in.v[i]))
                out.v[out.n++] = in.v[i];
        return out;
    }
}

static const char *const FAMS[] = {"a", "b", "c"};
static const char *const QUALS[] = {"", "x", "y", "x\n", "\xfe"};
static const char *const VALS[] = {"", "1", "22", "a\nb", "\xff"};
static const char *const PATS[] = {"x",   "\\C*", ".*", "x|y",  "[a-b]",
                                   "\\C", ".",    "",   "\xfe", "a.b"};
static const char *const LABELS[] = {"l1", "l2", "l3"};

static node_bound rand_bound(st_rng *r) {
    node_bound b = {(node_bound_kind)st_rng_below(r, 3), st_slice_cstr(QUALS[st_rng_below(r, 5)])};
    if (b.kind == NODE_BOUND_UNBOUNDED)
        b.key = st_slice_make(NULL, 0);
    return b;
}

static node_filter *rand_filter(st_arena *a, st_rng *r, int depth) {
    unsigned k = (unsigned)st_rng_below(r, depth >= 4 ? 15 : 19);
    static const node_filter_kind leaves[] = {NODE_FILTER_PASS_ALL,
                                              NODE_FILTER_BLOCK_ALL,
                                              NODE_FILTER_SINK,
                                              NODE_FILTER_ROW_KEY_REGEX,
                                              NODE_FILTER_ROW_SAMPLE,
                                              NODE_FILTER_FAMILY_NAME_REGEX,
                                              NODE_FILTER_COLUMN_QUALIFIER_REGEX,
                                              NODE_FILTER_COLUMN_RANGE,
                                              NODE_FILTER_TIMESTAMP_RANGE,
                                              NODE_FILTER_VALUE_REGEX,
                                              NODE_FILTER_VALUE_RANGE,
                                              NODE_FILTER_CELLS_PER_ROW_OFFSET,
                                              NODE_FILTER_CELLS_PER_ROW_LIMIT,
                                              NODE_FILTER_CELLS_PER_COLUMN_LIMIT,
                                              NODE_FILTER_STRIP_VALUE,
                                              NODE_FILTER_APPLY_LABEL};
    if (k >= 15) { /* composite */
        if (k == 18)
            return node_filter_condition(a, rand_filter(a, r, depth + 1),
                                         st_rng_below(r, 4) ? rand_filter(a, r, depth + 1) : NULL,
                                         st_rng_below(r, 4) ? rand_filter(a, r, depth + 1) : NULL);
        node_filter *subs[4];
        size_t n = 2 + st_rng_below(r, 3);
        for (size_t i = 0; i < n; i++)
            subs[i] = rand_filter(a, r, depth + 1);
        return node_filter_list(a, k == 15 || k == 16 ? NODE_FILTER_CHAIN : NODE_FILTER_INTERLEAVE,
                                subs, n);
    }
    node_filter_kind kind = leaves[st_rng_below(r, 16)];
    switch (kind) {
    case NODE_FILTER_ROW_KEY_REGEX:
        return node_filter_regex(a, kind, st_slice_cstr(st_rng_below(r, 2) ? "r\\C*" : "x"));
    case NODE_FILTER_FAMILY_NAME_REGEX:
        return node_filter_regex(a, kind, st_slice_cstr(FAMS[st_rng_below(r, 3)]));
    case NODE_FILTER_COLUMN_QUALIFIER_REGEX:
    case NODE_FILTER_VALUE_REGEX:
        return node_filter_regex(a, kind, st_slice_cstr(PATS[st_rng_below(r, 10)]));
    case NODE_FILTER_ROW_SAMPLE:
        return node_filter_row_sample(a, 0.5);
    case NODE_FILTER_COLUMN_RANGE:
        return node_filter_column_range(a, st_slice_cstr(FAMS[st_rng_below(r, 3)]), rand_bound(r),
                                        rand_bound(r));
    case NODE_FILTER_TIMESTAMP_RANGE:
        return node_filter_ts_range(a, (int64_t)st_rng_below(r, 5), (int64_t)st_rng_below(r, 6));
    case NODE_FILTER_VALUE_RANGE: {
        node_bound s = rand_bound(r), e = rand_bound(r);
        if (s.kind != NODE_BOUND_UNBOUNDED)
            s.key = st_slice_cstr(VALS[st_rng_below(r, 5)]);
        return node_filter_value_range(a, s, e);
    }
    case NODE_FILTER_CELLS_PER_ROW_OFFSET:
        return node_filter_count(a, kind, (int64_t)st_rng_below(r, 6));
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT:
        return node_filter_count(a, kind, 1 + (int64_t)st_rng_below(r, 5));
    case NODE_FILTER_APPLY_LABEL:
        return node_filter_label(a, st_slice_cstr(LABELS[st_rng_below(r, 3)]));
    default:
        return node_filter_new(a, kind);
    }
}

/* A random row in Bigtable order: a column per (family, qualifier) chosen, versions newest first.
 */
static size_t rand_row(st_rng *r, node_cell *cells, size_t cap) {
    size_t n = 0;
    /* QUALS in byte order: "", "x", "x\n", "y", "\xfe". */
    static const char *const sorted_quals[] = {"", "x", "x\n", "y", "\xfe"};
    for (size_t f = 0; f < 3; f++)
        for (size_t q = 0; q < 5; q++) {
            if (st_rng_below(r, 3) != 0)
                continue;
            size_t versions = 1 + st_rng_below(r, 3);
            for (size_t v = 0; v < versions && n < cap; v++)
                cells[n++] = (node_cell){st_slice_cstr(FAMS[f]),
                                         st_slice_cstr(sorted_quals[q]),
                                         (int64_t)(5 - v),
                                         st_slice_cstr(VALS[st_rng_below(r, 5)]),
                                         NULL,
                                         0};
        }
    return n;
}

static bool cells_equal(const node_cell *a, const node_cell *b) {
    if (!st_slice_eq(a->family, b->family) || !st_slice_eq(a->qualifier, b->qualifier) ||
        a->ts_us != b->ts_us || !st_slice_eq(a->value, b->value) || a->n_labels != b->n_labels)
        return false;
    for (uint32_t i = 0; i < a->n_labels; i++)
        if (!st_slice_eq(a->labels[i], b->labels[i]))
            return false;
    return true;
}

/* Streams cells[0..n) through f's head and evaluates its rest over what the head kept; fails
 * unless that gives want[0..want_n). Returns whether the head had any stage. */
static bool stream_matches(const node_filter *f, st_slice key, const node_cell *cells, size_t n,
                           node_filter_ctx *ctx, const node_cell *const *want, size_t want_n) {
    node_filter_stream s;
    assert_int_equal(node_filter_stream_init(&s, f, ctx->arena), ST_OK);
    node_filter_stream_row_start(&s);
    node_cell *kept = st_arena_alloc(ctx->arena, (n + 1) * sizeof *kept);
    assert_non_null(kept);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const node_cell *c;
        assert_int_equal(node_filter_stream_cell(&s, key, &cells[i], ctx, &c, NULL), ST_OK);
        if (c != NULL)
            kept[k++] = *c;
    }
    const node_cell *const *out;
    size_t out_n = k;
    st_err err;
    if (s.rest != NULL) {
        assert_int_equal(node_filter_eval(s.rest, key, kept, k, ctx, &out, &out_n, &err), ST_OK);
        assert_int_equal(out_n, want_n);
        for (size_t i = 0; i < out_n; i++)
            assert_true(cells_equal(out[i], want[i]));
    } else {
        assert_int_equal(k, want_n);
        for (size_t i = 0; i < k; i++)
            assert_true(cells_equal(&kept[i], want[i]));
    }
    bool staged = s.n > 0;
    node_filter_stream_deinit(&s);
    return staged;
}

/* The filters plan prepared (their compiled regexes), released at the end of the test. */
static node_filter *planned[16];
static size_t n_planned;

static void planned_release(void) {
    while (n_planned > 0)
        node_filter_release(planned[--n_planned]);
}

/* Which part of a filter is streamed while a row is assembled, and what the head keeps. */
static node_filter_stream plan(fixture *fx, node_filter *f) {
    st_err err;
    if (f != NULL && node_filter_prepare(f, &err) != ST_OK)
        fail_msg("prepare failed: %s", err.msg);
    if (f != NULL) {
        assert_true(n_planned < sizeof planned / sizeof planned[0]);
        planned[n_planned++] = f;
    }
    node_filter_stream s;
    assert_int_equal(node_filter_stream_init(&s, f, &fx->arena), ST_OK);
    return s;
}

/* The fixture row through the head of s, rendered. */
static const char *stream_run(fixture *fx, node_filter_stream *s) {
    node_filter_ctx ctx = {.arena = &fx->arena, .rng = &fx->rng};
    size_t len = 0;
    fx->out[0] = '\0';
    node_filter_stream_row_start(s);
    for (size_t i = 0; i < fx->n; i++) {
        const node_cell *c;
        assert_int_equal(node_filter_stream_cell(s, S("row"), &fx->cells[i], &ctx, &c, NULL),
                         ST_OK);
        if (c != NULL)
            render_cell(fx->out, sizeof fx->out, &len, c);
    }
    return fx->out;
}

static void test_filter_stream_head_and_rest(void **state) {
    (void)state;
    fixture *fx = fx_new();
    add_standard_row(fx);
    node_filter_stream s = plan(fx, NULL);
    assert_int_equal(s.n, 0);
    assert_null(s.rest);
    node_filter_stream_deinit(&s);

    /* The latest version of each column: nothing left for the whole row. */
    s = plan(fx, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1));
    assert_int_equal(s.n, 1);
    assert_null(s.rest);
    assert_string_equal(stream_run(fx, &s), "a:x@3=v3 a:y@5=w5 b:x@4=z4 b:z@7=");
    /* A second row starts counting afresh. */
    assert_string_equal(stream_run(fx, &s), "a:x@3=v3 a:y@5=w5 b:x@4=z4 b:z@7=");
    node_filter_stream_deinit(&s);

    /* Keys only, as the Node client asks: one cell, stripped. */
    s = plan(fx, chain2(fx, cnt(fx, NODE_FILTER_CELLS_PER_ROW_LIMIT, 1),
                        kind(fx, NODE_FILTER_STRIP_VALUE)));
    assert_int_equal(s.n, 2);
    assert_null(s.rest);
    assert_string_equal(stream_run(fx, &s), "a:x@3=");
    node_filter_stream_deinit(&s);

    /* Limits count their own input: the qualifier filter comes first. */
    s = plan(fx, chain3(fx, qual(fx, "x"), cnt(fx, NODE_FILTER_CELLS_PER_ROW_OFFSET, 1),
                        cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1)));
    assert_string_equal(stream_run(fx, &s), "a:x@2=v2 b:x@4=z4");
    node_filter_stream_deinit(&s);

    /* A nested chain of such filters is part of the head; the interleave onward is the rest. */
    node_filter *inter = inter2(fx, fam(fx, "a"), label(fx, "l"));
    node_filter *strip = kind(fx, NODE_FILTER_STRIP_VALUE);
    node_filter *head = chain2(fx, qual(fx, "x"), cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 2));
    s = plan(fx, chain3(fx, head, inter, strip));
    assert_int_equal(s.n, 2);
    assert_non_null(s.rest);
    assert_int_equal(s.rest->kind, NODE_FILTER_CHAIN);
    assert_int_equal(s.rest->u.list.count, 2);
    assert_ptr_equal(s.rest->u.list.subs[0], inter);
    assert_ptr_equal(s.rest->u.list.subs[1], strip);
    assert_string_equal(stream_run(fx, &s), "a:x@3=v3 a:x@2=v2 b:x@4=z4");
    node_filter_stream_deinit(&s);

    /* One filter after the head is the rest itself; nothing streamable first: all of it. */
    node_filter *cond = node_filter_condition(&fx->arena, fam(fx, "b"), NULL, NULL);
    s = plan(fx, chain2(fx, fam(fx, "a"), cond));
    assert_int_equal(s.n, 1);
    assert_ptr_equal(s.rest, cond);
    node_filter_stream_deinit(&s);
    node_filter *sample = node_filter_row_sample(&fx->arena, 0.5);
    node_filter *f = chain2(fx, sample, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1));
    s = plan(fx, f);
    assert_int_equal(s.n, 0);
    assert_ptr_equal(s.rest, f);
    node_filter_stream_deinit(&s);
    f = inter2(fx, cnt(fx, NODE_FILTER_CELLS_PER_COLUMN_LIMIT, 1), label(fx, "l"));
    s = plan(fx, f);
    assert_int_equal(s.n, 0);
    assert_ptr_equal(s.rest, f);
    node_filter_stream_deinit(&s);
    planned_release();
    fx_free(fx);
}

static void test_filter_matches_naive_model(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("test_filter_matches_naive_model");
    st_rng gen, rng_eval, rng_model;
    st_rng_seed(&gen, seed);
    int valid = 0, nonempty = 0, per_cell = 0, streamed = 0;
    for (int iter = 0; iter < 3000; iter++) {
        st_arena a;
        st_arena_init(&a, 1 << 14);
        node_cell cells[48];
        size_t n = rand_row(&gen, cells, 48);
        node_filter *f = rand_filter(&a, &gen, 0);
        st_slice key = st_rng_below(&gen, 2) ? S("row") : S("r\n");
        st_err err;
        if (node_filter_prepare(f, &err) != ST_OK) {
            assert_int_equal(err.code, ST_INVALID_ARGUMENT);
            st_arena_deinit(&a);
            continue;
        }
        valid++;
        uint64_t s2 = st_rng_next(&gen);
        st_rng_seed(&rng_eval, s2);
        st_rng_seed(&rng_model, s2);
        node_filter_ctx ctx = {.arena = &a, .rng = &rng_eval};
        const node_cell *const *out;
        size_t out_n;
        assert_int_equal(node_filter_eval(f, key, cells, n, &ctx, &out, &out_n, &err), ST_OK);
        model m = {.a = &a, .rng = &rng_model, .key = key, .sink = m_alloc(&a, 0)};
        mlist in = m_alloc(&a, n);
        memcpy(in.v, cells, n * sizeof *cells);
        in.n = n;
        mlist want = m.sink;
        mlist main_out = m_eval(&m, f, in);
        want = m.sink;
        m_append(&a, &want, main_out);
        m_sort(&want);
        if (want.n != out_n)
            fail_msg("seed %llu iter %d: %zu cells, model says %zu", (unsigned long long)seed, iter,
                     out_n, want.n);
        for (size_t i = 0; i < out_n; i++)
            if (!cells_equal(out[i], &want.v[i]))
                fail_msg("seed %llu iter %d: cell %zu differs", (unsigned long long)seed, iter, i);
        nonempty += out_n > 0;
        /* The streaming path agrees whenever it applies. */
        if (node_filter_is_per_cell(f)) {
            per_cell++;
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                const node_cell *c;
                assert_int_equal(node_filter_cell_apply(f, key, &cells[i], &ctx, &c, NULL), ST_OK);
                if (c != NULL) {
                    assert_true(k < out_n);
                    assert_true(cells_equal(c, out[k]));
                    k++;
                }
            }
            assert_int_equal(k, out_n);
        }
        /* So does the head streamed cell by cell, then the rest over the cells it kept. */
        st_rng rng_stream;
        st_rng_seed(&rng_stream, s2);
        node_filter_ctx sctx = {.arena = &a, .rng = &rng_stream};
        streamed += stream_matches(f, key, cells, n, &sctx, out, out_n);
        node_filter_release(f);
        st_arena_deinit(&a);
    }
    assert_true(streamed > 500);
    assert_true(valid > 1000);
    assert_true(nonempty > 300);
    assert_true(per_cell > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_pass_block_and_null),
        cmocka_unit_test(test_filter_chain_is_sequential),
        cmocka_unit_test(test_filter_interleave_merges_in_row_order),
        cmocka_unit_test(test_filter_interleave_duplicates_keep_branch_order),
        cmocka_unit_test(test_filter_condition_picks_a_branch),
        cmocka_unit_test(test_filter_sink_bypasses_later_filters),
        cmocka_unit_test(test_filter_labels_and_strip),
        cmocka_unit_test(test_filter_limits_and_offsets),
        cmocka_unit_test(test_filter_ranges),
        cmocka_unit_test(test_filter_regex_full_match_on_bytes),
        cmocka_unit_test(test_filter_invalid_regex_is_invalid_argument),
        cmocka_unit_test(test_filter_validation_rules),
        cmocka_unit_test(test_filter_hostile_nesting_is_rejected_without_recursion),
        cmocka_unit_test(test_filter_hostile_regex),
        cmocka_unit_test(test_filter_compile_work_is_bounded),
        cmocka_unit_test(test_filter_regex_cost_reads_the_pattern),
        cmocka_unit_test(test_filter_row_sample_is_deterministic),
        cmocka_unit_test(test_filter_budget_stops_exponential_interleaves),
        cmocka_unit_test(test_filter_row_work_counts_regexes_and_value_bytes),
        cmocka_unit_test(test_filter_stream_head_and_rest),
        cmocka_unit_test(test_filter_matches_naive_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
