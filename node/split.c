/* split.c — tablet splits: on request (SplitTablet) and by size (a timer looks at the tablets
 * written since its last look and splits those over split_bytes near their middle). Storage
 * makes a split a metadata change (the halves share the parent's SSTables) after flushing the
 * memtable, so it runs on the loop thread once that flush is short; the halves stay on this node
 * (moving one is the router's decision: MoveTablet). */
#include "changes.h"
#include "node_internal.h"
#include "repl_glue.h"

#include <inttypes.h>
#include <stdlib.h>

#include <event2/event.h>

#define SPLIT_CHECK_MS_DEFAULT 1000
#define SPLITS_PER_CHECK_MAX 16 /* bounds the loop time one check takes */
/* A size-based split runs on the loop thread and holds the tablet's writes while storage flushes
 * its memtable: it waits (sto_tablet_split_ready) until a running flush or compaction of the
 * tablet ended and the memtable holds at most this much, so the loop is not held for seconds.
 * After SPLIT_WAITS_MAX checks in a row that found it not ready (a memtable refilled faster than
 * it flushes), the split runs anyway. */
#define SPLIT_MEM_MAX ((size_t)4 << 20)
#define SPLIT_WAITS_MAX 8

/* Replaces map entry i by the storage tablets with these ids (the halves of a split). */
static st_code map_halves(node_ctx *n, node_tablets *t, size_t i, const uint64_t ids[2],
                          st_err *err) {
    node_tablet_unmap(t, i);
    for (int k = 0; k < 2; k++) {
        sto_tablet *st;
        st_code rc = sto_tablet_get(n->db, ids[k], &st);
        if (rc == ST_OK)
            rc = node_tablet_map(t, st);
        if (rc == ST_OK) /* before any write reaches it: the shippers must know its table */
            node_repl_tablet_named(n, ids[k], t->name);
        if (rc != ST_OK)
            return st_err_set(err, rc,
                              "tablet %" PRIu64 " vanished or memory ran out after a "
                              "split; restart the node to reload its tablets",
                              ids[k]);
    }
    for (size_t k = 0; k < t->n; k++)
        if (t->v[k].id == ids[0] || t->v[k].id == ids[1])
            t->v[k].written = true; /* the size check looks at the halves again */
    return ST_OK;
}

/* The split key: the one given, else storage's middle row; it must fall inside (start, end). */
static st_code split_key(node_tablet *tab, st_slice want, st_buf *key, st_err *err) {
    if (want.len == 0) {
        st_code rc = sto_tablet_mid_key(tab->st, key, err);
        if (rc == ST_NOT_FOUND)
            return st_err_set(err, ST_FAILED_PRECONDITION,
                              "tablet %" PRIu64 " has fewer than two rows; nothing to split",
                              tab->id);
        return rc;
    }
    if (st_slice_cmp(want, st_buf_slice(&tab->start)) <= 0 ||
        (tab->end.len && st_slice_cmp(want, st_buf_slice(&tab->end)) >= 0))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "split key must fall strictly inside tablet %" PRIu64 "'s range",
                          tab->id);
    return st_buf_append(key, want.data, want.len) == ST_OK
               ? ST_OK
               : st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory splitting a tablet");
}

