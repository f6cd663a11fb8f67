/* rowlock.c — per-row FIFO locks on the loop thread (node_internal.h says why). A chained hash of
 * held rows; each entry keeps its waiters in arrival order. Entries exist only while held, so
 * memory follows the number of rows with writes in flight. */
#include "node_internal.h"

#include <stdlib.h>
#include <string.h>

#define ROWLOCK_BUCKETS_MIN 1024

typedef struct waiter {
    struct waiter *next;
    node_rowlock_fn fn;
    void *arg;
} waiter;

typedef struct entry {
    struct entry *next; /* bucket chain */
    uint64_t hash;
    waiter *head, *tail;
    size_t key_len;
    uint8_t key[]; /* table '\0' row */
} entry;

struct node_rowlocks {
    entry **buckets;
    size_t n_buckets; /* power of two */
    size_t n_entries;
};

node_rowlocks *node_rowlocks_new(void) {
    node_rowlocks *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->buckets = calloc(ROWLOCK_BUCKETS_MIN, sizeof *l->buckets);
    if (!l->buckets) {
        free(l);
        return NULL;
    }
    l->n_buckets = ROWLOCK_BUCKETS_MIN;
    return l;
}

void node_rowlocks_free(node_rowlocks *l) {
    if (!l)
        return;
    for (size_t i = 0; i < l->n_buckets; i++) {
        entry *e = l->buckets[i];
        while (e) {
            entry *next = e->next;
            for (waiter *w = e->head; w;) {
                waiter *wn = w->next;
                free(w);
                w = wn;
            }
            free(e);
            e = next;
        }
    }
    free(l->buckets);
    free(l);
}

/* The lock key: table name, a NUL, the row key (table names contain no NUL). */
static uint64_t key_hash(const char *table, st_slice row) {
    return st_hash64(row.data, row.len, st_hash64(table, strlen(table), 0x726f776c6f636bull));
}

static bool key_eq(const entry *e, uint64_t h, const char *table, st_slice row) {
    size_t tl = strlen(table);
    return e->hash == h && e->key_len == tl + 1 + row.len && memcmp(e->key, table, tl + 1) == 0 &&
           (row.len == 0 || memcmp(e->key + tl + 1, row.data, row.len) == 0);
}

static entry **find_slot(node_rowlocks *l, uint64_t h, const char *table, st_slice row) {
    entry **slot = &l->buckets[h & (l->n_buckets - 1)];
    while (*slot && !key_eq(*slot, h, table, row))
        slot = &(*slot)->next;
    return slot;
}

/* Doubles the bucket array when entries outnumber buckets; failure just keeps chains longer. */
static void maybe_grow(node_rowlocks *l) {
    if (l->n_entries < l->n_buckets)
        return;
    size_t nb = l->n_buckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < l->n_buckets; i++) {
        for (entry *e = l->buckets[i]; e;) {
            entry *next = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(l->buckets);
    l->buckets = b;
    l->n_buckets = nb;
}

/* Inserts a held entry at slot (which find_slot returned empty). */
static bool take(node_rowlocks *l, entry **slot, uint64_t h, const char *table, st_slice row) {
    size_t tl = strlen(table);
    entry *e = malloc(sizeof *e + tl + 1 + row.len);
    if (!e)
        return false;
    e->next = NULL;
    e->hash = h;
    e->head = e->tail = NULL;
    e->key_len = tl + 1 + row.len;
    memcpy(e->key, table, tl + 1);
    if (row.len)
        memcpy(e->key + tl + 1, row.data, row.len);
    *slot = e;
    l->n_entries++;
    maybe_grow(l);
    return true;
}

bool node_rowlock_try(node_ctx *n, const char *table, st_slice row) {
    node_rowlocks *l = n->rowlocks;
    uint64_t h = key_hash(table, row);
    entry **slot = find_slot(l, h, table, row);
    return !*slot && take(l, slot, h, table, row);
}

st_code node_rowlock_acquire(node_ctx *n, const char *table, st_slice row, node_rowlock_fn fn,
                             void *arg) {
    node_rowlocks *l = n->rowlocks;
    uint64_t h = key_hash(table, row);
    entry **slot = find_slot(l, h, table, row);
    if (*slot) {
        waiter *w = malloc(sizeof *w);
        if (!w)
            return ST_RESOURCE_EXHAUSTED;
        *w = (waiter){NULL, fn, arg};
        if ((*slot)->tail)
            (*slot)->tail->next = w;
        else
            (*slot)->head = w;
        (*slot)->tail = w;
        return ST_OK;
    }
    if (!take(l, slot, h, table, row))
        return ST_RESOURCE_EXHAUSTED;
    fn(n, arg);
    return ST_OK;
}

void node_rowlock_release(node_ctx *n, const char *table, st_slice row) {
    node_rowlocks *l = n->rowlocks;
    uint64_t h = key_hash(table, row);
    entry **slot = find_slot(l, h, table, row);
    entry *e = *slot;
    ST_ASSERT(e != NULL);
    waiter *w = e->head;
    if (!w) {
        *slot = e->next;
        free(e);
        l->n_entries--;
        return;
    }
    /* Hand the lock to the next waiter; it releases in turn. */
    e->head = w->next;
    if (!e->head)
        e->tail = NULL;
    node_rowlock_fn fn = w->fn;
    void *arg = w->arg;
    free(w);
    fn(n, arg);
}
