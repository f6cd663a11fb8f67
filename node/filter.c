/* node/filter.c — RowFilter validation and evaluation (see filter.h for the semantics).
 *
 * Evaluation works on lists of cell pointers. A list is either shared (it may be the caller's
 * input, a sibling's input or a stored sink run: never written) or owned (a buffer this
 * evaluation allocated and nobody else holds: the next filter of a chain may compact it in
 * place). That keeps a long chain of narrowing filters at one buffer instead of one per step.
 * Every slot and transformed cell is charged to a budget, so nested interleaves cannot multiply
 * a row without bound. */
#include "filter.h"

#include <inttypes.h>
#include <string.h>

#include "regex_cost.h"

/* ---- builders ---- */

node_filter *node_filter_new(st_arena *arena, node_filter_kind kind) {
    node_filter *f = st_arena_alloc(arena, sizeof *f);
    if (f == NULL)
        return NULL;
    memset(f, 0, sizeof *f);
    f->kind = kind;
    return f;
}

node_filter *node_filter_list(st_arena *arena, node_filter_kind kind, node_filter *const *subs,
                              size_t count) {
    ST_ASSERT(kind == NODE_FILTER_CHAIN || kind == NODE_FILTER_INTERLEAVE);
    node_filter *f = node_filter_new(arena, kind);
    if (f == NULL)
        return NULL;
    if (count > 0) {
        f->u.list.subs = st_arena_dup(arena, subs, count * sizeof *subs);
        if (f->u.list.subs == NULL)
            return NULL;
    }
    f->u.list.count = count;
    return f;
}

node_filter *node_filter_condition(st_arena *arena, node_filter *predicate, node_filter *on_true,
                                   node_filter *on_false) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_CONDITION);
    if (f != NULL) {
        f->u.cond.predicate = predicate;
        f->u.cond.on_true = on_true;
        f->u.cond.on_false = on_false;
    }
    return f;
}

static bool kind_is_regex(node_filter_kind kind) {
    return kind == NODE_FILTER_ROW_KEY_REGEX || kind == NODE_FILTER_FAMILY_NAME_REGEX ||
           kind == NODE_FILTER_COLUMN_QUALIFIER_REGEX || kind == NODE_FILTER_VALUE_REGEX;
}

node_filter *node_filter_regex(st_arena *arena, node_filter_kind kind, st_slice pattern) {
    ST_ASSERT(kind_is_regex(kind));
    node_filter *f = node_filter_new(arena, kind);
    if (f != NULL)
        f->u.regex.pattern = pattern;
    return f;
}

node_filter *node_filter_count(st_arena *arena, node_filter_kind kind, int64_t count) {
    ST_ASSERT(kind == NODE_FILTER_CELLS_PER_ROW_OFFSET || kind == NODE_FILTER_CELLS_PER_ROW_LIMIT ||
              kind == NODE_FILTER_CELLS_PER_COLUMN_LIMIT);
    node_filter *f = node_filter_new(arena, kind);
    if (f != NULL)
        f->u.count = count;
    return f;
}

node_filter *node_filter_row_sample(st_arena *arena, double probability) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_ROW_SAMPLE);
    if (f != NULL)
        f->u.probability = probability;
    return f;
}

node_filter *node_filter_column_range(st_arena *arena, st_slice family, node_bound start,
                                      node_bound end) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_COLUMN_RANGE);
    if (f != NULL) {
        f->u.column_range.family = family;
        f->u.column_range.start = start;
        f->u.column_range.end = end;
    }
    return f;
}

node_filter *node_filter_ts_range(st_arena *arena, int64_t start_us, int64_t end_us) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_TIMESTAMP_RANGE);
    if (f != NULL) {
        f->u.ts_range.start_us = start_us;
        f->u.ts_range.end_us = end_us;
    }
    return f;
}

node_filter *node_filter_value_range(st_arena *arena, node_bound start, node_bound end) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_VALUE_RANGE);
    if (f != NULL) {
        f->u.value_range.start = start;
        f->u.value_range.end = end;
    }
    return f;
}

node_filter *node_filter_label(st_arena *arena, st_slice label) {
    node_filter *f = node_filter_new(arena, NODE_FILTER_APPLY_LABEL);
    if (f != NULL)
        f->u.label = label;
    return f;
}

const char *node_filter_kind_name(node_filter_kind kind) {
    /* The protobuf field names, so error messages read like Bigtable's. */
    static const char *const names[NODE_FILTER_KIND_COUNT] = {
        [NODE_FILTER_PASS_ALL] = "pass_all_filter",
        [NODE_FILTER_BLOCK_ALL] = "block_all_filter",
        [NODE_FILTER_CHAIN] = "chain",
        [NODE_FILTER_INTERLEAVE] = "interleave",
        [NODE_FILTER_CONDITION] = "condition",
        [NODE_FILTER_SINK] = "sink",
        [NODE_FILTER_ROW_KEY_REGEX] = "row_key_regex_filter",
        [NODE_FILTER_ROW_SAMPLE] = "row_sample_filter",
        [NODE_FILTER_FAMILY_NAME_REGEX] = "family_name_regex_filter",
        [NODE_FILTER_COLUMN_QUALIFIER_REGEX] = "column_qualifier_regex_filter",
        [NODE_FILTER_COLUMN_RANGE] = "column_range_filter",
        [NODE_FILTER_TIMESTAMP_RANGE] = "timestamp_range_filter",
        [NODE_FILTER_VALUE_REGEX] = "value_regex_filter",
        [NODE_FILTER_VALUE_RANGE] = "value_range_filter",
        [NODE_FILTER_CELLS_PER_ROW_OFFSET] = "cells_per_row_offset_filter",
        [NODE_FILTER_CELLS_PER_ROW_LIMIT] = "cells_per_row_limit_filter",
        [NODE_FILTER_CELLS_PER_COLUMN_LIMIT] = "cells_per_column_limit_filter",
        [NODE_FILTER_STRIP_VALUE] = "strip_value_transformer",
        [NODE_FILTER_APPLY_LABEL] = "apply_label_transformer",
    };
    if ((unsigned)kind >= NODE_FILTER_KIND_COUNT)
        return "unknown_filter";
    return names[kind];
}

