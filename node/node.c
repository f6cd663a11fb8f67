/* node.c — opening a node (storage + catalog + tablet map), the clock, and the request helpers
 * every handler uses. */
#include "backup.h"
#include "changes.h"
#include "node_internal.h"
#include "repl_glue.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "google/bigtable/v2/feature_flags.pb-c.h"
#include "strata/btutil.h"

void node_opts_default(node_opts *o) {
    memset(o, 0, sizeof *o);
    o->listen_host = "127.0.0.1";
    o->sync = true;
    /* A tablet server's reads live on its block cache: with the storage engine's 64 MiB, a node
     * holding a few hundred MB of SSTables spent ~70% of its read CPU loading blocks (strata
     * bench, 4 x 32 point reads: 40k/s with 64 MiB, 59k/s with 256 MiB). Memory is charged
     * only as blocks are read. */
    o->block_cache_bytes = NODE_BLOCK_CACHE_BYTES_DEFAULT;
}

/* ---- tablet map ---- */

/* On every data call (several times per ReadRows): a plain binary search, no copy of the name. */
node_tablets *node_tablets_find(node_ctx *n, const char *table) {
    size_t lo = 0, hi = n->n_tables;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(n->tables[mid].name, table);
        if (c == 0)
            return &n->tables[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

size_t node_tablet_index(node_tablets *t, st_slice key) {
    size_t lo = 0, hi = t->n;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (st_slice_cmp(st_buf_slice(&t->v[mid].start), key) <= 0)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

node_tablet *node_tablet_for_row(node_tablets *t, st_slice row) {
    if (t->n == 0)
        return NULL;
    node_tablet *tab = &t->v[node_tablet_index(t, row)];
    if (st_slice_cmp(st_buf_slice(&tab->start), row) > 0 ||
        (tab->end.len && st_slice_cmp(row, st_buf_slice(&tab->end)) >= 0))
        return NULL;
    return tab;
}

node_tablet *node_tablet_for_write(node_tablets *t, st_slice row) {
    node_tablet *tab = node_tablet_for_row(t, row);
    if (!tab || tab->moving || tab->incoming)
        return NULL;
    tab->written = true;
    return tab;
}

bool node_in_cluster(const node_ctx *n) {
    return n->opts.node_num != 0;
}

/* Row keys are bytes: printable ASCII as is, the rest as \xNN, cut at NOT_OWNER_KEY_SHOWN. */
#define NOT_OWNER_KEY_SHOWN 64
static void key_printable(st_slice key, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < key.len && i < NOT_OWNER_KEY_SHOWN && k + 8 < cap; i++) {
        uint8_t c = key.data[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    }
    if (key.len > NOT_OWNER_KEY_SHOWN && k + 4 < cap)
        k += (size_t)snprintf(out + k, cap - k, "...");
    out[k] = '\0';
}

st_code node_not_owner(node_ctx *n, st_err *err, const char *table, st_slice row) {
    char key[4 * NOT_OWNER_KEY_SHOWN + 8];
    key_printable(row, key, sizeof key);
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      ST_NOT_OWNER_PREFIX
                      " node %u serves no tablet (or only a moving one) for "
                      "row '%s' of table %s; refresh the tablet map (ListTablets) and retry",
                      n->opts.node_num, key, table);
}

uint64_t node_tablet_new_id(node_ctx *n) {
    uint64_t counter = node_catalog_next_tablet_id(n->catalog);
    /* 2^40 tablets per node will not be created; crashing beats reusing an id. */
    ST_ASSERT(counter < ((uint64_t)1 << NODE_TABLET_ID_COUNTER_BITS));
    return ((uint64_t)n->opts.node_num << NODE_TABLET_ID_COUNTER_BITS) | counter;
}

node_tablet *node_tablet_by_id(node_ctx *n, uint64_t id, node_tablets **table) {
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++)
            if (n->tables[i].v[j].id == id) {
                if (table)
                    *table = &n->tables[i];
                return &n->tables[i].v[j];
            }
    return NULL;
}

void node_tablet_unmap(node_tablets *t, size_t i) {
    st_buf_free(&t->v[i].start);
    st_buf_free(&t->v[i].end);
    memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof *t->v);
    t->n--;
}

node_drop_pending *node_drop_pending_find(node_ctx *n, uint64_t id) {
    for (size_t i = 0; i < n->n_drops; i++)
        if (n->drops[i].id == id)
            return &n->drops[i];
    return NULL;
}

/* A drop storage refused: the tablet is out of the map already (so never served), and it stays
 * accounted for here until a retry succeeds (move.c, node_drops_retry). Out of memory it is
 * only logged: a restart still finds it (DATA/incoming, DATA/outgoing, the overlap check). */
static void drop_pending_add(node_ctx *n, uint64_t id, bool incoming, const st_err *why) {
    if (node_drop_pending_find(n, id))
        return;
    node_drop_pending *v = realloc(n->drops, (n->n_drops + 1) * sizeof *v);
    if (!v) {
        st_log(ST_LOG_ERROR, "node", "tablet %" PRIu64 ": out of memory keeping its failed drop",
               id);
        return;
    }
    n->drops = v;
    node_drop_pending *d = &v[n->n_drops++];
    memset(d, 0, sizeof *d);
    d->id = id;
    d->incoming = incoming;
    d->backoff_ms = 1000;
    d->next_try_us = st_mono_us() + (int64_t)d->backoff_ms * 1000;
    st_log(ST_LOG_WARN, "node",
           "tablet %" PRIu64 " is no longer served, but storage could not drop it: %s; the node "
           "retries the drop until it succeeds",
           id, why && why->msg[0] ? why->msg : "unknown error");
}

