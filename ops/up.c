/* ops/up.c — `strata up`: starts a whole local instance from one command with no configuration
 * (two clusters "east" and "west" of three nodes each, one router on 127.0.0.1:8086), or the shape
 * given by flags or a topology file. It writes DIR/topology, starts every strata-node and the
 * strata-router as daemons (own session, output to DIR/logs, pids in DIR/run), waits until each
 * accepts connections, and prints the endpoint. If anything fails it stops what it started and
 * shows the failing process's log. Running it again on a running instance changes nothing: it
 * starts only what is stopped, and waits for running processes that do not answer yet (a node
 * still replaying its log) as for those it starts. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "certs.h"
#include "instance.h"
#include "paths.h"

#define UP_CLUSTERS_DEFAULT 2
#define UP_NODES_DEFAULT 3
#define UP_WAIT_S_DEFAULT 60   /* per process: a node replaying a long log needs a while */
#define UP_BIND_ATTEMPTS_MAX 4 /* a port we picked may be taken before the node binds it */
#define UP_STOP_GRACE_MS 5000
#define UP_LOG_TAIL_LINES 20

typedef struct up_opts {
    const char *dir_flag, *config, *bin_dir;
    int port, clusters, nodes, wait_s;
    long long split_bytes; /* 0: not given (the topology's value stays) */
    bool shape_given, no_router, port_given;
    bool metrics;    /* --metrics: every process serves /metrics on a free port (docs/metrics.md) */
    bool no_metrics; /* --no-metrics: turns off the metrics an earlier --metrics recorded */
    bool no_unix;    /* --no-unix: nodes serve TCP only, so the router reaches them over TCP */
    bool secure;     /* --secure: mutual TLS, certificates and principals in DIR/secure */
} up_opts;

/* One process we start: a node (cluster ci, node ni) or a router (ri). */
typedef struct up_proc {
    char name[OPS_NAME_MAX];
    bool is_router, picked_port; /* picked_port: we chose the port, so we may choose another */
    size_t ci, ni, ri;
    pid_t pid;
    long log_offset; /* where this attempt's output starts in its log */
} up_proc;

typedef struct up_ctx {
    up_opts o;
    char dir[OPS_PATH_MAX];
    char node_bin[OPS_PATH_MAX], router_bin[OPS_PATH_MAX];
    st_topology topo;
    up_proc procs[OPS_PROCS_MAX];
    size_t n_procs;
    bool made_dir; /* DIR did not exist before this run */
} up_ctx;

static void up_usage(FILE *out) {
    fprintf(out,
            "usage: strata up [--dir DIR] [--port PORT] [--clusters N] [--nodes M]\n"
            "                 [--split-bytes N] [--config FILE] [--bin-dir DIR] [--wait-s S]\n"
            "                 [--no-router] [--metrics | --no-metrics] [--no-unix] [--secure]\n"
            "Starts a local Strata instance in the background: N clusters (default 2: east, west,\n"
            "then zone-3, ...) of M strata-node processes each (default 3) and one strata-router\n"
            "on 127.0.0.1:PORT (default 8086, the emulator's port).\n"
            "  --dir DIR        instance directory: topology, data, logs, pid files\n"
            "                   (default $STRATA_HOME, else ~/.strata/local)\n"
            "  --config FILE    start the topology in FILE instead (docs/formats/topology.md)\n"
            "  --split-bytes N  tablet split threshold of every node, kept in the topology\n"
            "                   (default 256 MiB)\n"
            "  --bin-dir DIR    where strata-node and strata-router are (default: next to this\n"
            "                   binary's build tree, then $PATH)\n"
            "  --wait-s S       how long to wait for each process to listen, also for one\n"
            "                   found running but not answering yet (default %d)\n"
            "  --no-router      start only the nodes (debugging)\n"
            "  --metrics        every process serves Prometheus metrics on a free loopback port,\n"
            "                   shown below and kept in DIR/run/<name>.metrics (docs/metrics.md);\n"
            "                   later starts keep them (and their ports, when free)\n"
            "  --no-metrics     start without the metrics an earlier --metrics recorded\n"
            "  --no-unix        TCP between the router and the nodes; by default each node also\n"
            "                   serves a Unix socket DATA/node.sock, which the router uses\n"
            "                   (faster on one host; docs/router.md, Unix sockets)\n"
            "  --secure         TLS for clients, mutual TLS between router and nodes, and\n"
            "                   bearer tokens: creates a CA, certificates and principals in\n"
            "                   DIR/secure (ca.pem for clients, tokens: ROLE TOKEN lines) and\n"
            "                   prints the cbt command line to use (docs/security.md). An\n"
            "                   instance made with --secure stays secure on every start\n"
            "Run again on a running instance: starts whatever of it is stopped (router\n"
            "included), waits for running processes still starting, and leaves the rest\n"
            "alone; `strata restart NAME` restarts one process.\n"
            "Stop it with\n"
            "`strata down`, inspect it with `strata status`.\n",
            UP_WAIT_S_DEFAULT);
}

