/* shipper_test.c — proves the shipper delivers a node's log to a peer cluster and keeps its
 * promises, over a real loopback gRPC link: an "east" storage engine with a repl_ctx shipping to
 * a "west" rpc_server whose Replication service (repl_register) applies into a second engine.
 * Checks: everything written in east arrives in west byte for byte, in many small batches with a
 * bounded window; records that came in by replication are never shipped onward (neither east's
 * nor west's shipper sends them); after a "restart" (repl_close, more writes, repl_open) shipping
 * resumes from the durable acknowledged position; while the peer refuses (UNAVAILABLE) the
 * shipper backs off exponentially and catches up once the peer is back; with two west nodes the
 * rows go to their owners by the peer's tablet map (ListTablets), refreshed after
 * strata-not-owner; a link cut by repl_links_set (strata chaos partition) ships nothing and the
 * receiving end refuses Apply until both ends are restored; the applied bound of change-stream
 * tokens follows the peer's acknowledged commit time (repl_applied_bound); rows read before
 * their table was deleted here are not sent once a table of the same name is created again
 * (repl_table_dropped, a new tablet), and repl_table_shipping says whether a call with such rows
 * is still under way. The loop runs until a
 * condition holds; a generous iteration cap only guards against hangs. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <unistd.h>

#include <event2/event.h>

#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/replication.h"
#include "strata/topology.h"
#include "sto_test_util.h"

#define TABLE "projects/p/instances/i/tables/t"
#define EAST_TABLET 1
#define WEST_TABLET 5
#define SPIN_MAX 60000 /* 2 ms turns: a hang guard, not a timing assertion */

typedef struct west {
    char dir[512], state[600];
    sto_db *db;
    rpc_server *srv;
    uint16_t port;
    repl_ctx *rw;
    bool refuse; /* answer every write with UNAVAILABLE (a peer that is down) */
    bool hold;   /* start no write: keep it in held until the test lets it go */
    struct wop *held[8];
    const sto_row_mut *held_rows[8];
    size_t held_n[8], n_held;
    uint64_t writes;
    st_buf applied; /* the row keys of its writes, in the order they started: "r0001,r0002," */
    /* Rows this node owns: [lo, hi) ("" = unbounded), answered by ListTablets; others get
     * strata-not-owner. */
    char lo[16], hi[16];
} west;

#define WESTS_MAX 2

typedef struct env {
    struct event_base *base;
    char dir_e[512], state_e[600];
    sto_db *east_db;
    west w[WESTS_MAX];
    size_t n_west;
    st_topology topo;
    repl_ctx *re;
} env;

/* ---- the fake nodes ---- */

static st_code route_east(void *node, const char *table, st_slice row, uint64_t *id, st_err *err) {
    (void)node;
    (void)row;
    if (strcmp(table, TABLE) != 0)
        return st_err_set(err, ST_NOT_FOUND, "no table %s", table);
    *id = EAST_TABLET;
    return ST_OK;
}

static bool west_owns(const west *w, st_slice row) {
    return st_slice_cmp(row, st_slice_cstr(w->lo)) >= 0 &&
           (!w->hi[0] || st_slice_cmp(row, st_slice_cstr(w->hi)) < 0);
}

static st_code route_west(void *node, const char *table, st_slice row, uint64_t *id, st_err *err) {
    west *w = node;
    if (strcmp(table, TABLE) != 0)
        return st_err_set(err, ST_NOT_FOUND, "no table %s", table);
    if (!west_owns(w, row))
        return st_err_set(err, ST_FAILED_PRECONDITION, "strata-not-owner: not here (test)");
    *id = WEST_TABLET;
    return ST_OK;
}

/* strata.internal.v1.Node/ListTablets of a fake west node: its one range. */
static void h_list_tablets(rpc_call *call, st_slice req, void *arg) {
    (void)req;
    west *w = arg;
    Strata__Internal__V1__Tablet t;
    strata__internal__v1__tablet__init(&t);
    t.id = WEST_TABLET;
    t.table_name = TABLE;
    t.start_key.data = (uint8_t *)w->lo;
    t.start_key.len = strlen(w->lo);
    t.end_key.data = (uint8_t *)w->hi;
    t.end_key.len = strlen(w->hi);
    Strata__Internal__V1__Tablet *tp = &t;
    Strata__Internal__V1__ListTabletsResponse resp;
    strata__internal__v1__list_tablets_response__init(&resp);
    resp.n_tablets = 1;
    resp.tablets = &tp;
    uint8_t buf[256];
    size_t len = strata__internal__v1__list_tablets_response__pack(&resp, buf);
    rpc_call_send(call, st_slice_make(buf, len));
    rpc_call_finish(call, ST_OK, NULL);
}

typedef struct wop {
    west *w;
    repl_write_done_fn done;
    void *arg;
    st_code code;
} wop;

static void wop_on_loop(void *arg) {
    wop *op = arg;
    op->done(op->code, op->code == ST_OK ? NULL : "write failed", op->arg);
    free(op);
}

static void wop_durable(st_code code, uint64_t lsn, const st_err *err, void *arg) {
    (void)lsn;
    (void)err;
    wop *op = arg;
    op->code = code;
    assert_int_equal(rpc_server_post(op->w->srv, wop_on_loop, op), ST_OK);
}

