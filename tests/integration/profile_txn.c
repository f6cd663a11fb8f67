/* profile_txn.c — calls profiles_test.sh needs and cbt cannot make: one single-row transaction
 * through a router with an app profile id (cbt has no check-and-mutate command and no app-profile
 * flag on its increment), and an UpdateAppProfile carrying an etag followed by GetOperation on
 * the operation it returns. Prints the call's gRPC status name and message on one line and exits
 * 0 whenever the call ran (whatever its status), 2 on bad usage. Instance projects/p/instances/i.
 *   profile_txn ADDR TABLE_ID PROFILE_ID cam|rmw ROW
 *     cam: CheckAndMutateRow without predicate (true branch sets cf:cam=1);
 *     rmw: ReadModifyWriteRow incrementing cf:n by 1.
 *   profile_txn ADDR - PROFILE_ID update ETAG
 *     UpdateAppProfile (mask: description) with that etag; when OK, a second line
 *     "GETOP <status> done=<0|1> <response type_url> <name>" from GetOperation of the returned
 *     name.
 *   profile_txn ADDR - OPERATION_NAME getop -
 *     GetOperation only, printing that GETOP line. */
#include <stdio.h>
#include <string.h>

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/rpc.h"

#define TIMEOUT_MS 60000

static size_t pack_cam(const char *table, const char *profile, const char *row, st_buf *out) {
    Google__Bigtable__V2__Mutation__SetCell set;
    google__bigtable__v2__mutation__set_cell__init(&set);
    set.family_name = (char *)"cf";
    set.column_qualifier = (ProtobufCBinaryData){3, (uint8_t *)"cam"};
    set.timestamp_micros = -1;
    set.value = (ProtobufCBinaryData){1, (uint8_t *)"1"};
    Google__Bigtable__V2__Mutation m;
    google__bigtable__v2__mutation__init(&m);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &set;
    Google__Bigtable__V2__Mutation *muts[1] = {&m};
    Google__Bigtable__V2__CheckAndMutateRowRequest req;
    google__bigtable__v2__check_and_mutate_row_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    req.n_true_mutations = 1;
    req.true_mutations = muts;
    size_t len = google__bigtable__v2__check_and_mutate_row_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return 0;
    return out->len = google__bigtable__v2__check_and_mutate_row_request__pack(&req, out->data);
}

static size_t pack_rmw(const char *table, const char *profile, const char *row, st_buf *out) {
    Google__Bigtable__V2__ReadModifyWriteRule rule;
    google__bigtable__v2__read_modify_write_rule__init(&rule);
    rule.family_name = (char *)"cf";
    rule.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"n"};
    rule.rule_case = GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_INCREMENT_AMOUNT;
    rule.increment_amount = 1;
    Google__Bigtable__V2__ReadModifyWriteRule *rules[1] = {&rule};
    Google__Bigtable__V2__ReadModifyWriteRowRequest req;
    google__bigtable__v2__read_modify_write_row_request__init(&req);
    req.table_name = (char *)table;
    req.app_profile_id = (char *)profile;
    req.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    req.n_rules = 1;
    req.rules = rules;
    size_t len = google__bigtable__v2__read_modify_write_row_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return 0;
    return out->len = google__bigtable__v2__read_modify_write_row_request__pack(&req, out->data);
}

/* GetOperation(name): prints "GETOP <status> done=<d> <type_url> <name>". */
static void get_op(const char *addr, const char *name) {
    Google__Longrunning__GetOperationRequest req;
    google__longrunning__get_operation_request__init(&req);
    req.name = (char *)name;
    uint8_t buf[1024];
    if (google__longrunning__get_operation_request__get_packed_size(&req) > sizeof buf)
        return;
    size_t len = google__longrunning__get_operation_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    st_code rc = rpc_blocking_unary(addr, NULL, "/google.longrunning.Operations/GetOperation",
                                    st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, &resp, &status);
    Google__Longrunning__Operation *op =
        rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    printf("GETOP %s done=%d %s %s\n", st_code_name(rc), op ? op->done : 0,
           op && op->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_RESPONSE
               ? op->response->type_url
               : "-",
           name);
    if (op)
        google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&resp);
}

/* UpdateAppProfile of the description with an etag, then GetOperation of the answer. */
static int update(const char *addr, const char *profile, const char *etag) {
    char name[512];
    snprintf(name, sizeof name, "projects/p/instances/i/appProfiles/%s", profile);
    Google__Bigtable__Admin__V2__AppProfile p;
    google__bigtable__admin__v2__app_profile__init(&p);
    p.name = name;
    p.etag = (char *)etag;
    p.description = (char *)"etag-test";
    char *paths[1] = {(char *)"description"};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.n_paths = 1;
    mask.paths = paths;
    Google__Bigtable__Admin__V2__UpdateAppProfileRequest req;
    google__bigtable__admin__v2__update_app_profile_request__init(&req);
    req.app_profile = &p;
    req.update_mask = &mask;
    uint8_t buf[2048];
    if (google__bigtable__admin__v2__update_app_profile_request__get_packed_size(&req) > sizeof buf)
        return 2;
    size_t len = google__bigtable__admin__v2__update_app_profile_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_err status = {0};
    st_code rc = rpc_blocking_unary(
        addr, NULL, "/google.bigtable.admin.v2.BigtableInstanceAdmin/UpdateAppProfile",
        st_slice_make(buf, len), NULL, 0, TIMEOUT_MS, &resp, &status);
    printf("%s %s\n", st_code_name(rc), rc == ST_OK ? "" : status.msg);
    Google__Longrunning__Operation *op =
        rc == ST_OK ? google__longrunning__operation__unpack(NULL, resp.len, resp.data) : NULL;
    if (op) {
        get_op(addr, op->name);
        google__longrunning__operation__free_unpacked(op, NULL);
    }
    st_buf_free(&resp);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[4], "update") == 0)
        return update(argv[1], argv[3], argv[5]);
    if (argc == 6 && strcmp(argv[4], "getop") == 0) {
        get_op(argv[1], argv[3]);
        return 0;
    }
    if (argc != 6 || (strcmp(argv[4], "cam") != 0 && strcmp(argv[4], "rmw") != 0)) {
        fprintf(stderr, "usage: profile_txn ADDR TABLE_ID PROFILE_ID cam|rmw ROW\n"
                        "       profile_txn ADDR - PROFILE_ID update ETAG\n"
                        "       profile_txn ADDR - OPERATION_NAME getop -\n");
        return 2;
    }
    char table[512];
    snprintf(table, sizeof table, "projects/p/instances/i/tables/%s", argv[2]);
    bool cam = strcmp(argv[4], "cam") == 0;
    st_buf req, resp;
    st_buf_init(&req);
    st_buf_init(&resp);
    if ((cam ? pack_cam : pack_rmw)(table, argv[3], argv[5], &req) == 0) {
        fprintf(stderr, "profile_txn: out of memory\n");
        return 2;
    }
    const char *path = cam ? "/google.bigtable.v2.Bigtable/CheckAndMutateRow"
                           : "/google.bigtable.v2.Bigtable/ReadModifyWriteRow";
    st_err status = {0};
    st_code rc = rpc_blocking_unary(argv[1], NULL, path, st_buf_slice(&req), NULL, 0, TIMEOUT_MS,
                                    &resp, &status);
    printf("%s %s\n", st_code_name(rc), rc == ST_OK ? "" : status.msg);
    st_buf_free(&req);
    st_buf_free(&resp);
    return 0;
}
