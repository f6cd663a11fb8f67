/* cstoken.c — change-stream continuation tokens and partitions (strata/cstoken.h). Pure
 * functions: the node and the router parse and check tokens with the same rules. */
#include "strata/cstoken.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CS_TOKEN_VERSION "1."
#define CS_TOKEN_VERSION2 "2." /* with the issuing cluster and its applied bound */
#define CS_DEC_DIGITS_MAX 19   /* INT64_MAX has 19 digits */
/* Last second of year 9999, the end of google.protobuf.Timestamp's range. */
#define CS_TIME_SECONDS_MAX 253402300799LL
/* Bytes of a key or token echoed in an error message. */
#define CS_ECHO_MAX 48

/* ---- positions and token text ---- */

uint32_t btu_cs_table_tag(st_slice table) {
    size_t from = table.len;
    while (from > 0 && table.data[from - 1] != '/')
        from--;
    uint32_t h = 2166136261u; /* FNV-1a: small, stable across builds and machines */
    for (size_t i = from; i < table.len; i++)
        h = (h ^ table.data[i]) * 16777619u;
    return h;
}

void btu_cs_pos_live(btu_cs_pos *p, int64_t w) {
    p->w = w;
    p->has_table = false;
    p->table = 0;
    p->scan = false;
    p->h = 0;
    p->has_y = false;
    p->cluster = 0;
    p->y = 0;
    p->key_len = 0;
}

void btu_cs_pos_set_bound(btu_cs_pos *p, uint32_t cluster, int64_t y) {
    p->has_y = true;
    p->cluster = cluster;
    p->y = y > p->w ? p->w : y < 0 ? 0 : y;
}

int64_t btu_cs_pos_start(const btu_cs_pos *p, uint32_t cluster) {
    return p->has_y && p->cluster != cluster && p->y < p->w ? p->y : p->w;
}

/* s printable (other bytes as '?'), cut at CS_ECHO_MAX with "...", into out. */
static void echo(char *out, size_t cap, st_slice s) {
    size_t k = 0;
    for (size_t i = 0; i < s.len && i < CS_ECHO_MAX && k + 1 < cap; i++)
        out[k++] = s.data[i] >= 0x20 && s.data[i] < 0x7f ? (char)s.data[i] : '?';
    for (size_t i = 0; s.len > CS_ECHO_MAX && i < 3 && k + 1 < cap; i++)
        out[k++] = '.';
    out[k] = 0;
}

static st_code bad_token(st_slice text, st_err *err) {
    char shown[CS_ECHO_MAX + 4];
    echo(shown, sizeof shown, text);
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "invalid change stream continuation token '%s': expected 1.W, 1.W.H.K, "
                      "2.C.Y.W or 2.C.Y.W.H.K (Y <= W < H decimal microseconds, C a cluster "
                      "number, K a row key in lower-case hex), optionally after tT. (T the "
                      "table's tag in 8 hex digits), as ReadChangeStream sent it; resume with a "
                      "token the stream returned, or with start_time",
                      shown);
}

