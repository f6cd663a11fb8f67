/* log.h — the node's commit log (private to storage/; format: docs/formats/log.md).
 *
 * One log per node, all tablets interleaved. Segments log/<first-lsn, 20 digits>.log hold
 * checksummed records; every record has a log sequence number (lsn), dense and increasing from 1.
 * Group commit: concurrent appenders queue their records; one writer at a time (the commit
 * thread, or a sto_log_append_wait caller leading) writes everything queued with one fdatasync
 * for the whole group, then runs each appender's callback. A torn or
 * corrupt record at the tail of the last segment ends recovery there (it was never acknowledged);
 * corruption before the tail is ST_DATA_LOSS — also in the last segment, where records carry
 * their group's first lsn so that a good record of a later group after a bad one proves the bad
 * one was acknowledged (docs/formats/log.md, reading rules) — unless the damaged records are
 * ones nobody needs any more (below sto_log_options.needed_from): those are skipped with a
 * warning and read as trimmed from then on. Segments are preallocated and their
 * header records that size, so a last segment that got shorter (cut by something other than the
 * log) is told from a torn write: ST_DATA_LOSS unless the caller accepts the loss. Each
 * segment's header page also holds a checkpoint of the last durable lsn (written with each group,
 * with no extra sync, and when idle, rolling over and closing), so acknowledged records that
 * read back as zeros are ST_DATA_LOSS too. A restart
 * keeps appending into the last segment after its last record when only reserved zeros follow
 * it, so restarts do not add segments. */
#ifndef STO_LOG_H
#define STO_LOG_H

#include "strata/env.h"
#include "strata/storage.h"

typedef struct sto_log sto_log;

/* Named maxima. A row mutation whose encoding exceeds STO_LOG_RECORD_BYTES_MAX or that has more
 * than STO_ROW_MUTS_MAX mutations (strata/storage.h) is refused (ST_INVALID_ARGUMENT). Appended
 * but not yet durable records take at most STO_LOG_QUEUE_BYTES_MAX bytes; appenders wait above
 * it (backpressure); one append larger than that proceeds alone. */
#define STO_LOG_RECORD_BYTES_MAX (256u << 20)
#define STO_LOG_QUEUE_BYTES_MAX ((size_t)32 << 20)
#define STO_LOG_SEGMENT_BYTES_DEFAULT ((size_t)64 << 20)
#define STO_LOG_SEGMENT_BYTES_MAX ((size_t)1 << 30) /* the header's size field is 32 bits */

typedef struct sto_log_options {
    st_env *env;          /* NULL = st_env_posix() */
    bool sync;            /* false: no fdatasync; records count as durable once written */
    size_t segment_bytes; /* 0 = STO_LOG_SEGMENT_BYTES_DEFAULT; at most ..._MAX */
    /* A last segment shorter than its header says (truncated from outside: its end, and the
     * records there, are gone), or whose checkpoint names records it no longer holds, makes
     * sto_log_replay fail with ST_DATA_LOSS. true: replay keeps the records before the damage,
     * logs what was dropped (event=log_data_loss_accepted) and continues. */
    bool accept_data_loss;
    /* After this many microseconds without a group, the commit thread writes a checkpoint of the
     * last group with an fdatasync of its own (docs/formats/log.md, checkpoints). 0: 100 ms;
     * negative: never (tests that damage the last group as a crash right after it would). */
    int64_t checkpoint_idle_us;
    /* The lowest lsn anyone still needs: the replay point (every tablet's flushed point has
     * passed the records below it) and every log holder's position. A damaged stretch of records
     * lying wholly below it is skipped with a warning (event=log_damage_skipped) instead of
     * failing sto_log_replay, and cursors treat it like trimmed records (ST_OUT_OF_RANGE below
     * the first record after it). 0 or 1: every record is needed (damage is ST_DATA_LOSS). */
    uint64_t needed_from;
} sto_log_options;

