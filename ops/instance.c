/* ops/instance.c — the on-disk conventions of a local instance (see instance.h): where its
 * directory is, process names, pid files, liveness and readiness checks, starting processes with
 * the command lines `strata up` uses, the partition file, log tails, disk use.
 * Everything here is best effort and bounded: it serves commands a person types. */
#include "instance.h"
#include "certs.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "paths.h"
#include "strata/internal/v1/replication.pb-c.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OPS_LOG_TAIL_BYTES_MAX 8192 /* read at most this much from a log's end */
#define OPS_LISTENERS_MAX 16        /* processes sharing one listening port (SO_REUSEPORT) */
#define OPS_LOCK_ATTEMPTS_MAX 8     /* DIR removed under a waiting lock (down --purge): lock anew */

bool ops_fmt(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

bool ops_inst_dir(const char *flag, char *out, size_t cap) {
    const char *home = getenv("HOME");
    const char *sh = getenv("STRATA_HOME");
    char given[OPS_PATH_MAX];
    int n;
    /* An empty --dir is a script's unset variable far more often than a wish for the default:
     * taken as the default, `strata down --dir "$DIR" --purge` deleted another instance. */
    if (flag && !*flag) {
        fprintf(stderr, "strata: --dir is empty (an unset variable?): give the instance's "
                        "directory, or leave --dir out for the default ($STRATA_HOME, else "
                        "~/.strata/local)\n");
        return false;
    }
    if (flag)
        n = snprintf(given, sizeof given, "%s", flag);
    else if (sh && *sh)
        n = snprintf(given, sizeof given, "%s", sh);
    else if (home && *home)
        n = snprintf(given, sizeof given, "%s/.strata/local", home);
    else {
        fprintf(stderr, "strata: neither --dir, $STRATA_HOME nor $HOME is set: pass --dir DIR\n");
        return false;
    }
    /* Absolute, so the topology records absolute data directories and every command (down
     * --purge, status, chaos, bench), from any working directory, sees the same instance. */
    if (n < 0 || (size_t)n >= sizeof given || !ops_path_absolute(given, out, cap) ||
        (n = (int)strlen(out)) > OPS_DIR_MAX) {
        fprintf(stderr,
                "strata: instance directory path is too long (max %d once made absolute), or "
                "the working directory is unknown: use a shorter --dir\n",
                OPS_DIR_MAX);
        return false;
    }
    ops_secure_use(out); /* a secure instance: the commands' calls carry its credentials */
    return true;
}

bool ops_inst_topology(const char *cmd, const char *flag, st_topology *topo) {
    char dir[OPS_PATH_MAX], path[OPS_PATH_MAX];
    st_err err = {0};
    if (!ops_inst_dir(flag, dir, sizeof dir) || !ops_fmt(path, sizeof path, "%s/topology", dir))
        return false;
    if (st_topology_load(path, topo, &err) == ST_OK && topo->n_routers > 0)
        return true;
    fprintf(stderr,
            "%s: %s (is there an instance in %s? `strata up`, or give --endpoint HOST:PORT)\n", cmd,
            err.msg[0] ? err.msg : "no router in the topology", dir);
    return false;
}

void ops_inst_node_name(const st_topology *t, size_t i, size_t j, char out[OPS_NAME_MAX]) {
    snprintf(out, OPS_NAME_MAX, "%s-%zu", t->clusters[i].id, j);
}

void ops_inst_router_name(size_t r, char out[OPS_NAME_MAX]) {
    if (r == 0)
        snprintf(out, OPS_NAME_MAX, "router");
    else
        snprintf(out, OPS_NAME_MAX, "router-%zu", r);
}

static void pid_path(const char *dir, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/run/%s.pid", dir, name);
}

pid_t ops_inst_pid_read(const char *dir, const char *name) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    pid_path(dir, name, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    long v = 0;
    if (fscanf(f, "%ld", &v) != 1 || v <= 0 || v > 0x7fffffffL)
        v = 0;
    fclose(f);
    return (pid_t)v;
}

bool ops_inst_pid_write(const char *dir, const char *name, pid_t pid) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16], tmp[OPS_PATH_MAX + OPS_NAME_MAX + 24];
    pid_path(dir, name, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = ops_fopen_private(tmp);
    if (!f)
        return false;
    bool ok = fprintf(f, "%ld\n", (long)pid) > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return false;
    }
    return true;
}

void ops_inst_pid_remove(const char *dir, const char *name) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    pid_path(dir, name, path, sizeof path);
    unlink(path);
}