static st_code write_west(void *node, const sto_row_mut *rows, size_t n, st_err *err,
                          repl_write_done_fn done, void *arg) {
    west *w = node;
    if (w->refuse)
        return st_err_set(err, ST_UNAVAILABLE, "west is down (test)");
    wop *op = calloc(1, sizeof *op);
    op->w = w;
    op->done = done;
    op->arg = arg;
    if (w->hold) { /* the rows live in the call's arena until it is answered */
        assert_true(w->n_held < 8);
        w->held[w->n_held] = op;
        w->held_rows[w->n_held] = rows;
        w->held_n[w->n_held++] = n;
        return ST_OK;
    }
    w->writes++;
    for (size_t i = 0; i < n; i++) {
        st_buf_append(&w->applied, rows[i].row.data, rows[i].row.len);
        st_buf_append_byte(&w->applied, ',');
    }
    st_code rc = sto_write_async(w->db, rows, n, err, wop_durable, op);
    if (rc != ST_OK)
        free(op);
    return rc;
}

static st_code write_never(void *node, const sto_row_mut *rows, size_t n, st_err *err,
                           repl_write_done_fn done, void *arg) {
    (void)node, (void)rows, (void)n, (void)done, (void)arg;
    return st_err_set(err, ST_UNIMPLEMENTED, "east receives nothing in this test");
}

static const repl_node_ops east_ops = {.route = route_east, .write = write_never};
static const repl_node_ops west_ops = {.route = route_west, .write = write_west};

/* The applied bound's test: east's resolved stamp and west's commit floor, set by the test. */
static int64_t g_resolved, g_floor;
static int64_t fake_resolved(void *node) {
    (void)node;
    return g_resolved;
}
static int64_t fake_floor(void *node) {
    (void)node;
    return g_floor;
}
static const repl_node_ops east_bound_ops = {
    .route = route_east, .write = write_never, .cs_resolved = fake_resolved};
static const repl_node_ops west_bound_ops = {
    .route = route_west, .write = write_west, .commit_floor = fake_floor};
static const repl_node_ops *g_east_ops = &east_ops, *g_west_ops = &west_ops;

/* ---- setup ---- */

/* A node's store on a fresh directory (dir) with one tablet, and the path of the node's
 * replication state directory inside it (state, a separate buffer of state_cap bytes). */
static void open_db(char *dir, size_t cap, char *state, size_t state_cap, const char *name,
                    uint64_t tablet, sto_db **out) {
    tu_tmpdir(dir, cap, name);
    snprintf(state, state_cap, "%s/repl", dir);
    sto_options o;
    tu_small_options(&o);
    st_err err;
    assert_int_equal(sto_db_open(dir, &o, out, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_create(*out, tablet, st_slice_cstr(TABLE), st_slice_cstr(""),
                                       st_slice_cstr(""), &t, &err),
                     ST_OK);
}

/* east_side, or west node wi. */
static void repl_opts_for(env *e, repl_opts *o, bool east_side, size_t wi) {
    memset(o, 0, sizeof *o);
    o->topo = &e->topo;
    o->cluster_num = east_side ? 1 : 2;
    o->node_num = east_side ? 1 : 2 + (uint32_t)wi;
    o->state_dir = east_side ? e->state_e : e->w[wi].state;
    o->db = east_side ? e->east_db : e->w[wi].db;
    o->base = e->base;
    o->ops = east_side ? g_east_ops : g_west_ops;
    o->node = east_side ? NULL : &e->w[wi];
    o->batch_rows_max = 7;
    o->inflight_max = 2;
    o->backoff_min_ms = 5;
    o->backoff_max_ms = 40;
    o->hold_interval_ms = 10;
    o->poll_ms = 5;
}

/* East plus n_west west nodes; west node i owns [splits[i], splits[i+1]). */
static void env_open_n(env *e, size_t n_west, const char *const *splits) {
    memset(e, 0, sizeof *e);
    e->base = event_base_new();
    e->n_west = n_west;
    open_db(e->dir_e, sizeof e->dir_e, e->state_e, sizeof e->state_e, "repl-ship-east", EAST_TABLET,
            &e->east_db);
    st_err err;
    /* East's node address is a port nobody listens on: west never needs to send there. */
    char text[1024];
    int n = snprintf(text, sizeof text, "[cluster east]\nnode = 127.0.0.1:1 /e\n[cluster west]\n");
    for (size_t i = 0; i < n_west; i++) {
        west *w = &e->w[i];
        open_db(w->dir, sizeof w->dir, w->state, sizeof w->state, "repl-ship-west", WEST_TABLET,
                &w->db);
        snprintf(w->lo, sizeof w->lo, "%s", splits ? splits[i] : "");
        snprintf(w->hi, sizeof w->hi, "%s", splits ? splits[i + 1] : "");
        w->srv = rpc_server_new(e->base, NULL, &err);
        assert_non_null(w->srv);
        assert_int_equal(rpc_server_listen(w->srv, "127.0.0.1", 0, &w->port, &err), ST_OK);
        assert_int_equal(rpc_server_add_method(w->srv, "/strata.internal.v1.Node/ListTablets",
                                               h_list_tablets, w),
                         ST_OK);
        n += snprintf(text + n, sizeof text - (size_t)n, "node = 127.0.0.1:%u /w%zu\n", w->port, i);
    }
    assert_int_equal(st_topology_parse(text, (size_t)n, "test", &e->topo, &err), ST_OK);
    for (size_t i = 0; i < n_west; i++) {
        repl_opts o;
        repl_opts_for(e, &o, false, i);
        assert_int_equal(repl_open(&o, &e->w[i].rw, &err), ST_OK);
        assert_int_equal(repl_register(e->w[i].rw, e->w[i].srv, &err), ST_OK);
    }
}

static void env_open(env *e) {
    env_open_n(e, 1, NULL);
}

static void east_open(env *e) {
    repl_opts o;
    repl_opts_for(e, &o, true, 0);
    st_err err;
    assert_int_equal(repl_open(&o, &e->re, &err), ST_OK);
    assert_int_equal(repl_peer_count(e->re), 1);
}

static void env_close(env *e) {
    repl_close(e->re);
    for (size_t i = 0; i < e->n_west; i++) {
        repl_close(e->w[i].rw);
        rpc_server_free(e->w[i].srv);
    }
    event_base_loop(e->base, EVLOOP_NONBLOCK);
    sto_db_close(e->east_db);
    for (size_t i = 0; i < e->n_west; i++) {
        sto_db_close(e->w[i].db);
        tu_rmrf(e->w[i].dir);
        st_buf_free(&e->w[i].applied);
    }
    event_base_free(e->base);
    tu_rmrf(e->dir_e);
}

/* Turns the loop until pred holds (asserting it does before the hang guard). */
static void run_until(env *e, bool (*pred)(env *e)) {
    for (int i = 0; i < SPIN_MAX && !pred(e); i++) {
        struct timeval tv = {0, 2000};
        event_base_loopexit(e->base, &tv);
        event_base_dispatch(e->base);
    }
    assert_true(pred(e));
}

static bool east_caught_up(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return st.acked_next_lsn > sto_log_last_lsn(e->east_db) && st.records_behind == 0;
}

/* Writes n rows r<i> from origin 1 (or, replicated=true, as if they came from west). */
static void write_rows(env *e, int from, int n, bool replicated) {
    for (int i = from; i < from + n; i++) {
        char row[32], val[32];
        snprintf(row, sizeof row, "%s%04d", replicated ? "zrep" : "r", i);
        snprintf(val, sizeof val, "value-%d", i);
        sto_mut m[2] = {tu_set_mut("cf", "a", 1000 * i, val), tu_set_mut("cf", "b", 0, row)};
        sto_row_mut r = tu_row(EAST_TABLET, row, m, 2, 0);
        uint32_t origin = replicated ? 2 : 1;
        r.commit_ts_us = (uint64_t)st_wall_us() + (uint64_t)i;
        r.version = STO_VERSION(r.commit_ts_us, origin);
        r.origin = origin;
        r.flags = replicated ? STO_ROW_REPLICATED : 0;
        st_err err;
        assert_int_equal(sto_write(e->east_db, &r, 1, NULL, &err), ST_OK);
    }
}

/* West holds exactly east's non-replicated rows. */
static void assert_west_matches_east(env *e) {
    st_buf de, dw, only;
    st_buf_init(&de);
    st_buf_init(&dw);
    st_buf_init(&only);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(e->east_db, EAST_TABLET, &t), ST_OK);
    sto_range r = {.start = st_slice_cstr("r"), .end = st_slice_cstr("s")};
    assert_int_equal(tu_dump_range(t, &r, false, &de), ST_OK);
    for (size_t i = 0; i < e->n_west; i++) {
        assert_int_equal(tu_dump(e->w[i].db, WEST_TABLET, &only), ST_OK);
        st_buf_append(&dw, only.data, only.len);
    }
    st_buf_append_byte(&dw, 0);
    assert_true(de.len > 0);
    assert_string_equal((char *)de.data, (char *)dw.data);
    assert_null(strstr((char *)dw.data, "zrep")); /* replicated rows never travel onward */
    st_buf_free(&de);
    st_buf_free(&dw);
    st_buf_free(&only);
}

