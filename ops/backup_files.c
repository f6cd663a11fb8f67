/* ops/backup_files.c — the files of an export directory (docs/formats/backup-export.md):
 * writing each under a temporary name, checksummed as it goes, renamed once fsync'd; the
 * manifest last; and the checks of every file against the manifest (size, CRC32C, SHA-256),
 * each failure naming the file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sync_file_range; fsync, O_NOFOLLOW, O_DIRECTORY */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backup_dir.h"

#define BK_READ_BYTES (1u << 20)

static bool path_fmt(char *out, size_t cap, st_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool path_fmt(char *out, size_t cap, st_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        st_err_set(err, ST_INVALID_ARGUMENT, "path too long under %.200s: use a shorter DIR", out);
        return false;
    }
    return true;
}

static st_code io_err(st_err *err, const char *what, const char *path) {
    int e = errno;
    return st_err_set(err, e == ENOENT ? ST_NOT_FOUND : ST_UNAVAILABLE, "%s %s: %s%s", what, path,
                      strerror(e),
                      e == EFBIG ? " (a file-size limit, `ulimit -f`, is set: raise it, e.g. "
                                   "`ulimit -f unlimited`)"
                                 : "");
}

static st_code fsync_dir(const char *dir, st_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return io_err(err, "cannot open directory", dir);
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? ST_OK : io_err(err, "cannot fsync directory", dir);
}

/* ---- writing ---- */

static bool dir_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* Whether dir/name exists (not followed if a link); *is_dir says whether it is a directory. */
static bool entry_at(const char *dir, const char *name, bool *is_dir) {
    char p[4096];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p || lstat(p, &st) != 0)
        return false;
    *is_dir = S_ISDIR(st.st_mode);
    return true;
}

/* dir holds what an interrupted export leaves: its files directory (version 1: pieces) without
 * a MANIFEST. */
static bool unfinished(const char *dir) {
    bool d = false;
    return !entry_at(dir, OPS_BK_MANIFEST, &d) &&
           ((entry_at(dir, OPS_BK_FILES, &d) && d) || (entry_at(dir, OPS_BK_PIECES, &d) && d));
}

st_code ops_bk_dir_create(const char *dir, int version, bool *made, st_err *err) {
    char p[4096];
    *made = mkdir(dir, 0755) == 0;
    int mkdir_errno = errno;
    if (!*made && mkdir_errno == EEXIST && !dir_empty(dir) && unfinished(dir))
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "%s holds an unfinished export (files, no MANIFEST: one that was "
                          "interrupted), which nothing can resume: remove it (`rm -r %s`) and "
                          "export again, or export into a new directory",
                          dir, dir);
    errno = mkdir_errno;
    if (!*made && !(errno == EEXIST && dir_empty(dir)))
        return errno == EEXIST
                   ? st_err_set(err, ST_ALREADY_EXISTS,
                                "%s exists and is not empty: export into a new directory", dir)
                   : io_err(err, "cannot create", dir);
    st_code rc = ST_OK;
    if (!path_fmt(p, sizeof p, err, "%s/%s", dir, version >= 2 ? OPS_BK_FILES : OPS_BK_PIECES))
        rc = ST_INVALID_ARGUMENT;
    else if (mkdir(p, 0755) != 0)
        rc = io_err(err, "cannot create", p);
    if (rc != ST_OK && *made)
        rmdir(dir);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0; /* on with the others: what stays is found after */
}

