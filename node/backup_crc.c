/* backup_crc.c — the node's cache of SSTable CRC32Cs and the background pass that fills it
 * (docs/backups.md, "On a node").
 *
 * A piece's manifest holds each file's CRC32C. Reading a file back to compute it at the freeze
 * would make a backup cost a full read of the table, so a low-priority thread checksums every
 * SSTable soon after it is written (flush, compaction, split, restore link), while it is likely
 * still in the page cache, at most BK_CRC_BG_BYTES_PER_S, and records the result by inode. A
 * freeze then reads only the files the pass has not reached yet: normally just the one its own
 * flush wrote. After a restart the pass works through the existing files the same way.
 *
 * The cache is keyed by device, inode, size and modification time: a file some piece links
 * keeps all four (SSTables are never rewritten, a hard link shares the inode), and an inode
 * number reused by a new file after a delete comes with another modification time. An SSTable
 * is written by appends only, so a file still being written changes size: the pass records a
 * CRC only when the file's stat before and after the read agree with the bytes read, and skips
 * files modified in the last BK_CRC_BG_SETTLE_NS (a writer is most likely still at them).
 *
 * A CRC32C only says a later copy is the same bytes, so a file damaged before its backup would
 * be blessed with a matching one. Whoever reads a live SSTable for its CRC therefore also checks
 * it through (sto_backup_file_verify: every block's checksum, the footer, index and key order)
 * right after, while its pages are still cached, and the entry records the outcome: a freeze takes
 * a cached CRC only from a file found sound, and reads and checks anything else itself. */
#include "backup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "strata/storage.h"

#define BK_CRC_CACHE_MAX 200000
#define BK_CRC_BG_INTERVAL_MS 1000                  /* between two passes */
#define BK_CRC_BG_SETTLE_NS ((int64_t)1000000000)   /* files untouched this long */
#define BK_CRC_BG_BYTES_PER_S ((uint64_t)128 << 20) /* the pass's read rate bound */
#define BK_CRC_BG_CHUNK ((size_t)1 << 20)
#define BK_CRC_RECEIVED_PASSES 3600 /* about an hour at one pass a second */
/* How long a CRC32C this node computed by reading a file stands for the file's bytes at a
 * restore (bk_file_crc_fresh): long enough for the pieces of one restore that share a file (a
 * split's halves, restored close together in key order) to read it once, short enough that the
 * check speaks of the file as it is now, not as it was when the backup was made. */
#define BK_CRC_TRUST_US ((int64_t)600 * 1000000)

struct bk_crc_entry {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
    uint32_t crc;
    uint64_t gen;  /* the background pass that last saw the file (or the one running) */
    uint8_t state; /* bk_sst_state: whether the file was checked through as an SSTable */
    /* st_mono_us when the file's bytes were last read to compute crc; 0 when crc came from
     * elsewhere (a manifest, the chunks written) */
    int64_t read_mono_us;
};

typedef enum bk_sst_state { BK_SST_UNCHECKED = 0, BK_SST_SOUND, BK_SST_DAMAGED } bk_sst_state;

static bk_crc_entry key_of(const struct stat *sb) {
    return (bk_crc_entry){.dev = (uint64_t)sb->st_dev,
                          .ino = (uint64_t)sb->st_ino,
                          .size = (uint64_t)sb->st_size,
                          .mtime_ns =
                              (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec};
}

static bool crc_key(const char *path, bk_crc_entry *k) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return false;
    *k = key_of(&sb);
    return true;
}

static bool same_file(const bk_crc_entry *a, const bk_crc_entry *b) {
    return a->ino == b->ino && a->dev == b->dev && a->size == b->size && a->mtime_ns == b->mtime_ns;
}

static bk_crc_entry *crc_find(node_backups *b, const bk_crc_entry *k) {
    for (size_t i = 0; i < b->n_crcs; i++)
        if (same_file(&b->crcs[i], k))
            return &b->crcs[i];
    return NULL;
}

