/* pbnest.c — deeply nested protobuf wire bytes without recursion (see pbnest.h). */
#include "pbnest.h"

#include <stdlib.h>

static void must(st_code rc) {
    if (rc != ST_OK)
        abort();
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

void bt_pb_put_bytes(st_buf *out, uint32_t num, st_slice v) {
    must(st_buf_append_varint64(out, ((uint64_t)num << 3) | 2));
    must(st_buf_append_varint64(out, v.len));
    if (v.len)
        must(st_buf_append(out, v.data, v.len));
}

void bt_pb_put_varint(st_buf *out, uint32_t num, uint64_t v) {
    must(st_buf_append_varint64(out, (uint64_t)num << 3));
    must(st_buf_append_varint64(out, v));
}

void bt_pb_put_family(st_buf *out, uint32_t num, const char *name, st_slice rule) {
    st_buf fam, named;
    st_buf_init(&fam);
    st_buf_init(&named);
    bt_pb_put_bytes(&fam, 1, rule);
    bt_pb_put_bytes(&named, 1, st_slice_cstr(name));
    bt_pb_put_bytes(&named, 2, st_slice_make(fam.data, fam.len));
    bt_pb_put_bytes(out, num, st_slice_make(named.data, named.len));
    st_buf_free(&fam);
    st_buf_free(&named);
}

void bt_nest(st_buf *out, const bt_nest_step *steps, size_t n_steps, size_t wraps, st_slice leaf) {
    /* len[i]: the encoded size of level i's message body; len[wraps] is the leaf. */
    size_t *len = malloc((wraps + 1) * sizeof *len);
    if (!len)
        abort();
    len[wraps] = leaf.len;
    for (size_t i = wraps; i-- > 0;) {
        const bt_nest_step *s = &steps[i % n_steps];
        len[i] = varint_len((uint64_t)s->field << 3) + varint_len(len[i + 1]) + len[i + 1] +
                 s->suffix.len;
    }
    must(st_buf_reserve(out, len[0]));
    for (size_t i = 0; i < wraps; i++) {
        must(st_buf_append_varint64(out, ((uint64_t)steps[i % n_steps].field << 3) | 2));
        must(st_buf_append_varint64(out, len[i + 1]));
    }
    if (leaf.len)
        must(st_buf_append(out, leaf.data, leaf.len));
    for (size_t i = wraps; i-- > 0;) {
        st_slice sfx = steps[i % n_steps].suffix;
        if (sfx.len)
            must(st_buf_append(out, sfx.data, sfx.len));
    }
    free(len);
}

/* Leaves: RowFilter{pass_all_filter: true} and GcRule{max_num_versions: 1}, bare and as member 1
 * of a list (Chain.filters, Interleave.filters, Union.rules, Intersection.rules) or as
 * Condition.true_filter (2). */
static const uint8_t filter_leaf[] = {0x88, 0x01, 0x01};
static const uint8_t filter_member[] = {0x0a, 0x03, 0x88, 0x01, 0x01};
static const uint8_t filter_true[] = {0x12, 0x03, 0x88, 0x01, 0x01};
static const uint8_t gc_leaf[] = {0x08, 0x01};
static const uint8_t gc_member[] = {0x0a, 0x02, 0x08, 0x01};

void bt_nest_rule(st_buf *out, bt_nest_kind kind, size_t depth) {
    /* Each level of a rule is two messages: the rule and its list (or condition). */
    static const uint32_t outer_field[] = {1, 2, 3, 4, 3};
    bool gc = kind == BT_NEST_UNION || kind == BT_NEST_INTERSECTION;
    st_slice member = gc ? st_slice_make(gc_member, sizeof gc_member)
                         : st_slice_make(filter_member, sizeof filter_member);
    if (kind == BT_NEST_CONDITION)
        member = st_slice_make(filter_true, sizeof filter_true);
    bt_nest_step steps[2] = {{outer_field[kind], st_slice_make(NULL, 0)}, {1, member}};
    st_slice leaf = gc ? st_slice_make(gc_leaf, sizeof gc_leaf)
                       : st_slice_make(filter_leaf, sizeof filter_leaf);
    bt_nest(out, steps, 2, 2 * depth, leaf);
}
