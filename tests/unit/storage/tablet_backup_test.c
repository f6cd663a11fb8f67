/* tablet_backup_test — proves the storage side of backups (docs/backups.md, "On a node"):
 *   - sto_tablet_backup links exactly the tablet's contents (memtable flushed first) into a
 *     directory, as hard links to the engine's own files; writes after it are not in the piece;
 *     a missing tablet is NOT_FOUND and a failed link leaves nothing behind;
 *   - sto_tablet_restore makes a tablet of those files restricted to its range; it survives a
 *     reopen; the restored files' system families (another table's change history) are hidden,
 *     also in split children and after a compaction, while history written after the restore is
 *     kept; a failed manifest write leaves no tablet and no file;
 *   - sto_tablets_restore makes many tablets with one manifest write: a spec that fails (a missing
 *     file, a used id) fails alone and leaves no file, the others are made, list one link of each
 *     file between them (as split children share files) and survive a reopen, after which a
 *     tablet restored from the same files shares them too; a failed manifest write fails them
 *     all and leaves no file;
 *   - links left by a restore that crashed before its manifest write are removed at open, and the
 *     open never touches a backups tree;
 *   - a freeze taken while a writer writes holds a prefix of its writes (each row whole, none
 *     missing before the last one in it). */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "db_impl.h"
#include "sto_test_util.h"

#define SYS ST_SLICE_LIT("\0changes")
#define V(n) STO_VERSION(1000000 + (n), 0)
#define MAX_FILES 64

typedef struct fixture {
    char dir[512], bk[600];
    sto_options o;
    sto_db *db;
    st_buf out;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    tu_small_options(&f->o);
    f->o.compaction_trigger = 100; /* only explicit compactions */
    f->o.write_stall_tables = 200;
    st_buf_init(&f->out);
    if (tu_db_open_fresh(f->dir, sizeof f->dir, "tablet_backup_test", &f->o, &f->db) != ST_OK)
        return -1;
    snprintf(f->bk, sizeof f->bk, "%s/backups/p0", f->dir);
    char mid[600];
    snprintf(mid, sizeof mid, "%s/backups", f->dir);
    mkdir(mid, 0700);
    mkdir(f->bk, 0700);
    st_err err;
    if (sto_tablet_create(f->db, 1, ST_SLICE_LIT("t"), ST_SLICE_LIT(""), ST_SLICE_LIT(""), NULL,
                          &err) != ST_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_db_close_rm(f->db, f->dir);
    st_buf_free(&f->out);
    free(f);
    return 0;
}

static void set_user(fixture *f, uint64_t t, const char *row, const char *val, uint64_t v) {
    assert_int_equal(tu_set(f->db, t, row, "cf", "q", 1000, val, V(v)), ST_OK);
}

static void set_sys(fixture *f, uint64_t t, const char *row, const char *qual, uint64_t v) {
    sto_mut m = tu_set_mut("x", qual, 7000, "rec");
    m.family = SYS;
    sto_row_mut r = tu_row(t, row, &m, 1, V(v));
    st_err err;
    assert_int_equal(sto_write(f->db, &r, 1, NULL, &err), ST_OK);
}

static const char *dump(fixture *f, uint64_t id, unsigned flags) {
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, id, &t), ST_OK);
    st_buf_reset(&f->out);
    sto_snapshot *s;
    st_err err;
    assert_int_equal(sto_snapshot_new(t, &s, &err), ST_OK);
    for (int reverse = 0; reverse < 2; reverse++) {
        sto_iter *it;
        assert_int_equal(sto_iter_new_flags(s, NULL, reverse, flags, &it, &err), ST_OK);
        sto_cell c;
        st_code rc;
        while ((rc = sto_iter_next(it, &c, &err)) == ST_OK)
            tu_append_cell(&f->out, &c);
        assert_int_equal(rc, ST_NOT_FOUND);
        sto_iter_free(it);
        st_buf_append(&f->out, "|", 1);
    }
    sto_snapshot_free(s);
    st_buf_append_byte(&f->out, 0);
    return (const char *)f->out.data;
}

