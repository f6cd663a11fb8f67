/* diff_emulator_test.c — differential test: one random sequence of mutations and reads (every
 * mutation kind, MutateRows, CheckAndMutateRow, ReadModifyWriteRow, and ReadRows with random row
 * sets, limits, reversed scans and random filters of every kind) is sent to a real strata-node
 * and to the official Cloud Bigtable emulator (cbtemulator), and the answers are compared byte for
 * byte: status codes, rows, cells, their order, labels, values and (explicitly set) timestamps.
 * Invalid requests are compared by status code against Cloud Bigtable's documented answer.
 *
 * The key space is small so rows collide. Cases where Cloud Bigtable's answer is unspecified
 * (the order of Interleave duplicates) are canonicalised; cases where the emulator is known to
 * differ from Cloud Bigtable are not generated or not compared; each is listed in docs/testing.md
 * ("diff_emulator_test exclusions").
 *
 * Usage: diff_emulator_test PATH/TO/strata-node   (emulator: $STRATA_EMULATOR or the Cloud SDK
 * path; exit 77 = skipped when it is absent). $STRATA_SEED replays a run; $STRATA_DIFF_OPS sets
 * the number of operations (default 2000); $STRATA_DIFF_VERBOSE prints every operation and
 * strata-node's answer. */
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "btclient.h"

#define DIFF_OPS_DEFAULT 2000
#define DIFF_FAILURES_MAX 10 /* stop after this many differences: state has likely diverged */
#define DIFF_FILTER_DEPTH_MAX 3
#define DIFF_TS_STEPS 10                   /* explicit timestamps are 0, 1000, ..., 10000 */
#define DIFF_SERVER_TS_MIN 1000000000000LL /* above any explicit timestamp: server-assigned */
/* Sink is generated only where the emulator implements it like Cloud Bigtable (docs/testing.md). */
#define SINK_ENABLED 0
/* Reversed scans need an emulator with reverse-scan support (docs/testing.md). */
#define REVERSE_ENABLED 1

typedef Google__Bigtable__V2__RowFilter__FilterCase fcase;

/* ---- the small data space ---- */
static const char *const KEYS[] = {"a", "b", "ba", "bb", "c", "c\x01", "d", "e", "r1", "r2"};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])
static const size_t KEY_LENS[N_KEYS] = {1, 1, 2, 2, 1, 2, 1, 1, 2, 2};
/* Keys that are never written, for row sets and range bounds. */
static const char *const MISSING_KEYS[] = {"", "aa", "b0", "z", "r", "r3"};
#define N_MISSING (sizeof MISSING_KEYS / sizeof MISSING_KEYS[0])
static const char *const FAMS[] = {"cf1", "cf2", "cf3"};
#define N_FAMS 3
/* "n" is reserved for 8-byte counters (ReadModifyWrite increments). */
static const char *const QUALS[] = {"", "a", "ab", "b", "c"};
#define N_QUALS (sizeof QUALS / sizeof QUALS[0])
static const char *const VALUES[] = {"", "a", "b", "v0", "v1", "v2", "v3", "v9", "zz\nzz", "zz-zz"};
#define N_VALUES (sizeof VALUES / sizeof VALUES[0])

/* No empty row regex: Cloud Bigtable rejects it, the emulator only when it reaches it on a row. */
static const char *const ROW_REGEX[] = {"a",  "b.*",   "[a-c]", ".*a.*", "r\\d",
                                        "c.", "(a|d)", "b+",    ".*",    "r[^1]"};
static const char *const FAM_REGEX[] = {"cf1", "cf[12]", "cf.*", ".*3", "x", "cf2|cf3"};
static const char *const QUAL_REGEX[] = {"a", "a.*", "", ".*", "[bc]", "a|b", ".+"};
static const char *const VAL_REGEX[] = {"v.*",   "v[0-4]",  ".*",    "",   "a",
                                        "zz.zz", "zz\\nzz", "[ab]?", ".*9"};
static const char *const LABELS[] = {"la", "lb", "x-1"};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

typedef struct side {
    const char *name;
    bt_client c;
} side;

typedef struct run {
    st_rng rng;
    uint64_t seed;
    side s[2]; /* 0 = strata-node, 1 = emulator */
    int op;
    int passed, failed, excluded;
    st_arena a; /* per operation */
    st_buf desc;
    st_buf out[2];
} run;

static uint64_t rnd(run *r, uint64_t n) {
    return st_rng_below(&r->rng, n);
}
static bool chance(run *r, unsigned pct) {
    return rnd(r, 100) < pct;
}

