/* tmap.c — a cluster's tablet map (which node holds which rows of which table) and the ReadRows
 * walk of a row set over it. Pure functions: the map is built from ListTablets answers by conn.c.
 */
#include "router_internal.h"

#include <stdlib.h>
#include <string.h>

#define TMAP_ARENA_BLOCK_BYTES ((size_t)64 << 10)

static int in_cmp(const void *a, const void *b) {
    const rtr_tablet_in *x = a, *y = b;
    int c = strcmp(x->table, y->table);
    if (c)
        return c;
    c = st_slice_cmp(x->start, y->start);
    if (c)
        return c;
    /* A move's source first (the target's copy is partial until the move ends), then the
     * writable copy, then a read-only one. */
    c = (int)y->moving - (int)x->moving;
    if (c)
        return c;
    return (int)x->read_only - (int)y->read_only;
}

/* True if tablet b (starting at or after a's start) overlaps a. */
static bool overlaps(const rtr_tablet *a, const rtr_tablet_in *b) {
    return a->end.len == 0 || st_slice_cmp(b->start, a->end) < 0;
}

static st_slice copy_key(st_arena *a, st_slice k, bool *ok) {
    if (k.len == 0)
        return st_slice_make(NULL, 0);
    void *p = st_arena_dup(a, k.data, k.len);
    if (!p)
        *ok = false;
    return st_slice_make(p, k.len);
}

/* Appends tablet in to table t (its last kept tablet may overlap: then in is dropped). */
static bool add_tablet(rtr_tmap *m, rtr_tmap_table *t, const rtr_tablet_in *in) {
    if (t->n > 0 && overlaps(&t->v[t->n - 1], in))
        return true;
    bool ok = true;
    rtr_tablet *tb = &t->v[t->n];
    tb->start = copy_key(&m->arena, in->start, &ok);
    tb->end = copy_key(&m->arena, in->end, &ok);
    tb->id = in->id;
    tb->node = in->node;
    tb->read_only = in->read_only;
    tb->moving = in->moving;
    tb->stale = in->stale;
    /* A read-only tablet that survived the overlap check is still the only copy known. */
    t->n++;
    return ok;
}

/* Gives each table its slice of one tablet array (sorted input, one table after another). */
static bool build_tables(rtr_tmap *m, const rtr_tablet_in *v, size_t n) {
    rtr_tablet *all = st_arena_alloc(&m->arena, (n ? n : 1) * sizeof *all);
    m->tables = st_arena_alloc(&m->arena, (n ? n : 1) * sizeof *m->tables);
    if (!all || !m->tables)
        return false;
    for (size_t i = 0; i < n; i++) {
        rtr_tmap_table *t = m->n_tables ? &m->tables[m->n_tables - 1] : NULL;
        if (!t || strcmp(t->name, v[i].table) != 0) {
            t = &m->tables[m->n_tables++];
            t->name = st_arena_dup(&m->arena, v[i].table, strlen(v[i].table) + 1);
            t->v = all + i;
            t->n = 0;
            if (!t->name)
                return false;
        }
        if (!add_tablet(m, t, &v[i]))
            return false;
    }
    return true;
}

rtr_tmap *rtr_tmap_build(const rtr_tablet_in *in, size_t n) {
    if (n > RTR_TABLETS_MAX)
        return NULL;
    rtr_tmap *m = calloc(1, sizeof *m);
    rtr_tablet_in *v = malloc((n ? n : 1) * sizeof *v);
    if (!m || !v) {
        free(m);
        free(v);
        return NULL;
    }
    st_arena_init(&m->arena, TMAP_ARENA_BLOCK_BYTES);
    if (n)
        memcpy(v, in, n * sizeof *v);
    qsort(v, n, sizeof *v, in_cmp);
    bool ok = build_tables(m, v, n);
    free(v);
    if (!ok) {
        rtr_tmap_free(m);
        return NULL;
    }
    return m;
}

