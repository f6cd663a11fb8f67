/* sto_test_util.h — small helpers shared by the storage engine tests (db, split, compaction,
 * model, crash, corruption): temporary directories, opening a db on one, one-call writes, and
 * dumping a tablet's visible cells as text so two stores can be compared with one strcmp.
 * Header-only. */
#ifndef STO_TEST_UTIL_H
#define STO_TEST_UTIL_H

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/storage.h"
#include "tu_tmp.h"

/* Options small enough that tests flush and compact often. */
static inline void tu_small_options(sto_options *o) {
    sto_options_default(o);
    o->memtable_bytes = 100 << 10; /* memtables count whole 64 KiB arena blocks */
    o->block_bytes = 1024;
    o->block_cache_bytes = 1 << 20;
    o->log_segment_bytes = 256 << 10;
    o->background_threads = 2;
}

static inline sto_mut tu_set_mut(const char *fam, const char *qual, int64_t ts, const char *val) {
    sto_mut m;
    memset(&m, 0, sizeof m);
    m.type = STO_MUT_SET_CELL;
    m.family = st_slice_cstr(fam);
    m.qualifier = st_slice_cstr(qual);
    m.ts_us = ts;
    m.value = st_slice_cstr(val);
    return m;
}

static inline sto_row_mut tu_row(uint64_t tablet, const char *row, const sto_mut *muts, size_t n,
                                 uint64_t version) {
    sto_row_mut r;
    memset(&r, 0, sizeof r);
    r.tablet_id = tablet;
    r.row = st_slice_cstr(row);
    r.muts = muts;
    r.n_muts = n;
    r.version = version;
    r.commit_ts_us = (int64_t)(version >> STO_VERSION_TIEBREAK_BITS);
    return r;
}

/* The engine tests' fixture steps. tu_db_open_fresh opens a db with o (which must outlive it) on
 * a fresh directory named after name, written to dir (cap bytes); tu_db_reopen closes *db and
 * opens it again from dir, as a restart does; both say on stderr why an open failed and return
 * its code. tu_db_close_rm closes db and removes its directory. */
static inline st_code tu_db_open_fresh(char *dir, size_t cap, const char *name,
                                       const sto_options *o, sto_db **db) {
    tu_tmpdir(dir, cap, name);
    st_err err;
    st_code rc = sto_db_open(dir, o, db, &err);
    if (rc != ST_OK)
        fprintf(stderr, "%s: open %s: %s\n", name, dir, err.msg);
    return rc;
}

static inline st_code tu_db_reopen(const char *dir, const sto_options *o, sto_db **db) {
    sto_db_close(*db);
    *db = NULL;
    st_err err;
    st_code rc = sto_db_open(dir, o, db, &err);
    if (rc != ST_OK)
        fprintf(stderr, "reopen %s: %s\n", dir, err.msg);
    return rc;
}

static inline void tu_db_close_rm(sto_db *db, const char *dir) {
    sto_db_close(db);
    tu_rmrf(dir);
}

/* One SetCell, durable on return. */
static inline st_code tu_set(sto_db *db, uint64_t tablet, const char *row, const char *fam,
                             const char *qual, int64_t ts, const char *val, uint64_t version) {
    sto_mut m = tu_set_mut(fam, qual, ts, val);
    sto_row_mut r = tu_row(tablet, row, &m, 1, version);
    st_err err;
    st_code rc = sto_write(db, &r, 1, NULL, &err);
    if (rc != ST_OK)
        fprintf(stderr, "tu_set: %s: %s\n", st_code_name(rc), err.msg);
    return rc;
}

static inline void tu_append_slice(st_buf *out, st_slice s) {
    for (size_t i = 0; i < s.len; i++) {
        uint8_t c = s.data[i];
        if (c >= 0x21 && c < 0x7f && c != '\\')
            st_buf_append_byte(out, c);
        else {
            char hex[8];
            snprintf(hex, sizeof hex, "\\x%02x", c);
            st_buf_append(out, hex, 4);
        }
    }
}

static inline void tu_append_cell(st_buf *out, const sto_cell *c) {
    tu_append_slice(out, c->row);
    st_buf_append_byte(out, ' ');
    tu_append_slice(out, c->family);
    st_buf_append_byte(out, ':');
    tu_append_slice(out, c->qualifier);
    char ts[32];
    int n = snprintf(ts, sizeof ts, "@%" PRId64 "=", c->ts_us);
    st_buf_append(out, ts, (size_t)n);
    tu_append_slice(out, c->value);
    st_buf_append_byte(out, '\n');
}

/* Every visible cell of the tablet in range (NULL = all) as text, NUL-terminated in out; returns
 * the code that ended the scan (ST_OK when it reached the end). */
static inline st_code tu_dump_range(sto_tablet *t, const sto_range *range, bool reverse,
                                    st_buf *out) {
    st_buf_reset(out);
    sto_snapshot *s;
    st_err err;
    st_code rc = sto_snapshot_new(t, &s, &err);
    if (rc != ST_OK)
        return rc;
    sto_iter *it;
    rc = sto_iter_new(s, range, reverse, &it, &err);
    if (rc == ST_OK) {
        sto_cell c;
        while ((rc = sto_iter_next(it, &c, &err)) == ST_OK)
            tu_append_cell(out, &c);
        sto_iter_free(it);
    }
    sto_snapshot_free(s);
    st_buf_append_byte(out, 0);
    out->len--;
    return rc == ST_NOT_FOUND ? ST_OK : rc;
}

static inline st_code tu_dump(sto_db *db, uint64_t tablet, st_buf *out) {
    sto_tablet *t;
    if (sto_tablet_get(db, tablet, &t) != ST_OK)
        return ST_NOT_FOUND;
    return tu_dump_range(t, NULL, false, out);
}

/* XORs the byte at off of path with 0x5a (damage the checksums must catch): false when the file
 * cannot be opened. */
static inline bool tu_flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f)
        return false;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
    return true;
}

/* The path of the first (smallest name) commit log segment of the storage directory dir into
 * out: false when there is none. */
static inline bool tu_first_log_segment(const char *dir, char *out, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/log", dir);
    DIR *d = opendir(path);
    out[0] = 0;
    if (!d)
        return false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".log") && (!out[0] || strcmp(e->d_name, out + strlen(path) + 1) < 0))
            snprintf(out, cap, "%s/%s", path, e->d_name);
    closedir(d);
    return out[0] != 0;
}

#endif
