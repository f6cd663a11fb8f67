/* server.c — the node's method table: Cloud Bigtable data API, table admin API and Strata's
 * internal node service (strata.internal.v1.Node) paths mapped to their handlers. Everything is
 * served on one port (the emulator does the same), so `cbt` and the client libraries reach data
 * and admin through BIGTABLE_EMULATOR_HOST alone, and a router reaches the internal service
 * there too. The same server may also listen on a Unix-domain socket (node_listen_unix) for a
 * router on the same host (docs/cluster.md). */
#include "admin.h"
#include "backup.h"
#include "changes.h"
#include "node_internal.h"
#include "repl_glue.h"

typedef struct method {
    const char *path;
    rpc_handler_fn fn;
} method;

#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define IN "/strata.internal.v1.Node/"

static const method methods[] = {
    {BT "ReadRows", node_h_read_rows},
    {BT "SampleRowKeys", node_h_sample_row_keys},
    {BT "MutateRow", node_h_mutate_row},
    {BT "MutateRows", node_h_mutate_rows},
    {BT "CheckAndMutateRow", node_h_check_and_mutate_row},
    {BT "ReadModifyWriteRow", node_h_read_modify_write_row},
    {BT "PingAndWarm", node_h_ping_and_warm},
    {BT "GenerateInitialChangeStreamPartitions", node_h_generate_partitions},
    {BT "ReadChangeStream", node_h_read_change_stream},
    {TA "CreateTable", node_h_create_table},
    {TA "GetTable", node_h_get_table},
    {TA "ListTables", node_h_list_tables},
    {TA "DeleteTable", node_h_delete_table},
    {TA "UpdateTable", node_h_update_table},
    {TA "ModifyColumnFamilies", node_h_modify_column_families},
    {TA "DropRowRange", node_h_drop_row_range},
    {TA "GenerateConsistencyToken", node_repl_h_generate_consistency_token},
    {TA "CheckConsistency", node_repl_h_check_consistency},
    {IN "GetStatus", node_h_get_status},
    {IN "PutTable", node_h_put_table},
    {IN "DropTable", node_h_drop_table},
    {IN "ListTablets", node_h_list_tablets},
    {IN "CreateTablet", node_h_create_tablet},
    {IN "DropTablet", node_h_drop_tablet},
    {IN "SplitTablet", node_h_split_tablet},
    {IN "MoveTablet", node_h_move_tablet},
    {IN "CopyRows", node_h_copy_rows},
    {IN "BackupTablet", node_h_backup_tablet},
    {IN "ListBackupPieces", node_h_list_backup_pieces},
    {IN "DeleteBackupPieces", node_h_delete_backup_pieces},
    {IN "ReadBackupFile", node_h_read_backup_file},
    {IN "WriteBackupFile", node_h_write_backup_file},
    {IN "SealBackupPiece", node_h_seal_backup_piece},
    {IN "PullBackupPiece", node_h_pull_backup_piece},
    {IN "GrantBackupRead", node_h_grant_backup_read},
};

st_code node_server_register(node_ctx *n, st_err *err) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st_code rc = rpc_server_add_method(n->rpc, methods[i].path, methods[i].fn, n);
        if (rc != ST_OK)
            return st_err_set(err, rc, "registering %s failed", methods[i].path);
    }
    return ST_OK;
}

st_code node_listen_unix(node_ctx *n, const char *path, st_err *err) {
    st_code rc = rpc_server_listen_unix(n->rpc, path, err);
    if (rc == ST_OK)
        st_log(ST_LOG_INFO, "node", "serving data=%s unix=%s", n->data_dir, path);
    return rc;
}
