/* btclient.c — see btclient.h. Requests are built from arena-allocated protobuf-c structs,
 * packed, and sent with rpc_blocking_unary / rpc_blocking_stream; responses are unpacked with
 * protobuf-c's default allocator and freed at once. */
#include "btclient.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/bigtable/v2/feature_flags.pb-c.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"
#include "tu_tmp.h"

#define BT_ARENA_BLOCK_BYTES 4096
#define BT_MD_MAX 3
#define BT_LOG_TAIL_BYTES 2000

static const char BT_DATA_SVC[] = "/google.bigtable.v2.Bigtable/";
static const char BT_ADMIN_SVC[] = "/google.bigtable.admin.v2.BigtableTableAdmin/";

/* ---------------------------------------------------------------- client basics */

void bt_client_init(bt_client *c, const char *addr) {
    memset(c, 0, sizeof *c);
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    snprintf(c->instance, sizeof c->instance, "projects/p/instances/i");
    c->timeout_ms = BT_TIMEOUT_MS_DEFAULT;
}

void bt_table_name(const bt_client *c, const char *table, char out[BT_NAME_MAX]) {
    snprintf(out, BT_NAME_MAX, "%s/tables/%s", c->instance, table);
}

static void *arena_zalloc(st_arena *a, size_t n) {
    void *p = st_arena_alloc(a, n);
    ST_ASSERT(p != NULL);
    memset(p, 0, n);
    return p;
}

static char *arena_str(st_arena *a, const char *s) {
    size_t n = strlen(s);
    char *p = arena_zalloc(a, n + 1);
    memcpy(p, s, n);
    return p;
}

static ProtobufCBinaryData arena_bytes(st_arena *a, st_slice s) {
    ProtobufCBinaryData b = {s.len, NULL};
    b.data = arena_zalloc(a, s.len ? s.len : 1);
    if (s.len)
        memcpy(b.data, s.data, s.len);
    return b;
}

static void pack_msg(const ProtobufCMessage *m, st_buf *out) {
    size_t n = protobuf_c_message_get_packed_size(m);
    st_buf_reset(out);
    ST_ASSERT(st_buf_reserve(out, n + 1) == ST_OK);
    protobuf_c_message_pack(m, out->data);
    out->len = n;
}

st_code bt_call_pb(const char *addr, const char *path, const ProtobufCMessage *req, int timeout_ms,
                   st_buf *resp, st_err *st) {
    st_buf body, ignore;
    st_buf_init(&body);
    st_buf_init(&ignore);
    pack_msg(req, &body);
    st_err_clear(st);
    if (resp)
        st_buf_reset(resp);
    st_code rc = rpc_blocking_unary(addr, NULL, path, st_slice_make(body.data, body.len), NULL, 0,
                                    timeout_ms, resp ? resp : &ignore, st);
    st_buf_free(&ignore);
    st_buf_free(&body);
    return rc;
}

ProtobufCMessage *bt_call_unpack(const char *addr, const char *path, const ProtobufCMessage *req,
                                 const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                                 st_err *st) {
    st_buf resp;
    st_buf_init(&resp);
    ProtobufCMessage *m = NULL;
    if (bt_call_pb(addr, path, req, timeout_ms, &resp, st) == ST_OK)
        m = protobuf_c_message_unpack(resp_desc, NULL, resp.len, resp.data);
    st_buf_free(&resp);
    return m;
}

st_code bt_node_put_table(const char *addr, const char *name, const char *family,
                          uint32_t max_versions, int timeout_ms, st_err *st) {
    Google__Bigtable__Admin__V2__GcRule rule;
    google__bigtable__admin__v2__gc_rule__init(&rule);
    rule.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
    rule.max_num_versions = (int32_t)max_versions;
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    cf.gc_rule = max_versions ? &rule : NULL;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry fam, *fams[1] = {&fam};
    google__bigtable__admin__v2__table__column_families_entry__init(&fam);
    fam.key = (char *)family;
    fam.value = &cf;
    Google__Bigtable__Admin__V2__Table table;
    google__bigtable__admin__v2__table__init(&table);
    table.name = (char *)name;
    table.n_column_families = 1;
    table.column_families = fams;
    Strata__Internal__V1__PutTableRequest req;
    strata__internal__v1__put_table_request__init(&req);
    req.table = &table;
    return bt_call_pb(addr, "/strata.internal.v1.Node/PutTable", &req.base, timeout_ms, NULL, st);
}

/* URL-encodes the table name for x-goog-request-params, as the Go client does. */
static void request_params(const char *table_name, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "table_name=");
    for (const char *p = table_name; *p && o + 4 < cap; p++) {
        if (*p == '/')
            o += (size_t)snprintf(out + o, cap - o, "%%2F");
        else
            out[o++] = *p;
    }
    out[o] = '\0';
}

static st_code call_unary(const bt_client *c, const char *svc, const char *method,
                          const ProtobufCMessage *req, const char *table_name, st_buf *resp,
                          st_err *st) {
    char path[256], params[BT_NAME_MAX * 2];
    snprintf(path, sizeof path, "%s%s", svc, method);
    rpc_metadata md[BT_MD_MAX];
    size_t n_md = 0;
    if (table_name) {
        request_params(table_name, params, sizeof params);
        md[n_md++] = (rpc_metadata){"x-goog-request-params", params};
    }
    st_buf body;
    st_buf_init(&body);
    pack_msg(req, &body);
    st_err local;
    st_err *s = st ? st : &local;
    st_err_clear(s);
    st_code rc = rpc_blocking_unary(c->addr, NULL, path, st_slice_make(body.data, body.len), md,
                                    n_md, c->timeout_ms, resp, s);
    s->code = rc;
    st_buf_free(&body);
    return rc;
}

/* ---------------------------------------------------------------- table admin */

typedef Google__Bigtable__Admin__V2__GcRule gc_rule;

static gc_rule *gc_term(st_arena *a, const char *t, size_t len, st_err *st) {
    char buf[64];
    if (len >= sizeof buf)
        return st_err_set(st, ST_INVALID_ARGUMENT, "gc term too long"), NULL;
    memcpy(buf, t, len);
    buf[len] = '\0';
    gc_rule *r = arena_zalloc(a, sizeof *r);
    google__bigtable__admin__v2__gc_rule__init(r);
    char unit = 0;
    long long n = 0;
    if (sscanf(buf, "maxversions=%lld", &n) == 1) {
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
        r->max_num_versions = (int32_t)n;
    } else if (sscanf(buf, "maxage=%lld%c", &n, &unit) == 2) {
        long long mul = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : 86400;
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_AGE;
        r->max_age = arena_zalloc(a, sizeof *r->max_age);
        google__protobuf__duration__init(r->max_age);
        r->max_age->seconds = n * mul;
    } else if (strcmp(buf, "never") != 0) {
        st_err_set(st, ST_INVALID_ARGUMENT, "bad gc term '%s'", buf);
        return NULL;
    }
    return r;
}

