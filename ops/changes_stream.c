/* ops/changes_stream.c — the change-stream consumer (ops/changes.h): every partition of a table
 * read at once over HTTP/2 connections to the router (CS_CONN_STREAMS streams each), on one
 * libevent loop.
 *
 * A partition ("part") knows where it resumes from (`from`: one start time, or the tokens that
 * cover its range) and replaces that position with each token it receives, after the change it
 * follows went to the callback: a position never gets ahead of what was delivered, so resuming
 * from it is at least once. CloseStream OUT_OF_RANGE retires the part: its tokens wait in
 * `pending` until they cover one of the new partitions exactly (a split gives each child its
 * token at once; a merge waits for both parents). Transient failures (UNAVAILABLE, a dropped
 * connection...) reopen the part from its position after a backoff. Every open goes through the
 * part's timer, so nothing is started from inside an rpc callback. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "certs.h"
#include "changes.h"
#include "google/bigtable/admin/v2/bigtable_table_admin.pb-c.h"
#include "google/bigtable/v2/bigtable.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "strata/btutil.h"
#include "strata/rpc.h"

#define CS_PATH_GEN "/google.bigtable.v2.Bigtable/GenerateInitialChangeStreamPartitions"
#define CS_PATH_READ "/google.bigtable.v2.Bigtable/ReadChangeStream"
#define CS_BACKOFF_MIN_MS 100
#define CS_BACKOFF_MAX_MS 5000
#define CS_GEN_TIMEOUT_MS 30000
/* Calls one connection carries at most. The router lets a connection open 256 streams at once
 * (SETTINGS_MAX_CONCURRENT_STREAMS, strata-router --max-streams-per-connection); calls past the
 * server's limit wait in the client until an open one ends, which a --follow stream never does,
 * so a table of more partitions is spread over more connections. 100 is the least HTTP/2
 * (RFC 9113, 6.5.2) advises servers to allow. */
#define CS_CONN_STREAMS 100
/* A partition whose stream failed this many times in a row (no message in between) makes the
 * consumer ask the router about the table itself (GenerateInitialChangeStreamPartitions), again
 * at each later failure (one such call at a time; failures then come CS_BACKOFF_MAX_MS apart):
 * an error that only looks transient (UNAVAILABLE "no tablet holds the partition" for a table
 * deleted or with streams turned off) ends the command with what the table's answer says,
 * instead of being retried without end while the other partitions' heartbeats keep the run
 * looking alive. */
#define CS_PROBE_FAILURES 4
#define CS_RANGE_TEXT_MAX 176 /* "partition [\"a\", \"b\")" with keys cut to fit */
#define CS_PARAMS_MAX 2048
#define CS_ADMIN_TIMEOUT_MS 60000
#define CS_UPDATE_TABLE "/google.bigtable.admin.v2.BigtableTableAdmin/UpdateTable"
/* Responses are unpacked into one arena (a DataChange unpacked with malloc took a dozen
 * allocations); it is emptied once it holds more than this. */
#define CS_PB_ARENA_BLOCK_BYTES ((size_t)16 << 10)
#define CS_PB_ARENA_KEEP_BYTES ((size_t)256 << 10)

typedef Google__Bigtable__V2__ReadChangeStreamResponse cs_resp;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__DataChange cs_dc;
typedef Google__Bigtable__V2__ReadChangeStreamResponse__MutationChunk cs_chunk;

typedef enum part_state { P_WAIT = 0, P_OPEN, P_DONE, P_GONE } part_state;

typedef struct cs_mod {
    ops_cs_op op;
    st_buf family, qualifier, value;
    int64_t ts, start, end;
    int64_t chunk_size; /* chunked value: its announced size (0 = not chunked) */
} cs_mod;

typedef struct cs_part {
    ops_cs *cs;
    struct cs_part *next;
    st_buf start, end;
    ops_cs_pos *from; /* where to resume: tokens covering [start, end), or one start time */
    size_t n_from;
    part_state state;
    rpc_ccall *call;
    bool streaming; /* the open call got a message: the server serves it */
    struct event *timer;
    uint32_t failures;                   /* consecutive, for the backoff */
    char last_error[ST_ERR_MSG_MAX / 2]; /* the last failure, for the probe's message */
    int64_t wm_us;
    /* the change being assembled */
    bool in_change, in_chunk;
    st_buf row;
    char cluster[128];
    ops_cs_type type;
    int64_t commit_us;
    int32_t tiebreaker;
    cs_mod *mods;
    size_t n_mods, cap_mods;
    ops_cs_mod *view; /* ops_cs_mod pointing into mods, for the callback */
} cs_part;

struct ops_cs {
    struct event_base *base;
    ops_cs_opts o;
    char *table, *profile, *addr;
    char params[CS_PARAMS_MAX];
    rpc_client **conns; /* live connections, each with up to CS_CONN_STREAMS calls */
    size_t n_conns;
    rpc_client **dead; /* failed connections, freed when their calls are gone */
    size_t n_dead;
    cs_part *parts;
    ops_cs_pos *pending; /* tokens of closed parts waiting for a new partition to cover */
    size_t n_pending;
    ops_cs_pos *wanted; /* new partitions not opened yet (range only) */
    size_t n_wanted;
    rpc_ccall *gen_call;
    uint32_t gen_failures;
    struct event *gen_timer, *done_timer;
    rpc_ccall *probe_call; /* GenerateInitial... asked for a partition that keeps failing */
    cs_part *probe_part;   /* that partition (parts live until ops_cs_free) */
    struct event *probe_timer;
    size_t open_calls;
    bool finishing, done_sent;
    bool answered; /* the router answered a call: a connection it closes later is a restart */
    st_code final_code;
    char final_msg[ST_ERR_MSG_MAX];
    uint64_t records, retries;
    /* Progress of the streams themselves (a message, a partition finished): `strata changes`
     * sees stalls. The partition list is not progress: the router serves it from its tablet map
     * even while every node of the cluster is down. */
    uint64_t answers;
    st_buf req;
    st_buf token;      /* keys_only: the token of the message being handled, NUL-terminated */
    st_arena pb_arena; /* the response being handled (part_msg) */
};

/* ---- small helpers ---- */

static int64_t ts_us(const Google__Protobuf__Timestamp *t) {
    return t ? t->seconds * 1000000 + t->nanos / 1000 : 0;
}

static bool buf_set(st_buf *b, const void *data, size_t len) {
    st_buf_reset(b);
    return st_buf_append(b, data, len) == ST_OK;
}

static bool pos_copy(ops_cs_pos *dst, const ops_cs_pos *src) {
    memset(dst, 0, sizeof *dst);
    dst->start_us = src->start_us;
    bool ok = buf_set(&dst->start, src->start.data, src->start.len) &&
              buf_set(&dst->end, src->end.data, src->end.len);
    if (ok && src->token)
        ok = (dst->token = strdup(src->token)) != NULL;
    if (!ok)
        ops_cs_pos_free(dst);
    return ok;
}