/* A decimal of 1..19 digits, no leading zero (but "0"), at most INT64_MAX; advances *p. */
static bool parse_dec(const uint8_t **p, const uint8_t *end, int64_t *out) {
    const uint8_t *s = *p;
    size_t n = 0;
    while (s + n < end && s[n] >= '0' && s[n] <= '9')
        n++;
    if (n == 0 || n > CS_DEC_DIGITS_MAX || (n > 1 && s[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits fit in uint64 */
    if (v > (uint64_t)INT64_MAX)
        return false;
    *out = (int64_t)v;
    *p = s + n;
    return true;
}

static int hex_val(uint8_t c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Lower-case hex of 1..BTU_ROW_KEY_MAX bytes, the rest of the text. */
static bool parse_hex_key(const uint8_t *s, const uint8_t *end, btu_cs_pos *out) {
    size_t n = (size_t)(end - s);
    if (n == 0 || n % 2 != 0 || n / 2 > BTU_ROW_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hex_val(s[i]), lo = hex_val(s[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out->key[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    out->key_len = n / 2;
    return true;
}

/* "tT." with T 8 lower-case hex digits, when the text starts with 't'; advances *p. */
static bool parse_table(const uint8_t **p, const uint8_t *end, btu_cs_pos *out) {
    const uint8_t *s = *p;
    if (s == end || *s != 't')
        return true;
    if (end - s < 10 || s[9] != '.')
        return false;
    uint32_t v = 0;
    for (int i = 1; i <= 8; i++) {
        int d = hex_val(s[i]);
        if (d < 0)
            return false;
        v = v << 4 | (uint32_t)d;
    }
    out->has_table = true;
    out->table = v;
    *p = s + 10;
    return true;
}

/* "C.Y." of a version 2 token (C below 2^32); advances *p. */
static bool parse_bound(const uint8_t **p, const uint8_t *end, btu_cs_pos *out) {
    int64_t c, y;
    if (!parse_dec(p, end, &c) || c > (int64_t)UINT32_MAX || *p == end || *(*p)++ != '.' ||
        !parse_dec(p, end, &y) || *p == end || *(*p)++ != '.')
        return false;
    out->cluster = (uint32_t)c;
    out->y = y;
    return true;
}

st_code btu_cs_token_parse(st_slice text, btu_cs_pos *out, st_err *err) {
    const uint8_t *p = text.data, *end = text.data + text.len;
    size_t vlen = sizeof CS_TOKEN_VERSION - 1;
    int64_t w;
    btu_cs_pos_live(out, 0);
    if (!parse_table(&p, end, out))
        return bad_token(text, err);
    bool v2 = end - p >= (ptrdiff_t)vlen && memcmp(p, CS_TOKEN_VERSION2, vlen) == 0;
    if (!v2 && (end - p < (ptrdiff_t)vlen || memcmp(p, CS_TOKEN_VERSION, vlen) != 0))
        return bad_token(text, err);
    p += vlen;
    if (v2 && !parse_bound(&p, end, out))
        return bad_token(text, err);
    if (!parse_dec(&p, end, &w) || (v2 && out->y > w))
        return bad_token(text, err);
    out->has_y = v2;
    out->w = w;
    if (p == end)
        return ST_OK;
    int64_t h;
    if (*p++ != '.' || !parse_dec(&p, end, &h) || h <= w || p == end || *p++ != '.' ||
        !parse_hex_key(p, end, out))
        return bad_token(text, err);
    out->h = h;
    out->scan = true;
    return ST_OK;
}

size_t btu_cs_dec(char *out, uint64_t v) {
    /* by hand, two digits a step: snprintf cost about a thousand instructions per token, once per
     * change sent */
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930"
                                "31323334353637383940414243444546474849505152535455565758596061"
                                "6263646566676869707172737475767778798081828384858687888990919293"
                                "949596979899";
    char tmp[BTU_CS_DEC_MAX];
    size_t n = sizeof tmp;
    while (v >= 100) {
        size_t d = (size_t)(v % 100) * 2;
        v /= 100;
        tmp[--n] = pairs[d + 1];
        tmp[--n] = pairs[d];
    }
    if (v >= 10) {
        tmp[--n] = pairs[v * 2 + 1];
        tmp[--n] = pairs[v * 2];
    } else {
        tmp[--n] = (char)('0' + v);
    }
    memcpy(out, tmp + n, sizeof tmp - n);
    return sizeof tmp - n;
}

/* v in decimal as "%lld" writes it (the sign only for a negative, which a valid token has not). */
static size_t put_i64(char *out, int64_t v) {
    if (v >= 0)
        return btu_cs_dec(out, (uint64_t)v);
    out[0] = '-';
    return 1 + btu_cs_dec(out + 1, 0 - (uint64_t)v);
}

size_t btu_cs_token_format(const btu_cs_pos *p, char out[BTU_CS_TOKEN_MAX]) {
    static const char digits[] = "0123456789abcdef";
    size_t k = 0;
    if (p->has_table) {
        out[k++] = 't';
        for (int sh = 28; sh >= 0; sh -= 4)
            out[k++] = digits[(p->table >> sh) & 15];
        out[k++] = '.';
    }
    memcpy(out + k, p->has_y ? CS_TOKEN_VERSION2 : CS_TOKEN_VERSION, 2);
    k += 2;
    if (p->has_y) {
        k += btu_cs_dec(out + k, p->cluster);
        out[k++] = '.';
        k += put_i64(out + k, p->y);
        out[k++] = '.';
    }
    k += put_i64(out + k, p->w);
    if (p->scan) {
        ST_ASSERT(p->key_len > 0 && p->key_len <= BTU_ROW_KEY_MAX && p->h > p->w);
        out[k++] = '.';
        k += put_i64(out + k, p->h);
        out[k++] = '.';
        for (size_t i = 0; i < p->key_len; i++) {
            out[k++] = digits[p->key[i] >> 4];
            out[k++] = digits[p->key[i] & 15];
        }
    }
    out[k] = 0;
    return k;
}

/* ---- partitions ---- */

static st_slice bin(ProtobufCBinaryData b) {
    return st_slice_make(b.data, b.len);
}

/* "[start, end)" for an error message; an empty bound shows as "" (first row) or "inf". */
static void range_text(char *out, size_t cap, const btu_key_range *r) {
    char s[CS_ECHO_MAX + 4], e[CS_ECHO_MAX + 4];
    echo(s, sizeof s, r->start);
    echo(e, sizeof e, r->end);
    snprintf(out, cap, "[\"%s\", %s%s%s)", s, r->end.len ? "\"" : "", r->end.len ? e : "inf",
             r->end.len ? "\"" : "");
}

/* A partition's bound is at most a row key long, except the key just above a row key of the
 * longest length (the key and a 0 byte) as an inclusive start or an exclusive end: the form
 * btu_cs_partition_set gives a range ending at (or starting after) such a key, which a CloseStream
 * hands out and its client sends back. */
static bool bound_len_ok(st_slice k, bool successor_form) {
    return k.len <= BTU_ROW_KEY_MAX ||
           (successor_form && k.len == BTU_ROW_KEY_MAX + 1 && k.data[BTU_ROW_KEY_MAX] == 0);
}

st_code btu_cs_request_keepable(size_t len, size_t kept, st_err *err) {
    if (len > BTU_CS_REQUEST_BYTES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "a ReadChangeStream request of %zu bytes is over the limit of %zu KiB "
                          "(it is kept as long as its stream is open): read the partition with "
                          "fewer continuation tokens, e.g. one stream per token's partition",
                          len, BTU_CS_REQUEST_BYTES_MAX >> 10);
    if (kept + len > BTU_CS_KEPT_REQUESTS_MAX)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED,
                          "the open change streams' requests hold %zu KiB, and this one's %zu "
                          "bytes would pass their limit of %zu MiB: close streams that are not "
                          "read, retry later, or send smaller requests",
                          kept >> 10, len, BTU_CS_KEPT_REQUESTS_MAX >> 20);
    return ST_OK;
}

st_code btu_cs_partition_range(const Google__Bigtable__V2__StreamPartition *p, const char *what,
                               st_arena *arena, btu_key_range *out, st_err *err) {
    if (p == NULL)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s is missing: give the partition to read, as "
                          "GenerateInitialChangeStreamPartitions or a CloseStream returned it",
                          what);
    const Google__Bigtable__V2__RowRange *r = p->row_range;
    st_slice s = {NULL, 0}, e = {NULL, 0};
    bool s_open = false, e_closed = false;
    if (r && r->start_key_case != GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY__NOT_SET) {
        s_open = r->start_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_OPEN;
        s = bin(s_open ? r->start_key_open : r->start_key_closed);
    }
    if (r && r->end_key_case != GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY__NOT_SET) {
        e_closed = r->end_key_case == GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_CLOSED;
        e = bin(e_closed ? r->end_key_closed : r->end_key_open);
    }
    if (!bound_len_ok(s, !s_open) || !bound_len_ok(e, !e_closed))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s has a row key over %d bytes, longer than any row key", what,
                          BTU_ROW_KEY_MAX);
    if ((s.len > 0 && s_open && btu_key_successor(arena, s, &s) != ST_OK) ||
        (e.len > 0 && e_closed && btu_key_successor(arena, e, &e) != ST_OK))
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading %s", what);
    out->start = s;
    out->end = e;
    if (btu_range_is_empty(out)) {
        char t[2 * CS_ECHO_MAX + 32];
        range_text(t, sizeof t, out);
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s %s selects no row: its start must be below its end", what, t);
    }
    return ST_OK;
}

void btu_cs_partition_set(Google__Bigtable__V2__StreamPartition *p,
                          Google__Bigtable__V2__RowRange *rr, st_slice start, st_slice end) {
    google__bigtable__v2__stream_partition__init(p);
    google__bigtable__v2__row_range__init(rr);
    p->row_range = rr;
    if (start.len > 0) {
        rr->start_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__START_KEY_START_KEY_CLOSED;
        rr->start_key_closed.data = (uint8_t *)(uintptr_t)start.data;
        rr->start_key_closed.len = start.len;
    }
    if (end.len > 0) {
        rr->end_key_case = GOOGLE__BIGTABLE__V2__ROW_RANGE__END_KEY_END_KEY_OPEN;
        rr->end_key_open.data = (uint8_t *)(uintptr_t)end.data;
        rr->end_key_open.len = end.len;
    }
}

bool btu_cs_range_eq(const btu_key_range *a, const btu_key_range *b) {
    return st_slice_eq(a->start, b->start) && btu_end_cmp(a->end, b->end) == 0;
}

/* ---- merging tokens ---- */

typedef struct cs_part {
    btu_key_range r;
    int64_t w;
    bool has_y;
    uint32_t cluster;
    int64_t y;
} cs_part;

static int part_cmp(const void *a, const void *b) {
    const cs_part *x = a, *y = b;
    return st_slice_cmp(x->r.start, y->r.start);
}

static st_code token_at(Google__Bigtable__V2__StreamContinuationToken *const *tokens, size_t i,
                        uint32_t table_tag, st_arena *arena, btu_key_range *r, btu_cs_pos *pos,
                        st_err *err) {
    char what[64];
    snprintf(what, sizeof what, "continuation_tokens[%zu].partition", i);
    if (tokens[i] == NULL)
        return st_err_set(err, ST_INVALID_ARGUMENT, "continuation_tokens[%zu] is empty", i);
    st_code rc = btu_cs_partition_range(tokens[i]->partition, what, arena, r, err);
    if (rc == ST_OK)
        rc = btu_cs_token_parse(st_slice_cstr(tokens[i]->token), pos, err);
    if (rc == ST_OK && pos->has_table && pos->table != table_tag)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "continuation_tokens[%zu] was handed out by the change stream of "
                          "another table: resume each table from its own tokens, or with "
                          "start_time",
                          i);
    return rc;
}

static st_code not_covered(const btu_key_range *want, const char *how, const btu_key_range *got,
                           st_err *err) {
    char w[2 * CS_ECHO_MAX + 32], g[2 * CS_ECHO_MAX + 32];
    range_text(w, sizeof w, want);
    range_text(g, sizeof g, got);
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "the continuation tokens do not cover the partition %s exactly: %s %s; pass "
                      "the tokens of exactly this partition (a CloseStream names the tokens of "
                      "each new partition)",
                      w, how, g);
}

/* parts[0..n) sorted by start: each must start where the previous ended, the first at the
 * partition's start, the last ending at its end. */
static st_code check_tiling(const cs_part *parts, size_t n, const btu_key_range *partition,
                            st_err *err) {
    if (!st_slice_eq(parts[0].r.start, partition->start))
        return not_covered(partition, "the first token's partition is", &parts[0].r, err);
    for (size_t i = 0; i + 1 < n; i++) {
        if (parts[i].r.end.len == 0 || st_slice_cmp(parts[i].r.end, parts[i + 1].r.start) > 0)
            return not_covered(partition, "tokens overlap at", &parts[i + 1].r, err);
        if (st_slice_cmp(parts[i].r.end, parts[i + 1].r.start) < 0)
            return not_covered(partition, "a gap is left before", &parts[i + 1].r, err);
    }
    if (btu_end_cmp(parts[n - 1].r.end, partition->end) != 0)
        return not_covered(partition, "the last token's partition is", &parts[n - 1].r, err);
    return ST_OK;
}

/* The start of merged partitions: the smallest W; issued by one cluster, that cluster with the
 * smallest Y; else (several clusters, or versions mixed) the smallest W or Y without a bound,
 * which is at or below where each token would start on any cluster. */
static void merge_positions(const cs_part *parts, size_t n, btu_cs_pos *out) {
    int64_t w = parts[0].w, y = parts[0].has_y ? parts[0].y : parts[0].w;
    bool one_cluster = parts[0].has_y;
    for (size_t i = 1; i < n; i++) {
        w = parts[i].w < w ? parts[i].w : w;
        int64_t yi = parts[i].has_y ? parts[i].y : parts[i].w;
        y = yi < y ? yi : y;
        one_cluster = one_cluster && parts[i].has_y && parts[i].cluster == parts[0].cluster;
    }
    if (one_cluster) {
        btu_cs_pos_live(out, w);
        btu_cs_pos_set_bound(out, parts[0].cluster, y);
    } else {
        btu_cs_pos_live(out, y < w ? y : w);
    }
}

st_code btu_cs_tokens_merge(Google__Bigtable__V2__StreamContinuationToken *const *tokens, size_t n,
                            const btu_key_range *partition, uint32_t table_tag, st_arena *arena,
                            btu_cs_pos *out, st_err *err) {
    if (n == 0)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "continuation_tokens holds no token: pass the tokens the stream "
                          "returned, or start_time");
    if (n > BTU_CS_TOKENS_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "continuation_tokens holds %zu tokens; at most %d are accepted", n,
                          BTU_CS_TOKENS_MAX);
    btu_key_range r;
    if (n == 1) {
        st_code rc = token_at(tokens, 0, table_tag, arena, &r, out, err);
        if (rc == ST_OK && !btu_cs_range_eq(&r, partition))
            return not_covered(partition, "the token's partition is", &r, err);
        return rc;
    }
    cs_part *parts = st_arena_alloc(arena, n * sizeof *parts);
    if (parts == NULL)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory reading the tokens");
    for (size_t i = 0; i < n; i++) {
        st_code rc = token_at(tokens, i, table_tag, arena, &parts[i].r, out, err);
        if (rc != ST_OK)
            return rc;
        parts[i].w = out->w;
        parts[i].has_y = out->has_y;
        parts[i].cluster = out->cluster;
        parts[i].y = out->y;
    }
    qsort(parts, n, sizeof *parts, part_cmp);
    st_code rc = check_tiling(parts, n, partition, err);
    if (rc != ST_OK)
        return rc;
    merge_positions(parts, n, out);
    return ST_OK;
}

/* ---- times ---- */

st_code btu_cs_time_us(const Google__Protobuf__Timestamp *t, const char *field, bool round_up,
                       int64_t *out, st_err *err) {
    if (t->seconds < 0 || t->seconds > CS_TIME_SECONDS_MAX || t->nanos < 0 || t->nanos > 999999999)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "%s is out of range (seconds %lld, nanos %d): give a time after "
                          "1970-01-01T00:00:00Z with nanos in 0..999999999",
                          field, (long long)t->seconds, (int)t->nanos);
    int64_t us = t->seconds * 1000000 + t->nanos / 1000;
    if (round_up && t->nanos % 1000 != 0)
        us++;
    *out = us;
    return ST_OK;
}

void btu_cs_time_text(int64_t us, char *out, size_t cap) {
    time_t s = (time_t)(us / 1000000);
    struct tm tm;
    if (us < 0 || !gmtime_r(&s, &tm)) {
        snprintf(out, cap, "%" PRId64 "us", us);
        return;
    }
    char day[24];
    if (strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        day[0] = 0;
    snprintf(out, cap, "%.20s.%06dZ", day, (int)(us % 1000000));
}

st_code btu_cs_start_time_check(int64_t t, int64_t now, int64_t oldest, const char *table,
                                st_err *err) {
    char t1[40], t2[40];
    btu_cs_time_text(t, t1, sizeof t1);
    if (t > now)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "start_time %s is in the future: start at or before now", t1);
    btu_cs_time_text(oldest, t2, sizeof t2);
    if (t < oldest)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "start_time %s is before %s, the oldest change table %s still "
                          "holds (its retention, or when change streams were turned on)",
                          t1, t2, table);
    return ST_OK;
}

