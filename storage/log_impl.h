/* log_impl.h — private to the commit log's files (storage/log*.c): its constants, the log's
 * state, the record reader, and the calls the files make of each other. Format:
 * docs/formats/log.md; public contract: log.h. */
#ifndef STO_LOG_IMPL_H
#define STO_LOG_IMPL_H

#include "log.h"

#include <pthread.h>

#define LOG_SEG_MAGIC 0x474c5453u /* "STLG" */
#define LOG_SEG_VERSION 4u        /* 4: a header page with checkpoint slots, records after it */
#define LOG_SEG_VERSION_V3 3u     /* read too: records right after the header, no checkpoints */
#define LOG_SEG_VERSION_V2 2u     /* read too: its reserved size is unknown */
#define LOG_SEG_HDR_BYTES 24
#define LOG_SEG_PAGE_BYTES 4096 /* version 4: the header page; records start here */
/* Version 4 checkpoint slots: each in its own 512-byte sector of the header page, away from the
 * header's, so rewriting one never puts the header or the other slot at risk. */
#define LOG_CKPT_BYTES 24
#define LOG_CKPT_OFF0 512
#define LOG_CKPT_OFF1 1024
#define LOG_REC_HDR_BYTES 24
#define LOG_SEGMENTS_MAX 65536 /* live segments; trim keeps far fewer */
#define LOG_PATH_MAX 4096
#define LOG_READ_CHUNK ((size_t)256 << 10) /* read-ahead of the record reader */
#define LOG_NAME_DIGITS 20                 /* of the first lsn in a segment's file name */
/* After this long without a group, the commit thread writes the last group's checkpoint with
 * its own fdatasync: at most one extra sync per idle period, none under steady load. */
#define LOG_CKPT_IDLE_US_DEFAULT 100000

_Static_assert(LOG_SEG_HDR_BYTES == 4 + 4 + 8 + 4 + 4, "segment header layout");
_Static_assert(LOG_CKPT_BYTES == 4 + 4 + 8 + 8, "checkpoint slot layout");
_Static_assert(LOG_CKPT_OFF1 + LOG_CKPT_BYTES <= LOG_SEG_PAGE_BYTES, "slots fit the header page");
_Static_assert(STO_LOG_SEGMENT_BYTES_MAX <= UINT32_MAX, "segment size fits its u32 field");
_Static_assert(LOG_REC_HDR_BYTES == 4 + 4 + 8 + 8, "record header layout");
_Static_assert(STO_LOG_RECORD_BYTES_MAX <= UINT32_MAX, "record length fits its u32 field");

/* One segment file. last_lsn is the last record readers may see (first_lsn - 1 when none);
 * good_bytes ends that record, UINT64_MAX when unknown (an old segment not scanned: read it by
 * lsn up to last_lsn). */
typedef struct log_seg {
    uint64_t first_lsn;
    uint64_t last_lsn;
    uint64_t good_bytes;
    uint64_t bytes; /* file size as far as known, for sto_log_bytes */
    /* Recovery skipped damaged records nobody needed (docs/formats/log.md): the segment reads
     * again from record skip_lsn at offset skip_off. 0: nothing skipped. */
    uint64_t skip_lsn, skip_off;
} log_seg;

/* A damaged stretch of records, lsn lsn..next_lsn-1, that recovery skipped because only log
 * holders needed them and the operator accepted their loss (accept_data_loss): a hole that
 * readers jump, going on at record next_lsn at offset off of the segment from lsn seg_first.
 * Unlike damage nobody needed (readable_from) the records before it stay readable: a holder below
 * it loses only the damaged records (docs/formats/log.md). */
typedef struct log_hole {
    uint64_t lsn, next_lsn, seg_first, off;
} log_hole;

/* One sto_log_append call: its framed records, lsn and crc filled in by the commit thread. */
typedef struct log_entry {
    struct log_entry *next;
    sto_log_done_fn done;
    void *arg;
    size_t n_records;
    uint64_t first_lsn;
    st_buf buf;
    /* sto_log_append_wait: the entry lives on its appender's stack; waiter is signalled when the
     * group holding it finished (finished set) or when the appender may lead the next group. */
    pthread_cond_t *waiter;
    bool finished; /* under mu */
} log_entry;

