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

/* Plain sockets only (server and client connections): writes the bufferevent's output to its
 * socket now, from the loop callback that produced it, instead of arming the write event and
 * writing on the next loop pass, so a request or response costs one loop pass and no epoll_ctl
 * pair. The write event stays disarmed while the output is empty and is armed when the socket is
 * full or the write failed (the bufferevent then writes the rest, or reports the error). Returns
 * true when it wrote something and the output is now empty: the caller's HTTP/2 session may
 * have more to produce if it had stopped at the output high-water mark. */
bool h2_bev_write_now(struct bufferevent *bev);

/* Routes libevent's and nghttp2's own logs into st_log once per process. */
void h2_logging_init(void);

#endif
