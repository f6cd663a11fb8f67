/* failover.c — the clusters a request may use and the order it tries them (its plan), row
 * affinity, per-attempt deadlines, and the rewrite that gives SetCells with timestamp -1 an
 * explicit timestamp before the first forwarding, so a write retried on another cluster writes
 * the identical cell (docs/router.md, "Failover"). */
#include "failover.h"

#include <stdio.h>
#include <string.h>

/* ---- ordering (pure) ---- */

static bool listed(const rtr_policy *pol, const char *id) {
    if (pol->n_cluster_ids == 0)
        return true;
    for (size_t i = 0; i < pol->n_cluster_ids; i++)
        if (strcmp(pol->cluster_ids[i], id) == 0)
            return true;
    return false;
}

/* Rendezvous (highest random weight) hashing: the weight of (row, cluster) depends on nothing
 * else, so adding, removing or losing a cluster moves only the rows whose first choice it was. */
static uint64_t affinity_weight(st_slice row, const char *id) {
    uint64_t seed = st_hash64(id, strlen(id), 0x5374726174614146ULL); /* "StrataAF" */
    return st_hash64(row.data, row.len, seed);
}

size_t rtr_fo_prefer(const rtr_fo_in *in, size_t n, const rtr_policy *pol, st_slice row,
                     size_t *out) {
    uint64_t w[ST_TOPO_CLUSTERS_MAX];
    bool by_hash = pol->row_affinity && row.len > 0;
    size_t k = 0;
    for (size_t i = 0; i < n && i < ST_TOPO_CLUSTERS_MAX; i++) {
        if (!listed(pol, in[i].id))
            continue;
        w[i] = by_hash ? affinity_weight(row, in[i].id) : 0;
        /* Insertion sort: at most 8 clusters. Ties keep topology order. */
        size_t j = k++;
        for (; j > 0; j--) {
            size_t o = out[j - 1];
            bool before = by_hash ? w[i] > w[o] : (in[i].near && !in[o].near);
            if (!before)
                break;
            out[j] = o;
        }
        out[j] = i;
    }
    return k;
}

void rtr_fo_healthy_first(const rtr_fo_in *in, const size_t *pref, size_t n, size_t *out) {
    size_t k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (in[pref[i]].healthy == (pass == 0))
                out[k++] = pref[i];
}

/* ---- plans ---- */

static void fo_inputs(rtr_ctx *r, rtr_fo_in *in) {
    const char *zone = r->opts.zone;
    for (size_t c = 0; c < r->n_clusters; c++)
        in[c] = (rtr_fo_in){r->clusters[c].topo->id,
                            zone && zone[0] && strcmp(zone, r->clusters[c].topo->zone) == 0,
                            rtr_cluster_healthy(&r->clusters[c])};
}

static st_code plan_single(rtr_ctx *r, const char *id, const rtr_policy *pol, rtr_access access,
                           rtr_plan *out, st_err *err) {
    if (access == RTR_ACCESS_TXN && !pol->allow_transactional_writes)
        return st_err_set(err, ST_FAILED_PRECONDITION, RTR_TXN_DENIED_MSG);
    for (size_t c = 0; c < r->n_clusters; c++)
        if (strcmp(r->clusters[c].topo->id, pol->cluster_id) == 0) {
            out->pref[0] = out->order[0] = c;
            out->n = 1;
            return ST_OK;
        }
    return st_err_set(err, ST_FAILED_PRECONDITION,
                      "app profile '%s' routes to cluster '%s', which is not in the topology: "
                      "point the profile at an existing cluster",
                      id, pol->cluster_id);
}

