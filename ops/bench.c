/* ops/bench.c — `strata bench`: flags, the servers it starts itself (the official emulator for
 * --compare, a strata-node for --node), table setup and preload, running each workload against
 * each target in turn, and the report: a line per run, a summary table (with Strata/emulator
 * ratios when comparing) and one machine-readable key=value line. See docs/strata-bench.md. */
#include <limits.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_run.h"
#include "certs.h"
#include "instance.h"
#include "paths.h"
#include "strata/topology.h"

#define BENCH_TARGETS_MAX 3 /* Strata (the router), the node directly, the emulator */
#define BENCH_UP_CLUSTERS_MAX 8
#define BENCH_UP_NODES_MAX 16
#define BENCH_ROUNDS_MAX 100
#define BENCH_NODE_ARGS_MAX 16
#define BENCH_CHILD_READY_MS 60000
#define BENCH_EMULATOR_DEFAULT "/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator"

typedef struct bench_opts {
    bench_cfg cfg;
    const char *target; /* --target HOST:PORT */
    bool node;          /* --node: start a strata-node */
    const char *node_bin;
    const char *node_args[BENCH_NODE_ARGS_MAX];
    size_t n_node_args;
    bool compare; /* --compare emulator */
    const char *emulator_bin;
    pid_t pids[BENCH_PIDS_MAX]; /* --pid */
    size_t n_pids;
    bool preload_set, keep_tmp;
    uint32_t up_clusters, up_nodes; /* --up C [--up-nodes N] */
    const char *inst_dir;           /* --dir DIR: an instance already running */
    bool direct;                    /* --direct: also measure the first node without the router */
    const char *lag_cluster;        /* --lag-cluster ID */
    bool no_lag, names_set;
    uint32_t rounds;      /* --rounds: each workload in this many slices, targets alternating */
    const char *tls_ca;   /* --tls CA.pem */
    const char *tls_name; /* --tls-name HOST: the name the certificate must hold */
    const char *token;    /* --token TOKEN */
    bool secure;          /* --secure: --up starts `strata up --secure` */
} bench_opts;

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: strata bench (--target HOST:PORT | --node | --up CLUSTERS | --dir DIR)\n"
        "                    [--compare emulator] [--direct] [options]\n"
        "Drives a Bigtable v2 endpoint (a Strata router, a strata-node, the official emulator) "
        "over\n"
        "gRPC and verifies every response; failed calls never count as speed.\n"
        "\n"
        "  --target HOST:PORT   endpoint to measure\n"
        "  --node               start a local strata-node on a temporary data dir and measure it\n"
        "  --node-bin PATH      strata-node binary (default: next to strata in the build, or "
        "PATH)\n"
        "  --node-arg ARG       extra argument for the started strata-node (repeatable)\n"
        "  --up CLUSTERS        start an instance with `strata up --clusters CLUSTERS --nodes N` "
        "in "
        "a\n"
        "                       temporary dir, measure through its router, stop it at the end\n"
        "  --up-nodes N         nodes per cluster for --up (default 1)\n"
        "  --dir DIR            an instance `strata up --dir DIR` started: measure through its "
        "router\n"
        "                       (or --target) and report the router's and every node's CPU and "
        "memory\n"
        "  --direct             with --up/--dir: also run every workload straight against the "
        "first\n"
        "                       node of the first cluster (router overhead = router / node)\n"
        "  --lag-cluster ID     measure replication lag to cluster ID while writes run (default "
        "with\n"
        "                       --up/--dir: the second cluster, when there is one)\n"
        "  --lag-interval-ms MS pause between lag markers (default 100)\n"
        "  --no-lag             no replication lag probe\n"
        "  --rounds N           run each workload in N slices of duration/N, alternating the "
        "targets\n"
        "                       slice by slice (figures merged), so a noisy neighbour hits all "
        "alike\n"
        "  --compare emulator   also start cbtemulator and run each workload against both, "
        "alternately\n"
        "  --emulator-bin PATH  cbtemulator binary (default $STRATA_EMULATOR or the gcloud SDK's)\n"
        "  --workload LIST      comma-separated: write, bulkwrite, read, scan, ycsb-a, ycsb-b, "
        "ycsb-e,\n"
        "                       scan-limit, changes (default write,read,scan)\n"
        "  --cs-backlog N       changes: writes before the consumer starts, for its catch-up "
        "speed\n"
        "                       (default 10000; 0: none)\n"
        "  --cs-compare         changes: also write with streams off (write cost on / off)\n"
        "  --cs-profile ID      changes: single-cluster app profile of its writes and stream "
        "(default\n"
        "                       with --up/--dir: bench-cs-<first cluster>, created)\n"
        "  --dist D             key distribution: uniform, zipfian, sequential (default uniform)\n"
        "  --conns N            connections (default 1)\n"
        "  --streams N          concurrent calls per connection (default 1)\n"
        "  --value-size BYTES   value per row (default 1000)\n"
        "  --keys N             key space (default 100000)\n"
        "  --preload N          rows written before the workloads (default: --keys when a "
        "workload\n"
        "                       reads, else 0); reads and scans only touch preloaded rows\n"
        "  --duration SEC       per workload (default 10)\n"
        "  --requests N         per workload, instead of --duration\n"
        "  --timeout-ms MS      per call deadline (default 30000)\n"
        "  --project P --instance I --table T   names (default strata / bench / bench)\n"
        "  --app-profile ID     app_profile_id on every request\n"
        "  --pid PID            a local server process to measure (repeatable; default: found by "
        "the\n"
        "                       target's listening port)\n"
        "  --seed N             random seed (default 1)\n"
        "  --quiet              no progress lines on stderr\n"
        "  --keep-tmp           keep the temporary dir (server logs, node data)\n");
    fprintf(
        out,
        "  --tls CA.pem         TLS to the target, its certificate checked against CA.pem\n"
        "  --tls-name HOST      the name the target's certificate must hold (default: its host)\n"
        "  --token TOKEN        authorization: Bearer TOKEN on every call\n"
        "                       (--dir/--up of a secure instance: DIR/secure's CA and admin\n"
        "                       token unless given)\n"
        "  --secure             with --up: start the instance with `strata up --secure`\n"
        "  --storm N            during read/scan workloads: N new connections (full TLS\n"
        "                       handshakes with --tls), started 40%% into the run; reports the\n"
        "                       workload's p99 before and during the storm\n"
        "Exit status: 0 when every call succeeded and verified, 1 otherwise, 2 for bad usage.\n");
}

/* ---- parsing ---- */

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1000;
    else if (*end == 'm' || *end == 'M')
        mul = 1000000;
    if (mul != 1)
        end++;
    if (*end || v > UINT64_MAX / mul)
        return false;
    *out = v * mul;
    return true;
}

static bool parse_name(const char *s, char *out) {
    if (!s || strlen(s) >= BENCH_NAME_MAX)
        return false;
    strcpy(out, s);
    return true;
}

static bool parse_workloads(const char *s, bench_cfg *cfg) {
    cfg->n_wl = 0;
    while (s && *s) {
        size_t len = strcspn(s, ",");
        bench_wl found = WL_COUNT;
        for (int w = 0; w < WL_LOAD; w++)
            if (strlen(bench_wl_name((bench_wl)w)) == len &&
                !strncmp(s, bench_wl_name((bench_wl)w), len))
                found = (bench_wl)w;
        if (found == WL_COUNT || cfg->n_wl == BENCH_WORKLOADS_MAX)
            return false;
        cfg->wl[cfg->n_wl++] = found;
        s += len;
        if (*s == ',')
            s++;
    }
    return cfg->n_wl > 0;
}

