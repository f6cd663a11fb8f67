/* ops/status.c — `strata status`: one readable table of a local instance: for each cluster and
 * node its address, process, health (GetStatus over the internal node API), tablet count
 * (ListTablets) and data size on disk; then the routers (PingAndWarm) and whether the nodes
 * serve the Unix sockets routers use. Exit status 0 only when everything answers, so scripts and
 * tests can wait on it. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "instance.h"
#include "certs.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "strata/btutil.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/rpc.h"

#define STATUS_RPC_TIMEOUT_MS 2000 /* a healthy node answers in milliseconds */
/* Processes probed at once: every probe of a process that does not answer waits out its
 * deadline, so one after another several hung processes held the answer for tens of seconds. */
#define STATUS_PROBE_THREADS_MAX 32

/* One node's replication link to one peer cluster, as its GetPositions said. */
typedef enum link_state {
    LINK_UNKNOWN = 0, /* the node did not answer */
    LINK_OPEN,
    LINK_CUT,  /* cut by `strata chaos partition` (SetLinks) */
    LINK_DOWN, /* the shipper backs off: the peer refuses or does not answer */
    LINK_NONE, /* the node has no shipper for that cluster: it does not replicate */
} link_state;

/* What one node said. */
typedef struct node_row {
    char pid[24];
    char health[48];  /* "not answering (process PID runs)" at most */
    char tablets[48]; /* "N (M ro)" */
    char data[24];
    size_t damaged; /* tablets read-only after corruption (ListTablets: read_only, not moving) */
    bool ok;
    pid_t live;                           /* the process's pid when it is alive, else 0 */
    bool hung;                            /* alive, but does not answer (ops_inst_not_answering) */
    bool unix_ok;                         /* answers GetStatus through DATA/node.sock too */
    st_code rc;                           /* GetStatus's end */
    Strata__Internal__V1__Positions *pos; /* GetPositions (NULL: no answer); freed at the end */
    Strata__Internal__V1__ListTabletsResponse *tl; /* ListTablets (NULL: no answer); freed too */
    bool repl_unimplemented;                       /* the node serves no Replication service */
    link_state link[ST_TOPO_CLUSTERS_MAX];         /* by cluster index of the topology */
} node_row;

/* What one router said. */
typedef struct router_row {
    char pid[24];
    char health[48];
    pid_t live;
    bool ok;
    st_code rc; /* PingAndWarm's end */
} router_row;

/* A secure instance (DIR/secure exists: `strata up --secure`) missing what this command needs
 * to reach its processes: the CA to verify them, the admin certificate the nodes ask for, the
 * admin token the router asks for (when it checks tokens: DIR/secure/principals). */
typedef struct creds_gap {
    bool ca, admin_cert, token;
    const char *admin_missing; /* with admin_cert: "admin.pem", "admin.key" or both */
    bool token_refused;        /* the router answered UNAUTHENTICATED to the admin token held */
    size_t unchecked;          /* live processes status could not authenticate to */
} creds_gap;

typedef struct status_ctx {
    const char *dir_flag;
    char dir[OPS_PATH_MAX];
    char hung[OPS_PROCS_MAX][OPS_NAME_MAX]; /* processes that run but do not answer */
    size_t n_hung;
    st_topology topo;
    ops_partition part; /* DIR/run/partition: replication links cut by `strata chaos` */
    node_row rows[ST_TOPO_CLUSTERS_MAX][ST_TOPO_NODES_MAX];
    router_row routers[ST_TOPO_ROUTERS_MAX];
    size_t nodes_ok, nodes_total, routers_ok;
    size_t unserved;         /* clusters with rows of a table no node serves (status_unserved) */
    size_t n_jobs, next_job; /* the probes: nodes in topology order, then routers */
    creds_gap gap;
} status_ctx;

static void status_usage(FILE *out) {
    fprintf(out, "usage: strata status [--dir DIR]\n"
                 "Shows the clusters, nodes (address, pid, health, tablets, data on disk) and\n"
                 "routers of the local instance in DIR (default $STRATA_HOME, else\n"
                 "~/.strata/local). Exit status 0 when every process is healthy, 1 otherwise.\n");
}

/* The PID cell; returns the pid when it is alive, else 0. */
static pid_t fill_pid(const char *dir, const char *name, char *out, size_t cap) {
    pid_t pid = ops_inst_pid_read(dir, name);
    bool alive = ops_inst_pid_alive(pid);
    if (pid == 0)
        snprintf(out, cap, "-");
    else if (alive)
        snprintf(out, cap, "%d", (int)pid);
    else
        snprintf(out, cap, "%d(gone)", (int)pid);
    return alive ? pid : 0;
}

/* A live process that does not answer (ops_inst_not_answering): its health words, and its name
 * kept for the hint at the end. "down" would send the operator to `strata up`, which leaves a
 * running process alone. */
static void mark_hung(status_ctx *c, const char *name, pid_t pid, char *health, size_t cap) {
    snprintf(health, cap, "not answering (process %d runs)", (int)pid);
    if (c->n_hung < OPS_PROCS_MAX)
        snprintf(c->hung[c->n_hung++], OPS_NAME_MAX, "%s", name);
}

