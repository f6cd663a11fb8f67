/*
 * Proves the router's behaviour against nodes that misbehave, with a real router (rtr_open) and
 * fake nodes (rpc_server instances answering the few node methods the router uses) on one event
 * loop in one process:
 *   - a ReadRows with rows_limit that a retry got past (a strata-not-owner refusal) ends OK;
 *   - a ReadRows with rows_limit never resets its node stream (the node ends it by itself; a
 *     node's HTTP/2 layer closes a connection that resets too many streams per second);
 *   - a request whose node's connection dropped under it twice (a query of death) is sent
 *     nowhere else and is refused for a while after, so it costs two nodes, not every cluster
 *     (ReadRows, and the entries of MutateRows), while a node killed under one request again
 *     and again costs that request nothing (served by the other cluster each time);
 *   - a request to a cluster none of whose nodes is reachable fails fast with UNAVAILABLE naming
 *     the cluster, and a read of a table without tablets in its cluster fails with
 *     FAILED_PRECONDITION naming both;
 *   - a node whose health probes wait behind its other work (answering after the probe's
 *     deadline while a read keeps streaming on the same connection) is not marked down;
 *   - a node that sends GOAWAY (here: its HTTP/2 layer refusing a client that reset too many
 *     streams) finishes the calls it accepted, and the client takes no new ones on it;
 *   - failed connections to one peer are logged once (then at most every 10 s), naming the
 *     peer's address and port and the socket error;
 *   - a connection whose peer goes silent (a proxy that starts dropping every byte, as a
 *     network partition does) is failed by the rpc client's keepalive PING with UNAVAILABLE,
 *     not left hanging until the call's deadline, and a multi-cluster read whose cluster goes
 *     silent is served by the other cluster (the router finds the link silent: calls open,
 *     nothing received for RTR_SILENT_MS);
 *   - a DropRowRange is not answered OK while a node holding the table's tablets fails to list
 *     them afterwards (a move it started could not be seen).
 * Each test starts its own nodes and router on ephemeral loopback ports.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>

#include "google/bigtable/admin/v2/instance.pb-c.h"
#include "google/bigtable/admin/v2/table.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "failover.h"
#include "router_internal.h"
#include "strata/internal/v1/node.pb-c.h"

#define FN_TABLE "projects/p/instances/i/tables/t"
#define FN_TABLE2 "projects/p/instances/i/tables/t2" /* tablets in cluster c2 only */
#define FN_POISON "poison-row"
#define FN_TRICKLE                                                                                 \
    "trickle-row"          /* answered with a row every FN_TRICKLE_MS, FN_TRICKLE_ROWS times */
#define FN_HOLD "hold-row" /* held unanswered while fake_node.hold is set */
#define FN_TRICKLE_MS 50
#define FN_TRICKLE_ROWS 60
#define FN_SLOW_STATUS_MS 2000
#define FN_CLUSTERS_MAX 2

typedef struct fn_pending fn_pending;

typedef struct fake_node {
    struct event_base *base;
    rpc_server *srv;
    uint16_t port;
    int cluster; /* 0 or 1 */
    bool dead;
    struct event *die_ev;
    rpc_call *dying; /* the poison call, finished once the server is gone */
    int data_reads, cancels, poison_reads, data_writes;
    bool slow_status; /* GetStatus answers only after FN_SLOW_STATUS_MS (a busy node) */
    bool hold;        /* FN_HOLD reads are held until the node dies */
    int held_reads;
    int not_owner_left;  /* data reads still to refuse with strata-not-owner (a moved tablet) */
    fn_pending *pending; /* calls answered later (fn_later), finished at the latest by fx_close */
    int drops;           /* DropRowRange calls answered */
    int lists_fail_ms;   /* after the first DropRowRange, ListTablets fails for this long */
    int64_t lists_fail_until_us;
    int lists_failed;
} fake_node;

/* A TCP proxy in front of a node that can start dropping everything silently. */
#define BH_PAIRS_MAX 16
typedef struct bh_proxy bh_proxy;
typedef struct bh_pair {
    bh_proxy *px;
    struct bufferevent *a, *b; /* client side, node side */
} bh_pair;

struct bh_proxy {
    struct event_base *base;
    struct evconnlistener *lis;
    uint16_t port, target;
    bool blackhole;
    bh_pair pairs[BH_PAIRS_MAX];
};

typedef struct fixture {
    struct event_base *base;
    bh_proxy proxy; /* in front of the first cluster's node when fx_open's proxied is set */
    fake_node nodes[FN_CLUSTERS_MAX];
    size_t n_clusters;
    rtr_ctx *r;
    rpc_client *client;
} fixture;

/* ---- the fake node ---- */

static void fn_reply(rpc_call *call, const ProtobufCMessage *m) {
    uint8_t buf[4096];
    size_t len = m ? protobuf_c_message_pack(m, buf) : 0;
    assert_true(len < sizeof buf);
    rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, ST_OK, NULL);
}

static void fn_empty(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    fn_reply(call, NULL);
}

static void fn_later(fake_node *n, rpc_call *call, int ms);

#define FN_HOLD_MS 600000 /* "never": fx_close or the node's death ends the call */

static void fn_get_status(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    fake_node *n = arg;
    if (n->slow_status) { /* queued behind other work: answers after the probe's deadline */
        fn_later(n, call, FN_SLOW_STATUS_MS);
        return;
    }
    Strata__Internal__V1__NodeStatus st;
    strata__internal__v1__node_status__init(&st);
    st.node_num = (uint32_t)n->cluster + 1;
    fn_reply(call, &st.base);
}

