/* catalog.c — the node's table catalog, one checksummed file rewritten atomically. */
#include "catalog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Version 2 adds each table's change stream retention and start; version 1 files are still
 * read (streams off) and are rewritten as version 2 on the next save. */
#define CATALOG_MAGIC "STRCAT02"
#define CATALOG_MAGIC_V1 "STRCAT01"
#define CATALOG_MAGIC_BYTES 8
#define CATALOG_TABLES_MAX 100000

struct node_catalog {
    st_env *env;
    char path[4096];
    node_table *tables; /* sorted by name */
    size_t n, cap;
    uint64_t next_tablet_id;
};

/* ---- GC trees ---- */

void node_gc_free(node_gc *g) {
    for (size_t i = 0; i < g->n_children; i++)
        node_gc_free(&g->children[i]);
    free(g->children);
    memset(g, 0, sizeof *g);
}

static st_code gc_copy_depth(node_gc *dst, const node_gc *src, int depth, size_t *nodes,
                             st_err *err) {
    if (depth > NODE_GC_DEPTH_MAX || ++*nodes > NODE_GC_NODES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "GC rule too large: at most %d levels and %d rules; simplify the rule",
                          NODE_GC_DEPTH_MAX, NODE_GC_NODES_MAX);
    *dst = *src;
    dst->children = NULL;
    dst->n_children = 0;
    if (src->n_children == 0)
        return ST_OK;
    dst->children = calloc(src->n_children, sizeof *dst->children);
    if (!dst->children)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory copying a GC rule");
    dst->n_children = src->n_children;
    for (size_t i = 0; i < src->n_children; i++) {
        st_code rc = gc_copy_depth(&dst->children[i], &src->children[i], depth + 1, nodes, err);
        if (rc != ST_OK) {
            node_gc_free(dst);
            return rc;
        }
    }
    return ST_OK;
}

st_code node_gc_copy(node_gc *dst, const node_gc *src, st_err *err) {
    size_t nodes = 0;
    return gc_copy_depth(dst, src, 0, &nodes, err);
}

void node_gc_to_sto(const node_gc *g, sto_gc_rule *out, sto_gc_rule *scratch, size_t *used) {
    out->kind = g->kind;
    out->max_versions = g->max_versions;
    out->max_age_us = g->max_age_us;
    out->n_children = g->n_children;
    out->children = NULL;
    if (g->n_children == 0)
        return;
    sto_gc_rule *kids = scratch + *used;
    *used += g->n_children;
    out->children = kids;
    for (size_t i = 0; i < g->n_children; i++)
        node_gc_to_sto(&g->children[i], &kids[i], scratch, used);
}

/* ---- encoding (docs/formats/catalog.md) ---- */

static st_code put_str(st_buf *b, const char *s) {
    size_t n = strlen(s);
    st_code rc = st_buf_append_varint64(b, n);
    return rc == ST_OK ? st_buf_append(b, s, n) : rc;
}

static st_code put_gc(st_buf *b, const node_gc *g) {
    st_code rc = st_buf_append_byte(b, (uint8_t)g->kind);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, (uint64_t)g->max_versions);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, (uint64_t)g->max_age_us);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, g->n_children);
    for (size_t i = 0; rc == ST_OK && i < g->n_children; i++)
        rc = put_gc(b, &g->children[i]);
    return rc;
}

static bool family_in(const node_family *v, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0)
            return true;
    return false;
}

/* How many of the first n purging entries are saved as families: a family being purged stays
 * on disk until its purge ends, once, and not when it was created again meanwhile. */
static size_t purging_saved(const node_table *t, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += !family_in(t->families, t->n_families, t->purging[i].name) &&
             !family_in(t->purging, i, t->purging[i].name);
    return k;
}

static st_code put_table(st_buf *b, const node_table *t) {
    st_code rc = put_str(b, t->name);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, (uint64_t)t->create_time_us);
    if (rc == ST_OK)
        rc = st_buf_append_byte(b, t->deletion_protection ? 1 : 0);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, (uint64_t)t->cs_retention_us);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, (uint64_t)t->cs_since_us);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(b, t->n_families + purging_saved(t, t->n_purging));
    for (size_t i = 0; rc == ST_OK && i < t->n_families; i++) {
        rc = put_str(b, t->families[i].name);
        if (rc == ST_OK)
            rc = put_gc(b, &t->families[i].gc);
    }
    for (size_t i = 0; rc == ST_OK && i < t->n_purging; i++) {
        if (purging_saved(t, i + 1) == purging_saved(t, i))
            continue;
        rc = put_str(b, t->purging[i].name);
        if (rc == ST_OK)
            rc = put_gc(b, &t->purging[i].gc);
    }
    return rc;
}