/* crc_mu held. */
static void crc_put(node_backups *b, const bk_crc_entry *k) {
    bk_crc_entry *e = crc_find(b, k);
    if (e) {
        /* the read time stays with the CRC32C that read found */
        if (e->crc != k->crc || k->read_mono_us > e->read_mono_us)
            e->read_mono_us = k->read_mono_us;
        if (e->crc != k->crc || k->state != BK_SST_UNCHECKED) /* same bytes: same verdict */
            e->state = k->state;
        e->crc = k->crc;
        if (e->gen < b->crc_gen) /* a received file's later expiry stays (crc_append) */
            e->gen = b->crc_gen;
        return;
    }
    if (b->n_crcs == BK_CRC_CACHE_MAX)
        b->n_crcs = 0; /* start over: the cache only saves reads */
    if (b->n_crcs == b->cap_crcs) {
        size_t cap = b->cap_crcs ? b->cap_crcs * 2 : 256;
        bk_crc_entry *v = realloc(b->crcs, cap * sizeof *v);
        if (!v)
            return;
        b->crcs = v;
        b->cap_crcs = cap;
    }
    b->crcs[b->n_crcs] = *k;
    b->crcs[b->n_crcs++].gen = b->crc_gen;
}

static void crc_remember(node_backups *b, const char *path, uint64_t size, uint32_t crc,
                         bk_sst_state state) {
    bk_crc_entry k;
    if (!crc_key(path, &k) || k.size != size)
        return;
    k.crc = crc;
    k.state = (uint8_t)state;
    pthread_mutex_lock(&b->crc_mu);
    crc_put(b, &k);
    pthread_mutex_unlock(&b->crc_mu);
}

void bk_crc_remember(node_backups *b, const char *path, uint64_t size, uint32_t crc) {
    crc_remember(b, path, size, crc, BK_SST_UNCHECKED);
}

/* A chunk written at the end of a file whose CRC32C so far the cache knows (or that was empty). */
static void crc_append(node_backups *b, const struct stat *before, const struct stat *after,
                       st_slice data) {
    bk_crc_entry k = key_of(before), n = key_of(after);
    uint32_t crc = 0;
    pthread_mutex_lock(&b->crc_mu);
    bk_crc_entry *e = k.size == 0 ? NULL : crc_find(b, &k);
    bool known = k.size == 0 || e != NULL;
    if (e)
        crc = e->crc;
    pthread_mutex_unlock(&b->crc_mu);
    if (!known || n.size != k.size + data.len)
        return;                                  /* the seal reads the file back */
    n.crc = st_crc32c(crc, data.data, data.len); /* outside the lock: up to a chunk of bytes */
    pthread_mutex_lock(&b->crc_mu);
    e = k.size == 0 ? NULL : crc_find(b, &k);
    if (e) { /* the entry follows the file as it grows: one entry per file, not per chunk */
        e->dev = n.dev, e->ino = n.ino, e->size = n.size, e->mtime_ns = n.mtime_ns;
        e->crc = n.crc;
        e->state = BK_SST_UNCHECKED;
        e->read_mono_us = 0; /* computed from the chunks, not read back: never trusted */
    } else {
        crc_put(b, &n);
        e = crc_find(b, &n);
    }
    /* A received file is not in the SSTable directory the background pass lists: kept for
     * BK_CRC_RECEIVED_PASSES passes (its seal, and links from later pieces of the import). */
    if (e)
        e->gen = b->crc_gen + BK_CRC_RECEIVED_PASSES;
    pthread_mutex_unlock(&b->crc_mu);
}

/* ---- files received out of order ---- */

#define BK_RX_FILES 64  /* files with chunks out of order followed at once */
#define BK_RX_RANGES 32 /* separate ranges of one such file */

typedef struct bk_rx_range {
    uint64_t off, len;
    uint32_t crc;
} bk_rx_range;

struct bk_rx {
    uint64_t dev, ino, size; /* size and mtime: the file after its last chunk */
    int64_t mtime_ns;
    size_t n;
    bk_rx_range r[BK_RX_RANGES]; /* by offset, none touching the next */
};

static bk_rx *rx_find(node_backups *b, uint64_t dev, uint64_t ino) {
    for (size_t i = 0; i < b->n_rx; i++)
        if (b->rx[i].ino == ino && b->rx[i].dev == dev)
            return &b->rx[i];
    return NULL;
}

static void rx_drop(node_backups *b, bk_rx *x) {
    *x = b->rx[--b->n_rx];
}

/* Adds [off, off + len) with its CRC32C, joined to the ranges it touches; false when it
 * overlaps one (a chunk written twice) or the file has too many ranges. */
