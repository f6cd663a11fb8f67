/*
 * Proves the node's read side of change streams (docs/changestreams.md, Reading) on a real
 * standalone strata-node (--cluster-id east-cs), with raw gRPC (no client tool reads change
 * streams):
 *   - GenerateInitialChangeStreamPartitions: NOT_FOUND for an unknown table, FAILED_PRECONDITION
 *     with streams off, one partition per tablet;
 *   - ReadChangeStream from a start_time returns every write after it (MutateRow, a MutateRows
 *     batch, DeleteFromColumn, DeleteFromFamily, DeleteFromRow expanded to DeleteFromFamily, a
 *     2.5 MiB value in chunks), each row's records in commit order, through the ring (live) and,
 *     after a restart, through the catch-up scan of storage (scan tokens), every message shaped as
 *     the official Java client requires; CloseStream OK at end_time;
 *   - resuming from a record's token (live and scan tokens; live from every record's, those
 *     inside a write of several rows too) misses nothing;
 *   - heartbeats carry a parseable token and a watermark; a live stream receives a write made
 *     while it waits; a client that cancels is let go;
 *   - a tablet split while streaming ends the stream with CloseStream OUT_OF_RANGE naming the two
 *     new partitions with a token each, which then read; a stale partition is answered the same
 *     way at once;
 *   - start_time in the future or before streams were on, malformed tokens, tokens of another
 *     partition and a missing partition are INVALID_ARGUMENT; streams off FAILED_PRECONDITION;
 *   - the node then stops cleanly (exit 0: no leak under ASan).
 *
 *   changes_node_test PATH/TO/strata-node
 */
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "btclient.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/cstoken.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define NODE "/strata.internal.v1.Node/"
#define INST "projects/p/instances/i"
#define CLUSTER_ID "east-cs"
#define CALL_TIMEOUT_MS 60000
#define BIG_VALUE_BYTES ((size_t)5 << 19) /* 2.5 MiB: three chunks */
#define RECS_MAX 64
#define PARTS_MAX 8
#define WAIT_MS_MAX 60000 /* hang guard while polling, not a timing check */

typedef Google__Bigtable__V2__ReadChangeStreamResponse cs_resp;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__DataChange cs_data;

static int g_failures;
static const char *g_bin;
static char g_dir[BT_PATH_MAX - 16], g_data[BT_PATH_MAX];
static bt_proc g_node;
static bt_client g_c;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL line %d: ", __LINE__);                                                    \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

static st_slice S(const char *s) {
    return st_slice_cstr(s);
}

static int64_t now_us(void) {
    return st_wall_us();
}

static void sleep_ms(int ms) {
    usleep((useconds_t)ms * 1000);
}

/* Waits until the wall clock passes t. */
static void wait_past(int64_t t) {
    while (now_us() <= t)
        sleep_ms(1);
}

/* ---- the node ---- */

static void node_start(void) {
    char log[BT_PATH_MAX + 8];
    snprintf(log, sizeof log, "%s.log", g_data);
    char *argv[] = {(char *)g_bin,  "--data",           g_data, "--listen", "127.0.0.1:0",
                    "--cluster-id", (char *)CLUSTER_ID, NULL};
    st_err err = {0};
    if (bt_proc_start(&g_node, argv, log, &err) != ST_OK) {
        printf("FAIL: strata-node did not start: %s\n", err.msg);
        exit(1);
    }
    bt_client_init(&g_c, g_node.addr);
}

/* SIGTERM; the node must exit 0 (under ASan: no leak). */
static void node_stop(void) {
    int status = 0;
    bt_proc_stop(&g_node, SIGTERM, &status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "strata-node did not exit cleanly (status 0x%x; see %s.log)", status, g_data);
}

/* ---- plain calls ---- */

static st_code unary(const char *path, const ProtobufCMessage *req, st_buf *resp, st_err *st) {
    return bt_call_pb(g_c.addr, path, req, CALL_TIMEOUT_MS, resp, st);
}

static void expect_code(const char *what, st_code got, const st_err *st, st_code want,
                        const char *needle) {
    bool ok = got == want && (!needle || strstr(st->msg, needle));
    printf("%-58s %-20s %s\n", what, st_code_name(got), ok ? "ok" : "WRONG");
    CHECK(ok, "%s: got %s \"%s\", want %s%s%s", what, st_code_name(got), st->msg,
          st_code_name(want), needle ? " with " : "", needle ? needle : "");
}

static void table_name(const char *id, char *out) {
    snprintf(out, BT_NAME_MAX, INST "/tables/%s", id);
}

/* UpdateTable: change streams on with a one-day retention. */
static st_code streams_on(const char *id, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name);
    Google__Protobuf__Duration ret = GOOGLE__PROTOBUF__DURATION__INIT;
    ret.seconds = 24 * 3600;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cfg =
        GOOGLE__BIGTABLE__ADMIN__V2__CHANGE_STREAM_CONFIG__INIT;
    cfg.retention_period = &ret;
    Google__Bigtable__Admin__V2__Table t = GOOGLE__BIGTABLE__ADMIN__V2__TABLE__INIT;
    t.name = name;
    t.change_stream_config = &cfg;
    char *paths[] = {"change_stream_config"};
    Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
    mask.paths = paths;
    mask.n_paths = 1;
    Google__Bigtable__Admin__V2__UpdateTableRequest req =
        GOOGLE__BIGTABLE__ADMIN__V2__UPDATE_TABLE_REQUEST__INIT;
    req.table = &t;
    req.update_mask = &mask;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(TA "UpdateTable", &req.base, &resp, st);
    st_buf_free(&resp);
    return rc;
}

typedef struct part {
    st_buf start, end;
} part;

static void part_free(part *p) {
    st_buf_free(&p->start);
    st_buf_free(&p->end);
}

/* The tablet ids of table id (ListTablets). */
static size_t list_tablets(const char *id, uint64_t *ids, size_t cap) {
    char name[BT_NAME_MAX];
    table_name(id, name);
    Strata__Internal__V1__ListTabletsRequest req = STRATA__INTERNAL__V1__LIST_TABLETS_REQUEST__INIT;
    req.table_name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    size_t n = 0;
    if (unary(NODE "ListTablets", &req.base, &resp, &st) == ST_OK) {
        Strata__Internal__V1__ListTabletsResponse *r =
            strata__internal__v1__list_tablets_response__unpack(NULL, resp.len, resp.data);
        for (size_t i = 0; r && i < r->n_tablets && n < cap; i++)
            ids[n++] = r->tablets[i]->id;
        if (r)
            strata__internal__v1__list_tablets_response__free_unpacked(r, NULL);
    }
    CHECK(n > 0, "ListTablets %s: %s", id, st.msg);
    st_buf_free(&resp);
    return n;
}