void ops_inst_pid_remove_if(const char *dir, const char *name, pid_t pid) {
    if (ops_inst_pid_read(dir, name) == pid)
        ops_inst_pid_remove(dir, name);
}

/* Whether fd (an open directory) is still what dir names: `strata down --purge` removes DIR
 * while it holds the lock, and a command that waited on the removed directory's lock would
 * otherwise go on beside one that locks the directory made anew. */
static bool lock_current(int fd, const char *dir) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* One attempt: open (making dir first when create), flock, and check the lock is still on dir.
 * Returns the descriptor, -1 after a message, or -2 to try again (dir was removed or replaced
 * while this waited). */
static int lock_once(const char *dir, const char *who, bool create, bool *said) {
    if (create && mkdir(dir, OPS_DIR_MODE) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", who, dir, strerror(errno));
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            fprintf(stderr, "%s: no instance in %s: start one with `strata up`\n", who, dir);
        else
            fprintf(stderr, "%s: cannot open %s: %s\n", who, dir, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (!*said)
            printf("Waiting for another `strata up`, `strata down`, `strata restart` or `strata "
                   "chaos` in %s to finish...\n",
                   dir);
        *said = true;
        fflush(stdout);
        if (flock(fd, LOCK_EX) != 0) {
            fprintf(stderr, "%s: cannot lock %s: %s\n", who, dir, strerror(errno));
            close(fd);
            return -1;
        }
    }
    if (lock_current(fd, dir))
        return fd;
    close(fd);
    return -2;
}

int ops_inst_lock(const char *dir, const char *who, bool create) {
    bool said = false;
    for (int attempt = 0; attempt < OPS_LOCK_ATTEMPTS_MAX; attempt++) {
        int fd = lock_once(dir, who, create, &said);
        if (fd != -2)
            return fd;
    }
    fprintf(stderr, "%s: %s keeps being removed and made again: try again\n", who, dir);
    return -1;
}

/* What /proc says of process pid: *ours when its command starts "strata", *leaving when it is on
 * its way out (SIGKILL pending, or exiting: PF_EXITING, zombies included), *busy while threads
 * other than a zombie leader remain (they still hold its files, its data directory lock among
 * them), *state its state letter (R, S, D, T...). False without /proc. */
static bool pid_proc_state(pid_t pid, bool *ours, bool *leaving, bool *busy, char *state_out) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid pgrp session tty tpgid flags ..." */
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close || close < open || close[1] != ' ')
        return false;
    char state = close[2];
    *state_out = state;
    unsigned long flags = 0;
    if (sscanf(close + 3, "%*d %*d %*d %*d %*d %lu", &flags) != 1)
        return false;
    *ours = strncmp(open + 1, "strata", 6) == 0;
    *leaving = state == 'Z' || state == 'X' || (flags & 0x4) != 0; /* PF_EXITING */
    long threads = 1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if ((f = fopen(path, "r"))) {
        unsigned long long sig = 0, shd = 0;
        while (fgets(buf, sizeof buf, f)) {
            (void)(sscanf(buf, "Threads: %ld", &threads) || sscanf(buf, "SigPnd: %llx", &sig) ||
                   sscanf(buf, "ShdPnd: %llx", &shd));
        }
        fclose(f);
        *leaving = *leaving || ((sig | shd) & (1ull << (SIGKILL - 1))) != 0;
    }
    *busy = state != 'Z' || threads > 1;
    return true;
}

bool ops_inst_pid_alive(pid_t pid) {
    if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
        return false;
    bool ours, leaving, busy;
    char state;
    if (!pid_proc_state(pid, &ours, &leaving, &busy, &state))
        return true;         /* no /proc: trust kill() */
    return ours && !leaving; /* one killed with SIGKILL lives on for a moment: it has stopped */
}

bool ops_inst_pid_stopped(pid_t pid) {
    bool ours, leaving, busy;
    char state = 0;
    return pid > 0 && pid_proc_state(pid, &ours, &leaving, &busy, &state) &&
           (state == 'T' || state == 't');
}

bool ops_inst_all_stopped(const char *dir, const st_topology *t) {
    char path[OPS_PATH_MAX + 8], name[OPS_NAME_MAX];
    struct stat st;
    if (!ops_fmt(path, sizeof path, "%s/run", dir) || stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            ops_inst_node_name(t, i, j, name);
            if (ops_inst_pid_alive(ops_inst_pid_read(dir, name)))
                return false;
        }
    for (size_t r = 0; r < t->n_routers; r++) {
        ops_inst_router_name(r, name);
        if (ops_inst_pid_alive(ops_inst_pid_read(dir, name)))
            return false;
    }
    return true;
}

