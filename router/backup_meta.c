/* backup_meta.c — metadata writes of backups that must not race between routers
 * (docs/backups.md, "Several routers").
 *
 * Every router keeps its own copy of the metadata and checks names against it, so two routers
 * of one instance asked to create the same backup id (or to restore into the same table id) at
 * the same moment would both pass their checks. The creation itself is therefore a
 * compare-and-set on the first cluster's metadata table, as IAM policy changes are (iam.c): a
 * CheckAndMutateRow that writes the row only if it holds no cell. The node runs it under the
 * row's lock, so exactly one router wins; the other answers ALREADY_EXISTS. The winner then
 * writes the record to every cluster as any metadata write.
 *
 * A restore has no record until it commits (the table is invisible while it is restored), so it
 * claims its table id with a row "bkclaim/<table name>" holding its operation's name, created
 * the same way and deleted (only if it still names that operation) when the operation ends.
 * Readers ignore the prefix (docs/formats/metadata.md). */
#include "backup.h"

#include <stdlib.h>
#include <string.h>

#define BK_CLAIM_PREFIX "bkclaim/"

typedef struct bk_cas {
    rtr_ctx *r;
    rtr_meta_kind kind; /* create: the record's kind (claims: not written elsewhere) */
    bool claim;         /* a restore's claim: only cluster 0's row */
    bool release;       /* a claim given back */
    char *name;
    st_buf pb;
    rtr_meta_done_fn done;
    void *arg;
} bk_cas;

static void cas_free(bk_cas *c) {
    free(c->name);
    st_buf_free(&c->pb);
    free(c);
}

/* The filter matching the row's latest m:v cell, and only when it equals *value if given. */
typedef struct cas_filter {
    Google__Bigtable__V2__RowFilter fam, qual, last, val, chain;
    Google__Bigtable__V2__RowFilter *links[4];
    Google__Bigtable__V2__RowFilter__Chain ch;
    Google__Bigtable__V2__ValueRange range;
} cas_filter;

static void filter_init(cas_filter *f, const st_slice *value) {
    google__bigtable__v2__row_filter__init(&f->fam);
    f->fam.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER;
    f->fam.family_name_regex_filter = (char *)RTR_META_FAMILY;
    google__bigtable__v2__row_filter__init(&f->qual);
    f->qual.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER;
    f->qual.column_qualifier_regex_filter = (ProtobufCBinaryData){1, (uint8_t *)RTR_META_QUALIFIER};
    google__bigtable__v2__row_filter__init(&f->last);
    f->last.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    f->last.cells_per_column_limit_filter = 1;
    google__bigtable__v2__value_range__init(&f->range);
    google__bigtable__v2__row_filter__init(&f->val);
    if (value) {
        ProtobufCBinaryData v = {value->len, (uint8_t *)value->data};
        f->range.start_value_case =
            GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_CLOSED;
        f->range.start_value_closed = v;
        f->range.end_value_case = GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_CLOSED;
        f->range.end_value_closed = v;
        f->val.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_RANGE_FILTER;
        f->val.value_range_filter = &f->range;
    }
    f->links[0] = &f->fam;
    f->links[1] = &f->qual;
    f->links[2] = &f->last;
    f->links[3] = &f->val;
    google__bigtable__v2__row_filter__chain__init(&f->ch);
    f->ch.n_filters = value ? 4 : 3;
    f->ch.filters = f->links;
    google__bigtable__v2__row_filter__init(&f->chain);
    f->chain.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    f->chain.chain = &f->ch;
}

/* Create (pb set): SetCell only when the row holds no cell. Release (pb NULL): DeleteFromRow
 * only when the latest cell equals *expect. */
static st_code cas_request(st_slice key, const st_slice *pb, const st_slice *expect, st_buf *out) {
    cas_filter f;
    filter_init(&f, expect);
    Google__Bigtable__V2__Mutation__SetCell set;
    google__bigtable__v2__mutation__set_cell__init(&set);
    Google__Bigtable__V2__Mutation__DeleteFromRow del;
    google__bigtable__v2__mutation__delete_from_row__init(&del);
    Google__Bigtable__V2__Mutation mut;
    google__bigtable__v2__mutation__init(&mut);
    if (pb) {
        set.family_name = (char *)RTR_META_FAMILY;
        set.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)RTR_META_QUALIFIER};
        set.timestamp_micros = -1;
        set.value = (ProtobufCBinaryData){pb->len, (uint8_t *)pb->data};
        mut.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
        mut.set_cell = &set;
    } else {
        mut.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
        mut.delete_from_row = &del;
    }
    Google__Bigtable__V2__Mutation *muts[1] = {&mut};
    Google__Bigtable__V2__CheckAndMutateRowRequest req;
    google__bigtable__v2__check_and_mutate_row_request__init(&req);
    req.table_name = (char *)RTR_META_TABLE;
    req.row_key = (ProtobufCBinaryData){key.len, (uint8_t *)key.data};
    req.predicate_filter = &f.chain;
    if (pb) {
        req.n_false_mutations = 1;
        req.false_mutations = muts;
    } else {
        req.n_true_mutations = 1;
        req.true_mutations = muts;
    }
    size_t len = google__bigtable__v2__check_and_mutate_row_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__v2__check_and_mutate_row_request__pack(&req, out->data);
    return ST_OK;
}

static void created_everywhere(void *arg, st_code code, const char *msg) {
    bk_cas *c = arg;
    c->done(c->arg, code, msg);
    cas_free(c);
}

