/* strata/rpc.h — gRPC over HTTP/2 (nghttp2 on libevent, optional TLS via OpenSSL), used by every
 * Strata server (router public port, node internal port) and client (router->node, bench, tests).
 *
 * It moves serialized protobuf bytes; handlers unpack them with protobuf-c themselves (through the
 * call's arena). Unary and server-streaming calls; client streaming is not supported (a request
 * stream carrying more than one message ends with INVALID_ARGUMENT).
 *
 * Threading: a server or client lives on one libevent event_base and every function here must be
 * called on that base's thread, except rpc_server_post (any thread) and the blocking helpers
 * (which run their own event_base in the calling thread).
 *
 * What ends what (the fatal band):
 *   - a bad request on one stream (malformed gRPC prefix, compressed message, oversized message,
 *     unknown method, wrong :method or content-type, bad grpc-timeout, too many headers) ends THAT
 *     stream with a gRPC status; the connection and the others carry on;
 *   - a protocol error in the HTTP/2 byte stream (garbage, bad frames, failed TLS handshake, ALPN
 *     not h2), a socket error or an allocation failure ends THAT connection: every call on it is
 *     marked cancelled;
 *   - nothing a peer sends ends the process. */
#ifndef STRATA_RPC_H
#define STRATA_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

struct event_base;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */
struct ssl_st;     /* OpenSSL's SSL */

/* ---- named maxima and defaults ---- */
#define RPC_MESSAGE_BYTES_MAX_DEFAULT ((size_t)256 << 20) /* one gRPC message, either way */
#define RPC_SEND_QUEUE_BYTES_DEFAULT ((size_t)1 << 20)    /* per call: "writable" below this */
#define RPC_STREAMS_MAX_DEFAULT 256u                      /* SETTINGS_MAX_CONCURRENT_STREAMS */
#define RPC_HEADER_BYTES_MAX ((size_t)64 << 10)           /* default request metadata per call */
/* The most --max-header-bytes can be. nghttp2's HPACK decoder refuses a name or value whose
 * encoded string is longer than 64 KiB (NGHTTP2_HD_MAX_NV, fixed at build time) with a
 * COMPRESSION_ERROR that ends the whole connection; an encoder that Huffman-codes only what it
 * shortens (RFC 7541 encoders do) never sends a longer string for metadata within this limit. */
#define RPC_HEADER_BYTES_LIMIT ((size_t)64 << 10)
#define RPC_HEADERS_COUNT_MAX 64u            /* request metadata entries per stream */
#define RPC_POST_QUEUE_MAX ((size_t)1 << 20) /* pending rpc_server_post functions */
#define RPC_GRPC_MESSAGE_MAX 1024            /* bytes of grpc-message text kept */
#define RPC_REFUSED_RETRIES_MAX 8            /* client resubmits of a request refused unprocessed */
#define RPC_SEND_HEADROOM 5 /* bytes free at the front of an rpc_call_send_buf message (prefix) */

#define RPC_UNIX_PATH_MAX 107   /* a Unix socket path's bytes: sun_path holds 108 with the NUL */
#define RPC_UNIX_PREFIX "unix:" /* addresses of the blocking helpers naming a Unix socket */

/* ---- server ---- */
typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

/* A handler runs on the loop thread when the request (exactly one message) has fully arrived.
 * `request` is valid until the call is released (rpc_call_finish). The handler owns one
 * reference to the call and must call rpc_call_finish exactly once, now or later (asynchronous
 * completion: keep the pointer, do the work elsewhere, come back with rpc_server_post). */
typedef void (*rpc_handler_fn)(rpc_call *call, st_slice request, void *arg);

typedef struct rpc_server_opts {
    size_t message_bytes_max;    /* 0 = rpc_limits.message_bytes_max */
    size_t send_queue_bytes_max; /* 0 = RPC_SEND_QUEUE_BYTES_DEFAULT */
    uint32_t streams_max;        /* 0 = rpc_limits.streams_per_conn_max */
    struct ssl_ctx_st *ssl_ctx;  /* NULL = plaintext h2c; borrowed, outlives the server; prepare
                                    it with rpc_tls_server_ctx_prepare (ALPN h2) */
    /* With ssl_ctx: NULL = Unix-socket listeners speak TLS like TCP ones. A role (RPC_ROLE_*) =
     * they stay plaintext and every caller gets this role (rpc_call_peer_role), because the
     * socket is reachable only by the server's own user: rpc_server_listen_unix then refuses a
     * socket whose directory others may enter, and connections from another user id
     * (SO_PEERCRED) are closed. That user can read the server's keys anyway. */
    const char *unix_peer_role;
} rpc_server_opts;

