/* raw_h2.h: the raw HTTP/2 test client. */
#include "raw_h2.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static ssize_t raw_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *u) {
    (void)s;
    (void)flags;
    raw_call *r = u;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(r->fd, data + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        off += (size_t)n;
    }
    return (ssize_t)len;
}

/* Each call produces one DATA frame of at most r->chunk bytes: that is how we split. */
ssize_t raw_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length, uint32_t *flags,
                 nghttp2_data_source *src, void *u) {
    (void)s;
    (void)sid;
    (void)src;
    raw_call *r = u;
    size_t n = r->body_len - r->body_off;
    if (n > length)
        n = length;
    if (r->chunk > 0 && n > r->chunk)
        n = r->chunk;
    memcpy(buf, r->body + r->body_off, n);
    r->body_off += n;
    if (r->body_off == r->body_len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int raw_header(nghttp2_session *s, const nghttp2_frame *fr, const uint8_t *name,
                      size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                      void *u) {
    (void)s;
    (void)fr;
    (void)flags;
    raw_call *r = u;
    if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0)
        r->grpc_status = atoi((const char *)value);
    if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0)
        snprintf(r->grpc_message, sizeof r->grpc_message, "%.*s", (int)valuelen, value);
    if (namelen == 20 && memcmp(name, "grpc-accept-encoding", 20) == 0)
        snprintf(r->accept_encoding, sizeof r->accept_encoding, "%.*s", (int)valuelen, value);
    if (namelen == 7 && memcmp(name, ":status", 7) == 0)
        r->http_status = atoi((const char *)value);
    return 0;
}

static int raw_chunk(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data,
                     size_t len, void *u) {
    (void)s;
    (void)flags;
    (void)sid;
    raw_call *r = u;
    return st_buf_append(&r->data, data, len) == ST_OK ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
}

static int raw_close(nghttp2_session *s, int32_t sid, uint32_t code, void *u) {
    (void)s;
    (void)sid;
    (void)code;
    ((raw_call *)u)->closed = true;
    return 0;
}

int raw_tcp_connect(uint16_t port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {30, 0}; /* a hang becomes a failure, not a stuck test */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

nghttp2_session *raw_session(raw_call *r, bool big_windows) {
    return raw_session_ex(r, big_windows, 0);
}

nghttp2_session *raw_session_ex(raw_call *r, bool big_windows, size_t header_block_max) {
    nghttp2_session_callbacks *cbs;
    nghttp2_session *s = NULL;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return NULL;
    nghttp2_session_callbacks_set_send_callback(cbs, raw_send);
    nghttp2_session_callbacks_set_on_header_callback(cbs, raw_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, raw_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, raw_close);
    nghttp2_option *opt = NULL;
    if (header_block_max && nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        return NULL;
    }
    if (opt)
        nghttp2_option_set_max_send_header_block_length(opt, header_block_max);
    int rv = nghttp2_session_client_new2(&s, cbs, r, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0)
        return NULL;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, NGHTTP2_MAX_WINDOW_SIZE}};
    rv = nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, iv, big_windows ? 1 : 0);
    if (rv == 0 && big_windows)
        rv =
            nghttp2_session_set_local_window_size(s, NGHTTP2_FLAG_NONE, 0, NGHTTP2_MAX_WINDOW_SIZE);
    if (rv != 0) {
        nghttp2_session_del(s);
        return NULL;
    }
    return s;
}