/* ---- tests ---- */

static void test_shipper_delivers_and_skips_replicated(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 40, false);
    write_rows(&e, 0, 5, true);
    write_rows(&e, 40, 20, false);
    east_open(&e);
    run_until(&e, east_caught_up);
    assert_west_matches_east(&e);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.rows_shipped, 60);
    assert_int_equal(st.records_skipped, 5);
    assert_true(st.batches_sent >= 60 / 7);
    assert_int_equal(st.time_behind_us, 0);
    /* West's own shipper (to east) skips everything it applied: nothing to send back. */
    repl_peer_stats_get(e.w[0].rw, 0, &st);
    assert_int_equal(st.rows_shipped, 0);
    assert_int_equal(st.rpcs_failed, 0);
    /* Positions as GetPositions reports them. */
    repl_node_positions p;
    repl_positions_local(e.re, &p);
    assert_int_equal(p.n_peers, 1);
    assert_int_equal(p.peer_cluster[0], 2);
    assert_true(p.peer_acked_next[0] > p.last_lsn);
    env_close(&e);
}

static bool east_durable(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return east_caught_up(e) && st.durable_next_lsn == st.acked_next_lsn;
}

static void test_shipper_resumes_after_restart(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 30, false);
    east_open(&e);
    run_until(&e, east_durable);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    uint64_t acked = st.acked_next_lsn;
    uint64_t west_writes = e.w[0].writes;
    repl_close(e.re); /* "crash" after the position was recorded */
    e.re = NULL;
    write_rows(&e, 30, 10, false);
    east_open(&e);
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.acked_next_lsn, acked); /* resumes at the recorded position */
    run_until(&e, east_caught_up);
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.rows_shipped, 10); /* only what was new */
    assert_true(e.w[0].writes > west_writes);
    assert_west_matches_east(&e);
    env_close(&e);
}

/* A position file past the log's end (a damaged or edited file) is refused naming it: believed,
 * it skipped every record up to it while the lag read 0, and its holder in the manifest made the
 * next start refuse the log as cut. Removed, the whole log ships again. */
