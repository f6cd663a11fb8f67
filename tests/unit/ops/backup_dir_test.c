/*
 * Proves the export directory of `strata backup` (ops/backup_dir.c, backup_files.c) accepts only
 * an export that is complete and intact: an export written with ops_bk_out and
 * ops_bk_manifest_write verifies and loads back the same; a flipped byte, a truncated file, a
 * missing file, a changed manifest and an export that stopped before its manifest are each
 * refused with an error naming the bad file; what a failed export wrote is removed, and nothing
 * else; and manifests that are not ones (path traversal in
 * piece or file names, hidden or temporary names, repeated or overlapping pieces, a missing
 * header, a wrong version) are refused by the parser before any path is built from them.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "backup_dir.h"

static char test_dir[1024];
static int g_version = OPS_BK_VERSION; /* of the export the tests write */

static void make_dir(char *out, size_t cap) {
    const char *base = getenv("STRATA_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(out, cap, "%s/bkdir.XXXXXX", base);
    assert_non_null(mkdtemp(out));
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

static void add_file(const char *dir, ops_bk_piece *p, const char *name, size_t size,
                     unsigned seed) {
    ops_bk_out o;
    ops_bk_file f;
    st_err err = {0};
    uint8_t *data = malloc(size ? size : 1);
    assert_non_null(data);
    fill(data, size, seed);
    memset(&f, 0, sizeof f);
    snprintf(f.name, sizeof f.name, "%s", name);
    assert_int_equal(ops_bk_out_open(&o, dir, g_version, p->id, name, &err), ST_OK);
    /* in two writes, as an export receives chunks */
    assert_int_equal(ops_bk_out_write(&o, data, size / 2, &err), ST_OK);
    assert_int_equal(ops_bk_out_write(&o, data + size / 2, size - size / 2, &err), ST_OK);
    assert_int_equal(ops_bk_out_close(&o, &f, &err), ST_OK);
    assert_int_equal(f.size, size);
    assert_int_equal(f.crc32c, st_crc32c(0, data, size));
    assert_non_null(ops_bk_piece_add_file(p, &f));
    free(data);
}

/* An export of two pieces ("" .. "m", "m" .. end), three files, written into test_dir/x. */
static void write_export(char *dir, size_t cap, ops_bk_manifest *m) {
    st_err err = {0};
    make_dir(test_dir, sizeof test_dir);
    snprintf(dir, cap, "%s/x", test_dir);
    bool made = false;
    assert_int_equal(ops_bk_dir_create(dir, g_version, &made, &err), ST_OK);
    assert_true(made);
    ops_bk_manifest_init(m);
    m->version = g_version;
    snprintf(m->backup, sizeof m->backup, "projects/p/instances/i/clusters/c1/backups/b1");
    snprintf(m->source_table, sizeof m->source_table, "projects/p/instances/i/tables/t");
    m->backup_type = 1;
    m->start_us = 1000;
    m->end_us = 2000;
    m->expire_us = 3000;
    assert_int_equal(st_buf_append(&m->schema, "\x0a\x01t", 3), ST_OK);
    ops_bk_piece *a =
        ops_bk_manifest_add_piece(m, "p0", st_slice_make(NULL, 0), ST_SLICE_LIT("m"), 1500);
    assert_non_null(a);
    add_file(dir, a, "000001.sst", 300000, 1);
    add_file(dir, a, "000002.sst", 5, 2);
    ops_bk_piece *b =
        ops_bk_manifest_add_piece(m, "p1", ST_SLICE_LIT("m"), st_slice_make(NULL, 0), 1600);
    assert_non_null(b);
    add_file(dir, b, "000001.sst", 2 << 20, 3); /* same name, another piece */
    if (g_version >= 3) /* p0's file, as the export lists a file pieces of one node share */
        assert_non_null(ops_bk_piece_add_file(b, &a->files[1]));
    else /* the same content as p0's: one file in v2 */
        add_file(dir, b, "000002.sst", 5, 2);
    assert_int_equal(ops_bk_manifest_write(dir, m, &err), ST_OK);
}

/* The path of file j of piece i, and what an error about it names. */
static void file_at(const char *dir, const ops_bk_manifest *m, size_t i, size_t j, char *path,
                    size_t cap, char *names, size_t ncap) {
    assert_true(ops_bk_file_path(dir, m, &m->pieces[i], &m->pieces[i].files[j], path, cap, NULL));
    if (m->version < 2)
        snprintf(names, ncap, "pieces/%s/%s", m->pieces[i].id, m->pieces[i].files[j].name);
    else
        snprintf(names, ncap, "file %s of piece %s", m->pieces[i].files[j].name, m->pieces[i].id);
}

static void expect_refused(const char *dir, st_code code, const char *names) {
    ops_bk_manifest m;
    st_err err = {0};
    assert_int_equal(ops_bk_verify(dir, &m, NULL, NULL, &err), code);
    if (!strstr(err.msg, names))
        fail_msg("error '%s' does not name '%s'", err.msg, names);
    ops_bk_manifest_deinit(&m);
}

static void cleanup(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_dir);
    assert_int_equal(system(cmd), 0);
}

static void test_backup_dir_round_trip(void **state) {
    (void)state;
    char dir[1100];
    ops_bk_manifest w, r;
    st_err err = {0};
    write_export(dir, sizeof dir, &w);
    assert_int_equal(ops_bk_verify(dir, &r, NULL, NULL, &err), ST_OK);
    assert_string_equal(r.backup, w.backup);
    assert_string_equal(r.source_table, w.source_table);
    assert_int_equal(r.start_us, 1000);
    assert_int_equal(r.end_us, 2000);
    assert_int_equal(r.expire_us, 3000);
    assert_int_equal(r.schema.len, 3);
    assert_int_equal(r.n_pieces, 2);
    assert_int_equal(r.pieces[0].n_files, 2);
    assert_int_equal(r.pieces[1].end_key.len, 0);
    assert_memory_equal(r.pieces[1].start_key.data, "m", 1);
    assert_int_equal(ops_bk_manifest_bytes(&r), ops_bk_manifest_bytes(&w));
    assert_memory_equal(r.pieces[1].files[0].sha256, w.pieces[1].files[0].sha256, 32);
    assert_string_equal(r.pieces[1].files[1].at, g_version >= 3 ? "p0" : "");
    assert_int_equal(r.version, g_version);
    /* no temporary name is left behind */
    char tmp[1200];
    snprintf(tmp, sizeof tmp,
             g_version < 2 ? "%s/pieces/p0/000001.sst.tmp" : "%s/files/p0.000001.sst.tmp", dir);
    assert_int_not_equal(access(tmp, F_OK), 0);
    /* versions 2 and 3 hold p0's and p1's 000002.sst once */
    char a[1200], b[1200], na[512], nb[512];
    file_at(dir, &r, 0, 1, a, sizeof a, na, sizeof na);
    file_at(dir, &r, 1, 1, b, sizeof b, nb, sizeof nb);
    assert_int_equal(strcmp(a, b) == 0, g_version >= 2);
    if (g_version >= 2) {
        snprintf(tmp, sizeof tmp, "ls '%s/files' | wc -l | grep -qx 3", dir);
        assert_int_equal(system(tmp), 0);
    }
    ops_bk_manifest_deinit(&w);
    ops_bk_manifest_deinit(&r);
    cleanup();
}

/* A HOT backup's hot_to_standard_time is an optional header line: it round-trips, a manifest
 * without it (every export before the line existed) reads 0, and it may be given once only. */
static void test_backup_dir_hot_time(void **state) {
    (void)state;
    ops_bk_manifest w, r;
    st_err err = {0};
    st_buf text;
    st_buf_init(&text);
    ops_bk_manifest_init(&w);
    snprintf(w.backup, sizeof w.backup, "projects/p/instances/i/clusters/c1/backups/b1");
    snprintf(w.source_table, sizeof w.source_table, "projects/p/instances/i/tables/t");
    w.backup_type = 2;
    w.start_us = 1000;
    w.end_us = 2000;
    w.expire_us = 3000;
    w.hot_us = 2500;
    assert_int_equal(st_buf_append(&w.schema, "\x0a\x01t", 3), ST_OK);
    assert_non_null(
        ops_bk_manifest_add_piece(&w, "p0", st_slice_make(NULL, 0), st_slice_make(NULL, 0), 1500));
    assert_int_equal(ops_bk_manifest_format(&w, &text, &err), ST_OK);
    assert_int_equal(st_buf_append_byte(&text, 0), ST_OK); /* for strstr, not parsed */
    assert_non_null(strstr((const char *)text.data, "\nhot_to_standard_us 2500\n"));
    assert_int_equal(ops_bk_manifest_parse((const char *)text.data, text.len - 1, "M", &r, &err),
                     ST_OK);
    assert_int_equal(r.hot_us, 2500);
    assert_int_equal(r.backup_type, 2);
    ops_bk_manifest_deinit(&r);
    w.hot_us = 0; /* STANDARD (or HOT without the time): no line, as older exports */
    assert_int_equal(ops_bk_manifest_format(&w, &text, &err), ST_OK);
    assert_int_equal(st_buf_append_byte(&text, 0), ST_OK);
    assert_null(strstr((const char *)text.data, "hot_to_standard"));
    assert_int_equal(ops_bk_manifest_parse((const char *)text.data, text.len - 1, "M", &r, &err),
                     ST_OK);
    assert_int_equal(r.hot_us, 0);
    ops_bk_manifest_deinit(&r);
    ops_bk_manifest_deinit(&w);
    st_buf_free(&text);
}

static void test_backup_dir_flipped_byte_refused(void **state) {
    (void)state;
    char dir[1100], path[1200], names[512];
    ops_bk_manifest w;
    write_export(dir, sizeof dir, &w);
    file_at(dir, &w, 1, 0, path, sizeof path, names, sizeof names);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t c;
    assert_int_equal(pread(fd, &c, 1, 1234567), 1);
    c ^= 0x10;
    assert_int_equal(pwrite(fd, &c, 1, 1234567), 1);
    close(fd);
    expect_refused(dir, ST_DATA_LOSS, names);
    ops_bk_manifest_deinit(&w);
    cleanup();
}

static void test_backup_dir_truncated_refused(void **state) {
    (void)state;
    char dir[1100], path[1200], names[512];
    ops_bk_manifest w;
    write_export(dir, sizeof dir, &w);
    file_at(dir, &w, 0, 0, path, sizeof path, names, sizeof names);
    assert_int_equal(truncate(path, 1000), 0);
    expect_refused(dir, ST_DATA_LOSS, names);
    ops_bk_manifest_deinit(&w);
    cleanup();
}

static void test_backup_dir_missing_refused(void **state) {
    (void)state;
    char dir[1100], path[1200], names[512];
    ops_bk_manifest w;
    write_export(dir, sizeof dir, &w);
    file_at(dir, &w, 0, 1, path, sizeof path, names, sizeof names);
    assert_int_equal(unlink(path), 0);
    expect_refused(dir, ST_NOT_FOUND, names);
    ops_bk_manifest_deinit(&w);
    cleanup();
}

static void test_backup_dir_manifest_changed_refused(void **state) {
    (void)state;
    char dir[1100], path[1200];
    ops_bk_manifest w;
    write_export(dir, sizeof dir, &w);
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text, f);
    char *at = strstr(text, "end_us 2000");
    assert_non_null(at);
    at[8] = '1'; /* end_us 2100: still parses, so only the checksum tells */
    rewind(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
    expect_refused(dir, ST_DATA_LOSS, "MANIFEST");
    assert_int_equal(truncate(path, (off_t)n - 3), 0);
    expect_refused(dir, ST_INVALID_ARGUMENT, "MANIFEST");
    ops_bk_manifest_deinit(&w);
    cleanup();
}

/* An export that stopped before its manifest (a crash, Ctrl-C) never verifies. */
static void test_backup_dir_unfinished_refused(void **state) {
    (void)state;
    char dir[1100];
    st_err err = {0};
    make_dir(test_dir, sizeof test_dir);
    snprintf(dir, sizeof dir, "%s/x", test_dir);
    bool made = false;
    assert_int_equal(ops_bk_dir_create(dir, g_version, &made, &err), ST_OK);
    ops_bk_out o;
    assert_int_equal(ops_bk_out_open(&o, dir, g_version, "p0", "000001.sst", &err), ST_OK);
    assert_int_equal(ops_bk_out_write(&o, "abc", 3, &err), ST_OK);
    ops_bk_out_abort(&o);
    expect_refused(dir, ST_NOT_FOUND, "MANIFEST");
    /* and a second export into it is refused only if something is there */
    assert_int_equal(ops_bk_dir_create(dir, g_version, &made, &err), ST_ALREADY_EXISTS);
    assert_false(made);
    cleanup();
}

/* An export that failed is removed: the directory it made goes whole; one that was there, empty,
 * before the export stays, empty again; anything else in a directory is never touched (the
 * export refuses a directory that is not empty before it writes). */
static void test_backup_dir_failed_export_removed(void **state) {
    (void)state;
    char dir[1100], other[1200];
    st_err err = {0};
    struct stat st;
    bool made = false;
    make_dir(test_dir, sizeof test_dir);
    snprintf(dir, sizeof dir, "%s/x", test_dir);
    for (int round = 0; round < 2; round++) { /* made by the export, then there before */
        assert_int_equal(ops_bk_dir_create(dir, g_version, &made, &err), ST_OK);
        assert_int_equal(made, round == 0);
        ops_bk_out o;
        assert_int_equal(ops_bk_out_open(&o, dir, g_version, "p0", "000001.sst", &err), ST_OK);
        assert_int_equal(ops_bk_out_write(&o, "abc", 3, &err), ST_OK);
        ops_bk_file f = {0};
        assert_int_equal(ops_bk_out_close(&o, &f, &err), ST_OK);
        assert_int_equal(ops_bk_out_open(&o, dir, g_version, "p0", "000002.sst", &err), ST_OK);
        assert_int_equal(ops_bk_out_write(&o, "de", 2, &err), ST_OK); /* still .tmp */
        assert_true(ops_bk_dir_remove(dir, g_version, made));
        ops_bk_out_abort(&o);
        if (round == 0)
            assert_int_not_equal(stat(dir, &st), 0);
        else
            assert_int_equal(rmdir(dir), 0); /* there, and empty */
        if (round == 0)
            assert_int_equal(mkdir(dir, 0755), 0);
    }
    /* a file that is not the export's keeps the directory (and is kept) */
    assert_int_equal(ops_bk_dir_create(dir, g_version, &made, &err), ST_OK);
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    FILE *fp = fopen(other, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_false(ops_bk_dir_remove(dir, g_version, made));
    assert_int_equal(stat(other, &st), 0);
    cleanup();
}

/* text + the `end` line it needs, parsed. */
/* body signed with its `end` line and parsed into m (deinit it whatever the result). */
static st_code parse_into(const char *body, ops_bk_manifest *m, st_err *err) {
    st_buf text;
    st_buf_init(&text);
    assert_int_equal(st_buf_append(&text, body, strlen(body)), ST_OK);
    uint8_t sha[32];
    char shahex[65], end[128];
    unsigned n = 0;
    assert_int_equal(EVP_Digest(text.data, text.len, sha, &n, EVP_sha256(), NULL), 1);
    ops_bk_hex(sha, 32, shahex);
    snprintf(end, sizeof end, "end %08x %s\n", st_crc32c(0, text.data, text.len), shahex);
    assert_int_equal(st_buf_append(&text, end, strlen(end)), ST_OK);
    st_code rc = ops_bk_manifest_parse((const char *)text.data, text.len, "M", m, err);
    st_buf_free(&text);
    return rc;
}

static st_code parse_body(const char *body, st_err *err) {
    ops_bk_manifest m;
    st_code rc = parse_into(body, &m, err);
    ops_bk_manifest_deinit(&m);
    return rc;
}

#define HDR                                                                                        \
    "strata-backup-export 1\nbackup projects/p/instances/i/clusters/c/backups/b\n"                 \
    "source_table projects/p/instances/i/tables/t\nbackup_type 1\nstart_us 1\nend_us 2\n"          \
    "expire_us 3\nschema 0a0174\n"
#define SHA "0000000000000000000000000000000000000000000000000000000000000000"
#define HDR_REST                                                                                   \
    "backup projects/p/instances/i/clusters/c/backups/b\n"                                         \
    "source_table projects/p/instances/i/tables/t\nbackup_type 1\nstart_us 1\nend_us 2\n"          \
    "expire_us 3\nschema 0a0174\n"
#define HDR3 "strata-backup-export 3\n" HDR_REST
#define HDR4 "strata-backup-export 4\n" HDR_REST

static void test_backup_dir_hostile_manifest_refused(void **state) {
    (void)state;
    static const char *bad[] = {
        HDR "piece .. - - 1\n",
        HDR "piece ../x - - 1\n",
        HDR "piece p - - 1\nfile ../../etc/passwd 1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile a/b 1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile .. 1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile .hidden 1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile x.sst.tmp 1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile x 1 00000000 " SHA "\nfile x 1 00000000 " SHA "\n",
        HDR "piece p - 6d 1\npiece p 6d - 1\n",
        HDR "piece p - 6d 1\npiece q 6c - 1\n", /* overlaps */
        HDR "piece p 6d 6d 1\n",                /* empty range */
        HDR "piece p - - 1\npiece q - - 1\n",   /* two pieces covering everything */
        HDR "file x 1 00000000 " SHA "\n",      /* file without a piece */
        HDR "piece p - - 1\nfile x -1 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile x 99999999999999999999 00000000 " SHA "\n",
        HDR "piece p - - 1\nfile x 1 0000000 " SHA "\n",
        HDR "piece p - - 1\nfile x 1 00000000 " SHA " extra\n",
        HDR3 "piece p - - 1\nfile x 1 00000000 " SHA "\n", /* version 3 names a piece */
        HDR3 "piece p - - 1\nfile x 1 00000000 q\n",       /* no piece q */
        HDR3 "piece p - - 1\nfile x 1 00000000 ..\n",
        HDR3 "piece p - - 1\nfile x 1 00000000 p/..\n",
        HDR3 "piece q - 6d 1\nfile x 1 00000000 q\npiece p 6d - 1\nfile x 2 00000000 q\n",
        HDR3 "piece q - 6d 1\nfile x 1 00000000 q\npiece p 6d - 1\nfile x 1 00000001 q\n",
        HDR3 "piece q - 6d 1\nfile x 1 00000000 q\npiece p 6d - 1\nfile y 1 00000000 q\n",
        HDR3 "piece p - 6d 1\nfile x 1 00000000 q\npiece q 6d - 1\nfile x 1 00000000 q\n",
        HDR3 "piece r - 6c 1\nfile x 1 00000000 r\npiece q 6c 6d 1\nfile x 1 00000000 r\n"
             "piece p 6d - 1\nfile x 1 00000000 q\n", /* q does not hold it itself */
        HDR "piece p 6 - 1\n",                        /* odd hex */
        HDR "piece p - - 1\nbackup_type 1\n",
        HDR "backup_type 2\n",
        HDR "piece p  - - 1\n",
        "strata-backup-export 1\nbackup projects/p/instances/i/clusters/c/backups/b\n",
        "strata-backup-export 2\n",
        "strata-backup-export 4\nbackup projects/p/instances/i/clusters/c/backups/b\n",
        HDR4 "piece p - - 1\n",
        "strata-backup-export 1\nbackup ../../b\n",
        "strata-backup-export 1\nbackup a b\n",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_err err = {0};
        st_code rc = parse_body(bad[i], &err);
        if (rc != ST_INVALID_ARGUMENT)
            fail_msg("manifest %zu accepted (%d): %s", i, rc, bad[i]);
        assert_non_null(strstr(err.msg, "M"));
    }
    st_err err = {0};
    assert_int_equal(
        parse_body(HDR "piece p - 6d 1\nfile x 1 00000000 " SHA "\npiece q 6d - 2\n", &err), ST_OK);
    assert_int_equal(parse_body(HDR3 "piece q - 6c 1\nfile x 1 00000000 q\npiece r 6c 6d 1\n"
                                     "file x 1 00000000 q\nfile y 0 00000000 r\npiece p 6d - 1\n"
                                     "file x 1 00000000 q\n",
                                &err),
                     ST_OK);
}

/* Pieces listed out of key order (as exports of a backup copy were written: in the order the copy
 * placed them on its nodes) are read and sorted by start key, so such an export verifies and
 * imports; a file's holder stays the earlier piece as written, even when it sorts later. Ranges
 * that overlap or leave a gap are refused whatever the order, naming the pieces. */
static void test_backup_dir_pieces_any_order(void **state) {
    (void)state;
    ops_bk_manifest m;
    st_err err = {0};
    assert_int_equal(parse_into(HDR3 "piece r 6d - 1\nfile x 1 00000000 r\npiece p - 62 1\n"
                                     "piece q 62 6d 1\nfile x 1 00000000 r\nfile y 2 00000001 q\n",
                                &m, &err),
                     ST_OK);
    assert_int_equal(m.n_pieces, 3);
    assert_string_equal(m.pieces[0].id, "p");
    assert_string_equal(m.pieces[1].id, "q");
    assert_string_equal(m.pieces[2].id, "r");
    assert_int_equal(m.pieces[1].n_files, 2);
    assert_string_equal(m.pieces[1].files[0].at, "r");
    ops_bk_manifest_deinit(&m);
    static const struct {
        const char *body, *want;
    } bad[] = {
        {HDR "piece q 6c - 1\npiece p - 6d 1\n", "pieces p and q overlap"},
        {HDR "piece q 6e - 1\npiece p - 6d 1\n", "piece q does not start where piece p ends"},
        {HDR "piece q - - 1\npiece p - 6d 1\n", "pieces p and q overlap"},
        {HDR "piece q 6d - 1\npiece p 6c 6d 1\n", "piece p, the first, starts at a key"},
        {HDR "piece q 6d 6e 1\npiece p - 6d 1\n", "piece q, the last, ends at a key"},
        {HDR "piece p 6e 6d 1\n", "line 9: piece range empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse_body(bad[i].body, &err), ST_INVALID_ARGUMENT);
        if (!strstr(err.msg, bad[i].want))
            fail_msg("case %zu: want \"%s\", got \"%s\"", i, bad[i].want, err.msg);
    }
}

/* A piece of many files: a name repeated in its piece is refused at the line that repeats it,
 * however far from the first; the same name in another piece is no repeat. (The check is a hash
 * set per piece: comparing each name with every earlier one of its piece was quadratic.) */
static void test_backup_dir_many_files(void **state) {
    (void)state;
    enum { FILES = 20000 };
    st_buf b;
    st_buf_init(&b);
    const char *head = HDR "piece p - 6d 1\n";
    assert_int_equal(st_buf_append(&b, head, strlen(head)), ST_OK);
    char line[160];
    for (int i = 0; i < FILES; i++) {
        snprintf(line, sizeof line, "file f%05d 1 00000000 " SHA "\n", i);
        assert_int_equal(st_buf_append(&b, line, strlen(line)), ST_OK);
    }
    snprintf(line, sizeof line, "piece q 6d - 1\nfile f00000 1 00000000 " SHA "\n");
    assert_int_equal(st_buf_append(&b, line, strlen(line)), ST_OK);
    assert_int_equal(st_buf_append(&b, "", 1), ST_OK);
    st_err err = {0};
    assert_int_equal(parse_body((const char *)b.data, &err), ST_OK);
    /* the first piece's first name again, as its last file: the line after the other files */
    b.len = strlen(head) + (size_t)FILES * strlen(line + strlen("piece q 6d - 1\n"));
    snprintf(line, sizeof line, "file f00000 1 00000000 " SHA "\npiece q 6d - 1\n");
    assert_int_equal(st_buf_append(&b, line, strlen(line) + 1), ST_OK);
    assert_int_equal(parse_body((const char *)b.data, &err), ST_INVALID_ARGUMENT);
    snprintf(line, sizeof line, "line %d: file repeated in its piece", 9 + FILES + 1);
    if (!strstr(err.msg, line))
        fail_msg("want \"%s\", got \"%s\"", line, err.msg);
    st_buf_free(&b);
}

/* The same checks on an export of the SHA-256 layout (version 2, files/<sha256>): still read by
 * verify and import. */
static void test_backup_dir_version2(void **state) {
    g_version = 2;
    test_backup_dir_round_trip(state);
    test_backup_dir_flipped_byte_refused(state);
    test_backup_dir_truncated_refused(state);
    test_backup_dir_missing_refused(state);
    g_version = OPS_BK_VERSION;
}

/* The same checks on an export of the earlier layout (version 1, pieces/<piece>/<name>): still
 * read by verify and import. */
static void test_backup_dir_version1(void **state) {
    g_version = 1;
    test_backup_dir_round_trip(state);
    test_backup_dir_flipped_byte_refused(state);
    test_backup_dir_truncated_refused(state);
    test_backup_dir_missing_refused(state);
    g_version = OPS_BK_VERSION;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backup_dir_round_trip),
        cmocka_unit_test(test_backup_dir_hot_time),
        cmocka_unit_test(test_backup_dir_flipped_byte_refused),
        cmocka_unit_test(test_backup_dir_truncated_refused),
        cmocka_unit_test(test_backup_dir_missing_refused),
        cmocka_unit_test(test_backup_dir_version2),
        cmocka_unit_test(test_backup_dir_version1),
        cmocka_unit_test(test_backup_dir_manifest_changed_refused),
        cmocka_unit_test(test_backup_dir_unfinished_refused),
        cmocka_unit_test(test_backup_dir_failed_export_removed),
        cmocka_unit_test(test_backup_dir_hostile_manifest_refused),
        cmocka_unit_test(test_backup_dir_many_files),
        cmocka_unit_test(test_backup_dir_pieces_any_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
