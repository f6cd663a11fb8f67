/* fuzz_h2server: the RPC server (proto/rpc/server*.c) on the bytes of one client connection, as
 * strata-node and strata-router receive them: an HTTP/2 preface, frames, HPACK headers, gRPC
 * messages. Each input is written into one end of a socket pair whose other end the server
 * accepts as a connection; the event loop runs until the server has read everything, then the
 * client side closes and the loop runs until the connection is gone. The server has a unary
 * method that answers with the request and a streaming one that answers with two messages, so
 * calls run to completion, responses and trailers go out and flow control is exercised.
 * Properties: no crash, leak, use after free or UB in the server, nghttp2 glue or gRPC framing;
 * every connection closes once its client has gone. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "server_internal.h" /* h2_conn_open: a connection for a socket (private to proto/rpc) */
#include "strata/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

#define FUZZ_LOOP_TURNS 64 /* loop passes at most per phase: inputs are small */

/* The loop and server live for the whole process (a harness exception to the no-globals rule:
 * libFuzzer offers no per-run context, and a server per input would dominate the run time). */
static struct event_base *fuzz_base;
static rpc_server *fuzz_srv;

static void fuzz_echo(rpc_call *call, st_slice request, void *arg) {
    (void)arg;
    (void)rpc_call_send(call, request);
    rpc_call_finish(call, ST_OK, NULL);
}

static void fuzz_stream(rpc_call *call, st_slice request, void *arg) {
    (void)arg;
    (void)rpc_call_send(call, request);
    (void)rpc_call_send(call, st_slice_make((const uint8_t *)"second", 6));
    rpc_call_finish(call, request.len ? ST_OK : ST_INVALID_ARGUMENT, "empty request");
}

static void fuzz_init(void) {
    if (fuzz_srv)
        return;
    st_err err = {0};
    fuzz_base = event_base_new();
    FUZZ_CHECK(fuzz_base);
    rpc_server_opts opts = {.message_bytes_max = 1 << 16};
    fuzz_srv = rpc_server_new(fuzz_base, &opts, &err);
    FUZZ_CHECK(fuzz_srv);
    FUZZ_CHECK(rpc_server_add_method(fuzz_srv, "/google.bigtable.v2.Bigtable/MutateRow", fuzz_echo,
                                     NULL) == ST_OK);
    FUZZ_CHECK(rpc_server_add_method(fuzz_srv, "/google.bigtable.v2.Bigtable/ReadRows", fuzz_stream,
                                     NULL) == ST_OK);
}

/* Reads and drops what the server wrote, so it never blocks on a full socket. */
static void fuzz_drain(int fd) {
    uint8_t buf[16384];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

/* Runs the loop until nothing is pending, feeding the rest of the input as the socket takes it. */
static void fuzz_pump(int client, const uint8_t **p, const uint8_t *end) {
    for (int i = 0; i < FUZZ_LOOP_TURNS; i++) {
        if (*p < end) {
            ssize_t n = write(client, *p, (size_t)(end - *p));
            if (n > 0)
                *p += n;
        }
        event_base_loop(fuzz_base, EVLOOP_NONBLOCK);
        fuzz_drain(client);
        if (*p == end && i > 2)
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    FUZZ_CHECK(rpc_conn_slot_take(UINT32_MAX));
    struct sockaddr sa = {.sa_family = AF_UNIX};
    h2_conn_open(fuzz_srv, sv[1], &sa); /* takes sv[1] and the slot */
    const uint8_t *p = data, *end = data + size;
    fuzz_pump(sv[0], &p, end);
    shutdown(sv[0], SHUT_WR); /* the client is done: the server sees end of file */
    fuzz_pump(sv[0], &p, p);
    close(sv[0]);
    for (int i = 0; i < FUZZ_LOOP_TURNS && fuzz_srv->conns; i++)
        event_base_loop(fuzz_base, EVLOOP_NONBLOCK);
    FUZZ_CHECK(!fuzz_srv->conns); /* every connection ends once its client has gone */
    return 0;
}
