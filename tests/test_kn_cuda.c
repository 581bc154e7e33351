/* Every CUDA op (kn_cuda.h) against the CPU op on the same inputs, when a GPU
 * exists; otherwise prints why (kn_cuda_probe: not compiled in, no driver,
 * no device) and exits 77 (skip). Tolerance 1e-5 in the metric of
 * kn_testutil.h: the GPU contracts to FMA and has its own expf/erff, and
 * cuBLAS sums in another order; dropout masks must match exactly. */
#include "kn_backend.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "sl_config.h"
#include "sl_float.h"
#if HAVE_CUDA
#include "kn_cuda.h"
#endif

#if HAVE_CUDA
enum { B = 2, T = 37, C = 96, NH = 3, FF = 384, V = 997, M = 11, N = B * T };
static const double TOL = 1e-5;

static void *up(const void *h, size_t bytes)
{
    sl_err err;
    void *d = kn_cuda_alloc(bytes, &err);
    CHECKF(d != NULL, "%s", err.msg);
    if (d)
        CHECKF(kn_cuda_upload(d, h, bytes, &err) == 0, "%s", err.msg);
    return d;
}
static float *upf(const float *h, size_t n)
{
    return up(h, n * sizeof(float));
}
/* A device copy of n floats of zeros. */
static float *zeros(size_t n)
{
    float *h = kt_alloc(n), *d = upf(h, n);
    free(h);
    return d;
}
/* Downloads n floats of d (after syncing) and compares with the CPU's ref. */
static void cmp(const char *what, const float *d, const float *ref, size_t n)
{
    sl_err err;
    CHECKF(kn_cuda_sync(&err) == 0, "%s: %s", what, err.msg);
    float *h = kt_alloc(n);
    CHECKF(kn_cuda_download(h, d, n * sizeof(float), &err) == 0, "%s", err.msg);
    KT_CHECK_REL(what, h, ref, n, TOL);
    free(h);
}