static bool parse_int(const char *flag, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "strata up: %s needs a whole number from %lld to %lld, got '%s'\n", flag,
                lo, hi, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

/* Returns -1 on success, else the exit code (0 for --help, 2 for bad usage). */
static int up_parse(int argc, char **argv, up_opts *o) {
    *o = (up_opts){.port = OPS_ROUTER_PORT_DEFAULT,
                   .clusters = UP_CLUSTERS_DEFAULT,
                   .nodes = UP_NODES_DEFAULT,
                   .wait_s = UP_WAIT_S_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x = 0;
        bool ok = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            up_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-router")) {
            o->no_router = true;
            continue;
        } else if (!strcmp(a, "--metrics")) {
            o->metrics = true;
            continue;
        } else if (!strcmp(a, "--no-metrics")) {
            o->no_metrics = true;
            continue;
        } else if (!strcmp(a, "--no-unix")) {
            o->no_unix = true;
            continue;
        } else if (!strcmp(a, "--secure")) {
            o->secure = true;
            continue;
        } else if (!v) {
            fprintf(stderr, "strata up: unknown flag or missing value: '%s'\n", a);
            up_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--dir"))
            o->dir_flag = v;
        else if (!strcmp(a, "--config"))
            o->config = v;
        else if (!strcmp(a, "--bin-dir"))
            o->bin_dir = v;
        else if (!strcmp(a, "--port")) {
            ok = parse_int(a, v, 1, 65535, &x);
            o->port = (int)x;
            o->port_given = true;
        } else if (!strcmp(a, "--wait-s")) {
            ok = parse_int(a, v, 1, 3600, &x);
            o->wait_s = (int)x;
        } else if (!strcmp(a, "--split-bytes"))
            ok = parse_int(a, v, 1, LLONG_MAX, &o->split_bytes);
        else if (!strcmp(a, "--clusters")) {
            ok = parse_int(a, v, 1, ST_TOPO_CLUSTERS_MAX, &x);
            o->clusters = (int)x;
            o->shape_given = true;
        } else if (!strcmp(a, "--nodes")) {
            ok = parse_int(a, v, 1, ST_TOPO_NODES_MAX, &x);
            o->nodes = (int)x;
            o->shape_given = true;
        } else {
            fprintf(stderr, "strata up: unknown flag '%s'\n", a);
            up_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (o->metrics && o->no_metrics) {
        fprintf(stderr, "strata up: --metrics and --no-metrics contradict each other: give one\n");
        return 2;
    }
    return -1;
}

/* ---- binaries ---- */

static bool up_find_bins(up_ctx *c) {
    const char *where = c->o.bin_dir ? c->o.bin_dir : "next to strata's build tree or on $PATH";
    if (!ops_bin_find(c->o.bin_dir, "node", "strata-node", c->node_bin, sizeof c->node_bin)) {
        fprintf(stderr,
                "strata up: strata-node not found (%s): build it (ninja strata-node) or "
                "pass --bin-dir DIR\n",
                where);
        return false;
    }
    if (!c->o.no_router && !ops_bin_find(c->o.bin_dir, "router", "strata-router", c->router_bin,
                                         sizeof c->router_bin)) {
        fprintf(stderr,
                "strata up: strata-router not found (%s): build it (ninja strata-router) "
                "or pass --bin-dir DIR\n",
                where);
        return false;
    }
    return true;
}

/* ---- ports ---- */

bool ops_inst_addr_used(const st_topology *t, const char *addr, const char *skip) {
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++)
            if (t->clusters[i].nodes[j].addr != skip && !strcmp(t->clusters[i].nodes[j].addr, addr))
                return true;
    for (size_t r = 0; r < t->n_routers; r++)
        if (t->routers[r] != skip && !strcmp(t->routers[r], addr))
            return true;
    return false;
}

/* A free loopback port: bind port 0 and close. Another process may take it before our node binds
 * it; the start loop notices and picks again. */
bool ops_inst_pick_port(const st_topology *t, char *addr, size_t cap) {
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return false;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        bool ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                  getsockname(fd, (struct sockaddr *)&sa, &sl) == 0;
        close(fd);
        if (!ok)
            return false;
        char cand[ST_TOPO_ADDR_MAX + 1];
        snprintf(cand, sizeof cand, "127.0.0.1:%u", ntohs(sa.sin_port));
        if (!ops_inst_addr_used(t, cand, addr)) {
            snprintf(addr, cap, "%s", cand);
            return true;
        }
    }
    return false;
}

/* False only when something already listens there (other errors: let the process report). */
bool ops_inst_port_free(const char *addr) {
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    if (!st_addr_split(addr, host, sizeof host, &port))
        return true;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return true; /* a name or IPv6: the process's own bind error will say */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return true;
    int one = 1; /* as servers do, so a port in TIME_WAIT counts as free */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool busy = bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno == EADDRINUSE;
    close(fd);
    return !busy;
}

/* ---- the topology to start ---- */

static const char *const up_cluster_ids[] = {"east", "west"};

/* The built-in shape: clusters east, west, zone-3...; zones zone-a, zone-b...; nodes on free
 * loopback ports with data in DIR/<cluster>-<i>. */
static bool up_topo_generate(up_ctx *c) {
    st_topology *t = &c->topo;
    memset(t, 0, sizeof *t);
    snprintf(t->project, sizeof t->project, "p");
    snprintf(t->instance, sizeof t->instance, "i");
    t->split_bytes = 256LL << 20;
    for (int i = 0; i < c->o.clusters; i++) {
        st_topo_cluster *cl = &t->clusters[t->n_clusters++];
        if (i < 2)
            snprintf(cl->id, sizeof cl->id, "%s", up_cluster_ids[i]);
        else
            snprintf(cl->id, sizeof cl->id, "zone-%d", i + 1);
        snprintf(cl->zone, sizeof cl->zone, "zone-%c", 'a' + i);
        cl->num = (uint32_t)(i + 1);
        for (int j = 0; j < c->o.nodes; j++) {
            st_topo_node *n = &cl->nodes[cl->n_nodes++];
            n->num = (uint32_t)(i * c->o.nodes + j + 1);
            ops_fmt(n->data_dir, sizeof n->data_dir, "%s/%s-%d", c->dir, cl->id, j);
            if (!ops_inst_pick_port(t, n->addr, sizeof n->addr)) {
                fprintf(stderr, "strata up: cannot find a free loopback port: %s\n",
                        strerror(errno));
                return false;
            }
        }
    }
    return true;
}

/* An instance that ran before in DIR keeps its shape and data; flags asking for another shape are
 * refused rather than silently ignored. */
static bool up_topo_reuse(up_ctx *c) {
    st_topology *t = &c->topo;
    bool same = t->n_clusters == (size_t)c->o.clusters;
    for (size_t i = 0; same && i < t->n_clusters; i++)
        same = t->clusters[i].n_nodes == (size_t)c->o.nodes;
    if (c->o.shape_given && !same) {
        fprintf(stderr,
                "strata up: %s already holds an instance of %zu cluster(s) with another shape; "
                "start it as it is (drop --clusters/--nodes), or remove it first with `strata "
                "down --dir %s --purge`, or use another --dir\n",
                c->dir, t->n_clusters, c->dir);
        return false;
    }
    /* The router keeps its address unless --port moves it: started without --port after `strata
     * down`, it used to move to 8086, away from the clients of the instance. */
    if (c->o.port_given)
        t->n_routers = 0;
    return true;
}

static void up_topo_fill(up_ctx *c) {
    st_topology *t = &c->topo;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            st_topo_node *n = &t->clusters[i].nodes[j];
            char abs[sizeof n->data_dir];
            if (!n->data_dir[0])
                ops_fmt(n->data_dir, sizeof n->data_dir, "%s/%s-%zu", c->dir, t->clusters[i].id, j);
            else if (n->data_dir[0] != '/' && ops_path_absolute(n->data_dir, abs, sizeof abs))
                memcpy(n->data_dir, abs, sizeof abs); /* --config FILE, or an older topology */
        }
    if (c->o.split_bytes)
        t->split_bytes = c->o.split_bytes;
    if (!c->o.no_router && t->n_routers == 0) {
        snprintf(t->routers[0], sizeof t->routers[0], "127.0.0.1:%d", c->o.port);
        t->n_routers = 1;
    }
    if (c->o.no_router)
        t->n_routers = 0;
}

