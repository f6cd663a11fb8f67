/* ops/backup_dir.c — the export directory of `strata backup export/import/verify`
 * (docs/formats/backup-export.md): the MANIFEST's text, files written under temporary names and
 * renamed once durable, and the checks of every file against the manifest.
 *
 * The manifest is the only file that says an export is complete: it is written last, after every
 * file it names was fsync'd under its final name, and its own last line carries the CRC32C and
 * SHA-256 of everything before it. A crash at any point leaves either no MANIFEST (verify says
 * the export did not finish) or a complete export. */
#define _DEFAULT_SOURCE /* fsync, O_NOFOLLOW, O_DIRECTORY */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backup_dir.h"

#define BK_IO_BYTES (1u << 20)
#define BK_LINE_TOKENS_MAX 8

/* ---- the manifest in memory ---- */

void ops_bk_manifest_init(ops_bk_manifest *m) {
    memset(m, 0, sizeof *m);
    m->version = OPS_BK_VERSION;
    st_buf_init(&m->schema);
}

void ops_bk_manifest_deinit(ops_bk_manifest *m) {
    for (size_t i = 0; i < m->n_pieces; i++) {
        st_buf_free(&m->pieces[i].start_key);
        st_buf_free(&m->pieces[i].end_key);
        free(m->pieces[i].files);
    }
    free(m->pieces);
    st_buf_free(&m->schema);
    memset(m, 0, sizeof *m);
}

ops_bk_piece *ops_bk_manifest_add_piece(ops_bk_manifest *m, const char *id, st_slice start,
                                        st_slice end, int64_t frozen_us) {
    if (m->n_pieces == m->cap_pieces) {
        size_t cap = m->cap_pieces ? m->cap_pieces * 2 : 4;
        ops_bk_piece *np = realloc(m->pieces, cap * sizeof *np);
        if (!np)
            return NULL;
        m->pieces = np;
        m->cap_pieces = cap;
    }
    ops_bk_piece *p = &m->pieces[m->n_pieces];
    memset(p, 0, sizeof *p);
    st_buf_init(&p->start_key);
    st_buf_init(&p->end_key);
    snprintf(p->id, sizeof p->id, "%s", id);
    p->frozen_us = frozen_us;
    m->n_pieces++; /* counted first, so deinit frees the keys even if an append fails */
    if (st_buf_append(&p->start_key, start.data, start.len) != ST_OK ||
        st_buf_append(&p->end_key, end.data, end.len) != ST_OK)
        return NULL;
    return p;
}

ops_bk_file *ops_bk_piece_add_file(ops_bk_piece *p, const ops_bk_file *f) {
    if (p->n_files == p->cap_files) {
        size_t cap = p->cap_files ? p->cap_files * 2 : 4;
        ops_bk_file *nf = realloc(p->files, cap * sizeof *nf);
        if (!nf)
            return NULL;
        p->files = nf;
        p->cap_files = cap;
    }
    p->files[p->n_files] = *f;
    return &p->files[p->n_files++];
}

uint64_t ops_bk_manifest_bytes(const ops_bk_manifest *m) {
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_pieces; i++)
        for (size_t j = 0; j < m->pieces[i].n_files; j++)
            n += m->pieces[i].files[j].size;
    return n;
}

uint64_t ops_bk_manifest_stored_bytes(const ops_bk_manifest *m) {
    if (m->version < 3)
        return ops_bk_manifest_bytes(m);
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_pieces; i++)
        for (size_t j = 0; j < m->pieces[i].n_files; j++)
            if (!strcmp(m->pieces[i].files[j].at, m->pieces[i].id))
                n += m->pieces[i].files[j].size;
    return n;
}

size_t ops_bk_manifest_files(const ops_bk_manifest *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_pieces; i++)
        n += m->pieces[i].n_files;
    return n;
}

/* ---- names ---- */

static bool name_chars(const char *s, size_t max, const char *extra) {
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || (c && strchr(extra, c));
        if (!ok)
            return false;
    }
    return true;
}

bool ops_bk_piece_id_ok(const char *s) {
    return name_chars(s, OPS_BK_PIECE_ID_MAX, "");
}

