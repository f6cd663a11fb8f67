/* memtable.c — a skiplist in two arenas (LevelDB's SkipList): one writer, lock-free readers.
 *
 * Nodes (links and keys) and value records live in separate arenas. Interleaved, a search
 * stepped through one ~1 KB entry per node: every node on its own cache line and, across a
 * 32 MiB memtable, mostly on its own page, so an insert into a full memtable waited for ~20
 * cache and TLB misses (the largest cost of applying replicated rows). Packed together, the
 * nodes of a full memtable take ~2-3 MB, which the caches and the TLB hold much better.
 *
 * Readers never lock: a node is fully written before a release store links it in, and readers
 * follow links with acquire loads, so they see either the old or the new list, never a torn node.
 * Only the writer touches the arena. A value lives in an immutable record {lsn, len, bytes}; an
 * insert of an equal key pushes a new record in front of the old one (one release store), so a
 * reader at an older snapshot still finds the value it is entitled to further down the chain. */
#include "memtable.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "key.h"

#define MT_HEIGHT_MAX 12 /* 4^12 entries before the list degrades: plenty per memtable */
#define MT_BRANCHING 4   /* each level holds ~1/4 of the one below */
#define MT_ARENA_BLOCK_BYTES (64u << 10)
#define MT_NODE_BLOCK_BYTES (16u << 10) /* nodes are ~1/15 of the bytes of 1 KB values */
#define MT_WARM_BYTES_MAX 4096          /* most the arena is prefetched ahead of the next entry */

/* An immutable value version; `older` is the record it replaced (NULL for the first). */
typedef struct mt_rec {
    uint64_t lsn;
    const struct mt_rec *older;
    size_t len;
    uint8_t bytes[];
} mt_rec;

typedef struct mt_node {
    _Atomic(const mt_rec *) rec;
    uint32_t key_len;
    uint32_t height;
    _Atomic(struct mt_node *) next[]; /* height links, then key_len key bytes */
} mt_node;

struct sto_memtable {
    atomic_int refs;
    atomic_int height;        /* current list height; relaxed (LevelDB: stale values are safe) */
    _Atomic size_t bytes;     /* arena bytes, published for other threads */
    _Atomic uint64_t max_lsn; /* release/acquire: entries up to it are linked when it is seen */
    atomic_bool has_entries;
    mt_node *head;
    /* Writer only: the last node of each level (head when the level is empty). A key above the
     * last one — every insert of a sequential load — links after these without a search. */
    mt_node *tail[MT_HEIGHT_MAX];
    st_arena arena;  /* writer only: nodes (links and keys) */
    st_arena varena; /* writer only: value records */
    st_rng rng;      /* writer only: node heights */
    st_buf key_buf;  /* writer only: sto_memtable_apply's keys */
};

static inline size_t mt_arena_bytes(const sto_memtable *m) {
    return m->arena.total_bytes + m->varena.total_bytes;
}

static inline const uint8_t *mt_key_ptr(const mt_node *n) {
    return (const uint8_t *)&n->next[n->height];
}
static inline st_slice mt_key(const mt_node *n) {
    return st_slice_make(mt_key_ptr(n), n->key_len);
}
/* st_slice_cmp's order (memcmp, then the shorter first), inlined and 8 bytes at a time: a search
 * compares ~20 keys that share their first bytes (a table's row keys), and the call into memcmp
 * for each showed in the profile of applying replicated rows. */
static inline int mt_cmp(st_slice a, st_slice b) {
    size_t n = a.len < b.len ? a.len : b.len, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a.data + i, 8);
        memcpy(&y, b.data + i, 8);
        if (x != y) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            x = __builtin_bswap64(x);
            y = __builtin_bswap64(y);
#endif
            return x < y ? -1 : 1;
        }
    }
    for (; i < n; i++)
        if (a.data[i] != b.data[i])
            return a.data[i] < b.data[i] ? -1 : 1;
    return a.len < b.len ? -1 : a.len > b.len;
}

