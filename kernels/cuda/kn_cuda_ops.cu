// The ops of kn_ops.h on CUDA: cuBLAS for the products, and kernels that are
// only launch geometry around the per-thread functions of kn_threads.h (one
// thread per element, row or column), so the math is the CPU's and the index
// arithmetic is tested on the CPU by tests/test_kn_bodies.c. No GPU was
// available while writing this: every kernel is kept deliberately simple.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#include "kn_backend.h"
#include "kn_cuda.h"
#include "kn_gemm.h"
#include "kn_ops.h"
#include "sl_err.h"
#include "sl_rng.h"
}
#include "kn_threads.h"

enum { KN_TPB = 256 };

static cublasHandle_t g_blas;
static bool g_ready;
static int g_first_error; // first cudaError_t / cuBLAS failure since the last sync
static char g_first_what[128];
static float *g_scratch; // the ops' scratch (attention, bf16 products), grown on demand
static size_t g_scratch_floats;
static double *g_acc; // 2 doubles for norms (LAMB, sumsq)

static void note(int failed, int code, const char *what)
{
    if (failed && !g_first_error) {
        g_first_error = code ? code : -1;
        snprintf(g_first_what, sizeof g_first_what, "%s", what);
    }
}
static void note_launch(const char *what)
{
    cudaError_t st = cudaGetLastError();
    note(st != cudaSuccess, (int)st, what);
}
static unsigned blocks(size_t n)
{
    return (unsigned)((n + KN_TPB - 1) / KN_TPB);
}
static float *scratch(size_t floats)
{
    if (floats > g_scratch_floats) {
        cudaFree(g_scratch);
        g_scratch = NULL;
        g_scratch_floats = 0;
        cudaError_t st = cudaMalloc((void **)&g_scratch, floats * sizeof(float));
        note(st != cudaSuccess, (int)st, "cudaMalloc of the ops' scratch");
        if (st != cudaSuccess)
            return NULL;
        g_scratch_floats = floats;
    }
    return g_scratch;
}

extern "C" int kn_cuda_init(sl_err *err)
{
    if (g_ready)
        return 0;
    const kn_cuda_info *info = kn_cudart_probe();
    if (info->device_count <= 0)
        return sl_err_set(err, SL_ENOTSUP, "%s", info->reason);
    cudaError_t st = cudaSetDevice(0);
    if (st != cudaSuccess)
        return sl_err_set(err, SL_ENOTSUP, "cudaSetDevice: %s", cudaGetErrorString(st));
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS)
        return sl_err_set(err, SL_ENOTSUP, "cublasCreate failed");
    // Keep fp32 products in fp32 (no TF32): results comparable with the CPU's.
    cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH);
    st = cudaMalloc((void **)&g_acc, 2 * sizeof(double));
    if (st != cudaSuccess) {
        cublasDestroy(g_blas);
        return sl_err_set(err, SL_ENOMEM, "cudaMalloc: %s", cudaGetErrorString(st));
    }
    g_ready = true;
    return 0;
}

extern "C" void kn_cuda_shutdown(void)
{
    if (!g_ready)
        return;
    cudaDeviceSynchronize();
    cudaFree(g_scratch);
    cudaFree(g_acc);
    cublasDestroy(g_blas);
    g_scratch = NULL;
    g_scratch_floats = 0;
    g_acc = NULL;
    g_ready = false;
}

extern "C" void *kn_cuda_alloc(size_t bytes, sl_err *err)
{
    void *p = NULL;
    cudaError_t st = cudaMalloc(&p, bytes ? bytes : 1);
    if (st != cudaSuccess) {
        sl_err_set(err, SL_ENOMEM, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(st));
        return NULL;
    }
    return p;
}

extern "C" void kn_cuda_free(void *p)
{
    cudaFree(p);
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, sl_err *err)
{
    cudaError_t st = cudaMemcpy(dst, src, bytes, kind);
    if (st != cudaSuccess)
        return sl_err_set(err, SL_EIO, "cudaMemcpy: %s", cudaGetErrorString(st));
    return 0;
}
extern "C" int kn_cuda_upload(void *dst, const void *src, size_t bytes, sl_err *err)
{
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, err);
}
extern "C" int kn_cuda_download(void *dst, const void *src, size_t bytes, sl_err *err)
{
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost, err);
}
extern "C" int kn_cuda_copy(void *dst, const void *src, size_t bytes, sl_err *err)
{
    return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, err);
}
extern "C" int kn_cuda_zero(void *p, size_t bytes, sl_err *err)
{
    cudaError_t st = cudaMemset(p, 0, bytes);
    if (st != cudaSuccess)
        return sl_err_set(err, SL_EIO, "cudaMemset: %s", cudaGetErrorString(st));
    return 0;
}

