/* TLS for the RPC layer: contexts with ALPN h2, and the plain/TLS transport table. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "rpc_internal.h"

static const unsigned char alpn_h2[] = {2, 'h', '2'};

static void tls_err_text(char *out, size_t n) {
    unsigned long e = ERR_get_error();
    if (e == 0)
        snprintf(out, n, "no OpenSSL error queued");
    else
        ERR_error_string_n(e, out, n);
    ERR_clear_error();
}

static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl;
    (void)arg;
    /* Only h2: a peer that cannot speak HTTP/2 cannot speak gRPC. */
    for (unsigned int i = 0; i < inlen;) {
        unsigned int l = in[i];
        if (i + 1 + l > inlen)
            break;
        if (l == 2 && memcmp(in + i + 1, "h2", 2) == 0) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + l;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

st_code rpc_tls_server_ctx_prepare(SSL_CTX *ctx, st_err *err) {
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION))
        return st_err_set(err, ST_INTERNAL, "cannot require TLS 1.2");
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION |
                                 SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, NULL);
    return ST_OK;
}

st_code rpc_tls_client_ctx_prepare(SSL_CTX *ctx, st_err *err) {
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION))
        return st_err_set(err, ST_INTERNAL, "cannot require TLS 1.2");
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    if (SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof(alpn_h2)) != 0)
        return st_err_set(err, ST_INTERNAL, "cannot set ALPN h2");
    return ST_OK;
}

SSL_CTX *rpc_tls_server_ctx_new(const char *cert_path, const char *key_path,
                                const char *client_ca_path, st_err *err) {
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INTERNAL, "SSL_CTX_new failed: %s", why);
        return NULL;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INVALID_ARGUMENT,
                   "cannot load TLS certificate %s / key %s (%s); check the paths and that the "
                   "key matches the certificate",
                   cert_path, key_path, why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (client_ca_path) {
        if (SSL_CTX_load_verify_locations(ctx, client_ca_path, NULL) != 1) {
            tls_err_text(why, sizeof(why));
            st_err_set(err, ST_INVALID_ARGUMENT, "cannot load client CA %s: %s", client_ca_path,
                       why);
            SSL_CTX_free(ctx);
            return NULL;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    if (rpc_tls_server_ctx_prepare(ctx, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

SSL_CTX *rpc_tls_client_ctx_new(const char *ca_path, const char *cert_path, const char *key_path,
                                st_err *err) {
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INTERNAL, "SSL_CTX_new failed: %s", why);
        return NULL;
    }
    if (ca_path) {
        if (SSL_CTX_load_verify_locations(ctx, ca_path, NULL) != 1) {
            tls_err_text(why, sizeof(why));
            st_err_set(err, ST_INVALID_ARGUMENT, "cannot load CA %s: %s", ca_path, why);
            SSL_CTX_free(ctx);
            return NULL;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    } else {
        st_log(ST_LOG_WARN, "rpc", "msg=\"TLS client without a CA: server NOT verified\"");
    }
    if (cert_path && key_path &&
        (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1 ||
         SSL_CTX_use_PrivateKey_file(ctx, key_path, SSL_FILETYPE_PEM) != 1)) {
        tls_err_text(why, sizeof(why));
        st_err_set(err, ST_INVALID_ARGUMENT, "cannot load client certificate %s: %s", cert_path,
                   why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (rpc_tls_client_ctx_prepare(ctx, err) != ST_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* ---- transports ---- */

static struct bufferevent *plain_bev_new(struct event_base *base, int fd, SSL_CTX *ctx, bool server,
                                         const char *server_name) {
    (void)ctx;
    (void)server;
    (void)server_name;
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!bev && fd >= 0)
        close(fd);
    return bev;
}

static bool plain_negotiated_h2(struct bufferevent *bev) {
    (void)bev;
    return true; /* h2c with prior knowledge, as gRPC does */
}

static struct bufferevent *tls_bev_new(struct event_base *base, int fd, SSL_CTX *ctx, bool server,
                                       const char *server_name) {
    SSL *ssl = SSL_new(ctx);
    if (!ssl) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!server && server_name) {
        unsigned char ip[16];
        bool is_ip =
            inet_pton(AF_INET, server_name, ip) == 1 || inet_pton(AF_INET6, server_name, ip) == 1;
        if (is_ip) {
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name);
        } else {
            SSL_set_tlsext_host_name(ssl, server_name);
            SSL_set1_host(ssl, server_name);
        }
    }
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, fd, ssl, server ? BUFFEREVENT_SSL_ACCEPTING : BUFFEREVENT_SSL_CONNECTING,
        BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

static bool tls_negotiated_h2(struct bufferevent *bev) {
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    const unsigned char *proto = NULL;
    unsigned int len = 0;
    if (!ssl)
        return false;
    SSL_get0_alpn_selected(ssl, &proto, &len);
    return len == 2 && memcmp(proto, "h2", 2) == 0;
}

const h2_transport h2_transport_plain = {"plain", plain_bev_new, plain_negotiated_h2};
const h2_transport h2_transport_tls = {"tls", tls_bev_new, tls_negotiated_h2};

static void libevent_log_cb(int severity, const char *msg) {
    st_log_level lvl = severity >= EVENT_LOG_ERR    ? ST_LOG_ERROR
                       : severity >= EVENT_LOG_WARN ? ST_LOG_WARN
                                                    : ST_LOG_DEBUG;
    st_log(lvl, "libevent", "msg=\"%s\"", msg);
}

void h2_logging_init(void) {
    /* Idempotent and harmless to repeat; the setters take plain function pointers. */
    event_set_log_callback(libevent_log_cb);
}

void h2_wbuf_init(h2_wbuf *w) {
    st_buf_init(&w->buf);
    w->nsegs = 0;
    w->ref_bytes = 0;
    w->nretired = 0;
}

static void wbuf_release_retired(h2_wbuf *w) {
    for (size_t i = 0; i < w->nretired; i++)
        free(w->retired[i]);
    w->nretired = 0;
}

void h2_wbuf_free(h2_wbuf *w) {
    st_buf_free(&w->buf);
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
    if (!wbuf || evbuffer_get_length(out) > 0)
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
    if (!wbuf || len < H2_OUT_REF_BYTES_MIN || wbuf->nsegs + 3 > H2_OUT_SEGS_MAX ||
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

/* The bufferevent still holds bytes the socket did not take (wbuf is empty then): try them now;
 * true when the output is empty afterwards. */
static bool bev_output_write(struct bufferevent *bev) {
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
    bool wrote = evbuffer_get_length(bufferevent_get_output(bev)) > 0;
    if (!bev_output_write(bev))
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
