/*
 * Proves that two clusters converge to byte-identical contents under conflicting writes and a
 * replication partition: `strata up --clusters 2 --nodes 2` (table split in two, so each
 * cluster's tablets sit on both its nodes); two writer threads, one through a single-cluster app
 * profile on east and one on west, send thousands of random mutations to the SAME few rows and
 * columns at once — SetCell at explicit timestamps (the same cells written with different values
 * on both sides) and at server time, DeleteFromColumn with and without time ranges,
 * DeleteFromFamily, DeleteFromRow, several per request, some as MutateRows batches. A third of
 * the way in, `strata chaos partition east west` cuts replication (a row written on east then
 * stays absent on west: checked after CheckConsistency has said "not consistent"); two thirds in,
 * `strata chaos heal`. After the writers stop, GenerateConsistencyToken / CheckConsistency
 * through the router wait for replication (what `cbt waitforreplication` does), and the whole
 * table read through each cluster's profile, dumped as canonical text with timestamps
 * (bt_dump_row), must be byte-identical. No client request may fail. Figures are printed.
 *
 *   convergence_test <build>/ops/strata
 * STRATA_CONVERGENCE_OPS: requests per writer (CTest sets fewer under sanitizers); STRATA_SEED.
 * Exit 77 when strata, strata-node or strata-router is missing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chaos_util.h"

#define OPS_DEFAULT 3000
#define ROWS 12 /* few rows and columns: nearly every request conflicts with the other side */
#define QUALS 3
#define TS_SLOTS 12                 /* explicit timestamps 1..TS_SLOTS ms */
#define MUTS_MAX 3                  /* mutations per request */
#define BATCH_ROWS 4                /* entries of a MutateRows request */
#define CONSISTENCY_CHECKS_MAX 3000 /* 100 ms apart: a hang guard, not a timing assertion */
#define TABLE "conv"

typedef struct writer {
    const char *side; /* "east" or "west": the profile and the values' prefix */
    long ops;
    uint64_t seed;
    pthread_t th;
    long done;   /* requests answered (atomic) */
    long failed; /* requests that did not succeed */
    long muts;   /* mutations sent */
    char error[ST_ERR_MSG_MAX + 96];
} writer;

static void row_key(st_rng *r, char out[16]) {
    snprintf(out, 16, "r%02u", (unsigned)st_rng_below(r, ROWS));
}

/* One random mutation; the values name the side and request so conflicts are visible. */
static void random_mutation(st_rng *r, bt_muts *m, const char *side, long i, int k) {
    char q[8], v[48];
    snprintf(q, sizeof q, "q%u", (unsigned)st_rng_below(r, QUALS));
    const char *fam = st_rng_below(r, 2) ? "cf1" : "cf2";
    snprintf(v, sizeof v, "%s-%ld-%d", side, i, k);
    uint64_t p = st_rng_below(r, 100);
    int64_t a = (int64_t)(1 + st_rng_below(r, TS_SLOTS)) * 1000;
    if (p < 45) {
        bt_muts_set(m, fam, st_slice_cstr(q), a, st_slice_cstr(v));
    } else if (p < 65) {
        bt_muts_set(m, fam, st_slice_cstr(q), -1, st_slice_cstr(v));
    } else if (p < 80) { /* [a, b) or [a, infinity) */
        int64_t b = st_rng_below(r, 4) ? a + (int64_t)(1 + st_rng_below(r, 4)) * 1000 : 0;
        bt_muts_del_column(m, fam, st_slice_cstr(q), a, b);
    } else if (p < 88) {
        bt_muts_del_column(m, fam, st_slice_cstr(q), 0, 0);
    } else if (p < 95) {
        bt_muts_del_family(m, fam);
    } else {
        bt_muts_del_row(m);
    }
}

static void random_muts(st_rng *r, bt_muts *m, const char *side, long i) {
    bt_muts_reset(m);
    int n = 1 + (int)st_rng_below(r, MUTS_MAX);
    for (int k = 0; k < n; k++)
        random_mutation(r, m, side, i, k);
}

