/*
 * The randomized model test: thousands of random row mutations (all four kinds, random unique
 * versions arriving out of order, several mutations per row mutation, batches spanning tablets)
 * go both to the engine and to a deliberately naive in-memory model that recomputes visibility
 * from every entry it ever received (rowread.h's rules, GC rules chosen at random per seed with a
 * fixed fake clock). Between writes the test flushes, fully compacts (the model then drops what a
 * full compaction may drop), splits tablets at random rows, drops row prefixes and reopens the
 * engine; after each step of that kind and periodically it compares every tablet forward and
 * reverse, random ranges and point reads. Runs on the in-memory env. STRATA_SEED replays a run.
 * One of the three families is a system family (its name starts with 0x00): row deletes do not
 * cover it, plain reads do not show it, and full dumps with STO_ITER_USER | STO_ITER_SYSTEM are
 * compared too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sto_test_util.h"

#define N_ROWS 48
#define N_STEPS 8000
#define NOW_US 1000
#define MAX_TABLETS 32

/* Index order is name order: the system family "\0s" sorts first. */
static const char *const FAMS[] = {"\0s", "a", "b"};
static const size_t FAM_LEN[] = {2, 1, 1};
#define SYS_FAM 0

static st_slice fam_slice(int f) {
    return st_slice_make(FAMS[f], FAM_LEN[f]);
}
static const char *const QUALS[] = {"", "x", "y", "z"};

/* ---- the model ---- */

typedef struct ment {
    int row; /* index into rows[] */
    sto_mut_type kind;
    int fam, qual;
    int64_t ts, del_start, del_end;
    uint64_t version;
    char value[24];
    size_t value_len;
    bool dead; /* dropped by an emulated full compaction */
} ment;

typedef struct mtablet {
    uint64_t id;
    int start, end; /* row indexes; -1 = unbounded */
} mtablet;

typedef struct model {
    char rows[N_ROWS][8];
    size_t row_len[N_ROWS];
    ment *e[N_ROWS]; /* entries per row */
    size_t n[N_ROWS], cap[N_ROWS];
    size_t total;
    mtablet tab[MAX_TABLETS];
    int n_tab;
    uint64_t next_id;
    sto_gc_rule rules[3];
    sto_gc_rule kids[3][2];
} model;

static st_slice row_slice(const model *m, int r) {
    return st_slice_make(m->rows[r], m->row_len[r]);
}

static int row_cmp(const model *m, int a, int b) {
    return st_slice_cmp(row_slice(m, a), row_slice(m, b));
}

/* Distinct rows (with 0x00 and 0xff bytes for the key escaping), sorted so index order is key
 * order. */
static void make_rows(model *m, st_rng *rng) {
    static const char alphabet[] = {'\0', (char)0xff, '1', '2', '3', '4', '5', '6'};
    for (int i = 0; i < N_ROWS; i++) {
        bool dup = true;
        while (dup) {
            m->row_len[i] = 2 + st_rng_below(rng, 3);
            m->rows[i][0] = 'r';
            for (size_t j = 1; j < m->row_len[i]; j++)
                m->rows[i][j] = alphabet[st_rng_below(rng, sizeof alphabet)];
            dup = false;
            for (int k = 0; k < i && !dup; k++)
                dup = row_cmp(m, k, i) == 0;
        }
    }
    for (int i = 1; i < N_ROWS; i++)
        for (int j = i; j > 0 && row_cmp(m, j - 1, j) > 0; j--) {
            char tmp[8];
            size_t tl = m->row_len[j];
            memcpy(tmp, m->rows[j], 8);
            memcpy(m->rows[j], m->rows[j - 1], 8);
            m->row_len[j] = m->row_len[j - 1];
            memcpy(m->rows[j - 1], tmp, 8);
            m->row_len[j - 1] = tl;
        }
}

