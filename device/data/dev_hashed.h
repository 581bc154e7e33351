/* dev_hashed.h - a file written piece by piece, atomically (sl_atomic), with
 * a BLAKE2b-256 of everything written appended at the end: the trailer of
 * optim.bin (dev_ckpt.c) and of shards (dev_shard.c). */
#ifndef DEV_HASHED_H
#define DEV_HASHED_H

#include <sodium.h>

#include "sl_file.h"

#define DEV_HASHED_SUM 32

typedef struct dev_hashed {
    sl_atomic a;
    crypto_generichash_state h;
} dev_hashed;

static inline int dev_hashed_open(dev_hashed *o, const char *path, sl_err *err)
{
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "libsodium failed to initialise");
    if (sl_atomic_open(&o->a, path, err))
        return -1;
    crypto_generichash_init(&o->h, NULL, 0, DEV_HASHED_SUM);
    return 0;
}

static inline void dev_hashed_write(dev_hashed *o, const void *p, size_t n)
{
    crypto_generichash_update(&o->h, p, n);
    sl_atomic_write(&o->a, p, n);
}

/* Appends the sum and commits (fsync, rename); releases o either way. */
static inline int dev_hashed_commit(dev_hashed *o, sl_err *err)
{
    uint8_t sum[DEV_HASHED_SUM];
    crypto_generichash_final(&o->h, sum, sizeof sum);
    sl_atomic_write(&o->a, sum, sizeof sum);
    return sl_atomic_commit(&o->a, err);
}

#endif
