/* backup_filter.c — the pure parts of backups: backup names and ids, expiry rules, and
 * ListBackups' filter and order_by (Cloud Bigtable's documented language; docs/backups.md). */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* timegm */
#endif
#include "backup.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- names and rules ---- */

bool rtr_bk_id_valid(const char *id) {
    return btu_id_valid(id, RTR_BK_ID_MAX, false);
}

static bool slice_is(st_slice s, const char *c) {
    return st_slice_eq(s, st_slice_cstr(c));
}

/* v[0..2] = project, instance, cluster of a matched name. */
static st_code cluster_of(const st_topology *t, const char *name, const st_slice *v, bool allow_any,
                          size_t *idx, st_err *err) {
    if (!slice_is(v[0], t->project) || !slice_is(v[1], t->instance))
        return st_err_set(err, ST_NOT_FOUND,
                          "instance in '%s' not found: this Strata instance is "
                          "projects/%s/instances/%s",
                          name, t->project, t->instance);
    if (allow_any && slice_is(v[2], "-")) {
        *idx = SIZE_MAX;
        return ST_OK;
    }
    for (size_t i = 0; i < t->n_clusters; i++)
        if (slice_is(v[2], t->clusters[i].id)) {
            *idx = i;
            return ST_OK;
        }
    return st_err_set(err, ST_NOT_FOUND, "cluster %.*s of '%s' not found (see ListClusters)",
                      (int)v[2].len, (const char *)v[2].data, name);
}

st_code rtr_bk_parse_cluster(const st_topology *t, const char *name, bool allow_any, size_t *idx,
                             st_err *err) {
    static const char *const lits[] = {"projects", NULL, "instances", NULL, "clusters", NULL};
    st_slice v[3];
    if (strlen(name) > RTR_TABLE_NAME_MAX || !rtr_name_match(name, lits, 6, v))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid cluster name '%s': expected "
                          "projects/<project>/instances/<instance>/clusters/<cluster>",
                          name);
    return cluster_of(t, name, v, allow_any, idx, err);
}

st_code rtr_bk_parse_name(const st_topology *t, const char *name, size_t *idx, char *id, size_t cap,
                          st_err *err) {
    static const char *const lits[] = {"projects", NULL, "instances", NULL,
                                       "clusters", NULL, "backups",   NULL};
    st_slice v[4];
    if (strlen(name) > RTR_BK_NAME_MAX || !rtr_name_match(name, lits, 8, v) || v[3].len >= cap)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup name '%s': expected projects/<project>/instances/"
                          "<instance>/clusters/<cluster>/backups/<backup>",
                          name);
    memcpy(id, v[3].data, v[3].len);
    id[v[3].len] = '\0';
    if (!rtr_bk_id_valid(id))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid backup id '%s': use 1-%d of [-_.a-zA-Z0-9], starting with a "
                          "letter, a digit or '_'",
                          id, RTR_BK_ID_MAX);
    return cluster_of(t, name, v, false, idx, err);
}

int64_t rtr_bk_ts_us(const Google__Protobuf__Timestamp *t) {
    if (!t)
        return 0;
    /* outside Timestamp's range (years 1..9999) or its nanos: a time no bound accepts, and no
     * int64 overflow that could wrap a far-off second into an accepted window */
    if (t->seconds < -62135596800LL || t->seconds > 253402300799LL || t->nanos < 0 ||
        t->nanos > 999999999)
        return INT64_MIN;
    return t->seconds * 1000000 + t->nanos / 1000;
}

static void fmt_time(int64_t us, char *out, size_t cap) {
    time_t s = (time_t)(us / 1000000);
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* A Timestamp rtr_bk_ts_us refused: saying so, rather than which range the time must lie in,
 * since its seconds alone may well lie there (nanos 2,000,000,000 a day ahead). The rules are
 * protobuf's for google.protobuf.Timestamp, which Cloud Bigtable applies too. */
static st_code ts_invalid(const char *field, st_err *err) {
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "%s is not a valid timestamp (nanos must be 0 to 999,999,999; seconds "
                      "0001-01-01 to 9999-12-31)",
                      field);
}

st_code rtr_bk_check_hot(int64_t hot_us, int64_t now_us, st_err *err) {
    if (hot_us == INT64_MIN)
        return ts_invalid("hot_to_standard_time", err);
    if (hot_us && hot_us < now_us + RTR_BK_HOT_MIN_US)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "hot_to_standard_time must be at least 24 hours after the backup's "
                          "creation");
    return ST_OK;
}

