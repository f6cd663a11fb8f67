/* strata/btutil.h — pure, dependency-free helpers over Bigtable data-API messages that both the
 * node and the router need: row-set normalisation (moved here from node/read_plan.c so the router,
 * which may not link node/, shares the exact same rules). No RPC, no storage.
 *
 * Row sets. A RowSet (keys + ranges) becomes a sorted list of disjoint half-open ranges
 * [start, end) over row keys: an open start k becomes the closed start k"\0" (k's immediate
 * successor in byte order), a closed end k becomes the open end k"\0", a key k becomes
 * [k, k"\0"). Empty start = from the first row; empty end = no upper bound (an empty key in any
 * bound means "unbounded", as the emulator does). Overlapping or touching ranges merge. */
#ifndef STRATA_BTUTIL_H
#define STRATA_BTUTIL_H

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/data.pb-c.h"
#include "strata/base.h"

#define BTU_ROW_KEY_MAX 4096   /* Bigtable: row keys up to 4 KiB */
#define BTU_TABLE_ID_MAX 50    /* table ids: [_a-zA-Z0-9][-_.a-zA-Z0-9]* */
#define BTU_FAMILY_NAME_MAX 64 /* family names: [-_.a-zA-Z0-9]+ */
/* Most row keys plus ranges accepted in one RowSet (a 1 MiB request holds fewer). */
#define BTU_ROWSET_MAX ((size_t)1 << 20)
/* Most row keys of a point read as the router tells it from a scan (btu_rowset_is_point). */
#define BTU_ROWSET_POINT_KEYS_MAX 100

/* [start, end) over row keys; empty start = first row, empty end = unbounded. */
typedef struct btu_key_range {
    st_slice start;
    st_slice end;
} btu_key_range;

typedef struct btu_rowset {
    btu_key_range *v; /* sorted, disjoint, non-touching */
    size_t n;
} btu_rowset;

/* Normalises rs (NULL or empty = every row) into out, allocating from arena (slices may point
 * into rs). INVALID_ARGUMENT for a key over BTU_ROW_KEY_MAX bytes or a range whose start is not
 * below its end ("Error in field 'row_ranges' : Error in element #0 : start_key must be less than
 * end_key"); RESOURCE_EXHAUSTED when memory runs out. A row set whose every key is empty selects
 * no rows (out->n == 0). */
st_code btu_rowset_from_pb(const Google__Bigtable__V2__RowSet *rs, st_arena *arena, btu_rowset *out,
                           st_err *err);

/* Sorts and merges v[0..n) in place (any order, overlaps allowed); returns the new count. Ranges
 * that select nothing (start >= end) are dropped. */
size_t btu_rowset_merge(btu_key_range *v, size_t n);

/* Compares two END bounds, where empty means +infinity. */
int btu_end_cmp(st_slice a, st_slice b);
/* True if the range selects no row (a bounded end at or below its start). */
bool btu_range_is_empty(const btu_key_range *r);
/* k followed by one zero byte (the smallest key greater than k), allocated from arena;
 * RESOURCE_EXHAUSTED when memory runs out. */
st_code btu_key_successor(st_arena *arena, st_slice k, st_slice *out);
/* Whether rs selects row keys only (each range is [k, k + "\0")), 1..max of them: a point read,
 * whose work is bounded, as opposed to a scan. */
bool btu_rowset_is_point(const btu_rowset *rs, size_t max);

/* CreateTable's initial_splits: sorted, without duplicates or empty keys, in arena memory (the
 * keys point into req). INVALID_ARGUMENT for more than max splits or a key over BTU_ROW_KEY_MAX. */
st_code btu_splits_from_pb(const Google__Bigtable__Admin__V2__CreateTableRequest *req, size_t max,
                           st_arena *a, ProtobufCBinaryData **out, size_t *n, st_err *err);