/* Freezes tablet id into f->bk; paths (allocated) receive the linked files. */
static size_t backup(fixture *f, uint64_t id, char paths[MAX_FILES][700]) {
    sto_backup_file *files;
    size_t n;
    st_err err;
    assert_int_equal(sto_tablet_backup(f->db, id, f->bk, &files, &n, &err), ST_OK);
    assert_true(n <= MAX_FILES);
    for (size_t i = 0; i < n; i++) {
        snprintf(paths[i], 700, "%s/%020" PRIu64 ".sst", f->bk, files[i].number);
        struct stat a, b;
        char own[700];
        snprintf(own, sizeof own, "%s/sst/%020" PRIu64 ".sst", f->dir, files[i].number);
        assert_int_equal(stat(paths[i], &a), 0);
        assert_int_equal(stat(own, &b), 0);
        assert_true(a.st_ino == b.st_ino); /* a link, not a copy */
        assert_int_equal((uint64_t)a.st_size, files[i].bytes);
    }
    free(files);
    return n;
}

static void restore(fixture *f, uint64_t id, const char *start, const char *end,
                    char paths[MAX_FILES][700], size_t n) {
    const char *pv[MAX_FILES];
    for (size_t i = 0; i < n; i++)
        pv[i] = paths[i];
    st_err err;
    assert_int_equal(sto_tablet_restore(f->db, id, ST_SLICE_LIT("r"), st_slice_cstr(start),
                                        st_slice_cstr(end), pv, n, NULL, &err),
                     ST_OK);
}

#define FROZEN "a cf:q@1000=1\nb cf:q@1000=2\nc cf:q@1000=3\n"
#define FROZEN_R "c cf:q@1000=3\nb cf:q@1000=2\na cf:q@1000=1\n"

static void test_freeze_and_restore(void **state) {
    fixture *f = *state;
    set_user(f, 1, "a", "1", 1);
    st_err err;
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    set_user(f, 1, "b", "2", 2); /* in the memtable: the freeze flushes it */
    set_user(f, 1, "c", "3", 3);
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    assert_int_equal(n, 2);
    set_user(f, 1, "a", "changed", 4); /* after the freeze */
    set_user(f, 1, "d", "4", 5);
    assert_int_equal(sto_tablet_compact(f->db, 1, &err), ST_OK); /* the source moves on */
    restore(f, 2, "", "", paths, n);
    assert_string_equal(dump(f, 2, STO_ITER_USER), FROZEN "|" FROZEN_R "|");
    /* restricted to its range */
    restore(f, 3, "b", "c", paths, n);
    assert_string_equal(dump(f, 3, STO_ITER_USER), "b cf:q@1000=2\n|b cf:q@1000=2\n|");
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    assert_string_equal(dump(f, 2, STO_ITER_USER), FROZEN "|" FROZEN_R "|");
    /* the restored tablet takes writes; a newer version wins */
    set_user(f, 2, "a", "new", 10);
    assert_string_equal(dump(f, 2, STO_ITER_USER),
                        "a cf:q@1000=new\nb cf:q@1000=2\nc cf:q@1000=3\n|"
                        "c cf:q@1000=3\nb cf:q@1000=2\na cf:q@1000=new\n|");
}

static void test_errors(void **state) {
    fixture *f = *state;
    sto_backup_file *files = NULL;
    size_t n = 9;
    st_err err;
    assert_int_equal(sto_tablet_backup(f->db, 77, f->bk, &files, &n, &err), ST_NOT_FOUND);
    assert_null(files);
    assert_int_equal(n, 0);
    set_user(f, 1, "a", "1", 1);
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    set_user(f, 1, "b", "2", 2);
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    /* the second link collides with a file already there: nothing is left of this freeze */
    sto_tablet_info info;
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, 1, &t), ST_OK);
    sto_tablet_info_get(t, &info);
    assert_int_equal(info.sst_count, 2);
    char paths[MAX_FILES][700];
    size_t got = backup(f, 1, paths);
    assert_int_equal(got, 2);
    char junk[700];
    snprintf(junk, sizeof junk, "%s", paths[1]);
    remove(paths[0]); /* paths[1] stays: the next freeze links paths[0], then collides */
    assert_int_not_equal(sto_tablet_backup(f->db, 1, f->bk, &files, &n, &err), ST_OK);
    struct stat sb;
    assert_int_equal(stat(paths[0], &sb), -1); /* the link made before the collision is gone */
    /* a restore of a missing file makes nothing */
    const char *missing[1] = {"/nonexistent/x.sst"};
    assert_int_equal(sto_tablet_restore(f->db, 5, ST_SLICE_LIT("r"), ST_SLICE_LIT(""),
                                        ST_SLICE_LIT(""), missing, 1, NULL, &err),
                     ST_NOT_FOUND);
    assert_int_equal(sto_tablet_get(f->db, 5, &t), ST_NOT_FOUND);
    /* a tablet held read-only for damage is not backed up */
    sto_tablet_mark_read_only(t, ST_DATA_LOSS, "checksum mismatch in test.sst");
    assert_int_equal(sto_tablet_backup(f->db, 1, f->bk, &files, &n, &err), ST_DATA_LOSS);
    assert_non_null(strstr(err.msg, "checksum mismatch in test.sst"));
    assert_null(files);
    const char *one[1] = {junk};
    assert_int_equal(sto_tablet_restore(f->db, 1, ST_SLICE_LIT("r"), ST_SLICE_LIT(""),
                                        ST_SLICE_LIT(""), one, 1, NULL, &err),
                     ST_ALREADY_EXISTS);
}

