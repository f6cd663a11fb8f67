/* ops/restart.c — starting the stopped processes of a running local instance: `strata up` on a
 * partly running instance (every node or router of DIR/topology without a live pid is started,
 * the others are left alone) and `strata restart NAME` (one process, stopped first if it runs).
 * Each start uses the command line `strata up` uses (ops_inst_node_cmdline / router_cmdline:
 * same address, data, numbers, metrics port, Unix socket), nodes before routers, and a recorded
 * partition (DIR/run/partition) is applied again to a restarted node. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "instance.h"

#define RESTART_WAIT_S_DEFAULT 60 /* per process, as `strata up` */
#define RESTART_STOP_GRACE_S 30   /* as `strata down`: a node flushes before it exits */
#define RESTART_LOG_TAIL_LINES 20
#define RESTART_METRICS_ATTEMPTS 3 /* a metrics port taken between our check and the bind */

/* One process of the topology: node ni of cluster ci, or router ri. */
typedef struct rs_proc {
    char name[OPS_NAME_MAX];
    bool is_router;
    size_t ci, ni, ri;
    pid_t pid;       /* started by us; 0 before */
    long log_offset; /* where this start's output begins in its log */
} rs_proc;

typedef struct rs_ctx {
    const char *dir_flag, *bin_dir, *who;
    int wait_s;
    int metrics; /* ops_inst_start_missing's: 0 as recorded, 1 --metrics, -1 --no-metrics */
    char dir[OPS_PATH_MAX];
    char node_bin[OPS_PATH_MAX], router_bin[OPS_PATH_MAX];
    st_topology topo;
    ops_partition part;
    rs_proc procs[OPS_PROCS_MAX];
    size_t n_procs;
} rs_ctx;

static bool rs_load(rs_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    st_code rc = st_topology_load(path, &c->topo, &err);
    if (rc == ST_NOT_FOUND)
        fprintf(stderr, "%s: no instance in %s (no topology file): start one with `strata up`\n",
                c->who, c->dir);
    else if (rc != ST_OK)
        fprintf(stderr, "%s: %s\n", c->who, err.msg);
    if (rc == ST_OK && !ops_inst_partition_read(c->dir, &c->part)) {
        fprintf(stderr, "%s: %s/run/partition is unreadable: `strata chaos heal` resets it\n",
                c->who, c->dir);
        return false;
    }
    return rc == ST_OK;
}

/* Every process of the topology, nodes first (routers need them to start). */
static size_t rs_all(const rs_ctx *c, rs_proc *out) {
    size_t n = 0;
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
            out[n] = (rs_proc){.ci = i, .ni = j};
            ops_inst_node_name(&c->topo, i, j, out[n++].name);
        }
    for (size_t r = 0; r < c->topo.n_routers; r++) {
        out[n] = (rs_proc){.is_router = true, .ri = r};
        ops_inst_router_name(r, out[n++].name);
    }
    return n;
}

static const char *rs_addr(const rs_ctx *c, const rs_proc *p) {
    return p->is_router ? c->topo.routers[p->ri] : c->topo.clusters[p->ci].nodes[p->ni].addr;
}

static bool rs_find_bins(rs_ctx *c) {
    bool nodes = false, routers = false;
    for (size_t k = 0; k < c->n_procs; k++) {
        routers |= c->procs[k].is_router;
        nodes |= !c->procs[k].is_router;
    }
    const char *where = c->bin_dir ? c->bin_dir : "next to strata's build tree or on $PATH";
    if (nodes && !ops_bin_find(c->bin_dir, "node", "strata-node", c->node_bin, sizeof c->node_bin))
        fprintf(stderr, "%s: strata-node not found (%s): pass --bin-dir DIR\n", c->who, where);
    else if (routers && !ops_bin_find(c->bin_dir, "router", "strata-router", c->router_bin,
                                      sizeof c->router_bin))
        fprintf(stderr, "%s: strata-router not found (%s): pass --bin-dir DIR\n", c->who, where);
    else
        return true;
    return false;
}

void ops_inst_metrics_read(const char *dir, const char *name, char *addr, size_t cap) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    addr[0] = '\0';
    int w = snprintf(path, sizeof path, "%s/run/%s.metrics", dir, name);
    if (w < 0 || (size_t)w >= sizeof path)
        return;
    FILE *f = fopen(path, "r");
    if (f && !fgets(addr, (int)cap, f))
        addr[0] = '\0';
    if (f)
        fclose(f);
    addr[strcspn(addr, "\r\n")] = '\0';
}

