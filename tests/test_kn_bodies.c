/* The CUDA kernels' work, run on the CPU: for every op, the per-thread
 * functions of kn_threads.h over exactly the index space the kernel in
 * kernels/cuda/kn_cuda_ops.cu launches (and, for attention, its sequence of
 * sgemm calls through the same kn_gemm_map mapping), compared with the CPU
 * op. This is how the CUDA code is checked on machines without a GPU: only
 * the `if (i < n)` launch wrapper and cuBLAS itself are left untested here.
 * Most comparisons are bitwise (same bodies, same summation order). */
#include "cpu/kn_rng.h"
#include "kn_backend.h"
#include "kn_gemm.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "kn_threads.h"

enum { B = 2, T = 37, C = 96, NH = 3, HS = C / NH, FF = 384, V = 997, M = 11, N = B * T };

#define FOR(i, n) for (size_t i = 0; i < (size_t)(n); i++)

static void check_same(const char *what, const float *a, const float *b, size_t n)
{
    int same = kt_bitwise_equal(a, b, n);
    printf("    %-20s %s\n", what, same ? "bitwise equal" : "DIFFERENT");
    CHECKF(same, "%s: CUDA geometry differs from the CPU op (rel %.3g)", what, kt_rel(a, b, n));
}

static void test_embed(void)
{
    int32_t tok[N], seg[N];
    FOR(i, N) tok[i] = kt_randint(1, i, V), seg[i] = (int32_t)(i % 2);
    tok[1] = tok[2] = tok[N - 1];
    float *wte = kt_randn((size_t)V * C, 2, 1), *wpe = kt_randn((size_t)T * C, 3, 1),
          *wse = kt_randn(2 * C, 4, 1), *dout = kt_randn((size_t)N * C, 5, 1);
    float *o1 = kt_alloc((size_t)N * C), *o2 = kt_alloc((size_t)N * C);
    kn_embed_forward(o1, tok, seg, wte, wpe, wse, B, T, C);
    FOR(r, N) kn_t_embed_fwd(r, o2, tok, seg, wte, wpe, wse, T, C);
    check_same("embed fwd", o1, o2, (size_t)N * C);
    float *g1 = kt_alloc((size_t)(V + T + 2) * C), *g2 = kt_alloc((size_t)(V + T + 2) * C);
    kn_embed_backward(g1, g1 + (size_t)V * C, g1 + (size_t)(V + T) * C, dout, tok, seg, B, T, C);
    FOR(c, C)
    kn_t_embed_bwd(c, g2, g2 + (size_t)V * C, g2 + (size_t)(V + T) * C, dout, tok, seg, B, T, C);
    check_same("embed bwd", g1, g2, (size_t)(V + T + 2) * C);
    free(wte), free(wpe), free(wse), free(dout), free(o1), free(o2), free(g1), free(g2);
}

static void test_layernorm(void)
{
    float *x = kt_randn((size_t)N * C, 6, 2), *w = kt_randn(C, 7, 1), *b = kt_randn(C, 8, 1),
          *dout = kt_randn((size_t)N * C, 9, 1);
    float *o1 = kt_alloc((size_t)N * C), *o2 = kt_alloc((size_t)N * C), *st1 = kt_alloc(2 * N),
          *st2 = kt_alloc(2 * N);
    kn_layernorm_forward(o1, st1, st1 + N, x, w, b, N, C, 1e-12f);
    FOR(n, N) kn_t_ln_fwd(n, o2, st2, st2 + N, x, w, b, C, 1e-12f);
    check_same("layernorm fwd", o1, o2, (size_t)N * C);
    check_same("layernorm mean/rstd", st1, st2, 2 * N);
    float *g1 = kt_alloc((size_t)N * C + 2 * C), *g2 = kt_alloc((size_t)N * C + 2 * C);
    float *dw1 = g1 + (size_t)N * C, *dw2 = g2 + (size_t)N * C;
    kn_layernorm_backward(g1, dw1, dw1 + C, dout, x, w, st1, st1 + N, N, C);
    FOR(n, N) kn_t_ln_bwd_row(n, g2, dout, x, w, st1, st1 + N, C);
    FOR(c, C) kn_t_ln_bwd_col(c, dw2, dw2 + C, dout, x, st1, st1 + N, N, C);
    check_same("layernorm bwd", g1, g2, (size_t)N * C + 2 * C);
    free(x), free(w), free(b), free(dout), free(o1), free(o2), free(st1), free(st2), free(g1),
        free(g2);
}

