/* kn_shadow.h - a resident backend for tests on machines without a GPU.
 *
 * Its buffers are host memory, but the pointers it hands out carry bit 62
 * (a non-canonical x86-64 / AArch64 address): any host code that reads or
 * writes one instead of going through upload/download/copy faults at once,
 * as it would silently misbehave with CUDA device memory. Every op checks
 * that each of its pointer arguments is such a buffer (a host pointer given
 * to an op is what a CUDA kernel could not read) and then runs the CPU op on
 * the real addresses, so results must equal the CPU backend's bit for bit.
 * kn_shadow_violation() names the first misuse seen. */
#ifndef KN_SHADOW_H
#define KN_SHADOW_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kn_backend.h"
#include "kn_be.h"
#include "sl_mem.h"

#define KN_SHADOW_TAG ((uintptr_t)1 << 62)

static char kn_shadow_bad[160];

/* Fault injection: every buffer operation (alloc, upload, download, copy,
 * zero, sync) is counted in kn_shadow_ops; the one whose 1-based number is
 * kn_shadow_fail_at fails (0: none does). Stages of a pipeline run on
 * threads of their own, so the count is atomic: the total is the same in
 * every run, though which stage's operation gets a number may differ. */
static _Atomic long kn_shadow_ops;
static long kn_shadow_fail_at;

static int sh_fault(sl_err *err, const char *what)
{
    long k = atomic_fetch_add(&kn_shadow_ops, 1) + 1;
    if (kn_shadow_fail_at && k == kn_shadow_fail_at) {
        sl_err_set(err, SL_EIO, "shadow: injected failure of %s (operation %ld)", what, k);
        return 1;
    }
    return 0;
}

static inline const char *kn_shadow_violation(void) { return kn_shadow_bad[0] ? kn_shadow_bad : NULL; }

static inline void kn_shadow_reset(void) { kn_shadow_bad[0] = 0; }

static inline int kn_shadow_is(const void *p) { return ((uintptr_t)p & KN_SHADOW_TAG) != 0; }

/* The real address of a buffer pointer (NULL stays NULL); a pointer that is
 * not one of ours is recorded as a violation of `what`. */
static inline void *kn_shadow_real(const void *p, const char *what)
{
    if (!p)
        return NULL;
    if (!kn_shadow_is(p) && !kn_shadow_bad[0])
        snprintf(kn_shadow_bad, sizeof kn_shadow_bad, "%s got host pointer %p", what, p);
    return (void *)((uintptr_t)p & ~KN_SHADOW_TAG);
}
#define R(p) kn_shadow_real((p), __func__)

static inline void *kn_shadow_tag(void *p) { return p ? (void *)((uintptr_t)p | KN_SHADOW_TAG) : NULL; }

