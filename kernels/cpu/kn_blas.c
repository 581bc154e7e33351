#include "kn_backend.h"

#include <cblas.h>
#include <omp.h>

const char *kn_blas_name(void) { return openblas_get_config(); }
int kn_blas_threads(void) { return openblas_get_num_threads(); }
void kn_blas_set_threads(int n) { openblas_set_num_threads(n); }

#include "kn_gemm.h"

/* kn_sgemm's panels: at most this many along C's longer side (each one
 * repacks the other operand), and at least this many rows or columns each
 * (below that OpenBLAS's kernel loses speed); both fixed, never the thread
 * count. */
#define KN_GEMM_PANELS 8
#define KN_GEMM_PANEL_MIN 64
/* Products of fewer multiply-adds (attention's per head, at BERT's sizes)
 * run as one call on the calling thread: a parallel region costs more
 * there than it saves. */
#define KN_GEMM_SMALL (1 << 20)

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
     * bits would depend on the thread count. Here the shape alone decides:
     * a small product is one call with OpenBLAS on this thread alone (it
     * follows the calling thread's OpenMP count); a larger one is cut into
     * fixed panels along C's longer side, each computed by one thread
     * (inside a parallel region OpenBLAS runs single-threaded, and this loop
     * always is one; nested in a caller's region it runs on that thread). */
    if ((double)M * N * K < KN_GEMM_SMALL) {
        int was = omp_get_max_threads();
        if (was > 1)
            omp_set_num_threads(1);
        kn_gemm_cm g = kn_gemm_map(ta, tb, M, N, K, A, lda, B, ldb, ldc);
        cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
                    g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, g.a, g.lda, g.b,
                    g.ldb, beta, C, g.ldc);
        if (was > 1)
            omp_set_num_threads(was);
        return;
    }
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