st_code rtr_bk_check_expire(int64_t expire_us, int64_t from_us, int64_t max_us, st_err *err) {
    if (expire_us == INT64_MIN)
        return ts_invalid("expire_time", err);
    int64_t lo = from_us + RTR_BK_EXPIRE_MIN_US, hi = from_us + max_us;
    /* A client asking for the minimum computes it from its own clock a moment before the
     * request arrives (`strata backup create --expire 6h`): that moment is not held against it. */
    if (expire_us >= lo - RTR_BK_EXPIRE_SLACK_US && expire_us <= hi)
        return ST_OK;
    char a[32], b[32];
    fmt_time(lo, a, sizeof a);
    fmt_time(hi, b, sizeof b);
    if (!expire_us)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "expire_time must be set: between %s and %s (6 hours to %lld days "
                          "from now)",
                          a, b, (long long)(max_us / RTR_BK_DAY_US));
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "expire_time must be between 6 hours and %lld days after the backup's "
                      "creation: between %s and %s",
                      (long long)(max_us / RTR_BK_DAY_US), a, b);
}

/* n decimal digits at s (never reading past a NUL), or -1. */
static int digits(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* RFC 3339: YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM) into microseconds. Every field is
 * its exact digits and within its range: timegm would quietly turn month 13, February 31 or
 * hour 99 into some other instant, and a filter would then compare with a time nobody wrote. */
static bool parse_time(const char *s, int64_t *us) {
    int y = digits(s, 4), mo = y < 0 || s[4] != '-' ? -1 : digits(s + 5, 2);
    int d = mo < 1 || mo > 12 || s[7] != '-' ? -1 : digits(s + 8, 2);
    int h = d < 1 || d > 31 || !s[10] || !strchr("Tt ", s[10]) ? -1 : digits(s + 11, 2);
    int mi = h < 0 || h > 23 || s[13] != ':' ? -1 : digits(s + 14, 2);
    int se = mi < 0 || mi > 59 || s[16] != ':' ? -1 : digits(s + 17, 2);
    if (se < 0 || se > 59)
        return false;
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = se};
    int64_t frac = 0, scale = 1000000;
    const char *p = s + 19;
    if (*p == '.') {
        for (p++; isdigit((unsigned char)*p); p++)
            if (scale > 1)
                frac += (*p - '0') * (scale /= 10);
    }
    int64_t off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int hh = digits(p + 1, 2), mm = hh < 0 || hh > 23 || p[3] != ':' ? -1 : digits(p + 4, 2);
        if (mm < 0 || mm > 59)
            return false;
        off = (int64_t)(hh * 60 + mm) * 60 * (*p == '+' ? 1 : -1);
        p += 6;
    } else {
        return false;
    }
    if (*p)
        return false;
    int64_t t = (int64_t)timegm(&tm);
    if (tm.tm_mday != d) /* February 31 and the like: timegm moved it into the next month */
        return false;
    *us = (t - off) * 1000000 + frac;
    return true;
}

/* ---- filter ---- */

typedef enum fk { FK_CMP, FK_AND, FK_OR, FK_NOT } fk;
typedef enum fop { OP_LT, OP_GT, OP_LE, OP_GE, OP_NE, OP_EQ, OP_HAS } fop;

struct rtr_bk_filter {
    fk kind;
    rtr_bk_filter *a, *b;
    rtr_bk_field field;
    fop op;
    const char *s; /* string fields */
    int64_t v;     /* times (us), sizes, states */
};

typedef struct fparse {
    const char *text, *p;
    st_arena *a;
    st_err *err;
    int depth;
    int terms;
} fparse;

/* Bounds on a filter: its nesting, its comparisons (matching recurses over a tree of at most
 * 2 x FILTER_TERMS_MAX nodes) and its length (a client's filter is a few conditions; a huge one
 * would only cost the router memory and time). */
#define FILTER_DEPTH_MAX 64
#define FILTER_TERMS_MAX 256
#define FILTER_BYTES_MAX 8192

static const struct {
    const char *name;
    rtr_bk_field f;
} fields[] = {
    {"name", RTR_BK_F_NAME},       {"source_table", RTR_BK_F_SOURCE_TABLE},
    {"state", RTR_BK_F_STATE},     {"start_time", RTR_BK_F_START},
    {"end_time", RTR_BK_F_END},    {"expire_time", RTR_BK_F_EXPIRE},
    {"size_bytes", RTR_BK_F_SIZE},
};