/* Max-versions garbage depends on what is visible when a full compaction runs (a later delete
 * of newer versions would reveal older ones in the model but not in the engine), so runs with
 * background compactions use only rules whose garbage stays garbage. */
static void random_rule(st_rng *rng, sto_gc_rule *r, sto_gc_rule kids[2], bool stable_only) {
    memset(r, 0, sizeof *r);
    sto_gc_rule mv = {.kind = STO_GC_MAX_VERSIONS,
                      .max_versions = 1 + (int64_t)st_rng_below(rng, 3)};
    sto_gc_rule ma = {.kind = STO_GC_MAX_AGE, .max_age_us = 5 + (int64_t)st_rng_below(rng, 10)};
    switch (stable_only ? st_rng_below(rng, 2) * 2 : st_rng_below(rng, 5)) {
    case 0:
        r->kind = STO_GC_NONE;
        break;
    case 1:
        *r = mv;
        break;
    case 2:
        *r = ma;
        break;
    default:
        kids[0] = mv;
        kids[1] = ma;
        r->kind = st_rng_below(rng, 2) ? STO_GC_UNION : STO_GC_INTERSECTION;
        r->children = kids;
        r->n_children = 2;
        break;
    }
}

static bool garbage(const sto_gc_rule *r, int64_t rank, int64_t ts) {
    switch (r->kind) {
    case STO_GC_MAX_VERSIONS:
        return rank > r->max_versions;
    case STO_GC_MAX_AGE:
        return ts < NOW_US && NOW_US - ts > r->max_age_us;
    case STO_GC_UNION:
        return garbage(&r->children[0], rank, ts) || garbage(&r->children[1], rank, ts);
    case STO_GC_INTERSECTION:
        return garbage(&r->children[0], rank, ts) && garbage(&r->children[1], rank, ts);
    default:
        return false;
    }
}

static void model_add(model *m, const ment *e) {
    int r = e->row;
    if (m->n[r] == m->cap[r]) {
        m->cap[r] = m->cap[r] ? m->cap[r] * 2 : 64;
        m->e[r] = realloc(m->e[r], m->cap[r] * sizeof(ment));
    }
    m->e[r][m->n[r]++] = *e;
    m->total++;
}

/* The winning live SetCell of (row, fam, qual, ts): the highest version. */
static const ment *cell_winner(const model *m, int row, int fam, int qual, int64_t ts) {
    const ment *best = NULL;
    for (size_t i = 0; i < m->n[row]; i++) {
        const ment *e = &m->e[row][i];
        if (!e->dead && e->row == row && e->kind == STO_MUT_SET_CELL && e->fam == fam &&
            e->qual == qual && e->ts == ts && (!best || e->version > best->version))
            best = e;
    }
    return best;
}

static bool hidden(const model *m, const ment *c) {
    for (size_t i = 0; i < m->n[c->row]; i++) {
        const ment *e = &m->e[c->row][i];
        if (e->dead || e->version <= c->version)
            continue;
        if (e->kind == STO_MUT_DEL_ROW && c->fam != SYS_FAM)
            return true;
        if (e->kind == STO_MUT_DEL_FAMILY && e->fam == c->fam)
            return true;
        if (e->kind == STO_MUT_DEL_COLUMN && e->fam == c->fam && e->qual == c->qual &&
            c->ts >= e->del_start && c->ts < e->del_end)
            return true;
    }
    return false;
}

static int cmp_ts_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

/* Visible cells of one column, newest first, into out (as ment pointers); n returned. Entries not
 * visible are reported through drop (for compaction emulation) when drop is not NULL. */
