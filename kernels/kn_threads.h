/* kn_threads.h - the work of one CUDA thread of each kernel, given its index.
 *
 * Each kn_t_* function is what one thread of the matching kernel in
 * kernels/cuda/kn_cuda_ops.cu does: that kernel is only
 *     i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) kn_t_xxx(i, ...);
 * tests/test_kn_bodies.c runs the same functions for every i in [0, n) on
 * the CPU and compares with the CPU ops, so the index arithmetic of every
 * CUDA kernel is tested on machines without a GPU. The CPU ops call these
 * too where their loop is the same (elementwise ops, rows). */
#ifndef KN_THREADS_H
#define KN_THREADS_H

#include "kn_body.h"
#include "kn_ops.h"

/* embeddings: one thread per output row r = b*T + t / per column c */
SL_HD KN_INLINE void kn_t_embed_fwd(size_t r, float *out, const int32_t *tok, const int32_t *seg,
                                    const float *wte, const float *wpe, const float *wse, int T,
                                    int C)
{
    kn_embed_row_fwd(out + r * C, wte, wpe, wse, tok[r], (int)(r % T), seg ? seg[r] : 0, C);
}
SL_HD KN_INLINE void kn_t_embed_bwd(size_t c, float *dwte, float *dwpe, float *dwse,
                                    const float *dout, const int32_t *tok, const int32_t *seg,
                                    int B, int T, int C)
{
    kn_embed_col_bwd(dwte, dwpe, dwse, dout, tok, seg, B, T, C, (int)c);
}

/* layernorm: one thread per row (forward, dinp) / per column (dw, db) */
SL_HD KN_INLINE void kn_t_ln_fwd(size_t n, float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int C, float eps)
{
    kn_layernorm_row_fwd(out + n * C, mean + n, rstd + n, inp + n * C, w, b, C, eps);
}
/* forward, and the row rounded to bf16 into out16 */
SL_HD KN_INLINE void kn_t_ln_fwd_bf16(size_t n, float *out, uint16_t *out16, float *mean,
                                      float *rstd, const float *inp, const float *w,
                                      const float *b, int C, float eps)
{
    kn_layernorm_row_fwd(out + n * C, mean + n, rstd + n, inp + n * C, w, b, C, eps);
    KN_SIMD
    for (int c = 0; c < C; c++)
        out16[n * C + c] = sl_f32_to_bf16(out[n * C + c]);
}
SL_HD KN_INLINE void kn_t_ln_bwd_row(size_t n, float *dinp, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd, int C)
{
    kn_layernorm_row_bwd(dinp + n * C, dout + n * C, inp + n * C, w, mean[n], rstd[n], C);
}
SL_HD KN_INLINE void kn_t_ln_bwd_col(size_t c, float *dw, float *db, const float *dout,
                                     const float *inp, const float *mean, const float *rstd, int N,
                                     int C)
{
    kn_layernorm_col_bwd(dw, db, dout, inp, mean, rstd, N, C, (int)c);
}

/* linear: bias broadcast (per element of out) and bias gradient (per column) */
SL_HD KN_INLINE void kn_t_bias_fill(size_t i, float *out, const float *b, int OC)
{
    out[i] = b[i % OC];
}
SL_HD KN_INLINE void kn_t_bias_bwd(size_t o, float *db, const float *dout, int N, int OC)
{
    db[o] += kn_colsum(dout, N, OC, (int)o);
}

/* attention: one thread per row of the (B,NH,T,T) score tensor, row = (b*NH + h)*T + i */
SL_HD KN_INLINE void kn_t_softmax(size_t row, float *att, const int32_t *valid, int T, int NH)
{
    size_t b = row / ((size_t)NH * T);
    kn_softmax_row_masked(att + row * T, att + row * T, valid ? valid + b * T : NULL, T);
}
SL_HD KN_INLINE void kn_t_attn_drop(size_t row, float *x, kn_dropout d, int T, int NH)
{
    size_t per = (size_t)NH * T;
    kn_attn_dropout_row(x + row * T, d.seed, d.stream, d.seq0, (int)(row / per), NH, T,
                        (int)(row % per), d.p);
}
SL_HD KN_INLINE void kn_t_softmax_bwd(size_t row, float *dp, const float *att, int T, float scale)
{
    kn_softmax_row_bwd(dp + row * T, att + row * T, dp + row * T, T, scale);
}