static void fn_list_tablets(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    fake_node *n = arg;
    if (st_mono_us() < n->lists_fail_until_us) { /* busy, or a lost connection */
        n->lists_failed++;
        rpc_call_finish(call, ST_UNAVAILABLE, "the node could not list its tablets");
        return;
    }
    Strata__Internal__V1__Tablet t[3], *tp[3];
    const char *names[3] = {RTR_META_TABLE, FN_TABLE, FN_TABLE2};
    size_t k = n->cluster == 1 ? 3 : 2;
    for (size_t i = 0; i < k; i++) {
        strata__internal__v1__tablet__init(&t[i]);
        t[i].id = (uint64_t)n->cluster << 40 | (i + 1);
        t[i].table_name = (char *)names[i];
        tp[i] = &t[i];
    }
    Strata__Internal__V1__ListTabletsResponse resp;
    strata__internal__v1__list_tablets_response__init(&resp);
    resp.n_tablets = k;
    resp.tablets = tp;
    fn_reply(call, &resp.base);
}

static void fn_drop_row_range(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    fake_node *n = arg;
    if (++n->drops == 1 && n->lists_fail_ms)
        n->lists_fail_until_us = st_mono_us() + (int64_t)n->lists_fail_ms * 1000;
    fn_reply(call, NULL);
}

/* One committed row: key, family f, qualifier q, value v. */
static void fn_send_row(rpc_call *call, const char *key, st_slice value) {
    Google__Bigtable__V2__ReadRowsResponse__CellChunk ch, *chp = &ch;
    google__bigtable__v2__read_rows_response__cell_chunk__init(&ch);
    Google__Protobuf__StringValue fam;
    google__protobuf__string_value__init(&fam);
    fam.value = "m";
    Google__Protobuf__BytesValue q;
    google__protobuf__bytes_value__init(&q);
    q.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    ch.row_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    ch.family_name = &fam;
    ch.qualifier = &q;
    ch.value = (ProtobufCBinaryData){value.len, (uint8_t *)value.data};
    ch.row_status_case =
        GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    ch.commit_row = true;
    Google__Bigtable__V2__ReadRowsResponse resp;
    google__bigtable__v2__read_rows_response__init(&resp);
    resp.n_chunks = 1;
    resp.chunks = &chp;
    uint8_t buf[2048];
    size_t len = google__bigtable__v2__read_rows_response__pack(&resp, buf);
    assert_true(len < sizeof buf);
    rpc_call_send(call, st_slice_make(buf, len));
}

static void fn_send_record(rpc_call *call, const char *key, const ProtobufCMessage *m) {
    uint8_t buf[1024];
    size_t len = protobuf_c_message_pack(m, buf);
    assert_true(len < sizeof buf);
    fn_send_row(call, key, st_slice_make(buf, len));
}

/* The metadata: tables t and t2, profile default (single-cluster to c1) and multi. */
static void fn_send_meta(rpc_call *call) {
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.name = FN_TABLE;
    fn_send_record(call, RTR_META_TABLE_PREFIX FN_TABLE, &t.base);
    t.name = FN_TABLE2;
    fn_send_record(call, RTR_META_TABLE_PREFIX FN_TABLE2, &t.base);
    Google__Bigtable__Admin__V2__AppProfile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting single;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&single);
    single.cluster_id = "c1";
    p.name = "projects/p/instances/i/appProfiles/default";
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    p.single_cluster_routing = &single;
    fn_send_record(call, RTR_META_PROFILE_PREFIX "default", &p.base);
    Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny multi;
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__init(&multi);
    p.name = "projects/p/instances/i/appProfiles/multi";
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_MULTI_CLUSTER_ROUTING_USE_ANY;
    p.multi_cluster_routing_use_any = &multi;
    fn_send_record(call, RTR_META_PROFILE_PREFIX "multi", &p.base);
}

static void fn_pending_end(fn_pending *p);

static void fn_die_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    fake_node *n = arg;
    rpc_server_free(n->srv); /* connections close: the router sees them drop */
    n->srv = NULL;
    n->dead = true;
    if (n->dying)
        rpc_call_finish(n->dying, ST_OK, NULL); /* only releases it: it is cancelled */
    n->dying = NULL;
    while (n->pending) /* only releases them: they are cancelled */
        fn_pending_end(n->pending);
}

static void fn_cancelled(rpc_call *call, void *arg) {
    (void)call;
    fake_node *n = arg;
    n->cancels++;
}

struct fn_pending {
    fake_node *n;
    rpc_call *call;
    struct event *ev;
    int rows_left; /* trickle: rows still to send, one per tick */
    fn_pending *prev, *next;
};

static void fn_pending_end(fn_pending *p) {
    rpc_call_finish(p->call, ST_OK, NULL);
    if (p->prev)
        p->prev->next = p->next;
    else
        p->n->pending = p->next;
    if (p->next)
        p->next->prev = p->prev;
    event_free(p->ev);
    free(p);
}

/* Data reads end a little later, so that a router resetting the stream right after the last
 * row is seen doing it (the reset arrives while the call is still open). */
static void fn_finish_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    fn_pending *p = arg;
    if (p->rows_left > 0 && !rpc_call_cancelled(p->call)) {
        char key[16];
        snprintf(key, sizeof key, "t%04d", FN_TRICKLE_ROWS - p->rows_left--);
        fn_send_row(p->call, key, ST_SLICE_LIT("value"));
        struct timeval tv = {0, FN_TRICKLE_MS * 1000};
        evtimer_add(p->ev, &tv);
        return;
    }
    fn_pending_end(p);
}

