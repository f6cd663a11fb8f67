/* Private to the server side of proto/rpc: the objects the server's files share.
 *   server.c        rpc_server: creation, the method table, the cross-thread post queue, stats;
 *   server_listen.c listeners: accepting, the connection limit, pausing when out of descriptors;
 *   server_conn.c   h2_conn: one per connection (bufferevent, nghttp2 session, timeouts);
 *   server_call.c   rpc_call: one per stream (request, response queue, the rpc_call_* API). */
#ifndef STRATA_RPC_SERVER_INTERNAL_H
#define STRATA_RPC_SERVER_INTERNAL_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "rpc_internal.h"
#include "rpc_metrics.h"

#define STAT_ADD(srv, field, n)                                                                    \
    __atomic_fetch_add(&(srv)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED)
#define STAT_SUB(srv, field, n)                                                                    \
    __atomic_fetch_sub(&(srv)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED)
#define RPC_LISTENERS_MAX 8
#define RPC_METHODS_MAX 1024
/* rpc_call.content_type */
#define RPC_CT_BAD 0        /* missing, or not gRPC's media type: HTTP 415 */
#define RPC_CT_PROTO 1      /* application/grpc, application/grpc+proto */
#define RPC_CT_CODEC 2      /* application/grpc+OTHER: a codec the server does not speak */
#define CONN_TICK_MS_MIN 5u /* connection timers fire at most this often */
#define CONN_TICK_MS_MAX 60000u

typedef struct rpc_method_ent {
    char *path;
    rpc_handler_fn handler;
    void *arg;
} rpc_method_ent;

/* What an rpc_post holds (strata/rpc.h keeps it opaque). Its bytes are a character array to
 * the caller's compiler, so they are read and written with memcpy (post_get, post_set). */
typedef struct post_fields {
    void (*fn)(void *arg);
    void *arg;
    rpc_post *next;
    bool owned; /* allocated by rpc_server_post (freed by the server), not embedded */
} post_fields;
_Static_assert(sizeof(post_fields) <= sizeof(rpc_post), "an rpc_post holds the queue's fields");

static inline post_fields post_get(const rpc_post *p) {
    post_fields f;
    memcpy(&f, p->opaque, sizeof f);
    return f;
}
static inline void post_set(rpc_post *p, post_fields f) {
    memcpy(p->opaque, &f, sizeof f);
}

typedef struct h2_conn h2_conn;

/* Stream resets a peer may send before nghttp2 closes the connection (its rapid-reset guard:
 * by default a burst of 1000, then 33 a second). A server's own user on its Unix socket (a
 * router of this host) gets far more: the router cancels the node calls of reads whose clients
 * stopped reading, one reset each, and with the default the router had to ration them, so a
 * client holding some thousands of unread scans kept every other read of the node waiting for
 * the ration for tens of seconds. */
#define H2_UNIX_OWNER_RESET_BURST 1000000
#define H2_UNIX_OWNER_RESETS_PER_S 100000

struct rpc_server {
    struct event_base *base;
    rpc_server_opts opts; /* defaults filled in */
    rpc_method_ent *methods;
    size_t methods_len;
    struct evconnlistener *listeners[RPC_LISTENERS_MAX];
    size_t listeners_len;
    /* TCP sockets bound by rpc_server_bind that do not listen yet (rpc_server_listen_bound). */
    int bound[RPC_LISTENERS_MAX];
    size_t bound_len;
    /* Unix-domain listeners' socket files, removed by rpc_server_free when still ours (same
     * device and inode as bound: a later server may have replaced the file meanwhile). */
    struct {
        char *path;
        dev_t dev;
        ino_t ino;
    } unix_files[RPC_LISTENERS_MAX];
    size_t unix_len;
    h2_conn *conns;
    /* The connections without calls, longest idle first (idle_since_us ascending): at the
     * connection limit the first is closed to admit a new connection (h2_conn_evict_idle). */
    h2_conn *idle_head, *idle_tail;
    /* The connections still in their handshake (TLS, or the client's HTTP/2 preface and
     * SETTINGS not yet in), oldest first (accepted_us ascending): at the connection limit the
     * first of these is closed before any established connection. */
    h2_conn *hs_head, *hs_tail;
    pthread_mutex_t post_mu;
    rpc_post *post_head, *post_tail;
    size_t post_len;
    int post_fd;
    struct event *post_ev;
    rpc_server_stats stats;   /* updated and read with __atomic builtins */
    rpc_metrics metrics;      /* per-method counters and latencies (loop thread; rpc_metrics.h) */
    rpc_limits limits;        /* the process's limits when created; connections_max resolved */
    struct timeval conn_tick; /* period of each connection's timer (zero: no timer) ... */
    struct timeval conn_tick_ready; /* ... and once its preface arrived */
    /* accept() failed for lack of descriptors or memory: the listeners pause and accept_ev
     * resumes them after accept_backoff_ms, which doubles while failures go on. */
    struct event *accept_ev;
    uint32_t accept_backoff_ms;
    bool accept_paused;
    /* Calls waiting for the queued-response budget (rpc_call_writable), oldest first, and the
     * one woken to produce next (NULL: none pending). One at a time, so the budget is passed by
     * at most one message and waiters resume in the order they started waiting. */
    rpc_call *waiters_head, *waiters_tail;
    rpc_call *budget_woken;
    /* rpc_server_set_gate: runs before every handler (NULL: none). */
    rpc_gate_fn gate;
    void *gate_arg;
    rpc_guard_fn guard; /* rpc_server_set_guard; NULL: every call runs */
    void *guard_arg;
};

