/* ops/backup_dir.h — `strata backup` (docs/backups.md, docs/formats/backup-export.md), private to
 * ops/:
 *
 * - the export directory (backup_dir.c): its MANIFEST (parse, format), writing files so a crash
 *   never leaves a directory that verifies, and checking every file against the manifest;
 * - the commands (backup.c: create/list/describe/delete/restore through the router's Cloud
 *   Bigtable admin API; backup_xfer.c: export/import/verify, moving bytes straight to and from
 *   the nodes).
 *
 * Errors: INVALID_ARGUMENT for a manifest that is not one (err names the line), DATA_LOSS for a
 * file that does not match it (err names the file), NOT_FOUND for a missing file or manifest,
 * UNAVAILABLE for I/O failures; err always says what to do. */
#ifndef STRATA_OPS_BACKUP_DIR_H
#define STRATA_OPS_BACKUP_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#define OPS_BK_MAGIC "strata-backup-export"
#define OPS_BK_VERSION 3     /* written by export */
#define OPS_BK_VERSION_MIN 1 /* still read by verify and import */
#define OPS_BK_MANIFEST "MANIFEST"
#define OPS_BK_PIECES "pieces" /* version 1: DIR/pieces/<piece id>/<file name> */
#define OPS_BK_FILES                                                                               \
    "files" /* version 2: DIR/files/<SHA-256 hex>, each content once;                              \
             * version 3: DIR/files/<piece id>.<file name>, each file once */
#define OPS_BK_TMP_SUFFIX ".tmp"
#define OPS_BK_MANIFEST_BYTES_MAX (64u << 20)
#define OPS_BK_SCHEMA_BYTES_MAX (1u << 20)
#define OPS_BK_KEY_BYTES_MAX 4096 /* a piece's start or end key (Bigtable row keys: 4 KiB) */
#define OPS_BK_NAME_MAX 1024      /* backup and table resource names */
#define OPS_BK_PIECE_ID_MAX 64    /* [A-Za-z0-9_-]{1,64}, as node.proto */
#define OPS_BK_FILE_NAME_MAX 128  /* [A-Za-z0-9_.-], not starting with '.' */
#define OPS_BK_PIECES_MAX 100000
#define OPS_BK_FILES_MAX 1000000 /* over all pieces */
#define OPS_BK_SHA256_BYTES 32

typedef struct ops_bk_file {
    char name[OPS_BK_FILE_NAME_MAX + 1];
    uint64_t size;
    uint32_t crc32c;
    uint8_t sha256[OPS_BK_SHA256_BYTES]; /* versions 1 and 2 only (zero in version 3) */
    /* version 3: the piece whose files/<at>.<name> holds the bytes (this piece, or an earlier
     * one listing the same name, size and CRC32C: pieces of one node share files) */
    char at[OPS_BK_PIECE_ID_MAX + 1];
} ops_bk_file;

typedef struct ops_bk_piece {
    char id[OPS_BK_PIECE_ID_MAX + 1];
    st_buf start_key, end_key; /* end empty: unbounded */
    int64_t frozen_us;
    ops_bk_file *files; /* malloc'd */
    size_t n_files, cap_files;
} ops_bk_piece;

typedef struct ops_bk_manifest {
    int version;                            /* OPS_BK_VERSION by init; as read by parse */
    char backup[OPS_BK_NAME_MAX + 1];       /* projects/P/instances/I/clusters/C/backups/B */
    char source_table[OPS_BK_NAME_MAX + 1]; /* projects/P/instances/I/tables/T */
    int backup_type;                        /* Backup.BackupType: 1 STANDARD, 2 HOT */
    int64_t start_us, end_us, expire_us;
    int64_t hot_us; /* HOT: hot_to_standard_time (optional line; 0 = none) */
    st_buf schema;  /* packed google.bigtable.admin.v2.Table: families, GC rules, change streams */
    ops_bk_piece *pieces; /* malloc'd */
    size_t n_pieces, cap_pieces;
} ops_bk_manifest;