/* "maxage=1d||maxversions=2" (union), "a&&b" (intersection), one term, or "never". */
static st_code gc_parse(st_arena *a, const char *text, gc_rule **out, st_err *st) {
    *out = NULL;
    if (!text || !*text || !strcmp(text, "never"))
        return ST_OK;
    bool is_union = strstr(text, "||") != NULL;
    const char *sep = is_union ? "||" : "&&";
    gc_rule *subs[16];
    size_t n = 0;
    for (const char *p = text; n < 16;) {
        const char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!(subs[n++] = gc_term(a, p, len, st)))
            return ST_INVALID_ARGUMENT;
        if (!e)
            break;
        p = e + 2;
    }
    if (n == 1) {
        *out = subs[0];
        return ST_OK;
    }
    gc_rule *r = arena_zalloc(a, sizeof *r);
    google__bigtable__admin__v2__gc_rule__init(r);
    gc_rule **v = arena_zalloc(a, n * sizeof *v);
    memcpy(v, subs, n * sizeof *v);
    if (is_union) {
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_UNION;
        r->union_ = arena_zalloc(a, sizeof *r->union_);
        google__bigtable__admin__v2__gc_rule__union__init(r->union_);
        r->union_->n_rules = n;
        r->union_->rules = v;
    } else {
        r->rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_INTERSECTION;
        r->intersection = arena_zalloc(a, sizeof *r->intersection);
        google__bigtable__admin__v2__gc_rule__intersection__init(r->intersection);
        r->intersection->n_rules = n;
        r->intersection->rules = v;
    }
    *out = r;
    return ST_OK;
}

static Google__Bigtable__Admin__V2__ColumnFamily *family_new(st_arena *a, gc_rule *gc) {
    Google__Bigtable__Admin__V2__ColumnFamily *f = arena_zalloc(a, sizeof *f);
    google__bigtable__admin__v2__column_family__init(f);
    f->gc_rule = gc;
    return f;
}

/* Parses "cf1:rule,cf2" into table->column_families. */
static st_code families_parse(st_arena *a, const char *spec, Google__Bigtable__Admin__V2__Table *t,
                              st_err *st) {
    size_t cap = 1;
    for (const char *p = spec; *p; p++)
        cap += *p == ',';
    t->column_families = arena_zalloc(a, cap * sizeof *t->column_families);
    for (const char *p = spec; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[256];
        if (len >= sizeof item)
            return st_err_set(st, ST_INVALID_ARGUMENT, "family spec too long");
        memcpy(item, p, len);
        item[len] = '\0';
        char *colon = strchr(item, ':');
        if (colon)
            *colon = '\0';
        gc_rule *gc;
        st_code rc = gc_parse(a, colon ? colon + 1 : NULL, &gc, st);
        if (rc != ST_OK)
            return rc;
        Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *ent = arena_zalloc(a, sizeof *ent);
        google__bigtable__admin__v2__table__column_families_entry__init(ent);
        ent->key = arena_str(a, item);
        ent->value = family_new(a, gc);
        t->column_families[t->n_column_families++] = ent;
        if (!e)
            break;
        p = e + 1;
    }
    return ST_OK;
}

st_code bt_create_table(const bt_client *c, const char *table, const char *families, st_err *st) {
    return bt_create_table_split(c, table, families, NULL, st);
}

st_code bt_create_table_split(const bt_client *c, const char *table, const char *families,
                              const char *const *splits, st_err *st) {
    st_arena a;
    st_arena_init(&a, BT_ARENA_BLOCK_BYTES);
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    req.parent = (char *)c->instance;
    req.table_id = (char *)table;
    req.table = &t;
    size_t n_splits = 0;
    while (splits && splits[n_splits])
        n_splits++;
    if (n_splits) {
        req.initial_splits = arena_zalloc(&a, n_splits * sizeof *req.initial_splits);
        for (size_t i = 0; i < n_splits; i++) {
            Google__Bigtable__Admin__V2__CreateTableRequest__Split *sp =
                arena_zalloc(&a, sizeof *sp);
            google__bigtable__admin__v2__create_table_request__split__init(sp);
            sp->key = (ProtobufCBinaryData){strlen(splits[i]), (uint8_t *)splits[i]};
            req.initial_splits[i] = sp;
        }
        req.n_initial_splits = n_splits;
    }
    st_code rc = families ? families_parse(&a, families, &t, st) : ST_OK;
    if (rc == ST_OK) {
        st_buf resp;
        st_buf_init(&resp);
        rc = call_unary(c, BT_ADMIN_SVC, "CreateTable", &req.base, NULL, &resp, st);
        st_buf_free(&resp);
    }
    st_arena_deinit(&a);
    return rc;
}

st_code bt_delete_table(const bt_client *c, const char *table, st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__Admin__V2__DeleteTableRequest req;
    google__bigtable__admin__v2__delete_table_request__init(&req);
    req.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call_unary(c, BT_ADMIN_SVC, "DeleteTable", &req.base, NULL, &resp, st);
    st_buf_free(&resp);
    return rc;
}

st_code bt_create_app_profile(const bt_client *c, const char *id, const char *cluster_id,
                              st_err *st) {
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting one;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&one);
    one.cluster_id = (char *)cluster_id;
    Google__Bigtable__Admin__V2__AppProfile prof;
    google__bigtable__admin__v2__app_profile__init(&prof);
    prof.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    prof.single_cluster_routing = &one;
    Google__Bigtable__Admin__V2__CreateAppProfileRequest req;
    google__bigtable__admin__v2__create_app_profile_request__init(&req);
    req.parent = (char *)c->instance;
    req.app_profile_id = (char *)id;
    req.app_profile = &prof;
    req.ignore_warnings = true;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call_unary(c, "/google.bigtable.admin.v2.BigtableInstanceAdmin/",
                            "CreateAppProfile", &req.base, NULL, &resp, st);
    st_buf_free(&resp);
    return rc;
}

