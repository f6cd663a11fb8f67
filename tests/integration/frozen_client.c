/* frozen_client.c — one call through a router with an app profile id, for
 * frozen_cluster_test.sh (cbt retries UNAVAILABLE by itself and has no app-profile flag on its
 * writes). Prints the call's gRPC status name and message on one line ("OK" when it succeeded;
 * for MutateRows the first failed entry's status) and exits 0 whenever the call ran, 2 on bad
 * usage. Instance projects/p/instances/i; the client's deadline is 60 s (a hang guard: the test
 * asserts on the status and message, never on time).
 *   frozen_client ADDR TABLE_ID PROFILE_ID read|write|writes|delete|deletes|iwrites
 *   frozen_client ADDR TABLE_ID PROFILE_ID iwrite ROW
 *     read: ReadRows of the whole table; write: MutateRow of row w (cf:c at server time);
 *     writes: MutateRows of rows wa and wb; delete, deletes: the same with DeleteFromRow;
 *     iwrite: MutateRow of ROW, iwrites: MutateRows of rows a1 .. z1, both with an explicit
 *     timestamp (idempotent: the router retries them). iwrites first prints a line per response
 *     message in arrival order, "MSG ok=N failed=M", then "FAILED_ROWS r1,r2,..." (the rows whose
 *     status was not OK) before the status line; an entry given no status, or two, fails the
 *     call (INTERNAL). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define CALL_TIMEOUT_MS 60000

static Google__Bigtable__V2__Mutation__SetCell set_cell = {
    .base = PROTOBUF_C_MESSAGE_INIT(&google__bigtable__v2__mutation__set_cell__descriptor),
    .family_name = (char *)"cf",
    .column_qualifier = {1, (uint8_t *)"c"},
    .timestamp_micros = -1,
    .value = {1, (uint8_t *)"v"}};

static Google__Bigtable__V2__Mutation__DeleteFromRow delete_row = {
    .base = PROTOBUF_C_MESSAGE_INIT(&google__bigtable__v2__mutation__delete_from_row__descriptor)};

static Google__Bigtable__V2__Mutation__SetCell set_cell_at = {
    .base = PROTOBUF_C_MESSAGE_INIT(&google__bigtable__v2__mutation__set_cell__descriptor),
    .family_name = (char *)"cf",
    .column_qualifier = {1, (uint8_t *)"c"},
    .timestamp_micros = 1000,
    .value = {1, (uint8_t *)"v"}};

static bool g_delete;           /* the calls delete the rows instead of setting cf:c */
static bool g_at;               /* the calls set cf:c at an explicit timestamp */
static const char *g_row = "w"; /* the row of write and delete */

static void init_mutation(Google__Bigtable__V2__Mutation *m) {
    google__bigtable__v2__mutation__init(m);
    if (g_delete) {
        m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
        m->delete_from_row = &delete_row;
        return;
    }
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = g_at ? &set_cell_at : &set_cell;
}

/* Collects the first failed entry of MutateRows answers. */
typedef struct entries_ans {
    st_code code;
    st_err err;
} entries_ans;

static void entries_msg(st_slice msg, void *arg) {
    entries_ans *a = arg;
    Google__Bigtable__V2__MutateRowsResponse *r =
        google__bigtable__v2__mutate_rows_response__unpack(NULL, msg.len, msg.data);
    if (!r) {
        a->code = st_err_set(&a->err, ST_INTERNAL, "unreadable MutateRowsResponse");
        return;
    }
    for (size_t i = 0; i < r->n_entries && a->code == ST_OK; i++)
        if (r->entries[i]->status && r->entries[i]->status->code != 0)
            a->code =
                st_err_set(&a->err, (st_code)r->entries[i]->status->code, "%s",
                           r->entries[i]->status->message ? r->entries[i]->status->message : "");
    google__bigtable__v2__mutate_rows_response__free_unpacked(r, NULL);
}

/* iwrites: the statuses of each message as it arrives, every entry's code. */
#define SPREAD_ROWS 26
typedef struct spread_ans {
    int code[SPREAD_ROWS]; /* -1: no status yet */
    bool bad;              /* an index out of range, or a second status for an entry */
} spread_ans;

static void spread_msg(st_slice msg, void *arg) {
    spread_ans *a = arg;
    Google__Bigtable__V2__MutateRowsResponse *r =
        google__bigtable__v2__mutate_rows_response__unpack(NULL, msg.len, msg.data);
    if (!r) {
        a->bad = true;
        return;
    }
    size_t ok = 0, failed = 0;
    for (size_t i = 0; i < r->n_entries; i++) {
        int64_t k = r->entries[i]->index;
        int code = r->entries[i]->status ? r->entries[i]->status->code : 0;
        if (k < 0 || k >= SPREAD_ROWS || a->code[k] != -1) {
            a->bad = true;
            continue;
        }
        a->code[k] = code;
        if (code == 0)
            ok++;
        else
            failed++;
    }
    printf("MSG ok=%zu failed=%zu\n", ok, failed);
    fflush(stdout);
    google__bigtable__v2__mutate_rows_response__free_unpacked(r, NULL);
}

static void ignore_msg(st_slice msg, void *arg) {
    (void)msg;
    (void)arg;
}

