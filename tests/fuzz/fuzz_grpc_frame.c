/* fuzz_grpc_frame: the gRPC message deframer (proto/rpc) on arbitrary bytes, fed in pieces whose
 * sizes come from the input itself, so prefixes and messages split at every possible boundary.
 * Properties: no crash or leak; every delivered message is within the limit; feeding the same
 * bytes in one piece yields the same messages and the same verdict as feeding them split. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "frame.h" /* the deframer and wire encodings (private to proto/rpc) */
#include "strata/rpc.h"

#define FUZZ_MESSAGE_BYTES_MAX 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_tally {
    uint64_t messages;
    uint64_t bytes;
    uint64_t hash;
} fuzz_tally;

static st_code fuzz_on_msg(st_slice msg, void *arg) {
    fuzz_tally *t = arg;
    ST_ASSERT(msg.len <= FUZZ_MESSAGE_BYTES_MAX);
    t->messages++;
    t->bytes += msg.len;
    t->hash = st_hash64(msg.data ? msg.data : (const uint8_t *)"", msg.len, t->hash);
    return ST_OK;
}

static st_code fuzz_run(const uint8_t *data, size_t size, const uint8_t *splits, size_t nsplits,
                        fuzz_tally *t) {
    rpc_deframer d;
    rpc_deframer_init(&d, FUZZ_MESSAGE_BYTES_MAX);
    st_err err;
    st_code rc = ST_OK;
    size_t off = 0, i = 0;
    while (rc == ST_OK && off < size) {
        size_t n = nsplits ? (size_t)splits[i++ % nsplits] + 1 : size - off;
        if (n > size - off)
            n = size - off;
        rc = rpc_deframer_feed(&d, data + off, n, &err, fuzz_on_msg, t);
        off += n;
    }
    if (rc == ST_OK)
        rc = rpc_deframer_finish(&d, &err);
    rpc_deframer_deinit(&d);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The first byte says how many of the following bytes are split sizes. */
    size_t nsplits = size ? data[0] % 16 : 0;
    if (size < 1 + nsplits)
        return 0;
    const uint8_t *splits = data + 1;
    const uint8_t *body = data + 1 + nsplits;
    size_t body_len = size - 1 - nsplits;
    fuzz_tally split = {0}, whole = {0};
    st_code a = fuzz_run(body, body_len, splits, nsplits, &split);
    st_code b = fuzz_run(body, body_len, NULL, 0, &whole);
    ST_ASSERT(a == b);
    ST_ASSERT(split.messages == whole.messages && split.bytes == whole.bytes &&
              split.hash == whole.hash);
    return 0;
}
