/*
 * Proves backups on real strata-node processes (docs/backups.md, "On a node"):
 *   - BackupTablet freezes a tablet (idempotent per piece and making); writes after it are not in
 *     the piece; a piece of another making (a leftover of a deleted backup of the same id) is
 *     replaced by a new freeze or pull, never answered; DeleteBackupPieces of one making leaves
 *     another making's pieces;
 *     PutTable + CreateTablet(restore_backup, restore_piece) makes a table whose rows are exactly
 *     the frozen ones, also after a restart of the node;
 *   - ReadBackupFile / WriteBackupFile / SealBackupPiece copy the piece to a second node, where it
 *     restores the same rows; PullBackupPiece copies it there under another backup name;
 *   - hostile names (.., /, over-long, wrong instance) are INVALID_ARGUMENT; a missing tablet,
 *     piece or file NOT_FOUND; an out-of-order chunk FAILED_PRECONDITION; a seal with a wrong
 *     CRC DATA_LOSS naming the file; an oversized chunk INVALID_ARGUMENT; a seal of a piece
 *     listing a file never written FAILED_PRECONDITION, of one listing no file (an empty
 *     tablet's) OK with nothing written;
 *   - kill -9 during a BackupTablet, then a restart: the piece is whole or absent, and unsealed
 *     leftovers are gone; DeleteBackupPieces removes pieces;
 *   - a file received in chunks is sealed without being read back, also when its chunks came
 *     out of order (any_order; a damaged chunk still fails the seal); WriteBackupFile with
 *     link_piece links a file another piece holds (a wrong CRC32C DATA_LOSS, leaving nothing),
 *     and a file restarted at offset 0 leaves a piece that linked it unchanged; kill -9 in the
 *     middle of an import leaves the sealed pieces whole and the unsealed one gone;
 *   - ListBackupPieces of one piece (what a pull asks) answers that piece only;
 *   - DeleteBackupPieces of a backup of 1,000 pieces answers at once and its files go on the
 *     node's reaper thread while other calls answer; a piece of another project sharing the
 *     backup's directory stays; what a crash left in the trash goes at the next start;
 *   - after a restart the background pass checksums the SSTables no piece holds: a freeze then
 *     reads no file back (its log line's crc_read_files=0), and its CRCs pass a seal on node 2;
 *   - the nodes then stop cleanly (exit 0: no leak under ASan).
 *
 *   backup_node_test PATH/TO/strata-node
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "btclient.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

#define NODE "/strata.internal.v1.Node/"
#define INST "projects/p/instances/i"
#define B1 INST "/clusters/c1/backups/b1"
#define B2 INST "/clusters/c1/backups/b2"
#define B3 INST "/clusters/c1/backups/b3"
#define B4 INST "/clusters/c1/backups/b4"
#define CALL_TIMEOUT_MS 60000
#define ROWS 300

typedef Strata__Internal__V1__BackupPiece pb_piece;

static int g_failures;
static const char *g_bin;
static char g_dir[BT_PATH_MAX - 64], g_data[2][BT_PATH_MAX];
static bt_proc g_node[2];
static bt_client g_c[2];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL line %d: ", __LINE__);                                                    \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

static void node_start(int i) {
    st_err err = {0};
    if (bt_node_start(&g_node[i], g_bin, g_data[i], &err) != ST_OK) {
        printf("FAIL: strata-node did not start: %s\n", err.msg);
        exit(1);
    }
    bt_client_init(&g_c[i], g_node[i].addr);
}

static void node_stop(int i) {
    int status = 0;
    bt_proc_stop(&g_node[i], SIGTERM, &status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "strata-node did not exit cleanly (status 0x%x; see %s.log)", status, g_data[i]);
}

static st_code unary(int i, const char *method, const ProtobufCMessage *req, st_buf *resp,
                     st_err *st) {
    char path[128];
    snprintf(path, sizeof path, NODE "%s", method);
    if (resp)
        st_buf_reset(resp);
    return bt_call_pb(g_c[i].addr, path, req, CALL_TIMEOUT_MS, resp, st);
}

static void expect_code(const char *what, st_code got, const st_err *st, st_code want,
                        const char *needle) {
    bool ok = got == want && (!needle || strstr(st->msg, needle));
    printf("%-58s %-20s %s\n", what, st_code_name(got), ok ? "ok" : "WRONG");
    CHECK(ok, "%s: got %s \"%s\", want %s%s%s", what, st_code_name(got), st->msg,
          st_code_name(want), needle ? " with " : "", needle ? needle : "");
}

/* ---- data ---- */

static void write_rows(int node, const char *table, int from, int to, const char *tag) {
    bt_muts m;
    bt_muts_init(&m);
    for (int r = from; r < to; r++) {
        char row[32], val[64];
        snprintf(row, sizeof row, "r%04d", r);
        snprintf(val, sizeof val, "%s-%d", tag, r);
        bt_muts_reset(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("q"), 1000 * (1000 + r), st_slice_cstr(val));
        st_err st = {0};
        st_code rc = bt_mutate_row(&g_c[node], table, st_slice_cstr(row), &m, &st);
        CHECK(rc == ST_OK, "write %s: %s", row, st.msg);
    }
    bt_muts_deinit(&m);
}

static void dump(int node, const char *table, st_buf *out) {
    st_buf_reset(out);
    bt_read_req req = {0};
    st_err st = {0};
    size_t n = 0;
    st_code rc = bt_read_dump(&g_c[node], table, &req, out, &n, &st);
    CHECK(rc == ST_OK, "reading %s: %s", table, st.msg);
}

static uint64_t first_tablet(int node, const char *table) {
    char name[BT_NAME_MAX];
    bt_table_name(&g_c[node], table, name);
    Strata__Internal__V1__ListTabletsRequest req = STRATA__INTERNAL__V1__LIST_TABLETS_REQUEST__INIT;
    req.table_name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    uint64_t id = 0;
    if (unary(node, "ListTablets", &req.base, &resp, &st) == ST_OK) {
        Strata__Internal__V1__ListTabletsResponse *r =
            strata__internal__v1__list_tablets_response__unpack(NULL, resp.len, resp.data);
        if (r && r->n_tablets)
            id = r->tablets[0]->id;
        if (r)
            strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    }
    st_buf_free(&resp);
    CHECK(id != 0, "no tablet for %s", table);
    return id;
}

/* BackupTablet asked by the making `incarnation` ("": none, as an earlier router asks). */
static st_code backup_tablet_of(int node, uint64_t id, const char *backup, const char *piece,
                                const char *incarnation, pb_piece **out, st_err *st) {
    Strata__Internal__V1__BackupTabletRequest req =
        STRATA__INTERNAL__V1__BACKUP_TABLET_REQUEST__INIT;
    req.tablet_id = id;
    req.backup = (char *)backup;
    req.piece = (char *)piece;
    req.incarnation = (char *)incarnation;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(node, "BackupTablet", &req.base, &resp, st);
    if (out)
        *out = rc == ST_OK ? strata__internal__v1__backup_piece__unpack(NULL, resp.len, resp.data)
                           : NULL;
    st_buf_free(&resp);
    return rc;
}

static st_code backup_tablet(int node, uint64_t id, const char *backup, const char *piece,
                             pb_piece **out, st_err *st) {
    return backup_tablet_of(node, id, backup, piece, "", out, st);
}

