/* ops/chaos.c — `strata chaos`: rehearsing zone loss on a local instance (docs/operations.md).
 *
 *   kill-cluster NAME     kill -9 every running node of cluster NAME (pid files in DIR/run)
 *   restart-cluster NAME  starts every stopped node of NAME with the command line `strata up`
 *                         uses (ops_inst_node_cmdline), waits until each listens, and re-applies
 *                         the partition recorded in DIR/run/partition to it
 *   partition A B         cuts the replication links between clusters A and B on every node of
 *                         both (strata.internal.v1.Replication/SetLinks); clients keep being
 *                         served; recorded in DIR/run/partition
 *   heal                  restores every link on every node and removes DIR/run/partition
 *
 * A node's cut links live in its memory only, so the file is what survives a node's restart
 * (restart-cluster applies it) and what `strata status` shows. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "instance.h"
#include "strata/rpc.h"

#define CHAOS_WAIT_S_DEFAULT 60  /* per node, as `strata up` */
#define CHAOS_KILL_WAIT_MS 10000 /* until a SIGKILLed node has exited and released its data dir */
#define CHAOS_LOG_TAIL_LINES 20

typedef struct chaos_ctx {
    const char *dir_flag, *bin_dir;
    int wait_s;
    const char *verb, *args[2];
    size_t n_args;
    char dir[OPS_PATH_MAX];
    char node_bin[OPS_PATH_MAX];
    st_topology topo;
    ops_partition part;
} chaos_ctx;

static void chaos_usage(FILE *out) {
    fprintf(out,
            "usage: strata chaos kill-cluster NAME    [--dir DIR]\n"
            "       strata chaos restart-cluster NAME [--dir DIR] [--bin-dir DIR] [--wait-s S]\n"
            "       strata chaos partition A B        [--dir DIR]\n"
            "       strata chaos heal                 [--dir DIR]\n"
            "Rehearses failures on the local instance in DIR (default $STRATA_HOME, else\n"
            "~/.strata/local):\n"
            "  kill-cluster     kill -9 every node of cluster NAME\n"
            "  restart-cluster  start the stopped nodes of NAME again, with the command lines\n"
            "                   `strata up` uses, and wait until they listen (default %d s each)\n"
            "  partition        cut the replication links between clusters A and B (both keep\n"
            "                   serving their clients); kept in DIR/run/partition\n"
            "  heal             restore every replication link\n"
            "`strata status` shows each cluster's health, cut links and replication lag.\n",
            CHAOS_WAIT_S_DEFAULT);
}

