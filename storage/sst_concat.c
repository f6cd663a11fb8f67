/* sst_concat.c — tables with disjoint key ranges read as one stream (sst.h). */
#include <stdlib.h>
#include <string.h>

#include "sst_impl.h"

/* Tables with disjoint key ranges, ascending, read as one stream with only the table under the
 * position open: a seek reads a block of one table instead of one block of every table a
 * merge would hold (LevelDB's level iterator). */
typedef struct concat_iter {
    sto_kviter base;
    sto_sst **tabs;
    bool *wrap;
    size_t n, cur; /* cur: index of the open child (meaningless when child is NULL) */
    sto_kviter *child;
    st_buf lo, hi;
    sto_sst_wrap_fn wrap_fn;
    sto_sst_keep *keep;
    st_code status;
    st_err err;
} concat_iter;

static void cc_fail(concat_iter *c, st_code rc, const char *what) {
    if (c->status == ST_OK) {
        c->status = rc;
        st_err_set(&c->err, rc, "%s", what);
    }
}

static void cc_close(concat_iter *c) {
    if (c->child)
        c->child->ops->free(c->child);
    c->child = NULL;
}

/* Opens table i as the child; false (status set) when memory runs out. */
static bool cc_open(concat_iter *c, size_t i) {
    cc_close(c);
    sto_kviter *it = sto_sst_iter_new_kept(c->tabs[i], c->keep);
    if (it && c->wrap[i])
        it = c->wrap_fn(it, st_buf_slice(&c->lo), st_buf_slice(&c->hi));
    if (!it) {
        cc_fail(c, ST_RESOURCE_EXHAUSTED, "out of memory opening an SSTable iterator");
        return false;
    }
    c->child = it;
    c->cur = i;
    return true;
}

/* A child at its end moves on to the next table; a child with an error stops everything. */
static void cc_skip_forward(concat_iter *c) {
    while (c->child && !c->child->ops->valid(c->child)) {
        if (c->child->ops->status(c->child, NULL) != ST_OK || c->cur + 1 >= c->n) {
            if (c->child->ops->status(c->child, NULL) == ST_OK)
                cc_close(c);
            return;
        }
        if (!cc_open(c, c->cur + 1))
            return;
        c->child->ops->seek_first(c->child);
    }
}

static void cc_skip_backward(concat_iter *c) {
    while (c->child && !c->child->ops->valid(c->child)) {
        if (c->child->ops->status(c->child, NULL) != ST_OK || c->cur == 0) {
            if (c->child->ops->status(c->child, NULL) == ST_OK)
                cc_close(c);
            return;
        }
        if (!cc_open(c, c->cur - 1))
            return;
        c->child->ops->seek_last(c->child);
    }
}

static bool cc_ok(concat_iter *c) {
    if (c->status != ST_OK)
        return false;
    if (c->child && c->child->ops->status(c->child, NULL) != ST_OK)
        return false;
    return true;
}

static void cc_seek(sto_kviter *base, st_slice target) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c))
        return;
    size_t lo = 0, hi = c->n; /* first table whose largest key is >= target */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (st_slice_cmp(sto_sst_largest(c->tabs[mid]), target) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == c->n) {
        cc_close(c);
        return;
    }
    if (!(c->child && c->cur == lo) && !cc_open(c, lo))
        return;
    c->child->ops->seek(c->child, target);
    cc_skip_forward(c);
}

static void cc_seek_first(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c) || c->n == 0 || (!(c->child && c->cur == 0) && !cc_open(c, 0)))
        return;
    c->child->ops->seek_first(c->child);
    cc_skip_forward(c);
}

static void cc_seek_last(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_ok(c) || c->n == 0 || (!(c->child && c->cur == c->n - 1) && !cc_open(c, c->n - 1)))
        return;
    c->child->ops->seek_last(c->child);
    cc_skip_backward(c);
}

