/* auth_call.c — one gRPC call to a router with a chosen bearer token and body, for
 * auth_router_test.sh: prints the call's status name and message on one line ("OK" when it
 * succeeded) and exits 0 whenever the call ran, 2 on bad usage.
 *   auth_call ADDR PATH [--ca FILE] [--name HOST] [--token TOKEN] [--body BYTES]
 *             [--field1 TEXT] [--again-when FILE] [--more T1,T2,...]
 * The request is BYTES zero bytes (default none): the router refuses a call without a valid
 * token before reading its body, so a large one shows whether it was buffered. --field1: the
 * request is a message whose field 1 is TEXT (ListTables' parent, GetTable's name). --again-when:
 * after the first call, waits until FILE exists and makes the same call again on the SAME
 * connection (a second status line; "NEW-CONNECTION" instead when the first connection died),
 * which shows that a token revoked meanwhile is refused on connections already open. --more: then
 * one more call on the same connection with each token of the list ("-": none), a line each,
 * which shows that each header on one connection is checked for itself. The
 * deadlines (30 s per call, 60 s for the file) are hang guards; the test asserts on statuses. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "strata/rpc.h"

#define CALL_TIMEOUT_MS 30000
#define WAIT_FILE_MS 60000

typedef struct args {
    const char *addr, *path, *ca, *name, *token, *body, *again, *field1, *more;
} args;

typedef struct outcome {
    bool done;
    st_code code;
    char msg[512];
} outcome;

static int parse(int argc, char **argv, args *a) {
    if (argc < 3 || (argc - 3) % 2)
        return 2;
    a->addr = argv[1];
    a->path = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        const char **slot = !strcmp(f, "--ca")           ? &a->ca
                            : !strcmp(f, "--name")       ? &a->name
                            : !strcmp(f, "--token")      ? &a->token
                            : !strcmp(f, "--body")       ? &a->body
                            : !strcmp(f, "--again-when") ? &a->again
                            : !strcmp(f, "--field1")     ? &a->field1
                            : !strcmp(f, "--more")       ? &a->more
                                                         : NULL;
        if (!slot)
            return 2;
        *slot = v;
    }
    return 0;
}

static void on_done(st_code code, const char *message, st_slice response, void *arg) {
    (void)response;
    outcome *o = arg;
    o->done = true;
    o->code = code;
    snprintf(o->msg, sizeof o->msg, "%s", message ? message : "");
}

/* One call on c with token (NULL: none); prints its status. */
static void call_as(struct event_base *base, rpc_client *c, const args *a, const char *token,
                    st_slice body) {
    char auth[600];
    rpc_metadata md = {"authorization", auth};
    snprintf(auth, sizeof auth, "Bearer %s", token ? token : "");
    outcome o = {0};
    if (rpc_client_unary(c, a->path, body, &md, token ? 1 : 0, CALL_TIMEOUT_MS, on_done, &o) !=
        ST_OK) {
        printf("CLIENT-CALL could not start the call\n");
        return;
    }
    while (!o.done)
        event_base_loop(base, EVLOOP_ONCE);
    printf("%s %s\n", st_code_name(o.code), o.code == ST_OK ? "" : o.msg);
    fflush(stdout);
}

static void call_once(struct event_base *base, rpc_client *c, const args *a, st_slice body) {
    call_as(base, c, a, a->token, body);
}

/* --more: one call per token of the comma-separated list, on the same connection. */
static void call_more(struct event_base *base, rpc_client *c, const args *a, st_slice body) {
    char list[2048];
    snprintf(list, sizeof list, "%s", a->more);
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!rpc_client_alive(c)) {
            printf("NEW-CONNECTION the first connection closed\n");
            return;
        }
        call_as(base, c, a, strcmp(t, "-") ? t : NULL, body);
    }
}

/* Waits for path, turning the loop so the open connection keeps answering the server. */
static bool wait_file(struct event_base *base, const char *path) {
    for (int waited = 0; waited < WAIT_FILE_MS; waited += 20) {
        if (access(path, F_OK) == 0)
            return true;
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(20 * 1000);
    }
    return false;
}

int main(int argc, char **argv) {
    args a = {0};
    signal(SIGPIPE, SIG_IGN);
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: auth_call ADDR PATH [--ca F] [--name HOST] [--token T] "
                        "[--body BYTES] [--field1 TEXT] [--again-when FILE] [--more T1,T2]\n");
        return 2;
    }
    st_err err = {0};
    struct ssl_ctx_st *ctx = a.ca ? rpc_tls_client_ctx_new(a.ca, NULL, NULL, &err) : NULL;
    if (a.ca && !ctx) {
        printf("CLIENT-SETUP %s\n", err.msg);
        return 0;
    }
    char host[256];
    const char *colon = strrchr(a.addr, ':');
    if (!colon || (size_t)(colon - a.addr) >= sizeof host)
        return 2;
    memcpy(host, a.addr, (size_t)(colon - a.addr));
    host[colon - a.addr] = '\0';
    size_t n = a.body ? strtoull(a.body, NULL, 10) : 0;
    size_t f1 = a.field1 ? strlen(a.field1) : 0;
    if (f1 > 127)
        return 2;
    if (a.field1)
        n = 2 + f1;
    uint8_t *body = calloc(1, n ? n : 1);
    if (a.field1 && body) { /* field 1, length-delimited, one-byte length */
        body[0] = 0x0a;
        body[1] = (uint8_t)f1;
        memcpy(body + 2, a.field1, f1);
    }
    struct event_base *base = event_base_new();
    rpc_client_opts o = {.ssl_ctx = ctx, .server_name = a.name};
    rpc_client *c =
        base && body ? rpc_client_new(base, host, (uint16_t)atoi(colon + 1), &o, &err) : NULL;
    if (!c) {
        printf("CLIENT-SETUP %s\n", err.msg[0] ? err.msg : "out of memory");
    } else {
        call_once(base, c, &a, st_slice_make(body, n));
        if (a.again && !wait_file(base, a.again))
            printf("CLIENT-WAIT %s never appeared\n", a.again);
        else if (a.again && !rpc_client_alive(c))
            printf("NEW-CONNECTION the first connection closed\n");
        else if (a.again)
            call_once(base, c, &a, st_slice_make(body, n));
        if (a.more)
            call_more(base, c, &a, st_slice_make(body, n));
        rpc_client_free(c);
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    if (base)
        event_base_free(base);
    free(body);
    if (ctx)
        SSL_CTX_free(ctx);
    return 0;
}
