/* backup_store.c — names, paths, the piece manifest and the file operations of backup pieces
 * (backup.h). Every name from the wire is checked here before it becomes part of a path: a
 * name is a fixed set of characters without '/', NUL or a leading dot, so no path built from
 * them leaves <data>/backups. */
#include "backup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BK_MAGIC "STBKPCE1"
#define BK_FORMAT 1u
#define BK_HEADER_BYTES 24u
#define BK_MANIFEST_MAX ((size_t)64 << 20)
#define BK_CRC_BUF ((size_t)1 << 20)

/* ---- names ---- */

static bool name_char(char c, bool dot) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || (dot && c == '.');
}

/* Copies the component of *p up to '/' (or the end) into out when it is 1..64 name characters
 * starting with a letter, digit or '_'. */
static bool take_part(const char **p, char *out, bool dot) {
    size_t i = 0;
    const char *s = *p;
    if (!(name_char(s[0], false) && s[0] != '-'))
        return false;
    while (s[i] && s[i] != '/') {
        if (i >= NODE_BK_NAME_MAX || !name_char(s[i], dot))
            return false;
        out[i] = s[i];
        i++;
    }
    out[i] = '\0';
    *p = s + i;
    return true;
}

static bool take_lit(const char **p, const char *lit) {
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n) != 0)
        return false;
    *p += n;
    return true;
}

st_code bk_name_parse(const char *name, bk_name *out, st_err *err) {
    const char *p = name;
    bool ok = strlen(name) < sizeof out->full && take_lit(&p, "projects/") &&
              take_part(&p, out->project, true) && take_lit(&p, "/instances/") &&
              take_part(&p, out->instance, true) && take_lit(&p, "/clusters/") &&
              take_part(&p, out->cluster, true) && take_lit(&p, "/backups/") &&
              take_part(&p, out->id, true) && *p == '\0';
    if (!ok)
        return st_err_set(
            err, ST_INVALID_ARGUMENT,
            "invalid backup name '%.200s': expected "
            "projects/<project>/instances/<instance>/clusters/<cluster>/backups/<id>, "
            "each part 1..%d of [A-Za-z0-9_.-] starting with a letter, digit or '_'",
            name, NODE_BK_NAME_MAX);
    snprintf(out->full, sizeof out->full, "%s", name);
    return ST_OK;
}

st_code bk_piece_check(const char *piece, st_err *err) {
    size_t n = strlen(piece);
    bool ok = n >= 1 && n <= NODE_BK_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = name_char(piece[i], false);
    if (!ok)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid piece id '%.100s': expected 1..%d of [A-Za-z0-9_-]", piece,
                          NODE_BK_NAME_MAX);
    return ST_OK;
}

st_code bk_incarnation_check(const char *incarnation, st_err *err) {
    if (strlen(incarnation) <= NODE_BK_INCARNATION_MAX)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT, "a piece's incarnation is over %d bytes",
                      NODE_BK_INCARNATION_MAX);
}

st_code bk_leftover_drop(node_ctx *n, const bk_name *b, const char *piece, const char *final,
                         const char *have, const char *want, bool *dropped, st_err *err) {
    *dropped = want[0] && strcmp(have ? have : "", want) != 0;
    if (!*dropped)
        return ST_OK;
    st_log(ST_LOG_INFO, "backup",
           "event=leftover_piece_removed backup=%s piece=%s incarnation=%s wanted=%s", b->full,
           piece, have && have[0] ? have : "-", want);
    return bk_trash(n, final, NULL, err);
}

st_code bk_file_check(const char *file, st_err *err) {
    size_t n = strlen(file);
    bool ok = n > 4 && n - 4 <= NODE_BK_NAME_MAX && strcmp(file + n - 4, ".sst") == 0;
    for (size_t i = 0; ok && i < n - 4; i++)
        ok = name_char(file[i], false);
    if (!ok)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup file name '%.100s': expected 1..%d of [A-Za-z0-9_-] "
                          "then .sst",
                          file, NODE_BK_NAME_MAX);
    return ST_OK;
}

/* ---- paths ---- */

void bk_root_dir(const node_ctx *n, char *out, size_t cap) {
    snprintf(out, cap, "%s/backups", n->data_dir);
}

void bk_backup_dir(const node_ctx *n, const bk_name *b, char *out, size_t cap) {
    snprintf(out, cap, "%s/backups/%s/%s/%s", n->data_dir, b->instance, b->cluster, b->id);
}

void bk_piece_dir(const node_ctx *n, const bk_name *b, const char *piece, const char *suffix,
                  char *out, size_t cap) {
    snprintf(out, cap, "%s/backups/%s/%s/%s/%s%s", n->data_dir, b->instance, b->cluster, b->id,
             piece, suffix);
}

/* ---- files and directories ---- */

static st_code io_fail(st_err *err, const char *what, const char *path, int e) {
    st_code code = e == ENOENT ? ST_NOT_FOUND : e == ENOSPC ? ST_RESOURCE_EXHAUSTED : ST_INTERNAL;
    return st_err_set(err, code, "%s %s: %s", what, path, strerror(e));
}

