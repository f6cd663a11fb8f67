/* heap.c — how the processes use glibc's malloc (st_heap_tune, st_heap_release). */
#include "strata/base.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

/* Requests and answers of a MiB or more (a backup import's chunks, bulk MutateRows, node batches
 * of ReadRows) come and go all the time: with glibc's defaults each buffer was a fresh mapping, or
 * a heap top trimmed and grown again, whose every page faults when first touched (a quarter of the
 * node's CPU while it received an import). Up to 8 MiB stays on the heap, and up to 32 MiB of it
 * free at its top. */
void st_heap_tune(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 32 << 20);
#endif
}

/* glibc gives back only the free memory at the top of a heap; what a burst freed below a chunk
 * still in use stays resident for good (a router held 1.4 GB after its stalled calls ended, 13 MB
 * once trimmed). malloc_trim(0) returns the free pages of every arena, wherever they lie. */
size_t st_heap_release(size_t keep_bytes) {
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks > keep_bytes)
        malloc_trim(0);
    return mi.fordblks;
#else
    (void)keep_bytes;
    return 0;
#endif
}
