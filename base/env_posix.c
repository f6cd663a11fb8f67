/* env_posix.c — the real file system behind st_env, plus the whole-file helpers. */
#include "strata/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_wfile {
    int fd;
    bool appending; /* O_APPEND: pwrite would append, not write in place */
    char path[];
};

struct st_rfile {
    int fd;
    char path[];
};

struct st_lock {
    int fd;
    int dir_fd; /* the directory holding the file, locked too */
};

/* Maps errno to a code and a sentence that says what to do. */
static st_code io_err(st_err *err, const char *what, const char *path, int e) {
    st_code code = e == ENOENT                    ? ST_NOT_FOUND
                   : (e == ENOSPC || e == EDQUOT) ? ST_RESOURCE_EXHAUSTED
                                                  : ST_INTERNAL;
    const char *hint = code == ST_RESOURCE_EXHAUSTED ? "; free disk space and retry"
                       : code == ST_NOT_FOUND        ? ""
                       : e == EFBIG ? "; a file-size limit (`ulimit -f`) is set for this process: "
                                      "restart it without one (`ulimit -f unlimited`)"
                                    : "; check the disk and permissions";
    return st_err_set(err, code, "%s %s: %s%s", what, path, strerror(e), hint);
}

/* Wraps an open fd (taken: closed on failure) as a writable file. */
static st_code wfile_from_fd(int fd, const char *path, st_wfile **out, st_err *err) {
    st_wfile *f = malloc(sizeof *f + strlen(path) + 1);
    if (!f) {
        close(fd);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", path);
    }
    f->fd = fd;
    f->appending = false;
    strcpy(f->path, path);
    *out = f;
    return ST_OK;
}

static st_code open_w(const char *path, int flags, st_wfile **out, st_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, ST_ENV_FILE_MODE);
    if (fd < 0)
        return io_err(err, "open for writing", path, errno);
    st_code rc = wfile_from_fd(fd, path, out, err);
    if (rc == ST_OK)
        (*out)->appending = (flags & O_APPEND) != 0;
    return rc;
}

static st_code px_wopen(st_env *env, const char *path, st_wfile **out, st_err *err) {
    (void)env;
    return open_w(path, O_TRUNC, out, err);
}

static st_code px_wopen_append(st_env *env, const char *path, st_wfile **out, st_err *err) {
    (void)env;
    return open_w(path, O_APPEND, out, err);
}

static st_code px_wopen_at(st_env *env, const char *path, uint64_t off, st_wfile **out,
                           st_err *err) {
    (void)env;
    if (off > (uint64_t)INT64_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "opening %s: offset too large", path);
    int fd = open(path, O_WRONLY | O_CLOEXEC); /* no O_CREAT, O_TRUNC or O_APPEND */
    if (fd < 0)
        return errno == ENOENT ? st_err_set(err, ST_NOT_FOUND, "%s does not exist", path)
                               : io_err(err, "open for overwriting", path, errno);
    if (lseek(fd, (off_t)off, SEEK_SET) < 0) { /* appends write() from the file position */
        int e = errno;
        close(fd);
        return io_err(err, "seek in", path, e);
    }
    return wfile_from_fd(fd, path, out, err);
}

static st_code px_append(st_wfile *f, const void *data, size_t len, st_err *err) {
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t n = write(f->fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return io_err(err, "write", f->path, errno);
        }
        p += n;
        len -= (size_t)n;
    }
    return ST_OK;
}

static st_code px_pwrite(st_wfile *f, uint64_t off, const void *data, size_t len, st_err *err) {
    if (f->appending)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "writing in place in %s: it was opened for appending", f->path);
    const uint8_t *p = data;
    while (len > 0) {
        if (off > (uint64_t)INT64_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT, "writing %s: offset too large", f->path);
        ssize_t n = pwrite(f->fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return io_err(err, "write", f->path, errno);
        }
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return ST_OK;
}

static st_code px_sync(st_wfile *f, st_err *err) {
    if (fdatasync(f->fd) != 0)
        return io_err(err, "fdatasync", f->path, errno);
    return ST_OK;
}

static st_code px_wclose(st_wfile *f, st_err *err) {
    st_code rc = ST_OK;
    if (close(f->fd) != 0)
        rc = io_err(err, "close", f->path, errno);
    free(f);
    return rc;
}

static st_code px_ropen(st_env *env, const char *path, st_rfile **out, st_err *err) {
    (void)env;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_err(err, "open", path, errno);
    st_rfile *f = malloc(sizeof *f + strlen(path) + 1);
    if (!f) {
        close(fd);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", path);
    }
    f->fd = fd;
    strcpy(f->path, path);
    *out = f;
    return ST_OK;
}

