/* catalog_test.c — proves the node catalog keeps tables, families and nested GC rules across a
 * save and reopen, rejects oversized rules, and reports a corrupted file as DATA_LOSS instead of
 * crashing: each test builds a catalog in a temporary directory, saves, reopens and compares. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "catalog.h"

static void tmpdir(char *out, size_t cap, const char *name) {
    const char *base = getenv("STRATA_TEST_TMP");
    snprintf(out, cap, "%s/catalog_%s_%d", base ? base : "/tmp", name, (int)getpid());
    st_env *env = st_env_posix();
    assert_int_equal(env->ops->mkdirs(env, out, NULL), ST_OK);
}

static void test_catalog_roundtrip(void **state) {
    (void)state;
    char dir[512];
    tmpdir(dir, sizeof dir, "rt");
    st_env *env = st_env_posix();
    st_err err;
    node_catalog *c;
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    assert_int_equal(node_catalog_count(c), 0);
    node_table *t;
    assert_int_equal(node_catalog_add(c, "projects/p/instances/i/tables/b", 42, &t, &err), ST_OK);
    assert_int_equal(node_catalog_add(c, "projects/p/instances/i/tables/a", 7, &t, &err), ST_OK);
    assert_int_equal(node_catalog_add(c, "projects/p/instances/i/tables/a", 7, &t, &err),
                     ST_ALREADY_EXISTS);

    node_gc kids[2] = {{.kind = STO_GC_MAX_VERSIONS, .max_versions = 3},
                       {.kind = STO_GC_MAX_AGE, .max_age_us = 86400000000LL}};
    node_gc rule = {.kind = STO_GC_UNION, .children = kids, .n_children = 2};
    t = node_catalog_find(c, "projects/p/instances/i/tables/a");
    assert_non_null(t);
    assert_int_equal(node_table_family_set(t, "cf1", &rule, &err), ST_OK);
    node_gc none = {.kind = STO_GC_NONE};
    assert_int_equal(node_table_family_set(t, "cf2", &none, &err), ST_OK);
    uint64_t id1 = node_catalog_next_tablet_id(c);
    assert_int_equal(node_catalog_save(c, &err), ST_OK);
    node_catalog_free(c);

    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    assert_int_equal(node_catalog_count(c), 2);
    assert_string_equal(node_catalog_at(c, 0)->name, "projects/p/instances/i/tables/a");
    t = node_catalog_at(c, 0);
    assert_int_equal(t->create_time_us, 7);
    assert_int_equal(t->n_families, 2);
    node_family *f = node_table_family(t, ST_SLICE_LIT("cf1"));
    assert_non_null(f);
    assert_int_equal(f->gc.kind, STO_GC_UNION);
    assert_int_equal(f->gc.n_children, 2);
    assert_int_equal(f->gc.children[0].max_versions, 3);
    assert_int_equal(f->gc.children[1].max_age_us, 86400000000LL);
    assert_true(node_catalog_next_tablet_id(c) > id1);

    sto_gc_rule scratch[NODE_GC_NODES_MAX], top;
    size_t used = 0;
    node_gc_to_sto(&f->gc, &top, scratch, &used);
    assert_int_equal(top.kind, STO_GC_UNION);
    assert_int_equal(used, 2);
    assert_int_equal(top.children[1].kind, STO_GC_MAX_AGE);

    assert_int_equal(node_table_family_drop(t, "cf1", &err), ST_OK);
    assert_int_equal(node_table_family_drop(t, "cf1", &err), ST_NOT_FOUND);
    assert_int_equal(node_catalog_remove(c, "projects/p/instances/i/tables/b", &err), ST_OK);
    assert_int_equal(node_catalog_count(c), 1);
    node_catalog_free(c);
}

static void test_catalog_rejects_deep_rules(void **state) {
    (void)state;
    node_gc levels[NODE_GC_DEPTH_MAX + 2];
    for (int i = 0; i < NODE_GC_DEPTH_MAX + 2; i++) {
        levels[i] = (node_gc){.kind = STO_GC_UNION};
        if (i + 1 < NODE_GC_DEPTH_MAX + 2) {
            levels[i].children = &levels[i + 1];
            levels[i].n_children = 1;
        }
    }
    node_gc copy;
    st_err err;
    assert_int_equal(node_gc_copy(&copy, &levels[0], &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "GC rule too large"));
}

/* Every damage (a flipped byte, a short or empty file) is DATA_LOSS with the ways out of a missing
 * catalog: a replica, or the file moved aside and --accept-data-loss. */
