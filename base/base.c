/* base.c — status codes, slices, buffers, arenas, logging, clocks, CRC32C, varints, RNG. */
#include "strata/base.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- status codes ---- */

static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *st_code_name(st_code code) {
    if ((unsigned)code < sizeof(code_names) / sizeof(code_names[0]))
        return code_names[code];
    return "UNKNOWN_CODE";
}

st_code st_err_set(st_err *err, st_code code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void st_err_prefix(st_err *err, const char *fmt, ...) {
    if (!err)
        return;
    char old[ST_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%s", old);
}

void st_err_clear(st_err *err) {
    if (err) {
        err->code = ST_OK;
        err->msg[0] = '\0';
    }
}

/* ---- slices ---- */

st_slice st_slice_cstr(const char *s) {
    return st_slice_make(s, s ? strlen(s) : 0);
}

int st_slice_cmp(st_slice a, st_slice b) {
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.data, b.data, n) : 0;
    if (c)
        return c;
    return a.len < b.len ? -1 : (a.len > b.len ? 1 : 0);
}

bool st_slice_eq(st_slice a, st_slice b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

bool st_slice_has_prefix(st_slice s, st_slice prefix) {
    return s.len >= prefix.len && (prefix.len == 0 || memcmp(s.data, prefix.data, prefix.len) == 0);
}

/* ---- buffers ---- */

void st_buf_init(st_buf *b) {
    memset(b, 0, sizeof *b);
}

void st_buf_free(st_buf *b) {
    free(b->data);
    st_buf_init(b);
}

void st_buf_reset(st_buf *b) {
    b->len = 0;
}

st_code st_buf_reserve(st_buf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len)
        return ST_RESOURCE_EXHAUSTED;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return ST_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return ST_RESOURCE_EXHAUSTED;
    b->data = p;
    b->cap = cap;
    return ST_OK;
}

st_code st_buf_append(st_buf *b, const void *data, size_t len) {
    if (len == 0)
        return ST_OK;
    st_code rc = st_buf_reserve(b, len);
    if (rc != ST_OK)
        return rc;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return ST_OK;
}

st_code st_buf_append_byte(st_buf *b, uint8_t byte) {
    return st_buf_append(b, &byte, 1);
}

st_code st_buf_append_varint64(st_buf *b, uint64_t v) {
    uint8_t tmp[ST_VARINT64_MAX];
    return st_buf_append(b, tmp, st_put_varint64(tmp, v));
}

st_code st_buf_append_fixed32(st_buf *b, uint32_t v) {
    uint8_t tmp[4];
    st_put_fixed32(tmp, v);
    return st_buf_append(b, tmp, 4);
}

st_code st_buf_append_fixed64(st_buf *b, uint64_t v) {
    uint8_t tmp[8];
    st_put_fixed64(tmp, v);
    return st_buf_append(b, tmp, 8);
}

/* ---- arena ---- */

struct st_arena_block {
    st_arena_block *next;
    size_t size;
    _Alignas(16) uint8_t data[];
};

void st_arena_init(st_arena *a, size_t block_bytes) {
    memset(a, 0, sizeof *a);
    a->block_bytes = block_bytes ? block_bytes : 4096;
}

void st_arena_deinit(st_arena *a) {
    st_arena_block *b = a->head;
    while (b) {
        st_arena_block *next = b->next;
        free(b);
        b = next;
    }
    size_t bb = a->block_bytes;
    st_arena_init(a, bb);
}

void *st_arena_alloc(st_arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0)
        size = 16;
    if (size > a->avail) {
        /* Large requests get their own block so the current one keeps serving small ones. */
        size_t bsize = size > a->block_bytes / 4 ? size : a->block_bytes;
        st_arena_block *b = malloc(sizeof *b + bsize);
        if (!b)
            return NULL;
        b->size = bsize;
        a->total_bytes += sizeof *b + bsize;
        if (bsize == size && a->head) {
            b->next = a->head->next;
            a->head->next = b;
            return b->data;
        }
        b->next = a->head;
        a->head = b;
        a->ptr = b->data;
        a->avail = bsize;
    }
    void *p = a->ptr;
    a->ptr += size;
    a->avail -= size;
    return p;
}

void *st_arena_dup(st_arena *a, const void *data, size_t len) {
    void *p = st_arena_alloc(a, len);
    if (p && len)
        memcpy(p, data, len);
    return p;
}

