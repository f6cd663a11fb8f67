/* ops/auth.c — `strata auth`: edits a router's auth file (strata/auth.h). A new token is printed
 * once and only its hash is stored; strata-router picks the change up within a second (it
 * watches the file) or at SIGHUP. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "instance.h"
#include "strata/auth.h"

st_code ops_auth_bootstrap(const char *secure_dir, st_err *err) {
    static const st_role roles[] = {ST_ROLE_ADMIN, ST_ROLE_WRITER, ST_ROLE_READER};
    st_auth_db db;
    st_auth_db_init(&db);
    st_buf tokens;
    st_buf_init(&tokens);
    st_code rc = ST_OK;
    for (size_t i = 0; i < 3 && rc == ST_OK; i++) {
        char tok[ST_AUTH_TOKEN_LEN + 1];
        uint8_t hash[ST_AUTH_HASH_BYTES];
        const char *name = st_auth_role_name(roles[i]);
        rc = st_auth_token_new(tok, sizeof tok, hash, err);
        if (rc == ST_OK)
            rc = st_auth_principal_add(&db, name, hash, err);
        if (rc == ST_OK)
            rc = st_auth_grant_add(&db, name, roles[i], "", err);
        char line[ST_AUTH_TOKEN_LEN + 16];
        snprintf(line, sizeof line, "%s %s\n", name, tok);
        if (rc == ST_OK && st_buf_append(&tokens, line, strlen(line)) != ST_OK)
            rc = st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory");
    }
    char path[4096];
    if (rc == ST_OK) {
        snprintf(path, sizeof path, "%s/%s", secure_dir, OPS_AUTH_PRINCIPALS_FILE);
        rc = st_auth_save(path, &db, err);
    }
    if (rc == ST_OK) {
        snprintf(path, sizeof path, "%s/%s", secure_dir, OPS_AUTH_TOKENS_FILE);
        rc = st_auth_write_file(path, st_buf_slice(&tokens), err);
    }
    if (tokens.data)
        memset(tokens.data, 0, tokens.cap); /* no token left behind in freed memory */
    st_buf_free(&tokens);
    st_auth_db_free(&db);
    return rc;
}

/* ---- strata auth ---- */

static void usage(FILE *out) {
    fputs("usage: strata auth COMMAND [--file FILE | --dir DIR] ...\n"
          "  add-principal NAME          a new principal; prints its token (shown only once)\n"
          "  rotate NAME                 a new token for NAME; the old one stops working when\n"
          "                              the router reloads the file (within a second)\n"
          "  remove NAME                 deletes the principal and its grants\n"
          "  grant NAME ROLE [--table T] ROLE: reader, writer or admin, on the instance or on\n"
          "                              table T only\n"
          "  revoke NAME [--table T]     removes that grant\n"
          "  list                        principals and their grants (never tokens)\n"
          "FILE is the router's --auth-file; --dir DIR means DIR/secure/principals (the file of\n"
          "`strata up --secure`; DIR defaults as for strata up). A missing FILE is created.\n"
          "See docs/security.md.\n",
          out);
}

typedef struct auth_args {
    const char *cmd, *name, *role, *table, *file, *dir;
    char path[OPS_PATH_MAX];
    char tokens[OPS_PATH_MAX]; /* with --dir: DIR/secure/tokens, which the --dir tools read */
} auth_args;

/* 0 when fine, 2 for bad usage (said on stderr). */
static int args_parse(int argc, char **argv, auth_args *a) {
    const char **pos[] = {&a->cmd, &a->name, &a->role};
    size_t n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--file") && v)
            a->file = argv[++i];
        else if (!strcmp(argv[i], "--dir") && v)
            a->dir = argv[++i];
        else if (!strcmp(argv[i], "--table") && v)
            a->table = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return usage(stdout), -1;
        else if (argv[i][0] != '-' && n_pos < 3)
            *pos[n_pos++] = argv[i];
        else {
            fprintf(stderr, "strata auth: unexpected '%s'\n", argv[i]);
            return usage(stderr), 2;
        }
    }
    if (!a->cmd)
        return usage(stderr), 2;
    if (a->file)
        return snprintf(a->path, sizeof a->path, "%s", a->file) < (int)sizeof a->path ? 0 : 2;
    char dir[OPS_PATH_MAX];
    if (!ops_inst_dir(a->dir, dir, sizeof dir) ||
        !ops_fmt(a->path, sizeof a->path, "%s/secure/%s", dir, OPS_AUTH_PRINCIPALS_FILE) ||
        !ops_fmt(a->tokens, sizeof a->tokens, "%s/secure/%s", dir, OPS_AUTH_TOKENS_FILE))
        return 2;
    return 0;
}