typedef struct rpc_server_stats {
    uint64_t conns_accepted;
    uint64_t conns_open;
    uint64_t calls_started;
    uint64_t calls_active;           /* calls whose stream is open */
    uint64_t calls_cancelled;        /* by RST_STREAM, connection loss or deadline */
    uint64_t queued_bytes;           /* response bytes queued in calls, not yet given to HTTP/2 */
    uint64_t queued_bytes_peak;      /* high-water mark of queued_bytes */
    uint64_t bad_streams;            /* streams ended with an error status by the layer itself */
    uint64_t calls_refused_memory;   /* refused: buffered_request_bytes_max reached */
    uint64_t calls_slow;             /* ended: their request arrived too slowly */
    uint64_t conns_refused;          /* closed at accept: connections_max reached */
    uint64_t conns_evicted;          /* idle, closed at connections_max to admit a new connection */
    uint64_t conns_idle_closed;      /* closed after idle_timeout_ms without calls */
    uint64_t conns_handshake_closed; /* closed: no preface+SETTINGS within handshake_timeout_ms */
    uint64_t accept_errors;          /* accept() failures (EMFILE...): each pauses the listeners */
    uint64_t buffered_request_bytes; /* process-wide: request bytes buffered by all calls now */
} rpc_server_stats;

/* NULL on failure (err says why). opts may be NULL. Free with rpc_server_free. */
rpc_server *rpc_server_new(struct event_base *base, const rpc_server_opts *opts, st_err *err);
/* A gate runs on the loop thread before the handler of every call, once its request arrived: it
 * returns true to let the handler run, or finishes the call itself (rpc_call_finish, which
 * releases the handler's reference) and returns false. strata-router checks bearer tokens and
 * permissions here, for every method registered now or later. */
typedef bool (*rpc_gate_fn)(rpc_call *call, st_slice request, void *arg);
void rpc_server_set_gate(rpc_server *s, rpc_gate_fn gate, void *arg);
/* Registers a method by full path ("/google.bigtable.v2.Bigtable/ReadRows"); the path string is
 * copied. ALREADY_EXISTS for a duplicate path, RESOURCE_EXHAUSTED if out of memory. */
st_code rpc_server_add_method(rpc_server *s, const char *path, rpc_handler_fn handler, void *arg);
/* Listens on host:port (host NULL = all interfaces, port 0 = ephemeral); *bound_port (may be
 * NULL) receives the port. UNAVAILABLE if the address cannot be bound. May be called several
 * times for several listeners. */
st_code rpc_server_listen(rpc_server *s, const char *host, uint16_t port, uint16_t *bound_port,
                          st_err *err);
/* The same in two steps, so a process can claim its port before it starts work that must not
 * run twice (a second process on a taken port then fails before touching anything): bind
 * reserves host:port (connections are refused meanwhile), listen_bound starts accepting on every
 * address bound so far. */
st_code rpc_server_bind(rpc_server *s, const char *host, uint16_t port, uint16_t *bound_port,
                        st_err *err);
st_code rpc_server_listen_bound(rpc_server *s, st_err *err);
/* Also listens on a Unix-domain stream socket at path (same HTTP/2 and gRPC; meant for
 * processes on one host, e.g. strata-router -> strata-node, saving the TCP/IP stack on every
 * message). A socket file already at path that no process accepts on (left by a crash) is
 * replaced; rpc_server_free removes the file again (if it is still the one bound here). Errors:
 * INVALID_ARGUMENT when path is empty or longer than RPC_UNIX_PATH_MAX; UNAVAILABLE when path is
 * a live socket of another process, something other than a socket, or cannot be bound. */
st_code rpc_server_listen_unix(rpc_server *s, const char *path, st_err *err);
/* Stops the server politely, for a process about to exit (SIGTERM): the listeners close, every
 * connection gets a GOAWAY (its client sends new calls elsewhere), the calls in flight get half
 * of grace_ms to finish, and those still open then end with UNAVAILABLE why, which clients
 * retry. A connection that merely vanished under its calls would look like a crash, which
 * strata-router counts against the request as a possible query of death. Runs the loop until
 * every connection has closed or grace_ms passed (a loopbreak, e.g. a second signal, ends it
 * sooner); rpc_server_free then closes what is left. Loop thread only, the loop not running. */
void rpc_server_shutdown(rpc_server *s, const char *why, uint32_t grace_ms);
/* Closes listeners and connections (calls become cancelled; their memory goes when the handler
 * finishes) and frees the server. Pending posted functions are dropped. Loop thread only, with the
 * loop not running a server callback; as for clients, turn the base once before freeing it. */
void rpc_server_free(rpc_server *s);
/* Thread-safe: runs fn(arg) on the server's loop thread soon, in posting order. RESOURCE_EXHAUSTED
 * if the queue is full (RPC_POST_QUEUE_MAX) or memory runs out, in which case fn will not run. */