/* kn_cuda_matmul_*: bias fill per element + sgemm; bias gradient per column. */
static void test_matmul(void)
{
    float *x = kt_randn((size_t)N * C, 10, 1), *w = kt_randn((size_t)FF * C, 11, 0.1f),
          *b = kt_randn(FF, 12, 1), *dout = kt_randn((size_t)N * FF, 13, 1);
    float *o1 = kt_alloc((size_t)N * FF), *o2 = kt_alloc((size_t)N * FF);
    kn_matmul_forward(o1, x, w, b, N, C, FF);
    FOR(i, (size_t)N * FF) kn_t_bias_fill(i, o2, b, FF);
    kn_sgemm(0, 1, N, FF, C, 1.0f, x, C, w, C, 1.0f, o2, FF);
    check_same("matmul fwd", o1, o2, (size_t)N * FF);
    float *db1 = kt_alloc(FF), *db2 = kt_alloc(FF);
    kn_matmul_backward(NULL, NULL, db1, dout, x, w, N, C, FF);
    FOR(o, FF) kn_t_bias_bwd(o, db2, dout, N, FF);
    check_same("matmul bias bwd", db1, db2, FF);
    free(x), free(w), free(b), free(dout), free(o1), free(o2), free(db1), free(db2);
}

/* kn_cuda_attention_*: the same launches in the same order. */
static void cuda_attention_fwd(float *out, float *att, float *Pd, const float *qkv,
                               const int32_t *valid, kn_dropout d)
{
    float scale = 1.0f / sqrtf((float)HS);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    FOR(bh, B * NH)
    {
        const float *q = qkv + (bh / NH) * T * 3 * C + (bh % NH) * HS;
        kn_sgemm(0, 1, T, T, HS, scale, q, 3 * C, q + C, 3 * C, 0.0f, att + bh * TT, T);
    }
    FOR(r, rows) kn_t_softmax(r, att, valid, T, NH);
    memcpy(Pd, att, rows * T * sizeof(float));
    if (d.p > 0.0f)
        FOR(r, rows) kn_t_attn_drop(r, Pd, d, T, NH);
    FOR(bh, B * NH)
    {
        size_t b = bh / NH, h = bh % NH;
        kn_sgemm(0, 0, T, HS, T, 1.0f, Pd + bh * TT, T, qkv + b * T * 3 * C + h * HS + 2 * C, 3 * C,
                 0.0f, out + b * T * C + h * HS, C);
    }
}
static void cuda_attention_bwd(float *dqkv, float *dP, const float *Pd, const float *dout,
                               const float *qkv, const float *att, kn_dropout d)
{
    float scale = 1.0f / sqrtf((float)HS);
    size_t TT = (size_t)T * T, rows = (size_t)B * NH * T;
    FOR(bh, B * NH)
    {
        size_t b = bh / NH, h = bh % NH, tok0 = b * T * 3 * C + h * HS;
        const float *dO = dout + b * T * C + h * HS;
        kn_sgemm(1, 0, T, HS, T, 1.0f, Pd + bh * TT, T, dO, C, 1.0f, dqkv + tok0 + 2 * C, 3 * C);
        kn_sgemm(0, 1, T, T, HS, 1.0f, dO, C, qkv + tok0 + 2 * C, 3 * C, 0.0f, dP + bh * TT, T);
    }
    if (d.p > 0.0f)
        FOR(r, rows) kn_t_attn_drop(r, dP, d, T, NH);
    FOR(r, rows) kn_t_softmax_bwd(r, dP, att, T, scale);
    FOR(bh, B * NH)
    {
        size_t b = bh / NH, h = bh % NH, tok0 = b * T * 3 * C + h * HS;
        kn_sgemm(0, 0, T, HS, T, 1.0f, dP + bh * TT, T, qkv + tok0 + C, 3 * C, 1.0f, dqkv + tok0,
                 3 * C);
        kn_sgemm(1, 0, T, HS, T, 1.0f, dP + bh * TT, T, qkv + tok0, 3 * C, 1.0f, dqkv + tok0 + C,
                 3 * C);
    }
}