static st_code split_tablet(uint64_t id, const char *key, st_err *st) {
    Strata__Internal__V1__SplitTabletRequest req = STRATA__INTERNAL__V1__SPLIT_TABLET_REQUEST__INIT;
    req.id = id;
    req.split_key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(NODE "SplitTablet", &req.base, &resp, st);
    st_buf_free(&resp);
    return rc;
}

/* ---- reading a stream ---- */

#define TOKEN_TEXT_MAX 256 /* tokens of this test: short keys */

typedef struct rec {
    int type;
    char source[64];
    st_buf row;
    int64_t commit_us;
    st_buf text; /* the mutations, one canonical line each */
    char token[TOKEN_TEXT_MAX];
    int64_t wm_us;
} rec;

typedef struct stream {
    st_buf req;
    int stop_after_recs;       /* cancel once this many records came (0: never) */
    int stop_after_heartbeats; /* cancel once this many heartbeats came (0: never) */
    const char *stop_on_row;   /* cancel once a record of this row came (NULL: never) */
    int seen_stop_row;         /* atomic */
    int stop;                  /* atomic: cancel at the next message */
    /* what came */
    rec recs[RECS_MAX];
    int n_recs;     /* atomic */
    int heartbeats; /* atomic */
    int finished;   /* atomic */
    char hb_token[TOKEN_TEXT_MAX];
    int64_t hb_wm;
    bool closed;
    int close_code;
    part new_parts[PARTS_MAX], tok_parts[PARTS_MAX];
    char tok_text[PARTS_MAX][TOKEN_TEXT_MAX];
    size_t n_new, n_tok;
    st_code code;
    char msg[512];
    int violations;
    char why[256];
    /* the record being put together */
    bool in_rec, in_value;
    rec cur;
    size_t value_total;
    st_buf value;
    char vfam[64], vqual[64];
    int64_t vts;
} stream;

static void violation(stream *s, const char *why) {
    if (s->violations++ == 0)
        snprintf(s->why, sizeof s->why, "%s", why);
}

static void esc(st_buf *out, ProtobufCBinaryData b) {
    bt_escape(out, st_slice_make(b.data, b.len));
}

static void set_cell_line(stream *s, const char *fam, ProtobufCBinaryData q, int64_t ts,
                          st_slice v) {
    char line[160];
    st_buf_append(&s->cur.text, "S ", 2);
    st_buf_append(&s->cur.text, fam, strlen(fam));
    st_buf_append(&s->cur.text, ":", 1);
    esc(&s->cur.text, q);
    snprintf(line, sizeof line, "@%" PRId64 " len=%zu h=%016" PRIx64 "\n", ts, v.len,
             st_hash64(v.data, v.len, 7));
    st_buf_append(&s->cur.text, line, strlen(line));
}

/* One chunk of the record in progress, checked as the Java client checks it. */
static void on_chunk(stream *s,
                     const Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk *c) {
    const Google__Bigtable__V2__Mutation *m = c->mutation;
    if (!m) {
        violation(s, "chunk without a mutation");
        return;
    }
    char line[200];
    if (s->in_value || c->chunk_info) {
        const Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk__ChunkInfo *ci =
            c->chunk_info;
        if (!ci || m->mutation_case != GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL) {
            violation(s, "a chunked value is interrupted");
            return;
        }
        if ((size_t)ci->chunked_value_offset != s->value.len) {
            violation(s, "chunk offset does not follow the previous chunk");
            return;
        }
        if (!s->in_value) {
            s->in_value = true;
            s->value_total = (size_t)ci->chunked_value_size;
            snprintf(s->vfam, sizeof s->vfam, "%s", m->set_cell->family_name);
            snprintf(s->vqual, sizeof s->vqual, "%.*s", (int)m->set_cell->column_qualifier.len,
                     m->set_cell->column_qualifier.data);
            s->vts = m->set_cell->timestamp_micros;
        }
        st_buf_append(&s->value, m->set_cell->value.data, m->set_cell->value.len);
        if (ci->last_chunk) {
            if (s->value.len != s->value_total)
                violation(s, "chunked value size differs from chunked_value_size");
            ProtobufCBinaryData q = {strlen(s->vqual), (uint8_t *)s->vqual};
            set_cell_line(s, s->vfam, q, s->vts, st_buf_slice(&s->value));
            s->in_value = false;
            st_buf_reset(&s->value);
        }
        return;
    }
    switch (m->mutation_case) {
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL:
        set_cell_line(s, m->set_cell->family_name, m->set_cell->column_qualifier,
                      m->set_cell->timestamp_micros,
                      st_slice_make(m->set_cell->value.data, m->set_cell->value.len));
        break;
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN: {
        const Google__Bigtable__V2__Mutation__DeleteFromColumn *d = m->delete_from_column;
        st_buf_append(&s->cur.text, "C ", 2);
        st_buf_append(&s->cur.text, d->family_name, strlen(d->family_name));
        st_buf_append(&s->cur.text, ":", 1);
        esc(&s->cur.text, d->column_qualifier);
        snprintf(line, sizeof line, " [%" PRId64 ",%" PRId64 ")\n",
                 d->time_range ? d->time_range->start_timestamp_micros : 0,
                 d->time_range ? d->time_range->end_timestamp_micros : 0);
        st_buf_append(&s->cur.text, line, strlen(line));
        break;
    }
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY:
        snprintf(line, sizeof line, "F %s\n", m->delete_from_family->family_name);
        st_buf_append(&s->cur.text, line, strlen(line));
        break;
    default:
        violation(s, "a mutation other than SetCell, DeleteFromColumn, DeleteFromFamily");
    }
}

static int64_t ts_us(const Google__Protobuf__Timestamp *t) {
    return t ? t->seconds * 1000000 + t->nanos / 1000 : -1;
}

