/* ops/backup.c — `strata backup`: create, list, describe, delete and restore backups through the
 * router's Cloud Bigtable admin API (docs/backups.md, docs/operations.md "Backups with strata
 * backup"); export, import and verify are in backup_xfer.c. Human output by default, --json for
 * scripts; results on stdout, progress and errors on stderr. */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backup_cli.h"
#include "certs.h"
#include "changes.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "instance.h"
#include "strata/btutil.h"
#include "strata/topology.h"

#define BK_EXPIRE_DEFAULT "7d"
#define BK_LIST_PAGE 100

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata backup <subcommand> [flags]\n"
            "  create TABLE [--cluster C] [--id ID] [--expire 7d] [--type standard|hot] [--wait]\n"
            "                         [--hot-until 2d]  (HOT, turning STANDARD then)\n"
            "  list [--cluster C|-] [--filter F] [--order-by O]\n"
            "  describe ID            show one backup\n"
            "  delete ID              delete a backup (its files go when no table shares them)\n"
            "  update ID --expire 30d set a backup's expire time\n"
            "  copy ID --to CLUSTER [--as NEWID] [--expire 7d] [--wait]   copy a READY backup\n"
            "                         into a cluster (NEWID default: ID; copies expire in 30d\n"
            "                         at most)\n"
            "  restore ID --to TABLE [--wait]\n"
            "  restore ID --to TABLE --target HOST:PORT|DIR [--instance I]   into another\n"
            "                         instance: its router, or its `strata up` directory\n"
            "  export ID DIR          copy a backup into a new directory (from the nodes)\n"
            "  verify DIR             check an export: manifest and every file's checksums\n"
            "  import DIR --cluster C [--as ID]   load an export as a backup of cluster C\n"
            "Common flags:\n"
            "  --endpoint H:P     the router (default: the router of the instance in --dir)\n"
            "  --dir DIR          a local instance (default $STRATA_HOME, else ~/.strata/local)\n"
            "  --project P --instance I   default: the instance's (p / i with --endpoint)\n"
            "  --cluster C        the backup's cluster (default: the instance's first cluster)\n"
            "  --tls-ca FILE      the CA of a TLS router (default: DIR/secure/ca.pem of a secure\n"
            "                     instance in --dir)\n"
            "  --token-file FILE  the bearer token for the router (default: the admin token of\n"
            "                     DIR/secure/tokens); --token TOKEN gives it on the command line\n"
            "  --json             machine-readable output on stdout\n"
            "  --quiet            no progress on stderr\n"
            "ID is a backup id of --cluster, or projects/P/instances/I/clusters/C/backups/B.\n"
            "--expire is from now (6h to 90d; default 7d; update needs it). restore --target\n"
            "copies the backup to the other instance through this machine (an export in\n"
            "$TMPDIR, an import under a temporary id, deleted after) and waits. --wait polls\n"
            "the operation with progress.\n"
            "Exit status: 0 done, 1 failed, 2 bad usage.\n");
}

/* ---- flags ---- */

static const char **flag_slot(bk_args *a, const char *f) {
    static const struct {
        const char *name;
        size_t off;
    } flags[] = {
        {"--endpoint", offsetof(bk_args, endpoint)},
        {"--router", offsetof(bk_args, endpoint)},
        {"--dir", offsetof(bk_args, dir)},
        {"--project", offsetof(bk_args, project)},
        {"--instance", offsetof(bk_args, instance)},
        {"--cluster", offsetof(bk_args, cluster)},
        {"--expire", offsetof(bk_args, expire)},
        {"--type", offsetof(bk_args, type)},
        {"--to", offsetof(bk_args, to)},
        {"--as", offsetof(bk_args, as)},
        {"--filter", offsetof(bk_args, filter)},
        {"--order-by", offsetof(bk_args, order_by)},
        {"--id", offsetof(bk_args, id)},
        {"--target", offsetof(bk_args, target)},
        {"--hot-until", offsetof(bk_args, hot_until)},
        {"--tls-ca", offsetof(bk_args, tls_ca)},
        {"--token", offsetof(bk_args, token)},
        {"--token-file", offsetof(bk_args, token_file)},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(f, flags[i].name))
            return (const char **)((char *)a + flags[i].off);
    return NULL;
}

/* 0 parsed, 1 help shown, 2 bad usage. */
static int parse_args(int argc, char **argv, bk_args *a, const char **sub) {
    memset(a, 0, sizeof *a);
    *sub = NULL;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **slot = flag_slot(a, f);
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(f, "--json")) {
            a->json = true;
        } else if (!strcmp(f, "--quiet")) {
            a->quiet = true;
        } else if (!strcmp(f, "--wait")) {
            a->wait = true;
        } else if (slot && v) {
            *slot = v;
            i++;
        } else if (f[0] != '-' && !*sub) {
            *sub = f;
        } else if (f[0] != '-' && a->n_pos < 2) {
            a->pos[a->n_pos++] = f;
        } else {
            fprintf(stderr,
                    "strata backup: bad flag, missing value or extra argument: %s (see "
                    "strata backup --help)\n",
                    f);
            return 2;
        }
    }
    return 0;
}

