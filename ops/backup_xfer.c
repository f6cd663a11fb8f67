/* ops/backup_xfer.c — `strata backup export`, `import` and `verify` (docs/backups.md,
 * docs/formats/backup-export.md). The router says where the pieces are (BackupAdmin); the bytes
 * go straight between the nodes and the directory, one kept connection per node.
 *
 * export: DescribeBackup, then ReadBackupFile of every distinct file into
 * DIR/files/<piece>.<name> (format 3; each file under a temporary name until fsync'd, checked
 * against the node's size and CRC32C), then the manifest last. import: the manifest and every
 * file's size first, BeginImport (the backup is CREATING, invisible to restores),
 * WriteBackupFile of every chunk of each distinct file once per node (checking each file's
 * checksum against the manifest as it is read: CRC32C, or SHA-256 before format 3) and a link for
 * the pieces that list it again, SealBackupPiece, FinishImport; on any failure (a damaged file, a
 * node down, Ctrl-C) the backup is deleted, so nothing half-imported stays. Both read formats 1
 * and 2 too (ops_bk_file_path). */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backup_cli.h"
#include "certs.h"
#include "instance.h"
#include "strata/btutil.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"
#include <event2/event.h>

#define BK_NODES_MAX 64

/* Set by SIGINT/SIGTERM during a transfer, read between chunks: the one piece of mutable global
 * state here, as a signal handler can reach nothing else. */
static volatile sig_atomic_t bk_interrupted;

static void on_signal(int sig) {
    (void)sig;
    bk_interrupted = 1;
}

typedef struct bk_xfer {
    bk_ctx *c;
    ops_progress prog;
    bk_conn nodes[BK_NODES_MAX];
    size_t n_nodes;
    /* import: the node of the piece being sent; seals in flight and the first that failed */
    bk_conn *conn;
    st_code seal_rc;
    st_err seal_err;
    /* import: every file sent so far, by node and content (a hash table of indexes + 1 into
     * sent), so a file that several pieces on one node share is sent once and linked after */
    struct bk_sent *sent;
    size_t n_sent, cap_sent, *slot, n_slots;
    const ops_bk_manifest *m; /* import: the export's manifest */
} bk_xfer;

typedef struct bk_sent {
    const bk_conn *k;
    const ops_bk_piece *p;
    const ops_bk_file *f;
} bk_sent;

/* A SealBackupPiece in flight while the next piece is sent (the node reads back and syncs the
 * sealed piece's files meanwhile). */
typedef struct bk_seal {
    bk_xfer *x;
    bk_conn *k;
    st_buf packed;
    char piece[OPS_BK_PIECE_ID_MAX + 1];
} bk_seal;

static st_code node_conn(bk_xfer *x, const char *addr, bk_conn **out, st_err *err) {
    for (size_t i = 0; i < x->n_nodes; i++)
        if (!strcmp(x->nodes[i].addr, addr)) {
            *out = &x->nodes[i];
            return ST_OK;
        }
    if (x->n_nodes == BK_NODES_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "more than %d nodes hold the backup",
                          BK_NODES_MAX);
    st_code rc = bk_conn_open(&x->nodes[x->n_nodes], addr, err);
    if (rc == ST_OK)
        *out = &x->nodes[x->n_nodes++];
    return rc;
}

/* The node at addr as `strata status` names it: "node east-1 (ADDR)", or "the node at ADDR"
 * without the instance's topology (--endpoint alone). */
static void node_label(const bk_ctx *c, const char *addr, char *out, size_t cap) {
    for (size_t i = 0; c->topo && i < c->topo->n_clusters; i++)
        for (size_t j = 0; j < c->topo->clusters[i].n_nodes; j++)
            if (!strcmp(c->topo->clusters[i].nodes[j].addr, addr)) {
                char name[OPS_NAME_MAX];
                ops_inst_node_name(c->topo, i, j, name);
                snprintf(out, cap, "node %s (%s)", name, addr);
                return;
            }
    snprintf(out, cap, "the node at %s", addr);
}

/* What to do about a node that does not answer, as the router's own backup errors say it. */
#define BK_NODE_RESTART                                                                            \
    "start it again (`strata status` shows which nodes are down; `strata up` restarts those of a " \
    "local instance)"

/* Whether err is a node of the transfer not answering (UNAVAILABLE naming its address; a
 * refused TLS handshake says its own remedy); who gets the node's label (node_label). */
static bool node_down(const bk_xfer *x, const st_err *err, char *who, size_t cap) {
    if (err->code != ST_UNAVAILABLE || strstr(err->msg, "TLS handshake"))
        return false;
    for (size_t i = 0; i < x->n_nodes; i++) {
        char at[600];
        snprintf(at, sizeof at, " at %s:", x->nodes[i].addr);
        if (strstr(err->msg, at)) {
            node_label(x->c, x->nodes[i].addr, who, cap);
            return true;
        }
    }
    return false;
}

static void xfer_free(bk_xfer *x) {
    for (size_t i = 0; i < x->n_nodes; i++)
        bk_conn_close(&x->nodes[i]);
    x->n_nodes = 0;
    free(x->sent);
    free(x->slot);
    x->sent = NULL;
    x->slot = NULL;
    x->n_sent = x->cap_sent = x->n_slots = 0;
}

static void catch_signals(void) {
    /* A transfer allocates and frees a buffer of a MiB or more per chunk (the call's request,
     * the response reassembled): kept on the heap for the next chunk. */
    st_heap_tune();
    bk_interrupted = 0;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
}

static st_code check_interrupt(st_err *err) {
    return bk_interrupted ? st_err_set(err, ST_CANCELLED, "interrupted") : ST_OK;
}

/* ---- export ---- */

static int64_t ts_us(const Google__Protobuf__Timestamp *t) {
    return t ? t->seconds * 1000000 + t->nanos / 1000 : 0;
}