static void pos_array_free(ops_cs_pos *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        ops_cs_pos_free(&p[i]);
    free(p);
}

/* A RowRange into [start, end) (an open start or a closed end are turned into the equivalent
 * closed start / open end by appending a 0x00 byte). */
static bool range_get(const Google__Bigtable__V2__StreamPartition *sp, st_buf *start, st_buf *end) {
    st_buf_reset(start);
    st_buf_reset(end);
    const Google__Bigtable__V2__RowRange *r = sp ? sp->row_range : NULL;
    if (!r)
        return true;
    bool ok = true;
    if (r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED)
        ok = buf_set(start, r->start_key_closed.data, r->start_key_closed.len);
    else if (r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN)
        ok = buf_set(start, r->start_key_open.data, r->start_key_open.len) &&
             st_buf_append_byte(start, 0) == ST_OK;
    if (r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN)
        ok = ok && buf_set(end, r->end_key_open.data, r->end_key_open.len);
    else if (r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED)
        ok = ok && buf_set(end, r->end_key_closed.data, r->end_key_closed.len) &&
             st_buf_append_byte(end, 0) == ST_OK;
    return ok;
}

static void range_fill(Google__Bigtable__V2__StreamPartition *sp, Google__Bigtable__V2__RowRange *r,
                       const st_buf *start, const st_buf *end) {
    google__bigtable__v2__stream_partition__init(sp);
    google__bigtable__v2__row_range__init(r);
    sp->row_range = r;
    r->start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
    r->start_key_closed = (ProtobufCBinaryData){start->len, start->data};
    if (end->len) {
        r->end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        r->end_key_open = (ProtobufCBinaryData){end->len, end->data};
    }
}

/* An empty end is +infinity. */
static int end_cmp(const st_buf *a, const st_buf *b) {
    if (!a->len || !b->len)
        return (int)!a->len - (int)!b->len;
    return st_slice_cmp(st_buf_slice(a), st_buf_slice(b));
}

static bool buf_eq(const st_buf *a, const st_buf *b) {
    return st_slice_eq(st_buf_slice(a), st_buf_slice(b));
}

/* A row key for a message: printable ASCII in quotes (cut at 48 bytes), else hex. */
static void key_fmt(const st_buf *k, char *out, size_t cap) {
    bool printable = true;
    for (size_t i = 0; i < k->len && printable; i++)
        printable = k->data[i] >= 0x20 && k->data[i] < 0x7f && k->data[i] != '"';
    size_t n = k->len > 48 ? 48 : k->len;
    if (printable) {
        snprintf(out, cap, "\"%.*s%s\"", (int)n, (const char *)k->data, k->len > n ? "..." : "");
        return;
    }
    size_t used = (size_t)snprintf(out, cap, "0x");
    for (size_t i = 0; i < n && used + 3 < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%02x", k->data[i]);
    if (k->len > n && used + 4 < cap)
        snprintf(out + used, cap - used, "...");
}

/* "partition [\"a\", \"b\")", "partition [start of table, \"b\")", ... for messages. */
static void range_fmt(const st_buf *start, const st_buf *end, char *out, size_t cap) {
    char a[80], b[80]; /* fit CS_RANGE_TEXT_MAX with the words around them */
    if (start->len)
        key_fmt(start, a, sizeof a);
    else
        snprintf(a, sizeof a, "start of table");
    if (end->len)
        key_fmt(end, b, sizeof b);
    else
        snprintf(b, sizeof b, "end of table");
    snprintf(out, cap, "partition [%s, %s)", a, b);
}

/* ---- the end of the consumer ---- */

static void done_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    ops_cs *cs = arg;
    if (cs->done_sent || cs->open_calls > 0)
        return;
    cs->done_sent = true;
    if (cs->o.on_done)
        cs->o.on_done(cs->final_code, cs->final_msg, cs->o.arg);
}

static void cancel_all(ops_cs *cs) {
    if (cs->gen_call)
        rpc_ccall_cancel(cs->gen_call);
    if (cs->probe_call)
        rpc_ccall_cancel(cs->probe_call);
    evtimer_del(cs->probe_timer);
    for (cs_part *p = cs->parts; p; p = p->next) {
        if (p->call)
            rpc_ccall_cancel(p->call);
        evtimer_del(p->timer);
    }
    evtimer_del(cs->gen_timer);
}

/* Ends the consumer with code (the first reason wins); on_done runs once every call ended. */
static void finish(ops_cs *cs, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish(ops_cs *cs, st_code code, const char *fmt, ...) {
    if (!cs->finishing) {
        cs->finishing = true;
        cs->final_code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cs->final_msg, sizeof cs->final_msg, fmt, ap);
        va_end(ap);
    }
    cancel_all(cs);
    struct timeval tv = {0, 0};
    evtimer_add(cs->done_timer, &tv);
}

/* Every partition done (and nothing left to open): the consumer finished. */
static void check_all_done(ops_cs *cs) {
    if (cs->finishing || cs->gen_call || evtimer_pending(cs->gen_timer, NULL))
        return;
    for (cs_part *p = cs->parts; p; p = p->next)
        if (p->state == P_WAIT || p->state == P_OPEN)
            return;
    if (cs->n_wanted && cs->o.on_retry)
        cs->o.on_retry("a merged partition could not be opened: its other parent partition "
                       "ended first; resume with --checkpoint to read it",
                       cs->o.arg);
    finish(cs, ST_OK, "every partition is done");
}

/* ---- connection ---- */

static bool client_push(rpc_client ***v, size_t *n, rpc_client *c) {
    rpc_client **grown = realloc(*v, (*n + 1) * sizeof(*grown));
    if (!grown)
        return false;
    *v = grown;
    grown[(*n)++] = c;
    return true;
}

/* Frees the failed connections whose calls have ended, and moves the pool's failed ones (which
 * may still end calls) out of it. False when memory runs out. */
static bool conns_prune(ops_cs *cs) {
    size_t keep = 0;
    for (size_t i = 0; i < cs->n_dead; i++) {
        if (rpc_client_calls(cs->dead[i]) == 0)
            rpc_client_free(cs->dead[i]);
        else
            cs->dead[keep++] = cs->dead[i];
    }
    cs->n_dead = keep;
    keep = 0;
    bool ok = true;
    for (size_t i = 0; i < cs->n_conns; i++) {
        rpc_client *c = cs->conns[i];
        if (rpc_client_alive(c) || !(ok = ok && client_push(&cs->dead, &cs->n_dead, c)))
            cs->conns[keep++] = c; /* out of memory: left in the pool, retired next time */
    }
    cs->n_conns = keep;
    return ok;
}

