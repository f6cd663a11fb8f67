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
#define STO_GC_FAMILIES_MAX 4096  /* families in one set */
#define STO_GC_DEPTH_MAX 16       /* nesting of union / intersection */
#define STO_GC_RULE_NODES_MAX 256 /* rules in one family's tree (Bigtable: <= 500 bytes) */
/* Deep copy. ST_INVALID_ARGUMENT for a bad rule (unknown kind, negative limit, too deep or large)
 * or a family named twice; ST_RESOURCE_EXHAUSTED if memory runs out. Free with unref. */
st_code sto_gc_set_new(const sto_family_gc *fams, size_t n, sto_gc_set **out);
void sto_gc_set_ref(sto_gc_set *g);
void sto_gc_set_unref(sto_gc_set *g);
const sto_gc_rule *sto_gc_set_find(const sto_gc_set *g, st_slice family); /* NULL = keep all */
/* Whether a visible cell is garbage under r: rank is its 1-based position among the visible cells
 * of its column, newest first; max_age garbage is ts_us < now_us - max_age_us. With
 * versions_known false, MAX_VERSIONS counts as "not garbage" (what is safe for a compaction that
 * does not see every table); rules are monotone, so that errs towards keeping. An empty
 * intersection keeps everything. */
bool sto_gc_rule_garbage(const sto_gc_rule *r, int64_t rank, int64_t ts_us, int64_t now_us,
                         bool versions_known);

/* The tablet reader behind sto_iter: takes the merged iterator (freed by sto_rowreader_free, or
 * at once when creation fails), refs gc (may be NULL). Rows outside range are never returned, nor
 * cells of family kinds flags (STO_ITER_USER / STO_ITER_SYSTEM) leave out.
 * next: ST_NOT_FOUND at the end; ST_DATA_LOSS for a malformed key; the merged iterator's error
 * otherwise; errors are sticky. The cell's slices are valid until the next call on r.
 * skip_row: the next call starts at the row after the last returned cell's row (no-op before
 * the first cell). last_scanned_row: the last in-range row examined, cells visible or not
 * (empty before any); valid until the next call on r. */
typedef struct sto_rowreader sto_rowreader;
st_code sto_rowreader_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us,
                          const sto_range *range, bool reverse, unsigned flags, sto_rowreader **out,
                          st_err *err);
st_code sto_rowreader_next(sto_rowreader *r, sto_cell *cell, st_err *err);
void sto_rowreader_skip_row(sto_rowreader *r);
st_slice sto_rowreader_last_scanned_row(sto_rowreader *r);
uint64_t sto_rowreader_rows(const sto_rowreader *r); /* rows entered so far, in range */
void sto_rowreader_free(sto_rowreader *r);

/* Wraps the merged inputs of a compaction (taken) and yields only the entries to keep, in order
 * (forward only: seek_first then next; seek, seek_last and prev make it fail with ST_INTERNAL).
 * Tombstones whose version is below drop_tombstones_below are dropped when full; a tombstone that
 * a kept tombstone of the same or a wider scope with a version at least as high makes redundant
 * is dropped always (a column tombstone: when that one is among the last 16 kept in its column;
 * otherwise it is kept, harmlessly). A malformed key ends it with ST_DATA_LOSS. NULL if memory
 * runs out. */
sto_kviter *sto_compact_iter_new(sto_kviter *merged, sto_gc_set *gc, int64_t now_us, bool full,
                                 uint64_t drop_tombstones_below);

/* The cells of user families a compaction dropped as GC garbage (sto_gc_report_fn), in key
 * order, encoded one after the other in data: row, family and qualifier each as a fixed32 length
 * and the bytes, then the fixed64 timestamp. Cells that would take data past max_bytes (or that
 * met an allocation failure) are only counted in cut. */
typedef struct sto_gc_report_buf {
    st_buf data;
    size_t max_bytes;
    uint64_t cells, cut;
} sto_gc_report_buf;
/* As sto_compact_iter_new, also appending to report (not taken; may be NULL) every cell it drops
 * as GC garbage of a user family. */
sto_kviter *sto_compact_iter_new_report(sto_kviter *merged, sto_gc_set *gc, int64_t now_us,
                                        bool full, uint64_t drop_tombstones_below,
                                        sto_gc_report_buf *report);
/* The cell at *pos of report->data (slices into it), advancing *pos; false at the end. */
bool sto_gc_report_next(const sto_gc_report_buf *report, size_t *pos, sto_gc_dropped *out);

#endif
