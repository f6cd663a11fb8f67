/* manifest.c — the durable list of tablets, their SSTable files and flushed points, the next file
 * number and the log holders (format: docs/formats/manifest.md).
 *
 * The whole manifest is rewritten atomically (tmp + rename + directory sync) on every change: it
 * is small (tablets x files) and a rewrite has no partial states to recover from. Changes that
 * must not be visible before they are durable (create, split, drop, holders) are applied to a
 * captured copy first; flush and compaction results are installed in memory first (the data is
 * also in the log) and the log is trimmed, and compaction inputs deleted, only after a manifest
 * holding them was written. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

#define MF_MAGIC "STMANIF1"
#define MF_FORMAT 3u    /* 3: a tablet's sys_floor (restored files) */
#define MF_FORMAT_V2 2u /* read too: without sys_floor */
#define MF_FORMAT_V1 1u /* read too: without sys_floor and the log position */
#define MF_HEADER_BYTES 24u
#define MF_FILES_MAX 1000000u /* files named by one manifest */

typedef struct mf_header {
    char magic[8];
    uint32_t format;
    uint32_t crc; /* masked crc32c of the body */
    uint64_t body_len;
} mf_header;
_Static_assert(sizeof(mf_header) == MF_HEADER_BYTES, "manifest header is 24 bytes on disk");

typedef struct mf_tablet {
    uint64_t id;
    st_slice table, start, end;
    uint64_t flushed_lsn;
    uint64_t sys_floor;
    uint64_t *files;
    size_t n_files;
} mf_tablet;

struct sto_mf_state {
    uint64_t next_file;
    mf_tablet *t;
    size_t n, cap;
    sto_holder h[STO_HOLDERS_MAX];
    size_t n_h;
    uint64_t log_end;   /* the log's durable end when captured (the trim computes from it) */
    uint64_t log_first; /* recorded: the oldest segment the trim keeps, 0 for none or no sync */
    uint64_t log_last;  /* recorded: log_end with sync on, else 0 */
    st_arena arena;
};

static void mf_free(sto_mf_state *st) {
    free(st->t);
    st_arena_deinit(&st->arena);
}

static st_code mf_grow(sto_mf_state *st) {
    if (st->n < st->cap)
        return ST_OK;
    size_t ncap = st->cap ? st->cap * 2 : 16;
    mf_tablet *p = realloc(st->t, ncap * sizeof *p);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    st->t = p;
    st->cap = ncap;
    return ST_OK;
}

static st_slice mf_dup(sto_mf_state *st, st_slice s) {
    if (!s.len)
        return st_slice_make("", 0);
    void *p = st_arena_dup(&st->arena, s.data, s.len);
    return p ? st_slice_make(p, s.len) : st_slice_make(NULL, SIZE_MAX);
}

st_code sto_mf_add_tablet(sto_mf_state *st, uint64_t id, st_slice table, st_slice start,
                          st_slice end, uint64_t flushed_lsn, uint64_t sys_floor,
                          const uint64_t *files, size_t n, st_err *err) {
    if (mf_grow(st) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
    mf_tablet *m = &st->t[st->n];
    m->id = id;
    m->table = mf_dup(st, table);
    m->start = mf_dup(st, start);
    m->end = mf_dup(st, end);
    m->flushed_lsn = flushed_lsn;
    m->sys_floor = sys_floor;
    m->n_files = n;
    m->files = n ? st_arena_alloc(&st->arena, n * sizeof(uint64_t)) : NULL;
    if (m->table.len == SIZE_MAX || m->start.len == SIZE_MAX || m->end.len == SIZE_MAX ||
        (n && !m->files))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
    if (n)
        memcpy(m->files, files, n * sizeof(uint64_t));
    st->n++;
    return ST_OK;
}

st_code sto_mf_remove_tablet(sto_mf_state *st, uint64_t id) {
    for (size_t i = 0; i < st->n; i++) {
        if (st->t[i].id == id) {
            memmove(&st->t[i], &st->t[i + 1], (st->n - i - 1) * sizeof(mf_tablet));
            st->n--;
            return ST_OK;
        }
    }
    return ST_NOT_FOUND;
}

st_code sto_mf_set_holder(sto_mf_state *st, const char *name, uint64_t lsn, bool remove,
                          st_err *err) {
    size_t i = 0;
    while (i < st->n_h && strcmp(st->h[i].name, name) != 0)
        i++;
    if (remove) {
        if (i < st->n_h)
            st->h[i] = st->h[--st->n_h];
        return ST_OK;
    }
    if (i == st->n_h) {
        if (st->n_h >= STO_HOLDERS_MAX)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "at most %d log holders",
                              STO_HOLDERS_MAX);
        st->n_h++;
    }
    snprintf(st->h[i].name, sizeof st->h[i].name, "%s", name);
    st->h[i].lsn = lsn;
    return ST_OK;
}

