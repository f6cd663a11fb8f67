/*
 * Proves that tablets split and spread over a real local instance, and that reads stay exact
 * while they do: `strata up` starts one cluster of three strata-node processes with a small split
 * threshold (256 KiB) and a router; 100,000 rows (STRATA_TABLETS_ROWS; CTest sets fewer under
 * sanitizers) of 100-byte values are written through the router in MutateRows batches, in a
 * random order, while a second thread runs full scans and checks each one is strictly ordered,
 * free of duplicates and holds every row acknowledged before it started. Then, once the router's
 * balancer has spread the tablets (ListTablets on every node: many tablets on ALL nodes, counts
 * within one of each other), the scans, run on and under the moves, must be exact: a full scan,
 * a reversed full scan (with the bigtable-features reverse_scans header), row-limited scans
 * forward and reversed, random key sets (with absent keys, duplicates, any order) forward and
 * reversed, and random ranges, each compared with the model of what was written.
 *
 *   tablets_test <build>/ops/strata
 * Exit 77 when the strata binary (or strata-node / strata-router next to it) is missing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "btclient.h"
#include "chaos_util.h"
#include "strata/internal/v1/node.pb-c.h"
#include "strata/rpc.h"
#include "strata/topology.h"

#define ROWS_DEFAULT 100000
#define SPLIT_BYTES 262144
#define NODES 3
#define BATCH_ROWS 100 /* many calls, so writes overlap splits and moves */
#define VALUE_BYTES 100
#define KEY_MAX 32
#define MIN_TABLETS_PER_NODE 3 /* at least; more with more rows (min_per_node) */
#define SETTLE_POLL_MS 500
#define SETTLE_STABLE_POLLS 4 /* same counts, nothing moving, this many polls in a row */
#define SETTLE_POLLS_MAX 600  /* hang guard (5 min), not a timing assertion */
#define KEYSET_READS 30
#define KEYSET_KEYS_MAX 400
#define RANGE_READS 30

static uint32_t g_rows;
static bt_client g_cl;
static const char *g_table = "t";

/* ---- helpers ---- */

/* Lines of DIR/logs/<name>.log holding both needles (figures for the report, not checks). */
static size_t log_count(const char *name, const char *a, const char *b) {
    char path[BT_PATH_MAX * 2], line[4096];
    snprintf(path, sizeof path, "%s/logs/%s.log", ci_dir, name);
    FILE *f = fopen(path, "r");
    size_t n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return n;
}

static size_t moves_done(void) {
    return log_count("router", "module=balance", "(moves=");
}

static size_t splits_done(void) {
    size_t n = 0;
    for (int i = 0; i < NODES; i++) {
        char name[32];
        snprintf(name, sizeof name, "east-%d", i);
        n += log_count(name, "module=split", " -> ");
    }
    return n;
}

static void key_of(uint32_t i, char out[KEY_MAX]) {
    snprintf(out, KEY_MAX, "k%07u", i);
}

/* The 100-byte value of row i: pseudo-random bytes (they do not compress, so the tablets grow by
 * about what is written and split often). */
static void value_of(uint32_t i, char out[VALUE_BYTES]) {
    uint64_t x = 0x9e3779b97f4a7c15ULL * (i + 1);
    for (int k = 0; k < VALUE_BYTES; k++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 29;
        out[k] = (char)(x >> 56);
    }
}

/* Index of a written row key, or -1 for any other key. */
static long index_of(st_slice key) {
    if (key.len != 8 || key.data[0] != 'k')
        return -1;
    long v = 0;
    for (size_t k = 1; k < 8; k++) {
        if (key.data[k] < '0' || key.data[k] > '9')
            return -1;
        v = v * 10 + (key.data[k] - '0');
    }
    return v < (long)g_rows ? v : -1;
}

static bool row_ok(const bt_row *row, long i) {
    char want[VALUE_BYTES];
    value_of((uint32_t)i, want);
    return row->n_cells == 1 && row->cells[0].value.len == VALUE_BYTES &&
           memcmp(row->cells[0].value.data, want, VALUE_BYTES) == 0;
}

/* ---- reads collected as row indexes (-1: a key never written) ---- */

typedef struct collected {
    long *v;
    size_t n, cap;
    size_t bad_values;
} collected;

static void collect_row(const bt_row *row, void *arg) {
    collected *c = arg;
    long i = index_of(row->key);
    if (i >= 0 && !row_ok(row, i))
        c->bad_values++;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->v = realloc(c->v, c->cap * sizeof *c->v);
        if (!c->v)
            abort();
    }
    c->v[c->n++] = i;
}

