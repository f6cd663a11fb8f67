/*
 * Proves the router's side of change streams (docs/changestreams.md, "The router") on a local
 * instance of two clusters of one node each (`strata up --clusters 2 --nodes 1`), with raw gRPC
 * (cbt has no change stream commands):
 *   - CreateTable keeps change_stream_config and deletion_protection, GetTable returns them in
 *     SCHEMA_VIEW and FULL (not NAME_ONLY), a retention outside 1-7 days is INVALID_ARGUMENT;
 *   - UpdateTable turns streams on and off and deletion protection on and off, answers a finished
 *     Operation (UpdateTableMetadata, response Table) that GetOperation and ListOperations find;
 *     an empty mask, other paths and a bad retention are INVALID_ARGUMENT; DeleteTable of a
 *     protected table is FAILED_PRECONDITION;
 *   - GenerateInitialChangeStreamPartitions: NOT_FOUND for an unknown table, FAILED_PRECONDITION
 *     with streams off, INVALID_ARGUMENT for a multi-cluster profile; one partition per tablet,
 *     also after a tablet split on the node (SplitTablet);
 *   - ReadChangeStream of a partition that is no longer one tablet: CloseStream OUT_OF_RANGE
 *     with the tablets as new partitions and tokens derived from the request (start_time T ->
 *     "1.(T-1)", a token kept as it is); malformed tokens, tokens of another partition and an
 *     end_time before the start_time (router and node alike) are INVALID_ARGUMENT;
 *   - a child partition of a split the router's tablet map does not show yet (SplitTablet on the
 *     node) is read from the node: the router refreshes its map before answering CloseStream.
 *
 *   changes_router_test <build>/ops/strata
 * Exit 77 when strata, strata-node or strata-router is missing.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "btclient.h"
#include "chaos_util.h"
#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/cstoken.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"

#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define LRO "/google.longrunning.Operations/"
#define NODE "/strata.internal.v1.Node/"
#define INST "projects/p/instances/i"
#define CALL_TIMEOUT_MS 20000
#define DAY_S (24LL * 3600)
#define PARTS_MAX 16

typedef Google__Bigtable__Admin__V2__Table pb_table;

static int g_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL line %d: ", __LINE__);                                                    \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_failures++;                                                                          \
        }                                                                                          \
    } while (0)

static st_code unary(const char *addr, const char *path, const ProtobufCMessage *req, st_buf *resp,
                     st_err *st) {
    return bt_call_pb(addr, path, req, CALL_TIMEOUT_MS, resp, st);
}

static void expect_code(const char *what, st_code got, const st_err *st, st_code want,
                        const char *needle) {
    bool ok = got == want && (!needle || strstr(st->msg, needle));
    printf("%-62s %-20s %s\n", what, st_code_name(got), ok ? "ok" : "WRONG");
    CHECK(ok, "%s: got %s \"%s\", want %s%s%s", what, st_code_name(got), st->msg,
          st_code_name(want), needle ? " with " : "", needle ? needle : "");
}

static void table_name(const char *id, char *out, size_t cap) {
    snprintf(out, cap, INST "/tables/%s", id);
}

/* ---- admin ---- */

static Google__Protobuf__Duration g_ret;
static Google__Bigtable__Admin__V2__ChangeStreamConfig g_cfg;

/* A table with family cf; retention_s > 0 turns streams on; splits NULL-terminated or NULL. */
static st_code create_table(const char *id, int64_t retention_s, bool protect,
                            const char *const *splits, st_err *st) {
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e, *ep = &e;
    google__bigtable__admin__v2__table__column_families_entry__init(&e);
    e.key = (char *)"cf";
    e.value = &cf;
    t.column_families = &ep;
    t.n_column_families = 1;
    t.deletion_protection = protect;
    google__protobuf__duration__init(&g_ret);
    google__bigtable__admin__v2__change_stream_config__init(&g_cfg);
    g_ret.seconds = retention_s;
    g_cfg.retention_period = &g_ret;
    if (retention_s)
        t.change_stream_config = &g_cfg;
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = (char *)INST;
    req.table_id = (char *)id;
    req.table = &t;
    Google__Bigtable__Admin__V2__CreateTableRequest__Split sp[8], *spp[8];
    for (size_t i = 0; splits && splits[i] && i < 8; i++) {
        google__bigtable__admin__v2__create_table_request__split__init(&sp[i]);
        sp[i].key = (ProtobufCBinaryData){strlen(splits[i]), (uint8_t *)splits[i]};
        spp[i] = &sp[i];
        req.initial_splits = spp;
        req.n_initial_splits = i + 1;
    }
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(ci_router, TA "CreateTable", &req.base, &resp, st);
    st_buf_free(&resp);
    return rc;
}

/* GetTable; NULL (and a failed check) when it fails. Free with ..._free_unpacked. */
static pb_table *get_table(const char *id, Google__Bigtable__Admin__V2__Table__View view) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__Admin__V2__GetTableRequest req;
    google__bigtable__admin__v2__get_table_request__init(&req);
    req.name = name;
    req.view = view;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    st_code rc = unary(ci_router, TA "GetTable", &req.base, &resp, &st);
    pb_table *t =
        rc == ST_OK ? google__bigtable__admin__v2__table__unpack(NULL, resp.len, resp.data) : NULL;
    CHECK(t, "GetTable %s: %s %s", id, st_code_name(rc), st.msg);
    st_buf_free(&resp);
    return t;
}