/* PutTable `table` (family cf) on node, then CreateTablet restoring the piece for all rows. */
static st_code restore(int node, const char *table, const char *backup, const char *piece,
                       st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(&g_c[node], table, name);
    Google__Bigtable__Admin__V2__ColumnFamily cf = GOOGLE__BIGTABLE__ADMIN__V2__COLUMN_FAMILY__INIT;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e =
        GOOGLE__BIGTABLE__ADMIN__V2__TABLE__COLUMN_FAMILIES_ENTRY__INIT;
    e.key = "cf";
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *ev[] = {&e};
    Google__Bigtable__Admin__V2__Table t = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__INIT;
    t.name = name;
    t.column_families = ev;
    t.n_column_families = 1;
    Strata__Internal__V1__PutTableRequest put = STRATA__INTERNAL__V1__PUT_TABLE_REQUEST__INIT;
    put.table = &t;
    st_code rc = unary(node, "PutTable", &put.base, NULL, st);
    if (rc != ST_OK)
        return rc;
    Strata__Internal__V1__CreateTabletRequest req =
        STRATA__INTERNAL__V1__CREATE_TABLET_REQUEST__INIT;
    req.table_name = name;
    req.restore_backup = (char *)backup;
    req.restore_piece = (char *)piece;
    return unary(node, "CreateTablet", &req.base, NULL, st);
}

static pb_piece *list_piece(int node, const char *backup, const char *piece) {
    Strata__Internal__V1__ListBackupPiecesRequest req =
        STRATA__INTERNAL__V1__LIST_BACKUP_PIECES_REQUEST__INIT;
    req.backup = (char *)backup;
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    pb_piece *found = NULL;
    if (unary(node, "ListBackupPieces", &req.base, &resp, &st) == ST_OK) {
        Strata__Internal__V1__ListBackupPiecesResponse *r =
            strata__internal__v1__list_backup_pieces_response__unpack(NULL, resp.len, resp.data);
        for (size_t i = 0; r && i < r->n_pieces && !found; i++) {
            if (strcmp(r->pieces[i]->piece, piece) != 0)
                continue;
            size_t len = protobuf_c_message_get_packed_size(&r->pieces[i]->base);
            uint8_t *buf = malloc(len + 1);
            protobuf_c_message_pack(&r->pieces[i]->base, buf);
            found = strata__internal__v1__backup_piece__unpack(NULL, len, buf);
            free(buf);
        }
        if (r)
            strata__internal__v1__list_backup_pieces_response__free_unpacked(r, NULL);
    }
    st_buf_free(&resp);
    return found;
}

/* How many pieces ListBackupPieces of backup answers when asked for `only` ("" for all); the
 * first one's id in first (cap bytes). -1 when the call fails. */
static long list_count(int node, const char *backup, const char *only, char *first, size_t cap) {
    Strata__Internal__V1__ListBackupPiecesRequest req =
        STRATA__INTERNAL__V1__LIST_BACKUP_PIECES_REQUEST__INIT;
    req.backup = (char *)backup;
    req.piece = (char *)only;
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    long n = -1;
    first[0] = '\0';
    if (unary(node, "ListBackupPieces", &req.base, &resp, &st) == ST_OK) {
        Strata__Internal__V1__ListBackupPiecesResponse *r =
            strata__internal__v1__list_backup_pieces_response__unpack(NULL, resp.len, resp.data);
        n = r ? (long)r->n_pieces : -1;
        if (r && r->n_pieces)
            snprintf(first, cap, "%s", r->pieces[0]->piece);
        if (r)
            strata__internal__v1__list_backup_pieces_response__free_unpacked(r, NULL);
    }
    st_buf_free(&resp);
    return n;
}

/* ---- file copies ---- */

typedef struct copy_ctx {
    int to;
    const char *backup, *piece, *file;
    st_code rc;
    st_err st;
    uint64_t bytes;
} copy_ctx;

static void copy_chunk(st_slice msg, void *arg) {
    copy_ctx *c = arg;
    Strata__Internal__V1__BackupFileChunk *in =
        strata__internal__v1__backup_file_chunk__unpack(NULL, msg.len, msg.data);
    if (!in) {
        c->rc = ST_DATA_LOSS;
        return;
    }
    CHECK(in->offset == c->bytes && in->data.len <= (1u << 20), "chunk at %" PRIu64 " len %zu",
          in->offset, in->data.len);
    Strata__Internal__V1__BackupFileChunk out = STRATA__INTERNAL__V1__BACKUP_FILE_CHUNK__INIT;
    out.backup = (char *)c->backup;
    out.piece = (char *)c->piece;
    out.file = (char *)c->file;
    out.offset = in->offset;
    out.data = in->data;
    if (c->rc == ST_OK)
        c->rc = unary(c->to, "WriteBackupFile", &out.base, NULL, &c->st);
    c->bytes += in->data.len;
    strata__internal__v1__backup_file_chunk__free_unpacked(in, NULL);
}

static st_code read_file(int from, const char *backup, const char *piece, const char *file,
                         void (*fn)(st_slice, void *), void *arg, st_err *st) {
    Strata__Internal__V1__ReadBackupFileRequest req =
        STRATA__INTERNAL__V1__READ_BACKUP_FILE_REQUEST__INIT;
    req.backup = (char *)backup;
    req.piece = (char *)piece;
    req.file = (char *)file;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t buf[1024];
    protobuf_c_message_pack(&req.base, buf);
    return rpc_blocking_stream(g_c[from].addr, NULL, NODE "ReadBackupFile", st_slice_make(buf, len),
                               NULL, 0, CALL_TIMEOUT_MS, fn, arg, st);
}

/* Copies piece p of node `from` to node `to` file by file, then seals it there. */
static st_code export_import(int from, int to, const pb_piece *p, st_err *st) {
    for (size_t i = 0; i < p->n_files; i++) {
        copy_ctx c = {.to = to, .backup = p->backup, .piece = p->piece, .file = p->files[i]->name};
        st_code rc = read_file(from, p->backup, p->piece, p->files[i]->name, copy_chunk, &c, st);
        if (rc == ST_OK && c.rc != ST_OK) {
            *st = c.st;
            rc = c.rc;
        }
        if (rc != ST_OK)
            return rc;
        CHECK(c.bytes == p->files[i]->size, "copied %" PRIu64 " of %" PRIu64 " bytes", c.bytes,
              p->files[i]->size);
    }
    return unary(to, "SealBackupPiece", &p->base, NULL, st);
}

/* Owner-only: the piece's directory 0700, its manifest and files 0600. */
static void check_modes(int node, const char *piece) {
    char dir[BT_PATH_MAX + 64], path[BT_PATH_MAX + 384];
    snprintf(dir, sizeof dir, "%s/backups/i/c1/b1/%s", g_data[node], piece);
    struct stat sb;
    CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700, "%s mode %o", dir,
          (unsigned)(sb.st_mode & 0777));
    DIR *d = opendir(dir);
    struct dirent *e;
    int files = 0;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600, "%s mode %o", path,
              (unsigned)(sb.st_mode & 0777));
        files++;
    }
    if (d)
        closedir(d);
    CHECK(files >= 2, "piece %s holds %d files", dir, files);
    printf("%-58s %s\n", "piece directory 0700, files 0600", files >= 2 ? "ok" : "WRONG");
}

/* ---- parts of the test ---- */