/* A live connection with room for one more call (CS_CONN_STREAMS), a new one when none has. */
static rpc_client *client_get(ops_cs *cs, st_err *err) {
    if (!conns_prune(cs)) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < cs->n_conns; i++)
        if (rpc_client_alive(cs->conns[i]) && rpc_client_calls(cs->conns[i]) < CS_CONN_STREAMS)
            return cs->conns[i];
    char host[300];
    uint16_t port;
    if (!st_addr_split(cs->addr, host, sizeof host, &port)) {
        st_err_set(err, ST_INVALID_ARGUMENT, "bad address '%s': use HOST:PORT", cs->addr);
        return NULL;
    }
    rpc_client *c = rpc_client_new(cs->base, host, port, cs->o.copts, err);
    if (c && !client_push(&cs->conns, &cs->n_conns, c)) {
        rpc_client_free(c);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    return c;
}

/* A call's metadata: the routing parameters, then the token when there is one. */
static size_t cs_md(const ops_cs *cs, rpc_metadata md[2]) {
    md[0] = (rpc_metadata){"x-goog-request-params", cs->params};
    if (!cs->o.authorization)
        return 1;
    md[1] = (rpc_metadata){"authorization", cs->o.authorization};
    return 2;
}

static bool retryable(st_code code) {
    return code == ST_UNAVAILABLE || code == ST_DEADLINE_EXCEEDED || code == ST_ABORTED ||
           code == ST_CANCELLED || code == ST_RESOURCE_EXHAUSTED;
}

static int64_t backoff_ms(uint32_t failures) {
    int64_t ms = CS_BACKOFF_MIN_MS;
    for (uint32_t i = 1; i < failures && ms < CS_BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < CS_BACKOFF_MAX_MS ? ms : CS_BACKOFF_MAX_MS;
}

static bool cs_tls(const ops_cs *cs) {
    return cs->o.copts && cs->o.copts->ssl_ctx;
}

/* A failure that credentials explain and retrying cannot fix: UNAUTHENTICATED and
 * PERMISSION_DENIED (not retryable anyway), and a connection closed at the TLS handshake before
 * the router ever answered (after an answer, that is a router restarting: retried). */
static bool creds_failure(const ops_cs *cs, st_code code, const char *msg) {
    ops_router_fail f = ops_router_fail_of(code, msg, cs_tls(cs));
    return f == OPS_ROUTER_FAIL_TOKEN || (f == OPS_ROUTER_FAIL_TLS && !cs->answered);
}

/* What to do about a call that failed for good, for the person reading the message. */
static const char *hint(const ops_cs *cs, st_code code, const char *msg) {
    const char *creds = ops_router_hint(code, msg, cs_tls(cs), cs->o.authorization != NULL);
    if (creds[0] && creds_failure(cs, code, msg))
        return creds;
    if (code == ST_FAILED_PRECONDITION && msg && strstr(msg, "off and on again"))
        return "start over with --from, without the checkpoint (the changes before streams were "
               "turned off are gone; if they are off: --enable 1d first)";
    if (code == ST_FAILED_PRECONDITION)
        return "turn change streams on for the table: `strata changes --table TABLE --enable "
               "1d` keeps a day of changes from then on (1d to 7d; docs/changestreams.md)";
    if (code == ST_INVALID_ARGUMENT && msg && strstr(msg, "multi"))
        return "use an app profile with single-cluster routing (--app-profile)";
    if (code == ST_INVALID_ARGUMENT && msg && strstr(msg, "token") && strstr(msg, "oldest"))
        return "the checkpoint is older than the table's history (its retention passed, or "
               "change streams were turned off and on again since): the changes in between are "
               "gone; delete it to start over from --from";
    if (code == ST_INVALID_ARGUMENT && msg && strstr(msg, "token"))
        return "the checkpoint does not match the table's partitions; delete it to start over "
               "from --from";
    if (code == ST_INVALID_ARGUMENT && msg && strstr(msg, "table name"))
        return "check --table (a table id, or projects/P/instances/I/tables/T)";
    if (code == ST_INVALID_ARGUMENT)
        return "check --from / --until (within the table's retention, after streams were turned "
               "on, not in the future)";
    if (code == ST_NOT_FOUND)
        return "check --table, --project/--instance and --app-profile";
    if (code == ST_UNIMPLEMENTED)
        return "this server does not serve change streams; point --endpoint at a Strata router";
    return "see the server's log";
}

/* ---- a partition that keeps failing: is the table still there? ---- */

static bool gen_request(ops_cs *cs);

static void probe_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    (void)msg;
    (void)arg; /* the partitions themselves are not needed: only whether the table answers */
}

static void probe_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    ops_cs *cs = arg;
    cs_part *p = cs->probe_part;
    cs->probe_call = NULL;
    cs->open_calls--;
    if (cs->finishing) {
        struct timeval tv = {0, 0};
        evtimer_add(cs->done_timer, &tv);
        return;
    }
    if (code == ST_OK || (retryable(code) && !creds_failure(cs, code, message)) || !p)
        return; /* the table is there (or the router does not say): the retries go on */
    char range[CS_RANGE_TEXT_MAX];
    range_fmt(&p->start, &p->end, range, sizeof range);
    finish(cs, code,
           "%s keeps failing (%u times in a row, last: %s), and the table itself now answers %s: "
           "%s: the error is permanent, not retried; %s",
           range, p->failures, p->last_error, st_code_name(code), message ? message : "",
           hint(cs, code, message));
}

static void probe_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    ops_cs *cs = arg;
    st_err err = {0};
    rpc_client *c = cs->finishing || cs->probe_call ? NULL : client_get(cs, &err);
    if (!c || !gen_request(cs))
        return; /* tried again at the partition's next failures */
    rpc_metadata md[2];
    size_t n_md = cs_md(cs, md);
    cs->probe_call = rpc_client_call(c, CS_PATH_GEN, st_buf_slice(&cs->req), md, n_md,
                                     CS_GEN_TIMEOUT_MS, probe_msg, probe_done, cs);
    cs->open_calls += cs->probe_call != NULL;
}

/* After p failed again: from CS_PROBE_FAILURES failures in a row on, ask about the table (from a
 * timer: nothing starts inside an rpc callback). */
static void probe_maybe(cs_part *p) {
    ops_cs *cs = p->cs;
    if (p->failures < CS_PROBE_FAILURES || cs->probe_call || evtimer_pending(cs->probe_timer, NULL))
        return;
    cs->probe_part = p;
    struct timeval tv = {0, 0};
    evtimer_add(cs->probe_timer, &tv);
}

/* ---- one partition ---- */

static void part_reset_change(cs_part *p) {
    p->in_change = p->in_chunk = false;
    p->n_mods = 0;
}

static void part_open(cs_part *p);

static void part_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    part_open(arg);
}

static void part_schedule(cs_part *p, int64_t ms) {
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
    p->state = P_WAIT;
    evtimer_add(p->timer, &tv);
}

static cs_part *part_new(ops_cs *cs, const st_buf *start, const st_buf *end) {
    cs_part *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cs = cs;
    p->timer = evtimer_new(cs->base, part_timer_cb, p);
    if (!p->timer || !buf_set(&p->start, start->data, start->len) ||
        !buf_set(&p->end, end->data, end->len)) {
        if (p->timer)
            event_free(p->timer);
        st_buf_free(&p->start);
        st_buf_free(&p->end);
        free(p);
        return NULL;
    }
    p->next = cs->parts;
    cs->parts = p;
    return p;
}

