/* merge.c — the merging iterator (LevelDB's MergingIterator) and the range-restricting wrapper.
 *
 * The merge keeps a binary heap of the valid children ordered by (key, child index): a min-heap
 * going forward, a max-heap going backward, so equal keys come out lower index first forward and
 * in exactly the reverse order backward. Each child's current key is cached next to the heap, so
 * a step costs one child move plus O(log n) memcmps. Changing direction re-seeks every other child
 * around the current key (equal keys of other children sit on the correct side by index). */
#include "key.h"
#include "kviter.h"

#include <stdlib.h>
#include <string.h>

typedef struct merge_child {
    sto_kviter *it;
    st_slice key; /* cached while the child is valid and in the heap */
} merge_child;

typedef struct merge_iter {
    sto_kviter base;
    merge_child *kids;
    size_t n;
    size_t *heap; /* child indexes; heap[0] is the current child */
    size_t heap_len;
    bool reverse; /* the direction the heap is ordered for */
    bool failed;  /* a child reported an error: invalid until the next seek */
} merge_iter;

/* Heap order: negative when a should come out before b in the current direction. */
static int merge_order(const merge_iter *m, size_t a, size_t b) {
    int c = st_slice_cmp(m->kids[a].key, m->kids[b].key);
    if (c == 0)
        c = a < b ? -1 : (a > b ? 1 : 0);
    return m->reverse ? -c : c;
}

static void merge_sift_down(merge_iter *m, size_t pos) {
    size_t *h = m->heap, n = m->heap_len;
    for (;;) {
        size_t l = 2 * pos + 1, best = pos;
        if (l < n && merge_order(m, h[l], h[best]) < 0)
            best = l;
        if (l + 1 < n && merge_order(m, h[l + 1], h[best]) < 0)
            best = l + 1;
        if (best == pos)
            return;
        size_t t = h[pos];
        h[pos] = h[best];
        h[best] = t;
        pos = best;
    }
}

/* Rebuilds the heap from every valid child (after seeks or a direction change). */
static void merge_heapify(merge_iter *m) {
    m->heap_len = 0;
    m->failed = false;
    for (size_t i = 0; i < m->n; i++) {
        sto_kviter *c = m->kids[i].it;
        if (c->ops->valid(c)) {
            m->kids[i].key = c->ops->key(c);
            m->heap[m->heap_len++] = i;
        } else if (c->ops->status(c, NULL) != ST_OK) {
            m->failed = true;
        }
    }
    for (size_t i = m->heap_len / 2; i-- > 0;)
        merge_sift_down(m, i);
}

/* After the top child moved: re-cache its key and restore the heap, or drop it when done. */
static void merge_fix_top(merge_iter *m) {
    sto_kviter *c = m->kids[m->heap[0]].it;
    if (c->ops->valid(c)) {
        m->kids[m->heap[0]].key = c->ops->key(c);
    } else {
        if (c->ops->status(c, NULL) != ST_OK)
            m->failed = true; /* a failed child must not silently drop out of the merge */
        m->heap[0] = m->heap[--m->heap_len];
    }
    if (m->heap_len)
        merge_sift_down(m, 0);
}

static bool merge_valid(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    return m->heap_len > 0 && !m->failed;
}

static st_slice merge_key(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    return m->kids[m->heap[0]].key;
}

static st_slice merge_value(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    sto_kviter *c = m->kids[m->heap[0]].it;
    return c->ops->value(c);
}

static void merge_seek(sto_kviter *b, st_slice target) {
    merge_iter *m = (merge_iter *)b;
    for (size_t i = 0; i < m->n; i++)
        m->kids[i].it->ops->seek(m->kids[i].it, target);
    m->reverse = false;
    merge_heapify(m);
}

static void merge_seek_first(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    for (size_t i = 0; i < m->n; i++)
        m->kids[i].it->ops->seek_first(m->kids[i].it);
    m->reverse = false;
    merge_heapify(m);
}

static void merge_seek_last(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    for (size_t i = 0; i < m->n; i++)
        m->kids[i].it->ops->seek_last(m->kids[i].it);
    m->reverse = true;
    merge_heapify(m);
}

/* Positions every child but cur just after (cur, key) in forward order: at key when its index
 * is higher (it follows cur), past key when lower (it came before). */
static void merge_turn_forward(merge_iter *m) {
    size_t cur = m->heap[0];
    st_slice key = m->kids[cur].key;
    for (size_t i = 0; i < m->n; i++) {
        sto_kviter *c = m->kids[i].it;
        if (i == cur)
            continue;
        c->ops->seek(c, key);
        if (i < cur && c->ops->valid(c) && st_slice_eq(c->ops->key(c), key))
            c->ops->next(c);
    }
    m->reverse = false;
    merge_heapify(m);
}

