/* strata/storage.h — the LSM engine of one node: tablets (key-range stores) that share one
 * commit log, a block cache and background flush/compaction threads.
 *
 * Data model. A cell is keyed by (row, family, qualifier, timestamp) and has a byte-string value.
 * Every row mutation carries a caller-chosen 64-bit `version` (the node derives it from the
 * commit timestamp and the origin cluster): for two writes of the same cell the higher version
 * wins, and a delete covers only entries with a lower version. Applying the same row mutation
 * twice therefore changes nothing, and applying a set of row mutations in any order gives the
 * same contents — the property replication relies on.
 *
 * Threads. All calls are thread-safe. sto_write blocks until the write is durable (group commit:
 * concurrent writers share one fdatasync); sto_write_async returns at once and calls back from
 * the engine's commit thread. Flush and compaction run on the engine's own threads. storage/
 * never includes libevent: callers that run an event loop post the callback into it themselves.
 *
 * Errors. ST_INVALID_ARGUMENT for a bad request; ST_NOT_FOUND for a missing tablet or the end of
 * an iteration; ST_RESOURCE_EXHAUSTED for a full disk (the write is not applied; the engine keeps
 * serving reads and retries flushes); ST_DATA_LOSS for corruption (checksum mismatch, bad block),
 * which ends the read that met it and marks the tablet read-only; ST_INTERNAL for other I/O errors.
 * The engine never aborts on bad data. */
#ifndef STRATA_STORAGE_H
#define STRATA_STORAGE_H

#include "strata/base.h"
#include "strata/env.h"

typedef struct sto_db sto_db;
typedef struct sto_tablet sto_tablet;
typedef struct sto_snapshot sto_snapshot;
typedef struct sto_iter sto_iter;
typedef struct sto_tomb_iter sto_tomb_iter;
typedef struct sto_log_reader sto_log_reader;

/* ---- options ---- */
typedef struct sto_options {
    st_env *env;                  /* NULL = st_env_posix() */
    st_clock *clock;              /* NULL = st_clock_system(); used for GC max-age */
    bool sync;                    /* false: writes are not durable before ack (logged loudly) */
    size_t memtable_bytes;        /* a tablet's memtable is frozen at this size (32 MiB) */
    size_t memtable_budget_bytes; /* all memtables of the node; above it, flush largest (256 MiB) */
    size_t block_cache_bytes;     /* block cache bound (64 MiB) */
    size_t block_bytes;           /* target uncompressed data block size (16 KiB) */
    int bloom_bits_per_key;       /* 10 */
    int zstd_level;               /* zstd level of SSTable blocks (-3, a fast level) */
    int compaction_trigger;       /* sorted runs per tablet that start a compaction (4) */
    int write_stall_tables;       /* sorted runs per tablet at which writes stall (20) */
    /* Compaction output files are cut near this size (64 MiB); sorted runs of half of it or more
     * are "settled" (compaction.c). Tests lower it to exercise big runs with little data. */
    size_t compaction_output_bytes;
    size_t log_segment_bytes; /* commit log segment size (64 MiB) */
    /* Open even when the last commit log segment was cut short (truncated from outside, so
     * acknowledged writes at its end are gone): keep what is left and log what was dropped
     * (event=log_data_loss_accepted). false (default): sto_db_open fails with ST_DATA_LOSS
     * naming the file (docs/formats/log.md). */
    bool accept_data_loss;
    size_t
        log_max_unflushed_bytes; /* force flushes when the unflushed log exceeds this (512 MiB) */
    int64_t tombstone_grace_us;  /* compactions keep tombstones this long (7 days) */
    int background_threads;      /* flush + compaction workers (2) */
} sto_options;

/* Fills o with the defaults in the comments above. */
void sto_options_default(sto_options *o);