static void test_embed_layernorm_matmul(void)
{
    int32_t tok[N], seg[N];
    for (int i = 0; i < N; i++)
        tok[i] = kt_randint(1, i, V), seg[i] = i % 2;
    size_t nc = (size_t)N * C;
    float *wte = kt_randn((size_t)V * C, 2, 1), *wpe = kt_randn((size_t)T * C, 3, 1),
          *wse = kt_randn(2 * C, 4, 1), *dout = kt_randn(nc, 5, 1);
    float *out = kt_alloc(nc), *g = kt_alloc((size_t)(V + T + 2) * C);
    kn_embed_forward(out, tok, seg, wte, wpe, wse, B, T, C);
    kn_embed_backward(g, g + (size_t)V * C, g + (size_t)(V + T) * C, dout, tok, seg, B, T, C);
    int32_t *dtok = up(tok, sizeof tok), *dseg = up(seg, sizeof seg);
    float *dwte = upf(wte, (size_t)V * C), *dwpe = upf(wpe, (size_t)T * C), *dwse = upf(wse, 2 * C),
          *ddout = upf(dout, nc), *dout_ = zeros(nc), *dg = zeros((size_t)(V + T + 2) * C);
    kn_cuda_embed_forward(dout_, dtok, dseg, dwte, dwpe, dwse, B, T, C);
    kn_cuda_embed_backward(dg, dg + (size_t)V * C, dg + (size_t)(V + T) * C, ddout, dtok, dseg, B,
                           T, C);
    cmp("embed fwd", dout_, out, nc);
    cmp("embed bwd", dg, g, (size_t)(V + T + 2) * C);

    /* layernorm on the embedding output */
    float *w = kt_randn(C, 7, 1), *b = kt_randn(C, 8, 1), *ln = kt_alloc(nc), *st = kt_alloc(2 * N),
          *dx = kt_alloc(nc + 2 * C);
    kn_layernorm_forward(ln, st, st + N, out, w, b, N, C, 1e-12f);
    kn_layernorm_backward(dx, dx + nc, dx + nc + C, dout, out, w, st, st + N, N, C);
    float *dw_ = upf(w, C), *db_ = upf(b, C), *dln = zeros(nc), *dst = zeros(2 * N),
          *ddx = zeros(nc + 2 * C);
    kn_cuda_layernorm_forward(dln, dst, dst + N, dout_, dw_, db_, N, C, 1e-12f);
    kn_cuda_layernorm_backward(ddx, ddx + nc, ddx + nc + C, ddout, dout_, dw_, dst, dst + N, N, C);
    cmp("layernorm fwd", dln, ln, nc);
    cmp("layernorm mean/rstd", dst, st, 2 * N);
    cmp("layernorm bwd", ddx, dx, nc + 2 * C);

    /* linear C -> FF */
    size_t nf = (size_t)N * FF;
    float *mw = kt_randn((size_t)FF * C, 11, 0.1f), *mb = kt_randn(FF, 12, 1),
          *mdo = kt_randn(nf, 13, 1), *mo = kt_alloc(nf), *mg = kt_alloc(nc + (size_t)FF * C + FF);
    kn_matmul_forward(mo, ln, mw, mb, N, C, FF);
    kn_matmul_backward(mg, mg + nc, mg + nc + (size_t)FF * C, mdo, ln, mw, N, C, FF);
    float *dmw = upf(mw, (size_t)FF * C), *dmb = upf(mb, FF), *dmdo = upf(mdo, nf),
          *dmo = zeros(nf), *dmg = zeros(nc + (size_t)FF * C + FF), *dlnh = upf(ln, nc);
    kn_cuda_matmul_forward(dmo, dlnh, dmw, dmb, N, C, FF);
    kn_cuda_matmul_backward(dmg, dmg + nc, dmg + nc + (size_t)FF * C, dmdo, dlnh, dmw, N, C, FF);
    cmp("matmul fwd", dmo, mo, nf);
    cmp("matmul bwd", dmg, mg, nc + (size_t)FF * C + FF);
    kn_matmul_forward(mo, ln, mw, NULL, N, C, FF);
    kn_cuda_matmul_forward(dmo, dlnh, dmw, NULL, N, C, FF);
    cmp("matmul fwd no bias", dmo, mo, nf);

    void *devs[] = {dtok, dseg, dwte, dwpe, dwse, ddout, dout_, dg,  dw_, db_,
                    dln,  dst,  ddx,  dmw,  dmb,  dmdo,  dmo,   dmg, dlnh};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++)
        kn_cuda_free(devs[i]);
    free(wte), free(wpe), free(wse), free(dout), free(out), free(g), free(w), free(b), free(ln),
        free(st), free(dx), free(mw), free(mb), free(mdo), free(mo), free(mg);
}

static void test_attention(void)
{
    int32_t valid[N];
    for (int i = 0; i < N; i++)
        valid[i] = i < T || (i - T) < 30;
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T, no = (size_t)N * C;
    float *qkv = kt_randn(nq, 14, 1), *dout = kt_randn(no, 15, 1);
    float *o = kt_alloc(no), *a = kt_alloc(na), *g = kt_alloc(nq);
    int32_t *dvalid = up(valid, sizeof valid);
    float *dqkv = upf(qkv, nq), *ddout = upf(dout, no), *dout_ = zeros(no), *da = zeros(na);
    for (int k = 0; k < 2; k++) {
        kn_dropout d = {.p = k ? 0.1f : 0.0f, .seed = 3, .stream = 4, .seq0 = 6};
        float *dg = zeros(nq);
        memset(g, 0, nq * sizeof *g);
        kn_attention_forward(o, a, qkv, valid, B, T, C, NH, d);
        kn_attention_backward(g, dout, qkv, a, B, T, C, NH, d);
        kn_cuda_attention_forward(dout_, da, dqkv, dvalid, B, T, C, NH, d);
        kn_cuda_attention_backward(dg, ddout, dqkv, da, B, T, C, NH, d);
        cmp(k ? "attention out p=.1" : "attention out", dout_, o, no);
        cmp(k ? "attention att p=.1" : "attention att", da, a, na);
        cmp(k ? "attention dqkv p=.1" : "attention dqkv", dg, g, nq);
        kn_cuda_free(dg);
    }
    kn_cuda_free(dvalid), kn_cuda_free(dqkv), kn_cuda_free(ddout), kn_cuda_free(dout_),
        kn_cuda_free(da);
    free(qkv), free(dout), free(o), free(a), free(g);
}

