/* meta.c — instance metadata kept in the instance itself: the table RTR_META_TABLE, one tablet on
 * the first node of every cluster, rows "table/<full name>", "profile/<id>", "backup/<full name>"
 * and "op/<operation name>" whose one cell (family m, qualifier v) holds the serialized
 * google.bigtable.admin.v2.Table / AppProfile or strata.internal.v1.BackupRecord /
 * OperationRecord.
 * Writes go to every cluster's copy; reads take the first cluster that answers, with newer
 * versions of its records from the other healthy clusters; the cache is re-read every
 * meta_refresh_ms so other routers' changes show, which is why every write is bounded
 * (rtr_meta_record_check). See docs/router.md. */
#include "failover.h"
#include "instance.h"
#include "router_internal.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/internal/v1/node.pb-c.h"

/* ---- records (pure) ---- */

static rtr_meta_rec **recs(rtr_meta *m, rtr_meta_kind kind, size_t **n) {
    switch (kind) {
    case RTR_META_KIND_TABLE:
        *n = &m->n_tables;
        return &m->tables;
    case RTR_META_KIND_PROFILE:
        *n = &m->n_profiles;
        return &m->profiles;
    case RTR_META_KIND_BACKUP:
        *n = &m->n_backups;
        return &m->backups;
    case RTR_META_KIND_IAM:
        *n = &m->n_iams;
        return &m->iams;
    default:
        *n = &m->n_ops;
        return &m->ops;
    }
}

/* Index of name, or of where it would go (*found false). */
static size_t rec_pos(const rtr_meta_rec *v, size_t n, const char *name, bool *found) {
    size_t lo = 0, hi = n;
    *found = false;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v[mid].name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void rtr_meta_free(rtr_meta *m) {
    for (int k = 0; k < RTR_META_KINDS; k++) {
        size_t *n;
        rtr_meta_rec **v = recs(m, (rtr_meta_kind)k, &n);
        for (size_t i = 0; i < *n; i++) {
            free((*v)[i].name);
            free((*v)[i].pb);
        }
        free(*v);
    }
    memset(m, 0, sizeof *m);
}

const rtr_meta_rec *rtr_meta_find(const rtr_meta *m, rtr_meta_kind kind, const char *name) {
    size_t *np;
    const rtr_meta_rec *v = *recs((rtr_meta *)m, kind, &np);
    size_t n = *np;
    bool found;
    size_t i = rec_pos(v, n, name, &found);
    return found ? &v[i] : NULL;
}

st_code rtr_meta_put(rtr_meta *m, rtr_meta_kind kind, const char *name, st_slice pb) {
    size_t *n;
    rtr_meta_rec **v = recs(m, kind, &n);
    bool found;
    size_t i = rec_pos(*v, *n, name, &found);
    uint8_t *copy = malloc(pb.len ? pb.len : 1);
    if (!copy)
        return ST_RESOURCE_EXHAUSTED;
    if (pb.len)
        memcpy(copy, pb.data, pb.len);
    if (found) {
        free((*v)[i].pb);
        (*v)[i].pb = copy;
        (*v)[i].len = pb.len;
        (*v)[i].ts_us = 0;
        return ST_OK;
    }
    char *nm = strdup(name);
    rtr_meta_rec *nv =
        m->n_tables + m->n_profiles + m->n_backups + m->n_ops + m->n_iams < RTR_META_RECORDS_MAX
            ? realloc(*v, (*n + 1) * sizeof *nv)
            : NULL;
    if (!nm || !nv) {
        free(nm);
        free(copy);
        if (nv)
            *v = nv;
        return ST_RESOURCE_EXHAUSTED;
    }
    *v = nv;
    memmove(&nv[i + 1], &nv[i], (*n - i) * sizeof *nv);
    nv[i] = (rtr_meta_rec){nm, copy, pb.len, 0};
    (*n)++;
    return ST_OK;
}

void rtr_meta_del(rtr_meta *m, rtr_meta_kind kind, const char *name) {
    size_t *n;
    rtr_meta_rec **v = recs(m, kind, &n);
    bool found;
    size_t i = rec_pos(*v, *n, name, &found);
    if (!found)
        return;
    free((*v)[i].name);
    free((*v)[i].pb);
    memmove(&(*v)[i], &(*v)[i + 1], (*n - i - 1) * sizeof **v);
    (*n)--;
}

/* A record as read from a copy, with its cell's timestamp (rtr_meta_merge_newer compares them). */
static st_code put_loaded(rtr_meta *m, rtr_meta_kind kind, const char *name, st_slice pb,
                          int64_t ts_us) {
    st_code rc = rtr_meta_put(m, kind, name, pb);
    if (rc == ST_OK)
        ((rtr_meta_rec *)rtr_meta_find(m, kind, name))->ts_us = ts_us;
    return rc;
}

st_code rtr_meta_merge_newer(rtr_meta *base, const rtr_meta *other) {
    for (int k = 0; k < RTR_META_KINDS; k++) {
        size_t *n;
        const rtr_meta_rec *v = *recs((rtr_meta *)other, (rtr_meta_kind)k, &n);
        for (size_t i = 0; i < *n; i++) {
            const rtr_meta_rec *b = rtr_meta_find(base, (rtr_meta_kind)k, v[i].name);
            if (!b || b->ts_us >= v[i].ts_us)
                continue; /* absent: maybe deleted since (no tombstones); or not newer */
            st_code rc = put_loaded(base, (rtr_meta_kind)k, v[i].name,
                                    st_slice_make(v[i].pb, v[i].len), v[i].ts_us);
            if (rc != ST_OK)
                return rc;
        }
    }
    return ST_OK;
}

static const char *kind_prefix(rtr_meta_kind kind) {
    static const char *const prefixes[RTR_META_KINDS] = {
        RTR_META_TABLE_PREFIX, RTR_META_PROFILE_PREFIX, RTR_META_BACKUP_PREFIX, RTR_META_OP_PREFIX,
        RTR_META_IAM_PREFIX};
    return prefixes[kind];
}

/* ---- record size (pure) ---- */

st_code rtr_meta_record_check(rtr_meta_kind kind, const char *name, size_t len, st_err *err) {
    static const char *const remedy[RTR_META_KINDS] = {
        [RTR_META_KIND_TABLE] = "give the table fewer column families or smaller GC rules",
        [RTR_META_KIND_PROFILE] = "shorten the app profile's description",
        [RTR_META_KIND_BACKUP] = "back up a table of fewer tablets",
        [RTR_META_KIND_OP] = "send a smaller request",
        [RTR_META_KIND_IAM] = "grant roles to fewer principals"};
    size_t max =
        kind == RTR_META_KIND_BACKUP ? RTR_META_BACKUP_RECORD_BYTES_MAX : RTR_META_RECORD_BYTES_MAX;
    if (len <= max)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "the metadata record of %.300s would take %zu bytes, more than the %zu a "
                      "record may take (every router reads the whole metadata table every "
                      "second): %s",
                      name, len, max, remedy[kind]);
}

