/* rpc_loop_run: the event loop of a server process, with optional busy polling before it sleeps.
 *
 * Why: at one call in flight (1 connection x 1 stream) a call's latency is mostly wake-ups. Each
 * process on the path (client, router, node) goes idle between the request and the answer, and
 * waking an idle vCPU costs a context switch plus an inter-processor interrupt through the
 * hypervisor: perf showed 40% of the router's CPU in finish_task_switch and in the wake-up of
 * the reader (sock_def_readable). Polling the sockets for a few tens of microseconds after the
 * last activity catches the next message of a conversation without sleeping (Go's runtime, and
 * so the emulator, spins the same way before it parks a thread). While calls are open, an answer
 * is known to be coming, so the loop polls POLL_OPEN_CALLS_MULT times longer.
 *
 * Polling must not take a core from work that needs it. Each pass yields (sched_yield: any
 * runnable thread on this CPU goes first), and the loop stops polling altogether while its thread
 * waits for a CPU: every POLL_CHECK_US it reads its own run-queue wait from
 * /proc/thread-self/schedstat, and a wait above 1/POLL_CONTENDED_DIV of the interval means the
 * cores are oversubscribed (a loaded machine, or many calls in flight), where sleeping is right. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "rpc_internal.h"

#define POLL_CHECK_US 5000    /* re-read the run-queue wait every 5 ms */
#define POLL_CONTENDED_DIV 20 /* waiting more than 5% of the time: contended */

/* While calls are open the answer they wait for (a node's reply, a commit's fdatasync of
 * ~100-150 us here) is on its way: poll this many times longer before sleeping. */
#define POLL_OPEN_CALLS_MULT 4

/* Bumped by every socket read and every posted completion of this thread's loop. */
static _Thread_local uint64_t loop_activity;
/* Server and client calls of this thread's loop that have started and not ended. */
static _Thread_local int64_t loop_open_calls;

void h2_loop_activity(void) {
    loop_activity++;
}

void h2_loop_calls(int delta) {
    loop_open_calls += delta;
}

typedef struct loop_state {
    int schedstat_fd; /* -1: unknown (no schedstat): assume uncontended */
    int64_t checked_us;
    uint64_t wait_ns;
    bool contended;
} loop_state;

/* A thread's run time and run-queue wait so far (schedstat's first two fields, from its open
 * file fd), or false. */
static bool read_schedstat(int fd, uint64_t *run_ns, uint64_t *wait_ns) {
    char buf[96];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0)
        return false;
    buf[n] = 0;
    return sscanf(buf, "%" SCNu64 " %" SCNu64, run_ns, wait_ns) == 2;
}

/* now: st_mono_us. schedstat counts nanoseconds. */
static bool loop_contended(loop_state *ls, int64_t now) {
    if (ls->schedstat_fd < 0 || now - ls->checked_us < POLL_CHECK_US)
        return ls->contended;
    uint64_t run, wait;
    if (read_schedstat(ls->schedstat_fd, &run, &wait)) {
        ls->contended =
            (int64_t)(wait - ls->wait_ns) * POLL_CONTENDED_DIV > (now - ls->checked_us) * 1000;
        ls->wait_ns = wait;
    }
    ls->checked_us = now;
    return ls->contended;
}

/* Polls without blocking until spin_us pass with no activity, or the loop is told to stop.
 * Returns false when the loop should end. */
static bool loop_poll(struct event_base *base, loop_state *ls, unsigned spin_us) {
    int64_t window = (int64_t)spin_us;
    int64_t now = st_mono_us();
    int64_t last = now;
    uint64_t seen = loop_activity;
    while (!loop_contended(ls, now)) {
        if (event_base_loop(base, EVLOOP_NONBLOCK) != 0 || event_base_got_break(base) ||
            event_base_got_exit(base))
            return false;
        now = st_mono_us();
        int64_t budget = loop_open_calls > 0 ? window * POLL_OPEN_CALLS_MULT : window;
        if (loop_activity != seen) {
            seen = loop_activity;
            last = now;
        } else if (now - last >= budget) {
            break;
        } else {
            sched_yield();
        }
    }
    return true;
}

