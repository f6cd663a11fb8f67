/* backup_fake_server.c — a tiny router-and-node in one process, for testing `strata backup`
 * apart from the real router and node. On one port it serves:
 *   - BigtableTableAdmin CreateBackup (an Operation done at the first GetOperation), GetBackup,
 *     ListBackups, DeleteBackup, RestoreTable; google.longrunning.Operations GetOperation;
 *   - BackupAdmin DescribeBackup, BeginImport, FinishImport (all pieces sealed: READY);
 *   - Node ReadBackupFile, WriteBackupFile, SealBackupPiece (sizes and CRC32C checked), with
 *     pieces as files under ROOT/<backup id>/<piece>/<file>, every piece "on" this address.
 * At start it holds backup b1 of cluster c1 (table t): piece p0 ["", "m") with 000001.sst
 * (3 MiB + 17 bytes) and an empty 000002.sst, piece p1 ["m", end) with 000003.sst (100 KiB) and
 * the same 000001.sst as p0 (a split's halves share their files).
 * With --drop-once the first ReadBackupFile of a 000001.sst ends UNAVAILABLE after its first
 * chunk (a node restarting), so exports must resume from the offset they reached.
 * With --window 000001.sst holds 9 MiB + 17 bytes (more than an import keeps in flight), the
 * answers to WriteBackupFile chunks wait 20 ms (so a pipelining client fills its window), the
 * most chunks ever waiting at once is printed as "fake: chunks in flight N", and the chunk at
 * offset 5 MiB of a backup whose id starts with "fail" fails RESOURCE_EXHAUSTED (a disk filling
 * up in the middle of the window).
 * Prints "fake listening on 127.0.0.1:PORT" and serves until killed.
 *   backup_fake_server ROOT [--drop-once | --window] */
#define _DEFAULT_SOURCE
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

#define FB_MAX 32
#define FB_PIECES_MAX 8
#define FB_CHUNK (1u << 20)
#define FB_PREFIX "projects/p/instances/i/clusters/c1/backups/"

typedef struct fb {
    bool used, ready;
    char name[512], table[512];
    int64_t start_us, end_us, expire_us;
    Strata__Internal__V1__BackupPiece *pieces[FB_PIECES_MAX]; /* unpacked, owned */
    bool sealed[FB_PIECES_MAX];
    size_t n;
} fb;

typedef struct fake {
    char root[512], addr[64];
    bool drop_once; /* the first ReadBackupFile of a 000001.sst ends UNAVAILABLE after 1 MiB */
    fb b[FB_MAX];
    bool window; /* --window */
    struct event_base *base;
    size_t held, held_max; /* --window: chunk answers waiting now, and the most at once */
} fake;

static fake F; /* one per process: the handlers' shared state */

static const char *leaf(const char *s) {
    const char *p = strrchr(s ? s : "", '/');
    return p ? p + 1 : s;
}

