/* failover_driver.c — the client failover_test.sh runs while it kills and restarts a cluster: it
 * writes and reads continuously through a router with an app profile id (cbt cannot send one
 * with its writes), one operation at a time, until STOPFILE exists:
 *   - MutateRow of row k<i> (SetCell cf:c = v<i> at server time, timestamp -1), then a ReadRows
 *     of that row; every fifth round also a MutateRows of rows m<i>-a and m<i>-b;
 *   - each successful MutateRow appends its row key to KEYS_OUT (flushed), so the script knows
 *     how far the client got and which rows were written when;
 *   - each failed call prints "error op=... row=... code=... msg=...".
 * At the end it prints one summary line:
 *   writes_ok=N writes_failed=N reads_ok=N reads_failed=N reads_found=N longest_gap_ms=N
 * (longest_gap_ms: the longest time between two successful calls, for the report; the test
 * asserts on the failure counts, never on time). Exit 0 when it ran, 2 on bad usage.
 *   failover_driver ADDR TABLE_ID PROFILE_ID STOPFILE KEYS_OUT */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define CALL_TIMEOUT_MS 20000 /* a client deadline, as the Go client's default for reads */
#define ROUNDS_MAX 1000000    /* hang guard */

typedef struct drv {
    const char *addr, *table, *profile;
    unsigned long writes_ok, writes_failed, reads_ok, reads_failed, reads_found;
    int64_t last_ok_us, longest_gap_us;
} drv;

static void note(drv *d, const char *op, const char *row, st_code rc, const st_err *st) {
    int64_t now = st_mono_us();
    if (rc == ST_OK) {
        if (now - d->last_ok_us > d->longest_gap_us)
            d->longest_gap_us = now - d->last_ok_us;
        d->last_ok_us = now;
        return;
    }
    printf("error op=%s row=%s code=%s msg=%s\n", op, row, st_code_name(rc), st->msg);
    fflush(stdout);
}

static void mk_set(Google__Bigtable__V2__Mutation *m, Google__Bigtable__V2__Mutation__SetCell *s,
                   const char *value) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(s);
    s->family_name = (char *)"cf";
    s->column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"c"};
    s->timestamp_micros = -1;
    s->value = (ProtobufCBinaryData){strlen(value), (uint8_t *)value};
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = s;
}

static st_code write_row(drv *d, const char *row, const char *value, st_err *st) {
    Google__Bigtable__V2__Mutation m, *mp[1] = {&m};
    Google__Bigtable__V2__Mutation__SetCell s;
    mk_set(&m, &s, value);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)d->table;
    req.app_profile_id = (char *)d->profile;
    req.row_key = (ProtobufCBinaryData){strlen(row), (uint8_t *)row};
    req.mutations = mp;
    req.n_mutations = 1;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__mutate_row_request__pack(&req, buf);
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = rpc_blocking_unary(d->addr, NULL, "/google.bigtable.v2.Bigtable/MutateRow",
                                    st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, &resp, st);
    st_buf_free(&resp);
    return rc;
}

/* Both entries must succeed: the call's status, else the first failed entry's. */
typedef struct rows_ans {
    st_code code;
    st_err err;
} rows_ans;

static void rows_msg(st_slice msg, void *arg) {
    rows_ans *a = arg;
    Google__Bigtable__V2__MutateRowsResponse *r =
        google__bigtable__v2__mutate_rows_response__unpack(NULL, msg.len, msg.data);
    if (!r) {
        a->code = st_err_set(&a->err, ST_INTERNAL, "unreadable MutateRowsResponse");
        return;
    }
    for (size_t i = 0; i < r->n_entries && a->code == ST_OK; i++)
        if (r->entries[i]->status && r->entries[i]->status->code != 0)
            a->code =
                st_err_set(&a->err, (st_code)r->entries[i]->status->code, "entry %lld: %s",
                           (long long)r->entries[i]->index,
                           r->entries[i]->status->message ? r->entries[i]->status->message : "");
    google__bigtable__v2__mutate_rows_response__free_unpacked(r, NULL);
}

