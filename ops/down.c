/* ops/down.c — `strata down`: stops a local instance started by `strata up`. Every process named
 * by a pid file in DIR/run gets SIGTERM (nodes then flush and close cleanly), a bounded wait, and
 * SIGKILL if it is still there; pid files are removed. Data stays unless --purge is given. It
 * holds the instance lock while it runs, as `strata up` and `strata restart` do. */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "instance.h"

#define DOWN_GRACE_S_DEFAULT 30 /* a node flushing a large memtable takes a few seconds */
#define DOWN_POLL_MS 50
#define DOWN_PROGRESS_EVERY_S 5

typedef struct down_ctx {
    const char *dir_flag;
    char dir[OPS_PATH_MAX];
    bool purge;
    int grace_s;
    char names[OPS_PROCS_MAX][OPS_NAME_MAX];
    pid_t pids[OPS_PROCS_MAX];
    size_t n;
} down_ctx;

static void down_usage(FILE *out) {
    fprintf(
        out,
        "usage: strata down [--dir DIR] [--purge] [--grace-s S]\n"
        "Stops the local instance in DIR (default $STRATA_HOME, else ~/.strata/local): SIGTERM\n"
        "to every process, then SIGKILL to any still running after S seconds (default %d).\n"
        "Data, topology and logs are kept; --purge deletes them too (only what `strata up`\n"
        "created: the topology, logs, pid files and the data directories under DIR).\n",
        DOWN_GRACE_S_DEFAULT);
}

static int down_parse(int argc, char **argv, down_ctx *c) {
    c->grace_s = DOWN_GRACE_S_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            down_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--purge")) {
            c->purge = true;
        } else if (!strcmp(a, "--dir") && v) {
            c->dir_flag = argv[++i];
        } else if (!strcmp(a, "--grace-s") && v) {
            uint64_t s;
            if (!st_parse_u64(argv[++i], 0, 3600, &s)) {
                fprintf(stderr, "strata down: --grace-s needs seconds from 0 to 3600, got '%s'\n",
                        v);
                return 2;
            }
            c->grace_s = (int)s;
        } else {
            fprintf(stderr, "strata down: unknown flag or missing value: '%s'\n", a);
            down_usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* Sends SIGTERM to every live recorded process; forgets (and unlinks) stale pid files. */
static size_t down_signal(down_ctx *c) {
    size_t n = ops_inst_pid_names(c->dir, c->names, OPS_PROCS_MAX), live = 0;
    for (size_t i = 0; i < n; i++) {
        pid_t pid = ops_inst_pid_read(c->dir, c->names[i]);
        if (!ops_inst_pid_alive(pid)) {
            ops_inst_pid_remove_if(c->dir, c->names[i], pid);
            continue;
        }
        if (ops_inst_term(pid) != 0 && errno == EPERM) {
            fprintf(stderr, "strata down: not allowed to stop %s (pid %d): run as its owner\n",
                    c->names[i], (int)pid);
            continue;
        }
        memmove(c->names[live], c->names[i], OPS_NAME_MAX);
        c->pids[live++] = pid;
    }
    c->n = live;
    return live;
}

/* Polls until every signalled process is gone or the grace period ends; returns how many remain.
 * They are not our children (strata up exited), so liveness is all we can watch. */
static size_t down_wait(down_ctx *c) {
    struct timespec nap = {0, DOWN_POLL_MS * 1000000L};
    long waited_ms = 0, next_note_ms = DOWN_PROGRESS_EVERY_S * 1000L;
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < c->n; i++) {
            if (c->pids[i] && !ops_inst_pid_alive(c->pids[i])) {
                ops_inst_pid_remove_if(c->dir, c->names[i], c->pids[i]);
                c->pids[i] = 0;
            }
            left += c->pids[i] != 0;
        }
        if (left == 0 || waited_ms >= (long)c->grace_s * 1000L)
            return left;
        if (waited_ms >= next_note_ms) {
            printf("  ... waiting for %zu process(es) to exit (%lds of %ds)\n", left,
                   waited_ms / 1000, c->grace_s);
            fflush(stdout);
            next_note_ms += DOWN_PROGRESS_EVERY_S * 1000L;
        }
        nanosleep(&nap, NULL);
        waited_ms += DOWN_POLL_MS;
    }
}

static void down_kill_rest(down_ctx *c) {
    for (size_t i = 0; i < c->n; i++)
        if (c->pids[i]) {
            fprintf(stderr,
                    "strata down: %s (pid %d) did not stop within %ds: killing it (its "
                    "log: %s/logs/%s.log)\n",
                    c->names[i], (int)c->pids[i], c->grace_s, c->dir, c->names[i]);
            kill(c->pids[i], SIGKILL);
        }
    c->grace_s = 5; /* SIGKILL is not refused; this only waits for the kernel */
    size_t left = down_wait(c);
    if (left)
        fprintf(stderr, "strata down: %zu process(es) still present after SIGKILL\n", left);
}