st_code bk_fsync_path(const char *path, st_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_fail(err, "opening", path, errno);
    int r = fsync(fd);
    int e = errno;
    close(fd);
    return r == 0 ? ST_OK : io_fail(err, "syncing", path, e);
}

st_code bk_mkdirs(const char *path, st_err *err) {
    return st_env_posix()->ops->mkdirs(st_env_posix(), path, err);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

st_code bk_remove_tree(const char *path, st_err *err) {
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? ST_OK : io_fail(err, "looking at", path, errno);
    if (!S_ISDIR(sb.st_mode))
        return unlink(path) == 0 || errno == ENOENT ? ST_OK : io_fail(err, "removing", path, errno);
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return io_fail(err, "removing", path, errno);
    return ST_OK;
}

static void parent_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash && slash != out)
        *slash = '\0';
}

st_code bk_publish(const char *from, const char *to, st_err *err) {
    if (rename(from, to) != 0)
        return io_fail(err, "renaming into place", to, errno);
    char parent[NODE_BK_PATH_MAX];
    parent_of(to, parent, sizeof parent);
    return bk_fsync_path(parent, err);
}

st_code bk_file_crc(const char *path, uint64_t *size, uint32_t *crc, st_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_fail(err, "opening", path, errno);
    uint8_t *buf = malloc(BK_CRC_BUF);
    st_code rc = buf ? ST_OK : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    uint32_t c = 0;
    uint64_t total = 0;
    while (rc == ST_OK) {
        ssize_t got = read(fd, buf, BK_CRC_BUF);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = io_fail(err, "reading", path, errno);
        if (got <= 0)
            break;
        c = st_crc32c(c, buf, (size_t)got);
        total += (uint64_t)got;
    }
    free(buf);
    close(fd);
    *size = total;
    *crc = c;
    return rc;
}

/* ---- the manifest (docs/formats/backup-piece.md) ---- */

st_code bk_manifest_write(const char *dir, const bk_piece *p, st_err *err) {
    size_t body = protobuf_c_message_get_packed_size(&p->base);
    uint8_t *buf = malloc(BK_HEADER_BYTES + body);
    if (!buf)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing a piece manifest");
    memcpy(buf, BK_MAGIC, 8);
    protobuf_c_message_pack(&p->base, buf + BK_HEADER_BYTES);
    st_put_fixed32(buf + 8, BK_FORMAT);
    st_put_fixed32(buf + 12, st_crc_mask(st_crc32c(0, buf + BK_HEADER_BYTES, body)));
    st_put_fixed64(buf + 16, body);
    char path[NODE_BK_PATH_MAX];
    snprintf(path, sizeof path, "%s/" NODE_BK_MANIFEST, dir);
    st_code rc = st_env_write_atomic(st_env_posix(), path, buf, BK_HEADER_BYTES + body, err);
    free(buf);
    return rc;
}

static void *arena_alloc(void *data, size_t size) {
    return st_arena_alloc(data, size);
}
static void arena_free(void *data, void *ptr) {
    (void)data;
    (void)ptr;
}

static st_code manifest_decode(const char *path, st_slice d, st_arena *a, bk_piece **out,
                               st_err *err) {
    if (d.len < BK_HEADER_BYTES || memcmp(d.data, BK_MAGIC, 8) != 0 ||
        st_get_fixed32(d.data + 8) != BK_FORMAT ||
        st_get_fixed64(d.data + 16) != d.len - BK_HEADER_BYTES ||
        st_crc_unmask(st_get_fixed32(d.data + 12)) !=
            st_crc32c(0, d.data + BK_HEADER_BYTES, d.len - BK_HEADER_BYTES))
        return st_err_set(err, ST_DATA_LOSS,
                          "piece manifest %s is damaged (magic, version, length or checksum): "
                          "delete the backup (`strata backup delete ID`) and back the table up "
                          "again",
                          path);
    ProtobufCAllocator alloc = {arena_alloc, arena_free, a};
    *out = strata__internal__v1__backup_piece__unpack(a ? &alloc : NULL, d.len - BK_HEADER_BYTES,
                                                      d.data + BK_HEADER_BYTES);
    if (!*out)
        return st_err_set(
            err, ST_DATA_LOSS,
            "piece manifest %s does not decode: delete the backup (`strata backup delete ID`) and "
            "back the table up again",
            path);
    return ST_OK;
}

st_code bk_manifest_read(const char *dir, st_arena *a, bk_piece **out, st_err *err) {
    char path[NODE_BK_PATH_MAX];
    snprintf(path, sizeof path, "%s/" NODE_BK_MANIFEST, dir);
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return io_fail(err, "reading", path, errno);
    if ((uint64_t)sb.st_size > BK_MANIFEST_MAX)
        return st_err_set(err, ST_DATA_LOSS, "piece manifest %s is over %zu bytes", path,
                          BK_MANIFEST_MAX);
    st_buf data;
    st_buf_init(&data);
    st_code rc = st_env_read_all(st_env_posix(), path, &data, err);
    if (rc == ST_OK)
        rc = manifest_decode(path, st_buf_slice(&data), a, out, err);
    st_buf_free(&data);
    return rc;
}

