/* kn_be.h - a compute backend: where a stage's tensors live and which code
 * runs the ops of kn_ops.h on them.
 *
 * The stage (device/dev_stage.c) calls every op through a kn_be, never
 * kn_<op> or kn_cuda_<op> directly, and moves data between the host and its
 * buffers only with upload/download. So one stage implementation runs on:
 *   kn_be_cpu()   host memory, the CPU ops (kn_ops.h); resident = 0, so the
 *                 stage may read its buffers directly and skips the copies;
 *   kn_be_cuda()  device memory, the CUDA ops (kn_cuda.h), from the module
 *                 libskyloom_cuda.so; NULL without it.
 * tests/kn_shadow.c adds a third, resident backend whose buffers cannot be
 * dereferenced on the host (tagged pointers) but whose ops are the CPU's: it
 * proves, without a GPU, that the stage never touches a resident buffer
 * except through this table, and gives bit-identical results.
 *
 * Every op has exactly the signature and semantics of kn_ops.h. Ops may be
 * asynchronous (CUDA): `sync` waits and reports the first failure since the
 * last sync; upload/download/copy/zero are ordered with the ops. sumsq
 * returns a value, so it waits. Use a backend from one thread at a time. */
#ifndef KN_BE_H
#define KN_BE_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"
#include "sl_err.h"

typedef struct kn_be {
    const char *name; /* "cpu", "cuda", ... */
    int resident;     /* 1: buffers are not host memory (use upload/download) */

    int (*init)(sl_err *err); /* NULL: nothing to set up (kn_be_open calls it) */

    void *(*alloc)(size_t bytes, sl_err *err); /* zero bytes allowed; NULL + err on failure */
    void (*free)(void *p);                     /* NULL allowed */
    int (*upload)(void *dst, const void *src, size_t bytes, sl_err *err);   /* host -> buffer */
    int (*download)(void *dst, const void *src, size_t bytes, sl_err *err); /* buffer -> host */
    int (*copy)(void *dst, const void *src, size_t bytes, sl_err *err);     /* buffer -> buffer */
    int (*zero)(void *p, size_t bytes, sl_err *err);
    int (*sync)(sl_err *err);

    void (*embed_forward)(float *out, const int32_t *tok, const int32_t *seg, const float *wte,
                          const float *wpe, const float *wse, int B, int T, int C);
    void (*embed_backward)(float *dwte, float *dwpe, float *dwse, const float *dout,
                           const int32_t *tok, const int32_t *seg, int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *b, int N,
                           int IC, int OC);
    void (*matmul_backward)(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC);
    void (*attention_forward)(float *out, float *att, const float *qkv, const int32_t *valid,
                              int B, int T, int C, int NH, kn_dropout drop);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH, kn_dropout drop);
    void (*gelu_forward)(float *out, const float *inp, size_t N, int kind);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t N, int kind);
    void (*residual_forward)(float *out, const float *a, const float *b, size_t N);
    void (*residual_backward)(float *da, float *db, const float *dout, size_t N);
    void (*dropout_forward)(float *out, const float *inp, int B, size_t per_seq, kn_dropout drop);
    void (*dropout_backward)(float *dinp, const float *dout, int B, size_t per_seq,
                             kn_dropout drop);
    void (*gather_rows)(float *out, const float *x, const int32_t *idx, int M, int C);
    void (*scatter_rows)(float *out, const float *x, const int32_t *idx, int M, int C);
    void (*crossentropy_forward)(float *losses, float *probs, const float *logits,
                                 const int32_t *targets, int M, int V);
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int32_t *targets,
                                  int M, int V, float scale);
    void (*adamw_update)(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                         float beta2, float eps, float wd, int t, float gscale, uint16_t *w16);
    void (*adamw_update_bf16)(float *p, float *g, uint16_t *m, uint16_t *v, size_t n, float lr,
                              float beta1, float beta2, float eps, float wd, int t, uint64_t seed,
                              uint64_t stream, float gscale, uint16_t *w16);
    void (*lamb_update)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, int t);
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, size_t n, float s);

    /* bf16 compute (kn_ops.h). bf16_check: 0 when this backend runs bf16
     * products natively here, else -1 naming what is missing. */
    int (*bf16_check)(sl_err *err);
    void (*to_bf16)(uint16_t *out16, const float *inp, size_t n);
    void (*layernorm_forward_bf16)(float *out, uint16_t *out16, float *mean, float *rstd,
                                   const float *inp, const float *w, const float *b, int N,
                                   int C, float eps);
    void (*matmul_forward_bf16)(float *out, uint16_t *out16, const uint16_t *inp16,
                                const uint16_t *w16, const float *b, int N, int IC, int OC);
    void (*matmul_backward_bf16)(float *dinp, float *dw, float *db, const float *dout,
                                 const uint16_t *inp16, const uint16_t *w16, int N, int IC,
                                 int OC);
    void (*attention_forward_bf16)(uint16_t *out16, uint16_t *att16, const uint16_t *qkv16,
                                   const int32_t *valid, int B, int T, int C, int NH,
                                   kn_dropout drop);
    void (*attention_backward_bf16)(float *dqkv, const uint16_t *dout16, const uint16_t *qkv16,
                                    const uint16_t *att16, int B, int T, int C, int NH,
                                    kn_dropout drop);
    void (*gelu_forward_bf16)(uint16_t *out16, const uint16_t *inp16, size_t N, int kind);
    void (*gelu_backward_bf16)(float *dinp, uint16_t *out16, const uint16_t *inp16,
                               const float *dout, size_t N, int kind);

    /* the classification head's pooler */
    void (*tanh_forward)(float *out, const float *inp, size_t N);
    void (*tanh_backward)(float *dinp, const float *out, const float *dout, size_t N);
} kn_be;

/* Host memory and the CPU ops. Never NULL. */
const kn_be *kn_be_cpu(void);
/* GPU 0 and the CUDA ops, from the CUDA module (kn_cuda.h); NULL in a build
 * without CUDA or where the module was not opened (no NVIDIA driver). Get it
 * through kn_be_open, which also runs its init. */
const kn_be *kn_be_cuda(void);

/* Chooses a backend by name: "cpu", "cuda", or "auto" (CUDA when this build
 * has it and a GPU answers, else the CPU). `why` (may be NULL) receives one
 * line saying what was chosen and why, e.g. "cpu (no GPU: CUDA driver
 * missing: ...)". An explicit "cuda" that cannot be had is an error with the
 * reason, never a silent fall-back. */
const kn_be *kn_be_open(const char *name, char *why, size_t why_n, sl_err *err);
/* 1 if kn_be_open knows the name (for checking options before any work). */
int kn_be_name_ok(const char *name);

#endif
