/*
 * Proves the router's backups on a real local instance (`strata up`, one cluster of three nodes,
 * a 128 KiB split threshold so tablets split and the balancer moves them while the test runs):
 *   1. point in time under concurrent writes: a writer thread writes rows (two cells with the
 *      same value: a row is whole when they agree) spread over the key space while BACKUPS
 *      backups are made; each is restored and read: every row acknowledged before the backup's
 *      start_time is there, no row sent after its end_time is, every row is whole. Splits and
 *      balancer moves run meanwhile, but whether one falls inside a backup's window is up to
 *      timing: the router's "frozen in R rounds (K tablets split, moved or retried)" lines are
 *      printed as figures, not checked;
 *   2. kill -9 of a node right after CreateBackup: the operation ends (done or an error); after
 *      an error the backup does not exist; with the node back, a new backup succeeds;
 *   3. kill -9 of a node right after RestoreTable: the operation ends; after an error the table
 *      does not exist (no half table); with the node back, the same restore succeeds, whole;
 *   4. the router killed (kill -9) while a backup waits on a stopped node (SIGSTOP): the
 *      restarted router lists the operation and finishes it as ABORTED, the backup is gone.
 *
 *   backup_router_test <build>/ops/strata
 * Exit 77 when the strata binary (or strata-node / strata-router next to it) is missing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#define ROWS_MAX 200000
#define PREFILL 1000
#define BACKUPS 4
#define VALUE_BYTES 300
#define WAIT_POLLS_MAX 1200 /* hang guard (2 min at 100 ms), not a timing assertion */

static bt_client g_cl;
static int64_t g_send_us[ROWS_MAX], g_ack_us[ROWS_MAX];
static atomic_uint g_written;
static atomic_bool g_stop;

static uint32_t key_of(uint32_t i) {
    return (uint32_t)(((uint64_t)i * 2654435761u) % 1000003u); /* spread over the key space */
}

static void *writer(void *arg) {
    (void)arg;
    bt_muts m;
    bt_muts_init(&m);
    char key[32], val[VALUE_BYTES + 1];
    for (uint32_t i = 0; i < ROWS_MAX && !atomic_load(&g_stop); i++) {
        snprintf(key, sizeof key, "r%07u", key_of(i));
        snprintf(val, sizeof val, "%0*u", VALUE_BYTES, i);
        bt_muts_reset(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("a"), -1, st_slice_cstr(val));
        bt_muts_set(&m, "cf", st_slice_cstr("b"), -1, st_slice_cstr(val));
        st_err st;
        g_send_us[i] = st_wall_us();
        if (bt_mutate_row(&g_cl, "t", st_slice_cstr(key), &m, &st) == ST_OK)
            g_ack_us[i] = st_wall_us();
        atomic_store(&g_written, i + 1);
    }
    bt_muts_deinit(&m);
    return NULL;
}

/* ---- admin calls ---- */

static Google__Longrunning__Operation *op_unpack(const st_buf *b) {
    return google__longrunning__operation__unpack(NULL, b->len, b->data);
}

static st_code create_backup(const char *id, char *op_name, size_t cap, st_err *st) {
    return ci_create_backup(CLUSTER, INST "/tables/t", id, 24 * 3600, 0, op_name, cap, st);
}

static st_code restore(const char *table_id, const char *backup_id, char *op_name, size_t cap,
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
    Google__Longrunning__Operation *op = rc == ST_OK ? op_unpack(&resp) : NULL;
    if (op)
        snprintf(op_name, cap, "%s", op->name);
    if (op)
        google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&resp);
    return rc == ST_OK && !op ? ST_INTERNAL : rc;
}

/* Polls GetOperation until done (the router may be restarting: errors are retried). The
 * operation's error code (ST_OK on success) and message. */
