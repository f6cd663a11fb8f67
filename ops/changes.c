/* ops/changes.c — `strata changes`: prints a table's change stream as JSON lines, one change
 * per line, read through the router (docs/operations.md, "Reading change streams").
 *
 * The consumer (changes_stream.c) reads every partition at once; this file adds the command
 * line, stdout, progress on stderr and the checkpoint. The checkpoint holds each partition's
 * last token and is written only after the output it covers was flushed (and fsync'd when stdout
 * is a file), so a run resumed from it repeats at most what the killed run printed after its
 * last checkpoint: at least once, never a gap. */
#define _DEFAULT_SOURCE /* fsync, isatty */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "certs.h"
#include "changes.h"
#include "instance.h"
#include "strata/topology.h"

#define CH_HEARTBEAT_S_DEFAULT 2
#define CH_HEARTBEAT_S_MAX 3600
#define CH_CKPT_INTERVAL_MS 1000
#define CH_PROGRESS_TTY_MS 1000
#define CH_PROGRESS_PLAIN_S 10
#define CH_NAME_MAX 1024
/* A run that hears nothing from the router (no change, heartbeat or finished stream) for this
 * long while retrying gives up without --follow (a batch job must end; 60 s as `strata backup
 * --wait`), and with --follow says once that the router is not answering. The hidden variable
 * STRATA_CHANGES_STALL_S (tests only) shortens it. Heartbeats come every --heartbeat-s, so a
 * quiet healthy stream is never taken for a stalled one. */
#define CH_STALL_S_DEFAULT 60
#define CH_RETENTION_MIN_US (86400LL * 1000000) /* --enable: what the router takes */
#define CH_RETENTION_MAX_US (7 * 86400LL * 1000000)
#define CH_STALL_ENV "STRATA_CHANGES_STALL_S"
#define CH_TICK_LATE_US 5000000LL /* ticks come every second: a later one means a blocked loop */

typedef struct ch_args {
    const char *table, *endpoint, *dir, *profile, *project, *instance;
    const char *from, *until, *checkpoint, *enable;
    const char *tls_ca, *token, *token_file; /* a secure router (ops_secure_flags) */
    bool follow, quiet, disable;
    int64_t heartbeat_s;
} ch_args;

typedef struct ch_run {
    ch_args a;
    char table[CH_NAME_MAX];
    ops_cs *cs;
    struct event_base *base;
    struct event *flush_ev; /* stdout is flushed once the changes at hand are written */
    st_buf line;
    bool out_is_file, tty, out_closed, out_failed;
    int lock_fd; /* FILE.lock of --checkpoint, held until exit; -1 without */
    st_code code;
    char msg[ST_ERR_MSG_MAX];
    uint32_t ckpt_crc; /* of the last checkpoint written, to skip identical rewrites */
    bool ckpt_written, ckpt_failed;
    bool resumed; /* the start came from --checkpoint, not --from */
    int64_t start_mono_us, last_progress_us;
    uint64_t last_records;
    char addr[512], dir[1024]; /* the router, and the instance to name in advice ("DIR": none) */
    int64_t stall_us;          /* how long without an answer is a stall */
    int64_t answer_mono_us;    /* when the router last answered (or the run started) */
    int64_t tick_mono_us;      /* the last watch_stall */
    uint64_t answers;          /* ops_cs_stats.answers then */
    bool stall_said, stalled;  /* --follow told of a stall; a one-shot run gave up on one */
    char last_retry[256];      /* the last transient failure, to name in the stall message */
} ch_run;

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata changes --table T [--endpoint HOST:PORT | --dir DIR] [--app-profile P]\n"
            "                      [--tls-ca FILE] [--token-file FILE | --token TOKEN]\n"
            "                      [--from TIME] [--until TIME] [--follow] [--checkpoint FILE]\n"
            "                      [--heartbeat-s N] [--project P --instance I] [--quiet]\n"
            "Prints the change stream of table T as JSON lines on stdout, one change per line:\n"
            "  {\"row\":..,\"type\":\"USER\"|\"GARBAGE_COLLECTION\",\"cluster\":..,"
            "\"commit_time\":..,\"tiebreaker\":N,\"mods\":[..]}\n"
            "Bytes that are not printable UTF-8 are base64 under the key + \"_b64\".\n"
            "  --table T          table id, or projects/P/instances/I/tables/T\n"
            "  --endpoint H:P     the router (default: the router of the instance in --dir)\n"
            "  --dir DIR          a local instance (default $STRATA_HOME, else ~/.strata/local)\n"
            "  --app-profile P    app profile with single-cluster routing: which cluster's stream\n"
            "  --from TIME        start (RFC 3339, `now`, or relative: -10m, -2h, -1d, -30s);\n"
            "                     default now with --follow; required without it, unless the\n"
            "                     --checkpoint FILE exists\n"
            "  --until TIME       stop at TIME (also with --follow)\n"
            "  --follow           keep reading new changes until Ctrl-C (or --until), retrying\n"
            "                     while the router does not answer or a node is down (said on\n"
            "                     stderr after 60 s); without it stop once every partition\n"
            "                     caught up to the start of the command, or fail (exit 1) after\n"
            "                     60 s without progress (a change, heartbeat or finished\n"
            "                     partition: a node down counts as none)\n"
            "  --checkpoint FILE  resume from FILE when it exists (--from is then ignored), and\n"
            "                     keep it updated (atomically, after the output it covers was\n"
            "                     flushed): a resumed run repeats changes, never skips one;\n"
            "                     appending to a file that a killed run left in the middle of\n"
            "                     a line, it first ends that line\n"
            "                     A FILE that does not exist is refused without --from or\n"
            "                     --follow (a start at now would skip every earlier change);\n"
            "                     with --follow alone it starts at now and says so\n"
            "  --heartbeat-s N    heartbeat interval asked from the server, 1 to 3600 s\n"
            "                     (default 2)\n"
            "  --tls-ca FILE      the CA of a TLS router (default: DIR/secure/ca.pem of a secure\n"
            "                     instance in --dir)\n"
            "  --token-file FILE  the bearer token for the router (default: the admin token of\n"
            "                     DIR/secure/tokens); --token TOKEN gives it on the command line\n"
            "  --quiet            no progress on stderr\n"
            "Turning streams on or off (UpdateTable through the router, then exit):\n"
            "  --enable RETENTION keep changes for RETENTION (1d to 7d; e.g. 1d, 36h)\n"
            "  --disable          turn change streams off (deletes the table's history)\n"
            "Exit status: 0 done (or stopped by Ctrl-C), 1 failed, 2 bad usage.\n");
}

