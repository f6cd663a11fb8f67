/* changes_msg.c — ReadChangeStreamResponse encoders (changes_msg.h). Pure: DataChange messages
 * written as wire bytes directly, Heartbeat and CloseStream as protobuf-c structs packed, each
 * behind RPC_SEND_HEADROOM free bytes. */
#include "changes_msg.h"

#include <string.h>

#include "strata/cstoken.h"
#include "strata/rpc.h"

typedef Google__Bigtable__V2__ReadChangeStreamResponse cs_resp;

/* Bytes a chunk costs in a message besides its value piece (tags, lengths, timestamps). */
#define CS_CHUNK_OVERHEAD_BYTES 32

/* Packs resp behind RPC_SEND_HEADROOM bytes into msg (emptied first). */
static st_code pack(st_buf *msg, const cs_resp *resp) {
    size_t len = protobuf_c_message_get_packed_size(&resp->base);
    st_buf_reset(msg);
    if (st_buf_reserve(msg, RPC_SEND_HEADROOM + len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    memset(msg->data, 0, RPC_SEND_HEADROOM);
    protobuf_c_message_pack(&resp->base, msg->data + RPC_SEND_HEADROOM);
    msg->len = RPC_SEND_HEADROOM + len;
    return ST_OK;
}

/* ---- DataChange ----
 * Written as protobuf wire bytes directly, without protobuf-c structs: a live reader encodes
 * every record of its partition, and building the structs in an arena, the generic packer's
 * size pass and its reflection cost more than the rest of a record's way out. The bytes are
 * those protobuf-c writes for the same message (fields in number order, proto3 zero values left
 * out, int32 and int64 as sign-extended varints); changes_msg_test repacks every message with
 * protobuf-c and compares. Every field number below is below 16, so every tag is one byte. */

typedef enum cs_dc_field {
    DC_TYPE = 1,
    DC_SOURCE = 2,
    DC_ROW = 3,
    DC_COMMIT = 4,
    DC_TIEBREAKER = 5,
    DC_CHUNKS = 6,
    DC_DONE = 8,
    DC_TOKEN = 9,
    DC_WATERMARK = 10,
} cs_dc_field;

#define WIRE_VARINT 0u
#define WIRE_LEN 2u
#define RESP_DATA_CHANGE 1u /* ReadChangeStreamResponse.data_change */

static size_t vlen(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A varint field (left out when zero), a length-delimited field of len bytes (left out when
 * empty unless always), and their writers. */
static size_t f_varint(uint64_t v) {
    return v ? 1 + vlen(v) : 0;
}
static size_t f_len(size_t len, bool always) {
    return len || always ? 1 + vlen(len) + len : 0;
}
/* st_put_varint64 inline: a DataChange has a dozen varints. */
static inline uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}
static uint8_t *w_varint(uint8_t *p, uint32_t field, uint64_t v) {
    if (!v)
        return p;
    *p++ = (uint8_t)(field << 3 | WIRE_VARINT);
    return put_varint(p, v);
}
static uint8_t *w_head(uint8_t *p, uint32_t field, size_t len) {
    *p++ = (uint8_t)(field << 3 | WIRE_LEN);
    return put_varint(p, len);
}
static uint8_t *w_bytes(uint8_t *p, uint32_t field, st_slice s) {
    if (!s.len)
        return p;
    p = w_head(p, field, s.len);
    memcpy(p, s.data, s.len);
    return p + s.len;
}

static uint64_t sx(int64_t v) { /* int32 / int64 on the wire */
    return (uint64_t)v;
}

/* A google.protobuf.Timestamp of us: its seconds and nanos on the wire and its bytes' length,
 * worked out once for the length and the writer. */
typedef struct cs_ts {
    uint64_t s, ns;
    size_t len;
} cs_ts;

static cs_ts ts_of(int64_t us) {
    cs_ts t = {sx(us / 1000000), sx((int32_t)(us % 1000000) * 1000), 0};
    t.len = f_varint(t.s) + f_varint(t.ns);
    return t;
}
static uint8_t *w_ts(uint8_t *p, uint32_t field, cs_ts t) {
    p = w_head(p, field, t.len);
    p = w_varint(p, 1, t.s);
    return w_varint(p, 2, t.ns);
}

/* One MutationChunk: a mutation, or piece k of a long SetCell value. */
typedef struct cs_chunk {
    sto_mut_type type; /* SET_CELL, DEL_COLUMN or DEL_FAMILY */
    st_slice family, qualifier, value;
    int64_t ts, ts_start, ts_end; /* ts_end 0: unbounded */
    bool info, last;              /* chunk_info, and its last_chunk */
    uint64_t size, off;
    size_t body, mut, info_len, len; /* the lengths of the Mutation's oneof message, the Mutation,
                                        the ChunkInfo and the MutationChunk */
} cs_chunk;

/* Chunks one mutation takes. */
static size_t mut_chunks(const sto_mut *m, size_t value_bytes, size_t n_families) {
    if (m->type == STO_MUT_DEL_ROW)
        return n_families;
    if (m->type == STO_MUT_SET_CELL && m->value.len > value_bytes)
        return (m->value.len + value_bytes - 1) / value_bytes;
    return 1;
}

static void chunk_lengths(cs_chunk *c) {
    c->body = f_len(c->family.len, false);
    if (c->type == STO_MUT_SET_CELL)
        c->body +=
            f_len(c->qualifier.len, false) + f_varint(sx(c->ts)) + f_len(c->value.len, false);
    else if (c->type == STO_MUT_DEL_COLUMN)
        c->body += f_len(c->qualifier.len, false) +
                   f_len(f_varint(sx(c->ts_start)) + f_varint(sx(c->ts_end)), true);
    c->mut = f_len(c->body, true);
    c->info_len = c->info ? f_varint(c->size) + f_varint(c->off) + f_varint(c->last) : 0;
    c->len = (c->info ? f_len(c->info_len, true) : 0) + f_len(c->mut, true);
}

/* Chunk k of mutation sm (k < mut_chunks of it) into x. */
static void mut_chunk(const node_cs_change *c, const sto_mut *sm, size_t value_bytes, size_t k,
                      cs_chunk *x) {
    memset(x, 0, sizeof *x);
    x->type = sm->type == STO_MUT_DEL_ROW ? STO_MUT_DEL_FAMILY : sm->type;
    x->family = sm->type == STO_MUT_DEL_ROW ? st_slice_cstr(c->families[k]) : sm->family;
    x->qualifier = sm->qualifier;
    x->ts = sm->ts_us;
    x->ts_start = sm->ts_start_us;
    x->ts_end = sm->ts_end_us == STO_TS_END_INF ? 0 : sm->ts_end_us;
    x->value = sm->value;
    if (sm->type == STO_MUT_SET_CELL && sm->value.len > value_bytes) {
        size_t off = k * value_bytes;
        size_t len = sm->value.len - off < value_bytes ? sm->value.len - off : value_bytes;
        x->info = true;
        x->size = (uint64_t)(int32_t)sm->value.len; /* values are at most 100 MiB */
        x->off = off;
        x->last = off + len == sm->value.len;
        x->value = st_slice_make(sm->value.data + off, len);
    }
    chunk_lengths(x);
}

static uint8_t *w_chunk(uint8_t *p, const cs_chunk *c) {
    if (c->info) {
        p = w_head(p, 1, c->info_len);
        p = w_varint(p, 1, c->size);
        p = w_varint(p, 2, c->off);
        p = w_varint(p, 3, c->last);
    }
    p = w_head(p, 2, c->mut);
    /* Mutation's oneof: set_cell = 1, delete_from_column = 2, delete_from_family = 3 */
    p = w_head(p, c->type == STO_MUT_SET_CELL ? 1 : c->type == STO_MUT_DEL_COLUMN ? 2 : 3, c->body);
    p = w_bytes(p, 1, c->family);
    if (c->type == STO_MUT_DEL_FAMILY)
        return p;
    p = w_bytes(p, 2, c->qualifier);
    if (c->type == STO_MUT_SET_CELL) {
        p = w_varint(p, 3, sx(c->ts));
        return w_bytes(p, 4, c->value);
    }
    p = w_head(p, 3, f_varint(sx(c->ts_start)) + f_varint(sx(c->ts_end)));
    p = w_varint(p, 1, sx(c->ts_start));
    return w_varint(p, 2, sx(c->ts_end));
}

/* Bytes chunk c costs in a message (the budget's measure, not its encoded size). */
static size_t chunk_cost(const cs_chunk *c) {
    return CS_CHUNK_OVERHEAD_BYTES + c->family.len +
           (c->type == STO_MUT_DEL_FAMILY ? 0 : c->qualifier.len) +
           (c->type == STO_MUT_SET_CELL ? c->value.len : 0);
}

typedef struct cs_enc {
    const node_cs_change *c;
    st_buf *msg;
    node_cs_emit_fn emit;
    void *arg;
} cs_enc;

/* A DataChange's fields before done: type, the record's metadata (its first message), chunks. */
static size_t dc_body_len(const node_cs_change *c, const cs_chunk *chunks, size_t n, bool first) {
    size_t len = 2; /* type */
    if (first) {
        len += c->gc || !c->source_cluster_id ? 0 : f_len(strlen(c->source_cluster_id), false);
        len += f_len(c->row->row.len, false) +
               f_len(ts_of((int64_t)c->row->commit_ts_us).len, true) +
               f_varint(sx((int32_t)c->row->origin));
    }
    for (size_t i = 0; i < n; i++)
        len += f_len(chunks[i].len, true);
    return len;
}

static uint8_t *w_dc_body(uint8_t *p, const node_cs_change *c, const cs_chunk *chunks, size_t n,
                          bool first) {
    p = w_varint(
        p, DC_TYPE,
        !first ? GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION
        : c->gc
            ? GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION
            : GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER);
    if (first) {
        if (!c->gc && c->source_cluster_id)
            p = w_bytes(p, DC_SOURCE, st_slice_cstr(c->source_cluster_id));
        p = w_bytes(p, DC_ROW, c->row->row);
        p = w_ts(p, DC_COMMIT, ts_of((int64_t)c->row->commit_ts_us));
        p = w_varint(p, DC_TIEBREAKER, sx((int32_t)c->row->origin));
    }
    for (size_t i = 0; i < n; i++)
        p = w_chunk(w_head(p, DC_CHUNKS, chunks[i].len), &chunks[i]);
    return p;
}

/* The record's last message ends with done, the token and the watermark. */
static size_t dc_tail_len(size_t token_len, cs_ts watermark) {
    return 2 + f_len(token_len, false) + f_len(watermark.len, true);
}

static uint8_t *w_dc_tail(uint8_t *p, st_slice token, cs_ts watermark) {
    p = w_varint(p, DC_DONE, 1);
    p = w_bytes(p, DC_TOKEN, token);
    return w_ts(p, DC_WATERMARK, watermark);
}

/* Makes msg RPC_SEND_HEADROOM zero bytes and the ReadChangeStreamResponse's data_change head
 * for a DataChange of dc bytes, with room for them; where they go. */
static uint8_t *msg_start(st_buf *msg, size_t dc, size_t *total) {
    *total = RPC_SEND_HEADROOM + f_len(dc, true);
    st_buf_reset(msg);
    if (st_buf_reserve(msg, *total) != ST_OK)
        return NULL;
    memset(msg->data, 0, RPC_SEND_HEADROOM);
    return w_head(msg->data + RPC_SEND_HEADROOM, RESP_DATA_CHANGE, dc);
}

/* Sends chunks[0..n) as one DataChange message: the record's first and/or last. */
static st_code emit_msg(cs_enc *e, const cs_chunk *chunks, size_t n, bool first, bool last) {
    const node_cs_change *c = e->c;
    st_slice token = c->token ? st_slice_cstr(c->token) : st_slice_make(NULL, 0);
    cs_ts wm = ts_of(c->watermark_us);
    size_t dc = dc_body_len(c, chunks, n, first) + (last ? dc_tail_len(token.len, wm) : 0);
    size_t total;
    uint8_t *p = msg_start(e->msg, dc, &total);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    p = w_dc_body(p, c, chunks, n, first);
    if (last)
        p = w_dc_tail(p, token, wm);
    ST_ASSERT((size_t)(p - e->msg->data) == total);
    e->msg->len = total;
    return e->emit(e->msg, e->arg);
}

/* The record's chunk at pos, moving pos past mutations that have none (a DeleteFromRow of a
 * table without families); false at the record's end. */
static bool chunk_at(const node_cs_change *c, size_t value_bytes, node_cs_pos *pos, cs_chunk *x) {
    const sto_row_mut *row = c->row;
    while (pos->mut < row->n_muts &&
           pos->sub >= mut_chunks(&row->muts[pos->mut], value_bytes, c->n_families)) {
        pos->mut++;
        pos->sub = 0;
    }
    if (pos->mut >= row->n_muts)
        return false;
    mut_chunk(c, &row->muts[pos->mut], value_bytes, pos->sub, x);
    return true;
}

static void pos_step(node_cs_pos *pos) {
    pos->chunk++;
    pos->sub++;
}

st_code node_cs_encode_change(const node_cs_change *c, size_t value_bytes, st_arena *arena,
                              st_buf *msg, node_cs_emit_fn emit, void *arg, node_cs_pos *pos) {
    /* Only the message being cut is held as chunks, built from pos: a record resumed in many
     * turns (a row mutation of millions of mods) costs each turn what it sends, not the whole
     * record again, and the scratch is bounded by one message's chunks. Messages are cut
     * greedily from each message's first chunk, so a record resumed at pos (the first chunk of
     * a message) is cut as it would have been in one go. */
    cs_enc e = {c, msg, emit, arg};
    cs_chunk one[4], *win = one, x;
    size_t cap = 4, n = 0, cost = 0;
    node_cs_pos from = *pos, at = *pos; /* the message's first chunk; the next chunk */
    st_code rc;
    while (chunk_at(c, value_bytes, &at, &x)) {
        if (n == 0)
            from = at; /* past mutations without chunks */
        size_t cc = chunk_cost(&x);
        if (n > 0 && cost + cc > value_bytes + CS_CHUNK_OVERHEAD_BYTES) {
            rc = emit_msg(&e, win, n, from.chunk == 0, false);
            if (rc != ST_OK) {
                *pos = rc == NODE_CS_PAUSE ? at : from;
                return rc;
            }
            from = at;
            n = cost = 0;
        }
        if (n == cap) { /* at most one message's chunks: value_bytes / 32 + 1 */
            cs_chunk *w = st_arena_alloc(arena, 2 * cap * sizeof *w);
            if (!w) {
                *pos = from;
                return ST_RESOURCE_EXHAUSTED;
            }
            memcpy(w, win, n * sizeof *w);
            win = w;
            cap *= 2;
        }
        win[n++] = x;
        cost += cc;
        pos_step(&at);
    }
    if (n == 0) { /* no mutation, or the record was sent */
        *pos = at;
        return ST_OK;
    }
    rc = emit_msg(&e, win, n, from.chunk == 0, true);
    *pos = rc == ST_OK || rc == NODE_CS_PAUSE ? at : from;
    return rc == NODE_CS_PAUSE ? ST_OK : rc;
}

/* Whether chunks[0..n) go out as one message: node_cs_encode_change cuts a message before a
 * chunk that would take it past the budget, never before the first. */
static bool one_message(const cs_chunk *chunks, size_t n, size_t value_bytes) {
    size_t cost = 0;
    for (size_t i = 0; i < n; i++) {
        cost += chunk_cost(&chunks[i]);
        if (i > 0 && cost > value_bytes + CS_CHUNK_OVERHEAD_BYTES)
            return false;
    }
    return true;
}

st_code node_cs_encode_body(const node_cs_change *c, size_t value_bytes, st_buf *out) {
    const sto_row_mut *row = c->row;
    cs_chunk chunks[NODE_CS_BODY_CHUNKS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        const sto_mut *m = &row->muts[i];
        if (m->type == STO_MUT_DEL_ROW || mut_chunks(m, value_bytes, 0) != 1 ||
            n == NODE_CS_BODY_CHUNKS_MAX)
            return ST_NOT_FOUND;
        mut_chunk(c, m, value_bytes, 0, &chunks[n++]);
    }
    if (n == 0 || !one_message(chunks, n, value_bytes))
        return ST_NOT_FOUND;
    size_t len = dc_body_len(c, chunks, n, true);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    uint8_t *p = w_dc_body(out->data + out->len, c, chunks, n, true);
    ST_ASSERT((size_t)(p - out->data) == out->len + len);
    out->len += len;
    return ST_OK;
}

st_code node_cs_encode_prebuilt(st_buf *msg, st_slice body, const char *token,
                                int64_t watermark_us) {
    st_slice tok = st_slice_cstr(token);
    size_t total;
    cs_ts wm = ts_of(watermark_us);
    uint8_t *p = msg_start(msg, body.len + dc_tail_len(tok.len, wm), &total);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    memcpy(p, body.data, body.len);
    p = w_dc_tail(p + body.len, tok, wm);
    ST_ASSERT((size_t)(p - msg->data) == total);
    msg->len = total;
    return ST_OK;
}

/* ---- Heartbeat, CloseStream ---- */

st_code node_cs_encode_heartbeat(st_buf *msg, st_slice start, st_slice end, const char *token,
                                 int64_t watermark_us) {
    Google__Bigtable__V2__StreamPartition p;
    Google__Bigtable__V2__RowRange rr;
    Google__Bigtable__V2__StreamContinuationToken t =
        GOOGLE__BIGTABLE__V2__STREAM_CONTINUATION_TOKEN__INIT;
    Google__Protobuf__Timestamp wm;
    Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat hb =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__HEARTBEAT__INIT;
    cs_resp resp = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__INIT;
    btu_cs_partition_set(&p, &rr, start, end);
    btu_cs_time_set(&wm, watermark_us);
    t.partition = &p;
    t.token = (char *)(uintptr_t)token;
    hb.continuation_token = &t;
    hb.estimated_low_watermark = &wm;
    resp.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT;
    resp.heartbeat = &hb;
    return pack(msg, &resp);
}

/* What one piece of a CloseStream takes. */
typedef struct cs_close_piece {
    Google__Bigtable__V2__StreamPartition newp, tokp;
    Google__Bigtable__V2__RowRange newr, tokr;
    Google__Bigtable__V2__StreamContinuationToken tok;
} cs_close_piece;

st_code node_cs_encode_close(st_buf *msg, st_code code, const char *message,
                             const node_cs_piece *pieces, size_t n, const char *token) {
    Google__Rpc__Status status = GOOGLE__RPC__STATUS__INIT;
    Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream cs =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__CLOSE_STREAM__INIT;
    cs_resp resp = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__INIT;
    st_arena a;
    st_arena_init(&a, 4096);
    cs_close_piece *v = n ? st_arena_alloc(&a, n * sizeof *v) : NULL;
    Google__Bigtable__V2__StreamPartition **parts =
        n ? st_arena_alloc(&a, n * sizeof *parts) : NULL;
    Google__Bigtable__V2__StreamContinuationToken **toks =
        n ? st_arena_alloc(&a, n * sizeof *toks) : NULL;
    st_code rc = ST_RESOURCE_EXHAUSTED;
    if (n == 0 || (v && parts && toks)) {
        for (size_t i = 0; i < n; i++) {
            btu_cs_partition_set(&v[i].newp, &v[i].newr, pieces[i].new_start, pieces[i].new_end);
            btu_cs_partition_set(&v[i].tokp, &v[i].tokr, pieces[i].tok_start, pieces[i].tok_end);
            google__bigtable__v2__stream_continuation_token__init(&v[i].tok);
            v[i].tok.partition = &v[i].tokp;
            v[i].tok.token = (char *)(uintptr_t)token;
            parts[i] = &v[i].newp;
            toks[i] = &v[i].tok;
        }
        status.code = (int32_t)code;
        status.message = (char *)(uintptr_t)(message ? message : "");
        cs.status = &status;
        cs.new_partitions = parts;
        cs.n_new_partitions = n;
        cs.continuation_tokens = toks;
        cs.n_continuation_tokens = n;
        resp.stream_record_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM;
        resp.close_stream = &cs;
        rc = pack(msg, &resp);
    }
    st_arena_deinit(&a);
    return rc;
}
