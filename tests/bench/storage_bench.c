/* storage_bench.c — storage-bench: the same workloads on Strata's engine and, when they were
 * built, on LevelDB and RocksDB, with each figure set beside the others as a Strata/peer ratio.
 * docs/bench.md describes the workloads, the parameters and how to read the output.
 *
 * Shape. The parent parses flags, makes a scratch directory and forks one child per engine, one
 * after the other, so each engine has its own allocator and its own peak RSS. A child runs the
 * selected workloads in order on its engine (bench.h adapters) and sends one fixed-size
 * bench_result per workload up a pipe; the parent prints the table, the goals and the
 * machine-readable `bench ...` lines. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "strata/base.h"

/* ---- engines and workloads ---- */

static const bench_engine *const engines_built[] = {
#ifdef HAVE_STRATA
    &bench_engine_strata,
#endif
#ifdef HAVE_LEVELDB
    &bench_engine_leveldb,
#endif
#ifdef HAVE_ROCKSDB
    &bench_engine_rocksdb,
#endif
    NULL, /* keeps the array non-empty when nothing was built */
};
#define ENGINES_MAX 3
/* Names of every engine the bench knows, built or not, in table order. */
static const char *const engine_names[ENGINES_MAX] = {"strata", "leveldb", "rocksdb"};

typedef enum workload {
    W_FILLSEQ = 0,
    W_FILLRANDOM,
    W_READRANDOM,
    W_READMISSING,
    W_SEEKSCAN,
    W_COUNT
} workload;
static const char *const workload_names[W_COUNT] = {"fillseq", "fillrandom", "readrandom",
                                                    "readmissing", "seekscan"};

#define VALUE_BYTES 1000
#define VALUE_POOL_BYTES (1u << 20) /* values are windows of one compressible pool */
#define BATCH_MAX 1000
#define THREADS_MAX 64
#define PROGRESS_EVERY_S 2
#define SAMPLE_EVERY_MS 50 /* anonymous-RSS sampling period */
#define MIB (1024.0 * 1024.0)
#define ROUNDS_MAX 9

typedef struct bench_cfg {
    uint64_t num;         /* keys in the filled db (fillseq) and key space of every workload */
    uint64_t durable_ops; /* fillrandom writes */
    uint64_t reads;       /* readrandom and readmissing lookups */
    uint64_t scans;       /* seekscan seeks */
    size_t scan_rows;     /* rows read after each seek */
    int threads;          /* read threads */
    int durable_threads;  /* fillrandom writer threads */
    int batch;            /* keys per fillseq write */
    size_t cache_mb, memtable_mb;
    size_t block_kb; /* data block size of every engine; 0 = each engine's own default */
    uint64_t seed;
    int rounds;           /* runs of every engine, alternating; the median round is reported */
    bool strict;          /* exit 2 when a goal is missed */
    const char *dir_base; /* where the scratch directory goes */
    bool engine_on[ENGINES_MAX];
    bool workload_on[W_COUNT];
    uint8_t *value_pool; /* VALUE_POOL_BYTES + VALUE_BYTES, shared read-only */
} bench_cfg;

/* What one engine measured on one workload; sent child -> parent as raw bytes over a pipe (a
 * single write below PIPE_BUF, so it arrives whole). */
typedef struct bench_result {
    int engine, workload;
    int ok;
    uint64_t ops, found, mismatches;
    double seconds, ops_s, mb_s, p50_us, p99_us;
    long peak_rss_kib;
    long peak_anon_kib; /* sampled, see rss_anon_kib */
    char err[BENCH_ERR_MAX];
} bench_result;
_Static_assert(sizeof(bench_result) < 4096, "bench_result must fit one atomic pipe write");

/* ---- keys and values ----
 * key(i) is the 16-digit decimal of 2i: sorted like i, and odd numbers are free for missing keys
 * that differ from a present key only in their last byte. */

static void key_present(uint64_t i, uint8_t out[BENCH_KEY_BYTES]) {
    char tmp[BENCH_KEY_BYTES + 1];
    snprintf(tmp, sizeof(tmp), "%016" PRIu64, 2 * i);
    memcpy(out, tmp, BENCH_KEY_BYTES);
}

/* key(i) with the last byte changed: 2i+1. */
static void key_missing_last_byte(uint64_t i, uint8_t out[BENCH_KEY_BYTES]) {
    char tmp[BENCH_KEY_BYTES + 1];
    snprintf(tmp, sizeof(tmp), "%016" PRIu64, 2 * i + 1);
    memcpy(out, tmp, BENCH_KEY_BYTES);
}

/* The first 12 bytes of key(i), then 4 random lower-case letters: absent, yet inside the key
 * range of the data (letters sort after digits), so range checks alone cannot reject it. */
static void key_missing_random(uint64_t i, st_rng *rng, uint8_t out[BENCH_KEY_BYTES]) {
    key_present(i, out);
    for (int b = 12; b < BENCH_KEY_BYTES; b++)
        out[b] = (uint8_t)('a' + st_rng_below(rng, 26));
}