/* rtr_meta_record_check of the record at row key (a row of no kind, such as a backup claim:
 * RTR_META_RECORD_BYTES_MAX). */
static st_code key_check(st_slice key, size_t len, st_err *err) {
    char name[RTR_OP_NAME_MAX + 1]; /* the longest name of any kind */
    rtr_meta_kind kind = RTR_META_KIND_OP;
    if (!rtr_meta_parse_row_key(key, &kind, name, sizeof name))
        snprintf(name, sizeof name, "%.*s", (int)(key.len < 300 ? key.len : 300),
                 (const char *)key.data);
    return rtr_meta_record_check(kind, name, len, err);
}

st_code rtr_meta_row_key(rtr_meta_kind kind, const char *name, st_buf *out) {
    const char *p = kind_prefix(kind);
    st_buf_reset(out);
    if (st_buf_append(out, p, strlen(p)) != ST_OK ||
        st_buf_append(out, name, strlen(name)) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

bool rtr_meta_parse_row_key(st_slice key, rtr_meta_kind *kind, char *name, size_t name_cap) {
    for (int k = 0; k < RTR_META_KINDS; k++) {
        st_slice p = st_slice_cstr(kind_prefix((rtr_meta_kind)k));
        if (!st_slice_has_prefix(key, p))
            continue;
        size_t len = key.len - p.len;
        if (len == 0 || len >= name_cap || memchr(key.data + p.len, 0, len))
            return false;
        memcpy(name, key.data + p.len, len);
        name[len] = '\0';
        *kind = (rtr_meta_kind)k;
        return true;
    }
    return false;
}

/* Whole rows per message, one cell per row (the read asks for the latest version only). */
st_code rtr_meta_feed(rtr_meta *m, st_slice msg) {
    Google__Bigtable__V2__ReadRowsResponse *r = (void *)btu_pb_unpack(
        &google__bigtable__v2__read_rows_response__descriptor, NULL, msg, NULL);
    if (!r)
        return ST_INTERNAL;
    st_code rc = ST_OK;
    st_slice key = {0};
    st_buf value;
    st_buf_init(&value);
    int cell = 0; /* 0: no cell yet, 1: first cell's value continues, 2: first cell complete */
    int64_t ts_us = 0;
    for (size_t i = 0; i < r->n_chunks && rc == ST_OK; i++) {
        const Google__Bigtable__V2__ReadRowsResponse__CellChunk *c = r->chunks[i];
        if (c->row_key.len) {
            key = st_slice_make(c->row_key.data, c->row_key.len);
            if (m->seed_key && st_slice_eq(key, st_slice_make(m->seed_key, strlen(m->seed_key))))
                m->seed_pending = true;
            st_buf_reset(&value);
            cell = 0;
        }
        /* Only the first (latest) cell counts; later chunks of other cells are skipped. */
        if (cell < 2) {
            if (cell == 0)
                ts_us = c->timestamp_micros;
            if (st_buf_append(&value, c->value.data, c->value.len) != ST_OK)
                rc = ST_RESOURCE_EXHAUSTED;
            cell = c->value_size > 0 ? 1 : 2;
        }
        if (c->row_status_case ==
                GOOGLE__BIGTABLE__V2__READ_ROWS_RESPONSE__CELL_CHUNK__ROW_STATUS_COMMIT_ROW &&
            c->commit_row && rc == ST_OK) {
            char name[RTR_TABLE_NAME_MAX + 1];
            rtr_meta_kind kind;
            if (rtr_meta_parse_row_key(key, &kind, name, sizeof name))
                rc = put_loaded(m, kind, name, st_buf_slice(&value), ts_us);
        }
    }
    st_buf_free(&value);
    google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
    return rc;
}

/* ---- loading ---- */

typedef struct meta_load {
    rtr_ctx *r;
    size_t cluster, tablet;
    rtr_meta m;    /* the copy being read */
    rtr_meta base; /* the first complete copy, with newer records of later copies merged in */
    bool have_base;
    char seed_key[sizeof RTR_META_SEED_PREFIX + ST_TOPO_ID_MAX]; /* of the cluster read */
    bool *pending; /* per cluster: its copy waits to be seeded (NULL: not asked) */
    uint64_t gen_at_start;
    st_code feed_rc;
    void (*done)(void *arg, st_code code);
    void *arg;
} meta_load;

static void load_next(meta_load *l);

/* ReadRows of [start, end) of the metadata table, latest version of each cell only. */
static st_code load_request(const rtr_tablet *tb, st_buf *out) {
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    Google__Bigtable__V2__RowFilter filter;
    google__bigtable__v2__row_filter__init(&filter);
    filter.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    filter.cells_per_column_limit_filter = 1;
    req.table_name = (char *)RTR_META_TABLE;
    req.filter = &filter;
    size_t len = google__bigtable__v2__read_rows_request__get_packed_size(&req);
    if (st_buf_reserve(out, len + 2 * BTU_ROW_KEY_MAX + 32) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__v2__read_rows_request__pack(&req, out->data);
    btu_key_range range = {tb->start, tb->end};
    btu_rowset rs = {&range, 1};
    return rtr_wire_put_rowset(out, 2, &rs);
}

static void load_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    meta_load *l = arg;
    if (l->feed_rc == ST_OK)
        l->feed_rc = rtr_meta_feed(&l->m, msg);
}

static void load_finish(meta_load *l, st_code code) {
    rtr_ctx *r = l->r;
    rtr_meta_free(&l->m);
    if (code == ST_OK && l->gen_at_start == r->meta_gen) {
        rtr_meta_free(&r->meta);
        l->base.seed_key = NULL; /* points into l */
        r->meta = l->base;       /* the new cache */
        r->meta_loaded = true;
    } else {
        rtr_meta_free(&l->base);
    }
    r->meta_loading = false;
    void (*done)(void *, st_code) = l->done;
    void *arg = l->arg;
    free(l);
    if (done)
        done(arg, code);
}

/* The metadata is read again every second, and a cluster with a node down fails every read:
 * one warning per failure was ~86,400 lines a day. So: the first failure, then one line every
 * RTR_META_FAIL_LOG_EVERY_MS counting those skipped, and one when reads work again. */
#define RTR_META_FAIL_LOG_EVERY_MS 60000

static void meta_fail_log(rtr_cluster *c, const char *why) {
    int64_t now = st_mono_us();
    if (c->meta_fail_log_us && now - c->meta_fail_log_us < RTR_META_FAIL_LOG_EVERY_MS * 1000LL) {
        c->meta_fail_skipped++;
        return;
    }
    st_log(ST_LOG_WARN, "router", "metadata read from cluster=%s failed: %s similar_skipped=%llu",
           c->topo->id, why, (unsigned long long)c->meta_fail_skipped);
    c->meta_fail_skipped = 0;
    c->meta_fail_log_us = now ? now : 1;
}

static void meta_ok_log(rtr_cluster *c) {
    if (!c->meta_fail_log_us)
        return;
    st_log(ST_LOG_INFO, "router", "metadata read from cluster=%s works again similar_skipped=%llu",
           c->topo->id, (unsigned long long)c->meta_fail_skipped);
    c->meta_fail_log_us = 0;
    c->meta_fail_skipped = 0;
}

static void load_fail_cluster(meta_load *l, const char *why) {
    meta_fail_log(&l->r->clusters[l->cluster], why);
    rtr_meta_free(&l->m);
    l->cluster++;
    l->tablet = 0;
    load_next(l);
}

static void load_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    meta_load *l = arg;
    if (code == ST_OK && l->feed_rc != ST_OK)
        code = l->feed_rc;
    if (code != ST_OK) {
        load_fail_cluster(l, message ? message : st_code_name(code));
        return;
    }
    if (l->m.seed_pending) {
        if (l->pending)
            l->pending[l->cluster] = true;
        load_fail_cluster(l, "its copy waits to be seeded from another cluster's");
        return;
    }
    l->tablet++;
    load_next(l);
}

/* A cluster's copy was read completely. The first such copy is the base (records it lacks stay
 * absent: without tombstones a record missing there may have been deleted). Later copies are
 * read too, for newer versions only: when the first cluster comes back from an outage its copy
 * lacks the writes made meanwhile (a `strata failover` away from it, above all) until
 * replication brings them, and serving it alone sent every router's requests back to the
 * cluster the operator had just moved them from, for as long as replication took. */
static void copy_read(meta_load *l) {
    if (!l->have_base) {
        l->base = l->m; /* taken over: l->m is cleared below, not freed */
        l->base.seed_key = NULL;
        l->have_base = true;
    } else {
        if (rtr_meta_merge_newer(&l->base, &l->m) != ST_OK)
            st_log(ST_LOG_WARN, "router", "metadata of cluster=%s not compared: out of memory",
                   l->r->clusters[l->cluster].topo->id);
        rtr_meta_free(&l->m);
    }
    memset(&l->m, 0, sizeof l->m);
    l->cluster++;
    l->tablet = 0;
    load_next(l);
}

static void load_next(meta_load *l) {
    rtr_ctx *r = l->r;
    if (l->cluster >= r->n_clusters || r->closing) {
        load_finish(l, l->have_base && !r->closing ? ST_OK : ST_UNAVAILABLE);
        return;
    }
    rtr_cluster *c = &r->clusters[l->cluster];
    if (l->have_base && !rtr_cluster_healthy(c)) { /* a hung copy must not hold up the reload */
        l->cluster++;
        load_next(l);
        return;
    }
    const rtr_tmap_table *t = rtr_tmap_find(c->map, RTR_META_TABLE);
    if (!t || t->n == 0) {
        load_fail_cluster(l, "no tablet of the metadata table is known");
        return;
    }
    if (l->tablet >= t->n) {
        meta_ok_log(c);
        copy_read(l);
        return;
    }
    st_buf req;
    st_buf_init(&req);
    st_err err = {0};
    l->feed_rc = ST_OK;
    const rtr_tablet *tb = &t->v[l->tablet];
    snprintf(l->seed_key, sizeof l->seed_key, "%s%s", RTR_META_SEED_PREFIX, c->topo->id);
    l->m.seed_key = l->seed_key;
    rpc_ccall *call = NULL;
    if (load_request(tb, &req) == ST_OK)
        call = rtr_node_call(&c->nodes[tb->node], RTR_BT "ReadRows", st_buf_slice(&req), NULL, 0,
                             RTR_ADMIN_TIMEOUT_MS, load_msg, load_done, l, &err);
    st_buf_free(&req);
    if (!call)
        load_fail_cluster(l, err.msg[0] ? err.msg : "out of memory");
}

static void meta_load_start(rtr_ctx *r, bool *pending, void (*done)(void *arg, st_code code),
                            void *arg) {
    meta_load *l = calloc(1, sizeof *l);
    if (!l) {
        if (done)
            done(arg, ST_RESOURCE_EXHAUSTED);
        return;
    }
    *l = (meta_load){
        .r = r, .pending = pending, .gen_at_start = r->meta_gen, .done = done, .arg = arg};
    r->meta_loading = true;
    load_next(l);
}

/* ---- bootstrap: the metadata table in every cluster ---- */

static st_code mutate_request(st_slice key, const st_slice *pb, st_buf *out);

typedef struct meta_boot {
    rtr_ctx *r;
    size_t n_clusters_todo;
    size_t todo[ST_TOPO_CLUSTERS_MAX];
    bool pending[ST_TOPO_CLUSTERS_MAX]; /* copies to seed (their marker found or written) */
    void (*done)(void *arg, st_code code);
    void *arg;
} meta_boot;

static size_t put_table_request(uint8_t *buf, size_t cap) {
    Google__Bigtable__Admin__V2__GcRule gc;
    google__bigtable__admin__v2__gc_rule__init(&gc);
    gc.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
    gc.max_num_versions = 1;
    Google__Bigtable__Admin__V2__ColumnFamily cf;
    google__bigtable__admin__v2__column_family__init(&cf);
    cf.gc_rule = &gc;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry e;
    google__bigtable__admin__v2__table__column_families_entry__init(&e);
    e.key = (char *)RTR_META_FAMILY;
    e.value = &cf;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry *ents[1] = {&e};
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.name = (char *)RTR_META_TABLE;
    t.n_column_families = 1;
    t.column_families = ents;
    Strata__Internal__V1__PutTableRequest req;
    strata__internal__v1__put_table_request__init(&req);
    req.table = &t;
    ST_ASSERT(strata__internal__v1__put_table_request__get_packed_size(&req) <= cap);
    return strata__internal__v1__put_table_request__pack(&req, buf);
}

static void boot_load_done(void *arg, st_code code) {
    meta_boot *b = arg;
    void (*done)(void *, st_code) = b->done;
    void *a = b->arg;
    free(b);
    done(a, code);
}

static void boot_load(meta_boot *b);
static void seed_mark(meta_boot *b);

static void boot_refreshed(void *arg) {
    meta_boot *b = arg;
    /* Copies made now while another cluster had one are marked before anything is read, so
     * that a router that stops half-way seeds them at its next start (boot_loaded). */
    if (b->n_clusters_todo > 0 && b->n_clusters_todo < b->r->n_clusters)
        seed_mark(b);
    else
        boot_load(b);
}

/* CreateTablet ALREADY_EXISTS means another router made it first: fine. */
static void boot_tablets_done(rtr_fan *f, void *arg) {
    meta_boot *b = arg;
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].code != ST_OK && f->res[i].code != ST_ALREADY_EXISTS)
            st_log(ST_LOG_WARN, "router", "creating the metadata tablet on %s failed: %s",
                   f->res[i].node ? f->res[i].node->addr : "?", f->res[i].err.msg);
    rtr_fan_free(f);
    /* The maps must show the new tablets before the load looks for them. */
    if (rtr_refresh_all(b->r, boot_refreshed, b) != ST_OK)
        boot_refreshed(b);
}