/* Tablets a node made read-only after finding corruption: read_only without a move or a copy
 * under way, which set it too (docs/cluster.md). */
static size_t count_damaged(const Strata__Internal__V1__ListTabletsResponse *l) {
    size_t n = 0;
    for (size_t i = 0; i < l->n_tablets; i++)
        n += l->tablets[i]->read_only && !l->tablets[i]->moving && !l->tablets[i]->incoming;
    return n;
}

/* The node's tablets (ListTablets of every table); NULL when it does not answer. Free with
 * strata__internal__v1__list_tablets_response__free_unpacked. */
static Strata__Internal__V1__ListTabletsResponse *list_tablets(const st_topo_node *n) {
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = rpc_blocking_unary(n->addr, ops_secure_node_opts(n->addr),
                                    "/strata.internal.v1.Node/ListTablets", st_slice_make("", 0),
                                    NULL, 0, STATUS_RPC_TIMEOUT_MS, &resp, NULL);
    Strata__Internal__V1__ListTabletsResponse *l =
        rc == ST_OK
            ? (void *)btu_pb_unpack(&strata__internal__v1__list_tablets_response__descriptor, NULL,
                                    st_slice_make(resp.data, resp.len), NULL)
            : NULL;
    st_buf_free(&resp);
    return l;
}

/* GetStatus then ListTablets (kept in row->tl); health words: ok, down (no answer), or the gRPC
 * code. Returns GetStatus's end. */
static st_code probe_node(const st_topo_node *n, node_row *row) {
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = ops_inst_node_status(n->addr, &resp, &row->ok);
    if (rc == ST_OK) {
        Strata__Internal__V1__NodeStatus *s =
            (void *)btu_pb_unpack(&strata__internal__v1__node_status__descriptor, NULL,
                                  st_slice_make(resp.data, resp.len), NULL);
        snprintf(row->health, sizeof row->health, s ? "ok" : "ok (bad status reply)");
        if (s)
            strata__internal__v1__node_status__free_unpacked(s, NULL);
    } else if (rc == ST_UNIMPLEMENTED) {
        snprintf(row->health, sizeof row->health, "serving"); /* answers, lacks GetStatus */
    } else if (rc == ST_UNAVAILABLE || rc == ST_DEADLINE_EXCEEDED) {
        snprintf(row->health, sizeof row->health, "down");
    } else {
        snprintf(row->health, sizeof row->health, "%s", st_code_name(rc));
    }
    snprintf(row->tablets, sizeof row->tablets, "-");
    if (row->ok && (row->tl = list_tablets(n)) != NULL) {
        row->damaged = count_damaged(row->tl);
        if (row->damaged)
            snprintf(row->tablets, sizeof row->tablets, "%zu (%zu ro)", row->tl->n_tablets,
                     row->damaged);
        else
            snprintf(row->tablets, sizeof row->tablets, "%zu", row->tl->n_tablets);
    }
    st_buf_free(&resp);
    return rc;
}

/* Replication: the lag column's title (two clusters or more). */
static void repl_header(const status_ctx *c) {
    if (c->topo.n_clusters >= 2)
        printf(" %s", "REPLICATION (lag per peer)");
}

/* GetPositions of a node that answered GetStatus, kept in row, and its link to each cluster. */
static void probe_repl(const status_ctx *c, size_t ci, const st_topo_node *n, node_row *row) {
    if (c->topo.n_clusters < 2 || !row->ok)
        return;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = rpc_blocking_unary(
        n->addr, ops_secure_node_opts(n->addr), "/strata.internal.v1.Replication/GetPositions",
        st_slice_make("", 0), NULL, 0, STATUS_RPC_TIMEOUT_MS, &resp, NULL);
    row->pos = rc == ST_OK ? (void *)btu_pb_unpack(&strata__internal__v1__positions__descriptor,
                                                   NULL, st_slice_make(resp.data, resp.len), NULL)
                           : NULL;
    row->repl_unimplemented = rc == ST_UNIMPLEMENTED;
    st_buf_free(&resp);
    if (!row->pos && !row->repl_unimplemented)
        return; /* links stay LINK_UNKNOWN */
    for (size_t k = 0; k < c->topo.n_clusters; k++) {
        if (k == ci)
            continue;
        row->link[k] = LINK_NONE;
        for (size_t p = 0; row->pos && p < row->pos->n_peers; p++) {
            const Strata__Internal__V1__PeerPosition *pp = row->pos->peers[p];
            if (strcmp(pp->cluster_id, c->topo.clusters[k].id) != 0)
                continue;
            row->link[k] = pp->link_cut ? LINK_CUT : pp->backing_off ? LINK_DOWN : LINK_OPEN;
        }
    }
}

/* Per node, the lag to each peer cluster: "<peer>: <records> rec <bytes> <seconds>s", with
 * "backoff (<last error>)" while the shipper retries after an error (the error tells a peer that
 * does not answer from damaged log records that stop the shipping for good), "CUT" while the link
 * is cut; "off" for a node that does not replicate (no --config), "-" when the node does not
 * answer. */
