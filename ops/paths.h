/* paths.h — file-system paths the `strata` commands share (paths.c): where the Strata binaries
 * are, and instance directories made absolute so that every command, whatever its working
 * directory, names the same files the same way; and which process listens on a port. */
#ifndef OPS_PATHS_H
#define OPS_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* True when path is a regular file this process may execute. */
bool ops_executable(const char *path);
/* The first executable name in $PATH's directories, into out. */
bool ops_path_search(const char *name, char *out, size_t cap);
/* A Strata binary (name, e.g. "strata-node", built in folder sub, e.g. "node"), into out: in
 * bin_dir when given (and only there); else in the build tree next to this binary
 * (<build>/ops/strata -> <build>/<sub>/<name>); else beside this binary (an install); else in
 * $PATH. False when none is executable. */
bool ops_bin_find(const char *bin_dir, const char *sub, const char *name, char *out, size_t cap);
/* path made absolute (relative to the working directory) and normalised lexically: "." and empty
 * components dropped, ".." removing the one before, no trailing '/' (symbolic links are kept, so
 * the directory need not exist yet). False when the working directory is unknown or the result
 * does not fit in cap. */
bool ops_path_absolute(const char *path, char *out, size_t cap);

/* Modes of what the `strata` commands create in an instance directory: owner-only, like the
 * node's data files (topology, logs, pid files; the directory itself). */
#define OPS_FILE_MODE 0600
#define OPS_DIR_MODE 0700
/* fopen(path, "w") creating the file owner-only (an existing file keeps its mode). */
FILE *ops_fopen_private(const char *path);

/* Processes holding a TCP socket listening on this port (from /proc/net/tcp{,6} and the
 * /proc/PID/fd links we may read; listeners.c). Returns how many were stored in pids (at most
 * max); 0 also when /proc tells nothing. */
size_t ops_proc_find_listeners(uint16_t port, pid_t *pids, size_t max);

#endif
