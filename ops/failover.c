/* ops/failover.c — `strata failover PROFILE CLUSTER`: the operator's manual failover of a
 * single-cluster app profile (Bigtable's "manual failover": multi-cluster profiles fail over by
 * themselves, single-cluster ones are repointed by a person). It talks to the first router of
 * DIR/topology that answers (the one the operator needs may be in the lost zone) or to
 * --endpoint, reads the profile (GetAppProfile), sends UpdateAppProfile with
 * single_cluster_routing = {CLUSTER, the same allow_transactional_writes} and the etag it read
 * (so a concurrent change is refused, not overwritten), and prints the profile before and after.
 * An update whose answer is lost is an unknown outcome: the profile is read again. The router
 * that took the update routes by it at once, other routers within about a second. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "instance.h"
#include "certs.h"
#include "strata/btutil.h"
#include "strata/rpc.h"

#define FAILOVER_RPC_TIMEOUT_MS 30000 /* an admin call through the router */
#define FAILOVER_NAME_MAX 256
#define FAILOVER_IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
/* UpdateAppProfile answered UNAVAILABLE (the router could not reach the profile's cluster: a
 * frozen or cut-off zone it has not marked down yet) is sent again for this long. */
#define FAILOVER_RETRY_MS 15000
#define FAILOVER_RETRY_PAUSE_MS 1000

typedef Google__Bigtable__Admin__V2__AppProfile fo_profile;

static void failover_usage(FILE *out) {
    fprintf(out,
            "usage: strata failover PROFILE CLUSTER [--dir DIR] [--endpoint HOST:PORT] [--force]\n"
            "Points the single-cluster app profile PROFILE at CLUSTER (keeping its\n"
            "allow_transactional_writes), through a router of the local instance in DIR\n"
            "(default $STRATA_HOME, else ~/.strata/local): the first of its topology's routers\n"
            "that answers, or --endpoint's. Prints the profile before and after.\n"
            "Multi-cluster profiles fail over by themselves and are refused.\n"
            "CLUSTER must have every node answering (a cluster with a dead node cannot\n"
            "serve that node's rows).\n"
            "  --force   skip that check and the router's warning check (another profile\n"
            "            allows single-row transactions on a different cluster)\n"
            "Writes the old cluster acknowledged but has not replicated yet reach CLUSTER when\n"
            "replication catches up (`cbt waitforreplication TABLE` waits for it).\n"
            "Exit 0 when PROFILE routes to CLUSTER afterwards. An update whose answer is lost\n"
            "(the router went away) is checked by reading the profile again.\n");
}

static void describe(const fo_profile *p, const char *when) {
    if (p->routing_policy_case ==
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING &&
        p->single_cluster_routing) {
        printf("%-7s %s: single-cluster routing to %s, transactional writes %s (etag %s)\n", when,
               p->name, p->single_cluster_routing->cluster_id,
               p->single_cluster_routing->allow_transactional_writes ? "allowed" : "not allowed",
               p->etag);
        return;
    }
    printf("%-7s %s: multi-cluster routing (etag %s)\n", when, p->name, p->etag);
}

/* Says why GetAppProfile failed, with what to do when the router's connection is the cause
 * (ops_router_hint: not running, TLS, token). */
static void fail_said(st_code rc, const char *msg, const char *name, const char *router) {
    size_t n_md;
    const rpc_client_opts *copts = ops_secure_router_opts();
    (void)ops_secure_md(&n_md);
    const char *hint = ops_router_hint(rc, msg, copts && copts->ssl_ctx, n_md > 0);
    fprintf(stderr, "strata failover: GetAppProfile %s at %s: %s: %s%s%s\n", name, router,
            st_code_name(rc), msg, hint[0] ? ": " : "", hint);
}

