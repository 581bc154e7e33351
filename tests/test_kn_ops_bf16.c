/* The bf16 CPU ops of kn_ops.h (mixed precision, oneDNN products) against
 * PyTorch, and what torch cannot check: kn_bgemm against a plain loop for
 * every transpose and leading dimension, bits that do not depend on the
 * thread count, accumulation, and the refusal on a CPU without bf16.
 *
 * Two references per output, from tests/ref/kn_ref_bf16.py:
 *   .emu  the op as specified, in float64 from the same bf16 operands and
 *         rounded to bf16 where the op rounds: the error is the op's own
 *         (fp32 accumulation; at a rounding point, rarely, the other side
 *         of a tie). Bars: 1e-5 for fp32 results, 4e-3 (a bf16 half-ulp
 *         of the largest element, 2^-8) for bf16 ones;
 *   .tch  torch's own bf16 ops on the same inputs (what torch.autocast
 *         computes: it also rounds every product's output and gradient and
 *         the bias to bf16, and the attention scores before the softmax).
 *         Bars: 2e-2 (linear, GELU; measured up to 9e-3, torch's rounded
 *         GELU gradient), 4e-2 (attention, where torch's bf16 scores move
 *         the probabilities by up to |s| 2^-9; measured up to 1.4e-2).
 * Metric: kn_testutil.h (max abs error over max |ref|). The measured errors
 * are printed. Shapes as test_kn_ops: hidden 96, 3 heads of 32, T = 37 with
 * the second sequence padded. */
#include <dirent.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kn_backend.h"
#include "kn_body.h"
#include "kn_gemm.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "sl_config.h"
#include "sl_float.h"

enum { B = 2, T = 37, C = 96, NH = 3, FF = 384, N = B * T };
static const int VALID1 = 29;
static const float TOL_F32 = 1e-5f, TOL_BF16 = 4e-3f, TOL_TORCH = 2e-2f, TOL_TORCH_ATT = 4e-2f;

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