static bool up_topo_build(up_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    st_err err = {0};
    if (c->o.config) {
        if (st_topology_load(c->o.config, &c->topo, &err) != ST_OK) {
            fprintf(stderr, "strata up: %s\n", err.msg);
            return false;
        }
    } else {
        snprintf(path, sizeof path, "%s/topology", c->dir);
        st_code rc = st_topology_load(path, &c->topo, &err);
        if (rc == ST_OK && !up_topo_reuse(c))
            return false;
        if (rc == ST_NOT_FOUND && !up_topo_generate(c))
            return false;
        if (rc != ST_OK && rc != ST_NOT_FOUND) {
            fprintf(stderr,
                    "strata up: %s\nFix or remove that file (`strata down --dir %s "
                    "--purge` removes the whole instance).\n",
                    err.msg, c->dir);
            return false;
        }
    }
    up_topo_fill(c);
    return true;
}

static bool up_topo_save(up_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    if (st_topology_save(path, &c->topo, &err) != ST_OK) {
        fprintf(stderr, "strata up: %s\n", err.msg);
        return false;
    }
    return true;
}

/* ---- processes ---- */

static char *up_proc_addr(up_ctx *c, up_proc *p) {
    return p->is_router ? c->topo.routers[p->ri] : c->topo.clusters[p->ci].nodes[p->ni].addr;
}

static void up_log_path(const up_ctx *c, const up_proc *p, char *out, size_t cap) {
    snprintf(out, cap, "%s/logs/%s.log", c->dir, p->name);
}

/* With --metrics: p's /metrics port, recorded in DIR/run/<name>.metrics (the command line reads
 * it there): the one recorded before when it is still free, so scrapers keep their targets,
 * else a free loopback port. Without: removes the record (--no-metrics). */
static bool up_metrics_record(up_ctx *c, up_proc *p) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16], addr[ST_TOPO_ADDR_MAX + 1] = "";
    snprintf(path, sizeof path, "%s/run/%s.metrics", c->dir, p->name);
    if (!c->o.metrics) {
        unlink(path);
        return true;
    }
    ops_inst_metrics_read(c->dir, p->name, addr, sizeof addr);
    bool keep = addr[0] && ops_inst_port_free(addr) && !ops_inst_addr_used(&c->topo, addr, NULL);
    FILE *f = NULL;
    if ((!keep && !ops_inst_pick_port(&c->topo, addr, sizeof addr)) ||
        !(f = ops_fopen_private(path))) {
        fprintf(stderr, "strata up: cannot set up %s's metrics port (%s): %s\n", p->name, path,
                strerror(errno));
        return false;
    }
    fprintf(f, "%s\n", addr);
    return fclose(f) == 0;
}

/* An instance started with --metrics keeps them on its later starts (as --secure, --split-bytes
 * and its router's port are kept): a plain `strata up` after `strata down` used to drop every
 * process's /metrics, and scrapers found nothing. Recorded in DIR/run/<name>.metrics, which
 * `strata down` leaves; --no-metrics turns them off. */
static void up_metrics_keep(up_ctx *c) {
    static char names[OPS_PROCS_MAX][OPS_NAME_MAX]; /* CLI: one instance of this at a time */
    char run[OPS_PATH_MAX + 8], addr[ST_TOPO_ADDR_MAX + 1];
    if (c->o.metrics || c->o.no_metrics)
        return;
    snprintf(run, sizeof run, "%s/run", c->dir);
    DIR *d = opendir(run);
    struct dirent *e;
    size_t n = 0;
    while (d && n < OPS_PROCS_MAX && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 8 && l - 8 < OPS_NAME_MAX && !strcmp(e->d_name + l - 8, ".metrics")) {
            memcpy(names[n], e->d_name, l - 8);
            names[n++][l - 8] = '\0';
        }
    }
    if (d)
        closedir(d);
    for (size_t i = 0; i < n && !c->o.metrics; i++) {
        ops_inst_metrics_read(c->dir, names[i], addr, sizeof addr);
        c->o.metrics = addr[0] != '\0';
    }
    if (c->o.metrics)
        printf("Metrics stay on (the instance was started with --metrics; --no-metrics turns "
               "them off).\n");
}

/* Starts p with the command line every start of it uses (ops_inst_node_cmdline). */
static bool up_spawn(up_ctx *c, up_proc *p) {
    if (!up_metrics_record(c, p))
        return false;
    ops_cmdline cl;
    if (p->is_router)
        ops_inst_router_cmdline(&cl, c->dir, c->router_bin, &c->topo, p->ri);
    else
        ops_inst_node_cmdline(&cl, c->dir, c->node_bin, &c->topo, p->ci, p->ni);
    p->pid = ops_inst_spawn(c->dir, p->name, cl.argv, "strata up", &p->log_offset);
    return p->pid > 0;
}

static ops_wait up_wait_ready(up_ctx *c, up_proc *p, int *status) {
    return ops_inst_wait_ready(c->dir, p->name, p->pid, up_proc_addr(c, p), c->o.wait_s, status);
}