static void repl_cells(const node_row *row) {
    const Strata__Internal__V1__Positions *p = row->pos;
    if (!p) {
        printf(" %s", row->repl_unimplemented ? "off" : "-");
        return;
    }
    if (p->n_peers == 0)
        printf(" off (not replicating: started without --config)");
    for (size_t i = 0; i < p->n_peers; i++) {
        const Strata__Internal__V1__PeerPosition *pp = p->peers[i];
        char bytes[32];
        ops_inst_fmt_bytes(pp->bytes_behind, bytes, sizeof bytes);
        printf("%s%s: %llu rec %s %.1fs%s", i ? ", " : " ", pp->cluster_id,
               (unsigned long long)pp->records_behind, bytes, (double)pp->time_behind_us / 1e6,
               pp->link_cut ? " CUT" : "");
        if (pp->backing_off && !pp->link_cut)
            printf(" backoff%s%s%s", pp->last_error && pp->last_error[0] ? " (" : "",
                   pp->last_error ? pp->last_error : "",
                   pp->last_error && pp->last_error[0] ? ")" : "");
    }
}

/* DIR/secure/FILE exists. */
static bool secure_has(const status_ctx *c, const char *file) {
    char path[OPS_PATH_MAX + 64];
    return ops_fmt(path, sizeof path, "%s/%s/%s", c->dir, OPS_SECURE_SUBDIR, file) &&
           access(path, F_OK) == 0;
}

/* What of a secure instance's credentials is missing (nothing for a plaintext one). */
static void creds_check(status_ctx *c) {
    char path[OPS_PATH_MAX + 16], token[OPS_SECURE_TOKEN_MAX];
    struct stat st;
    if (!ops_fmt(path, sizeof path, "%s/%s", c->dir, OPS_SECURE_SUBDIR) || stat(path, &st) != 0 ||
        !S_ISDIR(st.st_mode))
        return;
    c->gap.ca = !secure_has(c, "ca.pem");
    bool pem = secure_has(c, "admin.pem"), key = secure_has(c, "admin.key");
    c->gap.admin_cert = !pem || !key;
    c->gap.admin_missing = !pem && !key ? "admin.pem and admin.key"
                           : !pem       ? "admin.pem"
                                        : "admin.key";
    c->gap.token =
        secure_has(c, "principals") && !ops_secure_token(c->dir, "admin", token, sizeof token);
}

/* How a call ends that the process refused for want of credentials: without the CA the call
 * goes in plaintext, which a TLS port closes (UNAVAILABLE); without the token the router says
 * UNAUTHENTICATED. */
static bool creds_refused(st_code rc) {
    return rc == ST_UNAVAILABLE || rc == ST_UNAUTHENTICATED || rc == ST_PERMISSION_DENIED;
}

/* A live process status could not authenticate to: its health words. "down" would send the
 * operator to `strata up` for a process that runs. */
static void mark_unchecked(status_ctx *c, pid_t pid, char *health, size_t cap) {
    snprintf(health, cap, "cannot authenticate (process %d runs)", (int)pid);
    c->gap.unchecked++;
}

/* Whether the node answers GetStatus through its Unix socket DATA/node.sock, which routers on
 * this host use instead of TCP (docs/router.md, Unix sockets). */
static bool probe_unix(const st_topo_node *n) {
    char path[ST_TOPO_PATH_MAX + 16], addr[ST_TOPO_PATH_MAX + 32];
    if (!st_topo_node_sock_path(n->data_dir, path, sizeof path) || access(path, F_OK) != 0)
        return false;
    snprintf(addr, sizeof addr, "%s%s", RPC_UNIX_PREFIX, path);
    bool serving;
    (void)ops_inst_node_status(addr, NULL, &serving);
    return serving;
}

/* Every call to node j of cluster i, on a probe thread: row is this node's alone. */
static void probe_node_all(status_ctx *c, size_t i, size_t j) {
    const st_topo_node *n = &c->topo.clusters[i].nodes[j];
    node_row *row = &c->rows[i][j];
    st_code rc = row->rc = probe_node(n, row);
    row->hung = row->live && !row->ok && ops_inst_not_answering(rc, n->addr);
    probe_repl(c, i, n, row);
    /* One that does not answer over TCP does not over its socket either: not waited for twice.
     * One that refused TCP for want of credentials is asked there (plaintext: none needed). */
    bool blind = !row->ok && row->live && !row->hung && (c->gap.ca || c->gap.admin_cert);
    row->unix_ok = (row->ok || blind) && c->topo.n_routers > 0 && probe_unix(n);
}

/* PingAndWarm (ops_inst_router_ping) of router r, on a probe thread: health words ok, ok (no
 * ping), no gRPC (the port accepts but does not speak gRPC), down, or the gRPC code; a live
 * process that does not answer is marked hung (its words are written after the threads end). */