st_code node_tablet_split(node_ctx *n, node_tablets *t, size_t i, st_slice want, uint64_t ids[2],
                          st_err *err) {
    node_tablet *tab = &t->v[i];
    if (tab->moving || tab->incoming)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "tablet %" PRIu64 " is being moved; split it after the move", tab->id);
    st_buf key;
    st_buf_init(&key);
    uint64_t parent = tab->id, halves[2] = {0, 0};
    st_code rc = split_key(tab, want, &key, err);
    if (rc == ST_OK) {
        halves[0] = node_tablet_new_id(n);
        halves[1] = node_tablet_new_id(n);
        rc = node_catalog_save(n->catalog, err);
    }
    /* Durable before the parent's id vanishes: its unshipped records need it after a restart. */
    bool retired = false;
    if (rc == ST_OK)
        retired = (rc = node_repl_tablet_retire(n, parent, t->name, err)) == ST_OK;
    if (rc == ST_OK)
        rc = sto_tablet_split(n->db, parent, st_buf_slice(&key), halves[0], halves[1], err);
    if (retired)
        node_repl_tablet_retire_done(n, parent, rc == ST_OK);
    if (rc == ST_OK) {
        rc = map_halves(n, t, i, halves, err);
        node_cs_table_changed(n, t->name);
    }
    node_table *meta = node_catalog_find(n->catalog, t->name);
    if (rc == ST_OK && meta)
        rc = node_table_push_gc(n, meta, err);
    if (rc == ST_OK && ids) {
        ids[0] = halves[0];
        ids[1] = halves[1];
    }
    st_buf_free(&key);
    return rc;
}

/* ---- size-based splits ---- */

/* Splits tablet i of t if it was written and is over the threshold; true when it split. */
static bool split_if_large(node_ctx *n, node_tablets *t, size_t i) {
    node_tablet *tab = &t->v[i];
    if (!tab->written || tab->moving || tab->incoming)
        return false;
    tab->written = false;
    sto_tablet_info info;
    sto_tablet_info_get(tab->st, &info);
    if (info.approx_bytes <= n->opts.split_bytes) {
        /* a write still on its way to the memtable (a large one, a slow fsync) is not counted
         * yet: look again, or its bytes would wait for the next write to be seen */
        tab->written = info.writes_in_flight;
        return false;
    }
    if (tab->split_waits < SPLIT_WAITS_MAX &&
        sto_tablet_split_ready(n->db, tab->id, SPLIT_MEM_MAX) == ST_UNAVAILABLE) {
        tab->split_waits++;
        tab->written = true; /* looked at again next time */
        return false;
    }
    tab->split_waits = 0;
    st_err err = {0};
    uint64_t ids[2];
    uint64_t parent = tab->id;
    st_code rc = node_tablet_split(n, t, i, st_slice_make("", 0), ids, &err);
    if (rc != ST_OK) {
        st_log(rc == ST_FAILED_PRECONDITION ? ST_LOG_DEBUG : ST_LOG_WARN, "split",
               "table=%s tablet=%" PRIu64 " bytes=%" PRIu64 " not split: %s", t->name, parent,
               info.approx_bytes, err.msg);
        return false;
    }
    st_log(ST_LOG_INFO, "split",
           "table=%s tablet=%" PRIu64 " bytes=%" PRIu64 " -> %" PRIu64 " + %" PRIu64, t->name,
           parent, info.approx_bytes, ids[0], ids[1]);
    return true;
}

static void split_check(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_ctx *n = arg;
    int splits = 0;
    for (size_t ti = 0; ti < n->n_tables && splits < SPLITS_PER_CHECK_MAX; ti++) {
        node_tablets *t = &n->tables[ti];
        for (size_t i = 0; i < t->n && splits < SPLITS_PER_CHECK_MAX; i++) {
            if (split_if_large(n, t, i)) {
                splits++;
                i++; /* both halves are looked at next time */
            }
        }
    }
}

st_code node_split_timer_start(node_ctx *n, st_err *err) {
    if (n->opts.split_bytes == 0)
        return ST_OK;
    uint32_t ms = n->opts.split_check_ms ? n->opts.split_check_ms : SPLIT_CHECK_MS_DEFAULT;
    n->split_timer = event_new(n->base, -1, EV_PERSIST, split_check, n);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (!n->split_timer || event_add(n->split_timer, &tv) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "could not start the split timer");
    st_log(ST_LOG_INFO, "split", "size-based splits above %" PRIu64 " bytes, checked every %u ms",
           n->opts.split_bytes, ms);
    return ST_OK;
}

void node_split_timer_stop(node_ctx *n) {
    if (n->split_timer)
        event_free(n->split_timer);
    n->split_timer = NULL;
}
