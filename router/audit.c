/* audit.c — the router's audit log (--audit-log FILE): one JSON line per admin call, denied
 * call and failed authentication (docs/security.md, Audit log). The loop thread only formats a
 * line and appends it to a bounded buffer; a writer thread of its own writes, and rotates the
 * file by size (FILE -> FILE.1), so a slow disk never stalls the event loop. When the buffer is
 * full, lines are dropped, and the router's log says how many once lines flow again. */
#include "router_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct rtr_audit {
    char path[RTR_AUDIT_PATH_MAX + 1];
    uint64_t bytes_max; /* rotate past this size */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    st_buf pending;   /* lines waiting for the writer (mu) */
    uint64_t dropped; /* lines dropped since the last one written (mu) */
    bool stop;        /* (mu) */
    int fd;           /* writer thread only after open */
    uint64_t size;    /* the file's size (writer) */
    bool failing;     /* writes fail (disk full, file size limit): logged once (writer) */
    uint64_t lost;    /* lines lost to failed writes during that outage (writer) */
};

/* ---- JSON ---- */

static st_code json_str(st_buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    st_code rc = st_buf_append_byte(b, '"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && rc == ST_OK; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            rc = st_buf_append(b, e, 2);
        } else if (*p < 0x20 || *p >= 0x7f) { /* bytes from clients: always valid JSON */
            char e[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
            rc = st_buf_append(b, e, 6);
        } else
            rc = st_buf_append_byte(b, *p);
    }
    return rc == ST_OK ? st_buf_append_byte(b, '"') : rc;
}

static st_code json_field(st_buf *b, const char *name, const char *value, bool first) {
    char head[48];
    snprintf(head, sizeof head, "%s\"%s\":", first ? "{" : ",", name);
    st_code rc = st_buf_append(b, head, strlen(head));
    return rc == ST_OK ? json_str(b, value) : rc;
}

/* RFC 3339 UTC with milliseconds. */
static void time_text(int64_t wall_us, char *out, size_t cap) {
    time_t s = (time_t)(wall_us / 1000000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%03dZ", day, (int)(wall_us / 1000 % 1000));
}

st_code rtr_audit_format(const rtr_audit_rec *rec, int64_t wall_us, st_buf *out) {
    char t[48];
    time_text(wall_us, t, sizeof t);
    st_code rc = json_field(out, "time", t, true);
    const char *fields[][2] = {
        {"principal", rec->principal},     {"peer", rec->peer},
        {"method", rec->method},           {"resource", rec->resource},
        {"permission", rec->permission},   {"outcome", rec->outcome},
        {"code", st_code_name(rec->code)}, {"message", rec->message},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0] && rc == ST_OK; i++)
        if (fields[i][1])
            rc = json_field(out, fields[i][0], fields[i][1], false);
    if (rc == ST_OK)
        rc = st_buf_append(out, "}\n", 2);
    return rc;
}

/* ---- the writer ---- */