st_code rtr_route_plan(rtr_ctx *r, const char *app_profile_id, rtr_access access, st_slice row,
                       rtr_plan *out, st_err *err) {
    const char *id = app_profile_id && app_profile_id[0] ? app_profile_id : RTR_PROFILE_DEFAULT;
    rtr_policy pol;
    memset(out, 0, sizeof *out);
    st_code rc = rtr_profile_policy(r, id, &pol, err);
    if (rc != ST_OK)
        return rc;
    /* Data Boost serves reads only (Cloud Bigtable refuses writes and deletes through it): a job
     * handed a read-only profile must not be able to change data. */
    if (pol.data_boost && access != RTR_ACCESS_READ)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "app profile '%s' has Data Boost isolation, which is read-only: send "
                          "writes through a profile with standard isolation",
                          id);
    if (pol.kind == RTR_ROUTING_SINGLE)
        return plan_single(r, id, &pol, access, out, err);
    if (pol.kind != RTR_ROUTING_MULTI)
        return st_err_set(err, ST_INTERNAL, "stored app profile '%s' has no routing policy", id);
    /* Bigtable cannot enable single-row transactions on multi-cluster routing. */
    if (access == RTR_ACCESS_TXN)
        return st_err_set(err, ST_FAILED_PRECONDITION, RTR_TXN_DENIED_MSG);
    rtr_fo_in in[ST_TOPO_CLUSTERS_MAX];
    fo_inputs(r, in);
    out->multi = true;
    out->n = rtr_fo_prefer(in, r->n_clusters, &pol, row, out->pref);
    if (out->n == 0)
        return st_err_set(err, ST_FAILED_PRECONDITION,
                          "app profile '%s' lists no cluster of the topology", id);
    rtr_fo_healthy_first(in, out->pref, out->n, out->order);
    return ST_OK;
}

rtr_cluster *rtr_plan_cluster(rtr_ctx *r, const rtr_plan *p) {
    return &r->clusters[p->order[p->cur]];
}

bool rtr_plan_next(rtr_ctx *r, rtr_plan *p, st_code why) {
    if (!p->multi || p->cur + 1 >= p->n)
        return false;
    const char *from = r->clusters[p->order[p->cur]].topo->id;
    p->cur++;
    if (r->fo)
        r->fo->failovers++;
    st_log(ST_LOG_DEBUG, "router", "failover from=%s to=%s why=%s", from,
           r->clusters[p->order[p->cur]].topo->id, st_code_name(why));
    return true;
}

bool rtr_plan_dark(const rtr_ctx *r, const rtr_plan *p) {
    for (size_t i = 0; i < p->n; i++)
        if (!rtr_health_cluster_dark(r, p->order[i]))
            return false;
    return p->n > 0;
}

rtr_plan_gate rtr_plan_gate_check(rtr_ctx *r, rtr_plan *p, st_err *err) {
    while (rtr_health_cluster_refuses(r, p->order[p->cur]))
        if (!rtr_plan_next(r, p, ST_UNAVAILABLE)) {
            const rtr_cluster *c = rtr_plan_cluster(r, p);
            st_err why = {0};
            st_err_set(&why, ST_UNAVAILABLE, "%s; no node answered a health probe since",
                       rtr_health_cluster_why(r, c->idx));
            rtr_plan_unreachable(r, p, c, &why, err);
            for (size_t i = 0; i < p->n; i++)
                if (!rtr_health_cluster_refuses(r, p->order[i]))
                    return RTR_GATE_RETRY;
            return RTR_GATE_END;
        }
    return RTR_GATE_GO;
}

st_code rtr_plan_unreachable(const rtr_ctx *r, const rtr_plan *p, const rtr_cluster *c,
                             const st_err *last, st_err *err) {
    if (!p->multi || p->n < 2)
        return rtr_cluster_unreachable(c, last, err);
    char why[sizeof last->msg]; /* last may be err itself */
    snprintf(why, sizeof why, "%s", last && last->msg[0] ? last->msg : "none");
    if (strstr(why, " has a reachable node; ")) /* said already */
        return st_err_set(err, ST_UNAVAILABLE, "%s", why);
    char names[ST_TOPO_CLUSTERS_MAX * (ST_TOPO_ID_MAX + 2) + 1];
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < p->n && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                 r->clusters[p->order[i]].topo->id);
    return st_err_set(err, ST_UNAVAILABLE,
                      "no cluster of this multi-cluster app profile (%s) has a reachable node; "
                      "their nodes are down or unreachable (last error: %s). Retry later: "
                      "requests go to the first of them whose nodes answer again",
                      names, why);
}