static float *ref(const char *name, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
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

/* a (n floats) against NAME.emu within tol_emu and NAME.tch within tol_tch */
static void cmp2(const char *what, const float *a, size_t n, float tol_emu, float tol_tch)
{
    char name[96];
    snprintf(name, sizeof name, "%s.emu", what);
    float *r = ref(name, n);
    KT_CHECK_REL(name, a, r, n, tol_emu);
    free(r);
    snprintf(name, sizeof name, "%s.tch", what);
    r = ref(name, n);
    KT_CHECK_REL(name, a, r, n, tol_tch);
    free(r);
}

static float *widen(const uint16_t *x, size_t n)
{
    float *f = kt_alloc(n);
    for (size_t i = 0; i < n; i++)
        f[i] = sl_bf16_to_f32(x[i]);
    return f;
}

static uint16_t *randn16(size_t n, uint64_t stream, float sd)
{
    float *x = kt_randn(n, stream, sd);
    uint16_t *h = sl_xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = sl_f32_to_bf16(x[i]);
    free(x);
    return h;
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

static void mask_of(float *mask, size_t n, kn_dropout d, uint64_t start)
{
    for (size_t i = 0; i < n; i++)
        mask[i] = kn_dropout_keep(d.seed, d.stream, start + i, d.p) ? kn_dropout_scale(d.p) : 0.0f;
}

static struct {
    float *cv_x;
    uint16_t *mm_x16, *mm_w16, *qkv16, *att_dout16, *ge_x16;
    float *mm_b, *mm_dout, *att_mask[2], *ge_dout;
    int32_t valid[N];
    kn_dropout att_drop[2];
} in;

static void make_inputs(void)
{
    in.cv_x = kt_randn((size_t)N * C, 50, 3.0f);
    /* ties and edges: exactly half-way (rounds to even: down, then up),
     * +-0, +-inf, the largest float (rounds to inf), a subnormal */
    const float edge[] = {1.00390625f, 1.01171875f, 0.0f, -0.0f, INFINITY, -INFINITY,
                          3.4028235e38f, 1e-40f, -1.00390625f, 65536.5f};
    memcpy(in.cv_x, edge, sizeof edge);
    in.mm_x16 = randn16((size_t)N * C, 51, 1.0f);
    in.mm_w16 = randn16((size_t)FF * C, 52, 0.1f);
    in.mm_b = kt_randn(FF, 53, 1.0f);
    in.mm_dout = kt_randn((size_t)N * FF, 54, 1.0f);
    in.qkv16 = randn16((size_t)N * 3 * C, 55, 1.0f);
    in.att_dout16 = randn16((size_t)N * C, 56, 1.0f);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            in.valid[b * T + t] = b == 0 || t < VALID1;
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
    in.ge_x16 = randn16((size_t)N * FF, 57, 2.0f);
    in.ge_dout = kt_randn((size_t)N * FF, 58, 1.0f);
}

static void write_inputs(void)
{
    char dims[256];
    snprintf(dims, sizeof dims, "B %d\nT %d\nC %d\nNH %d\nF %d\nN %d\n", B, T, C, NH, FF, N);
    put_raw("dims.txt", dims, strlen(dims));
    put_raw("cv.x", in.cv_x, (size_t)N * C * 4);
    put_raw("mm.x16", in.mm_x16, (size_t)N * C * 2);
    put_raw("mm.w16", in.mm_w16, (size_t)FF * C * 2);
    put_raw("mm.b", in.mm_b, FF * 4);
    put_raw("mm.dout", in.mm_dout, (size_t)N * FF * 4);
    put_raw("att.qkv16", in.qkv16, (size_t)N * 3 * C * 2);
    put_raw("att.valid", in.valid, N * 4);
    put_raw("att.dout16", in.att_dout16, (size_t)N * C * 2);
    put_raw("att0.mask", in.att_mask[0], (size_t)B * NH * T * T * 4);
    put_raw("att1.mask", in.att_mask[1], (size_t)B * NH * T * T * 4);
    put_raw("ge.x16", in.ge_x16, (size_t)N * FF * 2);
    put_raw("ge.dout", in.ge_dout, (size_t)N * FF * 4);
}

static int run_reference(void)
{
    const char *py = getenv("SKYLOOM_PYTHON");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/kn_ref_bf16.py %s", py ? py : "/usr/bin/python3",
             SKYLOOM_SOURCE_ROOT, g_dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "reference script failed (%d): %s (is python3-torch installed? make deps)", rc,
           cmd);
    return rc == 0 ? 0 : -1;
}

/* ---- against torch ------------------------------------------------------------------- */

/* kn_to_bf16 is torch's .bfloat16() bit for bit (NaN apart: both keep it a
 * NaN, with other payload bits), ties to even and overflow to inf included */
static void test_convert(void)
{
    size_t n = (size_t)N * C;
    uint16_t *h = sl_xmalloc(n * sizeof *h);
    kn_to_bf16(h, in.cv_x, n);
    float *got = widen(h, n), *want = ref("cv.out.tch", n);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += memcmp(&got[i], &want[i], 4) != 0;
    CHECKF(diff == 0, "%zu of %zu values round otherwise than torch", diff, n);
    CHECK(h[0] == 0x3f80 && h[1] == 0x3f82); /* the two ties: to even */
    CHECK(h[6] == 0x7f80);                   /* FLT_MAX rounds to inf */
    float nan = NAN;
    uint16_t hn;
    kn_to_bf16(&hn, &nan, 1);
    CHECK(sl_bf16_to_f32(hn) != sl_bf16_to_f32(hn));
    printf("    %zu values, ties and edges included: all equal to torch's\n", n);
    free(h), free(got), free(want);
}

static void test_matmul(void)
{
    float *out = kt_alloc((size_t)N * FF), *dx = kt_alloc((size_t)N * C),
          *dw = kt_alloc((size_t)FF * C), *db = kt_alloc(FF);
    uint16_t *o16 = sl_xmalloc((size_t)N * FF * 2);
    kn_matmul_forward_bf16(out, NULL, in.mm_x16, in.mm_w16, in.mm_b, N, C, FF);
    kn_matmul_forward_bf16(NULL, o16, in.mm_x16, in.mm_w16, in.mm_b, N, C, FF);
    kn_matmul_backward_bf16(dx, dw, db, in.mm_dout, in.mm_x16, in.mm_w16, N, C, FF);
    sl_err err = {0};
    CHECKF(kn_cpu_status(&err) == 0, "%s", err.msg);
    float *w = widen(o16, (size_t)N * FF);
    cmp2("mm.out", out, (size_t)N * FF, TOL_F32, TOL_TORCH);
    char name[32] = "mm.out16.emu";
    float *r = ref(name, (size_t)N * FF);
    KT_CHECK_REL(name, w, r, (size_t)N * FF, TOL_BF16);
    /* the bf16 output is the fp32 one rounded once */
    int once = 1;
    for (size_t i = 0; i < (size_t)N * FF; i++)
        once &= o16[i] == sl_f32_to_bf16(out[i]);
    CHECK(once);
    cmp2("mm.dx", dx, (size_t)N * C, TOL_F32, TOL_TORCH);
    cmp2("mm.dw", dw, (size_t)FF * C, TOL_F32, TOL_TORCH);
    cmp2("mm.db", db, FF, TOL_F32, TOL_TORCH);
    free(out), free(dx), free(dw), free(db), free(o16), free(w), free(r);
}

static void test_attention(void)
{
    const char *tags[2] = {"att0", "att1"};
    char name[64];
    size_t natt = (size_t)B * NH * T * T;
    for (int k = 0; k < 2; k++) {
        uint16_t *o16 = sl_xmalloc((size_t)N * C * 2), *a16 = sl_xmalloc(natt * 2);
        float *dqkv = kt_alloc((size_t)N * 3 * C);
        kn_attention_forward_bf16(o16, a16, in.qkv16, in.valid, B, T, C, NH, in.att_drop[k]);
        kn_attention_backward_bf16(dqkv, in.att_dout16, in.qkv16, a16, B, T, C, NH,
                                   in.att_drop[k]);
        sl_err err = {0};
        CHECKF(kn_cpu_status(&err) == 0, "%s", err.msg);
        float *out = widen(o16, (size_t)N * C), *att = widen(a16, natt);
        snprintf(name, sizeof name, "%s.out", tags[k]);
        cmp2(name, out, (size_t)N * C, 2 * TOL_BF16, TOL_TORCH_ATT);
        snprintf(name, sizeof name, "%s.att", tags[k]);
        cmp2(name, att, natt, TOL_BF16, TOL_TORCH_ATT);
        snprintf(name, sizeof name, "%s.dqkv", tags[k]);
        cmp2(name, dqkv, (size_t)N * 3 * C, 2e-3f, TOL_TORCH_ATT);
        /* padding keys get probability 0 exactly */
        int zero = 1;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++)
                for (int j = VALID1; j < T; j++)
                    zero &= a16[(((size_t)1 * NH + h) * T + i) * T + j] == 0;
        CHECK(zero);
        free(o16), free(a16), free(dqkv), free(out), free(att);
    }
}

