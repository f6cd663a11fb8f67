/* main.c — strata-node: a tablet server. Alone it is a one-node Bigtable instance:
 *   strata-node --data DIR --listen 127.0.0.1:8086
 * then BIGTABLE_EMULATOR_HOST=127.0.0.1:8086 cbt -project p -instance i ls */
#include <event2/event.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/node_metrics.h"
#include "strata/storage.h" /* STO_ORIGIN_MAX */

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-node --data DIR [--listen HOST:PORT] [--no-sync] [--cache-mb N]\n"
            "                   [--memtable-mb N] [--cluster-num N] [--node-num N]\n"
            "                   [--split-bytes N] [--config TOPOLOGY] [--metrics HOST:PORT]\n"
            "                   [--unix PATH] [--poll-us N] [--accept-data-loss]\n"
            "                   [--cluster-id ID] [--verbose] [--version]\n"
            "                   [--tls-cert FILE --tls-key FILE --tls-ca FILE]\n"
            "Serves the Cloud Bigtable data and table admin APIs from DIR (created if absent).\n"
            "Default listen address 127.0.0.1:8086. --no-sync acknowledges writes before they\n"
            "are on disk (fast, loses recent writes in a crash). --cache-mb N sets the block\n"
            "cache (default 256); --memtable-mb N the size of a memtable.\n"
            "--node-num N (1..16777215) makes the node a cluster member: it serves the tablets a\n"
            "router gives it (strata.internal.v1.Node) and answers other rows with\n"
            "strata-not-owner (docs/cluster.md); 0, the default, is a standalone node.\n"
            "--split-bytes N splits tablets larger than N bytes (0, the default: never).\n"
            "--cluster-num N (1..1023) with --config TOPOLOGY makes the node a member of the\n"
            "N-th cluster of the topology file: it ships its writes to the other clusters and\n"
            "applies theirs (docs/formats/replication.md). --cluster-num without --config is\n"
            "refused (the node would not replicate).\n"
            "--unix PATH also serves on a Unix-domain socket at PATH (at most 107 bytes; a stale\n"
            "socket file there is replaced, and removed at exit): a strata-router on this host\n"
            "uses DATA/node.sock instead of TCP when it exists (docs/cluster.md). TCP --listen\n"
            "stays for cbt, other hosts and replication.\n"
            "--metrics HOST:PORT serves Prometheus metrics at http://HOST:PORT/metrics (port 0:\n"
            "any free port, shown in the startup line; docs/metrics.md). Off by default.\n"
            "--poll-us N keeps polling the sockets N microseconds after the last message before\n"
            "sleeping (default 50; 0: never), which saves a wake-up per message when few calls\n"
            "are in flight; it stops while the CPUs are busy (docs/router.md, Busy polling).\n"
            "--accept-data-loss starts even when the commit log's last segment was cut short or\n"
            "lost acknowledged records its checkpoint names, or the storage MANIFEST, the\n"
            "catalog or log segments are missing, dropping what they held and logging exactly\n"
            "what (docs/formats/log.md, docs/operations.md); without it the node refuses to\n"
            "start and names the damaged or missing file.\n"
            "--cluster-id ID names this node's cluster in change stream records\n"
            "(source_cluster_id) when it runs without --config ([a-z][-a-z0-9]*, at most 63\n"
            "characters; default strata). With --config the topology names the clusters.\n"
            "--tls-cert FILE --tls-key FILE --tls-ca FILE: mutual TLS on the TCP listener and on\n"
            "the links to peer nodes (a --unix socket stays plaintext for this user only: its\n"
            "directory must be mode 0700; callers there count as strata-router).\n"
            "Clients must present a certificate signed by\n"
            "the cluster CA in --tls-ca; its subject OU says what they are (strata-router,\n"
            "strata-node, strata-admin) and decides which methods they may call. The node's\n"
            "own certificate (OU=strata-node, valid for its --listen host) serves and dials.\n"
            "SIGHUP re-reads the three files; a reload that fails keeps the old ones\n"
            "(docs/security.md, Internal links).\n");
    fputs(RPC_LIMITS_FLAGS_USAGE, out);
}