/* ---- garbage-collection rules (per family) ---- */
typedef enum sto_gc_kind {
    STO_GC_NONE = 0,         /* keep everything */
    STO_GC_MAX_VERSIONS = 1, /* keep the newest max_versions cells of each column */
    STO_GC_MAX_AGE = 2,      /* drop cells whose timestamp is older than now - max_age_us */
    STO_GC_UNION = 3,        /* garbage if any child says so */
    STO_GC_INTERSECTION = 4, /* garbage only if every child says so */
} sto_gc_kind;

typedef struct sto_gc_rule {
    sto_gc_kind kind;
    int64_t max_versions;
    int64_t max_age_us;
    const struct sto_gc_rule *children;
    size_t n_children;
} sto_gc_rule;

typedef struct sto_family_gc {
    st_slice family;
    sto_gc_rule rule;
} sto_family_gc;

/* ---- mutations ---- */
typedef enum sto_mut_type {
    STO_MUT_SET_CELL = 1,
    STO_MUT_DEL_COLUMN = 2, /* cells of (family, qualifier) with ts in [ts_start_us, ts_end_us) */
    STO_MUT_DEL_FAMILY = 3,
    STO_MUT_DEL_ROW = 4,
} sto_mut_type;

#define STO_TS_END_INF INT64_MAX

typedef struct sto_mut {
    sto_mut_type type;
    st_slice family;                /* SET_CELL, DEL_COLUMN, DEL_FAMILY */
    st_slice qualifier;             /* SET_CELL, DEL_COLUMN */
    int64_t ts_us;                  /* SET_CELL: resolved timestamp, >= 0 */
    int64_t ts_start_us, ts_end_us; /* DEL_COLUMN; end STO_TS_END_INF = unbounded */
    st_slice value;                 /* SET_CELL */
} sto_mut;

/* One row's mutations, applied atomically (all or nothing, also across a crash) in list order:
 * within one row mutation a later SetCell of the same cell replaces an earlier one. */
typedef struct sto_row_mut {
    uint64_t tablet_id;
    st_slice row;
    const sto_mut *muts;
    size_t n_muts;
    uint64_t version;      /* conflict order, STO_VERSION(commit_ts_us, tiebreak); see the top */
    uint64_t commit_ts_us; /* origin commit time, carried to the log for replication/streams */
    uint32_t origin;       /* origin cluster number, carried to the log */
    uint32_t flags;        /* STO_ROW_* below, carried to the log */
} sto_row_mut;

/* A version is the commit timestamp in microseconds with a tiebreaker (the origin cluster number)
 * in the low bits, so versions order writes by (commit time, cluster) and storage can tell a
 * tombstone's age for tombstone_grace_us. */
#define STO_VERSION_TIEBREAK_BITS 10
/* The largest tiebreaker, so the largest origin cluster number a version can carry: the one
 * limit strata-node --cluster-num, replication's Apply and tablet moves all check. */
#define STO_ORIGIN_MAX ((1u << STO_VERSION_TIEBREAK_BITS) - 1)
#define STO_VERSION(commit_ts_us, tiebreak)                                                        \
    (((uint64_t)(commit_ts_us) << STO_VERSION_TIEBREAK_BITS) |                                     \
     ((uint64_t)(tiebreak)&STO_ORIGIN_MAX))
#define STO_VERSION_TS_US(version) ((int64_t)((version) >> STO_VERSION_TIEBREAK_BITS))

#define STO_ROW_REPLICATED 1u /* came in by replication: never shipped onward */
#define STO_ROW_GC 2u         /* a garbage-collection delete (change streams) */

#define STO_ROW_KEY_MAX 4096
#define STO_QUALIFIER_MAX 16384
#define STO_VALUE_MAX (100u << 20)
/* Mutations in one row mutation: the API's 100,000 and, on a table with change streams, the
 * row's change record cell, which is written in the same row mutation (docs/changestreams.md). */
#define STO_ROW_MUTS_MAX 100001u

/* ---- the row mutation encoding (docs/formats/log.md, row mutation payload) ----
 * The payload of a commit log record; replication and tablet moves carry the same bytes. */

