/* fuzz_cswire: the wire-level reader of ReadChangeStreamResponse messages (ops/changes_wire.c),
 * which walks bytes a server sent without unpacking them. Properties: no crash, leak or read past
 * the input; every slice it returns lies inside the input; a row key it reads from bytes that
 * protobuf-c also unpacks is the one protobuf-c sees. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "changes.h"
#include "google/bigtable/v2/bigtable.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_slice(st_slice s, const uint8_t *data, size_t size) {
    if (s.len == 0)
        return;
    const uint8_t *p = (const uint8_t *)s.data;
    if (p < data || p + s.len > data + size)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ops_cs_wire_dc dc;
    if (ops_cs_wire_decode((st_slice){data, size}, &dc) != OPS_CS_WIRE_DC)
        return 0;
    check_slice(dc.row, data, size);
    check_slice(dc.cluster, data, size);
    check_slice(dc.token, data, size);
    Google__Bigtable__V2__ReadChangeStreamResponse *u =
        google__bigtable__v2__read_change_stream_response__unpack(NULL, size, data);
    if (!u)
        return 0; /* a field the reader skips may be malformed inside: not a change it trusts */
    /* protobuf merges a data_change given twice, the reader keeps the last one: a row key the
     * reader found is the last one given, which protobuf keeps too */
    if (dc.row.len && (!u->data_change || u->data_change->row_key.len != dc.row.len ||
                       memcmp(u->data_change->row_key.data, dc.row.data, dc.row.len) != 0))
        abort();
    google__bigtable__v2__read_change_stream_response__free_unpacked(u, NULL);
    return 0;
}
