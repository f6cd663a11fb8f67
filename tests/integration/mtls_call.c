/* mtls_call.c — one gRPC call with chosen TLS credentials, for mtls_test.sh: prints the call's
 * status name and message on one line ("OK ..." when it succeeded) and exits 0 whenever the call
 * ran, 2 on bad usage.
 *   mtls_call ADDR PATH [--ca FILE] [--cert FILE --key FILE] [--role ROLE] [--name HOST]
 *             [--read TABLE] [--find TEXT]
 * The request is empty (the access check runs before the request is read), or with --read a
 * ReadRows of the whole table projects/p/instances/i/tables/TABLE; --find then prints "found"
 * after the status when TEXT appears in the answer. Without --ca the call is plaintext. The
 * deadline (30 s) is a hang guard; the test asserts on status and message, never on time. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <openssl/ssl.h>

#include "google/bigtable/v2/bigtable.pb-c.h"
#include "strata/rpc.h"

#define CALL_TIMEOUT_MS 30000

typedef struct args {
    const char *addr, *path, *ca, *cert, *key, *role, *name, *table, *find;
} args;

typedef struct answer {
    const char *find;
    bool found;
} answer;

static void on_msg(st_slice msg, void *arg) {
    answer *a = arg;
    if (a->find && memmem(msg.data, msg.len, a->find, strlen(a->find)))
        a->found = true;
}

static int parse(int argc, char **argv, args *a) {
    if (argc < 3)
        return 2;
    a->addr = argv[1];
    a->path = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        const char **slot = !strcmp(f, "--ca")     ? &a->ca
                            : !strcmp(f, "--cert") ? &a->cert
                            : !strcmp(f, "--key")  ? &a->key
                            : !strcmp(f, "--role") ? &a->role
                            : !strcmp(f, "--name") ? &a->name
                            : !strcmp(f, "--read") ? &a->table
                            : !strcmp(f, "--find") ? &a->find
                                                   : NULL;
        if (!slot)
            return 2;
        *slot = v;
    }
    return (argc - 3) % 2 ? 2 : 0;
}

int main(int argc, char **argv) {
    args a = {0};
    signal(SIGPIPE, SIG_IGN); /* a server that refuses the handshake closes the socket under us */
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: mtls_call ADDR PATH [--ca F] [--cert F --key F] [--role R] "
                        "[--name HOST] [--read TABLE] [--find TEXT]\n");
        return 2;
    }
    st_err err = {0};
    struct ssl_ctx_st *ctx = a.ca ? rpc_tls_client_ctx_new(a.ca, a.cert, a.key, &err) : NULL;
    if (a.ca && !ctx) {
        printf("CLIENT-SETUP %s\n", err.msg);
        return 0;
    }
    rpc_client_opts o = {.ssl_ctx = ctx, .peer_role = a.role, .server_name = a.name};
    uint8_t buf[512];
    size_t len = 0;
    char name[256];
    if (a.table) {
        Google__Bigtable__V2__ReadRowsRequest req;
        google__bigtable__v2__read_rows_request__init(&req);
        snprintf(name, sizeof name, "projects/p/instances/i/tables/%s", a.table);
        req.table_name = name;
        len = google__bigtable__v2__read_rows_request__pack(&req, buf);
    }
    answer ans = {.find = a.find};
    st_code rc = rpc_blocking_stream(a.addr, &o, a.path, st_slice_make(buf, len), NULL, 0,
                                     CALL_TIMEOUT_MS, on_msg, &ans, &err);
    printf("%s %s%s\n", st_code_name(rc), rc == ST_OK ? "" : err.msg, ans.found ? " found" : "");
    if (ctx)
        SSL_CTX_free(ctx);
    return 0;
}