st_code rpc_server_post(rpc_server *s, void (*fn)(void *arg), void *arg);
/* Room for a queue entry of rpc_server_post_item, embedded in the caller's own object. */
typedef struct rpc_post {
    _Alignas(void *) unsigned char opaque[4 * sizeof(void *)]; /* the server's */
} rpc_post;
/* As rpc_server_post, but queues the caller's item instead of allocating one, so a thread that
 * posts often (storage's commit thread, once per durable write) does no malloc here and the loop
 * no cross-thread free. item must stay valid until fn starts; the server does not touch it once
 * fn has started (fn may free it). RESOURCE_EXHAUSTED only when the queue is full. */
st_code rpc_server_post_item(rpc_server *s, rpc_post *item, void (*fn)(void *arg), void *arg);

/* Runs base until event_base_loopbreak/loopexit or no events are left, like event_base_dispatch.
 * spin_us > 0: after each wake-up the loop keeps polling without sleeping until spin_us pass
 * with no socket read or posted completion, so the next message of a conversation is caught
 * without a wake-up (loop.c says why). Returns 0, or -1 when the backend failed. */
int rpc_loop_run(struct event_base *base, unsigned spin_us);

/* A watchdog on base's loop: logs a warning each time a timer it keeps fires a second or more
 * late, i.e. some callback held the loop thread that long and every call of the process waited
 * (a router's 3 s keepalive fails a node link blocked that long), with the loop thread's CPU time
 * and run-queue wait over the gap. Call it on base's loop thread. NULL when out of memory. */
typedef struct rpc_loop_watch rpc_loop_watch;
rpc_loop_watch *rpc_loop_watch_start(struct event_base *base, const char *who);
void rpc_loop_watch_stop(rpc_loop_watch *w);

/* The servers' default spin_us (strata-node and strata-router --poll-us). */
#define RPC_LOOP_POLL_US_DEFAULT 50
#define RPC_LOOP_POLL_US_MAX 10000

/* Parses a --poll-us value (0..RPC_LOOP_POLL_US_MAX); false when it is not one. */
bool rpc_loop_poll_parse(const char *text, unsigned *spin_us);
/* Any thread (counters are read atomically one by one). */
void rpc_server_stats_get(rpc_server *s, rpc_server_stats *out);

/* ---- process-wide limits of the servers (every server of the process shares them) ----
 * What a peer can make a server hold is bounded across connections: the request bytes buffered
 * by all calls, the connections open, and how long a connection may sit without doing its part
 * (finishing its handshake, opening calls, sending the request it announced). */
typedef struct rpc_limits {
    /* Request bytes buffered by all calls of all servers; a call whose message would go past it
     * ends with RESOURCE_EXHAUSTED as soon as its gRPC prefix announces the length (a call
     * arriving when nothing is buffered is always admitted). */
    size_t buffered_request_bytes_max;
    /* Server connections open at once; further ones get a GOAWAY and are closed. 0 (in
     * rpc_limits_default) = automatic: 3/4 of RLIMIT_NOFILE, at most RPC_CONNECTIONS_MAX_AUTO. */
    uint32_t connections_max;
    /* A connection with no open call and nothing received this long is closed; 0: never. */
    uint32_t idle_timeout_ms;
    /* From accept to the client's HTTP/2 preface and SETTINGS (TLS handshake included); 0: none */
    uint32_t handshake_timeout_ms;
    /* A request still arriving must bring request_bytes_per_s_min over each such window, or
     * the call ends with RESOURCE_EXHAUSTED (slow clients); 0: no check. */
    uint32_t slow_request_window_ms;
    uint32_t request_bytes_per_s_min;
    /* Response bytes queued by all calls of all servers (waiting for slow or stalled clients),
     * with the bytes handlers hold for their calls (rpc_call_hold). Past it rpc_call_writable is
     * false for every call that has bytes queued or held: such calls wait in their server's
     * list and resume one message at a time, oldest first, as queued bytes leave. A call
     * holding nothing may queue one message past it (so clients that read keep being served),
     * which a call whose client never reads does once. */
    size_t queued_response_bytes_max;
    /* Per connection: HTTP/2 streams (calls) open at once (SETTINGS_MAX_CONCURRENT_STREAMS; a
     * client past it gets its stream refused) ... */
    uint32_t streams_per_conn_max;
    /* ... request metadata bytes per call (SETTINGS_MAX_HEADER_LIST_SIZE; a call past it ends
     * RESOURCE_EXHAUSTED) ... */
    size_t header_bytes_max;
    /* ... and one gRPC message's bytes (a request past it ends RESOURCE_EXHAUSTED as soon as
     * its prefix announces the length). Servers whose rpc_server_opts set their own keep them. */
    size_t message_bytes_max;
} rpc_limits;

#define RPC_BUFFERED_REQUEST_BYTES_DEFAULT ((size_t)256 << 20)
#define RPC_CONNECTIONS_MAX_AUTO 10000u
#define RPC_IDLE_TIMEOUT_MS_DEFAULT 300000u
#define RPC_HANDSHAKE_TIMEOUT_MS_DEFAULT 10000u
#define RPC_SLOW_REQUEST_WINDOW_MS_DEFAULT 30000u
#define RPC_REQUEST_BYTES_PER_S_MIN_DEFAULT 1024u
#define RPC_QUEUED_RESPONSE_BYTES_DEFAULT ((size_t)256 << 20)
#define RPC_HEADER_BYTES_MIN ((size_t)4 << 10) /* room for gRPC's own headers and a token */