bool ops_inst_metrics_port(const char *dir, const st_topology *t, const char *name, const char *who,
                           int metrics, bool force) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16], addr[ST_TOPO_ADDR_MAX + 1], old[sizeof addr];
    snprintf(path, sizeof path, "%s/run/%s.metrics", dir, name);
    if (metrics < 0) {
        if (unlink(path) == 0)
            printf("  %-12s metrics off (--no-metrics)\n", name);
        return true;
    }
    ops_inst_metrics_read(dir, name, addr, sizeof addr);
    if (!addr[0] && metrics == 0)
        return true;
    if (addr[0] && !force && ops_inst_port_free(addr) && !ops_inst_addr_used(t, addr, NULL))
        return true;
    snprintf(old, sizeof old, "%s", addr);
    FILE *f = NULL;
    if (!ops_inst_pick_port(t, addr, sizeof addr) || !(f = ops_fopen_private(path))) {
        fprintf(stderr, "%s: cannot set up %s's metrics port (%s): %s\n", who, name, path,
                strerror(errno));
        return false;
    }
    fprintf(f, "%s\n", addr);
    if (fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
        return false;
    }
    if (old[0])
        printf("  %-12s metrics address changed: %s is taken by another program; now "
               "http://%s/metrics (recorded in %s: point scrapers there)\n",
               name, old, addr, path);
    fflush(stdout);
    return true;
}

static bool rs_spawn(rs_ctx *c, rs_proc *p, bool new_metrics_port) {
    if (!ops_inst_metrics_port(c->dir, &c->topo, p->name, c->who, c->metrics, new_metrics_port))
        return false;
    ops_cmdline cl;
    if (p->is_router)
        ops_inst_router_cmdline(&cl, c->dir, c->router_bin, &c->topo, p->ri);
    else
        ops_inst_node_cmdline(&cl, c->dir, c->node_bin, &c->topo, p->ci, p->ni);
    p->pid = ops_inst_spawn(c->dir, p->name, cl.argv, c->who, &p->log_offset);
    return p->pid > 0;
}

/* True if this start's log says its metrics port was taken (another program bound it after our
 * check): it is then started again on another. */
static bool rs_log_says_metrics_in_use(const rs_ctx *c, const rs_proc *p) {
    return ops_inst_log_says(c->dir, p->name, p->log_offset, "cannot serve metrics", "in use");
}

/* Waits for p to listen; says why not, with the end of its log. A node gets the partition. A
 * process that exits because its metrics port was taken is started again on another. */
static bool rs_await(rs_ctx *c, rs_proc *p) {
    int status = 0;
    ops_wait w;
    for (int attempt = 1;; attempt++) {
        w = ops_inst_wait_ready(c->dir, p->name, p->pid, rs_addr(c, p), c->wait_s, &status);
        if (w != OPS_EXITED || attempt >= RESTART_METRICS_ATTEMPTS ||
            !rs_log_says_metrics_in_use(c, p))
            break;
        ops_inst_pid_remove_if(c->dir, p->name, p->pid);
        if (!rs_spawn(c, p, true))
            return false;
    }
    if (w == OPS_READY) {
        char addr[ST_TOPO_ADDR_MAX + 1];
        ops_inst_metrics_read(c->dir, p->name, addr, sizeof addr);
        printf("  %-12s %-22s ready (pid %d)", p->name, rs_addr(c, p), (int)p->pid);
        if (addr[0])
            printf("  metrics http://%s/metrics", addr);
        printf("\n");
        fflush(stdout);
        if (p->is_router || c->part.n == 0)
            return true;
        int r = ops_inst_set_links(&c->topo, &c->part, p->ci, p->ni, false);
        if (r < 0)
            fprintf(stderr,
                    "%s: %s listened, then did not answer SetLinks, so the partition in "
                    "%s/run/partition is not applied to it: see its log, then `strata restart "
                    "%s`\n",
                    c->who, p->name, c->dir, p->name);
        return r == 0;
    }
    if (w == OPS_TIMEOUT)
        fprintf(stderr, "%s: %s (pid %d) did not listen on %s within %ds\n", c->who, p->name,
                (int)p->pid, rs_addr(c, p), c->wait_s);
    else {
        char how[256];
        fprintf(stderr, "%s: %s %s before listening on %s\n", c->who, p->name,
                ops_inst_ended_said(status, how, sizeof how), rs_addr(c, p));
    }
    char log_path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", c->dir, p->name);
    ops_inst_log_tail(log_path, RESTART_LOG_TAIL_LINES);
    if (w == OPS_EXITED)
        ops_inst_pid_remove_if(c->dir, p->name, p->pid);
    return false;
}

