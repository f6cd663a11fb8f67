/* tablet_impl.h — private to the tablet files (storage/tablet*.c): a snapshot's layout and the
 * merged read over it, which the sampling code walks too. tablet.c creates, drops and splits
 * tablets; tablet_snapshot.c takes snapshots and reads them; tablet_sample.c samples row keys
 * and finds split points. The engine's shared state is in db_impl.h. */
#ifndef STO_TABLET_IMPL_H
#define STO_TABLET_IMPL_H

#include "db_impl.h"

typedef struct snap_sst {
    sto_sst *sst;
    bool wrap;
    bool nosys; /* sto_tsst.nosys */
} snap_sst;

typedef struct sto_snapset sto_snapset; /* the shared table list (tablet_snapshot.c) */

struct sto_snapshot {
    sto_tablet *t;
    uint64_t lsn;
    sto_memtable **mems;
    size_t n_mems;
    sto_snapset *set; /* holds the tables ssts points at */
    const snap_sst *ssts;
    size_t n_ssts;
    sto_gc_set *gc;
    sto_sst_keep keep; /* shared by the snapshot's iterators (sst.h): repeated seeks into an
                        * uncached block, one per range of a ReadRows, read it once */
};

/* ikey bounds of a read range, for skipping tables that cannot hold any of its rows. */
typedef struct key_bounds {
    st_buf lo, hi;
    bool point; /* a single row: the bloom filter applies */
} key_bounds;

/* The merged iterator over the snapshot's memtables and the tables that may hold rows within b,
 * one child per sorted run; NULL when out of memory. counts (may be NULL) gets the number of
 * memtable children and of SSTable runs. */
sto_kviter *tablet_snapshot_merge(sto_snapshot *s, const key_bounds *b, int counts[2]);

#endif