/* ---- validation ---- */

/* What a validated subtree contains, for the rules that look at descendants. */
typedef struct subtree_facts {
    bool has_label;
} subtree_facts;

/* State of one node_filter_prepare over the whole tree. */
typedef struct prepare_ctx {
    uint64_t compile_work; /* node_regex_cost of the regexes met so far */
} prepare_ctx;

static st_code validate_node(prepare_ctx *pc, node_filter *f, int depth, bool in_condition,
                             subtree_facts *facts, st_err *err);

/* Charges f's pattern to the filter's compile budget before RE2 sees it: compiling runs on the
 * node's loop, so past NODE_FILTER_COMPILE_WORK_MAX the filter is refused, naming the regex where
 * the budget ran out. */
static st_code charge_regex(prepare_ctx *pc, const node_filter *f, st_err *err) {
    st_slice pat = f->u.regex.pattern;
    uint64_t cost = node_regex_cost(pat.data, pat.len);
    pc->compile_work += cost;
    if (pc->compile_work <= NODE_FILTER_COMPILE_WORK_MAX)
        return ST_OK;
    char shown[48];
    size_t n = pat.len < sizeof shown - 1 ? pat.len : sizeof shown - 1;
    for (size_t i = 0; i < n; i++) /* the pattern is bytes; keep the message printable */
        shown[i] = pat.data[i] >= 0x20 && pat.data[i] < 0x7f ? (char)pat.data[i] : '?';
    shown[n] = '\0';
    return st_err_set(
        err, ST_INVALID_ARGUMENT,
        "Error in field '%s' : the row filter's regexes up to '%s'%s (this one %" PRIu64
        " units) need about %" PRIu64 " units of work to compile, more than the %d one filter may "
        "take: use fewer regexes, shorter repetitions (x{n} is compiled as n copies of x), no "
        "Unicode classes such as \\pL (values are matched as Latin-1 bytes), or a range filter "
        "(column_range, value_range) instead of a regex",
        node_filter_kind_name(f->kind), shown, pat.len > n ? "..." : "", cost, pc->compile_work,
        NODE_FILTER_COMPILE_WORK_MAX);
}

static st_code compile_regex(prepare_ctx *pc, node_filter *f, st_err *err) {
    const char *field = node_filter_kind_name(f->kind);
    st_slice pat = f->u.regex.pattern;
    if (f->u.regex.re != NULL)
        return ST_OK; /* already prepared */
    if (pat.len == 0 &&
        (f->kind == NODE_FILTER_ROW_KEY_REGEX || f->kind == NODE_FILTER_FAMILY_NAME_REGEX))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field '%s' : argument must not be empty", field);
    if (f->kind == NODE_FILTER_FAMILY_NAME_REGEX && pat.len > 0 &&
        memchr(pat.data, ':', pat.len) != NULL)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field '%s' : the regex must not contain ':'", field);
    st_code rc = charge_regex(pc, f, err);
    if (rc != ST_OK)
        return rc;
    char msg[256];
    node_re2_status rs = node_re2_compile(pat.data, pat.len, &f->u.regex.re, msg, sizeof msg);
    if (rs == NODE_RE2_NOMEM)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "Error in field '%s' : %s", field, msg);
    if (rs != NODE_RE2_OK)
        return st_err_set(err, ST_INVALID_ARGUMENT, "Error in field '%s' : %s", field, msg);
    return ST_OK;
}

static bool label_is_valid(st_slice label) {
    if (label.len == 0 || label.len > NODE_FILTER_LABEL_BYTES_MAX)
        return false;
    for (size_t i = 0; i < label.len; i++) {
        uint8_t c = label.data[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return false;
    }
    return true;
}

static st_code validate_list(prepare_ctx *pc, node_filter *f, int depth, bool in_condition,
                             subtree_facts *facts, st_err *err) {
    const char *what = f->kind == NODE_FILTER_CHAIN ? "Chain" : "Interleave";
    if (f->u.list.count < 2)
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s must contain at least two RowFilters",
                          what);
    size_t labelled = 0;
    for (size_t i = 0; i < f->u.list.count; i++) {
        subtree_facts sub = {false};
        if (f->u.list.subs[i] == NULL)
            continue; /* an unset RowFilter passes everything */
        st_code rc = validate_node(pc, f->u.list.subs[i], depth + 1, in_condition, &sub, err);
        if (rc != ST_OK)
            return rc;
        labelled += sub.has_label;
        facts->has_label |= sub.has_label;
    }
    if (f->kind == NODE_FILTER_CHAIN && labelled > 1)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Error in field 'chain' : a Chain may contain at most one sub-filter "
                          "with an apply_label_transformer (%zu found); apply labels in separate "
                          "branches of an Interleave instead",
                          labelled);
    return ST_OK;
}

