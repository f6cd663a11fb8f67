/*
 * Proves the ReadRows building blocks are right without a node: the CellChunk encoder (decoded
 * back through the generated protobuf-c code and fed to a client-side chunk reader that enforces
 * the Go client's chunkReader rules — new rows carry key+family+qualifier, keys strictly ordered,
 * no family without qualifier, no key parts inside a split cell, no commit with value_size, no
 * row left open at a message's end — and reassembles rows for round trips), the presence rules
 * for family/qualifier wrappers (including present-but-empty names), value splitting, canonical
 * wire bytes (re-packing the decoded message gives the same bytes); row-set normalisation
 * (open/closed bounds, dedup and merging, Bigtable's range errors) checked against brute-force
 * membership over a small key universe; the walk of a row set over tablets, forward and reverse,
 * against the same brute force; and the RowFilter protobuf conversion (size limit, boolean
 * filters, chain arity, unknown filter kinds, nesting) with an evaluation on a sample row.
 * Randomized tests take STRATA_SEED.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "filter_pb.h"
#include "read.h"

#define S(lit) ST_SLICE_LIT(lit)
#define ROWS_MAX 64
#define CELLS_MAX 256

/* ---- a client-side chunk reader (the Go chunkReader's rules) ---- */

typedef struct rd_cell {
    st_buf family, qualifier, value;
    int64_t ts;
    char labels[4][16];
    size_t n_labels;
} rd_cell;

typedef struct rd_row {
    st_buf key;
    rd_cell cells[CELLS_MAX];
    size_t n;
} rd_row;

typedef enum { RD_NEW_ROW, RD_ROW_IN_PROGRESS, RD_CELL_IN_PROGRESS } rd_state;

typedef struct reader {
    bool reversed;
    rd_state state;
    rd_row rows[ROWS_MAX];
    size_t n_rows;
    rd_row cur;
    bool have_last;
    st_buf last_key;
    st_buf fam, qual; /* current family / qualifier */
    st_buf last_scanned;
    size_t chunks, messages;
    char err[256];
} reader;

static void buf_set(st_buf *b, const void *p, size_t len) {
    st_buf_reset(b);
    assert_int_equal(st_buf_append(b, p, len), ST_OK);
}

static void rd_init(reader *r, bool reversed) {
    memset(r, 0, sizeof *r);
    r->reversed = reversed;
}

static void rd_free_row(rd_row *row) {
    st_buf_free(&row->key);
    for (size_t i = 0; i < CELLS_MAX; i++) {
        st_buf_free(&row->cells[i].family);
        st_buf_free(&row->cells[i].qualifier);
        st_buf_free(&row->cells[i].value);
    }
    memset(row, 0, sizeof *row);
}

static void rd_deinit(reader *r) {
    for (size_t i = 0; i < ROWS_MAX; i++)
        rd_free_row(&r->rows[i]);
    rd_free_row(&r->cur);
    st_buf_free(&r->last_key);
    st_buf_free(&r->fam);
    st_buf_free(&r->qual);
    st_buf_free(&r->last_scanned);
}

static bool rd_fail(reader *r, const char *msg) {
    snprintf(r->err, sizeof r->err, "%s (chunk %zu)", msg, r->chunks);
    return false;
}

typedef Google__Bigtable__V2__ReadRowsResponse__CellChunk pb_chunk;

static bool key_parts_present(const pb_chunk *c) {
    return c->row_key.len > 0 || c->family_name || c->qualifier || c->timestamp_micros != 0;
}

static bool rd_chunk(reader *r, const pb_chunk *c) {
    bool commit = c->row_status_case ==
                  GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW;
    bool reset = c->row_status_case ==
                 GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_RESET_ROW;
    r->chunks++;
    if (reset)
        return rd_fail(r, "the server never resets rows");
    if (commit && c->value_size > 0)
        return rd_fail(r, "commit row found in between chunks in a cell");
    rd_cell *cell = NULL;
    if (r->state == RD_NEW_ROW) {
        if (c->row_key.len == 0 || !c->family_name || !c->qualifier)
            return rd_fail(r, "missing key field for new row");
        st_slice k = st_slice_make(c->row_key.data, c->row_key.len);
        if (r->have_last) {
            int cmp = st_slice_cmp(st_buf_slice(&r->last_key), k);
            if (r->reversed ? cmp <= 0 : cmp >= 0)
                return rd_fail(r, "out of order row key");
        }
        buf_set(&r->cur.key, k.data, k.len);
        r->cur.n = 0;
    } else if (r->state == RD_ROW_IN_PROGRESS) {
        if (c->row_key.len &&
            !st_slice_eq(st_buf_slice(&r->cur.key), st_slice_make(c->row_key.data, c->row_key.len)))
            return rd_fail(r, "new row key during existing row");
        if (c->family_name && !c->qualifier)
            return rd_fail(r, "family name specified without a qualifier");
    } else {
        if (key_parts_present(c) || c->n_labels)
            return rd_fail(r, "cell key components found while CELL_IN_PROGRESS");
        cell = &r->cur.cells[r->cur.n - 1];
    }
    if (cell == NULL) { /* a new cell */
        if (c->family_name)
            buf_set(&r->fam, c->family_name->value, strlen(c->family_name->value));
        if (c->qualifier)
            buf_set(&r->qual, c->qualifier->value.data, c->qualifier->value.len);
        assert_true(r->cur.n < CELLS_MAX);
        cell = &r->cur.cells[r->cur.n++];
        buf_set(&cell->family, r->fam.data, r->fam.len);
        buf_set(&cell->qualifier, r->qual.data, r->qual.len);
        st_buf_reset(&cell->value);
        cell->ts = c->timestamp_micros;
        cell->n_labels = c->n_labels;
        for (size_t i = 0; i < c->n_labels && i < 4; i++)
            snprintf(cell->labels[i], sizeof cell->labels[i], "%s", c->labels[i]);
    }
    if (c->value.len)
        assert_int_equal(st_buf_append(&cell->value, c->value.data, c->value.len), ST_OK);
    if (c->value_size > 0) {
        r->state = RD_CELL_IN_PROGRESS;
        return true;
    }
    r->state = RD_ROW_IN_PROGRESS;
    if (commit) {
        assert_true(r->n_rows < ROWS_MAX);
        rd_row tmp = r->rows[r->n_rows];
        r->rows[r->n_rows++] = r->cur;
        r->cur = tmp; /* recycle the buffers */
        buf_set(&r->last_key, r->rows[r->n_rows - 1].key.data, r->rows[r->n_rows - 1].key.len);
        r->have_last = true;
        r->state = RD_NEW_ROW;
    }
    return true;
}

