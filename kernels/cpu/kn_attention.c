/* Multi-head self-attention on the CPU: one OpenMP task per (sequence, head),
 * each doing its products with single-threaded OpenBLAS sgemm (OpenBLAS's
 * OpenMP build runs serially inside a parallel region) straight on the
 * strided q/k/v columns of qkv, and its row math with the kn_body.h bodies.
 *
 *   S = scale * Q K^T          sgemm, written into att
 *   P = softmax_masked(S)      in place: att holds P (before dropout)
 *   Pd = dropout(P)            per-thread scratch (only when p > 0)
 *   out = Pd V                 sgemm into the head's columns of out
 * Backward:
 *   dPd = dout V^T     Pd, dP = dropout(P), dropout(dPd) (one pass over the mask)
 *   dV += Pd^T dout
 *   dS = scale * P (dP - <P,dP>)                  dQ += dS K     dK += dS^T Q
 *
 * The one allocation: a scratch of 2*T*T floats per thread per call (the
 * dropped probabilities and dP), small next to the op's own work. */
#include <omp.h>
#include <stdlib.h>

#include "kn_body.h"
#include "kn_gemm.h"
#include "kn_rng.h"
#include "kn_ops.h"
#include "sl_mem.h"

/* pd[i] = p[i] * (keep ? 1/(1-p) : 0) for RNG indices start..start+n, drawing
 * whole Philox blocks; the same mask as kn_attn_dropout_row element by element.
 * With dp != NULL also dp[i] *= the same multiplier (backward's one pass).
 * Inline so that it is compiled into each KN_CLONES version of its caller. */
static inline KN_INLINE void drop_apply(float *pd, float *dp, const float *p, size_t n,
                                        const kn_dropout *d, uint64_t start)
{
    float pr = d->p, sc = kn_dropout_scale(pr);
    uint32_t w[1024];
    for (size_t i0 = 0; i0 < n; i0 += 1024) {
        size_t len = n - i0 < 1024 ? n - i0 : 1024;
        kn_rng_fill_u32(d->seed, d->stream, start + i0, len, w);
        if (dp) {
            KN_SIMD
            for (size_t i = 0; i < len; i++) {
                float mul = kn_dropout_keep_word(w[i], pr) ? sc : 0.0f;
                pd[i0 + i] = p[i0 + i] * mul;
                dp[i0 + i] *= mul;
            }
        } else {
            KN_SIMD
            for (size_t i = 0; i < len; i++)
                pd[i0 + i] = p[i0 + i] * (kn_dropout_keep_word(w[i], pr) ? sc : 0.0f);
        }
    }
}

KN_CLONES void kn_attention_forward(float *out, float *att, const float *qkv, const int32_t *valid,
                                    int B, int T, int C, int NH, kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T;
    int use_drop = drop.p > 0.0f;
    float *scratch =
        use_drop ? sl_xmalloc((size_t)omp_get_max_threads() * TT * sizeof(float)) : NULL;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *S = att + (size_t)bh * TT;
        kn_sgemm(0, 1, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, S, T);
        const int32_t *vb = valid ? valid + (size_t)b * T : NULL;
        for (int i = 0; i < T; i++)
            kn_softmax_row_masked(S + (size_t)i * T, S + (size_t)i * T, vb, T);
        const float *P = S;
        if (use_drop) {
            float *Pd = scratch + (size_t)omp_get_thread_num() * TT;
            drop_apply(
                Pd, NULL, S, TT, &drop,
                kn_dropout_index(drop.seq0, (uint64_t)b, (uint64_t)NH * TT, (uint64_t)h * TT));
            P = Pd;
        }
        kn_sgemm(0, 0, T, hs, T, 1.0f, P, T, v, 3 * C, 0.0f,
                 out + (size_t)b * T * C + (size_t)h * hs, C);
    }
    free(scratch);
}

KN_CLONES void kn_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int C, int NH, kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T;
    int use_drop = drop.p > 0.0f;
    float *scratch = sl_xmalloc((size_t)omp_get_max_threads() * 2 * TT * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t tok0 = (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *q = qkv + tok0, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + tok0, *dk = dq + C, *dv = dq + 2 * C;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        const float *P = att + (size_t)bh * TT;
        float *dP = scratch + (size_t)omp_get_thread_num() * 2 * TT;
        kn_sgemm(0, 1, T, T, hs, 1.0f, dO, C, v, 3 * C, 0.0f, dP, T);
        const float *Pd = P;
        if (use_drop) {
            float *buf = dP + TT;
            drop_apply(
                buf, dP, P, TT, &drop,
                kn_dropout_index(drop.seq0, (uint64_t)b, (uint64_t)NH * TT, (uint64_t)h * TT));
            Pd = buf;
        }
        kn_sgemm(1, 0, T, hs, T, 1.0f, Pd, T, dO, C, 1.0f, dv, 3 * C);
        for (int i = 0; i < T; i++)
            kn_softmax_row_bwd(dP + (size_t)i * T, P + (size_t)i * T, dP + (size_t)i * T, T, scale);
        kn_sgemm(0, 0, T, hs, T, 1.0f, dP, T, k, 3 * C, 1.0f, dq, 3 * C);
        kn_sgemm(1, 0, T, hs, T, 1.0f, dP, T, q, 3 * C, 1.0f, dk, 3 * C);
    }
    free(scratch);
}
