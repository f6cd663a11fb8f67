/* perm.c — roles, permissions and the permission every public method of strata-router needs
 * (strata/auth.h; the table in docs/security.md lists the same). Constant tables only. */
#include "strata/auth.h"

#include <string.h>

st_role st_auth_role_parse(const char *name) {
    static const struct {
        const char *name;
        st_role role;
    } names[] = {
        {"reader", ST_ROLE_READER},
        {"writer", ST_ROLE_WRITER},
        {"admin", ST_ROLE_ADMIN},
        {"roles/bigtable.reader", ST_ROLE_READER},
        {"roles/bigtable.user", ST_ROLE_WRITER},
        {"roles/bigtable.admin", ST_ROLE_ADMIN},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name))
            return names[i].role;
    return ST_ROLE_NONE;
}

const char *st_auth_role_name(st_role role) {
    return role == ST_ROLE_READER   ? "reader"
           : role == ST_ROLE_WRITER ? "writer"
           : role == ST_ROLE_ADMIN  ? "admin"
                                    : "none";
}

const char *st_auth_role_iam_name(st_role role) {
    return role == ST_ROLE_READER   ? "roles/bigtable.reader"
           : role == ST_ROLE_WRITER ? "roles/bigtable.user"
           : role == ST_ROLE_ADMIN  ? "roles/bigtable.admin"
                                    : "";
}

#define R ST_ROLE_READER
#define W ST_ROLE_WRITER
#define A ST_ROLE_ADMIN
#define T ST_AUTH_SCOPE_TABLE
#define I ST_AUTH_SCOPE_INSTANCE

/* Cloud Bigtable's permission names; the minimum role is what its predefined roles grant
 * (roles/bigtable.reader, .user, .admin), except strata.backups.transfer, Strata's own. The
 * scope is that of the methods needing it (auth_test checks they agree): TestIamPermissions on
 * a table answers an instance permission from the instance's role. */
static const st_auth_perm perms[] = {
    {"bigtable.tables.readRows", R, T},
    {"bigtable.tables.sampleRowKeys", R, T},
    {"bigtable.tables.readChangeStream", R, T},
    {"bigtable.tables.get", R, T},
    {"bigtable.tables.list", R, I},
    {"bigtable.tables.checkConsistency", R, T},
    {"bigtable.tables.generateConsistencyToken", R, T},
    {"bigtable.instances.get", R, I},
    {"bigtable.instances.list", R, I},
    {"bigtable.instances.ping", R, I},
    {"bigtable.clusters.get", R, I},
    {"bigtable.clusters.list", R, I},
    {"bigtable.appProfiles.get", R, I},
    {"bigtable.appProfiles.list", R, I},
    {"bigtable.backups.get", R, I},
    {"bigtable.backups.list", R, I},
    {"bigtable.tables.mutateRows", W, T},
    {"bigtable.tables.create", A, I},
    {"bigtable.tables.delete", A, T},
    {"bigtable.tables.update", A, T},
    {"bigtable.tables.restore", A, I},
    {"bigtable.tables.getIamPolicy", A, T},
    {"bigtable.tables.setIamPolicy", A, T},
    {"bigtable.instances.update", A, I},
    {"bigtable.instances.getIamPolicy", A, I},
    {"bigtable.instances.setIamPolicy", A, I},
    {"bigtable.appProfiles.create", A, I},
    {"bigtable.appProfiles.update", A, I},
    {"bigtable.appProfiles.delete", A, I},
    {"bigtable.backups.create", A, I},
    {"bigtable.backups.update", A, I},
    {"bigtable.backups.delete", A, I},
    {"strata.backups.transfer", A, I},
};

#undef R
#undef W
#undef A

#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define LRO "/google.longrunning.Operations/"

/* Every method strata-router serves, sorted by path (st_auth_method_find searches it; auth_test
 * checks the order). */
