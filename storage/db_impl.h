/* db_impl.h — the engine's private structures, shared by db.c, tablet*.c, write.c, flush.c,
 * compaction.c and manifest.c (private to storage/).
 *
 * Locks, always taken in this order (never the reverse):
 *   t->gate       (rwlock) writers read-hold it from validation to log append (tablets in id
 *                 order); split and drop write-hold it so no new record for the tablet enters
 *                 the log while they wait for the records already there to be applied.
 *   db->meta_mu   serialises metadata changes (SSTable lists, tablet set, holders) together with
 * the manifest rewrite that makes them durable; held across that I/O, but no writer or reader ever
 * takes it. db->mu        the tablet map, job flags, holders, stall and worker conditions. Short.
 *   t->mu         the tablet's memtable and SSTable lists. Short; the commit thread holds it while
 *                 it applies one record, snapshots while they copy the lists.
 * The commit thread (the log's) is the single memtable writer; it takes only t->mu. */
#ifndef STO_DB_IMPL_H
#define STO_DB_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "key.h"
#include "kviter.h"
#include "log.h"
#include "memtable.h"
#include "rowread.h"
#include "sst.h"
#include "strata/storage.h"

#define STO_IMM_STALL_MAX 2                  /* immutable memtables above which writers stall */
#define STO_COMPACT_OUTPUT_BYTES (64u << 20) /* default sto_options.compaction_output_bytes */
#define STO_COMPACT_INPUTS_MAX 32            /* SSTables merged by one size-tiered compaction */
#define STO_SMALL_SST_BYTES (2u << 20)       /* tables below this size form one tier */
/* Sorted runs of half the compaction output size or more (compaction outputs, a sequentially
 * written tablet's tables) are settled: write stalls and the small-run tiers count only smaller
 * runs. Settled runs tier among themselves (compaction_trigger runs of similar size are merged),
 * so repeated overwrites of a big key range do not pile up runs until the periodic full
 * compaction; a single run, however many files it has, is never merged into itself. */
#define STO_SETTLED_SST_BYTES(db) ((uint64_t)(db)->o.compaction_output_bytes / 2)
#define STO_HOLDERS_MAX 64 /* named log holders */
#define STO_HOLDER_NAME_MAX 128
#define STO_PATH_MAX 4096
#define STO_TABLETS_MAX 100000      /* tablets per node */
#define STO_RETRY_MIN_US 50000      /* first retry of a failed flush */
#define STO_RETRY_MAX_US 5000000    /* backoff cap for failed flushes/compactions */
#define STO_WRITE_ROWS_MAX 1000000  /* row mutations per sto_write call */
#define STO_MUTS_PER_ROW_MAX 100001 /* mutations per row mutation: STO_ROW_MUTS_MAX */
#define STO_RO_MSG_MAX ST_ERR_MSG_MAX
/* A tablet with tables gets a full compaction at least this often (engine clock), so old
 * tombstones and max-versions garbage go even when the table count stays low. */
#define STO_FULL_COMPACTION_PERIOD_US (24LL * 3600 * 1000000)
/* Read-triggered compaction (compaction.c), LevelDB's seek compaction by CPU: every read charges
 * its tablet one unit per sorted run it merged beyond the first, and once the units reach the
 * tablet's SSTable bytes / STO_READ_SEEK_BYTES (at least STO_READ_DEBT_MIN) the tablet is
 * compacted whole. Reads that merged a memtable with other sources get a write-idle tablet's
 * memtable flushed after STO_READ_DEBT_MIN units. Measured on the tablets `strata bench` leaves
 * after its overwrites (6 runs + memtable, ~300 MB of listed files each): a unit cost a point read
 * ~4 us of CPU and the full compaction ~0.6 ns per listed byte, so at this ratio the reads have
 * wasted about what the compaction costs (ski rental: never more than twice the better of
 * compacting at once and never compacting). */
#define STO_READ_SEEK_BYTES 8192
#define STO_READ_DEBT_MIN 16384
/* A read-hot tablet whose last applied record has not changed for this long is write-idle: its
 * memtable is frozen and flushed (before a read-triggered compaction, so that takes it in). */
#define STO_WRITE_IDLE_US 250000

