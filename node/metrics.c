/* metrics.c — strata-node's /metrics page (strata/node_metrics.h; names in docs/metrics.md).
 * Everything is read on the loop thread when a scrape arrives; the only state kept between
 * scrapes is the hottest tablet of the last NODE_METRICS_HOT_INTERVAL_MS, found by a timer that
 * compares each tablet's write counter (node_tablet.writes, bumped by node_row_prepare) with its
 * value at the previous tick. */
#include "strata/node_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "backup.h"
#include "node_internal.h"
#ifdef STRATA_REPLICATION
#include "strata/replication.h"
#endif

struct node_metrics {
    node_ctx *n;
    metrics_http *http;
    struct event *hot_timer;
    bool hot_valid; /* a full interval has passed */
    char hot_table[NODE_TABLE_NAME_MAX + 1];
    uint64_t hot_id, hot_writes;
    uint64_t interval_writes; /* rows written to all tablets in the last interval */
};

/* ---- the hottest tablet ---- */

static void hot_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    node_metrics *m = arg;
    node_ctx *n = m->n;
    m->hot_valid = true;
    m->hot_writes = m->interval_writes = 0;
    m->hot_table[0] = '\0';
    m->hot_id = 0;
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++) {
            node_tablet *t = &n->tables[i].v[j];
            uint64_t d = t->writes - t->writes_mark;
            t->writes_mark = t->writes;
            m->interval_writes += d;
            if (d > m->hot_writes) {
                m->hot_writes = d;
                m->hot_id = t->id;
                snprintf(m->hot_table, sizeof m->hot_table, "%s", n->tables[i].name);
            }
        }
}

static void render_hot(node_metrics *m, prom_out *o) {
    prom_family(o, "strata_node_tablet_writes_interval", "gauge",
                "Rows written to this node's tablets in the last full interval (see "
                "strata_node_hot_interval_seconds).");
    prom_sample_u64(o, "strata_node_tablet_writes_interval", NULL, 0, m->interval_writes);
    prom_family(o, "strata_node_hot_interval_seconds", "gauge",
                "Length of the interval the hottest tablet is measured over.");
    prom_sample_f64(o, "strata_node_hot_interval_seconds", NULL, 0,
                    NODE_METRICS_HOT_INTERVAL_MS / 1000.0);
    prom_family(o, "strata_node_hottest_tablet_writes", "gauge",
                "Rows written in the last full interval to the tablet that took the most; absent "
                "when no tablet was written.");
    if (m->hot_valid && m->hot_writes > 0) {
        char id[24];
        snprintf(id, sizeof id, "%llu", (unsigned long long)m->hot_id);
        prom_label l[] = {{"table", m->hot_table}, {"tablet_id", id}};
        prom_sample_u64(o, "strata_node_hottest_tablet_writes", l, 2, m->hot_writes);
    }
}

/* ---- storage and tablets ---- */

static void gauge(prom_out *o, const char *name, const char *type, const char *help, uint64_t v) {
    prom_family(o, name, type, help);
    prom_sample_u64(o, name, NULL, 0, v);
}

static void render_storage(node_ctx *n, prom_out *o) {
    sto_stats s;
    memset(&s, 0, sizeof s);
    sto_db_stats(n->db, &s);
    gauge(o, "strata_storage_memtable_bytes", "gauge", "Bytes in memtables (all tablets).",
          s.memtable_bytes);
    gauge(o, "strata_storage_block_cache_bytes", "gauge", "Bytes held by the block cache.",
          s.cache_bytes);
    gauge(o, "strata_storage_block_cache_hits_total", "counter", "Block cache hits.", s.cache_hits);
    gauge(o, "strata_storage_block_cache_misses_total", "counter", "Block cache misses.",
          s.cache_misses);
    gauge(o, "strata_storage_blocks_read_total", "counter",
          "SSTable data blocks read from disk, checked and decompressed.", s.blocks_read);
    gauge(o, "strata_storage_block_read_bytes_total", "counter",
          "Uncompressed bytes of the SSTable data blocks read from disk.", s.block_bytes_read);
    gauge(o, "strata_storage_log_bytes", "gauge", "Bytes in commit log segments on disk.",
          s.log_bytes);
    gauge(o, "strata_storage_flushes_total", "counter", "Memtable flushes to SSTables.", s.flushes);
    gauge(o, "strata_storage_compactions_total", "counter", "Compactions completed.",
          s.compactions);
    prom_family(o, "strata_storage_write_stall_seconds_total", "counter",
                "Time writes waited for memtable room (flushes falling behind).");
    prom_sample_f64(o, "strata_storage_write_stall_seconds_total", NULL, 0, s.stalls_us / 1e6);
    gauge(o, "strata_storage_sstables", "gauge", "Live SSTable files.", s.sst_count);
}

