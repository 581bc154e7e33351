/* Philox4x32-10 exactly as common/sl_rng.h, laid out as structure of arrays
 * over KN_RNG_LANES consecutive blocks so that each round is one vector loop. */
#include "kn_rng.h"

#include "kn_body.h"
#include "sl_rng.h"

#define KN_RNG_LANES 16

/* The 4 * KN_RNG_LANES words of blocks block0 .. block0 + KN_RNG_LANES - 1. */
static inline __attribute__((always_inline)) void philox_lanes(uint64_t seed, uint64_t stream,
                                                               uint64_t block0, uint32_t *out)
{
    uint32_t c0[KN_RNG_LANES], c1[KN_RNG_LANES], c2[KN_RNG_LANES], c3[KN_RNG_LANES];
#pragma omp simd
    for (int j = 0; j < KN_RNG_LANES; j++) {
        uint64_t b = block0 + (uint64_t)j;
        c0[j] = (uint32_t)b;
        c1[j] = (uint32_t)(b >> 32);
        c2[j] = (uint32_t)stream;
        c3[j] = (uint32_t)(stream >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
#pragma omp simd
        for (int j = 0; j < KN_RNG_LANES; j++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * c0[j], p1 = (uint64_t)0xCD9E8D57u * c2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = (uint32_t)p1;
            c3[j] = (uint32_t)p0;
            c0[j] = n0;
            c2[j] = n2;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int j = 0; j < KN_RNG_LANES; j++) {
        out[4 * j] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

KN_CLONES void kn_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                               uint32_t *out)
{
    size_t i = 0;
    while (i < n && ((start + i) & 3) != 0) {
        out[i] = sl_rng_u32(seed, stream, start + i);
        i++;
    }
    for (; i + 4 * KN_RNG_LANES <= n; i += 4 * KN_RNG_LANES)
        philox_lanes(seed, stream, (start + i) >> 2, out + i);
    if (i < n)
        sl_rng_fill_u32(seed, stream, start + i, n - i, out + i);
}