static void test_attention(void)
{
    int32_t valid[N];
    FOR(i, N) valid[i] = i < T || (i - T) < 30;
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T, no = (size_t)N * C;
    float *qkv = kt_randn(nq, 14, 1), *dout = kt_randn(no, 15, 1);
    float *o1 = kt_alloc(no), *o2 = kt_alloc(no), *a1 = kt_alloc(na), *a2 = kt_alloc(na),
          *Pd = kt_alloc(na), *dP = kt_alloc(na), *g1 = kt_alloc(nq), *g2 = kt_alloc(nq);
    for (int k = 0; k < 2; k++) {
        kn_dropout d = {.p = k ? 0.1f : 0.0f, .seed = 3, .stream = 4, .seq0 = 6};
        memset(g1, 0, nq * sizeof *g1);
        memset(g2, 0, nq * sizeof *g2);
        kn_attention_forward(o1, a1, qkv, valid, B, T, C, NH, d);
        kn_attention_backward(g1, dout, qkv, a1, B, T, C, NH, d);
        cuda_attention_fwd(o2, a2, Pd, qkv, valid, d);
        cuda_attention_bwd(g2, dP, Pd, dout, qkv, a2, d);
        /* sgemm outside vs inside a parallel region may block differently: ulps */
        KT_CHECK_REL(k ? "attention out (p=.1)" : "attention out", o2, o1, no, 1e-6);
        KT_CHECK_REL(k ? "attention att (p=.1)" : "attention att", a2, a1, na, 1e-6);
        KT_CHECK_REL(k ? "attention dqkv (p=.1)" : "attention dqkv", g2, g1, nq, 1e-6);
    }
    free(qkv), free(dout), free(o1), free(o2), free(a1), free(a2), free(Pd), free(dP), free(g1),
        free(g2);
}

/* ---- bf16 compute: kn_cuda_*_bf16's launches, kn_bgemm standing in for
 * cublasGemmEx (through the same kn_gemm_map mapping on the GPU) ---------- */

static uint16_t *randn16(size_t n, uint64_t stream, float sd)
{
    float *x = kt_randn(n, stream, sd);
    uint16_t *h = sl_xmalloc(n * sizeof *h);
    FOR(i, n) h[i] = sl_f32_to_bf16(x[i]);
    free(x);
    return h;
}
static float *widen(const uint16_t *x, size_t n)
{
    float *f = kt_alloc(n);
    FOR(i, n) f[i] = sl_bf16_to_f32(x[i]);
    return f;
}
static void check_same16(const char *what, const uint16_t *a, const uint16_t *b, size_t n)
{
    int same = memcmp(a, b, n * sizeof *a) == 0;
    printf("    %-20s %s\n", what, same ? "bitwise equal" : "DIFFERENT");
    CHECKF(same, "%s: CUDA geometry differs from the CPU op", what);
}