/* The defaults above (connections_max 0: automatic). */
void rpc_limits_default(rpc_limits *l);
/* Sets the limits of servers created from now on (rpc_server_new copies them); call before
 * starting servers, from one thread. Until called, the defaults apply. */
void rpc_limits_set(const rpc_limits *l);
void rpc_limits_get(rpc_limits *out);
/* Command-line flags of the servers (strata-node, strata-router): when flag is one of
 * RPC_LIMITS_FLAGS_USAGE's, parses value into l and returns 1 (consumed) or -1 (bad or missing
 * value; err says why); 0 when flag is not one of them. */
int rpc_limits_flag(rpc_limits *l, const char *flag, const char *value, st_err *err);
/* Response bytes queued now by the server calls of this process (any thread). */
size_t rpc_queued_response_bytes(void);
#define RPC_LIMITS_FLAGS_USAGE                                                                     \
    "Connection limits (docs/operations.md, Connection limits and timeouts):\n"                    \
    "--max-buffered-request-bytes N  request bytes buffered by all calls (default 256 MiB)\n"      \
    "--max-connections N     connections open at once (default 3/4 of ulimit -n, <= 10000)\n"      \
    "--idle-timeout-s N      close connections without calls or traffic after N s (default 300)\n" \
    "--handshake-timeout-ms N  HTTP/2 preface+SETTINGS (and TLS) within N ms (default 10000)\n"    \
    "--slow-client-timeout-ms N  a request must bring --min-request-bytes-per-s over each N ms\n"  \
    "                        (default 30000; 0: no check)\n"                                       \
    "--min-request-bytes-per-s N  (default 1024)\n"                                                \
    "--max-queued-response-bytes N  response bytes queued by all calls before producers wait\n"    \
    "                        (default 256 MiB)\n"                                                  \
    "--max-streams-per-connection N  calls open at once on one connection (default 256)\n"         \
    "--max-header-bytes N    request metadata bytes per call (4 KiB to 64 KiB, default 64 KiB)\n"  \
    "--max-message-bytes N   bytes of one gRPC message (default 256 MiB)\n"

/* ---- the server side of one call (loop thread only) ---- */
/* Request metadata by lower-case name ("authorization", "x-goog-request-params",
 * "bigtable-features"); NULL if absent. Valid until the call is released. */
const char *rpc_call_header(const rpc_call *call, const char *name);
const char *rpc_call_path(const rpc_call *call);
/* The client's address: "ip:port", "[ip6]:port", or "unix" for a Unix-domain socket; "" once
 * the connection is gone. Valid until the call is released. */
#define RPC_CALL_PEER_MAX 64
const char *rpc_call_peer(const rpc_call *call);
/* A number naming the call's connection, unique in the process (0 once the connection is gone, or
 * for a NULL call). */
uint64_t rpc_call_conn_serial(const rpc_call *call);
/* The call's arena, freed when the call is released: unpack the request through it. */
st_arena *rpc_call_arena(rpc_call *call);
/* For a handler that keeps its call open long after the request arrived (a stream that lasts as
 * long as its client reads): the request's bytes leave the process's and the connection's
 * request budgets (--max-buffered-request-bytes), which are for requests on their way in, and
 * the handler answers for them in a bound of its own. Without it a few open streams with large
 * requests would hold the whole budget and every other call would be refused. */
void rpc_call_request_kept(rpc_call *call);
/* Monotonic deadline in microseconds (st_mono_us clock) from grpc-timeout; 0 if none. */
int64_t rpc_call_deadline_us(const rpc_call *call);
/* True once the peer reset the stream, the connection died or the deadline passed: stop working,
 * then call rpc_call_finish (which is then a no-op apart from releasing the call). */
bool rpc_call_cancelled(const rpc_call *call);
/* Runs on the loop thread, from the loop (or rpc_server_free), when the call becomes cancelled:
 * at most once, never after the handler's rpc_call_finish. */
void rpc_call_set_cancel_cb(rpc_call *call, void (*on_cancel)(rpc_call *call, void *arg),
                            void *arg);
/* Queues one response message (copied). Server streaming: call it as often as wanted, but stop
 * when rpc_call_writable() is false and resume from the writable callback. Returns ST_OK,
 * CANCELLED if the call is cancelled or finished (nothing queued), RESOURCE_EXHAUSTED if the
 * message exceeds the message maximum or the queue would exceed send_queue_bytes_max plus one
 * maximum message. */