static void render_tablets(node_ctx *n, prom_out *o) {
    uint64_t tablets = 0, bytes = 0, sst_max = 0, read_only = 0;
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++) {
            sto_tablet_info info;
            sto_tablet_info_get(n->tables[i].v[j].st, &info);
            tablets++;
            bytes += info.approx_bytes;
            read_only += info.read_only;
            if (info.sst_count > 0 && (uint64_t)info.sst_count > sst_max)
                sst_max = (uint64_t)info.sst_count;
        }
    gauge(o, "strata_node_tables", "gauge", "Tables this node knows.", n->n_tables);
    gauge(o, "strata_node_tablets", "gauge", "Tablets this node serves.", tablets);
    gauge(o, "strata_node_tablets_read_only", "gauge",
          "Tablets made read-only after corruption was found.", read_only);
    gauge(o, "strata_node_tablet_bytes", "gauge",
          "Approximate bytes in this node's tablets (SSTables and memtables).", bytes);
    gauge(o, "strata_storage_tablet_sstables_max", "gauge",
          "SSTables of the tablet that has the most: the compaction backlog (reads merge them "
          "all).",
          sst_max);
    gauge(o, "strata_node_writes_in_flight", "gauge",
          "Writes handed to storage and not yet durable.",
          __atomic_load_n(&n->writes_in_flight, __ATOMIC_RELAXED));
    prom_family(o, "strata_node_uptime_seconds", "gauge", "Seconds since the node opened.");
    prom_sample_f64(o, "strata_node_uptime_seconds", NULL, 0,
                    (double)(st_mono_us() - n->start_us) / 1e6);
}

/* ---- replication lag per peer cluster ---- */

#ifdef STRATA_REPLICATION
typedef struct repl_peers {
    repl_peer_stats v[ST_TOPO_CLUSTERS_MAX];
    char num[ST_TOPO_CLUSTERS_MAX][16];
    size_t n;
} repl_peers;

static void repl_family(prom_out *o, const repl_peers *p, const char *name, const char *type,
                        const char *help, int field) {
    prom_family(o, name, type, help);
    for (size_t i = 0; i < p->n; i++) {
        const repl_peer_stats *s = &p->v[i];
        prom_label l[] = {{"peer_cluster", s->cluster_id}, {"peer_cluster_num", p->num[i]}};
        switch (field) {
        case 0:
            prom_sample_u64(o, name, l, 2, s->records_behind);
            break;
        case 1:
            prom_sample_u64(o, name, l, 2, s->bytes_behind);
            break;
        case 2:
            prom_sample_f64(o, name, l, 2, s->time_behind_us / 1e6);
            break;
        case 3:
            prom_sample_u64(o, name, l, 2, s->rows_shipped);
            break;
        case 4:
            prom_sample_u64(o, name, l, 2, s->rpcs_failed);
            break;
        default:
            prom_sample_u64(o, name, l, 2, s->backing_off ? 1 : 0);
            break;
        }
    }
}
#endif

static void render_repl(node_ctx *n, prom_out *o) {
#ifdef STRATA_REPLICATION
    if (!n->repl)
        return;
    repl_peers *p = malloc(sizeof *p); /* a few KiB: off the stack */
    if (!p) {
        if (o->rc == ST_OK)
            o->rc = ST_RESOURCE_EXHAUSTED;
        return;
    }
    p->n = repl_peer_count(n->repl);
    if (p->n > ST_TOPO_CLUSTERS_MAX)
        p->n = ST_TOPO_CLUSTERS_MAX;
    for (size_t i = 0; i < p->n; i++) {
        repl_peer_stats_get(n->repl, i, &p->v[i]);
        snprintf(p->num[i], sizeof p->num[i], "%u", p->v[i].cluster_num);
    }
    repl_family(o, p, "strata_replication_records_behind", "gauge",
                "Log records of this node not yet acknowledged by the peer cluster.", 0);
    repl_family(o, p, "strata_replication_bytes_behind", "gauge",
                "Encoded bytes not yet acknowledged by the peer cluster (estimated for records "
                "not read yet).",
                1);
    repl_family(o, p, "strata_replication_seconds_behind", "gauge",
                "Age of the oldest record the peer cluster has not acknowledged (0 when caught "
                "up).",
                2);
    repl_family(o, p, "strata_replication_rows_shipped_total", "counter",
                "Rows the peer cluster acknowledged.", 3);
    repl_family(o, p, "strata_replication_rpcs_failed_total", "counter",
                "Failed Apply calls to the peer cluster.", 4);
    repl_family(o, p, "strata_replication_backing_off", "gauge",
                "1 while shipping to the peer cluster waits after a failure.", 5);
    free(p);
    /* receiving side: a peer's batch that waited its turn past the bound (docs/formats/
     * replication.md, Apply order) and was refused; the peer resends, so only a rising count
     * says something is wrong (a peer node failing part-way through its writes) */
    gauge(o, "strata_replication_apply_refused_total", "counter",
          "Apply calls from peer clusters refused after waiting for an earlier batch of their "
          "sender.",
          repl_apply_expired(n->repl));
#else
    (void)n;
    (void)o;
#endif
}

