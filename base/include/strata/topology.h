/* strata/topology.h — an instance's shape, read from a small text file (docs/formats/topology.md):
 * its clusters (id, zone, nodes with address and data directory), its routers, and a few knobs.
 * `strata up` writes one for the local instance; strata-router and the CLI read it.
 *
 *   # comments and blank lines are ignored; keys and values are separated by '='
 *   project = p
 *   instance = i
 *   split_bytes = 268435456
 *   [cluster east]
 *   zone = zone-a
 *   node = 127.0.0.1:7101 /var/lib/strata/east-0
 *   node = 127.0.0.1:7102 /var/lib/strata/east-1
 *   [cluster west]
 *   zone = zone-b
 *   node = 127.0.0.1:7201 /var/lib/strata/west-0
 *   [router]
 *   listen = 127.0.0.1:8086
 *
 * Node numbers are assigned in file order from 1 across all clusters (0 = a standalone node);
 * cluster numbers from 1 in file order (the version tiebreaker). */
#ifndef STRATA_TOPOLOGY_H
#define STRATA_TOPOLOGY_H

#include "strata/base.h"

#define ST_TOPO_CLUSTERS_MAX 8 /* Bigtable: at most 8 regions */
#define ST_TOPO_NODES_MAX 64   /* per cluster */
#define ST_TOPO_ROUTERS_MAX 16
#define ST_TOPO_ID_MAX 63    /* cluster ids: [a-z][-a-z0-9]*, at most this many chars */
#define ST_TOPO_ADDR_MAX 127 /* host:port */
#define ST_TOPO_PATH_MAX 1023

typedef struct st_topo_node {
    char addr[ST_TOPO_ADDR_MAX + 1];     /* host:port of its gRPC listener */
    char data_dir[ST_TOPO_PATH_MAX + 1]; /* may be empty for nodes on other hosts */
    uint32_t num;                        /* 1-based, unique in the instance */
} st_topo_node;

typedef struct st_topo_cluster {
    char id[ST_TOPO_ID_MAX + 1];
    char zone[ST_TOPO_ID_MAX + 1];
    uint32_t num; /* 1-based */
    st_topo_node nodes[ST_TOPO_NODES_MAX];
    size_t n_nodes;
} st_topo_cluster;

typedef struct st_topology {
    char project[ST_TOPO_ID_MAX + 1];  /* default "p": the project cbt examples use */
    char instance[ST_TOPO_ID_MAX + 1]; /* default "i" */
    int64_t split_bytes;               /* tablet split threshold; default 256 MiB */
    st_topo_cluster clusters[ST_TOPO_CLUSTERS_MAX];
    size_t n_clusters;
    char routers[ST_TOPO_ROUTERS_MAX][ST_TOPO_ADDR_MAX + 1]; /* listen addresses */
    size_t n_routers;
} st_topology;

/* Parses path. INVALID_ARGUMENT with "path:line: what is wrong" for a bad file; NOT_FOUND when
 * absent. Validates ids, addresses, duplicates and limits. */
st_code st_topology_load(const char *path, st_topology *out, st_err *err);
/* Parses text (the same format) — the loader's core, also for tests. */
st_code st_topology_parse(const char *text, size_t len, const char *name, st_topology *out,
                          st_err *err);
/* Writes t in the format above, atomically. */
st_code st_topology_save(const char *path, const st_topology *t, st_err *err);
/* Finds a cluster by id (NULL when absent). */
const st_topo_cluster *st_topology_cluster(const st_topology *t, const char *id);
/* The Unix socket a node serves for routers on its host (strata-node --unix, as `strata up`
 * starts nodes; docs/router.md, "Unix sockets"): ST_TOPO_NODE_SOCK_NAME in its data directory.
 * data_dir/ST_TOPO_NODE_SOCK_NAME into out; false when data_dir is empty or the path does not fit
 * in out or in a socket address (the node is then reached over TCP only). */
#define ST_TOPO_NODE_SOCK_NAME "node.sock"
bool st_topo_node_sock_path(const char *data_dir, char *out, size_t cap);

#endif