static void assert_damaged(st_env *env, const char *dir) {
    node_catalog *c;
    st_err err;
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "restore this node's data from a replica"));
    assert_non_null(strstr(err.msg, "move the file aside and start with --accept-data-loss"));
}

static void test_catalog_corruption_is_data_loss(void **state) {
    (void)state;
    char dir[512], path[600];
    tmpdir(dir, sizeof dir, "corrupt");
    st_env *env = st_env_posix();
    st_err err;
    node_catalog *c;
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    node_table *t;
    assert_int_equal(node_catalog_add(c, "projects/p/instances/i/tables/x", 1, &t, &err), ST_OK);
    node_gc none = {.kind = STO_GC_NONE};
    assert_int_equal(node_table_family_set(t, "f", &none, &err), ST_OK);
    assert_int_equal(node_catalog_save(c, &err), ST_OK);
    node_catalog_free(c);

    snprintf(path, sizeof path, "%s/catalog", dir);
    st_buf data;
    st_buf_init(&data);
    assert_int_equal(st_env_read_all(env, path, &data, &err), ST_OK);
    for (size_t i = 0; i < data.len; i++) {
        data.data[i] ^= 0x5a;
        assert_int_equal(st_env_write_atomic(env, path, data.data, data.len, &err), ST_OK);
        assert_damaged(env, dir);
        data.data[i] ^= 0x5a;
    }
    for (size_t len = 0; len < data.len; len++) {
        assert_int_equal(st_env_write_atomic(env, path, data.data, len, &err), ST_OK);
        assert_damaged(env, dir);
    }
    st_buf_free(&data);
    env->ops->remove(env, path, NULL);
}

/* A fresh catalog in a new directory dir (named after tag) holding table "s" with family "f"
 * (no GC); *t is the table. */
static node_catalog *catalog_with_s(char *dir, size_t cap, const char *tag, node_table **t) {
    tmpdir(dir, cap, tag);
    st_err err;
    node_catalog *c;
    assert_int_equal(node_catalog_open(st_env_posix(), dir, &c, &err), ST_OK);
    assert_int_equal(node_catalog_add(c, "projects/p/instances/i/tables/s", 9, t, &err), ST_OK);
    node_gc none = {.kind = STO_GC_NONE};
    assert_int_equal(node_table_family_set(*t, "f", &none, &err), ST_OK);
    return c;
}

/* Change stream settings survive a save and reopen. */
static void test_catalog_change_stream_roundtrip(void **state) {
    (void)state;
    char dir[512];
    st_env *env = st_env_posix();
    st_err err;
    node_table *t;
    node_catalog *c = catalog_with_s(dir, sizeof dir, "cs", &t);
    t->cs_retention_us = 3LL * 86400 * 1000000;
    t->cs_since_us = 1234567890123LL;
    t->deletion_protection = true;
    assert_int_equal(node_catalog_save(c, &err), ST_OK);
    node_catalog_free(c);
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    t = node_catalog_find(c, "projects/p/instances/i/tables/s");
    assert_non_null(t);
    assert_int_equal(t->cs_retention_us, 3LL * 86400 * 1000000);
    assert_int_equal(t->cs_since_us, 1234567890123LL);
    assert_true(t->deletion_protection);
    assert_int_equal(t->n_families, 1);
    node_catalog_free(c);
}

/* Saves c, reopens it from dir and returns the number of families of table "s" there. */
static size_t families_on_disk(node_catalog *c, st_env *env, const char *dir) {
    st_err err;
    assert_int_equal(node_catalog_save(c, &err), ST_OK);
    node_catalog *back;
    assert_int_equal(node_catalog_open(env, dir, &back, &err), ST_OK);
    node_table *t = node_catalog_find(back, "projects/p/instances/i/tables/s");
    assert_non_null(t);
    size_t n = t->n_families;
    node_catalog_free(back);
    return n;
}

/* A family being purged is out of the table in memory but saved with it until every purge of
 * it ended (once, also when it was created again meanwhile); a failed purge puts it back. */
