/* strings.c — refusing string fields with an embedded NUL byte before protobuf-c unpacks them.
 * protobuf-c hands every string field over as a NUL-terminated C string, so "dur\0evil" arrives
 * as "dur": without this check a write meant for one table (or family, or app profile) would land
 * in another whose name is a prefix of it. Bigtable's names never contain NUL, so the request is
 * refused whole (INVALID_ARGUMENT) naming the field. The scan walks the wire bytes once with the
 * message's descriptor, descending into sub-messages; bytes fields (row keys, values) are
 * skipped, not read. */
#include <stdio.h>
#include <string.h>

#include "strata/btutil.h"

/* Deeper nesting than any Bigtable request has (RowFilter chains nest; protobuf-c allows 100 in
 * total): beyond it the scan stops looking and leaves the message to protobuf-c. */
#define BTU_SCAN_DEPTH_MAX 64

/* Appends ".name" (or "name" at the start) to the path being built; silently truncates. */
static void path_prepend(char *path, size_t cap, const char *name) {
    if (!path || cap == 0)
        return;
    char tail[BTU_FIELD_PATH_MAX];
    snprintf(tail, sizeof tail, "%s", path);
    snprintf(path, cap, "%s%s%s", name, tail[0] ? "." : "", tail);
}

/* Tags and short lengths are one byte: decode those inline, the rest through base. */
static inline bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    if (*p < end && **p < 0x80) {
        *v = *(*p)++;
        return true;
    }
    return st_get_varint64(p, end, v);
}

/* Skips a field of wire type wt at *p; false on malformed input or a group (never used by
 * Bigtable: protobuf-c then decides). */
static bool skip_field(const uint8_t **p, const uint8_t *end, uint32_t wt, st_slice *payload) {
    uint64_t v;
    switch (wt) {
    case 0:
        return varint(p, end, &v);
    case 1:
        if (end - *p < 8)
            return false;
        *p += 8;
        return true;
    case 5:
        if (end - *p < 4)
            return false;
        *p += 4;
        return true;
    case 2:
        if (!varint(p, end, &v) || v > (uint64_t)(end - *p))
            return false;
        *payload = st_slice_make(*p, (size_t)v);
        *p += v;
        return true;
    default:
        return false;
    }
}

static bool scan(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                 int depth, char *path, size_t cap) {
    while (p < end) {
        uint64_t tag;
        st_slice payload = {0};
        if (!varint(&p, end, &tag))
            return false;
        uint32_t wt = (uint32_t)(tag & 7);
        if (!skip_field(&p, end, wt, &payload))
            return false; /* malformed: protobuf-c refuses it */
        if (wt != 2 || (tag >> 3) > UINT32_MAX)
            continue;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
        if (!f)
            continue;
        bool found = false;
        if (f->type == PROTOBUF_C_TYPE_STRING)
            found = payload.len && memchr(payload.data, 0, payload.len) != NULL;
        else if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < BTU_SCAN_DEPTH_MAX)
            found =
                scan(f->descriptor, payload.data, payload.data + payload.len, depth + 1, path, cap);
        if (found) {
            path_prepend(path, cap, f->name);
            return true;
        }
    }
    return false;
}

bool btu_pb_string_has_nul(const ProtobufCMessageDescriptor *desc, st_slice wire, char *path,
                           size_t cap) {
    if (path && cap)
        path[0] = '\0';
    if (!desc || wire.len == 0)
        return false;
    return scan(desc, wire.data, wire.data + wire.len, 0, path, cap);
}