/* The manifest's header from the router's layout. */
static st_code manifest_from_layout(const Strata__Internal__V1__BackupLayout *l, ops_bk_manifest *m,
                                    st_err *err) {
    const Google__Bigtable__Admin__V2__Backup *b = l->backup;
    if (!b || !l->schema)
        return st_err_set(err, ST_INTERNAL, "DescribeBackup answered without backup or schema");
    snprintf(m->backup, sizeof m->backup, "%s", b->name ? b->name : "");
    snprintf(m->source_table, sizeof m->source_table, "%s", b->source_table ? b->source_table : "");
    m->backup_type = b->backup_type ? b->backup_type : 1;
    m->start_us = ts_us(b->start_time);
    m->end_us = ts_us(b->end_time);
    m->expire_us = ts_us(b->expire_time);
    m->hot_us = b->backup_type == 2 ? ts_us(b->hot_to_standard_time) : 0; /* 2: HOT */
    size_t n = google__bigtable__admin__v2__table__get_packed_size(l->schema);
    if (st_buf_reserve(&m->schema, n + 1) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    m->schema.len = google__bigtable__admin__v2__table__pack(l->schema, m->schema.data);
    return ST_OK;
}

static uint64_t layout_bytes(const Strata__Internal__V1__BackupLayout *l) {
    uint64_t n = 0;
    for (size_t i = 0; i < l->n_pieces; i++)
        for (size_t j = 0; l->pieces[i]->piece && j < l->pieces[i]->piece->n_files; j++)
            n += l->pieces[i]->piece->files[j]->size;
    return n;
}

typedef Strata__Internal__V1__BackupLayout bk_layout;
typedef Strata__Internal__V1__BackupFile bk_pbfile;

/* For every file of the layout's pieces, the earlier piece of the same node holding the same
 * file (name, size, CRC32C) and its index there: a split's halves keep their files whole, so
 * pieces share them. Found on a sorted copy of all files (node, name, size, CRC32C, then piece
 * and file): the first of each run of equal files is the one every later file of the run names,
 * the same answer as searching the earlier pieces in order, in n log n where that search cost
 * O(files^2) (minutes for an export of 100,000 pieces). */
typedef struct bk_share {
    size_t *off;   /* per piece: its first file's index into k and j */
    size_t *k, *j; /* per file: the holder, or SIZE_MAX when none is earlier */
} bk_share;

typedef struct bk_fref {
    const char *node;
    const bk_pbfile *f;
    size_t piece, file;
} bk_fref;

static int cmp_size(size_t a, size_t b) {
    return (a > b) - (a < b);
}

static int fref_cmp(const void *a, const void *b) {
    const bk_fref *x = a, *y = b;
    int c = strcmp(x->node, y->node);
    if (!c)
        c = strcmp(x->f->name, y->f->name);
    if (!c)
        c = (x->f->size > y->f->size) - (x->f->size < y->f->size);
    if (!c)
        c = (x->f->crc32c > y->f->crc32c) - (x->f->crc32c < y->f->crc32c);
    if (!c)
        c = cmp_size(x->piece, y->piece);
    return c ? c : cmp_size(x->file, y->file);
}

static void share_free(bk_share *s) {
    free(s->off);
    free(s->k);
    free(s->j);
}

/* total: the files of all pieces (each piece, node and file name checked present). */
static st_code share_index(const bk_layout *l, size_t total, bk_share *s, st_err *err) {
    s->off = calloc(l->n_pieces + 1, sizeof *s->off);
    s->k = calloc(total + 1, sizeof *s->k);
    s->j = calloc(total + 1, sizeof *s->j);
    bk_fref *v = calloc(total + 1, sizeof *v);
    if (!s->off || !s->k || !s->j || !v) {
        free(v);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < l->n_pieces; i++) {
        s->off[i] = n;
        for (size_t j = 0; j < l->pieces[i]->piece->n_files; j++)
            v[n++] = (bk_fref){l->pieces[i]->node, l->pieces[i]->piece->files[j], i, j};
    }
    s->off[l->n_pieces] = n;
    qsort(v, n, sizeof *v, fref_cmp);
    for (size_t a = 0, head = 0; a < n; a++) {
        const bk_fref *h = &v[head], *x = &v[a];
        if (a > 0 && (strcmp(h->node, x->node) || strcmp(h->f->name, x->f->name) ||
                      h->f->size != x->f->size || h->f->crc32c != x->f->crc32c)) {
            head = a;
            h = x;
        }
        size_t at = s->off[x->piece] + x->file;
        bool earlier = h->piece < x->piece;
        s->k[at] = earlier ? h->piece : SIZE_MAX;
        s->j[at] = earlier ? h->file : SIZE_MAX;
    }
    free(v);
    return ST_OK;
}

/* File j of piece i: the earlier piece k and its file kj holding the same; false when none. */
static bool shared_file(const bk_share *s, size_t i, size_t j, size_t *k, size_t *kj) {
    size_t at = s->off[i] + j;
    *k = s->k[at];
    *kj = s->j[at];
    return *k != SIZE_MAX;
}

typedef struct bk_nref {
    const char *node;
    size_t i;
} bk_nref;

static int nref_cmp(const void *a, const void *b) {
    const bk_nref *x = a, *y = b;
    int c = strcmp(x->node, y->node);
    return c ? c : cmp_size(x->i, y->i);
}

/* The first of v[0..n) (sorted by node) whose node is not before node. */
static size_t nref_lower(const bk_nref *v, size_t n, const char *node) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(v[mid].node, node) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Every file not shared with an earlier piece, fetched node by node in the order the nodes first
 * hold a piece, each node's files in layout order; jobs[] in layout order. The nodes and their
 * jobs are grouped on sorted copies (comparing every piece with the earlier ones was quadratic). */
static st_code fetch_all(bk_xfer *x, const char *dir, const bk_layout *l, bk_fetch_job *jobs,
                         size_t n, const char **job_node, st_err *err) {
    st_code rc = ST_OK;
    bk_fetch_job *batch = calloc(n + 1, sizeof *batch);
    bk_nref *pv = calloc(l->n_pieces + 1, sizeof *pv), *jv = calloc(n + 1, sizeof *jv);
    bool *first = calloc(l->n_pieces + 1, sizeof *first);
    if (!batch || !pv || !jv || !first)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t a = 0; rc == ST_OK && a < l->n_pieces; a++)
        pv[a] = (bk_nref){l->pieces[a]->node, a};
    for (size_t i = 0; rc == ST_OK && i < n; i++)
        jv[i] = (bk_nref){job_node[i], i};
    if (rc == ST_OK) {
        qsort(pv, l->n_pieces, sizeof *pv, nref_cmp);
        qsort(jv, n, sizeof *jv, nref_cmp);
        for (size_t a = 0; a < l->n_pieces; a++) /* each node once, at its first piece */
            first[pv[a].i] = a == 0 || strcmp(pv[a - 1].node, pv[a].node) != 0;
    }
    for (size_t a = 0; rc == ST_OK && a < l->n_pieces; a++) {
        if (!first[a])
            continue;
        const char *node = l->pieces[a]->node;
        size_t lo = nref_lower(jv, n, node), m = 0;
        for (size_t t = lo; t < n && !strcmp(jv[t].node, node); t++)
            batch[m++] = jobs[jv[t].i];
        bk_conn *k = NULL;
        if (m)
            rc = node_conn(x, node, &k, err);
        if (rc == ST_OK && m)
            rc = bk_fetch_files(k, dir, batch, m, &x->prog, &bk_interrupted, err);
        for (size_t b = 0; rc == ST_OK && b < m; b++)
            jobs[jv[lo + b].i].result = batch[b].result;
    }
    free(batch);
    free(pv);
    free(jv);
    free(first);
    return rc;
}

