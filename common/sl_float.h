/* sl_float.h - float bit patterns and bf16, shared by the frame codecs
 * (device/dev_codec_hd.h) and the optimizer's bf16 moments (kernels/), as
 * SL_HD functions so CUDA kernels run the same bodies.
 *
 * bf16 is the top 16 bits of an f32. sl_f32_to_bf16 rounds to nearest even
 * (NaN stays NaN, never rounds to inf); sl_f32_to_bf16_sr rounds
 * stochastically: it adds 16 random bits below the kept ones and truncates,
 * so the result is unbiased (E = x) - what a value updated by less than half
 * an ulp at a time (Adam's second moment) needs. */
#ifndef SL_FLOAT_H
#define SL_FLOAT_H

#include <stdint.h>

#include "sl_hd.h"

SL_HD uint32_t sl_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    union { float f; uint32_t u; } v;
    v.f = f;
    return v.u;
#endif
}

SL_HD float sl_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union { float f; uint32_t u; } v;
    v.u = u;
    return v.f;
#endif
}

SL_HD uint16_t sl_f32_to_bf16(float f)
{
    uint32_t x = sl_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN; never rounds to inf */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* r16: 16 random bits (the low half of r is used). */
SL_HD uint16_t sl_f32_to_bf16_sr(float f, uint32_t r16)
{
    uint32_t x = sl_f32_bits(f);
    if ((x & 0x7f800000u) == 0x7f800000u) /* inf stays inf, NaN stays NaN */
        return (uint16_t)((x >> 16) | ((x & 0xffffu) ? 0x40u : 0u));
    uint32_t y = x + (r16 & 0xffffu);
    if ((y & 0x7f800000u) == 0x7f800000u) /* would round up to inf: truncate */
        y = x;
    return (uint16_t)(y >> 16);
}

SL_HD float sl_bf16_to_f32(uint16_t b)
{
    return sl_bits_f32((uint32_t)b << 16);
}

#endif
