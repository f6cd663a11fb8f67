/* changes_fake_server.c — a tiny in-memory Bigtable endpoint with change streams, for testing
 * the consumer side (`strata changes`, `strata bench --workload changes`) apart from the real
 * node and router. It serves, on one loop:
 *   - CreateTable, CreateAppProfile: accepted (nothing kept);
 *   - UpdateTable: turns change streams on for the table named (a done Operation);
 *   - MutateRow: on a table with streams on, appends one record (row, the mutations, commit time
 *     = the wall clock, strictly increasing) and wakes the streams;
 *   - GenerateInitialChangeStreamPartitions: two partitions, ["", SPLIT) and [SPLIT, "");
 *   - ReadChangeStream: from start_time or a token "f.N" (every record up to number N was
 *     delivered), every record of the partition after it, then live ones as they come; a
 *     heartbeat every 100 ms with token and watermark; past end_time CloseStream OK.
 * With --drop-every N each stream ends with UNAVAILABLE after sending N records (a node going
 * away), so clients must resume from their last token. With --fail-partition CODE every
 * ReadChangeStream of the second partition ([SPLIT, "")) ends at once with that gRPC code (a
 * number; 14, UNAVAILABLE, says what a router says of a partition no tablet holds), whatever the
 * table's state, while the first one streams and heartbeats. UpdateTable without
 * change_stream_config turns streams off: GenerateInitial... and new streams then answer
 * FAILED_PRECONDITION (streams already open go on, as a node's would for a while).
 * Prints "fake listening on 127.0.0.1:PORT" and serves until killed.
 *   changes_fake_server [--drop-every N] [--fail-partition CODE] */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/rpc.h"

#define FAKE_SPLIT "cs00000000000050"
#define FAKE_TABLES_MAX 16
#define FAKE_READERS_MAX 256
#define FAKE_HEARTBEAT_MS 100

typedef struct rec {
    char table[256];
    st_buf row, muts; /* muts: the MutateRowRequest's mutations, packed one by one */
    size_t n_muts;
    int64_t commit_us;
} rec;

typedef struct reader {
    rpc_call *call;
    char table[256];
    st_buf start, end;
    uint64_t after; /* records numbered <= after were delivered */
    int64_t end_us;
    uint64_t sent;
    bool used;
} reader;

typedef struct fake {
    struct event_base *base;
    char tables[FAKE_TABLES_MAX][256]; /* streams on */
    size_t n_tables;
    rec *recs; /* record i is number i + 1 */
    size_t n_recs, cap;
    int64_t last_commit_us;
    reader readers[FAKE_READERS_MAX];
    uint64_t drop_every;
    int fail_code; /* --fail-partition: the second partition's streams end with it (0: none) */
} fake;

static fake F; /* one per process: the handlers' shared state */

static bool streams_on(const char *table) {
    for (size_t i = 0; i < F.n_tables; i++)
        if (!strcmp(F.tables[i], table))
            return true;
    return false;
}

static void answer(rpc_call *call, const ProtobufCMessage *m) {
    uint8_t buf[1 << 16];
    size_t len = m ? protobuf_c_message_pack(m, buf) : 0;
    rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, ST_OK, NULL);
}

static void h_ok(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    (void)arg;
    answer(call, NULL);
}

static void h_update_table(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__Admin__V2__UpdateTableRequest *q =
        google__bigtable__admin__v2__update_table_request__unpack(NULL, req.len, req.data);
    if (q && q->table && q->table->change_stream_config && F.n_tables < FAKE_TABLES_MAX &&
        !streams_on(q->table->name))
        snprintf(F.tables[F.n_tables++], sizeof F.tables[0], "%s", q->table->name);
    for (size_t i = 0; q && q->table && !q->table->change_stream_config && i < F.n_tables; i++)
        if (!strcmp(F.tables[i], q->table->name)) /* streams off */
            memmove(F.tables[i], F.tables[--F.n_tables], sizeof F.tables[0]);
    if (q)
        google__bigtable__admin__v2__update_table_request__free_unpacked(q, NULL);
    Google__Longrunning__Operation op;
    google__longrunning__operation__init(&op);
    op.name = "operations/fake";
    op.done = true;
    answer(call, &op.base);
}

static bool in_range(const reader *r, st_slice row) {
    return st_slice_cmp(row, st_buf_slice(&r->start)) >= 0 &&
           (r->end.len == 0 || st_slice_cmp(row, st_buf_slice(&r->end)) < 0);
}

