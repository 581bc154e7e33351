/* Kernel micro-benchmark: (1) GEMM efficiency of the linear layers, i.e.
 * kn_matmul_forward + kn_matmul_backward (3 products + bias work) against the
 * same three products as plain cblas_sgemm calls, on the BERT shapes of a
 * batch of 8 x 128 tokens; (2) median time of every other op at one BERT
 * layer's size. Prints a table; asserts nothing.
 *   bench_kn [base|small] [reps] [cpu]   (threads: OMP_NUM_THREADS)
 * `cpu` times with process CPU time instead of wall time: with one thread on
 * a shared, loaded machine that is the steadier measure. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kn_backend.h"
#include "kn_ops.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_time.h"

static int g_reps = 5;
static int g_cpu_time;

static double now(void)
{
    if (!g_cpu_time)
        return sl_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *randn(size_t n, uint64_t s)
{
    float *x = sl_xaligned_alloc(n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] = 0.5f * sl_rng_normal(42, s, i);
    return x;
}

/* Median seconds of g_reps runs of the statement (after one warm-up). */
#define MEDIAN(out, stmt)                                                                          \
    do {                                                                                           \
        double t_[64];                                                                             \
        stmt;                                                                                      \
        for (int r_ = 0; r_ < g_reps; r_++) {                                                      \
            double t0_ = now();                                                                    \
            stmt;                                                                                  \
            t_[r_] = now() - t0_;                                                                  \
        }                                                                                          \
        (out) = bench_median(t_, g_reps);                                                          \
    } while (0)

static void gemm_row(const char *name, int N, int IC, int OC)
{
    float *x = randn((size_t)N * IC, 1), *w = randn((size_t)OC * IC, 2), *b = randn(OC, 3);
    float *y = randn((size_t)N * OC, 4), *dy = randn((size_t)N * OC, 5);
    float *dx = randn((size_t)N * IC, 6), *dw = randn((size_t)OC * IC, 7), *db = randn(OC, 8);
    double tk, tb;
    MEDIAN(tk, (kn_matmul_forward(y, x, w, b, N, IC, OC),
                kn_matmul_backward(dx, dw, db, dy, x, w, N, IC, OC)));
    MEDIAN(tb, (cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, w, IC,
                            0.0f, y, OC),
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dy, OC, w,
                            IC, 1.0f, dx, IC),
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dy, OC, x, IC,
                            1.0f, dw, IC)));
    double flop = 6.0 * N * IC * OC;
    printf("| %-22s | %5d x %5d x %5d | %8.2f | %8.2f | %6.1f | %6.1f | %5.3f |\n", name, N, IC, OC,
           tk * 1e3, tb * 1e3, flop / tk * 1e-9, flop / tb * 1e-9, tb / tk);
    sl_aligned_free(x), sl_aligned_free(w), sl_aligned_free(b), sl_aligned_free(y);
    sl_aligned_free(dy), sl_aligned_free(dx), sl_aligned_free(dw), sl_aligned_free(db);
}