static size_t column_visible(model *m, int row, int fam, int qual, const ment **out, bool drop) {
    int64_t ts_list[4096];
    size_t n_ts = 0;
    for (size_t i = 0; i < m->n[row] && n_ts < 4096; i++) {
        const ment *e = &m->e[row][i];
        if (e->dead || e->row != row || e->kind != STO_MUT_SET_CELL || e->fam != fam ||
            e->qual != qual)
            continue;
        bool seen = false;
        for (size_t j = 0; j < n_ts && !seen; j++)
            seen = ts_list[j] == e->ts;
        if (!seen)
            ts_list[n_ts++] = e->ts;
    }
    qsort(ts_list, n_ts, sizeof ts_list[0], cmp_ts_desc);
    size_t k = 0;
    int64_t rank = 0;
    for (size_t j = 0; j < n_ts; j++) {
        const ment *w = cell_winner(m, row, fam, qual, ts_list[j]);
        bool vis = !hidden(m, w);
        if (vis) {
            rank++;
            vis = !garbage(&m->rules[fam], rank, w->ts);
        }
        if (vis)
            out[k++] = w;
        if (drop) /* a full compaction keeps only the visible winner of each cell */
            for (size_t i = 0; i < m->n[row]; i++) {
                ment *e = &m->e[row][i];
                if (!e->dead && e->row == row && e->kind == STO_MUT_SET_CELL && e->fam == fam &&
                    e->qual == qual && e->ts == ts_list[j] && (!vis || e != w))
                    e->dead = true;
            }
    }
    return k;
}

static void append_row_cells(model *m, int row, bool with_sys, st_buf *out) {
    const ment *vis[4096];
    for (int f = with_sys ? 0 : 1; f < 3; f++)
        for (int q = 0; q < 4; q++) {
            size_t n = column_visible(m, row, f, q, vis, false);
            for (size_t i = 0; i < n; i++) {
                sto_cell c = {row_slice(m, row),
                              fam_slice(f),
                              st_slice_cstr(QUALS[q]),
                              vis[i]->ts,
                              st_slice_make(vis[i]->value, vis[i]->value_len),
                              vis[i]->version};
                tu_append_cell(out, &c);
            }
        }
}

static bool in_tablet(const model *m, const mtablet *t, int row) {
    (void)m;
    return (t->start < 0 || row >= t->start) && (t->end < 0 || row < t->end);
}

/* Model text of rows lo..hi (indexes, inclusive) inside tablet t. */
static void model_dump(model *m, const mtablet *t, int lo, int hi, bool reverse, bool with_sys,
                       st_buf *out) {
    st_buf_reset(out);
    for (int k = 0; k < N_ROWS; k++) {
        int r = reverse ? N_ROWS - 1 - k : k;
        if (r >= lo && r <= hi && in_tablet(m, t, r))
            append_row_cells(m, r, with_sys, out);
    }
    st_buf_append_byte(out, 0);
    out->len--;
}

static void model_full_compact(model *m, const mtablet *t) {
    const ment *vis[4096];
    for (int r = 0; r < N_ROWS; r++)
        if (in_tablet(m, t, r))
            for (int f = 0; f < 3; f++)
                for (int q = 0; q < 4; q++)
                    column_visible(m, r, f, q, vis, true);
}

static int tablet_of(const model *m, int row) {
    for (int i = 0; i < m->n_tab; i++)
        if (in_tablet(m, &m->tab[i], row))
            return i;
    return -1;
}

/* ---- the run ---- */

typedef struct run {
    model m;
    st_rng rng;
    char dir[512];
    sto_options o;
    st_clock clk;
    sto_db *db;
    st_buf a, b;
    uint64_t seq;
    sto_family_gc fgc[3];
} run;

static void set_gc_all(run *r) {
    for (int i = 0; i < r->m.n_tab; i++) {
        sto_tablet *t;
        assert_int_equal(sto_tablet_get(r->db, r->m.tab[i].id, &t), ST_OK);
        st_err err;
        assert_int_equal(sto_tablet_set_gc(t, r->fgc, 3, &err), ST_OK);
    }
}

static uint64_t fresh_version(run *r) {
    r->seq++;
    return (st_rng_below(&r->rng, 1u << 30) << 20) | (r->seq & 0xfffff);
}

