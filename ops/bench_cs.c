/* ops/bench_cs.c — the `changes` workload of `strata bench` (docs/strata-bench.md): what change
 * streams cost writers and what a consumer gets.
 *
 * On its own table TABLE-cs (streams on, retention 1 day), written and read through a
 * single-cluster app profile:
 *   1. backlog: --cs-backlog N MutateRows (unique rows "cs" + 14 digits) at --conns x --streams,
 *      then one consumer (ops/changes_stream.c, as `strata changes`, but keys_only: it matches
 *      rows, so DataChange messages are read at the wire level) reads from before the first
 *      write to after the last: the catch-up time and changes/s, and every written row must be
 *      there;
 *   2. live: the consumer follows the stream while the writers run for --duration / --requests;
 *      change latency = the record received - the write's acknowledgement, matched by row key
 *      (both on the bench's monotonic clock); every acknowledged row must arrive within
 *      BENCH_CS_GRACE_MS after the writers stop, else it counts as lost;
 *   3. with --cs-compare, the same live writes on TABLE-nocs (streams off), without a consumer:
 *      the write throughput ratio on / off is the write cost of streams, and the CPU per write
 *      of the servers and of this process (writers, plus the consumer with streams on) in both
 *      phases say where it goes. With --rounds N (and --duration) steps 2 and 3 alternate in N
 *      slices of duration/N each, the consumer open throughout (idle in the off slices): a
 *      drift of the machine over the run then weighs on both sides alike.
 * Failed writes count by gRPC code, failed or retried streams under UNAVAILABLE (or their code),
 * lost or missing changes under VERIFY. */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_run.h"
#include "changes.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define BENCH_CS_KEY_PREFIX "cs"
#define BENCH_CS_KEY_BYTES 16 /* "cs" + 14 digits */
#define BENCH_CS_GRACE_MS 30000
#define BENCH_CS_RETENTION_US (24LL * 3600 * 1000000)
#define BENCH_CS_HEARTBEAT_S 1
#define BENCH_CS_CATCHUP_MARGIN_US 1000
#define BENCH_CS_RSS_PERIOD_MS 200

typedef struct cs_bench cs_bench;

typedef struct cs_slot {
    cs_bench *b;
    uint32_t conn;
    uint64_t seq;
    int64_t t0_ns;
    struct event *retry;
} cs_slot;

struct cs_bench {
    const bench_cfg *cfg;
    bench_target *t;
    bench_result *res;
    struct event_base *base;
    rpc_client **clients;
    uint32_t n_conns;
    cs_slot *slots;
    uint32_t n_slots, active;
    char table[4 * BENCH_NAME_MAX], params[8 * BENCH_NAME_MAX];
    char table_on[4 * BENCH_NAME_MAX], table_off[4 * BENCH_NAME_MAX];
    uint32_t rounds; /* on/off slices each (bench_cs_run) */
    const char *profile;
    rpc_metadata md[2];
    size_t n_md;
    st_buf req;
    uint8_t *value;
    /* the current write phase */
    uint64_t next_seq, seq_end; /* seq_end 0: until deadline */
    int64_t deadline_ns;
    bool live; /* latencies go into res->hist, ack times are kept for matching */
    uint64_t ok, failed;
    /* matching writes and records, by seq */
    int64_t *ack_ns, *recv_ns;
    uint64_t cap;
    uint64_t acked_live, received_live, received_backlog;
    uint64_t backlog_first, backlog_end, live_first;
    /* the consumer */
    ops_cs *cs;
    bool cs_done;
    st_code cs_code;
    char cs_msg[ST_ERR_MSG_MAX];
    struct event *grace;
    bool grace_over;
    struct event *guard; /* the backlog phase's */
    uint64_t guard_seen; /* backlog changes received at its last check */
    struct event *rss_timer;
    double off_s;  /* time of the streams-off writes */
    bool off_done; /* they alternated with the live ones */
};

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void count_error(cs_bench *b, int slot, const char *what) {
    bench_result *res = b->res;
    res->errors[slot]++;
    res->errors_total++;
    if (!res->first_error[0])
        snprintf(res->first_error, sizeof res->first_error, "%s: %.280s",
                 slot == BENCH_ERR_VERIFY ? "VERIFY" : st_code_name((st_code)slot), what);
}

