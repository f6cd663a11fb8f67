/* memtable.h — a tablet's in-memory write buffer: a skiplist of (ikey, value, lsn) in two arenas
 * (nodes, values; private to storage/). One writer at a time (the commit thread), any number
 * of lock-free readers. Entries carry the lsn of the write, so a snapshot taken at lsn S ignores
 * later ones. */
#ifndef STO_MEMTABLE_H
#define STO_MEMTABLE_H

#include "kviter.h"
#include "strata/storage.h"

typedef struct sto_memtable sto_memtable;

st_code sto_memtable_new(sto_memtable **out);
void sto_memtable_ref(sto_memtable *m);
void sto_memtable_unref(sto_memtable *m); /* frees at zero */

/* Inserts (ikey, value) at lsn, copying both. An equal ikey already present is replaced (the
 * newer lsn wins; only a replay or a repeated SetCell within one row mutation does this).
 * Single writer. */
st_code sto_memtable_put(sto_memtable *m, st_slice ikey, st_slice value, uint64_t lsn);
size_t sto_memtable_bytes(sto_memtable *m);
uint64_t sto_memtable_max_lsn(sto_memtable *m);
bool sto_memtable_empty(sto_memtable *m);

/* An iterator that sees only entries with lsn <= max_lsn (an entry replaced at a later lsn still
 * shows its older value). Holds a reference on m. NULL if memory runs out. */
sto_kviter *sto_memtable_iter_new(sto_memtable *m, uint64_t max_lsn);

/* Turns a row mutation into memtable entries (ikeys per key.h), all with row->version. Mutations
 * apply in list order: as all entries of one row mutation share its version, a SetCell that a
 * later delete of the same row mutation covers is not written at all. A DeleteFromColumn with an
 * empty time range writes nothing. ST_INVALID_ARGUMENT (nothing written) for a bad mutation;
 * ST_RESOURCE_EXHAUSTED if memory runs out (entries may be partly written). */
st_code sto_memtable_apply(sto_memtable *m, const sto_row_mut *row, uint64_t lsn);

/* Which SetCells of row a later delete of the same row mutation removes (the rule of
 * sto_memtable_apply): *out = an array of row->n_muts flags to free(), or NULL (nothing
 * allocated) when no delete follows a SetCell. O(n log n) in the number of mutations.
 * ST_RESOURCE_EXHAUSTED if memory runs out. */
st_code sto_memtable_sets_removed(const sto_row_mut *row, bool **out);

#endif