static void part_free(cs_part *p) {
    event_free(p->timer);
    st_buf_free(&p->start);
    st_buf_free(&p->end);
    st_buf_free(&p->row);
    pos_array_free(p->from, p->n_from);
    for (size_t i = 0; i < p->cap_mods; i++) {
        st_buf_free(&p->mods[i].family);
        st_buf_free(&p->mods[i].qualifier);
        st_buf_free(&p->mods[i].value);
    }
    free(p->mods);
    free(p->view);
    free(p);
}

/* The part's position becomes `token` over its whole range. */
static bool part_set_token(cs_part *p, const char *token) {
    /* The usual case, once per change: the one position the partition resumes from gets its
     * next token, which mostly fits where the last one was (a stream's tokens differ in their
     * position, rarely in their length), so nothing is allocated. */
    ops_cs_pos *cur = p->n_from == 1 ? &p->from[0] : NULL;
    size_t len = strlen(token);
    if (cur && cur->token && strlen(cur->token) >= len && buf_eq(&cur->start, &p->start) &&
        buf_eq(&cur->end, &p->end)) {
        memcpy(cur->token, token, len + 1);
        cur->start_us = 0; /* as a position made anew: the token says where */
        return true;
    }
    ops_cs_pos pos = {.start = p->start, .end = p->end, .token = (char *)token};
    ops_cs_pos *one = malloc(sizeof *one);
    if (!one || !pos_copy(one, &pos)) {
        free(one);
        return false;
    }
    pos_array_free(p->from, p->n_from);
    p->from = one;
    p->n_from = 1;
    return true;
}

static void part_watermark(cs_part *p, const Google__Protobuf__Timestamp *wm) {
    int64_t us = ts_us(wm);
    if (us > p->wm_us)
        p->wm_us = us;
    ops_cs *cs = p->cs;
    if (cs->o.stop_us && p->wm_us >= cs->o.stop_us && p->state == P_OPEN) {
        p->state = P_DONE; /* caught up: the cancel's CANCELLED is expected */
        if (p->call)
            rpc_ccall_cancel(p->call);
    }
}

static cs_mod *mod_next(cs_part *p) {
    if (p->n_mods == p->cap_mods) {
        size_t cap = p->cap_mods ? p->cap_mods * 2 : 4;
        cs_mod *grown = realloc(p->mods, cap * sizeof(*grown));
        if (!grown)
            return NULL;
        memset(grown + p->cap_mods, 0, (cap - p->cap_mods) * sizeof(*grown));
        p->mods = grown;
        ops_cs_mod *view = realloc(p->view, cap * sizeof(*view));
        if (!view)
            return NULL;
        p->view = view;
        p->cap_mods = cap;
    }
    cs_mod *m = &p->mods[p->n_mods++];
    st_buf_reset(&m->family);
    st_buf_reset(&m->qualifier);
    st_buf_reset(&m->value);
    m->ts = m->start = m->end = m->chunk_size = 0;
    return m;
}

/* A new mutation from a chunk; false when it is malformed or memory runs out. */
static bool mod_start(cs_part *p, const cs_chunk *ch) {
    const Google__Bigtable__V2__Mutation *mu = ch->mutation;
    cs_mod *m = mu ? mod_next(p) : NULL;
    if (!m)
        return false;
    const char *fam = "";
    bool ok = true;
    switch (mu->mutation_case) {
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL:
        m->op = OPS_CS_SET;
        fam = mu->set_cell->family_name;
        m->ts = mu->set_cell->timestamp_micros;
        ok = buf_set(&m->qualifier, mu->set_cell->column_qualifier.data,
                     mu->set_cell->column_qualifier.len) &&
             buf_set(&m->value, mu->set_cell->value.data, mu->set_cell->value.len);
        break;
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_COLUMN: {
        const Google__Bigtable__V2__Mutation__DeleteFromColumn *d = mu->delete_from_column;
        m->op = OPS_CS_DELETE_COLUMN;
        fam = d->family_name;
        m->start = d->time_range ? d->time_range->start_timestamp_micros : 0;
        m->end = d->time_range ? d->time_range->end_timestamp_micros : 0;
        ok = buf_set(&m->qualifier, d->column_qualifier.data, d->column_qualifier.len);
        break;
    }
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_FAMILY:
        m->op = OPS_CS_DELETE_FAMILY;
        fam = mu->delete_from_family->family_name;
        break;
    case GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_DELETE_FROM_ROW:
        m->op = OPS_CS_DELETE_ROW;
        break;
    default:
        return false;
    }
    ok = ok && buf_set(&m->family, fam, strlen(fam));
    if (ok && ch->chunk_info && m->op == OPS_CS_SET) {
        m->chunk_size = ch->chunk_info->chunked_value_size;
        ok = ch->chunk_info->chunked_value_offset == 0;
        p->in_chunk = !ch->chunk_info->last_chunk;
    }
    return ok;
}

/* One chunk of the change being assembled. */
static bool chunk_take(cs_part *p, const cs_chunk *ch) {
    if (!p->in_chunk)
        return mod_start(p, ch);
    cs_mod *m = &p->mods[p->n_mods - 1];
    const Google__Bigtable__V2__Mutation *mu = ch->mutation;
    if (!ch->chunk_info || !mu ||
        mu->mutation_case != GOOGLE__BIGTABLE__V2__MUTATION__MUTATION_SET_CELL ||
        (size_t)ch->chunk_info->chunked_value_offset != m->value.len)
        return false;
    if (st_buf_append(&m->value, mu->set_cell->value.data, mu->set_cell->value.len) != ST_OK)
        return false;
    p->in_chunk = !ch->chunk_info->last_chunk;
    return p->in_chunk || m->chunk_size == 0 || (int64_t)m->value.len == m->chunk_size;
}

static bool change_emit(cs_part *p) {
    for (size_t i = 0; i < p->n_mods; i++) {
        const cs_mod *m = &p->mods[i];
        p->view[i] = (ops_cs_mod){.op = m->op,
                                  .family = st_buf_slice(&m->family),
                                  .qualifier = st_buf_slice(&m->qualifier),
                                  .value = st_buf_slice(&m->value),
                                  .timestamp_us = m->ts,
                                  .start_us = m->start,
                                  .end_us = m->end};
    }
    ops_cs_change c = {.row = st_buf_slice(&p->row),
                       .type = p->type,
                       .cluster = p->cluster,
                       .commit_us = p->commit_us,
                       .tiebreaker = p->tiebreaker,
                       .mods = p->view,
                       .n_mods = p->n_mods};
    p->cs->records++;
    return p->cs->o.on_change ? p->cs->o.on_change(&c, p->cs->o.arg) : true;
}

