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
    char ca_flag[OPS_CERTS_PATH_MAX]; /* ops_secure_override: "" = the instance's */
    char token_flag[OPS_SECURE_TOKEN_MAX];
} g_sec;

void ops_secure_override(const char *ca_path, const char *token) {
    snprintf(g_sec.ca_flag, sizeof g_sec.ca_flag, "%s", ca_path ? ca_path : "");
    snprintf(g_sec.token_flag, sizeof g_sec.token_flag, "%s", token ? token : "");
    g_sec.loaded = false;
}

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

/* The CA the servers' certificates must chain to, and the admin certificate (none without a
 * secure instance directory: routers need none, nodes then refuse the handshake). */
static void secure_paths(char *ca, char *cert, char *key, size_t cap) {
    snprintf(ca, cap, "%s/%s/ca.pem", g_sec.dir, OPS_SECURE_SUBDIR);
    snprintf(cert, cap, "%s/%s/admin.pem", g_sec.dir, OPS_SECURE_SUBDIR);
    snprintf(key, cap, "%s/%s/admin.key", g_sec.dir, OPS_SECURE_SUBDIR);
    bool inst = g_sec.dir[0] && access(ca, F_OK) == 0;
    if (g_sec.ca_flag[0])
        snprintf(ca, cap, "%s", g_sec.ca_flag);
    else if (!inst)
        ca[0] = '\0';
    if (!inst)
        cert[0] = key[0] = '\0';
}

/* Loads the credentials once; a secure instance whose files cannot be read is said once on
 * stderr, and calls then fail their TLS handshake (with the server's reason). */
static void secure_load(void) {
    if (g_sec.loaded)
        return;
    g_sec.loaded = true;
    char ca[OPS_CERTS_PATH_MAX + 32], cert[OPS_CERTS_PATH_MAX + 32], key[OPS_CERTS_PATH_MAX + 32];
    secure_paths(ca, cert, key, sizeof ca);
    g_sec.on = ca[0] != '\0';
    g_sec.md = (rpc_metadata){0};
    if (g_sec.token_flag[0])
        snprintf(g_sec.token, sizeof g_sec.token, "%s", g_sec.token_flag);
    else if (!g_sec.on || !ops_secure_token(g_sec.dir, "admin", g_sec.token, sizeof g_sec.token))
        g_sec.token[0] = '\0';
    if (g_sec.token[0]) { /* a token without TLS: a router checking tokens over plaintext */
        snprintf(g_sec.bearer, sizeof g_sec.bearer, "Bearer %s", g_sec.token);
        g_sec.md = (rpc_metadata){"authorization", g_sec.bearer};
    }
    if (!g_sec.on)
        return;
    st_err err = {0};
    SSL_CTX_free(g_sec.ctx);
    g_sec.ctx = rpc_tls_client_ctx_new(ca, cert[0] ? cert : NULL, key[0] ? key : NULL, &err);
    if (!g_sec.ctx && g_sec.ca_flag[0])
        fprintf(stderr,
                "strata: the CA file %s cannot be used: %s (give the PEM file of the CA "
                "that signed the router's certificate)\n",
                g_sec.ca_flag, err.msg);
    else if (!g_sec.ctx)
        fprintf(stderr,
                "strata: %s is a secure instance but its admin credentials cannot be used: %s "
                "(run `strata up --secure` there again to recreate missing certificates)\n",
                g_sec.dir, err.msg);
    g_sec.node = (rpc_client_opts){.ssl_ctx = g_sec.ctx, .peer_role = RPC_ROLE_NODE};
    /* a CA given by hand may have signed a router certificate without Strata's role in it */
    g_sec.router = (rpc_client_opts){.ssl_ctx = g_sec.ctx,
                                     .peer_role = g_sec.ca_flag[0] ? NULL : RPC_ROLE_ROUTER};
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
    secure_load();
    *n = g_sec.md.name ? 1 : 0;
    return *n ? &g_sec.md : NULL;
}
