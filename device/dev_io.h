/* dev_io.h - streaming atomic file writes (temp file in the same directory,
 * fsync, rename, fsync of the directory), so a crash leaves either the old
 * file or the new one, never a torn one. For checkpoints, which are written
 * tensor by tensor rather than built in memory (dev_file.h has the
 * whole-buffer variant and whole-file reads). */
#ifndef DEV_IO_H
#define DEV_IO_H

#include <stddef.h>
#include <stdio.h>

#include "sl_err.h"

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
/* mkdir -p for one level (exists is fine). */
int dev_mkdir(const char *path, sl_err *err);

#endif
