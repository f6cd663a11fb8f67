/* ops/bench_run.c — the load driver of `strata bench`: one libevent loop, N rpc_client
 * connections, M call slots per connection. Each slot keeps exactly one call in flight: when it
 * completes, the response is verified, the latency recorded (successes only), and the slot
 * issues its next call. A call that fails is counted by gRPC code and the slot backs off briefly
 * so a dead server does not turn the bench into a busy loop. */
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_run.h"
#include "bench_storm.h"
#include "google/bigtable/admin/v2/bigtable_instance_admin.pb-c.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define BENCH_BACKOFF_MS 20
#define BENCH_ADMIN_TIMEOUT_MS 30000
#define BENCH_TABLE_NAME_MAX (4 * BENCH_NAME_MAX)
#define BENCH_PARAMS_MAX (3 * BENCH_TABLE_NAME_MAX + 64)

static const char *const wl_names[WL_COUNT] = {"write",   "bulkwrite", "read",   "scan",
                                               "ycsb-a",  "ycsb-b",    "ycsb-e", "scan-limit",
                                               "changes", "load"};

const char *bench_wl_name(bench_wl wl) {
    return wl < WL_COUNT ? wl_names[wl] : "?";
}

bool bench_wl_writes(bench_wl wl) {
    return wl == WL_WRITE || wl == WL_BULKWRITE || wl == WL_YCSB_A || wl == WL_YCSB_B ||
           wl == WL_YCSB_E;
}

bool bench_wl_reads(bench_wl wl) {
    return wl == WL_READ || wl == WL_SCAN || wl == WL_YCSB_A || wl == WL_YCSB_B ||
           wl == WL_YCSB_E || wl == WL_SCAN_LIMIT;
}

/* The process-wide stop flag (set from SIGINT / SIGTERM), one of the exceptions to "no global
 * mutable state". */
static volatile sig_atomic_t stop_flag;
void bench_request_stop(void) {
    stop_flag = 1;
}
bool bench_stop_requested(void) {
    return stop_flag != 0;
}

int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ns(void) {
    return bench_now_ns();
}

size_t bench_md_fill(rpc_metadata md[2], const char *params, const bench_target *t) {
    md[0] = (rpc_metadata){"x-goog-request-params", params};
    if (!t->auth[0])
        return 1;
    md[1] = (rpc_metadata){"authorization", t->auth};
    return 2;
}

typedef enum op_kind { OP_MUTATE, OP_BULK, OP_READ, OP_SCAN } op_kind;

typedef struct bench_run bench_run;

typedef struct bench_conn {
    rpc_client *client;
} bench_conn;

/* The replication lag probe: one marker in flight at a time, on a connection of its own. */
typedef enum lag_state { LAG_OFF = 0, LAG_IDLE, LAG_WRITING, LAG_POLLING, LAG_STOPPED } lag_state;

typedef struct bench_lag {
    lag_state state;
    rpc_client *client;
    struct event *timer;
    uint64_t seq;
    int64_t acked_ns; /* when the marker's write was acknowledged */
    bool seen;        /* the current poll's answer held the marker row */
    char key[64];
    size_t key_len;
    st_buf req;
    char params[BENCH_PARAMS_MAX + 3 * BENCH_NAME_MAX + 32];
    rpc_metadata md[2];
    size_t n_md;
} bench_lag;

typedef struct bench_slot {
    bench_run *run;
    bench_conn *conn;
    st_rng rng;
    op_kind op;
    uint64_t key;  /* first row's index */
    uint32_t rows; /* rows written or expected back */
    bool limited;  /* a scan by rows_limit from key, without an end key */
    int64_t t0_ns;
    ops_rowcheck rc;
    ops_bulkcheck bc;
    struct event *retry_ev;
} bench_slot;

struct bench_run {
    const bench_cfg *cfg;
    bench_target *tgt;
    bench_wl wl;
    bench_result *res;
    struct event_base *base;
    bench_conn *conns;
    uint32_t n_conns;
    bench_slot *slots;
    uint32_t n_slots, active;
    ops_keygen keys_write; /* [0, keys) */
    ops_keygen keys_read;  /* [0, preload) */
    ops_keygen keys_scan;  /* scan starts: [0, preload - BENCH_SCAN_ROWS] */
    uint64_t issued, limit;
    int64_t start_ns, deadline_ns;
    struct event *tick;
    ops_hist interval;
    uint64_t interval_calls, interval_errors, interval_bytes;
    int64_t interval_start_ns;
    st_buf req;      /* the request being built (rpc_client_call copies it) */
    uint8_t *values; /* value pool: values are windows of it */
    size_t values_len;
    char table_name[BENCH_TABLE_NAME_MAX];
    char params[BENCH_PARAMS_MAX];
    rpc_metadata md[2];
    size_t n_md;
    bench_storm storm;                           /* --storm */
    struct event *storm_timer;                   /* starts it 40% into the run */
    rpc_client *graveyard[BENCH_RECONNECTS_MAX]; /* dead clients, freed when the run ends */
    size_t n_graveyard;
    bench_lag lag;
};

/* ---- requests ---- */

static void table_name_format(const bench_cfg *cfg, char *out, size_t cap) {
    snprintf(out, cap, "projects/%s/instances/%s/tables/%s", cfg->project, cfg->instance,
             cfg->table);
}