static bool parse_dist(const char *s, ops_dist *d) {
    if (!s)
        return false;
    if (!strcmp(s, "uniform"))
        *d = OPS_DIST_UNIFORM;
    else if (!strcmp(s, "zipfian"))
        *d = OPS_DIST_ZIPFIAN;
    else if (!strcmp(s, "sequential"))
        *d = OPS_DIST_SEQUENTIAL;
    else
        return false;
    return true;
}

static void opts_default(bench_opts *o) {
    memset(o, 0, sizeof(*o));
    bench_cfg *c = &o->cfg;
    parse_workloads("write,read,scan", c);
    c->dist = OPS_DIST_UNIFORM;
    c->conns = 1;
    c->streams = 1;
    c->value_bytes = 1000;
    c->keys = 100000;
    c->duration_s = 10;
    c->timeout_ms = 30000;
    c->seed = 1;
    c->progress = true;
    c->cs_backlog = BENCH_CS_BACKLOG_DEFAULT;
    strcpy(c->project, "strata");
    strcpy(c->instance, "bench");
    strcpy(c->table, "bench");
}

static bool parse_u32_in(const char *v, uint64_t lo, uint64_t hi, uint32_t *out) {
    uint64_t n;
    if (!parse_u64(v, &n) || n < lo || n > hi)
        return false;
    *out = (uint32_t)n;
    return true;
}

/* What to measure and which processes. 1 = taken, 0 = bad value, -1 = not one of these. */
static int parse_flag_where(bench_opts *o, const char *name, const char *v) {
    uint64_t n;
    if (!strcmp(name, "target"))
        o->target = v;
    else if (!strcmp(name, "node-bin"))
        o->node_bin = v;
    else if (!strcmp(name, "emulator-bin"))
        o->emulator_bin = v;
    else if (!strcmp(name, "node-arg")) {
        if (o->n_node_args == BENCH_NODE_ARGS_MAX)
            return 0;
        o->node_args[o->n_node_args++] = v;
    } else if (!strcmp(name, "compare")) {
        if (strcmp(v, "emulator") != 0)
            return 0;
        o->compare = true;
    } else if (!strcmp(name, "up")) {
        if (!parse_u64(v, &n) || n < 1 || n > BENCH_UP_CLUSTERS_MAX)
            return 0;
        o->up_clusters = (uint32_t)n;
    } else if (!strcmp(name, "up-nodes")) {
        if (!parse_u64(v, &n) || n < 1 || n > BENCH_UP_NODES_MAX)
            return 0;
        o->up_nodes = (uint32_t)n;
    } else if (!strcmp(name, "dir")) {
        o->inst_dir = v;
    } else if (!strcmp(name, "rounds")) {
        if (!parse_u64(v, &n) || n < 1 || n > BENCH_ROUNDS_MAX)
            return 0;
        o->rounds = (uint32_t)n;
    } else if (!strcmp(name, "lag-cluster")) {
        o->lag_cluster = v;
    } else if (!strcmp(name, "lag-interval-ms")) {
        if (!parse_u64(v, &n) || n < 1 || n > 60000)
            return 0;
        o->cfg.lag_interval_ms = (uint32_t)n;
    } else if (!strcmp(name, "tls")) {
        o->tls_ca = v;
    } else if (!strcmp(name, "tls-name")) {
        o->tls_name = v;
    } else if (!strcmp(name, "token")) {
        if (strlen(v) >= BENCH_TOKEN_MAX)
            return 0;
        o->token = v;
    } else if (!strcmp(name, "storm")) {
        if (!parse_u64(v, &n) || n < 1 || n > BENCH_STORM_MAX)
            return 0;
        o->cfg.storm = (uint32_t)n;
    } else if (!strcmp(name, "pid")) {
        if (!parse_u64(v, &n) || n == 0 || n > INT_MAX || o->n_pids == BENCH_PIDS_MAX)
            return 0;
        o->pids[o->n_pids++] = (pid_t)n;
    } else {
        return -1;
    }
    return 1;
}

/* The workload's shape. Same return convention. */
static int parse_flag_load(bench_opts *o, const char *name, const char *v) {
    bench_cfg *c = &o->cfg;
    uint64_t n;
    char *end;
    if (!strcmp(name, "workload"))
        return parse_workloads(v, c);
    if (!strcmp(name, "dist"))
        return parse_dist(v, &c->dist);
    if (!strcmp(name, "conns"))
        return parse_u32_in(v, 1, BENCH_CONNS_MAX, &c->conns);
    if (!strcmp(name, "streams"))
        return parse_u32_in(v, 1, BENCH_STREAMS_MAX, &c->streams);
    if (!strcmp(name, "value-size"))
        return parse_u32_in(v, 0, BENCH_VALUE_BYTES_MAX, &c->value_bytes);
    if (!strcmp(name, "keys"))
        return parse_u64(v, &c->keys) && c->keys >= 1 && c->keys <= OPS_KEY_INDEX_MAX / 2;
    if (!strcmp(name, "preload")) {
        o->preload_set = true;
        return parse_u64(v, &c->preload) && c->preload <= OPS_KEY_INDEX_MAX / 2;
    }
    if (!strcmp(name, "requests"))
        return parse_u64(v, &c->requests) && c->requests > 0;
    if (!strcmp(name, "timeout-ms")) {
        bool ok = parse_u64(v, &n) && n > 0 && n <= 3600000;
        if (ok) /* n is unset when v does not parse */
            c->timeout_ms = (int64_t)n;
        return ok;
    }
    if (!strcmp(name, "seed"))
        return parse_u64(v, &c->seed);
    if (!strcmp(name, "cs-backlog"))
        return parse_u64(v, &c->cs_backlog) && c->cs_backlog <= OPS_KEY_INDEX_MAX / 2;
    if (!strcmp(name, "cs-profile"))
        return parse_name(v, c->cs_profile);
    if (!strcmp(name, "duration")) {
        c->duration_s = strtod(v, &end);
        end += *end == 's';
        return !*end && c->duration_s > 0;
    }
    return -1;
}

/* One flag with a value; false on an unknown flag or a bad value. */
static bool parse_flag(bench_opts *o, const char *name, const char *v) {
    bench_cfg *c = &o->cfg;
    int rc = parse_flag_where(o, name, v);
    if (rc < 0)
        rc = parse_flag_load(o, name, v);
    if (rc >= 0)
        return rc == 1;
    if (!strcmp(name, "project") || !strcmp(name, "instance")) {
        o->names_set = true; /* else an instance's own project and instance are used */
        return parse_name(v, name[0] == 'p' ? c->project : c->instance);
    }
    if (!strcmp(name, "table"))
        return parse_name(v, c->table);
    if (!strcmp(name, "app-profile"))
        return parse_name(v, c->app_profile);
    return false;
}

