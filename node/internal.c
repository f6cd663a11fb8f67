/* internal.c — the strata.internal.v1.Node service (proto/pb/strata/internal/v1/node.proto):
 * what a router uses to push table schemas and place tablets on this node. MoveTablet lives in
 * move.c. Admin-like calls: rare, run to completion on the loop thread. docs/cluster.md tells the
 * conventions (tablet ids, strata-not-owner, splits, moves). */
#include "admin.h"
#include "backup.h"
#include "changes.h"

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "strata/internal/v1/node.pb-c.h"

typedef Strata__Internal__V1__Tablet pb_tablet;

/* The Tablet message for map entry tab of t (slices point into storage and t: valid during the
 * handler). A moving tablet is reported read_only (it refuses writes until it is gone) and
 * moving (routers keep reading from it rather than from the target's partial copy). */
static pb_tablet *tablet_to_pb(const node_tablets *t, const node_tablet *tab, st_arena *a) {
    pb_tablet *p = st_arena_alloc(a, sizeof *p);
    if (!p)
        return NULL;
    strata__internal__v1__tablet__init(p);
    sto_tablet_info info;
    sto_tablet_info_get(tab->st, &info);
    p->id = tab->id;
    p->table_name = (char *)t->name;
    p->start_key = (ProtobufCBinaryData){info.start.len, (uint8_t *)info.start.data};
    p->end_key = (ProtobufCBinaryData){info.end.len, (uint8_t *)info.end.data};
    p->approx_bytes = info.approx_bytes;
    p->sst_count = (uint32_t)info.sst_count;
    p->read_only = info.read_only || tab->moving || tab->incoming;
    p->moving = tab->moving;
    p->incoming = tab->incoming;
    return p;
}

static void reply_empty(rpc_call *call) {
    Google__Protobuf__Empty empty;
    google__protobuf__empty__init(&empty);
    node_reply(call, &empty.base);
}

/* ---- GetStatus ---- */

static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

void node_h_get_status(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    if (!node_unpack(call, &strata__internal__v1__get_status_request__descriptor, req_bytes))
        return;
    Strata__Internal__V1__NodeStatus resp;
    strata__internal__v1__node_status__init(&resp);
    sto_stats st;
    sto_db_stats(n->db, &st);
    for (size_t i = 0; i < n->n_tables; i++) {
        for (size_t j = 0; j < n->tables[i].n; j++) {
            sto_tablet_info info;
            sto_tablet_info_get(n->tables[i].v[j].st, &info);
            resp.data_bytes += info.approx_bytes;
            resp.tablets++;
        }
    }
    resp.node_num = n->opts.node_num;
    resp.last_lsn = sto_log_last_lsn(n->db);
    resp.memtable_bytes = st.memtable_bytes;
    resp.cache_bytes = st.cache_bytes;
    resp.sst_count = st.sst_count;
    resp.rss_bytes = rss_bytes();
    resp.uptime_us = (uint64_t)(st_mono_us() - n->start_us);
    node_reply(call, &resp.base);
}

/* ---- PutTable, DropTable ---- */

/* Makes meta's families those of spec: families spec lacks are dropped with their data, unless
 * !drop: after this PutTable's purge, a family spec lacks was created by a later schema change
 * while the purge ran, and keeps its new cells. */
static st_code put_families(node_ctx *n, node_table *meta, node_table *spec, bool drop,
                            st_err *err) {
    st_code rc = ST_OK;
    for (size_t i = drop ? meta->n_families : 0; rc == ST_OK && i-- > 0;) {
        char fam[NODE_FAMILY_NAME_MAX + 1];
        snprintf(fam, sizeof fam, "%s", meta->families[i].name);
        if (node_table_family(spec, st_slice_cstr(fam)))
            continue;
        node_tablets *t = node_tablets_find(n, meta->name);
        rc = t ? node_family_purge(n, t, fam, err) : ST_OK;
        if (rc == ST_OK)
            rc = node_table_family_drop(meta, fam, err);
    }
    for (size_t i = 0; rc == ST_OK && i < spec->n_families; i++)
        rc = node_table_family_set(meta, spec->families[i].name, &spec->families[i].gc, err);
    return rc;
}

