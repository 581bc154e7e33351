#include "sl_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "skyloom: out of memory allocating %zu bytes\n", n);
    exit(70);
}

void *sl_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *sl_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        oom(count * size);
    return p;
}

void *sl_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *sl_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sl_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

void *sl_try_malloc(size_t n) { return malloc(n ? n : 1); }

void *sl_try_aligned_alloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return NULL;
    return p;
}

void *sl_xaligned_alloc(size_t n)
{
    void *p = sl_try_aligned_alloc(n);
    if (!p)
        oom(n);
    return p;
}

void sl_aligned_free(void *p) { free(p); }