/* Starts c->procs: every node at once, each awaited, then the routers one by one. */
static bool rs_start(rs_ctx *c) {
    bool ok = rs_find_bins(c);
    for (size_t k = 0; ok && k < c->n_procs; k++)
        if (!c->procs[k].is_router)
            ok = rs_spawn(c, &c->procs[k], false);
    for (size_t k = 0; k < c->n_procs; k++)
        if (!c->procs[k].is_router && c->procs[k].pid > 0)
            ok &= rs_await(c, &c->procs[k]);
    for (size_t k = 0; ok && k < c->n_procs; k++)
        if (c->procs[k].is_router)
            ok = rs_spawn(c, &c->procs[k], false) && rs_await(c, &c->procs[k]);
    return ok;
}

int ops_inst_start_missing(const char *dir, const char *bin_dir, int wait_s, int metrics,
                           bool routers) {
    rs_ctx *c = calloc(1, sizeof *c); /* the topology is large: not the stack */
    if (!c) {
        fprintf(stderr, "strata up: out of memory\n");
        return 1;
    }
    *c = (rs_ctx){.bin_dir = bin_dir, .who = "strata up", .wait_s = wait_s, .metrics = metrics};
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    int rc = 1;
    if (rs_load(c)) {
        static rs_proc all[OPS_PROCS_MAX]; /* CLI: one call at a time */
        size_t n = rs_all(c, all);
        size_t held = 0;
        for (size_t k = 0; k < n; k++) {
            pid_t pid = ops_inst_pid_read(c->dir, all[k].name);
            if (ops_inst_pid_alive(pid))
                continue;
            if (all[k].is_router && !routers) {
                printf("  %-12s not started: a router loads the instance's metadata from the "
                       "nodes, and not every running node answers (see above); `strata up` "
                       "starts it once they do\n",
                       all[k].name);
                held++;
                continue;
            }
            if (pid && !ops_inst_pid_wait_gone(pid, c->wait_s * 1000))
                fprintf(stderr, "strata up: %s (pid %d) is stopping but still there after %d s\n",
                        all[k].name, (int)pid, c->wait_s);
            if (pid)
                ops_inst_pid_remove_if(c->dir, all[k].name, pid);
            c->procs[c->n_procs++] = all[k];
        }
        if (c->n_procs)
            printf("The instance in %s is partly running: starting its %zu stopped process(es), "
                   "leaving the %zu running ones alone (logs in %s/logs):\n",
                   c->dir, c->n_procs, n - c->n_procs - held, c->dir);
        rc = rs_start(c) ? 0 : 1;
        if (rc)
            fprintf(stderr, "strata up: not every stopped process could be started (see above); "
                            "`strata status` shows the instance, `strata up` tries again.\n");
    }
    free(c);
    return rc;
}

/* ---- strata restart NAME ---- */

static void restart_usage(FILE *out) {
    fprintf(out,
            "usage: strata restart NAME [--dir DIR] [--bin-dir DIR] [--wait-s S]\n"
            "Stops process NAME of the local instance in DIR if it runs (SIGTERM, then SIGKILL\n"
            "after %ds) and starts it again with the command line `strata up` uses. NAME is a\n"
            "node (east-0, west-1, ...: `strata status` lists them) or a router (router,\n"
            "router-1, ...). A node gets a recorded `strata chaos partition` again.\n"
            "  --wait-s S   how long to wait for it to listen (default %d)\n",
            RESTART_STOP_GRACE_S, RESTART_WAIT_S_DEFAULT);
}

/* SIGTERM, up to RESTART_STOP_GRACE_S for it to go, then SIGKILL. False if it stays. */
static bool rs_stop(const rs_ctx *c, const char *name, pid_t pid) {
    printf("  %-12s stopping (pid %d)\n", name, (int)pid);
    if (ops_inst_term(pid) != 0 && errno != ESRCH) {
        fprintf(stderr, "%s: cannot signal %s (pid %d): %s\n", c->who, name, (int)pid,
                strerror(errno));
        return false;
    }
    struct timespec nap = {0, OPS_POLL_MS * 1000000L};
    for (long ms = 0; ops_inst_pid_alive(pid); ms += OPS_POLL_MS) {
        if (ms == RESTART_STOP_GRACE_S * 1000L)
            kill(pid, SIGKILL);
        if (ms > (RESTART_STOP_GRACE_S + 10) * 1000L) {
            fprintf(stderr, "%s: %s (pid %d) is still there after SIGKILL\n", c->who, name,
                    (int)pid);
            return false;
        }
        nanosleep(&nap, NULL);
    }
    if (!ops_inst_pid_wait_gone(pid, 10000)) {
        fprintf(stderr, "%s: %s (pid %d) is stopping but still there after 10 s\n", c->who, name,
                (int)pid);
        return false;
    }
    ops_inst_pid_remove_if(c->dir, name, pid);
    return true;
}