/* GetAppProfile; NULL after printing why (unless quiet). Free with ..._free_unpacked. */
static fo_profile *get_profile(const char *router, const char *name, bool quiet) {
    Google__Bigtable__Admin__V2__GetAppProfileRequest req;
    google__bigtable__admin__v2__get_app_profile_request__init(&req);
    req.name = (char *)name;
    uint8_t buf[FAILOVER_NAME_MAX + 16];
    size_t len = google__bigtable__admin__v2__get_app_profile_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err st = {0};
    size_t n_md;
    const rpc_metadata *md = ops_secure_md(&n_md);
    st_code rc =
        rpc_blocking_unary(router, ops_secure_router_opts(), FAILOVER_IA "GetAppProfile",
                           st_slice_make(buf, len), md, n_md, FAILOVER_RPC_TIMEOUT_MS, &resp, &st);
    fo_profile *p = NULL;
    if (rc == ST_OK &&
        !(p = (void *)btu_pb_unpack(&google__bigtable__admin__v2__app_profile__descriptor, NULL,
                                    st_slice_make(resp.data, resp.len), NULL)))
        fprintf(stderr, "strata failover: the router sent an unreadable app profile\n");
    else if (rc != ST_OK && !quiet)
        fail_said(rc, st.msg, name, router);
    st_buf_free(&resp);
    return p;
}

/* How one UpdateAppProfile ended. */
typedef enum fo_outcome {
    FO_STORED,  /* the router answered a finished operation without error */
    FO_REFUSED, /* refused, nothing changed: said */
    FO_BUSY,    /* the router answered UNAVAILABLE: it could not reach the profile's cluster */
    FO_OPEN,    /* the connection ended, or the deadline passed, after the request may have
                   reached the router: stored or not, only a new read tells */
} fo_outcome;

/* Whether a failed call may have reached the router: anything but a connect that failed, a TLS
 * handshake that did not finish, or a call that never started (nothing was sent then). The
 * router's own UNAVAILABLE answers are not connection failures (not "connection to ..."). */
static bool call_may_have_landed(st_code rc, const char *msg) {
    if (rc == ST_DEADLINE_EXCEEDED)
        return true;
    if (rc != ST_UNAVAILABLE || strncmp(msg, "connection to ", 14) != 0)
        return false;
    return !strstr(msg, "connect failed") && !strstr(msg, "connect timed out") &&
           !strstr(msg, "TLS handshake failed") && !strstr(msg, "server's certificate names");
}

