/* backup.c — BackupTablet, ListBackupPieces, DeleteBackupPieces and restores (CreateTablet with
 * restore_backup) on a node; docs/backups.md, "On a node".
 *
 * Freezing a tablet and checksumming its files take time proportional to the memtable and the
 * files, so BackupTablet (and SealBackupPiece, backup_xfer.c) run on a thread of their own and
 * come back to the loop to answer; the loop only checks the request and records which piece is
 * being made (bk_busy), so a second call for the same piece is told to retry instead of racing. */
#include "backup.h"

#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "repl_glue.h"

/* ---- open / close ---- */

st_code node_backups_open(node_ctx *n, st_err *err) {
    n->backups = calloc(1, sizeof *n->backups);
    if (!n->backups)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting the node");
    pthread_mutex_init(&n->backups->crc_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->backups->crc_cv, &ca);
    pthread_condattr_destroy(&ca);
    char root[NODE_BK_PATH_MAX];
    bk_root_dir(n, root, sizeof root);
    st_code rc = bk_mkdirs(root, err);
    if (rc == ST_OK) {
        bk_sweep(n);
        bk_crc_load(n);
        rc = bk_crc_bg_start(n, err);
    }
    if (rc == ST_OK)
        rc = bk_reaper_start(n, err);
    return rc;
}

void node_backups_close(node_ctx *n) {
    node_backups *b = n->backups;
    if (!b)
        return;
    bk_crc_bg_stop(b);
    b->closing = true; /* restores whose files are being checked end UNAVAILABLE */
    node_restores_abort(n);
    bk_pulls_abort(n);
    node_jobs_wait(n); /* a pull's end may have started a seal */
    bk_reaper_stop(b); /* after the jobs: their ends may put pieces in the trash */
    for (size_t i = 0; i < b->n_busy; i++)
        free(b->busy[i]);
    free(b->busy);
    free(b->busy_doomed);
    free(b->pulled);
    bk_grants_free(b);
    free(b->crcs);
    free(b->rx);
    pthread_cond_destroy(&b->crc_cv);
    pthread_mutex_destroy(&b->crc_mu);
    free(b);
    n->backups = NULL;
}

/* ---- BackupTablet ---- */

typedef struct freeze_arg {
    bk_name name;
    char piece[NODE_BK_NAME_MAX + 1];
    char table[NODE_TABLE_NAME_MAX + 1];
    char incarnation[NODE_BK_INCARNATION_MAX + 1];
    st_buf start, end;
    uint64_t tablet_id;
    int64_t frozen_wall_us, freeze_us, total_us; /* when the freeze ended; how long it took */
    uint64_t crc_read_files, crc_read_bytes;     /* read back: not checksummed before */
    char tmp[NODE_BK_PATH_MAX], final[NODE_BK_PATH_MAX];
    bk_piece *out;
    /* what out points into (freeze_describe) */
    Strata__Internal__V1__BackupFile **fv, *fs;
    char *names;
} freeze_arg;

/* A file the freeze linked is damaged (err says how): its tablet goes read-only, as a read of the
 * bad block would make it, and the backup fails naming the live file. Only the file's own
 * checksums can tell: its CRC32C in the piece would be of the damaged bytes, so every later check
 * of the backup (copy, export, verify, restore) would pass and restores hold the damage. */
static st_code freeze_damaged(node_ctx *n, const freeze_arg *a, const char *name, st_err *err) {
    char why[ST_ERR_MSG_MAX], live[NODE_BK_PATH_MAX + 40];
    snprintf(why, sizeof why, "%s", err->msg);
    snprintf(live, sizeof live, "%s/%s", n->backups->sst_dir, name);
    st_err ro;
    st_err_set(&ro, ST_DATA_LOSS, "SSTable %s failed its check for a backup: %s", live, why);
    sto_tablet_mark_damaged(n->db, a->tablet_id, ro.msg);
    st_log(ST_LOG_ERROR, "backup",
           "event=backup_damaged_sst backup=%s tablet=%" PRIu64 " table=%s path=%s reason=\"%s\"",
           a->name.full, a->tablet_id, a->table, live, why);
    /* what to do before the detail: routers add their context in front, and cut at 512 bytes */
    return st_err_set(err, ST_DATA_LOSS,
                      "SSTable %s is damaged on this node, its tablet read-only here now "
                      "(`strata status` lists it): restore the tablet from the other cluster or "
                      "a backup (%s)",
                      live, why);
}

