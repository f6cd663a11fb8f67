/* ops/changes_fmt.c — what `strata changes` reads and writes that is not the network: TIME
 * arguments, RFC 3339 output, one JSON line per change, and the checkpoint file. Pure functions
 * (plus the checkpoint's file I/O), unit-tested in tests/unit/ops/changes_fmt_test.c. */
#define _DEFAULT_SOURCE /* fsync, strdup */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "changes.h"

#define CKPT_MAGIC "strata-changes-checkpoint"
#define CKPT_VERSION 1
#define CKPT_LINE_MAX ((size_t)1 << 20) /* a line: two row keys and a token, hex */

/* ---- times ---- */

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? (unsigned)-3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* "-10m", "+30s", "-500ms": a signed amount and a unit. */
static bool parse_relative(const char *s, int64_t now_us, int64_t *out) {
    int sign = *s == '-' ? -1 : 1;
    s++;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (end == s || errno || n > 1000000000ull)
        return false;
    static const struct {
        const char *unit;
        int64_t us;
    } units[] = {{"us", 1},         {"ms", 1000},        {"s", 1000000},
                 {"m", 60000000LL}, {"h", 3600000000LL}, {"d", 86400000000LL}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(end, units[i].unit)) {
            if ((int64_t)n > INT64_MAX / 4 / units[i].us)
                return false;
            *out = now_us + sign * (int64_t)n * units[i].us;
            return true;
        }
    return false;
}

/* Whether s has a digit where shape has 'd' and the same character elsewhere ('?' any): sscanf's
 * %u would also take a sign or blanks ("2026-+1-04" as January). */
static bool digits_at(const char *s, const char *shape) {
    for (; *shape; s++, shape++) {
        if (*shape == 'd' ? !(*s >= '0' && *s <= '9') : *shape != '?' && *s != *shape)
            return false;
        if (!*s)
            return false;
    }
    return true;
}

/* Days of month mo (1..12) of year y: a date past them (February 30) is refused rather than
 * read as a day of the next month. */
static unsigned days_in_month(unsigned y, unsigned mo) {
    static const unsigned days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return mo == 2 && leap ? 29 : days[mo - 1];
}

/* Fraction ".123456" (up to 9 digits, beyond microseconds truncated) and the zone. */
static bool parse_zone(const char *s, int64_t *frac_us, int64_t *offset_s) {
    *frac_us = 0;
    if (*s == '.') {
        int digits = 0;
        int64_t scale = 100000;
        for (s++; *s >= '0' && *s <= '9'; s++, digits++) {
            *frac_us += (*s - '0') * scale;
            scale /= 10;
        }
        if (digits == 0 || digits > 9)
            return false;
    }
    if ((*s == 'Z' || *s == 'z') && !s[1]) {
        *offset_s = 0;
        return true;
    }
    unsigned hh, mm;
    int used = 0;
    if ((*s != '+' && *s != '-') || !digits_at(s + 1, "dd:dd") ||
        sscanf(s + 1, "%2u:%2u%n", &hh, &mm, &used) != 2 || used != 5 || s[6] || hh > 23 || mm > 59)
        return false;
    *offset_s = (*s == '-' ? -1 : 1) * (int64_t)(hh * 3600 + mm * 60);
    return true;
}

bool ops_cs_time_parse(const char *text, int64_t now_us, int64_t *out_us) {
    if (!text || !*text)
        return false;
    if (!strcmp(text, "now")) {
        *out_us = now_us;
        return true;
    }
    if (*text == '-' || *text == '+')
        return parse_relative(text, now_us, out_us);
    unsigned y, mo, d, h, mi, sec;
    int used = 0;
    if (!digits_at(text, "dddd-dd-dd?dd:dd:dd") ||
        sscanf(text, "%4u-%2u-%2u%*[Tt]%2u:%2u:%2u%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
        used != 19 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 ||
        sec > 60)
        return false;
    int64_t frac, offset;
    if (!parse_zone(text + used, &frac, &offset))
        return false;
    int64_t days = days_from_civil((int64_t)y, mo, d);
    int64_t s = days * 86400 + h * 3600 + mi * 60 + sec - offset;
    *out_us = s * 1000000 + frac;
    return true;
}

void ops_cs_time_format(int64_t us, char out[OPS_CS_TIME_MAX]) {
    int64_t s = us >= 0 ? us / 1000000 : -((-us + 999999) / 1000000);
    int64_t frac = us - s * 1000000;
    int64_t days = s >= 0 ? s / 86400 : -((-s + 86399) / 86400);
    int64_t rem = s - days * 86400;
    int64_t y;
    unsigned m, d;
    civil_from_days(days, &y, &m, &d);
    snprintf(out, OPS_CS_TIME_MAX, "%04" PRId64 "-%02u-%02uT%02u:%02u:%02u.%06uZ", y, m, d,
             (unsigned)(rem / 3600), (unsigned)(rem / 60 % 60), (unsigned)(rem % 60),
             (unsigned)frac);
}

/* ---- JSON ---- */

bool ops_cs_bytes_printable(st_slice s) {
    const uint8_t *p = s.data, *end = s.data + s.len;
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return false;
            p++;
            continue;
        }
        size_t n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : 0;
        if (n == 0 || c > 0xf4 || (size_t)(end - p) <= n)
            return false;
        uint32_t cp = c & (0x3f >> n);
        for (size_t i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += n + 1;
    }
    return true;
}

