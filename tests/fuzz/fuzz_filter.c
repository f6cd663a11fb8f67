/* fuzz_filter: RowFilter validation and evaluation (node/filter) on trees and rows built from
 * arbitrary bytes: every filter kind, nesting past NODE_FILTER_DEPTH_MAX, regex patterns made of
 * input bytes, rows with arbitrary family/qualifier/value bytes.
 * Properties: no crash or leak; prepare fails only with INVALID_ARGUMENT; evaluation fails only
 * with RESOURCE_EXHAUSTED (the budget); the output is in Bigtable order; for per-cell filters the
 * streaming path (node_filter_cell_apply) yields exactly the evaluated cells, and so does a
 * filter's head streamed cell by cell followed by its rest (node_filter_stream_*). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "filter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_NODES_MAX 256
#define FUZZ_DEPTH_MAX (NODE_FILTER_DEPTH_MAX + 4) /* a little past the limit, to test it */
#define FUZZ_CELLS_MAX 48
#define FUZZ_EVAL_CELLS_MAX (1u << 16) /* a small budget keeps each input fast */

typedef struct fuzz_in {
    const uint8_t *p, *end;
    int nodes_left;
} fuzz_in;

static uint8_t take(fuzz_in *z) {
    return z->p < z->end ? *z->p++ : 0;
}

static st_slice take_bytes(fuzz_in *z, size_t max) {
    size_t n = take(z) % (max + 1);
    size_t left = (size_t)(z->end - z->p);
    if (n > left)
        n = left;
    st_slice s = st_slice_make(z->p, n);
    z->p += n;
    return s;
}

static node_bound take_bound(fuzz_in *z) {
    node_bound b = {(node_bound_kind)(take(z) % 3), {NULL, 0}};
    if (b.kind != NODE_BOUND_UNBOUNDED)
        b.key = take_bytes(z, 3);
    return b;
}

/* Mostly valid-looking regexes (so evaluation gets exercised), sometimes raw bytes. */
static st_slice take_pattern(fuzz_in *z) {
    static const char *const pats[] = {"\\C*", ".*", "a",      "a|b", "[a-c]*",
                                       "\\C",  "",   "(a*)*b", "x.y", "\\xff.*"};
    uint8_t sel = take(z);
    if (sel < 200)
        return st_slice_cstr(pats[sel % 10]);
    return take_bytes(z, 8);
}

static node_filter *build(fuzz_in *z, st_arena *a, int depth);

static node_filter *build_composite(fuzz_in *z, st_arena *a, int depth, uint8_t sel) {
    if (sel % 3 == 2) {
        node_filter *p = take(z) % 8 ? build(z, a, depth + 1) : NULL;
        node_filter *t = take(z) % 4 ? build(z, a, depth + 1) : NULL;
        node_filter *f = take(z) % 4 ? build(z, a, depth + 1) : NULL;
        return node_filter_condition(a, p, t, f);
    }
    node_filter *subs[6];
    size_t n = take(z) % 7;
    if (n > 6)
        n = 6;
    for (size_t i = 0; i < n; i++)
        subs[i] = build(z, a, depth + 1);
    return node_filter_list(a, sel % 3 ? NODE_FILTER_INTERLEAVE : NODE_FILTER_CHAIN, subs, n);
}

static node_filter *build_leaf(fuzz_in *z, st_arena *a, node_filter_kind kind) {
    switch (kind) {
    case NODE_FILTER_ROW_KEY_REGEX:
    case NODE_FILTER_FAMILY_NAME_REGEX:
    case NODE_FILTER_COLUMN_QUALIFIER_REGEX:
    case NODE_FILTER_VALUE_REGEX:
        return node_filter_regex(a, kind, take_pattern(z));
    case NODE_FILTER_ROW_SAMPLE:
        return node_filter_row_sample(a, (double)take(z) / 200.0);
    case NODE_FILTER_COLUMN_RANGE:
        return node_filter_column_range(a, take_bytes(z, 2), take_bound(z), take_bound(z));
    case NODE_FILTER_TIMESTAMP_RANGE:
        return node_filter_ts_range(a, (int64_t)(take(z) % 10) - 1, (int64_t)(take(z) % 10));
    case NODE_FILTER_VALUE_RANGE:
        return node_filter_value_range(a, take_bound(z), take_bound(z));
    case NODE_FILTER_CELLS_PER_ROW_OFFSET:
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT:
        return node_filter_count(a, kind, (int64_t)(int8_t)take(z) % 12);
    case NODE_FILTER_APPLY_LABEL:
        return node_filter_label(a, take_bytes(z, 17));
    default:
        return node_filter_new(a, kind);
    }
}

static node_filter *build(fuzz_in *z, st_arena *a, int depth) {
    if (z->nodes_left-- <= 0 || z->p >= z->end)
        return node_filter_new(a, NODE_FILTER_PASS_ALL);
    uint8_t sel = take(z);
    if (sel >= 200 && depth < FUZZ_DEPTH_MAX)
        return build_composite(z, a, depth, sel);
    node_filter_kind kind = (node_filter_kind)(sel % NODE_FILTER_KIND_COUNT);
    if (kind == NODE_FILTER_CHAIN || kind == NODE_FILTER_INTERLEAVE ||
        kind == NODE_FILTER_CONDITION)
        kind = NODE_FILTER_PASS_ALL;
    return build_leaf(z, a, kind);
}