static size_t url_encode(const char *in, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (; *in && n + 4 < cap; in++) {
        unsigned char ch = (unsigned char)*in;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '_' || ch == '.' || ch == '~') {
            out[n++] = (char)ch;
        } else {
            out[n++] = '%';
            out[n++] = hex[ch >> 4];
            out[n++] = hex[ch & 15];
        }
    }
    out[n] = '\0';
    return n;
}

static ProtobufCBinaryData bin(const void *data, size_t len) {
    return (ProtobufCBinaryData){len, (uint8_t *)data};
}

/* A value for one write: a window of the random pool, so values do not compress to nothing. */
static ProtobufCBinaryData value_pick(bench_run *r, st_rng *rng) {
    size_t off = st_rng_below(rng, r->values_len - r->cfg->value_bytes + 1);
    return bin(r->values + off, r->cfg->value_bytes);
}

static void set_cell_fill(bench_run *r, st_rng *rng, Google__Bigtable__V2__Mutation *m,
                          Google__Bigtable__V2__Mutation__SetCell *sc) {
    google__bigtable__v2__mutation__init(m);
    google__bigtable__v2__mutation__set_cell__init(sc);
    sc->family_name = "f";
    sc->column_qualifier = bin("q", 1);
    sc->timestamp_micros = r->cfg->timestamp_us;
    sc->value = value_pick(r, rng);
    m->mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m->set_cell = sc;
}

/* Packs a message into r->req. */
static bool req_pack(bench_run *r, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    st_buf_reset(&r->req);
    if (st_buf_reserve(&r->req, len) != ST_OK)
        return false;
    r->req.len = protobuf_c_message_pack(msg, r->req.data);
    return true;
}

static bool build_mutate(bench_run *r, bench_slot *s) {
    char key[OPS_KEY_BYTES + 1];
    size_t kl = ops_key_format(key, s->key);
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell_fill(r, &s->rng, &m, &sc);
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = (char *)r->cfg->app_profile;
    req.row_key = bin(key, kl);
    req.n_mutations = 1;
    req.mutations = &mp;
    return req_pack(r, &req.base);
}

/* The bulk row keys: consecutive from s->key for the preload, else drawn one by one. */
static bool build_bulk(bench_run *r, bench_slot *s, const uint64_t *idx) {
    char keys[BENCH_BULK_ROWS][OPS_KEY_BYTES + 1];
    Google__Bigtable__V2__Mutation m[BENCH_BULK_ROWS], *mp[BENCH_BULK_ROWS];
    Google__Bigtable__V2__Mutation__SetCell sc[BENCH_BULK_ROWS];
    Google__Bigtable__V2__MutateRowsRequest__Entry e[BENCH_BULK_ROWS], *ep[BENCH_BULK_ROWS];
    for (uint32_t i = 0; i < s->rows; i++) {
        size_t kl = ops_key_format(keys[i], idx[i]);
        set_cell_fill(r, &s->rng, &m[i], &sc[i]);
        mp[i] = &m[i];
        google__bigtable__v2__mutate_rows_request__entry__init(&e[i]);
        e[i].row_key = bin(keys[i], kl);
        e[i].n_mutations = 1;
        e[i].mutations = &mp[i];
        ep[i] = &e[i];
    }
    Google__Bigtable__V2__MutateRowsRequest req;
    google__bigtable__v2__mutate_rows_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = (char *)r->cfg->app_profile;
    req.n_entries = s->rows;
    req.entries = ep;
    return req_pack(r, &req.base);
}

/* A point read is a RowSet of one key; a scan a bounded range [key(i), key(i+rows)), never an
 * open-ended one (those are O(table) in the emulator). */
static bool build_read(bench_run *r, bench_slot *s) {
    char from[OPS_KEY_BYTES + 1], to[OPS_KEY_BYTES + 1];
    size_t fl = ops_key_format(from, s->key);
    Google__Bigtable__V2__RowRange range, *rp = &range;
    ProtobufCBinaryData one = bin(from, fl);
    Google__Bigtable__V2__RowSet set;
    google__bigtable__v2__row_set__init(&set);
    if (s->op == OP_READ) {
        set.n_row_keys = 1;
        set.row_keys = &one;
    } else {
        size_t tl = ops_key_format(to, s->key + s->rows);
        google__bigtable__v2__row_range__init(&range);
        range.start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        range.start_key_closed = one;
        if (!s->limited) {
            range.end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
            range.end_key_open = bin(to, tl);
        }
        set.n_row_ranges = 1;
        set.row_ranges = &rp;
    }
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = (char *)r->cfg->app_profile;
    req.rows = &set;
    if (s->limited)
        req.rows_limit = s->rows;
    return req_pack(r, &req.base);
}

/* ---- choosing the next operation ---- */

static void op_pick_ycsb(bench_run *r, bench_slot *s, uint32_t read_pct) {
    bool read = st_rng_below(&s->rng, 100) < read_pct;
    s->op = read ? OP_READ : OP_MUTATE;
    s->rows = 1;
    s->key = ops_keygen_next(&r->keys_read, &s->rng);
}

