/*
 * Proves a node never serves two tablets of one table whose ranges overlap (node/node.c,
 * drop_overlaps; docs/cluster.md, Moves). Storage is given what a drop that never reached it
 * leaves: an older tablet the node had taken out of its map (as a node of an older build did
 * when the drop's manifest write failed on a full disk), then newer tablets over its range. At
 * the next open the older one must be dropped (not mapped, gone from storage) and the newer ones
 * served. Before, both were mapped and the node answered rows of the range from the stale copy
 * (an empty copy of a failed move: reads OK without the rows).
 *
 * Also: a DATA/outgoing line marked "moved" (a tablet moved away whose drop storage refused)
 * drops the tablet at open without asking the target; before, the tablet stayed mapped
 * (read-only, its reads served) while the node asked an unreachable target.
 *
 * Also: a catalog that lacks a table whose tablet storage holds. Written after the tablet was
 * made (a DeleteTable that crashed between its catalog save and the storage drop), the tablet
 * is dropped at open as before. An older copy of the catalog (written before the table was
 * created) refuses the open with DATA_LOSS naming DATA/catalog and the table, dropping nothing;
 * before, the tablet and its rows were dropped with a warning line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "node_internal.h"
#include "sto_test_util.h"
#include "strata/node.h"
#include "strata/storage.h"

#define TABLE "projects/p/instances/i/tables/t"

static struct event_base *g_base;

static node_ctx *open_node(const char *dir) {
    node_opts o;
    node_opts_default(&o);
    o.data_dir = dir;
    o.listen_port = 0;
    o.sync = false;
    o.node_num = 1; /* a cluster member: no automatic first tablet */
    o.cluster_num = 3;
    node_ctx *n = NULL;
    st_err err = {0};
    if (node_open(g_base, &o, &n, &err) != ST_OK)
        fail_msg("node_open: %s", err.msg);
    return n;
}

static node_tablets *add_table(node_ctx *n) {
    node_table *meta;
    st_err err = {0};
    assert_int_equal(node_catalog_add(n->catalog, TABLE, 1, &meta, &err), ST_OK);
    assert_int_equal(node_catalog_save(n->catalog, &err), ST_OK);
    node_tablets *t = node_tables_add(n, TABLE);
    assert_non_null(t);
    return t;
}

static uint64_t create(node_ctx *n, node_tablets *t, const char *start, const char *end) {
    st_err err = {0};
    assert_int_equal(node_tablet_create(n, t, st_slice_cstr(start), st_slice_cstr(end), &err),
                     ST_OK);
    return t->v[node_tablet_index(t, st_slice_cstr(start))].id;
}

static bool in_storage(node_ctx *n, uint64_t id) {
    sto_tablet *st;
    return sto_tablet_get(node_db(n), id, &st) == ST_OK;
}

static void test_older_overlapped_tablet_dropped_at_open(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "open_overlap");
    node_ctx *n = open_node(dir);
    node_tablets *t = add_table(n);
    /* Two generations forgotten by the node and kept by storage, then the live tablets. */
    uint64_t stale = create(n, t, "", "");
    node_tablet_unmap(t, 0);
    uint64_t other = create(n, t, "a", "z");
    node_tablet_unmap(t, 0);
    uint64_t left = create(n, t, "", "m"), right = create(n, t, "m", "");
    node_close(n);

    n = open_node(dir);
    t = node_tablets_find(n, TABLE);
    assert_non_null(t);
    assert_int_equal(t->n, 2);
    assert_int_equal(t->v[0].id, left);
    assert_int_equal(t->v[1].id, right);
    assert_false(in_storage(n, stale));
    assert_false(in_storage(n, other));
    assert_true(in_storage(n, left) && in_storage(n, right));
    node_close(n);

    n = open_node(dir); /* nothing left to drop: the same two tablets */
    t = node_tablets_find(n, TABLE);
    assert_int_equal(t->n, 2);
    node_close(n);
    tu_rmrf(dir);
}

