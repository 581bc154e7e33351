/* Every CPU op of kn_ops.h against PyTorch, plus the properties torch cannot
 * check (dropout statistics and split invariance, accumulation, padding).
 *
 * The references are computed at test time: this test writes its inputs to a
 * temporary directory, runs tests/ref/kn_ref.py with /usr/bin/python3 (the
 * Debian python3-torch), and reads the references back. Shapes are odd on
 * purpose: hidden 96, 3 heads of 32, T = 37 with the second sequence padded,
 * vocabulary 997. Error metric: kn_testutil.h (max abs error over max ref). */
#include <dirent.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>
#include <omp.h>

#include "kn_backend.h"
#include "kn_body.h"
#include "kn_gemm.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "sl_config.h"

enum { B = 2, T = 37, C = 96, NH = 3, HS = C / NH, FF = 384, V = 997, M = 13, TP = 40, N = B * T };
static const float EPS = 1e-12f;
static const float TOL = 1e-4f;
static const int VALID1 = 29; /* real tokens of sequence 1; the rest is padding */

static char g_dir[64];

static void put_raw(const char *name, const void *p, size_t bytes)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(fwrite(p, 1, bytes, f) == bytes);
    fclose(f);
}
static void put_f(const char *name, const float *p, size_t n)
{
    put_raw(name, p, n * sizeof *p);
}
static void put_i(const char *name, const int32_t *p, size_t n)
{
    put_raw(name, p, n * sizeof *p);
}

/* The reference NAME.ref, which must hold exactly n floats. */
static float *ref(const char *name, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.ref", g_dir, name);
    float *x = kt_alloc(n);
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "missing reference %s", path);
    if (!f)
        return x;
    size_t got = fread(x, sizeof(float), n, f);
    int extra = fgetc(f);
    fclose(f);
    CHECKF(got == n && extra == EOF, "reference %s: %zu floats, want %zu", name, got, n);
    return x;
}

static void cmp(const char *what, const float *a, size_t n)
{
    float *r = ref(what, n);
    KT_CHECK_REL(what, a, r, n, TOL);
    free(r);
}

static void rm_dir(void)
{
    DIR *d = opendir(g_dir);
    if (!d)
        return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(g_dir);
}

/* valid (B,T): sequence 0 all real, sequence 1 real for its first VALID1. */
static void make_valid(int32_t *valid)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            valid[b * T + t] = b == 0 || t < VALID1;
}

/* The multipliers (0 or 1/(1-p)) of a dropout over n elements starting at
 * RNG index start, element by element with the body (the ops draw blocks). */
static void mask_of(float *mask, size_t n, kn_dropout d, uint64_t start)
{
    for (size_t i = 0; i < n; i++)
        mask[i] = kn_dropout_keep(d.seed, d.stream, start + i, d.p) ? kn_dropout_scale(d.p) : 0.0f;
}

/* ------------------------------------------------------------------------------------------
 * Inputs: every op's inputs are created once, written for kn_ref.py, and
 * kept for the comparisons after it ran. */
static struct {
    int32_t tok[N], seg[N], valid[N], xtgt[M];
    float *wte, *wpe, *wse, *emb_dout;
    float *ln_x, *ln_w, *ln_b, *ln_dout;
    float *mm_x, *mm_w, *mm_b, *mm_dout;
    float *qkv, *att_dout, *att_mask[2];
    kn_dropout att_drop[2];
    float *ge_x, *ge_dout;
    float *res_a, *res_b, *res_dout;
    float *do_x, *do_dout, *do_mask;
    kn_dropout do_drop;
    float *xe_logits;
    float xe_scale;
    float *opt_p, *opt_g;
} in;

enum { OPT_N = 1031, OPT_STEPS = 3 };
static const float OPT_LR = 1e-2f, OPT_B1 = 0.9f, OPT_B2 = 0.999f, OPT_EPS = 1e-6f, OPT_WD = 0.01f;

