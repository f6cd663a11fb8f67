/* ops/listeners.c — which local processes listen on a TCP port, from /proc/net/tcp{,6} and the
 * /proc/PID/fd links this user may read (paths.h): `strata bench --target` finds the server to
 * measure, and `strata up`, `restart` and `chaos` tell their own new process from another program
 * that already held its port. Best effort: a process we may not inspect is not found. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paths.h"

#define PROC_LINE_BYTES_MAX 1024
#define PROC_INODES_MAX 64 /* listening sockets on one port (SO_REUSEPORT groups) */

/* Inodes of sockets in state LISTEN (0A) on the port, from one /proc/net/tcp* table. */
static size_t listen_inodes(const char *table, uint16_t port, unsigned long *inodes, size_t n,
                            size_t max) {
    FILE *f = fopen(table, "r");
    if (!f)
        return n;
    char line[PROC_LINE_BYTES_MAX];
    if (!fgets(line, sizeof(line), f)) { /* header */
        fclose(f);
        return n;
    }
    while (n < max && fgets(line, sizeof(line), f)) {
        char local[128];
        unsigned state;
        unsigned long inode;
        if (sscanf(line, "%*s %127s %*s %x %*s %*s %*s %*s %*s %lu", local, &state, &inode) != 3)
            continue;
        char *colon = strrchr(local, ':');
        if (!colon || state != 0x0A || strtoul(colon + 1, NULL, 16) != port || inode == 0)
            continue;
        inodes[n++] = inode;
    }
    fclose(f);
    return n;
}

static bool pid_has_socket(const char *pid_dir, const unsigned long *inodes, size_t n) {
    char path[300];
    snprintf(path, sizeof(path), "/proc/%s/fd", pid_dir);
    DIR *d = opendir(path);
    if (!d)
        return false; /* not ours to look at */
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char link[600], target[64];
        snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
        ssize_t len = readlink(link, target, sizeof(target) - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        unsigned long ino;
        if (sscanf(target, "socket:[%lu]", &ino) != 1)
            continue;
        for (size_t i = 0; i < n && !found; i++)
            found = inodes[i] == ino;
    }
    closedir(d);
    return found;
}

size_t ops_proc_find_listeners(uint16_t port, pid_t *pids, size_t max) {
    unsigned long inodes[PROC_INODES_MAX];
    size_t n = listen_inodes("/proc/net/tcp", port, inodes, 0, PROC_INODES_MAX);
    n = listen_inodes("/proc/net/tcp6", port, inodes, n, PROC_INODES_MAX);
    if (n == 0)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t found = 0;
    struct dirent *e;
    while (found < max && (e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        if (pid_has_socket(e->d_name, inodes, n))
            pids[found++] = (pid_t)pid;
    }
    closedir(d);
    return found;
}