/* One ReadRowsResponse, through the generated decoder. */
static bool rd_message(reader *r, st_slice msg) {
    Google__Bigtable__V2__ReadRowsResponse *m =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    if (m == NULL)
        return rd_fail(r, "the message does not decode");
    /* Canonical bytes: re-packing what was decoded gives back the same message. */
    size_t len = google__bigtable__v2__read_rows_response__get_packed_size(m);
    uint8_t *again = malloc(len ? len : 1);
    google__bigtable__v2__read_rows_response__pack(m, again);
    bool same = len == msg.len && memcmp(again, msg.data, len) == 0;
    free(again);
    bool ok = same || rd_fail(r, "the encoding is not canonical");
    for (size_t i = 0; ok && i < m->n_chunks; i++)
        ok = rd_chunk(r, m->chunks[i]);
    if (ok && m->last_scanned_row_key.len)
        buf_set(&r->last_scanned, m->last_scanned_row_key.data, m->last_scanned_row_key.len);
    if (ok && r->state != RD_NEW_ROW)
        ok = rd_fail(r, "invalid state for end of stream (a row spans messages)");
    r->messages++;
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
    return ok;
}

/* ---- helpers ---- */

/* Feeds one message; fails the test with the reader's complaint. */
static void rd_ok(reader *r, st_slice msg) {
    if (!rd_message(r, msg))
        fail_msg("chunk reader: %s", r->err);
}

static node_cell cell(const char *fam, const char *qual, int64_t ts, const char *val) {
    node_cell c = {st_slice_cstr(fam), st_slice_cstr(qual), ts, st_slice_cstr(val), NULL, 0};
    return c;
}

static void encode(st_buf *out, const char *key, const node_cell *cells, size_t n, size_t piece) {
    const node_cell *v[CELLS_MAX];
    for (size_t i = 0; i < n; i++)
        v[i] = &cells[i];
    size_t before = out->len;
    st_err err;
    assert_int_equal(node_read_encode_row(out, st_slice_cstr(key), v, n, piece, &err), ST_OK);
    assert_int_equal(out->len - before,
                     node_read_row_encoded_bytes(st_slice_cstr(key), v, n, piece));
}

static void assert_row(const rd_row *row, const char *key, const node_cell *cells, size_t n) {
    assert_true(st_slice_eq(st_buf_slice(&row->key), st_slice_cstr(key)));
    assert_int_equal(row->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_true(st_slice_eq(st_buf_slice(&row->cells[i].family), cells[i].family));
        assert_true(st_slice_eq(st_buf_slice(&row->cells[i].qualifier), cells[i].qualifier));
        assert_true(st_slice_eq(st_buf_slice(&row->cells[i].value), cells[i].value));
        assert_int_equal(row->cells[i].ts, cells[i].ts_us);
        assert_int_equal(row->cells[i].n_labels, cells[i].n_labels);
        for (uint32_t l = 0; l < cells[i].n_labels; l++)
            assert_true(st_slice_eq(st_slice_cstr(row->cells[i].labels[l]), cells[i].labels[l]));
    }
}

static Google__Bigtable__V2__ReadRowsResponse *decode(st_buf *b) {
    Google__Bigtable__V2__ReadRowsResponse *m =
        google__bigtable__v2__read_rows_response__unpack(NULL, b->len, b->data);
    assert_non_null(m);
    return m;
}

/* ---- chunk encoder ---- */

static void test_read_encode_round_trip(void **state) {
    (void)state;
    st_slice labels[2] = {S("lbl-a"), S("b")};
    node_cell cells[] = {cell("a", "q1", 3000, "v1"), cell("a", "q1", 2000, "v2"),
                         cell("a", "q2", 1000, ""), cell("b", "q1", 0, "x"),
                         cell("b", "q3", 5000, "yy")};
    cells[3].labels = labels;
    cells[3].n_labels = 2;
    st_buf b;
    st_buf_init(&b);
    encode(&b, "row1", cells, 5, NODE_READ_VALUE_CHUNK_BYTES);
    encode(&b, "row2", cells + 1, 2, NODE_READ_VALUE_CHUNK_BYTES);
    reader *r = calloc(1, sizeof *r);
    rd_init(r, false);
    rd_ok(r, st_buf_slice(&b));
    assert_int_equal(r->n_rows, 2);
    assert_row(&r->rows[0], "row1", cells, 5);
    assert_row(&r->rows[1], "row2", cells + 1, 2);
    rd_deinit(r);
    free(r);
    st_buf_free(&b);
}

static void test_read_encode_presence_rules(void **state) {
    (void)state;
    node_cell cells[] = {cell("a", "q", 3000, "1"), cell("a", "q", 2000, "2"),
                         cell("a", "r", 1000, "3"), cell("b", "r", 1000, "4")};
    st_buf b;
    st_buf_init(&b);
    encode(&b, "k", cells, 4, NODE_READ_VALUE_CHUNK_BYTES);
    Google__Bigtable__V2__ReadRowsResponse *m = decode(&b);
    assert_int_equal(m->n_chunks, 4);
    pb_chunk **c = m->chunks;
    /* row key only on the first chunk */
    assert_int_equal(c[0]->row_key.len, 1);
    for (int i = 1; i < 4; i++)
        assert_int_equal(c[i]->row_key.len, 0);
    /* family when it changes; qualifier when family or qualifier changes */
    assert_non_null(c[0]->family_name);
    assert_null(c[1]->family_name);
    assert_null(c[2]->family_name);
    assert_non_null(c[3]->family_name);
    assert_non_null(c[0]->qualifier);
    assert_null(c[1]->qualifier);
    assert_non_null(c[2]->qualifier);
    assert_non_null(c[3]->qualifier); /* same qualifier, new family: sent anyway */
    /* commit only on the last chunk */
    for (int i = 0; i < 3; i++)
        assert_int_equal(c[i]->row_status_case, 0);
    assert_true(c[3]->commit_row);
    assert_int_equal(c[1]->timestamp_micros, 2000);
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
    st_buf_free(&b);
}

