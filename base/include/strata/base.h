/* strata/base.h — the leaf under everything: status codes, slices, buffers, arenas, logging,
 * clocks, checksums, varints, a small RNG. libc only.
 *
 * Error codes are numbered like gRPC status codes so a storage error reaches a client as the
 * right gRPC code without a translation table. Functions that can fail return st_code and take an
 * optional st_err * (may be NULL) that receives a sentence for a person: what happened and what to
 * do. Error paths do not allocate. */
#ifndef STRATA_BASE_H
#define STRATA_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- status codes (gRPC numbering) ---- */
typedef enum st_code {
    ST_OK = 0,
    ST_CANCELLED = 1,
    ST_UNKNOWN = 2,
    ST_INVALID_ARGUMENT = 3,
    ST_DEADLINE_EXCEEDED = 4,
    ST_NOT_FOUND = 5,
    ST_ALREADY_EXISTS = 6,
    ST_PERMISSION_DENIED = 7,
    ST_RESOURCE_EXHAUSTED = 8,
    ST_FAILED_PRECONDITION = 9,
    ST_ABORTED = 10,
    ST_OUT_OF_RANGE = 11,
    ST_UNIMPLEMENTED = 12,
    ST_INTERNAL = 13,
    ST_UNAVAILABLE = 14,
    ST_DATA_LOSS = 15,
    ST_UNAUTHENTICATED = 16,
} st_code;

/* The canonical upper-case gRPC name ("NOT_FOUND"); "UNKNOWN_CODE" for out-of-range values. */
const char *st_code_name(st_code code);

/* "This node does not own that row": the FAILED_PRECONDITION a node answers for a row no
 * writable local tablet of it holds (docs/cluster.md). Routers and replication shippers refresh
 * their tablet map and retry on it, so its text is a contract: nodes start the message with
 * ST_NOT_OWNER_PREFIX, and the others recognise it only through st_is_not_owner. */
#define ST_NOT_OWNER_PREFIX "strata-not-owner:"
bool st_is_not_owner(st_code code, const char *message);

/* The one parser of "host:port" addresses (flags, topology files, clients): host into host
 * (NUL-terminated; an IPv6 address in brackets, "[::1]:8086", loses them; a bare IPv6 address is
 * refused as ambiguous), port 0..65535 into *port (may be NULL; 0 means "any free port" where
 * the caller listens). False for anything else, or a host that does not fit in host_cap. */
bool st_addr_split(const char *addr, char *host, size_t host_cap, uint16_t *port);

/* "0.1.0 (<git describe>)": the version of this build, for --version (static string). */
const char *st_version(void);

/* Strict decimal: s is 1..20 digits only (no sign, space or suffix) and lo <= value <= hi. */
bool st_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

#define ST_ERR_MSG_MAX 512
/* A fixed buffer for a human-readable message; caller-owned, never allocates. */
typedef struct st_err {
    st_code code;
    char msg[ST_ERR_MSG_MAX];
} st_err;

/* Records code and a printf-style message in err (when err is not NULL) and returns code, so
 * error paths read `return st_err_set(err, ST_DATA_LOSS, "...", ...);`. */
