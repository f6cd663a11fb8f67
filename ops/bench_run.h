/* ops/bench_run.h — the driver of `strata bench` (bench_run.c) and the configuration it reads,
 * shared with the command-line front end (bench.c). Private to ops/. */
#ifndef STRATA_OPS_BENCH_RUN_H
#define STRATA_OPS_BENCH_RUN_H

#include "bench.h"
#include "strata/rpc.h"

#define BENCH_CONNS_MAX 1024
#define BENCH_STREAMS_MAX 256 /* the server's default SETTINGS_MAX_CONCURRENT_STREAMS */
#define BENCH_WORKLOADS_MAX 16
#define BENCH_PIDS_MAX 16
#define BENCH_BULK_ROWS 100 /* rows per MutateRows call (bulkwrite and preload) */
#define BENCH_SCAN_ROWS 100 /* rows per scan; ycsb-e scans 1..this many */
#define BENCH_VALUE_BYTES_MAX ((uint32_t)16 << 20)
#define BENCH_NAME_MAX 256        /* project, instance, table, app profile */
#define BENCH_RECONNECTS_MAX 1024 /* replaced connections kept until the run ends */
#define BENCH_LOAD_STREAMS_MIN 8  /* preload keeps at least this many calls in flight per conn */
#define BENCH_PROC_NAME_MAX 32    /* "router", "east-0"... */
#define BENCH_LAG_POLL_MS 1       /* replication lag probe: pause between reads of the marker */
#define BENCH_LAG_GIVEUP_MS 30000 /* a marker not visible after this counts as lost */
#define BENCH_LAG_INTERVAL_MS_DEFAULT 100 /* pause between one marker found and the next write */
#define BENCH_TOKEN_MAX 512               /* --token */
#define BENCH_STORM_MAX 100000            /* --storm: new connections */
#define BENCH_STORM_THREADS 4 /* connecting at once, each one connection after the other */

typedef enum bench_wl {
    WL_WRITE = 0,
    WL_BULKWRITE,
    WL_READ,
    WL_SCAN,
    WL_YCSB_A,
    WL_YCSB_B,
    WL_YCSB_E,
    WL_SCAN_LIMIT, /* a start key and rows_limit, no end key (cbt read start=K count=N) */
    WL_CHANGES,    /* change streams: writes with one consumer (bench_cs.c) */
    WL_LOAD,       /* the preload: sequential MutateRows over [0, preload) */
    WL_COUNT
} bench_wl;

const char *bench_wl_name(bench_wl wl);
bool bench_wl_reads(bench_wl wl); /* needs preloaded rows */

typedef struct bench_cfg {
    bench_wl wl[BENCH_WORKLOADS_MAX];
    size_t n_wl;
    ops_dist dist;
    uint32_t conns, streams;
    uint32_t value_bytes;
    uint64_t keys, preload;
    double duration_s; /* used when requests == 0 */
    uint64_t requests; /* per workload, over all connections */
    int64_t timeout_ms;
    uint64_t seed;
    bool progress;
    int64_t timestamp_us; /* every cell the bench writes carries this timestamp */
    char project[BENCH_NAME_MAX], instance[BENCH_NAME_MAX], table[BENCH_NAME_MAX];
    char app_profile[BENCH_NAME_MAX];
    uint32_t lag_interval_ms; /* replication lag probe (bench_target.lag_profile) */
    /* the changes workload (bench_cs.c) */
    uint64_t cs_backlog;             /* changes written before the consumer starts */
    bool cs_compare;                 /* also write with streams off (TABLE-nocs) */
    char cs_profile[BENCH_NAME_MAX]; /* single-cluster profile of its writes and stream */
    /* --storm N: while a read workload runs, N new TLS connections (each a full handshake and
     * one PingAndWarm), started 40% into the run; the workload's p99 before and during. */
    uint32_t storm;
} bench_cfg;

