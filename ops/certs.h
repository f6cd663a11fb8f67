/* ops/certs.h — a secure local instance's certificates and credentials (docs/security.md):
 *
 *   DIR/secure/             0700
 *   DIR/secure/ca.pem       the cluster CA (clients trust it: cbt -cert-file DIR/secure/ca.pem)
 *   DIR/secure/ca.key       its key, 0600: whoever holds it can mint any role
 *   DIR/secure/router.pem   OU=strata-router, valid for localhost and 127.0.0.1 (and key, 0600)
 *   DIR/secure/<node>.pem   OU=strata-node per node, valid for its host (and key, 0600)
 *   DIR/secure/admin.pem    OU=strata-admin: the strata CLI's own certificate (and key, 0600)
 *   DIR/secure/tokens       "ROLE TOKEN" lines of the router's principals (ops_auth_bootstrap)
 *   DIR/secure/principals   the router's --auth-file (token hashes)
 *
 * certs.c makes the certificates (OpenSSL's C API); secure.c gives the other commands the
 * credentials to talk to such an instance. */
#ifndef OPS_CERTS_H
#define OPS_CERTS_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/base.h"
#include "strata/rpc.h"

#define OPS_CERTS_PATH_MAX 1200
#define OPS_SECURE_SUBDIR "secure"
#define OPS_SECURE_TOKEN_MAX 256

/* Creates dir/ca.pem and dir/ca.key unless both exist (kept: everything chains to them).
 * INTERNAL with OpenSSL's or the system's reason on failure. */
st_code ops_certs_ca(const char *dir, st_err *err);
/* Creates dir/<name>.pem and .key for role (RPC_ROLE_*), signed by the CA in dir, valid for san
 * ("DNS:localhost,IP:127.0.0.1"; NULL or "" for none), unless both exist. */
st_code ops_certs_leaf(const char *dir, const char *name, const char *role, const char *san,
                       st_err *err);

/* ---- talking to a secure instance (secure.c) ----
 * The instance directory a command works on (ops_inst_dir records it): when DIR/secure/ca.pem
 * exists the instance is secure and the helpers below give the admin certificate and token;
 * otherwise they give plaintext (NULL options, no metadata). Loaded on first use. */
void ops_secure_use(const char *inst_dir);
bool ops_secure_on(void);
/* Client options for a node (server role strata-node) or a router (strata-router); addr is the
 * address dialled ("unix:" ones are plaintext: the socket's directory stands for TLS). NULL:
 * plaintext. */
const rpc_client_opts *ops_secure_node_opts(const char *addr);
const rpc_client_opts *ops_secure_router_opts(void);
/* "authorization: Bearer TOKEN" with the admin token of DIR/secure/tokens (*n 0: none). */
const rpc_metadata *ops_secure_md(size_t *n);
/* Credentials given on a command line, over the instance directory's: ca_path (NULL or "": the
 * instance's DIR/secure/ca.pem, if any) is the CA the servers' certificates must chain to (TLS
 * on, any router certificate it signed), token (NULL or "": the instance's admin token) goes
 * as "authorization: Bearer TOKEN" (also over plaintext, to a router that checks tokens
 * without TLS). Takes effect at the next call of the helpers above. */
void ops_secure_override(const char *ca_path, const char *token);
/* The first token of role in DIR/secure/tokens ("admin", "writer", "reader") into out. */
bool ops_secure_token(const char *inst_dir, const char *role, char *out, size_t cap);
/* --tls-ca FILE, --token TOKEN and --token-file FILE of a command that talks to a router
 * (cmd: "strata backup"), each NULL when not given: checked, then ops_secure_override. A token
 * file holds TOKEN, or a "ROLE TOKEN" line as DIR/secure/tokens does, on its first line. False
 * after printing why they cannot be used. */
bool ops_secure_flags(const char *cmd, const char *tls_ca, const char *token,
                      const char *token_file);

/* ---- why a node refuses this process (secure.c) ---- */
/* "" when the nodes can be reached (plaintext, or TLS presenting the admin certificate);
 * otherwise why they will refuse the handshake and what to do, a sentence without a final
 * period: a secure instance's nodes accept only its admin certificate (mutual TLS), which
 * --tls-ca and a token do not give, so the instance must be named by its directory, as flag
 * says ("--dir DIR"). Valid until the next call (a static buffer). */
const char *ops_secure_node_cert_missing(const char *flag);
/* What to do about a node that refused the TLS handshake: ops_secure_node_cert_missing, or,
 * when the admin certificate was presented, that it is another instance's. Never "" on a
 * secure instance; valid until the next call. */
const char *ops_secure_node_refused(const char *flag);

/* ---- why a call to a router failed (secure.c) ---- */
typedef enum ops_router_fail {
    OPS_ROUTER_FAIL_OTHER = 0, /* nothing below: retry, or read the message */
    OPS_ROUTER_FAIL_DOWN,      /* the connect failed: no router listens at the address */
    OPS_ROUTER_FAIL_TLS,       /* closed at the TLS handshake (or right at the start) */
    OPS_ROUTER_FAIL_TOKEN,     /* UNAUTHENTICATED or PERMISSION_DENIED */
} ops_router_fail;

/* Classifies a failed router call by its code and message (the rpc layer's "connection to A
 * failed: WHY"; a message that does not start so is the router's own answer, OTHER, whatever
 * node connection it quotes); tls: whether the call spoke TLS. A plaintext call the router
 * closed before answering counts as TLS: a router that serves TLS only does that, but so may a
 * router that is stopping, so callers that had answers before treat it as transient. */
ops_router_fail ops_router_fail_of(st_code code, const char *msg, bool tls);
/* What the failure ops_router_fail_of names means and what to pass or do, as a sentence
 * without a final period ("" for OPS_ROUTER_FAIL_OTHER); token: whether the call carried a
 * bearer token. Valid until the next call (a static buffer: it names the instance directory). */
const char *ops_router_hint(st_code code, const char *msg, bool tls, bool token);
/* The instance directory for a hint: the one --dir (or $STRATA_HOME) named, else "DIR". */
const char *ops_hint_dir(void);

#endif
