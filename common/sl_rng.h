/* sl_rng.h - seeded counter-based random numbers (Philox4x32-10).
 *
 * Every random number Skyloom draws (masking, dropout, initialisation) is a
 * pure function of (seed, stream, index): there is no generator state to
 * carry around. So a dropout mask is the same whether a batch is split into
 * 1 or 8 micro-batches, on CPU or GPU, on one device or across a pipeline,
 * as long as each element asks for its own index. The bodies are SL_HD so the
 * CUDA kernels run this very code.
 *
 * Reference: Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11. Constants are the published Philox4x32 ones. */
#ifndef SL_RNG_H
#define SL_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "sl_hd.h"

typedef struct sl_u32x4 {
    uint32_t v[4];
} sl_u32x4;

SL_HD uint32_t sl_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* One Philox4x32-10 block: counter c under key k. */
SL_HD sl_u32x4 sl_philox4x32(sl_u32x4 c, uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = sl_mulhilo32(0xD2511F53u, c.v[0], &hi0);
        uint32_t lo1 = sl_mulhilo32(0xCD9E8D57u, c.v[2], &hi1);
        sl_u32x4 n;
        n.v[0] = hi1 ^ c.v[1] ^ k0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ c.v[3] ^ k1;
        n.v[3] = lo0;
        c = n;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c;
}

/* The index-th 32-bit word of stream `stream` under `seed`. */
SL_HD uint32_t sl_rng_u32(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t block = index >> 2;
    sl_u32x4 c;
    c.v[0] = (uint32_t)block;
    c.v[1] = (uint32_t)(block >> 32);
    c.v[2] = (uint32_t)stream;
    c.v[3] = (uint32_t)(stream >> 32);
    sl_u32x4 r = sl_philox4x32(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return r.v[index & 3];
}

/* Uniform float in [0, 1) with 24 random bits. */
SL_HD float sl_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return (float)(sl_rng_u32(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
}

/* Derives a sub-stream id from a parent stream and a tag (for example
 * (purpose, layer) or (epoch, sequence)): a 64-bit mix, the same everywhere. */
SL_HD uint64_t sl_rng_stream(uint64_t a, uint64_t b)
{
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 33;
    return x;
}

/* Fills out[0..n) with words index start..start+n of the stream; the result
 * equals calling sl_rng_u32 per element, but does one block per 4 words. */
void sl_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n, uint32_t *out);
/* Uniform floats in [0,1), same stream as sl_rng_uniform. */
void sl_rng_fill_uniform(uint64_t seed, uint64_t stream, uint64_t start, size_t n, float *out);
/* Standard normal via Box-Muller on words (2i, 2i+1) of the stream, so
 * element i depends only on i. */
float sl_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

#endif
