/* file.c — the auth file's text (parse, format), its reading and atomic writing, tokens and the
 * bearer header (strata/auth.h). */
#include "strata/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUTH_HEADER "strata-auth 1"
#define AUTH_HASH_PREFIX "sha256:"
#define AUTH_LINE_MAX 512
#define AUTH_WORDS_MAX 4

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* upper case is not written, so not read: one spelling per hash */
}

static bool hex_decode(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static void hex_encode(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Splits line (modified) into at most AUTH_WORDS_MAX words; the count, or -1 for more. */
static int split_words(char *line, char **w) {
    int n = 0;
    for (char *p = line;;) {
        while (*p == ' ' || *p == '\t')
            *p++ = '\0';
        if (!*p)
            return n;
        if (n == AUTH_WORDS_MAX)
            return -1;
        w[n++] = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
    }
}

/* One non-empty, non-comment line. */
static st_code parse_line(st_auth_db *db, char **w, int n, bool *seen_header, st_err *err) {
    if (!*seen_header) {
        if (n == 2 && !strcmp(w[0], "strata-auth") && !strcmp(w[1], "1")) {
            *seen_header = true;
            return ST_OK;
        }
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "the file must start with '" AUTH_HEADER "' (a file of another "
                          "version or not an auth file?)");
    }
    if (n == 3 && !strcmp(w[0], "principal")) {
        uint8_t hash[ST_AUTH_HASH_BYTES];
        size_t pl = strlen(AUTH_HASH_PREFIX);
        if (strncmp(w[2], AUTH_HASH_PREFIX, pl) || !hex_decode(w[2] + pl, hash, sizeof hash))
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "the token hash must be sha256: and 64 lower-case hex digits");
        return st_auth_principal_add(db, w[1], hash, err);
    }
    if ((n == 3 || n == 4) && !strcmp(w[0], "grant")) {
        st_role role = st_auth_role_parse(w[2]);
        if (role == ST_ROLE_NONE)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "unknown role '%.80s': use reader, writer or admin", w[2]);
        if (st_auth_principal_find(db, w[1]) == SIZE_MAX) {
            /* Deleting a principal's line by hand must revoke it even when its grant lines
             * stay: a file refused for them would keep the old principals in force. */
            db->n_orphan_grants++;
            return ST_OK;
        }
        return st_auth_grant_add(db, w[1], role, n == 4 ? w[3] : "", err);
    }
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "expected 'principal NAME sha256:HEX' or 'grant NAME ROLE [TABLE]'");
}

st_code st_auth_parse(st_slice text, st_auth_db *db, st_err *err) {
    st_auth_db_free(db);
    if (text.len > ST_AUTH_FILE_BYTES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "the auth file is larger than %d bytes",
                          ST_AUTH_FILE_BYTES_MAX);
    bool seen_header = false;
    size_t off = 0;
    st_code rc = ST_OK;
    for (int lineno = 1; off < text.len && rc == ST_OK; lineno++) {
        const uint8_t *nl = memchr(text.data + off, '\n', text.len - off);
        size_t len = (nl ? (size_t)(nl - text.data) : text.len) - off;
        char line[AUTH_LINE_MAX + 1];
        if (len > AUTH_LINE_MAX || memchr(text.data + off, '\0', len))
            rc = st_err_set(err, ST_INVALID_ARGUMENT, "line %d: longer than %d bytes or binary",
                            lineno, AUTH_LINE_MAX);
        if (rc != ST_OK)
            break;
        memcpy(line, text.data + off, len);
        line[len] = '\0';
        if (len && line[len - 1] == '\r')
            line[len - 1] = '\0';
        off += len + 1;
        const char *first = line + strspn(line, " \t");
        if (!*first || *first == '#')
            continue;
        char *w[AUTH_WORDS_MAX];
        int n = split_words(line, w);
        if (n < 0)
            rc = st_err_set(err, ST_INVALID_ARGUMENT, "too many words");
        else
            rc = parse_line(db, w, n, &seen_header, err);
        if (rc != ST_OK && err)
            st_err_prefix(err, "line %d: ", lineno);
    }
    if (rc == ST_OK && !seen_header)
        rc = st_err_set(err, ST_INVALID_ARGUMENT, "empty auth file: no '" AUTH_HEADER "' line");
    if (rc != ST_OK)
        st_auth_db_free(db);
    return rc;
}

static st_code put(st_buf *out, const char *s) {
    return st_buf_append(out, s, strlen(s));
}