static void *writer_main(void *arg) {
    writer *w = arg;
    bt_client c;
    ci_client(&c, w->side[0] == 'e' ? "oneast" : "onwest");
    st_rng r;
    st_rng_seed(&r, w->seed);
    bt_muts m[BATCH_ROWS];
    for (int k = 0; k < BATCH_ROWS; k++)
        bt_muts_init(&m[k]);
    for (long i = 0; i < w->ops; i++) {
        st_err st = {0};
        st_code rc;
        if (i % 10 == 9) { /* a MutateRows batch now and then */
            char keys[BATCH_ROWS][16];
            bt_entry e[BATCH_ROWS];
            st_code codes[BATCH_ROWS];
            for (int k = 0; k < BATCH_ROWS; k++) {
                row_key(&r, keys[k]);
                random_muts(&r, &m[k], w->side, i);
                e[k] = (bt_entry){st_slice_cstr(keys[k]), &m[k]};
                w->muts += (long)m[k].n;
            }
            rc = bt_mutate_rows(&c, TABLE, e, BATCH_ROWS, codes, NULL, &st);
            for (int k = 0; rc == ST_OK && k < BATCH_ROWS; k++)
                if (codes[k] != ST_OK)
                    rc = st_err_set(&st, codes[k], "MutateRows entry %d failed", k);
        } else {
            char key[16];
            row_key(&r, key);
            random_muts(&r, &m[0], w->side, i);
            w->muts += (long)m[0].n;
            rc = bt_mutate_row(&c, TABLE, st_slice_cstr(key), &m[0], &st);
        }
        if (rc != ST_OK && w->failed++ == 0)
            snprintf(w->error, sizeof w->error, "request %ld: %s: %.*s", i, st_code_name(rc),
                     (int)ST_ERR_MSG_MAX, st.msg);
        __atomic_store_n(&w->done, i + 1, __ATOMIC_RELEASE);
    }
    for (int k = 0; k < BATCH_ROWS; k++)
        bt_muts_deinit(&m[k]);
    return NULL;
}

static void wait_progress(writer *w, long at) {
    struct timespec nap = {0, 20 * 1000000L};
    while (__atomic_load_n(&w[0].done, __ATOMIC_ACQUIRE) < at ||
           __atomic_load_n(&w[1].done, __ATOMIC_ACQUIRE) < at)
        nanosleep(&nap, NULL);
}

static bool row_present(const bt_client *c, const char *key) {
    st_arena a;
    st_arena_init(&a, 4096);
    Google__Bigtable__V2__RowSet *rs = bt_rowset_new(&a);
    bt_rowset_add_key(&a, rs, st_slice_cstr(key));
    bt_read_req req = {.rows = rs};
    st_buf dump;
    st_buf_init(&dump);
    size_t n = 0;
    st_err st = {0};
    st_code rc = bt_read_dump(c, TABLE, &req, &dump, &n, &st);
    st_buf_free(&dump);
    st_arena_deinit(&a);
    if (rc != ST_OK)
        ci_fail("reading %s: %s: %s", key, st_code_name(rc), st.msg);
    return n > 0;
}

/* While partitioned: a row written on east must not reach west. CheckConsistency answering
 * "not consistent" a few times first gives replication every chance it would have had. */
static void check_partition_holds(const bt_client *east, const bt_client *west) {
    bt_muts m;
    bt_muts_init(&m);
    bt_muts_set(&m, "cf1", st_slice_cstr("p"), -1, st_slice_cstr("written-while-partitioned"));
    st_err st = {0};
    if (bt_mutate_row(east, TABLE, st_slice_cstr("probe"), &m, &st) != ST_OK)
        ci_fail("probe write on east: %s", st.msg);
    bt_muts_deinit(&m);
    bt_client dflt;
    ci_client(&dflt, "");
    int checks = 0;
    st_code rc = bt_wait_consistent(&dflt, TABLE, 5, &checks, &st);
    if (rc != ST_DEADLINE_EXCEEDED)
        ci_fail("CheckConsistency during the partition: %s (%s), want not consistent",
                st_code_name(rc), st.msg);
    if (row_present(west, "probe"))
        ci_fail("a row written on east reached west through the partition");
    printf("partition holds: CheckConsistency not consistent after %d checks, the probe row "
           "written on east is absent on west\n",
           checks);
}

