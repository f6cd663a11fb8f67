/* ops/backup_across.c — `strata backup restore ID --to TABLE --target HOST:PORT|DIR`: a backup of
 * this instance restored as a table of another instance (docs/backups.md, "Restore into another
 * instance"). One router serves one instance, so the destination is another router; the backup
 * travels with the export/import machinery through the CLI:
 *
 *   1. the destination is checked first (reachable, TABLE free) so nothing is copied in vain;
 *   2. export of the backup into a private temporary directory (${TMPDIR:-/tmp});
 *   3. import into the destination's first cluster under a temporary backup id (xrestore-...);
 *   4. RestoreTable there, waited for with progress: the table is invisible until it commits,
 *      and a failed restore removes what it made, so there is never a half table;
 *   5. the temporary backup (its files stay linked into the restored tablets) and the temporary
 *      directory are deleted, whatever happened.
 *
 * A failure at any step leaves the destination as it was (the import deletes a partial backup,
 * a failed restore its tablets); the command can be run again. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp, nftw */
#endif
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backup_cli.h"
#include "certs.h"
#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "instance.h"
#include "strata/topology.h"

#define BK_IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"

/* Makes the calls that follow carry the credentials of the instance in dir (a secure one's
 * certificates and token; nothing for a plaintext one); NULL: no instance's, only --tls-ca and
 * --token (a router named by HOST:PORT must not be sent the other instance's token, nor be
 * checked against its CA). */
static void use_creds(const char *dir) {
    char abs[4096];
    if (dir)
        ops_inst_dir(dir, abs, sizeof abs);
    else
        ops_secure_use("");
}

#define BK_SECURE_HINT                                                                             \
    "; a secure destination (TLS, tokens) must be named by its directory, --target DIR: its "      \
    "nodes accept only its admin certificate, which only the directory holds"

/* The hint, for a destination named by HOST:PORT that refused or could not be reached (a secure
 * one's nodes refuse the plaintext or foreign caller so); other failures have their own cause. */
static const char *secure_hint(const bk_ctx *t, st_code code) {
    return !t->a.dir && (code == ST_UNAVAILABLE || code == ST_UNAUTHENTICATED) ? BK_SECURE_HINT
                                                                               : "";
}

/* The source's credentials: the instance of --dir (or the default one) unless only --endpoint. */
static const char *source_dir(const bk_ctx *c) {
    return !c->a.endpoint || c->a.dir ? (c->a.dir ? c->a.dir : "") : NULL;
}