static void test_read_encode_empty_names_are_present(void **state) {
    (void)state;
    node_cell cells[] = {cell("", "", 0, ""), cell("f", "", 0, "v")};
    st_buf b;
    st_buf_init(&b);
    encode(&b, "k", cells, 2, NODE_READ_VALUE_CHUNK_BYTES);
    Google__Bigtable__V2__ReadRowsResponse *m = decode(&b);
    assert_int_equal(m->n_chunks, 2);
    assert_non_null(m->chunks[0]->family_name); /* present, holding "" */
    assert_string_equal(m->chunks[0]->family_name->value, "");
    assert_non_null(m->chunks[0]->qualifier);
    assert_int_equal(m->chunks[0]->qualifier->value.len, 0);
    assert_non_null(m->chunks[1]->qualifier); /* family changed: qualifier "" sent again */
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
    reader *r = calloc(1, sizeof *r);
    rd_init(r, false);
    rd_ok(r, st_buf_slice(&b));
    assert_row(&r->rows[0], "k", cells, 2);
    rd_deinit(r);
    free(r);
    st_buf_free(&b);
}

static void test_read_encode_splits_large_values(void **state) {
    (void)state;
    size_t big = (5u << 20) / 2; /* 2.5 MiB: three chunks of at most 1 MiB */
    char *v = malloc(big + 1);
    for (size_t i = 0; i < big; i++)
        v[i] = (char)('a' + i % 26);
    v[big] = 0;
    node_cell cells[] = {cell("f", "q", 7000, v), cell("f", "r", 6000, "small")};
    st_buf b;
    st_buf_init(&b);
    encode(&b, "k", cells, 2, NODE_READ_VALUE_CHUNK_BYTES);
    Google__Bigtable__V2__ReadRowsResponse *m = decode(&b);
    assert_int_equal(m->n_chunks, 4);
    assert_int_equal(m->chunks[0]->value.len, NODE_READ_VALUE_CHUNK_BYTES);
    assert_int_equal(m->chunks[0]->value_size, (int32_t)big);
    assert_int_equal(m->chunks[0]->timestamp_micros, 7000);
    assert_int_equal(m->chunks[1]->value_size, (int32_t)big);
    assert_int_equal(m->chunks[1]->timestamp_micros, 0);
    assert_null(m->chunks[1]->family_name);
    assert_int_equal(m->chunks[2]->value_size, 0); /* the final piece has none */
    assert_int_equal(m->chunks[2]->row_status_case, 0);
    assert_true(m->chunks[3]->commit_row);
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
    reader *r = calloc(1, sizeof *r);
    rd_init(r, false);
    rd_ok(r, st_buf_slice(&b));
    assert_row(&r->rows[0], "k", cells, 2);
    rd_deinit(r);
    free(r);
    /* The last cell split: commit rides on its final piece. */
    st_buf_reset(&b);
    encode(&b, "k", cells, 1, 1000);
    m = decode(&b);
    assert_true(m->chunks[m->n_chunks - 1]->commit_row);
    assert_int_equal(m->chunks[m->n_chunks - 1]->value_size, 0);
    google__bigtable__v2__read_rows_response__free_unpacked(m, NULL);
    free(v);
    st_buf_free(&b);
}

/* A row encoded a part at a time (node_read_encode_cells, as read.c sends a row of many cells)
 * is byte for byte the row encoded whole, for every way of cutting it, values split included. */
static void test_read_encode_in_parts_matches_whole(void **state) {
    (void)state;
    st_slice labels[1] = {S("lbl")};
    node_cell cells[] = {cell("a", "q1", 3000, "v1"),   cell("a", "q1", 2000, "0123456789"),
                         cell("a", "q2", 1000, ""),     cell("b", "q2", 0, "x"),
                         cell("b", "q3", 5000, "yyyy"), cell("c", "", 7, "z")};
    cells[2].labels = labels;
    cells[2].n_labels = 1;
    size_t n = sizeof cells / sizeof cells[0];
    const node_cell *v[CELLS_MAX];
    for (size_t i = 0; i < n; i++)
        v[i] = &cells[i];
    size_t piece = 4; /* "0123456789" and "yyyy" span chunks */
    st_buf whole, parts;
    st_buf_init(&whole);
    st_buf_init(&parts);
    encode(&whole, "row", cells, n, piece);
    st_err err;
    for (size_t step = 1; step <= n; step++) {
        st_buf_reset(&parts);
        for (size_t from = 0; from < n; from += step) {
            size_t to = from + step < n ? from + step : n;
            assert_int_equal(node_read_encode_cells(&parts, S("row"), from ? v[from - 1] : NULL,
                                                    v + from, to - from, to == n, piece, &err),
                             ST_OK);
        }
        assert_int_equal(parts.len, whole.len);
        assert_memory_equal(parts.data, whole.data, whole.len);
    }
    st_buf_free(&whole);
    st_buf_free(&parts);
}

static void test_read_encode_last_scanned(void **state) {
    (void)state;
    st_buf b;
    st_buf_init(&b);
    assert_int_equal(node_read_encode_last_scanned(&b, S("zz")), ST_OK);
    reader *r = calloc(1, sizeof *r);
    rd_init(r, false);
    assert_true(rd_message(r, st_buf_slice(&b)));
    assert_int_equal(r->n_rows, 0);
    assert_true(st_slice_eq(st_buf_slice(&r->last_scanned), S("zz")));
    rd_deinit(r);
    free(r);
    st_buf_free(&b);
}

