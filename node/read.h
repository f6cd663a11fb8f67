/* read.h — ReadRows building blocks (private to node/): row-set normalisation, the walk of a row
 * set over a table's tablets, and the CellChunk encoder. All pure functions (read_plan.c), so
 * tests drive them without a node; read.c puts them together with storage, filters and the
 * call's flow control.
 *
 * Row sets. A RowSet (keys + ranges) becomes a sorted list of disjoint half-open ranges
 * [start, end) over row keys: an open start k becomes the closed start k"\0" (k's immediate
 * successor in byte order), a closed end k becomes the open end k"\0", a key k becomes
 * [k, k"\0"). Empty start = from the first row; empty end = no upper bound (an empty key in any
 * bound means "unbounded", as the emulator does). Overlapping or touching ranges merge.
 *
 * Chunks. Each row is encoded whole into one ReadRowsResponse (the Go client checks after every
 * message that no row is left half-done: chunkReader.Close in bigtable.go), as CellChunks in the
 * wire format of ReadRowsResponse field 1: row_key on the row's first chunk, family_name when
 * the family changes, qualifier when family or qualifier changes, timestamp and labels on a
 * cell's first chunk, values over a chunk size split with value_size = total on the non-final
 * chunks, commit_row on the row's last chunk (as the emulator does). */
#ifndef NODE_READ_H
#define NODE_READ_H

#include <strata/base.h>

#include "filter.h"
#include "google/bigtable/v2/data.pb-c.h"
#include "node_internal.h"
#include "strata/btutil.h"

/* A value longer than this travels in several CellChunks. */
#define NODE_READ_VALUE_CHUNK_BYTES ((size_t)1 << 20)
/* A ReadRowsResponse is sent once its chunks reach this size (whole rows only). */
#define NODE_READ_BATCH_BYTES ((size_t)1 << 20)
/* Largest row a read returns (after the filter), and largest row held while it is assembled:
 * the cells the filter's head keeps as they arrive (node_filter_stream_*), all of them without a
 * filter. Cloud Bigtable: "Rows which exceed 256MiB in size cannot be read in full" and
 * FAILED_PRECONDITION "Read returned N MiB from row '...' which exceeds the limit of 256MiB". */
#define NODE_READ_ROW_BYTES_MAX ((size_t)256 << 20)
/* Room kept in a response message for everything besides the chunks (key, stats). */
#define NODE_READ_MESSAGE_SLACK_BYTES ((size_t)64 << 10)
/* Work per event-loop turn, so one huge scan cannot starve other clients: a turn ends after a
 * response batch was sent, or after this many rows or cells were scanned (cells also inside a
 * row; under a filter heavier than a few simple tests, as many cells as the filter's work allows:
 * read.c, turn_spent); a complete row is encoded at most NODE_READ_TURN_CELLS cells per turn. */
#define NODE_READ_TURN_ROWS 1000
#define NODE_READ_TURN_CELLS 20000
/* Rows and cells do not measure every read: a row set of many ranges that hold no rows returns
 * nothing, yet each range costs a seek of every table, and a seek may read and decompress a
 * block of up to 100 MiB (a row with one big value). A turn also ends, between two cells or two
 * ranges, once it opened this many ranges or read this many bytes of blocks from disk (storage's
 * sto_snapshot_read_bytes; cache hits are free). A single block is never cut, so one turn may
 * read one block over the bound. */
#define NODE_READ_TURN_RANGES 256
#define NODE_READ_TURN_BLOCK_BYTES ((uint64_t)8 << 20)
/* Loop time the reads' turns may take in one pass of the node's event loop before the other
 * reads' turns wait for the next pass, after the loop polled its sockets again: a turn over one
 * 100 MiB block takes a few hundred milliseconds, and N of them in one pass held every other call
 * of the node (and the router's keepalive PING) for N times that. */
#define NODE_READ_PASS_US 5000
/* Most row keys plus ranges accepted in one RowSet (a 1 MiB request holds fewer). */
#define NODE_READ_ROWSET_MAX BTU_ROWSET_MAX

/* Row sets are normalised by proto/bt (strata/btutil.h: the rules are described there), shared
 * with the router: [start, end) over row keys; empty start = first row, empty end = unbounded. */
typedef btu_key_range node_key_range;
typedef btu_rowset node_rowset;

