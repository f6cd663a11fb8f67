/* token.c — consistency tokens: every node's last lsn at generation time, as canonical text,
 * and the test of whether every shipper has acknowledged past them (docs/formats/replication.md).
 * Pure functions: no I/O, no clock. */
#include "strata/replication.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Decimal only, so a router may join several nodes' tokens with its own punctuation:
 * "1" (format version), then per entry the node number in 8 digits and the lsn in 20. */
#define TOKEN_VERSION '1'
#define NODE_DIGITS 8
#define LSN_DIGITS 20
#define ENTRY_DIGITS (NODE_DIGITS + LSN_DIGITS)
_Static_assert(NODE_DIGITS >= 8 && LSN_DIGITS >= 20, "node numbers < 2^24, lsns < 2^64 fit");
_Static_assert(REPL_TOKEN_CHARS_MAX >= 2 + REPL_TOKEN_NODES_MAX * ENTRY_DIGITS, "token buffer");

static int entry_cmp(const void *a, const void *b) {
    const repl_token_entry *x = a, *y = b;
    return x->node_num < y->node_num ? -1 : x->node_num > y->node_num;
}

st_code repl_token_encode(repl_token *t, char *out, size_t cap, st_err *err) {
    if (t->n == 0 || t->n > REPL_TOKEN_NODES_MAX || cap < 2 + t->n * ENTRY_DIGITS) {
        if (cap)
            out[0] = '\0';
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "consistency token of %zu nodes does not fit in %zu bytes (1..%d nodes)",
                          t->n, cap, REPL_TOKEN_NODES_MAX);
    }
    qsort(t->e, t->n, sizeof t->e[0], entry_cmp);
    size_t k = 0;
    out[k++] = TOKEN_VERSION;
    for (size_t i = 0; i < t->n; i++) {
        k += (size_t)snprintf(out + k, cap - k, "%0*u%0*llu", NODE_DIGITS, t->e[i].node_num,
                              LSN_DIGITS, (unsigned long long)t->e[i].lsn);
    }
    out[k] = '\0';
    return ST_OK;
}

/* Parses exactly len decimal digits at p; false when one is not a digit or it overflows max. */
static bool parse_fixed(const char *p, size_t len, uint64_t max, uint64_t *v) {
    uint64_t acc = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (acc > (max - d) / 10)
            return false;
        acc = acc * 10 + d;
    }
    *v = acc;
    return true;
}

bool repl_token_is_global(const char *text) {
    size_t len = strlen(text);
    return len >= 1 + ENTRY_DIGITS && text[0] == TOKEN_VERSION && (len - 1) % ENTRY_DIGITS == 0 &&
           strspn(text, "0123456789") == len;
}

st_code repl_token_decode(const char *text, repl_token *out, st_err *err) {
    out->n = 0;
    if (!repl_token_is_global(text))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid consistency token '%.64s': not made by this instance; "
                          "generate a new one",
                          text);
    size_t n = (strlen(text) - 1) / ENTRY_DIGITS;
    if (n > REPL_TOKEN_NODES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "consistency token names over %d nodes",
                          REPL_TOKEN_NODES_MAX);
    for (size_t i = 0; i < n; i++) {
        const char *p = text + 1 + i * ENTRY_DIGITS;
        uint64_t node, lsn;
        if (!parse_fixed(p, NODE_DIGITS, UINT32_MAX, &node) ||
            !parse_fixed(p + NODE_DIGITS, LSN_DIGITS, UINT64_MAX, &lsn))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid consistency token '%.64s': a number is out of range", text);
        for (size_t j = 0; j < out->n; j++)
            if (out->e[j].node_num == node)
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
        uint64_t lsn = t->e[i].lsn;
        if (p && lsn == REPL_TOKEN_LSN_UNKNOWN) /* everything it had when asked now */
            lsn = p->last_lsn;
        if (!p || (lsn > 0 && !node_caught_up(p, cluster, topo, lsn)))
            return false;
    }
    return true;
}

void repl_token_from_positions(const st_topology *topo, const repl_node_positions *nodes, size_t n,
                               repl_token *out) {
    out->n = 0;
    for (size_t c = 0; c < topo->n_clusters; c++) {
        for (size_t k = 0; k < topo->clusters[c].n_nodes && out->n < REPL_TOKEN_NODES_MAX; k++) {
            uint32_t num = topo->clusters[c].nodes[k].num;
            out->e[out->n].node_num = num;
            out->e[out->n].lsn = REPL_TOKEN_LSN_UNKNOWN;
            for (size_t i = 0; i < n; i++)
                if (nodes[i].node_num == num)
                    out->e[out->n].lsn = nodes[i].last_lsn;
            out->n++;
        }
    }
}