/* Random rows (tiny chunk size so splits happen) survive the trip in both directions. */
static void test_read_encode_random_round_trips(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_read_encode_random_round_trips"));
    static const char *fams[] = {"", "a", "bb"};
    static const char *quals[] = {"", "x", "yy", "zzz"};
    static const char *vals[] = {"", "v", "value-longer-than-a-chunk", "0123456789abcdef"};
    for (int iter = 0; iter < 200; iter++) {
        bool reversed = st_rng_below(&rng, 2);
        size_t n_rows = 1 + st_rng_below(&rng, 8);
        size_t piece = 1 + st_rng_below(&rng, 12);
        node_cell rows[8][16];
        size_t n_cells[8];
        char keys[8][8];
        st_buf b;
        st_buf_init(&b);
        reader *r = calloc(1, sizeof *r);
        rd_init(r, reversed);
        for (size_t i = 0; i < n_rows; i++) {
            size_t k = reversed ? n_rows - i : i + 1;
            snprintf(keys[i], sizeof keys[i], "r%02u", (unsigned)(k % 100));
            n_cells[i] = 1 + st_rng_below(&rng, 16);
            for (size_t j = 0; j < n_cells[i]; j++) /* order is not checked by the encoder */
                rows[i][j] =
                    cell(fams[st_rng_below(&rng, 3)], quals[st_rng_below(&rng, 4)],
                         (int64_t)st_rng_below(&rng, 3) * 1000, vals[st_rng_below(&rng, 4)]);
            encode(&b, keys[i], rows[i], n_cells[i], piece);
            if (st_rng_below(&rng, 3) == 0) { /* a message boundary between rows */
                rd_ok(r, st_buf_slice(&b));
                st_buf_reset(&b);
            }
        }
        if (b.len)
            rd_ok(r, st_buf_slice(&b));
        assert_int_equal(r->n_rows, n_rows);
        for (size_t i = 0; i < n_rows; i++)
            assert_row(&r->rows[i], keys[i], rows[i], n_cells[i]);
        rd_deinit(r);
        free(r);
        st_buf_free(&b);
    }
}

/* The reader itself rejects what the Go client rejects (so the checks above mean something). */
static void test_read_reader_rejects_bad_streams(void **state) {
    (void)state;
    node_cell cells[] = {cell("a", "q", 1, "v")};
    st_buf b;
    st_buf_init(&b);
    encode(&b, "b", cells, 1, 0);
    encode(&b, "a", cells, 1, 0); /* out of order */
    reader *r = calloc(1, sizeof *r);
    rd_init(r, false);
    assert_false(rd_message(r, st_buf_slice(&b)));
    rd_deinit(r);
    /* A row cut in the middle of a message sequence. */
    st_buf_reset(&b);
    encode(&b, "a", cells, 1, 0);
    b.len -= 2; /* drop commit_row (the last two bytes) and fix the chunk length */
    b.data[1] -= 2;
    rd_init(r, false);
    assert_false(rd_message(r, st_buf_slice(&b)));
    rd_deinit(r);
    free(r);
    st_buf_free(&b);
}

/* ---- row sets ---- */

typedef struct rs_fixture {
    st_arena arena;
    Google__Bigtable__V2__RowSet set;
    Google__Bigtable__V2__RowRange ranges[16];
    Google__Bigtable__V2__RowRange *range_ptrs[16];
    ProtobufCBinaryData keys[16];
} rs_fixture;

static ProtobufCBinaryData pbb(const char *s) {
    ProtobufCBinaryData b = {strlen(s), (uint8_t *)s};
    return b;
}

static void rs_init(rs_fixture *f) {
    memset(f, 0, sizeof *f);
    st_arena_init(&f->arena, 4096);
    google__bigtable__v2__row_set__init(&f->set);
    f->set.row_keys = f->keys;
    f->set.row_ranges = f->range_ptrs;
}

static void rs_key(rs_fixture *f, const char *k) {
    f->keys[f->set.n_row_keys++] = pbb(k);
}

/* start/end: NULL = unset; kinds 'c' closed, 'o' open. */
static void rs_range(rs_fixture *f, char sk, const char *s, char ek, const char *e) {
    Google__Bigtable__V2__RowRange *r = &f->ranges[f->set.n_row_ranges];
    google__bigtable__v2__row_range__init(r);
    if (s) {
        r->start_key_case = sk == 'c' ? GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED
                                      : GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
        r->start_key_closed = pbb(s); /* same union member storage for open */
    }
    if (e) {
        r->end_key_case = ek == 'c' ? GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED
                                    : GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        r->end_key_open = pbb(e);
    }
    f->range_ptrs[f->set.n_row_ranges] = r;
    f->set.n_row_ranges++;
}

static bool in_range(const node_key_range *r, st_slice k) {
    return st_slice_cmp(k, r->start) >= 0 && (r->end.len == 0 || st_slice_cmp(k, r->end) < 0);
}

static bool in_rowset(const node_rowset *rs, st_slice k) {
    for (size_t i = 0; i < rs->n; i++)
        if (in_range(&rs->v[i], k))
            return true;
    return false;
}

static void assert_normal(const node_rowset *rs) {
    for (size_t i = 0; i < rs->n; i++) {
        if (rs->v[i].end.len)
            assert_true(st_slice_cmp(rs->v[i].start, rs->v[i].end) < 0);
        if (i > 0) { /* sorted, disjoint, not touching */
            assert_true(rs->v[i - 1].end.len > 0);
            assert_true(st_slice_cmp(rs->v[i - 1].end, rs->v[i].start) < 0);
        }
    }
}

static void test_read_rowset_empty_means_all_rows(void **state) {
    (void)state;
    rs_fixture f;
    rs_init(&f);
    node_rowset rs;
    st_err err;
    assert_int_equal(node_rowset_from_pb(NULL, &f.arena, &rs, &err), ST_OK);
    assert_int_equal(rs.n, 1);
    assert_int_equal(rs.v[0].start.len, 0);
    assert_int_equal(rs.v[0].end.len, 0);
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
    assert_int_equal(rs.n, 1);
    /* Only empty keys: no row at all (no row has an empty key). */
    rs_key(&f, "");
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
    assert_int_equal(rs.n, 0);
    st_arena_deinit(&f.arena);
}

static void test_read_rowset_keys_and_ranges_merge(void **state) {
    (void)state;
    rs_fixture f;
    rs_init(&f);
    rs_key(&f, "m");
    rs_key(&f, "b");
    rs_key(&f, "b"); /* duplicate */
    rs_key(&f, "d");
    rs_range(&f, 'c', "c", 'o', "d"); /* [c, d) touches key d: merges into [c, d\0) */
    rs_range(&f, 'o', "p", 'c', "r"); /* (p, r] */
    rs_range(&f, 'c', "q", 0, NULL);  /* [q, inf) swallows (p, r] */
    node_rowset rs;
    st_err err;
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
    assert_normal(&rs);
    assert_int_equal(rs.n, 4);
    assert_true(st_slice_eq(rs.v[0].start, S("b")));
    assert_true(st_slice_eq(rs.v[0].end, st_slice_make("b\0", 2)));
    assert_true(st_slice_eq(rs.v[1].start, S("c")));
    assert_true(st_slice_eq(rs.v[1].end, st_slice_make("d\0", 2)));
    assert_true(st_slice_eq(rs.v[2].start, S("m")));
    assert_true(st_slice_eq(rs.v[3].start, st_slice_make("p\0", 2)));
    assert_int_equal(rs.v[3].end.len, 0);
    assert_false(in_rowset(&rs, S("p")));
    assert_true(in_rowset(&rs, S("pa")));
    assert_true(in_rowset(&rs, S("zzz")));
    st_arena_deinit(&f.arena);
}

