/* fuzz_auth: the auth file parser and the bearer header parser (proto/auth), which strata-router
 * runs on a file an operator or `strata auth` writes and on the `authorization` header of every
 * call from the network. The input is the file's text; its first line (up to a newline or 4096
 * bytes) is also fed to the header parser.
 * Properties: no crash, leak or read outside the input; an error always comes with a message;
 * a file that parses, written back with st_auth_format, parses again into the same principals
 * and grants, and every principal is found by its hash; a bearer token that parses lies inside
 * the header, is non-empty, at most ST_AUTH_TOKEN_BYTES_MAX bytes, and made of token68
 * characters. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static void fuzz_same(const st_auth_db *a, const st_auth_db *b) {
    FUZZ_CHECK(a->n_principals == b->n_principals && a->n_grants == b->n_grants);
    for (size_t i = 0; i < a->n_principals; i++) {
        FUZZ_CHECK(!strcmp(a->principals[i].name, b->principals[i].name));
        FUZZ_CHECK(!memcmp(a->principals[i].hash, b->principals[i].hash, ST_AUTH_HASH_BYTES));
        FUZZ_CHECK(st_auth_find_hash(b, a->principals[i].hash) == &b->principals[i]);
    }
    for (size_t i = 0; i < a->n_grants; i++) {
        FUZZ_CHECK(!strcmp(a->grants[i].principal, b->grants[i].principal));
        FUZZ_CHECK(!strcmp(a->grants[i].table, b->grants[i].table));
        FUZZ_CHECK(a->grants[i].role == b->grants[i].role);
    }
}

static void fuzz_file(const uint8_t *data, size_t size) {
    st_auth_db db, again;
    st_auth_db_init(&db);
    st_auth_db_init(&again);
    st_err err = {0};
    if (st_auth_parse(st_slice_make(data, size), &db, &err) != ST_OK) {
        FUZZ_CHECK(err.msg[0] != '\0' && db.n_principals == 0 && db.n_grants == 0);
        return;
    }
    st_buf text;
    st_buf_init(&text);
    FUZZ_CHECK(st_auth_format(&db, &text) == ST_OK);
    FUZZ_CHECK(st_auth_parse(st_buf_slice(&text), &again, &err) == ST_OK);
    fuzz_same(&db, &again);
    st_buf_free(&text);
    st_auth_db_free(&db);
    st_auth_db_free(&again);
}

static void fuzz_bearer(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t n = nl ? (size_t)(nl - data) : size;
    n = n > 4096 ? 4096 : n;
    char *h = malloc(n + 1);
    if (!h)
        return;
    memcpy(h, data, n);
    h[n] = '\0';
    st_slice tok;
    if (st_auth_bearer_parse(h, &tok)) {
        const char *t = (const char *)tok.data;
        FUZZ_CHECK(t >= h && t + tok.len <= h + strlen(h));
        FUZZ_CHECK(tok.len > 0 && tok.len <= ST_AUTH_TOKEN_BYTES_MAX);
        for (size_t i = 0; i < tok.len; i++)
            FUZZ_CHECK(strchr("-._~+/=", t[i]) || (t[i] >= '0' && t[i] <= '9') ||
                       (t[i] >= 'a' && t[i] <= 'z') || (t[i] >= 'A' && t[i] <= 'Z'));
    }
    free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file(data, size);
    fuzz_bearer(data, size);
    return 0;
}