st_code bt_wait_consistent(const bt_client *c, const char *table, int max_checks, int *checks,
                           st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenRequest gen;
    google__bigtable__admin__v2__generate_consistency_token_request__init(&gen);
    gen.name = name;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc =
        call_unary(c, BT_ADMIN_SVC, "GenerateConsistencyToken", &gen.base, NULL, &resp, st);
    Google__Bigtable__Admin__V2__GenerateConsistencyTokenResponse *tok =
        rc == ST_OK ? google__bigtable__admin__v2__generate_consistency_token_response__unpack(
                          NULL, resp.len, resp.data)
                    : NULL;
    if (rc == ST_OK && !tok)
        rc = st_err_set(st, ST_INTERNAL, "unreadable GenerateConsistencyTokenResponse");
    int n = 0;
    bool consistent = false;
    while (rc == ST_OK && !consistent && n < max_checks) {
        if (n++)
            nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
        Google__Bigtable__Admin__V2__CheckConsistencyRequest chk;
        google__bigtable__admin__v2__check_consistency_request__init(&chk);
        chk.name = name;
        chk.consistency_token = tok->consistency_token;
        st_buf_reset(&resp);
        rc = call_unary(c, BT_ADMIN_SVC, "CheckConsistency", &chk.base, NULL, &resp, st);
        Google__Bigtable__Admin__V2__CheckConsistencyResponse *a =
            rc == ST_OK ? google__bigtable__admin__v2__check_consistency_response__unpack(
                              NULL, resp.len, resp.data)
                        : NULL;
        if (rc == ST_OK && !a)
            rc = st_err_set(st, ST_INTERNAL, "unreadable CheckConsistencyResponse");
        consistent = a && a->consistent;
        if (a)
            google__bigtable__admin__v2__check_consistency_response__free_unpacked(a, NULL);
    }
    if (tok)
        google__bigtable__admin__v2__generate_consistency_token_response__free_unpacked(tok, NULL);
    st_buf_free(&resp);
    if (checks)
        *checks = n;
    if (rc == ST_OK && !consistent)
        rc = st_err_set(st, ST_DEADLINE_EXCEEDED, "not consistent after %d checks", n);
    return rc;
}

st_code bt_create_family(const bt_client *c, const char *table, const char *family,
                         const char *gc_text, st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    st_arena a;
    st_arena_init(&a, BT_ARENA_BLOCK_BYTES);
    gc_rule *gc;
    st_code rc = gc_parse(&a, gc_text, &gc, st);
    if (rc == ST_OK) {
        Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest req;
        google__bigtable__admin__v2__modify_column_families_request__init(&req);
        Google__Bigtable__Admin__V2__ModifyColumnFamiliesRequest__Modification mod, *mods[1];
        google__bigtable__admin__v2__modify_column_families_request__modification__init(&mod);
        mod.id = (char *)family;
        mod.mod_case =
            GOOGLE__BIGTABLE__ADMIN__V2__MODIFY_COLUMN_FAMILIES_REQUEST__MODIFICATION__MOD_CREATE;
        mod.create = family_new(&a, gc);
        mods[0] = &mod;
        req.name = name;
        req.n_modifications = 1;
        req.modifications = mods;
        st_buf resp;
        st_buf_init(&resp);
        rc = call_unary(c, BT_ADMIN_SVC, "ModifyColumnFamilies", &req.base, NULL, &resp, st);
        st_buf_free(&resp);
    }
    st_arena_deinit(&a);
    return rc;
}

/* ---------------------------------------------------------------- mutations */

void bt_muts_init(bt_muts *m) {
    memset(m, 0, sizeof *m);
    st_arena_init(&m->arena, BT_ARENA_BLOCK_BYTES);
}

void bt_muts_deinit(bt_muts *m) {
    st_arena_deinit(&m->arena);
    free(m->v);
    memset(m, 0, sizeof *m);
}

void bt_muts_reset(bt_muts *m) {
    st_arena_deinit(&m->arena);
    st_arena_init(&m->arena, BT_ARENA_BLOCK_BYTES);
    m->n = 0;
}

static bt_mutation *muts_push(bt_muts *m) {
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 8;
        m->v = realloc(m->v, m->cap * sizeof *m->v);
        ST_ASSERT(m->v != NULL);
    }
    bt_mutation *x = arena_zalloc(&m->arena, sizeof *x);
    google__bigtable__v2__mutation__init(x);
    m->v[m->n++] = x;
    return x;
}

void bt_muts_set(bt_muts *m, const char *family, st_slice qualifier, int64_t ts_us,
                 st_slice value) {
    bt_mutation *x = muts_push(m);
    Google__Bigtable__V2__Mutation__SetCell *s = arena_zalloc(&m->arena, sizeof *s);
    google__bigtable__v2__mutation__set_cell__init(s);
    s->family_name = arena_str(&m->arena, family);
    s->column_qualifier = arena_bytes(&m->arena, qualifier);
    s->timestamp_micros = ts_us;
    s->value = arena_bytes(&m->arena, value);
    x->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    x->set_cell = s;
}

void bt_muts_del_column(bt_muts *m, const char *family, st_slice qualifier, int64_t start_us,
                        int64_t end_us) {
    bt_mutation *x = muts_push(m);
    Google__Bigtable__V2__Mutation__DeleteFromColumn *d = arena_zalloc(&m->arena, sizeof *d);
    google__bigtable__v2__mutation__delete_from_column__init(d);
    d->family_name = arena_str(&m->arena, family);
    d->column_qualifier = arena_bytes(&m->arena, qualifier);
    if (start_us || end_us) {
        d->time_range = arena_zalloc(&m->arena, sizeof *d->time_range);
        google__bigtable__v2__timestamp_range__init(d->time_range);
        d->time_range->start_timestamp_micros = start_us;
        d->time_range->end_timestamp_micros = end_us;
    }
    x->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN;
    x->delete_from_column = d;
}

void bt_muts_del_family(bt_muts *m, const char *family) {
    bt_mutation *x = muts_push(m);
    Google__Bigtable__V2__Mutation__DeleteFromFamily *d = arena_zalloc(&m->arena, sizeof *d);
    google__bigtable__v2__mutation__delete_from_family__init(d);
    d->family_name = arena_str(&m->arena, family);
    x->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY;
    x->delete_from_family = d;
}

void bt_muts_del_row(bt_muts *m) {
    bt_mutation *x = muts_push(m);
    Google__Bigtable__V2__Mutation__DeleteFromRow *d = arena_zalloc(&m->arena, sizeof *d);
    google__bigtable__v2__mutation__delete_from_row__init(d);
    x->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
    x->delete_from_row = d;
}

st_code bt_mutate_row(const bt_client *c, const char *table, st_slice row, const bt_muts *m,
                      st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    req.row_key = (ProtobufCBinaryData){row.len, (uint8_t *)row.data};
    req.n_mutations = m ? m->n : 0;
    req.mutations = m ? m->v : NULL;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call_unary(c, BT_DATA_SVC, "MutateRow", &req.base, name, &resp, st);
    st_buf_free(&resp);
    return rc;
}

typedef struct rows_ctx {
    st_code *codes;
    st_err *msgs;
    size_t n;
    bool bad; /* an entry index out of range */
} rows_ctx;

static void mutate_rows_each(const ProtobufCMessage *m, void *arg) {
    rows_ctx *x = arg;
    const Google__Bigtable__V2__MutateRowsResponse *r = (const void *)m;
    for (size_t i = 0; i < r->n_entries; i++) {
        int64_t idx = r->entries[i]->index;
        if (idx < 0 || (size_t)idx >= x->n) {
            x->bad = true;
            continue;
        }
        const Google__Rpc__Status *s = r->entries[i]->status;
        x->codes[idx] = s ? (st_code)s->code : ST_OK;
        if (x->msgs) {
            x->msgs[idx].code = x->codes[idx];
            snprintf(x->msgs[idx].msg, ST_ERR_MSG_MAX, "%s", s && s->message ? s->message : "");
        }
    }
}

