/* kn_gemm.h - row-major GEMM on column-major BLAS (CBLAS and cuBLAS alike).
 *
 * The ops think row-major: C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C,
 * with leading dimensions counted in row-major elements. A column-major
 * library reads a row-major matrix as its transpose, so it is asked for
 * C^T = op(B)^T @ op(A)^T: the operands and M/N swap, transposes and leading
 * dimensions stay. kn_gemm_map does this once, whatever the element type;
 * kn_sgemm (CBLAS, column-major mode on purpose), kn_cuda_sgemm and
 * kn_cuda_bgemm (cuBLAS, fp32 and bf16) all use it, so every CPU test of a
 * matmul or attention also tests the mapping the GPU path relies on. */
#ifndef KN_GEMM_H
#define KN_GEMM_H

#include <stdint.h>

typedef struct kn_gemm_cm {
    int transa, transb; /* column-major operands: 0 = N, 1 = T */
    int m, n, k;
    const void *a;
    int lda;
    const void *b;
    int ldb;
    int ldc;
} kn_gemm_cm;

static inline kn_gemm_cm kn_gemm_map(int ta, int tb, int M, int N, int K, const void *A, int lda,
                                     const void *B, int ldb, int ldc)
{
    kn_gemm_cm g;
    g.transa = tb;
    g.transb = ta;
    g.m = N;
    g.n = M;
    g.k = K;
    g.a = B;
    g.lda = ldb;
    g.b = A;
    g.ldb = lda;
    g.ldc = ldc;
    return g;
}

/* Row-major C = alpha op(A) op(B) + beta C on the CPU (OpenBLAS). ta/tb: 0 or 1. */
void kn_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* Row-major C = alpha op(A) op(B) (+ bias) (+ C) on the CPU with bf16 A and
 * B and fp32 accumulation (oneDNN, cpu/kn_dnnl.c): C is fp32 (c_bf16 0;
 * accumulate 1 adds the product to C) or bf16 (c_bf16 1, rounded once after
 * the bias; accumulate 0). bias (N) may be NULL. The bits depend on the
 * shape, never on the thread count. 0, or -1 when oneDNN failed. */
int kn_bgemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
             const uint16_t *B, int ldb, const float *bias, int accumulate, void *C, int ldc,
             int c_bf16);

#endif