int ops_inst_term(pid_t pid) {
    int rc = kill(pid, SIGTERM), e = errno;
    if (rc == 0)
        kill(pid, SIGCONT);
    errno = e;
    return rc;
}

bool ops_inst_pid_wait_gone(pid_t pid, int wait_ms) {
    struct timespec nap = {0, OPS_POLL_MS * 1000000L};
    for (int ms = 0;; ms += OPS_POLL_MS) {
        bool ours, leaving, busy;
        char state;
        if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM) ||
            !pid_proc_state(pid, &ours, &leaving, &busy, &state) || !ours || !busy)
            return true;
        if (ms >= wait_ms)
            return false;
        nanosleep(&nap, NULL);
    }
}

size_t ops_inst_pid_names(const char *dir, char names[][OPS_NAME_MAX], size_t max) {
    char run[OPS_PATH_MAX + 8];
    snprintf(run, sizeof run, "%s/run", dir);
    DIR *d = opendir(run);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while (n < max && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 4 || l - 4 >= OPS_NAME_MAX || strcmp(e->d_name + l - 4, ".pid"))
            continue;
        memcpy(names[n], e->d_name, l - 4);
        names[n][l - 4] = '\0';
        n++;
    }
    closedir(d);
    return n;
}

st_code ops_inst_node_status(const char *addr, st_buf *resp, bool *serving) {
    st_err status = {0};
    st_code rc = rpc_blocking_unary(addr, ops_secure_node_opts(addr),
                                    "/strata.internal.v1.Node/GetStatus", st_slice_make("", 0),
                                    NULL, 0, OPS_NODE_STATUS_TIMEOUT_MS, resp, &status);
    *serving = rc == ST_OK || rc == ST_UNIMPLEMENTED;
    return rc;
}

st_code ops_inst_router_ping(const st_topology *t, const char *addr) {
    char name[ST_TOPO_ID_MAX * 2 + 32];
    snprintf(name, sizeof name, "projects/%s/instances/%s", t->project, t->instance);
    Google__Bigtable__V2__PingAndWarmRequest req =
        GOOGLE__BIGTABLE__V2__PING_AND_WARM_REQUEST__INIT;
    req.name = name;
    uint8_t buf[sizeof name + 16];
    size_t len = google__bigtable__v2__ping_and_warm_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    size_t n_md;
    const rpc_metadata *md = ops_secure_md(&n_md);
    st_code rc = rpc_blocking_unary(
        addr, ops_secure_router_opts(), "/google.bigtable.v2.Bigtable/PingAndWarm",
        st_slice_make(buf, len), md, n_md, OPS_NODE_STATUS_TIMEOUT_MS, &resp, NULL);
    st_buf_free(&resp);
    return rc;
}

bool ops_inst_not_answering(st_code rc, const char *addr) {
    /* A hung or stopped process still has its listening socket: the kernel accepts the
     * connection and the call waits out its deadline. No connection at all from a live process:
     * it is starting, or closed its listener. */
    return rc == ST_DEADLINE_EXCEEDED || (rc == ST_UNAVAILABLE && !ops_inst_tcp_ready(addr, 500));
}

const char *ops_inst_ended_said(int status, char *out, size_t cap) {
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ)
        snprintf(out, cap,
                 "was killed by signal %d (SIGXFSZ: a write passed the file-size limit set by "
                 "`ulimit -f`; raise it, e.g. `ulimit -f unlimited`)",
                 SIGXFSZ);
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, cap, "ended (wait status %d)", status);
    return out;
}

