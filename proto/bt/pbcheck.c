/* pbcheck.c — a pre-scan of protobuf wire bytes, run before protobuf-c unpacks them.
 *
 * protobuf-c's unpack (and later its pack, get_packed_size and free) recurse once per nested
 * message, with about a kilobyte of stack per level. RowFilters (chain, interleave, condition)
 * and GC rules (union, intersection) nest freely, so a 30 KB request nested a few thousand levels
 * deep overflows the stack before any of our depth checks on the unpacked tree can run. This scan
 * walks the same bytes with an explicit stack of at most BTU_PB_DEPTH_MAX frames, guided by the
 * message descriptors: it descends into each length-delimited field whose descriptor says
 * "message" and refuses the input once nesting passes the limit, so unpacking afterwards recurses
 * at most that deep. It also refuses what protobuf-c could never parse (bad tags, truncated
 * varints and lengths, groups, unknown wire types, ragged packed arrays), so garbage is refused
 * in one linear pass without allocating. It never refuses bytes that protobuf-c accepts and that
 * nest within the limit, but for field number 0 in a tag of more than one byte, which protobuf-c
 * takes as an unknown field and cannot re-encode, and for a NUL byte inside a string field:
 * protobuf-c hands strings over as C strings, so "dur\0evil" would arrive as "dur" and a request
 * meant for one table, family or app profile would act on another (names and ids never hold a
 * NUL, so the request is refused naming the field). For requests (btu_pb_unpack_request) it also
 * refuses a string field that is not UTF-8, as proto3 does: stored and sent back, it makes
 * grpc-go clients fail the whole answer. And for requests it refuses a singular message field
 * (a oneof member included) that occurs more than once in one message: protobuf merges such
 * pieces, but protobuf-c keeps only the last piece of a oneof member (a Mutation whose set_cell
 * came in two pieces was stored without the first piece's qualifier and value, and acknowledged)
 * and fails on some other merges. No encoder writes a field in pieces, so refusing them all, by
 * the descriptor, is safe where merging would have to be right for every message.
 *
 * The scan also bounds what unpacking would allocate. protobuf-c gives every field occurrence a
 * record while it parses the enclosing message, every submessage its struct, every repeated
 * element a pointer and every string, bytes or unknown field a copy: an empty MutateRows entry
 * is 2 bytes on the wire and about 100 bytes unpacked, so a 48 MiB request of them took 5 GB in
 * the router and 7 GB in the node, and held both for a minute. The estimate (pbc_cost) is
 * summed as the scan goes, and bytes that would take more than BTU_PB_UNPACK_SLACK_BYTES plus
 * twice their own size are refused before anything is allocated. Valid requests stay far below:
 * the API's 100,000 mutations of small cells need about 20 MiB. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "strata/btutil.h"

/* One message being scanned: its descriptor, where its bytes end, the field last looked up
 * (repeated fields come in runs, as protobuf-c's unpack also assumes), and which of its singular
 * message fields were seen, by index in desc->fields (BTU_PB_FIELDS_MAX bits: pbcheck_test checks
 * that every message a service takes fits). */
typedef struct pbc_frame {
    const ProtobufCMessageDescriptor *desc;
    const uint8_t *end;
    const ProtobufCFieldDescriptor *last;
    uint64_t seen;
} pbc_frame;
_Static_assert(BTU_PB_FIELDS_MAX <= 64, "pbc_frame.seen has a bit per field");

/* Unpacked bytes per field occurrence: protobuf-c's scanned-member record (32 bytes on 64-bit)
 * and the repeated element's pointer or the unknown field's record after it. */
#define PBC_FIELD_COST 40

/* pbc_field's answer for a string field holding a NUL byte (btu_pb_check names the field). */
static const char pbc_nul_in_string[] = "a NUL byte inside a string field";
/* Its answer for a string field that is not UTF-8, when asked to check (requests). */
static const char pbc_bad_utf8[] = "a string field that is not UTF-8";
/* Its answer for a singular message field seen before in the same message (requests). */
static const char pbc_twice[] = "a message field in two pieces";

/* Whether p[0..n) is UTF-8 as proto3 strings must be (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), which is what grpc-go and the other protobuf runtimes
 * check. ASCII, which names and ids are, takes the short path. */
