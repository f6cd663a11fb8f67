/*
 * Proves no acknowledged write is lost and no row mutation is half applied across kill -9: a
 * forked child opens the engine (recovering from the previous crash), runs several writer
 * threads and occasional tablet splits, and reports each acknowledged write over a pipe; the
 * parent kills it at a random moment, reopens the engine and checks every row. Each row mutation
 * is DeleteRow + four SetCells sharing one marker (its sequence number, also its version), so a
 * row shows exactly four cells of one marker, never older than the newest acknowledged one.
 * Real files, real fdatasync. STRATA_SEED replays the kill timing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "sto_test_util.h"

#define ITERATIONS 30
#define N_ROWS 64
#define CHILD_WRITERS 4
#define SEQ_STRIDE 10000000ull /* sequence numbers of iteration i start at base + i * stride */

typedef struct ack {
    uint32_t row; /* UINT32_MAX: the child is ready */
    uint64_t seq;
} ack;

static void row_name(char *out, size_t cap, int row) {
    snprintf(out, cap, "row%03d", row);
}

/* ---- the child ---- */

typedef struct child {
    sto_db *db;
    int fd;
    atomic_uint_fast64_t seq;
    uint64_t seed;
    int idx;
} child;

typedef struct route_arg {
    st_slice row;
    uint64_t id;
    bool found;
} route_arg;

static void route_fn(const sto_tablet_info *in, void *arg) {
    route_arg *r = arg;
    if (st_slice_cmp(r->row, in->start) >= 0 &&
        (!in->end.len || st_slice_cmp(r->row, in->end) < 0)) {
        r->id = in->id;
        r->found = true;
    }
}

static uint64_t route(sto_db *db, const char *row) {
    route_arg r = {st_slice_cstr(row), 0, false};
    sto_tablet_list(db, route_fn, &r);
    return r.id;
}

static void write_row(child *c, int row) {
    char name[16], marker[32];
    row_name(name, sizeof name, row);
    uint64_t seq = atomic_fetch_add(&c->seq, 1);
    snprintf(marker, sizeof marker, "%llu", (unsigned long long)seq);
    sto_mut m[5] = {{.type = STO_MUT_DEL_ROW}};
    static const char *const quals[4] = {"q0", "q1", "q2", "q3"};
    for (int i = 0; i < 4; i++)
        m[i + 1] = tu_set_mut("f", quals[i], (int64_t)seq, marker);
    for (;;) {
        sto_row_mut r = tu_row(route(c->db, name), name, m, 5, STO_VERSION(seq, 0));
        st_err err;
        st_code rc = sto_write(c->db, &r, 1, NULL, &err);
        if (rc == ST_NOT_FOUND || rc == ST_OUT_OF_RANGE)
            continue; /* a split moved the row */
        if (rc != ST_OK) {
            fprintf(stderr, "child write: %s\n", err.msg);
            _exit(3);
        }
        break;
    }
    ack a = {(uint32_t)row, seq};
    if (write(c->fd, &a, sizeof a) != (ssize_t)sizeof a)
        _exit(4);
}

static void *child_writer(void *arg) {
    child *c = arg;
    st_rng rng;
    st_rng_seed(&rng, c->seed);
    for (;;)
        write_row(c, (int)st_rng_below(&rng, N_ROWS));
    return NULL;
}

typedef struct split_pick {
    uint64_t id;
    char start[16], end[16];
    int n;
} split_pick;

static void pick_fn(const sto_tablet_info *in, void *arg) {
    split_pick *p = arg;
    if (p->n++ == 0 || in->id % 3 == 0) {
        p->id = in->id;
        snprintf(p->start, sizeof p->start, "%.*s", (int)in->start.len,
                 (const char *)in->start.data);
        snprintf(p->end, sizeof p->end, "%.*s", (int)in->end.len, (const char *)in->end.data);
    }
}

/* Splits one tablet at a row strictly inside it, now and then. */
static void child_split(child *c, st_rng *rng, uint64_t new_id) {
    split_pick p = {0, "", "", 0};
    sto_tablet_list(c->db, pick_fn, &p);
    char row[16];
    row_name(row, sizeof row, (int)st_rng_below(rng, N_ROWS));
    if (strcmp(row, p.start) <= 0 || (p.end[0] && strcmp(row, p.end) >= 0))
        return;
    st_err err;
    st_code rc = sto_tablet_split(c->db, p.id, st_slice_cstr(row), new_id, new_id + 1, &err);
    if (rc != ST_OK) {
        fprintf(stderr, "child split: %s\n", err.msg);
        _exit(5);
    }
}

/* Sequence numbers double as commit timestamps (versions), so they must look recent: versions
 * older than tombstone_grace_us let a full compaction drop row deletes. */
static uint64_t seq_base;

static void child_main(const char *dir, int fd, int iter, uint64_t seed) {
    sto_options o;
    tu_small_options(&o);
    st_err err;
    sto_db *db;
    if (sto_db_open(dir, &o, &db, &err) != ST_OK) {
        fprintf(stderr, "child open: %s\n", err.msg);
        _exit(2);
    }
    ack ready = {UINT32_MAX, 0};
    if (write(fd, &ready, sizeof ready) != (ssize_t)sizeof ready)
        _exit(4);
    static child cs[CHILD_WRITERS];
    pthread_t th[CHILD_WRITERS];
    uint64_t base = seq_base + (uint64_t)iter * SEQ_STRIDE;
    for (int i = 0; i < CHILD_WRITERS; i++) {
        cs[i].db = db;
        cs[i].fd = fd;
        atomic_init(&cs[i].seq, base + (uint64_t)i * (SEQ_STRIDE / CHILD_WRITERS));
        cs[i].seed = seed + (uint64_t)i;
        cs[i].idx = i;
        pthread_create(&th[i], NULL, child_writer, &cs[i]);
    }
    st_rng rng;
    st_rng_seed(&rng, seed ^ 0x5a5a);
    for (int k = 0;; k++) {
        usleep(20000);
        if (st_rng_below(&rng, 3) == 0)
            child_split(&cs[0], &rng, (uint64_t)(iter + 1) * 1000 + (uint64_t)k * 2);
    }
}

