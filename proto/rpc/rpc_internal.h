/* Private to proto/rpc: what the server and the client share below strata/rpc.h (fixed sizes,
 * the transport table, the write queue, the per-thread caches, the process-wide limits). */
#ifndef STRATA_RPC_INTERNAL_H
#define STRATA_RPC_INTERNAL_H

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "frame.h"
#include "strata/rpc.h"

/* ---- the layer's fixed sizes and windows ---- */
#define H2_CONN_OUTPUT_HIGH_WATER_BYTES ((size_t)1 << 20) /* socket output stops filling here */
#define H2_CONN_REQUEST_BYTES_MAX ((size_t)512 << 20)     /* request bytes buffered per conn */
#define H2_STREAM_WINDOW_BYTES ((int32_t)1 << 20)         /* HTTP/2 initial stream window */
/* A client's initial stream window: what a server may still send on a call after the client
 * paused it (rpc_ccall_pause), so what a proxy holds per paused call beyond its budget. */
#define H2_CLIENT_STREAM_WINDOW_BYTES ((int32_t)256 << 10)
#define H2_CONN_WINDOW_BYTES ((int32_t)16 << 20) /* HTTP/2 connection window */
#define RPC_CALL_ARENA_BLOCK_BYTES ((size_t)4096)
#define H2_HANDSHAKE_TIMEOUT_MS 10000 /* client: connect (+ TLS handshake); servers: rpc_limits */
#define RPC_REFUSED_RETRIES_MAX 8     /* client resubmits of a request refused unprocessed */

/* Output of every connection (server and client, plaintext or TLS) goes first into the connection's
 * own write queue (h2_wbuf) and h2_out_write_now writes it with one sendmsg() from the loop
 * callback that produced it: a request or response costs one loop pass, no epoll_ctl pair, and none
 * of the evbuffer chain allocations and callbacks per frame. Only what the socket would not take
 * moves into the bufferevent's output, whose write event is then armed until it drains (the
 * bufferevent writes the rest, or reports the error).
 *
 * Small pieces (frame headers, HEADERS frames, small DATA payloads) are copied into the queue's
 * flat buffer; large DATA payloads (H2_OUT_REF_BYTES_MIN and up, h2_out_add_ref) are only
 * referenced where they lie, in the call's response queue, and go to the kernel straight from
 * there in the same sendmsg as the bytes around them. A referenced range must stay valid and
 * unchanged until the queue is written: while h2_out_pinned says the queue references memory,
 * its owner calls h2_out_write_now before it moves or overwrites bytes, and hands blocks it would
 * free to h2_wbuf_retire. */
#define H2_OUT_REF_BYTES_MIN ((size_t)4 << 10)
#define H2_OUT_SEGS_MAX 128 /* iovecs per write; past it payloads are copied */

typedef struct h2_out_seg {
    const uint8_t *ref; /* NULL: bytes [off, off + len) of the queue's flat buffer */
    size_t off, len;
} h2_out_seg;

typedef struct h2_wbuf {
    st_buf buf; /* copied bytes */
    /* In order, what is queued when something is referenced; nsegs == 0: just buf. */
    h2_out_seg segs[H2_OUT_SEGS_MAX];
    size_t nsegs;
    size_t ref_bytes; /* referenced bytes queued */
    /* malloc'd blocks whose owner went away while they were referenced: freed once written */
    void *retired[H2_OUT_SEGS_MAX];
    size_t nretired;
    /* TLS (tlsio.c): the connection's SSL (NULL: plaintext). What is queued is then plaintext,
     * always copied (never referenced), and h2_out_write_now encrypts it with one SSL_write
     * into tls_out, then sends that like plaintext. The SSL's BIO reads the ciphertext chunk
     * h2_tls_recv was handed (tls_in) and appends what it writes to tls_out: OpenSSL never
     * touches the socket, so a flush is one send of many records, not one per record. */
    SSL *ssl;
    st_buf tls_out;        /* ciphertext not yet sent (empty between calls) */
    const uint8_t *tls_in; /* ciphertext not yet consumed by OpenSSL ... */
    size_t tls_in_len;     /* ... and its length */
    bool tls_broken;       /* a fatal TLS error: no close_notify */
} h2_wbuf;

void h2_wbuf_free(h2_wbuf *w);
/* Forgets what is queued without writing it (the connection is closing). */
void h2_wbuf_drop(h2_wbuf *w);
/* Takes over a malloc'd block (e.g. a finished call's response queue) that queued segments may
 * reference, to free it once written or dropped. False when full: write the queue first. */
