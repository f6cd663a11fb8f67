/* strata/node.h — the tablet server (strata-node): tablets over the storage engine, serving the
 * Cloud Bigtable data API and table admin API over gRPC. A node started alone is a one-node
 * instance; inside a cluster the router sends it the requests for the tablets it owns. */
#ifndef STRATA_NODE_H
#define STRATA_NODE_H

#include "strata/base.h"

struct event_base;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */
typedef struct node_ctx node_ctx;

/* The block cache of a node unless --cache-mb says otherwise (see node_opts_default). */
#define NODE_BLOCK_CACHE_BYTES_DEFAULT ((size_t)256 << 20)

typedef struct node_opts {
    const char *data_dir;    /* created when absent */
    const char *listen_host; /* "127.0.0.1" */
    uint16_t listen_port;    /* 0 = ephemeral; see node_port */
    bool sync;               /* durable acknowledgements (default true; false is logged loudly) */
    uint32_t cluster_num;    /* tiebreaker in versions; 0 for a standalone node */
    /* The node's number inside its instance (< 2^24): the high bits of the tablet ids it
     * allocates, so ids are unique across the instance. 0 = standalone: a table gets its first
     * tablet from CreateTable (or at start). Non-zero = cluster member: tablets come only from
     * the internal service (CreateTablet, splits, moves); rows no local tablet covers are
     * answered with the strata-not-owner error (docs/cluster.md). */
    uint32_t node_num;
    /* Size-based splits: a tablet written to and larger than this is split near its middle
     * (0 = never). Checked every split_check_ms (0 = 1000). */
    uint64_t split_bytes;
    uint32_t split_check_ms;
    /* Topology file (docs/formats/topology.md): with peer clusters in it, the node ships its
     * commit log to them and applies theirs (replication, docs/formats/replication.md); needs
     * cluster_num. NULL = no replication. */
    const char *config_path;
    size_t block_cache_bytes; /* NODE_BLOCK_CACHE_BYTES_DEFAULT; 0 = storage's 64 MiB */
    size_t memtable_bytes;    /* 0 = storage default */
    /* Start even when the commit log's last segment was cut short, dropping the acknowledged
     * writes that were in the lost part (logged: event=log_data_loss_accepted). false: the node
     * refuses to start, naming the file (docs/formats/log.md). */
    bool accept_data_loss;
    /* source_cluster_id of the change stream records this node writes when it has no topology
     * (--cluster-id; [a-z][-a-z0-9]*, at most 63 characters); NULL = "strata". With --config the
     * topology names every cluster. */
    const char *cluster_id;
    /* Mutual TLS (strata-node --tls-cert/--tls-key/--tls-ca; docs/security.md). ssl_ctx serves
     * the TCP listener and should require client certificates of the cluster CA
     * (rpc_tls_server_ctx_new with a client CA): the node then serves each method only to the
     * roles node/access.c allows. The Unix socket stays plaintext for the node's own user, who
     * counts as a router there (rpc_server_opts.unix_peer_role). client_ssl_ctx is what the node
     * presents to its peers (replication, moves, backups) and how it verifies them. Borrowed,
     * outliving the node; NULL = plaintext, every method open to every caller. */
    struct ssl_ctx_st *ssl_ctx, *client_ssl_ctx;
} node_opts;

#define NODE_NUM_MAX ((1u << 24) - 1)

void node_opts_default(node_opts *o);
/* Opens storage and the catalog, recovers, and starts listening on base. */
st_code node_open(struct event_base *base, const node_opts *opts, node_ctx **out, st_err *err);
uint16_t node_port(const node_ctx *n);
/* Also serves on the Unix-domain socket at path (strata-node --unix), for a strata-router on the
 * same host (docs/cluster.md): replaces a stale socket file, removes it when the node closes.
 * INVALID_ARGUMENT for a path over RPC_UNIX_PATH_MAX (107) bytes, UNAVAILABLE when another
 * process serves there or it cannot be bound. Loop thread, after node_open. */
st_code node_listen_unix(node_ctx *n, const char *path, st_err *err);
/* Certificate reload (SIGHUP): handshakes from now on use ctx (borrowed like opts.ssl_ctx), open
 * connections keep theirs. False when the node serves plaintext. Loop thread. */
bool node_set_ssl_ctx(node_ctx *n, struct ssl_ctx_st *ctx);
/* The node's storage engine (tests and tools: storage's calls are thread-safe). */
struct sto_db *node_db(node_ctx *n);
/* How long node_shutdown gives the calls in flight and their answers. */
#define NODE_SHUTDOWN_GRACE_MS 1000
/* A stop the operator asked for (SIGTERM, SIGINT), before node_close: stops listening, tells
 * every client (GOAWAY) and ends the calls still open after half the grace with UNAVAILABLE "the
 * node is shutting down", so routers retry them instead of taking the closed connections for a
 * crash under the request (docs/router.md, queries of death). Runs the loop for at most
 * NODE_SHUTDOWN_GRACE_MS. Loop thread only, the loop not running. */
void node_shutdown(node_ctx *n);
/* Stops listening, waits for storage to settle and frees. Loop thread only. */
void node_close(node_ctx *n);

#endif