static bool pbc_utf8(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                     : c >= 0xe0 && c <= 0xef ? 3
                     : c >= 0xf0 && c <= 0xf4 ? 4
                                              : 0;
        if (len == 0 || n - i < len)
            return false;
        uint8_t lo = 0x80, hi = 0xbf; /* the second byte's range */
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
        else if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
        if (p[i + 1] < lo || p[i + 1] > hi)
            return false;
        for (size_t k = 2; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

/* A varint of at most max_len bytes wholly before end; 0 if unterminated (protobuf-c's limits:
 * 10 bytes for values, 5 for tags and lengths). */
static size_t pbc_varint(const uint8_t *p, const uint8_t *end, size_t max_len, uint64_t *v) {
    size_t n = (size_t)(end - p) < max_len ? (size_t)(end - p) : max_len;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

/* A packed repeated scalar's payload: whole fixed-size elements, or complete varints. */
static bool pbc_packed_ok(ProtobufCType type, const uint8_t *p, const uint8_t *end) {
    size_t len = (size_t)(end - p);
    switch (type) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return len % 4 == 0;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return len % 8 == 0;
    case PROTOBUF_C_TYPE_BOOL:
        return true;
    default: {
        uint64_t v;
        for (size_t n; p < end; p += n)
            if ((n = pbc_varint(p, end, 10, &v)) == 0)
                return false;
        return true;
    }
    }
}

/* protobuf-c reads a length-delimited repeated field of these types as a packed array. */
static bool pbc_packable(const ProtobufCFieldDescriptor *f) {
    return f->label == PROTOBUF_C_LABEL_REPEATED && f->type != PROTOBUF_C_TYPE_STRING &&
           f->type != PROTOBUF_C_TYPE_BYTES && f->type != PROTOBUF_C_TYPE_MESSAGE;
}

static st_code pbc_malformed(st_err *err, const ProtobufCMessageDescriptor *top, const char *what,
                             size_t offset) {
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "malformed %s: %s at byte %zu; send a valid protobuf encoding", top->name,
                      what, offset);
}

/* Whether fd, a field of frame f, is a singular message field already seen in f's message
 * (marking it seen). Repeated fields and scalars may recur: the first add elements, and the last
 * value of a scalar wins, as protobuf-c also takes it. */
static bool pbc_seen_twice(pbc_frame *f, const ProtobufCFieldDescriptor *fd) {
    if (fd->type != PROTOBUF_C_TYPE_MESSAGE || fd->label == PROTOBUF_C_LABEL_REPEATED)
        return false;
    size_t i = (size_t)(fd - f->desc->fields);
    if (i >= BTU_PB_FIELDS_MAX)
        return false; /* no such message in our protos (pbcheck_test) */
    uint64_t bit = (uint64_t)1 << i;
    bool twice = (f->seen & bit) != 0;
    f->seen |= bit;
    return twice;
}

/* The field at *p inside frame f: on success *p moves past it, and a message-typed field whose
 * bytes follow is returned in *sub (NULL otherwise) with its end in *sub_end. request: the
 * checks for requests (UTF-8 strings, message fields in one piece). */
static const char *pbc_field(pbc_frame *f, const uint8_t **p, const ProtobufCFieldDescriptor **sub,
                             const uint8_t **sub_end, uint64_t *cost, bool request) {
    uint64_t tag, v;
    size_t n = pbc_varint(*p, f->end, 5, &tag);
    *sub = NULL;
    *cost += PBC_FIELD_COST;
    if (n == 0)
        return "an invalid field tag";
    /* protobuf-c refuses field 0 only in a one-byte tag: a longer one becomes an unknown field
     * that it re-encodes as the one-byte tag it refuses. The protobuf spec forbids field 0. */
    if ((tag >> 3) == 0)
        return "field number 0";
    const uint8_t *q = *p + n;
    size_t left = (size_t)(f->end - q);
    switch (tag & 7) {
    case 0:
        if ((n = pbc_varint(q, f->end, 10, &v)) == 0)
            return "a truncated varint";
        *p = q + n;
        return NULL;
    case 1:
    case 5:
        if (left < ((tag & 7) == 1 ? 8u : 4u))
            return "a truncated fixed-size value";
        *p = q + ((tag & 7) == 1 ? 8 : 4);
        return NULL;
    case 2:
        break;
    case 3:
    case 4:
        return "a group (wire types 3 and 4 are not supported)";
    default:
        return "an unknown wire type";
    }
    if ((n = pbc_varint(q, f->end, 5, &v)) == 0 || v > INT_MAX || v > left - n)
        return "a truncated length-delimited field";
    q += n;
    *p = q + v;
    const ProtobufCFieldDescriptor *fd = f->last;
    if (!fd || fd->id != (tag >> 3))
        fd = f->last = protobuf_c_message_descriptor_get_field(f->desc, (unsigned)(tag >> 3));
    if (fd && fd->type == PROTOBUF_C_TYPE_STRING && v > 0 && memchr(q, 0, (size_t)v))
        return pbc_nul_in_string;
    if (request && fd && fd->type == PROTOBUF_C_TYPE_STRING && !pbc_utf8(q, (size_t)v))
        return pbc_bad_utf8;
    if (request && fd && pbc_seen_twice(f, fd))
        return pbc_twice;
    if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE) {
        *cost += fd->descriptor
                     ? ((const ProtobufCMessageDescriptor *)fd->descriptor)->sizeof_message
                     : 0;
        *sub = fd;
        *sub_end = *p;
        *p = q; /* the caller scans the submessage's bytes next */
    } else if (fd && pbc_packable(fd) && !pbc_packed_ok(fd->type, q, *p)) {
        return "a packed repeated field of ragged length";
    } else {
        *cost += v + 1; /* a copy (packed elements take about what they took on the wire) */
    }
    return NULL;
}