static bool field_by_name(const char *s, size_t len, rtr_bk_field *out) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strlen(fields[i].name) == len && strncasecmp(fields[i].name, s, len) == 0) {
            *out = fields[i].f;
            return true;
        }
    return false;
}

static st_code perr(fparse *fp, const char *what) {
    return st_err_set(fp->err, ST_INVALID_ARGUMENT,
                      "invalid filter '%.200s%s' at offset %zu: %s (write comparisons such as "
                      "name:nightly AND size_bytes > 1000, over name, source_table, state, "
                      "start_time, end_time, expire_time, size_bytes)",
                      fp->text, strlen(fp->text) > 200 ? "..." : "", (size_t)(fp->p - fp->text),
                      what);
}

static void skip_ws(fparse *fp) {
    while (isspace((unsigned char)*fp->p))
        fp->p++;
}

/* A keyword (AND, OR, NOT) followed by a non-word character. */
static bool keyword(fparse *fp, const char *kw) {
    skip_ws(fp);
    size_t n = strlen(kw);
    if (strncmp(fp->p, kw, n) != 0)
        return false;
    char c = fp->p[n];
    if (isalnum((unsigned char)c) || c == '_')
        return false;
    fp->p += n;
    return true;
}

static rtr_bk_filter *node_new(fparse *fp, fk kind, rtr_bk_filter *a, rtr_bk_filter *b) {
    rtr_bk_filter *n = st_arena_alloc(fp->a, sizeof *n);
    if (!n) {
        st_err_set(fp->err, ST_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->a = a;
    n->b = b;
    return n;
}

static bool parse_op(fparse *fp, fop *op) {
    static const struct {
        const char *s;
        fop op;
    } ops[] = {{"<=", OP_LE}, {">=", OP_GE}, {"!=", OP_NE}, {"<", OP_LT},
               {">", OP_GT},  {"=", OP_EQ},  {":", OP_HAS}};
    skip_ws(fp);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strncmp(fp->p, ops[i].s, strlen(ops[i].s)) == 0) {
            fp->p += strlen(ops[i].s);
            *op = ops[i].op;
            return true;
        }
    return false;
}

/* The bytes the value at p takes (its end is found as parse_value finds it), plus one: the
 * allocation holds this value only, not the rest of the filter. */
static size_t value_cap(const char *p) {
    const char *q = p;
    if (*q == '"') {
        for (q++; *q && *q != '"'; q++)
            if (*q == '\\' && q[1])
                q++;
    } else {
        while (*q && !isspace((unsigned char)*q) && *q != '(' && *q != ')')
            q++;
    }
    return (size_t)(q - p) + 1;
}

/* A quoted string ("..." with \" and \\) or a bare run up to space or parenthesis. */
static char *parse_value(fparse *fp) {
    skip_ws(fp);
    size_t cap = value_cap(fp->p);
    char *out = st_arena_alloc(fp->a, cap), *o = out;
    if (!out)
        return NULL;
    if (*fp->p == '"') {
        for (fp->p++; *fp->p && *fp->p != '"'; fp->p++) {
            if (*fp->p == '\\' && fp->p[1])
                fp->p++;
            *o++ = *fp->p;
        }
        if (*fp->p != '"')
            return NULL;
        fp->p++;
    } else {
        while (*fp->p && !isspace((unsigned char)*fp->p) && *fp->p != '(' && *fp->p != ')')
            *o++ = *fp->p++;
        if (o == out)
            return NULL;
    }
    *o = '\0';
    return out;
}

static st_code cmp_value(fparse *fp, rtr_bk_filter *n, const char *val) {
    char *end;
    switch (n->field) {
    case RTR_BK_F_NAME:
    case RTR_BK_F_SOURCE_TABLE:
        n->s = val;
        return ST_OK;
    case RTR_BK_F_STATE:
        if (strcasecmp(val, "CREATING") == 0)
            n->v = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING;
        else if (strcasecmp(val, "READY") == 0)
            n->v = GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__READY;
        else if (strcasecmp(val, "STATE_UNSPECIFIED") == 0)
            n->v = 0;
        else
            return perr(fp, "a state is CREATING or READY");
        return ST_OK;
    case RTR_BK_F_SIZE:
        errno = 0;
        n->v = strtoll(val, &end, 10);
        return *end || !*val || errno == ERANGE ? perr(fp, "size_bytes compares with an integer")
                                                : ST_OK;
    default:
        return parse_time(val, &n->v)
                   ? ST_OK
                   : perr(fp, "a time is written as 2026-01-02T03:04:05Z (RFC 3339)");
    }
}

static rtr_bk_filter *parse_expr(fparse *fp);

static rtr_bk_filter *parse_cmp(fparse *fp) {
    skip_ws(fp);
    if (++fp->terms > FILTER_TERMS_MAX) {
        perr(fp, "more than 256 comparisons");
        return NULL;
    }
    const char *s = fp->p;
    while (isalnum((unsigned char)*fp->p) || *fp->p == '_' || *fp->p == '.')
        fp->p++;
    rtr_bk_field f;
    if (fp->p == s) {
        perr(fp, "expected a field name, NOT or '('");
        return NULL;
    }
    if (!field_by_name(s, (size_t)(fp->p - s), &f)) {
        fp->p = s;
        perr(fp, "unknown field");
        return NULL;
    }
    rtr_bk_filter *n = node_new(fp, FK_CMP, NULL, NULL);
    if (!n)
        return NULL;
    n->field = f;
    if (!parse_op(fp, &n->op)) {
        perr(fp, "expected an operator: < > <= >= != = or :");
        return NULL;
    }
    char *val = parse_value(fp);
    if (!val) {
        perr(fp, "expected a value");
        return NULL;
    }
    return cmp_value(fp, n, val) == ST_OK ? n : NULL;
}

/* term := NOT term | -term | ( expr ) | comparison */
static rtr_bk_filter *parse_term(fparse *fp) {
    if (++fp->depth > FILTER_DEPTH_MAX) {
        perr(fp, "nested too deeply");
        return NULL;
    }
    rtr_bk_filter *n;
    skip_ws(fp);
    if (keyword(fp, "NOT") || (*fp->p == '-' && fp->p++)) {
        rtr_bk_filter *a = parse_term(fp);
        n = a ? node_new(fp, FK_NOT, a, NULL) : NULL;
    } else if (*fp->p == '(') {
        fp->p++;
        n = parse_expr(fp);
        skip_ws(fp);
        if (n && *fp->p != ')') {
            perr(fp, "expected ')'");
            n = NULL;
        } else if (n) {
            fp->p++;
        }
    } else {
        n = parse_cmp(fp);
    }
    fp->depth--;
    return n;
}

/* factor := term (OR term)* */
static rtr_bk_filter *parse_factor(fparse *fp) {
    rtr_bk_filter *n = parse_term(fp);
    while (n && keyword(fp, "OR")) {
        rtr_bk_filter *b = parse_term(fp);
        n = b ? node_new(fp, FK_OR, n, b) : NULL;
    }
    return n;
}

static bool at_end_of_seq(fparse *fp) {
    skip_ws(fp);
    const char *save = fp->p;
    bool stop = !*fp->p || *fp->p == ')' || keyword(fp, "AND");
    fp->p = save;
    return stop;
}

/* expr := seq (AND seq)*; seq := factor factor* (juxtaposition is AND). OR binds tighter than
 * AND, as in Google's filter language (AIP-160). */
static rtr_bk_filter *parse_expr(fparse *fp) {
    rtr_bk_filter *n = parse_factor(fp);
    for (;;) {
        if (!n)
            return NULL;
        if (!keyword(fp, "AND") && at_end_of_seq(fp))
            return n;
        rtr_bk_filter *b = parse_factor(fp);
        n = b ? node_new(fp, FK_AND, n, b) : NULL;
    }
}

st_code rtr_bk_filter_parse(const char *text, st_arena *a, rtr_bk_filter **out, st_err *err) {
    fparse fp = {text, text, a, err, 0, 0};
    *out = NULL;
    skip_ws(&fp);
    if (!*fp.p)
        return ST_OK;
    if (strlen(text) > FILTER_BYTES_MAX)
        return perr(&fp, "longer than 8192 bytes");
    rtr_bk_filter *n = parse_expr(&fp);
    if (!n)
        return err && err->code ? err->code : ST_INVALID_ARGUMENT;
    skip_ws(&fp);
    if (*fp.p)
        return perr(&fp, "unexpected text");
    *out = n;
    return ST_OK;
}

static int64_t num_of(const rtr_pb_backup *b, rtr_bk_field f) {
    switch (f) {
    case RTR_BK_F_STATE:
        return b->state;
    case RTR_BK_F_START:
        return rtr_bk_ts_us(b->start_time);
    case RTR_BK_F_END:
        return rtr_bk_ts_us(b->end_time);
    case RTR_BK_F_EXPIRE:
        return rtr_bk_ts_us(b->expire_time);
    default:
        return b->size_bytes;
    }
}

static const char *str_of(const rtr_pb_backup *b, rtr_bk_field f) {
    const char *s = f == RTR_BK_F_NAME ? b->name : b->source_table;
    return s ? s : "";
}

static bool cmp_match(const rtr_bk_filter *n, const rtr_pb_backup *b) {
    int c;
    if (n->field == RTR_BK_F_NAME || n->field == RTR_BK_F_SOURCE_TABLE) {
        const char *s = str_of(b, n->field);
        if (n->op == OP_HAS)
            return strstr(s, n->s) != NULL;
        c = strcmp(s, n->s);
    } else {
        int64_t v = num_of(b, n->field);
        c = v < n->v ? -1 : v > n->v;
    }
    switch (n->op) {
    case OP_LT:
        return c < 0;
    case OP_GT:
        return c > 0;
    case OP_LE:
        return c <= 0;
    case OP_GE:
        return c >= 0;
    case OP_NE:
        return c != 0;
    default:
        return c == 0;
    }
}

bool rtr_bk_filter_match(const rtr_bk_filter *f, const rtr_pb_backup *b) {
    if (!f)
        return true;
    switch (f->kind) {
    case FK_AND:
        return rtr_bk_filter_match(f->a, b) && rtr_bk_filter_match(f->b, b);
    case FK_OR:
        return rtr_bk_filter_match(f->a, b) || rtr_bk_filter_match(f->b, b);
    case FK_NOT:
        return !rtr_bk_filter_match(f->a, b);
    default:
        return cmp_match(f, b);
    }
}

/* ---- order_by ---- */

st_code rtr_bk_order_parse(const char *text, rtr_bk_order *out, st_err *err) {
    memset(out, 0, sizeof *out);
    const char *p = text;
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        const char *s = p;
        while (isalnum((unsigned char)*p) || *p == '_')
            p++;
        size_t len = (size_t)(p - s);
        if (!len && !*p && out->n == 0)
            break; /* only spaces */
        if (out->n == RTR_BK_ORDER_KEYS_MAX || !field_by_name(s, len, &out->field[out->n]))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid order_by '%s': list fields among name, source_table, "
                              "state, start_time, end_time, expire_time, size_bytes, each "
                              "optionally followed by desc, separated by commas",
                              text);
        while (isspace((unsigned char)*p))
            p++;
        if (strncasecmp(p, "desc", 4) == 0 &&
            (!p[4] || p[4] == ',' || isspace((unsigned char)p[4])))
            out->desc[out->n] = true, p += 4;
        else if (strncasecmp(p, "asc", 3) == 0 &&
                 (!p[3] || p[3] == ',' || isspace((unsigned char)p[3])))
            p += 3;
        out->n++;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',')
            p++;
        else if (*p)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "invalid order_by '%s': expected ',' after a field", text);
    }
    if (out->n == 0) {
        out->field[0] = RTR_BK_F_START;
        out->desc[0] = true;
        out->n = 1;
    }
    return ST_OK;
}