static void ts_set(Google__Protobuf__Timestamp *t, int64_t us) {
    google__protobuf__timestamp__init(t);
    t->seconds = us / 1000000;
    t->nanos = (int32_t)(us % 1000000 * 1000);
}

static void send_msg(reader *r, const Google__Bigtable__V2__ReadChangeStreamResponse *m) {
    size_t len = google__bigtable__v2__read_change_stream_response__get_packed_size(m);
    uint8_t *buf = malloc(len + 1);
    google__bigtable__v2__read_change_stream_response__pack(m, buf);
    rpc_call_send(r->call, st_slice_make(buf, len));
    free(buf);
}

/* Record number n (1-based) as one DataChange message. */
static void send_record(reader *r, uint64_t n) {
    const rec *c = &F.recs[n - 1];
    Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk *chunks =
        calloc(c->n_muts + 1, sizeof(*chunks));
    Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk **cp =
        calloc(c->n_muts + 1, sizeof(*cp));
    Google__Bigtable__V2__Mutation **muts = calloc(c->n_muts + 1, sizeof(*muts));
    const uint8_t *p = c->muts.data, *end = c->muts.data + c->muts.len;
    size_t k = 0;
    while (p < end && k < c->n_muts) {
        uint32_t len;
        memcpy(&len, p, 4);
        muts[k] = google__bigtable__v2__mutation__unpack(NULL, len, p + 4);
        google__bigtable__v2__read_change_stream_response__mutation_chunk__init(&chunks[k]);
        chunks[k].mutation = muts[k];
        cp[k] = &chunks[k];
        p += 4 + len;
        k++;
    }
    char token[32];
    snprintf(token, sizeof token, "f.%llu", (unsigned long long)n);
    Google__Protobuf__Timestamp commit, wm;
    ts_set(&commit, c->commit_us);
    ts_set(&wm, c->commit_us);
    Google__Bigtable__V2__ReadChangeStreamResponse__DataChange d;
    google__bigtable__v2__read_change_stream_response__data_change__init(&d);
    d.type = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__USER;
    d.source_cluster_id = "fake";
    d.row_key = (ProtobufCBinaryData){c->row.len, c->row.data};
    d.commit_timestamp = &commit;
    d.n_chunks = k;
    d.chunks = cp;
    d.done = true;
    d.token = token;
    d.estimated_low_watermark = &wm;
    Google__Bigtable__V2__ReadChangeStreamResponse m;
    google__bigtable__v2__read_change_stream_response__init(&m);
    m.stream_record_case =
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE;
    m.data_change = &d;
    send_msg(r, &m);
    for (size_t i = 0; i < k; i++)
        google__bigtable__v2__mutation__free_unpacked(muts[i], NULL);
    free(muts);
    free(cp);
    free(chunks);
}

static void reader_end(reader *r, st_code code, const char *msg) {
    rpc_call_finish(r->call, code, msg);
    st_buf_free(&r->start);
    st_buf_free(&r->end);
    r->used = false;
}

/* Sends what is due; ends the stream past end_time or at a drop. */
static void reader_pump(reader *r, bool heartbeat) {
    while (r->after < F.n_recs) {
        const rec *c = &F.recs[r->after];
        if (r->end_us && c->commit_us > r->end_us)
            break;
        r->after++;
        if (strcmp(c->table, r->table) != 0 || !in_range(r, st_buf_slice(&c->row)))
            continue;
        send_record(r, r->after);
        if (F.drop_every && ++r->sent % F.drop_every == 0) {
            reader_end(r, ST_UNAVAILABLE, "fake: the node went away");
            return;
        }
    }
    int64_t now = st_wall_us();
    if (heartbeat || (r->end_us && now > r->end_us)) {
        char token[64]; /* "f.N.TIME": like a real token, it moves with time */
        snprintf(token, sizeof token, "f.%llu.%lld", (unsigned long long)r->after, (long long)now);
        Google__Bigtable__V2__StreamContinuationToken t;
        google__bigtable__v2__stream_continuation_token__init(&t);
        t.token = token;
        Google__Protobuf__Timestamp wm;
        ts_set(&wm, F.last_commit_us > now ? F.last_commit_us : now);
        Google__Bigtable__V2__ReadChangeStreamResponse__Heartbeat hb;
        google__bigtable__v2__read_change_stream_response__heartbeat__init(&hb);
        hb.continuation_token = &t;
        hb.estimated_low_watermark = &wm;
        Google__Bigtable__V2__ReadChangeStreamResponse m;
        google__bigtable__v2__read_change_stream_response__init(&m);
        m.stream_record_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT;
        m.heartbeat = &hb;
        send_msg(r, &m);
    }
    if (r->end_us && now > r->end_us) {
        Google__Rpc__Status st;
        google__rpc__status__init(&st);
        Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream cl;
        google__bigtable__v2__read_change_stream_response__close_stream__init(&cl);
        cl.status = &st;
        Google__Bigtable__V2__ReadChangeStreamResponse m;
        google__bigtable__v2__read_change_stream_response__init(&m);
        m.stream_record_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM;
        m.close_stream = &cl;
        send_msg(r, &m);
        reader_end(r, ST_OK, NULL);
    }
}