static void test_shipper_refuses_position_past_log_end(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 30, false);
    east_open(&e);
    run_until(&e, east_durable);
    repl_close(e.re);
    e.re = NULL;
    write_rows(&e, 30, 10, false); /* not shipped yet */
    char path[700], text[64];
    snprintf(path, sizeof path, "%s/peer-west.pos", e.state_e);
    int len = snprintf(text, sizeof text, "repl-position v1 %llu\n",
                       (unsigned long long)sto_log_last_lsn(e.east_db) + 1000);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    repl_opts o;
    repl_opts_for(&e, &o, true, 0);
    st_err err = {0};
    assert_int_equal(repl_open(&o, &e.re, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "peer-west.pos"));
    assert_non_null(strstr(err.msg, "past the commit log's end"));
    e.re = NULL;
    assert_int_equal(unlink(path), 0);
    east_open(&e);
    run_until(&e, east_caught_up);
    assert_west_matches_east(&e); /* the 10 new rows arrived too */
    env_close(&e);
}

/* The same file while the log reports no dropped tail (a node started with --accept-data-loss
 * whose log was not cut): nothing explains a position past the end (the file is damaged), so
 * the start still fails on it; clamping it would skip every record up to the log's end, which
 * the peer never got. (A real cut, which the log reports, clamps: repl_log_cut_test.) */
static void test_shipper_refuses_position_past_intact_log_even_when_loss_accepted(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 30, false);
    east_open(&e);
    run_until(&e, east_caught_up);
    repl_close(e.re);
    e.re = NULL;
    char path[700], text[64];
    snprintf(path, sizeof path, "%s/peer-west.pos", e.state_e);
    uint64_t end = sto_log_last_lsn(e.east_db);
    assert_false(sto_log_tail_dropped_at_open(e.east_db));
    int len =
        snprintf(text, sizeof text, "repl-position v1 %llu\n", (unsigned long long)end + 1000);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    repl_opts o;
    repl_opts_for(&e, &o, true, 0);
    st_err err = {0};
    assert_int_equal(repl_open(&o, &e.re, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "past the commit log's end"));
    e.re = NULL;
    env_close(&e);
}

/* east's position file for west: its text into out (NUL-terminated), or "" when absent. */
static void pos_file_get(env *e, char *out, size_t cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/peer-west.pos", e->state_e);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    out[n] = '\0';
}

static void pos_file_put(env *e, const char *text) {
    char path[700];
    snprintf(path, sizeof path, "%s/peer-west.pos", e->state_e);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* The position file carries a CRC32C: a flipped digit that still parses and names an lsn below
 * the log's end (believed, the records between were skipped for good while the lag read 0) is
 * refused with DATA_LOSS naming the file. The v1 form of earlier versions (no checksum) is still
 * believed, and the file is written again in the checksummed form, which reads back. */
static void test_shipper_position_file_checksum(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 30, false);
    east_open(&e);
    run_until(&e, east_durable);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    uint64_t acked = st.acked_next_lsn;
    assert_true(acked > 10);
    repl_close(e.re);
    e.re = NULL;
    char text[128], want[64];
    pos_file_get(&e, text, sizeof text);
    snprintf(want, sizeof want, "repl-position v2 %llu ", (unsigned long long)acked);
    assert_true(strncmp(text, want, strlen(want)) == 0);
    east_open(&e); /* the written file round-trips */
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.acked_next_lsn, acked);
    repl_close(e.re);
    e.re = NULL;

    /* one digit of the lsn lowered: still parsable, below the log's end, checksum wrong */
    char bad[128];
    snprintf(bad, sizeof bad, "%s", text);
    char *digit = bad + strlen("repl-position v2 ");
    assert_true(*digit >= '1' && *digit <= '9');
    (*digit)--;
    pos_file_put(&e, bad);
    repl_opts o;
    repl_opts_for(&e, &o, true, 0);
    st_err err = {0};
    assert_int_equal(repl_open(&o, &e.re, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "peer-west.pos"));
    assert_non_null(strstr(err.msg, "checksum"));
    assert_non_null(strstr(err.msg, "remove it"));
    e.re = NULL;

    /* the v1 form of earlier versions is believed as before, then written as v2 */
    char v1[64];
    snprintf(v1, sizeof v1, "repl-position v1 %llu\n", (unsigned long long)acked);
    pos_file_put(&e, v1);
    write_rows(&e, 30, 10, false);
    east_open(&e);
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.acked_next_lsn, acked);
    run_until(&e, east_durable);
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.rows_shipped, 10); /* only what was new */
    assert_west_matches_east(&e);
    repl_close(e.re);
    e.re = NULL;
    pos_file_get(&e, text, sizeof text);
    assert_true(strncmp(text, "repl-position v2 ", 17) == 0);
    env_close(&e);
}

static bool east_backing_off_long(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return st.backing_off && st.backoff_ms >= 40 && st.rpcs_failed >= 4;
}

static void test_shipper_backs_off_and_recovers(void **state) {
    (void)state;
    env e;
    env_open(&e);
    e.w[0].refuse = true;
    write_rows(&e, 0, 20, false);
    east_open(&e);
    run_until(&e, east_backing_off_long); /* 5, 10, 20, 40 ms, then capped */
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.backoff_ms, 40);
    assert_non_null(strstr(st.last_error, "UNAVAILABLE"));
    assert_int_equal(st.acked_next_lsn, 1);
    assert_true(st.records_behind >= 20);
    assert_true(st.bytes_behind > 0);
    e.w[0].refuse = false; /* the partition heals */
    run_until(&e, east_caught_up);
    repl_peer_stats_get(e.re, 0, &st);
    assert_false(st.backing_off);
    assert_int_equal(st.backoff_ms, 0);
    assert_west_matches_east(&e);
    env_close(&e);
}

static void run_turns(env *e, int n);

/* ERROR lines of the shipper's unreadable-records event, counted. */
static int g_unreadable_lines;
static void unreadable_sink(st_log_level level, const char *module, const char *line, void *arg) {
    (void)module;
    (void)arg;
    if (level == ST_LOG_ERROR && strstr(line, "event=repl_log_unreadable") &&
        strstr(line, "DATA_LOSS"))
        g_unreadable_lines++;
}

