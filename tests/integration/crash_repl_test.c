/*
 * Proves that no acknowledged write is lost in any cluster when nodes of either side are killed
 * with SIGKILL under write load and restarted: `strata up --clusters 2 --nodes 2` (table split
 * in two, so each cluster's tablets sit on both its nodes); one writer thread through a
 * single-cluster app profile on east and one on west write unique rows continuously, each
 * remembering only the writes the router acknowledged. Under that load:
 *   1. `strata chaos kill-cluster west` (kill -9 of both west nodes): east keeps taking writes,
 *      west's writer sees errors (its profile has no other cluster);
 *   2. `strata chaos restart-cluster west`: west takes writes again;
 *   3. kill -9 of one east node (its pid file), more writes on both sides (east's rows on the
 *      other node still succeed), then `strata chaos restart-cluster east` restarts just it.
 * Then the writers stop, GenerateConsistencyToken / CheckConsistency through the router wait for
 * replication, and every acknowledged row, with its value, must be read back through EACH
 * cluster's profile. Figures (acknowledged / failed writes per side and phase) are printed; only
 * the absence of losses is asserted.
 *
 *   crash_repl_test <build>/ops/strata
 * STRATA_CRASH_WRITES_PER_PHASE: acknowledged writes awaited per phase (fewer under sanitizers).
 * Exit 77 when strata, strata-node or strata-router is missing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chaos_util.h"

#define PER_PHASE_DEFAULT 1000
#define WRITES_MAX 10000000         /* bound of one writer's attempts (a hang guard) */
#define CONSISTENCY_CHECKS_MAX 3000 /* 100 ms apart: a hang guard, not a timing assertion */
#define PROGRESS_POLLS_MAX 30000    /* 20 ms apart: a hang guard */
#define EAST_DOWN_ATTEMPTS 40       /* east writes tried while east-1 is down */
#define TABLE "crash"

typedef struct writer {
    char side; /* 'e' or 'w' */
    pthread_t th;
    int stop;
    long attempts, acked, failed; /* atomics */
    long *acks;                   /* indexes of acknowledged writes, in order */
    long cap;
    char first_error[ST_ERR_MSG_MAX + 64];
} writer;

/* Row i of a side: a spread first letter so the rows fall on both tablets ("n" splits). */
static void key_of(char side, long i, char out[32]) {
    snprintf(out, 32, "%c-%c%07ld", 'a' + (int)(i * 7 % 26), side, i);
}

static void value_of(char side, long i, char out[32]) {
    snprintf(out, 32, "v%c%ld", side, i);
}

static void *writer_main(void *arg) {
    writer *w = arg;
    bt_client c;
    ci_client(&c, w->side == 'e' ? "oneast" : "onwest");
    c.timeout_ms = 20000;
    bt_muts m;
    bt_muts_init(&m);
    struct timespec nap = {0, 20 * 1000000L};
    for (long i = 0; i < WRITES_MAX && !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE); i++) {
        char key[32], val[32];
        key_of(w->side, i, key);
        value_of(w->side, i, val);
        bt_muts_reset(&m);
        bt_muts_set(&m, "cf", st_slice_cstr("c"), -1, st_slice_cstr(val));
        st_err st = {0};
        st_code rc = bt_mutate_row(&c, TABLE, st_slice_cstr(key), &m, &st);
        if (rc == ST_OK) {
            if (w->acked == w->cap) {
                w->cap = w->cap ? 2 * w->cap : 4096;
                if (!(w->acks = realloc(w->acks, (size_t)w->cap * sizeof *w->acks)))
                    abort();
            }
            w->acks[w->acked] = i;
            __atomic_store_n(&w->acked, w->acked + 1, __ATOMIC_RELEASE);
        } else {
            if (__atomic_fetch_add(&w->failed, 1, __ATOMIC_ACQ_REL) == 0)
                snprintf(w->first_error, sizeof w->first_error, "%s: %s", st_code_name(rc), st.msg);
            nanosleep(&nap, NULL); /* a dead cluster answers at once: do not spin */
        }
        __atomic_store_n(&w->attempts, i + 1, __ATOMIC_RELEASE);
    }
    bt_muts_deinit(&m);
    return NULL;
}