void ops_bk_manifest_init(ops_bk_manifest *m);
void ops_bk_manifest_deinit(ops_bk_manifest *m);
/* Appends a piece (id copied; keys copied) and returns it; NULL out of memory. */
ops_bk_piece *ops_bk_manifest_add_piece(ops_bk_manifest *m, const char *id, st_slice start,
                                        st_slice end, int64_t frozen_us);
/* Appends a file to p; NULL out of memory. */
ops_bk_file *ops_bk_piece_add_file(ops_bk_piece *p, const ops_bk_file *f);
uint64_t ops_bk_manifest_bytes(const ops_bk_manifest *m); /* sum of file sizes */
size_t ops_bk_manifest_files(const ops_bk_manifest *m);
/* The bytes stored once in the export (version 3: the files each piece holds itself, not those
 * it shares with an earlier piece); versions 1 and 2: the sum of file sizes. */
uint64_t ops_bk_manifest_stored_bytes(const ops_bk_manifest *m);

/* Names the format allows (exactly what the parser accepts, so an export never writes a
 * manifest it would refuse). */
bool ops_bk_piece_id_ok(const char *s);
bool ops_bk_file_name_ok(const char *s);
bool ops_bk_resource_name_ok(const char *s);

/* The manifest's text, ending with its `end` line (CRC32C and SHA-256 of everything before). */
st_code ops_bk_manifest_format(const ops_bk_manifest *m, st_buf *out, st_err *err);
/* Parses text (what = how errors name it: "DIR/MANIFEST"). m is initialised by the call and
 * must be deinit'd whatever the result. Refuses (INVALID_ARGUMENT, naming the line) a bad
 * checksum line, unknown version, names outside the allowed sets (no path can leave the
 * directory), duplicate pieces or files, a piece whose range is empty, sizes past the limits.
 * The pieces may be listed in any order: m holds them sorted by start key, and a gap or an
 * overlap between them is refused (ops_bk_manifest_check, naming the pieces). */
st_code ops_bk_manifest_parse(const char *text, size_t len, const char *what, ops_bk_manifest *m,
                              st_err *err);

/* The parsed fields against each other (backup_check.c; ops_bk_manifest_parse calls it):
 * backup and source_table names of one instance, backup_type 1 or 2, start_us <= end_us <
 * expire_us, hot_to_standard_us only for HOT, pieces (sorted by start key, as the parser leaves
 * them) covering the key space once, without gap or overlap, with frozen_us
 * between start and end (an hour of clock skew allowed), sizes summing within int64.
 * INVALID_ARGUMENT naming what and the field. */
st_code ops_bk_manifest_check(const ops_bk_manifest *m, const char *what, st_err *err);

/* ---- writing an export directory ---- */

/* Where file f of piece p of m lives under dir: version 1 pieces/<piece>/<name>, version 2
 * files/<SHA-256 hex> (every piece holding the same content shares it), version 3
 * files/<f->at>.<name>. False (err set when not NULL) when the path is too long. */
bool ops_bk_file_path(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                      const ops_bk_file *f, char *out, size_t cap, st_err *err);

/* Creates dir (which must not exist, or be empty) and dir/files (version 2) or dir/pieces;
 * *made: dir did not exist (ops_bk_dir_remove removes it then). ALREADY_EXISTS when dir holds
 * anything; on any failure nothing it made is left. */
st_code ops_bk_dir_create(const char *dir, int version, bool *made, st_err *err);
/* Removes what an export that failed wrote into dir (files/ or pieces/ and the manifest), and
 * dir itself when made; true when that left nothing of the export (dir gone or empty). */
bool ops_bk_dir_remove(const char *dir, int version, bool made);

/* One file being written: under a temporary name, checksummed as it goes (CRC32C; SHA-256 too
 * before version 3); version 2 renames it to its digest at close, version 3 to
 * files/<piece>.<name>. */
typedef struct ops_bk_out {
    int fd;
    int version;
    char piece[OPS_BK_PIECE_ID_MAX + 1];
    char files[4096]; /* version 2: dir/files */
    char tmp[4096], final[4096];
    uint64_t size;
    uint32_t crc32c;
    void *sha; /* EVP_MD_CTX; NULL from version 3 */
} ops_bk_out;

