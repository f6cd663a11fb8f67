/* fuzz_topology: the instance topology file parser (base/topology.c), which strata-router and
 * the CLI run on a file an operator edits by hand. The input is the file's text.
 * Properties: no crash, leak or read outside the text; an error always comes with a message
 * naming the line; a topology that parses is complete (at least one cluster, every cluster with
 * a node and a zone, node numbers 1..n in file order) and, written back with
 * st_topology_save, loads again into the same topology. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/topology.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static void fuzz_same(const st_topology *a, const st_topology *b) {
    FUZZ_CHECK(!strcmp(a->project, b->project) && !strcmp(a->instance, b->instance));
    FUZZ_CHECK(a->split_bytes == b->split_bytes && a->n_clusters == b->n_clusters);
    FUZZ_CHECK(a->n_routers == b->n_routers);
    for (size_t i = 0; i < a->n_clusters; i++) {
        const st_topo_cluster *x = &a->clusters[i], *y = &b->clusters[i];
        FUZZ_CHECK(!strcmp(x->id, y->id) && !strcmp(x->zone, y->zone));
        FUZZ_CHECK(x->num == y->num && x->n_nodes == y->n_nodes);
        for (size_t j = 0; j < x->n_nodes; j++)
            FUZZ_CHECK(!strcmp(x->nodes[j].addr, y->nodes[j].addr) &&
                       !strcmp(x->nodes[j].data_dir, y->nodes[j].data_dir) &&
                       x->nodes[j].num == y->nodes[j].num);
    }
    for (size_t r = 0; r < a->n_routers; r++)
        FUZZ_CHECK(!strcmp(a->routers[r], b->routers[r]));
}

static void fuzz_complete(const st_topology *t) {
    FUZZ_CHECK(t->n_clusters >= 1 && t->n_clusters <= ST_TOPO_CLUSTERS_MAX);
    FUZZ_CHECK(t->n_routers <= ST_TOPO_ROUTERS_MAX && t->split_bytes > 0);
    uint32_t num = 1;
    for (size_t i = 0; i < t->n_clusters; i++) {
        const st_topo_cluster *c = &t->clusters[i];
        FUZZ_CHECK(c->num == i + 1 && c->zone[0] && c->id[0]);
        FUZZ_CHECK(c->n_nodes >= 1 && c->n_nodes <= ST_TOPO_NODES_MAX);
        for (size_t j = 0; j < c->n_nodes; j++)
            FUZZ_CHECK(c->nodes[j].num == num++ && c->nodes[j].addr[0]);
    }
}

/* The parsed topologies (600 KiB each: allocating and clearing them per input cost more than the
 * parse) are reused across inputs; the parser clears them itself. */
static st_topology fuzz_topo, fuzz_back;

/* Writes t to a file of this process and loads it back. */
static void fuzz_round_trip(const st_topology *t) {
    char path[256];
    const char *dir = getenv("STRATA_TEST_TMP"); /* set by CTest */
    if (!dir || !*dir)
        dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/fuzz_topology.%ld", dir && *dir ? dir : "/tmp", (long)getpid());
    st_err err = {0};
    if (st_topology_save(path, t, &err) != ST_OK)
        return; /* no writable temporary directory: nothing to compare */
    FUZZ_CHECK(st_topology_load(path, &fuzz_back, &err) == ST_OK);
    fuzz_same(t, &fuzz_back);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly the text's bytes, so ASan sees any read past its end. */
    char *text = malloc(size ? size : 1);
    st_topology *t = &fuzz_topo;
    FUZZ_CHECK(text);
    if (size)
        memcpy(text, data, size);
    st_err err = {0};
    st_code rc = st_topology_parse(text, size, "fuzz.topology", t, &err);
    if (rc == ST_OK) {
        fuzz_complete(t);
        fuzz_round_trip(t);
    } else {
        FUZZ_CHECK(rc == ST_INVALID_ARGUMENT && !strncmp(err.msg, "fuzz.topology", 13));
    }
    free(text);
    return 0;
}
