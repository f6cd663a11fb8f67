/* rowread.h — from merged entries to visible cells, and the compaction filter (private to
 * storage/). Both apply the same rules (docs/formats/keys.md):
 *   - a row / family / column tombstone with version V hides entries of its scope with a lower
 *     version (a column tombstone only cells whose ts is in its [start, end));
 *   - of several entries for one cell (same row, family, qualifier, ts) the highest version wins;
 *   - the family's GC rule then hides cells: max_versions counts the visible cells of a column
 *     newest first; max_age compares the cell timestamp with now; union / intersection nest.
 * Reads apply all of it. Compaction drops only what is safe for its inputs: covered entries whose
 * tombstone is among the inputs, shadowed duplicates, max-age garbage; max-versions garbage and
 * tombstones themselves only in a full compaction (all of the tablet's tables), tombstones only
 * once their version is below the grace bound. */
#ifndef STO_ROWREAD_H
#define STO_ROWREAD_H

#include "kviter.h"
#include "strata/storage.h"

/* An immutable family -> GC rule map, refcounted so snapshots keep the one they started with. */
typedef struct sto_gc_set sto_gc_set;
st_code sto_gc_set_new(const sto_family_gc *fams, size_t n, sto_gc_set **out); /* deep copy */
void sto_gc_set_ref(sto_gc_set *g);
void sto_gc_set_unref(sto_gc_set *g);
const sto_gc_rule *sto_gc_set_find(const sto_gc_set *g, st_slice family); /* NULL = keep all */

/* The tablet reader behind sto_iter: takes the merged iterator, refs gc (may be NULL). Rows
 * outside range are never returned. */
typedef struct sto_rowreader sto_rowreader;
st_code sto_rowreader_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us,
                          const sto_range *range, bool reverse, sto_rowreader **out, st_err *err);
st_code sto_rowreader_next(sto_rowreader *r, sto_cell *cell, st_err *err);
void sto_rowreader_skip_row(sto_rowreader *r);
st_slice sto_rowreader_last_scanned_row(sto_rowreader *r);
void sto_rowreader_free(sto_rowreader *r);

/* Wraps the merged inputs of a compaction and yields only the entries to keep, in order
 * (forward only: seek_first then next). Tombstones whose version is below drop_tombstones_below
 * are dropped when full. */
sto_kviter *sto_compact_iter_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us, bool full,
                                 uint64_t drop_tombstones_below);

#endif
