/*
 * Proves that resource names are checked the way Cloud Bigtable checks them, on the router's
 * port and on a node's port alike: a string field with an embedded NUL byte (a table name
 * "dur\0evil", a table id "a\0b", a family "cf\0x", an app profile id "p\0q") is refused with
 * INVALID_ARGUMENT instead of being cut at the NUL (which would write into "dur", create "a" or
 * use family "cf"); a table id outside [_a-zA-Z0-9][-_.a-zA-Z0-9]* or over 50 characters is
 * INVALID_ARGUMENT on every method; and the router answers NOT_FOUND for a project or instance
 * it does not serve (CreateTable, GetTable, ListTables, data calls) instead of acting on it.
 * Requests are hand-encoded protobuf (protobuf-c cannot send a NUL inside a string) sent with
 * rpc_blocking_unary; afterwards the table "dur" must still be empty and no table "a" exist.
 *
 *   names_test <build>/ops/strata        (`strata up --clusters 1 --nodes 1` in a temp dir)
 * Exit 77 when strata, strata-node or strata-router is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos_util.h"
#include "strata/rpc.h"

#define BT "/google.bigtable.v2.Bigtable/"
#define TA "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define IA "/google.bigtable.admin.v2.BigtableInstanceAdmin/"
#define CALL_TIMEOUT_MS 10000
#define INST "projects/p/instances/i"

/* ---- hand-encoded protobuf (length-delimited fields and varints) ---- */

static void put_varint(st_buf *b, uint64_t v) {
    while (v >= 0x80) {
        st_buf_append_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    st_buf_append_byte(b, (uint8_t)v);
}

static void put_bytes(st_buf *b, uint32_t field, const void *data, size_t len) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, len);
    st_buf_append(b, data, len);
}

/* A string given with its length, so it may hold NUL bytes. */
#define PUT_LIT(b, field, lit) put_bytes((b), (field), (lit), sizeof(lit) - 1)

static void put_msg(st_buf *b, uint32_t field, const st_buf *m) {
    put_bytes(b, field, m->data, m->len);
}

/* MutateRowRequest{table_name, row_key "r1", mutations[SetCell{family, "q", ts 1000, "v"}],
 * app_profile_id}. */
static void mutate_row_req(st_buf *out, const char *table, size_t table_len, const char *family,
                           size_t family_len, const char *profile, size_t profile_len) {
    st_buf set, mut;
    st_buf_init(&set);
    st_buf_init(&mut);
    put_bytes(&set, 1, family, family_len);
    PUT_LIT(&set, 2, "q");
    put_varint(&set, 3 << 3 | 0);
    put_varint(&set, 1000);
    PUT_LIT(&set, 4, "v");
    put_msg(&mut, 1, &set);
    put_bytes(out, 1, table, table_len);
    PUT_LIT(out, 2, "r1");
    put_msg(out, 3, &mut);
    if (profile_len)
        put_bytes(out, 4, profile, profile_len);
    st_buf_free(&set);
    st_buf_free(&mut);
}

static st_code call(const char *addr, const char *path, const st_buf *req, st_err *st) {
    st_buf resp;
    st_buf_init(&resp);
    memset(st, 0, sizeof *st);
    st_code rc = rpc_blocking_unary(addr, NULL, path, st_buf_slice(req), NULL, 0, CALL_TIMEOUT_MS,
                                    &resp, st);
    st_buf_free(&resp);
    return rc;
}

static int g_failures;

static void expect(const char *where, const char *what, st_code got, const st_err *st,
                   st_code want) {
    bool ok = got == want;
    printf("%-6s %-58s %-18s %s%s\n", where, what, st_code_name(got), ok ? "" : "WANT ",
           ok ? "" : st_code_name(want));
    if (!ok) {
        printf("       message: %s\n", st->msg);
        g_failures++;
    }
}

/* ---- the cases, each sent to the router and to the node ---- */