static void test_gelu(void)
{
    size_t n = (size_t)N * FF;
    const char *kinds[2] = {"erf", "tanh"};
    for (int kind = 0; kind < 2; kind++) {
        uint16_t *o16 = sl_xmalloc(n * 2), *again = sl_xmalloc(n * 2);
        float *dx = kt_alloc(n), *dx2 = kt_alloc(n);
        kn_gelu_forward_bf16(o16, in.ge_x16, n, kind);
        kn_gelu_backward_bf16(dx, again, in.ge_x16, in.ge_dout, n, kind);
        kn_gelu_backward_bf16(dx2, NULL, in.ge_x16, in.ge_dout, n, kind);
        float *out = widen(o16, n);
        char name[32];
        snprintf(name, sizeof name, "ge.out_%s", kinds[kind]);
        cmp2(name, out, n, TOL_BF16, TOL_TORCH);
        snprintf(name, sizeof name, "ge.dx_%s", kinds[kind]);
        cmp2(name, dx, n, 1e-4f, TOL_TORCH);
        /* the backward's recomputed value is the forward's, bit for bit,
         * and asking for it changes nothing else */
        CHECK(memcmp(o16, again, n * 2) == 0);
        CHECK(kt_bitwise_equal(dx, dx2, n));
        free(o16), free(again), free(dx), free(dx2), free(out);
    }
}

/* ---- without torch --------------------------------------------------------------------- */