st_code ops_bk_out_open(ops_bk_out *o, const char *dir, int version, const char *piece,
                        const char *name, st_err *err);
st_code ops_bk_out_write(ops_bk_out *o, const void *data, size_t len, st_err *err);
/* Starts the file's writeback, closes it and renames it to its final name; fills f's size,
 * checksums and (version 3) at (name kept). Not durable yet: ops_bk_manifest_write fsyncs every
 * file it names. */
st_code ops_bk_out_close(ops_bk_out *o, ops_bk_file *f, st_err *err);
/* Closes and removes the temporary file (after a failure). */
void ops_bk_out_abort(ops_bk_out *o);

/* Version 1: makes dir/pieces/<to_piece>/<name> a hard link to the same file of from_piece (an
 * export writes a file that several pieces of one node share only once). */
st_code ops_bk_link(const char *dir, const char *from_piece, const char *to_piece, const char *name,
                    st_err *err);

/* fsyncs every file m names and every piece directory, then writes MANIFEST under a temporary
 * name, fsyncs it, renames it and syncs dir: the manifest exists only once every file it names
 * is durable. */
st_code ops_bk_manifest_write(const char *dir, const ops_bk_manifest *m, st_err *err);

/* ---- reading and checking ---- */

/* Reads and parses dir/MANIFEST (NOT_FOUND when absent: an export that did not finish). */
st_code ops_bk_manifest_load(const char *dir, ops_bk_manifest *m, st_err *err);

/* Per-file callback of the checks: bytes as they are read (progress, or the import sending
 * them on). A code other than ST_OK stops the read and is returned (the callback sets err). */
typedef st_code (*ops_bk_read_fn)(const uint8_t *data, size_t len, void *arg, st_err *err);

/* Checks that every file named exists as a regular file with its size (no content read). */
st_code ops_bk_check_sizes(const char *dir, const ops_bk_manifest *m, st_err *err);
/* Reads one file of piece p and checks size, CRC32C and (before version 3) SHA-256; on_data
 * sees every chunk
 * (the import sends them on) and may be NULL. DATA_LOSS names the file. */
st_code ops_bk_check_file(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                          const ops_bk_file *f, ops_bk_read_fn on_data, void *arg, st_err *err);
/* The file's device and inode (false when it cannot be looked at): a file that several pieces
 * share (version 2: one file per content; version 1: hard links) is read once by verify. */
bool ops_bk_file_id(const char *dir, const ops_bk_manifest *m, const ops_bk_piece *p,
                    const ops_bk_file *f, uint64_t *dev, uint64_t *ino);
/* ops_bk_manifest_load + ops_bk_check_file for every file. */
st_code ops_bk_verify(const char *dir, ops_bk_manifest *m, ops_bk_read_fn on_data, void *arg,
                      st_err *err);

/* True when a and b of manifest m are the same bytes: the same size and CRC32C, and the same
 * SHA-256 (versions 1 and 2) or the same files/<at>.<name> (version 3). */
bool ops_bk_file_same(const ops_bk_manifest *m, const ops_bk_file *a, const ops_bk_file *b);

/* A file's checksum as it is read, for the manifest's version: CRC32C from version 3, SHA-256
 * before (where the CRC32C is the node's to check). */
typedef struct ops_bk_sum {
    int version;
    uint32_t crc32c;
    void *sha; /* EVP_MD_CTX, versions 1 and 2 */
} ops_bk_sum;

st_code ops_bk_sum_init(ops_bk_sum *s, int version, st_err *err);
void ops_bk_sum_update(ops_bk_sum *s, const void *data, size_t len);
/* Finishes (and frees) the sum: true when it is f's. */
bool ops_bk_sum_matches(ops_bk_sum *s, const ops_bk_file *f);
void ops_bk_sum_free(ops_bk_sum *s);

/* Hex helpers (lower case). */
void ops_bk_hex(const uint8_t *data, size_t len, char *out); /* out: 2*len+1 */

/* ---- commands ---- */
int ops_backup_main(int argc, char **argv);

#endif
