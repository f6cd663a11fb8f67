/* h2mem.c — the allocator every nghttp2 session of this layer uses (h2_mem).
 *
 * nghttp2 allocates a dozen small blocks per call (stream, outbound items, header arrays, HPACK
 * entries) and frees them soon after, in bursts of as many calls as are in flight: more than
 * malloc's per-thread cache holds (7 blocks per size), so most went through malloc's slower bins
 * (a quarter of a proxying router's allocator time). Blocks of up to H2_MEM_CLASS_MAX bytes are
 * taken from and returned to per-thread free lists of a few size classes instead; larger ones
 * go to malloc. Each block carries a 16-byte header with its class, as free gets no size. The
 * lists are bounded and drained at thread exit; under AddressSanitizer nothing is kept, so
 * use-after-free still faults there. */
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "rpc_internal.h"

#define H2_MEM_CLASSES 6         /* 64, 128, 256, 512, 1024, 2048 bytes with the header */
#define H2_MEM_CLASS_MIN_SHIFT 6 /* the smallest class: 64 bytes */
#define H2_MEM_CLASS_MAX ((size_t)2048)
#define H2_MEM_KEEP_MAX 512         /* blocks kept per class and thread */
#define H2_MEM_HEADER 16            /* keeps malloc's 16-byte alignment */
#define H2_MEM_UNCLASSED UINT32_MAX /* a block from malloc, of any size */

typedef struct h2_mem_block {
    union {
        struct {
            uint32_t cls;
            size_t size; /* usable bytes */
        } h;
        struct h2_mem_block *next; /* while on a free list */
        unsigned char pad[H2_MEM_HEADER];
    } u;
} h2_mem_block;

_Static_assert(sizeof(h2_mem_block) == H2_MEM_HEADER, "the header keeps 16-byte alignment");

typedef struct h2_mem_cache {
    h2_mem_block *head[H2_MEM_CLASSES];
    uint32_t n[H2_MEM_CLASSES];
    bool registered; /* drained at thread exit */
} h2_mem_cache;

static _Thread_local h2_mem_cache tl_h2_mem;

static void h2_mem_drain(void *arg) {
    h2_mem_cache *mc = arg;
    for (size_t c = 0; c < H2_MEM_CLASSES; c++) {
        while (mc->head[c]) {
            h2_mem_block *b = mc->head[c];
            mc->head[c] = b->u.next;
            free(b);
        }
        mc->n[c] = 0;
    }
}

/* The class holding size usable bytes, or H2_MEM_UNCLASSED. */
static uint32_t h2_mem_class(size_t size) {
    size_t total = size + H2_MEM_HEADER;
    if (!RPC_TL_CACHE_ON || total > H2_MEM_CLASS_MAX)
        return H2_MEM_UNCLASSED;
    uint32_t c = 0;
    while (((size_t)1 << (c + H2_MEM_CLASS_MIN_SHIFT)) < total)
        c++;
    return c;
}

static size_t h2_mem_class_size(uint32_t c) {
    return ((size_t)1 << (c + H2_MEM_CLASS_MIN_SHIFT)) - H2_MEM_HEADER;
}

static void *h2_mem_malloc(size_t size, void *ud) {
    (void)ud;
    uint32_t c = h2_mem_class(size);
    h2_mem_block *b;
    if (c != H2_MEM_UNCLASSED && tl_h2_mem.head[c]) {
        b = tl_h2_mem.head[c];
        tl_h2_mem.head[c] = b->u.next;
        tl_h2_mem.n[c]--;
    } else {
        size_t usable = c == H2_MEM_UNCLASSED ? size : h2_mem_class_size(c);
        if (usable > SIZE_MAX - H2_MEM_HEADER || !(b = malloc(H2_MEM_HEADER + usable)))
            return NULL;
    }
    b->u.h.cls = c;
    b->u.h.size = c == H2_MEM_UNCLASSED ? size : h2_mem_class_size(c);
    return b + 1;
}

static void h2_mem_free(void *ptr, void *ud) {
    (void)ud;
    if (!ptr)
        return;
    h2_mem_block *b = (h2_mem_block *)ptr - 1;
    uint32_t c = b->u.h.cls;
    h2_mem_cache *mc = &tl_h2_mem;
    if (c != H2_MEM_UNCLASSED && !mc->registered) {
        mc->registered = rpc_tl_at_thread_exit(h2_mem_drain, mc);
    }
    if (c == H2_MEM_UNCLASSED || !mc->registered || mc->n[c] >= H2_MEM_KEEP_MAX) {
        free(b);
        return;
    }
    b->u.next = mc->head[c];
    mc->head[c] = b;
    mc->n[c]++;
}

static void *h2_mem_calloc(size_t nmemb, size_t size, void *ud) {
    if (size && nmemb > SIZE_MAX / size)
        return NULL;
    void *p = h2_mem_malloc(nmemb * size, ud);
    if (p)
        memset(p, 0, nmemb * size);
    return p;
}

static void *h2_mem_realloc(void *ptr, size_t size, void *ud) {
    if (!ptr)
        return h2_mem_malloc(size, ud);
    h2_mem_block *b = (h2_mem_block *)ptr - 1;
    if (size <= b->u.h.size && b->u.h.cls != H2_MEM_UNCLASSED)
        return ptr; /* still fits its class */
    void *p = h2_mem_malloc(size, ud);
    if (!p)
        return NULL;
    memcpy(p, ptr, b->u.h.size < size ? b->u.h.size : size);
    h2_mem_free(ptr, ud);
    return p;
}

nghttp2_mem *h2_mem(void) {
    static nghttp2_mem mem = {NULL, h2_mem_malloc, h2_mem_free, h2_mem_calloc, h2_mem_realloc};
    return &mem;
}