static bool seq_room(cs_bench *b, uint64_t seq) {
    if (seq < b->cap)
        return true;
    uint64_t cap = b->cap ? b->cap : 1024;
    while (cap <= seq)
        cap *= 2;
    int64_t *a = realloc(b->ack_ns, cap * sizeof(*a));
    if (a)
        b->ack_ns = a;
    int64_t *r = a ? realloc(b->recv_ns, cap * sizeof(*r)) : NULL;
    if (!r)
        return false;
    b->recv_ns = r;
    memset(a + b->cap, 0, (cap - b->cap) * sizeof(*a));
    memset(r + b->cap, 0, (cap - b->cap) * sizeof(*r));
    b->cap = cap;
    return true;
}

/* ---- the target's processes ---- */

/* CPU seconds of the target's processes so far; false when one cannot be read. */
static bool procs_cpu(const bench_target *t, double *cpu) {
    *cpu = 0;
    for (size_t i = 0; i < t->n_pids; i++) {
        ops_proc_stat st;
        if (!ops_proc_stat_read(t->pids[i], &st))
            return false;
        *cpu += st.cpu_s;
    }
    return t->n_pids > 0;
}

static double self_cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* Keeps the largest RSS of a node seen so far. */
static void rss_sample(cs_bench *b) {
    const bench_target *t = b->t;
    for (size_t i = 0; i < t->n_pids; i++) {
        ops_proc_stat st;
        if (strcmp(t->pid_names[i], "router") == 0 || !ops_proc_stat_read(t->pids[i], &st) ||
            st.rss_kb <= b->res->cs_node_rss_peak_kb)
            continue;
        b->res->cs_node_rss_peak_kb = st.rss_kb;
        if (t->pid_names[i][0])
            snprintf(b->res->cs_node_rss_name, sizeof b->res->cs_node_rss_name, "%s",
                     t->pid_names[i]);
        else
            snprintf(b->res->cs_node_rss_name, sizeof b->res->cs_node_rss_name, "pid %d",
                     (int)t->pids[i]);
    }
}

static void rss_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rss_sample(arg);
}

/* ---- writers ---- */

static void slot_issue(cs_slot *s);

static void slot_retry_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    slot_issue(arg);
}

static void slot_idle(cs_bench *b) {
    if (--b->active == 0)
        event_base_loopbreak(b->base);
}

static void write_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    cs_slot *s = arg;
    cs_bench *b = s->b;
    int64_t now = mono_ns();
    if (code != ST_OK) {
        b->failed++;
        count_error(b, code <= ST_UNAUTHENTICATED ? (int)code : ST_UNKNOWN, message);
        struct timeval tv = {0, 20000};
        if (evtimer_add(s->retry, &tv) != 0)
            slot_idle(b);
        return;
    }
    b->ok++;
    if (b->live) {
        ops_hist_record(&b->res->hist, (uint64_t)(now - s->t0_ns));
        b->res->calls++;
        b->res->rows++;
        b->res->bytes += BENCH_CS_KEY_BYTES + b->cfg->value_bytes;
        if (seq_room(b, s->seq)) {
            b->ack_ns[s->seq] = now;
            b->acked_live++;
            if (b->recv_ns[s->seq]) /* the record came before the acknowledgement */
                ops_hist_record(&b->res->cs_lat, 0);
        }
    }
    slot_issue(s);
}

static bool build_write(cs_bench *b, uint64_t seq) {
    char key[BENCH_CS_KEY_BYTES + 1];
    snprintf(key, sizeof key, BENCH_CS_KEY_PREFIX "%014llu", (unsigned long long)seq);
    Google__Bigtable__V2__Mutation__SetCell sc;
    google__bigtable__v2__mutation__set_cell__init(&sc);
    sc.family_name = "f";
    sc.column_qualifier = (ProtobufCBinaryData){1, (uint8_t *)"q"};
    sc.timestamp_micros = b->cfg->timestamp_us;
    sc.value = (ProtobufCBinaryData){b->cfg->value_bytes, b->value};
    Google__Bigtable__V2__Mutation m, *mp = &m;
    google__bigtable__v2__mutation__init(&m);
    m.mutation_case = GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL;
    m.set_cell = &sc;
    Google__Bigtable__V2__MutateRowRequest req;
    google__bigtable__v2__mutate_row_request__init(&req);
    req.table_name = b->table;
    req.app_profile_id = (char *)b->profile;
    req.row_key = (ProtobufCBinaryData){BENCH_CS_KEY_BYTES, (uint8_t *)key};
    req.n_mutations = 1;
    req.mutations = &mp;
    size_t len = google__bigtable__v2__mutate_row_request__get_packed_size(&req);
    st_buf_reset(&b->req);
    if (st_buf_reserve(&b->req, len + 1) != ST_OK)
        return false;
    b->req.len = google__bigtable__v2__mutate_row_request__pack(&req, b->req.data);
    return true;
}