static bool safe(const char *s) {
    return s && *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static fb *find(const char *name) {
    for (size_t i = 0; name && i < FB_MAX; i++)
        if (F.b[i].used && !strcmp(F.b[i].name, name))
            return &F.b[i];
    return NULL;
}

static void answer(rpc_call *call, const ProtobufCMessage *m) {
    size_t len = m ? protobuf_c_message_get_packed_size(m) : 0;
    uint8_t *buf = malloc(len + 1);
    if (m)
        protobuf_c_message_pack(m, buf);
    rpc_call_send(call, st_slice_make(buf, len));
    free(buf);
    rpc_call_finish(call, ST_OK, NULL);
}

static void ts_set(Google__Protobuf__Timestamp *t, int64_t us) {
    google__protobuf__timestamp__init(t);
    t->seconds = us / 1000000;
    t->nanos = (int32_t)(us % 1000000 * 1000);
}

static void path_of(char *out, size_t cap, const char *backup, const char *piece,
                    const char *file) {
    snprintf(out, cap, "%s/%s/%s/%s", F.root, leaf(backup), piece, file);
}

/* The Backup message of b (times point into ts[3]). */
static void backup_msg(const fb *b, Google__Bigtable__Admin__V2__Backup *m,
                       Google__Protobuf__Timestamp ts[3]) {
    google__bigtable__admin__v2__backup__init(m);
    m->name = (char *)b->name;
    m->source_table = (char *)b->table;
    ts_set(&ts[0], b->start_us);
    ts_set(&ts[1], b->end_us);
    ts_set(&ts[2], b->expire_us);
    m->start_time = &ts[0];
    m->end_time = &ts[1];
    m->expire_time = &ts[2];
    m->state = b->ready ? GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY
                        : GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    m->backup_type = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD;
    for (size_t i = 0; i < b->n; i++)
        m->size_bytes += (int64_t)b->pieces[i]->size_bytes;
}

static void answer_layout(rpc_call *call, const fb *b) {
    Google__Protobuf__Timestamp ts[3];
    Google__Bigtable__Admin__V2__Backup bm;
    backup_msg(b, &bm, ts);
    Google__Bigtable__Admin__V2__GcRule gc;
    google__bigtable__admin__v2__gc_rule__init(&gc);
    gc.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
    gc.max_num_versions = 1;
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    cf.gc_rule = &gc;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e;
    google__bigtable__admin__v2__table__column_families_entry__init(&e);
    e.key = "cf";
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *ep = &e;
    Google__Bigtable__Admin__V2__Table schema;
    google__bigtable__admin__v2__table__init(&schema);
    schema.name = (char *)b->table;
    schema.column_families = &ep;
    schema.n_column_families = 1;
    Strata__Internal__V1__PieceLocation locs[FB_PIECES_MAX], *lp[FB_PIECES_MAX];
    for (size_t i = 0; i < b->n; i++) {
        strata__internal__v1__piece_location__init(&locs[i]);
        locs[i].piece = b->pieces[i];
        locs[i].node = F.addr;
        lp[i] = &locs[i];
    }
    Strata__Internal__V1__BackupLayout l;
    strata__internal__v1__backup_layout__init(&l);
    l.backup = &bm;
    l.schema = &schema;
    l.pieces = lp;
    l.n_pieces = b->n;
    answer(call, &l.base);
}

/* A copy of p owned by the fake, with backup set to name. */
static Strata__Internal__V1__BackupPiece *piece_dup(const Strata__Internal__V1__BackupPiece *p,
                                                    const char *name) {
    Strata__Internal__V1__BackupPiece named = *p; /* shallow: only backup and node change */
    named.backup = (char *)name;
    named.node_num = 1;
    size_t n = strata__internal__v1__backup_piece__get_packed_size(&named);
    uint8_t *buf = malloc(n + 1);
    strata__internal__v1__backup_piece__pack(&named, buf);
    Strata__Internal__V1__BackupPiece *c = strata__internal__v1__backup_piece__unpack(NULL, n, buf);
    free(buf);
    return c;
}

static fb *fb_new(const char *name, const char *table) {
    for (size_t i = 0; i < FB_MAX; i++)
        if (!F.b[i].used) {
            memset(&F.b[i], 0, sizeof F.b[i]);
            F.b[i].used = true;
            snprintf(F.b[i].name, sizeof F.b[i].name, "%s", name);
            snprintf(F.b[i].table, sizeof F.b[i].table, "%s", table);
            F.b[i].start_us = st_wall_us() - 2000;
            F.b[i].end_us = st_wall_us() - 1000;
            F.b[i].expire_us = st_wall_us() + 7 * 86400 * 1000000LL;
            return &F.b[i];
        }
    return NULL;
}

static void fb_free(fb *b) {
    char cmd[1200];
    for (size_t i = 0; i < b->n; i++)
        strata__internal__v1__backup_piece__free_unpacked(b->pieces[i], NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", F.root, leaf(b->name));
    if (system(cmd) != 0)
        fprintf(stderr, "fake: cannot remove %s\n", cmd);
    memset(b, 0, sizeof *b);
}

/* ---- node ---- */

static bool file_crc(const char *path, uint64_t *size, uint32_t *crc) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    static uint8_t buf[FB_CHUNK];
    size_t n;
    *size = 0;
    *crc = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = st_crc32c(*crc, buf, n);
        *size += n;
    }
    fclose(f);
    return true;
}

