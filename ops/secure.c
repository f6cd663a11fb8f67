/* secure.c — the strata CLI's credentials for a secure instance (certs.h): the admin
 * certificate (OU=strata-admin, which nodes serve every internal method to), the cluster CA to
 * verify the servers, and the admin token for the router.
 *
 * The state is process-wide (a documented exception to "no global mutable state"): a CLI run
 * works on one instance directory, which ops_inst_dir records once, and every command's RPC
 * helpers read the same credentials. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "certs.h"

static struct {
    char dir[OPS_CERTS_PATH_MAX];
    bool loaded, on;
    SSL_CTX *ctx;
    rpc_client_opts node, router;
    char token[OPS_SECURE_TOKEN_MAX];
    char bearer[OPS_SECURE_TOKEN_MAX + 16];
    rpc_metadata md;
} g_sec;

void ops_secure_use(const char *inst_dir) {
    snprintf(g_sec.dir, sizeof g_sec.dir, "%s", inst_dir);
    g_sec.loaded = false;
}

bool ops_secure_token(const char *inst_dir, const char *role, char *out, size_t cap) {
    char path[OPS_CERTS_PATH_MAX + 32], line[OPS_SECURE_TOKEN_MAX + 64];
    snprintf(path, sizeof path, "%s/%s/tokens", inst_dir, OPS_SECURE_SUBDIR);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool found = false;
    size_t rl = strlen(role);
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strncmp(line, role, rl) == 0 && line[rl] == ' ' && line[rl + 1]) {
            found = strlen(line + rl + 1) < cap;
            if (found)
                snprintf(out, cap, "%s", line + rl + 1);
        }
    }
    fclose(f);
    return found;
}

/* Loads the credentials once; a secure instance whose files cannot be read is said once on
 * stderr, and calls then fail their TLS handshake (with the server's reason). */
static void secure_load(void) {
    if (g_sec.loaded)
        return;
    g_sec.loaded = true;
    char ca[OPS_CERTS_PATH_MAX + 32], cert[OPS_CERTS_PATH_MAX + 32], key[OPS_CERTS_PATH_MAX + 32];
    snprintf(ca, sizeof ca, "%s/%s/ca.pem", g_sec.dir, OPS_SECURE_SUBDIR);
    g_sec.on = g_sec.dir[0] && access(ca, F_OK) == 0;
    if (!g_sec.on)
        return;
    snprintf(cert, sizeof cert, "%s/%s/admin.pem", g_sec.dir, OPS_SECURE_SUBDIR);
    snprintf(key, sizeof key, "%s/%s/admin.key", g_sec.dir, OPS_SECURE_SUBDIR);
    st_err err = {0};
    SSL_CTX_free(g_sec.ctx);
    g_sec.ctx = rpc_tls_client_ctx_new(ca, cert, key, &err);
    if (!g_sec.ctx)
        fprintf(stderr,
                "strata: %s is a secure instance but its admin credentials cannot be used: %s "
                "(run `strata up --secure` there again to recreate missing certificates)\n",
                g_sec.dir, err.msg);
    g_sec.node = (rpc_client_opts){.ssl_ctx = g_sec.ctx, .peer_role = RPC_ROLE_NODE};
    g_sec.router = (rpc_client_opts){.ssl_ctx = g_sec.ctx, .peer_role = RPC_ROLE_ROUTER};
    g_sec.md = (rpc_metadata){0};
    if (ops_secure_token(g_sec.dir, "admin", g_sec.token, sizeof g_sec.token)) {
        snprintf(g_sec.bearer, sizeof g_sec.bearer, "Bearer %s", g_sec.token);
        g_sec.md = (rpc_metadata){"authorization", g_sec.bearer};
    }
}

bool ops_secure_on(void) {
    secure_load();
    return g_sec.on;
}

const rpc_client_opts *ops_secure_node_opts(const char *addr) {
    if (!ops_secure_on())
        return NULL;
    /* a node's Unix socket is plaintext: its directory's permissions stand for TLS */
    bool is_unix = addr && strncmp(addr, RPC_UNIX_PREFIX, strlen(RPC_UNIX_PREFIX)) == 0;
    return is_unix ? NULL : &g_sec.node;
}

const rpc_client_opts *ops_secure_router_opts(void) {
    return ops_secure_on() ? &g_sec.router : NULL;
}

const rpc_metadata *ops_secure_md(size_t *n) {
    *n = ops_secure_on() && g_sec.md.name ? 1 : 0;
    return *n ? &g_sec.md : NULL;
}