/* Where a server-streaming call's answers go: each message is unpacked as `desc` and handed to
 * `each` (borrowed: freed when `each` returns); `bad` is set when one does not parse, and that
 * message is skipped. */
typedef struct stream_sink {
    const ProtobufCMessageDescriptor *desc;
    void (*each)(const ProtobufCMessage *m, void *arg);
    void *arg;
    bool bad;
} stream_sink;

static void stream_msg(st_slice msg, void *arg) {
    stream_sink *k = arg;
    ProtobufCMessage *m = protobuf_c_message_unpack(k->desc, NULL, msg.len, msg.data);
    if (!m) {
        k->bad = true;
        return;
    }
    k->each(m, k->arg);
    protobuf_c_message_free_unpacked(m, NULL);
}

static st_code call_stream(const bt_client *c, const char *method, const ProtobufCMessage *req,
                           const char *table_name, const char *features, stream_sink *sink,
                           st_err *st) {
    char path[256], params[BT_NAME_MAX * 2];
    snprintf(path, sizeof path, "%s%s", BT_DATA_SVC, method);
    rpc_metadata md[BT_MD_MAX];
    size_t n_md = 0;
    request_params(table_name, params, sizeof params);
    md[n_md++] = (rpc_metadata){"x-goog-request-params", params};
    if (features)
        md[n_md++] = (rpc_metadata){"bigtable-features", features};
    st_buf body;
    st_buf_init(&body);
    pack_msg(req, &body);
    st_err local;
    st_err *s = st ? st : &local;
    st_err_clear(s);
    st_code rc = rpc_blocking_stream(c->addr, NULL, path, st_slice_make(body.data, body.len), md,
                                     n_md, c->timeout_ms, stream_msg, sink, s);
    s->code = rc;
    st_buf_free(&body);
    return rc;
}

st_code bt_mutate_rows(const bt_client *c, const char *table, const bt_entry *entries, size_t n,
                       st_code *codes, st_err *msgs, st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    Google__Bigtable__V2__MutateRowsRequest__Entry *ents = calloc(n ? n : 1, sizeof *ents);
    Google__Bigtable__V2__MutateRowsRequest__Entry **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    ST_ASSERT(ents && ptrs);
    for (size_t i = 0; i < n; i++) {
        google__bigtable__v2__mutate_rows_request__entry__init(&ents[i]);
        ents[i].row_key = (ProtobufCBinaryData){entries[i].row.len, (uint8_t *)entries[i].row.data};
        ents[i].n_mutations = entries[i].muts ? entries[i].muts->n : 0;
        ents[i].mutations = entries[i].muts ? entries[i].muts->v : NULL;
        ptrs[i] = &ents[i];
        codes[i] = ST_UNKNOWN;
        if (msgs)
            st_err_clear(&msgs[i]);
    }
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    req.n_entries = n;
    req.entries = ptrs;
    rows_ctx x = {codes, msgs, n, false};
    stream_sink sink = {&google__bigtable__v2__mutate_rows_response__descriptor, mutate_rows_each,
                        &x, false};
    st_code rc = call_stream(c, "MutateRows", &req.base, name, NULL, &sink, st);
    if (rc == ST_OK && (sink.bad || x.bad))
        rc = st_err_set(st, ST_INTERNAL, "MutateRows: unparseable answer or bad entry index");
    free(ents);
    free(ptrs);
    return rc;
}

st_code bt_check_and_mutate(const bt_client *c, const char *table, st_slice row,
                            const bt_filter *pred, const bt_muts *on_true, const bt_muts *on_false,
                            bool *matched, st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__V2__CheckAndMutateRowRequest req;
    google__bigtable__v2__check_and_mutate_row_request__init(&req);
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    req.row_key = (ProtobufCBinaryData){row.len, (uint8_t *)row.data};
    req.predicate_filter = (bt_filter *)pred;
    req.n_true_mutations = on_true ? on_true->n : 0;
    req.true_mutations = on_true ? on_true->v : NULL;
    req.n_false_mutations = on_false ? on_false->n : 0;
    req.false_mutations = on_false ? on_false->v : NULL;
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call_unary(c, BT_DATA_SVC, "CheckAndMutateRow", &req.base, name, &resp, st);
    if (rc == ST_OK) {
        Google__Bigtable__V2__CheckAndMutateRowResponse *r =
            google__bigtable__v2__check_and_mutate_row_response__unpack(NULL, resp.len, resp.data);
        if (!r)
            rc = st_err_set(st, ST_INTERNAL, "CheckAndMutateRow: unparseable answer");
        else if (matched)
            *matched = r->predicate_matched;
        if (r)
            google__bigtable__v2__check_and_mutate_row_response__free_unpacked(r, NULL);
    }
    st_buf_free(&resp);
    return rc;
}

/* Converts a protobuf Row (RMW answer) to bt_row form and dumps it. */
static void dump_pb_row(st_buf *dump, const Google__Bigtable__V2__Row *r, bool with_ts) {
    size_t n = 0;
    for (size_t f = 0; f < r->n_families; f++)
        for (size_t q = 0; q < r->families[f]->n_columns; q++)
            n += r->families[f]->columns[q]->n_cells;
    bt_cell *cells = calloc(n ? n : 1, sizeof *cells);
    st_buf labels;
    st_buf_init(&labels);
    size_t *lab_off = calloc(n ? n : 1, sizeof *lab_off);
    ST_ASSERT(cells && lab_off);
    size_t k = 0;
    for (size_t f = 0; f < r->n_families; f++) {
        const Google__Bigtable__V2__Family *fam = r->families[f];
        for (size_t q = 0; q < fam->n_columns; q++) {
            const Google__Bigtable__V2__Column *col = fam->columns[q];
            for (size_t i = 0; i < col->n_cells; i++, k++) {
                const Google__Bigtable__V2__Cell *ce = col->cells[i];
                cells[k].family = st_slice_cstr(fam->name);
                cells[k].qualifier = st_slice_make(col->qualifier.data, col->qualifier.len);
                cells[k].ts_us = ce->timestamp_micros;
                cells[k].value = st_slice_make(ce->value.data, ce->value.len);
                cells[k].n_labels = ce->n_labels;
                lab_off[k] = labels.len;
                for (size_t l = 0; l < ce->n_labels; l++) {
                    if (l)
                        st_buf_append_byte(&labels, ',');
                    st_buf_append(&labels, ce->labels[l], strlen(ce->labels[l]));
                }
                cells[k].labels.len = labels.len - lab_off[k];
            }
        }
    }
    for (k = 0; k < n; k++)
        cells[k].labels.data = labels.data ? labels.data + lab_off[k] : NULL;
    bt_row row = {st_slice_make(r->key.data, r->key.len), cells, n};
    bt_dump_row(dump, &row, with_ts);
    st_buf_free(&labels);
    free(lab_off);
    free(cells);
}