static void test_bf16(void)
{
    sl_err err = {0};
    if (kn_cpu_bf16_check(&err)) {
        printf("    bf16 bodies not run: %s\n", err.msg);
        return;
    }
    size_t nx = (size_t)N * C, no = (size_t)N * FF, nw = (size_t)FF * C;
    uint16_t *x16 = randn16(nx, 20, 1), *w16 = randn16(nw, 21, 0.1f);
    float *b = kt_randn(FF, 22, 1), *dout = kt_randn(no, 23, 1), *f = kt_randn(no, 24, 2);
    /* conversion, GELU: one thread per element, bitwise */
    uint16_t *c1 = sl_xmalloc(no * 2), *c2 = sl_xmalloc(no * 2);
    kn_to_bf16(c1, f, no);
    FOR(i, no) kn_t_to_bf16(i, c2, f);
    check_same16("to_bf16", c1, c2, no);
    uint16_t *h16 = randn16(no, 25, 2);
    for (int kind = 0; kind < 2; kind++) {
        float *g1 = kt_alloc(no), *g2 = kt_alloc(no);
        kn_gelu_forward_bf16(c1, h16, no, kind);
        FOR(i, no) kn_t_gelu_fwd_bf16(i, c2, h16, kind);
        check_same16(kind ? "gelu tanh fwd bf16" : "gelu erf fwd bf16", c1, c2, no);
        kn_gelu_backward_bf16(g1, c1, h16, dout, no, kind);
        FOR(i, no) kn_t_gelu_bwd_out_bf16(i, g2, c2, h16, dout, kind);
        check_same(kind ? "gelu tanh bwd bf16" : "gelu erf bwd bf16", g1, g2, no);
        check_same16(kind ? "gelu tanh bwd value" : "gelu erf bwd value", c1, c2, no);
        memset(g1, 0, no * sizeof *g1), memset(g2, 0, no * sizeof *g2);
        kn_gelu_backward_bf16(g1, NULL, h16, dout, no, kind);
        FOR(i, no) kn_t_gelu_bwd_bf16(i, g2, h16, dout, kind);
        check_same(kind ? "gelu tanh bwd bf16 (no value)" : "gelu erf bwd bf16 (no value)", g1, g2, no);
        free(g1), free(g2);
    }
    /* LayerNorm with the rounded output: one thread per row */
    {
        float *lx = kt_randn(nx, 28, 2), *lw = kt_randn(C, 29, 1), *lb = kt_randn(C, 30, 1);
        float *l1 = kt_alloc(nx), *l2 = kt_alloc(nx), *s1 = kt_alloc(2 * N), *s2 = kt_alloc(2 * N);
        uint16_t *r1 = sl_xmalloc(nx * 2), *r2 = sl_xmalloc(nx * 2);
        kn_layernorm_forward_bf16(l1, r1, s1, s1 + N, lx, lw, lb, N, C, 1e-12f);
        FOR(r, N) kn_t_ln_fwd_bf16(r, l2, r2, s2, s2 + N, lx, lw, lb, C, 1e-12f);
        check_same("layernorm fwd bf16", l1, l2, nx);
        check_same16("layernorm fwd to bf16", r1, r2, nx);
        free(lx), free(lw), free(lb), free(l1), free(l2), free(s1), free(s2), free(r1), free(r2);
    }
    /* linear: fp32 out = bias fill, then the product added; bf16 out = the
     * accumulator plus the bias rounded per element */
    float *o1 = kt_alloc(no), *o2 = kt_alloc(no), *acc = kt_alloc(no);
    kn_matmul_forward_bf16(o1, NULL, x16, w16, b, N, C, FF);
    FOR(i, no) kn_t_bias_fill(i, o2, b, FF);
    CHECK(kn_bgemm(0, 1, N, FF, C, 1.0f, x16, C, w16, C, NULL, 1, o2, FF, 0) == 0);
    check_same("matmul fwd bf16", o1, o2, no);
    kn_matmul_forward_bf16(NULL, c1, x16, w16, b, N, C, FF);
    CHECK(kn_bgemm(0, 1, N, FF, C, 1.0f, x16, C, w16, C, NULL, 0, acc, FF, 0) == 0);
    FOR(i, no) kn_t_bias_bf16(i, c2, acc, b, FF);
    check_same16("matmul fwd to bf16", c1, c2, no);
    float *dx1 = kt_alloc(nx), *dx2 = kt_alloc(nx), *dw1 = kt_alloc(nw), *dw2 = kt_alloc(nw),
          *db1 = kt_alloc(FF), *db2 = kt_alloc(FF);
    kn_matmul_backward_bf16(dx1, dw1, db1, dout, x16, w16, N, C, FF);
    FOR(i, no) kn_t_to_bf16(i, c2, dout);
    CHECK(kn_bgemm(0, 0, N, C, FF, 1.0f, c2, FF, w16, C, NULL, 1, dx2, C, 0) == 0);
    CHECK(kn_bgemm(1, 0, FF, C, N, 1.0f, c2, FF, x16, C, NULL, 1, dw2, C, 0) == 0);
    FOR(o, FF) kn_t_bias_bwd(o, db2, dout, N, FF);
    check_same("matmul bwd dx bf16", dx1, dx2, nx);
    check_same("matmul bwd dw bf16", dw1, dw2, nw);
    check_same("matmul bwd db bf16", db1, db2, FF);
    free(x16), free(w16), free(b), free(dout), free(f), free(c1), free(c2), free(h16), free(o1),
        free(o2), free(acc), free(dx1), free(dx2), free(dw1), free(dw2), free(db1), free(db2);

    /* attention: per sequence, the heads' products (one strided batch on the
     * GPU, here a call per head at the batch's offsets), rows one per thread.
     * The CPU op copies each head's columns out first and another kernel of
     * the product library may sum in another order, so a rounded element now
     * and then lands on the other side of a tie: within a bf16 half-ulp. */
    int32_t valid[N];
    FOR(i, N) valid[i] = i < T || (i - T) < 30;
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T, TT = (size_t)T * T;
    size_t rows = (size_t)B * NH * T;
    float scale = 1.0f / sqrtf((float)HS);
    uint16_t *qkv = randn16(nq, 26, 1), *dO = randn16(nx, 27, 1);
    for (int k = 0; k < 2; k++) {
        kn_dropout d = {.p = k ? 0.1f : 0.0f, .seed = 3, .stream = 4, .seq0 = 6};
        uint16_t *out1 = sl_xcalloc(nx, 2), *out2 = sl_xcalloc(nx, 2), *a1 = sl_xcalloc(na, 2),
                 *a2 = sl_xcalloc(na, 2), *Pd = sl_xcalloc(na, 2), *dS = sl_xcalloc(na, 2);
        float *S = kt_alloc(na), *dP = kt_alloc(na), *g1 = kt_alloc(nq), *g2 = kt_alloc(nq);
        kn_attention_forward_bf16(out1, a1, qkv, valid, B, T, C, NH, d);
        kn_attention_backward_bf16(g1, dO, qkv, a1, B, T, C, NH, d);
        FOR(bh, B * NH)
        {
            const uint16_t *q = qkv + (bh / NH) * T * 3 * C + (bh % NH) * HS;
            CHECK(kn_bgemm(0, 1, T, T, HS, scale, q, 3 * C, q + C, 3 * C, NULL, 0, S + bh * TT, T,
                           0) == 0);
        }
        FOR(r, rows) kn_t_softmax(r, S, valid, T, NH);
        FOR(r, rows) kn_t_attn_round16(r, a2, S, T);
        const uint16_t *P = a2;
        if (d.p > 0.0f) {
            FOR(r, rows) kn_t_attn_drop16(r, Pd, a2, d, T, NH);
            P = Pd;
        }
        FOR(bh, B * NH)
        {
            size_t bb = bh / NH, h = bh % NH;
            CHECK(kn_bgemm(0, 0, T, HS, T, 1.0f, P + bh * TT, T, qkv + bb * T * 3 * C + h * HS + 2 * C,
                           3 * C, NULL, 0, out2 + bb * T * C + h * HS, C, 1) == 0);
        }
        /* backward, from the CPU op's probabilities (the forward is compared above) */
        const uint16_t *Pv = a1;
        if (d.p > 0.0f) {
            FOR(r, rows) kn_t_attn_drop16(r, Pd, a1, d, T, NH);
            Pv = Pd;
        }
        FOR(bh, B * NH)
        {
            size_t bb = bh / NH, h = bh % NH, tok0 = bb * T * 3 * C + h * HS;
            const uint16_t *o = dO + bb * T * C + h * HS;
            CHECK(kn_bgemm(0, 1, T, T, HS, 1.0f, o, C, qkv + tok0 + 2 * C, 3 * C, NULL, 0,
                           dP + bh * TT, T, 0) == 0);
            CHECK(kn_bgemm(1, 0, T, HS, T, 1.0f, Pv + bh * TT, T, o, C, NULL, 1,
                           g2 + tok0 + 2 * C, 3 * C, 0) == 0);
        }
        FOR(r, rows) kn_t_attn_bwd16(r, dP, dS, a1, d, T, NH, scale);
        FOR(bh, B * NH)
        {
            size_t bb = bh / NH, h = bh % NH, tok0 = bb * T * 3 * C + h * HS;
            CHECK(kn_bgemm(0, 0, T, HS, T, 1.0f, dS + bh * TT, T, qkv + tok0 + C, 3 * C, NULL, 1,
                           g2 + tok0, 3 * C, 0) == 0);
            CHECK(kn_bgemm(1, 0, T, HS, T, 1.0f, dS + bh * TT, T, qkv + tok0, 3 * C, NULL, 1,
                           g2 + tok0 + C, 3 * C, 0) == 0);
        }
        float *w1 = widen(out1, nx), *w2 = widen(out2, nx), *x1 = widen(a1, na),
              *x2 = widen(a2, na);
        KT_CHECK_REL(k ? "attention16 out (p=.1)" : "attention16 out", w2, w1, nx, 8e-3);
        KT_CHECK_REL(k ? "attention16 att (p=.1)" : "attention16 att", x2, x1, na, 4e-3);
        KT_CHECK_REL(k ? "attention16 dqkv (p=.1)" : "attention16 dqkv", g2, g1, nq, 2e-3);
        free(out1), free(out2), free(a1), free(a2), free(Pd), free(dS), free(S), free(dP),
            free(g1), free(g2), free(w1), free(w2), free(x1), free(x2);
    }
    free(qkv), free(dO);
}

