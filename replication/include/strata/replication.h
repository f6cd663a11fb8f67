/* strata/replication.h — log shipping between clusters (docs/architecture.md, Replication).
 *
 * Each node runs one repl_ctx. For every peer cluster of its topology it runs a shipper that reads
 * the node's commit log in order from the acknowledged position, skips records that came in by
 * replication (STO_ROW_REPLICATED: never shipped onward), sends the rest in bounded batches to
 * the peer nodes that own their rows (strata.internal.v1.Replication/Apply), and advances the
 * acknowledged position once the peer answered that they are durable. The position is kept in a
 * small file of the state directory and as a storage log holder "repl:<peer-cluster-id>", so log
 * segments stay until every peer has them and a restart resumes where the peer's acks stopped
 * (records shipped but not yet recorded are shipped again: Apply is idempotent).
 *
 * The receiving side (repl_apply_*) validates each row, keeps the origin's version, commit
 * timestamp and origin cluster, sets STO_ROW_REPLICATED, and writes through the node's write
 * path; storage's versions make the result independent of order and repetition.
 *
 * Consistency tokens capture every node's last lsn; a token is consistent once every shipper of
 * every node has acknowledged past that node's lsn to every peer cluster.
 *
 * Threads: a repl_ctx and everything it does run on the node's event-loop thread. Log reads are
 * done on the loop (bounded by a batch: REPL_BATCH_ROWS_MAX records / REPL_BATCH_BYTES_MAX bytes
 * per read turn, usually served from the page cache); the position file and log holder are
 * written at most every REPL_HOLD_INTERVAL_MS per peer by a recorder thread of each shipper (two
 * small fsync'd writes the loop does not wait for; on close, by the closing thread).
 *
 * Errors: Apply answers INVALID_ARGUMENT for a malformed row (the batch is refused whole),
 * FAILED_PRECONDITION "strata-not-owner:" for a row this node does not own, NOT_FOUND for an
 * unknown table, UNAVAILABLE while shutting down; the shipper retries all of them with
 * exponential backoff (REPL_BACKOFF_MIN_MS .. REPL_BACKOFF_MAX_MS), refreshing its map of the
 * peer's tablets first, and shows the last error in its stats. Nothing here ends the process. */
#ifndef STRATA_REPLICATION_H
#define STRATA_REPLICATION_H

#include "strata/base.h"
#include "strata/rpc.h"
#include "strata/storage.h"
#include "strata/topology.h"

struct event_base;

/* ---- named maxima and defaults ---- */
#define REPL_BATCH_ROWS_MAX 512                /* records read into one batch */
#define REPL_BATCH_BYTES_MAX ((size_t)4 << 20) /* encoded bytes in one batch (>= 1 record) */
#define REPL_INFLIGHT_BATCHES_MAX 4            /* batches sent and not yet acknowledged */
#define REPL_BACKOFF_MIN_MS 50
#define REPL_BACKOFF_MAX_MS 10000
#define REPL_RPC_TIMEOUT_MS 30000
#define REPL_HOLD_INTERVAL_MS 500     /* durable position written at most this often per peer */
#define REPL_POLL_MS 20               /* a caught-up shipper looks for new records this often */
#define REPL_SEND_GAP_US 1000         /* a shipper starts new batches at most this often */
#define REPL_MAP_REFRESH_MS 10000     /* peer tablet maps are refreshed at least this often */
#define REPL_APPLY_ROWS_MAX 10000     /* rows accepted in one Apply request */
#define REPL_PEER_TABLETS_MAX 1000000 /* entries kept of one peer cluster's tablet map */
#define REPL_TABLET_NAMES_MAX 100000  /* tablet id -> table names remembered */
#define REPL_HOLDER_PREFIX "repl:"
/* An Apply call waiting for an earlier batch of its source node (ApplyRequest.after_lsn) is
 * refused ABORTED after this long, and beyond this many waiting calls (or
 * REPL_INFLIGHT_BATCHES_MAX of one source node, which a shipper never exceeds): its sender
 * sends the batches again in order. */
#define REPL_APPLY_PARK_MS 5000
#define REPL_APPLY_PARKED_MAX 256
/* The applied bound of change-stream tokens (repl_applied_bound): while streams are read, the
 * peer clusters' positions are asked every REPL_APPLIED_POLL_MS (each call given
 * REPL_APPLIED_TIMEOUT_MS), until nobody asked for the bound for REPL_APPLIED_IDLE_MS; the last
 * REPL_APPLIED_PAIRS_MAX changes of the bound are kept. */