/* 0 parsed, 1 help shown, 2 bad usage. */
static int parse_args(int argc, char **argv, ch_args *a) {
    memset(a, 0, sizeof *a);
    a->heartbeat_s = CH_HEARTBEAT_S_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **slot = !strcmp(f, "--table")         ? &a->table
                            : !strcmp(f, "--endpoint")    ? &a->endpoint
                            : !strcmp(f, "--dir")         ? &a->dir
                            : !strcmp(f, "--app-profile") ? &a->profile
                            : !strcmp(f, "--project")     ? &a->project
                            : !strcmp(f, "--instance")    ? &a->instance
                            : !strcmp(f, "--from")        ? &a->from
                            : !strcmp(f, "--until")       ? &a->until
                            : !strcmp(f, "--checkpoint")  ? &a->checkpoint
                            : !strcmp(f, "--enable")      ? &a->enable
                            : !strcmp(f, "--tls-ca")      ? &a->tls_ca
                            : !strcmp(f, "--token")       ? &a->token
                            : !strcmp(f, "--token-file")  ? &a->token_file
                                                          : NULL;
        uint64_t n;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(f, "--follow")) {
            a->follow = true;
        } else if (!strcmp(f, "--quiet")) {
            a->quiet = true;
        } else if (!strcmp(f, "--disable")) {
            a->disable = true;
        } else if (!strcmp(f, "--heartbeat-s") && v) {
            if (!st_parse_u64(v, 1, CH_HEARTBEAT_S_MAX, &n)) {
                fprintf(stderr,
                        "strata changes: --heartbeat-s %s: give whole seconds from 1 to %d (the "
                        "stall bound grows with it: a run that hears nothing for 60 s, or two "
                        "heartbeats, stops)\n",
                        v, CH_HEARTBEAT_S_MAX);
                return 2;
            }
            a->heartbeat_s = (int64_t)n;
            i++;
        } else if (slot && v) {
            *slot = v;
            i++;
        } else {
            fprintf(stderr,
                    "strata changes: bad flag or missing value: %s (see strata changes "
                    "--help)\n",
                    f);
            return 2;
        }
    }
    if (!a->table) {
        fprintf(stderr, "strata changes: --table is required (see strata changes --help)\n");
        return 2;
    }
    if (a->checkpoint && !a->checkpoint[0]) { /* "" would lock ".lock" here, then fail to write */
        fprintf(stderr, "strata changes: --checkpoint needs a file name\n");
        return 2;
    }
    if (a->enable && a->disable) { /* one of them would be dropped without a word */
        fprintf(stderr, "strata changes: --enable and --disable contradict each other: give one\n");
        return 2;
    }
    return 0;
}

