/* ops/bench.h — `strata bench`: a load generator for any Bigtable v2 endpoint (a Strata router,
 * a single strata-node, the official emulator), and the pieces it is made of, exposed so unit
 * tests can check them: a latency histogram, key distributions (YCSB's zipfian), a minimal
 * protobuf wire reader that verifies ReadRows / MutateRows responses, and /proc process stats.
 * docs/strata-bench.md describes the tool; this header is private to ops/. */
#ifndef STRATA_OPS_BENCH_H
#define STRATA_OPS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "strata/base.h"

/* ---- latency histogram (log-linear, HdrHistogram-like) ----
 * Values below 2^OPS_HIST_SUB_BITS are exact; above, each power of two is split into
 * 2^(OPS_HIST_SUB_BITS-1) equal buckets, so a reported percentile is within 1/64 (1.6%) of the
 * true value. Fixed size, no allocation: a run keeps one per worker and one per interval. */
#define OPS_HIST_SUB_BITS 7
#define OPS_HIST_HALF (1u << (OPS_HIST_SUB_BITS - 1))
#define OPS_HIST_BUCKETS ((64u - OPS_HIST_SUB_BITS) * OPS_HIST_HALF + 2u * OPS_HIST_HALF)

typedef struct ops_hist {
    uint64_t counts[OPS_HIST_BUCKETS];
    uint64_t total;
    uint64_t min, max; /* exact; min is UINT64_MAX while empty */
    double sum;        /* for the mean */
} ops_hist;

void ops_hist_init(ops_hist *h);
void ops_hist_record(ops_hist *h, uint64_t v);
void ops_hist_merge(ops_hist *dst, const ops_hist *src);
/* The value at percentile pct (0 < pct <= 100): the highest value equivalent to the bucket that
 * holds the ceil(pct% * total)-th smallest value, clamped to [min, max]. 0 when empty. */
uint64_t ops_hist_percentile(const ops_hist *h, double pct);
double ops_hist_mean(const ops_hist *h);
/* Bucket mapping, exposed for tests: index of v, and the [low, high] values of a bucket. */
uint32_t ops_hist_bucket(uint64_t v);
void ops_hist_bucket_range(uint32_t b, uint64_t *low, uint64_t *high);

/* ---- key distributions ----
 * YCSB's ZipfianGenerator (Gray et al., "Quickly generating billion-record synthetic databases"):
 * item i (0-based rank) is drawn with probability proportional to 1/(i+1)^theta. */
#define OPS_ZIPF_THETA 0.99
/* YCSB's ScrambledZipfianGenerator draws from a zipfian over this many items (with its zeta
 * precomputed) and hashes the rank into the key space, so the hot keys are spread over the
 * table instead of bunched at its start, whatever the key count. */
#define OPS_ZIPF_SCRAMBLED_ITEMS 10000000000ull
#define OPS_ZIPF_SCRAMBLED_ZETAN 26.46902820178302

typedef struct ops_zipf {
    uint64_t items;
    double theta, alpha, zetan, eta, zeta2;
} ops_zipf;

/* zeta(n, theta) = sum_{i=1..n} 1/i^theta: O(n), used once per generator. */
double ops_zeta(uint64_t n, double theta);
/* items > 0, 0 < theta < 1. zetan <= 0: computed with ops_zeta. */
void ops_zipf_init(ops_zipf *z, uint64_t items, double theta, double zetan);
/* A rank in [0, items) from a uniform u in [0, 1). */
uint64_t ops_zipf_next(const ops_zipf *z, double u);
/* YCSB's fnvhash64 (FNV-1 over the 8 little-endian bytes, made non-negative). */
uint64_t ops_fnv64(uint64_t v);

typedef enum ops_dist {
    OPS_DIST_UNIFORM = 0,
    OPS_DIST_ZIPFIAN,    /* scrambled zipfian, as YCSB's workloads use */
    OPS_DIST_SEQUENTIAL, /* 0, 1, 2... wrapping: the hotspot anti-pattern for writes */
} ops_dist;

typedef struct ops_keygen {
    ops_dist dist;
    uint64_t n;    /* keys are drawn from [0, n) */
    uint64_t next; /* sequential: next index */
    ops_zipf zipf;
} ops_keygen;

void ops_keygen_init(ops_keygen *g, ops_dist dist, uint64_t n);
uint64_t ops_keygen_next(ops_keygen *g, st_rng *rng);
/* Uniform double in [0, 1) with 53 random bits. */
double ops_rng_double(st_rng *rng);