/* A DataChange message; false (with *why) when the stream must be reopened. */
static bool data_change(cs_part *p, const cs_dc *dc, const char **why) {
    if (dc->type !=
        GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__CONTINUATION) {
        part_reset_change(p);
        p->in_change = true;
        p->type =
            dc->type ==
                    GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__DATA_CHANGE__TYPE__GARBAGE_COLLECTION
                ? OPS_CS_GC
                : OPS_CS_USER;
        snprintf(p->cluster, sizeof p->cluster, "%s", dc->source_cluster_id);
        p->commit_us = ts_us(dc->commit_timestamp);
        p->tiebreaker = dc->tiebreaker;
        if (!buf_set(&p->row, dc->row_key.data, dc->row_key.len))
            return (*why = "out of memory"), false;
    } else if (!p->in_change) {
        return (*why = "a CONTINUATION message without the change it continues"), false;
    }
    for (size_t i = 0; i < dc->n_chunks; i++)
        if (!chunk_take(p, dc->chunks[i]))
            return (*why = "a malformed mutation chunk (chunk offsets or sizes do not add up)"),
                   false;
    if (!dc->done)
        return true;
    if (p->in_chunk)
        return (*why = "a change marked done with a value still chunked"), false;
    p->in_change = false;
    if (!change_emit(p)) {
        ops_cs_stop(p->cs);
        return true;
    }
    if (dc->token && dc->token[0] && !part_set_token(p, dc->token))
        return (*why = "out of memory"), false;
    part_watermark(p, dc->estimated_low_watermark);
    return true;
}

/* ---- CloseStream: new partitions ---- */

static bool pos_push(ops_cs_pos **arr, size_t *n, const ops_cs_pos *src) {
    ops_cs_pos *grown = realloc(*arr, (*n + 1) * sizeof(**arr));
    if (!grown)
        return false;
    *arr = grown;
    if (!pos_copy(&grown[*n], src))
        return false;
    (*n)++;
    return true;
}

static void pos_remove(ops_cs_pos *arr, size_t *n, size_t i) {
    ops_cs_pos_free(&arr[i]);
    memmove(&arr[i], &arr[i + 1], (*n - i - 1) * sizeof(*arr));
    (*n)--;
}

static int pos_start_cmp(const void *a, const void *b) {
    const ops_cs_pos *x = a, *y = b;
    return st_slice_cmp(st_buf_slice(&x->start), st_buf_slice(&y->start));
}

/* The pending tokens inside wanted partition w, when they tile it exactly: moved into a new
 * part, opened soon. */
static bool wanted_try(ops_cs *cs, const ops_cs_pos *w) {
    ops_cs_pos *sel = NULL;
    size_t n = 0;
    for (size_t i = 0; i < cs->n_pending; i++) {
        const ops_cs_pos *t = &cs->pending[i];
        if (st_slice_cmp(st_buf_slice(&t->start), st_buf_slice(&w->start)) >= 0 &&
            end_cmp(&t->end, &w->end) <= 0 && !pos_push(&sel, &n, t))
            break;
    }
    if (n > 1)
        qsort(sel, n, sizeof *sel, pos_start_cmp);
    bool tiled = n > 0 && buf_eq(&sel[0].start, &w->start) && buf_eq(&sel[n - 1].end, &w->end);
    for (size_t i = 1; tiled && i < n; i++)
        tiled = buf_eq(&sel[i - 1].end, &sel[i].start);
    cs_part *p = tiled ? part_new(cs, &w->start, &w->end) : NULL;
    if (!p) {
        pos_array_free(sel, n);
        return false;
    }
    p->from = sel;
    p->n_from = n;
    for (size_t i = cs->n_pending; i-- > 0;) {
        const ops_cs_pos *t = &cs->pending[i];
        if (st_slice_cmp(st_buf_slice(&t->start), st_buf_slice(&w->start)) >= 0 &&
            end_cmp(&t->end, &w->end) <= 0)
            pos_remove(cs->pending, &cs->n_pending, i);
    }
    part_schedule(p, 0);
    return true;
}

static void wanted_resolve(ops_cs *cs) {
    for (size_t i = cs->n_wanted; i-- > 0;)
        if (wanted_try(cs, &cs->wanted[i]))
            pos_remove(cs->wanted, &cs->n_wanted, i);
}

static bool close_stream(cs_part *p,
                         const Google__Bigtable__V2__ReadChangeStreamResponse__CloseStream *c) {
    ops_cs *cs = p->cs;
    st_code code = c->status ? (st_code)c->status->code : ST_OK;
    if (code == ST_OK) {
        p->state = P_DONE;
        return true;
    }
    if (code != ST_OUT_OF_RANGE) {
        char range[CS_RANGE_TEXT_MAX];
        range_fmt(&p->start, &p->end, range, sizeof range);
        finish(cs, code, "ReadChangeStream closed %s with %s: %s; %s", range, st_code_name(code),
               c->status && c->status->message ? c->status->message : "", hint(cs, code, NULL));
        return true;
    }
    p->state = P_GONE;
    bool ok = true;
    for (size_t i = 0; ok && i < c->n_continuation_tokens; i++) {
        ops_cs_pos t = {0};
        ok = range_get(c->continuation_tokens[i]->partition, &t.start, &t.end);
        t.token = c->continuation_tokens[i]->token;
        ok = ok && pos_push(&cs->pending, &cs->n_pending, &t);
        t.token = NULL;
        ops_cs_pos_free(&t);
    }
    for (size_t i = 0; ok && i < c->n_new_partitions; i++) {
        ops_cs_pos w = {0};
        ok = range_get(c->new_partitions[i], &w.start, &w.end) &&
             pos_push(&cs->wanted, &cs->n_wanted, &w);
        ops_cs_pos_free(&w);
    }
    if (!ok)
        finish(cs, ST_RESOURCE_EXHAUSTED, "out of memory following a CloseStream");
    wanted_resolve(cs);
    return true;
}

/* ---- the call ---- */

static void *pb_alloc(void *arena, size_t size) {
    return st_arena_alloc(arena, size);
}

static void pb_free(void *arena, void *ptr) { /* the arena is emptied as a whole */
    (void)arena;
    (void)ptr;
}

/* A DataChange complete in one message, for a keys_only consumer: read at the wire level, no
 * mutations. False when the message needs the full decoder (anything else, or anything
 * unusual: a change spread over several messages, chunks that do not add up, no token). */