/* The router's address and the full table name. False after printing why. */
static bool resolve_target(ch_run *r, char *addr, size_t cap) {
    const ch_args *a = &r->a;
    const char *project = a->project ? a->project : "p",
               *instance = a->instance ? a->instance : "i";
    static st_topology topo; /* large: not on the stack */
    if (!a->endpoint || a->dir) {
        if (!ops_inst_topology("strata changes", a->dir, &topo))
            return false;
        project = a->project ? a->project : topo.project;
        instance = a->instance ? a->instance : topo.instance;
        if (!ops_inst_dir(a->dir, r->dir, sizeof r->dir))
            return false;
        /* Its pid files say nothing runs: said at once (it used to retry "Connection refused"
         * for 60 s, or forever with --follow). */
        if (!a->endpoint && ops_inst_all_stopped(r->dir, &topo)) {
            fprintf(stderr,
                    "strata changes: the instance in %s is not running (no node or router of it "
                    "runs): start it with `strata up --dir %s`, then run this again\n",
                    r->dir, r->dir);
            return false;
        }
        /* None answering leaves the first, which the reading retries (--follow until it
         * comes back). */
        if (!a->endpoint)
            (void)ops_inst_router_pick(NULL, &topo, a->dir, addr, cap);
    } else {
        snprintf(r->dir, sizeof r->dir, "DIR");
    }
    if (a->endpoint)
        snprintf(addr, cap, "%s", a->endpoint);
    bool full = !strncmp(a->table, "projects/", 9);
    if (!(full ? ops_fmt(r->table, sizeof r->table, "%s", a->table)
               : ops_fmt(r->table, sizeof r->table, "projects/%s/instances/%s/tables/%s", project,
                         instance, a->table)))
        return false;
    /* after ops_inst_topology: it names the instance's credentials, which the flags override */
    return ops_secure_flags("strata changes", a->tls_ca, a->token, a->token_file);
}

/* ---- output and checkpoint ---- */

/* A write or flush of stdout failed with ERR: EPIPE (the reader went away, | head) is a
 * normal end; anything else (a full disk) fails the run. Either way the stream stops and no
 * checkpoint is written past it: stdio drops the buffered lines a failed flush did not write. */
static void out_error(ch_run *r, int err) {
    if (r->out_closed || r->out_failed)
        return;
    if (err == EPIPE) {
        r->out_closed = true;
    } else {
        r->out_failed = true;
        r->code = ST_UNAVAILABLE;
        snprintf(r->msg, sizeof r->msg, "cannot write to stdout: %s", strerror(err));
    }
    if (r->cs)
        ops_cs_stop(r->cs);
}

static bool on_change(const ops_cs_change *c, void *arg) {
    ch_run *r = arg;
    st_buf_reset(&r->line);
    if (ops_cs_json(&r->line, c) != ST_OK || st_buf_append_byte(&r->line, '\n') != ST_OK) {
        r->code = ST_RESOURCE_EXHAUSTED;
        snprintf(r->msg, sizeof r->msg, "out of memory formatting a change");
        return false;
    }
    if (fwrite(r->line.data, 1, r->line.len, stdout) != r->line.len) {
        out_error(r, errno);
        return false;
    }
    struct timeval now = {0, 0};
    if (r->flush_ev && !evtimer_pending(r->flush_ev, NULL))
        evtimer_add(r->flush_ev, &now);
    return true;
}

/* A run killed mid-line (kill -9, power loss) leaves the file it appended to ending in part of a
 * change; its checkpoint does not cover that change, so this run prints it again. Starting on a
 * fresh line keeps the repeated change whole on a line of its own, instead of glued to the
 * fragment where no JSON reader could take it. Pipes cannot be looked back into. */
static bool end_cut_line(void) {
    struct stat st;
    int fl = fcntl(STDOUT_FILENO, F_GETFL);
    off_t at = fl >= 0 && (fl & O_APPEND) && fstat(STDOUT_FILENO, &st) == 0
                   ? st.st_size
                   : lseek(STDOUT_FILENO, 0, SEEK_CUR);
    /* ">>" opens the file write-only: read its last byte through a descriptor of our own */
    int fd = at > 0 ? open("/proc/self/fd/1", O_RDONLY | O_CLOEXEC) : -1;
    char c = '\n';
    if (fd >= 0) {
        if (pread(fd, &c, 1, at - 1) != 1)
            c = '\n';
        close(fd);
    }
    if (c == '\n') /* empty, at a line's start, or not readable: as it is */
        return true;
    if (write(STDOUT_FILENO, "\n", 1) == 1)
        return true;
    fprintf(stderr, "strata changes: cannot write to stdout: %s\n", strerror(errno));
    return false;
}

/* Everything printed so far handed to the kernel. The error flag stays set after a failed
 * flush, whose lines are gone even if the next flush succeeds. */
