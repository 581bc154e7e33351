/* kn_rng.h - a vectorised sl_rng_fill_u32 for the CPU dropout loops. */
#ifndef KN_RNG_H
#define KN_RNG_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = sl_rng_u32(seed, stream, start + i) for i in [0, n), bit for bit,
 * running 16 Philox blocks side by side so the rounds vectorise (about 3x
 * sl_rng_fill_u32 with SSE2). */
void kn_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n, uint32_t *out);

#endif