/* Reads and compares with want[0..n_want) (indexes in delivery order). */
static void expect_read(const char *what, const bt_read_req *req, const long *want, size_t n_want) {
    collected got = {0};
    st_err st = {0};
    st_code rc = bt_read_rows(&g_cl, g_table, req, collect_row, &got, &st);
    if (rc != ST_OK)
        ci_fail("%s: ReadRows failed: %s: %s", what, st_code_name(rc), st.msg);
    if (got.bad_values)
        ci_fail("%s: %zu rows with a wrong value", what, got.bad_values);
    for (size_t k = 0; k < got.n || k < n_want; k++)
        if (k >= got.n || k >= n_want || got.v[k] != want[k])
            ci_fail("%s: %zu rows, %zu expected; first difference at position %zu (got %ld, want "
                    "%ld)",
                    what, got.n, n_want, k, k < got.n ? got.v[k] : -2L, k < n_want ? want[k] : -2L);
    free(got.v);
}

/* ---- the concurrent reader ---- */

typedef struct reader {
    pthread_t th;
    const uint32_t *perm;
    volatile int stop;
    uint32_t acked; /* rows perm[0..acked) are acknowledged (atomic) */
    uint64_t scans, rows_seen;
    char error[ST_ERR_MSG_MAX + 128];
} reader;

typedef struct scan_state {
    uint8_t *seen;
    st_buf prev;
    bool has_prev;
    char *error;
} scan_state;

static void scan_row(const bt_row *row, void *arg) {
    scan_state *s = arg;
    if (s->error[0])
        return;
    if (s->has_prev && st_slice_cmp(st_buf_slice(&s->prev), row->key) >= 0) {
        snprintf(s->error, ST_ERR_MSG_MAX + 128, "scan out of order or duplicate row at '%.*s'",
                 (int)row->key.len, (const char *)row->key.data);
        return;
    }
    st_buf_reset(&s->prev);
    if (st_buf_append(&s->prev, row->key.data, row->key.len) != ST_OK)
        abort();
    s->has_prev = true;
    long i = index_of(row->key);
    if (i < 0 || !row_ok(row, i)) {
        snprintf(s->error, ST_ERR_MSG_MAX + 128,
                 "scan returned an unknown key or a wrong value at '%.*s'", (int)row->key.len,
                 (const char *)row->key.data);
        return;
    }
    s->seen[i] = 1;
}

/* One full scan: ordered, no duplicates, and every row acknowledged before it started present. */
static void reader_scan(reader *rd, uint8_t *seen) {
    uint32_t acked = __atomic_load_n(&rd->acked, __ATOMIC_ACQUIRE);
    memset(seen, 0, g_rows);
    scan_state s = {seen, {0}, false, rd->error};
    bt_read_req req = {0};
    st_err st = {0};
    st_code rc = bt_read_rows(&g_cl, g_table, &req, scan_row, &s, &st);
    st_buf_free(&s.prev);
    if (rc != ST_OK && !rd->error[0])
        snprintf(rd->error, sizeof rd->error, "scan %" PRIu64 " failed: %s: %s", rd->scans,
                 st_code_name(rc), st.msg);
    for (uint32_t k = 0; k < acked && !rd->error[0]; k++)
        if (!seen[rd->perm[k]])
            snprintf(rd->error, sizeof rd->error,
                     "scan %" PRIu64 " missed row k%07u, acknowledged before it started", rd->scans,
                     rd->perm[k]);
    for (uint32_t k = 0; k < g_rows; k++)
        rd->rows_seen += seen[k];
    rd->scans++;
}

static void *reader_main(void *arg) {
    reader *rd = arg;
    uint8_t *seen = malloc(g_rows);
    if (!seen)
        abort();
    while (!rd->stop && !rd->error[0])
        reader_scan(rd, seen);
    free(seen);
    return NULL;
}

/* ---- writing ---- */