static const uint8_t *value_for(const bench_cfg *cfg, uint64_t i) {
    return cfg->value_pool + (i * 7919u) % VALUE_POOL_BYTES;
}

/* Each 100-byte piece is 50 random bytes followed by the same 50 bytes again, so any window of
 * 1000 bytes compresses about 2:1 (db_bench's compressible values work the same way). */
static uint8_t *value_pool_new(uint64_t seed) {
    size_t n = VALUE_POOL_BYTES + VALUE_BYTES + 100;
    uint8_t *p = malloc(n);
    if (!p)
        return NULL;
    st_rng rng;
    st_rng_seed(&rng, seed);
    for (size_t off = 0; off + 100 <= n; off += 100) {
        for (size_t b = 0; b < 50; b++)
            p[off + b] = (uint8_t)st_rng_next(&rng);
        memcpy(p + off + 50, p + off, 50);
    }
    return p;
}

/* ---- latency histogram: log buckets with 32 linear sub-buckets each (~3% resolution) ---- */

#define HIST_SUB_BITS 5
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_BUCKETS ((64 - HIST_SUB_BITS + 1) * HIST_SUB)

typedef struct hist {
    uint64_t count[HIST_BUCKETS];
    uint64_t total;
} hist;

static unsigned hist_index(uint64_t ns) {
    if (ns < HIST_SUB)
        return (unsigned)ns;
    unsigned e = 63u - (unsigned)__builtin_clzll(ns); /* >= HIST_SUB_BITS */
    unsigned sub = (unsigned)(ns >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1);
    return (e - HIST_SUB_BITS + 1) * HIST_SUB + sub;
}

/* The middle of bucket idx, in nanoseconds. */
static double hist_value(unsigned idx) {
    if (idx < HIST_SUB)
        return idx;
    unsigned e = idx / HIST_SUB + HIST_SUB_BITS - 1, sub = idx % HIST_SUB;
    double lo = (double)((uint64_t)(HIST_SUB + sub) << (e - HIST_SUB_BITS));
    return lo + (double)(1ull << (e - HIST_SUB_BITS)) / 2;
}

static void hist_add(hist *h, uint64_t ns) {
    h->count[hist_index(ns)]++;
    h->total++;
}

static void hist_merge(hist *into, const hist *from) {
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        into->count[i] += from->count[i];
    into->total += from->total;
}

static double hist_percentile_us(const hist *h, double pct) {
    if (h->total == 0)
        return 0;
    uint64_t want = (uint64_t)(pct / 100.0 * (double)h->total), seen = 0;
    if (want == 0)
        want = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->count[i];
        if (seen >= want)
            return hist_value(i) / 1000.0;
    }
    return hist_value(HIST_BUCKETS - 1) / 1000.0;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- peak memory ---- */

/* Resets the kernel's peak-RSS mark of this process (Linux clear_refs 5), so the peak read at the
 * end of a workload belongs to that workload. Returns false where unsupported. */