/* Called once the group holding the records is durable (or failed), on the commit thread or on the
 * thread of a sto_log_append_wait caller that wrote the group (one group at a time, in lsn
 * order, whichever thread writes it); first_lsn is the lsn of the first of the caller's records.
 * While it runs, the records are durable and not yet visible to sto_log_readers of later groups;
 * callers apply them to memtables here. */
typedef void (*sto_log_done_fn)(st_code code, uint64_t first_lsn, const st_err *err, void *arg);

/* Opens the log in dir (creating it). Does not replay: call sto_log_replay first when needed. */
st_code sto_log_open(const char *dir, const sto_log_options *opts, sto_log **out, st_err *err);
/* Runs the done callbacks of everything queued and the file removals of earlier trims, then
 * frees. */
void sto_log_close(sto_log *log);

/* Replays every record with lsn >= from_lsn in order, then positions appends after the last good
 * record; a log without segments gets its first one here, so that a manifest written after the
 * replay can name it (a log emptied from outside is then told from a new one). fn returns non-OK to
 * stop. Records below the oldest stored lsn were trimmed on purpose and are skipped silently. A
 * torn tail is not rewritten: appends continue in a new segment and the torn bytes are ignored from
 * then on; after a clean end (only reserved zeros follow the last record) appends continue in the
 * same segment (docs/formats/log.md). ST_DATA_LOSS for a bad record before the tail (in the last
 * segment: one that a good record of a later group follows) unless the damaged stretch lies
 * wholly below the log's needed_from (then skipped: event=log_damage_skipped, and
 * sto_log_readable_from names the first record after it), and for a last segment cut short
 * or whose checkpoint names records it no longer holds (both unless accept_data_loss);
 * ST_FAILED_PRECONDITION once appends started. */
st_code sto_log_replay(sto_log *log, uint64_t from_lsn,
                       st_code (*fn)(const sto_log_record *rec, void *arg), void *arg, st_err *err);

/* Queues n row mutations (copied before return) as n consecutive records; done runs later on the
 * commit thread. Returns non-OK (and does not call done) only if the log is closed or failed,
 * or for a bad request: n == 0 or a row over the maxima above (ST_INVALID_ARGUMENT), no memory
 * (ST_RESOURCE_EXHAUSTED), or during sto_log_replay (ST_FAILED_PRECONDITION). Blocks while
 * STO_LOG_QUEUE_BYTES_MAX bytes are queued (not when called from a done callback). A group whose
 * write or sync fails gives its error to every done of the group (first_lsn 0); the log stays
 * usable and continues in a fresh segment. If appends start without a replay, the commit thread
 * positions the log after the last good record of the last segment itself. */
st_code sto_log_append(sto_log *log, const sto_row_mut *rows, size_t n, sto_log_done_fn done,
                       void *arg, st_err *err);

/* Like sto_log_append, but returns only after done ran for these records (ST_OK; done got the
 * group's result), or refuses as sto_log_append does (done not called). When no group is being
 * written, the calling thread writes and syncs everything queued itself, running the done
 * callbacks of other appenders too (leader-based group commit: no hand-off to the commit
 * thread). Must not be called from a done callback (ST_FAILED_PRECONDITION). */
st_code sto_log_append_wait(sto_log *log, const sto_row_mut *rows, size_t n, sto_log_done_fn done,
                            void *arg, st_err *err);

/* The last lsn visible to cursors: advanced once the done callbacks of its group returned (so
 * it may trail a done callback by a moment); 0 until the log is positioned (by sto_log_replay or
 * the first append). */
uint64_t sto_log_last_durable_lsn(sto_log *log);
/* Recovery dropped the last segment's tail (accept_data_loss): sto_log_tail_dropped_at_open. */
bool sto_log_tail_dropped(sto_log *log);
uint64_t sto_log_bytes(sto_log *log); /* bytes in live segments */
/* Whether the last group commit failed for lack of space (ST_RESOURCE_EXHAUSTED): true from such
 * a failure until a group succeeds. */
bool sto_log_out_of_space(sto_log *log);
uint64_t sto_log_oldest_lsn(sto_log *log); /* first lsn still stored */
/* The first lsn after the last damaged stretch recovery skipped because nobody needed it
 * (sto_log_options.needed_from): records before it cannot be read, as if trimmed. 0 when none
 * was skipped. Stretches skipped with accept_data_loss are holes instead (sto_log_hole). */