/* Appends row's encoding to out. ST_INVALID_ARGUMENT for an unknown mutation type, a row key over
 * STO_ROW_KEY_MAX or more than STO_ROW_MUTS_MAX mutations; ST_RESOURCE_EXHAUSTED without memory
 * (out unchanged in both cases). */
st_code sto_row_mut_encode(st_buf *out, const sto_row_mut *row);
/* Decodes the fields before the mutations (tablet id, row key, version, commit time, origin,
 * flags, mutation count) into row without allocating: muts is NULL, n_muts the count; slices
 * point into data. The mutations are not checked: false only for a malformed head. For readers
 * that only route or skip a record. */
bool sto_row_mut_peek(st_slice data, sto_row_mut *row);
/* Decodes into row; muts are allocated from arena (freed with it); slices point into data, so
 * row is valid while both are. false for bytes that are not exactly one valid encoding. */
bool sto_row_mut_decode(st_slice data, sto_row_mut *row, st_arena *arena);

/* ---- the node's engine ---- */

/* Opens (creating when absent) the engine in dir and recovers: replays the commit log after each
 * tablet's flushed point; a torn tail record is discarded (never acknowledged). ST_DATA_LOSS for
 * damaged acknowledged records still needed (by replay or a log holder), among them a last log
 * segment cut short unless accept_data_loss; damaged records nobody needs are skipped with a
 * warning (event=log_damage_skipped). Options are copied. */
st_code sto_db_open(const char *dir, const sto_options *opts, sto_db **out, st_err *err);
/* Waits for background work to stop and closes. Unflushed data stays in the log. */
void sto_db_close(sto_db *db);

/* Tablets. A tablet covers rows [start, end) of one table; an empty end is unbounded. Tablet ids
 * are chosen by the caller and unique within the node. Returned pointers are valid until the
 * tablet is dropped or split, or the db is closed. */
typedef struct sto_tablet_info {
    uint64_t id;
    st_slice table; /* the table name, opaque to storage */
    st_slice start, end;
    uint64_t approx_bytes; /* SSTables + memtable */
    uint64_t flushed_lsn;
    int sst_count;
    bool read_only;        /* set after corruption was met */
    bool writes_in_flight; /* writes in the commit log, not in the memtable yet */
} sto_tablet_info;

st_code sto_tablet_create(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                          sto_tablet **out, st_err *err);
st_code sto_tablet_get(sto_db *db, uint64_t id, sto_tablet **out); /* ST_NOT_FOUND */
/* Calls fn for each tablet (in id order) with info valid during the call. */
void sto_tablet_list(sto_db *db, void (*fn)(const sto_tablet_info *info, void *arg), void *arg);
void sto_tablet_info_get(sto_tablet *t, sto_tablet_info *out); /* slices valid while t lives */
/* Drops the tablet and, once no snapshot uses them, its files. */
st_code sto_tablet_drop(sto_db *db, uint64_t id, st_err *err);
/* Whether a split of tablet id would now be quick. A split holds the tablet's writes while it
 * waits for the tablet's running flush or compaction and flushes its memtable, all on the
 * caller's thread (a server's event loop). ST_OK: none runs and the memtable holds at most
 * max_mem_bytes. ST_UNAVAILABLE: not yet; a larger memtable was frozen for the background flush
 * and no new compaction starts on the tablet for a few seconds, so asking again soon succeeds.
 * ST_NOT_FOUND: no such tablet. */
st_code sto_tablet_split_ready(sto_db *db, uint64_t id, size_t max_mem_bytes);
/* Splits at split_row (start < split_row < end): left = [start, split_row), right =
 * [split_row, end). Both children share the parent's SSTables (no data copy); the parent id is
 * gone afterwards. Durable when it returns. */
st_code sto_tablet_split(sto_db *db, uint64_t id, st_slice split_row, uint64_t left_id,
                         uint64_t right_id, st_err *err);
/* Replaces the family GC rules of the tablet (kept in memory; the node sets them after open).
 * Families without a rule keep everything. Rules and slices are copied. */