static inline mt_node *mt_next(mt_node *n, int level) {
    return atomic_load_explicit(&n->next[level], memory_order_acquire);
}

static mt_node *mt_node_new(sto_memtable *m, st_slice key, int height) {
    size_t size = sizeof(mt_node) + (size_t)height * sizeof(_Atomic(mt_node *)) + key.len;
    mt_node *n = st_arena_alloc(&m->arena, size);
    if (!n)
        return NULL;
    atomic_init(&n->rec, NULL);
    n->key_len = (uint32_t)key.len;
    n->height = (uint32_t)height;
    for (int i = 0; i < height; i++)
        atomic_init(&n->next[i], NULL);
    if (key.len)
        memcpy((uint8_t *)mt_key_ptr(n), key.data, key.len);
    return n;
}

st_code sto_memtable_new(sto_memtable **out) {
    sto_memtable *m = calloc(1, sizeof *m);
    if (!m)
        return ST_RESOURCE_EXHAUSTED;
    st_arena_init(&m->arena, MT_NODE_BLOCK_BYTES);
    st_arena_init(&m->varena, MT_ARENA_BLOCK_BYTES);
    st_rng_seed(&m->rng, 0x5eed5eedu);
    st_buf_init(&m->key_buf);
    m->head = mt_node_new(m, st_slice_make(NULL, 0), MT_HEIGHT_MAX);
    if (!m->head) {
        st_arena_deinit(&m->arena);
        st_arena_deinit(&m->varena);
        free(m);
        return ST_RESOURCE_EXHAUSTED;
    }
    for (int i = 0; i < MT_HEIGHT_MAX; i++)
        m->tail[i] = m->head;
    atomic_init(&m->refs, 1);
    atomic_init(&m->height, 1);
    atomic_init(&m->bytes, mt_arena_bytes(m));
    atomic_init(&m->max_lsn, 0);
    atomic_init(&m->has_entries, false);
    *out = m;
    return ST_OK;
}

