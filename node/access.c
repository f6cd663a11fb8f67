/* access.c — which kind of Strata process may call which of a node's methods, when the node
 * requires client certificates of its cluster CA (strata-node --tls-ca; docs/security.md,
 * "Internal links"). The client certificate's role (its subject OU, rpc_tls_peer_role) decides:
 *
 *   Bigtable data and table admin (the public APIs)   strata-router, strata-admin
 *   Node service (placement, moves, backups)           strata-router, strata-admin
 *     ListTablets                                      + strata-node (shippers route by it)
 *     CopyRows                                         + strata-node (a move's source sends
 *                                                         rows; only into a move's incoming
 *                                                         copy, node_h_copy_rows checks)
 *     PutTable, CreateTablet, DropTablet               + strata-node (a move's source makes
 *                                                         its copy on the target: PutTable
 *                                                         purging no family, CreateTablet of
 *                                                         an incoming copy or activating one,
 *                                                         DropTablet of an incoming copy;
 *                                                         internal.c checks)
 *     ReadBackupFile, ListBackupPieces                 + strata-node (a pull reads the source's
 *                                                         piece; only with the read ticket a
 *                                                         router obtained for that piece,
 *                                                         backup_grant.c)
 *   Replication Apply                                  strata-node
 *   Replication GetPositions                           strata-node, strata-admin
 *   Replication SetLinks                               strata-admin (strata chaos)
 *
 * strata-admin is the operator's own tools (the strata CLI); its key is as powerful as the
 * cluster CA's and lives next to it. A method not listed is served to routers and operators
 * only, so a method added later starts closed. */
#include <stdio.h>
#include <string.h>

#include "node_internal.h"

#define ROLE_ROUTER 1u
#define ROLE_NODE 2u
#define ROLE_ADMIN 4u

typedef struct access_rule {
    const char *prefix; /* a full path, or a prefix ending in '/' */
    unsigned roles;
} access_rule;

/* First match wins: specific paths before their service's prefix. A constant table. */
static const access_rule rules[] = {
    {"/strata.internal.v1.Replication/Apply", ROLE_NODE},
    {"/strata.internal.v1.Replication/GetPositions", ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Replication/", ROLE_ADMIN},
    {"/strata.internal.v1.Node/ListTablets", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/CopyRows", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/PutTable", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/CreateTablet", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/DropTablet", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/ReadBackupFile", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"/strata.internal.v1.Node/ListBackupPieces", ROLE_ROUTER | ROLE_NODE | ROLE_ADMIN},
    {"", ROLE_ROUTER | ROLE_ADMIN},
};

static unsigned role_bit(const char *role) {
    if (!strcmp(role, RPC_ROLE_ROUTER))
        return ROLE_ROUTER;
    if (!strcmp(role, RPC_ROLE_NODE))
        return ROLE_NODE;
    if (!strcmp(role, RPC_ROLE_ADMIN))
        return ROLE_ADMIN;
    return 0;
}

unsigned node_access_roles(const char *path) {
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        size_t n = strlen(rules[i].prefix);
        bool prefix = n == 0 || rules[i].prefix[n - 1] == '/';
        if (prefix ? strncmp(path, rules[i].prefix, n) == 0 : strcmp(path, rules[i].prefix) == 0)
            return rules[i].roles;
    }
    return 0; /* not reached: the last rule matches everything */
}

/* "strata-router or strata-admin" for the roles in mask. */
static void roles_text(unsigned mask, char *out, size_t cap) {
    static const char *const names[] = {RPC_ROLE_ROUTER, RPC_ROLE_NODE, RPC_ROLE_ADMIN};
    size_t used = 0;
    out[0] = '\0';
    for (unsigned i = 0; i < 3; i++)
        if (mask & (1u << i)) {
            int w = snprintf(out + used, cap - used, "%s%s", used ? " or " : "", names[i]);
            if (w < 0 || (size_t)w >= cap - used)
                return;
            used += (size_t)w;
        }
}

bool node_caller_is_node(rpc_call *call) {
    return !strcmp(rpc_call_peer_role(call), RPC_ROLE_NODE);
}

st_code node_access_guard(rpc_call *call, const char *path, void *arg, st_err *err) {
    (void)arg;
    const char *role = rpc_call_peer_role(call);
    unsigned allowed = node_access_roles(path);
    if (role_bit(role) & allowed)
        return ST_OK;
    char want[64];
    roles_text(allowed, want, sizeof want);
    if (!role[0])
        return st_err_set(err, ST_PERMISSION_DENIED,
                          "%s is served only to %s, and this client's certificate names no "
                          "role: internal certificates carry OU=strata-router, strata-node or "
                          "strata-admin (docs/security.md); data clients go through a router",
                          path, want);
    return st_err_set(err, ST_PERMISSION_DENIED,
                      "%s is served only to %s, not to a client whose certificate names %s "
                      "(docs/security.md, Internal links)",
                      path, want, role);
}