static rpc_client *client_for(cs_bench *b, uint32_t i) {
    if (b->clients[i] && rpc_client_alive(b->clients[i]))
        return b->clients[i];
    if (b->clients[i] && rpc_client_calls(b->clients[i]) > 0)
        return NULL; /* still finishing: the slot retries after its backoff */
    if (b->clients[i])
        rpc_client_free(b->clients[i]);
    b->clients[i] = rpc_client_new(b->base, b->t->host, b->t->port, &b->t->copts, NULL);
    return b->clients[i];
}

static void slot_issue(cs_slot *s) {
    cs_bench *b = s->b;
    bool more = b->seq_end ? b->next_seq < b->seq_end : mono_ns() < b->deadline_ns;
    if (!more || bench_stop_requested()) {
        slot_idle(b);
        return;
    }
    rpc_client *c = client_for(b, s->conn);
    struct timeval tv = {0, 20000};
    if (!c) { /* the old connection still finishes its calls: not a failed call */
        if (evtimer_add(s->retry, &tv) != 0)
            slot_idle(b);
        return;
    }
    s->seq = b->next_seq++;
    s->t0_ns = mono_ns();
    if (!build_write(b, s->seq) ||
        !rpc_client_call(c, "/google.bigtable.v2.Bigtable/MutateRow", st_buf_slice(&b->req), b->md,
                         b->n_md, b->cfg->timeout_ms, NULL, write_done, s)) {
        b->failed++;
        count_error(b, ST_UNAVAILABLE, "cannot start a MutateRow (connection closed)");
        if (evtimer_add(s->retry, &tv) != 0)
            slot_idle(b);
    }
}

/* Writes seq [next_seq, seq_end) (seq_end 0: until duration_s); returns when all are done. */
static void write_phase(cs_bench *b, uint64_t seq_end, double duration_s) {
    b->seq_end = seq_end;
    b->deadline_ns = mono_ns() + (int64_t)(duration_s * 1e9);
    b->active = b->n_slots;
    for (uint32_t i = 0; i < b->n_slots; i++)
        slot_issue(&b->slots[i]);
    while (b->active > 0) /* the consumer's loopbreaks only wake this loop */
        event_base_loop(b->base, EVLOOP_ONCE);
}

/* ---- the consumer ---- */

static bool on_change(const ops_cs_change *c, void *arg) {
    cs_bench *b = arg;
    if (c->row.len != BENCH_CS_KEY_BYTES || memcmp(c->row.data, BENCH_CS_KEY_PREFIX, 2) != 0)
        return true;
    uint64_t seq = 0;
    for (size_t i = 2; i < BENCH_CS_KEY_BYTES; i++)
        seq = seq * 10 + (uint64_t)(c->row.data[i] - '0');
    if (!seq_room(b, seq) || b->recv_ns[seq])
        return true; /* at least once: a repeat is not counted twice */
    int64_t now = mono_ns();
    b->recv_ns[seq] = now;
    if (seq >= b->backlog_first && seq < b->backlog_end)
        b->received_backlog++;
    else if (seq >= b->live_first) {
        b->received_live++;
        if (b->ack_ns[seq])
            ops_hist_record(&b->res->cs_lat, (uint64_t)(now - b->ack_ns[seq]));
        if (b->grace && b->received_live >= b->acked_live && b->active == 0)
            event_base_loopbreak(b->base);
    }
    return true;
}

static void on_done(st_code code, const char *msg, void *arg) {
    cs_bench *b = arg;
    b->cs_done = true;
    b->cs_code = code;
    snprintf(b->cs_msg, sizeof b->cs_msg, "%s", msg);
    event_base_loopbreak(b->base);
}

static void on_retry(const char *msg, void *arg) {
    count_error(arg, ST_UNAVAILABLE, msg);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    cs_bench *b = arg;
    b->grace_over = true;
    event_base_loopbreak(b->base);
}

/* The backlog's guard: the consumer is given up on only after a grace period without a new
 * backlog change (a large backlog may take longer than one period to catch up). */