static void probe_router(status_ctx *c, size_t r) {
    router_row *row = &c->routers[r];
    const char *addr = c->topo.routers[r];
    st_code rc = row->rc = ops_inst_router_ping(&c->topo, addr);
    row->ok = rc == ST_OK || rc == ST_UNIMPLEMENTED;
    const char *words = rc == ST_OK                                          ? "ok"
                        : rc == ST_UNIMPLEMENTED                             ? "ok (no ping)"
                        : rc == ST_NOT_FOUND                                 ? "other instance"
                        : row->live && ops_inst_not_answering(rc, addr)      ? ""
                        : rc != ST_UNAVAILABLE && rc != ST_DEADLINE_EXCEEDED ? st_code_name(rc)
                        : ops_inst_tcp_ready(addr, 500)                      ? "no gRPC"
                                                                             : "down";
    snprintf(row->health, sizeof row->health, "%s", words);
}

/* A probe thread: takes the next process until none is left. Each job writes only its own row. */
static void *probe_thread(void *arg) {
    status_ctx *c = arg;
    for (;;) {
        size_t k = __atomic_fetch_add(&c->next_job, 1, __ATOMIC_RELAXED);
        if (k >= c->n_jobs)
            return NULL;
        if (k >= c->nodes_total) {
            probe_router(c, k - c->nodes_total);
            continue;
        }
        for (size_t i = 0; i < c->topo.n_clusters; k -= c->topo.clusters[i++].n_nodes)
            if (k < c->topo.clusters[i].n_nodes) {
                probe_node_all(c, i, k);
                break;
            }
    }
}

/* Runs every probe on up to STATUS_PROBE_THREADS_MAX threads at once, so the answer comes within
 * about one call's deadline however many processes hang (one after another, each hung one
 * added its deadlines); the calling thread helps. */
static void probe_all(status_ctx *c) {
    pthread_t th[STATUS_PROBE_THREADS_MAX];
    size_t n_th = 0;
    (void)ops_secure_on(); /* the credentials are loaded once, before the threads read them */
    c->n_jobs = c->nodes_total + c->topo.n_routers;
    while (n_th < STATUS_PROBE_THREADS_MAX && n_th + 1 < c->n_jobs &&
           pthread_create(&th[n_th], NULL, probe_thread, c) == 0)
        n_th++;
    probe_thread(c);
    for (size_t k = 0; k < n_th; k++)
        pthread_join(th[k], NULL);
}

static void status_probe(status_ctx *c) {
    const st_topology *t = &c->topo;
    char name[OPS_NAME_MAX];
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            node_row *row = &c->rows[i][j];
            ops_inst_node_name(t, i, j, name);
            row->live = fill_pid(c->dir, name, row->pid, sizeof row->pid);
            c->nodes_total++;
        }
    for (size_t r = 0; r < t->n_routers; r++) {
        ops_inst_router_name(r, name);
        c->routers[r].live = fill_pid(c->dir, name, c->routers[r].pid, sizeof c->routers[r].pid);
    }
    probe_all(c);
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            const st_topo_node *n = &t->clusters[i].nodes[j];
            node_row *row = &c->rows[i][j];
            ops_inst_node_name(t, i, j, name);
            if (row->hung)
                mark_hung(c, name, row->live, row->health, sizeof row->health);
            else if (!row->ok && row->live && (c->gap.ca || c->gap.admin_cert) &&
                     creds_refused(row->rc))
                mark_unchecked(c, row->live, row->health, sizeof row->health);
            if (n->data_dir[0]) /* disk use: one walk at a time (ops_inst_disk_bytes) */
                ops_inst_fmt_bytes(ops_inst_disk_bytes(n->data_dir), row->data, sizeof row->data);
            else
                snprintf(row->data, sizeof row->data, "-");
            c->nodes_ok += row->ok;
        }
    for (size_t r = 0; r < t->n_routers; r++) {
        router_row *row = &c->routers[r];
        ops_inst_router_name(r, name);
        if (!row->health[0])
            mark_hung(c, name, row->live, row->health, sizeof row->health);
        else if (!row->ok && row->live && (c->gap.ca || c->gap.token) && creds_refused(row->rc))
            mark_unchecked(c, row->live, row->health, sizeof row->health);
        else if (row->rc == ST_UNAUTHENTICATED && !c->gap.ca && !c->gap.token)
            c->gap.token_refused = c->gap.token_refused || secure_has(c, "tokens");
        c->routers_ok += row->ok;
    }
}

/* The link from cluster i to cluster k, over i's nodes: a link is open only when every node of i
 * ships to k without error. Worst first: cut (by `strata chaos partition`: the file or a node
 * says so), not replicating (a node without a shipper for k), down (a shipper backs off, or no
 * node of k answers: an idle shipper has not noticed yet), unknown (no node of i answered). */
static link_state cluster_link(const status_ctx *c, size_t i, size_t k) {
    const st_topology *t = &c->topo;
    if (ops_inst_partition_cut(&c->part, t->clusters[i].id, t->clusters[k].id))
        return LINK_CUT;
    bool seen[LINK_NONE + 1] = {false};
    for (size_t j = 0; j < t->clusters[i].n_nodes; j++)
        seen[c->rows[i][j].link[k]] = true;
    size_t peers_up = 0;
    for (size_t j = 0; j < t->clusters[k].n_nodes; j++)
        peers_up += c->rows[k][j].ok;
    if (peers_up == 0 && seen[LINK_OPEN])
        seen[LINK_DOWN] = true;
    static const link_state order[] = {LINK_CUT, LINK_NONE, LINK_DOWN, LINK_OPEN};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++)
        if (seen[order[o]])
            return order[o];
    return LINK_UNKNOWN;
}

