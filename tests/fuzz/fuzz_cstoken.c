/* fuzz_cstoken: the change-stream token codec (proto/bt/cstoken.c), which parses text straight
 * from ReadChangeStream requests. The first input byte picks the mode:
 *   even: the rest is token text. Properties: no crash or overread; an accepted token formats
 *         back to exactly the input (one spelling per position), and that text parses to the
 *         same position.
 *   odd:  the rest is a ReadChangeStreamRequest (unpacked as the node does, btu_pb_unpack); its
 *         partition and continuation tokens go through btu_cs_partition_range and
 *         btu_cs_tokens_merge. Properties: no crash or leak; an accepted merge starts at or
 *         below every token's W and at one of the tokens' W or Y (version 2), its bound (if it
 *         kept one) is at or below every token's Y, and it formats to a token that parses. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/cstoken.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_text(st_slice in) {
    static btu_cs_pos p, q; /* 4 KiB each: off the stack; the target is single-threaded */
    if (btu_cs_token_parse(in, &p, NULL) != ST_OK)
        return;
    char out[BTU_CS_TOKEN_MAX];
    size_t n = btu_cs_token_format(&p, out);
    if (n != in.len || memcmp(out, in.data, n) != 0)
        abort();
    if (btu_cs_token_parse(st_slice_make(out, n), &q, NULL) != ST_OK || q.w != p.w ||
        q.scan != p.scan || q.h != p.h || q.has_y != p.has_y || q.cluster != p.cluster ||
        q.y != p.y || (p.has_y && p.y > p.w) || q.key_len != p.key_len ||
        memcmp(q.key, p.key, p.key_len) != 0)
        abort();
}

static void fuzz_merge(const Google__Bigtable__V2__ReadChangeStreamRequest *req, st_arena *a) {
    static btu_cs_pos pos, one;
    btu_key_range part;
    if (btu_cs_partition_range(req->partition, "partition", a, &part, NULL) != ST_OK ||
        req->start_from_case !=
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS)
        return;
    const Google__Bigtable__V2__StreamContinuationTokens *t = req->continuation_tokens;
    if (btu_cs_tokens_merge(t->tokens, t->n_tokens, &part, btu_cs_table_tag(st_slice_cstr("t")), a,
                            &pos, NULL) != ST_OK)
        return;
    bool seen = false;
    for (size_t i = 0; i < t->n_tokens; i++) {
        if (btu_cs_token_parse(st_slice_cstr(t->tokens[i]->token), &one, NULL) != ST_OK ||
            one.w < pos.w || (pos.has_y && (!one.has_y || one.y < pos.y)))
            abort();
        seen = seen || one.w == pos.w || (one.has_y && one.y == pos.w);
    }
    char out[BTU_CS_TOKEN_MAX];
    size_t n = btu_cs_token_format(&pos, out);
    if (!seen || btu_cs_token_parse(st_slice_make(out, n), &one, NULL) != ST_OK)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    st_slice in = st_slice_make(data + 1, size - 1);
    if (data[0] % 2 == 0) {
        fuzz_text(in);
        return 0;
    }
    st_arena a;
    st_arena_init(&a, 4096);
    ProtobufCMessage *m = btu_pb_unpack(
        &google__bigtable__v2__read_change_stream_request__descriptor, NULL, in, NULL);
    if (m) {
        fuzz_merge((const Google__Bigtable__V2__ReadChangeStreamRequest *)m, &a);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    st_arena_deinit(&a);
    return 0;
}
