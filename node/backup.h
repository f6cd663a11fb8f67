/* backup.h — backup pieces on a node (docs/backups.md, "On a node"; the piece manifest:
 * docs/formats/backup-piece.md). Private to node/.
 *
 * A piece lives in <data>/backups/<instance>/<cluster>/<backup id>/<piece id>/: hard links to
 * SSTables and the manifest PIECE, written last. Pieces are made in a sibling directory whose name
 * holds a dot (<piece>.tmp for a freeze, <piece>.in for an import; piece ids have no dot) and
 * renamed into place once complete, so a crash leaves a whole piece or none; the sweep at start
 * removes the dotted leftovers. What is deleted is renamed into <data>/backups/.trash/ on the
 * loop and removed by the reaper thread (backup_reap.c).
 *
 * Modules: backup_store.c (names, paths, the manifest, files and directories), backup.c
 * (BackupTablet, ListBackupPieces, DeleteBackupPieces, restores; their work runs on node_job
 * threads, job.c),
 * backup_xfer.c (ReadBackupFile, WriteBackupFile, SealBackupPiece, PullBackupPiece),
 * backup_reap.c (the trash and its reaper thread), backup_grant.c (read tickets for pulls). */
#ifndef NODE_BACKUP_H
#define NODE_BACKUP_H

#include <pthread.h>

#include "node_internal.h"
#include "strata/internal/v1/node.pb-c.h"

#define NODE_BK_CHUNK_BYTES ((size_t)1 << 20) /* ReadBackupFile chunks; WriteBackupFile's bound */
#define NODE_BK_NAME_MAX 64                   /* bytes of one name component, piece or file id */
#define NODE_BK_FILES_MAX 100000              /* files in one piece */
#define NODE_BK_PATH_MAX 4400
#define NODE_BK_INCARNATION_MAX 1024 /* bytes of a piece's incarnation (an operation name) */
#define NODE_BK_MANIFEST "PIECE"

typedef Strata__Internal__V1__BackupPiece bk_piece;
typedef struct node_backups node_backups;

/* ---- handlers (server.c) ---- */
void node_h_backup_tablet(rpc_call *call, st_slice req, void *arg);
void node_h_list_backup_pieces(rpc_call *call, st_slice req, void *arg);
void node_h_delete_backup_pieces(rpc_call *call, st_slice req, void *arg);
void node_h_read_backup_file(rpc_call *call, st_slice req, void *arg);
void node_h_write_backup_file(rpc_call *call, st_slice req, void *arg);
void node_h_seal_backup_piece(rpc_call *call, st_slice req, void *arg);
void node_h_pull_backup_piece(rpc_call *call, st_slice req, void *arg);
void node_h_grant_backup_read(rpc_call *call, st_slice req, void *arg);

/* ---- the node's side (node.c, internal.c) ---- */
/* At open: the backups tree exists and holds no unsealed leftovers. */
st_code node_backups_open(node_ctx *n, st_err *err);
/* At close, before the server goes: ends pulls, waits for the node_job threads. */
void node_backups_close(node_ctx *n);
/* CreateTablet with restore_backup, first: every file of piece of backup is checked against the
 * size and CRC32C its manifest records (bk_file_crc_fresh: one read of the piece, on a node_job
 * thread), because the restored tablet links the files as they are and nothing else reads them
 * whole before clients do. Then done(n, call, arg) runs on the loop; on a mismatch or a read
 * error the call is answered instead (DATA_LOSS naming the backup, the piece, the file and what
 * to do). A piece that cannot be loaded passes on: node_backup_restore_prepare says why. */
typedef void (*node_bk_verified_fn)(node_ctx *n, rpc_call *call, void *arg);
void node_backup_restore_verify(node_ctx *n, rpc_call *call, const char *backup, const char *piece,
                                node_bk_verified_fn done, void *arg);
/* CreateTablet with restore_backup (internal.c makes the tablets, many with one catalog save
 * and one storage manifest write): what a tablet [start, end) restored from a local piece is
 * made of. */
typedef struct node_bk_restore {
    const char **paths; /* the piece's files, in read order */
    size_t n_paths;
    int64_t frozen_us; /* the piece's freeze instant: the clock moves past it */
} node_bk_restore;
/* Checks piece of backup (sealed here, its files present with their sizes, frozen no more than
 * NODE_CLOCK_AHEAD_MAX_US ahead of the wall clock, its range holding [start, end)) and fills
 * out, its paths in arena a. INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS with what to do. */