/* "open", else the bad links: "cut from west", "not replicating to west", "down to west",
 * "unknown to west" (joined with "; "). */
static void print_links(const status_ctx *c, size_t i) {
    static const char *const words[] = {[LINK_UNKNOWN] = "unknown to",
                                        [LINK_CUT] = "cut from",
                                        [LINK_DOWN] = "down to",
                                        [LINK_NONE] = "not replicating to"};
    const st_topology *t = &c->topo;
    if (t->n_clusters < 2) {
        printf(" - (one cluster)");
        return;
    }
    size_t shown = 0;
    for (link_state s = LINK_UNKNOWN; s <= LINK_NONE; s++) {
        if (s == LINK_OPEN)
            continue;
        size_t n = 0;
        for (size_t k = 0; k < t->n_clusters; k++) {
            if (k == i || cluster_link(c, i, k) != s)
                continue;
            if (n++ == 0)
                printf("%s%s", shown++ ? "; " : " ", words[s]);
            printf("%s %s", n > 1 ? "," : "", t->clusters[k].id);
        }
    }
    if (!shown)
        printf(" open");
}

/* Per cluster: nodes up of all (a cluster serves all its rows only when every node is up) and
 * its replication links (print_links). */
static void status_clusters(status_ctx *c) {
    const st_topology *t = &c->topo;
    printf("%-10s %-8s %-9s %s\n", "CLUSTER", "ZONE", "NODES UP", "REPLICATION LINKS");
    for (size_t i = 0; i < t->n_clusters; i++) {
        size_t up = 0;
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++)
            up += c->rows[i][j].ok;
        char health[24];
        snprintf(health, sizeof health, "%zu/%zu", up, t->clusters[i].n_nodes);
        printf("%-10s %-8s %-9s", t->clusters[i].id, t->clusters[i].zone, health);
        print_links(c, i);
        printf("\n");
    }
    printf("\n");
}

static void status_nodes(status_ctx *c) {
    const st_topology *t = &c->topo;
    int hw = 13; /* HEALTH's width: wider when a row says "not answering (process PID runs)" */
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++)
            if ((int)strlen(c->rows[i][j].health) > hw)
                hw = (int)strlen(c->rows[i][j].health);
    printf("%-10s %-8s %-12s %-22s %-14s %-*s %-8s %-10s", "CLUSTER", "ZONE", "NODE", "ADDRESS",
           "PID", hw, "HEALTH", "TABLETS", "DATA");
    repl_header(c);
    printf("\n");
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            const st_topo_node *n = &t->clusters[i].nodes[j];
            const node_row *row = &c->rows[i][j];
            char name[OPS_NAME_MAX];
            ops_inst_node_name(t, i, j, name);
            printf("%-10s %-8s %-12s %-22s %-14s %-*s %-8s %-10s", t->clusters[i].id,
                   t->clusters[i].zone, name, n->addr, row->pid, hw, row->health, row->tablets,
                   row->data);
            if (t->n_clusters >= 2)
                repl_cells(row);
            printf("\n");
        }
}

/* How the routers of this host reach the nodes: through DATA/node.sock where a node serves it
 * (probe_unix), else TCP (docs/router.md, Unix sockets). */
static void status_sockets(const status_ctx *c) {
    const st_topology *t = &c->topo;
    size_t total = 0, served = 0;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            total++;
            served += c->rows[i][j].unix_ok;
        }
    if (served)
        printf("\nRouter links: Unix sockets (%s) to %zu of %zu nodes%s.\n", ST_TOPO_NODE_SOCK_NAME,
               served, total, served < total ? ", TCP to the others" : "");
    else
        printf("\nRouter links: TCP to every node%s.\n",
               ops_inst_no_unix(c->dir) ? " (strata up --no-unix)" : "");
}

static void status_routers(const status_ctx *c) {
    const st_topology *t = &c->topo;
    if (t->n_routers == 0) {
        printf("\nNo router in this topology: clients connect to a node directly.\n");
        return;
    }
    printf("\n%-12s %-22s %-14s %s\n", "ROUTER", "ADDRESS", "PID", "HEALTH");
    for (size_t r = 0; r < t->n_routers; r++) {
        char name[OPS_NAME_MAX];
        ops_inst_router_name(r, name);
        printf("%-12s %-22s %-14s %s\n", name, t->routers[r], c->routers[r].pid,
               c->routers[r].health);
    }
}

/* `strata up` leaves a running process alone, so a hung one needs `strata restart`: said. */
static void status_hung_hint(const status_ctx *c) {
    for (size_t i = 0; i < c->n_hung; i++)
        printf("%s runs but does not answer (hung, stopped by a signal, or still starting): "
               "`strata restart %s%s%s` restarts it.\n",
               c->hung[i], c->hung[i], c->dir_flag ? " --dir " : "", c->dir_flag ? c->dir : "");
}