static void h_read_file(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__ReadBackupFileRequest *q =
        strata__internal__v1__read_backup_file_request__unpack(NULL, req.len, req.data);
    char path[1500];
    FILE *f = NULL;
    if (q && safe(q->piece) && safe(q->file) && find(q->backup)) {
        path_of(path, sizeof path, q->backup, q->piece, q->file);
        f = fopen(path, "rb");
    }
    if (!f) {
        rpc_call_finish(call, ST_NOT_FOUND, "fake: no such backup file");
    } else {
        uint8_t *buf = malloc(FB_CHUNK);
        uint64_t off = q->offset;
        size_t n;
        fseek(f, (long)off, SEEK_SET);
        bool drop = F.drop_once && q->offset == 0 && strcmp(q->file, "000001.sst") == 0;
        F.drop_once = F.drop_once && !drop;
        while ((n = fread(buf, 1, FB_CHUNK, f)) > 0) {
            Strata__Internal__V1__BackupFileChunk ch;
            strata__internal__v1__backup_file_chunk__init(&ch);
            ch.backup = q->backup;
            ch.piece = q->piece;
            ch.file = q->file;
            ch.offset = off;
            ch.data.data = buf;
            ch.data.len = n;
            size_t len = strata__internal__v1__backup_file_chunk__get_packed_size(&ch);
            uint8_t *out = malloc(len + 1);
            strata__internal__v1__backup_file_chunk__pack(&ch, out);
            rpc_call_send(call, st_slice_make(out, len));
            free(out);
            off += n;
            if (drop)
                break;
        }
        free(buf);
        fclose(f);
        rpc_call_finish(call, drop ? ST_UNAVAILABLE : ST_OK, drop ? "fake: dropped once" : NULL);
    }
    if (q)
        strata__internal__v1__read_backup_file_request__free_unpacked(q, NULL);
}

typedef struct held_call {
    rpc_call *call;
    bool fail;
} held_call;

static void held_answer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    held_call *h = arg;
    F.held--;
    if (h->fail)
        rpc_call_finish(h->call, ST_RESOURCE_EXHAUSTED,
                        "fake: no space left on device writing the chunk at offset 5 MiB");
    else
        answer(h->call, NULL);
    free(h);
}

/* --window: the chunk's answer in 20 ms, counting the answers waiting at once. */
static void hold(rpc_call *call, bool fail) {
    held_call *h = malloc(sizeof *h);
    struct timeval tv = {0, 20000};
    if (!h || event_base_once(F.base, -1, EV_TIMEOUT, held_answer, h, &tv) != 0) {
        free(h);
        rpc_call_finish(call, ST_INTERNAL, "fake: out of memory");
        return;
    }
    *h = (held_call){call, fail};
    if (++F.held > F.held_max) {
        F.held_max = F.held;
        printf("fake: chunks in flight %zu\n", F.held_max);
        fflush(stdout);
    }
}

