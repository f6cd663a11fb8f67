/* tlcache.c — thread-exit draining for per-thread caches (st_tl_at_thread_exit in base.h).
 *
 * Caches keep memory per thread between uses (free lists of blocks, scratch buffers). Each must be
 * freed when its thread exits; one pthread key whose destructor runs every drain the thread
 * registered serves all, instead of a key per cache. */
#include <pthread.h>

#include "strata/base.h"

typedef struct tl_drains {
    struct {
        void (*fn)(void *);
        void *arg;
    } d[ST_TL_DRAINS_MAX];
    size_t n;
    bool registered; /* the key holds this thread's list */
} tl_drains;

static _Thread_local tl_drains tl;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static bool tl_key_ok;

static void tl_run(void *arg) {
    tl_drains *t = arg;
    for (size_t i = 0; i < t->n; i++)
        t->d[i].fn(t->d[i].arg);
    t->n = 0;
    t->registered = false; /* the key is cleared now: a later registration sets it again */
}

static void tl_key_init(void) {
    tl_key_ok = pthread_key_create(&tl_key, tl_run) == 0;
}

bool st_tl_at_thread_exit(void (*fn)(void *), void *arg) {
    pthread_once(&tl_once, tl_key_init);
    if (!tl_key_ok || tl.n >= ST_TL_DRAINS_MAX)
        return false;
    if (!tl.registered && pthread_setspecific(tl_key, &tl) != 0)
        return false;
    tl.registered = true;
    tl.d[tl.n].fn = fn;
    tl.d[tl.n].arg = arg;
    tl.n++;
    return true;
}

static void tl_cache_drain(void *arg) {
    st_tl_cache *c = arg;
    c->registered = false; /* a use after this drain registers it again */
    c->drain(c);
}

bool st_tl_cache_ready(st_tl_cache *c) {
    if (!c->registered)
        c->registered = st_tl_at_thread_exit(tl_cache_drain, c);
    return c->registered;
}

void st_tl_stash_drain(st_tl_cache *c) {
    st_tl_stash *s = (st_tl_stash *)c;
    while (s->n > 0)
        s->free_fn(s->v[--s->n]);
}

void *st_tl_stash_take(st_tl_stash *s) {
    return s->n > 0 ? s->v[--s->n] : NULL;
}

bool st_tl_stash_put(st_tl_stash *s, void *p) {
    if (s->n >= s->max || s->n >= ST_TL_STASH_MAX || !st_tl_cache_ready(&s->tl))
        return false;
    s->v[s->n++] = p;
    return true;
}