/* Nodes holding tablets read-only after corruption: they answer, so nothing else shows it. */
static void status_damaged_hint(const status_ctx *c) {
    const st_topology *t = &c->topo;
    for (size_t i = 0; i < t->n_clusters; i++)
        for (size_t j = 0; j < t->clusters[i].n_nodes; j++) {
            size_t n = c->rows[i][j].damaged;
            char name[OPS_NAME_MAX];
            ops_inst_node_name(t, i, j, name);
            if (n)
                printf("%s holds %zu tablet%s read-only after corruption (ro): reads of %s rows "
                       "fail DATA_LOSS and writes are refused there; multi-cluster profiles "
                       "are served by another cluster. %s/logs/%s.log names the damaged file "
                       "(event=tablet_read_only).\n",
                       name, n, n == 1 ? "" : "s", n == 1 ? "its" : "their", c->dir, name);
        }
}

/* What is missing, what it means for the table above, and what to do. */
static void status_creds_hint(const status_ctx *c) {
    const creds_gap *g = &c->gap;
    const char *d = c->dir;
    if (g->token_refused)
        printf("\nThe router refuses the admin token in %s/secure/tokens (UNAUTHENTICATED): it was "
               "rotated or edited since. `strata auth rotate admin --dir %s` gives the admin "
               "principal a new token and writes it there (the old one stops working); the router "
               "takes it within a second.\n",
               d, d);
    if (!g->ca && !g->admin_cert && !g->token)
        return;
    printf("\n%s is a secure instance (`strata up --secure`), but", d);
    if (g->ca)
        printf(" %s/secure/ca.pem, its CA, is missing", d);
    if (g->admin_cert)
        printf("%s %s/secure/%s (the admin certificate status presents to the nodes) %s missing",
               g->ca ? ";" : "", d, g->admin_missing, strchr(g->admin_missing, ' ') ? "are" : "is");
    if (g->token)
        printf("%s %s/secure/tokens has no admin token (the router checks tokens)",
               g->ca || g->admin_cert ? ";" : "", d);
    printf(". Status cannot authenticate to %s, so %zu running process(es) show \"cannot "
           "authenticate\": they run (their pid is alive), but whether they serve is unknown.\n",
           g->ca           ? "its processes"
           : g->admin_cert ? "its nodes"
                           : "its router",
           g->unchecked);
    if (g->ca)
        printf("  ca.pem: put it back (it is the file clients were given: `cbt -cert-file`); "
               "processes keep the CA they loaded at start. If it is lost: `strata down --dir %s`, "
               "move %s/secure/*.pem and *.key aside (keep tokens and principals), then `strata "
               "up --secure --dir %s` makes a new CA and certificates (data is kept; clients "
               "need the new ca.pem). Without ca.pem, a start without --secure would run the "
               "instance in plaintext.\n",
               d, d, d);
    if (g->admin_cert && !g->ca)
        printf("  %s: put it back, or `strata down --dir %s` and `strata up --secure "
               "--dir %s`, which makes the admin certificate again (signed by the instance's CA; "
               "data is kept).\n",
               g->admin_missing, d, d);
    if (g->token)
        printf("  tokens: put the file back (only the tokens' hashes are kept, in principals), "
               "or give the admin principal a new token, which replaces its old one: (umask "
               "077; echo \"admin $(strata auth rotate admin --dir %s)\" >%s/secure/tokens); "
               "the router takes it within a second.\n",
               d, d);
}

/* ---- rows of a table no node serves ----
 * Nodes hold disjoint tablets, so a node that comes back with an empty data directory (a
 * replaced disk) leaves ranges of its tables with no node in its cluster: every node answers and
 * looks well, yet requests routed only to that cluster fail for those rows. */

#define STATUS_RECHECK_MS 300 /* a tablet move leaves a range unlisted for an instant */

typedef struct span {
    const char *table;
    ProtobufCBinaryData start, end; /* end empty: unbounded */
} span;

static int key_cmp(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    size_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.data, b.data, n) : 0;
    return r ? r : (a.len > b.len) - (a.len < b.len);
}

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    int r = strcmp(x->table, y->table);
    return r ? r : key_cmp(x->start, y->start);
}

/* Ranges of a table no span of v[0..n) (its tablets, sorted) covers: how many, the first in
 * *gs, *ge (ge empty: unbounded). */
static size_t span_gaps(const span *v, size_t n, ProtobufCBinaryData *gs, ProtobufCBinaryData *ge) {
    ProtobufCBinaryData at = {0, NULL}; /* covered from the start up to here */
    size_t gaps = 0;
    for (size_t i = 0; i < n; i++) {
        if (key_cmp(v[i].start, at) > 0 && gaps++ == 0) {
            *gs = at;
            *ge = v[i].start;
        }
        if (v[i].end.len == 0)
            return gaps;
        if (key_cmp(v[i].end, at) > 0)
            at = v[i].end;
    }
    if (gaps++ == 0) {
        *gs = at;
        *ge = (ProtobufCBinaryData){0, NULL};
    }
    return gaps;
}