static void test_read_rowset_range_errors(void **state) {
    (void)state;
    rs_fixture f;
    node_rowset rs;
    st_err err;
    rs_init(&f);
    rs_range(&f, 'c', "a", 'o', "a"); /* [a, a): empty, rejected like production */
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "Error in field 'row_ranges' : Error in element #0 : start_key "
                                 "must be less than end_key");
    st_arena_deinit(&f.arena);
    rs_init(&f);
    rs_range(&f, 'c', "a", 'c', "a"); /* [a, a] is the row a */
    rs_range(&f, 'c', "z", 'o', "b"); /* start > end */
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "element #1"));
    st_arena_deinit(&f.arena);
    rs_init(&f);
    rs_range(&f, 'c', "a", 'c', "a");
    rs_range(&f, 'o', "", 'o', "c"); /* open "" start = from the first row */
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
    assert_int_equal(rs.n, 1);
    assert_true(in_rowset(&rs, S("a")) && in_rowset(&rs, S("bz")) && !in_rowset(&rs, S("c")));
    st_arena_deinit(&f.arena);
    rs_init(&f);
    char *big = calloc(1, NODE_ROW_KEY_MAX + 2);
    memset(big, 'k', NODE_ROW_KEY_MAX + 1);
    rs_key(&f, big);
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "row_keys"));
    free(big);
    st_arena_deinit(&f.arena);
}

/* Key universe for brute force: strings over {0x00, 'a', 'b'} of length 1..3. */
#define UNIVERSE_MAX 64
static size_t universe(char keys[UNIVERSE_MAX][4], size_t lens[UNIVERSE_MAX]) {
    static const char alpha[3] = {0, 'a', 'b'};
    size_t n = 0;
    for (int len = 1; len <= 3; len++) {
        int total = len == 1 ? 3 : len == 2 ? 9 : 27;
        for (int x = 0; x < total; x++) {
            int y = x;
            for (int i = len - 1; i >= 0; i--) {
                keys[n][i] = alpha[y % 3];
                y /= 3;
            }
            lens[n++] = (size_t)len;
        }
    }
    return n; /* 39 */
}

static void random_key(st_rng *rng, char *buf, size_t *len) {
    static const char alpha[3] = {0, 'a', 'b'};
    *len = st_rng_below(rng, 3); /* 0 = unbounded / empty */
    for (size_t i = 0; i < *len; i++)
        buf[i] = alpha[st_rng_below(rng, 3)];
}

/* A random valid range: bounds chosen until start < end. */
static void random_range(rs_fixture *f, st_rng *rng, char store[][4], size_t *used) {
    for (;; *used -= 2) { /* a rejected attempt gives its two slots back */
        char *s = store[(*used)++], *e = store[(*used)++];
        size_t sl, el;
        random_key(rng, s, &sl);
        random_key(rng, e, &el);
        char sk = st_rng_below(rng, 2) ? 'c' : 'o', ek = st_rng_below(rng, 2) ? 'c' : 'o';
        /* mimic the successor rule to know whether the server accepts it */
        char sb[8], eb[8];
        size_t sn = sl, en = el;
        memcpy(sb, s, sl);
        memcpy(eb, e, el);
        if (sl && sk == 'o')
            sb[sn++] = 0;
        if (el && ek == 'c')
            eb[en++] = 0;
        if (en && st_slice_cmp(st_slice_make(sb, sn), st_slice_make(eb, en)) >= 0)
            continue;
        Google__Bigtable__V2__RowRange *r = &f->ranges[f->set.n_row_ranges];
        google__bigtable__v2__row_range__init(r);
        if (st_rng_below(rng, 4)) {
            r->start_key_case = sk == 'c'
                                    ? GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED
                                    : GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
            r->start_key_closed = (ProtobufCBinaryData){sl, (uint8_t *)s};
        } else if (sl) {
            continue; /* unset start must mean "from the first row" */
        }
        if (st_rng_below(rng, 4)) {
            r->end_key_case = ek == 'c' ? GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED
                                        : GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
            r->end_key_open = (ProtobufCBinaryData){el, (uint8_t *)e};
        } else if (el) {
            continue;
        }
        f->range_ptrs[f->set.n_row_ranges++] = r;
        return;
    }
}

static bool pb_range_has(const Google__Bigtable__V2__RowRange *r, st_slice k) {
    if (r->start_key_case) {
        st_slice s = st_slice_make(r->start_key_closed.data, r->start_key_closed.len);
        int c = st_slice_cmp(k, s);
        if (s.len && (r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN
                          ? c <= 0
                          : c < 0))
            return false;
    }
    if (r->end_key_case) {
        st_slice e = st_slice_make(r->end_key_open.data, r->end_key_open.len);
        int c = st_slice_cmp(k, e);
        if (e.len &&
            (r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED ? c > 0
                                                                                        : c >= 0))
            return false;
    }
    return true;
}

static bool pb_set_has(const Google__Bigtable__V2__RowSet *s, st_slice k) {
    for (size_t i = 0; i < s->n_row_keys; i++)
        if (st_slice_eq(k, st_slice_make(s->row_keys[i].data, s->row_keys[i].len)))
            return true;
    for (size_t i = 0; i < s->n_row_ranges; i++)
        if (pb_range_has(s->row_ranges[i], k))
            return true;
    return s->n_row_keys + s->n_row_ranges == 0;
}