static void descf(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void descf(run *r, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        st_buf_append(&r->desc, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void desc_bytes(run *r, st_slice s) {
    st_buf_append_byte(&r->desc, '"');
    bt_escape(&r->desc, s);
    st_buf_append_byte(&r->desc, '"');
}

static void outf(st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(st_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        st_buf_append(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static st_slice key_at(size_t i) {
    return st_slice_make(KEYS[i], KEY_LENS[i]);
}
static st_slice rnd_key(run *r) {
    return key_at(rnd(r, N_KEYS));
}
static st_slice rnd_any_key(run *r) {
    if (chance(r, 80))
        return rnd_key(r);
    return st_slice_cstr(MISSING_KEYS[1 + rnd(r, N_MISSING - 1)]);
}
static int64_t rnd_ts(run *r) {
    return 1000 * (int64_t)rnd(r, DIFF_TS_STEPS + 1);
}
static const char *rnd_fam(run *r) {
    return FAMS[rnd(r, N_FAMS)];
}
static st_slice rnd_qual(run *r) {
    return st_slice_cstr(QUALS[rnd(r, N_QUALS)]);
}
static st_slice rnd_value(run *r) {
    return st_slice_cstr(VALUES[rnd(r, N_VALUES)]);
}

/* ---- comparing ---- */

static void report(run *r, const char *what) {
    r->failed++;
    fprintf(stderr,
            "DIFFERENCE #%d at operation %d (seed %" PRIu64 ", replay with STRATA_SEED=%" PRIu64
            "): %s\n  operation: %.*s\n  --- strata-node:\n%.*s  --- emulator:\n%.*s\n",
            r->failed, r->op, r->seed, r->seed, what, (int)r->desc.len, (char *)r->desc.data,
            (int)r->out[0].len, (char *)r->out[0].data, (int)r->out[1].len, (char *)r->out[1].data);
}

/* Compares the two sides' transcripts of the current operation. */
static bool compare(run *r, const char *what) {
    if (getenv("STRATA_DIFF_VERBOSE"))
        fprintf(stderr, "op %d: %.*s\n%.*s", r->op, (int)r->desc.len, (char *)r->desc.data,
                (int)r->out[0].len, (char *)r->out[0].data);
    if (r->out[0].len == r->out[1].len &&
        (r->out[0].len == 0 || memcmp(r->out[0].data, r->out[1].data, r->out[0].len) == 0)) {
        r->passed++;
        return true;
    }
    report(r, what);
    return false;
}

static void begin_op(run *r) {
    r->op++;
    st_arena_deinit(&r->a);
    st_arena_init(&r->a, 4096);
    st_buf_reset(&r->desc);
    st_buf_reset(&r->out[0]);
    st_buf_reset(&r->out[1]);
}

static void out_code(st_buf *b, st_code rc) {
    outf(b, "status %s\n", st_code_name(rc));
}

/* ---- filters ---- */

typedef struct fctx {
    bool in_cond;  /* inside a Condition: no sink */
    bool label_ok; /* no apply_label earlier on this chain path */
    bool order_ok; /* input has no duplicates: offset/limit filters are deterministic */
    bool one_fam;  /* input holds at most one family: row offset/limit are allowed */
    bool strip_ok; /* no label applied earlier on this path (the emulator's strip drops labels) */
} fctx;

typedef struct fprops {
    bool may_label;
    bool may_dup;
    bool one_fam; /* output holds at most one family */
} fprops;

static bt_filter *gen_filter(run *r, int depth, fctx cx, fprops *p);

static void desc_filter(run *r, const bt_filter *f);

static bt_filter *gen_list(run *r, int depth, fctx cx, fprops *p, fcase kind) {
    size_t n = 2 + rnd(r, kind == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN ? 3 : 2);
    bt_filter *subs[4];
    fctx sub = cx;
    bool chain = kind == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    for (size_t i = 0; i < n; i++) {
        fprops sp = {0};
        subs[i] = gen_filter(r, depth + 1, sub, &sp);
        p->may_label |= sp.may_label;
        p->may_dup |= sp.may_dup;
        if (chain) {
            /* One label per chain path; nothing order-sensitive after possible duplicates. */
            sub.label_ok = sub.label_ok && !sp.may_label;
            sub.strip_ok = sub.strip_ok && !sp.may_label;
            sub.order_ok = sub.order_ok && !sp.may_dup;
            sub.one_fam = sub.one_fam || sp.one_fam;
        }
    }
    if (!chain)
        p->may_dup = true;
    else
        p->one_fam = sub.one_fam;
    return bt_filter_list(&r->a, kind, subs, n);
}

static bt_filter *gen_condition(run *r, int depth, fctx cx, fprops *p) {
    bt_filter *f = bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CONDITION);
    f->condition = st_arena_alloc(&r->a, sizeof *f->condition);
    google__bigtable__v2__row_filter__condition__init(f->condition);
    fctx in = cx;
    in.in_cond = true;
    fctx pred = in;
    pred.label_ok = false;
    fprops sp = {0};
    f->condition->predicate_filter = chance(r, 90) ? gen_filter(r, depth + 1, pred, &sp) : NULL;
    if (chance(r, 80)) {
        f->condition->true_filter = gen_filter(r, depth + 1, in, &sp);
        p->may_label |= sp.may_label;
        p->may_dup |= sp.may_dup;
    }
    if (chance(r, 60)) {
        fprops sq = {0};
        f->condition->false_filter = gen_filter(r, depth + 1, in, &sq);
        p->may_label |= sq.may_label;
        p->may_dup |= sq.may_dup;
    }
    return f;
}

static bt_filter *gen_column_range(run *r) {
    bt_filter *f =
        bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_RANGE_FILTER);
    Google__Bigtable__V2__ColumnRange *c = st_arena_alloc(&r->a, sizeof *c);
    google__bigtable__v2__column_range__init(c);
    c->family_name = (char *)rnd_fam(r);
    st_slice lo = rnd_qual(r), hi = rnd_qual(r);
    if (st_slice_cmp(lo, hi) > 0) {
        st_slice t = lo;
        lo = hi;
        hi = t;
    }
    if (chance(r, 70)) {
        c->start_qualifier_case =
            chance(r, 50)
                ? GOOGLE__BIGTABLE__V2__COLUMN_RANGE__START_QUALIFIER_START_QUALIFIER_CLOSED
                : GOOGLE__BIGTABLE__V2__COLUMN_RANGE__START_QUALIFIER_START_QUALIFIER_OPEN;
        c->start_qualifier_closed = (ProtobufCBinaryData){lo.len, (uint8_t *)lo.data};
    }
    if (chance(r, 70)) {
        c->end_qualifier_case =
            chance(r, 50) ? GOOGLE__BIGTABLE__V2__COLUMN_RANGE__END_QUALIFIER_END_QUALIFIER_CLOSED
                          : GOOGLE__BIGTABLE__V2__COLUMN_RANGE__END_QUALIFIER_END_QUALIFIER_OPEN;
        c->end_qualifier_closed = (ProtobufCBinaryData){hi.len, (uint8_t *)hi.data};
    }
    f->column_range_filter = c;
    return f;
}

static bt_filter *gen_ts_range(run *r) {
    bt_filter *f =
        bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_TIMESTAMP_RANGE_FILTER);
    Google__Bigtable__V2__TimestampRange *t = st_arena_alloc(&r->a, sizeof *t);
    google__bigtable__v2__timestamp_range__init(t);
    int64_t a = rnd_ts(r), b = rnd_ts(r);
    t->start_timestamp_micros = a < b ? a : b;
    t->end_timestamp_micros = chance(r, 25) ? 0 : (a < b ? b : a);
    f->timestamp_range_filter = t;
    return f;
}

static bt_filter *gen_value_range(run *r) {
    bt_filter *f =
        bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_RANGE_FILTER);
    Google__Bigtable__V2__ValueRange *v = st_arena_alloc(&r->a, sizeof *v);
    google__bigtable__v2__value_range__init(v);
    st_slice lo = rnd_value(r), hi = rnd_value(r);
    if (st_slice_cmp(lo, hi) > 0) {
        st_slice t = lo;
        lo = hi;
        hi = t;
    }
    if (chance(r, 70)) {
        v->start_value_case =
            chance(r, 50) ? GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_CLOSED
                          : GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_OPEN;
        v->start_value_closed = (ProtobufCBinaryData){lo.len, (uint8_t *)lo.data};
    }
    if (chance(r, 70)) {
        v->end_value_case = chance(r, 50)
                                ? GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_CLOSED
                                : GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_OPEN;
        v->end_value_closed = (ProtobufCBinaryData){hi.len, (uint8_t *)hi.data};
    }
    f->value_range_filter = v;
    return f;
}

static bt_filter *gen_regex(run *r, fcase kind, const char *const *set, size_t n) {
    return bt_filter_bytes(&r->a, kind, st_slice_cstr(set[rnd(r, n)]));
}

/* A leaf filter allowed in context cx. */
static bt_filter *gen_leaf(run *r, fctx cx, fprops *p) {
    for (;;) {
        switch (rnd(r, 17)) {
        case 0:
            return bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_PASS_ALL_FILTER);
        case 1:
            p->one_fam = true;
            return bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_BLOCK_ALL_FILTER);
        case 2:
            return gen_regex(r, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER,
                             ROW_REGEX, NELEM(ROW_REGEX));
        case 3: {
            bt_filter *f =
                gen_regex(r, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER,
                          FAM_REGEX, NELEM(FAM_REGEX));
            p->one_fam = strcmp(f->family_name_regex_filter, "cf1") == 0 ||
                         strcmp(f->family_name_regex_filter, ".*3") == 0 ||
                         strcmp(f->family_name_regex_filter, "x") == 0;
            return f;
        }
        case 4:
            return gen_regex(r,
                             GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER,
                             QUAL_REGEX, NELEM(QUAL_REGEX));
        case 5:
            return gen_regex(r, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER,
                             VAL_REGEX, NELEM(VAL_REGEX));
        case 6:
            p->one_fam = true;
            return gen_column_range(r);
        case 7:
            return gen_ts_range(r);
        case 8:
            return gen_value_range(r);
        case 9:
            if (!cx.order_ok || !cx.one_fam)
                continue;
            return bt_filter_int(
                &r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_OFFSET_FILTER,
                (int32_t)rnd(r, 5));
        case 10:
            if (!cx.order_ok || !cx.one_fam)
                continue;
            return bt_filter_int(
                &r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_LIMIT_FILTER,
                1 + (int32_t)rnd(r, 4));
        case 11:
            if (!cx.order_ok)
                continue;
            return bt_filter_int(
                &r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER,
                1 + (int32_t)rnd(r, 3));
        case 12:
            if (!cx.strip_ok)
                continue;
            return bt_filter_new(&r->a,
                                 GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_STRIP_VALUE_TRANSFORMER);
        case 13:
        case 14:
            if (!cx.label_ok)
                continue;
            p->may_label = true;
            return bt_filter_bytes(&r->a,
                                   GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER,
                                   st_slice_cstr(LABELS[rnd(r, NELEM(LABELS))]));
        default:
            if (cx.in_cond || !SINK_ENABLED)
                continue;
            p->may_dup = true;
            return bt_filter_new(&r->a, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_SINK);
        }
    }
}