static long load(const long *v) {
    return __atomic_load_n(v, __ATOMIC_ACQUIRE);
}

/* Waits until writer w has `more` acknowledged writes (acked=true) or attempts beyond *mark. */
static void await(writer *w, bool acked, long more, const char *what) {
    const long *v = acked ? &w->acked : &w->attempts;
    long goal = load(v) + more;
    struct timespec nap = {0, 20 * 1000000L};
    for (int i = 0; load(v) < goal; i++) {
        if (i == PROGRESS_POLLS_MAX)
            ci_fail("gave up waiting for %s (%ld of %ld)", what, load(v), goal);
        nanosleep(&nap, NULL);
    }
}

static void phase_line(const char *phase, writer *w, long *last_ok, long *last_fail) {
    printf("%-34s east +%ld acked +%ld failed, west +%ld acked +%ld failed\n", phase,
           load(&w[0].acked) - last_ok[0], load(&w[0].failed) - last_fail[0],
           load(&w[1].acked) - last_ok[1], load(&w[1].failed) - last_fail[1]);
    for (int k = 0; k < 2; k++) {
        last_ok[k] = load(&w[k].acked);
        last_fail[k] = load(&w[k].failed);
    }
}

static void kill_node(const char *name) {
    char path[BT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/run/%s.pid", ci_dir, name);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (!f || fscanf(f, "%ld", &pid) != 1 || pid <= 0)
        ci_fail("no pid file for %s", name);
    fclose(f);
    if (kill((pid_t)pid, SIGKILL) != 0)
        ci_fail("kill -9 %s (pid %ld) failed", name, pid);
    printf("killed %s (pid %ld) with SIGKILL\n", name, pid);
}

/* ---- verification ---- */

typedef struct seen {
    unsigned char *ok[2]; /* [side][i]: row present with its value */
    long n[2];
    long bad;
} seen;

static void seen_row(const bt_row *row, void *arg) {
    seen *s = arg;
    char key[40];
    if (row->key.len >= sizeof key)
        return;
    memcpy(key, row->key.data, row->key.len);
    key[row->key.len] = '\0';
    char side;
    long i;
    if (sscanf(key + 2, "%c%ld", &side, &i) != 2 || (side != 'e' && side != 'w'))
        return;
    int k = side == 'w';
    char want[32];
    value_of(side, i, want);
    if (i < 0 || i >= s->n[k])
        return; /* a write that failed for its client may still have happened */
    bool good = row->n_cells == 1 && row->cells[0].value.len == strlen(want) &&
                memcmp(row->cells[0].value.data, want, strlen(want)) == 0;
    s->ok[k][i] = good;
    s->bad += !good;
}

/* Every acknowledged write of both writers, read back through profile. */
static void verify_cluster(const char *profile, writer *w) {
    seen s = {0};
    for (int k = 0; k < 2; k++) {
        s.n[k] = load(&w[k].attempts) + 1;
        if (!(s.ok[k] = calloc((size_t)s.n[k], 1)))
            abort();
    }
    bt_client c;
    ci_client(&c, profile);
    bt_read_req req = {0};
    st_err st = {0};
    if (bt_read_rows(&c, TABLE, &req, seen_row, &s, &st) != ST_OK)
        ci_fail("full read through %s: %s", profile, st.msg);
    if (s.bad)
        ci_fail("%ld rows with a wrong value through %s", s.bad, profile);
    long missing = 0, checked = 0;
    for (int k = 0; k < 2; k++)
        for (long j = 0; j < w[k].acked; j++, checked++)
            if (!s.ok[k][w[k].acks[j]]) {
                char key[32];
                key_of(w[k].side, w[k].acks[j], key);
                if (missing++ < 5)
                    fprintf(stderr, "acknowledged row %s is missing through %s\n", key, profile);
            }
    for (int k = 0; k < 2; k++)
        free(s.ok[k]);
    if (missing)
        ci_fail("%ld of %ld acknowledged writes missing through %s", missing, checked, profile);
    printf("%s: all %ld acknowledged writes present with their values\n", profile, checked);
}

static void create_schema(void) {
    bt_client admin;
    ci_client(&admin, "");
    st_err st = {0};
    const char *splits[] = {"n", NULL};
    if (bt_create_table_split(&admin, TABLE, "cf", splits, &st) != ST_OK)
        ci_fail("CreateTable: %s", st.msg);
    if (bt_create_app_profile(&admin, "oneast", "east", &st) != ST_OK ||
        bt_create_app_profile(&admin, "onwest", "west", &st) != ST_OK)
        ci_fail("CreateAppProfile: %s", st.msg);
}

int main(int argc, char **argv) {
    int rc = ci_init("crash_repl_test", argc, argv);
    if (rc)
        return rc;
    long n = ci_env_long("STRATA_CRASH_WRITES_PER_PHASE", PER_PHASE_DEFAULT);
    ci_up(2, 2);
    create_schema();
    writer w[2] = {{.side = 'e'}, {.side = 'w'}};
    long ok[2] = {0}, bad[2] = {0};
    for (int k = 0; k < 2; k++)
        if (pthread_create(&w[k].th, NULL, writer_main, &w[k]) != 0)
            ci_fail("cannot start a writer thread");
    await(&w[0], true, n, "east writes");
    await(&w[1], true, n, "west writes");
    phase_line("both clusters up:", w, ok, bad);

    const char *kill_west[] = {"chaos", "kill-cluster", "west", "--dir", ci_dir, NULL};
    ci_strata_ok(kill_west);
    await(&w[0], true, n, "east writes while west is down");
    phase_line("west killed (kill -9):", w, ok, bad);
    const char *restart_west[] = {"chaos", "restart-cluster", "west", "--dir", ci_dir, NULL};
    ci_strata_ok(restart_west);
    await(&w[1], true, n, "west writes after its restart");
    await(&w[0], true, n / 2, "east writes after west's restart");
    phase_line("west restarted:", w, ok, bad);

    kill_node("east-1");
    /* Writes to east-1's rows fail only after the router's retries (about a second each):
     * a few dozen attempts, half of them on east-0's rows, which must keep succeeding. */
    await(&w[0], false, EAST_DOWN_ATTEMPTS, "east write attempts with east-1 down");
    await(&w[1], true, n / 2, "west writes with east-1 down");
    phase_line("east-1 killed (kill -9):", w, ok, bad);
    const char *restart_east[] = {"chaos", "restart-cluster", "east", "--dir", ci_dir, NULL};
    ci_strata_ok(restart_east);
    await(&w[0], true, n, "east writes after east-1's restart");
    await(&w[1], true, n / 2, "west writes after east-1's restart");
    phase_line("east-1 restarted:", w, ok, bad);

    for (int k = 0; k < 2; k++) {
        __atomic_store_n(&w[k].stop, 1, __ATOMIC_RELEASE);
        pthread_join(w[k].th, NULL);
    }
    printf("in all: east %ld acked / %ld failed, west %ld acked / %ld failed (first errors: "
           "east \"%s\", west \"%s\")\n",
           w[0].acked, w[0].failed, w[1].acked, w[1].failed, w[0].first_error, w[1].first_error);

    bt_client dflt;
    ci_client(&dflt, "");
    st_err st = {0};
    int checks = 0;
    long long t0 = ci_now_ms();
    if (bt_wait_consistent(&dflt, TABLE, CONSISTENCY_CHECKS_MAX, &checks, &st) != ST_OK)
        ci_fail("waiting for replication: %s", st.msg);
    printf("consistent after %d CheckConsistency calls (%lld ms)\n", checks, ci_now_ms() - t0);
    verify_cluster("oneast", w);
    verify_cluster("onwest", w);
    for (int k = 0; k < 2; k++)
        free(w[k].acks);
    ci_down();
    printf("crash_repl_test: OK\n");
    return 0;
}