/* Bytes read back to checksum SSTables for backup pieces: by="freeze" is what backups waited
 * for, by="background" what the background pass read ahead of them (docs/backups.md); and what
 * the reaper removed of deleted backups. */
static void render_backup_crc(node_ctx *n, prom_out *o) {
    if (!n->backups)
        return;
    bk_crc_stats s;
    bk_crc_counters(n->backups, &s);
    const char *name = "strata_node_backup_crc_read_bytes_total";
    prom_family(o, name, "counter", "Bytes of SSTables read to compute backup checksums.");
    prom_label fl[] = {{"by", "freeze"}}, bl[] = {{"by", "background"}};
    prom_sample_u64(o, name, fl, 1, s.freeze_bytes);
    prom_sample_u64(o, name, bl, 1, s.bg_bytes);
    name = "strata_node_backup_crc_read_files_total";
    prom_family(o, name, "counter", "SSTables read to compute backup checksums.");
    prom_sample_u64(o, name, fl, 1, s.freeze_files);
    prom_sample_u64(o, name, bl, 1, s.bg_files);
    /* deletions: what the reaper thread removed from the trash, off the loop */
    name = "strata_node_backup_trash_removed_total";
    prom_family(o, name, "counter", "Deleted backups and pieces removed from the node's trash.");
    prom_sample_u64(o, name, NULL, 0, __atomic_load_n(&n->backups->reaped, __ATOMIC_RELAXED));
    name = "strata_node_backup_trash_pieces_removed_total";
    prom_family(o, name, "counter", "Pieces removed from the node's trash.");
    prom_sample_u64(o, name, NULL, 0,
                    __atomic_load_n(&n->backups->reaped_pieces, __ATOMIC_RELAXED));
}

/* ---- the page ---- */

void node_metrics_render(node_metrics *m, prom_out *o) {
    node_ctx *n = m->n;
    rpc_server_metrics_render(n->rpc, o);
    render_storage(n, o);
    render_tablets(n, o);
    render_hot(m, o);
    render_repl(n, o);
    render_backup_crc(n, o);
    prom_process(o);
}

static void render_cb(prom_out *o, void *arg) {
    node_metrics_render(arg, o);
}

st_code node_metrics_start(node_ctx *n, const char *host, uint16_t port, node_metrics **out,
                           uint16_t *bound_port, st_err *err) {
    node_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory starting metrics");
    m->n = n;
    struct timeval tv = {NODE_METRICS_HOT_INTERVAL_MS / 1000,
                         (NODE_METRICS_HOT_INTERVAL_MS % 1000) * 1000};
    m->hot_timer = event_new(n->base, -1, EV_PERSIST, hot_tick, m);
    if (!m->hot_timer || event_add(m->hot_timer, &tv) != 0) {
        node_metrics_stop(m);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot arm the metrics timer");
    }
    /* Counts from before the first tick belong to no interval. */
    for (size_t i = 0; i < n->n_tables; i++)
        for (size_t j = 0; j < n->tables[i].n; j++)
            n->tables[i].v[j].writes_mark = n->tables[i].v[j].writes;
    if (host) {
        m->http = metrics_http_start(n->base, host, port, render_cb, m, bound_port, err);
        if (!m->http) {
            node_metrics_stop(m);
            return err ? err->code : ST_UNAVAILABLE;
        }
    }
    *out = m;
    return ST_OK;
}

void node_metrics_stop(node_metrics *m) {
    if (!m)
        return;
    metrics_http_free(m->http);
    if (m->hot_timer)
        event_free(m->hot_timer);
    free(m);
}