st_code node_backup_restore_prepare(node_ctx *n, st_slice start, st_slice end, const char *backup,
                                    const char *piece, st_arena *a, node_bk_restore *out,
                                    st_err *err);
/* After tablet id of t was made of the piece: replication learns it, the clock passes the
 * freeze instant, the restore is logged. Loop thread. */
void node_backup_restored(node_ctx *n, const node_tablets *t, uint64_t id, const char *backup,
                          const char *piece, const node_bk_restore *r);

#define NODE_RESTORE_BATCH_MAX 64   /* restored tablets made per loop turn */
#define NODE_RESTORE_QUEUE_MAX 4096 /* restored tablets waiting; more are UNAVAILABLE (retry) */
/* At close, before the server goes (node_backups_close): every restore waiting is answered
 * UNAVAILABLE. */
void node_restores_abort(node_ctx *n);

/* ---- shared by backup*.c ---- */
typedef struct bk_name {
    char full[5 * NODE_BK_NAME_MAX + 64]; /* projects/P/instances/I/clusters/C/backups/B */
    char project[NODE_BK_NAME_MAX + 1], instance[NODE_BK_NAME_MAX + 1];
    char cluster[NODE_BK_NAME_MAX + 1], id[NODE_BK_NAME_MAX + 1];
} bk_name;

/* INVALID_ARGUMENT unless name is projects/P/instances/I/clusters/C/backups/B with each part
 * 1..64 bytes of [A-Za-z0-9_.-] starting with a letter, digit or '_'. */
st_code bk_name_parse(const char *name, bk_name *out, st_err *err);
/* INVALID_ARGUMENT unless piece is [A-Za-z0-9_-]{1,64}. */
st_code bk_piece_check(const char *piece, st_err *err);
/* INVALID_ARGUMENT unless a piece's incarnation is at most NODE_BK_INCARNATION_MAX bytes. */
st_code bk_incarnation_check(const char *incarnation, st_err *err);
/* A sealed piece (at final, of making have) found by a call of making want: when want is set and
 * differs, the piece is a leftover of a deleted backup of the same id and goes to the trash
 * (*dropped). A call without a making (older routers) takes any piece. */
st_code bk_leftover_drop(node_ctx *n, const bk_name *b, const char *piece, const char *final,
                         const char *have, const char *want, bool *dropped, st_err *err);
/* INVALID_ARGUMENT unless file is [A-Za-z0-9_-]{1,64}.sst. */
st_code bk_file_check(const char *file, st_err *err);

void bk_root_dir(const node_ctx *n, char *out, size_t cap); /* <data>/backups */
void bk_backup_dir(const node_ctx *n, const bk_name *b, char *out, size_t cap);
/* The piece's directory; suffix "" for the sealed piece, ".tmp" or ".in". */
void bk_piece_dir(const node_ctx *n, const bk_name *b, const char *piece, const char *suffix,
                  char *out, size_t cap);

/* Writes dir/PIECE (format docs/formats/backup-piece.md) durably (tmp, fsync, rename, dir). */
st_code bk_manifest_write(const char *dir, const bk_piece *p, st_err *err);
/* Reads dir/PIECE, allocated from a (NULL: malloc; free with ..._free_unpacked). NOT_FOUND when
 * absent; DATA_LOSS when damaged. */
st_code bk_manifest_read(const char *dir, st_arena *a, bk_piece **out, st_err *err);
/* The sealed piece named so, checked to belong to backup b (its manifest names b): NOT_FOUND. */
st_code bk_piece_load(const node_ctx *n, const bk_name *b, const char *piece, st_arena *a,
                      bk_piece **out, st_err *err);
/* The file listed in p, or NULL. */
const Strata__Internal__V1__BackupFile *bk_piece_file(const bk_piece *p, const char *file);

st_code bk_file_crc(const char *path, uint64_t *size, uint32_t *crc, st_err *err);
/* bk_file_crc through the node's cache (any thread); *read tells whether the file was read
 * (counted in the freeze counters). */
st_code bk_file_crc_cached(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                           bool *read, st_err *err);
/* The CRC32C of the file's bytes as they are now, for a restore (node_backup_restore_verify):
 * from the cache only when this node read the same file (device, inode, size and modification
 * time unchanged: SSTables are never rewritten, any write moves the modification time) less than
 * BK_CRC_TRUST_US ago, else read through now and recorded. *read tells whether it was read. Any
 * thread. NOT_FOUND when the file is absent, INTERNAL on a read error. */