static int created_cmp(const void *a, const void *b) {
    const rtr_table_created *x = a, *y = b;
    int c = strcmp(x->table, y->table);
    return c ? c : (x->node > y->node) - (x->node < y->node);
}

bool rtr_tmap_set_created(rtr_tmap *m, const rtr_table_created *v, size_t n) {
    m->created = st_arena_alloc(&m->arena, (n ? n : 1) * sizeof *m->created);
    if (!m->created)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char *name = st_arena_dup(&m->arena, v[i].table, strlen(v[i].table) + 1);
        if (!name)
            return false;
        m->created[i] = (rtr_table_created){name, v[i].node, v[i].us};
    }
    m->n_created = n;
    qsort(m->created, n, sizeof *m->created, created_cmp);
    return true;
}

int64_t rtr_tmap_created_us(const rtr_tmap *m, const char *table, uint32_t node) {
    rtr_table_created key = {table, node, 0};
    const rtr_table_created *hit =
        m->n_created ? bsearch(&key, m->created, m->n_created, sizeof key, created_cmp) : NULL;
    return hit ? hit->us : 0;
}

void rtr_tmap_free(rtr_tmap *m) {
    if (!m)
        return;
    st_arena_deinit(&m->arena);
    free(m);
}

bool rtr_tmap_covers_all(const rtr_tmap_table *t) {
    if (!t || t->n == 0 || t->v[0].start.len != 0 || t->v[t->n - 1].end.len != 0)
        return false;
    for (size_t i = 1; i < t->n; i++)
        if (!st_slice_eq(t->v[i - 1].end, t->v[i].start))
            return false;
    return true;
}