void ops_cs_base64(st_buf *out, st_slice s) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (st_buf_reserve(out, (s.len + 2) / 3 * 4) != ST_OK)
        return;
    char *o = (char *)out->data + out->len;
    size_t i = 0, n = 0;
    for (; i + 3 <= s.len; i += 3) {
        uint32_t v = (uint32_t)s.data[i] << 16 | (uint32_t)s.data[i + 1] << 8 | s.data[i + 2];
        o[n++] = tab[v >> 18];
        o[n++] = tab[v >> 12 & 63];
        o[n++] = tab[v >> 6 & 63];
        o[n++] = tab[v & 63];
    }
    if (i < s.len) {
        uint32_t v = (uint32_t)s.data[i] << 16 | (i + 1 < s.len ? (uint32_t)s.data[i + 1] << 8 : 0);
        o[n++] = tab[v >> 18];
        o[n++] = tab[v >> 12 & 63];
        o[n++] = i + 1 < s.len ? tab[v >> 6 & 63] : '=';
        o[n++] = '=';
    }
    out->len += n;
}

static void put(st_buf *out, const char *s) {
    st_buf_append(out, s, strlen(s));
}

/* ,"key":"text" or ,"key_b64":"base64" (first: no leading comma). */
static void put_bytes(st_buf *out, const char *key, st_slice s, bool first) {
    bool text = ops_cs_bytes_printable(s);
    put(out, first ? "\"" : ",\"");
    put(out, key);
    put(out, text ? "\":\"" : "_b64\":\"");
    if (!text) {
        ops_cs_base64(out, s);
    } else {
        size_t from = 0;
        for (size_t i = 0; i < s.len; i++)
            if (s.data[i] == '"' || s.data[i] == '\\') {
                st_buf_append(out, s.data + from, i - from);
                st_buf_append_byte(out, '\\');
                from = i;
            }
        st_buf_append(out, s.data + from, s.len - from);
    }
    put(out, "\"");
}

static void put_i64(st_buf *out, const char *key, int64_t v) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, ",\"%s\":%" PRId64, key, v);
    put(out, tmp);
}

static void put_mod(st_buf *out, const ops_cs_mod *m) {
    static const char *const ops[] = {"set", "delete_column", "delete_family", "delete_row"};
    put(out, "{\"op\":\"");
    put(out, ops[m->op]);
    put(out, "\"");
    if (m->op != OPS_CS_DELETE_ROW)
        put_bytes(out, "family", m->family, false);
    if (m->op == OPS_CS_SET || m->op == OPS_CS_DELETE_COLUMN)
        put_bytes(out, "qualifier", m->qualifier, false);
    if (m->op == OPS_CS_SET) {
        put_i64(out, "timestamp", m->timestamp_us);
        put_bytes(out, "value", m->value, false);
    }
    if (m->op == OPS_CS_DELETE_COLUMN && m->start_us)
        put_i64(out, "start_timestamp", m->start_us);
    if (m->op == OPS_CS_DELETE_COLUMN && m->end_us)
        put_i64(out, "end_timestamp", m->end_us);
    put(out, "}");
}

st_code ops_cs_json(st_buf *out, const ops_cs_change *c) {
    size_t before = out->len;
    put(out, "{");
    put_bytes(out, "row", c->row, true);
    put(out, c->type == OPS_CS_GC ? ",\"type\":\"GARBAGE_COLLECTION\"" : ",\"type\":\"USER\"");
    const char *cl = c->cluster ? c->cluster : "";
    put_bytes(out, "cluster", st_slice_make(cl, strlen(cl)), false);
    char t[OPS_CS_TIME_MAX];
    ops_cs_time_format(c->commit_us, t);
    put(out, ",\"commit_time\":\"");
    put(out, t);
    put(out, "\"");
    put_i64(out, "tiebreaker", c->tiebreaker);
    put(out, ",\"mods\":[");
    for (size_t i = 0; i < c->n_mods; i++) {
        if (i)
            put(out, ",");
        put_mod(out, &c->mods[i]);
    }
    put(out, "]}");
    /* st_buf_append leaves the buffer unchanged when memory runs out: a short object is caught
     * by checking for the closing bracket. */
    if (out->len < before + 2 || memcmp(out->data + out->len - 2, "]}", 2) != 0)
        return ST_RESOURCE_EXHAUSTED;
    return ST_OK;
}