static void make_inputs(void)
{
    for (int i = 0; i < N; i++) {
        in.tok[i] = kt_randint(1, i, V);
        in.seg[i] = (i % T) >= T / 2;
    }
    in.tok[3] = in.tok[5] = in.tok[N - 1]; /* repeated tokens: gradient scatter collides */
    make_valid(in.valid);
    in.wte = kt_randn((size_t)V * C, 2, 0.5f);
    in.wpe = kt_randn((size_t)TP * C, 3, 0.5f);
    in.wse = kt_randn(2 * C, 4, 0.5f);
    in.emb_dout = kt_randn((size_t)N * C, 5, 1.0f);
    in.ln_x = kt_randn((size_t)N * C, 6, 2.0f);
    for (int i = 0; i < N * C; i++)
        in.ln_x[i] += 0.5f; /* a non-zero mean */
    in.ln_w = kt_randn(C, 7, 1.0f);
    in.ln_b = kt_randn(C, 8, 1.0f);
    in.ln_dout = kt_randn((size_t)N * C, 9, 1.0f);
    in.mm_x = kt_randn((size_t)N * C, 10, 1.0f);
    in.mm_w = kt_randn((size_t)FF * C, 11, 0.1f);
    in.mm_b = kt_randn(FF, 12, 1.0f);
    in.mm_dout = kt_randn((size_t)N * FF, 13, 1.0f);
    in.qkv = kt_randn((size_t)N * 3 * C, 14, 1.0f);
    in.att_dout = kt_randn((size_t)N * C, 15, 1.0f);
    size_t att_n = (size_t)B * NH * T * T;
    for (int k = 0; k < 2; k++) {
        in.att_drop[k] = (kn_dropout){.p = k ? 0.1f : 0.0f, .seed = 77, .stream = 5, .seq0 = 3};
        in.att_mask[k] = kt_alloc(att_n);
        if (k)
            mask_of(in.att_mask[k], att_n, in.att_drop[k], in.att_drop[k].seq0 * NH * T * T);
        else
            for (size_t i = 0; i < att_n; i++)
                in.att_mask[k][i] = 1.0f;
    }
    in.ge_x = kt_randn((size_t)N * FF, 16, 2.0f);
    in.ge_dout = kt_randn((size_t)N * FF, 17, 1.0f);
    in.res_a = kt_randn((size_t)N * C, 24, 1.0f);
    in.res_b = kt_randn((size_t)N * C, 25, 1.0f);
    in.res_dout = kt_randn((size_t)N * C, 26, 1.0f);
    in.do_x = kt_randn((size_t)N * C, 18, 1.0f);
    in.do_dout = kt_randn((size_t)N * C, 19, 1.0f);
    in.do_drop = (kn_dropout){.p = 0.1f, .seed = 99, .stream = 2, .seq0 = 5};
    in.do_mask = kt_alloc((size_t)N * C);
    mask_of(in.do_mask, (size_t)N * C, in.do_drop, in.do_drop.seq0 * T * C);
    in.xe_logits = kt_randn((size_t)M * V, 20, 3.0f);
    for (int i = 0; i < M; i++)
        in.xtgt[i] = kt_randint(21, i, V);
    in.xtgt[4] = -100; /* an ignored position */
    in.xe_scale = 1.0f / 40.0f;
    in.opt_p = kt_randn(OPT_N, 22, 1.0f);
    in.opt_g = kt_randn((size_t)OPT_STEPS * OPT_N, 23, 1.0f);
}

static void write_inputs(void)
{
    char dims[1024];
    snprintf(dims, sizeof dims,
             "B %d\nT %d\nC %d\nNH %d\nF %d\nV %d\nM %d\nTP %d\neps %.9e\nxe_scale %.9e\n"
             "opt_n %d\nopt_steps %d\nopt_lr %.9e\nopt_b1 %.9e\nopt_b2 %.9e\nopt_eps %.9e\n"
             "opt_wd %.9e\n",
             B, T, C, NH, FF, V, M, TP, (double)EPS, (double)in.xe_scale, OPT_N, OPT_STEPS,
             (double)OPT_LR, (double)OPT_B1, (double)OPT_B2, (double)OPT_EPS, (double)OPT_WD);
    put_raw("dims.txt", dims, strlen(dims));
    put_i("emb.tok", in.tok, N), put_i("emb.seg", in.seg, N);
    put_f("emb.wte", in.wte, (size_t)V * C), put_f("emb.wpe", in.wpe, (size_t)TP * C);
    put_f("emb.wse", in.wse, 2 * C), put_f("emb.dout", in.emb_dout, (size_t)N * C);
    put_f("ln.x", in.ln_x, (size_t)N * C), put_f("ln.w", in.ln_w, C), put_f("ln.b", in.ln_b, C);
    put_f("ln.dout", in.ln_dout, (size_t)N * C);
    put_f("mm.x", in.mm_x, (size_t)N * C), put_f("mm.w", in.mm_w, (size_t)FF * C);
    put_f("mm.b", in.mm_b, FF), put_f("mm.dout", in.mm_dout, (size_t)N * FF);
    const char *tags[2] = {"att0", "att1"};
    char name[64];
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s.qkv", tags[k]);
        put_f(name, in.qkv, (size_t)N * 3 * C);
        snprintf(name, sizeof name, "%s.valid", tags[k]);
        put_i(name, in.valid, N);
        snprintf(name, sizeof name, "%s.dout", tags[k]);
        put_f(name, in.att_dout, (size_t)N * C);
        snprintf(name, sizeof name, "%s.mask", tags[k]);
        put_f(name, in.att_mask[k], (size_t)B * NH * T * T);
    }
    put_f("ge.x", in.ge_x, (size_t)N * FF), put_f("ge.dout", in.ge_dout, (size_t)N * FF);
    put_f("res.a", in.res_a, (size_t)N * C), put_f("res.b", in.res_b, (size_t)N * C);
    put_f("res.dout", in.res_dout, (size_t)N * C);
    put_f("do.x", in.do_x, (size_t)N * C), put_f("do.dout", in.do_dout, (size_t)N * C);
    put_f("do.mask", in.do_mask, (size_t)N * C);
    put_f("xe.logits", in.xe_logits, (size_t)M * V), put_i("xe.tgt", in.xtgt, M);
    put_f("opt.p", in.opt_p, OPT_N), put_f("opt.g", in.opt_g, (size_t)OPT_STEPS * OPT_N);
}

static int run_reference(void)
{
    const char *py = getenv("SKYLOOM_PYTHON");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/kn_ref.py %s", py ? py : "/usr/bin/python3",
             SKYLOOM_SOURCE_ROOT, g_dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "reference script failed (%d): %s (is python3-torch installed? make deps)", rc,
           cmd);
    return rc == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */
