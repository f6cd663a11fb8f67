/*
 * The router's backups at the edges of their lifecycle, on a real local instance (`strata up`,
 * one cluster of two nodes; table t split in three, so each node holds a tablet):
 *   1. backup_type HOT with hot_to_standard_time: stored and returned by GetBackup and
 *      ListBackups;
 *   2. ListBackups pages: the last backup of a page deleted before the next page is asked for
 *      skips nothing; a garbage page_token and one of another filter are INVALID_ARGUMENT;
 *   3. RestoreTable into an existing table is ALREADY_EXISTS; from a deleted backup NOT_FOUND;
 *   4. the sweep deletes an expired backup (the router runs with
 *      STRATA_BACKUP_TEST_EXPIRY_AHEAD_S, so an expire_time 6 hours ahead counts as past);
 *   5. CancelOperation of a CreateBackup in progress (a node stopped so it stays CREATING): the
 *      operation ends CANCELLED and the backup is gone;
 *   6. DeleteBackup of a backup still CREATING: answered at once, the backup is gone, its
 *      operation ends CANCELLED, and the id can be used again;
 *   7. the router killed (kill -9) while a backup is CREATING, and restarted: GetBackup then
 *      GetOperation, as fast as they answer, never find the backup gone while its operation
 *      runs; the operation ends ABORTED and the backup stays gone.
 *
 *   backup_edges_test <build>/ops/strata   ($BACKUP_EDGES_CASES="2,6": only those cases)
 * Exit 77 when the strata binary (or strata-node / strata-router next to it) is missing.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "btclient.h"
#include "chaos_util.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"

#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define LRO "/google.longrunning.Operations/"
#define INST "projects/p/instances/i"
#define CLUSTER INST "/clusters/east"
#define POLLS_MAX 1200  /* hang guard (2 min at 100 ms), not a timing assertion */
#define AHEAD_S "25200" /* the sweep's clock: 7 hours ahead */

typedef Google__Bigtable__Admin__V2__Backup pb_backup;

static bt_client g_cl;

/* ---- admin calls ---- */

static Google__Longrunning__Operation *op_unpack(const st_buf *b) {
    return google__longrunning__operation__unpack(NULL, b->len, b->data);
}

/* CreateBackup of table t as id (ci_create_backup). */
static st_code create_backup(const char *id, int64_t expire_s, int64_t hot_s, char *op, size_t cap,
                             st_err *st) {
    return ci_create_backup(CLUSTER, INST "/tables/t", id, expire_s, hot_s, op, cap, st);
}

static st_code op_wait(const char *name, char *msg, size_t cap) {
    return ci_op_wait(name, POLLS_MAX, msg, cap);
}

static void create_ok(const char *id, int64_t expire_s, int64_t hot_s) {
    char op[512], msg[512];
    st_err st;
    if (create_backup(id, expire_s, hot_s, op, sizeof op, &st) != ST_OK)
        ci_fail("CreateBackup %s: %s", id, st.msg);
    st_code rc = op_wait(op, msg, sizeof msg);
    if (rc != ST_OK)
        ci_fail("backup %s failed: %s %s", id, st_code_name(rc), msg);
}

static pb_backup *get_backup(const char *id, st_code *rc) {
    char name[256];
    snprintf(name, sizeof name, CLUSTER "/backups/%s", id);
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    *rc = bt_call_pb(ci_router, TA "GetBackup", &req.base, 10000, &resp, &st);
    pb_backup *b = *rc == ST_OK
                       ? google__bigtable__admin__v2__backup__unpack(NULL, resp.len, resp.data)
                       : NULL;
    st_buf_free(&resp);
    return b;
}

static st_code delete_backup(const char *id, st_err *st) {
    char name[256];
    snprintf(name, sizeof name, CLUSTER "/backups/%s", id);
    Google__Bigtable__Admin__V2__DeleteBackupRequest req;
    google__bigtable__admin__v2__delete_backup_request__init(&req);
    req.name = name;
    return bt_call_pb(ci_router, TA "DeleteBackup", &req.base, 30000, NULL, st);
}

static st_code restore(const char *table_id, const char *backup_id, char *op, size_t cap,
                       st_err *st) {
    char backup[256];
    snprintf(backup, sizeof backup, CLUSTER "/backups/%s", backup_id);
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = INST;
    req.table_id = (char *)table_id;
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = backup;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = bt_call_pb(ci_router, TA "RestoreTable", &req.base, 30000, &resp, st);
    Google__Longrunning__Operation *o = rc == ST_OK ? op_unpack(&resp) : NULL;
    if (o)
        snprintf(op, cap, "%s", o->name);
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    st_buf_free(&resp);
    return rc;
}