static void test_moved_line_drops_at_open(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "open_moved");
    node_ctx *n = open_node(dir);
    node_tablets *t = add_table(n);
    uint64_t moved = create(n, t, "", "");
    node_close(n);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, NODE_OUTGOING_FILE);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* The target cannot be reached: only the mark can settle it. */
    fprintf(f, "%llu 2199023255553 127.0.0.1:1 moved\n", (unsigned long long)moved);
    fclose(f);

    n = open_node(dir);
    t = node_tablets_find(n, TABLE);
    assert_int_equal(t->n, 0);
    assert_false(in_storage(n, moved));
    node_close(n);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fgetc(f), EOF); /* the line went with the tablet */
    fclose(f);
    tu_rmrf(dir);
}

static st_code try_open(const char *dir, bool accept, node_ctx **n, st_err *err) {
    node_opts o;
    node_opts_default(&o);
    o.data_dir = dir;
    o.listen_port = 0;
    o.sync = false;
    o.node_num = 1;
    o.cluster_num = 3;
    o.accept_data_loss = accept;
    return node_open(g_base, &o, n, err);
}

static void copy_file(const char *from, const char *to) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp %s %s", from, to);
    assert_int_equal(system(cmd), 0);
}

#define TABLE2 "projects/p/instances/i/tables/t2"

static void test_older_catalog_refused(void **state) {
    (void)state;
    char dir[512], cat[600], old[600];
    tu_tmpdir(dir, sizeof dir, "open_oldcat");
    snprintf(cat, sizeof cat, "%s/catalog", dir);
    snprintf(old, sizeof old, "%s.catalog", dir);
    node_ctx *n = open_node(dir);
    node_tablets *t = add_table(n);
    create(n, t, "", "");
    copy_file(cat, old); /* the catalog before t2 existed */
    node_table *meta;
    st_err err = {0};
    assert_int_equal(node_catalog_add(n->catalog, TABLE2, 1, &meta, &err), ST_OK);
    assert_int_equal(node_catalog_save(n->catalog, &err), ST_OK);
    node_tablets *t2 = node_tables_add(n, TABLE2);
    assert_non_null(t2);
    uint64_t id2 = create(n, t2, "", "");
    node_close(n);

    copy_file(old, cat);
    n = NULL;
    assert_int_equal(try_open(dir, false, &n, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "catalog is older than storage"));
    assert_non_null(strstr(err.msg, TABLE2));
    n = NULL;
    assert_int_equal(try_open(dir, false, &n, &err), ST_DATA_LOSS); /* nothing was dropped */
    n = NULL;
    assert_int_equal(try_open(dir, true, &n, &err), ST_OK); /* --accept-data-loss */
    assert_null(node_tablets_find(n, TABLE2));
    assert_false(in_storage(n, id2));
    assert_non_null(node_tablets_find(n, TABLE));
    node_close(n);
    n = open_node(dir); /* no flag needed again */
    node_close(n);
    tu_rmrf(dir);
    unlink(old);
}

/* A DeleteTable killed after its catalog save, before storage dropped the tablets: dropped at
 * open as before. */
static void test_deleted_table_leftover_dropped(void **state) {
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "open_deleted");
    node_ctx *n = open_node(dir);
    node_tablets *t = add_table(n);
    uint64_t id = create(n, t, "", "");
    st_err err = {0};
    assert_int_equal(node_catalog_remove(n->catalog, TABLE, &err), ST_OK);
    assert_int_equal(node_catalog_save(n->catalog, &err), ST_OK);
    node_close(n);
    n = open_node(dir);
    assert_null(node_tablets_find(n, TABLE));
    assert_false(in_storage(n, id));
    node_close(n);
    tu_rmrf(dir);
}

int main(void) {
    g_base = event_base_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_older_overlapped_tablet_dropped_at_open),
        cmocka_unit_test(test_moved_line_drops_at_open),
        cmocka_unit_test(test_older_catalog_refused),
        cmocka_unit_test(test_deleted_table_leftover_dropped),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    event_base_free(g_base);
    return rc;
}
