/* token.c — consistency tokens: every node's last lsn at generation time, as canonical text,
 * and the test of whether every shipper has acknowledged past them (docs/formats/replication.md).
 * Pure functions: no I/O, no clock. */
#include "strata/replication.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_PREFIX "r1:"

static int entry_cmp(const void *a, const void *b) {
    const repl_token_entry *x = a, *y = b;
    return x->node_num < y->node_num ? -1 : x->node_num > y->node_num;
}

st_code repl_token_encode(repl_token *t, char *out, size_t cap, st_err *err) {
    if (t->n > REPL_TOKEN_NODES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "token of %zu nodes, over the maximum %d",
                          t->n, REPL_TOKEN_NODES_MAX);
    qsort(t->e, t->n, sizeof t->e[0], entry_cmp);
    size_t k = 0;
    int w = snprintf(out, cap, "%s", TOKEN_PREFIX);
    if (w < 0 || (size_t)w >= cap)
        goto full;
    k = (size_t)w;
    for (size_t i = 0; i < t->n; i++) {
        w = snprintf(out + k, cap - k, "%s%u=%llu", i ? "," : "", t->e[i].node_num,
                     (unsigned long long)t->e[i].lsn);
        if (w < 0 || (size_t)w >= cap - k)
            goto full;
        k += (size_t)w;
    }
    return ST_OK;
full:
    if (cap)
        out[0] = '\0';
    return st_err_set(err, ST_INVALID_ARGUMENT, "consistency token does not fit in %zu bytes",
                      cap);
}

/* Parses a decimal number of at most max at *p; false when there is none or it overflows. */
static bool parse_u64(const char **p, uint64_t max, uint64_t *v) {
    const char *s = *p;
    uint64_t acc = 0;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (acc > (max - d) / 10)
            return false;
        acc = acc * 10 + d;
    }
    *p = s;
    *v = acc;
    return true;
}

st_code repl_token_decode(const char *text, repl_token *out, st_err *err) {
    out->n = 0;
    if (strncmp(text, TOKEN_PREFIX, strlen(TOKEN_PREFIX)) != 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid consistency token '%.64s': not made by this instance "
                          "(expected r1:<node>=<lsn>,...); generate a new one",
                          text);
    const char *p = text + strlen(TOKEN_PREFIX);
    while (*p) {
        uint64_t node, lsn;
        if (out->n == REPL_TOKEN_NODES_MAX)
            return st_err_set(err, ST_INVALID_ARGUMENT, "consistency token names over %d nodes",
                              REPL_TOKEN_NODES_MAX);
        if (!parse_u64(&p, UINT32_MAX, &node) || *p++ != '=' || !parse_u64(&p, UINT64_MAX, &lsn) ||
            (*p && *p != ',') || (*p == ',' && p[1] == '\0'))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid consistency token '%.64s': expected r1:<node>=<lsn>,...",
                              text);
        if (*p == ',')
            p++;
        for (size_t i = 0; i < out->n; i++)
            if (out->e[i].node_num == node)
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "invalid consistency token: node %llu appears twice",
                                  (unsigned long long)node);
        out->e[out->n].node_num = (uint32_t)node;
        out->e[out->n].lsn = lsn;
        out->n++;
    }
    return ST_OK;
}

/* The cluster number of node_num in topo; 0 when absent. */
static uint32_t topo_cluster_of(const st_topology *topo, uint32_t node_num) {
    for (size_t c = 0; c < topo->n_clusters; c++)
        for (size_t i = 0; i < topo->clusters[c].n_nodes; i++)
            if (topo->clusters[c].nodes[i].num == node_num)
                return topo->clusters[c].num;
    return 0;
}

static bool node_caught_up(const repl_node_positions *p, uint32_t own_cluster,
                           const st_topology *topo, uint64_t lsn) {
    for (size_t c = 0; c < topo->n_clusters; c++) {
        uint32_t peer = topo->clusters[c].num;
        if (peer == own_cluster)
            continue;
        bool ok = false;
        for (size_t j = 0; j < p->n_peers && !ok; j++)
            ok = p->peer_cluster[j] == peer && p->peer_acked_next[j] > lsn;
        if (!ok)
            return false;
    }
    return true;
}

bool repl_token_satisfied(const repl_token *t, const st_topology *topo,
                          const repl_node_positions *nodes, size_t n_nodes) {
    for (size_t i = 0; i < t->n; i++) {
        uint32_t cluster = topo_cluster_of(topo, t->e[i].node_num);
        if (cluster == 0 || t->e[i].lsn == 0)
            continue; /* a removed node, or one that had written nothing */
        const repl_node_positions *p = NULL;
        for (size_t j = 0; j < n_nodes && !p; j++)
            if (nodes[j].node_num == t->e[i].node_num)
                p = &nodes[j];
        if (!p || !node_caught_up(p, cluster, topo, t->e[i].lsn))
            return false;
    }
    return true;
}

void repl_token_from_positions(const repl_node_positions *nodes, size_t n, repl_token *out) {
    out->n = 0;
    for (size_t i = 0; i < n && out->n < REPL_TOKEN_NODES_MAX; i++) {
        out->e[out->n].node_num = nodes[i].node_num;
        out->e[out->n].lsn = nodes[i].last_lsn;
        out->n++;
    }
}