/* The first cluster of the destination instance (ListClusters), into t->cluster. */
static st_code first_cluster(bk_ctx *t, st_err *err) {
    char parent[BK_RES_MAX];
    if (!ops_fmt(parent, sizeof parent, "projects/%s/instances/%s", t->project, t->instance))
        return st_err_set(err, ST_INVALID_ARGUMENT, "instance name too long");
    Google__Bigtable__Admin__V2__ListClustersRequest req;
    google__bigtable__admin__v2__list_clusters_request__init(&req);
    req.parent = parent;
    ProtobufCMessage *m = NULL;
    st_code rc =
        bk_router_call(t, BK_IA "ListClusters", &req.base,
                       &google__bigtable__admin__v2__list_clusters_response__descriptor, &m, err);
    Google__Bigtable__Admin__V2__ListClustersResponse *r = (void *)m;
    if (rc == ST_OK && (!r->n_clusters || !r->clusters[0]->name))
        rc = st_err_set(err, ST_NOT_FOUND, "instance %s at %s has no cluster", parent, t->addr);
    if (rc == ST_OK)
        snprintf(t->cluster, sizeof t->cluster, "%s", bk_leaf(r->clusters[0]->name));
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

/* The destination: an instance directory (its topology: router, project, instance, first
 * cluster) or a router's HOST:PORT (instance --instance, default the source's; cluster from
 * ListClusters). */
static bool target_resolve(const bk_ctx *c, bk_ctx *t) {
    static st_topology topo; /* large: not on the stack */
    const char *tg = c->a.target;
    struct stat sb;
    *t = *c;
    t->a.as = NULL;
    t->a.dir = NULL;
    t->a.endpoint = tg;
    if (stat(tg, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (!ops_inst_topology("strata backup restore", tg, &topo))
            return false;
        if (c->a.instance && strcmp(c->a.instance, topo.instance)) {
            fprintf(stderr,
                    "strata backup restore: --target %s serves instance %s, not --instance %s\n",
                    tg, topo.instance, c->a.instance);
            return false;
        }
        t->a.dir = tg;
        if (!ops_inst_router_pick("strata backup restore", &topo, tg, t->addr, sizeof t->addr))
            return false;
        snprintf(t->project, sizeof t->project, "%s", topo.project);
        snprintf(t->instance, sizeof t->instance, "%s", topo.instance);
        snprintf(t->cluster, sizeof t->cluster, "%s", topo.clusters[0].id);
        return true;
    }
    if (!strchr(tg, ':')) {
        fprintf(stderr,
                "strata backup restore: --target %s is neither an instance directory nor a "
                "router's HOST:PORT\n",
                tg);
        return false;
    }
    snprintf(t->addr, sizeof t->addr, "%s", tg);
    st_err err = {0};
    use_creds(NULL);
    if (first_cluster(t, &err) != ST_OK) {
        fprintf(stderr, "strata backup restore: the destination router %s: %s%s\n", tg, err.msg,
                secure_hint(t, err.code));
        return false;
    }
    return true;
}

/* The destination's table must not exist yet (checked before anything is copied). */
static st_code target_free(const bk_ctx *t, const char *table, st_err *err) {
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = (char *)table;
    req.view = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY;
    st_code rc = bk_router_call(t, BK_SVC_ADMIN "GetTable", &req.base, NULL, NULL, err);
    if (rc == ST_OK)
        return st_err_set(err, ST_ALREADY_EXISTS,
                          "table %s already exists in the destination: restore into a new table "
                          "id",
                          table);
    if (rc == ST_NOT_FOUND) {
        st_err_clear(err);
        return ST_OK;
    }
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* RestoreTable of backup into t's instance as table_id, waited for. */
static st_code restore_there(const bk_ctx *t, const char *backup, const char *table_id,
                             st_err *err) {
    char parent[BK_RES_MAX];
    if (!ops_fmt(parent, sizeof parent, "projects/%s/instances/%s", t->project, t->instance))
        return st_err_set(err, ST_INVALID_ARGUMENT, "instance name too long");
    Google__Bigtable__Admin__V2__RestoreTableRequest req;
    google__bigtable__admin__v2__restore_table_request__init(&req);
    req.parent = parent;
    req.table_id = (char *)table_id;
    req.source_case = GOOGLE__BIGTABLE__ADMIN__V2__RESTORE_TABLE_REQUEST__SOURCE_BACKUP;
    req.backup = (char *)backup;
    ProtobufCMessage *op = NULL;
    Google__Longrunning__Operation *done = NULL;
    st_code rc = bk_router_call(t, BK_SVC_ADMIN "RestoreTable", &req.base,
                                &google__longrunning__operation__descriptor, &op, err);
    if (rc == ST_OK)
        rc = bk_op_wait(t, (Google__Longrunning__Operation *)op, &done, err);
    if (done)
        google__longrunning__operation__free_unpacked(done, NULL);
    return rc;
}

/* Steps 2 to 4 (the temporary directory exists and is empty). */
static st_code across_run(bk_ctx *c, bk_ctx *t, const char *name, const char *xdir,
                          const char *temp_id, const char *table_id, st_err *err) {
    bk_ctx e = *c; /* the export, from the source */
    e.sub = "export";
    e.nested = true;
    e.a.pos[0] = name;
    e.a.pos[1] = xdir;
    e.a.n_pos = 2;
    if (bk_export(&e) != 0)
        return st_err_set(err, ST_UNAVAILABLE, "the export from the source failed (above)");
    use_creds(t->a.dir);
    bk_ctx i = *t; /* the import, into the destination */
    i.sub = "import";
    i.nested = true;
    i.a.pos[0] = xdir;
    i.a.n_pos = 1;
    i.a.as = temp_id;
    if (bk_import(&i) != 0)
        return st_err_set(err, ST_UNAVAILABLE,
                          "the import into the destination failed (above); nothing was left "
                          "there%s",
                          secure_hint(t, i.failed));
    char temp[BK_RES_MAX];
    if (!ops_fmt(temp, sizeof temp, "projects/%s/instances/%s/clusters/%s/backups/%s", t->project,
                 t->instance, t->cluster, temp_id))
        return st_err_set(err, ST_INVALID_ARGUMENT, "backup name too long");
    t->sub = "restore";
    st_code rc = restore_there(t, temp, table_id, err);
    Google__Bigtable__Admin__V2__DeleteBackupRequest d;
    google__bigtable__admin__v2__delete_backup_request__init(&d);
    d.name = temp;
    st_err derr = {0};
    if (bk_router_call(t, BK_SVC_ADMIN "DeleteBackup", &d.base, NULL, NULL, &derr) != ST_OK)
        fprintf(stderr,
                "strata backup restore: could not delete the temporary backup %s in the "
                "destination (%s): delete it with `strata backup delete`\n",
                temp, derr.msg);
    return rc;
}

/* A restore killed (kill -9, a crash) leaves its temporary copy of the backup behind. Each
 * restore names its directory with its pid, so the next one removes those of restores no longer
 * running (of this user), and one killed restore does not keep the space of a whole backup. */
static void sweep_leftovers(const char *base) {
    DIR *d = opendir(base);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[4096];
        struct stat st;
        long pid;
        char rest[16];
        if (sscanf(e->d_name, "strata-restore-%ld-%15s", &pid, rest) != 2 || pid <= 0 ||
            (kill((pid_t)pid, 0) == 0 || errno != ESRCH) ||
            !ops_fmt(path, sizeof path, "%s/%s", base, e->d_name) || lstat(path, &st) != 0 ||
            !S_ISDIR(st.st_mode) || st.st_uid != getuid())
            continue;
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        fprintf(stderr, "strata backup restore: removed %s, left by a restore that was stopped\n",
                path);
    }
    if (d)
        closedir(d);
}

int bk_restore_across(bk_ctx *c, const char *name) {
    static bk_ctx t; /* the destination */
    if (!target_resolve(c, &t))
        return 1;
    const char *table_id = bk_leaf(c->a.to);
    char table[BK_RES_MAX], tmp[4096], xdir[4200], temp_id[64];
    const char *base = getenv("TMPDIR");
    snprintf(temp_id, sizeof temp_id, "xrestore-%llx-%d", (unsigned long long)st_wall_us(),
             (int)getpid());
    if (!ops_fmt(table, sizeof table, "projects/%s/instances/%s/tables/%s", t.project, t.instance,
                 table_id) ||
        !ops_fmt(tmp, sizeof tmp, "%s/strata-restore-%d-XXXXXX", base && *base ? base : "/tmp",
                 (int)getpid()))
        return 2;
    sweep_leftovers(base && *base ? base : "/tmp");
    st_err err = {0};
    st_code rc = target_free(&t, table, &err);
    use_creds(source_dir(c));
    if (rc == ST_OK && !mkdtemp(tmp))
        rc = st_err_set(&err, ST_UNAVAILABLE,
                        "cannot make a temporary directory in %s (set TMPDIR to a directory with "
                        "room for the backup)",
                        base && *base ? base : "/tmp");
    if (rc == ST_OK) {
        snprintf(xdir, sizeof xdir, "%s/x", tmp);
        rc = across_run(c, &t, name, xdir, temp_id, table_id, &err);
        nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    if (rc != ST_OK) {
        fprintf(stderr, "strata backup restore: %s into %s at %s: %s\n", name, table, t.addr,
                err.msg);
        return 1;
    }
    if (c->a.json) {
        printf("{\"restored\":");
        bk_json_str(table);
        printf(",\"backup\":");
        bk_json_str(name);
        printf(",\"target\":");
        bk_json_str(t.addr);
        printf("}\n");
    } else {
        printf("restored %s into %s (router %s)\n", name, table, t.addr);
    }
    return 0;
}
