/*
 * Proves that finishing an operation whose router is gone removes only that operation's own
 * work (docs/backups.md, "Operations"): a CreateBackup whose backup id another operation holds
 * (it was refused, but its record outlived its router) must not delete that operation's backup.
 *
 * On a local instance (`strata up`, one cluster of one node): backup b1 is made; then, written
 * straight into the metadata table as routers write them, b1's record is turned CREATING by a
 * running operation X (lease far ahead: nobody finishes it), and an operation Y of the same
 * backup id, not done, whose router is gone (lease past). The router's sweep finishes Y: it must
 * end ABORTED saying nothing was removed, and b1's record (still X's) and its pieces on the node
 * must stay. Before the check, Y's cleanup deleted b1's pieces and record. Likewise a
 * RestoreTable into t2 whose claim a CreateTable on another router holds (its tablet made, its
 * record not yet): finishing the restore must not drop t2's tablet (it did, by name).
 *
 * A live operation that fails checks the same before its cleanup. With the second node stopped
 * (so the operation stays at its first step), a RestoreTable into t3 whose claim is then taken
 * by a CreateTable elsewhere (its tablet made on the first node), and a CreateBackup b3 whose
 * record then names another running operation (as after the backup was deleted and created
 * again through another router), are cancelled: each must end CANCELLED saying nothing was
 * removed, t3's tablet stays, and b3's record (the other operation's) and its pieces on the first
 * node stay. Before, the cancelled restore dropped t3's tablet and the cancelled backup deleted
 * b3's pieces and record, by name.
 *
 *   backup_reap_test <build>/ops/strata
 * Exit 77 when the strata binary (or strata-node / strata-router next to it) is missing.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "btclient.h"
#include "chaos_util.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/router_records.pb-c.h"

#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define LRO "/google.longrunning.Operations/"
#define INST "projects/p/instances/i"
#define POLLS_MAX 1200 /* hang guard (2 min at 100 ms), not a timing assertion */
#define MD_TYPE "type.googleapis.com/google.bigtable.admin.v2.CreateBackupMetadata"

static bt_client g_cl, g_md; /* the router; the first node's metadata table */
static char g_cluster[256], g_b1[512], g_b3[512];
static pid_t g_stopped; /* the second node while it is stopped (continued on failure) */

static st_code op_wait(const char *name, char *msg, size_t cap) {
    return ci_op_wait(name, POLLS_MAX, msg, cap);
}

/* The state GetBackup answers (0 when NOT_FOUND or failing). */
static int backup_state(void) {
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = g_b1;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    int state = 0;
    if (bt_call_pb(ci_router, TA "GetBackup", &req.base, 10000, &resp, &st) == ST_OK) {
        Google__Bigtable__Admin__V2__Backup *b =
            google__bigtable__admin__v2__backup__unpack(NULL, resp.len, resp.data);
        state = b ? (int)b->state : 0;
        if (b)
            google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    }
    st_buf_free(&resp);
    return state;
}

/* CreateBackup id of t: the operation's name into op (the call answered, the backup CREATING). */
static void start_backup(const char *id, char *op, size_t cap) {
    st_err st;
    if (ci_create_backup(g_cluster, INST "/tables/t", id, 86400, 0, op, cap, &st) != ST_OK)
        ci_fail("CreateBackup %s: %s", id, st.msg);
}

static void create_b1(void) {
    char op[512], msg[512];
    start_backup("b1", op, sizeof op);
    st_code rc = op_wait(op, msg, sizeof msg);
    if (rc != ST_OK)
        ci_fail("backup b1 failed: %s %s", st_code_name(rc), msg);
}

/* ---- the metadata table, as routers write it (docs/formats/metadata.md) ---- */

typedef struct md_got {
    st_buf value;
    bool found;
} md_got;

static void md_row(const bt_row *row, void *arg) {
    md_got *g = arg;
    for (size_t i = 0; i < row->n_cells; i++) {
        st_buf_reset(&g->value);
        st_buf_append(&g->value, row->cells[i].value.data, row->cells[i].value.len);
        g->found = true;
    }
}