static void pump_all(bool heartbeat) {
    for (size_t i = 0; i < FAKE_READERS_MAX; i++)
        if (F.readers[i].used)
            reader_pump(&F.readers[i], heartbeat);
}

static void h_mutate_row(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__V2__MutateRowRequest *q =
        google__bigtable__v2__mutate_row_request__unpack(NULL, req.len, req.data);
    if (!q) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "fake: bad MutateRowRequest");
        return;
    }
    if (streams_on(q->table_name)) {
        if (F.n_recs == F.cap) {
            F.cap = F.cap ? F.cap * 2 : 1024;
            F.recs = realloc(F.recs, F.cap * sizeof(*F.recs));
        }
        rec *c = &F.recs[F.n_recs++];
        memset(c, 0, sizeof *c);
        snprintf(c->table, sizeof c->table, "%s", q->table_name);
        st_buf_append(&c->row, q->row_key.data, q->row_key.len);
        for (size_t i = 0; i < q->n_mutations; i++) {
            uint32_t len =
                (uint32_t)google__bigtable__v2__mutation__get_packed_size(q->mutations[i]);
            st_buf_reserve(&c->muts, len + 4);
            memcpy(c->muts.data + c->muts.len, &len, 4);
            google__bigtable__v2__mutation__pack(q->mutations[i], c->muts.data + c->muts.len + 4);
            c->muts.len += len + 4;
            c->n_muts++;
        }
        int64_t now = st_wall_us();
        c->commit_us = now > F.last_commit_us ? now : F.last_commit_us + 1;
        F.last_commit_us = c->commit_us;
    }
    google__bigtable__v2__mutate_row_request__free_unpacked(q, NULL);
    answer(call, NULL);
    pump_all(false);
}

static void h_generate(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest *q =
        google__bigtable__v2__generate_initial_change_stream_partitions_request__unpack(
            NULL, req.len, req.data);
    bool on = q && streams_on(q->table_name);
    if (q)
        google__bigtable__v2__generate_initial_change_stream_partitions_request__free_unpacked(
            q, NULL);
    if (!on) {
        rpc_call_finish(call, ST_FAILED_PRECONDITION, "fake: change streams are off for the table");
        return;
    }
    const char *b[] = {"", FAKE_SPLIT, FAKE_SPLIT, ""};
    for (int i = 0; i < 2; i++) {
        Google__Bigtable__V2__RowRange rr;
        google__bigtable__v2__row_range__init(&rr);
        rr.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        rr.start_key_closed = (ProtobufCBinaryData){strlen(b[2 * i]), (uint8_t *)b[2 * i]};
        if (*b[2 * i + 1]) {
            rr.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
            rr.end_key_open = (ProtobufCBinaryData){strlen(b[2 * i + 1]), (uint8_t *)b[2 * i + 1]};
        }
        Google__Bigtable__V2__StreamPartition sp;
        google__bigtable__v2__stream_partition__init(&sp);
        sp.row_range = &rr;
        Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse r;
        google__bigtable__v2__generate_initial_change_stream_partitions_response__init(&r);
        r.partition = &sp;
        uint8_t buf[512];
        size_t len =
            google__bigtable__v2__generate_initial_change_stream_partitions_response__pack(&r, buf);
        rpc_call_send(call, st_slice_make(buf, len));
    }
    rpc_call_finish(call, ST_OK, NULL);
}

static void on_cancel(rpc_call *call, void *arg) {
    (void)call;
    reader *r = arg;
    if (r->used)
        reader_end(r, ST_CANCELLED, NULL);
}

/* The reader's start: a token "f.N", or a start time (records committed before it skipped). */
static bool reader_start(reader *r, const Google__Bigtable__V2__ReadChangeStreamRequest *q) {
    if (q->start_from_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS) {
        uint64_t min = UINT64_MAX;
        for (size_t i = 0; i < q->continuation_tokens->n_tokens; i++) {
            unsigned long long n;
            if (sscanf(q->continuation_tokens->tokens[i]->token, "f.%llu", &n) != 1)
                return false;
            if (n < min)
                min = n;
        }
        r->after = min == UINT64_MAX ? 0 : min;
        return r->after <= F.n_recs;
    }
    int64_t start = 0;
    if (q->start_from_case ==
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME)
        start = q->start_time->seconds * 1000000 + q->start_time->nanos / 1000;
    r->after = 0;
    while (r->after < F.n_recs && F.recs[r->after].commit_us < start)
        r->after++;
    return true;
}