static bool rx_add(bk_rx *x, uint64_t off, uint64_t len, uint32_t crc) {
    size_t i = 0;
    while (i < x->n && x->r[i].off + x->r[i].len <= off)
        i++;
    if (i < x->n && x->r[i].off < off + len)
        return false;
    bk_rx_range *prev = i > 0 && x->r[i - 1].off + x->r[i - 1].len == off ? &x->r[i - 1] : NULL;
    bk_rx_range *next = i < x->n && x->r[i].off == off + len ? &x->r[i] : NULL;
    if (prev) {
        prev->crc = st_crc32c_combine(prev->crc, crc, len);
        prev->len += len;
        if (next) {
            prev->crc = st_crc32c_combine(prev->crc, next->crc, next->len);
            prev->len += next->len;
            memmove(next, next + 1, (x->n - i - 1) * sizeof *next);
            x->n--;
        }
        return true;
    }
    if (next) {
        next->crc = st_crc32c_combine(crc, next->crc, next->len);
        next->off = off;
        next->len += len;
        return true;
    }
    if (x->n == BK_RX_RANGES)
        return false;
    memmove(&x->r[i + 1], &x->r[i], (x->n - i) * sizeof x->r[0]);
    x->r[i] = (bk_rx_range){off, len, crc};
    x->n++;
    return true;
}

/* The file of k, stat'd before a chunk, as a file received out of order; NULL when its CRC so
 * far is unknown. crc_mu held. */
static bk_rx *rx_of(node_backups *b, const bk_crc_entry *k) {
    bk_rx *x = rx_find(b, k->dev, k->ino);
    if (x && (x->size != k->size || x->mtime_ns != k->mtime_ns)) {
        rx_drop(b, x); /* changed since its last chunk here */
        return NULL;
    }
    if (x)
        return x;
    const bk_crc_entry *e = k->size ? crc_find(b, k) : NULL;
    if (k->size && !e)
        return NULL;
    if (!b->rx && !(b->rx = calloc(BK_RX_FILES, sizeof *b->rx)))
        return NULL;
    if (b->n_rx == BK_RX_FILES)
        rx_drop(b, &b->rx[0]); /* a file whose import stopped, most likely: its seal reads */
    x = &b->rx[b->n_rx++];
    *x = (bk_rx){.dev = k->dev, .ino = k->ino};
    if (k->size)
        x->r[x->n++] = (bk_rx_range){0, k->size, e->crc};
    return x;
}

/* crc_mu held. */
static void rx_write(node_backups *b, const bk_crc_entry *k, const bk_crc_entry *after,
                     uint64_t off, uint64_t len, uint32_t crc) {
    bk_rx *x = rx_of(b, k);
    if (!x)
        return;
    if (len && !rx_add(x, off, len, crc)) {
        rx_drop(b, x);
        return;
    }
    x->size = after->size;
    x->mtime_ns = after->mtime_ns;
    if (x->n != 1 || x->r[0].off != 0 || x->r[0].len != after->size)
        return;
    bk_crc_entry whole = *after; /* the ranges joined up: the file's CRC32C is known */
    whole.crc = x->r[0].crc;
    rx_drop(b, x);
    crc_put(b, &whole);
    bk_crc_entry *e = crc_find(b, &whole);
    if (e)
        e->gen = b->crc_gen + BK_CRC_RECEIVED_PASSES;
}

void bk_crc_write(node_backups *b, const struct stat *before, const struct stat *after,
                  uint64_t off, st_slice data) {
    bk_crc_entry k = key_of(before), n = key_of(after);
    pthread_mutex_lock(&b->crc_mu);
    bool append = off == k.size && !rx_find(b, k.dev, k.ino);
    pthread_mutex_unlock(&b->crc_mu);
    if (append) {
        crc_append(b, before, after, data);
        return;
    }
    uint32_t crc = st_crc32c(0, data.data, data.len); /* outside the lock */
    pthread_mutex_lock(&b->crc_mu);
    rx_write(b, &k, &n, off, data.len, crc);
    pthread_mutex_unlock(&b->crc_mu);
}

/* Counts a file a freeze read back. */
static void freeze_read(node_backups *b, uint64_t size) {
    pthread_mutex_lock(&b->crc_mu);
    b->freeze_read_files++;
    b->freeze_read_bytes += size;
    pthread_mutex_unlock(&b->crc_mu);
}