/* ---- checkpoint ---- */

void ops_cs_pos_free(ops_cs_pos *p) {
    st_buf_free(&p->start);
    st_buf_free(&p->end);
    free(p->token);
    p->token = NULL;
}

static void hex_put(FILE *f, const void *data, size_t len) {
    const uint8_t *p = data;
    if (len == 0)
        fputc('-', f);
    for (size_t i = 0; i < len; i++)
        fprintf(f, "%02x", p[i]);
}

static st_code fsync_dir_of(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return ST_UNAVAILABLE;
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? ST_OK : ST_UNAVAILABLE;
}

/* FILE.tmp as a new file: a stale one goes first (FILE.lock, held, says no other run writes it),
 * so a symbolic link left there is not written through, nor a FIFO waited on. */
static FILE *ckpt_tmp_open(const char *tmp) {
    if (unlink(tmp) != 0 && errno != ENOENT)
        return NULL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0)
        close(fd);
    return f;
}

st_code ops_cs_ckpt_write(const char *path, const char *table, const ops_cs_pos *pos, size_t n,
                          st_err *err) {
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return st_err_set(err, ST_INVALID_ARGUMENT, "checkpoint path too long: %s", path);
    FILE *f = ckpt_tmp_open(tmp);
    if (!f)
        return st_err_set(err, ST_UNAVAILABLE,
                          "cannot write the checkpoint %s: %s (check the "
                          "directory exists and is writable)",
                          tmp, strerror(errno));
    fprintf(f, "%s %d ", CKPT_MAGIC, CKPT_VERSION);
    hex_put(f, table, strlen(table));
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        fputs(pos[i].token ? "t " : "s ", f);
        hex_put(f, pos[i].start.data, pos[i].start.len);
        fputc(' ', f);
        hex_put(f, pos[i].end.data, pos[i].end.len);
        fputc(' ', f);
        if (pos[i].token)
            hex_put(f, pos[i].token, strlen(pos[i].token));
        else
            fprintf(f, "%" PRId64, pos[i].start_us);
        fputc('\n', f);
    }
    bool ok = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
    int e = errno;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        e = ok ? errno : e;
        unlink(tmp);
        return st_err_set(err, ST_UNAVAILABLE, "cannot write the checkpoint %s: %s (disk full?)",
                          path, strerror(e));
    }
    if (fsync_dir_of(path) != ST_OK)
        return st_err_set(err, ST_UNAVAILABLE, "cannot sync the directory of the checkpoint %s: %s",
                          path, strerror(errno));
    return ST_OK;
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One hex field ("-" = empty) into out; false if malformed. */
static bool hex_get(const char *s, st_buf *out) {
    st_buf_reset(out);
    if (!strcmp(s, "-"))
        return true;
    size_t len = strlen(s);
    if (len == 0 || len % 2 || st_buf_reserve(out, len / 2 + 1) != ST_OK)
        return false;
    for (size_t i = 0; i < len; i += 2) {
        int hi = hex_val(s[i]), lo = hex_val(s[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out->data[out->len++] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* One position line ("t S E TOK" / "s S E US") into p; false if malformed. */
static bool ckpt_line(char *line, ops_cs_pos *p) {
    char *save = NULL, *kind = strtok_r(line, " \n", &save), *s = strtok_r(NULL, " \n", &save),
         *e = strtok_r(NULL, " \n", &save), *v = strtok_r(NULL, " \n", &save);
    if (!kind || !s || !e || !v || strtok_r(NULL, " \n", &save) || !hex_get(s, &p->start) ||
        !hex_get(e, &p->end))
        return false;
    if (!strcmp(kind, "s")) {
        char *end;
        p->start_us = strtoll(v, &end, 10);
        return !*end;
    }
    st_buf tok;
    st_buf_init(&tok);
    bool ok = !strcmp(kind, "t") && hex_get(v, &tok) && tok.len > 0 &&
              st_buf_append_byte(&tok, 0) == ST_OK && strlen((char *)tok.data) == tok.len - 1;
    if (ok)
        p->token = (char *)tok.data;
    else
        st_buf_free(&tok);
    return ok;
}

static bool ckpt_header(char *line, const char *table) {
    char magic[64];
    int version = 0, used = 0;
    if (sscanf(line, "%63s %d %n", magic, &version, &used) != 2 || strcmp(magic, CKPT_MAGIC) ||
        version != CKPT_VERSION)
        return false;
    st_buf t;
    st_buf_init(&t);
    line[strcspn(line, "\n")] = '\0';
    bool ok = hex_get(line + used, &t) && t.len == strlen(table) && !memcmp(t.data, table, t.len);
    st_buf_free(&t);
    return ok;
}

st_code ops_cs_ckpt_read(const char *path, const char *table, ops_cs_pos **pos, size_t *n,
                         st_err *err) {
    *pos = NULL;
    *n = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, for good. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return st_err_set(err, errno == ENOENT ? ST_NOT_FOUND : ST_UNAVAILABLE,
                          "cannot read the checkpoint %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "checkpoint %s is not a regular file (a directory or a FIFO?): give "
                          "the path of a file, which strata changes creates",
                          path);
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "cannot read the checkpoint %s: %s", path,
                          strerror(errno));
    }
    char *line = malloc(CKPT_LINE_MAX);
    size_t cap = 0, lineno = 0;
    st_code rc = line ? ST_OK : ST_RESOURCE_EXHAUSTED;
    while (rc == ST_OK && fgets(line, (int)CKPT_LINE_MAX, f)) {
        lineno++;
        if (lineno == 1) {
            if (!ckpt_header(line, table))
                rc = st_err_set(err, ST_INVALID_ARGUMENT,
                                "%s is not a checkpoint of table %s (line 1); give another "
                                "--checkpoint file, or delete it to start from --from",
                                path, table);
            continue;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            ops_cs_pos *grown = realloc(*pos, cap * sizeof(**pos));
            if (!grown) {
                rc = ST_RESOURCE_EXHAUSTED;
                break;
            }
            *pos = grown;
        }
        memset(&(*pos)[*n], 0, sizeof(**pos));
        bool ok = ckpt_line(line, &(*pos)[*n]);
        (*n)++;
        if (!ok)
            rc = st_err_set(err, ST_INVALID_ARGUMENT,
                            "checkpoint %s: line %zu is damaged; restore it or delete it to "
                            "start from --from",
                            path, lineno);
    }
    if (rc == ST_OK && lineno == 0)
        rc = st_err_set(err, ST_INVALID_ARGUMENT,
                        "checkpoint %s is empty; delete it to start from --from", path);
    if (rc == ST_RESOURCE_EXHAUSTED)
        st_err_set(err, rc, "out of memory reading the checkpoint %s", path);
    free(line);
    fclose(f);
    if (rc != ST_OK) {
        for (size_t i = 0; i < *n; i++)
            ops_cs_pos_free(&(*pos)[i]);
        free(*pos);
        *pos = NULL;
        *n = 0;
    }
    return rc;
}

static int ckpt_start_cmp(const void *a, const void *b) {
    const ops_cs_pos *x = *(const ops_cs_pos *const *)a, *y = *(const ops_cs_pos *const *)b;
    return st_slice_cmp(st_buf_slice(&x->start), st_buf_slice(&y->start));
}

/* Every checkpoint strata changes writes tiles the table's keys (a split's or merge's pieces
 * replace their parent's line), so a file that leaves a gap would silently skip the rows in it
 * and an overlap would read them twice: both are refused. */
st_code ops_cs_ckpt_check(const char *path, const ops_cs_pos *pos, size_t n, st_err *err) {
    const ops_cs_pos **v = calloc(n ? n : 1, sizeof *v);
    if (!v)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory checking %s", path);
    for (size_t i = 0; i < n; i++)
        v[i] = &pos[i];
    qsort(v, n, sizeof *v, ckpt_start_cmp);
    const char *bad = NULL;
    for (size_t i = 0; !bad && i + 1 < n; i++) {
        int c = v[i]->end.len
                    ? st_slice_cmp(st_buf_slice(&v[i]->end), st_buf_slice(&v[i + 1]->start))
                    : 1;
        bad = c > 0   ? "two partitions overlap"
              : c < 0 ? "rows between two partitions are missing"
                      : NULL;
    }
    if (!bad && (n == 0 || v[0]->start.len))
        bad = "the first partition does not start the table";
    if (!bad && v[n - 1]->end.len)
        bad = "the last partition does not end the table";
    free(v);
    if (!bad)
        return ST_OK;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "checkpoint %s does not cover the table's rows exactly once (%s): it was "
                      "edited or damaged, and resuming from it would skip or repeat rows; restore "
                      "it, or delete it to start from --from",
                      path, bad);
}