typedef struct reader {
    const uint8_t *p, *end;
    bool ok;
    int version; /* of the file: 1 or 2 */
} reader;

static uint64_t get_u64(reader *r) {
    uint64_t v = 0;
    if (r->ok && !st_get_varint64(&r->p, r->end, &v))
        r->ok = false;
    return v;
}

static void get_str(reader *r, char *out, size_t cap) {
    st_slice s = {0};
    if (r->ok && (!st_get_len_prefixed(&r->p, r->end, &s) || s.len >= cap))
        r->ok = false;
    if (!r->ok) {
        out[0] = '\0';
        return;
    }
    memcpy(out, s.data, s.len);
    out[s.len] = '\0';
}

static void get_gc(reader *r, node_gc *g, int depth) {
    memset(g, 0, sizeof *g);
    if (!r->ok || r->p >= r->end || depth > NODE_GC_DEPTH_MAX) {
        r->ok = false;
        return;
    }
    uint8_t kind = *r->p++;
    if (kind > STO_GC_INTERSECTION)
        r->ok = false;
    g->kind = (sto_gc_kind)kind;
    g->max_versions = (int64_t)get_u64(r);
    g->max_age_us = (int64_t)get_u64(r);
    uint64_t n = get_u64(r);
    if (!r->ok || n > NODE_GC_NODES_MAX) {
        r->ok = false;
        return;
    }
    if (n == 0)
        return;
    g->children = calloc(n, sizeof *g->children);
    if (!g->children) {
        r->ok = false;
        return;
    }
    g->n_children = n;
    for (uint64_t i = 0; i < n && r->ok; i++)
        get_gc(r, &g->children[i], depth + 1);
}

void node_table_deinit(node_table *t) {
    for (size_t i = 0; i < t->n_families; i++)
        node_gc_free(&t->families[i].gc);
    free(t->families);
    for (size_t i = 0; i < t->n_purging; i++)
        node_gc_free(&t->purging[i].gc);
    free(t->purging);
    memset(t, 0, sizeof *t);
}

static void get_table(reader *r, node_table *t) {
    memset(t, 0, sizeof *t);
    get_str(r, t->name, sizeof t->name);
    t->create_time_us = (int64_t)get_u64(r);
    if (r->ok && r->p < r->end)
        t->deletion_protection = *r->p++ != 0;
    else
        r->ok = false;
    if (r->version >= 2) {
        t->cs_retention_us = (int64_t)get_u64(r);
        t->cs_since_us = (int64_t)get_u64(r);
        if (t->cs_retention_us < 0 || t->cs_since_us < 0)
            r->ok = false;
    }
    uint64_t n = get_u64(r);
    if (!r->ok || n > NODE_FAMILIES_MAX) {
        r->ok = false;
        return;
    }
    t->families = n ? calloc(n, sizeof *t->families) : NULL;
    if (n && !t->families) {
        r->ok = false;
        return;
    }
    t->n_families = n;
    for (uint64_t i = 0; i < n && r->ok; i++) {
        get_str(r, t->families[i].name, sizeof t->families[i].name);
        get_gc(r, &t->families[i].gc, 0);
    }
}

/* ---- load and save ---- */

/* A catalog that cannot be read holds the table definitions of every tablet in storage: the ways
 * out are those of a missing one (node.c), and the file is kept for whoever can repair it. */
static st_code catalog_damaged(const node_catalog *c, const char *what, st_err *err) {
    return st_err_set(err, ST_DATA_LOSS,
                      "catalog %s: %s: the table definitions are unreadable; restore this node's "
                      "data from a replica or a backup, or move the file aside and start with "
                      "--accept-data-loss to drop every tablet storage holds",
                      c->path, what);
}