static void test_elementwise(void)
{
    size_t n = (size_t)N * FF;
    float *x = kt_randn(n, 16, 2), *y = kt_randn(n, 17, 1), *o = kt_alloc(n), *g = kt_alloc(n);
    float *dx = upf(x, n), *dy = upf(y, n), *d_o = zeros(n), *dg = zeros(n);
    for (int kind = 0; kind < 2; kind++) {
        memset(g, 0, n * sizeof *g);
        kn_cuda_zero(dg, n * sizeof(float), NULL);
        kn_gelu_forward(o, x, n, kind);
        kn_gelu_backward(g, x, y, n, kind);
        kn_cuda_gelu_forward(d_o, dx, n, kind);
        kn_cuda_gelu_backward(dg, dx, dy, n, kind);
        cmp(kind ? "gelu tanh fwd" : "gelu erf fwd", d_o, o, n);
        cmp(kind ? "gelu tanh bwd" : "gelu erf bwd", dg, g, n);
    }
    memset(g, 0, n * sizeof *g);
    kn_cuda_zero(dg, n * sizeof(float), NULL);
    kn_tanh_forward(o, x, n);
    kn_tanh_backward(g, o, y, n);
    kn_cuda_tanh_forward(d_o, dx, n);
    kn_cuda_tanh_backward(dg, d_o, dy, n);
    cmp("tanh fwd", d_o, o, n);
    cmp("tanh bwd", dg, g, n);
    kn_residual_forward(o, x, y, n);
    kn_cuda_residual_forward(d_o, dx, dy, n);
    cmp("residual fwd", d_o, o, n);
    kn_residual_backward(g, NULL, y, n);
    kn_cuda_residual_backward(dg, NULL, dy, n);
    cmp("residual bwd", dg, g, n);
    kn_scale(g, n, 0.37f);
    kn_cuda_scale(dg, n, 0.37f);
    cmp("scale", dg, g, n);
    double s = kn_sumsq(x, n), sd = kn_cuda_sumsq(dx, n);
    CHECKF(fabs(s - sd) <= 1e-9 * s, "sumsq %.17g vs %.17g", sd, s);
    /* dropout: the masks must agree exactly (zero patterns compared below) */
    kn_dropout d = {.p = 0.1f, .seed = 8, .stream = 9, .seq0 = 3};
    kn_dropout_forward(o, y, B, n / B, d);
    kn_cuda_dropout_forward(d_o, dy, B, n / B, d);
    cmp("dropout fwd", d_o, o, n);
    float *h = kt_alloc(n);
    kn_cuda_download(h, d_o, n * sizeof(float), NULL);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= (h[i] == 0.0f) == (o[i] == 0.0f);
    CHECKF(same, "dropout masks differ between CPU and GPU");
    kn_dropout_backward(g, y, B, n / B, d);
    kn_cuda_dropout_backward(dg, dy, B, n / B, d);
    cmp("dropout bwd", dg, g, n);
    kn_cuda_free(dx), kn_cuda_free(dy), kn_cuda_free(d_o), kn_cuda_free(dg);
    free(x), free(y), free(o), free(g), free(h);
}

static void test_rows(void)
{
    int32_t idx[M];
    for (int j = 0; j < M; j++)
        idx[j] = (int32_t)((j * 7 + 3) % N);
    float *x = kt_randn((size_t)N * C, 50, 1), *o = kt_alloc((size_t)M * C),
          *s = kt_alloc((size_t)N * C);
    float *dx = upf(x, (size_t)N * C), *d_o = zeros((size_t)M * C), *ds = zeros((size_t)N * C);
    int32_t *didx = up(idx, sizeof idx);
    kn_gather_rows(o, x, idx, M, C);
    kn_cuda_gather_rows(d_o, dx, didx, M, C);
    cmp("gather rows", d_o, o, (size_t)M * C);
    kn_scatter_rows(s, o, idx, M, C);
    kn_cuda_scatter_rows(ds, d_o, didx, M, C);
    cmp("scatter rows", ds, s, (size_t)N * C);
    kn_cuda_free(dx), kn_cuda_free(d_o), kn_cuda_free(ds), kn_cuda_free(didx);
    free(x), free(o), free(s);
}