static void on_signal(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

/* Numeric flags: each value is checked (st_parse_u64), so a typo is an error, never a silent 0
 * (a bad --cluster-num used to mean "standalone"). */
#define NODE_CACHE_MB_MAX (1u << 20)   /* 1 TiB of block cache */
#define NODE_MEMTABLE_MB_MAX 4096      /* 4 GiB memtables */
#define NODE_NUM_MAX ((1u << 24) - 1)  /* node numbers fit in 24 bits (tablet ids, tokens) */
#define NODE_SPLIT_BYTES_MAX INT64_MAX /* the topology's split_bytes is signed */

typedef struct num_flag {
    const char *name;
    uint64_t lo, hi;
    const char *what;
} num_flag;

static const num_flag num_flags[] = {
    {"--cache-mb", 0, NODE_CACHE_MB_MAX, "MiB of block cache"},
    {"--memtable-mb", 1, NODE_MEMTABLE_MB_MAX, "MiB per memtable"},
    {"--cluster-num", 0, STO_ORIGIN_MAX, "this node's cluster, in topology order; 0: none"},
    {"--node-num", 0, NODE_NUM_MAX, "this node's number in the topology; 0: standalone"},
    {"--split-bytes", 0, NODE_SPLIT_BYTES_MAX, "tablet split threshold in bytes; 0: never"},
};

/* The value of numeric flag a into *out; false (after a message) when a is one of them and v is
 * not a whole number in its range. *is_num tells whether a was a numeric flag. */
static bool parse_num_flag(const char *a, const char *v, bool *is_num, uint64_t *out) {
    *is_num = false;
    for (size_t k = 0; k < sizeof num_flags / sizeof num_flags[0]; k++) {
        const num_flag *f = &num_flags[k];
        if (strcmp(a, f->name) != 0)
            continue;
        *is_num = true;
        if (st_parse_u64(v, f->lo, f->hi, out))
            return true;
        fprintf(stderr, "strata-node: %s takes a whole number from %llu to %llu (%s), got '%s'\n",
                f->name, (unsigned long long)f->lo, (unsigned long long)f->hi, f->what, v);
        return false;
    }
    return true;
}

static void set_num(node_opts *o, const char *a, uint64_t v) {
    if (!strcmp(a, "--cache-mb"))
        o->block_cache_bytes = (size_t)v << 20;
    else if (!strcmp(a, "--memtable-mb"))
        o->memtable_bytes = (size_t)v << 20;
    else if (!strcmp(a, "--cluster-num"))
        o->cluster_num = (uint32_t)v;
    else if (!strcmp(a, "--node-num"))
        o->node_num = (uint32_t)v;
    else
        o->split_bytes = v;
}

typedef struct main_args {
    node_opts o;
    char host[256], mhost[256];
    const char *unix_path;
    uint16_t mport;
    unsigned poll_us;
    rpc_limits limits; /* --max-connections and the other flags of strata/rpc.h */
    bool limits_ok;
    const char *tls_cert, *tls_key, *tls_ca; /* mutual TLS: all three or none */
} main_args;

/* A HOST:PORT flag (st_addr_split, IPv6 in brackets); false after a message. */
static bool parse_addr_flag(const char *flag, const char *v, char *host, size_t cap,
                            uint16_t *port) {
    if (st_addr_split(v, host, cap, port) && host[0])
        return true;
    fprintf(stderr, "strata-node: bad %s '%s': use HOST:PORT ([::1]:PORT for IPv6)\n", flag, v);
    return false;
}

/* A flag of RPC_LIMITS_FLAGS_USAGE (rpc_limits_flag): true when a was one (its value consumed),
 * with m->limits_ok false after a message when the value is bad. */
static bool parse_limits_flag(main_args *m, const char *a, const char *v, int *i) {
    st_err err = {0};
    int rc = rpc_limits_flag(&m->limits, a, v, &err);
    m->limits_ok = rc >= 0;
    if (rc < 0)
        fprintf(stderr, "strata-node: %s\n", err.msg);
    else if (rc > 0)
        ++*i;
    return rc != 0;
}

/* --cluster-id: a cluster id as topology files spell them ([a-z][-a-z0-9]*, 1..63 characters). */
static bool cluster_id_valid(const char *v) {
    size_t n = strlen(v);
    if (n == 0 || n > 63 || v[0] < 'a' || v[0] > 'z')
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '-'))
            return false;
    return true;
}

