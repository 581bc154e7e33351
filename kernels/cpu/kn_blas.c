#include "kn_backend.h"

#include <cblas.h>
#include <fcntl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS picks its kernels by CPU model when it loads, and on a model it
 * does not know it falls back to Prescott's SSE3 kernels: Debian 12's
 * 0.3.21 does so on Intel's Emerald Rapids (family 6, model 207), where
 * sgemm then runs 5x slower than with the AVX-512 kernels the CPU has. The
 * choice is made before main and fixed for the process, and the only way
 * to change it is OPENBLAS_CORETYPE in the environment at load time. So
 * when OpenBLAS fell back to Prescott on a CPU with AVX-512 (SkylakeX's
 * kernels) or AVX2 and FMA (Haswell's), this process is executed again,
 * same arguments, with OPENBLAS_CORETYPE naming them; its children inherit
 * it. A user's own OPENBLAS_CORETYPE is left alone, and if the exec fails
 * the process goes on with what OpenBLAS chose. */
const char *kn_blas_core_for_cpu(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
}

__attribute__((constructor)) static void kn_blas_core_fix(void)
{
    const char *core = openblas_get_corename(), *want;
    if (getenv("OPENBLAS_CORETYPE") || !core || strcasecmp(core, "prescott") != 0 ||
        !(want = kn_blas_core_for_cpu()))
        return;
    /* argv again, from /proc/self/cmdline: NUL-separated, NUL-terminated */
    enum { CMDLINE_MAX = 1 << 20, ARGS_MAX = 4096 };
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char *buf = malloc(CMDLINE_MAX + 1);
    size_t len = 0;
    ssize_t r = 0;
    while (buf && len < CMDLINE_MAX && (r = read(fd, buf + len, CMDLINE_MAX - len)) > 0)
        len += (size_t)r;
    close(fd);
    char **argv = malloc(ARGS_MAX * sizeof *argv);
    if (!buf || !argv || r < 0 || len == 0 || len >= CMDLINE_MAX) {
        free(buf);
        free(argv);
        return;
    }
    buf[len] = '\0';
    int argc = 0;
    size_t i = 0;
    for (; i < len && argc < ARGS_MAX - 1; i += strlen(buf + i) + 1)
        argv[argc++] = buf + i;
    argv[argc] = NULL;
    /* every argument or none: with more than ARGS_MAX, stay as we are */
    if (i >= len && setenv("OPENBLAS_CORETYPE", want, 1) == 0) {
        execv("/proc/self/exe", argv);
        unsetenv("OPENBLAS_CORETYPE");
    }
    free(buf);
    free(argv);
}

const char *kn_blas_name(void) { return openblas_get_config(); }
const char *kn_blas_core(void) { return openblas_get_corename(); }
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
