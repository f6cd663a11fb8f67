/* fuzz_pbdepth: btu_pb_check (proto/bt/pbcheck.c), the scan that bounds protobuf nesting before
 * protobuf-c unpacks bytes from the network. The first input byte picks the message type (the
 * requests that carry RowFilters and GC rules, the rules themselves, a few others); the rest is
 * the encoding.
 * Properties: no crash, leak or deep recursion; what the scan accepts unpacks (or is refused by
 * protobuf-c for a reason of its own) and re-encodes into bytes the scan accepts again; what the
 * scan refuses as malformed, protobuf-c refuses too (but for field number 0, see btutil.h), so
 * the scan never turns away a message that protobuf-c would take (but for a NUL byte inside a
 * string field, refused on purpose: btutil.h); btu_pb_unpack agrees with the two steps. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/btutil.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Constant table of the message types tried. */
static const ProtobufCMessageDescriptor *const fuzz_descs[] = {
    &google__bigtable__v2__read_rows_request__descriptor,
    &google__bigtable__v2__check_and_mutate_row_request__descriptor,
    &google__bigtable__admin__v2__create_table_request__descriptor,
    &google__bigtable__admin__v2__modify_column_families_request__descriptor,
    &strata__internal__v1__put_table_request__descriptor,
    &google__bigtable__v2__row_filter__descriptor,
    &google__bigtable__admin__v2__gc_rule__descriptor,
    &google__bigtable__v2__mutate_rows_request__descriptor,
    &strata__internal__v1__apply_request__descriptor,
    &google__bigtable__admin__v2__table__descriptor,
};

/* Accepted bytes: protobuf-c may still refuse them (a field of the wrong wire type), but what it
 * unpacks packs again into bytes of the same nesting. */
static void fuzz_accepted(const ProtobufCMessageDescriptor *desc, st_slice in) {
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, in.len, in.data);
    if (!m)
        return;
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        abort();
    protobuf_c_message_pack(m, buf);
    if (btu_pb_check(desc, st_slice_make(buf, n), 0, NULL) != ST_OK)
        abort();
    free(buf);
    protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    const ProtobufCMessageDescriptor *desc =
        fuzz_descs[data[0] % (sizeof fuzz_descs / sizeof fuzz_descs[0])];
    st_slice in = st_slice_make(data + 1, size - 1);
    st_err err = {0};
    st_code rc = btu_pb_check(desc, in, 0, &err);
    if (rc == ST_OK) {
        fuzz_accepted(desc, in);
    } else if (rc != ST_INVALID_ARGUMENT) {
        abort();
    } else if (strncmp(err.msg, "malformed ", 10) == 0) {
        /* The scan reads bytes in order and stopped at the bad one with everything before it at
         * most BTU_PB_DEPTH_MAX deep; protobuf-c reaches that byte no deeper, so this is safe.
         * Field number 0 is the one thing refused that protobuf-c may take (btutil.h). */
        ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, in.len, in.data);
        if (m && !strstr(err.msg, "field number 0"))
            abort();
        protobuf_c_message_free_unpacked(m, NULL);
    } else if (!strstr(err.msg, "message nesting exceeds") &&
               !strstr(err.msg, "holds a NUL byte")) {
        abort();
    }
    ProtobufCMessage *m = btu_pb_unpack(desc, NULL, in, NULL);
    if (rc != ST_OK && m)
        abort();
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