static bt_filter *gen_any(run *r, int depth, fctx cx, fprops *p) {
    if (depth < DIFF_FILTER_DEPTH_MAX) {
        unsigned k = (unsigned)rnd(r, 100);
        if (k < 18)
            return gen_list(r, depth, cx, p, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN);
        if (k < 30)
            return gen_list(r, depth, cx, p, GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_INTERLEAVE);
        if (k < 38)
            return gen_condition(r, depth, cx, p);
    }
    return gen_leaf(r, cx, p);
}

static bt_filter *gen_filter(run *r, int depth, fctx cx, fprops *p) {
    bt_filter *f = gen_any(r, depth, cx, p);
    p->one_fam |= cx.one_fam; /* no filter adds families to its input */
    return f;
}

static void desc_range_bound(run *r, const char *what, bool set, bool closed,
                             ProtobufCBinaryData b) {
    if (!set)
        return;
    descf(r, " %s%s=", what, closed ? "_closed" : "_open");
    desc_bytes(r, st_slice_make(b.data, b.len));
}

static void desc_filter(run *r, const bt_filter *f) {
    if (!f) {
        descf(r, "(none)");
        return;
    }
    switch (f->filter_case) {
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_INTERLEAVE: {
        bool ch = f->filter_case == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
        const Google__Bigtable__V2__RowFilter__Chain *c =
            ch ? f->chain : (const void *)f->interleave;
        descf(r, "%s(", ch ? "chain" : "interleave");
        for (size_t i = 0; i < c->n_filters; i++) {
            if (i)
                descf(r, ", ");
            desc_filter(r, c->filters[i]);
        }
        descf(r, ")");
        return;
    }
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CONDITION:
        descf(r, "condition(pred=");
        desc_filter(r, f->condition->predicate_filter);
        descf(r, ", true=");
        desc_filter(r, f->condition->true_filter);
        descf(r, ", false=");
        desc_filter(r, f->condition->false_filter);
        descf(r, ")");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_SINK:
        descf(r, "sink");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_PASS_ALL_FILTER:
        descf(r, "pass_all");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_BLOCK_ALL_FILTER:
        descf(r, "block_all");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER:
        descf(r, "%s_regex(",
              f->filter_case == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER
                  ? "row"
              : f->filter_case == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER
                  ? "value"
                  : "qualifier");
        desc_bytes(r, st_slice_make(f->row_key_regex_filter.data, f->row_key_regex_filter.len));
        descf(r, ")");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER:
        descf(r, "family_regex(");
        desc_bytes(r, st_slice_cstr(f->family_name_regex_filter));
        descf(r, ")");
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER:
        descf(r, "label(%s)", f->apply_label_transformer);
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_RANGE_FILTER: {
        const Google__Bigtable__V2__ColumnRange *c = f->column_range_filter;
        descf(r, "column_range(%s", c->family_name);
        desc_range_bound(
            r, "start", c->start_qualifier_case != 0,
            c->start_qualifier_case ==
                GOOGLE__BIGTABLE__V2__COLUMN_RANGE__START_QUALIFIER_START_QUALIFIER_CLOSED,
            c->start_qualifier_closed);
        desc_range_bound(r, "end", c->end_qualifier_case != 0,
                         c->end_qualifier_case ==
                             GOOGLE__BIGTABLE__V2__COLUMN_RANGE__END_QUALIFIER_END_QUALIFIER_CLOSED,
                         c->end_qualifier_closed);
        descf(r, ")");
        return;
    }
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_TIMESTAMP_RANGE_FILTER:
        descf(r, "ts_range[%" PRId64 ", %" PRId64 ")",
              f->timestamp_range_filter->start_timestamp_micros,
              f->timestamp_range_filter->end_timestamp_micros);
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_RANGE_FILTER: {
        const Google__Bigtable__V2__ValueRange *v = f->value_range_filter;
        descf(r, "value_range(");
        desc_range_bound(r, "start", v->start_value_case != 0,
                         v->start_value_case ==
                             GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_CLOSED,
                         v->start_value_closed);
        desc_range_bound(r, "end", v->end_value_case != 0,
                         v->end_value_case ==
                             GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_CLOSED,
                         v->end_value_closed);
        descf(r, " )");
        return;
    }
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_OFFSET_FILTER:
        descf(r, "row_offset(%d)", f->cells_per_row_offset_filter);
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_LIMIT_FILTER:
        descf(r, "row_limit(%d)", f->cells_per_row_limit_filter);
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER:
        descf(r, "column_limit(%d)", f->cells_per_column_limit_filter);
        return;
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_STRIP_VALUE_TRANSFORMER:
        descf(r, "strip_value");
        return;
    default:
        descf(r, "filter#%d", (int)f->filter_case);
        return;
    }
}

