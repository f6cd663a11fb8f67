/* backup_hide.c — a CreateBackup that fails, seen through a second router, for
 * backup_hide_test.sh (two clusters: east with nodes E1 (the metadata's tablet) and E2, west
 * with W1; routers A and B).
 *
 * Table t split in three, so E2 holds a tablet of it. E2 is stopped (SIGSTOP) and CreateBackup
 * through A stays CREATING; W1 is stopped too, so every metadata write of A waits for west until
 * it times out, and each of A's writes lands in east's metadata long before the next one starts.
 * CancelOperation through A (E2 continued): the operation fails and cleans up. Meanwhile B is
 * polled as fast as it answers: GetOperation, GetBackup, GetOperation again. B must never show
 * the backup gone while its operation still runs (GetBackup NOT_FOUND, then the operation not
 * done), nor the backup present once its operation failed (the operation done with an error,
 * then GetBackup answers it). B reads east's metadata (its first cluster), which A's writes
 * reach one at a time.
 *   backup_hide ADDR_A ADDR_B PID_E2 PID_W1
 * Prints the polls' figures and "PASS" or "FAIL"; exit 0 on PASS, 1 on FAIL, 2 on bad usage. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "btclient.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"

#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define LRO "/google.longrunning.Operations/"
#define BACKUP "projects/p/instances/i/clusters/east/backups/hx"
#define TIMEOUT_MS 60000
#define POLLS_MAX 20000 /* hang guard */

static pid_t g_e2, g_w1;

static int fail(const char *what, const char *msg) {
    printf("FAIL: %s%s\n", what, msg);
    kill(g_e2, SIGCONT);
    kill(g_w1, SIGCONT);
    return 1;
}

/* GetBackup hx at addr: its code; *creating when it answered state CREATING. */
static st_code get_backup(const char *addr, bool *creating) {
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = (char *)BACKUP;
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    st_code rc = bt_call_pb(addr, TA "GetBackup", &req.base, TIMEOUT_MS, &resp, &st);
    *creating = false;
    if (rc == ST_OK) {
        Google__Bigtable__Admin__V2__Backup *b =
            google__bigtable__admin__v2__backup__unpack(NULL, resp.len, resp.data);
        *creating = b && b->state == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
        if (b)
            google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    }
    st_buf_free(&resp);
    return rc;
}

/* GetOperation op at addr: 0 running, 1 done with an error, 2 done otherwise, -1 no answer. */
static int get_op(const char *addr, const char *op) {
    Google__Longrunning__GetOperationRequest req;
    google__longrunning__get_operation_request__init(&req);
    req.name = (char *)op;
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    int state = -1;
    if (bt_call_pb(addr, LRO "GetOperation", &req.base, TIMEOUT_MS, &resp, &st) == ST_OK) {
        Google__Longrunning__Operation *o =
            google__longrunning__operation__unpack(NULL, resp.len, resp.data);
        if (o)
            state = !o->done                                                         ? 0
                    : o->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR ? 1
                                                                                     : 2;
        if (o)
            google__longrunning__operation__free_unpacked(o, NULL);
    }
    st_buf_free(&resp);
    return state;
}

static st_code create_backup(const char *addr, char *op, size_t cap, st_err *st) {
    Google__Protobuf__Timestamp exp;
    google__protobuf__timestamp__init(&exp);
    exp.seconds = st_wall_us() / 1000000 + 24 * 3600;
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)"projects/p/instances/i/tables/t";
    b.expire_time = &exp;
    Google__Bigtable__Admin__V2__CreateBackupRequest req;
    google__bigtable__admin__v2__create_backup_request__init(&req);
    req.parent = (char *)"projects/p/instances/i/clusters/east";
    req.backup_id = (char *)"hx";
    req.backup = &b;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = bt_call_pb(addr, TA "CreateBackup", &req.base, TIMEOUT_MS, &resp, st);
    Google__Longrunning__Operation *o =
        rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    snprintf(op, cap, "%s", o && o->name ? o->name : "");
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    st_buf_free(&resp);
    return rc;
}

/* Polls B until the operation reads done there; counts the inconsistent views. */
static int poll_b(const char *b, const char *op, int *gone_running, int *shown_failed) {
    int polls = 0, end = -1;
    for (; polls < POLLS_MAX; polls++) {
        bool creating;
        int before = get_op(b, op);
        st_code rc = get_backup(b, &creating);
        int after = get_op(b, op);
        if (rc == ST_NOT_FOUND && after == 0)
            (*gone_running)++;
        if (before == 1 && rc == ST_OK)
            (*shown_failed)++;
        if (after >= 1 && rc == ST_NOT_FOUND) {
            end = after;
            break;
        }
    }
    return end;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: backup_hide ADDR_A ADDR_B PID_E2 PID_W1\n");
        return 2;
    }
    const char *a = argv[1], *b = argv[2];
    g_e2 = (pid_t)atoi(argv[3]);
    g_w1 = (pid_t)atoi(argv[4]);
    bt_client cl;
    bt_client_init(&cl, a);
    st_err st = {0};
    const char *splits[] = {"g", "p", NULL};
    if (bt_create_table_split(&cl, "t", "cf", splits, &st) != ST_OK)
        return fail("CreateTable: ", st.msg);
    bool creating;
    for (int i = 0; i < 600 && get_backup(b, &creating) != ST_NOT_FOUND; i++)
        usleep(100 * 1000); /* B knows the table's instance: answers NOT_FOUND for hx */
    char op[512];
    kill(g_e2, SIGSTOP);
    if (create_backup(a, op, sizeof op, &st) != ST_OK || !op[0])
        return fail("CreateBackup: ", st.msg);
    if (get_backup(a, &creating) != ST_OK || !creating)
        return fail("backup hx is not CREATING on A with E2 stopped", "");
    for (int i = 0; i < 600 && get_op(b, op) != 0; i++)
        usleep(100 * 1000); /* B has read the operation */
    kill(g_w1, SIGSTOP);
    Google__Longrunning__CancelOperationRequest cr;
    google__longrunning__cancel_operation_request__init(&cr);
    cr.name = op;
    st_code rc = bt_call_pb(a, LRO "CancelOperation", &cr.base, TIMEOUT_MS, NULL, &st);
    kill(g_e2, SIGCONT);
    if (rc != ST_OK)
        return fail("CancelOperation: ", st.msg);
    int gone_running = 0, shown_failed = 0;
    int end = poll_b(b, op, &gone_running, &shown_failed);
    kill(g_w1, SIGCONT);
    printf("B: backup NOT_FOUND while its operation ran: %d; shown after its operation failed: "
           "%d; operation %s\n",
           gone_running, shown_failed,
           end == 1   ? "failed"
           : end == 2 ? "done"
                      : "never ended");
    bool pass = gone_running == 0 && shown_failed == 0 && end == 1;
    printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