/* Returns 0 on success, 2 after printing what is wrong; -1 for --help. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return -1;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "strata bench: unexpected argument '%s'\n", a);
            return 2;
        }
        const char *name = a + 2;
        if (!strcmp(name, "node")) {
            o->node = true;
            continue;
        }
        if (!strcmp(name, "quiet")) {
            o->cfg.progress = false;
            continue;
        }
        if (!strcmp(name, "keep-tmp")) {
            o->keep_tmp = true;
            continue;
        }
        if (!strcmp(name, "direct")) {
            o->direct = true;
            continue;
        }
        if (!strcmp(name, "no-lag")) {
            o->no_lag = true;
            continue;
        }
        if (!strcmp(name, "secure")) {
            o->secure = true;
            continue;
        }
        if (!strcmp(name, "cs-compare")) {
            o->cfg.cs_compare = true;
            continue;
        }
        char buf[64];
        const char *eq = strchr(name, '='), *v;
        if (eq) {
            size_t len = (size_t)(eq - name);
            if (len >= sizeof(buf))
                len = sizeof(buf) - 1;
            memcpy(buf, name, len);
            buf[len] = '\0';
            name = buf;
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            fprintf(stderr, "strata bench: %s needs a value\n", a);
            return 2;
        }
        if (!parse_flag(o, name, v)) {
            fprintf(stderr, "strata bench: bad flag or value: --%s %s (see strata bench --help)\n",
                    name, v);
            return 2;
        }
    }
    return 0;
}

/* Cross-flag rules, and the defaults that depend on other flags. */
static bool opts_check(bench_opts *o) {
    bench_cfg *c = &o->cfg;
    if ((o->target || o->inst_dir) + o->node + (o->up_clusters > 0) != 1) {
        fprintf(stderr, "strata bench: say what to measure: --target HOST:PORT, --node, --up "
                        "CLUSTERS or --dir DIR (one; --dir may come with --target)\n");
        return false;
    }
    if (o->direct && !o->up_clusters && !o->inst_dir) {
        fprintf(stderr, "strata bench: --direct needs an instance: --up CLUSTERS or --dir DIR\n");
        return false;
    }
    if (o->secure && !o->up_clusters) {
        fprintf(stderr, "strata bench: --secure starts an instance: use it with --up CLUSTERS "
                        "(a running secure instance: --dir DIR)\n");
        return false;
    }
    if (!o->up_nodes)
        o->up_nodes = 1;
    if (!o->rounds)
        o->rounds = 1;
    if (!c->lag_interval_ms)
        c->lag_interval_ms = BENCH_LAG_INTERVAL_MS_DEFAULT;
    bool reads = false;
    for (size_t i = 0; i < c->n_wl; i++)
        reads |= bench_wl_reads(c->wl[i]);
    if (!o->preload_set)
        c->preload = reads ? c->keys : 0;
    if (reads && c->preload == 0) {
        fprintf(stderr, "strata bench: read, scan and ycsb workloads need --preload > 0 (reads "
                        "check that the rows they ask for come back)\n");
        return false;
    }
    return true;
}

/* ---- starting servers ---- */

/* --node-bin; else where `strata up` finds it (ops_bin_find: build tree, beside strata, PATH). */
static bool find_node_bin(const char *given, char *out, size_t cap) {
    if (given) {
        snprintf(out, cap, "%s", given);
        return ops_executable(out);
    }
    return ops_bin_find(NULL, "node", "strata-node", out, cap);
}

static bool find_emulator_bin(const char *given, char *out, size_t cap) {
    const char *env = getenv("STRATA_EMULATOR");
    const char *pick = given ? given : env && *env ? env : BENCH_EMULATOR_DEFAULT;
    snprintf(out, cap, "%s", pick);
    if (ops_executable(out))
        return true;
    return !given && ops_path_search("cbtemulator", out, cap);
}

/* HOST:PORT or [V6]:PORT into the target (st_addr_split); port 0 is refused here. */
static bool target_set_addr(bench_target *t, const char *addr) {
    uint16_t port;
    if (!st_addr_split(addr, t->host, sizeof(t->host), &port) || port == 0 || !t->host[0])
        return false;
    t->port = port;
    return true;
}

static bool host_is_local(const char *h) {
    return !strncmp(h, "127.", 4) || !strcmp(h, "localhost") || !strcmp(h, "::1") ||
           !strcmp(h, "0.0.0.0");
}

typedef struct bench_env {
    char tmp[PATH_MAX];
    ops_child node, emulator;
    bench_inst inst; /* --up / --dir */
    bench_target targets[BENCH_TARGETS_MAX];
    size_t n_targets;
    struct ssl_ctx_st *tls; /* --tls, or a secure instance's CA */
} bench_env;

static st_code start_child(bench_env *env, ops_child *child, char *const argv[], const char *log,
                           const char *marker, st_err *err) {
    char log_path[PATH_MAX + 32];
    snprintf(log_path, sizeof(log_path), "%s/%s", env->tmp, log);
    return ops_child_start(child, argv, log_path, marker, BENCH_CHILD_READY_MS, err);
}

static st_code start_node(bench_opts *o, bench_env *env, st_err *err) {
    char bin[PATH_MAX], data[PATH_MAX + 16];
    if (!find_node_bin(o->node_bin, bin, sizeof(bin)))
        return st_err_set(err, ST_NOT_FOUND,
                          "no strata-node binary found (%s): build it "
                          "(ninja strata-node) or pass --node-bin PATH",
                          o->node_bin ? o->node_bin : "looked next to strata and in PATH");
    snprintf(data, sizeof(data), "%s/node-data", env->tmp);
    char *argv[6 + BENCH_NODE_ARGS_MAX + 1] = {bin, "--data", data, "--listen", "127.0.0.1:0"};
    size_t n = 5;
    for (size_t i = 0; i < o->n_node_args; i++)
        argv[n++] = (char *)o->node_args[i];
    argv[n] = NULL;
    st_code rc = start_child(env, &env->node, argv, "node.log", "listening on ", err);
    if (rc == ST_OK)
        fprintf(stderr, "bench: started %s on %s (data in %s)\n", bin, env->node.addr, data);
    return rc;
}

static st_code start_emulator(bench_opts *o, bench_env *env, st_err *err) {
    char bin[PATH_MAX];
    if (!find_emulator_bin(o->emulator_bin, bin, sizeof(bin)))
        return st_err_set(err, ST_NOT_FOUND,
                          "no cbtemulator found (%s): install the gcloud "
                          "Bigtable emulator or pass --emulator-bin PATH",
                          bin);
    char *argv[] = {bin, "-host", "127.0.0.1", "-port", "0", NULL};
    st_code rc = start_child(env, &env->emulator, argv, "emulator.log", "running on ", err);
    if (rc == ST_OK)
        fprintf(stderr, "bench: started %s on %s\n", bin, env->emulator.addr);
    return rc;
}

/* The instance of --up / --dir: the router is the target (unless --target names another
 * endpoint), its processes are measured, the lag probe reads from the other cluster. */
