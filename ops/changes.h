/* ops/changes.h — the consumer side of change streams (docs/changestreams.md), private to ops/:
 *
 * - formatting (changes_fmt.c): times (RFC 3339 and relative forms), one JSON line per change,
 *   base64, and the checkpoint file of `strata changes --checkpoint`;
 * - the consumer (changes_stream.c): on one libevent loop, GenerateInitialChangeStreamPartitions
 *   through the router, one ReadChangeStream per partition (all concurrent, on one connection),
 *   CloseStream followed (new partitions opened with their tokens), chunked values reassembled,
 *   retries of failed streams from their last token; each complete change goes to a callback.
 *
 * `strata changes` (changes.c) and the bench's change-stream workload (bench_cs.c) use both. */
#ifndef STRATA_OPS_CHANGES_H
#define STRATA_OPS_CHANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/rpc.h"

struct event_base;

/* ---- times ---- */
#define OPS_CS_TIME_MAX 40 /* "2026-12-04T20:39:37.123456Z" and its NUL, with room */

/* TIME of --from / --until into microseconds since the epoch: RFC 3339 ("2026-12-04T20:39:37Z",
 * fractional seconds up to microseconds, "Z" or "+HH:MM" / "-HH:MM"), "now", or a relative form
 * from now_us: "-10m", "-90s", "-2h", "-1d", "-500ms", "+30s" (units us, ms, s, m, h, d). False
 * when text is none of these. */
bool ops_cs_time_parse(const char *text, int64_t now_us, int64_t *out_us);
/* RFC 3339 in UTC with microseconds: "2026-12-04T20:39:37.123456Z". */
void ops_cs_time_format(int64_t us, char out[OPS_CS_TIME_MAX]);

/* ---- one change ---- */
typedef enum ops_cs_op {
    OPS_CS_SET = 0,
    OPS_CS_DELETE_COLUMN,
    OPS_CS_DELETE_FAMILY,
    OPS_CS_DELETE_ROW,
} ops_cs_op;

typedef struct ops_cs_mod {
    ops_cs_op op;
    st_slice family, qualifier, value;
    int64_t timestamp_us;     /* set: the cell's timestamp */
    int64_t start_us, end_us; /* delete_column: the time range (0 = unbounded) */
} ops_cs_mod;

typedef enum ops_cs_type { OPS_CS_USER = 1, OPS_CS_GC = 2 } ops_cs_type;

typedef struct ops_cs_change {
    st_slice row;
    ops_cs_type type;
    const char *cluster; /* source cluster id ("" for garbage collection) */
    int64_t commit_us;
    int32_t tiebreaker;
    const ops_cs_mod *mods;
    size_t n_mods;
} ops_cs_change;

/* Appends one JSON object (no newline) for c to out:
 *   {"row":...,"type":"USER"|"GARBAGE_COLLECTION","cluster":...,"commit_time":"RFC 3339 µs",
 *    "tiebreaker":N,"mods":[{"op":"set","family":...,"qualifier":...,"timestamp":µs,
 *    "value":...}, {"op":"delete_column",...,"start_timestamp":µs,"end_timestamp":µs},
 *    {"op":"delete_family","family":...}]}
 * Bytes (row, family, qualifier, value) rule: valid UTF-8 without control characters (below
 * 0x20, or 0x7f) is a JSON string (\" and \\ escaped); anything else is base64 (RFC 4648,
 * padded) under the same key with "_b64" appended ("row_b64", "value_b64"...). */
st_code ops_cs_json(st_buf *out, const ops_cs_change *c);
/* Exposed for tests. */
bool ops_cs_bytes_printable(st_slice s);
void ops_cs_base64(st_buf *out, st_slice s);

/* ---- positions: a partition and where to resume it ---- */
typedef struct ops_cs_pos {
    st_buf start, end; /* the partition's row range [start, end); empty end = to the end */
    char *token;       /* continuation token (malloc); NULL = start from start_us */
    int64_t start_us;
} ops_cs_pos;

void ops_cs_pos_free(ops_cs_pos *p);

/* The checkpoint file: a header line then one line per position, every field hex so any bytes
 * fit ("-" for empty):
 *   strata-changes-checkpoint 1 TABLE_HEX
 *   t START_HEX END_HEX TOKEN_HEX
 *   s START_HEX END_HEX START_US
 * Written to PATH.tmp, fsync'd, renamed over PATH, directory fsync'd: a crash leaves the old
 * file or the new one, never a mix. */
st_code ops_cs_ckpt_write(const char *path, const char *table, const ops_cs_pos *pos, size_t n,
                          st_err *err);
/* Reads a checkpoint; NOT_FOUND when path does not exist; INVALID_ARGUMENT (naming the line)
 * when it is not one, or belongs to another table. *pos is malloc'd (free each with
 * ops_cs_pos_free, then the array). */
st_code ops_cs_ckpt_read(const char *path, const char *table, ops_cs_pos **pos, size_t *n,
                         st_err *err);
/* INVALID_ARGUMENT (naming path) unless pos[0..n) cover every row key exactly once, as every
 * checkpoint ops_cs_ckpt_write is given does: a gap would skip rows, an overlap repeat them. */
