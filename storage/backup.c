/* backup.c — a tablet's files for a backup, and a tablet made of a backup's files
 * (docs/backups.md, "On a node").
 *
 * Freezing (sto_tablet_backup) flushes the tablet's memtable, then stops the tablet's writes at
 * its gate (as a split does) and waits for the records already in the log to be applied; it then
 * flushes what came meanwhile and captures
 * the SSTables the tablet lists, which now hold exactly its contents, with a reference on each,
 * and lets the writes go. The captured files are then hard-linked into the caller's directory
 * (the references keep a file a compaction replaced meanwhile on disk until then). SSTables are
 * immutable, so the links are the backup. A compaction of the tablet is not waited for: it
 * changes which files the tablet lists, never a file's bytes.
 *
 * Restoring (sto_tablet_restore) links a backup's files into <dir>/sst under new file numbers
 * and makes a tablet listing them, durable with one manifest write. A file some restored tablet
 * already lists (the same inode: the split children of the source table share their parent's
 * files, and so do their pieces) is not linked again: the new tablet lists it under its number,
 * as split children do, so a backup of the restored table holds it once, under one name. A crash
 * before the manifest write leaves links no tablet lists: the orphan sweep at the next open
 * removes them. The restored files' system families (the source table's change history) are
 * hidden: the tablet's sys_floor is set above their numbers (db_impl.h), and compactions of the
 * tablet drop those entries. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_impl.h"

static void unlink_all(sto_db *db, const char *dir, const sto_backup_file *files, size_t n) {
    char path[STO_PATH_MAX + 64];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%020" PRIu64 ".sst", dir, files[i].number);
        db->env->ops->remove(db->env, path, NULL);
    }
}

/* The files t lists, each with a reference on its table so that it stays on disk (an obsolete
 * table's file goes at its last unref) until it is linked. t->mu held. */
static st_code capture_files(sto_tablet *t, sto_backup_file **out, sto_sst ***ssts, size_t *n_out,
                             st_err *err) {
    size_t n = t->n_ssts;
    sto_backup_file *files = calloc(n ? n : 1, sizeof *files);
    sto_sst **refs = calloc(n ? n : 1, sizeof *refs);
    if (!files || !refs) {
        free(files);
        free(refs);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory listing a tablet's files");
    }
    for (size_t i = 0; i < n; i++) {
        sto_file *f = t->ssts[i].f;
        files[i] = (sto_backup_file){f->number, f->bytes};
        refs[i] = f->sst;
        sto_sst_ref(f->sst);
    }
    *out = files;
    *ssts = refs;
    *n_out = n;
    return ST_OK;
}

/* Links the captured files into dir; on failure none is left there. */
static st_code link_files(sto_db *db, const char *dir, const sto_backup_file *files, size_t n,
                          st_err *err) {
    char from[STO_PATH_MAX + 64], to[STO_PATH_MAX + 64];
    st_code rc = ST_OK;
    size_t done = 0;
    for (; rc == ST_OK && done < n; done++) {
        sto_db_sst_path(db, files[done].number, from, sizeof from);
        snprintf(to, sizeof to, "%s/%020" PRIu64 ".sst", dir, files[done].number);
        rc = db->env->ops->link(db->env, from, to, err);
    }
    if (rc != ST_OK)
        unlink_all(db, dir, files, done - 1);
    return rc;
}

/* Stops t's writes at its gate and waits for the records already in the log to be applied: from
 * then until the gate opens, t's contents cannot change. NOT_FOUND when t was split or dropped
 * while waiting. */
static st_code stop_writes(sto_db *db, sto_tablet *t, st_err *err) {
    pthread_rwlock_wrlock(&t->gate);
    pthread_mutex_lock(&db->mu);
    bool dead = t->dead;
    pthread_mutex_unlock(&db->mu);
    if (dead) {
        pthread_rwlock_unlock(&t->gate);
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node",
                          t->id);
    }
    pthread_mutex_lock(&t->mu);
    while (atomic_load(&t->inflight) > 0)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    return ST_OK;
}

/* Writes wait from stop_writes until the memtables are flushed and the file list captured
 * (with references); a compaction running meanwhile goes on, since the captured files keep
 * holding exactly the contents even once it replaces them. */