/* The piece message for files linked into a.tmp: sizes and CRC32C read back from the links, each
 * file checked through as an SSTable (bk_sst_crc_checked). */
static st_code freeze_describe(node_ctx *n, freeze_arg *a, const sto_backup_file *files, size_t nf,
                               bk_piece **out, st_err *err) {
    bk_piece *p = calloc(1, sizeof *p);
    Strata__Internal__V1__BackupFile **fv = calloc(nf ? nf : 1, sizeof *fv);
    Strata__Internal__V1__BackupFile *fs = calloc(nf ? nf : 1, sizeof *fs);
    char *names = calloc(nf ? nf : 1, 32);
    a->fv = fv;
    a->fs = fs;
    a->names = names;
    if (!p || !fv || !fs || !names) {
        free(p);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory describing a piece");
    }
    strata__internal__v1__backup_piece__init(p);
    p->backup = a->name.full;
    p->piece = a->piece;
    p->table_name = a->table;
    p->start_key = (ProtobufCBinaryData){a->start.len, a->start.data};
    p->end_key = (ProtobufCBinaryData){a->end.len, a->end.data};
    p->node_num = n->opts.node_num;
    p->incarnation = a->incarnation;
    p->files = fv;
    p->n_files = nf;
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < nf; i++) {
        strata__internal__v1__backup_file__init(&fs[i]);
        fv[i] = &fs[i];
        snprintf(names + 32 * i, 32, "%020" PRIu64 ".sst", files[i].number);
        fs[i].name = names + 32 * i;
        char path[NODE_BK_PATH_MAX + 40];
        snprintf(path, sizeof path, "%s/%s", a->tmp, fs[i].name);
        bool read = false;
        rc = bk_sst_crc_checked(n->backups, path, &fs[i].size, &fs[i].crc32c, &read, err);
        if (rc == ST_DATA_LOSS)
            rc = freeze_damaged(n, a, fs[i].name, err);
        p->size_bytes += fs[i].size;
        a->crc_read_files += read;
        a->crc_read_bytes += read ? fs[i].size : 0;
    }
    if (rc != ST_OK) {
        free(p);
        return rc;
    }
    *out = p;
    return ST_OK;
}

static void freeze_arg_free(freeze_arg *a) {
    free(a->out);
    free(a->fv);
    free(a->fs);
    free(a->names);
    st_buf_free(&a->start);
    st_buf_free(&a->end);
    free(a);
}

static void freeze_work(node_job *j) {
    freeze_arg *a = j->arg;
    node_ctx *n = j->n;
    st_err *err = &j->err;
    st_code rc = bk_remove_tree(a->tmp, err);
    if (rc == ST_OK)
        rc = bk_mkdirs(a->tmp, err);
    sto_backup_file *files = NULL;
    size_t nf = 0;
    int64_t t0 = st_mono_us();
    if (rc == ST_OK)
        rc = sto_tablet_backup(n->db, a->tablet_id, a->tmp, &files, &nf, err);
    a->frozen_wall_us = st_wall_us();
    a->freeze_us = st_mono_us() - t0;
    if (rc == ST_OK)
        rc = freeze_describe(n, a, files, nf, &a->out, err);
    a->total_us = st_mono_us() - t0;
    free(files);
    j->rc = rc;
}

/* On the loop: the piece's instant is at or above every version the node handed out or took in
 * (replication, moves) before the freeze ended, so a restore's clock passes every restored cell.
 * Then the manifest, and the rename that makes the piece exist. */
