/* metrics.c — strata-router's /metrics page (strata/router_metrics.h; names in
 * docs/metrics.md). Everything is read from the router's state on the loop thread when a scrape
 * arrives; nothing is kept between scrapes. */
#include "strata/router_metrics.h"

#include <stdio.h>
#include <string.h>

#include "failover.h"
#include "router_internal.h"

static void one_sample(prom_out *o, const char *name, const char *type, const char *help,
                       uint64_t v) {
    prom_family(o, name, type, help);
    prom_sample_u64(o, name, NULL, 0, v);
}

/* One sample per cluster of a per-cluster value. */
typedef uint64_t (*cluster_value_fn)(rtr_ctx *r, size_t i);

static void per_cluster(rtr_ctx *r, prom_out *o, const char *name, const char *type,
                        const char *help, cluster_value_fn fn) {
    prom_family(o, name, type, help);
    for (size_t i = 0; i < r->n_clusters; i++) {
        prom_label l[] = {{"cluster", r->clusters[i].topo->id}};
        prom_sample_u64(o, name, l, 1, fn(r, i));
    }
}

static uint64_t v_up(rtr_ctx *r, size_t i) {
    return rtr_health_cluster_up(r, i) ? 1 : 0;
}
static uint64_t v_changes(rtr_ctx *r, size_t i) {
    return r->fo ? r->fo->clusters[i].changes : 0;
}
static uint64_t v_refreshes(rtr_ctx *r, size_t i) {
    return r->clusters[i].map_gen;
}
static uint64_t v_nodes(rtr_ctx *r, size_t i) {
    return r->clusters[i].n_nodes;
}
static uint64_t v_tablets(rtr_ctx *r, size_t i) {
    const rtr_tmap *m = r->clusters[i].map;
    uint64_t n = 0;
    for (size_t t = 0; m && t < m->n_tables; t++)
        n += m->tables[t].n;
    return n;
}

/* Per node: up (1) or down (0) as the health probes see it. */
static void render_nodes(rtr_ctx *r, prom_out *o) {
    prom_family(o, "strata_router_node_up", "gauge",
                "1 when the node answers health probes, 0 while the router considers it down.");
    for (size_t i = 0; i < r->n_clusters; i++)
        for (size_t j = 0; j < r->clusters[i].n_nodes; j++) {
            const rtr_node *n = &r->clusters[i].nodes[j];
            prom_label l[] = {{"cluster", r->clusters[i].topo->id}, {"node", n->addr}};
            bool down = r->fo && r->fo->nodes[i][j].down;
            prom_sample_u64(o, "strata_router_node_up", l, 2, down ? 0 : 1);
        }
}

void rtr_metrics_render(rtr_ctx *r, prom_out *o) {
    rpc_server_metrics_render(r->rpc, o);
    per_cluster(r, o, "strata_router_cluster_up", "gauge",
                "1 while every node of the cluster is up (the failover verdict), else 0.", v_up);
    per_cluster(r, o, "strata_router_cluster_health_changes_total", "counter",
                "Times the cluster's health verdict changed.", v_changes);
    per_cluster(r, o, "strata_router_tablet_map_refreshes_total", "counter",
                "Tablet-map refreshes (ListTablets on every node of the cluster).", v_refreshes);
    per_cluster(r, o, "strata_router_cluster_nodes", "gauge", "Nodes of the cluster.", v_nodes);
    per_cluster(r, o, "strata_router_tablets", "gauge",
                "Tablets in the router's map of the cluster.", v_tablets);
    render_nodes(r, o);
    one_sample(o, "strata_router_retries_total", "counter",
               "Request parts retried transparently after a backoff (stale tablet map, node "
               "unavailable), in this process.",
               __atomic_load_n(&rtr_retries_total, __ATOMIC_RELAXED));
    one_sample(o, "strata_router_failovers_total", "counter",
               "Requests moved to another cluster by a multi-cluster app profile.",
               r->fo ? r->fo->failovers : 0);
    one_sample(o, "strata_router_balancer_moves_total", "counter",
               "Tablets the balancer moved between nodes.", r->bal_moves);
    one_sample(o, "strata_router_balancer_moves_failed_total", "counter",
               "Tablet moves by the balancer that failed.", r->bal_failed);
    one_sample(o, "strata_router_tables", "gauge", "Tables in the instance metadata.",
               r->meta.n_tables);
    one_sample(o, "strata_router_change_streams", "gauge",
               "ReadChangeStream calls relayed now (refused past --max-change-streams).",
               r->cs_streams);
    prom_process(o);
}

static void render_cb(prom_out *o, void *arg) {
    rtr_metrics_render(arg, o);
}

metrics_http *rtr_metrics_start(rtr_ctx *r, const char *host, uint16_t port, uint16_t *bound_port,
                                st_err *err) {
    return metrics_http_start(r->base, host, port, render_cb, r, bound_port, err);
}
