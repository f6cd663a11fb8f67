/* limits.c — the servers' process-wide limits (rpc_limits in strata/rpc.h), the counters they
 * bound, and the rate limit of the layer's repeatable log lines.
 *
 * These are the layer's documented exception to "no global mutable state": memory and file
 * descriptors belong to the process, not to one server or connection, so what bounds them must
 * see every server of the process. The limits are written once at start-up (rpc_limits_set,
 * before any server exists) and copied by rpc_server_new; the counters are atomics. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "rpc_internal.h"

static rpc_limits g_limits = {
    .buffered_request_bytes_max = RPC_BUFFERED_REQUEST_BYTES_DEFAULT,
    .connections_max = 0,
    .idle_timeout_ms = RPC_IDLE_TIMEOUT_MS_DEFAULT,
    .handshake_timeout_ms = RPC_HANDSHAKE_TIMEOUT_MS_DEFAULT,
    .slow_request_window_ms = RPC_SLOW_REQUEST_WINDOW_MS_DEFAULT,
    .request_bytes_per_s_min = RPC_REQUEST_BYTES_PER_S_MIN_DEFAULT,
    .queued_response_bytes_max = RPC_QUEUED_RESPONSE_BYTES_DEFAULT,
    .streams_per_conn_max = RPC_STREAMS_MAX_DEFAULT,
    .header_bytes_max = RPC_HEADER_BYTES_MAX,
    .message_bytes_max = RPC_MESSAGE_BYTES_MAX_DEFAULT,
};
static size_t g_buffered; /* request bytes reserved by calls of every server (atomic) */
static uint32_t g_conns;  /* server connections open (atomic) */
static size_t g_queued;   /* response bytes queued by calls of every server (atomic) */

void rpc_queued_add(size_t n) {
    __atomic_fetch_add(&g_queued, n, __ATOMIC_RELAXED);
}

void rpc_queued_sub(size_t n) {
    size_t was = __atomic_fetch_sub(&g_queued, n, __ATOMIC_RELAXED);
    ST_ASSERT(was >= n);
}

size_t rpc_queued_response_bytes(void) {
    return __atomic_load_n(&g_queued, __ATOMIC_RELAXED);
}

void rpc_limits_default(rpc_limits *l) {
    *l = (rpc_limits){
        .buffered_request_bytes_max = RPC_BUFFERED_REQUEST_BYTES_DEFAULT,
        .connections_max = 0,
        .idle_timeout_ms = RPC_IDLE_TIMEOUT_MS_DEFAULT,
        .handshake_timeout_ms = RPC_HANDSHAKE_TIMEOUT_MS_DEFAULT,
        .slow_request_window_ms = RPC_SLOW_REQUEST_WINDOW_MS_DEFAULT,
        .request_bytes_per_s_min = RPC_REQUEST_BYTES_PER_S_MIN_DEFAULT,
        .queued_response_bytes_max = RPC_QUEUED_RESPONSE_BYTES_DEFAULT,
        .streams_per_conn_max = RPC_STREAMS_MAX_DEFAULT,
        .header_bytes_max = RPC_HEADER_BYTES_MAX,
        .message_bytes_max = RPC_MESSAGE_BYTES_MAX_DEFAULT,
    };
}

void rpc_limits_set(const rpc_limits *l) {
    g_limits = *l;
}

void rpc_limits_get(rpc_limits *out) {
    *out = g_limits;
}

uint32_t rpc_connections_max_auto(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return RPC_CONNECTIONS_MAX_AUTO;
    /* A quarter of the descriptors stay for files, listeners, clients and the loop itself. */
    rlim_t n = rl.rlim_cur - rl.rlim_cur / 4;
    if (n > RPC_CONNECTIONS_MAX_AUTO)
        return RPC_CONNECTIONS_MAX_AUTO;
    return n > 0 ? (uint32_t)n : 1;
}

