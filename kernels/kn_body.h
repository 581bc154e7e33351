/* kn_body.h - the per-element and per-row math of every op, written once.
 *
 * SL_HD makes these static inline for the C compiler and __host__ __device__
 * under nvcc: the CPU kernels (kernels/cpu/) and the CUDA kernels
 * (kernels/cuda/) call the very same bodies, and tests/test_kn_bodies.c runs
 * them over the index space of the CUDA launches to check that geometry on a
 * machine without a GPU. Only loops and thread cooperation differ. */
#ifndef KN_BODY_H
#define KN_BODY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "sl_float.h"
#include "sl_hd.h"
#include "sl_rng.h"

#define KN_SQRT1_2 0.70710678118654752440f
#define KN_INV_SQRT_2PI 0.39894228040143267794f
#define KN_SQRT_2_OVER_PI 0.79788456080286535588f
#define KN_GELU_TANH_C 0.044715f

/* Loops over these bodies vectorise on the CPU (OpenMP simd); nvcc ignores it. */
#if defined(_OPENMP) && !defined(__CUDACC__)
#define KN_PRAGMA(x) _Pragma(#x)
#define KN_SIMD KN_PRAGMA(omp simd)
#define KN_SIMD_SUM(v) KN_PRAGMA(omp simd reduction(+ : v))
#define KN_SIMD_SUM2(a, b) KN_PRAGMA(omp simd reduction(+ : a, b))
#define KN_SIMD_MAX(v) KN_PRAGMA(omp simd reduction(max : v))
#else
#define KN_SIMD_SUM2(a, b)
#define KN_SIMD
#define KN_SIMD_SUM(v)
#define KN_SIMD_MAX(v)
#endif

/* KN_CLONES: a CPU op compiled for AVX-512, AVX2 and baseline x86-64, the
 * best chosen once at load time (GCC target_clones, an ifunc). The bodies
 * inline into each clone; with -ffp-contract=off (kernels/meson.build) every
 * element gets the same IEEE operations at any width, so elementwise ops are
 * bitwise the same on every x86-64; only reductions (softmax sums) may
 * differ in the last bits between machines. */
/* Not under ThreadSanitizer: an ifunc resolver runs before its runtime. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_THREAD__)
#define KN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KN_CLONES
#endif
/* Row bodies are forced inline so that they land inside each clone (a call
 * would go to the baseline version). */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define KN_INLINE __attribute__((always_inline))
#else
#define KN_INLINE
#endif

/* ---- exp, erf, tanh without library calls ------------------------------------
 * libm's expf/erff/tanhf are scalar calls that stop the compiler from
 * vectorising softmax, cross-entropy and GELU loops (they were most of those
 * ops' time). These use arithmetic and bit operations only.
 * kn_expf: exp(x) = 2^k exp(r), k = rint(x/ln2), r = x - k ln2 (Cody-Waite),
 * exp(r) by its degree-7 Taylor polynomial on |r| <= ln2/2 (truncation 6e-9);
 * measured max relative error ~2 ulp. 0 below -87 (where exp is denormal). */
SL_HD KN_INLINE float kn_expf(float x)
{
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - kf * 0.693145751953125f;
    r = r - kf * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float sc = sl_bits_f32((uint32_t)((int32_t)kf + 127) << 23);
    return x < -87.0f ? 0.0f : p * sc;
}
/* erf by Abramowitz & Stegun 7.1.26: absolute error <= 1.5e-7 (about one
 * float ulp of 1), odd symmetric. kn_erff_e takes exp(-x*x) precomputed
 * (GELU's backward needs the same exponential for its density term). */
SL_HD KN_INLINE float kn_erff_e(float x, float e)
{
    float a = x < 0.0f ? -x : x;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float y = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
               0.254829592f) *
              t;
    float r = 1.0f - y * e;
    return x < 0.0f ? -r : r;
}
SL_HD KN_INLINE float kn_erff(float x)
{
    return kn_erff_e(x, kn_expf(-x * x));
}
/* tanh(u) = 1 - 2 / (exp(2u) + 1); saturates cleanly at +-1. */
SL_HD KN_INLINE float kn_tanhf(float u)
{
    return 1.0f - 2.0f / (kn_expf(2.0f * u) + 1.0f);
}