/* One ListBackups page (free with ..._free_unpacked); NULL with *rc on failure. */
static Google__Bigtable__Admin__V2__ListBackupsResponse *list_page(const char *filter,
                                                                   const char *order, int size,
                                                                   const char *token, st_code *rc,
                                                                   st_err *st) {
    Google__Bigtable__Admin__V2__ListBackupsRequest req;
    google__bigtable__admin__v2__list_backups_request__init(&req);
    req.parent = CLUSTER;
    req.filter = (char *)filter;
    req.order_by = (char *)order;
    req.page_size = size;
    req.page_token = (char *)token;
    st_buf resp;
    st_buf_init(&resp);
    *rc = bt_call_pb(ci_router, TA "ListBackups", &req.base, 10000, &resp, st);
    Google__Bigtable__Admin__V2__ListBackupsResponse *r =
        *rc == ST_OK
            ? google__bigtable__admin__v2__list_backups_response__unpack(NULL, resp.len, resp.data)
            : NULL;
    st_buf_free(&resp);
    return r;
}

/* ---- the cases ---- */

static void case_hot(void) {
    printf("== 1. backup_type HOT and hot_to_standard_time are kept\n");
    int64_t hot_at = st_wall_us() / 1000000 + 30 * 3600;
    create_ok("hot1", 40 * 3600, 30 * 3600);
    st_code rc;
    pb_backup *b = get_backup("hot1", &rc);
    if (!b)
        ci_fail("GetBackup hot1: %s", st_code_name(rc));
    if (b->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT)
        ci_fail("GetBackup hot1: backup_type %d, want HOT (2)", (int)b->backup_type);
    if (!b->hot_to_standard_time || b->hot_to_standard_time->seconds < hot_at - 5 ||
        b->hot_to_standard_time->seconds > hot_at + 5)
        ci_fail("GetBackup hot1: hot_to_standard_time %lld, want about %lld",
                b->hot_to_standard_time ? (long long)b->hot_to_standard_time->seconds : 0LL,
                (long long)hot_at);
    google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    st_err st;
    Google__Bigtable__Admin__V2__ListBackupsResponse *l =
        list_page("name:hot1", "", 0, "", &rc, &st);
    if (!l || l->n_backups != 1 ||
        l->backups[0]->backup_type != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT ||
        !l->backups[0]->hot_to_standard_time)
        ci_fail("ListBackups does not show hot1 as HOT: %s", l ? "wrong" : st.msg);
    google__bigtable__admin__v2__list_backups_response__free_unpacked(l, NULL);
    printf("  HOT with hot_to_standard_time in GetBackup and ListBackups\n");
}

static void case_pages(void) {
    printf("== 2. ListBackups pages across a delete\n");
    const char *ids[] = {"pg0", "pg1", "pg2", "pg3", "pg4"};
    for (size_t i = 0; i < 5; i++)
        create_ok(ids[i], 24 * 3600, 0);
    st_code rc;
    st_err st;
    char token[4096] = "", seen[256] = "";
    Google__Bigtable__Admin__V2__ListBackupsResponse *l =
        list_page("name:/backups/pg", "name", 2, "", &rc, &st);
    if (!l || l->n_backups != 2 || !l->next_page_token[0])
        ci_fail("ListBackups page 1: %s", l ? "not 2 backups and a token" : st.msg);
    snprintf(token, sizeof token, "%s", l->next_page_token);
    google__bigtable__admin__v2__list_backups_response__free_unpacked(l, NULL);
    if (delete_backup("pg1", &st) != ST_OK) /* the last backup of page 1 */
        ci_fail("DeleteBackup pg1: %s", st.msg);
    while (token[0]) {
        if (!(l = list_page("name:/backups/pg", "name", 2, token, &rc, &st)))
            ci_fail("ListBackups next page: %s", st.msg);
        for (size_t i = 0; i < l->n_backups; i++)
            snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s ",
                     strrchr(l->backups[i]->name, '/') + 1);
        snprintf(token, sizeof token, "%s", l->next_page_token);
        google__bigtable__admin__v2__list_backups_response__free_unpacked(l, NULL);
    }
    if (strcmp(seen, "pg2 pg3 pg4 "))
        ci_fail("the pages after page 1 list '%s', want 'pg2 pg3 pg4 '", seen);
    list_page("name:/backups/pg", "name", 2, "garbage", &rc, &st);
    if (rc != ST_INVALID_ARGUMENT)
        ci_fail("a garbage page_token: %s, want INVALID_ARGUMENT", st_code_name(rc));
    l = list_page("name:/backups/pg", "name", 1, "", &rc, &st);
    if (!l || !l->next_page_token[0])
        ci_fail("ListBackups page_size 1: %s", l ? "no token" : st.msg);
    snprintf(token, sizeof token, "%s", l->next_page_token);
    google__bigtable__admin__v2__list_backups_response__free_unpacked(l, NULL);
    list_page("name:/backups/p", "name", 1, token, &rc, &st);
    if (rc != ST_INVALID_ARGUMENT)
        ci_fail("a page_token of another filter: %s, want INVALID_ARGUMENT", st_code_name(rc));
    printf("  after deleting the last of page 1: %s; bad tokens INVALID_ARGUMENT\n", seen);
}