st_code sto_tablet_set_gc(sto_tablet *t, const sto_family_gc *fams, size_t n, st_err *err);
/* ---- garbage-collection report (change streams) ----
 * When a compaction of a tablet drops cells of user families because its GC rules (max versions,
 * max age) made them garbage, storage reports them to the tablet's report function: not cells
 * hidden by deletes, not overwritten duplicates, not cells of system families. Flushes apply no
 * GC rules, so only compactions report. A compaction sees only its tablet's rows (a split child
 * reads the tables it shares with its sibling through its own range), so only those are reported.
 *
 * fn runs once the compaction's new files are installed (durable), on the thread that ran the
 * compaction: a storage worker, or the caller of sto_tablet_compact. It gets the cells in
 * batches (at most STO_GC_REPORT_BATCH cells and about STO_GC_REPORT_BATCH_BYTES of names per
 * call), in key order, and its slices are valid during the call only. It must return soon and
 * must not wait for anything that may wait for storage (a node posts the cells to its loop and
 * returns); it must not call sto_tablet_set_gc_report for its own tablet (that waits for it).
 * A crash between the install and the call loses the report (the cells are gone either way).
 * A compaction judges only its inputs: a cell can be reported again when an older copy of it
 * (same row, family, qualifier and timestamp) lived in a table outside the compaction, and a cell
 * that a delete in a table outside the compaction hides is reported like any other. A compaction
 * holds its report in memory up to STO_GC_REPORT_MAX_BYTES; cells past that are left out of the
 * report (logged: event=gc_report_cut). */
typedef struct sto_gc_dropped {
    st_slice row, family, qualifier;
    int64_t ts_us;
} sto_gc_dropped;
typedef void (*sto_gc_report_fn)(uint64_t tablet_id, const sto_gc_dropped *cells, size_t n,
                                 void *arg);
#define STO_GC_REPORT_BATCH 1000
#define STO_GC_REPORT_BATCH_BYTES (1u << 20)
#define STO_GC_REPORT_MAX_BYTES (64u << 20)
/* Sets (fn NULL: clears) the tablet's report function. When it returns, no call of the previous
 * function is running or will start. Split children inherit their parent's. */
void sto_tablet_set_gc_report(sto_tablet *t, sto_gc_report_fn fn, void *arg);

/* Deletes every row with the given prefix (empty = all rows): DropRowRange. Durable on return. */
st_code sto_tablet_drop_prefix(sto_db *db, uint64_t id, st_slice prefix, uint64_t version,
                               st_err *err);
/* Freezes and flushes the tablet's memtable now (tests, backups). */
st_code sto_tablet_flush(sto_db *db, uint64_t id, st_err *err);
/* Compacts all SSTables of the tablet into one now (tests, the CLI). */
st_code sto_tablet_compact(sto_db *db, uint64_t id, st_err *err);

/* ---- backups (docs/backups.md) ---- */

/* One SSTable of a frozen tablet: linked as <dir>/<number as 20 digits>.sst. */
typedef struct sto_backup_file {
    uint64_t number;
    uint64_t bytes;
} sto_backup_file;

/* Freezes tablet id: while its writes, flushes and compactions wait, flushes its memtables and
 * hard-links the SSTables that then hold exactly its contents into dir (which must exist, on the
 * engine's file system), then syncs dir. The files may hold rows outside the tablet's range
 * (shared with a split sibling). *files (free() it) lists them in the tablet's read order,
 * newest first: the order sto_tablet_restore takes. ST_NOT_FOUND when the tablet is not here;
 * ST_DATA_LOSS for a damaged tablet; on any error no link is left in dir. */
st_code sto_tablet_backup(sto_db *db, uint64_t id, const char *dir, sto_backup_file **files,
                          size_t *n, st_err *err);
/* Holds tablet id read-only for damage found outside storage's own reads (a backup that checked
 * one of its SSTables): as a read meeting a bad block does, why is kept for `strata status`.
 * ST_NOT_FOUND when the tablet is not here. */