/* ---- GELU ---------------------------------------------------------------
 * erf form: 0.5 x (1 + erf(x/sqrt2)); tanh form: 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))),
 * as torch.nn.functional.gelu(approximate='none' / 'tanh'). */
SL_HD float kn_gelu_erf(float x)
{
    return 0.5f * x * (1.0f + kn_erff(x * KN_SQRT1_2));
}
SL_HD float kn_gelu_erf_grad(float x)
{
    float e = kn_expf(-0.5f * x * x); /* = exp(-(x/sqrt2)^2), shared by erf and the density */
    return 0.5f * (1.0f + kn_erff_e(x * KN_SQRT1_2, e)) + x * KN_INV_SQRT_2PI * e;
}
SL_HD float kn_gelu_tanh(float x)
{
    float u = KN_SQRT_2_OVER_PI * (x + KN_GELU_TANH_C * x * x * x);
    return 0.5f * x * (1.0f + kn_tanhf(u));
}
SL_HD float kn_gelu_tanh_grad(float x)
{
    float x2 = x * x;
    float t = kn_tanhf(KN_SQRT_2_OVER_PI * x * (1.0f + KN_GELU_TANH_C * x2));
    float du = KN_SQRT_2_OVER_PI * (1.0f + 3.0f * KN_GELU_TANH_C * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
/* GELU of the bf16 path: the value and the derivative from one exponential
 * (erf form) or one tanh, so that a backward recomputing the value from the
 * same input gets the forward's bits while computing the derivative. */
SL_HD KN_INLINE void kn_gelu16_elem(float x, int kind, float *g, float *dg)
{
    if (kind == 1) {
        float x2 = x * x;
        float t = kn_tanhf(KN_SQRT_2_OVER_PI * x * (1.0f + KN_GELU_TANH_C * x2));
        *g = 0.5f * x * (1.0f + t);
        *dg = 0.5f * (1.0f + t) +
              0.5f * x * (1.0f - t * t) * KN_SQRT_2_OVER_PI * (1.0f + 3.0f * KN_GELU_TANH_C * x2);
    } else {
        float e = kn_expf(-0.5f * x * x);
        float er = kn_erff_e(x * KN_SQRT1_2, e);
        *g = 0.5f * x * (1.0f + er);
        *dg = 0.5f * (1.0f + er) + x * KN_INV_SQRT_2PI * e;
    }
}
/* kind: 0 = erf, 1 = tanh (enum kn_gelu_kind). */
SL_HD float kn_gelu_fwd_elem(float x, int kind)
{
    return kind == 1 ? kn_gelu_tanh(x) : kn_gelu_erf(x);
}
SL_HD float kn_gelu_bwd_elem(float x, float dout, int kind)
{
    return dout * (kind == 1 ? kn_gelu_tanh_grad(x) : kn_gelu_erf_grad(x));
}

/* ---- dropout --------------------------------------------------------------
 * Element with RNG index idx is kept when its uniform draw is >= p. The draw
 * is sl_rng_uniform's: the top 24 bits of the Philox word, exactly
 * representable in float, so the test is the same on every device. */
SL_HD int kn_dropout_keep_word(uint32_t w, float p)
{
    return (float)(int32_t)(w >> 8) * (1.0f / 16777216.0f) >= p; /* < 2^24: exact */
}
SL_HD int kn_dropout_keep(uint64_t seed, uint64_t stream, uint64_t idx, float p)
{
    return kn_dropout_keep_word(sl_rng_u32(seed, stream, idx), p);
}
/* The multiplier of a kept element: 1/(1-p) (0 when p >= 1, all dropped). */
SL_HD float kn_dropout_scale(float p)
{
    return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}
/* The RNG index of element e of sequence s of a micro-batch starting at
 * sequence seq0 of the batch (kn_ops.h): independent of micro-batch splitting. */
SL_HD uint64_t kn_dropout_index(uint64_t seq0, uint64_t s, uint64_t per_seq, uint64_t e)
{
    return (seq0 + s) * per_seq + e;
}

/* ---- embeddings -------------------------------------------------------------
 * One output row r = b*T + t. Token ids outside [0,V) are the caller's bug;
 * they are not checked here (device/ validates batches on load). */
SL_HD void kn_embed_row_fwd(float *out, const float *wte, const float *wpe, const float *wse,
                            int32_t tok, int t, int32_t seg, int C)
{
    const float *a = wte + (size_t)tok * C, *p = wpe + (size_t)t * C, *s = wse + (size_t)seg * C;
    KN_SIMD
    for (int c = 0; c < C; c++)
        out[c] = a[c] + p[c] + s[c];
}
/* Column c of every embedding gradient, summed over all B*T rows in row
 * order: one owner per column, so no two writers ever touch one address. */
SL_HD void kn_embed_col_bwd(float *dwte, float *dwpe, float *dwse, const float *dout,
                            const int32_t *tok, const int32_t *seg, int B, int T, int C, int c)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)b * T + t;
            float d = dout[r * C + c];
            if (dwte)
                dwte[(size_t)tok[r] * C + c] += d;
            if (dwpe)
                dwpe[(size_t)t * C + c] += d;
            if (dwse)
                dwse[(size_t)(seg ? seg[r] : 0) * C + c] += d;
        }
}