/* ---- logging ---- */

/* Process-global by design: one log per process, swappable by tests. */
static st_log_sink_fn log_sink;
static void *log_sink_arg;
static st_log_level log_min = ST_LOG_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void st_log_set_sink(st_log_sink_fn sink, void *arg) {
    pthread_mutex_lock(&log_mu);
    log_sink = sink;
    log_sink_arg = arg;
    pthread_mutex_unlock(&log_mu);
}

void st_log_set_level(st_log_level min_level) {
    log_min = min_level;
}

void st_log(st_log_level level, const char *module, const char *fmt, ...) {
    if (level < log_min)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    static const char *const names[] = {"debug", "info", "warn", "error"};
    pthread_mutex_lock(&log_mu);
    if (log_sink) {
        log_sink(level, module, line, log_sink_arg);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s module=%s %s\n",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, names[level & 3], module, line);
    }
    pthread_mutex_unlock(&log_mu);
}

void st_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "strata: assertion failed: %s at %s:%d\n", expr, file, line);
    abort();
}

/* ---- clocks ---- */

int64_t st_wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t st_mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t system_now(st_clock *c) {
    (void)c;
    return st_wall_us();
}

static int64_t fake_now(st_clock *c) {
    return __atomic_load_n(&c->fake_now_us, __ATOMIC_RELAXED);
}

/* Constant table-like object: stateless, shared. */
static st_clock system_clock = {system_now, 0};

st_clock *st_clock_system(void) {
    return &system_clock;
}

void st_clock_fake_init(st_clock *c, int64_t start_us) {
    c->now_us = fake_now;
    c->fake_now_us = start_us;
}

/* ---- CRC32C (Castagnoli), slicing-by-8 in software; hardware when the CPU has SSE4.2 ---- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = (uint32_t)__builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n) {
    pthread_once(&crc_once, crc_init);
    while (n >= 8) {
        uint32_t lo = c ^ st_get_fixed32(p);
        uint32_t hi = st_get_fixed32(p + 4);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^
            crc_table[2][(hi >> 8) & 0xff] ^ crc_table[1][(hi >> 16) & 0xff] ^
            crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c;
}

uint32_t st_crc32c(uint32_t crc, const void *data, size_t len) {
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_hw(c, data, len);
#endif
    return ~crc_sw(c, data, len);
}

/* 64-bit hash: a simple, well-mixed multiply-xorshift over 8-byte words (not cryptographic). */
uint64_t st_hash64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = data;
    uint64_t h = seed ^ (len * 0x9e3779b97f4a7c15ull);
    while (len >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        k *= 0xbf58476d1ce4e5b9ull;
        k ^= k >> 31;
        h = (h ^ k) * 0x94d049bb133111ebull;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < len; i++)
        tail |= (uint64_t)p[i] << (8 * i);
    h ^= tail * 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* ---- varints ---- */

size_t st_put_varint64(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

bool st_get_varint64(const uint8_t **pp, const uint8_t *end, uint64_t *v) {
    const uint8_t *p = *pp;
    uint64_t r = 0;
    for (int shift = 0; shift <= 63 && p < end; shift += 7) {
        uint8_t byte = *p++;
        if (shift == 63 && byte > 1)
            return false;
        r |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *pp = p;
            *v = r;
            return true;
        }
    }
    return false;
}

bool st_get_len_prefixed(const uint8_t **pp, const uint8_t *end, st_slice *out) {
    const uint8_t *p = *pp;
    uint64_t len;
    if (!st_get_varint64(&p, end, &len) || len > (uint64_t)(end - p))
        return false;
    *out = st_slice_make(p, (size_t)len);
    *pp = p + len;
    return true;
}

size_t st_varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* ---- RNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void st_rng_seed(st_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t st_rng_next(st_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t st_rng_below(st_rng *r, uint64_t n) {
    /* Lemire's multiply-shift; the tiny bias is irrelevant for tests and skiplist heights. */
    return (uint64_t)(((unsigned __int128)st_rng_next(r) * n) >> 64);
}

uint64_t st_test_seed(const char *test_name) {
    const char *env = getenv("STRATA_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        seed = (uint64_t)st_wall_us() ^ ((uint64_t)getpid() << 32);
    }
    fprintf(stderr, "%s: STRATA_SEED=%llu (set it to replay)\n", test_name ? test_name : "test",
            (unsigned long long)seed);
    return seed;
}
