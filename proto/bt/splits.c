/* splits.c — CreateTable's initial_splits as the node and the router both apply them. */
#include <stdlib.h>

#include "strata/btutil.h"

static int split_cmp(const void *a, const void *b) {
    const ProtobufCBinaryData *x = a, *y = b;
    return st_slice_cmp(st_slice_make(x->data, x->len), st_slice_make(y->data, y->len));
}

st_code btu_splits_from_pb(const Google__Bigtable__Admin__V2__CreateTableRequest *req, size_t max,
                           st_arena *a, ProtobufCBinaryData **out, size_t *n, st_err *err) {
    if (req->n_initial_splits > max)
        return st_err_set(err, ST_INVALID_ARGUMENT, "at most %zu initial splits", max);
    ProtobufCBinaryData *v = st_arena_alloc(a, (req->n_initial_splits + 1) * sizeof *v);
    if (!v)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < req->n_initial_splits; i++) {
        ProtobufCBinaryData key = req->initial_splits[i]->key;
        if (key.len > BTU_ROW_KEY_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT, "split key longer than %d bytes",
                              BTU_ROW_KEY_MAX);
        if (key.len > 0)
            v[k++] = key;
    }
    qsort(v, k, sizeof *v, split_cmp);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || split_cmp(&v[m - 1], &v[i]) != 0)
            v[m++] = v[i];
    *out = v;
    *n = m;
    return ST_OK;
}