static void test_elementwise(void)
{
    size_t n = (size_t)N * FF;
    float *x = kt_randn(n, 16, 2), *y = kt_randn(n, 17, 1), *o1 = kt_alloc(n), *o2 = kt_alloc(n);
    for (int kind = 0; kind < 2; kind++) {
        kn_gelu_forward(o1, x, n, kind);
        FOR(i, n) kn_t_gelu_fwd(i, o2, x, kind);
        check_same(kind ? "gelu tanh fwd" : "gelu erf fwd", o1, o2, n);
        memset(o1, 0, n * sizeof *o1);
        memset(o2, 0, n * sizeof *o2);
        kn_gelu_backward(o1, x, y, n, kind);
        FOR(i, n) kn_t_gelu_bwd(i, o2, x, y, kind);
        check_same(kind ? "gelu tanh bwd" : "gelu erf bwd", o1, o2, n);
    }
    kn_tanh_forward(o1, x, n);
    FOR(i, n) kn_t_tanh_fwd(i, o2, x);
    check_same("tanh fwd", o1, o2, n);
    memset(o2, 0, n * sizeof *o2);
    float *tg = kt_randn(n, 18, 1);
    memcpy(o2, tg, n * sizeof *o2);
    kn_tanh_backward(tg, o1, y, n);
    FOR(i, n) kn_t_tanh_bwd(i, o2, o1, y);
    check_same("tanh bwd", tg, o2, n);
    free(tg);
    kn_residual_forward(o1, x, y, n);
    FOR(i, n) kn_t_residual_fwd(i, o2, x, y);
    check_same("residual fwd", o1, o2, n);
    float *da1 = kt_randn(n, 40, 1), *db1 = kt_randn(n, 41, 1), *da2 = kt_randn(n, 40, 1),
          *db2 = kt_randn(n, 41, 1);
    kn_residual_backward(da1, db1, y, n);
    FOR(i, n) kn_t_residual_bwd(i, da2, db2, y);
    check_same("residual bwd (da)", da1, da2, n);
    check_same("residual bwd (db)", db1, db2, n);
    kn_scale(o1, n, 0.37f);
    FOR(i, n) kn_t_scale(i, o2, 0.37f);
    check_same("scale", o1, o2, n);
    /* hidden dropout: CPU draws Philox blocks, the kernel one word per thread */
    kn_dropout d = {.p = 0.1f, .seed = 8, .stream = 9, .seq0 = 3};
    size_t per = n / B;
    kn_dropout_forward(o1, y, B, per, d);
    FOR(i, n) kn_t_dropout(i, o2, y, per, d, 0);
    check_same("dropout fwd", o1, o2, n);
    memcpy(o2, da1, n * sizeof *o2);
    memcpy(o1, da1, n * sizeof *o1);
    kn_dropout_backward(o1, y, B, per, d);
    FOR(i, n) kn_t_dropout(i, o2, y, per, d, 1);
    check_same("dropout bwd", o1, o2, n);
    free(x), free(y), free(o1), free(o2), free(da1), free(db1), free(da2), free(db2);
}