static void md_read(const char *key, md_got *g) {
    st_arena a;
    st_arena_init(&a, 1024);
    Google__Bigtable__V2__RowSet *rows = bt_rowset_new(&a);
    bt_rowset_add_key(&a, rows, st_slice_cstr(key));
    bt_read_req req = {.rows = rows};
    st_err st;
    g->found = false;
    if (bt_read_rows(&g_md, "metadata", &req, md_row, g, &st) != ST_OK)
        ci_fail("reading %s from the metadata table: %s", key, st.msg);
    st_arena_deinit(&a);
}

static void md_write(const char *key, st_slice value) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "m", st_slice_cstr("v"), st_wall_us() / 1000 * 1000, value);
    st_err st;
    if (bt_mutate_row(&g_md, "metadata", st_slice_cstr(key), &m, &st) != ST_OK)
        ci_fail("writing %s to the metadata table: %s", key, st.msg);
    bt_muts_deinit(&m);
}

/* An operation that is not done, owned by a router elsewhere: metadata md of type type. */
static void md_write_op(const char *op, int64_t lease_until_us, const char *type,
                        const ProtobufCMessage *md) {
    uint8_t mdbuf[2048];
    size_t mdlen = protobuf_c_message_pack(md, mdbuf);
    Google__Protobuf__Any any;
    google__protobuf__any__init(&any);
    any.type_url = (char *)type;
    any.value = (ProtobufCBinaryData){mdlen, mdbuf};
    Google__Longrunning__Operation o;
    google__longrunning__operation__init(&o);
    o.name = (char *)op;
    o.metadata = &any;
    Strata__Internal__V1__OperationRecord rec;
    strata__internal__v1__operation_record__init(&rec);
    rec.operation = &o;
    rec.owner = "10.9.9.9:1/1";
    rec.lease_until_us = lease_until_us;
    rec.created_us = st_wall_us();
    uint8_t buf[4096];
    size_t len = strata__internal__v1__operation_record__pack(&rec, buf);
    char key[600];
    snprintf(key, sizeof key, "op/%s", op);
    md_write(key, st_slice_make(buf, len));
}

/* A CreateBackup operation of backup. */
static void md_write_create_op(const char *op, int64_t lease_until_us, const char *backup) {
    Google__Bigtable__Admin__V2__CreateBackupMetadata md;
    google__bigtable__admin__v2__create_backup_metadata__init(&md);
    md.name = (char *)backup;
    md.source_table = INST "/tables/t";
    md_write_op(op, lease_until_us, MD_TYPE, &md.base);
}

/* backup's record in the metadata table (free with ..._free_unpacked), NULL when there is none. */
static Strata__Internal__V1__BackupRecord *md_record(const char *backup) {
    char key[600];
    snprintf(key, sizeof key, "backup/%s", backup);
    md_got g = {.found = false};
    st_buf_init(&g.value);
    md_read(key, &g);
    Strata__Internal__V1__BackupRecord *rec =
        g.found ? strata__internal__v1__backup_record__unpack(NULL, g.value.len, g.value.data)
                : NULL;
    st_buf_free(&g.value);
    return rec;
}

/* backup's record: CREATING by operation op. */
static void md_take(const char *backup, const char *op) {
    Strata__Internal__V1__BackupRecord *rec = md_record(backup);
    if (!rec || !rec->backup)
        ci_fail("%s's record is not in the metadata table", backup);
    rec->backup->state = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
    free(rec->operation);
    rec->operation = strdup(op);
    st_buf out;
    st_buf_init(&out);
    st_buf_reserve(&out, strata__internal__v1__backup_record__get_packed_size(rec));
    out.len = strata__internal__v1__backup_record__pack(rec, out.data);
    char key[600];
    snprintf(key, sizeof key, "backup/%s", backup);
    md_write(key, st_buf_slice(&out));
    st_buf_free(&out);
    strata__internal__v1__backup_record__free_unpacked(rec, NULL);
}

/* The operation backup's record in the metadata table names ("" when there is none). */
static void md_record_op(const char *backup, char *op, size_t cap) {
    Strata__Internal__V1__BackupRecord *rec = md_record(backup);
    snprintf(op, cap, "%s", rec && rec->operation ? rec->operation : "");
    if (rec)
        strata__internal__v1__backup_record__free_unpacked(rec, NULL);
}

