/* fuzz_util.h - what the file-reading fuzz targets share: a private
 * temporary directory (removed at exit), writing an input to a file in it,
 * re-signing a BLAKE2b trailer so that the checks behind a checksum are
 * reached, and REQUIRE for properties (a broken one aborts, which libFuzzer
 * reports as a crash). */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sl_log.h"

#define REQUIRE(c) REQUIREF(c, "%s", "")
#define REQUIREF(c, ...)                                                                \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s: property failed at line %d: %s\n", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            abort();                                                                    \
        }                                                                               \
    } while (0)

static char fu_root[128];

static inline int fu_rm(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static inline void fu_cleanup(void)
{
    if (fu_root[0])
        nftw(fu_root, fu_rm, 16, FTW_DEPTH | FTW_PHYS);
}

__attribute__((noreturn)) static inline void fu_die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz setup: %s: %s\n", what, msg);
    abort();
}

/* The directory of this process (made on first use) and a path in it. */
static inline const char *fu_path(const char *name)
{
    static char buf[4][256];
    static int k;
    if (!fu_root[0]) {
        sl_log_set_level(SL_LOG_OFF);
        if (sodium_init() < 0)
            fu_die("sodium_init", "failed");
        snprintf(fu_root, sizeof fu_root, "/tmp/skyloom-fuzz-XXXXXX");
        if (!mkdtemp(fu_root))
            fu_die("mkdtemp", "failed");
        atexit(fu_cleanup);
    }
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", fu_root, name);
    return b;
}

static inline void fu_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n))
        fu_die("write", path);
    fclose(f);
}

/* Overwrites the last `sum` bytes of buf[0..n) with the BLAKE2b of the rest. */
static inline void fu_resign(uint8_t *buf, size_t n, size_t sum)
{
    if (n >= sum)
        crypto_generichash(buf + n - sum, sum, buf, n - sum, NULL, 0);
}

/* A copy of base with the input written over it: the first two input bytes
 * say where (modulo the length), the rest is what. For inputs that must stay
 * close to a valid file to get past its first checks. */
static inline uint8_t *fu_overwrite(const uint8_t *base, size_t n, const uint8_t *in, size_t len)
{
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        fu_die("malloc", "");
    memcpy(b, base, n);
    if (len >= 2 && n) {
        size_t at = ((size_t)in[0] | (size_t)in[1] << 8) % n;
        for (size_t i = 2; i < len && at < n; i++, at++)
            b[at] = in[i];
    }
    return b;
}

#endif
