/* ops/strata.c — the `strata` command-line tool: `strata <command> [flags]`. Each command is
 * one row of the table below (name, entry point, one-line summary); adding a command (up, down,
 * status, failover, chaos, backup...) is adding its row. */
#include <errno.h>
#include <stdbool.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "backup_dir.h"
#include "bench.h"
#include "changes.h"
#include "instance.h"

typedef int (*strata_cmd_fn)(int argc, char **argv); /* argv[0] is the command name */

typedef struct strata_cmd {
    const char *name;
    strata_cmd_fn run;
    const char *summary;
} strata_cmd;

static int cmd_help(int argc, char **argv);

static const strata_cmd commands[] = {
    {"bench", ops_bench_main, "load-test a Bigtable endpoint (Strata or the emulator)"},
    {"up", ops_up_main, "start a local instance (2 clusters x 3 nodes + router on :8086)"},
    {"down", ops_down_main, "stop a local instance (data kept; --purge deletes it)"},
    {"status", ops_status_main, "show a local instance's clusters, nodes, tablets and health"},
    {"failover", ops_failover_main, "point a single-cluster app profile at another cluster"},
    {"chaos", ops_chaos_main, "rehearse failures: kill/restart a cluster, cut/heal replication"},
    {"restart", ops_restart_main,
     "stop and start one process of a local instance (east-1, router)"},
    {"auth", ops_auth_main, "principals, tokens and roles of a router's --auth-file"},
    {"changes", ops_changes_main, "print a table's change stream as JSON lines (--follow)"},
    {"backup", ops_backup_main, "backups: create/list/restore, export/import/verify a directory"},
    {"help", cmd_help, "list the commands, or `strata help CMD` for one"},
};
#define COMMANDS_COUNT (sizeof(commands) / sizeof(commands[0]))

static const strata_cmd *cmd_find(const char *name) {
    for (size_t i = 0; i < COMMANDS_COUNT; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

static void usage(FILE *out) {
    fprintf(out, "usage: strata <command> [flags]\n\ncommands:\n");
    for (size_t i = 0; i < COMMANDS_COUNT; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`strata <command> --help` describes a command's flags; `strata --version` "
                 "prints the version.\n");
}

static int cmd_help(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    const strata_cmd *c = cmd_find(argv[1]);
    if (!c)
        fprintf(stderr, "strata help: unknown command '%s'\n\n", argv[1]);
    if (!c || c->run == cmd_help) {
        usage(c ? stdout : stderr);
        return c ? 0 : 2;
    }
    char *sub[] = {argv[1], "--help", NULL};
    return c->run(2, sub);
}

/* Whether stdout is a pipe whose reader went away (`| head -1`): not a failure of the command. */
static bool stdout_reader_gone(void) {
    struct pollfd p = {.fd = STDOUT_FILENO, .events = 0};
    return errno == EPIPE || (poll(&p, 1, 0) == 1 && (p.revents & POLLERR));
}

/* The command's exit code, 1 when what it printed did not all reach stdout (a full disk): a
 * script reading `strata backup list --json >FILE` must not take a cut file for the list. */
static int stdout_checked(int rc) {
    errno = 0;
    if ((fflush(stdout) == 0 && !ferror(stdout)) || stdout_reader_gone())
        return rc;
    fprintf(stderr, "strata: cannot write to stdout%s%s\n", errno ? ": " : "",
            errno ? strerror(errno) : "");
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    /* A server that refuses a call's TLS handshake, or dies mid-call, closes the socket under
     * the command's writes: that is an error to report, not a reason to die. */
    signal(SIGPIPE, SIG_IGN);
    /* Likewise a write past a file-size limit (`ulimit -f`): it fails with EFBIG ("File too
     * large"), and the command's error path cleans up (an export removes its directory). */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return cmd_help(1, argv + 1);
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("strata %s\n", st_version());
        return 0;
    }
    const strata_cmd *c = cmd_find(argv[1]);
    if (!c) {
        fprintf(stderr, "strata: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
        return 2;
    }
    return stdout_checked(c->run(argc - 1, argv + 1));
}