st_code bt_read_modify_write(const bt_client *c, const char *table, st_slice row,
                             const bt_rmw_rule *rules, size_t n, st_buf *dump, bool with_ts,
                             st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    st_arena a;
    st_arena_init(&a, BT_ARENA_BLOCK_BYTES);
    Google__Bigtable__V2__ReadModifyWriteRowRequest req;
    google__bigtable__v2__read_modify_write_row_request__init(&req);
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    req.row_key = (ProtobufCBinaryData){row.len, (uint8_t *)row.data};
    req.n_rules = n;
    req.rules = arena_zalloc(&a, (n ? n : 1) * sizeof *req.rules);
    for (size_t i = 0; i < n; i++) {
        Google__Bigtable__V2__ReadModifyWriteRule *r = arena_zalloc(&a, sizeof *r);
        google__bigtable__v2__read_modify_write_rule__init(r);
        r->family_name = arena_str(&a, rules[i].family);
        r->column_qualifier = arena_bytes(&a, rules[i].qualifier);
        if (rules[i].append) {
            r->rule_case = GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_APPEND_VALUE;
            r->append_value = arena_bytes(&a, rules[i].value);
        } else {
            r->rule_case = GOOGLE__BIGTABLE__V2__READ_MODIFY_WRITE_RULE__RULE_INCREMENT_AMOUNT;
            r->increment_amount = rules[i].increment;
        }
        req.rules[i] = r;
    }
    st_buf resp;
    st_buf_init(&resp);
    st_code rc = call_unary(c, BT_DATA_SVC, "ReadModifyWriteRow", &req.base, name, &resp, st);
    if (rc == ST_OK) {
        Google__Bigtable__V2__ReadModifyWriteRowResponse *r =
            google__bigtable__v2__read_modify_write_row_response__unpack(NULL, resp.len, resp.data);
        if (!r)
            rc = st_err_set(st, ST_INTERNAL, "ReadModifyWriteRow: unparseable answer");
        else if (dump && r->row)
            dump_pb_row(dump, r->row, with_ts);
        if (r)
            google__bigtable__v2__read_modify_write_row_response__free_unpacked(r, NULL);
    }
    st_buf_free(&resp);
    st_arena_deinit(&a);
    return rc;
}

typedef struct sample_ctx {
    st_buf *dump;
    size_t n;
} sample_ctx;

static void sample_each(const ProtobufCMessage *m, void *arg) {
    sample_ctx *x = arg;
    const Google__Bigtable__V2__SampleRowKeysResponse *r = (const void *)m;
    x->n++;
    if (x->dump) {
        char num[32];
        bt_escape(x->dump, st_slice_make(r->row_key.data, r->row_key.len));
        int k = snprintf(num, sizeof num, "\t%" PRId64 "\n", r->offset_bytes);
        st_buf_append(x->dump, num, (size_t)k);
    }
}

st_code bt_sample_row_keys(const bt_client *c, const char *table, st_buf *dump, size_t *n_keys,
                           st_err *st) {
    char name[BT_NAME_MAX];
    bt_table_name(c, table, name);
    Google__Bigtable__V2__SampleRowKeysRequest req;
    google__bigtable__v2__sample_row_keys_request__init(&req);
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    sample_ctx x = {dump, 0};
    stream_sink sink = {&google__bigtable__v2__sample_row_keys_response__descriptor, sample_each,
                        &x, false};
    st_code rc = call_stream(c, "SampleRowKeys", &req.base, name, NULL, &sink, st);
    if (rc == ST_OK && sink.bad)
        rc = st_err_set(st, ST_INTERNAL, "SampleRowKeys: unparseable answer");
    if (n_keys)
        *n_keys = x.n;
    return rc;
}

/* ---------------------------------------------------------------- the chunk reader
 * States and rules follow the Go client's chunkReader (bigtable/reader.go):
 *   NEW_ROW: no reset_row; the chunk needs row_key, family_name and qualifier; keys strictly
 *            increase (decrease when reversed).
 *   ROW_IN_PROGRESS: reset_row drops the row (and must carry nothing else); a row_key, if set,
 *            must be the current one; a family needs a qualifier.
 *   CELL_IN_PROGRESS (value split, value_size > 0 seen): only value / value_size / row_status.
 * commit_row is refused on a chunk with value_size > 0; the stream must end between rows.
 * Additionally (the protocol text, not checked by Go): labels only on a cell's first chunk, and a
 * split value's final length must equal the announced value_size. */
typedef struct cell_rec {
    size_t fam_off, fam_len, qual_off, qual_len, lab_off, lab_len, n_labels, val_off, val_len;
    int64_t ts;
} cell_rec;

enum { CR_NEW_ROW, CR_ROW, CR_CELL };

struct bt_chunk_reader {
    bool reversed;
    bt_row_fn fn;
    void *arg;
    int state;
    bool have_last, failed;
    st_buf last_key, cur_key, fam, qual, data;
    cell_rec *cells;
    size_t n_cells, cap_cells;
    int64_t announced; /* value_size of the cell being split, 0 if none */
    uint64_t rows;
    st_err err;
};

bt_chunk_reader *bt_chunk_reader_new(bool reversed, bt_row_fn fn, void *arg) {
    bt_chunk_reader *r = calloc(1, sizeof *r);
    ST_ASSERT(r != NULL);
    r->reversed = reversed;
    r->fn = fn;
    r->arg = arg;
    st_buf_init(&r->last_key);
    st_buf_init(&r->cur_key);
    st_buf_init(&r->fam);
    st_buf_init(&r->qual);
    st_buf_init(&r->data);
    return r;
}

void bt_chunk_reader_free(bt_chunk_reader *r) {
    if (!r)
        return;
    st_buf_free(&r->last_key);
    st_buf_free(&r->cur_key);
    st_buf_free(&r->fam);
    st_buf_free(&r->qual);
    st_buf_free(&r->data);
    free(r->cells);
    free(r);
}

uint64_t bt_chunk_reader_rows(const bt_chunk_reader *r) {
    return r->rows;
}

typedef Google__Bigtable__V2__ReadRowsResponse__CellChunk bt_chunk;

static st_code cr_fail(bt_chunk_reader *r, st_err *err, const char *what) {
    if (!r->failed) {
        r->failed = true;
        st_err_set(&r->err, ST_INTERNAL, "chunk protocol: %s (row %" PRIu64 ")", what, r->rows);
    }
    if (err)
        *err = r->err;
    return ST_INTERNAL;
}

static void buf_set(st_buf *b, const void *p, size_t n) {
    st_buf_reset(b);
    ST_ASSERT(st_buf_append(b, p, n) == ST_OK);
}