extern "C" int kn_cuda_sync(sl_err *err)
{
    cudaError_t st = cudaDeviceSynchronize();
    note(st != cudaSuccess, (int)st, "kernel execution");
    if (g_first_error) {
        int code = g_first_error;
        g_first_error = 0;
        return sl_err_set(err, SL_EINTERNAL, "CUDA: %s failed (%d)", g_first_what, code);
    }
    return 0;
}

extern "C" void kn_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                              int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { // no products: C = beta * C (cuBLAS would reject the leading dimensions)
        if (beta == 0.0f) {
            cudaError_t st = cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0,
                                               (size_t)N * sizeof(float), (size_t)M);
            note(st != cudaSuccess, (int)st, "cudaMemset2DAsync");
        } else if (beta != 1.0f) {
            for (int i = 0; i < M; i++) {
                cublasStatus_t st = cublasSscal(g_blas, N, &beta, C + (size_t)i * ldc, 1);
                note(st != CUBLAS_STATUS_SUCCESS, (int)st, "cublasSscal");
            }
        }
        return;
    }
    kn_gemm_cm g = kn_gemm_map(ta, tb, M, N, K, A, lda, B, ldb, ldc);
    cublasStatus_t st = cublasSgemm(g_blas, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    g.transb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha,
                                    (const float *)g.a, g.lda, (const float *)g.b, g.ldb, &beta,
                                    C, g.ldc);
    note(st != CUBLAS_STATUS_SUCCESS, (int)st, "cublasSgemm");
}

// ---- kernels: index -> kn_t_* -------------------------------------------------------------
// Each kernel is one thread per index i < n doing one kn_t_* call (kn_threads.h).
#define KN_KERNEL(name, params, call)                                                              \
    __global__ static void name params                                                             \
    {                                                                                              \
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                  \
        if (i < n)                                                                                 \
            call;                                                                                  \
    }
KN_KERNEL(k_embed_fwd,
          (size_t n, float *out, const int32_t *tok, const int32_t *seg, const float *wte,
           const float *wpe, const float *wse, int T, int C),
          kn_t_embed_fwd(i, out, tok, seg, wte, wpe, wse, T, C))
KN_KERNEL(k_embed_bwd,
          (size_t n, float *dwte, float *dwpe, float *dwse, const float *dout, const int32_t *tok,
           const int32_t *seg, int B, int T, int C),
          kn_t_embed_bwd(i, dwte, dwpe, dwse, dout, tok, seg, B, T, C))
KN_KERNEL(k_ln_fwd,
          (size_t n, float *out, float *mean, float *rstd, const float *inp, const float *w,
           const float *b, int C, float eps),
          kn_t_ln_fwd(i, out, mean, rstd, inp, w, b, C, eps))
KN_KERNEL(k_ln_bwd_row,
          (size_t n, float *dinp, const float *dout, const float *inp, const float *w,
           const float *mean, const float *rstd, int C),
          kn_t_ln_bwd_row(i, dinp, dout, inp, w, mean, rstd, C))
KN_KERNEL(k_ln_bwd_col,
          (size_t n, float *dw, float *db, const float *dout, const float *inp, const float *mean,
           const float *rstd, int N, int C),
          kn_t_ln_bwd_col(i, dw, db, dout, inp, mean, rstd, N, C))
KN_KERNEL(k_bias_fill, (size_t n, float *out, const float *b, int OC),
          kn_t_bias_fill(i, out, b, OC))
KN_KERNEL(k_bias_bwd, (size_t n, float *db, const float *dout, int N, int OC),
          kn_t_bias_bwd(i, db, dout, N, OC))
KN_KERNEL(k_softmax, (size_t n, float *att, const int32_t *valid, int T, int NH),
          kn_t_softmax(i, att, valid, T, NH))
KN_KERNEL(k_attn_drop, (size_t n, float *x, kn_dropout d, int T, int NH),
          kn_t_attn_drop(i, x, d, T, NH))
KN_KERNEL(k_softmax_bwd, (size_t n, float *dp, const float *att, int T, float scale),
          kn_t_softmax_bwd(i, dp, att, T, scale))
KN_KERNEL(k_gelu_fwd, (size_t n, float *out, const float *inp, int kind),
          kn_t_gelu_fwd(i, out, inp, kind))