static void test_embed(void)
{
    float *out = kt_alloc((size_t)N * C), *dwte = kt_alloc((size_t)V * C),
          *dwpe = kt_alloc((size_t)TP * C), *dwse = kt_alloc(2 * C);
    kn_embed_forward(out, in.tok, in.seg, in.wte, in.wpe, in.wse, B, T, C);
    kn_embed_backward(dwte, dwpe, dwse, in.emb_dout, in.tok, in.seg, B, T, C);
    cmp("emb.out", out, (size_t)N * C);
    cmp("emb.dwte", dwte, (size_t)V * C);
    cmp("emb.dwpe", dwpe, (size_t)TP * C);
    cmp("emb.dwse", dwse, 2 * C);
    /* seg NULL is segment 0 everywhere */
    int32_t zeros[N] = {0};
    float *o2 = kt_alloc((size_t)N * C);
    kn_embed_forward(out, in.tok, zeros, in.wte, in.wpe, in.wse, B, T, C);
    kn_embed_forward(o2, in.tok, NULL, in.wte, in.wpe, in.wse, B, T, C);
    CHECK(kt_bitwise_equal(out, o2, (size_t)N * C));
    free(out), free(dwte), free(dwpe), free(dwse), free(o2);
}

static void test_layernorm(void)
{
    float *out = kt_alloc((size_t)N * C), *mean = kt_alloc(N), *rstd = kt_alloc(N);
    float *dx = kt_alloc((size_t)N * C), *dw = kt_alloc(C), *db = kt_alloc(C);
    kn_layernorm_forward(out, mean, rstd, in.ln_x, in.ln_w, in.ln_b, N, C, EPS);
    kn_layernorm_backward(dx, dw, db, in.ln_dout, in.ln_x, in.ln_w, mean, rstd, N, C);
    cmp("ln.out", out, (size_t)N * C);
    cmp("ln.mean", mean, N);
    cmp("ln.rstd", rstd, N);
    cmp("ln.dx", dx, (size_t)N * C);
    cmp("ln.dw", dw, C);
    cmp("ln.db", db, C);
    /* b NULL is a zero bias */
    float *zb = kt_alloc(C), *o2 = kt_alloc((size_t)N * C);
    kn_layernorm_forward(out, mean, rstd, in.ln_x, in.ln_w, zb, N, C, EPS);
    kn_layernorm_forward(o2, mean, rstd, in.ln_x, in.ln_w, NULL, N, C, EPS);
    CHECK(kt_bitwise_equal(out, o2, (size_t)N * C));
    free(zb), free(o2);
    free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
}

static void test_matmul(void)
{
    float *out = kt_alloc((size_t)N * FF), *dx = kt_alloc((size_t)N * C),
          *dw = kt_alloc((size_t)FF * C), *db = kt_alloc(FF);
    kn_matmul_forward(out, in.mm_x, in.mm_w, in.mm_b, N, C, FF);
    kn_matmul_backward(dx, dw, db, in.mm_dout, in.mm_x, in.mm_w, N, C, FF);
    cmp("mm.out", out, (size_t)N * FF);
    cmp("mm.dx", dx, (size_t)N * C);
    cmp("mm.dw", dw, (size_t)FF * C);
    cmp("mm.db", db, FF);
    kn_matmul_forward(out, in.mm_x, in.mm_w, NULL, N, C, FF);
    cmp("mm.out_nb", out, (size_t)N * FF);
    free(out), free(dx), free(dw), free(db);
}

static void test_attention(void)
{
    const char *tags[2] = {"att0", "att1"};
    char name[64];
    for (int k = 0; k < 2; k++) {
        float *out = kt_alloc((size_t)N * C), *att = kt_alloc((size_t)B * NH * T * T),
              *dqkv = kt_alloc((size_t)N * 3 * C);
        kn_attention_forward(out, att, in.qkv, in.valid, B, T, C, NH, in.att_drop[k]);
        kn_attention_backward(dqkv, in.att_dout, in.qkv, att, B, T, C, NH, in.att_drop[k]);
        snprintf(name, sizeof name, "%s.out", tags[k]);
        cmp(name, out, (size_t)N * C);
        snprintf(name, sizeof name, "%s.att", tags[k]);
        cmp(name, att, (size_t)B * NH * T * T);
        snprintf(name, sizeof name, "%s.dqkv", tags[k]);
        cmp(name, dqkv, (size_t)N * 3 * C);
        free(out), free(att), free(dqkv);
    }
}

static void test_gelu(void)
{
    size_t n = (size_t)N * FF;
    float *out = kt_alloc(n), *dx = kt_alloc(n);
    kn_gelu_forward(out, in.ge_x, n, KN_GELU_ERF);
    kn_gelu_backward(dx, in.ge_x, in.ge_dout, n, KN_GELU_ERF);
    cmp("ge.out_erf", out, n);
    cmp("ge.dx_erf", dx, n);
    memset(dx, 0, n * sizeof *dx);
    kn_gelu_forward(out, in.ge_x, n, KN_GELU_TANH);
    kn_gelu_backward(dx, in.ge_x, in.ge_dout, n, KN_GELU_TANH);
    cmp("ge.out_tanh", out, n);
    cmp("ge.dx_tanh", dx, n);
    /* tanh (the pooler's), on the same inputs; its backward reads the output */
    memset(dx, 0, n * sizeof *dx);
    kn_tanh_forward(out, in.ge_x, n);
    kn_tanh_backward(dx, out, in.ge_dout, n);
    cmp("th.out", out, n);
    cmp("th.dx", dx, n);
    free(out), free(dx);
}

