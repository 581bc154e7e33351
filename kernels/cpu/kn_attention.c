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
#include <string.h>

#include "kn_body.h"
#include "kn_cpu.h"
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

/* ---- bf16: the same sequence with bf16 q, k, v and fp32 rows -------------------
 *   S = scale * Q K^T              bf16 product, fp32 scores
 *   P = softmax_masked(S)          fp32; att16 = bf16(P)
 *   Pd16 = bf16(att16 * mult)      dropout (only when p > 0)
 *   out16 = bf16(Pd16 V)
 * Backward (P = att16 widened):
 *   dP = dO V^T; Pd16 again, dP *= mult; dV += Pd16^T dO
 *   dS16 = bf16(scale * P (dP - <P,dP>))   dQ += dS16 K     dK += dS16^T Q
 * Each head's q, k, v (and dO) are first copied out of their strided columns
 * into dense T x hs blocks, and each product writes a dense block: oneDNN's
 * AMX/AVX512_BF16 kernels take dense matrices only (on the strided ones it
 * fell back to a generic kernel, 5-20 times slower at these sizes). */

/* dst (T,hs) dense = the head's columns of src (T rows, leading dimension ld) */
static inline KN_INLINE void head_copy16(uint16_t *dst, const uint16_t *src, int T, int hs, int ld)
{
    for (int t = 0; t < T; t++)
        memcpy(dst + (size_t)t * hs, src + (size_t)t * ld, (size_t)hs * sizeof(uint16_t));
}

/* pd16[i] = bf16(att16[i] * mult) and, with dp, dp[i] *= mult, for RNG
 * indices start..start+n: drop_apply on bf16 probabilities. */
static inline KN_INLINE void drop_apply16(uint16_t *pd16, float *dp, const uint16_t *att16,
                                          size_t n, const kn_dropout *d, uint64_t start)
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
                pd16[i0 + i] = sl_f32_to_bf16(sl_bf16_to_f32(att16[i0 + i]) * mul);
                dp[i0 + i] *= mul;
            }
        } else {
            KN_SIMD
            for (size_t i = 0; i < len; i++)
                pd16[i0 + i] = sl_f32_to_bf16(
                    sl_bf16_to_f32(att16[i0 + i]) * (kn_dropout_keep_word(w[i], pr) ? sc : 0.0f));
        }
    }
}

/* floats per thread for n bf16 values, rounded up to 16 (64 bytes) */
static size_t f16(size_t n)
{
    return ((n + 1) / 2 + 15) & ~(size_t)15;
}

KN_CLONES void kn_attention_forward_bf16(uint16_t *out16, uint16_t *att16, const uint16_t *qkv16,
                                         const int32_t *valid, int B, int T, int C, int NH,
                                         kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, TH = (size_t)T * hs;
    int use_drop = drop.p > 0.0f, fail = 0;
    /* per thread: S (fp32), q, k, v, the output (bf16, T x hs) and the
     * dropped probabilities (bf16, T x T) */
    size_t per = ((TT + 15) & ~(size_t)15) + 4 * f16(TH) + f16(TT);
    float *scratch = sl_xaligned_alloc((size_t)omp_get_max_threads() * per * sizeof(float));
#pragma omp parallel for schedule(static) reduction(| : fail)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const uint16_t *qs = qkv16 + (size_t)b * T * 3 * C + (size_t)h * hs;
        float *S = scratch + (size_t)omp_get_thread_num() * per;
        uint16_t *q = (uint16_t *)(S + ((TT + 15) & ~(size_t)15)), *k = q + 2 * f16(TH),
                 *v = k + 2 * f16(TH), *o = v + 2 * f16(TH), *Pd = o + 2 * f16(TH);
        uint16_t *A = att16 + (size_t)bh * TT;
        head_copy16(q, qs, T, hs, 3 * C);
        head_copy16(k, qs + C, T, hs, 3 * C);
        head_copy16(v, qs + 2 * C, T, hs, 3 * C);
        fail |= kn_bgemm(0, 1, T, T, hs, scale, q, hs, k, hs, NULL, 0, S, T, 0) != 0;
        const int32_t *vb = valid ? valid + (size_t)b * T : NULL;
        for (int i = 0; i < T; i++)
            kn_softmax_row_masked(S + (size_t)i * T, S + (size_t)i * T, vb, T);
        KN_SIMD
        for (size_t i = 0; i < TT; i++)
            A[i] = sl_f32_to_bf16(S[i]);
        const uint16_t *P = A;
        if (use_drop) {
            drop_apply16(
                Pd, NULL, A, TT, &drop,
                kn_dropout_index(drop.seq0, (uint64_t)b, (uint64_t)NH * TT, (uint64_t)h * TT));
            P = Pd;
        }
        fail |= kn_bgemm(0, 0, T, hs, T, 1.0f, P, T, v, hs, NULL, 0, o, hs, 1) != 0;
        uint16_t *out = out16 + (size_t)b * T * C + (size_t)h * hs;
        for (int t = 0; t < T; t++)
            memcpy(out + (size_t)t * C, o + (size_t)t * hs, (size_t)hs * sizeof(uint16_t));
    }
    sl_aligned_free(scratch);
    if (fail)
        kn_cpu_fail("attention forward (bf16)");
}

