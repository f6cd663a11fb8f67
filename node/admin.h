/* admin.h — schema helpers of admin.c shared with the internal service (internal.c, move.c):
 * protobuf Table/GcRule <-> catalog, dropping a family's data, dropping a table. Loop thread. */
#ifndef NODE_ADMIN_H
#define NODE_ADMIN_H

#include "node_internal.h"

/* A GC rule from protobuf (NULL = keep everything) into out (free with node_gc_free).
 * INVALID_ARGUMENT for a malformed or oversized rule; out is empty then. */
st_code node_gc_from_pb(const Google__Bigtable__Admin__V2__GcRule *r, node_gc *out, int depth,
                        st_err *err);
/* Sets (adds or replaces) every column family of spec (NULL = none) on t, validating names and
 * rules; stops at the first bad one (INVALID_ARGUMENT). */
st_code node_table_families_from_pb(node_table *t, const Google__Bigtable__Admin__V2__Table *spec,
                                    st_err *err);
/* The Table message of a catalog entry (families unless names_only), in arena a; NULL when out
 * of memory. Strings point into t. */
Google__Bigtable__Admin__V2__Table *node_table_to_pb(const node_table *t, bool names_only,
                                                     st_arena *a);
/* Deletes the cells of family in every local tablet of t (a dropped family's data must not come
 * back when it is created again), on the loop thread: node_family_purge_start is the usual way. */
st_code node_family_purge(node_ctx *n, node_tablets *t, const char *family, st_err *err);
/* Called on the loop when a purge ended; msg is NULL on success. */
typedef void (*node_purge_done_fn)(node_ctx *n, rpc_call *call, st_code code, const char *msg,
                                   void *arg);
/* As node_family_purge for the families fams of table, on a job thread (node_job): each family
 * must already be purging (node_table_purge_begin), so no write reaches it meanwhile while the
 * saved catalog keeps it. When the job ends each family's purging entry ends (a failed purge
 * puts the family back), then done runs on the loop; unless this returns an error, in which case
 * the caller ends the entries. */
st_code node_family_purge_start(node_ctx *n, rpc_call *call, const char *table,
                                const char *const *fams, size_t n_fams, node_purge_done_fn done,
                                void *arg, st_err *err);
/* Removes the table from the catalog (saved) and drops its local tablets, the storage part on a
 * job (a running flush of a tablet is waited for there, not on the loop); call is answered
 * (google.protobuf.Empty) when they are gone. On an error nothing changed and call is not
 * answered. NOT_FOUND if absent. */
st_code node_table_drop_start(node_ctx *n, rpc_call *call, const char *name, st_err *err);

/* Sets a table's change stream retention (0 = off) and/or deletion protection, saves the catalog
 * and pushes the GC rules (UpdateTable). */
st_code node_table_update(node_ctx *n, node_table *meta, bool set_retention, int64_t retention_us,
                          bool set_protection, bool protection, st_err *err);
/* UpdateTable (registered in server.c). */
void node_h_update_table(rpc_call *call, st_slice req, void *arg);

#endif