/* Positions every child but cur just before (cur, key) in forward order. */
static void merge_turn_backward(merge_iter *m) {
    size_t cur = m->heap[0];
    st_slice key = m->kids[cur].key;
    for (size_t i = 0; i < m->n; i++) {
        sto_kviter *c = m->kids[i].it;
        if (i == cur)
            continue;
        c->ops->seek(c, key);
        if (!c->ops->valid(c)) {
            if (c->ops->status(c, NULL) == ST_OK)
                c->ops->seek_last(c);
        } else if (!(i < cur && st_slice_eq(c->ops->key(c), key))) {
            c->ops->prev(c);
        }
    }
    m->reverse = true;
    merge_heapify(m);
}

static void merge_next(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    ST_ASSERT(m->heap_len > 0);
    if (m->reverse)
        merge_turn_forward(m); /* the current child stays on top: it is the smallest now */
    sto_kviter *c = m->kids[m->heap[0]].it;
    c->ops->next(c);
    merge_fix_top(m);
}

static void merge_prev(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    ST_ASSERT(m->heap_len > 0);
    if (!m->reverse)
        merge_turn_backward(m);
    sto_kviter *c = m->kids[m->heap[0]].it;
    c->ops->prev(c);
    merge_fix_top(m);
}

/* The first failing child's error (the merge is invalid once a child failed). */
static st_code merge_status(sto_kviter *b, st_err *err) {
    merge_iter *m = (merge_iter *)b;
    for (size_t i = 0; i < m->n; i++) {
        st_code rc = m->kids[i].it->ops->status(m->kids[i].it, err);
        if (rc != ST_OK)
            return rc;
    }
    return ST_OK;
}

static void merge_free(sto_kviter *b) {
    merge_iter *m = (merge_iter *)b;
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        m->kids[i].it->ops->free(m->kids[i].it);
    free(m);
}

static const sto_kviter_ops merge_ops = {
    .seek = merge_seek,
    .seek_first = merge_seek_first,
    .seek_last = merge_seek_last,
    .next = merge_next,
    .prev = merge_prev,
    .valid = merge_valid,
    .key = merge_key,
    .value = merge_value,
    .status = merge_status,
    .free = merge_free,
};

sto_kviter *sto_merge_iter_new(sto_kviter **children, size_t n) {
    if (n == 1)
        return children[0]; /* a merge of one stream is that stream */
    /* One allocation: the iterator, its children, its heap (a point read makes one per read). */
    size_t alloc_n = n ? n : 1;
    merge_iter *m = calloc(1, sizeof *m + alloc_n * (sizeof *m->kids + sizeof *m->heap));
    if (!m) {
        for (size_t i = 0; i < n; i++)
            children[i]->ops->free(children[i]);
        return NULL;
    }
    m->kids = (merge_child *)(void *)(m + 1);
    m->heap = (size_t *)(void *)(m->kids + alloc_n);
    m->base.ops = &merge_ops;
    m->n = n;
    for (size_t i = 0; i < n; i++)
        m->kids[i].it = children[i];
    return &m->base;
}

/* ---- range restriction ---- */

typedef struct range_iter {
    sto_kviter base;
    sto_kviter *child;
    st_buf lo, hi; /* hi.len == 0: unbounded */
    bool ok;       /* child valid and its key inside [lo, hi) */
} range_iter;

static void range_check(range_iter *r) {
    sto_kviter *c = r->child;
    r->ok = false;
    if (!c->ops->valid(c))
        return;
    st_slice k = c->ops->key(c);
    if (st_slice_cmp(k, st_buf_slice(&r->lo)) < 0)
        return;
    if (r->hi.len && st_slice_cmp(k, st_buf_slice(&r->hi)) >= 0)
        return;
    r->ok = true;
}

static void range_seek(sto_kviter *b, st_slice target) {
    range_iter *r = (range_iter *)b;
    if (st_slice_cmp(target, st_buf_slice(&r->lo)) < 0)
        target = st_buf_slice(&r->lo);
    r->child->ops->seek(r->child, target);
    range_check(r);
}

static void range_seek_first(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    if (r->lo.len)
        r->child->ops->seek(r->child, st_buf_slice(&r->lo));
    else
        r->child->ops->seek_first(r->child);
    range_check(r);
}

static void range_seek_last(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    sto_kviter *c = r->child;
    if (!r->hi.len) {
        c->ops->seek_last(c);
    } else {
        c->ops->seek(c, st_buf_slice(&r->hi));
        if (c->ops->valid(c))
            c->ops->prev(c);
        else if (c->ops->status(c, NULL) == ST_OK)
            c->ops->seek_last(c);
    }
    range_check(r);
}

static void range_next(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    ST_ASSERT(r->ok);
    r->child->ops->next(r->child);
    range_check(r);
}

static void range_prev(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    ST_ASSERT(r->ok);
    r->child->ops->prev(r->child);
    range_check(r);
}

static bool range_valid(sto_kviter *b) {
    return ((range_iter *)b)->ok;
}
static st_slice range_key(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    return r->child->ops->key(r->child);
}
static st_slice range_value(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    return r->child->ops->value(r->child);
}
static st_code range_status(sto_kviter *b, st_err *err) {
    range_iter *r = (range_iter *)b;
    return r->child->ops->status(r->child, err);
}
static void range_free(sto_kviter *b) {
    range_iter *r = (range_iter *)b;
    if (!r)
        return;
    r->child->ops->free(r->child);
    st_buf_free(&r->lo);
    st_buf_free(&r->hi);
    free(r);
}

