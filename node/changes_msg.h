/* changes_msg.h — the ReadChangeStreamResponse messages a node sends (private to node/): one
 * change record as DataChange messages, Heartbeat, CloseStream. Pure encoders (changes_msg.c), so
 * unit tests check the message rules without a node; changes_read.c decides what to send when.
 *
 * A record's messages follow what the official Java client enforces (docs/changestreams.md,
 * Reading): the first message carries type, source_cluster_id, row_key, commit_timestamp and
 * tiebreaker; the following ones only type CONTINUATION and chunks; the last one done, token and
 * estimated_low_watermark. Mutations are SetCell, DeleteFromColumn and DeleteFromFamily only (a
 * DeleteFromRow is expanded to one DeleteFromFamily per family). A SetCell value longer than the
 * chunk size travels in several chunks with chunk_info; a message holds at most that many bytes of
 * values (and of names), but always at least one chunk. */
#ifndef NODE_CHANGES_MSG_H
#define NODE_CHANGES_MSG_H

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/base.h"
#include "strata/storage.h"

/* Bytes of values (and names) in one DataChange message, and the largest chunk of a value. A
 * router holds up to one such message for each stream whose consumer does not read, so this
 * sizes its worst case (docs/router.md, Memory): 256 KiB keeps 1,024 stalled streams near
 * 300 MiB, and is still large enough that framing costs nothing next to copying the values. */
#define NODE_CS_MSG_VALUE_BYTES ((size_t)256 << 10)

/* One record to send. */
typedef struct node_cs_change {
    const sto_row_mut *row;        /* the decoded record: row key, mutations, commit time, origin */
    bool gc;                       /* GARBAGE_COLLECTION (source_cluster_id then stays empty) */
    const char *source_cluster_id; /* USER records: the origin cluster's id */
    const char *token;             /* the position once this record is delivered */
    int64_t watermark_us;
    /* Families a DeleteFromRow expands to (a record written as the design says never holds
     * one: the write side expands it; kept for records that do). */
    const char *const *families;
    size_t n_families;
} node_cs_change;

/* Receives one packed message: RPC_SEND_HEADROOM free bytes, then the ReadChangeStreamResponse
 * (rpc_call_send_buf's layout). It may take the buffer's memory (msg comes back empty either
 * way). ST_OK goes on with the next message; NODE_CS_PAUSE took the message and stops the
 * encoding before the next one (the sender resumes the record in a later loop turn); any other
 * code stops the encoding and is returned. */
typedef st_code (*node_cs_emit_fn)(st_buf *msg, void *arg);
#define NODE_CS_PAUSE ST_ABORTED

/* Where a record's sending stands: its chunk number chunk, chunk sub of mutation mut. {0}: the
 * record's first chunk. */
typedef struct node_cs_pos {
    size_t chunk, mut, sub;
} node_cs_pos;

/* Encodes c as DataChange messages of at most value_bytes bytes of values each (chunks of at most
 * value_bytes), calling emit once per message in order, from the message that begins at *pos
 * ({0}: the record's first chunk). On return *pos is the first chunk not yet sent, whose chunk is
 * the record's chunk count once every message went out; resuming costs what is sent, not the
 * chunks before *pos. Scratch from arena (the caller frees it after
 * the call), msg is the buffer the messages are packed into. Returns ST_OK when the record's last
 * message went out (also for a record with no mutation: nothing is sent), NODE_CS_PAUSE when emit
 * paused before it (call again with the same c and *pos to go on), emit's other codes, or
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code node_cs_encode_change(const node_cs_change *c, size_t value_bytes, st_arena *arena,
                              st_buf *msg, node_cs_emit_fn emit, void *arg, node_cs_pos *pos);

/* A record that goes out as one message — at most NODE_CS_BODY_CHUNKS_MAX mutations, none a
 * DeleteFromRow, within value_bytes — is the same message for every reader but for its last
 * fields (done, token, watermark): the write side encodes the rest once, for the ring
 * (docs/changestreams.md, What a record costs), and each reader adds its own end.
 * node_cs_encode_body appends that part of c's message to out (c->token, c->watermark_us and
 * c->families are not used); ST_NOT_FOUND, out untouched, for a record of any other shape
 * (node_cs_encode_change sends it); RESOURCE_EXHAUSTED. */
#define NODE_CS_BODY_CHUNKS_MAX 16
st_code node_cs_encode_body(const node_cs_change *c, size_t value_bytes, st_buf *out);

/* Packs the message of a record whose body node_cs_encode_body wrote, with token (not NULL) and
 * watermark, into msg as node_cs_encode_change would (RPC_SEND_HEADROOM bytes in front). */
st_code node_cs_encode_prebuilt(st_buf *msg, st_slice body, const char *token,
                                int64_t watermark_us);

/* A Heartbeat for partition [start, end) at token with the watermark, packed into msg (emptied
 * first; RPC_SEND_HEADROOM bytes in front). RESOURCE_EXHAUSTED when memory runs out. */
st_code node_cs_encode_heartbeat(st_buf *msg, st_slice start, st_slice end, const char *token,
                                 int64_t watermark_us);

/* One new partition of a CloseStream and the part of the old partition its token covers. */
typedef struct node_cs_piece {
    st_slice new_start, new_end; /* the new partition (a tablet, or rows no local tablet holds) */
    st_slice tok_start, tok_end; /* its overlap with the old partition */
} node_cs_piece;

/* A CloseStream with status code/message (message may be NULL) and, for each piece, a new
 * partition and a continuation token (token text) for its overlap, packed into msg as above. */
st_code node_cs_encode_close(st_buf *msg, st_code code, const char *message,
                             const node_cs_piece *pieces, size_t n, const char *token);

#endif