/* The manifest's pieces and files: fetched files from jobs, shared ones hard-linked. */
static st_code export_assemble(const char *dir, const bk_layout *l, const bk_share *sh,
                               const bk_fetch_job *jobs, ops_bk_manifest *m, st_err *err) {
    size_t next = 0;
    for (size_t i = 0; i < l->n_pieces; i++) {
        const Strata__Internal__V1__BackupPiece *bp = l->pieces[i]->piece;
        ops_bk_piece *p = ops_bk_manifest_add_piece(
            m, bp->piece, st_slice_make(bp->start_key.data, bp->start_key.len),
            st_slice_make(bp->end_key.data, bp->end_key.len), bp->frozen_us);
        if (!p)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t j = 0; j < bp->n_files; j++) {
            size_t k, kj;
            const ops_bk_file *f;
            if (shared_file(sh, i, j, &k, &kj)) {
                f = &m->pieces[k].files[kj]; /* the same files/<k's id>.<name> (v2: <digest>) */
                st_code rc =
                    m->version < 2 ? ops_bk_link(dir, m->pieces[k].id, p->id, f->name, err) : ST_OK;
                if (rc != ST_OK)
                    return rc;
            } else {
                f = &jobs[next++].result;
            }
            if (!ops_bk_piece_add_file(p, f))
                return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    return ST_OK;
}

static int loc_key_cmp(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    return st_slice_cmp(st_slice_make(a.data, a.len), st_slice_make(b.data, b.len));
}

/* By start key, then end key (unbounded last), then piece id, as the manifest's reader sorts. */
static int loc_cmp(const void *a, const void *b) {
    const Strata__Internal__V1__PieceLocation *const *pa = a, *const *pb = b;
    const Strata__Internal__V1__BackupPiece *x = (*pa)->piece, *y = (*pb)->piece;
    int c = loc_key_cmp(x->start_key, y->start_key);
    if (!c && (!x->end_key.len || !y->end_key.len))
        c = (int)!x->end_key.len - (int)!y->end_key.len;
    else if (!c)
        c = loc_key_cmp(x->end_key, y->end_key);
    return c ? c : strcmp(x->piece, y->piece);
}

/* Sorts the layout's pieces by start key and checks that they cover the key space once. The
 * manifest lists the pieces in this order, which is the order its reader wants; DescribeBackup
 * answers a copy's (CopyBackup) in the order the copy placed them on its nodes, and the export
 * of a copy had listed them so, which verify and import refused as damaged. A record whose
 * pieces leave a gap or overlap would make an export no import takes: refused here, before
 * any file is fetched. */
static st_code layout_sort(bk_layout *l, const char *name, st_err *err) {
    qsort(l->pieces, l->n_pieces, sizeof *l->pieces, loc_cmp);
    char why[2 * OPS_BK_PIECE_ID_MAX + 64] = "";
    if (l->n_pieces == 0)
        snprintf(why, sizeof why, "no piece");
    for (size_t i = 0; !why[0] && i < l->n_pieces; i++) {
        const Strata__Internal__V1__BackupPiece *p = l->pieces[i]->piece;
        const Strata__Internal__V1__BackupPiece *q = i > 0 ? l->pieces[i - 1]->piece : NULL;
        int c = q ? loc_key_cmp(q->end_key, p->start_key) : 0;
        if (!q && p->start_key.len)
            snprintf(why, sizeof why, "piece %s, the first, starts at a key", p->piece);
        else if (q && (!q->end_key.len || c > 0))
            snprintf(why, sizeof why, "pieces %s and %s overlap", q->piece, p->piece);
        else if (c < 0)
            snprintf(why, sizeof why, "a gap between pieces %s and %s", q->piece, p->piece);
        else if (p->end_key.len && loc_key_cmp(p->start_key, p->end_key) >= 0)
            snprintf(why, sizeof why, "piece %s holds no key", p->piece);
        else if (i + 1 == l->n_pieces && p->end_key.len)
            snprintf(why, sizeof why, "piece %s, the last, ends at a key", p->piece);
    }
    if (!why[0])
        return ST_OK;
    return st_err_set(err, ST_DATA_LOSS,
                      "backup %s: its pieces do not cover the table's key space once (%s): its "
                      "record is damaged and no import would take an export of it; back the "
                      "table up again",
                      name, why);
}

static st_code export_layout(bk_xfer *x, const char *dir, bk_layout *l, const char *name,
                             ops_bk_manifest *m, st_err *err) {
    st_code rc = manifest_from_layout(l, m, err);
    size_t total = 0, n = 0;
    for (size_t i = 0; rc == ST_OK && i < l->n_pieces; i++) {
        const Strata__Internal__V1__PieceLocation *pl = l->pieces[i];
        if (!pl->piece || !pl->node || !pl->piece->piece)
            return st_err_set(err, ST_INTERNAL, "DescribeBackup: piece %zu has no node", i);
        for (size_t j = 0; j < pl->piece->n_files; j++)
            if (!pl->piece->files[j]->name)
                return st_err_set(err, ST_INTERNAL, "DescribeBackup: a file without a name");
        total += pl->piece->n_files;
    }
    if (rc == ST_OK) /* before share_index: a file's holder is an earlier piece in this order */
        rc = layout_sort(l, name, err);
    bk_share sh = {NULL, NULL, NULL};
    if (rc == ST_OK)
        rc = share_index(l, total, &sh, err);
    bk_fetch_job *jobs = calloc(total + 1, sizeof *jobs);
    const char **job_node = calloc(total + 1, sizeof *job_node);
    if (rc == ST_OK && (!jobs || !job_node))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    uint64_t fetch_bytes = 0;
    for (size_t i = 0; rc == ST_OK && i < l->n_pieces; i++) {
        const Strata__Internal__V1__BackupPiece *bp = l->pieces[i]->piece;
        for (size_t j = 0; j < bp->n_files; j++) {
            size_t k, kj;
            if (shared_file(&sh, i, j, &k, &kj))
                continue; /* an earlier piece's file: named again, not read again */
            fetch_bytes += bp->files[j]->size;
            jobs[n] = (bk_fetch_job){.version = m->version,
                                     .backup = bp->backup,
                                     .piece = bp->piece,
                                     .file = bp->files[j]->name,
                                     .size = bp->files[j]->size,
                                     .crc32c = bp->files[j]->crc32c};
            job_node[n++] = l->pieces[i]->node;
        }
    }
    /* the bar's bytes are the ones moved, as the summary's rate: counting the listed ones, a
     * split table's export had read 0% with an ETA many times too long, then jumped */
    ops_progress_total(&x->prog, fetch_bytes);
    if (rc == ST_OK)
        rc = fetch_all(x, dir, l, jobs, n, job_node, err);
    if (rc == ST_OK)
        rc = export_assemble(dir, l, &sh, jobs, m, err);
    if (rc == ST_OK)
        rc = ops_bk_manifest_write(dir, m, err);
    share_free(&sh);
    free(jobs);
    free(job_node);
    return rc;
}

/* The bytes the pieces list and, when fewer, the bytes stored once (pieces of one node share
 * files): the rate is of the bytes actually moved, not of the listed ones, which a split table
 * makes several times larger. */
static void print_summary(const bk_ctx *c, const char *verb, const char *name, const char *dir,
                          const ops_bk_manifest *m, const ops_progress *p) {
    if (c->nested) /* a step of restore --target, which prints its own line */
        return;
    double secs = (double)(st_mono_us() - p->start_us) / 1e6;
    uint64_t bytes = ops_bk_manifest_bytes(m), stored = ops_bk_manifest_stored_bytes(m);
    if (c->a.json) {
        printf("{\"%s\":", verb);
        bk_json_str(name);
        printf(",\"dir\":");
        bk_json_str(dir);
        printf(",\"pieces\":%zu,\"files\":%zu,\"bytes\":%llu,\"stored_bytes\":%llu,"
               "\"seconds\":%.3f}\n",
               m->n_pieces, ops_bk_manifest_files(m), (unsigned long long)bytes,
               (unsigned long long)stored, secs);
        return;
    }
    char size[32], once[48] = "", rate[32];
    ops_progress_bytes(bytes, size, sizeof size);
    if (stored < bytes) {
        char s[32];
        ops_progress_bytes(stored, s, sizeof s);
        snprintf(once, sizeof once, " (%s stored once)", s);
    }
    ops_progress_bytes(secs > 0 ? (uint64_t)((double)stored / secs) : 0, rate, sizeof rate);
    printf("%s %s %s %s: %zu pieces, %zu files, %s%s in %.1f s (%s/s)\n", verb, name,
           !strcmp(verb, "exported") ? "into" : "from", dir, m->n_pieces, ops_bk_manifest_files(m),
           size, once, secs, rate);
}

/* The error is a file system out of space (or of quota). */
static bool no_room(const st_err *err) {
    return strstr(err->msg, strerror(ENOSPC)) || strstr(err->msg, strerror(EDQUOT));
}

/* An export or import moves the files between this process and the nodes, and a secure
 * instance's nodes accept only its admin certificate: without it the command is refused before
 * it makes anything (a directory, a CREATING backup), not at its first node call. flag: how the
 * user names the instance by its directory. */
static st_code node_creds_check(const char *moved, const char *flag, st_err *err) {
    const char *why = ops_secure_node_cert_missing(flag);
    return why[0] ? st_err_set(err, ST_FAILED_PRECONDITION,
                               "the backup's files are %s the nodes directly, and %s", moved, why)
                  : ST_OK;
}

/* After a failed export: removes what it wrote (no export can resume it) and says so in err, or
 * what to remove when that failed. restore --target's temporary copy is removed by the restore,
 * which needs to know only where to make room. */
static void export_undo(const bk_ctx *c, const char *dir, int version, bool made,
                        const bk_layout *l, st_err *err) {
    bool gone = ops_bk_dir_remove(dir, version, made);
    unsigned long long need = l->backup && l->backup->size_bytes > 0
                                  ? (unsigned long long)l->backup->size_bytes
                                  : (unsigned long long)layout_bytes(l);
    if (c->nested && no_room(err))
        st_err_prefix(err,
                      "no room in $TMPDIR for the temporary copy of the backup: free space there, "
                      "or point TMPDIR at a file system with room for %llu bytes: ",
                      need);
    else if (no_room(err))
        st_err_prefix(err,
                      "no room for the export: free space on the file system of %s, or export "
                      "into a new directory on one with room for %llu bytes: ",
                      dir, need);
    if (c->nested)
        return;
    if (!gone)
        st_err_prefix(err, "%s is incomplete (no MANIFEST; remove it and export again): ", dir);
    else if (made)
        st_err_prefix(err, "export failed, %s removed: ", dir);
    else
        st_err_prefix(err, "export failed, what it wrote into %s removed: ", dir);
}

int bk_export(bk_ctx *c) {
    char name[BK_RES_MAX];
    if (c->a.n_pos != 2) {
        fprintf(stderr, "strata backup export: want ID DIR (see strata backup --help)\n");
        return 2;
    }
    if (!bk_backup_name(c, c->a.pos[0], name, sizeof name))
        return 2;
    const char *dir = c->a.pos[1];
    static bk_xfer x; /* one per process: holds the node connections */
    memset(&x, 0, sizeof x);
    x.c = c;
    ops_bk_manifest m;
    ops_bk_manifest_init(&m);
    st_err err = {0};
    Strata__Internal__V1__DescribeBackupRequest req;
    strata__internal__v1__describe_backup_request__init(&req);
    req.name = name;
    ProtobufCMessage *lm = NULL;
    catch_signals();
    /* 1 or 2: an older layout, for the tests of what verify and import still read */
    const char *fmt = getenv("STRATA_BACKUP_EXPORT_FORMAT");
    if (fmt && (!strcmp(fmt, "1") || !strcmp(fmt, "2")))
        m.version = fmt[0] - '0';
    bool made = false;
    st_code rc = bk_router_call(c, BK_SVC_BACKUP "DescribeBackup", &req.base,
                                &strata__internal__v1__backup_layout__descriptor, &lm, &err);
    if (rc == ST_OK)
        rc = node_creds_check("read from", "--dir DIR", &err);
    if (rc == ST_OK)
        rc = ops_bk_dir_create(dir, m.version, &made, &err);
    if (rc == ST_OK) {
        bk_layout *l = (void *)lm;
        ops_progress_init(&x.prog, "strata backup export", OPS_PROGRESS_BYTES, 0, c->a.quiet);
        rc = export_layout(&x, dir, l, name, &m, &err);
        ops_progress_finish(&x.prog, rc == ST_OK);
        char who[700];
        if (rc != ST_OK && node_down(&x, &err, who, sizeof who))
            st_err_prefix(&err,
                          "%s does not answer: " BK_NODE_RESTART " and export again; the call "
                          "that failed: ",
                          who);
        if (rc != ST_OK)
            export_undo(c, dir, m.version, made, l, &err);
    }
    if (rc == ST_OK) {
        print_summary(c, "exported", name, dir, &m, &x.prog);
    } else {
        bk_not_found_hint(c, c->nested && c->asked ? c->asked : c->a.pos[0], name, &err);
        bk_fail(c, &err);
    }
    if (lm)
        protobuf_c_message_free_unpacked(lm, NULL);
    xfer_free(&x);
    ops_bk_manifest_deinit(&m);
    return rc == ST_OK ? 0 : 1;
}

/* ---- verify ---- */

static st_code progress_chunk(const uint8_t *data, size_t len, void *arg, st_err *err) {
    (void)data;
    ops_progress_add(arg, len);
    return check_interrupt(err);
}

/* A file of the manifest with its inode, to find the files a hard link of the export makes
 * checked already. */
typedef struct bk_inode {
    uint64_t dev, ino;
    const ops_bk_file *f;
    int version;
    size_t piece, file;
} bk_inode;

/* Equal exactly when the two are the same inode and ops_bk_file_same. */
static int inode_key_cmp(const bk_inode *x, const bk_inode *y) {
    int c = (x->dev > y->dev) - (x->dev < y->dev);
    if (!c)
        c = (x->ino > y->ino) - (x->ino < y->ino);
    if (!c)
        c = (x->f->size > y->f->size) - (x->f->size < y->f->size);
    if (!c)
        c = (x->f->crc32c > y->f->crc32c) - (x->f->crc32c < y->f->crc32c);
    if (!c && x->version >= 3)
        c = strcmp(x->f->at, y->f->at);
    if (!c && x->version >= 3)
        c = strcmp(x->f->name, y->f->name);
    if (!c && x->version < 3)
        c = memcmp(x->f->sha256, y->f->sha256, sizeof x->f->sha256);
    return c;
}

static int inode_cmp(const void *a, const void *b) {
    const bk_inode *x = a, *y = b;
    int c = inode_key_cmp(x, y);
    if (!c)
        c = cmp_size(x->piece, y->piece);
    return c ? c : cmp_size(x->file, y->file);
}

/* seen[off[i] + j]: file j of piece i is the same inode as a file of an earlier piece with the
 * same manifest entry, which is checked first (a hard link of the export). Found on a sorted
 * list of the files, n log n, where comparing each file with every earlier piece's was
 * quadratic. off has a slot per piece, seen one per file (malloc'd; NULL when out of memory). */
static bool *seen_before(const char *dir, const ops_bk_manifest *m, size_t **off_out) {
    size_t total = ops_bk_manifest_files(m), n = 0;
    size_t *off = calloc(m->n_pieces + 1, sizeof *off);
    bool *seen = calloc(total + 1, sizeof *seen);
    bk_inode *v = calloc(total + 1, sizeof *v);
    if (!off || !seen || !v) {
        free(off);
        free(seen);
        free(v);
        return NULL;
    }
    for (size_t i = 0, at = 0; i < m->n_pieces; at += m->pieces[i++].n_files) {
        off[i] = at;
        for (size_t j = 0; j < m->pieces[i].n_files; j++) {
            bk_inode e = {
                .f = &m->pieces[i].files[j], .version = m->version, .piece = i, .file = j};
            if (ops_bk_file_id(dir, m, &m->pieces[i], e.f, &e.dev, &e.ino))
                v[n++] = e;
        }
    }
    qsort(v, n, sizeof *v, inode_cmp);
    for (size_t a = 0, head = 0; a < n; a++) {
        if (inode_key_cmp(&v[head], &v[a]) != 0)
            head = a;
        seen[off[v[a].piece] + v[a].file] = v[head].piece < v[a].piece;
    }
    free(v);
    *off_out = off;
    return seen;
}

int bk_verify(bk_ctx *c) {
    if (c->a.n_pos != 1) {
        fprintf(stderr, "strata backup verify: want DIR (see strata backup --help)\n");
        return 2;
    }
    const char *dir = c->a.pos[0];
    ops_bk_manifest m;
    ops_progress p;
    st_err err = {0};
    catch_signals();
    st_code rc = ops_bk_manifest_load(dir, &m, &err);
    if (rc == ST_OK)
        rc = ops_bk_check_sizes(dir, &m, &err);
    size_t *off = NULL;
    bool *seen = rc == ST_OK ? seen_before(dir, &m, &off) : NULL;
    if (rc == ST_OK && !seen)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory");
    uint64_t read_bytes = 0; /* each file once: the bar counts what is read */
    for (size_t i = 0; rc == ST_OK && i < m.n_pieces; i++)
        for (size_t j = 0; j < m.pieces[i].n_files; j++)
            read_bytes += seen[off[i] + j] ? 0 : m.pieces[i].files[j].size;
    ops_progress_init(&p, "strata backup verify", OPS_PROGRESS_BYTES, read_bytes,
                      c->a.quiet || rc != ST_OK);
    for (size_t i = 0; rc == ST_OK && i < m.n_pieces; i++)
        for (size_t j = 0; rc == ST_OK && j < m.pieces[i].n_files; j++)
            if (!seen[off[i] + j])
                rc = ops_bk_check_file(dir, &m, &m.pieces[i], &m.pieces[i].files[j], progress_chunk,
                                       &p, &err);
    free(seen);
    free(off);
    ops_progress_finish(&p, rc == ST_OK);
    if (rc == ST_OK)
        print_summary(c, "verified", m.backup, dir, &m, &p);
    else if (c->a.json) {
        printf("{\"verified\":false,\"dir\":");
        bk_json_str(dir);
        printf(",\"code\":\"%s\"}\n", st_code_name(rc));
    }
    if (rc != ST_OK)
        bk_fail(c, &err);
    ops_bk_manifest_deinit(&m);
    return rc == ST_OK ? 0 : 1;
}

/* ---- import ---- */

/* BeginImport's pieces from the manifest (files with sizes and CRC32C); freed by free_pieces. */
static Strata__Internal__V1__BackupPiece **manifest_pieces(const ops_bk_manifest *m) {
    Strata__Internal__V1__BackupPiece **ps = calloc(m->n_pieces + 1, sizeof *ps);
    for (size_t i = 0; ps && i < m->n_pieces; i++) {
        const ops_bk_piece *p = &m->pieces[i];
        Strata__Internal__V1__BackupPiece *bp = calloc(1, sizeof *bp);
        Strata__Internal__V1__BackupFile **fs = calloc(p->n_files + 1, sizeof *fs);
        Strata__Internal__V1__BackupFile *fv = calloc(p->n_files + 1, sizeof *fv);
        ps[i] = bp;
        if (!bp || !fs || !fv) {
            free(fs);
            free(fv);
            return ps; /* the caller sees the hole and frees what is there */
        }
        strata__internal__v1__backup_piece__init(bp);
        bp->piece = (char *)p->id;
        bp->table_name = (char *)m->source_table;
        bp->start_key.data = p->start_key.data;
        bp->start_key.len = p->start_key.len;
        bp->end_key.data = p->end_key.data;
        bp->end_key.len = p->end_key.len;
        bp->frozen_us = p->frozen_us;
        bp->files = fs;
        bp->n_files = p->n_files;
        for (size_t j = 0; j < p->n_files; j++) {
            strata__internal__v1__backup_file__init(&fv[j]);
            fv[j].name = (char *)p->files[j].name;
            fv[j].size = p->files[j].size;
            fv[j].crc32c = p->files[j].crc32c;
            fs[j] = &fv[j];
            bp->size_bytes += p->files[j].size;
        }
        fs[p->n_files] = fv; /* past n_files: not sent, only remembered for free_pieces */
    }
    return ps;
}

static void free_pieces(Strata__Internal__V1__BackupPiece **ps, size_t n) {
    for (size_t i = 0; ps && i < n; i++) {
        if (ps[i] && ps[i]->files) {
            free(ps[i]->files[ps[i]->n_files]);
            free(ps[i]->files);
        }
        free(ps[i]);
    }
    free(ps);
}

static void set_ts(Google__Protobuf__Timestamp *t, int64_t us) {
    google__protobuf__timestamp__init(t);
    t->seconds = us / 1000000;
    t->nanos = (int32_t)(us % 1000000 * 1000);
}

static st_code begin_import(bk_xfer *x, const ops_bk_manifest *m, const char *parent,
                            const char *id, ProtobufCMessage **layout, st_err *err) {
    Google__Bigtable__Admin__V2__Table *schema = (void *)btu_pb_unpack(
        &google__bigtable__admin__v2__table__descriptor, NULL, st_buf_slice(&m->schema), err);
    if (!schema)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the export's schema does not parse (damaged manifest: export again)");
    Google__Protobuf__Timestamp st, en, ex, hot;
    set_ts(&st, m->start_us);
    set_ts(&en, m->end_us);
    set_ts(&ex, m->expire_us);
    set_ts(&hot, m->hot_us);
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)m->source_table;
    b.start_time = &st;
    b.end_time = &en;
    b.expire_time = &ex;
    b.backup_type = m->backup_type;
    b.hot_to_standard_time = m->hot_us > 0 ? &hot : NULL;
    Strata__Internal__V1__BeginImportRequest req;
    strata__internal__v1__begin_import_request__init(&req);
    req.parent = (char *)parent;
    req.backup_id = (char *)id;
    req.backup = &b;
    req.schema = schema;
    req.pieces = manifest_pieces(m);
    req.n_pieces = m->n_pieces;
    bool whole = req.pieces != NULL;
    for (size_t i = 0; whole && i < m->n_pieces; i++)
        whole = req.pieces[i] && req.pieces[i]->files;
    st_code rc = whole
                     ? bk_router_call(x->c, BK_SVC_BACKUP "BeginImport", &req.base,
                                      &strata__internal__v1__backup_layout__descriptor, layout, err)
                     : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    free_pieces(req.pieces, m->n_pieces);
    protobuf_c_message_free_unpacked(&schema->base, NULL);
    return rc;
}

