/* bench.h — the engine adapter interface of storage-bench: every engine (Strata, LevelDB,
 * RocksDB) is driven through the same five calls, so the workloads in storage_bench.c are
 * written once and run identically on each.
 *
 * Threads. After open, put/get/scan are called concurrently from several threads; close is called
 * once when they have all returned. Adapters return 0 on success and -1 on failure with a
 * sentence in err (BENCH_ERR_MAX bytes, NUL-terminated). */
#ifndef STRATA_BENCH_H
#define STRATA_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_ERR_MAX 256
#define BENCH_KEY_BYTES 16
#define BENCH_SCAN_ROWS_MAX 1000 /* longest seek+scan any workload asks for */

/* Engine settings shared by all adapters; each maps them onto its own options. */
typedef struct bench_engine_cfg {
    size_t cache_bytes;     /* block cache (LRU) */
    size_t memtable_bytes;  /* one memtable / write buffer */
    size_t block_bytes;     /* target data block size; 0 = the engine's default */
    int bloom_bits_per_key; /* 10 */
    bool sync;              /* writes durable before they return (fsync/fdatasync) */
} bench_engine_cfg;

/* One key/value to write. */
typedef struct bench_kv {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
} bench_kv;

/* What a scan saw, so the reads cannot be optimised away and MB/s can be computed. */
typedef struct bench_scan_result {
    size_t rows;
    size_t bytes; /* key + value bytes of the rows read */
} bench_scan_result;

typedef struct bench_engine {
    const char *name;
    /* Opens (creating when absent) the store in dir. */
    int (*open)(const char *dir, const bench_engine_cfg *cfg, void **db, char *err);
    /* Writes n key/values as one batch (atomic where the engine offers it; Strata: n row
     * mutations in one sto_write call). Durable on return when cfg->sync was set. */
    int (*put)(void *db, const bench_kv *kvs, size_t n, char *err);
    /* Point read. *found tells whether the key exists; on a hit, *value_len receives the value's
     * length and, when check is not NULL, the value is compared with check (value_len bytes):
     * *mismatch is set when it differs. */
    int (*get)(void *db, const uint8_t *key, size_t key_len, bool *found, size_t *value_len,
               const uint8_t *check, bool *mismatch, char *err);
    /* Seeks to the first key >= key and reads up to n rows (keys and values). */
    int (*scan)(void *db, const uint8_t *key, size_t key_len, size_t n, bench_scan_result *out,
                char *err);
    void (*close)(void *db);
} bench_engine;

/* The adapters; storage_bench.c lists those that were built (HAVE_STRATA, HAVE_LEVELDB,
 * HAVE_ROCKSDB). */
extern const bench_engine bench_engine_strata;
extern const bench_engine bench_engine_leveldb;
extern const bench_engine bench_engine_rocksdb;

#endif