static const st_auth_method methods[] = {
    {IA "CreateAppProfile", "bigtable.appProfiles.create", I, false, true},
    {IA "DeleteAppProfile", "bigtable.appProfiles.delete", I, false, true},
    {IA "GetAppProfile", "bigtable.appProfiles.get", I, false, false},
    {IA "GetCluster", "bigtable.clusters.get", I, false, false},
    {IA "GetIamPolicy", "bigtable.instances.getIamPolicy", I, false, true},
    {IA "GetInstance", "bigtable.instances.get", I, false, false},
    {IA "ListAppProfiles", "bigtable.appProfiles.list", I, false, false},
    {IA "ListClusters", "bigtable.clusters.list", I, false, false},
    {IA "ListInstances", "bigtable.instances.list", I, false, false},
    {IA "SetIamPolicy", "bigtable.instances.setIamPolicy", I, false, true},
    {IA "TestIamPermissions", NULL, ST_AUTH_SCOPE_ANY, false, false},
    {IA "UpdateAppProfile", "bigtable.appProfiles.update", I, false, true},
    {TA "CheckConsistency", "bigtable.tables.checkConsistency", T, false, false},
    {TA "CopyBackup", "bigtable.backups.create", I, false, true},
    {TA "CreateBackup", "bigtable.backups.create", I, false, true},
    {TA "CreateTable", "bigtable.tables.create", I, false, true},
    {TA "DeleteBackup", "bigtable.backups.delete", I, false, true},
    {TA "DeleteTable", "bigtable.tables.delete", T, false, true},
    {TA "DropRowRange", "bigtable.tables.update", T, false, true},
    {TA "GenerateConsistencyToken", "bigtable.tables.generateConsistencyToken", T, false, false},
    {TA "GetBackup", "bigtable.backups.get", I, false, false},
    {TA "GetIamPolicy", "bigtable.tables.getIamPolicy", T, false, true},
    {TA "GetTable", "bigtable.tables.get", T, false, false},
    {TA "ListBackups", "bigtable.backups.list", I, false, false},
    {TA "ListTables", "bigtable.tables.list", I, false, false},
    {TA "ModifyColumnFamilies", "bigtable.tables.update", T, false, true},
    {TA "RestoreTable", "bigtable.tables.restore", I, false, true},
    {TA "SetIamPolicy", "bigtable.tables.setIamPolicy", T, false, true},
    {TA "TestIamPermissions", NULL, ST_AUTH_SCOPE_ANY, false, false},
    {TA "UpdateBackup", "bigtable.backups.update", I, false, true},
    {TA "UpdateTable", "bigtable.tables.update", T, true, true},
    {BT "CheckAndMutateRow", "bigtable.tables.mutateRows", T, false, false},
    {BT "GenerateInitialChangeStreamPartitions", "bigtable.tables.readChangeStream", T, false,
     false},
    {BT "MutateRow", "bigtable.tables.mutateRows", T, false, false},
    {BT "MutateRows", "bigtable.tables.mutateRows", T, false, false},
    {BT "PingAndWarm", "bigtable.instances.ping", I, false, false},
    {BT "ReadChangeStream", "bigtable.tables.readChangeStream", T, false, false},
    {BT "ReadModifyWriteRow", "bigtable.tables.mutateRows", T, false, false},
    {BT "ReadRows", "bigtable.tables.readRows", T, false, false},
    {BT "SampleRowKeys", "bigtable.tables.sampleRowKeys", T, false, false},
    {LRO "CancelOperation", "bigtable.instances.update", I, false, true},
    {LRO "DeleteOperation", "bigtable.instances.update", I, false, true},
    {LRO "GetOperation", "bigtable.instances.get", I, false, false},
    {LRO "ListOperations", "bigtable.instances.get", I, false, false},
    {LRO "WaitOperation", "bigtable.instances.get", I, false, false},
};

/* Whole services: a path ending in '/' covers every method of it. */
static const st_auth_method services[] = {
    /* The backup export and import service of `strata backup` (docs/backups.md). */
    {"/strata.internal.v1.BackupAdmin/", "strata.backups.transfer", I, false, true},
};

#undef T
#undef I

const st_auth_method *st_auth_method_find(const char *path) {
    if (!path)
        return NULL;
    size_t lo = 0, hi = sizeof methods / sizeof methods[0];
    while (lo < hi) { /* every call of the router comes here: a binary search, not a scan */
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(methods[mid].path, path);
        if (c == 0)
            return &methods[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = 0; i < sizeof services / sizeof services[0]; i++) {
        size_t n = strlen(services[i].path);
        if (!strncmp(path, services[i].path, n) && path[n] && !strchr(path + n, '/'))
            return &services[i];
    }
    return NULL;
}

const st_auth_perm *st_auth_perm_find(const char *name) {
    for (size_t i = 0; name && i < sizeof perms / sizeof perms[0]; i++)
        if (!strcmp(perms[i].name, name))
            return &perms[i];
    return NULL;
}

const st_auth_perm *st_auth_perms(size_t *n) {
    *n = sizeof perms / sizeof perms[0];
    return perms;
}

const st_auth_method *st_auth_methods(size_t *n) {
    *n = sizeof methods / sizeof methods[0];
    return methods;
}

const st_auth_method *st_auth_services(size_t *n) {
    *n = sizeof services / sizeof services[0];
    return services;
}
