/* changes_survive.c — the cells a replicated delete leaves in place (docs/changestreams.md,
 * Replicated deletes). Storage applies a replicated row mutation by version: its deletes cover
 * only entries of a lower version, and its SetCells lose to a cell of a higher version at the
 * same coordinates. A cluster records the row mutation when it applies it, after any newer write
 * of the row it already holds, so a record of its mutations alone would delete (or overwrite),
 * for a consumer applying the stream in order, cells the table keeps. The record therefore ends
 * with one SetCell per such cell, restoring it: applied in order, the record has the row mutation's
 * real effect. Finding them costs a read of the row, paid by replicated row mutations holding a
 * delete only. Loop thread. */
#include "changes.h"

#include <stdlib.h>
#include <string.h>

/* A cell of the row as the row mutation will find it, with the version that wrote it. */
typedef struct sv_cell {
    sto_mut set; /* STO_MUT_SET_CELL */
    uint64_t version;
    bool gone; /* deleted by a later write in flight */
} sv_cell;

/* A delete of a write in flight: it also hides SetCells of a lower version applied after it. */
typedef struct sv_tomb {
    const sto_mut *m;
    uint64_t version;
} sv_tomb;

bool node_cs_row_deletes(const sto_row_mut *r) {
    if (!(r->flags & STO_ROW_REPLICATED))
        return false;
    for (size_t i = 0; i < r->n_muts; i++)
        if (r->muts[i].type == STO_MUT_DEL_ROW ||
            ((r->muts[i].type == STO_MUT_DEL_FAMILY || r->muts[i].type == STO_MUT_DEL_COLUMN) &&
             !sto_family_is_system(r->muts[i].family)))
            return true;
    return false;
}

/* Whether mutation m reaches the cell (family, qualifier, ts), whatever the versions. */
static bool mut_reaches(const sto_mut *m, st_slice family, st_slice qualifier, int64_t ts) {
    if (m->type == STO_MUT_DEL_ROW)
        return true;
    if (!st_slice_eq(m->family, family))
        return false;
    if (m->type == STO_MUT_DEL_FAMILY)
        return true;
    if (!st_slice_eq(m->qualifier, qualifier))
        return false;
    if (m->type == STO_MUT_SET_CELL)
        return m->ts_us == ts;
    return ts >= m->ts_start_us && (m->ts_end_us == STO_TS_END_INF || ts < m->ts_end_us);
}

/* Whether row mutation r would change the cell (family, qualifier, ts) were its version higher. */
static bool row_reaches(const sto_row_mut *r, st_slice family, st_slice qualifier, int64_t ts) {
    for (size_t i = 0; i < r->n_muts; i++)
        if (!sto_family_is_system(r->muts[i].family) &&
            mut_reaches(&r->muts[i], family, qualifier, ts))
            return true;
    return false;
}

typedef struct sv_state {
    st_buf cells; /* sv_cell */
    st_buf tombs; /* sv_tomb */
    st_arena *arena;
    const sto_row_mut *r; /* the replicated row mutation */
} sv_state;

static st_code add_cell(sv_state *s, const sto_mut *set, uint64_t version, bool copy) {
    sv_cell c = {.set = *set, .version = version};
    if (copy) {
        c.set.family = st_slice_make(st_arena_dup(s->arena, set->family.data, set->family.len),
                                     set->family.len);
        c.set.qualifier = st_slice_make(
            st_arena_dup(s->arena, set->qualifier.data, set->qualifier.len), set->qualifier.len);
        c.set.value =
            st_slice_make(st_arena_dup(s->arena, set->value.data, set->value.len), set->value.len);
        if ((set->family.len && !c.set.family.data) ||
            (set->qualifier.len && !c.set.qualifier.data) || (set->value.len && !c.set.value.data))
            return ST_RESOURCE_EXHAUSTED;
    }
    return st_buf_append(&s->cells, &c, sizeof c);
}

/* A visible cell of the row, kept when the replicated row mutation reaches it and does not
 * outrank it (node_row_each). */