static int64_t retention_of(const pb_table *t) {
    return t && t->change_stream_config && t->change_stream_config->retention_period
               ? t->change_stream_config->retention_period->seconds
               : 0;
}

/* UpdateTable with mask paths (NULL-terminated); retention_s 0 = no change_stream_config.
 * *op (may be NULL) receives the Operation on success. */
static st_code update_table(const char *id, const char *const *paths, int64_t retention_s,
                            bool protect, Google__Longrunning__Operation **op, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.name = name;
    t.deletion_protection = protect;
    google__protobuf__duration__init(&g_ret);
    google__bigtable__admin__v2__change_stream_config__init(&g_cfg);
    g_ret.seconds = retention_s;
    g_cfg.retention_period = &g_ret;
    if (retention_s)
        t.change_stream_config = &g_cfg;
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.paths = (char **)paths;
    while (paths && paths[mask.n_paths])
        mask.n_paths++;
    Google__Bigtable__Admin__V2__UpdateTableRequest req;
    google__bigtable__admin__v2__update_table_request__init(&req);
    req.table = &t;
    req.update_mask = &mask;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(ci_router, TA "UpdateTable", &req.base, &resp, st);
    if (op)
        *op =
            rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    st_buf_free(&resp);
    return rc;
}

static st_code delete_table(const char *id, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__Admin__V2__DeleteTableRequest req;
    google__bigtable__admin__v2__delete_table_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(ci_router, TA "DeleteTable", &req.base, &resp, st);
    st_buf_free(&resp);
    return rc;
}

/* A multi-cluster (any cluster) app profile. */
static void create_multi_profile(const char *id) {
    Google__Bigtable__Admin__V2__AppProfile__MultiClusterRoutingUseAny any;
    google__bigtable__admin__v2__app_profile__multi_cluster_routing_use_any__init(&any);
    Google__Bigtable__Admin__V2__AppProfile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    p.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_MULTI_CLUSTER_ROUTING_USE_ANY;
    p.multi_cluster_routing_use_any = &any;
    Google__Bigtable__Admin__V2__CreateAppProfileRequest req;
    google__bigtable__admin__v2__create_app_profile_request__init(&req);
    req.parent = (char *)INST;
    req.app_profile_id = (char *)id;
    req.app_profile = &p;
    req.ignore_warnings = true;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    st_code rc = unary(ci_router, IA "CreateAppProfile", &req.base, &resp, &st);
    if (rc != ST_OK)
        ci_fail("CreateAppProfile %s: %s %s", id, st_code_name(rc), st.msg);
    st_buf_free(&resp);
}

/* ---- data: partitions as "start..end" text ("" = unbounded) ---- */

typedef struct parts {
    char v[PARTS_MAX][64];
    size_t n;
    char tokens[PARTS_MAX][160]; /* CloseStream: "start..end=token" */
    size_t n_tokens;
    int close_code; /* CloseStream status, -1 none */
    size_t msgs;
    char rows[512];  /* row keys of DataChanges, each followed by ',' */
    char drops[512]; /* DataChanges that delete: "row@source cluster," */
} parts;

static void range_text(const Google__Bigtable__V2__RowRange *rr, char *out, size_t cap) {
    int sl = 0, el = 0;
    const char *s = "", *e = "";
    if (rr && rr->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED) {
        s = (const char *)rr->start_key_closed.data;
        sl = (int)rr->start_key_closed.len;
    }
    if (rr && rr->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN) {
        e = (const char *)rr->end_key_open.data;
        el = (int)rr->end_key_open.len;
    }
    snprintf(out, cap, "%.*s..%.*s", sl, s, el, e);
}

static void on_partition(st_slice msg, void *arg) {
    parts *p = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse *r =
        google__bigtable__v2__generate_initial_change_stream_partitions_response__unpack(
            NULL, msg.len, msg.data);
    if (r && r->partition && p->n < PARTS_MAX)
        range_text(r->partition->row_range, p->v[p->n++], sizeof p->v[0]);
    google__bigtable__v2__generate_initial_change_stream_partitions_response__free_unpacked(r,
                                                                                            NULL);
}

static st_code partitions(const char *id, const char *profile, parts *p, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest req;
    google__bigtable__v2__generate_initial_change_stream_partitions_request__init(&req);
    req.table_name = name;
    req.app_profile_id = (char *)profile;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t buf[BT_NAME_MAX + 128];
    protobuf_c_message_pack(&req.base, buf);
    memset(p, 0, sizeof *p);
    memset(st, 0, sizeof *st);
    return rpc_blocking_stream(ci_router, NULL, BT "GenerateInitialChangeStreamPartitions",
                               st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, on_partition, p,
                               st);
}