/* The router's address, project, instance and default cluster. False after printing why. */
static bool resolve(bk_ctx *c) {
    const bk_args *a = &c->a;
    static st_topology topo; /* large: not on the stack */
    snprintf(c->project, sizeof c->project, "%s", a->project ? a->project : "p");
    snprintf(c->instance, sizeof c->instance, "%s", a->instance ? a->instance : "i");
    if (!a->endpoint || a->dir) {
        if (!ops_inst_topology("strata backup", a->dir, &topo))
            return false;
        snprintf(c->project, sizeof c->project, "%s", a->project ? a->project : topo.project);
        snprintf(c->instance, sizeof c->instance, "%s", a->instance ? a->instance : topo.instance);
        snprintf(c->cluster, sizeof c->cluster, "%s", topo.clusters[0].id);
        c->topo = &topo;
        if (!a->endpoint &&
            !ops_inst_router_pick("strata backup", &topo, a->dir, c->addr, sizeof c->addr))
            return false;
    }
    if (a->endpoint)
        snprintf(c->addr, sizeof c->addr, "%s", a->endpoint);
    snprintf(c->home_instance, sizeof c->home_instance, "%s",
             a->endpoint && !a->dir ? "i" : topo.instance);
    if (a->cluster)
        snprintf(c->cluster, sizeof c->cluster, "%s", a->cluster);
    /* after ops_inst_topology: it names the instance's credentials, which the flags override */
    return ops_secure_flags("strata backup", a->tls_ca, a->token, a->token_file);
}

const char *bk_leaf(const char *name) {
    const char *s = strrchr(name, '/');
    return s ? s + 1 : name;
}

bool bk_backup_name(const bk_ctx *c, const char *id, char *out, size_t cap) {
    if (!strncmp(id, "projects/", 9))
        return ops_fmt(out, cap, "%s", id);
    if (!c->cluster[0]) {
        fprintf(stderr,
                "strata backup: which cluster holds backup %s? give --cluster C or the "
                "full name projects/P/instances/I/clusters/C/backups/%s\n",
                id, id);
        return false;
    }
    return ops_fmt(out, cap, "projects/%s/instances/%s/clusters/%s/backups/%s", c->project,
                   c->instance, c->cluster, id);
}

bool bk_table_name(const bk_ctx *c, const char *id, char *out, size_t cap) {
    if (!strncmp(id, "projects/", 9))
        return ops_fmt(out, cap, "%s", id);
    return ops_fmt(out, cap, "projects/%s/instances/%s/tables/%s", c->project, c->instance, id);
}

/* ---- a backup id not found in its cluster ---- */

/* The other clusters holding a backup of id (the last component of every name the listing
 * answers compared exactly: the filter matches a substring), comma-separated into out, the
 * first also into first; how many. parent: projects/P/instances/I/clusters/-. A failed listing
 * finds none: this is only a hint. */