static void h_write_file(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__BackupFileChunk *q =
        strata__internal__v1__backup_file_chunk__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->backup) : NULL;
    char path[1500];
    int fd = -1;
    if (b && !b->ready && safe(q->piece) && safe(q->file)) {
        snprintf(path, sizeof path, "%s/%s", F.root, leaf(q->backup));
        mkdir(path, 0755);
        snprintf(path, sizeof path, "%s/%s/%s", F.root, leaf(q->backup), q->piece);
        mkdir(path, 0755);
        path_of(path, sizeof path, q->backup, q->piece, q->file);
        char sealed[1500]; /* a node refuses writes into a sealed piece: so does the fake */
        path_of(sealed, sizeof sealed, q->backup, q->piece, "SEALED");
        if (access(sealed, F_OK) == 0) {
            rpc_call_finish(call, ST_ALREADY_EXISTS, "fake: the piece is sealed already");
            strata__internal__v1__backup_file_chunk__free_unpacked(q, NULL);
            return;
        }
        if (q->link_piece[0]) { /* a file another piece holds: linked, as a node does */
            char src[1500];
            path_of(src, sizeof src, q->backup, q->link_piece, q->link_file);
            unlink(path);
            bool ok = safe(q->link_piece) && safe(q->link_file) && link(src, path) == 0;
            if (ok)
                answer(call, NULL);
            else
                rpc_call_finish(call, ST_FAILED_PRECONDITION, "fake: no file to link");
            strata__internal__v1__backup_file_chunk__free_unpacked(q, NULL);
            return;
        }
        fd = open(path, O_WRONLY | O_CREAT | (q->offset == 0 ? O_TRUNC : 0), 0644);
    }
    if (fd < 0 || pwrite(fd, q->data.data, q->data.len, (off_t)q->offset) != (ssize_t)q->data.len)
        rpc_call_finish(call, ST_FAILED_PRECONDITION, "fake: not a backup being imported");
    else if (F.window)
        hold(call, !strncmp(leaf(q->backup), "fail", 4) && q->offset == 5u << 20);
    else
        answer(call, NULL);
    if (fd >= 0)
        close(fd);
    if (q)
        strata__internal__v1__backup_file_chunk__free_unpacked(q, NULL);
}

/* Node DeleteBackupPieces of one piece of a backup being imported (an import clears leftovers
 * of its pieces first): its files go. */
static void h_delete_pieces(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__DeleteBackupPiecesRequest *q =
        strata__internal__v1__delete_backup_pieces_request__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->backup) : NULL;
    if (b && !b->ready && safe(q->piece)) {
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/%s/%s'", F.root, leaf(q->backup), q->piece);
        if (system(cmd) != 0)
            fprintf(stderr, "fake: %s failed\n", cmd);
    }
    answer(call, NULL);
    if (q)
        strata__internal__v1__delete_backup_pieces_request__free_unpacked(q, NULL);
}

static void h_seal(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__BackupPiece *q =
        strata__internal__v1__backup_piece__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->backup) : NULL;
    size_t k = FB_PIECES_MAX;
    for (size_t i = 0; b && i < b->n; i++)
        if (!strcmp(b->pieces[i]->piece, q->piece))
            k = i;
    const char *bad = k == FB_PIECES_MAX ? "fake: no such piece" : NULL;
    for (size_t j = 0; !bad && j < q->n_files; j++) {
        char path[1500];
        uint64_t size;
        uint32_t crc;
        path_of(path, sizeof path, q->backup, q->piece, q->files[j]->name);
        if (!file_crc(path, &size, &crc) || size != q->files[j]->size || crc != q->files[j]->crc32c)
            bad = "fake: a file does not match its size or CRC32C";
    }
    if (bad) {
        rpc_call_finish(call, ST_DATA_LOSS, bad);
    } else {
        char path[1500];
        path_of(path, sizeof path, q->backup, q->piece, "SEALED");
        FILE *f = fopen(path, "w");
        if (f)
            fclose(f);
        b->sealed[k] = true;
        answer(call, &q->base);
    }
    if (q)
        strata__internal__v1__backup_piece__free_unpacked(q, NULL);
}

/* ---- BackupAdmin ---- */

static void h_describe(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__DescribeBackupRequest *q =
        strata__internal__v1__describe_backup_request__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->name) : NULL;
    if (!b || !b->ready)
        rpc_call_finish(call, ST_NOT_FOUND, "fake: no such backup");
    else
        answer_layout(call, b);
    if (q)
        strata__internal__v1__describe_backup_request__free_unpacked(q, NULL);
}

