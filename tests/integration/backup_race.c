/* backup_race.c — one backup id (or one restore target) asked of two routers of one instance at
 * the same moment, for backup_race_test.sh. Each round sends the same request through router A
 * and router B from two threads released together: CreateBackup, CopyBackup, RestoreTable and
 * BeginImport (the `strata backup import` step that records the backup). Exactly one must be
 * accepted and the other answer ALREADY_EXISTS (the name is taken with a compare-and-set in the
 * metadata table, not checked against each router's own copy). Stale rounds send through A and
 * right after through B, whose copy of the metadata has not been reloaded yet: B must still
 * answer ALREADY_EXISTS. Update rounds send three UpdateBackup (expire_time) and a DeleteBackup of
 * one READY backup through router A at once: once the delete answered OK the backup must stay
 * NOT_FOUND (an update that read the record before the delete used to write it back).
 *   backup_race ADDR_A ADDR_B ROUNDS
 * Prints one line per round and "PASS" or "FAIL"; exit 0 on PASS, 1 on FAIL, 2 on bad usage.
 * The call deadlines are hang guards only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/rpc.h"

#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BA "/strata.internal.v1.BackupAdmin/"
#define LRO "/google.longrunning.Operations/"
#define INST "projects/p/instances/i"
#define CLUSTER INST "/clusters/east"
#define TABLE INST "/tables/t"
#define TIMEOUT_MS 30000
#define POLLS 1200 /* hang guard: 2 minutes at 100 ms */

typedef struct racer {
    const char *addr, *method;
    st_slice req;
    pthread_barrier_t *go;
    st_code code;
    char msg[sizeof(((st_err *)0)->msg)];
    st_buf resp;
} racer;

static void send_req(racer *s) {
    st_err err = {0};
    st_buf_init(&s->resp);
    s->code =
        rpc_blocking_unary(s->addr, NULL, s->method, s->req, NULL, 0, TIMEOUT_MS, &s->resp, &err);
    snprintf(s->msg, sizeof s->msg, "%s", err.msg);
}

static void *racer_main(void *arg) {
    racer *s = arg;
    pthread_barrier_wait(s->go);
    send_req(s);
    return NULL;
}

static st_slice pack(const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        abort();
    return st_slice_make(buf, protobuf_c_message_pack(m, buf));
}

/* Sends req through a and b (together, or a then b when stale); true when exactly one is
 * accepted and the other ALREADY_EXISTS. *winner: the router that accepted (NULL if none). */
static bool race(const char *what, const char *a, const char *b, const char *method, st_slice req,
                 bool stale, const char **winner) {
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    racer s[2] = {{.addr = a, .method = method, .req = req, .go = &go},
                  {.addr = b, .method = method, .req = req, .go = &go}};
    if (stale) {
        send_req(&s[0]);
        send_req(&s[1]);
    } else {
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, racer_main, &s[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
    }
    pthread_barrier_destroy(&go);
    int ok = (s[0].code == ST_OK) + (s[1].code == ST_OK);
    int taken = (s[0].code == ST_ALREADY_EXISTS) + (s[1].code == ST_ALREADY_EXISTS);
    printf("%s%s: A %s, B %s\n", what, stale ? " (A then B)" : "", st_code_name(s[0].code),
           st_code_name(s[1].code));
    for (int i = 0; i < 2; i++)
        if (s[i].code != ST_OK)
            printf("  %c: %s\n", 'A' + i, s[i].msg);
    *winner = s[0].code == ST_OK ? a : s[1].code == ST_OK ? b : NULL;
    for (int i = 0; i < 2; i++)
        st_buf_free(&s[i].resp);
    free((void *)req.data);
    return ok == 1 && taken == 1;
}

static Google__Protobuf__Timestamp ts_from_now(int64_t s) {
    Google__Protobuf__Timestamp t;
    google__protobuf__timestamp__init(&t);
    t.seconds = st_wall_us() / 1000000 + s;
    return t;
}

static st_slice create_req(const char *id) {
    Google__Protobuf__Timestamp exp = ts_from_now(24 * 3600);
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)TABLE;
    b.expire_time = &exp;
    Google__Bigtable__Admin__V2__CreateBackupRequest req;
    google__bigtable__admin__v2__create_backup_request__init(&req);
    req.parent = (char *)CLUSTER;
    req.backup_id = (char *)id;
    req.backup = &b;
    return pack(&req.base);
}

