/* engine_rocksdb.c — the RocksDB adapter of storage-bench, through RocksDB's C API (rocksdb/c.h).
 * Options: an LRU block cache of cfg->cache_bytes, a full bloom filter with
 * cfg->bloom_bits_per_key, write_buffer_size = cfg->memtable_bytes, default leveled compaction and
 * everything else RocksDB's defaults (4 KiB blocks, snappy, 2 background jobs). Writes are
 * sync=true when cfg->sync. Point reads use pinned slices (no value copy), as db_bench does. */
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct rdb {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_block_based_table_options_t *topts;
    rocksdb_cache_t *cache;
    rocksdb_writeoptions_t *wopts;
    rocksdb_readoptions_t *ropts;
} rdb;

/* Copies RocksDB's malloc'ed error text into err and frees it. */
static int rdb_fail(char *rerr, const char *what, char *err) {
    snprintf(err, BENCH_ERR_MAX, "rocksdb %s: %s", what, rerr ? rerr : "failed");
    rocksdb_free(rerr);
    return -1;
}

static void rdb_close(void *p) {
    rdb *d = p;
    if (d->db)
        rocksdb_close(d->db);
    if (d->ropts)
        rocksdb_readoptions_destroy(d->ropts);
    if (d->wopts)
        rocksdb_writeoptions_destroy(d->wopts);
    if (d->opts)
        rocksdb_options_destroy(d->opts);
    if (d->topts)
        rocksdb_block_based_options_destroy(d->topts);
    if (d->cache)
        rocksdb_cache_destroy(d->cache);
    free(d);
}

static int rdb_open(const char *dir, const bench_engine_cfg *cfg, void **out, char *err) {
    rdb *d = calloc(1, sizeof(*d));
    if (!d)
        return snprintf(err, BENCH_ERR_MAX, "rocksdb open: out of memory"), -1;
    d->cache = rocksdb_cache_create_lru(cfg->cache_bytes);
    d->topts = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(d->topts, d->cache);
    if (cfg->block_bytes)
        rocksdb_block_based_options_set_block_size(d->topts, cfg->block_bytes);
    /* The table options take ownership of the filter policy. */
    rocksdb_block_based_options_set_filter_policy(
        d->topts, rocksdb_filterpolicy_create_bloom_full(cfg->bloom_bits_per_key));
    d->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(d->opts, 1);
    rocksdb_options_set_write_buffer_size(d->opts, cfg->memtable_bytes);
    rocksdb_options_set_block_based_table_factory(d->opts, d->topts);
    d->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(d->wopts, cfg->sync);
    d->ropts = rocksdb_readoptions_create();
    char *rerr = NULL;
    d->db = rocksdb_open(d->opts, dir, &rerr);
    if (rerr) {
        rdb_close(d);
        return rdb_fail(rerr, "open", err);
    }
    *out = d;
    return 0;
}

static int rdb_put(void *p, const bench_kv *kvs, size_t n, char *err) {
    rdb *d = p;
    char *rerr = NULL;
    if (n == 1) {
        rocksdb_put(d->db, d->wopts, (const char *)kvs[0].key, kvs[0].key_len,
                    (const char *)kvs[0].value, kvs[0].value_len, &rerr);
    } else {
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        for (size_t i = 0; i < n; i++)
            rocksdb_writebatch_put(b, (const char *)kvs[i].key, kvs[i].key_len,
                                   (const char *)kvs[i].value, kvs[i].value_len);
        rocksdb_write(d->db, d->wopts, b, &rerr);
        rocksdb_writebatch_destroy(b);
    }
    return rerr ? rdb_fail(rerr, "write", err) : 0;
}

static int rdb_get(void *p, const uint8_t *key, size_t key_len, bool *found, size_t *value_len,
                   const uint8_t *check, bool *mismatch, char *err) {
    rdb *d = p;
    char *rerr = NULL;
    rocksdb_pinnableslice_t *ps =
        rocksdb_get_pinned(d->db, d->ropts, (const char *)key, key_len, &rerr);
    if (rerr)
        return rdb_fail(rerr, "get", err);
    *found = ps != NULL;
    *value_len = 0;
    if (ps) {
        size_t vlen = 0;
        const char *v = rocksdb_pinnableslice_value(ps, &vlen);
        *value_len = vlen;
        if (check)
            *mismatch = memcmp(v, check, vlen) != 0;
        rocksdb_pinnableslice_destroy(ps);
    }
    return 0;
}

static int rdb_scan(void *p, const uint8_t *key, size_t key_len, size_t n, bench_scan_result *out,
                    char *err) {
    rdb *d = p;
    rocksdb_iterator_t *it = rocksdb_create_iterator(d->db, d->ropts);
    out->rows = out->bytes = 0;
    for (rocksdb_iter_seek(it, (const char *)key, key_len); out->rows < n && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t kl = 0, vl = 0;
        (void)rocksdb_iter_key(it, &kl);
        (void)rocksdb_iter_value(it, &vl);
        out->rows++;
        out->bytes += kl + vl;
    }
    char *rerr = NULL;
    rocksdb_iter_get_error(it, &rerr);
    rocksdb_iter_destroy(it);
    return rerr ? rdb_fail(rerr, "scan", err) : 0;
}

const bench_engine bench_engine_rocksdb = {
    .name = "rocksdb",
    .open = rdb_open,
    .put = rdb_put,
    .get = rdb_get,
    .scan = rdb_scan,
    .close = rdb_close,
};