/* Flips one byte in the middle of the records of east's (only) log segment. */
static void east_log_damage(env *e) {
    char dir[600], path[900] = "";
    snprintf(dir, sizeof dir, "%s/log", e->dir_e);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));)
        if (strstr(de->d_name, ".log"))
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    closedir(d);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char buf[1 << 16];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    assert_true(n > 0);
    ssize_t end = n;
    while (end > 0 && buf[end - 1] == 0)
        end--;
    off_t at = (4096 + end) / 2; /* past the header page, among the records */
    assert_true(at < end);
    buf[at] ^= 0x5a;
    assert_int_equal(pwrite(fd, &buf[at], 1, at), 1);
    close(fd);
}

static bool east_backing_off_long_quiet(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return st.backing_off && st.backoff_ms >= 40;
}

/* Damaged records the shipper needs stop the shipping for good, unlike a peer that does not
 * answer: said at ERROR (once per minute, not once per retry), and the reason is in the stats
 * that `strata status` prints. */
static void test_shipper_reports_unreadable_records(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 200, false);
    east_log_damage(&e);
    g_unreadable_lines = 0;
    st_log_set_sink(unreadable_sink, NULL);
    east_open(&e);
    run_until(&e, east_backing_off_long_quiet); /* 5, 10, 20, 40 ms: four failed reads */
    run_turns(&e, 50);
    st_log_set_sink(NULL, NULL);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(g_unreadable_lines, 1);
    assert_non_null(strstr(st.last_error, "DATA_LOSS"));
    assert_true(st.acked_next_lsn < sto_log_last_lsn(e.east_db));
    env_close(&e);
}

/* The node's table exists by name: it was deleted and created again (new tablets). */
static bool table_exists_always(void *node, const char *table) {
    (void)node;
    return strcmp(table, TABLE) == 0;
}
static const repl_node_ops east_recreated_ops = {
    .route = route_east, .write = write_never, .table_exists = table_exists_always};

/* Backing off with every call sent so far refused: none is under way (one peer node). */
static bool west_refused_all(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return st.backing_off && st.rpcs_failed >= 2 && st.rpcs_failed == st.batches_sent;
}

/* Rows read into batches that the peer refused, then their table deleted here and created
 * again under the same name (a new tablet): the batches sent again leave the old rows out,
 * although a table of that name exists (they used to enter the new table on the peer). */
static void test_shipper_drops_rows_of_recreated_table(void **state) {
    (void)state;
    env e;
    g_east_ops = &east_recreated_ops;
    env_open(&e);
    e.w[0].refuse = true;
    write_rows(&e, 0, 20, false);
    east_open(&e);
    run_until(&e, west_refused_all);
    repl_table_dropped(e.re, TABLE);
    st_err err;
    assert_int_equal(sto_tablet_drop(e.east_db, EAST_TABLET, &err), ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_create(e.east_db, EAST_TABLET + 1, st_slice_cstr(TABLE),
                                       st_slice_cstr(""), st_slice_cstr(""), &t, &err),
                     ST_OK);
    repl_tablet_named(e.re, EAST_TABLET + 1, TABLE);
    e.w[0].refuse = false;
    run_until(&e, east_caught_up);
    assert_int_equal(e.w[0].applied.len, 0); /* no row of the deleted table reached west */
    env_close(&e);
    g_east_ops = &east_ops;
}

static bool west_holds_a_call(env *e) {
    return e->w[0].n_held > 0;
}
static bool east_ships_nothing_of_table(env *e) {
    return !repl_table_shipping(e->re, TABLE);
}

/* An Apply call with rows of a table under way when the table is dropped here: the node's
 * DropTable answer waits for repl_table_shipping to turn false, which it does once the call
 * ended (then no CreateTable of the name can have reached the peer before the call). */
static void test_shipper_table_shipping_until_calls_end(void **state) {
    (void)state;
    env e;
    env_open(&e);
    e.w[0].hold = true;
    write_rows(&e, 0, 5, false);
    east_open(&e);
    assert_false(repl_table_shipping(e.re, TABLE));
    run_until(&e, west_holds_a_call);
    repl_table_dropped(e.re, TABLE);
    assert_true(repl_table_shipping(e.re, TABLE));
    assert_false(repl_table_shipping(e.re, "projects/p/instances/i/tables/other"));
    west *w = &e.w[0];
    w->hold = false;
    for (size_t i = 0; i < w->n_held; i++) {
        st_err err;
        assert_int_equal(
            sto_write_async(w->db, w->held_rows[i], w->held_n[i], &err, wop_durable, w->held[i]),
            ST_OK);
    }
    w->n_held = 0;
    run_until(&e, east_ships_nothing_of_table);
    env_close(&e);
}

static bool east_refused_by_cut(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return st.rpcs_failed > 0 && strstr(st.last_error, "strata-link-cut") != NULL;
}

/* Turns the loop n times (2 ms each): time in which an open link would have shipped. */
static void run_turns(env *e, int n) {
    for (int i = 0; i < n; i++) {
        struct timeval tv = {0, 2000};
        event_base_loopexit(e->base, &tv);
        event_base_dispatch(e->base);
    }
}

/* `strata chaos partition`: a cut link ships nothing; a receiver with the link cut refuses
 * Apply (UNAVAILABLE strata-link-cut) and writes nothing; once both ends are restored the
 * shipper catches up and west matches east. Only peer clusters may be cut. */
