/* env_mem.c — an in-memory st_env with crash simulation, for storage tests.
 *
 * Model. A path names an inode (a byte buffer with a "synced length"). Two name tables are kept:
 * `live`, what the running process sees, and `durable`, what a crash would leave behind. sync on a
 * file moves its synced length to its current length; sync_dir(D) copies the live entries of D
 * into the durable table (adding creations and renames, dropping removals). Directories are made
 * durable at once by mkdirs (they are created once at open in Strata; modelling their loss would
 * only test the test). st_env_mem_crash() replaces `live` with `durable`, cuts (or garbles) every
 * surviving file after its synced length, and makes every handle opened before the crash fail:
 * the process that held them is dead.
 *
 * One mutex guards everything, including the bytes, so concurrent preads and appends are safe.
 * Lookups are linear: test envs hold tens of files. */
#include "strata/env.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MEM_PATH_MAX 4096 /* longest path accepted, like PATH_MAX */

typedef struct mem_inode {
    st_buf data;
    size_t synced_len; /* bytes that survive a crash */
    int refs;          /* name-table entries + open handles */
    uint64_t crash_mark;
} mem_inode;

typedef struct mem_entry {
    char *path;
    mem_inode *ino; /* NULL for a directory */
} mem_entry;

typedef struct mem_table {
    mem_entry *v;
    size_t n, cap;
} mem_table;

typedef struct mem_env {
    st_env base;
    pthread_mutex_t mu;
    mem_table live, durable;
    uint64_t generation; /* bumped by each crash; handles of older generations are dead */
} mem_env;

struct st_wfile {
    mem_env *env;
    mem_inode *ino;
    uint64_t generation;
    char path[];
};

struct st_rfile {
    mem_env *env;
    mem_inode *ino;
    uint64_t generation;
    char path[];
};

/* ---- paths and tables ---- */

/* Copies path without repeated or trailing slashes into out; false when too long or empty. */
static bool norm_path(const char *path, char *out) {
    size_t n = 0;
    if (!path || !*path)
        return false;
    for (const char *p = path; *p; p++) {
        if (*p == '/' && n > 0 && out[n - 1] == '/')
            continue;
        if (n + 1 >= MEM_PATH_MAX)
            return false;
        out[n++] = *p;
    }
    if (n > 1 && out[n - 1] == '/')
        n--;
    out[n] = '\0';
    return true;
}

/* The directory part of a normalized path: "." when it has none, "/" for top-level names. */
static void parent_of(const char *path, char *out) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(out, ".");
        return;
    }
    size_t n = (size_t)(slash - path);
    if (n == 0)
        n = 1;
    memcpy(out, path, n);
    out[n] = '\0';
}

static mem_entry *table_find(mem_table *t, const char *path) {
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->v[i].path, path) == 0)
            return &t->v[i];
    return NULL;
}

static void inode_unref(mem_inode *ino) {
    if (ino && --ino->refs == 0) {
        st_buf_free(&ino->data);
        free(ino);
    }
}

/* Adds (path, ino) or repoints an existing entry; false when memory runs out. */
static bool table_put(mem_table *t, const char *path, mem_inode *ino) {
    mem_entry *e = table_find(t, path);
    if (e) {
        if (ino)
            ino->refs++;
        inode_unref(e->ino);
        e->ino = ino;
        return true;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        mem_entry *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return false;
        t->v = v;
        t->cap = cap;
    }
    char *copy = strdup(path);
    if (!copy)
        return false;
    if (ino)
        ino->refs++;
    t->v[t->n++] = (mem_entry){copy, ino};
    return true;
}

static void table_del_at(mem_table *t, size_t i) {
    inode_unref(t->v[i].ino);
    free(t->v[i].path);
    t->v[i] = t->v[--t->n];
}

static void table_free(mem_table *t) {
    while (t->n > 0)
        table_del_at(t, t->n - 1);
    free(t->v);
    memset(t, 0, sizeof *t);
}