/* One SSTable file known to the engine. Tablets list it (tablet_refs, under meta_mu); when the
 * last tablet lets go it is marked obsolete and the db's reference dropped, so the file goes once
 * the last snapshot reading it ends. sst is NULL when the file could not be opened at recovery. */
typedef struct sto_file {
    uint64_t number;
    sto_sst *sst;
    uint64_t bytes;
    int tablet_refs;
    /* a restored file whose identity (st_env's file_id) is known: it is in db->restored, so
     * every tablet later restored from a link of the same file lists it under this number */
    bool has_id;
    uint64_t dev, ino;
} sto_file;

/* A tablet's use of a file: wrap when the file holds rows outside the tablet (shared with the
 * other half of a split), so reads restrict it with sto_range_iter_new. */
typedef struct sto_tsst {
    sto_file *f;
    bool wrap;
    /* the file came from a backup (sto_tablet_restore): its system-family entries (another
     * table's change history) are not part of this tablet, so reads and compactions skip them */
    bool nosys;
} sto_tsst;

/* A frozen memtable waiting for flush; upto_lsn: every record of the tablet with lsn <= upto_lsn
 * is in this or an older memtable (or already flushed). */
typedef struct sto_imm {
    sto_memtable *m;
    uint64_t upto_lsn;
    size_t bytes;
} sto_imm;

struct sto_tablet {
    sto_db *db;
    uint64_t id;
    st_buf table, start, end; /* owned copies */
    st_buf lo, hi;            /* enc(start), enc(end): ikey bounds ([lo, hi), empty = open) */
    pthread_rwlock_t gate;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* inflight reached zero */
    /* under mu */
    sto_memtable *active;
    size_t active_bytes;
    uint64_t active_first_lsn; /* lsn of the first record in active (0 = empty) */
    sto_imm *imm;              /* oldest first */
    size_t n_imm, cap_imm;
    sto_tsst *ssts; /* newest first */
    size_t n_ssts, cap_ssts;
    struct sto_snapset *snapset; /* ssts as snapshots share them (tablet_snapshot.c), or NULL */
    uint64_t list_gen;           /* counts changes of ssts (sto_tablet_update_hints_locked) */
    sto_gc_set *gc;
    /* sto_tablet_set_gc_report: the function and its argument change under report_mu and t->mu
     * (in that order); compaction reads them under t->mu to decide whether to collect, and calls
     * the function holding report_mu, so a change waits for a running call */
    pthread_mutex_t report_mu;
    sto_gc_report_fn report_fn;
    void *report_arg;
    uint64_t last_applied_lsn;
    uint64_t flushed_lsn;
    /* files numbered below it were restored from a backup: read without system families
     * (sto_tsst.nosys); 0 = none. Set at restore, inherited by split children, in the manifest. */
    uint64_t sys_floor;
    bool read_only;
    bool broken; /* an SSTable could not be opened: reads fail too */
    char ro_msg[STO_RO_MSG_MAX];
    atomic_long inflight;      /* records appended to the log, not yet applied */
    atomic_int n_ssts_hint;    /* copies readable without mu (job picking, stalls) */
    atomic_int n_small_hint;   /* sorted runs below STO_SETTLED_SST_BYTES (compaction.c) */
    atomic_int n_settled_hint; /* the largest tier of runs at or above it */
    atomic_int n_runs_hint;    /* all sorted runs */
    /* the size tiers were due by count, yet held no tier to merge (runs too unlike in size):
     * not due again until the list changes (compaction.c) */
    atomic_bool no_tier_hint;
    atomic_int n_imm_hint;
    atomic_uint_fast64_t bytes_hint; /* bytes of the listed files */
    /* read charges since the last full compaction (sto_tablet_charge_reads): for sorted runs
     * beyond the first, and for memtables merged with other sources */
    atomic_uint_fast64_t read_debt, mem_debt;
    atomic_bool ro_hint;
    /* a split or drop waits for the tablet: a running compaction gives way (compaction.c) */
    atomic_bool yield_hint;
    /* under db->mu (kept apart from the atomics above: a compiler may load neighbouring plain
     * bools with one wider read, which would overlap an atomic) */
    int64_t retry_at_us, backoff_us;
    int64_t split_hold_us; /* monotonic; no compaction starts before it (split_ready) */
    int64_t last_full_us;  /* engine clock; the last full compaction (or load / creation) */
    /* read-triggered compaction's write-idle check: last_applied_lsn as seen at idle_check_us
     * (monotonic; 0 = no check pending) */
    uint64_t idle_lsn;
    int64_t idle_check_us;
    st_code bg_code;
    bool dead, busy, flushing, compacting;
    char bg_msg[STO_RO_MSG_MAX];
};