st_code rpc_call_send(rpc_call *call, st_slice msg);
/* As rpc_call_send, but hands the buffer over instead of copying it when it can. msg holds
 * RPC_SEND_HEADROOM bytes of any value (overwritten with the gRPC prefix), then the message, so
 * msg->len - RPC_SEND_HEADROOM is the message length. When nothing is queued on the call, the
 * server keeps msg's memory as the call's queue and msg receives the queue's previous memory;
 * otherwise the message is copied behind the queued ones. Either way, on ST_OK msg comes back
 * empty (len 0) with some capacity to reuse: reserve the headroom again before the next message.
 * On any error msg is untouched. Errors: those of rpc_call_send, and INVALID_ARGUMENT when msg is
 * shorter than the headroom. */
st_code rpc_call_send_buf(rpc_call *call, st_buf *msg);
/* Queues messages that are already gRPC-framed (a proxy relaying a batch a backend framed for
 * its client): frames is a whole number of complete, uncompressed messages, each a 5-byte prefix
 * and its bytes, none over the server's message maximum (rpc_frames_check), copied behind the
 * queued ones. Errors: those of rpc_call_send for their total, and INVALID_ARGUMENT (nothing
 * queued) when frames is not such a sequence. */
st_code rpc_call_send_framed(rpc_call *call, st_slice frames);
/* As rpc_call_send_framed for the bytes of buf from off on, handing buf over as
 * rpc_call_send_buf does when nothing is queued (buf then comes back empty with the queue's
 * previous memory); on any error buf is untouched. */
st_code rpc_call_send_framed_buf(rpc_call *call, st_buf *buf, size_t off);
/* A gRPC message's 5-byte prefix: written for a plain message of len bytes, and its length read
 * back (the flag byte, p[0], is the caller's to check). */
void rpc_frame_prefix(uint8_t out[5], uint32_t len);
size_t rpc_frame_len(const uint8_t p[5]);
/* Whether frames is a whole number of complete, uncompressed gRPC messages (flag byte 0, a
 * 4-byte big-endian length, the bytes), none longer than bytes_max; then their count into *n
 * and the last one's bytes into *last (either may be NULL; an empty frames is zero messages). */
bool rpc_frames_check(st_slice frames, size_t bytes_max, size_t *n, st_slice *last);
/* True while the call may queue a message: its queued response bytes are below
 * send_queue_bytes_max and the process's queued-response budget allows it (rpc_limits,
 * queued_response_bytes_max). A call refused by the budget while it has a writable callback
 * joins the budget's waiters: the callback comes when its turn does. */
bool rpc_call_writable(rpc_call *call);
/* True while the call's own queue is below send_queue_bytes_max, whatever the budget says (a
 * proxy moving bytes it already holds into the queue: rpc_call_hold). */
bool rpc_call_has_room(const rpc_call *call);
/* True while the process's queued-response bytes are at or past its budget. */
bool rpc_call_over_budget(const rpc_call *call);
/* Counts n bytes the handler holds for the call outside its queue (a proxy's backlog of
 * messages not yet queued) in the queued-response budget, until rpc_call_unhold gives them back
 * (what is still held when the call is released goes with it). */
void rpc_call_hold(rpc_call *call, size_t n);
void rpc_call_unhold(rpc_call *call, size_t n);
size_t rpc_call_queued_bytes(const rpc_call *call);
/* Runs on the loop thread (from the loop, never inside rpc_call_send) when there is room: once
 * soon after registering if the call is writable then, and whenever the queue, having reached the
 * bound, drains below half of it, or becomes empty. The producer queues its next batch there
 * (while rpc_call_writable) and must tolerate a call with nothing to do. Slow readers thus
 * throttle the producer through HTTP/2 flow control instead of the server buffering the whole
 * answer. Not called after the call is finished or cancelled. */
void rpc_call_set_writable_cb(rpc_call *call, void (*on_writable)(rpc_call *call, void *arg),
                              void *arg);
/* Ends the call: after the queued messages, trailers carry grpc-status = code and grpc-message =
 * message (percent-encoded; may be NULL). Releases the handler's reference: the call must not be
 * touched afterwards unless an extra reference is held. A no-op (apart from the release) when the
 * call was cancelled. */
void rpc_call_finish(rpc_call *call, st_code code, const char *message);
/* Extra references for code that keeps a call across rpc_call_finish. */
void rpc_call_ref(rpc_call *call);
void rpc_call_unref(rpc_call *call);

/* ---- client (loop thread of its base) ---- */
typedef struct rpc_client rpc_client;
typedef struct rpc_ccall rpc_ccall;

typedef struct rpc_metadata {
    const char *name; /* lower case */
    const char *value;
} rpc_metadata;