#define SYS_R1 "r1 \\x00changes:q1@7000=rec\n"

static void test_system_families_hidden(void **state) {
    fixture *f = *state;
    set_user(f, 1, "r1", "u1", 1);
    set_sys(f, 1, "r1", "q1", 2);
    set_sys(f, 1, "r2", "q2", 3); /* a row with history only */
    set_user(f, 1, "r3", "u3", 4);
    st_err err;
    assert_int_equal(sto_tablet_flush(f->db, 1, &err), ST_OK);
    set_sys(f, 1, "r3", "q3", 5); /* in the memtable at the freeze */
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM), SYS_R1
                        "r2 \\x00changes:q2@7000=rec\nr3 \\x00changes:q3@7000=rec\n|"
                        "r3 \\x00changes:q3@7000=rec\nr2 \\x00changes:q2@7000=rec\n" SYS_R1 "|");
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    restore(f, 2, "", "", paths, n);
    const char *user = "r1 cf:q@1000=u1\nr3 cf:q@1000=u3\n|r3 cf:q@1000=u3\nr1 cf:q@1000=u1\n|";
    assert_string_equal(dump(f, 2, STO_ITER_USER), user);
    assert_string_equal(dump(f, 2, STO_ITER_SYSTEM), "||");
    assert_string_equal(dump(f, 2, STO_ITER_USER | STO_ITER_SYSTEM), user);
    /* history written after the restore is the restored table's own */
    set_sys(f, 2, "r1", "q1", 9);
    assert_string_equal(dump(f, 2, STO_ITER_SYSTEM), SYS_R1 "|" SYS_R1 "|");
    assert_int_equal(sto_tablet_flush(f->db, 2, &err), ST_OK);
    assert_string_equal(dump(f, 2, STO_ITER_SYSTEM), SYS_R1 "|" SYS_R1 "|");
    /* split children and a reopen keep the old history hidden, compactions drop it */
    assert_int_equal(sto_tablet_split(f->db, 2, ST_SLICE_LIT("r2"), 3, 4, &err), ST_OK);
    assert_string_equal(dump(f, 3, STO_ITER_SYSTEM), SYS_R1 "|" SYS_R1 "|");
    assert_string_equal(dump(f, 4, STO_ITER_SYSTEM), "||");
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    assert_string_equal(dump(f, 4, STO_ITER_SYSTEM), "||");
    assert_string_equal(dump(f, 4, STO_ITER_USER), "r3 cf:q@1000=u3\n|r3 cf:q@1000=u3\n|");
    assert_int_equal(sto_tablet_compact(f->db, 3, &err), ST_OK);
    assert_int_equal(sto_tablet_compact(f->db, 4, &err), ST_OK);
    assert_string_equal(dump(f, 3, STO_ITER_SYSTEM), SYS_R1 "|" SYS_R1 "|");
    assert_string_equal(dump(f, 4, STO_ITER_SYSTEM), "||");
    assert_string_equal(dump(f, 3, STO_ITER_USER), "r1 cf:q@1000=u1\n|r1 cf:q@1000=u1\n|");
    /* the source keeps its history */
    assert_string_equal(dump(f, 1, STO_ITER_SYSTEM), SYS_R1
                        "r2 \\x00changes:q2@7000=rec\nr3 \\x00changes:q3@7000=rec\n|"
                        "r3 \\x00changes:q3@7000=rec\nr2 \\x00changes:q2@7000=rec\n" SYS_R1 "|");
}

static int count_sst(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/sst", dir);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".sst") != NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_crash_leftovers(void **state) {
    fixture *f = *state;
    set_user(f, 1, "a", "1", 1);
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    assert_int_equal(n, 1);
    int before = count_sst(f->dir);
    /* what a restore killed before its manifest write leaves: a link nothing lists */
    char orphan[700];
    snprintf(orphan, sizeof orphan, "%s/sst/%020d.sst", f->dir, 999999);
    assert_int_equal(link(paths[0], orphan), 0);
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    assert_int_equal(count_sst(f->dir), before);
    struct stat sb;
    assert_int_equal(stat(paths[0], &sb), 0); /* the backups tree is not the engine's */
    assert_int_equal(sb.st_nlink, 2);
}

