/*
 * A cell larger than the node's 64 MiB ring, written while a consumer reads its partition live
 * through the router (`strata up --clusters 1 --nodes 1`): the node reads the record back from
 * storage and sends it over many loop turns, one message at a time as the router takes them
 * (docs/changestreams.md, Sending large records). Checks:
 *   - the consumer's stream (raw HTTP/2 to the router) gets the whole value, chunk offsets and
 *     bytes as written, then a small record written after it, on the same stream: it never
 *     ended, so the router kept its connection to the node;
 *   - small writes and reads through the router while the record is on its way all succeed;
 *   - no router log says a node link missed its keepalive.
 *
 *   cs_huge_test <build>/ops/strata
 * Exit 77 when strata, strata-node or strata-router is missing.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/time.h>

#include "btclient.h"
#include "chaos_util.h"
#include "raw_h2.h"
#include "strata/cstoken.h"

#define BT "/google.bigtable.v2.Bigtable/"
#define HUGE_BYTES (((size_t)64 << 20) + ((size_t)64 << 10)) /* past the 64 MiB ring */
#define SMALL_OPS 20
#define PROFILE "one"

#define NVS(n, v)                                                                                  \
    { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0 }

static uint8_t byte_at(size_t i) {
    return (uint8_t)(i * 31 + (i >> 20));
}

/* ---- the writer: the huge cell, small calls meanwhile, then the marker row ---- */

typedef struct writer {
    bt_client c;
    st_code big_rc;
    int small_failed;
    char why[768];
} writer;

static st_code put(writer *w, const char *row, st_slice value) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", st_slice_cstr("q"), 1000, value);
    st_err st;
    st_code rc = bt_mutate_row(&w->c, "huge", st_slice_cstr(row), &m, &st);
    if (rc != ST_OK)
        snprintf(w->why, sizeof w->why, "MutateRow %s: %s %s", row, st_code_name(rc), st.msg);
    bt_muts_deinit(&m);
    return rc;
}

static void *writer_main(void *arg) {
    writer *w = arg;
    uint8_t *v = malloc(HUGE_BYTES);
    if (!v) {
        w->big_rc = ST_RESOURCE_EXHAUSTED;
        return NULL;
    }
    for (size_t i = 0; i < HUGE_BYTES; i++)
        v[i] = byte_at(i);
    w->big_rc = put(w, "big", st_slice_make(v, HUGE_BYTES));
    free(v);
    for (int i = 0; i < SMALL_OPS; i++) { /* the node answers while the record goes out */
        char row[16];
        snprintf(row, sizeof row, "small%02d", i);
        st_buf dump;
        st_buf_init(&dump);
        st_arena a;
        st_arena_init(&a, 1024);
        Google__Bigtable__V2__RowSet *rs = bt_rowset_new(&a);
        bt_rowset_add_key(&a, rs, st_slice_cstr(row));
        bt_read_req rq = {.rows = rs};
        size_t n = 0;
        st_err st;
        if (put(w, row, st_slice_cstr("s")) != ST_OK ||
            bt_read_dump(&w->c, "huge", &rq, &dump, &n, &st) != ST_OK || n != 1)
            w->small_failed++;
        st_arena_deinit(&a);
        st_buf_free(&dump);
    }
    put(w, "zz-marker", st_slice_cstr("m"));
    return NULL;
}

/* ---- the consumer: raw HTTP/2 to the router ---- */

typedef struct seen {
    size_t parsed;     /* bytes of the response parsed so far */
    size_t big_bytes;  /* value bytes of row "big" received, in order */
    bool big_done;     /* its record's last message */
    bool marker;       /* the record of row zz-marker */
    int bad;           /* chunks out of order or with the wrong bytes */
    size_t heartbeats; /* before the record */
} seen;

static void check_piece(seen *s,
                        const Google__Bigtable__V2__ReadChangeStreamResponse__DataChange *d,
                        size_t i) {
    const Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk *ch = d->chunks[i];
    if (!ch->mutation || !ch->mutation->set_cell)
        return;
    const ProtobufCBinaryData *p = &ch->mutation->set_cell->value;
    size_t at = ch->chunk_info ? (size_t)ch->chunk_info->chunked_value_offset : 0;
    if (at != s->big_bytes || at + p->len > HUGE_BYTES) {
        s->bad++;
        return;
    }
    for (size_t k = 0; k < p->len; k++)
        if (p->data[k] != byte_at(at + k)) {
            s->bad++;
            return;
        }
    s->big_bytes += p->len;
}

/* Parses the complete messages received since the last call. */
static void scan(seen *s, const st_buf *data) {
    static bool in_big; /* inside the record of row "big" (CONTINUATION messages follow) */
    while (s->parsed + 5 <= data->len) {
        const uint8_t *h = data->data + s->parsed;
        size_t len = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
        if (s->parsed + 5 + len > data->len)
            return;
        Google__Bigtable__V2__ReadChangeStreamResponse *r =
            google__bigtable__v2__read_change_stream_response__unpack(NULL, len, h + 5);
        s->parsed += 5 + len;
        if (!r) {
            s->bad++;
            continue;
        }
        if (r->stream_record_case ==
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE) {
            const Google__Bigtable__V2__ReadChangeStreamResponse__DataChange *d = r->data_change;
            if (d->row_key.len)
                in_big = d->row_key.len == 3 && memcmp(d->row_key.data, "big", 3) == 0;
            if (d->row_key.len == 9 && memcmp(d->row_key.data, "zz-marker", 9) == 0)
                s->marker = true;
            for (size_t i = 0; in_big && i < d->n_chunks; i++)
                check_piece(s, d, i);
            if (in_big && d->done)
                s->big_done = true;
        } else if (r->stream_record_case ==
                   GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT) {
            s->heartbeats++;
        }
        google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
    }
}

