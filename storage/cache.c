/* cache.c — the sharded LRU block cache (see cache.h). LevelDB's design: each shard keeps the
 * entries only the cache references on an LRU list (evictable) and the entries some reader holds
 * on an in-use list (not evictable, but charged), so eviction never frees a block in use. */
#include "cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define CACHE_BUCKETS_MIN 256 /* initial hash table of a shard; it doubles as entries come */
/* Seed of the key hash: "cache" in ASCII, any constant would do. */
#define CACHE_HASH_SEED 0x6361636865ull
/* The shard is chosen by the hash's top CACHE_SHARD_BITS bits, the bucket by its low bits, and
 * the bucket tag (hash_tag) takes 32 bits from CACHE_TAG_SHIFT up, which neither choice uses for
 * tables of up to 2^24 buckets. */
#define CACHE_SHARD_BITS 4
#define CACHE_TAG_SHIFT 24
_Static_assert((1 << CACHE_SHARD_BITS) == STO_CACHE_SHARDS, "one shard per value of the top bits");

/* A hash chain with the length and a tag (32 bits of the hash) of its first entry: most lookups
 * miss on a cache much smaller than the data, and a miss is now decided from the bucket alone
 * instead of loading every entry of the chain (each one a cache miss of its own). */
typedef struct cache_bucket {
    sto_cache_handle *head;
    uint32_t tag; /* hash_tag of head's hash; meaningless when len is 0 */
    uint32_t len;
} cache_bucket;

typedef struct cache_shard {
    pthread_mutex_t mu;
    size_t capacity, usage;
    sto_cache_handle lru;    /* dummy head; lru.next is the oldest */
    sto_cache_handle in_use; /* dummy head */
    cache_bucket *table;
    size_t buckets, count; /* buckets: a power of two, at least 2 * count */
    uint64_t hits, misses;
} cache_shard;

#define POOL_CLASSES (STO_CACHE_BUF_POOLED_MAX / STO_CACHE_BUF_CLASS_BYTES)

typedef struct pool_buf {
    struct pool_buf *next;
} pool_buf;

typedef struct pool_shard {
    pthread_mutex_t mu;
    pool_buf *free[POOL_CLASSES]; /* class i holds buffers of (i + 1) * CLASS_BYTES */
    size_t bytes;
} pool_shard;

struct sto_cache {
    size_t capacity;
    size_t pool_shard_max; /* bytes one pool shard keeps */
    pool_shard pool[STO_CACHE_POOL_SHARDS];
    atomic_uint next_pool;
    cache_shard shards[STO_CACHE_SHARDS];
    pthread_mutex_t dctx_mu;
    ZSTD_DCtx *dctx[STO_CACHE_DCTX_MAX]; /* idle decompression contexts */
    int n_dctx;
    atomic_uint_fast64_t read_blocks, read_bytes; /* sto_cache_note_read */
};

/* An embedded handle lives in memory the deleter frees: read what is needed first. */
static void delete_entry(sto_cache_handle *e) {
    if (!e)
        return;
    sto_cache_deleter deleter = e->deleter;
    void *value = e->value;
    if (!e->embedded)
        free(e);
    deleter(value);
}

static uint64_t key_hash(uint64_t id, uint64_t off) {
    uint64_t k[2] = {id, off};
    return st_hash64(k, sizeof(k), CACHE_HASH_SEED);
}

static cache_shard *shard_of(sto_cache *c, uint64_t hash) {
    return &c->shards[hash >> (64 - CACHE_SHARD_BITS)];
}

