/* rtu_fixture.h — request fixtures shared by the router's byte-level tests (peek_test,
 * wire_test): protobuf-c bytes from a C string, and a ReadRowsRequest that sets every field the
 * router reads or rewrites. Header-only. */
#ifndef RTU_FIXTURE_H
#define RTU_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "router_internal.h"

#define S(lit) ST_SLICE_LIT(lit)

/* Bytes borrowing s (without its NUL); valid while s is. */
static inline ProtobufCBinaryData rtu_bin(const char *s) {
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
}

/* A ReadRowsRequest on table t with app profile "prof", row keys "a" and "b", rows_limit 7 and
 * reversed set; req points into the struct, so it is valid while the struct is (do not copy). */
typedef struct rtu_read_rows {
    Google__Bigtable__V2__ReadRowsRequest req;
    Google__Bigtable__V2__RowSet rs;
    ProtobufCBinaryData keys[2];
} rtu_read_rows;

static inline void rtu_read_rows_init(rtu_read_rows *f) {
    google__bigtable__v2__read_rows_request__init(&f->req);
    f->req.table_name = "projects/p/instances/i/tables/t";
    f->req.app_profile_id = "prof";
    f->req.rows_limit = 7;
    f->req.reversed = true;
    google__bigtable__v2__row_set__init(&f->rs);
    f->keys[0] = rtu_bin("a");
    f->keys[1] = rtu_bin("b");
    f->rs.row_keys = f->keys;
    f->rs.n_row_keys = 2;
    f->req.rows = &f->rs;
}

#endif