typedef enum log_wstate {
    W_UNPOSITIONED, /* neither replayed nor appended yet */
    W_REOPEN,       /* positioned at the clean end (wbytes) of the last segment, not open yet */
    W_NEW_SEGMENT,  /* the next group goes into a new segment named next_lsn */
    W_OPEN,
} log_wstate;

struct sto_log {
    st_env *env;
    bool sync;
    bool accept_data_loss;
    uint64_t needed_from; /* sto_log_options.needed_from */
    size_t segment_bytes;
    int64_t ckpt_idle_us; /* < 0: no idle checkpoints */
    char dir[LOG_PATH_MAX];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* commit thread: entries queued or closing */
    pthread_cond_t space_cv; /* appenders: queue room */

    /* Under mu. */
    log_seg *segs;
    size_t n_segs, cap_segs;
    log_entry *head, *tail;
    size_t queued_bytes;  /* queued and in flight */
    uint64_t durable_lsn; /* published to cursors after the done callbacks */
    /* sto_log_readable_from: set by recovery, before any cursor exists. */
    uint64_t readable_from;
    /* Accepted holes, in lsn order: set by recovery before any cursor exists, fixed after. */
    log_hole *holes;
    size_t n_holes;
    /* Recovery accepted the loss of the last segment's tail (cut short, or acknowledged records
     * unreadable): sto_log_tail_dropped. Set before any cursor exists. */
    bool tail_dropped;
    bool closing, appends_started, replaying;
    /* Bumped (atomically, under mu) whenever segments leave the list or one is replaced, so a
     * cursor can keep reading without the lock until the list changes under it. */
    uint64_t segs_gen;
    /* A group is being written, by the commit thread or by a leading sto_log_append_wait caller
     * (writer); the writer state below belongs to whoever set this. */
    bool writing;
    pthread_t writer;
    st_code failed;        /* sticky: positioning found the last segment corrupt */
    int64_t last_group_us; /* st_mono_us when the last group finished */
    bool out_of_space;     /* the last group failed with ST_RESOURCE_EXHAUSTED (full disk) */
    /* Trimmed segments whose files are still to be removed (first lsns, oldest first), by the
     * remover thread (started by the first trim) or, when it cannot start, by the trimmer. */
    uint64_t *rm;
    size_t n_rm, cap_rm;
    uint64_t rm_asked, rm_done; /* removals ever queued / finished (done or given up) */
    uint64_t rm_failed_at;      /* rm_done after the last batch that failed (0: none) */
    st_code rm_code;            /* that failure */
    st_err rm_err;
    bool rm_started;
    pthread_t rm_thread;
    pthread_cond_t rm_cv;      /* remover: removals queued or closing */
    pthread_cond_t rm_done_cv; /* sto_log_trim(_wait) callers: a batch finished */
    st_err failed_err;
    sto_log_stats stats;

    /* The current writer only (see writing; sto_log_replay before any append). */
    log_wstate wstate;
    st_wfile *wf;
    uint64_t next_lsn;
    uint64_t wbytes; /* bytes written to the open segment */
    uint64_t wfirst; /* first lsn of the open segment */
    uint64_t wdata;  /* where its records start (its header's size) */
    /* Checkpoints (docs/formats/log.md): the open segment has slots and the env can write them
     * (wckpt); ckpt_lsn is the highest lsn a slot was written with, or one this process did not
     * sync itself (after recovery), below which no slot is written; ckpt_n picks the slot. */
    bool wckpt;
    uint64_t ckpt_lsn;
    uint64_t ckpt_n;
    st_buf group;
};

/* ---- record reader: sequential reads through a read-ahead window ---- */