static void test_shipper_link_cut_and_restored(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 10, false);
    east_open(&e);
    run_until(&e, east_caught_up);
    st_err err;
    uint32_t west_num = 2, east_num = 1, own = 1, none = 9;
    assert_int_equal(repl_links_set(e.re, &own, 1, &err), ST_INVALID_ARGUMENT);
    assert_int_equal(repl_links_set(e.re, &none, 1, &err), ST_INVALID_ARGUMENT);
    assert_int_equal(repl_links_set(e.re, &west_num, 1, &err), ST_OK);
    assert_int_equal(repl_links_set(e.w[0].rw, &east_num, 1, &err), ST_OK);
    assert_true(repl_link_cut(e.re, 2));
    uint64_t writes = e.w[0].writes;
    write_rows(&e, 10, 20, false);
    run_turns(&e, 100);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_true(st.link_cut);
    assert_true(st.records_behind >= 20);
    assert_int_equal(e.w[0].writes, writes);
    /* East's end restored, west's still cut: west refuses what east now sends. */
    assert_int_equal(repl_links_set(e.re, NULL, 0, &err), ST_OK);
    run_until(&e, east_refused_by_cut);
    assert_int_equal(e.w[0].writes, writes);
    repl_peer_stats_get(e.re, 0, &st);
    assert_false(st.link_cut);
    assert_int_equal(repl_links_set(e.w[0].rw, NULL, 0, &err), ST_OK);
    run_until(&e, east_caught_up);
    assert_west_matches_east(&e);
    env_close(&e);
}

static int64_t g_want_bound;
static bool east_bound_is(env *e) {
    return repl_applied_bound(e->re, INT64_MAX) == g_want_bound;
}
static bool west_acked_commit_is(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->w[0].rw, 0, &st);
    return st.acked_commit_us == g_floor;
}

/* The applied bound of change-stream tokens: a shipper's acknowledged commit time (the largest
 * acknowledged row's, or the node's commit floor once caught up) reaches the other cluster
 * through GetPositions and pairs with its resolved stamp; the bound of a position is the latest
 * pair's at or below it; a cut link holds it. */
static void test_shipper_applied_bound(void **state) {
    (void)state;
    g_east_ops = &east_bound_ops;
    g_west_ops = &west_bound_ops;
    g_resolved = 500;
    g_floor = 1000;
    env e;
    env_open(&e);
    int64_t before = st_wall_us();
    write_rows(&e, 0, 10, false);
    east_open(&e);
    assert_int_equal(repl_applied_bound(NULL, 5), INT64_MAX); /* no replication: no bound */
    assert_int_equal(repl_applied_bound(e.re, INT64_MAX), 0); /* nothing known yet */
    run_until(&e, east_caught_up);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st); /* east has no commit floor: its last row's commit */
    assert_true(st.acked_commit_us >= before + 9 && st.acked_commit_us <= st_wall_us() + 9);
    repl_node_positions p;
    repl_positions_local(e.re, &p);
    assert_int_equal(p.peer_acked_commit_us[0], st.acked_commit_us);
    run_until(&e, west_acked_commit_is); /* west ships nothing: caught up at its floor */
    g_want_bound = 1000;
    run_until(&e, east_bound_is);
    assert_int_equal(repl_applied_bound(e.re, 499), 0);
    assert_int_equal(repl_applied_bound(e.re, 500), 1000);
    g_resolved = 800;
    g_floor = 2000;
    g_want_bound = 2000;
    run_until(&e, east_bound_is);
    assert_int_equal(repl_applied_bound(e.re, 799), 1000);
    assert_int_equal(repl_applied_bound(e.re, 800), 2000);
    assert_int_equal(repl_applied_bound(e.re, 650), 1000);
    /* West's link cut: its shipper stops, its acknowledged commit time and the bound stay. */
    uint32_t east_num = 1;
    st_err err;
    assert_int_equal(repl_links_set(e.w[0].rw, &east_num, 1, &err), ST_OK);
    g_floor = 3000;
    g_resolved = 900;
    run_turns(&e, 200);
    assert_int_equal(repl_applied_bound(e.re, INT64_MAX), 2000);
    assert_int_equal(repl_links_set(e.w[0].rw, NULL, 0, &err), ST_OK);
    g_want_bound = 3000;
    run_until(&e, east_bound_is);
    assert_int_equal(repl_applied_bound(e.re, 899), 2000);
    env_close(&e);
    g_east_ops = &east_ops;
    g_west_ops = &west_ops;
}

/* A row delete storage wrote itself (DropRowRange: origin 0, version with the cluster as
 * tiebreaker) travels with the origin taken from the version; a record with no origin at all
 * would be refused by every peer, so it is counted and skipped instead of stopping shipping. */
static void test_shipper_fills_origin_and_skips_invalid(void **state) {
    (void)state;
    env e;
    env_open(&e);
    write_rows(&e, 0, 10, false);
    sto_mut del = {.type = STO_MUT_DEL_ROW};
    uint64_t ts = (uint64_t)st_wall_us() + 1000;
    sto_row_mut r = tu_row(EAST_TABLET, "r0005", &del, 1, STO_VERSION(ts, 1));
    r.commit_ts_us = ts;
    st_err err;
    assert_int_equal(sto_write(e.east_db, &r, 1, NULL, &err), ST_OK);
    r = tu_row(EAST_TABLET, "r0006", &del, 1, STO_VERSION(ts, 0));
    r.commit_ts_us = ts;
    assert_int_equal(sto_write(e.east_db, &r, 1, NULL, &err), ST_OK);
    write_rows(&e, 10, 2, false);
    east_open(&e);
    run_until(&e, east_caught_up);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_int_equal(st.records_skipped, 1);
    assert_int_equal(st.rows_shipped, 13);
    st_buf d;
    st_buf_init(&d);
    assert_int_equal(tu_dump(e.w[0].db, WEST_TABLET, &d), ST_OK);
    assert_null(strstr((char *)d.data, "r0005 "));
    assert_non_null(strstr((char *)d.data, "r0006 "));
    assert_non_null(strstr((char *)d.data, "r0011 "));
    st_buf_free(&d);
    env_close(&e);
}

