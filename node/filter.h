/* node/filter.h — the Bigtable RowFilter language, evaluated one row at a time.
 *
 * A node_filter tree mirrors google.bigtable.v2.RowFilter. The service edge turns the protobuf
 * into this tree (nodes usually allocated from the call's arena with the node_filter_* builders
 * below), then:
 *
 *     node_filter_prepare(f, &err)      validate with Bigtable's rules, compile the regexes
 *     node_filter_eval(f, ...)          once per row, any number of times, from any thread
 *     node_filter_release(f)            free the compiled regexes (the nodes belong to the caller)
 *
 * Semantics (data.proto comments; docs/filters.md says where each was checked):
 *   chain        sequential composition: in -> f0 -> f1 -> ... -> out
 *   interleave   every branch sees the same input; outputs merged in row order, duplicates kept
 *                (identical cells: branch order, then each branch's own order)
 *   condition    if predicate outputs any cell: true branch on the input, else false branch;
 *                a missing branch outputs nothing; a missing predicate is pass_all
 *   sink         sends its input straight to the read's output and NOTHING to its parent
 *   limits       cells_per_row_offset/limit count cells in row order, cells_per_column_limit counts
 *                per (family, qualifier) newest first; every duplicate counts
 *   labels       apply_label appends a label to each cell; strip_value empties values
 * The final row is the normal output merged with everything sinks emitted, in row order (family
 * asc, qualifier asc, timestamp desc); among identical cells the sink copies come first (the order
 * is unspecified by Bigtable; data.proto's example lists them first).
 *
 * Errors: ST_INVALID_ARGUMENT from prepare/validate ends the RPC (it is the client's filter);
 * ST_RESOURCE_EXHAUSTED from eval means the filter multiplied a row past the evaluation budget
 * (or memory ran out) and ends the RPC too. Nothing here ends a connection, a tablet or the
 * process. */
#ifndef STRATA_NODE_FILTER_H
#define STRATA_NODE_FILTER_H

#include <strata/base.h>

#include "re2_shim.h"

/* Filters may nest (chain, interleave, condition) at most this deep; the root is depth 0
 * (data.proto: "may not be nested ... to a depth of more than 20"). Bounds the C stack. */
#define NODE_FILTER_DEPTH_MAX 20
/* Work the regexes of one filter may take to compile, in node_regex_cost units (regex_cost.h:
 * at most about 0.5 us each on the node's loop, so 25 ms at worst, a few ms for most filters).
 * Compiling runs on the loop before the call reads anything: 400 regexes (\pL|\pN){300} in a
 * 9 KB filter held it 0.5 to 2 s for a row that did not exist. Past it: INVALID_ARGUMENT naming
 * the regex. */
#define NODE_FILTER_COMPILE_WORK_MAX 50000
/* Labels: 1..15 characters of [a-z0-9-]. */
#define NODE_FILTER_LABEL_BYTES_MAX 15
/* Default budget of cell slots one evaluation may create (intermediate lists plus transformed
 * cells): nested interleaves can multiply a row exponentially, this stops them. */
#define NODE_FILTER_EVAL_CELLS_MAX (4u << 20)
/* Labels one cell can carry. Validation allows at most one label per path, so this is slack. */
#define NODE_FILTER_CELL_LABELS_MAX 64

typedef enum node_filter_kind {
    NODE_FILTER_PASS_ALL = 0, /* also what an unset RowFilter means */
    NODE_FILTER_BLOCK_ALL,
    NODE_FILTER_CHAIN,
    NODE_FILTER_INTERLEAVE,
    NODE_FILTER_CONDITION,
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
    NODE_FILTER_APPLY_LABEL,
    NODE_FILTER_KIND_COUNT
} node_filter_kind;

/* One end of a qualifier or value range. Unbounded start = "" inclusive; unbounded end = +inf. */
typedef enum node_bound_kind {
    NODE_BOUND_UNBOUNDED = 0,
    NODE_BOUND_CLOSED,
    NODE_BOUND_OPEN,
} node_bound_kind;