struct h2_conn {
    rpc_server *srv;
    struct bufferevent *bev;
    nghttp2_session *session;
    rpc_call *calls;
    size_t request_bytes; /* request bytes buffered by this connection's calls */
    /* API calls (send, finish) only queue frames and activate this event, which flushes from the
     * loop: so no API function re-enters user callbacks or closes the connection under them. */
    struct event *flush_ev;
    /* Output goes to wbuf and h2_conn_flush writes it itself (h2_out_write_now), read_ev reads
     * the socket (h2_sock_read); the bufferevent only writes what the socket would not take at
     * once. Plaintext: large DATA payloads in wbuf are references into their call's `out`,
     * written before anything frees, moves or overwrites those bytes (conn_out_settle). TLS:
     * wbuf.ssl (tlsio.c) decrypts what is read and encrypts what is written. */
    h2_wbuf wbuf;
    struct event *read_ev;
    /* Periodic: the handshake, idle and slow-request timeouts (conn_timer_cb). */
    struct event *timer_ev;
    uint64_t serial;       /* rpc_call_conn_serial: numbered as accepted, from 1 */
    int64_t accepted_us;   /* st_mono_us */
    int64_t idle_since_us; /* when its last call ended or, without calls, it last heard the peer */
    bool ready;            /* the client's preface and SETTINGS arrived */
    bool tick_ready;       /* the timer runs at conn_tick_ready */
    bool slot;             /* holds one of the process's connection slots */
    bool idle_listed;      /* in srv's idle list (idle_prev, idle_next) */
    h2_conn *idle_prev, *idle_next;
    bool hs_listed; /* in srv's handshake list (hs_prev, hs_next) until ready */
    h2_conn *hs_prev, *hs_next;
    char peer[RPC_CALL_PEER_MAX + 1]; /* "ip:port", "[ip6]:port" or "unix" (rpc_call_peer) */
    bool role_known;                  /* peer_role was read from the peer's certificate */
    bool unix_owner; /* a Unix socket of a server with unix_peer_role: the owner's own process */
    char peer_role[RPC_ROLE_MAX + 1];
    void *memo; /* rpc_call_conn_memo: memo_size bytes, cleansed and freed with the connection */
    size_t memo_size;
    h2_conn *prev, *next;
};

typedef struct call_hdr {
    const char *name;
    const char *value;
} call_hdr;