/* Cluster i's tablets (a move's incoming copy left out), sorted; NULL when a node of the cluster
 * did not list its tablets (its rows are then shown as down, not as lost) or memory ran out. */
static span *cluster_spans(const status_ctx *c, size_t i, size_t *n) {
    size_t total = 0;
    *n = 0;
    for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
        if (!c->rows[i][j].tl)
            return NULL;
        total += c->rows[i][j].tl->n_tablets;
    }
    span *v = malloc((total ? total : 1) * sizeof *v);
    for (size_t j = 0; v && j < c->topo.clusters[i].n_nodes; j++)
        for (size_t k = 0; k < c->rows[i][j].tl->n_tablets; k++) {
            const Strata__Internal__V1__Tablet *t = c->rows[i][j].tl->tablets[k];
            if (!t->incoming)
                v[(*n)++] = (span){t->table_name, t->start_key, t->end_key};
        }
    if (v)
        qsort(v, *n, sizeof *v, span_cmp);
    return v;
}

static void print_key(ProtobufCBinaryData k, const char *none) {
    if (k.len == 0) {
        printf("%s", none);
        return;
    }
    putchar('"');
    for (size_t i = 0; i < k.len && i < 40; i++)
        if (k.data[i] >= 0x20 && k.data[i] < 0x7f && k.data[i] != '"' && k.data[i] != '\\')
            putchar(k.data[i]);
        else
            printf("\\x%02x", k.data[i]);
    printf("%s\"", k.len > 40 ? "..." : "");
}

/* Prints (when print) the tables of names[0..n) with rows no node of cluster i serves; returns
 * how many such tables. */
static size_t cluster_unserved(const status_ctx *c, size_t i, char *const *names, size_t n,
                               bool print) {
    size_t n_spans, found = 0;
    span *v = cluster_spans(c, i, &n_spans);
    if (!v)
        return 0;
    for (size_t t = 0; t < n; t++) {
        size_t lo = 0;
        while (lo < n_spans && strcmp(v[lo].table, names[t]) < 0)
            lo++;
        size_t hi = lo;
        while (hi < n_spans && strcmp(v[hi].table, names[t]) == 0)
            hi++;
        ProtobufCBinaryData gs, ge;
        size_t gaps = span_gaps(v + lo, hi - lo, &gs, &ge);
        if (gaps == 0)
            continue;
        if (print) {
            const char *id = strstr(names[t], "/tables/");
            printf("%s: no node serves %s of table %s (%zu range%s; the first from ",
                   c->topo.clusters[i].id, hi == lo ? "any row" : "some rows",
                   id ? id + strlen("/tables/") : names[t], gaps, gaps == 1 ? "" : "s");
            print_key(gs, "the start");
            printf(" to ");
            print_key(ge, "the end");
            printf(").\n");
        }
        found++;
    }
    free(v);
    return found;
}

/* The instance's tables (full names) as the first answering router lists them; NULL without
 * one. Free with google__bigtable__admin__v2__list_tables_response__free_unpacked. */
static Google__Bigtable__Admin__V2__ListTablesResponse *router_tables(const status_ctx *c) {
    char parent[ST_TOPO_ID_MAX * 2 + 32];
    snprintf(parent, sizeof parent, "projects/%s/instances/%s", c->topo.project, c->topo.instance);
    Google__Bigtable__Admin__V2__ListTablesRequest req =
        GOOGLE__BIGTABLE__ADMIN__V2__LIST_TABLES_REQUEST__INIT;
    req.parent = parent;
    req.view = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY;
    uint8_t buf[sizeof parent + 16];
    size_t len = google__bigtable__admin__v2__list_tables_request__pack(&req, buf), n_md;
    const rpc_metadata *md = ops_secure_md(&n_md);
    for (size_t r = 0; r < c->topo.n_routers; r++) {
        if (!c->routers[r].ok)
            continue;
        st_buf resp;
        st_buf_init(&resp);
        st_code rc = rpc_blocking_unary(c->topo.routers[r], ops_secure_router_opts(),
                                        "/google.bigtable.admin.v2.BigtableTableAdmin/ListTables",
                                        st_slice_make(buf, len), md, n_md, STATUS_RPC_TIMEOUT_MS,
                                        &resp, NULL);
        void *l =
            rc == ST_OK
                ? btu_pb_unpack(&google__bigtable__admin__v2__list_tables_response__descriptor,
                                NULL, st_slice_make(resp.data, resp.len), NULL)
                : NULL;
        st_buf_free(&resp);
        if (l)
            return l;
    }
    return NULL;
}

/* Cluster i's tablets listed again (a move that was ending when they were first listed). */
static void cluster_relist(status_ctx *c, size_t i) {
    for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
        node_row *row = &c->rows[i][j];
        if (row->tl)
            strata__internal__v1__list_tablets_response__free_unpacked(row->tl, NULL);
        row->tl = list_tablets(&c->topo.clusters[i].nodes[j]);
    }
}