/* dst (T rows, leading dimension ld) += src (T,hs) dense */
static inline KN_INLINE void head_add(float *dst, const float *src, int T, int hs, int ld)
{
    for (int t = 0; t < T; t++) {
        float *d = dst + (size_t)t * ld;
        const float *x = src + (size_t)t * hs;
        KN_SIMD
        for (int j = 0; j < hs; j++)
            d[j] += x[j];
    }
}

KN_CLONES void kn_attention_backward_bf16(float *dqkv, const uint16_t *dout16,
                                          const uint16_t *qkv16, const uint16_t *att16, int B,
                                          int T, int C, int NH, kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, TH = (size_t)T * hs;
    int use_drop = drop.p > 0.0f, fail = 0;
    size_t TTf = (TT + 15) & ~(size_t)15, THf = (TH + 15) & ~(size_t)15;
    /* per thread: dP, P (fp32, T x T), a product's output (fp32, T x hs),
     * q, k, v, dO (bf16, T x hs), the dropped probabilities and dS (bf16,
     * T x T) */
    size_t per = 2 * TTf + THf + 4 * f16(TH) + 2 * f16(TT);
    float *scratch = sl_xaligned_alloc((size_t)omp_get_max_threads() * per * sizeof(float));
#pragma omp parallel for schedule(static) reduction(| : fail)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t tok0 = (size_t)b * T * 3 * C + (size_t)h * hs;
        float *dq = dqkv + tok0, *dk = dq + C, *dv = dq + 2 * C;
        const uint16_t *A = att16 + (size_t)bh * TT;
        float *dP = scratch + (size_t)omp_get_thread_num() * per, *P = dP + TTf, *G = P + TTf;
        uint16_t *q = (uint16_t *)(G + THf), *k = q + 2 * f16(TH), *v = k + 2 * f16(TH),
                 *dO = v + 2 * f16(TH), *Pd = dO + 2 * f16(TH), *dS = Pd + 2 * f16(TT);
        head_copy16(q, qkv16 + tok0, T, hs, 3 * C);
        head_copy16(k, qkv16 + tok0 + C, T, hs, 3 * C);
        head_copy16(v, qkv16 + tok0 + 2 * C, T, hs, 3 * C);
        head_copy16(dO, dout16 + (size_t)b * T * C + (size_t)h * hs, T, hs, C);
        fail |= kn_bgemm(0, 1, T, T, hs, 1.0f, dO, hs, v, hs, NULL, 0, dP, T, 0) != 0;
        const uint16_t *Pv = A;
        if (use_drop) {
            drop_apply16(
                Pd, dP, A, TT, &drop,
                kn_dropout_index(drop.seq0, (uint64_t)b, (uint64_t)NH * TT, (uint64_t)h * TT));
            Pv = Pd;
        }
        fail |= kn_bgemm(1, 0, T, hs, T, 1.0f, Pv, T, dO, hs, NULL, 0, G, hs, 0) != 0;
        head_add(dv, G, T, hs, 3 * C);
        KN_SIMD
        for (size_t i = 0; i < TT; i++)
            P[i] = sl_bf16_to_f32(A[i]);
        for (int i = 0; i < T; i++)
            kn_softmax_row_bwd(dP + (size_t)i * T, P + (size_t)i * T, dP + (size_t)i * T, T, scale);
        KN_SIMD
        for (size_t i = 0; i < TT; i++)
            dS[i] = sl_f32_to_bf16(dP[i]);
        fail |= kn_bgemm(0, 0, T, hs, T, 1.0f, dS, T, k, hs, NULL, 0, G, hs, 0) != 0;
        head_add(dq, G, T, hs, 3 * C);
        fail |= kn_bgemm(1, 0, T, hs, T, 1.0f, dS, T, q, hs, NULL, 0, G, hs, 0) != 0;
        head_add(dk, G, T, hs, 3 * C);
    }
    sl_aligned_free(scratch);
    if (fail)
        kn_cpu_fail("attention backward (bf16)");
}
