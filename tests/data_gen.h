/* data_gen.h - generated English-like text and temporary files for the data
 * tests, so they run without the demo corpus. */
#ifndef DATA_GEN_H
#define DATA_GEN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sl_mem.h"
#include "sl_rng.h"

/* ndocs documents of 1-6 lines of words made of syllables, blank line
 * between documents. A pure function of seed. Caller frees. */
static inline char *gen_corpus(uint64_t seed, int ndocs, size_t *len)
{
    static const char *const syl[] = {"the", "ka", "ro", "mi", "ten", "sha", "lo", "ver", "qu",
                                      "ing", "ed", "an", "Zu", "str", "o", "pe", "\xc3\xa9l",
                                      "na\xc3\xafve", "x", "y"};
    static const char *const punct[] = {".", "!", "?", ",", "'s", ";"};
    size_t cap = 1 << 16, n = 0;
    char *s = sl_xmalloc(cap);
    uint64_t k = 0;
    for (int d = 0; d < ndocs; d++) {
        int lines = 1 + (int)(sl_rng_u32(seed, 1, k++) % 6);
        for (int l = 0; l < lines; l++) {
            int words = 3 + (int)(sl_rng_u32(seed, 1, k++) % 14);
            for (int w = 0; w < words; w++) {
                int ns = 1 + (int)(sl_rng_u32(seed, 1, k++) % 3);
                if (n + 64 > cap)
                    s = sl_xrealloc(s, cap *= 2);
                for (int q = 0; q < ns; q++) {
                    const char *p = syl[sl_rng_u32(seed, 1, k++) % 20];
                    size_t pl = strlen(p);
                    memcpy(s + n, p, pl);
                    n += pl;
                }
                s[n++] = w + 1 < words ? ' ' : 0;
                if (w + 1 == words) {
                    n--;
                    const char *p = punct[sl_rng_u32(seed, 1, k++) % 6];
                    memcpy(s + n, p, strlen(p));
                    n += strlen(p);
                }
            }
            s[n++] = '\n';
        }
        s[n++] = '\n';
    }
    s[n] = '\0';
    *len = n;
    return s;
}

static char tmp_dir[64];


static inline const char *tmp_path(const char *name)
{
    static char p[8][256];
    static int i;
    if (!tmp_dir[0]) {
        /* tmpfs when there is one: shards are fsynced, and a busy disk makes
         * that slow without testing anything more */
        strcpy(tmp_dir, access("/dev/shm", W_OK) == 0 ? "/dev/shm/skyloom-test-XXXXXX"
                                                      : "/tmp/skyloom-test-XXXXXX");
        if (!mkdtemp(tmp_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    i = (i + 1) % 8;
    snprintf(p[i], sizeof p[i], "%s/%s", tmp_dir, name);
    return p[i];
}

static inline void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static inline void tmp_cleanup(void)
{
    if (tmp_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmp_dir);
    }
}

#endif