static void test_residual(void)
{
    size_t n = (size_t)N * C;
    float *out = kt_alloc(n), *da = kt_alloc(n), *db = kt_alloc(n);
    kn_residual_forward(out, in.res_a, in.res_b, n);
    kn_residual_backward(da, db, in.res_dout, n);
    cmp("res.out", out, n);
    cmp("res.da", da, n);
    cmp("res.db", db, n);
    free(out), free(da), free(db);
}

static void test_dropout(void)
{
    size_t n = (size_t)N * C;
    float *out = kt_alloc(n), *dx = kt_alloc(n);
    kn_dropout_forward(out, in.do_x, B, (size_t)T * C, in.do_drop);
    kn_dropout_backward(dx, in.do_dout, B, (size_t)T * C, in.do_drop);
    cmp("do.out", out, n);
    cmp("do.dx", dx, n);
    /* in place gives the same */
    float *x = kt_alloc(n);
    memcpy(x, in.do_x, n * sizeof *x);
    kn_dropout_forward(x, x, B, (size_t)T * C, in.do_drop);
    CHECK(kt_bitwise_equal(x, out, n));
    free(out), free(dx), free(x);
}

static void test_crossentropy(void)
{
    float *loss = kt_alloc(M), *probs = kt_alloc((size_t)M * V), *dl = kt_alloc((size_t)M * V);
    kn_crossentropy_forward(loss, probs, in.xe_logits, in.xtgt, M, V);
    kn_crossentropy_backward(dl, probs, in.xtgt, M, V, in.xe_scale);
    cmp("xe.loss", loss, M);
    cmp("xe.probs", probs, (size_t)M * V);
    cmp("xe.dlogits", dl, (size_t)M * V);
    CHECK(loss[4] == 0.0f);
    free(loss), free(probs), free(dl);
}

/* Optimizers compare the change of p (p - p0, not p itself, which would hide
 * a wrong update under p's own magnitude) and the moments after 3 steps. */
static void test_optimizers(void)
{
    for (int lamb = 0; lamb < 2; lamb++) {
        float *p = kt_alloc(OPT_N), *m = kt_alloc(OPT_N), *v = kt_alloc(OPT_N);
        memcpy(p, in.opt_p, OPT_N * sizeof *p);
        for (int s = 0; s < OPT_STEPS; s++) {
            float *g = in.opt_g + (size_t)s * OPT_N;
            if (lamb)
                kn_lamb_update(p, g, m, v, OPT_N, OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, s + 1);
            else
                kn_adamw_update(p, g, m, v, OPT_N, OPT_LR, OPT_B1, OPT_B2, OPT_EPS, OPT_WD, s + 1,
                                1.0f, NULL);
        }
        for (int i = 0; i < OPT_N; i++)
            p[i] -= in.opt_p[i];
        cmp(lamb ? "lamb.dp" : "adam.dp", p, OPT_N);
        cmp(lamb ? "lamb.m" : "adam.m", m, OPT_N);
        cmp(lamb ? "lamb.v" : "adam.v", v, OPT_N);
        free(p), free(m), free(v);
    }
}

/* ---- properties without torch ------------------------------------------------------------ */

static void test_residual_sumsq_scale(void)
{
    size_t n = 50001;
    float *a = kt_randn(n, 30, 1.0f), *b = kt_randn(n, 31, 1.0f), *o = kt_alloc(n);
    kn_residual_forward(o, a, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= o[i] == a[i] + b[i];
    CHECK(ok);
    float *da = kt_alloc(n), *db = kt_alloc(n);
    da[7] = 1.0f;
    kn_residual_backward(da, db, b, n);
    CHECK(da[7] == 1.0f + b[7] && da[8] == b[8] && db[9] == b[9]);
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * a[i];
    double got = kn_sumsq(a, n);
    CHECK(fabs(got - s) <= 1e-12 * s);
    kn_scale(a, n, 0.5f);
    CHECK(fabs(kn_sumsq(a, n) - 0.25 * s) <= 1e-12 * s);
    free(a), free(b), free(o), free(da), free(db);
}

/* kn_sgemm (the row-major -> column-major mapping shared with cuBLAS) against
 * a naive triple loop, all four transpose combinations, padded leading dims. */
static void test_sgemm_mapping(void)
{
    enum { GM = 7, GN = 5, GK = 9, PAD = 3 };
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? GM : GK) + PAD, ldb = (tb ? GK : GN) + PAD, ldc = GN + PAD;
            float *A = kt_randn((size_t)(ta ? GK : GM) * lda, 40, 1.0f);
            float *Bm = kt_randn((size_t)(tb ? GN : GK) * ldb, 41, 1.0f);
            float *Cm = kt_randn((size_t)GM * ldc, 42, 1.0f), *R = kt_alloc((size_t)GM * ldc);
            memcpy(R, Cm, (size_t)GM * ldc * sizeof *R);
            for (int i = 0; i < GM; i++)
                for (int j = 0; j < GN; j++) {
                    double acc = 0.0;
                    for (int k = 0; k < GK; k++)
                        acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                               (tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
                    R[i * ldc + j] = (float)(1.5 * acc + 0.5 * R[i * ldc + j]);
                }
            kn_sgemm(ta, tb, GM, GN, GK, 1.5f, A, lda, Bm, ldb, 0.5f, Cm, ldc);
            KT_CHECK_REL(ta ? (tb ? "sgemm TT" : "sgemm TN") : (tb ? "sgemm NT" : "sgemm NN"), Cm,
                         R, (size_t)GM * ldc, 1e-6);
            free(A), free(Bm), free(Cm), free(R);
        }
}

