/* shipper_internal.h — what the shipper's files share (private to replication/).
 *   shipper.c       the link state machine: the window of batches, the pump, backoff, retiring
 *                   acknowledged batches, open, close, stats;
 *   shipper_pos.c   the durable position: the position file, the log holder, the recorder thread;
 *   shipper_batch.c the peer's tablet map (ListTablets) and batches: reading the log, choosing
 *                   each row's peer node, sending Apply calls and collecting their results. */
#ifndef REPL_SHIPPER_INTERNAL_H
#define REPL_SHIPPER_INTERNAL_H

#include <pthread.h>

#include "repl_internal.h"

#define PATH_APPLY "/strata.internal.v1.Replication/Apply"
#define PATH_LIST_TABLETS "/strata.internal.v1.Node/ListTablets"
#define POS_FILE_BYTES_MAX 64

enum { B_FREE = 0, B_SENDING, B_FAILED, B_DONE };

typedef struct ship_row {
    const char *table; /* in the batch arena */
    st_slice row;      /* in the batch arena */
    st_slice enc;      /* the row mutation, log payload encoding */
    uint64_t lsn, commit_ts_us;
    uint64_t tablet_id; /* its record's: the row goes only while this tablet is of its table */
    uint32_t dest;      /* index of the peer node */
    bool acked;         /* durable on it: a resent batch leaves the row out */
} ship_row;

typedef struct ship_batch ship_batch;

/* One Apply call of a batch: the argument of its completion. */
typedef struct ship_call {
    ship_batch *b;
    uint32_t dest;
} ship_call;

struct ship_batch {
    repl_shipper *s;
    int state;
    uint64_t first_lsn, next_lsn; /* covers records [first_lsn, next_lsn) */
    ship_row *rows;               /* batch_rows_max entries, allocated once */
    size_t n_rows;
    size_t bytes;
    st_arena arena;
    uint64_t last_tablet; /* the tablet of the last row taken and its table, in the arena */
    const char *last_table;
    uint32_t pending; /* Apply calls outstanding */
    bool failed;
    /* Peer nodes with rows of it not acknowledged yet (every bit while its rows are not all
     * routed): a later batch's call to one of them must follow this batch's (after_lsn). */
    uint64_t unacked_dests;
    ship_call calls[ST_TOPO_NODES_MAX];
};
_Static_assert(ST_TOPO_NODES_MAX <= 64, "ship_batch.unacked_dests holds a bit per peer node");

typedef struct peer_tablet {
    char *table;
    st_buf start, end; /* [start, end); empty end = unbounded */
    uint32_t dest;
} peer_tablet;

typedef struct refresh_arg {
    repl_shipper *s;
    uint32_t dest;
} refresh_arg;

struct repl_shipper {
    repl_ctx *r;
    char id[ST_TOPO_ID_MAX + 1];
    uint32_t cluster_num;
    char addrs[ST_TOPO_NODES_MAX][ST_TOPO_ADDR_MAX + 1];
    size_t n_nodes;
    char holder[ST_TOPO_ID_MAX + 16];
    char pos_path[ST_TOPO_PATH_MAX + ST_TOPO_ID_MAX + 32];

    sto_log_reader *reader; /* read raw: records are shipped as stored, not decoded */
    uint64_t read_next;     /* next lsn to read */
    uint64_t acked_next;    /* records below are on the peer (or were not to be shipped) */
    /* Every local write with a commit time at or below it is on the peer: the largest commit
     * time of an acknowledged row (local writes enter the log in commit order, so every earlier
     * one was acknowledged too), or the node's commit floor when caught up. */
    int64_t acked_commit_us;
    int64_t persisted_at_us;

    /* The recorder thread writes the position file and the holder (each with an fsync) off the
     * loop. Under pmu: durable_next (what the file and the holder say), want (the position
     * the loop asked it to record; 0 = nothing), stop. wmu serialises the writes of the thread
     * and of forced (synchronous) persists. */
    pthread_mutex_t pmu, wmu;
    pthread_cond_t pcv;
    pthread_t pthread;
    bool pthread_ok, sync_ok;
    uint64_t durable_next, want;
    bool stop;
    st_buf scratch;
    st_arena scratch_arena; /* decoding a record that must be re-encoded */

    ship_batch batches[REPL_INFLIGHT_BATCHES_MAX]; /* a ring: head, count */
    size_t head, count;

    peer_tablet *map, *new_map;
    size_t n_map, n_new_map;
    bool map_stale, refresh_ok;
    uint32_t refreshing; /* ListTablets calls outstanding */
    int64_t map_at_us;
    refresh_arg refresh_args[ST_TOPO_NODES_MAX];

    struct event *ev_pump, *ev_backoff, *ev_persist;
    bool backing_off;
    uint32_t backoff_ms;

    uint64_t bytes_read, records_read; /* for estimating the bytes of unread records */
    int64_t caught_up_wall_us;         /* when the shipper last had nothing to send */
    int64_t last_send_us, pump_at_us;  /* monotonic: last new batch sent; pending pump due */
    uint64_t rows_shipped, records_skipped, batches_sent, rpcs_failed, map_refreshes;
    st_code last_code; /* of last_error; ST_OK when none */
    char last_error[256];
    int64_t data_loss_logged_us; /* monotonic: last ERROR line for unreadable records (0: none) */
    uint64_t data_loss_lsn;      /* read_next at the last DATA_LOSS read (0: none) */
};

/* Unreadable log records the shipper needs are logged at ERROR at most this often per peer. */
#define REPL_DATA_LOSS_LOG_US (60 * 1000 * 1000LL)

/* shipper.c */
/* Runs the pump after delay_ms, unless a pump is already due no later. */
void shipper_schedule_pump(repl_shipper *s, uint32_t delay_ms);
/* Keeps a status line of the last error (for stats). */
void shipper_set_error(repl_shipper *s, st_code code, const char *msg);
/* Waits an exponentially growing delay before the next attempt (no-op if already waiting). */
void shipper_start_backoff(repl_shipper *s);

/* shipper_pos.c */
st_code shipper_pos_read(repl_shipper *s, uint64_t *lsn, st_err *err);
/* A position *lsn past the commit log's end + 1: DATA_LOSS naming the file, or, when this start
 * dropped the log's tail (accepted data loss: sto_log_tail_dropped_at_open), *lsn moved to the
 * end + 1 and recorded in the file. */
st_code shipper_pos_check(repl_shipper *s, uint64_t *lsn, st_err *err);
uint64_t shipper_durable_get(repl_shipper *s);
void *shipper_recorder_main(void *arg);
void shipper_on_persist(evutil_socket_t fd, short what, void *arg);

/* shipper_batch.c */
void shipper_map_free(peer_tablet *m, size_t n);
void shipper_start_refresh(repl_shipper *s);
void shipper_batch_reset(ship_batch *b);
void shipper_send_batch(repl_shipper *s, ship_batch *b);
st_code shipper_read_batch(repl_shipper *s, ship_batch *b, st_err *err);
/* Whether a batch with an unacknowledged row of table has Apply calls under way. */
bool shipper_table_in_flight(const repl_shipper *s, const char *table);

#endif
