/* strata/cstoken.h — change-stream continuation tokens and partitions (docs/changestreams.md,
 * Tokens), shared by the node (which reads change streams) and the router (which answers
 * CloseStream for partitions that no longer match one tablet). Pure functions, no RPC, no storage.
 *
 * A token is text, opaque to clients, in exactly one of these forms:
 *   "1.W"       live: every record of the partition with stamp <= W was delivered;
 *   "1.W.H.K"   inside a catch-up scan from W to H: every record with stamp <= W, and those with
 *               stamps in (W, H] of rows up to and including row key K, were delivered;
 *   "2.C.Y.W", "2.C.Y.W.H.K"   the same, issued by cluster number C, with its applied bound Y
 *               (Y <= W): when the token was issued, cluster C had applied every write of every
 *               other cluster committed at or before Y (docs/changestreams.md, Failover). Read on
 *               another cluster, the stream starts at Y instead of W.
 * W, H and Y are decimal microseconds (0 <= W < H, no sign, no leading zero), C a decimal below
 * 2^32, K is the row key in lower-case hex (1..BTU_ROW_KEY_MAX bytes). Any of these forms may
 * start with "tT." where T is the table's tag (btu_cs_table_tag) in 8 lower-case hex digits: the
 * tokens a stream hands out carry it, and a tagged token is refused for another table. Anything
 * else is refused with INVALID_ARGUMENT, so every accepted token formats back to the same text. */
#ifndef STRATA_CSTOKEN_H
#define STRATA_CSTOKEN_H

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/btutil.h"

/* Longest token text, NUL included: "tT." "2." C "." Y "." W "." H "." then the key in hex. */
#define BTU_CS_TOKEN_MAX (10 + 2 + 10 + 1 + 19 + 1 + 19 + 1 + 19 + 1 + 2 * BTU_ROW_KEY_MAX + 1)
/* Most tokens one ReadChangeStream request may carry (a merge of that many partitions). */
#define BTU_CS_TOKENS_MAX 10000
/* A ReadChangeStream request is kept for its stream's life (a router re-sends it to the nodes
 * holding its partition): one request of more bytes is refused INVALID_ARGUMENT, and a process
 * keeps at most BTU_CS_KEPT_REQUESTS_MAX bytes of open streams' requests (more streams are
 * refused RESOURCE_EXHAUSTED). 1 MiB holds a partition and 60 tokens of 4 KiB row keys. */
#define BTU_CS_REQUEST_BYTES_MAX ((size_t)1 << 20)
#define BTU_CS_KEPT_REQUESTS_MAX ((size_t)32 << 20)
/* The batched node -> router link (docs/changestreams.md, The router): a ReadChangeStream call
 * whose request metadata has BTU_CS_BATCH_HEADER "1" (only a router sends it) may get, besides
 * plain responses, batches. A batch is one gRPC message that is a ReadChangeStreamResponse
 * holding only field BTU_CS_BATCH_FIELD (bytes, never a field of the public message), written
 * as its tag and a varint of exactly 5 bytes (BTU_CS_BATCH_HEAD_BYTES in all, so the node can
 * write the head once the batch is complete), whose bytes are complete gRPC-framed
 * ReadChangeStreamResponses, each a DataChange message (its first byte
 * BTU_CS_BATCH_INNER_TAG): exactly the messages the client is to receive, in order. A batch
 * holds at most BTU_CS_BATCH_BYTES of messages (less when the node's --max-message-bytes is
 * smaller: the batch is one message); a message larger than that, heartbeats and CloseStream go
 * out as plain messages. */
#define BTU_CS_BATCH_HEADER "x-strata-cs-batch"
#define BTU_CS_BATCH_FIELD 15
#define BTU_CS_BATCH_TAG ((BTU_CS_BATCH_FIELD << 3) | 2)
#define BTU_CS_BATCH_HEAD_BYTES 6
#define BTU_CS_BATCH_INNER_TAG ((1 << 3) | 2)
#define BTU_CS_BATCH_BYTES ((size_t)128 << 10)

/* Whether a request of len bytes may start a stream while kept bytes of requests are kept:
 * INVALID_ARGUMENT or RESOURCE_EXHAUSTED (with a message saying what to do) when not. */
st_code btu_cs_request_keepable(size_t len, size_t kept, st_err *err);

/* A reader's position in a partition's history. */
typedef struct btu_cs_pos {
    int64_t w;        /* every record with stamp <= w was delivered (>= 0) */
    bool scan;        /* inside a catch-up scan: the fields below are set */
    int64_t h;        /* scan: the scan's last stamp (> w) */
    bool has_y;       /* a version 2 token: the two fields below are set */
    uint32_t cluster; /* has_y: the number of the cluster that issued the position */
    int64_t y;        /* has_y: that cluster's applied bound then (0 <= y <= w) */
    bool has_table;   /* the token named its table: the field below is set */
    uint32_t table;   /* has_table: the table's tag (btu_cs_table_tag) */
    size_t key_len;   /* scan: rows <= key delivered their records in (w, h] */
    uint8_t key[BTU_ROW_KEY_MAX];
} btu_cs_pos;

/* The tag tokens of table carry: a hash of its id (the text after the last '/' of a full
 * "projects/P/instances/I/tables/T" name, which is the id itself when there is no '/'). It tells
 * tables apart, not versions of one table: a table dropped and created again has the same tag. */
uint32_t btu_cs_table_tag(st_slice table);

/* Sets p to the live position "1.w" (no cluster, no applied bound, no table). */
void btu_cs_pos_live(btu_cs_pos *p, int64_t w);