/* ---- the parent ---- */

typedef struct row_seen {
    int cells;
    uint64_t marker;
    bool mixed;
} row_seen;

typedef struct tablet_ids {
    uint64_t id[512];
    int n;
} tablet_ids;

static void ids_fn(const sto_tablet_info *in, void *arg) {
    tablet_ids *t = arg;
    if (getenv("CRASH_VERBOSE"))
        fprintf(stderr, "tablet %llu [%.*s, %.*s) ssts=%d flushed=%llu\n",
                (unsigned long long)in->id, (int)in->start.len, (const char *)in->start.data,
                (int)in->end.len, (const char *)in->end.data, in->sst_count,
                (unsigned long long)in->flushed_lsn);
    if (t->n < 512)
        t->id[t->n++] = in->id;
}

/* Parses "rowNNN f:qK@TS=MARKER" lines of every tablet into seen[]. */
static void collect(sto_db *db, row_seen *seen) {
    memset(seen, 0, N_ROWS * sizeof *seen);
    tablet_ids ids = {{0}, 0};
    sto_tablet_list(db, ids_fn, &ids);
    st_buf d;
    st_buf_init(&d);
    for (int i = 0; i < ids.n; i++) {
        assert_int_equal(tu_dump(db, ids.id[i], &d), ST_OK);
        for (char *p = (char *)d.data; *p; p = strchr(p, '\n') + 1) {
            int row;
            unsigned long long ts, marker;
            assert_int_equal(sscanf(p, "row%d f:q%*d@%llu=%llu", &row, &ts, &marker), 3);
            assert_true(row >= 0 && row < N_ROWS);
            row_seen *r = &seen[row];
            if (r->cells && r->marker != marker)
                r->mixed = true;
            r->marker = marker;
            r->cells++;
        }
    }
    st_buf_free(&d);
}

/* Reads acks until the child is killed (EOF on the pipe). */
static uint64_t n_acks;

static void read_acks(int fd, uint64_t *acked) {
    ack a;
    ssize_t n;
    while ((n = read(fd, &a, sizeof a)) == (ssize_t)sizeof a && ++n_acks)
        if (a.row < N_ROWS && a.seq > acked[a.row])
            acked[a.row] = a.seq;
}

static void wait_ready(int fd) {
    ack a;
    ssize_t n = read(fd, &a, sizeof a);
    assert_int_equal(n, (ssize_t)sizeof a);
    assert_int_equal(a.row, UINT32_MAX);
}

static void one_crash(const char *dir, int iter, st_rng *rng, uint64_t *acked) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    uint64_t seed = st_rng_next(rng);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_main(dir, p[1], iter, seed);
        _exit(0);
    }
    close(p[1]);
    wait_ready(p[0]);
    usleep((useconds_t)(5000 + st_rng_below(rng, 150000)));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status)); /* not an early exit on an error */
    read_acks(p[0], acked);
    close(p[0]);
}

static void test_crash_kill9_loses_nothing_acknowledged(void **state) {
    (void)state;
    uint64_t seed = st_test_seed("crash_test");
    seq_base = (uint64_t)st_wall_us();
    st_rng rng;
    st_rng_seed(&rng, seed);
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "crash_test");
    sto_options o;
    tu_small_options(&o);
    sto_db *db;
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, &db, &err), ST_OK);
    assert_int_equal(
        sto_tablet_create(db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL, &err),
        ST_OK);
    sto_db_close(db);
    uint64_t acked[N_ROWS] = {0};
    row_seen seen[N_ROWS];
    uint64_t total_acked = 0;
    for (int iter = 0; iter < ITERATIONS; iter++) {
        one_crash(dir, iter, &rng, acked);
        st_code rc = sto_db_open(dir, &o, &db, &err);
        if (rc != ST_OK)
            fprintf(stderr, "reopen after crash %d: %s\n", iter, err.msg);
        assert_int_equal(rc, ST_OK);
        collect(db, seen);
        for (int r = 0; r < N_ROWS; r++) {
            if (seen[r].mixed || (seen[r].cells != 0 && seen[r].cells != 4))
                fprintf(stderr, "crash %d: row %d half applied (%d cells, mixed=%d)\n", iter, r,
                        seen[r].cells, seen[r].mixed);
            assert_false(seen[r].mixed);
            assert_true(seen[r].cells == 0 || seen[r].cells == 4);
            if (acked[r] > seen[r].marker)
                fprintf(stderr, "crash %d: row %d lost acked %llu (have %llu)\n", iter, r,
                        (unsigned long long)acked[r], (unsigned long long)seen[r].marker);
            assert_true(seen[r].marker >= acked[r]);
        }
        sto_db_close(db);
    }
    for (int r = 0; r < N_ROWS; r++)
        total_acked += acked[r] ? 1 : 0;
    fprintf(stderr, "crash_test: %d crashes, %llu rows with acknowledged writes, %llu acks\n",
            ITERATIONS, (unsigned long long)total_acked, (unsigned long long)n_acks);
    assert_true(total_acked > 0);
    tu_rmrf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crash_kill9_loses_nothing_acknowledged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