static void boot_schemas_done(rtr_fan *f, void *arg) {
    meta_boot *b = arg;
    rtr_ctx *r = b->r;
    rtr_fan_free(f);
    Strata__Internal__V1__CreateTabletRequest req;
    strata__internal__v1__create_tablet_request__init(&req);
    req.table_name = (char *)RTR_META_TABLE;
    uint8_t buf[128];
    size_t len = strata__internal__v1__create_tablet_request__pack(&req, buf);
    rtr_fan *g = rtr_fan_new(r, b->n_clusters_todo, RTR_ADMIN_TIMEOUT_MS, boot_tablets_done, b);
    if (!g) {
        boot_load(b);
        return;
    }
    for (size_t i = 0; i < b->n_clusters_todo; i++)
        rtr_fan_call(g, i, &r->clusters[b->todo[i]].nodes[0], RTR_NODE "CreateTablet",
                     st_slice_make(buf, len));
    rtr_fan_seal(g);
}

/* ---- seeding a copy that lost its records ---- */

/* A MutateRow of the metadata row key (pb: SetCell m:v at server time, NULL: DeleteFromRow) to
 * cluster c's node holding that row, as call i of f; false when no tablet of it is known. */
static bool seed_call(rtr_fan *f, size_t i, size_t c, st_slice key, const st_slice *pb) {
    rtr_ctx *r = f->ctx;
    const rtr_tmap_table *t =
        r->clusters[c].map ? rtr_tmap_find(r->clusters[c].map, RTR_META_TABLE) : NULL;
    size_t k = t ? rtr_tmap_row(t, key) : SIZE_MAX;
    st_buf req;
    st_buf_init(&req);
    bool ok = k != SIZE_MAX && mutate_request(key, pb, &req) == ST_OK;
    if (ok)
        rtr_fan_call(f, i, &r->clusters[c].nodes[t->v[k].node], RTR_BT "MutateRow",
                     st_buf_slice(&req));
    else
        f->res[i].code =
            st_err_set(&f->res[i].err, ST_UNAVAILABLE, "no tablet of the metadata table is known");
    st_buf_free(&req);
    return ok;
}