st_code st_err_set(st_err *err, st_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes err->msg with context ("opening table 5: "); keeps the code. No-op for NULL. */
void st_err_prefix(st_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void st_err_clear(st_err *err);

/* ---- byte slices: never own ---- */
typedef struct st_slice {
    const uint8_t *data;
    size_t len;
} st_slice;

#define ST_SLICE_LIT(s) ((st_slice){(const uint8_t *)(s), sizeof(s) - 1})
static inline st_slice st_slice_make(const void *data, size_t len) {
    return (st_slice){(const uint8_t *)data, len};
}
st_slice st_slice_cstr(const char *s);
/* memcmp order, shorter prefix first. */
int st_slice_cmp(st_slice a, st_slice b);
bool st_slice_eq(st_slice a, st_slice b);
bool st_slice_has_prefix(st_slice s, st_slice prefix);

/* ---- growable owned buffer ---- */
typedef struct st_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} st_buf;

void st_buf_init(st_buf *b);
void st_buf_free(st_buf *b);
void st_buf_reset(st_buf *b); /* len = 0, keeps memory */
/* Each returns ST_RESOURCE_EXHAUSTED if memory runs out; the buffer is left unchanged then. */
st_code st_buf_reserve(st_buf *b, size_t extra);
st_code st_buf_append(st_buf *b, const void *data, size_t len);
st_code st_buf_append_byte(st_buf *b, uint8_t byte);
st_code st_buf_append_varint64(st_buf *b, uint64_t v);
st_code st_buf_append_fixed32(st_buf *b, uint32_t v); /* little endian */
st_code st_buf_append_fixed64(st_buf *b, uint64_t v); /* little endian */
static inline st_slice st_buf_slice(const st_buf *b) {
    return st_slice_make(b->data, b->len);
}

/* ---- arena: bump allocation freed in one go ---- */
typedef struct st_arena_block st_arena_block;
typedef struct st_arena {
    st_arena_block *head;
    uint8_t *ptr;
    size_t avail;
    size_t block_bytes;
    size_t total_bytes; /* bytes obtained from malloc, for memory accounting */
} st_arena;

void st_arena_init(st_arena *a, size_t block_bytes);
void st_arena_deinit(st_arena *a);
/* Frees every block but the current one if it is no larger than block_bytes, and rewinds that one:
 * the arena serves again without a malloc and holds at most one block. Invalidates what it gave. */
void st_arena_reset(st_arena *a);
/* 16-byte aligned; NULL when memory runs out. Valid until st_arena_deinit or st_arena_reset. */
void *st_arena_alloc(st_arena *a, size_t size);
void *st_arena_dup(st_arena *a, const void *data, size_t len);
/* Formatted text in a; NULL when memory runs out. */
char *st_arena_printf(st_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- logging: key=value text into one swappable sink ---- */
typedef enum st_log_level { ST_LOG_DEBUG = 0, ST_LOG_INFO, ST_LOG_WARN, ST_LOG_ERROR } st_log_level;
typedef void (*st_log_sink_fn)(st_log_level level, const char *module, const char *line, void *arg);
/* The sink is process-global by design (one log per process); NULL restores stderr. */
void st_log_set_sink(st_log_sink_fn sink, void *arg);
void st_log_set_level(st_log_level min_level);
void st_log(st_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A line a peer, a client or a full disk can make repeat passes once per ST_LOG_INTERVAL_US per
 * call site, saying how many were suppressed since the last. */
#define ST_LOG_INTERVAL_US ((int64_t)10 * 1000000)
typedef struct st_ratelimit {
    int64_t next_us;     /* st_mono_us before which lines are suppressed */
    uint64_t suppressed; /* since the last line */
} st_ratelimit;
/* True when a line may be logged now; *suppressed then receives the count. Any thread. */
bool st_ratelimit_pass(st_ratelimit *rl, uint64_t *suppressed);
/* st_log(level, module, fmt ...) through a rate limit of its own; fmt takes at least one
 * argument and gets " suppressed=N" appended. */
#define ST_LOG_LIMITED(level, module, fmt, ...)                                                    \
    do {                                                                                           \
        static st_ratelimit rl_;                                                                   \
        uint64_t sup_;                                                                             \
        if (st_ratelimit_pass(&rl_, &sup_))                                                        \
            st_log(level, module, fmt " suppressed=%llu", __VA_ARGS__, (unsigned long long)sup_);  \
    } while (0)

/* Stays on in release builds: crashing beats corrupting stored data. Never for bad input. */
#define ST_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            st_assert_fail(#cond, __FILE__, __LINE__);                                             \
    } while (0)
void st_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* ---- the heap (heap.c) ---- */

/* glibc's malloc tuned for buffers of a MiB or more that come and go: call once at start. */
void st_heap_tune(void);
/* When more than keep_bytes of the heap are free, returns their pages to the kernel (freed memory
 * otherwise stays resident). Returns the free bytes found (0 without glibc). Costs a walk of the
 * free lists: call it from a timer, not per request. */
size_t st_heap_release(size_t keep_bytes);

/* ---- clocks ---- */
int64_t st_wall_us(void); /* microseconds since the Unix epoch */
int64_t st_mono_us(void); /* monotonic microseconds, for durations and deadlines */

/* A clock the engine reads through, so tests can move time by hand. */
typedef struct st_clock {
    int64_t (*now_us)(struct st_clock *c);
    int64_t fake_now_us; /* used by st_clock_fake */
} st_clock;
st_clock *st_clock_system(void); /* shared, stateless */
void st_clock_fake_init(st_clock *c, int64_t start_us);
static inline int64_t st_clock_now(st_clock *c) {
    return c->now_us(c);
}

/* ---- checksums and hashes ---- */
uint32_t st_crc32c(uint32_t crc, const void *data, size_t len); /* pass 0 to start */
/* The CRC32C of A followed by B, from st_crc32c of each and the length of B. */
uint32_t st_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* Masked form stored on disk, so a CRC of data that contains CRCs stays strong (LevelDB). */
static inline uint32_t st_crc_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
static inline uint32_t st_crc_unmask(uint32_t m) {
    uint32_t rot = m - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}
uint64_t st_hash64(const void *data, size_t len, uint64_t seed);

/* ---- fixed-width and varint encodings ---- */
static inline void st_put_fixed32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t st_get_fixed32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void st_put_fixed64(uint8_t *p, uint64_t v) {
    st_put_fixed32(p, (uint32_t)v);
    st_put_fixed32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t st_get_fixed64(const uint8_t *p) {
    return (uint64_t)st_get_fixed32(p) | ((uint64_t)st_get_fixed32(p + 4) << 32);
}
static inline void st_put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}
static inline uint64_t st_get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}
#define ST_VARINT64_MAX 10
/* Writes v at p (room for ST_VARINT64_MAX bytes) and returns the bytes written. */
size_t st_put_varint64(uint8_t *p, uint64_t v);
/* Decodes from [*p, end); advances *p. False if truncated or overlong (bad input, not a crash). */
bool st_get_varint64(const uint8_t **p, const uint8_t *end, uint64_t *v);
/* A varint length followed by that many bytes; the slice points into the input. */
bool st_get_len_prefixed(const uint8_t **p, const uint8_t *end, st_slice *out);
size_t st_varint_len(uint64_t v);

/* ---- deterministic RNG (splitmix64 seeded xoshiro256**), for tests and skiplists ---- */
typedef struct st_rng {
    uint64_t s[4];
} st_rng;
void st_rng_seed(st_rng *r, uint64_t seed);
uint64_t st_rng_next(st_rng *r);
uint64_t st_rng_below(st_rng *r, uint64_t n); /* uniform in [0, n), n > 0 */

/* Seed for randomized tests: $STRATA_SEED if set, else time-based; printed to stderr so any
 * failure can be replayed. */
uint64_t st_test_seed(const char *test_name);

/* ---- per-thread caches ---- */
/* Runs fn(arg) when the calling thread exits (tlcache.c): how a per-thread cache (a _Thread_local
 * free list, a scratch buffer) is freed, all of a thread's through one pthread key. False when it
 * cannot be arranged (out of slots: ST_TL_DRAINS_MAX per thread); the caller then keeps nothing. */
#define ST_TL_DRAINS_MAX 16
bool st_tl_at_thread_exit(void (*fn)(void *), void *arg);

/* A per-thread cache: the first member of the cache's _Thread_local struct, drain set in its
 * initializer (drain frees what the cache keeps, leaving it empty). The type-specific rest of the
 * cache is what it keeps, how much, and how that is freed. */
typedef struct st_tl_cache {
    void (*drain)(struct st_tl_cache *c);
    bool registered; /* c->drain runs at this thread's exit */
} st_tl_cache;

/* True when the calling thread's cache c may keep something: c->drain then runs at its exit (the
 * first call arranges it, and again after a drain if the exiting thread still uses c). False
 * when that cannot be arranged: the caller frees instead of keeping. */
bool st_tl_cache_ready(st_tl_cache *c);

/* The common per-thread cache: up to max (<= ST_TL_STASH_MAX) objects kept for reuse, each
 * freed by free_fn when the thread exits. Declare it _Thread_local with ST_TL_STASH_INIT. */
#define ST_TL_STASH_MAX 8
typedef struct st_tl_stash {
    st_tl_cache tl;
    void (*free_fn)(void *p);
    unsigned max, n;
    void *v[ST_TL_STASH_MAX];
} st_tl_stash;
void st_tl_stash_drain(st_tl_cache *c);
#define ST_TL_STASH_INIT(max_, free_fn_)                                                           \
    { .tl.drain = st_tl_stash_drain, .free_fn = (free_fn_), .max = (max_) }
/* The object kept last, taken out of s; NULL when s keeps none. */
void *st_tl_stash_take(st_tl_stash *s);
/* Keeps p in s; false when s is full or cannot keep anything: the caller frees p. */
bool st_tl_stash_put(st_tl_stash *s, void *p);

#endif