/* Ids of [-_.a-zA-Z0-9], 1..max characters; allow_lead_punct false also refuses a leading '-' or
 * '.'. Table ids and app-profile ids follow the strict form, family names the lenient one. */
bool btu_id_valid(const char *id, size_t max, bool allow_lead_punct);
bool btu_table_id_valid(const char *id);
bool btu_family_valid(const char *family);

/* ---- write fences (docs/router.md, Failover: writes that arrive late) ----
 * A multi-cluster write the router sends carries BTU_WRITE_BY_HEADER: the wall-clock time in
 * microseconds (decimal) after which the node must not apply it, because the router may by then
 * have given up on the attempt and sent the write to another cluster. A node whose clock is past
 * it refuses the write DEADLINE_EXCEEDED before anything is written. */
#define BTU_WRITE_BY_HEADER "x-strata-write-by-us"

/* ---- table incarnations (docs/router.md, Flow control: a table deleted under a read) ----
 * A ReadRows the router sends may carry BTU_TABLE_CREATED_HEADER: the creation time (decimal
 * microseconds) the node reported for the table in ListTablets (Tablet.table_created_us) when the
 * read began. A node whose table of that name has another one (it was deleted and created again
 * since) refuses the read NOT_FOUND: the rows of a later table of the same name never continue
 * a scan of the earlier one. */
#define BTU_TABLE_CREATED_HEADER "x-strata-table-created-us"

/* ---- table schemas ---- */
#define BTU_FAMILIES_MAX 1000     /* column families of one table */
#define BTU_GC_DEPTH_MAX 16       /* a GC rule's nesting below its root */
#define BTU_GC_RULES_MAX 256      /* rules in one family's GC tree; Bigtable caps it at 500 B */
#define BTU_GC_RULE_BYTES_MAX 500 /* a new GC rule, serialized (Cloud Bigtable's limit) */
#define BTU_DURATION_SECONDS_MAX 315576000000LL  /* google.protobuf.Duration: 10,000 years */
#define BTU_CS_RETENTION_MIN_S (24LL * 3600)     /* change_stream_config.retention_period: */
#define BTU_CS_RETENTION_MAX_S (7LL * 24 * 3600) /* 1 to 7 days, as Cloud Bigtable */

/* Whether a change stream retention lies in [BTU_CS_RETENTION_MIN_S, BTU_CS_RETENTION_MAX_S]
 * with nanos in [0, 1e9). */
bool btu_cs_retention_ok(const Google__Protobuf__Duration *d);

/* Whether t's schema is one the nodes' PutTable accepts: at most BTU_FAMILIES_MAX families,
 * each named by btu_family_valid and listed once, GC rules as the node takes them
 * (max_num_versions >= 1, max_age not negative, at most BTU_GC_DEPTH_MAX levels and
 * BTU_GC_RULES_MAX rules), change streams off or kept 1 to 7 days. INVALID_ARGUMENT naming the
 * family or field. A schema read back from an export is checked with it before an import. */
st_code btu_schema_check(const Google__Bigtable__Admin__V2__Table *t, st_err *err);

/* Whether m drops its column family: `drop: true`. A `drop: false` asks for nothing and changes
 * nothing, as the emulator reads it (it used to drop the family and all its cells). */
bool btu_mod_drops(const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification *m);

/* FAILED_PRECONDITION, naming the family, when req drops a column family of table and the table
 * has deletion_protection (Cloud Bigtable's protection covers the table's families, not only the
 * table). Checked before anything changes, by the router and by a node answering the call. */
st_code
btu_drop_protection_check(const char *table, bool protection,
                          const Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest *req,
                          st_err *err);

/* One level of GC rule r, checked as CreateTable does: a leaf's value (max_num_versions >= 1,
 * max_age not negative) or, for a union or intersection, its rules in *kids[0..*n) (none for a
 * leaf or an unset rule). INVALID_ARGUMENT for a bad value or an unknown kind. The node's catalog
 * conversion and btu_schema_check walk the tree with it. */