/* The router answers the pieces in the manifest's order (both sorted by start key), leaving out
 * the empty pieces it merged into the one before them, so the search starts at *at (the piece
 * after the last one found) and goes forward: a search of every piece for every piece cost n^2
 * comparisons for the 100,000 pieces a manifest may hold. */
static const ops_bk_piece *find_piece(const ops_bk_manifest *m, const char *id, size_t *at) {
    for (size_t k = 0; id && k < m->n_pieces; k++) {
        size_t i = (*at + k) % m->n_pieces;
        if (!strcmp(m->pieces[i].id, id)) {
            *at = i + 1;
            return &m->pieces[i];
        }
    }
    return NULL;
}

/* ---- files sent, by node and content ---- */

static size_t sent_hash(const bk_conn *k, const ops_bk_file *f, size_t n_slots) {
    uint64_t h;
    memcpy(&h, f->sha256, sizeof h); /* zero in version 3, where at and name tell instead */
    h ^= f->size * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)k;
    if (f->at[0])
        h ^= st_hash64(f->name, strlen(f->name), st_hash64(f->at, strlen(f->at), 0));
    return (size_t)(h % n_slots);
}

static bool sent_same(const bk_xfer *x, const bk_sent *e, const bk_conn *k, const ops_bk_file *f) {
    return e->k == k && ops_bk_file_same(x->m, e->f, f);
}