static void create_schema(void) {
    bt_client admin;
    ci_client(&admin, "");
    st_err st = {0};
    const char *splits[] = {"r06", NULL};
    if (bt_create_table_split(&admin, TABLE, "cf1,cf2", splits, &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);
    if (bt_create_app_profile(&admin, "oneast", "east", &st) != ST_OK ||
        bt_create_app_profile(&admin, "onwest", "west", &st) != ST_OK)
        ci_fail("CreateAppProfile: %s", st.msg);
}

static void dump_cluster(const char *profile, st_buf *out, size_t *rows) {
    bt_client c;
    ci_client(&c, profile);
    bt_read_req req = {0};
    st_err st = {0};
    st_buf_reset(out);
    if (bt_read_dump(&c, TABLE, &req, out, rows, &st) != ST_OK)
        ci_fail("full read through %s: %s", profile, st.msg);
}

static size_t count_lines(const st_buf *b) {
    size_t n = 0;
    for (size_t i = 0; i < b->len; i++)
        n += b->data[i] == '\n';
    return n;
}

/* The first line where the dumps differ, for the failure message. */
static void first_difference(const st_buf *a, const st_buf *b) {
    size_t i = 0, line = 1, start = 0;
    while (i < a->len && i < b->len && a->data[i] == b->data[i]) {
        if (a->data[i] == '\n') {
            line++;
            start = i + 1;
        }
        i++;
    }
    const char *ea = memchr(a->data + start, '\n', a->len - start);
    const char *eb = memchr(b->data + start, '\n', b->len - start);
    int la = ea ? (int)(ea - (char *)a->data - (long)start) : (int)(a->len - start);
    int lb = eb ? (int)(eb - (char *)b->data - (long)start) : (int)(b->len - start);
    fprintf(stderr, "first difference at line %zu:\n  east: %.*s\n  west: %.*s\n", line, la,
            (const char *)a->data + start, lb, (const char *)b->data + start);
}

int main(int argc, char **argv) {
    int rc = ci_init("convergence_test", argc, argv);
    if (rc)
        return rc;
    long ops = ci_env_long("STRATA_CONVERGENCE_OPS", OPS_DEFAULT);
    uint64_t seed = st_test_seed("convergence_test");
    ci_up(2, 2);
    create_schema();
    bt_client east, west;
    ci_client(&east, "oneast");
    ci_client(&west, "onwest");

    writer w[2] = {{.side = "east", .ops = ops, .seed = seed * 2 + 1},
                   {.side = "west", .ops = ops, .seed = seed * 2 + 2}};
    long long t0 = ci_now_ms();
    for (int i = 0; i < 2; i++)
        if (pthread_create(&w[i].th, NULL, writer_main, &w[i]) != 0)
            ci_fail("cannot start a writer thread");
    wait_progress(w, ops / 3);
    const char *part[] = {"chaos", "partition", "east", "west", "--dir", ci_dir, NULL};
    ci_strata_ok(part);
    check_partition_holds(&east, &west);
    wait_progress(w, 2 * ops / 3);
    const char *heal[] = {"chaos", "heal", "--dir", ci_dir, NULL};
    ci_strata_ok(heal);
    for (int i = 0; i < 2; i++)
        pthread_join(w[i].th, NULL);
    long long t_write = ci_now_ms() - t0;
    for (int i = 0; i < 2; i++)
        if (w[i].failed)
            ci_fail("%ld of %ld requests through %s failed; first: %s", w[i].failed, ops, w[i].side,
                    w[i].error);
    printf("writers: %ld requests each (%ld + %ld mutations) on %d rows x 2 families x %d "
           "columns, in %lld ms, none failed\n",
           ops, w[0].muts, w[1].muts, ROWS, QUALS, t_write);

    bt_client dflt;
    ci_client(&dflt, "");
    st_err st = {0};
    int checks = 0;
    long long t1 = ci_now_ms();
    if (bt_wait_consistent(&dflt, TABLE, CONSISTENCY_CHECKS_MAX, &checks, &st) != ST_OK)
        ci_fail("waiting for replication: %s", st.msg);
    printf("consistent after %d CheckConsistency calls (%lld ms)\n", checks, ci_now_ms() - t1);
    if (!row_present(&west, "probe"))
        ci_fail("the probe row written on east during the partition never reached west");

    st_buf de, dw;
    st_buf_init(&de);
    st_buf_init(&dw);
    size_t re = 0, rw = 0;
    dump_cluster("oneast", &de, &re);
    dump_cluster("onwest", &dw, &rw);
    printf("east: %zu rows, %zu cells, %zu dump bytes; west: %zu rows, %zu cells, %zu dump "
           "bytes\n",
           re, count_lines(&de), de.len, rw, count_lines(&dw), dw.len);
    if (de.len != dw.len || memcmp(de.data, dw.data, de.len) != 0) {
        first_difference(&de, &dw);
        ci_fail("the clusters differ after replication caught up (seed %" PRIu64 ")", seed);
    }
    if (count_lines(&de) < 10)
        ci_fail("only %zu cells survived: the workload tests too little", count_lines(&de));
    st_buf_free(&de);
    st_buf_free(&dw);
    ci_down();
    printf("convergence_test: OK (east and west byte-identical)\n");
    return 0;
}
