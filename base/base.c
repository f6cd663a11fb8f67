/* base.c — status codes, slices, buffers, arenas, logging, clocks, CRC32C, varints, RNG. */
#include "strata/base.h"

#include <stdarg.h>
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

bool st_addr_split(const char *addr, char *host, size_t host_cap, uint16_t *port) {
    if (!addr || !host || host_cap == 0)
        return false;
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return false;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (h[0] == '[') { /* [v6]:port */
        if (hl < 3 || h[hl - 1] != ']')
            return false;
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl) || memchr(h, ']', hl)) {
        return false; /* a bare IPv6 address is ambiguous: it needs brackets */
    }
    if (hl >= host_cap || memchr(h, '[', hl) || memchr(h, ' ', hl))
        return false;
    const char *ps = colon + 1;
    if (!*ps || strlen(ps) > 5)
        return false;
    unsigned long v = 0;
    for (const char *c = ps; *c; c++) {
        if (*c < '0' || *c > '9')
            return false;
        v = v * 10 + (unsigned long)(*c - '0');
    }
    if (v > 65535)
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    if (port)
        *port = (uint16_t)v;
    return true;
}

bool st_is_not_owner(st_code code, const char *message) {
    return code == ST_FAILED_PRECONDITION && message &&
           strncmp(message, ST_NOT_OWNER_PREFIX, sizeof ST_NOT_OWNER_PREFIX - 1) == 0;
}

bool st_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || !*s)
        return false;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

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