KN_KERNEL(k_gelu_bwd, (size_t n, float *dinp, const float *inp, const float *dout, int kind),
          kn_t_gelu_bwd(i, dinp, inp, dout, kind))
KN_KERNEL(k_tanh_fwd, (size_t n, float *out, const float *inp), kn_t_tanh_fwd(i, out, inp))
KN_KERNEL(k_tanh_bwd, (size_t n, float *dinp, const float *out, const float *dout),
          kn_t_tanh_bwd(i, dinp, out, dout))
KN_KERNEL(k_residual_fwd, (size_t n, float *out, const float *a, const float *b),
          kn_t_residual_fwd(i, out, a, b))
KN_KERNEL(k_residual_bwd, (size_t n, float *da, float *db, const float *dout),
          kn_t_residual_bwd(i, da, db, dout))
KN_KERNEL(k_dropout,
          (size_t n, float *out, const float *inp, size_t per_seq, kn_dropout d, int accum),
          kn_t_dropout(i, out, inp, per_seq, d, accum))
KN_KERNEL(k_scale, (size_t n, float *x, float s), kn_t_scale(i, x, s))
KN_KERNEL(k_gather, (size_t n, float *out, const float *x, const int32_t *idx, int C),
          kn_t_gather(i, out, x, idx, C))
KN_KERNEL(k_scatter, (size_t n, float *out, const float *x, const int32_t *idx, int C),
          kn_t_scatter(i, out, x, idx, C))
KN_KERNEL(k_xent_fwd,
          (size_t n, float *losses, float *probs, const float *logits, const int32_t *targets,
           int V),
          kn_t_xent_fwd(i, losses, probs, logits, targets, V))
KN_KERNEL(k_xent_bwd,
          (size_t n, float *dlogits, const float *probs, const int32_t *targets, int V,
           float scale),
          kn_t_xent_bwd(i, dlogits, probs, targets, V, scale))
KN_KERNEL(k_adamw,
          (size_t n, float *p, float *g, float *m, float *v, float lr, float b1, float b2,
           float eps, float wd, float bc1, float sbc2, float gscale, uint16_t *w16),
          kn_t_adamw(i, p, g, m, v, lr, b1, b2, eps, wd, bc1, sbc2, gscale, w16))

KN_KERNEL(k_adamw_bf16,
          (size_t n, float *p, float *g, uint16_t *m, uint16_t *v, float lr, float b1, float b2,
           float eps, float wd, float bc1, float sbc2, uint64_t seed, uint64_t stream,
           float gscale, uint16_t *w16),
          kn_t_adamw_bf16(i, p, g, m, v, lr, b1, b2, eps, wd, bc1, sbc2, seed, stream, gscale,
                          w16))

// Block sums of two doubles (shared-memory tree), added to acc[0], acc[1].
__device__ static void block_add2(double a, double b, double *acc)
{
    __shared__ double sa[KN_TPB], sb[KN_TPB];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int s = KN_TPB / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) {
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&acc[0], sa[0]);
        atomicAdd(&acc[1], sb[0]);
    }
}
__global__ static void k_lamb_moments(size_t n, const float *p, const float *g, float *m, float *v,
                                      float b1, float b2, float eps, float wd, float bc1, float bc2,
                                      double *acc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double p2 = 0.0, u2 = 0.0;
    if (i < n)
        kn_t_lamb_moments(i, p, g, m, v, b1, b2, eps, wd, bc1, bc2, &p2, &u2);
    block_add2(p2, u2, acc);
}
KN_KERNEL(k_lamb_apply,
          (size_t n, float *p, const float *m, const float *v, float lr, float eps, float wd,
           float bc1, float bc2, const double *acc),
          kn_t_lamb_apply(i, p, m, v, lr *kn_lamb_trust(acc[0], acc[1]), eps, wd, bc1, bc2))
__global__ static void k_sumsq(size_t n, const float *x, double *acc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double s = i < n ? (double)x[i] * x[i] : 0.0;
    block_add2(s, 0.0, acc);
}