/* ---- layernorm ---------------------------------------------------------------
 * Biased variance (as torch), two passes over the row for accuracy. */
SL_HD void kn_layernorm_row_fwd(float *out, float *mean, float *rstd, const float *x,
                                const float *w, const float *b, int C, float eps)
{
    float m = 0.0f;
    KN_SIMD_SUM(m)
    for (int i = 0; i < C; i++)
        m += x[i];
    m /= (float)C;
    float var = 0.0f;
    KN_SIMD_SUM(var)
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        var += d * d;
    }
    var /= (float)C;
    float s = 1.0f / sqrtf(var + eps);
    if (b) {
        KN_SIMD
        for (int i = 0; i < C; i++)
            out[i] = (x[i] - m) * s * w[i] + b[i];
    } else {
        KN_SIMD
        for (int i = 0; i < C; i++)
            out[i] = (x[i] - m) * s * w[i];
    }
    *mean = m;
    *rstd = s;
}
/* dinp of one row (accumulated). */
SL_HD void kn_layernorm_row_bwd(float *dinp, const float *dout, const float *x, const float *w,
                                float mean, float rstd, int C)
{
    float sum_d = 0.0f, sum_dx = 0.0f;
    KN_SIMD_SUM2(sum_d, sum_dx)
    for (int i = 0; i < C; i++) {
        float dn = dout[i] * w[i];
        sum_d += dn;
        sum_dx += dn * (x[i] - mean) * rstd;
    }
    sum_d /= (float)C;
    sum_dx /= (float)C;
    KN_SIMD
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - mean) * rstd;
        dinp[i] += rstd * (dout[i] * w[i] - sum_d - xhat * sum_dx);
    }
}
/* dw[c], db[c] of one column (accumulated), rows summed in order 0..N-1. */
SL_HD void kn_layernorm_col_bwd(float *dw, float *db, const float *dout, const float *x,
                                const float *mean, const float *rstd, int N, int C, int c)
{
    float sw = 0.0f, sb = 0.0f;
    for (int n = 0; n < N; n++) {
        float d = dout[(size_t)n * C + c];
        sw += d * ((x[(size_t)n * C + c] - mean[n]) * rstd[n]);
        sb += d;
    }
    if (dw)
        dw[c] += sw;
    if (db)
        db[c] += sb;
}