static size_t clusters_holding(const bk_ctx *c, const char *parent, const char *id,
                               const char *name, char *out, size_t cap, char *first, size_t fcap) {
    char filter[128], token[1024] = "";
    size_t n = 0, len = 0;
    snprintf(filter, sizeof filter, "name:\"/backups/%s\"", id);
    for (int page = 0; page < 10 && (page == 0 || token[0]); page++) {
        Google__Bigtable__Admin__V2__ListBackupsRequest req;
        google__bigtable__admin__v2__list_backups_request__init(&req);
        req.parent = (char *)parent;
        req.filter = filter;
        req.page_size = BK_LIST_PAGE;
        req.page_token = token;
        ProtobufCMessage *m = NULL;
        st_err lerr = {0};
        if (bk_router_call(c, BK_SVC_ADMIN "ListBackups", &req.base,
                           &google__bigtable__admin__v2__list_backups_response__descriptor, &m,
                           &lerr) != ST_OK)
            break;
        Google__Bigtable__Admin__V2__ListBackupsResponse *r = (void *)m;
        for (size_t i = 0; i < r->n_backups; i++) {
            const char *b = r->backups[i]->name ? r->backups[i]->name : "";
            const char *cl = strstr(b, "/clusters/");
            if (!cl || strcmp(bk_leaf(b), id) || !strcmp(b, name))
                continue;
            int w = (int)strcspn(cl + 10, "/");
            if (n++ == 0)
                snprintf(first, fcap, "%.*s", w, cl + 10);
            if (len < cap)
                len +=
                    (size_t)snprintf(out + len, cap - len, "%s%.*s", n > 1 ? ", " : "", w, cl + 10);
        }
        snprintf(token, sizeof token, "%s", r->next_page_token ? r->next_page_token : "");
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return n;
}

/* Appends flag and value to out (nothing when value is NULL). */
static void cmd_cat(char *out, size_t cap, const char *flag, const char *value) {
    size_t len = strlen(out);
    if (value && len < cap)
        snprintf(out + len, cap - len, "%s%s", flag, value);
}

/* The command line of this subcommand for backup id in cluster (with --cluster). */
static void cmd_with_cluster(const bk_ctx *c, const char *cluster, const char *id, char *out,
                             size_t cap) {
    const bk_args *a = &c->a;
    const char *sub = c->nested ? "restore" : c->sub; /* the export of restore --target */
    snprintf(out, cap, "strata backup");
    cmd_cat(out, cap, " --dir ", a->dir);
    cmd_cat(out, cap, " --endpoint ", a->endpoint);
    cmd_cat(out, cap, " --cluster ", cluster);
    cmd_cat(out, cap, " ", sub);
    cmd_cat(out, cap, " ", id);
    if (!strcmp(sub, "restore") || !strcmp(sub, "copy"))
        cmd_cat(out, cap, " --to ", a->to);
    cmd_cat(out, cap, " --target ", a->target);
    if (!strcmp(sub, "export") && a->n_pos > 1)
        cmd_cat(out, cap, " ", a->pos[1]);
    if (!strcmp(sub, "update"))
        cmd_cat(out, cap, " --expire ", a->expire);
    cmd_cat(out, cap, a->wait ? " --wait" : "", "");
}

void bk_not_found_hint(const bk_ctx *c, const char *id, const char *name, st_err *err) {
    const char *cl = strstr(name, "/clusters/");
    if (err->code != ST_NOT_FOUND || !strncmp(id, "projects/", 9) || !cl || !strstr(err->msg, name))
        return;
    char parent[BK_RES_MAX], list[256] = "", first[128] = "", cmd[1024], msg[ST_ERR_MSG_MAX];
    snprintf(parent, sizeof parent, "%.*s/clusters/-", (int)(cl - name), name);
    size_t n = clusters_holding(c, parent, id, name, list, sizeof list, first, sizeof first);
    if (n == 0)
        return;
    snprintf(msg, sizeof msg, "%s", err->msg);
    if (n > 1) {
        st_err_set(err, ST_NOT_FOUND,
                   "%s Backups %s exist in clusters %s (without --cluster, `strata backup` "
                   "looks in cluster %.*s): name one with --cluster C",
                   msg, id, list, (int)strcspn(cl + 10, "/"), cl + 10);
        return;
    }
    cmd_with_cluster(c, first, id, cmd, sizeof cmd);
    st_err_set(err, ST_NOT_FOUND,
               "%s A backup %s exists in cluster %s (without --cluster, `strata backup` looks "
               "in cluster %.*s): run `%s`",
               msg, id, first, (int)strcspn(cl + 10, "/"), cl + 10, cmd);
}

void bk_fail(const bk_ctx *c, const st_err *err) {
    fprintf(stderr, "strata backup %s: %s\n", c->sub, err->msg);
}

/* Where the result of this command shows (a restore's table, or the backup itself), for advice
 * on following an operation or learning an unknown outcome. */
static const char *result_where(const bk_ctx *c) {
    static char out[BK_RES_MAX + 128];
    if (!strcmp(c->sub, "restore"))
        return "`cbt ls` (the table is listed once the restore has ended)";
    if (!strcmp(c->sub, "delete") || !strcmp(c->sub, "update"))
        snprintf(out, sizeof out, "`strata backup describe %s` (%s)",
                 c->a.n_pos ? c->a.pos[0] : "ID",
                 c->sub[0] == 'd' ? "NOT_FOUND once deleted" : "its expire time");
    else
        snprintf(out, sizeof out, "`strata backup list%s%s` (the backup is CREATING until READY)",
                 c->a.to ? " --cluster " : "", c->a.to ? c->a.to : "");
    return out;
}

void bk_say_unknown(const bk_ctx *c, const char *what) {
    fprintf(stderr,
            "strata backup %s: %s. Check with %s once the router answers again (`strata status "
            "--dir %s` shows it; `strata up --dir %s` starts it if it stopped), and run the "
            "command again only if it did not take effect (a new one meets ALREADY_EXISTS for "
            "what the first one made)\n",
            c->sub, what, result_where(c), ops_hint_dir(), ops_hint_dir());
}

/* ---- printing ---- */

static void ts_fmt(const Google__Protobuf__Timestamp *t, char out[OPS_CS_TIME_MAX]) {
    if (!t) {
        snprintf(out, OPS_CS_TIME_MAX, "-");
        return;
    }
    ops_cs_time_format(t->seconds * 1000000 + t->nanos / 1000, out);
}

static const char *state_name(int s) {
    return s == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY      ? "READY"
           : s == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING ? "CREATING"
                                                                       : "UNSPECIFIED";
}

static const char *type_name(int t) {
    return t == GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT ? "HOT" : "STANDARD";
}

/* A JSON string: quotes and backslashes escaped, control bytes dropped (names and paths). */
void bk_json_str(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        if ((unsigned char)*s >= 0x20)
            putchar(*s);
    }
    putchar('"');
}

