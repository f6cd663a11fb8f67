/* tu_tmp.h — temporary directories for tests, shared by the storage test helpers
 * (sto_test_util.h) and the client library (btclient.c): a fresh directory per call under
 * $STRATA_TEST_TMP (or /tmp), and recursive removal. Header-only. */
#ifndef TU_TMP_H
#define TU_TMP_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static inline int tu_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Removes a directory tree (best effort). */
static inline void tu_rmrf(const char *path) {
    nftw(path, tu_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh empty directory under $STRATA_TEST_TMP (or /tmp) named after the test, the pid and a
 * counter of this translation unit's calls. */
static inline void tu_tmpdir(char *out, size_t cap, const char *name) {
    static int counter; /* per process; tests call this from one thread */
    const char *base = getenv("STRATA_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(out, cap, "%s/%s-%d-%d", base, name, (int)getpid(), counter++);
    tu_rmrf(out);
    mkdir(out, 0755);
}

#endif