/* The first message of a record, or a continuation. */
static void data_head(stream *s, const cs_data *d) {
    if (s->in_rec) {
        if (d->type !=
                GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION ||
            d->row_key.len || d->commit_timestamp || d->source_cluster_id[0] || d->tiebreaker)
            violation(s, "a continuation message must carry type CONTINUATION and chunks only");
        return;
    }
    bool user =
        d->type == GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    bool gc =
        d->type ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION;
    if (!user && !gc)
        violation(s, "a record's first message must be USER or GARBAGE_COLLECTION");
    if ((user && !d->source_cluster_id[0]) || (gc && d->source_cluster_id[0]))
        violation(s, "USER records need a source cluster, GC records none");
    if (!d->row_key.len || !d->commit_timestamp)
        violation(s, "a record's first message needs row_key and commit_timestamp");
    s->in_rec = true;
    s->cur.type = d->type;
    snprintf(s->cur.source, sizeof s->cur.source, "%s", d->source_cluster_id);
    st_buf_reset(&s->cur.row);
    st_buf_append(&s->cur.row, d->row_key.data, d->row_key.len);
    s->cur.commit_us = ts_us(d->commit_timestamp);
    st_buf_reset(&s->cur.text);
}

static void on_data(stream *s, const cs_data *d) {
    data_head(s, d);
    for (size_t i = 0; i < d->n_chunks; i++)
        on_chunk(s, d->chunks[i]);
    if (!d->done) {
        if (d->token[0] || d->estimated_low_watermark)
            violation(s, "only a record's last message carries token and watermark");
        return;
    }
    if (!d->token[0] || !d->estimated_low_watermark)
        violation(s, "a record's last message needs token and watermark");
    if (s->in_value)
        violation(s, "a record ended inside a chunked value");
    s->in_rec = false;
    int n = __atomic_load_n(&s->n_recs, __ATOMIC_ACQUIRE);
    if (n >= RECS_MAX) {
        violation(s, "more records than the test wrote");
        return;
    }
    rec *r = &s->recs[n];
    r->type = s->cur.type;
    snprintf(r->source, sizeof r->source, "%s", s->cur.source);
    st_buf_init(&r->row);
    st_buf_init(&r->text);
    st_buf_append(&r->row, s->cur.row.data, s->cur.row.len);
    st_buf_append(&r->text, s->cur.text.data, s->cur.text.len);
    r->commit_us = s->cur.commit_us;
    snprintf(r->token, sizeof r->token, "%s", d->token);
    r->wm_us = ts_us(d->estimated_low_watermark);
    __atomic_store_n(&s->n_recs, n + 1, __ATOMIC_RELEASE);
    if (s->stop_on_row && st_slice_eq(st_buf_slice(&r->row), st_slice_cstr(s->stop_on_row)))
        __atomic_store_n(&s->seen_stop_row, 1, __ATOMIC_RELEASE);
}

static void part_from_pb(part *p, const Google__Bigtable__V2__StreamPartition *pb) {
    st_buf_init(&p->start);
    st_buf_init(&p->end);
    const Google__Bigtable__V2__RowRange *r = pb ? pb->row_range : NULL;
    if (r && r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED)
        st_buf_append(&p->start, r->start_key_closed.data, r->start_key_closed.len);
    if (r && r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN)
        st_buf_append(&p->end, r->end_key_open.data, r->end_key_open.len);
}

static void on_close(stream *s,
                     const Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream *c) {
    s->closed = true;
    s->close_code = c->status ? c->status->code : 0;
    for (size_t i = 0; i < c->n_new_partitions && s->n_new < PARTS_MAX; i++)
        part_from_pb(&s->new_parts[s->n_new++], c->new_partitions[i]);
    for (size_t i = 0; i < c->n_continuation_tokens && s->n_tok < PARTS_MAX; i++) {
        part_from_pb(&s->tok_parts[s->n_tok], c->continuation_tokens[i]->partition);
        snprintf(s->tok_text[s->n_tok++], TOKEN_TEXT_MAX, "%s", c->continuation_tokens[i]->token);
    }
}

static void on_msg(rpc_ccall *call, st_slice msg, void *arg) {
    stream *s = arg;
    cs_resp *r = google__bigtable__v2__read_change_stream_response__unpack(NULL, msg.len, msg.data);
    if (!r) {
        violation(s, "a message that does not unpack");
        return;
    }
    if (s->closed)
        violation(s, "a message after CloseStream");
    if (r->stream_record_case !=
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE &&
        s->in_rec)
        violation(s, "a heartbeat or CloseStream inside a record");
    if (r->stream_record_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE)
        on_data(s, r->data_change);
    else if (r->stream_record_case ==
             GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT) {
        const Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat *h = r->heartbeat;
        if (!h->continuation_token || !h->estimated_low_watermark)
            violation(s, "a heartbeat needs a token and a watermark");
        else
            snprintf(s->hb_token, sizeof s->hb_token, "%s", h->continuation_token->token);
        s->hb_wm = ts_us(h->estimated_low_watermark);
        __atomic_add_fetch(&s->heartbeats, 1, __ATOMIC_ACQ_REL);
    } else if (r->stream_record_case ==
               GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM)
        on_close(s, r->close_stream);
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
    if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE) || s->seen_stop_row ||
        (s->stop_after_recs && s->n_recs >= s->stop_after_recs) ||
        (s->stop_after_heartbeats && s->heartbeats >= s->stop_after_heartbeats))
        rpc_ccall_cancel(call);
}

static void on_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    stream *s = arg;
    s->code = code;
    snprintf(s->msg, sizeof s->msg, "%s", message ? message : "");
    __atomic_store_n(&s->finished, 1, __ATOMIC_RELEASE);
}

