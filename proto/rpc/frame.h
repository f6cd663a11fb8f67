/* Private to proto/rpc (and its tests and fuzz target): the gRPC wire encodings, pure functions
 * on bytes shared by the server and the client (frame.c). */
#ifndef STRATA_RPC_FRAME_H
#define STRATA_RPC_FRAME_H

#include "strata/rpc.h"

/* ---- the gRPC length-prefixed message deframer ----
 * Each message is 1 flag byte (0 = plain, 1 = compressed), a 4-byte big-endian length, then the
 * bytes. Messages may be split across DATA frames and several may share one. */
typedef struct rpc_deframer {
    uint8_t prefix[5];
    size_t prefix_len;   /* bytes of prefix[] filled */
    size_t msg_len;      /* length announced by the prefix */
    st_buf msg;          /* the message being reassembled after a copy of its prefix (so it can be
                            sent on with rpc_call_send_buf); grows as bytes arrive */
    size_t bytes_max;    /* largest accepted message */
    uint64_t messages;   /* complete messages delivered */
    bool delivering_buf; /* inside on_msg for a message in msg: rpc_deframer_take may take it */
} rpc_deframer;

/* Called once per complete message; the slice is valid only during the call. Return ST_OK to go
 * on; any other code stops rpc_deframer_feed, which returns it. */
typedef st_code (*rpc_deframer_msg_fn)(st_slice msg, void *arg);

void rpc_deframer_init(rpc_deframer *d, size_t bytes_max);
void rpc_deframer_deinit(rpc_deframer *d);
/* Feeds bytes; calls on_msg for each message completed. Errors (the stream is then dead):
 * UNIMPLEMENTED for a compressed message (we negotiate no compression), INTERNAL for a flag byte
 * other than 0/1, RESOURCE_EXHAUSTED for a message over bytes_max or out of memory. */
st_code rpc_deframer_feed(rpc_deframer *d, const uint8_t *data, size_t len, st_err *err,
                          rpc_deframer_msg_fn on_msg, void *arg);
/* Only inside on_msg: moves the message's buffer into *out (RPC_SEND_HEADROOM bytes, then the
 * message the slice points at, so the slice stays valid in *out) and keeps out's previous memory
 * for the next message. False, changing nothing, when the message was not reassembled in a
 * buffer (it came whole in one chunk, or is empty) or was already taken: copy the slice then. */
bool rpc_deframer_take(rpc_deframer *d, st_buf *out);
/* At end of stream: INTERNAL when a message was cut short, else ST_OK. */
st_code rpc_deframer_finish(const rpc_deframer *d, st_err *err);

/* grpc-timeout text ("100m", "5S", "2H"...) to microseconds; false if malformed. */
bool rpc_timeout_parse(const char *text, size_t len, int64_t *timeout_us);
/* Microseconds to grpc-timeout text (at most 8 digits plus unit, rounded up). */
void rpc_timeout_format(int64_t timeout_us, char out[16]);
/* Percent-encodes a grpc-message (bytes outside 0x20..0x7e and '%') into out (NUL-terminated,
 * truncated to fit); rpc_percent_decode is its inverse (invalid escapes kept literally). */
void rpc_percent_encode(const char *in, char *out, size_t out_size);
void rpc_percent_decode(const char *in, size_t in_len, char *out, size_t out_size);

#endif