static st_code validate_condition(prepare_ctx *pc, node_filter *f, int depth, subtree_facts *facts,
                                  st_err *err) {
    node_filter *parts[3] = {f->u.cond.predicate, f->u.cond.on_true, f->u.cond.on_false};
    for (int i = 0; i < 3; i++) {
        if (parts[i] == NULL)
            continue;
        subtree_facts sub = {false};
        st_code rc = validate_node(pc, parts[i], depth + 1, true, &sub, err);
        if (rc != ST_OK)
            return rc;
        facts->has_label |= sub.has_label;
    }
    return ST_OK;
}

static st_code validate_leaf(prepare_ctx *pc, node_filter *f, bool in_condition,
                             subtree_facts *facts, st_err *err) {
    const char *field = node_filter_kind_name(f->kind);
    switch (f->kind) {
    case NODE_FILTER_SINK:
        if (in_condition)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field 'sink' : a sink cannot be used within the "
                              "predicate, true or false filter of a Condition");
        return ST_OK;
    case NODE_FILTER_ROW_SAMPLE:
        if (!(f->u.probability > 0.0 && f->u.probability < 1.0)) /* also rejects NaN */
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : argument must be > 0 and < 1, got %g", field,
                              f->u.probability);
        return ST_OK;
    case NODE_FILTER_COLUMN_RANGE:
        if (f->u.column_range.family.len == 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : family_name must not be empty", field);
        return ST_OK;
    case NODE_FILTER_TIMESTAMP_RANGE:
        if (f->u.ts_range.start_us < 0 || f->u.ts_range.end_us < 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : timestamps must not be negative (start %lld, "
                              "end %lld)",
                              field, (long long)f->u.ts_range.start_us,
                              (long long)f->u.ts_range.end_us);
        return ST_OK;
    case NODE_FILTER_CELLS_PER_ROW_OFFSET:
        if (f->u.count < 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : argument must be >= 0, got %lld", field,
                              (long long)f->u.count);
        return ST_OK;
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT:
        if (f->u.count <= 0)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : argument must be > 0, got %lld", field,
                              (long long)f->u.count);
        return ST_OK;
    case NODE_FILTER_APPLY_LABEL:
        if (!label_is_valid(f->u.label))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "Error in field '%s' : a label must be 1 to %d characters of "
                              "[a-z0-9-], got '%.*s'",
                              field, NODE_FILTER_LABEL_BYTES_MAX,
                              (int)(f->u.label.len > 64 ? 64 : f->u.label.len),
                              f->u.label.len ? (const char *)f->u.label.data : "");
        facts->has_label = true;
        return ST_OK;
    case NODE_FILTER_PASS_ALL:
    case NODE_FILTER_BLOCK_ALL:
    case NODE_FILTER_VALUE_RANGE:
    case NODE_FILTER_STRIP_VALUE:
        return ST_OK;
    default:
        if (kind_is_regex(f->kind))
            return compile_regex(pc, f, err);
        return st_err_set(err, ST_INVALID_ARGUMENT, "unknown RowFilter kind %d", (int)f->kind);
    }
}

static st_code validate_node(prepare_ctx *pc, node_filter *f, int depth, bool in_condition,
                             subtree_facts *facts, st_err *err) {
    if (depth > NODE_FILTER_DEPTH_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "RowFilter nested more than %d levels deep; flatten the filter",
                          NODE_FILTER_DEPTH_MAX);
    switch (f->kind) {
    case NODE_FILTER_CHAIN:
    case NODE_FILTER_INTERLEAVE:
        return validate_list(pc, f, depth, in_condition, facts, err);
    case NODE_FILTER_CONDITION:
        return validate_condition(pc, f, depth, facts, err);
    default:
        return validate_leaf(pc, f, in_condition, facts, err);
    }
}

/* Only nodes at depth <= NODE_FILTER_DEPTH_MAX can hold a compiled regex (prepare never goes
 * deeper), so release stops there too: a hostile, rejected tree cannot blow the stack here. */
static void release_node(node_filter *f, int depth) {
    if (f == NULL || depth > NODE_FILTER_DEPTH_MAX)
        return;
    switch (f->kind) {
    case NODE_FILTER_CHAIN:
    case NODE_FILTER_INTERLEAVE:
        for (size_t i = 0; i < f->u.list.count; i++)
            release_node(f->u.list.subs[i], depth + 1);
        break;
    case NODE_FILTER_CONDITION:
        release_node(f->u.cond.predicate, depth + 1);
        release_node(f->u.cond.on_true, depth + 1);
        release_node(f->u.cond.on_false, depth + 1);
        break;
    default:
        if (kind_is_regex(f->kind)) {
            node_re2_free(f->u.regex.re);
            f->u.regex.re = NULL;
        }
        break;
    }
}

void node_filter_release(node_filter *f) {
    release_node(f, 0);
}

st_code node_filter_prepare(node_filter *f, st_err *err) {
    if (f == NULL)
        return ST_OK;
    subtree_facts facts = {false};
    prepare_ctx pc = {0};
    st_code rc = validate_node(&pc, f, 0, false, &facts, err);
    if (rc != ST_OK)
        node_filter_release(f);
    return rc;
}

st_code node_filter_validate(node_filter *f, st_err *err) {
    st_code rc = node_filter_prepare(f, err);
    node_filter_release(f);
    return rc;
}

/* ---- per-cell tests and transformers ---- */

int node_cell_cmp(const node_cell *a, const node_cell *b) {
    int c = st_slice_cmp(a->family, b->family);
    if (c != 0)
        return c;
    c = st_slice_cmp(a->qualifier, b->qualifier);
    if (c != 0)
        return c;
    return a->ts_us > b->ts_us ? -1 : (a->ts_us < b->ts_us ? 1 : 0); /* newest first */
}

