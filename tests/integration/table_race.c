/* table_race.c — CreateTable and RestoreTable of one table id through two routers of one
 * instance, for table_race_test.sh. Both make tablets under the table's name and write its record
 * only at the end, so without an agreement between routers both could run: the table would end
 * with one's schema and the other's tablets (a restore also drops the name's tablets first, a
 * table created a moment ago included). Each must reserve the id (rtr_bk_reserve_table): exactly
 * one proceeds, the other answers ALREADY_EXISTS, and the table is wholly the winner's.
 *   table_race ADDR_A ADDR_B ROUNDS
 * Rounds: RestoreTable through A and CreateTable through B released together; then CreateTable
 * through A and at once RestoreTable through B (whose copy of the metadata is a moment old); then
 * a RestoreTable through A waited for and at once CreateTable through B. After each, both routers
 * must show the winner's families, and the table the winner's rows (the backup's 3, or none).
 * Last, BeginImport of a backup ending before it starts, or of an unknown type, is refused.
 * Prints one line per step and "PASS" or "FAIL"; exit 0 on PASS. Deadlines are hang guards. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/internal/v1/backup_admin.pb-c.h"
#include "strata/rpc.h"

#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BT "/google.bigtable.v2.Bigtable/"
#define BA "/strata.internal.v1.BackupAdmin/"
#define LRO "/google.longrunning.Operations/"
#define INST "projects/p/instances/i"
#define CLUSTER INST "/clusters/east"
#define BACKUP CLUSTER "/backups/tb"
#define TIMEOUT_MS 30000
#define POLLS 1200 /* hang guard: 2 minutes at 100 ms */
#define ROWS 3

static st_slice pack(const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        abort();
    return st_slice_make(buf, protobuf_c_message_pack(m, buf));
}

/* Sends m (freed after) to addr; resp may be NULL. */
static st_code call(const char *addr, const char *method, const ProtobufCMessage *m, st_buf *resp,
                    st_err *err) {
    st_slice req = pack(m);
    st_buf own;
    st_buf_init(&own);
    st_code rc =
        rpc_blocking_unary(addr, NULL, method, req, NULL, 0, TIMEOUT_MS, resp ? resp : &own, err);
    st_buf_free(&own);
    free((void *)req.data);
    return rc;
}

static st_code create_table(const char *addr, const char *id, const char *family, st_err *err) {
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e;
    google__bigtable__admin__v2__table__column_families_entry__init(&e);
    e.key = (char *)family;
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *es[1] = {&e};
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.n_column_families = 1;
    t.column_families = es;
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = (char *)INST;
    req.table_id = (char *)id;
    req.table = &t;
    return call(addr, TA "CreateTable", &req.base, NULL, err);
}

/* RestoreTable of BACKUP into id; op gets the operation's name. */
static st_code restore(const char *addr, const char *id, char *op, size_t cap, st_err *err) {
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = (char *)INST;
    req.table_id = (char *)id;
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = (char *)BACKUP;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call(addr, TA "RestoreTable", &req.base, &resp, err);
    Google__Longrunning__Operation *o =
        rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    snprintf(op, cap, "%s", o ? o->name : "");
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    st_buf_free(&resp);
    return rc;
}

/* Polls GetOperation until done; true when it ended without an error. */
static bool op_ok(const char *addr, const char *name) {
    Google__Longrunning__GetOperationRequest req;
    google__longrunning__get_operation_request__init(&req);
    req.name = (char *)name;
    for (int i = 0; i < POLLS; i++) {
        st_buf resp;
        st_buf_init(&resp);
        st_err err = {0};
        Google__Longrunning__Operation *o =
            call(addr, LRO "GetOperation", &req.base, &resp, &err) == ST_OK
                ? google__longrunning__operation__unpack(NULL, resp.len, resp.data)
                : NULL;
        st_buf_free(&resp);
        bool done = o && o->done,
             ok = done && o->result_case != GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
        if (done && !ok)
            printf("operation %s failed: %s\n", name, o->error->message);
        if (o)
            google__longrunning__operation__free_unpacked(o, NULL);
        if (done)
            return ok;
        usleep(100 * 1000);
    }
    printf("operation %s never finished\n", name);
    return false;
}

typedef struct racer {
    const char *addr, *id;
    bool is_restore;
    pthread_barrier_t *go;
    st_code code;
    st_err err;
    char op[512];
} racer;

static void *racer_main(void *arg) {
    racer *s = arg;
    pthread_barrier_wait(s->go);
    s->code = s->is_restore ? restore(s->addr, s->id, s->op, sizeof s->op, &s->err)
                            : create_table(s->addr, s->id, "other", &s->err);
    return NULL;
}

static bool write_row(const char *addr, const char *table, const char *key) {
    Google__Bigtable__V2__Mutation__SetCell set;
    google__bigtable__v2__mutation__set_cell__init(&set);
    set.family_name = (char *)"cf";
    set.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    set.timestamp_micros = -1;
    set.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    Google__Bigtable__V2__Mutation m;
    google__bigtable__v2__mutation__init(&m);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &set;
    Google__Bigtable__V2__Mutation *ms[1] = {&m};
    char name[256];
    snprintf(name, sizeof name, INST "/tables/%s", table);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = name;
    req.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = ms;
    st_err err = {0};
    if (call(addr, BT "MutateRow", &req.base, NULL, &err) == ST_OK)
        return true;
    printf("MutateRow %s/%s: %s\n", table, key, err.msg);
    return false;
}