static void print_backup_json(const Google__Bigtable__Admin__V2__Backup *b) {
    char st[OPS_CS_TIME_MAX], en[OPS_CS_TIME_MAX], ex[OPS_CS_TIME_MAX];
    ts_fmt(b->start_time, st);
    ts_fmt(b->end_time, en);
    ts_fmt(b->expire_time, ex);
    printf("{\"name\":");
    bk_json_str(b->name);
    printf(",\"id\":");
    bk_json_str(bk_leaf(b->name));
    printf(",\"source_table\":");
    bk_json_str(b->source_table);
    printf(",\"state\":\"%s\",\"backup_type\":\"%s\",\"size_bytes\":%lld,\"start_time\":\"%s\","
           "\"end_time\":\"%s\",\"expire_time\":\"%s\"",
           state_name(b->state), type_name(b->backup_type), (long long)b->size_bytes, st, en, ex);
    if (b->hot_to_standard_time) {
        char hot[OPS_CS_TIME_MAX];
        ts_fmt(b->hot_to_standard_time, hot);
        printf(",\"hot_to_standard_time\":\"%s\"", hot);
    }
    putchar('}');
}

void bk_print_backup(const bk_ctx *c, const Google__Bigtable__Admin__V2__Backup *b) {
    if (c->a.json) {
        print_backup_json(b);
        putchar('\n');
        return;
    }
    char st[OPS_CS_TIME_MAX], en[OPS_CS_TIME_MAX], ex[OPS_CS_TIME_MAX], size[32];
    ts_fmt(b->start_time, st);
    ts_fmt(b->end_time, en);
    ts_fmt(b->expire_time, ex);
    ops_progress_bytes((uint64_t)b->size_bytes, size, sizeof size);
    printf("name:         %s\nsource_table: %s\nstate:        %s\ntype:         %s\n"
           "size:         %s (%lld bytes)\nstart_time:   %s\nend_time:     %s\nexpire_time:  %s\n",
           b->name, b->source_table, state_name(b->state), type_name(b->backup_type), size,
           (long long)b->size_bytes, st, en, ex);
    if (b->hot_to_standard_time) {
        char hot[OPS_CS_TIME_MAX];
        ts_fmt(b->hot_to_standard_time, hot);
        printf("hot_until:    %s\n", hot);
    }
}

/* ---- long-running operations ---- */

/* The progress percent of RestoreTableMetadata or CopyBackupMetadata, or -1. */
static int op_percent(const Google__Longrunning__Operation *op) {
    if (!op->metadata || !op->metadata->type_url)
        return -1;
    const ProtobufCBinaryData *v = &op->metadata->value;
    int pct = -1;
    if (strstr(op->metadata->type_url, "RestoreTableMetadata")) {
        Google__Bigtable__Admin__V2__RestoreTableMetadata *md =
            google__bigtable__admin__v2__restore_table_metadata__unpack(NULL, v->len, v->data);
        pct = md && md->progress ? md->progress->progress_percent : -1;
        if (md)
            google__bigtable__admin__v2__restore_table_metadata__free_unpacked(md, NULL);
    } else if (strstr(op->metadata->type_url, "CopyBackupMetadata")) {
        Google__Bigtable__Admin__V2__CopyBackupMetadata *md =
            google__bigtable__admin__v2__copy_backup_metadata__unpack(NULL, v->len, v->data);
        pct = md && md->progress ? md->progress->progress_percent : -1;
        if (md)
            google__bigtable__admin__v2__copy_backup_metadata__free_unpacked(md, NULL);
    }
    return pct;
}

/* Polls GetOperation until done; *out is the finished operation (free it). */
/* A router that restarts or fails over answers UNAVAILABLE for a while; the operation goes on
 * (operations are kept in the instance's metadata), so --wait keeps polling for up to
 * BK_WAIT_UNAVAILABLE_MS before it gives up. */
static bool op_wait_retry(int64_t *since) {
    int64_t now = st_mono_us();
    if (!*since)
        *since = now;
    return now - *since < (int64_t)BK_WAIT_UNAVAILABLE_MS * 1000;
}

/* --wait gave up on a router that stayed unreachable: how the operation ended is not known
 * here, so say how to find out (docs/backups.md: a router's sweep ends it when one runs). */
static void op_wait_lost(const bk_ctx *c, const char *name) {
    char what[BK_RES_MAX + 256];
    snprintf(what, sizeof what,
             "no answer from the router for %d s, so how operation %s ends is unknown: once a "
             "router runs again it ends it (done if its work had committed, else ABORTED with "
             "its partial work removed)",
             BK_WAIT_UNAVAILABLE_MS / 1000, name);
    bk_say_unknown(c, what);
}