static void h_begin(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__BeginImportRequest *q =
        strata__internal__v1__begin_import_request__unpack(NULL, req.len, req.data);
    char name[1024];
    snprintf(name, sizeof name, "%s/backups/%s", q ? q->parent : "", q ? q->backup_id : "");
    fb *b = NULL;
    if (!q || !q->backup || !q->schema || q->n_pieces > FB_PIECES_MAX)
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "fake: bad BeginImport");
    else if (find(name))
        rpc_call_finish(call, ST_ALREADY_EXISTS, "fake: backup exists");
    else if (!(b = fb_new(name, q->backup->source_table)))
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "fake: full");
    if (b) {
        for (size_t i = 0; i < q->n_pieces; i++)
            b->pieces[b->n++] = piece_dup(q->pieces[i], name);
        answer_layout(call, b);
    }
    if (q)
        strata__internal__v1__begin_import_request__free_unpacked(q, NULL);
}

static void h_finish(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Strata__Internal__V1__FinishImportRequest *q =
        strata__internal__v1__finish_import_request__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->name) : NULL;
    bool all = b != NULL;
    for (size_t i = 0; b && i < b->n; i++)
        all = all && b->sealed[i];
    if (!all) {
        rpc_call_finish(call, ST_FAILED_PRECONDITION, "fake: pieces not sealed");
    } else {
        b->ready = true;
        Google__Protobuf__Timestamp ts[3];
        Google__Bigtable__Admin__V2__Backup bm;
        backup_msg(b, &bm, ts);
        answer(call, &bm.base);
    }
    if (q)
        strata__internal__v1__finish_import_request__free_unpacked(q, NULL);
}

/* ---- admin ---- */

static void h_get(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__GetBackupRequest *q =
        google__bigtable__admin__v2__get_backup_request__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->name) : NULL;
    if (!b) {
        rpc_call_finish(call, ST_NOT_FOUND, "fake: no such backup");
    } else {
        Google__Protobuf__Timestamp ts[3];
        Google__Bigtable__Admin__V2__Backup bm;
        backup_msg(b, &bm, ts);
        answer(call, &bm.base);
    }
    if (q)
        google__bigtable__admin__v2__get_backup_request__free_unpacked(q, NULL);
}

static void h_delete(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__DeleteBackupRequest *q =
        google__bigtable__admin__v2__delete_backup_request__unpack(NULL, req.len, req.data);
    fb *b = q ? find(q->name) : NULL;
    if (!b) {
        rpc_call_finish(call, ST_NOT_FOUND, "fake: no such backup");
    } else {
        fb_free(b);
        answer(call, NULL);
    }
    if (q)
        google__bigtable__admin__v2__delete_backup_request__free_unpacked(q, NULL);
}

/* Every backup, in one page of one, so clients must follow page tokens ("N" = from index N). */
static void h_list(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__ListBackupsRequest *q =
        google__bigtable__admin__v2__list_backups_request__unpack(NULL, req.len, req.data);
    size_t from = q && q->page_token && *q->page_token ? strtoul(q->page_token, NULL, 10) : 0;
    Google__Protobuf__Timestamp ts[3];
    Google__Bigtable__Admin__V2__Backup bm, *bp = &bm;
    Google__Bigtable__Admin__V2__ListBackupsResponse r;
    google__bigtable__admin__v2__list_backups_response__init(&r);
    char next[32] = "";
    for (size_t i = from; i < FB_MAX; i++)
        if (F.b[i].used && !r.n_backups) {
            backup_msg(&F.b[i], &bm, ts);
            r.backups = &bp;
            r.n_backups = 1;
        } else if (F.b[i].used) {
            snprintf(next, sizeof next, "%zu", i);
            break;
        }
    r.next_page_token = next;
    answer(call, &r.base);
    if (q)
        google__bigtable__admin__v2__list_backups_request__free_unpacked(q, NULL);
}