/* One endpoint under test. */
typedef struct bench_target {
    const char *label; /* "strata", "emulator", "target" */
    char host[OPS_ADDR_MAX];
    uint16_t port;
    pid_t pids[BENCH_PIDS_MAX]; /* local processes measured (may be none) */
    char pid_names[BENCH_PIDS_MAX][BENCH_PROC_NAME_MAX]; /* "" = unnamed (reported as "pid N") */
    size_t n_pids;
    uint64_t inserted; /* ycsb-e inserts so far (new keys above the key space) */
    /* Replication lag probe: non-empty = while a workload that writes runs, a marker row is
     * written with the run's app profile and read back with this profile (single-cluster
     * routing to the other cluster) until visible; the time from the write's acknowledgement to
     * the first read that sees it is one lag sample. */
    char lag_profile[BENCH_NAME_MAX];
    /* --tls CA.pem: TLS to the target, its certificate verified with the CA (copts.ssl_ctx
     * NULL: plaintext); --token: "authorization: Bearer TOKEN" on every call ("" = none). */
    rpc_client_opts copts;
    char auth[BENCH_TOKEN_MAX + 8];
} bench_target;

/* The metadata of a call to t: x-goog-request-params = params, then the token if any; returns
 * how many entries md[0..2) holds. */
size_t bench_md_fill(rpc_metadata md[2], const char *params, const bench_target *t);

#define BENCH_ERR_VERIFY (ST_UNAUTHENTICATED + 1) /* index of verification failures */
#define BENCH_ERR_SLOTS (BENCH_ERR_VERIFY + 1)

typedef struct bench_result {
    bench_wl wl;
    const char *label;
    uint64_t calls, rows, bytes; /* verified successes only */
    uint64_t errors[BENCH_ERR_SLOTS];
    uint64_t errors_total;
    char first_error[320];
    ops_hist hist; /* nanoseconds per successful call */
    double elapsed_s;
    bool proc_ok; /* cpu_s / rss_peak_kb are meaningful */
    double cpu_s;
    uint64_t rss_peak_kb;
    double client_cpu_s;
    /* per process of the target, in bench_target.pids order (valid when proc_ok) */
    size_t n_procs;
    double proc_cpu_s[BENCH_PIDS_MAX];
    uint64_t proc_rss_peak_kb[BENCH_PIDS_MAX]; /* VmHWM at the end: peak since it started */
    uint64_t proc_rss_kb[BENCH_PIDS_MAX];      /* VmRSS at the end */
    /* replication lag probe (when the target has a lag_profile and the workload writes) */
    ops_hist lag;      /* nanoseconds from the marker's write acknowledged to visible */
    uint64_t lag_lost; /* markers not visible within BENCH_LAG_GIVEUP_MS or failed calls */
    char lag_error[160];
    /* the changes workload: latency from a write's acknowledgement to its change record
     * (nanoseconds), the backlog caught up, and write throughput with streams off */
    ops_hist cs_lat;
    uint64_t cs_lost; /* acknowledged writes whose record never came */
    uint64_t cs_backlog, cs_backlog_received;
    double cs_catchup_s;
    uint64_t cs_off_calls;
    double cs_off_ops_s;
    /* CPU of the target's processes (router and nodes) while the live writes ran with streams
     * on (consumer included) and off: CPU per write, which the machine's other load moves less
     * than throughput */
    bool cs_cpu_ok;
    double cs_on_cpu_s, cs_off_cpu_s;
    /* CPU of this process (the writers, and with streams on the consumer) in the same phases */
    double cs_on_client_cpu_s, cs_off_client_cpu_s;
    /* CPU while the backlog was caught up: the target's processes (cs_catchup_cpu_ok) and this
     * process (the consumer) */
    bool cs_catchup_cpu_ok;
    double cs_catchup_cpu_s, cs_catchup_client_cpu_s;
    /* the largest VmRSS of a node (a process not named "router"), sampled every
     * BENCH_CS_RSS_PERIOD_MS during the whole workload, and which node */
    uint64_t cs_node_rss_peak_kb;
    char cs_node_rss_name[BENCH_PROC_NAME_MAX];
    /* --storm: the workload's latencies before the storm and while it ran, the connections
     * that completed their call and those that failed, and how long the storm took */
    ops_hist storm_before, storm_during;
    uint64_t storm_ok, storm_failed;
    double storm_s;
    char storm_error[160];
} bench_result;