st_code btu_cs_check_times(const Google__Bigtable__V2__ReadChangeStreamRequest *req, st_err *err) {
    int64_t start = 0, end = 0;
    bool has_start = req->start_from_case ==
                         GOOGLE__BIGTABLE__V2__READ_CHANGE_STREAM_REQUEST__START_FROM_START_TIME &&
                     req->start_time;
    st_code rc =
        has_start ? btu_cs_time_us(req->start_time, "start_time", true, &start, err) : ST_OK;
    if (rc == ST_OK && req->end_time)
        rc = btu_cs_time_us(req->end_time, "end_time", false, &end, err);
    if (rc != ST_OK)
        return rc;
    /* end_time is inclusive: equal to start_time asks for the records of that instant (compared
     * to the nanosecond: the two round to microseconds in opposite directions) */
    const Google__Protobuf__Timestamp *s = req->start_time, *e = req->end_time;
    if (has_start && e &&
        (e->seconds < s->seconds || (e->seconds == s->seconds && e->nanos < s->nanos)))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "end_time (%lld.%09d s) is before start_time (%lld.%09d s): give an "
                          "end_time at or after the start_time, or none to read without end",
                          (long long)req->end_time->seconds, (int)req->end_time->nanos,
                          (long long)req->start_time->seconds, (int)req->start_time->nanos);
    const Google__Protobuf__Duration *d = req->heartbeat_duration;
    /* negative, or nanos of the other sign than seconds (not a valid Duration) */
    if (d && (d->seconds < 0 || d->nanos < 0 || d->nanos > 999999999))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "heartbeat_duration must be a positive duration (got %lld s %d ns); "
                          "leave it unset for the default of 5 s",
                          (long long)d->seconds, (int)d->nanos);
    return ST_OK;
}

void btu_cs_time_set(Google__Protobuf__Timestamp *t, int64_t us) {
    google__protobuf__timestamp__init(t);
    t->seconds = us / 1000000;
    t->nanos = (int32_t)(us % 1000000) * 1000;
}