#define LAUNCH(kernel, n, ...)                                                                     \
    do {                                                                                           \
        if ((n) > 0) {                                                                             \
            kernel<<<blocks(n), KN_TPB>>>((size_t)(n), __VA_ARGS__);                               \
            note_launch(#kernel);                                                                  \
        }                                                                                          \
    } while (0)

// ---- ops ----------------------------------------------------------------------------------
extern "C" void kn_cuda_embed_forward(float *out, const int32_t *tok, const int32_t *seg,
                                      const float *wte, const float *wpe, const float *wse, int B,
                                      int T, int C)
{
    LAUNCH(k_embed_fwd, (size_t)B * T, out, tok, seg, wte, wpe, wse, T, C);
}
extern "C" void kn_cuda_embed_backward(float *dwte, float *dwpe, float *dwse, const float *dout,
                                       const int32_t *tok, const int32_t *seg, int B, int T, int C)
{
    LAUNCH(k_embed_bwd, (size_t)C, dwte, dwpe, dwse, dout, tok, seg, B, T, C);
}
extern "C" void kn_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                          const float *w, const float *b, int N, int C, float eps)
{
    LAUNCH(k_ln_fwd, (size_t)N, out, mean, rstd, inp, w, b, C, eps);
}
extern "C" void kn_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                           const float *inp, const float *w, const float *mean,
                                           const float *rstd, int N, int C)
{
    if (dinp)
        LAUNCH(k_ln_bwd_row, (size_t)N, dinp, dout, inp, w, mean, rstd, C);
    if (dw || db)
        LAUNCH(k_ln_bwd_col, (size_t)C, dw, db, dout, inp, mean, rstd, N, C);
}
extern "C" void kn_cuda_matmul_forward(float *out, const float *inp, const float *w, const float *b,
                                       int N, int IC, int OC)
{
    if (b)
        LAUNCH(k_bias_fill, (size_t)N * OC, out, b, OC);
    kn_cuda_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, w, IC, b ? 1.0f : 0.0f, out, OC);
}
extern "C" void kn_cuda_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, int N, int IC, int OC)
{
    if (dinp)
        kn_cuda_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
    if (dw)
        kn_cuda_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (db)
        LAUNCH(k_bias_bwd, (size_t)OC, db, dout, N, OC);
}

// Attention: the CPU's sequence (kn_attention.c), with the per-(b,h) products
// as separate cuBLAS calls and the row math as one thread per row.
extern "C" void kn_cuda_attention_forward(float *out, float *att, const float *qkv,
                                          const int32_t *valid, int B, int T, int C, int NH,
                                          kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    for (int bh = 0; bh < B * NH; bh++) {
        const float *q = qkv + (size_t)(bh / NH) * T * 3 * C + (size_t)(bh % NH) * hs;
        kn_cuda_sgemm(0, 1, T, T, hs, scale, q, 3 * C, q + C, 3 * C, 0.0f, att + bh * TT, T);
    }
    LAUNCH(k_softmax, rows, att, valid, T, NH);
    const float *P = att;
    if (drop.p > 0.0f) {
        float *Pd = scratch(rows * T);
        if (!Pd)
            return;
        cudaMemcpyAsync(Pd, att, rows * T * sizeof(float), cudaMemcpyDeviceToDevice);
        LAUNCH(k_attn_drop, rows, Pd, drop, T, NH);
        P = Pd;
    }
    for (int bh = 0; bh < B * NH; bh++) {
        size_t b = (size_t)(bh / NH), h = (size_t)(bh % NH);
        const float *v = qkv + b * T * 3 * C + h * hs + 2 * C;
        kn_cuda_sgemm(0, 0, T, hs, T, 1.0f, P + bh * TT, T, v, 3 * C, 0.0f,
                      out + b * T * C + h * hs, C);
    }
}

extern "C" void kn_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                           const float *att, int B, int T, int C, int NH,
                                           kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    float *buf = scratch(2 * rows * T);
    if (!buf)
        return;
    float *dP = buf, *Pd = buf + rows * T;
    const float *P = att;
    if (drop.p > 0.0f) {
        cudaMemcpyAsync(Pd, att, rows * T * sizeof(float), cudaMemcpyDeviceToDevice);
        LAUNCH(k_attn_drop, rows, Pd, drop, T, NH);
        P = Pd;
    }
    for (int bh = 0; bh < B * NH; bh++) {
        size_t b = (size_t)(bh / NH), h = (size_t)(bh % NH), tok0 = b * T * 3 * C + h * hs;
        const float *dO = dout + b * T * C + h * hs;
        kn_cuda_sgemm(1, 0, T, hs, T, 1.0f, P + bh * TT, T, dO, C, 1.0f, dqkv + tok0 + 2 * C,
                      3 * C);
        kn_cuda_sgemm(0, 1, T, T, hs, 1.0f, dO, C, qkv + tok0 + 2 * C, 3 * C, 0.0f, dP + bh * TT,
                      T);
    }
    if (drop.p > 0.0f)
        LAUNCH(k_attn_drop, rows, dP, drop, T, NH);
    LAUNCH(k_softmax_bwd, rows, dP, att, T, scale);
    for (int bh = 0; bh < B * NH; bh++) {
        size_t b = (size_t)(bh / NH), h = (size_t)(bh % NH), tok0 = b * T * 3 * C + h * hs;
        kn_cuda_sgemm(0, 0, T, hs, T, 1.0f, dP + bh * TT, T, qkv + tok0 + C, 3 * C, 1.0f,
                      dqkv + tok0, 3 * C);
        kn_cuda_sgemm(1, 0, T, hs, T, 1.0f, dP + bh * TT, T, qkv + tok0, 3 * C, 1.0f,
                      dqkv + tok0 + C, 3 * C);
    }
}

