/* trust_util.h - temporary PKIs and directories for the trust tests. */
#ifndef TRUST_UTIL_H
#define TRUST_UTIL_H

#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cert.h"

static int tu_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Removes a directory tree. */
static inline void tu_rmtree(const char *dir) { nftw(dir, tu_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh temporary directory (static storage per call site is the caller's). */
static inline void tu_tmpdir(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/skyloom-%s-XXXXXX", tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* dir/file into a static rotating buffer. */
static inline const char *tu_path(const char *dir, const char *file)
{
    static char bufs[8][4096];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, 4096, "%s/%s", dir, file);
    return b;
}

/* A PKI in a new subdirectory "pki" of root. */
static inline void tu_pki(const char *root, const char *sub, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", root, sub);
    sl_err err = {0};
    if (cert_pki_init(out, sub, NULL, &err)) {
        fprintf(stderr, "cert_pki_init: %s\n", err.msg);
        exit(1);
    }
}

#endif
