/* Philox4x32-10 exactly as common/sl_rng.h, 16 blocks at a time: a portable
 * structure-of-arrays version that the compiler vectorises (AVX2 / SSE2
 * clones), and an AVX-512 version with intrinsics, because compilers turn the
 * 32x32->64-bit products into a full 64-bit multiply emulation (3 multiplies
 * per lane) where vpmuludq on even and odd lanes needs 2. */
#include "kn_rng.h"

#include "kn_body.h"
#include "sl_rng.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KN_RNG_AVX512 1
#endif

#define KN_RNG_LANES 16
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* The 4 * KN_RNG_LANES words of blocks block0 .. block0 + KN_RNG_LANES - 1. */
static inline KN_INLINE void philox_lanes(uint64_t seed, uint64_t stream, uint64_t block0,
                                          uint32_t *out)
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
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[j], p1 = (uint64_t)PHILOX_M1 * c2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = (uint32_t)p1;
            c3[j] = (uint32_t)p0;
            c0[j] = n0;
            c2[j] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int j = 0; j < KN_RNG_LANES; j++) {
        out[4 * j] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

#ifdef KN_RNG_AVX512
/* High 32 bits of the 16 products a[j] * m (unsigned): even lanes from
 * vpmuludq on a, odd lanes from vpmuludq on a >> 32. */
__attribute__((target("avx512f"))) static inline __m512i mulhi_epu32(__m512i a, __m512i m)
{
    __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(a, m), 32);
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    return _mm512_mask_blend_epi32((__mmask16)0xAAAA, even, odd);
}

__attribute__((target("avx512f"))) static void philox_lanes_avx512(uint64_t seed, uint64_t stream,
                                                                   uint64_t block0, uint32_t *out)
{
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo = _mm512_set1_epi32((int)(uint32_t)block0);
    __m512i c0 = _mm512_add_epi32(lo, lane);
    /* carry into the high word where the low word wrapped */
    __mmask16 wrap = _mm512_cmplt_epu32_mask(c0, lo);
    __m512i hi = _mm512_set1_epi32((int)(uint32_t)(block0 >> 32));
    __m512i c1 = _mm512_mask_add_epi32(hi, wrap, hi, _mm512_set1_epi32(1));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)stream);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m512i hi0 = mulhi_epu32(c0, m0), lo0 = _mm512_mullo_epi32(c0, m0);
        __m512i hi1 = mulhi_epu32(c2, m1), lo1 = _mm512_mullo_epi32(c2, m1);
        __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    /* 4 x 16 transpose: u_k holds blocks k, k+4, k+8, k+12 in its 128-bit lanes */
    __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpacklo_epi32(c2, c3);
    __m512i t2 = _mm512_unpackhi_epi32(c0, c1), t3 = _mm512_unpackhi_epi32(c2, c3);
    __m512i u[4] = {_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1),
                    _mm512_unpacklo_epi64(t2, t3), _mm512_unpackhi_epi64(t2, t3)};
    for (int k = 0; k < 4; k++) {
        _mm_storeu_si128((__m128i *)(out + 4 * k), _mm512_extracti32x4_epi32(u[k], 0));
        _mm_storeu_si128((__m128i *)(out + 4 * (k + 4)), _mm512_extracti32x4_epi32(u[k], 1));
        _mm_storeu_si128((__m128i *)(out + 4 * (k + 8)), _mm512_extracti32x4_epi32(u[k], 2));
        _mm_storeu_si128((__m128i *)(out + 4 * (k + 12)), _mm512_extracti32x4_epi32(u[k], 3));
    }
}
#endif

/* Head (up to the next block boundary) and tail word by word, the middle in
 * groups of KN_RNG_LANES blocks (avx512: with the intrinsics version). */
static inline KN_INLINE void fill(uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                                  uint32_t *out, int avx512)
{
    size_t i = 0;
    while (i < n && ((start + i) & 3) != 0) {
        out[i] = sl_rng_u32(seed, stream, start + i);
        i++;
    }
    for (; i + 4 * KN_RNG_LANES <= n; i += 4 * KN_RNG_LANES) {
#ifdef KN_RNG_AVX512
        if (avx512) {
            philox_lanes_avx512(seed, stream, (start + i) >> 2, out + i);
            continue;
        }
#endif
        philox_lanes(seed, stream, (start + i) >> 2, out + i);
    }
    (void)avx512;
    if (i < n)
        sl_rng_fill_u32(seed, stream, start + i, n - i, out + i);
}

KN_CLONES void kn_rng_fill_u32_portable(uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                                        uint32_t *out)
{
    fill(seed, stream, start, n, out, 0);
}

int kn_rng_have_avx512(void)
{
#ifdef KN_RNG_AVX512
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

void kn_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n, uint32_t *out)
{
    if (kn_rng_have_avx512())
        fill(seed, stream, start, n, out, 1);
    else
        kn_rng_fill_u32_portable(seed, stream, start, n, out);
}
