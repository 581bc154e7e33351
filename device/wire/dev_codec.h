/* dev_codec.h - tensor compression for frames.
 *
 * A tensor is n f32 values, row-major, rows of `cols` (its last dimension).
 * Payload layouts (little-endian):
 *
 *   none  n x f32                                   4n bytes
 *   fp16  n x binary16                              2n bytes
 *   bf16  n x bfloat16                              2n bytes
 *   int8  rows x f32 scale, then n x int8           4*rows + n bytes
 *   topk  k x u32 index (strictly increasing),
 *         then k x f32 value                        8k bytes
 *
 * topk is for gradients only: the k largest magnitudes (ties: lowest index)
 * of x + residual are sent; what is not sent stays in the residual and is
 * added next time (error feedback), so nothing is lost, only delayed.
 * The per-element math is in dev_codec_hd.h. */
#ifndef DEV_CODEC_H
#define DEV_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

enum dev_codec {
    DEV_CODEC_NONE = 0,
    DEV_CODEC_FP16 = 1,
    DEV_CODEC_BF16 = 2,
    DEV_CODEC_INT8 = 3,
    DEV_CODEC_TOPK = 4,
    DEV_CODEC_COUNT
};

/* "none", "fp16", "bf16", "int8", "topk"; "?" for anything else. */
const char *dev_codec_name(int codec);
/* The codec named s, or -1. */
int dev_codec_parse(const char *s);
/* k for a fraction of n (topk): ceil(n * ratio) clamped to [1, n]. */
size_t dev_topk_k(size_t n, double ratio);

/* Payload bytes of a tensor of n elements in rows of cols (cols divides n;
 * topk: 1 <= k <= n). -1 (SL_EINVAL) on an invalid combination or overflow. */
int dev_codec_payload_len(int codec, size_t n, size_t cols, size_t k, size_t *len, sl_err *err);

/* Error feedback state of one topk stream (one tensor shape on one link). */
typedef struct dev_topk_ef {
    float *residual; /* n values, zero at start */
    size_t n;
} dev_topk_ef;
int dev_topk_ef_init(dev_topk_ef *ef, size_t n, sl_err *err);
void dev_topk_ef_reset(dev_topk_ef *ef);
void dev_topk_ef_free(dev_topk_ef *ef);

/* Encodes x[0..n) into out (exactly dev_codec_payload_len bytes). int8 and
 * topk refuse non-finite input (topk then also resets ef, which would hold
 * the non-finite sum). ef: topk error feedback or NULL. */
int dev_codec_encode(int codec, const float *x, size_t n, size_t cols, size_t k, dev_topk_ef *ef,
                     uint8_t *out, sl_err *err);
/* Decodes a payload of exactly dev_codec_payload_len bytes into y[0..n).
 * Refuses (SL_ECORRUPT) what an encoder never produces: an int8 scale that
 * is negative or not finite, an int8 value of -128, topk indices out of
 * range or not increasing, non-finite topk values. */
int dev_codec_decode(int codec, const uint8_t *in, size_t n, size_t cols, size_t k, float *y,
                     sl_err *err);

#endif
