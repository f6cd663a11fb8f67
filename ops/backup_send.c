/* ops/backup_send.c — an import's files to one node, pipelined (backup_cli.h): up to
 * BK_SEND_STREAMS files of a piece at once on one connection, and up to BK_SEND_WINDOW 1 MiB
 * WriteBackupFile chunks in flight on it in all, so the node writes one chunk while the next
 * ones travel and this side reads and checksums the ones after. A file's chunk at offset 0 goes
 * alone (it starts the file: a new inode on the node); once answered, the file's other chunks go
 * with any_order (the node writes each at its offset, whatever order HTTP/2 delivers them in).
 * Each file's checksum (ops_bk_sum: CRC32C, SHA-256 before format 3) is computed as its chunks
 * are read, in order (one pass over the bytes), and compared with the manifest at its last byte:
 * a damaged file fails the import before its piece is sealed, naming it. The node computes the
 * CRC32C too (it checks every chunk it receives, and the seal compares the file's with the
 * manifest's). A file an
 * earlier piece already put on the node (links[]) is one WriteBackupFile with link_piece: the node
 * hard-links it after checking its size and CRC32C, no byte is sent again. On a failure no new
 * chunk starts; the ones in flight are waited for, then the caller undoes the import. */
#define _DEFAULT_SOURCE /* O_NOFOLLOW */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backup_cli.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

/* Chunks in flight per node: 8 MiB, enough to keep the node's disk busy while the next chunks
 * are read here, small enough to bound this side's memory. */
#define BK_SEND_WINDOW 8

typedef struct bk_sender bk_sender;
typedef struct bk_send bk_send;

/* One WriteBackupFile in flight: its request, packed in place (the file's bytes are read
 * straight into it, after the other fields). */
typedef struct bk_chunk {
    bk_send *s; /* NULL: free */
    uint64_t off;
    size_t len;
    st_buf packed;
} bk_chunk;

struct bk_send {
    bk_sender *sr;
    const ops_bk_file *f;
    char path[4096];
    int fd;
    uint64_t read_off; /* bytes read (and hashed) so far */
    size_t inflight;   /* chunks of this file in flight */
    bool started;      /* the chunk at offset 0 was answered */
    bool busy;         /* the slot holds a file */
    st_buf link;       /* the request of a link */
    ops_bk_sum sum;
    st_code rc; /* this file's first failure */
    st_err err;
};

struct bk_sender {
    bk_conn *k;
    const char *dir, *backup;
    const ops_bk_manifest *m;
    const ops_bk_piece *p;
    const bk_link_src *links; /* per file of p, or NULL */
    size_t next, active, rr;
    bk_send slots[BK_SEND_STREAMS];
    size_t used;
    bk_chunk window[BK_SEND_WINDOW];
    ops_progress *prog;
    const volatile sig_atomic_t *stop;
    st_code rc;
    st_err err;
};

static void send_open(bk_send *s);
static void send_pump(bk_sender *sr);

static void send_close(bk_send *s) {
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    ops_bk_sum_free(&s->sum);
}

/* Records a failure of file s: no new chunk of it starts; it ends once its chunks are back. */
static void send_fail(bk_send *s, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void send_fail(bk_send *s, st_code code, const char *fmt, ...) {
    if (s->rc != ST_OK)
        return;
    s->rc = code;
    s->err.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err.msg, sizeof s->err.msg, fmt, ap);
    va_end(ap);
}

static bool send_read_all(const bk_send *s) {
    return s->read_off >= s->f->size && (s->started || s->inflight > 0);
}

/* The file ends (ok or not) once nothing of it is in flight: the slot takes the piece's next
 * file, or the loop stops when no file is left. */