st_code ops_cs_ckpt_check(const char *path, const ops_cs_pos *pos, size_t n, st_err *err);

/* ---- the consumer ---- */
typedef struct ops_cs ops_cs;

typedef struct ops_cs_opts {
    const char *addr;        /* router HOST:PORT */
    const char *table;       /* projects/P/instances/I/tables/T */
    const char *app_profile; /* "" = default */
    int64_t start_us;        /* where partitions from GenerateInitial... start */
    int64_t end_us;          /* end_time of every stream (0 = none) */
    int64_t stop_us;         /* stop once every partition's watermark reached it (0 = never) */
    int64_t heartbeat_s;     /* heartbeat_duration asked for */
    /* Each complete change, in each partition's order. Return false to stop the consumer. */
    bool (*on_change)(const ops_cs_change *c, void *arg);
    /* Once: the consumer finished (code ST_OK: every partition done or stopped; otherwise a
     * failure that retrying cannot fix, err says what and what to do). */
    void (*on_done)(st_code code, const char *msg, void *arg);
    /* A transient failure being retried (may be NULL). */
    void (*on_retry)(const char *msg, void *arg);
    void *arg;
    /* TLS and the bearer token (borrowed: they outlive the consumer): copts NULL = plaintext,
     * authorization NULL = no token, else the header's value ("Bearer TOKEN"). */
    const rpc_client_opts *copts;
    const char *authorization;
    /* The changes passed to on_change carry no mutations (mods NULL, n_mods 0): a DataChange
     * complete in one message is read at the wire level (ops_cs_wire_decode) instead of
     * unpacked; anything else is decoded fully, as without it. The bench's consumer. */
    bool keys_only;
} ops_cs_opts;

typedef struct ops_cs_stats {
    size_t partitions, done;
    /* Partitions not streaming now: not opened yet, opened without an answer so far (the
     * server has not taken the call), or waiting to be reopened after a failure. */
    size_t waiting;
    uint64_t records, retries;
    uint64_t answers;         /* stream messages and finished partitions: the run makes progress */
    int64_t min_watermark_us; /* over partitions not done; 0 = none known yet */
} ops_cs_stats;

/* NULL when memory runs out. */
ops_cs *ops_cs_new(struct event_base *base, const ops_cs_opts *opts, st_err *err);
/* Starts: from the given positions (a checkpoint), else from GenerateInitial... */
st_code ops_cs_start(ops_cs *cs, const ops_cs_pos *resume, size_t n, st_err *err);
/* Cancels every stream; on_done runs (ST_OK) from the loop. */
void ops_cs_stop(ops_cs *cs);
void ops_cs_stats_get(const ops_cs *cs, ops_cs_stats *out);
/* Copies of every position (active, finished, and tokens waiting for a merge partner), for the
 * checkpoint; *pos malloc'd as ops_cs_ckpt_read's. */
st_code ops_cs_positions(const ops_cs *cs, ops_cs_pos **pos, size_t *n);
/* Frees; turn the loop once after (rpc_client_free). */
void ops_cs_free(ops_cs *cs);

/* UpdateTable through the router at addr (blocking): change streams on with this retention, or
 * off when retention_us is 0, over TLS (copts, NULL = plaintext) with an authorization header
 * (NULL = none). err says what failed. */
st_code ops_cs_set_retention_auth(const char *addr, const rpc_client_opts *copts,
                                  const char *authorization, const char *table,
                                  int64_t retention_us, st_err *err);

/* ---- a response read at the wire level ---- */
/* What a consumer that follows keys needs of a DataChange, read without unpacking it: slices
 * point into the message. chunks_ok: the chunks' ChunkInfo add up within this message (a value
 * chunked over several messages, or a CONTINUATION, is not "ok" here: those go to the full
 * decoder); chunk_open: the message ends inside a chunked value. */
typedef struct ops_cs_wire_dc {
    int type; /* DataChange.Type: 1 USER, 2 GARBAGE_COLLECTION, 3 CONTINUATION */
    st_slice row, cluster, token;
    int64_t commit_us, watermark_us; /* 0 = absent */
    int32_t tiebreaker;
    bool done, chunks_ok, chunk_open;
    size_t n_chunks;
    uint64_t chunk_got, chunk_size; /* the chunked value in progress */
} ops_cs_wire_dc;

typedef enum ops_cs_wire_rc {
    OPS_CS_WIRE_DC = 0, /* a DataChange: *dc filled */
    OPS_CS_WIRE_OTHER,  /* a heartbeat, a CloseStream or no record: decode it fully */
    OPS_CS_WIRE_BAD,    /* not a ReadChangeStreamResponse (truncated, bad wire types) */
} ops_cs_wire_rc;

/* Walks msg's fields with a varint / length reader; nothing is copied or allocated. */
ops_cs_wire_rc ops_cs_wire_decode(st_slice msg, ops_cs_wire_dc *dc);

/* `strata changes` */
int ops_changes_main(int argc, char **argv);

#endif