/* Runs `call` once on zeroed gradients g (n floats), keeps 2*g, runs it
 * again without zeroing: the result must be 2*g (every backward is +=). */
#define TWICE(what, g, n, call)                                                                    \
    do {                                                                                           \
        memset((g), 0, (n) * sizeof(float));                                                       \
        call;                                                                                      \
        float *twice_ = kt_alloc(n);                                                               \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++)                                                \
            twice_[i_] = 2 * (g)[i_];                                                              \
        call;                                                                                      \
        KT_CHECK_REL(what, (g), twice_, (n), 1e-6);                                                \
        free(twice_);                                                                              \
    } while (0)

/* Backward accumulates: a second call on the same gradients doubles them. */
static void test_accumulation(void)
{
    size_t nc = (size_t)N * C, nf = (size_t)N * FF;
    float *g = kt_alloc((size_t)V * C + nf + (size_t)M * V);
    float *mean = kt_alloc(N), *rstd = kt_alloc(N), *lo = kt_alloc(nc);
    kn_layernorm_forward(lo, mean, rstd, in.ln_x, in.ln_w, in.ln_b, N, C, EPS);
    TWICE("ln.dx,dw,db twice", g, nc + 2 * C,
          kn_layernorm_backward(g, g + nc, g + nc + C, in.ln_dout, in.ln_x, in.ln_w, mean, rstd, N,
                                C));
    TWICE("emb.dwte twice", g, (size_t)V * C,
          kn_embed_backward(g, NULL, NULL, in.emb_dout, in.tok, in.seg, B, T, C));
    TWICE("gelu.dx twice", g, nf, kn_gelu_backward(g, in.ge_x, in.ge_dout, nf, KN_GELU_ERF));
    TWICE("tanh.dx twice", g, nf, kn_tanh_backward(g, in.ge_x, in.ge_dout, nf));
    TWICE("dropout.dx twice", g, nc,
          kn_dropout_backward(g, in.do_dout, B, (size_t)T * C, in.do_drop));
    TWICE("residual twice", g, 2 * nc, kn_residual_backward(g, g + nc, in.do_dout, nc));
    /* ... except the cross-entropy's, which writes its gradient, so that
     * forward and backward can run in place in the logits (the head does) */
    size_t mv = (size_t)M * V;
    float *probs = kt_alloc(mv), *loss = kt_alloc(M), *ip = kt_alloc(mv), *iloss = kt_alloc(M);
    kn_crossentropy_forward(loss, probs, in.xe_logits, in.xtgt, M, V);
    for (size_t i = 0; i < mv; i++)
        g[i] = 123.0f; /* stale contents are overwritten, not added to */
    kn_crossentropy_backward(g, probs, in.xtgt, M, V, 0.5f);
    memcpy(ip, in.xe_logits, mv * sizeof(float));
    kn_crossentropy_forward(iloss, ip, ip, in.xtgt, M, V);
    CHECK(memcmp(iloss, loss, (size_t)M * sizeof(float)) == 0);
    CHECK(memcmp(ip, probs, mv * sizeof(float)) == 0);
    kn_crossentropy_backward(ip, ip, in.xtgt, M, V, 0.5f);
    CHECK(memcmp(ip, g, mv * sizeof(float)) == 0);
    double gs = 0;
    for (size_t i = 0; i < mv; i++)
        gs += g[i];
    CHECK(fabs(gs) < 1e-3); /* each row of probs - onehot sums to 0 */
    free(g), free(mean), free(rstd), free(lo), free(probs), free(loss), free(ip), free(iloss);

    float *dx = kt_alloc((size_t)N * C), *dw = kt_alloc((size_t)FF * C), *db = kt_alloc(FF);
    float *dx1 = kt_alloc((size_t)N * C), *dw1 = kt_alloc((size_t)FF * C), *db1 = kt_alloc(FF);
    kn_matmul_backward(dx, dw, db, in.mm_dout, in.mm_x, in.mm_w, N, C, FF);
    for (size_t i = 0; i < (size_t)N * C; i++)
        dx1[i] = 2 * dx[i];
    for (size_t i = 0; i < (size_t)FF * C; i++)
        dw1[i] = 2 * dw[i];
    for (int i = 0; i < FF; i++)
        db1[i] = 2 * db[i];
    kn_matmul_backward(dx, dw, db, in.mm_dout, in.mm_x, in.mm_w, N, C, FF);
    KT_CHECK_REL("mm.dx twice", dx, dx1, (size_t)N * C, 1e-6);
    KT_CHECK_REL("mm.dw twice", dw, dw1, (size_t)FF * C, 1e-6);
    KT_CHECK_REL("mm.db twice", db, db1, FF, 1e-6);

    size_t nq = (size_t)N * 3 * C;
    float *att = kt_alloc((size_t)B * NH * T * T), *out = kt_alloc((size_t)N * C);
    float *dq = kt_alloc(nq), *dq2 = kt_alloc(nq);
    kn_attention_forward(out, att, in.qkv, in.valid, B, T, C, NH, in.att_drop[1]);
    kn_attention_backward(dq, in.att_dout, in.qkv, att, B, T, C, NH, in.att_drop[1]);
    for (size_t i = 0; i < nq; i++)
        dq2[i] = 2 * dq[i];
    kn_attention_backward(dq, in.att_dout, in.qkv, att, B, T, C, NH, in.att_drop[1]);
    KT_CHECK_REL("att.dqkv twice", dq, dq2, nq, 1e-6);
    free(dx), free(dw), free(db), free(dx1), free(dw1), free(db1), free(att), free(out), free(dq),
        free(dq2);
}

