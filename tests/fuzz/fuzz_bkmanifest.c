/* fuzz_bkmanifest: the parser of a backup export's MANIFEST (ops/backup_dir.c), which
 * `strata backup verify` and `import` run on a directory that may come from anywhere. The first
 * input byte chooses the mode: odd, the rest is a manifest body and the target appends the `end`
 * line with its correct checksums (so the fuzzer reaches the parser behind the checksum); even,
 * the rest is the manifest as is.
 * Properties: no crash, leak or read outside the text; an error names the manifest; a manifest
 * that parses holds only names that cannot leave the directory, pieces sorted and disjoint, and
 * formats back into a manifest that parses to the same contents. */
#include <openssl/evp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backup_export.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static void fuzz_valid(const ops_bk_manifest *m) {
    FUZZ_CHECK(ops_bk_resource_name_ok(m->backup) && ops_bk_resource_name_ok(m->source_table));
    for (size_t i = 0; i < m->n_pieces; i++) {
        const ops_bk_piece *p = &m->pieces[i];
        FUZZ_CHECK(ops_bk_piece_id_ok(p->id) && strcmp(p->id, ".") && strcmp(p->id, ".."));
        FUZZ_CHECK(!strchr(p->id, '/'));
        if (i + 1 < m->n_pieces)
            FUZZ_CHECK(p->end_key.len &&
                       st_slice_cmp(st_buf_slice(&p->end_key),
                                    st_buf_slice(&m->pieces[i + 1].start_key)) <= 0);
        for (size_t j = 0; j < p->n_files; j++)
            FUZZ_CHECK(ops_bk_file_name_ok(p->files[j].name) && p->files[j].name[0] != '.' &&
                       !strchr(p->files[j].name, '/'));
    }
}

static void fuzz_same(const ops_bk_manifest *a, const ops_bk_manifest *b) {
    FUZZ_CHECK(!strcmp(a->backup, b->backup) && !strcmp(a->source_table, b->source_table));
    FUZZ_CHECK(a->backup_type == b->backup_type && a->start_us == b->start_us &&
               a->end_us == b->end_us && a->expire_us == b->expire_us);
    FUZZ_CHECK(st_slice_eq(st_buf_slice(&a->schema), st_buf_slice(&b->schema)));
    FUZZ_CHECK(a->n_pieces == b->n_pieces);
    for (size_t i = 0; i < a->n_pieces; i++) {
        const ops_bk_piece *x = &a->pieces[i], *y = &b->pieces[i];
        FUZZ_CHECK(!strcmp(x->id, y->id) && x->frozen_us == y->frozen_us &&
                   x->n_files == y->n_files);
        FUZZ_CHECK(st_slice_eq(st_buf_slice(&x->start_key), st_buf_slice(&y->start_key)) &&
                   st_slice_eq(st_buf_slice(&x->end_key), st_buf_slice(&y->end_key)));
        for (size_t j = 0; j < x->n_files; j++)
            FUZZ_CHECK(!memcmp(&x->files[j], &y->files[j], sizeof x->files[j]));
    }
}

static void fuzz_round_trip(const ops_bk_manifest *m) {
    st_buf text;
    st_buf_init(&text);
    ops_bk_manifest back;
    st_err err = {0};
    FUZZ_CHECK(ops_bk_manifest_format(m, &text, &err) == ST_OK);
    FUZZ_CHECK(ops_bk_manifest_parse((const char *)text.data, text.len, "fuzz.back", &back, &err) ==
               ST_OK);
    fuzz_same(m, &back);
    ops_bk_manifest_deinit(&back);
    st_buf_free(&text);
}

/* body + "end CRC SHA\n" into a fresh allocation of exactly its size. */
static char *with_end(const uint8_t *body, size_t n, size_t *len) {
    uint8_t sha[32];
    char hex[65], end[128];
    unsigned shan = 0;
    EVP_Digest(body, n, sha, &shan, EVP_sha256(), NULL);
    ops_bk_hex(sha, sizeof sha, hex);
    int e = snprintf(end, sizeof end, "end %08x %s\n", st_crc32c(0, body, n), hex);
    char *text = malloc(n + (size_t)e);
    FUZZ_CHECK(text);
    if (n)
        memcpy(text, body, n);
    memcpy(text + n, end, (size_t)e);
    *len = n + (size_t)e;
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    size_t len = size - 1;
    char *text;
    if (data[0] & 1) {
        text = with_end(data + 1, size - 1, &len);
    } else { /* a copy of exactly the bytes, so ASan sees any read past its end */
        text = malloc(len ? len : 1);
        FUZZ_CHECK(text);
        if (len)
            memcpy(text, data + 1, len);
    }
    ops_bk_manifest m;
    st_err err = {0};
    st_code rc = ops_bk_manifest_parse(text, len, "fuzz.manifest", &m, &err);
    if (rc == ST_OK) {
        fuzz_valid(&m);
        fuzz_round_trip(&m);
    } else {
        FUZZ_CHECK(!strncmp(err.msg, "fuzz.manifest", 13) || rc == ST_RESOURCE_EXHAUSTED);
    }
    ops_bk_manifest_deinit(&m);
    free(text);
    return 0;
}