/* Finishes call after ms (sending the rows_left of a trickle first, one per FN_TRICKLE_MS). */
static fn_pending *fn_later_rows(fake_node *n, rpc_call *call, int ms, int rows) {
    fn_pending *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->n = n;
    p->call = call;
    p->rows_left = rows;
    p->next = n->pending;
    if (n->pending)
        n->pending->prev = p;
    n->pending = p;
    p->ev = evtimer_new(n->base, fn_finish_cb, p);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(p->ev, &tv);
    return p;
}

static void fn_later(fake_node *n, rpc_call *call, int ms) {
    fn_later_rows(n, call, ms, 0);
}

static void fn_read_rows(rpc_call *call, st_slice req, void *arg) {
    fake_node *n = arg;
    Google__Bigtable__V2__ReadRowsRequest *r =
        google__bigtable__v2__read_rows_request__unpack(NULL, req.len, req.data);
    assert_non_null(r);
    bool meta = strcmp(r->table_name, RTR_META_TABLE) == 0;
    int64_t limit = r->rows_limit;
    google__bigtable__v2__read_rows_request__free_unpacked(r, NULL);
    if (meta) {
        fn_send_meta(call);
        rpc_call_finish(call, ST_OK, NULL);
        return;
    }
    if (memmem(req.data, req.len, FN_POISON, strlen(FN_POISON))) {
        n->poison_reads++;
        n->dying = call;
        event_active(n->die_ev, EV_TIMEOUT, 0);
        return;
    }
    n->data_reads++;
    if (n->not_owner_left > 0) {
        n->not_owner_left--;
        rpc_call_finish(call, ST_FAILED_PRECONDITION, ST_NOT_OWNER_PREFIX " the tablet moved");
        return;
    }
    if (n->hold && memmem(req.data, req.len, FN_HOLD, strlen(FN_HOLD))) {
        n->held_reads++;
        fn_later(n, call, FN_HOLD_MS);
        return;
    }
    if (memmem(req.data, req.len, FN_TRICKLE, strlen(FN_TRICKLE))) {
        fn_later_rows(n, call, FN_TRICKLE_MS, FN_TRICKLE_ROWS);
        return;
    }
    rpc_call_set_cancel_cb(call, fn_cancelled, n);
    int64_t rows = limit > 0 ? limit : 10;
    for (int64_t i = 0; i < rows; i++) {
        char key[16];
        snprintf(key, sizeof key, "r%04d", (int)i);
        fn_send_row(call, key, ST_SLICE_LIT("value"));
    }
    fn_later(n, call, 20);
}

/* MutateRows: dies on the poison row (as fn_read_rows), else every entry OK. */
static void fn_mutate_rows(rpc_call *call, st_slice req, void *arg) {
    fake_node *n = arg;
    if (memmem(req.data, req.len, FN_POISON, strlen(FN_POISON))) {
        n->poison_reads++;
        n->dying = call;
        event_active(n->die_ev, EV_TIMEOUT, 0);
        return;
    }
    Google__Bigtable__V2__MutateRowsRequest *r =
        google__bigtable__v2__mutate_rows_request__unpack(NULL, req.len, req.data);
    assert_non_null(r);
    Google__Bigtable__V2__MutateRowsResponse resp;
    google__bigtable__v2__mutate_rows_response__init(&resp);
    Google__Bigtable__V2__MutateRowsResponse__Entry ents[8], *ep[8];
    Google__Rpc__Status ok;
    google__rpc__status__init(&ok);
    assert_true(r->n_entries <= 8);
    for (size_t i = 0; i < r->n_entries; i++) {
        google__bigtable__v2__mutate_rows_response__entry__init(&ents[i]);
        ents[i].index = (int64_t)i;
        ents[i].status = &ok;
        ep[i] = &ents[i];
    }
    resp.entries = ep;
    resp.n_entries = r->n_entries;
    google__bigtable__v2__mutate_rows_request__free_unpacked(r, NULL);
    n->data_writes++;
    fn_reply(call, &resp.base);
}

/* Starts a node listening on port (0: any free one). */
static void fn_start_on(fake_node *n, struct event_base *base, int cluster, uint16_t port) {
    memset(n, 0, sizeof *n);
    n->base = base;
    n->cluster = cluster;
    st_err err = {0};
    n->srv = rpc_server_new(base, NULL, &err);
    assert_non_null(n->srv);
    n->die_ev = event_new(base, -1, 0, fn_die_cb, n);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "ListTablets", fn_list_tablets, n),
                     ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "GetStatus", fn_get_status, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "PutTable", fn_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_NODE "CreateTablet", fn_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_BT "MutateRow", fn_empty, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_BT "ReadRows", fn_read_rows, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_BT "MutateRows", fn_mutate_rows, n), ST_OK);
    assert_int_equal(rpc_server_add_method(n->srv, RTR_TA "DropRowRange", fn_drop_row_range, n),
                     ST_OK);
    assert_int_equal(rpc_server_listen(n->srv, "127.0.0.1", port, &n->port, &err), ST_OK);
}

static void fn_start(fake_node *n, struct event_base *base, int cluster) {
    fn_start_on(n, base, cluster, 0);
}

/* A dead node starts again on its port, with no memory of its past. */
static void fn_restart(fake_node *n) {
    event_free(n->die_ev);
    fn_start_on(n, n->base, n->cluster, n->port);
}

/* ---- the silent proxy ---- */

static void bh_pair_close(bh_pair *pair) {
    if (pair->a)
        bufferevent_free(pair->a);
    if (pair->b)
        bufferevent_free(pair->b);
    pair->a = pair->b = NULL;
}

