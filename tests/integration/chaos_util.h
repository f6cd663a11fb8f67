/* chaos_util.h — what the replication fault tests (convergence_test.c, crash_repl_test.c) share:
 * a local instance started with `strata up` in a temporary directory, `strata` subcommands run
 * as child processes (`strata chaos ...`), failure reports that keep the instance's logs, and
 * clients bound to single-cluster app profiles. Test code only; one instance per process. */
#ifndef STRATA_TEST_CHAOS_UTIL_H
#define STRATA_TEST_CHAOS_UTIL_H

#include <stdbool.h>
#include <sys/types.h>

#include "btclient.h"
#include "strata/topology.h"

/* The instance (valid after ci_up). */
extern char ci_dir[BT_PATH_MAX];
extern char ci_router[BT_ADDR_MAX];
extern st_topology ci_topo;

/* Remembers the test's name and argv[1] (the strata binary). Returns 0 to go on, 77 (skip) when
 * strata, or strata-node / strata-router next to it in the build tree, are missing. */
int ci_init(const char *test, int argc, char **argv);
/* `strata up --clusters C --nodes N` in a fresh temporary directory on a free router port. */
void ci_up(int clusters, int nodes);
/* ci_up with more `strata up` flags (NULL-terminated), e.g. --split-bytes N. */
void ci_up_with(int clusters, int nodes, const char *const *extra);
/* Runs `strata ARGS...` (NULL-terminated, without the binary); its output goes to ours with each
 * line as it comes. Returns its exit status (-1 when it did not exit normally). */
int ci_strata(const char *const *args);
/* The same; a non-zero exit fails the test. */
void ci_strata_ok(const char *const *args);
/* Fails the test: message, logs kept (instance stopped, directory kept), exit 1. */
void ci_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* `strata down --purge` and removes the directory (kept when $STRATA_TEST_KEEP is set). */
void ci_down(void);
/* A client of the router with app profile `profile` ("" = default). */
void ci_client(bt_client *c, const char *profile);
/* A whole-number knob from the environment (CTest scales runs with them), else def. */
long ci_env_long(const char *name, long def);
/* The pid of the instance's process name ("east-1", "router") from its run/<name>.pid; fails
 * the test when there is none. */
pid_t ci_pid(const char *name);
/* Monotonic milliseconds. */
long long ci_now_ms(void);
/* GetOperation of name through the router once: 1 done (*code its error, ST_OK for success;
 * msg its message), 0 running, -1 no answer. */
int ci_op_poll(const char *name, st_code *code, char *msg, size_t cap);
/* ci_op_poll every 100 ms until done (no answer, as while the router restarts, is retried): the
 * operation's code; fails the test after polls polls (a hang guard, not a timing check). */
st_code ci_op_wait(const char *name, int polls, char *msg, size_t cap);
/* CreateBackup through the router: table (a full name) as backup id of cluster (a full name),
 * expiring expire_s from now; hot_s > 0: HOT, turning STANDARD hot_s from now. The running
 * operation's name into op. */
st_code ci_create_backup(const char *cluster, const char *table, const char *id, int64_t expire_s,
                         int64_t hot_s, char *op, size_t cap, st_err *st);

#endif