static void count_rows(st_slice msg, void *arg) {
    Google__Bigtable__V2__ReadRowsResponse *r =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    for (size_t i = 0; r && i < r->n_chunks; i++)
        *(int *)arg +=
            r->chunks[i]->row_status_case ==
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW &&
            r->chunks[i]->commit_row;
    if (r)
        google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
}

/* Rows of table read through addr (-1 on an error). */
static int rows_of(const char *addr, const char *table) {
    char name[256];
    snprintf(name, sizeof name, INST "/tables/%s", table);
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = name;
    st_slice r = pack(&req.base);
    int n = 0;
    st_err err = {0};
    st_code rc = rpc_blocking_stream(addr, NULL, BT "ReadRows", r, NULL, 0, TIMEOUT_MS, count_rows,
                                     &n, &err);
    free((void *)r.data);
    if (rc != ST_OK)
        printf("ReadRows %s through %s: %s\n", table, addr, err.msg);
    return rc == ST_OK ? n : -1;
}

/* The one family of table as addr shows it ("" when not found, "?" when several). */
static void family_of(const char *addr, const char *table, char *out, size_t cap) {
    char name[256];
    snprintf(name, sizeof name, INST "/tables/%s", table);
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    Google__Bigtable__Admin__V2__Table *t =
        call(addr, TA "GetTable", &req.base, &resp, &err) == ST_OK
            ? google__bigtable__admin__v2__table__unpack(NULL, resp.len, resp.data)
            : NULL;
    snprintf(out, cap, "%s",
             !t                          ? ""
             : t->n_column_families == 1 ? t->column_families[0]->key
                                         : "?");
    if (t)
        google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    st_buf_free(&resp);
}

/* Both routers show table with family only (within the metadata reload) and rows rows. */
static bool table_is(const char *a, const char *b, const char *table, const char *family,
                     int rows) {
    const char *addrs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        char got[128] = "";
        for (int i = 0; i < POLLS && strcmp(got, family); i++) {
            family_of(addrs[k], table, got, sizeof got);
            if (strcmp(got, family))
                usleep(100 * 1000);
        }
        int n = rows_of(addrs[k], table);
        printf("  table %s through %s: family '%s', %d rows\n", table, addrs[k], got, n);
        if (strcmp(got, family) || n != rows) {
            printf("  want family '%s' and %d rows: a mixed or lost table\n", family, rows);
            return false;
        }
    }
    return true;
}