static st_code target_instance(bench_opts *o, bench_env *env, bench_target *t, st_err *err) {
    bench_inst *in = &env->inst;
    in->secure = o->secure;
    st_code rc = o->up_clusters ? bench_inst_up(in, env->tmp, o->up_clusters, o->up_nodes, err)
                                : bench_inst_load(in, o->inst_dir, err);
    if (rc != ST_OK)
        return rc;
    const st_topology *topo = in->topo;
    char router[ST_TOPO_ADDR_MAX + 1];
    if (!o->target &&
        !ops_inst_router_pick("strata bench", topo, o->inst_dir, router, sizeof router))
        return st_err_set(err, ST_UNAVAILABLE, "no router of the instance answers");
    const char *addr = o->target ? o->target : router;
    if (!target_set_addr(t, addr))
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad address '%s': use HOST:PORT", addr);
    bench_inst_procs(in, t, true, true);
    if (!o->names_set) { /* app profiles (the lag probe's) live in the topology's instance */
        snprintf(o->cfg.project, sizeof(o->cfg.project), "%s", topo->project);
        snprintf(o->cfg.instance, sizeof(o->cfg.instance), "%s", topo->instance);
    }
    if (!o->lag_cluster && !o->no_lag && topo->n_clusters > 1)
        o->lag_cluster = topo->clusters[1].id;
    fprintf(stderr, "bench: instance %s: %zu cluster(s), router %s\n", in->dir, topo->n_clusters,
            addr);
    return ST_OK;
}

/* --direct: the first node of the first cluster, without the router. */
static void target_direct(bench_env *env) {
    const st_topo_cluster *c = &env->inst.topo->clusters[0];
    bench_target *t = &env->targets[env->n_targets++];
    t->label = "node";
    target_set_addr(t, c->nodes[0].addr);
    char name[BENCH_PROC_NAME_MAX];
    snprintf(name, sizeof(name), "%.20s-0", c->id);
    for (size_t i = 0; i < env->targets[0].n_pids; i++)
        if (!strcmp(env->targets[0].pid_names[i], name)) {
            t->pids[t->n_pids] = env->targets[0].pids[i];
            memcpy(t->pid_names[t->n_pids++], name, sizeof(name));
        }
    if (c->n_nodes > 1)
        fprintf(stderr,
                "bench: --direct talks to %s only; with %zu nodes in %s the rows other "
                "nodes own fail there (use --up-nodes 1)\n",
                c->nodes[0].addr, c->n_nodes, c->id);
}

static bool runs_changes(const bench_cfg *c) {
    for (size_t i = 0; i < c->n_wl; i++)
        if (c->wl[i] == WL_CHANGES)
            return true;
    return false;
}

/* The changes workload writes and reads through one single-cluster profile: --cs-profile, or
 * with an instance bench-cs-<first cluster> (created), or --app-profile. */
static st_code cs_profile_prepare(bench_opts *o, bench_env *env, bench_target *t, st_err *err) {
    bench_cfg *c = &o->cfg;
    if (!runs_changes(c) || c->cs_profile[0])
        return ST_OK;
    if (!env->inst.topo) {
        if (!c->app_profile[0])
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "the changes workload needs an app profile with single-cluster "
                              "routing: --cs-profile ID (or --up / --dir, where the bench makes "
                              "one)");
        snprintf(c->cs_profile, sizeof c->cs_profile, "%s", c->app_profile);
        return ST_OK;
    }
    const char *cluster = env->inst.topo->clusters[0].id;
    snprintf(c->cs_profile, sizeof c->cs_profile, "bench-cs-%.60s", cluster);
    return bench_profile_ensure(c, t, c->cs_profile, cluster, err);
}

/* --tls/--token, or the CA and admin token of a secure instance (--up --secure, --dir): TLS and
 * the token for the first target. */
static st_code target_security(bench_opts *o, bench_env *env, bench_target *t, st_err *err) {
    char ca[PATH_MAX + 32], token[BENCH_TOKEN_MAX] = "";
    const char *ca_path = o->tls_ca, *tok = o->token;
    if (!ca_path && env->inst.topo) {
        snprintf(ca, sizeof ca, "%s/%s/ca.pem", env->inst.dir, OPS_SECURE_SUBDIR);
        if (access(ca, F_OK) == 0)
            ca_path = ca;
        if (ca_path && !tok && ops_secure_token(env->inst.dir, "admin", token, sizeof token))
            tok = token;
        if (ca_path && o->direct)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "--direct is not supported on a secure instance (its nodes serve "
                              "only routers): drop --direct");
    }
    if (tok)
        snprintf(t->auth, sizeof t->auth, "Bearer %s", tok);
    if (!ca_path)
        return ST_OK;
    if (!(env->tls = rpc_tls_client_ctx_new(ca_path, NULL, NULL, err)))
        return err ? err->code : ST_INVALID_ARGUMENT;
    t->copts.ssl_ctx = env->tls;
    t->copts.server_name = o->tls_name;
    fprintf(stderr, "bench: TLS to %s:%u (CA %s)%s\n", t->host, t->port, ca_path,
            t->auth[0] ? " with a bearer token" : "");
    return ST_OK;
}

/* The targets, in run order: Strata (or the given endpoint) first, then the node directly
 * (--direct), then the emulator. */
static st_code targets_prepare(bench_opts *o, bench_env *env, st_err *err) {
    bench_target *t = &env->targets[env->n_targets++];
    bool inst = o->up_clusters || o->inst_dir;
    t->label = o->compare || o->node || o->direct || inst ? "strata" : "target";
    if (inst) {
        st_code rc = target_instance(o, env, t, err);
        if (rc != ST_OK)
            return rc;
        if (o->direct)
            target_direct(env);
    } else if (o->node) {
        st_code rc = start_node(o, env, err);
        if (rc != ST_OK)
            return rc;
        target_set_addr(t, env->node.addr);
        t->pids[t->n_pids++] = env->node.pid;
    } else if (!target_set_addr(t, o->target)) {
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad --target '%s': use HOST:PORT", o->target);
    }
    st_code src = target_security(o, env, t, err);
    if (src != ST_OK)
        return src;
    for (size_t i = 0; i < o->n_pids; i++)
        t->pids[t->n_pids++] = o->pids[i];
    if (t->n_pids == 0 && host_is_local(t->host))
        t->n_pids = ops_proc_find_listeners(t->port, t->pids, BENCH_PIDS_MAX);
    st_code prc = cs_profile_prepare(o, env, t, err);
    if (prc != ST_OK)
        return prc;
    if (o->lag_cluster && !o->no_lag) {
        snprintf(t->lag_profile, sizeof(t->lag_profile), "bench-lag-%.60s", o->lag_cluster);
        st_code rc = bench_profile_ensure(&o->cfg, t, t->lag_profile, o->lag_cluster, err);
        if (rc != ST_OK)
            return rc;
    }
    if (!o->compare)
        return ST_OK;
    st_code rc = start_emulator(o, env, err);
    if (rc != ST_OK)
        return rc;
    t = &env->targets[env->n_targets++];
    t->label = "emulator";
    target_set_addr(t, env->emulator.addr);
    t->pids[t->n_pids++] = env->emulator.pid;
    return ST_OK;
}

/* ---- reporting ---- */

/* A result no run filled (a skipped target): left out of every report. */
static bool result_empty(const bench_result *r) {
    return r->label == NULL;
}