static void random_mut(run *r, int row, uint64_t version, sto_mut *mu, ment *me) {
    memset(mu, 0, sizeof *mu);
    memset(me, 0, sizeof *me);
    me->row = row;
    me->version = version;
    uint64_t k = st_rng_below(&r->rng, 20);
    me->fam = (int)st_rng_below(&r->rng, 3);
    me->qual = (int)st_rng_below(&r->rng, 4);
    mu->family = fam_slice(me->fam);
    mu->qualifier = st_slice_cstr(QUALS[me->qual]);
    if (k < 14) {
        me->kind = STO_MUT_SET_CELL;
        me->ts = NOW_US - 25 + (int64_t)st_rng_below(&r->rng, 26);
        me->value_len = st_rng_below(&r->rng, sizeof me->value);
        for (size_t i = 0; i < me->value_len; i++)
            me->value[i] = (char)('a' + st_rng_below(&r->rng, 26));
        mu->ts_us = me->ts;
        mu->value = st_slice_make(me->value, me->value_len);
    } else if (k < 17) {
        me->kind = STO_MUT_DEL_COLUMN;
        me->del_start = NOW_US - 25 + (int64_t)st_rng_below(&r->rng, 26);
        me->del_end = st_rng_below(&r->rng, 4) == 0
                          ? STO_TS_END_INF
                          : me->del_start + (int64_t)st_rng_below(&r->rng, 10);
        mu->ts_start_us = me->del_start;
        mu->ts_end_us = me->del_end;
    } else if (k < 19) {
        me->kind = STO_MUT_DEL_FAMILY;
    } else {
        me->kind = STO_MUT_DEL_ROW;
    }
    mu->type = me->kind;
}

#define MAX_BATCH 3
#define MAX_MUTS 4

/* Mutations of one row mutation apply in list order although they share one version: a later
 * SetCell of the same cell or a later delete covering a SetCell removes it. */
static bool later_covers(const ment *d, const ment *e) {
    switch (d->kind) {
    case STO_MUT_SET_CELL:
        return d->fam == e->fam && d->qual == e->qual && d->ts == e->ts;
    case STO_MUT_DEL_ROW:
        return e->fam != SYS_FAM;
    case STO_MUT_DEL_FAMILY:
        return d->fam == e->fam;
    case STO_MUT_DEL_COLUMN:
        return d->fam == e->fam && d->qual == e->qual && e->ts >= d->del_start &&
               e->ts < d->del_end;
    }
    return false;
}

/* One sto_write of 1..3 row mutations of 1..4 mutations each; the model gets them after the
 * ack. */
static void step_write(run *r) {
    sto_row_mut rows[MAX_BATCH];
    sto_mut muts[MAX_BATCH][MAX_MUTS];
    ment mes[MAX_BATCH][MAX_MUTS];
    int nb = 1 + (int)st_rng_below(&r->rng, MAX_BATCH);
    for (int i = 0; i < nb; i++) {
        int row = (int)st_rng_below(&r->rng, N_ROWS);
        int nm = 1 + (int)st_rng_below(&r->rng, MAX_MUTS);
        uint64_t v = fresh_version(r);
        for (int j = 0; j < nm; j++)
            random_mut(r, row, v, &muts[i][j], &mes[i][j]);
        rows[i] = (sto_row_mut){.tablet_id = r->m.tab[tablet_of(&r->m, row)].id,
                                .row = row_slice(&r->m, row),
                                .muts = muts[i],
                                .n_muts = (size_t)nm,
                                .version = v};
    }
    st_err err;
    st_code rc = sto_write(r->db, rows, (size_t)nb, NULL, &err);
    if (rc != ST_OK)
        fprintf(stderr, "write: %s\n", err.msg);
    assert_int_equal(rc, ST_OK);
    for (int i = 0; i < nb; i++)
        for (size_t j = 0; j < rows[i].n_muts; j++) {
            ment *e = &mes[i][j];
            if (e->kind == STO_MUT_SET_CELL)
                for (size_t k = j + 1; k < rows[i].n_muts; k++)
                    if (later_covers(&mes[i][k], e))
                        e->dead = true;
            if (!e->dead)
                model_add(&r->m, e);
        }
}