/* ---- linear: bias gradient of column o, rows in order ------------------------ */
SL_HD float kn_colsum(const float *x, int N, int ld, int c)
{
    float s = 0.0f;
    for (int n = 0; n < N; n++)
        s += x[(size_t)n * ld + c];
    return s;
}

/* ---- attention rows ------------------------------------------------------------
 * p = softmax(s) over keys j with valid[j] != 0 (valid NULL: all keys); masked
 * keys get probability 0. A row with no valid key (a sequence that is all
 * padding) gets all zeros instead of 0/0 = NaN. p may alias s. The _lse form
 * also returns the max and the sum of exp(s - max) (log-sum-exp = max + log sum). */
SL_HD KN_INLINE void kn_softmax_row_lse(float *p, const float *s, const int32_t *valid, int T,
                                        float *mx_out, float *sum_out)
{
    /* Separate loops with and without a mask, every load unconditional, so
     * both vectorise. */
    float mx = -INFINITY;
    if (valid) {
        KN_SIMD_MAX(mx)
        for (int j = 0; j < T; j++) {
            float v = s[j];
            v = valid[j] ? v : -INFINITY;
            mx = v > mx ? v : mx;
        }
    } else {
        KN_SIMD_MAX(mx)
        for (int j = 0; j < T; j++) {
            float v = s[j];
            mx = v > mx ? v : mx;
        }
    }
    *mx_out = mx;
    *sum_out = 0.0f;
    if (!(mx > -INFINITY)) {
        for (int j = 0; j < T; j++)
            p[j] = 0.0f;
        return;
    }
    float sum = 0.0f;
    if (valid) {
        KN_SIMD_SUM(sum)
        for (int j = 0; j < T; j++) {
            float e = kn_expf(s[j] - mx);
            e = valid[j] ? e : 0.0f;
            p[j] = e;
            sum += e;
        }
    } else {
        KN_SIMD_SUM(sum)
        for (int j = 0; j < T; j++) {
            float e = kn_expf(s[j] - mx);
            p[j] = e;
            sum += e;
        }
    }
    float inv = 1.0f / sum;
    KN_SIMD
    for (int j = 0; j < T; j++)
        p[j] *= inv;
    *sum_out = sum;
}
SL_HD KN_INLINE void kn_softmax_row_masked(float *p, const float *s, const int32_t *valid, int T)
{
    float mx, sum;
    kn_softmax_row_lse(p, s, valid, T, &mx, &sum);
}
/* ds = scale * p * (dp - <p, dp>), the softmax backward of one row; ds may alias dp. */
SL_HD KN_INLINE void kn_softmax_row_bwd(float *ds, const float *p, const float *dp, int T,
                                        float scale)
{
    float dot = 0.0f;
    KN_SIMD_SUM(dot)
    for (int j = 0; j < T; j++)
        dot += p[j] * dp[j];
    KN_SIMD
    for (int j = 0; j < T; j++)
        ds[j] = scale * p[j] * (dp[j] - dot);
}
/* Applies attention dropout to one row of T probabilities (or their
 * gradient), row index `row` = h*T + i within sequence s, in place:
 * x[j] *= keep ? 1/(1-p) : 0 (a product, as torch: a dropped inf/NaN stays NaN). Draws index
 * (seq0+s)*NH*T*T + row*T + j. */
SL_HD void kn_attn_dropout_row(float *x, uint64_t seed, uint64_t stream, uint64_t seq0, int s,
                               int NH, int T, int row, float p)
{
    float sc = kn_dropout_scale(p);
    uint64_t base = kn_dropout_index(seq0, (uint64_t)s, (uint64_t)NH * T * T, (uint64_t)row * T);
    for (int j = 0; j < T; j++)
        x[j] *= kn_dropout_keep(seed, stream, base + j, p) ? sc : 0.0f;
}

/* ---- cross-entropy rows ------------------------------------------------------------
 * probs = softmax(logits), returns -log probs[target]; a target outside
 * [0, V) (ignore index -100) gives loss 0 and, in backward, no gradient. */