typedef struct node_bound {
    node_bound_kind kind;
    st_slice key;
} node_bound;

typedef struct node_filter node_filter;
struct node_filter {
    node_filter_kind kind;
    union {
        struct { /* CHAIN, INTERLEAVE */
            node_filter **subs;
            size_t count;
        } list;
        struct { /* CONDITION; any may be NULL */
            node_filter *predicate;
            node_filter *on_true;
            node_filter *on_false;
        } cond;
        struct { /* *_REGEX; re is set by node_filter_prepare */
            st_slice pattern;
            node_re2 *re;
        } regex;
        double probability; /* ROW_SAMPLE, in (0, 1) */
        struct {            /* COLUMN_RANGE */
            st_slice family;
            node_bound start, end;
        } column_range;
        struct { /* TIMESTAMP_RANGE: [start_us, end_us); end_us 0 = infinity */
            int64_t start_us;
            int64_t end_us;
        } ts_range;
        struct { /* VALUE_RANGE */
            node_bound start, end;
        } value_range;
        int64_t count;  /* CELLS_PER_ROW_OFFSET (>= 0), *_LIMIT (> 0) */
        st_slice label; /* APPLY_LABEL */
    } u;
};

/* ---- builders: nodes allocated from arena (valid until st_arena_deinit); NULL when memory
 * runs out. Slices are borrowed, not copied: they must outlive the tree. ---- */
node_filter *node_filter_new(st_arena *arena, node_filter_kind kind);
/* CHAIN or INTERLEAVE over subs[0..count) (the array is copied into the arena). */
node_filter *node_filter_list(st_arena *arena, node_filter_kind kind, node_filter *const *subs,
                              size_t count);
node_filter *node_filter_condition(st_arena *arena, node_filter *predicate, node_filter *on_true,
                                   node_filter *on_false);
/* Any *_REGEX kind. */
node_filter *node_filter_regex(st_arena *arena, node_filter_kind kind, st_slice pattern);
node_filter *node_filter_count(st_arena *arena, node_filter_kind kind, int64_t count);
node_filter *node_filter_row_sample(st_arena *arena, double probability);
node_filter *node_filter_column_range(st_arena *arena, st_slice family, node_bound start,
                                      node_bound end);
node_filter *node_filter_ts_range(st_arena *arena, int64_t start_us, int64_t end_us);
node_filter *node_filter_value_range(st_arena *arena, node_bound start, node_bound end);
node_filter *node_filter_label(st_arena *arena, st_slice label);

/* ---- validation and compilation ---- */
/* Checks f against Cloud Bigtable's rules and compiles every regex into the tree. On error
 * returns ST_INVALID_ARGUMENT (or ST_RESOURCE_EXHAUSTED when memory runs out) with a message
 * naming the field, e.g. "Error in field 'row_key_regex_filter' : missing ): (a", and leaves no
 * regex compiled. Rules: chain/interleave need >= 2 filters; at most one sub-filter of a chain
 * may contain apply_label (a label in a condition's predicate counts too); no sink anywhere under a
 * condition; nesting depth <= NODE_FILTER_DEPTH_MAX; row_key and family regexes non-empty;
 * family regex without ':'; the regexes' node_regex_cost sums to at most
 * NODE_FILTER_COMPILE_WORK_MAX (checked before each is compiled, so a refused filter costs
 * little); each regex compiles within NODE_RE2_MEM_BYTES_MAX; row_sample in
 * (0, 1); offset >= 0, limits > 0; timestamps >= 0; column_range has a family; labels
 * 1..15 chars of [a-z0-9-]. Preparing an already prepared tree is a no-op returning ST_OK.
 * Not checked here (the proto edge does it): the 20,480-byte size limit, and boolean fields
 * (pass_all, block_all, sink, strip_value) being true. */