/* C = alpha op(A) op(B) (+ bias) (+ C) in double from the bf16 values. */
static void naive(int ta, int tb, int M, int Nn, int K, float alpha, const uint16_t *A, int lda,
                  const uint16_t *Bm, int ldb, const float *bias, int acc, const float *C0,
                  double *R, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nn; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)sl_bf16_to_f32(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     sl_bf16_to_f32(tb ? Bm[(size_t)j * ldb + k] : Bm[(size_t)k * ldb + j]);
            s = alpha * s + (bias ? bias[j] : 0.0) + (acc ? C0[(size_t)i * ldc + j] : 0.0);
            R[(size_t)i * ldc + j] = s;
        }
}

/* kn_bgemm against the loop: both transposes, padded leading dimensions,
 * fp32 output (with accumulation and a scale) and bf16 (with a bias); small
 * products (one call) and large ones (row panels, column panels, narrow
 * panels) */
static void test_bgemm_mapping(void)
{
    const int shapes[][3] = {{7, 5, 9}, {37, 40, 33}, {600, 72, 64}, {40, 700, 160}, {96, 300, 2400}};
    const int PAD = 3;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int mode = 0; mode < 2; mode++) {
                    int M = shapes[sh][0], Nn = shapes[sh][1], K = shapes[sh][2];
                    int lda = (ta ? M : K) + PAD, ldb = (tb ? K : Nn) + PAD, ldc = Nn + PAD;
                    uint16_t *A = randn16((size_t)(ta ? K : M) * lda, 60, 1.0f);
                    uint16_t *Bm = randn16((size_t)(tb ? Nn : K) * ldb, 61, 1.0f);
                    float *bias = kt_randn((size_t)Nn, 62, 1.0f);
                    float *Cf = kt_randn((size_t)M * ldc, 63, 1.0f);
                    uint16_t *C16 = sl_xcalloc((size_t)M * ldc, 2);
                    double *R = sl_xcalloc((size_t)M * ldc, sizeof *R);
                    float alpha = mode ? 1.0f : 0.375f;
                    int rc;
                    if (mode == 0) { /* fp32, accumulate, scaled */
                        naive(ta, tb, M, Nn, K, alpha, A, lda, Bm, ldb, NULL, 1, Cf, R, ldc);
                        rc = kn_bgemm(ta, tb, M, Nn, K, alpha, A, lda, Bm, ldb, NULL, 1, Cf, ldc, 0);
                    } else { /* bf16 with a bias */
                        naive(ta, tb, M, Nn, K, 1.0f, A, lda, Bm, ldb, bias, 0, NULL, R, ldc);
                        rc = kn_bgemm(ta, tb, M, Nn, K, 1.0f, A, lda, Bm, ldb, bias, 0, C16, ldc, 1);
                    }
                    CHECKF(rc == 0, "kn_bgemm %dx%dx%d failed", M, Nn, K);
                    double emax = 0, rmax = 0;
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < Nn; j++) {
                            size_t at = (size_t)i * ldc + j;
                            double got = mode ? sl_bf16_to_f32(C16[at]) : Cf[at];
                            emax = fmax(emax, fabs(got - R[at]));
                            rmax = fmax(rmax, fabs(R[at]));
                        }
                    double rel = emax / rmax, tol = mode ? TOL_BF16 : TOL_F32;
                    CHECKF(rel <= tol, "%dx%dx%d ta=%d tb=%d %s: rel %.3g > %g", M, Nn, K, ta, tb,
                           mode ? "bf16" : "fp32", rel, tol);
                    /* the padding between rows is never written */
                    int pad_ok = 1;
                    for (int i = 0; i < M; i++)
                        for (int j = Nn; j < ldc; j++)
                            pad_ok &= mode ? C16[(size_t)i * ldc + j] == 0 : 1;
                    CHECK(pad_ok);
                    free(A), free(Bm), free(bias), free(Cf), free(C16), free(R);
                }
    printf("    %zu shapes x 4 transposes x {fp32 += alpha AB, bf16 AB + bias}: within bars\n",
           sizeof shapes / sizeof shapes[0]);
}

/* The same products and ops with 1 and with 2 threads: the same bits (a
 * pipeline stage with fewer threads must compute what one stage does). */