uint64_t sto_log_readable_from(sto_log *log);
/* Hole i (from 0) of the damaged stretches recovery skipped although a log holder had not read
 * them (accept_data_loss): records lsn..next_lsn-1. Readers below it read up to it and go on at
 * next_lsn, losing only those records. false past the last. */
bool sto_log_hole(sto_log *log, size_t i, uint64_t *lsn, uint64_t *next_lsn);
/* The first lsn of the segment holding lsn (the oldest segment when lsn is before it): the
 * oldest segment a trim to keep_from = lsn keeps. 0 when the log has no segment. */
uint64_t sto_log_segment_first(sto_log *log, uint64_t lsn);
/* Deletes whole segments whose records all have lsn < keep_from: takes them off the log at once
 * (sto_log_oldest_lsn, sto_log_bytes and cursors see the trim on return), removes their files
 * and syncs the directory before it returns (after any removals queued before it). Errors:
 * ST_RESOURCE_EXHAUSTED (no memory: nothing trimmed), or the env's error for a file that could
 * not be removed (it and later ones of its batch stay as old segments, which replay skips). */
st_code sto_log_trim(sto_log *log, uint64_t keep_from, st_err *err);
/* Like sto_log_trim, but the files are removed soon after by a background thread of the log
 * (started by the first trim), in trim order, so that the caller (the flush thread, after each
 * manifest write) does not pay for unlinking segments and syncing the directory. A removal
 * failure is logged (event=log_trim_failed), not returned. sto_log_close finishes the queued
 * removals; a crash may leave some files, old segments that replay and cursors skip. Without
 * the thread (it could not start) it removes the files itself. */
st_code sto_log_trim_async(sto_log *log, uint64_t keep_from, st_err *err);
/* Returns once the files of every trim called so far were removed (or their removal failed):
 * for tests and callers that look at the directory. */
void sto_log_trim_wait(sto_log *log);

/* Counters for tests and metrics. */
typedef struct sto_log_stats {
    uint64_t appends;       /* sto_log_append calls queued */
    uint64_t records;       /* records made durable */
    uint64_t groups;        /* groups written successfully */
    uint64_t syncs;         /* fdatasync calls on records (not segment headers) */
    uint64_t ckpt_syncs;    /* fdatasync calls for a checkpoint alone (idle, roll, close) */
    uint64_t failed_groups; /* groups whose write or sync failed */
    uint64_t segments_created;
    uint64_t segments_reused;  /* last segments appended to again after a restart */
    uint64_t queue_bytes_peak; /* most bytes ever queued or in flight (backpressure check) */
    uint64_t segments_removed; /* trimmed segment files whose removal finished (or failed) */
} sto_log_stats;
void sto_log_stats_get(sto_log *log, sto_log_stats *out);

/* Reading in order from any position, concurrently with appends (replication, change streams).
 * A cursor sees only records whose done callbacks have run. Open gives ST_OUT_OF_RANGE when
 * from_lsn was trimmed; next gives it when the cursor fell behind a trim. */
typedef struct sto_log_cursor sto_log_cursor;
st_code sto_log_cursor_open(sto_log *log, uint64_t from_lsn, sto_log_cursor **out, st_err *err);
/* ST_NOT_FOUND when caught up with the durable end. */
st_code sto_log_cursor_next(sto_log_cursor *c, sto_log_record *rec, st_err *err);
void sto_log_cursor_close(sto_log_cursor *c);
/* Like sto_log_cursor_next, without decoding: the record's lsn and its payload (a row
 * mutation's encoding, checksum verified), valid until the next call on the cursor. The cursor
 * takes the log's lock only when it reaches the durable end it last saw, the end of its segment
 * or a change of the segment list, not per record. */
st_code sto_log_cursor_next_raw(sto_log_cursor *c, uint64_t *lsn, st_slice *payload, st_err *err);

#endif