/* ---- mutations ---- */

static void gen_muts(run *r, bt_muts *m, size_t n_max) {
    size_t n = 1 + rnd(r, n_max);
    for (size_t i = 0; i < n; i++) {
        unsigned k = (unsigned)rnd(r, 100);
        if (k < 60) {
            bt_muts_set(m, rnd_fam(r), rnd_qual(r), rnd_ts(r), rnd_value(r));
        } else if (k < 80) {
            int64_t a = rnd_ts(r), b = rnd_ts(r), lo = a < b ? a : b, hi = a < b ? b : a;
            if (chance(r, 30))
                bt_muts_del_column(m, rnd_fam(r), rnd_qual(r), 0, 0);
            else if (chance(r, 25) || lo == hi)
                bt_muts_del_column(m, rnd_fam(r), rnd_qual(r), lo, 0);
            else
                bt_muts_del_column(m, rnd_fam(r), rnd_qual(r), lo, hi);
        } else if (k < 92) {
            bt_muts_del_family(m, rnd_fam(r));
        } else {
            bt_muts_del_row(m);
        }
    }
}

static void desc_muts(run *r, const bt_muts *m) {
    descf(r, "[");
    for (size_t i = 0; m && i < m->n; i++) {
        const bt_mutation *x = m->v[i];
        if (i)
            descf(r, "; ");
        switch (x->mutation_case) {
        case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL:
            descf(r, "set %s:", x->set_cell->family_name);
            desc_bytes(r, st_slice_make(x->set_cell->column_qualifier.data,
                                        x->set_cell->column_qualifier.len));
            descf(r, "@%" PRId64 "=", x->set_cell->timestamp_micros);
            desc_bytes(r, st_slice_make(x->set_cell->value.data, x->set_cell->value.len));
            break;
        case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN: {
            const Google__Bigtable__V2__Mutation__DeleteFromColumn *d = x->delete_from_column;
            descf(r, "delcol %s:", d->family_name);
            desc_bytes(r, st_slice_make(d->column_qualifier.data, d->column_qualifier.len));
            if (d->time_range)
                descf(r, "[%" PRId64 ",%" PRId64 ")", d->time_range->start_timestamp_micros,
                      d->time_range->end_timestamp_micros);
            break;
        }
        case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY:
            descf(r, "delfam %s", x->delete_from_family->family_name);
            break;
        case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW:
            descf(r, "delrow");
            break;
        default:
            descf(r, "mutation#%d", (int)x->mutation_case);
            break;
        }
    }
    descf(r, "]");
}

/* ---- operations ---- */

static void op_mutate_row(run *r) {
    bt_muts m;
    bt_muts_init(&m);
    st_slice row = rnd_key(r);
    gen_muts(r, &m, 4);
    descf(r, "MutateRow row=");
    desc_bytes(r, row);
    descf(r, " ");
    desc_muts(r, &m);
    for (int i = 0; i < 2; i++)
        out_code(&r->out[i], bt_mutate_row(&r->s[i].c, "t", row, &m, NULL));
    compare(r, "MutateRow status");
    bt_muts_deinit(&m);
}

#define BATCH_MAX 5
static void op_mutate_rows(run *r) {
    bt_muts m[BATCH_MAX];
    bt_entry e[BATCH_MAX];
    size_t n = 1 + rnd(r, BATCH_MAX);
    size_t first = rnd(r, N_KEYS);
    descf(r, "MutateRows");
    for (size_t i = 0; i < n; i++) {
        bt_muts_init(&m[i]);
        gen_muts(r, &m[i], 3);
        /* Distinct rows: entries of one batch apply in an unspecified order. */
        e[i] = (bt_entry){key_at((first + i * 3) % N_KEYS), &m[i]};
        descf(r, " {row=");
        desc_bytes(r, e[i].row);
        descf(r, " ");
        desc_muts(r, &m[i]);
        descf(r, "}");
    }
    for (int s = 0; s < 2; s++) {
        st_code codes[BATCH_MAX];
        out_code(&r->out[s], bt_mutate_rows(&r->s[s].c, "t", e, n, codes, NULL, NULL));
        for (size_t i = 0; i < n; i++)
            outf(&r->out[s], "entry %zu %s\n", i, st_code_name(codes[i]));
    }
    compare(r, "MutateRows statuses");
    for (size_t i = 0; i < n; i++)
        bt_muts_deinit(&m[i]);
}