/* Dropout statistics: keep rate within 5 sigma of 1-p on 2^20 draws, kept
 * values scaled by exactly 1/(1-p); another stream gives another mask. */
static void test_dropout_stats(void)
{
    size_t per = 1u << 18;
    int nb = 4;
    size_t n = per * nb;
    float *x = kt_alloc(n), *y = kt_alloc(n), *z = kt_alloc(n);
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f + (float)(i % 7);
    kn_dropout d = {.p = 0.1f, .seed = 1234, .stream = 9, .seq0 = 11};
    kn_dropout_forward(y, x, nb, per, d);
    size_t kept = 0;
    int scaled_ok = 1;
    for (size_t i = 0; i < n; i++)
        if (y[i] != 0.0f) {
            kept++;
            scaled_ok &= y[i] == x[i] * kn_dropout_scale(d.p);
        }
    double rate = (double)kept / (double)n, sd = sqrt(0.1 * 0.9 / (double)n);
    printf("    keep rate %.5f (expect 0.9 +- %.5f)\n", rate, 5 * sd);
    CHECK(fabs(rate - 0.9) <= 5 * sd);
    CHECK(scaled_ok);
    kn_dropout d2 = d;
    d2.stream = 10;
    kn_dropout_forward(z, x, nb, per, d2);
    CHECK(!kt_bitwise_equal(y, z, n));
    /* p = 0: identity; p = 1: all dropped, no inf/NaN */
    d2.p = 0.0f;
    kn_dropout_forward(z, x, nb, per, d2);
    CHECK(kt_bitwise_equal(z, x, n));
    d2.p = 1.0f;
    kn_dropout_forward(z, x, nb, per, d2);
    CHECK(kn_sumsq(z, n) == 0.0);
    free(x), free(y), free(z);
}

/* The same 4 sequences as 1 micro-batch (seq0 = 8) or as 1 + 3 (seq0 = 8, 9)
 * give bitwise the same dropout, attention output and gradients. */
static void test_split_invariance(void)
{
    enum { SB = 4 };
    size_t per = (size_t)T * C, nq = (size_t)SB * T * 3 * C, na = (size_t)SB * NH * T * T;
    float *x = kt_randn(SB * per, 50, 1.0f), *y1 = kt_alloc(SB * per), *y2 = kt_alloc(SB * per);
    kn_dropout d = {.p = 0.1f, .seed = 5, .stream = 6, .seq0 = 8};
    kn_dropout_forward(y1, x, SB, per, d);
    kn_dropout_forward(y2, x, 1, per, d);
    kn_dropout d1 = d;
    d1.seq0 = 9;
    kn_dropout_forward(y2 + per, x + per, SB - 1, per, d1);
    CHECK(kt_bitwise_equal(y1, y2, SB * per));

    float *qkv = kt_randn(nq, 51, 1.0f), *dout = kt_randn(SB * per, 52, 1.0f);
    int32_t valid[SB * T];
    for (int i = 0; i < SB * T; i++)
        valid[i] = (i % T) < T - (i / T) * 5;
    float *o1 = kt_alloc(SB * per), *o2 = kt_alloc(SB * per), *a1 = kt_alloc(na),
          *a2 = kt_alloc(na), *g1 = kt_alloc(nq), *g2 = kt_alloc(nq);
    kn_attention_forward(o1, a1, qkv, valid, SB, T, C, NH, d);
    kn_attention_backward(g1, dout, qkv, a1, SB, T, C, NH, d);
    size_t q1 = (size_t)T * 3 * C, a1n = (size_t)NH * T * T;
    kn_attention_forward(o2, a2, qkv, valid, 1, T, C, NH, d);
    kn_attention_backward(g2, dout, qkv, a2, 1, T, C, NH, d);
    kn_attention_forward(o2 + per, a2 + a1n, qkv + q1, valid + T, SB - 1, T, C, NH, d1);
    kn_attention_backward(g2 + q1, dout + per, qkv + q1, a2 + a1n, SB - 1, T, C, NH, d1);
    CHECK(kt_bitwise_equal(o1, o2, SB * per));
    CHECK(kt_bitwise_equal(a1, a2, na));
    CHECK(kt_bitwise_equal(g1, g2, nq));
    free(x), free(y1), free(y2), free(qkv), free(dout), free(o1), free(o2), free(a1), free(a2),
        free(g1), free(g2);
}

