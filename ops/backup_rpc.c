/* ops/backup_rpc.c — gRPC calls of `strata backup` on a kept connection (backup_cli.h): an
 * export or import makes one call per MiB to the same node, so a connection per call (as
 * rpc_blocking_unary does) would cost a handshake per MiB. */
#include <ctype.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backup_cli.h"
#include "certs.h"
#include "strata/btutil.h"
#include "strata/rpc.h"

typedef struct bk_wait {
    struct event_base *base;
    bool done;
    st_code code;
    char msg[ST_ERR_MSG_MAX];
    st_buf resp;
    uint64_t messages;
    bool (*on_msg)(st_slice msg, void *arg, st_err *err);
    void *arg;
    st_err cb_err; /* what on_msg said when it stopped the call */
    bool stopped;
    bool lost; /* failed after its request was sent, with no answer (rpc_ccall_answered) */
} bk_wait;

rpc_client *bk_conn_client(const bk_conn *k, const char *host, uint16_t port, st_err *err) {
    rpc_client_opts o;
    memset(&o, 0, sizeof o);
    if (k->opts)
        o = *k->opts;
    if (!k->router) /* a node streams an export's files: see BK_NODE_STREAM_WINDOW */
        o.stream_window_bytes = BK_NODE_STREAM_WINDOW;
    return rpc_client_new(k->base, host, port, &o, err);
}

static st_code conn_open(bk_conn *k, const char *addr, bool router, st_err *err) {
    memset(k, 0, sizeof *k);
    snprintf(k->addr, sizeof k->addr, "%s", addr);
    k->router = router;
    k->opts = router ? ops_secure_router_opts() : ops_secure_node_opts(addr);
    k->md = router ? ops_secure_md(&k->n_md) : NULL;
    char host[256];
    uint16_t port = 0;
    if (!st_addr_split(addr, host, sizeof host, &port) || port == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "bad address '%s': want HOST:PORT", addr);
    k->base = event_base_new();
    if (!k->base)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot create an event loop");
    k->client = bk_conn_client(k, host, port, err);
    if (!k->client) {
        event_base_free(k->base);
        k->base = NULL;
        return err ? err->code : ST_UNAVAILABLE;
    }
    return ST_OK;
}

st_code bk_conn_open(bk_conn *k, const char *addr, st_err *err) {
    return conn_open(k, addr, false, err);
}

st_code bk_conn_open_router(bk_conn *k, const char *addr, st_err *err) {
    return conn_open(k, addr, true, err);
}

void bk_conn_close(bk_conn *k) {
    if (k->client)
        rpc_client_free(k->client);
    if (k->base) {
        event_base_loop(k->base, EVLOOP_NONBLOCK);
        event_base_free(k->base);
    }
    k->client = NULL;
    k->base = NULL;
}

static void wait_msg(rpc_ccall *call, st_slice msg, void *arg) {
    bk_wait *w = arg;
    w->messages++;
    if (w->on_msg) {
        if (!w->stopped && !w->on_msg(msg, w->arg, &w->cb_err)) {
            w->stopped = true;
            rpc_ccall_cancel(call);
        }
    } else if (w->messages == 1 && st_buf_append(&w->resp, msg.data, msg.len) != ST_OK) {
        w->messages = UINT64_MAX;
    }
}

static void wait_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    bk_wait *w = arg;
    w->done = true;
    w->code = code;
    w->lost =
        code != ST_OK && !w->stopped && !rpc_ccall_unprocessed(call) && !rpc_ccall_answered(call);
    snprintf(w->msg, sizeof w->msg, "%s", message ? message : "");
    event_base_loopbreak(w->base);
}

bool bk_tls_refused(st_code code, const char *msg) {
    /* the rpc layer's "TLS handshake failed: ...", or under TLS 1.3, where the client's side of
     * the handshake ends before the server has checked the client's certificate, "TLS error:
     * ... alert ..." (the server's refusal arriving as an alert) */
    return code == ST_UNAVAILABLE && msg &&
           (strstr(msg, "TLS handshake failed") ||
            (strstr(msg, "TLS error") && strstr(msg, " alert ")));
}

/* OpenSSL's reason in the rpc layer's message: "error:0A00045C:SSL routines::tlsv13 alert
 * certificate required: <the fix for a node or router>" gives "tlsv13 alert certificate
 * required", without the fix, which names flags of strata-node and strata-router; the whole
 * message when it holds no OpenSSL error. */
static void tls_reason(const char *msg, char *out, size_t cap) {
    const char *p = strstr(msg, "error:");
    while (p && !isxdigit((unsigned char)p[6])) /* "TLS error: error:0A000418:..." */
        p = strstr(p + 1, "error:");
    for (int i = 0; p && i < 4; i++) { /* past "error:CODE:LIBRARY:FUNCTION:" */
        p = strchr(p, ':');
        if (p)
            p++;
    }
    if (p)
        snprintf(out, cap, "%.*s", (int)strcspn(p, ":"), p);
    else
        snprintf(out, cap, "%s", msg);
}

st_code bk_node_refused(const char *what, const char *addr, const char *msg, const char *flag,
                        st_err *err) {
    char reason[256];
    tls_reason(msg, reason, sizeof reason);
    return st_err_set(err, ST_UNAVAILABLE,
                      "%s at %s: the TLS handshake with the node failed (%s): %s", what, addr,
                      reason, ops_secure_node_refused(flag));
}