static bool rss_peak_reset(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

/* VmHWM from /proc/self/status, else getrusage's ru_maxrss (peak since the child started). */
static long rss_peak_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    if (kib >= 0)
        return kib;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* RssAnon from /proc/self/status: heap and stacks without file-backed pages (LevelDB maps its
 * table files, which RSS counts); -1 where unavailable. */
static long rss_anon_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* ---- one workload on one open db ---- */

typedef struct run {
    const bench_cfg *cfg;
    const bench_engine *eng;
    void *db;
    workload w;
    uint64_t ops;
    int threads;
    _Atomic uint64_t done; /* ops finished, for the progress line */
    _Atomic bool failed;   /* first error stops every worker */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool finished;      /* guarded by mu: tells the progress thread to stop */
    long peak_anon_kib; /* guarded by mu: largest RssAnon sampled */
} run;

typedef struct worker {
    run *r;
    int id;
    uint64_t lo, hi; /* this worker's share of op numbers [lo, hi) */
    st_rng rng;
    hist h;
    uint64_t bytes, found, mismatches;
    char err[BENCH_ERR_MAX];
    pthread_t th;
} worker;

/* One write of up to batch keys starting at op number op (fillseq) or of one random key
 * (fillrandom). */
static int op_fill(worker *wk, uint64_t op, uint64_t n) {
    const bench_cfg *cfg = wk->r->cfg;
    uint8_t keys[BATCH_MAX][BENCH_KEY_BYTES];
    bench_kv kvs[BATCH_MAX];
    for (uint64_t j = 0; j < n; j++) {
        uint64_t i = wk->r->w == W_FILLSEQ ? op + j : st_rng_below(&wk->rng, cfg->num);
        key_present(i, keys[j]);
        kvs[j] = (bench_kv){keys[j], BENCH_KEY_BYTES, value_for(cfg, i), VALUE_BYTES};
    }
    wk->bytes += n * (BENCH_KEY_BYTES + VALUE_BYTES);
    return wk->r->eng->put(wk->r->db, kvs, n, wk->err);
}

static int op_read(worker *wk, uint64_t op) {
    const bench_cfg *cfg = wk->r->cfg;
    uint8_t key[BENCH_KEY_BYTES];
    uint64_t i = st_rng_below(&wk->rng, cfg->num);
    const uint8_t *check = NULL;
    if (wk->r->w == W_READRANDOM) {
        key_present(i, key);
        check = value_for(cfg, i);
    } else if (op % 2 == 0) {
        key_missing_last_byte(i, key);
    } else {
        key_missing_random(i, &wk->rng, key);
    }
    bool found = false, mismatch = false;
    size_t vlen = 0;
    if (wk->r->eng->get(wk->r->db, key, sizeof(key), &found, &vlen, check, &mismatch, wk->err))
        return -1;
    wk->bytes += BENCH_KEY_BYTES + (found ? vlen : 0);
    wk->found += found;
    wk->mismatches += mismatch || (found && check && vlen != VALUE_BYTES);
    return 0;
}

static int op_scan(worker *wk) {
    const bench_cfg *cfg = wk->r->cfg;
    uint8_t key[BENCH_KEY_BYTES];
    key_present(st_rng_below(&wk->rng, cfg->num), key);
    bench_scan_result sr = {0};
    if (wk->r->eng->scan(wk->r->db, key, sizeof(key), cfg->scan_rows, &sr, wk->err))
        return -1;
    wk->bytes += sr.bytes;
    wk->found += sr.rows;
    return 0;
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    run *r = wk->r;
    uint64_t step = r->w == W_FILLSEQ ? (uint64_t)r->cfg->batch : 1, pending = 0;
    for (uint64_t op = wk->lo; op < wk->hi && !atomic_load(&r->failed); op += step) {
        uint64_t n = wk->hi - op < step ? wk->hi - op : step;
        uint64_t t0 = now_ns();
        int rc = r->w <= W_FILLRANDOM ? op_fill(wk, op, n)
                 : r->w == W_SEEKSCAN ? op_scan(wk)
                                      : op_read(wk, op);
        hist_add(&wk->h, now_ns() - t0);
        if (rc) {
            atomic_store(&r->failed, true);
            break;
        }
        /* Publish progress in steps so the shared counter is not a hot spot. */
        if ((pending += n) >= 64) {
            atomic_fetch_add_explicit(&r->done, pending, memory_order_relaxed);
            pending = 0;
        }
    }
    atomic_fetch_add_explicit(&r->done, pending, memory_order_relaxed);
    return NULL;
}

/* Samples the anonymous RSS every SAMPLE_EVERY_MS and prints a progress line on stderr every
 * PROGRESS_EVERY_S seconds until the run finishes. */
static void *progress_main(void *arg) {
    run *r = arg;
    uint64_t start = now_ns(), next_print = start + PROGRESS_EVERY_S * 1000000000ull;
    pthread_mutex_lock(&r->mu);
    while (!r->finished) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += SAMPLE_EVERY_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L)
            dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != ETIMEDOUT || r->finished)
            continue;
        long anon = rss_anon_kib();
        if (anon > r->peak_anon_kib)
            r->peak_anon_kib = anon;
        uint64_t now = now_ns();
        if (now >= next_print) {
            uint64_t done = atomic_load(&r->done);
            double s = (double)(now - start) / 1e9;
            fprintf(stderr, "storage-bench: %s %s %" PRIu64 "/%" PRIu64 " ops, %.0f ops/s\n",
                    r->eng->name, workload_names[r->w], done, r->ops, (double)done / s);
            next_print = now + PROGRESS_EVERY_S * 1000000000ull;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void run_init(run *r, const bench_cfg *cfg, const bench_engine *eng, void *db, workload w) {
    memset(r, 0, sizeof(*r));
    r->cfg = cfg;
    r->eng = eng;
    r->db = db;
    r->w = w;
    const uint64_t ops[W_COUNT] = {cfg->num, cfg->durable_ops, cfg->reads, cfg->reads, cfg->scans};
    r->ops = ops[w];
    r->threads = w == W_FILLSEQ ? 1 : w == W_FILLRANDOM ? cfg->durable_threads : cfg->threads;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* Turns the workers' counts into res (everything but the peak RSS). */
static void run_summarize(const run *r, worker *wk, double seconds, bench_result *res) {
    hist *all = calloc(1, sizeof(*all));
    uint64_t bytes = 0;
    res->ok = !atomic_load(&r->failed);
    for (int t = 0; t < r->threads; t++) {
        if (all)
            hist_merge(all, &wk[t].h);
        bytes += wk[t].bytes;
        res->found += wk[t].found;
        res->mismatches += wk[t].mismatches;
        if (wk[t].err[0] && !res->err[0])
            memcpy(res->err, wk[t].err, sizeof(res->err));
    }
    res->ops = r->ops;
    res->seconds = seconds;
    res->ops_s = seconds > 0 ? (double)r->ops / seconds : 0;
    res->mb_s = seconds > 0 ? (double)bytes / MIB / seconds : 0;
    res->p50_us = all ? hist_percentile_us(all, 50) : 0;
    res->p99_us = all ? hist_percentile_us(all, 99) : 0;
    free(all);
}

/* Runs workload w on db with its threads and fills res. */
static void run_workload(const bench_cfg *cfg, const bench_engine *eng, void *db, workload w,
                         bench_result *res) {
    run r;
    run_init(&r, cfg, eng, db, w);
    worker *wk = calloc((size_t)r.threads, sizeof(*wk));
    if (!wk) {
        snprintf(res->err, sizeof(res->err), "out of memory for %d workers", r.threads);
        return;
    }
    pthread_t prog;
    bool prog_on = pthread_create(&prog, NULL, progress_main, &r) == 0;
    uint64_t t0 = now_ns();
    for (int t = 0; t < r.threads; t++) {
        wk[t].r = &r;
        wk[t].id = t;
        wk[t].lo = r.ops * (uint64_t)t / (uint64_t)r.threads;
        wk[t].hi = r.ops * (uint64_t)(t + 1) / (uint64_t)r.threads;
        st_rng_seed(&wk[t].rng, cfg->seed ^ ((uint64_t)w << 32) ^ (uint64_t)(t + 1));
        ST_ASSERT(pthread_create(&wk[t].th, NULL, worker_main, &wk[t]) == 0);
    }
    for (int t = 0; t < r.threads; t++)
        pthread_join(wk[t].th, NULL);
    double seconds = (double)(now_ns() - t0) / 1e9;
    pthread_mutex_lock(&r.mu);
    r.finished = true;
    pthread_cond_signal(&r.cv);
    pthread_mutex_unlock(&r.mu);
    if (prog_on)
        pthread_join(prog, NULL);
    run_summarize(&r, wk, seconds, res);
    long anon = rss_anon_kib();
    res->peak_anon_kib = anon > r.peak_anon_kib ? anon : r.peak_anon_kib;
    free(wk);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
}

/* ---- the child: every selected workload on one engine ---- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static int remove_tree(const char *path) {
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT ? 0 : -1;
}

typedef struct child {
    const bench_cfg *cfg;
    const bench_engine *eng;
    int engine_ix;
    const char *scratch;
    int out_fd;
    int failures;
} child;

static void child_send(child *c, bench_result *res) {
    if (!res->ok)
        c->failures++;
    if (write(c->out_fd, res, sizeof(*res)) != (ssize_t)sizeof(*res))
        c->failures++;
}

/* Opens db `name` under the scratch dir, runs the workloads [first, last] that are selected,
 * closes. Removes the db afterwards when drop is set. */
static void child_phase(child *c, const char *name, bool sync, workload first, workload last,
                        bool drop) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/%s-%s", c->scratch, c->eng->name, name);
    bench_engine_cfg ec = {.cache_bytes = c->cfg->cache_mb << 20,
                           .memtable_bytes = c->cfg->memtable_mb << 20,
                           .block_bytes = c->cfg->block_kb << 10,
                           .bloom_bits_per_key = 10,
                           .sync = sync};
    void *db = NULL;
    char err[BENCH_ERR_MAX] = "";
    int open_rc = c->eng->open(dir, &ec, &db, err);
    for (workload w = first; w <= last; w++) {
        if (!c->cfg->workload_on[w])
            continue;
        bench_result res = {.engine = c->engine_ix, .workload = (int)w};
        if (open_rc != 0) {
            memcpy(res.err, err, sizeof(res.err));
        } else {
            rss_peak_reset();
            run_workload(c->cfg, c->eng, db, w, &res);
            res.peak_rss_kib = rss_peak_kib();
        }
        child_send(c, &res);
    }
    if (open_rc == 0)
        c->eng->close(db);
    /* Hand freed heap back to the kernel so the next phase's peak starts from what is live. */
    malloc_trim(0);
    if (drop)
        remove_tree(dir);
}

/* Workload order: fillseq builds the db the reads use (kept), fillrandom writes a db of its own
 * (dropped), then the reads run on the reopened fillseq db. */
static int child_main(child *c) {
    const bool *on = c->cfg->workload_on;
    bool reads = on[W_READRANDOM] || on[W_READMISSING] || on[W_SEEKSCAN];
    if (on[W_FILLSEQ])
        child_phase(c, "seq", false, W_FILLSEQ, W_FILLSEQ, !reads);
    if (on[W_FILLRANDOM])
        child_phase(c, "durable", true, W_FILLRANDOM, W_FILLRANDOM, true);
    if (reads)
        child_phase(c, "seq", true, W_READRANDOM, W_SEEKSCAN, true);
    return c->failures ? 1 : 0;
}

/* ---- the parent ---- */

typedef struct results {
    bench_result r[ENGINES_MAX][W_COUNT];
    bool have[ENGINES_MAX][W_COUNT];
} results;

/* all->r[e][w] = the round with the median ops/s among the rounds that have it (a failed data
 * check in any round is kept: it must show); peak memory is the highest of the rounds. */
static void median_round(const results *per_round, int rounds, int e, int w, results *all) {
    const bench_result *have[ROUNDS_MAX];
    int n = 0;
    long peak = 0, anon = 0;
    for (int k = 0; k < rounds; k++) {
        if (!per_round[k].have[e][w])
            continue;
        const bench_result *r = &per_round[k].r[e][w];
        peak = r->peak_rss_kib > peak ? r->peak_rss_kib : peak;
        anon = r->peak_anon_kib > anon ? r->peak_anon_kib : anon;
        if (!r->ok || r->mismatches) { /* a wrong answer wins over any speed */
            all->r[e][w] = *r;
            all->have[e][w] = true;
            return;
        }
        int i = n++;
        while (i > 0 && have[i - 1]->ops_s > r->ops_s) { /* insertion sort by ops/s */
            have[i] = have[i - 1];
            i--;
        }
        have[i] = r;
    }
    if (n == 0)
        return;
    all->r[e][w] = *have[n / 2];
    all->r[e][w].peak_rss_kib = peak;
    all->r[e][w].peak_anon_kib = anon;
    all->have[e][w] = true;
}

/* Forks the child of engine e, collects its results into all; returns 0 when it succeeded. */
static int run_engine(const bench_cfg *cfg, const bench_engine *eng, int e, const char *scratch,
                      results *all) {
    int fds[2];
    if (pipe(fds) != 0)
        return perror("storage-bench: pipe"), -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return perror("storage-bench: fork"), -1;
    if (pid == 0) {
        close(fds[0]);
        child c = {.cfg = cfg, .eng = eng, .engine_ix = e, .scratch = scratch, .out_fd = fds[1]};
        _exit(child_main(&c));
    }
    close(fds[1]);
    bench_result res;
    while (read(fds[0], &res, sizeof(res)) == (ssize_t)sizeof(res)) {
        if (res.engine == e && res.workload >= 0 && res.workload < W_COUNT) {
            all->r[e][res.workload] = res;
            all->have[e][res.workload] = true;
        }
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "storage-bench: the %s child failed (status %d)\n", eng->name, status);
        return -1;
    }
    return 0;
}