/* rows: the MLM head's gather of masked positions and scatter of their gradient */
static void test_rows(void)
{
    int32_t idx[M];
    FOR(j, M) idx[j] = (int32_t)((j * 7 + 3) % N); /* distinct rows, out of order */
    float *x = kt_randn((size_t)N * C, 50, 1), *r = kt_randn((size_t)M * C, 51, 1);
    float *o1 = kt_alloc((size_t)M * C), *o2 = kt_alloc((size_t)M * C);
    kn_gather_rows(o1, x, idx, M, C);
    FOR(i, (size_t)M * C) kn_t_gather(i, o2, x, idx, C);
    check_same("gather rows", o1, o2, (size_t)M * C);
    FOR(j, M) CHECK(!memcmp(o1 + j * C, x + (size_t)idx[j] * C, C * sizeof(float)));
    float *s1 = kt_alloc((size_t)N * C), *s2 = kt_alloc((size_t)N * C);
    kn_scatter_rows(s1, r, idx, M, C);
    FOR(i, (size_t)M * C) kn_t_scatter(i, s2, r, idx, C);
    check_same("scatter rows", s1, s2, (size_t)N * C);
    size_t nonzero = 0;
    FOR(i, (size_t)N * C) nonzero += s1[i] != 0.0f;
    CHECK(nonzero == (size_t)M * C); /* rows not in idx untouched (zero) */
    free(x), free(r), free(o1), free(o2), free(s1), free(s2);
}