/* See btu_rowset_from_pb. */
static inline st_code node_rowset_from_pb(const Google__Bigtable__V2__RowSet *rs, st_arena *arena,
                                          node_rowset *out, st_err *err) {
    return btu_rowset_from_pb(rs, arena, out, err);
}

/* See btu_rowset_merge. */
static inline size_t node_rowset_merge(node_key_range *v, size_t n) {
    return btu_rowset_merge(v, n);
}

/* ---- walking a row set over tablets ---- */
/* The walk keeps its position as a key (copied), so the tablet map may change between pieces
 * (splits): each piece looks the tablets up afresh. */
typedef struct node_scan {
    const node_rowset *rs;
    bool reversed;
    size_t done;  /* ranges finished, counted in scan order */
    bool has_pos; /* inside range `done`: forward, rows >= pos; reverse, rows < pos */
    st_buf pos;
    st_buf lo, hi; /* the current piece's bounds (owned copies) */
} node_scan;

void node_scan_init(node_scan *s, const node_rowset *rs, bool reversed);
/* As node_scan_init, on a scan that was initialised (or zeroed) before: keeps its buffers. */
void node_scan_restart(node_scan *s, const node_rowset *rs, bool reversed);
void node_scan_deinit(node_scan *s);
/* The next piece: the part of the current range inside one tablet of v[0..n) (sorted by start,
 * not overlapping, maybe with gaps, maybe none). Its slices are valid until the next call.
 * Returns ST_OK with *tablet = the tablet's index, ST_NOT_FOUND when the row set is exhausted,
 * ST_FAILED_PRECONDITION when no tablet holds the rows next to the scan's position (a gap; that
 * position is piece->start, and the scan stays there), ST_RESOURCE_EXHAUSTED when memory runs
 * out. The scan moves past the piece at once: read it fully before the next call. */
st_code node_scan_next(node_scan *s, const node_tablet *v, size_t n, node_key_range *piece,
                       size_t *tablet);
/* Moves the scan back into the piece node_scan_next returned last, to the row key: the next piece
 * starts at that row (forward: rows >= key; reversed: rows <= key), so a read can let its
 * iterator go inside a piece and take it up again at the row it had not finished. key must lie
 * in that piece. ST_RESOURCE_EXHAUSTED when memory runs out (the scan is unchanged). */
st_code node_scan_rewind(node_scan *s, st_slice key);
/* Whether v[0..n) holds every row of rs: ST_OK, or ST_FAILED_PRECONDITION with the first
 * uncovered position copied to key (ReadRows answers strata-not-owner before sending anything),
 * or ST_RESOURCE_EXHAUSTED. */
st_code node_scan_uncovered(const node_rowset *rs, const node_tablet *v, size_t n, st_buf *key);

/* ---- the chunk encoder ---- */
/* Bytes node_read_encode_row appends for this row. */
size_t node_read_row_encoded_bytes(st_slice key, const node_cell *const *cells, size_t n,
                                   size_t value_chunk_bytes);
/* Appends the CellChunks of one row (n >= 1 cells in Bigtable order) to out, as repeated
 * ReadRowsResponse.chunks (field 1). INTERNAL for a value over INT32_MAX bytes,
 * RESOURCE_EXHAUSTED if memory runs out (out unchanged then). */
st_code node_read_encode_row(st_buf *out, st_slice key, const node_cell *const *cells, size_t n,
                             size_t value_chunk_bytes, st_err *err);
/* Appends the CellChunks of n >= 1 consecutive cells of a row, so a large row can be encoded a
 * part at a time: prev is the cell before them (NULL: they are the row's first, and the first
 * chunk carries key), last puts commit_row on their last chunk. The parts of a row encoded in
 * order are the bytes node_read_encode_row writes for it. Errors as node_read_encode_row. */
st_code node_read_encode_cells(st_buf *out, st_slice key, const node_cell *prev,
                               const node_cell *const *cells, size_t n, bool last,
                               size_t value_chunk_bytes, st_err *err);
/* Appends ReadRowsResponse.last_scanned_row_key (field 2). */
st_code node_read_encode_last_scanned(st_buf *out, st_slice key);
/* Bytes a row holds for the NODE_READ_ROW_BYTES_MAX check: key, names, values and labels. */
size_t node_read_cell_bytes(const node_cell *c);

#endif
