/* Private to the client side of proto/rpc: the objects the client's files share.
 *   client.c          rpc_client: the connection (dial over TCP, TLS or a Unix socket, output,
 *                     keepalive PINGs, GOAWAY draining, failure and its logging);
 *   client_call.c     rpc_ccall: one per stream (allocation, submission, the stream callbacks,
 *                     completion, deadlines, cancellation, the unary helper);
 *   client_blocking.c rpc_blocking_unary / rpc_blocking_stream: one call on a base of their own,
 *                     for tests and command-line tools. */
#ifndef STRATA_RPC_CLIENT_INTERNAL_H
#define STRATA_RPC_CLIENT_INTERNAL_H

#include "rpc_internal.h"

#define RPC_PEER_NAME_MAX 320 /* "unix:" + a socket path, or host:port */

/* The calls of one owner (client_call.c): how many are not completed, how many have a stream,
 * and those held for a stream, oldest first. */
#define RPC_HOLD_BUCKETS 64
typedef struct rpc_hold_group rpc_hold_group;
struct rpc_hold_group {
    uint64_t owner;
    size_t members, open;
    rpc_ccall *head, *tail;
    rpc_hold_group *ring_prev, *ring_next; /* in rpc_client.hold_ring while it holds calls */
    rpc_hold_group *hash_next;             /* in rpc_client.hold_hash (owner != 0) */
};

struct rpc_client {
    struct event_base *base;
    rpc_client_opts opts;
    char *host;                       /* :authority and TLS name: the host, or "unix:PATH" */
    char peer[RPC_PEER_NAME_MAX + 1]; /* for logs and errors: "host:port" or "unix:PATH" */
    struct bufferevent *bev;
    nghttp2_session *session;
    rpc_ccall *calls;
    bool dead;
    bool connected; /* BEV_EVENT_CONNECTED seen (TLS: and the handshake finished) */
    bool is_unix;   /* a Unix-domain socket (rpc_client_new_unix) */
    /* Once connected (TLS: from the TCP connect on), reads the socket itself (h2_sock_read), the
     * bufferevent does not; output goes to wbuf (rpc_client_wbuf). TLS: wbuf.ssl (tlsio.c). */
    struct event *read_ev;
    h2_wbuf wbuf;
    struct event *hs_ev; /* TLS: ends a handshake not done within the connect timeout */
    /* API calls only queue frames and activate this event, which flushes from the loop: so no
     * API function runs a user callback (on_done) before it returns. */
    struct event *flush_ev;
    char fail_msg[256];
    uint32_t timeouts_sent; /* requests sent with grpc-timeout (ccall_submit) */
    /* The server sent GOAWAY: the calls it accepted finish here, new ones are refused
     * (rpc_client_alive is false, so the owner dials a new connection), and the connection
     * closes once the last call ended. */
    bool draining;
    int64_t last_read_us; /* st_mono_us of the last bytes received (0: none yet) */
    /* Keepalive (rpc_client_opts): a timer every keepalive_ms once connected; a PING out since
     * ping_sent_us (0: none) with nothing read since fails the connection after the timeout. */
    struct event *ka_ev;
    int64_t ping_sent_us;
    bool silent; /* failed by the keepalive: a silent peer, not a drop (rpc_ccall_conn_lost) */
    /* The server sent GOAWAY(NO_ERROR): it announced its end (a restart, a stop), so a failure
     * after it cuts the calls left for that reason, not a crash under them: no drop either. */
    bool goaway_clean;
    size_t n_calls; /* calls not yet completed */
    size_t lost;    /* sent calls lost when the connection failed (rpc_client_lost) */
    /* Calls whose stream is open (submitted to nghttp2, not yet closed), and the calls held back
     * here, oldest first, while the server's SETTINGS_MAX_CONCURRENT_STREAMS are all open
     * (client_call.c, ccall_start): a held call has no stream yet, so its cancellation or
     * deadline ends it here without a frame (a RST_STREAM for a stream the server never saw
     * is a connection error), and the next one goes as soon as a stream closes. */
    size_t n_open;
    rpc_ccall *held_head, *held_tail;
    size_t held_cancelled; /* held calls cancelled, to be ended from the loop (flush_cb) */
    /* The calls again, by owner (rpc_ccall_set_owner): a stream that frees goes to the oldest
     * held call of the owner with the fewest streams open, the next in turn among equals, so
     * one owner's many calls do not hold back another's. hold_ring (the groups with held calls)
     * starts at the next in turn; a group is freed with its last call (hold_group0, the calls
     * without owner, is part of the client). */
    rpc_hold_group *hold_ring;
    /* The group that joined the ring last, until it gets its express turn: every other stream
     * that frees goes to it (held_next_out), so an owner arriving behind many owners that each
     * hold one call waits for one stream, not for all of them. */
    rpc_hold_group *hold_newest;
    bool hold_express_turn;
    rpc_hold_group *hold_hash[RPC_HOLD_BUCKETS];
    rpc_hold_group hold_group0;
};

