/* shipper_pos.c — the shipper's durable position (shipper.c says how it is recorded): the
 * position file DIR/peer-<id>.pos, the storage log holder "repl:<id>", and the recorder thread
 * that writes both off the loop. */
#include "shipper_internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/storage.h" /* sto_row_mut_peek/_decode/_encode */
#include "strata/internal/v1/node.pb-c.h"
#include "strata/internal/v1/replication.pb-c.h"
#include "strata/btutil.h"

/* ---- the durable position ---- */

/* The file's text for lsn as written now: "repl-position v2 <lsn> <crc>\n", crc the CRC32C
 * (8 hex digits) of the text before its space, so a flipped digit that leaves a parsable lsn
 * below the log's end (believed, it skips acknowledged writes for good) is caught. v1 (no crc)
 * only to read files written by earlier versions. Returns the length. */
static size_t pos_format(char *out, size_t cap, int version, uint64_t lsn) {
    int len = snprintf(out, cap, "repl-position v%d %" PRIu64, version, lsn);
    if (version >= 2)
        len += snprintf(out + len, cap - (size_t)len, " %08x",
                        (unsigned)st_crc32c(0, out, (size_t)len));
    len += snprintf(out + len, cap - (size_t)len, "\n");
    return (size_t)len;
}

/* Parses the file's text: the lsn and the form's version, or 0 when the text is not a position
 * file at all. A file is believed only if it is byte for byte what pos_format writes for its
 * lsn, which for v2 includes the checksum; *ok says so. */
static int pos_parse(const char *text, size_t n, uint64_t *lsn, bool *ok) {
    unsigned long long v = 0;
    int version = 0;
    if (sscanf(text, "repl-position v2 %llu", &v) == 1)
        version = 2;
    else if (sscanf(text, "repl-position v1 %llu", &v) == 1)
        version = 1;
    char canon[POS_FILE_BYTES_MAX];
    *lsn = v;
    *ok = version && v && pos_format(canon, sizeof canon, version, v) == n &&
          memcmp(canon, text, n) == 0;
    return version;
}

st_code shipper_pos_read(repl_shipper *s, uint64_t *lsn, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_env_read_all(st_env_posix(), s->pos_path, &b, err);
    if (rc == ST_OK) {
        char text[POS_FILE_BYTES_MAX + 1];
        size_t n = b.len < POS_FILE_BYTES_MAX ? b.len : POS_FILE_BYTES_MAX;
        if (n)
            memcpy(text, b.data, n);
        text[n] = '\0';
        bool ok = false;
        int version = b.len <= POS_FILE_BYTES_MAX ? pos_parse(text, n, lsn, &ok) : 0;
        if (!ok)
            rc = st_err_set(err, ST_DATA_LOSS,
                            "replication position file %s is %s (damaged or edited); remove it "
                            "to ship the whole log again",
                            s->pos_path, version == 2 ? "not what its checksum says" : "malformed");
    }
    st_buf_free(&b);
    return rc;
}

/* Writes the position file (atomically), always in the checksummed form. Does not touch the
 * holder or durable_next. */
static st_code pos_file_write(repl_shipper *s, uint64_t lsn, st_err *err) {
    char text[POS_FILE_BYTES_MAX];
    size_t len = pos_format(text, sizeof text, 2, lsn);
    return st_env_write_atomic(st_env_posix(), s->pos_path, text, len, err);
}

/* The operator accepted a commit log cut short (--accept-data-loss): the peer had acknowledged
 * records past the kept end, so every kept record is on it and shipping resumes right after
 * them (new records take the lost numbers, so resuming at the old position would skip them).
 * Recorded at once: a later start without the flag then finds a believable file. What the cut
 * also took and this file cannot bring back: rows the node had received from that peer cluster
 * and logged after the kept end; its shippers count them as delivered. */
static st_code pos_clamp_accepted(repl_shipper *s, uint64_t *lsn, uint64_t end, st_err *err) {
    const st_topology *t = &s->r->topo;
    uint32_t own = s->r->o.cluster_num;
    const char *self = own >= 1 && own <= t->n_clusters ? t->clusters[own - 1].id : "?";
    st_log(ST_LOG_ERROR, "repl",
           "event=repl_position_clamped peer=%s position_lsn=%" PRIu64 " log_end_lsn=%" PRIu64
           " resume_lsn=%" PRIu64 " msg=\"the commit log lost lsn %" PRIu64 "..%" PRIu64
           " (and maybe later ones), which cluster %s had acknowledged (--accept-data-loss): "
           "shipping to it resumes at lsn %" PRIu64 ". Rows this node had received from %s "
           "and logged there are gone here too, and %s will not send them again: on each node "
           "of %s, stop it, remove its replication/peer-%s.pos and start it (it ships its "
           "retained log again), or copy the tables from %s (backup and restore)\"",
           s->id, *lsn, end, end + 1, end + 1, *lsn - 1, s->id, end + 1, s->id, s->id, s->id, self,
           s->id);
    *lsn = end + 1;
    return pos_file_write(s, *lsn, err);
}