static void test_thread_independent(void)
{
    const int shapes[][5] = {
        {1024, 1024, 256, 0, 1}, /* row panels (a forward) */
        {256, 1024, 1024, 1, 0}, /* a weight gradient: transposed A made dense */
        {154, 8192, 256, 0, 1},  /* column panels (a decoder) */
        {154, 256, 8192, 0, 0},  /* narrow: half-width column panels */
    };
    int was = omp_get_max_threads();
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int M = shapes[sh][0], Nn = shapes[sh][1], K = shapes[sh][2], ta = shapes[sh][3],
            tb = shapes[sh][4];
        int lda = ta ? M : K, ldb = tb ? K : Nn;
        uint16_t *A = randn16((size_t)M * K, 70, 1.0f), *Bm = randn16((size_t)K * Nn, 71, 1.0f);
        float *c[2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            c[t] = kt_randn((size_t)M * Nn, 72, 1.0f);
            CHECK(kn_bgemm(ta, tb, M, Nn, K, 1.0f, A, lda, Bm, ldb, NULL, 1, c[t], Nn, 0) == 0);
        }
        CHECKF(kt_bitwise_equal(c[0], c[1], (size_t)M * Nn), "%dx%dx%d: 1 and 2 threads differ",
               M, Nn, K);
        free(A), free(Bm), free(c[0]), free(c[1]);
    }
    /* the ops of a layer, attention with dropout included */
    size_t natt = (size_t)B * NH * T * T;
    uint16_t *o[2], *a[2];
    float *dq[2], *dx[2], *dw[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        o[t] = sl_xmalloc((size_t)N * C * 2), a[t] = sl_xmalloc(natt * 2);
        dq[t] = kt_alloc((size_t)N * 3 * C), dx[t] = kt_alloc((size_t)N * C),
        dw[t] = kt_alloc((size_t)FF * C);
        kn_attention_forward_bf16(o[t], a[t], in.qkv16, in.valid, B, T, C, NH, in.att_drop[1]);
        kn_attention_backward_bf16(dq[t], in.att_dout16, in.qkv16, a[t], B, T, C, NH,
                                   in.att_drop[1]);
        kn_matmul_backward_bf16(dx[t], dw[t], NULL, in.mm_dout, in.mm_x16, in.mm_w16, N, C, FF);
    }
    omp_set_num_threads(was);
    CHECK(memcmp(o[0], o[1], (size_t)N * C * 2) == 0 && memcmp(a[0], a[1], natt * 2) == 0);
    CHECK(kt_bitwise_equal(dq[0], dq[1], (size_t)N * 3 * C));
    CHECK(kt_bitwise_equal(dx[0], dx[1], (size_t)N * C));
    CHECK(kt_bitwise_equal(dw[0], dw[1], (size_t)FF * C));
    for (int t = 0; t < 2; t++)
        free(o[t]), free(a[t]), free(dq[t]), free(dx[t]), free(dw[t]);
}

/* Backwards add to what their outputs hold (kn_ops.h): from a non-zero
 * start, the result minus the start is the result from zero. */