/* Pieces of backup on the first node. */
static size_t node_pieces(const char *backup) {
    Strata__Internal__V1__ListBackupPiecesRequest req =
        STRATA__INTERNAL__V1__LIST_BACKUP_PIECES_REQUEST__INIT;
    req.backup = (char *)backup;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    size_t n = 0;
    if (bt_call_pb(g_md.addr, "/strata.internal.v1.Node/ListBackupPieces", &req.base, 10000, &resp,
                   &st) != ST_OK)
        ci_fail("ListBackupPieces on the node: %s", st.msg);
    Strata__Internal__V1__ListBackupPiecesResponse *r =
        strata__internal__v1__list_backup_pieces_response__unpack(NULL, resp.len, resp.data);
    n = r ? r->n_pieces : 0;
    if (r)
        strata__internal__v1__list_backup_pieces_response__free_unpacked(r, NULL);
    st_buf_free(&resp);
    return n;
}

/* ---- a restore whose table id a CreateTable holds ---- */

static st_code node_call(const char *method, const ProtobufCMessage *req, st_buf *resp,
                         st_err *st) {
    char path[128];
    snprintf(path, sizeof path, "/strata.internal.v1.Node/%s", method);
    return bt_call_pb(g_md.addr, path, req, 10000, resp, st);
}

/* Tablets of table on the first node. */
static size_t node_tablets(const char *table) {
    Strata__Internal__V1__ListTabletsRequest req = STRATA__INTERNAL__V1__LIST_TABLETS_REQUEST__INIT;
    req.table_name = (char *)table;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    if (node_call("ListTablets", &req.base, &resp, &st) != ST_OK)
        ci_fail("ListTablets: %s", st.msg);
    Strata__Internal__V1__ListTabletsResponse *r =
        strata__internal__v1__list_tablets_response__unpack(NULL, resp.len, resp.data);
    size_t n = r ? r->n_tablets : 0;
    if (r)
        strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    st_buf_free(&resp);
    return n;
}

/* A CreateTable of table runs on a router elsewhere: it holds the table's claim and has made its
 * tablet on the first node (as CreateTable makes them before it writes the table's record). */
static void plant_create_table(const char *table) {
    Google__Bigtable__Admin__V2__ColumnFamily cf = GOOGLE__BIGTABLE__ADMIN__V2__COLUMN_FAMILY__INIT;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e =
        GOOGLE__BIGTABLE__ADMIN__V2__TABLE__COLUMN_FAMILIES_ENTRY__INIT;
    e.key = "cf";
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *ev[] = {&e};
    Google__Bigtable__Admin__V2__Table t = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__INIT;
    t.name = (char *)table;
    t.column_families = ev;
    t.n_column_families = 1;
    Strata__Internal__V1__PutTableRequest put = STRATA__INTERNAL__V1__PUT_TABLE_REQUEST__INIT;
    put.table = &t;
    Strata__Internal__V1__CreateTabletRequest ct =
        STRATA__INTERNAL__V1__CREATE_TABLET_REQUEST__INIT;
    ct.table_name = (char *)table;
    st_err st;
    if (node_call("PutTable", &put.base, NULL, &st) != ST_OK ||
        node_call("CreateTablet", &ct.base, NULL, &st) != ST_OK)
        ci_fail("making %s's tablet on the node: %s", table, st.msg);
    char claim[128], key[600];
    snprintf(claim, sizeof claim, "tablecreate/%lld/10.9.9.9:1/1", (long long)st_wall_us());
    snprintf(key, sizeof key, "bkclaim/%s", table);
    md_write(key, st_slice_cstr(claim));
}

/* op's end, printed. */
static st_code op_end(const char *op, char *msg, size_t cap) {
    st_code code = op_wait(op, msg, cap);
    printf("%s ended %s: %s\n", op, st_code_name(code), msg);
    return code;
}

/* op ended want saying nothing was removed (checked after what it left, so that a failure
 * names what went). */
static void want_nothing_removed(const char *op, st_code code, const char *msg, st_code want) {
    if (code != want || !strstr(msg, "nothing was removed"))
        ci_fail("operation %s ended %s \"%s\", want %s with nothing removed", op,
                st_code_name(code), msg, st_code_name(want));
}