static size_t seed_n_pending(const meta_boot *b) {
    size_t n = 0;
    for (size_t c = 0; c < b->r->n_clusters; c++)
        n += b->pending[c];
    return n;
}

/* True when every call of f succeeded; the failures are logged with what. */
static bool seed_fan_ok(rtr_fan *f, const char *what) {
    bool ok = true;
    for (size_t i = 0; i < f->n; i++)
        if (f->res[i].code != ST_OK) {
            if (ok)
                st_log(ST_LOG_WARN, "router", "metadata seeding: %s failed: %s", what,
                       f->res[i].err.msg);
            ok = false;
        }
    return ok;
}

/* One MutateRow of the copy's own marker row (pb) or of its removal (NULL) per pending copy. */
static void seed_marker(meta_boot *b, const st_slice *pb, rtr_fan_done_fn done) {
    rtr_ctx *r = b->r;
    rtr_fan *f = rtr_fan_new(r, seed_n_pending(b), RTR_ADMIN_TIMEOUT_MS, done, b);
    if (!f) {
        boot_load_done(b, ST_RESOURCE_EXHAUSTED);
        return;
    }
    size_t i = 0;
    for (size_t c = 0; c < r->n_clusters; c++) {
        if (!b->pending[c])
            continue;
        char key[sizeof RTR_META_SEED_PREFIX + ST_TOPO_ID_MAX];
        snprintf(key, sizeof key, "%s%s", RTR_META_SEED_PREFIX, r->clusters[c].topo->id);
        seed_call(f, i++, c, st_slice_make(key, strlen(key)), pb);
    }
    rtr_fan_seal(f);
}

static void seed_unmarked(rtr_fan *f, void *arg) {
    meta_boot *b = arg;
    (void)seed_fan_ok(f, "removing the marker");
    rtr_fan_free(f);
    memset(b->pending, 0, sizeof b->pending);
    meta_load_start(b->r, NULL, boot_load_done, b); /* now from the first cluster again */
}

static void seed_written(rtr_fan *f, void *arg) {
    meta_boot *b = arg;
    bool ok = seed_fan_ok(f, "copying a record");
    rtr_fan_free(f);
    if (!ok) { /* the marker stays: the next start tries again; the cache is good */
        boot_load_done(b, ST_OK);
        return;
    }
    st_log(ST_LOG_INFO, "router", "metadata seeded into %zu cluster(s)", seed_n_pending(b));
    seed_marker(b, NULL, seed_unmarked);
}