/* " (what to do)" about a failed router call that credentials or a stopped router explain, ""
 * otherwise (ops_router_hint). Valid until the next call. */
static const char *router_hint(const bk_conn *k, st_code code, const char *msg) {
    static char out[ST_ERR_MSG_MAX];
    const char *h = ops_router_hint(code, msg, k->opts && k->opts->ssl_ctx, k->n_md > 0);
    if (!h[0])
        return "";
    snprintf(out, sizeof out, " (%s)", h);
    return out;
}

/* Starts the call (reconnecting once if the connection died) and runs the loop until it ends. */
static st_code run_call(bk_conn *k, const char *method, st_slice req, int64_t timeout_ms,
                        bk_wait *w, st_err *err) {
    if (!rpc_client_alive(k->client)) {
        char addr[512];
        snprintf(addr, sizeof addr, "%s", k->addr);
        bool router = k->router;
        bk_conn_close(k);
        st_code rc = conn_open(k, addr, router, err);
        if (rc != ST_OK)
            return rc;
    }
    w->base = k->base;
    k->lost = false;
    if (!rpc_client_call(k->client, method, req, k->md, k->n_md, timeout_ms, wait_msg, wait_done,
                         w))
        return st_err_set(err, ST_UNAVAILABLE, "%s at %s: cannot start the call", method, k->addr);
    while (!w->done && event_base_dispatch(k->base) == 0)
        ;
    k->lost = w->lost;
    if (w->stopped)
        return st_err_set(err, w->cb_err.code, "%s", w->cb_err.msg);
    if (w->code != ST_OK && !k->router && k->opts && bk_tls_refused(w->code, w->msg))
        return bk_node_refused(bk_leaf(method), k->addr, w->msg, "--dir DIR", err);
    if (w->code != ST_OK)
        return st_err_set(err, w->code, "%s at %s: %s: %s%s", bk_leaf(method), k->addr,
                          st_code_name(w->code), w->msg,
                          k->router ? router_hint(k, w->code, w->msg) : "");
    return ST_OK;
}

static st_code pack(const ProtobufCMessage *req, st_buf *out, st_err *err) {
    size_t len = protobuf_c_message_get_packed_size(req);
    st_buf_init(out);
    if (st_buf_reserve(out, len + 1) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory packing a request");
    out->len = protobuf_c_message_pack(req, out->data);
    return ST_OK;
}

st_code bk_conn_call(bk_conn *k, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                     int64_t timeout_ms, st_err *err) {
    st_buf packed;
    bk_wait w;
    memset(&w, 0, sizeof w);
    st_buf_init(&w.resp);
    if (resp)
        *resp = NULL;
    st_code rc = pack(req, &packed, err);
    if (rc == ST_OK)
        rc = run_call(k, method, st_buf_slice(&packed), timeout_ms, &w, err);
    if (rc == ST_OK && w.messages != 1)
        rc = st_err_set(err, ST_INTERNAL, "%s at %s: answered %llu messages, not one",
                        bk_leaf(method), k->addr, (unsigned long long)w.messages);
    if (rc == ST_OK && resp_desc) {
        *resp = btu_pb_unpack(resp_desc, NULL, st_buf_slice(&w.resp), err);
        if (!*resp)
            rc = st_err_set(err, ST_INTERNAL, "%s at %s: the answer does not parse",
                            bk_leaf(method), k->addr);
    }
    st_buf_free(&packed);
    st_buf_free(&w.resp);
    return rc;
}

st_code bk_conn_stream(bk_conn *k, const char *method, const ProtobufCMessage *req,
                       bool (*on_msg)(st_slice msg, void *arg, st_err *err), void *arg,
                       int64_t timeout_ms, st_err *err) {
    st_buf packed;
    bk_wait w;
    memset(&w, 0, sizeof w);
    st_buf_init(&w.resp);
    w.on_msg = on_msg;
    w.arg = arg;
    st_code rc = pack(req, &packed, err);
    if (rc == ST_OK)
        rc = run_call(k, method, st_buf_slice(&packed), timeout_ms, &w, err);
    st_buf_free(&packed);
    return rc;
}

/* Whether a router method changes something (create, copy, restore, delete, update, import):
 * a lost answer leaves its outcome open, unlike a read's, which changed nothing. */
static bool changes_state(const char *method) {
    const char *m = bk_leaf(method);
    return strncmp(m, "Get", 3) != 0 && strncmp(m, "List", 4) != 0 &&
           strncmp(m, "Describe", 8) != 0;
}

st_code bk_router_call(const bk_ctx *c, const char *method, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                       st_err *err) {
    bk_conn k;
    st_code rc = bk_conn_open_router(&k, c->addr, err);
    if (rc == ST_OK)
        rc = bk_conn_call(&k, method, req, resp_desc, resp, BK_ADMIN_TIMEOUT_MS, err);
    if (rc != ST_OK && k.lost && changes_state(method)) {
        char what[1024];
        snprintf(what, sizeof what,
                 "outcome unknown: %s was sent to the router at %s, which did not answer, so "
                 "whether it was carried out is not known (the router may carry it out later)",
                 bk_leaf(method), c->addr);
        bk_say_unknown(c, what);
    }
    bk_conn_close(&k);
    return rc;
}