/* YCSB E: 95% short scans of 1..100 rows, 5% inserts of new rows above the key space. */
static void op_pick_ycsb_e(bench_run *r, bench_slot *s) {
    if (st_rng_below(&s->rng, 100) < 5) {
        uint64_t base = r->cfg->keys > r->cfg->preload ? r->cfg->keys : r->cfg->preload;
        s->op = OP_MUTATE;
        s->rows = 1;
        s->key = base + r->tgt->inserted++;
        if (s->key > OPS_KEY_INDEX_MAX)
            s->key = base;
        return;
    }
    s->op = OP_SCAN;
    s->key = ops_keygen_next(&r->keys_scan, &s->rng);
    uint64_t room = r->cfg->preload - s->key;
    uint64_t len = 1 + st_rng_below(&s->rng, BENCH_SCAN_ROWS);
    s->rows = (uint32_t)(len < room ? len : room);
}

static void op_pick(bench_run *r, bench_slot *s, uint64_t *idx) {
    s->limited = false;
    switch (r->wl) {
    case WL_WRITE:
        s->op = OP_MUTATE;
        s->rows = 1;
        s->key = ops_keygen_next(&r->keys_write, &s->rng);
        break;
    case WL_LOAD:
    case WL_BULKWRITE: {
        s->op = OP_BULK;
        s->rows = BENCH_BULK_ROWS;
        if (r->wl == WL_LOAD) {
            s->key = (r->issued - 1) * BENCH_BULK_ROWS;
            uint64_t left = r->cfg->preload - s->key;
            s->rows = (uint32_t)(left < BENCH_BULK_ROWS ? left : BENCH_BULK_ROWS);
        }
        for (uint32_t i = 0; i < s->rows; i++)
            idx[i] = r->wl == WL_LOAD ? s->key + i : ops_keygen_next(&r->keys_write, &s->rng);
        s->key = idx[0];
        break;
    }
    case WL_READ:
        s->op = OP_READ;
        s->rows = 1;
        s->key = ops_keygen_next(&r->keys_read, &s->rng);
        break;
    case WL_SCAN:
    case WL_SCAN_LIMIT: {
        s->op = OP_SCAN;
        s->limited = r->wl == WL_SCAN_LIMIT;
        s->key = ops_keygen_next(&r->keys_scan, &s->rng);
        uint64_t room = r->cfg->preload - s->key;
        s->rows = (uint32_t)(room < BENCH_SCAN_ROWS ? room : BENCH_SCAN_ROWS);
        break;
    }
    case WL_YCSB_A:
        op_pick_ycsb(r, s, 50);
        break;
    case WL_YCSB_B:
        op_pick_ycsb(r, s, 95);
        break;
    case WL_YCSB_E:
        op_pick_ycsb_e(r, s);
        break;
    case WL_CHANGES: /* driven by bench_cs.c, never by these slots */
    case WL_COUNT:
        ST_ASSERT(false);
    }
}

/* ---- the slot state machine ---- */

static void slot_issue(bench_slot *s);

static bool run_may_issue(bench_run *r) {
    if (bench_stop_requested())
        return false;
    if (r->limit)
        return r->issued < r->limit;
    /* a storm not started or not finished yet keeps the workload going */
    if (r->cfg->storm && (!r->storm.started || bench_storm_running(&r->storm)))
        return true;
    return now_ns() < r->deadline_ns;
}

static void run_slot_idle(bench_run *r) {
    ST_ASSERT(r->active > 0);
    if (--r->active == 0)
        event_base_loopbreak(r->base);
}

static void record_error(bench_run *r, int slot, const char *what) {
    bench_result *res = r->res;
    res->errors[slot]++;
    res->errors_total++;
    r->interval_errors++;
    if (res->first_error[0] == '\0') {
        /* "CODE: message", the message cut to what fits (an st_err message may be longer). */
        size_t cap = sizeof(res->first_error);
        int k = snprintf(res->first_error, cap,
                         "%s: ", slot == BENCH_ERR_VERIFY ? "VERIFY" : st_code_name((st_code)slot));
        if (k > 0 && (size_t)k < cap) {
            size_t len = strnlen(what, cap - (size_t)k - 1);
            memcpy(res->first_error + k, what, len);
            res->first_error[(size_t)k + len] = '\0';
        }
    }
}

static void record_success(bench_run *r, bench_slot *s, uint64_t lat_ns, uint64_t bytes) {
    bench_result *res = r->res;
    res->calls++;
    res->rows += s->rows;
    res->bytes += bytes;
    ops_hist_record(&res->hist, lat_ns);
    ops_hist_record(&r->interval, lat_ns);
    if (r->cfg->storm && !r->storm.started)
        ops_hist_record(&res->storm_before, lat_ns);
    else if (bench_storm_running(&r->storm))
        ops_hist_record(&res->storm_during, lat_ns);
    r->interval_calls++;
    r->interval_bytes += bytes;
}

static void slot_retry_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    slot_issue(arg);
}

static void slot_backoff(bench_slot *s) {
    struct timeval tv = {0, BENCH_BACKOFF_MS * 1000};
    if (evtimer_add(s->retry_ev, &tv) != 0)
        run_slot_idle(s->run); /* cannot wait: give the slot up rather than spin */
}

static void slot_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    bench_slot *s = arg;
    if (s->op == OP_READ || s->op == OP_SCAN)
        ops_rowcheck_feed(&s->rc, msg);
    else if (s->op == OP_BULK)
        ops_bulkcheck_feed(&s->bc, msg);
}

