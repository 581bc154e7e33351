/* kn_rng.h - a vectorised sl_rng_fill_u32 for the CPU dropout loops. */
#ifndef KN_RNG_H
#define KN_RNG_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = sl_rng_u32(seed, stream, start + i) for i in [0, n), bit for bit,
 * running 16 Philox blocks side by side so the rounds vectorise (about 3x
 * sl_rng_fill_u32 with SSE2; AVX-512 intrinsics where the CPU has them). */
void kn_rng_fill_u32(uint64_t seed, uint64_t stream, uint64_t start, size_t n, uint32_t *out);
/* The same without the AVX-512 intrinsics path (compiler-vectorised clones),
 * and whether kn_rng_fill_u32 takes that path here; for tests. */
void kn_rng_fill_u32_portable(uint64_t seed, uint64_t stream, uint64_t start, size_t n,
                              uint32_t *out);
int kn_rng_have_avx512(void);

#endif