typedef struct sto_holder {
    char name[STO_HOLDER_NAME_MAX];
    uint64_t lsn;
} sto_holder;

struct sto_db {
    char dir[STO_PATH_MAX];
    sto_options o;
    st_env *env;
    st_lock *lock; /* dir/LOCK, held while open (NULL when the env cannot lock) */
    st_clock *clock;
    sto_log *log;
    sto_cache *cache;
    pthread_mutex_t meta_mu;
    pthread_mutex_t mu;
    pthread_cond_t bg_cv;    /* work for the workers */
    pthread_cond_t stall_cv; /* a tablet's lists shrank: stalled writers, flush claims */
    /* under mu */
    sto_tablet **tablets; /* sorted by id */
    size_t n_tablets, cap_tablets;
    sto_tablet **dead; /* split or dropped tablets, freed at close (pointers stay valid) */
    size_t n_dead, cap_dead;
    uint64_t next_file;
    sto_holder holders[STO_HOLDERS_MAX];
    size_t n_holders;
    /* What the manifest loaded at open says of the commit log (docs/formats/manifest.md):
     * the oldest segment that must exist, and the log's durable end when it was written. */
    uint64_t mf_log_first, mf_log_last;
    bool stopping;
    int64_t mem_check_at_us;
    /* under meta_mu */
    sto_file **restored; /* restored files by identity: a hash set (backup.c), NULL slots free */
    size_t n_restored, cap_restored;
    sto_file **obsolete; /* unreferenced files awaiting a successful manifest write */
    size_t n_obsolete, cap_obsolete;
    atomic_bool manifest_dirty; /* also peeked without meta_mu by the workers */
    pthread_t *workers;
    int n_workers;
    atomic_uint_fast64_t applied_lsn; /* last record applied to memtables */
    atomic_llong mem_bytes;
    atomic_uint_fast64_t flushes, compactions, stalls_us;
};

/* ---- backup.c: restored files by identity (meta_mu held, or the engine not yet running) ----
 * Restoring links each file of a backup piece into the engine. The pieces of one tablet's split
 * children hold one file (hard links of one inode), and so do restored tablets' own files: each
 * tablet restored from a link of a file the engine already lists as restored lists that file too
 * (tablet_refs), as split children share their parent's, instead of a new number per tablet. */
/* Forgets f (its last tablet let go: the file goes, and its inode may be reused). */
void sto_restored_forget(sto_db *db, sto_file *f);
/* After the manifest is loaded: notes every file a tablet lists as restored (sto_tsst.nosys). */
void sto_restored_load(sto_db *db);

/* ---- db.c ---- */
sto_tablet *sto_db_find_locked(sto_db *db, uint64_t id); /* db->mu held */
st_code sto_db_insert_locked(sto_db *db, sto_tablet *t, st_err *err);
void sto_db_remove_locked(sto_db *db, sto_tablet *t); /* moves t to the dead list */
st_code sto_tablet_alloc(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                         sto_tablet **out, st_err *err);
void sto_tablet_release(sto_tablet *t); /* frees a tablet never published or at close */
void sto_db_sst_path(const sto_db *db, uint64_t number, char *out, size_t cap);
uint64_t sto_db_new_file_number(sto_db *db);
st_code sto_file_new(sto_db *db, uint64_t number, sto_file **out, st_err *err); /* opens */
/* meta_mu held: one tablet reference less; at zero queue for deletion after the manifest write. */
void sto_file_drop_ref(sto_db *db, sto_file *f);
/* meta_mu held, after a successful manifest write: delete queued files. */
void sto_db_release_obsolete(sto_db *db);
bool sto_tsst_needs_wrap(const sto_tablet *t, const sto_file *f);
sto_tsst sto_tsst_of(const sto_tablet *t, sto_file *f); /* f as t lists it: wrap and nosys set */
void sto_tablet_update_hints_locked(sto_tablet *t);     /* t->mu held, after the lists changed */
void sto_tablet_drop_snapset(sto_tablet *t);            /* t->mu held, or t no longer shared */
void sto_db_kick(sto_db *db);                           /* wakes workers */
void sto_tablet_mark_read_only(sto_tablet *t, st_code code, const char *msg);
int64_t sto_db_now_us(sto_db *db);

