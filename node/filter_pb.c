/* filter_pb.c — RowFilter protobuf -> node_filter tree (see filter_pb.h). */
#include "filter_pb.h"

#include <string.h>

/* Converting deeper than this is pointless: node_filter_prepare rejects depth >
 * NODE_FILTER_DEPTH_MAX anyway, and stopping here bounds our own recursion on a hostile 20 KB
 * filter nested thousands of levels deep. */
#define FILTER_PB_DEPTH_MAX (NODE_FILTER_DEPTH_MAX + 1)

static st_code convert(const Google__Bigtable__V2__RowFilter *pb, st_arena *arena, int depth,
                       node_filter **out, st_err *err);

static st_code oom(st_err *err) {
    return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory while building the RowFilter");
}

static st_slice bin(ProtobufCBinaryData b) {
    return st_slice_make(b.data, b.len);
}
static st_slice str(const char *s) {
    return s ? st_slice_cstr(s) : st_slice_make("", 0);
}

static node_bound bound(bool set, bool closed, ProtobufCBinaryData key) {
    node_bound b = {NODE_BOUND_UNBOUNDED, {NULL, 0}};
    if (set) {
        b.kind = closed ? NODE_BOUND_CLOSED : NODE_BOUND_OPEN;
        b.key = bin(key);
    }
    return b;
}

static node_filter *column_range(const Google__Bigtable__V2__ColumnRange *r, st_arena *arena) {
    node_bound s =
        bound(r->start_qualifier_case != 0,
              r->start_qualifier_case ==
                  GOOGLE__BIGTABLE__V2__COLUMN_RANGE__START_QUALIFIER_START_QUALIFIER_CLOSED,
              r->start_qualifier_closed);
    node_bound e = bound(r->end_qualifier_case != 0,
                         r->end_qualifier_case ==
                             GOOGLE__BIGTABLE__V2__COLUMN_RANGE__END_QUALIFIER_END_QUALIFIER_CLOSED,
                         r->end_qualifier_closed);
    return node_filter_column_range(arena, str(r->family_name), s, e);
}

static node_filter *value_range(const Google__Bigtable__V2__ValueRange *r, st_arena *arena) {
    node_bound s = bound(r->start_value_case != 0,
                         r->start_value_case ==
                             GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_CLOSED,
                         r->start_value_closed);
    node_bound e =
        bound(r->end_value_case != 0,
              r->end_value_case == GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_CLOSED,
              r->end_value_closed);
    return node_filter_value_range(arena, s, e);
}

/* Chain / Interleave: every sub-filter converted, then the list node. */
static st_code convert_list(node_filter_kind kind, Google__Bigtable__V2__RowFilter *const *subs,
                            size_t n, st_arena *arena, int depth, node_filter **out, st_err *err) {
    node_filter **v = NULL;
    if (n > 0) {
        v = st_arena_alloc(arena, n * sizeof *v);
        if (v == NULL)
            return oom(err);
    }
    for (size_t i = 0; i < n; i++) {
        st_code rc = convert(subs[i], arena, depth + 1, &v[i], err);
        if (rc != ST_OK)
            return rc;
    }
    *out = node_filter_list(arena, kind, v, n);
    return *out ? ST_OK : oom(err);
}

static st_code convert_condition(const Google__Bigtable__V2__RowFilter__Condition *c,
                                 st_arena *arena, int depth, node_filter **out, st_err *err) {
    node_filter *p = NULL, *t = NULL, *f = NULL;
    st_code rc = ST_OK;
    if (c->predicate_filter)
        rc = convert(c->predicate_filter, arena, depth + 1, &p, err);
    if (rc == ST_OK && c->true_filter)
        rc = convert(c->true_filter, arena, depth + 1, &t, err);
    if (rc == ST_OK && c->false_filter)
        rc = convert(c->false_filter, arena, depth + 1, &f, err);
    if (rc != ST_OK)
        return rc;
    *out = node_filter_condition(arena, p, t, f);
    return *out ? ST_OK : oom(err);
}

/* pass_all_filter, block_all_filter, sink and strip_value_transformer are booleans that only make
 * sense when true; production rejects false (docs/bigtable.md, Row filters). */
static st_code convert_bool(protobuf_c_boolean v, const char *field, node_filter_kind kind,
                            st_arena *arena, node_filter **out, st_err *err) {
    if (!v)
        return st_err_set(err, ST_INVALID_ARGUMENT, "Error in field '%s' : %s must be true if set",
                          field, field);
    *out = node_filter_new(arena, kind);
    return *out ? ST_OK : oom(err);
}