/* ---- keys and values ----
 * Row keys are "user" + 12 decimal digits, so byte order is index order and a 100-row range is
 * [key(i), key(i+100)). */
#define OPS_KEY_BYTES 16
#define OPS_KEY_INDEX_MAX 999999999999ull
size_t ops_key_format(char out[OPS_KEY_BYTES + 1], uint64_t index);

/* ---- response verification (a minimal protobuf wire reader, no allocation) ---- */
typedef struct ops_pb_field {
    uint32_t num;
    uint32_t wire; /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t v;    /* varint / fixed value */
    st_slice s;    /* length-delimited bytes */
} ops_pb_field;
/* 1 = a field was read, 0 = end of input, -1 = malformed (groups, truncation, bad varint). */
int ops_pb_next(const uint8_t **p, const uint8_t *end, ops_pb_field *f);

/* What a ReadRows call must return: `rows` consecutive rows key(first)..key(first+rows-1), each
 * with at least one cell, every cell's value exactly value_bytes long. The checker follows the
 * CellChunk state machine (rows split over chunks and messages, cells split over chunks,
 * reset_row), so it accepts every legal chunking of the same rows. */
#define OPS_CHECK_MSG_MAX 160
typedef struct ops_rowcheck {
    uint64_t first, rows, value_bytes;
    uint64_t rows_done;  /* committed rows */
    uint64_t bytes_done; /* key + value bytes of committed rows */
    bool in_row, in_cell;
    char row_key[OPS_KEY_BYTES + 1]; /* key of the row being assembled ("" = other length) */
    size_t row_key_len;
    uint64_t row_cells, row_bytes, cell_len;
    bool failed;
    char msg[OPS_CHECK_MSG_MAX]; /* why it failed */
} ops_rowcheck;

void ops_rowcheck_begin(ops_rowcheck *c, uint64_t first, uint64_t rows, uint64_t value_bytes);
/* Feeds one ReadRowsResponse message; false once the response is found wrong (c->msg says
 * why; later calls keep returning false). */
bool ops_rowcheck_feed(ops_rowcheck *c, st_slice msg);
/* At the end of the call: true if exactly the expected rows came back. */
bool ops_rowcheck_finish(ops_rowcheck *c);

/* MutateRows: every entry index in [0, entries) must come back exactly once with status OK. */
#define OPS_BULK_ROWS_MAX 1000
typedef struct ops_bulkcheck {
    uint32_t entries, seen_count;
    uint8_t seen[OPS_BULK_ROWS_MAX / 8 + 1];
    st_code first_error; /* first failed entry's code (ST_OK if none) */
    bool malformed;
    char msg[OPS_CHECK_MSG_MAX];
} ops_bulkcheck;

void ops_bulkcheck_begin(ops_bulkcheck *c, uint32_t entries);
bool ops_bulkcheck_feed(ops_bulkcheck *c, st_slice msg);
bool ops_bulkcheck_finish(ops_bulkcheck *c);

/* ---- process stats (Linux /proc; best effort) ---- */
typedef struct ops_proc_stat {
    double cpu_s;         /* utime + stime */
    uint64_t rss_peak_kb; /* VmHWM */
    uint64_t rss_kb;      /* VmRSS */
} ops_proc_stat;

/* false if the process is gone or /proc is unreadable. */
bool ops_proc_stat_read(pid_t pid, ops_proc_stat *out);

/* ---- child servers (the emulator, a local strata-node) ---- */
#define OPS_ADDR_MAX 280
typedef struct ops_child {
    pid_t pid; /* 0 = not running */
    char addr[OPS_ADDR_MAX];
    char log_path[4096];
} ops_child;

/* Starts argv[0] with stdout and stderr going to log_path, then waits (up to timeout_ms) for a
 * log line containing `marker` followed by HOST:PORT, which it copies into child->addr.
 * UNAVAILABLE (with the log's tail in err) if the process exits or the line never comes. */
st_code ops_child_start(ops_child *child, char *const argv[], const char *log_path,
                        const char *marker, int timeout_ms, st_err *err);
/* SIGTERM, then SIGKILL after a grace period; reaps it. No-op when not running. */
void ops_child_stop(ops_child *child);
/* rm -rf, for the bench's own temporary directories only. */
void ops_remove_tree(const char *path);

/* ---- the subcommand ---- */
int ops_bench_main(int argc, char **argv);

#endif
