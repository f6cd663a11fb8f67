/* ops/instance.h — a local Strata instance on disk, shared by `strata up`, `strata down` and
 * `strata status` (docs/operations.md):
 *
 *   DIR/topology          the instance's shape (docs/formats/topology.md)
 *   DIR/<cluster>-<i>/    node data directories (unless the topology names others)
 *   DIR/logs/<name>.log   each process's stdout and stderr
 *   DIR/run/<name>.pid    each running process's pid
 *   DIR/run/no-unix       present when `strata up --no-unix` started the nodes (TCP only)
 *   <node data dir>/node.sock  a running node's Unix socket, for routers on this host
 *
 * where <name> is "<cluster>-<i>" for the i-th node (from 0) of a cluster and "router" (or
 * "router-<r>" past the first) for routers. */
#ifndef STRATA_OPS_INSTANCE_H
#define STRATA_OPS_INSTANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "paths.h"
#include "strata/rpc.h"
#include "strata/topology.h"

#define OPS_PATH_MAX 1024
/* An instance directory leaves room for "/<cluster id>-<i>" within ST_TOPO_PATH_MAX. */
#define OPS_DIR_MAX (ST_TOPO_PATH_MAX - ST_TOPO_ID_MAX - 16)
#define OPS_NAME_MAX 80 /* "<cluster id>-<i>" fits: ST_TOPO_ID_MAX + 1 + digits */
#define OPS_ROUTER_PORT_DEFAULT 8086
#define OPS_PROCS_MAX (ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX + ST_TOPO_ROUTERS_MAX)

/* Command entry points for ops/strata.c's table; argv[0] is the command name. Exit codes: 0 done,
 * 1 failed (the message says why and what to do), 2 bad usage. */
int ops_up_main(int argc, char **argv);
int ops_down_main(int argc, char **argv);
int ops_status_main(int argc, char **argv);
int ops_failover_main(int argc, char **argv); /* failover.c */
int ops_chaos_main(int argc, char **argv);    /* chaos.c */
int ops_restart_main(int argc, char **argv);  /* restart.c */
/* `strata up` on a partly running instance (restart.c): starts every process of DIR/topology
 * without a live pid, as `strata up` would, and leaves the running ones alone. metrics: 0 keeps
 * each started process's DIR/run/<name>.metrics as recorded, 1 (--metrics) records one for each,
 * -1 (--no-metrics) drops theirs. routers false: the routers are left stopped (said on stdout),
 * since a router started while nodes do not answer waits for them and gives up. Exit code. */
int ops_inst_start_missing(const char *dir, const char *bin_dir, int wait_s, int metrics,
                           bool routers);

/* Before a start of process name (restart.c): its metrics port as the full `strata up` chooses
 * it. metrics as ops_inst_start_missing's: -1 drops DIR/run/<name>.metrics; with a record (or 1)
 * the recorded port while it is free (and not force), else a free loopback port, recorded and
 * said on stdout ("metrics address changed"). A process is never left stopped because of its
 * metrics port. False after a message on stderr (who: the command). */
bool ops_inst_metrics_port(const char *dir, const st_topology *t, const char *name, const char *who,
                           int metrics, bool force);
/* The address DIR/run/<name>.metrics records into addr ("" when none). */
void ops_inst_metrics_read(const char *dir, const char *name, char *addr, size_t cap);

/* Ports (up.c). True when addr is the address of a node or router of t (other than the string
 * skip points to). */
bool ops_inst_addr_used(const st_topology *t, const char *addr, const char *skip);
/* A free loopback port not in t into addr ("127.0.0.1:P"); false when none could be had. */
bool ops_inst_pick_port(const st_topology *t, char *addr, size_t cap);
/* False only when something already listens on addr. */
bool ops_inst_port_free(const char *addr);

/* The instance directory: flag if given, else $STRATA_HOME, else $HOME/.strata/local. False (with
 * a message on stderr) when none can be formed, or flag is empty (never the default). */
bool ops_inst_dir(const char *flag, char *out, size_t cap);
/* Loads the topology of the instance in ops_inst_dir(flag) for a command (cmd, e.g. "strata
 * backup") that reaches its router. False (with a message on stderr saying what to do) when
 * there is none or it names no router. */
