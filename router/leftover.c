/* leftover.c — tables a node still holds after the instance deleted them. A DeleteTable drops
 * the table on the nodes it reaches; a node that was down keeps its tablets, their rows and
 * their unshipped commit-log records, and its shippers wait behind those records for good (the
 * peers answer NOT_FOUND). Every RTR_LEFTOVER_MS, and as soon as a node is up again after being
 * down, the router lists every node's tablets (ListTablets) and compares their tables with the
 * metadata: a table of this instance that the cached metadata lacks on two consecutive rounds is
 * then reserved as a CreateTable reserves a name (rtr_bk_reserve_table: the claim in the first
 * cluster's metadata, then a fresh read of the table's record there). Only when the claim is
 * taken and the record is absent does the router send DropTable to the nodes that listed the
 * table, and it gives the claim back afterwards. See docs/router.md, "Leftover tables". */
#include "backup.h" /* rtr_bk_reserve_table */
#include "instance.h"
#include "router_internal.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "strata/internal/v1/node.pb-c.h"

/* One table found on nodes without a metadata record: the nodes (instance-wide index, k of
 * node_at) that listed it. */
typedef struct lo_table {
    char *name;
    int64_t first_us; /* when a round first found it (monotonic) */
    bool on[ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX];
} lo_table;

struct rtr_leftover {
    rtr_ctx *r;
    struct event *timer;
    bool busy;      /* a round is in flight */
    lo_table *prev; /* found in the previous round (names only) */
    size_t n_prev;
    lo_table *cur; /* found in this round */
    size_t n_cur, at;
    char claim[RTR_OP_NAME_MAX + 1]; /* the claim held for cur[at] */
    size_t copy;                     /* the cluster whose metadata copy is read next */
};