/* The gRPC-framed ReadChangeStream request: the whole table from t0, live, heartbeats 1 s. */
static size_t stream_request(uint8_t *out, size_t cap, int64_t t0) {
    char table[BT_NAME_MAX];
    snprintf(table, sizeof table, "projects/%s/instances/%s/tables/huge", ci_topo.project,
             ci_topo.instance);
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = table;
    req.app_profile_id = (char *)PROFILE;
    Google__Bigtable__V2__StreamPartition p;
    Google__Bigtable__V2__RowRange rr;
    btu_cs_partition_set(&p, &rr, st_slice_cstr(""), st_slice_cstr(""));
    req.partition = &p;
    Google__Protobuf__Timestamp st;
    btu_cs_time_set(&st, t0);
    req.start_from_case = GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
    req.start_time = &st;
    Google__Protobuf__Duration hb;
    google__protobuf__duration__init(&hb);
    hb.seconds = 1;
    req.heartbeat_duration = &hb;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    if (len + 5 > cap)
        ci_fail("request too large");
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
    protobuf_c_message_pack(&req.base, out + 5);
    return len + 5;
}

/* Reads the stream until pred holds; fails the test when the stream ends first. */
static void read_until(nghttp2_session *s, raw_call *r, seen *sn, bool (*pred)(const seen *)) {
    static uint8_t buf[1 << 16];
    while (!pred(sn)) {
        ssize_t n = recv(r->fd, buf, sizeof buf, 0);
        if (n <= 0)
            ci_fail("the change stream went silent or its connection closed (recv %zd)", n);
        if (nghttp2_session_mem_recv(s, buf, (size_t)n) != n || nghttp2_session_send(s) != 0)
            ci_fail("HTTP/2 error on the change stream");
        scan(sn, &r->data);
        if (r->closed)
            ci_fail("the change stream ended (grpc-status %d) after %zu of %zu value bytes: the "
                    "router lost its node connection?",
                    r->grpc_status, sn->big_bytes, (size_t)HUGE_BYTES);
    }
}

static bool got_heartbeat(const seen *s) {
    return s->heartbeats > 0;
}
static bool got_marker(const seen *s) {
    return s->marker;
}

static uint16_t router_port(void) {
    const char *colon = strrchr(ci_router, ':');
    return colon ? (uint16_t)atoi(colon + 1) : 0;
}

int main(int argc, char **argv) {
    int rc = ci_init("cs_huge_test", argc, argv);
    if (rc)
        return rc;
    ci_up(1, 1);
    writer w = {.big_rc = ST_UNKNOWN};
    bt_client_init(&w.c, ci_router);
    st_err st;
    if (bt_create_table(&w.c, "huge", "cf", &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);
    if (bt_create_app_profile(&w.c, PROFILE, ci_topo.clusters[0].id, &st) != ST_OK)
        ci_fail("CreateAppProfile: %s", st.msg);
    ci_strata_ok((const char *const[]){"changes", "--dir", ci_dir, "--table", "huge", "--enable",
                                       "1d", "--quiet", NULL});
    uint8_t body[1024];
    raw_call r = {.fd = raw_tcp_connect(router_port(), 0), .grpc_status = -1};
    if (r.fd < 0)
        ci_fail("cannot connect to the router at %s", ci_router);
    struct timeval tv = {60, 0}; /* a stream silent for a minute fails the test */
    setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    r.body = body;
    r.body_len = stream_request(body, sizeof body, st_wall_us());
    st_buf_init(&r.data);
    nghttp2_session *s = raw_session(&r, true);
    nghttp2_nv nva[] = {NVS(":method", "POST"),
                        NVS(":scheme", "http"),
                        NVS(":path", BT "ReadChangeStream"),
                        NVS(":authority", "t"),
                        NVS("content-type", "application/grpc"),
                        NVS("te", "trailers")};
    nghttp2_data_provider prd = {.read_callback = raw_body};
    if (!s || nghttp2_submit_request(s, NULL, nva, 6, &prd, NULL) <= 0 ||
        nghttp2_session_send(s) != 0)
        ci_fail("could not send the ReadChangeStream request");
    seen sn = {0};
    read_until(s, &r, &sn, got_heartbeat); /* the stream is live before the write */
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &w);
    read_until(s, &r, &sn, got_marker);
    pthread_join(th, NULL);
    printf("value bytes %zu of %zu, record done %d, bad chunks %d, small calls failed %d\n",
           sn.big_bytes, (size_t)HUGE_BYTES, sn.big_done, sn.bad, w.small_failed);
    if (w.big_rc != ST_OK)
        ci_fail("the huge write failed: %s", w.why);
    if (sn.big_bytes != HUGE_BYTES || !sn.big_done || sn.bad)
        ci_fail("the consumer did not get the whole value as written");
    if (w.small_failed)
        ci_fail("%d small call(s) failed while the record was sent: %s", w.small_failed, w.why);
    nghttp2_session_del(s);
    close(r.fd);
    st_buf_free(&r.data);
    char cmd[BT_PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "grep -rl 'no answer to a keepalive PING' '%s' >/dev/null 2>&1",
             ci_dir);
    if (system(cmd) == 0)
        ci_fail("a router link to the node missed its keepalive (router log)");
    ci_down();
    printf("cs_huge_test: all checks passed\n");
    return 0;
}