static st_code call_read(const char *addr, const char *table, const char *profile, st_err *st) {
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__read_rows_request__pack(&req, buf);
    return rpc_blocking_stream(addr, NULL, "/google.bigtable.v2.Bigtable/ReadRows",
                               st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, ignore_msg, NULL,
                               st);
}

static st_code call_write(const char *addr, const char *table, const char *profile, st_err *st) {
    Google__Bigtable__V2__Mutation m, *mp[1] = {&m};
    init_mutation(&m);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.row_key = (ProtobufCBinaryData){strlen(g_row), (uint8_t *)g_row};
    req.mutations = mp;
    req.n_mutations = 1;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__mutate_row_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = rpc_blocking_unary(addr, NULL, "/google.bigtable.v2.Bigtable/MutateRow",
                                    st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, &resp, st);
    st_buf_free(&resp);
    return rc;
}

static st_code call_writes(const char *addr, const char *table, const char *profile, st_err *st) {
    Google__Bigtable__V2__Mutation m, *mp[1] = {&m};
    init_mutation(&m);
    Google__Bigtable__V2__MutateRowsRequest__Entry e[2], *ep[2] = {&e[0], &e[1]};
    const char *rows[2] = {"wa", "wb"};
    for (int i = 0; i < 2; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&e[i]);
        e[i].row_key = (ProtobufCBinaryData){2, (uint8_t *)rows[i]};
        e[i].mutations = mp;
        e[i].n_mutations = 1;
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.entries = ep;
    req.n_entries = 2;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    entries_ans a = {ST_OK, {0}};
    st_code rc =
        rpc_blocking_stream(addr, NULL, "/google.bigtable.v2.Bigtable/MutateRows",
                            st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, entries_msg, &a, st);
    if (rc == ST_OK && a.code != ST_OK) {
        *st = a.err;
        rc = a.code;
    }
    return rc;
}

/* MutateRows of rows a1 .. z1, one per tablet of a table split at b .. y. */
static st_code call_spread(const char *addr, const char *table, const char *profile, st_err *st) {
    Google__Bigtable__V2__Mutation m, *mp[1] = {&m};
    init_mutation(&m);
    Google__Bigtable__V2__MutateRowsRequest__Entry e[SPREAD_ROWS], *ep[SPREAD_ROWS];
    char rows[SPREAD_ROWS][2];
    for (int i = 0; i < SPREAD_ROWS; i++) {
        rows[i][0] = (char)('a' + i);
        rows[i][1] = '1';
        google__bigtable__v2__mutate_rows_request__entry__init(&e[i]);
        e[i].row_key = (ProtobufCBinaryData){2, (uint8_t *)rows[i]};
        e[i].mutations = mp;
        e[i].n_mutations = 1;
        ep[i] = &e[i];
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.entries = ep;
    req.n_entries = SPREAD_ROWS;
    uint8_t buf[4096];
    size_t len = google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    spread_ans a = {.bad = false};
    for (int i = 0; i < SPREAD_ROWS; i++)
        a.code[i] = -1;
    st_code rc =
        rpc_blocking_stream(addr, NULL, "/google.bigtable.v2.Bigtable/MutateRows",
                            st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, spread_msg, &a, st);
    printf("FAILED_ROWS ");
    for (int i = 0, first = 1; i < SPREAD_ROWS; i++)
        if (a.code[i] != 0) {
            printf("%s%.2s", first ? "" : ",", rows[i]);
            first = 0;
            a.bad = a.bad || (rc == ST_OK && a.code[i] == -1);
        }
    printf("\n");
    if (rc == ST_OK && a.bad)
        rc = st_err_set(st, ST_INTERNAL, "an entry got no status, or more than one");
    return rc;
}

int main(int argc, char **argv) {
    bool with_row = argc == 6 && strcmp(argv[4], "iwrite") == 0;
    if (argc != 5 && !with_row) {
        fprintf(stderr, "usage: frozen_client ADDR TABLE_ID PROFILE_ID "
                        "read|write|writes|delete|deletes|iwrites, or ... iwrite ROW\n");
        return 2;
    }
    char table[512];
    snprintf(table, sizeof table, "projects/p/instances/i/tables/%s", argv[2]);
    st_err st = {0};
    st_code rc;
    g_delete = strncmp(argv[4], "delete", 6) == 0;
    g_at = argv[4][0] == 'i';
    if (with_row)
        g_row = argv[5];
    if (strcmp(argv[4], "read") == 0)
        rc = call_read(argv[1], table, argv[3], &st);
    else if (strcmp(argv[4], "write") == 0 || strcmp(argv[4], "delete") == 0 || with_row)
        rc = call_write(argv[1], table, argv[3], &st);
    else if (strcmp(argv[4], "writes") == 0 || strcmp(argv[4], "deletes") == 0)
        rc = call_writes(argv[1], table, argv[3], &st);
    else if (strcmp(argv[4], "iwrites") == 0)
        rc = call_spread(argv[1], table, argv[3], &st);
    else {
        fprintf(stderr,
                "frozen_client: unknown call '%s' (read, write, writes, delete, deletes, iwrite "
                "or iwrites)\n",
                argv[4]);
        return 2;
    }
    printf("%s %s\n", st_code_name(rc), rc == ST_OK ? "" : st.msg);
    return 0;
}
