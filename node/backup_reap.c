/* backup_reap.c — deleted pieces leave the node's loop at once and their files go on a thread of
 * their own (docs/backups.md, "On a node").
 *
 * Unlinking a backup's files on the loop held every other call for as long as it took: seconds
 * for tens of thousands of pieces, long enough for the router's keepalive to give up on the
 * node. Now the loop only renames what is deleted into <data>/backups/.trash/ (one rename of the
 * backup's directory, or of one piece's): from that instant no listing, read, pull or restore
 * finds it, and a crash leaves it either whole in place (the delete was not answered) or in the
 * trash. The reaper thread empties the trash, and at start it finishes what a crash left there.
 *
 * Trash names (never a backup id, which cannot hold '@' or start with '.'): "<hex µs>-<n>" for
 * one piece or import directory, "<hex µs>-<n>@<project>" for a backup's whole directory. The
 * directory is named by instance, cluster and id only, so a backup of another project with the
 * same three shares it (only direct node calls can make one): the reaper puts such pieces back
 * (a rename that never replaces) before it removes the rest. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include "backup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BK_TRASH_DIR ".trash"

static bool reap_stopping(node_backups *b) {
    return __atomic_load_n(&b->reap_stop, __ATOMIC_ACQUIRE);
}

static void reap_wake(node_backups *b) {
    if (!b->reap_on)
        return; /* stopped (or never started): the next start empties the trash */
    pthread_mutex_lock(&b->reap_mu);
    b->reap_wake = true;
    pthread_cond_signal(&b->reap_cv);
    pthread_mutex_unlock(&b->reap_mu);
}

/* ---- on the loop ---- */

static void parent_dir(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash && slash != out)
        *slash = '\0';
}

st_code bk_trash(node_ctx *n, const char *path, const char *project, st_err *err) {
    node_backups *b = n->backups;
    char to[NODE_BK_PATH_MAX + 128];
    int r = -1, e = EEXIST;
    for (int tries = 0; r != 0 && e == EEXIST && tries < 8; tries++) {
        snprintf(to, sizeof to, "%s/%016" PRIx64 "-%" PRIu64 "%s%s", b->trash,
                 (uint64_t)st_wall_us(), ++b->trash_seq, project ? "@" : "",
                 project ? project : "");
        r = renameat2(AT_FDCWD, path, AT_FDCWD, to, RENAME_NOREPLACE);
        e = r == 0 ? 0 : errno;
    }
    struct stat sb;
    if (r != 0 && e == ENOENT && lstat(path, &sb) == 0 && bk_mkdirs(b->trash, NULL) == ST_OK) {
        r = renameat2(AT_FDCWD, path, AT_FDCWD, to, RENAME_NOREPLACE); /* the trash was removed */
        e = r == 0 ? 0 : errno;
    }
    if (r != 0 && e == ENOENT)
        return ST_OK; /* nothing there */
    if (r != 0)
        return st_err_set(err, e == ENOSPC ? ST_RESOURCE_EXHAUSTED : ST_INTERNAL,
                          "moving %s into %s for removal: %s", path, b->trash, strerror(e));
    /* the old name's absence is what must survive a crash: a delete answered stays done */
    char parent[NODE_BK_PATH_MAX];
    parent_dir(path, parent, sizeof parent);
    st_code rc = bk_fsync_path(parent, err);
    reap_wake(b);
    return rc;
}

/* ---- on the reaper ---- */

/* A piece of another project found in a deleted backup's directory goes back where its
 * manifest says, unless something took that place meanwhile. */
static bool reap_keep(node_ctx *n, const char *path, const char *piece, const bk_piece *p) {
    bk_name name;
    char dir[NODE_BK_PATH_MAX], to[NODE_BK_PATH_MAX];
    if (bk_name_parse(p->backup, &name, NULL) != ST_OK)
        return false;
    bk_backup_dir(n, &name, dir, sizeof dir);
    bk_piece_dir(n, &name, piece, "", to, sizeof to);
    bool kept = bk_mkdirs(dir, NULL) == ST_OK &&
                renameat2(AT_FDCWD, path, AT_FDCWD, to, RENAME_NOREPLACE) == 0;
    st_log(kept ? ST_LOG_INFO : ST_LOG_WARN, "backup", "event=piece_kept backup=%s piece=%s%s",
           p->backup, piece, kept ? "" : " failed=1 (its place is taken: removed)");
    return kept;
}