/* Creates or updates the catalog entry and map entry of a table from its Table message. */
static st_code put_table(node_ctx *n, const Google__Bigtable__Admin__V2__Table *pt, bool drop,
                         st_err *err) {
    st_code rc = node_check_table_name(pt->name, err);
    node_table spec;
    memset(&spec, 0, sizeof spec);
    int64_t retention = 0;
    if (rc == ST_OK)
        rc = node_cs_retention_from_pb(pt->change_stream_config, &retention, err);
    if (rc == ST_OK)
        rc = node_table_families_from_pb(&spec, pt, err);
    node_table *meta = rc == ST_OK ? node_catalog_find(n->catalog, pt->name) : NULL;
    if (rc == ST_OK && !meta)
        rc = node_catalog_add(n->catalog, pt->name, st_wall_us(), &meta, err);
    if (rc == ST_OK)
        rc = put_families(n, meta, &spec, drop, err);
    node_table_deinit(&spec);
    if (rc != ST_OK)
        return rc;
    meta->deletion_protection = pt->deletion_protection;
    node_cs_set_retention(n, meta, retention);
    rc = node_catalog_save(n->catalog, err);
    if (rc == ST_OK && !node_tablets_find(n, pt->name) && !node_tables_add(n, pt->name))
        rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory adding a table");
    if (rc == ST_OK)
        rc = node_table_push_gc(n, node_catalog_find(n->catalog, pt->name), err);
    return rc;
}

/* The end of PutTable once the families it drops have no cells left (purged: those families are
 * out of the catalog then, and a family pt lacks that is there again was created meanwhile). A
 * table dropped during the purge is not made again: DeleteTable came later. */
static void put_finish(node_ctx *n, rpc_call *call, st_code code, const char *msg,
                       const Google__Bigtable__Admin__V2__Table *pt, bool purged) {
    st_err err = {0};
    if (code == ST_OK && purged && !node_catalog_find(n->catalog, pt->name))
        code = st_err_set(&err, ST_NOT_FOUND, "table \"%s\" was deleted meanwhile", pt->name);
    else if (code == ST_OK)
        code = put_table(n, pt, !purged, &err);
    else
        st_err_set(&err, code, "%s", msg);
    if (code != ST_OK) {
        node_fail(call, code, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "internal", "put table=%s families=%zu", pt->name, pt->n_column_families);
    reply_empty(call);
}

/* The families PutTable drops, purging (node_table_purge_begin) while their cells are deleted on
 * a job (node_family_purge_start); a failed purge puts them back, so a retried PutTable purges
 * them again. A family another PutTable is purging already is purged again by this one (the
 * deletes are idempotent): this call answers only once every cell older than it is gone. */
typedef struct put_purge {
    const Google__Bigtable__Admin__V2__Table *pt;
    node_family *fams; /* name and GC rule of each dropped family */
    size_t n;
} put_purge;

static void put_purge_free(put_purge *p) {
    for (size_t i = 0; i < p->n; i++)
        node_gc_free(&p->fams[i].gc);
    free(p->fams);
    free(p);
}

static void put_purged(node_ctx *n, rpc_call *call, st_code code, const char *msg, void *arg) {
    put_purge *p = arg;
    put_finish(n, call, code, msg, p->pt, true);
    put_purge_free(p);
}

/* Adds f to p unless spec keeps it or p has it. */
static st_code put_purge_add(put_purge *p, const node_table *spec, const node_family *f,
                             st_err *err) {
    if (node_table_family((node_table *)spec, st_slice_cstr(f->name)))
        return ST_OK;
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->fams[i].name, f->name) == 0)
            return ST_OK;
    snprintf(p->fams[p->n].name, sizeof p->fams[p->n].name, "%s", f->name);
    st_code rc = node_gc_copy(&p->fams[p->n].gc, &f->gc, err);
    if (rc == ST_OK)
        p->n++;
    return rc;
}

/* Starts the purge of the families the table has here and pt lacks: NOT_FOUND when there are
 * none (or no local tablet holds the table). */
