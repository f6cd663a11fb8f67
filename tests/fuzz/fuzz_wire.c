/* fuzz_wire: the router's protobuf wire helpers (router/wire.c) on bytes from clients and nodes:
 * field copying (request rewriting), MutateRows splitting and rebuilding, MutateRows answer
 * merging, and ReadRows answer tracking. The first input byte picks the helper; the next few
 * are its parameters; the rest is the message.
 * Properties: no crash, leak or read outside the message; a copy without skipped fields
 * reproduces the message byte for byte, and a copy that skips fields holds none of them and is
 * itself well formed; a split request rebuilt from all its entries splits again into the same
 * head and entries; a merge marks only results of entries it was given; tracking counts only go
 * up. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "router_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

#define FUZZ_PARAMS 4 /* parameter bytes after the selector */

static bool fuzz_slice_eq(st_slice a, st_slice b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static void fuzz_copy(st_slice msg, const uint8_t *prm) {
    uint32_t skip[3] = {prm[0] % 8 + 1u, prm[1] % 8 + 1u, prm[2]};
    size_t n_skip = prm[3] % 4;
    st_buf all, part, again;
    st_buf_init(&all);
    st_buf_init(&part);
    st_buf_init(&again);
    st_code a = rtr_wire_copy_except(&all, msg, NULL, 0);
    st_code b = rtr_wire_copy_except(&part, msg, skip, n_skip);
    FUZZ_CHECK(a == b);
    if (a == ST_OK) {
        FUZZ_CHECK(fuzz_slice_eq(st_buf_slice(&all), msg));
        st_slice out = st_buf_slice(&part);
        const uint8_t *p = out.data, *end = rtr_slice_end(out);
        rtr_wire_field f;
        bool bad = false;
        while (rtr_wire_next(&p, end, &f, &bad))
            for (size_t i = 0; i < n_skip; i++)
                FUZZ_CHECK(f.num != skip[i]);
        FUZZ_CHECK(!bad);
        FUZZ_CHECK(rtr_wire_copy_except(&again, out, skip, n_skip) == ST_OK);
        FUZZ_CHECK(fuzz_slice_eq(st_buf_slice(&again), out));
    }
    st_buf_free(&all);
    st_buf_free(&part);
    st_buf_free(&again);
}

static void fuzz_split(st_slice req) {
    st_arena a;
    st_arena_init(&a, 4096);
    st_buf head, built, head2;
    st_buf_init(&head);
    st_buf_init(&built);
    st_buf_init(&head2);
    rtr_entry *e = NULL, *e2 = NULL;
    size_t n = 0, n2 = 0;
    if (rtr_mutate_rows_split(req, &a, &head, &e, &n) == ST_OK) {
        size_t *idx = st_arena_alloc(&a, (n ? n : 1) * sizeof *idx);
        FUZZ_CHECK(idx);
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        FUZZ_CHECK(rtr_mutate_rows_build(&built, st_buf_slice(&head), e, idx, n) == ST_OK);
        FUZZ_CHECK(rtr_mutate_rows_split(st_buf_slice(&built), &a, &head2, &e2, &n2) == ST_OK);
        FUZZ_CHECK(n2 == n && fuzz_slice_eq(st_buf_slice(&head), st_buf_slice(&head2)));
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(fuzz_slice_eq(e[i].raw, e2[i].raw) && fuzz_slice_eq(e[i].row, e2[i].row));
    }
    st_buf_free(&head);
    st_buf_free(&built);
    st_buf_free(&head2);
    st_arena_deinit(&a);
}

static void fuzz_merge(st_slice resp, const uint8_t *prm) {
    /* The sub-request's entries are the caller's entries idx[i] = 2 * i of 16. */
    enum { FUZZ_CALLER_ENTRIES = 16 };
    size_t n = prm[0] % (FUZZ_CALLER_ENTRIES / 2 + 1), idx[FUZZ_CALLER_ENTRIES / 2];
    for (size_t i = 0; i < n; i++)
        idx[i] = 2 * i;
    rtr_entry_result res[FUZZ_CALLER_ENTRIES];
    memset(res, 0, sizeof res);
    st_arena a;
    st_arena_init(&a, 4096);
    (void)rtr_mutate_rows_merge(resp, idx, n, res, &a);
    for (size_t i = 0; i < FUZZ_CALLER_ENTRIES; i++) {
        FUZZ_CHECK(!res[i].final || (i % 2 == 0 && i / 2 < n));
        FUZZ_CHECK(!res[i].final || res[i].message);
        if (res[i].message)
            (void)strlen(res[i].message);
    }
    st_arena_deinit(&a);
}

/* The message is cut into answers at sizes taken from the parameter bytes. */
static void fuzz_track(st_slice msgs, const uint8_t *prm) {
    rtr_rr_track t;
    rtr_rr_track_init(&t);
    bool reversed = prm[0] & 1;
    size_t off = 0, i = 0;
    uint64_t committed = 0;
    while (off < msgs.len) {
        size_t n = (size_t)prm[1 + i++ % (FUZZ_PARAMS - 1)] * 4 + 1;
        if (n > msgs.len - off)
            n = msgs.len - off;
        if (rtr_rr_track_feed(&t, st_slice_make(msgs.data + off, n), reversed) != ST_OK)
            break;
        FUZZ_CHECK(t.committed >= committed);
        committed = t.committed;
        off += n;
    }
    rtr_rr_track_deinit(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 + FUZZ_PARAMS)
        return 0;
    const uint8_t *prm = data + 1;
    size_t len = size - 1 - FUZZ_PARAMS;
    /* A copy of exactly the message's bytes, so ASan sees any read past its end; an empty
     * message is (NULL, 0), as the gRPC deframer delivers it. */
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        abort();
    memcpy(buf, data + 1 + FUZZ_PARAMS, len);
    st_slice msg = st_slice_make(len ? buf : NULL, len);
    switch (data[0] % 4) {
    case 0:
        fuzz_copy(msg, prm);
        break;
    case 1:
        fuzz_split(msg);
        break;
    case 2:
        fuzz_merge(msg, prm);
        break;
    default:
        fuzz_track(msg, prm);
        break;
    }
    free(buf);
    return 0;
}