/* Bytes from one side go to the other, or nowhere once the proxy is a black hole. */
static void bh_read_cb(struct bufferevent *bev, void *arg) {
    bh_pair *pair = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (pair->px->blackhole)
        evbuffer_drain(in, evbuffer_get_length(in));
    else
        bufferevent_write_buffer(bev == pair->a ? pair->b : pair->a, in);
}

static void bh_event_cb(struct bufferevent *bev, short events, void *arg) {
    (void)bev;
    bh_pair *pair = arg;
    if (events & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bh_pair_close(pair);
}

static void bh_accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                         int len, void *arg) {
    (void)lis;
    (void)sa;
    (void)len;
    bh_proxy *px = arg;
    bh_pair *pair = NULL;
    for (size_t i = 0; i < BH_PAIRS_MAX && !pair; i++)
        if (!px->pairs[i].a && !px->pairs[i].b)
            pair = &px->pairs[i];
    assert_non_null(pair);
    pair->px = px;
    pair->a = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
    pair->b = bufferevent_socket_new(px->base, -1, BEV_OPT_CLOSE_ON_FREE);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(px->target)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 2; i++) {
        struct bufferevent *b = i ? pair->b : pair->a;
        bufferevent_setcb(b, bh_read_cb, NULL, bh_event_cb, pair);
        bufferevent_enable(b, EV_READ | EV_WRITE);
    }
    assert_int_equal(bufferevent_socket_connect(pair->b, (struct sockaddr *)&to, sizeof to), 0);
}

static void bh_start(bh_proxy *px, struct event_base *base, uint16_t target) {
    memset(px, 0, sizeof *px);
    px->base = base;
    px->target = target;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    px->lis =
        evconnlistener_new_bind(base, bh_accept_cb, px, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                -1, (struct sockaddr *)&sa, sizeof sa);
    assert_non_null(px->lis);
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    assert_int_equal(getsockname(evconnlistener_get_fd(px->lis), (struct sockaddr *)&bound, &bl),
                     0);
    px->port = ntohs(bound.sin_port);
}

static void bh_stop(bh_proxy *px) {
    if (!px->lis)
        return;
    evconnlistener_free(px->lis);
    for (size_t i = 0; i < BH_PAIRS_MAX; i++)
        bh_pair_close(&px->pairs[i]);
}

/* ---- the fixture: nodes, router, a client ---- */

static void fx_open_with(fixture *fx, size_t n_clusters, bool proxied) {
    memset(fx, 0, sizeof *fx);
    fx->base = event_base_new();
    assert_non_null(fx->base);
    fx->n_clusters = n_clusters;
    char text[1024];
    size_t off = (size_t)snprintf(text, sizeof text, "project = p\ninstance = i\n");
    for (size_t c = 0; c < n_clusters; c++) {
        fn_start(&fx->nodes[c], fx->base, (int)c);
        uint16_t port = fx->nodes[c].port;
        if (proxied && c == 0) {
            bh_start(&fx->proxy, fx->base, port);
            port = fx->proxy.port;
        }
        off += (size_t)snprintf(text + off, sizeof text - off,
                                "[cluster c%zu]\nzone = z%zu\nnode = 127.0.0.1:%u\n", c + 1, c + 1,
                                port);
    }
    st_topology topo;
    st_err err = {0};
    assert_int_equal(st_topology_parse(text, strlen(text), "test", &topo, &err), ST_OK);
    rtr_opts o;
    rtr_opts_default(&o);
    o.topo = &topo;
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.balance = RTR_BALANCE_OFF;
    o.no_unix = true;
    o.probe_ms = 100;
    assert_int_equal(rtr_open(fx->base, &o, &fx->r, &err), ST_OK);
    fx->client = rpc_client_new(fx->base, "127.0.0.1", rtr_port(fx->r), NULL, &err);
    assert_non_null(fx->client);
}

static void fx_open(fixture *fx, size_t n_clusters) {
    fx_open_with(fx, n_clusters, false);
}

static void fx_close(fixture *fx) {
    rpc_client_free(fx->client);
    rtr_close(fx->r);
    bh_stop(&fx->proxy);
    for (size_t c = 0; c < fx->n_clusters; c++) {
        while (fx->nodes[c].pending)
            fn_pending_end(fx->nodes[c].pending);
        if (fx->nodes[c].srv)
            rpc_server_free(fx->nodes[c].srv);
        event_free(fx->nodes[c].die_ev);
    }
    for (int i = 0; i < 10; i++)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    event_base_free(fx->base);
}

/* Runs the loop for about ms milliseconds. */
static void fx_run_ms(fixture *fx, int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_base_loopexit(fx->base, &tv);
    event_base_dispatch(fx->base);
}

typedef struct read_res {
    bool done;
    st_code code;
    char msg[RPC_GRPC_MESSAGE_MAX];
    int messages;
} read_res;

static void rd_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    (void)msg;
    ((read_res *)arg)->messages++;
}

static void rd_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    read_res *r = arg;
    r->done = true;
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", message ? message : "");
}

/* Starts a ReadRows of table through the router: one row key (row non-NULL) or every row, with
 * rows_limit limit (0: none). */