static void *sh_alloc(size_t bytes, sl_err *err)
{
    if (sh_fault(err, "alloc"))
        return NULL;
    void *p = sl_try_aligned_alloc(bytes ? bytes : 1);
    if (!p) {
        sl_err_set(err, SL_ENOMEM, "shadow: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0xA5, bytes ? bytes : 1); /* like device memory: garbage until written */
    return kn_shadow_tag(p);
}
static void sh_free(void *p) { sl_aligned_free(R(p)); }
static void sh_host(const void *p, const char *what)
{
    if (p && kn_shadow_is(p) && !kn_shadow_bad[0])
        snprintf(kn_shadow_bad, sizeof kn_shadow_bad, "%s got a buffer where host memory belongs", what);
}
static int sh_upload(void *dst, const void *src, size_t bytes, sl_err *err)
{
    if (sh_fault(err, "upload"))
        return -1;
    sh_host(src, __func__);
    if (bytes)
        memcpy(R(dst), src, bytes);
    return 0;
}
static int sh_download(void *dst, const void *src, size_t bytes, sl_err *err)
{
    if (sh_fault(err, "download"))
        return -1;
    sh_host(dst, __func__);
    if (bytes)
        memcpy(dst, R(src), bytes);
    return 0;
}
static int sh_copy(void *dst, const void *src, size_t bytes, sl_err *err)
{
    if (sh_fault(err, "copy"))
        return -1;
    if (bytes)
        memmove(R(dst), R(src), bytes);
    return 0;
}
static int sh_zero(void *p, size_t bytes, sl_err *err)
{
    if (sh_fault(err, "zero"))
        return -1;
    memset(R(p), 0, bytes);
    return 0;
}
static int sh_sync(sl_err *err)
{
    return sh_fault(err, "sync") ? -1 : kn_cpu_status(err);
}

static void sh_embed_forward(float *out, const int32_t *tok, const int32_t *seg, const float *wte,
                             const float *wpe, const float *wse, int B, int T, int C)
{
    kn_embed_forward(R(out), R(tok), R(seg), R(wte), R(wpe), R(wse), B, T, C);
}
static void sh_embed_backward(float *dwte, float *dwpe, float *dwse, const float *dout,
                              const int32_t *tok, const int32_t *seg, int B, int T, int C)
{
    kn_embed_backward(R(dwte), R(dwpe), R(dwse), R(dout), R(tok), R(seg), B, T, C);
}
static void sh_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int N, int C, float eps)
{
    kn_layernorm_forward(R(out), R(mean), R(rstd), R(inp), R(w), R(b), N, C, eps);
}
static void sh_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                  const float *inp, const float *w, const float *mean,
                                  const float *rstd, int N, int C)
{
    kn_layernorm_backward(R(dinp), R(dw), R(db), R(dout), R(inp), R(w), R(mean), R(rstd), N, C);
}
static void sh_matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                              int IC, int OC)
{
    kn_matmul_forward(R(out), R(inp), R(w), R(b), N, IC, OC);
}
static void sh_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, int N, int IC, int OC)
{
    kn_matmul_backward(R(dinp), R(dw), R(db), R(dout), R(inp), R(w), N, IC, OC);
}
static void sh_attention_forward(float *out, float *att, const float *qkv, const int32_t *valid,
                                 int B, int T, int C, int NH, kn_dropout drop)
{
    kn_attention_forward(R(out), R(att), R(qkv), R(valid), B, T, C, NH, drop);
}
static void sh_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *att, int B, int T, int C, int NH, kn_dropout drop)
{
    kn_attention_backward(R(dqkv), R(dout), R(qkv), R(att), B, T, C, NH, drop);
}
static void sh_gelu_forward(float *out, const float *inp, size_t N, int kind)
{
    kn_gelu_forward(R(out), R(inp), N, kind);
}
static void sh_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N, int kind)
{
    kn_gelu_backward(R(dinp), R(inp), R(dout), N, kind);
}
static void sh_tanh_forward(float *out, const float *inp, size_t N)
{
    kn_tanh_forward(R(out), R(inp), N);
}
static void sh_tanh_backward(float *dinp, const float *out, const float *dout, size_t N)
{
    kn_tanh_backward(R(dinp), R(out), R(dout), N);
}
static void sh_residual_forward(float *out, const float *a, const float *b, size_t N)
{
    kn_residual_forward(R(out), R(a), R(b), N);
}
static void sh_residual_backward(float *da, float *db, const float *dout, size_t N)
{
    kn_residual_backward(R(da), R(db), R(dout), N);
}
static void sh_dropout_forward(float *out, const float *inp, int B, size_t per_seq, kn_dropout d)
{
    kn_dropout_forward(R(out), R(inp), B, per_seq, d);
}
static void sh_dropout_backward(float *dinp, const float *dout, int B, size_t per_seq,
                                kn_dropout d)
{
    kn_dropout_backward(R(dinp), R(dout), B, per_seq, d);
}
static void sh_gather_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    kn_gather_rows(R(out), R(x), R(idx), M, C);
}
static void sh_scatter_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    kn_scatter_rows(R(out), R(x), R(idx), M, C);
}
static void sh_xent_forward(float *losses, float *probs, const float *logits,
                            const int32_t *targets, int M, int V)
{
    kn_crossentropy_forward(R(losses), R(probs), R(logits), R(targets), M, V);
}
static void sh_xent_backward(float *dlogits, const float *probs, const int32_t *targets, int M,
                             int V, float scale)
{
    kn_crossentropy_backward(R(dlogits), R(probs), R(targets), M, V, scale);
}
static void sh_adamw(float *p, float *g, float *m, float *v, size_t n, float lr, float b1,
                     float b2, float eps, float wd, int t, float gscale, uint16_t *w16)
{
    kn_adamw_update(R(p), R(g), R(m), R(v), n, lr, b1, b2, eps, wd, t, gscale, R(w16));
}
static void sh_lamb(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, int t)
{
    kn_lamb_update(R(p), R(g), R(m), R(v), n, lr, b1, b2, eps, wd, t);
}
static void sh_adamw_bf16(float *p, float *g, uint16_t *m, uint16_t *v, size_t n, float lr,
                          float b1, float b2, float eps, float wd, int t, uint64_t seed,
                          uint64_t stream, float gscale, uint16_t *w16)
{
    kn_adamw_update_bf16(R(p), R(g), R(m), R(v), n, lr, b1, b2, eps, wd, t, seed, stream, gscale,
                         R(w16));
}
static void sh_to_bf16(uint16_t *out16, const float *inp, size_t n)
{
    kn_to_bf16(R(out16), R(inp), n);
}
static void sh_layernorm_forward_bf16(float *out, uint16_t *out16, float *mean, float *rstd,
                                     const float *inp, const float *w, const float *b, int N,
                                     int C, float eps)
{
    kn_layernorm_forward_bf16(R(out), R(out16), R(mean), R(rstd), R(inp), R(w), R(b), N, C, eps);
}
static void sh_matmul_forward_bf16(float *out, uint16_t *out16, const uint16_t *inp16,
                                   const uint16_t *w16, const float *b, int N, int IC, int OC)
{
    kn_matmul_forward_bf16(R(out), R(out16), R(inp16), R(w16), R(b), N, IC, OC);
}
static void sh_matmul_backward_bf16(float *dinp, float *dw, float *db, const float *dout,
                                    const uint16_t *inp16, const uint16_t *w16, int N, int IC,
                                    int OC)
{
    kn_matmul_backward_bf16(R(dinp), R(dw), R(db), R(dout), R(inp16), R(w16), N, IC, OC);
}
static void sh_attention_forward_bf16(uint16_t *out16, uint16_t *att16, const uint16_t *qkv16,
                                      const int32_t *valid, int B, int T, int C, int NH,
                                      kn_dropout drop)
{
    kn_attention_forward_bf16(R(out16), R(att16), R(qkv16), R(valid), B, T, C, NH, drop);
}
static void sh_attention_backward_bf16(float *dqkv, const uint16_t *dout16, const uint16_t *qkv16,
                                       const uint16_t *att16, int B, int T, int C, int NH,
                                       kn_dropout drop)
{
    kn_attention_backward_bf16(R(dqkv), R(dout16), R(qkv16), R(att16), B, T, C, NH, drop);
}
static void sh_gelu_forward_bf16(uint16_t *out16, const uint16_t *inp16, size_t N, int kind)
{
    kn_gelu_forward_bf16(R(out16), R(inp16), N, kind);
}
static void sh_gelu_backward_bf16(float *dinp, uint16_t *out16, const uint16_t *inp16,
                                  const float *dout, size_t N, int kind)
{
    kn_gelu_backward_bf16(R(dinp), R(out16), R(inp16), R(dout), N, kind);
}
static double sh_sumsq(const float *x, size_t n) { return kn_sumsq(R(x), n); }
static void sh_scale(float *x, size_t n, float s) { kn_scale(R(x), n, s); }
#undef R