bool h2_wbuf_retire(h2_wbuf *w, void *block);
/* True while the queue references memory it does not own (see above). */
static inline bool h2_out_pinned(const h2_wbuf *w) {
    return w && w->ref_bytes > 0;
}

/* Queues bytes (copied): into wbuf while the bufferevent's output is empty, else behind what it
 * still holds, so the order is kept (TLS: always into wbuf, as plaintext). wbuf NULL (a plain
 * client not yet connected): the bufferevent. */
bool h2_out_add(struct bufferevent *bev, h2_wbuf *wbuf, const void *data, size_t len);

/* As h2_out_add, but a large payload going into wbuf is referenced, not copied: data must stay
 * valid and unchanged until the next h2_out_write_now (or h2_wbuf_drop). Under TLS it is copied:
 * a flush is then one flat buffer, encrypted with one SSL_write. */
bool h2_out_add_ref(struct bufferevent *bev, h2_wbuf *wbuf, const void *data, size_t len);

/* Bytes queued and not yet handed to the kernel (compared with the high-water mark). */
size_t h2_out_len(struct bufferevent *bev, const h2_wbuf *wbuf);

/* Writes what is queued now; afterwards wbuf references nothing (what the socket did not take
 * was copied into the bufferevent). Returns true when it wrote something and nothing is left:
 * the caller's HTTP/2 session may have more to produce if it had stopped at the high-water
 * mark. Under TLS, plaintext queued before the handshake finished waits for it. */
bool h2_out_write_now(struct bufferevent *bev, h2_wbuf *wbuf);

/* The bufferevent still holds bytes the socket did not take: try them now; true when its
 * output is empty afterwards (else its write event is armed). */
bool h2_bev_output_write(struct bufferevent *bev);

/* ---- TLS over the direct path (tlsio.c) ----
 * A TLS connection keeps the plain socket bufferevent, read event and write queue of a plaintext
 * one; only the bytes change: h2_tls_recv decrypts what h2_sock_read read, h2_out_write_now
 * encrypts what the session queued. */

/* Gives wbuf an SSL for ctx (server or client side; a client's server_name is checked against
 * the server's certificate and sent as SNI unless it is an IP address). False when out of
 * memory. */
bool h2_tls_attach(h2_wbuf *wbuf, SSL_CTX *ctx, bool server, const char *server_name);
/* Starts a client's handshake (its ClientHello goes out). False when it cannot. */
bool h2_tls_connect(struct bufferevent *bev, h2_wbuf *wbuf);
/* Sends close_notify when the handshake finished and the socket takes it at once (best effort),
 * then frees the SSL. Idempotent. */
void h2_tls_close(struct bufferevent *bev, h2_wbuf *wbuf);
/* h2_out_write_now of a TLS wbuf. */
bool h2_tls_write_now(struct bufferevent *bev, h2_wbuf *wbuf);
/* True once the handshake finished (always true for plaintext). */
bool h2_tls_established(const h2_wbuf *wbuf);
/* True when the handshake settled on ALPN h2. */
bool h2_tls_alpn_h2(const h2_wbuf *wbuf);

typedef enum h2_tls_result {
    H2_TLS_OK,     /* consumed; more may come */
    H2_TLS_EOF,    /* the peer sent close_notify */
    H2_TLS_FAILED, /* a TLS error (handshake or record): *err holds OpenSSL's code */
    H2_TLS_STOP,   /* a callback returned false: the connection ends (the SSL may be gone) */
} h2_tls_result;

typedef struct h2_tls_sink {
    bool (*feed)(void *arg, const uint8_t *data, size_t len); /* plaintext, to HTTP/2 */
    bool (*established)(void *arg); /* the handshake just finished (check ALPN, role ...) */
    void *arg;
} h2_tls_sink;

/* Hands ciphertext read from the socket to OpenSSL: drives the handshake, then gives every
 * decrypted record to sink->feed; sends what OpenSSL answers (handshake messages, alerts,
 * session tickets, key updates). */
h2_tls_result h2_tls_recv(struct bufferevent *bev, h2_wbuf *wbuf, const uint8_t *data, size_t len,
                          const h2_tls_sink *sink, unsigned long *err);
/* OpenSSL's reason for err (from h2_tls_recv) in out, naming an expired or not yet valid peer
 * certificate as such, with the fix. */
void h2_tls_why(const h2_wbuf *wbuf, unsigned long err, char *out, size_t cap);