static void send_settle(bk_send *s) {
    bk_sender *sr = s->sr;
    if (!s->busy || s->inflight > 0)
        return;
    if (s->rc == ST_OK && sr->rc == ST_OK && !(s->started && send_read_all(s)))
        return;
    send_close(s);
    s->busy = false;
    if (s->rc != ST_OK && sr->rc == ST_OK) {
        sr->rc = s->rc;
        sr->err = s->err;
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

/* The file's last byte was read: its checksum against the manifest. */
static void send_check(bk_send *s) {
    if (!ops_bk_sum_matches(&s->sum, s->f))
        send_fail(s, ST_DATA_LOSS,
                  "file %s of piece %s: %s: checksum mismatch (%s differs from the "
                  "manifest's): the file is damaged; copy or export it again",
                  s->f->name, s->sr->p->id, s->path, s->sum.version < 3 ? "SHA-256" : "CRC32C");
}

static void chunk_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    bk_chunk *c = arg;
    bk_send *s = c->s;
    c->s = NULL;
    s->inflight--;
    if (code != ST_OK)
        send_fail(s, code, "WriteBackupFile %s (offset %llu) at %s: %s: %s", s->f->name,
                  (unsigned long long)c->off, s->sr->k->addr, st_code_name(code), message);
    else
        ops_progress_add(s->sr->prog, c->len);
    if (code == ST_OK && c->off == 0)
        s->started = true;
    bk_sender *sr = s->sr;
    send_settle(s);
    send_pump(sr);
}

/* Packs the chunk of file s at s->read_off into c (the bytes read from the file straight into
 * the request, hashed there) and starts its call. */
static void chunk_send(bk_send *s, bk_chunk *c) {
    bk_sender *sr = s->sr;
    uint64_t left = s->f->size - s->read_off;
    size_t want = left < BK_CHUNK_BYTES ? (size_t)left : BK_CHUNK_BYTES;
    Strata__Internal__V1__BackupFileChunk ch;
    strata__internal__v1__backup_file_chunk__init(&ch);
    ch.backup = (char *)sr->backup;
    ch.piece = (char *)sr->p->id;
    ch.file = (char *)s->f->name;
    ch.offset = s->read_off;
    ch.any_order = s->read_off > 0;
    size_t n = strata__internal__v1__backup_file_chunk__get_packed_size(&ch);
    st_buf_reset(&c->packed);
    if (st_buf_reserve(&c->packed, n + 16 + want) != ST_OK) {
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    uint8_t *p = c->packed.data;
    size_t len = strata__internal__v1__backup_file_chunk__pack(&ch, p);
    if (want) { /* field 5 (data), length-delimited: any field order parses */
        p[len++] = 5 << 3 | 2;
        for (uint64_t v = want;; v >>= 7) {
            p[len++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
            if (v <= 0x7f)
                break;
        }
    }
    ssize_t got = want ? pread(s->fd, p + len, want, (off_t)s->read_off) : 0;
    if (got < 0 || (size_t)got != want) {
        send_fail(s, ST_DATA_LOSS, "%s: %s (changed while read? copy or export it again)", s->path,
                  got < 0 ? strerror(errno) : "shorter than the manifest says");
        return;
    }
    ops_bk_sum_update(&s->sum, p + len, want);
    c->packed.len = len + want;
    c->off = s->read_off;
    c->len = want;
    s->read_off += want;
    if (s->read_off >= s->f->size)
        send_check(s);
    if (s->rc != ST_OK)
        return;
    c->s = s;
    s->inflight++;
    if (rpc_client_unary(sr->k->client, BK_SVC_NODE "WriteBackupFile", st_buf_slice(&c->packed),
                         NULL, 0, BK_CHUNK_TIMEOUT_MS, chunk_done, c) != ST_OK) {
        c->s = NULL;
        s->inflight--;
        send_fail(s, ST_UNAVAILABLE, "WriteBackupFile at %s: cannot start the call", sr->k->addr);
    }
}

/* The file of slot s may start a chunk now: its first alone, the others once it is answered. */
static bool send_ready(const bk_send *s) {
    if (!s->busy || s->fd < 0 || s->rc != ST_OK || s->sr->rc != ST_OK)
        return false;
    if (s->read_off == 0)
        return s->inflight == 0 && !s->started;
    return s->started && s->read_off < s->f->size;
}

/* Fills the free places of the window with the next chunks, round robin over the files. */
static void send_pump(bk_sender *sr) {
    if (sr->rc == ST_OK && *sr->stop)
        st_err_set(&sr->err, sr->rc = ST_CANCELLED, "interrupted");
    for (size_t w = 0; w < BK_SEND_WINDOW; w++) {
        if (sr->window[w].s)
            continue;
        bk_send *s = NULL;
        for (size_t i = 0; i < sr->used && !s; i++) {
            bk_send *t = &sr->slots[(sr->rr + i) % sr->used];
            if (send_ready(t))
                s = t;
        }
        if (!s)
            break;
        sr->rr = (size_t)(s - sr->slots) + 1;
        chunk_send(s, &sr->window[w]);
        send_settle(s); /* a failure before the call started */
    }
    for (size_t i = 0; i < sr->used; i++) /* files that failed with nothing in flight */
        send_settle(&sr->slots[i]);
}

static void link_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    bk_send *s = arg;
    bk_sender *sr = s->sr;
    s->inflight--;
    if (code != ST_OK)
        send_fail(s, code, "WriteBackupFile (link of %s) at %s: %s: %s", s->f->name, sr->k->addr,
                  st_code_name(code), message);
    s->started = code == ST_OK; /* a link moves no bytes: the progress counts none */
    send_settle(s);
    send_pump(sr);
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
    s->read_off = s->f->size; /* nothing to read */
    size_t n = strata__internal__v1__backup_file_chunk__get_packed_size(&ch);
    st_buf_reset(&s->link);
    if (st_buf_reserve(&s->link, n + 1) != ST_OK) {
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    s->link.len = strata__internal__v1__backup_file_chunk__pack(&ch, s->link.data);
    s->inflight++;
    if (rpc_client_unary(sr->k->client, BK_SVC_NODE "WriteBackupFile", st_buf_slice(&s->link), NULL,
                         0, BK_CHUNK_TIMEOUT_MS, link_done, s) != ST_OK) {
        s->inflight--;
        send_fail(s, ST_UNAVAILABLE, "WriteBackupFile at %s: cannot start the call", sr->k->addr);
    }
}

/* Slot s takes file s->f: a link, or the file opened for its chunks (send_pump starts them). */
static void send_open(bk_send *s) {
    const bk_link_src *l = s->sr->links ? &s->sr->links[s->f - s->sr->p->files] : NULL;
    s->busy = true;
    s->read_off = 0;
    s->inflight = 0;
    s->started = false;
    s->rc = ST_OK;
    if (l && l->piece)
        send_link(s, l);
    else if (!ops_bk_file_path(s->sr->dir, s->sr->m, s->sr->p, s->f, s->path, sizeof s->path, NULL))
        send_fail(s, ST_INVALID_ARGUMENT, "the path of %s is too long: use a shorter DIR",
                  s->f->name);
    else if ((s->fd = open(s->path, O_RDONLY | O_NOFOLLOW)) < 0)
        send_fail(s, ST_NOT_FOUND, "%s: %s (copy or export it again)", s->path, strerror(errno));
    else if (ops_bk_sum_init(&s->sum, s->sr->m->version, &s->err) != ST_OK)
        send_fail(s, ST_RESOURCE_EXHAUSTED, "out of memory");
    else /* an empty file is one empty chunk: the node then has it */
        posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    send_settle(s); /* a file that failed to open */
}

static st_code sender_run(bk_sender *sr) {
    sr->used = sr->p->n_files < BK_SEND_STREAMS ? sr->p->n_files : BK_SEND_STREAMS;
    for (size_t i = 0; i < sr->used; i++) {
        sr->slots[i].sr = sr;
        sr->slots[i].fd = -1;
        st_buf_init(&sr->slots[i].link);
    }
    for (size_t w = 0; w < BK_SEND_WINDOW; w++)
        st_buf_init(&sr->window[w].packed);
    for (size_t i = 0; i < sr->used; i++) {
        sr->slots[i].f = &sr->p->files[sr->next++];
        sr->active++;
    }
    for (size_t i = 0; i < sr->used && sr->rc == ST_OK; i++)
        send_open(&sr->slots[i]);
    send_pump(sr);
    while (sr->active > 0 && event_base_dispatch(sr->k->base) == 0)
        ;
    for (size_t i = 0; i < sr->used; i++) {
        send_close(&sr->slots[i]);
        st_buf_free(&sr->slots[i].link);
    }
    for (size_t w = 0; w < BK_SEND_WINDOW; w++)
        st_buf_free(&sr->window[w].packed);
    return sr->rc;
}

st_code bk_send_piece(bk_conn *k, const char *dir, const ops_bk_manifest *m, const char *backup,
                      const ops_bk_piece *p, const bk_link_src *links, ops_progress *prog,
                      const volatile sig_atomic_t *stop, st_err *err) {
    if (!rpc_client_alive(k->client)) {
        char addr[512];
        snprintf(addr, sizeof addr, "%s", k->addr);
        bk_conn_close(k);
        st_code rc = bk_conn_open(k, addr, err);
        if (rc != ST_OK)
            return rc;
    }
    bk_sender *sr = calloc(1, sizeof *sr); /* the slots' paths: too big for the stack */
    if (!sr)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    *sr = (bk_sender){.k = k,
                      .dir = dir,
                      .backup = backup,
                      .m = m,
                      .p = p,
                      .links = links,
                      .prog = prog,
                      .stop = stop};
    st_code rc = sender_run(sr);
    if (rc != ST_OK)
        st_err_set(err, rc, "%s", sr->err.msg);
    free(sr);
    return rc;
}