/* A file with f's content already on node k, or NULL. */
static const bk_sent *sent_find(const bk_xfer *x, const bk_conn *k, const ops_bk_file *f) {
    for (size_t h = x->n_slots ? sent_hash(k, f, x->n_slots) : 0; x->n_slots && x->slot[h];
         h = (h + 1) % x->n_slots)
        if (sent_same(x, &x->sent[x->slot[h] - 1], k, f))
            return &x->sent[x->slot[h] - 1];
    return NULL;
}

static void sent_index(bk_xfer *x, size_t i) {
    size_t h = sent_hash(x->sent[i].k, x->sent[i].f, x->n_slots);
    while (x->slot[h])
        h = (h + 1) % x->n_slots;
    x->slot[h] = i + 1;
}

/* Remembers that file f of piece p is on node k; false out of memory. */
static bool sent_add(bk_xfer *x, const bk_conn *k, const ops_bk_piece *p, const ops_bk_file *f) {
    if (sent_find(x, k, f))
        return true;
    if (x->n_sent == x->cap_sent) {
        size_t cap = x->cap_sent ? x->cap_sent * 2 : 64;
        bk_sent *v = realloc(x->sent, cap * sizeof *v);
        size_t *slot = calloc(2 * cap, sizeof *slot);
        if (!v || !slot) {
            if (v)
                x->sent = v;
            free(slot);
            return false;
        }
        x->sent = v;
        x->cap_sent = cap;
        free(x->slot);
        x->slot = slot;
        x->n_slots = 2 * cap;
        for (size_t i = 0; i < x->n_sent; i++)
            sent_index(x, i);
    }
    x->sent[x->n_sent] = (bk_sent){k, p, f};
    sent_index(x, x->n_sent++);
    return true;
}