void st_arena_reset(st_arena *a) {
    st_arena_block *keep = a->head && a->head->size <= a->block_bytes ? a->head : NULL;
    st_arena_block *b = keep ? keep->next : a->head;
    while (b) {
        st_arena_block *next = b->next;
        free(b);
        b = next;
    }
    if (keep == NULL) {
        st_arena_init(a, a->block_bytes);
        return;
    }
    keep->next = NULL;
    a->ptr = keep->data;
    a->avail = keep->size;
    a->total_bytes = sizeof *keep + keep->size;
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

char *st_arena_printf(st_arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *out = n < 0 ? NULL : st_arena_alloc(a, (size_t)n + 1);
    if (!out)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
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

bool st_ratelimit_pass(st_ratelimit *rl, uint64_t *suppressed) {
    int64_t now = st_mono_us();
    int64_t next = __atomic_load_n(&rl->next_us, __ATOMIC_RELAXED);
    if (now < next || !__atomic_compare_exchange_n(&rl->next_us, &next, now + ST_LOG_INTERVAL_US,
                                                   false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&rl->suppressed, 1, __ATOMIC_RELAXED);
        return false;
    }
    *suppressed = __atomic_exchange_n(&rl->suppressed, 0, __ATOMIC_RELAXED);
    return true;
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

/* ---- CRC32C (Castagnoli): slicing-by-8 in software; SSE4.2 crc32 (three chains for long
 * buffers) or AVX-512 VPCLMULQDQ folding when the CPU has them ---- */

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

/* a * b modulo the (reflected) Castagnoli polynomial; bit 31 is x^0 */
static uint32_t crc_multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ 0x82f63b78u : b >> 1;
    }
    return p;
}

/* x^n modulo the polynomial. */
static uint32_t crc_xpow(uint64_t n) {
    uint32_t p = 1u << 31, sq = 1u << 30; /* x^0; x^1 */
    for (; n; n >>= 1) {
        if (n & 1)
            p = crc_multmodp(sq, p);
        sq = crc_multmodp(sq, sq);
    }
    return p;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

/* The crc32 instruction has a latency of 3 cycles but issues one per cycle, so one dependency
 * chain uses a third of it. Long buffers are cut into three equal parts whose CRCs run as
 * independent chains in one loop, then combined: crc(A B) = shift(crc(A), |B|) ^ crc0(B), where
 * shift appends |B| zero bytes, done with four table lookups per fixed length (the technique of
 * Intel's paper and Mark Adler's crc32c.c). Blocks of CRC_LONG bytes per part, then CRC_SHORT. */
#define CRC_LONG 4096
#define CRC_SHORT 128

static uint32_t crc_long_tab[4][256], crc_short_tab[4][256];
static pthread_once_t crc_hw_once = PTHREAD_ONCE_INIT;

/* Buffers of at least CRC_FOLD_MIN bytes go through carry-less multiplication when the CPU has
 * AVX-512 VPCLMULQDQ: 256 bytes per step in four 512-bit accumulators, each 128-bit chunk
 * folded forward (chunk * x^D mod P, in two 64 x 32-bit products) onto the data D bits on, the
 * last chunk reduced by the crc32 instruction (Intel's "Fast CRC Computation Using PCLMULQDQ",
 * 512 bits wide). Measured (2026-11-30, EPYC): 1 KiB 46 GB/s, 4 KiB 50, 64 KiB 63 against
 * 25 / 24 / 23 for the three crc32 chains and 15 / 11 / 9 for one; as fast as ISA-L's
 * crc32_iscsi (44 / 54 / 63). The constants are
 * computed at start from the polynomial (crc_xpow), not copied from tables. */
#define CRC_FOLD_MIN 512
static bool crc_fold_ok;
/* Without AVX-512 but with PCLMULQDQ: the same folding 128 bits wide, 64 bytes per step in four
 * accumulators. On the 2-core EPYC of docs/backups.md (no AVX-512), where the three chains reach
 * only a third of the speed measured above, it measured 1.3 to 1.5 times their speed (CPU time
 * over hot 256 KiB buffers, six runs alternated on a loaded machine: 4.3 to 9.2 GB/s against
 * 3.7 to 6.6). */
static bool crc_fold128_ok;
static uint64_t crc_fold_k[4][2]; /* fold by 128 (index 0), 256, 384, 512 bits */
static uint64_t crc_fold_k2048[2];

/* The multipliers that fold a 128-bit chunk d bits forward. In a chunk loaded little endian,
 * the low quadword L holds the earlier bits, so chunk = L x^64 + H, and chunk x^d = L x^(64+d)
 * + H x^d; pclmul's product of bit-reflected operands comes out one degree low, hence the -1. */
static void crc_fold_consts(uint64_t d, uint64_t k[2]) {
    k[0] = (uint64_t)crc_xpow(64 + d - 1) << 32;
    k[1] = (uint64_t)crc_xpow(d - 1) << 32;
}

static void crc_shift_tab_make(uint32_t tab[4][256], size_t n) {
    uint32_t op = crc_xpow(8 * (uint64_t)n); /* the operator that appends n zero bytes */
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            tab[k][b] = crc_multmodp(op, b << (8 * k));
}

static void crc_hw_init(void) {
    crc_shift_tab_make(crc_long_tab, CRC_LONG);
    crc_shift_tab_make(crc_short_tab, CRC_SHORT);
    for (uint64_t i = 0; i < 4; i++)
        crc_fold_consts(128 * (i + 1), crc_fold_k[i]);
    crc_fold_consts(2048, crc_fold_k2048);
    unsigned a = 0, b = 0, c = 0, d = 0; /* leaf 7: ecx bit 10 is VPCLMULQDQ */
    crc_fold_ok = __builtin_cpu_supports("avx512f") && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
                  (c & (1u << 10)) != 0;
    crc_fold128_ok = __builtin_cpu_supports("pclmul");
    /* Lets the tests check the three-chain path on CPUs that fold (base_test_crc_chains), and
     * the 128-bit folding on CPUs with AVX-512 (base_test_crc_fold128). */
    if (getenv("STRATA_CRC32C_NO_FOLD"))
        crc_fold_ok = crc_fold128_ok = false;
    if (getenv("STRATA_CRC32C_FOLD128"))
        crc_fold_ok = false;
}

#define CRC_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

CRC_FOLD_TARGET static __m512i crc_fold512(__m512i a, __m512i k, __m512i next) {
    __m512i lo = _mm512_clmulepi64_epi128(a, k, 0x00), hi = _mm512_clmulepi64_epi128(a, k, 0x11);
    return _mm512_ternarylogic_epi64(lo, hi, next, 0x96); /* lo ^ hi ^ next */
}

CRC_FOLD_TARGET static __m128i crc_fold128(__m128i a, const uint64_t k[2]) {
    __m128i kk = _mm_set_epi64x((long long)k[1], (long long)k[0]);
    return _mm_xor_si128(_mm_clmulepi64_si128(a, kk, 0x00), _mm_clmulepi64_si128(a, kk, 0x11));
}

/* Consumes whole 256-byte steps of [*p, *p + *n) (at least one: *n >= 256) and returns the
 * crc32 register after them. */
CRC_FOLD_TARGET static uint32_t crc_fold(uint32_t c, const uint8_t **pp, size_t *pn) {
    const uint8_t *p = *pp;
    size_t n = *pn;
    __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    /* A crc register c over M equals register 0 over M with c xored into its first 4 bytes. */
    x0 = _mm512_xor_si512(x0,
                          _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)c), 0));
    const uint64_t *kf = crc_fold_k2048;
    __m512i k = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)kf[1], (long long)kf[0]));
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = crc_fold512(x0, k, _mm512_loadu_si512(p));
        x1 = crc_fold512(x1, k, _mm512_loadu_si512(p + 64));
        x2 = crc_fold512(x2, k, _mm512_loadu_si512(p + 128));
        x3 = crc_fold512(x3, k, _mm512_loadu_si512(p + 192));
    }
    kf = crc_fold_k[3];
    k = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)kf[1], (long long)kf[0]));
    x1 = crc_fold512(x0, k, x1);
    x2 = crc_fold512(x1, k, x2);
    x3 = crc_fold512(x2, k, x3);
    __m128i r = _mm_xor_si128(crc_fold128(_mm512_extracti32x4_epi32(x3, 0), crc_fold_k[2]),
                              crc_fold128(_mm512_extracti32x4_epi32(x3, 1), crc_fold_k[1]));
    r = _mm_xor_si128(r, crc_fold128(_mm512_extracti32x4_epi32(x3, 2), crc_fold_k[0]));
    r = _mm_xor_si128(r, _mm512_extracti32x4_epi32(x3, 3));
    uint64_t v = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
    v = _mm_crc32_u64(v, (uint64_t)_mm_extract_epi64(r, 1));
    *pp = p;
    *pn = n;
    return (uint32_t)v;
}