static bool above_start(st_slice s, node_bound b) {
    if (b.kind == NODE_BOUND_UNBOUNDED)
        return true;
    int c = st_slice_cmp(s, b.key);
    return b.kind == NODE_BOUND_CLOSED ? c >= 0 : c > 0;
}

static bool below_end(st_slice s, node_bound b) {
    if (b.kind == NODE_BOUND_UNBOUNDED)
        return true;
    int c = st_slice_cmp(s, b.key);
    return b.kind == NODE_BOUND_CLOSED ? c <= 0 : c < 0;
}

static bool regex_match(const node_filter *f, st_slice s) {
    ST_ASSERT(f->u.regex.re != NULL); /* node_filter_prepare was called */
    return node_re2_full_match(f->u.regex.re, s.data, s.len);
}

/* For the true filters that look at one cell: does the cell pass? */
static bool cell_test(const node_filter *f, st_slice key, const node_cell *c) {
    switch (f->kind) {
    case NODE_FILTER_PASS_ALL:
    case NODE_FILTER_STRIP_VALUE:
    case NODE_FILTER_APPLY_LABEL:
        return true;
    case NODE_FILTER_BLOCK_ALL:
        return false;
    case NODE_FILTER_ROW_KEY_REGEX:
        return regex_match(f, key);
    case NODE_FILTER_FAMILY_NAME_REGEX:
        return regex_match(f, c->family);
    case NODE_FILTER_COLUMN_QUALIFIER_REGEX:
        return regex_match(f, c->qualifier);
    case NODE_FILTER_VALUE_REGEX:
        return regex_match(f, c->value);
    case NODE_FILTER_COLUMN_RANGE:
        return st_slice_eq(c->family, f->u.column_range.family) &&
               above_start(c->qualifier, f->u.column_range.start) &&
               below_end(c->qualifier, f->u.column_range.end);
    case NODE_FILTER_TIMESTAMP_RANGE:
        return c->ts_us >= f->u.ts_range.start_us &&
               (f->u.ts_range.end_us == 0 || c->ts_us < f->u.ts_range.end_us);
    case NODE_FILTER_VALUE_RANGE:
        return above_start(c->value, f->u.value_range.start) &&
               below_end(c->value, f->u.value_range.end);
    default:
        ST_ASSERT(!"cell_test on a filter that is not per-cell");
        return false;
    }
}

typedef struct cell_list {
    const node_cell **v;
    size_t n;
    bool owned; /* v is ours alone: the consumer may overwrite it in place */
} cell_list;

/* Evaluation scratch for one node_filter_eval call. */
typedef struct eval_state {
    node_filter_ctx *ctx;
    st_slice key;
    size_t budget; /* slots and cells still allowed */
    st_err *err;
    /* Lists sinks emitted, in emission order; grown by doubling in the arena. */
    cell_list *sink_runs;
    size_t sink_count, sink_cap;
} eval_state;

static const cell_list EMPTY_LIST = {NULL, 0, false};

static st_code charge(eval_state *s, size_t units) {
    if (units > s->budget)
        return st_err_set(s->err, ST_FAILED_PRECONDITION,
                          "the row filter produced more than %zu intermediate cells for one row; "
                          "use fewer or smaller interleaves",
                          s->ctx->cells_max ? s->ctx->cells_max
                                            : (size_t)NODE_FILTER_EVAL_CELLS_MAX);
    s->budget -= units;
    return ST_OK;
}

static void *eval_alloc(eval_state *s, size_t bytes) {
    void *p = st_arena_alloc(s->ctx->arena, bytes);
    if (p == NULL)
        st_err_set(s->err, ST_RESOURCE_EXHAUSTED,
                   "out of memory evaluating a row filter (%zu bytes)", bytes);
    return p;
}

/* A list of room for n cells: the input buffer itself when it is ours, else a new buffer. */
static st_code list_for_output(eval_state *s, cell_list in, cell_list *out) {
    if (in.owned) {
        *out = in;
        return ST_OK;
    }
    st_code rc = charge(s, in.n);
    if (rc != ST_OK)
        return rc;
    out->v = eval_alloc(s, in.n * sizeof *out->v);
    if (out->v == NULL)
        return ST_RESOURCE_EXHAUSTED;
    out->n = in.n;
    out->owned = true;
    return ST_OK;
}

static bool same_column(const node_cell *a, const node_cell *b) {
    return st_slice_eq(a->family, b->family) && st_slice_eq(a->qualifier, b->qualifier);
}

/* True filters that decide from the column alone give the same answer for every version of a
 * column, so consecutive cells of one column reuse the previous answer. */
static bool test_depends_on_column_only(node_filter_kind kind) {
    return kind == NODE_FILTER_FAMILY_NAME_REGEX || kind == NODE_FILTER_COLUMN_QUALIFIER_REGEX ||
           kind == NODE_FILTER_COLUMN_RANGE;
}

static st_code eval_cell_test(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    /* Find the first dropped cell; until then the output equals the input. */
    bool by_column = test_depends_on_column_only(f->kind);
    bool keep = true;
    size_t i = 0;
    for (; i < in.n; i++) {
        if (!(by_column && i > 0 && same_column(in.v[i], in.v[i - 1])))
            keep = cell_test(f, s->key, in.v[i]);
        if (!keep)
            break;
    }
    if (i == in.n) {
        *out = in;
        return ST_OK;
    }
    cell_list o;
    st_code rc = list_for_output(s, in, &o);
    if (rc != ST_OK)
        return rc;
    if (o.v != in.v)
        memcpy(o.v, in.v, i * sizeof *o.v);
    size_t k = i;
    for (i++; i < in.n; i++) {
        if (!(by_column && same_column(in.v[i], in.v[i - 1])))
            keep = cell_test(f, s->key, in.v[i]);
        if (keep)
            o.v[k++] = in.v[i]; /* k <= i, so compacting in place is safe */
    }
    o.n = k;
    *out = o;
    return ST_OK;
}