static bool flush_stdio(ch_run *r) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        out_error(r, errno);
        return false;
    }
    return true;
}

/* Everything printed so far reaches the file (or pipe) before a checkpoint says so: the pages
 * of a failed fsync are gone too, and the next fsync no longer reports them. */
static bool flush_output(ch_run *r) {
    if (!flush_stdio(r))
        return false;
    if (r->out_is_file && fsync(STDOUT_FILENO) != 0) {
        out_error(r, errno);
        return false;
    }
    return true;
}

/* After the changes at hand are written: stdio only (an fsync per batch of changes would cost
 * the disk a flush each time; checkpoints and the end of the run make it durable). */
static void flush_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    flush_stdio(arg);
}

static uint32_t positions_crc(const ops_cs_pos *p, size_t n) {
    uint32_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc = st_crc32c(crc, p[i].start.data, p[i].start.len);
        crc = st_crc32c(crc, "|", 1);
        crc = st_crc32c(crc, p[i].end.data, p[i].end.len);
        crc = st_crc32c(crc, "|", 1);
        if (p[i].token)
            crc = st_crc32c(crc, p[i].token, strlen(p[i].token));
        else
            crc = st_crc32c(crc, &p[i].start_us, sizeof p[i].start_us);
        crc = st_crc32c(crc, "\n", 1);
    }
    return crc;
}

/* Whether the server answered the start: a record, a heartbeat or a finished partition (a
 * heartbeat may carry no watermark: a node with peer clusters sends none before it knows how far
 * they have replicated). */
static bool start_accepted(const ch_run *r) {
    ops_cs_stats s;
    ops_cs_stats_get(r->cs, &s);
    return s.records || s.done || s.answers;
}

static void checkpoint(ch_run *r) {
    /* A start not answered yet may still be refused (a server retrying a node can take seconds
     * to): a checkpoint holding it would make the next run repeat the refusal. */
    if (!r->a.checkpoint || r->ckpt_failed || (!r->ckpt_written && !start_accepted(r)) ||
        !flush_output(r))
        return;
    ops_cs_pos *pos;
    size_t n;
    if (ops_cs_positions(r->cs, &pos, &n) != ST_OK)
        return;
    uint32_t crc = positions_crc(pos, n);
    if (n > 0 && (!r->ckpt_written || crc != r->ckpt_crc)) {
        st_err err = {0};
        if (ops_cs_ckpt_write(r->a.checkpoint, r->table, pos, n, &err) == ST_OK) {
            r->ckpt_crc = crc;
            r->ckpt_written = true;
        } else {
            fprintf(stderr, "strata changes: %s\n", err.msg);
            r->ckpt_failed = true; /* the stream stops: resuming would need it */
            r->code = err.code;
            snprintf(r->msg, sizeof r->msg, "%s", err.msg);
            ops_cs_stop(r->cs);
        }
    }
    for (size_t i = 0; i < n; i++)
        ops_cs_pos_free(&pos[i]);
    free(pos);
}

/* ---- progress ---- */

static void progress(ch_run *r, bool final) {
    if (r->a.quiet)
        return;
    int64_t now = st_mono_us();
    if (!final && !r->tty && now - r->last_progress_us < CH_PROGRESS_PLAIN_S * 1000000LL)
        return;
    ops_cs_stats s;
    ops_cs_stats_get(r->cs, &s);
    double dt = r->last_progress_us ? (double)(now - r->last_progress_us) / 1e6
                                    : (double)(now - r->start_mono_us) / 1e6;
    double rate = dt > 0 ? (double)(s.records - r->last_records) / dt : 0;
    char lag[32] = "-";
    if (s.min_watermark_us)
        snprintf(lag, sizeof lag, "%.1fs", (double)(st_wall_us() - s.min_watermark_us) / 1e6);
    fprintf(stderr,
            "%spartitions %zu (%zu done, %zu waiting) records %llu (%.0f/s) lag %s retries %llu%s",
            r->tty ? "\r" : "strata changes: ", s.partitions, s.done, s.waiting,
            (unsigned long long)s.records, rate, lag, (unsigned long long)s.retries,
            r->tty && !final ? "   " : "\n");
    r->last_progress_us = now;
    r->last_records = s.records;
}

/* Whether stdout is a pipe or socket whose reader went away (`| head -1`). A write would fail
 * with EPIPE, but a stream with no new change writes nothing, so without this the command
 * would wait for the next change (possibly forever) before noticing. */
static bool out_gone(const ch_run *r) {
    struct pollfd p = {.fd = STDOUT_FILENO, .events = 0};
    return !r->out_is_file && poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP));
}

/* ---- a router that does not answer ---- */