static void make_tablets(node_tablet *t, size_t *n, st_rng *rng, char keys[][4], size_t *lens,
                         size_t nu) {
    /* random distinct boundaries from the universe, sorted */
    size_t nb = st_rng_below(rng, 5);
    st_slice b[5];
    size_t m = 0;
    for (size_t i = 0; i < nb; i++) {
        size_t u = st_rng_below(rng, nu);
        b[m++] = st_slice_make(keys[u], lens[u]);
    }
    for (size_t i = 1; i < m; i++) /* insertion sort */
        for (size_t j = i; j > 0 && st_slice_cmp(b[j - 1], b[j]) > 0; j--) {
            st_slice x = b[j];
            b[j] = b[j - 1];
            b[j - 1] = x;
        }
    size_t w = 0;
    for (size_t i = 0; i < m; i++)
        if (w == 0 || !st_slice_eq(b[w - 1], b[i]))
            b[w++] = b[i];
    *n = w + 1;
    for (size_t i = 0; i <= w; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].id = 100 + i;
        st_buf_init(&t[i].start);
        st_buf_init(&t[i].end);
        if (i > 0)
            st_buf_append(&t[i].start, b[i - 1].data, b[i - 1].len);
        if (i < w)
            st_buf_append(&t[i].end, b[i].data, b[i].len);
    }
}

static void free_tablets(node_tablet *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        st_buf_free(&t[i].start);
        st_buf_free(&t[i].end);
    }
}

static bool tablet_has(const node_tablet *t, st_slice k) {
    return st_slice_cmp(k, st_buf_slice(&t->start)) >= 0 &&
           (t->end.len == 0 || st_slice_cmp(k, st_buf_slice(&t->end)) < 0);
}

/* Random row sets against brute force; then walked over random tablets, forward and reverse:
 * pieces lie in one tablet, are ordered and disjoint, and together are exactly the row set. */
static void test_read_rowset_and_walk_match_brute_force(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_read_rowset_and_walk_match_brute_force"));
    char keys[UNIVERSE_MAX][4];
    size_t lens[UNIVERSE_MAX];
    size_t nu = universe(keys, lens);
    for (int iter = 0; iter < 500; iter++) {
        rs_fixture f;
        rs_init(&f);
        char store[256][4];
        size_t used = 0;
        size_t nk = st_rng_below(&rng, 4), nr = st_rng_below(&rng, 5);
        for (size_t i = 0; i < nk; i++) {
            size_t u = st_rng_below(&rng, nu);
            f.keys[f.set.n_row_keys++] = (ProtobufCBinaryData){lens[u], (uint8_t *)keys[u]};
        }
        for (size_t i = 0; i < nr; i++)
            random_range(&f, &rng, store, &used);
        node_rowset rs;
        st_err err;
        assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
        assert_normal(&rs);
        for (size_t u = 0; u < nu; u++) {
            st_slice k = st_slice_make(keys[u], lens[u]);
            assert_int_equal(in_rowset(&rs, k), pb_set_has(&f.set, k));
        }
        node_tablet t[6];
        size_t nt;
        make_tablets(t, &nt, &rng, keys, lens, nu);
        for (int dir = 0; dir < 2; dir++) {
            node_scan s;
            node_scan_init(&s, &rs, dir == 1);
            int hits[UNIVERSE_MAX] = {0};
            st_buf prev_lo;
            st_buf_init(&prev_lo);
            bool have_prev = false;
            node_key_range piece;
            size_t ti;
            while (node_scan_next(&s, t, nt, &piece, &ti) == ST_OK) {
                assert_true(ti < nt);
                assert_true(piece.end.len == 0 || st_slice_cmp(piece.start, piece.end) < 0);
                if (have_prev) { /* order: forward ascending starts, reverse descending */
                    int c = st_slice_cmp(piece.start, st_buf_slice(&prev_lo));
                    assert_true(dir == 0 ? c > 0 : c < 0);
                }
                buf_set(&prev_lo, piece.start.data, piece.start.len);
                have_prev = true;
                for (size_t u = 0; u < nu; u++) {
                    st_slice k = st_slice_make(keys[u], lens[u]);
                    if (in_range(&piece, k)) {
                        assert_true(tablet_has(&t[ti], k));
                        hits[u]++;
                    }
                }
            }
            for (size_t u = 0; u < nu; u++)
                assert_int_equal(hits[u], in_rowset(&rs, st_slice_make(keys[u], lens[u])));
            st_buf_free(&prev_lo);
            node_scan_deinit(&s);
        }
        free_tablets(t, nt);
        st_arena_deinit(&f.arena);
    }
}

/* A read that lets its iterator go inside a piece rewinds the walk to the row it had not
 * finished (node_scan_rewind): random row sets and tablets, forward and reverse, rewinding at a
 * random row of random pieces; the rows delivered before each rewind plus those of the pieces
 * after it are exactly the row set, each once. */
static void test_read_walk_rewind_delivers_each_row_once(void **state) {
    (void)state;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("test_read_walk_rewind_delivers_each_row_once"));
    char keys[UNIVERSE_MAX][4];
    size_t lens[UNIVERSE_MAX];
    size_t nu = universe(keys, lens);
    size_t order[UNIVERSE_MAX]; /* the universe by key */
    for (size_t i = 0; i < nu; i++)
        order[i] = i;
    for (size_t i = 1; i < nu; i++)
        for (size_t j = i;
             j > 0 && st_slice_cmp(st_slice_make(keys[order[j - 1]], lens[order[j - 1]]),
                                   st_slice_make(keys[order[j]], lens[order[j]])) > 0;
             j--) {
            size_t x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int iter = 0; iter < 500; iter++) {
        rs_fixture f;
        rs_init(&f);
        char store[256][4];
        size_t used = 0;
        size_t nk = st_rng_below(&rng, 4), nr = st_rng_below(&rng, 5);
        for (size_t i = 0; i < nk; i++) {
            size_t u = st_rng_below(&rng, nu);
            f.keys[f.set.n_row_keys++] = (ProtobufCBinaryData){lens[u], (uint8_t *)keys[u]};
        }
        for (size_t i = 0; i < nr; i++)
            random_range(&f, &rng, store, &used);
        node_rowset rs;
        st_err err;
        assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
        node_tablet t[6];
        size_t nt;
        make_tablets(t, &nt, &rng, keys, lens, nu);
        for (int dir = 0; dir < 2; dir++) {
            node_scan s;
            node_scan_init(&s, &rs, dir == 1);
            int hits[UNIVERSE_MAX] = {0};
            node_key_range piece;
            size_t ti;
            for (int guard = 0; node_scan_next(&s, t, nt, &piece, &ti) == ST_OK; guard++) {
                assert_true(guard < 10000);
                /* The piece's rows in scan order; the read stops at a random one (its open row). */
                size_t in[UNIVERSE_MAX], m = 0;
                for (size_t k = 0; k < nu; k++) {
                    size_t u = order[dir == 0 ? k : nu - 1 - k];
                    if (in_range(&piece, st_slice_make(keys[u], lens[u])))
                        in[m++] = u;
                }
                size_t stop = m > 0 && st_rng_below(&rng, 2) ? st_rng_below(&rng, m) : m;
                for (size_t k = 0; k < stop; k++)
                    hits[in[k]]++;
                if (stop < m) {
                    st_slice open = st_slice_make(keys[in[stop]], lens[in[stop]]);
                    assert_int_equal(node_scan_rewind(&s, open), ST_OK);
                }
            }
            for (size_t u = 0; u < nu; u++)
                assert_int_equal(hits[u], in_rowset(&rs, st_slice_make(keys[u], lens[u])));
            node_scan_deinit(&s);
        }
        free_tablets(t, nt);
        st_arena_deinit(&f.arena);
    }
}