static void debug_dump(run *r) {
    for (int f = 0; f < 3; f++) {
        const sto_gc_rule *g = &r->m.rules[f];
        fprintf(stderr, "rule %s: kind=%d mv=%lld age=%lld", FAMS[f], g->kind,
                (long long)g->max_versions, (long long)g->max_age_us);
        for (size_t i = 0; i < g->n_children; i++)
            fprintf(stderr, " [kind=%d mv=%lld age=%lld]", g->children[i].kind,
                    (long long)g->children[i].max_versions, (long long)g->children[i].max_age_us);
        fprintf(stderr, "\n");
    }
    for (int row = 0; row < N_ROWS; row++)
        for (size_t i = 0; i < r->m.n[row]; i++) {
            const ment *e = &r->m.e[row][i];
            fprintf(stderr,
                    "row %d kind=%d fam=%s qual=%s ts=%lld del=[%lld,%lld) v=%llu dead=%d\n", row,
                    e->kind, FAMS[e->fam], QUALS[e->qual], (long long)e->ts,
                    (long long)e->del_start, (long long)e->del_end, (unsigned long long)e->version,
                    e->dead);
        }
}

/* Every cell of t, user and system families, as text. */
static void dump_all(sto_tablet *t, bool reverse, st_buf *out) {
    st_buf_reset(out);
    sto_snapshot *s;
    st_err err;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_OK);
    sto_iter *it;
    assert_int_equal(
        sto_iter_new_flags(s, NULL, reverse, STO_ITER_USER | STO_ITER_SYSTEM, &it, &err), ST_OK);
    sto_cell c;
    st_code rc;
    while ((rc = sto_iter_next(it, &c, &err)) == ST_OK)
        tu_append_cell(out, &c);
    assert_int_equal(rc, ST_NOT_FOUND);
    sto_iter_free(it);
    sto_snapshot_free(s);
    st_buf_append_byte(out, 0);
    out->len--;
}

static void compare_tablet(run *r, const mtablet *mt) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(r->db, mt->id, &t), ST_OK);
    for (int rev = 0; rev < 2; rev++) {
        assert_int_equal(tu_dump_range(t, NULL, rev, &r->a), ST_OK);
        model_dump(&r->m, mt, 0, N_ROWS - 1, rev, false, &r->b);
        if (strcmp((char *)r->a.data, (char *)r->b.data) != 0)
            debug_dump(r);
        if (strcmp((char *)r->a.data, (char *)r->b.data) != 0)
            fprintf(stderr, "tablet %llu reverse=%d\nengine:\n%s\nmodel:\n%s\n",
                    (unsigned long long)mt->id, rev, (char *)r->a.data, (char *)r->b.data);
        assert_string_equal((char *)r->a.data, (char *)r->b.data);
        dump_all(t, rev, &r->a);
        model_dump(&r->m, mt, 0, N_ROWS - 1, rev, true, &r->b);
        assert_string_equal((char *)r->a.data, (char *)r->b.data);
    }
    for (int k = 0; k < 4; k++) { /* random ranges and a point read */
        int lo = (int)st_rng_below(&r->rng, N_ROWS), hi = (int)st_rng_below(&r->rng, N_ROWS);
        if (k == 3)
            hi = lo;
        if (lo > hi) {
            int x = lo;
            lo = hi;
            hi = x;
        }
        bool sx = k == 1, ei = k != 2;
        sto_range range = {row_slice(&r->m, lo), sx, row_slice(&r->m, hi), ei};
        bool rev = st_rng_below(&r->rng, 2);
        assert_int_equal(tu_dump_range(t, &range, rev, &r->a), ST_OK);
        model_dump(&r->m, mt, lo + (sx ? 1 : 0), hi - (ei ? 0 : 1), rev, false, &r->b);
        assert_string_equal((char *)r->a.data, (char *)r->b.data);
    }
}