void rtr_plan_restart(rtr_ctx *r, rtr_plan *p) {
    if (!p->multi)
        return;
    rtr_fo_in in[ST_TOPO_CLUSTERS_MAX];
    fo_inputs(r, in);
    rtr_fo_healthy_first(in, p->pref, p->n, p->order);
    p->cur = 0;
}

bool rtr_fo_error(st_code code) {
    return code == ST_UNAVAILABLE || code == ST_DEADLINE_EXCEEDED;
}

bool rtr_plan_moves_off_replica(const rtr_plan *p, st_code code) {
    return code == ST_DATA_LOSS && p->multi && p->cur + 1 < p->n;
}

int64_t rtr_plan_attempt_ms(const rtr_plan *p, int64_t timeout_ms) {
    if (!p->multi || p->cur + 1 >= p->n)
        return timeout_ms;
    int64_t t = timeout_ms > 0 ? timeout_ms / 2 : RTR_FO_ATTEMPT_MS;
    if (t > RTR_FO_ATTEMPT_MS)
        t = RTR_FO_ATTEMPT_MS;
    return t > 0 ? t : 1;
}

/* ---- queries of death ---- */

uint64_t rtr_qod_fingerprint(const char *path, st_slice req) {
    uint64_t fp = st_hash64(req.data, req.len, st_hash64(path, strlen(path), 0x516f44ULL));
    return fp ? fp : 1; /* 0 marks a free slot */
}

/* Empties a suspect's slot. */
static void qod_forget(rtr_fo *fo, rtr_qod_suspect *s) {
    memset(s, 0, sizeof *s);
    fo->qod_live--;
}

/* Every request asks (rtr_qod_refused, rtr_qod_served): with no suspect, which is nearly
 * always, that costs one comparison instead of a pass over the table. */
static rtr_qod_suspect *qod_find(rtr_fo *fo, uint64_t fp, bool add) {
    if (!add && fo->qod_live == 0)
        return NULL;
    rtr_qod_suspect *oldest = &fo->qod[0];
    int64_t now = st_mono_us();
    for (size_t i = 0; i < RTR_QOD_SUSPECTS_MAX; i++) {
        rtr_qod_suspect *s = &fo->qod[i];
        bool stale =
            s->fp && s->refuse_until < now && now - s->last_us > (int64_t)RTR_QOD_FORGET_MS * 1000;
        if (stale)
            qod_forget(fo, s);
        if (s->fp == fp)
            return s;
        if (!s->fp || (oldest->fp && s->last_us < oldest->last_us))
            oldest = s;
    }
    if (!add)
        return NULL;
    if (oldest->fp)
        qod_forget(fo, oldest); /* full: the longest-quiet suspect makes room */
    oldest->fp = fp;
    fo->qod_live++;
    return oldest;
}

void rtr_qod_served(rtr_ctx *r, uint64_t fp) {
    rtr_qod_suspect *s = r->fo ? qod_find(r->fo, fp, false) : NULL;
    if (s && s->refuse_until <= st_mono_us())
        qod_forget(r->fo, s);
}

bool rtr_qod_refused(rtr_ctx *r, uint64_t fp, st_err *err) {
    rtr_qod_suspect *s = r->fo ? qod_find(r->fo, fp, false) : NULL;
    int64_t now = st_mono_us();
    if (!s || s->refuse_until <= now)
        return false;
    st_err_set(err, ST_INTERNAL,
               "request refused for %lld more s: the connection to node %s dropped while it "
               "served this request (%u time%s), possibly a query of death; check that node's "
               "log for a crash before sending it again (no crash there: the node was killed "
               "under it, and restarting this router ends the refusal)",
               (long long)((s->refuse_until - now) / 1000000 + 1), s->node, s->drops + s->crowd,
               s->drops + s->crowd == 1 ? "" : "s");
    return true;
}

