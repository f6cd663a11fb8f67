/* main.c — strata-router: the public endpoint of a Strata instance.
 *   strata-router --config TOPOLOGY_FILE [--listen HOST:PORT]
 * then BIGTABLE_EMULATOR_HOST=HOST:PORT cbt -project p -instance i ls */
#include <event2/event.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/router.h"
#include "strata/rpc.h"
#include "strata/router_metrics.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-router --config TOPOLOGY_FILE [--listen HOST:PORT]\n"
            "                     [--balance auto|on|off] [--balance-ms MS] [--zone ZONE]\n"
            "                     [--metrics HOST:PORT] [--poll-us N] [--no-unix] [--verbose]\n"
            "                     [--max-change-streams N]\n"
            "                     [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]\n"
            "                     [--auth-file FILE] [--audit-log FILE [--audit-log-max-bytes N]]\n"
            "                     [--internal-ca FILE [--internal-cert FILE --internal-key FILE]]\n"
            "                     [--version]\n"
            "Serves the Cloud Bigtable data and table admin APIs for the instance the topology\n"
            "file describes (docs/formats/topology.md), forwarding to its nodes. The listen\n"
            "address defaults to the file's [router] listen, else 127.0.0.1:8086.\n"
            "The tablet balancer moves tablets from the fullest node of a cluster to the\n"
            "emptiest every MS milliseconds (default 2000); with `auto` (the default) only the\n"
            "router listening on the file's first [router] address runs it.\n"
            "Multi-cluster app profiles try clusters in ZONE first, then in file order.\n"
            "--metrics HOST:PORT serves Prometheus metrics at http://HOST:PORT/metrics (port 0:\n"
            "any free port, shown in the startup line; docs/metrics.md). Off by default.\n"
            "--poll-us N keeps polling the sockets N microseconds after the last message before\n"
            "sleeping (default 50; 0: never), which saves a wake-up per message when few calls\n"
            "are in flight; it stops while the CPUs are busy (docs/router.md, Busy polling).\n"
            "A node whose data directory (topology file) holds a Unix socket node.sock, as\n"
            "strata-node --unix DATA/node.sock makes, is reached through it instead of TCP;\n"
            "--no-unix: TCP to every node (docs/router.md, Unix sockets).\n"
            "--tls-cert FILE --tls-key FILE serve TLS (HTTP/2 over TLS 1.2+) instead of plaintext\n"
            "with this PEM certificate chain and key; --tls-client-ca FILE also requires client\n"
            "certificates signed by a CA in FILE. SIGHUP re-reads the three files: new\n"
            "connections get the new certificate, open ones keep theirs; a reload that fails\n"
            "keeps the old certificate (docs/operations.md, TLS on the router).\n"
            "--auth-file FILE requires a bearer token of a principal of FILE on every call and\n"
            "checks its role (docs/security.md; `strata auth` edits FILE); FILE is re-read when\n"
            "it changes and on SIGHUP. Without it the router is open to every client.\n"
            "--audit-log FILE appends a JSON line per admin call, denied call and failed\n"
            "authentication; it moves to FILE.1 past --audit-log-max-bytes (default 100 MiB).\n"

            "--internal-ca FILE: mutual TLS to the nodes (strata-node --tls-ca): the router\n"
            "presents --internal-cert/--internal-key (default: --tls-cert/--tls-key), whose\n"
            "subject OU must be strata-router, and accepts only nodes whose certificate the\n"
            "cluster CA in FILE signed for strata-node and the node's topology host. SIGHUP\n"
            "re-reads them too (docs/security.md, Internal links).\n"
            "--max-change-streams N: ReadChangeStream calls relayed at once (default 1024);\n"
            "past it a new one is RESOURCE_EXHAUSTED. With --max-queued-response-bytes it\n"
            "bounds what unread streams hold (docs/router.md, Memory).\n");
    fputs(RPC_LIMITS_FLAGS_USAGE, out);
}

#define RTR_BALANCE_MS_MAX 86400000 /* a day between balancer rounds */