st_code node_tablet_drop(node_ctx *n, node_tablets *t, size_t i, st_err *err) {
    uint64_t id = t->v[i].id;
    bool incoming = t->v[i].incoming;
    node_tablet_unmap(t, i);
    node_cs_table_changed(n, t->name);
    st_err local = {0};
    st_err *e = err ? err : &local;
    st_code rc = sto_tablet_drop(n->db, id, e);
    if (rc != ST_OK && rc != ST_NOT_FOUND)
        drop_pending_add(n, id, incoming, e);
    return rc;
}

static int tablet_cmp(const void *a, const void *b) {
    return st_slice_cmp(st_buf_slice(&((const node_tablet *)a)->start),
                        st_buf_slice(&((const node_tablet *)b)->start));
}

static void tablets_free(node_tablets *t) {
    for (size_t i = 0; i < t->n; i++) {
        st_buf_free(&t->v[i].start);
        st_buf_free(&t->v[i].end);
    }
    free(t->v);
    t->v = NULL;
    t->n = 0;
}

st_code node_tablet_map(node_tablets *t, sto_tablet *st) {
    sto_tablet_info info;
    sto_tablet_info_get(st, &info);
    node_tablet *v = realloc(t->v, (t->n + 1) * sizeof *v);
    if (!v)
        return ST_RESOURCE_EXHAUSTED;
    t->v = v;
    node_tablet *nt = &v[t->n++];
    memset(nt, 0, sizeof *nt);
    nt->id = info.id;
    nt->st = st;
    /* the size check looks at it once: a tablet loaded at start, moved in or restored may be
     * over the split threshold with no write to come */
    nt->written = true;
    if (st_buf_append(&nt->start, info.start.data, info.start.len) != ST_OK ||
        st_buf_append(&nt->end, info.end.data, info.end.len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    /* Into place by binary search, not a sort of the whole map: a restore adds thousands of
     * tablets one by one, mostly at the end. */
    node_tablet added = *nt;
    size_t lo = 0, hi = t->n - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tablet_cmp(&t->v[mid], &added) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(&t->v[lo + 1], &t->v[lo], (t->n - 1 - lo) * sizeof *t->v);
    t->v[lo] = added;
    return ST_OK;
}

typedef struct load_state {
    node_ctx *n;
    uint64_t *orphans;
    size_t n_orphans;
    uint64_t max_counter;  /* largest counter part of any id (a node_num change keeps ids apart) */
    uint64_t catalog_next; /* the catalog's next tablet id counter as read */
    uint64_t stale_id;     /* an orphan made after the catalog was written (0: none) */
    char stale_table[NODE_TABLE_NAME_MAX + 1];
    st_code rc;
} load_state;

static void load_one(const sto_tablet_info *info, void *arg) {
    load_state *ls = arg;
    uint64_t counter = info->id & (((uint64_t)1 << NODE_TABLET_ID_COUNTER_BITS) - 1);
    if (counter > ls->max_counter)
        ls->max_counter = counter;
    char name[NODE_TABLE_NAME_MAX + 1];
    snprintf(name, sizeof name, "%.*s", (int)info->table.len, (const char *)info->table.data);
    node_tablets *t = node_tablets_find(ls->n, name);
    sto_tablet *st = NULL;
    if (!t || sto_tablet_get(ls->n->db, info->id, &st) != ST_OK) {
        if (!t && counter >= ls->catalog_next && !ls->stale_id) {
            ls->stale_id = info->id;
            snprintf(ls->stale_table, sizeof ls->stale_table, "%s", name);
        }
        uint64_t *o = realloc(ls->orphans, (ls->n_orphans + 1) * sizeof *o);
        if (o) {
            ls->orphans = o;
            o[ls->n_orphans++] = info->id;
        }
        return;
    }
    if (ls->rc == ST_OK)
        ls->rc = node_tablet_map(t, st);
}

static st_code incoming_save(node_ctx *n, uint64_t extra, st_err *err);

st_code node_tablet_create_as(node_ctx *n, node_tablets *t, st_slice start, st_slice end,
                              bool incoming, st_err *err) {
    uint64_t id = node_tablet_new_id(n);
    st_code rc = node_catalog_save(n->catalog, err);
    /* An incoming copy is named in DATA/incoming before storage has it, so a node killed
     * between the two drops it at its next start instead of serving it. */
    if (rc == ST_OK && incoming)
        rc = incoming_save(n, id, err);
    sto_tablet *st = NULL;
    if (rc == ST_OK)
        rc = sto_tablet_create(n->db, id, st_slice_cstr(t->name), start, end, &st, err);
    if (rc != ST_OK)
        return rc;
    if (node_tablet_map(t, st) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding a tablet");
    t->v[node_tablet_index(t, start)].incoming = incoming;
    t->v[node_tablet_index(t, start)].copy_touch_us = st_mono_us();
    node_repl_tablet_named(n, id, t->name);
    return ST_OK;
}

st_code node_tablet_create(node_ctx *n, node_tablets *t, st_slice start, st_slice end,
                           st_err *err) {
    return node_tablet_create_as(n, t, start, end, false, err);
}

st_code node_incoming_save(node_ctx *n, st_err *err) {
    return incoming_save(n, 0, err);
}

/* DATA/incoming from the map, plus tablet id extra (not yet in the map) unless 0. */
static st_code incoming_save(node_ctx *n, uint64_t extra, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    char line[32];
    st_code rc = ST_OK;
    if (extra) {
        int len = snprintf(line, sizeof line, "%llu\n", (unsigned long long)extra);
        rc = st_buf_append(&b, line, (size_t)len);
    }
    for (size_t i = 0; rc == ST_OK && i < n->n_tables; i++)
        for (size_t j = 0; rc == ST_OK && j < n->tables[i].n; j++)
            if (n->tables[i].v[j].incoming) {
                int len =
                    snprintf(line, sizeof line, "%llu\n", (unsigned long long)n->tables[i].v[j].id);
                rc = st_buf_append(&b, line, (size_t)len);
            }
    /* A copy whose drop is pending stays named: a restart drops it rather than serving it. */
    for (size_t i = 0; rc == ST_OK && i < n->n_drops; i++)
        if (n->drops[i].incoming) {
            int len = snprintf(line, sizeof line, "%llu\n", (unsigned long long)n->drops[i].id);
            rc = st_buf_append(&b, line, (size_t)len);
        }
    rc = node_data_file_save(n, NODE_INCOMING_FILE, rc, &b, err);
    st_buf_free(&b);
    return rc;
}

st_code node_data_file_save(node_ctx *n, const char *name, st_code built, const st_buf *b,
                            st_err *err) {
    char path[sizeof n->data_dir + 32];
    snprintf(path, sizeof path, "%s/%s", n->data_dir, name);
    if (built != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory saving %s", path);
    return st_env_write_atomic(st_env_posix(), path, b->len ? (const void *)b->data : "", b->len,
                               err);
}

/* The tablets DATA/incoming names: copies of moves that never completed (their source kept the
 * range), dropped at start. A missing file names none. */
static void drop_incoming(node_ctx *n) {
    char path[sizeof n->data_dir + sizeof NODE_INCOMING_FILE + 1];
    snprintf(path, sizeof path, "%s/%s", n->data_dir, NODE_INCOMING_FILE);
    st_buf b;
    st_buf_init(&b);
    st_err err = {0};
    if (st_env_read_all(st_env_posix(), path, &b, &err) == ST_OK &&
        st_buf_append(&b, "", 1) == ST_OK) {
        for (char *p = (char *)b.data; *p;) {
            char *end;
            unsigned long long id = strtoull(p, &end, 10);
            if (end == p)
                break;
            node_tablets *t;
            node_tablet *tab = node_tablet_by_id(n, id, &t);
            if (tab) {
                st_log(ST_LOG_WARN, "node",
                       "dropping tablet %llu: the copy of a move that did not complete", id);
                tab->incoming = true; /* a drop storage refuses keeps it named (incoming_save) */
                (void)node_tablet_drop(n, t, (size_t)(tab - t->v), NULL);
            }
            p = *end ? end + 1 : end;
        }
        (void)node_incoming_save(n, &err);
    }
    st_buf_free(&b);
}

static bool tablets_overlap(const node_tablet *a, const node_tablet *b) {
    return (a->end.len == 0 || st_slice_cmp(st_buf_slice(&b->start), st_buf_slice(&a->end)) < 0) &&
           (b->end.len == 0 || st_slice_cmp(st_buf_slice(&a->start), st_buf_slice(&b->end)) < 0);
}

static uint64_t id_counter(uint64_t id) {
    return id & (((uint64_t)1 << NODE_TABLET_ID_COUNTER_BITS) - 1);
}

/* Sets newer[i] to the id of a newer tablet of t (sorted by start) overlapping tablet i, else 0:
 * every pair is seen from its first member's forward scan, which stops at the first tablet
 * starting past its end. */
static void mark_overlapped(const node_tablets *t, uint64_t *newer) {
    for (size_t i = 0; i < t->n; i++)
        for (size_t j = i + 1; j < t->n && tablets_overlap(&t->v[i], &t->v[j]); j++) {
            bool i_older = id_counter(t->v[i].id) < id_counter(t->v[j].id);
            newer[i_older ? i : j] = t->v[i_older ? j : i].id;
        }
}

/* Two tablets of one table whose ranges overlap are never both served. Such a pair is left by a
 * drop that storage did not make (a full disk) under a build that forgot the tablet: a tablet is
 * only ever created over a range no mapped tablet of this node overlaps (CreateTablet, splits,
 * restores), so of two overlapping tablets the older one (lower id counter: the counter only
 * grows, whatever the node number) was already out of the map, dropped in intent, when the newer
 * one was made. It was a move's copy never activated (empty or partial), a tablet moved away
 * (stale since), or a split's parent. Serving it would answer reads without rows the newer one
 * holds and take writes into a dead copy, so it is dropped (a pending drop if storage still
 * refuses). */
static void drop_overlaps(node_ctx *n) {
    for (size_t k = 0; k < n->n_tables; k++) {
        node_tablets *t = &n->tables[k];
        uint64_t *newer = t->n > 1 ? calloc(t->n, sizeof *newer) : NULL;
        if (!newer)
            continue;
        mark_overlapped(t, newer);
        for (size_t i = t->n; i-- > 0;) {
            if (!newer[i])
                continue;
            st_log(ST_LOG_ERROR, "node",
                   "table=%s tablet=%" PRIu64 ": dropped, not served: newer tablet %" PRIu64
                   " of this node overlaps its range (an earlier drop of it did not reach storage)",
                   t->name, t->v[i].id, newer[i]);
            (void)node_tablet_drop(n, t, i, NULL);
        }
        free(newer);
    }
}

/* A tablet of a table the catalog lacks is a DeleteTable's leftover (the catalog is saved first,
 * then storage drops the tablets) only if the catalog was written after the tablet was made.
 * Every tablet id is taken from the catalog's counter, and the catalog holding it is saved
 * before storage makes the tablet, so an id at or past the saved counter means the catalog
 * is older than the tablet: an older copy put back, which lacks a table created since. Dropping
 * the tablet would lose that table's rows for good, so the start is refused as for a missing
 * catalog. */
static st_code stale_catalog_check(node_ctx *n, const load_state *ls, st_err *err) {
    if (!ls->stale_id)
        return ST_OK;
    if (!n->opts.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s/catalog is older than storage: it lacks table %s, whose tablet "
                          "%" PRIu64 " was made after the catalog was written (an older copy "
                          "put back?). Nothing was dropped: restore the catalog that goes with "
                          "DATA/storage, or start with --accept-data-loss to drop the tablets of "
                          "tables the catalog lacks",
                          n->data_dir, ls->stale_table, ls->stale_id);
    st_log(ST_LOG_ERROR, "node",
           "%s/catalog is older than storage: dropping tablets of tables it lacks, among them "
           "table %s (tablet %" PRIu64 "), and every row in them (--accept-data-loss)",
           n->data_dir, ls->stale_table, ls->stale_id);
    return ST_OK;
}

/* Builds the table -> tablets map from the catalog and storage's tablets; drops orphan tablets
 * (a crash between the two records) and, on a standalone node, gives a table without tablets its
 * first one (a cluster member's tablets come from the internal service only). */
static st_code load_tablets(node_ctx *n, st_err *err) {
    size_t count = node_catalog_count(n->catalog);
    n->tables = calloc(count ? count : 1, sizeof *n->tables);
    if (!n->tables)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory loading tablets");
    n->n_tables = count;
    for (size_t i = 0; i < count; i++)
        snprintf(n->tables[i].name, sizeof n->tables[i].name, "%s",
                 node_catalog_at(n->catalog, i)->name);
    load_state ls = {.n = n, .catalog_next = node_catalog_peek_tablet_id(n->catalog), .rc = ST_OK};
    sto_tablet_list(n->db, load_one, &ls);
    st_code rc = stale_catalog_check(n, &ls, err);
    for (size_t i = 0; rc == ST_OK && i < ls.n_orphans; i++) {
        st_log(ST_LOG_WARN, "node", "dropping tablet %llu of a table the catalog lacks",
               (unsigned long long)ls.orphans[i]);
        sto_tablet_drop(n->db, ls.orphans[i], NULL);
    }
    free(ls.orphans);
    if (rc != ST_OK)
        return rc;
    if (ls.rc != ST_OK)
        return st_err_set(err, ls.rc, "out of memory loading tablets");
    node_catalog_reserve_tablet_ids(n->catalog, ls.max_counter);
    drop_incoming(n);
    drop_overlaps(n);
    for (size_t i = 0; rc == ST_OK && i < count; i++) {
        if (n->tables[i].n == 0 && !node_in_cluster(n))
            rc = node_tablet_create(n, &n->tables[i], st_slice_make("", 0), st_slice_make("", 0),
                                    err);
        if (rc == ST_OK)
            rc = node_table_push_gc(n, node_catalog_at(n->catalog, i), err);
    }
    return rc;
}

/* Sets the table's GC rules on tablets [from, to) of t. */
static st_code push_gc_range(const node_table *meta, node_tablets *t, size_t from, size_t to,
                             st_err *err) {
    /* One more rule: change records live as long as the table's retention (0 when streams are
     * off, so compactions drop what is left of a history). */
    sto_family_gc *fams = calloc(meta->n_families + 1, sizeof *fams);
    sto_gc_rule *scratch =
        calloc(NODE_GC_NODES_MAX * (meta->n_families ? meta->n_families : 1), sizeof *scratch);
    if (!fams || !scratch) {
        free(fams);
        free(scratch);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting GC rules");
    }
    size_t used = 0;
    for (size_t i = 0; i < meta->n_families; i++) {
        fams[i].family = st_slice_cstr(meta->families[i].name);
        node_gc_to_sto(&meta->families[i].gc, &fams[i].rule, scratch, &used);
    }
    fams[meta->n_families].family = st_slice_make(NODE_CS_FAMILY, NODE_CS_FAMILY_LEN);
    fams[meta->n_families].rule =
        (sto_gc_rule){.kind = STO_GC_MAX_AGE, .max_age_us = meta->cs_retention_us};
    st_code rc = ST_OK;
    for (size_t i = from; rc == ST_OK && i < to; i++)
        rc = sto_tablet_set_gc(t->v[i].st, fams, meta->n_families + 1, err);
    free(fams);
    free(scratch);
    return rc;
}

st_code node_table_push_gc(node_ctx *n, const node_table *meta, st_err *err) {
    node_tablets *t = node_tablets_find(n, meta->name);
    if (!t)
        return ST_OK;
    node_cs_tables_changed(n);
    return push_gc_range(meta, t, 0, t->n, err);
}

st_code node_tablet_push_gc(node_ctx *n, const node_table *meta, node_tablets *t, size_t i,
                            st_err *err) {
    node_cs_tablet_added(n, meta, t->v[i].st);
    return push_gc_range(meta, t, i, i + 1, err);
}

/* Adds an empty tablet map entry for a new table, keeping the array sorted. */
node_tablets *node_tables_add(node_ctx *n, const char *name) {
    node_tablets *v = realloc(n->tables, (n->n_tables + 1) * sizeof *v);
    if (!v)
        return NULL;
    n->tables = v;
    size_t i = 0;
    while (i < n->n_tables && strcmp(v[i].name, name) < 0)
        i++;
    memmove(&v[i + 1], &v[i], (n->n_tables - i) * sizeof *v);
    n->n_tables++;
    memset(&v[i], 0, sizeof v[i]);
    snprintf(v[i].name, sizeof v[i].name, "%s", name);
    return &v[i];
}

/* Removes a table's map entry (its tablets must already be dropped from storage). */
void node_tables_remove(node_ctx *n, node_tablets *t) {
    node_cs_table_changed(n, t->name);
    tablets_free(t);
    size_t i = (size_t)(t - n->tables);
    memmove(&n->tables[i], &n->tables[i + 1], (n->n_tables - i - 1) * sizeof *n->tables);
    n->n_tables--;
}

/* ---- clock ---- */

int64_t node_server_ts_us(node_ctx *n) {
    (void)n;
    return st_wall_us() / 1000 * 1000;
}

uint64_t node_next_version(node_ctx *n) {
    int64_t now = st_wall_us();
    n->hlc_last_us = now > n->hlc_last_us ? now : n->hlc_last_us + 1;
    return STO_VERSION(n->hlc_last_us, n->opts.cluster_num);
}

void node_clock_observe(node_ctx *n, int64_t ts_us, const char *what, const char *table) {
    if (ts_us <= n->hlc_last_us)
        return;
    int64_t wall_us = st_wall_us();
    if (ts_us - wall_us <= NODE_CLOCK_AHEAD_MAX_US) {
        n->hlc_last_us = ts_us;
        return;
    }
    ST_LOG_LIMITED(ST_LOG_ERROR, "clock",
                   "event=clock_step_refused source=%s table=%s time_us=%" PRId64
                   " wall_us=%" PRId64 " ahead_s=%" PRId64
                   " msg=\"data from %s carries a time more than an hour ahead of this node's "
                   "clock; the clock stays, the data is applied with its versions (which outrank "
                   "later writes to the same cells): check the clocks of the peer cluster's and "
                   "the source node's hosts, and the backups imported into this instance\"",
                   what, table ? table : "-", ts_us, wall_us, (ts_us - wall_us) / 1000000, what);
}

/* ---- request helpers ---- */

static void *arena_pb_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_pb_free(void *data, void *ptr) {
    (void)data;
    (void)ptr;
}

ProtobufCMessage *node_unpack(rpc_call *call, const ProtobufCMessageDescriptor *desc,
                              st_slice bytes) {
    /* btu_pb_check first: protobuf-c recurses once per nested message, and a RowFilter or GC
     * rule nested thousands of levels deep would overflow the stack (the router forwards most
     * requests without unpacking them, so the node cannot count on it). */
    ProtobufCAllocator alloc = {arena_pb_alloc, arena_pb_free, rpc_call_arena(call)};
    st_err err = {0};
    ProtobufCMessage *m = btu_pb_unpack_request(desc, &alloc, bytes, &err);
    if (!m)
        node_fail(call, err.code, "%s", err.msg);
    return m;
}

st_code node_send(rpc_call *call, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = st_arena_alloc(rpc_call_arena(call), len ? len : 1);
    if (!buf)
        return ST_RESOURCE_EXHAUSTED;
    protobuf_c_message_pack(msg, buf);
    return rpc_call_send(call, st_slice_make(buf, len));
}

void node_reply(rpc_call *call, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "out of memory building the response");
        return;
    }
    protobuf_c_message_pack(msg, buf);
    st_code rc = rpc_call_send(call, st_slice_make(buf, len));
    free(buf);
    rpc_call_finish(call, rc == ST_CANCELLED ? ST_CANCELLED : rc,
                    rc == ST_OK ? NULL : "response could not be sent");
}

void node_fail(rpc_call *call, st_code code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st_log(ST_LOG_DEBUG, "node", "call=%s code=%s msg=\"%s\"", rpc_call_path(call),
           st_code_name(code), msg);
    rpc_call_finish(call, code, msg);
}

/* Decodes standard base64 (padding optional); false on a bad character. */
static bool base64_decode(const char *in, uint8_t *out, size_t cap, size_t *len) {
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (const char *p = in; *p && *p != '='; p++) {
        int v;
        char ch = *p;
        if (ch >= 'A' && ch <= 'Z')
            v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z')
            v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9')
            v = ch - '0' + 52;
        else if (ch == '+' || ch == '-')
            v = 62;
        else if (ch == '/' || ch == '_')
            v = 63;
        else
            return false;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n == cap)
                return false;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    *len = n;
    return true;
}

bool node_feature(rpc_call *call, uint32_t field_number) {
    const char *h = rpc_call_header(call, "bigtable-features");
    if (!h)
        return false;
    uint8_t raw[512];
    size_t len;
    if (!base64_decode(h, raw, sizeof raw, &len))
        return false;
    /* FeatureFlags are booleans: scan for a varint field with the given number set to 1. */
    const uint8_t *p = raw, *end = raw + len;
    while (p < end) {
        uint64_t key, v;
        if (!st_get_varint64(&p, end, &key))
            return false;
        uint32_t wire = (uint32_t)(key & 7), num = (uint32_t)(key >> 3);
        if (wire == 0) {
            if (!st_get_varint64(&p, end, &v))
                return false;
            if (num == field_number)
                return v != 0;
        } else if (wire == 2) {
            st_slice s;
            if (!st_get_len_prefixed(&p, end, &s))
                return false;
        } else {
            return false;
        }
    }
    return false;
}

st_code node_check_table_name(const char *name, st_err *err) {
    return btu_table_name_parse(name, NODE_TABLE_NAME_MAX, NULL, NULL, NULL, err);
}

node_tablets *node_table_or_fail(node_ctx *n, rpc_call *call, const char *table_name,
                                 node_table **meta) {
    st_err err;
    if (node_check_table_name(table_name, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return NULL;
    }
    node_table *m = node_catalog_find(n->catalog, table_name);
    node_tablets *t = m ? node_tablets_find(n, table_name) : NULL;
    if (!t) {
        node_fail(call, ST_NOT_FOUND, "table \"%s\" not found", table_name);
        return NULL;
    }
    if (meta)
        *meta = m;
    return t;
}

/* ---- writes ---- */

node_tablet *node_write_tablet(node_ctx *n, const char *table, st_slice row, st_err *err) {
    node_tablets *t = node_tablets_find(n, table);
    if (!t) {
        st_err_set(err, ST_NOT_FOUND, "table \"%s\" was deleted", table);
        return NULL;
    }
    node_tablet *tab = node_tablet_for_write(t, row);
    if (!tab)
        node_not_owner(n, err, table, row);
    return tab;
}

st_code node_write_fence_check(rpc_call *call, st_err *err) {
    const char *v = rpc_call_header(call, BTU_WRITE_BY_HEADER);
    if (!v)
        return ST_OK;
    char *end;
    long long by = strtoll(v, &end, 10);
    if (end == v || *end)
        return st_err_set(err, ST_INVALID_ARGUMENT, "malformed %s header \"%.40s\"",
                          BTU_WRITE_BY_HEADER, v);
    int64_t late_us = st_wall_us() - (int64_t)by;
    if (late_us <= 0)
        return ST_OK;
    st_log(ST_LOG_WARN, "node",
           "refused a write that reached this node %lld ms after its router's deadline for it "
           "(the node was paused or its clock is ahead of the router's)",
           (long long)(late_us / 1000));
    return st_err_set(err, ST_DEADLINE_EXCEEDED,
                      "the write reached this node %lld ms after its router's deadline for it "
                      "(the router may have sent it to another cluster meanwhile): not applied",
                      (long long)(late_us / 1000));
}

st_code node_row_prepare(node_ctx *n, const char *table, sto_row_mut *row, st_err *err) {
    node_tablet *tab = node_write_tablet(n, table, row->row, err);
    if (!tab)
        return err ? err->code : ST_FAILED_PRECONDITION;
    row->tablet_id = tab->id;
    tab->writes++; /* the hottest-tablet metric (metrics.c) */
    row->version = node_next_version(n);
    row->commit_ts_us = (uint64_t)STO_VERSION_TS_US(row->version);
    row->origin = n->opts.cluster_num;
    return ST_OK;
}

typedef struct write_op {
    node_ctx *n;
    node_write_done_fn done;
    void *arg;
    st_code code;
    uint64_t lsn;      /* of the write's last record */
    rpc_post post;     /* its completion's place in the server's post queue */
    node_cs_write *cs; /* its change records (changes_write.c); NULL when none */
    char msg[ST_ERR_MSG_MAX];
} write_op;

static void write_finish_on_loop(void *arg) {
    write_op *op = arg;
    if (op->code == ST_OK && op->lsn > op->n->written_lsn_max)
        op->n->written_lsn_max = op->lsn;
    __atomic_fetch_sub(&op->n->writes_in_flight, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&op->n->writes_finished, 1, __ATOMIC_RELAXED);
    node_cs_write_done(op->n, op->cs, op->code);
    if (op->code == ST_OK)
        node_repl_notify(op->n);
    op->done(op->n, op->code, op->code == ST_OK ? NULL : op->msg, op->arg);
    free(op);
}

/* Runs on storage's commit thread: hand the result to the loop. */
static void write_durable(st_code code, uint64_t lsn, const st_err *err, void *arg) {
    write_op *op = arg;
    op->code = code;
    op->lsn = lsn;
    if (code != ST_OK)
        snprintf(op->msg, sizeof op->msg, "%s", err ? err->msg : st_code_name(code));
    if (rpc_server_post_item(op->n->rpc, &op->post, write_finish_on_loop, op) != ST_OK) {
        /* The post queue is full (RPC_POST_QUEUE_MAX): the write stands but
         * its caller cannot be told; its call ends when the connection does. */
        st_log(ST_LOG_ERROR, "node", "could not deliver a write completion to the loop");
        node_cs_write_lost(op->n, op->cs);
        __atomic_fetch_add(&op->n->writes_finished, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&op->n->writes_in_flight, 1, __ATOMIC_RELAXED);
        free(op);
    }
}

st_code node_write(node_ctx *n, const sto_row_mut *rows, size_t count, st_err *err,
                   node_write_done_fn done, void *arg) {
    return node_write_mode(n, rows, count, NODE_WRITE_RECORD, err, done, arg);
}

st_code node_write_mode(node_ctx *n, const sto_row_mut *rows, size_t count, node_write_kind mode,
                        st_err *err, node_write_done_fn done, void *arg) {
    if (n->closing)
        return st_err_set(err, ST_UNAVAILABLE, "the node is shutting down; retry on another");
    write_op *op = calloc(1, sizeof *op);
    if (!op)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory queueing a write");
    op->n = n;
    op->done = done;
    op->arg = arg;
    /* Change records join the rows here, so every path that writes rows records them. */
    const sto_row_mut *out = rows;
    st_code rc = node_cs_write_prepare(n, rows, count, mode, &out, &op->cs, err);
    if (rc != ST_OK) {
        free(op);
        return rc;
    }
    /* In flight before storage has it: its completion may run (or be lost) at once. */
    node_cs_write *cs = op->cs;
    node_cs_write_started(n, cs);
    __atomic_fetch_add(&n->writes_in_flight, 1, __ATOMIC_RELAXED);
    rc = sto_write_async(n->db, out, count, err, write_durable, op);
    if (rc != ST_OK) {
        __atomic_fetch_sub(&n->writes_in_flight, 1, __ATOMIC_RELAXED);
        node_cs_write_abort(n, cs);
        free(op);
    } else {
        n->writes_started++;
    }
    return rc;
}

/* ---- open and close ---- */

static st_code open_storage(node_ctx *n, st_err *err) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/storage", n->data_dir);
    sto_options so;
    sto_options_default(&so);
    so.sync = n->opts.sync;
    if (n->opts.block_cache_bytes)
        so.block_cache_bytes = n->opts.block_cache_bytes;
    if (n->opts.memtable_bytes)
        so.memtable_bytes = n->opts.memtable_bytes;
    so.accept_data_loss = n->opts.accept_data_loss;
    if (!so.sync)
        st_log(ST_LOG_WARN, "node",
               "sync is OFF: acknowledged writes can be lost in a crash (--no-sync)");
    return sto_db_open(dir, &so, &n->db, err);
}

/* One node per data directory, for the process's lifetime: two would both acknowledge writes
 * and then delete each other's files (storage locks its own directory too; this lock also
 * covers the catalog and comes with the message an operator needs). */
static st_code lock_data_dir(node_ctx *n, st_env *env, st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/LOCK", n->data_dir);
    int64_t pid = 0;
    st_code rc = env->ops->lock(env, path, &n->data_lock, &pid, err);
    char who[64];
    if (rc == ST_FAILED_PRECONDITION)
        st_err_set(err, rc,
                   "data directory %s is in use by another strata-node (%s); stop it or use "
                   "another --data",
                   n->data_dir, st_lock_holder_str(who, sizeof who, pid));
    return rc;
}

/* The numbers a data directory was written under: its tablet ids carry the node number and its
 * versions and replication positions the cluster number, so a node started on it with other
 * numbers (one wrong digit on a hand-written command line) would ship its own cluster's log to
 * itself, never to the cluster it left out, and could hand out tablet ids another node holds.
 * Recorded at the first start (and by a directory written before the file existed), compared
 * at every later one. */
/* 0 is "none": a standalone start (no --cluster-num) of a cluster's directory replicates
 * nothing and says so (docs/cluster.md), and a standalone directory joining a cluster records
 * the numbers it gets. */
static bool numbers_differ(unsigned recorded, unsigned started) {
    return recorded && started && recorded != started;
}

static st_code identity_check(node_ctx *n, st_env *env, st_err *err) {
    char path[4200], want[96];
    snprintf(path, sizeof path, "%s/IDENTITY", n->data_dir);
    int len = snprintf(want, sizeof want, "strata-node v1 cluster=%u node=%u\n",
                       n->opts.cluster_num, n->opts.node_num);
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_env_read_all(env, path, &b, err);
    if (rc == ST_NOT_FOUND)
        rc = st_env_write_atomic(env, path, want, (size_t)len, err);
    else if (rc == ST_OK) {
        unsigned cluster = 0, node = 0;
        st_buf_append_byte(&b, 0);
        if (sscanf((const char *)b.data, "strata-node v1 cluster=%u node=%u", &cluster, &node) != 2)
            rc = st_err_set(err, ST_DATA_LOSS,
                            "%s is malformed: remove it and start the node with the numbers "
                            "this data directory was written under (it records them again)",
                            path);
        else if (numbers_differ(node, n->opts.node_num) ||
                 numbers_differ(cluster, n->opts.cluster_num))
            rc = st_err_set(err, ST_FAILED_PRECONDITION,
                            "data directory %s was written as cluster %u node %u but this node "
                            "was started as cluster %u node %u (--cluster-num, --node-num): start "
                            "it with its own numbers, or give the new ones an empty --data",
                            n->data_dir, cluster, node, n->opts.cluster_num, n->opts.node_num);
        else if ((!cluster && n->opts.cluster_num) || (!node && n->opts.node_num))
            rc = st_env_write_atomic(env, path, want, (size_t)len, err);
    }
    st_buf_free(&b);
    return rc;
}

static void count_tablet(const sto_tablet_info *info, void *arg) {
    (void)info;
    (*(size_t *)arg)++;
}

/* A catalog removed from a data directory whose storage still holds tablets would start with no
 * tables and drop every tablet as an orphan: refused unless the operator accepts the loss. */
static st_code catalog_missing_check(node_ctx *n, bool had_catalog, st_err *err) {
    size_t tablets = 0;
    if (had_catalog)
        return ST_OK;
    sto_tablet_list(n->db, count_tablet, &tablets);
    if (tablets == 0)
        return ST_OK;
    if (!n->opts.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s/catalog is missing but storage holds %zu tablet(s): the table "
                          "definitions were removed; restore this node's data from a replica or a "
                          "backup, or start with --accept-data-loss to drop those tablets",
                          n->data_dir, tablets);
    st_log(ST_LOG_ERROR, "node",
           "%s/catalog is missing: dropping %zu tablet(s) and every row in them "
           "(--accept-data-loss)",
           n->data_dir, tablets);
    return ST_OK;
}

st_code node_open(struct event_base *base, const node_opts *opts, node_ctx **out, st_err *err) {
    if (opts->node_num > NODE_NUM_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "node number %u is over the maximum %u",
                          opts->node_num, NODE_NUM_MAX);
    node_ctx *n = calloc(1, sizeof *n);
    if (!n)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting the node");
    n->opts = *opts;
    n->base = base;
    n->start_us = st_mono_us();
    snprintf(n->data_dir, sizeof n->data_dir, "%s", opts->data_dir);
    st_env *env = st_env_posix();
    /* The port first: a second node started on a taken port fails before it creates, locks or
     * recovers anything. Connections are refused until the node is ready (listen below). */
    rpc_server_opts so = {.ssl_ctx = opts->ssl_ctx, .unix_peer_role = RPC_ROLE_ROUTER};
    n->rpc = rpc_server_new(base, &so, err);
    st_code rc = n->rpc
                     ? rpc_server_bind(n->rpc, opts->listen_host, opts->listen_port, &n->port, err)
                     : (err ? err->code : ST_INTERNAL);
    if (rc == ST_OK)
        rc = env->ops->mkdirs(env, n->data_dir, err);
    if (rc == ST_OK)
        rc = lock_data_dir(n, env, err);
    if (rc == ST_OK)
        rc = identity_check(n, env, err);
    char cat_path[4200];
    snprintf(cat_path, sizeof cat_path, "%s/catalog", n->data_dir);
    bool had_catalog = true;
    if (rc == ST_OK)
        rc = env->ops->exists(env, cat_path, &had_catalog, err);
    if (rc == ST_OK)
        rc = node_catalog_open(env, n->data_dir, &n->catalog, err);
    if (rc == ST_OK)
        rc = open_storage(n, err);
    if (rc == ST_OK)
        rc = catalog_missing_check(n, had_catalog, err);
    if (rc == ST_OK)
        rc = node_cs_open(n, err);
    if (rc == ST_OK)
        rc = load_tablets(n, err);
    node_move_test_load(n);
    if (rc == ST_OK)
        rc = node_backups_open(n, err);
    if (rc == ST_OK && !(n->rowlocks = node_rowlocks_new()))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting the node");
    if (rc == ST_OK) {
        /* The Unix socket (a router on this host) is plaintext in an owner-only directory:
         * only the node's own user reaches it, and that user holds the keys anyway. */
        n->peer_opts = (rpc_client_opts){.ssl_ctx = opts->client_ssl_ctx,
                                         .peer_role = opts->client_ssl_ctx ? RPC_ROLE_NODE : NULL};
        rc = node_server_register(n, err);
        if (opts->ssl_ctx) /* who may call what (access.c) */
            rpc_server_set_guard(n->rpc, node_access_guard, n);
    }
    if (rc == ST_OK)
        rc = node_repl_start(n, err);
    if (rc == ST_OK)
        rc = node_moves_resume(n, err);
    if (rc == ST_OK)
        rc = rpc_server_listen_bound(n->rpc, err);
    if (rc == ST_OK)
        rc = node_split_timer_start(n, err);
    if (rc == ST_OK)
        rc = node_incoming_timer_start(n, err);
    if (rc != ST_OK) {
        node_close(n);
        return rc;
    }
    st_log(ST_LOG_INFO, "node", "serving data=%s listen=%s:%u tables=%zu node_num=%u", n->data_dir,
           opts->listen_host, n->port, n->n_tables, opts->node_num);
    *out = n;
    return ST_OK;
}

uint16_t node_port(const node_ctx *n) {
    return n->port;
}
struct sto_db *node_db(node_ctx *n) {
    return n->db;
}

void node_shutdown(node_ctx *n) {
    if (n && n->rpc)
        rpc_server_shutdown(n->rpc,
                            "the node is shutting down (a restart or a stop); retry the "
                            "request, it goes to the node's replacement or another node",
                            NODE_SHUTDOWN_GRACE_MS);
}

void node_close(node_ctx *n) {
    if (!n)
        return;
    /* New writes are refused; those in flight complete through the loop (their completions are
     * posted to the server, so it must outlive them). Then the server goes, which cancels every
     * call; one more loop pass lets cancelled scans free their snapshots; then storage closes. */
    n->closing = true;
    node_split_timer_stop(n);
    node_incoming_timer_stop(n);
    node_moves_abort(n);
    node_move_waiters_abort(n);
    if (n->cs)
        node_cs_stop_reports(n); /* compactions must not post to the server once it is gone */
    while (n->rpc && __atomic_load_n(&n->writes_in_flight, __ATOMIC_RELAXED) > 0)
        event_base_loop(n->base, EVLOOP_ONCE);
    node_jobs_wait(n);     /* before the server: jobs post their answers to it */
    node_backups_close(n); /* before the server: its workers post their answers to it */
    node_repl_stop(n);     /* before the server: its Apply handler uses the replication context */
    if (n->rpc) {
        rpc_server_free(n->rpc);
        event_base_loop(n->base, EVLOOP_NONBLOCK);
    }
    node_read_pool_free(n); /* the reads ended with the server */
    node_cs_close(n);       /* no write is in flight, no reader watches */
    if (n->db)
        sto_db_close(n->db);
    for (size_t i = 0; i < n->n_tables; i++)
        tablets_free(&n->tables[i]);
    free(n->tables);
    free(n->drops);
    node_catalog_free(n->catalog);
    node_rowlocks_free(n->rowlocks);
    st_env_posix()->ops->unlock(n->data_lock); /* last: the data directory is free again */
    free(n);
}

bool node_set_ssl_ctx(node_ctx *n, struct ssl_ctx_st *ctx) {
    return rpc_server_set_ssl_ctx(n->rpc, ctx);
}
