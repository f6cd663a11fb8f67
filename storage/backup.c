/* backup.c — a tablet's files for a backup, and a tablet made of a backup's files
 * (docs/backups.md, "On a node").
 *
 * Freezing (sto_tablet_backup) claims the tablet as a split does: its writes wait at the gate,
 * the records already in the log are applied, no flush or compaction of it runs. The memtables
 * are then flushed and the SSTables the tablet lists, which now hold exactly its contents, are
 * hard-linked into the caller's directory. SSTables are immutable, so the links are the backup.
 *
 * Restoring (sto_tablet_restore) links a backup's files into <dir>/sst under new file numbers
 * and makes a tablet listing them, durable with one manifest write. A crash before that write
 * leaves links no tablet lists: the orphan sweep at the next open removes them. The restored
 * files' system families (the source table's change history) are hidden: the tablet's sys_floor
 * is set above their numbers (db_impl.h), and compactions of the tablet drop those entries. */
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

/* Links the files t lists into dir (t claimed, memtables flushed). */
static st_code link_files(sto_db *db, sto_tablet *t, const char *dir, sto_backup_file **out,
                          size_t *n_out, st_err *err) {
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_ssts;
    sto_backup_file *files = calloc(n ? n : 1, sizeof *files);
    for (size_t i = 0; files && i < n; i++)
        files[i] = (sto_backup_file){t->ssts[i].f->number, t->ssts[i].f->bytes};
    pthread_mutex_unlock(&t->mu);
    if (!files)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory listing a tablet's files");
    char from[STO_PATH_MAX + 64], to[STO_PATH_MAX + 64];
    st_code rc = ST_OK;
    size_t done = 0;
    for (; rc == ST_OK && done < n; done++) {
        sto_db_sst_path(db, files[done].number, from, sizeof from);
        snprintf(to, sizeof to, "%s/%020" PRIu64 ".sst", dir, files[done].number);
        rc = db->env->ops->link(db->env, from, to, err);
    }
    if (rc != ST_OK) {
        unlink_all(db, dir, files, done - 1);
        free(files);
        return rc;
    }
    *out = files;
    *n_out = n;
    return ST_OK;
}