static void on_signal(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

/* --tls-cert/--tls-key/--tls-client-ca, and the context new connections use. */
typedef struct tls_files {
    const char *cert, *key, *client_ca; /* cert NULL: plaintext */
    SSL_CTX *ctx;
    /* --internal-ca/--internal-cert/--internal-key: the links to the nodes; ca NULL: plaintext */
    const char *int_ca, *int_cert, *int_key;
    SSL_CTX *node_ctx;
    rtr_ctx *r; /* set once the router is open */
} tls_files;

/* SIGHUP: the files are read into a new context; only when that works does the listener switch
 * to it (the old context lives on in the connections made with it). */
static void on_sighup(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    tls_files *t = arg;
    rtr_auth_reload(t->r); /* --auth-file, when given */
    st_err err = {0};
    if (t->node_ctx) {
        if (rpc_tls_client_ctx_reload(t->node_ctx, t->int_ca, t->int_cert, t->int_key, &err) !=
            ST_OK)
            st_log(ST_LOG_ERROR, "router",
                   "msg=\"TLS reload of the node links failed: still using the previous "
                   "certificate\" err=\"%s\"",
                   err.msg);
        else
            st_log(ST_LOG_INFO, "router", "msg=\"node link certificate reloaded\" cert=%s",
                   t->int_cert);
    }
    if (!t->ctx)
        return;
    SSL_CTX *ctx = rpc_tls_server_ctx_new(t->cert, t->key, t->client_ca, &err);
    if (!ctx) {
        st_log(ST_LOG_ERROR, "router",
               "msg=\"TLS reload failed: still serving the previous certificate\" err=\"%s\"",
               err.msg);
        return;
    }
    if (!rtr_set_ssl_ctx(t->r, ctx)) {
        SSL_CTX_free(ctx);
        return;
    }
    SSL_CTX_free(t->ctx);
    t->ctx = ctx;
    st_log(ST_LOG_INFO, "router", "msg=\"TLS certificate reloaded\" cert=%s", t->cert);
}

/* --metrics HOST:PORT, when given. */
static char metrics_host[ST_TOPO_ADDR_MAX + 1];
static uint16_t metrics_port;
/* --poll-us: busy polling after activity before the loop sleeps (rpc_loop_run). */
static unsigned poll_us = RPC_LOOP_POLL_US_DEFAULT;

/* The heap a burst of calls left free (stalled ReadRows hold over a MiB each: 2,000 of them
 * 1.8 GB) goes back to the kernel once they end, instead of staying resident for good: checked
 * every RTR_HEAP_RELEASE_MS, released past RTR_HEAP_KEEP_FREE_BYTES free (docs/router.md,
 * Memory). */
#define RTR_HEAP_RELEASE_MS 5000
#define RTR_HEAP_KEEP_FREE_BYTES (64u << 20)

static void heap_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
    st_heap_release(RTR_HEAP_KEEP_FREE_BYTES);
}

static int run(struct event_base *base, const rtr_opts *o, tls_files *tls) {
    rtr_ctx *r;
    st_err err = {0};
    if (rtr_open(base, o, &r, &err) != ST_OK) {
        fprintf(stderr, "strata-router: %s\n", err.msg[0] ? err.msg : "could not start");
        return 1;
    }
    metrics_http *metrics = NULL;
    char mline[ST_TOPO_ADDR_MAX + 48] = "";
    if (metrics_host[0]) {
        metrics = rtr_metrics_start(r, metrics_host, metrics_port, &metrics_port, &err);
        if (!metrics) {
            fprintf(stderr, "strata-router: %s\n", err.msg);
            rtr_close(r);
            event_base_loop(base, EVLOOP_NONBLOCK);
            return 1;
        }
        snprintf(mline, sizeof mline, " metrics=http://%s:%u/metrics", metrics_host, metrics_port);
    }
    printf("strata-router listening on %s:%u%s%s\n", rtr_host(r), rtr_port(r),
           tls->ctx ? " tls" : "", mline);
    fflush(stdout);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sighup = NULL;
    tls->r = r;
    if ((tls->ctx || tls->node_ctx || o->auth_file) &&
        (sighup = evsignal_new(base, SIGHUP, on_sighup, tls)))
        event_add(sighup, NULL);
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    struct event *heap = event_new(base, -1, EV_PERSIST, heap_cb, NULL);
    struct timeval heap_tv = {RTR_HEAP_RELEASE_MS / 1000, RTR_HEAP_RELEASE_MS % 1000 * 1000};
    if (heap)
        event_add(heap, &heap_tv);
    rpc_loop_watch *watch = rpc_loop_watch_start(base, "strata-router");
    rpc_loop_run(base, poll_us);
    rpc_loop_watch_stop(watch);
    st_log(ST_LOG_INFO, "router", "shutting down");
    event_free(sigint);
    event_free(sigterm);
    if (heap)
        event_free(heap);
    if (sighup)
        event_free(sighup);
    metrics_http_free(metrics);
    rtr_close(r);
    event_base_loop(base, EVLOOP_NONBLOCK);
    return 0;
}