static void op_check_and_mutate(run *r) {
    bt_muts t, f;
    bt_muts_init(&t);
    bt_muts_init(&f);
    st_slice row = rnd_key(r);
    bt_filter *pred = NULL;
    if (chance(r, 85)) {
        fctx cx = {.in_cond = true, .label_ok = true, .order_ok = true, .strip_ok = true};
        fprops p = {0};
        pred = gen_filter(r, 0, cx, &p);
    }
    bool on_true = chance(r, 75), on_false = !on_true || chance(r, 60);
    if (on_true)
        gen_muts(r, &t, 3);
    if (on_false)
        gen_muts(r, &f, 3);
    descf(r, "CheckAndMutateRow row=");
    desc_bytes(r, row);
    descf(r, " predicate=");
    desc_filter(r, pred);
    descf(r, " true=");
    desc_muts(r, &t);
    descf(r, " false=");
    desc_muts(r, &f);
    for (int s = 0; s < 2; s++) {
        bool matched = false;
        st_code rc = bt_check_and_mutate(&r->s[s].c, "t", row, pred, &t, &f, &matched, NULL);
        out_code(&r->out[s], rc);
        if (rc == ST_OK)
            outf(&r->out[s], "matched %d\n", matched);
    }
    compare(r, "CheckAndMutateRow");
    bt_muts_deinit(&t);
    bt_muts_deinit(&f);
}

static uint8_t hexval(uint8_t c) {
    return (uint8_t)(c <= '9' ? c - '0' : c - 'a' + 10);
}

/* RMW cells carry server timestamps, which differ between the servers. Once the answers agree,
 * each written cell is moved to the same explicit timestamp on both sides (delete the server-
 * time cells, write the returned value), so later reads compare exactly. */
static void rmw_normalize(run *r, st_slice row, const st_buf *dump) {
    bt_muts m;
    bt_muts_init(&m);
    const char *p = (const char *)dump->data, *end = p + dump->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        char fam[16] = "", qual[16] = "";
        const char *f1 = memchr(p, '\t', (size_t)(nl - p));
        const char *f2 = memchr(f1 + 1, '\t', (size_t)(nl - f1 - 1));
        const char *f3 = memchr(f2 + 1, '\t', (size_t)(nl - f2 - 1));
        const char *hex = nl;
        while (hex[-1] != '\t')
            hex--;
        snprintf(fam, sizeof fam, "%.*s", (int)(f2 - f1 - 1), f1 + 1);
        snprintf(qual, sizeof qual, "%.*s", (int)(f3 - f2 - 1), f2 + 1);
        size_t vlen = (size_t)(nl - hex) / 2;
        uint8_t *v = st_arena_alloc(&r->a, vlen + 1);
        for (size_t i = 0; i < vlen; i++)
            v[i] = (uint8_t)(hexval((uint8_t)hex[2 * i]) << 4 | hexval((uint8_t)hex[2 * i + 1]));
        bt_muts_del_column(&m, fam, st_slice_cstr(qual), DIFF_SERVER_TS_MIN, 0);
        bt_muts_set(&m, fam, st_slice_cstr(qual), rnd_ts(r), st_slice_make(v, vlen));
        p = nl + 1;
    }
    r->out[0].len = r->out[1].len = 0;
    for (int s = 0; s < 2 && m.n; s++)
        out_code(&r->out[s], bt_mutate_row(&r->s[s].c, "t", row, &m, NULL));
    bt_muts_deinit(&m);
}

static void op_rmw(run *r) {
    bt_rmw_rule rules[2];
    size_t n = 1 + rnd(r, 2);
    st_slice row = rnd_key(r);
    descf(r, "ReadModifyWriteRow row=");
    desc_bytes(r, row);
    for (size_t i = 0; i < n; i++) {
        memset(&rules[i], 0, sizeof rules[i]);
        rules[i].family = rnd_fam(r);
        if (chance(r, 50)) {
            rules[i].qualifier = st_slice_cstr("n");
            rules[i].increment = (int64_t)rnd(r, 11) - 5;
            descf(r, " inc %s:n %+" PRId64, rules[i].family, rules[i].increment);
        } else {
            rules[i].append = true;
            rules[i].qualifier = rnd_qual(r);
            rules[i].value = rnd_value(r);
            descf(r, " append %s:", rules[i].family);
            desc_bytes(r, rules[i].qualifier);
            descf(r, "+=");
            desc_bytes(r, rules[i].value);
        }
    }
    st_buf rows[2];
    for (int s = 0; s < 2; s++) {
        st_buf_init(&rows[s]);
        st_code rc = bt_read_modify_write(&r->s[s].c, "t", row, rules, n, &rows[s], false, NULL);
        out_code(&r->out[s], rc);
        st_buf_append(&r->out[s], rows[s].data, rows[s].len);
    }
    if (compare(r, "ReadModifyWriteRow answer (values; timestamps are server-assigned)") &&
        rows[0].len) {
        descf(r, " -> normalising MutateRow");
        rmw_normalize(r, row, &rows[0]);
        compare(r, "normalising MutateRow after ReadModifyWriteRow");
    }
    st_buf_free(&rows[0]);
    st_buf_free(&rows[1]);
}

static Google__Bigtable__V2__RowSet *gen_rowset(run *r) {
    Google__Bigtable__V2__RowSet *s = bt_rowset_new(&r->a);
    size_t nk = rnd(r, 4), nr = rnd(r, 3);
    if (nk + nr == 0)
        nk = 1;
    for (size_t i = 0; i < nk; i++)
        bt_rowset_add_key(&r->a, s, rnd_any_key(r));
    for (size_t i = 0; i < nr; i++) {
        st_slice lo = rnd_any_key(r), hi = rnd_any_key(r);
        int c = st_slice_cmp(lo, hi);
        if (c > 0) {
            st_slice t = lo;
            lo = hi;
            hi = t;
        }
        bool has_lo = chance(r, 80) && lo.len, has_hi = chance(r, 80) && hi.len;
        bool lo_closed = chance(r, 50), hi_closed = chance(r, 50);
        if (has_lo && has_hi && c == 0)
            lo_closed = hi_closed = true; /* [k, k]: a single row, valid in Cloud Bigtable */
        bt_rowset_add_range(&r->a, s, has_lo ? &lo : NULL, lo_closed, has_hi ? &hi : NULL,
                            hi_closed);
    }
    return s;
}