/* CH_STALL_S_DEFAULT (or STRATA_CHANGES_STALL_S), and never under two heartbeats: a stream
 * with no change answers only with heartbeats. */
static int64_t stall_bound_us(int64_t heartbeat_s) {
    const char *env = getenv(CH_STALL_ENV);
    uint64_t s = CH_STALL_S_DEFAULT;
    if (env && !st_parse_u64(env, 1, CH_HEARTBEAT_S_MAX, &s))
        s = CH_STALL_S_DEFAULT;
    int64_t min = 2 * heartbeat_s + 1;
    return ((int64_t)s > min ? (int64_t)s : min) * 1000000LL;
}

/* How the last failure came about, by the router failure classifier: no router listens, the
 * connection to it failed otherwise, or the router itself answered UNAVAILABLE (a node that holds
 * a partition is down; the router still answers from its tablet map). */
static ops_router_fail last_fail(const ch_run *r, bool *from_router) {
    const rpc_client_opts *copts = ops_secure_router_opts();
    const char *code = strstr(r->last_retry, "UNAVAILABLE: "); /* "RANGE ended with CODE: MSG" */
    const char *msg = code ? code + strlen("UNAVAILABLE: ") : "";
    ops_router_fail f = code ? ops_router_fail_of(ST_UNAVAILABLE, msg, copts && copts->ssl_ctx)
                             : OPS_ROUTER_FAIL_OTHER;
    *from_router = code && f == OPS_ROUTER_FAIL_OTHER && strncmp(msg, "connection to ", 14) != 0;
    return f;
}

static const char *stall_why(const ch_run *r) {
    bool from_router;
    if (last_fail(r, &from_router) == OPS_ROUTER_FAIL_DOWN)
        return "nothing listens there (the router is not running)";
    return from_router ? "the router answers, but cannot reach a node that holds a partition"
                       : "the router hangs, or cannot reach a node";
}

/* What the run went without: an answer at all, or progress of its streams while the router
 * answered each of them with an error. */
static const char *stall_what(const ch_run *r) {
    bool from_router;
    last_fail(r, &from_router);
    return from_router ? "progress (a change, a heartbeat or a finished partition)" : "answer";
}

/* What to check and do, on its own line: the stall message before it names the cause. */
static void stall_advice(const ch_run *r) {
    const char *d = r->dir, *ck = r->a.checkpoint;
    const char *again = r->a.follow       ? ""
                        : r->ckpt_written ? "; then run this command again: it resumes from "
                        : ck              ? "; then run this command again (no checkpoint was "
                                            "written yet: it starts at --from)"
                                          : "; then run this command again";
    const char *resume = !r->a.follow && r->ckpt_written ? ck : "";
    if (r->a.endpoint) /* the instance in --dir may have other routers: --endpoint is the one */
        fprintf(stderr,
                "strata changes: check that a router listens at %s (--endpoint) and reaches its "
                "nodes: `strata status --dir DIR` of its instance lists the routers' addresses and "
                "what is down; start what is down with `strata up --dir DIR`, or restart a "
                "router that hangs%s%s\n",
                r->addr, again, resume);
    else
        fprintf(stderr,
                "strata changes: check with `strata status --dir %s`; start what is down with "
                "`strata up --dir %s`, or `strata restart router --dir %s` if the router "
                "hangs%s%s\n",
                d, d, d, again, resume);
}

/* Any answer from the router restarts the clock: a stream that makes progress never stalls.
 * Without one for r->stall_us, a one-shot run ends (exit 1) and --follow says so once. */
static void watch_stall(ch_run *r) {
    ops_cs_stats s;
    ops_cs_stats_get(r->cs, &s);
    int64_t now = st_mono_us();
    /* A loop that did not turn (stdout blocked by a slow reader, the command stopped by Ctrl-Z)
     * read nothing: that silence was ours, not the router's. */
    bool late = r->tick_mono_us && now - r->tick_mono_us > CH_TICK_LATE_US;
    r->tick_mono_us = now;
    if (late)
        r->answer_mono_us = now;
    if (s.answers != r->answers) {
        bool from_router;
        last_fail(r, &from_router);
        if (r->stall_said)
            fprintf(stderr, "%sstrata changes: %s %s %s again\n", r->tty ? "\n" : "",
                    from_router ? "the streams from the router at" : "the router at", r->addr,
                    from_router ? "make progress" : "answers");
        r->answers = s.answers;
        r->answer_mono_us = now;
        r->stall_said = false;
        return;
    }
    if (now - r->answer_mono_us < r->stall_us || r->stall_said || r->stalled)
        return;
    long long secs = (now - r->answer_mono_us) / 1000000;
    const char *last = r->last_retry[0] ? r->last_retry : "none: the calls are waiting";
    if (r->a.follow) {
        fprintf(stderr,
                "%sstrata changes: no %s from the router at %s for %lld s: %s; last error: "
                "%s. Still retrying\n",
                r->tty ? "\n" : "", stall_what(r), r->addr, secs, stall_why(r), last);
        stall_advice(r);
        r->stall_said = true;
        return;
    }
    r->stalled = true;
    r->code = ST_UNAVAILABLE;
    snprintf(r->msg, sizeof r->msg,
             "no %s from the router at %.120s for %lld s: %s; last error: %.150s. Without "
             "--follow the command gives up",
             stall_what(r), r->addr, secs, stall_why(r), last);
    ops_cs_stop(r->cs);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    ch_run *r = arg;
    if (!r->out_closed && out_gone(r)) {
        r->out_closed = true; /* a normal end, as an EPIPE on write */
        ops_cs_stop(r->cs);
        return;
    }
    watch_stall(r);
    checkpoint(r);
    progress(r, false);
}