static void h_read(rpc_call *call, st_slice req, void *arg) {
    (void)arg;
    Google__Bigtable__V2__ReadChangeStreamRequest *q =
        google__bigtable__v2__read_change_stream_request__unpack(NULL, req.len, req.data);
    reader *r = NULL;
    for (size_t i = 0; q && !r && i < FAKE_READERS_MAX; i++)
        if (!F.readers[i].used)
            r = &F.readers[i];
    if (!q || !r || !q->partition || !q->partition->row_range) {
        rpc_call_finish(call, ST_INVALID_ARGUMENT, "fake: bad request or too many streams");
        if (q)
            google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
        return;
    }
    const Google__Bigtable__V2__RowRange *fr = q->partition->row_range;
    if (F.fail_code && fr->start_key_closed.len == strlen(FAKE_SPLIT) &&
        !memcmp(fr->start_key_closed.data, FAKE_SPLIT, strlen(FAKE_SPLIT))) {
        rpc_call_finish(call, (st_code)F.fail_code,
                        F.fail_code == ST_UNAVAILABLE
                            ? "fake: no tablet of the table holds some rows of the partition (a "
                              "tablet is being moved, or the cluster has no copy of the table): "
                              "retry"
                            : "fake: this partition fails");
        google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
        return;
    }
    if (!streams_on(q->table_name)) {
        rpc_call_finish(call, ST_FAILED_PRECONDITION, "fake: change streams are off for the table");
        google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
        return;
    }
    memset(r, 0, sizeof *r);
    r->used = true;
    r->call = call;
    snprintf(r->table, sizeof r->table, "%s", q->table_name);
    const Google__Bigtable__V2__RowRange *rr = q->partition->row_range;
    st_buf_append(&r->start, rr->start_key_closed.data, rr->start_key_closed.len);
    if (rr->end_key_case)
        st_buf_append(&r->end, rr->end_key_open.data, rr->end_key_open.len);
    r->end_us = q->end_time ? q->end_time->seconds * 1000000 + q->end_time->nanos / 1000 : 0;
    bool ok = reader_start(r, q);
    google__bigtable__v2__read_change_stream_request__free_unpacked(q, NULL);
    if (!ok) {
        reader_end(r, ST_INVALID_ARGUMENT, "fake: bad continuation token");
        return;
    }
    rpc_call_set_cancel_cb(call, on_cancel, r);
    reader_pump(r, true);
}

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
    pump_all(true);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && !strcmp(argv[i], "--drop-every"))
            F.drop_every = strtoull(argv[i + 1], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--fail-partition"))
            F.fail_code = atoi(argv[i + 1]);
        else {
            fprintf(stderr,
                    "usage: changes_fake_server [--drop-every N] [--fail-partition CODE]\n");
            return 2;
        }
    }
    F.base = event_base_new();
    st_err err = {0};
    rpc_server *s = rpc_server_new(F.base, NULL, &err);
    if (!s)
        return 1;
#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
    rpc_server_add_method(s, TA "CreateTable", h_ok, NULL);
    rpc_server_add_method(s, "/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile",
                          h_ok, NULL);
    rpc_server_add_method(s, TA "UpdateTable", h_update_table, NULL);
    rpc_server_add_method(s, BT "MutateRow", h_mutate_row, NULL);
    rpc_server_add_method(s, BT "ReadRows", h_ok, NULL);
    rpc_server_add_method(s, BT "GenerateInitialChangeStreamPartitions", h_generate, NULL);
    rpc_server_add_method(s, BT "ReadChangeStream", h_read, NULL);
    uint16_t port;
    if (rpc_server_listen(s, "127.0.0.1", 0, &port, &err) != ST_OK) {
        fprintf(stderr, "fake: %s\n", err.msg);
        return 1;
    }
    printf("fake listening on 127.0.0.1:%u\n", port);
    fflush(stdout);
    struct event *hb = event_new(F.base, -1, EV_PERSIST, heartbeat_cb, NULL);
    struct timeval tv = {0, FAKE_HEARTBEAT_MS * 1000};
    event_add(hb, &tv);
    event_base_dispatch(F.base);
    return 0;
}
