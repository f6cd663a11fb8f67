/* strata/router.h — strata-router: the public endpoint of a Strata instance. It serves the Cloud
 * Bigtable data API, table admin API, instance admin (app profiles) and long-running operations
 * on one port, keeps only caches (instance metadata, each cluster's tablet map), and forwards
 * every request to the nodes that own the rows, splitting and merging requests that span tablets
 * and moving requests of multi-cluster app profiles between clusters.
 * See docs/router.md. */
#ifndef STRATA_ROUTER_H
#define STRATA_ROUTER_H

#include "strata/base.h"
#include "strata/topology.h"

struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

struct event_base;
typedef struct rtr_ctx rtr_ctx;

typedef struct rtr_opts {
    const st_topology *topo; /* copied by rtr_open */
    const char *listen_host; /* NULL = the topology's [router] listen, else 127.0.0.1 */
    uint16_t listen_port;    /* used with listen_host; 0 = ephemeral (see rtr_port) */
    int64_t meta_refresh_ms; /* metadata re-read period; 0 = RTR_META_REFRESH_MS_DEFAULT */
    int64_t node_timeout_ms; /* unary calls to nodes without a client deadline; 0 = default */
    /* Tablet balancer (docs/router.md): RTR_BALANCE_AUTO runs it when this router's listen
     * address is the first [router] listen of the topology (or the topology names none), so one
     * router of an instance balances; ON and OFF force it. */
    int balance;        /* RTR_BALANCE_AUTO (0), RTR_BALANCE_ON, RTR_BALANCE_OFF */
    int64_t balance_ms; /* its period; 0 = 2000 */
    /* Multi-cluster routing (docs/router.md, "Failover"): clusters whose topology zone is `zone`
     * come first ("nearest"), then topology order; NULL or "" = topology order only. */
    const char *zone;
    int64_t probe_ms; /* cluster health probe period; 0 = 500 */
    /* Links to nodes (docs/router.md, "Unix sockets"): a node whose topology data directory
     * holds a Unix socket ST_TOPO_NODE_SOCK_NAME is reached through it, else over TCP; true = TCP
     * always (strata-router --no-unix). */
    bool no_unix;
    /* TLS on the public listener (strata-router --tls-cert): a server context from
     * rpc_tls_server_ctx_new, borrowed, outliving the router; NULL = plaintext h2c. */
    struct ssl_ctx_st *ssl_ctx;
    /* --auth-file: principals and roles (strata/auth.h); NULL = open to every client. */
    const char *auth_file;
    /* --audit-log: JSON lines of admin calls, denied calls and auth failures; NULL = none. */
    const char *audit_log;
    uint64_t audit_log_bytes_max; /* rotate past this; 0 = 100 MiB */
    /* Mutual TLS to the nodes (strata-router --internal-ca; docs/security.md, Internal links):
     * a client context from rpc_tls_client_ctx_new with the cluster CA and the router's own
     * certificate (OU=strata-router), borrowed, outliving the router. Every TCP link to a node
     * then uses it and requires the node's certificate to name strata-node and its topology
     * host (a node's Unix socket stays plaintext: its directory is the user's alone). NULL =
     * plaintext links. */
    struct ssl_ctx_st *node_ssl_ctx;
    /* ReadChangeStream calls relayed at once (strata-router --max-change-streams); past it a new
     * one is RESOURCE_EXHAUSTED. 0 = RTR_CS_STREAMS_MAX_DEFAULT. */
    uint32_t change_streams_max;
} rtr_opts;

#define RTR_BALANCE_AUTO 0
#define RTR_BALANCE_ON 1
#define RTR_BALANCE_OFF 2

void rtr_opts_default(rtr_opts *o);
/* Connects to every node, learns the tablet maps, makes sure the metadata table exists, reads it,
 * and starts listening on base. It runs base's loop itself while it waits for the nodes (up to
 * RTR_START_TIMEOUT_MS, 15 s), so nodes served by the same loop work too. Nodes that are down are
 * retried later (their tablets answer UNAVAILABLE meanwhile). UNAVAILABLE when the listen address
 * cannot be bound or no cluster's metadata could be read. */
st_code rtr_open(struct event_base *base, const rtr_opts *opts, rtr_ctx **out, st_err *err);
uint16_t rtr_port(const rtr_ctx *r);
const char *rtr_host(const rtr_ctx *r); /* the host it listens on */
/* Stops listening, ends outstanding calls and frees. Loop thread only; turn the base once
 * afterwards (event_base_loop(base, EVLOOP_NONBLOCK)) before freeing it. */
void rtr_close(rtr_ctx *r);
/* Certificate reload: handshakes from now on use ctx (borrowed like rtr_opts.ssl_ctx), open
 * connections keep theirs. False when the router was opened without TLS. */
bool rtr_set_ssl_ctx(rtr_ctx *r, struct ssl_ctx_st *ctx);
/* Re-reads the auth file now (SIGHUP); a file that does not parse keeps the previous one. */
void rtr_auth_reload(rtr_ctx *r);

#endif