bool ops_bk_dir_remove(const char *dir, int version, bool made) {
    char sub[4096], man[4096], tmp[4096];
    if (!path_fmt(sub, sizeof sub, NULL, "%s/%s", dir,
                  version >= 2 ? OPS_BK_FILES : OPS_BK_PIECES) ||
        !path_fmt(man, sizeof man, NULL, "%s/%s", dir, OPS_BK_MANIFEST) ||
        !path_fmt(tmp, sizeof tmp, NULL, "%s%s", man, OPS_BK_TMP_SUFFIX))
        return false;
    nftw(sub, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    unlink(tmp);
    unlink(man); /* written last: only there when its directory's fsync failed */
    if (made)
        return rmdir(dir) == 0;
    return dir_empty(dir);
}

bool ops_bk_file_path(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                      const ops_bk_file *f, char *out, size_t cap, st_err *err) {
    if (m->version < 2)
        return path_fmt(out, cap, err, "%s/%s/%s/%s", dir, OPS_BK_PIECES, p->id, f->name);
    if (m->version >= 3)
        return path_fmt(out, cap, err, "%s/%s/%s.%s", dir, OPS_BK_FILES, f->at, f->name);
    char sha[2 * OPS_BK_SHA256_BYTES + 1];
    ops_bk_hex(f->sha256, OPS_BK_SHA256_BYTES, sha);
    return path_fmt(out, cap, err, "%s/%s/%s", dir, OPS_BK_FILES, sha);
}

st_code ops_bk_out_open(ops_bk_out *o, const char *dir, int version, const char *piece,
                        const char *name, st_err *err) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->version = version;
    if (!ops_bk_piece_id_ok(piece) || !ops_bk_file_name_ok(name))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "piece '%s' file '%s': names an export cannot hold", piece, name);
    snprintf(o->piece, sizeof o->piece, "%s", piece);
    char pdir[4096];
    /* versions 2 and 3: files/<piece>.<name> (piece ids hold no dot, so no two files of the
     * export share the name, and no digest looks like one); version 2 renames it to its digest
     * once known */
    bool ok = version >= 2
                  ? path_fmt(o->files, sizeof o->files, err, "%s/%s", dir, OPS_BK_FILES) &&
                        path_fmt(pdir, sizeof pdir, err, "%s", o->files) &&
                        path_fmt(o->final, sizeof o->final, err, "%s/%s.%s", pdir, piece, name)
                  : path_fmt(pdir, sizeof pdir, err, "%s/%s/%s", dir, OPS_BK_PIECES, piece) &&
                        path_fmt(o->final, sizeof o->final, err, "%s/%s", pdir, name);
    if (!ok || !path_fmt(o->tmp, sizeof o->tmp, err, "%s%s", o->final, OPS_BK_TMP_SUFFIX))
        return ST_INVALID_ARGUMENT;
    if (mkdir(pdir, 0755) != 0 && errno != EEXIST)
        return io_err(err, "cannot create", pdir);
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (o->fd < 0)
        return io_err(err, "cannot create", o->tmp);
    if (version >= 3) /* the CRC32C is the file's checksum: no second pass over the bytes */
        return ST_OK;
    o->sha = EVP_MD_CTX_new();
    if (!o->sha || !EVP_DigestInit_ex(o->sha, EVP_sha256(), NULL)) {
        ops_bk_out_abort(o);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting SHA-256");
    }
    return ST_OK;
}