static st_code freeze_seal(node_ctx *n, freeze_arg *a, st_err *err) {
    bk_piece *p = a->out;
    p->frozen_us = a->frozen_wall_us > n->hlc_last_us ? a->frozen_wall_us : n->hlc_last_us;
    st_code rc = bk_manifest_write(a->tmp, p, err);
    if (rc == ST_OK)
        rc = bk_publish(a->tmp, a->final, err);
    if (rc == ST_OK)
        st_log(ST_LOG_INFO, "backup",
               "event=tablet_frozen backup=%s piece=%s tablet=%" PRIu64 " files=%zu bytes=%" PRIu64
               " freeze_us=%" PRId64 " total_us=%" PRId64 " crc_read_files=%" PRIu64
               " crc_read_bytes=%" PRIu64,
               a->name.full, a->piece, a->tablet_id, p->n_files, p->size_bytes, a->freeze_us,
               a->total_us, a->crc_read_files, a->crc_read_bytes);
    return rc;
}

static void freeze_done(node_job *j) {
    freeze_arg *a = j->arg;
    node_ctx *n = j->n;
    if (j->rc == ST_OK && bk_busy_doomed(n, a->final))
        j->rc = st_err_set(&j->err, ST_ABORTED, "the backup was deleted while the piece was made");
    if (j->rc == ST_OK)
        j->rc = freeze_seal(n, a, &j->err);
    if (j->rc != ST_OK)
        bk_remove_tree(a->tmp, NULL);
    bk_busy_remove(n, a->final);
    if (j->rc == ST_OK)
        node_reply(j->call, &a->out->base);
    else
        /* the router names the backup and the table: the room is the node's reason's */
        node_fail(j->call, j->rc, "backing up tablet %" PRIu64 ": %s", a->tablet_id, j->err.msg);
    freeze_arg_free(a);
    free(j);
}

/* INVALID_ARGUMENT unless the backup is in the table's project and instance. */
static st_code same_instance(const bk_name *b, const char *table, st_err *err) {
    char want[3 * NODE_BK_NAME_MAX + 40];
    snprintf(want, sizeof want, "projects/%s/instances/%s/tables/", b->project, b->instance);
    if (strncmp(table, want, strlen(want)) == 0)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "backup %s is not in the instance of table %s: a backup belongs to the "
                      "table's own instance",
                      b->full, table);
}

/* True when an existing piece answered the call (a retried BackupTablet of the same making) or
 * failed it (a piece of another table). A piece of another making, or of none (made before pieces
 * kept theirs), when the caller names its making, is a leftover of a deleted backup of the same id
 * whose removal missed this node: it goes, and the tablet is frozen anew. */
static bool freeze_existing(node_ctx *n, rpc_call *call, const freeze_arg *a) {
    bk_piece *p = NULL;
    st_err err = {0};
    if (bk_piece_load(n, &a->name, a->piece, rpc_call_arena(call), &p, &err) != ST_OK)
        return false;
    bool dropped = false;
    st_code rc = bk_leftover_drop(n, &a->name, a->piece, a->final, p->incarnation, a->incarnation,
                                  &dropped, &err);
    if (rc != ST_OK)
        node_fail(call, rc, "%s", err.msg);
    if (rc != ST_OK || dropped)
        return rc != ST_OK;
    if (strcmp(p->table_name, a->table) != 0)
        node_fail(call, ST_ALREADY_EXISTS,
                  "piece %s of backup %s already holds table %s; pick another piece id", a->piece,
                  a->name.full, p->table_name);
    else
        node_reply(call, &p->base);
    return true;
}

static st_code freeze_start(node_ctx *n, rpc_call *call, freeze_arg *a, st_err *err) {
    node_job *j = calloc(1, sizeof *j);
    if (!j)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a backup");
    *j = (node_job){.n = n, .call = call, .work = freeze_work, .done = freeze_done, .arg = a};
    char backup_dir[NODE_BK_PATH_MAX];
    bk_backup_dir(n, &a->name, backup_dir, sizeof backup_dir);
    st_code rc = bk_mkdirs(backup_dir, err);
    if (rc == ST_OK && !bk_busy_add(n, a->final))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting a backup");
    if (rc == ST_OK && (rc = node_job_start(j, err)) != ST_OK)
        bk_busy_remove(n, a->final);
    if (rc != ST_OK)
        free(j);
    return rc;
}

