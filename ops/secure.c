/* secure.c — the strata CLI's credentials for a secure instance (certs.h): the admin
 * certificate (OU=strata-admin, which nodes serve every internal method to), the cluster CA to
 * verify the servers, and the admin token for the router.
 *
 * The state is process-wide (a documented exception to "no global mutable state"): a CLI run
 * works on one instance directory, which ops_inst_dir records once, and every command's RPC
 * helpers read the same credentials. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "certs.h"

static struct {
    char dir[OPS_CERTS_PATH_MAX];
    bool loaded, on;
    bool inst; /* dir is a secure instance's (DIR/secure/ca.pem exists) */
    bool cert; /* ctx presents its admin certificate, which the nodes ask for */
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
static bool secure_paths(char *ca, char *cert, char *key, size_t cap) {
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
    return inst;
}

/* Loads the credentials once; a secure instance whose files cannot be read is said once on
 * stderr, and calls then fail their TLS handshake (with the server's reason). */
static void secure_load(void) {
    if (g_sec.loaded)
        return;
    g_sec.loaded = true;
    char ca[OPS_CERTS_PATH_MAX + 32], cert[OPS_CERTS_PATH_MAX + 32], key[OPS_CERTS_PATH_MAX + 32];
    g_sec.inst = secure_paths(ca, cert, key, sizeof ca);
    g_sec.on = ca[0] != '\0';
    g_sec.cert = false;
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
    g_sec.cert = g_sec.ctx && cert[0];
    /* Without the admin certificate the nodes refuse the handshake, but the router asks for
     * none: its calls still verify it against the CA (`strata status` then says what is
     * missing instead of calling a running router "no gRPC"). */
    if (!g_sec.ctx && cert[0] && !g_sec.ca_flag[0] &&
        (g_sec.ctx = rpc_tls_client_ctx_new(ca, NULL, NULL, NULL)) != NULL)
        fprintf(stderr,
                "strata: %s is a secure instance but its admin certificate cannot be used: %s "
                "(the nodes will refuse this command; `strata down`, then `strata up --secure` "
                "there makes missing certificates again)\n",
                g_sec.dir, err.msg);
    else if (!g_sec.ctx && g_sec.ca_flag[0])
        fprintf(stderr,
                "strata: the CA file %s cannot be used: %s (give the PEM file of the CA "
                "that signed the router's certificate)\n",
                g_sec.ca_flag, err.msg);
    else if (!g_sec.ctx)
        fprintf(stderr,
                "strata: %s is a secure instance but its admin credentials cannot be used: %s "
                "(`strata down`, then `strata up --secure` there makes missing certificates "
                "again)\n",
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

/* ---- what the nodes will refuse ---- */

const char *ops_secure_node_cert_missing(const char *flag) {
    static char out[2 * OPS_CERTS_PATH_MAX + 512];
    if (!ops_secure_on() || g_sec.cert)
        return "";
    if (g_sec.inst)
        snprintf(out, sizeof out,
                 "%s is a secure instance but its admin certificate %s/%s/admin.pem cannot be "
                 "used (see above), and its nodes accept no other: `strata down`, then `strata "
                 "up --secure` there makes missing certificates again",
                 g_sec.dir, g_sec.dir, OPS_SECURE_SUBDIR);
    else
        snprintf(out, sizeof out,
                 "a secure instance's nodes accept only its admin certificate (mutual TLS), "
                 "which --tls-ca and --token do not give: name the instance by its directory, "
                 "%s (the one `strata up --secure` made: its %s/admin.pem is that certificate)",
                 flag, OPS_SECURE_SUBDIR);
    return out;
}

const char *ops_secure_node_refused(const char *flag) {
    static char out[2 * OPS_CERTS_PATH_MAX + 512];
    const char *missing = ops_secure_node_cert_missing(flag);
    if (missing[0] || !g_sec.on)
        return missing;
    snprintf(out, sizeof out,
             "it accepts only the admin certificate of its own instance, and this command "
             "presented %s/%s/admin.pem: name the directory of the instance the node belongs "
             "to (`strata status --dir %s` checks that one's certificates)",
             g_sec.dir, OPS_SECURE_SUBDIR, g_sec.dir);
    return out;
}

/* ---- credentials on the command line ---- */

/* The token of --token-file: its first line without surrounding blanks; a "ROLE TOKEN" line (as
 * in DIR/secure/tokens) gives its last word. False after printing why. */
static bool token_file_read(const char *cmd, const char *path, char *out, size_t cap) {
    char line[OPS_SECURE_TOKEN_MAX + 64] = "";
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "%s: cannot read --token-file %s: %s (give a file holding the router's bearer "
                "token)\n",
                cmd, path, strerror(errno));
        return false;
    }
    bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    size_t n = got ? strcspn(line, "\r\n") : 0;
    while (n && (line[n - 1] == ' ' || line[n - 1] == '\t'))
        n--;
    line[n] = '\0';
    const char *tok = strrchr(line, ' ');
    tok = tok ? tok + 1 : line + strspn(line, " \t");
    if (!tok[0] || strlen(tok) >= cap) {
        fprintf(stderr,
                "%s: --token-file %s holds no token on its first line (want TOKEN, or ROLE "
                "TOKEN as in DIR/secure/tokens)\n",
                cmd, path);
        return false;
    }
    snprintf(out, cap, "%s", tok);
    return true;
}