st_code btu_gc_rule_level(const Google__Bigtable__Admin__V2__GcRule *r,
                          Google__Bigtable__Admin__V2__GcRule *const **kids, size_t *n,
                          st_err *err);

/* Splits a table name "projects/P/instances/I/tables/T" (at most max bytes) into its project,
 * instance and table id (slices into name). P and I are non-empty and slash-free; T follows
 * btu_table_id_valid (Bigtable's [_a-zA-Z0-9][-_.a-zA-Z0-9]*, 1..BTU_TABLE_ID_MAX). Any of the
 * outputs may be NULL. INVALID_ARGUMENT saying which part is wrong. The node and the router both
 * check every table name through it. */
st_code btu_table_name_parse(const char *name, size_t max, st_slice *project, st_slice *instance,
                             st_slice *table_id, st_err *err);

/* ---- nesting bound before unpacking ----
 * protobuf-c unpacks (and packs, sizes and frees) recursively, one C stack frame per nested
 * message, so bytes from the network are checked with btu_pb_check before they are unpacked.
 * BTU_PB_DEPTH_MAX is the deepest nesting accepted, the outermost message being level 1: above
 * anything valid (a ReadRowsRequest with a RowFilter nested the allowed 20 levels reaches level
 * 43, a PutTableRequest with a GC rule nested 16 levels level 38), so the RowFilter and GC-rule
 * checks after unpacking still give their own messages for moderately deep input, and low enough
 * that protobuf-c's recursion over an accepted message (about 1 KiB of stack a level) stays
 * within tens of KiB. */
#define BTU_PB_DEPTH_MAX 64

/* The most fields a message of a request may declare: btu_pb_unpack_request keeps a bit per
 * field while it scans a message (pbcheck_test checks every message the services take). */
#define BTU_PB_FIELDS_MAX 64

/* What unpacking a message may allocate: this plus twice its encoding (btu_pb_check). */
#define BTU_PB_UNPACK_SLACK_BYTES ((uint64_t)64 << 20)

/* Scans bytes as an encoding of desc without recursion and without allocating: ST_OK, or
 * INVALID_ARGUMENT with "message nesting exceeds N levels ..." when messages nest deeper than
 * depth_max levels (0 or more than BTU_PB_DEPTH_MAX means BTU_PB_DEPTH_MAX), or "malformed ..."
 * for bytes protobuf-c would refuse anyway: a tag over 5 bytes, a truncated varint, fixed value
 * or length, a length over 2^31 - 1, a group (wire types 3 and 4), wire types 6 and 7, a packed
 * repeated field of ragged length; and for field number 0, which the protobuf spec forbids
 * (protobuf-c refuses it in a one-byte tag only, and re-encodes a longer one into that); and
 * INVALID_ARGUMENT "invalid <type>: field <f> of <type> holds a NUL byte ..." for a string field
 * with a NUL byte inside, which protobuf-c would hand over cut at the NUL ("dur\0evil" as "dur":
 * another table, family or app profile). Never refuses other bytes protobuf-c accepts that nest
 * within depth_max. Unknown fields are skipped, not descended into. Also INVALID_ARGUMENT "...
 * holds too many small elements" when protobuf-c would allocate more than BTU_PB_UNPACK_SLACK_BYTES
 * plus twice bytes.len to unpack it (millions of empty submessages or unknown fields). */
st_code btu_pb_check(const ProtobufCMessageDescriptor *desc, st_slice bytes, unsigned depth_max,
                     st_err *err);

/* btu_pb_check with BTU_PB_DEPTH_MAX, then protobuf_c_message_unpack with alloc (NULL = malloc;
 * the caller frees the result with protobuf_c_message_free_unpacked, or drops its arena).
 * NULL with err (may be NULL) set to INVALID_ARGUMENT when the bytes are refused or cannot be
 * unpacked. Use it for every message that arrives from another process. */