static st_code catalog_decode(node_catalog *c, st_slice data, st_err *err) {
    int version = 0;
    if (data.len >= CATALOG_MAGIC_BYTES + 4)
        version = memcmp(data.data, CATALOG_MAGIC, CATALOG_MAGIC_BYTES) == 0      ? 2
                  : memcmp(data.data, CATALOG_MAGIC_V1, CATALOG_MAGIC_BYTES) == 0 ? 1
                                                                                  : 0;
    if (version == 0)
        return catalog_damaged(c, data.len ? "not a Strata catalog (bad magic)" : "empty file",
                               err);
    size_t body = data.len - 4;
    uint32_t want = st_crc_unmask(st_get_fixed32(data.data + body));
    if (st_crc32c(0, data.data, body) != want)
        return catalog_damaged(c, "checksum mismatch", err);
    reader r = {data.data + CATALOG_MAGIC_BYTES, data.data + body, true, version};
    c->next_tablet_id = get_u64(&r);
    uint64_t n = get_u64(&r);
    if (!r.ok || n > CATALOG_TABLES_MAX)
        return catalog_damaged(c, "malformed header", err);
    c->tables = n ? calloc(n, sizeof *c->tables) : NULL;
    if (n && !c->tables)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory loading catalog");
    c->cap = n;
    for (uint64_t i = 0; i < n && r.ok; i++) {
        get_table(&r, &c->tables[i]);
        c->n++;
    }
    if (!r.ok || r.p != r.end)
        return catalog_damaged(c, "malformed table entry", err);
    return ST_OK;
}

st_code node_catalog_open(st_env *env, const char *dir, node_catalog **out, st_err *err) {
    node_catalog *c = calloc(1, sizeof *c);
    if (!c)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening catalog");
    c->env = env;
    c->next_tablet_id = 1;
    snprintf(c->path, sizeof c->path, "%s/catalog", dir);
    st_buf data;
    st_buf_init(&data);
    st_code rc = st_env_read_all(env, c->path, &data, err);
    if (rc == ST_NOT_FOUND) {
        st_err_clear(err);
        rc = ST_OK;
    } else if (rc == ST_OK) {
        rc = catalog_decode(c, st_buf_slice(&data), err);
    }
    st_buf_free(&data);
    if (rc != ST_OK) {
        node_catalog_free(c);
        return rc;
    }
    *out = c;
    return ST_OK;
}

void node_catalog_free(node_catalog *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        node_table_deinit(&c->tables[i]);
    free(c->tables);
    free(c);
}

st_code node_catalog_save(node_catalog *c, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_buf_append(&b, CATALOG_MAGIC, CATALOG_MAGIC_BYTES);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(&b, c->next_tablet_id);
    if (rc == ST_OK)
        rc = st_buf_append_varint64(&b, c->n);
    for (size_t i = 0; rc == ST_OK && i < c->n; i++)
        rc = put_table(&b, &c->tables[i]);
    if (rc == ST_OK)
        rc = st_buf_append_fixed32(&b, st_crc_mask(st_crc32c(0, b.data, b.len)));
    if (rc != ST_OK)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory saving catalog");
    else
        rc = st_env_write_atomic(c->env, c->path, b.data, b.len, err);
    st_buf_free(&b);
    return rc;
}

/* ---- tables ---- */

size_t node_catalog_count(const node_catalog *c) {
    return c->n;
}
node_table *node_catalog_at(node_catalog *c, size_t i) {
    return i < c->n ? &c->tables[i] : NULL;
}

