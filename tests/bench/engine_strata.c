/* engine_strata.c — the Strata adapter of storage-bench, through the public engine API
 * (strata/storage.h). The whole key space is one tablet (id 1, unbounded); a bench key is a row
 * key holding one cell: family "f", qualifier "q", a fixed timestamp, the bench value. Each write
 * carries a version STO_VERSION(n, 0) from a counter that starts at the wall clock on open, so
 * versions increase within and across opens. Point reads take a snapshot and iterate the
 * single-row range [key, key]; a scan iterates from key and stops after n cells (one per row),
 * which is what the node's ReadRows does. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "strata/storage.h"

#define STRATA_BENCH_TABLET_ID 1
#define STRATA_BENCH_TS_US 1
#define STRATA_BENCH_STACK_ROWS 16 /* batches up to this size are built on the stack */

typedef struct sdb {
    sto_db *db;
    sto_tablet *tablet;
    _Atomic uint64_t next_ts_us; /* version counter, see the top */
} sdb;

static int sdb_fail(const st_err *e, const char *what, char *err) {
    snprintf(err, BENCH_ERR_MAX, "strata %s: %.200s (%s)", what, e->msg, st_code_name(e->code));
    return -1;
}

static int sdb_open(const char *dir, const bench_engine_cfg *cfg, void **out, char *err) {
    sto_options o;
    sto_options_default(&o);
    o.sync = cfg->sync;
    o.memtable_bytes = cfg->memtable_bytes;
    /* One active memtable plus one being flushed: the same bound LevelDB and RocksDB have with
     * their write buffer and one immutable memtable. */
    o.memtable_budget_bytes = 2 * cfg->memtable_bytes;
    o.block_cache_bytes = cfg->cache_bytes;
    o.bloom_bits_per_key = cfg->bloom_bits_per_key;
    if (cfg->block_bytes)
        o.block_bytes = cfg->block_bytes;
    sdb *d = calloc(1, sizeof(*d));
    if (!d)
        return snprintf(err, BENCH_ERR_MAX, "strata open: out of memory"), -1;
    st_err e = {0};
    if (sto_db_open(dir, &o, &d->db, &e) != ST_OK) {
        free(d);
        return sdb_fail(&e, "open", err);
    }
    st_code c = sto_tablet_get(d->db, STRATA_BENCH_TABLET_ID, &d->tablet);
    if (c == ST_NOT_FOUND)
        c = sto_tablet_create(d->db, STRATA_BENCH_TABLET_ID, ST_SLICE_LIT("bench"),
                              st_slice_make(NULL, 0), st_slice_make(NULL, 0), &d->tablet, &e);
    if (c != ST_OK) {
        if (e.msg[0] == '\0')
            st_err_set(&e, c, "tablet %d unavailable", STRATA_BENCH_TABLET_ID);
        sto_db_close(d->db);
        free(d);
        return sdb_fail(&e, "tablet", err);
    }
    atomic_init(&d->next_ts_us, (uint64_t)st_wall_us());
    *out = d;
    return 0;
}

static void sdb_close(void *p) {
    sdb *d = p;
    sto_db_close(d->db);
    free(d);
}

static int sdb_put(void *p, const bench_kv *kvs, size_t n, char *err) {
    sdb *d = p;
    sto_row_mut stack_rows[STRATA_BENCH_STACK_ROWS];
    sto_mut stack_muts[STRATA_BENCH_STACK_ROWS];
    sto_row_mut *rows = stack_rows;
    sto_mut *muts = stack_muts;
    if (n > STRATA_BENCH_STACK_ROWS) {
        rows = malloc(n * sizeof(*rows));
        muts = malloc(n * sizeof(*muts));
        if (!rows || !muts) {
            free(rows);
            free(muts);
            return snprintf(err, BENCH_ERR_MAX, "strata put: out of memory"), -1;
        }
    }
    uint64_t ts = atomic_fetch_add(&d->next_ts_us, n);
    for (size_t i = 0; i < n; i++) {
        muts[i] = (sto_mut){.type = STO_MUT_SET_CELL,
                            .family = ST_SLICE_LIT("f"),
                            .qualifier = ST_SLICE_LIT("q"),
                            .ts_us = STRATA_BENCH_TS_US,
                            .value = st_slice_make(kvs[i].value, kvs[i].value_len)};
        rows[i] = (sto_row_mut){.tablet_id = STRATA_BENCH_TABLET_ID,
                                .row = st_slice_make(kvs[i].key, kvs[i].key_len),
                                .muts = &muts[i],
                                .n_muts = 1,
                                .version = STO_VERSION(ts + i, 0),
                                .commit_ts_us = ts + i};
    }
    st_err e = {0};
    st_code c = sto_write(d->db, rows, n, NULL, &e);
    if (rows != stack_rows) {
        free(rows);
        free(muts);
    }
    return c == ST_OK ? 0 : sdb_fail(&e, "write", err);
}

static int sdb_get(void *p, const uint8_t *key, size_t key_len, bool *found, size_t *value_len,
                   const uint8_t *check, bool *mismatch, char *err) {
    sdb *d = p;
    st_err e = {0};
    sto_snapshot *s = NULL;
    sto_iter *it = NULL;
    if (sto_snapshot_new(d->tablet, &s, &e) != ST_OK)
        return sdb_fail(&e, "snapshot", err);
    sto_range r = {.start = st_slice_make(key, key_len),
                   .end = st_slice_make(key, key_len),
                   .end_inclusive = true};
    st_code c = sto_iter_new(s, &r, false, &it, &e);
    sto_cell cell;
    if (c == ST_OK)
        c = sto_iter_next(it, &cell, &e);
    *found = c == ST_OK;
    *value_len = 0;
    if (c == ST_OK) {
        *value_len = cell.value.len;
        if (check)
            *mismatch = memcmp(cell.value.data, check, cell.value.len) != 0;
    }
    if (it)
        sto_iter_free(it);
    sto_snapshot_free(s);
    return c == ST_OK || c == ST_NOT_FOUND ? 0 : sdb_fail(&e, "get", err);
}

static int sdb_scan(void *p, const uint8_t *key, size_t key_len, size_t n, bench_scan_result *out,
                    char *err) {
    sdb *d = p;
    st_err e = {0};
    sto_snapshot *s = NULL;
    sto_iter *it = NULL;
    out->rows = out->bytes = 0;
    if (sto_snapshot_new(d->tablet, &s, &e) != ST_OK)
        return sdb_fail(&e, "snapshot", err);
    sto_range r = {.start = st_slice_make(key, key_len)};
    st_code c = sto_iter_new(s, &r, false, &it, &e);
    sto_cell cell;
    /* Every bench row holds exactly one cell, so cells are rows. */
    while (c == ST_OK && out->rows < n && (c = sto_iter_next(it, &cell, &e)) == ST_OK) {
        out->rows++;
        out->bytes += cell.row.len + cell.value.len;
    }
    if (it)
        sto_iter_free(it);
    sto_snapshot_free(s);
    return c == ST_OK || c == ST_NOT_FOUND ? 0 : sdb_fail(&e, "scan", err);
}

const bench_engine bench_engine_strata = {
    .name = "strata",
    .open = sdb_open,
    .put = sdb_put,
    .get = sdb_get,
    .scan = sdb_scan,
    .close = sdb_close,
};
