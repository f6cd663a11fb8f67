/* backup_xfer.c — moving pieces between nodes and directories (docs/backups.md, "On a node"):
 * ReadBackupFile streams a file of a sealed piece; WriteBackupFile and SealBackupPiece assemble a
 * piece in <piece>.in and seal it (sizes and CRC32C checked on a worker thread, then the
 * manifest, then the rename into place); PullBackupPiece does both against another node.
 * Every name is checked (backup_store.c) before it becomes a path; a file is readable only when
 * the sealed piece's manifest lists it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sync_file_range */
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

#include <event2/event.h>

#include "strata/btutil.h"

/* A chunk written may carry this much more than a read sends (a writer's own chunking). */
#define BK_WRITE_CHUNK_MAX (NODE_BK_CHUNK_BYTES + ((size_t)64 << 10))
#define BK_PULL_MESSAGE_MAX (BK_WRITE_CHUNK_MAX + ((size_t)64 << 10))
#define BK_PULL_LIST_MAX ((size_t)64 << 20) /* the source's ListBackupPieces answer */
#define BK_HOST_MAX 256
#define NODE_SVC "/strata.internal.v1.Node/"

/* ---- ReadBackupFile ---- */

typedef struct rd_state {
    rpc_call *call;
    int fd;
    uint64_t off, size;
    /* A read of the whole file checks it on the way (crc, of the bytes sent so far) against its
     * manifest entry (want_crc) before the last chunk goes: a pull or an export of a damaged
     * file then fails naming this backup's file, not the copy. */
    bool whole;
    uint32_t crc, want_crc, node_num;
    char backup[sizeof(((bk_name *)0)->full)];
    char piece[NODE_BK_NAME_MAX + 1], file[NODE_BK_NAME_MAX + 8];
    st_buf msg; /* RPC_SEND_HEADROOM bytes, then the chunk packed in place */
} rd_state;

static void rd_free(rd_state *s) {
    if (s->fd >= 0)
        close(s->fd);
    st_buf_free(&s->msg);
    free(s);
}

static void rd_cancel(rpc_call *call, void *arg) {
    rpc_call_finish(call, ST_CANCELLED, "cancelled");
    rd_free(arg);
}

/* want bytes of the file at off straight into p; false (errno set, or 0 at an early end) when
 * they are not all there. */
static bool rd_pread_all(int fd, uint8_t *p, size_t want, uint64_t off) {
    while (want > 0) {
        ssize_t got = pread(fd, p, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return false;
        }
        p += got;
        want -= (size_t)got;
        off += (uint64_t)got;
    }
    return true;
}

/* The chunk at s->off packed into s->msg after RPC_SEND_HEADROOM bytes: the other fields, then
 * field 5 (data) with the file's bytes read straight into the message, so neither this side nor
 * the RPC layer (rpc_call_send_buf) copies them. */
static st_code rd_pack(rd_state *s, size_t want) {
    Strata__Internal__V1__BackupFileChunk c;
    strata__internal__v1__backup_file_chunk__init(&c);
    c.backup = s->backup;
    c.piece = s->piece;
    c.file = s->file;
    c.offset = s->off;
    size_t head = protobuf_c_message_get_packed_size(&c.base);
    st_buf_reset(&s->msg);
    if (st_buf_reserve(&s->msg, RPC_SEND_HEADROOM + head + 11 + want) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    uint8_t *p = s->msg.data + RPC_SEND_HEADROOM;
    size_t len = protobuf_c_message_pack(&c.base, p);
    p[len++] = 5 << 3 | 2; /* field 5, length-delimited */
    for (uint64_t v = want;; v >>= 7) {
        p[len++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
        if (v <= 0x7f)
            break;
    }
    if (!rd_pread_all(s->fd, p + len, want, s->off))
        return errno ? ST_INTERNAL : ST_DATA_LOSS;
    if (s->whole)
        s->crc = st_crc32c(s->crc, p + len, want);
    s->msg.len = RPC_SEND_HEADROOM + len + want;
    return ST_OK;
}

/* The whole file was read and its CRC32C is not its manifest's: the stream ends DATA_LOSS. */
static bool rd_damaged(const rd_state *s, size_t want) {
    return s->whole && s->off + want == s->size && s->crc != s->want_crc;
}

/* Sends one chunk at s->off; false when the stream ended (finished). */
static bool rd_send_one(rd_state *s) {
    size_t want =
        s->size - s->off < NODE_BK_CHUNK_BYTES ? (size_t)(s->size - s->off) : NODE_BK_CHUNK_BYTES;
    st_code rc = rd_pack(s, want);
    if (rc != ST_OK) {
        char msg[200];
        if (rc == ST_RESOURCE_EXHAUSTED)
            snprintf(msg, sizeof msg, "out of memory sending a backup file");
        else
            snprintf(msg, sizeof msg, "reading %s of piece %s at %" PRIu64 ": %s", s->file,
                     s->piece, s->off,
                     rc == ST_INTERNAL ? strerror(errno) : "file shorter than when opened");
        rpc_call_finish(s->call, rc, msg);
        rd_free(s);
        return false;
    }
    if (rd_damaged(s, want)) {
        char msg[ST_ERR_MSG_MAX + sizeof s->file];
        snprintf(
            msg, sizeof msg,
            "file %s has CRC32C %08x on node %u, its manifest says %08x: the source backup's file "
            "is damaged, not the copy; use another backup, or a copy of it in another cluster "
            "or an export",
            s->file, s->crc, s->node_num, s->want_crc);
        st_log(ST_LOG_WARN, "backup", "event=backup_file_damaged reason=\"%s\"", msg);
        rpc_call_finish(s->call, ST_DATA_LOSS, msg);
        rd_free(s);
        return false;
    }
    if (rpc_call_send_buf(s->call, &s->msg) != ST_OK) {
        rpc_call_finish(s->call, ST_CANCELLED, "the call ended");
        rd_free(s);
        return false;
    }
    s->off += (uint64_t)want;
    return true;
}

/* One chunk at a time, each once the call's queue is empty (the writable callback says so): the
 * RPC layer then takes the packed chunk as its queue instead of copying it behind queued ones
 * (rpc_call_send_buf). The connection still carries several files' chunks at once. */
static void rd_writable(rpc_call *call, void *arg) {
    rd_state *s = arg;
    if (s->off < s->size && rpc_call_writable(call) && rpc_call_queued_bytes(call) == 0 &&
        !rd_send_one(s))
        return;
    if (s->off >= s->size) {
        rpc_call_finish(call, ST_OK, NULL);
        rd_free(s);
    }
}

/* Opens the listed file of a sealed piece for reading: NOT_FOUND unless listed. */
static st_code rd_open(node_ctx *n, rpc_call *call,
                       const Strata__Internal__V1__ReadBackupFileRequest *req, rd_state *s,
                       st_err *err) {
    bk_name b;
    st_code rc = bk_name_parse(req->backup, &b, err);
    if (rc == ST_OK)
        rc = bk_piece_check(req->piece, err);
    if (rc == ST_OK)
        rc = bk_file_check(req->file, err);
    bk_piece *p = NULL;
    if (rc == ST_OK)
        rc = bk_piece_load(n, &b, req->piece, rpc_call_arena(call), &p, err);
    const Strata__Internal__V1__BackupFile *f = rc == ST_OK ? bk_piece_file(p, req->file) : NULL;
    if (rc == ST_OK && !f)
        rc = st_err_set(err, ST_NOT_FOUND, "piece %s of backup %s has no file %s", req->piece,
                        req->backup, req->file);
    if (rc != ST_OK)
        return rc;
    char path[NODE_BK_PATH_MAX];
    bk_piece_dir(n, &b, req->piece, "", path, sizeof path);
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/%s", req->file);
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0)
        return st_err_set(err, ST_DATA_LOSS, "file %s of the piece is missing: %s", path,
                          strerror(errno));
    struct stat sb;
    s->size = fstat(s->fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    if (s->size != f->size)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s holds %" PRIu64 " bytes, its piece manifest says %" PRIu64, path,
                          s->size, f->size);
    if (req->offset > s->size)
        return st_err_set(err, ST_OUT_OF_RANGE,
                          "offset %" PRIu64 " is past the end of %s (%" PRIu64 " bytes)",
                          req->offset, req->file, s->size);
    s->off = req->offset;
    s->whole = req->offset == 0;
    s->want_crc = f->crc32c;
    s->node_num = n->opts.node_num;
    snprintf(s->backup, sizeof s->backup, "%s", req->backup);
    snprintf(s->piece, sizeof s->piece, "%s", req->piece);
    snprintf(s->file, sizeof s->file, "%s", req->file);
    return ST_OK;
}

void node_h_read_backup_file(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__ReadBackupFileRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__read_backup_file_request__descriptor, req_bytes);
    if (!req)
        return;
    rd_state *s = calloc(1, sizeof *s);
    if (!s) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory reading a backup file");
        return;
    }
    s->fd = -1;
    s->call = call;
    st_buf_init(&s->msg);
    st_err err = {0};
    st_code rc =
        bk_grant_check(n, call, "ReadBackupFile", req->backup, req->piece, req->ticket, &err);
    if (rc == ST_OK)
        rc = rd_open(n, call, req, s, &err);
    if (rc != ST_OK) {
        rd_free(s);
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    rpc_call_set_cancel_cb(call, rd_cancel, s);
    rpc_call_set_writable_cb(call, rd_writable, s);
}

