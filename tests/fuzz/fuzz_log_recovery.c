/* fuzz_log_recovery: commit-log recovery on arbitrary segment bytes. The input becomes one or two
 * segment files in an in-memory env (byte 0 chooses whether each gets a valid header, so mutated
 * inputs reach the record parser, whether there is a second segment and its first lsn, and
 * whether the first one is a version 4 segment whose checkpoint claims lsn byte 1; bytes 1-2
 * where the input is split; without a checkpoint, the high bits of byte 2 give the lowest lsn
 * still needed, below which damage is skipped); the log is opened and replayed from there.
 * Properties: no crash, leak or out-of-bounds read; replay ends in ST_OK or ST_DATA_LOSS; after an
 * OK replay the lsns are dense, a cursor reads exactly the replayed records, an append lands right
 * after them, and a second open replays them all plus the appended one (recovery is repeatable and
 * a torn tail never blocks later appends). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define FUZZ_DIR "/log"
#define FUZZ_SEG_HDR_BYTES 24    /* docs/formats/log.md */
#define FUZZ_SEG_PAGE_BYTES 4096 /* version 4: records after the header page */
#define FUZZ_CKPT_OFF 512        /* version 4: checkpoint slot 0 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct replay_count {
    uint64_t n, first, last;
} replay_count;

static st_code count_fn(const sto_log_record *rec, void *arg) {
    replay_count *c = arg;
    ST_ASSERT(c->n == 0 || rec->lsn == c->last + 1);
    if (c->n == 0)
        c->first = rec->lsn;
    c->last = rec->lsn;
    c->n++;
    /* touch every slice so ASan sees any out-of-bounds one */
    (void)st_hash64(rec->row.row.data, rec->row.row.len, 0);
    for (size_t i = 0; i < rec->row.n_muts; i++)
        (void)st_hash64(rec->row.muts[i].value.data, rec->row.muts[i].value.len, 0);
    return ST_OK;
}

/* A version 4 header page whose checkpoint says records up to ckpt are durable. */
static void write_v4_page(st_wfile *f, st_env *env, uint64_t first_lsn, uint64_t ckpt) {
    static uint8_t page[FUZZ_SEG_PAGE_BYTES];
    memset(page, 0, sizeof page);
    st_put_fixed32(page, 0x474c5453u);
    st_put_fixed32(page + 4, 4);
    st_put_fixed64(page + 8, first_lsn);
    st_put_fixed32(page + 20, st_crc_mask(st_crc32c(0, page, 20)));
    uint8_t *s = page + FUZZ_CKPT_OFF;
    st_put_fixed64(s + 8, first_lsn);
    st_put_fixed64(s + 16, ckpt);
    st_put_fixed32(s, st_crc_mask(st_crc32c(0, s + 4, 20)));
    ST_ASSERT(env->ops->append(f, page, sizeof page, NULL) == ST_OK);
}

/* ckpt > 0: a version 4 segment whose checkpoint claims ckpt; else a version 2 header or none. */
static void write_segment(st_env *env, uint64_t first_lsn, bool header, uint64_t ckpt,
                          const uint8_t *data, size_t len) {
    char path[64];
    snprintf(path, sizeof path, FUZZ_DIR "/%020llu.log", (unsigned long long)first_lsn);
    st_wfile *f;
    ST_ASSERT(env->ops->wopen(env, path, &f, NULL) == ST_OK);
    if (header && ckpt > 0) {
        write_v4_page(f, env, first_lsn, ckpt);
    } else if (header) {
        uint8_t h[FUZZ_SEG_HDR_BYTES];
        st_put_fixed32(h, 0x474c5453u);
        st_put_fixed32(h + 4, 2); /* format version */
        st_put_fixed64(h + 8, first_lsn);
        st_put_fixed32(h + 16, st_crc_mask(st_crc32c(0, h, 16)));
        st_put_fixed32(h + 20, 0);
        ST_ASSERT(env->ops->append(f, h, sizeof h, NULL) == ST_OK);
    }
    ST_ASSERT(env->ops->append(f, data, len, NULL) == ST_OK);
    ST_ASSERT(env->ops->sync(f, NULL) == ST_OK);
    ST_ASSERT(env->ops->wclose(f, NULL) == ST_OK);
}