static st_code eval_column_limit(eval_state *s, const node_filter *f, cell_list in,
                                 cell_list *out) {
    cell_list o;
    st_code rc = list_for_output(s, in, &o);
    if (rc != ST_OK)
        return rc;
    size_t k = 0;
    int64_t in_column = 0;
    for (size_t i = 0; i < in.n; i++) {
        if (i == 0 || !same_column(in.v[i], in.v[i - 1]))
            in_column = 0;
        if (in_column++ < f->u.count)
            o.v[k++] = in.v[i];
    }
    o.n = k;
    *out = o;
    return ST_OK;
}

/* A copy of c in the arena, charged to the budget. */
static node_cell *cell_copy(eval_state *s, const node_cell *c) {
    if (charge(s, 1) != ST_OK)
        return NULL;
    node_cell *copy = eval_alloc(s, sizeof *copy);
    if (copy != NULL)
        *copy = *c;
    return copy;
}

static st_code label_cell(eval_state *s, const node_cell *c, st_slice label, const st_slice *single,
                          const node_cell **out) {
    node_cell *copy = cell_copy(s, c);
    if (copy == NULL)
        return s->err->code; /* charge or eval_alloc filled err */
    if (c->n_labels == 0) {
        copy->labels = single; /* shared by every unlabelled cell of this node */
        copy->n_labels = 1;
    } else {
        if (c->n_labels >= NODE_FILTER_CELL_LABELS_MAX)
            return st_err_set(s->err, ST_INTERNAL, "a cell carries more than %d labels",
                              NODE_FILTER_CELL_LABELS_MAX);
        st_slice *labels = eval_alloc(s, (c->n_labels + 1) * sizeof *labels);
        if (labels == NULL)
            return ST_RESOURCE_EXHAUSTED;
        memcpy(labels, c->labels, c->n_labels * sizeof *labels);
        labels[c->n_labels] = label;
        copy->labels = labels;
        copy->n_labels = c->n_labels + 1;
    }
    *out = copy;
    return ST_OK;
}

static st_code eval_transform(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    st_slice *single = NULL;
    if (f->kind == NODE_FILTER_APPLY_LABEL) {
        single = eval_alloc(s, sizeof *single);
        if (single == NULL)
            return ST_RESOURCE_EXHAUSTED;
        *single = f->u.label;
    }
    cell_list o;
    st_code rc = list_for_output(s, in, &o);
    for (size_t i = 0; rc == ST_OK && i < in.n; i++) {
        const node_cell *c = in.v[i];
        if (f->kind == NODE_FILTER_APPLY_LABEL) {
            rc = label_cell(s, c, f->u.label, single, &o.v[i]);
        } else if (c->value.len == 0) {
            o.v[i] = c; /* already empty: stripping again changes nothing */
        } else {
            node_cell *copy = cell_copy(s, c);
            if (copy == NULL)
                return s->err->code; /* charge or eval_alloc filled err */
            copy->value = st_slice_make(NULL, 0);
            o.v[i] = copy;
        }
    }
    *out = o;
    return rc;
}

/* Stable merge of runs[0..k) (each sorted) into one sorted list: concatenate, then merge
 * neighbouring runs pairwise, left run first on ties, so identical cells keep run order and
 * each run's own order. O(total log k) time, two buffers of total slots. */
static st_code merge_runs(eval_state *s, const cell_list *runs, size_t k, cell_list *out) {
    size_t total = 0;
    for (size_t r = 0; r < k; r++)
        total += runs[r].n;
    st_code rc = charge(s, 2 * total);
    if (rc != ST_OK)
        return rc;
    const node_cell **a = eval_alloc(s, (total ? total : 1) * sizeof *a);
    const node_cell **b = eval_alloc(s, (total ? total : 1) * sizeof *b);
    size_t *bounds = eval_alloc(s, (k + 1) * sizeof *bounds);
    if (a == NULL || b == NULL || bounds == NULL)
        return ST_RESOURCE_EXHAUSTED;
    size_t pos = 0;
    for (size_t r = 0; r < k; r++) {
        bounds[r] = pos;
        if (runs[r].n > 0)
            memcpy(a + pos, runs[r].v, runs[r].n * sizeof *a);
        pos += runs[r].n;
    }
    bounds[k] = pos;
    for (size_t nruns = k; nruns > 1; nruns = (nruns + 1) / 2) {
        for (size_t r = 0; r < nruns; r += 2) {
            size_t lo = bounds[r], mid = bounds[r + 1 < nruns ? r + 1 : nruns];
            size_t hi = bounds[r + 2 < nruns ? r + 2 : nruns], i = lo, j = mid, d = lo;
            while (i < mid && j < hi)
                b[d++] = node_cell_cmp(a[j], a[i]) < 0 ? a[j++] : a[i++];
            while (i < mid)
                b[d++] = a[i++];
            while (j < hi)
                b[d++] = a[j++];
            bounds[r / 2] = lo;
        }
        bounds[(nruns + 1) / 2] = total;
        const node_cell **t = a;
        a = b;
        b = t;
    }
    *out = (cell_list){a, total, true};
    return ST_OK;
}

static st_code eval_node(eval_state *s, const node_filter *f, cell_list in, cell_list *out);

static st_code eval_chain(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    cell_list cur = in;
    for (size_t i = 0; i < f->u.list.count && cur.n > 0; i++) {
        cell_list next;
        st_code rc = eval_node(s, f->u.list.subs[i], cur, &next);
        if (rc != ST_OK)
            return rc;
        cur = next;
    }
    *out = cur.n > 0 ? cur : EMPTY_LIST;
    return ST_OK;
}