/* Logs a failure once per outage (the writer retries at every batch), and the recovery. */
static void audit_reopen(rtr_audit *a) {
    bool was_open = a->fd >= 0;
    if (a->fd >= 0)
        close(a->fd);
    a->fd = open(a->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    struct stat st;
    a->size = a->fd >= 0 && fstat(a->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (a->fd >= 0 && !was_open)
        st_log(ST_LOG_INFO, "router", "msg=\"audit log open again\" path=%s", a->path);
    if (a->fd < 0 && was_open)
        st_log(ST_LOG_ERROR, "router",
               "msg=\"cannot open the audit log: lines are lost until it opens again (retried at "
               "every line); check the directory's permissions and free space\" path=%s "
               "err=\"%s\"",
               a->path, strerror(errno));
}

/* Whether the file is still ours: an operator or logrotate may have moved or removed it (the
 * lines would go on into the old inode, out of sight), or an earlier open may have failed. */
static bool audit_file_ok(const rtr_audit *a) {
    struct stat path_st, fd_st;
    return a->fd >= 0 && stat(a->path, &path_st) == 0 && fstat(a->fd, &fd_st) == 0 &&
           path_st.st_dev == fd_st.st_dev && path_st.st_ino == fd_st.st_ino;
}

/* FILE -> FILE.1 and a new FILE; false when the new file is not empty (the rename failed). */
static bool audit_rotate(rtr_audit *a) {
    char old[RTR_AUDIT_PATH_MAX + 3];
    snprintf(old, sizeof old, "%s.1", a->path);
    if (rename(a->path, old) != 0)
        st_log(ST_LOG_WARN, "router", "msg=\"audit log rotation failed\" err=\"%s\"",
               strerror(errno));
    audit_reopen(a);
    return a->size == 0;
}

static uint64_t count_lines(const uint8_t *p, size_t n) {
    uint64_t k = 0;
    for (const uint8_t *e = p + n; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
        k++;
    return k;
}

/* A write that failed part-way (disk full, file size limit) must not leave half a line that the
 * next line would continue: the file is cut back to the last whole line. The failure is logged
 * once per outage, and the recovery with the number of lines lost. */
static void audit_write_failed(rtr_audit *a, const uint8_t *line0, const uint8_t *p, size_t n,
                               int err) {
    size_t partial = (size_t)(p - line0);
    if (partial > 0 && ftruncate(a->fd, (off_t)(a->size - partial)) == 0)
        a->size -= partial;
    a->lost += count_lines(line0, partial + n);
    if (!a->failing)
        st_log(ST_LOG_ERROR, "router",
               "msg=\"audit log write failed: lines are lost until writes succeed again (retried "
               "at every line); free space on its file system\" path=%s err=\"%s\"",
               a->path, strerror(err));
    a->failing = true;
}

static void audit_write_all(rtr_audit *a, const uint8_t *p, size_t n) {
    const uint8_t *line0 = p; /* start of the line being written */
    while (n > 0 && a->fd >= 0) {
        ssize_t w = write(a->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            audit_write_failed(a, line0, p, n, w < 0 ? errno : ENOSPC);
            return;
        }
        const uint8_t *nl = memrchr(p, '\n', (size_t)w);
        if (nl)
            line0 = nl + 1;
        p += w;
        n -= (size_t)w;
        a->size += (uint64_t)w;
    }
    if (n == 0 && a->failing) {
        st_log(ST_LOG_INFO, "router", "msg=\"audit log written again\" path=%s lost_lines=%llu",
               a->path, (unsigned long long)a->lost);
        a->failing = false;
        a->lost = 0;
    }
}

/* Writes a batch of whole lines, as many at a time as fit under bytes_max, rotating between
 * them, so no line is split across files and FILE passes the bound only by a line longer than
 * it. */
static void audit_write(rtr_audit *a, const uint8_t *p, size_t n) {
    if (!audit_file_ok(a)) {
        if (a->fd >= 0)
            st_log(ST_LOG_WARN, "router",
                   "msg=\"the audit log was moved or removed: starting a new file\" path=%s",
                   a->path);
        audit_reopen(a);
    }
    bool force = false; /* a rotation that did not empty FILE: write anyway */
    while (n > 0 && a->fd >= 0) {
        size_t take = 0;
        while (take < n) {
            const uint8_t *nl = memchr(p + take, '\n', n - take);
            size_t line = nl ? (size_t)(nl - (p + take)) + 1 : n - take;
            if (!force && a->size + take > 0 && a->size + take + line > a->bytes_max)
                break;
            take += line;
        }
        if (take == 0) {
            force = !audit_rotate(a);
            continue;
        }
        audit_write_all(a, p, take);
        p += take;
        n -= take;
        force = false;
    }
}

static void *audit_main(void *arg) {
    rtr_audit *a = arg;
    st_buf batch;
    st_buf_init(&batch);
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->pending.len == 0)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->pending.len == 0 && a->stop)
            break;
        st_buf t = batch; /* swap: the loop appends to an empty buffer meanwhile */
        batch = a->pending;
        a->pending = t;
        st_buf_reset(&a->pending);
        pthread_mutex_unlock(&a->mu);
        audit_write(a, batch.data, batch.len);
        st_buf_reset(&batch);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    st_buf_free(&batch);
    return NULL;
}

rtr_audit *rtr_audit_open(const char *path, uint64_t bytes_max, st_err *err) {
    rtr_audit *a = calloc(1, sizeof *a);
    if (!a) {
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (strlen(path) > RTR_AUDIT_PATH_MAX) {
        free(a);
        st_err_set(err, ST_INVALID_ARGUMENT, "--audit-log path longer than %d bytes",
                   RTR_AUDIT_PATH_MAX);
        return NULL;
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    a->bytes_max = bytes_max ? bytes_max : RTR_AUDIT_BYTES_MAX_DEFAULT;
    a->fd = open(a->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (a->fd < 0) {
        st_err_set(err, ST_INVALID_ARGUMENT, "cannot open the audit log %s: %s", path,
                   strerror(errno));
        free(a);
        return NULL;
    }
    struct stat st;
    a->size = fstat(a->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    st_buf_init(&a->pending);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, audit_main, a) != 0) {
        close(a->fd);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
        st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot start the audit log writer thread");
        return NULL;
    }
    return a;
}

void rtr_audit_close(rtr_audit *a) {
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL); /* what is queued is written first */
    if (a->fd >= 0)
        close(a->fd);
    st_buf_free(&a->pending);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

bool rtr_audit_limit_take(rtr_audit_limit *l, int64_t now_us, uint64_t *suppressed) {
    int64_t sec = now_us / 1000000;
    if (sec != l->sec) {
        l->sec = sec;
        l->lines = 0;
    }
    if (l->lines >= RTR_AUDIT_UNAUTH_PER_SEC) {
        l->suppressed++;
        return false;
    }
    l->lines++;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return true;
}

void rtr_audit_write(rtr_audit *a, const rtr_audit_rec *rec) {
    if (!a)
        return;
    st_buf line;
    st_buf_init(&line);
    st_code rc = rtr_audit_format(rec, st_wall_us(), &line);
    pthread_mutex_lock(&a->mu);
    uint64_t dropped = a->dropped;
    if (rc != ST_OK || a->pending.len + line.len > RTR_AUDIT_QUEUE_BYTES_MAX)
        a->dropped++;
    else if (st_buf_append(&a->pending, line.data, line.len) != ST_OK)
        a->dropped++;
    else
        a->dropped = 0;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (dropped && !a->dropped)
        st_log(ST_LOG_WARN, "router",
               "msg=\"audit log lines dropped: the disk is too slow\" "
               "dropped=%llu",
               (unsigned long long)dropped);
    st_buf_free(&line);
}