static void on_change(st_slice msg, void *arg) {
    parts *p = arg;
    p->msgs++;
    Google__Bigtable__V2__ReadChangeStreamResponse *r =
        google__bigtable__v2__read_change_stream_response__unpack(NULL, msg.len, msg.data);
    if (r &&
        r->stream_record_case ==
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE &&
        r->data_change->row_key.len) {
        size_t off = strlen(p->rows);
        snprintf(p->rows + off, sizeof p->rows - off, "%.*s,", (int)r->data_change->row_key.len,
                 (const char *)r->data_change->row_key.data);
        const Google__Bigtable__V2__ReadChangeStreamResponse__DataChange *dc = r->data_change;
        int mc = dc->n_chunks && dc->chunks[0]->mutation
                     ? (int)dc->chunks[0]->mutation->mutation_case
                     : 0;
        off = strlen(p->drops);
        if (mc == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY ||
            mc == GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW)
            snprintf(p->drops + off, sizeof p->drops - off, "%.*s@%s,", (int)dc->row_key.len,
                     (const char *)dc->row_key.data, dc->source_cluster_id);
    }
    if (r && r->stream_record_case ==
                 GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM) {
        Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream *cs = r->close_stream;
        p->close_code = cs->status ? cs->status->code : 0;
        for (size_t i = 0; i < cs->n_new_partitions && p->n < PARTS_MAX; i++)
            range_text(cs->new_partitions[i]->row_range, p->v[p->n++], sizeof p->v[0]);
        for (size_t i = 0; i < cs->n_continuation_tokens && p->n_tokens < PARTS_MAX; i++) {
            char rt[64];
            Google__Bigtable__V2__StreamContinuationToken *tk = cs->continuation_tokens[i];
            range_text(tk->partition ? tk->partition->row_range : NULL, rt, sizeof rt);
            snprintf(p->tokens[p->n_tokens++], sizeof p->tokens[0], "%s=%s", rt, tk->token);
        }
    }
    google__bigtable__v2__read_change_stream_response__free_unpacked(r, NULL);
}