static void case_restore_refused(void) {
    printf("== 3. RestoreTable into an existing table, from a deleted backup\n");
    char op[512];
    st_err st;
    st_code rc = restore("t", "pg0", op, sizeof op, &st);
    if (rc != ST_ALREADY_EXISTS)
        ci_fail("restore into existing table t: %s, want ALREADY_EXISTS", st_code_name(rc));
    rc = restore("fromdeleted", "pg1", op, sizeof op, &st);
    if (rc != ST_NOT_FOUND)
        ci_fail("restore from deleted backup pg1: %s, want NOT_FOUND", st_code_name(rc));
    printf("  ALREADY_EXISTS, NOT_FOUND\n");
}

static void case_expiry(void) {
    printf("== 4. the sweep deletes an expired backup\n");
    create_ok("exp1", 6 * 3600 + 120, 0); /* past, by the sweep's clock 7 hours ahead */
    st_code rc = ST_OK;
    int i;
    for (i = 0; i < POLLS_MAX; i++) {
        pb_backup *b = get_backup("exp1", &rc);
        if (b)
            google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
        if (rc == ST_NOT_FOUND)
            break;
        usleep(100 * 1000);
    }
    if (rc != ST_NOT_FOUND)
        ci_fail("expired backup exp1 still there after %d polls: %s", i, st_code_name(rc));
    pb_backup *b = get_backup("pg0", &rc); /* expires in 24 h: stays */
    if (!b)
        ci_fail("backup pg0 (not expired) is gone: %s", st_code_name(rc));
    google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    printf("  exp1 deleted by the sweep after %d polls; pg0 kept\n", i);
}

/* CreateBackup id with node east-1 stopped, so the backup stays CREATING; returns its pid. */
static pid_t create_stuck(const char *id, char *op, size_t cap) {
    pid_t node = ci_pid("east-1");
    kill(node, SIGSTOP);
    st_err st;
    if (create_backup(id, 24 * 3600, 0, op, cap, &st) != ST_OK) {
        kill(node, SIGCONT);
        ci_fail("CreateBackup %s: %s", id, st.msg);
    }
    st_code rc;
    pb_backup *b = get_backup(id, &rc);
    if (!b || b->state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING) {
        kill(node, SIGCONT);
        ci_fail("backup %s is not CREATING with east-1 stopped: %s", id,
                b ? "READY" : st_code_name(rc));
    }
    google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    return node;
}

static void case_cancel(void) {
    printf("== 5. CancelOperation of a CreateBackup in progress\n");
    char op[512], msg[512];
    pid_t node = create_stuck("cx", op, sizeof op);
    Google__Longrunning__CancelOperationRequest req;
    google__longrunning__cancel_operation_request__init(&req);
    req.name = op;
    st_err st;
    st_code rc = bt_call_pb(ci_router, LRO "CancelOperation", &req.base, 10000, NULL, &st);
    kill(node, SIGCONT);
    if (rc != ST_OK)
        ci_fail("CancelOperation: %s", st.msg);
    if ((rc = op_wait(op, msg, sizeof msg)) != ST_CANCELLED)
        ci_fail("the cancelled operation ended %s (%s), want CANCELLED", st_code_name(rc), msg);
    pb_backup *b = get_backup("cx", &rc);
    if (b || rc != ST_NOT_FOUND)
        ci_fail("the cancelled backup cx: GetBackup %s, want NOT_FOUND", st_code_name(rc));
    printf("  CANCELLED, backup gone\n");
}