static bool is_root(const char *dir) {
    return strcmp(dir, ".") == 0 || strcmp(dir, "/") == 0;
}

static bool dir_exists(mem_env *m, const char *dir) {
    if (is_root(dir))
        return true;
    mem_entry *e = table_find(&m->live, dir);
    return e && !e->ino;
}

static mem_env *menv(st_env *env) {
    return (mem_env *)env;
}

/* Normalizes path into buf or fills err; the usual first step of every call. */
static st_code take_path(const char *path, char *buf, st_err *err) {
    if (!norm_path(path, buf))
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad path '%.64s' (empty or too long)",
                          path ? path : "");
    return ST_OK;
}

static st_code dead_handle(st_err *err, const char *path) {
    return st_err_set(err, ST_INTERNAL,
                      "%s: file handle opened before a simulated crash; reopen the file", path);
}

/* ---- writable files ---- */

static st_code mem_open_w(st_env *env, const char *path, bool truncate, st_wfile **out,
                          st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX], dir[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    st_wfile *f = malloc(sizeof *f + strlen(p) + 1);
    if (!f)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", p);
    strcpy(f->path, p);
    parent_of(p, dir);
    pthread_mutex_lock(&m->mu);
    mem_entry *e = table_find(&m->live, p);
    if (e && !e->ino) {
        rc = st_err_set(err, ST_FAILED_PRECONDITION, "open for writing %s: is a directory", p);
    } else if (!e && !dir_exists(m, dir)) {
        rc = st_err_set(err, ST_NOT_FOUND, "open for writing %s: no such file or directory", p);
    } else if (!e) {
        mem_inode *ino = calloc(1, sizeof *ino);
        if (!ino || !table_put(&m->live, p, ino)) {
            free(ino);
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory creating %s", p);
        } else {
            e = table_find(&m->live, p);
        }
    } else if (truncate) {
        e->ino->data.len = 0;
        e->ino->synced_len = 0;
    }
    if (rc == ST_OK) {
        f->env = m;
        f->ino = e->ino;
        f->ino->refs++;
        f->generation = m->generation;
    }
    pthread_mutex_unlock(&m->mu);
    if (rc != ST_OK) {
        free(f);
        return rc;
    }
    *out = f;
    return ST_OK;
}

static st_code mem_wopen(st_env *env, const char *path, st_wfile **out, st_err *err) {
    return mem_open_w(env, path, true, out, err);
}

/* Creates a missing file, as the POSIX env does (O_CREAT | O_APPEND). */
static st_code mem_wopen_append(st_env *env, const char *path, st_wfile **out, st_err *err) {
    return mem_open_w(env, path, false, out, err);
}

static st_code mem_append(st_wfile *f, const void *data, size_t len, st_err *err) {
    st_code rc = ST_OK;
    pthread_mutex_lock(&f->env->mu);
    if (f->generation != f->env->generation)
        rc = dead_handle(err, f->path);
    else if (st_buf_append(&f->ino->data, data, len) != ST_OK)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "write %s: out of memory", f->path);
    pthread_mutex_unlock(&f->env->mu);
    return rc;
}

/* Writes in place (zeros fill any gap past the end). The model keeps no older copy of bytes
 * overwritten below the synced length: a crash keeps the new ones, the harsher case for a reader
 * that must not trust them before the writer's next sync. */
static st_code mem_pwrite(st_wfile *f, uint64_t off, const void *data, size_t len, st_err *err) {
    st_code rc = ST_OK;
    pthread_mutex_lock(&f->env->mu);
    st_buf *b = &f->ino->data;
    if (f->generation != f->env->generation) {
        rc = dead_handle(err, f->path);
    } else if (off > SIZE_MAX - len ||
               (off + len > b->len && st_buf_reserve(b, (size_t)off + len - b->len) != ST_OK)) {
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "write %s: out of memory", f->path);
    } else {
        if (off > b->len)
            memset(b->data + b->len, 0, (size_t)off - b->len);
        memcpy(b->data + off, data, len);
        if (off + len > b->len)
            b->len = (size_t)off + len;
    }
    pthread_mutex_unlock(&f->env->mu);
    return rc;
}

