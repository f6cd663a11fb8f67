/* ops/backup_cli.h — the pieces `strata backup`'s subcommands share (backup.c, backup_xfer.c,
 * backup_rpc.c), private to ops/: the parsed flags, the resolved names, and gRPC calls on one
 * kept connection (an export or import makes thousands of calls to the same node). */
#ifndef STRATA_OPS_BACKUP_CLI_H
#define STRATA_OPS_BACKUP_CLI_H

#include <protobuf-c/protobuf-c.h>
#include <signal.h>
#include <stdbool.h>

#include "backup_dir.h"
#include "strata/rpc.h"
#include "strata/topology.h"
#include "google/bigtable/admin/v2/table.pb-c.h"
#include "google/longrunning/operations.pb-c.h"
#include "progress.h"

#define BK_ADMIN_TIMEOUT_MS 60000
#define BK_CHUNK_TIMEOUT_MS 60000
#define BK_FILE_TIMEOUT_MS (24 * 3600 * 1000LL) /* one ReadBackupFile stream: a whole file */
#define BK_CHUNK_BYTES (1u << 20)               /* as node.proto: chunks of at most 1 MiB */
#define BK_POLL_MS 500                          /* GetOperation while --wait */
#define BK_WAIT_UNAVAILABLE_MS 60000            /* --wait rides out a router restart */
#define BK_RES_MAX 1100                         /* a resource name with room */
#define BK_FETCH_STREAMS 4 /* an export's concurrent ReadBackupFile streams per node */
#define BK_READ_RETRIES 3  /* ReadBackupFile streams that drop: resumed from their offset */
#define BK_RETRY_MS 200    /* then 400, 800 */
#define BK_SEND_STREAMS 4  /* an import's files of one piece in flight at once */

#define BK_SVC_ADMIN "/google.bigtable.admin.v2.BigtableTableAdmin/"
#define BK_SVC_OPS "/google.longrunning.Operations/"
#define BK_SVC_BACKUP "/strata.internal.v1.BackupAdmin/"
#define BK_SVC_NODE "/strata.internal.v1.Node/"

typedef struct bk_args {
    const char *endpoint, *dir, *project, *instance, *cluster;
    const char *tls_ca, *token, *token_file; /* a secure router (ops_secure_override) */
    const char *expire, *type, *to, *as, *filter, *order_by, *id;
    const char *target;    /* restore: another instance's router HOST:PORT or directory */
    const char *hot_until; /* create: hot_to_standard_time, from now (implies --type hot) */
    bool json, quiet, wait;
    const char *pos[2]; /* positional arguments after the subcommand */
    int n_pos;
} bk_args;

typedef struct bk_ctx {
    const char *sub; /* "create", "export"... */
    bk_args a;
    char addr[512];                   /* the router */
    char project[128], instance[128]; /* resolved */
    char home_instance[128]; /* the topology's (or "i"): restore's source, not --instance */
    char cluster[128];       /* --cluster, else the instance's first cluster */
    bool nested;             /* a step of another subcommand: no summary line of its own */
    const char *asked;       /* restore: the backup as given (its nested export gets the name) */
    st_code failed;          /* a nested import's failure: restore --target's hint depends on it */
    const st_topology *topo; /* the instance's (--dir), to name its nodes; NULL: --endpoint alone */
} bk_ctx;

/* One connection kept open for many calls (reconnected once when it died). */
typedef struct bk_conn {
    struct event_base *base;
    struct rpc_client *client;
    char addr[512];
    size_t pending;              /* calls started without waiting (an import's seals) */
    bool lost;                   /* the last call: sent, then no answer (outcome open) */
    bool router;                 /* the router: its TLS and bearer token (certs.h) */
    const rpc_client_opts *opts; /* NULL: plaintext */
    const rpc_metadata *md;      /* sent with every call */
    size_t n_md;
} bk_conn;

/* Each ReadBackupFile stream's HTTP/2 receive window on a node connection: a node sends 1 MiB
 * chunks, and with the client's default window (256 KiB) each chunk waited for four window
 * updates from this process, so the node and this side took turns instead of working at once
 * (worst on a loaded machine, where every turn waits for the scheduler). The BK_FETCH_STREAMS
 * streams' windows together fill the connection's (16 MiB). */
#define BK_NODE_STREAM_WINDOW ((int32_t)4 << 20)

/* A new RPC client for connection k to host:port (k's TLS options; a node's with
 * BK_NODE_STREAM_WINDOW); NULL with err set (when not NULL) on failure. */
struct rpc_client *bk_conn_client(const bk_conn *k, const char *host, uint16_t port, st_err *err);
/* A connection to a node (a secure instance's: mutual TLS with the admin certificate). */
st_code bk_conn_open(bk_conn *k, const char *addr, st_err *err);
/* A connection to the router (a secure one's: TLS and the bearer token). */
st_code bk_conn_open_router(bk_conn *k, const char *addr, st_err *err);
void bk_conn_close(bk_conn *k);
/* A unary call: req packed, the answer unpacked into *resp (free with
 * protobuf_c_message_free_unpacked; resp_desc NULL: the answer is dropped). err says which
 * method at which address failed. */