/* ---- WriteBackupFile ---- */

st_code bk_write_chunk(node_backups *b, const char *dir, const char *file, uint64_t off,
                       st_slice data, st_err *err) {
    char path[NODE_BK_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    /* A restart is a new inode: a piece that linked the old file keeps its bytes. */
    if (off == 0 && unlink(path) != 0 && errno != ENOENT)
        return st_err_set(err, ST_INTERNAL, "removing %s: %s", path, strerror(errno));
    int fd = open(path, O_WRONLY | O_CLOEXEC | (off == 0 ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0 && errno == ENOENT)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "file %s was not started: send its chunk at offset 0 first", file);
    if (fd < 0)
        return st_err_set(err, ST_INTERNAL, "opening %s: %s", path, strerror(errno));
    struct stat sb, after;
    st_code rc = ST_OK;
    if (fstat(fd, &sb) != 0)
        rc = st_err_set(err, ST_INTERNAL, "looking at %s: %s", path, strerror(errno));
    else if ((uint64_t)sb.st_size != off)
        rc = st_err_set(err, ST_FAILED_PRECONDITION,
                        "chunk of %s at offset %" PRIu64 " is out of order: the file holds %" PRIu64
                        " bytes; send the chunk at that offset (or 0 to start the file again)",
                        file, off, (uint64_t)sb.st_size);
    size_t done = 0;
    while (rc == ST_OK && done < data.len) {
        ssize_t w = pwrite(fd, data.data + done, data.len - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            rc = st_err_set(err, errno == ENOSPC ? ST_RESOURCE_EXHAUSTED : ST_INTERNAL,
                            "writing %s: %s", path, strerror(errno));
        else
            done += (size_t)w;
    }
    if (rc == ST_OK && fstat(fd, &after) == 0) {
        bk_crc_write(b, &sb, &after, off, data);
        /* writeback starts now: the seal's fsync then finds little left to write */
        if (data.len)
            (void)sync_file_range(fd, (off_t)off, (off_t)data.len, SYNC_FILE_RANGE_WRITE);
    }
    close(fd);
    return rc;
}

/* A chunk with any_order: written at its offset into the file its offset-0 chunk started, in
 * whatever order the chunks come (a client keeps several in flight). Its CRC32C is recorded by
 * range (bk_crc_write): once the ranges join up the file's CRC32C is known and the seal reads
 * nothing back. */
static st_code write_any_order(node_backups *b, const char *dir, const char *file, uint64_t off,
                               st_slice data, st_err *err) {
    char path[NODE_BK_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (off == 0 || data.len == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "an any_order chunk of %s has offset 0 or no bytes: send the chunk at "
                          "offset 0 in order first",
                          file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return st_err_set(err, errno == ENOENT ? ST_FAILED_PRECONDITION : ST_INTERNAL,
                          "opening %s: %s (send its chunk at offset 0 first)", path,
                          strerror(errno));
    struct stat sb, after;
    st_code rc = ST_OK;
    if (fstat(fd, &sb) != 0)
        rc = st_err_set(err, ST_INTERNAL, "looking at %s: %s", path, strerror(errno));
    for (size_t done = 0; rc == ST_OK && done < data.len;) {
        ssize_t w = pwrite(fd, data.data + done, data.len - done, (off_t)(off + done));
        if (w < 0 && errno != EINTR)
            rc = st_err_set(err, errno == ENOSPC ? ST_RESOURCE_EXHAUSTED : ST_INTERNAL,
                            "writing %s: %s", path, strerror(errno));
        else if (w > 0)
            done += (size_t)w;
    }
    if (rc == ST_OK && fstat(fd, &after) == 0) {
        bk_crc_write(b, &sb, &after, off, data);
        (void)sync_file_range(fd, (off_t)off, (off_t)data.len, SYNC_FILE_RANGE_WRITE);
    }
    close(fd);
    return rc;
}

/* WriteBackupFile with link_piece: req->file of the import directory in becomes a hard link to
 * the file another piece of backup b holds on this node (being imported, or sealed), checked
 * against the size and CRC32C the request announces (from the cache when the file was
 * checksummed on its way in: no read back). */
static st_code link_file(node_ctx *n, const bk_name *b,
                         const Strata__Internal__V1__BackupFileChunk *req, const char *in,
                         st_err *err) {
    st_code rc = bk_piece_check(req->link_piece, err);
    if (rc == ST_OK)
        rc = bk_file_check(req->link_file, err);
    if (rc == ST_OK &&
        (req->offset != 0 || req->data.len != 0 || strcmp(req->link_piece, req->piece) == 0))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "a link carries no data, has offset 0 and names another piece");
    if (rc != ST_OK)
        return rc;
    char dst[NODE_BK_PATH_MAX + 80], src[NODE_BK_PATH_MAX + 80], pdir[NODE_BK_PATH_MAX];
    snprintf(dst, sizeof dst, "%s/%s", in, req->file);
    if (unlink(dst) != 0 && errno != ENOENT)
        return st_err_set(err, ST_INTERNAL, "removing %s: %s", dst, strerror(errno));
    /* being assembled, or sealed meanwhile (the seal renames .in into place) */
    static const char *const where[] = {".in", ""};
    int e = ENOENT;
    for (size_t i = 0; i < 2 && e == ENOENT; i++) {
        bk_piece_dir(n, b, req->link_piece, where[i], pdir, sizeof pdir);
        snprintf(src, sizeof src, "%s/%s", pdir, req->link_file);
        e = link(src, dst) == 0 ? 0 : errno;
    }
    if (e == ENOENT)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "piece %s of %s has no file %s here to link: send the file's bytes",
                          req->link_piece, b->full, req->link_file);
    if (e)
        return st_err_set(err, ST_INTERNAL, "linking %s to %s: %s", dst, src, strerror(e));
    uint64_t size = 0;
    uint32_t crc = 0;
    bool read = false;
    rc = bk_file_crc_cached(n->backups, dst, &size, &crc, &read, err);
    if (rc == ST_OK && (size != req->link_size || crc != req->link_crc32c))
        rc = st_err_set(err, ST_DATA_LOSS,
                        "file %s of piece %s holds %" PRIu64 " bytes with CRC32C %08x, the link "
                        "announces %" PRIu64 " bytes, %08x: send the file's bytes instead",
                        req->link_file, req->link_piece, size, crc, req->link_size,
                        req->link_crc32c);
    if (rc != ST_OK)
        unlink(dst);
    return rc;
}

/* The import directory of a piece, made when absent; ALREADY_EXISTS once sealed, ABORTED while
 * a seal or pull works on it. */
static st_code import_dir(node_ctx *n, const bk_name *b, const char *piece, char *in, size_t cap,
                          st_err *err) {
    char final[NODE_BK_PATH_MAX];
    bk_piece_dir(n, b, piece, "", final, sizeof final);
    bk_piece_dir(n, b, piece, ".in", in, cap);
    if (bk_busy(n, final))
        return st_err_set(err, ST_ABORTED, "piece %s of backup %s is being sealed or pulled now",
                          piece, b->full);
    struct stat sb;
    if (stat(final, &sb) == 0)
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "piece %s of backup %s is sealed already; delete it "
                          "(DeleteBackupPieces) to write it again",
                          piece, b->full);
    return bk_mkdirs(in, err);
}

/* Unpacks a WriteBackupFile request leaving its data where it lies, in the request's buffer
 * (btu_pb_unpack_lift): no copy of each chunk's MiB into the call's arena. NULL when the call
 * was failed. */
static void *chunk_pb_alloc(void *arena, size_t size) {
    return st_arena_alloc(arena, size);
}

static void chunk_pb_free(void *arena, void *ptr) {
    (void)arena; /* the call's arena goes with the call */
    (void)ptr;
}

static Strata__Internal__V1__BackupFileChunk *chunk_unpack(rpc_call *call, st_slice in) {
    ProtobufCAllocator alloc = {chunk_pb_alloc, chunk_pb_free, rpc_call_arena(call)};
    st_slice data;
    st_err err = {0};
    Strata__Internal__V1__BackupFileChunk *req = (void *)btu_pb_unpack_lift(
        &strata__internal__v1__backup_file_chunk__descriptor, &alloc, in, 5, &data, &err);
    if (!req) {
        node_fail(call, err.code ? err.code : ST_INVALID_ARGUMENT, "%s", err.msg);
        return NULL;
    }
    if (data.len)
        req->data = (ProtobufCBinaryData){data.len, (uint8_t *)data.data};
    return req;
}

void node_h_write_backup_file(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__BackupFileChunk *req = chunk_unpack(call, req_bytes);
    if (!req)
        return;
    bk_name b;
    st_err err = {0};
    char in[NODE_BK_PATH_MAX];
    st_code rc = bk_name_parse(req->backup, &b, &err);
    if (rc == ST_OK)
        rc = bk_piece_check(req->piece, &err);
    if (rc == ST_OK)
        rc = bk_file_check(req->file, &err);
    if (rc == ST_OK && req->data.len > BK_WRITE_CHUNK_MAX)
        rc = st_err_set(&err, ST_INVALID_ARGUMENT,
                        "a chunk carries at most %zu bytes, this one %zu: send smaller chunks",
                        BK_WRITE_CHUNK_MAX, req->data.len);
    if (rc == ST_OK)
        rc = import_dir(n, &b, req->piece, in, sizeof in, &err);
    if (rc == ST_OK && req->link_piece && req->link_piece[0])
        rc = link_file(n, &b, req, in, &err);
    else if (rc == ST_OK && req->any_order)
        rc = write_any_order(n->backups, in, req->file, req->offset,
                             st_slice_make(req->data.data, req->data.len), &err);
    else if (rc == ST_OK)
        rc = bk_write_chunk(n->backups, in, req->file, req->offset,
                            st_slice_make(req->data.data, req->data.len), &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    Google__Protobuf__Empty empty;
    google__protobuf__empty__init(&empty);
    node_reply(call, &empty.base);
}

/* ---- SealBackupPiece ---- */

/* A malloc'd copy of p (pack, unpack). */
static bk_piece *piece_copy(const bk_piece *p) {
    size_t len = protobuf_c_message_get_packed_size(&p->base);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(&p->base, buf);
    bk_piece *c = strata__internal__v1__backup_piece__unpack(NULL, len, buf);
    free(buf);
    return c;
}

/* Checks one listed file of the import directory against the manifest. */
static st_code seal_check_file(node_backups *b, const char *in,
                               const Strata__Internal__V1__BackupFile *f, bool pulled,
                               size_t *read_back, st_err *err) {
    char path[NODE_BK_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", in, f->name);
    uint64_t size;
    uint32_t crc;
    bool read = false; /* known from the chunks' way in (bk_write_chunk), or read back now */
    st_code rc = bk_file_crc_cached(b, path, &size, &crc, &read, err);
    *read_back += read;
    if (rc == ST_NOT_FOUND)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "file %s of the piece was never written: send it with WriteBackupFile",
                          f->name);
    if (rc != ST_OK)
        return rc;
    if (size != f->size)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s holds %" PRIu64 " bytes, the manifest says %" PRIu64
                          ": send the file again from offset 0",
                          f->name, size, f->size);
    /* A pull's source checked the file as it sent it (rd_damaged): what differs here was
     * damaged on its way or on this node's disk, and the operation that pulled retries. */
    if (crc != f->crc32c && pulled)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s has CRC32C %08x, the source backup's manifest says %08x: the "
                          "copy pulled here is damaged (the source's file, if its node checks "
                          "what it sends, was whole); retry the operation",
                          f->name, crc, f->crc32c);
    if (crc != f->crc32c)
        return st_err_set(err, ST_DATA_LOSS,
                          "file %s has CRC32C %08x, the manifest says %08x: the copy is damaged; "
                          "send the file again from offset 0",
                          f->name, crc, f->crc32c);
    return bk_fsync_path(path, err);
}