static st_code mem_sync(st_wfile *f, st_err *err) {
    st_code rc = ST_OK;
    pthread_mutex_lock(&f->env->mu);
    if (f->generation != f->env->generation)
        rc = dead_handle(err, f->path);
    else
        f->ino->synced_len = f->ino->data.len;
    pthread_mutex_unlock(&f->env->mu);
    return rc;
}

static st_code mem_wclose(st_wfile *f, st_err *err) {
    (void)err;
    pthread_mutex_lock(&f->env->mu);
    inode_unref(f->ino);
    pthread_mutex_unlock(&f->env->mu);
    free(f);
    return ST_OK;
}

/* ---- readable files ---- */

static st_code mem_ropen(st_env *env, const char *path, st_rfile **out, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    st_rfile *f = malloc(sizeof *f + strlen(p) + 1);
    if (!f)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening %s", p);
    strcpy(f->path, p);
    pthread_mutex_lock(&m->mu);
    mem_entry *e = table_find(&m->live, p);
    if (!e)
        rc = st_err_set(err, ST_NOT_FOUND, "open %s: no such file or directory", p);
    else if (!e->ino)
        rc = st_err_set(err, ST_FAILED_PRECONDITION, "open %s: is a directory", p);
    if (rc == ST_OK) {
        f->env = m;
        f->ino = e->ino;
        f->ino->refs++;
        f->generation = m->generation;
    }
    pthread_mutex_unlock(&m->mu);
    if (rc != ST_OK) {
        free(f);
        return rc;
    }
    *out = f;
    return ST_OK;
}

static st_code mem_pread(st_rfile *f, uint64_t off, void *buf, size_t len, size_t *got,
                         st_err *err) {
    st_code rc = ST_OK;
    *got = 0;
    pthread_mutex_lock(&f->env->mu);
    if (f->generation != f->env->generation) {
        rc = dead_handle(err, f->path);
    } else if (off < f->ino->data.len) {
        size_t avail = f->ino->data.len - (size_t)off;
        *got = len < avail ? len : avail;
        memcpy(buf, f->ino->data.data + off, *got);
    }
    pthread_mutex_unlock(&f->env->mu);
    return rc;
}

static st_code mem_rsize(st_rfile *f, uint64_t *size, st_err *err) {
    st_code rc = ST_OK;
    pthread_mutex_lock(&f->env->mu);
    if (f->generation != f->env->generation)
        rc = dead_handle(err, f->path);
    else
        *size = f->ino->data.len;
    pthread_mutex_unlock(&f->env->mu);
    return rc;
}

static void mem_rclose(st_rfile *f) {
    pthread_mutex_lock(&f->env->mu);
    inode_unref(f->ino);
    pthread_mutex_unlock(&f->env->mu);
    free(f);
}

/* ---- names ---- */