static void test_read_walk_splits_by_tablet(void **state) {
    (void)state;
    rs_fixture f;
    rs_init(&f);
    rs_range(&f, 'c', "b", 'o', "p");
    rs_key(&f, "x");
    node_rowset rs;
    st_err err;
    assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
    node_tablet t[3];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 3; i++) {
        st_buf_init(&t[i].start);
        st_buf_init(&t[i].end);
        t[i].id = (uint64_t)i;
    }
    st_buf_append(&t[0].end, "c", 1);
    st_buf_append(&t[1].start, "c", 1);
    st_buf_append(&t[1].end, "m", 1);
    st_buf_append(&t[2].start, "m", 1);
    node_scan s;
    node_key_range p;
    size_t ti;
    static const struct {
        const char *lo, *hi;
        size_t lo_len, hi_len, tablet;
    } fwd[] = {
        {"b", "c", 1, 1, 0}, {"c", "m", 1, 1, 1}, {"m", "p", 1, 1, 2}, {"x", "x\0", 1, 2, 2}};
    node_scan_init(&s, &rs, false);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(node_scan_next(&s, t, 3, &p, &ti), ST_OK);
        assert_true(st_slice_eq(p.start, st_slice_make(fwd[i].lo, fwd[i].lo_len)));
        assert_true(st_slice_eq(p.end, st_slice_make(fwd[i].hi, fwd[i].hi_len)));
        assert_int_equal(ti, fwd[i].tablet);
    }
    assert_int_equal(node_scan_next(&s, t, 3, &p, &ti), ST_NOT_FOUND);
    node_scan_deinit(&s);
    node_scan_init(&s, &rs, true);
    for (int i = 3; i >= 0; i--) {
        assert_int_equal(node_scan_next(&s, t, 3, &p, &ti), ST_OK);
        assert_true(st_slice_eq(p.start, st_slice_make(fwd[i].lo, fwd[i].lo_len)));
        assert_int_equal(ti, fwd[i].tablet);
    }
    assert_int_equal(node_scan_next(&s, t, 3, &p, &ti), ST_NOT_FOUND);
    node_scan_deinit(&s);
    free_tablets(t, 3);
    st_arena_deinit(&f.arena);
}

/* A cluster member's tablets leave gaps: the walk stops at the first row no tablet holds and
 * reports where (ReadRows turns that into strata-not-owner). Tablets [c, m) and [p, ∞). */
static void test_read_walk_reports_gaps(void **state) {
    (void)state;
    node_tablet t[2];
    memset(t, 0, sizeof t);
    const char *bounds[2][2] = {{"c", "m"}, {"p", ""}};
    for (int i = 0; i < 2; i++) {
        st_buf_init(&t[i].start);
        st_buf_init(&t[i].end);
        st_buf_append(&t[i].start, bounds[i][0], strlen(bounds[i][0]));
        st_buf_append(&t[i].end, bounds[i][1], strlen(bounds[i][1]));
    }
    static const struct {
        const char *lo, *hi, *fwd_gap, *rev_gap; /* NULL gap: covered */
    } cases[] = {{"d", "f", NULL, NULL},
                 {"a", "e", "a", "c"},
                 {"k", "q", "m", "m"},
                 {"q", "z", NULL, NULL},
                 {"m", "p", "m", "m"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rs_fixture f;
        rs_init(&f);
        rs_range(&f, 'c', cases[c].lo, 'o', cases[c].hi);
        node_rowset rs;
        st_err err;
        assert_int_equal(node_rowset_from_pb(&f.set, &f.arena, &rs, &err), ST_OK);
        st_buf key;
        st_buf_init(&key);
        st_code want = cases[c].fwd_gap ? ST_FAILED_PRECONDITION : ST_OK;
        assert_int_equal(node_scan_uncovered(&rs, t, 2, &key), want);
        if (cases[c].fwd_gap)
            assert_true(st_slice_eq(st_buf_slice(&key), st_slice_cstr(cases[c].fwd_gap)));
        assert_int_equal(node_scan_uncovered(&rs, t, 0, &key), ST_FAILED_PRECONDITION);
        st_buf_free(&key);
        node_scan s;
        node_key_range p;
        size_t ti;
        st_code rc;
        node_scan_init(&s, &rs, true);
        while ((rc = node_scan_next(&s, t, 2, &p, &ti)) == ST_OK) {
        }
        assert_int_equal(rc, cases[c].rev_gap ? ST_FAILED_PRECONDITION : ST_NOT_FOUND);
        if (cases[c].rev_gap)
            assert_true(st_slice_eq(p.start, st_slice_cstr(cases[c].rev_gap)));
        node_scan_deinit(&s);
        st_arena_deinit(&f.arena);
    }
    free_tablets(t, 2);
}

/* ---- RowFilter protobuf ---- */

typedef Google__Bigtable__V2__RowFilter pb_filter;

static pb_filter *pf_new(st_arena *a) {
    pb_filter *f = st_arena_alloc(a, sizeof *f);
    google__bigtable__v2__row_filter__init(f);
    return f;
}

static pb_filter *pf_family(st_arena *a, const char *re) {
    pb_filter *f = pf_new(a);
    f->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER;
    f->family_name_regex_filter = (char *)re;
    return f;
}

static pb_filter *pf_chain(st_arena *a, pb_filter **subs, size_t n) {
    pb_filter *f = pf_new(a);
    Google__Bigtable__V2__RowFilter__Chain *c = st_arena_alloc(a, sizeof *c);
    google__bigtable__v2__row_filter__chain__init(c);
    c->filters = st_arena_dup(a, subs, n * sizeof *subs);
    c->n_filters = n;
    f->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    f->chain = c;
    return f;
}

static void test_read_filter_pb_converts_and_evaluates(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 1 << 16);
    pb_filter *cr = pf_new(&a);
    Google__Bigtable__V2__ColumnRange *range = st_arena_alloc(&a, sizeof *range);
    google__bigtable__v2__column_range__init(range);
    range->family_name = "f";
    range->start_qualifier_case =
        GOOGLE__BIGTABLE__V2__COLUMN_RANGE__START_QUALIFIER_START_QUALIFIER_OPEN;
    range->start_qualifier_open = pbb("a");
    range->end_qualifier_case =
        GOOGLE__BIGTABLE__V2__COLUMN_RANGE__END_QUALIFIER_END_QUALIFIER_CLOSED;
    range->end_qualifier_closed = pbb("c");
    cr->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_RANGE_FILTER;
    cr->column_range_filter = range;
    pb_filter *lim = pf_new(&a);
    lim->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    lim->cells_per_column_limit_filter = 1;
    pb_filter *subs[3] = {pf_family(&a, "f|g"), cr, lim};
    pb_filter *chain = pf_chain(&a, subs, 3);
    node_filter *nf;
    st_err err;
    assert_int_equal(node_filter_from_pb(chain, &a, &nf, &err), ST_OK);
    assert_non_null(nf);
    node_cell cells[] = {cell("f", "a", 3, "1"), cell("f", "b", 3, "2"), cell("f", "b", 2, "3"),
                         cell("f", "c", 1, "4"), cell("f", "d", 1, "5"), cell("g", "b", 1, "6")};
    node_filter_ctx fc = {&a, NULL, 0};
    const node_cell *const *out;
    size_t n_out;
    assert_int_equal(node_filter_eval(nf, S("row"), cells, 6, &fc, &out, &n_out, &err), ST_OK);
    assert_int_equal(n_out, 2);
    assert_true(node_cell_cmp(out[0], &cells[1]) == 0 && st_slice_eq(out[0]->value, S("2")));
    assert_true(node_cell_cmp(out[1], &cells[3]) == 0 && st_slice_eq(out[1]->value, S("4")));
    node_filter_release(nf);
    assert_int_equal(node_filter_from_pb(NULL, &a, &nf, &err), ST_OK);
    assert_null(nf);
    st_arena_deinit(&a);
}

