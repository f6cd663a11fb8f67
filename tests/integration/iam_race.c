/* iam_race.c — SetIamPolicy with one etag through two routers of one instance, for
 * iam_race_test.sh. Each round reads the instance's policy (once both routers show the same
 * etag), then sets two different policies carrying that etag through router A and router B at
 * the same moment (two threads released together): exactly one must succeed and the other end
 * ABORTED. A last round sets through A and then at once through B with the same etag: B's copy
 * of the metadata has not been reloaded yet, and B must still answer ABORTED. Delete rounds send
 * three SetIamPolicy of table t and a DeleteTable of t through A at once, then create t again:
 * the new table must start without a policy (a set that read the old table used to store its
 * policy after the delete had forgotten the table's). A blind round sets two policies without an
 * etag through A and B at once: both succeed (no etag replaces whatever is there; every set used
 * to be compared with the record its router read, and one ended ABORTED).
 *   iam_race ADDR_A ADDR_B ROUNDS
 * Prints one line per round and "PASS" or "FAIL"; exit 0 on PASS, 1 on FAIL, 2 on bad usage.
 * The call deadline (30 s) is a hang guard only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/iam/v1/iam_policy.pb-c.h"
#include "google/iam/v1/policy.pb-c.h"
#include "strata/rpc.h"

#define IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define TABLE "projects/p/instances/i/tables/t"
#define INSTANCE "projects/p/instances/i"
#define TIMEOUT_MS 30000
#define ETAG_MAX 64

typedef struct setter {
    const char *addr;
    const char *resource; /* INSTANCE when NULL; with delete: DeleteTable of TABLE instead */
    bool delete;
    char member[64];
    char etag[ETAG_MAX];
    pthread_barrier_t *go;
    st_code code;
    char msg[sizeof(((st_err *)0)->msg)];
} setter;

/* resource's policy as the router at addr answers GetIamPolicy (method: IA or TA), or NULL. */
static Google__Iam__V1__Policy *get_policy(const char *addr, const char *method,
                                           const char *resource) {
    Google__Iam__V1__GetIamPolicyRequest req;
    google__iam__v1__get_iam_policy_request__init(&req);
    req.resource = (char *)resource;
    uint8_t buf[128];
    size_t len = google__iam__v1__get_iam_policy_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    Google__Iam__V1__Policy *p = NULL;
    if (rpc_blocking_unary(addr, NULL, method, st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, &resp,
                           &err) == ST_OK)
        p = google__iam__v1__policy__unpack(NULL, resp.len, resp.data);
    st_buf_free(&resp);
    return p;
}

/* The etag the router at addr reports for the instance ("" on failure). */
static void get_etag(const char *addr, char *out) {
    Google__Iam__V1__Policy *p = get_policy(addr, IA "GetIamPolicy", INSTANCE);
    out[0] = '\0';
    if (p && p->etag.len < ETAG_MAX) {
        memcpy(out, p->etag.data, p->etag.len);
        out[p->etag.len] = '\0';
    }
    if (p)
        google__iam__v1__policy__free_unpacked(p, NULL);
}

static void set_policy(setter *s) {
    char *members[1] = {s->member};
    Google__Iam__V1__Binding b;
    google__iam__v1__binding__init(&b);
    b.role = (char *)"roles/bigtable.reader";
    b.n_members = 1;
    b.members = members;
    Google__Iam__V1__Binding *bs[1] = {&b};
    Google__Iam__V1__Policy p;
    google__iam__v1__policy__init(&p);
    p.version = 1;
    p.n_bindings = 1;
    p.bindings = bs;
    p.etag = (ProtobufCBinaryData){strlen(s->etag), (uint8_t *)s->etag};
    Google__Iam__V1__SetIamPolicyRequest req;
    google__iam__v1__set_iam_policy_request__init(&req);
    req.resource = (char *)(s->resource ? s->resource : INSTANCE);
    req.policy = &p;
    Google__Bigtable__Admin__V2__DeleteTableRequest del;
    google__bigtable__admin__v2__delete_table_request__init(&del);
    del.name = (char *)TABLE;
    uint8_t buf[512];
    size_t len = s->delete ? google__bigtable__admin__v2__delete_table_request__pack(&del, buf)
                           : google__iam__v1__set_iam_policy_request__pack(&req, buf);
    const char *method = s->delete     ? TA "DeleteTable"
                         : s->resource ? TA "SetIamPolicy"
                                       : IA "SetIamPolicy";
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    s->code = rpc_blocking_unary(s->addr, NULL, method, st_slice_make(buf, len), NULL, 0,
                                 TIMEOUT_MS, &resp, &err);
    snprintf(s->msg, sizeof s->msg, "%s", err.msg);
    st_buf_free(&resp);
}

static void *setter_main(void *arg) {
    setter *s = arg;
    pthread_barrier_wait(s->go);
    set_policy(s);
    return NULL;
}