static void tables_free(lo_table *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

static const lo_table *in_prev(const rtr_leftover *lo, const char *name) {
    for (size_t i = 0; i < lo->n_prev; i++)
        if (strcmp(lo->prev[i].name, name) == 0)
            return &lo->prev[i];
    return NULL;
}

/* The round ends: what it found is what the next one compares with. */
static void round_end(rtr_leftover *lo) {
    tables_free(lo->prev, lo->n_prev);
    lo->prev = lo->cur;
    lo->n_prev = lo->n_cur;
    lo->cur = NULL;
    lo->n_cur = lo->at = 0;
    lo->busy = false;
}

static void next_table(rtr_leftover *lo);

static void claim_given_back(void *arg, st_code code, const char *msg) {
    char *what = arg;
    if (code != ST_OK)
        st_log(ST_LOG_WARN, "router", "releasing the claim %s after dropping a leftover table: %s",
               what, msg ? msg : st_code_name(code));
    free(what);
}

static void dropped(rtr_fan *f, void *arg) {
    rtr_leftover *lo = arg;
    lo_table *t = &lo->cur[lo->at];
    for (size_t i = 0; i < f->n; i++) {
        if (!f->res[i].node)
            continue;
        if (f->res[i].code == ST_OK)
            st_log(ST_LOG_WARN, "router", "event=leftover_table_dropped table=%s node=%s", t->name,
                   f->res[i].node->addr);
        else
            st_log(ST_LOG_WARN, "router", "table=%s: DropTable of a leftover on node=%s failed: %s",
                   t->name, f->res[i].node->addr, f->res[i].err.msg);
    }
    rtr_fan_free(f);
    char *what = lo->r->closing ? NULL : strdup(lo->claim);
    if (what)
        rtr_bk_unclaim(lo->r, t->name, what, claim_given_back, what);
    t->name[0] = '\0'; /* dropped: not a candidate of the next round */
    lo->at++;
    next_table(lo);
}

/* Gives the claim on cur[at] back (unless closing) and goes on with the next table. */
static void give_back_next(rtr_leftover *lo) {
    char *what = lo->r->closing ? NULL : strdup(lo->claim);
    if (what)
        rtr_bk_unclaim(lo->r, lo->cur[lo->at].name, what, claim_given_back, what);
    lo->at++;
    next_table(lo);
}

static void drop_send(rtr_leftover *lo);
static void copy_next(rtr_leftover *lo);

/* The record of cur[at] in the metadata copy of cluster lo->copy: any copy holding it (a copy
 * that missed a CreateTable, or whose first cluster's copy lost its records), or one that
 * cannot be read, and nothing is dropped. */
static void copy_read(void *arg, st_code code, const char *msg, bool found, st_slice value) {
    rtr_leftover *lo = arg;
    (void)value;
    if (code != ST_OK || found) {
        st_log(ST_LOG_INFO, "router", "table=%s: not dropped as a leftover: %s in cluster=%s",
               lo->cur[lo->at].name,
               code == ST_OK ? "recorded"
               : msg         ? msg
                             : st_code_name(code),
               lo->r->clusters[lo->copy].topo->id);
        give_back_next(lo);
        return;
    }
    lo->copy++;
    copy_next(lo);
}

static void copy_next(rtr_leftover *lo) {
    rtr_ctx *r = lo->r;
    if (r->closing) {
        lo->at++;
        next_table(lo);
        return;
    }
    if (lo->copy >= r->n_clusters) {
        drop_send(lo);
        return;
    }
    st_buf key;
    st_buf_init(&key);
    st_code rc = rtr_meta_row_key(RTR_META_KIND_TABLE, lo->cur[lo->at].name, &key);
    if (rc == ST_OK)
        rc = rtr_meta_get_in(r, lo->copy, st_buf_slice(&key), copy_read, lo);
    st_buf_free(&key);
    if (rc != ST_OK)
        give_back_next(lo);
}

/* The claim on cur[at] is held and the first cluster's metadata has no record of it: the other
 * clusters' copies are read too. */
static void reserved(void *arg, st_code code, const char *msg) {
    rtr_leftover *lo = arg;
    lo_table *t = &lo->cur[lo->at];
    if (code != ST_OK || lo->r->closing) {
        if (code != ST_OK && code != ST_ALREADY_EXISTS)
            st_log(ST_LOG_DEBUG, "router", "table=%s: leftover check: %s", t->name,
                   msg ? msg : st_code_name(code));
        /* closing with the claim held: nothing is dropped, and the claim, of an earlier run
         * of this router from then on, is released by the next CreateTable of the name */
        lo->at++;
        next_table(lo);
        return;
    }
    lo->copy = 1;
    copy_next(lo);
}

/* Every copy lacks the record and the claim is held: DropTable on the nodes that listed it. */
static void drop_send(rtr_leftover *lo) {
    rtr_ctx *r = lo->r;
    lo_table *t = &lo->cur[lo->at];
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += r->clusters[c].n_nodes;
    rtr_fan *f = rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, dropped, lo);
    if (!f) {
        give_back_next(lo);
        return;
    }
    Strata__Internal__V1__DropTableRequest req;
    strata__internal__v1__drop_table_request__init(&req);
    req.name = t->name;
    uint8_t buf[RTR_TABLE_NAME_MAX + 16];
    st_slice drop = st_slice_make(buf, strata__internal__v1__drop_table_request__pack(&req, buf));
    for (size_t k = 0; k < n; k++) {
        if (t->on[k])
            rtr_fan_call(f, k, rtr_node_at(r, k), RTR_NODE "DropTable", drop);
        else
            f->res[k].code = ST_OK; /* res[k].node stays NULL: not asked */
    }
    rtr_fan_seal(f);
}

/* Checks the tables found this round one at a time: one found in the previous round too, first
 * found at least RTR_LEFTOVER_APART_MS ago, and still absent from the cached metadata, is
 * reserved and then dropped. */
static void next_table(rtr_leftover *lo) {
    rtr_ctx *r = lo->r;
    int64_t now = st_mono_us();
    while (lo->at < lo->n_cur && !r->closing) {
        lo_table *t = &lo->cur[lo->at];
        if (in_prev(lo, t->name) && now - t->first_us >= RTR_LEFTOVER_APART_MS * 1000 &&
            !rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, t->name)) {
            rtr_bk_create_token(r, lo->claim, sizeof lo->claim);
            rtr_bk_reserve_table(r, t->name, lo->claim, reserved, lo);
            return;
        }
        lo->at++;
    }
    round_end(lo);
}

static lo_table *cur_add(rtr_leftover *lo, const char *name) {
    for (size_t i = 0; i < lo->n_cur; i++)
        if (strcmp(lo->cur[i].name, name) == 0)
            return &lo->cur[i];
    lo_table *v = realloc(lo->cur, (lo->n_cur + 1) * sizeof *v);
    if (!v)
        return NULL;
    lo->cur = v;
    lo_table *t = &v[lo->n_cur];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return NULL;
    const lo_table *p = in_prev(lo, name);
    t->first_us = p ? p->first_us : st_mono_us();
    lo->n_cur++;
    return t;
}