static void backlog_guard_cb(evutil_socket_t fd, short what, void *arg) {
    cs_bench *b = arg;
    if (b->received_backlog == b->guard_seen) {
        grace_cb(fd, what, arg);
        return;
    }
    b->guard_seen = b->received_backlog;
    struct timeval tv = {BENCH_CS_GRACE_MS / 1000, 0};
    if (evtimer_add(b->guard, &tv) != 0)
        grace_cb(fd, what, arg);
}

static st_code consumer_start(cs_bench *b, int64_t start_us, int64_t stop_us, st_err *err) {
    char addr[OPS_ADDR_MAX + 16];
    snprintf(addr, sizeof addr, strchr(b->t->host, ':') ? "[%s]:%u" : "%s:%u", b->t->host,
             b->t->port);
    ops_cs_opts o = {.addr = addr,
                     .table = b->table_on,
                     .app_profile = b->profile,
                     .start_us = start_us,
                     .end_us = stop_us,
                     .stop_us = stop_us,
                     .heartbeat_s = BENCH_CS_HEARTBEAT_S,
                     .on_change = on_change,
                     .on_done = on_done,
                     .on_retry = on_retry,
                     .arg = b,
                     .copts = &b->t->copts,                              /* --tls, --secure */
                     .authorization = b->t->auth[0] ? b->t->auth : NULL, /* --token */
                     .keys_only = true}; /* it matches rows only: no mutations decoded */
    b->cs_done = false;
    b->cs = ops_cs_new(b->base, &o, err);
    if (!b->cs)
        return err->code;
    return ops_cs_start(b->cs, NULL, 0, err);
}

/* Ends the consumer (after it finished by itself or is stopped now) and frees it. */
static void consumer_end(cs_bench *b) {
    if (!b->cs)
        return;
    if (!b->cs_done) {
        ops_cs_stop(b->cs);
        while (!b->cs_done)
            event_base_loop(b->base, EVLOOP_ONCE);
    }
    if (b->cs_code != ST_OK)
        count_error(b, (int)b->cs_code <= ST_UNAUTHENTICATED ? (int)b->cs_code : ST_UNKNOWN,
                    b->cs_msg);
    ops_cs_free(b->cs);
    b->cs = NULL;
}

/* ---- phases ---- */

static void phase_backlog(cs_bench *b, st_err *err) {
    const bench_cfg *cfg = b->cfg;
    b->backlog_first = b->next_seq;
    int64_t start_us = st_wall_us() - BENCH_CS_CATCHUP_MARGIN_US;
    write_phase(b, b->next_seq + cfg->cs_backlog, 0);
    b->backlog_end = b->next_seq;
    uint64_t written = b->ok;
    double cpu0, cpu1, self0 = self_cpu_s();
    bool cpu_ok = procs_cpu(b->t, &cpu0);
    int64_t t0 = mono_ns();
    if (consumer_start(b, start_us, st_wall_us(), err) != ST_OK)
        return;
    /* a consumer that makes no progress (a stream failing over and over) is given up on after
     * a grace period without a new change: what it did not deliver counts as missing */
    b->grace_over = false;
    b->guard_seen = b->received_backlog;
    b->guard = evtimer_new(b->base, backlog_guard_cb, b);
    struct timeval tv = {BENCH_CS_GRACE_MS / 1000, 0};
    if (b->guard)
        evtimer_add(b->guard, &tv);
    while (!b->cs_done && !b->grace_over && !bench_stop_requested())
        event_base_loop(b->base, EVLOOP_ONCE);
    if (b->guard)
        event_free(b->guard);
    b->guard = NULL;
    b->res->cs_catchup_s = (double)(mono_ns() - t0) / 1e9;
    b->res->cs_catchup_cpu_ok = cpu_ok && procs_cpu(b->t, &cpu1);
    b->res->cs_catchup_cpu_s = b->res->cs_catchup_cpu_ok ? cpu1 - cpu0 : 0;
    b->res->cs_catchup_client_cpu_s = self_cpu_s() - self0;
    consumer_end(b);
    b->res->cs_backlog = written;
    b->res->cs_backlog_received = b->received_backlog;
    if (b->received_backlog < written) {
        char what[160];
        snprintf(what, sizeof what, "%llu of %llu backlog changes missing from the stream",
                 (unsigned long long)(written - b->received_backlog), (unsigned long long)written);
        count_error(b, BENCH_ERR_VERIFY, what);
    }
}

/* One stretch of writes with streams on: latencies and acknowledgements kept for matching,
 * time and CPU added to the streams-on figures. */