/* Clusters where rows of a table the router lists are in no node's tablets, seen twice
 * STATUS_RECHECK_MS apart: said under the cluster table, with what it means and what to do. */
static void status_unserved(status_ctx *c) {
    Google__Bigtable__Admin__V2__ListTablesResponse *l = router_tables(c);
    if (!l)
        return; /* no router answers: the tables are unknown (status says the router is down) */
    char *names[1024];
    size_t n = 0;
    for (size_t t = 0; t < l->n_tables && n < sizeof names / sizeof names[0]; t++)
        names[n++] = l->tables[t]->name;
    bool again = false;
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        again = again || cluster_unserved(c, i, names, n, false) > 0;
    if (again)
        usleep(STATUS_RECHECK_MS * 1000);
    for (size_t i = 0; again && i < c->topo.n_clusters; i++) {
        if (cluster_unserved(c, i, names, n, false) == 0)
            continue;
        cluster_relist(c, i);
        if (cluster_unserved(c, i, names, n, true) == 0)
            continue;
        const char *id = c->topo.clusters[i].id;
        printf("  A node of %s most likely came back without its data (an emptied or replaced "
               "disk). Requests routed only to %s fail for those rows (FAILED_PRECONDITION), and "
               "replication of them into %s waits (its peers' links show down to %s); "
               "multi-cluster app profiles serve them from another cluster. Restore that node's "
               "data directory, or point the single-cluster app profiles routed to %s at another "
               "cluster: strata failover PROFILE CLUSTER%s%s.\n",
               id, id, id, id, id, c->dir_flag ? " --dir " : "", c->dir_flag ? c->dir : "");
        c->unserved++;
    }
    if (c->unserved)
        printf("\n");
    google__bigtable__admin__v2__list_tables_response__free_unpacked(l, NULL);
}

static int status_run(status_ctx *c) {
    char path[OPS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/topology", c->dir);
    st_err err = {0};
    st_code rc = st_topology_load(path, &c->topo, &err);
    if (rc == ST_NOT_FOUND) {
        fprintf(stderr,
                "strata status: no instance in %s (no topology file): start one with "
                "`strata up%s%s`\n",
                c->dir, c->dir_flag ? " --dir " : "", c->dir_flag ? c->dir : "");
        return 1;
    }
    if (rc != ST_OK) {
        fprintf(stderr, "strata status: %s\n", err.msg);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);       /* a node dying mid-call must not end this command */
    st_log_set_level(ST_LOG_ERROR); /* a down node is shown in the table, not as log lines */
    printf("Instance %s/%s in %s\n\n", c->topo.project, c->topo.instance, c->dir);
    if (!ops_inst_partition_read(c->dir, &c->part))
        printf("(%s/run/partition is unreadable: `strata chaos heal` resets it)\n\n", c->dir);
    creds_check(c);
    status_probe(c);
    status_clusters(c);
    status_unserved(c);
    status_nodes(c);
    status_routers(c);
    if (c->topo.n_routers > 0)
        status_sockets(c);
    bool all =
        c->nodes_ok == c->nodes_total && c->routers_ok == c->topo.n_routers && c->unserved == 0;
    for (size_t i = 0; i < c->topo.n_clusters; i++)
        for (size_t j = 0; j < c->topo.clusters[i].n_nodes; j++) {
            if (c->rows[i][j].pos)
                strata__internal__v1__positions__free_unpacked(c->rows[i][j].pos, NULL);
            if (c->rows[i][j].tl)
                strata__internal__v1__list_tablets_response__free_unpacked(c->rows[i][j].tl, NULL);
        }
    printf("\n%zu of %zu nodes healthy, %zu of %zu routers healthy.\n", c->nodes_ok, c->nodes_total,
           c->routers_ok, c->topo.n_routers);
    if (c->unserved)
        printf("Rows of %zu cluster(s) are served by no node: see above.\n", c->unserved);
    status_hung_hint(c);
    status_damaged_hint(c);
    status_creds_hint(c);
    if (!all && c->nodes_ok + c->routers_ok + c->gap.unchecked < c->nodes_total + c->topo.n_routers)
        printf("Each process's log is %s/logs/<name>.log; `strata up%s%s` starts whatever is "
               "stopped (`strata restart NAME` one process).\n",
               c->dir, c->dir_flag ? " --dir " : "", c->dir_flag ? c->dir : "");
    return all ? 0 : 1;
}

int ops_status_main(int argc, char **argv) {
    status_ctx *c = calloc(1, sizeof *c); /* the topology is large: not the stack */
    if (!c) {
        fprintf(stderr, "strata status: out of memory\n");
        return 1;
    }
    int rc = -1;
    for (int i = 1; i < argc && rc < 0; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            status_usage(stdout);
            rc = 0;
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            c->dir_flag = argv[++i];
        } else {
            fprintf(stderr, "strata status: unknown flag or missing value: '%s'\n", argv[i]);
            status_usage(stderr);
            rc = 2;
        }
    }
    if (rc < 0)
        rc = ops_inst_dir(c->dir_flag, c->dir, sizeof c->dir) ? status_run(c) : 2;
    free(c);
    return rc;
}