/* table's one tablet on the first node (before) is still there after op ended. */
static void want_tablet_kept(const char *table, size_t before, const char *op) {
    size_t after = node_tablets(table);
    printf("%s's tablets on the first node: %zu before, %zu after\n", table, before, after);
    if (before != 1 || after != before)
        ci_fail("operation %s dropped the tablets of the CreateTable holding %s (%zu before, %zu "
                "after)",
                op, table, before, after);
}

/* A RestoreTable into t2 (refused: the claim was taken by a CreateTable elsewhere) whose record
 * outlived its router is finished by the sweep: it must not drop t2's tablet. */
static void test_restore_claimed(void) {
    plant_create_table(INST "/tables/t2");
    size_t before = node_tablets(INST "/tables/t2");

    Google__Bigtable__Admin__V2__BackupInfo bi = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP_INFO__INIT;
    bi.backup = g_b1;
    Google__Bigtable__Admin__V2__RestoreTableMetadata md =
        GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_METADATA__INIT;
    md.name = INST "/tables/t2";
    md.source_type = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_SOURCE_TYPE__BACKUP;
    md.source_info_case =
        GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_METADATA__SOURCE_INFO_BACKUP_INFO;
    md.backup_info = &bi;
    const char *op = "operations/" INST "/tables/t2/555";
    md_write_op(op, 1, "type.googleapis.com/google.bigtable.admin.v2.RestoreTableMetadata",
                &md.base);
    char msg[1024];
    st_code code = op_end(op, msg, sizeof msg);
    want_tablet_kept(INST "/tables/t2", before, op);
    want_nothing_removed(op, code, msg, ST_ABORTED);
}

/* ---- a live operation that fails after its name went to another operation ---- */

static void node_stop(void) {
    g_stopped = ci_pid("east-1");
    kill(g_stopped, SIGSTOP);
}

static void node_continue(void) {
    if (g_stopped > 0)
        kill(g_stopped, SIGCONT);
    g_stopped = 0;
}

static void cancel(const char *op) {
    Google__Longrunning__CancelOperationRequest req;
    google__longrunning__cancel_operation_request__init(&req);
    req.name = (char *)op;
    st_err st;
    st_code rc = bt_call_pb(ci_router, LRO "CancelOperation", &req.base, 10000, NULL, &st);
    node_continue();
    if (rc != ST_OK)
        ci_fail("CancelOperation %s: %s", op, st.msg);
}

/* A RestoreTable into t3 stays at its first step (DropTable of t3 on every node: the second
 * one stopped); its claim on t3 then goes to a CreateTable elsewhere, which makes t3's tablet on
 * the first node. Cancelled, the restore must not drop that tablet. */
static void test_live_restore(void) {
    node_stop();
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = INST;
    req.table_id = "t3";
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = g_b1;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    if (bt_call_pb(ci_router, TA "RestoreTable", &req.base, 30000, &resp, &st) != ST_OK)
        ci_fail("RestoreTable t3: %s", st.msg);
    Google__Longrunning__Operation *o =
        google__longrunning__operation__unpack(NULL, resp.len, resp.data);
    char op[512];
    snprintf(op, sizeof op, "%s", o ? o->name : "");
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    st_buf_free(&resp);
    /* The restore's DropTable of t3 went out as it answered; the first node runs it in
     * milliseconds. t3's tablet is made there after it, as the CreateTable would be. */
    usleep(1000 * 1000);
    plant_create_table(INST "/tables/t3");
    size_t before = node_tablets(INST "/tables/t3");
    cancel(op);
    char msg[1024];
    st_code code = op_end(op, msg, sizeof msg);
    want_tablet_kept(INST "/tables/t3", before, op);
    want_nothing_removed(op, code, msg, ST_CANCELLED);
}

/* A CreateBackup b3 stays CREATING (the second node stopped); its record then names another
 * running operation Z, as when b3 was deleted and created again through another router.
 * Cancelled, the first operation must leave b3's record and pieces alone. */