/* Every record of the cache (loaded from a copy that is not pending) into every pending copy. */
static void seed_records(meta_boot *b) {
    rtr_ctx *r = b->r;
    size_t n = 0, i = 0, *cnt;
    for (int k = 0; k < RTR_META_KINDS; k++) {
        (void)recs(&r->meta, (rtr_meta_kind)k, &cnt);
        n += *cnt;
    }
    rtr_fan *f = rtr_fan_new(r, n * seed_n_pending(b), RTR_ADMIN_TIMEOUT_MS, seed_written, b);
    if (!f) {
        boot_load_done(b, ST_OK);
        return;
    }
    st_buf key;
    st_buf_init(&key);
    for (int k = 0; k < RTR_META_KINDS; k++) {
        rtr_meta_rec **v = recs(&r->meta, (rtr_meta_kind)k, &cnt);
        for (size_t j = 0; j < *cnt; j++) {
            st_slice pb = st_slice_make((*v)[j].pb, (*v)[j].len);
            st_buf_reset(&key);
            bool have_key = rtr_meta_row_key((rtr_meta_kind)k, (*v)[j].name, &key) == ST_OK;
            for (size_t c = 0; c < r->n_clusters; c++) {
                if (!b->pending[c])
                    continue;
                if (have_key)
                    seed_call(f, i, c, st_buf_slice(&key), &pb);
                else
                    f->res[i].code =
                        st_err_set(&f->res[i].err, ST_RESOURCE_EXHAUSTED, "out of memory");
                i++;
            }
        }
    }
    st_buf_free(&key);
    rtr_fan_seal(f);
}

/* The load skipped pending copies: when it found a good one, copy it into them. */
static void boot_loaded(void *arg, st_code code) {
    meta_boot *b = arg;
    if (code != ST_OK || seed_n_pending(b) == 0) {
        boot_load_done(b, code);
        return;
    }
    for (size_t c = 0; c < b->r->n_clusters; c++)
        if (b->pending[c])
            st_log(ST_LOG_WARN, "router",
                   "cluster=%s lost its metadata copy (its first node started with no data): "
                   "copying every record into it",
                   b->r->clusters[c].topo->id);
    seed_records(b);
}

static void boot_load(meta_boot *b) {
    meta_load_start(b->r, b->pending, boot_loaded, b);
}

static void seed_marked(rtr_fan *f, void *arg) {
    meta_boot *b = arg;
    (void)seed_fan_ok(f, "writing the marker");
    rtr_fan_free(f);
    boot_load(b);
}

static void seed_mark(meta_boot *b) {
    for (size_t i = 0; i < b->n_clusters_todo; i++)
        b->pending[b->todo[i]] = true;
    st_slice one = st_slice_make("1", 1);
    seed_marker(b, &one, seed_marked);
}

void rtr_meta_bootstrap(rtr_ctx *r, void (*done)(void *arg, st_code code), void *arg) {
    meta_boot *b = calloc(1, sizeof *b);
    if (!b) {
        done(arg, ST_RESOURCE_EXHAUSTED);
        return;
    }
    *b = (meta_boot){.r = r, .done = done, .arg = arg};
    size_t n_calls = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        if (!rtr_tmap_find(r->clusters[c].map, RTR_META_TABLE)) {
            b->todo[b->n_clusters_todo++] = c;
            n_calls += r->clusters[c].n_nodes;
        }
    if (b->n_clusters_todo == 0) {
        boot_load(b);
        return;
    }
    uint8_t buf[256];
    size_t len = put_table_request(buf, sizeof buf);
    rtr_fan *f = rtr_fan_new(r, n_calls, RTR_ADMIN_TIMEOUT_MS, boot_schemas_done, b);
    if (!f) {
        boot_load(b);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n_clusters_todo; i++) {
        rtr_cluster *c = &r->clusters[b->todo[i]];
        st_log(ST_LOG_INFO, "router", "creating the metadata table in cluster=%s", c->topo->id);
        for (size_t j = 0; j < c->n_nodes; j++)
            rtr_fan_call(f, k++, &c->nodes[j], RTR_NODE "PutTable", st_slice_make(buf, len));
    }
    rtr_fan_seal(f);
}

/* ---- periodic reload ---- */

static void meta_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rtr_ctx *r = arg;
    if (!r->meta_loading && !r->closing)
        meta_load_start(r, NULL, NULL, NULL);
}

st_code rtr_meta_start_timer(rtr_ctx *r, st_err *err) {
    int64_t ms =
        r->opts.meta_refresh_ms > 0 ? r->opts.meta_refresh_ms : RTR_META_REFRESH_MS_DEFAULT;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    r->meta_timer = event_new(r->base, -1, EV_PERSIST, meta_tick, r);
    if (!r->meta_timer || event_add(r->meta_timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the metadata timer");
    return ST_OK;
}

/* ---- writing one record ---- */

typedef struct meta_write {
    rtr_ctx *r;
    rtr_meta_kind kind;
    char *name;
    st_buf pb;
    bool del;
    rtr_meta_done_fn done;
    void *arg;
} meta_write;

/* A record's mutation: SetCell m:v (server time) of *pb, or DeleteFromRow when pb is NULL. */
static void mutation_init(const st_slice *pb, Google__Bigtable__V2__Mutation__SetCell *set,
                          Google__Bigtable__V2__Mutation__DeleteFromRow *del,
                          Google__Bigtable__V2__Mutation *mut) {
    google__bigtable__v2__mutation__init(mut);
    google__bigtable__v2__mutation__set_cell__init(set);
    google__bigtable__v2__mutation__delete_from_row__init(del);
    if (!pb) {
        mut->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW;
        mut->delete_from_row = del;
        return;
    }
    set->family_name = (char *)RTR_META_FAMILY;
    set->column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)RTR_META_QUALIFIER};
    set->timestamp_micros = -1;
    set->value = (ProtobufCBinaryData){pb->len, (uint8_t *)pb->data};
    mut->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    mut->set_cell = set;
}

/* MutateRow on the metadata table: SetCell m:v (server time) of *pb, DeleteFromRow when NULL. */
static st_code mutate_request(st_slice key, const st_slice *pb, st_buf *out) {
    Google__Bigtable__V2__Mutation__SetCell set;
    Google__Bigtable__V2__Mutation__DeleteFromRow del;
    Google__Bigtable__V2__Mutation mut;
    mutation_init(pb, &set, &del, &mut);
    Google__Bigtable__V2__Mutation *muts[1] = {&mut};
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = (char *)RTR_META_TABLE;
    req.row_key = (ProtobufCBinaryData){key.len, (uint8_t *)key.data};
    req.n_mutations = 1;
    req.mutations = muts;
    size_t len = google__bigtable__v2__mutate_row_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__v2__mutate_row_request__pack(&req, out->data);
    return ST_OK;
}

static void write_free(meta_write *w) {
    free(w->name);
    st_buf_free(&w->pb);
    free(w);
}

/* Success when any cluster took the write (the others are logged: their copy is stale until
 * replication from the other clusters brings them the write). */
