/* fuzz_frame.c - libFuzzer target for the frame decoder and opener.
 *
 * The first input byte picks a mode:
 *   0  the rest is a frame for a plain link: decode it (nothing may crash;
 *      an accepted frame has a shape that fits the buffer)
 *   1  the rest is a frame for a sealed link: decode it; it must be refused,
 *      as the fuzzer does not hold the key
 *   2  the rest describes a tensor (codec, shape, k, values); encode it,
 *      decode it, check each codec's promise, then damage the frame where the
 *      input says and decode again: a sealed frame must be refused
 *   3  dev_frame_parse_header alone
 * Any broken property aborts, which libFuzzer reports as a crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec_hd.h"
#include "dev_frame.h"

#define CAPF (1u << 16)
#define FRAME_CAP (DEV_FRAME_HDR_LEN + 8u * CAPF + DEV_FRAME_TAG_LEN)

#define REQUIRE(c) REQUIREF(c, "%s", "")
/* On failure: the property, then a printf-style line with the values. */
#define REQUIREF(c, ...)                                                                \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "fuzz_frame: property failed at line %d: %s\n", __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            abort();                                                                    \
        }                                                                               \
    } while (0)

static dev_kx_keypair ka, kb;
static dev_link_tx tx[2];
static dev_link_rx rx[2];
static float in_vals[CAPF], out_vals[CAPF];
static uint8_t frame[FRAME_CAP];

static void setup(void)
{
    static int done;
    if (done)
        return;
    uint8_t seed[32];
    sl_err err;
    memset(seed, 1, sizeof(seed));
    REQUIRE(dev_kx_keypair_from_seed(&ka, seed, &err) == 0);
    memset(seed, 2, sizeof(seed));
    REQUIRE(dev_kx_keypair_from_seed(&kb, seed, &err) == 0);
    for (int sealed = 0; sealed <= 1; sealed++) {
        dev_link_cfg cfg = {.job_id = 5, .epoch = 1, .from_stage = 0, .to_stage = 1,
                            .sealed = sealed, .max_payload = FRAME_CAP};
        REQUIRE(dev_link_tx_init(&tx[sealed], &cfg, &ka, kb.pk, &err) == 0);
        REQUIRE(dev_link_rx_init(&rx[sealed], &cfg, &kb, ka.pk, &err) == 0);
    }
    done = 1;
}

static void decode_raw(int sealed, const uint8_t *data, size_t size)
{
    dev_frame_hdr h;
    sl_err err;
    dev_link_rx *r = &rx[sealed];
    r->have_top = 0; /* stateless: each input stands alone */
    int rc = dev_frame_decode(r, data, size, &h, out_vals, CAPF, &err);
    REQUIRE((rc == 0) == (r->last == DEV_FR_OK));
    REQUIRE(r->last >= 0 && r->last < DEV_FR_NREASONS);
    if (sealed)
        REQUIRE(rc == -1);
    if (rc == 0)
        REQUIRE(dev_frame_elems(&h) >= 1 && dev_frame_elems(&h) <= CAPF &&
                (size_t)DEV_FRAME_HDR_LEN + h.payload_len == size);
}

static uint32_t rd32(const uint8_t *p, size_t size, size_t off)
{
    uint8_t b[4] = {0};
    for (size_t i = 0; i < 4 && off + i < size; i++)
        b[i] = p[off + i];
    return dev_ld32(b);
}

/* What each codec promises for one element (x sent, y received). */
static void check_element(int codec, float x, float y, float scale, float amax)
{
    float ax = fabsf(x);
    double e = fabs((double)y - x);
#define VALUES "codec %d: x %a, y %a, scale %a, row absmax %a", codec, (double)x, (double)y, \
               (double)scale, (double)amax
    switch (codec) {
    case DEV_CODEC_NONE:
        REQUIREF(sl_f32_bits(x) == sl_f32_bits(y), VALUES);
        break;
    case DEV_CODEC_FP16:
        if (isnan(x))
            REQUIREF(isnan(y), VALUES);
        else if (ax >= 65520.0f)
            REQUIREF(isinf(y) && signbit(x) == signbit(y), VALUES);
        else if (ax >= 0x1p-14f)
            REQUIREF(e <= 0x1p-11 * ax, VALUES);
        else
            REQUIREF(e <= 0x1p-25, VALUES);
        break;
    case DEV_CODEC_BF16:
        if (isnan(x))
            REQUIREF(isnan(y), VALUES);
        else if (isinf(y))
            REQUIREF(ax >= 0x1.ffp127f && signbit(x) == signbit(y), VALUES);
        else if (ax >= 0x1p-126f)
            REQUIREF(e <= 0x1p-8 * ax, VALUES);
        else
            REQUIREF(e <= 0x1p-134, VALUES);
        break;
    case DEV_CODEC_INT8:
        if (amax == 0)
            REQUIREF(y == 0, VALUES);
        else
            REQUIREF(e <= scale / 2.0 * (1 + 3e-5) + 0x1p-149, VALUES);
        break;
    }
#undef VALUES
}