bool rpc_mem_reserve(size_t n, size_t max, size_t own) {
    size_t cur = __atomic_load_n(&g_buffered, __ATOMIC_RELAXED);
    do {
        /* Alone (everything buffered is its own), a call is always admitted: a budget below the
         * message maximum must not refuse every large message outright, and one message is
         * bounded by that maximum anyway. */
        if (cur > own && (n > max || cur > max - n))
            return false;
    } while (!__atomic_compare_exchange_n(&g_buffered, &cur, cur + n, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return true;
}

void rpc_mem_release(size_t n) {
    size_t was = __atomic_fetch_sub(&g_buffered, n, __ATOMIC_RELAXED);
    ST_ASSERT(was >= n);
}

size_t rpc_mem_buffered(void) {
    return __atomic_load_n(&g_buffered, __ATOMIC_RELAXED);
}

bool rpc_conn_slot_take(uint32_t max) {
    uint32_t cur = __atomic_load_n(&g_conns, __ATOMIC_RELAXED);
    do {
        if (cur >= max)
            return false;
    } while (!__atomic_compare_exchange_n(&g_conns, &cur, cur + 1, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return true;
}

void rpc_conn_slot_put(void) {
    uint32_t was = __atomic_fetch_sub(&g_conns, 1, __ATOMIC_RELAXED);
    ST_ASSERT(was > 0);
}

/* ---- flags ---- */

/* A non-negative integer with an optional binary suffix (k, m, g) when `sized`. */
static bool parse_u64(const char *text, bool sized, uint64_t max, uint64_t *out) {
    if (!text || !*text || *text == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text)
        return false;
    unsigned shift = 0;
    if (sized && *end) {
        const char *units = "kmg";
        const char *u = strchr(units, *end | 0x20);
        if (!u || end[1])
            return false;
        shift = 10 * (unsigned)(u - units + 1);
        end++;
    }
    if (*end || v > (max >> shift))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

int rpc_limits_flag(rpc_limits *l, const char *flag, const char *value, st_err *err) {
    static const struct {
        const char *name;
        bool sized;
        uint64_t min, max, scale; /* stored value = parsed * scale */
        size_t off, width;
    } f[] = {
        {"--max-buffered-request-bytes", true, 1, SIZE_MAX, 1,
         offsetof(rpc_limits, buffered_request_bytes_max), sizeof(size_t)},
        {"--max-connections", false, 1, UINT32_MAX, 1, offsetof(rpc_limits, connections_max),
         sizeof(uint32_t)},
        {"--idle-timeout-s", false, 0, UINT32_MAX / 1000, 1000,
         offsetof(rpc_limits, idle_timeout_ms), sizeof(uint32_t)},
        {"--handshake-timeout-ms", false, 0, UINT32_MAX, 1,
         offsetof(rpc_limits, handshake_timeout_ms), sizeof(uint32_t)},
        {"--slow-client-timeout-ms", false, 0, UINT32_MAX, 1,
         offsetof(rpc_limits, slow_request_window_ms), sizeof(uint32_t)},
        {"--min-request-bytes-per-s", true, 0, UINT32_MAX, 1,
         offsetof(rpc_limits, request_bytes_per_s_min), sizeof(uint32_t)},
        {"--max-queued-response-bytes", true, 1, SIZE_MAX, 1,
         offsetof(rpc_limits, queued_response_bytes_max), sizeof(size_t)},
        {"--max-streams-per-connection", false, 1, INT32_MAX, 1,
         offsetof(rpc_limits, streams_per_conn_max), sizeof(uint32_t)},
        /* below the minimum no gRPC call fits; above the limit the HTTP/2 library cannot decode
         * one large value (RPC_HEADER_BYTES_LIMIT) */
        {"--max-header-bytes", true, RPC_HEADER_BYTES_MIN, RPC_HEADER_BYTES_LIMIT, 1,
         offsetof(rpc_limits, header_bytes_max), sizeof(size_t)},
        /* the gRPC prefix carries a message length in 32 bits */
        {"--max-message-bytes", true, 1, UINT32_MAX, 1, offsetof(rpc_limits, message_bytes_max),
         sizeof(size_t)},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (strcmp(flag, f[i].name) != 0)
            continue;
        uint64_t v;
        if (!parse_u64(value, f[i].sized, f[i].max, &v) || v < f[i].min) {
            bool hdr = f[i].off == offsetof(rpc_limits, header_bytes_max);
            st_err_set(err, ST_INVALID_ARGUMENT,
                       "%s takes an integer from %llu to %llu%s, not '%s'%s", f[i].name,
                       (unsigned long long)f[i].min, (unsigned long long)f[i].max,
                       f[i].sized ? " (k, m or g suffix allowed)" : "", value ? value : "",
                       hdr ? ": the HTTP/2 header decoder (nghttp2) refuses any single metadata "
                             "name or value longer than 64 KiB by closing the whole connection, "
                             "so a larger limit could not be honoured"
                           : "");
            return -1;
        }
        v *= f[i].scale;
        if (f[i].width == sizeof(uint32_t)) {
            uint32_t v32 = (uint32_t)v;
            memcpy((char *)l + f[i].off, &v32, sizeof v32);
        } else {
            size_t vs = (size_t)v;
            memcpy((char *)l + f[i].off, &vs, sizeof vs);
        }
        return 1;
    }
    return 0;
}