static bool part_msg_light(cs_part *p, st_slice msg, const char **why) {
    ops_cs_wire_dc dc;
    ops_cs_wire_rc rc = ops_cs_wire_decode(msg, &dc);
    if (rc == OPS_CS_WIRE_BAD) {
        *why = "an unreadable ReadChangeStreamResponse";
        return true;
    }
    if (rc != OPS_CS_WIRE_DC || p->in_change || !dc.done || !dc.chunks_ok || dc.chunk_open ||
        (dc.type != 1 && dc.type != 2) || dc.token.len == 0 || dc.cluster.len >= sizeof p->cluster)
        return false;
    memcpy(p->cluster, dc.cluster.data, dc.cluster.len);
    p->cluster[dc.cluster.len] = '\0';
    ops_cs_change c = {.row = dc.row,
                       .type = dc.type == 2 ? OPS_CS_GC : OPS_CS_USER,
                       .cluster = p->cluster,
                       .commit_us = dc.commit_us,
                       .tiebreaker = dc.tiebreaker};
    ops_cs *cs = p->cs;
    cs->records++;
    if (cs->o.on_change && !cs->o.on_change(&c, cs->o.arg)) {
        ops_cs_stop(cs);
        return true;
    }
    st_buf_reset(&cs->token);
    if (st_buf_append(&cs->token, dc.token.data, dc.token.len) != ST_OK ||
        st_buf_append_byte(&cs->token, 0) != ST_OK ||
        !part_set_token(p, (const char *)cs->token.data))
        *why = "out of memory";
    Google__Protobuf__Timestamp wm = {.seconds = dc.watermark_us / 1000000,
                                      .nanos = (int32_t)(dc.watermark_us % 1000000 * 1000)};
    part_watermark(p, dc.watermark_us ? &wm : NULL);
    return true;
}

static void part_msg_failed(cs_part *p, const char *why);

static void part_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    cs_part *p = arg;
    if (p->state != P_OPEN)
        return;
    const char *why = NULL;
    p->cs->answered = true;
    p->cs->answers++;
    p->streaming = true;
    if (p->cs->o.keys_only && part_msg_light(p, msg, &why)) {
        p->failures = 0;
        part_msg_failed(p, why);
        return;
    }
    ProtobufCAllocator alloc = {pb_alloc, pb_free, &p->cs->pb_arena};
    cs_resp *r = (cs_resp *)btu_pb_unpack(
        &google__bigtable__v2__read_change_stream_response__descriptor, &alloc, msg, NULL);
    p->failures = 0; /* the stream works: the next failure starts the backoff over */
    if (!r) {
        why = "an unreadable ReadChangeStreamResponse";
    } else if (r->stream_record_case ==
               GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_DATA_CHANGE) {
        data_change(p, r->data_change, &why);
    } else if (r->stream_record_case ==
               GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_HEARTBEAT) {
        const Google__Bigtable__V2__StreamContinuationToken *t = r->heartbeat->continuation_token;
        if (t && t->token && t->token[0] && !p->in_change && !part_set_token(p, t->token))
            why = "out of memory";
        part_watermark(p, r->heartbeat->estimated_low_watermark);
    } else if (r->stream_record_case ==
               GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_RESPONSE__STREAM_RECORD_CLOSE_STREAM) {
        close_stream(p, r->close_stream);
    }
    if (p->cs->pb_arena.total_bytes > CS_PB_ARENA_KEEP_BYTES)
        st_arena_deinit(&p->cs->pb_arena); /* nothing points into it past this message */
    part_msg_failed(p, why);
}

/* A message the stream cannot go on after (why NULL: none): reopened from the last token. */
static void part_msg_failed(cs_part *p, const char *why) {
    if (why && p->state == P_OPEN) {
        if (p->cs->o.on_retry) {
            char line[256];
            snprintf(line, sizeof line,
                     "the server sent %s; reopening the partition from its "
                     "last token",
                     why);
            p->cs->o.on_retry(line, p->cs->o.arg);
        }
        p->state = P_WAIT; /* part_done reopens it */
        rpc_ccall_cancel(p->call);
    }
}

static void part_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    cs_part *p = arg;
    ops_cs *cs = p->cs;
    p->call = NULL;
    cs->open_calls--;
    if (cs->finishing) {
        struct timeval tv = {0, 0};
        evtimer_add(cs->done_timer, &tv);
        return;
    }
    if (p->state == P_DONE || p->state == P_GONE) {
        check_all_done(cs);
        return;
    }
    part_reset_change(p);
    /* A clean end is progress only when it finishes the partition; one before is reopened. */
    if (p->state == P_OPEN && code == ST_OK && cs->o.end_us && p->wm_us >= cs->o.end_us) {
        cs->answers++;
        p->state = P_DONE;
        check_all_done(cs);
        return;
    }
    char range[CS_RANGE_TEXT_MAX];
    range_fmt(&p->start, &p->end, range, sizeof range);
    if (p->state == P_OPEN && code != ST_OK &&
        (!retryable(code) || creds_failure(cs, code, message))) {
        finish(cs, code,
               "ReadChangeStream of %s failed for good: %s: %s (not retried: the error is "
               "permanent); %s",
               range, st_code_name(code), message ? message : "", hint(cs, code, message));
        return;
    }
    p->failures++;
    cs->retries++;
    int64_t ms = backoff_ms(p->failures);
    if (code != ST_OK) {
        snprintf(p->last_error, sizeof p->last_error, "%s: %s", st_code_name(code),
                 message ? message : "");
        if (cs->o.on_retry) {
            char line[ST_ERR_MSG_MAX];
            snprintf(line, sizeof line,
                     "%s ended with %s: %s; retrying from its last token in %.1f s (failure %u "
                     "in a row)",
                     range, st_code_name(code), message ? message : "", (double)ms / 1000,
                     p->failures);
            cs->o.on_retry(line, cs->o.arg);
        }
        probe_maybe(p);
    }
    part_schedule(p, ms);
}

static bool part_request(cs_part *p) {
    ops_cs *cs = p->cs;
    Google__Bigtable__V2__ReadChangeStreamRequest req;
    google__bigtable__v2__read_change_stream_request__init(&req);
    req.table_name = cs->table;
    req.app_profile_id = cs->profile;
    Google__Bigtable__V2__StreamPartition sp;
    Google__Bigtable__V2__RowRange rr;
    range_fill(&sp, &rr, &p->start, &p->end);
    req.partition = &sp;
    Google__Protobuf__Timestamp start, end;
    google__protobuf__timestamp__init(&start);
    google__protobuf__timestamp__init(&end);
    Google__Protobuf__Duration hb;
    google__protobuf__duration__init(&hb);
    hb.seconds = cs->o.heartbeat_s;
    req.heartbeat_duration = &hb;
    if (cs->o.end_us) {
        end.seconds = cs->o.end_us / 1000000;
        end.nanos = (int32_t)(cs->o.end_us % 1000000 * 1000);
        req.end_time = &end;
    }
    size_t n = p->n_from;
    Google__Bigtable__V2__StreamContinuationTokens toks;
    google__bigtable__v2__stream_continuation_tokens__init(&toks);
    Google__Bigtable__V2__StreamContinuationToken *tk = calloc(n ? n : 1, sizeof(*tk));
    Google__Bigtable__V2__StreamContinuationToken **tkp = calloc(n ? n : 1, sizeof(*tkp));
    Google__Bigtable__V2__StreamPartition *tsp = calloc(n ? n : 1, sizeof(*tsp));
    Google__Bigtable__V2__RowRange *trr = calloc(n ? n : 1, sizeof(*trr));
    bool ok = tk && tkp && tsp && trr;
    if (ok && n && p->from[0].token) {
        for (size_t i = 0; i < n; i++) {
            google__bigtable__v2__stream_continuation_token__init(&tk[i]);
            range_fill(&tsp[i], &trr[i], &p->from[i].start, &p->from[i].end);
            tk[i].partition = &tsp[i];
            tk[i].token = p->from[i].token ? p->from[i].token : "";
            tkp[i] = &tk[i];
        }
        toks.n_tokens = n;
        toks.tokens = tkp;
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_CONTINUATION_TOKENS;
        req.continuation_tokens = &toks;
    } else if (ok) {
        int64_t us = n ? p->from[0].start_us : cs->o.start_us;
        start.seconds = us / 1000000;
        start.nanos = (int32_t)(us % 1000000 * 1000);
        req.start_from_case =
            GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME;
        req.start_time = &start;
    }
    size_t len = ok ? google__bigtable__v2__read_change_stream_request__get_packed_size(&req) : 0;
    st_buf_reset(&cs->req);
    ok = ok && st_buf_reserve(&cs->req, len + 1) == ST_OK;
    if (ok)
        cs->req.len = google__bigtable__v2__read_change_stream_request__pack(&req, cs->req.data);
    free(tk);
    free(tkp);
    free(tsp);
    free(trr);
    return ok;
}

