/* ops/proc.c — the bench's view of local processes: CPU seconds and peak RSS from /proc (the
 * processes listening on a TCP port are found by listeners.c), and starting / stopping the servers
 * it runs itself (the emulator, a strata-node). All best effort: a process we may not inspect is
 * simply not measured. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PROC_LINE_BYTES_MAX 1024
#define CHILD_STOP_GRACE_MS 5000
#define CHILD_POLL_MS 20
#define CHILD_LOG_TAIL_BYTES 300

bool ops_proc_stat_read(pid_t pid, ops_proc_stat *out) {
    memset(out, 0, sizeof(*out));
    char path[64], buf[PROC_LINE_BYTES_MAX];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields start after the last ')'. */
    char *p = strrchr(buf, ')');
    unsigned long utime = 0, stime = 0;
    if (!p ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
        return false;
    long tck = sysconf(_SC_CLK_TCK);
    out->cpu_s = (double)(utime + stime) / (double)(tck > 0 ? tck : 100);
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return true;
    while (fgets(buf, sizeof(buf), f)) {
        unsigned long long kb;
        if (sscanf(buf, "VmHWM: %llu", &kb) == 1)
            out->rss_peak_kb = kb;
        else if (sscanf(buf, "VmRSS: %llu", &kb) == 1)
            out->rss_kb = kb;
    }
    fclose(f);
    return true;
}

/* ---- child servers ---- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Looks for marker followed by HOST:PORT in the log; copies HOST:PORT into addr. */
static bool log_find_addr(const char *log_path, const char *marker, char *addr, size_t cap) {
    FILE *f = fopen(log_path, "r");
    if (!f)
        return false;
    char line[PROC_LINE_BYTES_MAX];
    bool ok = false;
    while (!ok && fgets(line, sizeof(line), f)) {
        char *m = strstr(line, marker);
        if (!m)
            continue;
        m += strlen(marker);
        size_t len = strcspn(m, " \t\r\n");
        if (len == 0 || len >= cap || !memchr(m, ':', len))
            continue;
        memcpy(addr, m, len);
        addr[len] = '\0';
        ok = true;
    }
    fclose(f);
    return ok;
}

static void log_tail(const char *log_path, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen(log_path, "r");
    if (!f)
        return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        long from = size > (long)cap - 1 ? size - (long)cap + 1 : 0;
        if (fseek(f, from, SEEK_SET) == 0) {
            size_t n = fread(out, 1, cap - 1, f);
            out[n] = '\0';
        }
    }
    fclose(f);
}

static pid_t spawn(char *const argv[], const char *log_path) {
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600); /* owner-only, as data files */
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

st_code ops_child_start(ops_child *child, char *const argv[], const char *log_path,
                        const char *marker, int timeout_ms, st_err *err) {
    memset(child, 0, sizeof(*child));
    snprintf(child->log_path, sizeof(child->log_path), "%s", log_path);
    pid_t pid = spawn(argv, log_path);
    if (pid < 0)
        return st_err_set(err, ST_UNAVAILABLE, "cannot start %s: fork: %s", argv[0],
                          strerror(errno));
    child->pid = pid;
    char tail[CHILD_LOG_TAIL_BYTES];
    for (int waited = 0; waited <= timeout_ms; waited += CHILD_POLL_MS) {
        if (log_find_addr(log_path, marker, child->addr, sizeof(child->addr)))
            return ST_OK;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            child->pid = 0;
            log_tail(log_path, tail, sizeof(tail));
            return st_err_set(err, ST_UNAVAILABLE,
                              "%s exited before it was ready; its log (%s) "
                              "ends with: %s",
                              argv[0], log_path, tail);
        }
        sleep_ms(CHILD_POLL_MS);
    }
    log_tail(log_path, tail, sizeof(tail));
    ops_child_stop(child);
    return st_err_set(err, ST_UNAVAILABLE,
                      "%s printed no '%sHOST:PORT' line within %d ms; its "
                      "log (%s) ends with: %s",
                      argv[0], marker, timeout_ms, log_path, tail);
}

void ops_child_stop(ops_child *child) {
    if (child->pid <= 0)
        return;
    kill(child->pid, SIGTERM);
    int status;
    for (int waited = 0; waited < CHILD_STOP_GRACE_MS; waited += CHILD_POLL_MS) {
        if (waitpid(child->pid, &status, WNOHANG) == child->pid) {
            child->pid = 0;
            return;
        }
        sleep_ms(CHILD_POLL_MS);
    }
    kill(child->pid, SIGKILL);
    waitpid(child->pid, &status, 0);
    child->pid = 0;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void ops_remove_tree(const char *path) {
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}