static st_code freeze(sto_db *db, sto_tablet *t, sto_backup_file **files, sto_sst ***refs,
                      size_t *n, st_err *err) {
    /* The memtable is flushed once before the writes stop, so the flush done while they wait
     * (a server's loop waits with them) holds only what came meanwhile. A failure here shows
     * again in that second flush. */
    pthread_mutex_lock(&t->mu);
    bool froze = sto_tablet_freeze_locked(t);
    pthread_mutex_unlock(&t->mu);
    if (froze)
        sto_tablet_flush_imms(db, t, NULL);
    st_code rc = stop_writes(db, t, err);
    if (rc != ST_OK)
        return rc;
    if (atomic_load(&t->ro_hint) && t->broken)
        rc = st_err_set(err, ST_DATA_LOSS, "tablet %" PRIu64 " is damaged: %s", t->id, t->ro_msg);
    if (rc == ST_OK) {
        pthread_mutex_lock(&t->mu);
        sto_tablet_freeze_locked(t);
        pthread_mutex_unlock(&t->mu);
        rc = sto_tablet_flush_imms(db, t, err);
    }
    if (rc == ST_OK) {
        pthread_mutex_lock(&t->mu);
        if (t->n_imm || !sto_memtable_empty(t->active))
            rc = st_err_set(err, ST_INTERNAL, "tablet %" PRIu64 " still had unflushed data", t->id);
        else
            rc = capture_files(t, files, refs, n, err);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_rwlock_unlock(&t->gate);
    return rc;
}

st_code sto_tablet_backup(sto_db *db, uint64_t id, const char *dir, sto_backup_file **files,
                          size_t *n, st_err *err) {
    *files = NULL;
    *n = 0;
    sto_tablet *t;
    if (sto_tablet_get(db, id, &t) != ST_OK)
        return st_err_set(err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by this node", id);
    /* A tablet held read-only for damage would make a backup whose restores fail to read. */
    pthread_mutex_lock(&t->mu);
    bool damaged = t->read_only;
    char why[sizeof t->ro_msg];
    snprintf(why, sizeof why, "%s", t->ro_msg);
    pthread_mutex_unlock(&t->mu);
    if (damaged)
        return st_err_set(err, ST_DATA_LOSS,
                          "tablet %" PRIu64 " is held read-only after damage was found (%s): "
                          "its backup would restore the damage; restore the table from an "
                          "earlier backup or repair the node first",
                          id, why);
    sto_sst **refs = NULL;
    st_code rc = freeze(db, t, files, &refs, n, err);
    if (rc == ST_OK)
        rc = link_files(db, dir, *files, *n, err);
    for (size_t i = 0; refs && i < *n; i++)
        sto_sst_unref(refs[i]);
    free(refs);
    if (rc == ST_OK && (rc = db->env->ops->sync_dir(db->env, dir, err)) != ST_OK)
        unlink_all(db, dir, *files, *n);
    if (rc != ST_OK) {
        free(*files);
        *files = NULL;
        *n = 0;
    }
    return rc;
}

st_code sto_tablet_mark_damaged(sto_db *db, uint64_t id, const char *why) {
    sto_tablet *t;
    if (sto_tablet_get(db, id, &t) != ST_OK)
        return ST_NOT_FOUND;
    sto_tablet_mark_read_only(t, ST_DATA_LOSS, why);
    return ST_OK;
}

/* ---- restore ---- */

typedef struct restore_arg {
    sto_restore_spec *v;
    size_t n;
} restore_arg;

/* Adds every spec that linked its files (rc ST_OK) to the manifest. */
static st_code restore_edit(sto_mf_state *st, void *arg, st_err *err) {
    restore_arg *a = arg;
    for (size_t k = 0; k < a->n; k++) {
        sto_tablet *t = a->v[k].rc == ST_OK ? a->v[k].out : NULL;
        if (!t)
            continue;
        uint64_t *nums = malloc((t->n_ssts ? t->n_ssts : 1) * sizeof *nums);
        if (!nums)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
        for (size_t i = 0; i < t->n_ssts; i++)
            nums[i] = t->ssts[i].f->number;
        st_code rc = sto_mf_add_tablet(st, t->id, st_buf_slice(&t->table), st_buf_slice(&t->start),
                                       st_buf_slice(&t->end), t->flushed_lsn, t->sys_floor, nums,
                                       t->n_ssts, err);
        free(nums);
        if (rc != ST_OK)
            return rc;
    }
    return ST_OK;
}

/* ---- restored files by identity: open addressing, linear probing ---- */

static size_t restored_slot(const sto_db *db, uint64_t dev, uint64_t ino) {
    uint64_t h = (ino ^ (dev * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
    return (size_t)(h ^ (h >> 31)) & (db->cap_restored - 1);
}

static sto_file *restored_find(const sto_db *db, uint64_t dev, uint64_t ino) {
    if (!db->cap_restored)
        return NULL;
    for (size_t i = restored_slot(db, dev, ino);; i = (i + 1) & (db->cap_restored - 1)) {
        sto_file *f = db->restored[i];
        if (!f || (f->dev == dev && f->ino == ino))
            return f;
    }
}

static void restored_put(sto_db *db, sto_file *f) {
    size_t i = restored_slot(db, f->dev, f->ino);
    while (db->restored[i])
        i = (i + 1) & (db->cap_restored - 1);
    db->restored[i] = f;
    db->n_restored++;
}

/* Without memory the file is simply not shared: the next tablet restored from it gets a link of
 * its own, as before there was sharing. */
static void restored_add(sto_db *db, sto_file *f, uint64_t dev, uint64_t ino) {
    if (2 * (db->n_restored + 1) > db->cap_restored) {
        size_t cap = db->cap_restored ? 2 * db->cap_restored : 64;
        sto_file **old = db->restored, **v = calloc(cap, sizeof *v);
        if (!v)
            return;
        size_t old_cap = db->cap_restored;
        db->restored = v;
        db->cap_restored = cap;
        db->n_restored = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i])
                restored_put(db, old[i]);
        free(old);
    }
    f->has_id = true;
    f->dev = dev;
    f->ino = ino;
    restored_put(db, f);
}

void sto_restored_forget(sto_db *db, sto_file *f) {
    if (!f->has_id)
        return;
    size_t mask = db->cap_restored - 1, i = restored_slot(db, f->dev, f->ino);
    while (db->restored[i] != f)
        i = (i + 1) & mask;
    db->restored[i] = NULL;
    db->n_restored--;
    f->has_id = false;
    /* the entries after it in its run move up into the hole when their home allows it */
    for (size_t j = (i + 1) & mask; db->restored[j]; j = (j + 1) & mask) {
        size_t home = restored_slot(db, db->restored[j]->dev, db->restored[j]->ino);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            db->restored[i] = db->restored[j];
            db->restored[j] = NULL;
            i = j;
        }
    }
}

/* The identity of the file at path, when the env can tell. */
static bool file_id(sto_db *db, const char *path, uint64_t *dev, uint64_t *ino) {
    return db->env->ops->file_id && db->env->ops->file_id(db->env, path, dev, ino, NULL) == ST_OK;
}

void sto_restored_load(sto_db *db) {
    char path[STO_PATH_MAX + 64];
    for (size_t k = 0; k < db->n_tablets; k++) {
        const sto_tablet *t = db->tablets[k];
        for (size_t i = 0; i < t->n_ssts; i++) {
            sto_file *f = t->ssts[i].f;
            uint64_t dev, ino;
            sto_db_sst_path(db, f->number, path, sizeof path);
            if (t->ssts[i].nosys && f->sst && !f->has_id && file_id(db, path, &dev, &ino) &&
                !restored_find(db, dev, ino))
                restored_add(db, f, dev, ino);
        }
    }
}

/* Undoes restore_link: files no other tablet lists go (no manifest lists them). meta_mu held. */
static void restore_unlink(sto_db *db, sto_tablet *t) {
    char path[STO_PATH_MAX + 64];
    for (size_t i = 0; i < t->n_ssts; i++) {
        sto_file *f = t->ssts[i].f;
        if (--f->tablet_refs > 0)
            continue; /* shared with a tablet restored before */
        sto_restored_forget(db, f);
        sto_db_sst_path(db, f->number, path, sizeof path);
        if (f->sst) {
            sto_sst_mark_obsolete(f->sst); /* removes the file at the last unref */
            sto_sst_unref(f->sst);
        } else {
            db->env->ops->remove(db->env, path, NULL);
        }
        free(f);
    }
    t->n_ssts = 0;
}

static bool tablet_lists(const sto_tablet *t, const sto_file *f) {
    for (size_t i = 0; i < t->n_ssts; i++)
        if (t->ssts[i].f == f)
            return true;
    return false;
}

/* The file at path for t: the restored file of the same identity when another tablet lists it
 * (one more reference), else a new link under a new number. meta_mu held. */
static st_code restore_file(sto_db *db, sto_tablet *t, const char *path, sto_file **out,
                            st_err *err) {
    uint64_t dev = 0, ino = 0;
    bool known = file_id(db, path, &dev, &ino);
    sto_file *f = known ? restored_find(db, dev, ino) : NULL;
    if (f && f->tablet_refs > 0 && !tablet_lists(t, f)) {
        f->tablet_refs++;
        *out = f;
        return ST_OK;
    }
    char to[STO_PATH_MAX + 64];
    uint64_t num = sto_db_new_file_number(db);
    sto_db_sst_path(db, num, to, sizeof to);
    st_code rc = db->env->ops->link(db->env, path, to, err);
    if (rc == ST_OK && (rc = sto_file_new(db, num, &f, err)) != ST_OK)
        db->env->ops->remove(db->env, to, NULL);
    if (rc != ST_OK)
        return rc;
    f->tablet_refs = 1;
    if (known && !restored_find(db, dev, ino))
        restored_add(db, f, dev, ino);
    *out = f;
    return ST_OK;
}

/* Lists paths[0, n) in t, each linked into <dir>/sst under a new number unless a restored tablet
 * lists the same file already (the directory is synced once for the batch, by the caller).
 * meta_mu held. */
static st_code restore_link(sto_db *db, sto_tablet *t, const char *const *paths, size_t n,
                            st_err *err) {
    t->ssts = calloc(n ? n : 1, sizeof *t->ssts);
    if (!t->ssts)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory restoring a tablet");
    t->cap_ssts = n ? n : 1;
    st_code rc = ST_OK;
    uint64_t top = 0;
    for (size_t i = 0; rc == ST_OK && i < n; i++) {
        sto_file *f = NULL;
        rc = restore_file(db, t, paths[i], &f, err);
        if (rc == ST_OK) {
            t->ssts[t->n_ssts++] = (sto_tsst){f, false, true};
            top = f->number > top ? f->number : top;
        }
    }
    if (rc == ST_OK) {
        /* every restored number is below the floor; files made for t later are above it */
        t->sys_floor = n ? top + 1 : 0;
        for (size_t i = 0; i < t->n_ssts; i++)
            t->ssts[i] = sto_tsst_of(t, t->ssts[i].f);
    }
    return rc;
}

static uint64_t restore_lsn(sto_db *db) {
    uint64_t a = atomic_load(&db->applied_lsn), d = sto_log_last_durable_lsn(db->log);
    return a > d ? a : d;
}

/* Allocates spec's tablet and links its files; its rc and err say why not. meta_mu held. */
static void restore_prepare(sto_db *db, sto_restore_spec *sp) {
    st_err *err = &sp->err;
    sp->out = NULL;
    if (sp->start.len > STO_ROW_KEY_MAX || sp->end.len > STO_ROW_KEY_MAX ||
        (sp->end.len && st_slice_cmp(sp->start, sp->end) >= 0)) {
        sp->rc = st_err_set(err, ST_INVALID_ARGUMENT,
                            "a restored tablet's range must be row keys of at most %d bytes, "
                            "start before end",
                            STO_ROW_KEY_MAX);
        return;
    }
    pthread_mutex_lock(&db->mu);
    bool exists = sto_db_find_locked(db, sp->id) != NULL;
    pthread_mutex_unlock(&db->mu);
    sto_tablet *t = NULL;
    sp->rc = exists
                 ? st_err_set(err, ST_ALREADY_EXISTS, "tablet %" PRIu64 " already exists", sp->id)
                 : sto_tablet_alloc(db, sp->id, sp->table, sp->start, sp->end, &t, err);
    if (sp->rc == ST_OK)
        sp->rc = restore_link(db, t, sp->paths, sp->n_paths, err);
    if (sp->rc == ST_OK) {
        t->flushed_lsn = t->last_applied_lsn = restore_lsn(db);
        pthread_mutex_lock(&t->mu);
        sto_tablet_update_hints_locked(t);
        pthread_mutex_unlock(&t->mu);
    }
    if (sp->rc != ST_OK && t) {
        restore_unlink(db, t);
        sto_tablet_release(t);
        t = NULL;
    }
    sp->out = t;
}

/* Undoes restore_prepare of a spec whose tablet will not be installed. meta_mu held. */
static void restore_abandon(sto_db *db, sto_restore_spec *sp, st_code rc, const st_err *err) {
    if (sp->rc != ST_OK)
        return;
    restore_unlink(db, sp->out);
    sto_tablet_release(sp->out);
    sp->out = NULL;
    sp->rc = rc;
    if (err)
        sp->err = *err;
}

/* One manifest write for the whole batch: a write per tablet costs a capture and a rewrite of
 * the node's whole tablet list, so restoring n tablets one by one cost n^2. */
void sto_tablets_restore(sto_db *db, sto_restore_spec *v, size_t n) {
    pthread_mutex_lock(&db->meta_mu);
    size_t ok = 0;
    for (size_t k = 0; k < n; k++) {
        pthread_mutex_lock(&db->mu);
        bool room = db->n_tablets + ok < STO_TABLETS_MAX;
        pthread_mutex_unlock(&db->mu);
        if (room)
            restore_prepare(db, &v[k]);
        else
            v[k].rc = st_err_set(&v[k].err, ST_RESOURCE_EXHAUSTED,
                                 "node holds %d tablets, the maximum", STO_TABLETS_MAX);
        ok += v[k].rc == ST_OK;
    }
    st_err err = {0};
    restore_arg a = {v, n};
    char sst[STO_PATH_MAX + 8];
    snprintf(sst, sizeof sst, "%s/sst", db->dir);
    st_code rc = ok ? db->env->ops->sync_dir(db->env, sst, &err) : ST_OK; /* the links */
    if (rc == ST_OK && ok)
        rc = sto_manifest_write(db, restore_edit, &a, &err);
    for (size_t k = 0; k < n; k++) {
        if (rc != ST_OK) {
            restore_abandon(db, &v[k], rc, &err);
            continue;
        }
        if (v[k].rc != ST_OK)
            continue;
        pthread_mutex_lock(&db->mu);
        st_code irc = sto_db_insert_locked(db, v[k].out, &err);
        pthread_mutex_unlock(&db->mu);
        if (irc != ST_OK) /* out of memory: the next manifest write forgets it */
            restore_abandon(db, &v[k], irc, &err);
    }
    pthread_mutex_unlock(&db->meta_mu);
    if (ok)
        sto_db_kick(db); /* many restored files may call for a compaction */
}

st_code sto_tablet_restore(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                           const char *const *paths, size_t n, sto_tablet **out, st_err *err) {
    sto_restore_spec sp = {
        .id = id, .table = table, .start = start, .end = end, .paths = paths, .n_paths = n};
    sto_tablets_restore(db, &sp, 1);
    if (sp.rc != ST_OK)
        return st_err_set(err, sp.rc, "%s", sp.err.msg);
    if (out)
        *out = sp.out;
    return ST_OK;
}

/* The caller names the file: the open's "opening SSTable <path>: " would leave little of the
 * message's room for what was wrong once the caller adds its own context. */
static void drop_open_prefix(st_err *err, const char *path) {
    char prefix[STO_PATH_MAX + 64];
    int n = snprintf(prefix, sizeof prefix, "opening SSTable %s: ", path);
    if (err && n > 0 && (size_t)n < sizeof prefix && strncmp(err->msg, prefix, (size_t)n) == 0)
        memmove(err->msg, err->msg + n, strlen(err->msg + n) + 1);
}

st_code sto_backup_file_verify(sto_db *db, const char *path, uint64_t version_max, st_err *err) {
    sto_sst *t = NULL;
    /* no cache: the id keys nothing, and the blocks are read once */
    st_code rc = sto_sst_open(db->env, path, 0, NULL, &t, err);
    if (rc != ST_OK)
        drop_open_prefix(err, path);
    if (rc == ST_OK)
        rc = sto_sst_verify(t, version_max, NULL, err);
    sto_sst_unref(t);
    return rc;
}