static void answer_op(rpc_call *call, const char *name, bool done, const ProtobufCMessage *resp,
                      const char *type) {
    Google__Longrunning__Operation op;
    google__longrunning__operation__init(&op);
    op.name = (char *)name;
    op.done = done;
    Google__Protobuf__Any any;
    google__protobuf__any__init(&any);
    uint8_t *buf = NULL;
    if (done && resp) {
        any.type_url = (char *)type;
        any.value.len = protobuf_c_message_get_packed_size(resp);
        buf = malloc(any.value.len + 1);
        any.value.data = buf;
        protobuf_c_message_pack(resp, buf);
        op.result_case = GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE;
        op.response = &any;
    }
    answer(call, &op.base);
    free(buf);
}

static void h_create(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__CreateBackupRequest *q =
        google__bigtable__admin__v2__create_backup_request__unpack(NULL, req.len, req.data);
    char name[1024], op[1100];
    snprintf(name, sizeof name, "%s/backups/%s", q ? q->parent : "", q ? q->backup_id : "");
    fb *b = NULL;
    if (!q || !q->backup || !q->backup->source_table)
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "fake: bad CreateBackup");
    else if (find(name))
        rpc_call_finish(call, ST_ALREADY_EXISTS, "fake: backup exists");
    else if (!(b = fb_new(name, q->backup->source_table)))
        rpc_call_finish(call, ST_RESOURCE_EXHAUSTED, "fake: full");
    if (b) {
        b->ready = true;
        snprintf(op, sizeof op, "operations/%s/1", name);
        answer_op(call, op, false, NULL, NULL);
    }
    if (q)
        google__bigtable__admin__v2__create_backup_request__free_unpacked(q, NULL);
}

static void h_restore(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__RestoreTableRequest *q =
        google__bigtable__admin__v2__restore_table_request__unpack(NULL, req.len, req.data);
    char op[1100];
    if (!q || !find(q->backup)) {
        rpc_call_finish(call, ST_NOT_FOUND, "fake: no such backup");
    } else {
        snprintf(op, sizeof op, "operations/%s/tables/%s/1", q->parent, q->table_id);
        answer_op(call, op, false, NULL, NULL);
    }
    if (q)
        google__bigtable__admin__v2__restore_table_request__free_unpacked(q, NULL);
}

/* Every operation is done at its first poll. */
static void h_get_op(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Longrunning__GetOperationRequest *q =
        google__longrunning__get_operation_request__unpack(NULL, req.len, req.data);
    char name[1024] = "";
    if (q && !strncmp(q->name, "operations/", 11)) {
        snprintf(name, sizeof name, "%s", q->name + 11);
        char *slash = strrchr(name, '/');
        if (slash)
            *slash = '\0';
    }
    fb *b = find(name);
    Google__Protobuf__Timestamp ts[3];
    Google__Bigtable__Admin__V2__Backup bm;
    if (b)
        backup_msg(b, &bm, ts);
    answer_op(call, q ? q->name : "", true, b ? &bm.base : NULL,
              "type.googleapis.com/google.bigtable.admin.v2.Backup");
    if (q)
        google__longrunning__get_operation_request__free_unpacked(q, NULL);
}

/* ---- the seeded backup b1 ---- */

static void seed_file(Strata__Internal__V1__BackupPiece *p, const char *piece, const char *name,
                      size_t size, unsigned seed) {
    char path[1500];
    snprintf(path, sizeof path, "%s/b1/%s", F.root, piece);
    mkdir(path, 0755);
    path_of(path, sizeof path, FB_PREFIX "b1", piece, name);
    FILE *f = fopen(path, "wb");
    uint32_t crc = 0;
    for (size_t i = 0; i < size; i++) {
        uint8_t c = (uint8_t)((i * 2654435761u + seed) >> 13);
        crc = st_crc32c(crc, &c, 1);
        fputc(c, f);
    }
    fclose(f);
    Strata__Internal__V1__BackupFile *bf = calloc(1, sizeof *bf);
    strata__internal__v1__backup_file__init(bf);
    bf->name = strdup(name);
    bf->size = size;
    bf->crc32c = crc;
    p->files = realloc(p->files, (p->n_files + 1) * sizeof *p->files);
    p->files[p->n_files++] = bf;
    p->size_bytes += size;
}