/* Files written to the import directory that the manifest does not list go: a sealed piece holds
 * exactly its listed files. */
static void seal_drop_unlisted(const char *in, const bk_piece *p) {
    DIR *d = opendir(in);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            bk_piece_file(p, e->d_name))
            continue;
        char path[NODE_BK_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", in, e->d_name);
        bk_remove_tree(path, NULL);
    }
    if (d)
        closedir(d);
}

/* The largest version a file of a piece frozen at frozen_us may hold: its tablet's writes
 * took versions from a clock at or below frozen_us (the freeze reads the node's clock after
 * them), give or take the clock skew a restore allows for frozen_us itself. */
static uint64_t seal_version_max(int64_t frozen_us) {
    const int64_t top = (INT64_MAX >> STO_VERSION_TIEBREAK_BITS) - NODE_CLOCK_AHEAD_MAX_US;
    int64_t at = frozen_us < 0 ? 0 : frozen_us > top ? top : frozen_us;
    return STO_VERSION(at + NODE_CLOCK_AHEAD_MAX_US, STO_ORIGIN_MAX);
}

/* Reads every listed file through: sizes and CRC32C say a copy is whole, not that its contents
 * are what a node writes. A file with keys out of order would be served out of order, and one
 * with versions from the future would hide every later write it meets and, once its tablet
 * moves or replicates, pull other nodes' clocks forward. */