static st_code op_wait(const char *name, char *msg, size_t cap) {
    Google__Longrunning__GetOperationRequest req;
    google__longrunning__get_operation_request__init(&req);
    req.name = (char *)name;
    for (int i = 0; i < WAIT_POLLS_MAX; i++) {
        st_buf resp;
        st_buf_init(&resp);
        st_err st;
        Google__Longrunning__Operation *op = NULL;
        if (bt_call_pb(ci_router, LRO "GetOperation", &req.base, 10000, &resp, &st) == ST_OK)
            op = op_unpack(&resp);
        st_buf_free(&resp);
        if (op && op->done) {
            bool err = op->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
            st_code rc = err ? (st_code)op->error->code : ST_OK;
            snprintf(msg, cap, "%s", err ? op->error->message : "");
            google__longrunning__operation__free_unpacked(op, NULL);
            return rc;
        }
        if (op)
            google__longrunning__operation__free_unpacked(op, NULL);
        usleep(100 * 1000);
    }
    ci_fail("operation %s not done after %d polls", name, WAIT_POLLS_MAX);
}

static Google__Bigtable__Admin__V2__Backup *get_backup(const char *id, st_code *rc) {
    char name[256];
    snprintf(name, sizeof name, CLUSTER "/backups/%s", id);
    Google__Bigtable__Admin__V2__GetBackupRequest req;
    google__bigtable__admin__v2__get_backup_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    *rc = bt_call_pb(ci_router, TA "GetBackup", &req.base, 10000, &resp, &st);
    Google__Bigtable__Admin__V2__Backup *b =
        *rc == ST_OK ? google__bigtable__admin__v2__backup__unpack(NULL, resp.len, resp.data)
                     : NULL;
    st_buf_free(&resp);
    return b;
}

static st_code get_table(const char *id) {
    char name[256];
    snprintf(name, sizeof name, INST "/tables/%s", id);
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = name;
    st_err st;
    return bt_call_pb(ci_router, TA "GetTable", &req.base, 10000, NULL, &st);
}

/* ---- contents ---- */

typedef struct seen {
    uint8_t *present; /* by write index */
    size_t rows, torn;
    char torn_key[64];
} seen;

static void on_row(const bt_row *row, void *arg) {
    seen *s = arg;
    s->rows++;
    st_slice a = {0}, b = {0};
    for (size_t i = 0; i < row->n_cells; i++) {
        if (st_slice_eq(row->cells[i].qualifier, st_slice_cstr("a")))
            a = row->cells[i].value;
        if (st_slice_eq(row->cells[i].qualifier, st_slice_cstr("b")))
            b = row->cells[i].value;
    }
    if (!a.len || !st_slice_eq(a, b)) {
        s->torn++;
        snprintf(s->torn_key, sizeof s->torn_key, "%.*s", (int)row->key.len,
                 (const char *)row->key.data);
        return;
    }
    char v[VALUE_BYTES + 1];
    snprintf(v, sizeof v, "%.*s", (int)a.len, (const char *)a.data);
    unsigned long idx = strtoul(v, NULL, 10);
    if (idx < ROWS_MAX)
        s->present[idx] = 1;
}

/* Restored table `table` against backup b and the writer's log. */
static void check_contents(const char *table, const Google__Bigtable__Admin__V2__Backup *b,
                           uint32_t written) {
    int64_t start = b->start_time->seconds * 1000000 + b->start_time->nanos / 1000;
    int64_t end = b->end_time->seconds * 1000000 + b->end_time->nanos / 1000;
    seen s = {calloc(ROWS_MAX, 1), 0, 0, ""};
    st_err st;
    bt_read_req rr = {0};
    if (bt_read_rows(&g_cl, table, &rr, on_row, &s, &st) != ST_OK)
        ci_fail("reading restored table %s: %s", table, st.msg);
    if (s.torn)
        ci_fail("%s: %zu rows are not whole (first %s)", table, s.torn, s.torn_key);
    size_t before = 0, after = 0;
    for (uint32_t i = 0; i < written; i++) {
        if (g_ack_us[i] && g_ack_us[i] < start && !s.present[i])
            ci_fail("%s: row %u acknowledged %" PRId64 " us before start_time is missing", table, i,
                    start - g_ack_us[i]);
        if (g_send_us[i] > end && s.present[i])
            ci_fail("%s: row %u sent %" PRId64 " us after end_time is present", table, i,
                    g_send_us[i] - end);
        before += g_ack_us[i] && g_ack_us[i] < start;
        after += g_send_us[i] > end;
    }
    printf("  %s: %zu rows; %zu acknowledged before start all present, %zu sent after end "
           "all absent; window %" PRId64 " ms\n",
           table, s.rows, before, after, (end - start) / 1000);
    free(s.present);
}