/* The UpdateAppProfile request moving cur to cluster, packed into out. */
static st_code pack_update(const fo_profile *cur, const char *cluster, bool force, st_buf *out) {
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting s;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&s);
    s.cluster_id = (char *)cluster;
    s.allow_transactional_writes = cur->single_cluster_routing->allow_transactional_writes;
    fo_profile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    p.name = cur->name;
    p.etag = cur->etag;
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p.single_cluster_routing = &s;
    char *paths[] = {"single_cluster_routing"};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.paths = paths;
    mask.n_paths = 1;
    Google__Bigtable__Admin__V2__UpdateAppProfileRequest req;
    google__bigtable__admin__v2__update_app_profile_request__init(&req);
    req.app_profile = &p;
    req.update_mask = &mask;
    req.ignore_warnings = force;
    size_t len = google__bigtable__admin__v2__update_app_profile_request__get_packed_size(&req);
    if (st_buf_reserve(out, len + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__admin__v2__update_app_profile_request__pack(&req, out->data);
    return ST_OK;
}

/* One UpdateAppProfile. Says why unless the outcome is FO_BUSY or FO_OPEN (the caller goes on
 * then); why receives the call's message. quiet_busy false: a router's UNAVAILABLE is said and
 * FO_REFUSED (the retry time is over). */
static fo_outcome update_once(const char *router, const fo_profile *cur, const char *cluster,
                              bool force, bool quiet_busy, char *why, size_t why_cap) {
    st_buf reqb, resp;
    st_buf_init(&reqb);
    st_buf_init(&resp);
    st_err st = {0};
    st_code rc = pack_update(cur, cluster, force, &reqb);
    if (rc == ST_OK) {
        size_t n_md;
        const rpc_metadata *md = ops_secure_md(&n_md);
        rc = rpc_blocking_unary(router, ops_secure_router_opts(), FAILOVER_IA "UpdateAppProfile",
                                st_buf_slice(&reqb), md, n_md, FAILOVER_RPC_TIMEOUT_MS, &resp, &st);
    } else {
        st_err_set(&st, rc, "out of memory");
    }
    st_buf_free(&reqb);
    Google__Longrunning__Operation *op =
        rc == ST_OK ? (void *)btu_pb_unpack(&google__longrunning__operation__descriptor, NULL,
                                            st_slice_make(resp.data, resp.len), NULL)
                    : NULL;
    bool ok = op && op->done && op->result_case != GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    snprintf(why, why_cap, "%s", st.msg);
    /* UNAVAILABLE from the router's connection is not the router failing to reach a cluster: a
     * call that never reached it is refused at once, one that may have is looked up again. */
    fo_outcome out = ok ? FO_STORED : FO_REFUSED;
    const rpc_client_opts *copts = ops_secure_router_opts();
    if (call_may_have_landed(rc, st.msg))
        out = FO_OPEN;
    else if (rc == ST_UNAVAILABLE && quiet_busy &&
             ops_router_fail_of(rc, st.msg, copts && copts->ssl_ctx) == OPS_ROUTER_FAIL_OTHER &&
             strncmp(st.msg, "connection to ", 14) != 0)
        out = FO_BUSY;
    if (out == FO_REFUSED && rc != ST_OK)
        fprintf(stderr, "strata failover: UpdateAppProfile refused: %s: %s%s\n", st_code_name(rc),
                st.msg,
                rc == ST_FAILED_PRECONDITION && !force ? "\n(--force skips this check)" : "");
    else if (out == FO_REFUSED)
        fprintf(stderr, "strata failover: the update did not finish: %s\n",
                op && op->error && op->error->message ? op->error->message : "no operation");
    if (op)
        google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&resp);
    return out;
}

/* Whether p routes to cluster (single-cluster routing). */
static bool routes_to(const fo_profile *p, const char *cluster) {
    return p->routing_policy_case ==
               GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING &&
           p->single_cluster_routing && !strcmp(p->single_cluster_routing->cluster_id, cluster);
}

static void nap_ms(int ms) {
    struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&nap, NULL);
}

/* The profile read again after an update whose outcome is open (FO_OPEN): asked until
 * deadline_us (st_mono_us), since a router that died under the update may be restarted
 * meanwhile; NULL when it never answered. */
static fo_profile *reread_open(const char *router, const char *name, const char *why,
                               int64_t deadline_us) {
    fprintf(stderr,
            "strata failover: the router's answer to the update was lost (%s): it may have "
            "stored it; reading %s again (for up to %d s)\n",
            why, name, FAILOVER_RETRY_MS / 1000);
    for (;;) {
        fo_profile *p = get_profile(router, name, true);
        if (p || st_mono_us() >= deadline_us)
            return p;
        nap_ms(FAILOVER_RETRY_PAUSE_MS);
    }
}

/* Said when the outcome stays unknown: the router never answered again. */
static void say_unknown(const char *router, const char *name, const char *cluster) {
    fprintf(stderr,
            "strata failover: outcome unknown: the update was sent but the router at %s went "
            "away before answering and has not answered since, so whether %s now routes to %s "
            "is not known. Start the router again (`strata up`), then run this command again: "
            "it says whether the profile already routes to %s (or read it with `cbt "
            "getappprofile`)\n",
            router, name, cluster, cluster);
}