static void set_range(Google__Bigtable__V2__RowRange *rr, const char *s, const char *e) {
    google__bigtable__v2__row_range__init(rr);
    if (s[0]) {
        rr->start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        rr->start_key_closed = (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
    }
    if (e[0]) {
        rr->end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        rr->end_key_open = (ProtobufCBinaryData){strlen(e), (uint8_t *)e};
    }
}

/* ReadChangeStream of partition [s, e) from start_us (tokens NULL) or from tokens: pairs of
 * "start", "end", "token" strings, NULL-terminated. */
static st_code read_until(const char *id, const char *profile, const char *s, const char *e,
                          int64_t start_us, int64_t end_us, const char *const *tokens, parts *p,
                          st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__V2__RowRange rr, trr[4];
    Google__Bigtable__V2__StreamPartition part, tpart[4];
    Google__Bigtable__V2__StreamContinuationToken tk[4], *tkp[4];
    Google__Bigtable__V2__StreamContinuationTokens toks;
    Google__Protobuf__Timestamp ts, end_ts;
    Google__Protobuf__Duration hb;
    set_range(&rr, s, e);
    google__bigtable__v2__stream_partition__init(&part);
    part.row_range = &rr;
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = name;
    req.app_profile_id = (char *)profile;
    req.partition = &part;
    if (end_us) { /* the node ends the stream there (CloseStream OK); heartbeats help it along */
        google__protobuf__timestamp__init(&end_ts);
        end_ts.seconds = end_us / 1000000;
        end_ts.nanos = (int32_t)(end_us % 1000000) * 1000;
        req.end_time = &end_ts;
        google__protobuf__duration__init(&hb);
        hb.nanos = 200000000;
        req.heartbeat_duration = &hb;
    }
    if (tokens) {
        google__bigtable__v2__stream_continuation_tokens__init(&toks);
        for (size_t i = 0; tokens[3 * i] && i < 4; i++) {
            set_range(&trr[i], tokens[3 * i], tokens[3 * i + 1]);
            google__bigtable__v2__stream_partition__init(&tpart[i]);
            tpart[i].row_range = &trr[i];
            google__bigtable__v2__stream_continuation_token__init(&tk[i]);
            tk[i].partition = &tpart[i];
            tk[i].token = (char *)tokens[3 * i + 2];
            tkp[i] = &tk[i];
            toks.n_tokens = i + 1;
        }
        toks.tokens = tkp;
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS;
        req.continuation_tokens = &toks;
    } else {
        google__protobuf__timestamp__init(&ts);
        ts.seconds = start_us / 1000000;
        ts.nanos = (int32_t)(start_us % 1000000) * 1000;
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
        req.start_time = &ts;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    memset(p, 0, sizeof *p);
    p->close_code = -1;
    memset(st, 0, sizeof *st);
    st_code rc =
        rpc_blocking_stream(ci_router, NULL, BT "ReadChangeStream", st_slice_make(buf, len), NULL,
                            0, CALL_TIMEOUT_MS, on_change, p, st);
    free(buf);
    return rc;
}

static st_code read_changes(const char *id, const char *profile, const char *s, const char *e,
                            int64_t start_us, const char *const *tokens, parts *p, st_err *st) {
    return read_until(id, profile, s, e, start_us, 0, tokens, p, st);
}

static void expect_parts(const char *what, const parts *p, const char *const *want) {
    size_t n = 0;
    while (want[n])
        n++;
    bool ok = p->n == n;
    for (size_t i = 0; ok && i < n; i++)
        ok = strcmp(p->v[i], want[i]) == 0;
    printf("%-62s %zu partition(s)      %s\n", what, p->n, ok ? "ok" : "WRONG");
    for (size_t i = 0; !ok && i < p->n; i++)
        printf("    got %s\n", p->v[i]);
    CHECK(ok, "%s: partitions differ", what);
}

/* want: "range=token" with the token as it would be untagged; the router's tokens carry the
 * tag of table (btu_cs_table_tag) before it. */
static void expect_tokens(const char *what, const char *table, const parts *p,
                          const char *const *want) {
    size_t n = 0;
    while (want[n])
        n++;
    bool ok = p->n_tokens == n && p->close_code == ST_OUT_OF_RANGE;
    uint32_t tag = btu_cs_table_tag(st_slice_cstr(table));
    for (size_t i = 0; ok && i < n; i++) {
        const char *eq = strchr(want[i], '=');
        char full[256];
        snprintf(full, sizeof full, "%.*s=t%08x.%s", (int)(eq - want[i]), want[i], tag, eq + 1);
        ok = strcmp(p->tokens[i], full) == 0;
    }
    printf("%-62s %zu token(s) status %d %s\n", what, p->n_tokens, p->close_code,
           ok ? "ok" : "WRONG");
    for (size_t i = 0; !ok && i < p->n_tokens; i++)
        printf("    got %s\n", p->tokens[i]);
    CHECK(ok, "%s: CloseStream tokens differ", what);
}

/* Splits the tablet of table id starting at `start` on cluster 0's node, at key `at`. */
static void split_tablet(const char *id, const char *start, const char *at) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    const char *addr = ci_topo.clusters[0].nodes[0].addr;
    Strata__Internal__V1__ListTabletsRequest lreq;
    strata__internal__v1__list_tablets_request__init(&lreq);
    lreq.table_name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_err st;
    if (unary(addr, NODE "ListTablets", &lreq.base, &resp, &st) != ST_OK)
        ci_fail("ListTablets: %s", st.msg);
    Strata__Internal__V1__ListTabletsResponse *l =
        strata__internal__v1__list_tablets_response__unpack(NULL, resp.len, resp.data);
    uint64_t tid = 0;
    for (size_t i = 0; l && i < l->n_tablets; i++)
        if (strcmp(l->tablets[i]->table_name, name) == 0 &&
            l->tablets[i]->start_key.len == strlen(start) &&
            memcmp(l->tablets[i]->start_key.data, start, strlen(start)) == 0)
            tid = l->tablets[i]->id;
    strata__internal__v1__list_tablets_response__free_unpacked(l, NULL);
    if (!tid)
        ci_fail("no tablet of %s starts at '%s' on %s", id, start, addr);
    Strata__Internal__V1__SplitTabletRequest sreq;
    strata__internal__v1__split_tablet_request__init(&sreq);
    sreq.id = tid;
    sreq.split_key = (ProtobufCBinaryData){strlen(at), (uint8_t *)at};
    if (unary(addr, NODE "SplitTablet", &sreq.base, &resp, &st) != ST_OK)
        ci_fail("SplitTablet: %s", st.msg);
    st_buf_free(&resp);
}

static void admin_cases(void) {
    st_err st;
    expect_code("CreateTable retention 12h", create_table("bad1", DAY_S / 2, false, NULL, &st), &st,
                ST_INVALID_ARGUMENT, "between 1 day");
    expect_code("CreateTable retention 8d", create_table("bad2", 8 * DAY_S, false, NULL, &st), &st,
                ST_INVALID_ARGUMENT, "between 1 day");
    expect_code("CreateTable cs1 retention 2d, deletion protection",
                create_table("cs1", 2 * DAY_S, true, NULL, &st), &st, ST_OK, NULL);
    pb_table *t = get_table("cs1", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__SCHEMA_VIEW);
    CHECK(retention_of(t) == 2 * DAY_S && t && t->deletion_protection,
          "GetTable SCHEMA_VIEW: retention %" PRId64 "s, protection %d", retention_of(t),
          t ? t->deletion_protection : -1);
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    t = get_table("cs1", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__FULL);
    CHECK(retention_of(t) == 2 * DAY_S && t && t->deletion_protection, "GetTable FULL");
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    t = get_table("cs1", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__NAME_ONLY);
    CHECK(t && !t->change_stream_config && !t->deletion_protection, "GetTable NAME_ONLY");
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    expect_code("DeleteTable cs1 (protected)", delete_table("cs1", &st), &st,
                ST_FAILED_PRECONDITION, "deletion protection");

    static const char *const no_paths[] = {NULL};
    static const char *const bad_paths[] = {"deletion_protection", "granularity", NULL};
    static const char *const cs_paths[] = {"change_stream_config", NULL};
    static const char *const ret_paths[] = {"change_stream_config.retention_period", NULL};
    static const char *const dp_paths[] = {"deletion_protection", NULL};
    expect_code("UpdateTable empty mask", update_table("cs1", no_paths, 0, false, NULL, &st), &st,
                ST_INVALID_ARGUMENT, "update_mask");
    expect_code("UpdateTable mask granularity", update_table("cs1", bad_paths, 0, false, NULL, &st),
                &st, ST_INVALID_ARGUMENT, "\"granularity\"");
    expect_code("UpdateTable retention 0.5d",
                update_table("cs1", ret_paths, DAY_S / 2, false, NULL, &st), &st,
                ST_INVALID_ARGUMENT, "between 1 day");
    expect_code("UpdateTable unknown table", update_table("nope", dp_paths, 0, false, NULL, &st),
                &st, ST_NOT_FOUND, NULL);

    /* Protection off: a finished Operation; GetOperation and ListOperations find it. */
    Google__Longrunning__Operation *op = NULL;
    expect_code("UpdateTable cs1 deletion_protection off",
                update_table("cs1", dp_paths, 0, false, &op, &st), &st, ST_OK, NULL);
    CHECK(op && op->done && op->metadata && strstr(op->metadata->type_url, "UpdateTableMetadata") &&
              op->response && strstr(op->response->type_url, "admin.v2.Table"),
          "UpdateTable answers a finished operation with UpdateTableMetadata and a Table");
    if (op && op->metadata) {
        Google__Bigtable__Admin__V2__UpdateTableMetadata *m =
            google__bigtable__admin__v2__update_table_metadata__unpack(
                NULL, op->metadata->value.len, op->metadata->value.data);
        CHECK(m && strcmp(m->name, INST "/tables/cs1") == 0 && m->start_time && m->end_time,
              "UpdateTableMetadata names the table and has start and end times");
        google__bigtable__admin__v2__update_table_metadata__free_unpacked(m, NULL);
        pb_table *rt = op->response ? google__bigtable__admin__v2__table__unpack(
                                          NULL, op->response->value.len, op->response->value.data)
                                    : NULL;
        CHECK(rt && !rt->deletion_protection && retention_of(rt) == 2 * DAY_S,
              "the operation's Table: protection off, retention kept");
        google__bigtable__admin__v2__table__free_unpacked(rt, NULL);
        Google__Longrunning__GetOperationRequest g;
        google__longrunning__get_operation_request__init(&g);
        g.name = op->name;
        st_buf resp;
        st_buf_init(&resp);
        expect_code("GetOperation of the UpdateTable operation",
                    unary(ci_router, LRO "GetOperation", &g.base, &resp, &st), &st, ST_OK, NULL);
        Google__Longrunning__ListOperationsRequest l;
        google__longrunning__list_operations_request__init(&l);
        l.name = (char *)"operations/" INST "/tables/cs1";
        expect_code("ListOperations of table cs1",
                    unary(ci_router, LRO "ListOperations", &l.base, &resp, &st), &st, ST_OK, NULL);
        Google__Longrunning__ListOperationsResponse *lr =
            google__longrunning__list_operations_response__unpack(NULL, resp.len, resp.data);
        CHECK(lr && lr->n_operations == 1 && strcmp(lr->operations[0]->name, op->name) == 0,
              "ListOperations lists the UpdateTable operation");
        google__longrunning__list_operations_response__free_unpacked(lr, NULL);
        st_buf_free(&resp);
    }
    google__longrunning__operation__free_unpacked(op, NULL);

    /* Streams off and on again through the two mask spellings. */
    expect_code("UpdateTable cs1 change_stream_config unset (off)",
                update_table("cs1", cs_paths, 0, false, NULL, &st), &st, ST_OK, NULL);
    t = get_table("cs1", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__SCHEMA_VIEW);
    CHECK(t && !t->change_stream_config, "streams off after UpdateTable");
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    expect_code("UpdateTable cs1 retention_period 7d (on)",
                update_table("cs1", ret_paths, 7 * DAY_S, false, NULL, &st), &st, ST_OK, NULL);
    t = get_table("cs1", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__SCHEMA_VIEW);
    CHECK(retention_of(t) == 7 * DAY_S, "retention 7d after UpdateTable: %" PRId64 "s",
          retention_of(t));
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    expect_code("UpdateTable cs1 deletion_protection on",
                update_table("cs1", dp_paths, 0, true, NULL, &st), &st, ST_OK, NULL);
    expect_code("DeleteTable cs1 (protected again)", delete_table("cs1", &st), &st,
                ST_FAILED_PRECONDITION, NULL);
    expect_code("UpdateTable cs1 deletion_protection off",
                update_table("cs1", dp_paths, 0, false, NULL, &st), &st, ST_OK, NULL);
    expect_code("DeleteTable cs1", delete_table("cs1", &st), &st, ST_OK, NULL);
}

/* A split the router has not seen (SplitTablet straight on the node, as when the node splits a
 * growing tablet itself): reading a child partition through the router must reach the node,
 * not end in a CloseStream naming the old, already split tablet from the router's stale map. */
static void stale_map_case(void) {
    st_err st;
    parts p;
    split_tablet("cs2", "k", "m");
    int64_t now = st_wall_us();
    st_code rc = read_until("cs2", "", "k", "m", now, now + 300000, NULL, &p, &st);
    printf("%-62s %-20s close %d, %zu new partition(s)\n",
           "ReadChangeStream k..m (split on the node only)", st_code_name(rc), p.close_code, p.n);
    for (size_t i = 0; i < p.n; i++)
        printf("    new partition %s\n", p.v[i]);
    CHECK(rc == ST_OK && p.close_code <= 0 && p.n == 0,
          "k..m after a split the router had not seen: %s \"%s\", CloseStream %d with %zu new "
          "partition(s) (the router answered from a stale tablet map)",
          st_code_name(rc), st.msg, p.close_code, p.n);
}

static void write_row(const char *id, const char *row);

/* A client that follows CloseStream (reads each new partition from its token) is never refused
 * and gets the changes of the rows it asked for: b..h spans tablets ..g and g..k. */
static void follow_close_case(void) {
    st_err st;
    parts p;
    int64_t start = st_wall_us();
    write_row("cs2", "c1");
    st_code rc = read_until("cs2", "", "b", "h", start, start + 60000000, NULL, &p, &st);
    CHECK(rc == ST_OK && p.close_code == ST_OUT_OF_RANGE && p.n == 2 && p.n_tokens == 2,
          "b..h from now: %s \"%s\", close %d, %zu new partition(s), %zu token(s)",
          st_code_name(rc), st.msg, p.close_code, p.n, p.n_tokens);
    parts close = p;
    bool seen = false;
    for (size_t i = 0; i < close.n && i < close.n_tokens; i++) {
        char s[64], e[64];
        const char *dots = strstr(close.v[i], "..");
        snprintf(s, sizeof s, "%.*s", dots ? (int)(dots - close.v[i]) : 0, close.v[i]);
        snprintf(e, sizeof e, "%s", dots ? dots + 2 : "");
        const char *eq = strchr(close.tokens[i], '=');
        const char *const toks[] = {s, e, eq ? eq + 1 : "", NULL};
        rc = read_until("cs2", "", s, e, 0, st_wall_us() + 300000, toks, &p, &st);
        printf("%-62s %-20s close %d\n", "  ReadChangeStream of a new partition from its token",
               st_code_name(rc), p.close_code);
        CHECK(rc == ST_OK && p.close_code <= 0,
              "new partition %s with token %s: %s \"%s\", CloseStream %d (a client following "
              "CloseStream is stuck)",
              close.v[i], close.tokens[i], st_code_name(rc), st.msg, p.close_code);
        seen = seen || strstr(p.rows, "c1,") != NULL;
    }
    CHECK(seen, "the write to c1 did not show in the new partitions of b..h");
    rc = read_until("cs2", "", "g", "h", start, st_wall_us() + 300000, NULL, &p, &st);
    printf("%-62s %-20s close %d\n", "ReadChangeStream g..h (inside tablet g..k)", st_code_name(rc),
           p.close_code);
    CHECK(rc == ST_OK && p.close_code <= 0 && p.n == 0,
          "g..h inside one tablet: %s \"%s\", CloseStream %d", st_code_name(rc), st.msg,
          p.close_code);
}

static void data_cases(void) {
    st_err st;
    parts p;
    create_multi_profile("any");
    expect_code("CreateTable plain (streams off)", create_table("plain", 0, false, NULL, &st), &st,
                ST_OK, NULL);
    static const char *const splits[] = {"g", "p", NULL};
    expect_code("CreateTable cs2 splits g,p, retention 1d",
                create_table("cs2", DAY_S, false, splits, &st), &st, ST_OK, NULL);
    expect_code("Partitions of an unknown table", partitions("nope", "", &p, &st), &st,
                ST_NOT_FOUND, NULL);
    expect_code("Partitions with streams off", partitions("plain", "", &p, &st), &st,
                ST_FAILED_PRECONDITION, "change streams are off");
    expect_code("Partitions with a multi-cluster profile", partitions("cs2", "any", &p, &st), &st,
                ST_INVALID_ARGUMENT, "single-cluster routing");
    expect_code("Partitions with an unknown profile", partitions("cs2", "nope", &p, &st), &st,
                ST_NOT_FOUND, NULL);
    expect_code("Partitions of cs2", partitions("cs2", "", &p, &st), &st, ST_OK, NULL);
    static const char *const three[] = {"..g", "g..p", "p..", NULL};
    expect_parts("  = its tablets", &p, three);

    int64_t t0 = (st_wall_us() / 1000000 - 10) * 1000000; /* within retention (1 day) */
    expect_code("ReadChangeStream with streams off",
                read_changes("plain", "", "", "", t0, NULL, &p, &st), &st, ST_FAILED_PRECONDITION,
                NULL);
    expect_code("ReadChangeStream with a multi-cluster profile",
                read_changes("cs2", "any", "g", "p", t0, NULL, &p, &st), &st, ST_INVALID_ARGUMENT,
                "single-cluster routing");
    expect_code("ReadChangeStream of an unknown table",
                read_changes("nope", "", "g", "p", t0, NULL, &p, &st), &st, ST_NOT_FOUND, NULL);
    static const char *const bad_tok[] = {"g", "p", "2.5", NULL};
    expect_code("ReadChangeStream with a malformed token",
                read_changes("cs2", "", "g", "p", 0, bad_tok, &p, &st), &st, ST_INVALID_ARGUMENT,
                "invalid change stream continuation token");
    static const char *const other_tok[] = {"g", "h", "1.5", NULL};
    expect_code("ReadChangeStream with another partition's token",
                read_changes("cs2", "", "g", "p", 0, other_tok, &p, &st), &st, ST_INVALID_ARGUMENT,
                "partition");

    /* A token the stream of table plain2 handed out names that table: refused for cs2. */
    char foreign[64];
    snprintf(foreign, sizeof foreign, "t%08x.1.5", btu_cs_table_tag(st_slice_cstr("plain2")));
    const char *const foreign_tok[] = {"g", "p", foreign, NULL};
    expect_code("ReadChangeStream with another table's token",
                read_changes("cs2", "", "g", "p", 0, foreign_tok, &p, &st), &st,
                ST_INVALID_ARGUMENT, "another table");

    /* A split on the node: partitions follow the tablets, and the old partition is closed. */
    split_tablet("cs2", "g", "k");
    expect_code("Partitions of cs2 after splitting g..p at k", partitions("cs2", "", &p, &st), &st,
                ST_OK, NULL);
    static const char *const four[] = {"..g", "g..k", "k..p", "p..", NULL};
    expect_parts("  = its tablets", &p, four);
    /* end_time before start_time: the router refuses it for a stale partition (which it would
     * otherwise close itself) and the node for its own tablet */
    expect_code("ReadChangeStream g..p (split) with end_time before start_time",
                read_until("cs2", "", "g", "p", t0, t0 - 1000000, NULL, &p, &st), &st,
                ST_INVALID_ARGUMENT, "before start_time");
    expect_code("ReadChangeStream p.. with end_time before start_time",
                read_until("cs2", "", "p", "", t0, t0 - 1, NULL, &p, &st), &st, ST_INVALID_ARGUMENT,
                "before start_time");
    expect_code("ReadChangeStream g..p (split) from start_time",
                read_changes("cs2", "", "g", "p", t0, NULL, &p, &st), &st, ST_OK, NULL);
    static const char *const kids[] = {"g..k", "k..p", NULL};
    expect_parts("  CloseStream new partitions", &p, kids);
    char tk[4][96]; /* the pieces' tokens: 1.(T-1) */
    snprintf(tk[0], sizeof tk[0], "g..k=1.%" PRId64, t0 - 1);
    snprintf(tk[1], sizeof tk[1], "k..p=1.%" PRId64, t0 - 1);
    snprintf(tk[2], sizeof tk[2], "b..g=1.%" PRId64, t0 - 1);
    snprintf(tk[3], sizeof tk[3], "g..h=1.%" PRId64, t0 - 1);
    const char *const kid_toks[] = {tk[0], tk[1], NULL};
    expect_tokens("  CloseStream tokens 1.(T-1)", "cs2", &p, kid_toks);
    static const char *const tok[] = {"g", "p", "1.500.900.6a", NULL};
    expect_code("ReadChangeStream g..p (split) from a token",
                read_changes("cs2", "", "g", "p", 0, tok, &p, &st), &st, ST_OK, NULL);
    static const char *const kid_toks2[] = {"g..k=1.500.900.6a", "k..p=1.500.900.6a", NULL};
    expect_tokens("  CloseStream: the token as it was, for each child", "cs2", &p, kid_toks2);
    expect_code("ReadChangeStream b..h (spans two tablets)",
                read_changes("cs2", "", "b", "h", t0, NULL, &p, &st), &st, ST_OK, NULL);
    static const char *const spans[] = {"b..g", "g..h", NULL};
    expect_parts("  CloseStream new partitions: the pieces of b..h", &p, spans);
    const char *const span_toks[] = {tk[2], tk[3], NULL};
    expect_tokens("  CloseStream tokens for the pieces of b..h", "cs2", &p, span_toks);

    follow_close_case();
    stale_map_case();
}

#define E2E_WINDOW_US 1000000 /* each end-to-end read ends this long after it starts */
#define E2E_TRIES_MAX 30      /* hang guard while replication brings a write to west */

/* MutateRow through app profile profile ("" = default: cluster 0). */
static void write_row_via(const char *id, const char *row, const char *profile) {
    bt_client cl;
    ci_client(&cl, profile);
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf", st_slice_cstr("q"), -1, st_slice_cstr("v"));
    st_err st;
    st_code rc = bt_mutate_row(&cl, id, st_slice_cstr(row), &m, &st);
    bt_muts_deinit(&m);
    if (rc != ST_OK)
        ci_fail("MutateRow %s/%s: %s %s", id, row, st_code_name(rc), st.msg);
}

static void write_row(const char *id, const char *row) {
    write_row_via(id, row, "");
}

/* Reads partition [s, e) of id through profile from start_us, each read ending E2E_WINDOW_US
 * after it starts, until a DataChange of row shows (replication may take a moment). */
static void expect_change(const char *what, const char *id, const char *profile, const char *s,
                          const char *e, int64_t start_us, const char *row) {
    parts p;
    st_err st;
    char want[64];
    snprintf(want, sizeof want, "%s,", row);
    st_code rc = ST_OK;
    bool seen = false;
    int tries = 0;
    for (; tries < E2E_TRIES_MAX && !seen && rc == ST_OK; tries++) {
        rc = read_until(id, profile, s, e, start_us, st_wall_us() + E2E_WINDOW_US, NULL, &p, &st);
        seen = strstr(p.rows, want) != NULL;
    }
    printf("%-62s %-20s %s (%d read(s) of %d ms)\n", what, st_code_name(rc), seen ? "ok" : "WRONG",
           tries, E2E_WINDOW_US / 1000);
    CHECK(seen && rc == ST_OK && p.close_code <= 0, "%s: %s \"%s\", rows \"%s\", close %d", what,
          st_code_name(rc), st.msg, p.rows, p.close_code);
}

/* Through the nodes: records of writes reach the client through the router, in each cluster,
 * for a table whose streams UpdateTable turned on (so every node of every cluster took it). */
static void end_to_end_cases(void) {
    st_err st;
    parts p;
    bt_client cl;
    ci_client(&cl, "");
    expect_code("CreateAppProfile w (single-cluster to west)",
                bt_create_app_profile(&cl, "w", ci_topo.clusters[1].id, &st), &st, ST_OK, NULL);
    int64_t before = st_wall_us();
    write_row("cs2", "h1");
    expect_change("ReadChangeStream g..k on east: the write to h1", "cs2", "", "g", "k", before,
                  "h1");
    expect_code("Partitions of cs2 on west (not split there)", partitions("cs2", "w", &p, &st), &st,
                ST_OK, NULL);
    static const char *const three[] = {"..g", "g..p", "p..", NULL};
    expect_parts("  = west's tablets", &p, three);
    expect_change("ReadChangeStream g..p on west: the write, replicated", "cs2", "w", "g", "p",
                  before, "h1");

    static const char *const ret_paths[] = {"change_stream_config.retention_period", NULL};
    expect_code("CreateTable cs3 (streams off)", create_table("cs3", 0, false, NULL, &st), &st,
                ST_OK, NULL);
    long long t0 = ci_now_ms();
    expect_code("UpdateTable cs3 retention 1d (on)",
                update_table("cs3", ret_paths, DAY_S, false, NULL, &st), &st, ST_OK, NULL);
    printf("  (UpdateTable answered after %lld ms: every node of both clusters took it)\n",
           ci_now_ms() - t0);
    int64_t on = st_wall_us();
    write_row("cs3", "x1");
    expect_change("ReadChangeStream of cs3 on east after UpdateTable", "cs3", "", "", "", on, "x1");
    expect_change("ReadChangeStream of cs3 on west after UpdateTable", "cs3", "w", "", "", on,
                  "x1");
    /* ModifyColumnFamilies pushes the recorded table, config included: streams stay on and
     * their history keeps its start. */
    expect_code("ModifyColumnFamilies cs3: create cf2",
                bt_create_family(&cl, "cs3", "cf2", "", &st), &st, ST_OK, NULL);
    pb_table *t = get_table("cs3", GOOGLE__BIGTABLE__ADMIN__V2__TABLE__VIEW__SCHEMA_VIEW);
    CHECK(retention_of(t) == DAY_S && t && t->n_column_families == 2,
          "after ModifyColumnFamilies: retention %" PRId64 "s", retention_of(t));
    google__bigtable__admin__v2__table__free_unpacked(t, NULL);
    write_row("cs3", "x2");
    expect_change("ReadChangeStream of cs3 from the same start: the next write", "cs3", "", "", "",
                  on, "x2");
}

static st_code drop_prefix(const char *id, const char *prefix, st_err *st) {
    char name[BT_NAME_MAX];
    table_name(id, name, sizeof name);
    Google__Bigtable__Admin__V2__DropRowRangeRequest req;
    google__bigtable__admin__v2__drop_row_range_request__init(&req);
    req.name = name;
    req.target_case = GOOGLE__BIGTABLE__ADMIN__V2__DROP_ROW_RANGE_REQUEST__TARGET_ROW_KEY_PREFIX;
    req.row_key_prefix = (ProtobufCBinaryData){strlen(prefix), (uint8_t *)prefix};
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = unary(ci_router, TA "DropRowRange", &req.base, &resp, st);
    st_buf_free(&resp);
    return rc;
}

static size_t count_of(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *q = strstr(hay, needle); q; q = strstr(q + 1, needle))
        n++;
    return n;
}