static void restart_all(void) {
    const char *up[] = {"up", "--dir", ci_dir, NULL};
    ci_strata_ok(up);
}

/* The router's "frozen in R rounds (K tablets split, moved or retried)" lines: how many freezes
 * met a split or a move (a figure, not a check: the timing decides). */
static void print_rounds(void) {
    char path[BT_PATH_MAX + 32], line[1024];
    snprintf(path, sizeof path, "%s/logs/router.log", ci_dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "backups/");
        if (p && strstr(line, "frozen in"))
            printf("  %s", p + strlen("backups/"));
    }
    if (f)
        fclose(f);
}

/* ---- the cases ---- */

static void case_point_in_time(void) {
    printf("== 1. point in time under concurrent writes, splits and moves\n");
    pthread_t th;
    pthread_create(&th, NULL, writer, NULL);
    while (atomic_load(&g_written) < PREFILL)
        usleep(10 * 1000);
    for (int k = 0; k < BACKUPS; k++) {
        char id[32], op[512], msg[512], table[32];
        snprintf(id, sizeof id, "pit%d", k);
        st_err st;
        if (create_backup(id, op, sizeof op, &st) != ST_OK)
            ci_fail("CreateBackup %s: %s", id, st.msg);
        st_code rc = op_wait(op, msg, sizeof msg);
        if (rc != ST_OK)
            ci_fail("backup %s failed: %s %s", id, st_code_name(rc), msg);
        uint32_t written = atomic_load(&g_written);
        st_code grc;
        Google__Bigtable__Admin__V2__Backup *b = get_backup(id, &grc);
        if (!b || !b->end_time)
            ci_fail("GetBackup %s: %s", id, st_code_name(grc));
        snprintf(table, sizeof table, "pit%d_r", k);
        if (restore(table, id, op, sizeof op, &st) != ST_OK)
            ci_fail("RestoreTable %s: %s", table, st.msg);
        if ((rc = op_wait(op, msg, sizeof msg)) != ST_OK)
            ci_fail("restore %s failed: %s %s", table, st_code_name(rc), msg);
        check_contents(table, b, written);
        google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    }
    atomic_store(&g_stop, true);
    pthread_join(th, NULL);
    print_rounds();
}

static void case_kill_during_backup(void) {
    printf("== 2. kill -9 of a node during a backup\n");
    char op[512], msg[512];
    st_err st;
    if (create_backup("killed", op, sizeof op, &st) != ST_OK)
        ci_fail("CreateBackup killed: %s", st.msg);
    kill(ci_pid("east-1"), SIGKILL);
    st_code rc = op_wait(op, msg, sizeof msg);
    st_code grc;
    Google__Bigtable__Admin__V2__Backup *b = get_backup("killed", &grc);
    printf("  the operation ended: %s %s\n", st_code_name(rc), msg);
    if (rc != ST_OK && grc != ST_NOT_FOUND)
        ci_fail("the failed backup still exists (GetBackup: %s)", st_code_name(grc));
    if (b)
        google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
    restart_all();
    if (create_backup("retried", op, sizeof op, &st) != ST_OK)
        ci_fail("CreateBackup retried: %s", st.msg);
    if ((rc = op_wait(op, msg, sizeof msg)) != ST_OK)
        ci_fail("the retried backup failed: %s %s", st_code_name(rc), msg);
    printf("  retried backup: done\n");
}