static void fx_read_start(fixture *fx, const char *table, const char *profile, const char *row,
                          int64_t limit, read_res *res) {
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.rows_limit = limit;
    Google__Bigtable__V2__RowSet set;
    ProtobufCBinaryData key = {row ? strlen(row) : 0, (uint8_t *)row};
    google__bigtable__v2__row_set__init(&set);
    if (row) {
        set.n_row_keys = 1;
        set.row_keys = &key;
        req.rows = &set;
    }
    uint8_t buf[512];
    size_t len = google__bigtable__v2__read_rows_request__pack(&req, buf);
    memset(res, 0, sizeof *res);
    assert_non_null(rpc_client_call(fx->client, RTR_BT "ReadRows", st_slice_make(buf, len), NULL, 0,
                                    20000, rd_msg, rd_done, res));
}

static void fx_wait(fixture *fx, read_res *res, size_t n) {
    for (;;) {
        size_t done = 0;
        for (size_t i = 0; i < n; i++)
            done += res[i].done;
        if (done == n)
            return;
        event_base_loop(fx->base, EVLOOP_ONCE);
    }
}

static void fx_read(fixture *fx, const char *table, const char *profile, const char *row,
                    int64_t limit, read_res *res) {
    fx_read_start(fx, table, profile, row, limit, res);
    fx_wait(fx, res, 1);
}

/* The first failed entry of a MutateRows answer replaces an OK call status in res. */
static void mrs_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    read_res *res = arg;
    Google__Bigtable__V2__MutateRowsResponse *r =
        google__bigtable__v2__mutate_rows_response__unpack(NULL, msg.len, msg.data);
    assert_non_null(r);
    for (size_t i = 0; i < r->n_entries && res->code == ST_OK; i++)
        if (r->entries[i]->status && r->entries[i]->status->code != 0) {
            res->code = (st_code)r->entries[i]->status->code;
            snprintf(res->msg, sizeof res->msg, "%s", r->entries[i]->status->message);
        }
    google__bigtable__v2__mutate_rows_response__free_unpacked(r, NULL);
}

static void mrs_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    read_res *res = arg;
    if (res->code == ST_OK || code != ST_OK)
        rd_done(call, code, message, arg);
    res->done = true;
}

/* A MutateRows of one entry, row row (SetCell cf:c at an explicit timestamp), through profile. */
static void fx_mutate_rows(fixture *fx, const char *profile, const char *row, read_res *res) {
    Google__Bigtable__V2__Mutation__SetCell set;
    google__bigtable__v2__mutation__set_cell__init(&set);
    set.family_name = (char *)"cf";
    set.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    set.timestamp_micros = 1000;
    Google__Bigtable__V2__Mutation m, *mp[1] = {&m};
    google__bigtable__v2__mutation__init(&m);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &set;
    Google__Bigtable__V2__MutateRowsRequest__Entry e, *ep[1] = {&e};
    google__bigtable__v2__mutate_rows_request__entry__init(&e);
    e.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    e.mutations = mp;
    e.n_mutations = 1;
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)FN_TABLE;
    req.app_profile_id = (char *)profile;
    req.entries = ep;
    req.n_entries = 1;
    uint8_t buf[512];
    size_t len = google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    memset(res, 0, sizeof *res);
    assert_non_null(rpc_client_call(fx->client, RTR_BT "MutateRows", st_slice_make(buf, len), NULL,
                                    0, 20000, mrs_msg, mrs_done, res));
    fx_wait(fx, res, 1);
}

/* A whole-table DropRowRange through the router. */
static void fx_drop_all(fixture *fx, read_res *res) {
    Google__Bigtable__Admin__V2__DropRowRangeRequest req;
    google__bigtable__admin__v2__drop_row_range_request__init(&req);
    req.name = (char *)FN_TABLE;
    req.target_case =
        GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_DELETE_ALL_DATA_FROM_TABLE;
    req.delete_all_data_from_table = true;
    uint8_t buf[512];
    size_t len = google__bigtable__admin__v2__drop_row_range_request__pack(&req, buf);
    memset(res, 0, sizeof *res);
    assert_non_null(rpc_client_call(fx->client, RTR_TA "DropRowRange", st_slice_make(buf, len),
                                    NULL, 0, 60000, rd_msg, rd_done, res));
    fx_wait(fx, res, 1);
}

/* ---- tests ---- */

/* After the nodes dropped the rows, the router checks that the table's tablets are still those
 * it sent the drop to (a move meanwhile would carry old rows to a node not asked). A node whose
 * ListTablets fails then is not taken at its old word: the drop is sent again once it lists its
 * tablets (the first case), and fails UNAVAILABLE when it never does (the second). */
static void test_fake_node_drop_waits_for_a_confirmed_map(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    fx.nodes[0].lists_fail_ms = 300;
    read_res res;
    fx_drop_all(&fx, &res);
    assert_int_equal(res.code, ST_OK);
    assert_true(fx.nodes[0].lists_failed > 0); /* the check did meet a failed listing */
    assert_true(fx.nodes[0].drops >= 2);       /* and sent the drop again after it */
    fx_close(&fx);

    fx_open(&fx, 1);
    fx.nodes[0].lists_fail_ms = 600000;
    fx_drop_all(&fx, &res);
    assert_int_equal(res.code, ST_UNAVAILABLE);
    assert_non_null(strstr(res.msg, "did not list them"));
    fx_close(&fx);
}

static void test_fake_node_rows_limit_never_resets_node_streams(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    enum { BATCH = 16, ROUNDS = 8 };
    read_res res[BATCH];
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < BATCH; i++)
            fx_read_start(&fx, FN_TABLE, "", NULL, 5, &res[i]);
        fx_wait(&fx, res, BATCH);
        for (int i = 0; i < BATCH; i++) {
            assert_int_equal(res[i].code, ST_OK);
            assert_int_equal(res[i].messages, 5);
        }
    }
    assert_int_equal(fx.nodes[0].data_reads, BATCH * ROUNDS);
    assert_int_equal(fx.nodes[0].cancels, 0); /* every node stream ended by itself */
    fx_close(&fx);
}

