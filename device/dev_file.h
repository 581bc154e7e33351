/* dev_file.h - whole-file reads and atomic whole-file writes for the data
 * tools (vocabularies, corpora, shards). */
#ifndef DEV_FILE_H
#define DEV_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

/* Reads all of `path` into a fresh buffer (NUL-terminated, *len excludes the
 * NUL). Refuses files larger than max_bytes. Free with free(). */
int dev_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len, sl_err *err);

/* Writes the pieces to path.tmp, fsyncs and renames it over path, so a
 * reader never sees half a file. */
typedef struct dev_iov {
    const void *p;
    size_t n;
} dev_iov;
int dev_write_file_atomic(const char *path, const dev_iov *parts, int nparts, sl_err *err);

#endif