/* What h2_sock_read found. */
typedef enum h2_read_result {
    H2_READ_AGAIN, /* drained for now (EAGAIN), or read its share of the loop pass */
    H2_READ_EOF,   /* the peer closed its side */
    H2_READ_ERROR, /* recv failed; errno says why */
    H2_READ_FED,   /* feed returned false: the caller ends the connection */
} h2_read_result;

/* Reads fd straight into a stack buffer and hands each chunk to feed (the
 * HTTP/2 session), instead of letting the bufferevent read: libevent asks FIONREAD (an ioctl)
 * before every read and copies through an evbuffer chain. Stops at EAGAIN, at a short read (the
 * level-triggered read event fires again if more arrives) or after a few full chunks, so one busy
 * connection cannot starve the others. */
h2_read_result h2_sock_read(int fd, bool (*feed)(void *arg, const uint8_t *data, size_t len),
                            void *arg);

/* Options for every session (server and client), to free with nghttp2_option_del; NULL when out
 * of memory. No HTTP messaging checks: nghttp2 would otherwise validate every header name and
 * value character by character and the pseudo-header rules of each request and response, costing
 * several percent of the layer's CPU; gRPC needs none of it beyond what server.c checks itself
 * (:method POST, content-type, :path naming a method), and names and values still arrive with
 * their lengths (HPACK decoding and frame checks stay on). */
struct nghttp2_option;
struct nghttp2_option *h2_session_option(void);

/* A header for nghttp2 without copies (name a literal): the caller keeps name and value alive
 * until the frame is sent or dropped (nghttp2 drops a frame of a closed stream unread). */
#define H2_NV_NO_COPY (NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE)
#define H2_NV(n, v)                                                                                \
    { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), H2_NV_NO_COPY }

/* Fills *sa and *len for a Unix-domain socket at path; false when path is empty or longer than
 * RPC_UNIX_PATH_MAX (the server's listeners and the client's connects). */
struct sockaddr_un;
bool h2_unix_addr(const char *path, struct sockaddr_un *sa, socklen_t *len);

/* The layer's per-thread caches (h2mem.c, server_call.c's and client.c's ended calls) keep nothing
 * under AddressSanitizer, so a stale reference into a freed block still faults there. */
#if defined(__SANITIZE_ADDRESS__)
#define RPC_TL_CACHE_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RPC_TL_CACHE_ON 0
#endif
#endif
#ifndef RPC_TL_CACHE_ON
#define RPC_TL_CACHE_ON 1
#endif

/* Runs fn(arg) when the calling thread exits: st_tl_at_thread_exit (base.h). */
static inline bool rpc_tl_at_thread_exit(void (*fn)(void *), void *arg) {
    return st_tl_at_thread_exit(fn, arg);
}

/* The allocator of every session (h2mem.c): nghttp2's many small blocks come from bounded
 * per-thread free lists instead of malloc's bins. Any thread; blocks may be freed on another. */
nghttp2_mem *h2_mem(void);

/* Tells rpc_loop_run (loop.c) that this thread's loop did work: a read or a posted completion. */
void h2_loop_activity(void);

/* Counts calls (server and client) open on this thread's loop: +1 when one starts, -1 when it
 * is freed. rpc_loop_run polls longer while some are open. */
void h2_loop_calls(int delta);

/* Routes libevent's and nghttp2's own logs into st_log once per process. */
void h2_logging_init(void);

/* ---- process-wide limits (limits.c) ---- */
/* The automatic connections_max: 3/4 of RLIMIT_NOFILE, at most RPC_CONNECTIONS_MAX_AUTO. */
uint32_t rpc_connections_max_auto(void);
/* Reserves n more request bytes for a call holding own bytes of the process's budget; false
 * (nothing reserved) when that would pass max, unless the call holds everything reserved (one
 * call is always admitted). Any thread. */
bool rpc_mem_reserve(size_t n, size_t max, size_t own);
void rpc_mem_release(size_t n);
size_t rpc_mem_buffered(void);
/* Counts response bytes queued by server calls (rpc_queued_response_bytes). */
void rpc_queued_add(size_t n);
void rpc_queued_sub(size_t n);
/* Takes one of the process's max connection slots; false when all are taken. */
bool rpc_conn_slot_take(uint32_t max);
void rpc_conn_slot_put(void);

/* Log lines a peer can make repeat (one per connection, per failed accept): rate-limited per call
 * site (ST_LOG_LIMITED). */
#define RPC_LOG_LIMITED(level, fmt, ...) ST_LOG_LIMITED(level, "rpc", fmt, __VA_ARGS__)

#endif