/* The bytes the import sends: each file once per node that receives it (the router places the
 * pieces that share files together, so these are the bytes stored once), where the pieces list
 * a shared file once each; the others go as links. Counted on the table of files sent, keyed by
 * a slot of x->nodes per address (not opened), emptied after. */
static uint64_t import_send_bytes(bk_xfer *x, const Strata__Internal__V1__BackupLayout *l,
                                  const ops_bk_manifest *m) {
    const char *addr[BK_NODES_MAX];
    size_t n = 0, at = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < l->n_pieces; i++) {
        const char *node = l->pieces[i]->node;
        const ops_bk_piece *p =
            l->pieces[i]->piece && node ? find_piece(m, l->pieces[i]->piece->piece, &at) : NULL;
        size_t k = 0;
        while (p && k < n && strcmp(addr[k], node))
            k++;
        if (p && k == n && n < BK_NODES_MAX)
            addr[n++] = node;
        for (size_t j = 0; p && j < p->n_files; j++) {
            const bk_conn *key = k < n ? &x->nodes[k] : NULL;
            if (!key || !sent_find(x, key, &p->files[j]))
                bytes += p->files[j].size;
            if (key)
                sent_add(x, key, p, &p->files[j]); /* out of memory: counted again, no harm */
        }
    }
    x->n_sent = 0;
    if (x->slot)
        memset(x->slot, 0, x->n_slots * sizeof *x->slot);
    return bytes;
}