static Strata__Internal__V1__BackupPiece *seed_piece(const char *id, const char *start,
                                                     const char *end) {
    Strata__Internal__V1__BackupPiece *p = calloc(1, sizeof *p);
    strata__internal__v1__backup_piece__init(p);
    p->backup = strdup(FB_PREFIX "b1");
    p->piece = strdup(id);
    p->table_name = strdup("projects/p/instances/i/tables/t");
    p->start_key.data = (uint8_t *)strdup(start);
    p->start_key.len = strlen(start);
    p->end_key.data = (uint8_t *)strdup(end);
    p->end_key.len = strlen(end);
    p->frozen_us = st_wall_us();
    p->node_num = 1;
    return p;
}

static void seed(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/b1", F.root);
    mkdir(F.root, 0755);
    mkdir(path, 0755);
    fb *b = fb_new(FB_PREFIX "b1", "projects/p/instances/i/tables/t");
    b->ready = true;
    b->pieces[0] = seed_piece("p0", "", "m");
    uint64_t big = F.window ? (9u << 20) + 17 : (3u << 20) + 17;
    seed_file(b->pieces[0], "p0", "000001.sst", big, 1);
    seed_file(b->pieces[0], "p0", "000002.sst", 0, 2);
    b->pieces[1] = seed_piece("p1", "m", "");
    seed_file(b->pieces[1], "p1", "000003.sst", 100 << 10, 3);
    seed_file(b->pieces[1], "p1", "000001.sst", big, 1); /* shared with p0, as after a split */
    b->n = 2;
}

int main(int argc, char **argv) {
    if (argc != 2 &&
        !(argc == 3 && (!strcmp(argv[2], "--drop-once") || !strcmp(argv[2], "--window")))) {
        fprintf(stderr, "usage: backup_fake_server ROOT [--drop-once | --window]\n");
        return 2;
    }
    snprintf(F.root, sizeof F.root, "%s", argv[1]);
    F.drop_once = argc == 3 && !strcmp(argv[2], "--drop-once");
    F.window = argc == 3 && !strcmp(argv[2], "--window");
    seed();
    struct event_base *base = event_base_new();
    F.base = base;
    st_err err = {0};
    rpc_server *s = rpc_server_new(base, NULL, &err);
    if (!s)
        return 1;
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BA "/strata.internal.v1.BackupAdmin/"
#define NO "/strata.internal.v1.Node/"
    static const struct {
        const char *path;
        rpc_handler_fn fn;
    } methods[] = {
        {TA "CreateBackup", h_create},
        {TA "GetBackup", h_get},
        {TA "ListBackups", h_list},
        {TA "DeleteBackup", h_delete},
        {TA "RestoreTable", h_restore},
        {"/google.longrunning.Operations/GetOperation", h_get_op},
        {BA "DescribeBackup", h_describe},
        {BA "BeginImport", h_begin},
        {BA "FinishImport", h_finish},
        {NO "ReadBackupFile", h_read_file},
        {NO "WriteBackupFile", h_write_file},
        {NO "SealBackupPiece", h_seal},
        {NO "DeleteBackupPieces", h_delete_pieces},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        rpc_server_add_method(s, methods[i].path, methods[i].fn, NULL);
    uint16_t port;
    if (rpc_server_listen(s, "127.0.0.1", 0, &port, &err) != ST_OK) {
        fprintf(stderr, "fake: %s\n", err.msg);
        return 1;
    }
    snprintf(F.addr, sizeof F.addr, "127.0.0.1:%u", port);
    printf("fake listening on %s\n", F.addr);
    fflush(stdout);
    event_base_dispatch(base);
    return 0;
}
