/* main.c — strata-node: a tablet server. Alone it is a one-node Bigtable instance:
 *   strata-node --data DIR --listen 127.0.0.1:8086
 * then BIGTABLE_EMULATOR_HOST=127.0.0.1:8086 cbt -project p -instance i ls */
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/node.h"
#include "strata/rpc.h"
#include "strata/node_metrics.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: strata-node --data DIR [--listen HOST:PORT] [--no-sync] [--cache-mb N]\n"
        "                   [--memtable-mb N] [--cluster-num N] [--node-num N]\n"
        "                   [--split-bytes N] [--config TOPOLOGY] [--metrics HOST:PORT]\n"
        "                   [--unix PATH] [--poll-us N] [--accept-data-loss] [--verbose]\n"
        "Serves the Cloud Bigtable data and table admin APIs from DIR (created if absent).\n"
        "Default listen address 127.0.0.1:8086. --no-sync acknowledges writes before they\n"
        "are on disk (fast, loses recent writes in a crash). --cache-mb N sets the block\n"
        "cache (default 256); --memtable-mb N the size of a memtable.\n"
        "--node-num N (1..16777215) makes the node a cluster member: it serves the tablets a\n"
        "router gives it (strata.internal.v1.Node) and answers other rows with\n"
        "strata-not-owner (docs/cluster.md); 0, the default, is a standalone node.\n"
        "--split-bytes N splits tablets larger than N bytes (0, the default: never).\n"
        "--config TOPOLOGY (with --cluster-num) ships this node's writes to the other\n"
        "clusters of the topology file and applies theirs (docs/formats/replication.md).\n"
        "--unix PATH also serves on a Unix-domain socket at PATH (at most 107 bytes; a stale\n"
        "socket file there is replaced, and removed at exit): a strata-router on this host\n"
        "uses DATA/node.sock instead of TCP when it exists (docs/cluster.md). TCP --listen\n"
        "stays for cbt, other hosts and replication.\n"
        "--metrics HOST:PORT serves Prometheus metrics at http://HOST:PORT/metrics (port 0:\n"
        "any free port, shown in the startup line; docs/metrics.md). Off by default.\n"
        "--poll-us N keeps polling the sockets N microseconds after the last message before\n"
        "sleeping (default 50; 0: never), which saves a wake-up per message when few calls\n"
        "are in flight; it stops while the CPUs are busy (docs/router.md, Busy polling).\n"
        "--accept-data-loss starts even when the commit log's last segment was cut short,\n"
        "dropping the writes in the lost part and logging exactly which (docs/formats/log.md);\n"
        "without it the node refuses to start and names the damaged file.\n");
    fputs(RPC_LIMITS_FLAGS_USAGE, out);
}

static void on_signal(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

int main(int argc, char **argv) {
    node_opts o;
    node_opts_default(&o);
    o.listen_port = 8086;
    char host[256] = "127.0.0.1", mhost[256] = "";
    const char *unix_path = NULL;
    uint16_t mport = 0;
    unsigned poll_us = RPC_LOOP_POLL_US_DEFAULT;
    rpc_limits limits; /* --max-connections and the other flags of strata/rpc.h */
    rpc_limits_default(&limits);
    st_err lim_err = {0};
    int lim_rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--data") && v)
            o.data_dir = argv[++i];
        else if (!strcmp(a, "--listen") && v) {
            if (!node_parse_addr(argv[++i], host, sizeof host, &o.listen_port)) {
                fprintf(stderr, "strata-node: bad --listen '%s': use HOST:PORT\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--metrics") && v) {
            if (!node_parse_addr(argv[++i], mhost, sizeof mhost, &mport) || !mhost[0]) {
                fprintf(stderr, "strata-node: bad --metrics '%s': use HOST:PORT\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--no-sync"))
            o.sync = false;
        else if (!strcmp(a, "--cache-mb") && v)
            o.block_cache_bytes = strtoull(argv[++i], NULL, 10) << 20;
        else if (!strcmp(a, "--memtable-mb") && v)
            o.memtable_bytes = strtoull(argv[++i], NULL, 10) << 20;
        else if (!strcmp(a, "--cluster-num") && v)
            o.cluster_num = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--node-num") && v)
            o.node_num = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--split-bytes") && v)
            o.split_bytes = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--config") && v)
            o.config_path = argv[++i];
        else if (!strcmp(a, "--unix") && v)
            unix_path = argv[++i];
        else if (!strcmp(a, "--poll-us") && v) {
            if (!rpc_loop_poll_parse(argv[++i], &poll_us)) {
                fprintf(stderr, "strata-node: --poll-us takes 0 to %d (microseconds)\n",
                        RPC_LOOP_POLL_US_MAX);
                return 2;
            }
        } else if ((lim_rc = rpc_limits_flag(&limits, a, v, &lim_err)) != 0) {
            if (lim_rc < 0) {
                fprintf(stderr, "strata-node: %s\n", lim_err.msg);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--accept-data-loss"))
            o.accept_data_loss = true;
        else if (!strcmp(a, "--verbose"))
            st_log_set_level(ST_LOG_DEBUG);
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!o.data_dir) {
        fprintf(stderr, "strata-node: --data DIR is required\n");
        usage(stderr);
        return 2;
    }
    o.listen_host = host;
    rpc_limits_set(&limits);
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    node_ctx *n;
    st_err err = {0};
    if (!base || node_open(base, &o, &n, &err) != ST_OK) {
        fprintf(stderr, "strata-node: %s\n", err.msg[0] ? err.msg : "could not start");
        return 1;
    }
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
    printf("strata-node listening on %s:%u data=%s%s%s\n", host, node_port(n), o.data_dir, uline,
           mline);
    fflush(stdout);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    rpc_loop_run(base, poll_us);
    st_log(ST_LOG_INFO, "node", "shutting down");
    event_free(sigint);
    event_free(sigterm);
    node_metrics_stop(metrics);
    node_close(n);
    event_base_free(base);
    return 0;
}