/* A position past the log's end names records this node no longer holds. Unless the operator
 * accepted a cut log (above), the file is damaged or edited: believed, it would skip every
 * record up to it (acknowledged writes never reach the peer while the lag reads 0), and its
 * holder, stored in the manifest, would make the next start refuse the log as cut. Nothing
 * newer than the file's last write can be trusted, so the whole log is shipped again once the
 * file is removed (replicated rows apply idempotently). */
st_code shipper_pos_check(repl_shipper *s, uint64_t *lsn, st_err *err) {
    uint64_t end = sto_log_last_lsn(s->r->o.db);
    if (*lsn <= end + 1)
        return ST_OK;
    /* Only a cut this start accepted (--accept-data-loss) explains the gap: the flag alone does
     * not (a damaged file on an intact log would skip records the peer never got). */
    if (sto_log_tail_dropped_at_open(s->r->o.db))
        return pos_clamp_accepted(s, lsn, end, err);
    return st_err_set(err, ST_DATA_LOSS,
                      "replication position file %s names lsn %" PRIu64
                      ", past the commit log's end at lsn %" PRIu64
                      " (the file was damaged or edited); remove it to ship the whole log again",
                      s->pos_path, *lsn, end);
}

uint64_t shipper_durable_get(repl_shipper *s) {
    pthread_mutex_lock(&s->pmu);
    uint64_t v = s->durable_next;
    pthread_mutex_unlock(&s->pmu);
    return v;
}

/* Writes lsn to the position file, then to the holder (a crash between the two leaves the
 * holder behind the file, which only keeps more log). Any thread; never moves backwards. */
static st_code pos_record(repl_shipper *s, uint64_t lsn) {
    pthread_mutex_lock(&s->wmu);
    st_code rc = ST_OK;
    if (lsn > shipper_durable_get(s)) {
        st_err err = {0};
        rc = pos_file_write(s, lsn, &err);
        if (rc == ST_OK)
            rc = sto_log_hold(s->r->o.db, s->holder, lsn, &err);
        /* Shipping goes on; a restart would resend more; retried every hold interval, so a
         * full disk would repeat this line twice a second for as long as it stays full. */
        if (rc != ST_OK)
            ST_LOG_LIMITED(ST_LOG_WARN, "repl", "peer=%s recording position %" PRIu64 " failed: %s",
                           s->id, lsn, err.msg);
        pthread_mutex_lock(&s->pmu);
        if (rc == ST_OK)
            s->durable_next = lsn;
        pthread_mutex_unlock(&s->pmu);
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

void *shipper_recorder_main(void *arg) {
    repl_shipper *s = arg;
    pthread_mutex_lock(&s->pmu);
    for (;;) {
        while (!s->stop && s->want <= s->durable_next)
            pthread_cond_wait(&s->pcv, &s->pmu);
        if (s->stop)
            break;
        uint64_t lsn = s->want;
        pthread_mutex_unlock(&s->pmu);
        st_code rc = pos_record(s, lsn);
        pthread_mutex_lock(&s->pmu);
        if (rc != ST_OK && s->want == lsn)
            s->want = 0; /* the loop's timer asks again */
    }
    pthread_mutex_unlock(&s->pmu);
    return NULL;
}

static void persist_timer_arm(repl_shipper *s) {
    if (!evtimer_pending(s->ev_persist, NULL)) {
        struct timeval tv = {s->r->o.hold_interval_ms / 1000,
                             (s->r->o.hold_interval_ms % 1000) * 1000};
        evtimer_add(s->ev_persist, &tv);
    }
}

/* At most every hold_interval_ms the recorder thread is asked to record acked_next (the loop
 * never waits for an fsync); forced (close, tests) or without the thread, it is recorded here
 * before returning. The timer runs while the recorded position is behind. */
void repl_shipper_persist(repl_shipper *s, bool force) {
    if (s->acked_next == shipper_durable_get(s))
        return;
    int64_t now = st_mono_us();
    bool due = now - s->persisted_at_us >= (int64_t)s->r->o.hold_interval_ms * 1000;
    if (force || (due && !s->pthread_ok)) {
        s->persisted_at_us = now;
        (void)pos_record(s, s->acked_next);
    } else if (due) {
        s->persisted_at_us = now;
        pthread_mutex_lock(&s->pmu);
        if (s->want < s->acked_next) {
            s->want = s->acked_next;
            pthread_cond_signal(&s->pcv);
        }
        pthread_mutex_unlock(&s->pmu);
    }
    if (!s->r->closing && !force)
        persist_timer_arm(s);
}

void shipper_on_persist(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    repl_shipper *s = arg;
    if (!s->r->closing)
        repl_shipper_persist(s, false);
}