typedef struct rpc_client_opts {
    size_t message_bytes_max;   /* 0 = RPC_MESSAGE_BYTES_MAX_DEFAULT, for responses */
    struct ssl_ctx_st *ssl_ctx; /* NULL = plaintext; borrowed; prepare with
                                   rpc_tls_client_ctx_prepare */
    const char *server_name;    /* TLS SNI and certificate name check; NULL = the host */
    /* TLS: the role the server's certificate must name (rpc_tls_peer_role, e.g.
     * RPC_ROLE_NODE); a server naming another fails the connection with a message saying
     * which. NULL = any certificate the CA signed. */
    const char *peer_role;
    /* Dead-peer detection (a peer that stops answering without closing: a frozen process, a
     * network that drops packets). While calls are open the client sends an HTTP/2 PING every
     * keepalive_ms; when keepalive_timeout_ms pass after one with nothing received at all, the
     * connection is failed (its calls end UNAVAILABLE, one log line). TCP sockets also get
     * TCP_USER_TIMEOUT = keepalive_timeout_ms, so unacknowledged data fails them too. */
    int64_t keepalive_ms;         /* 0 = RPC_KEEPALIVE_MS_DEFAULT; < 0 = no PINGs */
    int64_t keepalive_timeout_ms; /* 0 = RPC_KEEPALIVE_TIMEOUT_MS_DEFAULT */
    int64_t connect_timeout_ms; /* connect (+ TLS handshake); 0 = RPC_CONNECT_TIMEOUT_MS_DEFAULT */
    /* Each call's HTTP/2 receive window: what the server may send on a paused call
     * (rpc_ccall_pause) before it stalls. 0 = 256 KiB; at most 2^31 - 1. */
    int32_t stream_window_bytes;
} rpc_client_opts;

#define RPC_KEEPALIVE_MS_DEFAULT 1000
#define RPC_KEEPALIVE_TIMEOUT_MS_DEFAULT 3000
#define RPC_CONNECT_TIMEOUT_MS_DEFAULT 3000

/* Per response message (streaming); slice valid during the callback only. */
typedef void (*rpc_ccall_msg_fn)(rpc_ccall *call, st_slice msg, void *arg);
/* Exactly once per call, from the loop (never inside an rpc_* function but rpc_client_free): the
 * final status
 * (from trailers, or CANCELLED / DEADLINE_EXCEEDED / UNAVAILABLE when the call ended locally or the
 * connection failed). The rpc_ccall is freed when this returns. */
typedef void (*rpc_ccall_done_fn)(rpc_ccall *call, st_code code, const char *message, void *arg);
/* Unary completion: response is the single response message (empty slice if none). */
typedef void (*rpc_unary_done_fn)(st_code code, const char *message, st_slice response, void *arg);

/* Starts connecting to host:port (a blocking getaddrinfo, then a non-blocking connect); calls can
 * be started at once and go out when connected. NULL on failure. opts may be NULL. A client whose
 * connection fails ends every call with UNAVAILABLE; rpc_client_alive then returns false and the
 * owner should make a new client. */
rpc_client *rpc_client_new(struct event_base *base, const char *host, uint16_t port,
                           const rpc_client_opts *opts, st_err *err);
/* As rpc_client_new, to the Unix-domain stream socket at path (a non-blocking connect; a
 * refused or missing socket fails the client's calls with UNAVAILABLE from the loop, like a
 * refused TCP connect). NULL when path is empty or longer than RPC_UNIX_PATH_MAX
 * (INVALID_ARGUMENT) or on allocation failure. */
rpc_client *rpc_client_new_unix(struct event_base *base, const char *path,
                                const rpc_client_opts *opts, st_err *err);
/* True once the connection was established, even if it failed since: a client that dies
 * without ever connecting met a refused or absent server. */
bool rpc_client_connected(const rpc_client *c);
/* Ends every outstanding call (done callbacks run with CANCELLED) and frees the client. Never from
 * inside one of its callbacks. Output not yet written is dropped. libevent defers part of a
 * bufferevent's teardown: turn the base once (event_base_loop(base, EVLOOP_NONBLOCK)) before
 * event_base_free, or TLS objects leak. */
void rpc_client_free(rpc_client *c);
/* False once the connection failed or the server sent GOAWAY: make a new client for new calls.
 * A client that received GOAWAY still finishes the calls the server accepted (free it only once
 * rpc_client_calls is 0, or its remaining calls end CANCELLED) and closes its connection after
 * the last one. */
bool rpc_client_alive(const rpc_client *c);
/* True after the server's GOAWAY while the connection still finishes its calls (the server
 * works: a new connection may be dialled at once). */
bool rpc_client_draining(const rpc_client *c);
/* Calls started and not yet ended. */
size_t rpc_client_calls(const rpc_client *c);
/* Once the connection failed: the calls sent on it that were lost with it (see
 * rpc_ccall_conn_lost); 0 while it is up. */
size_t rpc_client_lost(const rpc_client *c);
/* st_mono_us of the last bytes received from the server, 0 before any: a call that timed out on
 * a connection that is still receiving met a busy server, not a dead one. */