void node_h_backup_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__BackupTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__backup_tablet_request__descriptor, req_bytes);
    if (!req)
        return;
    freeze_arg *a = calloc(1, sizeof *a);
    if (!a) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory starting a backup");
        return;
    }
    st_buf_init(&a->start);
    st_buf_init(&a->end);
    st_err err = {0};
    node_tablets *t = NULL;
    node_tablet *tab = NULL;
    st_code rc = bk_name_parse(req->backup, &a->name, &err);
    if (rc == ST_OK)
        rc = bk_piece_check(req->piece, &err);
    if (rc == ST_OK)
        rc = bk_incarnation_check(req->incarnation, &err);
    if (rc == ST_OK && !(tab = node_tablet_by_id(n, req->tablet_id, &t)))
        rc = st_err_set(&err, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by node %u",
                        req->tablet_id, n->opts.node_num);
    if (rc == ST_OK)
        rc = same_instance(&a->name, t->name, &err);
    if (rc == ST_OK) {
        snprintf(a->piece, sizeof a->piece, "%s", req->piece);
        snprintf(a->table, sizeof a->table, "%s", t->name);
        snprintf(a->incarnation, sizeof a->incarnation, "%s", req->incarnation);
        bk_piece_dir(n, &a->name, a->piece, "", a->final, sizeof a->final);
        bk_piece_dir(n, &a->name, a->piece, ".tmp", a->tmp, sizeof a->tmp);
        if (bk_busy(n, a->final))
            rc = st_err_set(&err, ST_ABORTED,
                            "piece %s of backup %s is being made or changed now; retry", a->piece,
                            a->name.full);
    }
    if (rc == ST_OK && freeze_existing(n, call, a)) {
        freeze_arg_free(a);
        return;
    }
    if (rc == ST_OK) {
        a->tablet_id = tab->id;
        if (st_buf_append(&a->start, tab->start.data, tab->start.len) != ST_OK ||
            st_buf_append(&a->end, tab->end.data, tab->end.len) != ST_OK)
            rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory starting a backup");
    }
    if (rc == ST_OK)
        rc = freeze_start(n, call, a, &err);
    if (rc != ST_OK) {
        freeze_arg_free(a);
        node_fail(call, rc, "%s", err.msg);
    }
}

/* ---- ListBackupPieces ---- */

typedef struct list_ctx {
    node_ctx *n;
    st_arena *a;
    const char *only; /* a backup's full name, or NULL for all */
    bk_piece **v;
    size_t len, cap;
    st_code rc;
} list_ctx;

static void list_add(list_ctx *c, bk_piece *p) {
    if (c->only && strcmp(p->backup, c->only) != 0)
        return;
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        bk_piece **v = st_arena_alloc(c->a, cap * sizeof *v);
        if (!v) {
            c->rc = ST_RESOURCE_EXHAUSTED;
            return;
        }
        if (c->len)
            memcpy(v, c->v, c->len * sizeof *v);
        c->v = v;
        c->cap = cap;
    }
    c->v[c->len++] = p;
}

/* Piece `piece` of the backup directory dir, if it is sealed (an invalid id lists nothing). */
static void list_one(list_ctx *c, const char *dir, const char *piece) {
    if (bk_piece_check(piece, NULL) != ST_OK)
        return;
    char path[NODE_BK_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, piece);
    bk_piece *p = NULL;
    st_err err = {0};
    if (bk_manifest_read(path, c->a, &p, &err) == ST_OK)
        list_add(c, p);
    else if (err.code != ST_NOT_FOUND)
        st_log(ST_LOG_WARN, "backup", "event=piece_unreadable path=%s msg=\"%s\"", path, err.msg);
}

/* Pieces of one backup directory: sealed piece directories (dotted names are in the making). */
static void list_backup_dir(list_ctx *c, const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while (c->rc == ST_OK && (e = readdir(d)) != NULL)
        list_one(c, dir, e->d_name);
    closedir(d);
}