st_code ops_bk_out_write(ops_bk_out *o, const void *data, size_t len, st_err *err) {
    const uint8_t *p = data;
    o->crc32c = st_crc32c(o->crc32c, data, len);
    if (o->sha)
        EVP_DigestUpdate(o->sha, data, len);
    o->size += len;
    while (len > 0) {
        ssize_t n = write(o->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return io_err(err, "cannot write", o->tmp);
        p += n;
        len -= (size_t)n;
    }
    return ST_OK;
}

void ops_bk_out_abort(ops_bk_out *o) {
    if (o->fd >= 0) {
        close(o->fd);
        unlink(o->tmp);
    }
    o->fd = -1;
    EVP_MD_CTX_free(o->sha);
    o->sha = NULL;
}

st_code ops_bk_out_close(ops_bk_out *o, ops_bk_file *f, st_err *err) {
    unsigned n = 0;
    st_code rc = ST_OK;
    /* Writeback starts now, in the background; ops_bk_manifest_write waits for it (fsync of
     * every file) before the manifest exists, so the transfer of the next files overlaps it. */
    if (sync_file_range(o->fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0 && errno != ENOSYS &&
        errno != EINVAL)
        rc = io_err(err, "cannot write back", o->tmp);
    if (rc == ST_OK && close(o->fd) != 0)
        rc = io_err(err, "cannot close", o->tmp);
    else if (rc != ST_OK)
        close(o->fd);
    o->fd = -1;
    f->size = o->size;
    f->crc32c = o->crc32c;
    snprintf(f->at, sizeof f->at, "%s", o->piece);
    if (o->sha)
        EVP_DigestFinal_ex(o->sha, f->sha256, &n);
    EVP_MD_CTX_free(o->sha);
    o->sha = NULL;
    if (o->version == 2) { /* named by its content: the same content twice is one file */
        char sha[2 * OPS_BK_SHA256_BYTES + 1];
        ops_bk_hex(f->sha256, OPS_BK_SHA256_BYTES, sha);
        if (rc == ST_OK && !path_fmt(o->final, sizeof o->final, err, "%s/%s", o->files, sha))
            rc = ST_INVALID_ARGUMENT;
    }
    if (rc == ST_OK && rename(o->tmp, o->final) != 0)
        rc = io_err(err, "cannot rename", o->tmp);
    if (rc != ST_OK)
        unlink(o->tmp);
    return rc;
}

static st_code write_all_file(const char *path, st_slice data, st_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return io_err(err, "cannot create", path);
    size_t off = 0;
    while (off < data.len) {
        ssize_t n = write(fd, data.data + off, data.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            st_code rc = io_err(err, "cannot write", path);
            close(fd);
            return rc;
        }
        off += (size_t)n;
    }
    if (fsync(fd) != 0) {
        st_code rc = io_err(err, "cannot fsync", path);
        close(fd);
        return rc;
    }
    return close(fd) == 0 ? ST_OK : io_err(err, "cannot close", path);
}

st_code ops_bk_link(const char *dir, const char *from_piece, const char *to_piece, const char *name,
                    st_err *err) {
    char from[4096], pdir[4096], to[4096];
    if (!ops_bk_piece_id_ok(from_piece) || !ops_bk_piece_id_ok(to_piece) ||
        !ops_bk_file_name_ok(name))
        return st_err_set(err, ST_INVALID_ARGUMENT, "names an export cannot hold");
    if (!path_fmt(from, sizeof from, err, "%s/%s/%s/%s", dir, OPS_BK_PIECES, from_piece, name) ||
        !path_fmt(pdir, sizeof pdir, err, "%s/%s/%s", dir, OPS_BK_PIECES, to_piece) ||
        !path_fmt(to, sizeof to, err, "%s/%s", pdir, name))
        return ST_INVALID_ARGUMENT;
    if (mkdir(pdir, 0755) != 0 && errno != EEXIST)
        return io_err(err, "cannot create", pdir);
    return link(from, to) == 0 ? ST_OK : io_err(err, "cannot link to", to);
}

static st_code fsync_file(const char *path, st_err *err) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0)
        return io_err(err, "cannot open", path);
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? ST_OK : io_err(err, "cannot fsync", path);
}

st_code ops_bk_manifest_write(const char *dir, const ops_bk_manifest *m, st_err *err) {
    char p[4096], tmp[4096], fin[4096];
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < m->n_pieces; i++) /* every file durable first */
        for (size_t j = 0; rc == ST_OK && j < m->pieces[i].n_files; j++) {
            /* version 3: once, at the piece that holds it (pieces list a shared file 4.5 times
             * in the measurement of docs/backups.md, and each fsync costs a device flush) */
            if (m->version >= 3 && strcmp(m->pieces[i].files[j].at, m->pieces[i].id))
                continue;
            if (!ops_bk_file_path(dir, m, &m->pieces[i], &m->pieces[i].files[j], p, sizeof p, err))
                return ST_INVALID_ARGUMENT;
            rc = fsync_file(p, err);
        }
    for (size_t i = 0; rc == ST_OK && m->version < 2 && i < m->n_pieces; i++) {
        if (!path_fmt(p, sizeof p, err, "%s/%s/%s", dir, OPS_BK_PIECES, m->pieces[i].id))
            return ST_INVALID_ARGUMENT;
        if (m->pieces[i].n_files)
            rc = fsync_dir(p, err);
    }
    if (rc == ST_OK &&
        path_fmt(p, sizeof p, err, "%s/%s", dir, m->version >= 2 ? OPS_BK_FILES : OPS_BK_PIECES))
        rc = fsync_dir(p, err);
    if (rc != ST_OK)
        return rc;
    if (!path_fmt(fin, sizeof fin, err, "%s/%s", dir, OPS_BK_MANIFEST) ||
        !path_fmt(tmp, sizeof tmp, err, "%s%s", fin, OPS_BK_TMP_SUFFIX))
        return ST_INVALID_ARGUMENT;
    st_buf text;
    st_buf_init(&text);
    rc = ops_bk_manifest_format(m, &text, err);
    if (rc == ST_OK)
        rc = write_all_file(tmp, st_buf_slice(&text), err);
    st_buf_free(&text);
    if (rc == ST_OK && rename(tmp, fin) != 0)
        rc = io_err(err, "cannot rename", tmp);
    if (rc != ST_OK) {
        unlink(tmp);
        return rc;
    }
    return fsync_dir(dir, err);
}

