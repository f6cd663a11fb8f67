/* catalog.h — a node's durable table catalog (private to node/): tables and their column families
 * with GC rules. Which tablets hold a table's rows is storage's record (sto_tablet_list gives
 * each tablet's table name), not kept twice here: at start the node drops tablets of tables the
 * catalog lacks and, when standalone, creates one for a table that has none. One file, `catalog`,
 * in the node's data directory, rewritten atomically on every change (format:
 * docs/formats/catalog.md). Changes are rare (admin calls, splits), so a whole-file rewrite is
 * simpler than a log and small enough.
 *
 * Not thread-safe: the node calls it from its event loop thread only. */
#ifndef NODE_CATALOG_H
#define NODE_CATALOG_H

#include "strata/env.h"
#include "strata/storage.h"

#define NODE_TABLE_NAME_MAX 512
#define NODE_FAMILY_NAME_MAX 64
#define NODE_FAMILIES_MAX 1000
#define NODE_GC_DEPTH_MAX 16
#define NODE_GC_NODES_MAX 256 /* rules in one family's GC tree; Bigtable caps its size at 500 B */

/* A GC rule tree owned by the catalog (children allocated with it). */
typedef struct node_gc {
    sto_gc_kind kind;
    int64_t max_versions;
    int64_t max_age_us;
    struct node_gc *children;
    size_t n_children;
} node_gc;

typedef struct node_family {
    char name[NODE_FAMILY_NAME_MAX + 1];
    node_gc gc;
} node_family;

typedef struct node_table {
    char name[NODE_TABLE_NAME_MAX + 1]; /* projects/P/instances/I/tables/T */
    int64_t create_time_us;
    bool deletion_protection;
    /* Change streams (docs/changestreams.md): how long records are kept (0 = streams off) and
     * the node's clock when they were last turned on (0 when off). */
    int64_t cs_retention_us;
    int64_t cs_since_us;
    node_family *families;
    size_t n_families;
    /* Families whose cells a job is deleting (node_family_purge_start), one entry per running
     * purge: out of `families`, so no write reaches them, yet saved with the table, so a node
     * that stops before the purge ends still has the family on disk and the drop can be retried
     * (docs/cluster.md, "Work off the loop"). */
    node_family *purging;
    size_t n_purging;
} node_table;

typedef struct node_catalog node_catalog;

/* Loads dir/catalog (an absent file is an empty catalog). ST_DATA_LOSS on a corrupt file. */
st_code node_catalog_open(st_env *env, const char *dir, node_catalog **out, st_err *err);
void node_catalog_free(node_catalog *c);
/* Writes the whole catalog durably (tmp + rename + dir sync). */
st_code node_catalog_save(node_catalog *c, st_err *err);

size_t node_catalog_count(const node_catalog *c);
node_table *node_catalog_at(node_catalog *c, size_t i);           /* tables sorted by name */
node_table *node_catalog_find(node_catalog *c, const char *name); /* NULL when absent */
/* Adds an empty table (no families, no tablets); ALREADY_EXISTS if present. The returned pointer
 * is valid until the next add or remove. Not saved until node_catalog_save. */
st_code node_catalog_add(node_catalog *c, const char *name, int64_t create_time_us,
                         node_table **out, st_err *err);
st_code node_catalog_remove(node_catalog *c, const char *name, st_err *err);
/* Allocates a fresh tablet id counter, never reused (persisted with the next save). The node
 * puts its node number above it (node_tablet_new_id). */
uint64_t node_catalog_next_tablet_id(node_catalog *c);
/* The counter the next tablet id will take (as saved, until one is taken). */
uint64_t node_catalog_peek_tablet_id(const node_catalog *c);
/* Makes the next counter exceed used (after finding tablets the catalog had not counted). */
void node_catalog_reserve_tablet_ids(node_catalog *c, uint64_t used);

/* Frees a table's families (a table built outside the catalog, e.g. a parsed schema). */
void node_table_deinit(node_table *t);

/* Families. set replaces or adds (rule deep-copied); drop removes (NOT_FOUND if absent). */
node_family *node_table_family(node_table *t, st_slice name);
st_code node_table_family_set(node_table *t, const char *name, const node_gc *gc, st_err *err);
st_code node_table_family_drop(node_table *t, const char *name, st_err *err);
/* A purge of family name begins: the family leaves `families` for `purging` (a family already
 * purging gets one more entry). NOT_FOUND when it is in neither. */
st_code node_table_purge_begin(node_table *t, const char *name, st_err *err);
/* A purge of family name ended: its entry goes; with restore (the purge failed) the family is
 * back in `families` unless it was created again meanwhile. */
void node_table_purge_end(node_table *t, const char *name, bool restore);

/* GC trees: deep copy (dst is overwritten) and free; validation against the limits above. */
st_code node_gc_copy(node_gc *dst, const node_gc *src, st_err *err);
void node_gc_free(node_gc *g);
/* The storage view of a rule (children point into g; valid while g lives). scratch must have
 * room for NODE_GC_NODES_MAX rules. */
void node_gc_to_sto(const node_gc *g, sto_gc_rule *out, sto_gc_rule *scratch, size_t *used);

#endif
