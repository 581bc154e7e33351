/* kn_testutil.h - helpers shared by the kernel tests (test_kn_*.c).
 *
 * The error metric of every kernel comparison is the normalised max error
 *     rel(a, ref) = max_i |a_i - ref_i| / max(max_i |ref_i|, 1e-30)
 * i.e. the worst absolute error measured in units of the tensor's largest
 * reference magnitude. It is robust to elements near zero (a per-element
 * relative error would blow up on them) and still catches any wrong element
 * at the 1e-4 level of the tensor's scale. A NaN anywhere makes it +inf. */
#ifndef KN_TESTUTIL_H
#define KN_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_test.h"

static inline double kt_rel(const float *a, const float *ref, size_t n)
{
    double emax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)ref[i]);
        if (!(e == e) || isinf(e))
            return INFINITY;
        if (e > emax)
            emax = e;
        if (fabs((double)ref[i]) > rmax)
            rmax = fabs((double)ref[i]);
    }
    return emax / (rmax > 1e-30 ? rmax : 1e-30);
}

/* CHECK that rel(a, ref) <= tol, printing the measured error either way. */
#define KT_CHECK_REL(what, a, ref, n, tol)                                                         \
    do {                                                                                           \
        double kt_r_ = kt_rel((a), (ref), (n));                                                    \
        printf("    %-22s rel %.3g\n", (what), kt_r_);                                             \
        CHECKF(kt_r_ <= (tol), "%s: rel error %.3g > %g", (what), kt_r_, (double)(tol));           \
    } while (0)

static inline float *kt_alloc(size_t n)
{
    return sl_xcalloc(n ? n : 1, sizeof(float));
}

/* n normal(0, sd) floats from stream `stream` of a fixed test seed. */
static inline float *kt_randn(size_t n, uint64_t stream, float sd)
{
    float *x = kt_alloc(n);
    for (size_t i = 0; i < n; i++)
        x[i] = sd * sl_rng_normal(0x5EEDull, stream, i);
    return x;
}

static inline int32_t kt_randint(uint64_t stream, size_t i, int32_t hi)
{
    return (int32_t)(sl_rng_u32(0x5EEDull, stream, i) % (uint32_t)hi);
}

static inline int kt_bitwise_equal(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

#endif