static int restart_parse(int argc, char **argv, rs_ctx *c, const char **name) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t s;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            restart_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dir") && v) {
            c->dir_flag = argv[++i];
        } else if (!strcmp(a, "--bin-dir") && v) {
            c->bin_dir = argv[++i];
        } else if (!strcmp(a, "--wait-s") && v) {
            if (!st_parse_u64(argv[++i], 1, 3600, &s)) {
                fprintf(stderr, "strata restart: --wait-s takes 1 to 3600 seconds, got '%s'\n", v);
                return 2;
            }
            c->wait_s = (int)s;
        } else if (a[0] != '-' && !*name) {
            *name = a;
        } else {
            fprintf(stderr, "strata restart: unknown flag or missing value: '%s'\n", a);
            restart_usage(stderr);
            return 2;
        }
    }
    if (!*name) {
        fprintf(stderr, "strata restart: name the process to restart (east-0, router, ...)\n");
        restart_usage(stderr);
        return 2;
    }
    return -1;
}

static int restart_run(rs_ctx *c, const char *name) {
    if (!rs_load(c))
        return 1;
    static rs_proc all[OPS_PROCS_MAX]; /* CLI: one call at a time */
    size_t n = rs_all(c, all);
    for (size_t k = 0; k < n && !c->n_procs; k++)
        if (!strcmp(all[k].name, name))
            c->procs[c->n_procs++] = all[k];
    if (!c->n_procs) {
        fprintf(stderr, "strata restart: %s has no process named '%s'; it has:", c->dir, name);
        for (size_t k = 0; k < n; k++)
            fprintf(stderr, " %s", all[k].name);
        fprintf(stderr, "\n");
        return 2;
    }
    /* A router reads the instance's metadata from the nodes at start: with none running it
     * waited 15 s and exited. Said at once. */
    bool node_runs = false;
    for (size_t k = 0; k < n && !node_runs; k++)
        node_runs = !all[k].is_router && ops_inst_pid_alive(ops_inst_pid_read(c->dir, all[k].name));
    if (c->procs[0].is_router && !node_runs) {
        fprintf(stderr,
                "strata restart: the nodes of the instance in %s are stopped, and %s needs them "
                "to start: `strata up --dir %s` starts the whole instance\n",
                c->dir, name, c->dir);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    st_log_set_level(ST_LOG_ERROR);
    printf("Restarting %s of the instance in %s (log %s/logs/%s.log):\n", name, c->dir, c->dir,
           name);
    pid_t old = ops_inst_pid_read(c->dir, name);
    if (ops_inst_pid_alive(old) && !rs_stop(c, name, old))
        return 1;
    if (!ops_inst_pid_alive(old) && old)
        ops_inst_pid_remove_if(c->dir, name, old);
    if (!rs_start(c))
        return 1;
    printf("Restarted %s.\n", name);
    return 0;
}

/* Under the instance lock, from reading the old pid to writing the new one: two restarts at once
 * would each stop the other's start, and the loser would remove the pid file of the process left
 * running (which `strata down` then could not find). The second waits, then restarts again. */
static int restart_run_locked(rs_ctx *c, const char *name) {
    int fd = ops_inst_lock(c->dir, c->who, false);
    if (fd < 0)
        return 1;
    int rc = restart_run(c, name);
    close(fd);
    return rc;
}

int ops_restart_main(int argc, char **argv) {
    rs_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "strata restart: out of memory\n");
        return 1;
    }
    c->who = "strata restart";
    c->wait_s = RESTART_WAIT_S_DEFAULT;
    const char *name = NULL;
    int rc = restart_parse(argc, argv, c, &name);
    if (rc < 0)
        rc = ops_inst_dir(c->dir_flag, c->dir, sizeof c->dir) ? restart_run_locked(c, name) : 2;
    free(c);
    return rc;
}