static st_code mem_remove(st_env *env, const char *path, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&m->mu);
    mem_entry *e = table_find(&m->live, p);
    if (!e)
        rc = st_err_set(err, ST_NOT_FOUND, "remove %s: no such file or directory", p);
    else if (!e->ino)
        rc = st_err_set(err, ST_FAILED_PRECONDITION, "remove %s: is a directory", p);
    else
        table_del_at(&m->live, (size_t)(e - m->live.v));
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* rename (keep_from false) or link (keep_from true) of a file within the live table. */
static st_code mem_move(st_env *env, const char *from, const char *to, bool keep_from,
                        st_err *err) {
    mem_env *m = menv(env);
    char f[MEM_PATH_MAX], t[MEM_PATH_MAX], dir[MEM_PATH_MAX];
    st_code rc = take_path(from, f, err);
    if (rc == ST_OK)
        rc = take_path(to, t, err);
    if (rc != ST_OK)
        return rc;
    parent_of(t, dir);
    const char *what = keep_from ? "hard link to" : "rename to";
    pthread_mutex_lock(&m->mu);
    mem_entry *src = table_find(&m->live, f);
    mem_entry *dst = table_find(&m->live, t);
    if (!src || !dir_exists(m, dir))
        rc = st_err_set(err, ST_NOT_FOUND, "%s %s: no such file or directory", what, t);
    else if (!src->ino || (dst && !dst->ino))
        rc = st_err_set(err, ST_FAILED_PRECONDITION, "%s %s: is a directory", what, t);
    else if (keep_from && dst)
        rc = st_err_set(err, ST_ALREADY_EXISTS, "%s %s: file exists", what, t);
    if (rc == ST_OK && src != dst) {
        mem_inode *ino = src->ino;
        ino->refs++; /* keeps it alive while its old entry goes */
        if (!table_put(&m->live, t, ino))
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "%s %s: out of memory", what, t);
        else if (!keep_from)
            table_del_at(&m->live, (size_t)(table_find(&m->live, f) - m->live.v));
        inode_unref(ino);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static st_code mem_rename(st_env *env, const char *from, const char *to, st_err *err) {
    return mem_move(env, from, to, false, err);
}

static st_code mem_link(st_env *env, const char *from, const char *to, st_err *err) {
    return mem_move(env, from, to, true, err);
}

/* Creates one directory in both tables (directories are durable at once, see the top). */
static st_code mkdir_one(mem_env *m, const char *dir, st_err *err) {
    if (is_root(dir))
        return ST_OK;
    mem_entry *e = table_find(&m->live, dir);
    if (e && e->ino)
        return st_err_set(err, ST_FAILED_PRECONDITION, "mkdir %s: a file has that name", dir);
    if (e)
        return ST_OK;
    if (!table_put(&m->live, dir, NULL) || !table_put(&m->durable, dir, NULL))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "mkdir %s: out of memory", dir);
    return ST_OK;
}

static st_code mem_mkdirs(st_env *env, const char *path, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&m->mu);
    for (char *s = p + 1; rc == ST_OK && *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        rc = mkdir_one(m, p, err);
        *s = '/';
    }
    if (rc == ST_OK)
        rc = mkdir_one(m, p, err);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* Makes the live file entries of dir durable, and their absence too. */
static st_code mem_sync_dir(st_env *env, const char *path, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX], parent[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&m->mu);
    if (!dir_exists(m, p))
        rc = st_err_set(err, ST_NOT_FOUND, "open directory %s: no such file or directory", p);
    for (size_t i = 0; rc == ST_OK && i < m->durable.n;) {
        mem_entry *e = &m->durable.v[i];
        parent_of(e->path, parent);
        if (e->ino && strcmp(parent, p) == 0)
            table_del_at(&m->durable, i);
        else
            i++;
    }
    for (size_t i = 0; rc == ST_OK && i < m->live.n; i++) {
        mem_entry *e = &m->live.v[i];
        parent_of(e->path, parent);
        if (e->ino && strcmp(parent, p) == 0 && !table_put(&m->durable, e->path, e->ino))
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "fsync directory %s: out of memory", p);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static st_code mem_exists(st_env *env, const char *path, bool *out, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&m->mu);
    *out = is_root(p) || table_find(&m->live, p) != NULL;
    pthread_mutex_unlock(&m->mu);
    return ST_OK;
}

