/* sst_keep.c — the keep slot of sst.h: the last data block a read's iterators let go of that
 * the block cache did not keep, so the next seek of the same read into it does not read it
 * again. */
#include "sst_impl.h"

void sto_sst_keep_init(sto_sst_keep *k) {
    atomic_init(&k->slot, NULL);
    atomic_init(&k->bytes, 0);
}

/* h: a private handle (not in any cache), or NULL. */
static void keep_drop(sto_cache_handle *h) {
    if (h)
        sto_cache_release(NULL, h);
}

void sto_sst_keep_deinit(sto_sst_keep *k) {
    keep_drop(atomic_exchange(&k->slot, NULL));
}

uint64_t sto_sst_keep_bytes_read(sto_sst_keep *k) {
    return atomic_load_explicit(&k->bytes, memory_order_relaxed);
}

void sst_keep_put(sto_sst_keep *k, sto_cache_handle *h) {
    keep_drop(atomic_exchange(&k->slot, h));
}

/* Another block found in the slot is put back (unless the slot was refilled meanwhile: then the
 * newer one stays). */
sto_cache_handle *sst_keep_take(sto_sst_keep *k, uint64_t id, uint64_t off) {
    if (!k || !atomic_load_explicit(&k->slot, memory_order_relaxed))
        return NULL;
    sto_cache_handle *h = atomic_exchange(&k->slot, NULL);
    if (!h || (h->id == id && h->off == off))
        return h;
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&k->slot, &none, h))
        keep_drop(h);
    return NULL;
}