st_code bk_file_crc_fresh(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                          bool *read, st_err *err);
/* The CRC32C of a live SSTable (a freeze's link of it) for a piece, from the cache only when the
 * file was found sound; otherwise the file is read for it and then checked through
 * (sto_backup_file_verify), the verdict cached. ST_DATA_LOSS saying what is wrong in the file
 * (the caller names it); I/O errors as bk_file_crc's. Worker threads. */
st_code bk_sst_crc_checked(node_backups *b, const char *path, uint64_t *size, uint32_t *crc,
                           bool *read, st_err *err);
/* Files and bytes read for checksums: by freezes, and by the background pass (backup_crc.c). */
typedef struct bk_crc_stats {
    uint64_t freeze_files, freeze_bytes, bg_files, bg_bytes;
} bk_crc_stats;
void bk_crc_counters(node_backups *b, bk_crc_stats *out);
/* The background pass that checksums new SSTables into the cache (node_backups_open/close). */
st_code bk_crc_bg_start(node_ctx *n, st_err *err);
void bk_crc_bg_stop(node_backups *b);
/* Records the CRC32C of a file a piece holds (any thread). */
void bk_crc_remember(node_backups *b, const char *path, uint64_t size, uint32_t crc);
/* Records the CRC32C of chunk data written at offset off of a file being received, between the
 * two stats (before.st_size 0, off 0: the file starts). A chunk at the file's end extends the
 * file's cached CRC32C; one written past the end or into a hole (chunks arriving out of order)
 * is kept as a range with its own CRC32C until the ranges join up from offset 0 to the file's
 * end, when their CRC32Cs combine into the file's. Nothing is known of the file when its CRC so
 * far was not, or it changed between two chunks, or a chunk overlaps one already written (the
 * seal then reads it back). Loop thread (the cache is shared under crc_mu). */
struct stat;
void bk_crc_write(node_backups *b, const struct stat *before, const struct stat *after,
                  uint64_t off, st_slice data);
/* Fills the cache from the manifests of the pieces on disk (node_backups_open). */
void bk_crc_load(node_ctx *n);
st_code bk_fsync_path(const char *path, st_err *err); /* a file or a directory */
st_code bk_mkdirs(const char *path, st_err *err);     /* 0700, like mkdir -p */
/* Removes path (file or tree); absent is OK. */
st_code bk_remove_tree(const char *path, st_err *err);
/* Renames a directory into place and syncs the parent: the atomic step of a piece. */
st_code bk_publish(const char *from, const char *to, st_err *err);
/* Removes the dotted leftovers under <data>/backups and the backup directories they leave
 * empty, e.g. a restore's that failed after making its directory (node_backups_open). */
void bk_sweep(const node_ctx *n);

/* ---- the trash (backup_reap.c) ---- */
/* Renames path (a piece, an import directory, or with project a backup's whole directory) into
 * the trash and syncs its old parent: gone from its place at once, its files removed later by
 * the reaper thread. Absent is OK. Loop thread. */
st_code bk_trash(node_ctx *n, const char *path, const char *project, st_err *err);
/* The reaper thread, which empties the trash (also of what an earlier run left there). */
st_code bk_reaper_start(node_ctx *n, st_err *err);
void bk_reaper_stop(node_backups *b); /* at the next piece: the next start finishes the rest */