static void case_kill_during_restore(void) {
    printf("== 3. kill -9 of a node during a restore\n");
    char op[512], msg[512];
    st_err st;
    if (restore("rk", "retried", op, sizeof op, &st) != ST_OK)
        ci_fail("RestoreTable rk: %s", st.msg);
    kill(ci_pid("east-2"), SIGKILL);
    st_code rc = op_wait(op, msg, sizeof msg);
    printf("  the operation ended: %s %s\n", st_code_name(rc), msg);
    if (rc != ST_OK && get_table("rk") != ST_NOT_FOUND)
        ci_fail("the failed restore left table rk visible");
    restart_all();
    if (rc != ST_OK) {
        if (restore("rk", "retried", op, sizeof op, &st) != ST_OK)
            ci_fail("RestoreTable rk again: %s", st.msg);
        if ((rc = op_wait(op, msg, sizeof msg)) != ST_OK)
            ci_fail("the retried restore failed: %s %s", st_code_name(rc), msg);
    }
    st_code grc;
    Google__Bigtable__Admin__V2__Backup *b = get_backup("retried", &grc);
    if (!b)
        ci_fail("GetBackup retried: %s", st_code_name(grc));
    check_contents("rk", b, atomic_load(&g_written));
    google__bigtable__admin__v2__backup__free_unpacked(b, NULL);
}

static void case_router_restart(void) {
    printf("== 4. the router dies while a backup waits on a stopped node\n");
    char op[512], msg[512];
    st_err st;
    pid_t node = ci_pid("east-2"); /* east-0 holds the metadata table */
    kill(node, SIGSTOP);
    if (create_backup("orphan", op, sizeof op, &st) != ST_OK) {
        kill(node, SIGCONT);
        ci_fail("CreateBackup orphan: %s", st.msg);
    }
    pid_t router = ci_pid("router");
    kill(router, SIGKILL);
    for (int i = 0; i < WAIT_POLLS_MAX && kill(router, 0) == 0; i++)
        usleep(10 * 1000); /* gone before `strata up` looks for it */
    kill(node, SIGCONT);
    restart_all();
    st_code rc = op_wait(op, msg, sizeof msg);
    printf("  after the restart: %s %s\n", st_code_name(rc), msg);
    if (rc != ST_ABORTED)
        ci_fail("the operation of the dead router ended %s, expected ABORTED", st_code_name(rc));
    st_code grc;
    Google__Bigtable__Admin__V2__Backup *b = get_backup("orphan", &grc);
    if (b || grc != ST_NOT_FOUND)
        ci_fail("the abandoned backup still exists (GetBackup: %s)", st_code_name(grc));
    Google__Longrunning__ListOperationsRequest lr;
    google__longrunning__list_operations_request__init(&lr);
    lr.name = "operations/" CLUSTER "/backups/orphan";
    st_buf resp;
    st_buf_init(&resp);
    if (bt_call_pb(ci_router, LRO "ListOperations", &lr.base, 10000, &resp, &st) != ST_OK)
        ci_fail("ListOperations: %s", st.msg);
    Google__Longrunning__ListOperationsResponse *l =
        google__longrunning__list_operations_response__unpack(NULL, resp.len, resp.data);
    if (!l || l->n_operations != 1)
        ci_fail("ListOperations after the restart lists %zu operations of orphan",
                l ? l->n_operations : 0);
    google__longrunning__list_operations_response__free_unpacked(l, NULL);
    st_buf_free(&resp);
    printf("  listed after the restart, ABORTED, the backup removed\n");
}

int main(int argc, char **argv) {
    int rc = ci_init("backup_router_test", argc, argv);
    if (rc)
        return rc;
    const char *extra[] = {"--split-bytes", "131072", NULL};
    ci_up_with(1, 3, extra);
    ci_client(&g_cl, "");
    st_err st;
    if (bt_create_table(&g_cl, "t", "cf:maxversions=1", &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);
    long long t0 = ci_now_ms();
    case_point_in_time();
    printf("  (%lld ms)\n", ci_now_ms() - t0);
    case_kill_during_backup();
    printf("  (%lld ms)\n", ci_now_ms() - t0);
    case_kill_during_restore();
    printf("  (%lld ms)\n", ci_now_ms() - t0);
    case_router_restart();
    printf("  (%lld ms)\n", ci_now_ms() - t0);
    ci_down();
    printf("PASS\n");
    return 0;
}