static const kn_be kn_shadow_be = {
    .name = "shadow",
    .resident = 1,
    .init = NULL,
    .alloc = sh_alloc,
    .free = sh_free,
    .upload = sh_upload,
    .download = sh_download,
    .copy = sh_copy,
    .zero = sh_zero,
    .sync = sh_sync,
    .embed_forward = sh_embed_forward,
    .embed_backward = sh_embed_backward,
    .layernorm_forward = sh_layernorm_forward,
    .layernorm_backward = sh_layernorm_backward,
    .matmul_forward = sh_matmul_forward,
    .matmul_backward = sh_matmul_backward,
    .attention_forward = sh_attention_forward,
    .attention_backward = sh_attention_backward,
    .gelu_forward = sh_gelu_forward,
    .gelu_backward = sh_gelu_backward,
    .residual_forward = sh_residual_forward,
    .residual_backward = sh_residual_backward,
    .dropout_forward = sh_dropout_forward,
    .dropout_backward = sh_dropout_backward,
    .gather_rows = sh_gather_rows,
    .scatter_rows = sh_scatter_rows,
    .crossentropy_forward = sh_xent_forward,
    .crossentropy_backward = sh_xent_backward,
    .adamw_update = sh_adamw,
    .adamw_update_bf16 = sh_adamw_bf16,
    .lamb_update = sh_lamb,
    .sumsq = sh_sumsq,
    .scale = sh_scale,
    .bf16_check = kn_cpu_bf16_check,
    .to_bf16 = sh_to_bf16,
    .layernorm_forward_bf16 = sh_layernorm_forward_bf16,
    .matmul_forward_bf16 = sh_matmul_forward_bf16,
    .matmul_backward_bf16 = sh_matmul_backward_bf16,
    .attention_forward_bf16 = sh_attention_forward_bf16,
    .attention_backward_bf16 = sh_attention_backward_bf16,
    .gelu_forward_bf16 = sh_gelu_forward_bf16,
    .gelu_backward_bf16 = sh_gelu_backward_bf16,
    .tanh_forward = sh_tanh_forward,
    .tanh_backward = sh_tanh_backward,
};

#endif
