/* node/regex_cost.c — compile work of a regex, estimated from its text (see regex_cost.h).
 *
 * One pass over the pattern with a stack of open groups. Each group keeps the weight of what it
 * holds so far and of its last atom, which a following repetition multiplies; a closed group is
 * one atom of its parent. Alternation adds its branches (RE2 compiles every one). */
#include "regex_cost.h"

#include <stdbool.h>

typedef struct cost_group {
    uint64_t sum;  /* expanded weight of the group so far */
    uint64_t last; /* weight of its last atom: what a repetition applies to */
} cost_group;

typedef struct cost_scan {
    const uint8_t *p;
    size_t len, i;
    uint64_t parse; /* Unicode class escapes' parse work */
    size_t depth;
    cost_group groups[NODE_REGEX_COST_DEPTH_MAX + 1];
} cost_scan;

static uint64_t sat_add(uint64_t a, uint64_t b) {
    return a + b > NODE_REGEX_COST_MAX ? NODE_REGEX_COST_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b) {
    if (a != 0 && b > NODE_REGEX_COST_MAX / a)
        return NODE_REGEX_COST_MAX;
    return a * b > NODE_REGEX_COST_MAX ? NODE_REGEX_COST_MAX : a * b;
}

static void atom(cost_scan *s, uint64_t w) {
    cost_group *g = &s->groups[s->depth];
    g->sum = sat_add(g->sum, w);
    g->last = w;
}

/* The last atom, compiled n times instead of once. */
static void repeat(cost_scan *s, uint64_t n) {
    cost_group *g = &s->groups[s->depth];
    if (n <= 1)
        return;
    g->sum = sat_add(g->sum, sat_mul(g->last, n - 1));
    g->last = sat_mul(g->last, n);
}

static bool at(const cost_scan *s, size_t i, uint8_t c) {
    return i < s->len && s->p[i] == c;
}

/* Past a `{...}` argument starting at i (as in \p{Greek}, \x{41}), or past one byte. */
static size_t skip_arg(const cost_scan *s, size_t i) {
    if (!at(s, i, '{'))
        return i + 1;
    while (i < s->len && s->p[i] != '}')
        i++;
    return i + 1;
}

/* An escape at s->i (a backslash): its weight, and s->i moved past it. \p and \P are Unicode
 * classes; \Q...\E quotes literals. */
static uint64_t escape(cost_scan *s, bool *unicode) {
    size_t i = s->i + 1;
    *unicode = false;
    if (i >= s->len) {
        s->i = i;
        return 1;
    }
    uint8_t c = s->p[i];
    if (c == 'p' || c == 'P') {
        *unicode = true;
        s->i = skip_arg(s, i + 1);
        return NODE_REGEX_COST_UNICODE_COPY;
    }
    s->i = c == 'x' ? skip_arg(s, i + 1) : i + 1;
    return 1;
}

static void quoted(cost_scan *s) {
    s->i += 2; /* \Q */
    while (s->i < s->len && !(s->p[s->i] == '\\' && at(s, s->i + 1, 'E'))) {
        atom(s, 1);
        s->i++;
    }
    if (s->i < s->len)
        s->i += 2; /* \E */
}

/* A bracketed class at s->i: weighed by its bytes (at least its ranges, each compiled to an
 * instruction or more: [acegikmoqsuwy]{1000} is 13,000), and each Unicode class in it as one. */
static void bracket(cost_scan *s) {
    size_t start = s->i, unicode = 0;
    s->i++;
    if (at(s, s->i, '^'))
        s->i++;
    if (at(s, s->i, ']'))
        s->i++; /* a leading ']' is a literal */
    while (s->i < s->len && s->p[s->i] != ']') {
        if (s->p[s->i] == '[' && at(s, s->i + 1, ':')) {
            s->i += 2;
            while (s->i < s->len && !(s->p[s->i] == ':' && at(s, s->i + 1, ']')))
                s->i++;
            s->i += 2;
        } else if (s->p[s->i] == '\\') {
            bool u;
            escape(s, &u);
            unicode += u;
        } else {
            s->i++;
        }
    }
    s->i++; /* ] */
    uint64_t w = 1 + (s->i - start) + unicode * NODE_REGEX_COST_UNICODE_COPY;
    s->parse = sat_add(s->parse, unicode * NODE_REGEX_COST_UNICODE_PARSE);
    atom(s, w);
}

/* {n}, {n,} or {n,m} at s->i: true with the largest count in *n; false when the brace is a
 * literal, as RE2 reads it. Counts saturate (RE2 refuses past 1,000 anyway). */
static bool counted(cost_scan *s, uint64_t *n) {
    size_t i = s->i + 1;
    uint64_t lo = 0, hi = 0;
    bool digits = false, comma = false, hi_digits = false;
    for (; i < s->len && s->p[i] >= '0' && s->p[i] <= '9'; i++, digits = true)
        lo = lo > 1000000 ? lo : lo * 10 + (uint64_t)(s->p[i] - '0');
    if (at(s, i, ',')) {
        comma = true;
        for (i++; i < s->len && s->p[i] >= '0' && s->p[i] <= '9'; i++, hi_digits = true)
            hi = hi > 1000000 ? hi : hi * 10 + (uint64_t)(s->p[i] - '0');
    }
    if (!digits || !at(s, i, '}'))
        return false;
    *n = hi_digits ? hi : comma ? lo + 1 : lo;
    s->i = i + 1;
    return true;
}

/* One step of the scan at s->i; false when the pattern nests too deep to weigh. */
static bool step(cost_scan *s) {
    uint8_t c = s->p[s->i];
    uint64_t n;
    bool unicode;
    switch (c) {
    case '\\':
        if (at(s, s->i + 1, 'Q')) {
            quoted(s);
            return true;
        }
        atom(s, escape(s, &unicode));
        if (unicode)
            s->parse = sat_add(s->parse, NODE_REGEX_COST_UNICODE_PARSE);
        return true;
    case '[':
        bracket(s);
        return true;
    case '(':
        if (s->depth == NODE_REGEX_COST_DEPTH_MAX)
            return false;
        s->groups[++s->depth] = (cost_group){0, 0};
        break;
    case ')':
        if (s->depth == 0) {
            atom(s, 1);
            break;
        }
        n = s->groups[s->depth--].sum;
        atom(s, n);
        break;
    case '|':
        s->groups[s->depth].last = 0;
        break;
    case '{':
        if (counted(s, &n)) {
            repeat(s, n);
            return true;
        }
        atom(s, 1);
        break;
    case '.':
        atom(s, 2); /* [^\n]: two ranges */
        break;
    case '*':
    case '+':
    case '?':
        break; /* compiled once, as a loop */
    default:
        atom(s, 1);
        break;
    }
    s->i++;
    return true;
}

uint64_t node_regex_cost(const uint8_t *pattern, size_t len) {
    cost_scan s; /* groups above depth are set when opened */
    s.p = pattern;
    s.len = len;
    s.i = 0;
    s.parse = 0;
    s.depth = 0;
    s.groups[0] = (cost_group){0, 0};
    while (s.i < s.len)
        if (!step(&s))
            return NODE_REGEX_COST_MAX;
    uint64_t total = sat_add(NODE_REGEX_COST_BASE + len, s.parse);
    for (size_t d = 0; d <= s.depth; d++) /* unclosed groups: RE2 refuses them, still weigh */
        total = sat_add(total, s.groups[d].sum);
    return total;
}