static double ops_s(const bench_result *r) {
    return r->elapsed_s > 0 ? (double)r->calls / r->elapsed_s : 0;
}
static double rows_s(const bench_result *r) {
    return r->elapsed_s > 0 ? (double)r->rows / r->elapsed_s : 0;
}
static double mb_s(const bench_result *r) {
    return r->elapsed_s > 0 ? (double)r->bytes / r->elapsed_s / 1e6 : 0;
}
static double pct_us(const bench_result *r, double p) {
    return (double)ops_hist_percentile(&r->hist, p) / 1e3;
}
static double cpu_us_per_op(const bench_result *r) {
    return r->calls ? r->cpu_s * 1e6 / (double)r->calls : 0;
}

static void print_errors(FILE *out, const bench_result *r) {
    for (int i = 0; i < BENCH_ERR_SLOTS; i++)
        if (r->errors[i])
            fprintf(out, " %s=%llu", i == BENCH_ERR_VERIFY ? "VERIFY" : st_code_name((st_code)i),
                    (unsigned long long)r->errors[i]);
}

static void print_run(const bench_result *r) {
    printf("%-9s %-8s calls=%llu rows=%llu ops/s=%.1f rows/s=%.1f MB/s=%.2f p50=%.1fus "
           "p90=%.1fus p99=%.1fus p99.9=%.1fus max=%.1fus errors=%llu",
           bench_wl_name(r->wl), r->label, (unsigned long long)r->calls,
           (unsigned long long)r->rows, ops_s(r), rows_s(r), mb_s(r), pct_us(r, 50), pct_us(r, 90),
           pct_us(r, 99), pct_us(r, 99.9), (double)r->hist.max / 1e3,
           (unsigned long long)r->errors_total);
    print_errors(stdout, r);
    if (r->proc_ok)
        printf(" server_cpu=%.2fs server_rss_peak=%.1fMB", r->cpu_s,
               (double)r->rss_peak_kb / 1024.0);
    printf(" client_cpu=%.2fs\n", r->client_cpu_s);
    if (r->errors_total)
        printf("          first error: %s\n", r->first_error);
    fflush(stdout);
}

static void table_row(const char *wl, const char *label, const double v[10], bool ratio) {
    printf("%-9s %-9s", wl, label);
    for (int i = 0; i < 10; i++) {
        if (v[i] < 0)
            printf(" %10s", "-");
        else if (ratio)
            printf(" %9.2fx", v[i]);
        else
            printf(" %10.1f", v[i]);
    }
    printf("\n");
}

static void result_figures(const bench_result *r, double v[10]) {
    double f[10] = {ops_s(r),
                    mb_s(r),
                    pct_us(r, 50),
                    pct_us(r, 90),
                    pct_us(r, 99),
                    pct_us(r, 99.9),
                    (double)r->hist.max / 1e3,
                    (double)r->errors_total,
                    r->proc_ok ? cpu_us_per_op(r) : -1,
                    r->proc_ok ? (double)r->rss_peak_kb / 1024.0 : -1};
    memcpy(v, f, sizeof(f));
}

/* Index of the target labelled `label`, or SIZE_MAX. */
static size_t target_index(const bench_env *env, const char *label) {
    for (size_t t = 0; t < env->n_targets; t++)
        if (!strcmp(env->targets[t].label, label))
            return t;
    return SIZE_MAX;
}

static void ratio_row(const char *wl, const char *label, const double a[10], const double b[10]) {
    double q[10];
    for (int i = 0; i < 10; i++)
        q[i] = a[i] > 0 && b[i] > 0 ? a[i] / b[i] : -1;
    q[7] = -1; /* an error ratio means nothing */
    table_row(wl, label, q, true);
}

/* res[w * n_targets + t]; the load row first. Ratios: Strata / emulator ("ratio") and, with
 * --direct, through the router / straight to the node ("rtr/node": the router's overhead). */
static void print_table(const bench_env *env, const bench_result *res, size_t n_rows) {
    size_t nt = env->n_targets, emu = target_index(env, "emulator"),
           node = target_index(env, "node");
    printf("\n%-9s %-9s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "workload", "target",
           "ops/s", "MB/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us", "errors",
           "cpu us/op", "rss MB");
    for (size_t w = 0; w < n_rows; w++) {
        double v[BENCH_TARGETS_MAX][10];
        const char *wl = bench_wl_name(res[w * nt].wl);
        for (size_t t = 0; t < nt; t++) {
            const bench_result *r = &res[w * nt + t];
            result_figures(r, v[t]);
            if (!result_empty(r))
                table_row(wl, r->label, v[t], false);
        }
        if (emu != SIZE_MAX && !result_empty(&res[w * nt + emu]))
            ratio_row(wl, "ratio", v[0], v[emu]);
        if (node != SIZE_MAX && !result_empty(&res[w * nt + node]))
            ratio_row(wl, "rtr/node", v[0], v[node]);
    }
    if (emu != SIZE_MAX)
        printf("ratio = strata / emulator: above 1 is better for ops/s and MB/s, below 1 for "
               "latency, CPU and memory.\n");
    if (node != SIZE_MAX)
        printf("rtr/node = through the router / straight to the node (rss: router + every node "
               "/ that node).\n");
}

static const char *proc_name(const bench_target *t, size_t i, char *buf, size_t cap) {
    if (t->pid_names[i][0])
        return t->pid_names[i];
    snprintf(buf, cap, "pid %d", (int)t->pids[i]);
    return buf;
}

/* Each measured process, per run: CPU during the run, RSS at its end and peak (VmHWM, since the
 * process started). */
static void print_procs(const bench_env *env, const bench_result *res, size_t n_rows) {
    size_t nt = env->n_targets;
    bool any = false;
    for (size_t i = 0; i < n_rows * nt; i++)
        any |= res[i].proc_ok && res[i].n_procs > 1;
    if (!any)
        return;
    printf("\n%-9s %-9s %-14s %8s %10s %10s %10s\n", "workload", "target", "process", "pid",
           "cpu s", "rss MB", "peak MB");
    for (size_t i = 0; i < n_rows * nt; i++) {
        const bench_result *r = &res[i];
        const bench_target *t = &env->targets[i % nt];
        for (size_t p = 0; r->proc_ok && p < r->n_procs; p++) {
            char buf[32];
            printf("%-9s %-9s %-14s %8d %10.2f %10.1f %10.1f\n", bench_wl_name(r->wl), r->label,
                   proc_name(t, p, buf, sizeof(buf)), (int)t->pids[p], r->proc_cpu_s[p],
                   (double)r->proc_rss_kb[p] / 1024.0, (double)r->proc_rss_peak_kb[p] / 1024.0);
        }
    }
    printf("peak MB = VmHWM, the process's peak resident set since it started.\n");
}

/* --storm: the read workload's latency before the storm and during it. */
static void print_storm(const bench_result *res, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->storm_ok && !r->storm_failed && !r->storm_error[0])
            continue;
        printf("\nhandshake storm during %s (%s): %llu new connections in %.2f s (%llu failed); "
               "workload p50/p99 before %.0f/%.0f us (%llu calls), during %.0f/%.0f us (%llu "
               "calls)\n",
               bench_wl_name(r->wl), r->label, (unsigned long long)r->storm_ok, r->storm_s,
               (unsigned long long)r->storm_failed,
               (double)ops_hist_percentile(&r->storm_before, 50) / 1e3,
               (double)ops_hist_percentile(&r->storm_before, 99) / 1e3,
               (unsigned long long)r->storm_before.total,
               (double)ops_hist_percentile(&r->storm_during, 50) / 1e3,
               (double)ops_hist_percentile(&r->storm_during, 99) / 1e3,
               (unsigned long long)r->storm_during.total);
        if (r->storm_error[0])
            printf("          first storm error: %s\n", r->storm_error);
    }
}