static const bench_engine *engine_by_name(const char *name) {
    for (size_t i = 0; engines_built[i]; i++)
        if (strcmp(engines_built[i]->name, name) == 0)
            return engines_built[i];
    return NULL;
}

/* Runs every selected engine cfg->rounds times: round k starts at the k-th engine (rotating the
 * order, so no engine always follows another's background work), and the engines alternate, so
 * a noisy neighbour of a few seconds hits one round of each rather than all of one engine. Fills
 * all with each figure's median round (peak memory: the highest of any round). */
static int run_rounds(const bench_cfg *cfg, const char *scratch, results *per_round, results *all) {
    int on[ENGINES_MAX], n_on = 0, failed = 0;
    for (int e = 0; e < ENGINES_MAX; e++)
        if (cfg->engine_on[e])
            on[n_on++] = e;
    for (int k = 0; k < cfg->rounds; k++) {
        if (cfg->rounds > 1)
            fprintf(stderr, "storage-bench: round %d of %d\n", k + 1, cfg->rounds);
        for (int j = 0; j < n_on; j++) {
            int e = on[(j + k) % n_on];
            failed |=
                run_engine(cfg, engine_by_name(engine_names[e]), e, scratch, &per_round[k]) != 0;
        }
    }
    for (int e = 0; e < ENGINES_MAX; e++)
        for (int w = 0; w < W_COUNT; w++)
            median_round(per_round, cfg->rounds, e, w, all);
    return failed;
}