static void test_accumulation(void)
{
    size_t nx = (size_t)N * C, nw = (size_t)FF * C, nq = (size_t)N * 3 * C;
    float *x0 = kt_randn(nx, 80, 1.0f), *w0 = kt_randn(nw, 81, 1.0f), *b0 = kt_randn(FF, 82, 1.0f);
    float *q0 = kt_randn(nq, 83, 1.0f);
    float *x = kt_alloc(nx), *w = kt_alloc(nw), *b = kt_alloc(FF), *q = kt_alloc(nq);
    float *xs = kt_alloc(nx), *ws = kt_alloc(nw), *bs = kt_alloc(FF), *qs = kt_alloc(nq);
    memcpy(xs, x0, nx * 4), memcpy(ws, w0, nw * 4), memcpy(bs, b0, FF * 4), memcpy(qs, q0, nq * 4);
    kn_matmul_backward_bf16(x, w, b, in.mm_dout, in.mm_x16, in.mm_w16, N, C, FF);
    kn_matmul_backward_bf16(xs, ws, bs, in.mm_dout, in.mm_x16, in.mm_w16, N, C, FF);
    uint16_t *a16 = sl_xmalloc((size_t)B * NH * T * T * 2), *o16 = sl_xmalloc(nx * 2);
    kn_attention_forward_bf16(o16, a16, in.qkv16, in.valid, B, T, C, NH, in.att_drop[1]);
    kn_attention_backward_bf16(q, in.att_dout16, in.qkv16, a16, B, T, C, NH, in.att_drop[1]);
    kn_attention_backward_bf16(qs, in.att_dout16, in.qkv16, a16, B, T, C, NH, in.att_drop[1]);
    size_t ng = (size_t)N * FF;
    float *g = kt_alloc(ng), *gs = kt_randn(ng, 84, 1.0f), *g0 = kt_alloc(ng);
    memcpy(g0, gs, ng * 4);
    kn_gelu_backward_bf16(g, NULL, in.ge_x16, in.ge_dout, ng, KN_GELU_ERF);
    kn_gelu_backward_bf16(gs, NULL, in.ge_x16, in.ge_dout, ng, KN_GELU_ERF);
    for (size_t i = 0; i < nx; i++)
        xs[i] -= x0[i];
    for (size_t i = 0; i < nw; i++)
        ws[i] -= w0[i];
    for (int i = 0; i < FF; i++)
        bs[i] -= b0[i];
    for (size_t i = 0; i < nq; i++)
        qs[i] -= q0[i];
    for (size_t i = 0; i < ng; i++)
        gs[i] -= g0[i];
    KT_CHECK_REL("matmul dx +=", xs, x, nx, 1e-5);
    KT_CHECK_REL("matmul dw +=", ws, w, nw, 1e-5);
    KT_CHECK_REL("matmul db +=", bs, b, FF, 1e-5);
    KT_CHECK_REL("attention dqkv +=", qs, q, nq, 1e-5);
    KT_CHECK_REL("gelu dx +=", gs, g, ng, 1e-5);
    free(x0), free(w0), free(b0), free(q0), free(x), free(w), free(b), free(q), free(xs), free(ws);
    free(bs), free(qs), free(a16), free(o16), free(g), free(gs), free(g0);
}

/* LayerNorm with its output rounded too: the fp32 op's bits, and the
 * rounding kn_to_bf16 would make of them. */
static void test_layernorm_bf16(void)
{
    size_t n = (size_t)N * C;
    float *x = kt_randn(n, 90, 2), *w = kt_randn(C, 91, 1), *b = kt_randn(C, 92, 1);
    float *o1 = kt_alloc(n), *o2 = kt_alloc(n), *st1 = kt_alloc(2 * N), *st2 = kt_alloc(2 * N);
    uint16_t *h1 = sl_xmalloc(n * 2), *h2 = sl_xmalloc(n * 2);
    kn_layernorm_forward(o1, st1, st1 + N, x, w, b, N, C, 1e-12f);
    kn_to_bf16(h1, o1, n);
    kn_layernorm_forward_bf16(o2, h2, st2, st2 + N, x, w, b, N, C, 1e-12f);
    CHECK(kt_bitwise_equal(o1, o2, n) && kt_bitwise_equal(st1, st2, 2 * N));
    CHECK(memcmp(h1, h2, n * 2) == 0);
    free(x), free(w), free(b), free(o1), free(o2), free(st1), free(st2), free(h1), free(h2);
}