bool ops_inst_topology(const char *cmd, const char *flag, st_topology *topo);

/* snprintf that reports truncation (false) instead of cutting a path short silently. */
bool ops_fmt(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Names of the processes of a topology: node j of cluster i, router r. */
void ops_inst_node_name(const st_topology *t, size_t i, size_t j, char out[OPS_NAME_MAX]);
void ops_inst_router_name(size_t r, char out[OPS_NAME_MAX]);

/* DIR/run/<name>.pid's pid; 0 when the file is missing or unreadable. */
pid_t ops_inst_pid_read(const char *dir, const char *name);
/* Writes DIR/run/<name>.pid (atomically). False on failure. */
bool ops_inst_pid_write(const char *dir, const char *name, pid_t pid);
void ops_inst_pid_remove(const char *dir, const char *name);
/* Removes DIR/run/<name>.pid only while it still holds pid (the process the caller stopped or
 * saw die): a pid file another command wrote meanwhile names a live process, and without it no
 * command could find (stop) that process. */
void ops_inst_pid_remove_if(const char *dir, const char *name, pid_t pid);

/* The instance lock: an exclusive flock of DIR itself (nothing left behind to purge), taken by
 * `strata up`, `strata down`, `strata restart` and every `strata chaos` action for their whole
 * run, so they never race on DIR/topology, DIR/run/partition and the pid files (two restarts of
 * one process each stopping the other's start, then removing the pid file of the one left
 * running; a `down` between a restart's stop and its start, leaving the new process running
 * after "Stopped."; a heal between a restart's reading of the partition and its node listening,
 * leaving that node cut).
 * A second command waits (said on stdout) for the first to finish. A DIR removed while the
 * command waited (`strata down --purge`) is locked again as it is then (create: made anew, for
 * `strata up`; else "no instance"). Close-on-exec: the processes started do not hold it.
 * Returns the descriptor (close it to unlock), or -1 after a message on stderr (who: the
 * command, e.g. "strata restart"; a missing DIR is "no instance" unless create). */
int ops_inst_lock(const char *dir, const char *who, bool create);
/* True if pid is a live process that looks like ours (its command starts "strata"), so a pid
 * reused by something else after a crash is not mistaken for a Strata process. */
bool ops_inst_pid_alive(pid_t pid);
/* True when DIR is an instance `strata up` ran (DIR/run exists) and no node or router of t has a
 * live pid: the instance is stopped, and a command that needs it says so at once (`strata up`)
 * instead of retrying connections it knows nobody answers. */
bool ops_inst_all_stopped(const char *dir, const st_topology *t);
/* True when pid is stopped by a signal (SIGSTOP, SIGTSTP, Ctrl-Z) or by a debugger: state T or t
 * in /proc/PID/stat. Such a process answers nothing until continued (`kill -CONT PID`). */
bool ops_inst_pid_stopped(pid_t pid);
/* Waits up to wait_ms for a process of ours that stopped (ops_inst_pid_alive false: killed,
 * exiting, a zombie) to be gone with all its threads: until then it still holds its files (a
 * node's data directory lock, its listening socket), and a process started in its place would
 * find them taken. True when gone (or not ours), false when still there after wait_ms. */
bool ops_inst_pid_wait_gone(pid_t pid, int wait_ms);
/* Asks pid to stop: SIGTERM, then SIGCONT, so a process stopped with SIGSTOP (or ^Z) wakes to
 * handle it and exits cleanly at once instead of sitting out the caller's grace period until its
 * SIGKILL. kill()'s result for the SIGTERM (errno set on -1). */
int ops_inst_term(pid_t pid);

/* Lists the names of the pid files in DIR/run (without ".pid"); returns how many (at most max). */
size_t ops_inst_pid_names(const char *dir, char names[][OPS_NAME_MAX], size_t max);

/* True if something accepts TCP connections at addr ("host:port") within timeout_ms. */
bool ops_inst_tcp_ready(const char *addr, int timeout_ms);

/* Prints the last lines of path to stderr, indented, for failure reports. */
void ops_inst_log_tail(const char *path, int lines);
/* How a started process ended, from its wait status, for "NAME %s before listening": "exited
 * with status 1", "was killed by signal 9 (Killed)"; a file-size limit (SIGXFSZ) is named with
 * what to do. Returns out. */
const char *ops_inst_ended_said(int status, char *out, size_t cap);
/* What DIR/logs/<name>.log says of the process's latest start (the part after the last "=== ...
 * starts <name>" line ops_inst_spawn wrote, within the log's last 8 KiB): *listened when it
 * printed its "listening on" line (a node prints it once its log is replayed), and its last line
 * into last (cut to cap). False when the log cannot be read. */
bool ops_inst_log_start_state(const char *dir, const char *name, bool *listened, char *last,
                              size_t cap);

/* GetStatus of the node at addr (host:port or unix:PATH) within OPS_NODE_STATUS_TIMEOUT_MS, its
 * reply in resp (may be NULL); *serving: the node answered (UNIMPLEMENTED too: an older build,
 * serving without GetStatus). `strata status` and `strata failover` ask it. */
#define OPS_NODE_STATUS_TIMEOUT_MS 2000 /* a healthy node answers in milliseconds */
st_code ops_inst_node_status(const char *addr, st_buf *resp, bool *serving);
/* PingAndWarm of the topology's instance at router addr, within OPS_NODE_STATUS_TIMEOUT_MS (with
 * the admin token and CA of a secure instance): what client libraries send first, so any gRPC
 * answer (OK, or UNIMPLEMENTED from an older build) means the router serves. The call's end. */
st_code ops_inst_router_ping(const st_topology *t, const char *addr);
/* The router a command talks to when no --endpoint names one, into out: the first of t's routers
 * that answers PingAndWarm, so the command works through router-1 while the first router is
 * down or stopped (each that does not answer costs up to OPS_NODE_STATUS_TIMEOUT_MS). A lone
 * router is not probed: the command's own call says why it fails. When none answers, out holds
 * the first and false is returned, after saying so on stderr unless cmd (the command) is NULL:
 * naming each router and how to start them (dir_flag: --dir, for the advice). */
bool ops_inst_router_pick(const char *cmd, const st_topology *t, const char *dir_flag, char *out,
                          size_t cap);
/* True when rc, the end of a call above to a process whose pid is alive, says it does not answer
 * at all (hung, stopped with SIGSTOP, or still starting): no reply in time, or no connection.
 * Not for a port that takes connections and refuses the call at once (UNAVAILABLE: TLS
 * trouble), which a restart would not mend. `strata status` and `strata up` say it, and suggest
 * `strata restart NAME`. */
bool ops_inst_not_answering(st_code rc, const char *addr);

/* ---- starting processes (`strata up`, `strata chaos restart-cluster`) ---- */
#define OPS_ARGV_MAX 32
#define OPS_POLL_MS 50
#define OPS_PROGRESS_EVERY_S 5

/* A process's command line exactly as `strata up` runs it; argv points into this struct, bin and
 * the topology, which must outlive it. */
typedef struct ops_cmdline {
    char *argv[OPS_ARGV_MAX];
    char nums[3][32];
    char topo_path[OPS_PATH_MAX + 16];
    char metrics_addr[ST_TOPO_ADDR_MAX + 1];
    char unix_path[ST_TOPO_PATH_MAX + 16];
    char tls[5][OPS_PATH_MAX + OPS_NAME_MAX + 32]; /* a secure instance's files (certs.h) */
} ops_cmdline;
/* DIR/run/no-unix: `strata up --no-unix` (present) or not (absent); false when it cannot be
 * written or removed. */
bool ops_inst_no_unix_write(const char *dir, bool no_unix);
bool ops_inst_no_unix(const char *dir);

/* Both add --metrics ADDR when DIR/run/<name>.metrics holds one (`strata up --metrics` writes it;
 * docs/metrics.md), so every start of a process serves its metrics on the same port. */
/* strata-node --data D --listen ADDR --node-num N --cluster-num C --config DIR/topology
 * [--split-bytes S] [--unix D/node.sock] for node j of cluster i. --unix unless DIR/run/no-unix
 * exists or the path does not fit in a socket address (st_topo_node_sock_path). */
void ops_inst_node_cmdline(ops_cmdline *cl, const char *dir, const char *bin, const st_topology *t,
                           size_t i, size_t j);
/* Both also add, on a secure instance (DIR/secure/ca.pem exists; certs.h), the node's
 * --tls-cert/--tls-key/--tls-ca, and the router's --tls-cert/--tls-key, --internal-ca and, when
 * DIR/secure/principals exists, --auth-file and --audit-log DIR/logs/audit.log. */
/* strata-router --config DIR/topology --listen ADDR for router r. */
/* Whether the strata-router at bin takes --auth-file (a build with token checks). */
bool ops_router_takes_auth(const char *bin);
void ops_inst_router_cmdline(ops_cmdline *cl, const char *dir, const char *bin,
                             const st_topology *t, size_t r);

/* Forks argv as a daemon named name: its own session (a terminal's Ctrl-C or hang-up does not
 * reach it), stdin from /dev/null, stdout and stderr appended to DIR/logs/<name>.log after a
 * "=== <time> <who> starts <name>: <command line>" line, and DIR/run/<name>.pid. Returns the pid
 * (a child of this process), 0 on failure (said on stderr). *log_offset: where this start's
 * output begins in the log. */
pid_t ops_inst_spawn(const char *dir, const char *name, char *const argv[], const char *who,
                     long *log_offset);

/* Whether DIR/logs/<name>.log, read from offset (ops_inst_spawn's *log_offset) for at most 4 KiB,
 * holds a (and b, when not NULL): what a start that just failed said about why. */
bool ops_inst_log_says(const char *dir, const char *name, long offset, const char *a,
                       const char *b);

typedef enum ops_wait { OPS_READY, OPS_EXITED, OPS_TIMEOUT } ops_wait;
/* Waits until pid (a child of this process) accepts connections at addr, exits (*status from
 * waitpid), or wait_s passes, with a progress line every OPS_PROGRESS_EVERY_S seconds so a slow
 * start (a node replaying its log) does not look like a hang. */
ops_wait ops_inst_wait_ready(const char *dir, const char *name, pid_t pid, const char *addr,
                             int wait_s, int *status);

/* ---- cut replication links (`strata chaos partition`, DIR/run/partition) ----
 * The file lists the cut cluster pairs, one "A B" line each; it lives only while the instance
 * runs (`strata down` and a fresh `strata up` remove it, as the nodes forget their cuts). */
#define OPS_PARTITION_PAIRS_MAX (ST_TOPO_CLUSTERS_MAX * ST_TOPO_CLUSTERS_MAX)
typedef struct ops_partition {
    size_t n;
    char a[OPS_PARTITION_PAIRS_MAX][ST_TOPO_ID_MAX + 1]; /* pair i cuts a[i] from b[i] */
    char b[OPS_PARTITION_PAIRS_MAX][ST_TOPO_ID_MAX + 1];
} ops_partition;
/* Reads DIR/run/partition (absent: no pairs). False only when it exists and is unreadable. */
bool ops_inst_partition_read(const char *dir, ops_partition *out);
/* Writes it atomically (no pairs: removes it). False on failure. */
bool ops_inst_partition_write(const char *dir, const ops_partition *p);
/* True if clusters x and y are cut from each other. */
bool ops_inst_partition_cut(const ops_partition *p, const char *x, const char *y);
/* Sends node j of cluster i (strata.internal.v1.Replication/SetLinks) the links part cuts for its
 * cluster, printing a line on success unless quiet. 0: done; 1: the node refused (said on
 * stderr); -1: it does not answer, said by the caller (down, or stopped: what that means depends
 * on the command). */
#define OPS_SET_LINKS_TIMEOUT_MS 5000 /* SetLinks answers at once on a live node */
int ops_inst_set_links(const st_topology *t, const ops_partition *part, size_t i, size_t j,
                       bool quiet);

/* Bytes used on disk under path (0 if absent). */
unsigned long long ops_inst_disk_bytes(const char *path);
/* "12.3 MiB"-style size into out. */
void ops_inst_fmt_bytes(unsigned long long v, char *out, size_t cap);

#endif