static void print_lag(const bench_env *env, const bench_result *res, size_t n_rows) {
    for (size_t i = 0; i < n_rows * env->n_targets; i++) {
        const bench_result *r = &res[i];
        const bench_target *t = &env->targets[i % env->n_targets];
        if (!t->lag_profile[0] || !bench_wl_writes(r->wl))
            continue;
        printf("\nreplication lag during %s (%s): write acknowledged -> visible through app "
               "profile %s: %llu samples, p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms, "
               "lost %llu\n",
               bench_wl_name(r->wl), r->label, t->lag_profile, (unsigned long long)r->lag.total,
               (double)ops_hist_percentile(&r->lag, 50) / 1e6,
               (double)ops_hist_percentile(&r->lag, 90) / 1e6,
               (double)ops_hist_percentile(&r->lag, 99) / 1e6, (double)r->lag.max / 1e6,
               (unsigned long long)r->lag_lost);
        if (r->lag_error[0])
            printf("          first lag probe error: %s\n", r->lag_error);
    }
}

static double cs_cpu_us(double cpu_s, uint64_t calls) {
    return calls ? cpu_s * 1e6 / (double)calls : 0;
}

/* Server CPU per write with streams on / off. */
static double cs_cpu_ratio(const bench_result *r) {
    double off = cs_cpu_us(r->cs_off_cpu_s, r->cs_off_calls);
    return off > 0 ? cs_cpu_us(r->cs_on_cpu_s, r->calls) / off : 0;
}

/* The changes workload: change latency, catch-up, write cost. */
static void print_cs(const bench_env *env, const bench_result *res, size_t n_rows) {
    for (size_t i = 0; i < n_rows * env->n_targets; i++) {
        const bench_result *r = &res[i];
        if (r->wl != WL_CHANGES || result_empty(r))
            continue;
        printf("\nchange stream (%s): write acknowledged -> change record received: %llu samples, "
               "p50 %.2f ms, p99 %.2f ms, max %.2f ms, lost %llu\n",
               r->label, (unsigned long long)r->cs_lat.total,
               (double)ops_hist_percentile(&r->cs_lat, 50) / 1e6,
               (double)ops_hist_percentile(&r->cs_lat, 99) / 1e6, (double)r->cs_lat.max / 1e6,
               (unsigned long long)r->cs_lost);
        if (r->cs_backlog)
            printf("backlog: %llu changes caught up in %.3f s (%.0f changes/s), %llu received\n",
                   (unsigned long long)r->cs_backlog, r->cs_catchup_s,
                   r->cs_catchup_s > 0 ? (double)r->cs_backlog_received / r->cs_catchup_s : 0,
                   (unsigned long long)r->cs_backlog_received);
        if (r->cs_backlog && r->cs_backlog_received && r->cs_catchup_cpu_ok)
            printf("catch-up CPU per change: servers (router + nodes) %.2f us, consumer %.2f us\n",
                   cs_cpu_us(r->cs_catchup_cpu_s, r->cs_backlog_received),
                   cs_cpu_us(r->cs_catchup_client_cpu_s, r->cs_backlog_received));
        if (r->cs_off_calls)
            printf("writes: streams on %.1f ops/s, off %.1f ops/s: on / off = %.3f\n", ops_s(r),
                   r->cs_off_ops_s, r->cs_off_ops_s > 0 ? ops_s(r) / r->cs_off_ops_s : 0);
        if (r->cs_off_calls && r->cs_cpu_ok && r->calls)
            printf("server CPU per write (router + nodes): streams on %.1f us, off %.1f us: "
                   "on / off = %.3f\n",
                   cs_cpu_us(r->cs_on_cpu_s, r->calls), cs_cpu_us(r->cs_off_cpu_s, r->cs_off_calls),
                   cs_cpu_ratio(r));
        if (r->cs_off_calls && r->calls)
            printf("bench CPU per write (writers, + consumer when on): streams on %.1f us, off "
                   "%.1f us\n",
                   cs_cpu_us(r->cs_on_client_cpu_s, r->calls),
                   cs_cpu_us(r->cs_off_client_cpu_s, r->cs_off_calls));
        if (r->cs_node_rss_peak_kb)
            printf("node RSS: peak %.1f MiB (%s, sampled every 200 ms) of a %d MiB budget\n",
                   (double)r->cs_node_rss_peak_kb / 1024.0, r->cs_node_rss_name,
                   BENCH_CS_NODE_BUDGET_MIB);
    }
}

static void kv_cs(const bench_result *r) {
    const char *l = r->label;
    printf(" changes.%s.cs.samples=%llu changes.%s.cs.p50_ms=%.3f changes.%s.cs.p99_ms=%.3f "
           "changes.%s.cs.max_ms=%.3f changes.%s.cs.lost=%llu",
           l, (unsigned long long)r->cs_lat.total, l,
           (double)ops_hist_percentile(&r->cs_lat, 50) / 1e6, l,
           (double)ops_hist_percentile(&r->cs_lat, 99) / 1e6, l, (double)r->cs_lat.max / 1e6, l,
           (unsigned long long)r->cs_lost);
    printf(" changes.%s.cs.backlog=%llu changes.%s.cs.backlog_received=%llu "
           "changes.%s.cs.catchup_s=%.3f changes.%s.cs.catchup_per_s=%.1f",
           l, (unsigned long long)r->cs_backlog, l, (unsigned long long)r->cs_backlog_received, l,
           r->cs_catchup_s, l,
           r->cs_catchup_s > 0 ? (double)r->cs_backlog_received / r->cs_catchup_s : 0);
    if (r->cs_off_calls)
        printf(" changes.%s.cs.off_ops_s=%.1f changes.%s.cs.write_cost_ratio=%.3f", l,
               r->cs_off_ops_s, l, r->cs_off_ops_s > 0 ? ops_s(r) / r->cs_off_ops_s : 0);
    if (r->cs_backlog && r->cs_backlog_received && r->cs_catchup_cpu_ok)
        printf(" changes.%s.cs.catchup_cpu_us_per_change=%.2f "
               "changes.%s.cs.catchup_client_cpu_us_per_change=%.2f",
               l, cs_cpu_us(r->cs_catchup_cpu_s, r->cs_backlog_received), l,
               cs_cpu_us(r->cs_catchup_client_cpu_s, r->cs_backlog_received));
    if (r->cs_off_calls && r->cs_cpu_ok && r->calls)
        printf(" changes.%s.cs.on_cpu_us_per_write=%.2f changes.%s.cs.off_cpu_us_per_write=%.2f "
               "changes.%s.cs.cpu_cost_ratio=%.3f",
               l, cs_cpu_us(r->cs_on_cpu_s, r->calls), l,
               cs_cpu_us(r->cs_off_cpu_s, r->cs_off_calls), l, cs_cpu_ratio(r));
    if (r->cs_off_calls && r->calls)
        printf(" changes.%s.cs.on_client_cpu_us_per_write=%.2f "
               "changes.%s.cs.off_client_cpu_us_per_write=%.2f",
               l, cs_cpu_us(r->cs_on_client_cpu_s, r->calls), l,
               cs_cpu_us(r->cs_off_client_cpu_s, r->cs_off_calls));
    if (r->cs_node_rss_peak_kb)
        printf(" changes.%s.cs.node_rss_peak_mb=%.1f changes.%s.cs.node_budget_mb=%d", l,
               (double)r->cs_node_rss_peak_kb / 1024.0, l, BENCH_CS_NODE_BUDGET_MIB);
}