/* Degenerate shapes: nothing to multiply writes the bias (or keeps C). */
static void test_edge_shapes(void)
{
    float bias[3] = {1.5f, -2.0f, 0.25f}, c[6] = {1, 2, 3, 4, 5, 6};
    uint16_t c16[6] = {0};
    CHECK(kn_bgemm(0, 1, 2, 3, 0, 1.0f, NULL, 1, NULL, 1, bias, 0, c16, 3, 1) == 0);
    CHECK(sl_bf16_to_f32(c16[0]) == 1.5f && sl_bf16_to_f32(c16[4]) == -2.0f);
    CHECK(kn_bgemm(0, 1, 2, 3, 0, 1.0f, NULL, 1, NULL, 1, NULL, 1, c, 3, 0) == 0);
    CHECK(c[0] == 1 && c[5] == 6);
    CHECK(kn_bgemm(0, 1, 0, 3, 4, 1.0f, NULL, 4, NULL, 4, NULL, 0, c, 3, 0) == 0);
    CHECK(kn_bgemm(0, 1, 2, 0, 4, 1.0f, NULL, 4, NULL, 4, NULL, 0, c, 3, 0) == 0);
    /* the ops: no rows, no inputs (IC = 0: the bias alone), no outputs */
    float out[6] = {9, 9, 9, 9, 9, 9}, dw[6] = {0}, db[3] = {0}, dout[6] = {1, 2, 3, 4, 5, 6};
    uint16_t o16[6] = {0}, x16[1] = {0};
    kn_matmul_forward_bf16(out, NULL, x16, x16, bias, 0, 4, 3);
    CHECK(out[0] == 9);
    kn_matmul_forward_bf16(out, NULL, x16, x16, bias, 2, 0, 3);
    CHECK(out[0] == 1.5f && out[5] == 0.25f);
    kn_matmul_forward_bf16(NULL, o16, x16, x16, bias, 2, 0, 3);
    CHECK(sl_bf16_to_f32(o16[1]) == -2.0f);
    kn_matmul_backward_bf16(NULL, dw, db, dout, x16, x16, 2, 0, 3);
    CHECK(db[0] == 5 && db[2] == 9 && dw[0] == 0);
    kn_matmul_backward_bf16(out, dw, db, dout, x16, x16, 0, 2, 3);
    CHECK(db[0] == 5);
    kn_to_bf16(o16, out, 0);
    kn_gelu_forward_bf16(o16, x16, 0, KN_GELU_ERF);
    kn_gelu_backward_bf16(out, o16, x16, out, 0, KN_GELU_ERF);
    kn_attention_forward_bf16(o16, o16, x16, NULL, 0, 4, 6, 2, in.att_drop[1]);
    kn_attention_backward_bf16(out, x16, x16, o16, 0, 4, 6, 2, in.att_drop[1]);
    sl_err err = {0};
    CHECKF(kn_cpu_status(&err) == 0, "%s", err.msg);
}

/* A CPU whose oneDNN lacks bf16 kernels is refused with the instruction set
 * named: the check runs in a child limited by DNNL_MAX_CPU_ISA (oneDNN reads
 * it once, at its first use) to AVX512_CORE, which has no bf16. */
static void test_refusal(void)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE", 1);
        execl("/proc/self/exe", "test_kn_ops_bf16", "--bf16-check", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char out[1024] = "";
    size_t len = 0;
    ssize_t r;
    while (len < sizeof out - 1 && (r = read(fd[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    close(fd[0]);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
    CHECKF(WEXITSTATUS(st) == 1, "the limited child's check returned %d: %s", WEXITSTATUS(st), out);
    CHECKF(strstr(out, "AVX512_BF16") && strstr(out, "AMX"), "the refusal does not name the "
           "instruction sets: %s", out);
    printf("    refused: %s", out);
}

int main(int argc, char **argv)
{
    sl_err err = {0};
    if (argc > 1 && !strcmp(argv[1], "--bf16-check")) { /* test_refusal's child */
        int rc = kn_cpu_bf16_check(&err);
        printf("%s\n", rc ? err.msg : "bf16 accepted");
        return rc ? 1 : 0;
    }
    RUN(test_refusal);
    if (kn_cpu_bf16_check(&err)) {
        printf("SKIP the bf16 ops: %s\n", err.msg);
        int failed = sl_test_done();
        return failed ? failed : 77;
    }
    printf("oneDNN %s, instruction set %s\n", kn_dnnl_version(), kn_dnnl_isa());
    make_inputs();
    RUN(test_edge_shapes);
    RUN(test_layernorm_bf16);
    RUN(test_bgemm_mapping);
    RUN(test_thread_independent);
    RUN(test_accumulation);
    snprintf(g_dir, sizeof g_dir, "/tmp/kn_bf16_XXXXXX");
    if (!mkdtemp(g_dir)) {
        CHECKF(0, "mkdtemp failed");
        return sl_test_done();
    }
    write_inputs();
    if (run_reference() == 0) {
        RUN(test_convert);
        RUN(test_matmul);
        RUN(test_attention);
        RUN(test_gelu);
    }
    rm_dir();
    free(in.cv_x), free(in.mm_x16), free(in.mm_w16), free(in.mm_b), free(in.mm_dout);
    free(in.qkv16), free(in.att_dout16), free(in.att_mask[0]), free(in.att_mask[1]);
    free(in.ge_x16), free(in.ge_dout);
    return sl_test_done();
}
