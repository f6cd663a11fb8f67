/* changes_msg.c — ReadChangeStreamResponse encoders (changes_msg.h). Pure: protobuf-c structs
 * built in an arena, packed behind RPC_SEND_HEADROOM free bytes. */
#include "changes_msg.h"

#include <string.h>

#include "strata/cstoken.h"
#include "strata/rpc.h"

typedef Google__Bigtable__V2__ReadChangeStreamResponse cs_resp;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__DataChange cs_data;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk cs_chunk;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk__ChunkInfo cs_chunk_info;
typedef Google__Bigtable__V2__Mutation pb_mut;

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

/* ---- DataChange ---- */

static char *cstr(st_arena *a, st_slice s) {
    char *p = st_arena_alloc(a, s.len + 1);
    if (p) {
        if (s.len)
            memcpy(p, s.data, s.len);
        p[s.len] = 0;
    }
    return p;
}

static ProtobufCBinaryData bin(st_slice s) {
    ProtobufCBinaryData b = {s.len, (uint8_t *)(uintptr_t)s.data};
    return b;
}

/* Chunks one mutation takes. */
static size_t mut_chunks(const sto_mut *m, size_t value_bytes, size_t n_families) {
    if (m->type == STO_MUT_DEL_ROW)
        return n_families;
    if (m->type == STO_MUT_SET_CELL && m->value.len > value_bytes)
        return (m->value.len + value_bytes - 1) / value_bytes;
    return 1;
}

/* A chunk holding a fresh Mutation; NULL when memory runs out. */
static cs_chunk *chunk_new(st_arena *a, pb_mut **out) {
    cs_chunk *c = st_arena_alloc(a, sizeof *c);
    pb_mut *m = st_arena_alloc(a, sizeof *m);
    if (!c || !m)
        return NULL;
    google__bigtable__v2__read_change_stream_response__mutation_chunk__init(c);
    google__bigtable__v2__mutation__init(m);
    c->mutation = m;
    *out = m;
    return c;
}

static cs_chunk *del_family(st_arena *a, const char *family) {
    pb_mut *m;
    cs_chunk *c = chunk_new(a, &m);
    Google__Bigtable__V2__Mutation__DeleteFromFamily *d = st_arena_alloc(a, sizeof *d);
    if (!c || !d)
        return NULL;
    google__bigtable__v2__mutation__delete_from_family__init(d);
    d->family_name = (char *)(uintptr_t)family;
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY;
    m->delete_from_family = d;
    return c;
}

static cs_chunk *del_column(st_arena *a, const sto_mut *sm, char *family) {
    pb_mut *m;
    cs_chunk *c = chunk_new(a, &m);
    Google__Bigtable__V2__Mutation__DeleteFromColumn *d = st_arena_alloc(a, sizeof *d);
    Google__Bigtable__V2__TimestampRange *tr = st_arena_alloc(a, sizeof *tr);
    if (!c || !d || !tr)
        return NULL;
    google__bigtable__v2__mutation__delete_from_column__init(d);
    google__bigtable__v2__timestamp_range__init(tr);
    d->family_name = family;
    d->column_qualifier = bin(sm->qualifier);
    tr->start_timestamp_micros = sm->ts_start_us;
    tr->end_timestamp_micros = sm->ts_end_us == STO_TS_END_INF ? 0 : sm->ts_end_us; /* 0: none */
    d->time_range = tr;
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN;
    m->delete_from_column = d;
    return c;
}

/* Piece k of a SetCell (the whole value when it fits one chunk). */
static cs_chunk *set_cell(st_arena *a, const sto_mut *sm, char *family, size_t k,
                          size_t value_bytes) {
    pb_mut *m;
    cs_chunk *c = chunk_new(a, &m);
    Google__Bigtable__V2__Mutation__SetCell *s = st_arena_alloc(a, sizeof *s);
    if (!c || !s)
        return NULL;
    google__bigtable__v2__mutation__set_cell__init(s);
    s->family_name = family;
    s->column_qualifier = bin(sm->qualifier);
    s->timestamp_micros = sm->ts_us;
    s->value = bin(sm->value);
    if (sm->value.len > value_bytes) {
        cs_chunk_info *ci = st_arena_alloc(a, sizeof *ci);
        if (!ci)
            return NULL;
        google__bigtable__v2__read_change_stream_response__mutation_chunk__chunk_info__init(ci);
        size_t off = k * value_bytes;
        size_t len = sm->value.len - off < value_bytes ? sm->value.len - off : value_bytes;
        ci->chunked_value_size = (int32_t)sm->value.len; /* values are at most 100 MiB */
        ci->chunked_value_offset = (int32_t)off;
        ci->last_chunk = off + len == sm->value.len;
        s->value = bin(st_slice_make(sm->value.data + off, len));
        c->chunk_info = ci;
    }
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = s;
    return c;
}