bool ops_inst_router_pick(const char *cmd, const st_topology *t, const char *dir_flag, char *out,
                          size_t cap) {
    if (t->n_routers == 1) { /* no other to try: the command's own call says why it fails */
        snprintf(out, cap, "%s", t->routers[0]);
        return true;
    }
    char why[ST_TOPO_ROUTERS_MAX][48];
    for (size_t r = 0; r < t->n_routers; r++) {
        st_code rc = ops_inst_router_ping(t, t->routers[r]);
        /* Any answer of the router itself will do: a refused token or TLS trouble is said by
         * the command's own call, with what to pass. */
        if (!ops_inst_not_answering(rc, t->routers[r])) {
            snprintf(out, cap, "%s", t->routers[r]);
            return true;
        }
        if (rc == ST_DEADLINE_EXCEEDED)
            snprintf(why[r], sizeof why[r], "no answer within %d s",
                     OPS_NODE_STATUS_TIMEOUT_MS / 1000);
        else
            snprintf(why[r], sizeof why[r], "nothing listens");
    }
    snprintf(out, cap, "%s", t->routers[0]);
    if (!cmd)
        return false;
    char dir[OPS_PATH_MAX];
    if (!ops_inst_dir(dir_flag, dir, sizeof dir))
        snprintf(dir, sizeof dir, "DIR");
    fprintf(stderr, "%s: none of the instance's %zu routers answers:", cmd, t->n_routers);
    for (size_t r = 0; r < t->n_routers; r++) {
        char name[OPS_NAME_MAX];
        ops_inst_router_name(r, name);
        fprintf(stderr, "%s %s %s (%s)", r ? ";" : "", name, t->routers[r], why[r]);
    }
    fprintf(stderr,
            ". Start them with `strata up --dir %s` (`strata status --dir %s` shows "
            "them), then run this again\n",
            dir, dir);
    return false;
}

/* Non-blocking connect bounded by timeout_ms; the host is resolved once (loopback in practice). */
bool ops_inst_tcp_ready(const char *addr, int timeout_ms) {
    char host[ST_TOPO_ADDR_MAX + 1], port_s[8];
    uint16_t port;
    if (!st_addr_split(addr, host, sizeof host, &port) || port == 0)
        return false;
    snprintf(port_s, sizeof port_s, "%u", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, port_s, &hints, &res) != 0 || !res)
        return false;
    bool ok = false;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc == 0)
            ok = true;
        else if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            ok = poll(&p, 1, timeout_ms) == 1 &&
                 getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

/* The last OPS_LOG_TAIL_BYTES_MAX bytes of path into buf (which holds one more, for the NUL),
 * trailing newlines cut; their length, or -1 when path cannot be opened. */
static long log_tail_read(const char *path, char *buf) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long start = 0;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        start = size > OPS_LOG_TAIL_BYTES_MAX ? size - OPS_LOG_TAIL_BYTES_MAX : 0;
    }
    fseek(f, start, SEEK_SET);
    size_t n = fread(buf, 1, OPS_LOG_TAIL_BYTES_MAX, f);
    fclose(f);
    buf[n] = '\0';
    while (n && buf[n - 1] == '\n')
        buf[--n] = '\0';
    return (long)n;
}

