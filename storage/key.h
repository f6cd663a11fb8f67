/* key.h — internal keys: one memcmp-ordered byte string per LSM entry (private to storage/).
 *
 * Every entry of memtables and SSTables is (ikey, value) with ikeys compared by memcmp, so the
 * merge, block prefix compression, index and seeks need no custom comparator. Layout (format page:
 * docs/formats/keys.md):
 *
 *   enc(row) 0x01 ~version                                   row tombstone
 *   enc(row) 0x02 enc(family) 0x01 ~version                  family tombstone
 *   enc(row) 0x02 enc(family) 0x02 enc(qual) 0x01 ~version be64(end) be64(start)  column tombstone
 *   enc(row) 0x02 enc(family) 0x02 enc(qual) 0x02 ~ts ~version           cell
 *
 * enc(x) escapes 0x00 as 0x00 0xff and ends with 0x00 0x01, which keeps component order under
 * memcmp. ~v is the 8-byte big-endian complement of v, so newer timestamps and versions sort first.
 * Column tombstone: key = ... 0x01 ~version be64(end) be64(start); its value is empty.
 * Within a row, tombstones sort before what they may cover, so a forward merge meets a delete
 * before the cells it hides. */
#ifndef STO_KEY_H
#define STO_KEY_H

#include "strata/base.h"

typedef enum sto_key_kind {
    STO_KEY_ROW_DEL = 1,
    STO_KEY_FAMILY_DEL = 2,
    STO_KEY_COLUMN_DEL = 3,
    STO_KEY_CELL = 4,
} sto_key_kind;

/* A decoded internal key. Slices point into an scratch buffer when the component contained
 * escaped bytes, else into the key itself. */
typedef struct sto_key {
    sto_key_kind kind;
    st_slice row, family, qualifier;
    int64_t ts_us; /* CELL */
    uint64_t version;
    int64_t del_start_us, del_end_us; /* COLUMN_DEL */
} sto_key;

/* Appends the encoded key to out. */
st_code sto_key_encode(st_buf *out, const sto_key *k);
/* Appends enc(row) — the common prefix of all entries of a row; seeking to it finds the row's
 * first entry. */
st_code sto_key_encode_row_prefix(st_buf *out, st_slice row);
/* Decodes ikey; unescaped components are copied into scratch (reset by the call) when needed.
 * False on malformed input (ST_DATA_LOSS territory for the caller). */
bool sto_key_decode(st_slice ikey, sto_key *k, st_buf *scratch);
/* The row component of ikey (decoded into scratch if escaped). */
bool sto_key_row(st_slice ikey, st_slice *row, st_buf *scratch);
/* Length of the enc(row) prefix of ikey, or 0 if malformed: two keys belong to the same row iff
 * these prefixes are equal, with no decoding. */
size_t sto_key_row_prefix_len(st_slice ikey);

/* ---- additions for the readers (rowread.c), which work on encoded prefixes ---- */

/* Byte sizes of the fixed trailers: ~version, ~ts, be64(end) be64(start). */
#define STO_KEY_STAMP_BYTES 8

/* Where the components of an ikey end, without copying anything: ikey[0, row_end) is enc(row),
 * ikey[0, fam_end) ends with enc(family) and ikey[0, qual_end) with enc(qualifier) (0 when the
 * kind has no such component). *_esc tells whether the component holds an escaped 0x00. */
typedef struct sto_key_parts {
    sto_key_kind kind;
    size_t row_end, fam_end, qual_end;
    bool row_esc, fam_esc, qual_esc;
    int64_t ts_us;
    uint64_t version;
    int64_t del_start_us, del_end_us;
} sto_key_parts;

/* Validates ikey fully (as sto_key_decode) and fills p. False on malformed input. */
bool sto_key_parse(st_slice ikey, sto_key_parts *p);
/* enc is one encoded component including its 0x00 0x01 terminator; out is reset and receives
 * the raw bytes. ST_DATA_LOSS if malformed, ST_RESOURCE_EXHAUSTED if memory runs out. */
st_code sto_key_unescape(st_slice enc, st_buf *out);

#endif