static st_code px_pread(st_rfile *f, uint64_t off, void *buf, size_t len, size_t *got,
                        st_err *err) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(f->fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return io_err(err, "read", f->path, errno);
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    *got = done;
    return ST_OK;
}

static st_code px_rsize(st_rfile *f, uint64_t *size, st_err *err) {
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return io_err(err, "stat", f->path, errno);
    *size = (uint64_t)st.st_size;
    return ST_OK;
}

static void px_rclose(st_rfile *f) {
    close(f->fd);
    free(f);
}

static st_code px_remove(st_env *env, const char *path, st_err *err) {
    (void)env;
    if (unlink(path) != 0)
        return io_err(err, "remove", path, errno);
    return ST_OK;
}

static st_code px_rename(st_env *env, const char *from, const char *to, st_err *err) {
    (void)env;
    if (rename(from, to) != 0)
        return io_err(err, "rename to", to, errno);
    return ST_OK;
}

static st_code px_link(st_env *env, const char *from, const char *to, st_err *err) {
    (void)env;
    if (link(from, to) != 0)
        return io_err(err, "hard link to", to, errno);
    return ST_OK;
}

static st_code px_mkdirs(st_env *env, const char *path, st_err *err) {
    (void)env;
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp)
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad directory path '%s'", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, ST_ENV_DIR_MODE) != 0 && errno != EEXIST)
            return io_err(err, "mkdir", tmp, errno);
        *p = '/';
    }
    if (mkdir(tmp, ST_ENV_DIR_MODE) != 0 && errno != EEXIST)
        return io_err(err, "mkdir", tmp, errno);
    return ST_OK;
}

static st_code px_sync_dir(st_env *env, const char *path, st_err *err) {
    (void)env;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return io_err(err, "open directory", path, errno);
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0)
        return io_err(err, "fsync directory", path, e);
    return ST_OK;
}

static st_code px_exists(st_env *env, const char *path, bool *out, st_err *err) {
    (void)env;
    (void)err;
    *out = access(path, F_OK) == 0;
    return ST_OK;
}

static st_code px_file_size(st_env *env, const char *path, uint64_t *size, st_err *err) {
    (void)env;
    struct stat st;
    if (stat(path, &st) != 0)
        return io_err(err, "stat", path, errno);
    *size = (uint64_t)st.st_size;
    return ST_OK;
}

static st_code px_file_id(st_env *env, const char *path, uint64_t *dev, uint64_t *ino,
                          st_err *err) {
    (void)env;
    struct stat st;
    if (stat(path, &st) != 0)
        return io_err(err, "stat", path, errno);
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return ST_OK;
}

static st_code px_list(st_env *env, const char *dir, st_code (*fn)(const char *, void *), void *arg,
                       st_err *err) {
    (void)env;
    DIR *d = opendir(dir);
    if (!d)
        return io_err(err, "list directory", dir, errno);
    st_code rc = ST_OK;
    struct dirent *e;
    while (rc == ST_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        rc = fn(e->d_name, arg);
    }
    closedir(d);
    return rc;
}

static void px_destroy(st_env *env) {
    (void)env;
}

static st_code px_preallocate(st_wfile *f, uint64_t bytes, st_err *err) {
#ifdef __linux__
    if (bytes > (uint64_t)INT64_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "preallocating %s: size too large", f->path);
    int r;
    do {
        r = fallocate(f->fd, 0, 0, (off_t)bytes); /* mode 0: allocate and extend the size */
    } while (r != 0 && errno == EINTR);
    if (r != 0)
        return io_err(err, "fallocate", f->path, errno);
    return ST_OK;
#else
    (void)bytes;
    return st_err_set(err, ST_INTERNAL, "preallocating %s: not supported here", f->path);
#endif
}

/* The pid a lock holder wrote into the file, or 0. */
static int64_t lock_holder(int fd) {
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return strtoll(buf, NULL, 10);
}