#define CRC_FOLD128_TARGET __attribute__((target("pclmul,sse4.2")))

CRC_FOLD128_TARGET static __m128i crc_fold128_k(__m128i a, __m128i k, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(a, k, 0x00), hi = _mm_clmulepi64_si128(a, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

CRC_FOLD128_TARGET static __m128i crc_k128(const uint64_t k[2]) {
    return _mm_set_epi64x((long long)k[1], (long long)k[0]);
}

/* crc_fold 128 bits wide: whole 64-byte steps of [*p, *p + *n) (*n >= 64), each 16-byte
 * accumulator folded 512 bits on; the four then folded onto the last and reduced as there. */
CRC_FOLD128_TARGET static uint32_t crc_fold128_sse(uint32_t c, const uint8_t **pp, size_t *pn) {
    const uint8_t *p = *pp;
    size_t n = *pn;
    __m128i x0 = _mm_loadu_si128((const __m128i *)p), x1 = _mm_loadu_si128((const __m128i *)p + 1);
    __m128i x2 = _mm_loadu_si128((const __m128i *)p + 2),
            x3 = _mm_loadu_si128((const __m128i *)p + 3);
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c)); /* as in crc_fold */
    __m128i k = crc_k128(crc_fold_k[3]);
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = crc_fold128_k(x0, k, _mm_loadu_si128((const __m128i *)p));
        x1 = crc_fold128_k(x1, k, _mm_loadu_si128((const __m128i *)p + 1));
        x2 = crc_fold128_k(x2, k, _mm_loadu_si128((const __m128i *)p + 2));
        x3 = crc_fold128_k(x3, k, _mm_loadu_si128((const __m128i *)p + 3));
    }
    __m128i r = crc_fold128_k(x0, crc_k128(crc_fold_k[2]), x3);
    r = crc_fold128_k(x1, crc_k128(crc_fold_k[1]), r);
    r = crc_fold128_k(x2, crc_k128(crc_fold_k[0]), r);
    uint64_t v = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
    v = _mm_crc32_u64(v, (uint64_t)_mm_extract_epi64(r, 1));
    *pp = p;
    *pn = n;
    return (uint32_t)v;
}

static uint32_t crc_shift(uint32_t tab[4][256], uint32_t c) {
    return tab[0][c & 0xff] ^ tab[1][(c >> 8) & 0xff] ^ tab[2][(c >> 16) & 0xff] ^ tab[3][c >> 24];
}

/* Three chains over [p, p + block), [p + block, ..), [p + 2 block, ..); returns the combined
 * CRC of the 3 * block bytes. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw3(uint32_t c0, const uint8_t *p,
                                                          size_t block, uint32_t tab[4][256]) {
    uint64_t c1 = 0, c2 = 0, x = c0;
    for (const uint8_t *end = p + block; p < end; p += 8) {
        uint64_t v0, v1, v2;
        memcpy(&v0, p, 8);
        memcpy(&v1, p + block, 8);
        memcpy(&v2, p + 2 * block, 8);
        x = __builtin_ia32_crc32di(x, v0);
        c1 = __builtin_ia32_crc32di(c1, v1);
        c2 = __builtin_ia32_crc32di(c2, v2);
    }
    uint32_t c = crc_shift(tab, (uint32_t)x) ^ (uint32_t)c1;
    return crc_shift(tab, c) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n) {
    if (n >= 3 * CRC_SHORT) {
        pthread_once(&crc_hw_once, crc_hw_init);
        if (n >= CRC_FOLD_MIN && crc_fold_ok)
            c = crc_fold(c, &p, &n);
        else if (n >= CRC_FOLD_MIN && crc_fold128_ok)
            c = crc_fold128_sse(c, &p, &n);
        for (; n >= 3 * CRC_LONG; p += 3 * CRC_LONG, n -= 3 * CRC_LONG)
            c = crc_hw3(c, p, CRC_LONG, crc_long_tab);
        for (; n >= 3 * CRC_SHORT; p += 3 * CRC_SHORT, n -= 3 * CRC_SHORT)
            c = crc_hw3(c, p, CRC_SHORT, crc_short_tab);
    }
    uint64_t x = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        x = __builtin_ia32_crc32di(x, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)x;
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

uint32_t st_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    return crc_multmodp(crc_xpow(8 * len_b), crc_a) ^ crc_b; /* A shifted past B, then B's */
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
    /* Lemire's multiply-shift; the tiny bias is irrelevant for tests and skiplist heights.
     * __int128 is a GCC/Clang extension (the build is -Wpedantic); __extension__ says so. */
    __extension__ typedef unsigned __int128 u128;
    return (uint64_t)(((u128)st_rng_next(r) * n) >> 64);
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
