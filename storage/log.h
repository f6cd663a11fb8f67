/* log.h — the node's commit log (private to storage/; format: docs/formats/log.md).
 *
 * One log per node, all tablets interleaved. Segments log/<first-lsn, 20 digits>.log hold
 * checksummed records; every record has a log sequence number (lsn), dense and increasing from 1.
 * Group commit: concurrent appenders hand their records to one commit thread, which writes them
 * and issues one fdatasync for the whole group, then runs each appender's callback. A torn or
 * corrupt record at the tail of the last segment ends recovery there (it was never acknowledged);
 * corruption before the tail is ST_DATA_LOSS. */
#ifndef STO_LOG_H
#define STO_LOG_H

#include "strata/env.h"
#include "strata/storage.h"

typedef struct sto_log sto_log;

typedef struct sto_log_options {
    st_env *env;
    bool sync;
    size_t segment_bytes;
} sto_log_options;

/* Called on the commit thread once the group holding the records is durable (or failed); first_lsn
 * is the lsn of the first of the caller's records. While it runs, the records are durable and
 * not yet visible to sto_log_readers of later groups; callers apply them to memtables here. */
typedef void (*sto_log_done_fn)(st_code code, uint64_t first_lsn, const st_err *err, void *arg);

/* Opens the log in dir (creating it). Does not replay: call sto_log_replay first when needed. */
st_code sto_log_open(const char *dir, const sto_log_options *opts, sto_log **out, st_err *err);
void sto_log_close(sto_log *log);

/* Replays every record with lsn >= from_lsn in order, then positions appends after the last good
 * record (truncating a torn tail). fn returns non-OK to stop. */
st_code sto_log_replay(sto_log *log, uint64_t from_lsn,
                       st_code (*fn)(const sto_log_record *rec, void *arg), void *arg,
                       st_err *err);

/* Queues n row mutations (copied before return) as n consecutive records; done runs later on the
 * commit thread. Returns non-OK (and does not call done) only if the log is closed or failed. */
st_code sto_log_append(sto_log *log, const sto_row_mut *rows, size_t n, sto_log_done_fn done,
                       void *arg, st_err *err);

uint64_t sto_log_last_durable_lsn(sto_log *log);
uint64_t sto_log_bytes(sto_log *log);          /* bytes in live segments */
uint64_t sto_log_oldest_lsn(sto_log *log);     /* first lsn still stored */
/* Deletes whole segments whose records all have lsn < keep_from. */
st_code sto_log_trim(sto_log *log, uint64_t keep_from, st_err *err);

/* Reading in order from any position, concurrently with appends (replication, change streams). */
typedef struct sto_log_cursor sto_log_cursor;
st_code sto_log_cursor_open(sto_log *log, uint64_t from_lsn, sto_log_cursor **out, st_err *err);
/* ST_NOT_FOUND when caught up with the durable end. */
st_code sto_log_cursor_next(sto_log_cursor *c, sto_log_record *rec, st_err *err);
void sto_log_cursor_close(sto_log_cursor *c);

/* Encoding of one row mutation, shared with anything that ships it (replication). */
st_code sto_row_mut_encode(st_buf *out, const sto_row_mut *row);
/* Decodes into row; muts are allocated from arena; slices point into data. */
bool sto_row_mut_decode(st_slice data, sto_row_mut *row, st_arena *arena);

#endif
