#include "kn_backend.h"

#include <cblas.h>

const char *kn_blas_name(void) { return openblas_get_config(); }
int kn_blas_threads(void) { return openblas_get_num_threads(); }
void kn_blas_set_threads(int n) { openblas_set_num_threads(n); }

#include "kn_gemm.h"

/* kn_sgemm's panels: at most this many along C's longer side (each one
 * repacks the other operand), and at least this many rows or columns each
 * (below that OpenBLAS's kernel loses speed); both fixed, never the thread
 * count. */
#define KN_GEMM_PANELS 8
#define KN_GEMM_PANEL_MIN 128

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
    /* OpenBLAS's own threads split C by their count, and on some CPUs
     * (AVX-512 Intel) the tiles at the split edges round differently, so the
     * bits would depend on the thread count. C is cut instead into fixed
     * panels along its longer side, each computed by one thread: inside a
     * parallel region OpenBLAS runs single-threaded, and this loop always is
     * one (nested in a caller's region it simply runs on that thread). */
    int rows = M >= N, len = rows ? M : N;
    int per = (len + KN_GEMM_PANELS - 1) / KN_GEMM_PANELS;
    per = per < KN_GEMM_PANEL_MIN ? KN_GEMM_PANEL_MIN : (per + 63) / 64 * 64;
    int np = (len + per - 1) / per;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < np; i++) {
        int at = i * per, n = len - at < per ? len - at : per;
        const float *a = A, *b = B;
        float *c = C;
        if (rows) { /* rows at..at+n-1 of op(A) and C */
            a = ta ? A + at : A + (size_t)at * lda;
            c = C + (size_t)at * ldc;
        } else { /* columns at..at+n-1 of op(B) and C */
            b = tb ? B + (size_t)at * ldb : B + at;
            c = C + at;
        }
        kn_gemm_cm g = kn_gemm_map(ta, tb, rows ? n : M, rows ? N : n, K, a, lda, b, ldb, ldc);
        cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
                    g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, g.a, g.lda, g.b,
                    g.ldb, beta, c, g.ldc);
    }
}