/* Marks p as issued by cluster number `cluster` whose applied bound is y (a version 2 token);
 * y is lowered to p->w (and raised to 0), since a bound above the position says nothing more. */
void btu_cs_pos_set_bound(btu_cs_pos *p, uint32_t cluster, int64_t y);

/* Where a stream resuming from p on cluster number `cluster` starts: p->w, or the applied bound
 * p->y when p was issued by another cluster (writes that cluster had not applied by then may
 * have entered this one before p->w). */
int64_t btu_cs_pos_start(const btu_cs_pos *p, uint32_t cluster);

/* Parses token text (any bytes; a token from a request may hold anything). INVALID_ARGUMENT with
 * a sentence naming the expected forms for anything that is not exactly one of them. */
st_code btu_cs_token_parse(st_slice text, btu_cs_pos *out, st_err *err);

/* Digits of the largest uint64_t (18446744073709551615). */
#define BTU_CS_DEC_MAX 20

/* Writes v in decimal (no sign, no leading zero, no NUL) at out, which has room for
 * BTU_CS_DEC_MAX bytes; returns the digits written. The same text as "%llu". */
size_t btu_cs_dec(char *out, uint64_t v);

/* Writes p's token text, NUL-terminated, into out (BTU_CS_TOKEN_MAX bytes); returns its length.
 * p must be valid (as btu_cs_token_parse returns it). */
size_t btu_cs_token_format(const btu_cs_pos *p, char out[BTU_CS_TOKEN_MAX]);

/* A partition's rows as [start, end) (empty start = first row, empty end = unbounded; an open
 * start or closed end becomes the key's successor, allocated from arena; other slices point into
 * p). A missing row_range means every row. INVALID_ARGUMENT for a missing partition (what names
 * it: "partition", "continuation_tokens[3].partition"), a key over BTU_ROW_KEY_MAX or a range
 * that selects no row; RESOURCE_EXHAUSTED when memory runs out. */
st_code btu_cs_partition_range(const Google__Bigtable__V2__StreamPartition *p, const char *what,
                               st_arena *arena, btu_key_range *out, st_err *err);

/* Fills p and rr (p->row_range = rr) with [start, end) as Cloud Bigtable's partitions are shaped:
 * start_key_closed and end_key_open, an empty bound left unset. The slices are not copied. */
void btu_cs_partition_set(Google__Bigtable__V2__StreamPartition *p,
                          Google__Bigtable__V2__RowRange *rr, st_slice start, st_slice end);

/* True when a and b select the same rows. */
bool btu_cs_range_eq(const btu_key_range *a, const btu_key_range *b);

/* Where a request with continuation tokens tokens[0..n) for partition starts. One token: its
 * partition must be exactly the request's, and its position is kept as is (a scan token stays a
 * scan, a version 2 token keeps its cluster and bound). Several (partitions merged): their
 * partitions must tile the request's exactly (no gap, no overlap, same ends), and the start is
 * the live position at the smallest W among them (records between may come twice: delivery is
 * at least once); when all were issued by one cluster it keeps that cluster and the smallest Y,
 * when they come from several clusters (or mix versions) the start is the smallest of every W
 * and Y, without a bound, so it is safe on any cluster. INVALID_ARGUMENT saying what does
 * not match for anything else (no token, more than BTU_CS_TOKENS_MAX, a bad token or partition,
 * a token tagged for a table whose tag is not table_tag); RESOURCE_EXHAUSTED when memory runs out
 * (arena holds the scratch). */
st_code btu_cs_tokens_merge(Google__Bigtable__V2__StreamContinuationToken *const *tokens, size_t n,
                            const btu_key_range *partition, uint32_t table_tag, st_arena *arena,
                            btu_cs_pos *out, st_err *err);

/* A Timestamp as microseconds since the epoch: rounded up to the next microsecond when round_up
 * (a start time: records at or after it), down otherwise. INVALID_ARGUMENT naming field for
 * seconds outside 0..253402300799 (the epoch to the end of year 9999, the Timestamp range
 * without the years before the epoch, which no history reaches) or nanos outside 0..999999999. */
st_code btu_cs_time_us(const Google__Protobuf__Timestamp *t, const char *field, bool round_up,
                       int64_t *out, st_err *err);

/* The time arguments of a ReadChangeStreamRequest, checked as Cloud Bigtable checks them (the
 * node and the router both call it before anything else about the times): INVALID_ARGUMENT for
 * an end_time or start_time out of range (btu_cs_time_us), an end_time before the start_time,
 * or a heartbeat_duration that is negative or not a valid Duration (nanos outside 0..999999999
 * or of the other sign than seconds). */
st_code btu_cs_check_times(const Google__Bigtable__V2__ReadChangeStreamRequest *req, st_err *err);
/* "2026-12-04T20:39:37.123456Z" (UTC) for messages; out of cap bytes (32 hold any). */
void btu_cs_time_text(int64_t us, char *out, size_t cap);
/* A start_time t (µs) for a stream of table read now (µs), whose history holds nothing before
 * oldest: INVALID_ARGUMENT when t is in the future or before oldest. The router checks it before
 * it answers a partition spanning tablets with a CloseStream at t, the node before it reads. */
st_code btu_cs_start_time_check(int64_t t, int64_t now, int64_t oldest, const char *table,
                                st_err *err);

/* Microseconds as a Timestamp. */
void btu_cs_time_set(Google__Protobuf__Timestamp *t, int64_t us);

#endif