static void write_rows(const uint32_t *perm, reader *rd) {
    bt_muts *muts = calloc(BATCH_ROWS, sizeof *muts);
    bt_entry *ents = calloc(BATCH_ROWS, sizeof *ents);
    char(*keys)[KEY_MAX] = calloc(BATCH_ROWS, KEY_MAX);
    st_code *codes = calloc(BATCH_ROWS, sizeof *codes);
    st_err *msgs = calloc(BATCH_ROWS, sizeof *msgs);
    if (!muts || !ents || !keys || !codes || !msgs)
        abort();
    for (size_t k = 0; k < BATCH_ROWS; k++)
        bt_muts_init(&muts[k]);
    for (uint32_t done = 0; done < g_rows;) {
        size_t n = g_rows - done < BATCH_ROWS ? g_rows - done : BATCH_ROWS;
        for (size_t k = 0; k < n; k++) {
            char val[VALUE_BYTES];
            key_of(perm[done + k], keys[k]);
            value_of(perm[done + k], val);
            bt_muts_reset(&muts[k]);
            bt_muts_set(&muts[k], "cf", st_slice_cstr("c"), -1, st_slice_make(val, VALUE_BYTES));
            ents[k] = (bt_entry){st_slice_cstr(keys[k]), &muts[k]};
        }
        st_err st = {0};
        st_code rc = bt_mutate_rows(&g_cl, g_table, ents, n, codes, msgs, &st);
        if (rc != ST_OK)
            ci_fail("MutateRows of rows %u..%zu failed: %s: %s", done, done + n, st_code_name(rc),
                    st.msg);
        for (size_t k = 0; k < n; k++)
            if (codes[k] != ST_OK)
                ci_fail("MutateRows entry %s: %s: %s", keys[k], st_code_name(codes[k]),
                        msgs[k].msg);
        done += (uint32_t)n;
        __atomic_store_n(&rd->acked, done, __ATOMIC_RELEASE);
    }
    for (size_t k = 0; k < BATCH_ROWS; k++)
        bt_muts_deinit(&muts[k]);
    free(muts);
    free(ents);
    free(keys);
    free(codes);
    free(msgs);
}

/* ---- tablets per node ---- */

typedef struct census {
    size_t count[NODES];
    size_t moving;
    uint64_t bytes[NODES];
} census;

static void take_census(const st_topology *t, census *c) {
    char name[BT_NAME_MAX];
    bt_table_name(&g_cl, g_table, name);
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NODES; i++) {
        Strata__Internal__V1__ListTabletsRequest req;
        strata__internal__v1__list_tablets_request__init(&req);
        req.table_name = name;
        uint8_t buf[BT_NAME_MAX + 16];
        size_t len = strata__internal__v1__list_tablets_request__pack(&req, buf);
        st_buf resp;
        st_buf_init(&resp);
        st_err st = {0};
        const char *addr = t->clusters[0].nodes[i].addr;
        st_code rc = rpc_blocking_unary(addr, NULL, "/strata.internal.v1.Node/ListTablets",
                                        st_slice_make(buf, len), NULL, 0, 30000, &resp, &st);
        Strata__Internal__V1__ListTabletsResponse *m =
            rc == ST_OK
                ? strata__internal__v1__list_tablets_response__unpack(NULL, resp.len, resp.data)
                : NULL;
        if (!m)
            ci_fail("ListTablets on node %s: %s: %s", addr, st_code_name(rc), st.msg);
        c->count[i] = m->n_tablets;
        for (size_t k = 0; k < m->n_tablets; k++) {
            c->moving += m->tablets[k]->moving;
            c->bytes[i] += m->tablets[k]->approx_bytes;
        }
        strata__internal__v1__list_tablets_response__free_unpacked(m, NULL);
        st_buf_free(&resp);
    }
}

/* Tablets each node must hold at least: the data splits into at least bytes / SPLIT_BYTES
 * tablets (halves are over half the threshold), so a fair share is half of that per node; 100,000
 * rows give about 60 tablets, 6 required per node. */
static size_t min_per_node(void) {
    size_t n = (size_t)g_rows * VALUE_BYTES / SPLIT_BYTES / NODES / 2;
    return n > MIN_TABLETS_PER_NODE ? n : MIN_TABLETS_PER_NODE;
}

static bool census_spread(const census *c) {
    size_t lo = c->count[0], hi = c->count[0];
    for (size_t i = 1; i < NODES; i++) {
        lo = c->count[i] < lo ? c->count[i] : lo;
        hi = c->count[i] > hi ? c->count[i] : hi;
    }
    return c->moving == 0 && lo >= min_per_node() && hi - lo <= 1;
}

/* Waits until the balancer has spread the tablets and nothing changed for a few polls. */
static void await_spread(const st_topology *t, census *c) {
    census prev = {0};
    int stable = 0;
    for (int poll = 0; poll < SETTLE_POLLS_MAX; poll++) {
        take_census(t, c);
        bool same = memcmp(c->count, prev.count, sizeof c->count) == 0;
        stable = census_spread(c) && same ? stable + 1 : 0;
        if (stable >= SETTLE_STABLE_POLLS)
            return;
        prev = *c;
        usleep(SETTLE_POLL_MS * 1000);
    }
    ci_fail("tablets not spread over all nodes: %zu / %zu / %zu tablets, %zu moving", c->count[0],
            c->count[1], c->count[2], c->moving);
}