static void test_crossentropy_optim(void)
{
    int32_t tgt[M];
    for (int i = 0; i < M; i++)
        tgt[i] = kt_randint(21, i, V);
    tgt[3] = -100;
    size_t mv = (size_t)M * V;
    float *lg = kt_randn(mv, 20, 3), *l = kt_alloc(M), *p = kt_alloc(mv), *dl = kt_alloc(mv);
    kn_crossentropy_forward(l, p, lg, tgt, M, V);
    kn_crossentropy_backward(dl, p, tgt, M, V, 0.25f);
    int32_t *dtgt = up(tgt, sizeof tgt);
    float *dlg = upf(lg, mv), *dl_ = zeros(M), *dp = zeros(mv), *ddl = zeros(mv);
    kn_cuda_crossentropy_forward(dl_, dp, dlg, dtgt, M, V);
    kn_cuda_crossentropy_backward(ddl, dp, dtgt, M, V, 0.25f);
    cmp("xent loss", dl_, l, M);
    cmp("xent probs", dp, p, mv);
    cmp("xent bwd", ddl, dl, mv);
    /* in place, as the head runs it: logits -> probs -> their gradient */
    kn_cuda_crossentropy_forward(dl_, dlg, dlg, dtgt, M, V);
    cmp("xent probs in place", dlg, p, mv);
    kn_cuda_crossentropy_backward(dlg, dlg, dtgt, M, V, 0.25f);
    cmp("xent bwd in place", dlg, dl, mv);
    kn_cuda_free(dtgt), kn_cuda_free(dlg), kn_cuda_free(dl_), kn_cuda_free(dp), kn_cuda_free(ddl);
    free(lg), free(l), free(p), free(dl);

    enum { NP = 70001 };
    float *g = kt_randn(NP, 30, 1), *s = kt_alloc(3 * NP);
    for (int lamb = 0; lamb < 2; lamb++) {
        float *p0 = kt_randn(NP, 31, 1);
        memset(s, 0, 3 * NP * sizeof(float));
        memcpy(s, p0, NP * sizeof(float));
        float *ds = upf(s, 3 * NP), *dgr = upf(g, NP);
        for (int t = 1; t <= 3; t++) {
            if (lamb) {
                kn_lamb_update(s, g, s + NP, s + 2 * NP, NP, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t);
                kn_cuda_lamb_update(ds, dgr, ds + NP, ds + 2 * NP, NP, 1e-3f, 0.9f, 0.999f, 1e-6f,
                                    0.01f, t);
            } else { /* clipped: the scaled gradient is written back on both */
                kn_adamw_update(s, g, s + NP, s + 2 * NP, NP, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t,
                                0.5f, NULL);
                kn_cuda_adamw_update(ds, dgr, ds + NP, ds + 2 * NP, NP, 1e-3f, 0.9f, 0.999f, 1e-6f,
                                     0.01f, t, 0.5f, NULL);
            }
        }
        cmp(lamb ? "lamb p,m,v" : "adamw p,m,v", ds, s, 3 * NP);
        if (!lamb)
            cmp("adamw's scaled gradient", dgr, g, NP);
        kn_cuda_free(ds), kn_cuda_free(dgr);
        free(p0);
    }
    free(g), free(s);
}

/* ---- bf16 compute: each op against the CPU's bf16 op ---------------------------------
 * Both accumulate bf16 products in fp32, in other orders: fp32 results
 * within 1e-5 (as the fp32 ops), bf16 ones (rounded once) within a bf16
 * half-ulp of the largest element (4e-3; one rounding may land on the other
 * side of a tie), attention's within what test_kn_ops_bf16 allows against
 * its float64 emulation. Needs compute capability 8.0 (else said, not run). */
