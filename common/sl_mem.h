/* sl_mem.h - checked allocation and size arithmetic.
 *
 * sl_xmalloc and friends are for sizes the program itself chose: on failure
 * they print one line and exit, as there is nothing sane to do. Sizes that
 * come from a file or the network must be validated first and allocated with
 * sl_try_malloc, whose failure is an ordinary error. */
#ifndef SL_MEM_H
#define SL_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *sl_xmalloc(size_t n);
void *sl_xcalloc(size_t count, size_t size);
void *sl_xrealloc(void *p, size_t n);
char *sl_xstrdup(const char *s);
/* Returns NULL on failure or n == 0 never (n == 0 gives a 1-byte block). */
void *sl_try_malloc(size_t n);
/* 64-byte aligned, for tensors; free with sl_aligned_free. */
void *sl_xaligned_alloc(size_t n);
void *sl_try_aligned_alloc(size_t n);
void sl_aligned_free(void *p);

/* *out = a * b; false on overflow. */
static inline bool sl_mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool sl_add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
/* a + b, or UINT64_MAX where that overflows: counts devices report. */
static inline uint64_t sl_add_sat_u64(uint64_t a, uint64_t b)
{
    uint64_t s;
    return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

#endif