/* The pieces of a deleted backup's directory: another project's go back, the rest goes. */
static void reap_backup(node_ctx *n, const char *dir, const char *project, size_t *pieces,
                        size_t *kept) {
    char own[NODE_BK_NAME_MAX + 16];
    snprintf(own, sizeof own, "projects/%s/", project);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && !reap_stopping(n->backups) && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[NODE_BK_PATH_MAX + 300];
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path)
            continue; /* the node never makes such a path */
        bk_piece *p = NULL;
        bool piece = bk_piece_check(e->d_name, NULL) == ST_OK;
        if (piece && bk_manifest_read(path, NULL, &p, NULL) == ST_OK &&
            strncmp(p->backup, own, strlen(own)) != 0 && reap_keep(n, path, e->d_name, p))
            (*kept)++;
        else
            bk_remove_tree(path, NULL);
        *pieces += piece;
        bk_piece_free(p);
    }
    if (d)
        closedir(d);
}

static void reap_one(node_ctx *n, const char *path, const char *name) {
    int64_t t0 = st_mono_us();
    size_t pieces = 0, kept = 0;
    const char *at = strchr(name, '@');
    if (at)
        reap_backup(n, path, at + 1, &pieces, &kept);
    if (reap_stopping(n->backups))
        return; /* the next start finishes it */
    st_err err = {0};
    if (bk_remove_tree(path, &err) != ST_OK) {
        st_log(ST_LOG_WARN, "backup", "event=trash_unremovable name=%s msg=\"%s\"", name, err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "backup",
           "event=trash_removed name=%s pieces=%zu kept=%zu us=%" PRId64 " on=reaper", name, pieces,
           kept, st_mono_us() - t0);
    __atomic_add_fetch(&n->backups->reaped, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&n->backups->reaped_pieces, at ? pieces - kept : 1, __ATOMIC_RELAXED);
}

static void reap_all(node_ctx *n) {
    node_backups *b = n->backups;
    DIR *d = opendir(b->trash);
    struct dirent *e;
    while (d && !reap_stopping(b) && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[NODE_BK_PATH_MAX + 300];
        int len = snprintf(path, sizeof path, "%s/%s", b->trash, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path)
            continue;
        reap_one(n, path, e->d_name);
    }
    if (d)
        closedir(d);
}

static void *reap_thread(void *arg) {
    node_ctx *n = arg;
    node_backups *b = n->backups;
    pthread_mutex_lock(&b->reap_mu);
    while (!b->reap_stop) {
        if (!b->reap_wake) {
            pthread_cond_wait(&b->reap_cv, &b->reap_mu);
            continue;
        }
        b->reap_wake = false;
        pthread_mutex_unlock(&b->reap_mu);
        reap_all(n);
        pthread_mutex_lock(&b->reap_mu);
    }
    pthread_mutex_unlock(&b->reap_mu);
    return NULL;
}

st_code bk_reaper_start(node_ctx *n, st_err *err) {
    node_backups *b = n->backups;
    snprintf(b->trash, sizeof b->trash, "%s/backups/" BK_TRASH_DIR, n->data_dir);
    st_code rc = bk_mkdirs(b->trash, err);
    if (rc != ST_OK)
        return rc;
    pthread_mutex_init(&b->reap_mu, NULL);
    pthread_cond_init(&b->reap_cv, NULL);
    b->reap_wake = true; /* what an earlier run left in the trash */
    int r = pthread_create(&b->reap_thread, NULL, reap_thread, n);
    if (r != 0) {
        pthread_cond_destroy(&b->reap_cv);
        pthread_mutex_destroy(&b->reap_mu);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "could not start the backup removal thread (%s); free resources and "
                          "restart the node",
                          strerror(r));
    }
    b->reap_on = true;
    return ST_OK;
}

void bk_reaper_stop(node_backups *b) {
    if (!b->reap_on)
        return;
    pthread_mutex_lock(&b->reap_mu);
    __atomic_store_n(&b->reap_stop, true, __ATOMIC_RELEASE);
    pthread_cond_signal(&b->reap_cv);
    pthread_mutex_unlock(&b->reap_mu);
    pthread_join(b->reap_thread, NULL);
    pthread_cond_destroy(&b->reap_cv);
    pthread_mutex_destroy(&b->reap_mu);
    b->reap_on = false;
}
