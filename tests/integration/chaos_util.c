/* chaos_util.c — see chaos_util.h. */
#include "chaos_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"

char ci_dir[BT_PATH_MAX];
char ci_router[BT_ADDR_MAX];
st_topology ci_topo;

static char g_strata[BT_PATH_MAX];
static const char *g_test = "test";
static bool g_up;

static bool sibling_exists(const char *sub, const char *name) {
    char path[BT_PATH_MAX * 2];
    snprintf(path, sizeof path, "%s", g_strata);
    char *slash = strrchr(path, '/');
    if (!slash)
        return true; /* from $PATH: let strata up find them */
    *slash = '\0';
    slash = strrchr(path, '/');
    if (!slash)
        return true;
    *slash = '\0';
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/%s/%s", sub, name);
    return access(path, X_OK) == 0;
}

int ci_init(const char *test, int argc, char **argv) {
    g_test = test;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || access(argv[1], X_OK) != 0) {
        fprintf(stderr, "%s: usage: %s <path to strata>; skipping\n", test, test);
        return 77;
    }
    snprintf(g_strata, sizeof g_strata, "%s", argv[1]);
    if (!sibling_exists("node", "strata-node") || !sibling_exists("router", "strata-router")) {
        fprintf(stderr, "%s: strata-node or strata-router not built; skipping\n", test);
        return 77;
    }
    return 0;
}

int ci_strata(const char *const *args) {
    const char *argv[BT_ARGV_MAX];
    size_t n = 0;
    argv[n++] = g_strata;
    for (size_t i = 0; args[i] && n + 1 < BT_ARGV_MAX; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout); /* or the child's exit writes our buffered lines again */
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execv(g_strata, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (pid < 0 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

void ci_strata_ok(const char *const *args) {
    int rc = ci_strata(args);
    if (rc != 0)
        ci_fail("`strata %s %s` exited with %d", args[0], args[1] ? args[1] : "", rc);
}

pid_t ci_pid(const char *name) {
    char path[BT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/run/%s.pid", ci_dir, name);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (!f || fscanf(f, "%ld", &pid) != 1)
        ci_fail("no pid in %s", path);
    fclose(f);
    return (pid_t)pid;
}

void ci_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: FAIL: ", g_test);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(instance logs: %s/logs)\n", ci_dir);
    va_end(ap);
    if (g_up) { /* keep the logs of a failed run: stop the processes, keep the directory */
        g_up = false;
        const char *down[] = {"down", "--dir", ci_dir, NULL};
        ci_strata(down);
    }
    exit(1);
}

void ci_up(int clusters, int nodes) {
    ci_up_with(clusters, nodes, NULL);
}

void ci_up_with(int clusters, int nodes, const char *const *extra) {
    uint16_t port = bt_free_port();
    char port_s[16], cl_s[16], nodes_s[16], topo_path[BT_PATH_MAX + 16];
    snprintf(port_s, sizeof port_s, "%u", port);
    snprintf(cl_s, sizeof cl_s, "%d", clusters);
    snprintf(nodes_s, sizeof nodes_s, "%d", nodes);
    bt_tmpdir(ci_dir, sizeof ci_dir, g_test);
    const char *up[BT_ARGV_MAX] = {"up",         "--dir", ci_dir,    "--port", port_s,
                                   "--clusters", cl_s,    "--nodes", nodes_s};
    size_t n = 9;
    for (size_t i = 0; extra && extra[i] && n + 1 < BT_ARGV_MAX; i++)
        up[n++] = extra[i];
    up[n] = NULL;
    g_up = true;
    ci_strata_ok(up);
    snprintf(topo_path, sizeof topo_path, "%s/topology", ci_dir);
    st_err err = {0};
    if (st_topology_load(topo_path, &ci_topo, &err) != ST_OK)
        ci_fail("%s", err.msg);
    snprintf(ci_router, sizeof ci_router, "127.0.0.1:%u", port);
}

void ci_down(void) {
    if (!g_up)
        return;
    g_up = false;
    bool keep = getenv("STRATA_TEST_KEEP") != NULL; /* to read the logs of a passing run */
    const char *down[] = {"down", "--dir", ci_dir, keep ? NULL : "--purge", NULL};
    ci_strata(down);
    if (!keep)
        bt_rmrf(ci_dir);
}

void ci_client(bt_client *c, const char *profile) {
    bt_client_init(c, ci_router);
    snprintf(c->app_profile, sizeof c->app_profile, "%s", profile);
}

long ci_env_long(const char *name, long def) {
    const char *v = getenv(name);
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && x > 0 ? x : def;
}

long long ci_now_ms(void) {
    return (long long)(st_mono_us() / 1000);
}

int ci_op_poll(const char *name, st_code *code, char *msg, size_t cap) {
    Google__Longrunning__GetOperationRequest req;
    google__longrunning__get_operation_request__init(&req);
    req.name = (char *)name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    Google__Longrunning__Operation *o = NULL;
    if (bt_call_pb(ci_router, "/google.longrunning.Operations/GetOperation", &req.base, 10000,
                   &resp, &st) == ST_OK)
        o = google__longrunning__operation__unpack(NULL, resp.len, resp.data);
    st_buf_free(&resp);
    if (!o)
        return -1;
    int done = o->done ? 1 : 0;
    bool err = o->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    *code = done && err ? (st_code)o->error->code : ST_OK;
    snprintf(msg, cap, "%s", done && err ? o->error->message : "");
    google__longrunning__operation__free_unpacked(o, NULL);
    return done;
}

st_code ci_op_wait(const char *name, int polls, char *msg, size_t cap) {
    st_code code = ST_OK;
    for (int i = 0; i < polls; i++) {
        if (ci_op_poll(name, &code, msg, cap) == 1)
            return code;
        usleep(100 * 1000);
    }
    ci_fail("operation %s not done after %d polls", name, polls);
}

st_code ci_create_backup(const char *cluster, const char *table, const char *id, int64_t expire_s,
                         int64_t hot_s, char *op, size_t cap, st_err *st) {
    Google__Protobuf__Timestamp exp, hot;
    google__protobuf__timestamp__init(&exp);
    google__protobuf__timestamp__init(&hot);
    exp.seconds = st_wall_us() / 1000000 + expire_s;
    hot.seconds = st_wall_us() / 1000000 + hot_s;
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = (char *)table;
    b.expire_time = &exp;
    if (hot_s > 0) {
        b.backup_type = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT;
        b.hot_to_standard_time = &hot;
    }
    Google__Bigtable__Admin__V2__CreateBackupRequest req;
    google__bigtable__admin__v2__create_backup_request__init(&req);
    req.parent = (char *)cluster;
    req.backup_id = (char *)id;
    req.backup = &b;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = bt_call_pb(ci_router, "/google.bigtable.admin.v2.BigtableTableAdmin/CreateBackup",
                            &req.base, 30000, &resp, st);
    Google__Longrunning__Operation *o =
        rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    if (o)
        snprintf(op, cap, "%s", o->name);
    else if (rc == ST_OK)
        rc = st_err_set(st, ST_INTERNAL, "CreateBackup answered no Operation");
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    st_buf_free(&resp);
    return rc;
}
