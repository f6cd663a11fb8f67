/* strata/node.h — the tablet server (strata-node): tablets over the storage engine, serving the
 * Cloud Bigtable data API and table admin API over gRPC. A node started alone is a one-node
 * instance; inside a cluster the router sends it the requests for the tablets it owns. */
#ifndef STRATA_NODE_H
#define STRATA_NODE_H

#include "strata/base.h"

struct event_base;
typedef struct node_ctx node_ctx;

typedef struct node_opts {
    const char *data_dir;    /* created when absent */
    const char *listen_host; /* "127.0.0.1" */
    uint16_t listen_port;    /* 0 = ephemeral; see node_port */
    bool sync;               /* durable acknowledgements (default true; false is logged loudly) */
    uint32_t cluster_num;    /* tiebreaker in versions; 0 for a standalone node */
    size_t block_cache_bytes;   /* 0 = storage default */
    size_t memtable_bytes;      /* 0 = storage default */
} node_opts;

void node_opts_default(node_opts *o);
/* Opens storage and the catalog, recovers, and starts listening on base. */
st_code node_open(struct event_base *base, const node_opts *opts, node_ctx **out, st_err *err);
uint16_t node_port(const node_ctx *n);
/* Stops listening, waits for storage to settle and frees. Loop thread only. */
void node_close(node_ctx *n);

#endif