/* The stream of cluster profile ("" = east, "w" = west) from start_us once it holds the marker
 * writes q1 (east) and q2 (west): every dropped row once, from east, the cluster that took the
 * DropRowRange. */
static void expect_drops(const char *what, const char *profile, int64_t start_us) {
    parts p;
    st_err st;
    st_code rc = ST_OK;
    bool seen = false;
    for (int tries = 0; tries < E2E_TRIES_MAX && !seen && rc == ST_OK; tries++) {
        rc = read_until("csd", profile, "", "", start_us, st_wall_us() + E2E_WINDOW_US, NULL, &p,
                        &st);
        seen = strstr(p.rows, "q1,") && strstr(p.rows, "q2,");
    }
    bool ok = seen && rc == ST_OK;
    for (int i = 0; i < 3 && ok; i++) {
        char row[8], want[80];
        snprintf(row, sizeof row, "p%d@", i);
        snprintf(want, sizeof want, "p%d@%s,", i, ci_topo.clusters[0].id);
        ok = count_of(p.drops, row) == 1 && strstr(p.drops, want);
    }
    printf("%-62s %-20s %s\n", what, st_code_name(rc), ok ? "ok" : "WRONG");
    CHECK(ok, "%s: %s \"%s\", markers %s, deletes \"%s\" (want p0..p2 once each from %s)", what,
          st_code_name(rc), st.msg, seen ? "seen" : "missing", p.drops, ci_topo.clusters[0].id);
}