const rtr_tmap_table *rtr_tmap_find(const rtr_tmap *m, const char *table) {
    size_t lo = 0, hi = m ? m->n_tables : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->tables[mid].name, table);
        if (c == 0)
            return &m->tables[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Number of tablets whose start is <= key (strict: < key). */
static size_t count_starts(const rtr_tmap_table *t, st_slice key, bool strict) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = st_slice_cmp(t->v[mid].start, key);
        if (c < 0 || (c == 0 && !strict))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool tablet_has(const rtr_tablet *tb, st_slice row) {
    return st_slice_cmp(tb->start, row) <= 0 &&
           (tb->end.len == 0 || st_slice_cmp(row, tb->end) < 0);
}

size_t rtr_tmap_row(const rtr_tmap_table *t, st_slice row) {
    if (!t)
        return SIZE_MAX;
    size_t k = count_starts(t, row, false);
    if (k == 0 || !tablet_has(&t->v[k - 1], row))
        return SIZE_MAX;
    return k - 1;
}

/* ---- the ReadRows walk ---- */

static st_slice smax_start(st_slice a, st_slice b) {
    return st_slice_cmp(a, b) >= 0 ? a : b;
}
static st_slice smin_end(st_slice a, st_slice b) {
    return btu_end_cmp(a, b) <= 0 ? a : b;
}

/* rs->v[i] clipped to the rows still wanted and to [lo, hi). */
static btu_key_range clip(const btu_key_range *r, st_slice lo, st_slice hi) {
    btu_key_range c = {smax_start(r->start, lo), smin_end(r->end, hi)};
    return c;
}

/* The rows still wanted, as bounds: forward [pos, +inf), reversed [-inf, pos). */
static void remaining(bool reversed, bool has_pos, st_slice pos, st_slice *lo, st_slice *hi) {
    *lo = st_slice_make(NULL, 0);
    *hi = st_slice_make(NULL, 0);
    if (has_pos && !reversed)
        *lo = pos;
    if (has_pos && reversed)
        *hi = pos;
}

/* Collects the ranges of rs inside [lo, hi) into sub (arena); ranges are sorted, so a binary
 * search finds the first and the walk stops past hi. */
static st_code collect(const btu_rowset *rs, st_slice lo, st_slice hi, st_arena *a,
                       btu_rowset *sub) {
    size_t first = 0, last = rs->n;
    while (first < last) { /* first range whose end is above lo */
        size_t mid = first + (last - first) / 2;
        if (rs->v[mid].end.len != 0 && st_slice_cmp(rs->v[mid].end, lo) <= 0)
            first = mid + 1;
        else
            last = mid;
    }
    size_t cap = 16, n = 0;
    btu_key_range *v = st_arena_alloc(a, cap * sizeof *v);
    for (size_t i = first; v && i < rs->n; i++) {
        if (hi.len && st_slice_cmp(rs->v[i].start, hi) >= 0)
            break;
        btu_key_range c = clip(&rs->v[i], lo, hi);
        if (btu_range_is_empty(&c))
            continue;
        if (n == cap) {
            btu_key_range *nv = st_arena_alloc(a, 2 * cap * sizeof *nv);
            if (nv)
                memcpy(nv, v, n * sizeof *nv);
            v = nv;
            cap *= 2;
            if (!v)
                break;
        }
        v[n++] = c;
    }
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    sub->v = v;
    sub->n = n;
    return ST_OK;
}

/* The first (forward) or last (reversed) row bound still wanted: forward the start of the first
 * non-empty clipped range, reversed the end of the last. false when nothing is left. */
static bool next_edge(const btu_rowset *rs, bool reversed, st_slice lo, st_slice hi,
                      st_slice *edge) {
    for (size_t k = 0; k < rs->n; k++) {
        size_t i = reversed ? rs->n - 1 - k : k;
        btu_key_range c = clip(&rs->v[i], lo, hi);
        if (btu_range_is_empty(&c))
            continue;
        *edge = reversed ? c.end : c.start;
        return true;
    }
    return false;
}

st_code rtr_read_locate(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                        const rtr_tmap_table *t, size_t *tablet, st_slice *gap) {
    st_slice lo, hi, edge;
    remaining(reversed, has_pos, pos, &lo, &hi);
    if (!next_edge(rs, reversed, lo, hi, &edge))
        return ST_NOT_FOUND;
    *gap = edge;
    size_t k;
    if (!reversed) {
        k = t ? count_starts(t, edge, false) : 0;
        if (k == 0 || !tablet_has(&t->v[k - 1], edge))
            return ST_UNAVAILABLE;
    } else {
        /* The tablet holding the rows just below edge (edge empty: the last tablet). */
        k = !t ? 0 : edge.len == 0 ? t->n : count_starts(t, edge, true);
        if (k == 0 || btu_end_cmp(t->v[k - 1].end, edge) < 0)
            return ST_UNAVAILABLE;
    }
    *tablet = k - 1;
    return ST_OK;
}

st_code rtr_read_collect(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                         const rtr_tablet *tb, st_arena *a, btu_rowset *sub) {
    st_slice lo, hi;
    remaining(reversed, has_pos, pos, &lo, &hi);
    return collect(rs, smax_start(lo, tb->start), smin_end(hi, tb->end), a, sub);
}

st_code rtr_read_step(const btu_rowset *rs, bool reversed, bool has_pos, st_slice pos,
                      const rtr_tmap_table *t, st_arena *a, btu_rowset *sub, size_t *tablet,
                      st_slice *gap) {
    st_code rc = rtr_read_locate(rs, reversed, has_pos, pos, t, tablet, gap);
    if (rc != ST_OK)
        return rc;
    return rtr_read_collect(rs, reversed, has_pos, pos, &t->v[*tablet], a, sub);
}

bool rtr_read_covers(const btu_rowset *rs, const rtr_tablet *tb) {
    if (rs->n == 0)
        return false;
    return st_slice_cmp(rs->v[0].start, tb->start) >= 0 &&
           btu_end_cmp(rs->v[rs->n - 1].end, tb->end) <= 0;
}

bool rtr_read_next_pos(const rtr_tablet *tb, bool reversed, st_slice *pos) {
    *pos = reversed ? tb->start : tb->end;
    return pos->len > 0;
}