/* Verification of a call that ended OK: on failure, says which error slot it counts in. */
static bool slot_verify(bench_slot *s, uint64_t *bytes, int *err_slot, const char **why) {
    size_t row_bytes = OPS_KEY_BYTES + s->run->cfg->value_bytes;
    *err_slot = BENCH_ERR_VERIFY;
    switch (s->op) {
    case OP_MUTATE:
        *bytes = row_bytes;
        return true;
    case OP_BULK:
        *bytes = (uint64_t)s->rows * row_bytes;
        if (ops_bulkcheck_finish(&s->bc))
            return true;
        if (s->bc.first_error != ST_OK)
            *err_slot = (int)s->bc.first_error;
        *why = s->bc.msg;
        return false;
    case OP_READ:
    case OP_SCAN:
        *bytes = s->rc.bytes_done;
        if (ops_rowcheck_finish(&s->rc))
            return true;
        *why = s->rc.msg;
        return false;
    }
    return false;
}

static void slot_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    bench_slot *s = arg;
    bench_run *r = s->run;
    uint64_t lat = (uint64_t)(now_ns() - s->t0_ns);
    if (code != ST_OK) {
        record_error(r, code <= ST_UNAUTHENTICATED ? (int)code : ST_UNKNOWN, message);
        slot_backoff(s);
        return;
    }
    uint64_t bytes = 0;
    int err_slot;
    const char *why = "";
    if (!slot_verify(s, &bytes, &err_slot, &why)) {
        record_error(r, err_slot, why);
        slot_backoff(s);
        return;
    }
    record_success(r, s, lat, bytes);
    slot_issue(s);
}

/* A live client for the slot's connection: a dead one is parked (it may be inside one of its own
 * callbacks right now) and replaced. */
static rpc_client *conn_client(bench_run *r, bench_conn *c, st_err *err) {
    if (c->client && rpc_client_alive(c->client))
        return c->client;
    if (c->client) {
        if (r->n_graveyard == BENCH_RECONNECTS_MAX) {
            st_err_set(err, ST_UNAVAILABLE, "gave up after %d reconnections", BENCH_RECONNECTS_MAX);
            return NULL;
        }
        r->graveyard[r->n_graveyard++] = c->client;
        c->client = NULL;
    }
    c->client = rpc_client_new(r->base, r->tgt->host, r->tgt->port, &r->tgt->copts, err);
    return c->client;
}

static const char *op_path(op_kind op) {
    switch (op) {
    case OP_MUTATE:
        return "/google.bigtable.v2.Bigtable/MutateRow";
    case OP_BULK:
        return "/google.bigtable.v2.Bigtable/MutateRows";
    case OP_READ:
    case OP_SCAN:
        break;
    }
    return "/google.bigtable.v2.Bigtable/ReadRows";
}

static void slot_issue(bench_slot *s) {
    bench_run *r = s->run;
    if (!run_may_issue(r)) {
        run_slot_idle(r);
        return;
    }
    r->issued++;
    uint64_t idx[BENCH_BULK_ROWS] = {0};
    op_pick(r, s, idx);
    bool built = s->op == OP_MUTATE ? build_mutate(r, s)
                 : s->op == OP_BULK ? build_bulk(r, s, idx)
                                    : build_read(r, s);
    if (!built) {
        record_error(r, ST_RESOURCE_EXHAUSTED, "out of memory building a request");
        slot_backoff(s);
        return;
    }
    if (s->op == OP_READ || s->op == OP_SCAN)
        ops_rowcheck_begin(&s->rc, s->key, s->rows, r->cfg->value_bytes);
    else if (s->op == OP_BULK)
        ops_bulkcheck_begin(&s->bc, s->rows);
    st_err err = {0};
    rpc_client *c = conn_client(r, s->conn, &err);
    s->t0_ns = now_ns();
    if (!c || !rpc_client_call(c, op_path(s->op), st_buf_slice(&r->req), r->md, r->n_md,
                               r->cfg->timeout_ms, slot_msg, slot_done, s)) {
        record_error(r, ST_UNAVAILABLE, c ? "the connection is closed" : err.msg);
        slot_backoff(s);
    }
}

/* ---- the replication lag probe ----
 * A marker row (outside the bench's key space: "~lag-<start ms>-<n>") is written with the run's
 * app profile; once acknowledged it is read every BENCH_LAG_POLL_MS with the target's lag profile
 * (single-cluster routing to the other cluster) until it shows; the time from the write's
 * acknowledgement to the answer that holds it is one sample. Then a pause of lag_interval_ms
 * and the next marker. One marker at a time, on a connection of its own, so the probe adds a
 * few hundred calls per second at most to the load. */

static void lag_schedule(bench_run *r, int64_t ms) {
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    if (evtimer_add(r->lag.timer, &tv) != 0)
        r->lag.state = LAG_STOPPED;
}

static void lag_fail(bench_run *r, const char *what, const char *msg) {
    r->res->lag_lost++;
    if (!r->res->lag_error[0])
        snprintf(r->res->lag_error, sizeof(r->res->lag_error), "%s: %s", what, msg ? msg : "");
    r->lag.state = LAG_IDLE;
    lag_schedule(r, r->cfg->lag_interval_ms);
}

static void lag_read_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    bench_run *r = arg;
    const uint8_t *p = msg.data, *end = msg.data + msg.len;
    ops_pb_field f;
    while (ops_pb_next(&p, end, &f) == 1)
        if (f.num == 1 && f.wire == 2) /* ReadRowsResponse.chunks: the marker row is there */
            r->lag.seen = true;
}

