/* dev_codec_hd.h - per-element math of the frame codecs, written once as
 * SL_HD functions so a CUDA codec kernel runs the very bodies the CPU codec
 * (dev_codec.c) and its tests run.
 *
 * fp16: IEEE binary16, round to nearest even, subnormals kept, overflow to
 *       infinity, NaN stays NaN (quiet).
 * bf16: the top 16 bits of an f32, round to nearest even, NaN stays NaN
 *       (sl_float.h, shared with the optimizer).
 * int8: q = round_half_even(x / scale) in [-127, 127], scale = absmax(row) /
 *       127 rounded up; x' = q * scale, so |x - x'| <= scale / 2 (plus the
 *       f32 rounding of x / scale and q * scale: < 3e-5 of scale / 2). */
#ifndef DEV_CODEC_HD_H
#define DEV_CODEC_HD_H

#include <stdint.h>

#include "sl_float.h"
#include "sl_hd.h"

/* Little-endian loads and stores, byte by byte (alignment and host byte
 * order do not matter; compilers turn them into one move on x86). */
SL_HD void dev_st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
SL_HD void dev_st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
SL_HD void dev_st64(uint8_t *p, uint64_t v)
{
    dev_st32(p, (uint32_t)v);
    dev_st32(p + 4, (uint32_t)(v >> 32));
}
SL_HD uint16_t dev_ld16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
SL_HD uint32_t dev_ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
SL_HD uint64_t dev_ld64(const uint8_t *p)
{
    return (uint64_t)dev_ld32(p) | ((uint64_t)dev_ld32(p + 4) << 32);
}

/* Round half to even for |v| < 2^22 without libm: adding 1.5 * 2^23 pushes the
 * fraction out of the mantissa under the default rounding mode. */
SL_HD float dev_rint_small(float v)
{
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

/* Both candidate results (normal and subnormal half) are computed and one is
 * selected, without branches: rounding decisions are data-dependent coin
 * flips that a branch predictor loses (measured 5x slower with branches). */
SL_HD uint16_t dev_f32_to_f16(float f)
{
    uint32_t x = sl_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* normal half: rebias the exponent (127 -> 15), round the 13 dropped
     * bits to nearest even; a carry into the exponent is the right result */
    uint32_t hn = (ax >> 13) - (112u << 10);
    uint32_t remn = ax & 0x1fffu;
    hn += (remn > 0x1000u) | ((remn == 0x1000u) & hn);
    /* subnormal half (|f| < 2^-14): |f| * 2^24 rounded to nearest even, in
     * float (the scaling is exact, the magnitude clamped so the other inputs
     * stay in range); r == 0x400 is the smallest normal, also right */
    float a = sl_bits_f32(ax);
    a = a < 0x1p-14f ? a : 0x1p-14f; /* NaN goes to the bound too */
    uint32_t r = (uint32_t)dev_rint_small(a * 0x1p24f);
    uint32_t h = ax < 0x38800000u ? r : hn;
    h = ax >= 0x477ff000u ? 0x7c00u : h;                           /* >= 65520: infinity */
    h = ax > 0x7f800000u ? 0x7e00u | ((ax >> 13) & 0x3ffu) : h;    /* NaN stays NaN, quiet */
    return (uint16_t)(sign | h);
}

SL_HD float dev_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu)
        return sl_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return sl_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* The scale for a row whose largest magnitude is absmax (finite, >= 0):
 * absmax / 127 rounded up, so that absmax / scale <= 127 and no value is
 * clamped. (Rounded to nearest, a subnormal scale can land far below
 * absmax / 127 and clamping would then break the scale / 2 bound.) Next to
 * FLT_MAX, though, 127 * scale must stay finite or -127 decodes to -inf:
 * there the scale steps down (it is normal there, so clamping costs a few
 * ulp, not half a step). Both cases were found by fuzz_frame. */
SL_HD float dev_q8_scale(float absmax)
{
    float s = absmax / 127.0f;
    if ((double)s * 127.0 < (double)absmax) /* products exact in double */
        s = sl_bits_f32(sl_f32_bits(s) + 1u);
    while ((double)s * 127.0 > 3.4028234663852886e+38) /* FLT_MAX; at most two steps */
        s = sl_bits_f32(sl_f32_bits(s) - 1u);
    return s;
}

SL_HD int8_t dev_q8(float x, float scale)
{
    if (!(scale > 0.0f))
        return 0;
    float q = dev_rint_small(x / scale);
    q = q > 127.0f ? 127.0f : q;
    q = q < -127.0f ? -127.0f : q;
    return (int8_t)q;
}

SL_HD float dev_dq8(int8_t q, float scale)
{
    return (float)q * scale;
}

#endif