/* INVALID_ARGUMENT for pbc_field's answer bad about the field last looked up in frame f, at
 * byte offset of a request of type desc. */
static st_code pbc_refuse(st_err *err, const ProtobufCMessageDescriptor *desc, const pbc_frame *f,
                          const char *bad, size_t offset) {
    if (bad == pbc_nul_in_string)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid %s: field %s of %s holds a NUL byte (at byte %zu); names "
                          "and ids never do, and the name would be cut short there: fix it",
                          desc->name, f->last->name, f->desc->name, offset);
    if (bad == pbc_bad_utf8)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid %s: field %s of %s is not valid UTF-8 (at byte %zu); "
                          "protobuf strings hold UTF-8 text: send it UTF-8 encoded",
                          desc->name, f->last->name, f->desc->name, offset);
    if (bad == pbc_twice)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid %s: message field %s of %s occurs more than once (again at "
                          "byte %zu); Strata does not merge a message sent in pieces: send each "
                          "message field once, whole, as protobuf encoders do",
                          desc->name, f->last->name, f->desc->name, offset);
    return pbc_malformed(err, desc, bad, offset);
}

static st_code pbc_scan(const ProtobufCMessageDescriptor *desc, st_slice bytes, unsigned depth_max,
                        bool request, st_err *err) {
    pbc_frame stack[BTU_PB_DEPTH_MAX];
    if (depth_max == 0 || depth_max > BTU_PB_DEPTH_MAX)
        depth_max = BTU_PB_DEPTH_MAX;
    if (bytes.len == 0)
        return ST_OK; /* the empty encoding: every field at its default */
    const uint8_t *p = bytes.data, *base = bytes.data;
    size_t n = 1;
    uint64_t cost = desc->sizeof_message,
             cost_max = BTU_PB_UNPACK_SLACK_BYTES + 2 * (uint64_t)bytes.len;
    stack[0] = (pbc_frame){desc, bytes.data + bytes.len, NULL, 0};
    for (;;) {
        while (n > 0 && p == stack[n - 1].end)
            n--;
        if (n == 0)
            return ST_OK;
        const ProtobufCFieldDescriptor *sub;
        const uint8_t *sub_end, *at = p;
        const char *bad = pbc_field(&stack[n - 1], &p, &sub, &sub_end, &cost, request);
        if (bad)
            return pbc_refuse(err, desc, &stack[n - 1], bad, (size_t)(at - base));
        if (cost > cost_max)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "%s of %zu bytes holds too many small elements: unpacking it would "
                              "take more than %llu MiB (at byte %zu, inside a %s); send fewer "
                              "elements per request (at most 100,000 mutations or entries)",
                              desc->name, bytes.len, (unsigned long long)(cost_max >> 20),
                              (size_t)(at - base), stack[n - 1].desc->name);
        if (!sub)
            continue;
        if (n == depth_max)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "message nesting exceeds %u levels in %s (field %s of %s at byte "
                              "%zu): send a shallower message (a RowFilter nests at most 20 "
                              "levels, a GC rule 16)",
                              depth_max, desc->name, sub->name, stack[n - 1].desc->name,
                              (size_t)(at - base));
        stack[n++] = (pbc_frame){sub->descriptor, sub_end, NULL, 0};
    }
}