st_code bk_op_wait(const bk_ctx *c, Google__Longrunning__Operation *op,
                   Google__Longrunning__Operation **out, st_err *err) {
    ops_progress p;
    char label[64];
    snprintf(label, sizeof label, "strata backup %s", c->sub);
    ops_progress_init(&p, label, OPS_PROGRESS_PERCENT, 100, c->a.quiet);
    char name[BK_RES_MAX];
    snprintf(name, sizeof name, "%s", op->name ? op->name : "");
    Google__Longrunning__Operation *cur = op;
    st_code rc = ST_OK;
    int64_t unavailable_since = 0;
    while (rc == ST_OK && !cur->done) {
        int pct = op_percent(cur);
        ops_progress_set(&p, pct > 0 ? (uint64_t)pct : 0);
        usleep(BK_POLL_MS * 1000);
        Google__Longrunning__GetOperationRequest req;
        google__longrunning__get_operation_request__init(&req);
        req.name = name;
        ProtobufCMessage *next = NULL;
        rc = bk_router_call(c, BK_SVC_OPS "GetOperation", &req.base,
                            &google__longrunning__operation__descriptor, &next, err);
        if (rc == ST_OK) {
            google__longrunning__operation__free_unpacked(cur, NULL);
            cur = (Google__Longrunning__Operation *)next;
            unavailable_since = 0;
        } else if (rc == ST_UNAVAILABLE && op_wait_retry(&unavailable_since)) {
            st_err_clear(err); /* a router restarting: its operations outlive it */
            rc = ST_OK;
        }
    }
    bool ok = rc == ST_OK && cur->result_case != GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    ops_progress_finish(&p, ok);
    if (rc == ST_UNAVAILABLE)
        op_wait_lost(c, name);
    if (rc == ST_OK && !ok)
        rc =
            st_err_set(err, cur->error && cur->error->code ? (st_code)cur->error->code : ST_UNKNOWN,
                       "operation %s failed: %s", name,
                       cur->error && cur->error->message ? cur->error->message : "no message");
    *out = cur;
    return rc;
}

/* Prints the operation started (no --wait), or waits and returns the finished one. */
static st_code op_finish(const bk_ctx *c, ProtobufCMessage *started,
                         Google__Longrunning__Operation **done, st_err *err) {
    Google__Longrunning__Operation *op = (Google__Longrunning__Operation *)started;
    *done = NULL;
    if (c->a.wait)
        return bk_op_wait(c, op, done, err);
    if (c->a.json) {
        printf("{\"operation\":");
        bk_json_str(op->name);
        printf(",\"done\":%s}\n", op->done ? "true" : "false");
    } else {
        printf("started: operation %s; follow it with %s\n", op->name, result_where(c));
    }
    google__longrunning__operation__free_unpacked(op, NULL);
    return ST_OK;
}

/* GetBackup of name, printed (after create --wait, update, copy --wait). */
static st_code show_backup(const bk_ctx *c, const char *name, st_err *err) {
    Google__Bigtable__Admin__V2__GetBackupRequest g;
    google__bigtable__admin__v2__get_backup_request__init(&g);
    g.name = (char *)name;
    ProtobufCMessage *b = NULL;
    st_code rc = bk_router_call(c, BK_SVC_ADMIN "GetBackup", &g.base,
                                &google__bigtable__admin__v2__backup__descriptor, &b, err);
    if (rc == ST_OK)
        bk_print_backup(c, (Google__Bigtable__Admin__V2__Backup *)b);
    if (b)
        protobuf_c_message_free_unpacked(b, NULL);
    return rc;
}

/* ---- create, list, describe, delete, restore, update, copy ---- */

/* A time flag: a duration from now (6h, 7d) or an RFC 3339 time. */
static bool parse_when(const char *flag, const char *e, Google__Protobuf__Timestamp *ts) {
    char rel[64];
    int64_t now = st_wall_us(), at = 0;
    snprintf(rel, sizeof rel, "+%s", e);
    if (!ops_cs_time_parse(rel, now, &at) && !ops_cs_time_parse(e, now, &at)) {
        fprintf(stderr,
                "strata backup: bad %s '%s': a duration from now (6h, 7d, 90d) or "
                "an RFC 3339 time\n",
                flag, e);
        return false;
    }
    ts->seconds = at / 1000000;
    ts->nanos = (int32_t)(at % 1000000 * 1000);
    return true;
}

static bool parse_expire(const bk_ctx *c, Google__Protobuf__Timestamp *ts) {
    return parse_when("--expire", c->a.expire ? c->a.expire : BK_EXPIRE_DEFAULT, ts);
}

