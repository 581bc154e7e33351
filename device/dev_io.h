/* dev_io.h - whole-file reads with a size limit and atomic file writes
 * (temp file in the same directory, fsync, rename, fsync of the directory),
 * so a crash leaves either the old file or the new one, never a torn one. */
#ifndef DEV_IO_H
#define DEV_IO_H

#include <stddef.h>
#include <stdio.h>

#include "sl_err.h"

/* Reads the whole file (NUL-terminated, *n excludes the NUL); refuses files
 * larger than max bytes. Free *out with free(). */
int dev_read_file(const char *path, size_t max, char **out, size_t *n, sl_err *err);

typedef struct dev_atomic {
    FILE *f;
    char *path, *tmp;
    int failed;
} dev_atomic;

int dev_atomic_open(dev_atomic *a, const char *path, sl_err *err);
/* Buffered write; errors are remembered and reported by commit. */
void dev_atomic_write(dev_atomic *a, const void *p, size_t n);
/* fflush + fsync + rename + directory fsync; on any failure removes the temp
 * file and returns -1. Always releases a. */
int dev_atomic_commit(dev_atomic *a, sl_err *err);
void dev_atomic_abort(dev_atomic *a);
int dev_write_atomic(const char *path, const void *data, size_t n, sl_err *err);
/* mkdir -p for one level (exists is fine). */
int dev_mkdir(const char *path, sl_err *err);

#endif