/* probs may alias logits (the target's logit is read first; the softmax
 * reads each element before writing it): the head then needs no separate
 * (M,V) logits buffer. */
SL_HD KN_INLINE float kn_xent_row_fwd(float *probs, const float *logits, int32_t target, int V)
{
    int ok = target >= 0 && target < V;
    float lt = ok ? logits[target] : 0.0f;
    float mx, sum;
    kn_softmax_row_lse(probs, logits, NULL, V, &mx, &sum);
    if (!ok)
        return 0.0f;
    return logf(sum) - (lt - mx);
}
/* Writes (does not accumulate: the loss starts the chain) the row's gradient;
 * dlogits may alias probs. A row without a target gets zeros. */
SL_HD KN_INLINE void kn_xent_row_bwd(float *dlogits, const float *probs, int32_t target, int V,
                                     float scale)
{
    if (target < 0 || target >= V) {
        for (int j = 0; j < V; j++)
            dlogits[j] = 0.0f;
        return;
    }
    KN_SIMD
    for (int j = 0; j < V; j++)
        dlogits[j] = scale * probs[j];
    dlogits[target] -= scale;
}

/* ---- optimizers ------------------------------------------------------------------------
 * bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (computed once per tensor in double).
 * AdamW exactly as torch.optim.AdamW (foreach=False):
 *   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps). */
SL_HD void kn_adamw_elem(float *p, float g, float *m, float *v, float lr, float beta1, float beta2,
                         float eps, float wd, float bc1, float sqrt_bc2)
{
    float mm = beta1 * *m + (1.0f - beta1) * g;
    float vv = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mm;
    *v = vv;
    float pp = *p * (1.0f - lr * wd);
    *p = pp - (lr / bc1) * (mm / (sqrtf(vv) / sqrt_bc2 + eps));
}
/* ---- bf16 optimizer state ----
 * Adam's second moment moves by (1 - beta2) = 0.1% of itself per step, under
 * half a bf16 ulp (0.2-0.4%): rounding to nearest would lose every small
 * decrement, so the moments are stored with stochastic rounding
 * (sl_float.h). */
/* AdamW with m and v held in bf16: the update itself is kn_adamw_elem's, in
 * fp32, from the widened moments; the new moments are stored stochastically
 * rounded with the two halves of one random word r. */
SL_HD KN_INLINE void kn_adamw_bf16_elem(float *p, float g, uint16_t *m, uint16_t *v, float lr, float beta1,
                              float beta2, float eps, float wd, float bc1, float sqrt_bc2,
                              uint32_t r)
{
    float mm = beta1 * sl_bf16_to_f32(*m) + (1.0f - beta1) * g;
    float vv = beta2 * sl_bf16_to_f32(*v) + (1.0f - beta2) * g * g;
    *m = sl_f32_to_bf16_sr(mm, r & 0xffffu);
    *v = sl_f32_to_bf16_sr(vv, r >> 16);
    float pp = *p * (1.0f - lr * wd);
    *p = pp - (lr / bc1) * (mm / (sqrtf(vv) / sqrt_bc2 + eps));
}
/* LAMB moments of one element (as Adam's). */
SL_HD void kn_lamb_moments(float g, float *m, float *v, float beta1, float beta2)
{
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
}
/* The LAMB update direction u = mhat / (sqrt(vhat) + eps) + wd * p. */
SL_HD float kn_lamb_dir(float p, float m, float v, float eps, float wd, float bc1, float bc2)
{
    return (m / bc1) / (sqrtf(v / bc2) + eps) + wd * p;
}
/* Trust ratio ||p|| / ||u||, 1 when either norm is 0 (or not finite). */
SL_HD float kn_lamb_trust(double p_sumsq, double u_sumsq)
{
    if (p_sumsq > 0.0 && u_sumsq > 0.0) {
        double r = sqrt(p_sumsq) / sqrt(u_sumsq);
        if (r == r && r < 1e30)
            return (float)r;
    }
    return 1.0f;
}

#endif