extern "C" void kn_cuda_gelu_forward(float *out, const float *inp, size_t N, int kind)
{
    LAUNCH(k_gelu_fwd, N, out, inp, kind);
}
extern "C" void kn_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                                      int kind)
{
    LAUNCH(k_gelu_bwd, N, dinp, inp, dout, kind);
}
extern "C" void kn_cuda_tanh_forward(float *out, const float *inp, size_t N)
{
    LAUNCH(k_tanh_fwd, N, out, inp);
}
extern "C" void kn_cuda_tanh_backward(float *dinp, const float *out, const float *dout, size_t N)
{
    LAUNCH(k_tanh_bwd, N, dinp, out, dout);
}
extern "C" void kn_cuda_residual_forward(float *out, const float *a, const float *b, size_t N)
{
    LAUNCH(k_residual_fwd, N, out, a, b);
}
extern "C" void kn_cuda_residual_backward(float *da, float *db, const float *dout, size_t N)
{
    LAUNCH(k_residual_bwd, N, da, db, dout);
}
extern "C" void kn_cuda_dropout_forward(float *out, const float *inp, int B, size_t per_seq,
                                        kn_dropout drop)
{
    size_t n = (size_t)B * per_seq;
    if (drop.p <= 0.0f) {
        if (out != inp)
            cudaMemcpyAsync(out, inp, n * sizeof(float), cudaMemcpyDeviceToDevice);
        return;
    }
    LAUNCH(k_dropout, n, out, inp, per_seq, drop, 0);
}
extern "C" void kn_cuda_dropout_backward(float *dinp, const float *dout, int B, size_t per_seq,
                                         kn_dropout drop)
{
    size_t n = (size_t)B * per_seq;
    if (drop.p <= 0.0f) {
        kn_cuda_residual_backward(dinp, NULL, dout, n);
        return;
    }
    LAUNCH(k_dropout, n, dinp, dout, per_seq, drop, 1);
}
extern "C" void kn_cuda_gather_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    LAUNCH(k_gather, (size_t)M * C, out, x, idx, C);
}
extern "C" void kn_cuda_scatter_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    LAUNCH(k_scatter, (size_t)M * C, out, x, idx, C);
}
extern "C" void kn_cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                                             const int32_t *targets, int M, int V)
{
    LAUNCH(k_xent_fwd, (size_t)M, losses, probs, logits, targets, V);
}
extern "C" void kn_cuda_crossentropy_backward(float *dlogits, const float *probs,
                                              const int32_t *targets, int M, int V, float scale)
{
    LAUNCH(k_xent_bwd, (size_t)M, dlogits, probs, targets, V, scale);
}
extern "C" void kn_cuda_adamw_update(float *p, float *g, float *m, float *v, size_t n, float lr,
                                     float beta1, float beta2, float eps, float wd, int t,
                                     float gscale, uint16_t *w16)
{
    float bc1 = (float)(1.0 - pow(beta1, t)), sbc2 = (float)sqrt(1.0 - pow(beta2, t));
    LAUNCH(k_adamw, n, p, g, m, v, lr, beta1, beta2, eps, wd, bc1, sbc2, gscale, w16);
}
extern "C" void kn_cuda_adamw_update_bf16(float *p, float *g, uint16_t *m, uint16_t *v, size_t n,
                                          float lr, float beta1, float beta2, float eps, float wd,
                                          int t, uint64_t seed, uint64_t stream, float gscale,
                                          uint16_t *w16)
{
    float bc1 = (float)(1.0 - pow(beta1, t)), sbc2 = (float)sqrt(1.0 - pow(beta2, t));
    LAUNCH(k_adamw_bf16, n, p, g, m, v, lr, beta1, beta2, eps, wd, bc1, sbc2, seed, stream, gscale,
           w16);
}
extern "C" void kn_cuda_lamb_update(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float wd, int t)
{
    float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)(1.0 - pow(beta2, t));
    cudaMemsetAsync(g_acc, 0, 2 * sizeof(double));
    LAUNCH(k_lamb_moments, n, p, g, m, v, beta1, beta2, eps, wd, bc1, bc2, g_acc);
    LAUNCH(k_lamb_apply, n, p, m, v, lr, eps, wd, bc1, bc2, g_acc);
}
extern "C" double kn_cuda_sumsq(const float *x, size_t n)
{
    double acc[2] = {0.0, 0.0};
    cudaMemsetAsync(g_acc, 0, 2 * sizeof(double));
    LAUNCH(k_sumsq, n, x, g_acc);
    cudaError_t st = cudaMemcpy(acc, g_acc, sizeof acc, cudaMemcpyDeviceToHost);
    note(st != cudaSuccess, (int)st, "kn_cuda_sumsq copy");
    return acc[0];
}
extern "C" void kn_cuda_scale(float *x, size_t n, float s)
{
    LAUNCH(k_scale, n, x, s);
}

