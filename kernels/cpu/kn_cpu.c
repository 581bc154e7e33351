/* The CPU ops of kn_ops.h (attention is in kn_attention.c): OpenMP loops
 * around the bodies of kn_body.h, OpenBLAS sgemm for the products.
 *
 * Column reductions (bias and embedding gradients, layernorm dw/db) give each
 * thread a block of KN_COLS columns and walk the rows in order inside it, so
 * every column is summed in the same order as the CUDA kernel's one thread
 * per column does (kn_*_col_bwd), with no atomics and no per-thread copies. */
#include <string.h>

#include "kn_body.h"
#include "kn_cpu.h"
#include "kn_gemm.h"
#include "kn_rng.h"
#include "kn_ops.h"
#include "kn_threads.h"

#define KN_COLS 64
/* Below these many elements a loop runs on one thread: memory-bound loops
 * (adds, dropout, optimizers, row normalisation) finish in under 25 us
 * there, about what a fork/join costs; compute-bound ones (GELU's erf, exp
 * rows) pay off earlier. 2^16 gave 4% faster fp32 steps than 2^18 and 6-19%
 * faster bf16 ones, where these loops are most of a step (docs/kernels.md). */
#define KN_PAR_MIN (1 << 16)
#define KN_PAR_MIN_HEAVY (1 << 14)
/* Reductions sum fixed blocks (at least KN_RED_BLOCK elements, at most
 * KN_RED_MAX_BLOCKS of them) and then the block sums in order, so their
 * result is the same for any number of threads. */
#define KN_RED_BLOCK ((size_t)1 << 16)
#define KN_RED_MAX_BLOCKS 1024
static size_t red_blocks(size_t n, size_t *block)
{
    size_t bs = (n + KN_RED_MAX_BLOCKS - 1) / KN_RED_MAX_BLOCKS;
    *block = bs < KN_RED_BLOCK ? KN_RED_BLOCK : bs;
    return n ? (n + *block - 1) / *block : 0;
}

/* dst[c] += sum over rows n of x[n*ld + c], c in [0, C). */
void kn_colsum_add(float *dst, const float *x, int N, int ld, int C)
{
    int nblk = (C + KN_COLS - 1) / KN_COLS;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= KN_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * KN_COLS, c1 = c0 + KN_COLS < C ? c0 + KN_COLS : C;
        float acc[KN_COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = x + (size_t)n * ld;
            KN_SIMD
            for (int c = c0; c < c1; c++)
                acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++)
            dst[c] += acc[c - c0];
    }
}

/* ---- embeddings ---- */
void kn_embed_forward(float *out, const int32_t *tok, const int32_t *seg, const float *wte,
                      const float *wpe, const float *wse, int B, int T, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)B * T * C >= KN_PAR_MIN)
    for (int r = 0; r < B * T; r++)
        kn_t_embed_fwd((size_t)r, out, tok, seg, wte, wpe, wse, T, C);
}

void kn_embed_backward(float *dwte, float *dwpe, float *dwse, const float *dout, const int32_t *tok,
                       const int32_t *seg, int B, int T, int C)
{
    int nblk = (C + KN_COLS - 1) / KN_COLS;
#pragma omp parallel for schedule(static) if ((size_t)B * T * C >= KN_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * KN_COLS, c1 = c0 + KN_COLS < C ? c0 + KN_COLS : C;
        for (int r = 0; r < B * T; r++) {
            const float *d = dout + (size_t)r * C;
            float *a = dwte ? dwte + (size_t)tok[r] * C : NULL;
            float *p = dwpe ? dwpe + (size_t)(r % T) * C : NULL;
            float *s = dwse ? dwse + (size_t)(seg ? seg[r] : 0) * C : NULL;
            for (int c = c0; c < c1; c++) {
                if (a)
                    a[c] += d[c];
                if (p)
                    p[c] += d[c];
                if (s)
                    s[c] += d[c];
            }
        }
    }
}

/* ---- layernorm ---- */
void kn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)N * C >= KN_PAR_MIN)
    for (int n = 0; n < N; n++)
        kn_t_ln_fwd((size_t)n, out, mean, rstd, inp, w, b, C, eps);
}

