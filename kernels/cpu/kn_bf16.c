/* The bf16 CPU ops of kn_ops.h but attention's (kn_attention.c): the products
 * through kn_bgemm (oneDNN, kn_dnnl.c), the elementwise loops around the
 * kn_threads.h bodies the CUDA kernels run too. */
#include "kn_body.h"
#include "kn_cpu.h"
#include "kn_gemm.h"
#include "kn_ops.h"
#include "kn_threads.h"
#include "sl_mem.h"

/* Below this many elements a loop runs on one thread (kn_cpu.c says why). */
#define KN_PAR_MIN (1 << 16)
#define KN_PAR_MIN_HEAVY (1 << 14)

KN_CLONES void kn_to_bf16(uint16_t *out16, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= KN_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        kn_t_to_bf16(i, out16, inp);
}

void kn_layernorm_forward_bf16(float *out, uint16_t *out16, float *mean, float *rstd,
                               const float *inp, const float *w, const float *b, int N, int C,
                               float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)N * C >= KN_PAR_MIN)
    for (int n = 0; n < N; n++)
        kn_t_ln_fwd_bf16((size_t)n, out, out16, mean, rstd, inp, w, b, C, eps);
}

void kn_matmul_forward_bf16(float *out, uint16_t *out16, const uint16_t *inp16,
                            const uint16_t *w16, const float *b, int N, int IC, int OC)
{
    /* out (N,OC) = inp16 (N,IC) @ w16^T (IC,OC) + b */
    if (kn_bgemm(0, 1, N, OC, IC, 1.0f, inp16, IC, w16, IC, b, 0, out16 ? (void *)out16 : out, OC,
                 out16 != NULL))
        kn_cpu_fail("matmul forward (bf16)");
}

void kn_matmul_backward_bf16(float *dinp, float *dw, float *db, const float *dout,
                             const uint16_t *inp16, const uint16_t *w16, int N, int IC, int OC)
{
    if (dinp || dw) {
        uint16_t *d16 = sl_xaligned_alloc((size_t)N * OC * sizeof(uint16_t));
        kn_to_bf16(d16, dout, (size_t)N * OC);
        /* dinp (N,IC) += dout16 (N,OC) @ w16 (OC,IC) */
        if (dinp && kn_bgemm(0, 0, N, IC, OC, 1.0f, d16, OC, w16, IC, NULL, 1, dinp, IC, 0))
            kn_cpu_fail("matmul backward, input gradient (bf16)");
        /* dw (OC,IC) += dout16^T (OC,N) @ inp16 (N,IC) */
        if (dw && kn_bgemm(1, 0, OC, IC, N, 1.0f, d16, OC, inp16, IC, NULL, 1, dw, IC, 0))
            kn_cpu_fail("matmul backward, weight gradient (bf16)");
        sl_aligned_free(d16);
    }
    if (db)
        kn_colsum_add(db, dout, N, OC, OC);
}

KN_CLONES void kn_gelu_forward_bf16(uint16_t *out16, const uint16_t *inp16, size_t N, int kind)
{
    if (kind == KN_GELU_TANH) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_fwd_bf16(i, out16, inp16, KN_GELU_TANH);
    } else {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_fwd_bf16(i, out16, inp16, KN_GELU_ERF);
    }
}

/* One loop per kind and per out16 given or not, each with constants. */
KN_CLONES void kn_gelu_backward_bf16(float *dinp, uint16_t *out16, const uint16_t *inp16,
                                     const float *dout, size_t N, int kind)
{
    if (kind == KN_GELU_TANH && out16) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd_out_bf16(i, dinp, out16, inp16, dout, KN_GELU_TANH);
    } else if (kind == KN_GELU_TANH) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd_bf16(i, dinp, inp16, dout, KN_GELU_TANH);
    } else if (out16) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd_out_bf16(i, dinp, out16, inp16, dout, KN_GELU_ERF);
    } else {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd_bf16(i, dinp, inp16, dout, KN_GELU_ERF);
    }
}