/* ---- reading and checking ---- */

st_code ops_bk_manifest_load(const char *dir, ops_bk_manifest *m, st_err *err) {
    char path[4096];
    ops_bk_manifest_init(m);
    if (!dir[0])
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the export directory is empty: name the directory an export wrote");
    if (!path_fmt(path, sizeof path, err, "%s/%s", dir, OPS_BK_MANIFEST))
        return ST_INVALID_ARGUMENT;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block */
    int open_errno = errno;
    struct stat st;
    if (fd < 0 && open_errno == ENOENT && stat(dir, &st) != 0 && errno == ENOENT)
        return st_err_set(err, ST_NOT_FOUND,
                          "%s does not exist: name the directory an export wrote", dir);
    if (fd < 0) {
        if (open_errno == ENOENT)
            return st_err_set(err, ST_NOT_FOUND,
                              "%s is missing: %s is not a finished export (an export that was "
                              "interrupted has no manifest: remove it with `rm -r %s` and "
                              "export again)",
                              path, dir, dir);
        errno = open_errno;
        return io_err(err, "cannot open", path);
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size > OPS_BK_MANIFEST_BYTES_MAX) {
        close(fd);
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s is not a regular file of at most %u bytes: not an export", path,
                          OPS_BK_MANIFEST_BYTES_MAX);
    }
    char *text = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    ssize_t n = 1;
    while (text && got < (size_t)st.st_size &&
           ((n = read(fd, text + got, (size_t)st.st_size - got)) > 0 || (n < 0 && errno == EINTR)))
        got += n > 0 ? (size_t)n : 0;
    close(fd);
    st_code rc = !text   ? st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading %s", path)
                 : n < 0 ? io_err(err, "cannot read", path)
                         : ops_bk_manifest_parse(text, got, path, m, err);
    free(text);
    return rc;
}

/* Opens a manifest's file read-only, never through a symbolic link; checks it is a regular file
 * of the manifest's size. */
static st_code open_checked(const char *path, const ops_bk_file *f, int *fd, st_err *err) {
    struct stat st;
    *fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block the open */
    if (*fd < 0 && errno == ELOOP)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s is a symbolic link: an export holds regular files only (copy it "
                          "with cp -a or tar, or export it again)",
                          path);
    if (*fd < 0)
        return errno == ENOENT ? st_err_set(err, ST_NOT_FOUND,
                                            "%s is missing (the export is incomplete: copy or "
                                            "export it again)",
                                            path)
                               : io_err(err, "cannot open", path);
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        return st_err_set(err, ST_DATA_LOSS, "%s is not a regular file (export it again)", path);
    }
    if ((uint64_t)st.st_size != f->size) {
        close(*fd);
        return st_err_set(err, ST_DATA_LOSS,
                          "%s has %llu bytes, the manifest says %llu (truncated or damaged: copy "
                          "or export it again)",
                          path, (unsigned long long)st.st_size, (unsigned long long)f->size);
    }
    return ST_OK;
}