void sto_memtable_ref(sto_memtable *m) {
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

void sto_memtable_unref(sto_memtable *m) {
    if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
        return;
    st_arena_deinit(&m->arena);
    st_arena_deinit(&m->varena);
    st_buf_free(&m->key_buf);
    free(m);
}

size_t sto_memtable_bytes(sto_memtable *m) {
    return atomic_load_explicit(&m->bytes, memory_order_relaxed);
}
uint64_t sto_memtable_max_lsn(sto_memtable *m) {
    return atomic_load_explicit(&m->max_lsn, memory_order_acquire);
}
bool sto_memtable_empty(sto_memtable *m) {
    return !atomic_load_explicit(&m->has_entries, memory_order_acquire);
}

static int mt_random_height(sto_memtable *m) {
    int h = 1;
    while (h < MT_HEIGHT_MAX && st_rng_below(&m->rng, MT_BRANCHING) == 0)
        h++;
    return h;
}

/* First node with key >= target (NULL = none); fills prev[level] when prev is not NULL. */
static mt_node *mt_find_ge(sto_memtable *m, st_slice target, mt_node **prev) {
    mt_node *x = m->head;
    int level = atomic_load_explicit(&m->height, memory_order_relaxed) - 1;
    for (;;) {
        mt_node *next = mt_next(x, level);
        if (next && mt_cmp(mt_key(next), target) < 0) {
            x = next;
            continue;
        }
        if (prev)
            prev[level] = x;
        if (level == 0)
            return next;
        level--;
    }
}

/* Last node with key < target (head when none). */
static mt_node *mt_find_lt(sto_memtable *m, st_slice target) {
    mt_node *x = m->head;
    int level = atomic_load_explicit(&m->height, memory_order_relaxed) - 1;
    for (;;) {
        mt_node *next = mt_next(x, level);
        if (next && mt_cmp(mt_key(next), target) < 0) {
            x = next;
            continue;
        }
        if (level == 0)
            return x;
        level--;
    }
}

static mt_node *mt_find_last(sto_memtable *m) {
    mt_node *x = m->head;
    int level = atomic_load_explicit(&m->height, memory_order_relaxed) - 1;
    for (;;) {
        mt_node *next = mt_next(x, level);
        if (next) {
            x = next;
            continue;
        }
        if (level == 0)
            return x;
        level--;
    }
}

static const mt_rec *mt_rec_new(sto_memtable *m, st_slice value, uint64_t lsn,
                                const mt_rec *older) {
    mt_rec *r = st_arena_alloc(&m->varena, sizeof *r + value.len);
    if (!r)
        return NULL;
    r->lsn = lsn;
    r->older = older;
    r->len = value.len;
    if (value.len)
        memcpy(r->bytes, value.data, value.len);
    return r;
}

/* Links a new node after prev[] at every level of its height, bottom up, each with a release
 * store after the node's own link is set (LevelDB's Insert). */
static st_code mt_link(sto_memtable *m, st_slice key, const mt_rec *rec, mt_node **prev) {
    int height = mt_random_height(m);
    int cur = atomic_load_explicit(&m->height, memory_order_relaxed);
    for (int i = cur; i < height; i++)
        prev[i] = m->head;
    mt_node *n = mt_node_new(m, key, height);
    if (!n)
        return ST_RESOURCE_EXHAUSTED;
    atomic_store_explicit(&n->rec, rec, memory_order_relaxed);
    if (height > cur)
        atomic_store_explicit(&m->height, height, memory_order_relaxed);
    for (int i = 0; i < height; i++) {
        atomic_store_explicit(&n->next[i],
                              atomic_load_explicit(&prev[i]->next[i], memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&prev[i]->next[i], n, memory_order_release);
        if (prev[i] == m->tail[i])
            m->tail[i] = n; /* linked after the last node: n is the new last */
    }
    return ST_OK;
}

/* The insert position of key: like mt_find_ge, but a key above the last one (a sequential load)
 * takes prev[] from the tail fingers after a single comparison. */
static mt_node *mt_find_insert(sto_memtable *m, st_slice key, mt_node **prev) {
    mt_node *last = m->tail[0];
    if (last != m->head) {
        int c = mt_cmp(mt_key(last), key);
        if (c < 0) {
            int height = atomic_load_explicit(&m->height, memory_order_relaxed);
            for (int i = 0; i < height; i++)
                prev[i] = m->tail[i];
            return NULL;
        }
        if (c == 0)
            return last; /* a replace: prev[] is not needed */
    }
    return mt_find_ge(m, key, prev);
}

/* Prefetches for writing the arena bytes the next entry of about this size will take. A
 * memtable outgrows the CPU caches, so its arena is cold: copying a value into it missed on
 * every line, and the next atomic operation of the write path (a lock, a counter) waited for
 * all those stores. Entries come microseconds apart, time enough for the lines to arrive. */
static void mt_warm(const st_arena *a, size_t n) {
    if (n > MT_WARM_BYTES_MAX)
        n = MT_WARM_BYTES_MAX;
    if (n > a->avail)
        n = a->avail;
    for (size_t off = 0; off < n; off += 64)
        __builtin_prefetch(a->ptr + off, 1, 3);
}

static void mt_warm_next(sto_memtable *m, size_t key_bytes, size_t value_bytes) {
    mt_warm(&m->arena, key_bytes + sizeof(mt_node) + 4 * sizeof(mt_node *) + 16);
    mt_warm(&m->varena, value_bytes + sizeof(mt_rec) + 16);
}

st_code sto_memtable_put(sto_memtable *m, st_slice ikey, st_slice value, uint64_t lsn) {
    if (ikey.len > UINT32_MAX)
        return ST_INVALID_ARGUMENT;
    mt_node *prev[MT_HEIGHT_MAX];
    mt_node *x = mt_find_insert(m, ikey, prev);
    st_code rc;
    if (x && st_slice_eq(mt_key(x), ikey)) {
        const mt_rec *old = atomic_load_explicit(&x->rec, memory_order_relaxed);
        const mt_rec *rec = mt_rec_new(m, value, lsn, old);
        if (!rec)
            return ST_RESOURCE_EXHAUSTED;
        atomic_store_explicit(&x->rec, rec, memory_order_release);
        rc = ST_OK;
    } else {
        const mt_rec *rec = mt_rec_new(m, value, lsn, NULL);
        rc = rec ? mt_link(m, ikey, rec, prev) : ST_RESOURCE_EXHAUSTED;
    }
    atomic_store_explicit(&m->bytes, mt_arena_bytes(m), memory_order_relaxed);
    if (rc != ST_OK)
        return rc;
    mt_warm_next(m, ikey.len, value.len);
    if (lsn > atomic_load_explicit(&m->max_lsn, memory_order_relaxed))
        atomic_store_explicit(&m->max_lsn, lsn, memory_order_release);
    atomic_store_explicit(&m->has_entries, true, memory_order_release);
    return ST_OK;
}

/* ---- applying row mutations ---- */

/* A SET_CELL or DEL_COLUMN of a row mutation, to sort by column and then by list position. */
typedef struct mt_cov_ent {
    const sto_mut *m;
    size_t idx;
} mt_cov_ent;

static int mt_cov_ent_cmp(const void *pa, const void *pb) {
    const mt_cov_ent *a = pa, *b = pb;
    int c = st_slice_cmp(a->m->family, b->m->family);
    if (!c)
        c = st_slice_cmp(a->m->qualifier, b->m->qualifier);
    if (!c)
        c = a->idx < b->idx ? -1 : a->idx > b->idx;
    return c;
}

static int mt_cov_fam_cmp(const void *pa, const void *pb) {
    const mt_cov_ent *a = pa, *b = pb;
    int c = st_slice_cmp(a->m->family, b->m->family);
    if (!c)
        c = a->idx < b->idx ? -1 : a->idx > b->idx;
    return c;
}

static int mt_i64_cmp(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

/* The first i in [0, n) with v[i] >= x, or n. */
static size_t mt_lower_bound(const int64_t *v, size_t n, int64_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first unmarked slot >= x (slots marked point onward; n = none), compressing the path. */
static size_t mt_next_unmarked(size_t *next, size_t x) {
    size_t r = x;
    while (next[r] != r)
        r = next[r];
    while (next[x] != r) {
        size_t up = next[x];
        next[x] = r;
        x = up;
    }
    return r;
}

/* Settles the SET_CELLs of one column, ents[0..n) sorted by list position (SET_CELLs and
 * DEL_COLUMNs of the same family and qualifier): walking from the end, each DEL_COLUMN marks the
 * distinct timestamps of the column's cells it holds, each SET_CELL is removed when its timestamp
 * is marked. Every timestamp is marked once (next[] skips the marked ones), so the column costs
 * O(n log n) however many deletes and ranges it has. ts, marked and next have room for n (+1). */
static void mt_cov_column(const mt_cov_ent *ents, size_t n, bool *removed, int64_t *ts,
                          bool *marked, size_t *next) {
    size_t k = 0;
    bool any_del = false;
    for (size_t i = 0; i < n; i++) {
        if (ents[i].m->type == STO_MUT_SET_CELL)
            ts[k++] = ents[i].m->ts_us;
        else if (k)
            any_del = true; /* a delete after one of the cells */
    }
    if (!any_del)
        return;
    qsort(ts, k, sizeof *ts, mt_i64_cmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || ts[u - 1] != ts[i])
            ts[u++] = ts[i];
    for (size_t i = 0; i <= u; i++) {
        next[i] = i;
        if (i < u)
            marked[i] = false;
    }
    for (size_t i = n; i-- > 0;) {
        const sto_mut *m = ents[i].m;
        if (m->type == STO_MUT_SET_CELL) {
            if (marked[mt_lower_bound(ts, u, m->ts_us)])
                removed[ents[i].idx] = true;
            continue;
        }
        if (m->ts_end_us <= m->ts_start_us)
            continue;
        size_t hi = mt_lower_bound(ts, u, m->ts_end_us);
        for (size_t x = mt_next_unmarked(next, mt_lower_bound(ts, u, m->ts_start_us)); x < hi;
             x = mt_next_unmarked(next, x + 1)) {
            marked[x] = true;
            next[x] = x + 1;
        }
    }
}

/* Within one row mutation all entries share one version, so "later delete wins" has to be
 * settled here, by not writing a SetCell that a later delete covers (Bigtable applies a row's
 * mutations in list order): a DeleteFromFamily of its family, a DeleteFromColumn of its column
 * whose range holds its timestamp, or a DeleteFromRow unless the family is a system one
 * (strata/storage.h). Sorting the SetCells and deletes by column keeps this O(n log n). */
st_code sto_memtable_sets_removed(const sto_row_mut *row, bool **out) {
    *out = NULL;
    size_t first_set = SIZE_MAX, last_del = SIZE_MAX, n_ents = 0, n_fam_dels = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        sto_mut_type t = row->muts[i].type;
        if (t == STO_MUT_SET_CELL && first_set == SIZE_MAX)
            first_set = i;
        if (t == STO_MUT_SET_CELL || t == STO_MUT_DEL_COLUMN)
            n_ents++;
        if (t == STO_MUT_DEL_FAMILY)
            n_fam_dels++;
        if (t == STO_MUT_DEL_COLUMN || t == STO_MUT_DEL_FAMILY || t == STO_MUT_DEL_ROW)
            last_del = i;
    }
    if (first_set == SIZE_MAX || last_del == SIZE_MAX || last_del < first_set)
        return ST_OK; /* the common case: no delete after a cell, nothing to allocate */
    bool *removed = calloc(row->n_muts, sizeof *removed);
    mt_cov_ent *ents = malloc((n_ents + n_fam_dels) * sizeof *ents);
    int64_t *ts = malloc(n_ents * sizeof *ts);
    bool *marked = malloc(n_ents * sizeof *marked);
    size_t *next = malloc((n_ents + 1) * sizeof *next);
    if (!removed || !ents || !ts || !marked || !next) {
        free(removed);
        free(ents);
        free(ts);
        free(marked);
        free(next);
        return ST_RESOURCE_EXHAUSTED;
    }
    /* A row delete: the last one covers every cell before it but those of system families. */
    size_t last_row_del = SIZE_MAX;
    for (size_t i = 0; i < row->n_muts; i++)
        if (row->muts[i].type == STO_MUT_DEL_ROW)
            last_row_del = i;
    /* Family deletes: sorted by family, the last of each family covers its cells before it. */
    mt_cov_ent *fams = ents + n_ents;
    size_t e = 0, f = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        const sto_mut *m = &row->muts[i];
        if (m->type == STO_MUT_SET_CELL || m->type == STO_MUT_DEL_COLUMN)
            ents[e++] = (mt_cov_ent){m, i};
        else if (m->type == STO_MUT_DEL_FAMILY)
            fams[f++] = (mt_cov_ent){m, i};
    }
    qsort(fams, f, sizeof *fams, mt_cov_fam_cmp);
    qsort(ents, e, sizeof *ents, mt_cov_ent_cmp);
    for (size_t i = 0; i < row->n_muts; i++) {
        const sto_mut *s = &row->muts[i];
        if (s->type != STO_MUT_SET_CELL)
            continue;
        if (last_row_del != SIZE_MAX && last_row_del > i && !sto_family_is_system(s->family)) {
            removed[i] = true;
            continue;
        }
        /* The first family delete of a greater family, less one: the last of s's family. */
        size_t lo = 0, hi = f;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (st_slice_cmp(fams[mid].m->family, s->family) <= 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo > 0 && st_slice_eq(fams[lo - 1].m->family, s->family) && fams[lo - 1].idx > i)
            removed[i] = true;
    }
    for (size_t a = 0, b; a < e; a = b) {
        for (b = a + 1; b < e && st_slice_eq(ents[b].m->family, ents[a].m->family) &&
                        st_slice_eq(ents[b].m->qualifier, ents[a].m->qualifier);
             b++)
            ;
        mt_cov_column(ents + a, b - a, removed, ts, marked, next);
    }
    free(ents);
    free(ts);
    free(marked);
    free(next);
    *out = removed;
    return ST_OK;
}

/* Fills k for muts[i]; false when the mutation writes nothing (an empty time range, or a cell a
 * later delete of the same mutation removes: removed, NULL = none). */
static bool mt_mut_key(const sto_row_mut *row, size_t i, const bool *removed, sto_key *k) {
    const sto_mut *mu = &row->muts[i];
    memset(k, 0, sizeof *k);
    k->row = row->row;
    k->family = mu->family;
    k->qualifier = mu->qualifier;
    k->version = row->version;
    switch (mu->type) {
    case STO_MUT_SET_CELL:
        k->kind = STO_KEY_CELL;
        k->ts_us = mu->ts_us;
        return !(removed && removed[i]);
    case STO_MUT_DEL_COLUMN:
        k->kind = STO_KEY_COLUMN_DEL;
        /* Stored cells have ts >= 0, so a negative start means the same as 0. */
        k->del_start_us = mu->ts_start_us < 0 ? 0 : mu->ts_start_us;
        k->del_end_us = mu->ts_end_us;
        return k->del_end_us > k->del_start_us;
    case STO_MUT_DEL_FAMILY:
        k->kind = STO_KEY_FAMILY_DEL;
        return true;
    case STO_MUT_DEL_ROW:
        k->kind = STO_KEY_ROW_DEL;
        return true;
    }
    return false;
}

/* Encodes every key first (into m->key_buf, as offsets) so a bad mutation fails before anything
 * is inserted; only running out of memory can stop the inserts half-way. */
st_code sto_memtable_apply(sto_memtable *m, const sto_row_mut *row, uint64_t lsn) {
    for (size_t i = 0; i < row->n_muts; i++)
        if (row->muts[i].type < STO_MUT_SET_CELL || row->muts[i].type > STO_MUT_DEL_ROW)
            return ST_INVALID_ARGUMENT;
    bool *removed;
    st_code rc = sto_memtable_sets_removed(row, &removed);
    if (rc != ST_OK)
        return rc;
    st_buf_reset(&m->key_buf);
    for (size_t i = 0; i < row->n_muts && rc == ST_OK; i++) {
        sto_key k;
        size_t start = m->key_buf.len;
        /* Each key is preceded by its length so the second pass can find it. */
        if ((rc = st_buf_append_fixed64(&m->key_buf, 0)) != ST_OK)
            break;
        if (mt_mut_key(row, i, removed, &k))
            rc = sto_key_encode(&m->key_buf, &k);
        st_put_fixed64(m->key_buf.data + start, m->key_buf.len - start - 8);
    }
    free(removed);
    if (rc != ST_OK)
        return rc;
    size_t pos = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        uint64_t klen = st_get_fixed64(m->key_buf.data + pos);
        st_slice key = st_slice_make(m->key_buf.data + pos + 8, (size_t)klen);
        pos += 8 + (size_t)klen;
        if (klen == 0)
            continue;
        st_slice value =
            row->muts[i].type == STO_MUT_SET_CELL ? row->muts[i].value : st_slice_make(NULL, 0);
        if ((rc = sto_memtable_put(m, key, value, lsn)) != ST_OK)
            return rc;
    }
    return ST_OK;
}

/* ---- iterator ---- */

typedef struct mt_iter {
    sto_kviter base;
    sto_memtable *m;
    uint64_t max_lsn;
    mt_node *node;     /* NULL = not valid */
    const mt_rec *rec; /* the record visible at max_lsn */
} mt_iter;

/* The newest record of n with lsn <= max_lsn, or NULL when n is invisible to the snapshot. */
static const mt_rec *mt_visible(const mt_node *n, uint64_t max_lsn) {
    const mt_rec *r = atomic_load_explicit(&n->rec, memory_order_acquire);
    while (r && r->lsn > max_lsn)
        r = r->older;
    return r;
}

/* Moves forward from n to the first node visible to the snapshot. */
static void mt_settle_forward(mt_iter *it, mt_node *n) {
    while (n && !(it->rec = mt_visible(n, it->max_lsn)))
        n = mt_next(n, 0);
    it->node = n;
}

/* Moves backward from n (head = none) to the first node visible to the snapshot. */
static void mt_settle_backward(mt_iter *it, mt_node *n) {
    while (n != it->m->head && !(it->rec = mt_visible(n, it->max_lsn)))
        n = mt_find_lt(it->m, mt_key(n));
    it->node = n == it->m->head ? NULL : n;
}

static void mt_iter_seek(sto_kviter *b, st_slice target) {
    mt_iter *it = (mt_iter *)b;
    mt_settle_forward(it, mt_find_ge(it->m, target, NULL));
}
static void mt_iter_seek_first(sto_kviter *b) {
    mt_iter *it = (mt_iter *)b;
    mt_settle_forward(it, mt_next(it->m->head, 0));
}
static void mt_iter_seek_last(sto_kviter *b) {
    mt_iter *it = (mt_iter *)b;
    mt_settle_backward(it, mt_find_last(it->m));
}
static void mt_iter_next(sto_kviter *b) {
    mt_iter *it = (mt_iter *)b;
    ST_ASSERT(it->node);
    mt_settle_forward(it, mt_next(it->node, 0));
}
static void mt_iter_prev(sto_kviter *b) {
    mt_iter *it = (mt_iter *)b;
    ST_ASSERT(it->node);
    mt_settle_backward(it, mt_find_lt(it->m, mt_key(it->node)));
}
static bool mt_iter_valid(sto_kviter *b) {
    return ((mt_iter *)b)->node != NULL;
}
static st_slice mt_iter_key(sto_kviter *b) {
    return mt_key(((mt_iter *)b)->node);
}
static st_slice mt_iter_value(sto_kviter *b) {
    const mt_rec *r = ((mt_iter *)b)->rec;
    return st_slice_make(r->bytes, r->len);
}
static st_code mt_iter_status(sto_kviter *b, st_err *err) {
    (void)b;
    (void)err;
    return ST_OK;
}
static void mt_iter_free(sto_kviter *b) {
    mt_iter *it = (mt_iter *)b;
    if (!it)
        return;
    sto_memtable_unref(it->m);
    free(it);
}

static const sto_kviter_ops mt_iter_ops = {
    .seek = mt_iter_seek,
    .seek_first = mt_iter_seek_first,
    .seek_last = mt_iter_seek_last,
    .next = mt_iter_next,
    .prev = mt_iter_prev,
    .valid = mt_iter_valid,
    .key = mt_iter_key,
    .value = mt_iter_value,
    .status = mt_iter_status,
    .free = mt_iter_free,
};

sto_kviter *sto_memtable_iter_new(sto_memtable *m, uint64_t max_lsn) {
    mt_iter *it = calloc(1, sizeof *it);
    if (!it)
        return NULL;
    it->base.ops = &mt_iter_ops;
    it->m = m;
    it->max_lsn = max_lsn;
    sto_memtable_ref(m);
    return &it->base;
}