/* ---- reporting ---- */

/* The data check of one result: reads must find every present key with its value and no
 * missing key. */
static const char *result_check(const bench_result *r, char *buf, size_t cap) {
    if (!r->ok)
        return "FAILED";
    if (r->mismatches)
        return snprintf(buf, cap, "%" PRIu64 " wrong", r->mismatches), buf;
    if (r->workload == W_READRANDOM && r->found != r->ops)
        return snprintf(buf, cap, "%" PRIu64 " not found", r->ops - r->found), buf;
    if (r->workload == W_READMISSING && r->found != 0)
        return snprintf(buf, cap, "%" PRIu64 " found", r->found), buf;
    return "ok";
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : 0;
}

/* Prints one engine's row of a workload; returns 1 when its data check failed. */
static int print_row(const bench_cfg *cfg, const results *all, int e, workload w) {
    if (!all->have[e][w]) {
        if (!cfg->engine_on[e])
            return 0;
        printf("  %-16s no result: the engine's process failed (see stderr)\n", engine_names[e]);
        return 1;
    }
    const bench_result *r = &all->r[e][w];
    char buf[64];
    const char *check = result_check(r, buf, sizeof(buf));
    printf("  %-16s %11.0f %9.1f %9.1f %9.1f %9.1f %9.1f  %s\n", engine_names[e], r->ops_s, r->mb_s,
           r->p50_us, r->p99_us, (double)r->peak_rss_kib / 1024.0,
           (double)r->peak_anon_kib / 1024.0, check);
    if (!r->ok && r->err[0])
        printf("  %-16s %s\n", "", r->err);
    return strcmp(check, "ok") != 0;
}

