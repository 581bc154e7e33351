/* dev_safetensors.h - the safetensors file format (Hugging Face): an 8-byte
 * little-endian header length, a JSON header
 *   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [b, e]}, ...,
 *    "__metadata__": {"format": "pt"}}
 * and the tensor bytes (offsets relative to the end of the header).
 * Every length and offset is checked against the file before use: the
 * tensors must cover the data exactly (no overlap, no gap, no trailing
 * bytes) and __metadata__ must be an object of strings. Tensors are read
 * with pread, one at a time, so a large file is never held twice. */
#ifndef DEV_SAFETENSORS_H
#define DEV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

enum dev_st_dtype { DEV_ST_F32 = 0, DEV_ST_F16, DEV_ST_BF16, DEV_ST_OTHER };

#define DEV_ST_MAXDIM 8
typedef struct dev_st_tensor {
    char *name;
    int dtype;
    char dtype_name[16];
    int ndim;
    int64_t shape[DEV_ST_MAXDIM];
    uint64_t numel;
    uint64_t offset, nbytes; /* absolute offset in the file */
} dev_st_tensor;

typedef struct dev_st dev_st;

dev_st *dev_st_open(const char *path, sl_err *err);
void dev_st_close(dev_st *st);
int dev_st_count(const dev_st *st);
const dev_st_tensor *dev_st_at(const dev_st *st, int i);
const dev_st_tensor *dev_st_find(const dev_st *st, const char *name);
/* 1 if the file is one of ours (it has checksums or "skyloom." metadata):
 * then every tensor read whole is verified against its BLAKE2b, and a
 * tensor without one is refused. 0: a file from elsewhere, read unchecked. */
int dev_st_checked(const dev_st *st);
/* Reads `count` elements starting at element `first` of the tensor into dst
 * as float (F16 and BF16 are widened). */
int dev_st_read_f32(dev_st *st, const dev_st_tensor *t, uint64_t first, size_t count, float *dst,
                    sl_err *err);

/* One tensor to write (F32, contiguous rows). */
typedef struct dev_st_out {
    char name[128];
    int ndim;
    int64_t shape[2];
    const float *data;
} dev_st_out;
/* Writes the file atomically (temp, fsync, rename). meta: NULL or a
 * NULL-terminated list of key, value strings added to __metadata__. */
int dev_st_write(const char *path, const dev_st_out *t, int n, const char *const *meta,
                 sl_err *err);
/* A __metadata__ string, or NULL. */
const char *dev_st_meta(const dev_st *st, const char *key);

#endif
