/* data.h — what the data API's files share (private to router/): data.c (single-row requests,
 * SampleRowKeys, PingAndWarm) and mutate_rows.c (MutateRows). */
#ifndef ROUTER_DATA_H
#define ROUTER_DATA_H

#include "failover.h"
#include "router_internal.h"

/* Common start of a data request: the table is known and the clusters to try are planned
 * (failover.c; row: the key of a single-row request, for row affinity, else empty). False after
 * failing the call. */
bool rtr_data_route(rtr_ctx *r, rpc_call *call, const char *table, const char *profile,
                    bool transactional, st_slice row, rtr_plan *plan);
/* Stamps a multi-cluster write's server timestamps before its first forwarding; *req then points
 * into the call's arena. False after failing the call. */
bool rtr_data_stamp(rtr_ctx *r, rpc_call *call, bool rows, st_slice *req);
/* False when a mutation takes the server's time (SetCell timestamp -1): not retried. */
bool rtr_muts_idempotent(Google__Bigtable__V2__Mutation *const *m, size_t n);

#endif
