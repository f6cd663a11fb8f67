/* gRPC message framing, grpc-timeout and grpc-message encodings: pure functions on bytes, shared
 * by server and client and fed directly by the fuzz target. */
#include <stdlib.h>
#include <string.h>

#include "frame.h"

_Static_assert(RPC_SEND_HEADROOM == 5, "the headroom holds exactly a gRPC message prefix");

void rpc_deframer_init(rpc_deframer *d, size_t bytes_max) {
    memset(d, 0, sizeof(*d));
    st_buf_init(&d->msg);
    d->bytes_max = bytes_max;
}

void rpc_deframer_deinit(rpc_deframer *d) {
    st_buf_free(&d->msg);
}

void rpc_frame_prefix(uint8_t out[5], uint32_t len) {
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}

size_t rpc_frame_len(const uint8_t p[5]) {
    return ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
}

bool rpc_frames_check(st_slice frames, size_t bytes_max, size_t *n, st_slice *last) {
    const uint8_t *p = frames.data, *end = frames.len ? frames.data + frames.len : frames.data;
    size_t count = 0;
    st_slice l = st_slice_make(NULL, 0);
    while (p < end) {
        if ((size_t)(end - p) < 5 || p[0] != 0)
            return false;
        size_t len = rpc_frame_len(p);
        if (len > bytes_max || len > (size_t)(end - p) - 5)
            return false;
        l = st_slice_make(p + 5, len);
        p += 5 + len;
        count++;
    }
    if (n)
        *n = count;
    if (last)
        *last = l;
    return true;
}

/* Validates a complete prefix and sets msg_len. */
static st_code deframer_prefix_done(rpc_deframer *d, st_err *err) {
    uint8_t flag = d->prefix[0];
    uint32_t len = ((uint32_t)d->prefix[1] << 24) | ((uint32_t)d->prefix[2] << 16) |
                   ((uint32_t)d->prefix[3] << 8) | (uint32_t)d->prefix[4];
    if (flag == 1)
        return st_err_set(
            err, ST_UNIMPLEMENTED,
            "compressed gRPC message but no grpc-encoding names its compression: send "
            "uncompressed messages (identity)");
    if (flag != 0)
        return st_err_set(err, ST_INTERNAL, "bad gRPC message flag byte 0x%02x", flag);
    if (len > d->bytes_max)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "gRPC message of %u bytes exceeds the maximum of %zu bytes (a Strata "
                          "server's --max-message-bytes): send smaller messages",
                          len, d->bytes_max);
    d->msg_len = len;
    st_buf_reset(&d->msg);
    return ST_OK;
}

/* in_buf: msg lies in d->msg (after the prefix), so rpc_deframer_take may hand it over. */
static st_code deframer_deliver(rpc_deframer *d, st_slice msg, bool in_buf,
                                rpc_deframer_msg_fn on_msg, void *arg) {
    d->prefix_len = 0;
    d->msg_len = 0;
    d->messages++;
    d->delivering_buf = in_buf;
    st_code rc = on_msg ? on_msg(msg, arg) : ST_OK;
    d->delivering_buf = false;
    st_buf_reset(&d->msg);
    return rc;
}

bool rpc_deframer_take(rpc_deframer *d, st_buf *out) {
    if (!d->delivering_buf)
        return false;
    st_buf mine = d->msg;
    d->msg = *out;
    st_buf_reset(&d->msg);
    *out = mine;
    d->delivering_buf = false; /* taken once */
    return true;
}

/* The first buffer of a message reassembled from several chunks, when it is larger. */
#define DEFRAMER_FIRST_BYTES ((size_t)64 << 10)

/* Makes room in d->msg for n more bytes of the message. The buffer doubles with the bytes that
 * arrived, up to the announced size, rather than taking that size at once: a length costs its
 * sender nothing, and streams that announce large messages and send a byte of each would
 * otherwise make the process map memory (and address space) they never fill. */
static bool deframer_room(rpc_deframer *d, size_t n) {
    st_buf *b = &d->msg;
    size_t need = b->len + n, whole = 5 + (size_t)d->msg_len;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap >= DEFRAMER_FIRST_BYTES / 2 ? b->cap * 2 : DEFRAMER_FIRST_BYTES;
    cap = cap < need ? need : cap > whole ? whole : cap;
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return false;
    b->data = p;
    b->cap = cap;
    return true;
}

/* Bytes of the message reassembled so far (d->msg holds the prefix before them). */
static size_t deframer_have(const rpc_deframer *d) {
    return d->msg.len > 5 ? d->msg.len - 5 : 0;
}