static bool chunk_is_reset(const bt_chunk *c) {
    return c->row_status_case ==
               GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_RESET_ROW &&
           c->reset_row;
}

static bool chunk_is_commit(const bt_chunk *c) {
    return c->row_status_case ==
               GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW &&
           c->commit_row;
}

static void cr_drop_row(bt_chunk_reader *r) {
    st_buf_reset(&r->data);
    r->n_cells = 0;
    r->announced = 0;
    r->state = CR_NEW_ROW;
}

static const char *cr_check_reset(const bt_chunk *c) {
    if (c->row_key.len || c->family_name || c->qualifier || c->value.len || c->value_size ||
        c->n_labels || c->timestamp_micros)
        return "reset_row with other fields set";
    return NULL;
}

/* The state checks before the chunk's cell data is taken; NULL if the chunk is acceptable. */
static const char *cr_check(bt_chunk_reader *r, const bt_chunk *c) {
    if (r->state == CR_NEW_ROW) {
        if (chunk_is_reset(c))
            return "reset_row between rows";
        if (!c->row_key.len || !c->family_name || !c->qualifier)
            return "a new row's first chunk lacks row_key, family_name or qualifier";
        if (r->have_last) {
            int cmp = st_slice_cmp(st_slice_make(c->row_key.data, c->row_key.len),
                                   st_slice_make(r->last_key.data, r->last_key.len));
            if (r->reversed ? cmp >= 0 : cmp <= 0)
                return r->reversed ? "row keys not strictly decreasing (reversed read)"
                                   : "row keys not strictly increasing";
        }
        return NULL;
    }
    if (chunk_is_reset(c))
        return cr_check_reset(c);
    if (r->state == CR_ROW) {
        if (c->row_key.len && !st_slice_eq(st_slice_make(c->row_key.data, c->row_key.len),
                                           st_slice_make(r->cur_key.data, r->cur_key.len)))
            return "a new row_key before the current row was committed";
        if (c->family_name && !c->qualifier)
            return "family_name without qualifier";
        return NULL;
    }
    if (c->row_key.len || c->family_name || c->qualifier || c->timestamp_micros || c->n_labels)
        return "cell key fields or labels in a value continuation chunk";
    return NULL;
}

static void cr_start_cell(bt_chunk_reader *r, const bt_chunk *c) {
    if (c->family_name)
        buf_set(&r->fam, c->family_name->value, strlen(c->family_name->value));
    if (c->qualifier)
        buf_set(&r->qual, c->qualifier->value.data, c->qualifier->value.len);
    if (r->n_cells == r->cap_cells) {
        r->cap_cells = r->cap_cells ? 2 * r->cap_cells : 16;
        r->cells = realloc(r->cells, r->cap_cells * sizeof *r->cells);
        ST_ASSERT(r->cells != NULL);
    }
    cell_rec *x = &r->cells[r->n_cells++];
    memset(x, 0, sizeof *x);
    x->ts = c->timestamp_micros;
    x->fam_off = r->data.len;
    x->fam_len = r->fam.len;
    st_buf_append(&r->data, r->fam.data, r->fam.len);
    x->qual_off = r->data.len;
    x->qual_len = r->qual.len;
    st_buf_append(&r->data, r->qual.data, r->qual.len);
    x->lab_off = r->data.len;
    for (size_t i = 0; i < c->n_labels; i++) {
        if (i)
            st_buf_append_byte(&r->data, ',');
        st_buf_append(&r->data, c->labels[i], strlen(c->labels[i]));
    }
    x->lab_len = r->data.len - x->lab_off;
    x->n_labels = c->n_labels;
    x->val_off = r->data.len;
}

static void cr_emit(bt_chunk_reader *r) {
    bt_cell *cells = calloc(r->n_cells ? r->n_cells : 1, sizeof *cells);
    ST_ASSERT(cells != NULL);
    const uint8_t *d = r->data.data;
    for (size_t i = 0; i < r->n_cells; i++) {
        const cell_rec *x = &r->cells[i];
        cells[i].family = st_slice_make(d + x->fam_off, x->fam_len);
        cells[i].qualifier = st_slice_make(d + x->qual_off, x->qual_len);
        cells[i].ts_us = x->ts;
        cells[i].labels = st_slice_make(d + x->lab_off, x->lab_len);
        cells[i].n_labels = x->n_labels;
        cells[i].value = st_slice_make(d + x->val_off, x->val_len);
    }
    bt_row row = {st_slice_make(r->cur_key.data, r->cur_key.len), cells, r->n_cells};
    if (r->fn)
        r->fn(&row, r->arg);
    free(cells);
    buf_set(&r->last_key, r->cur_key.data, r->cur_key.len);
    r->have_last = true;
    r->rows++;
    cr_drop_row(r);
}

st_code bt_chunk_reader_feed(bt_chunk_reader *r, const bt_chunk *c, st_err *err) {
    if (r->failed)
        return cr_fail(r, err, "already failed");
    const char *bad = cr_check(r, c);
    if (bad)
        return cr_fail(r, err, bad);
    if (chunk_is_reset(c)) {
        cr_drop_row(r);
        return ST_OK;
    }
    if (r->state == CR_NEW_ROW) {
        buf_set(&r->cur_key, c->row_key.data, c->row_key.len);
        st_buf_reset(&r->data);
        r->n_cells = 0;
    }
    if (r->state != CR_CELL) {
        cr_start_cell(r, c);
        r->announced = c->value_size;
    }
    /* cr_start_cell may have moved r->data; the open cell is always the last record. */
    ST_ASSERT(st_buf_append(&r->data, c->value.data, c->value.len) == ST_OK);
    cell_rec *x = &r->cells[r->n_cells - 1];
    x->val_len += c->value.len;
    if (c->value_size > 0) {
        if (chunk_is_commit(c))
            return cr_fail(r, err, "commit_row on a chunk with value_size > 0");
        r->state = CR_CELL;
        return ST_OK;
    }
    if (r->announced > 0 && (int64_t)x->val_len != r->announced)
        return cr_fail(r, err, "split value's length differs from the announced value_size");
    r->announced = 0;
    r->state = CR_ROW;
    if (chunk_is_commit(c))
        cr_emit(r);
    return ST_OK;
}

st_code bt_chunk_reader_finish(bt_chunk_reader *r, st_err *err) {
    if (r->failed)
        return cr_fail(r, err, "already failed");
    if (r->state != CR_NEW_ROW)
        return cr_fail(r, err, "stream ended inside a row (no commit_row)");
    return ST_OK;
}

/* ---------------------------------------------------------------- ReadRows */

static void read_each(const ProtobufCMessage *m, void *arg) {
    bt_chunk_reader *cr = arg;
    const Google__Bigtable__V2__ReadRowsResponse *r = (const void *)m;
    for (size_t i = 0; i < r->n_chunks; i++)
        if (bt_chunk_reader_feed(cr, r->chunks[i], NULL) != ST_OK)
            break;
}

