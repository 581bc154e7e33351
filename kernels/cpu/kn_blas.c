#include "kn_backend.h"

#include <cblas.h>

const char *kn_blas_name(void) { return openblas_get_config(); }
int kn_blas_threads(void) { return openblas_get_num_threads(); }
void kn_blas_set_threads(int n) { openblas_set_num_threads(n); }

#include "kn_gemm.h"

void kn_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* no products: C = beta * C (BLAS would reject the leading dimensions) */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    kn_gemm_cm g = kn_gemm_map(ta, tb, M, N, K, A, lda, B, ldb, ldc);
    cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
                g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, g.a, g.lda, g.b, g.ldb,
                beta, C, g.ldc);
}