/* Walks <root>/<instance>/<cluster>/<backup> (depth 0..2 below root) and lists each backup. */
static void list_walk(list_ctx *c, char *path, size_t cap, int depth) {
    if (depth == 3) {
        list_backup_dir(c, path);
        return;
    }
    DIR *d = opendir(path);
    if (!d)
        return;
    size_t len = strlen(path);
    struct dirent *e;
    while (c->rc == ST_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path + len, cap - len, "/%s", e->d_name);
        list_walk(c, path, cap, depth + 1);
        path[len] = '\0';
    }
    closedir(d);
}

void node_h_list_backup_pieces(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__ListBackupPiecesRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__list_backup_pieces_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err gerr = {0};
    if (bk_grant_check(n, call, "ListBackupPieces", req->backup, req->piece, req->ticket, &gerr) !=
        ST_OK) {
        node_fail(call, gerr.code, "%s", gerr.msg);
        return;
    }
    list_ctx c = {.n = n, .a = rpc_call_arena(call), .rc = ST_OK};
    char path[NODE_BK_PATH_MAX];
    if (req->backup[0]) {
        bk_name b;
        st_err err = {0};
        if (bk_name_parse(req->backup, &b, &err) != ST_OK) {
            node_fail(call, err.code, "%s", err.msg);
            return;
        }
        c.only = req->backup;
        bk_backup_dir(n, &b, path, sizeof path);
        if (req->piece[0])
            list_one(&c, path, req->piece);
        else
            list_backup_dir(&c, path);
    } else {
        bk_root_dir(n, path, sizeof path);
        list_walk(&c, path, sizeof path, 0);
    }
    if (c.rc != ST_OK) {
        node_fail(call, c.rc, "out of memory listing backup pieces");
        return;
    }
    Strata__Internal__V1__ListBackupPiecesResponse resp;
    strata__internal__v1__list_backup_pieces_response__init(&resp);
    resp.pieces = c.v;
    resp.n_pieces = c.len;
    node_reply(call, &resp.base);
}

/* ---- DeleteBackupPieces ---- */

/* An unsealed import (<piece>.in) of the piece goes too, unless a seal or pull works on it. */
static st_code delete_import(node_ctx *n, const bk_name *b, const char *piece, st_err *err) {
    char final[NODE_BK_PATH_MAX], in[NODE_BK_PATH_MAX];
    bk_piece_dir(n, b, piece, "", final, sizeof final);
    bk_piece_dir(n, b, piece, ".in", in, sizeof in);
    if (!bk_busy(n, final))
        return bk_trash(n, in, NULL, err);
    bk_busy_doom(n, final, false); /* removed when its pull or seal ends */
    return ST_OK;
}

/* The whole backup directory goes into the trash in one rename, whatever the number of its
 * pieces: the reaper thread removes the files (and puts back the pieces of another project
 * sharing the directory). Pieces in the making are doomed: their work, which finds its directory
 * gone, removes what it made instead of sealing it. */
static st_code delete_all(node_ctx *n, const bk_name *b, st_err *err) {
    char dir[NODE_BK_PATH_MAX];
    bk_backup_dir(n, b, dir, sizeof dir);
    bk_busy_doom(n, dir, true);
    return bk_trash(n, dir, b->project, err);
}

/* One entry of a backup directory in a late delete: true when it is a sealed piece of the making
 * (not being made or pulled now). */
static bool making_piece(node_ctx *n, const bk_name *b, const char *entry,
                         const char *incarnation) {
    char path[NODE_BK_PATH_MAX];
    bk_piece_dir(n, b, entry, "", path, sizeof path);
    bk_piece *p = NULL;
    if (bk_piece_check(entry, NULL) != ST_OK || bk_busy(n, path) ||
        bk_piece_load(n, b, entry, NULL, &p, NULL) != ST_OK)
        return false;
    bool mine = strcmp(p->incarnation, incarnation) == 0;
    bk_piece_free(p);
    return mine;
}