#define REPL_APPLIED_POLL_MS 250
#define REPL_APPLIED_TIMEOUT_MS 2000
#define REPL_APPLIED_IDLE_MS 60000
#define REPL_APPLIED_PAIRS_MAX 4096

/* ---- the node, as replication sees it (the node fills this in; node/repl_glue.c) ---- */
typedef void (*repl_write_done_fn)(st_code code, const char *msg, void *arg);
typedef struct repl_node_ops {
    /* The local tablet a write of (table, row) goes to. ST_NOT_FOUND for an unknown table,
     * FAILED_PRECONDITION with a "strata-not-owner:" message when no writable local tablet
     * covers the row. */
    st_code (*route)(void *node, const char *table, st_slice row, uint64_t *tablet_id, st_err *err);
    /* Writes rows (each atomic) durably; done runs later on the loop thread, never inside the
     * call. Validation errors are returned directly (done not called). */
    st_code (*write)(void *node, const sto_row_mut *rows, size_t n, st_err *err,
                     repl_write_done_fn done, void *arg);
    /* Optional: a replicated commit timestamp was applied (the node's clock may move past it). */
    void (*observe_ts)(void *node, uint64_t commit_ts_us);
    /* Optional: whether the table still exists here. Unshipped rows of a deleted table are
     * dropped before sending: the peers delete it too, and would refuse them for ever. */
    bool (*table_exists)(void *node, const char *table);
    /* Optional: a commit time at or below which every write this node committed is durable in
     * its log, 0 when none is known now (a write is in flight). Lets a caught-up shipper's
     * acknowledged commit time (repl_peer_stats.acked_commit_us) follow the clock. */
    int64_t (*commit_floor)(void *node);
    /* Optional: the node's resolved change-stream stamp (every record at or below it is
     * durable). Needed by repl_applied_bound; without it the bound is never known. */
    int64_t (*cs_resolved)(void *node);
} repl_node_ops;

/* ---- receiving side: pure helpers (also used by the Apply handler) ---- */

/* Turns one ReplicatedRow (table name, encoded row mutation) into a row mutation ready to write:
 * decodes (muts allocated from arena; slices point into encoded), validates (origin cluster
 * 1..STO_ORIGIN_MAX, version = STO_VERSION(commit_ts, origin), non-empty row key within limits, at
 * least one mutation), routes it to the local tablet through ops->route, and sets
 * STO_ROW_REPLICATED. The origin's version, commit timestamp and origin are kept, so applying it
 * twice, or in any order with other rows, gives the same contents. Errors as described at the top.
 */
st_code repl_apply_prepare(const repl_node_ops *ops, void *node, const char *table,
                           st_slice encoded, st_arena *arena, sto_row_mut *out, st_err *err);

/* ---- consistency tokens ----
 * Text form, decimal digits only (so a router may join several nodes' tokens with its own
 * punctuation): "1" (format version), then per node, sorted by node number, the node number in 8
 * digits and its last lsn in 20 digits. 1..REPL_TOKEN_NODES_MAX entries. A node's older
 * single-lsn token (a plain decimal of at most 20 digits) is never mistaken for one. */
#define REPL_TOKEN_NODES_MAX (ST_TOPO_CLUSTERS_MAX * ST_TOPO_NODES_MAX)
#define REPL_TOKEN_CHARS_MAX (2 + REPL_TOKEN_NODES_MAX * 28)
#define REPL_TOKEN_LSN_UNKNOWN UINT64_MAX /* the node did not answer at generation */

typedef struct repl_token_entry {
    uint32_t node_num;
    uint64_t lsn;
} repl_token_entry;

typedef struct repl_token {
    repl_token_entry e[REPL_TOKEN_NODES_MAX];
    size_t n;
} repl_token;

/* One node's positions (GetPositions): its last lsn and its shippers' acknowledged positions. */
typedef struct repl_node_positions {
    uint32_t node_num;
    uint32_t cluster_num;
    uint64_t last_lsn;
    uint32_t peer_cluster[ST_TOPO_CLUSTERS_MAX];
    uint64_t peer_acked_next[ST_TOPO_CLUSTERS_MAX];     /* records < this are on that peer */
    int64_t peer_acked_commit_us[ST_TOPO_CLUSTERS_MAX]; /* repl_peer_stats.acked_commit_us */
    size_t n_peers;
} repl_node_positions;

/* Writes the text form (NUL-terminated) into out; INVALID_ARGUMENT if it does not fit or t is
 * empty. Entries are sorted first (the token is canonical). */