st_code sto_tablet_mark_damaged(sto_db *db, uint64_t id, const char *why);
/* Creates tablet id for rows [start, end) of table from SSTables at paths (read order, as
 * sto_tablet_backup listed them): links them into the engine's sst directory under new file
 * numbers (no copy; same file system; a file a restored tablet already lists, the same inode, is
 * listed under its number instead, as split children share files), restricts reads to the range
 * and makes the tablet durable with one manifest write. A crash before that leaves no tablet (the
 * links are orphans, removed at the next open). The files' system families (another table's change
 * history) are hidden from every read of this tablet and of its split children, and its compactions
 * drop them. Errors: ST_ALREADY_EXISTS for a used id, ST_NOT_FOUND for a missing file, ST_DATA_LOSS
 * for a file that is not a readable SSTable (nothing is created in either case). */
st_code sto_tablet_restore(sto_db *db, uint64_t id, st_slice table, st_slice start, st_slice end,
                           const char *const *paths, size_t n, sto_tablet **out, st_err *err);
/* One tablet of sto_tablets_restore: the arguments of sto_tablet_restore, and its outcome. */
typedef struct sto_restore_spec {
    uint64_t id;
    st_slice table, start, end;
    const char *const *paths;
    size_t n_paths;
    st_code rc;      /* out: as sto_tablet_restore's */
    st_err err;      /* out: why, when rc is not ST_OK */
    sto_tablet *out; /* out: the tablet when rc is ST_OK */
} sto_restore_spec;
/* sto_tablet_restore of n tablets made durable by one manifest write (a write rewrites the list
 * of every tablet of the engine, so one per tablet made a restore of n tablets cost n^2). Each
 * spec (ids distinct) succeeds or fails alone (its rc), except that a failed sync of the links or
 * manifest write fails them all, leaving no file;
 * RESOURCE_EXHAUSTED for a tablet past the engine's maximum (100,000). */
void sto_tablets_restore(sto_db *db, sto_restore_spec *v, size_t n);
/* Reads the whole SSTable at path, a file made elsewhere (an imported backup's), and checks what
 * this engine's writers guarantee and its readers rely on: entries strictly ordered, well-formed
 * keys, the index, count and key range matching the data, and no version above version_max (a
 * version from the future would outrank every later write it meets, and move the clocks of the
 * nodes it is copied to). ST_DATA_LOSS saying what was wrong and where in the file (the caller
 * names the file); ST_NOT_FOUND for a missing file; other I/O errors as the env reports them.
 * Reads through no cache. */
st_code sto_backup_file_verify(sto_db *db, const char *path, uint64_t version_max, st_err *err);

/* ---- writes ---- */

/* Applies n row mutations (each atomic on its own) and returns when all are durable. The tablet
 * must cover each row (ST_OUT_OF_RANGE otherwise, nothing applied). *lsn_out (may be NULL)
 * receives the log position of the last record. Stalls, not fails, while flushing lags. */
st_code sto_write(sto_db *db, const sto_row_mut *rows, size_t n, uint64_t *lsn_out, st_err *err);

typedef void (*sto_write_done_fn)(st_code code, uint64_t lsn, const st_err *err, void *arg);
/* Like sto_write, but returns at once after validation and copying; done runs on the engine's
 * commit thread once durable (or failed). Validation errors are returned directly, done not
 * called. */
st_code sto_write_async(sto_db *db, const sto_row_mut *rows, size_t n, st_err *err,
                        sto_write_done_fn done, void *arg);

/* ---- reads ---- */

/* A consistent view of one tablet, stable while writes, flushes and compactions proceed. */
st_code sto_snapshot_new(sto_tablet *t, sto_snapshot **out, st_err *err);
/* Frees the snapshot; its iterators must be freed first. */
void sto_snapshot_free(sto_snapshot *s);
/* Bytes of data blocks the snapshot's iterators read from disk and decompressed so far (block
 * cache hits are free): the work a read did, for callers that bound it per slice. The
 * snapshot's iterators share the last block the cache could not keep (one larger than a cache
 * shard), so many seeks into it read it once. */