static void cas_done(rtr_fan *f, void *arg) {
    bk_cas *c = arg;
    st_err err = {0};
    st_code code = rtr_fan_first_error(f, &err);
    size_t off = 0;
    st_slice msg = {0};
    Google__Bigtable__V2__CheckAndMutateRowResponse *resp =
        code == ST_OK && rtr_fan_next_msg(&f->res[0], &off, &msg)
            ? google__bigtable__v2__check_and_mutate_row_response__unpack(NULL, msg.len, msg.data)
            : NULL;
    rtr_fan_free(f);
    bool matched = resp && resp->predicate_matched;
    if (resp)
        google__bigtable__v2__check_and_mutate_row_response__free_unpacked(resp, NULL);
    if (code == ST_OK && !resp)
        code = st_err_set(&err, ST_INTERNAL,
                          "the metadata table's node sent no CheckAndMutateRow answer");
    if (code != ST_OK) {
        st_err_prefix(&err,
                      "could not record %s in the metadata of cluster %s (the first of the "
                      "topology, where new backups and restores are compared and set; retry "
                      "when it is reachable): ",
                      c->name, c->r->clusters[0].topo->id);
        c->done(c->arg, code, err.msg);
        cas_free(c);
        return;
    }
    if (c->release) { /* done whether or not the claim still named the operation */
        c->done(c->arg, ST_OK, NULL);
        cas_free(c);
        return;
    }
    if (matched) {
        c->done(c->arg, ST_ALREADY_EXISTS, "another router created it first");
        cas_free(c);
        return;
    }
    if (c->claim) {
        c->done(c->arg, ST_OK, NULL);
        cas_free(c);
        return;
    }
    st_slice s = st_buf_slice(&c->pb);
    rtr_meta_write(c->r, c->kind, c->name, &s, created_everywhere, c);
}

/* Sends the CheckAndMutateRow for row key to cluster 0. */
static void cas_send(bk_cas *c, st_slice key, const st_slice *pb, const st_slice *expect) {
    rtr_ctx *r = c->r;
    st_buf req;
    st_buf_init(&req);
    const rtr_tmap_table *t =
        r->clusters[0].map ? rtr_tmap_find(r->clusters[0].map, RTR_META_TABLE) : NULL;
    st_code rc = cas_request(key, pb, expect, &req);
    size_t k = rc == ST_OK && t ? rtr_tmap_row(t, key) : SIZE_MAX;
    rtr_fan *f = k != SIZE_MAX ? rtr_fan_new(r, 1, RTR_ADMIN_TIMEOUT_MS, cas_done, c) : NULL;
    if (f)
        rtr_fan_call(f, 0, &r->clusters[0].nodes[t->v[k].node], RTR_BT "CheckAndMutateRow",
                     st_buf_slice(&req));
    st_buf_free(&req);
    if (f) {
        rtr_fan_seal(f);
        return;
    }
    c->done(c->arg, rc != ST_OK ? ST_RESOURCE_EXHAUSTED : ST_UNAVAILABLE,
            rc != ST_OK ? "out of memory"
                        : "no tablet of the metadata table is known in the first cluster, where "
                          "new backups and restores are compared and set: retry when it is "
                          "reachable");
    cas_free(c);
}

static bk_cas *cas_new(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                       rtr_meta_done_fn done, void *arg) {
    bk_cas *c = calloc(1, sizeof *c);
    if (c) {
        st_buf_init(&c->pb);
        c->name = strdup(name);
    }
    if (!c || !c->name || (pb && st_buf_append(&c->pb, pb->data, pb->len) != ST_OK)) {
        if (c)
            cas_free(c);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->r = r;
    c->kind = kind;
    c->done = done;
    c->arg = arg;
    return c;
}

void rtr_bk_meta_create(rtr_ctx *r, rtr_meta_kind kind, const char *name, st_slice pb,
                        rtr_meta_done_fn done, void *arg) {
    bk_cas *c = cas_new(r, kind, name, &pb, done, arg);
    if (!c)
        return;
    st_buf key;
    st_buf_init(&key);
    if (rtr_meta_row_key(kind, name, &key) != ST_OK) {
        st_buf_free(&key);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        cas_free(c);
        return;
    }
    cas_send(c, st_buf_slice(&key), &pb, NULL);
    st_buf_free(&key);
}

/* "bkclaim/<table>" into key. */
static st_code claim_key(const char *table, st_buf *key) {
    st_buf_reset(key);
    if (st_buf_append(key, BK_CLAIM_PREFIX, strlen(BK_CLAIM_PREFIX)) != ST_OK ||
        st_buf_append(key, table, strlen(table)) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

static void claim_op(rtr_ctx *r, const char *table, const char *op, bool take,
                     rtr_meta_done_fn done, void *arg) {
    st_slice v = st_slice_cstr(op);
    bk_cas *c = cas_new(r, RTR_META_KIND_OP, table, take ? &v : NULL, done, arg);
    if (!c)
        return;
    c->claim = take;
    c->release = !take;
    st_buf key;
    st_buf_init(&key);
    if (claim_key(table, &key) != ST_OK) {
        st_buf_free(&key);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory");
        cas_free(c);
        return;
    }
    cas_send(c, st_buf_slice(&key), take ? &v : NULL, take ? NULL : &v);
    st_buf_free(&key);
}

void rtr_bk_claim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done, void *arg) {
    claim_op(r, table, op, true, done, arg);
}

void rtr_bk_unclaim(rtr_ctx *r, const char *table, const char *op, rtr_meta_done_fn done,
                    void *arg) {
    claim_op(r, table, op, false, done, arg);
}