static int cmp_cells(const void *x, const void *y) {
    return node_cell_cmp(x, y);
}

static size_t build_row(fuzz_in *z, node_cell *cells) {
    static const char *const fams[] = {"a", "b", "cf"};
    size_t n = take(z) % (FUZZ_CELLS_MAX + 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t sel = take(z);
        cells[i] =
            (node_cell){.family = sel < 240 ? st_slice_cstr(fams[sel % 3]) : take_bytes(z, 3),
                        .qualifier = take_bytes(z, 3),
                        .ts_us = take(z) % 8,
                        .value = take_bytes(z, 4)};
    }
    qsort(cells, n, sizeof *cells, cmp_cells);
    return n;
}

static bool same_cell(const node_cell *a, const node_cell *b) {
    if (node_cell_cmp(a, b) != 0 || !st_slice_eq(a->value, b->value) || a->n_labels != b->n_labels)
        return false;
    for (uint32_t i = 0; i < a->n_labels; i++)
        if (!st_slice_eq(a->labels[i], b->labels[i]))
            return false;
    return true;
}

static void check_streaming(const node_filter *f, st_slice key, const node_cell *cells, size_t n,
                            node_filter_ctx *ctx, const node_cell *const *out, size_t out_n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const node_cell *c;
        if (node_filter_cell_apply(f, key, &cells[i], ctx, &c, NULL) != ST_OK)
            return; /* out of memory: nothing to compare */
        if (c != NULL) {
            ST_ASSERT(k < out_n && same_cell(c, out[k]));
            k++;
        }
    }
    ST_ASSERT(k == out_n);
}

/* The filter's head streamed cell by cell, then its rest over the kept cells (the read path's way
 * of assembling a row), yields exactly the evaluated cells. rng_seed: the full evaluation's. */
static void check_head_rest(const node_filter *f, st_slice key, const node_cell *cells, size_t n,
                            node_filter_ctx *ctx, uint64_t rng_seed, const node_cell *const *out,
                            size_t out_n) {
    node_filter_stream s;
    node_cell *kept = st_arena_alloc(ctx->arena, (n + 1) * sizeof *kept);
    if (kept == NULL || node_filter_stream_init(&s, f, ctx->arena) != ST_OK)
        return; /* out of memory: nothing to compare */
    node_filter_stream_row_start(&s);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const node_cell *c;
        if (node_filter_stream_cell(&s, key, &cells[i], ctx, &c, NULL) != ST_OK) {
            node_filter_stream_deinit(&s);
            return;
        }
        if (c != NULL)
            kept[k++] = *c;
    }
    st_rng_seed(ctx->rng, rng_seed); /* row_sample draws as in the full evaluation */
    const node_cell *const *res = NULL;
    size_t res_n = k;
    st_err err;
    bool ok =
        s.rest == NULL || node_filter_eval(s.rest, key, kept, k, ctx, &res, &res_n, &err) == ST_OK;
    if (ok) {
        ST_ASSERT(res_n == out_n);
        for (size_t i = 0; i < res_n; i++)
            ST_ASSERT(same_cell(s.rest ? res[i] : &kept[i], out[i]));
    }
    node_filter_stream_deinit(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_in z = {data, data + size, FUZZ_NODES_MAX};
    st_arena arena;
    st_arena_init(&arena, 1 << 14);
    node_cell cells[FUZZ_CELLS_MAX];
    st_slice key = take_bytes(&z, 6);
    size_t n = build_row(&z, cells);
    node_filter *f = build(&z, &arena, 0);
    st_err err;
    st_code rc = node_filter_prepare(f, &err);
    if (rc != ST_OK) {
        ST_ASSERT(rc == ST_INVALID_ARGUMENT);
        st_arena_deinit(&arena);
        return 0;
    }
    st_rng rng;
    st_rng_seed(&rng, size);
    node_filter_ctx ctx = {.arena = &arena, .rng = &rng, .cells_max = FUZZ_EVAL_CELLS_MAX};
    const node_cell *const *out;
    size_t out_n;
    rc = node_filter_eval(f, key, cells, n, &ctx, &out, &out_n, &err);
    if (rc == ST_OK) {
        for (size_t i = 1; i < out_n; i++)
            ST_ASSERT(node_cell_cmp(out[i - 1], out[i]) <= 0);
        if (node_filter_is_per_cell(f))
            check_streaming(f, key, cells, n, &ctx, out, out_n);
        check_head_rest(f, key, cells, n, &ctx, size, out, out_n);
    } else {
        ST_ASSERT(rc == ST_RESOURCE_EXHAUSTED);
    }
    node_filter_release(f);
    st_arena_deinit(&arena);
    return 0;
}