void ops_inst_log_tail(const char *path, int lines) {
    static char buf[OPS_LOG_TAIL_BYTES_MAX + 1]; /* CLI only: one caller at a time */
    long got = log_tail_read(path, buf);
    if (got < 0) {
        fprintf(stderr, "    (no log at %s)\n", path);
        return;
    }
    size_t n = (size_t)got;
    if (n == 0) {
        fprintf(stderr, "    (%s is empty)\n", path);
        return;
    }
    size_t pos = n;
    for (int seen = 0; pos > 0; pos--)
        if (buf[pos - 1] == '\n' && ++seen == lines)
            break;
    fprintf(stderr, "    --- last lines of %s ---\n", path);
    for (char *line = buf + pos, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        fprintf(stderr, "    %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
    }
}

bool ops_inst_log_start_state(const char *dir, const char *name, bool *listened, char *last,
                              size_t cap) {
    static char buf[OPS_LOG_TAIL_BYTES_MAX + 1]; /* CLI only: one caller at a time */
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    long n =
        ops_fmt(path, sizeof path, "%s/logs/%s.log", dir, name) ? log_tail_read(path, buf) : -1;
    if (n < 0)
        return false;
    /* The latest start is the last "=== <time> <who> starts <name>" line (ops_inst_spawn). */
    char *from = buf;
    for (char *p = buf; (p = strstr(p, "\n=== ")); p++)
        from = p + 1;
    *listened = strstr(from, " listening on ") != NULL;
    char *line = strrchr(from, '\n');
    line = line ? line + 1 : from;
    snprintf(last, cap, "%.*s", (int)strcspn(line, "\r\n"), line);
    return true;
}

/* nftw has no user argument; the CLI is single-threaded. */
static unsigned long long disk_total;
typedef struct disk_link {
    dev_t dev;
    ino_t ino;
    unsigned long long bytes;
} disk_link;
static disk_link *disk_links; /* files of several links: counted once at the end */
static size_t disk_n_links, disk_cap_links;

static int disk_visit(const char *p, const struct stat *st, int type, struct FTW *ftw) {
    (void)p;
    (void)ftw;
    if (type != FTW_F)
        return 0;
    unsigned long long bytes = (unsigned long long)st->st_blocks * 512ULL;
    if (st->st_nlink < 2) {
        disk_total += bytes;
        return 0;
    }
    if (disk_n_links == disk_cap_links) {
        size_t cap = disk_cap_links ? disk_cap_links * 2 : 256;
        disk_link *v = realloc(disk_links, cap * sizeof *v);
        if (!v) { /* out of memory: counted as often as it is met */
            disk_total += bytes;
            return 0;
        }
        disk_links = v;
        disk_cap_links = cap;
    }
    disk_links[disk_n_links++] = (disk_link){st->st_dev, st->st_ino, bytes};
    return 0;
}

static int link_cmp(const void *pa, const void *pb) {
    const disk_link *a = pa, *b = pb;
    if (a->dev != b->dev)
        return a->dev < b->dev ? -1 : 1;
    return (a->ino > b->ino) - (a->ino < b->ino);
}

/* As du: a file hard-linked several times (backups, restored tables and split children share
 * SSTables) counts once, or a node's data would read many times what its disk holds. A data
 * directory that is itself a symbolic link (the usual way to put a node on a disk of its own) is
 * followed; links inside it are not (FTW_PHYS), as the node never makes any. */
unsigned long long ops_inst_disk_bytes(const char *path) {
    disk_total = 0;
    disk_n_links = 0;
    char *real = realpath(path, NULL);
    nftw(real ? real : path, disk_visit, 16, FTW_PHYS);
    free(real);
    if (disk_n_links)
        qsort(disk_links, disk_n_links, sizeof *disk_links, link_cmp);
    for (size_t i = 0; i < disk_n_links; i++)
        if (i == 0 || link_cmp(&disk_links[i - 1], &disk_links[i]) != 0)
            disk_total += disk_links[i].bytes;
    free(disk_links);
    disk_links = NULL;
    disk_n_links = disk_cap_links = 0;
    return disk_total;
}

void ops_inst_fmt_bytes(unsigned long long v, char *out, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    size_t u = 0;
    while (d >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%llu B", v);
    else
        snprintf(out, cap, "%.1f %s", d, units[u]);
}

/* ---- starting processes ---- */

/* Appends --metrics ADDR from DIR/run/<name>.metrics when present. */
static void cmdline_metrics(ops_cmdline *cl, const char *dir, const char *name, size_t *n) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    snprintf(path, sizeof path, "%s/run/%s.metrics", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    bool ok = fgets(cl->metrics_addr, sizeof cl->metrics_addr, f) != NULL;
    fclose(f);
    cl->metrics_addr[strcspn(cl->metrics_addr, "\r\n")] = '\0';
    if (ok && cl->metrics_addr[0]) {
        cl->argv[(*n)++] = "--metrics";
        cl->argv[(*n)++] = cl->metrics_addr;
    }
}

bool ops_inst_no_unix_write(const char *dir, bool no_unix) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run/no-unix", dir);
    if (!no_unix)
        return unlink(path) == 0 || errno == ENOENT;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, OPS_FILE_MODE);
    return fd >= 0 && close(fd) == 0;
}

bool ops_inst_no_unix(const char *dir) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run/no-unix", dir);
    return access(path, F_OK) == 0;
}

/* DIR/secure/<file>, when the instance is secure, into buf. */
static bool cmdline_secure_file(const char *dir, const char *file, char *buf, size_t cap) {
    return ops_fmt(buf, cap, "%s/%s/%s", dir, OPS_SECURE_SUBDIR, file);
}

static bool cmdline_secure(const char *dir) {
    char ca[OPS_PATH_MAX + 32];
    return cmdline_secure_file(dir, "ca.pem", ca, sizeof ca) && access(ca, F_OK) == 0;
}

static void cmdline_node_tls(ops_cmdline *cl, const char *dir, const char *name, size_t *n) {
    if (!cmdline_secure(dir))
        return;
    char file[OPS_NAME_MAX + 8];
    snprintf(file, sizeof file, "%s.pem", name);
    cmdline_secure_file(dir, file, cl->tls[0], sizeof cl->tls[0]);
    snprintf(file, sizeof file, "%s.key", name);
    cmdline_secure_file(dir, file, cl->tls[1], sizeof cl->tls[1]);
    cmdline_secure_file(dir, "ca.pem", cl->tls[2], sizeof cl->tls[2]);
    const char *flags[] = {"--tls-cert", "--tls-key", "--tls-ca"};
    for (size_t k = 0; k < 3; k++) {
        cl->argv[(*n)++] = (char *)flags[k];
        cl->argv[(*n)++] = cl->tls[k];
    }
}