/* The fixture's db opened again over a fault env (*o: its options), for a manifest write made to
 * fail: the env, which reopen_without_fault destroys. */
static st_env *reopen_with_fault(fixture *f, sto_options *o) {
    sto_db_close(f->db);
    st_env *fault = st_env_fault_new(st_env_posix());
    *o = f->o;
    o->env = fault;
    st_err err;
    assert_int_equal(sto_db_open(f->dir, o, &f->db, &err), ST_OK);
    return fault;
}

static void reopen_without_fault(fixture *f, st_env *fault) {
    sto_db_close(f->db);
    fault->ops->destroy(fault);
    st_err err;
    assert_int_equal(sto_db_open(f->dir, &f->o, &f->db, &err), ST_OK);
}

static void test_failed_manifest_write(void **state) {
    fixture *f = *state;
    set_user(f, 1, "a", "1", 1);
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    sto_options o;
    st_env *fault = reopen_with_fault(f, &o);
    st_err err;
    int before = count_sst(f->dir);
    st_env_fault_set(fault, 0, ST_INTERNAL);
    const char *pv[1] = {paths[0]};
    assert_int_not_equal(sto_tablet_restore(f->db, 2, ST_SLICE_LIT("r"), ST_SLICE_LIT(""),
                                            ST_SLICE_LIT(""), pv, n, NULL, &err),
                         ST_OK);
    st_env_fault_set(fault, -1, ST_OK);
    sto_tablet *t;
    assert_int_equal(sto_tablet_get(f->db, 2, &t), ST_NOT_FOUND);
    assert_int_equal(count_sst(f->dir), before);
    assert_int_equal(tu_db_reopen(f->dir, &o, &f->db), ST_OK);
    assert_int_equal(sto_tablet_get(f->db, 2, &t), ST_NOT_FOUND);
    reopen_without_fault(f, fault);
}

/* ---- many tablets in one batch ---- */

#define BATCH 40

static void test_batch_restore(void **state) {
    fixture *f = *state;
    set_user(f, 1, "k05", "5", 1);
    set_user(f, 1, "k30", "30", 2);
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    const char *pv[MAX_FILES], *missing[1] = {"/nonexistent/00000000000000000001.sst"};
    for (size_t i = 0; i < n; i++)
        pv[i] = paths[i];
    int before = count_sst(f->dir);
    sto_restore_spec v[BATCH];
    char keys[BATCH + 1][8];
    for (int i = 0; i <= BATCH; i++)
        snprintf(keys[i], sizeof keys[i], "k%02d", i);
    for (int i = 0; i < BATCH; i++)
        v[i] = (sto_restore_spec){.id = 100 + (uint64_t)i,
                                  .table = ST_SLICE_LIT("r"),
                                  .start = st_slice_cstr(i ? keys[i] : ""),
                                  .end = st_slice_cstr(i < BATCH - 1 ? keys[i + 1] : ""),
                                  .paths = pv,
                                  .n_paths = n};
    v[7].paths = missing; /* fails alone */
    v[7].n_paths = 1;
    v[9].id = 1; /* a used id: fails alone */
    sto_tablets_restore(f->db, v, BATCH);
    for (int i = 0; i < BATCH; i++)
        assert_int_equal(v[i].rc, i == 7 ? ST_NOT_FOUND : i == 9 ? ST_ALREADY_EXISTS : ST_OK);
    assert_non_null(strstr(v[7].err.msg, "No such file"));
    /* the tablets share each file, as split children do: one link of it, not one per tablet */
    assert_int_equal(count_sst(f->dir), before + (int)n);
    assert_int_equal(tu_db_reopen(f->dir, &f->o, &f->db), ST_OK);
    sto_tablet *t;
    for (int i = 0; i < BATCH; i++)
        assert_int_equal(sto_tablet_get(f->db, 100 + (uint64_t)i, &t),
                         i == 7 || i == 9 ? ST_NOT_FOUND : ST_OK);
    /* after a restart too: the engine finds the restored files again at open */
    assert_int_equal(sto_tablet_restore(f->db, 200, ST_SLICE_LIT("r2"), ST_SLICE_LIT(""),
                                        ST_SLICE_LIT(""), pv, n, NULL, NULL),
                     ST_OK);
    assert_int_equal(count_sst(f->dir), before + (int)n);
    assert_string_equal(dump(f, 105, STO_ITER_USER), "k05 cf:q@1000=5\n|k05 cf:q@1000=5\n|");
    assert_string_equal(dump(f, 130, STO_ITER_USER), "k30 cf:q@1000=30\n|k30 cf:q@1000=30\n|");
    assert_string_equal(dump(f, 106, STO_ITER_USER), "||");
}