/* A table that may be a leftover: of this instance, not internal, without a cached record. */
static bool candidate(const rtr_ctx *r, const char *name) {
    st_err err = {0};
    return strncmp(name, RTR_INTERNAL_TABLE_PREFIX, strlen(RTR_INTERNAL_TABLE_PREFIX)) != 0 &&
           rtr_check_table_name(r, name, &err) == ST_OK &&
           !rtr_meta_find(&r->meta, RTR_META_KIND_TABLE, name);
}

static void listed(rtr_fan *f, void *arg) {
    rtr_leftover *lo = arg;
    rtr_ctx *r = lo->r;
    for (size_t k = 0; k < f->n && !r->closing; k++) {
        size_t off = 0;
        st_slice msg;
        if (f->res[k].code != ST_OK || !rtr_fan_next_msg(&f->res[k], &off, &msg))
            continue;
        Strata__Internal__V1__ListTabletsResponse *m = (void *)btu_pb_unpack(
            &strata__internal__v1__list_tablets_response__descriptor, NULL, msg, NULL);
        for (size_t i = 0; m && i < m->n_tablets; i++) {
            const char *name = m->tablets[i]->table_name;
            lo_table *t = name && candidate(r, name) ? cur_add(lo, name) : NULL;
            if (t)
                t->on[k] = true;
        }
        if (m)
            strata__internal__v1__list_tablets_response__free_unpacked(m, NULL);
    }
    rtr_fan_free(f);
    next_table(lo);
}

static void round_start(rtr_leftover *lo) {
    rtr_ctx *r = lo->r;
    if (lo->busy || r->closing || !r->meta_loaded)
        return;
    /* Metadata recording no table at all is more likely a copy that lost its records (a first
     * node back with an empty disk, in an instance of one cluster) than an instance whose every
     * table was deleted: nothing is dropped then. */
    if (r->meta.n_tables == 0) {
        tables_free(lo->prev, lo->n_prev);
        lo->prev = NULL;
        lo->n_prev = 0;
        return;
    }
    size_t n = 0;
    for (size_t c = 0; c < r->n_clusters; c++)
        n += r->clusters[c].n_nodes;
    rtr_fan *f = rtr_fan_new(r, n, RTR_ADMIN_TIMEOUT_MS, listed, lo);
    if (!f)
        return;
    lo->busy = true;
    Strata__Internal__V1__ListTabletsRequest req;
    strata__internal__v1__list_tablets_request__init(&req);
    uint8_t buf[8];
    st_slice list = st_slice_make(buf, strata__internal__v1__list_tablets_request__pack(&req, buf));
    for (size_t k = 0; k < n; k++)
        rtr_fan_call(f, k, rtr_node_at(r, k), RTR_NODE "ListTablets", list);
    rtr_fan_seal(f);
}

static void tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    round_start(arg);
}

st_code rtr_leftover_start(rtr_ctx *r, st_err *err) {
    rtr_leftover *lo = calloc(1, sizeof *lo);
    if (!lo)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    lo->r = r;
    r->leftover = lo;
    struct timeval tv = {RTR_LEFTOVER_MS / 1000, (RTR_LEFTOVER_MS % 1000) * 1000};
    lo->timer = event_new(r->base, -1, EV_PERSIST, tick, lo);
    if (!lo->timer || event_add(lo->timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the leftover-table timer");
    return ST_OK;
}

void rtr_leftover_kick(rtr_ctx *r) {
    if (r->leftover)
        round_start(r->leftover);
}

void rtr_leftover_stop(rtr_ctx *r) {
    rtr_leftover *lo = r->leftover;
    if (!lo)
        return;
    if (lo->timer)
        event_free(lo->timer);
    lo->timer = NULL;
}

void rtr_leftover_free(rtr_ctx *r) {
    rtr_leftover *lo = r->leftover;
    if (!lo)
        return;
    rtr_leftover_stop(r);
    tables_free(lo->prev, lo->n_prev);
    tables_free(lo->cur, lo->n_cur);
    free(lo);
    r->leftover = NULL;
}