/* Two west nodes split the rows; then ownership moves (the first node gives its upper half to
 * the second): the shipper meets strata-not-owner, refreshes its map and delivers every row to
 * its owner. */
static void test_shipper_routes_by_peer_tablet_map(void **state) {
    (void)state;
    static const char *const splits[] = {"", "r0020", ""};
    env e;
    env_open_n(&e, 2, splits);
    write_rows(&e, 0, 40, false);
    east_open(&e);
    run_until(&e, east_caught_up);
    assert_west_matches_east(&e);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    uint64_t refreshes = st.map_refreshes;
    assert_true(refreshes >= 1);
    assert_true(e.w[0].writes > 0 && e.w[1].writes > 0);
    /* rows r0010.. now belong to the second node */
    snprintf(e.w[0].hi, sizeof e.w[0].hi, "r0010");
    snprintf(e.w[1].lo, sizeof e.w[1].lo, "r0010");
    write_rows(&e, 10, 5, false); /* rewrites, now owned by node 2 */
    write_rows(&e, 40, 10, false);
    run_until(&e, east_caught_up);
    repl_peer_stats_get(e.re, 0, &st);
    assert_true(st.map_refreshes > refreshes);
    assert_true(st.rpcs_failed >= 1); /* the not-owner answer */
    /* Node 2 holds the rewritten rows r0010..r0014 (node 1 keeps their older copies, as a moved
     * tablet's source would until it is dropped): compare node 2's part only. */
    st_buf d2, de;
    st_buf_init(&d2);
    st_buf_init(&de);
    assert_int_equal(tu_dump(e.w[1].db, WEST_TABLET, &d2), ST_OK);
    assert_non_null(strstr((char *)d2.data, "r0010 cf:a@10000=value-10"));
    assert_non_null(strstr((char *)d2.data, "r0049 cf:a@49000=value-49"));
    st_buf_free(&d2);
    st_buf_free(&de);
    env_close(&e);
}

/* ---- the order of Apply calls ---- */

typedef struct apply_call {
    bool done;
    st_code code;
} apply_call;

static void apply_call_done(st_code code, const char *message, st_slice resp, void *arg) {
    (void)message;
    (void)resp;
    apply_call *c = arg;
    c->done = true;
    c->code = code;
}

/* Starts an Apply from east's node 1 of one row (table, key) with the given log positions. */
static void send_apply(rpc_client *c, const char *table, const char *key, uint64_t after,
                       uint64_t next, apply_call *out) {
    sto_mut m = tu_set_mut("cf", "a", 1000, key);
    uint64_t ts = (uint64_t)st_wall_us();
    sto_row_mut row = tu_row(EAST_TABLET, key, &m, 1, STO_VERSION(ts, 1));
    row.commit_ts_us = ts;
    row.origin = 1;
    st_buf enc;
    st_buf_init(&enc);
    assert_int_equal(sto_row_mut_encode(&enc, &row), ST_OK);
    Strata__Internal__V1__ReplicatedRow rr;
    strata__internal__v1__replicated_row__init(&rr);
    rr.table_name = (char *)table;
    rr.row_mutation.data = enc.data;
    rr.row_mutation.len = enc.len;
    Strata__Internal__V1__ReplicatedRow *rp = &rr;
    Strata__Internal__V1__ApplyRequest req;
    strata__internal__v1__apply_request__init(&req);
    req.source_cluster = 1;
    req.source_node = 1;
    req.n_rows = 1;
    req.rows = &rp;
    req.after_lsn = after;
    req.next_lsn = next;
    uint8_t buf[512];
    size_t len = strata__internal__v1__apply_request__pack(&req, buf);
    *out = (apply_call){0};
    assert_int_equal(rpc_client_unary(c, "/strata.internal.v1.Replication/Apply",
                                      st_slice_make(buf, len), NULL, 0, 10000, apply_call_done,
                                      out),
                     ST_OK);
    st_buf_free(&enc);
}

static apply_call *g_wait[4];
static bool calls_done(env *e) {
    (void)e;
    for (size_t i = 0; i < 4 && g_wait[i]; i++)
        if (!g_wait[i]->done)
            return false;
    return true;
}

static void wait_calls(env *e, apply_call *a, apply_call *b) {
    g_wait[0] = a;
    g_wait[1] = b;
    g_wait[2] = NULL;
    run_until(e, calls_done);
}

static bool applied_is(env *e, const char *want) {
    return e->w[0].applied.len == strlen(want) &&
           memcmp(e->w[0].applied.data, want, strlen(want)) == 0;
}

/* A node applies each source node's batches in the order of that node's log, whatever order
 * they arrive in: a call naming an earlier batch (after_lsn) waits until a batch of its source
 * ending there started; when that earlier batch fails here, the calls waiting for it are
 * refused ABORTED (the shipper sends them again in order); a waiting call whose client goes away
 * ends there. */