/* elementwise: one thread per element */
SL_HD KN_INLINE void kn_t_gelu_fwd(size_t i, float *out, const float *inp, int kind)
{
    out[i] = kn_gelu_fwd_elem(inp[i], kind);
}
SL_HD KN_INLINE void kn_t_gelu_bwd(size_t i, float *dinp, const float *inp, const float *dout,
                                   int kind)
{
    dinp[i] += kn_gelu_bwd_elem(inp[i], dout[i], kind);
}
SL_HD KN_INLINE void kn_t_tanh_fwd(size_t i, float *out, const float *inp)
{
    out[i] = kn_tanhf(inp[i]);
}
SL_HD KN_INLINE void kn_t_tanh_bwd(size_t i, float *dinp, const float *out, const float *dout)
{
    dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}
SL_HD KN_INLINE void kn_t_residual_fwd(size_t i, float *out, const float *a, const float *b)
{
    out[i] = a[i] + b[i];
}
SL_HD KN_INLINE void kn_t_residual_bwd(size_t i, float *da, float *db, const float *dout)
{
    if (da)
        da[i] += dout[i];
    if (db)
        db[i] += dout[i];
}
/* rows: one thread per element i of the (M,C) gathered tensor */
SL_HD KN_INLINE void kn_t_gather(size_t i, float *out, const float *x, const int32_t *idx, int C)
{
    out[i] = x[(size_t)idx[i / C] * C + i % C];
}
SL_HD KN_INLINE void kn_t_scatter(size_t i, float *out, const float *x, const int32_t *idx, int C)
{
    out[(size_t)idx[i / C] * C + i % C] = x[i];
}
/* Hidden dropout of flat element f of a (B, per_seq) tensor; accum: += (backward). */
SL_HD KN_INLINE void kn_t_dropout(size_t f, float *out, const float *inp, size_t per_seq,
                                  kn_dropout d, int accum)
{
    uint64_t idx = kn_dropout_index(d.seq0, f / per_seq, per_seq, f % per_seq);
    float y = inp[f] * (kn_dropout_keep(d.seed, d.stream, idx, d.p) ? kn_dropout_scale(d.p) : 0.0f);
    if (accum)
        out[f] += y;
    else
        out[f] = y;
}
SL_HD KN_INLINE void kn_t_scale(size_t i, float *x, float s)
{
    x[i] *= s;
}

/* bf16 compute: one thread per element */
SL_HD KN_INLINE void kn_t_to_bf16(size_t i, uint16_t *out16, const float *inp)
{
    out16[i] = sl_f32_to_bf16(inp[i]);
}
SL_HD KN_INLINE void kn_t_gelu_fwd_bf16(size_t i, uint16_t *out16, const uint16_t *inp16, int kind)
{
    float g, dg;
    kn_gelu16_elem(sl_bf16_to_f32(inp16[i]), kind, &g, &dg);
    out16[i] = sl_f32_to_bf16(g);
}
/* dinp += gelu'(x) dout */
SL_HD KN_INLINE void kn_t_gelu_bwd_bf16(size_t i, float *dinp, const uint16_t *inp16,
                                        const float *dout, int kind)
{
    float g, dg;
    kn_gelu16_elem(sl_bf16_to_f32(inp16[i]), kind, &g, &dg);
    dinp[i] += dg * dout[i];
}
/* the same, and the forward's value again into out16 */
SL_HD KN_INLINE void kn_t_gelu_bwd_out_bf16(size_t i, float *dinp, uint16_t *out16,
                                            const uint16_t *inp16, const float *dout, int kind)
{
    float g, dg;
    kn_gelu16_elem(sl_bf16_to_f32(inp16[i]), kind, &g, &dg);
    dinp[i] += dg * dout[i];
    out16[i] = sl_f32_to_bf16(g);
}
/* a product's fp32 accumulator plus the bias, rounded once (the CPU's
 * oneDNN primitive does the same inside) */
SL_HD KN_INLINE void kn_t_bias_bf16(size_t i, uint16_t *out16, const float *acc, const float *b,
                                    int OC)
{
    out16[i] = sl_f32_to_bf16(b ? acc[i] + b[i % OC] : acc[i]);
}
/* attention in bf16, one thread per row of (B,NH,T,T): att16 = bf16(P) */
SL_HD KN_INLINE void kn_t_attn_round16(size_t row, uint16_t *att16, const float *P, int T)
{
    for (int j = 0; j < T; j++)
        att16[row * T + j] = sl_f32_to_bf16(P[row * T + j]);
}
/* pd16 = bf16(att16 * dropout multiplier): what the product with v takes */
SL_HD KN_INLINE void kn_t_attn_drop16(size_t row, uint16_t *pd16, const uint16_t *att16,
                                      kn_dropout d, int T, int NH)
{
    size_t per = (size_t)NH * T;
    uint64_t base = kn_dropout_index(d.seq0, row / per, per * T, (row % per) * T);
    float sc = kn_dropout_scale(d.p);
    for (int j = 0; j < T; j++)
        pd16[row * T + j] = sl_f32_to_bf16(
            sl_bf16_to_f32(att16[row * T + j]) *
            (kn_dropout_keep(d.seed, d.stream, base + j, d.p) ? sc : 0.0f));
}
/* attention backward in bf16, one thread per row: P = att16 widened, the
 * dropped probabilities pd16 as forward made them, dP *= the multiplier,
 * then dS = softmax backward (in place in dp), ds16 = bf16(dS) */