/* Returns -1 when parsed, else the exit code. */
static int chaos_parse(int argc, char **argv, chaos_ctx *c) {
    c->wait_s = CHAOS_WAIT_S_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            chaos_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dir") && v) {
            c->dir_flag = argv[++i];
        } else if (!strcmp(a, "--bin-dir") && v) {
            c->bin_dir = argv[++i];
        } else if (!strcmp(a, "--wait-s") && v) {
            uint64_t s;
            if (!st_parse_u64(argv[++i], 1, 3600, &s)) {
                fprintf(stderr, "strata chaos: --wait-s needs seconds from 1 to 3600, got '%s'\n",
                        v);
                return 2;
            }
            c->wait_s = (int)s;
        } else if (a[0] == '-') {
            fprintf(stderr, "strata chaos: unknown flag or missing value: '%s'\n", a);
            chaos_usage(stderr);
            return 2;
        } else if (!c->verb) {
            c->verb = a;
        } else if (c->n_args < 2) {
            c->args[c->n_args++] = a;
        } else {
            fprintf(stderr, "strata chaos: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    size_t want = !c->verb                              ? 99
                  : !strcmp(c->verb, "kill-cluster")    ? 1
                  : !strcmp(c->verb, "restart-cluster") ? 1
                  : !strcmp(c->verb, "partition")       ? 2
                  : !strcmp(c->verb, "heal")            ? 0
                                                        : 99;
    if (want == 99 || want != c->n_args) {
        if (c->verb && want == 99)
            fprintf(stderr, "strata chaos: unknown action '%s'\n", c->verb);
        else if (c->verb)
            fprintf(stderr, "strata chaos %s: takes %zu argument(s), got %zu\n", c->verb, want,
                    c->n_args);
        chaos_usage(stderr);
        return 2;
    }
    return -1;
}

/* Index of cluster id in the topology, -1 (with a message) when there is none. */
static int chaos_cluster(const chaos_ctx *c, const char *id) {
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        if (!strcmp(c->topo.clusters[i].id, id))
            return (int)i;
    fprintf(stderr, "strata chaos: no cluster '%s' in %s/topology (clusters:", id, c->dir);
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        fprintf(stderr, " %s", c->topo.clusters[i].id);
    fprintf(stderr, ")\n");
    return -1;
}

/* ---- cutting links ---- */

/* Says why node j of cluster i did not answer SetLinks and what follows for the links. Under the
 * instance lock nothing starts a node meanwhile, so a node without a live process starts later
 * with what DIR/run/partition then says (restart-cluster, `strata restart` and `strata up` apply
 * it). A live one that does not answer (stopped, hung) keeps the links it had in memory: that is
 * an error, since the action did not reach it. Returns the node's share of the result (-1: down,
 * 1: running but not reached). */
static int chaos_unreached(const chaos_ctx *c, size_t i, size_t j, bool heal) {
    char name[OPS_NAME_MAX];
    ops_inst_node_name(&c->topo, i, j, name);
    pid_t pid = ops_inst_pid_read(c->dir, name);
    if (!ops_inst_pid_alive(pid)) {
        if (heal)
            printf("  %-12s not running: it starts with every link open\n", name);
        else
            printf("  %-12s not running: the partition is applied when `strata chaos "
                   "restart-cluster %s` or `strata restart %s` starts it\n",
                   name, c->topo.clusters[i].id, name);
        return -1;
    }
    fprintf(stderr,
            "strata chaos: %s (pid %d) runs but does not answer (stopped? `kill -CONT %d`): it "
            "keeps the links it had; run `strata chaos %s` again once it answers\n",
            name, (int)pid, (int)pid, heal ? "heal" : "partition A B");
    return 1;
}

/* Sends node j of cluster i the links the partition file cuts (ops_inst_set_links): 0 done,
 * -1 the node is down (it gets them when it starts), 1 an error said on stderr. */
static int chaos_set_links(chaos_ctx *c, size_t i, size_t j, bool heal) {
    int r = ops_inst_set_links(&c->topo, &c->part, i, j, heal);
    return r < 0 ? chaos_unreached(c, i, j, heal) : r;
}

/* Applies the partition file to every node of cluster i; false if a node refused. */
static bool chaos_apply_cluster(chaos_ctx *c, size_t i) {
    bool ok = true;
    for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++)
        ok &= chaos_set_links(c, i, j, false) <= 0;
    return ok;
}

static int chaos_partition(chaos_ctx *c) {
    int a = chaos_cluster(c, c->args[0]), b = chaos_cluster(c, c->args[1]);
    if (a < 0 || b < 0)
        return 1;
    if (a == b) {
        fprintf(stderr, "strata chaos partition: name two different clusters\n");
        return 2;
    }
    if (!ops_inst_partition_cut(&c->part, c->args[0], c->args[1])) {
        snprintf(c->part.a[c->part.n], sizeof c->part.a[0], "%s", c->args[0]);
        snprintf(c->part.b[c->part.n], sizeof c->part.b[0], "%s", c->args[1]);
        c->part.n++;
    }
    if (!ops_inst_partition_write(c->dir, &c->part)) {
        fprintf(stderr, "strata chaos: cannot write %s/run/partition: %s\n", c->dir,
                strerror(errno));
        return 1;
    }
    printf("Cutting replication between %s and %s (clients are still served):\n", c->args[0],
           c->args[1]);
    bool ok = chaos_apply_cluster(c, (size_t)a) & chaos_apply_cluster(c, (size_t)b);
    printf("%s. `strata chaos heal%s%s` restores the links; `strata status` shows them.\n",
           ok ? "Partitioned" : "Partitioned, with errors above", c->dir_flag ? " --dir " : "",
           c->dir_flag ? c->dir : "");
    return ok ? 0 : 1;
}

static int chaos_heal(chaos_ctx *c) {
    size_t had = c->part.n;
    c->part.n = 0;
    if (!ops_inst_partition_write(c->dir, &c->part)) {
        fprintf(stderr, "strata chaos: cannot remove %s/run/partition: %s\n", c->dir,
                strerror(errno));
        return 1;
    }
    /* Every node, even when the file named no pair: a node may hold a cut the file lost. */
    printf("Restoring every replication link (%zu cut pair(s) recorded):\n", had);
    bool ok = true;
    size_t done = 0, total = 0;
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
            int r = chaos_set_links(c, i, j, true);
            ok &= r <= 0;
            done += r == 0;
            total++;
        }
    if (ok)
        printf("Healed: links restored on %zu of %zu nodes%s.\n", done, total,
               done < total ? " (the others are not running; they start with every link open)"
                            : "");
    else
        printf("Not healed: links restored on %zu of %zu nodes; see the errors above.\n", done,
               total);
    return ok ? 0 : 1;
}