static st_code put_purge_start(node_ctx *n, rpc_call *call,
                               const Google__Bigtable__Admin__V2__Table *pt, st_err *err) {
    node_table *meta = node_catalog_find(n->catalog, pt->name);
    node_tablets *t = meta ? node_tablets_find(n, pt->name) : NULL;
    if (!t || t->n == 0)
        return ST_NOT_FOUND;
    node_table spec;
    memset(&spec, 0, sizeof spec);
    size_t cap = meta->n_families + meta->n_purging + 1, begun = 0;
    put_purge *p = calloc(1, sizeof *p);
    const char **names = calloc(cap, sizeof *names);
    if (p)
        p->fams = calloc(cap, sizeof *p->fams);
    st_code rc = p && p->fams && names ? node_table_families_from_pb(&spec, pt, err)
                                       : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rc == ST_OK && i < meta->n_families; i++)
        rc = put_purge_add(p, &spec, &meta->families[i], err);
    for (size_t i = 0; rc == ST_OK && i < meta->n_purging; i++)
        rc = put_purge_add(p, &spec, &meta->purging[i], err);
    node_table_deinit(&spec);
    if (rc == ST_OK && p->n == 0)
        rc = ST_NOT_FOUND;
    while (rc == ST_OK && begun < p->n) {
        names[begun] = p->fams[begun].name;
        if ((rc = node_table_purge_begin(meta, p->fams[begun].name, err)) == ST_OK)
            begun++;
    }
    if (rc == ST_OK) {
        p->pt = pt;
        rc = node_family_purge_start(n, call, pt->name, names, p->n, put_purged, p, err);
    }
    for (size_t i = 0; rc != ST_OK && i < begun; i++) /* nothing started: put them back */
        node_table_purge_end(meta, p->fams[i].name, true);
    if (rc != ST_OK && p)
        put_purge_free(p);
    free(names);
    return rc;
}

/* True when a PutTable of pt would drop a family of the table here (put_purge_start's test,
 * without starting anything); false when the table is new here or the schema cannot be read (the
 * PutTable then fails on its own). */
static bool put_would_purge(node_ctx *n, const Google__Bigtable__Admin__V2__Table *pt) {
    node_table *meta = node_catalog_find(n->catalog, pt->name);
    if (!meta)
        return false;
    node_table spec;
    memset(&spec, 0, sizeof spec);
    st_err err = {0};
    bool purge = false;
    if (node_table_families_from_pb(&spec, pt, &err) == ST_OK)
        for (size_t i = 0; !purge && i < meta->n_families; i++)
            purge = !node_table_family(&spec, st_slice_cstr(meta->families[i].name));
    node_table_deinit(&spec);
    return purge;
}

void node_h_put_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__PutTableRequest *req =
        (void *)node_unpack(call, &strata__internal__v1__put_table_request__descriptor, req_bytes);
    if (!req)
        return;
    if (!req->table) {
        node_fail(call, ST_INVALID_ARGUMENT, "PutTable needs a table");
        return;
    }
    st_err err = {0};
    if (node_caller_is_node(call) && put_would_purge(n, req->table)) {
        node_fail(call, ST_PERMISSION_DENIED,
                  "PutTable from a client whose certificate names strata-node may not drop a "
                  "family of table %s (a move's source sends the schema the table has); schema "
                  "changes come from a router (docs/security.md, Internal links)",
                  req->table->name);
        return;
    }
    st_code rc = put_purge_start(n, call, req->table, &err);
    if (rc == ST_NOT_FOUND) /* no family to purge */
        put_finish(n, call, ST_OK, NULL, req->table, false);
    else if (rc != ST_OK)
        node_fail(call, rc, "%s", err.msg);
}

void node_h_drop_table(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__DropTableRequest *req =
        (void *)node_unpack(call, &strata__internal__v1__drop_table_request__descriptor, req_bytes);
    if (!req)
        return;
    st_err err = {0};
    if (!node_catalog_find(n->catalog, req->name))
        reply_empty(call);
    else if (node_table_drop_start(n, call, req->name, &err) != ST_OK)
        node_fail(call, err.code, "%s", err.msg);
}

/* ---- ListTablets ---- */