static void round_trip(const uint8_t *data, size_t size)
{
    if (size < 12)
        return;
    int sealed = data[0] & 1;
    int codec = (data[0] >> 1) % DEV_CODEC_COUNT;
    uint32_t d0 = 1 + data[1] % 64, d1 = 1 + data[2] % 256;
    size_t n = (size_t)d0 * d1;
    uint32_t k = codec == DEV_CODEC_TOPK ? 1 + rd32(data, size, 3) % (uint32_t)n : 0;
    uint32_t mut_pos = rd32(data, size, 7);
    uint8_t mut_xor = data[11];
    data += 12;
    size -= 12;
    for (size_t i = 0; i < n; i++)
        in_vals[i] = sl_bits_f32(rd32(data, size, 4 * i));

    dev_frame_hdr h = {.direction = codec == DEV_CODEC_TOPK ? DEV_DIR_GRADIENT : DEV_DIR_ACTIVATION,
                       .codec = (uint8_t)codec, .step = 1, .ndim = 2, .dims = {d0, d1}, .k = k};
    size_t len;
    sl_err err;
    if (dev_frame_encode(&tx[sealed], &h, in_vals, NULL, frame, FRAME_CAP, &len, &err) < 0) {
        /* only int8 and topk refuse input, and only non-finite input */
        int finite = 1;
        for (size_t i = 0; i < n; i++)
            finite &= isfinite(in_vals[i]);
        REQUIRE((codec == DEV_CODEC_INT8 || codec == DEV_CODEC_TOPK) && !finite);
        return;
    }
    REQUIRE(len <= dev_frame_max_len(&h));
    dev_frame_hdr g;
    rx[sealed].have_top = 0;
    REQUIRE(dev_frame_decode(&rx[sealed], frame, len, &g, out_vals, CAPF, &err) == 0);
    REQUIRE(dev_frame_hdr_equal(&g, &h));
    if (codec == DEV_CODEC_TOPK) {
        size_t kept = 0;
        float min_kept = INFINITY, max_dropped = 0;
        for (size_t i = 0; i < n; i++) {
            if (out_vals[i] != 0.0f) {
                REQUIRE(sl_f32_bits(out_vals[i]) == sl_f32_bits(in_vals[i]));
                kept++;
                min_kept = fminf(min_kept, fabsf(in_vals[i]));
            } else {
                max_dropped = fmaxf(max_dropped, fabsf(in_vals[i]));
            }
        }
        REQUIRE(kept <= k);
        REQUIRE(kept == 0 || min_kept >= max_dropped);
    } else {
        for (uint32_t r = 0; r < d0; r++) {
            float amax = 0;
            for (uint32_t j = 0; j < d1; j++)
                amax = fmaxf(amax, fabsf(in_vals[r * d1 + j]));
            float scale = dev_q8_scale(amax);
            for (uint32_t j = 0; j < d1; j++)
                check_element(codec, in_vals[r * d1 + j], out_vals[r * d1 + j], scale, amax);
        }
    }
    /* damage one byte: a sealed frame must be refused, a plain one must not crash */
    if (mut_xor == 0)
        return;
    frame[mut_pos % len] ^= mut_xor;
    rx[sealed].have_top = 0;
    int rc = dev_frame_decode(&rx[sealed], frame, len, &g, out_vals, CAPF, &err);
    if (sealed)
        REQUIRE(rc == -1 && rx[sealed].last != DEV_FR_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0)
        return 0;
    int mode = data[0] % 4;
    data++;
    size--;
    switch (mode) {
    case 0:
    case 1:
        decode_raw(mode, data, size);
        break;
    case 2:
        round_trip(data, size);
        break;
    default: {
        dev_frame_hdr h;
        int reason = -1;
        int rc = dev_frame_parse_header(data, size, 0, &h, &reason, NULL);
        REQUIRE((rc == 0) == (reason == DEV_FR_OK));
        break;
    }
    }
    return 0;
}