static uint16_t *randn16(size_t n, uint64_t stream, float sd)
{
    float *x = kt_randn(n, stream, sd);
    uint16_t *h = sl_xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = sl_f32_to_bf16(x[i]);
    free(x);
    return h;
}
/* Downloads n bf16 of d and compares them widened with the CPU's ref. */
static void cmp16(const char *what, const uint16_t *d, const uint16_t *ref, size_t n, double tol)
{
    sl_err err;
    CHECKF(kn_cuda_sync(&err) == 0, "%s: %s", what, err.msg);
    uint16_t *h = sl_xmalloc(n * 2);
    CHECKF(kn_cuda_download(h, d, n * 2, &err) == 0, "%s", err.msg);
    float *a = kt_alloc(n), *r = kt_alloc(n);
    for (size_t i = 0; i < n; i++)
        a[i] = sl_bf16_to_f32(h[i]), r[i] = sl_bf16_to_f32(ref[i]);
    KT_CHECK_REL(what, a, r, n, tol);
    free(h), free(a), free(r);
}
static void cmpt(const char *what, const float *d, const float *ref, size_t n, double tol)
{
    sl_err err;
    CHECKF(kn_cuda_sync(&err) == 0, "%s: %s", what, err.msg);
    float *h = kt_alloc(n);
    CHECKF(kn_cuda_download(h, d, n * sizeof(float), &err) == 0, "%s", err.msg);
    KT_CHECK_REL(what, h, ref, n, tol);
    free(h);
}