static void desc_rowset(run *r, const Google__Bigtable__V2__RowSet *s) {
    if (!s) {
        descf(r, "all");
        return;
    }
    descf(r, "{keys:");
    for (size_t i = 0; i < s->n_row_keys; i++) {
        descf(r, " ");
        desc_bytes(r, st_slice_make(s->row_keys[i].data, s->row_keys[i].len));
    }
    descf(r, " ranges:");
    for (size_t i = 0; i < s->n_row_ranges; i++) {
        const Google__Bigtable__V2__RowRange *g = s->row_ranges[i];
        descf(r, " %c",
              g->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED ? '['
              : g->start_key_case                                                              ? '('
                                  : '<');
        if (g->start_key_case)
            desc_bytes(r, st_slice_make(g->start_key_closed.data, g->start_key_closed.len));
        descf(r, ",");
        if (g->end_key_case)
            desc_bytes(r, st_slice_make(g->end_key_open.data, g->end_key_open.len));
        descf(r, "%c",
              g->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED ? ']'
              : g->end_key_case                                                          ? ')'
                                                                                         : '>');
    }
    descf(r, "}");
}

static void read_both(run *r, const bt_read_req *req, const char *what) {
    for (int s = 0; s < 2; s++) {
        st_buf dump;
        st_buf_init(&dump);
        st_code rc = bt_read_dump(&r->s[s].c, "t", req, &dump, NULL, NULL);
        out_code(&r->out[s], rc);
        if (rc == ST_OK)
            st_buf_append(&r->out[s], dump.data, dump.len);
        st_buf_free(&dump);
    }
    compare(r, what);
}

static void op_read(run *r) {
    bt_read_req req = {0};
    if (chance(r, 60))
        req.rows = gen_rowset(r);
    if (chance(r, 70)) {
        fctx cx = {.in_cond = false, .label_ok = true, .order_ok = true, .strip_ok = true};
        fprops p = {0};
        req.filter = gen_filter(r, 0, cx, &p);
    }
    if (chance(r, 30))
        req.rows_limit = 1 + (int64_t)rnd(r, 4);
    req.reversed = REVERSE_ENABLED && chance(r, 25);
    descf(r, "ReadRows rows=");
    desc_rowset(r, req.rows);
    descf(r, " filter=");
    desc_filter(r, req.filter);
    descf(r, " rows_limit=%" PRId64 " reversed=%d", req.rows_limit, req.reversed);
    read_both(r, &req, "ReadRows answer");
}

static void op_full_scan(run *r) {
    bt_read_req req = {0};
    descf(r, "ReadRows (whole table, no filter)");
    read_both(r, &req, "whole table");
}

/* ---- invalid requests: status codes ----
 * `want` is Cloud Bigtable's documented answer (docs/bigtable.md); strata-node must give
 * it. The emulator must give the same code unless `emulator_differs` names the documented reason
 * (then its answer is printed but not compared; see docs/testing.md). */
typedef struct err_case {
    const char *name;
    st_code want;
    const char *emulator_differs; /* NULL = compared */
    st_code (*fn)(run *r, const bt_client *c);
} err_case;

static st_code read_with(const bt_client *c, const char *table, const bt_read_req *req) {
    st_buf dump;
    st_buf_init(&dump);
    st_code rc = bt_read_dump(c, table, req, &dump, NULL, NULL);
    st_buf_free(&dump);
    return rc;
}

static st_code read_filter(run *r, const bt_client *c, bt_filter *f) {
    (void)r;
    bt_read_req req = {.filter = f};
    return read_with(c, "t", &req);
}

static bt_filter *leaf(run *r, fcase k) {
    return bt_filter_new(&r->a, k);
}

#define FC(x) GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_##x