void kn_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C)
{
    int nblk = (C + KN_COLS - 1) / KN_COLS;
#pragma omp parallel if ((size_t)N * C >= KN_PAR_MIN)
    {
        if (dinp) {
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++)
                kn_t_ln_bwd_row((size_t)n, dinp, dout, inp, w, mean, rstd, C);
        }
        if (dw || db) {
#pragma omp for schedule(static)
            for (int blk = 0; blk < nblk; blk++) {
                int c0 = blk * KN_COLS, c1 = c0 + KN_COLS < C ? c0 + KN_COLS : C;
                float aw[KN_COLS] = {0}, ab[KN_COLS] = {0};
                for (int n = 0; n < N; n++) {
                    const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
                    float m = mean[n], s = rstd[n];
                    KN_SIMD
                    for (int c = c0; c < c1; c++) {
                        aw[c - c0] += d[c] * ((x[c] - m) * s);
                        ab[c - c0] += d[c];
                    }
                }
                for (int c = c0; c < c1; c++) {
                    if (dw)
                        dw[c] += aw[c - c0];
                    if (db)
                        db[c] += ab[c - c0];
                }
            }
        }
    }
}

/* ---- linear ---- */
void kn_matmul_forward(float *out, const float *inp, const float *w, const float *b, int N, int IC,
                       int OC)
{
    if (b) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= KN_PAR_MIN)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, b, (size_t)OC * sizeof(float));
    }
    /* out (N,OC) = inp (N,IC) @ w^T (IC,OC) [+ out] */
    kn_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, w, IC, b ? 1.0f : 0.0f, out, OC);
}

void kn_matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int N, int IC, int OC)
{
    /* dinp (N,IC) += dout (N,OC) @ w (OC,IC) */
    if (dinp)
        kn_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
    /* dw (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
    if (dw)
        kn_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (db)
        kn_colsum_add(db, dout, N, OC, OC);
}

/* ---- elementwise ---- */
/* One loop per kind, so the kind is a constant in the vectorised body. */
KN_CLONES void kn_gelu_forward(float *out, const float *inp, size_t N, int kind)
{
    if (kind == KN_GELU_TANH) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_fwd(i, out, inp, KN_GELU_TANH);
    } else {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_fwd(i, out, inp, KN_GELU_ERF);
    }
}

KN_CLONES void kn_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                                int kind)
{
    if (kind == KN_GELU_TANH) {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd(i, dinp, inp, dout, KN_GELU_TANH);
    } else {
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
        for (size_t i = 0; i < N; i++)
            kn_t_gelu_bwd(i, dinp, inp, dout, KN_GELU_ERF);
    }
}

KN_CLONES void kn_tanh_forward(float *out, const float *inp, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN_HEAVY)
    for (size_t i = 0; i < N; i++)
        kn_t_tanh_fwd(i, out, inp);
}

void kn_tanh_backward(float *dinp, const float *out, const float *dout, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN)
    for (size_t i = 0; i < N; i++)
        kn_t_tanh_bwd(i, dinp, out, dout);
}

void kn_residual_forward(float *out, const float *a, const float *b, size_t N)
{
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN)
    for (size_t i = 0; i < N; i++)
        kn_t_residual_fwd(i, out, a, b);
}

void kn_residual_backward(float *da, float *db, const float *dout, size_t N)
{
    /* one pass per output: no per-element NULL tests, so both loops vectorise */
    float *d[2] = {da, db};
    for (int k = 0; k < 2; k++) {
        float *g = d[k];
        if (!g)
            continue;
#pragma omp parallel for simd schedule(static) if (N >= KN_PAR_MIN)
        for (size_t i = 0; i < N; i++)
            g[i] += dout[i];
    }
}

/* ---- dropout ----
 * Flat element f of the (B, per_seq) tensor is element f % per_seq of
 * sequence f / per_seq, so its RNG index is seq0*per_seq + f. Chunks of
 * KN_DROP_CHUNK draw whole Philox blocks (4 words each) at a time. */
#define KN_DROP_CHUNK 1024