static void kv_result(const bench_result *r, const bench_target *t) {
    const char *w = bench_wl_name(r->wl), *l = r->label;
    printf(" %s.%s.calls=%llu %s.%s.rows=%llu %s.%s.elapsed_s=%.3f", w, l,
           (unsigned long long)r->calls, w, l, (unsigned long long)r->rows, w, l, r->elapsed_s);
    printf(" %s.%s.ops_s=%.1f %s.%s.rows_s=%.1f %s.%s.mb_s=%.3f", w, l, ops_s(r), w, l, rows_s(r),
           w, l, mb_s(r));
    printf(" %s.%s.p50_us=%.1f %s.%s.p90_us=%.1f %s.%s.p99_us=%.1f %s.%s.p999_us=%.1f "
           "%s.%s.max_us=%.1f %s.%s.mean_us=%.1f",
           w, l, pct_us(r, 50), w, l, pct_us(r, 90), w, l, pct_us(r, 99), w, l, pct_us(r, 99.9), w,
           l, (double)r->hist.max / 1e3, w, l, ops_hist_mean(&r->hist) / 1e3);
    printf(" %s.%s.errors=%llu", w, l, (unsigned long long)r->errors_total);
    if (r->storm_ok || r->storm_failed)
        printf(" %s.%s.storm.conns=%llu %s.%s.storm.failed=%llu %s.%s.storm.s=%.3f "
               "%s.%s.storm.p99_before_us=%.1f %s.%s.storm.p99_during_us=%.1f",
               w, l, (unsigned long long)r->storm_ok, w, l, (unsigned long long)r->storm_failed, w,
               l, r->storm_s, w, l, (double)ops_hist_percentile(&r->storm_before, 99) / 1e3, w, l,
               (double)ops_hist_percentile(&r->storm_during, 99) / 1e3);
    for (int i = 0; i < BENCH_ERR_SLOTS; i++)
        if (r->errors[i])
            printf(" %s.%s.err.%s=%llu", w, l,
                   i == BENCH_ERR_VERIFY ? "VERIFY" : st_code_name((st_code)i),
                   (unsigned long long)r->errors[i]);
    if (r->proc_ok)
        printf(" %s.%s.cpu_s=%.3f %s.%s.cpu_us_per_op=%.2f %s.%s.rss_peak_mb=%.1f", w, l, r->cpu_s,
               w, l, cpu_us_per_op(r), w, l, (double)r->rss_peak_kb / 1024.0);
    printf(" %s.%s.client_cpu_s=%.3f", w, l, r->client_cpu_s);
    for (size_t p = 0; r->proc_ok && p < r->n_procs; p++) {
        char buf[32];
        const char *n = proc_name(t, p, buf, sizeof(buf));
        printf(" %s.%s.proc.%s.cpu_s=%.3f %s.%s.proc.%s.rss_mb=%.1f %s.%s.proc.%s.rss_peak_mb=%.1f",
               w, l, n, r->proc_cpu_s[p], w, l, n, (double)r->proc_rss_kb[p] / 1024.0, w, l, n,
               (double)r->proc_rss_peak_kb[p] / 1024.0);
    }
    if (r->wl == WL_CHANGES)
        kv_cs(r);
    if (t->lag_profile[0] && bench_wl_writes(r->wl))
        printf(" %s.%s.lag.samples=%llu %s.%s.lag.p50_ms=%.3f %s.%s.lag.p99_ms=%.3f "
               "%s.%s.lag.max_ms=%.3f %s.%s.lag.lost=%llu",
               w, l, (unsigned long long)r->lag.total, w, l,
               (double)ops_hist_percentile(&r->lag, 50) / 1e6, w, l,
               (double)ops_hist_percentile(&r->lag, 99) / 1e6, w, l, (double)r->lag.max / 1e6, w, l,
               (unsigned long long)r->lag_lost);
}

static void kv_ratio(const bench_result *a, const bench_result *b, const char *what) {
    const char *w = bench_wl_name(a->wl);
    double va[10], vb[10];
    result_figures(a, va);
    result_figures(b, vb);
    static const char *const names[10] = {"ops_s",         "mb_s",       "p50_us", "p90_us",
                                          "p99_us",        "p999_us",    "max_us", NULL,
                                          "cpu_us_per_op", "rss_peak_mb"};
    for (int i = 0; i < 10; i++)
        if (names[i] && va[i] > 0 && vb[i] > 0)
            printf(" %s.%s.%s=%.3f", w, what, names[i], va[i] / vb[i]);
}

static void print_kv(const bench_opts *o, const bench_env *env, const bench_result *res,
                     size_t n_rows, uint64_t errors, bool complete) {
    const bench_cfg *c = &o->cfg;
    printf("strata-bench result=%s errors=%llu target=%s:%u", complete && !errors ? "ok" : "fail",
           (unsigned long long)errors, env->targets[0].host, env->targets[0].port);
    if (o->compare)
        printf(" compare=emulator");
    if (o->up_clusters)
        printf(" up_clusters=%u up_nodes=%u", o->up_clusters, o->up_nodes);
    if (o->direct)
        printf(" direct=1");
    if (env->targets[0].lag_profile[0])
        printf(" lag_cluster=%s", o->lag_cluster);
    printf(" workloads=");
    for (size_t i = 0; i < c->n_wl; i++)
        printf("%s%s", i ? "," : "", bench_wl_name(c->wl[i]));
    static const char *const dists[] = {"uniform", "zipfian", "sequential"};
    printf(" dist=%s conns=%u streams=%u value_size=%u keys=%llu preload=%llu", dists[c->dist],
           c->conns, c->streams, c->value_bytes, (unsigned long long)c->keys,
           (unsigned long long)c->preload);
    if (o->rounds > 1)
        printf(" rounds=%u", o->rounds);
    if (c->requests)
        printf(" requests=%llu", (unsigned long long)c->requests);
    else
        printf(" duration_s=%.1f", c->duration_s);
    size_t nt = env->n_targets, emu = target_index(env, "emulator"),
           node = target_index(env, "node");
    for (size_t w = 0; w < n_rows; w++) {
        for (size_t t = 0; t < nt; t++)
            if (!result_empty(&res[w * nt + t]))
                kv_result(&res[w * nt + t], &env->targets[t]);
        if (emu != SIZE_MAX && !result_empty(&res[w * nt + emu]))
            kv_ratio(&res[w * nt], &res[w * nt + emu], "ratio");
        if (node != SIZE_MAX && !result_empty(&res[w * nt + node]))
            kv_ratio(&res[w * nt], &res[w * nt + node], "router_overhead");
    }
    printf("\n");
    fflush(stdout);
}

/* ---- the run ---- */

static void on_signal(int sig) {
    (void)sig;
    bench_request_stop();
}

/* Adds one slice's figures to the workload's total (--rounds). Peaks and RSS are the latest
 * sample (VmHWM only grows). */