typedef struct done_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    st_code code;
    uint64_t lsn;
} done_wait;

static void done_fn(st_code code, uint64_t first_lsn, const st_err *err, void *arg) {
    (void)err;
    done_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->code = code;
    w->lsn = first_lsn;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Appends one small row and waits for it; returns its lsn. */
static uint64_t append_one(sto_log *log) {
    sto_mut m = {.type = STO_MUT_SET_CELL,
                 .family = ST_SLICE_LIT("f"),
                 .qualifier = ST_SLICE_LIT("q"),
                 .ts_us = 1,
                 .value = ST_SLICE_LIT("v")};
    sto_row_mut row = {.tablet_id = 1, .row = ST_SLICE_LIT("r"), .muts = &m, .n_muts = 1};
    done_wait w = {.done = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    ST_ASSERT(sto_log_append(log, &row, 1, done_fn, &w, NULL) == ST_OK);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    ST_ASSERT(w.code == ST_OK);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return w.lsn;
}

/* A cursor from the replay point reads exactly what the replay delivered; one before the records
 * recovery skipped as damaged is refused. */
static void check_cursor(sto_log *log, uint64_t from, const replay_count *c) {
    sto_log_cursor *cur;
    uint64_t oldest = sto_log_oldest_lsn(log), readable = sto_log_readable_from(log);
    ST_ASSERT(readable <= from);
    if (readable > oldest) {
        ST_ASSERT(sto_log_cursor_open(log, readable - 1, &cur, NULL) == ST_OUT_OF_RANGE);
    }
    if (from < oldest)
        from = oldest;
    ST_ASSERT(sto_log_cursor_open(log, from, &cur, NULL) == ST_OK);
    sto_log_record rec;
    uint64_t n = 0;
    st_code rc;
    while ((rc = sto_log_cursor_next(cur, &rec, NULL)) == ST_OK) {
        ST_ASSERT(rec.lsn == c->first + n);
        n++;
    }
    ST_ASSERT(rc == ST_NOT_FOUND && n == c->n);
    sto_log_cursor_close(cur);
}

static sto_log *open_log(st_env *env, uint64_t needed_from) {
    sto_log_options o = {
        .env = env, .sync = true, .segment_bytes = 4096, .needed_from = needed_from};
    sto_log *log = NULL;
    ST_ASSERT(sto_log_open(FUZZ_DIR, &o, &log, NULL) == ST_OK);
    return log;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3)
        return 0;
    uint8_t flags = data[0];
    size_t split = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    st_env *env = st_env_mem_new();
    ST_ASSERT(env && env->ops->mkdirs(env, FUZZ_DIR, NULL) == ST_OK);
    size_t cut = (flags & 2) && split < size ? split : size;
    uint64_t ckpt = flags & 8 ? 1 + (split & 0xff) : 0;
    write_segment(env, 1, flags & 1, ckpt, data, cut);
    if (flags & 2)
        write_segment(env, 2 + (flags >> 4), flags & 4, 0, data + cut, size - cut);

    uint64_t from = ckpt ? 1 : 1 + (split >> 11);
    sto_log *log = open_log(env, from);
    replay_count c = {0};
    st_err err;
    st_code rc = sto_log_replay(log, from, count_fn, &c, &err);
    ST_ASSERT(rc == ST_OK || rc == ST_DATA_LOSS);
    if (rc == ST_OK) {
        uint64_t durable = sto_log_last_durable_lsn(log);
        ST_ASSERT(c.n == 0 || durable == c.last);
        check_cursor(log, from, &c);
        uint64_t lsn = append_one(log);
        ST_ASSERT(lsn == durable + 1);
        sto_log_close(log);
        log = open_log(env, from);
        replay_count again = {0};
        ST_ASSERT(sto_log_replay(log, from, count_fn, &again, &err) == ST_OK);
        uint64_t want = c.n + (lsn >= from); /* the appended record, unless below the replay */
        ST_ASSERT(again.n == want && (want == 0 || again.last == lsn));
    }
    sto_log_close(log);
    env->ops->destroy(env);
    return 0;
}