/* The router's own certificates are valid now: clients and nodes would refuse one that has
 * expired (or is not yet valid), so the router stops with the dates and what to do instead of
 * starting "ready" and failing every connection. */
static bool tls_certs_current(const tls_files *t) {
    const char *certs[] = {t->cert, t->int_cert};
    for (size_t i = 0; i < 2; i++) {
        st_err err = {0};
        if (certs[i] && (i == 0 || !t->cert || strcmp(certs[i], t->cert)) &&
            rpc_tls_cert_current(certs[i], &err) != ST_OK) {
            fprintf(stderr, "strata-router: %s\n", err.msg);
            return false;
        }
    }
    return true;
}

/* Checks the TLS flags and loads the files before anything else starts, so a bad file stops the
 * router at once with the reason. 0 when fine (or no TLS asked for). */
static int tls_open(tls_files *t) {
    if (!tls_certs_current(t))
        return 1;
    if (t->int_cert || t->int_key || t->int_ca) {
        if (!t->int_cert && !t->int_key) { /* one certificate for both sides */
            t->int_cert = t->cert;
            t->int_key = t->key;
        }
        if (!t->int_ca || !t->int_cert || !t->int_key) {
            fprintf(stderr, "strata-router: mutual TLS to the nodes needs --internal-ca FILE (the "
                            "cluster CA) and the router's certificate and key (--internal-cert "
                            "and --internal-key, or --tls-cert and --tls-key)\n");
            return 2;
        }
        st_err err = {0};
        if (!(t->node_ctx = rpc_tls_client_ctx_new(t->int_ca, t->int_cert, t->int_key, &err))) {
            fprintf(stderr, "strata-router: node links: %s\n", err.msg);
            return 1;
        }
    }
    if (!t->cert && !t->key && !t->client_ca)
        return 0;
    if (!t->cert || !t->key) {
        fprintf(stderr, "strata-router: TLS needs both --tls-cert FILE and --tls-key FILE%s\n",
                t->client_ca ? " (--tls-client-ca only adds client certificate checks)" : "");
        return 2;
    }
    st_err err = {0};
    if (!(t->ctx = rpc_tls_server_ctx_new(t->cert, t->key, t->client_ca, &err))) {
        fprintf(stderr, "strata-router: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* What the command line sets: the flags' values before they become rtr_opts. */
typedef struct {
    const char *config, *listen, *zone;
    const char *auth_file, *audit_log; /* docs/security.md */
    uint64_t audit_max, cs_max;
    int balance;
    long long balance_ms;
    bool no_unix;
    tls_files tls;
    rpc_limits limits; /* --max-connections and the other flags of strata/rpc.h */
} router_args;

/* Reads the flags into r; returns -1 to go on, else the exit status (after --help, --version
 * or a bad flag, said on stderr). */
static int parse_args(int argc, char **argv, router_args *r) {
    st_err lim_err = {0};
    int lim_rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v)
            r->config = argv[++i];
        else if (!strcmp(a, "--listen") && v)
            r->listen = argv[++i];
        else if (!strcmp(a, "--zone") && v)
            r->zone = argv[++i];
        else if (!strcmp(a, "--tls-cert") && v)
            r->tls.cert = argv[++i];
        else if (!strcmp(a, "--tls-key") && v)
            r->tls.key = argv[++i];
        else if (!strcmp(a, "--tls-client-ca") && v)
            r->tls.client_ca = argv[++i];
        else if (!strcmp(a, "--auth-file") && v)
            r->auth_file = argv[++i];
        else if (!strcmp(a, "--audit-log") && v)
            r->audit_log = argv[++i];
        else if (!strcmp(a, "--audit-log-max-bytes") && v) {
            if (!st_parse_u64(argv[++i], 4096, UINT64_MAX, &r->audit_max)) {
                fprintf(stderr,
                        "strata-router: --audit-log-max-bytes takes a whole number of "
                        "bytes, at least 4096, got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--internal-ca") && v)
            r->tls.int_ca = argv[++i];
        else if (!strcmp(a, "--internal-cert") && v)
            r->tls.int_cert = argv[++i];
        else if (!strcmp(a, "--internal-key") && v)
            r->tls.int_key = argv[++i];
        else if (!strcmp(a, "--metrics") && v) {
            if (!st_addr_split(argv[++i], metrics_host, sizeof metrics_host, &metrics_port) ||
                !metrics_host[0]) {
                fprintf(stderr, "strata-router: bad --metrics '%s': use HOST:PORT\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--balance") && v) {
            const char *m = argv[++i];
            r->balance = !strcmp(m, "on")    ? RTR_BALANCE_ON
                         : !strcmp(m, "off") ? RTR_BALANCE_OFF
                                             : RTR_BALANCE_AUTO;
            if (strcmp(m, "on") && strcmp(m, "off") && strcmp(m, "auto")) {
                fprintf(stderr, "strata-router: --balance takes auto, on or off\n");
                return 2;
            }
        } else if (!strcmp(a, "--balance-ms") && v) {
            uint64_t ms;
            if (!st_parse_u64(argv[++i], 1, RTR_BALANCE_MS_MAX, &ms)) {
                fprintf(stderr,
                        "strata-router: --balance-ms takes a whole number from 1 to %d "
                        "(milliseconds), got '%s'\n",
                        RTR_BALANCE_MS_MAX, v);
                return 2;
            }
            r->balance_ms = (long long)ms;
        } else if (!strcmp(a, "--poll-us") && v) {
            if (!rpc_loop_poll_parse(argv[++i], &poll_us)) {
                fprintf(stderr, "strata-router: --poll-us takes 0 to %d (microseconds)\n",
                        RPC_LOOP_POLL_US_MAX);
                return 2;
            }
        } else if (!strcmp(a, "--max-change-streams") && v) {
            if (!st_parse_u64(argv[++i], 1, UINT32_MAX, &r->cs_max)) {
                fprintf(stderr,
                        "strata-router: --max-change-streams takes a whole number from 1 to "
                        "%u, got '%s'\n",
                        UINT32_MAX, v);
                return 2;
            }
        } else if (!strcmp(a, "--no-unix"))
            r->no_unix = true;
        else if ((lim_rc = rpc_limits_flag(&r->limits, a, v, &lim_err)) != 0) {
            if (lim_rc < 0) {
                fprintf(stderr, "strata-router: %s\n", lim_err.msg);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--verbose"))
            st_log_set_level(ST_LOG_DEBUG);
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("strata-router %s\n", st_version());
            return 0;
        } else {
            fprintf(stderr, "strata-router: unknown flag or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!r->config) {
        fprintf(stderr, "strata-router: --config TOPOLOGY_FILE is required\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv) {
    router_args a = {.balance = RTR_BALANCE_AUTO};
    rpc_limits_default(&a.limits);
    int arg_rc = parse_args(argc, argv, &a);
    if (arg_rc >= 0)
        return arg_rc;
    static st_topology topo; /* large: not on the stack */
    st_err err = {0};
    if (st_topology_load(a.config, &topo, &err) != ST_OK) {
        fprintf(stderr, "strata-router: %s\n", err.msg);
        return 1;
    }
    rtr_opts o;
    rtr_opts_default(&o);
    o.topo = &topo;
    o.balance = a.balance;
    o.balance_ms = a.balance_ms;
    o.zone = a.zone;
    o.no_unix = a.no_unix;
    o.change_streams_max = (uint32_t)a.cs_max;
    o.auth_file = a.auth_file;
    o.audit_log = a.audit_log;
    o.audit_log_bytes_max = a.audit_max;
    char host[ST_TOPO_ADDR_MAX + 1];
    if (a.listen) {
        if (!st_addr_split(a.listen, host, sizeof host, &o.listen_port)) {
            fprintf(stderr,
                    "strata-router: bad --listen '%s': use HOST:PORT ([::1]:PORT for IPv6)\n",
                    a.listen);
            return 2;
        }
        o.listen_host = host;
    }
    int tls_rc = tls_open(&a.tls);
    if (tls_rc != 0) {
        SSL_CTX_free(a.tls.node_ctx);
        return tls_rc;
    }
    o.ssl_ctx = a.tls.ctx;
    o.node_ssl_ctx = a.tls.node_ctx;
    rpc_limits_set(&a.limits);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a write past `ulimit -f` fails (EFBIG), not kills the router */
    st_heap_tune();           /* node batches of a MiB come and go all the time */
    if (a.tls.ctx || a.tls.node_ctx ||
        a.auth_file) /* a reload asked for while the router starts must not stop it */
        signal(SIGHUP, SIG_IGN);
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "strata-router: could not create the event loop\n");
        SSL_CTX_free(a.tls.ctx);
        SSL_CTX_free(a.tls.node_ctx);
        return 1;
    }
    int rc = run(base, &o, &a.tls);
    event_base_free(base);
    SSL_CTX_free(a.tls.ctx);
    SSL_CTX_free(a.tls.node_ctx);
    return rc;
}
