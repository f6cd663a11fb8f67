/* paths.c — finding the Strata binaries and making paths absolute, for every `strata` command
 * (paths.h). */
#include "paths.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool ops_executable(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* dir (dir_len bytes) + "/" + mid (may be NULL) + "/" + name into out; false if it does not fit
 * (out is then unspecified). Plain copies: the lengths are checked here, not by snprintf. */
static bool join(char *out, size_t cap, const char *dir, size_t dir_len, const char *mid,
                 const char *name) {
    size_t mid_len = mid ? strlen(mid) + 1 : 0, name_len = strlen(name);
    if (dir_len + 1 + mid_len + name_len >= cap)
        return false;
    memcpy(out, dir, dir_len);
    size_t k = dir_len;
    out[k++] = '/';
    if (mid) {
        memcpy(out + k, mid, mid_len - 1);
        k += mid_len - 1;
        out[k++] = '/';
    }
    memcpy(out + k, name, name_len + 1);
    return true;
}

bool ops_path_search(const char *name, char *out, size_t cap) {
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t len = strcspn(path, ":");
        if (len && join(out, cap, path, len, NULL, name) && ops_executable(out))
            return true;
        path += len + (path[len] == ':');
    }
    return false;
}

bool ops_bin_find(const char *bin_dir, const char *sub, const char *name, char *out, size_t cap) {
    if (bin_dir)
        return join(out, cap, bin_dir, strlen(bin_dir), NULL, name) && ops_executable(out);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char up[PATH_MAX + 4]; /* <dir of this binary>/.. */
            size_t l = strlen(exe);
            memcpy(up, exe, l);
            memcpy(up + l, "/..", 4);
            if (join(out, cap, up, l + 3, sub, name) && ops_executable(out))
                return true;
            if (join(out, cap, exe, l, NULL, name) && ops_executable(out))
                return true;
        }
    }
    return ops_path_search(name, out, cap);
}

/* Appends component c (len bytes) to the absolute path out[0..*k), applying "." and "..". */
static bool push_component(char *out, size_t cap, size_t *k, const char *c, size_t len) {
    if (len == 0 || (len == 1 && c[0] == '.'))
        return true;
    if (len == 2 && c[0] == '.' && c[1] == '.') {
        while (*k > 0 && out[*k - 1] != '/')
            (*k)--;
        if (*k > 0)
            (*k)--; /* the '/' before it; "/.." stays "/" */
        return true;
    }
    if (*k + 1 + len >= cap)
        return false;
    out[(*k)++] = '/';
    memcpy(out + *k, c, len);
    *k += len;
    return true;
}

static bool push_all(char *out, size_t cap, size_t *k, const char *p) {
    while (*p) {
        size_t len = strcspn(p, "/");
        if (!push_component(out, cap, k, p, len))
            return false;
        p += len + (p[len] == '/');
    }
    return true;
}

bool ops_path_absolute(const char *path, char *out, size_t cap) {
    if (!path || !*path || cap < 2)
        return false;
    size_t k = 0;
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd) || !push_all(out, cap, &k, cwd))
            return false;
    }
    if (!push_all(out, cap, &k, path))
        return false;
    if (k == 0)
        out[k++] = '/';
    out[k] = '\0';
    return true;
}

FILE *ops_fopen_private(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, OPS_FILE_MODE);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f)
        close(fd);
    return f;
}