static st_code seal_verify_files(sto_db *db, const char *in, const bk_piece *p, st_err *err) {
    uint64_t version_max = seal_version_max(p->frozen_us);
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < p->n_files; i++) {
        char path[NODE_BK_PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", in, p->files[i]->name);
        rc = sto_backup_file_verify(db, path, version_max, err);
        if (rc == ST_DATA_LOSS) {
            char why[ST_ERR_MSG_MAX];
            snprintf(why, sizeof why, "%s", err->msg);
            st_err_set(
                err, ST_DATA_LOSS,
                "file %s: %s; the export's checksums cannot show this (it was altered): export "
                "the backup again from its source instance",
                p->files[i]->name, why);
        }
    }
    return rc;
}

st_code bk_seal_dir(node_backups *b, sto_db *db, const char *in, const char *final,
                    const bk_piece *p, uint32_t node_num, bool pulled, bk_piece **out,
                    size_t *read_back, st_err *err) {
    *out = NULL;
    *read_back = 0;
    st_code rc = ST_OK;
    for (size_t i = 0; rc == ST_OK && i < p->n_files; i++)
        rc = seal_check_file(b, in, p->files[i], pulled, read_back, err);
    if (rc == ST_OK)
        rc = seal_verify_files(db, in, p, err);
    if (rc == ST_OK)
        seal_drop_unlisted(in, p);
    bk_piece *c = rc == ST_OK ? piece_copy(p) : NULL;
    if (rc == ST_OK && !c)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory sealing a piece");
    if (rc == ST_OK) {
        c->node_num = node_num;
        c->size_bytes = 0;
        for (size_t i = 0; i < c->n_files; i++)
            c->size_bytes += c->files[i]->size;
        rc = bk_manifest_write(in, c, err);
    }
    if (rc == ST_OK)
        rc = bk_publish(in, final, err);
    if (rc != ST_OK) {
        bk_piece_free(c);
        return rc;
    }
    *out = c;
    return ST_OK;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* INVALID_ARGUMENT unless p is a well-formed piece for sealing: names, range, unique files. */
static st_code seal_validate(const bk_piece *p, bk_name *b, st_err *err) {
    st_code rc = bk_name_parse(p->backup, b, err);
    if (rc == ST_OK)
        rc = bk_piece_check(p->piece, err);
    if (rc == ST_OK)
        rc = node_check_table_name(p->table_name, err);
    if (rc == ST_OK &&
        (p->start_key.len > NODE_ROW_KEY_MAX || p->end_key.len > NODE_ROW_KEY_MAX ||
         (p->end_key.len && st_slice_cmp(st_slice_make(p->start_key.data, p->start_key.len),
                                         st_slice_make(p->end_key.data, p->end_key.len)) >= 0)))
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "the piece's range must be row keys of at most %d bytes, start before end",
                        NODE_ROW_KEY_MAX);
    if (rc == ST_OK && p->n_files > NODE_BK_FILES_MAX)
        rc =
            st_err_set(err, ST_INVALID_ARGUMENT, "a piece has at most %d files", NODE_BK_FILES_MAX);
    const char **names = rc == ST_OK ? malloc((p->n_files + 1) * sizeof *names) : NULL;
    if (rc == ST_OK && !names)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory sealing a piece");
    for (size_t i = 0; rc == ST_OK && i < p->n_files; i++) {
        names[i] = p->files[i]->name;
        rc = bk_file_check(names[i], err);
    }
    if (rc == ST_OK && p->n_files > 1) {
        qsort(names, p->n_files, sizeof *names, name_cmp);
        for (size_t i = 1; rc == ST_OK && i < p->n_files; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                rc = st_err_set(err, ST_INVALID_ARGUMENT, "file %s is listed twice", names[i]);
    }
    free(names);
    return rc;
}

static bool same_files(const bk_piece *a, const bk_piece *b) {
    if (a->n_files != b->n_files || strcmp(a->table_name, b->table_name) != 0)
        return false;
    for (size_t i = 0; i < a->n_files; i++)
        if (strcmp(a->files[i]->name, b->files[i]->name) != 0 ||
            a->files[i]->size != b->files[i]->size || a->files[i]->crc32c != b->files[i]->crc32c)
            return false;
    return true;
}

typedef struct seal_arg {
    bk_piece *want; /* malloc'd copy of the request */
    bk_piece *out;
    char in[NODE_BK_PATH_MAX], final[NODE_BK_PATH_MAX];
    struct bk_pull *pull; /* a pull's end: freed with the job */
} seal_arg;

static void seal_work(node_job *j) {
    seal_arg *a = j->arg;
    size_t read_back = 0;
    j->rc = bk_seal_dir(j->n->backups, j->n->db, a->in, a->final, a->want, j->n->opts.node_num,
                        a->pull != NULL, &a->out, &read_back, &j->err);
    for (size_t i = 0; j->rc == ST_OK && i < a->out->n_files; i++) {
        char path[NODE_BK_PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", a->final, a->out->files[i]->name);
        bk_crc_remember(j->n->backups, path, a->out->files[i]->size, a->out->files[i]->crc32c);
    }
    if (j->rc == ST_OK)
        st_log(ST_LOG_INFO, "backup",
               "event=piece_sealed backup=%s piece=%s files=%zu read_back_files=%zu",
               a->out->backup, a->out->piece, a->out->n_files, read_back);
}

static void pull_free(struct bk_pull *p);

static void seal_done(node_job *j) {
    seal_arg *a = j->arg;
    if (bk_busy_doomed(j->n, a->final)) { /* DeleteBackupPieces meanwhile: it must not stay */
        bk_trash(j->n, a->final, NULL, NULL);
        if (j->rc == ST_OK)
            j->rc = st_err_set(&j->err, ST_ABORTED,
                               "the backup was deleted while the piece was sealed");
    }
    bk_busy_remove(j->n, a->final);
    if (j->rc == ST_OK)
        node_reply(j->call, &a->out->base);
    else
        node_fail(j->call, j->rc, "sealing piece %s of %s: %s", a->want->piece, a->want->backup,
                  j->err.msg);
    if (a->pull)
        pull_free(a->pull);
    bk_piece_free(a->want);
    bk_piece_free(a->out);
    free(a);
    free(j);
}

/* Starts the seal of b's piece p->piece (the import directory must exist). Takes want. */
static st_code seal_start(node_ctx *n, rpc_call *call, const bk_name *b, bk_piece *want,
                          struct bk_pull *pull, st_err *err) {
    seal_arg *a = calloc(1, sizeof *a);
    node_job *j = calloc(1, sizeof *j);
    st_code rc = a && j ? ST_OK : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == ST_OK) {
        a->want = want;
        a->pull = pull;
        bk_piece_dir(n, b, want->piece, ".in", a->in, sizeof a->in);
        bk_piece_dir(n, b, want->piece, "", a->final, sizeof a->final);
        *j = (node_job){.n = n, .call = call, .work = seal_work, .done = seal_done, .arg = a};
        struct stat sb;
        /* A piece of an empty tablet lists no file, so no WriteBackupFile made its directory:
         * the seal makes it. A piece that lists files still needs each one written. */
        if (!pull && want->n_files == 0 && stat(a->in, &sb) != 0)
            rc = bk_mkdirs(a->in, err);
        if (rc == ST_OK && stat(a->in, &sb) != 0)
            rc = st_err_set(err, ST_FAILED_PRECONDITION,
                            "no file of piece %s was written: send them with WriteBackupFile "
                            "first",
                            want->piece);
    }
    if (rc == ST_OK && !pull && !bk_busy_add(n, a->final))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == ST_OK && (rc = node_job_start(j, err)) != ST_OK && !pull)
        bk_busy_remove(n, a->final);
    if (rc != ST_OK) {
        free(a);
        free(j);
    }
    return rc;
}