/* Appends the tablets of t to resp (room was counted). */
/* Appends table t's tablets, and when its copy here was created (routers pin reads by it). */
static st_code list_append(node_ctx *n, const node_tablets *t,
                           Strata__Internal__V1__ListTabletsResponse *resp, st_arena *a) {
    for (size_t j = 0; j < t->n; j++)
        if (!(resp->tablets[resp->n_tablets++] = tablet_to_pb(t, &t->v[j], a)))
            return ST_RESOURCE_EXHAUSTED;
    const node_table *meta = node_catalog_find(n->catalog, t->name);
    Strata__Internal__V1__TableCreated *tc = st_arena_alloc(a, sizeof *tc);
    if (!tc)
        return ST_RESOURCE_EXHAUSTED;
    strata__internal__v1__table_created__init(tc);
    tc->name = (char *)t->name;
    tc->created_us = meta ? meta->create_time_us : 0;
    resp->tables[resp->n_tables++] = tc;
    return ST_OK;
}

void node_h_list_tablets(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__ListTabletsRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__list_tablets_request__descriptor, req_bytes);
    if (!req)
        return;
    node_tablets *only = req->table_name[0] ? node_tablets_find(n, req->table_name) : NULL;
    size_t first = only ? (size_t)(only - n->tables) : 0;
    size_t last = only ? first + 1 : req->table_name[0] ? 0 : n->n_tables;
    size_t count = 0;
    for (size_t i = first; i < last; i++)
        count += n->tables[i].n;
    Strata__Internal__V1__ListTabletsResponse resp;
    strata__internal__v1__list_tablets_response__init(&resp);
    resp.node_num = n->opts.node_num;
    st_arena *a = rpc_call_arena(call);
    resp.tablets = st_arena_alloc(a, (count + 1) * sizeof *resp.tablets);
    resp.tables = st_arena_alloc(a, (last - first + 1) * sizeof *resp.tables);
    st_code rc = resp.tablets && resp.tables ? ST_OK : ST_RESOURCE_EXHAUSTED;
    for (size_t i = first; rc == ST_OK && i < last; i++)
        rc = list_append(n, &n->tables[i], &resp, a);
    if (rc != ST_OK) {
        node_fail(call, rc, "out of memory listing tablets");
        return;
    }
    node_reply(call, &resp.base);
}

/* ---- CreateTablet, DropTablet, SplitTablet ---- */

static bool ranges_overlap(st_slice s1, st_slice e1, st_slice s2, st_slice e2) {
    return (e1.len == 0 || st_slice_cmp(s2, e1) < 0) && (e2.len == 0 || st_slice_cmp(s1, e2) < 0);
}

/* Drops the incoming tablets (copies of moves that did not complete) overlapping [start, end),
 * except one of exactly that range when keep_same: a new copy or tablet replaces such leftovers,
 * which would otherwise refuse it for good. */
static st_code drop_incoming_overlaps(node_ctx *n, node_tablets *t, st_slice start, st_slice end,
                                      bool keep_same, st_err *err) {
    bool dropped = false;
    for (size_t i = 0; i < t->n;) {
        node_tablet *v = &t->v[i];
        st_slice ts = st_buf_slice(&v->start), te = st_buf_slice(&v->end);
        bool same = st_slice_eq(ts, start) && st_slice_eq(te, end);
        if (!v->incoming || (same && keep_same) || !ranges_overlap(ts, te, start, end)) {
            i++;
            continue;
        }
        st_log(ST_LOG_INFO, "internal",
               "table=%s tablet=%" PRIu64 " dropped: the copy of a move "
               "that did not complete",
               t->name, v->id);
        st_code rc = node_tablet_drop(n, t, i, err);
        if (rc != ST_OK)
            return rc;
        dropped = true;
    }
    return dropped ? node_incoming_save(n, err) : ST_OK;
}

/* Activates a move's copy durably before the answer (DATA/incoming rewritten without it). When
 * the file cannot be written the copy stays incoming and the call fails, so the source keeps the
 * range. (A new copy is named in the file before storage has it: node_tablet_create_as.) */
static st_code activate_copy(node_ctx *n, node_tablet *tab, st_err *err) {
    tab->incoming = false;
    st_code rc = node_incoming_save(n, err);
    if (rc != ST_OK)
        tab->incoming = true;
    return rc;
}

/* The local tablet with exactly [start, end) (a retried CreateTablet), NULL if none; an
 * overlapping one is FAILED_PRECONDITION. */
