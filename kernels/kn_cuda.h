/* kn_cuda.h - the ops of kn_ops.h on a CUDA GPU (built only when HAVE_CUDA).
 *
 * kn_cuda_<op> takes exactly the arguments of kn_<op> in kn_ops.h, with every
 * pointer a device pointer (from kn_cuda_alloc), and the same semantics:
 * backward accumulates, NULL bias means no bias, dropout masks from the same
 * Philox indices (so CPU and GPU drop the same elements). Calls are
 * asynchronous on the default stream; kn_cuda_sync waits and reports the
 * first error. kn_cuda_sumsq is synchronous (it returns a value).
 *
 * Kernels are launch geometry around kn_threads.h (one thread per element,
 * row or column as named there); products go to cuBLAS through kn_cuda_sgemm,
 * which uses kn_gemm_map like the CPU's kn_sgemm. Simple rather than fast:
 * no GPU was available to tune (or run) them, see docs/kernels.md.
 *
 * Callers outside the module use kn_be_open / kn_be_cuda (kn_be.h), which
 * load it; only tests/test_kn_cuda.c links it directly. A build without nvcc
 * has no module and no kn_cuda_* symbols at all. One cuBLAS handle and
 * one scratch buffer per process: call this API from one thread at a time. */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kn_ops.h"
#include "sl_err.h"

/* ---- the CUDA module (libskyloom_cuda.so) ------------------------------
 * Everything that needs the CUDA runtime or cuBLAS lives in this shared
 * library, which the rest of Skyloom never links: kernels/cpu/kn_cuda_load.c
 * opens it on the first kn_cuda_probe() of a machine that has the NVIDIA
 * driver, so a CPU-only run of a CUDA build does not map cuBLAS (~210 MiB of
 * resident memory at start-up). Its one exported entry point: */
#include "kn_backend.h"
#include "kn_be.h"

#define KN_CUDA_MODULE_ABI 2
typedef struct kn_cuda_module {
    int abi; /* KN_CUDA_MODULE_ABI */
    const kn_cuda_info *(*probe)(void);
    int (*selftest)(char *reason, size_t n);
    const kn_be *be;
} kn_cuda_module;
const kn_cuda_module *skyloom_cuda_module(void);
/* The module's own probe and self-test, behind kn_cuda_probe/selftest. */
const kn_cuda_info *kn_cudart_probe(void);
int kn_cudart_selftest(char *reason, size_t n);

/* Device 0 and a cuBLAS handle; idempotent. -1 (SL_ENOTSUP) without a GPU. */
int kn_cuda_init(sl_err *err);
/* Frees the handle and the ops' scratch buffers. */
void kn_cuda_shutdown(void);
void *kn_cuda_alloc(size_t bytes, sl_err *err);
void kn_cuda_free(void *p);
int kn_cuda_upload(void *dst, const void *src, size_t bytes, sl_err *err);
int kn_cuda_download(void *dst, const void *src, size_t bytes, sl_err *err);
int kn_cuda_copy(void *dst, const void *src, size_t bytes, sl_err *err); /* device to device */
int kn_cuda_zero(void *p, size_t bytes, sl_err *err);
int kn_cuda_sync(sl_err *err);

/* Row-major C = alpha op(A) op(B) + beta C on device pointers (cuBLAS). */
void kn_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);

void kn_cuda_embed_forward(float *out, const int32_t *tok, const int32_t *seg, const float *wte,
                           const float *wpe, const float *wse, int B, int T, int C);
void kn_cuda_embed_backward(float *dwte, float *dwpe, float *dwse, const float *dout,
                            const int32_t *tok, const int32_t *seg, int B, int T, int C);
void kn_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int N, int C, float eps);
void kn_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int N, int C);
void kn_cuda_matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                            int IC, int OC);
void kn_cuda_matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, int N, int IC, int OC);
void kn_cuda_attention_forward(float *out, float *att, const float *qkv, const int32_t *valid,
                               int B, int T, int C, int NH, kn_dropout drop);