static void signal_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    ops_cs_stop(((ch_run *)arg)->cs);
}

static void on_done(st_code code, const char *msg, void *arg) {
    ch_run *r = arg;
    if (r->code == ST_OK && !r->out_closed) {
        r->code = code;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    event_base_loopbreak(r->base);
}

static void on_retry(const char *msg, void *arg) {
    ch_run *r = arg;
    /* kept without its "; retrying..." tail: the stall message says what happens next */
    snprintf(r->last_retry, sizeof r->last_retry, "%s", msg);
    char *tail = strstr(r->last_retry, "; re");
    if (tail)
        *tail = '\0';
    if (!r->a.quiet)
        fprintf(stderr, "%sstrata changes: %s\n", r->tty ? "\n" : "", msg);
}

/* ---- turning streams on and off ---- */

/* The value of the authorization header of a secure instance (or --token), NULL: none. */
static const char *authorization(void) {
    size_t n;
    const rpc_metadata *md = ops_secure_md(&n);
    return n ? md->value : NULL;
}

/* UpdateTable with change_stream_config (retention_us 0: off). Exit code. */
static int update_table(const char *addr, const char *table, int64_t retention_us) {
    st_err err = {0};
    const rpc_client_opts *copts = ops_secure_router_opts();
    if (ops_cs_set_retention_auth(addr, copts, authorization(), table, retention_us, &err) !=
        ST_OK) {
        const char *h =
            ops_router_hint(err.code, err.msg, copts && copts->ssl_ctx, authorization() != NULL);
        fprintf(stderr, "strata changes: %s%s%s%s\n", err.msg, h[0] ? " (" : "", h,
                h[0] ? ")" : "");
        return 1;
    }
    if (retention_us)
        printf("change streams on for %s, retention %lld s\n", table,
               (long long)(retention_us / 1000000));
    else
        printf("change streams off for %s (its history is deleted)\n", table);
    return 0;
}

static int admin(ch_run *r, const char *addr) {
    int64_t retention = 0;
    if (r->a.enable) {
        char rel[64];
        snprintf(rel, sizeof rel, "+%s", r->a.enable);
        if (!ops_cs_time_parse(rel, 0, &retention) || retention <= 0) {
            fprintf(stderr,
                    "strata changes: bad --enable '%s': a retention such as 1d, 36h or "
                    "7d\n",
                    r->a.enable);
            return 2;
        }
        /* The router's own refusal names the API ("leave change_stream_config unset"). */
        if (retention < CH_RETENTION_MIN_US || retention > CH_RETENTION_MAX_US) {
            fprintf(stderr,
                    "strata changes: --enable %s: change streams keep 1d to 7d of changes (e.g. "
                    "--enable 1d, 36h, 7d); --disable turns them off\n",
                    r->a.enable);
            return 2;
        }
    }
    return update_table(addr, r->table, retention);
}

/* ---- main ---- */

/* Takes FILE.lock of --checkpoint for the life of the process: two commands sharing one
 * checkpoint would overwrite each other's positions (and each other's FILE.tmp), so the second
 * is refused. False after printing why. */
static bool lock_checkpoint(ch_run *r) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s.lock", r->a.checkpoint) >= sizeof path) {
        fprintf(stderr, "strata changes: checkpoint path too long: %s\n", r->a.checkpoint);
        return false;
    }
    r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lock_fd < 0) {
        fprintf(stderr,
                "strata changes: cannot create %s: %s (the checkpoint's directory must exist "
                "and be writable)\n",
                path, strerror(errno));
        return false;
    }
    if (flock(r->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr,
                "strata changes: checkpoint %s is in use by another strata changes (%s is "
                "locked): give each consumer its own --checkpoint file, or stop the other one\n",
                r->a.checkpoint, path);
        return false;
    }
    return true;
}

