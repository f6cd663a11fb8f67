/* h2io.c — the connection plumbing shared by the server and the client, below HTTP/2: the
 * connections' write queue that writes without copying large payloads (h2_wbuf, h2_out_*;
 * under TLS, tlsio.c encrypts what it holds),
 * socket reads straight into the session (h2_sock_read), Unix-domain addresses, the nghttp2
 * session options, and libevent's log routed into st_log. rpc_internal.h explains each. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <event2/buffer.h>
#include <nghttp2/nghttp2.h>

#include "rpc_internal.h"

/* libevent's warnings mostly come from one socket or connection (a failed accept, a failed
 * read), so a peer can make them repeat: they pass at the rate of ST_LOG_LIMITED. */
static void libevent_log_cb(int severity, const char *msg) {
    static st_ratelimit rl;
    uint64_t suppressed;
    if (severity < EVENT_LOG_WARN) {
        st_log(ST_LOG_DEBUG, "libevent", "msg=\"%s\"", msg);
        return;
    }
    if (st_ratelimit_pass(&rl, &suppressed))
        st_log(severity >= EVENT_LOG_ERR ? ST_LOG_ERROR : ST_LOG_WARN, "libevent",
               "msg=\"%s\" suppressed=%llu", msg, (unsigned long long)suppressed);
}

void h2_logging_init(void) {
    /* Idempotent and harmless to repeat; the setters take plain function pointers. */
    event_set_log_callback(libevent_log_cb);
}

static void wbuf_release_retired(h2_wbuf *w) {
    for (size_t i = 0; i < w->nretired; i++)
        free(w->retired[i]);
    w->nretired = 0;
}

void h2_wbuf_free(h2_wbuf *w) {
    st_buf_free(&w->buf);
    st_buf_free(&w->tls_out);
    wbuf_release_retired(w);
    w->nsegs = 0;
    w->ref_bytes = 0;
}

bool h2_wbuf_retire(h2_wbuf *w, void *block) {
    if (w->nretired == H2_OUT_SEGS_MAX)
        return false;
    w->retired[w->nretired++] = block;
    return true;
}

#define H2_WBUF_KEEP_BYTES ((size_t)256 << 10) /* a larger flat buffer is freed once written */

void h2_wbuf_drop(h2_wbuf *w) {
    if (w->buf.cap > H2_WBUF_KEEP_BYTES)
        st_buf_free(&w->buf);
    else
        st_buf_reset(&w->buf);
    wbuf_release_retired(w);
    w->nsegs = 0;
    w->ref_bytes = 0;
}

bool h2_out_add(struct bufferevent *bev, h2_wbuf *wbuf, const void *data, size_t len) {
    struct evbuffer *out = bufferevent_get_output(bev);
    if (!wbuf || (!wbuf->ssl && evbuffer_get_length(out) > 0))
        return evbuffer_add(out, data, len) == 0;
    size_t off = wbuf->buf.len;
    if (st_buf_append(&wbuf->buf, data, len) != ST_OK)
        return false;
    if (wbuf->nsegs > 0) { /* h2_out_add_ref always leaves room for this segment */
        h2_out_seg *last = &wbuf->segs[wbuf->nsegs - 1];
        if (!last->ref)
            last->len += len;
        else
            wbuf->segs[wbuf->nsegs++] = (h2_out_seg){NULL, off, len};
    }
    return true;
}