static void part_open(cs_part *p) {
    ops_cs *cs = p->cs;
    if (cs->finishing || p->state != P_WAIT)
        return;
    st_err err = {0};
    rpc_client *c = client_get(cs, &err);
    if (!c || !part_request(p)) {
        finish(cs, ST_RESOURCE_EXHAUSTED, "cannot start ReadChangeStream: %s",
               err.msg[0] ? err.msg : "out of memory");
        return;
    }
    rpc_metadata md[2];
    size_t n_md = cs_md(cs, md);
    p->state = P_OPEN;
    p->streaming = false;
    part_reset_change(p);
    p->call = rpc_client_call(c, CS_PATH_READ, st_buf_slice(&cs->req), md, n_md, 0, part_msg,
                              part_done, p);
    if (!p->call) { /* the client died under us: try again on a new one */
        p->failures++;
        part_schedule(p, backoff_ms(p->failures));
        return;
    }
    cs->open_calls++;
}

/* ---- GenerateInitialChangeStreamPartitions ---- */

static void gen_msg(rpc_ccall *call, st_slice msg, void *arg) {
    (void)call;
    ops_cs *cs = arg;
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsResponse *r = (void *)btu_pb_unpack(
        &google__bigtable__v2__generate_initial_change_stream_partitions_response__descriptor, NULL,
        msg, NULL);
    ops_cs_pos w = {0};
    if (!r || !range_get(r->partition, &w.start, &w.end) ||
        !pos_push(&cs->wanted, &cs->n_wanted, &w))
        finish(cs, ST_INTERNAL, "the router sent an unreadable or unusable partition list");
    ops_cs_pos_free(&w);
    if (r)
        protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void gen_start(ops_cs *cs);

static void gen_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    gen_start(arg);
}

