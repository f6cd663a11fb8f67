/* fuzz_peek: the router's request peeks (router/peek.c), which read the routing fields of
 * ReadRows, MutateRow and MutateRows requests straight from the client's bytes. The first input
 * byte picks the request type; the rest is the encoding.
 * Properties: no crash, leak or read outside the input; every slice a peek returns lies inside
 * the request; when the peek accepts a request that protobuf-c also unpacks, both read the same
 * table, app profile, row key(s), limits and mutation counts, and agree on idempotence (so
 * forwarding without unpacking routes exactly as unpacking would). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "router_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static void fuzz_inside(st_slice s, st_slice in) {
    if (s.len == 0)
        return;
    FUZZ_CHECK(s.data >= in.data && s.len <= in.len &&
               (size_t)(s.data - in.data) <= in.len - s.len);
}

static bool fuzz_str_eq(st_slice s, const char *c) {
    const char *v = c ? c : "";
    return strlen(v) == s.len && (s.len == 0 || memcmp(v, s.data, s.len) == 0);
}

static bool fuzz_bytes_eq(st_slice s, ProtobufCBinaryData b) {
    return b.len == s.len && (s.len == 0 || memcmp(b.data, s.data, s.len) == 0);
}

/* False when some mutation is a SetCell taking the server's time (timestamp -1). */
static bool fuzz_idempotent(Google__Bigtable__V2__Mutation *const *m, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (m[i]->mutation_case == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL &&
            m[i]->set_cell->timestamp_micros == -1)
            return false;
    return true;
}

static void fuzz_read_rows(st_slice in) {
    rtr_rr_peek pk;
    if (!rtr_peek_read_rows(in, &pk))
        return;
    fuzz_inside(pk.table, in);
    fuzz_inside(pk.profile, in);
    fuzz_inside(pk.rows, in);
    Google__Bigtable__V2__ReadRowsRequest *r =
        google__bigtable__v2__read_rows_request__unpack(NULL, in.len, in.data);
    if (!r)
        return;
    FUZZ_CHECK(fuzz_str_eq(pk.table, r->table_name));
    FUZZ_CHECK(fuzz_str_eq(pk.profile, r->app_profile_id));
    FUZZ_CHECK(pk.has_rows == (r->rows != NULL));
    FUZZ_CHECK(pk.rows_limit == r->rows_limit);
    FUZZ_CHECK(pk.reversed == (r->reversed != 0));
    google__bigtable__v2__read_rows_request__free_unpacked(r, NULL);
}

static void fuzz_mutate_row(st_slice in) {
    rtr_mr_peek pk;
    if (!rtr_peek_mutate_row(in, &pk))
        return;
    fuzz_inside(pk.table, in);
    fuzz_inside(pk.profile, in);
    fuzz_inside(pk.row, in);
    Google__Bigtable__V2__MutateRowRequest *r =
        google__bigtable__v2__mutate_row_request__unpack(NULL, in.len, in.data);
    if (!r)
        return;
    FUZZ_CHECK(fuzz_str_eq(pk.table, r->table_name));
    FUZZ_CHECK(fuzz_str_eq(pk.profile, r->app_profile_id));
    FUZZ_CHECK(fuzz_bytes_eq(pk.row, r->row_key));
    FUZZ_CHECK(pk.n_mutations == r->n_mutations);
    FUZZ_CHECK(pk.idempotent == fuzz_idempotent(r->mutations, r->n_mutations));
    google__bigtable__v2__mutate_row_request__free_unpacked(r, NULL);
}

static void fuzz_mutate_rows(st_slice in) {
    rtr_mrs_peek pk;
    if (!rtr_peek_mutate_rows(in, &pk))
        return;
    fuzz_inside(pk.table, in);
    fuzz_inside(pk.profile, in);
    fuzz_inside(pk.first_row, in);
    Google__Bigtable__V2__MutateRowsRequest *r =
        google__bigtable__v2__mutate_rows_request__unpack(NULL, in.len, in.data);
    if (!r)
        return;
    FUZZ_CHECK(fuzz_str_eq(pk.table, r->table_name));
    FUZZ_CHECK(fuzz_str_eq(pk.profile, r->app_profile_id));
    FUZZ_CHECK(pk.n_entries == r->n_entries);
    size_t muts = 0;
    bool idem = true;
    for (size_t i = 0; i < r->n_entries; i++) {
        muts += r->entries[i]->n_mutations;
        idem = idem && fuzz_idempotent(r->entries[i]->mutations, r->entries[i]->n_mutations);
    }
    FUZZ_CHECK(pk.n_mutations == muts);
    FUZZ_CHECK(pk.idempotent == idem);
    if (r->n_entries)
        FUZZ_CHECK(fuzz_bytes_eq(pk.first_row, r->entries[0]->row_key));
    google__bigtable__v2__mutate_rows_request__free_unpacked(r, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    /* A copy of exactly the request's bytes, so ASan sees any read past its end; an empty
     * request is (NULL, 0), as the gRPC deframer delivers an empty message. */
    uint8_t *req = malloc(size - 1 ? size - 1 : 1);
    if (!req)
        abort();
    memcpy(req, data + 1, size - 1);
    st_slice in = st_slice_make(size > 1 ? req : NULL, size - 1);
    switch (data[0] % 3) {
    case 0:
        fuzz_read_rows(in);
        break;
    case 1:
        fuzz_mutate_row(in);
        break;
    default:
        fuzz_mutate_rows(in);
        break;
    }
    free(req);
    return 0;
}