static const sto_kviter_ops range_ops = {
    .seek = range_seek,
    .seek_first = range_seek_first,
    .seek_last = range_seek_last,
    .next = range_next,
    .prev = range_prev,
    .valid = range_valid,
    .key = range_key,
    .value = range_value,
    .status = range_status,
    .free = range_free,
};

sto_kviter *sto_range_iter_new(sto_kviter *child, st_slice lo, st_slice hi) {
    range_iter *r = calloc(1, sizeof *r);
    if (!r) {
        child->ops->free(child);
        return NULL;
    }
    r->base.ops = &range_ops;
    r->child = child;
    st_buf_init(&r->lo);
    st_buf_init(&r->hi);
    if ((lo.len && st_buf_append(&r->lo, lo.data, lo.len) != ST_OK) ||
        (hi.len && st_buf_append(&r->hi, hi.data, hi.len) != ST_OK)) {
        range_free(&r->base);
        return NULL;
    }
    return &r->base;
}

/* ---- system families hidden (restored files) ----
 * An entry of a system family is enc(row) 0x02 enc(family) ... with enc(family) starting
 * 0x00 0xff (an escaped 0x00, key.h). Within a row they sort before every user family, so going
 * forward one seek to enc(row) 0x02 0x01 (above every system family, at or below every user
 * family) skips them all; going backward they are stepped over one by one (reverse scans of
 * restored tablets only). */

typedef struct nosys_iter {
    sto_kviter base;
    sto_kviter *child;
    st_buf target;
    bool oom;
} nosys_iter;

static bool nosys_is_system(st_slice k, size_t *row_len) {
    size_t rp = sto_key_row_prefix_len(k);
    *row_len = rp;
    return rp && k.len > rp + 2 && k.data[rp] == 0x02 && k.data[rp + 1] == 0x00 &&
           k.data[rp + 2] == 0xff;
}

static void nosys_skip_forward(nosys_iter *s) {
    sto_kviter *c = s->child;
    size_t rp;
    while (c->ops->valid(c) && nosys_is_system(c->ops->key(c), &rp)) {
        st_slice k = c->ops->key(c);
        st_buf_reset(&s->target);
        static const uint8_t past[2] = {0x02, 0x01};
        if (st_buf_append(&s->target, k.data, rp) != ST_OK ||
            st_buf_append(&s->target, past, 2) != ST_OK) {
            s->oom = true;
            return;
        }
        c->ops->seek(c, st_buf_slice(&s->target));
    }
}

static void nosys_skip_backward(nosys_iter *s) {
    sto_kviter *c = s->child;
    size_t rp;
    while (c->ops->valid(c) && nosys_is_system(c->ops->key(c), &rp))
        c->ops->prev(c);
}

static void nosys_seek(sto_kviter *b, st_slice target) {
    nosys_iter *s = (nosys_iter *)b;
    s->child->ops->seek(s->child, target);
    nosys_skip_forward(s);
}
static void nosys_seek_first(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    s->child->ops->seek_first(s->child);
    nosys_skip_forward(s);
}
static void nosys_seek_last(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    s->child->ops->seek_last(s->child);
    nosys_skip_backward(s);
}
static void nosys_next(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    s->child->ops->next(s->child);
    nosys_skip_forward(s);
}
static void nosys_prev(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    s->child->ops->prev(s->child);
    nosys_skip_backward(s);
}
static bool nosys_valid(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    return !s->oom && s->child->ops->valid(s->child);
}
static st_slice nosys_key(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    return s->child->ops->key(s->child);
}
static st_slice nosys_value(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    return s->child->ops->value(s->child);
}
static st_code nosys_status(sto_kviter *b, st_err *err) {
    nosys_iter *s = (nosys_iter *)b;
    if (s->oom)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading a restored table");
    return s->child->ops->status(s->child, err);
}
static void nosys_free(sto_kviter *b) {
    nosys_iter *s = (nosys_iter *)b;
    if (!s)
        return;
    s->child->ops->free(s->child);
    st_buf_free(&s->target);
    free(s);
}

static const sto_kviter_ops nosys_ops = {
    .seek = nosys_seek,
    .seek_first = nosys_seek_first,
    .seek_last = nosys_seek_last,
    .next = nosys_next,
    .prev = nosys_prev,
    .valid = nosys_valid,
    .key = nosys_key,
    .value = nosys_value,
    .status = nosys_status,
    .free = nosys_free,
};

sto_kviter *sto_nosys_iter_new(sto_kviter *child) {
    nosys_iter *s = calloc(1, sizeof *s);
    if (!s) {
        child->ops->free(child);
        return NULL;
    }
    s->base.ops = &nosys_ops;
    s->child = child;
    st_buf_init(&s->target);
    return &s->base;
}