/* The pieces of one making of the backup: a late delete, by a router that missed this node when
 * the backup was deleted; a newer backup of the same id (another making, an import, a piece in
 * the making) keeps its entries. When the directory holds nothing else it goes in one rename, as
 * a whole delete; otherwise piece by piece. */
static st_code delete_making(node_ctx *n, const bk_name *b, const char *incarnation, int *gone,
                             st_err *err) {
    char dir[NODE_BK_PATH_MAX];
    bk_backup_dir(n, b, dir, sizeof dir);
    st_buf mine; /* the making's entries, each with its NUL: each manifest is read once */
    st_buf_init(&mine);
    bool other = false;
    st_code rc = ST_OK;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (rc == ST_OK && d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (!making_piece(n, b, e->d_name, incarnation))
            other = true;
        else if (st_buf_append(&mine, e->d_name, strlen(e->d_name) + 1) != ST_OK)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        else
            (*gone)++;
    }
    if (d)
        closedir(d);
    if (rc == ST_OK && !other && *gone)
        rc = delete_all(n, b, err);
    for (size_t off = 0; rc == ST_OK && other && off < mine.len;) {
        const char *entry = (const char *)mine.data + off;
        char path[NODE_BK_PATH_MAX];
        bk_piece_dir(n, b, entry, "", path, sizeof path);
        rc = bk_trash(n, path, NULL, err);
        off += strlen(entry) + 1;
    }
    st_buf_free(&mine);
    return rc;
}

void node_h_delete_backup_pieces(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__DeleteBackupPiecesRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__delete_backup_pieces_request__descriptor, req_bytes);
    if (!req)
        return;
    bk_name b;
    st_err err = {0};
    st_code rc = bk_name_parse(req->backup, &b, &err);
    if (rc == ST_OK && req->piece[0])
        rc = bk_piece_check(req->piece, &err);
    if (rc == ST_OK && req->piece[0]) {
        char path[NODE_BK_PATH_MAX];
        bk_piece_dir(n, &b, req->piece, "", path, sizeof path);
        bk_piece *p = NULL;
        st_err perr = {0};
        st_code lrc = bk_piece_load(n, &b, req->piece, NULL, &p, &perr);
        bk_piece_free(p);
        if (bk_busy(n, path))
            rc = st_err_set(&err, ST_ABORTED, "piece %s of backup %s is being made now; retry",
                            req->piece, b.full);
        else if (lrc == ST_OK || lrc == ST_DATA_LOSS)
            rc = bk_trash(n, path, NULL, &err);
        if (rc == ST_OK)
            rc = delete_import(n, &b, req->piece, &err);
    } else if (rc == ST_OK && req->incarnation[0]) {
        int gone = 0;
        rc = delete_making(n, &b, req->incarnation, &gone, &err);
        st_log(ST_LOG_INFO, "backup", "event=making_deleted backup=%s incarnation=%s pieces=%d",
               b.full, req->incarnation, gone);
    } else if (rc == ST_OK) {
        rc = delete_all(n, &b, &err);
    }
    if (rc != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "backup", "event=pieces_deleted backup=%s piece=%s files_removed_by=reaper",
           b.full, req->piece[0] ? req->piece : "*");
    Google__Protobuf__Empty empty;
    google__protobuf__empty__init(&empty);
    node_reply(call, &empty.base);
}

/* ---- restore (CreateTablet with restore_backup) ---- */

static bool range_inside(st_slice s, st_slice e, const bk_piece *p) {
    st_slice ps = st_slice_make(p->start_key.data, p->start_key.len);
    st_slice pe = st_slice_make(p->end_key.data, p->end_key.len);
    if (st_slice_cmp(s, ps) < 0)
        return false;
    if (pe.len == 0)
        return true;
    return e.len != 0 && st_slice_cmp(e, pe) <= 0;
}

/* The piece's file paths, checked to exist with their recorded sizes (their CRC32Cs were
 * checked just before, node_backup_restore_verify; a file could have gone since). */