/* DropRowRange with streams on: each cluster's stream records every dropped row once, with the
 * cluster that took the call (the default profile's) as source. */
static void drop_cases(void) {
    st_err st;
    expect_code("CreateTable csd retention 1d", create_table("csd", DAY_S, false, NULL, &st), &st,
                ST_OK, NULL);
    int64_t before = st_wall_us();
    write_row("csd", "p0");
    write_row("csd", "p1");
    write_row("csd", "p2");
    expect_change("ReadChangeStream of csd on west: p2, replicated", "csd", "w", "", "", before,
                  "p2");
    int64_t start = st_wall_us();
    expect_code("DropRowRange csd prefix p", drop_prefix("csd", "p", &st), &st, ST_OK, NULL);
    write_row_via("csd", "q1", "");
    write_row_via("csd", "q2", "w");
    expect_drops("  east's stream: p0..p2 dropped once each, source east", "", start);
    expect_drops("  west's stream: p0..p2 dropped once each, source east", "w", start);
}

int main(int argc, char **argv) {
    int rc = ci_init("changes_router_test", argc, argv);
    if (rc)
        return rc;
    ci_up(2, 1);
    admin_cases();
    data_cases();
    end_to_end_cases();
    drop_cases();
    if (g_failures)
        ci_fail("%d check(s) failed", g_failures);
    ci_down();
    printf("changes_router_test: all checks passed\n");
    return 0;
}