static void test_read_filter_pb_rejections(void **state) {
    (void)state;
    st_arena a;
    st_arena_init(&a, 1 << 16);
    node_filter *nf;
    st_err err;
    /* Chain of one: production rejects it (docs/bigtable.md, Row filters). */
    pb_filter *one[1] = {pf_family(&a, "f")};
    assert_int_equal(node_filter_from_pb(pf_chain(&a, one, 1), &a, &nf, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "at least two"));
    assert_null(nf);
    /* Booleans set to false. */
    pb_filter *pa = pf_new(&a);
    pa->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_PASS_ALL_FILTER;
    pa->pass_all_filter = 0;
    assert_int_equal(node_filter_from_pb(pa, &a, &nf, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "pass_all_filter must be true"));
    pa->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_STRIP_VALUE_TRANSFORMER;
    assert_int_equal(node_filter_from_pb(pa, &a, &nf, &err), ST_INVALID_ARGUMENT);
    pa->strip_value_transformer = 1;
    assert_int_equal(node_filter_from_pb(pa, &a, &nf, &err), ST_OK);
    node_filter_release(nf);
    /* Over 20,480 serialized bytes. */
    size_t n = 1200;
    pb_filter **many = st_arena_alloc(&a, n * sizeof *many);
    for (size_t i = 0; i < n; i++)
        many[i] = pf_family(&a, "family-regex-x");
    assert_int_equal(node_filter_from_pb(pf_chain(&a, many, n), &a, &nf, &err),
                     ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "Row filter exceeds maximum size"));
    /* A filter kind this build does not carry arrives as an unknown field. */
    static const uint8_t unknown[] = {0xA8, 0x01, 0x01}; /* field 21, varint 1 */
    pb_filter *u = google__bigtable__v2__row_filter__unpack(NULL, sizeof unknown, unknown);
    assert_non_null(u);
    assert_int_equal(node_filter_from_pb(u, &a, &nf, &err), ST_UNIMPLEMENTED);
    google__bigtable__v2__row_filter__free_unpacked(u, NULL);
    /* Nesting far past the limit but under the size limit: rejected by depth. */
    pb_filter *deep = pf_family(&a, "f");
    for (int i = 0; i < 500; i++) {
        pb_filter *pair[2] = {deep, pf_family(&a, "g")};
        deep = pf_chain(&a, pair, 2);
    }
    assert_int_equal(node_filter_from_pb(deep, &a, &nf, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "nested"));
    /* A bad regex names its field. */
    pb_filter *bad = pf_new(&a);
    bad->filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_ROW_KEY_REGEX_FILTER;
    bad->row_key_regex_filter = pbb("(a");
    assert_int_equal(node_filter_from_pb(bad, &a, &nf, &err), ST_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "row_key_regex_filter"));
    st_arena_deinit(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_encode_round_trip),
        cmocka_unit_test(test_read_encode_presence_rules),
        cmocka_unit_test(test_read_encode_empty_names_are_present),
        cmocka_unit_test(test_read_encode_splits_large_values),
        cmocka_unit_test(test_read_encode_in_parts_matches_whole),
        cmocka_unit_test(test_read_encode_last_scanned),
        cmocka_unit_test(test_read_encode_random_round_trips),
        cmocka_unit_test(test_read_reader_rejects_bad_streams),
        cmocka_unit_test(test_read_rowset_empty_means_all_rows),
        cmocka_unit_test(test_read_rowset_keys_and_ranges_merge),
        cmocka_unit_test(test_read_rowset_range_errors),
        cmocka_unit_test(test_read_rowset_and_walk_match_brute_force),
        cmocka_unit_test(test_read_walk_rewind_delivers_each_row_once),
        cmocka_unit_test(test_read_walk_splits_by_tablet),
        cmocka_unit_test(test_read_walk_reports_gaps),
        cmocka_unit_test(test_read_filter_pb_converts_and_evaluates),
        cmocka_unit_test(test_read_filter_pb_rejections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