static st_code restore_paths(const char *dir, const bk_piece *p, st_arena *a, const char ***out,
                             st_err *err) {
    const char **paths = st_arena_alloc(a, (p->n_files ? p->n_files : 1) * sizeof *paths);
    if (!paths)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory restoring");
    for (size_t i = 0; i < p->n_files; i++) {
        const char *name = p->files[i]->name;
        if (bk_file_check(name, err) != ST_OK)
            return st_err_set(err, ST_DATA_LOSS, "piece %s lists a bad file name", dir);
        size_t len = strlen(dir) + strlen(name) + 2;
        char *path = st_arena_alloc(a, len);
        if (!path)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory restoring");
        snprintf(path, len, "%s/%s", dir, name);
        struct stat sb;
        if (stat(path, &sb) != 0 || (uint64_t)sb.st_size != p->files[i]->size)
            return st_err_set(err, ST_DATA_LOSS,
                              "file %s of the piece is missing or not %" PRIu64
                              " bytes: restore from another copy of the backup",
                              path, p->files[i]->size);
        paths[i] = path;
    }
    *out = paths;
    return ST_OK;
}

st_code node_backup_restore_prepare(node_ctx *n, st_slice start, st_slice end, const char *backup,
                                    const char *piece, st_arena *a, node_bk_restore *out,
                                    st_err *err) {
    bk_name b;
    st_code rc = bk_name_parse(backup, &b, err);
    if (rc == ST_OK)
        rc = bk_piece_check(piece, err);
    bk_piece *p = NULL;
    char dir[NODE_BK_PATH_MAX];
    bk_piece_dir(n, &b, piece, "", dir, sizeof dir);
    if (rc == ST_OK)
        rc = bk_piece_load(n, &b, piece, a, &p, err);
    /* The clock moves past frozen_us (node_backup_restored): a piece from a damaged or forged
     * export must not throw this node's versions (and every later write's) centuries ahead. The
     * bound is on the wall clock, as for commit times handed to the node (node_clock_observe):
     * against the clock itself, each restore could carry it another hour ahead. */
    int64_t clock_us = st_wall_us();
    if (rc == ST_OK && p->frozen_us > clock_us + NODE_CLOCK_AHEAD_MAX_US)
        rc = st_err_set(err, ST_DATA_LOSS,
                        "piece %s of %s says it was frozen at %" PRId64 " us since the epoch, more "
                        "than an hour ahead of this node's wall clock (%" PRId64 "): its export is "
                        "damaged or was made where clocks were wrong; delete the backup",
                        piece, backup, p->frozen_us, clock_us);
    if (rc == ST_OK && !range_inside(start, end, p))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "the tablet's range must lie inside the range of piece %s of %s", piece,
                        backup);
    if (rc == ST_OK)
        rc = restore_paths(dir, p, a, &out->paths, err);
    if (rc == ST_OK) {
        out->n_paths = p->n_files;
        out->frozen_us = p->frozen_us;
    }
    return rc;
}

/* ---- restore: the piece's files checked before the tablet links them ---- */

typedef struct rv_arg {
    char *backup, *piece;
    node_bk_verified_fn done;
    void *arg;
    size_t files, read; /* files checked; of them, read through (the others read lately) */
} rv_arg;

/* Checks file f of the piece in dir against its manifest entry. */
static st_code rv_file(node_ctx *n, const rv_arg *a, const char *dir,
                       const Strata__Internal__V1__BackupFile *f, bool *read, st_err *err) {
    if (bk_file_check(f->name, NULL) != ST_OK)
        return ST_OK; /* node_backup_restore_prepare refuses the piece */
    char path[NODE_BK_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", dir, f->name);
    uint64_t size = 0;
    uint32_t crc = 0;
    st_err why = {0};
    st_code rc = bk_file_crc_fresh(n->backups, path, &size, &crc, read, &why);
    if (rc == ST_NOT_FOUND)
        return ST_OK; /* node_backup_restore_prepare says it is missing */
    if (rc != ST_OK)
        return st_err_set(err, rc,
                          "reading file %s of piece %s of backup %s on node %u to check it: %s; "
                          "nothing was restored",
                          f->name, a->piece, a->backup, n->opts.node_num, why.msg);
    if (size != f->size)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s of piece %s of backup %s on node %u holds %" PRIu64
                          " bytes, its manifest says %" PRIu64 ": the backup's file is damaged; "
                          "nothing was restored: restore from another backup, or from a copy of "
                          "this one in another cluster or an export",
                          f->name, a->piece, a->backup, n->opts.node_num, size, f->size);
    if (crc != f->crc32c)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s of piece %s of backup %s on node %u has CRC32C %08x, its "
                          "manifest says %08x: the backup's file is damaged; nothing was "
                          "restored: restore from another backup, or from a copy of this one in "
                          "another cluster or an export",
                          f->name, a->piece, a->backup, n->opts.node_num, crc, f->crc32c);
    return ST_OK;
}

