/* tlsio.c — TLS on the direct socket path, for server and client connections alike.
 *
 * OpenSSL never sees the socket: the connection reads it itself (h2_sock_read) and hands each
 * chunk to h2_tls_recv, and its write queue (h2_wbuf) encrypts everything a flush queued with one
 * SSL_write and sends the records with one send(), spilling what the socket does not take into
 * the bufferevent as plaintext connections do. So TLS costs the cipher and little else: no read
 * of 5 bytes then of a record, no syscall per record written, no evbuffer chains, and the same
 * one loop pass per request as plaintext. rpc_internal.h documents each function. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "rpc_internal.h"

/* ---- the BIO between OpenSSL and the write queue ----
 * Reads come from the chunk h2_tls_recv was handed (wbuf->tls_in; none left: "retry", like an
 * empty non-blocking socket; OpenSSL keeps a partial record itself), writes append to
 * wbuf->tls_out. Neither blocks, so SSL_write never asks to be retried. The method table is
 * made once per process (pthread_once) and only read afterwards. */
static BIO_METHOD *tls_bio_method;
static pthread_once_t tls_bio_once = PTHREAD_ONCE_INIT;

static int tls_bio_write(BIO *b, const char *in, int inl) {
    h2_wbuf *w = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (inl <= 0)
        return 0;
    return st_buf_append(&w->tls_out, in, (size_t)inl) == ST_OK ? inl : -1;
}

static int tls_bio_read(BIO *b, char *out, int outl) {
    h2_wbuf *w = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (outl <= 0)
        return 0;
    if (w->tls_in_len == 0) {
        BIO_set_retry_read(b);
        return -1;
    }
    size_t n = w->tls_in_len < (size_t)outl ? w->tls_in_len : (size_t)outl;
    memcpy(out, w->tls_in, n);
    w->tls_in += n;
    w->tls_in_len -= n;
    return (int)n;
}

static long tls_bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static void tls_bio_method_init(void) {
    int idx = BIO_get_new_index();
    BIO_METHOD *m = idx > 0 ? BIO_meth_new(idx | BIO_TYPE_SOURCE_SINK, "strata-h2") : NULL;
    if (m && BIO_meth_set_write(m, tls_bio_write) && BIO_meth_set_read(m, tls_bio_read) &&
        BIO_meth_set_ctrl(m, tls_bio_ctrl)) {
        tls_bio_method = m;
        return;
    }
    BIO_meth_free(m);
}

/* ---- setting up and closing ---- */