/* Runs the stream's request to its end (or cancel) on this thread. */
static void stream_run(stream *s) {
    char host[128];
    uint16_t port;
    st_addr_split(g_c.addr, host, sizeof host, &port);
    struct event_base *base = event_base_new();
    st_err err = {0};
    rpc_client *c = rpc_client_new(base, host, port, NULL, &err);
    rpc_ccall *call = c ? rpc_client_call(c, BT "ReadChangeStream", st_buf_slice(&s->req), NULL, 0,
                                          CALL_TIMEOUT_MS, on_msg, on_done, s)
                        : NULL;
    if (!call) {
        s->code = ST_UNAVAILABLE;
        snprintf(s->msg, sizeof s->msg, "could not start the call: %.400s", err.msg);
        __atomic_store_n(&s->finished, 1, __ATOMIC_RELEASE);
    }
    while (!__atomic_load_n(&s->finished, __ATOMIC_ACQUIRE))
        event_base_loop(base, EVLOOP_ONCE);
    if (c)
        rpc_client_free(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
}

static void *stream_thread(void *arg) {
    stream_run(arg);
    return NULL;
}

static void stream_free(stream *s) {
    for (int i = 0; i < s->n_recs; i++) {
        st_buf_free(&s->recs[i].row);
        st_buf_free(&s->recs[i].text);
    }
    for (size_t i = 0; i < s->n_new; i++)
        part_free(&s->new_parts[i]);
    for (size_t i = 0; i < s->n_tok; i++)
        part_free(&s->tok_parts[i]);
    st_buf_free(&s->req);
    st_buf_free(&s->cur.row);
    st_buf_free(&s->cur.text);
    st_buf_free(&s->value);
    free(s);
}

/* ---- requests ---- */

typedef struct token_arg {
    const part *p;
    const char *text;
} token_arg;

typedef struct req_opts {
    const char *table;
    const part *p;    /* NULL: no partition */
    int64_t start_us; /* 0: none */
    const token_arg *tokens;
    size_t n_tokens;
    int64_t end_us; /* 0: none */
    int64_t hb_ms;  /* 0: default */
} req_opts;

static void pb_part(Google__Bigtable__V2__StreamPartition *pb, Google__Bigtable__V2__RowRange *rr,
                    const part *p) {
    btu_cs_partition_set(pb, rr, st_buf_slice(&p->start), st_buf_slice(&p->end));
}

static stream *stream_new(const req_opts *o) {
    stream *s = calloc(1, sizeof *s);
    char name[BT_NAME_MAX];
    table_name(o->table, name);
    Google__Bigtable__V2__ReadChangeStreamRequest req =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__INIT;
    req.table_name = name;
    Google__Bigtable__V2__StreamPartition p, tp[PARTS_MAX];
    Google__Bigtable__V2__RowRange rr, trr[PARTS_MAX];
    if (o->p) {
        pb_part(&p, &rr, o->p);
        req.partition = &p;
    }
    Google__Protobuf__Timestamp st, et;
    if (o->start_us) {
        btu_cs_time_set(&st, o->start_us);
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
        req.start_time = &st;
    }
    Google__Bigtable__V2__StreamContinuationTokens toks =
        GOOGLE__BIGTABLE__V2__STREAM_CONTINUATION_TOKENS__INIT;
    Google__Bigtable__V2__StreamContinuationToken tok[PARTS_MAX], *tokp[PARTS_MAX];
    for (size_t i = 0; i < o->n_tokens && i < PARTS_MAX; i++) {
        google__bigtable__v2__stream_continuation_token__init(&tok[i]);
        pb_part(&tp[i], &trr[i], o->tokens[i].p);
        tok[i].partition = &tp[i];
        tok[i].token = (char *)o->tokens[i].text;
        tokp[i] = &tok[i];
    }
    if (o->n_tokens) {
        toks.tokens = tokp;
        toks.n_tokens = o->n_tokens;
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS;
        req.continuation_tokens = &toks;
    }
    if (o->end_us) {
        btu_cs_time_set(&et, o->end_us);
        req.end_time = &et;
    }
    Google__Protobuf__Duration hb = GOOGLE__PROTOBUF__DURATION__INIT;
    if (o->hb_ms) {
        hb.seconds = o->hb_ms / 1000;
        hb.nanos = (int32_t)(o->hb_ms % 1000) * 1000000;
        req.heartbeat_duration = &hb;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    st_buf_reserve(&s->req, len);
    protobuf_c_message_pack(&req.base, s->req.data);
    s->req.len = len;
    return s;
}

/* Runs a stream to its end here. */
static stream *read_stream(const req_opts *o) {
    stream *s = stream_new(o);
    stream_run(s);
    CHECK(s->violations == 0, "stream broke the message rules %d times, first: %s", s->violations,
          s->why);
    return s;
}

/* Polls until *counter reaches want or the thread's stream finished. */
static bool wait_count(stream *s, int *counter, int want) {
    for (int ms = 0; ms < WAIT_MS_MAX; ms += 2) {
        if (__atomic_load_n(counter, __ATOMIC_ACQUIRE) >= want)
            return true;
        if (__atomic_load_n(&s->finished, __ATOMIC_ACQUIRE))
            return __atomic_load_n(counter, __ATOMIC_ACQUIRE) >= want;
        sleep_ms(2);
    }
    return false;
}

typedef struct part_acc {
    part *parts;
    size_t n;
} part_acc;

static void on_part(st_slice msg, void *arg) {
    part_acc *a = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse *r =
        google__bigtable__v2__generate_initial_change_stream_partitions_response__unpack(
            NULL, msg.len, msg.data);
    if (r && a->n < PARTS_MAX)
        part_from_pb(&a->parts[a->n++], r->partition);
    if (r)
        google__bigtable__v2__generate_initial_change_stream_partitions_response__free_unpacked(
            r, NULL);
}

/* GenerateInitialChangeStreamPartitions into parts (at most PARTS_MAX); the call's code. */
static st_code gen_partitions(const char *id, part *parts, size_t *n, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name);
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest req =
        GOOGLE__BIGTABLE__V2__GENERATE_INITIAL_CHANGE_STREAM_PARTITIONS_REQUEST__INIT;
    req.table_name = name;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t buf[1024];
    protobuf_c_message_pack(&req.base, buf);
    part_acc a = {parts, 0};
    memset(st, 0, sizeof *st);
    st_code rc =
        rpc_blocking_stream(g_c.addr, NULL, BT "GenerateInitialChangeStreamPartitions",
                            st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, on_part, &a, st);
    *n = a.n;
    return rc;
}

/* ---- expectations ---- */

typedef struct exp_rec {
    const char *row;
    st_buf text;
} exp_rec;

static exp_rec g_exp[RECS_MAX];
static size_t g_n_exp;
static uint8_t *g_big; /* the 2.5 MiB value */

static exp_rec *exp_new(const char *row) {
    exp_rec *e = &g_exp[g_n_exp++];
    e->row = row;
    st_buf_init(&e->text);
    return e;
}

static void exp_set(exp_rec *e, const char *q, int64_t ts, st_slice v) {
    stream tmp;
    memset(&tmp, 0, sizeof tmp);
    ProtobufCBinaryData qb = {strlen(q), (uint8_t *)q};
    set_cell_line(&tmp, "cf", qb, ts, v);
    st_buf_append(&e->text, tmp.cur.text.data, tmp.cur.text.len);
    st_buf_free(&tmp.cur.text);
}

static void exp_line(exp_rec *e, const char *line) {
    st_buf_append(&e->text, line, strlen(line));
}

static void mutate(const char *table, const char *row, const bt_muts *m) {
    st_err st = {0};
    st_code rc = bt_mutate_row(&g_c, table, st_slice_cstr(row), m, &st);
    CHECK(rc == ST_OK, "MutateRow %s: %s %s", row, st_code_name(rc), st.msg);
}

/* The writes of table t after streams are on, and what the stream must show for them. */
static void write_history(void) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("a"), 1000, S("v1"));
    mutate("t", "r1", &m);
    exp_set(exp_new("r1"), "a", 1000, S("v1"));
    /* One MutateRows: three rows, one write (one stamp). */
    bt_muts m2, m3, m4;
    bt_muts_init(&m2);
    bt_muts_init(&m3);
    bt_muts_init(&m4);
    bt_muts_set(&m2, "cf", S("a"), 1000, S("x"));
    bt_muts_set(&m3, "cf", S("b"), 1000, S("y"));
    bt_muts_set(&m4, "cf", S("a"), 1000, S("z"));
    bt_entry ents[3] = {{S("r2"), &m2}, {S("r3"), &m3}, {S("r4"), &m4}};
    st_code codes[3];
    st_err st = {0};
    st_code rc = bt_mutate_rows(&g_c, "t", ents, 3, codes, NULL, &st);
    CHECK(rc == ST_OK && codes[0] == ST_OK && codes[1] == ST_OK && codes[2] == ST_OK,
          "MutateRows: %s %s", st_code_name(rc), st.msg);
    exp_set(exp_new("r2"), "a", 1000, S("x"));
    exp_set(exp_new("r3"), "b", 1000, S("y"));
    exp_set(exp_new("r4"), "a", 1000, S("z"));
    bt_muts_reset(&m);
    bt_muts_set(&m, "cf", S("a"), 2000, S("v2"));
    bt_muts_del_column(&m, "cf", S("a"), 0, 2000);
    mutate("t", "r1", &m);
    exp_rec *e = exp_new("r1");
    exp_set(e, "a", 2000, S("v2"));
    exp_line(e, "C cf:a [0,2000)\n");
    bt_muts_reset(&m);
    bt_muts_del_row(&m);
    mutate("t", "r2", &m);
    exp_line(exp_new("r2"), "F cf\n"); /* DeleteFromRow: one DeleteFromFamily per family */
    g_big = malloc(BIG_VALUE_BYTES);
    for (size_t i = 0; i < BIG_VALUE_BYTES; i++)
        g_big[i] = (uint8_t)(i * 131 + (i >> 12));
    bt_muts_reset(&m);
    bt_muts_set(&m, "cf", S("big"), 3000, st_slice_make(g_big, BIG_VALUE_BYTES));
    mutate("t", "r5", &m);
    exp_set(exp_new("r5"), "big", 3000, st_slice_make(g_big, BIG_VALUE_BYTES));
    bt_muts_reset(&m);
    bt_muts_del_family(&m, "cf");
    mutate("t", "r3", &m);
    exp_line(exp_new("r3"), "F cf\n");
    bt_muts_deinit(&m);
    bt_muts_deinit(&m2);
    bt_muts_deinit(&m3);
    bt_muts_deinit(&m4);
}