static st_code find_same_range(node_tablets *t, st_slice start, st_slice end, node_tablet **same,
                               st_err *err) {
    *same = NULL;
    for (size_t i = 0; i < t->n; i++) {
        st_slice ts = st_buf_slice(&t->v[i].start), te = st_buf_slice(&t->v[i].end);
        if (st_slice_eq(ts, start) && st_slice_eq(te, end))
            *same = &t->v[i];
        else if (ranges_overlap(ts, te, start, end))
            return st_err_set(err, ST_FAILED_PRECONDITION,
                              "the range overlaps tablet %" PRIu64 " of %s on this node",
                              t->v[i].id, t->name);
    }
    return ST_OK;
}

static st_code check_range(st_slice start, st_slice end, st_err *err) {
    if (start.len > NODE_ROW_KEY_MAX || end.len > NODE_ROW_KEY_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "tablet bounds are row keys of at most %d "
                          "bytes",
                          NODE_ROW_KEY_MAX);
    if (end.len && st_slice_cmp(start, end) >= 0)
        return st_err_set(err, ST_INVALID_ARGUMENT, "start_key must be below end_key");
    return ST_OK;
}

/* A move's activation (CreateTabletRequest.activate): never creates a tablet, so a copy dropped
 * meanwhile (a restart, or idle) is NOT_FOUND and its source keeps the range. */
static void activate_only(node_ctx *n, rpc_call *call, node_tablets *t,
                          const Strata__Internal__V1__CreateTabletRequest *req) {
    node_tablets *tt;
    node_tablet *tab = node_tablet_by_id(n, req->activate, &tt);
    st_slice start = st_slice_make(req->start_key.data, req->start_key.len);
    st_slice end = st_slice_make(req->end_key.data, req->end_key.len);
    if (!tab || tt != t || !st_slice_eq(st_buf_slice(&tab->start), start) ||
        !st_slice_eq(st_buf_slice(&tab->end), end)) {
        node_fail(call, ST_NOT_FOUND,
                  "tablet %" PRIu64 ", the copy this move would activate, is not on node %u "
                  "(dropped at a restart, or as idle)",
                  req->activate, n->opts.node_num);
        return;
    }
    if (n->move_test.kill_activating)
        raise(SIGKILL); /* a test: the activation never happened, its answer never comes */
    st_err err = {0};
    if (tab->incoming && activate_copy(n, tab, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    if (n->move_test.kill_answering)
        raise(SIGKILL); /* a test: the activation happened, its answer never comes */
    st_log(ST_LOG_INFO, "internal", "table=%s tablet=%" PRIu64 " activated", t->name, tab->id);
    pb_tablet *p = tablet_to_pb(t, tab, rpc_call_arena(call));
    if (!p) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &p->base);
}

/* ---- CreateTablet with restore_backup, in batches ----
 *
 * A restore asks for one tablet per piece of its backup, thousands of them. Made one by one, each
 * cost a catalog save and a storage manifest write (a rewrite of every tablet's entry): n^2 for
 * n tablets, on the loop, which stopped answering the router's keepalives for seconds. The calls
 * wait in a queue instead; each loop turn makes up to NODE_RESTORE_BATCH_MAX of them with one
 * catalog save and one manifest write, then lets the loop serve everything else before the next
 * batch (a zero timer: it runs after the loop has polled the sockets). */

typedef Strata__Internal__V1__CreateTabletRequest ct_req;

typedef struct node_restore_wait {
    rpc_call *call;
    const ct_req *req; /* in the call's arena */
    node_bk_restore r; /* what the tablet is made of, in the call's arena */
    node_tablets *t;   /* valid during the batch: no table comes or goes meanwhile */
} node_restore_wait;

static void restore_turn(evutil_socket_t fd, short what, void *arg);

/* The piece's files are checked (node_backup_restore_verify): the call joins the queue. */
static void restore_enqueue(node_ctx *n, rpc_call *call, void *arg) {
    const ct_req *req = arg;
    node_backups *b = n->backups;
    if (b->closing) {
        node_fail(call, ST_UNAVAILABLE,
                  "node %u is stopping: the restore of this tablet was not made; retry once it "
                  "is back",
                  n->opts.node_num);
        return;
    }
    if (b->n_restore_q >= NODE_RESTORE_QUEUE_MAX) {
        node_fail(call, ST_UNAVAILABLE,
                  "%d restored tablets wait to be made on node %u already; retry later",
                  NODE_RESTORE_QUEUE_MAX, n->opts.node_num);
        return;
    }
    if (b->n_restore_q == b->cap_restore_q) {
        size_t cap = b->cap_restore_q ? 2 * b->cap_restore_q : 64;
        node_restore_wait *q = realloc(b->restore_q, cap * sizeof *q);
        if (!q) {
            node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory queueing a restore");
            return;
        }
        b->restore_q = q;
        b->cap_restore_q = cap;
    }
    if (!b->restore_ev && !(b->restore_ev = evtimer_new(n->base, restore_turn, n))) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory queueing a restore");
        return;
    }
    b->restore_q[b->n_restore_q++] = (node_restore_wait){.call = call, .req = req};
    struct timeval now = {0, 0};
    if (b->n_restore_q == 1)
        evtimer_add(b->restore_ev, &now);
}