// ---- bf16 compute ---------------------------------------------------------------------------
// Products: cublasGemmEx, bf16 operands, CUBLAS_COMPUTE_32F (fp32 accumulation;
// the tensor cores on sm_80 and newer). The row math is kn_threads.h's, as the
// CPU's, which tests/test_kn_bodies.c runs over these launches' index spaces.
KN_KERNEL(k_to_bf16, (size_t n, uint16_t *out16, const float *inp), kn_t_to_bf16(i, out16, inp))
KN_KERNEL(k_ln_fwd_bf16,
          (size_t n, float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
           const float *w, const float *b, int C, float eps),
          kn_t_ln_fwd_bf16(i, out, out16, mean, rstd, inp, w, b, C, eps))
KN_KERNEL(k_bias_bf16, (size_t n, uint16_t *out16, const float *acc, const float *b, int OC),
          kn_t_bias_bf16(i, out16, acc, b, OC))
KN_KERNEL(k_gelu_fwd_bf16, (size_t n, uint16_t *out16, const uint16_t *inp16, int kind),
          kn_t_gelu_fwd_bf16(i, out16, inp16, kind))
KN_KERNEL(k_gelu_bwd_bf16,
          (size_t n, float *dinp, const uint16_t *inp16, const float *dout, int kind),
          kn_t_gelu_bwd_bf16(i, dinp, inp16, dout, kind))
KN_KERNEL(k_gelu_bwd_out_bf16,
          (size_t n, float *dinp, uint16_t *out16, const uint16_t *inp16, const float *dout,
           int kind),
          kn_t_gelu_bwd_out_bf16(i, dinp, out16, inp16, dout, kind))
KN_KERNEL(k_attn_round16, (size_t n, uint16_t *att16, const float *P, int T),
          kn_t_attn_round16(i, att16, P, T))
KN_KERNEL(k_attn_drop16, (size_t n, uint16_t *pd16, const uint16_t *att16, kn_dropout d, int T,
                          int NH),
          kn_t_attn_drop16(i, pd16, att16, d, T, NH))
KN_KERNEL(k_attn_bwd16,
          (size_t n, float *dp, uint16_t *ds16, const uint16_t *att16, kn_dropout d, int T,
           int NH, float scale),
          kn_t_attn_bwd16(i, dp, ds16, att16, d, T, NH, scale))

extern "C" int kn_cuda_bf16_check(sl_err *err)
{
    struct cudaDeviceProp prop;
    cudaError_t st = cudaGetDeviceProperties(&prop, 0);
    if (st != cudaSuccess)
        return sl_err_set(err, SL_ENOTSUP, "cudaGetDeviceProperties: %s", cudaGetErrorString(st));
    if (prop.major < 8)
        return sl_err_set(err, SL_ENOTSUP, "bf16 needs a GPU of compute capability 8.0 (Ampere) "
                          "or newer; %s is sm_%d%d", prop.name, prop.major, prop.minor);
    return 0;
}