/* True if this attempt's log says the listen address was taken (we then pick another port). */
static bool up_log_says_in_use(const up_ctx *c, const up_proc *p) {
    return ops_inst_log_says(c->dir, p->name, p->log_offset, "in use", NULL) ||
           ops_inst_log_says(c->dir, p->name, p->log_offset, "EADDRINUSE", NULL);
}

/* Terminates every started process: SIGTERM, a bounded wait, then SIGKILL. */
static void up_stop_all(up_ctx *c) {
    for (size_t i = 0; i < c->n_procs; i++)
        if (c->procs[i].pid > 0)
            ops_inst_term(c->procs[i].pid);
    struct timespec nap = {0, OPS_POLL_MS * 1000000L};
    for (long waited = 0; waited < UP_STOP_GRACE_MS; waited += OPS_POLL_MS) {
        bool any = false;
        for (size_t i = 0; i < c->n_procs; i++) {
            up_proc *p = &c->procs[i];
            if (p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == p->pid) {
                ops_inst_pid_remove_if(c->dir, p->name, p->pid);
                p->pid = 0;
            }
            any |= p->pid > 0;
        }
        if (!any)
            return;
        nanosleep(&nap, NULL);
    }
    for (size_t i = 0; i < c->n_procs; i++)
        if (c->procs[i].pid > 0) {
            kill(c->procs[i].pid, SIGKILL);
            waitpid(c->procs[i].pid, NULL, 0);
            ops_inst_pid_remove_if(c->dir, c->procs[i].name, c->procs[i].pid);
            c->procs[i].pid = 0;
        }
}

static void up_report_failure(up_ctx *c, up_proc *p, ops_wait w, int status) {
    char log_path[OPS_PATH_MAX + OPS_NAME_MAX + 16], how[256];
    up_log_path(c, p, log_path, sizeof log_path);
    if (w == OPS_TIMEOUT)
        fprintf(stderr, "strata up: %s (pid %d) did not listen on %s within %ds\n", p->name,
                (int)p->pid, up_proc_addr(c, p), c->o.wait_s);
    else
        fprintf(stderr, "strata up: %s %s before listening on %s\n", p->name,
                ops_inst_ended_said(status, how, sizeof how), up_proc_addr(c, p));
    ops_inst_log_tail(log_path, UP_LOG_TAIL_LINES);
    if (w == OPS_EXITED) {
        ops_inst_pid_remove_if(c->dir, p->name, p->pid);
        p->pid = 0; /* already reaped */
    }
}

/* "  metrics http://ADDR/metrics" after a ready line, with --metrics. */
static void up_print_metrics(const up_ctx *c, const up_proc *p) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16], addr[ST_TOPO_ADDR_MAX + 2] = "";
    snprintf(path, sizeof path, "%s/run/%s.metrics", c->dir, p->name);
    FILE *f = c->o.metrics ? fopen(path, "r") : NULL;
    if (!f)
        return;
    if (fgets(addr, sizeof addr, f))
        printf("  metrics http://%.*s/metrics", (int)strcspn(addr, "\n"), addr);
    fclose(f);
}

/* Waits for p; when a port we picked turned out taken, picks another and starts p again. */
static bool up_await(up_ctx *c, up_proc *p) {
    for (int attempt = 1;; attempt++) {
        int status = 0;
        ops_wait w = up_wait_ready(c, p, &status);
        if (w == OPS_READY) {
            printf("  %-12s %-22s ready (pid %d)", p->name, up_proc_addr(c, p), (int)p->pid);
            up_print_metrics(c, p);
            printf("\n");
            fflush(stdout);
            return true;
        }
        if (w == OPS_EXITED && p->picked_port && attempt < UP_BIND_ATTEMPTS_MAX &&
            up_log_says_in_use(c, p)) {
            char *addr = up_proc_addr(c, p);
            if (!ops_inst_pick_port(&c->topo, addr, ST_TOPO_ADDR_MAX + 1)) {
                up_report_failure(c, p, w, status);
                return false;
            }
            printf("  %-12s port taken meanwhile; retrying on %s\n", p->name, addr);
            if (!up_topo_save(c) || !up_spawn(c, p))
                return false;
            continue;
        }
        up_report_failure(c, p, w, status);
        return false;
    }
}

/* ---- already running? ---- */

/* 1: some recorded process is alive (the instance runs: start what is missing, if anything);
 * 0: none is (stale pid files removed, a fresh start). */
static int up_running_state(up_ctx *c) {
    static char names[OPS_PROCS_MAX][OPS_NAME_MAX]; /* CLI: one instance of this at a time */
    static pid_t pids[OPS_PROCS_MAX];
    size_t n = ops_inst_pid_names(c->dir, names, OPS_PROCS_MAX), alive = 0;
    for (size_t i = 0; i < n; i++)
        alive += ops_inst_pid_alive(pids[i] = ops_inst_pid_read(c->dir, names[i]));
    if (n == 0 || alive == 0) {
        static const ops_partition none; /* nodes start with every replication link open */
        for (size_t i = 0; i < n; i++)
            ops_inst_pid_remove_if(c->dir, names[i], pids[i]);
        ops_inst_partition_write(c->dir, &none);
        return 0;
    }
    return 1;
}

/* True when every process of DIR/topology has a live pid (nothing to start). */
static bool up_all_alive(up_ctx *c) {
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
            char name[OPS_NAME_MAX];
            ops_inst_node_name(&c->topo, i, j, name);
            if (!ops_inst_pid_alive(ops_inst_pid_read(c->dir, name)))
                return false;
        }
    for (size_t r = 0; r < c->topo.n_routers; r++) {
        char name[OPS_NAME_MAX];
        ops_inst_router_name(r, name);
        if (!ops_inst_pid_alive(ops_inst_pid_read(c->dir, name)))
            return false;
    }
    return true;
}

/* --metrics / --no-metrics on a running instance: a running process keeps what it was started
 * with (its command line), so the flag reaches it only at its next start; said when a running
 * process differs from the flag (it used to be "Already running" and nothing more). What is
 * started now follows the flag (ops_inst_start_missing). */
