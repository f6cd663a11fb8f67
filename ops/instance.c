/* ops/instance.c — the on-disk conventions of a local instance (see instance.h): where its
 * directory is, process names, pid files, liveness and readiness checks, log tails, disk use.
 * Everything here is best effort and bounded: it serves commands a person types. */
#include "instance.h"

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
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPS_LOG_TAIL_BYTES_MAX 8192 /* read at most this much from a log's end */

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
    int n;
    if (flag && *flag)
        n = snprintf(out, cap, "%s", flag);
    else if (sh && *sh)
        n = snprintf(out, cap, "%s", sh);
    else if (home && *home)
        n = snprintf(out, cap, "%s/.strata/local", home);
    else {
        fprintf(stderr, "strata: neither --dir, $STRATA_HOME nor $HOME is set: pass --dir DIR\n");
        return false;
    }
    if (n < 0 || (size_t)n >= cap || n > OPS_DIR_MAX) {
        fprintf(stderr,
                "strata: instance directory path is too long (max %d): use a shorter "
                "--dir\n",
                OPS_DIR_MAX);
        return false;
    }
    while (n > 1 && out[n - 1] == '/') /* "DIR/" and "DIR" are the same instance */
        out[--n] = '\0';
    return true;
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
    FILE *f = fopen(tmp, "w");
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

bool ops_inst_pid_alive(pid_t pid) {
    if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
        return false;
    char path[64], cmd[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true; /* no /proc: trust kill() */
    size_t n = fread(cmd, 1, sizeof cmd - 1, f);
    fclose(f);
    cmd[n] = '\0';
    /* "pid (comm) state ...": a zombie (state Z) has already stopped. */
    char *open = strchr(cmd, '('), *close = strrchr(cmd, ')');
    if (!open || !close || close < open)
        return true;
    if (close[1] == ' ' && close[2] == 'Z')
        return false;
    return strncmp(open + 1, "strata", 6) == 0;
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

void ops_inst_log_tail(const char *path, int lines) {
    static char buf[OPS_LOG_TAIL_BYTES_MAX + 1]; /* CLI only: one caller at a time */
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "    (no log at %s)\n", path);
        return;
    }
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

static unsigned long long disk_total; /* nftw has no user argument; CLI is single-threaded */

static int disk_visit(const char *p, const struct stat *st, int type, struct FTW *ftw) {
    (void)p;
    (void)ftw;
    if (type == FTW_F)
        disk_total += (unsigned long long)st->st_blocks * 512ULL;
    return 0;
}

unsigned long long ops_inst_disk_bytes(const char *path) {
    disk_total = 0;
    nftw(path, disk_visit, 16, FTW_PHYS);
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