static st_slice req_start(const ct_req *req) {
    return st_slice_make(req->start_key.data, req->start_key.len);
}
static st_slice req_end(const ct_req *req) {
    return st_slice_make(req->end_key.data, req->end_key.len);
}

/* A tablet of this batch (v[0, i)) already takes part of w's range: the router sent a retry
 * while the first call waited. ABORTED: the retry that follows finds the tablet made. */
static st_code batch_overlap(const node_restore_wait *v, size_t i, const node_restore_wait *w,
                             st_err *err) {
    for (size_t j = 0; j < i; j++)
        if (v[j].t == w->t && ranges_overlap(req_start(v[j].req), req_end(v[j].req),
                                             req_start(w->req), req_end(w->req)))
            return st_err_set(err, ST_ABORTED,
                              "a restore of an overlapping range of %s is being made now; retry",
                              w->t->name);
    return ST_OK;
}

static void reply_tablet(node_tablets *t, node_tablet *tab, rpc_call *call, const char *what) {
    st_log(ST_LOG_INFO, "internal", "table=%s tablet=%" PRIu64 " %s", t->name, tab->id, what);
    pb_tablet *p = tablet_to_pb(t, tab, rpc_call_arena(call));
    if (p)
        node_reply(call, &p->base);
    else
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
}

/* Checks v[i] as CreateTablet does, and its piece; true when its tablet is to be made in this
 * batch, else its call is answered (an error, or the tablet of an earlier try). */
static bool restore_check(node_ctx *n, node_restore_wait *v, size_t i) {
    node_restore_wait *w = &v[i];
    if (rpc_call_cancelled(w->call)) {
        rpc_call_finish(w->call, ST_CANCELLED, NULL);
        return false;
    }
    w->t = node_table_or_fail(n, w->call, w->req->table_name, NULL);
    if (!w->t)
        return false;
    st_slice start = req_start(w->req), end = req_end(w->req);
    st_err err = {0};
    node_tablet *same = NULL;
    st_code rc = check_range(start, end, &err);
    if (rc == ST_OK)
        rc = drop_incoming_overlaps(n, w->t, start, end, false, &err);
    if (rc == ST_OK)
        rc = find_same_range(w->t, start, end, &same, &err);
    if (rc == ST_OK && !same)
        rc = batch_overlap(v, i, w, &err);
    if (rc == ST_OK && !same)
        rc = node_backup_restore_prepare(n, start, end, w->req->restore_backup,
                                         w->req->restore_piece, rpc_call_arena(w->call), &w->r,
                                         &err);
    if (rc != ST_OK)
        node_fail(w->call, rc, "%s", err.msg);
    else if (same)
        reply_tablet(w->t, same, w->call, "exists");
    w->t = rc == ST_OK && !same ? w->t : NULL;
    return w->t != NULL;
}

/* Maps the tablet storage made for w (or answers why it was not made). */
static void restore_finish(node_ctx *n, node_restore_wait *w, sto_restore_spec *sp) {
    st_err err = {0};
    st_code rc = sp->rc;
    if (rc != ST_OK)
        err = sp->err;
    else if (node_tablet_map(w->t, sp->out) != ST_OK)
        rc = st_err_set(&err, ST_RESOURCE_EXHAUSTED, "out of memory adding a tablet");
    size_t at = rc == ST_OK ? node_tablet_index(w->t, sp->start) : 0;
    if (rc == ST_OK) {
        node_backup_restored(n, w->t, sp->id, w->req->restore_backup, w->req->restore_piece, &w->r);
        rc = node_tablet_push_gc(n, node_catalog_find(n->catalog, w->t->name), w->t, at, &err);
    }
    if (rc != ST_OK)
        node_fail(w->call, rc, "%s", err.msg);
    else
        reply_tablet(w->t, &w->t->v[at], w->call, "created");
}