/* ---- the checks after writing ---- */

static void check_full_scans(long *all, long *rev) {
    for (uint32_t i = 0; i < g_rows; i++) {
        all[i] = i;
        rev[i] = (long)g_rows - 1 - i;
    }
    bt_read_req fwd = {0}, back = {.reversed = true};
    int64_t t0 = ci_now_ms();
    expect_read("full scan", &fwd, all, g_rows);
    int64_t t1 = ci_now_ms();
    expect_read("reversed full scan", &back, rev, g_rows);
    printf("full scan: %u rows in %lld ms; reversed: %lld ms\n", g_rows, (long long)(t1 - t0),
           (long long)(ci_now_ms() - t1));
}

static void check_limits(const long *all, const long *rev) {
    const int64_t limits[] = {1,
                              2,
                              17,
                              999,
                              4321,
                              (int64_t)g_rows / 3 + 1,
                              (int64_t)g_rows - 1,
                              (int64_t)g_rows,
                              (int64_t)g_rows + 10};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        int64_t lim = limits[k] > 0 ? limits[k] : 1;
        size_t n = (size_t)(lim < (int64_t)g_rows ? lim : (int64_t)g_rows);
        char what[64];
        bt_read_req fwd = {.rows_limit = lim}, back = {.rows_limit = lim, .reversed = true};
        snprintf(what, sizeof what, "rows_limit %lld", (long long)lim);
        expect_read(what, &fwd, all, n);
        snprintf(what, sizeof what, "reversed rows_limit %lld", (long long)lim);
        expect_read(what, &back, rev, n);
    }
}