static st_code e_bad_row_regex(run *r, const bt_client *c) {
    return read_filter(r, c, bt_filter_bytes(&r->a, FC(ROW_KEY_REGEX_FILTER), st_slice_cstr("(")));
}
static st_code e_empty_row_regex(run *r, const bt_client *c) {
    return read_filter(r, c, bt_filter_bytes(&r->a, FC(ROW_KEY_REGEX_FILTER), st_slice_cstr("")));
}
static st_code e_bad_value_regex(run *r, const bt_client *c) {
    return read_filter(r, c,
                       bt_filter_bytes(&r->a, FC(VALUE_REGEX_FILTER), st_slice_cstr("[z-a]")));
}
static st_code e_family_regex_colon(run *r, const bt_client *c) {
    return read_filter(
        r, c, bt_filter_bytes(&r->a, FC(FAMILY_NAME_REGEX_FILTER), st_slice_cstr("cf1:a")));
}
static st_code e_chain_of_one(run *r, const bt_client *c) {
    bt_filter *one = leaf(r, FC(PASS_ALL_FILTER));
    return read_filter(r, c, bt_filter_list(&r->a, FC(CHAIN), &one, 1));
}
static st_code e_interleave_of_one(run *r, const bt_client *c) {
    bt_filter *one = leaf(r, FC(PASS_ALL_FILTER));
    return read_filter(r, c, bt_filter_list(&r->a, FC(INTERLEAVE), &one, 1));
}
static st_code e_pass_all_false(run *r, const bt_client *c) {
    bt_filter *f = leaf(r, FC(PASS_ALL_FILTER));
    f->pass_all_filter = 0;
    return read_filter(r, c, f);
}
static st_code e_bad_label(run *r, const bt_client *c) {
    return read_filter(r, c,
                       bt_filter_bytes(&r->a, FC(APPLY_LABEL_TRANSFORMER), st_slice_cstr("BAD!")));
}
static st_code e_two_labels_in_chain(run *r, const bt_client *c) {
    bt_filter *two[2] = {bt_filter_bytes(&r->a, FC(APPLY_LABEL_TRANSFORMER), st_slice_cstr("la")),
                         bt_filter_bytes(&r->a, FC(APPLY_LABEL_TRANSFORMER), st_slice_cstr("lb"))};
    return read_filter(r, c, bt_filter_list(&r->a, FC(CHAIN), two, 2));
}
static st_code e_sink_in_condition(run *r, const bt_client *c) {
    bt_filter *f = bt_filter_new(&r->a, FC(CONDITION));
    f->condition = st_arena_alloc(&r->a, sizeof *f->condition);
    google__bigtable__v2__row_filter__condition__init(f->condition);
    f->condition->predicate_filter = leaf(r, FC(PASS_ALL_FILTER));
    f->condition->true_filter = leaf(r, FC(SINK));
    return read_filter(r, c, f);
}
static st_code e_range_start_after_end(run *r, const bt_client *c) {
    Google__Bigtable__V2__RowSet *s = bt_rowset_new(&r->a);
    st_slice lo = st_slice_cstr("d"), hi = st_slice_cstr("b");
    bt_rowset_add_range(&r->a, s, &lo, true, &hi, false);
    bt_read_req req = {.rows = s};
    return read_with(c, "t", &req);
}
static st_code e_read_unknown_table(run *r, const bt_client *c) {
    (void)r;
    bt_read_req req = {0};
    return read_with(c, "no-such-table", &req);
}
static st_code e_reverse_without_feature(run *r, const bt_client *c) {
    (void)r;
    bt_read_req req = {.reversed = true, .no_reverse_feature = true};
    return read_with(c, "t", &req);
}
static st_code mutate1(const bt_client *c, const char *table, st_slice row, const char *fam,
                       int64_t ts) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, fam, st_slice_cstr("q"), ts, st_slice_cstr("v"));
    st_code rc = bt_mutate_row(c, table, row, &m, NULL);
    bt_muts_deinit(&m);
    return rc;
}
static st_code e_unknown_family(run *r, const bt_client *c) {
    (void)r;
    return mutate1(c, "t", st_slice_cstr("a"), "nofam", 1000);
}
static st_code e_unknown_table_write(run *r, const bt_client *c) {
    (void)r;
    return mutate1(c, "no-such-table", st_slice_cstr("a"), "cf1", 1000);
}
static st_code e_empty_row_key(run *r, const bt_client *c) {
    (void)r;
    return mutate1(c, "t", st_slice_cstr(""), "cf1", 1000);
}
static st_code e_row_key_too_long(run *r, const bt_client *c) {
    (void)r;
    char *k = calloc(1, 4097);
    memset(k, 'a', 4097);
    st_code rc = mutate1(c, "t", st_slice_make(k, 4097), "cf1", 1000);
    free(k);
    return rc;
}
static st_code e_ts_not_millis(run *r, const bt_client *c) {
    (void)r;
    return mutate1(c, "t", st_slice_cstr("a"), "cf1", 1500);
}
static st_code e_no_mutations(run *r, const bt_client *c) {
    (void)r;
    bt_muts m;
    bt_muts_init(&m);
    st_code rc = bt_mutate_row(c, "t", st_slice_cstr("a"), &m, NULL);
    bt_muts_deinit(&m);
    return rc;
}
static st_code too_many(const bt_client *c, bool batch) {
    bt_muts m;
    bt_muts_init(&m);
    for (int i = 0; i < (batch ? 50001 : 100001); i++)
        bt_muts_set(&m, "cf1", st_slice_cstr("q"), 1000, st_slice_cstr("v"));
    st_code rc;
    if (batch) {
        bt_entry e[2] = {{st_slice_cstr("a"), &m}, {st_slice_cstr("b"), &m}};
        st_code codes[2];
        rc = bt_mutate_rows(c, "t", e, 2, codes, NULL, NULL);
    } else {
        rc = bt_mutate_row(c, "t", st_slice_cstr("a"), &m, NULL);
    }
    bt_muts_deinit(&m);
    return rc;
}
static st_code e_too_many_mutations(run *r, const bt_client *c) {
    (void)r;
    return too_many(c, false);
}
static st_code e_too_many_mutations_batch(run *r, const bt_client *c) {
    (void)r;
    return too_many(c, true);
}
static st_code e_delete_range_reversed(run *r, const bt_client *c) {
    (void)r;
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_del_column(&m, "cf1", st_slice_cstr("q"), 5000, 2000);
    st_code rc = bt_mutate_row(c, "t", st_slice_cstr("a"), &m, NULL);
    bt_muts_deinit(&m);
    return rc;
}
static st_code e_check_and_mutate_nothing(run *r, const bt_client *c) {
    (void)r;
    bool matched;
    return bt_check_and_mutate(c, "t", st_slice_cstr("a"), NULL, NULL, NULL, &matched, NULL);
}
static st_code e_increment_non_counter(run *r, const bt_client *c) {
    (void)r;
    if (mutate1(c, "t", st_slice_cstr("zz-err"), "cf1", 1000) != ST_OK)
        return ST_INTERNAL;
    bt_rmw_rule rule = {.family = "cf1", .qualifier = st_slice_cstr("q"), .increment = 1};
    st_code rc = bt_read_modify_write(c, "t", st_slice_cstr("zz-err"), &rule, 1, NULL, false, NULL);
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_del_row(&m);
    bt_mutate_row(c, "t", st_slice_cstr("zz-err"), &m, NULL);
    bt_muts_deinit(&m);
    return rc;
}

static const err_case ERR_CASES[] = {
    {"ReadRows row_key_regex \"(\"", ST_INVALID_ARGUMENT, NULL, e_bad_row_regex},
    {"ReadRows empty row_key_regex", ST_INVALID_ARGUMENT, NULL, e_empty_row_regex},
    {"ReadRows value_regex \"[z-a]\"", ST_INVALID_ARGUMENT, NULL, e_bad_value_regex},
    {"ReadRows family_name_regex with ':'", ST_INVALID_ARGUMENT,
     "the emulator compiles ':' in family_name_regex_filter", e_family_regex_colon},
    {"ReadRows Chain of one filter", ST_INVALID_ARGUMENT, NULL, e_chain_of_one},
    {"ReadRows Interleave of one filter", ST_INVALID_ARGUMENT, NULL, e_interleave_of_one},
    {"ReadRows pass_all_filter=false", ST_INVALID_ARGUMENT, NULL, e_pass_all_false},
    {"ReadRows apply_label \"BAD!\"", ST_INVALID_ARGUMENT, NULL, e_bad_label},
    {"ReadRows two labels in one Chain", ST_INVALID_ARGUMENT,
     "the emulator does not enforce one label per Chain", e_two_labels_in_chain},
    {"ReadRows sink inside Condition", ST_INVALID_ARGUMENT, "the emulator does not implement sink",
     e_sink_in_condition},
    {"ReadRows range start > end", ST_INVALID_ARGUMENT, NULL, e_range_start_after_end},
    {"ReadRows unknown table", ST_NOT_FOUND, NULL, e_read_unknown_table},
    {"ReadRows reversed without reverse_scans feature", ST_UNIMPLEMENTED, NULL,
     e_reverse_without_feature},
    {"MutateRow unknown family", ST_NOT_FOUND, "the emulator answers UNKNOWN (a plain Go error)",
     e_unknown_family},
    {"MutateRow unknown table", ST_NOT_FOUND, NULL, e_unknown_table_write},
    {"MutateRow empty row key", ST_INVALID_ARGUMENT, NULL, e_empty_row_key},
    {"MutateRow 4097-byte row key", ST_INVALID_ARGUMENT,
     "the emulator does not enforce the 4 KiB row key limit", e_row_key_too_long},
    {"MutateRow timestamp 1500 on a millisecond table", ST_INVALID_ARGUMENT,
     "the emulator answers UNKNOWN (a plain Go error)", e_ts_not_millis},
    {"MutateRow no mutations", ST_INVALID_ARGUMENT, NULL, e_no_mutations},
    {"MutateRow 100001 mutations", ST_INVALID_ARGUMENT,
     "the emulator does not enforce the 100,000 mutation limit", e_too_many_mutations},
    {"MutateRows 2 x 50001 mutations", ST_INVALID_ARGUMENT,
     "the emulator does not enforce the 100,000 mutation limit", e_too_many_mutations_batch},
    {"DeleteFromColumn range start > end", ST_INVALID_ARGUMENT,
     "the emulator answers UNKNOWN (a plain Go error)", e_delete_range_reversed},
    {"CheckAndMutateRow with no mutations", ST_INVALID_ARGUMENT,
     "the emulator accepts it (docs/bigtable.md, filter rule 6)", e_check_and_mutate_nothing},
    {"ReadModifyWriteRow increment of a 1-byte value", ST_FAILED_PRECONDITION,
     "the emulator answers UNKNOWN (a plain Go error)", e_increment_non_counter},
};