st_code node_filter_prepare(node_filter *f, st_err *err);
/* Frees the compiled regexes of f; the tree can be prepared again. NULL and unprepared trees
 * are fine. */
void node_filter_release(node_filter *f);
/* Prepare then release: same checks and errors; leaves f unprepared (call it on an unprepared
 * tree). */
st_code node_filter_validate(node_filter *f, st_err *err);

/* The work of applying f to one cell, in units of a simple test applied to a cell (a range, a
 * limit, a step of an interleave's merge: up to about 25 ns): the sum over its nodes, a regex
 * counting NODE_FILTER_REGEX_WEIGHT, what one match of a short subject costs (300 to 700 ns
 * measured). Readers bound the work of one loop turn by it (cells x weight): a 20 KB filter of
 * 1,800 chained regexes costs thousands of times what a single test does per cell, and counting
 * cells alone let one turn run for half a minute. */
#define NODE_FILTER_REGEX_WEIGHT 16
size_t node_filter_weight(const node_filter *f);
/* A value regex also reads the whole value of every cell it is given (RE2 is linear in the
 * subject, 2 to 7 ns a byte): its work grows by one unit every this many bytes of value. */
#define NODE_FILTER_REGEX_BYTES_PER_UNIT 4
/* What f costs: per cell, and per byte of value (its value regexes). */
typedef struct node_filter_cost {
    size_t weight;        /* node_filter_weight(f) */
    size_t value_regexes; /* value_regex_filter nodes of f */
} node_filter_cost;
node_filter_cost node_filter_cost_of(const node_filter *f);
/* Work of a filter of cost c over cells cells holding value_bytes bytes of values:
 * cells x weight + value_regexes x value_bytes / NODE_FILTER_REGEX_BYTES_PER_UNIT. */
uint64_t node_filter_work(node_filter_cost c, size_t cells, size_t value_bytes);
/* Work a filter may take over one row evaluated in one piece on the node's event loop: a
 * row-level filter (interleave, condition, sink, row_sample) over a complete row, a
 * CheckAndMutateRow predicate. Tens of milliseconds: every call of the node, and the router's
 * keepalive PING, waits for it; at 8 Mi units with a regex counted 4, a CheckAndMutateRow of 300
 * value regexes over 6,000 cells held the loop 0.7 s a call, and a few such callers stalled every
 * client of the node for seconds. Past it: FAILED_PRECONDITION (node_filter_row_work_check). */
#define NODE_FILTER_ROW_WORK_MAX ((uint64_t)2 << 20)
/* ST_OK when a filter of cost c over a row of cells cells and value_bytes bytes of values is
 * within NODE_FILTER_ROW_WORK_MAX; else FAILED_PRECONDITION saying what, and what to do. */
st_code node_filter_row_work_check(node_filter_cost c, size_t cells, size_t value_bytes,
                                   st_err *err);

/* True when f can be applied one cell at a time as cells stream by (every node is a chain or a
 * per-cell test/transformer: regexes, ranges, pass/block_all, strip_value, apply_label). The
 * read path may then skip materialising the row; node_filter_cell_apply does the work. */
bool node_filter_is_per_cell(const node_filter *f);

/* ---- evaluation ---- */
typedef struct node_cell {
    st_slice family;
    st_slice qualifier;
    int64_t ts_us;
    st_slice value;
    const st_slice *labels; /* n_labels entries; NULL when none */
    uint32_t n_labels;
} node_cell;

typedef struct node_filter_ctx {
    st_arena *arena;  /* results and scratch; caller inits and deinits (one per row or batch) */
    st_rng *rng;      /* row_sample draws; required only when the filter samples */
    size_t cells_max; /* slots one evaluation may create; 0 = NODE_FILTER_EVAL_CELLS_MAX */
} node_filter_ctx;