static void slice_on(cs_bench *b, double duration_s) {
    const bench_cfg *cfg = b->cfg;
    snprintf(b->table, sizeof b->table, "%s", b->table_on);
    b->live = true;
    double cpu0, cpu1, self0 = self_cpu_s();
    bool cpu_ok = procs_cpu(b->t, &cpu0);
    int64_t t0 = mono_ns();
    write_phase(b, cfg->requests ? b->next_seq + cfg->requests : 0, duration_s);
    b->res->elapsed_s += (double)(mono_ns() - t0) / 1e9;
    b->res->cs_cpu_ok = b->res->cs_cpu_ok && cpu_ok && procs_cpu(b->t, &cpu1);
    b->res->cs_on_cpu_s += b->res->cs_cpu_ok ? cpu1 - cpu0 : 0;
    b->res->cs_on_client_cpu_s += self_cpu_s() - self0;
    b->live = false;
}

/* One stretch of the same writes on TABLE-nocs (streams off): the write cost ratio's other
 * side. */
static void slice_off(cs_bench *b, double duration_s) {
    const bench_cfg *cfg = b->cfg;
    snprintf(b->table, sizeof b->table, "%s", b->table_off);
    uint64_t ok0 = b->ok;
    double cpu0, cpu1, self0 = self_cpu_s();
    bool cpu_ok = procs_cpu(b->t, &cpu0);
    int64_t t0 = mono_ns();
    write_phase(b, cfg->requests ? b->next_seq + cfg->requests : 0, duration_s);
    b->off_s += (double)(mono_ns() - t0) / 1e9;
    b->res->cs_cpu_ok = b->res->cs_cpu_ok && cpu_ok && procs_cpu(b->t, &cpu1);
    b->res->cs_off_cpu_s += b->res->cs_cpu_ok ? cpu1 - cpu0 : 0;
    b->res->cs_off_client_cpu_s += self_cpu_s() - self0;
    b->res->cs_off_calls += b->ok - ok0;
    b->res->cs_off_ops_s = b->off_s > 0 ? (double)b->res->cs_off_calls / b->off_s : 0;
}

static void phase_live(cs_bench *b, st_err *err) {
    const bench_cfg *cfg = b->cfg;
    b->live_first = b->next_seq;
    if (consumer_start(b, st_wall_us(), 0, err) != ST_OK)
        return;
    b->res->cs_cpu_ok = true;
    uint32_t slices = b->rounds > 1 && cfg->cs_compare && !cfg->requests ? b->rounds : 1;
    for (uint32_t k = 0; k < slices && !bench_stop_requested(); k++) {
        slice_on(b, cfg->duration_s / slices);
        if (slices > 1)
            slice_off(b, cfg->duration_s / slices);
    }
    b->off_done = slices > 1;
    b->grace_over = false;
    b->grace = evtimer_new(b->base, grace_cb, b);
    struct timeval tv = {BENCH_CS_GRACE_MS / 1000, 0};
    if (b->grace)
        evtimer_add(b->grace, &tv);
    while (b->grace && b->received_live < b->acked_live && !b->grace_over && !b->cs_done &&
           !bench_stop_requested())
        event_base_loop(b->base, EVLOOP_ONCE);
    if (b->grace)
        event_free(b->grace);
    b->grace = NULL;
    consumer_end(b);
    uint64_t lost = b->acked_live > b->received_live ? b->acked_live - b->received_live : 0;
    b->res->cs_lost = lost;
    if (lost) {
        char what[160];
        snprintf(what, sizeof what, "%llu acknowledged writes never came out of the stream",
                 (unsigned long long)lost);
        count_error(b, BENCH_ERR_VERIFY, what);
    }
}

/* ---- setup ---- */

/* TABLE-cs with streams on, and TABLE-nocs when comparing. */
static st_code tables_prepare(const bench_cfg *cfg, const bench_target *t, st_err *err) {
    bench_cfg c = *cfg;
    snprintf(c.table, sizeof c.table, "%.200s-cs", cfg->table);
    st_code rc = bench_table_ensure(&c, t, err);
    char addr[OPS_ADDR_MAX + 16], name[4 * BENCH_NAME_MAX];
    snprintf(addr, sizeof addr, strchr(t->host, ':') ? "[%s]:%u" : "%s:%u", t->host, t->port);
    snprintf(name, sizeof name, "projects/%s/instances/%s/tables/%s", c.project, c.instance,
             c.table);
    if (rc == ST_OK && (rc = ops_cs_set_retention_auth(addr, &t->copts, t->auth[0] ? t->auth : NULL,
                                                       name, BENCH_CS_RETENTION_US, err)) != ST_OK)
        st_err_prefix(err, "turning change streams on: ");
    if (rc == ST_OK && cfg->cs_compare) {
        snprintf(c.table, sizeof c.table, "%.200s-nocs", cfg->table);
        rc = bench_table_ensure(&c, t, err);
    }
    return rc;
}