bool ops_bk_file_name_ok(const char *s) {
    size_t n = strlen(s), t = strlen(OPS_BK_TMP_SUFFIX);
    /* not ".", "..", hidden, nor a temporary name of the writer */
    return s[0] != '.' && name_chars(s, OPS_BK_FILE_NAME_MAX, ".") &&
           !(n >= t && !strcmp(s + n - t, OPS_BK_TMP_SUFFIX));
}

bool ops_bk_resource_name_ok(const char *s) {
    return name_chars(s, OPS_BK_NAME_MAX, "/.~%");
}

/* ---- hex ---- */

void ops_bk_hex(const uint8_t *data, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[data[i] >> 4];
        out[2 * i + 1] = digits[data[i] & 15];
    }
    out[2 * len] = '\0';
}

static int hex_val(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Lower-case hex of exactly the token into out ("-" = empty). */
static bool unhex(st_slice t, size_t max, st_buf *out) {
    st_buf_reset(out);
    if (t.len == 1 && t.data[0] == '-')
        return true;
    if (t.len % 2 || t.len / 2 > max || st_buf_reserve(out, t.len / 2 + 1) != ST_OK)
        return false;
    for (size_t i = 0; i < t.len; i += 2) {
        int hi = hex_val((char)t.data[i]), lo = hex_val((char)t.data[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out->data[out->len++] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool unhex_fixed(st_slice t, uint8_t *out, size_t n) {
    if (t.len != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_val((char)t.data[2 * i]), lo = hex_val((char)t.data[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* ---- formatting ---- */

static st_code buf_printf(st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static st_code buf_printf(st_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || st_buf_reserve(b, (size_t)n + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return ST_OK;
}

static st_code buf_hex(st_buf *b, st_slice s) {
    if (s.len == 0)
        return st_buf_append_byte(b, '-');
    if (st_buf_reserve(b, 2 * s.len + 1) != ST_OK)
        return ST_RESOURCE_EXHAUSTED;
    ops_bk_hex(s.data, s.len, (char *)b->data + b->len);
    b->len += 2 * s.len;
    return ST_OK;
}

static void sha256(const void *data, size_t len, uint8_t out[OPS_BK_SHA256_BYTES]) {
    unsigned n = 0;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

static st_code format_header(const ops_bk_manifest *m, st_buf *b) {
    st_code rc = buf_printf(b,
                            "%s %d\n# A Strata backup export: docs/formats/backup-export.md. "
                            "Check it with `strata backup verify DIR`.\n"
                            "backup %s\nsource_table %s\nbackup_type %d\n"
                            "start_us %lld\nend_us %lld\nexpire_us %lld\n",
                            OPS_BK_MAGIC, m->version, m->backup, m->source_table, m->backup_type,
                            (long long)m->start_us, (long long)m->end_us, (long long)m->expire_us);
    if (rc == ST_OK && m->hot_us > 0) /* optional: only a HOT backup's, so older readers of */
        rc = buf_printf(b, "hot_to_standard_us %lld\n", (long long)m->hot_us); /* the rest */
    if (rc == ST_OK)
        rc = buf_printf(b, "schema ");
    if (rc == ST_OK)
        rc = buf_hex(b, st_buf_slice(&m->schema));
    return rc == ST_OK ? st_buf_append_byte(b, '\n') : rc;
}

static st_code format_piece(int version, const ops_bk_piece *p, st_buf *b) {
    st_code rc = buf_printf(b, "piece %s ", p->id);
    if (rc == ST_OK)
        rc = buf_hex(b, st_buf_slice(&p->start_key));
    if (rc == ST_OK)
        rc = st_buf_append_byte(b, ' ');
    if (rc == ST_OK)
        rc = buf_hex(b, st_buf_slice(&p->end_key));
    if (rc == ST_OK)
        rc = buf_printf(b, " %lld\n", (long long)p->frozen_us);
    for (size_t j = 0; rc == ST_OK && j < p->n_files; j++) {
        const ops_bk_file *f = &p->files[j];
        char sha[2 * OPS_BK_SHA256_BYTES + 1];
        ops_bk_hex(f->sha256, OPS_BK_SHA256_BYTES, sha);
        rc = buf_printf(b, "file %s %llu %08x %s\n", f->name, (unsigned long long)f->size,
                        f->crc32c, version >= 3 ? f->at : sha);
    }
    return rc;
}

st_code ops_bk_manifest_format(const ops_bk_manifest *m, st_buf *out, st_err *err) {
    st_buf_reset(out);
    if (m->version < OPS_BK_VERSION_MIN || m->version > OPS_BK_VERSION)
        return st_err_set(err, ST_INVALID_ARGUMENT, "export format %d is not one of %d..%d",
                          m->version, OPS_BK_VERSION_MIN, OPS_BK_VERSION);
    if (!ops_bk_resource_name_ok(m->backup) || !ops_bk_resource_name_ok(m->source_table))
        return st_err_set(err, ST_INVALID_ARGUMENT,
                          "backup '%s' or table '%s' has characters an export cannot hold",
                          m->backup, m->source_table);
    st_code rc = format_header(m, out);
    for (size_t i = 0; rc == ST_OK && i < m->n_pieces; i++) {
        const ops_bk_piece *p = &m->pieces[i];
        if (!ops_bk_piece_id_ok(p->id))
            return st_err_set(err, ST_INVALID_ARGUMENT, "piece id '%s' is not [A-Za-z0-9_-]",
                              p->id);
        for (size_t j = 0; j < p->n_files; j++)
            if (!ops_bk_file_name_ok(p->files[j].name) ||
                (m->version >= 3 && !ops_bk_piece_id_ok(p->files[j].at)))
                return st_err_set(err, ST_INVALID_ARGUMENT,
                                  "file name '%s' of piece %s (in '%s') is not [A-Za-z0-9_.-]",
                                  p->files[j].name, p->id, p->files[j].at);
        rc = format_piece(m->version, p, out);
    }
    if (rc != ST_OK)
        return st_err_set(err, rc, "out of memory formatting the manifest");
    uint8_t sha[OPS_BK_SHA256_BYTES];
    char shahex[2 * OPS_BK_SHA256_BYTES + 1];
    sha256(out->data, out->len, sha);
    ops_bk_hex(sha, sizeof sha, shahex);
    uint32_t crc = st_crc32c(0, out->data, out->len);
    if (buf_printf(out, "end %08x %s\n", crc, shahex) != ST_OK)
        return st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory formatting the manifest");
    return ST_OK;
}

/* ---- parsing ---- */

typedef struct bk_line {
    st_slice tok[BK_LINE_TOKENS_MAX];
    size_t n;
    size_t lineno;
} bk_line;

/* Splits one line on single spaces; false for empty tokens, control bytes or too many. */
static bool split_line(st_slice line, bk_line *l) {
    l->n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= line.len; i++) {
        if (i < line.len && (line.data[i] < 0x20 || line.data[i] >= 0x7f))
            return false;
        if (i < line.len && line.data[i] != ' ')
            continue;
        if (i == start || l->n == BK_LINE_TOKENS_MAX)
            return false;
        l->tok[l->n++] = st_slice_make(line.data + start, i - start);
        start = i + 1;
    }
    return true;
}

static bool tok_is(st_slice t, const char *s) {
    return t.len == strlen(s) && !memcmp(t.data, s, t.len);
}

/* A token into a NUL-terminated string of at most max bytes. */
static bool tok_str(st_slice t, char *out, size_t max) {
    if (t.len > max)
        return false;
    memcpy(out, t.data, t.len);
    out[t.len] = '\0';
    return true;
}

static bool tok_u64(st_slice t, uint64_t max, uint64_t *out) {
    if (t.len == 0 || t.len > 20 || (t.len > 1 && t.data[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < t.len; i++) {
        if (t.data[i] < '0' || t.data[i] > '9')
            return false;
        uint64_t d = (uint64_t)(t.data[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return v <= max;
}

static bool tok_i64(st_slice t, int64_t *out) {
    uint64_t v;
    if (!tok_u64(t, INT64_MAX, &v))
        return false;
    *out = (int64_t)v;
    return true;
}

typedef struct bk_parse {
    const char *what;
    ops_bk_manifest *m;
    st_err *err;
    unsigned seen; /* header keys seen, one bit each */
    size_t files;
    /* The last piece's file names, a hash set of indexes + 1 into its files (open addressing,
     * n_slots a power of two): comparing each new name with every earlier one of the piece was
     * quadratic in a piece's files. names_of: that piece's index + 1. */
    size_t *slots, n_slots, names_of;
} bk_parse;

static st_code bad(bk_parse *ps, const bk_line *l, const char *why) {
    return st_err_set(ps->err, ST_INVALID_ARGUMENT,
                      "%s line %zu: %s (not a Strata backup export, or damaged: export it again)",
                      ps->what, l->lineno, why);
}

enum {
    BK_H_BACKUP = 1,
    BK_H_TABLE = 2,
    BK_H_TYPE = 4,
    BK_H_START = 8,
    BK_H_END = 16,
    BK_H_EXPIRE = 32,
    BK_H_SCHEMA = 64,
    BK_H_ALL = 127, /* the required keys */
    BK_H_HOT = 128  /* optional */
};

static st_code parse_header(bk_parse *ps, const bk_line *l) {
    ops_bk_manifest *m = ps->m;
    static const char *keys[] = {"backup", "source_table", "backup_type", "start_us",
                                 "end_us", "expire_us",    "schema",      "hot_to_standard_us"};
    unsigned bit = 0;
    for (unsigned i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (tok_is(l->tok[0], keys[i]))
            bit = 1u << i;
    if (!bit)
        return bad(ps, l, "unknown keyword");
    if (ps->seen & bit)
        return bad(ps, l, "keyword repeated");
    if (l->n != 2)
        return bad(ps, l, "wants exactly one value");
    ps->seen |= bit;
    uint64_t type;
    bool ok = bit == BK_H_BACKUP ? tok_str(l->tok[1], m->backup, OPS_BK_NAME_MAX) &&
                                       ops_bk_resource_name_ok(m->backup)
              : bit == BK_H_TABLE ? tok_str(l->tok[1], m->source_table, OPS_BK_NAME_MAX) &&
                                        ops_bk_resource_name_ok(m->source_table)
              : bit == BK_H_TYPE   ? tok_u64(l->tok[1], 2, &type) && (m->backup_type = (int)type, 1)
              : bit == BK_H_START  ? tok_i64(l->tok[1], &m->start_us)
              : bit == BK_H_END    ? tok_i64(l->tok[1], &m->end_us)
              : bit == BK_H_EXPIRE ? tok_i64(l->tok[1], &m->expire_us)
              : bit == BK_H_HOT    ? tok_i64(l->tok[1], &m->hot_us)
                                   : unhex(l->tok[1], OPS_BK_SCHEMA_BYTES_MAX, &m->schema);
    char why[64];
    snprintf(why, sizeof why, "bad value of field %s", keys[__builtin_ctz(bit)]);
    return ok ? ST_OK : bad(ps, l, why);
}

/* The piece's range holds at least one key (an empty end is unbounded). Whether the pieces
 * together cover the key space once is checked after they are sorted (sort_pieces). */
static bool piece_range_ok(const ops_bk_piece *p) {
    return !p->end_key.len ||
           st_slice_cmp(st_buf_slice(&p->start_key), st_buf_slice(&p->end_key)) < 0;
}

static st_code parse_piece(bk_parse *ps, const bk_line *l) {
    char id[OPS_BK_PIECE_ID_MAX + 1];
    int64_t frozen;
    if (l->n != 5 || !tok_str(l->tok[1], id, OPS_BK_PIECE_ID_MAX) || !ops_bk_piece_id_ok(id) ||
        !tok_i64(l->tok[4], &frozen))
        return bad(ps, l, "want: piece ID START_HEX END_HEX FROZEN_US, ID [A-Za-z0-9_-]{1,64}");
    if (ps->m->n_pieces >= OPS_BK_PIECES_MAX)
        return bad(ps, l, "too many pieces");
    ops_bk_piece *p = ops_bk_manifest_add_piece(ps->m, id, st_slice_make(NULL, 0),
                                                st_slice_make(NULL, 0), frozen);
    if (!p)
        return st_err_set(ps->err, ST_RESOURCE_EXHAUSTED, "%s: out of memory", ps->what);
    if (!unhex(l->tok[2], OPS_BK_KEY_BYTES_MAX, &p->start_key) ||
        !unhex(l->tok[3], OPS_BK_KEY_BYTES_MAX, &p->end_key))
        return bad(ps, l, "bad key (lower-case hex, or - for none)");
    if (!piece_range_ok(p))
        return bad(ps, l, "piece range empty (its end is not after its start)");
    return ST_OK;
}

/* The last token of a file line: the SHA-256 (versions 1 and 2) or the holding piece (3). */
static bool parse_file_where(bk_parse *ps, st_slice t, ops_bk_file *f) {
    if (ps->m->version < 3)
        return unhex_fixed(t, f->sha256, OPS_BK_SHA256_BYTES);
    return tok_str(t, f->at, OPS_BK_PIECE_ID_MAX) && ops_bk_piece_id_ok(f->at);
}

static size_t name_slot(const bk_parse *ps, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return (size_t)h & (ps->n_slots - 1);
}

static void name_put(bk_parse *ps, const ops_bk_piece *p, size_t i) {
    size_t h = name_slot(ps, p->files[i].name);
    while (ps->slots[h])
        h = (h + 1) & (ps->n_slots - 1);
    ps->slots[h] = i + 1;
}

/* Whether the last piece p lists a file named name already. The set is rebuilt for a new piece
 * and when it would be over half full; false with *oom set when memory ran out. */
static bool name_seen(bk_parse *ps, const ops_bk_piece *p, const char *name, bool *oom) {
    size_t want = 16;
    while (want < 2 * (p->n_files + 1))
        want *= 2;
    if (ps->names_of != ps->m->n_pieces || ps->n_slots < want) {
        size_t *v = calloc(want, sizeof *v);
        if (!v) {
            *oom = true;
            return false;
        }
        free(ps->slots);
        ps->slots = v;
        ps->n_slots = want;
        ps->names_of = ps->m->n_pieces;
        for (size_t i = 0; i < p->n_files; i++)
            name_put(ps, p, i);
    }
    for (size_t h = name_slot(ps, name); ps->slots[h]; h = (h + 1) & (ps->n_slots - 1))
        if (!strcmp(p->files[ps->slots[h] - 1].name, name))
            return true;
    return false;
}

static st_code parse_file(bk_parse *ps, const bk_line *l) {
    ops_bk_file f;
    memset(&f, 0, sizeof f);
    uint8_t crc[4];
    if (ps->m->n_pieces == 0)
        return bad(ps, l, "file before any piece");
    if (l->n != 5 || !tok_str(l->tok[1], f.name, OPS_BK_FILE_NAME_MAX) ||
        !ops_bk_file_name_ok(f.name) || !tok_u64(l->tok[2], INT64_MAX, &f.size) ||
        !unhex_fixed(l->tok[3], crc, 4) || !parse_file_where(ps, l->tok[4], &f))
        return bad(ps, l,
                   ps->m->version < 3 ? "want: file NAME SIZE CRC32C_HEX8 SHA256_HEX64, NAME "
                                        "[A-Za-z0-9_.-] not starting with '.'"
                                      : "want: file NAME SIZE CRC32C_HEX8 PIECE, NAME "
                                        "[A-Za-z0-9_.-] not starting with '.'");
    f.crc32c = (uint32_t)crc[0] << 24 | (uint32_t)crc[1] << 16 | (uint32_t)crc[2] << 8 | crc[3];
    ops_bk_piece *p = &ps->m->pieces[ps->m->n_pieces - 1];
    bool oom = false;
    if (name_seen(ps, p, f.name, &oom))
        return bad(ps, l, "file repeated in its piece");
    if (oom)
        return st_err_set(ps->err, ST_RESOURCE_EXHAUSTED, "%s: out of memory", ps->what);
    if (++ps->files > OPS_BK_FILES_MAX)
        return bad(ps, l, "too many files");
    if (!ops_bk_piece_add_file(p, &f))
        return st_err_set(ps->err, ST_RESOURCE_EXHAUSTED, "%s: out of memory", ps->what);
    name_put(ps, p, p->n_files - 1); /* room: the set is at most half full before this one */
    return ST_OK;
}

static st_code parse_line(bk_parse *ps, const bk_line *l) {
    if (tok_is(l->tok[0], "piece") || tok_is(l->tok[0], "file")) {
        if ((ps->seen & BK_H_ALL) != BK_H_ALL)
            return bad(ps, l, "piece or file before the header is complete");
        return tok_is(l->tok[0], "piece") ? parse_piece(ps, l) : parse_file(ps, l);
    }
    if (ps->m->n_pieces)
        return bad(ps, l, "header keyword after the first piece");
    return parse_header(ps, l);
}

/* The last line "end CRC SHA" must cover exactly the bytes before it. */
static st_code check_end(bk_parse *ps, const char *text, size_t len, size_t *body) {
    bk_line l = {.lineno = 0};
    if (len == 0 || text[len - 1] != '\n')
        return st_err_set(ps->err, ST_INVALID_ARGUMENT,
                          "%s: does not end with a newline (truncated: export it again)", ps->what);
    size_t start = len - 1;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    for (size_t i = 0; i < start; i++)
        l.lineno += text[i] == '\n';
    l.lineno++;
    uint8_t crc[4], sha[OPS_BK_SHA256_BYTES], want[OPS_BK_SHA256_BYTES];
    if (!split_line(st_slice_make(text + start, len - 1 - start), &l) || l.n != 3 ||
        !tok_is(l.tok[0], "end") || !unhex_fixed(l.tok[1], crc, 4) ||
        !unhex_fixed(l.tok[2], sha, sizeof sha))
        return bad(ps, &l, "the last line is not `end CRC32C SHA256` (truncated?)");
    uint32_t c = (uint32_t)crc[0] << 24 | (uint32_t)crc[1] << 16 | (uint32_t)crc[2] << 8 | crc[3];
    sha256(text, start, want);
    if (c != st_crc32c(0, text, start) || memcmp(sha, want, sizeof sha))
        return st_err_set(ps->err, ST_DATA_LOSS,
                          "%s: checksum mismatch (the manifest was changed or damaged: export "
                          "again from the backup)",
                          ps->what);
    *body = start;
    return ST_OK;
}

static st_code parse_body(bk_parse *ps, const char *text, size_t len) {
    size_t pos = 0, lineno = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        bk_line l = {.lineno = ++lineno};
        st_slice line = st_slice_make(text + pos, end - pos);
        pos = end + 1;
        if (lineno == 1) {
            char want[64];
            for (int v = OPS_BK_VERSION_MIN; v <= OPS_BK_VERSION && !ps->m->version; v++) {
                snprintf(want, sizeof want, "%s %d", OPS_BK_MAGIC, v);
                ps->m->version = tok_is(line, want) ? v : 0;
            }
            if (!ps->m->version)
                return bad(ps, &l,
                           "first line is not `" OPS_BK_MAGIC " N` with N 1, 2 or 3 (a newer "
                           "strata wrote it? use that one)");
            continue;
        }
        if (line.len && line.data[0] == '#')
            continue;
        if (!split_line(line, &l))
            return bad(ps, &l, "empty token, control byte or too many tokens");
        st_code rc = parse_line(ps, &l);
        if (rc != ST_OK)
            return rc;
    }
    if (lineno == 0 || (ps->seen & BK_H_ALL) != BK_H_ALL)
        return st_err_set(ps->err, ST_INVALID_ARGUMENT,
                          "%s: header incomplete (backup, source_table, backup_type, start_us, "
                          "end_us, expire_us, schema): export it again",
                          ps->what);
    return ST_OK;
}

typedef struct bk_pid {
    const char *id;
    size_t at; /* the piece's position in the manifest */
} bk_pid;

static int pid_cmp(const void *a, const void *b) {
    return strcmp(((const bk_pid *)a)->id, ((const bk_pid *)b)->id);
}

/* Version 3: the piece f->at names is piece i itself, or an earlier piece listing f's name with
 * f's size and CRC32C and holding it itself, so that every files/<at>.<name> has one size and
 * CRC32C. The holder is found in ids, sorted by id: a search from piece i backwards cost a
 * scan of every earlier piece when the holder was far, minutes for 100,000 pieces. */
static bool file_at_ok(const ops_bk_manifest *m, const bk_pid *ids, size_t i,
                       const ops_bk_file *f) {
    if (!strcmp(f->at, m->pieces[i].id))
        return true;
    bk_pid key = {f->at, 0};
    const bk_pid *h = bsearch(&key, ids, m->n_pieces, sizeof *ids, pid_cmp);
    if (!h || h->at >= i)
        return false;
    const ops_bk_piece *q = &m->pieces[h->at];
    for (size_t j = 0; j < q->n_files; j++)
        if (!strcmp(q->files[j].name, f->name))
            return q->files[j].size == f->size && q->files[j].crc32c == f->crc32c &&
                   !strcmp(q->files[j].at, q->id);
    return false;
}

static st_code files_at_ok(bk_parse *ps, const bk_pid *ids) {
    const ops_bk_manifest *m = ps->m;
    for (size_t i = 0; i < m->n_pieces; i++)
        for (size_t j = 0; j < m->pieces[i].n_files; j++)
            if (!file_at_ok(m, ids, i, &m->pieces[i].files[j]))
                return st_err_set(ps->err, ST_INVALID_ARGUMENT,
                                  "%s: piece %s, file %s: the file's PIECE %s is neither its own "
                                  "piece nor an earlier one holding a file of that name, size "
                                  "and CRC32C (not a Strata backup export, or damaged: export it "
                                  "again)",
                                  ps->what, m->pieces[i].id, m->pieces[i].files[j].name,
                                  m->pieces[i].files[j].at);
    return ST_OK;
}

/* No piece id twice, and (version 3) every file's holder, checked on a sorted copy of the ids
 * once every piece is read: comparing each new piece with every earlier one took minutes for
 * the 100,000 pieces a manifest may hold. */
static st_code piece_ids_ok(bk_parse *ps) {
    const ops_bk_manifest *m = ps->m;
    if (m->n_pieces == 0)
        return ST_OK;
    bk_pid *ids = malloc(m->n_pieces * sizeof *ids);
    if (!ids)
        return st_err_set(ps->err, ST_RESOURCE_EXHAUSTED, "%s: out of memory", ps->what);
    for (size_t i = 0; i < m->n_pieces; i++)
        ids[i] = (bk_pid){m->pieces[i].id, i};
    qsort(ids, m->n_pieces, sizeof *ids, pid_cmp);
    st_code rc = ST_OK;
    for (size_t i = 1; i < m->n_pieces && rc == ST_OK; i++)
        if (!strcmp(ids[i - 1].id, ids[i].id))
            rc = st_err_set(ps->err, ST_INVALID_ARGUMENT,
                            "%s: piece id %s repeated (not a Strata backup export, or damaged: "
                            "export it again)",
                            ps->what, ids[i].id);
    if (rc == ST_OK && m->version >= 3)
        rc = files_at_ok(ps, ids);
    free(ids);
    return rc;
}

/* By start key, then end key (unbounded last), then id: only overlapping pieces tie on the
 * start, and the order among them must not depend on qsort's. */
static int piece_cmp(const void *a, const void *b) {
    const ops_bk_piece *x = a, *y = b;
    int c = st_slice_cmp(st_buf_slice(&x->start_key), st_buf_slice(&y->start_key));
    if (!c && (!x->end_key.len || !y->end_key.len))
        c = (int)!x->end_key.len - (int)!y->end_key.len;
    else if (!c)
        c = st_slice_cmp(st_buf_slice(&x->end_key), st_buf_slice(&y->end_key));
    return c ? c : strcmp(x->id, y->id);
}

/* Exports list their pieces by start key, but some written by earlier releases list those of a
 * backup copy (CopyBackup) in the order the copy placed them on its nodes; the pieces are the
 * same, so they are read in any order and sorted here, and ops_bk_manifest_check then refuses
 * any gap or overlap. Runs after piece_ids_ok, whose "earlier piece" of a file's holder means
 * earlier in the file as written. */
static void sort_pieces(ops_bk_manifest *m) {
    if (m->n_pieces > 1)
        qsort(m->pieces, m->n_pieces, sizeof *m->pieces, piece_cmp);
}

st_code ops_bk_manifest_parse(const char *text, size_t len, const char *what, ops_bk_manifest *m,
                              st_err *err) {
    ops_bk_manifest_init(m);
    m->version = 0; /* from the first line */
    bk_parse ps = {.what = what, .m = m, .err = err};
    size_t body = 0;
    if (len > OPS_BK_MANIFEST_BYTES_MAX)
        return st_err_set(err, ST_INVALID_ARGUMENT, "%s: larger than %u bytes: not a manifest",
                          what, OPS_BK_MANIFEST_BYTES_MAX);
    st_code rc = check_end(&ps, text, len, &body);
    if (rc == ST_OK)
        rc = parse_body(&ps, text, body);
    free(ps.slots);
    if (rc == ST_OK)
        rc = piece_ids_ok(&ps);
    if (rc == ST_OK)
        sort_pieces(m);
    if (rc == ST_OK) /* the fields against each other (backup_check.c) */
        rc = ops_bk_manifest_check(m, what, err);
    return rc;
}