/* base64 (URL alphabet, padded) as the Go client encodes the bigtable-features header. */
static void base64url(const uint8_t *in, size_t n, char *out, size_t cap) {
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = T[(v >> 18) & 63];
        out[o++] = T[(v >> 12) & 63];
        out[o++] = i + 1 < n ? T[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? T[v & 63] : '=';
    }
    out[o] = '\0';
}

static void features_reverse(char *out, size_t cap) {
    Google__Bigtable__V2__FeatureFlags ff;
    google__bigtable__v2__feature_flags__init(&ff);
    ff.reverse_scans = 1;
    uint8_t buf[64];
    size_t n = google__bigtable__v2__feature_flags__pack(&ff, buf);
    base64url(buf, n, out, cap);
}

st_code bt_read_rows(const bt_client *c, const char *table, const bt_read_req *rq, bt_row_fn fn,
                     void *arg, st_err *st) {
    char name[BT_NAME_MAX], features[64];
    bt_table_name(c, table, name);
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = name;
    if (c->app_profile[0])
        req.app_profile_id = (char *)c->app_profile;
    req.rows = (Google__Bigtable__V2__RowSet *)rq->rows;
    req.filter = (bt_filter *)rq->filter;
    req.rows_limit = rq->rows_limit;
    req.reversed = rq->reversed;
    features_reverse(features, sizeof features);
    bt_chunk_reader *cr = bt_chunk_reader_new(rq->reversed, fn, arg);
    stream_sink sink = {&google__bigtable__v2__read_rows_response__descriptor, read_each, cr,
                        false};
    st_code rc = call_stream(c, "ReadRows", &req.base, name,
                             rq->no_reverse_feature ? NULL : features, &sink, st);
    if (rc == ST_OK) {
        st_err e;
        if (sink.bad)
            rc = st_err_set(st, ST_INTERNAL, "ReadRows: unparseable response message");
        else if (bt_chunk_reader_finish(cr, &e) != ST_OK) {
            rc = ST_INTERNAL;
            if (st)
                *st = e;
        }
    }
    bt_chunk_reader_free(cr);
    return rc;
}

typedef struct dump_ctx {
    st_buf *dump;
    size_t rows;
} dump_ctx;

static void dump_row_cb(const bt_row *row, void *arg) {
    dump_ctx *d = arg;
    d->rows++;
    bt_dump_row(d->dump, row, true);
}

st_code bt_read_dump(const bt_client *c, const char *table, const bt_read_req *req, st_buf *dump,
                     size_t *n_rows, st_err *st) {
    dump_ctx d = {dump, 0};
    st_code rc = bt_read_rows(c, table, req, dump_row_cb, &d, st);
    if (n_rows)
        *n_rows = d.rows;
    return rc;
}

/* ---------------------------------------------------------------- canonical dump */

void bt_escape(st_buf *out, st_slice s) {
    static const char H[] = "0123456789abcdef";
    for (size_t i = 0; i < s.len; i++) {
        uint8_t b = s.data[i];
        if (b >= 0x21 && b < 0x7f && b != '\\') {
            st_buf_append_byte(out, b);
        } else {
            uint8_t e[4] = {'\\', 'x', (uint8_t)H[b >> 4], (uint8_t)H[b & 15]};
            st_buf_append(out, e, 4);
        }
    }
}

static void append_hex(st_buf *out, st_slice s) {
    static const char H[] = "0123456789abcdef";
    ST_ASSERT(st_buf_reserve(out, 2 * s.len) == ST_OK);
    for (size_t i = 0; i < s.len; i++) {
        out->data[out->len++] = (uint8_t)H[s.data[i] >> 4];
        out->data[out->len++] = (uint8_t)H[s.data[i] & 15];
    }
}

static int cell_dup_cmp(const void *pa, const void *pb) {
    const bt_cell *a = pa, *b = pb;
    int c = st_slice_cmp(a->labels, b->labels);
    return c ? c : st_slice_cmp(a->value, b->value);
}

static bool cell_same_coord(const bt_cell *a, const bt_cell *b) {
    return a->ts_us == b->ts_us && st_slice_eq(a->family, b->family) &&
           st_slice_eq(a->qualifier, b->qualifier);
}

void bt_dump_row(st_buf *out, const bt_row *row, bool with_ts) {
    bt_cell *cells = malloc((row->n_cells ? row->n_cells : 1) * sizeof *cells);
    ST_ASSERT(cells != NULL);
    if (row->n_cells)
        memcpy(cells, row->cells, row->n_cells * sizeof *cells);
    for (size_t i = 0; i < row->n_cells;) {
        size_t j = i + 1;
        while (j < row->n_cells && cell_same_coord(&cells[i], &cells[j]))
            j++;
        if (j - i > 1)
            qsort(cells + i, j - i, sizeof *cells, cell_dup_cmp);
        i = j;
    }
    for (size_t i = 0; i < row->n_cells; i++) {
        char num[32];
        bt_escape(out, row->key);
        st_buf_append_byte(out, '\t');
        bt_escape(out, cells[i].family);
        st_buf_append_byte(out, '\t');
        bt_escape(out, cells[i].qualifier);
        int k = with_ts ? snprintf(num, sizeof num, "\t%" PRId64 "\t", cells[i].ts_us)
                        : snprintf(num, sizeof num, "\t*\t");
        st_buf_append(out, num, (size_t)k);
        st_buf_append(out, cells[i].labels.data, cells[i].labels.len);
        st_buf_append_byte(out, '\t');
        append_hex(out, cells[i].value);
        st_buf_append_byte(out, '\n');
    }
    free(cells);
}

/* ---------------------------------------------------------------- filters and row sets */

bt_filter *bt_filter_new(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind) {
    bt_filter *f = arena_zalloc(a, sizeof *f);
    google__bigtable__v2__row_filter__init(f);
    f->filter_case = kind;
    switch (kind) {
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_SINK:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_PASS_ALL_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_BLOCK_ALL_FILTER:
    case GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_STRIP_VALUE_TRANSFORMER:
        f->sink = 1; /* the booleans share the union's first bytes */
        break;
    default:
        break;
    }
    return f;
}

bt_filter *bt_filter_bytes(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind,
                           st_slice s) {
    bt_filter *f = bt_filter_new(a, kind);
    if (kind == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER ||
        kind == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_APPLY_LABEL_TRANSFORMER) {
        char *p = arena_zalloc(a, s.len + 1);
        memcpy(p, s.data, s.len);
        f->family_name_regex_filter = p; /* same union slot as apply_label_transformer */
    } else {
        f->row_key_regex_filter = arena_bytes(a, s); /* same slot for every bytes member */
    }
    return f;
}

bt_filter *bt_filter_int(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind, int32_t n) {
    bt_filter *f = bt_filter_new(a, kind);
    f->cells_per_row_limit_filter = n; /* the int32 members share one union slot */
    return f;
}

