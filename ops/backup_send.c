/* ops/backup_send.c — an import's files to one node, several at once (backup_cli.h): up to
 * BK_SEND_STREAMS files of a piece in flight on one connection, each sent in order, one 1 MiB
 * WriteBackupFile chunk after the other (the node wants the chunks of a file in order), so
 * reading and checksumming the next chunk here overlaps the node writing the last one. Each
 * file's CRC32C and SHA-256 are compared with the manifest once its last byte was read: a
 * damaged file fails the import before its piece is sealed. A file an earlier piece already put
 * on the node (links[]) is one WriteBackupFile with link_piece: the node hard-links it after
 * checking its size and CRC32C, no byte is sent again. */
#define _DEFAULT_SOURCE /* O_NOFOLLOW */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backup_cli.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

typedef struct bk_sender bk_sender;

typedef struct bk_send {
    bk_sender *sr;
    const ops_bk_file *f;
    char path[4096];
    int fd;
    uint64_t off;
    size_t len; /* bytes of the chunk in flight */
    uint32_t crc;
    EVP_MD_CTX *sha;
    uint8_t *buf;  /* the chunk read */
    st_buf packed; /* the request */
} bk_send;

struct bk_sender {
    bk_conn *k;
    const char *dir, *backup;
    const ops_bk_manifest *m;
    const ops_bk_piece *p;
    const bk_link_src *links; /* per file of p, or NULL */
    size_t next, active;
    ops_progress *prog;
    const volatile sig_atomic_t *stop;
    st_code rc;
    st_err err;
};

static void send_next(bk_send *s);
static void send_open(bk_send *s);

static void send_close(bk_send *s) {
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    EVP_MD_CTX_free(s->sha);
    s->sha = NULL;
}

/* The file ends (ok or not): the slot takes the piece's next file, or the loop stops. */
static void send_end(bk_send *s, st_code rc, const st_err *err) {
    bk_sender *sr = s->sr;
    send_close(s);
    if (rc != ST_OK && sr->rc == ST_OK) {
        sr->rc = rc;
        sr->err = *err;
    }
    sr->active--;
    if (sr->rc == ST_OK && sr->next < sr->p->n_files) {
        s->f = &sr->p->files[sr->next++];
        sr->active++;
        send_open(s);
    }
    if (sr->active == 0)
        event_base_loopbreak(sr->k->base);
}

static void send_fail(bk_send *s, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void send_fail(bk_send *s, st_code code, const char *fmt, ...) {
    st_err err = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    send_end(s, code, &err);
}

/* The whole file was sent: its checksums against the manifest. */
static void send_finish(bk_send *s) {
    uint8_t sha[OPS_BK_SHA256_BYTES];
    unsigned n = 0;
    EVP_DigestFinal_ex(s->sha, sha, &n);
    st_err err = {0};
    st_code rc = ST_OK;
    if (s->crc != s->f->crc32c || memcmp(sha, s->f->sha256, sizeof sha))
        rc = st_err_set(&err, ST_DATA_LOSS,
                        "file %s of piece %s: %s: checksum mismatch (CRC32C %08x, manifest %08x): "
                        "the file is damaged; copy or export it again",
                        s->f->name, s->sr->p->id, s->path, s->crc, s->f->crc32c);
    send_end(s, rc, &err);
}

static void send_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    bk_send *s = arg;
    if (code != ST_OK) {
        st_err err;
        st_err_set(&err, code, "WriteBackupFile %s at %s: %s: %s", s->f->name, s->sr->k->addr,
                   st_code_name(code), message);
        send_end(s, code, &err);
        return;
    }
    s->off += s->len;
    ops_progress_add(s->sr->prog, s->len);
    if (s->off >= s->f->size)
        send_finish(s);
    else
        send_next(s);
}

/* Reads the next chunk (checksummed) and sends it. */
static void send_next(bk_send *s) {
    bk_sender *sr = s->sr;
    if (sr->rc != ST_OK) { /* another file failed: the import is over */
        send_end(s, sr->rc, &sr->err);
        return;
    }
    if (*sr->stop) {
        send_fail(s, ST_CANCELLED, "interrupted");
        return;
    }
    uint64_t left = s->f->size - s->off;
    size_t want = left < BK_CHUNK_BYTES ? (size_t)left : BK_CHUNK_BYTES;
    ssize_t got = want ? pread(s->fd, s->buf, want, (off_t)s->off) : 0;
    if (got < 0 || (size_t)got != want) {
        send_fail(s, ST_DATA_LOSS, "%s: %s (changed while read? copy or export it again)", s->path,
                  got < 0 ? strerror(errno) : "shorter than the manifest says");
        return;
    }
    s->len = want;
    s->crc = st_crc32c(s->crc, s->buf, want);
    EVP_DigestUpdate(s->sha, s->buf, want);
    Strata__Internal__V1__BackupFileChunk ch;
    strata__internal__v1__backup_file_chunk__init(&ch);
    ch.backup = (char *)sr->backup;
    ch.piece = (char *)sr->p->id;
    ch.file = (char *)s->f->name;
    ch.offset = s->off;
    ch.data.data = s->buf;
    ch.data.len = want;
    size_t n = strata__internal__v1__backup_file_chunk__get_packed_size(&ch);
    st_buf_reset(&s->packed);
    if (st_buf_reserve(&s->packed, n + 1) != ST_OK) {
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    s->packed.len = strata__internal__v1__backup_file_chunk__pack(&ch, s->packed.data);
    if (rpc_client_unary(sr->k->client, BK_SVC_NODE "WriteBackupFile", st_buf_slice(&s->packed),
                         NULL, 0, BK_CHUNK_TIMEOUT_MS, send_done, s) != ST_OK)
        send_fail(s, ST_UNAVAILABLE, "WriteBackupFile at %s: cannot start the call", sr->k->addr);
}

static void link_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    bk_send *s = arg;
    st_err err = {0};
    if (code != ST_OK)
        st_err_set(&err, code, "WriteBackupFile (link of %s) at %s: %s: %s", s->f->name,
                   s->sr->k->addr, st_code_name(code), message);
    else
        ops_progress_add(s->sr->prog, s->f->size);
    send_end(s, code, &err);
}