/* A sequence that is all padding has no key to attend to: its output and
 * gradients are 0, never NaN; the other sequence is unaffected. */
static void test_all_padding(void)
{
    size_t nq = (size_t)N * 3 * C;
    int32_t valid[N];
    make_valid(valid);
    for (int t = 0; t < T; t++)
        valid[T + t] = 0;
    float *out = kt_alloc((size_t)N * C), *att = kt_alloc((size_t)B * NH * T * T),
          *dq = kt_alloc(nq);
    kn_attention_forward(out, att, in.qkv, valid, B, T, C, NH, in.att_drop[1]);
    kn_attention_backward(dq, in.att_dout, in.qkv, att, B, T, C, NH, in.att_drop[1]);
    int finite = 1, zero = 1;
    for (size_t i = 0; i < (size_t)N * C; i++) {
        finite &= isfinite(out[i]);
        if (i >= (size_t)T * C)
            zero &= out[i] == 0.0f;
    }
    for (size_t i = 0; i < nq; i++) {
        finite &= isfinite(dq[i]);
        if (i >= (size_t)T * 3 * C)
            zero &= dq[i] == 0.0f;
    }
    CHECK(finite);
    CHECK(zero);
    free(out), free(att), free(dq);
}

/* Degenerate shapes: no rows, no masked positions, a single token, a single
 * feature. Nothing may crash, print (BLAS's xerbla) or produce NaN. */
static void test_edge_shapes(void)
{
    float w[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 2}, dw[6] = {0}, db[3] = {0};
    float x[2] = {1, 2}, dx[2] = {0}, o[3];
    kn_matmul_forward(o, x, w, b, 0, 2, 3); /* N = 0 */
    kn_matmul_backward(dx, dw, db, o, x, w, 0, 2, 3);
    CHECK(dw[0] == 0.0f && db[2] == 0.0f);
    kn_matmul_forward(o, x, w, b, 1, 0, 3); /* IC = 0: out = bias */
    CHECK(o[0] == 0.5f && o[1] == -1.0f && o[2] == 2.0f);
    kn_matmul_forward(o, x, w, NULL, 1, 0, 3); /* IC = 0, no bias: out = 0 */
    CHECK(o[0] == 0.0f && o[2] == 0.0f);
    kn_matmul_forward(o, x, w, b, 1, 2, 3);
    CHECK(o[0] == 0.5f + 1 * 1 + 2 * 2 && o[2] == 2.0f + 5 * 1 + 6 * 2);

    float loss[1], probs[1], dl[1] = {0};
    int32_t tgt[1] = {0};
    kn_crossentropy_forward(loss, probs, x, tgt, 0, 2); /* M = 0 */
    kn_crossentropy_forward(loss, probs, x, tgt, 1, 1); /* V = 1: loss 0, prob 1 */
    CHECK(loss[0] == 0.0f && probs[0] == 1.0f);
    kn_crossentropy_backward(dl, probs, tgt, 1, 1, 1.0f);
    CHECK(dl[0] == 0.0f);

    /* T = 1: the token attends to itself; out = v */
    float qkv[6] = {0.3f, -0.2f, 1.0f, 2.0f, 5.0f, -7.0f}, out[2], att[2], dq[6] = {0};
    int32_t valid[1] = {1};
    kn_dropout nod = {0};
    kn_attention_forward(out, att, qkv, valid, 1, 1, 2, 2, nod);
    CHECK(out[0] == 5.0f && out[1] == -7.0f && att[0] == 1.0f && att[1] == 1.0f);
    float dout[2] = {1, 1};
    kn_attention_backward(dq, dout, qkv, att, 1, 1, 2, 2, nod);
    CHECK(dq[0] == 0.0f && dq[2] == 0.0f && dq[4] == 1.0f);

    /* C = 1: the normalised value is 0, out = bias, finite */
    float lx[2] = {3, -4}, lo[2], m[2], r[2], lw[1] = {2}, lb[1] = {0.25f};
    kn_layernorm_forward(lo, m, r, lx, lw, lb, 2, 1, 1e-5f);
    CHECK(lo[0] == 0.25f && lo[1] == 0.25f && isfinite(r[0]));
}

/* Reductions (the gradient norm's sum of squares, LAMB's trust ratio) give
 * the same bits for any thread count: a pipeline stage may run with fewer
 * threads than the one-stage trainer it must equal. */
static void test_reductions_thread_independent(void)
{
    size_t n = 5000003;
    float *x = kt_randn(n, 11, 1.0f), *g = kt_randn(n, 12, 1.0f), *p1 = kt_randn(n, 13, 1.0f);
    float *p2 = kt_alloc(n), *m1 = kt_alloc(n), *v1 = kt_alloc(n), *m2 = kt_alloc(n), *v2 = kt_alloc(n);
    memcpy(p2, p1, n * sizeof(float));
    int was = omp_get_max_threads();
    omp_set_num_threads(1);
    double s1 = kn_sumsq(x, n);
    kn_lamb_update(p1, g, m1, v1, n, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, 1);
    omp_set_num_threads(3);
    double s3 = kn_sumsq(x, n);
    kn_lamb_update(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, 1);
    omp_set_num_threads(was);
    CHECKF(s1 == s3, "sumsq: %.17g with 1 thread, %.17g with 3", s1, s3);
    CHECK(kt_bitwise_equal(p1, p2, n));
    free(x); free(p1); free(p2); free(g); free(m1); free(v1); free(m2); free(v2);
}