/* The node memory budget the changes workload compares node RSS with (MiB): 256 MiB of
 * memtables + 256 MiB of block cache + 64 MiB of other buffers (docs/strata-bench.md, Memory) +
 * the change-stream ring (64 MiB, docs/changestreams.md). */
#define BENCH_CS_NODE_BUDGET_MIB 640

/* Creates app profile `id` routing to `cluster` (single-cluster) through the instance admin API
 * unless it exists: the lag probe's way to read from the other cluster through the router. */
st_code bench_profile_ensure(const bench_cfg *cfg, const bench_target *t, const char *id,
                             const char *cluster, st_err *err);
bool bench_wl_writes(bench_wl wl);
/* Creates the table (family "f") through the table admin API unless it exists. */
st_code bench_table_ensure(const bench_cfg *cfg, const bench_target *t, st_err *err);
/* Runs one workload against one target; fills res. An error return means the run could not
 * happen at all (no event base, no connection); failed calls are counted in res instead. */
st_code bench_run_workload(const bench_cfg *cfg, bench_target *t, bench_wl wl, bench_result *res,
                           st_err *err);
/* The changes workload (bench_cs.c) against t: tables TABLE-cs (streams on) and, with
 * cs_compare, TABLE-nocs; fills res (writes of the live phase in calls/hist, the stream in
 * cs_*). An error return means it could not run at all (streams cannot be turned on...). */
#define BENCH_CS_BACKLOG_DEFAULT 10000
/* rounds > 1 with cs_compare and a duration: the streams-on and streams-off writes alternate in
 * that many slices each (the consumer stays open), so the machine's drift weighs on both. */
st_code bench_cs_run(const bench_cfg *cfg, uint32_t rounds, bench_target *t, bench_result *res,
                     st_err *err);
/* ---- a local instance (bench_up.c): one started with `strata up` in a temporary dir, or an
 * existing one named by its directory ---- */
#define BENCH_UP_WAIT_S 120 /* `strata up` gets this long to bring every process up */

typedef struct st_topology st_topology;
typedef struct bench_inst {
    char dir[4096];
    char tmp[4096];    /* the bench's temporary dir (logs of `strata up` / `strata down`) */
    bool started;      /* this bench ran `strata up`: it runs `strata down` at the end */
    st_topology *topo; /* DIR/topology (heap) */
    bool secure;       /* bench_inst_up: `strata up --secure` */
} bench_inst;

/* Runs `strata up --dir TMP/instance --port P --clusters C --nodes N` (P a free loopback port)
 * with this binary, output in TMP/up.log, then loads the topology. */
st_code bench_inst_up(bench_inst *in, const char *tmp, uint32_t clusters, uint32_t nodes,
                      st_err *err);
/* Loads DIR/topology of an instance that is already running. */
st_code bench_inst_load(bench_inst *in, const char *dir, st_err *err);
/* `strata down --dir DIR` (with --purge when asked) for an instance this bench started; frees. */
void bench_inst_down(bench_inst *in, bool purge);
/* Adds to t the processes of the instance recorded in DIR/run: the router (when router), then
 * every node of every cluster (when nodes), each with its name. */
void bench_inst_procs(const bench_inst *in, bench_target *t, bool router, bool nodes);

/* Set from a signal handler: runs stop issuing and finish what is in flight. */
void bench_request_stop(void);
bool bench_stop_requested(void);

#endif
