/* ops/bench_up.c — the local instance `strata bench --up C` measures: started with this very
 * binary's `strata up` in a temporary dir (one router, C clusters of N nodes, replication between
 * clusters as `strata up` configures it) and stopped with `strata down` at the end; or an
 * instance already running, named with `--dir`. Either way the topology file says where the
 * router and the nodes listen, and DIR/run/<name>.pid which processes to measure. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_run.h"
#include "paths.h"
#include "strata/topology.h"

#define BENCH_UP_ARGS_MAX 16
#define BENCH_UP_TAIL_BYTES 2000 /* of `strata up`'s output shown when it fails */

/* A loopback port free right now (bind port 0, read it, close). 0 on failure. */
static uint16_t free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* Runs this binary with argv[1..] (a `strata` subcommand), output appended to log; its exit
 * status, or -1 when it could not run. */
static int run_self(char *argv[], const char *log) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    argv[0] = self;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(self, argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The end of a log on stderr, so a failed `strata up` explains itself before the temporary
 * dir holding the log is removed. */
static void print_tail(const char *path) {
    char buf[BENCH_UP_TAIL_BYTES + 1];
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    long from = 0;
    if (fseek(f, 0, SEEK_END) == 0 && ftell(f) > BENCH_UP_TAIL_BYTES)
        from = ftell(f) - BENCH_UP_TAIL_BYTES;
    size_t n = fseek(f, from, SEEK_SET) == 0 ? fread(buf, 1, BENCH_UP_TAIL_BYTES, f) : 0;
    fclose(f);
    buf[n] = '\0';
    fprintf(stderr, "bench: strata up said:\n%s\n", buf);
}

st_code bench_inst_load(bench_inst *in, const char *dir, st_err *err) {
    char abs[sizeof(in->dir)];
    if (!ops_path_absolute(dir, abs, sizeof(abs)))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "instance directory %s: too long once made absolute, or the working "
                          "directory is unknown",
                          dir);
    snprintf(in->dir, sizeof(in->dir), "%s", abs); /* what `strata down --dir` gets too */
    if (!in->topo && !(in->topo = calloc(1, sizeof(*in->topo))))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    char path[sizeof(in->dir) + 16];
    snprintf(path, sizeof(path), "%s/topology", in->dir);
    st_code rc = st_topology_load(path, in->topo, err);
    if (rc == ST_OK && (in->topo->n_clusters == 0 || in->topo->n_routers == 0))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "%s names no cluster or no router: the bench measures through a router",
                        path);
    return rc;
}

st_code bench_inst_up(bench_inst *in, const char *tmp, uint32_t clusters, uint32_t nodes,
                      st_err *err) {
    char log[PATH_MAX + 16], port[16], nc[16], nn[16], wait_s[16];
    snprintf(in->dir, sizeof(in->dir), "%s/instance", tmp);
    snprintf(in->tmp, sizeof(in->tmp), "%s", tmp);
    snprintf(log, sizeof(log), "%s/up.log", tmp);
    uint16_t p = free_port();
    if (p == 0)
        return st_err_set(err, ST_UNAVAILABLE, "no free loopback port for the router");
    snprintf(port, sizeof(port), "%u", p);
    snprintf(nc, sizeof(nc), "%u", clusters);
    snprintf(nn, sizeof(nn), "%u", nodes);
    snprintf(wait_s, sizeof(wait_s), "%d", BENCH_UP_WAIT_S);
    char *argv[BENCH_UP_ARGS_MAX] = {NULL,       "up",         "--dir", in->dir,   "--port",
                                     port,       "--clusters", nc,      "--nodes", nn,
                                     "--wait-s", wait_s,       NULL,    NULL};
    if (in->secure)
        argv[12] = "--secure";
    fprintf(stderr, "bench: strata up --dir %s --port %s --clusters %s --nodes %s%s\n", in->dir,
            port, nc, nn, in->secure ? " --secure" : "");
    in->started = true; /* even a failed start may have left processes: down cleans up */
    int rc = run_self(argv, log);
    if (rc != 0) {
        print_tail(log);
        return st_err_set(err, ST_UNAVAILABLE,
                          "strata up failed (exit status %d; its output above, in %s with "
                          "--keep-tmp)",
                          rc, log);
    }
    return bench_inst_load(in, in->dir, err);
}

void bench_inst_down(bench_inst *in, bool purge) {
    if (in->started) {
        char log[sizeof(in->tmp) + 32];
        snprintf(log, sizeof(log), "%s/down.log", in->tmp);
        char *argv[BENCH_UP_ARGS_MAX] = {NULL, "down", "--dir", in->dir, purge ? "--purge" : NULL,
                                         NULL};
        if (run_self(argv, log) != 0)
            fprintf(stderr, "bench: strata down --dir %s failed; see %s\n", in->dir, log);
        in->started = false;
    }
    free(in->topo);
    in->topo = NULL;
}

/* DIR/run/<name>.pid's pid, 0 when absent. */
static pid_t pid_read(const char *dir, const char *name) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/run/%s.pid", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long pid = 0;
    if (fscanf(f, "%ld", &pid) != 1 || pid <= 0 || pid > INT_MAX)
        pid = 0;
    fclose(f);
    return (pid_t)pid;
}

static void proc_add(bench_target *t, const char *dir, const char *name) {
    pid_t pid = pid_read(dir, name);
    if (pid == 0 || t->n_pids == BENCH_PIDS_MAX)
        return;
    t->pids[t->n_pids] = pid;
    snprintf(t->pid_names[t->n_pids], BENCH_PROC_NAME_MAX, "%.*s", BENCH_PROC_NAME_MAX - 1, name);
    t->n_pids++;
}

void bench_inst_procs(const bench_inst *in, bench_target *t, bool router, bool nodes) {
    if (router)
        proc_add(t, in->dir, "router");
    for (size_t c = 0; nodes && c < in->topo->n_clusters; c++)
        for (size_t n = 0; n < in->topo->clusters[c].n_nodes; n++) {
            char name[48];
            snprintf(name, sizeof(name), "%.20s-%u", in->topo->clusters[c].id, (unsigned)n);
            proc_add(t, in->dir, name);
        }
}
