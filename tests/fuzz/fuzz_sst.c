/* fuzz_sst: SSTable footer, index, filter, meta and data-block decoding on arbitrary bytes. Since
 * mutated files almost never pass their checksums, the input is also decoded directly as block
 * contents (restart array, entries) and as a bloom filter, behind the checksum. Then the input
 * becomes a table file in an in-memory env; the table is opened (with a small block cache)
 * and, when it opens, iterated fully forward and backward, sought at keys taken from the input
 * and from the table itself, and sampled. Properties: no crash, leak or out-of-bounds read; every
 * failure is ST_DATA_LOSS (or ST_INTERNAL). Key order is not asserted: an input whose checksums
 * are all valid may hold unsorted entries, which the reader need not detect (it never trusts order
 * for memory safety); sst_test checks order on real tables. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "block.h"
#include "bloom.h"
#include "sst.h"

#define FUZZ_STEPS_MAX 100000 /* bounds the work per input */
#define FUZZ_SEEKS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void count_block(st_slice last_ikey, uint64_t end_offset, void *arg) {
    (void)last_ikey;
    uint64_t *last = arg;
    ST_ASSERT(end_offset > *last);
    *last = end_offset;
}

/* Walks the whole table in one direction; returns entries seen, sets *rc to the final status. */
static uint64_t walk(sto_sst *t, bool forward, st_code *rc) {
    sto_kviter *it = sto_sst_iter_new(t);
    ST_ASSERT(it != NULL);
    uint64_t n = 0;
    if (forward)
        it->ops->seek_first(it);
    else
        it->ops->seek_last(it);
    for (; it->ops->valid(it) && n < FUZZ_STEPS_MAX; n++) {
        st_slice k = it->ops->key(it), v = it->ops->value(it);
        /* touch every byte so ASan sees any out-of-bounds slice */
        (void)st_hash64(k.data, k.len, st_hash64(v.data, v.len, 0));
        if (forward)
            it->ops->next(it);
        else
            it->ops->prev(it);
    }
    st_err err;
    *rc = it->ops->status(it, &err);
    ST_ASSERT(*rc == ST_OK || *rc == ST_DATA_LOSS || *rc == ST_INTERNAL);
    it->ops->free(it);
    return n;
}

static void seek_some(sto_sst *t, const uint8_t *data, size_t size) {
    sto_kviter *it = sto_sst_iter_new(t);
    ST_ASSERT(it != NULL);
    for (size_t i = 0; i < FUZZ_SEEKS; i++) {
        size_t off = size ? (i * 131) % size : 0, len = size - off < 24 ? size - off : 24;
        st_slice target = st_slice_make(data + off, len);
        it->ops->seek(it, target);
        if (it->ops->valid(it))
            it->ops->prev(it);
        if (it->ops->valid(it))
            it->ops->next(it);
        (void)sto_sst_may_contain_row(t, target);
        (void)sto_sst_approx_offset(t, target);
    }
    it->ops->free(it);
}

/* The input as raw block contents, as if its checksum had matched. */
static void fuzz_block(const uint8_t *data, size_t size) {
    sto_block b;
    if (sto_block_parse(st_slice_make(data, size), &b, NULL) != ST_OK)
        return;
    sto_block_iter it;
    sto_block_iter_init(&it);
    sto_block_iter_set(&it, &b);
    int steps = 0;
    for (sto_block_iter_seek_first(&it); sto_block_iter_valid(&it) && steps < FUZZ_STEPS_MAX;
         steps++)
        sto_block_iter_next(&it);
    for (sto_block_iter_seek_last(&it); sto_block_iter_valid(&it) && steps < 2 * FUZZ_STEPS_MAX;
         steps++)
        sto_block_iter_prev(&it);
    sto_block_iter_seek(&it, st_slice_make(data, size < 8 ? size : 8));
    if (sto_block_iter_valid(&it)) {
        st_slice k = sto_block_iter_key(&it);
        (void)st_hash64(k.data, k.len, st_hash64(it.value.data, it.value.len, 0));
    }
    sto_block_iter_deinit(&it);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_block(data, size);
    (void)sto_bloom_may_contain(st_slice_make(data, size), ST_SLICE_LIT("row"));
    st_env *env = st_env_mem_new();
    ST_ASSERT(env != NULL);
    const char *path = "/fuzz/t.sst";
    ST_ASSERT(env->ops->mkdirs(env, "/fuzz", NULL) == ST_OK);
    ST_ASSERT(st_env_write_atomic(env, path, data, size, NULL) == ST_OK);
    sto_cache *cache;
    ST_ASSERT(sto_cache_new(64 << 10, &cache) == ST_OK);
    sto_sst *t;
    st_err err;
    st_code rc = sto_sst_open(env, path, 1, cache, &t, &err);
    ST_ASSERT(rc == ST_OK || rc == ST_DATA_LOSS || rc == ST_INTERNAL);
    if (rc == ST_OK) {
        st_code frc, brc;
        (void)walk(t, true, &frc);
        (void)walk(t, false, &brc);
        seek_some(t, data, size);
        uint64_t last = 0;
        sto_sst_for_each_block(t, count_block, &last);
        (void)sto_sst_smallest(t);
        (void)sto_sst_largest(t);
        sto_sst_unref(t);
    }
    sto_cache_free(cache);
    env->ops->destroy(env);
    return 0;
}