typedef struct rec_reader {
    st_env *env;
    st_rfile *f;
    char path[LOG_PATH_MAX];
    uint64_t limit;    /* bytes that may be read */
    uint64_t reserved; /* the open segment's preallocated size from its header (0: unknown) */
    uint64_t data_off; /* where its records start: after the header (v2, v3) or its page (v4) */
    bool ckpt;         /* version 4: it has checkpoint slots */
    uint64_t ckpt_lsn; /* the highest valid checkpoint in its slots, 0 when none */
    bool hdr_partial;  /* a good version 4 header whose page is cut: a crash during creation */
    uint64_t win_off;  /* file offset of win.data[0] */
    st_buf win;
} rec_reader;

typedef enum rec_status { REC_OK, REC_END, REC_BAD } rec_status;

/* One record as read: lsn, payload (valid until the next read), and where the next one starts. */
typedef struct rec_view {
    uint64_t lsn;
    uint64_t group_first; /* first lsn of the group the record was written with */
    st_slice payload;
    uint64_t next_off;
    const char *why; /* REC_BAD: what was wrong */
} rec_view;

/* ---- log_segment.c ---- */

/* The path of segment first_lsn (out: LOG_PATH_MAX bytes). */
void log_seg_path(const sto_log *log, uint64_t first_lsn, char *out);
/* A segment's header page (LOG_SEG_PAGE_BYTES) for first_lsn, checkpoint slots empty; reserved:
 * the file's preallocated size, 0 when none. */
void log_seg_header_make(uint8_t *page, uint64_t first_lsn, uint32_t reserved);
/* A checkpoint slot of segment first_lsn saying records up to lsn are durable. */
void log_ckpt_make(uint8_t *slot, uint64_t first_lsn, uint64_t lsn);
void log_reader_close(rec_reader *r);
/* Makes [off, off + n) available in the window; *out is NULL when the file is shorter. */
st_code log_reader_fill(rec_reader *r, uint64_t off, size_t n, const uint8_t **out, st_err *err);
/* Reads the record at off (off <= limit): REC_OK, REC_END at the exact end, REC_BAD (why set)
 * for a short, too long or corrupt one. I/O errors are returned. */
st_code log_reader_next(rec_reader *r, uint64_t off, rec_status *st, rec_view *v, st_err *err);
/* Opens a segment for reading and checks its header; *bad_why set (rc OK) when it is bad. */
st_code log_reader_open_seg(rec_reader *r, sto_log *log, uint64_t first_lsn, uint64_t *size,
                            const char **bad_why, st_err *err);
/* Under mu: appends to the segment list (false: no memory); the index of the segment holding
 * lsn, or -1. */
bool log_segs_push(sto_log *log, log_seg s);
ptrdiff_t log_segs_find(const sto_log *log, uint64_t lsn);
/* Lists the segment files at open; non-last segments end where the next begins. */
st_code log_segs_load(sto_log *log, st_err *err);

/* ---- log_recover.c ---- */

/* Scans only the last segment to find where appends go (appends without a replay). */
st_code log_position_lazily(sto_log *log, st_err *err);
/* A bad record at bad_off of the segment open in r follows good records up to lsn last: finds
 * the first good record after it of a later group (*found, its offset *at and view *v), which
 * proves the bad record was acknowledged (recovery) and is where reading can go on. */
st_code log_later_group_find(rec_reader *r, uint64_t bad_off, uint64_t last, bool *found,
                             uint64_t *at, rec_view *v, st_err *err);

/* ---- log_commit.c (the current writer only) ---- */

/* Creates segment first_lsn with its header, durable before any record goes in. */
st_code log_segment_create(sto_log *log, uint64_t first_lsn, st_err *err);
void log_writer_close_file(sto_log *log);
void *log_commit_main(void *arg);
void log_entry_free(log_entry *e);
/* mu held, no group being written: writes everything queued as one group (mu released
 * meanwhile) and wakes or frees its entries. */
void log_run_group_locked(sto_log *log);
/* mu held, no group being written: wakes whoever should write what is queued next. */
void log_hand_off_locked(sto_log *log);
/* At close, after the commit thread ended: the checkpoint of the last group, synced. */
void log_ckpt_final(sto_log *log);

#endif