static void lag_read_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    bench_run *r = arg;
    if (r->lag.state != LAG_POLLING)
        return; /* the run is over */
    int64_t now = now_ns();
    if (code == ST_OK && r->lag.seen) {
        ops_hist_record(&r->res->lag, (uint64_t)(now - r->lag.acked_ns));
        r->lag.state = LAG_IDLE;
        lag_schedule(r, r->cfg->lag_interval_ms);
    } else if (code != ST_OK) {
        lag_fail(r, "reading the marker from the other cluster", message);
    } else if (now - r->lag.acked_ns > (int64_t)BENCH_LAG_GIVEUP_MS * 1000000) {
        lag_fail(r, "marker", "not visible on the other cluster after 30 s");
    } else {
        lag_schedule(r, BENCH_LAG_POLL_MS);
    }
}

static bool lag_pack(bench_lag *l, const ProtobufCMessage *msg) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    st_buf_reset(&l->req);
    if (st_buf_reserve(&l->req, len) != ST_OK)
        return false;
    l->req.len = protobuf_c_message_pack(msg, l->req.data);
    return true;
}

static void lag_poll(bench_run *r) {
    bench_lag *l = &r->lag;
    ProtobufCBinaryData key = bin(l->key, l->key_len);
    Google__Bigtable__V2__RowSet set;
    google__bigtable__v2__row_set__init(&set);
    set.n_row_keys = 1;
    set.row_keys = &key;
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = r->tgt->lag_profile;
    req.rows = &set;
    l->seen = false;
    if (!lag_pack(l, &req.base) ||
        !rpc_client_call(l->client, op_path(OP_READ), st_buf_slice(&l->req), l->md, l->n_md,
                         r->cfg->timeout_ms, lag_read_msg, lag_read_done, r))
        lag_fail(r, "reading the marker", "the call could not start");
}

static void lag_write_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    bench_run *r = arg;
    if (r->lag.state != LAG_WRITING)
        return;
    if (code != ST_OK) {
        lag_fail(r, "writing the marker", message);
        return;
    }
    r->lag.acked_ns = now_ns();
    r->lag.state = LAG_POLLING;
    lag_poll(r);
}

static void lag_write(bench_run *r) {
    bench_lag *l = &r->lag;
    if (!run_may_issue(r))
        return;
    int n = snprintf(l->key, sizeof(l->key), "~lag-%lld-%llu",
                     (long long)(r->cfg->timestamp_us / 1000), (unsigned long long)++l->seq);
    l->key_len = (size_t)n;
    Google__Bigtable__V2__Mutation m, *mp = &m;
    Google__Bigtable__V2__Mutation__SetCell sc;
    set_cell_fill(r, &r->slots[0].rng, &m, &sc);
    sc.value.len = sc.value.len < 8 ? sc.value.len : 8;
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = (char *)r->cfg->app_profile;
    req.row_key = bin(l->key, l->key_len);
    req.n_mutations = 1;
    req.mutations = &mp;
    l->state = LAG_WRITING;
    if (!lag_pack(l, &req.base) ||
        !rpc_client_call(l->client, op_path(OP_MUTATE), st_buf_slice(&l->req), r->md, r->n_md,
                         r->cfg->timeout_ms, NULL, lag_write_done, r))
        lag_fail(r, "writing the marker", "the call could not start");
}

static void lag_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    bench_run *r = arg;
    if (r->lag.state == LAG_IDLE)
        lag_write(r);
    else if (r->lag.state == LAG_POLLING)
        lag_poll(r);
}

static st_code lag_setup(bench_run *r, st_err *err) {
    bench_lag *l = &r->lag;
    st_buf_init(&l->req);
    if (!r->tgt->lag_profile[0] || !bench_wl_writes(r->wl))
        return ST_OK;
    char enc[BENCH_PARAMS_MAX], prof[3 * BENCH_NAME_MAX + 4];
    url_encode(r->table_name, enc, sizeof(enc));
    url_encode(r->tgt->lag_profile, prof, sizeof(prof));
    snprintf(l->params, sizeof(l->params), "table_name=%s&app_profile_id=%s", enc, prof);
    l->n_md = bench_md_fill(l->md, l->params, r->tgt);
    l->timer = evtimer_new(r->base, lag_timer_cb, r);
    l->client = rpc_client_new(r->base, r->tgt->host, r->tgt->port, &r->tgt->copts, err);
    if (!l->timer || !l->client)
        return st_err_set(err, ST_UNAVAILABLE, "lag probe: cannot connect to %s:%u", r->tgt->host,
                          r->tgt->port);
    l->state = LAG_IDLE;
    return ST_OK;
}

static void lag_teardown(bench_run *r) {
    bench_lag *l = &r->lag;
    l->state = LAG_STOPPED; /* callbacks run by rpc_client_free (CANCELLED) do nothing */
    if (l->timer)
        event_free(l->timer);
    if (l->client)
        rpc_client_free(l->client);
    st_buf_free(&l->req);
}