/* Which cached CRC32Cs a caller takes (crc_lookup). */
typedef enum bk_crc_trust {
    BK_TRUST_ANY,   /* any: the file is the same (dev, inode, size, mtime) */
    BK_TRUST_FRESH, /* read by this node less than BK_CRC_TRUST_US ago */
    BK_TRUST_SOUND, /* checked through as an SSTable and found sound */
} bk_crc_trust;

/* The cached CRC32C of path the caller trusts, with its size: true on a hit. *k: path's key
 * (valid when *known). */
static bool crc_lookup(node_backups *b, const char *path, bk_crc_trust trust, int64_t now,
                       bk_crc_entry *k, bool *known, uint64_t *size, uint32_t *crc) {
    *known = crc_key(path, k);
    if (!*known)
        return false;
    pthread_mutex_lock(&b->crc_mu);
    const bk_crc_entry *e = crc_find(b, k);
    bool hit =
        e &&
        (trust == BK_TRUST_ANY ||
         (trust == BK_TRUST_FRESH && e->read_mono_us && now - e->read_mono_us <= BK_CRC_TRUST_US) ||
         (trust == BK_TRUST_SOUND && e->state == BK_SST_SOUND));
    if (hit)
        *crc = e->crc;
    pthread_mutex_unlock(&b->crc_mu);
    if (hit)
        *size = k->size;
    return hit;
}

st_code bk_file_crc_cached(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                           bool *read, st_err *err) {
    bk_crc_entry k;
    bool known;
    *read = false;
    if (crc_lookup(b, path, BK_TRUST_ANY, 0, &k, &known, size, crc))
        return ST_OK;
    st_code rc = bk_file_crc(path, size, crc, err);
    if (rc != ST_OK)
        return rc;
    *read = true;
    bk_crc_remember(b, path, *size, *crc);
    freeze_read(b, *size);
    return ST_OK;
}

st_code bk_file_crc_fresh(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                          bool *read, st_err *err) {
    bk_crc_entry k, after;
    bool known;
    *read = false;
    int64_t now = st_mono_us();
    if (crc_lookup(b, path, BK_TRUST_FRESH, now, &k, &known, size, crc))
        return ST_OK;
    st_code rc = bk_file_crc(path, size, crc, err);
    if (rc != ST_OK)
        return rc;
    *read = true;
    /* Recorded only when the file did not change while it was read (as the background pass). */
    if (!known || !crc_key(path, &after) || !same_file(&k, &after) || k.size != *size)
        return ST_OK;
    k.crc = *crc;
    k.read_mono_us = now;
    pthread_mutex_lock(&b->crc_mu);
    crc_put(b, &k);
    bk_crc_entry *e = crc_find(b, &k);
    if (e && e->gen < b->crc_gen + BK_CRC_RECEIVED_PASSES)
        e->gen = b->crc_gen + BK_CRC_RECEIVED_PASSES; /* a file only pieces hold: not pruned */
    pthread_mutex_unlock(&b->crc_mu);
    return ST_OK;
}

st_code bk_sst_crc_checked(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                           bool *read, st_err *err) {
    bk_crc_entry k;
    bool known;
    *read = false;
    if (crc_lookup(b, path, BK_TRUST_SOUND, 0, &k, &known, size, crc))
        return ST_OK;
    /* Two reads: the CRC32C's, then the check's from the page cache (the check reads by block,
     * the footer and index first, so it cannot ride on the sequential read). */
    st_code rc = bk_file_crc(path, size, crc, err);
    if (rc != ST_OK)
        return rc;
    *read = true;
    freeze_read(b, *size);
    rc = sto_backup_file_verify(b->db, path, UINT64_MAX, err);
    if (rc == ST_OK || rc == ST_DATA_LOSS)
        crc_remember(b, path, *size, *crc, rc == ST_OK ? BK_SST_SOUND : BK_SST_DAMAGED);
    return rc;
}

void bk_crc_counters(node_backups *b, bk_crc_stats *out) {
    pthread_mutex_lock(&b->crc_mu);
    *out = (bk_crc_stats){b->freeze_read_files, b->freeze_read_bytes, b->bg_read_files,
                          b->bg_read_bytes};
    pthread_mutex_unlock(&b->crc_mu);
}

/* ---- at open: the CRCs the pieces on disk already list ---- */