/* RestoreTable through a and CreateTable through b released together. */
static bool round_together(const char *a, const char *b, int n) {
    char id[32];
    snprintf(id, sizeof id, "x%d", n);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    racer s[2] = {{.addr = a, .id = id, .is_restore = true, .go = &go},
                  {.addr = b, .id = id, .is_restore = false, .go = &go}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, racer_main, &s[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    printf("round %d %s: RestoreTable through A %s, CreateTable through B %s\n", n, id,
           st_code_name(s[0].code), st_code_name(s[1].code));
    for (int i = 0; i < 2; i++)
        if (s[i].code != ST_OK)
            printf("  %s: %s\n", i ? "CreateTable" : "RestoreTable", s[i].err.msg);
    int ok = (s[0].code == ST_OK) + (s[1].code == ST_OK);
    int taken = (s[0].code == ST_ALREADY_EXISTS) + (s[1].code == ST_ALREADY_EXISTS);
    if (ok != 1 || taken != 1)
        return false;
    if (s[0].code == ST_OK && !op_ok(a, s[0].op))
        return false;
    return s[0].code == ST_OK ? table_is(a, b, id, "cf", ROWS) : table_is(a, b, id, "other", 0);
}

/* CreateTable through a, then at once RestoreTable through b: b must not drop the new table. */
static bool round_create_then_restore(const char *a, const char *b) {
    st_err err = {0};
    char op[512];
    if (create_table(a, "y", "other", &err) != ST_OK) {
        printf("CreateTable y: %s\n", err.msg);
        return false;
    }
    st_code rc = restore(b, "y", op, sizeof op, &err);
    printf("CreateTable y through A, then RestoreTable y through B: %s%s%s\n", st_code_name(rc),
           rc == ST_OK ? "" : ": ", rc == ST_OK ? "" : err.msg);
    if (rc == ST_OK)
        op_ok(b, op);
    return rc == ST_ALREADY_EXISTS && table_is(a, b, "y", "other", 0);
}

/* RestoreTable through a waited for, then at once CreateTable through b. */
static bool round_restore_then_create(const char *a, const char *b) {
    st_err err = {0};
    char op[512];
    if (restore(a, "z", op, sizeof op, &err) != ST_OK || !op_ok(a, op)) {
        printf("RestoreTable z: %s\n", err.msg);
        return false;
    }
    st_code rc = create_table(b, "z", "other", &err);
    printf("RestoreTable z through A, then CreateTable z through B: %s%s%s\n", st_code_name(rc),
           rc == ST_OK ? "" : ": ", rc == ST_OK ? "" : err.msg);
    return rc == ST_ALREADY_EXISTS && table_is(a, b, "z", "cf", ROWS);
}

/* Table t with ROWS rows and backup tb of it, READY. */
static bool setup(const char *a) {
    st_err err = {0};
    if (create_table(a, "t", "cf", &err) != ST_OK) {
        printf("CreateTable t: %s\n", err.msg);
        return false;
    }
    for (int i = 0; i < ROWS; i++) {
        char key[16];
        snprintf(key, sizeof key, "r%d", i);
        if (!write_row(a, "t", key))
            return false;
    }
    Google__Protobuf__Timestamp exp;
    google__protobuf__timestamp__init(&exp);
    exp.seconds = st_wall_us() / 1000000 + 24 * 3600;
    Google__Bigtable__Admin__V2__Backup bk;
    google__bigtable__admin__v2__backup__init(&bk);
    bk.source_table = (char *)INST "/tables/t";
    bk.expire_time = &exp;
    Google__Bigtable__Admin__V2__CreateBackupRequest req;
    google__bigtable__admin__v2__create_backup_request__init(&req);
    req.parent = (char *)CLUSTER;
    req.backup_id = (char *)"tb";
    req.backup = &bk;
    st_buf resp;
    st_buf_init(&resp);
    Google__Longrunning__Operation *o =
        call(a, TA "CreateBackup", &req.base, &resp, &err) == ST_OK
            ? google__longrunning__operation__unpack(NULL, resp.len, resp.data)
            : NULL;
    st_buf_free(&resp);
    bool ok = o && op_ok(a, o->name);
    if (!o)
        printf("CreateBackup tb: %s\n", err.msg);
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    return ok;
}

/* BeginImport (what `strata backup import` sends, from an export's manifest) of a backup whose
 * end is before its start, or whose type is unknown, is INVALID_ARGUMENT naming the field: a
 * client that skipped the manifest's checks must not record such a backup either. */
static bool import_refused(const char *addr, int64_t start_s, int64_t end_s, int type,
                           const char *field) {
    Google__Protobuf__Timestamp st, en, exp;
    google__protobuf__timestamp__init(&st);
    google__protobuf__timestamp__init(&en);
    google__protobuf__timestamp__init(&exp);
    st.seconds = start_s;
    en.seconds = end_s;
    exp.seconds = st_wall_us() / 1000000 + 24 * 3600;
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)INST "/tables/t";
    b.start_time = &st;
    b.end_time = &en;
    b.expire_time = &exp;
    b.backup_type = (Google__Bigtable__Admin__V2__Backup__BackupType)type;
    Google__Bigtable__Admin__V2__Table schema;
    google__bigtable__admin__v2__table__init(&schema);
    Strata__Internal__V1__BackupPiece p;
    strata__internal__v1__backup_piece__init(&p);
    p.piece = (char *)"p0";
    p.table_name = (char *)INST "/tables/t";
    Strata__Internal__V1__BackupPiece *ps[1] = {&p};
    Strata__Internal__V1__BeginImportRequest req;
    strata__internal__v1__begin_import_request__init(&req);
    req.parent = (char *)CLUSTER;
    req.backup_id = (char *)"imp";
    req.backup = &b;
    req.schema = &schema;
    req.n_pieces = 1;
    req.pieces = ps;
    st_err err = {0};
    st_code rc = call(addr, BA "BeginImport", &req.base, NULL, &err);
    printf("BeginImport start %lld end %lld type %d: %s %s\n", (long long)start_s, (long long)end_s,
           type, st_code_name(rc), err.msg);
    return rc == ST_INVALID_ARGUMENT && strstr(err.msg, field);
}

/* Waits until the router at addr knows backup tb (its metadata reloads every second). */
static bool backup_known(const char *addr) {
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = (char *)BACKUP;
    for (int i = 0; i < POLLS; i++) {
        st_err err = {0};
        if (call(addr, TA "GetBackup", &req.base, NULL, &err) == ST_OK)
            return true;
        usleep(100 * 1000);
    }
    printf("router %s never showed backup tb\n", addr);
    return false;
}

int main(int argc, char **argv) {
    if (argc != 4 || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: table_race ADDR_A ADDR_B ROUNDS\n");
        return 2;
    }
    const char *a = argv[1], *b = argv[2];
    if (!setup(a) || !backup_known(b))
        return 1;
    bool pass = true;
    for (int r = 1; r <= atoi(argv[3]); r++)
        pass = round_together(a, b, r) && pass;
    pass = round_create_then_restore(a, b) && pass;
    pass = round_restore_then_create(a, b) && pass;
    int64_t now = st_wall_us() / 1000000;
    pass = import_refused(a, now - 60, now - 120, 1, "end_time") && pass;
    pass = import_refused(a, now - 60, now - 59, 3, "backup_type") && pass;
    printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