uint64_t sto_snapshot_read_bytes(sto_snapshot *s);

typedef struct sto_range {
    st_slice start;       /* empty = from the first row */
    bool start_exclusive; /* (start, ...] */
    st_slice end;         /* empty = to the last row */
    bool end_inclusive;   /* [..., end] */
} sto_range;

/* One visible cell: deletes and GC rules already applied. Slices are valid until the next call
 * on the iterator. version is that of the entry that made the cell visible (the highest of the
 * cell's duplicates): the row mutation that wrote it, so a copy of the cell (a tablet move) can
 * keep its place in conflict order. */
typedef struct sto_cell {
    st_slice row;
    st_slice family;
    st_slice qualifier;
    int64_t ts_us;
    st_slice value;
    uint64_t version;
} sto_cell;

/* System families. A family whose name starts with the byte STO_SYSTEM_FAMILY_BYTE is a system
 * family: the node keeps data of its own there (a row's change history, "\0changes"), which no
 * client can name. Storage treats them like any family except that:
 *   - sto_iter_new never returns their cells; sto_iter_new_flags chooses;
 *   - a row tombstone (STO_MUT_DEL_ROW, and so sto_tablet_drop_prefix) does not cover them, in
 *     reads and in compactions; STO_MUT_DEL_FAMILY / DEL_COLUMN / SET_CELL act on them as on any
 *     family, and so do GC rules (sto_tablet_set_gc).
 * Within a row their entries sort before those of every user family (enc(family) begins with
 * 0x00 0xff, docs/formats/keys.md), so an iterator skips either kind cheaply. */
#define STO_SYSTEM_FAMILY_BYTE 0x00
bool sto_family_is_system(st_slice family); /* non-empty and starts with the byte above */

/* Iterates visible cells of user families of rows in range, rows ascending (or descending when
 * reverse), and within a row always family, qualifier ascending and timestamp descending. */
st_code sto_iter_new(sto_snapshot *s, const sto_range *range, bool reverse, sto_iter **out,
                     st_err *err);
/* Which families sto_iter_new_flags returns; both = every cell. */
enum { STO_ITER_USER = 1u, STO_ITER_SYSTEM = 2u };
/* As sto_iter_new, returning the cells of the families flags choose (system cells of a row come
 * before its user cells, by the order above). A row without a visible cell of those kinds yields
 * nothing. ST_INVALID_ARGUMENT when flags choose neither kind. */
st_code sto_iter_new_flags(sto_snapshot *s, const sto_range *range, bool reverse, unsigned flags,
                           sto_iter **out, st_err *err);
/* Next cell; ST_NOT_FOUND at the end; ST_DATA_LOSS / ST_INTERNAL on a bad block. */
st_code sto_iter_next(sto_iter *it, sto_cell *cell, st_err *err);
/* Skips the rest of the current row (the next call starts at the next row). */
void sto_iter_skip_row(sto_iter *it);
void sto_iter_free(sto_iter *it);

/* One tombstone (a delete's entry, docs/formats/keys.md) as the row mutation that makes it:
 * type STO_MUT_DEL_ROW, STO_MUT_DEL_FAMILY (family set) or STO_MUT_DEL_COLUMN (family,
 * qualifier, ts_start_us, ts_end_us set) of row, with the version of the write that made it.
 * Slices are valid until the next call on the iterator. */
typedef struct sto_tombstone {
    st_slice row;
    sto_mut mut;
    uint64_t version;
} sto_tombstone;

/* Iterates the tombstones of the snapshot's tablet that compaction has kept so far, rows
 * ascending (system families too), each once. A tablet move copies them with its visible cells,
 * so a delete keeps covering older writes that reach the tablet's new node later (replicated
 * from a peer cluster). The iterator steps over every cell entry, visible or not: each next
 * looks at most *entries_left entries, and takes those it looked at off the count. */