/* ---- progress ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    bench_run *r = arg;
    int64_t now = now_ns();
    double dt = (double)(now - r->interval_start_ns) / 1e9;
    if (r->cfg->progress && dt > 0) {
        fprintf(stderr,
                "bench %-9s %-8s %5.0fs  ops/s=%-9.0f MB/s=%-7.2f p50=%.0fus p99=%.0fus "
                "errors=%llu (total %llu)\n",
                bench_wl_name(r->wl), r->tgt->label, (double)(now - r->start_ns) / 1e9,
                (double)r->interval_calls / dt, (double)r->interval_bytes / dt / 1e6,
                (double)ops_hist_percentile(&r->interval, 50) / 1e3,
                (double)ops_hist_percentile(&r->interval, 99) / 1e3,
                (unsigned long long)r->interval_errors, (unsigned long long)r->res->errors_total);
    }
    ops_hist_init(&r->interval);
    r->interval_calls = r->interval_errors = r->interval_bytes = 0;
    r->interval_start_ns = now;
}

/* ---- one run ---- */

static double self_cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

static void value_pool_fill(bench_run *r) {
    st_rng rng;
    st_rng_seed(&rng, r->cfg->seed ^ 0x76616c7565ull);
    for (size_t i = 0; i + 8 <= r->values_len; i += 8)
        st_put_fixed64(r->values + i, st_rng_next(&rng));
}

static st_code run_setup(bench_run *r, st_err *err) {
    const bench_cfg *cfg = r->cfg;
    table_name_format(cfg, r->table_name, sizeof(r->table_name));
    char enc[BENCH_PARAMS_MAX];
    url_encode(r->table_name, enc, sizeof(enc));
    int n = snprintf(r->params, sizeof(r->params), "table_name=%s", enc);
    if (cfg->app_profile[0]) {
        char prof[3 * BENCH_NAME_MAX + 4];
        url_encode(cfg->app_profile, prof, sizeof(prof));
        snprintf(r->params + n, sizeof(r->params) - (size_t)n, "&app_profile_id=%s", prof);
    }
    r->n_md = bench_md_fill(r->md, r->params, r->tgt);
    r->values_len = (size_t)cfg->value_bytes * 2 + ((size_t)1 << 20);
    r->values = malloc(r->values_len);
    r->base = event_base_new();
    r->n_conns = cfg->conns;
    uint32_t streams = cfg->streams;
    if (r->wl == WL_LOAD && streams < BENCH_LOAD_STREAMS_MIN)
        streams = BENCH_LOAD_STREAMS_MIN;
    r->n_slots = r->n_conns * streams;
    r->conns = calloc(r->n_conns, sizeof(*r->conns));
    r->slots = calloc(r->n_slots, sizeof(*r->slots));
    r->tick = r->base ? event_new(r->base, -1, EV_PERSIST, tick_cb, r) : NULL;
    if (!r->values || !r->base || !r->conns || !r->slots || !r->tick)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting up the run");
    value_pool_fill(r);
    for (uint32_t i = 0; i < r->n_slots; i++) {
        bench_slot *s = &r->slots[i];
        s->run = r;
        s->conn = &r->conns[i % r->n_conns];
        st_rng_seed(&s->rng, cfg->seed + 0x9e3779b97f4a7c15ull * (i + 1) + r->wl);
        s->retry_ev = evtimer_new(r->base, slot_retry_cb, s);
        if (!s->retry_ev)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting up the run");
    }
    for (uint32_t i = 0; i < r->n_conns; i++)
        if (!conn_client(r, &r->conns[i], err))
            return st_err_set(err, ST_UNAVAILABLE, "cannot connect to %s:%u: %s", r->tgt->host,
                              r->tgt->port, err->msg);
    return lag_setup(r, err);
}

static void run_teardown(bench_run *r) {
    lag_teardown(r);
    if (r->storm_timer)
        event_free(r->storm_timer);
    for (uint32_t i = 0; r->conns && i < r->n_conns; i++)
        if (r->conns[i].client)
            rpc_client_free(r->conns[i].client);
    for (size_t i = 0; i < r->n_graveyard; i++)
        rpc_client_free(r->graveyard[i]);
    for (uint32_t i = 0; r->slots && i < r->n_slots; i++)
        if (r->slots[i].retry_ev)
            event_free(r->slots[i].retry_ev);
    if (r->tick)
        event_free(r->tick);
    if (r->base) {
        event_base_loop(r->base, EVLOOP_NONBLOCK); /* finish deferred bufferevent teardown */
        event_base_free(r->base);
    }
    free(r->conns);
    free(r->slots);
    free(r->values);
    st_buf_free(&r->req);
}

static void keygens_init(bench_run *r) {
    const bench_cfg *cfg = r->cfg;
    uint64_t readable = cfg->preload ? cfg->preload : 1;
    uint64_t scan_starts = readable > BENCH_SCAN_ROWS ? readable - BENCH_SCAN_ROWS + 1 : 1;
    ops_keygen_init(&r->keys_write, cfg->dist, cfg->keys);
    ops_keygen_init(&r->keys_read, cfg->dist, readable);
    ops_keygen_init(&r->keys_scan, cfg->dist, scan_starts);
}

/* Sums over the target's processes; per process into res when res is given. */
static void proc_sample(const bench_target *t, double *cpu, uint64_t *rss_peak, bool *ok,
                        bench_result *res) {
    *cpu = 0;
    *rss_peak = 0;
    *ok = false;
    for (size_t i = 0; i < t->n_pids; i++) {
        ops_proc_stat st;
        if (!ops_proc_stat_read(t->pids[i], &st))
            continue;
        *cpu += st.cpu_s;
        *rss_peak += st.rss_peak_kb;
        *ok = true;
        if (res) {
            res->proc_cpu_s[i] = st.cpu_s - res->proc_cpu_s[i]; /* holds the start value */
            res->proc_rss_peak_kb[i] = st.rss_peak_kb;
            res->proc_rss_kb[i] = st.rss_kb;
        }
    }
}