/* ---- killing and restarting ---- */

static int chaos_kill(chaos_ctx *c) {
    int i = chaos_cluster(c, c->args[0]);
    if (i < 0)
        return 1;
    const st_topo_cluster *cl = &c->topo.clusters[i];
    printf("Killing every node of cluster %s (SIGKILL):\n", cl->id);
    size_t killed = 0, failed = 0;
    for (size_t j = 0; j < cl->n_nodes; j++) {
        char name[OPS_NAME_MAX];
        ops_inst_node_name(&c->topo, (size_t)i, j, name);
        pid_t pid = ops_inst_pid_read(c->dir, name);
        if (!ops_inst_pid_alive(pid)) {
            printf("  %-12s not running\n", name);
            continue;
        }
        if (kill(pid, SIGKILL) != 0 || !ops_inst_pid_wait_gone(pid, CHAOS_KILL_WAIT_MS)) {
            fprintf(stderr, "strata chaos: cannot kill %s (pid %d): %s\n", name, (int)pid,
                    errno == EPERM ? "not allowed (run as its owner)" : "it is still there");
            failed++;
            continue;
        }
        /* The pid file stays: `strata status` shows "<pid>(gone)" until a restart. */
        printf("  %-12s killed (pid %d)\n", name, (int)pid);
        killed++;
    }
    printf("%zu node(s) of %s killed. `strata chaos restart-cluster %s%s%s` starts them again.\n",
           killed, cl->id, cl->id, c->dir_flag ? " --dir " : "", c->dir_flag ? c->dir : "");
    return failed ? 1 : 0;
}

static void chaos_report_failure(const chaos_ctx *c, const char *name, const char *addr, pid_t pid,
                                 ops_wait w, int status) {
    char how[256];
    if (w == OPS_TIMEOUT)
        fprintf(stderr, "strata chaos: %s did not listen on %s within %ds\n", name, addr,
                c->wait_s);
    else
        fprintf(stderr, "strata chaos: %s %s before listening on %s\n", name,
                ops_inst_ended_said(status, how, sizeof how), addr);
    char log_path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", c->dir, name);
    ops_inst_log_tail(log_path, CHAOS_LOG_TAIL_LINES);
    if (w == OPS_EXITED)
        ops_inst_pid_remove_if(c->dir, name, pid);
}