static st_slice copy_req(const char *src, const char *id) {
    Google__Protobuf__Timestamp exp = ts_from_now(24 * 3600);
    Google__Bigtable__Admin__V2__CopyBackupRequest req;
    google__bigtable__admin__v2__copy_backup_request__init(&req);
    req.parent = (char *)CLUSTER;
    req.backup_id = (char *)id;
    req.source_backup = (char *)src;
    req.expire_time = &exp;
    return pack(&req.base);
}

static st_slice restore_req(const char *src, const char *table_id) {
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = (char *)INST;
    req.table_id = (char *)table_id;
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = (char *)src;
    return pack(&req.base);
}

/* BeginImport of one empty piece covering every key (what an export of an empty table says). */
static st_slice import_req(const char *id) {
    Google__Protobuf__Timestamp st = ts_from_now(-60), en = ts_from_now(-59),
                                exp = ts_from_now(24 * 3600);
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)TABLE;
    b.start_time = &st;
    b.end_time = &en;
    b.expire_time = &exp;
    Google__Bigtable__Admin__V2__Table schema;
    google__bigtable__admin__v2__table__init(&schema);
    schema.name = (char *)TABLE;
    Strata__Internal__V1__BackupPiece p;
    strata__internal__v1__backup_piece__init(&p);
    p.piece = (char *)"p0";
    p.table_name = (char *)TABLE;
    Strata__Internal__V1__BackupPiece *ps[1] = {&p};
    Strata__Internal__V1__BeginImportRequest req;
    strata__internal__v1__begin_import_request__init(&req);
    req.parent = (char *)CLUSTER;
    req.backup_id = (char *)id;
    req.backup = &b;
    req.schema = &schema;
    req.n_pieces = 1;
    req.pieces = ps;
    return pack(&req.base);
}

/* Waits until both routers answer GetBackup READY for name. */
static bool ready_on_both(const char *a, const char *b, const char *name) {
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = (char *)name;
    uint8_t buf[512];
    size_t len = google__bigtable__admin__v2__get_backup_request__pack(&req, buf);
    int ready = 0;
    for (int i = 0; i < POLLS && ready < 2; i++) {
        ready = 0;
        const char *addrs[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            st_buf resp;
            st_buf_init(&resp);
            st_err err = {0};
            if (rpc_blocking_unary(addrs[k], NULL, TA "GetBackup", st_slice_make(buf, len), NULL, 0,
                                   TIMEOUT_MS, &resp, &err) == ST_OK) {
                Google__Bigtable__Admin__V2__Backup *bk =
                    google__bigtable__admin__v2__backup__unpack(NULL, resp.len, resp.data);
                ready += bk && bk->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
                if (bk)
                    google__bigtable__admin__v2__backup__free_unpacked(bk, NULL);
            }
            st_buf_free(&resp);
        }
        if (ready < 2)
            usleep(100 * 1000);
    }
    if (ready < 2)
        printf("backup %s never became READY on both routers\n", name);
    return ready == 2;
}

static bool make_table(const char *a) {
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e;
    google__bigtable__admin__v2__table__column_families_entry__init(&e);
    e.key = (char *)"cf";
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *es[1] = {&e};
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.n_column_families = 1;
    t.column_families = es;
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = (char *)INST;
    req.table_id = (char *)"t";
    req.table = &t;
    st_slice r = pack(&req.base);
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    st_code rc = rpc_blocking_unary(a, NULL, TA "CreateTable", r, NULL, 0, TIMEOUT_MS, &resp, &err);
    free((void *)r.data);
    st_buf_free(&resp);
    if (rc != ST_OK)
        printf("CreateTable: %s\n", err.msg);
    return rc == ST_OK;
}

/* Waits until the router at addr knows table t (its metadata reloads every second). */
static bool table_known(const char *addr) {
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = (char *)TABLE;
    uint8_t buf[256];
    size_t len = google__bigtable__admin__v2__get_table_request__pack(&req, buf);
    for (int i = 0; i < POLLS; i++) {
        st_buf resp;
        st_buf_init(&resp);
        st_err err = {0};
        st_code rc = rpc_blocking_unary(addr, NULL, TA "GetTable", st_slice_make(buf, len), NULL, 0,
                                        TIMEOUT_MS, &resp, &err);
        st_buf_free(&resp);
        if (rc == ST_OK)
            return true;
        usleep(100 * 1000);
    }
    printf("router %s never showed table t\n", addr);
    return false;
}