static st_code eval_interleave(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    size_t k = f->u.list.count, nonempty = 0, last = 0;
    cell_list *branch = eval_alloc(s, k * sizeof *branch);
    if (branch == NULL)
        return ST_RESOURCE_EXHAUSTED;
    cell_list shared = in;
    shared.owned = false; /* every branch reads the same input */
    for (size_t i = 0; i < k; i++) {
        st_code rc = eval_node(s, f->u.list.subs[i], shared, &branch[i]);
        if (rc != ST_OK)
            return rc;
        if (branch[i].n > 0) {
            nonempty++;
            last = i;
        }
    }
    if (nonempty <= 1) {
        *out = nonempty ? branch[last] : EMPTY_LIST;
        return ST_OK;
    }
    return merge_runs(s, branch, k, out);
}

static st_code eval_condition(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    cell_list shared = in, matched = in;
    shared.owned = false; /* the chosen branch reads the input again */
    if (f->u.cond.predicate != NULL) {
        st_code rc = eval_node(s, f->u.cond.predicate, shared, &matched);
        if (rc != ST_OK)
            return rc;
    }
    const node_filter *next = matched.n > 0 ? f->u.cond.on_true : f->u.cond.on_false;
    if (next == NULL) {
        *out = EMPTY_LIST;
        return ST_OK;
    }
    return eval_node(s, next, in, out);
}

static st_code eval_sink(eval_state *s, cell_list in) {
    if (s->sink_count == s->sink_cap) {
        size_t cap = s->sink_cap ? 2 * s->sink_cap : 8;
        cell_list *runs = eval_alloc(s, cap * sizeof *runs);
        if (runs == NULL)
            return ST_RESOURCE_EXHAUSTED;
        if (s->sink_count > 0)
            memcpy(runs, s->sink_runs, s->sink_count * sizeof *runs);
        s->sink_runs = runs;
        s->sink_cap = cap;
    }
    in.owned = false; /* stored: nobody may overwrite it any more */
    s->sink_runs[s->sink_count++] = in;
    return ST_OK;
}

/* Uniform double in [0, 1) from the top 53 bits. */
static double rng_unit(st_rng *rng) {
    return (double)(st_rng_next(rng) >> 11) * 0x1p-53;
}

static st_code eval_node(eval_state *s, const node_filter *f, cell_list in, cell_list *out) {
    if (f == NULL || in.n == 0) { /* every filter maps an empty row to an empty row */
        *out = in;
        return ST_OK;
    }
    switch (f->kind) {
    case NODE_FILTER_PASS_ALL:
        *out = in;
        return ST_OK;
    case NODE_FILTER_BLOCK_ALL:
        *out = EMPTY_LIST;
        return ST_OK;
    case NODE_FILTER_CHAIN:
        return eval_chain(s, f, in, out);
    case NODE_FILTER_INTERLEAVE:
        return eval_interleave(s, f, in, out);
    case NODE_FILTER_CONDITION:
        return eval_condition(s, f, in, out);
    case NODE_FILTER_SINK:
        *out = EMPTY_LIST;
        return eval_sink(s, in);
    case NODE_FILTER_ROW_KEY_REGEX:
        *out = regex_match(f, s->key) ? in : EMPTY_LIST;
        return ST_OK;
    case NODE_FILTER_ROW_SAMPLE:
        ST_ASSERT(s->ctx->rng != NULL);
        *out = rng_unit(s->ctx->rng) < f->u.probability ? in : EMPTY_LIST;
        return ST_OK;
    case NODE_FILTER_CELLS_PER_ROW_OFFSET: {
        size_t skip = (uint64_t)f->u.count < in.n ? (size_t)f->u.count : in.n;
        *out = (cell_list){in.v + skip, in.n - skip, in.owned};
        return ST_OK;
    }
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
        *out = (cell_list){in.v, (uint64_t)f->u.count < in.n ? (size_t)f->u.count : in.n, in.owned};
        return ST_OK;
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT:
        return eval_column_limit(s, f, in, out);
    case NODE_FILTER_STRIP_VALUE:
    case NODE_FILTER_APPLY_LABEL:
        return eval_transform(s, f, in, out);
    default:
        return eval_cell_test(s, f, in, out);
    }
}

st_code node_filter_eval(const node_filter *f, st_slice row_key, const node_cell *cells, size_t n,
                         node_filter_ctx *ctx, const node_cell *const **out, size_t *out_n,
                         st_err *err) {
    eval_state s = {.ctx = ctx, .key = row_key, .err = err};
    s.budget = ctx->cells_max ? ctx->cells_max : NODE_FILTER_EVAL_CELLS_MAX;
    *out = NULL;
    *out_n = 0;
    if (n == 0)
        return ST_OK;
    st_code rc = charge(&s, n);
    if (rc != ST_OK)
        return rc;
    const node_cell **input = eval_alloc(&s, n * sizeof *input);
    if (input == NULL)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++)
        input[i] = &cells[i];
    cell_list result;
    rc = eval_node(&s, f, (cell_list){input, n, true}, &result);
    if (rc == ST_OK && s.sink_count > 0) {
        /* Sink copies first among identical cells, as data.proto's example lists them. */
        rc = eval_sink(&s, result);
        if (rc == ST_OK)
            rc = merge_runs(&s, s.sink_runs, s.sink_count, &result);
    }
    if (rc != ST_OK)
        return rc;
    *out = result.v;
    *out_n = result.n;
    return ST_OK;
}

