/* pbnest.h — protobuf wire bytes nested arbitrarily deep, built without recursion, for the tests
 * of the nesting bound (btu_pb_check) and of the servers that apply it.
 *
 * protobuf-c packs recursively, so a RowFilter 50,000 levels deep cannot be built as structs and
 * packed; these helpers compute every level's length from the inside out and then write the
 * bytes from the outside in. Test code only; every function aborts on out of memory. */
#ifndef STRATA_TEST_PBNEST_H
#define STRATA_TEST_PBNEST_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

/* One wrapping level: a message holding the next level in length-delimited field `field`,
 * followed by `suffix` (more fields of the same message, already encoded; may be empty). */
typedef struct bt_nest_step {
    uint32_t field;
    st_slice suffix;
} bt_nest_step;

/* Appends to out `wraps` wrapping levels around leaf (the innermost message's encoded fields):
 * level i (0 = outermost) uses steps[i % n_steps]. The result is an encoding of wraps + 1 nested
 * messages: the outermost is level 1 of btu_pb_check's count, the leaf's message level wraps + 1.
 */
void bt_nest(st_buf *out, const bt_nest_step *steps, size_t n_steps, size_t wraps, st_slice leaf);

/* Field `num` with wire type 2 and value v, appended to out. */
void bt_pb_put_bytes(st_buf *out, uint32_t num, st_slice v);
/* Field `num` with wire type 0 and value v, appended to out. */
void bt_pb_put_varint(st_buf *out, uint32_t num, uint64_t v);

/* Field `num` holding {1: name, 2: ColumnFamily{gc_rule: rule}}: the shape of both a
 * Table.column_families map entry and a ModifyColumnFamilies Modification that creates a family. */
void bt_pb_put_family(st_buf *out, uint32_t num, const char *name, st_slice rule);

/* The recursive Bigtable messages, nested `depth` levels of their own kind (depth 0 = a leaf:
 * pass_all_filter, or max_num_versions 1), appended to out. Every list holds two members (the
 * nested one and a leaf) and every condition a true_filter, so shallow ones are valid requests. */
typedef enum bt_nest_kind {
    BT_NEST_CHAIN,        /* RowFilter.chain */
    BT_NEST_INTERLEAVE,   /* RowFilter.interleave */
    BT_NEST_CONDITION,    /* RowFilter.condition, nesting through predicate_filter */
    BT_NEST_UNION,        /* GcRule.union */
    BT_NEST_INTERSECTION, /* GcRule.intersection */
} bt_nest_kind;
void bt_nest_rule(st_buf *out, bt_nest_kind kind, size_t depth);

#endif