bool ops_secure_flags(const char *cmd, const char *tls_ca, const char *token,
                      const char *token_file) {
    char from_file[OPS_SECURE_TOKEN_MAX];
    if (token && token_file) {
        fprintf(stderr, "%s: give --token or --token-file, not both\n", cmd);
        return false;
    }
    if (tls_ca && access(tls_ca, R_OK) != 0) {
        fprintf(stderr,
                "%s: cannot read --tls-ca %s: %s (give the PEM file of the CA that signed the "
                "router's certificate, e.g. DIR/secure/ca.pem)\n",
                cmd, tls_ca, strerror(errno));
        return false;
    }
    if (token_file && !token_file_read(cmd, token_file, from_file, sizeof from_file))
        return false;
    if (tls_ca || token || token_file) /* it copies them: from_file may leave the stack */
        ops_secure_override(tls_ca, token_file ? from_file : token);
    return true;
}

/* ---- why a call to a router failed ---- */

/* Where msg reports this process's own connection to the router failing: the rpc layer's
 * "connection to ADDR failed: WHY", alone or after the CLI's "CALL at ADDR: UNAVAILABLE: ". NULL
 * for the router's own answers, which quote a node's connection inside their words ("could not
 * store app profile 'app': connection to unix:... failed: connect failed"): such a router is
 * up, just unable to reach a node (nodes on this host are reached over Unix sockets, which no
 * CLI uses for a router). */
static const char *own_connection(const char *msg) {
    static const char head[] = "connection to ", coded[] = "UNAVAILABLE: connection to ";
    if (!msg)
        return NULL;
    const char *p = strncmp(msg, head, sizeof head - 1) == 0 ? msg : strstr(msg, coded);
    if (p && p != msg)
        p += sizeof coded - sizeof head; /* past "UNAVAILABLE: " */
    if (p && strncmp(p + sizeof head - 1, "unix:", 5) == 0)
        return NULL;
    return p;
}

ops_router_fail ops_router_fail_of(st_code code, const char *msg, bool tls) {
    if (code == ST_UNAUTHENTICATED || code == ST_PERMISSION_DENIED)
        return OPS_ROUTER_FAIL_TOKEN;
    if (code != ST_UNAVAILABLE || !(msg = own_connection(msg)))
        return OPS_ROUTER_FAIL_OTHER;
    if (strstr(msg, "connect failed"))
        return OPS_ROUTER_FAIL_DOWN;
    /* TLS: the handshake's own reason (an unknown CA, an expired certificate) or the wrong
     * role; plaintext: a TLS-only router closes the connection at the HTTP/2 preface. */
    if (tls ? strstr(msg, "TLS handshake failed") || strstr(msg, "server's certificate names")
            : strstr(msg, "connection closed by the server") != NULL)
        return OPS_ROUTER_FAIL_TLS;
    return OPS_ROUTER_FAIL_OTHER;
}

static const char *hint_dir(void) {
    return g_sec.dir[0] ? g_sec.dir : "DIR";
}

const char *ops_hint_dir(void) {
    secure_load();
    return hint_dir();
}

static const char *hint_tls(bool tls, const char *msg, char *out, size_t cap) {
    /* A plaintext router reads the ClientHello as a bad HTTP/2 preface and closes, or answers
     * in plaintext, which OpenSSL calls a wrong version number. */
    if (tls && (strstr(msg, "wrong version number") || strstr(msg, "closed by the server")))
        snprintf(out, cap,
                 "the router did not answer TLS: it may serve plaintext (`strata up` without "
                 "--secure): drop --tls-ca (and the token, which would travel in clear), or point "
                 "--endpoint at the secure instance's router");
    else if (tls)
        snprintf(out, cap,
                 "the TLS handshake with the router failed: give --tls-ca FILE, the CA that "
                 "signed the router's certificate (DIR/secure/ca.pem of a `strata up --secure` "
                 "instance), or --dir DIR of its instance");
    else if (g_sec.on)
        snprintf(out, cap,
                 "%s is a secure instance but its CA could not be loaded (see above): give "
                 "--tls-ca FILE",
                 hint_dir());
    else
        snprintf(out, cap,
                 "the router closed the connection before answering: a router that serves TLS "
                 "only, as `strata up --secure` starts it, needs --dir DIR of its instance, or "
                 "--tls-ca CA.pem and --token-file FILE");
    return out;
}

const char *ops_router_hint(st_code code, const char *msg, bool tls, bool token) {
    static char out[OPS_CERTS_PATH_MAX + 256];
    secure_load();
    switch (ops_router_fail_of(code, msg, tls)) {
    case OPS_ROUTER_FAIL_TOKEN:
        if (code == ST_PERMISSION_DENIED)
            return "the token's principal lacks the role this call needs: use a token with the "
                   "admin role (the \"admin\" line of DIR/secure/tokens), or grant the role "
                   "(`strata auth grant`)";
        return token ? "the router refused the token: it may have been rotated or removed; give "
                       "a current one with --token-file FILE or --token TOKEN"
                     : "no bearer token was sent: give --token-file FILE or --token TOKEN, or "
                       "--dir DIR of the secure instance, whose DIR/secure/tokens has an admin "
                       "token";
    case OPS_ROUTER_FAIL_TLS:
        return hint_tls(tls, msg, out, sizeof out);
    case OPS_ROUTER_FAIL_DOWN:
        snprintf(out, sizeof out,
                 "no router is listening there: it is not running, or --endpoint names the "
                 "wrong address; start it with `strata up --dir %s`, then run the command again",
                 hint_dir());
        return out;
    case OPS_ROUTER_FAIL_OTHER:
        /* TLS sent to a plaintext router that closed at the bad preface (or a TLS router
         * restarting at that moment: the hint says "may") */
        if (tls && code == ST_UNAVAILABLE && own_connection(msg) &&
            strstr(msg, "connection closed by the server"))
            return hint_tls(tls, msg, out, sizeof out);
        break;
    }
    return "";
}