/* Every file of one piece to its node, checked as read; then the seal. */
static void seal_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    bk_seal *s = arg;
    if (code != ST_OK && s->x->seal_rc == ST_OK) {
        s->x->seal_rc = code;
        st_err_set(&s->x->seal_err, code, "SealBackupPiece %s at %s: %s: %s", s->piece, s->k->addr,
                   st_code_name(code), message);
    }
    if (--s->k->pending == 0)
        event_base_loopbreak(s->k->base);
    st_buf_free(&s->packed);
    free(s);
}

/* Starts the seal of piece bp on x->conn without waiting for it (seals_wait does). */
static st_code seal_start(bk_xfer *x, const Strata__Internal__V1__BackupPiece *bp, st_err *err) {
    bk_seal *s = calloc(1, sizeof *s);
    size_t n = strata__internal__v1__backup_piece__get_packed_size(bp);
    if (!s || (st_buf_init(&s->packed), st_buf_reserve(&s->packed, n + 1)) != ST_OK) {
        free(s);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
    s->x = x;
    s->k = x->conn;
    snprintf(s->piece, sizeof s->piece, "%s", bp->piece);
    s->packed.len = strata__internal__v1__backup_piece__pack(bp, s->packed.data);
    if (rpc_client_unary(s->k->client, BK_SVC_NODE "SealBackupPiece", st_buf_slice(&s->packed),
                         NULL, 0, BK_ADMIN_TIMEOUT_MS, seal_done, s) != ST_OK) {
        st_buf_free(&s->packed);
        free(s);
        return st_err_set(err, ST_UNAVAILABLE, "SealBackupPiece at %s: cannot start the call",
                          x->conn->addr);
    }
    s->k->pending++;
    return ST_OK;
}

/* Removes what the node holds of piece `piece` of the backup being imported: a piece sealed or
 * half written by an earlier import of the same id that failed while the node was down (its
 * DeleteBackup could not reach the node). The backup is CREATING and this import's, so anything
 * of that name on the node is such a leftover; without this a retry would meet ALREADY_EXISTS. */
static st_code clear_leftover(bk_xfer *x, const char *name, const char *piece, st_err *err) {
    Strata__Internal__V1__DeleteBackupPiecesRequest d;
    strata__internal__v1__delete_backup_pieces_request__init(&d);
    d.backup = (char *)name;
    d.piece = (char *)piece;
    return bk_conn_call(x->conn, BK_SVC_NODE "DeleteBackupPieces", &d.base, NULL, NULL,
                        BK_ADMIN_TIMEOUT_MS, err);
}

static st_code import_piece(bk_xfer *x, const char *dir, const ops_bk_manifest *m, const char *name,
                            Strata__Internal__V1__PieceLocation *pl, size_t *at, st_err *err) {
    const ops_bk_piece *p = pl->piece ? find_piece(m, pl->piece->piece, at) : NULL;
    if (!p || !pl->node)
        return st_err_set(err, ST_INTERNAL, "BeginImport answered a piece the export lacks");
    st_code rc = node_conn(x, pl->node, &x->conn, err);
    if (rc == ST_OK)
        rc = clear_leftover(x, name, p->id, err);
    bk_link_src *links = rc == ST_OK ? calloc(p->n_files + 1, sizeof *links) : NULL;
    if (rc == ST_OK && !links)
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t j = 0; rc == ST_OK && j < p->n_files; j++) {
        const bk_sent *e = sent_find(x, x->conn, &p->files[j]);
        if (e)
            links[j] = (bk_link_src){e->p->id, e->f->name};
    }
    if (rc == ST_OK)
        rc = bk_send_piece(x->conn, dir, m, name, p, links, &x->prog, &bk_interrupted, err);
    for (size_t j = 0; rc == ST_OK && j < p->n_files; j++)
        if (!links[j].piece && !sent_add(x, x->conn, p, &p->files[j]))
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    free(links);
    if (rc != ST_OK)
        return rc;
    if (!pl->piece->backup || !pl->piece->backup[0])
        pl->piece->backup = (char *)name;
    return seal_start(x, pl->piece, err);
}

