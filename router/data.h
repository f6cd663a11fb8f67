/* data.h — what the data API's files share (private to router/): data.c (single-row requests,
 * SampleRowKeys, PingAndWarm), mutate_rows.c (MutateRows) and read.c (ReadRows). */
#ifndef ROUTER_DATA_H
#define ROUTER_DATA_H

#include "failover.h"
#include "router_internal.h"

/* Common start of a data request: the table is known and the clusters to try are planned
 * (failover.c; row: the key of a single-row request, for row affinity, else empty). False after
 * failing the call. */
bool rtr_data_route(rtr_ctx *r, rpc_call *call, const char *table, const char *profile,
                    rtr_access access, st_slice row, rtr_plan *plan);
/* Authorized views and materialized views are not supported: a request naming one
 * (authorized_view_name, materialized_view_name: their field numbers in this request type, 0 for
 * none) is failed UNIMPLEMENTED naming the feature, before its (then usually empty) table_name
 * is judged. True after failing the call. */
bool rtr_data_view_refused(rpc_call *call, st_slice req, uint32_t authorized_field,
                           uint32_t materialized_field);
/* Stamps a multi-cluster write's server timestamps before its first forwarding; *req then points
 * into the call's arena. False after failing the call. */
bool rtr_data_stamp(rtr_ctx *r, rpc_call *call, bool rows, st_slice *req);
/* False when a mutation takes the server's time (SetCell timestamp -1): not retried. */
bool rtr_muts_idempotent(Google__Bigtable__V2__Mutation *const *m, size_t n);

#endif