/* Makes the tablets of v[0, k) that pass their checks: one catalog save for their ids, one
 * manifest write for their storage. */
static void restore_batch(node_ctx *n, node_restore_wait *v, size_t k) {
    sto_restore_spec *specs = calloc(k, sizeof *specs);
    node_restore_wait **made = calloc(k, sizeof *made);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (!specs || !made)
            node_fail(v[i].call, ST_RESOURCE_EXHAUSTED, "out of memory restoring a tablet");
        else if (restore_check(n, v, i))
            made[m++] = &v[i];
    }
    for (size_t j = 0; j < m; j++)
        specs[j] = (sto_restore_spec){.id = node_tablet_new_id(n),
                                      .table = st_slice_cstr(made[j]->t->name),
                                      .start = req_start(made[j]->req),
                                      .end = req_end(made[j]->req),
                                      .paths = made[j]->r.paths,
                                      .n_paths = made[j]->r.n_paths};
    st_err err = {0};
    st_code rc = m ? node_catalog_save(n->catalog, &err) : ST_OK;
    if (rc == ST_OK)
        sto_tablets_restore(n->db, specs, m);
    for (size_t j = 0; j < m; j++) {
        if (rc != ST_OK)
            node_fail(made[j]->call, rc, "%s", err.msg);
        else
            restore_finish(n, made[j], &specs[j]);
    }
    free(specs);
    free(made);
}

static void restore_turn(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_ctx *n = arg;
    node_backups *b = n->backups;
    size_t k = b->n_restore_q < NODE_RESTORE_BATCH_MAX ? b->n_restore_q : NODE_RESTORE_BATCH_MAX;
    restore_batch(n, b->restore_q, k);
    b->n_restore_q -= k;
    memmove(b->restore_q, b->restore_q + k, b->n_restore_q * sizeof *b->restore_q);
    struct timeval now = {0, 0};
    if (b->n_restore_q)
        evtimer_add(b->restore_ev, &now);
}

void node_restores_abort(node_ctx *n) {
    node_backups *b = n->backups;
    for (size_t i = 0; i < b->n_restore_q; i++)
        node_fail(b->restore_q[i].call, ST_UNAVAILABLE,
                  "node %u is stopping: the restore of this tablet was not made; retry once it "
                  "is back",
                  n->opts.node_num);
    b->n_restore_q = 0;
    free(b->restore_q);
    b->restore_q = NULL;
    b->cap_restore_q = 0;
    if (b->restore_ev)
        event_free(b->restore_ev);
    b->restore_ev = NULL;
}

void node_h_create_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__CreateTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__create_tablet_request__descriptor, req_bytes);
    if (!req)
        return;
    if (node_caller_is_node(call) && !req->incoming && !req->activate) {
        node_fail(call, ST_PERMISSION_DENIED,
                  "CreateTablet from a client whose certificate names strata-node makes only a "
                  "move's incoming copy or activates one (docs/security.md, Internal links)");
        return;
    }
    node_tablets *t = node_table_or_fail(n, call, req->table_name, NULL);
    if (!t)
        return;
    if (req->activate) {
        activate_only(n, call, t, req);
        return;
    }
    if (req->restore_backup[0]) {
        node_backup_restore_verify(n, call, req->restore_backup, req->restore_piece,
                                   restore_enqueue, req);
        return;
    }
    st_slice start = st_slice_make(req->start_key.data, req->start_key.len);
    st_slice end = st_slice_make(req->end_key.data, req->end_key.len);
    st_err err = {0};
    node_tablet *same = NULL;
    st_code rc = check_range(start, end, &err);
    if (rc == ST_OK)
        rc = drop_incoming_overlaps(n, t, start, end, !req->incoming, &err);
    if (rc == ST_OK)
        rc = find_same_range(t, start, end, &same, &err);
    bool activate = rc == ST_OK && same && same->incoming && !req->incoming;
    if (rc == ST_OK && !same)
        rc = node_tablet_create_as(n, t, start, end, req->incoming, &err);
    size_t at = rc == ST_OK ? node_tablet_index(t, start) : 0;
    if (rc == ST_OK && !same)
        rc = node_tablet_push_gc(n, node_catalog_find(n->catalog, t->name), t, at, &err);
    node_tablet *tab = rc == ST_OK ? &t->v[at] : NULL;
    if (tab && !same && req->incoming && n->move_test.kill_created)
        raise(SIGKILL); /* a test of a target killed right after creating a move's copy */
    if (tab && activate)
        rc = activate_copy(n, tab, &err);
    if (rc != ST_OK) {
        node_fail(call, rc, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "internal", "table=%s tablet=%" PRIu64 " %s", t->name, tab->id,
           activate        ? "activated"
           : same          ? "exists"
           : req->incoming ? "created incoming"
                           : "created");
    pb_tablet *p = tablet_to_pb(t, tab, rpc_call_arena(call));
    if (!p) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &p->base);
}