/* ---- manifest.c (docs/formats/manifest.md) ---- */
/* meta_mu held: writes the current state (plus optional edits applied by edit(state, arg)),
 * trims the log on success and releases obsolete files. */
typedef struct sto_mf_state sto_mf_state;
typedef st_code (*sto_mf_edit_fn)(sto_mf_state *st, void *arg, st_err *err);
st_code sto_manifest_write(sto_db *db, sto_mf_edit_fn edit, void *arg, st_err *err);
/* Edits available to edit callbacks. */
st_code sto_mf_remove_tablet(sto_mf_state *st, uint64_t id);
st_code sto_mf_add_tablet(sto_mf_state *st, uint64_t id, st_slice table, st_slice start,
                          st_slice end, uint64_t flushed_lsn, uint64_t sys_floor,
                          const uint64_t *files, size_t n, st_err *err);
st_code sto_mf_set_holder(sto_mf_state *st, const char *name, uint64_t lsn, bool remove,
                          st_err *err);
/* Reads the manifest (absent = fresh db) and builds tablets and files; recovery. */
st_code sto_manifest_load(sto_db *db, uint64_t *replay_from, st_err *err);
/* Removes SSTable files no tablet lists (crashed flushes and compactions); refuses (or with
 * accept_data_loss sets aside) those the manifest never knew that hold writes newer than the log.
 */
st_code sto_manifest_remove_orphans(sto_db *db, st_err *err);

/* ---- write.c ---- */
/* t->mu held: freezes the active memtable when not empty; returns true if it did. */
bool sto_tablet_freeze_locked(sto_tablet *t);
st_code sto_validate_mut(const sto_row_mut *r, st_err *err);
/* Applies one replayed record (recovery, single-threaded). */
st_code sto_replay_apply(sto_db *db, const sto_log_record *rec);

/* ---- flush.c ---- */
/* An env for SSTable writers over inner: appends are buffered (STO_SST_WBUF_BYTES) and written
 * out when the buffer fills, on sync and on close; removes and directory calls pass through;
 * reads are refused. No resources: it lives as long as the writers using it. */
#define STO_SST_WBUF_BYTES ((size_t)256 << 10)
typedef struct sto_wbuf_env {
    st_env base;
    st_env *inner;
} sto_wbuf_env;
void sto_wbuf_env_init(sto_wbuf_env *e, st_env *inner);
/* Flushes the tablet's frozen memtables (oldest first) now, in the calling thread. */
st_code sto_tablet_flush_imms(sto_db *db, sto_tablet *t, st_err *err);
/* A worker's turn: flushes one memtable if any is due. db->mu held on entry and exit. */
bool sto_flush_pick_and_run(sto_db *db);
/* Freezes memtables when the node-wide budget or the unflushed log is over its bound. */
void sto_flush_check_pressure(sto_db *db);

/* ---- compaction.c ---- */
bool sto_compaction_pick_and_run(sto_db *db); /* db->mu held on entry and exit */
/* Sorted runs of l[0, n) (a tablet's list, newest first) below settled_bytes (*small), the
 * most runs at or above it that form one tier (*settled: each within 2x of the tier's
 * smallest), and all runs (*runs). A run is a stretch of consecutive tables with pairwise
 * disjoint key ranges, grouped as reads group them. */
void sto_compaction_count_runs(const sto_tsst *l, size_t n, uint64_t settled_bytes, int *small,
                               int *settled, int *runs);
/* Adds to t's read debts (see STO_READ_SEEK_BYTES): run_units for sorted runs a read merged
 * beyond the first, mem_units for memtables it merged with other sources. Any thread, no lock. */
void sto_tablet_charge_reads(sto_tablet *t, uint64_t run_units, uint64_t mem_units);
/* Compacts all of the tablet's SSTables (full), claiming the tablet's compaction slot. */
st_code sto_compaction_full(sto_db *db, sto_tablet *t, st_err *err);
/* The merged kviter over a set of files of t (range-wrapped where shared); NULL on OOM. */
sto_kviter *sto_tablet_sst_merge(sto_tablet *t, sto_tsst *files, size_t n);

#endif