static void up_metrics_running_note(const up_ctx *c) {
    if (!c->o.metrics && !c->o.no_metrics)
        return;
    size_t differ = 0, n = c->topo.n_routers;
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        n += c->topo.clusters[i].n_nodes;
    for (size_t k = 0, i = 0, j = 0; k < n; k++) {
        char name[OPS_NAME_MAX], addr[ST_TOPO_ADDR_MAX + 1];
        while (i < c->topo.n_clusters && j >= c->topo.clusters[i].n_nodes) {
            i++;
            j = 0;
        }
        if (i < c->topo.n_clusters)
            ops_inst_node_name(&c->topo, i, j++, name);
        else
            ops_inst_router_name(k - (n - c->topo.n_routers), name);
        if (!ops_inst_pid_alive(ops_inst_pid_read(c->dir, name)))
            continue;
        ops_inst_metrics_read(c->dir, name, addr, sizeof addr);
        differ += (addr[0] != '\0') == c->o.no_metrics;
    }
    if (!differ)
        return;
    const char *flag = c->o.metrics ? "--metrics" : "--no-metrics";
    printf("(the instance runs: %zu running process(es) keep running %s metrics; %s takes effect "
           "at the next start of each process: `strata down --dir %s` then `strata up --dir %s "
           "%s`)\n",
           differ, c->o.metrics ? "without" : "with", flag, c->dir, c->dir, flag);
}

/* ---- processes found running ---- */

/* What became of a process found running that did not answer at once. */
typedef enum up_live { UP_LIVE_ANSWERS, UP_LIVE_GONE, UP_LIVE_STOPPED, UP_LIVE_SILENT } up_live;

/* One call: GetStatus of a node, PingAndWarm of a router (at most 2 s each). */
static bool up_probe(const up_ctx *c, const char *addr, bool router) {
    bool serving = false;
    st_code rc =
        router ? ops_inst_router_ping(&c->topo, addr) : ops_inst_node_status(addr, NULL, &serving);
    return !ops_inst_not_answering(rc, addr);
}

/* Waits up to --wait-s for pid, a process found running (this run did not start it), to answer
 * at addr, as up_await waits for the processes it starts: one left behind by a `strata up` that
 * was killed (or a node restarted by hand) may still be replaying its log and serve a moment
 * later, and calling it hung then sent the operator to restart it in the middle of its recovery.
 * A process stopped by a signal is not waited for: it answers nothing until it is continued. */
static up_live up_wait_live(const up_ctx *c, const char *name, pid_t pid, const char *addr,
                            bool router) {
    struct timespec nap = {0, OPS_POLL_MS * 1000000L};
    int64_t start_us = st_mono_us(), next_note_ms = OPS_PROGRESS_EVERY_S * 1000L;
    for (bool said = false;; nanosleep(&nap, NULL)) {
        if (!ops_inst_pid_alive(pid))
            return UP_LIVE_GONE;
        if (ops_inst_pid_stopped(pid))
            return UP_LIVE_STOPPED;
        if (up_probe(c, addr, router)) {
            if (said)
                printf("  %-12s %-22s ready (pid %d)\n", name, addr, (int)pid);
            return UP_LIVE_ANSWERS;
        }
        int64_t waited_ms = (st_mono_us() - start_us) / 1000;
        if (waited_ms >= c->o.wait_s * 1000LL)
            return UP_LIVE_SILENT;
        if (!said)
            printf("  %-12s %-22s running (pid %d), not answering yet: waiting up to %ds for it "
                   "(log %s/logs/%s.log)\n",
                   name, addr, (int)pid, c->o.wait_s, c->dir, name);
        else if (waited_ms >= next_note_ms) {
            printf("  ... still waiting for %s to answer on %s (%llds of %ds)\n", name, addr,
                   (long long)(waited_ms / 1000), c->o.wait_s);
            next_note_ms += OPS_PROGRESS_EVERY_S * 1000L;
        }
        said = true;
        fflush(stdout);
    }
}

/* Says why pid, found running, does not answer, with the advice that fits: one that exited is
 * started again; a stopped process is continued; one still starting (no connection, and no
 * "listening" line in its log since it was started) is left to finish, since a restart would
 * begin its recovery again; one that takes connections but answers no call, or no longer
 * listens, is hung and restarted. */
static void up_report_live(const up_ctx *c, const char *name, pid_t pid, const char *addr,
                           bool router, up_live why) {
    const char *df = c->o.dir_flag ? " --dir " : "", *dv = c->o.dir_flag ? c->dir : "";
    fflush(stdout); /* in order with the progress lines when both go to one file */
    if (why == UP_LIVE_GONE) {
        fprintf(stderr,
                "strata up: %s (pid %d) exited before it answered on %s (its log %s/logs/%s.log "
                "says why); `strata up%s%s` starts it again\n",
                name, (int)pid, addr, c->dir, name, df, dv);
        return;
    }
    if (why == UP_LIVE_STOPPED) {
        fprintf(stderr,
                "strata up: %s (pid %d) runs but does not answer on %s: it is stopped by a signal "
                "(SIGSTOP or Ctrl-Z: state T in /proc/%d/stat): `kill -CONT %d` resumes it, "
                "`strata restart %s%s%s` restarts it\n",
                name, (int)pid, addr, (int)pid, (int)pid, name, df, dv);
        return;
    }
    bool listened = true, accepts = ops_inst_tcp_ready(addr, 500);
    char last[240] = "";
    bool have_log = ops_inst_log_start_state(c->dir, name, &listened, last, sizeof last);
    /* Nothing since the start line: its time and who started it say enough, not its argv. */
    char *argv_at = strncmp(last, "=== ", 4) ? NULL : strstr(last, ": ");
    if (argv_at)
        *argv_at = '\0';
    if (!accepts && have_log && !listened) {
        fprintf(stderr,
                "strata up: %s (pid %d) runs but has not listened on %s within %ds: it is still "
                "starting (%s before it listens; its log has no \"listening\" line since this "
                "start and ends with \"%s\"). Leave it running: a restart would begin that again. "
                "`strata up%s%s --wait-s N` waits longer; `strata status%s%s` shows when it "
                "serves\n",
                name, (int)pid, addr, c->o.wait_s,
                router ? "a router loads the instance's metadata from its nodes"
                       : "a node replays its commit log",
                last, df, dv, df, dv);
        return;
    }
    fprintf(stderr,
            "strata up: %s (pid %d) runs but does not answer on %s within %ds: it is hung (%s): "
            "`strata restart %s%s%s` restarts it\n",
            name, (int)pid, addr, c->o.wait_s,
            accepts ? "it takes connections but answers no call"
                    : "it takes no connection, though its log says it listened",
            name, df, dv);
}