static void test_catalog_purging_family_saved(void **state) {
    (void)state;
    char dir[512];
    st_env *env = st_env_posix();
    st_err err;
    node_table *t;
    node_catalog *c = catalog_with_s(dir, sizeof dir, "purge", &t);
    node_gc none = {.kind = STO_GC_NONE};
    assert_int_equal(node_table_family_set(t, "g", &none, &err), ST_OK);
    assert_int_equal(node_table_purge_begin(t, "f", &err), ST_OK);
    assert_int_equal(node_table_purge_begin(t, "f", &err), ST_OK); /* a second drop joins */
    assert_int_equal(node_table_purge_begin(t, "h", &err), ST_NOT_FOUND);
    assert_null(node_table_family(t, st_slice_cstr("f")));
    assert_int_equal(families_on_disk(c, env, dir), 2);
    assert_int_equal(node_table_family_set(t, "f", &none, &err), ST_OK); /* created again */
    assert_int_equal(families_on_disk(c, env, dir), 2);
    node_table_purge_end(t, "f", false);
    assert_int_equal(families_on_disk(c, env, dir), 2);
    assert_int_equal(node_table_family_drop(t, "f", &err), ST_OK);
    assert_int_equal(families_on_disk(c, env, dir), 2); /* the other purge still runs */
    node_table_purge_end(t, "f", false);
    assert_int_equal(families_on_disk(c, env, dir), 1);
    assert_int_equal(node_table_purge_begin(t, "g", &err), ST_OK);
    node_table_purge_end(t, "g", true); /* failed: back */
    assert_non_null(node_table_family(t, st_slice_cstr("g")));
    assert_int_equal(t->n_purging, 0);
    assert_int_equal(families_on_disk(c, env, dir), 1);
    node_catalog_free(c);
}

/* A version 1 file (before change streams) still opens: its tables have streams off. */
static void test_catalog_reads_version_1(void **state) {
    (void)state;
    char dir[512], path[600];
    tmpdir(dir, sizeof dir, "v1");
    snprintf(path, sizeof path, "%s/catalog", dir);
    const char *name = "projects/p/instances/i/tables/old";
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(st_buf_append(&b, "STRCAT01", 8), ST_OK);
    st_buf_append_varint64(&b, 17); /* next_tablet_id */
    st_buf_append_varint64(&b, 1);  /* n_tables */
    st_buf_append_varint64(&b, strlen(name));
    st_buf_append(&b, name, strlen(name));
    st_buf_append_varint64(&b, 55); /* create_time_us */
    st_buf_append_byte(&b, 1);      /* deletion_protection */
    st_buf_append_varint64(&b, 1);  /* n_families */
    st_buf_append_varint64(&b, 2);
    st_buf_append(&b, "cf", 2);
    st_buf_append_byte(&b, STO_GC_MAX_VERSIONS);
    st_buf_append_varint64(&b, 2);
    st_buf_append_varint64(&b, 0);
    st_buf_append_varint64(&b, 0);
    st_buf_append_fixed32(&b, st_crc_mask(st_crc32c(0, b.data, b.len)));
    st_env *env = st_env_posix();
    st_err err;
    assert_int_equal(st_env_write_atomic(env, path, b.data, b.len, &err), ST_OK);
    st_buf_free(&b);
    node_catalog *c;
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    node_table *t = node_catalog_find(c, name);
    assert_non_null(t);
    assert_int_equal(t->create_time_us, 55);
    assert_true(t->deletion_protection);
    assert_int_equal(t->cs_retention_us, 0);
    assert_int_equal(t->cs_since_us, 0);
    assert_int_equal(t->n_families, 1);
    assert_int_equal(t->families[0].gc.max_versions, 2);
    assert_true(node_catalog_next_tablet_id(c) >= 17);
    /* Saved again, it becomes version 2 and still reads back the same. */
    t->cs_retention_us = 86400000000LL;
    assert_int_equal(node_catalog_save(c, &err), ST_OK);
    node_catalog_free(c);
    assert_int_equal(node_catalog_open(env, dir, &c, &err), ST_OK);
    t = node_catalog_find(c, name);
    assert_non_null(t);
    assert_int_equal(t->cs_retention_us, 86400000000LL);
    assert_int_equal(t->families[0].gc.max_versions, 2);
    node_catalog_free(c);
    env->ops->remove(env, path, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_catalog_roundtrip),
        cmocka_unit_test(test_catalog_rejects_deep_rules),
        cmocka_unit_test(test_catalog_corruption_is_data_loss),
        cmocka_unit_test(test_catalog_change_stream_roundtrip),
        cmocka_unit_test(test_catalog_reads_version_1),
        cmocka_unit_test(test_catalog_purging_family_saved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