int rtr_bk_order_cmp(const rtr_bk_order *o, const rtr_pb_backup *a, const rtr_pb_backup *b) {
    for (size_t i = 0; i < o->n; i++) {
        rtr_bk_field f = o->field[i];
        int c;
        if (f == RTR_BK_F_NAME || f == RTR_BK_F_SOURCE_TABLE) {
            c = strcmp(str_of(a, f), str_of(b, f));
        } else {
            int64_t x = num_of(a, f), y = num_of(b, f);
            c = x < y ? -1 : x > y;
        }
        if (c)
            return o->desc[i] ? -c : c;
    }
    return strcmp(str_of(a, RTR_BK_F_NAME), str_of(b, RTR_BK_F_NAME));
}

/* ---- visibility ---- */

bool rtr_bk_visible(const rtr_pb_bkrec *rec, const st_slice *op) {
    if (rec->backup->state != GOOGLE__BIGTABLE__ADMIN__V2__BACKUP__STATE__CREATING || !op ||
        !rec->operation || !rec->operation[0])
        return true;
    Google__Longrunning__Operation *o =
        google__longrunning__operation__unpack(NULL, op->len, (const uint8_t *)op->data);
    bool failed = o && o->done && o->result_case == GOOGLE__LONGRUNNING__OPERATION__RESULT_ERROR;
    if (o)
        google__longrunning__operation__free_unpacked(o, NULL);
    return !failed;
}