/* --checkpoint FILE does not exist (a first run, a lost file, a run that failed before its first
 * checkpoint). Starting at now would skip every earlier change for good, and a cron line
 * without --from would do so on every loss without a word: a one-shot run needs --from to say
 * where to start; --follow starts at now, its default, and says what that skips. 0 go on, 2
 * refused. */
static int checkpoint_missing(const ch_run *r) {
    const char *ck = r->a.checkpoint;
    if (r->a.from) {
        if (!r->a.quiet)
            fprintf(stderr,
                    "strata changes: checkpoint %s does not exist yet: starting at --from %s\n", ck,
                    r->a.from);
        return 0;
    }
    if (r->a.follow) {
        fprintf(stderr,
                "strata changes: checkpoint %s does not exist: starting at now; changes before "
                "now are not read: pass --from TIME for a first run\n",
                ck);
        return 0;
    }
    fprintf(stderr,
            "strata changes: checkpoint %s does not exist (a first run, or the file was lost): "
            "give --from TIME for where to start (e.g. --from -1d; the table keeps changes for "
            "its retention); later runs resume from %s\n",
            ck, ck);
    return 2;
}

/* Positions of --checkpoint when the file exists. 0 go on, 1 it cannot be used, 2 bad usage
 * (after printing why). */
static int load_checkpoint(ch_run *r, ops_cs_pos **pos, size_t *n) {
    *pos = NULL;
    *n = 0;
    if (!r->a.checkpoint)
        return 0;
    if (!lock_checkpoint(r))
        return 1;
    st_err err = {0};
    st_code rc = ops_cs_ckpt_read(r->a.checkpoint, r->table, pos, n, &err);
    if (rc == ST_NOT_FOUND)
        return checkpoint_missing(r);
    if (rc == ST_OK)
        rc = ops_cs_ckpt_check(r->a.checkpoint, *pos, *n, &err);
    if (rc != ST_OK) {
        for (size_t i = 0; i < *n; i++)
            ops_cs_pos_free(&(*pos)[i]);
        free(*pos);
        *pos = NULL;
        *n = 0;
        fprintf(stderr, "strata changes: %s\n", err.msg);
        return 1;
    }
    r->resumed = true;
    if (!r->a.quiet)
        fprintf(stderr, "strata changes: resuming %zu partition(s) from %s%s\n", *n,
                r->a.checkpoint, r->a.from ? " (--from ignored)" : "");
    return 0;
}

static int run_loop(ch_run *r, const ops_cs_opts *o, const ops_cs_pos *pos, size_t n) {
    st_err err = {0};
    struct event *tick = NULL, *sigint = NULL, *sigterm = NULL;
    r->cs = ops_cs_new(r->base, o, &err);
    if (!r->cs || ops_cs_start(r->cs, pos, n, &err) != ST_OK) {
        fprintf(stderr, "strata changes: %s\n", err.msg);
        ops_cs_free(r->cs);
        return 1;
    }
    int64_t ms = r->tty ? CH_PROGRESS_TTY_MS : CH_CKPT_INTERVAL_MS;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
    tick = event_new(r->base, -1, EV_PERSIST, tick_cb, r);
    r->flush_ev = evtimer_new(r->base, flush_cb, r);
    sigint = evsignal_new(r->base, SIGINT, signal_cb, r);
    sigterm = evsignal_new(r->base, SIGTERM, signal_cb, r);
    if (tick)
        event_add(tick, &tv);
    if (sigint)
        event_add(sigint, NULL);
    if (sigterm)
        event_add(sigterm, NULL);
    event_base_dispatch(r->base);
    flush_output(r); /* the last lines too: a run whose output failed does not end well */
    /* A run that failed before its first checkpoint leaves none: its start was refused (or
     * never reached), and a file holding that start would make every later run resume from it,
     * ignoring a corrected --from. */
    if (!r->out_failed && (r->code == ST_OK || r->ckpt_written))
        checkpoint(r);
    progress(r, true);
    if (tick)
        event_free(tick);
    if (r->flush_ev)
        event_free(r->flush_ev);
    r->flush_ev = NULL;
    if (sigint)
        event_free(sigint);
    if (sigterm)
        event_free(sigterm);
    ops_cs_free(r->cs);
    event_base_loop(r->base, EVLOOP_NONBLOCK);
    if (r->code != ST_OK) {
        fprintf(stderr, "strata changes: %s\n", r->msg);
        if (r->resumed && r->code == ST_INVALID_ARGUMENT)
            fprintf(stderr,
                    "strata changes: the start came from the checkpoint %s (--from is ignored "
                    "while it exists); delete it to start from --from\n",
                    r->a.checkpoint);
        if (r->stalled)
            stall_advice(r);
        return 1;
    }
    return 0;
}