SL_HD KN_INLINE void kn_t_attn_bwd16(size_t row, float *dp, uint16_t *ds16, const uint16_t *att16,
                                     kn_dropout d, int T, int NH, float scale)
{
    size_t per = (size_t)NH * T;
    uint64_t base = kn_dropout_index(d.seq0, row / per, per * T, (row % per) * T);
    float sc = kn_dropout_scale(d.p), dot = 0.0f;
    float *x = dp + row * T;
    const uint16_t *a = att16 + row * T;
    for (int j = 0; j < T; j++) {
        if (d.p > 0.0f)
            x[j] *= kn_dropout_keep(d.seed, d.stream, base + j, d.p) ? sc : 0.0f;
        dot += sl_bf16_to_f32(a[j]) * x[j];
    }
    for (int j = 0; j < T; j++)
        ds16[row * T + j] = sl_f32_to_bf16(scale * sl_bf16_to_f32(a[j]) * (x[j] - dot));
}

/* cross-entropy: one thread per masked position */
SL_HD KN_INLINE void kn_t_xent_fwd(size_t i, float *losses, float *probs, const float *logits,
                                   const int32_t *targets, int V)
{
    losses[i] = kn_xent_row_fwd(probs + i * V, logits + i * V, targets[i], V);
}
SL_HD KN_INLINE void kn_t_xent_bwd(size_t i, float *dlogits, const float *probs,
                                   const int32_t *targets, int V, float scale)
{
    kn_xent_row_bwd(dlogits + i * V, probs + i * V, targets[i], V, scale);
}

/* optimizers: one thread per element. The gradient is scaled by gscale (the
 * clipping factor) first and written back, as a scaling pass of its own
 * would leave it (g * 1 is g, bit for bit); w16, when given, receives the
 * updated parameter rounded to bf16 (the products' copy). One pass over
 * the tensor instead of three. */
SL_HD KN_INLINE float kn_t_scaled_grad(size_t i, float *g, float gscale)
{
    float gi = g[i] * gscale;
    g[i] = gi;
    return gi;
}
SL_HD KN_INLINE void kn_t_adamw(size_t i, float *p, float *g, float *m, float *v, float lr,
                                float beta1, float beta2, float eps, float wd, float bc1,
                                float sqrt_bc2, float gscale, uint16_t *w16)
{
    kn_adamw_elem(&p[i], kn_t_scaled_grad(i, g, gscale), &m[i], &v[i], lr, beta1, beta2, eps, wd,
                  bc1, sqrt_bc2);
    if (w16)
        kn_t_to_bf16(i, w16, p);
}
/* AdamW with bf16 moments: one thread per element, its random word drawn by
 * index (the CPU op draws the same words a block at a time). */
SL_HD KN_INLINE void kn_t_adamw_bf16(size_t i, float *p, float *g, uint16_t *m, uint16_t *v,
                                     float lr, float beta1, float beta2, float eps, float wd,
                                     float bc1, float sqrt_bc2, uint64_t seed, uint64_t stream,
                                     float gscale, uint16_t *w16)
{
    kn_adamw_bf16_elem(&p[i], kn_t_scaled_grad(i, g, gscale), &m[i], &v[i], lr, beta1, beta2, eps,
                       wd, bc1, sqrt_bc2, sl_rng_u32(seed, stream, i));
    if (w16)
        kn_t_to_bf16(i, w16, p);
}
/* LAMB pass 1: moments; returns u_i^2 in *u2 and p_i^2 in *p2 for the norms. */
SL_HD KN_INLINE void kn_t_lamb_moments(size_t i, const float *p, const float *g, float *m, float *v,
                                       float beta1, float beta2, float eps, float wd, float bc1,
                                       float bc2, double *p2, double *u2)
{
    kn_lamb_moments(g[i], &m[i], &v[i], beta1, beta2);
    float u = kn_lamb_dir(p[i], m[i], v[i], eps, wd, bc1, bc2);
    *p2 = (double)p[i] * p[i];
    *u2 = (double)u * u;
}
/* LAMB pass 2: p -= lr * trust * u. */
SL_HD KN_INLINE void kn_t_lamb_apply(size_t i, float *p, const float *m, const float *v, float step,
                                     float eps, float wd, float bc1, float bc2)
{
    p[i] -= step * kn_lamb_dir(p[i], m[i], v[i], eps, wd, bc1, bc2);
}

#endif