static void result_merge(bench_result *dst, const bench_result *src) {
    dst->calls += src->calls;
    dst->rows += src->rows;
    dst->bytes += src->bytes;
    for (int i = 0; i < BENCH_ERR_SLOTS; i++)
        dst->errors[i] += src->errors[i];
    dst->errors_total += src->errors_total;
    if (!dst->first_error[0])
        memcpy(dst->first_error, src->first_error, sizeof(dst->first_error));
    ops_hist_merge(&dst->hist, &src->hist);
    dst->elapsed_s += src->elapsed_s;
    dst->proc_ok = dst->proc_ok && src->proc_ok;
    dst->cpu_s += src->cpu_s;
    dst->rss_peak_kb = src->rss_peak_kb;
    dst->client_cpu_s += src->client_cpu_s;
    for (size_t i = 0; i < src->n_procs; i++) {
        dst->proc_cpu_s[i] += src->proc_cpu_s[i];
        dst->proc_rss_peak_kb[i] = src->proc_rss_peak_kb[i];
        dst->proc_rss_kb[i] = src->proc_rss_kb[i];
    }
    ops_hist_merge(&dst->lag, &src->lag);
    dst->lag_lost += src->lag_lost;
    if (!dst->lag_error[0])
        memcpy(dst->lag_error, src->lag_error, sizeof(dst->lag_error));
}

/* Whether a target skips this workload. The --direct node serves the very tablets the router
 * reaches, so the router's preload already put the rows there: loading them again straight to
 * the node would only add a second version of every cell (same timestamp, a newer sequence
 * number) that each later scan and read must merge and drop, slowing both targets. */
static bool target_skips(const bench_target *t, bench_wl wl) {
    return wl == WL_LOAD && !strcmp(t->label, "node");
}

/* One workload on every target: `--rounds` slices of duration/rounds (or requests/rounds),
 * the targets alternating slice by slice; the preload is one slice. res[t] gets the totals. */
static st_code run_rounds(bench_opts *o, bench_env *env, bench_wl wl, bench_result *res,
                          st_err *err) {
    if (wl == WL_CHANGES) /* Strata only: the emulator has no change streams */
        return bench_cs_run(&o->cfg, o->rounds, &env->targets[0], &res[0], err);
    bench_cfg c = o->cfg;
    uint32_t rounds = wl == WL_LOAD ? 1 : o->rounds;
    c.duration_s /= rounds;
    if (c.requests)
        c.requests = c.requests / rounds ? c.requests / rounds : 1;
    bench_result *slice = rounds > 1 ? malloc(sizeof(*slice)) : NULL;
    if (rounds > 1 && !slice)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    st_code rc = ST_OK;
    for (uint32_t k = 0; k < rounds && rc == ST_OK && !bench_stop_requested(); k++)
        for (size_t t = 0; t < env->n_targets && rc == ST_OK; t++) {
            if (target_skips(&env->targets[t], wl))
                continue;
            bench_result *dst = k == 0 ? &res[t] : slice;
            rc = bench_run_workload(&c, &env->targets[t], wl, dst, err);
            if (rc == ST_OK && k > 0)
                result_merge(&res[t], slice);
        }
    free(slice);
    return rc;
}

/* Table and preload on every target; then each workload against each target in turn. Returns
 * the rows of results filled (load first when there was a preload). */
static size_t run_all(bench_opts *o, bench_env *env, bench_result *res, bool *complete,
                      st_err *err) {
    bench_cfg *c = &o->cfg;
    size_t nt = env->n_targets, rows = 0;
    *complete = false;
    for (size_t t = 0; t < nt; t++)
        if (bench_table_ensure(c, &env->targets[t], err) != ST_OK)
            return 0;
    bench_wl order[BENCH_WORKLOADS_MAX + 1];
    size_t n = 0;
    if (c->preload)
        order[n++] = WL_LOAD;
    for (size_t i = 0; i < c->n_wl; i++)
        order[n++] = c->wl[i];
    for (size_t w = 0; w < n && !bench_stop_requested(); w++) {
        if (run_rounds(o, env, order[w], &res[w * nt], err) != ST_OK)
            return rows;
        for (size_t t = 0; t < nt; t++)
            if (!result_empty(&res[w * nt + t]))
                print_run(&res[w * nt + t]);
        rows++;
    }
    *complete = !bench_stop_requested();
    return rows;
}

static int bench_main_run(bench_opts *o, bench_env *env) {
    st_err err = {0};
    bench_result *res = calloc((BENCH_WORKLOADS_MAX + 1) * BENCH_TARGETS_MAX, sizeof(*res));
    if (!res) {
        fprintf(stderr, "strata bench: out of memory\n");
        return 1;
    }
    bool complete = false;
    size_t rows = 0;
    if (targets_prepare(o, env, &err) == ST_OK) {
        if (env->targets[0].n_pids == 0)
            fprintf(stderr,
                    "bench: no local process found listening on %s:%u; server CPU and "
                    "memory will not be reported (pass --pid PID)\n",
                    env->targets[0].host, env->targets[0].port);
        rows = run_all(o, env, res, &complete, &err);
    }
    int status = 0;
    if (err.code != ST_OK) {
        fprintf(stderr, "strata bench: %s\n", err.msg);
        status = 1;
    }
    uint64_t errors = 0;
    for (size_t i = 0; i < rows * env->n_targets; i++)
        errors += res[i].errors_total;
    if (rows > 0) {
        print_table(env, res, rows);
        print_procs(env, res, rows);
        print_lag(env, res, rows);
        print_storm(res, rows * env->n_targets);
        print_cs(env, res, rows);
        print_kv(o, env, res, rows, errors, complete && status == 0);
    }
    if (errors || !complete)
        status = 1;
    free(res);
    return status;
}

int ops_bench_main(int argc, char **argv) {
    bench_opts o;
    opts_default(&o);
    int rc = parse_args(argc, argv, &o);
    if (rc == -1) {
        usage(stdout);
        return 0;
    }
    if (rc != 0 || !opts_check(&o))
        return 2;
    st_log_set_level(ST_LOG_WARN); /* failed calls are counted; no line per reconnection */
    o.cfg.timestamp_us = st_wall_us() / 1000 * 1000; /* millisecond granularity, as Bigtable */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND; /* a second Ctrl-C kills at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    bench_env env;
    memset(&env, 0, sizeof(env));
    const char *tmpdir = getenv("TMPDIR");
    snprintf(env.tmp, sizeof(env.tmp), "%s/strata-bench.XXXXXX",
             tmpdir && *tmpdir ? tmpdir : "/tmp");
    bool tmp = o.node || o.compare || o.up_clusters;
    if (tmp && !mkdtemp(env.tmp)) {
        fprintf(stderr, "strata bench: cannot create a temporary dir %s\n", env.tmp);
        return 1;
    }
    int status = bench_main_run(&o, &env);
    ops_child_stop(&env.emulator);
    ops_child_stop(&env.node);
    bench_inst_down(&env.inst, !o.keep_tmp);
    if (env.tls)
        SSL_CTX_free(env.tls);
    if (tmp) {
        if (o.keep_tmp)
            fprintf(stderr, "bench: kept %s\n", env.tmp);
        else
            ops_remove_tree(env.tmp);
    }
    return status;
}