static void crc_load_dir(node_ctx *n, const char *dir, int depth) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || (depth == 3 && bk_piece_check(e->d_name, NULL) != ST_OK))
            continue;
        char path[NODE_BK_PATH_MAX];
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path)
            continue; /* no piece has such a path: the node never makes one */
        if (depth < 3) {
            crc_load_dir(n, path, depth + 1);
            continue;
        }
        bk_piece *p = NULL;
        if (bk_manifest_read(path, NULL, &p, NULL) != ST_OK)
            continue;
        for (size_t i = 0; i < p->n_files; i++) {
            char file[NODE_BK_PATH_MAX + 80];
            if (bk_file_check(p->files[i]->name, NULL) != ST_OK)
                continue;
            snprintf(file, sizeof file, "%s/%s", path, p->files[i]->name);
            bk_crc_remember(n->backups, file, p->files[i]->size, p->files[i]->crc32c);
        }
        bk_piece_free(p);
    }
    if (d)
        closedir(d);
}

void bk_crc_load(node_ctx *n) {
    char root[NODE_BK_PATH_MAX];
    bk_root_dir(n, root, sizeof root);
    crc_load_dir(n, root, 0);
}

/* ---- the background pass ---- */

/* Sleeps until the monotonic deadline (µs) or until the node closes: false when it closes. */
static bool bg_wait_until(node_backups *b, int64_t mono_deadline_us) {
    pthread_mutex_lock(&b->crc_mu);
    while (!b->crc_stop) {
        int64_t left = mono_deadline_us - st_mono_us();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (left % 1000000) * 1000;
        ts.tv_sec += left / 1000000 + ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&b->crc_cv, &b->crc_mu, &ts);
    }
    bool go = !b->crc_stop;
    pthread_mutex_unlock(&b->crc_mu);
    return go;
}

/* The CRC32C of path read at most BK_CRC_BG_BYTES_PER_S; false on an error or at close. */
static bool bg_file_crc(node_backups *b, int fd, uint8_t *buf, uint64_t *size, uint32_t *crc) {
    uint64_t total = 0;
    uint32_t c = 0;
    int64_t t0 = st_mono_us();
    for (;;) {
        ssize_t got = read(fd, buf, BK_CRC_BG_CHUNK);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return false;
        if (got == 0)
            break;
        c = st_crc32c(c, buf, (size_t)got);
        total += (uint64_t)got;
        if (!bg_wait_until(b, t0 + (int64_t)(total * 1000000 / BK_CRC_BG_BYTES_PER_S)))
            return false;
    }
    *size = total;
    *crc = c;
    return true;
}

/* Checksums one file the cache does not know yet and records it if it did not change; false
 * when it is left for a later pass. */
static bool bg_one(node_backups *b, const char *path, const struct stat *before, uint8_t *buf) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true; /* deleted meanwhile (compaction) */
    uint64_t size = 0;
    uint32_t crc = 0;
    int64_t read_us = st_mono_us();
    bool ok = bg_file_crc(b, fd, buf, &size, &crc);
    close(fd);
    struct stat after;
    bk_crc_entry k = key_of(before), now;
    if (!ok)
        return false;
    if (stat(path, &after) != 0)
        return true; /* deleted meanwhile */
    now = key_of(&after);
    if (!same_file(&k, &now) || size != k.size)
        return false; /* still being written: a later pass takes it */
    st_err err = {0};
    st_code rc = sto_backup_file_verify(b->db, path, UINT64_MAX, &err);
    if (rc == ST_NOT_FOUND)
        return true; /* deleted meanwhile */
    if (rc != ST_OK && rc != ST_DATA_LOSS)
        return false;       /* out of memory, an I/O error: a later pass tries again */
    if (rc == ST_DATA_LOSS) /* its tablet's next backup fails, naming the file */
        st_log(ST_LOG_ERROR, "backup", "event=sst_damaged path=%s reason=\"%s\"", path, err.msg);
    k.crc = crc;
    k.read_mono_us = read_us;
    k.state = rc == ST_OK ? BK_SST_SOUND : BK_SST_DAMAGED;
    pthread_mutex_lock(&b->crc_mu);
    crc_put(b, &k);
    b->bg_read_files++;
    b->bg_read_bytes += size;
    pthread_mutex_unlock(&b->crc_mu);
    return true;
}