/* ---- streaming helpers ---- */

size_t node_filter_weight(const node_filter *f) {
    if (f == NULL)
        return 1;
    switch (f->kind) {
    case NODE_FILTER_CHAIN:
    case NODE_FILTER_INTERLEAVE: {
        size_t w = 1;
        for (size_t i = 0; i < f->u.list.count; i++)
            w += node_filter_weight(f->u.list.subs[i]);
        return w;
    }
    case NODE_FILTER_CONDITION:
        return 1 + node_filter_weight(f->u.cond.predicate) + node_filter_weight(f->u.cond.on_true) +
               node_filter_weight(f->u.cond.on_false);
    case NODE_FILTER_ROW_KEY_REGEX:
    case NODE_FILTER_FAMILY_NAME_REGEX:
    case NODE_FILTER_COLUMN_QUALIFIER_REGEX:
    case NODE_FILTER_VALUE_REGEX:
        return NODE_FILTER_REGEX_WEIGHT;
    default:
        return 1;
    }
}

static size_t value_regexes(const node_filter *f) {
    if (f == NULL)
        return 0;
    switch (f->kind) {
    case NODE_FILTER_CHAIN:
    case NODE_FILTER_INTERLEAVE: {
        size_t n = 0;
        for (size_t i = 0; i < f->u.list.count; i++)
            n += value_regexes(f->u.list.subs[i]);
        return n;
    }
    case NODE_FILTER_CONDITION:
        return value_regexes(f->u.cond.predicate) + value_regexes(f->u.cond.on_true) +
               value_regexes(f->u.cond.on_false);
    case NODE_FILTER_VALUE_REGEX:
        return 1;
    default:
        return 0;
    }
}

node_filter_cost node_filter_cost_of(const node_filter *f) {
    node_filter_cost c = {node_filter_weight(f), value_regexes(f)};
    return c;
}

uint64_t node_filter_work(node_filter_cost c, size_t cells, size_t value_bytes) {
    return (uint64_t)cells * c.weight +
           (uint64_t)c.value_regexes * value_bytes / NODE_FILTER_REGEX_BYTES_PER_UNIT;
}

st_code node_filter_row_work_check(node_filter_cost c, size_t cells, size_t value_bytes,
                                   st_err *err) {
    uint64_t work = node_filter_work(c, cells, value_bytes);
    if (work <= NODE_FILTER_ROW_WORK_MAX)
        return ST_OK;
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "the row filter over a row of %zu cells (%zu bytes of values) is %" PRIu64
                      " units of work (%zu per cell, %zu value regexes), more than the %" PRIu64
                      " one evaluation may take on the node: use fewer regexes (a column, value "
                      "or timestamp range costs a fraction of one), or in a read narrow the row "
                      "first with a chain that starts with such ranges or cells_per_column_limit",
                      cells, value_bytes, work, c.weight, c.value_regexes,
                      NODE_FILTER_ROW_WORK_MAX);
}

bool node_filter_is_per_cell(const node_filter *f) {
    if (f == NULL)
        return true;
    switch (f->kind) {
    case NODE_FILTER_CHAIN:
        for (size_t i = 0; i < f->u.list.count; i++)
            if (!node_filter_is_per_cell(f->u.list.subs[i]))
                return false;
        return true;
    case NODE_FILTER_INTERLEAVE:
    case NODE_FILTER_CONDITION:
    case NODE_FILTER_SINK:
    case NODE_FILTER_ROW_SAMPLE:
    case NODE_FILTER_CELLS_PER_ROW_OFFSET:
    case NODE_FILTER_CELLS_PER_ROW_LIMIT:
    case NODE_FILTER_CELLS_PER_COLUMN_LIMIT:
        return false;
    default:
        return true;
    }
}

static st_code cell_apply(eval_state *s, const node_filter *f, const node_cell *c,
                          const node_cell **out) {
    if (f == NULL) {
        *out = c;
        return ST_OK;
    }
    if (f->kind == NODE_FILTER_CHAIN) {
        for (size_t i = 0; i < f->u.list.count && c != NULL; i++) {
            st_code rc = cell_apply(s, f->u.list.subs[i], c, &c);
            if (rc != ST_OK)
                return rc;
        }
        *out = c;
        return ST_OK;
    }
    if (f->kind == NODE_FILTER_STRIP_VALUE || f->kind == NODE_FILTER_APPLY_LABEL) {
        /* A one-cell owned list: eval_transform replaces c in place. */
        cell_list one = {&c, 1, true}, res;
        st_code rc = eval_transform(s, f, one, &res);
        *out = rc == ST_OK ? c : NULL;
        return rc;
    }
    *out = cell_test(f, s->key, c) ? c : NULL;
    return ST_OK;
}

st_code node_filter_cell_apply(const node_filter *f, st_slice row_key, const node_cell *cell,
                               node_filter_ctx *ctx, const node_cell **out, st_err *err) {
    ST_ASSERT(node_filter_is_per_cell(f));
    eval_state s = {.ctx = ctx, .key = row_key, .err = err, .budget = SIZE_MAX};
    return cell_apply(&s, f, cell, out);
}

/* ---- streaming a filter's head ---- */

static bool kind_counts(node_filter_kind kind) {
    return kind == NODE_FILTER_CELLS_PER_COLUMN_LIMIT || kind == NODE_FILTER_CELLS_PER_ROW_LIMIT ||
           kind == NODE_FILTER_CELLS_PER_ROW_OFFSET;
}