extern "C" void kn_cuda_bgemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                              int lda, const uint16_t *B, int ldb, float beta, void *C, int ldc,
                              int c_bf16)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { // no products: C = beta * C
        if (beta == 0.0f) {
            size_t es = c_bf16 ? 2 : 4;
            cudaError_t st = cudaMemset2DAsync(C, (size_t)ldc * es, 0, (size_t)N * es, (size_t)M);
            note(st != cudaSuccess, (int)st, "cudaMemset2DAsync");
        } else if (beta != 1.0f && !c_bf16) {
            kn_cuda_sgemm(0, 0, M, N, 0, 0.0f, NULL, 1, NULL, 1, beta, (float *)C, ldc);
        }
        return;
    }
    kn_gemm_cm g = kn_gemm_map(ta, tb, M, N, K, A, lda, B, ldb, ldc);
    cublasStatus_t st = cublasGemmEx(g_blas, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     g.transb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha,
                                     g.a, CUDA_R_16BF, g.lda, g.b, CUDA_R_16BF, g.ldb, &beta, C,
                                     c_bf16 ? CUDA_R_16BF : CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    note(st != CUBLAS_STATUS_SUCCESS, (int)st, "cublasGemmEx");
}

// The same product for every head of sequence b at once: the heads' blocks
// are hs columns apart in A, B and C (cublasGemmStridedBatchedEx, NH of them).
static void bgemm_heads(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                        int lda, long long sa, const uint16_t *B, int ldb, long long sb, float beta,
                        void *C, int ldc, long long sc, int c_bf16, int NH)
{
    kn_gemm_cm g = kn_gemm_map(ta, tb, M, N, K, A, lda, B, ldb, ldc);
    // kn_gemm_map swaps the operands: the column-major a is B
    cublasStatus_t st = cublasGemmStridedBatchedEx(
        g_blas, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, g.transb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
        g.n, g.k, &alpha, g.a, CUDA_R_16BF, g.lda, sb, g.b, CUDA_R_16BF, g.ldb, sa, &beta, C,
        c_bf16 ? CUDA_R_16BF : CUDA_R_32F, g.ldc, sc, NH, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    note(st != CUBLAS_STATUS_SUCCESS, (int)st, "cublasGemmStridedBatchedEx");
}

extern "C" void kn_cuda_to_bf16(uint16_t *out16, const float *inp, size_t n)
{
    LAUNCH(k_to_bf16, n, out16, inp);
}

extern "C" void kn_cuda_layernorm_forward_bf16(float *out, uint16_t *out16, float *mean,
                                               float *rstd, const float *inp, const float *w,
                                               const float *b, int N, int C, float eps)
{
    LAUNCH(k_ln_fwd_bf16, (size_t)N, out, out16, mean, rstd, inp, w, b, C, eps);
}

extern "C" void kn_cuda_matmul_forward_bf16(float *out, uint16_t *out16, const uint16_t *inp16,
                                            const uint16_t *w16, const float *b, int N, int IC,
                                            int OC)
{
    size_t n = (size_t)N * OC;
    if (out) { // the fp32 path's order: bias first, then the product added
        if (b)
            LAUNCH(k_bias_fill, n, out, b, OC);
        kn_cuda_bgemm(0, 1, N, OC, IC, 1.0f, inp16, IC, w16, IC, b ? 1.0f : 0.0f, out, OC, 0);
        return;
    }
    // bf16 output: the fp32 accumulator plus the bias, rounded once
    float *acc = scratch(n);
    if (!acc)
        return;
    kn_cuda_bgemm(0, 1, N, OC, IC, 1.0f, inp16, IC, w16, IC, 0.0f, acc, OC, 0);
    LAUNCH(k_bias_bf16, n, out16, acc, b, OC);
}

extern "C" void kn_cuda_matmul_backward_bf16(float *dinp, float *dw, float *db, const float *dout,
                                             const uint16_t *inp16, const uint16_t *w16, int N,
                                             int IC, int OC)
{
    size_t n = (size_t)N * OC;
    if (dinp || dw) {
        uint16_t *d16 = (uint16_t *)scratch((n + 1) / 2);
        if (!d16)
            return;
        LAUNCH(k_to_bf16, n, d16, dout);
        if (dinp)
            kn_cuda_bgemm(0, 0, N, IC, OC, 1.0f, d16, OC, w16, IC, 1.0f, dinp, IC, 0);
        if (dw)
            kn_cuda_bgemm(1, 0, OC, IC, N, 1.0f, d16, OC, inp16, IC, 1.0f, dw, IC, 0);
    }
    if (db)
        LAUNCH(k_bias_bwd, (size_t)OC, db, dout, N, OC);
}

// Attention: per sequence, the NH heads' products as one strided batch; the
// rows (softmax, rounding, dropout) one thread per row, as the fp32 path.
extern "C" void kn_cuda_attention_forward_bf16(uint16_t *out16, uint16_t *att16,
                                               const uint16_t *qkv16, const int32_t *valid, int B,
                                               int T, int C, int NH, kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T, n = rows * T;
    // scratch: the fp32 scores, then the dropped probabilities (bf16)
    float *S = scratch(n + (n + 1) / 2);
    if (!S)
        return;
    uint16_t *Pd = (uint16_t *)(S + n);
    for (int b = 0; b < B; b++) {
        const uint16_t *q = qkv16 + (size_t)b * T * 3 * C;
        bgemm_heads(0, 1, T, T, hs, scale, q, 3 * C, hs, q + C, 3 * C, hs, 0.0f,
                    S + (size_t)b * NH * TT, T, (long long)TT, 0, NH);
    }
    LAUNCH(k_softmax, rows, S, valid, T, NH);
    LAUNCH(k_attn_round16, rows, att16, S, T);
    const uint16_t *P = att16;
    if (drop.p > 0.0f) {
        LAUNCH(k_attn_drop16, rows, Pd, att16, drop, T, NH);
        P = Pd;
    }
    for (int b = 0; b < B; b++) {
        const uint16_t *v = qkv16 + (size_t)b * T * 3 * C + 2 * C;
        bgemm_heads(0, 0, T, hs, T, 1.0f, P + (size_t)b * NH * TT, T, (long long)TT, v, 3 * C, hs,
                    0.0f, out16 + (size_t)b * T * C, C, hs, 1, NH);
    }
}

extern "C" void kn_cuda_attention_backward_bf16(float *dqkv, const uint16_t *dout16,
                                                const uint16_t *qkv16, const uint16_t *att16,
                                                int B, int T, int C, int NH, kn_dropout drop)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T, n = rows * T;
    // scratch: dP (fp32), the dropped probabilities and dS (bf16)
    float *dP = scratch(n + 2 * ((n + 1) / 2));
    if (!dP)
        return;
    uint16_t *Pd = (uint16_t *)(dP + n), *dS = Pd + 2 * ((n + 1) / 2);
    const uint16_t *Pv = att16;
    if (drop.p > 0.0f) {
        LAUNCH(k_attn_drop16, rows, Pd, att16, drop, T, NH);
        Pv = Pd;
    }
    for (int b = 0; b < B; b++) {
        size_t tok0 = (size_t)b * T * 3 * C;
        const uint16_t *dO = dout16 + (size_t)b * T * C;
        // dP = dO v^T; dV += Pd^T dO
        bgemm_heads(0, 1, T, T, hs, 1.0f, dO, C, hs, qkv16 + tok0 + 2 * C, 3 * C, hs, 0.0f,
                    dP + (size_t)b * NH * TT, T, (long long)TT, 0, NH);
        bgemm_heads(1, 0, T, hs, T, 1.0f, Pv + (size_t)b * NH * TT, T, (long long)TT, dO, C, hs,
                    1.0f, dqkv + tok0 + 2 * C, 3 * C, hs, 0, NH);
    }
    LAUNCH(k_attn_bwd16, rows, dP, dS, att16, drop, T, NH, scale);
    for (int b = 0; b < B; b++) {
        size_t tok0 = (size_t)b * T * 3 * C;
        const uint16_t *ds = dS + (size_t)b * NH * TT;
        // dQ += dS K; dK += dS^T Q
        bgemm_heads(0, 0, T, hs, T, 1.0f, ds, T, (long long)TT, qkv16 + tok0 + C, 3 * C, hs, 1.0f,
                    dqkv + tok0, 3 * C, hs, 0, NH);
        bgemm_heads(1, 0, T, hs, T, 1.0f, ds, T, (long long)TT, qkv16 + tok0, 3 * C, hs, 1.0f,
                    dqkv + tok0 + C, 3 * C, hs, 0, NH);
    }
}

extern "C" void kn_cuda_gelu_forward_bf16(uint16_t *out16, const uint16_t *inp16, size_t N, int kind)
{
    LAUNCH(k_gelu_fwd_bf16, N, out16, inp16, kind);
}
extern "C" void kn_cuda_gelu_backward_bf16(float *dinp, uint16_t *out16, const uint16_t *inp16,
                                           const float *dout, size_t N, int kind)
{
    if (out16)
        LAUNCH(k_gelu_bwd_out_bf16, N, dinp, out16, inp16, dout, kind);
    else
        LAUNCH(k_gelu_bwd_bf16, N, dinp, inp16, dout, kind);
}
