/* gc.c — per-family garbage-collection rules: an immutable, refcounted deep copy (so a snapshot
 * keeps the rules it started with while the node installs new ones) and the rule evaluation that
 * reads and compactions share. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rowread.h"

typedef struct gc_family {
    st_slice name; /* points into the set's arena */
    sto_gc_rule rule;
} gc_family;

struct sto_gc_set {
    atomic_int refs;
    gc_family *fams; /* sorted by name for binary search */
    size_t n;
    st_arena arena; /* names and rule trees */
};

/* Rejects what no valid rule contains: unknown kinds, negative limits, runaway nesting. */
static st_code gc_rule_check(const sto_gc_rule *r, int depth, size_t *nodes) {
    if (depth > STO_GC_DEPTH_MAX || ++*nodes > STO_GC_RULE_NODES_MAX)
        return ST_INVALID_ARGUMENT;
    switch (r->kind) {
    case STO_GC_NONE:
        return ST_OK;
    case STO_GC_MAX_VERSIONS:
        return r->max_versions >= 0 ? ST_OK : ST_INVALID_ARGUMENT;
    case STO_GC_MAX_AGE:
        return r->max_age_us >= 0 ? ST_OK : ST_INVALID_ARGUMENT;
    case STO_GC_UNION:
    case STO_GC_INTERSECTION:
        if (r->n_children && !r->children)
            return ST_INVALID_ARGUMENT;
        for (size_t i = 0; i < r->n_children; i++) {
            st_code rc = gc_rule_check(&r->children[i], depth + 1, nodes);
            if (rc != ST_OK)
                return rc;
        }
        return ST_OK;
    }
    return ST_INVALID_ARGUMENT;
}

/* Copies src's children (recursively) into the arena; dst already holds src's scalars. */
static st_code gc_rule_copy(st_arena *a, sto_gc_rule *dst, const sto_gc_rule *src) {
    *dst = *src;
    dst->children = NULL;
    if (src->kind != STO_GC_UNION && src->kind != STO_GC_INTERSECTION) {
        dst->n_children = 0;
        return ST_OK;
    }
    if (!src->n_children)
        return ST_OK;
    sto_gc_rule *kids = st_arena_alloc(a, src->n_children * sizeof *kids);
    if (!kids)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < src->n_children; i++) {
        st_code rc = gc_rule_copy(a, &kids[i], &src->children[i]);
        if (rc != ST_OK)
            return rc;
    }
    dst->children = kids;
    return ST_OK;
}

static int gc_family_cmp(const void *a, const void *b) {
    return st_slice_cmp(((const gc_family *)a)->name, ((const gc_family *)b)->name);
}

/* Copies every family into the set; checks rules first so nothing half-built escapes. */
static st_code gc_set_fill(sto_gc_set *g, const sto_family_gc *fams, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t nodes = 0;
        if (gc_rule_check(&fams[i].rule, 0, &nodes) != ST_OK)
            return ST_INVALID_ARGUMENT;
    }
    g->fams = n ? st_arena_alloc(&g->arena, n * sizeof *g->fams) : NULL;
    if (n && !g->fams)
        return ST_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        gc_family *f = &g->fams[i];
        void *name = st_arena_dup(&g->arena, fams[i].family.data, fams[i].family.len);
        if (!name)
            return ST_RESOURCE_EXHAUSTED;
        f->name = st_slice_make(name, fams[i].family.len);
        st_code rc = gc_rule_copy(&g->arena, &f->rule, &fams[i].rule);
        if (rc != ST_OK)
            return rc;
    }
    g->n = n;
    if (n > 1)
        qsort(g->fams, n, sizeof *g->fams, gc_family_cmp);
    for (size_t i = 1; i < n; i++)
        if (st_slice_eq(g->fams[i - 1].name, g->fams[i].name))
            return ST_INVALID_ARGUMENT; /* one rule per family */
    return ST_OK;
}

st_code sto_gc_set_new(const sto_family_gc *fams, size_t n, sto_gc_set **out) {
    if (n > STO_GC_FAMILIES_MAX || (n && !fams))
        return ST_INVALID_ARGUMENT;
    sto_gc_set *g = calloc(1, sizeof *g);
    if (!g)
        return ST_RESOURCE_EXHAUSTED;
    atomic_init(&g->refs, 1);
    st_arena_init(&g->arena, 4096);
    st_code rc = gc_set_fill(g, fams, n);
    if (rc != ST_OK) {
        st_arena_deinit(&g->arena);
        free(g);
        return rc;
    }
    *out = g;
    return ST_OK;
}

void sto_gc_set_ref(sto_gc_set *g) {
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
}

void sto_gc_set_unref(sto_gc_set *g) {
    if (!g || atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
        return;
    st_arena_deinit(&g->arena);
    free(g);
}

const sto_gc_rule *sto_gc_set_find(const sto_gc_set *g, st_slice family) {
    if (!g)
        return NULL;
    size_t lo = 0, hi = g->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = st_slice_cmp(g->fams[mid].name, family);
        if (c == 0)
            return g->fams[mid].rule.kind == STO_GC_NONE ? NULL : &g->fams[mid].rule;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

bool sto_gc_rule_garbage(const sto_gc_rule *r, int64_t rank, int64_t ts_us, int64_t now_us,
                         bool versions_known) {
    switch (r->kind) {
    case STO_GC_NONE:
        return false;
    case STO_GC_MAX_VERSIONS:
        return versions_known && rank > r->max_versions;
    case STO_GC_MAX_AGE:
        /* ts < now - max_age, written so it cannot overflow. */
        return ts_us < now_us && now_us - ts_us > r->max_age_us;
    case STO_GC_UNION:
        for (size_t i = 0; i < r->n_children; i++)
            if (sto_gc_rule_garbage(&r->children[i], rank, ts_us, now_us, versions_known))
                return true;
        return false;
    case STO_GC_INTERSECTION:
        for (size_t i = 0; i < r->n_children; i++)
            if (!sto_gc_rule_garbage(&r->children[i], rank, ts_us, now_us, versions_known))
                return false;
        return r->n_children > 0; /* an empty intersection keeps everything */
    }
    return false;
}