/* The node holds the file in an earlier piece: it links it, checking size and CRC32C. */
static void send_link(bk_send *s, const bk_link_src *l) {
    bk_sender *sr = s->sr;
    Strata__Internal__V1__BackupFileChunk ch;
    strata__internal__v1__backup_file_chunk__init(&ch);
    ch.backup = (char *)sr->backup;
    ch.piece = (char *)sr->p->id;
    ch.file = (char *)s->f->name;
    ch.link_piece = (char *)l->piece;
    ch.link_file = (char *)l->file;
    ch.link_size = s->f->size;
    ch.link_crc32c = s->f->crc32c;
    size_t n = strata__internal__v1__backup_file_chunk__get_packed_size(&ch);
    st_buf_reset(&s->packed);
    if (st_buf_reserve(&s->packed, n + 1) != ST_OK) {
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    s->packed.len = strata__internal__v1__backup_file_chunk__pack(&ch, s->packed.data);
    if (rpc_client_unary(sr->k->client, BK_SVC_NODE "WriteBackupFile", st_buf_slice(&s->packed),
                         NULL, 0, BK_CHUNK_TIMEOUT_MS, link_done, s) != ST_OK)
        send_fail(s, ST_UNAVAILABLE, "WriteBackupFile at %s: cannot start the call", sr->k->addr);
}

static void send_open(bk_send *s) {
    const bk_link_src *l = s->sr->links ? &s->sr->links[s->f - s->sr->p->files] : NULL;
    if (l && l->piece) {
        send_link(s, l);
        return;
    }
    s->off = 0;
    s->crc = 0;
    if (!ops_bk_file_path(s->sr->dir, s->sr->m, s->sr->p, s->f, s->path, sizeof s->path, NULL)) {
        send_fail(s, ST_INVALID_ARGUMENT, "the path of %s is too long: use a shorter DIR",
                  s->f->name);
        return;
    }
    s->fd = open(s->path, O_RDONLY | O_NOFOLLOW);
    s->sha = EVP_MD_CTX_new();
    if (s->fd < 0) {
        send_fail(s, ST_NOT_FOUND, "%s: %s (copy or export it again)", s->path, strerror(errno));
        return;
    }
    if (!s->sha || !EVP_DigestInit_ex(s->sha, EVP_sha256(), NULL)) {
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    send_next(s); /* an empty file is one empty chunk: the node then has it */
}

st_code bk_send_piece(bk_conn *k, const char *dir, const ops_bk_manifest *m, const char *backup,
                      const ops_bk_piece *p, const bk_link_src *links, ops_progress *prog,
                      const volatile sig_atomic_t *stop, st_err *err) {
    bk_send slots[BK_SEND_STREAMS];
    bk_sender sr = {.k = k,
                    .dir = dir,
                    .backup = backup,
                    .m = m,
                    .p = p,
                    .links = links,
                    .prog = prog,
                    .stop = stop};
    memset(slots, 0, sizeof slots);
    if (!rpc_client_alive(k->client)) {
        char addr[512];
        snprintf(addr, sizeof addr, "%s", k->addr);
        bk_conn_close(k);
        st_code rc = bk_conn_open(k, addr, err);
        if (rc != ST_OK)
            return rc;
    }
    size_t used = p->n_files < BK_SEND_STREAMS ? p->n_files : BK_SEND_STREAMS;
    bool mem = true;
    for (size_t i = 0; i < used; i++) {
        slots[i].sr = &sr;
        slots[i].fd = -1;
        st_buf_init(&slots[i].packed);
        mem = (slots[i].buf = malloc(BK_CHUNK_BYTES)) != NULL && mem;
    }
    for (size_t i = 0; mem && i < used; i++) {
        slots[i].f = &p->files[sr.next++];
        sr.active++;
    }
    for (size_t i = 0; mem && i < used; i++)
        send_open(&slots[i]);
    while (sr.active > 0 && event_base_dispatch(k->base) == 0)
        ;
    if (!mem)
        st_err_set(&sr.err, sr.rc = ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < used; i++) {
        free(slots[i].buf);
        st_buf_free(&slots[i].packed);
    }
    if (sr.rc != ST_OK)
        return st_err_set(err, sr.rc, "%s", sr.err.msg);
    return ST_OK;
}