/* A limited read that a node refused once with strata-not-owner (its tablet moved), and that
 * the retry then brought to its limit, ends OK: the refusal of the earlier try is not its
 * outcome. */
static void test_fake_node_rows_limit_after_not_owner_ends_ok(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    fx.nodes[0].not_owner_left = 1;
    read_res res;
    fx_read(&fx, FN_TABLE, "", NULL, 5, &res);
    assert_int_equal(fx.nodes[0].not_owner_left, 0); /* the refusal did happen */
    assert_int_equal(res.code, ST_OK);
    assert_int_equal(res.messages, 5);
    fx_close(&fx);
}

/* Until a default-profile read (cluster c1) is served again after node 0 came back. */
static void fx_wait_c1_back(fixture *fx) {
    read_res again = {.code = ST_UNAVAILABLE};
    while (again.code != ST_OK) {
        fx_run_ms(fx, 50);
        fx_read(fx, FN_TABLE, "", "r0001", 0, &again);
    }
}

/* A query of death moves on once, like any request whose node dropped it, and then goes nowhere
 * else: it costs two nodes, not every cluster. */
static void test_fake_node_query_of_death_does_not_spread(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 2);
    read_res res;
    fx_read(&fx, FN_TABLE, "multi", FN_POISON, 0, &res);
    assert_int_equal(res.code, ST_INTERNAL);
    assert_non_null(strstr(res.msg, "query of death"));
    assert_true(fx.nodes[0].dead); /* the first cluster tried died, the request moved on once */
    assert_true(fx.nodes[1].dead);
    assert_int_equal(fx.nodes[1].poison_reads, 1);
    fn_restart(&fx.nodes[0]);
    fn_restart(&fx.nodes[1]);
    fx_wait_c1_back(&fx);
    /* The client retries: refused at once, naming the reason; nothing else is. */
    fx_read(&fx, FN_TABLE, "multi", FN_POISON, 0, &res);
    assert_int_equal(res.code, ST_INTERNAL);
    assert_non_null(strstr(res.msg, "query of death"));
    assert_int_equal(fx.nodes[0].poison_reads + fx.nodes[1].poison_reads, 0);
    fx_read(&fx, FN_TABLE, "multi", "r0001", 0, &res);
    assert_int_equal(res.code, ST_OK);
    fx_close(&fx);
}

/* The same guard for MutateRows: the entries of a node call dropped twice go nowhere else. */
static void test_fake_node_mutate_rows_query_of_death_does_not_spread(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 2);
    read_res res;
    fx_mutate_rows(&fx, "multi", FN_POISON, &res);
    assert_int_equal(res.code, ST_INTERNAL);
    assert_non_null(strstr(res.msg, "query of death"));
    assert_true(fx.nodes[0].dead);
    assert_true(fx.nodes[1].dead);
    assert_int_equal(fx.nodes[1].poison_reads, 1);
    fn_restart(&fx.nodes[0]);
    fn_restart(&fx.nodes[1]);
    fx_wait_c1_back(&fx);
    fx_mutate_rows(&fx, "multi", FN_POISON, &res); /* the client retries: refused at once */
    assert_int_equal(res.code, ST_INTERNAL);
    assert_non_null(strstr(res.msg, "query of death"));
    assert_int_equal(fx.nodes[0].poison_reads + fx.nodes[1].poison_reads, 0);
    fx_mutate_rows(&fx, "multi", "r0001", &res); /* other writes are served */
    assert_int_equal(res.code, ST_OK);
    fx_close(&fx);
}

/* A node killed while it serves one request alone (an operator's kill -9, chaos at light load)
 * looks like a query of death to the router, but the request is served elsewhere and the
 * evidence is dropped: killed under the same request again and again, it is served every time.
 * It used to end INTERNAL and be refused for 30 s. */
static void test_fake_node_killed_under_one_request(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 2);
    for (int kill = 0; kill < 3; kill++) {
        read_res res;
        fx.nodes[0].hold = true;
        int held = fx.nodes[0].held_reads;
        fx_read_start(&fx, FN_TABLE, "multi", FN_HOLD, 0, &res);
        while (fx.nodes[0].held_reads == held)
            event_base_loop(fx.base, EVLOOP_ONCE);
        fn_die_cb(-1, 0, &fx.nodes[0]); /* killed with the one read in flight */
        int served = fx.nodes[1].data_reads;
        fx_wait(&fx, &res, 1);
        assert_int_equal(res.code, ST_OK); /* served by the other cluster */
        assert_int_equal(res.messages, 10);
        assert_int_equal(fx.nodes[1].data_reads, served + 1);
        fn_restart(&fx.nodes[0]);
        int before = fx.nodes[0].data_reads;
        while (fx.nodes[0].data_reads == before) { /* until multi-cluster plans start at c1 */
            fx_run_ms(&fx, 50);
            fx_read(&fx, FN_TABLE, "multi", "r0001", 0, &res);
        }
    }
    fx_close(&fx);
}

static void test_fake_node_dead_cluster_fails_fast(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 2);
    read_res res;
    fx_read(&fx, FN_TABLE, "", "r0001", 0, &res); /* default: single-cluster to c1 */
    assert_int_equal(res.code, ST_OK);
    fn_die_cb(-1, 0, &fx.nodes[0]);
    fx_run_ms(&fx, 300); /* a few probes see it gone */
    fx_read(&fx, FN_TABLE, "", "r0001", 0, &res);
    assert_int_equal(res.code, ST_UNAVAILABLE);
    assert_non_null(strstr(res.msg, "cluster c1 has no reachable node"));
    fx_close(&fx);
}