static void write_done(rtr_fan *f, void *arg) {
    meta_write *w = arg;
    rtr_ctx *r = w->r;
    size_t ok = 0;
    st_err first = {0};
    for (size_t i = 0; i < f->n; i++) {
        if (f->res[i].code == ST_OK) {
            ok++;
            continue;
        }
        if (first.code == ST_OK)
            first = f->res[i].err, first.code = f->res[i].code;
        st_log(ST_LOG_WARN, "router", "metadata write %s to cluster=%s failed: %s", w->name,
               r->clusters[i].topo->id, f->res[i].err.msg);
    }
    rtr_fan_free(f);
    st_code code = ok ? ST_OK : (first.code ? first.code : ST_UNAVAILABLE);
    if (ok) {
        r->meta_gen++; /* a reload that started before this write must not undo it */
        if (w->del)
            rtr_meta_del(&r->meta, w->kind, w->name);
        else if (rtr_meta_put(&r->meta, w->kind, w->name, st_buf_slice(&w->pb)) != ST_OK)
            code = st_err_set(&first, ST_RESOURCE_EXHAUSTED, "out of memory caching metadata");
    }
    w->done(w->arg, code, code == ST_OK ? NULL : first.msg);
    write_free(w);
}

static void write_send(meta_write *w) {
    rtr_ctx *r = w->r;
    st_slice pb = st_buf_slice(&w->pb);
    st_buf key, req;
    st_buf_init(&key);
    st_buf_init(&req);
    rtr_fan *f = rtr_fan_new(r, r->n_clusters, RTR_ADMIN_TIMEOUT_MS, write_done, w);
    if (!f || rtr_meta_row_key(w->kind, w->name, &key) != ST_OK ||
        mutate_request(st_buf_slice(&key), w->del ? NULL : &pb, &req) != ST_OK) {
        rtr_fan_free(f);
        st_buf_free(&key);
        st_buf_free(&req);
        w->done(w->arg, ST_RESOURCE_EXHAUSTED, "out of memory writing metadata");
        write_free(w);
        return;
    }
    for (size_t c = 0; c < r->n_clusters; c++) {
        const rtr_tmap_table *t = rtr_tmap_find(r->clusters[c].map, RTR_META_TABLE);
        size_t k = rtr_tmap_row(t, st_buf_slice(&key));
        if (k == SIZE_MAX) {
            f->res[c].code = st_err_set(&f->res[c].err, ST_UNAVAILABLE,
                                        "no tablet of the metadata table is known");
            continue;
        }
        rtr_fan_call(f, c, &r->clusters[c].nodes[t->v[k].node], RTR_BT "MutateRow",
                     st_buf_slice(&req));
    }
    st_buf_free(&key);
    st_buf_free(&req);
    rtr_fan_seal(f);
}

void rtr_meta_write(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                    rtr_meta_done_fn done, void *arg) {
    st_err err = {0};
    if (pb && rtr_meta_record_check(kind, name, pb->len, &err) != ST_OK) {
        done(arg, err.code, err.msg);
        return;
    }
    meta_write *w = calloc(1, sizeof *w);
    if (w) {
        st_buf_init(&w->pb);
        w->name = strdup(name);
    }
    if (!w || !w->name || (pb && st_buf_append(&w->pb, pb->data, pb->len) != ST_OK)) {
        if (w)
            write_free(w);
        done(arg, ST_RESOURCE_EXHAUSTED, "out of memory writing metadata");
        return;
    }
    w->r = r;
    w->kind = kind;
    w->del = pb == NULL;
    w->done = done;
    w->arg = arg;
    write_send(w);
}

/* ---- compare-and-set in the first cluster ---- */

/* The CheckAndMutateRow of rtr_meta_cas: the predicate is the row's latest m:v cell (value_range
 * [expect, expect] on it when expect is given); the mutation sits in the branch that means "as
 * expected": matched when expect is given, not matched (no record) otherwise. */
static st_code cas_request(st_slice key, const st_slice *expect, const st_slice *pb, st_buf *out) {
    Google__Bigtable__V2__RowFilter fam, qual, last, val, chain;
    google__bigtable__v2__row_filter__init(&fam);
    fam.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_FAMILY_NAME_REGEX_FILTER;
    fam.family_name_regex_filter = (char *)RTR_META_FAMILY;
    google__bigtable__v2__row_filter__init(&qual);
    qual.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_COLUMN_QUALIFIER_REGEX_FILTER;
    qual.column_qualifier_regex_filter = (ProtobufCBinaryData){1, (uint8_t *)RTR_META_QUALIFIER};
    google__bigtable__v2__row_filter__init(&last);
    last.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    last.cells_per_column_limit_filter = 1;
    Google__Bigtable__V2__ValueRange range;
    google__bigtable__v2__value_range__init(&range);
    google__bigtable__v2__row_filter__init(&val);
    if (expect) {
        ProtobufCBinaryData v = {expect->len, (uint8_t *)expect->data};
        range.start_value_case = GOOGLE__BIGTABLE__V2__VALUE_RANGE__START_VALUE_START_VALUE_CLOSED;
        range.start_value_closed = v;
        range.end_value_case = GOOGLE__BIGTABLE__V2__VALUE_RANGE__END_VALUE_END_VALUE_CLOSED;
        range.end_value_closed = v;
        val.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_VALUE_RANGE_FILTER;
        val.value_range_filter = &range;
    }
    Google__Bigtable__V2__RowFilter *links[4] = {&fam, &qual, &last, &val};
    Google__Bigtable__V2__RowFilter__Chain ch;
    google__bigtable__v2__row_filter__chain__init(&ch);
    ch.n_filters = expect ? 4 : 3;
    ch.filters = links;
    google__bigtable__v2__row_filter__init(&chain);
    chain.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CHAIN;
    chain.chain = &ch;
    Google__Bigtable__V2__Mutation__SetCell set;
    Google__Bigtable__V2__Mutation__DeleteFromRow del;
    Google__Bigtable__V2__Mutation mut;
    mutation_init(pb, &set, &del, &mut);
    Google__Bigtable__V2__Mutation *muts[1] = {&mut};
    Google__Bigtable__V2__CheckAndMutateRowRequest req;
    google__bigtable__v2__check_and_mutate_row_request__init(&req);
    req.table_name = (char *)RTR_META_TABLE;
    req.row_key = (ProtobufCBinaryData){key.len, (uint8_t *)key.data};
    req.predicate_filter = &chain;
    if (expect) {
        req.n_true_mutations = 1;
        req.true_mutations = muts;
    } else {
        req.n_false_mutations = 1;
        req.false_mutations = muts;
    }
    size_t len = google__bigtable__v2__check_and_mutate_row_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__v2__check_and_mutate_row_request__pack(&req, out->data);
    return ST_OK;
}

