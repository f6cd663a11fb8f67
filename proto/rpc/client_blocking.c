/* Blocking gRPC helpers for tests and command-line tools: one call on an rpc_client (client.c)
 * over an event_base of their own, run until the call ends. */
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

/* ---- blocking helpers ---- */

typedef struct blocking_ctx {
    struct event_base *base;
    void (*on_msg)(st_slice msg, void *arg);
    void *arg;
    st_buf *resp;
    uint64_t messages;
    bool done;
    st_code code;
    char message[RPC_GRPC_MESSAGE_MAX];
} blocking_ctx;

static void blocking_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    blocking_ctx *b = arg;
    b->messages++;
    if (b->on_msg)
        b->on_msg(msg, b->arg);
    if (b->resp && b->messages == 1 && st_buf_append(b->resp, msg.data, msg.len) != ST_OK)
        b->messages = UINT64_MAX;
}

static void blocking_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    blocking_ctx *b = arg;
    b->done = true;
    b->code = code;
    snprintf(b->message, sizeof(b->message), "%s", message);
    event_base_loopbreak(b->base);
}

static st_code blocking_run(const char *addr, const rpc_client_opts *opts, const char *path,
                            st_slice request, const rpc_metadata *md, size_t md_count,
                            int64_t timeout_ms, blocking_ctx *b, st_err *status) {
    char host[256];
    uint16_t port = 0;
    bool is_unix = strncmp(addr, RPC_UNIX_PREFIX, strlen(RPC_UNIX_PREFIX)) == 0;
    if (!is_unix && (!st_addr_split(addr, host, sizeof(host), &port) || port == 0))
        return st_err_set(status, ST_INVALID_ARGUMENT,
                          "bad address %s (want host:port or " RPC_UNIX_PREFIX "PATH)", addr);
    b->base = event_base_new();
    if (!b->base)
        return st_err_set(status, ST_RESOURCE_EXHAUSTED, "cannot create an event_base");
    rpc_client *c = is_unix
                        ? rpc_client_new_unix(b->base, addr + strlen(RPC_UNIX_PREFIX), opts, status)
                        : rpc_client_new(b->base, host, port, opts, status);
    if (!c) {
        event_base_free(b->base);
        return status ? status->code : ST_UNAVAILABLE;
    }
    if (!rpc_client_call(c, path, request, md, md_count, timeout_ms, blocking_msg, blocking_done,
                         b)) {
        b->done = true;
        b->code = rpc_client_alive(c) ? ST_RESOURCE_EXHAUSTED : ST_UNAVAILABLE;
        snprintf(b->message, sizeof(b->message), "cannot start the call");
    }
    while (!b->done && event_base_dispatch(b->base) == 0)
        ;
    rpc_client_free(c);
    /* Let libevent run the bufferevent's deferred teardown (its finalizers) before the base
     * goes away. */
    event_base_loop(b->base, EVLOOP_NONBLOCK);
    event_base_free(b->base);
    if (b->code == ST_OK && b->messages == UINT64_MAX)
        return st_err_set(status, ST_RESOURCE_EXHAUSTED, "out of memory holding the response");
    if (b->code == ST_OK) {
        st_err_clear(status);
        return ST_OK;
    }
    return st_err_set(status, b->code, "%s", b->message);
}

st_code rpc_blocking_unary(const char *addr, const rpc_client_opts *opts, const char *path,
                           st_slice request, const rpc_metadata *md, size_t md_count,
                           int64_t timeout_ms, st_buf *resp, st_err *status) {
    blocking_ctx b = {.resp = resp};
    if (resp)
        st_buf_reset(resp);
    st_code rc = blocking_run(addr, opts, path, request, md, md_count, timeout_ms, &b, status);
    if (rc == ST_OK && b.messages != 1)
        return st_err_set(status, ST_INTERNAL, "unary response carried %llu messages",
                          (unsigned long long)b.messages);
    return rc;
}

st_code rpc_blocking_stream(const char *addr, const rpc_client_opts *opts, const char *path,
                            st_slice request, const rpc_metadata *md, size_t md_count,
                            int64_t timeout_ms, void (*on_msg)(st_slice msg, void *arg), void *arg,
                            st_err *status) {
    blocking_ctx b = {.on_msg = on_msg, .arg = arg};
    return blocking_run(addr, opts, path, request, md, md_count, timeout_ms, &b, status);
}