/* The node's backup state (node_ctx.backups). */
typedef struct bk_crc_entry bk_crc_entry;
typedef struct bk_rx bk_rx;
typedef struct bk_grant bk_grant;
struct node_backups {
    /* CRC32C of SSTables by inode (SSTables are immutable), filled by the background pass and
     * by freezes: a freeze reads only the files neither has seen yet. Shared with the worker
     * threads and the background pass under crc_mu. */
    pthread_mutex_t crc_mu;
    bk_crc_entry *crcs;
    size_t n_crcs, cap_crcs;
    bk_rx *rx; /* files received out of order: their CRC32C by range (under crc_mu) */
    size_t n_rx;
    uint64_t crc_gen; /* background passes started */
    uint64_t freeze_read_files, freeze_read_bytes, bg_read_files, bg_read_bytes;
    pthread_cond_t crc_cv; /* wakes the background pass at close (CLOCK_MONOTONIC) */
    bool crc_stop, crc_thread_on;
    pthread_t crc_thread;
    char sst_dir[NODE_BK_PATH_MAX];
    sto_db *db;  /* checks the SSTables the pass and freezes read (bk_sst_crc_checked) */
    char **busy; /* piece directories a worker or a pull is making or changing (loop thread) */
    bool *busy_doomed; /* per busy piece: its backup was deleted meanwhile (bk_busy_doom) */
    size_t n_busy, cap_busy;
    struct bk_pull *pulls;    /* PullBackupPiece calls in progress (backup_xfer.c) */
    struct bk_pulled *pulled; /* files pulled lately, for links (backup_xfer.c; loop thread) */
    size_t n_pulled, next_pulled;
    bk_grant *grants; /* read tickets for pulls (backup_grant.c; loop thread; NULL: none yet) */
    /* the trash and its reaper (backup_reap.c) */
    char trash[NODE_BK_PATH_MAX];
    uint64_t trash_seq; /* loop thread */
    pthread_mutex_t reap_mu;
    pthread_cond_t reap_cv;
    pthread_t reap_thread;
    bool reap_on, reap_wake, reap_stop;
    uint64_t reaped, reaped_pieces; /* trash entries and the pieces in them removed (atomic) */
    bool closing; /* node_backups_close began: no restore joins the queue (loop thread) */
    /* CreateTablet calls with restore_backup waiting for their batch (internal.c; loop thread) */
    struct node_restore_wait *restore_q;
    size_t n_restore_q, cap_restore_q;
    struct event *restore_ev; /* a zero timer: the next batch */
};

/* ---- read tickets (backup_grant.c; loop thread) ---- */
/* ST_OK when call may read piece of backup with what (a method name, for the message): always
 * for callers whose certificate does not name strata-node, else only with a live ticket
 * GrantBackupRead made for exactly that (backup, piece); ST_UNAUTHENTICATED otherwise, err
 * saying what is missing. A use keeps the ticket alive. */
st_code bk_grant_check(node_ctx *n, rpc_call *call, const char *what, const char *backup,
                       const char *piece, const char *ticket, st_err *err);
void bk_grants_free(node_backups *b);

/* Pieces being made or changed by a worker or a pull: one key per piece directory. Loop thread. */
bool bk_busy(node_ctx *n, const char *dir);
bool bk_busy_add(node_ctx *n, const char *dir);
void bk_busy_remove(node_ctx *n, const char *dir);
/* DeleteBackupPieces while a piece is made (a pull, a seal, a freeze): the piece directory dir,
 * or with prefix every busy piece under dir, must not appear once its work ends (it would have
 * no record: nothing would ever delete it). The work checks bk_busy_doomed before it answers. */
void bk_busy_doom(node_ctx *n, const char *dir, bool prefix);
bool bk_busy_doomed(node_ctx *n, const char *dir);

/* Seals the import directory <piece>.in against p (sizes, CRC32C): the work of SealBackupPiece
 * and of a pull's end. The CRC32C of a file comes from the cache when its chunks were
 * checksummed on the way in (bk_write_chunk), else the file is read back; each file is fsync'd
 * once. Then every file is read through (sto_backup_file_verify: key order, versions no later
 * than p's frozen_us + NODE_CLOCK_AHEAD_MAX_US): ST_DATA_LOSS naming the file, nothing sealed
 * (pulled: the files came by PullBackupPiece, whose source checked them, so the advice differs).
 * Thread-safe (files and the cache). out is p as stored (malloc'd); *read_back counts the files
 * read back for their CRC32C. */
st_code bk_seal_dir(node_backups *b, sto_db *db, const char *in_dir, const char *final_dir,
                    const bk_piece *p, uint32_t node_num, bool pulled, bk_piece **out,
                    size_t *read_back, st_err *err);
/* Appends data at off to file in dir (off 0 starts it anew, as a new file: a link another piece
 * holds to the old one keeps its bytes); FAILED_PRECONDITION when off is not the file's current
 * size. The chunk's CRC32C extends the file's in the cache (bk_crc_write) and its writeback
 * starts, so the seal neither reads it back nor waits long for its fsync. Loop thread (a chunk
 * is at most NODE_BK_CHUNK_BYTES). */
st_code bk_write_chunk(node_backups *b, const char *dir, const char *file, uint64_t off,
                       st_slice data, st_err *err);
void bk_piece_free(bk_piece *p);  /* malloc'd pieces; NULL is fine */
void bk_pulls_abort(node_ctx *n); /* node_backups_close: pulls end UNAVAILABLE */

#endif