/* One flag at argv[*i] (with its value, if any). Returns -1 to go on, else the exit code. */
static int parse_one(main_args *m, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool is_num;
    uint64_t num = 0;
    if (v && !parse_num_flag(a, v, &is_num, &num))
        return 2;
    if (v && is_num) {
        set_num(&m->o, a, num);
        ++*i;
    } else if (!strcmp(a, "--data") && v) {
        m->o.data_dir = argv[++*i];
    } else if (!strcmp(a, "--listen") && v) {
        if (!parse_addr_flag(a, argv[++*i], m->host, sizeof m->host, &m->o.listen_port))
            return 2;
    } else if (!strcmp(a, "--metrics") && v) {
        if (!parse_addr_flag(a, argv[++*i], m->mhost, sizeof m->mhost, &m->mport))
            return 2;
    } else if (!strcmp(a, "--no-sync")) {
        m->o.sync = false;
    } else if (!strcmp(a, "--config") && v) {
        m->o.config_path = argv[++*i];
    } else if (!strcmp(a, "--unix") && v) {
        m->unix_path = argv[++*i];
    } else if (!strcmp(a, "--poll-us") && v) {
        if (!rpc_loop_poll_parse(argv[++*i], &m->poll_us)) {
            fprintf(stderr, "strata-node: --poll-us takes 0 to %d (microseconds)\n",
                    RPC_LOOP_POLL_US_MAX);
            return 2;
        }
    } else if (parse_limits_flag(m, a, v, i)) {
        if (!m->limits_ok)
            return 2;
    } else if (!strcmp(a, "--cluster-id") && v) {
        if (!cluster_id_valid(argv[++*i])) {
            fprintf(stderr,
                    "strata-node: --cluster-id takes [a-z][-a-z0-9]* of at most 63 characters, "
                    "got '%s'\n",
                    argv[*i]);
            return 2;
        }
        m->o.cluster_id = argv[*i];
    } else if (!strcmp(a, "--tls-cert") && v) {
        m->tls_cert = argv[++*i];
    } else if (!strcmp(a, "--tls-key") && v) {
        m->tls_key = argv[++*i];
    } else if (!strcmp(a, "--tls-ca") && v) {
        m->tls_ca = argv[++*i];
    } else if (!strcmp(a, "--accept-data-loss")) {
        m->o.accept_data_loss = true;
    } else if (!strcmp(a, "--verbose")) {
        st_log_set_level(ST_LOG_DEBUG);
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        usage(stdout);
        return 0;
    } else if (!strcmp(a, "--version")) {
        printf("strata-node %s\n", st_version());
        return 0;
    } else {
        fprintf(stderr, "strata-node: unknown flag or missing value: '%s'\n", a);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Flags that only make sense together. A cluster member that does not know the topology would
 * never replicate while consistency checks said all was well: refuse it here. */
static int check_args(const main_args *m) {
    if (!m->o.data_dir) {
        fprintf(stderr, "strata-node: --data DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (m->o.cluster_num && !(m->o.config_path && m->o.config_path[0])) {
        fprintf(stderr,
                "strata-node: --cluster-num %u makes this node a member of cluster %u of a "
                "replicated instance, but no topology was given, so it would neither ship its "
                "writes to the other clusters nor accept theirs: pass --config TOPOLOGY_FILE (the "
                "instance's topology, docs/formats/topology.md; `strata up` writes DIR/topology), "
                "or drop --cluster-num for a node of a single-cluster instance\n",
                m->o.cluster_num, m->o.cluster_num);
        return 2;
    }
    bool any_tls = m->tls_cert || m->tls_key || m->tls_ca;
    if (any_tls && !(m->tls_cert && m->tls_key && m->tls_ca)) {
        fprintf(stderr, "strata-node: mutual TLS needs all of --tls-cert FILE, --tls-key FILE and "
                        "--tls-ca FILE (the node's certificate, its key and the cluster CA; "
                        "docs/security.md)\n");
        return 2;
    }
    return -1;
}

/* Returns -1 when the node should start, else the exit code. */
static int parse_args(main_args *m, int argc, char **argv) {
    node_opts_default(&m->o);
    m->o.listen_port = 8086;
    snprintf(m->host, sizeof m->host, "127.0.0.1");
    m->poll_us = RPC_LOOP_POLL_US_DEFAULT;
    rpc_limits_default(&m->limits);
    for (int i = 1; i < argc; i++) {
        int rc = parse_one(m, argc, argv, &i);
        if (rc >= 0)
            return rc;
    }
    return check_args(m);
}

/* The node's two TLS contexts: serving (client certificates of the CA required) and dialling
 * peers (presenting the node's own certificate). */
typedef struct node_tls {
    const char *cert, *key, *ca;
    SSL_CTX *server, *client;
    node_ctx *n; /* set once the node is open */
} node_tls;

static bool node_tls_open(node_tls *t, st_err *err) {
    if (!t->cert)
        return true;
    /* every peer would refuse an expired certificate: stop here, saying so, not start "ready" */
    if (rpc_tls_cert_current(t->cert, err) != ST_OK)
        return false;
    t->server = rpc_tls_server_ctx_new(t->cert, t->key, t->ca, err);
    t->client = t->server ? rpc_tls_client_ctx_new(t->ca, t->cert, t->key, err) : NULL;
    return t->client != NULL;
}

/* SIGHUP: new files for new connections, both ways; on any failure nothing changes. */
static void on_sighup(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_tls *t = arg;
    st_err err = {0};
    SSL_CTX *ctx = rpc_tls_server_ctx_new(t->cert, t->key, t->ca, &err);
    if (!ctx || rpc_tls_client_ctx_reload(t->client, t->ca, t->cert, t->key, &err) != ST_OK) {
        SSL_CTX_free(ctx);
        st_log(ST_LOG_ERROR, "node",
               "msg=\"TLS reload failed: still using the previous certificate\" err=\"%s\"",
               err.msg);
        return;
    }
    if (!node_set_ssl_ctx(t->n, ctx)) {
        SSL_CTX_free(ctx);
        return;
    }
    SSL_CTX_free(t->server);
    t->server = ctx;
    st_log(ST_LOG_INFO, "node", "msg=\"TLS certificate reloaded\" cert=%s", t->cert);
}

int main(int argc, char **argv) {
    static main_args args; /* zeroed; parse_args fills it */
    int prc = parse_args(&args, argc, argv);
    if (prc >= 0)
        return prc;
    node_opts o = args.o;
    char *host = args.host, *mhost = args.mhost;
    const char *unix_path = args.unix_path;
    uint16_t mport = args.mport;
    unsigned poll_us = args.poll_us;
    o.listen_host = host;
    rpc_limits_set(&args.limits);
    st_heap_tune(); /* requests of a MiB or more come and go all the time */
    signal(SIGPIPE, SIG_IGN);
    /* A write past a file-size limit (`ulimit -f`) fails with EFBIG and is reported like a full
     * disk, instead of killing the node without a log line. */
    signal(SIGXFSZ, SIG_IGN);
    static node_tls tls; /* lives as long as the loop (the SIGHUP event's argument) */
    tls = (node_tls){.cert = args.tls_cert, .key = args.tls_key, .ca = args.tls_ca};
    st_err err = {0};
    if (!node_tls_open(&tls, &err)) {
        fprintf(stderr, "strata-node: %s\n", err.msg);
        SSL_CTX_free(tls.server);
        return 1;
    }
    if (tls.server) /* a reload asked for while the node starts must not stop it */
        signal(SIGHUP, SIG_IGN);
    o.ssl_ctx = tls.server;
    o.client_ssl_ctx = tls.client;
    struct event_base *base = event_base_new();
    node_ctx *n;
    if (!base || node_open(base, &o, &n, &err) != ST_OK) {
        fprintf(stderr, "strata-node: %s\n", err.msg[0] ? err.msg : "could not start");
        if (base) /* a port in use ends here: leak reports would bury the reason in the log */
            event_base_free(base);
        SSL_CTX_free(tls.server);
        SSL_CTX_free(tls.client);
        return 1;
    }
    tls.n = n;
    if (unix_path && node_listen_unix(n, unix_path, &err) != ST_OK) {
        fprintf(stderr, "strata-node: --unix: %s\n", err.msg);
        node_close(n);
        event_base_free(base);
        return 1;
    }
    node_metrics *metrics = NULL;
    if (mhost[0] && node_metrics_start(n, mhost, mport, &metrics, &mport, &err) != ST_OK) {
        fprintf(stderr, "strata-node: %s\n", err.msg);
        node_close(n);
        event_base_free(base);
        return 1;
    }
    char mline[300] = "", uline[RPC_UNIX_PATH_MAX + 8] = "";
    if (mhost[0])
        snprintf(mline, sizeof mline, " metrics=http://%s:%u/metrics", mhost, mport);
    if (unix_path)
        snprintf(uline, sizeof uline, " unix=%s", unix_path);
    printf("strata-node listening on %s:%u data=%s%s%s%s\n", host, node_port(n), o.data_dir, uline,
           mline, tls.server ? " mtls" : "");
    fflush(stdout);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sighup = tls.server ? evsignal_new(base, SIGHUP, on_sighup, &tls) : NULL;
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    if (sighup)
        event_add(sighup, NULL);
    rpc_loop_watch *watch = rpc_loop_watch_start(base, "strata-node");
    rpc_loop_run(base, poll_us);
    rpc_loop_watch_stop(watch);
    st_log(ST_LOG_INFO, "node", "shutting down");
    node_shutdown(n); /* calls in flight end with a retryable answer, not a dropped connection */
    event_free(sigint);
    event_free(sigterm);
    if (sighup)
        event_free(sighup);
    node_metrics_stop(metrics);
    node_close(n);
    event_base_free(base);
    SSL_CTX_free(tls.server);
    SSL_CTX_free(tls.client);
    return 0;
}