static void compare_all(run *r) {
    for (int i = 0; i < r->m.n_tab; i++)
        compare_tablet(r, &r->m.tab[i]);
}

static void step_split(run *r) {
    int i = (int)st_rng_below(&r->rng, (uint64_t)r->m.n_tab);
    mtablet *t = &r->m.tab[i];
    int row = (int)st_rng_below(&r->rng, N_ROWS);
    if (r->m.n_tab >= MAX_TABLETS || !in_tablet(&r->m, t, row) || row == t->start || row == 0)
        return;
    uint64_t l = r->m.next_id++, rt = r->m.next_id++;
    st_err err;
    st_code rc = sto_tablet_split(r->db, t->id, row_slice(&r->m, row), l, rt, &err);
    if (rc != ST_OK)
        fprintf(stderr, "split: %s\n", err.msg);
    assert_int_equal(rc, ST_OK);
    mtablet right = {rt, row, t->end};
    t->id = l;
    t->end = row;
    r->m.tab[r->m.n_tab++] = right;
}

static void step_compact(run *r) {
    mtablet *t = &r->m.tab[st_rng_below(&r->rng, (uint64_t)r->m.n_tab)];
    st_err err;
    if (getenv("MODEL_VERBOSE"))
        fprintf(stderr, "compact tablet %llu\n", (unsigned long long)t->id);
    assert_int_equal(sto_tablet_flush(r->db, t->id, &err), ST_OK);
    assert_int_equal(sto_tablet_compact(r->db, t->id, &err), ST_OK);
    model_full_compact(&r->m, t);
}

/* DropRowRange: the engine deletes each row with the prefix that has visible cells. */
static void step_drop_prefix(run *r) {
    mtablet *t = &r->m.tab[st_rng_below(&r->rng, (uint64_t)r->m.n_tab)];
    int pr = (int)st_rng_below(&r->rng, N_ROWS);
    size_t plen = st_rng_below(&r->rng, 3) == 0 ? 0 : 2;
    st_slice prefix = st_slice_make(r->m.rows[pr], plen);
    uint64_t v = fresh_version(r);
    st_buf cells;
    st_buf_init(&cells);
    if (getenv("MODEL_VERBOSE")) {
        st_buf pb;
        st_buf_init(&pb);
        tu_append_slice(&pb, prefix);
        st_buf_append_byte(&pb, 0);
        fprintf(stderr, "drop prefix '%s' tablet %llu version %llu\n", (char *)pb.data,
                (unsigned long long)t->id, (unsigned long long)v);
        st_buf_free(&pb);
    }
    for (int row = 0; row < N_ROWS; row++) {
        if (!in_tablet(&r->m, t, row) || !st_slice_has_prefix(row_slice(&r->m, row), prefix))
            continue;
        st_buf_reset(&cells);
        append_row_cells(&r->m, row, false, &cells);
        if (cells.len) {
            ment e = {.row = row, .kind = STO_MUT_DEL_ROW, .version = v};
            model_add(&r->m, &e);
        }
    }
    st_buf_free(&cells);
    st_err err;
    assert_int_equal(sto_tablet_drop_prefix(r->db, t->id, prefix, v, &err), ST_OK);
}

static void reopen(run *r) {
    sto_db_close(r->db);
    st_err err;
    st_code rc = sto_db_open(r->dir, &r->o, &r->db, &err);
    if (rc != ST_OK)
        fprintf(stderr, "reopen: %s\n", err.msg);
    assert_int_equal(rc, ST_OK);
    set_gc_all(r);
}