st_code sto_tomb_iter_new(sto_snapshot *s, sto_tomb_iter **out, st_err *err);
/* ST_OK with *found: the next tombstone in *out; ST_OK without it: *entries_left is down to 0
 * and none was found, call again (with a new count); ST_NOT_FOUND at the end; ST_DATA_LOSS /
 * ST_INTERNAL on a bad block. */
st_code sto_tomb_iter_next(sto_tomb_iter *it, size_t *entries_left, sto_tombstone *out, bool *found,
                           st_err *err);
void sto_tomb_iter_free(sto_tomb_iter *it);

/* Approximate row keys splitting the tablet into chunks of about every_bytes (SampleRowKeys);
 * fn gets each key and the approximate bytes before it. */
st_code sto_tablet_sample_keys(sto_tablet *t, uint64_t every_bytes,
                               void (*fn)(st_slice row, uint64_t offset_bytes, void *arg),
                               void *arg, st_err *err);
/* A row key near the middle of the tablet's data, for size-based splits; ST_NOT_FOUND when the
 * tablet has fewer than two distinct rows. The key is copied into out. */
st_code sto_tablet_mid_key(sto_tablet *t, st_buf *out, st_err *err);

/* ---- the commit log as a source (replication, change streams) ---- */

/* A record read back from the log. The row mutation's slices are valid until the next call. */
typedef struct sto_log_record {
    uint64_t lsn;
    sto_row_mut row;
} sto_log_record;

/* Reads records with lsn >= from_lsn in order. */
st_code sto_log_reader_open(sto_db *db, uint64_t from_lsn, sto_log_reader **out, st_err *err);
/* Next record; ST_NOT_FOUND when caught up (call again later: new records appear). */
st_code sto_log_reader_next(sto_log_reader *r, sto_log_record *rec, st_err *err);
/* Like sto_log_reader_next without decoding: the record's lsn and its payload (the row
 * mutation's log encoding, checksum verified), valid until the next call. For readers that pass
 * records on as stored (replication's shipper; sto_row_mut_peek reads the head). */
st_code sto_log_reader_next_raw(sto_log_reader *r, uint64_t *lsn, st_slice *payload, st_err *err);
void sto_log_reader_close(sto_log_reader *r);
/* Registers or moves a named holder (durably): log segments holding records with lsn >= lsn are
 * kept until every holder and every tablet's flushed point has passed them. A holder is a reader
 * that needs those records: damage in them fails the next sto_db_open (ST_DATA_LOSS), while
 * damage below every holder and flushed point is skipped, and the skipped records are then
 * unreadable (sto_log_reader_open: ST_OUT_OF_RANGE, as for trimmed ones; a hold below them is
 * recorded at the first readable record). */
st_code sto_log_hold(sto_db *db, const char *holder, uint64_t lsn, st_err *err);
st_code sto_log_release(sto_db *db, const char *holder, st_err *err);
uint64_t sto_log_last_lsn(sto_db *db); /* the lsn of the last durable record (0 = none) */
/* True when this open dropped the end of the commit log (a last segment cut short, or records
 * its checkpoint calls durable unreadable) because accept_data_loss allowed it: records past
 * sto_log_last_lsn that readers (a peer's shipper) may have taken are gone. */
bool sto_log_tail_dropped_at_open(sto_db *db);

/* ---- statistics ---- */
typedef struct sto_stats {
    uint64_t memtable_bytes;
    uint64_t cache_bytes, cache_hits, cache_misses;
    /* data blocks read from disk (each checked, and decompressed when stored compressed) and
     * their uncompressed bytes */
    uint64_t blocks_read, block_bytes_read;
    uint64_t log_bytes;
    uint64_t flushes, compactions, stalls_us;
    uint64_t sst_count;
} sto_stats;
void sto_db_stats(sto_db *db, sto_stats *out);

#endif