int64_t rpc_client_last_read_us(const rpc_client *c);
/* True once the connection failed because the server sent nothing within the keepalive timeout
 * after a PING (a frozen process, a partition): unlike a refused or reset connection, a new one
 * to the same address may connect and then hang just the same. */
bool rpc_client_silent(const rpc_client *c);
/* Starts a call: sends the request (one message), with metadata and a deadline (timeout_ms <= 0:
 * none; sent as grpc-timeout and enforced locally). on_msg may be NULL. Returns the call, valid
 * until on_done returns; NULL if the client is dead or memory runs out (then on_done never
 * runs). */
rpc_ccall *rpc_client_call(rpc_client *c, const char *path, st_slice request,
                           const rpc_metadata *md, size_t md_count, int64_t timeout_ms,
                           rpc_ccall_msg_fn on_msg, rpc_ccall_done_fn on_done, void *arg);
/* Unary convenience over rpc_client_call. ST_OK if started; otherwise on_done will not run. */
st_code rpc_client_unary(rpc_client *c, const char *path, st_slice request, const rpc_metadata *md,
                         size_t md_count, int64_t timeout_ms, rpc_unary_done_fn on_done, void *arg);
/* Only inside on_msg: hands the message's reassembly buffer over for rpc_call_send_buf, with
 * RPC_SEND_HEADROOM bytes before the message (false: copy the slice instead). A proxy forwards a
 * large streamed message thus without copying it. */
bool rpc_ccall_msg_take(rpc_ccall *call, st_buf *out);
/* Flow control of one call: while paused, the bytes the server sends on the call's stream are
 * not given back to its HTTP/2 window, so the server stalls on this stream once the window is
 * used up (at most one client stream window, 256 KiB, arrives after the pause; it is
 * still delivered to on_msg). The connection's other calls are not affected, and no stream is
 * reset (servers limit how many resets a peer may send). rpc_ccall_resume gives the window
 * back. Any time before on_done. */
void rpc_ccall_pause(rpc_ccall *call);
void rpc_ccall_resume(rpc_ccall *call);
/* Names the owner of a call (a proxy: the connection of the client it serves; 0: none, as a new
 * call has). Calls past the server's SETTINGS_MAX_CONCURRENT_STREAMS wait in the client, and a
 * stream that frees goes to the oldest waiting call of the next owner in turn: one owner's many
 * waiting calls do not hold back another's. Right after rpc_client_call; no effect once sent. */
void rpc_ccall_set_owner(rpc_ccall *call, uint64_t owner);
/* Only inside on_done: true when the call ended UNAVAILABLE without the server having processed
 * it (its request was never sent, or the server refused the stream with GOAWAY): a retry cannot
 * apply it twice, whatever the method. */
bool rpc_ccall_unprocessed(const rpc_ccall *call);
/* Only inside on_done: true when the server answered the call (its gRPC status, or an HTTP
 * error status, arrived). A call that failed neither answered nor unprocessed was sent and its
 * answer lost (the connection dropped or went silent, the deadline passed): the server may have
 * carried it out, or may still. */
bool rpc_ccall_answered(const rpc_ccall *call);
/* Only inside on_done: 0, or, when the call ended because its connection dropped (reset, EOF,
 * socket error) after its request went out, how many such calls the drop ended (this one
 * included). A drop under a single call points at that call as its cause. A peer gone silent
 * (no keepalive answer) is no drop, nor is a connection whose server announced its end first
 * (GOAWAY with NO_ERROR: a stop or a restart, rpc_server_shutdown): 0. */
size_t rpc_ccall_conn_lost(const rpc_ccall *call);
/* Only inside on_done: true when the call's connection had been established. False: the
 * connect failed (refused, timed out), so the server was never reached; such a call ends
 * UNAVAILABLE and unprocessed, while one refused by the server's GOAWAY is unprocessed on a
 * connected client. */
bool rpc_ccall_connected(const rpc_ccall *call);
/* Sends RST_STREAM(CANCEL); on_done then runs with CANCELLED from the loop. Idempotent. Servers
 * limit how many resets they accept per second (nghttp2: a burst of 1000, then 33/s; past it
 * the connection gets GOAWAY): cancel only calls that would not end by themselves. */
void rpc_ccall_cancel(rpc_ccall *call);

/* ---- blocking helpers for tests and CLI tools (own event_base, calling thread) ---- */
/* addr is "host:port" ("[::1]:port" for IPv6), or RPC_UNIX_PREFIX then a socket path. Returns the
 * call's gRPC status (transport failures are UNAVAILABLE); status (may be NULL) receives code and
 * message. On ST_OK, resp (initialised by the caller) receives the response message. opts may be
 * NULL. */
st_code rpc_blocking_unary(const char *addr, const rpc_client_opts *opts, const char *path,
                           st_slice request, const rpc_metadata *md, size_t md_count,
                           int64_t timeout_ms, st_buf *resp, st_err *status);