st_code sto_tablet_backup(sto_db *db, uint64_t id, const char *dir, sto_backup_file **files,
                          size_t *n, st_err *err) {
    *files = NULL;
    *n = 0;
    sto_tablet *t;
    st_code rc = sto_tablet_claim_exclusive(db, id, &t, err);
    if (rc != ST_OK)
        return rc;
    if (atomic_load(&t->ro_hint) && t->broken)
        rc = st_err_set(err, ST_DATA_LOSS, "tablet %" PRIu64 " is damaged: %s", id, t->ro_msg);
    if (rc == ST_OK) {
        pthread_mutex_lock(&t->mu);
        sto_tablet_freeze_locked(t);
        pthread_mutex_unlock(&t->mu);
        rc = sto_tablet_flush_imms(db, t, err);
    }
    if (rc == ST_OK)
        rc = link_files(db, t, dir, files, n, err);
    sto_tablet_release_exclusive(db, t);
    /* The links exist; making their names durable need not hold the tablet's writes. */
    if (rc == ST_OK && (rc = db->env->ops->sync_dir(db->env, dir, err)) != ST_OK) {
        unlink_all(db, dir, *files, *n);
        free(*files);
        *files = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- restore ---- */

typedef struct restore_arg {
    sto_tablet *t;
} restore_arg;

static st_code restore_edit(sto_mf_state *st, void *arg, st_err *err) {
    sto_tablet *t = ((restore_arg *)arg)->t;
    uint64_t *nums = malloc((t->n_ssts ? t->n_ssts : 1) * sizeof *nums);
    if (!nums)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory writing the manifest");
    for (size_t i = 0; i < t->n_ssts; i++)
        nums[i] = t->ssts[i].f->number;
    st_code rc = sto_mf_add_tablet(st, t->id, st_buf_slice(&t->table), st_buf_slice(&t->start),
                                   st_buf_slice(&t->end), t->flushed_lsn, t->sys_floor, nums,
                                   t->n_ssts, err);
    free(nums);
    return rc;
}

/* Undoes restore_link: the files go (no manifest lists them). meta_mu held. */
static void restore_unlink(sto_db *db, sto_tablet *t) {
    char path[STO_PATH_MAX + 64];
    for (size_t i = 0; i < t->n_ssts; i++) {
        sto_file *f = t->ssts[i].f;
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

/* Links paths[0, n) into <dir>/sst under new numbers and lists them in t. meta_mu held. */
static st_code restore_link(sto_db *db, sto_tablet *t, const char *const *paths, size_t n,
                            st_err *err) {
    t->ssts = calloc(n ? n : 1, sizeof *t->ssts);
    if (!t->ssts)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory restoring a tablet");
    t->cap_ssts = n ? n : 1;
    uint64_t *nums = calloc(n ? n : 1, sizeof *nums);
    if (!nums)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory restoring a tablet");
    char to[STO_PATH_MAX + 64];
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < n; i++) {
        nums[i] = sto_db_new_file_number(db);
        sto_db_sst_path(db, nums[i], to, sizeof to);
        rc = db->env->ops->link(db->env, paths[i], to, err);
        sto_file *f = NULL;
        if (rc == ST_OK && (rc = sto_file_new(db, nums[i], &f, err)) != ST_OK)
            db->env->ops->remove(db->env, to, NULL);
        if (rc == ST_OK) {
            f->tablet_refs = 1;
            t->ssts[t->n_ssts++] = (sto_tsst){f, false, true};
        }
    }
    if (rc == ST_OK) {
        /* every restored number is below the floor; files made for t later are above it */
        t->sys_floor = n ? nums[n - 1] + 1 : 0;
        for (size_t i = 0; i < t->n_ssts; i++)
            t->ssts[i] = sto_tsst_of(t, t->ssts[i].f);
        snprintf(to, sizeof to, "%s/sst", db->dir);
        rc = db->env->ops->sync_dir(db->env, to, err);
    }
    free(nums);
    return rc;
}

static uint64_t restore_lsn(sto_db *db) {
    uint64_t a = atomic_load(&db->applied_lsn), d = sto_log_last_durable_lsn(db->log);
    return a > d ? a : d;
}

st_code sto_tablet_restore(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                           const char *const *paths, size_t n, sto_tablet **out, st_err *err) {
    if (start.len > STO_ROW_KEY_MAX || end.len > STO_ROW_KEY_MAX ||
        (end.len && st_slice_cmp(start, end) >= 0))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "a restored tablet's range must be row keys of at most %d bytes, start "
                          "before end",
                          STO_ROW_KEY_MAX);
    pthread_mutex_lock(&db->meta_mu);
    pthread_mutex_lock(&db->mu);
    bool exists = sto_db_find_locked(db, id) != NULL;
    pthread_mutex_unlock(&db->mu);
    sto_tablet *t = NULL;
    st_code rc = exists
                     ? st_err_set(err, ST_ALREADY_EXISTS, "tablet %" PRIu64 " already exists", id)
                     : sto_tablet_alloc(db, id, table, start, end, &t, err);
    if (rc == ST_OK)
        rc = restore_link(db, t, paths, n, err);
    if (rc == ST_OK) {
        t->flushed_lsn = t->last_applied_lsn = restore_lsn(db);
        pthread_mutex_lock(&t->mu);
        sto_tablet_update_hints_locked(t);
        pthread_mutex_unlock(&t->mu);
        restore_arg a = {t};
        rc = sto_manifest_write(db, restore_edit, &a, err);
    }
    if (rc == ST_OK) {
        pthread_mutex_lock(&db->mu);
        rc = sto_db_insert_locked(db, t, err);
        pthread_mutex_unlock(&db->mu);
    }
    if (rc != ST_OK && t) {
        restore_unlink(db, t);
        sto_tablet_release(t);
        t = NULL;
    }
    pthread_mutex_unlock(&db->meta_mu);
    if (rc == ST_OK && out)
        *out = t;
    if (rc == ST_OK)
        sto_db_kick(db); /* many restored files may call for a compaction */
    return rc;
}