static bool rec_is(const rec *r, const char *row, const st_buf *text) {
    return st_slice_eq(st_buf_slice(&r->row), st_slice_cstr(row)) &&
           st_slice_eq(st_buf_slice(&r->text), st_buf_slice(text));
}

/* Records of s for row, in stream order, into idx; the count. */
static size_t recs_of_row(const stream *s, const char *row, int *idx) {
    size_t n = 0;
    for (int i = 0; i < s->n_recs; i++)
        if (st_slice_eq(st_buf_slice(&s->recs[i].row), st_slice_cstr(row)))
            idx[n++] = i;
    return n;
}

static size_t exp_of_row(const char *row, size_t *idx) {
    size_t n = 0;
    for (size_t i = 0; i < g_n_exp; i++)
        if (strcmp(g_exp[i].row, row) == 0)
            idx[n++] = i;
    return n;
}

static const char *const g_rows[] = {"r1", "r2", "r3", "r4", "r5"};

/* s holds exactly the expected records, each row's in commit order, USER from CLUSTER_ID, with
 * tokens that parse and watermarks that never go back; it ended with CloseStream OK. */
static void check_history(const char *what, const stream *s) {
    int failures = g_failures;
    CHECK(s->code == ST_OK && s->closed && s->close_code == 0,
          "%s: the stream ended %s \"%s\" closed=%d code=%d (want CloseStream OK, then OK)", what,
          st_code_name(s->code), s->msg, s->closed, s->close_code);
    CHECK((size_t)s->n_recs == g_n_exp, "%s: %d records, want %zu", what, s->n_recs, g_n_exp);
    for (size_t k = 0; k < sizeof g_rows / sizeof g_rows[0]; k++) {
        int got[RECS_MAX];
        size_t want[RECS_MAX];
        size_t ng = recs_of_row(s, g_rows[k], got), nw = exp_of_row(g_rows[k], want);
        bool same = ng == nw;
        for (size_t i = 0; same && i < ng; i++)
            same = rec_is(&s->recs[got[i]], g_rows[k], &g_exp[want[i]].text);
        CHECK(same, "%s: row %s: %zu records in the wrong order or content (want %zu)", what,
              g_rows[k], ng, nw);
    }
    int64_t wm = 0;
    for (int i = 0; i < s->n_recs; i++) {
        const rec *r = &s->recs[i];
        btu_cs_pos pos;
        CHECK(r->type == 1 && strcmp(r->source, CLUSTER_ID) == 0,
              "%s: record %d: type %d source '%s', want USER from %s", what, i, r->type, r->source,
              CLUSTER_ID);
        CHECK(btu_cs_token_parse(st_slice_cstr(r->token), &pos, NULL) == ST_OK,
              "%s: record %d: token '%s' does not parse", what, i, r->token);
        CHECK(r->wm_us >= wm, "%s: watermark went back at record %d", what, i);
        wm = r->wm_us;
    }
    printf("%-58s %d records %s\n", what, s->n_recs, g_failures == failures ? "ok" : "WRONG");
}

/* Resuming from record k's token of a: every record after it comes again, each row's records as a
 * suffix of that row's records in a (records up to k may come again: at least once). */
static void check_resume(const char *what, const stream *a, int k, const stream *b) {
    int failures = g_failures;
    CHECK(b->code == ST_OK && b->closed && b->close_code == 0, "%s: ended %s \"%s\"", what,
          st_code_name(b->code), b->msg);
    for (size_t r = 0; r < sizeof g_rows / sizeof g_rows[0]; r++) {
        int ia[RECS_MAX], ib[RECS_MAX];
        size_t na = recs_of_row(a, g_rows[r], ia), nb = recs_of_row(b, g_rows[r], ib);
        size_t after = 0; /* records of the row that come after k in a */
        for (size_t i = 0; i < na; i++)
            after += ia[i] > k;
        bool ok = nb >= after && nb <= na;
        for (size_t i = 0; ok && i < nb; i++)
            ok = rec_is(&b->recs[ib[i]], g_rows[r], &a->recs[ia[na - nb + i]].text);
        CHECK(ok, "%s: row %s: %zu records after the token, want the last %zu..%zu of %zu", what,
              g_rows[r], nb, after, na, na);
    }
    printf("%-58s %d records %s\n", what, b->n_recs,
           g_failures == failures ? "ok (no gap)" : "WRONG");
}