/* Prints one workload's rows and ratios; returns how many results failed their data check. */
static int print_workload(const bench_cfg *cfg, const results *all, workload w) {
    const uint64_t ops[W_COUNT] = {cfg->num, cfg->durable_ops, cfg->reads, cfg->reads, cfg->scans};
    const int thr[W_COUNT] = {1, cfg->durable_threads, cfg->threads, cfg->threads, cfg->threads};
    printf("\n%s: %" PRIu64 " ops, %d thread%s\n", workload_names[w], ops[w], thr[w],
           thr[w] == 1 ? "" : "s");
    printf("  %-16s %11s %9s %9s %9s %9s %9s  %s\n", "engine", "ops/s", "MB/s", "p50 us", "p99 us",
           "peak MiB", "anon MiB", "check");
    int bad = 0;
    for (int e = 0; e < ENGINES_MAX; e++)
        bad += print_row(cfg, all, e, w);
    const bench_result *s = &all->r[0][w];
    for (int e = 1; e < ENGINES_MAX && all->have[0][w] && s->ok; e++) {
        const bench_result *p = &all->r[e][w];
        if (!all->have[e][w] || !p->ok)
            continue;
        char label[32];
        snprintf(label, sizeof(label), "strata/%s", engine_names[e]);
        printf("  %-16s %10.2fx %8.2fx %8.2fx %8.2fx %8.2fx %8.2fx\n", label,
               ratio(s->ops_s, p->ops_s), ratio(s->mb_s, p->mb_s), ratio(s->p50_us, p->p50_us),
               ratio(s->p99_us, p->p99_us), ratio((double)s->peak_rss_kib, (double)p->peak_rss_kib),
               ratio((double)s->peak_anon_kib, (double)p->peak_anon_kib));
    }
    return bad;
}

/* Prints the goals of the issue with PASS/MISS; returns how many were missed. */
static int print_goals(const bench_cfg *cfg, const results *all) {
    int missed = 0, shown = 0;
    printf("\ngoals (ops/s ratio strata/peer >= 1; peak RSS within budget):\n");
    for (workload w = 0; w < W_COUNT; w++) {
        for (int e = 1; e < ENGINES_MAX; e++) {
            if (e == 2 && w != W_FILLRANDOM && w != W_READRANDOM)
                continue;
            if (!cfg->engine_on[0] || !cfg->workload_on[w] || !all->have[e][w] || !all->r[e][w].ok)
                continue;
            bool s_ok = all->have[0][w] && all->r[0][w].ok;
            double q = s_ok ? ratio(all->r[0][w].ops_s, all->r[e][w].ops_s) : 0;
            printf("  %-4s %-12s strata >= %-8s %6.2fx\n", q >= 1 ? "PASS" : "MISS",
                   workload_names[w], engine_names[e], q);
            missed += q < 1, shown++;
        }
    }
    long peak = 0;
    for (workload w = 0; w < W_COUNT; w++)
        if (all->have[0][w] && all->r[0][w].peak_rss_kib > peak)
            peak = all->r[0][w].peak_rss_kib;
    if (peak > 0) {
        /* Budget: both memtables (active + flushing), the block cache, 64 MiB for the rest. */
        double budget = (double)(2 * cfg->memtable_mb + cfg->cache_mb + 64);
        double peak_mib = (double)peak / 1024.0;
        printf("  %-4s strata peak RSS %.1f MiB <= 2 x memtable %zu + cache %zu + 64 = %.0f MiB\n",
               peak_mib <= budget ? "PASS" : "MISS", peak_mib, cfg->memtable_mb, cfg->cache_mb,
               budget);
        missed += peak_mib > budget, shown++;
    }
    if (!shown)
        printf("  (need strata and at least one peer)\n");
    return missed;
}

static void print_lines(const results *all) {
    printf("\n");
    for (workload w = 0; w < W_COUNT; w++)
        for (int e = 0; e < ENGINES_MAX; e++) {
            if (!all->have[e][w] || !all->r[e][w].ok)
                continue;
            const bench_result *r = &all->r[e][w];
            printf(
                "bench engine=%s workload=%s ops_s=%.0f mb_s=%.1f p99_us=%.1f peak_rss_kib=%ld\n",
                engine_names[e], workload_names[w], r->ops_s, r->mb_s, r->p99_us, r->peak_rss_kib);
        }
}