/* Server streaming: on_msg (may be NULL) runs for each response message. */
st_code rpc_blocking_stream(const char *addr, const rpc_client_opts *opts, const char *path,
                            st_slice request, const rpc_metadata *md, size_t md_count,
                            int64_t timeout_ms, void (*on_msg)(st_slice msg, void *arg), void *arg,
                            st_err *status);

/* ---- TLS ---- */
/* Server context from PEM files; client_ca_path non-NULL requires and verifies client
 * certificates. Already prepared (ALPN h2, TLS >= 1.2). NULL on failure. SSL_CTX_free it. */
struct ssl_ctx_st *rpc_tls_server_ctx_new(const char *cert_path, const char *key_path,
                                          const char *client_ca_path, st_err *err);
/* Client context; ca_path NULL = no server verification (say so loudly where used); cert/key
 * optional (client certificates). Already prepared. NULL on failure. */
struct ssl_ctx_st *rpc_tls_client_ctx_new(const char *ca_path, const char *cert_path,
                                          const char *key_path, st_err *err);
/* Replaces the TLS context of a server made with one (rpc_server_opts.ssl_ctx; borrowed the same
 * way): handshakes from now on use ctx, connections already open keep the context they were
 * made with (each holds a reference), so the old one may be SSL_CTX_free'd at once. False (nothing
 * changed) when the server serves plaintext or ctx is NULL. Loop thread only. */
bool rpc_server_set_ssl_ctx(rpc_server *s, struct ssl_ctx_st *ctx);

/* ---- peer roles (mutual TLS between Strata's processes, docs/security.md) ----
 * A certificate says what its holder is in its subject's organizational unit (OU): one of the
 * RPC_ROLE_* names. Servers that require client certificates (rpc_tls_server_ctx_new with a
 * client CA) then know, per call, which kind of process called. */
#define RPC_ROLE_MAX 63
#define RPC_ROLE_ROUTER "strata-router"
#define RPC_ROLE_NODE "strata-node"
#define RPC_ROLE_ADMIN "strata-admin" /* the operator's tools (strata CLI) */
/* The role named by the verified certificate of ssl's peer (the first subject OU starting
 * "strata-") into out; false, with out "", when there is no verified certificate or it names
 * none. */
bool rpc_tls_peer_role(const struct ssl_st *ssl, char *out, size_t cap);
/* The role of the client of call's connection, by its verified certificate; "" on plaintext
 * connections and for clients without one. Valid until the call is released. */
const char *rpc_call_peer_role(rpc_call *call);
/* A memo of size bytes that lives as long as call's connection, zeroed when first asked for:
 * what a guard or gate learnt from an earlier call of the same client (who its credentials
 * name) without working it out again on every call. One memo per connection, always asked for
 * with the same size; its bytes are cleansed when the connection closes (they may hold a
 * credential). NULL when the connection is gone, size differs from the first request's, or
 * memory ran out: then work it out as if nothing were known. Loop thread. */
void *rpc_call_conn_memo(rpc_call *call, size_t size);
/* Decides, when the request's headers end (before its message is read, so a refused call
 * buffers no body), whether call may run: anything but ST_OK ends the call with that code and
 * err's message. It also sees paths the server does not serve (rpc_call_method_known false;
 * ST_OK then ends the call UNIMPLEMENTED), so it can refuse a caller without credentials before
 * telling it which methods exist. Loop thread. */
typedef st_code (*rpc_guard_fn)(rpc_call *call, const char *path, void *arg, st_err *err);
/* True when the server has a handler for call's path (meaningful in a guard and after). */
bool rpc_call_method_known(const rpc_call *call);
/* Installs the server's guard (NULL: none), for every call from now on. */
void rpc_server_set_guard(rpc_server *s, rpc_guard_fn fn, void *arg);
/* Reloads a client context in place from PEM files (new connections use them; open ones keep
 * theirs): everything is loaded into a scratch context first, so on failure ctx is unchanged.
 * Loop thread of every client using ctx. */
st_code rpc_tls_client_ctx_reload(struct ssl_ctx_st *ctx, const char *ca_path,
                                  const char *cert_path, const char *key_path, st_err *err);

/* Whether the first certificate of the PEM file cert_path is valid now (notBefore <= now <=
 * notAfter, as X509_cmp_current_time compares them): ST_OK; FAILED_PRECONDITION when it has
 * expired or is not yet valid, err naming the file and both dates; INVALID_ARGUMENT when the
 * file holds no certificate. A process checks its own certificate at start with it, so one
 * that every peer would refuse stops it with the reason instead of starting "ready". */
st_code rpc_tls_cert_current(const char *cert_path, st_err *err);

/* Make a caller-built context usable: ALPN h2 (server: select; client: offer), TLS >= 1.2. */
st_code rpc_tls_server_ctx_prepare(struct ssl_ctx_st *ctx, st_err *err);
st_code rpc_tls_client_ctx_prepare(struct ssl_ctx_st *ctx, st_err *err);

#endif