static rtr_qod_verdict qod_refuse(rtr_qod_suspect *s, bool alone, st_err *err) {
    int64_t refuse_ms = RTR_QOD_REPEAT_REFUSE_MS;
    s->refuse_until = st_mono_us() + refuse_ms * 1000;
    st_log(ST_LOG_WARN, "router",
           "msg=\"possible query of death: not sent again\" node=%s drops=%u alone=%s "
           "fingerprint=%016llx refused_s=%lld",
           s->node, s->drops + s->crowd, alone ? "yes" : "no", (unsigned long long)s->fp,
           (long long)(refuse_ms / 1000));
    st_err_set(err, ST_INTERNAL,
               "the connection to node %s dropped while it served this request%s, after an "
               "earlier drop under it: possibly a query of death, not sent to another node; the "
               "same request is refused for %lld s (check that node's log for a crash; no crash "
               "there: the node was killed under it twice, and restarting this router ends the "
               "refusal)",
               s->node, alone ? " alone" : "", (long long)(refuse_ms / 1000));
    return RTR_QOD_REFUSE;
}

uint64_t rtr_qod_drop_id(const rtr_node *node, uint64_t conn_id) {
    return ((uint64_t)node->num + 1) << 40 | (conn_id & ((1ULL << 40) - 1));
}

/* Counts drop against s once, however many identical calls it took. */
static void qod_count(rtr_qod_suspect *s, size_t lost_with, const rtr_node *node, uint64_t drop,
                      int64_t drop_us) {
    if (s->last_drop == drop)
        return;
    s->last_drop = drop;
    s->last_us = drop_us;
    snprintf(s->node, sizeof s->node, "%s", node->addr);
    if (lost_with <= 1)
        s->drops++;
    else
        s->crowd++;
}

rtr_qod_verdict rtr_qod_dropped(rtr_ctx *r, uint64_t fp, size_t lost_with, const rtr_node *node,
                                uint64_t drop, int64_t drop_us, bool *moved_once, st_err *err) {
    if (!r->fo)
        return RTR_QOD_GO;
    rtr_qod_suspect *s = qod_find(r->fo, fp, true);
    qod_count(s, lost_with, node, drop, drop_us);
    if (*moved_once) /* this very request dropped twice */
        return qod_refuse(s, lost_with <= 1, err);
    if (lost_with <= 1 && s->drops > 1) /* alone in a second drop */
        return qod_refuse(s, true, err);
    /* One drop is no evidence against the request: a node killed under a single call (an
     * operator's kill -9, a test's chaos) looks the same as one the request crashed. */
    *moved_once = true;
    return RTR_QOD_GO;
}

/* ---- idempotent writes ---- */

/* ---- write fences ---- */

void rtr_fence_attempt(int64_t timeout_ms, int64_t *attempt_us, char text[RTR_FENCE_TEXT_BYTES],
                       rpc_metadata *md, size_t *n_md) {
    /* At most RTR_FO_ATTEMPT_MS even where the attempt may take longer (the plan's last
     * cluster gets the client's whole deadline): a resend never waits longer than that, and a
     * write reaching its node later is refused there and sent again with a new fence. 0 is an
     * attempt without a deadline (a client that sets none, on the plan's last cluster): its
     * fence must not be now, or the node refuses every such write as late. */
    if (timeout_ms <= 0 || timeout_ms > RTR_FO_ATTEMPT_MS)
        timeout_ms = RTR_FO_ATTEMPT_MS;
    *attempt_us = st_wall_us() + timeout_ms * 1000;
    snprintf(text, RTR_FENCE_TEXT_BYTES, "%lld", (long long)*attempt_us);
    md[(*n_md)++] = (rpc_metadata){BTU_WRITE_BY_HEADER, text};
}

/* The codes that leave open whether the node applied the write: the router gave up on the
 * attempt (its deadline, its cluster turned unhealthy), the connection was lost, or the node
 * failed in an unexpected way. Any other answer is the node's own refusal, made before the
 * write took its versions (a tablet that moved or split, a bad request, a full disk). */
static bool fence_outcome_open(st_code code) {
    return code == ST_UNAVAILABLE || code == ST_DEADLINE_EXCEEDED || code == ST_CANCELLED ||
           code == ST_UNKNOWN || code == ST_INTERNAL;
}