st_code repl_token_encode(repl_token *t, char *out, size_t cap, st_err *err);
/* True when text has the shape of the form above. */
bool repl_token_is_global(const char *text);
/* Parses the text form; INVALID_ARGUMENT with a message for anything else. */
st_code repl_token_decode(const char *text, repl_token *out, st_err *err);
/* True when every token entry's node is among nodes and has acknowledged past the entry's lsn
 * (REPL_TOKEN_LSN_UNKNOWN: past its current last lsn) to every cluster of topo other than its own.
 * A node missing from nodes makes it false (unknown is not consistent). An entry for a node absent
 * from topo is ignored (it was removed). */
bool repl_token_satisfied(const repl_token *t, const st_topology *topo,
                          const repl_node_positions *nodes, size_t n_nodes);

/* ---- the per-node replication context ---- */
typedef struct repl_ctx repl_ctx;

typedef struct repl_opts {
    const st_topology *topo; /* copied */
    uint32_t cluster_num;    /* this node's cluster (1-based, topology order) */
    uint32_t node_num;       /* this node's number (0 for a standalone node in tests) */
    const char *state_dir;   /* position files (created if absent) */
    sto_db *db;
    struct event_base *base;
    const repl_node_ops *ops; /* copied */
    void *node;
    const rpc_client_opts *client_opts; /* TLS for links to peers; NULL = plaintext */
    /* Tuning (0 = the defaults above; tests shrink them). */
    size_t batch_rows_max, batch_bytes_max, inflight_max;
    uint32_t backoff_min_ms, backoff_max_ms, hold_interval_ms, poll_ms, rpc_timeout_ms;
} repl_opts;

/* Starts a shipper for every other cluster of topo (none when it has only this one). Each
 * resumes from its position file (absent: from lsn 1) and registers its log holder at once. */
st_code repl_open(const repl_opts *opts, repl_ctx **out, st_err *err);
/* Stops the shippers (outstanding calls are cancelled), records their positions, frees. Loop
 * thread; NULL is fine. The log holders stay (a restart resumes). */
void repl_close(repl_ctx *r);
/* Registers /strata.internal.v1.Replication/Apply, /GetPositions and /SetLinks on s. */
st_code repl_register(repl_ctx *r, rpc_server *s, st_err *err);

/* Rehearsing failure (`strata chaos partition`, docs/operations.md): cuts the replication links
 * between this node and the peer clusters numbered cut[0..n) and restores every other link. The
 * shippers to a cut cluster stop sending (batches already read wait, unacknowledged); Apply from
 * a node of a cut cluster is refused with UNAVAILABLE "strata-link-cut: ...". Restoring a link
 * ends its shipper's backoff so catching up starts at once. In memory only. INVALID_ARGUMENT
 * for a number that is not a peer cluster of the topology. Loop thread. */
st_code repl_links_set(repl_ctx *r, const uint32_t *cut, size_t n, st_err *err);
/* True while the link to (and from) peer cluster cluster_num is cut. */
bool repl_link_cut(const repl_ctx *r, uint32_t cluster_num);

/* Tells the shippers the table of a tablet as soon as it exists (CreateTablet, a split's halves,
 * a move's target): log records name tablets only, and a tablet may split (its id is then gone)
 * or be dropped before its records are shipped, after which storage no longer knows its table.
 * Names are kept until close (at most REPL_TABLET_NAMES_MAX). Loop thread; NULL r is fine. */
void repl_tablet_named(repl_ctx *r, uint64_t tablet_id, const char *table);
/* A split, or a move whose peers lack some of the tablet's records, is about to make tablet_id
 * (of table) vanish while its table lives on: records it left in the log must still reach the
 * peers after a restart, when storage no longer knows it. Durable (<state_dir>/retired-tablets)
 * when it returns ST_OK; the split or the move's activation must not run otherwise. Then
 * repl_tablet_retire_done with gone = whether the tablet was dropped. No-op without peers.
 * Kept until every peer recorded a position past the tablet's last record. Loop thread. */
st_code repl_tablet_retire(repl_ctx *r, uint64_t tablet_id, const char *table, st_err *err);
void repl_tablet_retire_done(repl_ctx *r, uint64_t tablet_id, bool gone);
/* Table was deleted here: its tablets' records still unshipped are never shipped (the peers
 * delete it too), and a table created again under the name does not receive them. Loop
 * thread; NULL r is fine. */