static st_code keep_cell(const sto_cell *c, void *arg) {
    sv_state *s = arg;
    if (c->version <= s->r->version || !row_reaches(s->r, c->family, c->qualifier, c->ts_us))
        return ST_OK;
    sto_mut set = {.type = STO_MUT_SET_CELL,
                   .family = c->family,
                   .qualifier = c->qualifier,
                   .ts_us = c->ts_us,
                   .value = c->value};
    return add_cell(s, &set, c->version, true);
}

static st_code read_row(node_ctx *n, sv_state *s, st_err *err) {
    node_tablet *tab = node_tablet_by_id(n, s->r->tablet_id, NULL);
    if (!tab)
        return ST_OK; /* storage will refuse the write */
    return node_row_each(tab, s->r->row, keep_cell, s, err);
}

static bool tomb_hides(const sv_state *s, const sto_mut *set, uint64_t version) {
    const sv_tomb *t = (const sv_tomb *)s->tombs.data;
    for (size_t i = 0; i < s->tombs.len / sizeof *t; i++)
        if (t[i].version > version && mut_reaches(t[i].m, set->family, set->qualifier, set->ts_us))
            return true;
    return false;
}

/* One mutation of a write that storage applies before the replicated row mutation. */
static st_code apply_mut(sv_state *s, const sto_mut *m, uint64_t version) {
    sv_cell *c = (sv_cell *)s->cells.data;
    size_t n_cells = s->cells.len / sizeof *c;
    if (m->type != STO_MUT_SET_CELL) {
        for (size_t i = 0; i < n_cells; i++)
            if (c[i].version <= version &&
                mut_reaches(m, c[i].set.family, c[i].set.qualifier, c[i].set.ts_us))
                c[i].gone = true;
        sv_tomb t = {.m = m, .version = version};
        return st_buf_append(&s->tombs, &t, sizeof t);
    }
    if (version <= s->r->version || tomb_hides(s, m, version) ||
        !row_reaches(s->r, m->family, m->qualifier, m->ts_us))
        return ST_OK;
    for (size_t i = 0; i < n_cells; i++)
        if (!c[i].gone && c[i].set.ts_us == m->ts_us && st_slice_eq(c[i].set.family, m->family) &&
            st_slice_eq(c[i].set.qualifier, m->qualifier)) {
            if (c[i].version > version)
                return ST_OK; /* the newer cell stays */
            c[i].gone = true;
        }
    /* the write in flight (or the write itself) keeps its mutations until it completes */
    return add_cell(s, m, version, false);
}

static st_code apply_row(sv_state *s, const sto_row_mut *w) {
    if (w->tablet_id != s->r->tablet_id || !st_slice_eq(w->row, s->r->row))
        return ST_OK;
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < w->n_muts; i++)
        if (!sto_family_is_system(w->muts[i].family) || w->muts[i].type == STO_MUT_DEL_ROW)
            rc = apply_mut(s, &w->muts[i], w->version);
    return rc;
}

static st_code apply_inflight(const sto_row_mut *rows, size_t count, void *arg) {
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < count; i++)
        rc = apply_row(arg, &rows[i]);
    return rc;
}

st_code node_cs_survivors(node_ctx *n, const sto_row_mut *rows, size_t i, st_arena *arena,
                          st_buf *out, st_err *err) {
    sv_state s = {.arena = arena, .r = &rows[i]};
    st_buf_init(&s.cells);
    st_buf_init(&s.tombs);
    /* Storage applies, before this row mutation: what it holds now, the writes in flight, and
     * the rows of this write before it. */
    st_code rc = read_row(n, &s, err);
    if (rc == ST_OK)
        rc = node_cs_inflight_each(n, apply_inflight, &s);
    if (rc == ST_OK)
        rc = apply_inflight(rows, i, &s);
    const sv_cell *c = (const sv_cell *)s.cells.data;
    for (size_t k = 0; rc == ST_OK && k < s.cells.len / sizeof *c; k++)
        if (!c[k].gone)
            rc = st_buf_append(out, &c[k].set, sizeof c[k].set);
    st_buf_free(&s.cells);
    st_buf_free(&s.tombs);
    if (rc == ST_RESOURCE_EXHAUSTED)
        return st_err_set(err, rc, "out of memory reading the cells a replicated delete keeps");
    return rc;
}
