/* ops/backup_fetch.c — an export's files from one node, several at once (backup_cli.h): up to
 * BK_FETCH_STREAMS ReadBackupFile streams on one connection, each into its own file of the
 * export directory, so the node reads, the network carries and this process checksums and
 * writes at the same time, and no single stream's flow-control window bounds the whole export.
 * A stream that drops (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED) resumes from the byte it reached,
 * BK_READ_RETRIES times with backoff; a refused TLS handshake (bk_tls_refused) is not a drop and
 * ends the export at once. */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backup_cli.h"
#include "strata/btutil.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

typedef struct bk_fetch bk_fetch;

typedef struct bk_fetcher {
    bk_conn *k;
    const char *dir;
    bk_fetch_job *jobs;
    size_t n, next, active;
    ops_progress *prog;
    const volatile sig_atomic_t *stop;
    st_code rc; /* the first failure */
    st_err err;
    bk_fetch *slots;
} bk_fetcher;

struct bk_fetch {
    bk_fetcher *fr;
    bk_fetch_job *job;
    ops_bk_out out;
    uint64_t off;
    int attempt;
    st_code rc; /* set by on_msg when it stopped the stream */
    st_err err;
};

static void fetch_start(bk_fetch *f);

static void fetch_msg(rpc_ccall *call, st_slice msg, void *arg) {
    bk_fetch *f = arg;
    if (f->rc != ST_OK)
        return;
    st_slice data; /* in the message as it arrived: not copied out by protobuf-c */
    Strata__Internal__V1__BackupFileChunk *ch = (void *)btu_pb_unpack_lift(
        &strata__internal__v1__backup_file_chunk__descriptor, NULL, msg, 5, &data, &f->err);
    if (!ch)
        f->rc = ST_INTERNAL;
    else if (*f->fr->stop)
        f->rc = st_err_set(&f->err, ST_CANCELLED, "interrupted");
    else if (ch->offset != f->off)
        f->rc = st_err_set(&f->err, ST_DATA_LOSS, "node %s sent offset %llu of %s, expected %llu",
                           f->fr->k->addr, (unsigned long long)ch->offset, f->out.final,
                           (unsigned long long)f->off);
    else
        f->rc = ops_bk_out_write(&f->out, data.data, data.len, &f->err);
    if (f->rc == ST_OK) {
        f->off += data.len;
        ops_progress_add(f->fr->prog, data.len);
    } else {
        rpc_ccall_cancel(call);
    }
    if (ch)
        strata__internal__v1__backup_file_chunk__free_unpacked(ch, NULL);
}

/* The job ends (ok or not): its slot takes the next job, or the loop stops after the last. */
static void fetch_end(bk_fetch *f, st_code rc, const st_err *err) {
    bk_fetcher *fr = f->fr;
    if (rc != ST_OK && fr->rc == ST_OK) {
        fr->rc = rc;
        fr->err = *err;
    }
    fr->active--;
    if (fr->rc == ST_OK && fr->next < fr->n) {
        f->job = &fr->jobs[fr->next++];
        f->off = 0;
        f->attempt = 0;
        f->rc = ST_OK;
        fr->active++;
        fetch_start(f);
    }
    if (fr->active == 0)
        event_base_loopbreak(fr->k->base);
}

static void fetch_close(bk_fetch *f) {
    bk_fetch_job *j = f->job;
    st_err err = {0};
    snprintf(j->result.name, sizeof j->result.name, "%s", j->file);
    st_code rc = ops_bk_out_close(&f->out, &j->result, &err);
    if (rc == ST_OK && (j->result.size != j->size || j->result.crc32c != j->crc32c))
        rc = st_err_set(&err, ST_DATA_LOSS,
                        "node %s sent %s of piece %s with %llu bytes, CRC32C %08x; its piece says "
                        "%llu bytes, %08x (the node's copy is damaged: check the node's disk)",
                        f->fr->k->addr, j->file, j->piece, (unsigned long long)j->result.size,
                        j->result.crc32c, (unsigned long long)j->size, j->crc32c);
    fetch_end(f, rc, &err);
}

static void fetch_retry_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    bk_fetch *f = arg;
    bk_conn *k = f->fr->k;
    if (!rpc_client_alive(k->client)) { /* every call of the dead connection has ended */
        char host[256];
        uint16_t port = 0;
        st_addr_split(k->addr, host, sizeof host, &port);
        rpc_client_free(k->client);
        k->client = bk_conn_client(k, host, port, NULL); /* its TLS too, on a secure one */
    }
    fetch_start(f);
}