static void test_live_create(void) {
    node_stop();
    char op[512], z[600], holder[600];
    start_backup("b3", op, sizeof op);
    size_t frozen = 0;
    for (int i = 0; i < POLLS_MAX && !frozen; i++) { /* the first node's freeze of b3 ends */
        frozen = node_pieces(g_b3);
        usleep(100 * 1000);
    }
    if (!frozen) {
        node_continue();
        ci_fail("the first node never froze a piece of b3");
    }
    snprintf(z, sizeof z, "operations/%s/777", g_b3);
    md_write_create_op(z, st_wall_us() + 3600LL * 1000000, g_b3); /* running elsewhere */
    md_take(g_b3, z);
    cancel(op);
    char msg[1024];
    st_code code = op_end(op, msg, sizeof msg);
    md_record_op(g_b3, holder, sizeof holder);
    size_t pieces = node_pieces(g_b3);
    printf("b3 afterwards: record held by \"%s\", %zu piece(s) on the first node (%zu before)\n",
           holder, pieces, frozen);
    if (strcmp(holder, z))
        ci_fail("b3's record (operation %s's) went with the cancelled %s: now \"%s\"", z, op,
                holder);
    if (pieces < frozen)
        ci_fail("the cancelled %s deleted b3's pieces, operation %s's (%zu before, %zu after)", op,
                z, frozen, pieces);
    want_nothing_removed(op, code, msg, ST_CANCELLED);
}

int main(int argc, char **argv) {
    int rc = ci_init("backup_reap_test", argc, argv);
    if (rc)
        return rc;
    ci_up(1, 2);
    ci_client(&g_cl, "");
    snprintf(g_cluster, sizeof g_cluster, INST "/clusters/%s", ci_topo.clusters[0].id);
    snprintf(g_b1, sizeof g_b1, "%s/backups/b1", g_cluster);
    snprintf(g_b3, sizeof g_b3, "%s/backups/b3", g_cluster);
    bt_client_init(&g_md, ci_topo.clusters[0].nodes[0].addr);
    snprintf(g_md.instance, sizeof g_md.instance, "projects/_strata/instances/_strata");
    st_err st;
    const char *splits[] = {"g", "p", NULL}; /* each node holds a tablet */
    if (bt_create_table_split(&g_cl, "t", "cf", splits, &st) != ST_OK)
        ci_fail("create t: %s", st.msg);
    const char *keys[] = {"apple", "kiwi", "zebra"};
    for (size_t i = 0; i < 3; i++) {
        bt_muts m;
        bt_muts_init(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("c"), 1000, st_slice_cstr("v"));
        if (bt_mutate_row(&g_cl, "t", st_slice_cstr(keys[i]), &m, &st) != ST_OK)
            ci_fail("write t: %s", st.msg);
        bt_muts_deinit(&m);
    }
    create_b1();
    size_t pieces = node_pieces(g_b1);
    printf("b1 READY with %zu piece(s) on the first node\n", pieces);
    test_live_restore();
    test_live_create();

    char x[600], y[600];
    snprintf(x, sizeof x, "operations/%s/777", g_b1);
    snprintf(y, sizeof y, "operations/%s/555", g_b1);
    md_write_create_op(x, st_wall_us() + 3600LL * 1000000,
                       g_b1); /* running elsewhere: nobody finishes it */
    md_take(g_b1, x);
    int state = 0;
    for (int i = 0; i < POLLS_MAX && state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
         i++) { /* the router's copy of the metadata catches up */
        state = backup_state();
        usleep(100 * 1000);
    }
    if (state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING)
        ci_fail("the router never showed b1 CREATING (state %d)", state);
    printf("b1 CREATING by %s\n", x);

    md_write_create_op(y, 1, g_b1); /* refused, its router gone: the sweep finishes it */
    char msg[1024];
    st_code code = op_wait(y, msg, sizeof msg);
    printf("%s ended %s: %s\n", y, st_code_name(code), msg);
    state = backup_state();
    size_t left = node_pieces(g_b1);
    printf("b1 afterwards: state %d, %zu piece(s) on the node\n", state, left);
    if (state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING)
        ci_fail("b1 (operation %s's) is gone after %s was finished (state %d)", x, y, state);
    if (left != pieces)
        ci_fail("b1's pieces on the node went from %zu to %zu", pieces, left);
    if (code != ST_ABORTED || !strstr(msg, "nothing was removed"))
        ci_fail("operation %s ended %s \"%s\", want ABORTED with nothing removed", y,
                st_code_name(code), msg);
    test_restore_claimed();
    ci_down();
    printf("PASSED\n");
    return 0;
}