static void test_hostile(uint64_t id) {
    st_err st = {0};
    st_code rc = backup_tablet(0, id, INST "/clusters/c1/backups/..", "p", NULL, &st);
    expect_code("BackupTablet backup id ..", rc, &st, ST_INVALID_ARGUMENT, "invalid backup");
    rc = backup_tablet(0, id, INST "/clusters/../backups/b", "p", NULL, &st);
    expect_code("BackupTablet cluster ..", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = backup_tablet(0, id, INST "/clusters/c1/backups/b/x", "p", NULL, &st);
    expect_code("BackupTablet backup with /", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = backup_tablet(0, id, B1, "../../x", NULL, &st);
    expect_code("BackupTablet piece ../../x", rc, &st, ST_INVALID_ARGUMENT, "invalid piece");
    char longp[200];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    rc = backup_tablet(0, id, B1, longp, NULL, &st);
    expect_code("BackupTablet piece of 199 bytes", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = backup_tablet(0, id, "projects/p/instances/other/clusters/c1/backups/b", "p", NULL, &st);
    expect_code("BackupTablet into another instance", rc, &st, ST_INVALID_ARGUMENT, "instance");
    rc = backup_tablet(0, 424242, B1, "p", NULL, &st);
    expect_code("BackupTablet missing tablet", rc, &st, ST_NOT_FOUND, NULL);
    rc = read_file(0, B1, "p0", "../p0/PIECE", NULL, NULL, &st);
    expect_code("ReadBackupFile file ../p0/PIECE", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = read_file(0, B1, "p0", "PIECE", NULL, NULL, &st);
    expect_code("ReadBackupFile the manifest", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = read_file(0, B1, "p0", "00000000000000999999.sst", NULL, NULL, &st);
    expect_code("ReadBackupFile missing file", rc, &st, ST_NOT_FOUND, NULL);
    rc = read_file(0, B2, "p0", "00000000000000999999.sst", NULL, NULL, &st);
    expect_code("ReadBackupFile missing backup", rc, &st, ST_NOT_FOUND, NULL);
    rc = read_file(0, "projects/p/instances/i/backups/b1", "p0", "a.sst", NULL, NULL, &st);
    expect_code("ReadBackupFile name without cluster", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = restore(0, "nowhere", B1, "nope", &st);
    expect_code("CreateTablet restoring a missing piece", rc, &st, ST_NOT_FOUND, NULL);
}

/* ---- SSTables for the seal: it reads every file through, so the bytes sent must be one ---- */

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        p[n++] = (uint8_t)(v | 0x80);
    p[n++] = (uint8_t)v;
    return n;
}

static void put_le(uint8_t *p, uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The block at d[0, len) gets its trailer: type 0 (stored), masked CRC32C of block and type. */
static size_t seal_block(uint8_t *d, size_t len) {
    d[len] = 0;
    put_le(d + len + 1, st_crc_mask(st_crc32c(0, d, len + 1)), 4);
    return len + 5;
}

/* One entry (restart point) and the restart array of a one-entry block at d. */
static size_t one_entry_block(uint8_t *d, const uint8_t *key, size_t klen, const uint8_t *v,
                              size_t vlen) {
    size_t n = put_varint(d, 0);
    n += put_varint(d + n, klen);
    n += put_varint(d + n, vlen);
    memcpy(d + n, key, klen);
    if (vlen)
        memmove(d + n + klen, v, vlen);
    n += klen + vlen;
    put_le(d + n, 0, 4);
    put_le(d + n + 4, 1, 4);
    return n + 8;
}

/* d[0, size) becomes an SSTable (docs/formats/sstable.md) of one cell r f:q at 1000 us with
 * version 1 << 10 (far below any piece's frozen_us) whose value is a pattern of seed; the bloom
 * filter's length pads it to exactly size (at least 512) bytes. */
static void sst_fill(uint8_t *d, size_t size, unsigned seed) {
    uint8_t key[28] = {'r', 0, 1, 2, 'f', 0, 1, 2, 'q', 0, 1, 2};
    for (int i = 0; i < 8; i++) {
        key[12 + i] = (uint8_t)((UINT64_MAX - 1000) >> (56 - 8 * i));
        key[20 + i] = (uint8_t)((UINT64_MAX - (1u << 10)) >> (56 - 8 * i));
    }
    size_t vlen = size - 400, off, hlen, fo, mo, io, ilen;
    for (size_t i = 0; i < vlen; i++)
        d[40 + i] = (uint8_t)((i * 2654435761u + seed) >> 11);
    size_t blen = one_entry_block(d, key, sizeof key, d + 40, vlen);
    size_t data_end = seal_block(d, blen);
    uint8_t handle[24], meta[64], index[128];
    hlen = put_varint(handle, 0);
    hlen += put_varint(handle + hlen, blen);
    ilen = one_entry_block(index, key, sizeof key, handle, hlen);
    size_t mlen = put_varint(meta, sizeof key);
    memcpy(meta + mlen, key, sizeof key);
    mlen += sizeof key;
    mlen += put_varint(meta + mlen, sizeof key);
    memcpy(meta + mlen, key, sizeof key);
    mlen += sizeof key;
    mlen += put_varint(meta + mlen, 1);
    size_t flen = size - data_end - 5 - (mlen + 5) - (ilen + 5) - 80;
    fo = data_end;
    memset(d + fo, 0xff, flen - 1);
    d[fo + flen - 1] = 6;
    mo = fo + seal_block(d + fo, flen);
    memcpy(d + mo, meta, mlen);
    io = mo + seal_block(d + mo, mlen);
    memcpy(d + io, index, ilen);
    off = io + seal_block(d + io, ilen);
    const uint64_t footer[8] = {io, ilen, fo, flen, mo, mlen, 1, data_end};
    for (int i = 0; i < 8; i++)
        put_le(d + off + 8 * i, footer[i], 8);
    put_le(d + off + 64, 1, 4);
    put_le(d + off + 68, st_crc_mask(st_crc32c(0, d + off, 68)), 4);
    put_le(d + off + 72, 0x0031545353415453ull, 8);
}

static void test_write_rules(void) {
    st_err st = {0};
    Strata__Internal__V1__BackupFileChunk c = STRATA__INTERNAL__V1__BACKUP_FILE_CHUNK__INIT;
    c.backup = B3;
    c.piece = "w";
    c.file = "x.sst";
    uint8_t data[600];
    sst_fill(data, sizeof data, 3);
    c.data = (ProtobufCBinaryData){sizeof data, data};
    c.offset = 5;
    st_code rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile first chunk not at 0", rc, &st, ST_FAILED_PRECONDITION, NULL);
    c.offset = 0;
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile at 0", rc, &st, ST_OK, NULL);
    c.offset = 50;
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile out of order", rc, &st, ST_FAILED_PRECONDITION, "600");
    c.file = "../x.sst";
    c.offset = 0;
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile file ../x.sst", rc, &st, ST_INVALID_ARGUMENT, NULL);
    c.file = "y.sst";
    uint8_t *big = calloc(1, (2u << 20));
    c.data = (ProtobufCBinaryData){2u << 20, big};
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile 2 MiB chunk", rc, &st, ST_INVALID_ARGUMENT, "at most");
    free(big);
    c.file = "extra.sst"; /* written, then left out of the manifest: the seal drops it */
    c.data = (ProtobufCBinaryData){sizeof data, data};
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile a file the seal will not list", rc, &st, ST_OK, NULL);
    Strata__Internal__V1__BackupFile f = STRATA__INTERNAL__V1__BACKUP_FILE__INIT;
    f.name = "x.sst";
    f.size = sizeof data;
    f.crc32c = st_crc32c(0, data, sizeof data) ^ 1;
    Strata__Internal__V1__BackupFile *fv[] = {&f};
    pb_piece p = STRATA__INTERNAL__V1__BACKUP_PIECE__INIT;
    p.backup = B3;
    p.piece = "w";
    p.table_name = INST "/tables/t";
    p.files = fv;
    p.n_files = 1;
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece wrong CRC", rc, &st, ST_DATA_LOSS, "x.sst");
    f.crc32c ^= 1;
    f.size = 99;
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece wrong size", rc, &st, ST_DATA_LOSS, "x.sst");
    f.size = sizeof data;
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece right size and CRC", rc, &st, ST_OK, NULL);
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece again (idempotent)", rc, &st, ST_OK, NULL);
    /* Nothing written: a piece that lists a file is refused, one that lists none (an empty
     * tablet's) is sealed empty, also when retried. */
    p.piece = "nothing";
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece of a listed file never written", rc, &st, ST_FAILED_PRECONDITION,
                "was written");
    p.n_files = 0;
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece of a piece of no file", rc, &st, ST_OK, NULL);
    rc = unary(1, "SealBackupPiece", &p.base, NULL, &st);
    expect_code("SealBackupPiece of a piece of no file again", rc, &st, ST_OK, NULL);
    pb_piece *empty = list_piece(1, B3, "nothing");
    CHECK(empty && empty->n_files == 0, "the piece of no file is not listed sealed and empty");
    strata__internal__v1__backup_piece__free_unpacked(empty, NULL);
    p.piece = "w";
    p.n_files = 1;
    c.data = (ProtobufCBinaryData){sizeof data, data};
    c.file = "x.sst";
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile into a sealed piece", rc, &st, ST_ALREADY_EXISTS, NULL);
    char path[BT_PATH_MAX + 64];
    struct stat sb;
    snprintf(path, sizeof path, "%s/backups/i/c1/b3/w/extra.sst", g_data[1]);
    CHECK(stat(path, &sb) != 0, "the sealed piece kept a file its manifest does not list");
    c.piece = "u"; /* an import never sealed: DeleteBackupPieces removes it too */
    c.offset = 0;
    rc = unary(1, "WriteBackupFile", &c.base, NULL, &st);
    expect_code("WriteBackupFile of an import left unsealed", rc, &st, ST_OK, NULL);
    Strata__Internal__V1__DeleteBackupPiecesRequest d =
        STRATA__INTERNAL__V1__DELETE_BACKUP_PIECES_REQUEST__INIT;
    d.backup = B3;
    rc = unary(1, "DeleteBackupPieces", &d.base, NULL, &st);
    expect_code("DeleteBackupPieces", rc, &st, ST_OK, NULL);
    pb_piece *gone = list_piece(1, B3, "w");
    CHECK(!gone, "piece w still listed after DeleteBackupPieces");
    snprintf(path, sizeof path, "%s/backups/i/c1/b3", g_data[1]);
    CHECK(stat(path, &sb) != 0, "the backup's directory is left after DeleteBackupPieces");
    strata__internal__v1__backup_piece__free_unpacked(gone, NULL);
}

static bool has_dotted_leftover(const char *data) {
    char path[BT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/backups/i/c1/b1", data);
    DIR *d = opendir(path);
    bool found = false;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strchr(e->d_name, '.'))
            found = true;
    if (d)
        closedir(d);
    return found;
}

typedef struct bg_backup {
    uint64_t id;
    st_code rc;
} bg_backup;

static void *bg_backup_run(void *arg) {
    bg_backup *b = arg;
    st_err st = {0};
    b->rc = backup_tablet(0, b->id, B1, "kill", NULL, &st);
    return NULL;
}

/* Values big enough that the freeze's flush takes a while: the kill lands inside it. */
static void write_big(const char *table) {
    bt_muts m;
    bt_muts_init(&m);
    size_t len = (size_t)1 << 20;
    char *val = malloc(len);
    for (size_t i = 0; i < len; i++)
        val[i] = (char)('a' + (i * 7919) % 26);
    for (int r = 0; r < 24; r++) {
        char row[32];
        snprintf(row, sizeof row, "big%02d", r);
        val[0] = (char)('A' + r);
        bt_muts_reset(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("q"), 1000000, st_slice_make((uint8_t *)val, len));
        st_err st = {0};
        CHECK(bt_mutate_row(&g_c[0], table, st_slice_cstr(row), &m, &st) == ST_OK, "big: %s",
              st.msg);
    }
    free(val);
    bt_muts_deinit(&m);
}

/* kill -9 once the backup's unsealed directory exists (the freeze is under way); after the
 * restart the piece is whole (every listed file readable) or absent, and no unsealed directory
 * is left. A leftover made by hand goes too, and so does an empty backup directory. */
static void test_kill(const char *table) {
    write_big(table);
    uint64_t id = first_tablet(0, table);
    char tmp[BT_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/backups/i/c1/b1/kill.tmp", g_data[0]);
    pthread_t th;
    bg_backup b = {id, ST_UNKNOWN};
    pthread_create(&th, NULL, bg_backup_run, &b);
    struct stat sb;
    for (int i = 0; i < 200000 && stat(tmp, &sb) != 0; i++) /* hang guard, not a timing check */
        usleep(50);
    bool mid = stat(tmp, &sb) == 0;
    bt_proc_stop(&g_node[0], SIGKILL, NULL);
    pthread_join(th, NULL);
    char junk[BT_PATH_MAX + 64];
    snprintf(junk, sizeof junk, "%s/backups/i/c1/b1/half.in", g_data[0]);
    mkdir(junk, 0700);
    char empty[BT_PATH_MAX + 64]; /* a failed restore's directory, left empty */
    snprintf(empty, sizeof empty, "%s/backups/i/c1/restore-7", g_data[0]);
    mkdir(empty, 0700);
    node_start(0);
    CHECK(!has_dotted_leftover(g_data[0]), "an unsealed piece directory survived the restart");
    CHECK(stat(empty, &sb) != 0, "an empty backup directory survived the restart");
    pb_piece *p = list_piece(0, B1, "kill");
    printf("%-58s %s%s\n", "piece after kill -9 during BackupTablet", p ? "whole" : "absent",
           mid ? " (killed mid-freeze)" : "");
    for (size_t i = 0; p && i < p->n_files; i++) {
        st_err st = {0};
        st_code rc = read_file(0, B1, "kill", p->files[i]->name, NULL, NULL, &st);
        CHECK(rc == ST_OK, "file %s of the surviving piece: %s", p->files[i]->name, st.msg);
    }
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    /* the tablet itself is intact and can be frozen again */
    p = NULL;
    st_err st = {0};
    st_code rc = backup_tablet(0, first_tablet(0, table), B1, "after", &p, &st);
    expect_code("BackupTablet after the restart", rc, &st, ST_OK, NULL);
    /* its CRCs (some from the cache of files other pieces hold) pass a seal's check */
    rc = p ? export_import(0, 1, p, &st) : ST_INTERNAL;
    expect_code("its copy to node 2 (the seal checks every CRC32C)", rc, &st, ST_OK, NULL);
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
}

/* The node's log from byte off: malloc'd, NUL-terminated (NULL when unreadable). */
static char *log_from(int node, long off) {
    char path[BT_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.log", g_data[node]);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    char *s = calloc(1, (size_t)(end > off ? end - off : 0) + 1);
    fseek(f, off, SEEK_SET);
    if (s && end > off && fread(s, 1, (size_t)(end - off), f) != (size_t)(end - off))
        s[0] = '\0';
    fclose(f);
    return s;
}

/* The value of key=N on the first log line from off holding every needle; -1 when none. */
static long long log_value(int node, long off, const char *n1, const char *n2, const char *key) {
    char *s = log_from(node, off);
    long long v = -1;
    for (char *line = s; line && *line && v < 0;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *k = strstr(line, key);
        if (strstr(line, n1) && (!n2 || strstr(line, n2)) && k)
            v = strtoll(k + strlen(key), NULL, 10);
        line = nl ? nl + 1 : line + strlen(line);
    }
    free(s);
    return v;
}

/* ---- shared files: sent once, linked into the other pieces (WriteBackupFile link_piece) ---- */

#define LINK_BYTES ((size_t)(2u << 20) + 12345) /* three chunks */

static uint8_t *link_data(unsigned seed) {
    uint8_t *d = malloc(LINK_BYTES);
    if (d)
        sst_fill(d, LINK_BYTES, seed);
    return d;
}

static st_code put_file(int node, const char *backup, const char *piece, const char *file,
                        const uint8_t *d, size_t len, st_err *st) {
    st_code rc = ST_OK;
    for (size_t off = 0; rc == ST_OK && (off < len || off == 0);) {
        Strata__Internal__V1__BackupFileChunk c = STRATA__INTERNAL__V1__BACKUP_FILE_CHUNK__INIT;
        size_t n = len - off < (1u << 20) ? len - off : (1u << 20);
        c.backup = (char *)backup;
        c.piece = (char *)piece;
        c.file = (char *)file;
        c.offset = off;
        c.data = (ProtobufCBinaryData){n, (uint8_t *)d + off};
        rc = unary(node, "WriteBackupFile", &c.base, NULL, st);
        off += n;
        if (n == 0)
            break;
    }
    return rc;
}

static st_code link_one(int node, const char *backup, const char *piece, const char *file,
                        const char *from_piece, uint64_t size, uint32_t crc, st_err *st) {
    Strata__Internal__V1__BackupFileChunk c = STRATA__INTERNAL__V1__BACKUP_FILE_CHUNK__INIT;
    c.backup = (char *)backup;
    c.piece = (char *)piece;
    c.file = (char *)file;
    c.link_piece = (char *)from_piece;
    c.link_file = (char *)file;
    c.link_size = size;
    c.link_crc32c = crc;
    return unary(node, "WriteBackupFile", &c.base, NULL, st);
}

static st_code seal_one(int node, const char *backup, const char *piece, const char *file,
                        uint64_t size, uint32_t crc, st_err *st) {
    Strata__Internal__V1__BackupFile f = STRATA__INTERNAL__V1__BACKUP_FILE__INIT;
    f.name = (char *)file;
    f.size = size;
    f.crc32c = crc;
    Strata__Internal__V1__BackupFile *fv[] = {&f};
    pb_piece p = STRATA__INTERNAL__V1__BACKUP_PIECE__INIT;
    p.backup = (char *)backup;
    p.piece = (char *)piece;
    p.table_name = INST "/tables/t";
    p.files = fv;
    p.n_files = 1;
    return unary(node, "SealBackupPiece", &p.base, NULL, st);
}

static uint64_t inode_of(int node, const char *piece, const char *file) {
    char path[BT_PATH_MAX + 128];
    struct stat sb;
    snprintf(path, sizeof path, "%s/backups/i/c1/b4/%s/%s", g_data[node], piece, file);
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* A file received in chunks is checksummed on its way in: its seal reads nothing back. A link
 * with the right size and CRC32C shares the inode; a wrong CRC, a missing source or a bad name
 * is refused and leaves nothing. A file restarted at offset 0 after another piece linked it
 * leaves the linked bytes alone. Node 1, backup b4. */
static void test_links(void) {
    st_err st = {0};
    uint8_t *a = link_data(1), *b = link_data(2);
    uint32_t ca = st_crc32c(0, a, LINK_BYTES), cb = st_crc32c(0, b, LINK_BYTES);
    long off = 0;
    char *log = log_from(1, 0);
    off = log ? (long)strlen(log) : 0;
    free(log);
    st_code rc = put_file(1, B4, "l0", "s.sst", a, LINK_BYTES, &st);
    expect_code("WriteBackupFile of a shared file (3 chunks)", rc, &st, ST_OK, NULL);
    rc = link_one(1, B4, "l1", "s.sst", "l0", LINK_BYTES, ca ^ 1, &st);
    expect_code("link with a wrong CRC32C", rc, &st, ST_DATA_LOSS, "s.sst");
    CHECK(inode_of(1, "l1.in", "s.sst") == 0, "a refused link left a file");
    rc = link_one(1, B4, "l1", "s.sst", "nope", LINK_BYTES, ca, &st);
    expect_code("link from a piece that is not here", rc, &st, ST_FAILED_PRECONDITION, NULL);
    rc = link_one(1, B4, "l1", "s.sst", "../l0", LINK_BYTES, ca, &st);
    expect_code("link from piece ../l0", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = link_one(1, B4, "l1", "s.sst", "l0", LINK_BYTES, ca, &st);
    expect_code("link from a piece being imported", rc, &st, ST_OK, NULL);
    /* the background checksum pass (once a second) runs meanwhile: it must not forget the CRC
     * of a file that is not in the SSTable directory it lists */
    usleep(2500 * 1000);
    rc = seal_one(1, B4, "l0", "s.sst", LINK_BYTES, ca, &st);
    expect_code("SealBackupPiece of the sent file", rc, &st, ST_OK, NULL);
    long long rb = log_value(1, off, "event=piece_sealed", "piece=l0 ", "read_back_files=");
    printf("%-58s %lld\n", "files its seal read back", rb);
    CHECK(rb == 0, "the seal read back %lld files checksummed on their way in", rb);
    rc = link_one(1, B4, "l2", "s.sst", "l0", LINK_BYTES, ca, &st);
    expect_code("link from a sealed piece", rc, &st, ST_OK, NULL);
    rc = seal_one(1, B4, "l1", "s.sst", LINK_BYTES, ca, &st);
    expect_code("SealBackupPiece of a linked file", rc, &st, ST_OK, NULL);
    CHECK(inode_of(1, "l0", "s.sst") && inode_of(1, "l0", "s.sst") == inode_of(1, "l1", "s.sst"),
          "the linked file is not the sent one");
    /* l3 gets t.sst, l4 links it, then l3 starts t.sst again with other bytes */
    rc = put_file(1, B4, "l3", "t.sst", a, LINK_BYTES, &st);
    if (rc == ST_OK)
        rc = link_one(1, B4, "l4", "t.sst", "l3", LINK_BYTES, ca, &st);
    if (rc == ST_OK)
        rc = put_file(1, B4, "l3", "t.sst", b, LINK_BYTES, &st);
    expect_code("restart a file another piece linked", rc, &st, ST_OK, NULL);
    rc = seal_one(1, B4, "l4", "t.sst", LINK_BYTES, ca, &st);
    expect_code("the linked copy keeps its bytes", rc, &st, ST_OK, NULL);
    rc = seal_one(1, B4, "l3", "t.sst", LINK_BYTES, cb, &st);
    expect_code("the restarted file has the new bytes", rc, &st, ST_OK, NULL);
    free(a);
    free(b);
}

/* Chunk i of 5 (the last one short) of d at its offset with any_order: the first one alone. */
#define ANY_CHUNK ((size_t)1 << 19)
#define ANY_BYTES (4 * ANY_CHUNK + 777)

static st_code put_chunk(const char *piece, const uint8_t *d, size_t i, st_err *st) {
    Strata__Internal__V1__BackupFileChunk c = STRATA__INTERNAL__V1__BACKUP_FILE_CHUNK__INIT;
    size_t off = i * ANY_CHUNK, n = ANY_BYTES - off < ANY_CHUNK ? ANY_BYTES - off : ANY_CHUNK;
    c.backup = B4;
    c.piece = (char *)piece;
    c.file = "o.sst";
    c.offset = off;
    c.any_order = off > 0;
    c.data = (ProtobufCBinaryData){n, (uint8_t *)d + off};
    return unary(1, "WriteBackupFile", &c.base, NULL, st);
}

/* Sends o.sst of piece `piece` in the chunk order given (first must be 0), then seals it with
 * the CRC32C of want; the seal's read_back_files in *read_back. */
static st_code put_any_order(const char *piece, const uint8_t *d, const size_t *order, size_t n,
                             uint32_t want, long long *read_back, st_err *st) {
    char *log = log_from(1, 0);
    long off = log ? (long)strlen(log) : 0;
    free(log);
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < n; i++)
        rc = put_chunk(piece, d, order[i], st);
    if (rc == ST_OK)
        rc = seal_one(1, B4, piece, "o.sst", ANY_BYTES, want, st);
    char n2[64];
    snprintf(n2, sizeof n2, "piece=%s ", piece);
    *read_back = log_value(1, off, "event=piece_sealed", n2, "read_back_files=");
    return rc;
}

/* Chunks that arrive out of order (any_order, as a pipelined import sends them) are checksummed
 * by range and their CRC32Cs combined: the seal reads nothing back, and still refuses a file
 * with a damaged chunk, naming it. A chunk written twice (a retry) makes the seal read the file
 * back, which then passes. Node 1, backup b4. */
static void test_any_order(void) {
    st_err st = {0};
    uint8_t *d = malloc(ANY_BYTES), *bad = malloc(ANY_BYTES);
    sst_fill(d, ANY_BYTES, 7);
    memcpy(bad, d, ANY_BYTES);
    bad[3 * ANY_CHUNK + 5] ^= 0x10;
    uint32_t crc = st_crc32c(0, d, ANY_BYTES);
    long long rb = -1;
    static const size_t reversed[] = {0, 4, 3, 2, 1}, holes[] = {0, 2, 4, 1, 3},
                        twice[] = {0, 2, 1, 2, 3, 4};
    st_code rc = put_any_order("o0", d, reversed, 5, crc, &rb, &st);
    expect_code("chunks 0 4 3 2 1 (any_order), then the seal", rc, &st, ST_OK, NULL);
    printf("%-58s %lld\n", "files its seal read back", rb);
    CHECK(rb == 0, "the seal read back %lld files whose chunks came out of order", rb);
    rc = put_any_order("o1", d, holes, 5, crc, &rb, &st);
    expect_code("chunks 0 2 4 1 3 (any_order), then the seal", rc, &st, ST_OK, NULL);
    CHECK(rb == 0, "the seal read back %lld files whose chunks came out of order", rb);
    rc = put_any_order("o2", bad, holes, 5, crc, &rb, &st);
    expect_code("the same with a byte of chunk 3 flipped", rc, &st, ST_DATA_LOSS, "o.sst");
    rc = put_any_order("o3", d, twice, 6, crc, &rb, &st);
    expect_code("chunk 2 written twice, then the seal", rc, &st, ST_OK, NULL);
    CHECK(rb == 1, "a file with a chunk written twice was sealed from ranges (read back %lld)", rb);
    free(d);
    free(bad);
}

/* kill -9 while a piece is being imported: after the restart the sealed pieces are whole, the
 * unsealed one is gone, and importing it again works. Runs after test_links (node 1, b4). */
static void test_import_kill(void) {
    st_err st = {0};
    uint8_t *a = link_data(1);
    uint32_t ca = st_crc32c(0, a, LINK_BYTES);
    st_code rc = put_file(1, B4, "k0", "s.sst", a, LINK_BYTES / 2, &st);
    if (rc == ST_OK)
        rc = link_one(1, B4, "k1", "s.sst", "l0", LINK_BYTES, ca, &st);
    expect_code("half an import, then kill -9", rc, &st, ST_OK, NULL);
    bt_proc_stop(&g_node[1], SIGKILL, NULL);
    node_start(1);
    char path[BT_PATH_MAX + 64];
    struct stat sb;
    snprintf(path, sizeof path, "%s/backups/i/c1/b4/k0.in", g_data[1]);
    CHECK(stat(path, &sb) != 0, "the half-imported piece survived kill -9");
    snprintf(path, sizeof path, "%s/backups/i/c1/b4/k1.in", g_data[1]);
    CHECK(stat(path, &sb) != 0, "the half-linked piece survived kill -9");
    pb_piece *p = list_piece(1, B4, "k0");
    CHECK(!p, "the half-imported piece is listed");
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    static const char *const sealed[] = {"l0", "l1", "l2"};
    for (size_t i = 0; i < 3; i++) {
        p = list_piece(1, B4, sealed[i]);
        if (i == 2) { /* l2 was linked, never sealed: gone */
            CHECK(!p, "unsealed piece l2 listed after kill -9");
            break;
        }
        CHECK(p && p->n_files == 1 && p->files[0]->crc32c == ca, "sealed piece %s after kill -9",
              sealed[i]);
        rc = p ? read_file(1, B4, sealed[i], "s.sst", NULL, NULL, &st) : ST_NOT_FOUND;
        CHECK(rc == ST_OK, "reading %s/s.sst after kill -9: %s", sealed[i], st.msg);
        if (p)
            strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    }
    rc = put_file(1, B4, "k0", "s.sst", a, LINK_BYTES, &st);
    if (rc == ST_OK)
        rc = seal_one(1, B4, "k0", "s.sst", LINK_BYTES, ca, &st);
    expect_code("the import again after the restart", rc, &st, ST_OK, NULL);
    free(a);
}

/* ---- a backup of many pieces deleted ---- */

#define MANY_PIECES 1000
#define B5 INST "/clusters/c1/backups/b5"
#define Q_B5 "projects/q/instances/i/clusters/c1/backups/b5" /* another project, same directory */

typedef struct caller {
    atomic_bool stop;
    int calls, failures;
    st_err last;
} caller;

/* Calls node 2 back to back until told to stop: every one must answer. */
static void *call_loop(void *arg) {
    caller *c = arg;
    while (!atomic_load(&c->stop)) {
        Strata__Internal__V1__ListBackupPiecesRequest req =
            STRATA__INTERNAL__V1__LIST_BACKUP_PIECES_REQUEST__INIT;
        req.backup = B1;
        st_err st = {0};
        if (unary(1, "ListBackupPieces", &req.base, NULL, &st) != ST_OK) {
            c->failures++;
            c->last = st;
        }
        c->calls++;
    }
    return NULL;
}

static long log_size(int node) {
    char path[BT_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.log", g_data[node]);
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

static int trash_entries(int node) {
    char path[BT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/backups/.trash", g_data[node]);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* DeleteBackupPieces of a backup of MANY_PIECES pieces answers once the backup's directory is
 * renamed into the trash; the files go on the reaper thread (its log line says so), while calls
 * to the node keep answering. A piece of another project that shares the directory stays. */
static void test_delete_many(void) {
    st_err st = {0};
    uint8_t data[512];
    sst_fill(data, sizeof data, 7);
    uint32_t crc = st_crc32c(0, data, sizeof data);
    st_code rc = ST_OK;
    for (int i = 0; rc == ST_OK && i < MANY_PIECES; i++) {
        char piece[16];
        snprintf(piece, sizeof piece, "m%05d", i);
        rc = put_file(1, B5, piece, "x.sst", data, sizeof data, &st);
        if (rc == ST_OK)
            rc = seal_one(1, B5, piece, "x.sst", sizeof data, crc, &st);
    }
    expect_code("1,000 pieces imported", rc, &st, ST_OK, NULL);
    /* a pull asks for its one piece: the node reads that piece's manifest, not the 1,000 */
    char first[64];
    long all = list_count(1, B5, "", first, sizeof first);
    long one = list_count(1, B5, "m00500", first, sizeof first);
    CHECK(all == MANY_PIECES, "ListBackupPieces of the backup: %ld pieces, want %d", all,
          MANY_PIECES);
    CHECK(one == 1 && strcmp(first, "m00500") == 0,
          "ListBackupPieces of piece m00500: %ld pieces (first %s), want that one", one, first);
    CHECK(list_count(1, B5, "nope", first, sizeof first) == 0, "an absent piece is listed");
    rc = put_file(1, Q_B5, "f1", "x.sst", data, sizeof data, &st);
    if (rc == ST_OK)
        rc = seal_one(1, Q_B5, "f1", "x.sst", sizeof data, crc, &st);
    expect_code("a piece of another project in the same directory", rc, &st, ST_OK, NULL);
    long off = log_size(1);
    caller c = {.calls = 0};
    pthread_t th;
    pthread_create(&th, NULL, call_loop, &c);
    Strata__Internal__V1__DeleteBackupPiecesRequest d =
        STRATA__INTERNAL__V1__DELETE_BACKUP_PIECES_REQUEST__INIT;
    d.backup = B5;
    rc = unary(1, "DeleteBackupPieces", &d.base, NULL, &st);
    expect_code("DeleteBackupPieces of 1,000 pieces", rc, &st, ST_OK, NULL);
    pb_piece *p = list_piece(1, B5, "m00000");
    CHECK(!p, "a piece is listed after DeleteBackupPieces answered");
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    long long pieces = -1;
    for (int i = 0; i < 600 && pieces < 0; i++) { /* hang guard, not a timing check */
        usleep(100000);
        pieces = log_value(1, off, "event=trash_removed", "@p pieces=", "pieces=");
    }
    atomic_store(&c.stop, true);
    pthread_join(th, NULL);
    printf("%-58s %lld pieces, %d calls meanwhile\n", "files removed by the reaper thread", pieces,
           c.calls);
    CHECK(pieces == MANY_PIECES + 1, "the reaper logged %lld pieces removed, want %d", pieces,
          MANY_PIECES + 1);
    CHECK(log_value(1, off, "event=trash_removed", "@p pieces=", " kept=") == 1,
          "the other project's piece was not kept");
    CHECK(c.calls > 0 && c.failures == 0, "%d of %d calls during the deletion failed: %s",
          c.failures, c.calls, c.last.msg);
    p = list_piece(1, Q_B5, "f1");
    CHECK(p && strcmp(p->backup, Q_B5) == 0, "the other project's piece is gone");
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    p = list_piece(1, B5, "m00001");
    CHECK(!p, "a deleted piece is back");
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    CHECK(trash_entries(1) == 0, "%d entries left in the trash", trash_entries(1));
}

/* What a crash left in the trash (made here by hand) is removed by the next start. */
static void trash_leftover(int node) {
    char path[BT_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/backups/.trash", g_data[node]);
    CHECK(mkdir(path, 0700) == 0 || errno == EEXIST, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/backups/.trash/0000000000000001-1@p", g_data[node]);
    CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/backups/.trash/0000000000000001-1@p/zz", g_data[node]);
    CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/backups/.trash/0000000000000001-1@p/zz/x.sst", g_data[node]);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs("x", f) >= 0, "writing %s", path);
    if (f)
        fclose(f);
}

static void trash_leftover_gone(int node) {
    int left = -1;
    for (int i = 0; i < 600 && left != 0; i++) { /* hang guard, not a timing check */
        left = trash_entries(node);
        if (left)
            usleep(100000);
    }
    printf("%-58s %s\n", "a crash's leftover in the trash removed at start", left ? "WRONG" : "ok");
    CHECK(left == 0, "%d entries left in the trash after a restart", left);
}

/* An SSTable that no piece holds at a restart (its only piece deleted) is checksummed by the
 * background pass; a freeze afterwards reads no file back, and its CRCs are right. Without the
 * pass the restarted node knows only the CRCs the pieces' manifests list: the freeze would
 * read the file. (Each start of the node begins its log anew.) */
static void test_background_crc(void) {
    st_err st = {0};
    CHECK(bt_create_table(&g_c[0], "bgc", "cf", &st) == ST_OK, "create bgc: %s", st.msg);
    write_rows(0, "bgc", 0, ROWS, "bg");
    uint64_t id = first_tablet(0, "bgc");
    st_code rc = backup_tablet(0, id, B4, "bgc", NULL, &st); /* flushes the memtable */
    expect_code("BackupTablet (flushes bgc)", rc, &st, ST_OK, NULL);
    Strata__Internal__V1__DeleteBackupPiecesRequest d =
        STRATA__INTERNAL__V1__DELETE_BACKUP_PIECES_REQUEST__INIT;
    d.backup = B4;
    rc = unary(0, "DeleteBackupPieces", &d.base, NULL, &st);
    expect_code("DeleteBackupPieces (no piece holds the file now)", rc, &st, ST_OK, NULL);
    node_stop(0);
    node_start(0);
    long off = 0;
    long long pending = -1;
    for (int i = 0; i < 600 && pending != 0; i++) { /* hang guard, not a timing check */
        usleep(100000);
        pending = log_value(0, off, "event=crc_background", "pending=0", "pending=");
    }
    CHECK(pending == 0, "no background checksum pass covered every SSTable after the restart");
    pb_piece *p = NULL;
    rc = backup_tablet(0, id, B1, "bgc", &p, &st);
    expect_code("BackupTablet after the background pass", rc, &st, ST_OK, NULL);
    long long files = log_value(0, off, "event=tablet_frozen", "piece=bgc ", "crc_read_files=");
    long long n = log_value(0, off, "event=tablet_frozen", "piece=bgc ", " files=");
    printf("%-58s %lld of %lld\n", "files the freeze read back for checksums", files, n);
    CHECK(n > 0 && files == 0, "the freeze read %lld of %lld files back", files, n);
    rc = p ? export_import(0, 1, p, &st) : ST_INTERNAL;
    expect_code("its copy to node 2 (the seal checks every CRC32C)", rc, &st, ST_OK, NULL);
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
}

#define B6 INST "/clusters/c1/backups/b6"
#define B7 INST "/clusters/c1/backups/b7"

static void piece_free(pb_piece *p) {
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
}

static st_code pull_of(const char *incarnation, pb_piece **out, st_err *st) {
    Strata__Internal__V1__PullBackupPieceRequest pull =
        STRATA__INTERNAL__V1__PULL_BACKUP_PIECE_REQUEST__INIT;
    pull.source = g_node[0].addr;
    pull.source_backup = B6;
    pull.piece = "q0";
    pull.backup = B7;
    pull.incarnation = (char *)incarnation;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(1, "PullBackupPiece", &pull.base, &resp, st);
    *out =
        rc == ST_OK ? strata__internal__v1__backup_piece__unpack(NULL, resp.len, resp.data) : NULL;
    st_buf_free(&resp);
    return rc;
}

/* A piece answers a call of its own making (or of none), never one of another making: that finds
 * a leftover of a deleted backup of the same id, which is replaced by a new freeze or pull
 * (docs/backups.md, "Pieces left behind"). A piece of no making is replaced too. */
static void test_incarnation(uint64_t id) {
    pb_piece *old = NULL, *a = NULL, *a2 = NULL, *b = NULL, *none = NULL, *pa = NULL, *pb = NULL;
    st_err st = {0};
    st_code rc = backup_tablet_of(0, id, B6, "q0", "", &old, &st);
    expect_code("BackupTablet of no making", rc, &st, ST_OK, NULL);
    rc = backup_tablet_of(0, id, B6, "q0", "op-a", &a, &st);
    expect_code("BackupTablet of making a over a piece of none", rc, &st, ST_OK, NULL);
    CHECK(old && a && a->frozen_us > old->frozen_us && strcmp(a->incarnation, "op-a") == 0,
          "making a got the piece of no making");
    rc = backup_tablet_of(0, id, B6, "q0", "op-a", &a2, &st);
    expect_code("BackupTablet of making a again", rc, &st, ST_OK, NULL);
    CHECK(a && a2 && a2->frozen_us == a->frozen_us, "the retry of making a froze anew");
    rc = backup_tablet_of(0, id, B6, "q0", "op-b", &b, &st);
    expect_code("BackupTablet of making b", rc, &st, ST_OK, NULL);
    CHECK(a && b && b->frozen_us > a->frozen_us && strcmp(b->incarnation, "op-b") == 0,
          "making b got making a's piece");
    rc = backup_tablet_of(0, id, B6, "q0", "", &none, &st);
    expect_code("BackupTablet of no making over making b's", rc, &st, ST_OK, NULL);
    CHECK(b && none && none->frozen_us == b->frozen_us, "a call of no making froze anew");
    rc = pull_of("op-x", &pa, &st);
    expect_code("PullBackupPiece of making x", rc, &st, ST_OK, NULL);
    CHECK(pa && strcmp(pa->incarnation, "op-x") == 0 && b && pa->frozen_us == b->frozen_us,
          "the pulled piece is not making x's copy of b's piece");
    piece_free(pa);
    rc = pull_of("op-x", &pa, &st);
    expect_code("PullBackupPiece of making x again", rc, &st, ST_OK, NULL);
    CHECK(pa && strcmp(pa->incarnation, "op-x") == 0, "the retried pull changed the piece");
    piece_free(old);
    rc = backup_tablet_of(0, id, B6, "q0", "op-c", &old, &st);
    expect_code("BackupTablet of making c", rc, &st, ST_OK, NULL);
    rc = pull_of("op-y", &pb, &st);
    expect_code("PullBackupPiece of making y over making x's", rc, &st, ST_OK, NULL);
    CHECK(pb && strcmp(pb->incarnation, "op-y") == 0 && old && pb->frozen_us == old->frozen_us,
          "making y got making x's pulled piece");
    /* a late delete of one making leaves another making's piece of the same id */
    Strata__Internal__V1__DeleteBackupPiecesRequest d =
        STRATA__INTERNAL__V1__DELETE_BACKUP_PIECES_REQUEST__INIT;
    d.backup = B6;
    d.incarnation = "op-a";
    rc = unary(0, "DeleteBackupPieces", &d.base, NULL, &st);
    expect_code("DeleteBackupPieces of making a", rc, &st, ST_OK, NULL);
    pb_piece *kept = list_piece(0, B6, "q0");
    CHECK(kept, "the delete of making a removed making c's piece");
    piece_free(kept);
    d.incarnation = "op-c";
    rc = unary(0, "DeleteBackupPieces", &d.base, NULL, &st);
    expect_code("DeleteBackupPieces of making c", rc, &st, ST_OK, NULL);
    kept = list_piece(0, B6, "q0");
    CHECK(!kept, "the delete of making c left its piece");
    piece_free(kept);
    pb_piece *all[] = {old, a, a2, b, none, pa, pb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        piece_free(all[i]);
}

int main(int argc, char **argv) {
    if (argc < 2 || access(argv[1], X_OK) != 0) {
        printf("SKIP: usage: backup_node_test PATH/TO/strata-node\n");
        return 77;
    }
    g_bin = argv[1];
    bt_tmpdir(g_dir, sizeof g_dir, "backup_node");
    snprintf(g_data[0], sizeof g_data[0], "%s/a", g_dir);
    snprintf(g_data[1], sizeof g_data[1], "%s/b", g_dir);
    node_start(0);
    node_start(1);
    st_err st = {0};
    CHECK(bt_create_table(&g_c[0], "src", "cf", &st) == ST_OK, "create: %s", st.msg);
    write_rows(0, "src", 0, ROWS, "v1");
    uint64_t id = first_tablet(0, "src");
    st_buf frozen, now;
    st_buf_init(&frozen);
    st_buf_init(&now);
    dump(0, "src", &frozen);

    pb_piece *p = NULL, *again = NULL;
    st_code rc = backup_tablet(0, id, B1, "p0", &p, &st);
    expect_code("BackupTablet", rc, &st, ST_OK, NULL);
    CHECK(p && p->n_files > 0 && p->size_bytes > 0 && p->frozen_us > 0, "piece without files");
    rc = backup_tablet(0, id, B1, "p0", &again, &st);
    expect_code("BackupTablet again (idempotent)", rc, &st, ST_OK, NULL);
    CHECK(again && p && again->n_files == p->n_files && again->frozen_us == p->frozen_us,
          "the retried BackupTablet made another piece");

    /* writes after the freeze: not in the piece */
    write_rows(0, "src", 0, 10, "v2");
    write_rows(0, "src", ROWS, ROWS + 20, "v2");
    rc = restore(0, "restored", B1, "p0", &st);
    expect_code("CreateTablet restoring the piece", rc, &st, ST_OK, NULL);
    dump(0, "restored", &now);
    CHECK(now.len == frozen.len && memcmp(now.data, frozen.data, now.len) == 0,
          "restored rows differ from the frozen ones (%zu vs %zu bytes)", now.len, frozen.len);
    write_rows(0, "restored", 0, 1, "after"); /* the restored table takes writes */

    test_hostile(id);
    check_modes(0, "p0");

    /* export / import to node 1, restore there */
    rc = p ? export_import(0, 1, p, &st) : ST_INTERNAL;
    expect_code("Read/WriteBackupFile + SealBackupPiece to node 2", rc, &st, ST_OK, NULL);
    check_modes(1, "p0");
    rc = restore(1, "imported", B1, "p0", &st);
    expect_code("CreateTablet restoring the imported piece", rc, &st, ST_OK, NULL);
    dump(1, "imported", &now);
    CHECK(now.len == frozen.len && memcmp(now.data, frozen.data, now.len) == 0,
          "imported rows differ from the frozen ones");

    /* PullBackupPiece under another name */
    Strata__Internal__V1__PullBackupPieceRequest pull =
        STRATA__INTERNAL__V1__PULL_BACKUP_PIECE_REQUEST__INIT;
    pull.source = g_node[0].addr;
    pull.source_backup = B1;
    pull.piece = "p0";
    pull.backup = B2;
    rc = unary(1, "PullBackupPiece", &pull.base, NULL, &st);
    expect_code("PullBackupPiece", rc, &st, ST_OK, NULL);
    rc = unary(1, "PullBackupPiece", &pull.base, NULL, &st);
    expect_code("PullBackupPiece again (idempotent)", rc, &st, ST_OK, NULL);
    pull.piece = "nope";
    rc = unary(1, "PullBackupPiece", &pull.base, NULL, &st);
    expect_code("PullBackupPiece of a missing piece", rc, &st, ST_NOT_FOUND, NULL);
    pull.piece = "p0";
    pull.backup = B3;
    char dead[64];
    snprintf(dead, sizeof dead, "127.0.0.1:%u", (unsigned)bt_free_port());
    pull.source = dead;
    rc = unary(1, "PullBackupPiece", &pull.base, NULL, &st);
    expect_code("PullBackupPiece from a node that is down", rc, &st, ST_UNAVAILABLE, NULL);
    pull.source = "no-port";
    rc = unary(1, "PullBackupPiece", &pull.base, NULL, &st);
    expect_code("PullBackupPiece from a bad address", rc, &st, ST_INVALID_ARGUMENT, NULL);
    rc = restore(1, "pulled", B2, "p0", &st);
    expect_code("CreateTablet restoring the pulled piece", rc, &st, ST_OK, NULL);
    dump(1, "pulled", &now);
    CHECK(now.len == frozen.len && memcmp(now.data, frozen.data, now.len) == 0,
          "pulled rows differ from the frozen ones");

    test_incarnation(id);
    test_write_rules();
    test_links();
    test_any_order();
    test_import_kill();
    test_delete_many();

    /* a restart keeps the restored table, and empties the trash */
    trash_leftover(1);
    node_stop(1);
    node_start(1);
    trash_leftover_gone(1);
    dump(1, "pulled", &now);
    CHECK(now.len == frozen.len && memcmp(now.data, frozen.data, now.len) == 0,
          "pulled rows differ after a restart");

    test_kill("src");
    test_background_crc();

    node_stop(0);
    node_stop(1);
    if (p)
        strata__internal__v1__backup_piece__free_unpacked(p, NULL);
    if (again)
        strata__internal__v1__backup_piece__free_unpacked(again, NULL);
    st_buf_free(&frozen);
    st_buf_free(&now);
    if (g_failures == 0)
        bt_rmrf(g_dir);
    printf("%s (%d failures)\n", g_failures ? "FAILED" : "PASSED", g_failures);
    return g_failures ? 1 : 0;
}