/* Whether process name, when alive, answers at addr, waited for as up_wait_live says; says why
 * not. A process found dead is left to ops_inst_start_missing, and so is one that exits while
 * waited for when restart (it runs next); otherwise that exit is a failure. */
static bool up_live_answers(const up_ctx *c, const char *name, const char *addr, bool router,
                            bool restart) {
    pid_t pid = ops_inst_pid_read(c->dir, name);
    if (!ops_inst_pid_alive(pid))
        return true;
    up_live why = up_wait_live(c, name, pid, addr, router);
    if (why == UP_LIVE_GONE && restart)
        printf("  %-12s %-22s exited before it answered (pid %d): started again below\n", name,
               addr, (int)pid);
    else if (why != UP_LIVE_ANSWERS)
        up_report_live(c, name, pid, addr, router, why);
    return why == UP_LIVE_ANSWERS || (why == UP_LIVE_GONE && restart);
}

/* True when every live node (routers: every live router) of DIR/topology answers, each waited
 * for. `strata up` leaves a running process alone, so one that is hung (or stopped with SIGSTOP)
 * would stay so while up said "Already running": it is named instead, with what mends it. Nodes
 * are checked before the missing processes are started, so a node that exits meanwhile is
 * started with them; routers after. */
static bool up_live_all_answer(const up_ctx *c, bool routers) {
    bool ok = true;
    char name[OPS_NAME_MAX];
    for (size_t i = 0; !routers && i < c->topo.n_clusters; i++)
        for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
            ops_inst_node_name(&c->topo, i, j, name);
            ok &= up_live_answers(c, name, c->topo.clusters[i].nodes[j].addr, false, true);
        }
    for (size_t r = 0; routers && r < c->topo.n_routers; r++) {
        ops_inst_router_name(r, name);
        ok &= up_live_answers(c, name, c->topo.routers[r], true, false);
    }
    return ok;
}

static bool mkdir_p(const char *path) {
    char buf[OPS_PATH_MAX + 16];
    if (!ops_fmt(buf, sizeof buf, "%s", path))
        return false;
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(buf, OPS_DIR_MODE) != 0 && errno != EEXIST)
                return false;
            *s = '/';
        }
    return mkdir(buf, OPS_DIR_MODE) == 0 || errno == EEXIST;
}

static bool up_make_dirs(up_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    const char *subs[] = {"", "/logs", "/run"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(path, sizeof path, "%s%s", c->dir, subs[i]);
        if (!mkdir_p(path)) {
            fprintf(stderr, "strata up: cannot create %s: %s (choose a writable --dir)\n", path,
                    strerror(errno));
            return false;
        }
    }
    return true;
}

/* ---- starting ---- */

/* Records --no-unix for every later start of the nodes (`strata chaos` restarts them with the
 * same command line), and warns about nodes whose socket path does not fit in a socket address:
 * the router reaches those over TCP. */
static bool up_unix_setup(up_ctx *c) {
    if (!ops_inst_no_unix_write(c->dir, c->o.no_unix)) {
        fprintf(stderr, "strata up: cannot write %s/run/no-unix: %s\n", c->dir, strerror(errno));
        return false;
    }
    const st_topology *t = &c->topo;
    char path[ST_TOPO_PATH_MAX + 16];
    for (size_t i = 0; i < t->n_clusters && !c->o.no_unix; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++)
            if (t->clusters[i].nodes[j].data_dir[0] &&
                !st_topo_node_sock_path(t->clusters[i].nodes[j].data_dir, path, sizeof path))
                fprintf(stderr,
                        "strata up: warning: %s is longer than %d bytes, too long for a Unix "
                        "socket: the router reaches this node over TCP (choose a shorter --dir)\n",
                        path, RPC_UNIX_PATH_MAX);
    return true;
}

/* Router ports are the operator's choice, so a taken one is an error, found before anything
 * starts; node ports we picked ourselves are replaced when taken. */
static bool up_check_ports(up_ctx *c) {
    st_topology *t = &c->topo;
    for (size_t r = 0; r < t->n_routers; r++) {
        if (ops_inst_port_free(t->routers[r]))
            continue;
        if (c->o.config) /* --port does not apply: the file names the routers */
            fprintf(stderr,
                    "strata up: router address %s (from %s) is already in use (another Strata "
                    "instance, this file's perhaps, started with another --dir; or the "
                    "Bigtable emulator?): stop what listens there or change the file\n",
                    t->routers[r], c->o.config);
        else
            fprintf(stderr,
                    "strata up: %s is already in use (another Strata instance, or the "
                    "Bigtable emulator?): stop it, or choose another port with --port "
                    "PORT\n",
                    t->routers[r]);
        return false;
    }
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            st_topo_node *n = &t->clusters[i].nodes[j];
            if (ops_inst_port_free(n->addr))
                continue;
            if (c->o.config) {
                fprintf(stderr,
                        "strata up: node address %s (from %s) is already in use: stop "
                        "what listens there or change the file\n",
                        n->addr, c->o.config);
                return false;
            }
            if (!ops_inst_pick_port(t, n->addr, sizeof n->addr)) {
                fprintf(stderr, "strata up: cannot find a free loopback port\n");
                return false;
            }
        }
    return true;
}