/* Filters that hold no sub-filters. */
static node_filter *convert_leaf(const Google__Bigtable__V2__RowFilter *pb, st_arena *arena) {
    switch (pb->filter_case) {
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER:
        return node_filter_regex(arena, NODE_FILTER_ROW_KEY_REGEX, bin(pb->row_key_regex_filter));
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_SAMPLE_FILTER:
        return node_filter_row_sample(arena, pb->row_sample_filter);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER:
        return node_filter_regex(arena, NODE_FILTER_FAMILY_NAME_REGEX,
                                 str(pb->family_name_regex_filter));
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER:
        return node_filter_regex(arena, NODE_FILTER_COLUMN_QUALIFIER_REGEX,
                                 bin(pb->column_qualifier_regex_filter));
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER:
        return node_filter_regex(arena, NODE_FILTER_VALUE_REGEX, bin(pb->value_regex_filter));
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_TIMESTAMP_RANGE_FILTER:
        return node_filter_ts_range(arena, pb->timestamp_range_filter->start_timestamp_micros,
                                    pb->timestamp_range_filter->end_timestamp_micros);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_OFFSET_FILTER:
        return node_filter_count(arena, NODE_FILTER_CELLS_PER_ROW_OFFSET,
                                 pb->cells_per_row_offset_filter);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_LIMIT_FILTER:
        return node_filter_count(arena, NODE_FILTER_CELLS_PER_ROW_LIMIT,
                                 pb->cells_per_row_limit_filter);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER:
        return node_filter_count(arena, NODE_FILTER_CELLS_PER_COLUMN_LIMIT,
                                 pb->cells_per_column_limit_filter);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER:
        return node_filter_label(arena, str(pb->apply_label_transformer));
    default:
        ST_ASSERT(!"convert_leaf called for a filter with sub-filters");
        return NULL;
    }
}

static st_code convert(const Google__Bigtable__V2__RowFilter *pb, st_arena *arena, int depth,
                       node_filter **out, st_err *err) {
    *out = NULL;
    if (depth > FILTER_PB_DEPTH_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "RowFilter nested more than %d levels deep; flatten the filter",
                          NODE_FILTER_DEPTH_MAX);
    switch (pb->filter_case) {
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER__NOT_SET:
        /* A filter this build does not know (e.g. value_bitmask) arrives as an unknown field:
         * treating it as pass-all would return wrong data. */
        if (pb->base.n_unknown_fields > 0)
            return st_err_set(err, ST_UNIMPLEMENTED,
                              "RowFilter type (field %u) is not supported by this server",
                              (unsigned)pb->base.unknown_fields[0].tag);
        *out = node_filter_new(arena, NODE_FILTER_PASS_ALL);
        return *out ? ST_OK : oom(err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN:
        return convert_list(NODE_FILTER_CHAIN, pb->chain->filters, pb->chain->n_filters, arena,
                            depth, out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_INTERLEAVE:
        return convert_list(NODE_FILTER_INTERLEAVE, pb->interleave->filters,
                            pb->interleave->n_filters, arena, depth, out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CONDITION:
        return convert_condition(pb->condition, arena, depth, out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_SINK:
        return convert_bool(pb->sink, "sink", NODE_FILTER_SINK, arena, out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_PASS_ALL_FILTER:
        return convert_bool(pb->pass_all_filter, "pass_all_filter", NODE_FILTER_PASS_ALL, arena,
                            out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_BLOCK_ALL_FILTER:
        return convert_bool(pb->block_all_filter, "block_all_filter", NODE_FILTER_BLOCK_ALL, arena,
                            out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_STRIP_VALUE_TRANSFORMER:
        return convert_bool(pb->strip_value_transformer, "strip_value_transformer",
                            NODE_FILTER_STRIP_VALUE, arena, out, err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_RANGE_FILTER:
        *out = column_range(pb->column_range_filter, arena);
        return *out ? ST_OK : oom(err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_RANGE_FILTER:
        *out = value_range(pb->value_range_filter, arena);
        return *out ? ST_OK : oom(err);
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_SAMPLE_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_REGEX_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_TIMESTAMP_RANGE_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_OFFSET_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_ROW_LIMIT_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER:
        *out = convert_leaf(pb, arena);
        return *out ? ST_OK : oom(err);
    default:
        return st_err_set(err, ST_UNIMPLEMENTED, "RowFilter type %d is not supported",
                          (int)pb->filter_case);
    }
}

st_code node_filter_from_pb(const Google__Bigtable__V2__RowFilter *pb, st_arena *arena,
                            node_filter **out, st_err *err) {
    *out = NULL;
    if (pb == NULL)
        return ST_OK;
    size_t size = protobuf_c_message_get_packed_size(&pb->base);
    if (size > NODE_FILTER_PB_BYTES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "Row filter exceeds maximum size of %d bytes (got %zu)",
                          NODE_FILTER_PB_BYTES_MAX, size);
    node_filter *f = NULL;
    st_code rc = convert(pb, arena, 0, &f, err);
    if (rc == ST_OK)
        rc = node_filter_prepare(f, err);
    if (rc != ST_OK)
        return rc;
    *out = f;
    return ST_OK;
}