bool h2_out_add_ref(struct bufferevent *bev, h2_wbuf *wbuf, const void *data, size_t len) {
    /* Room for this segment, the flat one before it and one after (see h2_out_add). */
    if (!wbuf || wbuf->ssl || len < H2_OUT_REF_BYTES_MIN || wbuf->nsegs + 3 > H2_OUT_SEGS_MAX ||
        evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        return h2_out_add(bev, wbuf, data, len);
    if (wbuf->nsegs == 0 && wbuf->buf.len > 0)
        wbuf->segs[wbuf->nsegs++] = (h2_out_seg){NULL, 0, wbuf->buf.len};
    wbuf->segs[wbuf->nsegs++] = (h2_out_seg){data, 0, len};
    wbuf->ref_bytes += len;
    return true;
}

size_t h2_out_len(struct bufferevent *bev, const h2_wbuf *wbuf) {
    size_t n = evbuffer_get_length(bufferevent_get_output(bev));
    return wbuf ? n + wbuf->buf.len + wbuf->ref_bytes : n;
}

/* For a plain wbuf, wbuf is empty while the bufferevent holds bytes (h2_out_add). */
bool h2_bev_output_write(struct bufferevent *bev) {
    struct evbuffer *out = bufferevent_get_output(bev);
    if (evbuffer_get_length(out) == 0)
        return true;
    /* A socket bufferevent keeps the front of its output frozen except while it writes itself;
     * do as it does (bufferevent_sock.c) for the length of this write. */
    evbuffer_unfreeze(out, 1);
    evbuffer_write(out, bufferevent_getfd(bev)); /* EAGAIN or an error: left queued */
    evbuffer_freeze(out, 1);
    if (evbuffer_get_length(out) > 0) {
        bufferevent_enable(bev, EV_WRITE);
        return false;
    }
    return true;
}

/* Segment i of wbuf as a pointer (the flat buffer may have moved since it was queued). */
static const uint8_t *seg_data(const h2_wbuf *wbuf, size_t i) {
    const h2_out_seg *sg = &wbuf->segs[i];
    return sg->ref ? sg->ref : wbuf->buf.data + sg->off;
}

/* One sendmsg of everything queued; returns the bytes the socket took. */
static size_t wbuf_send(int fd, const h2_wbuf *wbuf) {
    struct iovec iov[H2_OUT_SEGS_MAX];
    struct msghdr mh = {.msg_iov = iov};
    if (wbuf->nsegs == 0) {
        iov[0] = (struct iovec){wbuf->buf.data, wbuf->buf.len};
        mh.msg_iovlen = 1;
    } else {
        for (size_t i = 0; i < wbuf->nsegs; i++)
            iov[i] = (struct iovec){(void *)seg_data(wbuf, i), wbuf->segs[i].len};
        mh.msg_iovlen = wbuf->nsegs;
    }
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n > 0 ? (size_t)n : 0;
}

/* Copies what the socket did not take (all but the first `done` bytes) into the bufferevent. */
static bool wbuf_spill(struct evbuffer *out, const h2_wbuf *wbuf, size_t done) {
    if (wbuf->nsegs == 0)
        return evbuffer_add(out, wbuf->buf.data + done, wbuf->buf.len - done) == 0;
    for (size_t i = 0; i < wbuf->nsegs; i++) {
        size_t len = wbuf->segs[i].len;
        if (done >= len) {
            done -= len;
            continue;
        }
        if (evbuffer_add(out, seg_data(wbuf, i) + done, len - done) != 0)
            return false;
        done = 0;
    }
    return true;
}

bool h2_out_write_now(struct bufferevent *bev, h2_wbuf *wbuf) {
    if (wbuf->ssl)
        return h2_tls_write_now(bev, wbuf);
    bool wrote = evbuffer_get_length(bufferevent_get_output(bev)) > 0;
    if (!h2_bev_output_write(bev))
        return false; /* wbuf is empty while the bufferevent holds bytes */
    size_t total = wbuf->buf.len + wbuf->ref_bytes;
    if (total > 0) {
        size_t done = wbuf_send(bufferevent_getfd(bev), wbuf);
        wrote = done == total;
        if (!wrote) {
            /* The socket is full (or failed): the bufferevent writes the rest when it can, or
             * reports the error to the event callback. */
            if (!wbuf_spill(bufferevent_get_output(bev), wbuf, done))
                shutdown(bufferevent_getfd(bev), SHUT_RDWR); /* lost bytes: end the connection */
            bufferevent_enable(bev, EV_WRITE);
        }
        h2_wbuf_drop(wbuf);
        if (!wrote)
            return false;
    }
    if (bufferevent_get_enabled(bev) & EV_WRITE)
        bufferevent_disable(bev, EV_WRITE);
    return wrote;
}

bool h2_unix_addr(const char *path, struct sockaddr_un *sa, socklen_t *len) {
    size_t n = strlen(path);
    if (n == 0 || n > RPC_UNIX_PATH_MAX)
        return false;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return true;
}

nghttp2_option *h2_session_option(void) {
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0)
        return NULL;
    nghttp2_option_set_no_http_messaging(opt, 1);
    return opt;
}

#define H2_READ_CHUNK_BYTES ((size_t)32 << 10)
#define H2_READ_ROUNDS 4

h2_read_result h2_sock_read(int fd, bool (*feed)(void *arg, const uint8_t *data, size_t len),
                            void *arg) {
    uint8_t buf[H2_READ_CHUNK_BYTES];
    for (int round = 0; round < H2_READ_ROUNDS; round++) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0)
            return H2_READ_EOF;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? H2_READ_AGAIN : H2_READ_ERROR;
        }
        h2_loop_activity();
        if (!feed(arg, buf, (size_t)n))
            return H2_READ_FED;
        if ((size_t)n < sizeof buf)
            break; /* most likely drained: skip the recv that would only say EAGAIN */
    }
    return H2_READ_AGAIN;
}