/* Version 2 paths are digests: an error also names the piece's file. */
static st_code name_file(st_code rc, const ops_bk_manifest *m, const ops_bk_piece *p,
                         const ops_bk_file *f, st_err *err) {
    if (rc != ST_OK && m->version >= 2 && err)
        st_err_prefix(err, "file %s of piece %s: ", f->name, p->id);
    return rc;
}

/* path is a directory itself, not a symbolic link to one: nothing outside DIR is read. */
static st_code real_dir(const char *path, st_err *err) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? st_err_set(err, ST_NOT_FOUND,
                                            "%s is missing (the export is incomplete: copy or "
                                            "export it again)",
                                            path)
                               : io_err(err, "cannot read", path);
    if (!S_ISDIR(st.st_mode))
        return st_err_set(err, ST_DATA_LOSS,
                          "%s is not a directory (a symbolic link?): an export holds its pieces "
                          "in place (copy it with cp -a or tar, or export it again)",
                          path);
    return ST_OK;
}

/* The directories files are read from are real ones: version 2's files/, version 1's pieces/
 * and each piece's directory. */
static st_code check_dirs(const char *dir, const ops_bk_manifest *m, st_err *err) {
    char path[4096];
    bool v2 = m->version >= 2;
    if (!path_fmt(path, sizeof path, err, "%s/%s", dir, v2 ? OPS_BK_FILES : OPS_BK_PIECES))
        return ST_INVALID_ARGUMENT;
    st_code drc = ops_bk_manifest_files(m) ? real_dir(path, err) : ST_OK;
    for (size_t i = 0; !v2 && drc == ST_OK && i < m->n_pieces; i++)
        if (m->pieces[i].n_files) /* a piece without files may have no directory */
            drc = path_fmt(path, sizeof path, err, "%s/%s/%s", dir, OPS_BK_PIECES, m->pieces[i].id)
                      ? real_dir(path, err)
                      : ST_INVALID_ARGUMENT;
    return drc;
}

st_code ops_bk_check_sizes(const char *dir, const ops_bk_manifest *m, st_err *err) {
    char path[4096];
    st_code drc = check_dirs(dir, m, err);
    if (drc != ST_OK)
        return drc;
    for (size_t i = 0; i < m->n_pieces; i++)
        for (size_t j = 0; j < m->pieces[i].n_files; j++) {
            int fd;
            const ops_bk_file *f = &m->pieces[i].files[j];
            if (!ops_bk_file_path(dir, m, &m->pieces[i], f, path, sizeof path, err))
                return ST_INVALID_ARGUMENT;
            st_code rc = open_checked(path, f, &fd, err);
            if (rc != ST_OK)
                return name_file(rc, m, &m->pieces[i], f, err);
            close(fd);
        }
    return ST_OK;
}

/* Reads fd to its end, checksumming; compares with f. */
static st_code read_compare(int fd, const char *path, int version, const ops_bk_file *f,
                            ops_bk_read_fn on_data, void *arg, st_err *err) {
    uint8_t *buf = malloc(BK_READ_BYTES), sha[OPS_BK_SHA256_BYTES] = {0};
    EVP_MD_CTX *ctx = version < 3 ? EVP_MD_CTX_new() : NULL; /* version 3: CRC32C only */
    uint64_t size = 0;
    uint32_t crc = 0;
    ssize_t n = 0;
    if (!buf || (version < 3 && (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)))) {
        free(buf);
        EVP_MD_CTX_free(ctx);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading %s", path);
    }
    st_code rc = ST_OK;
    while (rc == ST_OK && ((n = read(fd, buf, BK_READ_BYTES)) > 0 || (n < 0 && errno == EINTR))) {
        if (n <= 0)
            continue;
        crc = st_crc32c(crc, buf, (size_t)n);
        if (ctx)
            EVP_DigestUpdate(ctx, buf, (size_t)n);
        size += (uint64_t)n;
        if (on_data)
            rc = on_data(buf, (size_t)n, arg, err);
    }
    unsigned shan = 0;
    if (ctx)
        EVP_DigestFinal_ex(ctx, sha, &shan);
    EVP_MD_CTX_free(ctx);
    free(buf);
    if (rc != ST_OK)
        return rc;
    if (n < 0)
        return io_err(err, "cannot read", path);
    if (size != f->size)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s: read %llu bytes, the manifest says %llu (changed while read? "
                          "copy or export it again)",
                          path, (unsigned long long)size, (unsigned long long)f->size);
    if (crc != f->crc32c || memcmp(sha, f->sha256, sizeof sha))
        return st_err_set(err, ST_DATA_LOSS,
                          "%s: checksum mismatch (CRC32C %08x, manifest %08x): the file is "
                          "damaged; copy or export it again",
                          path, crc, f->crc32c);
    return ST_OK;
}