static bool cc_valid(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->status == ST_OK && c->child && c->child->ops->valid(c->child);
}

static void cc_next(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_valid(base))
        return;
    c->child->ops->next(c->child);
    cc_skip_forward(c);
}

static void cc_prev(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    if (!cc_valid(base))
        return;
    c->child->ops->prev(c->child);
    cc_skip_backward(c);
}

static st_slice cc_key(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->child->ops->key(c->child);
}

static st_slice cc_value(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    return c->child->ops->value(c->child);
}

static st_code cc_status(sto_kviter *base, st_err *err) {
    concat_iter *c = (concat_iter *)base;
    if (c->status != ST_OK) {
        if (err)
            *err = c->err;
        return c->status;
    }
    return c->child ? c->child->ops->status(c->child, err) : ST_OK;
}

static void cc_free(sto_kviter *base) {
    concat_iter *c = (concat_iter *)base;
    cc_close(c);
    for (size_t i = 0; i < c->n; i++)
        sto_sst_unref(c->tabs[i]);
    st_buf_free(&c->lo);
    st_buf_free(&c->hi);
    free(c);
}

static const sto_kviter_ops concat_ops = {
    .seek = cc_seek,
    .seek_first = cc_seek_first,
    .seek_last = cc_seek_last,
    .next = cc_next,
    .prev = cc_prev,
    .valid = cc_valid,
    .key = cc_key,
    .value = cc_value,
    .status = cc_status,
    .free = cc_free,
};

static int cc_cmp_smallest(const void *a, const void *b) {
    const sto_sst *x = *(sto_sst *const *)a, *y = *(sto_sst *const *)b;
    return st_slice_cmp(sto_sst_smallest(x), sto_sst_smallest(y));
}

bool sto_sst_disjoint(const sto_sst *a, const sto_sst *b) {
    return st_slice_cmp(sto_sst_largest(a), sto_sst_smallest(b)) < 0 ||
           st_slice_cmp(sto_sst_largest(b), sto_sst_smallest(a)) < 0;
}

sto_kviter *sto_sst_concat_iter_new(sto_sst *const *tables, const bool *wrap, size_t n, st_slice lo,
                                    st_slice hi, sto_sst_wrap_fn wrap_fn, sto_sst_keep *keep) {
    if (n == 0 || n > STO_SST_CONCAT_MAX)
        return NULL;
    /* One allocation: the iterator, then the tables (sorted), then their wrap flags. */
    concat_iter *c = calloc(1, sizeof *c + n * (sizeof(sto_sst *) + sizeof(bool)));
    if (!c)
        return NULL;
    c->base.ops = &concat_ops;
    c->tabs = (sto_sst **)(void *)(c + 1);
    c->wrap = (bool *)(void *)(c->tabs + n);
    c->n = n;
    c->wrap_fn = wrap_fn;
    c->keep = keep;
    st_buf_init(&c->lo);
    st_buf_init(&c->hi);
    memcpy(c->tabs, tables, n * sizeof *c->tabs);
    qsort(c->tabs, n, sizeof *c->tabs, cc_cmp_smallest);
    bool need_bounds = false;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0; /* the flag travels with its table through the sort */
        while (tables[j] != c->tabs[i])
            j++;
        c->wrap[i] = wrap ? wrap[j] : false;
        need_bounds = need_bounds || c->wrap[i];
        ST_ASSERT(i == 0 || sto_sst_disjoint(c->tabs[i - 1], c->tabs[i]));
    }
    if (need_bounds && (!wrap_fn || (lo.len && st_buf_append(&c->lo, lo.data, lo.len) != ST_OK) ||
                        (hi.len && st_buf_append(&c->hi, hi.data, hi.len) != ST_OK))) {
        st_buf_free(&c->lo);
        st_buf_free(&c->hi);
        free(c);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        sto_sst_ref(c->tabs[i]);
    return &c->base;
}