void repl_table_dropped(repl_ctx *r, const char *table);
/* Whether an Apply call with rows of table, sent before it was dropped here, is still under way
 * to a peer (it could reach a peer that has meanwhile created the table again). The node
 * answers its DropTable once this is false (bounded), so the CreateTable that follows cannot
 * give the peers the new table before such a call ended. Loop thread; NULL r: false. */
bool repl_table_shipping(repl_ctx *r, const char *table);
/* A local write became durable: shippers that are idle look for it at the next loop turn rather
 * than at their next poll (REPL_POLL_MS), so replication lag does not wait out the poll period.
 * Cheap; coalesces many writes into one look. Loop thread. */
void repl_notify_commit(repl_ctx *r);

/* Per-peer statistics (status, metrics, tests). */
typedef struct repl_peer_stats {
    char cluster_id[ST_TOPO_ID_MAX + 1];
    uint32_t cluster_num;
    uint64_t acked_next_lsn;   /* every shippable record below it is durable on the peer */
    uint64_t durable_next_lsn; /* the position last written to the position file and holder */
    uint64_t records_behind;   /* last local lsn - (acked_next_lsn - 1) */
    uint64_t bytes_behind;     /* encoded bytes not acknowledged (unread records estimated) */
    uint64_t time_behind_us;   /* now - commit time of the oldest unacknowledged record */
    /* Every write this node committed with a commit time at or below it is durable on the
     * peer (0: not known yet, e.g. just after a restart, until the first acknowledgement). */
    int64_t acked_commit_us;
    uint64_t rows_shipped;    /* rows acknowledged by the peer */
    uint64_t records_skipped; /* replicated (not shipped onward) or of dropped tablets */
    uint64_t batches_sent, rpcs_failed, map_refreshes;
    uint32_t inflight_batches;
    bool backing_off;
    bool link_cut; /* repl_links_set cut this link */
    uint32_t backoff_ms;
    st_code last_code; /* the code of last_error (ST_OK: none) */
    char last_error[256];
} repl_peer_stats;

size_t repl_peer_count(const repl_ctx *r);
/* Peer i (0 <= i < repl_peer_count) into out. */
void repl_peer_stats_get(repl_ctx *r, size_t i, repl_peer_stats *out);
/* Apply calls this node refused because the earlier batch of their sender they waited for did
 * not start here within REPL_APPLY_PARK_MS (docs/formats/replication.md, Apply order): each
 * costs its sender a backoff and a resend, so it should stay 0 while links are healthy. */
uint64_t repl_apply_expired(const repl_ctx *r);
/* This node's positions (what GetPositions answers). */
void repl_positions_local(repl_ctx *r, repl_node_positions *out);

/* Asks every node of the topology for its positions (this node answers itself without an RPC)
 * and calls done once with all that answered (nodes[] valid during the call); a node that did
 * not answer within timeout_ms is left out and n_failed counts it. Loop thread; done never runs
 * inside the call. RESOURCE_EXHAUSTED if out of memory (done not called). */
typedef void (*repl_gather_done_fn)(const repl_node_positions *nodes, size_t n, size_t n_failed,
                                    void *arg);
st_code repl_positions_gather(repl_ctx *r, int64_t timeout_ms, repl_gather_done_fn done, void *arg);
/* Builds a token from gathered positions: one entry per node of topo, its last lsn, or
 * REPL_TOKEN_LSN_UNKNOWN for a node that did not answer (then the check waits until that node
 * has shipped everything it holds at check time: later, never earlier, than needed). */
void repl_token_from_positions(const st_topology *topo, const repl_node_positions *nodes, size_t n,
                               repl_token *out);
/* The applied bound for change-stream tokens (docs/changestreams.md, Failover): a time Y such
 * that every write committed by another cluster at or before Y had a stamp at or below w on
 * this node, i.e. had been applied here by the time the node's resolved stamp was w. It is the
 * smallest acked_commit_us of every node of every peer cluster towards this cluster, asked of
 * them (GetPositions) while someone calls this function, and paired with this node's resolved
 * stamp when the answers arrived; the result is the bound of the latest pair at or below w.
 * INT64_MAX when the topology has no peer cluster (nothing is replicated here); 0 when no pair
 * is old enough (nothing known: a reader of another cluster then starts from the oldest
 * history it holds). Loop thread; NULL r is fine (INT64_MAX). */
int64_t repl_applied_bound(repl_ctx *r, int64_t w);
/* The topology the context was opened with. */
const st_topology *repl_topology(const repl_ctx *r);

#endif