struct rpc_ccall {
    rpc_client *c;
    int32_t stream_id;
    rpc_deframer deframer;
    rpc_ccall_msg_fn on_msg;
    rpc_ccall_done_fn on_done;
    void *arg;
    const uint8_t *body; /* the framed request, in the call's own allocation */
    size_t body_len, body_off;
    int http_status;
    bool got_status, cancelled, deadline_hit;
    st_code status;
    char message[RPC_GRPC_MESSAGE_MAX];
    st_err local; /* an error found on our side (bad response framing) */
    /* Kept to resubmit a request the server refused before processing it (REFUSED_STREAM, e.g.
     * sent before its SETTINGS_MAX_CONCURRENT_STREAMS arrived), as gRPC clients do. Like the body,
     * they live in the call's one allocation (ccall_alloc). */
    const char *path;
    size_t path_len;
    nghttp2_nv *md; /* lengths known: nghttp2 takes them as they are */
    size_t md_count;
    int64_t deadline_us;   /* st_mono_us; 0 = none */
    char timeout_text[16]; /* the grpc-timeout value of the HEADERS in flight */
    int refused_retries;
    bool unprocessed; /* ended before the server processed it (rpc_ccall_unprocessed) */
    bool sent;        /* its HEADERS went out: the server may be working on it */
    size_t lost_with; /* the connection dropped under it, with this many sent calls (>= 1) */
    struct event *deadline_ev; /* NULL, or the timer inside the call's allocation (added) */
    size_t alloc_bytes;        /* size of the call's allocation (ccall_alloc) */
    /* rpc_ccall_pause: the stream's received bytes are not given back to the server's
     * flow-control window (unconsumed counts them) until rpc_ccall_resume. */
    bool paused;
    size_t unconsumed;
    rpc_ccall *prev, *next;
    bool held; /* waiting in the client's held list for a stream (rpc_client.held_head) */
    rpc_ccall *held_prev, *held_next;
    rpc_hold_group *group; /* its owner's group until it completes (from ccall_start) */
    bool group_open;       /* counted in group->open: it has a stream */
    rpc_ccall *group_prev, *group_next; /* in group's held calls */
};

/* Where output goes (h2_out_add): wbuf once connected or under TLS (plaintext waits there for
 * the handshake), else the bufferevent, which writes it once the connect succeeds. */
static inline h2_wbuf *rpc_client_wbuf(rpc_client *c) {
    return c->connected || c->wbuf.ssl ? &c->wbuf : NULL;
}

/* client.c: user code queued output; flush it from the loop (no user callback runs before the
 * API function that queued it returns). */
void rpc_client_kick(rpc_client *c);

/* client_call.c: ends a call (unlinks it, runs its on_done, frees or caches its allocation). */
void rpc_ccall_complete(rpc_ccall *call, st_code code, const char *message);
/* client_call.c: ends the held calls that were cancelled, and starts held calls while streams
 * are free (or ends them unprocessed once the connection is draining). From the loop only. */
void rpc_ccall_held_run(rpc_client *c);
/* client_call.c: installs the session callbacks that serve the calls' streams. */
void rpc_ccall_session_callbacks(nghttp2_session_callbacks *cbs);

#endif