/* --from / --until, and whether the command knows where to start; false after saying why. */
static bool check_times(const ch_run *r, int64_t now, int64_t *from, int64_t *until) {
    const char *bad = r->a.from && !ops_cs_time_parse(r->a.from, now, from)      ? r->a.from
                      : r->a.until && !ops_cs_time_parse(r->a.until, now, until) ? r->a.until
                                                                                 : NULL;
    if (bad) {
        fprintf(stderr,
                "strata changes: bad TIME '%s': use RFC 3339 (2026-12-04T20:00:00Z), "
                "`now`, or -10m / -2h / -1d / -30s\n",
                bad);
        return false;
    }
    if (!r->a.follow && !r->a.from && !r->a.checkpoint && !r->a.enable && !r->a.disable) {
        fprintf(stderr, "strata changes: say where to start: --from TIME (e.g. --from -10m), "
                        "--checkpoint FILE, or --follow for new changes only\n");
        return false;
    }
    /* An --until of 0 would read as none (end_us 0: no end), and --follow run forever. */
    if (r->a.until && *until <= 0) {
        fprintf(stderr, "strata changes: --until %s is not after 1970-01-01T00:00:00Z\n",
                r->a.until);
        return false;
    }
    if (r->a.from && *from > now) {
        fprintf(stderr,
                "strata changes: --from %s is in the future: give a time at or before "
                "now (with --follow, new changes are read as they come)\n",
                r->a.from);
        return false;
    }
    /* Without --from a resumed checkpoint gives the start, which may be before --until. */
    if (*until && *until <= *from && (r->a.from || !r->a.checkpoint)) {
        fprintf(stderr, "strata changes: --until must be after --from\n");
        return false;
    }
    return true;
}

int ops_changes_main(int argc, char **argv) {
    static ch_run run; /* one per process; the loop's callbacks point at it */
    ch_run *r = &run;
    memset(r, 0, sizeof *r);
    r->lock_fd = -1;
    int prc = parse_args(argc, argv, &r->a);
    if (prc)
        return prc == 1 ? 0 : 2;
    int64_t now = st_wall_us(), from = now, until = 0;
    if (!check_times(r, now, &from, &until))
        return 2;
    if (fcntl(STDOUT_FILENO, F_GETFD) == -1) { /* the next file opened would take its place */
        fprintf(stderr, "strata changes: stdout is closed: redirect it to a file or a pipe "
                        "(the changes are printed there)\n");
        return 2;
    }
    char *addr = r->addr;
    if (!resolve_target(r, addr, sizeof r->addr))
        return 1;
    st_log_set_level(ST_LOG_WARN); /* a failed connection is said once, in the error */
    if (r->a.enable || r->a.disable)
        return admin(r, addr);
    ops_cs_pos *pos;
    size_t n;
    int lrc = load_checkpoint(r, &pos, &n);
    if (lrc) {
        if (r->lock_fd >= 0)
            close(r->lock_fd);
        return lrc;
    }
    signal(SIGPIPE, SIG_IGN);
    struct stat st;
    r->out_is_file = fstat(STDOUT_FILENO, &st) == 0 && S_ISREG(st.st_mode);
    if (r->out_is_file && !end_cut_line())
        return 1;
    r->tty = isatty(STDERR_FILENO);
    r->start_mono_us = r->answer_mono_us = st_mono_us();
    r->stall_us = stall_bound_us(r->a.heartbeat_s);
    ops_cs_opts o = {.addr = addr,
                     .table = r->table,
                     .app_profile = r->a.profile ? r->a.profile : "",
                     .start_us = from,
                     .end_us = until         ? until
                               : r->a.follow ? 0
                                             : now,
                     .stop_us = until         ? until
                                : r->a.follow ? 0
                                              : now,
                     .heartbeat_s = r->a.heartbeat_s,
                     .on_change = on_change,
                     .on_done = on_done,
                     .on_retry = on_retry,
                     .arg = r,
                     .copts = ops_secure_router_opts(),
                     .authorization = authorization()};
    r->base = event_base_new();
    int rc = 1;
    if (!r->base)
        fprintf(stderr, "strata changes: cannot create an event loop (out of memory?)\n");
    else
        rc = run_loop(r, &o, pos, n);
    for (size_t i = 0; i < n; i++)
        ops_cs_pos_free(&pos[i]);
    free(pos);
    st_buf_free(&r->line);
    if (r->base)
        event_base_free(r->base);
    if (r->lock_fd >= 0)
        close(r->lock_fd);
    return rc;
}