/* dst[i] = keep ? src[i]*scale : 0 (accum: dst[i] += ...), i in [0, n), RNG index start + i. */
KN_CLONES static void dropout_apply(float *dst, const float *src, size_t n, const kn_dropout *d,
                                    uint64_t start, int accum)
{
    float p = d->p, sc = kn_dropout_scale(p);
    size_t nchunk = (n + KN_DROP_CHUNK - 1) / KN_DROP_CHUNK;
#pragma omp parallel for schedule(static) if (n >= KN_PAR_MIN)
    for (size_t k = 0; k < nchunk; k++) {
        uint32_t w[KN_DROP_CHUNK];
        size_t i0 = k * KN_DROP_CHUNK, len = n - i0 < KN_DROP_CHUNK ? n - i0 : KN_DROP_CHUNK;
        kn_rng_fill_u32(d->seed, d->stream, start + i0, len, w);
        float *o = dst + i0;
        const float *x = src + i0;
        if (accum) {
            KN_SIMD
            for (size_t i = 0; i < len; i++)
                o[i] += x[i] * (kn_dropout_keep_word(w[i], p) ? sc : 0.0f);
        } else {
            KN_SIMD
            for (size_t i = 0; i < len; i++)
                o[i] = x[i] * (kn_dropout_keep_word(w[i], p) ? sc : 0.0f);
        }
    }
}

void kn_dropout_forward(float *out, const float *inp, int B, size_t per_seq, kn_dropout drop)
{
    size_t n = (size_t)B * per_seq;
    if (drop.p <= 0.0f) {
        if (out != inp)
            memmove(out, inp, n * sizeof(float));
        return;
    }
    dropout_apply(out, inp, n, &drop, drop.seq0 * per_seq, 0);
}

void kn_dropout_backward(float *dinp, const float *dout, int B, size_t per_seq, kn_dropout drop)
{
    size_t n = (size_t)B * per_seq;
    if (drop.p <= 0.0f) {
        kn_residual_backward(dinp, NULL, dout, n);
        return;
    }
    dropout_apply(dinp, dout, n, &drop, drop.seq0 * per_seq, 1);
}

/* ---- rows ---- */
void kn_gather_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    for (int j = 0; j < M; j++)
        memcpy(out + (size_t)j * C, x + (size_t)idx[j] * C, (size_t)C * sizeof(float));
}

void kn_scatter_rows(float *out, const float *x, const int32_t *idx, int M, int C)
{
    for (int j = 0; j < M; j++)
        memcpy(out + (size_t)idx[j] * C, x + (size_t)j * C, (size_t)C * sizeof(float));
}

/* ---- cross-entropy ---- */
KN_CLONES void kn_crossentropy_forward(float *losses, float *probs, const float *logits,
                                       const int32_t *targets, int M, int V)
{
#pragma omp parallel for schedule(static) if ((size_t)M * V >= KN_PAR_MIN_HEAVY)
    for (int i = 0; i < M; i++)
        kn_t_xent_fwd((size_t)i, losses, probs, logits, targets, V);
}

void kn_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, int M,
                              int V, float scale)
{
#pragma omp parallel for schedule(static) if ((size_t)M * V >= KN_PAR_MIN)
    for (int i = 0; i < M; i++)
        kn_t_xent_bwd((size_t)i, dlogits, probs, targets, V, scale);
}

/* ---- optimizers ---- */
/* One loop per case of the clipping factor (1 or not) and of the bf16 copy
 * (wanted or not), each with the case constant, so that every loop
 * vectorises with no test inside it. */
#define KN_ADAMW_CASES(LOOP)                                                                     \
    do {                                                                                          \
        if (gscale == 1.0f && !w16) {                                                             \
            LOOP(1.0f, 0);                                                                        \
        } else if (gscale == 1.0f) {                                                              \
            LOOP(1.0f, 1);                                                                        \
        } else if (!w16) {                                                                        \
            LOOP(gscale, 0);                                                                      \
        } else {                                                                                  \
            LOOP(gscale, 1);                                                                      \
        }                                                                                         \
    } while (0)

KN_CLONES void kn_adamw_update(float *p, float *g, float *m, float *v, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, int t, float gscale,
                               uint16_t *w16)
{
    float bc1 = (float)(1.0 - pow(beta1, t));
    float sqrt_bc2 = (float)sqrt(1.0 - pow(beta2, t));
#define ADAMW_LOOP(GS, COPY)                                                                      \
    _Pragma("omp parallel for simd schedule(static) if (n >= KN_PAR_MIN)")                      \
    for (size_t i = 0; i < n; i++) {                                                              \
        kn_t_adamw(i, p, g, m, v, lr, beta1, beta2, eps, wd, bc1, sqrt_bc2, GS, NULL);            \
        if (COPY)                                                                                 \
            kn_t_to_bf16(i, w16, p);                                                              \
    }
    KN_ADAMW_CASES(ADAMW_LOOP);
#undef ADAMW_LOOP
}