void rtr_fence_ended(rtr_fence *f, int64_t attempt_us, st_code code, bool sent) {
    if (sent && fence_outcome_open(code) && attempt_us > f->pending_us)
        f->pending_us = attempt_us;
}

int64_t rtr_fence_wait_ms(const rtr_fence *f) {
    int64_t left = f->pending_us - st_wall_us();
    return left > 0 ? left / 1000 + 1 : 0;
}

int64_t rtr_fo_write_ts(rtr_ctx *r) {
    int64_t ts = st_wall_us() / 1000 * 1000;
    if (!r->fo)
        return ts;
    if (ts < r->fo->ts_last_us) /* the wall clock stepped back: stay where we were */
        ts = r->fo->ts_last_us;
    r->fo->ts_last_us = ts;
    return ts;
}

/* SetCell: family_name 1, column_qualifier 2, timestamp_micros 3, value 4. The last field 3 on
 * the wire is the value (protobuf's rule for repeated scalars in a singular field). */
static st_code stamp_set_cell(st_slice msg, int64_t ts_us, st_buf *out, size_t *n) {
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad = false, server_time = false;
    while (rtr_wire_next(&p, end, &f, &bad))
        if (f.num == 3 && f.wire_type == 0)
            server_time = (int64_t)f.varint == -1;
    if (bad)
        return ST_INVALID_ARGUMENT;
    if (!server_time)
        return st_buf_append(out, msg.data, msg.len) == ST_OK ? ST_OK : ST_RESOURCE_EXHAUSTED;
    static const uint32_t ts_field[] = {3};
    st_code rc = rtr_wire_copy_except(out, msg, ts_field, 1);
    if (rc == ST_OK)
        rc = rtr_wire_put_varint(out, 3, (uint64_t)ts_us);
    (*n)++;
    return rc;
}

/* Copies msg, descending into the fields path[0] (then path[1], ...) down to the SetCell level.
 * scratch[d] holds the rewritten submessage of depth d. */
static st_code stamp_level(st_slice msg, const uint32_t *path, size_t depth, int64_t ts_us,
                           st_buf *out, st_buf *scratch, size_t *n) {
    if (depth == 0)
        return stamp_set_cell(msg, ts_us, out, n);
    const uint8_t *p = msg.data, *end = rtr_slice_end(msg);
    rtr_wire_field f;
    bool bad = false;
    while (rtr_wire_next(&p, end, &f, &bad)) {
        st_code rc;
        if (f.num == path[0] && f.wire_type == 2) {
            st_buf_reset(&scratch[0]);
            rc = stamp_level(f.bytes, path + 1, depth - 1, ts_us, &scratch[0], scratch + 1, n);
            if (rc == ST_OK)
                rc = rtr_wire_put_bytes(out, f.num, st_buf_slice(&scratch[0]));
        } else {
            rc = st_buf_append(out, f.raw.data, f.raw.len) == ST_OK ? ST_OK : ST_RESOURCE_EXHAUSTED;
        }
        if (rc != ST_OK)
            return rc;
    }
    return bad ? ST_INVALID_ARGUMENT : ST_OK;
}

st_code rtr_stamp_mutations(st_slice req, bool rows, int64_t ts_us, st_buf *out,
                            size_t *n_stamped) {
    /* MutateRowRequest.mutations = 3; MutateRowsRequest.entries = 2, Entry.mutations = 2;
     * Mutation.set_cell = 1. */
    static const uint32_t row_path[] = {3, 1};
    static const uint32_t rows_path[] = {2, 2, 1};
    const uint32_t *path = rows ? rows_path : row_path;
    size_t depth = rows ? 3 : 2, n = 0;
    st_buf scratch[3];
    for (size_t i = 0; i < 3; i++)
        st_buf_init(&scratch[i]);
    st_code rc = stamp_level(req, path, depth, ts_us, out, scratch, &n);
    for (size_t i = 0; i < 3; i++)
        st_buf_free(&scratch[i]);
    if (n_stamped)
        *n_stamped = n;
    return rc;
}