ProtobufCMessage *btu_pb_unpack(const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *alloc,
                                st_slice bytes, st_err *err);
/* btu_pb_unpack of a request a server handles, which also refuses (INVALID_ARGUMENT "invalid
 * <type>: field <f> of <type> is not valid UTF-8 ...") a string field that is not UTF-8, as
 * proto3 requires and Cloud Bigtable does: stored and sent back, such a string makes grpc-go
 * clients (cbt, the Go client) fail the whole answer that carries it. It also refuses
 * (INVALID_ARGUMENT "invalid <type>: message field <f> of <type> occurs more than once ...") a
 * singular message field, oneof members included, sent in several pieces in one message:
 * protobuf would merge them, protobuf-c keeps only a oneof member's last piece (an acknowledged
 * write would store another cell than the one sent) and fails some other merges. Records already
 * stored are read with btu_pb_unpack, which checks neither, so they stay readable and
 * deletable. */
ProtobufCMessage *btu_pb_unpack_request(const ProtobufCMessageDescriptor *desc,
                                        ProtobufCAllocator *alloc, st_slice bytes, st_err *err);

/* btu_pb_unpack of bytes without the length-delimited field number `field` (a top-level bytes
 * field): its last occurrence, as protobuf takes it, is left where it lies and set in *lifted
 * (empty when absent), the message's field staying empty. protobuf-c would copy it: for a MiB of
 * payload per message that copy, and the MiB allocated for it, are most of the parse. */
ProtobufCMessage *btu_pb_unpack_lift(const ProtobufCMessageDescriptor *desc,
                                     ProtobufCAllocator *alloc, st_slice bytes, uint32_t field,
                                     st_slice *lifted, st_err *err);

/* INVALID_ARGUMENT naming family fam when the GC rule r serializes to more than
 * BTU_GC_RULE_BYTES_MAX bytes. For rules a request brings: schemas stored before the limit was
 * checked keep theirs. */
st_code btu_gc_rule_size_check(const char *fam, const Google__Bigtable__Admin__V2__GcRule *r,
                               st_err *err);
/* A column family a request brings: its GC rule's size (btu_gc_rule_size_check), and
 * UNIMPLEMENTED for a value_type (aggregate families: their AddToCell / MergeToCell are not
 * supported, so the family is refused rather than accepted and every write to it failing). */
st_code btu_family_check(const char *fam, const Google__Bigtable__Admin__V2__ColumnFamily *cf,
                         st_err *err);
/* Whether message m carries an unknown field numbered num (a field of the upstream API that
 * Strata's protos leave out). */
bool btu_pb_has_unknown(const ProtobufCMessage *m, uint32_t num);
/* Forgets the unknown fields of m and of every message in it, but those Strata understands (a
 * family's value_type), before m is stored: a record must not carry megabytes a client hid in
 * fields nothing reads. Their bytes stay with the allocator m was unpacked with (meant for arena
 * allocators, whose memory goes as a whole). Recurses once per nesting level: use on messages
 * btu_pb_check bounded. */
void btu_pb_drop_unknown(ProtobufCMessage *m);

/* ---- ReadRows request stats (stats.c) ---- */
#define BTU_READ_STATS_FIELD 3       /* ReadRowsResponse.request_stats */
#define BTU_READ_STATS_BYTES_MAX 128 /* the field as btu_read_stats_pack writes it, at most */
typedef struct btu_read_stats {
    int64_t rows_seen, rows_returned, cells_seen, cells_returned;
} btu_read_stats;
/* Writes into buf (BTU_READ_STATS_BYTES_MAX bytes) the ReadRowsResponse field request_stats, a
 * FullReadStatsView of s and latency_us; returns its length. */
size_t btu_read_stats_pack(const btu_read_stats *s, int64_t latency_us, uint8_t *buf);

#endif
