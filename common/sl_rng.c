#include "sl_rng.h"

#include <math.h>

void sl_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n, uint32_t *out)
{
    size_t i = 0;
    /* Head: up to the next block boundary. */
    while (i < n && ((start + i) & 3) != 0) {
        out[i] = sl_rng_u32(seed, stream, start + i);
        i++;
    }
    for (; i + 4 <= n; i += 4) {
        uint64_t block = (start + i) >> 2;
        sl_u32x4 c = {{(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)}};
        sl_u32x4 r = sl_philox4x32(c, (uint32_t)seed, (uint32_t)(seed >> 32));
        out[i] = r.v[0];
        out[i + 1] = r.v[1];
        out[i + 2] = r.v[2];
        out[i + 3] = r.v[3];
    }
    for (; i < n; i++)
        out[i] = sl_rng_u32(seed, stream, start + i);
}

void sl_rng_fill_uniform(uint64_t seed, uint64_t stream, uint64_t start, size_t n, float *out)
{
    uint32_t buf[256];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 256 ? n - done : 256;
        sl_rng_fill_u32(seed, stream, start + done, k, buf);
        for (size_t i = 0; i < k; i++)
            out[done + i] = (float)(buf[i] >> 8) * (1.0f / 16777216.0f);
        done += k;
    }
}

float sl_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* u1 in (0,1] so log is finite. */
    double u1 = ((double)sl_rng_u32(seed, stream, 2 * index) + 1.0) / 4294967296.0;
    double u2 = (double)sl_rng_u32(seed, stream, 2 * index + 1) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