/* ---- flags ---- */

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: storage-bench [options]\n"
        "  --num N           keys (default 1000000); other counts scale with it\n"
        "  --durable-ops N   fillrandom writes (default num/5)\n"
        "  --reads N         readrandom and readmissing lookups (default num)\n"
        "  --scans N         seekscan seeks (default num/20)\n"
        "  --scan-rows N     rows per seek (default 100)\n"
        "  --threads N       read threads (default 2)\n"
        "  --durable-threads N  fillrandom writer threads (default 8)\n"
        "  --batch N         keys per fillseq write (default 1, max %d)\n"
        "  --cache-mb N      block cache (default 64)\n"
        "  --memtable-mb N   memtable / write buffer (default 32)\n"
        "  --block-kb N      data block size, all engines (default 4; 0 = each engine's own)\n"
        "  --engines LIST    comma-separated, from strata,leveldb,rocksdb (default: all built)\n"
        "  --workloads LIST  from fillseq,fillrandom,readrandom,readmissing,seekscan (all);\n"
        "                    the reads imply fillseq, which builds the db they read\n"
        "  --dir DIR         scratch space parent (default /tmp); removed afterwards\n"
        "  --seed N          key and value RNG seed (default 1)\n"
        "  --rounds N        run every engine N times, alternating engines (the order rotates\n"
        "                    each round); report each figure's median round (default 1)\n"
        "  --strict          exit 2 when a goal is missed\n"
        "built engines:",
        BATCH_MAX);
    for (size_t i = 0; engines_built[i]; i++)
        fprintf(f, " %s", engines_built[i]->name);
    fprintf(f, "\n");
}

/* Sets on[i] for each comma-separated name of list found in names; false on an unknown name. */
static bool parse_list(const char *list, const char *const *names, int n, bool *on) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    memset(on, 0, (size_t)n * sizeof(*on));
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < n && strcmp(t, names[i]) != 0)
            i++;
        if (i == n)
            return fprintf(stderr, "storage-bench: unknown name '%s'\n", t), false;
        on[i] = true;
    }
    return true;
}

static bool parse_u64(const char *s, uint64_t min, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || *end || end == s || v < min)
        return fprintf(stderr, "storage-bench: bad number '%s'\n", s), false;
    *out = v;
    return true;
}

enum {
    O_NUM = 256,
    O_DOPS,
    O_READS,
    O_SCANS,
    O_ROWS,
    O_THR,
    O_DTHR,
    O_BATCH,
    O_CACHE,
    O_MEM,
    O_BLOCK,
    O_ENG,
    O_WL,
    O_DIR,
    O_SEED,
    O_ROUNDS,
    O_STRICT,
    O_HELP
};

static const struct option long_opts[] = {{"num", 1, 0, O_NUM},
                                          {"durable-ops", 1, 0, O_DOPS},
                                          {"reads", 1, 0, O_READS},
                                          {"scans", 1, 0, O_SCANS},
                                          {"scan-rows", 1, 0, O_ROWS},
                                          {"threads", 1, 0, O_THR},
                                          {"durable-threads", 1, 0, O_DTHR},
                                          {"batch", 1, 0, O_BATCH},
                                          {"cache-mb", 1, 0, O_CACHE},
                                          {"memtable-mb", 1, 0, O_MEM},
                                          {"block-kb", 1, 0, O_BLOCK},
                                          {"engines", 1, 0, O_ENG},
                                          {"workloads", 1, 0, O_WL},
                                          {"dir", 1, 0, O_DIR},
                                          {"seed", 1, 0, O_SEED},
                                          {"rounds", 1, 0, O_ROUNDS},
                                          {"strict", 0, 0, O_STRICT},
                                          {"help", 0, 0, O_HELP},
                                          {0, 0, 0, 0}};

/* Applies one flag; returns false on a bad value. The counts given are recorded in given[]. */
static bool parse_flag(bench_cfg *cfg, int opt, const char *arg, bool *given) {
    uint64_t v = 0;
    switch (opt) {
    case O_ENG:
        return parse_list(arg, engine_names, ENGINES_MAX, cfg->engine_on);
    case O_WL:
        return parse_list(arg, workload_names, W_COUNT, cfg->workload_on);
    case O_DIR:
        cfg->dir_base = arg;
        return true;
    case O_STRICT:
        cfg->strict = true;
        return true;
    default:
        break;
    }
    if (!parse_u64(arg, opt == O_SEED || opt == O_BLOCK ? 0 : 1, &v))
        return false;
    given[opt - O_NUM] = true;
    switch (opt) {
    case O_NUM:
        cfg->num = v;
        break;
    case O_DOPS:
        cfg->durable_ops = v;
        break;
    case O_READS:
        cfg->reads = v;
        break;
    case O_SCANS:
        cfg->scans = v;
        break;
    case O_ROWS:
        cfg->scan_rows = v > BENCH_SCAN_ROWS_MAX ? BENCH_SCAN_ROWS_MAX : v;
        break;
    case O_THR:
        cfg->threads = v > THREADS_MAX ? THREADS_MAX : (int)v;
        break;
    case O_DTHR:
        cfg->durable_threads = v > THREADS_MAX ? THREADS_MAX : (int)v;
        break;
    case O_BATCH:
        cfg->batch = v > BATCH_MAX ? BATCH_MAX : (int)v;
        break;
    case O_CACHE:
        cfg->cache_mb = v;
        break;
    case O_MEM:
        cfg->memtable_mb = v;
        break;
    case O_BLOCK:
        cfg->block_kb = v;
        break;
    case O_SEED:
        cfg->seed = v;
        break;
    case O_ROUNDS:
        cfg->rounds = v > ROUNDS_MAX ? ROUNDS_MAX : (int)v;
        break;
    default:
        return false;
    }
    return true;
}

