/* dev_codec.c - the frame codecs on the CPU (layouts in dev_codec.h). */
#include "dev_codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec_hd.h"
#include "sl_mem.h"

static const char *const codec_names[DEV_CODEC_COUNT] = {"none", "fp16", "bf16", "int8", "topk"};

const char *dev_codec_name(int codec)
{
    return codec >= 0 && codec < DEV_CODEC_COUNT ? codec_names[codec] : "?";
}

int dev_codec_parse(const char *s)
{
    for (int c = 0; c < DEV_CODEC_COUNT; c++)
        if (s && strcmp(s, codec_names[c]) == 0)
            return c;
    return -1;
}

size_t dev_topk_k(size_t n, double ratio)
{
    if (n == 0)
        return 0;
    if (!(ratio > 0.0))
        return 1;
    double k = ceil((double)n * ratio);
    if (k >= (double)n)
        return n;
    return k < 1.0 ? 1 : (size_t)k;
}

int dev_codec_payload_len(int codec, size_t n, size_t cols, size_t k, size_t *len, sl_err *err)
{
    size_t a, b;
    if (n == 0 || cols == 0 || n % cols != 0)
        return sl_err_set(err, SL_EINVAL, "codec: %zu elements do not form rows of %zu", n, cols);
    switch (codec) {
    case DEV_CODEC_NONE:
        if (!sl_mul_ok(n, 4, len))
            break;
        return 0;
    case DEV_CODEC_FP16:
    case DEV_CODEC_BF16:
        if (!sl_mul_ok(n, 2, len))
            break;
        return 0;
    case DEV_CODEC_INT8:
        if (!sl_mul_ok(n / cols, 4, &a) || !sl_add_ok(a, n, len))
            break;
        return 0;
    case DEV_CODEC_TOPK:
        if (k == 0 || k > n)
            return sl_err_set(err, SL_EINVAL, "codec topk: k = %zu for %zu elements", k, n);
        if (!sl_mul_ok(k, 8, &b))
            break;
        *len = b;
        return 0;
    default:
        return sl_err_set(err, SL_EINVAL, "codec: unknown codec %d", codec);
    }
    return sl_err_set(err, SL_EINVAL, "codec %s: payload size of %zu elements overflows",
                      dev_codec_name(codec), n);
}

int dev_topk_ef_init(dev_topk_ef *ef, size_t n, sl_err *err)
{
    size_t bytes;
    ef->residual = NULL;
    ef->n = 0;
    if (n == 0 || !sl_mul_ok(n, sizeof(float), &bytes))
        return sl_err_set(err, SL_EINVAL, "topk error feedback: bad size %zu", n);
    ef->residual = sl_try_malloc(bytes);
    if (!ef->residual)
        return sl_err_set(err, SL_ENOMEM, "topk error feedback: out of memory for %zu floats", n);
    memset(ef->residual, 0, bytes);
    ef->n = n;
    return 0;
}

void dev_topk_ef_reset(dev_topk_ef *ef)
{
    if (ef->residual)
        memset(ef->residual, 0, ef->n * sizeof(float));
}

void dev_topk_ef_free(dev_topk_ef *ef)
{
    free(ef->residual);
    ef->residual = NULL;
    ef->n = 0;
}

/* int8: one row of cols values -> scale + cols bytes. */
static int encode_int8(const float *x, size_t n, size_t cols, uint8_t *out, sl_err *err)
{
    size_t rows = n / cols;
    uint8_t *q = out + 4 * rows;
    for (size_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        float amax = 0.0f;
        int bad = 0;
        for (size_t j = 0; j < cols; j++) {
            float a = fabsf(row[j]);
            bad |= !(a <= 3.402823466e+38f); /* NaN or inf */
            amax = a > amax ? a : amax;
        }
        if (bad)
            return sl_err_set(err, SL_EINVAL, "codec int8: non-finite value in row %zu", r);
        float scale = dev_q8_scale(amax);
        dev_st32(out + 4 * r, sl_f32_bits(scale));
        for (size_t j = 0; j < cols; j++)
            q[r * cols + j] = (uint8_t)dev_q8(row[j], scale);
    }
    return 0;
}

static int decode_int8(const uint8_t *in, size_t n, size_t cols, float *y, sl_err *err)
{
    size_t rows = n / cols;
    const uint8_t *q = in + 4 * rows;
    for (size_t r = 0; r < rows; r++) {
        float scale = sl_bits_f32(dev_ld32(in + 4 * r));
        if (!(scale >= 0.0f && scale <= 3.402823466e+38f))
            return sl_err_set(err, SL_ECORRUPT, "codec int8: row %zu has scale %g", r,
                              (double)scale);
        int bad = 0;
        for (size_t j = 0; j < cols; j++) {
            uint8_t b = q[r * cols + j];
            bad |= b == 0x80;
            y[r * cols + j] = dev_dq8((int8_t)b, scale);
        }
        if (bad)
            return sl_err_set(err, SL_ECORRUPT, "codec int8: row %zu holds -128", r);
    }
    return 0;
}

/* The k largest magnitudes of src by radix select on the magnitude bits
 * (non-negative floats order like their bit patterns): three histogram passes
 * of 11, 10 and 10 bits fix the k-th largest magnitude exactly, a last pass
 * writes every index above it and the lowest-indexed ties at it. */