st_code btu_pb_check(const ProtobufCMessageDescriptor *desc, st_slice bytes, unsigned depth_max,
                     st_err *err) {
    return pbc_scan(desc, bytes, depth_max, false, err);
}

static ProtobufCMessage *pbc_unpack(const ProtobufCMessageDescriptor *desc,
                                    ProtobufCAllocator *alloc, st_slice bytes, bool request,
                                    st_err *err) {
    if (pbc_scan(desc, bytes, BTU_PB_DEPTH_MAX, request, err) != ST_OK)
        return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, alloc, bytes.len, bytes.data);
    if (!m)
        st_err_set(err, ST_INVALID_ARGUMENT,
                   "malformed %s: the message could not be parsed (a field of the wrong type, "
                   "or out of memory); send a valid protobuf encoding",
                   desc->name);
    return m;
}

ProtobufCMessage *btu_pb_unpack(const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
                                st_slice bytes, st_err *err) {
    return pbc_unpack(desc, alloc, bytes, false, err);
}

ProtobufCMessage *btu_pb_unpack_request(const ProtobufCMessageDescriptor *desc,
                                        ProtobufCAllocator *alloc, st_slice bytes, st_err *err) {
    return pbc_unpack(desc, alloc, bytes, true, err);
}

/* The end of the field whose value starts at p (wire type wt), or NULL when malformed. */
static const uint8_t *lift_skip(const uint8_t *p, const uint8_t *end, unsigned wt) {
    uint64_t v;
    switch (wt) {
    case 0:
        return st_get_varint64(&p, end, &v) ? p : NULL;
    case 1:
        return end - p >= 8 ? p + 8 : NULL;
    case 2:
        return st_get_varint64(&p, end, &v) && v <= (uint64_t)(end - p) ? p + v : NULL;
    case 5:
        return end - p >= 4 ? p + 4 : NULL;
    default: /* groups: left to btu_pb_unpack */
        return NULL;
    }
}

ProtobufCMessage *btu_pb_unpack_lift(const ProtobufCMessageDescriptor *desc,
                                     ProtobufCAllocator *alloc, st_slice bytes, uint32_t field,
                                     st_slice *lifted, st_err *err) {
    const uint8_t *p = bytes.data, *end = bytes.data + bytes.len;
    const uint64_t want = (uint64_t)field << 3 | 2;
    size_t wire = 0; /* bytes of the field's occurrences, tags included */
    *lifted = st_slice_make(NULL, 0);
    while (p && p < end) {
        uint64_t tag, len = 0;
        const uint8_t *start = p, *value;
        if (!st_get_varint64(&p, end, &tag))
            return btu_pb_unpack(desc, alloc, bytes, err); /* refused there, with its message */
        value = p;
        p = lift_skip(p, end, (unsigned)(tag & 7));
        if (p && tag == want && st_get_varint64(&value, p, &len)) {
            *lifted = st_slice_make(value, (size_t)len);
            wire += (size_t)(p - start);
        }
    }
    if (!p || wire == 0) {
        *lifted = st_slice_make(NULL, 0);
        return btu_pb_unpack(desc, alloc, bytes, err);
    }
    uint8_t *rest = malloc(bytes.len - wire + 1); /* the other fields: protobuf-c copies them */
    size_t n = 0;
    for (p = bytes.data; rest && p < end;) {
        uint64_t tag;
        const uint8_t *start = p;
        (void)st_get_varint64(&p, end, &tag);
        p = lift_skip(p, end, (unsigned)(tag & 7));
        if (tag != want) {
            memcpy(rest + n, start, (size_t)(p - start));
            n += (size_t)(p - start);
        }
    }
    ProtobufCMessage *m = rest ? btu_pb_unpack(desc, alloc, st_slice_make(rest, n), err) : NULL;
    if (!rest)
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory parsing %s", desc->name);
    free(rest);
    if (!m)
        *lifted = st_slice_make(NULL, 0);
    return m;
}