/* The tablet named by id, or the call finished with NOT_FOUND. */
static node_tablet *tablet_or_fail(node_ctx *n, rpc_call *call, uint64_t id, node_tablets **t) {
    node_tablet *tab = node_tablet_by_id(n, id, t);
    if (!tab)
        node_fail(call, ST_NOT_FOUND, "tablet %" PRIu64 " is not served by node %u", id,
                  n->opts.node_num);
    return tab;
}

void node_h_drop_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__DropTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__drop_tablet_request__descriptor, req_bytes);
    node_tablets *t;
    node_tablet *tab = req ? tablet_or_fail(n, call, req->id, &t) : NULL;
    if (!tab)
        return;
    if (tab->moving) {
        node_fail(call, ST_FAILED_PRECONDITION,
                  "tablet %" PRIu64 " is being moved; the move drops it when done", tab->id);
        return;
    }
    if (!tab->incoming && node_caller_is_node(call)) {
        node_fail(call, ST_PERMISSION_DENIED,
                  "DropTablet from a client whose certificate names strata-node drops only a "
                  "move's incoming copy, and tablet %" PRIu64 " serves clients (docs/security.md, "
                  "Internal links)",
                  tab->id);
        return;
    }
    st_err err = {0};
    if (node_tablet_drop(n, t, (size_t)(tab - t->v), &err) != ST_OK) {
        node_fail(call, err.code, "%s%s", err.msg,
                  node_drop_pending_find(n, req->id)
                      ? "; the tablet is no longer served and the node retries its drop"
                      : "");
        return;
    }
    st_log(ST_LOG_INFO, "internal", "table=%s tablet=%" PRIu64 " dropped", t->name, req->id);
    reply_empty(call);
}

void node_h_split_tablet(rpc_call *call, st_slice req_bytes, void *arg) {
    node_ctx *n = arg;
    Strata__Internal__V1__SplitTabletRequest *req = (void *)node_unpack(
        call, &strata__internal__v1__split_tablet_request__descriptor, req_bytes);
    node_tablets *t;
    node_tablet *tab = req ? tablet_or_fail(n, call, req->id, &t) : NULL;
    if (!tab)
        return;
    st_err err = {0};
    uint64_t ids[2];
    st_slice key = st_slice_make(req->split_key.data, req->split_key.len);
    if (node_tablet_split(n, t, (size_t)(tab - t->v), key, ids, &err) != ST_OK) {
        node_fail(call, err.code, "%s", err.msg);
        return;
    }
    st_log(ST_LOG_INFO, "internal", "table=%s tablet=%" PRIu64 " split -> %" PRIu64 " + %" PRIu64,
           t->name, req->id, ids[0], ids[1]);
    Strata__Internal__V1__SplitTabletResponse resp;
    strata__internal__v1__split_tablet_response__init(&resp);
    st_arena *a = rpc_call_arena(call);
    resp.left = tablet_to_pb(t, node_tablet_by_id(n, ids[0], NULL), a);
    resp.right = tablet_to_pb(t, node_tablet_by_id(n, ids[1], NULL), a);
    if (!resp.left || !resp.right) {
        node_fail(call, ST_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    node_reply(call, &resp.base);
}
