/* fuzz_row_mut: sto_row_mut_decode on arbitrary bytes (the log record payload, also what
 * replication ships). Properties: no crash, leak or out-of-bounds read; every decoded slice lies
 * inside the input and respects the documented limits; whatever decodes re-encodes, and the
 * re-encoding decodes to the same row mutation (decoding is a function of the fields, not of
 * how their varints were spelled). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "strata/storage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool inside(st_slice s, const uint8_t *data, size_t size) {
    return s.len == 0 ||
           (s.data >= data && s.len <= size && s.data - data <= (ptrdiff_t)(size - s.len));
}

static void check_same(const sto_row_mut *a, const sto_row_mut *b) {
    ST_ASSERT(a->tablet_id == b->tablet_id && st_slice_eq(a->row, b->row));
    ST_ASSERT(a->version == b->version && a->commit_ts_us == b->commit_ts_us);
    ST_ASSERT(a->origin == b->origin && a->flags == b->flags && a->n_muts == b->n_muts);
    for (size_t i = 0; i < a->n_muts; i++) {
        const sto_mut *x = &a->muts[i], *y = &b->muts[i];
        ST_ASSERT(x->type == y->type && st_slice_eq(x->family, y->family));
        ST_ASSERT(st_slice_eq(x->qualifier, y->qualifier) && st_slice_eq(x->value, y->value));
        ST_ASSERT(x->ts_us == y->ts_us && x->ts_start_us == y->ts_start_us &&
                  x->ts_end_us == y->ts_end_us);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_arena arena;
    st_arena_init(&arena, 4096);
    sto_row_mut row, again;
    if (sto_row_mut_decode(st_slice_make(data, size), &row, &arena)) {
        ST_ASSERT(inside(row.row, data, size) && row.row.len <= STO_ROW_KEY_MAX);
        ST_ASSERT(row.n_muts <= STO_ROW_MUTS_MAX && row.n_muts <= size);
        for (size_t i = 0; i < row.n_muts; i++) {
            const sto_mut *m = &row.muts[i];
            ST_ASSERT(m->type >= STO_MUT_SET_CELL && m->type <= STO_MUT_DEL_ROW);
            ST_ASSERT(inside(m->family, data, size) && inside(m->qualifier, data, size));
            ST_ASSERT(inside(m->value, data, size) && m->value.len <= STO_VALUE_MAX);
            ST_ASSERT(m->qualifier.len <= STO_QUALIFIER_MAX);
            ST_ASSERT(m->type != STO_MUT_SET_CELL || m->ts_us >= 0);
        }
        st_buf b;
        st_buf_init(&b);
        ST_ASSERT(sto_row_mut_encode(&b, &row) == ST_OK);
        ST_ASSERT(b.len <= size); /* canonical varints are never longer */
        ST_ASSERT(sto_row_mut_decode(st_buf_slice(&b), &again, &arena));
        check_same(&row, &again);
        st_buf_free(&b);
    }
    st_arena_deinit(&arena);
    return 0;
}