/* Waits for every seal in flight; the first failure, if any, in err. */
static st_code seals_wait(bk_xfer *x, st_err *err) {
    for (size_t i = 0; i < x->n_nodes; i++)
        while (x->nodes[i].pending > 0 && event_base_dispatch(x->nodes[i].base) == 0)
            ;
    if (x->seal_rc != ST_OK)
        return st_err_set(err, x->seal_rc, "%s", x->seal_err.msg);
    return ST_OK;
}

/* DeleteBackup after a failed import; says in err whether it went. The router deletes the
 * record and the pieces on the nodes it reaches; a node that does not answer keeps its pieces
 * until the router's sweep reaches it again (docs/backups.md, DeleteBackup), so then the files
 * there are named as left until that node runs. */
static void import_undo(bk_xfer *x, const char *name, st_err *err) {
    Google__Bigtable__Admin__V2__DeleteBackupRequest req;
    google__bigtable__admin__v2__delete_backup_request__init(&req);
    req.name = (char *)name;
    st_err derr = {0};
    char who[700];
    bool node = node_down(x, err, who, sizeof who);
    bool gone =
        bk_router_call(x->c, BK_SVC_ADMIN "DeleteBackup", &req.base, NULL, NULL, &derr) == ST_OK;
    if (gone && node)
        st_err_prefix(err,
                      "import failed: %s does not answer. The partly imported %s was deleted "
                      "except what it holds there, which the router removes once that node "
                      "answers again: " BK_NODE_RESTART " and import again; the call that "
                      "failed: ",
                      who, bk_leaf(name));
    else if (gone)
        st_err_prefix(err, "import failed, the partly imported %s was deleted: ", name);
    else
        st_err_prefix(err,
                      "import failed and the partly imported %s could not be deleted (%s): "
                      "delete it with `strata backup delete`: ",
                      name, derr.msg);
}

static size_t full_pieces(const ops_bk_manifest *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_pieces; i++)
        n += m->pieces[i].n_files > 0;
    return n;
}

static st_code import_run(bk_xfer *x, const char *dir, const ops_bk_manifest *m, const char *id,
                          ProtobufCMessage **done, st_err *err) {
    char parent[BK_RES_MAX], name[BK_RES_MAX];
    const bk_ctx *c = x->c;
    if (!ops_fmt(parent, sizeof parent, "projects/%s/instances/%s/clusters/%s", c->project,
                 c->instance, c->cluster) ||
        !ops_fmt(name, sizeof name, "%s/backups/%s", parent, id))
        return st_err_set(err, ST_INVALID_ARGUMENT, "backup name too long");
    ProtobufCMessage *lm = NULL;
    st_code rc = begin_import(x, m, parent, id, &lm, err);
    if (rc != ST_OK)
        return rc;
    Strata__Internal__V1__BackupLayout *l = (void *)lm;
    x->m = m;
    ops_progress_total(&x->prog, import_send_bytes(x, l, m));
    if (l->backup && l->backup->name && l->backup->name[0])
        snprintf(name, sizeof name, "%s", l->backup->name);
    size_t at = 0;
    for (size_t i = 0; rc == ST_OK && i < l->n_pieces; i++)
        rc = import_piece(x, dir, m, name, l->pieces[i], &at, err);
    st_err serr = {0}; /* every seal ends before FinishImport, or before the undo */
    st_code src = seals_wait(x, &serr);
    if (rc == ST_OK && src != ST_OK) {
        rc = src;
        *err = serr;
    }
    /* the router merges runs of empty pieces into one; every piece holding files stays */
    if (rc == ST_OK && (l->n_pieces > m->n_pieces || l->n_pieces < full_pieces(m)))
        rc = st_err_set(err, ST_INTERNAL, "BeginImport placed %zu pieces of %zu (%zu hold files)",
                        l->n_pieces, m->n_pieces, full_pieces(m));
    if (rc == ST_OK) {
        Strata__Internal__V1__FinishImportRequest f;
        strata__internal__v1__finish_import_request__init(&f);
        f.name = name;
        rc = bk_router_call(c, BK_SVC_BACKUP "FinishImport", &f.base,
                            &google__bigtable__admin__v2__backup__descriptor, done, err);
    }
    if (rc != ST_OK)
        import_undo(x, name, err);
    protobuf_c_message_free_unpacked(lm, NULL);
    return rc;
}

int bk_import(bk_ctx *c) {
    if (c->a.n_pos != 1) {
        fprintf(stderr, "strata backup import: want DIR --cluster C (see strata backup --help)\n");
        return 2;
    }
    const char *dir = c->a.pos[0];
    ops_bk_manifest m;
    st_err err = {0};
    catch_signals();
    st_code rc = ops_bk_manifest_load(dir, &m, &err);
    if (rc == ST_OK) /* a missing or truncated file is refused before anything is created */
        rc = ops_bk_check_sizes(dir, &m, &err);
    const char *id = c->a.as ? c->a.as : bk_leaf(m.backup);
    static bk_xfer x; /* one per process: holds the node connections */
    memset(&x, 0, sizeof x);
    x.c = c;
    ProtobufCMessage *done = NULL;
    if (rc == ST_OK) /* refused before BeginImport creates anything */
        rc = node_creds_check("written to", c->nested ? "--target DIR" : "--dir DIR", &err);
    if (rc == ST_OK) {
        ops_progress_init(&x.prog, "strata backup import", OPS_PROGRESS_BYTES, 0, c->a.quiet);
        rc = import_run(&x, dir, &m, id, &done, &err);
        ops_progress_finish(&x.prog, rc == ST_OK);
    }
    xfer_free(&x);
    if (rc == ST_OK && c->a.json) {
        bk_print_backup(c, (Google__Bigtable__Admin__V2__Backup *)done);
    } else if (rc == ST_OK) {
        print_summary(c, "imported", ((Google__Bigtable__Admin__V2__Backup *)done)->name, dir, &m,
                      &x.prog);
    } else {
        c->failed = rc;
        bk_fail(c, &err);
    }
    if (done)
        protobuf_c_message_free_unpacked(done, NULL);
    ops_bk_manifest_deinit(&m);
    return rc == ST_OK ? 0 : 1;
}