/* The chunks of mutation sm into out (mut_chunks of them). */
static st_code mut_to_chunks(const node_cs_change *c, const sto_mut *sm, size_t value_bytes,
                             st_arena *a, cs_chunk **out) {
    if (sm->type == STO_MUT_DEL_ROW) {
        for (size_t f = 0; f < c->n_families; f++)
            if (!(out[f] = del_family(a, c->families[f])))
                return ST_RESOURCE_EXHAUSTED;
        return ST_OK;
    }
    char *family = cstr(a, sm->family);
    if (!family)
        return ST_RESOURCE_EXHAUSTED;
    if (sm->type == STO_MUT_DEL_FAMILY)
        out[0] = del_family(a, family);
    else if (sm->type == STO_MUT_DEL_COLUMN)
        out[0] = del_column(a, sm, family);
    else
        for (size_t k = 0; k < mut_chunks(sm, value_bytes, 0); k++)
            if (!(out[k] = set_cell(a, sm, family, k, value_bytes)))
                return ST_RESOURCE_EXHAUSTED;
    return out[0] ? ST_OK : ST_RESOURCE_EXHAUSTED;
}

/* Bytes chunk c costs in a message. */
static size_t chunk_cost(const cs_chunk *c) {
    const pb_mut *m = c->mutation;
    size_t v = CS_CHUNK_OVERHEAD_BYTES;
    if (m->mutation_case == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL)
        v += strlen(m->set_cell->family_name) + m->set_cell->column_qualifier.len +
             m->set_cell->value.len;
    else if (m->mutation_case == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN)
        v += strlen(m->delete_from_column->family_name) +
             m->delete_from_column->column_qualifier.len;
    else
        v += strlen(m->delete_from_family->family_name);
    return v;
}

typedef struct cs_enc {
    const node_cs_change *c;
    st_buf *msg;
    node_cs_emit_fn emit;
    void *arg;
    Google__Protobuf__Timestamp commit, wm;
} cs_enc;

/* Sends chunks[0..n) as one DataChange message: the record's first and/or last. */
static st_code emit_msg(cs_enc *e, cs_chunk **chunks, size_t n, bool first, bool last) {
    cs_data d = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__INIT;
    cs_resp resp = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__INIT;
    resp.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    resp.data_change = &d;
    d.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION;
    if (first) {
        const sto_row_mut *row = e->c->row;
        d.type =
            e->c->gc
                ? GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION
                : GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
        if (!e->c->gc)
            d.source_cluster_id = (char *)(uintptr_t)e->c->source_cluster_id;
        d.row_key = bin(row->row);
        d.commit_timestamp = &e->commit;
        d.tiebreaker = (int32_t)row->origin;
    }
    d.chunks = chunks;
    d.n_chunks = n;
    if (last) {
        d.done = true;
        d.token = (char *)(uintptr_t)e->c->token;
        d.estimated_low_watermark = &e->wm;
    }
    if (pack(e->msg, &resp) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return e->emit(e->msg, e->arg);
}

st_code node_cs_encode_change(const node_cs_change *c, size_t value_bytes, st_arena *arena,
                              st_buf *msg, node_cs_emit_fn emit, void *arg) {
    const sto_row_mut *row = c->row;
    size_t total = 0;
    for (size_t i = 0; i < row->n_muts; i++)
        total += mut_chunks(&row->muts[i], value_bytes, c->n_families);
    if (total == 0)
        return ST_OK;
    cs_chunk **chunks = st_arena_alloc(arena, total * sizeof *chunks);
    if (!chunks)
        return ST_RESOURCE_EXHAUSTED;
    size_t k = 0;
    for (size_t i = 0; i < row->n_muts; i++) {
        if (mut_to_chunks(c, &row->muts[i], value_bytes, arena, chunks + k) != ST_OK)
            return ST_RESOURCE_EXHAUSTED;
        k += mut_chunks(&row->muts[i], value_bytes, c->n_families);
    }
    cs_enc e = {
        c, msg, emit, arg, GOOGLE__PROTOBUF__TIMESTAMP__INIT, GOOGLE__PROTOBUF__TIMESTAMP__INIT};
    btu_cs_time_set(&e.commit, (int64_t)row->commit_ts_us);
    btu_cs_time_set(&e.wm, c->watermark_us);
    size_t from = 0, cost = 0;
    for (size_t i = 0; i < total; i++) {
        size_t cc = chunk_cost(chunks[i]);
        if (i > from && cost + cc > value_bytes + CS_CHUNK_OVERHEAD_BYTES) {
            st_code rc = emit_msg(&e, chunks + from, i - from, from == 0, false);
            if (rc != ST_OK)
                return rc;
            from = i;
            cost = 0;
        }
        cost += cc;
    }
    return emit_msg(&e, chunks + from, total - from, from == 0, true);
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