static bool up_start_nodes(up_ctx *c) {
    st_topology *t = &c->topo;
    size_t total = 0;
    for (size_t i = 0; i < t->n_clusters; i++)
        total += t->clusters[i].n_nodes;
    printf("Starting %zu strata-node processes in %zu cluster(s) (logs in %s/logs):\n", total,
           t->n_clusters, c->dir);
    size_t first = c->n_procs;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            up_proc *p = &c->procs[c->n_procs++];
            *p = (up_proc){.ci = i, .ni = j, .picked_port = !c->o.config};
            ops_inst_node_name(t, i, j, p->name);
            if (!up_spawn(c, p))
                return false;
        }
    /* All start at once (recovery runs in parallel); then each is awaited in turn. */
    for (size_t k = first; k < c->n_procs; k++)
        if (!up_await(c, &c->procs[k]))
            return false;
    return true;
}

static bool up_start_routers(up_ctx *c) {
    for (size_t r = 0; r < c->topo.n_routers; r++) {
        up_proc *p = &c->procs[c->n_procs++];
        *p = (up_proc){.is_router = true, .ri = r};
        ops_inst_router_name(r, p->name);
        printf("Starting %s:\n", p->name);
        if (!up_spawn(c, p) || !up_await(c, p))
            return false;
    }
    return true;
}

/* ---- --secure ---- */

/* "DNS:localhost,IP:127.0.0.1", plus the host of addr when it is another. */
static void up_san(const char *addr, char *out, size_t cap) {
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    unsigned char ip[16];
    snprintf(out, cap, "DNS:localhost,IP:127.0.0.1");
    if (!addr || !st_addr_split(addr, host, sizeof host, &port) || !host[0] ||
        !strcmp(host, "localhost") || !strcmp(host, "127.0.0.1"))
        return;
    bool is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    size_t used = strlen(out);
    snprintf(out + used, cap - used, ",%s:%s", is_ip ? "IP" : "DNS", host);
}

/* The CA, one certificate per process and the admin's, each made only when missing (a restart
 * keeps them), and the principals (tokens) when there are none yet. */
static bool up_secure_setup(up_ctx *c) {
    char dir[OPS_PATH_MAX + 16], san[2 * ST_TOPO_ADDR_MAX + 64], name[OPS_NAME_MAX];
    snprintf(dir, sizeof dir, "%s/%s", c->dir, OPS_SECURE_SUBDIR);
    st_err err = {0};
    if ((mkdir(dir, OPS_DIR_MODE) != 0 && errno != EEXIST) || chmod(dir, OPS_DIR_MODE) != 0) {
        fprintf(stderr, "strata up: cannot create %s: %s (choose a writable --dir)\n", dir,
                strerror(errno));
        return false;
    }
    st_code rc = ops_certs_ca(dir, &err);
    const st_topology *t = &c->topo;
    for (size_t i = 0; rc == ST_OK && i < t->n_clusters; i++)
        for (size_t j = 0; rc == ST_OK && j < t->clusters[i].n_nodes; j++) {
            ops_inst_node_name(t, i, j, name);
            up_san(t->clusters[i].nodes[j].addr, san, sizeof san);
            rc = ops_certs_leaf(dir, name, RPC_ROLE_NODE, san, &err);
        }
    up_san(t->n_routers ? t->routers[0] : NULL, san, sizeof san);
    if (rc == ST_OK)
        rc = ops_certs_leaf(dir, "router", RPC_ROLE_ROUTER, san, &err);
    if (rc == ST_OK)
        rc = ops_certs_leaf(dir, "admin", RPC_ROLE_ADMIN, NULL, &err);
    char tokens[OPS_PATH_MAX + 32];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    if (rc == ST_OK && access(tokens, F_OK) != 0)
        rc = ops_auth_bootstrap(dir, &err);
    if (rc != ST_OK) {
        fprintf(stderr, "strata up: %s\n", err.msg);
        return false;
    }
    ops_secure_use(c->dir); /* this run's own calls use the new credentials */
    return true;
}

/* The cbt command line for a secure instance: TLS to localhost (the router certificate is valid
 * for it), the CA to trust, the admin token when the instance has principals. */
static void up_print_secure(const up_ctx *c) {
    const st_topology *t = &c->topo;
    char host[ST_TOPO_ADDR_MAX + 1], token[OPS_SECURE_TOKEN_MAX] = "", ep[ST_TOPO_ADDR_MAX + 16];
    uint16_t port = 0;
    if (st_addr_split(t->routers[0], host, sizeof host, &port) && !strcmp(host, "127.0.0.1"))
        snprintf(ep, sizeof ep, "localhost:%u", port);
    else
        snprintf(ep, sizeof ep, "%s", t->routers[0]);
    /* cbt wants some token with -cert-file; a router without principals checks none */
    char bin[OPS_PATH_MAX];
    snprintf(bin, sizeof bin, "%s", c->router_bin);
    if (!bin[0]) /* an instance found running: its router is the one strata up would start */
        ops_bin_find(c->o.bin_dir, "router", "strata-router", bin, sizeof bin);
    bool has_token =
        ops_secure_token(c->dir, "admin", token, sizeof token) && ops_router_takes_auth(bin);
    if (!has_token)
        snprintf(token, sizeof token, "unchecked");
    printf(", router %s (TLS)\n\nTry it (%s):\n  unset BIGTABLE_EMULATOR_HOST\n"
           "  cbt -project %s -instance %s -data-endpoint %s -admin-endpoint %s -cert-file "
           "%s/%s/ca.pem -access-token %s ls\n\n",
           t->routers[0],
           has_token ? "the admin principal; writer and reader tokens are in DIR/secure/tokens"
                     : "this router checks no tokens: any -access-token works",
           t->project, t->instance, ep, ep, c->dir, OPS_SECURE_SUBDIR, token);
}

static void up_print_endpoint(const up_ctx *c, bool already) {
    const st_topology *t = &c->topo;
    const char *dir_hint = c->o.dir_flag ? " --dir " : "";
    const char *dir_val = c->o.dir_flag ? c->dir : "";
    printf("%s Strata instance in %s: %zu cluster(s) (",
           already ? "Already running:" : "Ready:", c->dir, t->n_clusters);
    for (size_t i = 0; i < t->n_clusters; i++)
        printf("%s%s", i ? ", " : "", t->clusters[i].id);
    printf(")");
    if (t->n_routers == 0) {
        printf(", no router (connect to a node directly)\n");
    } else if (ops_secure_on()) {
        up_print_secure(c);
    } else {
        printf(", router %s\n\nTry it:\n  export BIGTABLE_EMULATOR_HOST=%s\n"
               "  cbt -project %s -instance %s ls\n\n",
               t->routers[0], t->routers[0], t->project, t->instance);
    }
    printf("Status: strata status%s%s    Stop: strata down%s%s\n", dir_hint, dir_val, dir_hint,
           dir_val);
}