static void proc_start(const bench_target *t, bench_result *res) {
    for (size_t i = 0; i < t->n_pids; i++) {
        ops_proc_stat st;
        res->proc_cpu_s[i] = ops_proc_stat_read(t->pids[i], &st) ? st.cpu_s : 0;
    }
    res->n_procs = t->n_pids;
}

/* Connecting (TCP, HTTP/2 settings) is not part of any call's latency: before the clock starts,
 * one untimed read of a row that does not exist goes over each connection, whatever it answers. */
static void warmup_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    (void)code;
    (void)message;
    bench_run *r = arg;
    if (--r->active == 0)
        event_base_loopbreak(r->base);
}

static void run_warmup(bench_run *r) {
    Google__Bigtable__V2__RowSet set;
    google__bigtable__v2__row_set__init(&set);
    ProtobufCBinaryData key = bin("warmup", 6);
    set.n_row_keys = 1;
    set.row_keys = &key;
    Google__Bigtable__V2__ReadRowsRequest req;
    google__bigtable__v2__read_rows_request__init(&req);
    req.table_name = r->table_name;
    req.app_profile_id = (char *)r->cfg->app_profile;
    req.rows = &set;
    if (!req_pack(r, &req.base))
        return;
    r->active = 0;
    for (uint32_t i = 0; i < r->n_conns; i++)
        if (rpc_client_call(r->conns[i].client, op_path(OP_READ), st_buf_slice(&r->req), r->md,
                            r->n_md, r->cfg->timeout_ms, NULL, warmup_done, r))
            r->active++;
    if (r->active > 0)
        event_base_dispatch(r->base);
}

static void storm_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    bench_run *r = arg;
    st_err err = {0};
    if (bench_storm_start(&r->storm, r->cfg, r->tgt, &err) != ST_OK) {
        snprintf(r->res->storm_error, sizeof r->res->storm_error, "%.150s", err.msg);
        r->storm.started = true; /* nothing runs: the workload ends at its deadline */
    }
}

/* --storm on a read workload: the storm starts 40% into the run, so the calls before it give
 * the baseline its p99 is compared with. */
static void storm_schedule(bench_run *r) {
    if (!r->cfg->storm || (r->wl != WL_READ && r->wl != WL_SCAN)) {
        r->storm.started = true; /* no storm: the run behaves as without --storm */
        return;
    }
    int64_t us = (int64_t)(r->cfg->duration_s * 0.4 * 1e6);
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    r->storm_timer = evtimer_new(r->base, storm_timer_cb, r);
    if (!r->storm_timer || evtimer_add(r->storm_timer, &tv) != 0)
        storm_timer_cb(-1, 0, r);
}

static void run_loop(bench_run *r) {
    run_warmup(r);
    struct timeval sec = {1, 0};
    evtimer_add(r->tick, &sec);
    r->start_ns = r->interval_start_ns = now_ns();
    r->deadline_ns = r->start_ns + (int64_t)(r->cfg->duration_s * 1e9);
    r->active = r->n_slots;
    for (uint32_t i = 0; i < r->n_slots; i++)
        slot_issue(&r->slots[i]);
    if (r->lag.state == LAG_IDLE)
        lag_schedule(r, r->cfg->lag_interval_ms);
    storm_schedule(r);
    if (r->active > 0)
        event_base_dispatch(r->base);
    r->res->elapsed_s = (double)(now_ns() - r->start_ns) / 1e9;
    evtimer_del(r->tick);
    bench_storm_join(&r->storm, r->res);
}

st_code bench_run_workload(const bench_cfg *cfg, bench_target *t, bench_wl wl, bench_result *res,
                           st_err *err) {
    memset(res, 0, sizeof(*res));
    ops_hist_init(&res->hist);
    ops_hist_init(&res->lag);
    ops_hist_init(&res->storm_before);
    ops_hist_init(&res->storm_during);
    res->wl = wl;
    res->label = t->label;
    bench_run *r = calloc(1, sizeof(*r));
    if (!r)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    r->cfg = cfg;
    r->tgt = t;
    r->wl = wl;
    r->res = res;
    st_buf_init(&r->req);
    ops_hist_init(&r->interval);
    keygens_init(r);
    r->limit =
        wl == WL_LOAD ? (cfg->preload + BENCH_BULK_ROWS - 1) / BENCH_BULK_ROWS : cfg->requests;
    st_code rc = run_setup(r, err);
    if (rc == ST_OK) {
        double cpu0, cpu1, client0 = self_cpu_s();
        uint64_t peak;
        bool ok0, ok1;
        proc_sample(t, &cpu0, &peak, &ok0, NULL);
        proc_start(t, res);
        run_loop(r);
        proc_sample(t, &cpu1, &peak, &ok1, res);
        res->client_cpu_s = self_cpu_s() - client0;
        res->proc_ok = ok0 && ok1;
        res->cpu_s = cpu1 - cpu0;
        res->rss_peak_kb = peak;
    }
    run_teardown(r);
    free(r);
    return rc;
}