/* Whether the router binary takes --auth-file (its usage text holds the flag): a router built
 * without token checks refuses unknown flags, and a secure instance must still start with one
 * (TLS only; `strata up --secure` then says the tokens are not checked). */
bool ops_router_takes_auth(const char *bin) {
    static const char flag[] = "--auth-file FILE";
    FILE *f = bin ? fopen(bin, "rb") : NULL;
    if (!f)
        return false;
    char buf[65536 + sizeof flag];
    size_t keep = 0, n;
    bool found = false;
    while (!found && (n = fread(buf + keep, 1, sizeof buf - keep, f)) > 0) {
        size_t len = keep + n;
        found = memmem(buf, len, flag, sizeof flag - 1) != NULL;
        keep = len < sizeof flag - 1 ? len : sizeof flag - 1; /* a match across two reads */
        memmove(buf, buf + len - keep, keep);
    }
    fclose(f);
    return found;
}

/* The router serves its public port with router.pem (valid for localhost and 127.0.0.1, signed
 * by the CA clients trust) and presents the same certificate to the nodes. */
static void cmdline_router_tls(ops_cmdline *cl, const char *dir, size_t *n) {
    if (!cmdline_secure(dir))
        return;
    cmdline_secure_file(dir, "router.pem", cl->tls[0], sizeof cl->tls[0]);
    cmdline_secure_file(dir, "router.key", cl->tls[1], sizeof cl->tls[1]);
    cmdline_secure_file(dir, "ca.pem", cl->tls[2], sizeof cl->tls[2]);
    const char *flags[] = {"--tls-cert", "--tls-key", "--internal-ca"};
    for (size_t k = 0; k < 3; k++) {
        cl->argv[(*n)++] = (char *)flags[k];
        cl->argv[(*n)++] = cl->tls[k];
    }
    /* Principals and tokens: made by ops_auth_bootstrap (`strata up --secure`). */
    cmdline_secure_file(dir, "principals", cl->tls[3], sizeof cl->tls[3]);
    if (access(cl->tls[3], F_OK) != 0 || !ops_router_takes_auth(cl->argv[0]))
        return;
    ops_fmt(cl->tls[4], sizeof cl->tls[4], "%s/logs/audit.log", dir);
    cl->argv[(*n)++] = "--auth-file";
    cl->argv[(*n)++] = cl->tls[3];
    cl->argv[(*n)++] = "--audit-log";
    cl->argv[(*n)++] = cl->tls[4];
}

void ops_inst_node_cmdline(ops_cmdline *cl, const char *dir, const char *bin, const st_topology *t,
                           size_t i, size_t j) {
    const char **a = (const char **)cl->argv;
    size_t n = 0;
    const st_topo_cluster *c = &t->clusters[i];
    snprintf(cl->topo_path, sizeof cl->topo_path, "%s/topology", dir);
    snprintf(cl->nums[0], sizeof cl->nums[0], "%u", c->nodes[j].num);
    snprintf(cl->nums[1], sizeof cl->nums[1], "%u", c->num);
    a[n++] = bin;
    a[n++] = "--data";
    a[n++] = c->nodes[j].data_dir;
    a[n++] = "--listen";
    a[n++] = c->nodes[j].addr;
    a[n++] = "--node-num";
    a[n++] = cl->nums[0];
    a[n++] = "--cluster-num";
    a[n++] = cl->nums[1];
    a[n++] = "--config"; /* peers to replicate with (docs/formats/replication.md) */
    a[n++] = cl->topo_path;
    if (t->split_bytes > 0) { /* the topology's: --split-bytes, stored at a start */
        snprintf(cl->nums[2], sizeof cl->nums[2], "%lld", (long long)t->split_bytes);
        a[n++] = "--split-bytes";
        a[n++] = cl->nums[2];
    }
    /* Routers on this host then skip TCP/IP for this node (docs/router.md, Unix sockets). */
    if (!ops_inst_no_unix(dir) &&
        st_topo_node_sock_path(c->nodes[j].data_dir, cl->unix_path, sizeof cl->unix_path)) {
        a[n++] = "--unix";
        a[n++] = cl->unix_path;
    }
    char name[OPS_NAME_MAX];
    ops_inst_node_name(t, i, j, name);
    cmdline_metrics(cl, dir, name, &n);
    cmdline_node_tls(cl, dir, name, &n);
    a[n] = NULL;
}