/* Identical reads lost together in one node crash are one drop, among other calls: not a query
 * of death. Once the node is back, the same request is served. */
static void test_fake_node_hot_request_survives_a_crash(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    enum { N = 4 };
    read_res res[N];
    fx.nodes[0].hold = true;
    for (int i = 0; i < N; i++)
        fx_read_start(&fx, FN_TABLE, "", FN_HOLD, 0, &res[i]);
    while (fx.nodes[0].held_reads < N)
        event_base_loop(fx.base, EVLOOP_ONCE);
    fn_die_cb(-1, 0, &fx.nodes[0]); /* one crash takes the N identical calls */
    fx_wait(&fx, res, N);
    for (int i = 0; i < N; i++)
        assert_int_not_equal(res[i].code, ST_OK);
    fn_restart(&fx.nodes[0]);
    read_res again = {.code = ST_UNAVAILABLE};
    while (again.code == ST_UNAVAILABLE) { /* until the probes see the node back */
        fx_run_ms(&fx, 50);
        fx_read(&fx, FN_TABLE, "", FN_HOLD, 0, &again);
    }
    assert_int_equal(again.code, ST_OK);
    assert_int_equal(again.messages, 10);
    fx_close(&fx);
}

static void test_fake_node_table_without_tablets_in_cluster(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 2);
    read_res res;
    fx_read(&fx, FN_TABLE2, "", NULL, 0, &res); /* default: c1, where t2 has no tablet */
    assert_int_equal(res.code, ST_FAILED_PRECONDITION);
    assert_non_null(strstr(res.msg, "has no tablets in cluster c1"));
    fx_read(&fx, FN_TABLE2, "multi", NULL, 0, &res); /* c2 holds it */
    assert_int_equal(res.code, ST_OK);
    fx_close(&fx);
}

typedef struct call_res {
    bool done;
    st_code code;
    char msg[RPC_GRPC_MESSAGE_MAX];
} call_res;

static void cr_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    call_res *r = arg;
    r->done = true;
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", message ? message : "");
}

static void test_fake_node_keepalive_fails_a_silent_connection(void **state) {
    (void)state;
    fixture fx;
    fx_open_with(&fx, 1, true);
    st_err err = {0};
    rpc_client_opts o = {.keepalive_ms = 100, .keepalive_timeout_ms = 300};
    rpc_client *c = rpc_client_new(fx.base, "127.0.0.1", fx.proxy.port, &o, &err);
    assert_non_null(c);
    call_res res = {0};
    assert_non_null(rpc_client_call(c, RTR_NODE "GetStatus", ST_SLICE_LIT(""), NULL, 0, 60000, NULL,
                                    cr_done, &res));
    while (!res.done)
        event_base_loop(fx.base, EVLOOP_ONCE);
    assert_int_equal(res.code, ST_OK);
    fx.proxy.blackhole = true; /* from now on the node never answers, nor closes */
    res = (call_res){0};
    assert_non_null(rpc_client_call(c, RTR_NODE "GetStatus", ST_SLICE_LIT(""), NULL, 0, 60000, NULL,
                                    cr_done, &res));
    while (!res.done)
        event_base_loop(fx.base, EVLOOP_ONCE);
    assert_int_equal(res.code, ST_UNAVAILABLE); /* not DEADLINE_EXCEEDED after 60 s */
    assert_non_null(strstr(res.msg, "keepalive"));
    assert_false(rpc_client_alive(c));
    rpc_client_free(c);
    fx_close(&fx);
}

static void test_fake_node_silent_cluster_moves_multi_reads(void **state) {
    (void)state;
    fixture fx;
    fx_open_with(&fx, 2, true);
    read_res res;
    fx_read(&fx, FN_TABLE, "multi", "r0001", 0, &res);
    assert_int_equal(res.code, ST_OK);
    assert_int_equal(fx.nodes[0].data_reads, 1); /* c1 first */
    fx.proxy.blackhole = true;
    fx_read(&fx, FN_TABLE, "multi", "r0002", 0, &res);
    assert_int_equal(res.code, ST_OK);
    assert_int_equal(fx.nodes[1].data_reads, 1); /* served by c2 */
    /* Moved when c1's link went silent (0.5 s), or when its probe failed (1 s), whichever came
     * first: either way c1 is now behind healthy clusters in multi-cluster plans. */
    assert_false(rtr_cluster_healthy(&fx.r->clusters[0]));
    assert_true(rtr_health_cluster_silent(fx.r, 0)); /* probes still open on the dead link */
    fx_close(&fx);
}

static void test_fake_node_busy_node_stays_up(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    fx.nodes[0].slow_status = true; /* every probe now misses its 1 s deadline ... */
    read_res res;
    fx_read(&fx, FN_TABLE, "", FN_TRICKLE, 0, &res); /* ... while a read streams for 3 s */
    assert_int_equal(res.code, ST_OK);
    assert_int_equal(res.messages, FN_TRICKLE_ROWS);
    assert_true(rtr_health_cluster_up(fx.r, 0));
    assert_int_equal(fx.r->fo->clusters[0].changes, 0); /* never marked down */
    fx_close(&fx);
}

static void ignore_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)code;
    (void)message;
    (*(int *)arg)--;
}