struct rpc_call {
    int refs;
    h2_conn *conn; /* NULL once detached */
    int32_t stream_id;
    st_arena arena;
    const rpc_method_ent *method;
    const char *path;
    size_t hdrs_len;
    size_t hdr_bytes;
    size_t hdr_text_used; /* of hdr_text */
    st_err early;         /* a header problem found while parsing, reported at END_HEADERS */
    int http_status;
    bool saw_post;
    uint8_t pseudo_seen;  /* bit i: the i-th of :method :path :scheme :authority arrived */
    uint8_t content_type; /* RPC_CT_*: what the request's content-type said */
    char codec[32];       /* the codec it named when RPC_CT_CODEC (cut, for the error) */
    int64_t deadline_us;
    struct event *deadline_ev; /* NULL, or the timer at the end of the call's allocation */
    rpc_deframer deframer;
    st_buf request;
    size_t request_skip;     /* bytes before the message in request (a taken deframer buffer) */
    size_t request_bytes;    /* reserved in conn->request_bytes (given back when detached) */
    size_t mem_reserved;     /* reserved in the process's budget (given back when released) */
    size_t request_received; /* request DATA bytes so far */
    size_t announced_bytes;  /* the request as its message prefix announced it (prefix incl.) */
    int64_t slow_mark_us;    /* the slow-request check's window start ... */
    size_t slow_mark_bytes;  /* ... and request_received then */
    bool headers_done;       /* the request's header block ended (END_HEADERS) */
    bool dispatched, finished, cancelled, headers_sent, handler_ref, was_full;
    bool metered;     /* recorded in the server's metrics (once, at its final status) */
    int64_t start_us; /* st_mono_us when its headers began: the latency metric's start */
    st_code status;
    const char *status_msg; /* percent-encoded, in the arena */
    st_buf out;             /* framed response bytes; [out_off, out.len) still queued */
    size_t out_off;
    void (*on_cancel)(rpc_call *, void *);
    void *on_cancel_arg;
    void (*on_writable)(rpc_call *, void *);
    void *on_writable_arg;
    struct event *notify_ev;
    size_t held; /* bytes the handler holds for the call outside its queue (rpc_call_hold) */
    bool budget_waiting; /* in srv's waiter list */
    bool budget_granted; /* woken from it: may queue one message whatever the budget */
    rpc_call *wait_prev, *wait_next;
    rpc_call *prev, *next;
    char code_text[12], http_text[12]; /* grpc-status and :status values of the final HEADERS */
    /* Not zeroed by call_new (only [0, hdrs_len) and [0, hdr_text_used) are ever read): */
    call_hdr hdrs[RPC_HEADERS_COUNT_MAX];
    /* Request header names and values, NUL-terminated; the arena takes what does not fit. A
     * typical request's headers fit, so most calls allocate nothing for them. */
    char hdr_text[1024];
};

/* ---- shared between the server's files ---- */

/* The method registered at path, or NULL (server.c). */
const rpc_method_ent *rpc_server_method_find(const rpc_server *srv, const char *path);
/* Creates the connection for an accepted socket (server_conn.c): takes fd and one connection
 * slot already taken (rpc_conn_slot_take), both released when the connection closes or fails
 * to start. */
void h2_conn_open(rpc_server *srv, int fd, const struct sockaddr *addr);
/* The one close function every connection failure reaches: detaches its calls, frees it. */
void h2_conn_close(h2_conn *conn);
/* conn has no calls: it is idle from now on (idle_since_us), and last in its server's idle
 * list. */
void h2_conn_idle_mark(h2_conn *conn);
/* conn's first call started: it leaves its server's idle list. */
void h2_conn_idle_leave(h2_conn *conn);
/* The client's preface and SETTINGS arrived: conn is ready and leaves the handshake list. */
void h2_conn_handshake_done(h2_conn *conn);
/* At the connection limit: closes a connection so that a new one can be admitted. The oldest
 * connection still in its handshake (TLS, or no HTTP/2 preface and SETTINGS yet) goes first;
 * only when there is none, the established connection idle the longest (no call open, nothing
 * heard for the longest time). False when every connection has a call open. */
bool h2_conn_evict_idle(rpc_server *srv);
/* Hands nghttp2's output to the socket; false when the connection is done or failed. */
bool h2_conn_flush(h2_conn *conn);
/* User code queued output: flush it from the loop (re-activating an active event is a no-op). */
void h2_conn_kick(h2_conn *conn);
/* Where send_cb queues output (see h2_out_add): the connection's wbuf. */
h2_wbuf *h2_conn_wbuf(h2_conn *conn);
/* wbuf may reference bytes of calls' response queues: write them out before a queue is
 * compacted, handed back to a caller, or freed. */
void h2_conn_out_settle(h2_conn *conn);
/* The stream is gone (closed normally, reset, or its connection died): server_call.c. */
void rpc_call_detach(rpc_call *call);
/* Ends the calls of conn whose request arrives slower than the limits allow (server_call.c).
 * False when the connection must close: a request's header block stalled unfinished, and
 * HTTP/2 lets no other frame through until it ends. */
bool rpc_calls_check_slow(h2_conn *conn, int64_t now);
/* Ends every unfinished call of conn with code and why, as a deadline would: its trailers follow
 * what it queued, and its handler is cancelled (server_call.c, for rpc_server_shutdown). */
void rpc_calls_end(h2_conn *conn, st_code code, const char *why);
/* Sends conn a GOAWAY (NO_ERROR, why): its client sends no new call on it; the connection closes
 * once its calls are done. One still in its handshake closes at once (server_conn.c). */
void h2_conn_goaway(h2_conn *conn, const char *why);
/* Registers the request and response callbacks of server_call.c on a session's callbacks. */
void rpc_call_session_callbacks(nghttp2_session_callbacks *cbs);
/* Closes the listeners and removes the Unix socket files still ours (server_listen.c). */
void rpc_server_listeners_free(rpc_server *s);

#endif