static st_code mem_file_size(st_env *env, const char *path, uint64_t *size, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX];
    st_code rc = take_path(path, p, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_lock(&m->mu);
    mem_entry *e = table_find(&m->live, p);
    if (!e)
        rc = st_err_set(err, ST_NOT_FOUND, "stat %s: no such file or directory", p);
    else
        *size = e->ino ? e->ino->data.len : 0;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* Copies the names in dir under the lock, then calls fn without it (fn may use the env). */
static st_code mem_list(st_env *env, const char *dir, st_code (*fn)(const char *, void *),
                        void *arg, st_err *err) {
    mem_env *m = menv(env);
    char p[MEM_PATH_MAX], parent[MEM_PATH_MAX];
    st_code rc = take_path(dir, p, err);
    if (rc != ST_OK)
        return rc;
    char **names = NULL;
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    if (!dir_exists(m, p))
        rc = st_err_set(err, ST_NOT_FOUND, "list directory %s: no such file or directory", p);
    else if (m->live.n && !(names = calloc(m->live.n, sizeof *names)))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "list directory %s: out of memory", p);
    for (size_t i = 0; rc == ST_OK && i < m->live.n; i++) {
        const char *path = m->live.v[i].path;
        parent_of(path, parent);
        if (strcmp(parent, p) != 0 || strcmp(path, p) == 0)
            continue;
        const char *slash = strrchr(path, '/');
        if (!(names[n] = strdup(slash ? slash + 1 : path)))
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "list directory %s: out of memory", p);
        else
            n++;
    }
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        if (rc == ST_OK)
            rc = fn(names[i], arg);
        free(names[i]);
    }
    free(names);
    return rc;
}

static void mem_destroy(st_env *env) {
    mem_env *m = menv(env);
    table_free(&m->live);
    table_free(&m->durable);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const st_env_ops mem_ops = {
    .wopen = mem_wopen,
    .wopen_append = mem_wopen_append,
    .append = mem_append,
    .pwrite = mem_pwrite,
    .sync = mem_sync,
    .wclose = mem_wclose,
    .ropen = mem_ropen,
    .pread = mem_pread,
    .rsize = mem_rsize,
    .rclose = mem_rclose,
    .remove = mem_remove,
    .rename = mem_rename,
    .link = mem_link,
    .mkdirs = mem_mkdirs,
    .sync_dir = mem_sync_dir,
    .exists = mem_exists,
    .file_size = mem_file_size,
    .list = mem_list,
    .destroy = mem_destroy,
};

st_env *st_env_mem_new(void) {
    mem_env *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->base.ops = &mem_ops;
    pthread_mutex_init(&m->mu, NULL);
    return &m->base;
}

/* ---- crash ---- */

/* Cuts the unsynced tail of one file. With garble, a random prefix of the unsynced bytes
 * survives, followed by random garbage of random length (never longer than what was written):
 * a torn write as disks produce it. */
static void crash_inode(mem_inode *ino, bool garble, st_rng *rng) {
    size_t len = ino->data.len, keep = ino->synced_len;
    if (garble && len > keep) {
        size_t unsynced = len - keep;
        keep += (size_t)st_rng_below(rng, unsynced + 1);
        size_t junk = (size_t)st_rng_below(rng, len - keep + 1);
        for (size_t i = 0; i < junk; i++)
            ino->data.data[keep + i] = (uint8_t)st_rng_next(rng);
        keep += junk;
    }
    ino->data.len = keep;
    ino->synced_len = keep;
}

void st_env_mem_crash(st_env *env, bool garble, uint64_t seed) {
    mem_env *m = menv(env);
    st_rng rng;
    st_rng_seed(&rng, seed);
    pthread_mutex_lock(&m->mu);
    m->generation++;
    for (size_t i = 0; i < m->durable.n; i++) {
        mem_inode *ino = m->durable.v[i].ino;
        if (ino && ino->crash_mark != m->generation) {
            ino->crash_mark = m->generation; /* hard links: cut each inode once */
            crash_inode(ino, garble, &rng);
        }
    }
    /* The live table becomes a copy of the durable one; entries reuse the same inodes. */
    table_free(&m->live);
    for (size_t i = 0; i < m->durable.n; i++) {
        /* Cannot fail for lack of memory in a meaningful way for tests; assert instead. */
        ST_ASSERT(table_put(&m->live, m->durable.v[i].path, m->durable.v[i].ino));
    }
    pthread_mutex_unlock(&m->mu);
}