static void run_error_cases(run *r) {
    for (size_t i = 0; i < NELEM(ERR_CASES); i++) {
        const err_case *e = &ERR_CASES[i];
        begin_op(r);
        descf(r, "invalid request: %s (Cloud Bigtable: %s)", e->name, st_code_name(e->want));
        st_code got[2];
        for (int s = 0; s < 2; s++) {
            got[s] = e->fn(r, &r->s[s].c);
            out_code(&r->out[s], got[s]);
        }
        if (got[0] != e->want) {
            report(r, "strata-node's status differs from Cloud Bigtable's");
            continue;
        }
        if (e->emulator_differs && got[1] != got[0]) {
            r->excluded++;
            fprintf(stderr, "excluded (emulator differs: %s): %s: emulator says %s\n",
                    e->emulator_differs, e->name, st_code_name(got[1]));
            continue;
        }
        compare(r, "status code");
    }
}

/* ---- driver ---- */

static void run_random_ops(run *r, int n_ops) {
    for (int i = 0; i < n_ops && r->failed < DIFF_FAILURES_MAX; i++) {
        begin_op(r);
        unsigned k = (unsigned)rnd(r, 100);
        if (k < 28)
            op_mutate_row(r);
        else if (k < 36)
            op_mutate_rows(r);
        else if (k < 45)
            op_check_and_mutate(r);
        else if (k < 52)
            op_rmw(r);
        else if (k < 96)
            op_read(r);
        else
            op_full_scan(r);
    }
    if (r->failed < DIFF_FAILURES_MAX) {
        begin_op(r);
        op_full_scan(r);
    }
}

static int start_servers(run *r, const char *node_bin, const char *emu_bin, const char *dir,
                         bt_proc *node, bt_proc *emu) {
    char data[BT_PATH_MAX];
    snprintf(data, sizeof data, "%.*s/node", BT_PATH_MAX - 8, dir);
    st_err err = {0};
    if (bt_node_start(node, node_bin, data, &err) != ST_OK) {
        fprintf(stderr, "diff_emulator_test: starting strata-node: %s\n", err.msg);
        return 1;
    }
    if (bt_emulator_start(emu, emu_bin, dir, &err) != ST_OK) {
        fprintf(stderr, "diff_emulator_test: starting the emulator: %s\n", err.msg);
        return 1;
    }
    r->s[0].name = "strata-node";
    r->s[1].name = "emulator";
    bt_client_init(&r->s[0].c, node->addr);
    bt_client_init(&r->s[1].c, emu->addr);
    /* Families one at a time, in name order: the emulator orders a row's families by creation
     * when counting cells for offset/limit filters, and CreateTable's family map would give it a
     * random creation order. No GC rules, so GC timing (lazy in both) cannot show in reads. */
    for (int s = 0; s < 2; s++) {
        st_err st;
        st_code rc = bt_create_table(&r->s[s].c, "t", NULL, &st);
        for (int f = 0; f < N_FAMS && rc == ST_OK; f++)
            rc = bt_create_family(&r->s[s].c, "t", FAMS[f], NULL, &st);
        if (rc != ST_OK) {
            fprintf(stderr, "diff_emulator_test: creating the table on %s: %s\n", r->s[s].name,
                    st.msg);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/strata-node\n", argv[0]);
        return 2;
    }
    const char *emu_bin = bt_emulator_path();
    if (access(emu_bin, X_OK) != 0) {
        printf("diff_emulator_test: emulator not installed at %s: skipping\n", emu_bin);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    run r;
    memset(&r, 0, sizeof r);
    r.seed = st_test_seed("diff_emulator_test");
    st_rng_seed(&r.rng, r.seed);
    st_arena_init(&r.a, 4096);
    st_buf_init(&r.desc);
    st_buf_init(&r.out[0]);
    st_buf_init(&r.out[1]);
    const char *ops_env = getenv("STRATA_DIFF_OPS");
    int n_ops = ops_env && *ops_env ? atoi(ops_env) : DIFF_OPS_DEFAULT;
    char dir[BT_PATH_MAX];
    bt_tmpdir(dir, sizeof dir, "diff_emulator");
    bt_proc node = {0}, emu = {0};
    int rc = start_servers(&r, argv[1], emu_bin, dir, &node, &emu);
    if (rc == 0) {
        /* Random operations first: the emulator checks filters per row, so its answers to
         * invalid filters only show on a table that has rows. */
        run_random_ops(&r, n_ops);
        run_error_cases(&r);
        printf("diff_emulator_test: seed %" PRIu64 ", %d operations: %d passed, %d failed, "
               "%d excluded\n",
               r.seed, r.op, r.passed, r.failed, r.excluded);
        rc = r.failed ? 1 : 0;
    }
    bt_proc_stop(&node, SIGTERM, NULL);
    bt_proc_stop(&emu, SIGTERM, NULL);
    if (!getenv("STRATA_KEEP_TMP"))
        bt_rmrf(dir);
    st_arena_deinit(&r.a);
    st_buf_free(&r.desc);
    st_buf_free(&r.out[0]);
    st_buf_free(&r.out[1]);
    return rc;
}