/* Index of the first table whose name is >= name. */
static size_t lower_bound(const node_catalog *c, const char *name) {
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(c->tables[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

node_table *node_catalog_find(node_catalog *c, const char *name) {
    size_t i = lower_bound(c, name);
    return i < c->n && strcmp(c->tables[i].name, name) == 0 ? &c->tables[i] : NULL;
}

st_code node_catalog_add(node_catalog *c, const char *name, int64_t create_time_us,
                         node_table **out, st_err *err) {
    if (strlen(name) > NODE_TABLE_NAME_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "table name longer than %d bytes",
                          NODE_TABLE_NAME_MAX);
    size_t i = lower_bound(c, name);
    if (i < c->n && strcmp(c->tables[i].name, name) == 0)
        return st_err_set(err, ST_ALREADY_EXISTS, "table %s already exists", name);
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        node_table *t = realloc(c->tables, cap * sizeof *t);
        if (!t)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding table");
        c->tables = t;
        c->cap = cap;
    }
    memmove(&c->tables[i + 1], &c->tables[i], (c->n - i) * sizeof *c->tables);
    c->n++;
    node_table *t = &c->tables[i];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->create_time_us = create_time_us;
    if (out)
        *out = t;
    return ST_OK;
}

st_code node_catalog_remove(node_catalog *c, const char *name, st_err *err) {
    size_t i = lower_bound(c, name);
    if (i >= c->n || strcmp(c->tables[i].name, name) != 0)
        return st_err_set(err, ST_NOT_FOUND, "table %s not found", name);
    node_table_deinit(&c->tables[i]);
    memmove(&c->tables[i], &c->tables[i + 1], (c->n - i - 1) * sizeof *c->tables);
    c->n--;
    return ST_OK;
}

uint64_t node_catalog_next_tablet_id(node_catalog *c) {
    return c->next_tablet_id++;
}

uint64_t node_catalog_peek_tablet_id(const node_catalog *c) {
    return c->next_tablet_id;
}

void node_catalog_reserve_tablet_ids(node_catalog *c, uint64_t used) {
    if (c->next_tablet_id <= used)
        c->next_tablet_id = used + 1;
}

/* ---- families ---- */

node_family *node_table_family(node_table *t, st_slice name) {
    for (size_t i = 0; i < t->n_families; i++)
        if (st_slice_eq(st_slice_cstr(t->families[i].name), name))
            return &t->families[i];
    return NULL;
}

st_code node_table_family_set(node_table *t, const char *name, const node_gc *gc, st_err *err) {
    size_t len = strlen(name);
    if (len == 0 || len > NODE_FAMILY_NAME_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "column family name must be 1 to %d characters",
                          NODE_FAMILY_NAME_MAX);
    node_gc copy;
    st_code rc = node_gc_copy(&copy, gc, err);
    if (rc != ST_OK)
        return rc;
    node_family *f = node_table_family(t, st_slice_cstr(name));
    if (!f) {
        if (t->n_families >= NODE_FAMILIES_MAX) {
            node_gc_free(&copy);
            return st_err_set(err, ST_FAILED_PRECONDITION, "table has the maximum of %d families",
                              NODE_FAMILIES_MAX);
        }
        node_family *fams = realloc(t->families, (t->n_families + 1) * sizeof *fams);
        if (!fams) {
            node_gc_free(&copy);
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding a family");
        }
        t->families = fams;
        f = &fams[t->n_families++];
        memset(f, 0, sizeof *f);
        memcpy(f->name, name, len + 1);
    } else {
        node_gc_free(&f->gc);
    }
    f->gc = copy;
    return ST_OK;
}

st_code node_table_family_drop(node_table *t, const char *name, st_err *err) {
    node_family *f = node_table_family(t, st_slice_cstr(name));
    if (!f)
        return st_err_set(err, ST_NOT_FOUND, "column family %s not found in %s", name, t->name);
    node_gc_free(&f->gc);
    size_t i = (size_t)(f - t->families);
    memmove(f, f + 1, (t->n_families - i - 1) * sizeof *f);
    t->n_families--;
    return ST_OK;
}

st_code node_table_purge_begin(node_table *t, const char *name, st_err *err) {
    node_family *f = node_table_family(t, st_slice_cstr(name)), *p = NULL;
    for (size_t i = 0; !f && i < t->n_purging; i++)
        if (strcmp(t->purging[i].name, name) == 0)
            p = &t->purging[i];
    if (!f && !p)
        return st_err_set(err, ST_NOT_FOUND, "column family %s not found in %s", name, t->name);
    node_family entry;
    memset(&entry, 0, sizeof entry);
    snprintf(entry.name, sizeof entry.name, "%s", name);
    st_code rc = node_gc_copy(&entry.gc, f ? &f->gc : &p->gc, err);
    if (rc != ST_OK)
        return rc;
    node_family *v = realloc(t->purging, (t->n_purging + 1) * sizeof *v);
    if (!v) {
        node_gc_free(&entry.gc);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory dropping a family");
    }
    t->purging = v;
    v[t->n_purging++] = entry;
    if (f)
        node_table_family_drop(t, name, NULL);
    return ST_OK;
}

void node_table_purge_end(node_table *t, const char *name, bool restore) {
    for (size_t i = t->n_purging; i-- > 0;) {
        node_family *p = &t->purging[i];
        if (strcmp(p->name, name) != 0)
            continue;
        if (restore && !node_table_family(t, st_slice_cstr(name)))
            node_table_family_set(t, name, &p->gc, NULL);
        node_gc_free(&p->gc);
        memmove(p, p + 1, (t->n_purging - i - 1) * sizeof *p);
        t->n_purging--;
        return;
    }
}
