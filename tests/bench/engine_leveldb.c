/* engine_leveldb.c — the LevelDB adapter of storage-bench, through LevelDB's C API (leveldb/c.h).
 * Options: an LRU block cache of cfg->cache_bytes, LevelDB's builtin bloom filter with
 * cfg->bloom_bits_per_key, write_buffer_size = cfg->memtable_bytes, everything else LevelDB's
 * defaults (4 KiB blocks, snappy, 2 MiB files). Writes are sync=true when cfg->sync. */
#include <leveldb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct ldb {
    leveldb_t *db;
    leveldb_options_t *opts;
    leveldb_cache_t *cache;
    leveldb_filterpolicy_t *bloom;
    leveldb_writeoptions_t *wopts;
    leveldb_readoptions_t *ropts;
} ldb;

/* Copies LevelDB's malloc'ed error text into err and frees it. */
static int ldb_fail(char *lerr, const char *what, char *err) {
    snprintf(err, BENCH_ERR_MAX, "leveldb %s: %s", what, lerr ? lerr : "failed");
    leveldb_free(lerr);
    return -1;
}

static void ldb_close(void *p) {
    ldb *d = p;
    if (d->db)
        leveldb_close(d->db);
    if (d->ropts)
        leveldb_readoptions_destroy(d->ropts);
    if (d->wopts)
        leveldb_writeoptions_destroy(d->wopts);
    if (d->opts)
        leveldb_options_destroy(d->opts);
    if (d->bloom)
        leveldb_filterpolicy_destroy(d->bloom);
    if (d->cache)
        leveldb_cache_destroy(d->cache);
    free(d);
}

static int ldb_open(const char *dir, const bench_engine_cfg *cfg, void **out, char *err) {
    ldb *d = calloc(1, sizeof(*d));
    if (!d)
        return snprintf(err, BENCH_ERR_MAX, "leveldb open: out of memory"), -1;
    d->opts = leveldb_options_create();
    d->cache = leveldb_cache_create_lru(cfg->cache_bytes);
    d->bloom = leveldb_filterpolicy_create_bloom(cfg->bloom_bits_per_key);
    leveldb_options_set_create_if_missing(d->opts, 1);
    leveldb_options_set_cache(d->opts, d->cache);
    leveldb_options_set_filter_policy(d->opts, d->bloom);
    leveldb_options_set_write_buffer_size(d->opts, cfg->memtable_bytes);
    if (cfg->block_bytes)
        leveldb_options_set_block_size(d->opts, cfg->block_bytes);
    d->wopts = leveldb_writeoptions_create();
    leveldb_writeoptions_set_sync(d->wopts, cfg->sync);
    d->ropts = leveldb_readoptions_create();
    char *lerr = NULL;
    d->db = leveldb_open(d->opts, dir, &lerr);
    if (lerr) {
        ldb_close(d);
        return ldb_fail(lerr, "open", err);
    }
    *out = d;
    return 0;
}

static int ldb_put(void *p, const bench_kv *kvs, size_t n, char *err) {
    ldb *d = p;
    char *lerr = NULL;
    if (n == 1) {
        leveldb_put(d->db, d->wopts, (const char *)kvs[0].key, kvs[0].key_len,
                    (const char *)kvs[0].value, kvs[0].value_len, &lerr);
    } else {
        leveldb_writebatch_t *b = leveldb_writebatch_create();
        for (size_t i = 0; i < n; i++)
            leveldb_writebatch_put(b, (const char *)kvs[i].key, kvs[i].key_len,
                                   (const char *)kvs[i].value, kvs[i].value_len);
        leveldb_write(d->db, d->wopts, b, &lerr);
        leveldb_writebatch_destroy(b);
    }
    return lerr ? ldb_fail(lerr, "write", err) : 0;
}

static int ldb_get(void *p, const uint8_t *key, size_t key_len, bool *found, size_t *value_len,
                   const uint8_t *check, bool *mismatch, char *err) {
    ldb *d = p;
    char *lerr = NULL;
    size_t vlen = 0;
    char *v = leveldb_get(d->db, d->ropts, (const char *)key, key_len, &vlen, &lerr);
    if (lerr)
        return ldb_fail(lerr, "get", err);
    *found = v != NULL;
    *value_len = vlen;
    if (v && check)
        *mismatch = memcmp(v, check, vlen) != 0;
    leveldb_free(v);
    return 0;
}

static int ldb_scan(void *p, const uint8_t *key, size_t key_len, size_t n, bench_scan_result *out,
                    char *err) {
    ldb *d = p;
    leveldb_iterator_t *it = leveldb_create_iterator(d->db, d->ropts);
    out->rows = out->bytes = 0;
    for (leveldb_iter_seek(it, (const char *)key, key_len); out->rows < n && leveldb_iter_valid(it);
         leveldb_iter_next(it)) {
        size_t kl = 0, vl = 0;
        (void)leveldb_iter_key(it, &kl);
        (void)leveldb_iter_value(it, &vl);
        out->rows++;
        out->bytes += kl + vl;
    }
    char *lerr = NULL;
    leveldb_iter_get_error(it, &lerr);
    leveldb_iter_destroy(it);
    return lerr ? ldb_fail(lerr, "scan", err) : 0;
}

const bench_engine bench_engine_leveldb = {
    .name = "leveldb",
    .open = ldb_open,
    .put = ldb_put,
    .get = ldb_get,
    .scan = ldb_scan,
    .close = ldb_close,
};