KN_CLONES void kn_adamw_update_bf16(float *p, float *g, uint16_t *m, uint16_t *v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float wd, int t,
                                    uint64_t seed, uint64_t stream, float gscale, uint16_t *w16)
{
    float bc1 = (float)(1.0 - pow(beta1, t));
    float sqrt_bc2 = (float)sqrt(1.0 - pow(beta2, t));
    size_t nchunk = (n + KN_DROP_CHUNK - 1) / KN_DROP_CHUNK;
#define ADAMW_BF16_LOOP(GS, COPY)                                                                 \
    _Pragma("omp parallel for schedule(static) if (n >= KN_PAR_MIN)")                           \
    for (size_t k = 0; k < nchunk; k++) {                                                         \
        uint32_t w[KN_DROP_CHUNK];                                                                \
        size_t i0 = k * KN_DROP_CHUNK, len = n - i0 < KN_DROP_CHUNK ? n - i0 : KN_DROP_CHUNK;     \
        kn_rng_fill_u32(seed, stream, i0, len, w);                                                \
        KN_SIMD                                                                                   \
        for (size_t i = 0; i < len; i++) {                                                        \
            kn_adamw_bf16_elem(&p[i0 + i], kn_t_scaled_grad(i0 + i, g, GS), &m[i0 + i],           \
                               &v[i0 + i], lr, beta1, beta2, eps, wd, bc1, sqrt_bc2, w[i]);      \
            if (COPY)                                                                             \
                kn_t_to_bf16(i0 + i, w16, p);                                                     \
        }                                                                                         \
    }
    KN_ADAMW_CASES(ADAMW_BF16_LOOP);
#undef ADAMW_BF16_LOOP
}

void kn_lamb_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t)
{
    float bc1 = (float)(1.0 - pow(beta1, t));
    float bc2 = (float)(1.0 - pow(beta2, t));
    /* per-block sums added in block order: the result does not depend on
     * the thread count (a pipeline stage may run with fewer threads) */
    double bp[KN_RED_MAX_BLOCKS], bu[KN_RED_MAX_BLOCKS], psq = 0.0, usq = 0.0;
    size_t bs, nb = red_blocks(n, &bs);
#pragma omp parallel for schedule(static) if (n >= KN_PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        size_t i0 = k * bs, i1 = i0 + bs < n ? i0 + bs : n;
        double ps = 0.0, us = 0.0;
        for (size_t i = i0; i < i1; i++) {
            double p2, u2;
            kn_t_lamb_moments(i, p, g, m, v, beta1, beta2, eps, wd, bc1, bc2, &p2, &u2);
            ps += p2;
            us += u2;
        }
        bp[k] = ps;
        bu[k] = us;
    }
    for (size_t k = 0; k < nb; k++) {
        psq += bp[k];
        usq += bu[k];
    }
    float step = lr * kn_lamb_trust(psq, usq);
#pragma omp parallel for simd schedule(static) if (n >= KN_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        kn_t_lamb_apply(i, p, m, v, step, eps, wd, bc1, bc2);
}

double kn_sumsq(const float *x, size_t n)
{
    double part[KN_RED_MAX_BLOCKS], s = 0.0;
    size_t bs, nb = red_blocks(n, &bs);
#pragma omp parallel for schedule(static) if (n >= KN_PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        size_t i0 = k * bs, i1 = i0 + bs < n ? i0 + bs : n;
        double b = 0.0;
#pragma omp simd reduction(+ : b)
        for (size_t i = i0; i < i1; i++)
            b += (double)x[i] * x[i];
        part[k] = b;
    }
    for (size_t k = 0; k < nb; k++)
        s += part[k];
    return s;
}

void kn_scale(float *x, size_t n, float s)
{
#pragma omp parallel for simd schedule(static) if (n >= KN_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        kn_t_scale(i, x, s);
}