/* True when the cache knows the file and whether it is sound; marks it seen by this pass. A CRC
 * known from a piece's manifest or an import's chunks is of bytes never checked as an SSTable. */
static bool bg_known(node_backups *b, const struct stat *sb) {
    bk_crc_entry k = key_of(sb);
    pthread_mutex_lock(&b->crc_mu);
    bk_crc_entry *e = crc_find(b, &k);
    if (e && e->gen < b->crc_gen)
        e->gen = b->crc_gen;
    bool known = e != NULL && e->state != BK_SST_UNCHECKED;
    pthread_mutex_unlock(&b->crc_mu);
    return known;
}

/* Drops the entries of files this pass did not see (compacted away, or only in pieces): a
 * freeze links live SSTables only, so those would never be asked for again. */
static void bg_prune(node_backups *b, uint64_t gen) {
    pthread_mutex_lock(&b->crc_mu);
    size_t w = 0;
    for (size_t i = 0; i < b->n_crcs; i++)
        if (b->crcs[i].gen >= gen)
            b->crcs[w++] = b->crcs[i];
    b->n_crcs = w;
    pthread_mutex_unlock(&b->crc_mu);
}

static bool is_sst(const char *name) {
    size_t len = strlen(name);
    return name[0] != '.' && len > 4 && strcmp(name + len - 4, ".sst") == 0;
}

/* One pass over the SSTable directory; *pending counts the files left for a later pass (too
 * fresh, or changed while read). False when the node closes. */
static bool bg_pass(node_backups *b, uint8_t *buf, uint64_t *pending) {
    DIR *d = opendir(b->sst_dir);
    if (!d)
        return true; /* no SSTable yet */
    pthread_mutex_lock(&b->crc_mu);
    uint64_t gen = ++b->crc_gen;
    pthread_mutex_unlock(&b->crc_mu);
    bool go = true;
    struct dirent *e;
    while (go && (e = readdir(d)) != NULL) {
        if (!is_sst(e->d_name))
            continue;
        char path[NODE_BK_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", b->sst_dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || bg_known(b, &sb))
            continue;
        int64_t mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if (st_wall_us() * 1000 - mtime_ns < BK_CRC_BG_SETTLE_NS || !bg_one(b, path, &sb, buf))
            ++*pending;
        go = bg_wait_until(b, 0);
    }
    closedir(d);
    if (go)
        bg_prune(b, gen);
    return go;
}

static void *bg_thread(void *arg) {
    node_backups *b = arg;
    uint8_t *buf = malloc(BK_CRC_BG_CHUNK);
    bk_crc_stats s0, s1;
    bk_crc_counters(b, &s0);
    uint64_t pending = 0;
    while (buf && bg_pass(b, buf, &pending)) {
        bk_crc_counters(b, &s1);
        if (s1.bg_files != s0.bg_files)
            st_log(ST_LOG_INFO, "backup",
                   "event=crc_background files=%" PRIu64 " bytes=%" PRIu64 " pending=%" PRIu64
                   " total_files=%" PRIu64 " total_bytes=%" PRIu64,
                   s1.bg_files - s0.bg_files, s1.bg_bytes - s0.bg_bytes, pending, s1.bg_files,
                   s1.bg_bytes);
        pending = 0;
        s0 = s1;
        if (!bg_wait_until(b, st_mono_us() + BK_CRC_BG_INTERVAL_MS * 1000))
            break;
    }
    free(buf);
    return NULL;
}

st_code bk_crc_bg_start(node_ctx *n, st_err *err) {
    node_backups *b = n->backups;
    snprintf(b->sst_dir, sizeof b->sst_dir, "%s/storage/sst", n->data_dir);
    b->db = n->db;
    int r = pthread_create(&b->crc_thread, NULL, bg_thread, b);
    if (r != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "could not start the backup checksum thread (%s); free resources and "
                          "restart the node",
                          strerror(r));
    b->crc_thread_on = true;
    return ST_OK;
}

void bk_crc_bg_stop(node_backups *b) {
    if (!b->crc_thread_on)
        return;
    pthread_mutex_lock(&b->crc_mu);
    b->crc_stop = true;
    pthread_cond_broadcast(&b->crc_cv);
    pthread_mutex_unlock(&b->crc_mu);
    pthread_join(b->crc_thread, NULL);
    b->crc_thread_on = false;
}