static void test_crossentropy(void)
{
    int32_t tgt[M];
    FOR(i, M) tgt[i] = kt_randint(21, i, V);
    tgt[3] = -100;
    float *lg = kt_randn((size_t)M * V, 20, 3), *l1 = kt_alloc(M), *l2 = kt_alloc(M),
          *p1 = kt_alloc((size_t)M * V), *p2 = kt_alloc((size_t)M * V),
          *d1 = kt_alloc((size_t)M * V), *d2 = kt_alloc((size_t)M * V);
    kn_crossentropy_forward(l1, p1, lg, tgt, M, V);
    FOR(i, M) kn_t_xent_fwd(i, l2, p2, lg, tgt, V);
    /* row reductions: the AVX-512/AVX2 clone of the CPU op sums in another order */
    KT_CHECK_REL("xent loss", l2, l1, M, 1e-6);
    KT_CHECK_REL("xent probs", p2, p1, (size_t)M * V, 1e-6);
    kn_crossentropy_backward(d1, p1, tgt, M, V, 0.25f);
    FOR(i, M) kn_t_xent_bwd(i, d2, p1, tgt, V, 0.25f);
    check_same("xent bwd", d1, d2, (size_t)M * V);
    free(lg), free(l1), free(l2), free(p1), free(p2), free(d1), free(d2);
}

/* kn_cuda_adamw_update / kn_cuda_lamb_update: per element, LAMB with the two
 * norms reduced between the passes (the GPU's block sums are in another
 * order: the trust ratio may differ in the last bits, hence a tolerance). */
static void test_optimizers(void)
{
    enum { NP = 70001 };
    float *g = kt_randn(NP, 30, 1);
    float *s1 = kt_alloc(3 * NP), *s2 = kt_alloc(3 * NP);
    float *pp = kt_randn(NP, 31, 1);
    for (int lamb = 0; lamb < 2; lamb++) {
        memset(s1, 0, 3 * NP * sizeof(float));
        memset(s2, 0, 3 * NP * sizeof(float));
        memcpy(s1, pp, NP * sizeof(float));
        memcpy(s2, pp, NP * sizeof(float));
        for (int t = 1; t <= 3; t++) {
            float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-6f, wd = 0.01f;
            if (lamb) {
                kn_lamb_update(s1, g, s1 + NP, s1 + 2 * NP, NP, lr, b1, b2, eps, wd, t);
                float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
                double ps = 0, us = 0, p2, u2;
                FOR(i, NP)
                {
                    kn_t_lamb_moments(i, s2, g, s2 + NP, s2 + 2 * NP, b1, b2, eps, wd, bc1, bc2,
                                      &p2, &u2);
                    ps += p2, us += u2;
                }
                float step = lr * kn_lamb_trust(ps, us);
                FOR(i, NP) kn_t_lamb_apply(i, s2, s2 + NP, s2 + 2 * NP, step, eps, wd, bc1, bc2);
            } else {
                kn_adamw_update(s1, g, s1 + NP, s1 + 2 * NP, NP, lr, b1, b2, eps, wd, t, 1.0f,
                                NULL);
                float bc1 = (float)(1.0 - pow(b1, t)), sbc2 = (float)sqrt(1.0 - pow(b2, t));
                FOR(i, NP)
                kn_t_adamw(i, s2, g, s2 + NP, s2 + 2 * NP, lr, b1, b2, eps, wd, bc1, sbc2, 1.0f,
                           NULL);
            }
        }
        KT_CHECK_REL(lamb ? "lamb p,m,v" : "adamw p,m,v", s2, s1, 3 * NP, 1e-6);
    }
    free(g), free(s1), free(s2), free(pp);
}