static void rv_work(node_job *j) {
    rv_arg *a = j->arg;
    bk_name b;
    bk_piece *p = NULL;
    j->rc = ST_OK;
    if (bk_name_parse(a->backup, &b, NULL) != ST_OK || bk_piece_check(a->piece, NULL) != ST_OK ||
        bk_piece_load(j->n, &b, a->piece, NULL, &p, NULL) != ST_OK) {
        bk_piece_free(p);
        return; /* node_backup_restore_prepare says what is wrong */
    }
    char dir[NODE_BK_PATH_MAX];
    bk_piece_dir(j->n, &b, a->piece, "", dir, sizeof dir);
    for (size_t i = 0; j->rc == ST_OK && i < p->n_files; i++) {
        bool read = false;
        j->rc = rv_file(j->n, a, dir, p->files[i], &read, &j->err);
        a->files++;
        a->read += read;
    }
    bk_piece_free(p);
}

static void rv_done(node_job *j) {
    rv_arg *a = j->arg;
    if (j->rc == ST_OK) {
        st_log(ST_LOG_DEBUG, "backup",
               "event=restore_checked backup=%s piece=%s files=%zu read=%zu", a->backup, a->piece,
               a->files, a->read);
        a->done(j->n, j->call, a->arg);
    } else {
        st_log(ST_LOG_WARN, "backup", "event=restore_refused backup=%s piece=%s reason=\"%s\"",
               a->backup, a->piece, j->err.msg);
        node_fail(j->call, j->rc, "%s", j->err.msg);
    }
    free(a->backup);
    free(a->piece);
    free(a);
    free(j);
}

void node_backup_restore_verify(node_ctx *n, rpc_call *call, const char *backup, const char *piece,
                                node_bk_verified_fn done, void *arg) {
    rv_arg *a = calloc(1, sizeof *a);
    node_job *j = calloc(1, sizeof *j);
    st_err err = {0};
    st_code rc = ST_RESOURCE_EXHAUSTED;
    if (a && j && (a->backup = strdup(backup)) && (a->piece = strdup(piece))) {
        a->done = done;
        a->arg = arg;
        *j = (node_job){.n = n, .call = call, .work = rv_work, .done = rv_done, .arg = a};
        rc = node_job_start(j, &err);
    } else {
        st_err_set(&err, rc, "out of memory checking a piece to restore");
    }
    if (rc == ST_OK)
        return;
    if (a) {
        free(a->backup);
        free(a->piece);
    }
    free(a);
    free(j);
    node_fail(call, rc, "%s", err.msg);
}

void node_backup_restored(node_ctx *n, const node_tablets *t, uint64_t id, const char *backup,
                          const char *piece, const node_bk_restore *r) {
    node_repl_tablet_named(n, id, t->name);
    /* Writes after the restore must win over the restored cells: the clock moves past the
     * instant the piece was frozen (its versions are below it). */
    if (r->frozen_us > n->hlc_last_us)
        n->hlc_last_us = r->frozen_us;
    st_log(ST_LOG_INFO, "backup",
           "event=tablet_restored table=%s tablet=%" PRIu64 " backup=%s piece=%s files=%zu",
           t->name, id, backup, piece, r->n_paths);
}