static void list_remove(sto_cache_handle *e) {
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void list_append(sto_cache_handle *head, sto_cache_handle *e) {
    e->next = head;
    e->prev = head->prev;
    e->prev->next = e;
    e->next->prev = e;
}

st_code sto_cache_new(size_t capacity_bytes, sto_cache **out) {
    sto_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return ST_RESOURCE_EXHAUSTED;
    c->capacity = capacity_bytes;
    c->pool_shard_max = capacity_bytes / STO_CACHE_POOL_FRACTION / STO_CACHE_POOL_SHARDS;
    for (int i = 0; i < STO_CACHE_POOL_SHARDS; i++)
        pthread_mutex_init(&c->pool[i].mu, NULL);
    pthread_mutex_init(&c->dctx_mu, NULL);
    size_t per = capacity_bytes / STO_CACHE_SHARDS + (capacity_bytes % STO_CACHE_SHARDS != 0);
    for (int i = 0; i < STO_CACHE_SHARDS; i++) {
        cache_shard *s = &c->shards[i];
        pthread_mutex_init(&s->mu, NULL);
        s->capacity = per;
        s->lru.next = s->lru.prev = &s->lru;
        s->in_use.next = s->in_use.prev = &s->in_use;
        s->table = calloc(CACHE_BUCKETS_MIN, sizeof(*s->table));
        s->buckets = CACHE_BUCKETS_MIN;
        if (!s->table) {
            for (int j = 0; j <= i; j++)
                free(c->shards[j].table);
            pthread_mutex_destroy(&c->dctx_mu);
            free(c);
            return ST_RESOURCE_EXHAUSTED;
        }
    }
    *out = c;
    return ST_OK;
}

void sto_cache_free(sto_cache *c) {
    if (!c)
        return;
    for (int i = 0; i < STO_CACHE_SHARDS; i++) {
        cache_shard *s = &c->shards[i];
        /* Every handle must be released before the cache goes: readers hold blocks by pointer. */
        ST_ASSERT(s->in_use.next == &s->in_use);
        for (sto_cache_handle *e = s->lru.next, *n; e != &s->lru; e = n) {
            n = e->next;
            delete_entry(e);
        }
        free(s->table);
        pthread_mutex_destroy(&s->mu);
    }
    for (int i = 0; i < c->n_dctx; i++)
        ZSTD_freeDCtx(c->dctx[i]);
    for (int i = 0; i < STO_CACHE_POOL_SHARDS; i++) {
        for (size_t k = 0; k < POOL_CLASSES; k++)
            for (pool_buf *b = c->pool[i].free[k], *n; b; b = n) {
                n = b->next;
                free(b);
            }
        pthread_mutex_destroy(&c->pool[i].mu);
    }
    pthread_mutex_destroy(&c->dctx_mu);
    free(c);
}

/* Each thread keeps its last context (freed when the thread ends): reusing one that is warm in
 * this core's cache, without the pool's lock, made decompression of a 4 KiB block about a third
 * cheaper than a context bouncing between the readers' cores. */
static void dctx_free(void *d) {
    ZSTD_freeDCtx(d);
}

static _Thread_local st_tl_stash dctx_tl = ST_TL_STASH_INIT(1, dctx_free);

void *sto_cache_dctx_get(sto_cache *c) {
    ZSTD_DCtx *d = st_tl_stash_take(&dctx_tl);
    if (d)
        return d;
    if (c) {
        pthread_mutex_lock(&c->dctx_mu);
        if (c->n_dctx > 0)
            d = c->dctx[--c->n_dctx];
        pthread_mutex_unlock(&c->dctx_mu);
    }
    return d ? d : ZSTD_createDCtx();
}

void sto_cache_dctx_put(sto_cache *c, void *dctx) {
    ZSTD_DCtx *d = dctx;
    if (d && st_tl_stash_put(&dctx_tl, d))
        return;
    if (c && d) {
        pthread_mutex_lock(&c->dctx_mu);
        if (c->n_dctx < STO_CACHE_DCTX_MAX) {
            c->dctx[c->n_dctx++] = d;
            d = NULL;
        }
        pthread_mutex_unlock(&c->dctx_mu);
    }
    ZSTD_freeDCtx(d);
}

/* ---- block memory pool ---- */

size_t sto_cache_buf_size(size_t bytes) {
    if (bytes == 0 || bytes > STO_CACHE_BUF_POOLED_MAX)
        return bytes;
    return (bytes + STO_CACHE_BUF_CLASS_BYTES - 1) / STO_CACHE_BUF_CLASS_BYTES *
           STO_CACHE_BUF_CLASS_BYTES;
}

/* Each thread sticks to one pool shard (spreads the locks; a buffer is reused by the next
 * read of whichever thread frees it). */
static pool_shard *pool_of(sto_cache *c) {
    static _Thread_local unsigned slot = 0; /* 0 = not assigned yet */
    if (slot == 0)
        slot = 1 + atomic_fetch_add(&c->next_pool, 1) % STO_CACHE_POOL_SHARDS;
    return &c->pool[(slot - 1) % STO_CACHE_POOL_SHARDS];
}

void *sto_cache_buf_get(sto_cache *c, size_t bytes) {
    size_t size = sto_cache_buf_size(bytes);
    if (c && size && size <= STO_CACHE_BUF_POOLED_MAX && c->pool_shard_max) {
        pool_shard *p = pool_of(c);
        size_t k = size / STO_CACHE_BUF_CLASS_BYTES - 1;
        pthread_mutex_lock(&p->mu);
        pool_buf *b = p->free[k];
        if (b) {
            p->free[k] = b->next;
            p->bytes -= size;
        }
        pthread_mutex_unlock(&p->mu);
        if (b)
            return b;
    }
    return malloc(size ? size : 1);
}

void sto_cache_buf_put(sto_cache *c, void *ptr, size_t bytes) {
    size_t size = sto_cache_buf_size(bytes);
    if (ptr && c && size && size <= STO_CACHE_BUF_POOLED_MAX) {
        pool_shard *p = pool_of(c);
        size_t k = size / STO_CACHE_BUF_CLASS_BYTES - 1;
        pthread_mutex_lock(&p->mu);
        bool keep = p->bytes + size <= c->pool_shard_max;
        if (keep) {
            pool_buf *b = ptr;
            b->next = p->free[k];
            p->free[k] = b;
            p->bytes += size;
        }
        pthread_mutex_unlock(&p->mu);
        if (keep)
            return;
    }
    free(ptr);
}

bool sto_cache_admits(const sto_cache *c, size_t charge) {
    return c && c->capacity > 0 && charge <= c->shards[0].capacity;
}

void sto_cache_note_read(sto_cache *c, size_t bytes) {
    if (!c)
        return;
    atomic_fetch_add_explicit(&c->read_blocks, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->read_bytes, bytes, memory_order_relaxed);
}

void sto_cache_read_stats(sto_cache *c, uint64_t *blocks, uint64_t *bytes) {
    if (blocks)
        *blocks = atomic_load_explicit(&c->read_blocks, memory_order_relaxed);
    if (bytes)
        *bytes = atomic_load_explicit(&c->read_bytes, memory_order_relaxed);
}

void sto_cache_stats(sto_cache *c, uint64_t *bytes, uint64_t *hits, uint64_t *misses) {
    uint64_t b = 0, h = 0, m = 0;
    for (int i = 0; i < STO_CACHE_SHARDS; i++) {
        cache_shard *s = &c->shards[i];
        pthread_mutex_lock(&s->mu);
        b += s->usage;
        h += s->hits;
        m += s->misses;
        pthread_mutex_unlock(&s->mu);
    }
    if (bytes)
        *bytes = b;
    if (hits)
        *hits = h;
    if (misses)
        *misses = m;
}

static inline uint32_t hash_tag(uint64_t hash) {
    return (uint32_t)(hash >> CACHE_TAG_SHIFT); /* see CACHE_TAG_SHIFT */
}

static cache_bucket *bucket_of(cache_shard *s, uint64_t hash) {
    return &s->table[hash & (s->buckets - 1)];
}

static sto_cache_handle **find_slot(cache_bucket *b, uint64_t id, uint64_t off) {
    sto_cache_handle **p = &b->head;
    while (*p && ((*p)->id != id || (*p)->off != off))
        p = &(*p)->next_hash;
    return p;
}

/* The entry for (id, off) or NULL, loading entries only when the bucket's tag says they may be
 * the one. */
static sto_cache_handle *find(cache_shard *s, uint64_t id, uint64_t off, uint64_t hash) {
    cache_bucket *b = bucket_of(s, hash);
    if (b->len == 0 || (b->len == 1 && b->tag != hash_tag(hash)))
        return NULL;
    return *find_slot(b, id, off);
}

static void bucket_push(cache_bucket *b, sto_cache_handle *e) {
    e->next_hash = b->head;
    b->head = e;
    b->tag = hash_tag(e->hash);
    b->len++;
}

static void bucket_remove(cache_bucket *b, sto_cache_handle *e) {
    sto_cache_handle **p = find_slot(b, e->id, e->off);
    ST_ASSERT(*p == e);
    *p = e->next_hash;
    b->len--;
    if (p == &b->head && b->head)
        b->tag = hash_tag(b->head->hash);
}

/* Doubling keeps chains short; when memory runs out the table just stays smaller. */
static void maybe_grow(cache_shard *s) {
    if (s->count <= s->buckets / 2)
        return;
    size_t nb = s->buckets * 2;
    cache_bucket *t = calloc(nb, sizeof(*t));
    if (!t)
        return;
    for (size_t i = 0; i < s->buckets; i++) {
        for (sto_cache_handle *e = s->table[i].head, *n; e; e = n) {
            n = e->next_hash;
            bucket_push(&t[e->hash & (nb - 1)], e);
        }
    }
    free(s->table);
    s->table = t;
    s->buckets = nb;
}

/* Drops one reference under the lock; returns e when it must be deleted (outside the lock). */
static sto_cache_handle *unref_locked(cache_shard *s, sto_cache_handle *e) {
    ST_ASSERT(e->refs > 0);
    e->refs--;
    if (e->refs == 0)
        return e;
    if (e->in_cache && e->refs == 1) {
        list_remove(e);
        list_append(e->cold ? s->lru.next : &s->lru, e); /* before the oldest, or newest */
    }
    return NULL;
}

/* Takes e out of the table and lists; returns it when its last reference went. */
static sto_cache_handle *detach_locked(cache_shard *s, sto_cache_handle *e) {
    bucket_remove(bucket_of(s, e->hash), e);
    s->count--;
    list_remove(e);
    e->in_cache = false;
    s->usage -= e->charge;
    e->next = e->prev = e;
    return unref_locked(s, e);
}

/* Evicts the oldest unused entries until the shard fits; the victims are chained on *dead. */
static void evict_locked(cache_shard *s, sto_cache_handle **dead) {
    while (s->usage > s->capacity && s->lru.next != &s->lru) {
        sto_cache_handle *d = detach_locked(s, s->lru.next);
        if (d) {
            d->next_hash = *dead;
            *dead = d;
        }
    }
}

static void delete_chain(sto_cache_handle *dead) {
    for (sto_cache_handle *n; dead; dead = n) {
        n = dead->next_hash;
        delete_entry(dead);
    }
}

sto_cache_handle *sto_cache_lookup(sto_cache *c, uint64_t id, uint64_t off) {
    if (!c)
        return NULL;
    uint64_t hash = key_hash(id, off);
    cache_shard *s = shard_of(c, hash);
    pthread_mutex_lock(&s->mu);
    sto_cache_handle *e = find(s, id, off, hash);
    if (e) {
        if (e->refs == 1) { /* leaving the LRU: it is in use now */
            list_remove(e);
            list_append(&s->in_use, e);
        }
        e->refs++;
        e->cold = false; /* wanted again after all */
        s->hits++;
    } else {
        s->misses++;
    }
    pthread_mutex_unlock(&s->mu);
    return e;
}

static sto_cache_handle *insert(sto_cache *c, sto_cache_handle *e, uint64_t id, uint64_t off,
                                void *value, size_t charge, sto_cache_deleter deleter,
                                bool embedded, bool cold);

sto_cache_handle *sto_cache_insert(sto_cache *c, uint64_t id, uint64_t off, void *value,
                                   size_t charge, sto_cache_deleter deleter) {
    sto_cache_handle *e = malloc(sizeof(*e));
    return e ? insert(c, e, id, off, value, charge, deleter, false, false) : NULL;
}

sto_cache_handle *sto_cache_insert_embedded(sto_cache *c, sto_cache_handle *mem, uint64_t id,
                                            uint64_t off, void *value, size_t charge,
                                            sto_cache_deleter deleter, bool cold) {
    return insert(c, mem, id, off, value, charge, deleter, true, cold);
}

static sto_cache_handle *insert(sto_cache *c, sto_cache_handle *e, uint64_t id, uint64_t off,
                                void *value, size_t charge, sto_cache_deleter deleter,
                                bool embedded, bool cold) {
    uint64_t hash = key_hash(id, off);
    *e = (sto_cache_handle){.id = id,
                            .off = off,
                            .hash = hash,
                            .value = value,
                            .charge = charge,
                            .deleter = deleter,
                            .refs = 1,
                            .embedded = embedded,
                            .cold = cold};
    e->next = e->prev = e;
    if (!c || c->capacity == 0)
        return e; /* caching off: a private handle, deleted at release */
    cache_shard *s = shard_of(c, hash);
    sto_cache_handle *dead = NULL;
    pthread_mutex_lock(&s->mu);
    sto_cache_handle *prev = find(s, id, off, hash);
    if (prev) {
        sto_cache_handle *old = detach_locked(s, prev);
        if (old) {
            old->next_hash = dead;
            dead = old;
        }
    }
    e->refs = 2;
    e->in_cache = true;
    bucket_push(bucket_of(s, hash), e);
    s->count++;
    s->usage += charge;
    list_append(&s->in_use, e);
    evict_locked(s, &dead);
    maybe_grow(s);
    pthread_mutex_unlock(&s->mu);
    delete_chain(dead);
    return e;
}

void *sto_cache_value(sto_cache_handle *h) {
    return h->value;
}

void sto_cache_release(sto_cache *c, sto_cache_handle *h) {
    if (!c || c->capacity == 0) {
        delete_entry(h); /* private handle of a cache that keeps nothing */
        return;
    }
    cache_shard *s = shard_of(c, h->hash);
    sto_cache_handle *dead = NULL;
    pthread_mutex_lock(&s->mu);
    sto_cache_handle *d = unref_locked(s, h);
    if (d) {
        d->next_hash = NULL;
        dead = d;
    }
    evict_locked(s, &dead);
    pthread_mutex_unlock(&s->mu);
    delete_chain(dead);
}