/* Applies prepared filter f (NULL = pass all) to one row: key plus cells[0..n) in Bigtable order
 * (family asc, qualifier asc, ts desc; the caller guarantees it). Stores in *out an array of
 * *out_n cell pointers in the same order; each points into `cells` or into ctx->arena, so the
 * result lives until both the input and the arena go away. Returns ST_OK, or
 * ST_RESOURCE_EXHAUSTED when the evaluation budget or memory runs out (ST_INTERNAL if an input
 * cell already carries NODE_FILTER_CELL_LABELS_MAX labels, which storage never produces). */
st_code node_filter_eval(const node_filter *f, st_slice row_key, const node_cell *cells, size_t n,
                         node_filter_ctx *ctx, const node_cell *const **out, size_t *out_n,
                         st_err *err);

/* For a per-cell filter (node_filter_is_per_cell is true): applies f to one cell of the row.
 * Stores in *out the cell to emit (the input itself, or a transformed copy in ctx->arena), or NULL
 * when f drops it. ST_RESOURCE_EXHAUSTED only when memory runs out. */
st_code node_filter_cell_apply(const node_filter *f, st_slice row_key, const node_cell *cell,
                               node_filter_ctx *ctx, const node_cell **out, st_err *err);

/* ---- streaming a filter's head while a row is assembled ----
 * A reader that assembles a row for a filter applies the filter's head to each cell as it
 * arrives and keeps only what the head passes on; node_filter_eval then runs the rest over the
 * kept cells. The head is the filter itself when it is built only of per-cell filters, the
 * counting filters (cells_per_column_limit, cells_per_row_limit, cells_per_row_offset) and
 * chains of them; otherwise the longest leading run of such filters in a root chain (nested
 * chains of such filters count). A chain is sequential composition and a counting filter keeps
 * cells by their place in its input, so the result is the same; what the head drops (versions
 * past a limit, cells of other columns) never takes the reader's memory. The rest starts at the
 * first filter that needs the whole row (interleave, condition, sink, row_sample). */
typedef struct node_filter_stage {
    const node_filter *f; /* a per-cell filter or a counting one */
    int64_t seen;         /* cells counted: in the row, or in the column of `column` */
    uint64_t column; /* the column counted (cells_per_column_limit): node_filter_stream.column */
} node_filter_stage;

typedef struct node_filter_stream {
    node_filter_stage *stages; /* the head, in order */
    size_t n;
    const node_filter *rest; /* evaluated over the kept row; NULL when the head is all of it */
    size_t weight;           /* node_filter_weight of the head: work per cell arriving */
    size_t value_regexes;    /* of the head: work per byte of value (node_filter_cost) */
    bool by_column;          /* a stage counts per column: columns are told apart */
    uint64_t column;         /* number of the current column in the row, from 1 */
    st_buf last_column;      /* family length (8 bytes), family, qualifier of the last cell */
} node_filter_stream;

/* Splits prepared f (NULL: no filter) into head and rest. Stages and any chain node made for the
 * rest come from arena; f and arena must outlive the stream. ST_RESOURCE_EXHAUSTED when memory
 * runs out. Free with node_filter_stream_deinit. */
st_code node_filter_stream_init(node_filter_stream *s, const node_filter *f, st_arena *arena);
void node_filter_stream_deinit(node_filter_stream *s);
/* Before a row's first cell. */
void node_filter_stream_row_start(node_filter_stream *s);
/* Applies the head to the row's next cell (cells in Bigtable order): *out is the cell to keep
 * (the input itself, or a transformed copy in ctx->arena), or NULL when the head drops it.
 * ST_RESOURCE_EXHAUSTED only when memory runs out. */
st_code node_filter_stream_cell(node_filter_stream *s, st_slice row_key, const node_cell *cell,
                                node_filter_ctx *ctx, const node_cell **out, st_err *err);

/* Bigtable cell order: family asc, qualifier asc (bytes), timestamp desc. <0, 0, >0. */
int node_cell_cmp(const node_cell *a, const node_cell *b);

const char *node_filter_kind_name(node_filter_kind kind);

#endif