void bk_piece_free(bk_piece *p) {
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
}

st_code bk_piece_load(const node_ctx *n, const bk_name *b, const char *piece, st_arena *a,
                      bk_piece **out, st_err *err) {
    char dir[NODE_BK_PATH_MAX];
    bk_piece_dir(n, b, piece, "", dir, sizeof dir);
    st_code rc = bk_manifest_read(dir, a, out, err);
    if (rc == ST_NOT_FOUND)
        return st_err_set(err, ST_NOT_FOUND, "backup %s has no piece '%s' on node %u", b->full,
                          piece, n->opts.node_num);
    if (rc == ST_OK && strcmp((*out)->backup, b->full) != 0) {
        /* same instance, cluster and id in another project */
        if (!a)
            bk_piece_free(*out);
        *out = NULL;
        return st_err_set(err, ST_NOT_FOUND, "backup %s has no piece '%s' on node %u", b->full,
                          piece, n->opts.node_num);
    }
    return rc;
}

const Strata__Internal__V1__BackupFile *bk_piece_file(const bk_piece *p, const char *file) {
    for (size_t i = 0; i < p->n_files; i++)
        if (p->files[i] && strcmp(p->files[i]->name, file) == 0)
            return p->files[i];
    return NULL;
}

/* ---- sweep ---- */

typedef struct sweep_ctx {
    char path[NODE_BK_PATH_MAX];
    int depth; /* 0 root, 1 instance, 2 cluster, 3 backup */
} sweep_ctx;

static void sweep_dir(sweep_ctx *c) {
    DIR *d = opendir(c->path);
    if (!d)
        return;
    size_t len = strlen(c->path);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            (c->depth < 3 && e->d_name[0] == '.')) /* the trash: the reaper's (backup_reap.c) */
            continue;
        snprintf(c->path + len, sizeof c->path - len, "/%s", e->d_name);
        if (c->depth == 3 && strchr(e->d_name, '.')) {
            st_log(ST_LOG_INFO, "backup", "event=unsealed_piece_removed path=%s", c->path);
            bk_remove_tree(c->path, NULL);
        } else if (c->depth < 3) {
            c->depth++;
            sweep_dir(c);
            c->depth--;
            if (c->depth == 2 && rmdir(c->path) == 0) /* only when empty */
                st_log(ST_LOG_INFO, "backup", "event=empty_backup_dir_removed path=%s", c->path);
        }
        c->path[len] = '\0';
    }
    closedir(d);
}

void bk_sweep(const node_ctx *n) {
    sweep_ctx c = {.depth = 0};
    bk_root_dir(n, c.path, sizeof c.path);
    sweep_dir(&c);
}

/* ---- busy pieces ---- */

bool bk_busy(node_ctx *n, const char *dir) {
    node_backups *b = n->backups;
    for (size_t i = 0; b && i < b->n_busy; i++)
        if (strcmp(b->busy[i], dir) == 0)
            return true;
    return false;
}

bool bk_busy_add(node_ctx *n, const char *dir) {
    node_backups *b = n->backups;
    if (b->n_busy == b->cap_busy) {
        size_t cap = b->cap_busy ? b->cap_busy * 2 : 8;
        char **v = realloc(b->busy, cap * sizeof *v);
        if (!v)
            return false;
        b->busy = v;
        bool *d = realloc(b->busy_doomed, cap * sizeof *d);
        if (!d)
            return false;
        b->busy_doomed = d;
        b->cap_busy = cap;
    }
    char *copy = strdup(dir);
    if (!copy)
        return false;
    b->busy_doomed[b->n_busy] = false;
    b->busy[b->n_busy++] = copy;
    return true;
}

void bk_busy_doom(node_ctx *n, const char *dir, bool prefix) {
    node_backups *b = n->backups;
    size_t len = strlen(dir);
    for (size_t i = 0; b && i < b->n_busy; i++)
        if (prefix ? strncmp(b->busy[i], dir, len) == 0 && b->busy[i][len] == '/'
                   : strcmp(b->busy[i], dir) == 0)
            b->busy_doomed[i] = true;
}

bool bk_busy_doomed(node_ctx *n, const char *dir) {
    node_backups *b = n->backups;
    for (size_t i = 0; b && i < b->n_busy; i++)
        if (strcmp(b->busy[i], dir) == 0)
            return b->busy_doomed[i];
    return false;
}

void bk_busy_remove(node_ctx *n, const char *dir) {
    node_backups *b = n->backups;
    for (size_t i = 0; i < b->n_busy; i++) {
        if (strcmp(b->busy[i], dir) == 0) {
            free(b->busy[i]);
            b->busy_doomed[i] = b->busy_doomed[b->n_busy - 1];
            b->busy[i] = b->busy[--b->n_busy];
            return;
        }
    }
}