static int long_cmp(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* Random key sets: written keys, keys past the last row, keys between rows, repeats. */
static void check_key_sets(st_rng *rng) {
    long *want = malloc(KEYSET_KEYS_MAX * sizeof *want);
    for (int r = 0; r < KEYSET_READS; r++) {
        st_arena a;
        st_arena_init(&a, 4096);
        Google__Bigtable__V2__RowSet *rs = bt_rowset_new(&a);
        size_t n_keys = 1 + st_rng_below(rng, KEYSET_KEYS_MAX), n_want = 0;
        for (size_t k = 0; k < n_keys; k++) {
            uint32_t i = (uint32_t)st_rng_below(rng, g_rows + g_rows / 10 + 1);
            char key[KEY_MAX + 1];
            key_of(i, key);
            if (st_rng_below(rng, 8) == 0)
                strcat(key, "x"); /* between two rows: absent */
            else if (i < g_rows)
                want[n_want++] = i;
            bt_rowset_add_key(&a, rs, st_slice_cstr(key));
        }
        qsort(want, n_want, sizeof *want, long_cmp);
        size_t u = 0;
        for (size_t k = 0; k < n_want; k++)
            if (u == 0 || want[u - 1] != want[k])
                want[u++] = want[k];
        bool reversed = r % 3 == 2;
        if (reversed)
            for (size_t k = 0; k < u / 2; k++) {
                long tmp = want[k];
                want[k] = want[u - 1 - k];
                want[u - 1 - k] = tmp;
            }
        char what[64];
        snprintf(what, sizeof what, "key set %d (%zu keys%s)", r, n_keys,
                 reversed ? ", reversed" : "");
        bt_read_req req = {.rows = rs, .reversed = reversed};
        expect_read(what, &req, want, u);
        st_arena_deinit(&a);
    }
    free(want);
}

/* Random ranges [a, b) with random limits, both directions. */
static void check_ranges(st_rng *rng) {
    long *want = malloc(g_rows * sizeof *want);
    for (int r = 0; r < RANGE_READS; r++) {
        uint32_t x = (uint32_t)st_rng_below(rng, g_rows), y = (uint32_t)st_rng_below(rng, g_rows);
        uint32_t lo = x < y ? x : y, hi = x < y ? y : x;
        bool reversed = r % 2 == 1;
        int64_t lim = st_rng_below(rng, 3) == 0 ? 1 + (int64_t)st_rng_below(rng, 5000) : 0;
        size_t n = 0;
        for (uint32_t i = lo; i < hi; i++)
            want[n++] = reversed ? (long)(hi - 1 - (i - lo)) : (long)i;
        if (lim && (size_t)lim < n)
            n = (size_t)lim;
        char ka[KEY_MAX], kb[KEY_MAX];
        key_of(lo, ka);
        key_of(hi, kb);
        st_arena a;
        st_arena_init(&a, 1024);
        Google__Bigtable__V2__RowSet *rs = bt_rowset_new(&a);
        st_slice sa = st_slice_cstr(ka), sb = st_slice_cstr(kb);
        bt_rowset_add_range(&a, rs, &sa, true, &sb, false);
        char what[160];
        snprintf(what, sizeof what, "range [%s, %s) limit %lld%s", ka, kb, (long long)lim,
                 reversed ? " reversed" : "");
        bt_read_req req = {.rows = rs, .rows_limit = lim, .reversed = reversed};
        expect_read(what, &req, want, n);
        st_arena_deinit(&a);
    }
    free(want);
}

/* ---- main ---- */

static void start_instance(void) {
    char split_s[32];
    snprintf(split_s, sizeof split_s, "%d", SPLIT_BYTES);
    const char *extra[] = {"--split-bytes", split_s, NULL};
    ci_up_with(1, NODES, extra);
    if (ci_topo.n_clusters != 1 || ci_topo.clusters[0].n_nodes != NODES)
        ci_fail("unexpected topology shape");
    bt_client_init(&g_cl, ci_router);
    printf("instance %s: router %s, %d nodes, split threshold %d bytes\n", ci_dir, ci_router, NODES,
           SPLIT_BYTES);
}

int main(int argc, char **argv) {
    int skip = ci_init("tablets_test", argc, argv);
    if (skip)
        return skip;
    const char *rows_env = getenv("STRATA_TABLETS_ROWS");
    g_rows = rows_env && atol(rows_env) > 0 ? (uint32_t)atol(rows_env) : ROWS_DEFAULT;
    st_rng rng;
    st_rng_seed(&rng, st_test_seed("tablets_test"));

    start_instance();
    st_err st = {0};
    if (bt_create_table(&g_cl, g_table, "cf:maxversions=1", &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);

    uint32_t *perm = malloc(g_rows * sizeof *perm);
    long *all = malloc(g_rows * sizeof *all), *rev = malloc(g_rows * sizeof *rev);
    if (!perm || !all || !rev)
        abort();
    for (uint32_t i = 0; i < g_rows; i++)
        perm[i] = i;
    for (uint32_t i = g_rows - 1; i > 0; i--) {
        uint32_t j = (uint32_t)st_rng_below(&rng, i + 1);
        uint32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }

    reader rd = {.perm = perm};
    if (pthread_create(&rd.th, NULL, reader_main, &rd) != 0)
        ci_fail("could not start the reader thread");
    int64_t t0 = ci_now_ms();
    write_rows(perm, &rd);
    int64_t t_write = ci_now_ms() - t0;
    uint64_t scans_during_writes = __atomic_load_n(&rd.scans, __ATOMIC_RELAXED);
    printf("wrote %u rows (%d-byte values, MutateRows of %d) in %lld ms (%.0f rows/s); "
           "meanwhile %" PRIu64 " concurrent full scans, %zu splits, %zu moves\n",
           g_rows, VALUE_BYTES, BATCH_ROWS, (long long)t_write,
           g_rows * 1000.0 / (double)(t_write + 1), scans_during_writes, splits_done(),
           moves_done());

    /* The reader goes on while the nodes finish splitting and the balancer moves tablets. */
    census c;
    int64_t t1 = ci_now_ms();
    await_spread(&ci_topo, &c);
    rd.stop = 1;
    pthread_join(rd.th, NULL);
    if (rd.error[0])
        ci_fail("concurrent reader: %s", rd.error);
    printf("tablets spread after %lld ms more: node1 %zu (%.1f MiB), node2 %zu (%.1f MiB), node3 "
           "%zu (%.1f MiB); %zu splits, %zu moves; %" PRIu64 " concurrent full scans in all, "
           "all ordered and complete\n",
           (long long)(ci_now_ms() - t1), c.count[0], c.bytes[0] / 1048576.0, c.count[1],
           c.bytes[1] / 1048576.0, c.count[2], c.bytes[2] / 1048576.0, splits_done(), moves_done(),
           rd.scans);

    int64_t t2 = ci_now_ms();
    check_full_scans(all, rev);
    check_limits(all, rev);
    check_key_sets(&rng);
    check_ranges(&rng);
    printf("reads after the spread: full, reversed, %d row limits x 2, %d key sets, %d ranges: "
           "exact (%lld ms)\n",
           9, KEYSET_READS, RANGE_READS, (long long)(ci_now_ms() - t2));
    free(perm);
    free(all);
    free(rev);
    ci_down();
    printf("tablets_test: OK\n");
    return 0;
}