st_code bk_conn_call(bk_conn *k, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                     int64_t timeout_ms, st_err *err);
/* A server-streaming call: on_msg for each message (returning false cancels the call, whose
 * code is then the one on_msg set in err). */
st_code bk_conn_stream(bk_conn *k, const char *method, const ProtobufCMessage *req,
                       bool (*on_msg)(st_slice msg, void *arg, st_err *err), void *arg,
                       int64_t timeout_ms, st_err *err);
/* A node call failed at the TLS handshake (the node refused this process's certificate, or this
 * process the node's): no retry changes that, unlike a node restarting. */
bool bk_tls_refused(st_code code, const char *msg);
/* err = what (a call, "ReadBackupFile F of piece P") at node addr failed its TLS handshake, with
 * OpenSSL's reason from msg and what to do (ops_secure_node_refused: a secure instance's nodes
 * accept only its admin certificate; flag names how to give the instance, "--dir DIR").
 * Returns UNAVAILABLE. */
st_code bk_node_refused(const char *what, const char *addr, const char *msg, const char *flag,
                        st_err *err);
/* bk_conn_call on a connection of its own to the router. */
st_code bk_router_call(const bk_ctx *c, const char *method, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                       st_err *err);

/* Names: ID or a full name into out. */
bool bk_backup_name(const bk_ctx *c, const char *id, char *out, size_t cap);
bool bk_table_name(const bk_ctx *c, const char *id, char *out, size_t cap);
/* The last component of a resource name. */
const char *bk_leaf(const char *name);

/* Printing a Backup (human lines, or one JSON object). */
void bk_print_backup(const bk_ctx *c, const Google__Bigtable__Admin__V2__Backup *b);
void bk_fail(const bk_ctx *c, const st_err *err);
/* Prints what (why the outcome of this command is not known) and how to learn it, when, and
 * when to run the command again: for a request whose answer was lost (bk_router_call) and for
 * --wait giving up on its operation (bk_op_wait). */
void bk_say_unknown(const bk_ctx *c, const char *what);
/* After a NOT_FOUND for backup name, given as the bare id (taken in --cluster, or the first
 * cluster): when backups of that id exist in other clusters (ListBackups of clusters/-), adds
 * to err where, and the command line with --cluster that names one. Nothing otherwise. */
void bk_not_found_hint(const bk_ctx *c, const char *id, const char *name, st_err *err);
void bk_json_str(const char *s); /* to stdout */

/* One file of an export to fetch from a node (backup_fetch.c). */
typedef struct bk_fetch_job {
    int version;                       /* of the export (ops_bk_out_open) */
    const char *backup, *piece, *file; /* the ReadBackupFile request */
    uint64_t size;                     /* what the node's piece says */
    uint32_t crc32c;
    ops_bk_file result; /* filled: name, size and checksums as written */
} bk_fetch_job;

/* Fetches every job's file from the node at k into dir (ops_bk_out_open), up to
 * BK_FETCH_STREAMS at once, each checked against the node's size and CRC32C; stops starting
 * new ones at the first failure (err names the file) or when *stop is set. */
st_code bk_fetch_files(bk_conn *k, const char *dir, bk_fetch_job *jobs, size_t n,
                       ops_progress *prog, const volatile sig_atomic_t *stop, st_err *err);

/* A file of the piece being sent that an earlier piece already put on the same node: the node
 * links it (WriteBackupFile with link_piece) instead of receiving its bytes again. */
typedef struct bk_link_src {
    const char *piece, *file; /* piece NULL: send the bytes */
} bk_link_src;

/* Sends every file of piece p (of the export in dir) to the node at k as backup's, up to
 * BK_SEND_STREAMS files at once, each in order, checking each file's CRC32C and SHA-256 against
 * the manifest (DATA_LOSS naming the file); links[j] (links may be NULL) makes file j a link
 * instead. Stops at the first failure or when *stop is set. */
st_code bk_send_piece(bk_conn *k, const char *dir, const ops_bk_manifest *m, const char *backup,
                      const ops_bk_piece *p, const bk_link_src *links, ops_progress *prog,
                      const volatile sig_atomic_t *stop, st_err *err);

/* Polls GetOperation until op is done, with progress (a router restarting is ridden out);
 * *out is the finished operation (free it); an operation that failed is its error. */
st_code bk_op_wait(const bk_ctx *c, Google__Longrunning__Operation *op,
                   Google__Longrunning__Operation **out, st_err *err);
/* restore ID --to TABLE --target HOST:PORT|DIR: into another instance (backup_across.c); name
 * is the backup's full name. The exit status. */
int bk_restore_across(bk_ctx *c, const char *name);

/* Subcommands in backup_xfer.c. */
int bk_export(bk_ctx *c);
int bk_import(bk_ctx *c);
int bk_verify(bk_ctx *c);

#endif