static int encode_topk(const float *x, size_t n, size_t k, float *residual, uint8_t *out,
                       sl_err *err)
{
    const float *src = residual ? residual : x;
    static const int shift[3] = {20, 10, 0};
    static const uint32_t width[3] = {0x7ffu, 0x3ffu, 0x3ffu};
    uint32_t hist[2048];
    uint32_t prefix = 0, mask = 0;
    size_t need = k;
    for (int p = 0; p < 3; p++) {
        memset(hist, 0, sizeof(hist));
        if (p == 0 && residual) { /* error feedback: residual += x, in the first pass */
            for (size_t i = 0; i < n; i++) {
                residual[i] += x[i];
                hist[(sl_f32_bits(residual[i]) & 0x7fffffffu) >> 20]++;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                uint32_t u = sl_f32_bits(src[i]) & 0x7fffffffu;
                if ((u & mask) == prefix)
                    hist[(u >> shift[p]) & width[p]]++;
            }
        }
        if (p == 0 && (hist[0x7f8] | hist[0x7f9] | hist[0x7fa] | hist[0x7fb] | hist[0x7fc] |
                       hist[0x7fd] | hist[0x7fe] | hist[0x7ff])) {
            if (residual) /* it holds the non-finite sum now: start over */
                memset(residual, 0, n * sizeof(float));
            return sl_err_set(err, SL_EINVAL, "codec topk: non-finite value%s",
                              residual ? " (error feedback reset)" : "");
        }
        uint32_t b = width[p];
        size_t above = 0;
        while (above + hist[b] < need) {
            above += hist[b];
            b--; /* need <= count of candidates, so b never wraps */
        }
        need -= above;
        prefix |= b << shift[p];
        mask |= width[p] << shift[p];
    }
    uint32_t thr = prefix;
    uint8_t *vals = out + 4 * k;
    size_t j = 0;
    for (size_t i = 0; i < n && j < k; i++) {
        uint32_t u = sl_f32_bits(src[i]) & 0x7fffffffu;
        int take = u > thr;
        if (u == thr && need > 0) {
            need--;
            take = 1;
        }
        if (take) {
            dev_st32(out + 4 * j, (uint32_t)i);
            dev_st32(vals + 4 * j, sl_f32_bits(src[i]));
            j++;
            if (residual)
                residual[i] = 0.0f;
        }
    }
    return 0;
}

static int decode_topk(const uint8_t *in, size_t n, size_t k, float *y, sl_err *err)
{
    const uint8_t *vals = in + 4 * k;
    memset(y, 0, n * sizeof(float));
    uint32_t prev = 0;
    for (size_t j = 0; j < k; j++) {
        uint32_t idx = dev_ld32(in + 4 * j);
        if (idx >= n || (j > 0 && idx <= prev))
            return sl_err_set(err, SL_ECORRUPT,
                              "codec topk: entry %zu has index %u (previous %u, %zu elements)", j,
                              idx, prev, n);
        float v = sl_bits_f32(dev_ld32(vals + 4 * j));
        if (!(fabsf(v) <= 3.402823466e+38f))
            return sl_err_set(err, SL_ECORRUPT, "codec topk: entry %zu is not finite", j);
        y[idx] = v;
        prev = idx;
    }
    return 0;
}

int dev_codec_encode(int codec, const float *x, size_t n, size_t cols, size_t k, dev_topk_ef *ef,
                     uint8_t *out, sl_err *err)
{
    size_t len;
    if (dev_codec_payload_len(codec, n, cols, k, &len, err) < 0)
        return -1;
    switch (codec) {
    case DEV_CODEC_NONE:
        for (size_t i = 0; i < n; i++)
            dev_st32(out + 4 * i, sl_f32_bits(x[i]));
        return 0;
    case DEV_CODEC_FP16:
        for (size_t i = 0; i < n; i++)
            dev_st16(out + 2 * i, dev_f32_to_f16(x[i]));
        return 0;
    case DEV_CODEC_BF16:
        for (size_t i = 0; i < n; i++)
            dev_st16(out + 2 * i, sl_f32_to_bf16(x[i]));
        return 0;
    case DEV_CODEC_INT8:
        return encode_int8(x, n, cols, out, err);
    case DEV_CODEC_TOPK:
        if (!ef)
            return encode_topk(x, n, k, NULL, out, err);
        if (ef->n != n || !ef->residual)
            return sl_err_set(err, SL_EINVAL,
                              "codec topk: error feedback holds %zu values, tensor has %zu", ef->n,
                              n);
        return encode_topk(x, n, k, ef->residual, out, err);
    }
    return sl_err_set(err, SL_EINVAL, "codec: unknown codec %d", codec);
}

int dev_codec_decode(int codec, const uint8_t *in, size_t n, size_t cols, size_t k, float *y,
                     sl_err *err)
{
    size_t len;
    if (dev_codec_payload_len(codec, n, cols, k, &len, err) < 0)
        return -1;
    switch (codec) {
    case DEV_CODEC_NONE:
        for (size_t i = 0; i < n; i++)
            y[i] = sl_bits_f32(dev_ld32(in + 4 * i));
        return 0;
    case DEV_CODEC_FP16:
        for (size_t i = 0; i < n; i++)
            y[i] = dev_f16_to_f32(dev_ld16(in + 2 * i));
        return 0;
    case DEV_CODEC_BF16:
        for (size_t i = 0; i < n; i++)
            y[i] = sl_bf16_to_f32(dev_ld16(in + 2 * i));
        return 0;
    case DEV_CODEC_INT8:
        return decode_int8(in, n, cols, y, err);
    case DEV_CODEC_TOPK:
        return decode_topk(in, n, k, y, err);
    }
    return sl_err_set(err, SL_EINVAL, "codec: unknown codec %d", codec);
}