static st_code write_rows(drv *d, const char *row_a, const char *row_b, st_err *st) {
    Google__Bigtable__V2__Mutation m[2], *mp[2][1] = {{&m[0]}, {&m[1]}};
    Google__Bigtable__V2__Mutation__SetCell s[2];
    mk_set(&m[0], &s[0], "a");
    mk_set(&m[1], &s[1], "b");
    Google__Bigtable__V2__MutateRowsRequest__Entry e[2], *ep[2] = {&e[0], &e[1]};
    const char *rows[2] = {row_a, row_b};
    for (int i = 0; i < 2; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&e[i]);
        e[i].row_key = (ProtobufCBinaryData){strlen(rows[i]), (uint8_t *)rows[i]};
        e[i].mutations = mp[i];
        e[i].n_mutations = 1;
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = (char *)d->table;
    req.app_profile_id = (char *)d->profile;
    req.entries = ep;
    req.n_entries = 2;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__mutate_rows_request__pack(&req, buf);
    rows_ans a = {ST_OK, {0}};
    st_code rc =
        rpc_blocking_stream(d->addr, NULL, "/google.bigtable.v2.Bigtable/MutateRows",
                            st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, rows_msg, &a, st);
    if (rc == ST_OK && a.code != ST_OK) {
        *st = a.err;
        rc = a.code;
    }
    return rc;
}

static void read_msg(st_slice msg, void *arg) {
    bool *found = arg;
    Google__Bigtable__V2__ReadRowsResponse *r =
        google__bigtable__v2__read_rows_response__unpack(NULL, msg.len, msg.data);
    if (r && r->n_chunks > 0)
        *found = true;
    if (r)
        google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
}

static st_code read_row(drv *d, const char *row, bool *found, st_err *st) {
    ProtobufCBinaryData key = {strlen(row), (uint8_t *)row};
    Google__Bigtable__V2__RowSet rs;
    google__bigtable__v2__row_set__init(&rs);
    rs.row_keys = &key;
    rs.n_row_keys = 1;
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = (char *)d->table;
    req.app_profile_id = (char *)d->profile;
    req.rows = &rs;
    uint8_t buf[1024];
    size_t len = google__bigtable__v2__read_rows_request__pack(&req, buf);
    *found = false;
    return rpc_blocking_stream(d->addr, NULL, "/google.bigtable.v2.Bigtable/ReadRows",
                               st_slice_make(buf, len), NULL, 0, CALL_TIMEOUT_MS, read_msg, found,
                               st);
}

static void round_once(drv *d, long i, FILE *keys) {
    char row[32], row_b[32], value[32];
    st_err st = {0};
    snprintf(row, sizeof row, "k%08ld", i);
    snprintf(value, sizeof value, "v%ld", i);
    st_code rc = write_row(d, row, value, &st);
    note(d, "write", row, rc, &st);
    if (rc == ST_OK) {
        d->writes_ok++;
        fprintf(keys, "%s\n", row);
        fflush(keys);
    } else {
        d->writes_failed++;
    }
    bool found = false;
    rc = read_row(d, row, &found, &st);
    note(d, "read", row, rc, &st);
    d->reads_ok += rc == ST_OK;
    d->reads_failed += rc != ST_OK;
    d->reads_found += rc == ST_OK && found;
    if (i % 5 != 0)
        return;
    snprintf(row, sizeof row, "m%08ld-a", i);
    snprintf(row_b, sizeof row_b, "m%08ld-b", i);
    rc = write_rows(d, row, row_b, &st);
    note(d, "write_rows", row, rc, &st);
    d->writes_ok += rc == ST_OK;
    d->writes_failed += rc != ST_OK;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: failover_driver ADDR TABLE_ID PROFILE_ID STOPFILE KEYS_OUT\n");
        return 2;
    }
    char table[512];
    snprintf(table, sizeof table, "projects/p/instances/i/tables/%s", argv[2]);
    drv d = {.addr = argv[1], .table = table, .profile = argv[3], .last_ok_us = st_mono_us()};
    FILE *keys = fopen(argv[5], "w");
    if (!keys) {
        perror(argv[5]);
        return 2;
    }
    for (long i = 0; i < ROUNDS_MAX && access(argv[4], F_OK) != 0; i++)
        round_once(&d, i, keys);
    fclose(keys);
    printf("writes_ok=%lu writes_failed=%lu reads_ok=%lu reads_failed=%lu reads_found=%lu "
           "longest_gap_ms=%lld\n",
           d.writes_ok, d.writes_failed, d.reads_ok, d.reads_failed, d.reads_found,
           (long long)(d.longest_gap_us / 1000));
    return 0;
}
