/* A raw HTTP/2 client for the gRPC layer's tests (rpc_test, rpc_zc_test): nghttp2 on a blocking
 * loopback socket, with hand-shaped DATA frames, so tests control what the server's own client
 * would never send (odd frame sizes, slow reading). */
#ifndef STRATA_TEST_RAW_H2_H
#define STRATA_TEST_RAW_H2_H

#include <nghttp2/nghttp2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

typedef struct raw_call {
    int fd;
    const uint8_t *body;              /* request body, sent in DATA frames of at most chunk bytes */
    size_t body_len, body_off, chunk; /* chunk 0: as large as nghttp2 allows */
    int grpc_status;                  /* -1 until the trailers arrive */
    int http_status;
    char grpc_message[256];   /* as sent (percent-encoded), cut to fit */
    char accept_encoding[64]; /* grpc-accept-encoding, cut to fit */
    bool closed;              /* the stream closed */
    st_buf data;              /* response DATA bytes (still gRPC-framed) */
} raw_call;

/* A blocking socket connected to 127.0.0.1:port, 30 s receive timeout (a hang fails the test);
 * rcvbuf > 0 sets SO_RCVBUF (a small one makes the server's writes go partial). */
int raw_tcp_connect(uint16_t port, int rcvbuf);

/* A client session on r (callbacks fill r) with its SETTINGS queued; big_windows: stream and
 * connection windows at the maximum, so only the socket holds the server back. */
nghttp2_session *raw_session(raw_call *r, bool big_windows);

/* raw_session, sending header blocks of up to header_block_max bytes (0: nghttp2's default,
 * 64 KiB, which it checks against the metadata's length before Huffman coding). */
nghttp2_session *raw_session_ex(raw_call *r, bool big_windows, size_t header_block_max);

/* raw_session's body reader, for nghttp2_data_provider.read_callback. */
ssize_t raw_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length, uint32_t *flags,
                 nghttp2_data_source *src, void *u);

#endif