/* ---- table setup ---- */

st_code bench_table_ensure(const bench_cfg *cfg, const bench_target *t, st_err *err) {
    Google__Bigtable__Admin__V2__GcRule gc;
    google__bigtable__admin__v2__gc_rule__init(&gc);
    gc.rule_case = GOOGLE__BIGTABLE__ADMIN__V2__GC_RULE__RULE_MAX_NUM_VERSIONS;
    gc.max_num_versions = 1;
    Google__Bigtable__Admin__V2__ColumnFamily fam;
    google__bigtable__admin__v2__column_family__init(&fam);
    fam.gc_rule = &gc;
    Google__Bigtable__Admin__V2__Table__ColumnFamiliesEntry entry, *ep = &entry;
    google__bigtable__admin__v2__table__column_families_entry__init(&entry);
    entry.key = "f";
    entry.value = &fam;
    Google__Bigtable__Admin__V2__Table table;
    google__bigtable__admin__v2__table__init(&table);
    table.n_column_families = 1;
    table.column_families = &ep;
    char parent[2 * BENCH_NAME_MAX + 32];
    snprintf(parent, sizeof(parent), "projects/%s/instances/%s", cfg->project, cfg->instance);
    Google__Bigtable__Admin__V2__CreateTableRequest req;
    google__bigtable__admin__v2__create_table_request__init(&req);
    req.parent = parent;
    req.table_id = (char *)cfg->table;
    req.table = &table;
    st_buf packed, resp;
    st_buf_init(&packed);
    st_buf_init(&resp);
    size_t len = google__bigtable__admin__v2__create_table_request__get_packed_size(&req);
    st_code rc = st_buf_reserve(&packed, len);
    if (rc == ST_OK) {
        packed.len = google__bigtable__admin__v2__create_table_request__pack(&req, packed.data);
        char addr[OPS_ADDR_MAX + 16];
        snprintf(addr, sizeof(addr), strchr(t->host, ':') ? "[%s]:%u" : "%s:%u", t->host, t->port);
        rpc_metadata md[2];
        size_t n_md = bench_md_fill(md, "", t);
        rc = rpc_blocking_unary(
            addr, &t->copts, "/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable",
            st_buf_slice(&packed), md + 1, n_md - 1, BENCH_ADMIN_TIMEOUT_MS, &resp, err);
        if (rc == ST_ALREADY_EXISTS && err)
            *err = (st_err){0}; /* not a failure: the caller checks err.code at the end */
        if (rc == ST_ALREADY_EXISTS)
            rc = ST_OK;
        else if (rc != ST_OK)
            st_err_prefix(err, "creating table %s/tables/%s on %s: ", parent, cfg->table, addr);
    }
    st_buf_free(&packed);
    st_buf_free(&resp);
    return rc;
}

st_code bench_profile_ensure(const bench_cfg *cfg, const bench_target *t, const char *id,
                             const char *cluster, st_err *err) {
    Google__Bigtable__Admin__V2__AppProfile__SingleClusterRouting single;
    google__bigtable__admin__v2__app_profile__single_cluster_routing__init(&single);
    single.cluster_id = (char *)cluster;
    Google__Bigtable__Admin__V2__AppProfile prof;
    google__bigtable__admin__v2__app_profile__init(&prof);
    prof.routing_policy_case =
        GOOGLE__BIGTABLE__ADMIN__V2__APP_PROFILE__ROUTING_POLICY_SINGLE_CLUSTER_ROUTING;
    prof.single_cluster_routing = &single;
    prof.description = "strata bench: replication lag probe reads";
    char parent[2 * BENCH_NAME_MAX + 32];
    snprintf(parent, sizeof(parent), "projects/%s/instances/%s", cfg->project, cfg->instance);
    Google__Bigtable__Admin__V2__CreateAppProfileRequest req;
    google__bigtable__admin__v2__create_app_profile_request__init(&req);
    req.parent = parent;
    req.app_profile_id = (char *)id;
    req.app_profile = &prof;
    req.ignore_warnings = true;
    st_buf packed, resp;
    st_buf_init(&packed);
    st_buf_init(&resp);
    size_t len = google__bigtable__admin__v2__create_app_profile_request__get_packed_size(&req);
    st_code rc = st_buf_reserve(&packed, len);
    if (rc == ST_OK) {
        packed.len =
            google__bigtable__admin__v2__create_app_profile_request__pack(&req, packed.data);
        char addr[OPS_ADDR_MAX + 16];
        snprintf(addr, sizeof(addr), strchr(t->host, ':') ? "[%s]:%u" : "%s:%u", t->host, t->port);
        rpc_metadata md[2];
        size_t n_md = bench_md_fill(md, "", t);
        rc = rpc_blocking_unary(
            addr, &t->copts, "/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile",
            st_buf_slice(&packed), md + 1, n_md - 1, BENCH_ADMIN_TIMEOUT_MS, &resp, err);
        if (rc == ST_ALREADY_EXISTS && err)
            *err = (st_err){0}; /* not a failure: the caller checks err.code at the end */
        if (rc == ST_ALREADY_EXISTS)
            rc = ST_OK;
        else if (rc != ST_OK)
            st_err_prefix(err, "creating app profile %s (single-cluster routing to %s) on %s: ", id,
                          cluster, addr);
    }
    st_buf_free(&packed);
    st_buf_free(&resp);
    return rc;
}