static int do_list(const st_auth_db *db) {
    for (size_t i = 0; i < db->n_principals; i++) {
        const char *name = db->principals[i].name;
        printf("%s", name);
        int n = 0;
        for (size_t j = 0; j < db->n_grants; j++) {
            const st_auth_grant *g = &db->grants[j];
            if (strcmp(g->principal, name))
                continue;
            printf("%s %s on %s%s", n++ ? "," : "", st_auth_role_name(g->role),
                   g->table[0] ? "table " : "the instance", g->table);
        }
        printf("%s\n", n ? "" : " (no role)");
    }
    return 0;
}

/* After a rotate with --dir: NAME's line in DIR/secure/tokens (if it has one) gets the new token.
 * `strata backup`, `status`, `bench` and `chaos` with --dir send the admin token from that file,
 * so leaving the old one there locked them out of the instance at the router's next reload. */
static st_code tokens_update(const char *path, const char *name, const char *tok, st_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return ST_OK; /* no tokens file: nothing reads the token from there */
    st_buf out;
    st_buf_init(&out);
    char line[512];
    bool found = false, ok = true;
    size_t nlen = strlen(name);
    while (ok && fgets(line, sizeof line, f)) {
        bool mine = !strncmp(line, name, nlen) && line[nlen] == ' ';
        if (mine)
            snprintf(line, sizeof line, "%s %s\n", name, tok);
        found |= mine;
        ok = st_buf_append(&out, line, strlen(line)) == ST_OK;
    }
    fclose(f);
    st_code rc = !ok     ? st_err_set(err, ST_RESOURCE_EXHAUSTED, "out of memory")
                 : found ? st_auth_write_file(path, st_buf_slice(&out), err)
                         : ST_OK;
    if (out.data)
        memset(out.data, 0, out.cap); /* no token left behind in freed memory */
    memset(line, 0, sizeof line);
    st_buf_free(&out);
    return rc;
}

/* add-principal and rotate: a new token, printed once. */
static st_code do_token(st_auth_db *db, const auth_args *a, bool add, st_err *err) {
    char tok[ST_AUTH_TOKEN_LEN + 1];
    uint8_t hash[ST_AUTH_HASH_BYTES];
    st_code rc = st_auth_token_new(tok, sizeof tok, hash, err);
    if (rc == ST_OK)
        rc = add ? st_auth_principal_add(db, a->name, hash, err)
                 : st_auth_principal_rehash(db, a->name, hash, err);
    if (rc == ST_OK)
        rc = st_auth_save(a->path, db, err);
    if (rc == ST_OK && !add && a->tokens[0])
        rc = tokens_update(a->tokens, a->name, tok, err);
    if (rc == ST_OK)
        printf("%s\n", tok);
    memset(tok, 0, sizeof tok);
    return rc;
}

static st_code run_cmd(st_auth_db *db, const auth_args *a, bool *changed, st_err *err) {
    const char *c = a->cmd;
    bool needs_name = strcmp(c, "list") != 0;
    if (needs_name && !a->name)
        return st_err_set(err, ST_INVALID_ARGUMENT, "strata auth %s needs a principal NAME", c);
    if (!strcmp(c, "add-principal") || !strcmp(c, "rotate"))
        return do_token(db, a, c[0] == 'a', err);
    *changed = true;
    if (!strcmp(c, "remove"))
        return st_auth_principal_remove(db, a->name, err);
    if (!strcmp(c, "grant")) {
        st_role role = st_auth_role_parse(a->role);
        if (role == ST_ROLE_NONE)
            return st_err_set(err, ST_INVALID_ARGUMENT,
                              "strata auth grant NAME ROLE: ROLE is reader, writer or admin");
        return st_auth_grant_add(db, a->name, role, a->table, err);
    }
    if (!strcmp(c, "revoke"))
        return st_auth_grant_remove(db, a->name, a->table, err);
    *changed = false;
    if (!strcmp(c, "list"))
        return do_list(db) == 0 ? ST_OK : ST_INTERNAL;
    return st_err_set(err, ST_INVALID_ARGUMENT,
                      "unknown command '%.40s': use add-principal, rotate, remove, grant, revoke "
                      "or list",
                      c);
}