/* The library-free exp/erf/tanh of kn_body.h against libm in double, on a
 * dense grid: exp relative error <= 3e-7 (a few ulp), erf and tanh absolute
 * error <= 1e-6 (documented: 5e-7 and 2e-7 measured). */
static void test_fast_math(void)
{
    double e_exp = 0, e_erf = 0, e_tanh = 0;
    for (float v = -87.0f; v < 88.0f; v += 0.00137f) {
        double r = exp((double)v), e = fabs(kn_expf(v) - r) / r;
        e_exp = e > e_exp ? e : e_exp;
    }
    for (float v = -7.0f; v < 7.0f; v += 0.000113f) {
        double a = fabs(kn_erff(v) - erf((double)v)), b = fabs(kn_tanhf(v) - tanh((double)v));
        e_erf = a > e_erf ? a : e_erf;
        e_tanh = b > e_tanh ? b : e_tanh;
    }
    printf("    exp rel %.3g, erf abs %.3g, tanh abs %.3g\n", e_exp, e_erf, e_tanh);
    CHECK(e_exp <= 3e-7);
    CHECK(e_erf <= 1e-6);
    CHECK(e_tanh <= 1e-6);
    CHECK(kn_expf(-INFINITY) == 0.0f && kn_expf(-100.0f) == 0.0f && isfinite(kn_expf(1000.0f)));
    CHECK(kn_tanhf(50.0f) == 1.0f && kn_tanhf(-50.0f) == -1.0f && kn_erff(10.0f) == 1.0f);
}

/* The vectorised Philox of the CPU dropout gives sl_rng_u32's words exactly,
 * for any alignment and length, including block counters above 2^32. */
static void test_rng_fill(void)
{
    static const size_t lens[] = {0, 1, 3, 63, 64, 65, 1000, 4099};
    static const uint64_t starts[] = {0, 1, 2, 3, 5, (1ull << 34) - 7, 0xFFFFFFFF0ull};
    uint32_t out[4099], out2[4099];
    int ok = 1;
    for (size_t a = 0; a < sizeof starts / sizeof starts[0]; a++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            uint64_t seed = 0x0123456789ABCDEFull + a, stream = 0xFEDCBA9876543210ull - l;
            kn_rng_fill_u32(seed, stream, starts[a], lens[l], out);
            kn_rng_fill_u32_portable(seed, stream, starts[a], lens[l], out2);
            for (size_t i = 0; i < lens[l]; i++) {
                uint32_t want = sl_rng_u32(seed, stream, starts[a] + i);
                ok &= out[i] == want && out2[i] == want;
            }
        }
    printf("    kn_rng_fill_u32 uses %s\n",
           kn_rng_have_avx512() ? "AVX-512 intrinsics" : "the portable code");
    CHECK(ok);
}

int main(void)
{
    RUN(test_rng_fill);
    RUN(test_fast_math);
    RUN(test_embed);
    RUN(test_layernorm);
    RUN(test_matmul);
    RUN(test_attention);
    RUN(test_bf16);
    RUN(test_elementwise);
    RUN(test_rows);
    RUN(test_crossentropy);
    RUN(test_optimizers);
    return sl_test_done();
}