static void case_delete_creating(void) {
    printf("== 6. DeleteBackup while CREATING\n");
    char op[512], msg[512];
    pid_t node = create_stuck("dx", op, sizeof op);
    st_err st;
    st_code rc = delete_backup("dx", &st);
    st_code grc;
    pb_backup *b = get_backup("dx", &grc);
    kill(node, SIGCONT);
    if (rc != ST_OK)
        ci_fail("DeleteBackup of a CREATING backup: %s", st.msg);
    if (b || grc != ST_NOT_FOUND)
        ci_fail("after DeleteBackup: GetBackup dx %s, want NOT_FOUND", st_code_name(grc));
    if ((rc = op_wait(op, msg, sizeof msg)) != ST_CANCELLED)
        ci_fail("the deleted backup's operation ended %s (%s), want CANCELLED", st_code_name(rc),
                msg);
    create_ok("dx", 24 * 3600, 0);
    printf("  deleted at once, its operation CANCELLED, the id reusable\n");
}

/* GetBackup, then GetOperation, as fast as they answer, from the router's restart until the
 * operation is done: a backup NOT_FOUND while the operation polled after it still runs is a
 * backup that vanished before its operation said so. */
static void restart_poll(const char *op, int *found, int *gone_running, int *polls) {
    char msg[512];
    st_code code;
    for (*polls = 0; *polls < 20 * POLLS_MAX; (*polls)++) {
        st_code grc;
        pb_backup *b = get_backup("rr", &grc);
        int done = ci_op_poll(op, &code, msg, sizeof msg);
        if (b)
            google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
        *found += grc == ST_OK;
        *gone_running += grc == ST_NOT_FOUND && done == 0;
        if (done == 1)
            return;
    }
}

static void case_router_restart(void) {
    printf("== 7. GetBackup while the restarted router finishes a dead router's operation\n");
    char op[512], msg[512];
    pid_t node = create_stuck("rr", op, sizeof op);
    pid_t router = ci_pid("router");
    kill(router, SIGKILL);
    for (int i = 0; i < POLLS_MAX && kill(router, 0) == 0; i++)
        usleep(10 * 1000); /* gone before `strata up` looks for it */
    kill(node, SIGCONT);
    const char *up[] = {"up", "--dir", ci_dir, NULL};
    ci_strata_ok(up);
    int found = 0, gone_running = 0, polls = 0;
    restart_poll(op, &found, &gone_running, &polls);
    st_code rc = op_wait(op, msg, sizeof msg);
    st_code grc;
    pb_backup *b = get_backup("rr", &grc);
    printf("  %d polls: GetBackup found it %d times, NOT_FOUND while running %d times; the "
           "operation ended %s\n",
           polls, found, gone_running, st_code_name(rc));
    if (gone_running)
        ci_fail("GetBackup answered NOT_FOUND %d times while the operation was running",
                gone_running);
    if (rc != ST_ABORTED)
        ci_fail("the dead router's operation ended %s (%s), want ABORTED", st_code_name(rc), msg);
    if (b || grc != ST_NOT_FOUND)
        ci_fail("the aborted backup rr: GetBackup %s, want NOT_FOUND", st_code_name(grc));
}

int main(int argc, char **argv) {
    int rc = ci_init("backup_edges_test", argc, argv);
    if (rc)
        return rc;
    setenv("STRATA_BACKUP_TEST_EXPIRY_AHEAD_S", AHEAD_S, 1); /* `strata up` passes it on */
    ci_up(1, 2);
    ci_client(&g_cl, "");
    st_err st;
    const char *splits[] = {"g", "p", NULL};
    if (bt_create_table_split(&g_cl, "t", "cf", splits, &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);
    const char *keys[] = {"apple", "kiwi", "zebra"};
    for (size_t i = 0; i < 3; i++) {
        bt_muts m;
        bt_muts_init(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("c"), -1, st_slice_cstr(keys[i]));
        if (bt_mutate_row(&g_cl, "t", st_slice_cstr(keys[i]), &m, &st) != ST_OK)
            ci_fail("MutateRow %s: %s", keys[i], st.msg);
        bt_muts_deinit(&m);
    }
    long long t0 = ci_now_ms();
    /* BACKUP_EDGES_CASES="2,6" runs only those (3 needs 2's backups) */
    const char *only = getenv("BACKUP_EDGES_CASES");
    void (*cases[])(void) = {case_hot,    case_pages,           case_restore_refused, case_expiry,
                             case_cancel, case_delete_creating, case_router_restart};
    for (int i = 0; i < 7; i++) {
        char num[4];
        snprintf(num, sizeof num, "%d", i + 1);
        if (!only || strstr(only, num))
            cases[i]();
    }
    printf("  (%lld ms)\n", ci_now_ms() - t0);
    ci_down();
    printf("PASS\n");
    return 0;
}