void ops_inst_router_cmdline(ops_cmdline *cl, const char *dir, const char *bin,
                             const st_topology *t, size_t r) {
    const char **a = (const char **)cl->argv;
    size_t n = 0;
    snprintf(cl->topo_path, sizeof cl->topo_path, "%s/topology", dir);
    a[n++] = bin;
    a[n++] = "--config";
    a[n++] = cl->topo_path;
    a[n++] = "--listen";
    a[n++] = t->routers[r];
    char name[OPS_NAME_MAX];
    ops_inst_router_name(r, name);
    cmdline_metrics(cl, dir, name, &n);
    cmdline_router_tls(cl, dir, &n);
    a[n] = NULL;
}

bool ops_inst_log_says(const char *dir, const char *name, long offset, const char *a,
                       const char *b) {
    char path[OPS_PATH_MAX + OPS_NAME_MAX + 16], buf[4096];
    int w = snprintf(path, sizeof path, "%s/logs/%s.log", dir, name);
    FILE *f = w > 0 && (size_t)w < sizeof path ? fopen(path, "r") : NULL;
    if (!f)
        return false;
    fseek(f, offset, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, a) && (!b || strstr(buf, b));
}

pid_t ops_inst_spawn(const char *dir, const char *name, char *const argv[], const char *who,
                     long *log_offset) {
    char log_path[OPS_PATH_MAX + OPS_NAME_MAX + 16];
    snprintf(log_path, sizeof log_path, "%s/logs/%s.log", dir, name);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, OPS_FILE_MODE);
    if (fd >= 0)
        (void)fchmod(fd, OPS_FILE_MODE); /* a log made before logs were owner-only */
    if (fd < 0) {
        fprintf(stderr, "%s: cannot open %s: %s\n", who, log_path, strerror(errno));
        return 0;
    }
    struct stat st;
    *log_offset = fstat(fd, &st) == 0 ? (long)st.st_size : 0;
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    dprintf(fd, "=== %s %s starts %s: ", when, who, name);
    for (size_t i = 0; argv[i]; i++)
        dprintf(fd, "%s%s", i ? " " : "", argv[i]);
    dprintf(fd, "\n");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0)
            dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        dprintf(2, "%s: cannot run %s: %s\n", who, argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    if (pid < 0) {
        fprintf(stderr, "%s: cannot start %s: %s\n", who, name, strerror(errno));
        return 0;
    }
    if (!ops_inst_pid_write(dir, name, pid))
        fprintf(stderr,
                "%s: warning: cannot write %s/run/%s.pid: `strata down` will not find this "
                "process\n",
                who, dir, name);
    return pid;
}

/* Whether pid is what listens on addr's port. Another program that took the port while the
 * process was stopped answers the connect too, and the new process then exits ("Address already
 * in use") a moment later: counting that as ready reported a dead node as started. When /proc
 * shows no listener at all (not readable), the connect is trusted. */
static bool listener_is(pid_t pid, const char *addr) {
    char host[ST_TOPO_ADDR_MAX + 1];
    uint16_t port;
    pid_t pids[OPS_LISTENERS_MAX];
    if (!st_addr_split(addr, host, sizeof host, &port))
        return true;
    size_t n = ops_proc_find_listeners(port, pids, OPS_LISTENERS_MAX);
    for (size_t i = 0; i < n; i++)
        if (pids[i] == pid)
            return true;
    return n == 0;
}

ops_wait ops_inst_wait_ready(const char *dir, const char *name, pid_t pid, const char *addr,
                             int wait_s, int *status) {
    struct timespec nap = {0, OPS_POLL_MS * 1000000L};
    long waited_ms = 0, next_note_ms = OPS_PROGRESS_EVERY_S * 1000L;
    for (;;) {
        if (waitpid(pid, status, WNOHANG) == pid)
            return OPS_EXITED;
        if (ops_inst_tcp_ready(addr, 200) && listener_is(pid, addr)) {
            /* The port answers; make sure it is our process answering, still alive. */
            if (waitpid(pid, status, WNOHANG) == pid)
                return OPS_EXITED;
            return OPS_READY;
        }
        if (waited_ms >= (long)wait_s * 1000L)
            return OPS_TIMEOUT;
        if (waited_ms >= next_note_ms) {
            printf("  ... still waiting for %s to listen on %s (%lds of %ds; log %s/logs/%s.log)\n",
                   name, addr, waited_ms / 1000, wait_s, dir, name);
            fflush(stdout);
            next_note_ms += OPS_PROGRESS_EVERY_S * 1000L;
        }
        nanosleep(&nap, NULL);
        waited_ms += OPS_POLL_MS;
    }
}