static int purge_visit(const char *p, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if ((type == FTW_DP ? rmdir(p) : unlink(p)) != 0)
        fprintf(stderr, "strata down: cannot remove %s: %s\n", p, strerror(errno));
    return 0;
}

static void remove_tree(const char *path) {
    if (access(path, F_OK) == 0)
        nftw(path, purge_visit, 16, FTW_DEPTH | FTW_PHYS);
}

/* Deletes what `strata up` made: the data directories the topology names under DIR, logs, pid
 * files, the topology, then DIR itself if that leaves it empty. Nothing else is touched, so a
 * mistaken --dir (a home directory) loses nothing that is not an instance's. */
static int down_purge(down_ctx *c) {
    static st_topology t; /* large; the CLI runs one command */
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    st_code rc = st_topology_load(path, &t, &err);
    if (rc == ST_NOT_FOUND) {
        printf("Nothing to purge: %s holds no Strata instance (no topology file).\n", c->dir);
        return 0;
    }
    if (rc != ST_OK) {
        fprintf(stderr,
                "strata down: %s\nNot purging: without a readable topology the data "
                "directories are unknown. Delete %s by hand if you mean to.\n",
                err.msg, c->dir);
        return 1;
    }
    size_t dl = strlen(c->dir);
    for (size_t i = 0; i < t.n_clusters; i++)
        for (size_t j = 0; j < t.clusters[i].n_nodes; j++) {
            /* A relative data directory (a topology from an older `strata up --dir REL`) is
             * taken relative to the working directory, as the nodes were started. */
            char d[OPS_PATH_MAX];
            const char *given = t.clusters[i].nodes[j].data_dir;
            if (!given[0] || !ops_path_absolute(given, d, sizeof d))
                continue;
            if (!strncmp(d, c->dir, dl) && d[dl] == '/')
                remove_tree(d);
            else
                printf("  kept %s (outside %s): delete it yourself if you mean to\n", d, c->dir);
        }
    const char *subs[] = {"/logs", "/run", "/topology.tmp", "/topology"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(path, sizeof path, "%s%s", c->dir, subs[i]);
        remove_tree(path);
    }
    rmdir(c->dir); /* fails, harmlessly, if the user keeps other files there */
    printf("Purged the instance in %s.\n", c->dir);
    return 0;
}

static int down_run(down_ctx *c) {
    static const ops_partition none; /* stopped nodes forget their cut links: so does the file */
    size_t live = down_signal(c);
    struct stat st;
    if (live == 0 && stat(c->dir, &st) != 0 && errno == ENOENT)
        printf("There is no Strata instance in %s (no such directory): nothing to stop.\n", c->dir);
    else if (live == 0)
        printf("No Strata process is running in %s.\n", c->dir);
    else {
        printf("Stopping %zu process(es) in %s:", live, c->dir);
        for (size_t i = 0; i < c->n; i++)
            printf(" %s", c->names[i]);
        printf("\n");
        fflush(stdout);
        if (down_wait(c) > 0)
            down_kill_rest(c);
        printf("Stopped.%s\n", c->purge ? "" : " Data is kept; `strata up` starts it again.");
    }
    ops_inst_partition_write(c->dir, &none);
    return c->purge ? down_purge(c) : 0;
}

/* Under the instance lock (ops_inst_lock), from reading the pid files to removing them: a `down`
 * beside a `strata restart` (or `chaos restart-cluster`) found the old process gone and the new
 * one not recorded yet, said "Stopped." and left the new one running; beside a `strata up`, it
 * stopped the processes started so far and the up failed halfway. Now it waits for the other
 * command and stops what that one left running. A DIR that does not exist has nothing to stop. */
static int down_run_locked(down_ctx *c) {
    struct stat st;
    if (stat(c->dir, &st) != 0 && errno == ENOENT)
        return down_run(c);
    int fd = ops_inst_lock(c->dir, "strata down", false);
    if (fd < 0) { /* removed meanwhile (another down --purge): nothing runs there */
        if (stat(c->dir, &st) != 0 && errno == ENOENT)
            return down_run(c);
        return 1;
    }
    int rc = down_run(c);
    close(fd);
    return rc;
}

int ops_down_main(int argc, char **argv) {
    down_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "strata down: out of memory\n");
        return 1;
    }
    int rc = down_parse(argc, argv, c);
    if (rc < 0)
        rc = ops_inst_dir(c->dir_flag, c->dir, sizeof c->dir) ? down_run_locked(c) : 2;
    free(c);
    return rc;
}