/* Dots of a token after its table tag ("tT."): 1 live, 3 in a catch-up scan. */
static int token_dots(const char *t) {
    if (t[0] == 't' && strchr(t, '.'))
        t = strchr(t, '.') + 1;
    int n = 0;
    for (; *t; t++)
        n += *t == '.';
    return n;
}

/* ---- scenarios ---- */

static part g_whole; /* [ , ): table t's one partition */

static void test_partitions(void) {
    part parts[PARTS_MAX];
    size_t n = 0;
    st_err st;
    st_code rc = gen_partitions("t", parts, &n, &st);
    CHECK(rc == ST_OK && n == 1 && parts[0].start.len == 0 && parts[0].end.len == 0,
          "GenerateInitialChangeStreamPartitions t: %s \"%s\", %zu partitions", st_code_name(rc),
          st.msg, n);
    printf("%-58s %zu partition ok\n", "GenerateInitialChangeStreamPartitions", n);
    for (size_t i = 0; i < n; i++)
        part_free(&parts[i]);
    rc = gen_partitions("nosuch", parts, &n, &st);
    expect_code("partitions of an unknown table", rc, &st, ST_NOT_FOUND, "not found");
    rc = gen_partitions("off", parts, &n, &st);
    expect_code("partitions with streams off", rc, &st, ST_FAILED_PRECONDITION, "not enabled");
}

/* A stream that must fail with want (and needle in its message). */
static void expect_stream_error(const char *what, const req_opts *o, st_code want,
                                const char *needle) {
    stream *s = read_stream(o);
    st_err st = {.code = s->code};
    snprintf(st.msg, sizeof st.msg, "%.400s", s->msg);
    expect_code(what, s->code, &st, want, needle);
    CHECK(s->n_recs == 0 && !s->closed, "%s: data before the error", what);
    stream_free(s);
}

static void test_errors(int64_t t_on) {
    part ab = {{0}, {0}};
    st_buf_append(&ab.start, "a", 1);
    st_buf_append(&ab.end, "b", 1);
    req_opts o = {.table = "off", .p = &g_whole, .start_us = now_us()};
    expect_stream_error("read with streams off", &o, ST_FAILED_PRECONDITION, "not enabled");
    o.table = "nosuch";
    expect_stream_error("read of an unknown table", &o, ST_NOT_FOUND, "not found");
    o.table = "t";
    o.start_us = now_us() + 3600LL * 1000000;
    expect_stream_error("start_time in the future", &o, ST_INVALID_ARGUMENT, "in the future");
    o.start_us = t_on - 10LL * 1000000;
    expect_stream_error("start_time before streams were on", &o, ST_INVALID_ARGUMENT, "oldest");
    token_arg bad = {&g_whole, "1.x"};
    o = (req_opts){.table = "t", .p = &g_whole, .tokens = &bad, .n_tokens = 1};
    expect_stream_error("malformed token", &o, ST_INVALID_ARGUMENT, "'1.x'");
    char t[64];
    snprintf(t, sizeof t, "1.%" PRId64, now_us());
    token_arg other = {&ab, t};
    o.tokens = &other;
    expect_stream_error("token of another partition", &o, ST_INVALID_ARGUMENT, "do not cover");
    o = (req_opts){.table = "t", .start_us = now_us()};
    expect_stream_error("no partition", &o, ST_INVALID_ARGUMENT, "partition is missing");
    o = (req_opts){.table = "t", .p = &g_whole, .start_us = now_us()};
    o.end_us = o.start_us - 1;
    expect_stream_error("end_time before start_time", &o, ST_INVALID_ARGUMENT, "before start_time");
    o.end_us = 0;
    o.hb_ms = -1500;
    expect_stream_error("negative heartbeat_duration", &o, ST_INVALID_ARGUMENT,
                        "heartbeat_duration");
    o.hb_ms = -500; /* seconds 0, nanos negative */
    expect_stream_error("negative heartbeat_duration under a second", &o, ST_INVALID_ARGUMENT,
                        "heartbeat_duration");
    part_free(&ab);
}

static void test_heartbeats(void) {
    req_opts o = {.table = "t", .p = &g_whole, .hb_ms = 100};
    stream *s = stream_new(&o);
    s->stop_after_heartbeats = 2;
    stream_run(s);
    btu_cs_pos pos;
    bool ok = s->heartbeats >= 2 && s->code == ST_CANCELLED && s->violations == 0 &&
              btu_cs_token_parse(st_slice_cstr(s->hb_token), &pos, NULL) == ST_OK && s->hb_wm > 0 &&
              pos.w == s->hb_wm;
    printf("%-58s %d heartbeats %s\n", "heartbeats (token, watermark)", s->heartbeats,
           ok ? "ok" : "WRONG");
    CHECK(ok, "heartbeats: %d, ended %s, token '%s', watermark %" PRId64 ", violations %d (%s)",
          s->heartbeats, st_code_name(s->code), s->hb_token, s->hb_wm, s->violations, s->why);
    stream_free(s);
    /* end_time with nothing written: CloseStream OK. */
    o.end_us = now_us() + 200000;
    s = read_stream(&o);
    ok = s->code == ST_OK && s->closed && s->close_code == 0 && s->n_recs == 0;
    printf("%-58s %s\n", "end_time without records: CloseStream OK", ok ? "ok" : "WRONG");
    CHECK(ok, "end_time: ended %s \"%s\", closed %d code %d", st_code_name(s->code), s->msg,
          s->closed, s->close_code);
    stream_free(s);
}