static void gen_done(rpc_ccall *call, st_code code, const char *message, void *arg) {
    (void)call;
    ops_cs *cs = arg;
    cs->gen_call = NULL;
    cs->open_calls--;
    if (cs->finishing) {
        struct timeval tv = {0, 0};
        evtimer_add(cs->done_timer, &tv);
        return;
    }
    if (code == ST_OK && cs->n_wanted == 0) {
        finish(cs, ST_FAILED_PRECONDITION,
               "the table has no partitions in this app profile's "
               "cluster; check --table and --app-profile");
        return;
    }
    if (code != ST_OK) {
        pos_array_free(cs->wanted, cs->n_wanted);
        cs->wanted = NULL;
        cs->n_wanted = 0;
    }
    cs->answered = cs->answered || code == ST_OK;
    if (code != ST_OK && retryable(code) && !creds_failure(cs, code, message)) {
        cs->retries++;
        if (cs->o.on_retry) {
            char line[ST_ERR_MSG_MAX];
            snprintf(line, sizeof line, "GenerateInitialChangeStreamPartitions: %s: %s; retrying",
                     st_code_name(code), message ? message : "");
            cs->o.on_retry(line, cs->o.arg);
        }
        int64_t ms = backoff_ms(++cs->gen_failures);
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
        evtimer_add(cs->gen_timer, &tv);
        return;
    }
    if (code != ST_OK) {
        finish(cs, code, "GenerateInitialChangeStreamPartitions failed: %s: %s; %s",
               st_code_name(code), message ? message : "", hint(cs, code, message));
        return;
    }
    /* every initial partition starts from start_us: a position of its own */
    for (size_t i = cs->n_wanted; i-- > 0;) {
        ops_cs_pos *w = &cs->wanted[i];
        cs_part *p = part_new(cs, &w->start, &w->end);
        if (!p || !(p->from = calloc(1, sizeof(*p->from))) || !pos_copy(p->from, w)) {
            finish(cs, ST_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        p->n_from = 1;
        p->from[0].start_us = cs->o.start_us;
        pos_remove(cs->wanted, &cs->n_wanted, i);
        part_schedule(p, 0);
    }
}

/* GenerateInitialChangeStreamPartitions of the table into cs->req; false when out of memory. */
static bool gen_request(ops_cs *cs) {
    Google__Bigtable__V2__GenerateInitialChangeStreamPartitionsRequest req;
    google__bigtable__v2__generate_initial_change_stream_partitions_request__init(&req);
    req.table_name = cs->table;
    req.app_profile_id = cs->profile;
    size_t len =
        google__bigtable__v2__generate_initial_change_stream_partitions_request__get_packed_size(
            &req);
    st_buf_reset(&cs->req);
    if (st_buf_reserve(&cs->req, len + 1) != ST_OK)
        return false;
    cs->req.len = google__bigtable__v2__generate_initial_change_stream_partitions_request__pack(
        &req, cs->req.data);
    return true;
}

static void gen_start(ops_cs *cs) {
    if (cs->finishing)
        return;
    st_err err = {0};
    rpc_client *c = client_get(cs, &err);
    if (!c || !gen_request(cs)) {
        finish(cs, ST_UNAVAILABLE, "cannot reach %s: %s", cs->addr,
               err.msg[0] ? err.msg : "out of memory");
        return;
    }
    rpc_metadata md[2];
    size_t n_md = cs_md(cs, md);
    cs->gen_call = rpc_client_call(c, CS_PATH_GEN, st_buf_slice(&cs->req), md, n_md,
                                   CS_GEN_TIMEOUT_MS, gen_msg, gen_done, cs);
    if (cs->gen_call) {
        cs->open_calls++;
        return;
    }
    int64_t ms = backoff_ms(++cs->gen_failures);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
    evtimer_add(cs->gen_timer, &tv);
}

/* ---- public ---- */

static void url_encode(const char *in, char *out, size_t cap) {
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
}

ops_cs *ops_cs_new(struct event_base *base, const ops_cs_opts *opts, st_err *err) {
    ops_cs *cs = calloc(1, sizeof *cs);
    if (!cs) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    cs->base = base;
    cs->o = *opts;
    st_arena_init(&cs->pb_arena, CS_PB_ARENA_BLOCK_BYTES);
    cs->table = strdup(opts->table);
    cs->profile = strdup(opts->app_profile ? opts->app_profile : "");
    cs->addr = strdup(opts->addr);
    cs->gen_timer = evtimer_new(base, gen_timer_cb, cs);
    cs->done_timer = evtimer_new(base, done_cb, cs);
    cs->probe_timer = evtimer_new(base, probe_timer_cb, cs);
    if (!cs->table || !cs->profile || !cs->addr || !cs->gen_timer || !cs->done_timer ||
        !cs->probe_timer) {
        ops_cs_free(cs);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    char enc[CS_PARAMS_MAX / 2];
    url_encode(cs->table, enc, sizeof enc);
    int n = snprintf(cs->params, sizeof cs->params, "table_name=%s", enc);
    if (cs->profile[0]) {
        url_encode(cs->profile, enc, sizeof enc);
        snprintf(cs->params + n, sizeof cs->params - (size_t)n, "&app_profile_id=%s", enc);
    }
    return cs;
}

st_code ops_cs_start(ops_cs *cs, const ops_cs_pos *resume, size_t n, st_err *err) {
    if (n == 0) {
        struct timeval tv = {0, 0};
        evtimer_add(cs->gen_timer, &tv);
        return ST_OK;
    }
    for (size_t i = 0; i < n; i++) {
        cs_part *p = part_new(cs, &resume[i].start, &resume[i].end);
        if (!p || !(p->from = calloc(1, sizeof(*p->from))) || !pos_copy(p->from, &resume[i]))
            return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        p->n_from = 1;
        part_schedule(p, 0);
    }
    return ST_OK;
}

void ops_cs_stop(ops_cs *cs) {
    finish(cs, ST_OK, "stopped");
}

void ops_cs_stats_get(const ops_cs *cs, ops_cs_stats *out) {
    memset(out, 0, sizeof *out);
    out->records = cs->records;
    out->retries = cs->retries;
    out->answers = cs->answers;
    for (const cs_part *p = cs->parts; p; p = p->next) {
        if (p->state == P_GONE)
            continue;
        out->partitions++;
        out->done += p->state == P_DONE;
        out->waiting += p->state == P_WAIT || (p->state == P_OPEN && !p->streaming);
        if (p->state != P_DONE && p->wm_us &&
            (!out->min_watermark_us || p->wm_us < out->min_watermark_us))
            out->min_watermark_us = p->wm_us;
    }
}

st_code ops_cs_positions(const ops_cs *cs, ops_cs_pos **pos, size_t *n) {
    *pos = NULL;
    *n = 0;
    bool ok = true;
    for (const cs_part *p = cs->parts; ok && p; p = p->next)
        for (size_t i = 0; ok && p->state != P_GONE && i < p->n_from; i++)
            ok = pos_push(pos, n, &p->from[i]);
    for (size_t i = 0; ok && i < cs->n_pending; i++)
        ok = pos_push(pos, n, &cs->pending[i]);
    if (ok)
        return ST_OK;
    pos_array_free(*pos, *n);
    *pos = NULL;
    *n = 0;
    return ST_RESOURCE_EXHAUSTED;
}

void ops_cs_free(ops_cs *cs) {
    if (!cs)
        return;
    cs->finishing = true; /* calls cancelled below must not reopen anything */
    for (size_t i = 0; i < cs->n_conns; i++)
        rpc_client_free(cs->conns[i]); /* cancels what is still open */
    for (size_t i = 0; i < cs->n_dead; i++)
        rpc_client_free(cs->dead[i]);
    free(cs->conns);
    free(cs->dead);
    while (cs->parts) {
        cs_part *p = cs->parts;
        cs->parts = p->next;
        part_free(p);
    }
    pos_array_free(cs->pending, cs->n_pending);
    pos_array_free(cs->wanted, cs->n_wanted);
    if (cs->gen_timer)
        event_free(cs->gen_timer);
    if (cs->done_timer)
        event_free(cs->done_timer);
    if (cs->probe_timer)
        event_free(cs->probe_timer);
    st_buf_free(&cs->req);
    st_buf_free(&cs->token);
    st_arena_deinit(&cs->pb_arena);
    free(cs->table);
    free(cs->profile);
    free(cs->addr);
    free(cs);
}

/* ---- turning streams on and off ---- */

st_code ops_cs_set_retention_auth(const char *addr, const rpc_client_opts *copts,
                                  const char *authorization, const char *table,
                                  int64_t retention_us, st_err *err) {
    Google__Protobuf__Duration d;
    google__protobuf__duration__init(&d);
    d.seconds = retention_us / 1000000;
    Google__Bigtable__Admin__V2__ChangeStreamConfig cfg;
    google__bigtable__admin__v2__change_stream_config__init(&cfg);
    cfg.retention_period = &d;
    Google__Bigtable__Admin__V2__Table t;
    google__bigtable__admin__v2__table__init(&t);
    t.name = (char *)table;
    t.change_stream_config = retention_us ? &cfg : NULL;
    char *paths[] = {"change_stream_config"};
    Google__Protobuf__FieldMask mask;
    google__protobuf__field_mask__init(&mask);
    mask.paths = paths;
    mask.n_paths = 1;
    Google__Bigtable__Admin__V2__UpdateTableRequest req;
    google__bigtable__admin__v2__update_table_request__init(&req);
    req.table = &t;
    req.update_mask = &mask;
    st_buf packed, resp;
    st_buf_init(&packed);
    st_buf_init(&resp);
    size_t len = google__bigtable__admin__v2__update_table_request__get_packed_size(&req);
    st_err st = {0};
    st_code rc = st_buf_reserve(&packed, len + 1);
    if (rc == ST_OK) {
        packed.len = google__bigtable__admin__v2__update_table_request__pack(&req, packed.data);
        rpc_metadata md = {"authorization", authorization};
        rc = rpc_blocking_unary(addr, copts, CS_UPDATE_TABLE, st_buf_slice(&packed), &md,
                                authorization ? 1 : 0, CS_ADMIN_TIMEOUT_MS, &resp, &st);
    }
    Google__Longrunning__Operation *op =
        rc == ST_OK ? (void *)btu_pb_unpack(&google__longrunning__operation__descriptor, NULL,
                                            st_buf_slice(&resp), NULL)
                    : NULL;
    if (rc != ST_OK)
        st_err_set(err, rc, "UpdateTable %s at %s: %s: %s", table, addr, st_code_name(rc), st.msg);
    else if (!op || !op->done || op->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR)
        rc =
            st_err_set(err, ST_INTERNAL, "UpdateTable %s did not finish: %s (run it again)", table,
                       op && op->error && op->error->message ? op->error->message : "no operation");
    if (op)
        google__longrunning__operation__free_unpacked(op, NULL);
    st_buf_free(&packed);
    st_buf_free(&resp);
    return rc;
}
