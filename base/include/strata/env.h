/* strata/env.h — file I/O through a table of functions, so storage tests run on an in-memory
 * env, a failing env (disk full, EIO on the Nth write) and a crash env that drops what was not
 * synced (LevelDB's fault-injection env, SQLite's crash VFS).
 *
 * Every call returns st_code: ST_NOT_FOUND for a missing file, ST_RESOURCE_EXHAUSTED for a full
 * disk (ENOSPC), ST_INTERNAL for other I/O errors, with the path and errno text in err. */
#ifndef STRATA_ENV_H
#define STRATA_ENV_H

#include "strata/base.h"

typedef struct st_env st_env;
typedef struct st_wfile st_wfile; /* append-only writable file */
typedef struct st_rfile st_rfile; /* random-access readable file, safe for concurrent preads */
typedef struct st_lock st_lock;   /* an exclusive lock on a file (lock / unlock below) */

/* Files and directories are created owner-only: the data is the users', not the machine's. */
#define ST_ENV_FILE_MODE 0600
#define ST_ENV_DIR_MODE 0700

typedef struct st_env_ops {
    /* Creates or truncates path for appending. */
    st_code (*wopen)(st_env *env, const char *path, st_wfile **out, st_err *err);
    /* Opens an existing file for appending at its end (log segments reopened after recovery). */
    st_code (*wopen_append)(st_env *env, const char *path, st_wfile **out, st_err *err);
    st_code (*append)(st_wfile *f, const void *data, size_t len, st_err *err);
    st_code (*sync)(st_wfile *f, st_err *err);   /* fdatasync: durable once this returns OK */
    st_code (*wclose)(st_wfile *f, st_err *err); /* closes without syncing; frees f always */

    st_code (*ropen)(st_env *env, const char *path, st_rfile **out, st_err *err);
    /* Reads up to len bytes at off; *got < len only at end of file. */
    st_code (*pread)(st_rfile *f, uint64_t off, void *buf, size_t len, size_t *got, st_err *err);
    st_code (*rsize)(st_rfile *f, uint64_t *size, st_err *err);
    void (*rclose)(st_rfile *f);

    st_code (*remove)(st_env *env, const char *path, st_err *err);
    st_code (*rename)(st_env *env, const char *from, const char *to, st_err *err); /* atomic */
    st_code (*link)(st_env *env, const char *from, const char *to, st_err *err);   /* hard link */
    st_code (*mkdirs)(st_env *env, const char *path, st_err *err); /* like mkdir -p */
    st_code (*sync_dir)(st_env *env, const char *path, st_err *err);
    st_code (*exists)(st_env *env, const char *path, bool *out, st_err *err);
    st_code (*file_size)(st_env *env, const char *path, uint64_t *size, st_err *err);
    /* Calls fn for each entry name (not . or ..) of dir; stops at the first non-OK return. */
    st_code (*list)(st_env *env, const char *dir, st_code (*fn)(const char *name, void *arg),
                    void *arg, st_err *err);
    void (*destroy)(st_env *env);
    /* Optional, NULL when the env has no such thing (added for the commit log). Reserves disk
     * space for a file just made by wopen, which must still be empty: its size becomes `bytes`
     * (zeros) while appends keep writing from its start, over the zeros. A sync after appends into
     * reserved space has no file size to record, which makes fdatasync cheaper. Readers of such a
     * file must tell the written part from the zeros themselves (the log's records are
     * checksummed). */
    st_code (*preallocate)(st_wfile *f, uint64_t bytes, st_err *err);
    /* Optional, NULL when the env has no such thing (added for the commit log). Opens an existing
     * file for writing at byte off, keeping its size and contents: appends overwrite it in place
     * from there (the log reuses a preallocated segment after its last record). ST_NOT_FOUND
     * when it does not exist. */
    st_code (*wopen_at)(st_env *env, const char *path, uint64_t off, st_wfile **out, st_err *err);
    /* Optional, NULL when the env has no such thing (added for the commit log's checkpoints).
     * Writes len bytes at byte off of a file opened by wopen or wopen_at, without moving the
     * position appends write at; the next sync makes them durable with the appends. Not for
     * files opened by wopen_append (ST_FAILED_PRECONDITION). */
    st_code (*pwrite)(st_wfile *f, uint64_t off, const void *data, size_t len, st_err *err);
    /* Optional, NULL when the env cannot lock. Takes an exclusive lock on path (created when
     * absent) and holds it until unlock: another lock of the same path, from another process or
     * from this one, fails with ST_FAILED_PRECONDITION and *holder_pid set to the holder's
     * process id (0 when unknown); the caller words the message (err says "locked by ..."). The
     * POSIX env uses flock on the file and on the directory holding it (so a removed lock file
     * does not free the lock; holder_pid is then 0) and writes the holder's pid into the file.
     * One lock per directory: a second path in the same directory is refused too. The lock goes
     * with the process, so a crash (kill -9) leaves nothing to clean up. The in-memory and fault
     * envs have none (their users are tests within one process). */
    st_code (*lock)(st_env *env, const char *path, st_lock **out, int64_t *holder_pid, st_err *err);
    void (*unlock)(st_lock *l); /* l may be NULL; the file stays */
    /* Optional, NULL when the env has no such thing (added for restored backups, which share
     * one file among tablets). The file's identity: two paths have the same (dev, ino) exactly
     * when they name the same file (hard links of it), while it exists. ST_NOT_FOUND when path
     * does not exist. */
    st_code (*file_id)(st_env *env, const char *path, uint64_t *dev, uint64_t *ino, st_err *err);
} st_env_ops;

struct st_env {
    const st_env_ops *ops;
};

/* Shared process-wide POSIX env; destroy is a no-op. */
st_env *st_env_posix(void);

/* In-memory env. With crash simulation, st_env_mem_crash() discards every byte appended since the
 * last sync of each file (and, when garble is true, replaces the unsynced tail with random bytes
 * of random length instead), and forgets files created or renamed since the last sync_dir of
 * their directory. Free with env->ops->destroy(env). */
st_env *st_env_mem_new(void);
void st_env_mem_crash(st_env *env, bool garble, uint64_t seed);

/* Wraps base and injects faults: after `ops_until_fail` more appends/syncs/wopens (counted
 * together), each such call fails with `code` (ST_RESOURCE_EXHAUSTED for disk full, ST_INTERNAL
 * for EIO) until st_env_fault_set is called again. ops_until_fail < 0 disables. */
st_env *st_env_fault_new(st_env *base);
void st_env_fault_set(st_env *env, int64_t ops_until_fail, st_code code);
uint64_t st_env_fault_count(st_env *env); /* how many calls failed so far */

/* "pid N" for a lock's holder_pid, or, for 0, that its lock file (which holds the pid) is gone:
 * the directory is locked too (POSIX env), so removing the file does not free the lock. */
const char *st_lock_holder_str(char *buf, size_t cap, int64_t pid);

/* Convenience wrappers (a whole file in, a whole file out atomically via tmp + rename + sync). */
st_code st_env_read_all(st_env *env, const char *path, st_buf *out, st_err *err);
st_code st_env_write_atomic(st_env *env, const char *path, const void *data, size_t len,
                            st_err *err);

#endif