static void run_init(run *r, uint64_t seed, bool background) {
    memset(r, 0, sizeof *r);
    st_rng_seed(&r->rng, seed);
    make_rows(&r->m, &r->rng);
    for (int f = 0; f < 3; f++) {
        random_rule(&r->rng, &r->m.rules[f], r->m.kids[f], background);
        r->fgc[f] = (sto_family_gc){fam_slice(f), r->m.rules[f]};
    }
    snprintf(r->dir, sizeof r->dir, "/model"); /* in memory: durability is crash_test's job */
    tu_small_options(&r->o);
    r->o.env = st_env_mem_new();
    r->o.sync = false;              /* also exercises the polling wait of unsynced writes */
    st_log_set_level(ST_LOG_ERROR); /* sync=false warns at every reopen */
    st_clock_fake_init(&r->clk, NOW_US);
    r->o.clock = &r->clk;
    if (background) { /* small memtables, frequent background flushes and compactions */
        r->o.memtable_bytes = 64 << 10;
        r->o.compaction_trigger = 2;
        r->o.write_stall_tables = 8;
    } else { /* compactions only where the model knows of them */
        r->o.compaction_trigger = 1000;
        r->o.write_stall_tables = 2000;
    }
    st_buf_init(&r->a);
    st_buf_init(&r->b);
    st_err err;
    assert_int_equal(sto_db_open(r->dir, &r->o, &r->db, &err), ST_OK);
    r->m.tab[0] = (mtablet){1, -1, -1};
    r->m.n_tab = 1;
    r->m.next_id = 2;
    assert_int_equal(sto_tablet_create(r->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""),
                                       ST_SLICE_LIT(""), NULL, &err),
                     ST_OK);
    set_gc_all(r);
}

static void model_run(bool background, int steps) {
    run *r = calloc(1, sizeof *r);
    uint64_t seed = st_test_seed("model_test");
    run_init(r, seed, background);
    bool verbose = getenv("MODEL_VERBOSE") != NULL;
    for (int step = 0; step < steps; step++) {
        uint64_t k = st_rng_below(&r->rng, 1000);
        if (verbose)
            compare_all(r);
        if (verbose && k >= 930)
            fprintf(stderr, "step %d: %s\n", step,
                    k < 955   ? "flush"
                    : k < 975 ? "compact"
                    : k < 988 ? "split"
                    : k < 993 ? "drop_prefix"
                              : "reopen");
        if (k < 930) {
            step_write(r);
        } else if (k < 955) {
            st_err err;
            assert_int_equal(
                sto_tablet_flush(r->db, r->m.tab[st_rng_below(&r->rng, (uint64_t)r->m.n_tab)].id,
                                 &err),
                ST_OK);
        } else if (k < 975) {
            step_compact(r);
            compare_all(r);
        } else if (k < 988) {
            step_split(r);
            compare_all(r);
        } else if (k < 993) {
            step_drop_prefix(r);
            compare_all(r);
        } else {
            reopen(r);
            compare_all(r);
        }
        if (step % 200 == 199)
            compare_all(r);
    }
    compare_all(r);
    reopen(r);
    compare_all(r);
    fprintf(stderr, "model_test: %zu entries, %d tablets\n", r->m.total, r->m.n_tab);
    sto_db_close(r->db);
    r->o.env->ops->destroy(r->o.env);
    st_buf_free(&r->a);
    st_buf_free(&r->b);
    for (int i = 0; i < N_ROWS; i++)
        free(r->m.e[i]);
    free(r);
}

static void test_model_random_ops(void **state) {
    (void)state;
    model_run(false, N_STEPS);
}

static void test_model_random_ops_background_compaction(void **state) {
    (void)state;
    model_run(true, N_STEPS / 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_random_ops),
        cmocka_unit_test(test_model_random_ops_background_compaction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