/* A stream waiting live gets a write made after it started. */
static void test_live_wait(void) {
    req_opts o = {.table = "t", .p = &g_whole, .hb_ms = 100};
    stream *s = stream_new(&o);
    s->stop_after_recs = 1;
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, s);
    bool waiting = wait_count(s, &s->heartbeats, 1); /* the stream is up and caught up */
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("q"), 5000, S("live"));
    mutate("t", "live1", &m);
    bt_muts_deinit(&m);
    bool got = wait_count(s, &s->n_recs, 1);
    pthread_join(th, NULL);
    bool ok = waiting && got && s->n_recs >= 1 &&
              st_slice_eq(st_buf_slice(&s->recs[0].row), S("live1")) && s->violations == 0;
    printf("%-58s %s\n", "a waiting stream gets a new write", ok ? "ok" : "WRONG");
    CHECK(ok, "live: heartbeat %d, records %d, ended %s \"%s\", violations %d (%s)", waiting,
          s->n_recs, st_code_name(s->code), s->msg, s->violations, s->why);
    stream_free(s);
}

static bool part_is(const part *p, const char *start, const char *end) {
    return st_slice_eq(st_buf_slice(&p->start), st_slice_cstr(start)) &&
           st_slice_eq(st_buf_slice(&p->end), st_slice_cstr(end));
}

/* s ended with CloseStream OUT_OF_RANGE: [ , m) and [m, ) with a token each. */
static void check_split_close(const char *what, const stream *s) {
    bool ok = s->closed && s->close_code == ST_OUT_OF_RANGE && s->code == ST_OK && s->n_new == 2 &&
              s->n_tok == 2 && part_is(&s->new_parts[0], "", "m") &&
              part_is(&s->new_parts[1], "m", "") && part_is(&s->tok_parts[0], "", "m") &&
              part_is(&s->tok_parts[1], "m", "");
    btu_cs_pos pos;
    for (size_t i = 0; ok && i < s->n_tok; i++)
        ok = btu_cs_token_parse(st_slice_cstr(s->tok_text[i]), &pos, NULL) == ST_OK;
    printf("%-58s %s\n", what, ok ? "ok" : "WRONG");
    CHECK(ok, "%s: ended %s \"%s\", closed %d code %d, %zu new partitions, %zu tokens", what,
          st_code_name(s->code), s->msg, s->closed, s->close_code, s->n_new, s->n_tok);
}

static void test_split(void) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("q"), 1000, S("1"));
    int64_t t1 = now_us();
    mutate("ts", "a", &m);
    mutate("ts", "z", &m);
    req_opts o = {.table = "ts", .p = &g_whole, .start_us = t1, .hb_ms = 100};
    stream *s = stream_new(&o);
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, s);
    bool up = wait_count(s, &s->heartbeats, 1);
    uint64_t ids[4];
    size_t n = list_tablets("ts", ids, 4);
    st_err st = {0};
    st_code rc = n == 1 ? split_tablet(ids[0], "m", &st) : ST_INTERNAL;
    CHECK(up && rc == ST_OK, "SplitTablet: %s %s (stream up: %d)", st_code_name(rc), st.msg, up);
    pthread_join(th, NULL); /* the stream ends by itself */
    CHECK(s->violations == 0, "split stream: %s", s->why);
    CHECK(s->n_recs == 2, "split stream: %d records before the split, want 2", s->n_recs);
    check_split_close("tablet split while streaming: CloseStream OUT_OF_RANGE", s);
    /* Each new partition goes on from its token: the writes after the split, one each. */
    mutate("ts", "b", &m);
    mutate("ts", "n", &m);
    for (size_t i = 0; i < 2 && s->n_tok == 2; i++) {
        token_arg tk = {&s->tok_parts[i], s->tok_text[i]};
        req_opts o2 = {.table = "ts",
                       .p = &s->new_parts[i],
                       .tokens = &tk,
                       .n_tokens = 1,
                       .end_us = now_us() + 1000};
        stream *c = read_stream(&o2);
        bool ok = c->code == ST_OK && c->closed && c->close_code == 0 && c->n_recs == 1 &&
                  st_slice_eq(st_buf_slice(&c->recs[0].row), i == 0 ? S("b") : S("n"));
        printf("%-58s %s\n",
               i == 0 ? "new partition [ , m) from its token"
                      : "new partition [m, ) from its token",
               ok ? "ok" : "WRONG");
        CHECK(ok, "child %zu: ended %s \"%s\", %d records", i, st_code_name(c->code), c->msg,
              c->n_recs);
        stream_free(c);
    }
    /* The old partition is stale now: answered with CloseStream at once. */
    stream *old = read_stream(&o);
    check_split_close("stale partition: CloseStream OUT_OF_RANGE at once", old);
    char want[64];
    snprintf(want, sizeof want, "t%08x.1.%" PRId64, btu_cs_table_tag(st_slice_cstr("ts")), t1 - 1);
    CHECK(old->n_tok == 2 && strcmp(old->tok_text[0], want) == 0,
          "stale partition: token '%s', want '%s' (start_time - 1)",
          old->n_tok ? old->tok_text[0] : "", want);
    part parts[PARTS_MAX];
    size_t np = 0;
    gen_partitions("ts", parts, &np, &st);
    CHECK(np == 2, "partitions after the split: %zu, want 2", np);
    for (size_t i = 0; i < np; i++)
        part_free(&parts[i]);
    stream_free(old);
    stream_free(s);
    bt_muts_deinit(&m);
}

/* Two tokens tiling the partition are merged. */
static void test_merge(int64_t t0) {
    part lo = {{0}, {0}}, hi = {{0}, {0}};
    st_buf_append(&lo.end, "m", 1);
    st_buf_append(&hi.start, "m", 1);
    char a[64], b[64];
    snprintf(a, sizeof a, "1.%" PRId64, t0 - 1);
    snprintf(b, sizeof b, "1.%" PRId64, now_us() - 1);
    token_arg tk[2] = {{&hi, b}, {&lo, a}};
    req_opts o = {.table = "t", .p = &g_whole, .tokens = tk, .n_tokens = 2, .end_us = now_us()};
    stream *s = read_stream(&o);
    CHECK(s->code == ST_OK && s->closed && (size_t)s->n_recs >= g_n_exp,
          "merged tokens: ended %s \"%s\", %d records (from the smaller time: all %zu)",
          st_code_name(s->code), s->msg, s->n_recs, g_n_exp);
    printf("%-58s %d records ok\n", "two tokens merged (the smallest time wins)", s->n_recs);
    stream_free(s);
    part_free(&lo);
    part_free(&hi);
}