/* ---- the partition file ---- */

static void partition_path(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/run/partition", dir);
}

bool ops_inst_partition_read(const char *dir, ops_partition *out) {
    char path[OPS_PATH_MAX + 16], line[2 * ST_TOPO_ID_MAX + 8];
    partition_path(dir, path, sizeof path);
    out->n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT;
    bool ok = true;
    while (fgets(line, sizeof line, f)) {
        char a[ST_TOPO_ID_MAX + 1], b[ST_TOPO_ID_MAX + 1];
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%63s %63s", a, b) != 2 || out->n == OPS_PARTITION_PAIRS_MAX) {
            ok = false;
            break;
        }
        memcpy(out->a[out->n], a, sizeof a);
        memcpy(out->b[out->n], b, sizeof b);
        out->n++;
    }
    fclose(f);
    return ok;
}

bool ops_inst_partition_write(const char *dir, const ops_partition *p) {
    char path[OPS_PATH_MAX + 16], tmp[OPS_PATH_MAX + 24];
    partition_path(dir, path, sizeof path);
    if (p->n == 0)
        return unlink(path) == 0 || errno == ENOENT;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = ops_fopen_private(tmp);
    if (!f)
        return false;
    bool ok = fprintf(f, "# replication links cut by `strata chaos partition`; `strata chaos "
                         "heal` restores them\n") > 0;
    for (size_t i = 0; i < p->n; i++)
        ok = ok && fprintf(f, "%s %s\n", p->a[i], p->b[i]) > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return false;
    }
    return true;
}

bool ops_inst_partition_cut(const ops_partition *p, const char *x, const char *y) {
    for (size_t i = 0; i < p->n; i++)
        if ((!strcmp(p->a[i], x) && !strcmp(p->b[i], y)) ||
            (!strcmp(p->a[i], y) && !strcmp(p->b[i], x)))
            return true;
    return false;
}

/* ---- cut replication links ---- */

int ops_inst_set_links(const st_topology *t, const ops_partition *part, size_t i, size_t j,
                       bool quiet) {
    const st_topo_cluster *cl = &t->clusters[i];
    char *ids[ST_TOPO_CLUSTERS_MAX];
    Strata__Internal__V1__SetLinksRequest req = STRATA__INTERNAL__V1__SET_LINKS_REQUEST__INIT;
    for (size_t k = 0; k < t->n_clusters; k++)
        if (k != i && ops_inst_partition_cut(part, cl->id, t->clusters[k].id))
            ids[req.n_cut_cluster_ids++] = (char *)t->clusters[k].id; /* not written */
    req.cut_cluster_ids = ids;
    uint8_t buf[ST_TOPO_CLUSTERS_MAX * (ST_TOPO_ID_MAX + 4) + 16];
    size_t len = strata__internal__v1__set_links_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    char name[OPS_NAME_MAX];
    ops_inst_node_name(t, i, j, name);
    st_code rc =
        rpc_blocking_unary(cl->nodes[j].addr, ops_secure_node_opts(cl->nodes[j].addr),
                           "/strata.internal.v1.Replication/SetLinks", st_slice_make(buf, len),
                           NULL, 0, OPS_SET_LINKS_TIMEOUT_MS, &resp, &err);
    st_buf_free(&resp);
    if (rc == ST_OK) {
        if (!quiet) {
            printf("  %-12s links cut to:", name);
            for (size_t k = 0; k < req.n_cut_cluster_ids; k++)
                printf(" %s", ids[k]);
            printf("%s\n", req.n_cut_cluster_ids ? "" : " none");
        }
        return 0;
    }
    if (rc == ST_UNAVAILABLE || rc == ST_DEADLINE_EXCEEDED)
        return -1; /* the caller knows what that means for its command */
    fprintf(stderr, "strata: %s (%s) refused SetLinks: %s: %s%s\n", name, cl->nodes[j].addr,
            st_code_name(rc), err.msg,
            rc == ST_UNIMPLEMENTED ? " (a strata-node built without replication?)" : "");
    return 1;
}