typedef struct target {
    const char *where;
    const char *addr;
    bool router;
} target;

static void data_cases(const target *t) {
    st_buf b;
    st_err st;
    st_buf_init(&b);
    static const char nul_table[] = INST "/tables/dur\0evil";
    mutate_row_req(&b, nul_table, sizeof nul_table - 1, "cf", 2, "", 0);
    expect(t->where, "MutateRow table_name \"dur\\0evil\"", call(t->addr, BT "MutateRow", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    static const char dur[] = INST "/tables/dur";
    st_buf_reset(&b);
    mutate_row_req(&b, dur, sizeof dur - 1, "cf\0x", 4, "", 0);
    expect(t->where, "MutateRow family \"cf\\0x\"", call(t->addr, BT "MutateRow", &b, &st), &st,
           ST_INVALID_ARGUMENT);

    st_buf entry, set, mut;
    st_buf_init(&entry);
    st_buf_init(&set);
    st_buf_init(&mut);
    PUT_LIT(&set, 1, "cf");
    PUT_LIT(&set, 2, "q");
    PUT_LIT(&set, 4, "v");
    put_msg(&mut, 1, &set);
    PUT_LIT(&entry, 1, "r2");
    put_msg(&entry, 2, &mut);
    st_buf_reset(&b); /* MutateRowsRequest: table_name 1, entries 2 */
    put_bytes(&b, 1, nul_table, sizeof nul_table - 1);
    put_msg(&b, 2, &entry);
    expect(t->where, "MutateRows table_name \"dur\\0evil\"",
           call(t->addr, BT "MutateRows", &b, &st), &st, ST_INVALID_ARGUMENT);
    st_buf_free(&entry);
    st_buf_free(&set);
    st_buf_free(&mut);

    static const char bad_id[] = INST "/tables/-dur";
    st_buf_reset(&b);
    mutate_row_req(&b, bad_id, sizeof bad_id - 1, "cf", 2, "", 0);
    expect(t->where, "MutateRow table id \"-dur\"", call(t->addr, BT "MutateRow", &b, &st), &st,
           ST_INVALID_ARGUMENT);

    char long_name[160];
    int n = snprintf(long_name, sizeof long_name, INST "/tables/%051d", 7);
    st_buf_reset(&b);
    mutate_row_req(&b, long_name, (size_t)n, "cf", 2, "", 0);
    expect(t->where, "MutateRow table id of 51 characters", call(t->addr, BT "MutateRow", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, INST "/tables/dur\0evil");
    expect(t->where, "ReadRows table_name \"dur\\0evil\"", call(t->addr, BT "ReadRows", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, INST "/tables/dur\0evil");
    expect(t->where, "SampleRowKeys table_name \"dur\\0evil\"",
           call(t->addr, BT "SampleRowKeys", &b, &st), &st, ST_INVALID_ARGUMENT);

    if (t->router) {
        st_buf_reset(&b);
        mutate_row_req(&b, dur, sizeof dur - 1, "cf", 2, "p\0q", 3);
        expect(t->where, "MutateRow app_profile_id \"p\\0q\"",
               call(t->addr, BT "MutateRow", &b, &st), &st, ST_INVALID_ARGUMENT);
        static const char other[] = "projects/p/instances/other/tables/dur";
        st_buf_reset(&b);
        mutate_row_req(&b, other, sizeof other - 1, "cf", 2, "", 0);
        expect(t->where, "MutateRow in instance \"other\"", call(t->addr, BT "MutateRow", &b, &st),
               &st, ST_NOT_FOUND);
    }
    st_buf_free(&b);
}

static void admin_cases(const target *t) {
    st_buf b;
    st_err st;
    st_buf_init(&b);
    PUT_LIT(&b, 1, INST);
    PUT_LIT(&b, 2, "a\0b");
    expect(t->where, "CreateTable table_id \"a\\0b\"", call(t->addr, TA "CreateTable", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, INST "/tables/dur\0evil");
    expect(t->where, "GetTable name \"dur\\0evil\"", call(t->addr, TA "GetTable", &b, &st), &st,
           ST_INVALID_ARGUMENT);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, INST "/tables/dur\0evil");
    expect(t->where, "DeleteTable name \"dur\\0evil\"", call(t->addr, TA "DeleteTable", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, INST "/tables/.dur");
    expect(t->where, "GetTable table id \".dur\"", call(t->addr, TA "GetTable", &b, &st), &st,
           ST_INVALID_ARGUMENT);

    if (!t->router) {
        st_buf_free(&b);
        return;
    }
    st_buf_reset(&b);
    PUT_LIT(&b, 1, "projects/other/instances/i");
    PUT_LIT(&b, 2, "t2");
    expect(t->where, "CreateTable in project \"other\"", call(t->addr, TA "CreateTable", &b, &st),
           &st, ST_NOT_FOUND);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, "projects/p/instances/other/tables/dur");
    expect(t->where, "GetTable in instance \"other\"", call(t->addr, TA "GetTable", &b, &st), &st,
           ST_NOT_FOUND);

    st_buf_reset(&b);
    PUT_LIT(&b, 1, "projects/p/instances/other");
    expect(t->where, "ListTables of instance \"other\"", call(t->addr, TA "ListTables", &b, &st),
           &st, ST_NOT_FOUND);

    st_buf_reset(&b); /* CreateAppProfileRequest: parent 1, app_profile_id 2, app_profile 3 */
    PUT_LIT(&b, 1, INST);
    PUT_LIT(&b, 2, "x\0y");
    expect(t->where, "CreateAppProfile id \"x\\0y\"", call(t->addr, IA "CreateAppProfile", &b, &st),
           &st, ST_INVALID_ARGUMENT);

    st_buf_reset(&b); /* GetClusterRequest: name 1 */
    PUT_LIT(&b, 1, INST "/clusters/east\0x");
    expect(t->where, "GetCluster name \"east\\0x\"", call(t->addr, IA "GetCluster", &b, &st), &st,
           ST_INVALID_ARGUMENT);
    st_buf_free(&b);
}

static void count_row(const bt_row *row, void *arg) {
    (void)row;
    (*(size_t *)arg)++;
}

/* Nothing may have landed in "dur", and no table "a" (the prefix of "a\0b") may exist. */
static void check_untouched(void) {
    bt_client c;
    ci_client(&c, "");
    size_t rows = 0;
    st_err st;
    st_code rc = bt_read_rows(&c, "dur", &(bt_read_req){0}, count_row, &rows, &st);
    if (rc != ST_OK || rows != 0) {
        printf("table dur: %s, %zu row(s) (want OK, 0 rows)\n", st_code_name(rc), rows);
        g_failures++;
    }
    st_buf b;
    st_buf_init(&b);
    PUT_LIT(&b, 1, INST "/tables/a");
    rc = call(ci_router, TA "GetTable", &b, &st);
    st_buf_free(&b);
    expect("router", "GetTable \"a\" (must not exist)", rc, &st, ST_NOT_FOUND);
}

int main(int argc, char **argv) {
    int rc = ci_init("names_test", argc, argv);
    if (rc)
        return rc;
    ci_up(1, 1);
    bt_client c;
    ci_client(&c, "");
    st_err st;
    if (bt_create_table(&c, "dur", "cf", &st) != ST_OK)
        ci_fail("CreateTable dur: %s", st.msg);
    target ts[] = {{"router", ci_router, true}, {"node", ci_topo.clusters[0].nodes[0].addr, false}};
    for (size_t i = 0; i < 2; i++) {
        data_cases(&ts[i]);
        admin_cases(&ts[i]);
    }
    check_untouched();
    if (g_failures)
        ci_fail("%d name check(s) answered wrongly (see above)", g_failures);
    ci_down();
    printf("names_test: every malformed or foreign name refused\n");
    return 0;
}