void kn_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                int B, int T, int C, int NH, kn_dropout drop);
void kn_cuda_gelu_forward(float *out, const float *inp, size_t N, int kind);
void kn_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N, int kind);
void kn_cuda_tanh_forward(float *out, const float *inp, size_t N);
void kn_cuda_tanh_backward(float *dinp, const float *out, const float *dout, size_t N);
void kn_cuda_residual_forward(float *out, const float *a, const float *b, size_t N);
void kn_cuda_residual_backward(float *da, float *db, const float *dout, size_t N);
void kn_cuda_dropout_forward(float *out, const float *inp, int B, size_t per_seq, kn_dropout drop);
void kn_cuda_dropout_backward(float *dinp, const float *dout, int B, size_t per_seq,
                              kn_dropout drop);
void kn_cuda_gather_rows(float *out, const float *x, const int32_t *idx, int M, int C);
void kn_cuda_scatter_rows(float *out, const float *x, const int32_t *idx, int M, int C);
void kn_cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                                  const int32_t *targets, int M, int V);
void kn_cuda_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                                   int M, int V, float scale);
void kn_cuda_adamw_update(float *p, float *g, float *m, float *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, int t, float gscale,
                          uint16_t *w16);
void kn_cuda_adamw_update_bf16(float *p, float *g, uint16_t *m, uint16_t *v, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, int t, uint64_t seed,
                               uint64_t stream, float gscale, uint16_t *w16);
void kn_cuda_lamb_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int t);
double kn_cuda_sumsq(const float *x, size_t n);
void kn_cuda_scale(float *x, size_t n, float s);

/* bf16 compute (kn_ops.h's bf16 ops): cublasGemmEx with bf16 operands and
 * CUBLAS_COMPUTE_32F (fp32 accumulation on the tensor cores), the rest
 * launch geometry around kn_threads.h's bodies. kn_cuda_bf16_check: 0 on a
 * GPU of compute capability 8.0 (Ampere) or newer, else -1 naming it. */
int kn_cuda_bf16_check(sl_err *err);
/* Row-major C = alpha op(A) op(B) + beta C, A and B bf16, C fp32 (c_bf16
 * 0) or bf16 (1); the mapping is kn_gemm_map's. */
void kn_cuda_bgemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                   const uint16_t *B, int ldb, float beta, void *C, int ldc, int c_bf16);
void kn_cuda_to_bf16(uint16_t *out16, const float *inp, size_t n);
void kn_cuda_layernorm_forward_bf16(float *out, uint16_t *out16, float *mean, float *rstd,
                                    const float *inp, const float *w, const float *b, int N,
                                    int C, float eps);
void kn_cuda_matmul_forward_bf16(float *out, uint16_t *out16, const uint16_t *inp16,
                                 const uint16_t *w16, const float *b, int N, int IC, int OC);
void kn_cuda_matmul_backward_bf16(float *dinp, float *dw, float *db, const float *dout,
                                  const uint16_t *inp16, const uint16_t *w16, int N, int IC,
                                  int OC);
void kn_cuda_attention_forward_bf16(uint16_t *out16, uint16_t *att16, const uint16_t *qkv16,
                                    const int32_t *valid, int B, int T, int C, int NH,
                                    kn_dropout drop);
void kn_cuda_attention_backward_bf16(float *dqkv, const uint16_t *dout16, const uint16_t *qkv16,
                                     const uint16_t *att16, int B, int T, int C, int NH,
                                     kn_dropout drop);
void kn_cuda_gelu_forward_bf16(uint16_t *out16, const uint16_t *inp16, size_t N, int kind);
void kn_cuda_gelu_backward_bf16(float *dinp, uint16_t *out16, const uint16_t *inp16,
                                const float *dout, size_t N, int kind);

#ifdef __cplusplus
}
#endif

#endif