void node_h_seal_backup_piece(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    bk_piece *req =
        (void *)node_unpack(call, &strata__internal__v1__backup_piece__descriptor, req_bytes);
    if (!req)
        return;
    bk_name b;
    st_err err = {0};
    st_code rc = seal_validate(req, &b, &err);
    char final[NODE_BK_PATH_MAX];
    if (rc == ST_OK) {
        bk_piece_dir(n, &b, req->piece, "", final, sizeof final);
        if (bk_busy(n, final))
            rc = st_err_set(&err, ST_ABORTED, "piece %s of %s is being sealed now; retry",
                            req->piece, b.full);
    }
    bk_piece *have = NULL;
    if (rc == ST_OK &&
        bk_piece_load(n, &b, req->piece, rpc_call_arena(call), &have, &err) == ST_OK) {
        if (same_files(have, req))
            node_reply(call, &have->base); /* a retried seal */
        else
            node_fail(call, ST_ALREADY_EXISTS,
                      "piece %s of %s is sealed already with other files; delete it first",
                      req->piece, b.full);
        return;
    }
    bk_piece *want = rc == ST_OK ? piece_copy(req) : NULL;
    if (rc == ST_OK && !want)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory sealing a piece");
    if (rc == ST_OK && (rc = seal_start(n, call, &b, want, NULL, &err)) != ST_OK)
        bk_piece_free(want);
    if (rc != ST_OK)
        node_fail(call, rc, "%s", err.msg);
}