static int chaos_restart(chaos_ctx *c) {
    int i = chaos_cluster(c, c->args[0]);
    if (i < 0)
        return 1;
    if (!ops_bin_find(c->bin_dir, "node", "strata-node", c->node_bin, sizeof c->node_bin)) {
        fprintf(stderr, "strata chaos: strata-node not found (%s): pass --bin-dir DIR\n",
                c->bin_dir ? c->bin_dir : "next to strata's build tree or on $PATH");
        return 1;
    }
    const st_topo_cluster *cl = &c->topo.clusters[i];
    pid_t pids[ST_TOPO_NODES_MAX] = {0};
    size_t started = 0;
    printf("Restarting the stopped nodes of cluster %s (logs in %s/logs):\n", cl->id, c->dir);
    for (size_t j = 0; j < cl->n_nodes; j++) {
        char name[OPS_NAME_MAX];
        ops_inst_node_name(&c->topo, (size_t)i, j, name);
        pid_t old = ops_inst_pid_read(c->dir, name);
        if (ops_inst_pid_alive(old)) {
            printf("  %-12s running (pid %d): left alone\n", name, (int)old);
            continue;
        }
        ops_cmdline cmd;
        long off;
        if (!ops_inst_metrics_port(c->dir, &c->topo, name, "strata chaos", 0, false))
            return 1;
        ops_inst_node_cmdline(&cmd, c->dir, c->node_bin, &c->topo, (size_t)i, j);
        if (!(pids[j] = ops_inst_spawn(c->dir, name, cmd.argv, "strata chaos", &off)))
            return 1;
        started++;
    }
    bool ok = true;
    size_t ready = 0;
    char failed[256] = ""; /* the names of the nodes that did not come up, for the summary */
    for (size_t j = 0; j < cl->n_nodes; j++) {
        if (!pids[j])
            continue;
        char name[OPS_NAME_MAX];
        ops_inst_node_name(&c->topo, (size_t)i, j, name);
        int status = 0;
        ops_wait w =
            ops_inst_wait_ready(c->dir, name, pids[j], cl->nodes[j].addr, c->wait_s, &status);
        if (w != OPS_READY) {
            chaos_report_failure(c, name, cl->nodes[j].addr, pids[j], w, status);
            size_t len = strlen(failed);
            snprintf(failed + len, sizeof failed - len, "%s%s", len ? ", " : "", name);
            ok = false;
            continue;
        }
        ready++;
        printf("  %-12s %-22s ready (pid %d)\n", name, cl->nodes[j].addr, (int)pids[j]);
        /* A partition recorded while it was down applies to it too. */
        bool cut = false;
        for (size_t k = 0; k < c->topo.n_clusters; k++)
            cut |= ops_inst_partition_cut(&c->part, cl->id, c->topo.clusters[k].id);
        if (cut && chaos_set_links(c, (size_t)i, j, false) != 0)
            ok = false;
    }
    if (started == 0)
        printf("Every node of %s is running: nothing to restart.\n", cl->id);
    else if (ready < started && started - ready == 1)
        printf("Restart failed: %zu of %zu node(s) of %s ready; %s did not come up (its log: "
               "%s/logs/%s.log).\n",
               ready, started, cl->id, failed, c->dir, failed);
    else if (ready < started)
        printf("Restart failed: %zu of %zu node(s) of %s ready; did not come up: %s (logs in "
               "%s/logs).\n",
               ready, started, cl->id, failed, c->dir);
    else
        printf("%s: %zu node(s) of %s started.\n", ok ? "Restarted" : "Restart failed", started,
               cl->id);
    return ok ? 0 : 1;
}

static int chaos_run(chaos_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    st_code rc = st_topology_load(path, &c->topo, &err);
    if (rc != ST_OK) {
        if (rc == ST_NOT_FOUND)
            fprintf(stderr,
                    "strata chaos: no instance in %s (no topology file): start one with "
                    "`strata up`\n",
                    c->dir);
        else
            fprintf(stderr, "strata chaos: %s\n", err.msg);
        return 1;
    }
    if (!ops_inst_partition_read(c->dir, &c->part)) {
        fprintf(stderr,
                "strata chaos: %s/run/partition is unreadable; remove it and run "
                "`strata chaos heal`\n",
                c->dir);
        if (strcmp(c->verb, "heal") != 0)
            return 1;
        c->part.n = 0;
    }
    signal(SIGPIPE, SIG_IGN);       /* a node dying mid-call must not end this command */
    st_log_set_level(ST_LOG_ERROR); /* a down node is reported in a sentence, not log lines */
    if (!strcmp(c->verb, "kill-cluster"))
        return chaos_kill(c);
    if (!strcmp(c->verb, "restart-cluster"))
        return chaos_restart(c);
    if (!strcmp(c->verb, "partition"))
        return chaos_partition(c);
    return chaos_heal(c);
}

/* Every action runs under the instance lock (ops_inst_lock), from reading the pid files and
 * DIR/run/partition to the last node reached, so none interleaves with `strata up`, `strata
 * restart` or another action: restart-cluster beside `up` would start a node the other starts
 * too; a heal (or partition) between a restart's reading of DIR/run/partition and its node
 * listening would miss that node, which then starts with the old links; kill-cluster during `up`
 * would kill a starting node, and `up` then stops everything it started. The second waits. */
static int chaos_run_locked(chaos_ctx *c) {
    int fd = ops_inst_lock(c->dir, "strata chaos", false);
    if (fd < 0)
        return 1;
    int rc = chaos_run(c);
    close(fd);
    return rc;
}

int ops_chaos_main(int argc, char **argv) {
    chaos_ctx *c = calloc(1, sizeof *c); /* the topology is large: not the stack */
    if (!c) {
        fprintf(stderr, "strata chaos: out of memory\n");
        return 1;
    }
    int rc = chaos_parse(argc, argv, c);
    if (rc < 0)
        rc = ops_inst_dir(c->dir_flag, c->dir, sizeof c->dir) ? chaos_run_locked(c) : 2;
    free(c);
    return rc;
}