bt_filter *bt_filter_list(st_arena *a, Google__Bigtable__V2__RowFilter__FilterCase kind,
                          bt_filter *const *subs, size_t n) {
    bt_filter *f = bt_filter_new(a, kind);
    bt_filter **v = arena_zalloc(a, (n ? n : 1) * sizeof *v);
    if (n)
        memcpy(v, subs, n * sizeof *v);
    if (kind == GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN) {
        f->chain = arena_zalloc(a, sizeof *f->chain);
        google__bigtable__v2__row_filter__chain__init(f->chain);
        f->chain->n_filters = n;
        f->chain->filters = v;
    } else {
        f->interleave = arena_zalloc(a, sizeof *f->interleave);
        google__bigtable__v2__row_filter__interleave__init(f->interleave);
        f->interleave->n_filters = n;
        f->interleave->filters = v;
    }
    return f;
}

#define BT_ROWSET_ITEMS_MAX 4096 /* keys or ranges per set built by these helpers */

Google__Bigtable__V2__RowSet *bt_rowset_new(st_arena *a) {
    Google__Bigtable__V2__RowSet *s = arena_zalloc(a, sizeof *s);
    google__bigtable__v2__row_set__init(s);
    s->row_keys = arena_zalloc(a, BT_ROWSET_ITEMS_MAX * sizeof *s->row_keys);
    s->row_ranges = arena_zalloc(a, BT_ROWSET_ITEMS_MAX * sizeof *s->row_ranges);
    return s;
}

void bt_rowset_add_key(st_arena *a, Google__Bigtable__V2__RowSet *s, st_slice key) {
    ST_ASSERT(s->n_row_keys < BT_ROWSET_ITEMS_MAX);
    s->row_keys[s->n_row_keys++] = arena_bytes(a, key);
}

void bt_rowset_add_range(st_arena *a, Google__Bigtable__V2__RowSet *s, const st_slice *start,
                         bool start_closed, const st_slice *end, bool end_closed) {
    ST_ASSERT(s->n_row_ranges < BT_ROWSET_ITEMS_MAX);
    Google__Bigtable__V2__RowRange *r = arena_zalloc(a, sizeof *r);
    google__bigtable__v2__row_range__init(r);
    if (start) {
        r->start_key_case = start_closed
                                ? GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED
                                : GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
        r->start_key_closed = arena_bytes(a, *start);
    }
    if (end) {
        r->end_key_case = end_closed ? GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED
                                     : GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        r->end_key_open = arena_bytes(a, *end);
    }
    s->row_ranges[s->n_row_ranges++] = r;
}

/* ---------------------------------------------------------------- processes */

uint16_t bt_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

const char *bt_emulator_path(void) {
    const char *e = getenv("STRATA_EMULATOR");
    return e && *e ? e : "/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator";
}

/* Reads up to cap-1 bytes of the file (from offset from), NUL-terminated; returns bytes read. */
static size_t read_file_at(const char *path, long from, char *out, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    if (f) {
        if (from > 0)
            fseek(f, from, SEEK_SET);
        n = fread(out, 1, cap - 1, f);
        fclose(f);
    }
    out[n] = '\0';
    return n;
}

/* Looks for "listening on HOST:PORT" / "running on HOST:PORT" in the log. */
static bool find_ready(const char *log, char *addr, size_t cap) {
    static const char *const MARKS[] = {"listening on ", "running on "};
    for (size_t i = 0; i < 2; i++) {
        const char *p = strstr(log, MARKS[i]);
        if (!p)
            continue;
        p += strlen(MARKS[i]);
        size_t n = strcspn(p, " \t\r\n");
        const char *nl = strchr(p, '\n');
        if (!nl || n == 0 || n >= cap)
            continue; /* wait for the whole line */
        memcpy(addr, p, n);
        addr[n] = '\0';
        return true;
    }
    return false;
}

static st_code proc_exited(bt_proc *p, int status, st_err *err) {
    char tail[BT_LOG_TAIL_BYTES];
    struct stat sb;
    long from = stat(p->log_path, &sb) == 0 && sb.st_size > (off_t)sizeof tail - 1
                    ? (long)(sb.st_size - (off_t)sizeof tail + 1)
                    : 0;
    read_file_at(p->log_path, from, tail, sizeof tail);
    p->pid = 0;
    return st_err_set(err, ST_FAILED_PRECONDITION, "process exited (status %d) before ready: %s",
                      status, tail);
}

st_code bt_proc_start(bt_proc *p, char *const argv[], const char *log_path, st_err *err) {
    memset(p, 0, sizeof *p);
    snprintf(p->log_path, sizeof p->log_path, "%s", log_path);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return st_err_set(err, ST_INTERNAL, "open %s: %s", log_path, strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return st_err_set(err, ST_INTERNAL, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        /* The server must not outlive a crashed or killed test. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(argv[0], argv);
        dprintf(STDERR_FILENO, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    p->pid = pid;
    static char log[1 << 16]; /* test helper, single-threaded use */
    for (int waited_ms = 0; waited_ms < BT_START_WAIT_MS_MAX; waited_ms += 10) {
        read_file_at(log_path, 0, log, sizeof log);
        if (find_ready(log, p->addr, sizeof p->addr))
            return ST_OK;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return proc_exited(p, status, err);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    bt_proc_stop(p, SIGKILL, NULL);
    return st_err_set(err, ST_DEADLINE_EXCEEDED, "%s never printed its listening line (log %s)",
                      argv[0], log_path);
}

void bt_proc_stop(bt_proc *p, int sig, int *wstatus) {
    int status = 0;
    if (p->pid > 0) {
        kill(p->pid, sig);
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    p->pid = 0;
    if (wstatus)
        *wstatus = status;
}

st_code bt_node_start(bt_proc *p, const char *bin, const char *data_dir, st_err *err) {
    char log[BT_PATH_MAX];
    snprintf(log, sizeof log, "%s.log", data_dir);
    char *argv[] = {(char *)bin, "--data", (char *)data_dir, "--listen", "127.0.0.1:0", NULL};
    return bt_proc_start(p, argv, log, err);
}

st_code bt_emulator_start(bt_proc *p, const char *bin, const char *log_dir, st_err *err) {
    char log[BT_PATH_MAX], port[16];
    snprintf(log, sizeof log, "%s/emulator.log", log_dir);
    snprintf(port, sizeof port, "%u", (unsigned)bt_free_port());
    char *argv[] = {(char *)bin, "-host", "127.0.0.1", "-port", port, NULL};
    return bt_proc_start(p, argv, log, err);
}

/* ---------------------------------------------------------------- temporary directories */

void bt_rmrf(const char *path) {
    tu_rmrf(path);
}

void bt_tmpdir(char *out, size_t cap, const char *name) {
    tu_tmpdir(out, cap, name);
}