/* ---- PullBackupPiece ---- */

typedef struct bk_pull {
    struct bk_pull *next;
    node_ctx *n;
    rpc_call *call;
    rpc_client *client;
    bk_name src, dst;
    char piece[NODE_BK_NAME_MAX + 1];
    char source[BK_HOST_MAX + 8];
    char incarnation[NODE_BK_INCARNATION_MAX + 1]; /* the making asking; kept with the piece */
    char ticket[80]; /* the source's read ticket for the piece (GrantBackupRead), sent back */
    char in[NODE_BK_PATH_MAX], final[NODE_BK_PATH_MAX];
    bk_piece *want; /* the source's manifest, renamed to dst (malloc'd) */
    size_t file;    /* the file being read */
    uint64_t off;
    st_code fail; /* a chunk could not be written: the read was cancelled */
    st_err err;
    bool aborting, sealing;
    bool answered;    /* the call is finished */
    bool reading;     /* a ReadBackupFile of want->files[file] is under way */
    bool owns_busy;   /* final is in the busy list for this pull */
    struct event *ev; /* runs step from the loop, outside the client's callbacks */
    void (*step)(struct bk_pull *p);
} bk_pull;

static void pull_run(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    bk_pull *p = arg;
    p->step(p);
}

/* Runs step(p) from the loop soon; freeing p cancels it (so does node close). */
static void pull_defer_us(bk_pull *p, void (*step)(bk_pull *p), long us) {
    p->step = step;
    struct timeval tv = {0, us};
    evtimer_add(p->ev, &tv);
}

static void pull_defer(bk_pull *p, void (*step)(bk_pull *p)) {
    pull_defer_us(p, step, 0);
}

static void pull_unlist(bk_pull *p) {
    bk_pull **pp = &p->n->backups->pulls;
    while (*pp && *pp != p)
        pp = &(*pp)->next;
    if (*pp)
        *pp = p->next;
}

static void pull_free(bk_pull *p) {
    pull_unlist(p);
    if (p->client)
        rpc_client_free(p->client);
    if (p->owns_busy) {
        bk_busy_remove(p->n, p->final);
        if (!p->sealing)
            bk_remove_tree(p->in, NULL);
    }
    bk_piece_free(p->want);
    if (p->ev)
        event_free(p->ev);
    free(p);
}

/* Ends a pull with an error; its memory goes from the loop (not inside a client callback), or
 * at node close if that comes first. */
static void pull_fail(bk_pull *p, st_code code, const char *fmt, const char *detail) {
    node_fail(p->call, code, "pulling piece %s of %s from %s: %s%s", p->piece, p->src.full,
              p->source, fmt, detail ? detail : "");
    p->answered = p->aborting = true;
    pull_defer(p, pull_free);
}

static void pull_next_file(bk_pull *p);

/* A file a pull wrote whole: which backup here, from which source node, in which piece. The
 * children of a split keep their parent's files whole, so the pieces of one backup that land on
 * this node often list the same file of the same source node: the later pulls link it (as an
 * import does) instead of reading and writing it again, which had made a copy or a restore
 * into another cluster take up to the pieces' sum of bytes instead of the backup's size. Kept
 * in memory for the last BK_PULLED_MAX files (pulls of one backup run close together, in key
 * order, so a split's halves come near each other); after a restart a file is pulled again. */
#define BK_PULLED_MAX 1024
typedef struct bk_pulled {
    char backup[sizeof(((bk_name *)0)->full)];
    char source[BK_HOST_MAX + 8];
    char piece[NODE_BK_NAME_MAX + 1];
    char file[NODE_BK_NAME_MAX + 1];
    uint64_t size;
    uint32_t crc32c;
} bk_pulled;

static void pulled_add(bk_pull *p, const Strata__Internal__V1__BackupFile *f) {
    node_backups *b = p->n->backups;
    if (!b->pulled && !(b->pulled = calloc(BK_PULLED_MAX, sizeof *b->pulled)))
        return; /* out of memory: only no links */
    bk_pulled *e = &b->pulled[b->next_pulled];
    b->next_pulled = (b->next_pulled + 1) % BK_PULLED_MAX;
    if (b->n_pulled < BK_PULLED_MAX)
        b->n_pulled++;
    snprintf(e->backup, sizeof e->backup, "%s", p->dst.full);
    snprintf(e->source, sizeof e->source, "%s", p->source);
    snprintf(e->piece, sizeof e->piece, "%s", p->piece);
    snprintf(e->file, sizeof e->file, "%s", f->name);
    e->size = f->size;
    e->crc32c = f->crc32c;
}

/* Links file f of the pull's piece to the same file another piece of the same backup pulled
 * here from the same source node (being pulled or sealed); true when linked and checked (size
 * and CRC32C: the cache has it from the chunks' way in, so nothing is read back). */
static bool pull_link(bk_pull *p, const Strata__Internal__V1__BackupFile *f) {
    node_backups *b = p->n->backups;
    char dst[NODE_BK_PATH_MAX + 80], src[NODE_BK_PATH_MAX + 80], pdir[NODE_BK_PATH_MAX];
    snprintf(dst, sizeof dst, "%s/%s", p->in, f->name);
    for (size_t i = 0; i < b->n_pulled; i++) {
        const bk_pulled *e = &b->pulled[i];
        if (e->size != f->size || e->crc32c != f->crc32c || strcmp(e->file, f->name) ||
            strcmp(e->piece, p->piece) == 0 || strcmp(e->source, p->source) ||
            strcmp(e->backup, p->dst.full))
            continue;
        static const char *const where[] = {".in", ""};
        for (size_t w = 0; w < 2; w++) {
            bk_piece_dir(p->n, &p->dst, e->piece, where[w], pdir, sizeof pdir);
            snprintf(src, sizeof src, "%s/%s", pdir, e->file);
            unlink(dst);
            if (link(src, dst) != 0)
                continue;
            uint64_t size = 0;
            uint32_t crc = 0;
            bool read = false;
            if (bk_file_crc_cached(b, dst, &size, &crc, &read, NULL) == ST_OK && size == f->size &&
                crc == f->crc32c)
                return true;
            unlink(dst); /* another file by that name now: read it from the source */
        }
    }
    return false;
}