static void tls_set_peer_name(SSL *ssl, const char *server_name) {
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

bool h2_tls_attach(h2_wbuf *w, SSL_CTX *ctx, bool server, const char *server_name) {
    pthread_once(&tls_bio_once, tls_bio_method_init);
    if (!tls_bio_method)
        return false;
    SSL *ssl = SSL_new(ctx);
    BIO *bio = ssl ? BIO_new(tls_bio_method) : NULL;
    if (!bio) {
        SSL_free(ssl);
        ERR_clear_error();
        return false;
    }
    BIO_set_data(bio, w);
    BIO_set_init(bio, 1);
    SSL_set_bio(ssl, bio, bio); /* one reference, for both directions */
    /* Whole chunks into OpenSSL's buffer, not a 5-byte header then the record. */
    SSL_set_read_ahead(ssl, 1);
    if (server) {
        SSL_set_accept_state(ssl);
    } else {
        SSL_set_connect_state(ssl);
        if (server_name)
            tls_set_peer_name(ssl, server_name);
    }
    w->ssl = ssl;
    w->tls_broken = false;
    return true;
}

bool h2_tls_established(const h2_wbuf *w) {
    return !w->ssl || SSL_is_init_finished(w->ssl);
}

bool h2_tls_alpn_h2(const h2_wbuf *w) {
    const unsigned char *proto = NULL;
    unsigned int len = 0;
    if (!w->ssl)
        return false;
    SSL_get0_alpn_selected(w->ssl, &proto, &len);
    return len == 2 && memcmp(proto, "h2", 2) == 0;
}

/* ---- output ---- */

#define TLS_OUT_KEEP_BYTES ((size_t)256 << 10) /* a larger ciphertext buffer is freed once sent */

static void tls_out_reset(h2_wbuf *w) {
    if (w->tls_out.cap > TLS_OUT_KEEP_BYTES)
        st_buf_free(&w->tls_out);
    else
        st_buf_reset(&w->tls_out);
}

/* Sends the ciphertext OpenSSL produced: behind what the bufferevent still holds, else with one
 * send() and what the socket does not take into the bufferevent. True when all went out. */
static bool tls_out_send(struct bufferevent *bev, h2_wbuf *w) {
    st_buf *o = &w->tls_out;
    if (o->len == 0)
        return true;
    struct evbuffer *out = bufferevent_get_output(bev);
    int fd = bufferevent_getfd(bev);
    size_t done = 0;
    if (evbuffer_get_length(out) == 0) {
        ssize_t n;
        do
            n = send(fd, o->data, o->len, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        done = n > 0 ? (size_t)n : 0;
    }
    bool all = done == o->len;
    if (!all) {
        /* The socket is full (or failed): the bufferevent writes the rest when it can, or
         * reports the error to the event callback. */
        if (evbuffer_add(out, o->data + done, o->len - done) != 0)
            shutdown(fd, SHUT_RDWR); /* lost bytes: end the connection */
        bufferevent_enable(bev, EV_WRITE);
    }
    tls_out_reset(w);
    return all;
}

bool h2_tls_write_now(struct bufferevent *bev, h2_wbuf *w) {
    bool wrote = evbuffer_get_length(bufferevent_get_output(bev)) > 0;
    bool drained = h2_bev_output_write(bev);
    if (!SSL_is_init_finished(w->ssl) || w->tls_broken)
        return false; /* plaintext queued before the handshake ended waits for it */
    if (w->buf.len > 0) {
        size_t n = 0;
        if (SSL_write_ex(w->ssl, w->buf.data, w->buf.len, &n) != 1 || n != w->buf.len) {
            ERR_clear_error(); /* only after a fatal error (or out of memory): end it */
            w->tls_broken = true;
            shutdown(bufferevent_getfd(bev), SHUT_RDWR);
            h2_wbuf_drop(w);
            return false;
        }
        h2_wbuf_drop(w);
        wrote = true;
    }
    if (!tls_out_send(bev, w) || !drained)
        return false;
    if (bufferevent_get_enabled(bev) & EV_WRITE)
        bufferevent_disable(bev, EV_WRITE);
    return wrote;
}

bool h2_tls_connect(struct bufferevent *bev, h2_wbuf *w) {
    int r = SSL_do_handshake(w->ssl);
    if (r != 1 && SSL_get_error(w->ssl, r) != SSL_ERROR_WANT_READ) {
        ERR_clear_error();
        w->tls_broken = true;
        return false;
    }
    tls_out_send(bev, w); /* the ClientHello */
    return true;
}

void h2_tls_close(struct bufferevent *bev, h2_wbuf *w) {
    if (!w->ssl)
        return;
    /* close_notify, if it can go out now and in order; the peer sees EOF either way. */
    if (bev && !w->tls_broken && SSL_is_init_finished(w->ssl) &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        SSL_shutdown(w->ssl);
        if (w->tls_out.len > 0)
            (void)!send(bufferevent_getfd(bev), w->tls_out.data, w->tls_out.len,
                        MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ERR_clear_error();
    SSL_free(w->ssl);
    w->ssl = NULL;
    w->tls_in = NULL;
    w->tls_in_len = 0;
    st_buf_free(&w->tls_out);
}

/* ---- input ---- */

/* The first error OpenSSL queued (the cause; later ones follow from it), queue cleared. */
static unsigned long tls_take_error(h2_wbuf *w) {
    unsigned long e = ERR_get_error();
    ERR_clear_error();
    w->tls_broken = true;
    return e;
}

/* What an SSL call that returned r <= 0 means: WANT_READ (all input used) is OK. */
static h2_tls_result tls_call_result(h2_wbuf *w, int r, unsigned long *err) {
    switch (SSL_get_error(w->ssl, r)) {
    case SSL_ERROR_WANT_READ:
        return H2_TLS_OK;
    case SSL_ERROR_ZERO_RETURN:
        return H2_TLS_EOF;
    default:
        *err = tls_take_error(w);
        return H2_TLS_FAILED;
    }
}

#define TLS_PLAIN_BYTES ((size_t)16 << 10) /* one record's payload at most */

/* Decrypts every whole record OpenSSL holds, each handed to sink->feed. */
static h2_tls_result tls_read_records(h2_wbuf *w, const h2_tls_sink *sink, unsigned long *err) {
    uint8_t plain[TLS_PLAIN_BYTES];
    for (;;) {
        size_t n = 0;
        int r = SSL_read_ex(w->ssl, plain, sizeof plain, &n);
        if (r != 1)
            return tls_call_result(w, r, err);
        if (!sink->feed(sink->arg, plain, n))
            return H2_TLS_STOP;
    }
}

h2_tls_result h2_tls_recv(struct bufferevent *bev, h2_wbuf *w, const uint8_t *data, size_t len,
                          const h2_tls_sink *sink, unsigned long *err) {
    *err = 0;
    if (w->tls_broken)
        return H2_TLS_FAILED;
    w->tls_in = data;
    w->tls_in_len = len;
    h2_tls_result res = H2_TLS_OK;
    if (!SSL_is_init_finished(w->ssl)) {
        int r = SSL_do_handshake(w->ssl);
        if (r != 1)
            res = tls_call_result(w, r, err);
        tls_out_send(bev, w); /* handshake messages, or the alert that ends it */
        if (r != 1 || !sink->established(sink->arg))
            return r != 1 ? res : H2_TLS_STOP;
    }
    res = tls_read_records(w, sink, err);
    if (res == H2_TLS_STOP)
        return res; /* the connection may be gone: touch nothing */
    w->tls_in_len = 0;
    tls_out_send(bev, w); /* session tickets, key-update answers, alerts */
    return res;
}

/* The fix for a certificate the verification refused (v, an X509_V_ERR_*), or NULL. */
static const char *tls_verify_fix(long v) {
    switch (v) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
        return "the peer's certificate has expired; issue it a new certificate signed by the "
               "same CA and reload it (SIGHUP)";
    case X509_V_ERR_CERT_NOT_YET_VALID:
        return "the peer's certificate is not yet valid; check both machines' clocks, or issue "
               "a certificate valid from now";
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
        return "the peer's certificate is not signed by a CA this side trusts (unknown CA); "
               "issue it from the cluster CA, or give this process the CA that signed it "
               "(--tls-ca, --internal-ca; during a CA change, a file holding both)";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return "the peer's certificate does not name the address dialled; its subjectAltName "
               "must hold the host of the address in the topology";
    default:
        return NULL;
    }
}

/* The fix when the peer refused this side's certificate (an alert it sent), or NULL. */
static const char *tls_alert_fix(int reason) {
    switch (reason) {
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
        return "the peer refused this process's certificate: it has expired or is not yet "
               "valid; issue a new one from the cluster CA (or check the clocks) and reload it "
               "(SIGHUP)";
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
        return "the peer does not trust the CA that signed this process's certificate; issue "
               "it from the peer's CA, or give the peer this CA";
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return "the peer refused this process's certificate (or wants one); give it a "
               "certificate of the cluster CA (--tls-cert/--tls-key, --internal-cert)";
    default:
        return NULL;
    }
}

void h2_tls_why(const h2_wbuf *w, unsigned long err, char *out, size_t cap) {
    char text[256] = "no TLS error recorded";
    if (err)
        ERR_error_string_n(err, text, sizeof text);
    long v = w->ssl && ERR_GET_REASON(err) == SSL_R_CERTIFICATE_VERIFY_FAILED
                 ? SSL_get_verify_result(w->ssl)
                 : X509_V_OK;
    const char *fix = v != X509_V_OK ? tls_verify_fix(v) : tls_alert_fix(ERR_GET_REASON(err));
    if (fix)
        snprintf(out, cap, "%s: %s", text, fix);
    else if (v != X509_V_OK)
        snprintf(out, cap, "%s: %s", text, X509_verify_cert_error_string(v));
    else
        snprintf(out, cap, "%s", text);
}