static st_code cs_setup(cs_bench *b, st_err *err) {
    const bench_cfg *cfg = b->cfg;
    snprintf(b->table_on, sizeof b->table_on, "projects/%s/instances/%s/tables/%s-cs", cfg->project,
             cfg->instance, cfg->table);
    snprintf(b->table_off, sizeof b->table_off, "projects/%s/instances/%s/tables/%s-nocs",
             cfg->project, cfg->instance, cfg->table);
    snprintf(b->table, sizeof b->table, "%s", b->table_on);
    b->profile = cfg->cs_profile[0] ? cfg->cs_profile : cfg->app_profile;
    snprintf(b->params, sizeof b->params, "app_profile_id=%s", b->profile);
    b->n_md = bench_md_fill(b->md, b->params, b->t);
    b->base = event_base_new();
    b->n_conns = cfg->conns;
    b->n_slots = cfg->conns * cfg->streams;
    b->clients = calloc(b->n_conns, sizeof(*b->clients));
    b->slots = calloc(b->n_slots, sizeof(*b->slots));
    b->value = malloc(cfg->value_bytes + 1);
    if (!b->base || !b->clients || !b->slots || !b->value)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting up the run");
    st_rng rng;
    st_rng_seed(&rng, cfg->seed);
    for (uint32_t i = 0; i < cfg->value_bytes; i++)
        b->value[i] = (uint8_t)st_rng_next(&rng);
    b->rss_timer = event_new(b->base, -1, EV_PERSIST, rss_timer_cb, b);
    struct timeval period = {0, BENCH_CS_RSS_PERIOD_MS * 1000};
    if (!b->rss_timer || event_add(b->rss_timer, &period) != 0)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting up the run");
    rss_sample(b);
    for (uint32_t i = 0; i < b->n_slots; i++) {
        b->slots[i] = (cs_slot){.b = b, .conn = i % b->n_conns};
        b->slots[i].retry = evtimer_new(b->base, slot_retry_cb, &b->slots[i]);
        if (!b->slots[i].retry)
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory setting up the run");
    }
    return ST_OK;
}

static void cs_teardown(cs_bench *b) {
    if (b->rss_timer) {
        rss_sample(b);
        event_free(b->rss_timer);
    }
    for (uint32_t i = 0; b->clients && i < b->n_conns; i++)
        if (b->clients[i])
            rpc_client_free(b->clients[i]);
    for (uint32_t i = 0; b->slots && i < b->n_slots; i++)
        if (b->slots[i].retry)
            event_free(b->slots[i].retry);
    if (b->base) {
        event_base_loop(b->base, EVLOOP_NONBLOCK);
        event_base_free(b->base);
    }
    free(b->clients);
    free(b->slots);
    free(b->value);
    free(b->ack_ns);
    free(b->recv_ns);
    st_buf_free(&b->req);
}

st_code bench_cs_run(const bench_cfg *cfg, uint32_t rounds, bench_target *t, bench_result *res,
                     st_err *err) {
    memset(res, 0, sizeof(*res));
    ops_hist_init(&res->hist);
    ops_hist_init(&res->lag);
    ops_hist_init(&res->cs_lat);
    res->wl = WL_CHANGES;
    res->label = t->label;
    st_code rc = tables_prepare(cfg, t, err);
    if (rc != ST_OK)
        return rc;
    cs_bench *b = calloc(1, sizeof *b);
    if (!b)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    b->cfg = cfg;
    b->rounds = rounds;
    b->t = t;
    b->res = res;
    st_buf_init(&b->req);
    rc = cs_setup(b, err);
    if (rc == ST_OK && cfg->cs_backlog)
        phase_backlog(b, err);
    if (rc == ST_OK && err->code == ST_OK && !bench_stop_requested())
        phase_live(b, err);
    if (rc == ST_OK && err->code == ST_OK && cfg->cs_compare && !b->off_done &&
        !bench_stop_requested())
        slice_off(b, cfg->duration_s); /* after the live phase (one slice each) */
    rc = err->code;
    consumer_end(b);
    cs_teardown(b);
    free(b);
    return rc;
}
