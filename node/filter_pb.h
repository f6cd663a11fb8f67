/* filter_pb.h — google.bigtable.v2.RowFilter (protobuf-c) -> node_filter tree, at the service edge.
 *
 * The tree is built with filter.h's builders in the caller's arena (normally the call's arena);
 * its slices point into the protobuf message, so the message must outlive the tree. The result is
 * prepared (regexes compiled): call node_filter_release when done with it.
 *
 * Errors end the RPC, never the connection: ST_INVALID_ARGUMENT for a filter Bigtable rejects
 * (size over NODE_FILTER_PB_BYTES_MAX, a boolean filter set to false, anything node_filter_prepare
 * rejects), ST_UNIMPLEMENTED for a filter kind this build does not carry (it arrives as an unknown
 * field, e.g. value_bitmask), ST_RESOURCE_EXHAUSTED when memory runs out. Messages name the field
 * the way Cloud Bigtable does ("Error in field 'chain' : ..."). docs/filters.md, "At the service
 * edge", records the decisions. */
#ifndef NODE_FILTER_PB_H
#define NODE_FILTER_PB_H

#include <strata/base.h>

#include "filter.h"
#include "google/bigtable/v2/data.pb-c.h"

/* Serialized RowFilter size limit (docs/bigtable.md: "Row filter exceeds maximum size"). */
#define NODE_FILTER_PB_BYTES_MAX 20480

/* Converts and prepares pb (NULL = no filter: *out = NULL, ST_OK). On error *out is NULL and
 * nothing stays compiled. */
st_code node_filter_from_pb(const Google__Bigtable__V2__RowFilter *pb, st_arena *arena,
                            node_filter **out, st_err *err);

#endif