/* Runs the n setters' calls at once (each on its own thread, released together). */
static void run_at_once(setter *s, int n) {
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)n);
    pthread_t th[8];
    for (int i = 0; i < n; i++) {
        s[i].go = &go;
        pthread_create(&th[i], NULL, setter_main, &s[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
}

/* Waits until both routers report the same etag (their metadata reloads converge), into out. */
static bool converged(const char *a, const char *b, char *out) {
    char eb[ETAG_MAX];
    for (int i = 0; i < 300; i++) {
        get_etag(a, out);
        get_etag(b, eb);
        if (out[0] && !strcmp(out, eb))
            return true;
        usleep(50 * 1000);
    }
    return false;
}

static bool race_round(const char *a, const char *b, int round) {
    char etag[ETAG_MAX];
    if (!converged(a, b, etag)) {
        printf("round %d: the routers never agreed on the policy's etag\n", round);
        return false;
    }
    setter s[2] = {{.addr = a}, {.addr = b}};
    for (int i = 0; i < 2; i++) {
        snprintf(s[i].member, sizeof s[i].member, "user:r%d-%c", round, 'a' + i);
        snprintf(s[i].etag, sizeof s[i].etag, "%s", etag);
    }
    run_at_once(s, 2);
    int ok = (s[0].code == ST_OK) + (s[1].code == ST_OK);
    int aborted = (s[0].code == ST_ABORTED) + (s[1].code == ST_ABORTED);
    printf("round %d: etag %s: A %s, B %s\n", round, etag, st_code_name(s[0].code),
           st_code_name(s[1].code));
    for (int i = 0; i < 2; i++)
        if (s[i].code != ST_OK && s[i].code != ST_ABORTED)
            printf("  %c: %s\n", 'A' + i, s[i].msg);
    return ok == 1 && aborted == 1;
}

/* Without etags through a and b at once: both succeed. */
static bool blind_round(const char *a, const char *b) {
    char etag[ETAG_MAX];
    if (!converged(a, b, etag))
        return false;
    setter s[2] = {{.addr = a}, {.addr = b}};
    for (int i = 0; i < 2; i++)
        snprintf(s[i].member, sizeof s[i].member, "user:blind-%c", 'a' + i);
    run_at_once(s, 2);
    printf("blind: no etag: A %s, B %s\n", st_code_name(s[0].code), st_code_name(s[1].code));
    return s[0].code == ST_OK && s[1].code == ST_OK;
}

/* A then B, one after the other, with the same etag: B's copy is stale, B must refuse. */
static bool stale_round(const char *a, const char *b) {
    char etag[ETAG_MAX];
    if (!converged(a, b, etag))
        return false;
    setter s[2] = {{.addr = a}, {.addr = b}};
    for (int i = 0; i < 2; i++) {
        snprintf(s[i].member, sizeof s[i].member, "user:stale-%c", 'a' + i);
        snprintf(s[i].etag, sizeof s[i].etag, "%s", etag);
        set_policy(&s[i]);
    }
    printf("stale: etag %s: A %s, then B %s %s\n", etag, st_code_name(s[0].code),
           st_code_name(s[1].code), s[1].msg);
    return s[0].code == ST_OK && s[1].code == ST_ABORTED;
}

static st_code create_table(const char *addr) {
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = (char *)INSTANCE;
    req.table_id = (char *)"t";
    req.table = &t;
    uint8_t buf[256];
    size_t len = google__bigtable__admin__v2__create_table_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err err = {0};
    st_code rc = rpc_blocking_unary(addr, NULL, TA "CreateTable", st_slice_make(buf, len), NULL, 0,
                                    TIMEOUT_MS, &resp, &err);
    st_buf_free(&resp);
    return rc;
}

/* The number of bindings of table t's policy (-1 on failure). */
static int table_bindings(const char *addr) {
    Google__Iam__V1__Policy *p = get_policy(addr, TA "GetIamPolicy", TABLE);
    int n = p ? (int)p->n_bindings : -1;
    if (p)
        google__iam__v1__policy__free_unpacked(p, NULL);
    return n;
}

/* SetIamPolicy of t three times and DeleteTable of t at once through a; then t again: it must
 * have no policy. */
static bool delete_round(const char *a, int round) {
    if (create_table(a) != ST_OK) {
        printf("delete %d: CreateTable t failed\n", round);
        return false;
    }
    setter s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (setter){.addr = a, .resource = TABLE, .delete = i == 3};
        snprintf(s[i].member, sizeof s[i].member, "user:del%d-%d", round, i);
    }
    run_at_once(s, 4);
    st_code again = create_table(a);
    int n = table_bindings(a);
    printf("delete %d: sets %s %s %s, delete %s; new table t: %s, %d bindings\n", round,
           st_code_name(s[0].code), st_code_name(s[1].code), st_code_name(s[2].code),
           st_code_name(s[3].code), st_code_name(again), n);
    for (int i = 0; i < 4; i++)
        if (s[i].code != ST_OK && s[i].code != ST_NOT_FOUND)
            printf("  %d: %s\n", i, s[i].msg);
    setter del = {.addr = a, .delete = true};
    set_policy(&del); /* DeleteTable, for the next round */
    return s[3].code == ST_OK && again == ST_OK && n == 0 && del.code == ST_OK;
}

int main(int argc, char **argv) {
    if (argc != 4 || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: iam_race ADDR_A ADDR_B ROUNDS\n");
        return 2;
    }
    bool pass = true;
    for (int r = 1; r <= atoi(argv[3]); r++)
        pass = race_round(argv[1], argv[2], r) && pass;
    pass = stale_round(argv[1], argv[2]) && pass;
    for (int r = 1; r <= 3; r++)
        pass = blind_round(argv[1], argv[2]) && pass;
    for (int r = 1; r <= atoi(argv[3]); r++)
        pass = delete_round(argv[1], r) && pass;
    printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