/* Another pull of the same backup here is reading file f from the same source node now: this
 * one waits for it and links the file then (pulls run 8 at a time, and the halves of a split
 * are pulled together). Only a pull that is reading is waited for, so no two wait on each
 * other; one that fails stops reading, and the waiter reads the file itself. */
static bool pull_wait_for(const bk_pull *p, const Strata__Internal__V1__BackupFile *f) {
    for (const bk_pull *o = p->n->backups->pulls; o; o = o->next) {
        if (o == p || !o->reading || o->aborting || !o->want || o->file >= o->want->n_files)
            continue;
        const Strata__Internal__V1__BackupFile *g = o->want->files[o->file];
        if (g->size == f->size && g->crc32c == f->crc32c && !strcmp(g->name, f->name) &&
            !strcmp(o->source, p->source) && !strcmp(o->dst.full, p->dst.full))
            return true;
    }
    return false;
}

static void pull_msg(rpc_ccall *cc, st_slice msg, void *arg) {
    bk_pull *p = arg;
    if (p->aborting || p->fail != ST_OK)
        return;
    st_err err = {0};
    Strata__Internal__V1__BackupFileChunk *c = (void *)btu_pb_unpack(
        &strata__internal__v1__backup_file_chunk__descriptor, NULL, msg, &err);
    st_code rc = c ? ST_OK : ST_DATA_LOSS;
    if (rc == ST_OK && (c->offset != p->off || c->data.len > BK_WRITE_CHUNK_MAX))
        rc = st_err_set(&err, ST_DATA_LOSS,
                        "the source sent a chunk at %" PRIu64 " (want %" PRIu64
                        ") or over %zu bytes",
                        c->offset, p->off, BK_WRITE_CHUNK_MAX);
    if (rc == ST_OK)
        rc = bk_write_chunk(p->n->backups, p->in, p->want->files[p->file]->name, p->off,
                            st_slice_make(c->data.data, c->data.len), &err);
    if (rc == ST_OK)
        p->off += c->data.len;
    if (c)
        protobuf_c_message_free_unpacked(&c->base, NULL);
    if (rc != ST_OK) {
        p->fail = rc;
        p->err = err;
        rpc_ccall_cancel(cc);
    }
}

static void pull_read_done(rpc_ccall *cc, st_code code, const char *message, void *arg) {
    (void)cc;
    bk_pull *p = arg;
    p->reading = false;
    if (p->aborting)
        return;
    const Strata__Internal__V1__BackupFile *f = p->want->files[p->file];
    if (p->fail != ST_OK) {
        pull_fail(p, p->fail, "", p->err.msg);
        return;
    }
    if (code != ST_OK) {
        pull_fail(p, code, "ReadBackupFile: ", message);
        return;
    }
    if (p->off != f->size) {
        pull_fail(p, ST_DATA_LOSS, "a file ended short: ", f->name);
        return;
    }
    pulled_add(p, f);
    p->file++;
    pull_defer(p, pull_next_file); /* it may free the client: leave its callback first */
}

static void pull_next_file(bk_pull *p) {
    if (p->aborting)
        return;
    if (p->file == p->want->n_files) {
        /* Files in: seal on a worker; the pull's memory goes with the seal job. */
        rpc_client_free(p->client); /* from the pull's timer, never inside its callbacks */
        p->client = NULL;
        pull_unlist(p);
        p->sealing = true;
        st_err err = {0};
        bk_piece *want = p->want;
        p->want = NULL;
        if (seal_start(p->n, p->call, &p->dst, want, p, &err) != ST_OK) {
            p->sealing = false;
            bk_piece_free(want);
            node_fail(p->call, err.code, "%s", err.msg);
            pull_free(p); /* unlisted: nothing else frees it */
        }
        return;
    }
    if (pull_link(p, p->want->files[p->file])) { /* here already, for another piece */
        p->file++;
        pull_defer(p, pull_next_file);
        return;
    }
    if (pull_wait_for(p, p->want->files[p->file])) {
        pull_defer_us(p, pull_next_file, 20000);
        return;
    }
    Strata__Internal__V1__ReadBackupFileRequest r;
    strata__internal__v1__read_backup_file_request__init(&r);
    r.backup = p->src.full;
    r.piece = p->piece;
    r.file = p->want->files[p->file]->name;
    r.ticket = p->ticket;
    p->off = 0;
    uint8_t buf[1024];
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    protobuf_c_message_pack(&r.base, buf);
    if (!rpc_client_call(p->client, NODE_SVC "ReadBackupFile", st_slice_make(buf, len), NULL, 0, 0,
                         pull_msg, pull_read_done, p))
        pull_fail(p, ST_UNAVAILABLE, "the source's connection is gone", NULL);
    else
        p->reading = true;
}

/* The source's manifest becomes this piece's: its backup's name here and the making that pulls it
 * (not the source's). */
static st_code want_rename(bk_pull *p, st_err *err) {
    free(p->want->backup);
    if (p->want->incarnation != protobuf_c_empty_string)
        free(p->want->incarnation);
    p->want->backup = strdup(p->dst.full);
    p->want->incarnation = strdup(p->incarnation);
    if (p->want->backup && p->want->incarnation)
        return ST_OK;
    return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
}