static int cmd_create(bk_ctx *c) {
    char table[BK_RES_MAX], parent[BK_RES_MAX], id[256];
    if (c->a.n_pos != 1) {
        fprintf(stderr, "strata backup create: want one TABLE (see strata backup --help)\n");
        return 2;
    }
    Google__Protobuf__Timestamp expire;
    google__protobuf__timestamp__init(&expire);
    Google__Protobuf__Timestamp hot;
    google__protobuf__timestamp__init(&hot);
    if (!parse_expire(c, &expire) ||
        (c->a.hot_until && !parse_when("--hot-until", c->a.hot_until, &hot)))
        return 2;
    if (c->a.hot_until && c->a.type && strcmp(c->a.type, "hot")) {
        fprintf(stderr, "strata backup create: --hot-until is for HOT backups (--type hot)\n");
        return 2;
    }
    if (c->a.type && strcmp(c->a.type, "standard") && strcmp(c->a.type, "hot")) {
        fprintf(stderr, "strata backup create: --type is standard or hot\n");
        return 2;
    }
    if (!c->cluster[0]) {
        fprintf(stderr, "strata backup create: give --cluster C (the cluster to back up in)\n");
        return 2;
    }
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    if (c->a.id)
        snprintf(id, sizeof id, "%s", c->a.id);
    else
        snprintf(id, sizeof id, "%.200s-%04d%02d%02d-%02d%02d%02d", bk_leaf(c->a.pos[0]),
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (!bk_table_name(c, c->a.pos[0], table, sizeof table) ||
        !ops_fmt(parent, sizeof parent, "projects/%s/instances/%s/clusters/%s", c->project,
                 c->instance, c->cluster))
        return 2;
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.source_table = table;
    b.expire_time = &expire;
    b.backup_type = (c->a.type && !strcmp(c->a.type, "hot")) || c->a.hot_until
                        ? GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__HOT
                        : GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__BACKUP_TYPE__STANDARD;
    b.hot_to_standard_time = c->a.hot_until ? &hot : NULL;
    Google__Bigtable__Admin__V2__CreateBackupRequest req;
    google__bigtable__admin__v2__create_backup_request__init(&req);
    req.parent = parent;
    req.backup_id = id;
    req.backup = &b;
    ProtobufCMessage *op = NULL;
    Google__Longrunning__Operation *done = NULL;
    st_err err = {0};
    st_code rc = bk_router_call(c, BK_SVC_ADMIN "CreateBackup", &req.base,
                                &google__longrunning__operation__descriptor, &op, &err);
    if (rc == ST_OK)
        rc = op_finish(c, op, &done, &err);
    if (done)
        google__longrunning__operation__free_unpacked(done, NULL);
    if (rc == ST_OK && c->a.wait) { /* the backup as it now stands: READY, with its size */
        char name[BK_RES_MAX];
        if (!ops_fmt(name, sizeof name, "%s/backups/%s", parent, id))
            return 2;
        rc = show_backup(c, name, &err);
    }
    if (rc != ST_OK)
        bk_fail(c, &err);
    return rc == ST_OK ? 0 : 1;
}

static void print_list_row(const bk_ctx *c, const Google__Bigtable__Admin__V2__Backup *b,
                           bool first) {
    if (c->a.json) {
        printf("%s", first ? "[" : ",\n ");
        print_backup_json(b);
        return;
    }
    char size[32], ex[OPS_CS_TIME_MAX], cluster[128] = "-";
    const char *cl = strstr(b->name ? b->name : "", "/clusters/");
    if (cl)
        snprintf(cluster, sizeof cluster, "%.*s", (int)strcspn(cl + 10, "/"), cl + 10);
    ops_progress_bytes((uint64_t)b->size_bytes, size, sizeof size);
    ts_fmt(b->expire_time, ex);
    printf("%-28s %-12s %-20s %-9s %-10s %s\n", bk_leaf(b->name), cluster,
           bk_leaf(b->source_table ? b->source_table : ""), state_name(b->state), size, ex);
}

static int cmd_list(bk_ctx *c) {
    char parent[BK_RES_MAX], token[1024] = "";
    const char *cl = c->a.cluster ? c->a.cluster : "-";
    if (!ops_fmt(parent, sizeof parent, "projects/%s/instances/%s/clusters/%s", c->project,
                 c->instance, cl))
        return 2;
    size_t n = 0;
    st_err err = {0};
    st_code rc = ST_OK;
    do {
        Google__Bigtable__Admin__V2__ListBackupsRequest req;
        google__bigtable__admin__v2__list_backups_request__init(&req);
        req.parent = parent;
        req.filter = (char *)(c->a.filter ? c->a.filter : "");
        req.order_by = (char *)(c->a.order_by ? c->a.order_by : "");
        req.page_size = BK_LIST_PAGE;
        req.page_token = token;
        ProtobufCMessage *m = NULL;
        rc = bk_router_call(c, BK_SVC_ADMIN "ListBackups", &req.base,
                            &google__bigtable__admin__v2__list_backups_response__descriptor, &m,
                            &err);
        if (rc != ST_OK)
            break;
        Google__Bigtable__Admin__V2__ListBackupsResponse *r = (void *)m;
        /* The header once the router answered: on a failure stdout stays empty, so a script
         * reading it does not take the header alone for "no backups". */
        if (!c->a.json && !token[0])
            printf("%-28s %-12s %-20s %-9s %-10s %s\n", "BACKUP", "CLUSTER", "TABLE", "STATE",
                   "SIZE", "EXPIRES");
        for (size_t i = 0; i < r->n_backups; i++, n++)
            print_list_row(c, r->backups[i], n == 0);
        snprintf(token, sizeof token, "%s", r->next_page_token ? r->next_page_token : "");
        protobuf_c_message_free_unpacked(m, NULL);
    } while (token[0]);
    if (c->a.json && rc == ST_OK)
        printf(n ? "]\n" : "[]\n");
    if (rc != ST_OK)
        bk_fail(c, &err);
    return rc == ST_OK ? 0 : 1;
}

/* A call answered with a Backup (GetBackup, UpdateBackup of backup name): prints it, or the
 * error; the exit status. */
static int backup_call_print(bk_ctx *c, const char *method, const ProtobufCMessage *req,
                             const char *name) {
    ProtobufCMessage *m = NULL;
    st_err err = {0};
    st_code rc =
        bk_router_call(c, method, req, &google__bigtable__admin__v2__backup__descriptor, &m, &err);
    if (rc == ST_OK)
        bk_print_backup(c, (Google__Bigtable__Admin__V2__Backup *)m);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    if (rc != ST_OK) {
        bk_not_found_hint(c, c->a.pos[0], name, &err);
        bk_fail(c, &err);
    }
    return rc == ST_OK ? 0 : 1;
}

/* describe and delete: one backup by name. */
static int cmd_one(bk_ctx *c, bool del) {
    char name[BK_RES_MAX];
    if (c->a.n_pos != 1) {
        fprintf(stderr, "strata backup %s: want one backup ID\n", c->sub);
        return 2;
    }
    if (!bk_backup_name(c, c->a.pos[0], name, sizeof name))
        return 2;
    if (!del) {
        Google__Bigtable__Admin__V2__GetBackupRequest req;
        google__bigtable__admin__v2__get_backup_request__init(&req);
        req.name = name;
        return backup_call_print(c, BK_SVC_ADMIN "GetBackup", &req.base, name);
    }
    Google__Bigtable__Admin__V2__DeleteBackupRequest req;
    google__bigtable__admin__v2__delete_backup_request__init(&req);
    req.name = name;
    st_err err = {0};
    st_code rc = bk_router_call(c, BK_SVC_ADMIN "DeleteBackup", &req.base, NULL, NULL, &err);
    if (rc == ST_OK && c->a.json)
        printf("{\"deleted\":\"%s\"}\n", name);
    else if (rc == ST_OK)
        printf("deleted %s\n", name);
    if (rc != ST_OK) {
        bk_not_found_hint(c, c->a.pos[0], name, &err);
        bk_fail(c, &err);
    }
    return rc == ST_OK ? 0 : 1;
}

static int cmd_update(bk_ctx *c) {
    char name[BK_RES_MAX];
    if (c->a.n_pos != 1 || !c->a.expire) {
        fprintf(stderr, "strata backup update: want ID --expire WHEN (see strata backup --help)\n");
        return 2;
    }
    Google__Protobuf__Timestamp expire;
    google__protobuf__timestamp__init(&expire);
    if (!bk_backup_name(c, c->a.pos[0], name, sizeof name) || !parse_expire(c, &expire))
        return 2;
    Google__Bigtable__Admin__V2__Backup b;
    google__bigtable__admin__v2__backup__init(&b);
    b.name = name;
    b.expire_time = &expire;
    char *paths[] = {"expire_time"};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.paths = paths;
    mask.n_paths = 1;
    Google__Bigtable__Admin__V2__UpdateBackupRequest req;
    google__bigtable__admin__v2__update_backup_request__init(&req);
    req.backup = &b;
    req.update_mask = &mask;
    return backup_call_print(c, BK_SVC_ADMIN "UpdateBackup", &req.base, name);
}

/* copy ID --to CLUSTER [--as NEWID]: CopyBackup into CLUSTER (an id of the instance, or
 * projects/P/instances/I/clusters/C). */
static int cmd_copy(bk_ctx *c) {
    char src[BK_RES_MAX], parent[BK_RES_MAX], name[BK_RES_MAX];
    if (c->a.n_pos != 1 || !c->a.to) {
        fprintf(stderr, "strata backup copy: want ID --to CLUSTER (see strata backup --help)\n");
        return 2;
    }
    Google__Protobuf__Timestamp expire;
    google__protobuf__timestamp__init(&expire);
    if (!bk_backup_name(c, c->a.pos[0], src, sizeof src) || !parse_expire(c, &expire))
        return 2;
    const char *id = c->a.as ? c->a.as : bk_leaf(src);
    bool full = !strncmp(c->a.to, "projects/", 9);
    if (!(full ? ops_fmt(parent, sizeof parent, "%s", c->a.to)
               : ops_fmt(parent, sizeof parent, "projects/%s/instances/%s/clusters/%s", c->project,
                         c->instance, c->a.to)) ||
        !ops_fmt(name, sizeof name, "%s/backups/%s", parent, id))
        return 2;
    Google__Bigtable__Admin__V2__CopyBackupRequest req;
    google__bigtable__admin__v2__copy_backup_request__init(&req);
    req.parent = parent;
    req.backup_id = (char *)id;
    req.source_backup = src;
    req.expire_time = &expire;
    ProtobufCMessage *op = NULL;
    Google__Longrunning__Operation *done = NULL;
    st_err err = {0};
    st_code rc = bk_router_call(c, BK_SVC_ADMIN "CopyBackup", &req.base,
                                &google__longrunning__operation__descriptor, &op, &err);
    if (rc == ST_OK)
        rc = op_finish(c, op, &done, &err);
    if (done)
        google__longrunning__operation__free_unpacked(done, NULL);
    if (rc == ST_OK && c->a.wait) /* the copy as it now stands: READY, with its size */
        rc = show_backup(c, name, &err);
    if (rc != ST_OK) {
        bk_not_found_hint(c, c->a.pos[0], src, &err);
        bk_fail(c, &err);
    }
    return rc == ST_OK ? 0 : 1;
}

/* Whether --to names one table: an id (the router checks its characters), or
 * projects/P/instances/I/tables/T, whose P and I then replace the project and instance. A
 * name of another shape is refused rather than cut at its last '/' (`--to a/b` restored into
 * table b, and another instance's full name into this instance's table). */
static bool restore_to(bk_ctx *c) {
    const char *to = c->a.to;
    char p[sizeof c->project], i[sizeof c->instance];
    int n = 0;
    if (strncmp(to, "projects/", 9) != 0 && to[0] && !strchr(to, '/'))
        return true;
    if (sscanf(to, "projects/%127[^/]/instances/%127[^/]/tables/%n", p, i, &n) == 2 && n > 0 &&
        to[n] && !strchr(to + n, '/')) {
        snprintf(c->project, sizeof c->project, "%s", p);
        snprintf(c->instance, sizeof c->instance, "%s", i);
        return true;
    }
    fprintf(stderr,
            "strata backup restore: --to '%s' is not a table: give a table id or "
            "projects/P/instances/I/tables/T\n",
            to);
    return false;
}

static int cmd_restore(bk_ctx *c) {
    char name[BK_RES_MAX], parent[BK_RES_MAX];
    if (c->a.n_pos != 1 || !c->a.to) {
        fprintf(stderr, "strata backup restore: want ID --to TABLE (see strata backup --help)\n");
        return 2;
    }
    /* --instance names where the table goes; a short ID is a backup of the instance of --dir */
    char target[128];
    snprintf(target, sizeof target, "%s", c->instance);
    snprintf(c->instance, sizeof c->instance, "%s", c->home_instance);
    bool named = bk_backup_name(c, c->a.pos[0], name, sizeof name);
    snprintf(c->instance, sizeof c->instance, "%s", target);
    if (named && !restore_to(c))
        return 2;
    c->asked = c->a.pos[0];
    if (named && c->a.target)
        return bk_restore_across(c, name);
    if (!named ||
        !ops_fmt(parent, sizeof parent, "projects/%s/instances/%s", c->project, c->instance))
        return 2;
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = parent;
    req.table_id = (char *)bk_leaf(c->a.to);
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = name;
    ProtobufCMessage *op = NULL;
    Google__Longrunning__Operation *done = NULL;
    st_err err = {0};
    st_code rc = bk_router_call(c, BK_SVC_ADMIN "RestoreTable", &req.base,
                                &google__longrunning__operation__descriptor, &op, &err);
    if (rc == ST_OK)
        rc = op_finish(c, op, &done, &err);
    if (done)
        google__longrunning__operation__free_unpacked(done, NULL);
    if (rc == ST_OK && c->a.wait && c->a.json)
        printf("{\"restored\":\"%s/tables/%s\",\"backup\":\"%s\"}\n", parent, req.table_id, name);
    else if (rc == ST_OK && c->a.wait)
        printf("restored %s into %s/tables/%s\n", name, parent, req.table_id);
    if (rc != ST_OK) {
        bk_not_found_hint(c, c->a.pos[0], name, &err);
        bk_fail(c, &err);
    }
    return rc == ST_OK ? 0 : 1;
}

int ops_backup_main(int argc, char **argv) {
    static bk_ctx ctx; /* one per process */
    bk_ctx *c = &ctx;
    memset(c, 0, sizeof *c);
    int prc = parse_args(argc, argv, &c->a, &c->sub);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!c->sub) {
        usage(stderr);
        return 2;
    }
    st_log_set_level(ST_LOG_WARN);
    if (!strcmp(c->sub, "verify"))
        return bk_verify(c); /* no server involved */
    static const char *subs[] = {"create", "list",   "describe", "delete", "restore",
                                 "export", "import", "update",   "copy"};
    bool known = false;
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        known |= !strcmp(c->sub, subs[i]);
    if (!known) {
        fprintf(stderr, "strata backup: unknown subcommand '%s' (see strata backup --help)\n",
                c->sub);
        return 2;
    }
    if (!resolve(c))
        return 1;
    return !strcmp(c->sub, "create")     ? cmd_create(c)
           : !strcmp(c->sub, "list")     ? cmd_list(c)
           : !strcmp(c->sub, "describe") ? cmd_one(c, false)
           : !strcmp(c->sub, "delete")   ? cmd_one(c, true)
           : !strcmp(c->sub, "restore")  ? cmd_restore(c)
           : !strcmp(c->sub, "update")   ? cmd_update(c)
           : !strcmp(c->sub, "copy")     ? cmd_copy(c)
           : !strcmp(c->sub, "export")   ? bk_export(c)
                                         : bk_import(c);
}