/* Reads the history from t0 to t_end, checks it, and resumes from a middle record's token. */
static void read_and_resume(const char *what, int64_t t0, int64_t t_end, bool want_scan) {
    req_opts o = {.table = "t", .p = &g_whole, .start_us = t0, .end_us = t_end};
    stream *s = read_stream(&o);
    char w[96];
    snprintf(w, sizeof w, "%s: history from start_time", what);
    check_history(w, s);
    int k = -1, scans = 0;
    for (int i = 0; i < s->n_recs; i++) {
        bool scan = token_dots(s->recs[i].token) == 3;
        scans += scan;
        if (k < 0 && i >= s->n_recs / 2 - 1 && (!want_scan || scan))
            k = i;
    }
    CHECK(want_scan ? scans > 0 : scans == 0, "%s: %d scan tokens (want %s)", what, scans,
          want_scan ? "some: a catch-up scan" : "none: live from the ring");
    if (k >= 0) {
        token_arg tk = {&g_whole, s->recs[k].token};
        req_opts o2 = {.table = "t", .p = &g_whole, .tokens = &tk, .n_tokens = 1, .end_us = t_end};
        stream *b = read_stream(&o2);
        snprintf(w, sizeof w, "%s: resume from token %.20s", what, s->recs[k].token);
        check_resume(w, s, k, b);
        stream_free(b);
    }
    /* Live, from every record's token: the records of one write (the MutateRows) share a stamp
     * and only the write's last may say it, so each resume must find the rest of its write. */
    for (int i = 0; !want_scan && i < s->n_recs; i++) {
        token_arg tk = {&g_whole, s->recs[i].token};
        req_opts o2 = {.table = "t", .p = &g_whole, .tokens = &tk, .n_tokens = 1, .end_us = t_end};
        stream *b = read_stream(&o2);
        snprintf(w, sizeof w, "%s: resume from record %d", what, i);
        check_resume(w, s, i, b);
        stream_free(b);
    }
    stream_free(s);
}

/* A token whose time is past what the node has resolved (another node's clock ahead): a scan
 * token's scan part is not trusted (the node scans again from W up to what it has resolved:
 * records come again, at least once), a live token starts at the resolved stamp; either way a
 * write made after the stream began comes (it would not if the stream trusted the token's time:
 * its stamp is below it). */
static void test_token_ahead(const char *what, const char *token, const char *row) {
    token_arg tk = {&g_whole, token};
    req_opts o = {.table = "t", .p = &g_whole, .tokens = &tk, .n_tokens = 1, .hb_ms = 100};
    stream *s = stream_new(&o);
    s->stop_on_row = row;
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, s);
    bool up = wait_count(s, &s->heartbeats, 1); /* caught up with what the node has */
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", S("q"), 5000, S("after"));
    mutate("t", row, &m);
    bt_muts_deinit(&m);
    bool got = wait_count(s, &s->seen_stop_row, 1);
    if (!got)
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    bool ok = up && got && s->violations == 0;
    printf("%-58s %s\n", what, ok ? "ok" : "WRONG");
    CHECK(ok, "%s: heartbeat %d, %s %d, %d records, ended %s \"%s\"", what, up, row, got, s->n_recs,
          st_code_name(s->code), s->msg);
    stream_free(s);
}

static void test_tokens_ahead(int64_t t0) {
    char token[128];
    int64_t ahead = now_us() + (int64_t)3600 * 1000000;
    snprintf(token, sizeof token, "1.%" PRId64 ".%" PRId64 ".7239", t0 - 1, ahead); /* "r9" */
    test_token_ahead("scan token ahead of the node's clock", token, "zz");
    snprintf(token, sizeof token, "1.%" PRId64, ahead);
    test_token_ahead("live token ahead of the node's clock", token, "zz2");
}

/* The node stops while a stream waits: it exits cleanly (no leak) and the stream ends. */
static void stop_with_open_stream(void) {
    req_opts o = {.table = "t", .p = &g_whole, .hb_ms = 100};
    stream *s = stream_new(&o);
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, s);
    bool up = wait_count(s, &s->heartbeats, 1);
    node_stop();
    pthread_join(th, NULL);
    bool ok = up && s->code != ST_OK && s->violations == 0;
    printf("%-58s %s\n", "node stops with a stream open", ok ? "ok" : "WRONG");
    CHECK(ok, "open stream at stop: up %d, ended %s \"%s\"", up, st_code_name(s->code), s->msg);
    stream_free(s);
}

static void create(const char *id, bool on) {
    st_err st = {0};
    st_code rc = bt_create_table(&g_c, id, "cf", &st);
    CHECK(rc == ST_OK, "CreateTable %s: %s %s", id, st_code_name(rc), st.msg);
    if (on) {
        rc = streams_on(id, &st);
        CHECK(rc == ST_OK, "UpdateTable %s: %s %s", id, st_code_name(rc), st.msg);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || access(argv[1], X_OK) != 0) {
        printf("SKIP: usage: changes_node_test PATH/TO/strata-node\n");
        return 77;
    }
    g_bin = argv[1];
    bt_tmpdir(g_dir, sizeof g_dir, "changes_node");
    snprintf(g_data, sizeof g_data, "%s/data", g_dir);
    node_start();
    create("off", false);
    create("t", true);
    int64_t t_on = now_us();
    int64_t t0 = t_on + 2000; /* after the node's clock turned streams on */
    wait_past(t0);
    /* A node keeps records in its ring only while a stream is open: one stays open (reading
     * along) while the history is written, so reading it back is served from the ring. */
    req_opts lo = {.table = "t", .p = &g_whole, .hb_ms = 100};
    stream *along = stream_new(&lo);
    pthread_t along_th;
    pthread_create(&along_th, NULL, stream_thread, along);
    CHECK(wait_count(along, &along->heartbeats, 1), "the stream kept open did not start");
    write_history();
    int64_t t_end = now_us() + 1000;
    test_partitions();
    read_and_resume("live (ring)", t0, t_end, false);
    __atomic_store_n(&along->stop, 1, __ATOMIC_RELEASE); /* cancelled at its next heartbeat */
    pthread_join(along_th, NULL);
    stream_free(along);
    test_errors(t_on);
    test_merge(t0);
    test_heartbeats();
    test_live_wait();
    create("ts", true);
    test_split();
    /* After a restart the ring is empty: the same history comes from storage. */
    stop_with_open_stream();
    node_start();
    read_and_resume("after restart (catch-up scan)", t0, t_end, true);
    test_tokens_ahead(t0);
    stop_with_open_stream();
    for (size_t i = 0; i < g_n_exp; i++)
        st_buf_free(&g_exp[i].text);
    part_free(&g_whole);
    free(g_big);
    if (g_failures == 0 && !getenv("STRATA_TEST_KEEP"))
        bt_rmrf(g_dir);
    printf("%s: %d failure(s)\n", g_failures ? "FAIL" : "PASS", g_failures);
    return g_failures ? 1 : 0;
}