static void test_batch_failed_manifest_write(void **state) {
    fixture *f = *state;
    set_user(f, 1, "a", "1", 1);
    char paths[MAX_FILES][700];
    size_t n = backup(f, 1, paths);
    sto_options o;
    st_env *fault = reopen_with_fault(f, &o);
    int before = count_sst(f->dir);
    const char *pv[MAX_FILES];
    for (size_t i = 0; i < n; i++)
        pv[i] = paths[i];
    sto_restore_spec v[3];
    const char *bounds[4] = {"", "b", "c", ""};
    for (int i = 0; i < 3; i++)
        v[i] = (sto_restore_spec){.id = 2 + (uint64_t)i,
                                  .table = ST_SLICE_LIT("r"),
                                  .start = st_slice_cstr(bounds[i]),
                                  .end = st_slice_cstr(bounds[i + 1]),
                                  .paths = pv,
                                  .n_paths = n};
    st_env_fault_set(fault, 0, ST_INTERNAL);
    sto_tablets_restore(f->db, v, 3);
    st_env_fault_set(fault, -1, ST_OK);
    sto_tablet *t;
    for (int i = 0; i < 3; i++) {
        assert_int_not_equal(v[i].rc, ST_OK);
        assert_null(v[i].out);
        assert_int_equal(sto_tablet_get(f->db, 2 + (uint64_t)i, &t), ST_NOT_FOUND);
    }
    assert_int_equal(count_sst(f->dir), before);
    assert_int_equal(tu_db_reopen(f->dir, &o, &f->db), ST_OK);
    assert_int_equal(sto_tablet_get(f->db, 3, &t), ST_NOT_FOUND);
    reopen_without_fault(f, fault);
}

/* ---- a freeze under writes ---- */

#define SEQ_ROWS 3000

typedef struct writer {
    fixture *f;
} writer;

static void *write_seq(void *arg) {
    writer *w = arg;
    for (int i = 0; i < SEQ_ROWS; i++) {
        char row[16], val[16];
        snprintf(row, sizeof row, "k%05d", i);
        snprintf(val, sizeof val, "%d", i);
        sto_mut m[2] = {tu_set_mut("cf", "a", 1000, val), tu_set_mut("cf", "b", 1000, val)};
        sto_row_mut r = tu_row(1, row, m, 2, V(i + 1));
        st_err err;
        if (sto_write(w->f->db, &r, 1, NULL, &err) != ST_OK)
            break;
    }
    return NULL;
}

/* Rows of tablet id are k00000..k(n-1), each with both cells: returns n, or -1. */
static int prefix_len(fixture *f, uint64_t id) {
    assert_int_equal(tu_dump(f->db, id, &f->out), ST_OK);
    int n = 0;
    const char *p = (const char *)f->out.data;
    char want[128];
    while (*p) {
        snprintf(want, sizeof want, "k%05d cf:a@1000=%d\nk%05d cf:b@1000=%d\n", n, n, n, n);
        if (strncmp(p, want, strlen(want)) != 0)
            return -1;
        p += strlen(want);
        n++;
    }
    return n;
}

static void test_freeze_under_writes(void **state) {
    fixture *f = *state;
    writer w = {f};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_seq, &w), 0);
    uint64_t id = 100;
    int last = 0;
    for (int round = 0; round < 6; round++) {
        snprintf(f->bk, sizeof f->bk, "%s/backups/p%d", f->dir, round + 1);
        mkdir(f->bk, 0700);
        char paths[MAX_FILES][700];
        size_t n = backup(f, 1, paths);
        restore(f, id, "", "", paths, n);
        int got = prefix_len(f, id);
        assert_true(got >= last); /* each piece is a prefix of the writes, never shrinking */
        last = got;
        id++;
    }
    pthread_join(th, NULL);
    assert_int_equal(prefix_len(f, 1), SEQ_ROWS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_freeze_and_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_system_families_hidden, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_leftovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_manifest_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_failed_manifest_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_freeze_under_writes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
