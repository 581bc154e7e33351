/* bf16 optimizer state (sl_float.h, kn_adamw_update_bf16): conversions,
 * stochastic rounding without bias, and why it is needed: Adam's second
 * moment held in bf16 tracks the fp32 one with stochastic rounding and
 * drifts with rounding to nearest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_body.h"
#include "kn_ops.h"
#include "kn_testutil.h"
#include "kn_threads.h"
#include "sl_float.h"
#include "sl_rng.h"

static void test_conversions(void)
{
    /* exact values survive both roundings */
    const float exact[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, sl_bits_f32(0x7f7f0000u) /* largest */,
                           sl_bits_f32(0x00800000u) /* smallest normal */, sl_bits_f32(0x00010000u)};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        float x = sl_bf16_to_f32(sl_f32_to_bf16(exact[i]));
        CHECKF(!memcmp(&x, &exact[i], 4), "%g -> %g", exact[i], x);
        CHECK(sl_f32_to_bf16_sr(sl_bf16_to_f32(sl_f32_to_bf16(exact[i])), 0xffff) ==
              sl_f32_to_bf16(exact[i]));
    }
    /* nearest, ties to even */
    CHECK(sl_f32_to_bf16(sl_bits_f32(0x3f808000u)) == 0x3f80); /* tie, even below */
    CHECK(sl_f32_to_bf16(sl_bits_f32(0x3f818000u)) == 0x3f82); /* tie, even above */
    CHECK(sl_f32_to_bf16(sl_bits_f32(0x3f808001u)) == 0x3f81);
    /* stochastic: r = 0 truncates, r = 0xffff rounds up anything inexact */
    CHECK(sl_f32_to_bf16_sr(sl_bits_f32(0x3f80ffffu), 0) == 0x3f80);
    CHECK(sl_f32_to_bf16_sr(sl_bits_f32(0x3f800001u), 0xffff) == 0x3f81);
    CHECK(sl_f32_to_bf16_sr(sl_bits_f32(0xbf800001u), 0xffff) == 0xbf81); /* magnitude up */
    /* inf and NaN kept; the largest float does not become inf */
    CHECK(sl_f32_to_bf16_sr(INFINITY, 0xffff) == 0x7f80);
    CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16_sr(NAN, 0))));
    CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(NAN))));
    CHECK(isfinite(sl_bf16_to_f32(sl_f32_to_bf16_sr(3.4e38f, 0xffff))));
}

/* E[sr(x)] = x: the mean of many roundings of one value is the value. */
static void test_unbiased(void)
{
    const float xs[] = {1.0f + 0.3f / 128, -7.77f, 1e-3f * 1.234f};
    for (size_t k = 0; k < 3; k++) {
        float x = xs[k];
        enum { N = 200000 };
        double sum = 0;
        for (int i = 0; i < N; i++)
            sum += sl_bf16_to_f32(sl_f32_to_bf16_sr(x, sl_rng_u32(5, k, (uint64_t)i) & 0xffff));
        double mean = sum / N, ulp = fabs(x) / 128;
        /* one rounding errs by at most an ulp: sd <= ulp/2, of the mean /sqrt(N) */
        double tol = 4 * 0.5 * ulp / sqrt((double)N);
        printf("    sr mean of %-10g: %.9g (error %.2g ulp)\n", x, mean, fabs(mean - x) / ulp);
        CHECKF(fabs(mean - x) <= tol, "%g: mean %.9g", x, mean);
    }
}

/* 3000 AdamW steps on fresh N(0,1) gradients: v held in bf16 with stochastic
 * rounding stays within 2% of fp32's on average; rounded to nearest it does
 * not (small decrements are lost, so it drifts upwards). */
static void test_second_moment(void)
{
    enum { N = 4096, STEPS = 3000 };
    float *p32 = kt_alloc(N), *m32 = kt_alloc(N), *v32 = kt_alloc(N), *pb = kt_alloc(N),
          *g = kt_alloc(N), *pr = kt_alloc(N);
    uint16_t *mb = calloc(N, 2), *vb = calloc(N, 2), *mr = calloc(N, 2), *vr = calloc(N, 2);
    float lr = 1e-4f, b1 = 0.9f, b2 = 0.999f, eps = 1e-6f;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++)
            g[i] = sl_rng_normal(9, (uint64_t)t, (uint64_t)i);
        kn_adamw_update(p32, g, m32, v32, N, lr, b1, b2, eps, 0.0f, t, 1.0f, NULL);
        kn_adamw_update_bf16(pb, g, mb, vb, N, lr, b1, b2, eps, 0.0f, t, (uint64_t)t, 77, 1.0f,
                             NULL);
        float bc1 = (float)(1.0 - pow(b1, t)), sbc2 = (float)sqrt(1.0 - pow(b2, t));
        for (int i = 0; i < N; i++) { /* the same, rounded to nearest */
            float mm = b1 * sl_bf16_to_f32(mr[i]) + (1 - b1) * g[i];
            float vv = b2 * sl_bf16_to_f32(vr[i]) + (1 - b2) * g[i] * g[i];
            mr[i] = sl_f32_to_bf16(mm);
            vr[i] = sl_f32_to_bf16(vv);
            pr[i] -= (lr / bc1) * (mm / (sqrtf(vv) / sbc2 + eps));
        }
    }
    double es = 0, er = 0, v = 0;
    for (int i = 0; i < N; i++) {
        v += v32[i];
        es += sl_bf16_to_f32(vb[i]) - v32[i];
        er += sl_bf16_to_f32(vr[i]) - v32[i];
    }
    printf("    v after %d steps: fp32 mean %.4f, bf16 stochastic %+.2f%%, bf16 nearest %+.2f%%\n",
           STEPS, v / N, 100 * es / v, 100 * er / v);
    CHECKF(fabs(es / v) < 0.02, "stochastic rounding: v off by %.2f%%", 100 * es / v);
    CHECKF(fabs(er / v) > 0.05, "rounding to nearest kept v within 5%%: the test shows nothing");
    KT_CHECK_REL("params, bf16 vs fp32", pb, p32, N, 0.05);
    free(p32), free(m32), free(v32), free(pb), free(g), free(pr), free(mb), free(vb), free(mr),
        free(vr);
}