/* Whether every node of f can be applied cell by cell with a count kept per row or column. */
static bool is_streamable(const node_filter *f) {
    if (f == NULL)
        return true;
    if (f->kind == NODE_FILTER_CHAIN) {
        for (size_t i = 0; i < f->u.list.count; i++)
            if (!is_streamable(f->u.list.subs[i]))
                return false;
        return true;
    }
    return kind_counts(f->kind) || node_filter_is_per_cell(f);
}

/* Stages of streamable f, nested chains flattened, appended at s->stages[s->n...]. */
static void stream_add(node_filter_stream *s, const node_filter *f) {
    if (f == NULL)
        return;
    if (f->kind == NODE_FILTER_CHAIN) {
        for (size_t i = 0; i < f->u.list.count; i++)
            stream_add(s, f->u.list.subs[i]);
        return;
    }
    s->stages[s->n++] = (node_filter_stage){f, 0, 0};
    s->weight += node_filter_weight(f);
    s->value_regexes += value_regexes(f);
    s->by_column |= f->kind == NODE_FILTER_CELLS_PER_COLUMN_LIMIT;
}

/* Leaf nodes of streamable f: the most stages it can make. */
static size_t stream_leaves(const node_filter *f) {
    if (f == NULL || f->kind != NODE_FILTER_CHAIN)
        return 1;
    size_t n = 0;
    for (size_t i = 0; i < f->u.list.count; i++)
        n += stream_leaves(f->u.list.subs[i]);
    return n;
}

st_code node_filter_stream_init(node_filter_stream *s, const node_filter *f, st_arena *arena) {
    memset(s, 0, sizeof *s);
    st_buf_init(&s->last_column);
    if (f == NULL)
        return ST_OK;
    if (f->kind != NODE_FILTER_CHAIN || is_streamable(f)) {
        if (!is_streamable(f)) {
            s->rest = f;
            return ST_OK;
        }
        s->stages = st_arena_alloc(arena, stream_leaves(f) * sizeof *s->stages);
        if (s->stages == NULL)
            return ST_RESOURCE_EXHAUSTED;
        stream_add(s, f);
        return ST_OK;
    }
    /* A chain that needs the whole row somewhere: its streamable subs[0..k) are the head. */
    node_filter *const *subs = f->u.list.subs;
    size_t count = f->u.list.count, k = 0, leaves = 0;
    for (; k < count && is_streamable(subs[k]); k++)
        leaves += stream_leaves(subs[k]);
    if (leaves > 0) {
        s->stages = st_arena_alloc(arena, leaves * sizeof *s->stages);
        if (s->stages == NULL)
            return ST_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < k; i++)
        stream_add(s, subs[i]);
    s->rest = k == 0           ? f
              : count - k == 1 ? subs[k]
                               : node_filter_list(arena, NODE_FILTER_CHAIN, subs + k, count - k);
    return s->rest ? ST_OK : ST_RESOURCE_EXHAUSTED;
}

void node_filter_stream_deinit(node_filter_stream *s) {
    st_buf_free(&s->last_column);
}

void node_filter_stream_row_start(node_filter_stream *s) {
    s->column = 0;
    st_buf_reset(&s->last_column);
    for (size_t i = 0; i < s->n; i++) {
        s->stages[i].seen = 0;
        s->stages[i].column = 0;
    }
}

/* Numbers c's column within the row (a new number when it differs from the last cell's): the
 * iterator's slices die at its next call, so the last column is kept as a copy. */
static st_code stream_column(node_filter_stream *s, const node_cell *c, st_err *err) {
    const st_buf *b = &s->last_column;
    uint64_t flen = c->family.len;
    if (s->column > 0 && b->len == sizeof flen + c->family.len + c->qualifier.len &&
        memcmp(b->data, &flen, sizeof flen) == 0 &&
        memcmp(b->data + sizeof flen, c->family.data, c->family.len) == 0 &&
        memcmp(b->data + sizeof flen + c->family.len, c->qualifier.data, c->qualifier.len) == 0)
        return ST_OK;
    s->column++;
    st_buf_reset(&s->last_column);
    if (st_buf_append(&s->last_column, &flen, sizeof flen) != ST_OK ||
        st_buf_append(&s->last_column, c->family.data, c->family.len) != ST_OK ||
        st_buf_append(&s->last_column, c->qualifier.data, c->qualifier.len) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory filtering a row");
    return ST_OK;
}

/* Whether a counting stage passes the next cell of its input on (column: the cell's). */
static bool stage_count(node_filter_stage *st, uint64_t column) {
    if (st->f->kind == NODE_FILTER_CELLS_PER_COLUMN_LIMIT && st->column != column) {
        st->column = column;
        st->seen = 0;
    }
    int64_t place = st->seen++;
    if (st->f->kind == NODE_FILTER_CELLS_PER_ROW_OFFSET)
        return place >= st->f->u.count;
    return place < st->f->u.count;
}

st_code node_filter_stream_cell(node_filter_stream *s, st_slice row_key, const node_cell *cell,
                                node_filter_ctx *ctx, const node_cell **out, st_err *err) {
    if (s->by_column) {
        st_code rc = stream_column(s, cell, err);
        if (rc != ST_OK)
            return rc;
    }
    eval_state es = {.ctx = ctx, .key = row_key, .err = err, .budget = SIZE_MAX};
    const node_cell *c = cell;
    for (size_t i = 0; i < s->n && c != NULL; i++) {
        node_filter_stage *st = &s->stages[i];
        if (kind_counts(st->f->kind)) {
            c = stage_count(st, s->column) ? c : NULL;
            continue;
        }
        st_code rc = cell_apply(&es, st->f, c, &c);
        if (rc != ST_OK)
            return rc;
    }
    *out = c;
    return ST_OK;
}