/* The source's manifest of the piece, checked as a seal would check it, renamed to dst. */
static st_code pull_take_manifest(bk_pull *p, st_slice resp, st_err *err) {
    Strata__Internal__V1__ListBackupPiecesResponse *r = (void *)btu_pb_unpack(
        &strata__internal__v1__list_backup_pieces_response__descriptor, NULL, resp, err);
    if (!r)
        return ST_DATA_LOSS;
    st_code rc =
        st_err_set(err, ST_NOT_FOUND, "the source has no piece %s of %s", p->piece, p->src.full);
    for (size_t i = 0; i < r->n_pieces; i++) {
        if (strcmp(r->pieces[i]->piece, p->piece) != 0 ||
            strcmp(r->pieces[i]->backup, p->src.full) != 0)
            continue;
        bk_name check;
        p->want = piece_copy(r->pieces[i]);
        rc = p->want ? ST_OK : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        if (rc == ST_OK)
            rc = want_rename(p, err);
        if (rc == ST_OK)
            rc = seal_validate(p->want, &check, err);
        break;
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return rc;
}

static void pull_list_done(st_code code, const char *message, st_slice resp, void *arg) {
    bk_pull *p = arg;
    if (p->aborting)
        return;
    if (code != ST_OK) {
        pull_fail(p, code, "ListBackupPieces: ", message);
        return;
    }
    st_err err = {0};
    if (pull_take_manifest(p, resp, &err) != ST_OK) {
        pull_fail(p, err.code ? err.code : ST_DATA_LOSS, "", err.msg);
        return;
    }
    pull_defer(p, pull_next_file); /* it may free the client: leave its callback first */
}

static st_code pull_start(bk_pull *p, st_err *err) {
    char host[BK_HOST_MAX];
    uint16_t port;
    if (!st_addr_split(p->source, host, sizeof host, &port) || port == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "source '%s' is not host:port", p->source);
    rpc_client_opts o = p->n->peer_opts; /* mutual TLS to the source node, when on */
    o.message_bytes_max = BK_PULL_LIST_MAX;
    p->client = rpc_client_new(p->n->base, host, port, &o, err);
    if (!p->client)
        return err->code ? err->code : ST_UNAVAILABLE;
    st_code rc = bk_remove_tree(p->in, err);
    if (rc == ST_OK)
        rc = bk_mkdirs(p->in, err);
    if (rc != ST_OK)
        return rc;
    Strata__Internal__V1__ListBackupPiecesRequest r;
    strata__internal__v1__list_backup_pieces_request__init(&r);
    r.backup = p->src.full;
    r.piece = p->piece; /* the source reads this piece's manifest only */
    r.ticket = p->ticket;
    uint8_t buf[1024];
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    protobuf_c_message_pack(&r.base, buf);
    return rpc_client_unary(p->client, NODE_SVC "ListBackupPieces", st_slice_make(buf, len), NULL,
                            0, 60000, pull_list_done, p) == ST_OK
               ? ST_OK
               : st_err_set(err, ST_UNAVAILABLE, "could not call the source %s", p->source);
}

static st_code pull_check(node_ctx *n, const Strata__Internal__V1__PullBackupPieceRequest *req,
                          bk_pull *p, st_err *err) {
    st_code rc = bk_name_parse(req->source_backup, &p->src, err);
    if (rc == ST_OK)
        rc = bk_name_parse(req->backup[0] ? req->backup : req->source_backup, &p->dst, err);
    if (rc == ST_OK)
        rc = bk_piece_check(req->piece, err);
    if (rc == ST_OK)
        rc = bk_incarnation_check(req->incarnation, err);
    if (rc == ST_OK && strlen(req->source) > BK_HOST_MAX)
        rc = st_err_set(err, ST_INVALID_ARGUMENT, "source address over %d bytes", BK_HOST_MAX);
    if (rc == ST_OK && strlen(req->ticket) >= sizeof p->ticket)
        rc = st_err_set(err, ST_INVALID_ARGUMENT, "ticket over %zu bytes", sizeof p->ticket - 1);
    if (rc != ST_OK)
        return rc;
    snprintf(p->piece, sizeof p->piece, "%s", req->piece);
    snprintf(p->source, sizeof p->source, "%s", req->source);
    snprintf(p->incarnation, sizeof p->incarnation, "%s", req->incarnation);
    snprintf(p->ticket, sizeof p->ticket, "%s", req->ticket);
    bk_piece_dir(n, &p->dst, p->piece, ".in", p->in, sizeof p->in);
    bk_piece_dir(n, &p->dst, p->piece, "", p->final, sizeof p->final);
    if (bk_busy(n, p->final))
        return st_err_set(err, ST_ABORTED, "piece %s of %s is being made now; retry", p->piece,
                          p->dst.full);
    char dir[NODE_BK_PATH_MAX];
    bk_backup_dir(n, &p->dst, dir, sizeof dir);
    return bk_mkdirs(dir, err);
}

void node_h_pull_backup_piece(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__PullBackupPieceRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__pull_backup_piece_request__descriptor, req_bytes);
    if (!req)
        return;
    bk_pull *p = calloc(1, sizeof *p);
    if (!p) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory pulling a piece");
        return;
    }
    p->n = n;
    p->call = call;
    st_err err = {0};
    st_code rc = (p->ev = evtimer_new(n->base, pull_run, p))
                     ? pull_check(n, req, p, &err)
                     : st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory pulling a piece");
    bk_piece *have = NULL;
    bool dropped = false;
    bool here = rc == ST_OK &&
                bk_piece_load(n, &p->dst, p->piece, rpc_call_arena(call), &have, NULL) == ST_OK;
    if (here)
        rc = bk_leftover_drop(n, &p->dst, p->piece, p->final, have->incarnation, p->incarnation,
                              &dropped, &err);
    if (rc == ST_OK && here && !dropped) {
        node_reply(call, &have->base); /* here already: a retried pull of the same making */
        pull_free(p);
        return;
    }
    if (rc == ST_OK && !(p->owns_busy = bk_busy_add(n, p->final)))
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory pulling a piece");
    if (rc == ST_OK) {
        p->next = n->backups->pulls;
        n->backups->pulls = p;
        rc = pull_start(p, &err);
        if (rc != ST_OK)
            pull_unlist(p);
    }
    if (rc != ST_OK) {
        node_fail(call, rc, "pulling piece %s: %s", req->piece, err.msg);
        p->aborting = true; /* the client's callbacks, run by its free, do nothing */
        pull_free(p);
    }
}

void bk_pulls_abort(node_ctx *n) {
    while (n->backups->pulls) {
        bk_pull *p = n->backups->pulls;
        p->aborting = true;
        if (!p->answered)
            node_fail(p->call, ST_UNAVAILABLE, "the node is shutting down; pull piece %s again",
                      p->piece);
        pull_free(p);
    }
}