st_code rpc_deframer_feed(rpc_deframer *d, const uint8_t *data, size_t len, st_err *err,
                          rpc_deframer_msg_fn on_msg, void *arg) {
    st_code rc = ST_OK;
    while (len > 0) {
        if (d->prefix_len < 5) {
            size_t n = 5 - d->prefix_len < len ? 5 - d->prefix_len : len;
            memcpy(d->prefix + d->prefix_len, data, n);
            d->prefix_len += n;
            data += n;
            len -= n;
            if (d->prefix_len < 5)
                break;
            if ((rc = deframer_prefix_done(d, err)) != ST_OK)
                return rc;
            if (d->msg_len == 0) {
                rc = deframer_deliver(d, st_slice_make(NULL, 0), false, on_msg, arg);
                if (rc != ST_OK)
                    return rc;
            }
            continue;
        }
        size_t want = d->msg_len - deframer_have(d);
        size_t n = want < len ? want : len;
        /* Zero-copy fast path: a whole message inside this chunk, nothing buffered yet. */
        if (d->msg.len == 0 && n == d->msg_len) {
            rc = deframer_deliver(d, st_slice_make(data, n), false, on_msg, arg);
        } else if (!deframer_room(d, (d->msg.len == 0 ? 5 : 0) + n) ||
                   (d->msg.len == 0 && st_buf_append(&d->msg, d->prefix, 5) != ST_OK) ||
                   st_buf_append(&d->msg, data, n) != ST_OK) {
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reassembling message");
        } else if (deframer_have(d) == d->msg_len) {
            st_slice m = st_slice_make(d->msg.data + 5, d->msg_len);
            rc = deframer_deliver(d, m, true, on_msg, arg);
        }
        data += n;
        len -= n;
        if (rc != ST_OK)
            return rc;
    }
    return ST_OK;
}

st_code rpc_deframer_finish(const rpc_deframer *d, st_err *err) {
    if (d->prefix_len == 0)
        return ST_OK;
    if (d->prefix_len < 5)
        return st_err_set(err, ST_INTERNAL, "stream ended inside a gRPC message prefix");
    return st_err_set(err, ST_INTERNAL, "stream ended after %zu of %zu gRPC message bytes",
                      deframer_have(d), d->msg_len);
}

bool rpc_timeout_parse(const char *text, size_t len, int64_t *timeout_us) {
    if (len < 2 || len > 9)
        return false; /* the spec allows at most 8 digits */
    int64_t v = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return false;
        v = v * 10 + (text[i] - '0');
    }
    int64_t us;
    switch (text[len - 1]) {
    case 'H':
        us = v * 3600 * 1000000;
        break;
    case 'M':
        us = v * 60 * 1000000;
        break;
    case 'S':
        us = v * 1000000;
        break;
    case 'm':
        us = v * 1000;
        break;
    case 'u':
        us = v;
        break;
    case 'n':
        us = (v + 999) / 1000;
        break;
    default:
        return false;
    }
    *timeout_us = us;
    return true;
}

/* "<v><unit>" into out (v <= 8 digits): every client call with a deadline sends one, so no
 * snprintf. */
static void timeout_text(char out[16], uint32_t v, char unit) {
    char digits[10];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < 8);
    for (size_t i = 0; i < n; i++)
        out[i] = digits[n - 1 - i];
    out[n] = unit;
    out[n + 1] = '\0';
}

void rpc_timeout_format(int64_t timeout_us, char out[16]) {
    if (timeout_us < 1)
        timeout_us = 1;
    /* Pick the finest unit that fits in 8 digits, rounding up so we never shorten a deadline. */
    static const struct {
        char unit;
        int64_t us;
    } units[] = {{'u', 1}, {'m', 1000}, {'S', 1000000}, {'M', 60000000}, {'H', 3600000000LL}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        int64_t v = timeout_us / units[i].us + (timeout_us % units[i].us != 0); /* no overflow */
        if (v <= 99999999) {
            timeout_text(out, (uint32_t)v, units[i].unit);
            return;
        }
    }
    timeout_text(out, 99999999, 'H');
}

void rpc_percent_encode(const char *in, char *out, size_t out_size) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    if (out_size == 0)
        return;
    for (const unsigned char *p = (const unsigned char *)(in ? in : ""); *p; p++) {
        bool plain = *p >= 0x20 && *p <= 0x7e && *p != '%';
        size_t need = plain ? 1 : 3;
        if (o + need >= out_size)
            break;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void rpc_percent_decode(const char *in, size_t in_len, char *out, size_t out_size) {
    size_t o = 0;
    if (out_size == 0)
        return;
    for (size_t i = 0; i < in_len && o + 1 < out_size; i++) {
        int hi, lo;
        if (in[i] == '%' && i + 2 < in_len && (hi = hex_val(in[i + 1])) >= 0 &&
            (lo = hex_val(in[i + 2])) >= 0) {
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[o++] = in[i];
        }
    }
    out[o] = '\0';
}