st_code st_auth_format(const st_auth_db *db, st_buf *out) {
    st_code rc =
        put(out, "# Strata principals and roles (docs/formats/auth-file.md); written by "
                 "`strata auth`.\n# Tokens are kept as SHA-256 hashes only.\n" AUTH_HEADER "\n");
    for (size_t i = 0; i < db->n_principals && rc == ST_OK; i++) {
        char hex[2 * ST_AUTH_HASH_BYTES + 1];
        hex_encode(db->principals[i].hash, ST_AUTH_HASH_BYTES, hex);
        char line[ST_AUTH_NAME_MAX + sizeof hex + 32];
        snprintf(line, sizeof line, "principal %s " AUTH_HASH_PREFIX "%s\n", db->principals[i].name,
                 hex);
        rc = put(out, line);
    }
    for (size_t i = 0; i < db->n_grants && rc == ST_OK; i++) {
        const st_auth_grant *g = &db->grants[i];
        char line[ST_AUTH_NAME_MAX + ST_AUTH_TABLE_MAX + 32];
        snprintf(line, sizeof line, "grant %s %s%s%s\n", g->principal, st_auth_role_name(g->role),
                 g->table[0] ? " " : "", g->table);
        rc = put(out, line);
    }
    return rc;
}

st_code st_auth_load(const char *path, st_auth_db *db, st_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return st_err_set(err, errno == ENOENT ? ST_NOT_FOUND : ST_INTERNAL,
                          "cannot read the auth file %s: %s", path, strerror(errno));
    st_buf b;
    st_buf_init(&b);
    char chunk[8192];
    size_t n;
    st_code rc = ST_OK;
    while (rc == ST_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = b.len + n > ST_AUTH_FILE_BYTES_MAX
                 ? st_err_set(err, ST_INVALID_ARGUMENT, "the auth file %s is larger than %d bytes",
                              path, ST_AUTH_FILE_BYTES_MAX)
                 : st_buf_append(&b, chunk, n);
    if (rc == ST_OK && ferror(f))
        rc = st_err_set(err, ST_INTERNAL, "cannot read the auth file %s", path);
    fclose(f);
    if (rc == ST_OK && (rc = st_auth_parse(st_buf_slice(&b), db, err)) != ST_OK && err)
        st_err_prefix(err, "%s: ", path);
    st_buf_free(&b);
    return rc;
}

static st_code write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return ST_INTERNAL;
        p += w;
        n -= (size_t)w;
    }
    return ST_OK;
}

st_code st_auth_write_file(const char *path, st_slice data, st_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return st_err_set(err, ST_INVALID_ARGUMENT, "path too long: %.200s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return st_err_set(err, ST_INTERNAL, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = write_all(fd, data.data, data.len) == ST_OK && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return ST_OK;
    e = ok ? errno : e;
    unlink(tmp);
    return st_err_set(err, ST_INTERNAL, "cannot write %s: %s", path, strerror(e));
}

st_code st_auth_save(const char *path, const st_auth_db *db, st_err *err) {
    st_buf b;
    st_buf_init(&b);
    st_code rc = st_auth_format(db, &b);
    if (rc != ST_OK)
        st_err_set(err, rc, "out of memory");
    else
        rc = st_auth_write_file(path, st_buf_slice(&b), err);
    st_buf_free(&b);
    return rc;
}

/* ---- tokens ---- */

void st_auth_hash(st_slice token, uint8_t out[ST_AUTH_HASH_BYTES]) {
    SHA256(token.len ? token.data : (const uint8_t *)"", token.len, out);
}

st_code st_auth_token_new(char *out, size_t cap, uint8_t hash[ST_AUTH_HASH_BYTES], st_err *err) {
    uint8_t raw[32];
    if (cap <= ST_AUTH_TOKEN_LEN)
        return st_err_set(err, ST_INVALID_ARGUMENT, "token buffer too small");
    if (RAND_bytes(raw, sizeof raw) != 1)
        return st_err_set(err, ST_INTERNAL, "the system's random generator failed: no token made");
    memcpy(out, ST_AUTH_TOKEN_PREFIX, strlen(ST_AUTH_TOKEN_PREFIX));
    hex_encode(raw, sizeof raw, out + strlen(ST_AUTH_TOKEN_PREFIX));
    st_auth_hash(st_slice_make(out, ST_AUTH_TOKEN_LEN), hash);
    return ST_OK;
}

/* RFC 6750 b64token: ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/", then "=" padding. */
static bool token68_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~' || c == '+' || c == '/';
}

bool st_auth_bearer_parse(const char *header, st_slice *token) {
    if (!header || strncasecmp(header, "bearer", 6) || (header[6] != ' ' && header[6] != '\t'))
        return false;
    const char *p = header + 6;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = 0;
    while (token68_char(p[n]))
        n++;
    size_t end = n;
    while (p[end] == '=')
        end++;
    size_t tail = end;
    while (p[tail] == ' ' || p[tail] == '\t')
        tail++;
    if (n == 0 || p[tail] != '\0' || end > ST_AUTH_TOKEN_BYTES_MAX)
        return false;
    *token = st_slice_make(p, end);
    return true;
}