/* A running instance: starts the processes of DIR/topology that are not running (its shape,
 * ports and data stay as they are: flags that would change them are ignored, and said so), then
 * prints its endpoint. */
static int up_already(up_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    if (st_topology_load(path, &c->topo, &err) != ST_OK) {
        printf("An instance is already running in %s (its topology is unreadable: %s)\n", c->dir,
               err.msg);
        return 0;
    }
    /* Said whether or not something is started: a script asking for another port or shape is
     * told, not left to find out when it cannot connect. */
    char want[32];
    snprintf(want, sizeof want, ":%d", c->o.port);
    bool other_port =
        c->o.port_given &&
        !(c->topo.n_routers && strlen(c->topo.routers[0]) > strlen(want) &&
          !strcmp(c->topo.routers[0] + strlen(c->topo.routers[0]) - strlen(want), want));
    if (c->o.config || c->o.shape_given || c->o.split_bytes || other_port)
        printf("(the instance runs: --config, --port, --clusters, --nodes and --split-bytes are "
               "ignored; `strata down --dir %s` first to change them, or pass another --dir)\n",
               c->dir);
    signal(SIGPIPE, SIG_IGN);       /* a node dying mid-call must not end this command */
    st_log_set_level(ST_LOG_ERROR); /* a process that does not answer is said in a sentence */
    up_metrics_running_note(c);
    /* The nodes found running first (a router started meanwhile would find them silent), then
     * whatever is missing, then the routers that were running. */
    bool nodes_ok = up_live_all_answer(c, false), all_alive = up_all_alive(c);
    int rc = all_alive ? 0
                       : ops_inst_start_missing(c->dir, c->o.bin_dir, c->o.wait_s,
                                                c->o.metrics      ? 1
                                                : c->o.no_metrics ? -1
                                                                  : 0,
                                                nodes_ok);
    bool ok = up_live_all_answer(c, true) && nodes_ok && up_all_alive(c);
    if (rc == 0 && !ok) {
        fflush(stdout);
        fprintf(stderr,
                "strata up: the instance in %s is not fully serving (see above); "
                "`strata status` shows it.\n",
                c->dir);
        rc = 1;
    }
    if (rc == 0) {
        if (!all_alive)
            printf("\n");
        up_print_endpoint(c, all_alive);
    }
    return rc;
}

/* An instance made when these were created with wider modes is narrowed to owner-only (new ones
 * are created so; the logs of the processes started are narrowed as they are opened). Best
 * effort: what does not exist yet is skipped. */
static void up_narrow_modes(const up_ctx *c) {
    const char *subs[] = {"", "/logs", "/run", "/topology"};
    char path[OPS_PATH_MAX + 16];
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(path, sizeof path, "%s%s", c->dir, subs[i]);
        (void)chmod(path, i == 3 ? OPS_FILE_MODE : OPS_DIR_MODE);
    }
}

/* Removes what up_make_dirs made in a DIR this run made, while nothing was started: only empty
 * directories go (rmdir), so whatever was written there stays. */
static void up_unmake_dirs(const up_ctx *c) {
    if (!c->made_dir)
        return;
    const char *subs[] = {"/logs", "/run", ""};
    char path[OPS_PATH_MAX + 16];
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(path, sizeof path, "%s%s", c->dir, subs[i]);
        (void)rmdir(path);
    }
}

static int up_run(up_ctx *c) {
    up_narrow_modes(c);
    if (up_running_state(c)) {
        if (c->o.secure && !ops_secure_on()) {
            fprintf(stderr,
                    "strata up: the instance in %s runs without --secure: stop it first "
                    "(`strata down`), then `strata up --secure` (its data is kept)\n",
                    c->dir);
            return 1;
        }
        return up_already(c);
    }
    up_metrics_keep(c);
    /* The checks come before anything is written, and a DIR this run made is removed again
     * when they refuse: a refused start leaves no instance directory behind. */
    if (!up_find_bins(c) || !up_topo_build(c) || !up_check_ports(c) || !up_make_dirs(c) ||
        !up_topo_save(c) || !up_unix_setup(c) || (c->o.secure && !up_secure_setup(c))) {
        up_unmake_dirs(c);
        return 1;
    }
    if (!up_start_nodes(c) || !up_start_routers(c)) {
        fprintf(stderr,
                "strata up: stopping the processes already started; data in %s is "
                "kept. Fix the problem above and run `strata up` again.\n",
                c->dir);
        up_stop_all(c);
        return 1;
    }
    printf("\n");
    up_print_endpoint(c, false);
    return 0;
}

/* The instance lock (ops_inst_lock) for the whole run; the directory is made first. A second
 * `strata up` waits, then finds the instance running. Returns the descriptor, or -1 after a
 * message. */
static int up_lock(up_ctx *c) {
    struct stat st;
    c->made_dir = stat(c->dir, &st) != 0;
    if (!mkdir_p(c->dir)) {
        fprintf(stderr, "strata up: cannot create %s: %s (choose a writable --dir)\n", c->dir,
                strerror(errno));
        return -1;
    }
    return ops_inst_lock(c->dir, "strata up", true);
}

static int up_run_locked(up_ctx *c) {
    int fd = up_lock(c);
    if (fd < 0)
        return 1;
    int rc = up_run(c);
    close(fd);
    return rc;
}

int ops_up_main(int argc, char **argv) {
    up_ctx *c = calloc(1, sizeof *c); /* ~1 MiB (the topology's fixed arrays): not the stack */
    if (!c) {
        fprintf(stderr, "strata up: out of memory\n");
        return 1;
    }
    int rc = up_parse(argc, argv, &c->o);
    if (rc < 0)
        rc = ops_inst_dir(c->o.dir_flag, c->dir, sizeof c->dir) ? up_run_locked(c) : 2;
    free(c);
    return rc;
}