/* One flock attempt on fd: 0, or the errno that stopped it. */
static int flock_nb(int fd) {
    int r;
    while ((r = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR)
        ;
    return r == 0 ? 0 : errno;
}

/* The directory holding path, opened for flock (a path with no '/' is in the current one). */
static int open_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* The holder's pid from the file at path, or 0 (it may have been removed). */
static int64_t lock_holder_at(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int64_t pid = lock_holder(fd);
    close(fd);
    return pid;
}

static st_code lock_busy(st_err *err, const char *path, int64_t *holder_pid) {
    *holder_pid = lock_holder_at(path);
    return st_err_set(err, ST_FAILED_PRECONDITION, "%s is locked by process %lld", path,
                      (long long)*holder_pid);
}

/* flock, not fcntl: fcntl locks belong to the process, so a second open in the same process
 * would succeed, and closing any descriptor of the file would drop the lock. The directory
 * holding the file is locked as well: an operator who removes a "stale" lock file would let the
 * next process lock a new file of the same name, but the directory is the same one. */
static st_code px_lock(st_env *env, const char *path, st_lock **out, int64_t *holder_pid,
                       st_err *err) {
    (void)env;
    *holder_pid = 0;
    int dir_fd = open_parent(path);
    if (dir_fd < 0)
        return io_err(err, "open the directory of lock file", path, errno);
    int e = flock_nb(dir_fd);
    if (e != 0) {
        close(dir_fd);
        return e == EWOULDBLOCK ? lock_busy(err, path, holder_pid) : io_err(err, "lock", path, e);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, ST_ENV_FILE_MODE);
    if (fd < 0) {
        e = errno;
        close(dir_fd);
        return io_err(err, "open lock file", path, e);
    }
    if ((e = flock_nb(fd)) != 0) {
        close(fd);
        close(dir_fd);
        return e == EWOULDBLOCK ? lock_busy(err, path, holder_pid) : io_err(err, "lock", path, e);
    }
    st_lock *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        close(dir_fd);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory locking %s", path);
    }
    l->fd = fd;
    l->dir_fd = dir_fd;
    /* The pid is only for the message another process prints: failing to write it is harmless. */
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%lld\n", (long long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        st_log(ST_LOG_WARN, "env", "event=lock_pid_not_written path=%s", path);
    *out = l;
    return ST_OK;
}

static void px_unlock(st_lock *l) {
    if (!l)
        return;
    close(l->fd); /* releases the flocks */
    close(l->dir_fd);
    free(l);
}

static const st_env_ops posix_ops = {
    .wopen = px_wopen,
    .wopen_append = px_wopen_append,
    .append = px_append,
    .sync = px_sync,
    .wclose = px_wclose,
    .ropen = px_ropen,
    .pread = px_pread,
    .rsize = px_rsize,
    .rclose = px_rclose,
    .remove = px_remove,
    .rename = px_rename,
    .link = px_link,
    .mkdirs = px_mkdirs,
    .sync_dir = px_sync_dir,
    .exists = px_exists,
    .file_size = px_file_size,
    .list = px_list,
    .destroy = px_destroy,
    .preallocate = px_preallocate,
    .wopen_at = px_wopen_at,
    .pwrite = px_pwrite,
    .lock = px_lock,
    .unlock = px_unlock,
    .file_id = px_file_id,
};

/* Constant table: stateless and shared by the whole process. */
static st_env posix_env = {&posix_ops};

st_env *st_env_posix(void) {
    return &posix_env;
}

/* ---- helpers over any env ---- */

const char *st_lock_holder_str(char *buf, size_t cap, int64_t pid) {
    if (pid > 0)
        snprintf(buf, cap, "pid %lld", (long long)pid);
    else
        snprintf(buf, cap, "pid unknown: its LOCK file was removed");
    return buf;
}

st_code st_env_read_all(st_env *env, const char *path, st_buf *out, st_err *err) {
    st_rfile *f;
    st_code rc = env->ops->ropen(env, path, &f, err);
    if (rc != ST_OK)
        return rc;
    uint64_t size;
    rc = env->ops->rsize(f, &size, err);
    if (rc == ST_OK && st_buf_reserve(out, (size_t)size) != ST_OK)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading %s", path);
    size_t got = 0;
    if (rc == ST_OK)
        rc = env->ops->pread(f, 0, out->data + out->len, (size_t)size, &got, err);
    if (rc == ST_OK)
        out->len += got;
    env->ops->rclose(f);
    return rc;
}

/* Directory part of path ("." when none), for syncing the directory after a rename. */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        return;
    }
    size_t n = (size_t)(slash - path);
    if (n == 0)
        n = 1;
    snprintf(dir, cap, "%.*s", (int)n, path);
}

st_code st_env_write_atomic(st_env *env, const char *path, const void *data, size_t len,
                            st_err *err) {
    char tmp[4200], dir[4200];
    if (strlen(path) >= 4096)
        return st_err_set(err, ST_INVALID_ARGUMENT, "path too long: %.64s...", path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    st_wfile *f;
    st_code rc = env->ops->wopen(env, tmp, &f, err);
    if (rc != ST_OK)
        return rc;
    rc = env->ops->append(f, data, len, err);
    if (rc == ST_OK)
        rc = env->ops->sync(f, err);
    st_code crc = env->ops->wclose(f, rc == ST_OK ? err : NULL);
    if (rc == ST_OK)
        rc = crc;
    if (rc == ST_OK)
        rc = env->ops->rename(env, tmp, path, err);
    if (rc == ST_OK) {
        dir_of(path, dir, sizeof dir);
        rc = env->ops->sync_dir(env, dir, err);
    }
    if (rc != ST_OK)
        env->ops->remove(env, tmp, NULL);
    return rc;
}