/* The CPU op draws its words a block at a time; the CUDA kernel's thread
 * body one per element: the same words, the same results. */
static void test_thread_body(void)
{
    enum { N = 70001 };
    float *g = kt_randn(N, 30, 1), *p1 = kt_randn(N, 31, 1), *p2 = kt_randn(N, 31, 1);
    uint16_t *m1 = calloc(N, 2), *v1 = calloc(N, 2), *m2 = calloc(N, 2), *v2 = calloc(N, 2);
    for (int t = 1; t <= 3; t++) {
        kn_adamw_update_bf16(p1, g, m1, v1, N, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t, 11, 12, 1.0f,
                             NULL);
        float bc1 = (float)(1.0 - pow(0.9f, t)), sbc2 = (float)sqrt(1.0 - pow(0.999f, t));
        for (size_t i = 0; i < N; i++)
            kn_t_adamw_bf16(i, p2, g, m2, v2, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, bc1, sbc2, 11, 12,
                            1.0f, NULL);
    }
    CHECK(kt_bitwise_equal(p1, p2, N) && !memcmp(m1, m2, 2 * N) && !memcmp(v1, v2, 2 * N));
    free(g), free(p1), free(p2), free(m1), free(v1), free(m2), free(v2);
}

/* AdamW's one pass (fp32 and bf16 moments): the gradient scaled by the
 * clipping factor and written back, and the updated parameters' bf16 copy,
 * bit for bit what a scaling pass, the update and a conversion pass give. */
static void test_fused_pass(void)
{
    enum { N = 70001 };
    const float clip[] = {0.37f, 1.0f};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int c = 0; c < 2; c++) {
            float *g1 = kt_randn(N, 40, 1), *g2 = kt_randn(N, 40, 1);
            float *p1 = kt_randn(N, 41, 1), *p2 = kt_randn(N, 41, 1);
            float *m1 = kt_randn(N, 42, 0.1f), *m2 = kt_randn(N, 42, 0.1f);
            float *v1 = calloc(N, 4), *v2 = calloc(N, 4);
            uint16_t *w1 = calloc(N, 2), *w2 = calloc(N, 2);
            uint16_t *mb1 = calloc(N, 2), *vb1 = calloc(N, 2), *mb2 = calloc(N, 2),
                     *vb2 = calloc(N, 2);
            for (int t = 1; t <= 3; t++) {
                if (clip[c] != 1.0f)
                    kn_scale(g1, N, clip[c]);
                if (bf16) {
                    kn_adamw_update_bf16(p1, g1, mb1, vb1, N, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t,
                                         5, 6, 1.0f, NULL);
                    kn_adamw_update_bf16(p2, g2, mb2, vb2, N, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t,
                                         5, 6, clip[c], w2);
                } else {
                    kn_adamw_update(p1, g1, m1, v1, N, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t, 1.0f,
                                    NULL);
                    kn_adamw_update(p2, g2, m2, v2, N, 1e-3f, 0.9f, 0.999f, 1e-6f, 0.01f, t,
                                    clip[c], w2);
                }
                kn_to_bf16(w1, p1, N);
            }
            CHECKF(kt_bitwise_equal(p1, p2, N) && kt_bitwise_equal(g1, g2, N) &&
                       !memcmp(w1, w2, 2 * N),
                   "%s moments, clip %g: parameters, gradients or the bf16 copy differ",
                   bf16 ? "bf16" : "fp32", clip[c]);
            CHECKF(bf16 ? !memcmp(mb1, mb2, 2 * N) && !memcmp(vb1, vb2, 2 * N)
                        : kt_bitwise_equal(m1, m2, N) && kt_bitwise_equal(v1, v2, N),
                   "%s moments, clip %g: moments differ", bf16 ? "bf16" : "fp32", clip[c]);
            free(g1), free(g2), free(p1), free(p2), free(m1), free(m2), free(v1), free(v2);
            free(w1), free(w2), free(mb1), free(vb1), free(mb2), free(vb2);
        }
}

int main(void)
{
    RUN(test_conversions);
    RUN(test_unbiased);
    RUN(test_second_moment);
    RUN(test_thread_body);
    RUN(test_fused_pass);
    return sl_test_done();
}