st_code ops_bk_check_file(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                          const ops_bk_file *f, ops_bk_read_fn on_data, void *arg, st_err *err) {
    char path[4096];
    int fd;
    if (!ops_bk_file_path(dir, m, p, f, path, sizeof path, err))
        return ST_INVALID_ARGUMENT;
    st_code rc = open_checked(path, f, &fd, err);
    if (rc != ST_OK)
        return name_file(rc, m, p, f, err);
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    rc = read_compare(fd, path, m->version, f, on_data, arg, err);
    close(fd);
    return rc == ST_DATA_LOSS ? name_file(rc, m, p, f, err) : rc;
}

bool ops_bk_file_id(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                    const ops_bk_file *f, uint64_t *dev, uint64_t *ino) {
    char path[4096];
    struct stat st;
    if (!ops_bk_file_path(dir, m, p, f, path, sizeof path, NULL) || lstat(path, &st) != 0)
        return false;
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return true;
}

st_code ops_bk_verify(const char *dir, ops_bk_manifest *m, ops_bk_read_fn on_data, void *arg,
                      st_err *err) {
    st_code rc = ops_bk_manifest_load(dir, m, err);
    if (rc == ST_OK)
        rc = ops_bk_check_sizes(dir, m, err); /* a missing file is named before any long read */
    for (size_t i = 0; rc == ST_OK && i < m->n_pieces; i++)
        for (size_t j = 0; rc == ST_OK && j < m->pieces[i].n_files; j++)
            rc =
                ops_bk_check_file(dir, m, &m->pieces[i], &m->pieces[i].files[j], on_data, arg, err);
    return rc;
}

bool ops_bk_file_same(const ops_bk_manifest *m, const ops_bk_file *a, const ops_bk_file *b) {
    if (a->size != b->size || a->crc32c != b->crc32c)
        return false;
    if (m->version >= 3)
        return !strcmp(a->at, b->at) && !strcmp(a->name, b->name);
    return !memcmp(a->sha256, b->sha256, sizeof a->sha256);
}

st_code ops_bk_sum_init(ops_bk_sum *s, int version, st_err *err) {
    memset(s, 0, sizeof *s);
    s->version = version;
    if (version >= 3)
        return ST_OK;
    s->sha = EVP_MD_CTX_new();
    if (!s->sha || !EVP_DigestInit_ex(s->sha, EVP_sha256(), NULL)) {
        ops_bk_sum_free(s);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting SHA-256");
    }
    return ST_OK;
}

void ops_bk_sum_update(ops_bk_sum *s, const void *data, size_t len) {
    if (s->sha)
        EVP_DigestUpdate(s->sha, data, len);
    else
        s->crc32c = st_crc32c(s->crc32c, data, len);
}

bool ops_bk_sum_matches(ops_bk_sum *s, const ops_bk_file *f) {
    if (!s->sha)
        return s->version >= 3 && s->crc32c == f->crc32c;
    uint8_t sha[OPS_BK_SHA256_BYTES];
    unsigned n = 0;
    bool ok = EVP_DigestFinal_ex(s->sha, sha, &n) && !memcmp(sha, f->sha256, sizeof sha);
    ops_bk_sum_free(s);
    return ok;
}

void ops_bk_sum_free(ops_bk_sum *s) {
    EVP_MD_CTX_free(s->sha);
    s->sha = NULL;
}