/* The GEMMs give the same bits for any thread count, outside a parallel
 * region and inside one, on shapes that are not multiples of any kernel's
 * tile (OpenBLAS's own threads round such edges differently on some CPUs):
 * a stage with one thread must compute what a trainer with two does. */
static void test_sgemm_thread_independent(void)
{
    static const int shapes[][3] = {{100, 1000, 64}, {300, 64, 1024}, {37, 513, 129}, {1, 3000, 70}};
    int was = omp_get_max_threads(), bad = 0, cases = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int t = 0; t < 4; t++) {
            int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2], ta = t & 1, tb = t >> 1;
            float *A = kt_randn((size_t)M * K, 21 + sh, 1.0f), *B = kt_randn((size_t)K * N, 31 + sh, 1.0f);
            float *C[4];
            for (int r = 0; r < 4; r++) {
                C[r] = kt_alloc((size_t)M * N);
                omp_set_num_threads(r == 3 ? 2 : r + 1);
                if (r < 3) {
                    kn_sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C[r], N);
                } else { /* inside a parallel region of two, as attention calls it */
#pragma omp parallel num_threads(2)
                    {
#pragma omp single
                        kn_sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C[r], N);
                    }
                }
            }
            omp_set_num_threads(was);
            for (int r = 1; r < 4; r++)
                bad += !kt_bitwise_equal(C[0], C[r], (size_t)M * N);
            cases += 3;
            for (int r = 0; r < 4; r++)
                free(C[r]);
            free(A);
            free(B);
        }
    CHECKF(bad == 0, "%d of %d GEMMs differ from the one-thread result", bad, cases);
}

/* OpenBLAS falls back to Prescott's kernels on a CPU model it does not
 * know; kn_blas.c then runs the process again with the kernels the CPU's
 * instructions call for. A child started without OPENBLAS_CORETYPE, with
 * arguments that a careless re-exec would lose (a space, an empty one),
 * must come back with every argument and, where the CPU has AVX2 and FMA
 * or AVX-512, not on Prescott. */
static void test_blas_core(void)
{
    const char *want = kn_blas_core_for_cpu();
    printf("  OpenBLAS core %s; this CPU's instructions call for %s\n", kn_blas_core(),
           want ? want : "no particular kernels (neither AVX-512 nor AVX2 + FMA)");
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        unsetenv("OPENBLAS_CORETYPE");
        execl("/proc/self/exe", "test_kn_ops", "--blas-core", "a b", "", "c", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char out[256] = {0};
    size_t len = 0;
    ssize_t r;
    while (len < sizeof out - 1 && (r = read(fd[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    close(fd[0]);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char core[64] = "", args[128] = "";
    CHECKF(sscanf(out, "core=%63s args=%127[^\n]", core, args) == 2, "child printed '%s'", out);
    CHECKF(strcmp(args, "[a b][][c]") == 0, "the child's arguments came back as %s", args);
    if (want)
        CHECKF(strcasecmp(core, "prescott") != 0, "OpenBLAS runs Prescott's kernels on a CPU "
               "with %s's instructions", want);
    printf("  a child without OPENBLAS_CORETYPE runs on %s, its arguments intact\n", core);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--blas-core") == 0) { /* test_blas_core's child */
        printf("core=%s args=", kn_blas_core());
        for (int i = 2; i < argc; i++)
            printf("[%s]", argv[i]);
        printf("\n");
        return 0;
    }
    RUN(test_blas_core);
    RUN(test_edge_shapes);
    make_inputs();
    RUN(test_residual_sumsq_scale);
    RUN(test_reductions_thread_independent);
    RUN(test_sgemm_thread_independent);
    RUN(test_sgemm_mapping);
    RUN(test_accumulation);
    RUN(test_dropout_stats);
    RUN(test_split_invariance);
    RUN(test_all_padding);

    snprintf(g_dir, sizeof g_dir, "/tmp/kn_ops_XXXXXX");
    if (!mkdtemp(g_dir)) {
        CHECKF(0, "mkdtemp failed");
        return sl_test_done();
    }
    write_inputs();
    if (run_reference() == 0) {
        RUN(test_embed);
        RUN(test_layernorm);
        RUN(test_matmul);
        RUN(test_attention);
        RUN(test_gelu);
        RUN(test_residual);
        RUN(test_dropout);
        RUN(test_crossentropy);
        RUN(test_optimizers);
    }
    rm_dir();
    free(in.wte), free(in.wpe), free(in.wse), free(in.emb_dout), free(in.ln_x), free(in.ln_w),
        free(in.ln_b), free(in.ln_dout), free(in.mm_x), free(in.mm_w), free(in.mm_b),
        free(in.mm_dout), free(in.qkv), free(in.att_dout), free(in.att_mask[0]),
        free(in.att_mask[1]), free(in.ge_x), free(in.ge_dout), free(in.res_a), free(in.res_b),
        free(in.res_dout), free(in.do_x), free(in.do_dout), free(in.do_mask), free(in.xe_logits),
        free(in.opt_p), free(in.opt_g);
    return sl_test_done();
}