static void test_fake_node_goaway_drains_the_connection(void **state) {
    (void)state;
    fixture fx;
    fx_open(&fx, 1);
    fx.nodes[0].slow_status = true;
    st_err err = {0};
    rpc_client *c = rpc_client_new(fx.base, "127.0.0.1", fx.nodes[0].port, NULL, &err);
    assert_non_null(c);
    read_res trickle = {0};
    uint8_t buf[256];
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = FN_TABLE;
    Google__Bigtable__V2__RowSet set;
    google__bigtable__v2__row_set__init(&set);
    ProtobufCBinaryData key = {strlen(FN_TRICKLE), (uint8_t *)FN_TRICKLE};
    set.n_row_keys = 1;
    set.row_keys = &key;
    req.rows = &set;
    size_t len = google__bigtable__v2__read_rows_request__pack(&req, buf);
    assert_non_null(rpc_client_call(c, RTR_BT "ReadRows", st_slice_make(buf, len), NULL, 0, 20000,
                                    rd_msg, rd_done, &trickle));
    /* Resets, many and fast: the node's HTTP/2 layer answers GOAWAY (nghttp2's stream-reset
     * protection: a burst of 1000, then 33/s). */
    int open = 0;
    for (int i = 0; i < 1500 && rpc_client_alive(c); i++) {
        rpc_ccall *k = rpc_client_call(c, RTR_NODE "GetStatus", ST_SLICE_LIT(""), NULL, 0, 20000,
                                       NULL, ignore_done, &open);
        assert_non_null(k);
        open++;
        event_base_loop(fx.base, EVLOOP_NONBLOCK);
        rpc_ccall_cancel(k);
        event_base_loop(fx.base, EVLOOP_NONBLOCK);
    }
    while (open > 0 || !trickle.done)
        event_base_loop(fx.base, EVLOOP_ONCE);
    if (rpc_client_alive(c)) { /* this nghttp2 has no reset limit: nothing to check */
        rpc_client_free(c);
        fx_close(&fx);
        skip();
    }
    assert_false(rpc_client_alive(c)); /* new calls go to a new connection ... */
    assert_null(rpc_client_call(c, RTR_NODE "GetStatus", ST_SLICE_LIT(""), NULL, 0, 1000, NULL,
                                ignore_done, &open));
    assert_int_equal(trickle.code, ST_OK); /* ... while the accepted ones finish */
    assert_int_equal(trickle.messages, FN_TRICKLE_ROWS);
    rpc_client_free(c);
    fx_close(&fx);
}

/* Counts "client connection failed" lines and keeps the last one. */
typedef struct log_watch {
    int lines;
    char last[512];
} log_watch;

static void watch_sink(st_log_level level, const char *module, const char *line, void *arg) {
    (void)level;
    (void)module;
    log_watch *w = arg;
    if (strstr(line, "client connection failed")) {
        w->lines++;
        snprintf(w->last, sizeof w->last, "%s", line);
    }
}

static void test_fake_node_connection_failures_logged_once_per_peer(void **state) {
    (void)state;
    struct event_base *base = event_base_new();
    st_err err = {0};
    rpc_server *srv = rpc_server_new(base, NULL, &err); /* a port nobody listens on afterwards */
    uint16_t port = 0;
    assert_int_equal(rpc_server_listen(srv, "127.0.0.1", 0, &port, &err), ST_OK);
    rpc_server_free(srv);
    log_watch w = {0};
    st_log_set_level(ST_LOG_INFO);
    st_log_set_sink(watch_sink, &w);
    for (int i = 0; i < 5; i++) { /* an owner redialling a dead node */
        rpc_client *c = rpc_client_new(base, "127.0.0.1", port, NULL, &err);
        assert_non_null(c);
        call_res res = {0};
        assert_non_null(rpc_client_call(c, RTR_NODE "GetStatus", ST_SLICE_LIT(""), NULL, 0, 10000,
                                        NULL, cr_done, &res));
        while (!res.done)
            event_base_loop(base, EVLOOP_ONCE);
        assert_int_equal(res.code, ST_UNAVAILABLE);
        rpc_client_free(c);
    }
    st_log_set_sink(NULL, NULL);
    st_log_set_level(ST_LOG_WARN);
    assert_int_equal(w.lines, 1); /* not one per dial */
    char peer[64];
    snprintf(peer, sizeof peer, "peer=127.0.0.1:%u", port);
    assert_non_null(strstr(w.last, peer));
    assert_non_null(strstr(w.last, "Connection refused"));
    assert_null(strstr(w.last, "TLS"));
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
}

int main(void) {
    st_log_set_level(ST_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_node_drop_waits_for_a_confirmed_map),
        cmocka_unit_test(test_fake_node_rows_limit_never_resets_node_streams),
        cmocka_unit_test(test_fake_node_rows_limit_after_not_owner_ends_ok),
        cmocka_unit_test(test_fake_node_query_of_death_does_not_spread),
        cmocka_unit_test(test_fake_node_mutate_rows_query_of_death_does_not_spread),
        cmocka_unit_test(test_fake_node_killed_under_one_request),
        cmocka_unit_test(test_fake_node_dead_cluster_fails_fast),
        cmocka_unit_test(test_fake_node_hot_request_survives_a_crash),
        cmocka_unit_test(test_fake_node_table_without_tablets_in_cluster),
        cmocka_unit_test(test_fake_node_keepalive_fails_a_silent_connection),
        cmocka_unit_test(test_fake_node_silent_cluster_moves_multi_reads),
        cmocka_unit_test(test_fake_node_busy_node_stays_up),
        cmocka_unit_test(test_fake_node_goaway_drains_the_connection),
        cmocka_unit_test(test_fake_node_connection_failures_logged_once_per_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
