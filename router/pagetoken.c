/* pagetoken.c — page tokens of the router's listings (ListBackups, ListOperations): a prefix
 * naming the listing and its version, 8 hex digits of a CRC32C of the listing's query (a token
 * only continues the listing it came from), then the hex of where the page ended. The next page
 * starts after that place, so entries made or deleted between pages do not shift the pages. */
#include "router_internal.h"

#include <stdio.h>
#include <string.h>

#define TOKEN_PREFIX_MAX 15

char *rtr_page_token_make(st_arena *a, const char *prefix, uint32_t crc, st_slice last) {
    size_t pre = strlen(prefix) + 8;
    char *tok = st_arena_alloc(a, pre + 2 * last.len + 1);
    if (!tok)
        return NULL;
    snprintf(tok, pre + 1, "%s%08x", prefix, (unsigned)crc);
    for (size_t i = 0; i < last.len; i++)
        snprintf(tok + pre + 2 * i, 3, "%02x", ((const uint8_t *)last.data)[i]);
    return tok;
}

static int hex_val(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

rtr_token_rc rtr_page_token_parse(st_arena *a, const char *tok, const char *prefix, uint32_t crc,
                                  st_slice *last) {
    size_t len = strlen(tok), plen = strlen(prefix), pre = plen + 8;
    ST_ASSERT(plen <= TOKEN_PREFIX_MAX);
    if (len <= pre || (len - pre) % 2 != 0 || strncmp(tok, prefix, plen) != 0)
        return RTR_TOKEN_BAD;
    char want[TOKEN_PREFIX_MAX + 9];
    snprintf(want, sizeof want, "%s%08x", prefix, (unsigned)crc);
    if (strncmp(tok, want, pre) != 0)
        return RTR_TOKEN_OTHER;
    size_t n = (len - pre) / 2;
    uint8_t *b = st_arena_alloc(a, n + 1);
    if (!b)
        return RTR_TOKEN_NOMEM;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_val(tok[pre + 2 * i]), lo = hex_val(tok[pre + 2 * i + 1]);
        if (hi < 0 || lo < 0)
            return RTR_TOKEN_BAD;
        b[i] = (uint8_t)(hi << 4 | lo);
    }
    b[n] = 0; /* a name decodes to a C string */
    *last = st_slice_make(b, n);
    return RTR_TOKEN_OK;
}

st_code rtr_page_token_after(st_arena *a, const char *tok, const char *prefix, uint32_t crc,
                             const char **after, st_err *err) {
    if (!tok || !tok[0])
        return ST_OK;
    st_slice last;
    rtr_token_rc trc = rtr_page_token_parse(a, tok, prefix, crc, &last);
    if (trc == RTR_TOKEN_NOMEM)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    if (trc != RTR_TOKEN_OK)
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "invalid page_token: pass the next_page_token of the previous page, "
                          "with the same parent, unchanged");
    *after = (const char *)last.data;
    return ST_OK;
}