/* One round: a backup id raced, then a copy id, a restore target and an import id. */
static bool round_run(const char *a, const char *b, int n, bool stale) {
    char id[64], name[256], copy[64], table[64], imp[64];
    const char *who = NULL, *w2 = NULL;
    snprintf(id, sizeof id, "b%d%s", n, stale ? "s" : "");
    snprintf(name, sizeof name, CLUSTER "/backups/%s", id);
    snprintf(copy, sizeof copy, "c%d%s", n, stale ? "s" : "");
    snprintf(table, sizeof table, "r%d%s", n, stale ? "s" : "");
    snprintf(imp, sizeof imp, "i%d%s", n, stale ? "s" : "");
    char label[96];
    snprintf(label, sizeof label, "round %d CreateBackup %s", n, id);
    bool pass = race(label, a, b, TA "CreateBackup", create_req(id), stale, &who);
    if (!who || !ready_on_both(a, b, name))
        return false;
    snprintf(label, sizeof label, "round %d CopyBackup %s", n, copy);
    pass = race(label, a, b, TA "CopyBackup", copy_req(name, copy), stale, &w2) && pass;
    snprintf(label, sizeof label, "round %d RestoreTable %s", n, table);
    pass = race(label, a, b, TA "RestoreTable", restore_req(name, table), stale, &w2) && pass;
    snprintf(label, sizeof label, "round %d BeginImport %s", n, imp);
    pass = race(label, a, b, BA "BeginImport", import_req(imp), stale, &w2) && pass;
    return pass;
}

static st_slice update_req(const char *name, int64_t s) {
    Google__Protobuf__Timestamp exp = ts_from_now(s);
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.name = (char *)name;
    b.expire_time = &exp;
    char *paths[1] = {(char *)"expire_time"};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.n_paths = 1;
    mask.paths = paths;
    Google__Bigtable__Admin__V2__UpdateBackupRequest req;
    google__bigtable__admin__v2__update_backup_request__init(&req);
    req.backup = &b;
    req.update_mask = &mask;
    return pack(&req.base);
}

static st_code get_backup(const char *addr, const char *name) {
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = (char *)name;
    racer s = {.addr = addr, .method = TA "GetBackup", .req = pack(&req.base)};
    send_req(&s);
    st_buf_free(&s.resp);
    free((void *)s.req.data);
    return s.code;
}

/* Three UpdateBackup and a DeleteBackup of one READY backup through a at once: once the delete
 * answered OK, the backup is NOT_FOUND. */
static bool update_delete_round(const char *a, const char *b, int n) {
    char id[64], name[256];
    snprintf(id, sizeof id, "u%d", n);
    snprintf(name, sizeof name, CLUSTER "/backups/%s", id);
    racer mk = {.addr = a, .method = TA "CreateBackup", .req = create_req(id)};
    send_req(&mk);
    st_buf_free(&mk.resp);
    free((void *)mk.req.data);
    if (mk.code != ST_OK || !ready_on_both(a, b, name)) {
        printf("update round %d: CreateBackup %s %s\n", n, st_code_name(mk.code), mk.msg);
        return false;
    }
    Google__Bigtable__Admin__V2__DeleteBackupRequest del;
    google__bigtable__admin__v2__delete_backup_request__init(&del);
    del.name = name;
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 4);
    racer s[4];
    for (int i = 0; i < 4; i++)
        s[i] = (racer){.addr = a,
                       .method = TA "UpdateBackup",
                       .go = &go,
                       .req = update_req(name, 48 * 3600 + i)};
    free((void *)s[3].req.data);
    s[3].method = TA "DeleteBackup";
    s[3].req = pack(&del.base);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, racer_main, &s[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 4; i++) {
        st_buf_free(&s[i].resp);
        free((void *)s[i].req.data);
    }
    st_code after = get_backup(a, name);
    printf("update round %d: updates %s %s %s, delete %s, then GetBackup %s\n", n,
           st_code_name(s[0].code), st_code_name(s[1].code), st_code_name(s[2].code),
           st_code_name(s[3].code), st_code_name(after));
    return s[3].code == ST_OK && after == ST_NOT_FOUND;
}

int main(int argc, char **argv) {
    if (argc != 4 || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: backup_race ADDR_A ADDR_B ROUNDS\n");
        return 2;
    }
    if (!make_table(argv[1]) || !table_known(argv[2]))
        return 1;
    bool pass = true;
    for (int r = 1; r <= atoi(argv[3]); r++)
        pass = round_run(argv[1], argv[2], r, false) && pass;
    pass = round_run(argv[1], argv[2], 1, true) && pass;
    for (int r = 1; r <= atoi(argv[3]); r++)
        pass = update_delete_round(argv[1], argv[2], r) && pass;
    printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