static void fetch_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    bk_fetch *f = arg;
    if (f->rc != ST_OK) {
        ops_bk_out_abort(&f->out);
        fetch_end(f, f->rc, &f->err);
    } else if (code == ST_OK) {
        fetch_close(f);
    } else if (f->attempt < BK_READ_RETRIES && !*f->fr->stop && !bk_tls_refused(code, message) &&
               (code == ST_UNAVAILABLE || code == ST_ABORTED || code == ST_DEADLINE_EXCEEDED)) {
        ops_progress_note(f->fr->prog, "ReadBackupFile %s at %s: %s: %s (retrying from byte %llu)",
                          f->job->file, f->fr->k->addr, st_code_name(code), message,
                          (unsigned long long)f->off);
        int64_t ms = (int64_t)BK_RETRY_MS << f->attempt++;
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
        event_base_once(f->fr->k->base, -1, EV_TIMEOUT, fetch_retry_cb, f, &tv);
    } else {
        st_err err;
        char what[2 * OPS_BK_NAME_MAX + 64];
        snprintf(what, sizeof what, "ReadBackupFile %s of piece %s", f->job->file, f->job->piece);
        if (f->fr->k->opts && bk_tls_refused(code, message))
            bk_node_refused(what, f->fr->k->addr, message, "--dir DIR", &err);
        else
            st_err_set(&err, code, "%s at %s: %s: %s", what, f->fr->k->addr, st_code_name(code),
                       message);
        ops_bk_out_abort(&f->out);
        fetch_end(f, code, &err);
    }
}

/* Opens the file on the first attempt, then (re)starts the stream from f->off. */
static void fetch_start(bk_fetch *f) {
    bk_fetch_job *j = f->job;
    st_err err = {0};
    if (f->out.fd < 0) { /* not open yet: the job's first attempt */
        st_code rc = ops_bk_out_open(&f->out, f->fr->dir, j->version, j->piece, j->file, &err);
        if (rc != ST_OK) {
            fetch_end(f, rc, &err);
            return;
        }
    }
    Strata__Internal__V1__ReadBackupFileRequest req;
    strata__internal__v1__read_backup_file_request__init(&req);
    req.backup = (char *)j->backup;
    req.piece = (char *)j->piece;
    req.file = (char *)j->file;
    req.offset = f->off;
    uint8_t buf[4096 + 3 * (OPS_BK_NAME_MAX + 64)];
    size_t len = strata__internal__v1__read_backup_file_request__get_packed_size(&req);
    if (len > sizeof buf || !f->fr->k->client) {
        ops_bk_out_abort(&f->out);
        st_err_set(&err, ST_UNAVAILABLE, "cannot call %s", f->fr->k->addr);
        fetch_end(f, ST_UNAVAILABLE, &err);
        return;
    }
    strata__internal__v1__read_backup_file_request__pack(&req, buf);
    if (!rpc_client_call(f->fr->k->client, BK_SVC_NODE "ReadBackupFile", st_slice_make(buf, len),
                         NULL, 0, BK_FILE_TIMEOUT_MS, fetch_msg, fetch_done, f)) {
        ops_bk_out_abort(&f->out);
        st_err_set(&err, ST_UNAVAILABLE, "ReadBackupFile at %s: cannot start the call",
                   f->fr->k->addr);
        fetch_end(f, ST_UNAVAILABLE, &err);
    }
}

st_code bk_fetch_files(bk_conn *k, const char *dir, bk_fetch_job *jobs, size_t n,
                       ops_progress *prog, const volatile sig_atomic_t *stop, st_err *err) {
    bk_fetch slots[BK_FETCH_STREAMS];
    bk_fetcher fr = {
        .k = k, .dir = dir, .jobs = jobs, .n = n, .prog = prog, .stop = stop, .slots = slots};
    memset(slots, 0, sizeof slots);
    if (n == 0)
        return ST_OK;
    if (!rpc_client_alive(k->client)) {
        char addr[512];
        snprintf(addr, sizeof addr, "%s", k->addr);
        bk_conn_close(k);
        st_code rc = bk_conn_open(k, addr, err);
        if (rc != ST_OK)
            return rc;
    }
    for (size_t i = 0; i < BK_FETCH_STREAMS && fr.next < n; i++) {
        slots[i].fr = &fr;
        slots[i].out.fd = -1;
        slots[i].job = &jobs[fr.next++];
        fr.active++;
    }
    for (size_t i = 0; i < BK_FETCH_STREAMS && slots[i].fr; i++)
        fetch_start(&slots[i]);
    while (fr.active > 0 && event_base_dispatch(k->base) == 0)
        ;
    if (fr.rc != ST_OK)
        return st_err_set(err, fr.rc, "%s", fr.err.msg);
    return ST_OK;
}
