/* node/re2_shim.h — the C face of RE2, the only C++ in Strata.
 *
 * Bigtable regex filters use RE2 in raw byte mode (Latin-1): every byte of the pattern and of the
 * subject is one character, `.` does not match '\n', `\C` matches any byte, matching is case
 * sensitive and must cover the WHOLE subject (RE2::FullMatch). A compiled pattern is immutable and
 * safe to match from several threads at once.
 *
 * Memory: each pattern may use at most NODE_RE2_MEM_BYTES_MAX for its compiled program and DFA
 * caches, so a hostile pattern (a{1000}{1000}, huge character classes) fails to compile instead of
 * eating memory; matching stays linear in the subject length whatever the pattern. */
#ifndef STRATA_NODE_RE2_SHIM_H
#define STRATA_NODE_RE2_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NODE_RE2_MEM_BYTES_MAX (8 << 20)

typedef struct node_re2 node_re2;

typedef enum node_re2_status {
    NODE_RE2_OK = 0,
    NODE_RE2_INVALID = 1, /* the pattern does not parse or is too large; errbuf says why */
    NODE_RE2_NOMEM = 2,   /* the process ran out of memory while compiling */
} node_re2_status;

/* Compiles pattern[0..len) with the Bigtable options above. On success stores a new pattern in
 * *out (free it with node_re2_free). On failure *out is NULL and errbuf (when errbuf_len > 0)
 * receives RE2's message, NUL-terminated and truncated to fit. Never throws. */
node_re2_status node_re2_compile(const uint8_t *pattern, size_t len, node_re2 **out, char *errbuf,
                                 size_t errbuf_len);

/* True when the whole of data[0..len) matches. */
bool node_re2_full_match(const node_re2 *re, const uint8_t *data, size_t len);

/* NULL is fine. */
void node_re2_free(node_re2 *re);

#ifdef __cplusplus
}
#endif

#endif