/* UpdateAppProfile, sent again for up to FAILOVER_RETRY_MS while the router answers UNAVAILABLE:
 * right after every node of the profile's cluster froze (SIGSTOP, a paused VM, a network black
 * hole) the router still counts the cluster up, fails to store the profile there ("no answer to
 * a keepalive PING"), and marks it down a few seconds later; the operator's first command used
 * to fail then and the same command succeed a moment after. Before each new attempt the profile
 * is read again: an attempt that stored it although its answer was lost is seen (done), a change
 * made by someone else meanwhile stops the command, and the fresh etag is sent. An answer lost
 * with the router's connection (the router killed or restarted under the update) is such an
 * attempt too: "refused" would be a lie when the router had stored the change. */
static bool update_profile(const char *router, const char *name, const fo_profile *before,
                           const char *cluster, bool force) {
    int64_t deadline = st_mono_us() + (int64_t)FAILOVER_RETRY_MS * 1000;
    const char *from = before->single_cluster_routing->cluster_id;
    fo_profile *fresh = NULL;
    const fo_profile *cur = before;
    bool ok = false;
    for (int attempt = 1;; attempt++) {
        char why[512] = "";
        bool last = st_mono_us() >= deadline;
        fo_outcome out = update_once(router, cur, cluster, force, !last, why, sizeof why);
        ok = out == FO_STORED;
        if (out == FO_STORED || out == FO_REFUSED)
            break;
        fo_profile *again = NULL;
        if (out == FO_BUSY) {
            fprintf(stderr,
                    "strata failover: the router could not store the profile (UNAVAILABLE: %s): "
                    "it has probably not yet noticed that %s is down; retrying (attempt %d, for "
                    "up to %d s)\n",
                    why, from, attempt + 1, FAILOVER_RETRY_MS / 1000);
            nap_ms(FAILOVER_RETRY_PAUSE_MS);
            if (!(again = get_profile(router, name, true)))
                continue; /* send the one read before */
        } else if (!(again = reread_open(router, name, why, deadline))) {
            say_unknown(router, name, cluster);
            break;
        }
        if (fresh)
            google__bigtable__admin__v2__app_profile__free_unpacked(fresh, NULL);
        cur = fresh = again;
        if (routes_to(cur, cluster)) { /* an attempt stored it; its answer was lost */
            if (out == FO_OPEN)
                printf("the router stored the update before its answer was lost\n");
            ok = true;
            break;
        }
        if (!routes_to(cur, from)) {
            fprintf(stderr,
                    "strata failover: %s changed meanwhile (not by this command): left as "
                    "it is\n",
                    name);
            break;
        }
    }
    if (fresh)
        google__bigtable__admin__v2__app_profile__free_unpacked(fresh, NULL);
    return ok;
}

/* Whether every node of the cluster answers GetStatus; those that do not are printed. Pointing
 * a single-cluster profile at a cluster with a dead node fails that node's rows, and at a dead
 * cluster every request of the profile (single-cluster profiles never move by themselves), so
 * the command refuses it unless forced. */
static bool cluster_serving(const st_topology *t, const char *cluster) {
    const st_topo_cluster *c = st_topology_cluster(t, cluster);
    size_t down = 0;
    for (size_t j = 0; c && j < c->n_nodes; j++) {
        bool serving = false;
        (void)ops_inst_node_status(c->nodes[j].addr, NULL, &serving);
        if (!serving) {
            char name[OPS_NAME_MAX];
            ops_inst_node_name(t, (size_t)(c - t->clusters), j, name);
            fprintf(stderr, "strata failover: %s of %s (%s) does not answer\n", name, cluster,
                    c->nodes[j].addr);
            down++;
        }
    }
    if (c && down)
        fprintf(stderr,
                "strata failover: %zu of %zu node(s) of %s do not answer: its rows on them "
                "would fail for every client of the profile\n",
                down, c->n_nodes, cluster);
    return c && down == 0;
}