int main(int argc, char **argv)
{
    int base = !(argc > 1 && strcmp(argv[1], "small") == 0);
    if (argc > 2)
        g_reps = atoi(argv[2]) > 0 && atoi(argv[2]) <= 64 ? atoi(argv[2]) : 5;
    g_cpu_time = argc > 3 && strcmp(argv[3], "cpu") == 0;
    int B = 8, T = 128, C = base ? 768 : 128, NH = base ? 12 : 2, F = 4 * C,
        V = base ? 30522 : 8192, M = 160;
    int N = B * T;
    printf("bench_kn: %s config, B=%d T=%d C=%d NH=%d F=%d V=%d masked=%d, %d threads, median of "
           "%d, %s time\n",
           base ? "BERT-base" : "small (a)", B, T, C, NH, F, V, M, omp_get_max_threads(), g_reps,
           g_cpu_time ? "CPU" : "wall");
    printf("\nLinear layers, forward + backward (3 products):\n");
    printf("| layer                  | N x IC x OC           | kn ms    | sgemm ms | kn GF/s | "
           "sgemm GF/s | eff |\n");
    printf("|---|---|---|---|---|---|---|\n");
    gemm_row("qkv", N, C, 3 * C);
    gemm_row("attention output", N, C, C);
    gemm_row("ffn up", N, C, F);
    gemm_row("ffn down", N, F, C);
    gemm_row("mlm transform", M, C, C);
    gemm_row("mlm decoder (tied)", M, C, V);

    size_t nc = (size_t)N * C, nf = (size_t)N * F, na = (size_t)B * NH * T * T;
    float *x = randn(nc, 10), *y = randn(nc, 11), *dy = randn(nc, 12), *w = randn(C, 13),
          *bb = randn(C, 14), *mean = randn(N, 15), *rstd = randn(N, 16), *dw = randn(C, 17);
    float *h = randn(nf, 18), *hg = randn(nf, 19), *dh = randn(nf, 20);
    float *qkv = randn(3 * nc, 21), *dqkv = randn(3 * nc, 22), *att = randn(na, 23);
    int32_t *valid = sl_xmalloc((size_t)N * sizeof(int32_t)), *tgt = sl_xmalloc((size_t)M * 4);
    for (int i = 0; i < N; i++)
        valid[i] = (i % T) < T - 7 * (i / T);
    for (int i = 0; i < M; i++)
        tgt[i] = (int32_t)(sl_rng_u32(1, 2, (uint64_t)i) % (uint32_t)V);
    float *logits = randn((size_t)M * V, 24), *probs = randn((size_t)M * V, 25),
          *losses = randn(M, 26);
    kn_dropout dr = {.p = 0.1f, .seed = 1, .stream = 2, .seq0 = 0};
    kn_layernorm_forward(y, mean, rstd, x, w, bb, N, C, 1e-12f);

    printf("\nOther ops at one layer's size:\n| op | ms |\n|---|---|\n");
    double t;
#define OP(name, stmt)                                                                             \
    do {                                                                                           \
        MEDIAN(t, stmt);                                                                           \
        printf("| %-34s | %8.3f |\n", name, t * 1e3);                                              \
    } while (0)
    OP("layernorm fwd", kn_layernorm_forward(y, mean, rstd, x, w, bb, N, C, 1e-12f));
    OP("layernorm bwd", kn_layernorm_backward(dy, dw, dw, y, x, w, mean, rstd, N, C));
    OP("attention fwd (p=0.1)", kn_attention_forward(y, att, qkv, valid, B, T, C, NH, dr));
    OP("attention bwd (p=0.1)", kn_attention_backward(dqkv, dy, qkv, att, B, T, C, NH, dr));
    dr.p = 0.0f;
    OP("attention fwd (p=0)", kn_attention_forward(y, att, qkv, valid, B, T, C, NH, dr));
    OP("attention bwd (p=0)", kn_attention_backward(dqkv, dy, qkv, att, B, T, C, NH, dr));
    dr.p = 0.1f;
    OP("gelu erf fwd (N*F)", kn_gelu_forward(hg, h, nf, KN_GELU_ERF));
    OP("gelu erf bwd (N*F)", kn_gelu_backward(dh, h, hg, nf, KN_GELU_ERF));
    OP("gelu tanh fwd (N*F)", kn_gelu_forward(hg, h, nf, KN_GELU_TANH));
    OP("dropout fwd (N*C, p=0.1)", kn_dropout_forward(y, x, B, (size_t)T * C, dr));
    OP("dropout bwd (N*C, p=0.1)", kn_dropout_backward(dy, x, B, (size_t)T * C, dr));
    OP("residual fwd (N*C)", kn_residual_forward(y, x, dy, nc));
    OP("crossentropy fwd (M*V)", kn_crossentropy_forward(losses, probs, logits, tgt, M, V));
    OP("crossentropy bwd (M*V)", kn_crossentropy_backward(logits, probs, tgt, M, V, 1.0f / M));
    size_t np = nf * 2; /* ~ one layer's parameters x 1.3 */
    float *p = randn(np, 30), *g = randn(np, 31), *m = randn(np, 32), *v = randn(np, 33);
    for (size_t i = 0; i < np; i++)
        v[i] = v[i] * v[i];
    char nm[64];
    snprintf(nm, sizeof nm, "adamw (%zu params)", np);
    OP(nm, kn_adamw_update(p, g, m, v, np, 1e-4f, 0.9f, 0.999f, 1e-6f, 0.01f, 10, 1.0f, NULL));
    snprintf(nm, sizeof nm, "lamb (%zu params)", np);
    OP(nm, kn_lamb_update(p, g, m, v, np, 1e-4f, 0.9f, 0.999f, 1e-6f, 0.01f, 10));
    snprintf(nm, sizeof nm, "sumsq (%zu)", np);
    OP(nm, (void)kn_sumsq(g, np));
    printf("\nBLAS: %s\n", kn_blas_name());
    return 0;
}