/* The flushed point to record: a tablet whose memtables are empty has every record up to the
 * last applied lsn (read before looking) in SSTables, which lets idle tablets stop pinning the
 * log. meta_mu is held, so no flush can be half-installed. */
static st_code capture_tablet(sto_mf_state *st, sto_tablet *t, uint64_t applied, st_err *err) {
    pthread_mutex_lock(&t->mu);
    uint64_t flushed = t->flushed_lsn;
    if (t->n_imm == 0 && sto_memtable_empty(t->active) && applied > flushed)
        flushed = applied;
    uint64_t stack[64], *files = stack;
    if (t->n_ssts > 64)
        files = malloc(t->n_ssts * sizeof(uint64_t));
    st_code rc = ST_OK;
    if (!files) {
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
    } else {
        for (size_t i = 0; i < t->n_ssts; i++)
            files[i] = t->ssts[i].f->number;
        rc = sto_mf_add_tablet(st, t->id, st_buf_slice(&t->table), st_buf_slice(&t->start),
                               st_buf_slice(&t->end), flushed, t->sys_floor, files, t->n_ssts, err);
    }
    pthread_mutex_unlock(&t->mu);
    if (files != stack)
        free(files);
    return rc;
}

static st_code capture(sto_db *db, sto_mf_state *st, st_err *err) {
    memset(st, 0, sizeof *st);
    st_arena_init(&st->arena, 64 << 10);
    uint64_t applied = atomic_load(&db->applied_lsn);
    st->log_end = db->log ? sto_log_last_durable_lsn(db->log) : 0;
    pthread_mutex_lock(&db->mu);
    st->next_file = db->next_file;
    memcpy(st->h, db->holders, sizeof st->h);
    st->n_h = db->n_holders;
    st_code rc = ST_OK;
    for (size_t i = 0; i < db->n_tablets && rc == ST_OK; i++)
        rc = capture_tablet(st, db->tablets[i], applied, err);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

static st_code put_lp(st_buf *b, st_slice s) {
    st_code rc = st_buf_append_varint64(b, s.len);
    return rc == ST_OK ? st_buf_append(b, s.data, s.len) : rc;
}

static st_code encode(const sto_mf_state *st, st_buf *out) {
    st_code rc = st_buf_append(out, MF_MAGIC, 8);
    uint8_t zero[16] = {0};
    rc = rc ? rc : st_buf_append(out, zero, 16);
    rc = rc ? rc : st_buf_append_varint64(out, st->next_file);
    rc = rc ? rc : st_buf_append_varint64(out, st->n);
    for (size_t i = 0; i < st->n && rc == ST_OK; i++) {
        const mf_tablet *m = &st->t[i];
        rc = st_buf_append_varint64(out, m->id);
        rc = rc ? rc : put_lp(out, m->table);
        rc = rc ? rc : put_lp(out, m->start);
        rc = rc ? rc : put_lp(out, m->end);
        rc = rc ? rc : st_buf_append_varint64(out, m->flushed_lsn);
        rc = rc ? rc : st_buf_append_varint64(out, m->sys_floor);
        rc = rc ? rc : st_buf_append_varint64(out, m->n_files);
        for (size_t j = 0; j < m->n_files && rc == ST_OK; j++)
            rc = st_buf_append_varint64(out, m->files[j]);
    }
    rc = rc ? rc : st_buf_append_varint64(out, st->n_h);
    for (size_t i = 0; i < st->n_h && rc == ST_OK; i++) {
        rc = put_lp(out, st_slice_cstr(st->h[i].name));
        rc = rc ? rc : st_buf_append_varint64(out, st->h[i].lsn);
    }
    rc = rc ? rc : st_buf_append_varint64(out, st->log_first);
    rc = rc ? rc : st_buf_append_varint64(out, st->log_last);
    if (rc != ST_OK)
        return rc;
    size_t body = out->len - MF_HEADER_BYTES;
    st_put_fixed32(out->data + 8, MF_FORMAT);
    st_put_fixed32(out->data + 12, st_crc_mask(st_crc32c(0, out->data + MF_HEADER_BYTES, body)));
    st_put_fixed64(out->data + 16, body);
    return ST_OK;
}

/* Log records still needed: those after the oldest recorded flushed point, and those every holder
 * has not passed. The last record always stays, so the log keeps its lsn sequence. Computed from
 * the captured state, so the segment the manifest names as the oldest needed (log_first) is the
 * one the trim after its write keeps. */
static uint64_t log_keep(const sto_mf_state *st) {
    uint64_t keep = st->log_end;
    for (size_t i = 0; i < st->n; i++)
        if (st->t[i].flushed_lsn + 1 < keep)
            keep = st->t[i].flushed_lsn + 1;
    for (size_t i = 0; i < st->n_h; i++)
        if (st->h[i].lsn < keep)
            keep = st->h[i].lsn;
    return keep;
}

static void trim_log(sto_db *db, uint64_t keep) {
    if (!db->log || keep <= 1)
        return;
    /* The files go in the log's background thread: unlinking 64 MB segments and syncing the
     * directory here cost the flush thread about 0.2 s per GB written. */
    st_err e;
    if (sto_log_trim_async(db->log, keep, &e) != ST_OK)
        st_log(ST_LOG_WARN, "storage", "event=log_trim_failed msg=\"%s\"", e.msg);
}

/* What the manifest records of the log: with sync on, the oldest segment that must exist and
 * the durable end, which recovery checks the log against (a segment removed from outside). With
 * sync off neither is durable when recorded, so nothing is. */
static void log_position(sto_db *db, sto_mf_state *st, uint64_t keep) {
    bool on = db->o.sync && db->log;
    st->log_first = on ? sto_log_segment_first(db->log, keep) : 0;
    st->log_last = on ? st->log_end : 0;
}

st_code sto_manifest_write(sto_db *db, sto_mf_edit_fn edit, void *arg, st_err *err) {
    sto_mf_state st;
    st_buf out;
    st_buf_init(&out);
    st_code rc = capture(db, &st, err);
    if (rc == ST_OK && edit)
        rc = edit(&st, arg, err);
    uint64_t keep = log_keep(&st);
    log_position(db, &st, keep);
    if (rc == ST_OK && encode(&st, &out) != ST_OK)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
    char path[STO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", db->dir);
    if (rc == ST_OK)
        rc = st_env_write_atomic(db->env, path, out.data, out.len, err);
    if (rc == ST_OK) {
        atomic_store(&db->manifest_dirty, false);
        sto_db_release_obsolete(db);
        trim_log(db, keep);
    } else {
        atomic_store(&db->manifest_dirty, true);
        st_log(ST_LOG_WARN, "storage", "event=manifest_write_failed code=%s msg=\"%s\"",
               st_code_name(rc), err ? err->msg : "");
    }
    st_buf_free(&out);
    mf_free(&st);
    return rc;
}

/* ---- loading ---- */

static st_code corrupt(st_err *err, const char *path, const char *what) {
    return st_err_set(err, ST_DATA_LOSS,
                      "manifest %s is corrupt (%s): the node's tablet list cannot be trusted; "
                      "restore this node's data from a replica or a backup",
                      path, what);
}

static bool get_lp(const uint8_t **p, const uint8_t *end, st_slice *s) {
    return st_get_len_prefixed(p, end, s);
}

static st_code decode(sto_mf_state *st, st_slice data, const char *path, st_err *err) {
    if (data.len < MF_HEADER_BYTES || memcmp(data.data, MF_MAGIC, 8) != 0)
        return corrupt(err, path, "bad magic or short file");
    uint32_t format = st_get_fixed32(data.data + 8);
    if (format != MF_FORMAT && format != MF_FORMAT_V2 && format != MF_FORMAT_V1)
        return corrupt(err, path, "unknown format version");
    uint64_t body = st_get_fixed64(data.data + 16);
    if (body != data.len - MF_HEADER_BYTES)
        return corrupt(err, path, "length mismatch");
    const uint8_t *p = data.data + MF_HEADER_BYTES, *end = data.data + data.len;
    if (st_crc_unmask(st_get_fixed32(data.data + 12)) != st_crc32c(0, p, (size_t)body))
        return corrupt(err, path, "checksum mismatch");
    uint64_t n, nh;
    if (!st_get_varint64(&p, end, &st->next_file) || !st_get_varint64(&p, end, &n) ||
        n > STO_TABLETS_MAX)
        return corrupt(err, path, "bad header fields");
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id, flushed, nf, floor = 0;
        st_slice table, start, stop;
        if (!st_get_varint64(&p, end, &id) || !get_lp(&p, end, &table) ||
            !get_lp(&p, end, &start) || !get_lp(&p, end, &stop) ||
            !st_get_varint64(&p, end, &flushed) ||
            (format == MF_FORMAT && !st_get_varint64(&p, end, &floor)) ||
            !st_get_varint64(&p, end, &nf) || nf > MF_FILES_MAX || nf > (uint64_t)(end - p))
            return corrupt(err, path, "bad tablet entry");
        uint64_t *files = nf ? malloc(nf * sizeof(uint64_t)) : NULL;
        if (nf && !files)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the manifest");
        bool ok = true;
        for (uint64_t j = 0; j < nf && ok; j++)
            ok = st_get_varint64(&p, end, &files[j]);
        st_code rc =
            ok ? sto_mf_add_tablet(st, id, table, start, stop, flushed, floor, files, nf, err)
               : corrupt(err, path, "bad file list");
        free(files);
        if (rc != ST_OK)
            return rc;
    }
    if (!st_get_varint64(&p, end, &nh) || nh > STO_HOLDERS_MAX)
        return corrupt(err, path, "bad holder count");
    for (uint64_t i = 0; i < nh; i++) {
        st_slice name;
        if (!get_lp(&p, end, &name) || name.len == 0 || name.len >= STO_HOLDER_NAME_MAX ||
            !st_get_varint64(&p, end, &st->h[i].lsn))
            return corrupt(err, path, "bad holder");
        memcpy(st->h[i].name, name.data, name.len);
        st->h[i].name[name.len] = '\0';
        st->n_h++;
    }
    if (format != MF_FORMAT_V1 &&
        (!st_get_varint64(&p, end, &st->log_first) || !st_get_varint64(&p, end, &st->log_last)))
        return corrupt(err, path, "bad commit log position");
    return p == end ? ST_OK : corrupt(err, path, "trailing bytes");
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_file_number(const void *key, const void *elem) {
    uint64_t x = *(const uint64_t *)key, y = (*(sto_file *const *)elem)->number;
    return x < y ? -1 : x > y;
}

/* Opens every distinct file once (split children share them). A file that cannot be opened is
 * kept as a placeholder (sst NULL) so the tablets listing it turn read-only with the reason. */
static st_code open_files(sto_db *db, const sto_mf_state *st, sto_file ***out, size_t *n_out,
                          st_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < st->n; i++)
        total += st->t[i].n_files;
    uint64_t *nums = malloc((total ? total : 1) * sizeof(uint64_t));
    sto_file **files = calloc(total ? total : 1, sizeof(sto_file *));
    if (!nums || !files) {
        free(nums);
        free(files);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory opening SSTables");
    }
    size_t k = 0;
    for (size_t i = 0; i < st->n; i++)
        for (size_t j = 0; j < st->t[i].n_files; j++)
            nums[k++] = st->t[i].files[j];
    qsort(nums, total, sizeof(uint64_t), cmp_u64);
    size_t n = 0;
    for (size_t i = 0; i < total; i++) {
        if (n && files[n - 1]->number == nums[i])
            continue;
        st_err e;
        st_err_clear(&e);
        if (sto_file_new(db, nums[i], &files[n], &e) != ST_OK) {
            st_log(ST_LOG_ERROR, "storage", "event=sst_open_failed file=%" PRIu64 " msg=\"%s\"",
                   nums[i], e.msg);
            files[n] = calloc(1, sizeof(sto_file));
            if (!files[n])
                break;
            files[n]->number = nums[i];
        }
        n++;
    }
    free(nums);
    *out = files;
    *n_out = n;
    return ST_OK;
}

static st_code build_tablet(sto_db *db, const mf_tablet *m, sto_file **files, size_t n_files,
                            st_err *err) {
    sto_tablet *t;
    st_code rc = sto_tablet_alloc(db, m->id, m->table, m->start, m->end, &t, err);
    if (rc != ST_OK)
        return rc;
    t->flushed_lsn = t->last_applied_lsn = m->flushed_lsn;
    t->sys_floor = m->sys_floor;
    t->ssts = calloc(m->n_files ? m->n_files : 1, sizeof(sto_tsst));
    if (!t->ssts) {
        sto_tablet_release(t);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory loading tablets");
    }
    t->cap_ssts = m->n_files ? m->n_files : 1;
    for (size_t j = 0; j < m->n_files; j++) {
        sto_file **fp = bsearch(&m->files[j], files, n_files, sizeof(sto_file *), cmp_file_number);
        ST_ASSERT(fp);
        sto_file *f = *fp;
        f->tablet_refs++;
        t->ssts[t->n_ssts++] = sto_tsst_of(t, f);
        if (!f->sst && !t->broken) {
            t->broken = t->read_only = true;
            snprintf(t->ro_msg, sizeof t->ro_msg,
                     "SSTable %020" PRIu64 ".sst of tablet %" PRIu64
                     " is missing or corrupt; restore the tablet from a replica or backup",
                     f->number, t->id);
            atomic_store(&t->ro_hint, true);
        }
    }
    sto_tablet_update_hints_locked(t);
    pthread_mutex_lock(&db->mu);
    rc = sto_db_insert_locked(db, t, err);
    pthread_mutex_unlock(&db->mu);
    if (rc != ST_OK) {
        for (size_t j = 0; j < t->n_ssts; j++)
            t->ssts[j].f->tablet_refs--;
        t->n_ssts = 0;
        sto_tablet_release(t);
    }
    return rc;
}

static st_code load_state(sto_db *db, sto_mf_state *st, uint64_t *replay_from, st_err *err) {
    sto_file **files = NULL;
    size_t n_files = 0;
    st_code rc = open_files(db, st, &files, &n_files, err);
    if (rc != ST_OK)
        return rc;
    uint64_t min_flushed = UINT64_MAX, max_file = 0;
    for (size_t i = 0; i < st->n && rc == ST_OK; i++) {
        rc = build_tablet(db, &st->t[i], files, n_files, err);
        if (st->t[i].flushed_lsn < min_flushed)
            min_flushed = st->t[i].flushed_lsn;
    }
    for (size_t i = 0; i < n_files; i++) {
        if (files[i]->number > max_file)
            max_file = files[i]->number;
        if (files[i]->tablet_refs == 0) { /* only when a tablet failed to load */
            if (files[i]->sst)
                sto_sst_unref(files[i]->sst);
            free(files[i]);
        }
    }
    free(files);
    sto_restored_load(db);
    db->next_file = st->next_file > max_file ? st->next_file : max_file + 1;
    memcpy(db->holders, st->h, sizeof db->holders);
    db->n_holders = st->n_h;
    db->mf_log_first = st->log_first;
    db->mf_log_last = st->log_last;
    *replay_from = min_flushed == UINT64_MAX ? 1 : min_flushed + 1;
    return rc;
}

st_code sto_manifest_load(sto_db *db, uint64_t *replay_from, st_err *err) {
    char path[STO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", db->dir);
    st_buf data;
    st_buf_init(&data);
    *replay_from = 1;
    st_code rc = st_env_read_all(db->env, path, &data, err);
    if (rc == ST_NOT_FOUND) {
        st_buf_free(&data);
        st_err_clear(err);
        return ST_OK;
    }
    sto_mf_state st;
    memset(&st, 0, sizeof st);
    st_arena_init(&st.arena, 64 << 10);
    if (rc == ST_OK)
        rc = decode(&st, st_buf_slice(&data), path, err);
    if (rc == ST_OK)
        rc = load_state(db, &st, replay_from, err);
    mf_free(&st);
    st_buf_free(&data);
    return rc;
}

/* ---- orphans ---- */

typedef struct orphan_ctx {
    sto_db *db;
    uint64_t *live;
    size_t n_live;
    uint64_t *unknown; /* unlisted tables numbered at or after next_file */
    size_t n_unknown, cap_unknown;
    bool oom;
} orphan_ctx;

/* Removes leftover .tmp files and unlisted tables below next_file (ones the manifest itself
 * dropped, a compaction's input or a dropped tablet, before their removal finished); collects
 * the unlisted ones at or after it, which the manifest never knew. */
static st_code orphan_fn(const char *name, void *arg) {
    orphan_ctx *c = arg;
    uint64_t num = 0;
    char tail[8] = "";
    size_t len = strlen(name);
    bool is_sst =
        len == 24 && sscanf(name, "%20" SCNu64 "%7s", &num, tail) == 2 && strcmp(tail, ".sst") == 0;
    bool is_tmp = len > 4 && strcmp(name + len - 4, ".tmp") == 0;
    if (!is_sst && !is_tmp)
        return ST_OK;
    if (is_sst && bsearch(&num, c->live, c->n_live, sizeof(uint64_t), cmp_u64))
        return ST_OK;
    if (is_sst && num >= c->db->next_file) {
        if (c->n_unknown == c->cap_unknown) {
            size_t cap = c->cap_unknown ? c->cap_unknown * 2 : 16;
            uint64_t *u = realloc(c->unknown, cap * sizeof *u);
            if (!u) {
                c->oom = true;
                return ST_RESOURCE_EXHAUSTED;
            }
            c->unknown = u;
            c->cap_unknown = cap;
        }
        c->unknown[c->n_unknown++] = num;
        return ST_OK;
    }
    char path[STO_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/sst/%s", c->db->dir, name);
    st_log(ST_LOG_INFO, "storage", "event=orphan_removed path=%s", path);
    c->db->env->ops->remove(c->db->env, path, NULL);
    return ST_OK;
}

/* The highest version among the commit log's stored records. */
static st_code log_newest_version(sto_db *db, uint64_t *out, st_err *err) {
    sto_log_reader *r = NULL;
    st_code rc = sto_log_reader_open(db, sto_log_oldest_lsn(db->log), &r, err);
    uint64_t lsn;
    st_slice payload;
    *out = 0;
    while (rc == ST_OK && (rc = sto_log_reader_next_raw(r, &lsn, &payload, err)) == ST_OK) {
        sto_row_mut m;
        if (sto_row_mut_peek(payload, &m) && m.version > *out)
            *out = m.version;
    }
    sto_log_reader_close(r);
    return rc == ST_NOT_FOUND || rc == ST_OUT_OF_RANGE ? ST_OK : rc;
}

/* The highest entry version of the table at path; 0 when it does not open or verify (a crashed
 * write's torn output). */
static uint64_t sst_newest_version(sto_db *db, const char *path) {
    sto_sst *t = NULL;
    uint64_t newest = 0;
    st_err e = {0};
    if (sto_sst_open(db->env, path, 0, NULL, &t, &e) == ST_OK &&
        sto_sst_verify(t, UINT64_MAX, &newest, &e) != ST_OK)
        newest = 0;
    sto_sst_unref(t);
    return newest;
}

/* The highest entry version of the listed tables: read whole, so only once an unlisted table
 * is newer than the log. */
static uint64_t listed_newest_version(orphan_ctx *c) {
    char path[STO_PATH_MAX + 320];
    uint64_t newest = 0;
    for (size_t i = 0; i < c->n_live; i++) {
        sto_db_sst_path(c->db, c->live[i], path, sizeof path);
        uint64_t v = sst_newest_version(c->db, path);
        newest = v > newest ? v : newest;
    }
    return newest;
}

/* The first of the collected tables holding a version newer than every log record and every
 * listed table, or SIZE_MAX when none does. A flush or compaction that crashed before its
 * manifest write leaves a table whose entries came from the log or from listed tables, so never
 * newer than both. The log alone is no bound: replicated rows carry their origin's commit time
 * and a move's copied rows their source's, so a flushed table can hold versions above every
 * record the log kept. A newer one was listed by a newer manifest: the MANIFEST and log are
 * older copies. *bound is the log's and listed tables' newest version. */
static st_code orphans_newer(orphan_ctx *c, size_t *first, uint64_t *newest, uint64_t *bound,
                             st_err *err) {
    *first = SIZE_MAX;
    *bound = 0;
    bool log_known = false, listed_known = false;
    char path[STO_PATH_MAX + 320];
    for (size_t i = 0; i < c->n_unknown && *first == SIZE_MAX; i++) {
        sto_db_sst_path(c->db, c->unknown[i], path, sizeof path);
        uint64_t v = sst_newest_version(c->db, path);
        if (v && !log_known) {
            st_code rc = log_newest_version(c->db, bound, err);
            if (rc != ST_OK)
                return rc;
            log_known = true;
        }
        if (v > *bound && !listed_known) {
            uint64_t listed = listed_newest_version(c);
            *bound = listed > *bound ? listed : *bound;
            listed_known = true;
        }
        if (v > *bound) {
            *first = i;
            *newest = v;
        }
    }
    return ST_OK;
}

/* When one unknown table is newer than the log, none of them can be taken for a crash's
 * leftover (one may hold the only copy of data whose listed tables a newer manifest had
 * compacted away): every one is kept. The open is refused, or with accept_data_loss each is
 * renamed to <name>.aside (never read, never deleted) and the older state is served. */
static st_code orphans_keep(orphan_ctx *c, size_t first, uint64_t newest, uint64_t bound,
                            st_err *err) {
    sto_db *db = c->db;
    char path[STO_PATH_MAX + 320], aside[STO_PATH_MAX + 340];
    sto_db_sst_path(db, c->unknown[first], path, sizeof path);
    st_log(ST_LOG_ERROR, "storage",
           "event=orphan_newer_than_log path=%s next_file=%" PRIu64 " newest_us=%" PRId64
           " known_newest_us=%" PRId64 " unlisted=%zu",
           path, db->next_file, STO_VERSION_TS_US(newest), STO_VERSION_TS_US(bound), c->n_unknown);
    if (!db->o.accept_data_loss)
        return st_err_set(err, ST_DATA_LOSS,
                          "%s/MANIFEST and the commit log are older than sst/%020" PRIu64
                          ".sst: the MANIFEST never listed that table, yet it holds writes newer "
                          "than every log record and listed table (older copies put back?). "
                          "Nothing was deleted: restore the MANIFEST and log that go with the "
                          "tables, or start with --accept-data-loss to set unlisted tables aside "
                          "as *.aside and serve the older state (harmless after a crash mid table "
                          "restore)",
                          db->dir, c->unknown[first]);
    for (size_t i = 0; i < c->n_unknown; i++) {
        sto_db_sst_path(db, c->unknown[i], path, sizeof path);
        snprintf(aside, sizeof aside, "%s.aside", path);
        st_code rc = db->env->ops->rename(db->env, path, aside, err);
        if (rc != ST_OK)
            return rc;
        st_log(ST_LOG_ERROR, "storage",
               "event=orphan_set_aside path=%s msg=\"not listed by the MANIFEST, which is older "
               "than the tables (accepted data loss): its writes are not served; kept as %s\"",
               path, aside);
    }
    return ST_OK;
}

st_code sto_manifest_remove_orphans(sto_db *db, st_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < db->n_tablets; i++)
        total += db->tablets[i]->n_ssts;
    orphan_ctx c = {.db = db, .live = malloc((total ? total : 1) * sizeof(uint64_t))};
    st_code rc = ST_OK;
    if (c.live) {
        for (size_t i = 0; i < db->n_tablets; i++)
            for (size_t j = 0; j < db->tablets[i]->n_ssts; j++)
                c.live[c.n_live++] = db->tablets[i]->ssts[j].f->number;
        qsort(c.live, c.n_live, sizeof(uint64_t), cmp_u64);
        char dir[STO_PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/sst", db->dir);
        db->env->ops->list(db->env, dir, orphan_fn, &c, NULL);
    }
    if (!c.live || c.oom)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory listing unlisted SSTables");
    size_t first = SIZE_MAX;
    uint64_t newest = 0, bound = 0;
    if (rc == ST_OK)
        rc = orphans_newer(&c, &first, &newest, &bound, err);
    if (rc == ST_OK && first != SIZE_MAX)
        rc = orphans_keep(&c, first, newest, bound, err);
    for (size_t i = 0; rc == ST_OK && first == SIZE_MAX && i < c.n_unknown; i++) {
        char path[STO_PATH_MAX + 320];
        sto_db_sst_path(db, c.unknown[i], path, sizeof path);
        st_log(ST_LOG_INFO, "storage", "event=orphan_removed path=%s", path);
        db->env->ops->remove(db->env, path, NULL);
    }
    free(c.live);
    free(c.unknown);
    return rc;
}
