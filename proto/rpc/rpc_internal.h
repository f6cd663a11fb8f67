/* Private to proto/rpc: the transport table shared by server and client connections. */
#ifndef STRATA_RPC_INTERNAL_H
#define STRATA_RPC_INTERNAL_H

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "strata/rpc.h"

/* Plain and TLS connections share one table of operations (Redis's ConnectionType): how to wrap
 * a socket in a bufferevent, and whether the handshake settled on HTTP/2. */
typedef struct h2_transport {
    const char *name;
    /* Takes ownership of fd (closed with the bufferevent). NULL on failure (fd closed). */
    struct bufferevent *(*bev_new)(struct event_base *base, int fd, SSL_CTX *ctx, bool server,
                                   const char *server_name);
    /* After BEV_EVENT_CONNECTED: true if the peer agreed on h2. */
    bool (*negotiated_h2)(struct bufferevent *bev);
} h2_transport;

extern const h2_transport h2_transport_plain; /* constant table */
extern const h2_transport h2_transport_tls;   /* constant table */

/* Output of plain sockets (server and client connections) goes first into the connection's own
 * flat buffer (wbuf) and h2_out_write_now writes it with one send() from the loop callback that
 * produced it: a request or response costs one loop pass, no epoll_ctl pair, and none of the
 * evbuffer chain allocations and callbacks per frame. Only what the socket would not take moves
 * into the bufferevent's output, whose write event is then armed until it drains (the bufferevent
 * writes the rest, or reports the error). */

/* Queues bytes: into wbuf while the bufferevent's output is empty, else behind what it still
 * holds, so the order is kept. wbuf NULL (TLS, or a client not yet connected): the bufferevent. */
bool h2_out_add(struct bufferevent *bev, st_buf *wbuf, const void *data, size_t len);

/* Bytes queued and not yet handed to the kernel (compared with the high-water mark). */
size_t h2_out_len(struct bufferevent *bev, const st_buf *wbuf);

/* Writes what is queued now. Returns true when it wrote something and nothing is left: the
 * caller's HTTP/2 session may have more to produce if it had stopped at the high-water mark. */
bool h2_out_write_now(struct bufferevent *bev, st_buf *wbuf);

/* Plain sockets only: what h2_sock_read found. */
typedef enum h2_read_result {
    H2_READ_AGAIN, /* drained for now (EAGAIN), or read its share of the loop pass */
    H2_READ_EOF,   /* the peer closed its side */
    H2_READ_ERROR, /* recv failed; errno says why */
    H2_READ_FED,   /* feed returned false: the caller ends the connection */
} h2_read_result;

/* Plain sockets only: reads fd straight into a stack buffer and hands each chunk to feed (the
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

/* Tells rpc_loop_run (loop.c) that this thread's loop did work: a read or a posted completion. */
void h2_loop_activity(void);

/* Routes libevent's and nghttp2's own logs into st_log once per process. */
void h2_logging_init(void);

#endif