#define AUTH_LOCK_WAIT_MS 30000 /* another `strata auth` holds it for milliseconds */
#define AUTH_LOCK_POLL_MS 50
#define AUTH_LOCK_SAY_MS 1000 /* a wait this long is said, so a stuck holder is visible */

/* Every change loads the whole file, edits it and saves it over the old one: two commands at
 * once would each save their own edit over the other's (a revoked principal back in force, a
 * printed token never saved). So a change holds an exclusive flock of FILE.lock from load to
 * save. Not FILE itself: the save renames a new file over it, which another command would then
 * lock while this one still holds the old inode. FILE.lock stays (removing it would reopen that
 * race). auth_lock returns the descriptor, or -1 with err set. */
static st_code auth_lock_wait(int fd, const char *path, const char *lock, st_err *err) {
    struct timespec nap = {0, AUTH_LOCK_POLL_MS * 1000000L};
    for (int ms = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; ms += AUTH_LOCK_POLL_MS) {
        if (errno != EWOULDBLOCK && errno != EINTR)
            return st_err_set(err, ST_INTERNAL, "cannot lock %s: %s", lock, strerror(errno));
        if (ms >= AUTH_LOCK_WAIT_MS)
            return st_err_set(err, ST_UNAVAILABLE,
                              "another `strata auth` has held %s for %d s; nothing was changed: "
                              "try again when it is done",
                              lock, AUTH_LOCK_WAIT_MS / 1000);
        if (ms == AUTH_LOCK_SAY_MS)
            fprintf(stderr, "strata auth: waiting for another `strata auth` on %s...\n", path);
        nanosleep(&nap, NULL);
    }
    return ST_OK;
}

static int auth_lock(const char *path, st_err *err) {
    char lock[OPS_PATH_MAX + 8];
    if (!ops_fmt(lock, sizeof lock, "%s.lock", path)) {
        st_err_set(err, ST_INVALID_ARGUMENT, "path too long: %.200s", path);
        return -1;
    }
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        st_err_set(err, ST_INTERNAL, "cannot open %s: %s", lock, strerror(errno));
        return -1;
    }
    if (auth_lock_wait(fd, path, lock, err) == ST_OK)
        return fd;
    close(fd);
    return -1;
}

int ops_auth_main(int argc, char **argv) {
    auth_args a = {0};
    int urc = args_parse(argc, argv, &a);
    if (urc != 0)
        return urc < 0 ? 0 : urc;
    st_auth_db db;
    st_auth_db_init(&db);
    st_err err = {0};
    /* list reads one file, which a save replaces whole (renamed over it): no lock needed. */
    int lock_fd = strcmp(a.cmd, "list") ? auth_lock(a.path, &err) : -2;
    st_code rc = lock_fd == -1 ? err.code : st_auth_load(a.path, &db, &err);
    if (rc == ST_NOT_FOUND) /* a first principal creates the file */
        rc = ST_OK;
    bool changed = false;
    if (rc == ST_OK)
        rc = run_cmd(&db, &a, &changed, &err);
    if (rc == ST_OK && changed)
        rc = st_auth_save(a.path, &db, &err);
    if (lock_fd >= 0)
        close(lock_fd); /* after the save: the next command loads what this one saved */
    st_auth_db_free(&db);
    if (rc != ST_OK) {
        fprintf(stderr, "strata auth: %s\n", err.msg);
        return rc == ST_INVALID_ARGUMENT ? 2 : 1;
    }
    return 0;
}