/* A compare-and-set in flight. One of cached records (rtr_meta_cas_cached) that could not reach
 * its cluster's node, or whose node could not write its copy, goes once more to each other
 * cluster that is healthy then: the first cluster dying or its disk filling up is when `strata
 * failover` repoints profiles away from it, and the router may not have noticed yet (the
 * request, unsent, changed nothing there) or the node, up, refuses every write. */
typedef struct meta_cas {
    rtr_meta_cas_fn done;
    void *arg;
    rtr_ctx *r;
    bool cached;
    uint32_t tried;  /* clusters tried, by index (cached records) */
    st_buf key, req; /* the record's row key; the CheckAndMutateRow, as sent */
    /* the first node that answered but could not write its copy, and why: the final error
     * names it */
    const rtr_node *refused_by;
    st_err refused;
} meta_cas;

static void cas_free(meta_cas *c) {
    st_buf_free(&c->key);
    st_buf_free(&c->req);
    free(c);
}

static st_code cas_send(meta_cas *c, rtr_cluster *cl);

/* A cluster compare-and-sets of cached records may run in: healthy, and its tablet map has the
 * metadata table. */
static bool cas_usable(rtr_cluster *cl) {
    return cl->map && rtr_tmap_find(cl->map, RTR_META_TABLE) && rtr_cluster_healthy(cl);
}

/* The next usable cluster that c has not tried; NULL when none. */
static rtr_cluster *cas_next_cluster(meta_cas *c) {
    rtr_ctx *r = c->r;
    for (size_t i = 0; i < r->n_clusters && i < 32; i++)
        if (!(c->tried & (1u << i)) && cas_usable(&r->clusters[i]))
            return &r->clusters[i];
    return NULL;
}

/* The node answered but could not write its copy of the record: a full disk
 * (RESOURCE_EXHAUSTED), a metadata tablet made read-only by corruption (DATA_LOSS), a failing or
 * read-only file system (INTERNAL). The copy stays unwritable until an operator acts, while
 * another cluster's copy can take the compare. Comparing there is safe even if this node did
 * write: the record is then written to every copy anyway (rtr_meta_write). */
static bool cas_copy_unwritable(st_code code) {
    return code == ST_RESOURCE_EXHAUSTED || code == ST_DATA_LOSS || code == ST_INTERNAL;
}

/* res's failure: the node down (health) or its copy unwritable (said in the final error). */
static void cas_note_failure(meta_cas *c, const rtr_fan_res *res) {
    if (res->unsent)
        rtr_health_report(res->node, ST_UNAVAILABLE); /* its cluster is not healthy now */
    else if (!c->refused_by) {
        c->refused_by = res->node;
        c->refused = res->err;
        c->refused.code = res->code;
    }
}

/* The final error of a compare-and-set whose last attempt failed on node with err: an unwritable
 * copy met on the way is named, so that the operator knows which cluster to repair. */
static void cas_final_error(const meta_cas *c, const rtr_node *node, st_err *err) {
    const rtr_node *by = c->refused_by;
    if (!by)
        return;
    char last[sizeof err->msg];
    snprintf(last, sizeof last, "%s", err->msg);
    if (by == node)
        st_err_set(err, err->code,
                   "the metadata copy of cluster %s (node %s) cannot be written: %s: %s; no other "
                   "cluster has a healthy metadata node to take the change instead",
                   by->cluster->topo->id, by->addr, st_code_name(c->refused.code), last);
    else
        st_err_set(err, err->code,
                   "the metadata copy of cluster %s (node %s) cannot be written (%s: %s), and "
                   "cluster %s failed too: %s",
                   by->cluster->topo->id, by->addr, st_code_name(c->refused.code), c->refused.msg,
                   node->cluster->topo->id, last);
}

static void cas_done(rtr_fan *f, void *arg) {
    meta_cas *cp = arg;
    const rtr_fan_res *res = &f->res[0];
    if (cp->cached && res->code != ST_OK && (res->unsent || cas_copy_unwritable(res->code))) {
        cas_note_failure(cp, res);
        rtr_cluster *next = cas_next_cluster(cp);
        if (next && cas_send(cp, next) == ST_OK) {
            rtr_fan_free(f);
            return;
        }
    }
    meta_cas c = *cp; /* done, arg and what was refused */
    cas_free(cp);
    st_err err = {0};
    st_code code = rtr_fan_first_error(f, &err);
    if (code != ST_OK)
        cas_final_error(&c, res->node, &err);
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
    else if (code == ST_OK)
        code = st_err_set(&err, ST_INTERNAL,
                          "the metadata table's node sent no CheckAndMutateRow answer");
    c.done(c.arg, code, code == ST_OK ? NULL : err.msg, matched);
}

/* Where compare-and-sets of cached records (app profiles, IAM policies) run: the first cluster,
 * in topology order, that is healthy and whose tablet map has the metadata table; the first
 * cluster when none is. They keep two routers from overwriting each other's changes, and must
 * keep working while the first cluster is lost: that is when `strata failover` repoints profiles
 * away from it (backup names and claims stay in the first cluster: rtr_meta_cas). Routers that
 * agree on health compare in the same cluster; during an outage two routers that disagree may
 * compare in different ones (docs/router.md, App profiles). */
static size_t cas_cluster(rtr_ctx *r) {
    for (size_t i = 0; i < r->n_clusters; i++)
        if (cas_usable(&r->clusters[i]))
            return i;
    return 0;
}

/* Sends c's compare-and-set to cl's node of the row. c stays the caller's on failure. */
static st_code cas_send(meta_cas *c, rtr_cluster *cl) {
    const rtr_tmap_table *t = cl->map ? rtr_tmap_find(cl->map, RTR_META_TABLE) : NULL;
    size_t k = t ? rtr_tmap_row(t, st_buf_slice(&c->key)) : SIZE_MAX;
    if (k == SIZE_MAX)
        return ST_UNAVAILABLE;
    rtr_fan *f = rtr_fan_new(c->r, 1, RTR_ADMIN_TIMEOUT_MS, cas_done, c);
    if (!f)
        return ST_RESOURCE_EXHAUSTED;
    if (cl->idx < 32)
        c->tried |= 1u << cl->idx;
    rtr_fan_call(f, 0, &cl->nodes[t->v[k].node], RTR_BT "CheckAndMutateRow", st_buf_slice(&c->req));
    rtr_fan_seal(f);
    return ST_OK;
}