int rpc_loop_run(struct event_base *base, unsigned spin_us) {
    if (spin_us == 0)
        return event_base_dispatch(base) < 0 ? -1 : 0;
    loop_state ls = {.schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)};
    int rc;
    for (;;) {
        rc = event_base_loop(base, EVLOOP_ONCE);
        if (rc != 0 || event_base_got_break(base) || event_base_got_exit(base))
            break;
        if (!loop_poll(base, &ls, spin_us))
            break;
    }
    if (ls.schedstat_fd >= 0)
        close(ls.schedstat_fd);
    return rc < 0 ? -1 : 0;
}

/* ---- watchdog ----
 * A late tick says the loop thread was held, not by what. The thread's own run time and
 * run-queue wait over the gap (schedstat) tell the kinds apart: cpu_ms near blocked_ms is work
 * done on the loop (a scan, a checksum); runq_ms the machine's other threads holding the CPU; both
 * small a wait off the CPU: an fsync, a lock or condition, or the process being stopped
 * (SIGSTOP, a debugger) — the log lines before it tell which. */

#define WATCH_PERIOD_MS 250
#define WATCH_LATE_MS 1000

struct rpc_loop_watch {
    struct event *ev;
    int64_t due_us;
    const char *who;
    int schedstat_fd; /* the loop thread's; -1 when unknown */
    uint64_t run_ns, wait_ns;
};

static void watch_sched(rpc_loop_watch *w, uint64_t *run_ns, uint64_t *wait_ns) {
    if (!read_schedstat(w->schedstat_fd, run_ns, wait_ns))
        *run_ns = *wait_ns = 0;
}

static void watch_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    rpc_loop_watch *w = arg;
    int64_t now = st_mono_us();
    int64_t late_ms = (now - w->due_us) / 1000;
    uint64_t run, wait;
    watch_sched(w, &run, &wait);
    if (late_ms >= WATCH_LATE_MS)
        st_log(ST_LOG_WARN, "rpc",
               "msg=\"event loop blocked\" process=%s blocked_ms=%" PRId64 " cpu_ms=%" PRIu64
               " runq_ms=%" PRIu64
               " why=\"one piece of work held the loop thread; every call of this process "
               "waited that long (cpu_ms: the loop thread computing; runq_ms: waiting for a CPU; "
               "neither: waiting on a disk, a lock, or the process was stopped)\"",
               w->who, late_ms, (run - w->run_ns) / 1000000, (wait - w->wait_ns) / 1000000);
    w->run_ns = run;
    w->wait_ns = wait;
    w->due_us = now + WATCH_PERIOD_MS * 1000;
}

/* base's loop runs on the calling thread (the schedstat read is that thread's). */
rpc_loop_watch *rpc_loop_watch_start(struct event_base *base, const char *who) {
    rpc_loop_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->who = who;
    w->schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    w->ev = event_new(base, -1, EV_PERSIST, watch_cb, w);
    struct timeval tv = {0, WATCH_PERIOD_MS * 1000};
    if (!w->ev || event_add(w->ev, &tv) != 0) {
        rpc_loop_watch_stop(w);
        return NULL;
    }
    watch_sched(w, &w->run_ns, &w->wait_ns);
    w->due_us = st_mono_us() + WATCH_PERIOD_MS * 1000;
    return w;
}

void rpc_loop_watch_stop(rpc_loop_watch *w) {
    if (!w)
        return;
    if (w->ev)
        event_free(w->ev);
    if (w->schedstat_fd >= 0)
        close(w->schedstat_fd);
    free(w);
}

bool rpc_loop_poll_parse(const char *text, unsigned *spin_us) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v > RPC_LOOP_POLL_US_MAX)
        return false;
    *spin_us = (unsigned)v;
    return true;
}
