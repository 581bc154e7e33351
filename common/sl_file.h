/* sl_file.h - whole-file reads and crash-safe file writes.
 *
 * Writes go to a temporary file in the same directory, are fsynced, renamed
 * over the target and the directory fsynced, so a crash leaves either the old
 * file or the new one, never a torn one. */
#ifndef SL_FILE_H
#define SL_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <sys/types.h>

#include "sl_err.h"

/* Reads all of `path` into a fresh buffer (NUL-terminated, *len excludes the
 * NUL). Refuses non-regular files and files larger than max_bytes. Free with
 * free(). */
int sl_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len, sl_err *err);

/* Streaming atomic write, for files written piece by piece (checkpoints).
 * The file is created 0644 (or tighter, under a stricter umask) whatever
 * the umask allows. */
typedef struct sl_atomic {
    FILE *f;
    char *path, *tmp;
    int failed;
} sl_atomic;

int sl_atomic_open(sl_atomic *a, const char *path, sl_err *err);
/* Buffered write; errors are remembered and reported by commit. */
void sl_atomic_write(sl_atomic *a, const void *p, size_t n);
/* fflush + fsync + rename + directory fsync; on any failure removes the temp
 * file and returns -1. Always releases a. */
int sl_atomic_commit(sl_atomic *a, sl_err *err);
void sl_atomic_abort(sl_atomic *a);

/* The whole buffer, atomically. */
int sl_write_file_atomic(const char *path, const void *p, size_t n, sl_err *err);

/* mkdir for one level with `mode` (0700 for private state, 0755 otherwise);
 * an existing directory is fine, anything else by that name is an error. */
int sl_mkdir(const char *path, mode_t mode, sl_err *err);

/* Writes all n bytes at offset off (retrying short writes and EINTR); -1
 * with errno set (ENOSPC for a write that made no progress). */
int sl_pwrite_all(int fd, const void *p, size_t n, off_t off);

/* A directory that holds secrets (keys, state): made 0700 if missing; an
 * existing one that group or others may use is set to 0700. Returns 1 when
 * it changed the mode (the old one in *old_mode, for the caller to say so),
 * 0 when nothing changed, -1 on error (a file by that name, not ours). */
int sl_private_dir(const char *path, mode_t *old_mode, sl_err *err);

/* Takes the lock file `path` (flock, released when fd is closed or the
 * process ends) and writes this process's pid in it, so that one process
 * at a time owns what it guards. A lock another process holds is refused
 * (SL_ESTATE) as "WHAT is in use by another WHO (pid P) (it holds PATH)". */
int sl_lock_file(const char *path, const char *what, const char *who, int *fd_out, sl_err *err);

#endif