static void test_apply_keeps_source_log_order(void **state) {
    (void)state;
    env e;
    env_open(&e);
    st_err err;
    rpc_client *c = rpc_client_new(e.base, "127.0.0.1", e.w[0].port, NULL, &err);
    assert_non_null(c);
    apply_call a, b;
    send_apply(c, TABLE, "r0002", 10, 20, &b); /* the later batch arrives first */
    run_turns(&e, 20);
    assert_false(b.done);
    assert_int_equal(e.w[0].writes, 0);
    send_apply(c, TABLE, "r0001", 0, 10, &a);
    wait_calls(&e, &a, &b);
    assert_int_equal(a.code, ST_OK);
    assert_int_equal(b.code, ST_OK);
    assert_true(applied_is(&e, "r0001,r0002,"));
    /* a batch already covered starts at once; an old shipper's call (after_lsn 0) too */
    send_apply(c, TABLE, "r0003", 15, 30, &a);
    send_apply(c, TABLE, "r0004", 0, 0, &b);
    wait_calls(&e, &a, &b);
    assert_int_equal(a.code, ST_OK);
    assert_int_equal(b.code, ST_OK);
    /* the earlier batch fails here: the one waiting for it is refused */
    send_apply(c, TABLE, "r0006", 40, 50, &b);
    run_turns(&e, 10);
    assert_false(b.done);
    send_apply(c, "projects/p/instances/i/tables/gone", "r0005", 30, 40, &a);
    wait_calls(&e, &a, &b);
    assert_int_equal(a.code, ST_NOT_FOUND);
    assert_int_equal(b.code, ST_ABORTED);
    assert_true(applied_is(&e, "r0001,r0002,r0003,r0004,"));
    /* a waiting call whose client goes away: nothing is applied, nothing leaks */
    send_apply(c, TABLE, "r0008", 70, 80, &b);
    run_turns(&e, 10);
    assert_false(b.done);
    rpc_client_free(c);
    run_turns(&e, 10);
    assert_true(applied_is(&e, "r0001,r0002,r0003,r0004,"));
    env_close(&e);
}

static bool west0_applied_its_rows(env *e) {
    repl_peer_stats st;
    repl_peer_stats_get(e->re, 0, &st);
    return e->w[0].applied.len >= 20 * 6 && st.backing_off;
}

/* A batch whose rows go to two peer nodes, one of which refuses: the batch is sent again to
 * that node only, so the other one applies each row once (its change stream gets no duplicate
 * records), and everything arrives once the refusing node is back. */
static void test_shipper_resends_to_failed_nodes_only(void **state) {
    (void)state;
    static const char *const splits[] = {"", "r0020", ""};
    env e;
    env_open_n(&e, 2, splits);
    e.w[1].refuse = true;
    write_rows(&e, 0, 40, false);
    east_open(&e);
    run_until(&e, west0_applied_its_rows);
    uint64_t writes = e.w[0].writes;
    run_turns(&e, 60); /* several resends to the refusing node */
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_true(st.rpcs_failed >= 2);
    assert_int_equal(e.w[0].writes, writes);
    e.w[1].refuse = false;
    run_until(&e, east_caught_up);
    assert_int_equal(e.w[0].writes, writes);
    assert_int_equal(e.w[0].applied.len, 20 * 6);
    assert_west_matches_east(&e);
    env_close(&e);
}

/* Rows move to another peer node behind the shipper's map: the batch sent by the old map fails
 * there (strata-not-owner) and is sent again to the new owner, the next batch goes to the old
 * node, and every row arrives where it belongs with no Apply call refused for waiting
 * REPL_APPLY_PARK_MS (each such refusal costs the link a backoff and seconds of lag). Where a
 * later batch's call reached the old node before the first batch was sent again, it waits there
 * for that batch, which then sends the old node an Apply of no rows to let it start; on one event
 * loop the first refusal comes back before the next batch leaves, so this test covers the move
 * and the accounting, not that interleaving. */
static void test_shipper_moved_rows_release_waiting_calls(void **state) {
    (void)state;
    static const char *const splits[] = {"", "r0020", ""};
    env e;
    env_open_n(&e, 2, splits);
    write_rows(&e, 20, 5, false);
    east_open(&e);
    run_until(&e, east_caught_up);                  /* the shipper has the peer's map */
    snprintf(e.w[0].hi, sizeof e.w[0].hi, "r0010"); /* r0010.. move to the second node */
    snprintf(e.w[1].lo, sizeof e.w[1].lo, "r0010");
    write_rows(&e, 10, 7, false); /* one batch, sent to the first node by the old map */
    write_rows(&e, 0, 7, false);  /* the next, for the first node: waits for the one before */
    run_until(&e, east_caught_up);
    repl_peer_stats st;
    repl_peer_stats_get(e.re, 0, &st);
    assert_true(st.rpcs_failed >= 1); /* the not-owner answer */
    assert_int_equal(repl_apply_expired(e.w[0].rw), 0);
    assert_int_equal(repl_apply_expired(e.w[1].rw), 0);
    assert_west_matches_east(&e);
    env_close(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipper_delivers_and_skips_replicated),
        cmocka_unit_test(test_shipper_resumes_after_restart),
        cmocka_unit_test(test_shipper_refuses_position_past_log_end),
        cmocka_unit_test(test_shipper_refuses_position_past_intact_log_even_when_loss_accepted),
        cmocka_unit_test(test_shipper_position_file_checksum),
        cmocka_unit_test(test_shipper_backs_off_and_recovers),
        cmocka_unit_test(test_shipper_reports_unreadable_records),
        cmocka_unit_test(test_shipper_routes_by_peer_tablet_map),
        cmocka_unit_test(test_shipper_fills_origin_and_skips_invalid),
        cmocka_unit_test(test_shipper_link_cut_and_restored),
        cmocka_unit_test(test_shipper_applied_bound),
        cmocka_unit_test(test_apply_keeps_source_log_order),
        cmocka_unit_test(test_shipper_resends_to_failed_nodes_only),
        cmocka_unit_test(test_shipper_moved_rows_release_waiting_calls),
        cmocka_unit_test(test_shipper_drops_rows_of_recreated_table),
        cmocka_unit_test(test_shipper_table_shipping_until_calls_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