typedef struct fo_args {
    const char *dir_flag, *endpoint, *profile, *cluster;
    bool force;
} fo_args;

/* 0 parsed, 1 --help shown, 2 bad usage. */
static int parse_args(int argc, char **argv, fo_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            failover_usage(stdout);
            return 1;
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            a->dir_flag = argv[++i];
        } else if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) {
            a->endpoint = argv[++i];
        } else if (!strcmp(argv[i], "--force")) {
            a->force = true;
        } else if (argv[i][0] != '-' && !a->profile) {
            a->profile = argv[i];
        } else if (argv[i][0] != '-' && !a->cluster) {
            a->cluster = argv[i];
        } else {
            failover_usage(stderr);
            return 2;
        }
    }
    if (!a->profile || !a->cluster) {
        failover_usage(stderr);
        return 2;
    }
    return 0;
}

/* The instance's topology and the router to talk to; false after printing why. */
static bool load_instance(const fo_args *a, st_topology *t, char *router, size_t cap) {
    char dir[OPS_PATH_MAX], path[OPS_PATH_MAX];
    st_err err = {0};
    if (!ops_inst_dir(a->dir_flag, dir, sizeof dir) ||
        !ops_fmt(path, sizeof path, "%s/topology", dir))
        return false;
    if (st_topology_load(path, t, &err) != ST_OK) {
        fprintf(stderr, "strata failover: %s (is there an instance in %s? `strata up`)\n", err.msg,
                dir);
        return false;
    }
    if (t->n_routers == 0) {
        fprintf(stderr, "strata failover: %s names no router ([router] listen = HOST:PORT)\n",
                path);
        return false;
    }
    if (!st_topology_cluster(t, a->cluster)) {
        fprintf(stderr, "strata failover: cluster '%s' is not in %s\n", a->cluster, path);
        return false;
    }
    if (a->endpoint) {
        snprintf(router, cap, "%s", a->endpoint);
        return true;
    }
    return ops_inst_router_pick("strata failover", t, a->dir_flag, router, cap);
}

int ops_failover_main(int argc, char **argv) {
    fo_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc == 1 ? 0 : 2;
    st_log_set_level(ST_LOG_WARN); /* a lost connection is said in a sentence, not log lines */
    static st_topology topo;       /* large: not on the stack */
    char router[ST_TOPO_ADDR_MAX + 1], name[FAILOVER_NAME_MAX];
    if (!load_instance(&a, &topo, router, sizeof router))
        return 1;
    if (!ops_fmt(name, sizeof name, "projects/%s/instances/%s/appProfiles/%s", topo.project,
                 topo.instance, a.profile))
        return 2;
    fo_profile *before = get_profile(router, name, false);
    if (!before)
        return 1;
    describe(before, "before:");
    int rc = 1;
    if (before->routing_policy_case !=
            GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING ||
        !before->single_cluster_routing) {
        fprintf(stderr,
                "strata failover: %s uses multi-cluster routing: the router fails it over "
                "by itself (docs/router.md, \"Failover\")\n",
                a.profile);
    } else if (!strcmp(before->single_cluster_routing->cluster_id, a.cluster)) {
        printf("%s already routes to %s: nothing to do\n", a.profile, a.cluster);
        rc = 0;
    } else if (!cluster_serving(&topo, a.cluster) && !a.force) {
        fprintf(stderr,
                "strata failover: %s left on %s (`strata status` shows the nodes; "
                "--force points it at %s anyway)\n",
                a.profile, before->single_cluster_routing->cluster_id, a.cluster);
    } else if (update_profile(router, name, before, a.cluster, a.force)) {
        fo_profile *after = get_profile(router, name, false);
        if (after) {
            describe(after, "after:");
            google__bigtable__admin__v2__app_profile__free_unpacked(after, NULL);
            rc = 0;
        }
    }
    google__bigtable__admin__v2__app_profile__free_unpacked(before, NULL);
    return rc;
}