static st_code cas_in(rtr_ctx *r, rtr_cluster *cl, st_slice key, const st_slice *expect,
                      const st_slice *pb, bool cached, rtr_meta_cas_fn done, void *arg) {
    st_err err = {0};
    if (pb && key_check(key, pb->len, &err) != ST_OK) {
        done(arg, err.code, err.msg, false);
        return ST_OK; /* answered: done ran */
    }
    meta_cas *c = calloc(1, sizeof *c);
    if (!c)
        return ST_RESOURCE_EXHAUSTED;
    *c = (meta_cas){.done = done, .arg = arg, .r = r, .cached = cached};
    st_buf_init(&c->key);
    st_buf_init(&c->req);
    st_code rc = st_buf_append(&c->key, key.data, key.len);
    if (rc == ST_OK && cas_request(key, expect, pb, &c->req) != ST_OK)
        rc = ST_RESOURCE_EXHAUSTED;
    if (rc == ST_OK)
        rc = cas_send(c, cl);
    if (rc != ST_OK)
        cas_free(c);
    return rc;
}

st_code rtr_meta_cas(rtr_ctx *r, st_slice key, const st_slice *expect, const st_slice *pb,
                     rtr_meta_cas_fn done, void *arg) {
    return cas_in(r, &r->clusters[0], key, expect, pb, false, done, arg);
}

st_code rtr_meta_cas_cached(rtr_ctx *r, rtr_meta_kind kind, const char *name, const st_slice *pb,
                            rtr_meta_cas_fn done, void *arg, bool *had) {
    const rtr_meta_rec *rec = rtr_meta_find(&r->meta, kind, name);
    st_slice expect = rec ? st_slice_make(rec->pb, rec->len) : (st_slice){0};
    *had = rec != NULL;
    st_buf key;
    st_buf_init(&key);
    st_code rc = rtr_meta_row_key(kind, name, &key);
    if (rc == ST_OK)
        rc = cas_in(r, &r->clusters[cas_cluster(r)], st_buf_slice(&key), rec ? &expect : NULL, pb,
                    true, done, arg);
    st_buf_free(&key);
    return rc;
}

/* ---- one row of the first cluster's metadata, read there (not from the cache) ---- */

typedef struct meta_get {
    rtr_meta_get_fn done;
    void *arg;
} meta_get;

/* The latest m:v cell of the one row the response holds (found false when none). */
static st_code get_value(const rtr_fan_res *res, bool *found, st_buf *value) {
    size_t off = 0;
    st_slice msg;
    int cell = 0; /* as rtr_meta_feed: only the first cell's chunks count */
    while (rtr_fan_next_msg(res, &off, &msg)) {
        Google__Bigtable__V2__ReadRowsResponse *r = (void *)btu_pb_unpack(
            &google__bigtable__v2__read_rows_response__descriptor, NULL, msg, NULL);
        if (!r)
            return ST_INTERNAL;
        for (size_t i = 0; i < r->n_chunks; i++) {
            const Google__Bigtable__V2__ReadRowsResponse__CellChunk *c = r->chunks[i];
            *found = true;
            if (cell < 2 && st_buf_append(value, c->value.data, c->value.len) != ST_OK) {
                google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
                return ST_RESOURCE_EXHAUSTED;
            }
            cell = cell < 2 && c->value_size > 0 ? 1 : 2;
        }
        google__bigtable__v2__read_rows_response__free_unpacked(r, NULL);
    }
    return ST_OK;
}

static void get_done(rtr_fan *f, void *arg) {
    meta_get g = *(meta_get *)arg;
    free(arg);
    st_err err = {0};
    st_code code = rtr_fan_first_error(f, &err);
    bool found = false;
    st_buf value;
    st_buf_init(&value);
    if (code == ST_OK && (code = get_value(&f->res[0], &found, &value)) != ST_OK)
        st_err_set(&err, code, "the metadata table's node sent an unreadable ReadRows answer");
    rtr_fan_free(f);
    g.done(g.arg, code, code == ST_OK ? NULL : err.msg, found, st_buf_slice(&value));
    st_buf_free(&value);
}

static st_code get_request(st_slice key, st_buf *out) {
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    Google__Bigtable__V2__RowFilter filter;
    google__bigtable__v2__row_filter__init(&filter);
    filter.filter_case = GOOGLE__BIGTABLE__V2__ROW_FILTER__FILTER_CELLS_PER_COLUMN_LIMIT_FILTER;
    filter.cells_per_column_limit_filter = 1;
    Google__Bigtable__V2__RowSet rows;
    google__bigtable__v2__row_set__init(&rows);
    ProtobufCBinaryData k = {key.len, (uint8_t *)key.data};
    rows.n_row_keys = 1;
    rows.row_keys = &k;
    req.table_name = (char *)RTR_META_TABLE;
    req.filter = &filter;
    req.rows = &rows;
    req.rows_limit = 1;
    size_t len = google__bigtable__v2__read_rows_request__get_packed_size(&req);
    if (st_buf_reserve(out, len) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    out->len = google__bigtable__v2__read_rows_request__pack(&req, out->data);
    return ST_OK;
}

st_code rtr_meta_get(rtr_ctx *r, st_slice key, rtr_meta_get_fn done, void *arg) {
    return rtr_meta_get_in(r, 0, key, done, arg);
}

st_code rtr_meta_get_in(rtr_ctx *r, size_t cluster, st_slice key, rtr_meta_get_fn done, void *arg) {
    if (cluster >= r->n_clusters)
        return ST_UNAVAILABLE;
    rtr_cluster *c = &r->clusters[cluster];
    const rtr_tmap_table *t = c->map ? rtr_tmap_find(c->map, RTR_META_TABLE) : NULL;
    size_t k = t ? rtr_tmap_row(t, key) : SIZE_MAX;
    if (k == SIZE_MAX)
        return ST_UNAVAILABLE;
    st_buf req;
    st_buf_init(&req);
    meta_get *g = malloc(sizeof *g);
    rtr_fan *f = g && get_request(key, &req) == ST_OK
                     ? rtr_fan_new(r, 1, RTR_ADMIN_TIMEOUT_MS, get_done, g)
                     : NULL;
    if (!f) {
        free(g);
        st_buf_free(&req);
        return ST_RESOURCE_EXHAUSTED;
    }
    *g = (meta_get){done, arg};
    rtr_fan_call(f, 0, &c->nodes[t->v[k].node], RTR_BT "ReadRows", st_buf_slice(&req));
    st_buf_free(&req);
    rtr_fan_seal(f);
    return ST_OK;
}