/* Defaults, then flags; returns 0 to run, 1 for --help, -1 on bad flags. */
static int parse_args(int argc, char **argv, bench_cfg *cfg) {
    *cfg = (bench_cfg){.num = 1000000,
                       .scan_rows = 100,
                       .threads = 2,
                       .durable_threads = 8,
                       .batch = 1,
                       .cache_mb = 64,
                       .memtable_mb = 32,
                       .block_kb = 4,
                       .seed = 1,
                       .rounds = 1,
                       .dir_base = "/tmp"};
    for (size_t i = 0; engines_built[i]; i++)
        for (int e = 0; e < ENGINES_MAX; e++)
            cfg->engine_on[e] |= strcmp(engines_built[i]->name, engine_names[e]) == 0;
    for (int w = 0; w < W_COUNT; w++)
        cfg->workload_on[w] = true;
    bool given[O_HELP - O_NUM] = {false};
    int opt;
    while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        if (opt == O_HELP || opt == 'h')
            return usage(stdout), 1;
        if (opt == '?' || !parse_flag(cfg, opt, optarg, given))
            return usage(stderr), -1;
    }
    if (optind < argc)
        return usage(stderr), -1;
    /* The read workloads read the db that fillseq builds. */
    if (cfg->workload_on[W_READRANDOM] || cfg->workload_on[W_READMISSING] ||
        cfg->workload_on[W_SEEKSCAN])
        cfg->workload_on[W_FILLSEQ] = true;
    if (!given[O_DOPS - O_NUM])
        cfg->durable_ops = cfg->num / 5 ? cfg->num / 5 : 1;
    if (!given[O_READS - O_NUM])
        cfg->reads = cfg->num;
    if (!given[O_SCANS - O_NUM])
        cfg->scans = cfg->num / 20 ? cfg->num / 20 : 1;
    return 0;
}

/* True when at least one engine is selected and every engine asked for was built; says which
 * was not. */
static bool engines_available(const bench_cfg *cfg) {
    bool any = false;
    for (int e = 0; e < ENGINES_MAX; e++)
        any |= cfg->engine_on[e];
    if (!any) {
        fprintf(stderr, "storage-bench: no engine to run (none built, or --engines empty)\n");
        return false;
    }
    for (int e = 0; e < ENGINES_MAX; e++) {
        if (!cfg->engine_on[e])
            continue;
        bool built = false;
        for (size_t i = 0; engines_built[i]; i++)
            built |= strcmp(engines_built[i]->name, engine_names[e]) == 0;
        if (!built) {
            fprintf(stderr, "storage-bench: engine %s was not built into this binary\n",
                    engine_names[e]);
            return false;
        }
    }
    return true;
}

static void print_header(const bench_cfg *cfg) {
    char block[32] = "engine default";
    if (cfg->block_kb)
        snprintf(block, sizeof(block), "%zu KiB", cfg->block_kb);
    printf("storage-bench: %" PRIu64 " keys of %d B, values of %d B (~2:1 compressible), "
           "cache %zu MiB, memtable %zu MiB, blocks %s, bloom 10 bits/key\n",
           cfg->num, BENCH_KEY_BYTES, VALUE_BYTES, cfg->cache_mb, cfg->memtable_mb, block);
    printf("ratios are strata/peer: above 1 is better for ops/s and MB/s, below 1 is better "
           "for latency and memory\n");
    if (cfg->rounds > 1)
        printf("%d rounds, engines alternating: each row is its engine's median round by ops/s; "
               "peak memory the highest round\n",
               cfg->rounds);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("storage-bench %s\n", st_version());
        return 0;
    }
    bench_cfg cfg;
    int pa = parse_args(argc, argv, &cfg);
    if (pa != 0)
        return pa > 0 ? 0 : 1;
    if (!engines_available(&cfg))
        return 1;
    cfg.value_pool = value_pool_new(cfg.seed);
    char scratch[4096];
    snprintf(scratch, sizeof(scratch), "%s/storage-bench-XXXXXX", cfg.dir_base);
    mkdir(cfg.dir_base, 0755);
    if (!cfg.value_pool || !mkdtemp(scratch)) {
        fprintf(stderr, "storage-bench: cannot make a scratch dir in %s: %s\n", cfg.dir_base,
                strerror(errno));
        free(cfg.value_pool);
        return 1;
    }
    results *all = calloc(1, sizeof(*all));
    results *per_round = calloc((size_t)cfg.rounds, sizeof(*per_round));
    int failed = all && per_round ? 0 : 1;
    if (!failed)
        failed = run_rounds(&cfg, scratch, per_round, all);
    free(per_round);
    remove_tree(scratch);
    if (!all)
        return free(cfg.value_pool), 1;
    print_header(&cfg);
    for (workload w = 0; w < W_COUNT; w++)
        if (cfg.workload_on[w])
            failed |= print_workload(&cfg, all, w) != 0;
    int missed = print_goals(&cfg, all);
    print_lines(all);
    free(all);
    free(cfg.value_pool);
    return failed ? 1 : cfg.strict && missed ? 2 : 0;
}