static void test_bf16(void)
{
    sl_err err;
    if (kn_cuda_bf16_check(&err) || kn_cpu_bf16_check(&err)) {
        printf("    bf16 not compared: %s\n", err.msg);
        return;
    }
    size_t nx = (size_t)N * C, no = (size_t)N * FF, nw = (size_t)FF * C;
    uint16_t *x16 = randn16(nx, 40, 1), *w16 = randn16(nw, 41, 0.1f), *h16 = randn16(no, 42, 2);
    float *b = kt_randn(FF, 43, 1), *dout = kt_randn(no, 44, 1), *f = kt_randn(no, 45, 3);
    uint16_t *c16 = sl_xmalloc(no * 2);
    float *o = kt_alloc(no), *dx = kt_alloc(nx), *dw = kt_alloc(nw), *db = kt_alloc(FF);
    uint16_t *dx16 = up(x16, nx * 2), *dw16 = up(w16, nw * 2), *dh16 = up(h16, no * 2),
             *dc16 = up(c16, no * 2);
    float *db_ = upf(b, FF), *ddout = upf(dout, no), *df = upf(f, no), *do_ = zeros(no),
          *ddx = zeros(nx), *ddw = zeros(nw), *ddb = zeros(FF);
    kn_to_bf16(c16, f, no);
    kn_cuda_to_bf16(dc16, df, no);
    cmp16("to_bf16", dc16, c16, no, 0);
    {
        float *w = kt_randn(FF, 48, 1), *lb = kt_randn(FF, 49, 1), *l = kt_alloc(no),
              *st = kt_alloc(2 * N);
        float *dwl = upf(w, FF), *dlb = upf(lb, FF), *dl = zeros(no), *dst = zeros(2 * N);
        kn_layernorm_forward_bf16(l, c16, st, st + N, f, w, lb, N, FF, 1e-12f);
        kn_cuda_layernorm_forward_bf16(dl, dc16, dst, dst + N, df, dwl, dlb, N, FF, 1e-12f);
        cmpt("layernorm fwd bf16", dl, l, no, 1e-5);
        cmp16("layernorm fwd to bf16", dc16, c16, no, 4e-3);
        free(w), free(lb), free(l), free(st);
        kn_cuda_free(dwl), kn_cuda_free(dlb), kn_cuda_free(dl), kn_cuda_free(dst);
    }
    kn_matmul_forward_bf16(o, NULL, x16, w16, b, N, C, FF);
    kn_cuda_matmul_forward_bf16(do_, NULL, dx16, dw16, db_, N, C, FF);
    cmpt("matmul fwd bf16", do_, o, no, 1e-5);
    kn_matmul_forward_bf16(NULL, c16, x16, w16, b, N, C, FF);
    kn_cuda_matmul_forward_bf16(NULL, dc16, dx16, dw16, db_, N, C, FF);
    cmp16("matmul fwd to bf16", dc16, c16, no, 4e-3);
    kn_matmul_backward_bf16(dx, dw, db, dout, x16, w16, N, C, FF);
    kn_cuda_matmul_backward_bf16(ddx, ddw, ddb, ddout, dx16, dw16, N, C, FF);
    cmpt("matmul bwd dx bf16", ddx, dx, nx, 1e-5);
    cmpt("matmul bwd dw bf16", ddw, dw, nw, 1e-5);
    cmpt("matmul bwd db bf16", ddb, db, FF, 1e-5);
    for (int kind = 0; kind < 2; kind++) {
        float *g = kt_alloc(no), *dg = zeros(no);
        kn_gelu_forward_bf16(c16, h16, no, kind);
        kn_cuda_gelu_forward_bf16(dc16, dh16, no, kind);
        cmp16(kind ? "gelu tanh fwd bf16" : "gelu erf fwd bf16", dc16, c16, no, 4e-3);
        kn_gelu_backward_bf16(g, NULL, h16, dout, no, kind);
        kn_cuda_gelu_backward_bf16(dg, NULL, dh16, ddout, no, kind);
        cmpt(kind ? "gelu tanh bwd bf16" : "gelu erf bwd bf16", dg, g, no, 1e-5);
        free(g), kn_cuda_free(dg);
    }
    /* attention, without and with dropout */
    int32_t valid[N];
    for (int i = 0; i < N; i++)
        valid[i] = i < T || (i - T) < 30;
    size_t nq = (size_t)N * 3 * C, na = (size_t)B * NH * T * T;
    uint16_t *qkv = randn16(nq, 46, 1), *dO = randn16(nx, 47, 1);
    uint16_t *dqkv16 = up(qkv, nq * 2), *ddO = up(dO, nx * 2);
    int32_t *dvalid = up(valid, sizeof valid);
    for (int k = 0; k < 2; k++) {
        kn_dropout d = {.p = k ? 0.1f : 0.0f, .seed = 3, .stream = 4, .seq0 = 6};
        uint16_t *o16 = sl_xmalloc(nx * 2), *a16 = sl_xmalloc(na * 2);
        float *g = kt_alloc(nq);
        kn_attention_forward_bf16(o16, a16, qkv, valid, B, T, C, NH, d);
        kn_attention_backward_bf16(g, dO, qkv, a16, B, T, C, NH, d);
        uint16_t *do16 = up(o16, nx * 2), *da16 = up(a16, na * 2);
        float *dg = zeros(nq);
        kn_cuda_attention_forward_bf16(do16, da16, dqkv16, dvalid, B, T, C, NH, d);
        cmp16(k ? "attention16 out (p=.1)" : "attention16 out", do16, o16, nx, 8e-3);
        cmp16(k ? "attention16 att (p=.1)" : "attention16 att", da16, a16, na, 4e-3);
        /* the backward from the CPU's probabilities */
        CHECK(kn_cuda_upload(da16, a16, na * 2, &err) == 0);
        kn_cuda_attention_backward_bf16(dg, ddO, dqkv16, da16, B, T, C, NH, d);
        cmpt(k ? "attention16 dqkv (p=.1)" : "attention16 dqkv", dg, g, nq, 2e-3);
        free(o16), free(a16), free(g), kn_cuda_free(do16), kn_cuda_free(da16), kn_cuda_free(dg);
    }
    free(x16), free(w16), free(h16), free(b), free(dout), free(f), free(c16), free(o), free(dx),
        free(dw), free(db), free(qkv), free(dO);
    kn_cuda_free(dx16), kn_cuda_free(dw16), kn_cuda_free(dh16), kn_cuda_free(dc16),
        kn_cuda_free(db_), kn_cuda_free(ddout), kn_cuda_free(df), kn_cuda_free(do_),
        kn_cuda_free(ddx), kn_cuda_free(ddw), kn_cuda_free(ddb), kn_cuda_free(dqkv16),
        kn_cuda_free(ddO), kn_cuda_free(dvalid);
}
#endif

int main(void)
{
    (void)sl_test_case_failed; /* unused when built without CUDA */
    const kn_cuda_info *info = kn_cuda_probe();
    if (!info->compiled || info->device_count <= 0)
        sl_test_skip(info->reason);
#if HAVE_CUDA
    sl_err err;
    if (kn_cuda_init(&err) != 0) {
        CHECKF(0, "kn_cuda_init: %s", err.msg);
        return sl_test_done();
    }
    printf("GPU: %s\n", info->reason);
    RUN(test_embed_layernorm_matmul);
    RUN(test_attention);
    RUN(test_elementwise);
    RUN(test_rows);
    RUN(test_crossentropy_optim);
    RUN(test_bf16);
    kn_cuda_shutdown();
#endif
    return sl_test_done();
}
