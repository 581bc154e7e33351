/* Frames: header round trips over every codec, sealed and plain; the byte
 * layout against a frame written by hand; every direction with its dtype,
 * codecs and aux, checked against a table of the rules; each way a frame can
 * be refused, with its exact reason and counter; epochs (refused, in the
 * nonce); the receive window against a naive model; keys per direction; and
 * 10k random faults injected into sealed frames, every one refused cleanly. */
#include <stdint.h>
#include <string.h>

#include "dev_codec_hd.h"
#include "dev_frame.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_test.h"

#define SEED 0xf4a3e5ull
#define CAP 65536

static dev_kx_keypair key_a, key_b, key_c;
static uint8_t buf[CAP], bad[CAP];
static float xin[4096], xout[4096];
/* inputs of the other dtypes, and a decode buffer aligned for any of them */
static int32_t iin[4096];
static double din[4096];
static uint8_t uin[4096];
static double dout[4096];

static void make_keys(void)
{
    uint8_t seed[32];
    sl_err err;
    memset(seed, 0xa1, sizeof(seed));
    CHECK(dev_kx_keypair_from_seed(&key_a, seed, &err) == 0);
    memset(seed, 0xb2, sizeof(seed));
    CHECK(dev_kx_keypair_from_seed(&key_b, seed, &err) == 0);
    memset(seed, 0xc3, sizeof(seed));
    CHECK(dev_kx_keypair_from_seed(&key_c, seed, &err) == 0);
    for (size_t i = 0; i < 4096; i++) {
        xin[i] = sl_rng_normal(SEED, 0, i);
        iin[i] = (int32_t)sl_rng_u32(SEED, 1, i);
        din[i] = (double)sl_rng_normal(SEED, 2, i) * 1e-3 + (double)sl_rng_normal(SEED, 3, i) * 1e5;
        uin[i] = (uint8_t)(' ' + sl_rng_u32(SEED, 4, i) % 95); /* printable ASCII */
    }
    din[1] = -0.0;
    din[2] = 0x1p-1074;
    iin[3] = INT32_MIN;
}

/* The dtype each direction carries, from the format's table. */
static int dtype_of(int dir)
{
    switch (dir) {
    case DEV_DIR_MASK:
    case DEV_DIR_LABELS:
        return DEV_DTYPE_I32;
    case DEV_DIR_GATHER:
    case DEV_DIR_GATHER_RESULT:
        return DEV_DTYPE_F64;
    case DEV_DIR_ABORT:
    case DEV_DIR_SYNC:
        return DEV_DTYPE_U8;
    default:
        return DEV_DTYPE_F32;
    }
}

static const void *input_of(int dtype)
{
    return dtype == DEV_DTYPE_I32 ? (const void *)iin
         : dtype == DEV_DTYPE_F64 ? (const void *)din
         : dtype == DEV_DTYPE_U8  ? (const void *)uin
                                  : (const void *)xin;
}

/* The rules of the format, written out once more: what a direction may carry. */
static int allowed(int dir, int dtype, int codec, uint64_t aux)
{
    switch (dir) {
    case DEV_DIR_ACTIVATION:
    case DEV_DIR_TIED:
        return dtype == DEV_DTYPE_F32 && codec >= DEV_CODEC_NONE && codec <= DEV_CODEC_INT8 && !aux;
    case DEV_DIR_GRADIENT:
        return dtype == DEV_DTYPE_F32 && codec >= DEV_CODEC_NONE && codec <= DEV_CODEC_TOPK && !aux;
    case DEV_DIR_MASK:
        return dtype == DEV_DTYPE_I32 && codec == DEV_CODEC_NONE && !aux;
    case DEV_DIR_LABELS:
        return dtype == DEV_DTYPE_I32 && codec == DEV_CODEC_NONE;
    case DEV_DIR_GATHER:
    case DEV_DIR_GATHER_RESULT:
        return dtype == DEV_DTYPE_F64 && codec == DEV_CODEC_NONE;
    case DEV_DIR_ABORT:
        return dtype == DEV_DTYPE_U8 && codec == DEV_CODEC_NONE && !aux;
    case DEV_DIR_SYNC:
        return dtype == DEV_DTYPE_U8 && codec == DEV_CODEC_NONE;
    }
    return 0;
}

/* A plain frame written by hand, byte by byte, from the layout in the docs
 * (independent of the encoder). */
typedef struct hand {
    uint8_t version, direction, codec, dtype, ndim;
    uint16_t microbatch;
    uint64_t job_id, step, seq;
    uint32_t dims[4], k, payload_len, epoch, reserved;
    uint64_t aux;
} hand;

static void le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static size_t hand_frame(uint8_t *out, const hand *f, const uint8_t *payload)
{
    memset(out, 0, 96);
    memcpy(out, "SLFR", 4);
    out[4] = f->version;
    out[5] = 0;
    out[6] = f->direction;
    out[7] = f->codec;
    out[8] = f->dtype;
    out[9] = f->ndim;
    le(out + 10, 1, 2); /* from_stage, to_stage of cfg_of */
    le(out + 12, 2, 2);
    le(out + 14, f->microbatch, 2);
    le(out + 16, f->job_id, 8);
    le(out + 24, f->step, 8);
    le(out + 32, f->seq, 8);
    for (int i = 0; i < 4; i++)
        le(out + 40 + 4 * i, f->dims[i], 4);
    le(out + 56, f->k, 4);
    le(out + 60, f->payload_len, 4);
    le(out + 64, f->epoch, 4);
    le(out + 68, f->reserved, 4);
    le(out + 72, f->aux, 8);
    if (payload)
        memcpy(out + 96, payload, f->payload_len);
    return 96 + (size_t)f->payload_len;
}

static hand hand_of(int dir, int dtype, int codec, uint32_t d0, uint32_t payload_len)
{
    hand f = {.version = 3, .direction = (uint8_t)dir, .codec = (uint8_t)codec,
              .dtype = (uint8_t)dtype, .ndim = 1, .microbatch = 4, .job_id = 77, .step = 9,
              .dims = {d0}, .payload_len = payload_len, .epoch = 3};
    return f;
}

/* The elements of data as the format puts them on the wire: little-endian. */
static void le_elements(uint8_t *out, int dtype, const void *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dtype == DEV_DTYPE_U8) {
            out[i] = ((const uint8_t *)data)[i];
        } else if (dtype == DEV_DTYPE_F64) {
            uint64_t v;
            memcpy(&v, (const double *)data + i, 8);
            le(out + 8 * i, v, 8);
        } else {
            uint32_t v;
            memcpy(&v, (const uint32_t *)data + i, 4);
            le(out + 4 * i, v, 4);
        }
    }
}

static dev_link_cfg cfg_of(int sealed, uint32_t max_payload)
{
    dev_link_cfg c = {.job_id = 77, .epoch = 3, .from_stage = 1, .to_stage = 2, .sealed = sealed,
                      .max_payload = max_payload};
    return c;
}

/* a sends to b over cfg. */
static void link_up(dev_link_tx *tx, dev_link_rx *rx, const dev_link_cfg *cfg)
{
    sl_err err;
    CHECKF(dev_link_tx_init(tx, cfg, &key_a, key_b.pk, &err) == 0, "%s", err.msg);
    CHECKF(dev_link_rx_init(rx, cfg, &key_b, key_a.pk, &err) == 0, "%s", err.msg);
}

static void links_down(dev_link_tx *tx, dev_link_rx *rx)
{
    dev_link_tx_free(tx);
    dev_link_rx_free(rx);
}

static dev_frame_hdr hdr_of(int codec, int dir, uint32_t d0, uint32_t d1, uint32_t k)
{
    dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = (uint8_t)codec, .step = 9,
                       .microbatch = 4, .ndim = 2, .dims = {d0, d1}, .k = k};
    return h;
}

static size_t send(dev_link_tx *tx, int codec, int dir, uint32_t d0, uint32_t d1, uint32_t k,
                   uint8_t *out)
{
    dev_frame_hdr h = hdr_of(codec, dir, d0, d1, k);
    size_t len = 0;
    sl_err err;
    CHECKF(dev_frame_encode(tx, &h, xin, NULL, out, CAP, &len, &err) == 0, "%s", err.msg);
    return len;
}

/* A frame of direction dir (its dtype, codec none) of d0 x d1 elements;
 * abort frames are one-dimensional. */
static size_t send_any(dev_link_tx *tx, int dir, uint32_t d0, uint32_t d1, uint64_t aux,
                       uint8_t *out)
{
    dev_frame_hdr h = hdr_of(DEV_CODEC_NONE, dir, d0, d1, 0);
    h.dtype = (uint8_t)dtype_of(dir);
    h.aux = aux;
    if (dir == DEV_DIR_ABORT)
        h.ndim = 1, h.dims[0] = d0 * d1, h.dims[1] = 0;
    size_t len = 0;
    sl_err err;
    CHECKF(dev_frame_encode_any(tx, &h, input_of(h.dtype), NULL, out, CAP, &len, &err) == 0, "%s",
           err.msg);
    return len;
}

/* Decoding in[0..len) is refused for `reason`, counted, and named in the message. */
static void expect_refused_as(dev_link_rx *rx, const uint8_t *in, size_t len, int reason, int any,
                              int line)
{
    dev_frame_hdr h;
    sl_err err = {0};
    uint64_t before = rx->refused[reason], frames = rx->frames;
    int rc = any ? dev_frame_decode_any(rx, in, len, &h, dout, sizeof(dout), &err)
                 : dev_frame_decode(rx, in, len, &h, xout, 4096, &err);
    CHECKF(rc == -1 && rx->last == reason, "line %d: rc %d, reason %s, wanted %s (%s)", line, rc,
           dev_frame_reason_name(rx->last), dev_frame_reason_name(reason), err.msg);
    CHECKF(rx->refused[reason] == before + 1, "line %d: counter", line);
    CHECK(rx->frames == frames);
    CHECKF(strstr(err.msg, dev_frame_reason_name(reason)) != NULL, "line %d: message '%s'", line,
           err.msg);
}
static void expect_refused(dev_link_rx *rx, const uint8_t *in, size_t len, int reason, int line)
{
    expect_refused_as(rx, in, len, reason, 0, line);
}
#define REFUSED(rx, in, len, reason) expect_refused_as(rx, in, len, reason, 0, __LINE__)
#define REFUSED_ANY(rx, in, len, reason) expect_refused_as(rx, in, len, reason, 1, __LINE__)

static void expect_ok(dev_link_rx *rx, const uint8_t *in, size_t len, int any, int line)
{
    dev_frame_hdr h;
    sl_err err = {0};
    int rc = any ? dev_frame_decode_any(rx, in, len, &h, dout, sizeof(dout), &err)
                 : dev_frame_decode(rx, in, len, &h, xout, 4096, &err);
    CHECKF(rc == 0 && rx->last == DEV_FR_OK, "line %d: %s", line, err.msg);
}
#define ACCEPTED(rx, in, len) expect_ok(rx, in, len, 0, __LINE__)
#define ACCEPTED_ANY(rx, in, len) expect_ok(rx, in, len, 1, __LINE__)

static void test_round_trip(void)
{
    for (int sealed = 0; sealed <= 1; sealed++) {
        dev_link_cfg cfg = cfg_of(sealed, 0);
        dev_link_tx tx;
        dev_link_rx rx;
        link_up(&tx, &rx, &cfg);
        for (int codec = 0; codec < DEV_CODEC_COUNT; codec++) {
            int dir = codec == DEV_CODEC_TOPK ? DEV_DIR_GRADIENT : DEV_DIR_ACTIVATION;
            uint32_t k = codec == DEV_CODEC_TOPK ? 5 : 0;
            dev_frame_hdr h = hdr_of(codec, dir, 6, 16, k), g;
            size_t len = 0, plain;
            sl_err err;
            CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &len, &err) == 0);
            CHECK(dev_codec_payload_len(codec, 96, 16, k, &plain, &err) == 0);
            CHECK(len == DEV_FRAME_HDR_LEN + plain + (sealed ? DEV_FRAME_TAG_LEN : 0));
            CHECK(len <= dev_frame_max_len(&h));
            CHECK(h.seq == (uint64_t)codec && h.job_id == 77 && h.from_stage == 1 && h.to_stage == 2);
            CHECK(h.epoch == 3 && h.dtype == DEV_DTYPE_F32 && h.aux == 0 && h.version == 3);
            CHECK(dev_ld32(buf) == DEV_FRAME_MAGIC && buf[0] == 'S' && buf[3] == 'R');
            memset(xout, 0xff, sizeof(xout));
            CHECKF(dev_frame_decode(&rx, buf, len, &g, xout, 96, &err) == 0, "%s", err.msg);
            CHECK(dev_frame_hdr_equal(&g, &h));
            g.dims[3] = 1;
            CHECK(!dev_frame_hdr_equal(&g, &h));
            g = h;
            g.epoch++;
            CHECK(!dev_frame_hdr_equal(&g, &h));
            g = h;
            g.aux = 1;
            CHECK(!dev_frame_hdr_equal(&g, &h));
            if (codec == DEV_CODEC_NONE)
                CHECK(memcmp(xin, xout, 96 * sizeof(float)) == 0);
            double worst = 0;
            for (int i = 0; i < 96; i++)
                worst = fmax(worst, fabs((double)xout[i] - xin[i]));
            CHECKF(codec == DEV_CODEC_TOPK || worst < 0.05, "codec %d error %g", codec, worst);
            if (!sealed) { /* a plain payload is the codec's bytes as they are */
                CHECK(dev_codec_encode(codec, xin, 96, 16, k, NULL, bad, &err) == 0);
                CHECK(memcmp(buf + DEV_FRAME_HDR_LEN, bad, plain) == 0);
            }
        }
        CHECK(rx.frames == DEV_CODEC_COUNT && tx.frames == DEV_CODEC_COUNT && rx.bytes == tx.bytes);
        links_down(&tx, &rx);
    }
}

/* The encoder's bytes are the layout of the docs, written out by hand. */
static void test_layout(void)
{
    dev_link_cfg cfg = cfg_of(0, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    tx.next_seq = 0x0102030405060708ull;
    dev_frame_hdr h = {.direction = DEV_DIR_LABELS, .codec = DEV_CODEC_NONE, .dtype = DEV_DTYPE_I32,
                       .step = 0x1112131415161718ull, .microbatch = 0x2122, .ndim = 2,
                       .dims = {3, 5}, .aux = 0xa1a2a3a4a5a6a7a8ull};
    size_t len;
    sl_err err;
    CHECKF(dev_frame_encode_any(&tx, &h, iin, NULL, buf, CAP, &len, &err) == 0, "%s", err.msg);
    hand f = hand_of(DEV_DIR_LABELS, DEV_DTYPE_I32, DEV_CODEC_NONE, 3, 15 * 4);
    f.ndim = 2, f.dims[1] = 5, f.seq = 0x0102030405060708ull, f.step = 0x1112131415161718ull;
    f.microbatch = 0x2122, f.aux = 0xa1a2a3a4a5a6a7a8ull;
    uint8_t payload[60];
    le_elements(payload, DEV_DTYPE_I32, iin, 15);
    size_t want = hand_frame(bad, &f, payload);
    CHECK(len == want && len == 96 + 60);
    for (size_t i = 0; i < want; i++)
        CHECKF(buf[i] == bad[i], "byte %zu: 0x%02x, by hand 0x%02x", i, buf[i], bad[i]);
    CHECK(buf[64] == 3 && buf[72] == 0xa8 && buf[79] == 0xa1 && buf[96] == (uint8_t)iin[0]);
    /* and the hand-written frame decodes to the same header */
    dev_frame_hdr g;
    int32_t got[15];
    CHECKF(dev_frame_decode_any(&rx, bad, want, &g, got, sizeof(got), &err) == 0, "%s", err.msg);
    CHECK(dev_frame_hdr_equal(&g, &h) && memcmp(got, iin, sizeof(got)) == 0);
    CHECK(DEV_FRAME_FIELDS_LEN == 80 && DEV_FRAME_HDR_LEN == 96 && DEV_FRAME_VERSION == 3);
    links_down(&tx, &rx);
}

/* Every direction x dtype x codec x (aux zero or not), the encoder and a
 * hand-written frame on the decoder, against the table in allowed(). */
static void test_kind_rules(void)
{
    dev_link_cfg cfg = cfg_of(0, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    static uint8_t payload[CAP];
    int accepted = 0, refused = 0;
    for (int dir = 0; dir <= 10; dir++)
        for (int dtype = 0; dtype <= 5; dtype++)
            for (int codec = 0; codec <= DEV_CODEC_COUNT; codec++)
                for (int a = 0; a < 2; a++) {
                    uint64_t aux = a ? 0x8000000000000005ull : 0;
                    uint32_t k = codec == DEV_CODEC_TOPK ? 3 : 0, n = 8;
                    int ok = allowed(dir, dtype, codec, aux);
                    dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = (uint8_t)codec,
                                       .dtype = (uint8_t)dtype, .step = 9, .microbatch = 4,
                                       .ndim = 1, .dims = {n}, .k = k, .aux = aux};
                    size_t len = 0, plen = 0;
                    sl_err err = {0};
                    int rc = dev_frame_encode_any(&tx, &h, input_of(dtype), NULL, buf, CAP, &len, &err);
                    CHECKF((rc == 0) == ok, "dir %d dtype %d codec %d aux %d: encode %d (%s)", dir,
                           dtype, codec, a, rc, err.msg);
                    if (!ok)
                        CHECKF(strstr(err.msg, "bad header"), "dir %d dtype %d codec %d aux %d: %s",
                               dir, dtype, codec, a, err.msg);
                    /* the same header by hand, with the payload the rules give */
                    if (dtype == DEV_DTYPE_F32 && codec < DEV_CODEC_COUNT) {
                        CHECK(dev_codec_payload_len(codec, n, n, k, &plen, NULL) == 0);
                        CHECK(dev_codec_encode(codec, xin, n, n, k, NULL, payload, &err) == 0);
                    } else if (dtype >= DEV_DTYPE_I32 && dtype <= DEV_DTYPE_U8) {
                        plen = n * (dtype == DEV_DTYPE_F64 ? 8 : dtype == DEV_DTYPE_U8 ? 1 : 4);
                        le_elements(payload, dtype, input_of(dtype), n);
                    }
                    hand f = hand_of(dir, dtype, codec, n, (uint32_t)plen);
                    f.k = k, f.aux = aux, f.seq = ok ? h.seq : 0;
                    size_t hlen = hand_frame(bad, &f, payload);
                    if (!ok) {
                        expect_refused_as(&rx, bad, hlen, DEV_FR_BAD_HEADER, 1,
                                          10000 + dir * 1000 + dtype * 100 + codec * 10 + a);
                        refused++;
                        continue;
                    }
                    CHECKF(len == hlen && memcmp(buf, bad, len) == 0,
                           "dir %d dtype %d codec %d aux %d: encoder and hand differ", dir, dtype,
                           codec, a);
                    dev_frame_hdr g;
                    memset(dout, 0, sizeof(dout));
                    CHECKF(dev_frame_decode_any(&rx, bad, hlen, &g, dout, sizeof(dout), &err) == 0,
                           "dir %d dtype %d codec %d: %s", dir, dtype, codec, err.msg);
                    CHECK(dev_frame_hdr_equal(&g, &h) && g.aux == aux);
                    if (codec == DEV_CODEC_NONE)
                        CHECK(memcmp(dout, input_of(dtype), n * dev_frame_dtype_size(dtype)) == 0);
                    accepted++;
                }
    /* activation, tied: 4 codecs each, gradient 5; mask: 1; labels, gather,
     * gather result: aux free, so 2 each; abort: 1; sync: aux free, 2 */
    CHECKF(accepted == 13 + 1 + 6 + 1 + 2 && refused == 11 * 6 * 6 * 2 - accepted,
           "%d accepted, %d refused",
           accepted, refused);
    links_down(&tx, &rx);
}

/* Each direction round trips sealed and plain: values bit for bit (NaN, -0,
 * subnormals, INT32_MIN), aux carried, epoch set, nothing written past the
 * capacity. */
static void test_kind_round_trips(void)
{
    for (int sealed = 0; sealed <= 1; sealed++) {
        dev_link_cfg cfg = cfg_of(sealed, 0);
        dev_link_tx tx;
        dev_link_rx rx;
        link_up(&tx, &rx, &cfg);
        uint64_t nan_bits = 0x7ff8000000000123ull; /* a NaN payload must survive too */
        memcpy(&din[0], &nan_bits, 8);
        for (int dir = DEV_DIR_ACTIVATION; dir <= DEV_DIR_SYNC; dir++) {
            int dtype = dtype_of(dir);
            int has_aux = dir == DEV_DIR_LABELS || dir == DEV_DIR_GATHER ||
                          dir == DEV_DIR_GATHER_RESULT || dir == DEV_DIR_SYNC;
            uint64_t aux = has_aux ? 0xfedcba9876543210ull + (uint64_t)dir : 0;
            size_t len = send_any(&tx, dir, 6, 7, aux, buf);
            size_t bytes = 42 * dev_frame_dtype_size(dtype);
            CHECK(len == DEV_FRAME_HDR_LEN + bytes + (sealed ? DEV_FRAME_TAG_LEN : 0));
            dev_frame_hdr g;
            sl_err err;
            memset(dout, 0xee, sizeof(dout));
            CHECKF(dev_frame_decode_any(&rx, buf, len, &g, dout, bytes, &err) == 0, "dir %d: %s",
                   dir, err.msg);
            CHECK(g.direction == dir && g.dtype == dtype && g.aux == aux && g.epoch == 3);
            CHECKF(memcmp(dout, input_of(dtype), bytes) == 0, "dir %d: values differ", dir);
            CHECK(((uint8_t *)dout)[bytes] == 0xee);
        }
        CHECK(rx.frames == 9 && rx.bytes == tx.bytes);
        links_down(&tx, &rx);
    }
}

/* dev_frame_decode takes f32 frames only; decode_any's capacity is bytes. */
static void test_dtype_capacity(void)
{
    for (int sealed = 0; sealed <= 1; sealed++) {
        dev_link_cfg cfg = cfg_of(sealed, 0);
        dev_link_tx tx;
        dev_link_rx rx;
        link_up(&tx, &rx, &cfg);
        size_t len = send_any(&tx, DEV_DIR_GATHER, 4, 4, 0, buf); /* 16 doubles, 128 bytes */
        memset(xout, 0x5c, sizeof(xout));
        dev_frame_hdr g;
        sl_err err;
        CHECK(dev_frame_decode(&rx, buf, len, &g, xout, 4096, &err) == -1);
        CHECKF(rx.last == DEV_FR_BAD_HEADER && strstr(err.msg, "dtype f64 where f32 was expected"),
               "%s", err.msg);
        CHECK(rx.refused[DEV_FR_BAD_HEADER] == 1 && ((uint8_t *)xout)[0] == 0x5c);
        /* one byte short: refused, nothing written */
        memset(dout, 0x5c, sizeof(dout));
        CHECK(dev_frame_decode_any(&rx, buf, len, &g, dout, 127, &err) == -1 &&
              rx.last == DEV_FR_CAPACITY && strstr(err.msg, "128 bytes"));
        CHECK(((uint8_t *)dout)[0] == 0x5c);
        /* neither refusal consumed the frame */
        CHECKF(dev_frame_decode_any(&rx, buf, len, &g, dout, 128, &err) == 0, "%s", err.msg);
        CHECK(((uint8_t *)dout)[128] == 0x5c && memcmp(dout, din, 128) == 0);
        /* an f32 frame through decode_any: bytes of floats */
        len = send(&tx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 3, 0, buf);
        CHECK(dev_frame_decode_any(&rx, buf, len, &g, dout, 23, &err) == -1 &&
              rx.last == DEV_FR_CAPACITY);
        CHECK(dev_frame_decode_any(&rx, buf, len, &g, dout, 24, &err) == 0 &&
              g.dtype == DEV_DTYPE_F32);
        /* the f32 API's capacity is in floats */
        len = send(&tx, DEV_CODEC_NONE, DEV_DIR_TIED, 2, 3, 0, buf);
        CHECK(dev_frame_decode(&rx, buf, len, &g, xout, 5, &err) == -1 && rx.last == DEV_FR_CAPACITY);
        CHECK(dev_frame_decode(&rx, buf, len, &g, xout, 6, &err) == 0 && g.direction == DEV_DIR_TIED);
        links_down(&tx, &rx);
    }
    CHECK(dev_frame_dtype_size(DEV_DTYPE_F32) == 4 && dev_frame_dtype_size(DEV_DTYPE_I32) == 4 &&
          dev_frame_dtype_size(DEV_DTYPE_F64) == 8 && dev_frame_dtype_size(DEV_DTYPE_U8) == 1);
    CHECK(dev_frame_dtype_size(0) == 0 && dev_frame_dtype_size(5) == 0 && dev_frame_dtype_size(-1) == 0);
    /* max_len by dtype; dtype 0 is f32 (dev_frame_encode sets it) */
    dev_frame_hdr h = {.direction = DEV_DIR_LABELS, .ndim = 2, .dims = {3, 10}};
    size_t over = DEV_FRAME_HDR_LEN + DEV_FRAME_TAG_LEN;
    CHECK(dev_frame_max_len(&h) == over + 120);
    h.dtype = DEV_DTYPE_F64;
    CHECK(dev_frame_max_len(&h) == over + 240);
    h.dtype = DEV_DTYPE_U8;
    CHECK(dev_frame_max_len(&h) == over + 30);
    h.dtype = DEV_DTYPE_I32;
    CHECK(dev_frame_max_len(&h) == over + 120);
    h.codec = DEV_CODEC_FP16;
    CHECK(dev_frame_max_len(&h) == 0);
    h.dtype = DEV_DTYPE_F32;
    CHECK(dev_frame_max_len(&h) == over + 60);
    h.dtype = 9;
    CHECK(dev_frame_max_len(&h) == 0);
}

/* The rules besides dtype and codec: aux, the abort frame's shape, size
 * and text. */
static void test_aux_and_abort(void)
{
    dev_link_cfg cfg = cfg_of(0, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    sl_err err;
    size_t len;
    /* aux on the directions that have none: refused by both ends */
    const int no_aux[] = {DEV_DIR_ACTIVATION, DEV_DIR_GRADIENT, DEV_DIR_MASK, DEV_DIR_TIED,
                          DEV_DIR_ABORT};
    for (int i = 0; i < 5; i++) {
        dev_frame_hdr h = hdr_of(DEV_CODEC_NONE, no_aux[i], 1, 8, 0);
        h.dtype = (uint8_t)dtype_of(no_aux[i]);
        if (no_aux[i] == DEV_DIR_ABORT)
            h.ndim = 1, h.dims[0] = 8, h.dims[1] = 0;
        h.aux = 1;
        CHECK(dev_frame_encode_any(&tx, &h, input_of(h.dtype), NULL, buf, CAP, &len, &err) == -1 &&
              strstr(err.msg, "aux 1"));
        len = send_any(&tx, no_aux[i], 1, 8, 0, buf);
        buf[72] = 1;
        REFUSED_ANY(&rx, buf, len, DEV_FR_BAD_HEADER);
        buf[72] = 0;
        ACCEPTED_ANY(&rx, buf, len);
    }
    /* abort: one dimension, at most DEV_FRAME_ABORT_MAX bytes of UTF-8 */
    static const char why[] = "stage 2: out of memory (\xc3\xb8, \xe2\x88\x9e, \xf0\x9f\x90\x9b)";
    dev_frame_hdr h = {.direction = DEV_DIR_ABORT, .dtype = DEV_DTYPE_U8, .ndim = 1,
                       .dims = {sizeof(why) - 1}};
    CHECKF(dev_frame_encode_any(&tx, &h, why, NULL, buf, CAP, &len, &err) == 0, "%s", err.msg);
    dev_frame_hdr g;
    char text[64] = {0};
    CHECK(dev_frame_decode_any(&rx, buf, len, &g, text, sizeof(text), &err) == 0 &&
          strcmp(text, why) == 0);
    h.ndim = 2, h.dims[0] = 1, h.dims[1] = sizeof(why) - 1;
    CHECK(dev_frame_encode_any(&tx, &h, why, NULL, buf, CAP, &len, &err) == -1 &&
          strstr(err.msg, "bad shape"));
    static uint8_t reason[DEV_FRAME_ABORT_MAX + 1];
    memset(reason, 'x', sizeof(reason));
    h = (dev_frame_hdr){.direction = DEV_DIR_ABORT, .dtype = DEV_DTYPE_U8, .ndim = 1,
                        .dims = {DEV_FRAME_ABORT_MAX}};
    CHECK(dev_frame_encode_any(&tx, &h, reason, NULL, buf, CAP, &len, &err) == 0);
    ACCEPTED_ANY(&rx, buf, len);
    h.dims[0] = DEV_FRAME_ABORT_MAX + 1;
    CHECK(dev_frame_encode_any(&tx, &h, reason, NULL, buf, CAP, &len, &err) == -1 &&
          strstr(err.msg, "oversized"));
    hand f = hand_of(DEV_DIR_ABORT, DEV_DTYPE_U8, DEV_CODEC_NONE, DEV_FRAME_ABORT_MAX + 1,
                     DEV_FRAME_ABORT_MAX + 1);
    f.seq = 1000;
    len = hand_frame(bad, &f, reason);
    REFUSED_ANY(&rx, bad, len, DEV_FR_OVERSIZED);
    f = hand_of(DEV_DIR_ABORT, DEV_DTYPE_U8, DEV_CODEC_NONE, 4, 4);
    f.ndim = 2, f.dims[1] = 1, f.seq = 1000;
    len = hand_frame(bad, &f, reason);
    REFUSED_ANY(&rx, bad, len, DEV_FR_BAD_SHAPE);
    /* not UTF-8: a stray continuation byte, a cut sequence, an overlong '/',
     * a surrogate, above U+10FFFF, 0xff; refused by both ends */
    static const char *const broken[] = {"ab\x80", "ab\xe2\x88", "\xc0\xaf", "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80", "\xff"};
    for (int i = 0; i < 6; i++) {
        uint32_t n = (uint32_t)strlen(broken[i]);
        h = (dev_frame_hdr){.direction = DEV_DIR_ABORT, .dtype = DEV_DTYPE_U8, .ndim = 1, .dims = {n}};
        CHECK(dev_frame_encode_any(&tx, &h, broken[i], NULL, buf, CAP, &len, &err) == -1 &&
              err.code == SL_EINVAL && strstr(err.msg, "UTF-8"));
        f = hand_of(DEV_DIR_ABORT, DEV_DTYPE_U8, DEV_CODEC_NONE, n, n);
        f.seq = 2000 + (uint64_t)i;
        len = hand_frame(bad, &f, (const uint8_t *)broken[i]);
        REFUSED_ANY(&rx, bad, len, DEV_FR_BAD_PAYLOAD);
        CHECK(rx.top < 2000); /* not consumed: the window did not move */
    }
    links_down(&tx, &rx);
}

/* Epochs: a frame of another epoch is refused before its tag is looked at,
 * even under the right key with a valid tag; the epoch field is
 * authenticated; the nonce holds the epoch; versions 1 and 2 are refused. */
static void test_epochs(void)
{
    sl_err err;
    dev_link_cfg c3 = cfg_of(1, 0), c4 = cfg_of(1, 0);
    c4.epoch = 4;
    dev_link_tx tx3, tx4;
    dev_link_rx rx3, rx4;
    link_up(&tx3, &rx3, &c3);
    link_up(&tx4, &rx4, &c4);
    CHECK(memcmp(tx3.key, tx4.key, 32) != 0); /* the epoch is in the key derivation */
    /* rx4 with epoch 3's keys: the right key for the old frame */
    memcpy(rx4.key, rx3.key, 32);
    memcpy(rx4.hdr_key, rx3.hdr_key, 32);
    size_t len = send(&tx3, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 8, 0, buf);
    CHECK(dev_ld32(buf + 64) == 3);
    dev_frame_hdr g;
    memcpy(bad, buf, len);
    CHECK(dev_frame_decode(&rx4, bad, len, &g, xout, 4096, &err) == -1 && rx4.last == DEV_FR_EPOCH);
    CHECKF(strstr(err.msg, "other epoch") && strstr(err.msg, "epoch 3 on a link of epoch 4") &&
           err.code == SL_EAUTH, "%s", err.msg);
    CHECK(rx4.refused[DEV_FR_EPOCH] == 1 && rx4.frames == 0);
    ACCEPTED(&rx3, buf, len); /* the tag was valid under those keys */
    /* the epoch field is authenticated: rewritten to the new epoch, the tag fails */
    dev_st32(bad + 64, 4);
    REFUSED(&rx4, bad, len, DEV_FR_TAMPERED_HEADER);
    /* with epoch 4's own keys: still the epoch, not a forgery */
    dev_link_rx own4;
    CHECK(dev_link_rx_init(&own4, &c4, &key_b, key_a.pk, &err) == 0);
    REFUSED(&own4, buf, len, DEV_FR_EPOCH);
    len = send(&tx4, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 8, 0, bad);
    ACCEPTED(&own4, bad, len);
    REFUSED(&rx3, bad, len, DEV_FR_EPOCH); /* nor a newer epoch on an old link */
    dev_link_rx_free(&own4);
    /* plain links check the epoch too */
    dev_link_cfg p3 = cfg_of(0, 0), p4 = cfg_of(0, 0);
    p4.epoch = 4;
    dev_link_tx ptx;
    dev_link_rx prx;
    CHECK(dev_link_tx_init(&ptx, &p3, NULL, NULL, &err) == 0);
    CHECK(dev_link_rx_init(&prx, &p4, NULL, NULL, &err) == 0);
    len = send_any(&ptx, DEV_DIR_LABELS, 2, 2, 7, buf);
    REFUSED_ANY(&prx, buf, len, DEV_FR_EPOCH);
    dev_st32(buf + 64, 4);
    ACCEPTED_ANY(&prx, buf, len);
    links_down(&ptx, &prx);

    /* the nonce holds the epoch: tx4 under epoch 3's keys sends the same
     * tensor with the same seq as tx3, and the ciphertexts differ */
    memcpy(tx4.key, tx3.key, 32);
    memcpy(tx4.hdr_key, tx3.hdr_key, 32);
    tx3.next_seq = tx4.next_seq = 5;
    size_t l3 = send(&tx3, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 8, 0, buf);
    size_t l4 = send(&tx4, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 8, 0, bad);
    CHECK(l3 == l4 && dev_ld64(buf + 32) == 5 && dev_ld64(bad + 32) == 5);
    int same = 0;
    for (size_t i = DEV_FRAME_HDR_LEN; i < l3; i++)
        same += buf[i] == bad[i];
    CHECKF(same < 16, "%d of %zu ciphertext bytes equal under two epochs", same,
           l3 - DEV_FRAME_HDR_LEN);
    /* and each opens on its own epoch under those keys */
    rx4.have_top = 0;
    ACCEPTED(&rx4, bad, l4);
    CHECK(memcmp(xout, xin, 32 * sizeof(float)) == 0);
    rx3.have_top = 0;
    ACCEPTED(&rx3, buf, l3);
    links_down(&tx3, &rx3);
    links_down(&tx4, &rx4);

    /* version 1: the 80-byte header of the old format, refused by its version */
    dev_link_cfg pc = cfg_of(0, 0);
    link_up(&ptx, &prx, &pc);
    len = send(&ptx, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 1, 4, 0, buf);
    memset(bad, 0, 96);
    memcpy(bad, buf, 64);
    bad[4] = 1;
    memcpy(bad + 80, buf + DEV_FRAME_HDR_LEN, 16);
    REFUSED(&prx, bad, 96, DEV_FR_BAD_VERSION);
    bad[4] = 3; /* the same bytes read as version 3 are no frame either */
    CHECK(dev_frame_decode(&prx, bad, 96, &g, xout, 4096, &err) == -1 && prx.last != DEV_FR_OK);
    buf[4] = 1;
    REFUSED(&prx, buf, len, DEV_FR_BAD_VERSION);
    sl_err e2;
    int reason;
    CHECK(dev_frame_parse_header(buf, len, 0, &g, &reason, &e2) == -1 &&
          reason == DEV_FR_BAD_VERSION && strstr(e2.msg, "version 1, this build speaks 3"));
    /* version 2: the same layout, whose masks carried a sequence index that
     * version 3 no longer sends: refused by its version too */
    buf[4] = 2;
    REFUSED(&prx, buf, len, DEV_FR_BAD_VERSION);
    CHECK(dev_frame_parse_header(buf, len, 0, &g, &reason, &e2) == -1 &&
          reason == DEV_FR_BAD_VERSION && strstr(e2.msg, "version 2, this build speaks 3"));
    links_down(&ptx, &prx);
}

static void test_tampered(void)
{
    dev_link_cfg cfg = cfg_of(1, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    size_t len = send(&tx, DEV_CODEC_INT8, DEV_DIR_ACTIVATION, 4, 32, 0, buf);
    /* header fields covered only by the tags, and the header tag itself */
    const int hdr_bytes[] = {14, 25, 24, 31, 32, 39, 80, 95};
    for (size_t i = 0; i < sizeof(hdr_bytes) / sizeof(hdr_bytes[0]); i++) {
        memcpy(bad, buf, len);
        bad[hdr_bytes[i]] ^= 0x01;
        REFUSED(&rx, bad, len, DEV_FR_TAMPERED_HEADER);
    }
    /* payload bytes: the start, the middle, the AEAD tag */
    const size_t pay_bytes[] = {DEV_FRAME_HDR_LEN, len / 2 + 40, len - 16, len - 1};
    for (size_t i = 0; i < sizeof(pay_bytes) / sizeof(pay_bytes[0]); i++) {
        memcpy(bad, buf, len);
        bad[pay_bytes[i]] ^= 0x80;
        REFUSED(&rx, bad, len, DEV_FR_TAMPERED_PAYLOAD);
    }
    /* header bytes checked before any tag: the specific reason wins */
    memcpy(bad, buf, len);
    bad[0] ^= 1;
    REFUSED(&rx, bad, len, DEV_FR_BAD_MAGIC);
    memcpy(bad, buf, len);
    bad[4] = 1;
    REFUSED(&rx, bad, len, DEV_FR_BAD_VERSION);
    memcpy(bad, buf, len);
    bad[79] ^= 0x80; /* aux on an activation */
    REFUSED(&rx, bad, len, DEV_FR_BAD_HEADER);
    /* the refusals consumed nothing: the genuine frame still goes through */
    ACCEPTED(&rx, buf, len);
    CHECK(rx.refused[DEV_FR_TAMPERED_HEADER] == 8 && rx.refused[DEV_FR_TAMPERED_PAYLOAD] == 4);
    sl_err err;
    dev_frame_hdr h;
    memcpy(bad, buf, len);
    bad[100] ^= 4;
    CHECK(dev_frame_decode(&rx, bad, len, &h, xout, 4096, &err) == -1 && err.code == SL_EAUTH);
    links_down(&tx, &rx);
}

static void test_replay_and_window(void)
{
    dev_link_cfg cfg = cfg_of(1, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    enum { N = 2100, FL = DEV_FRAME_HDR_LEN + 4 + DEV_FRAME_TAG_LEN };
    uint8_t *frames = sl_xmalloc((size_t)N * FL);
    for (int i = 0; i < N; i++)
        CHECK(send(&tx, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 1, 1, 0, frames + (size_t)i * FL) == FL);
#define F(i) (frames + (size_t)(i) * FL)
    ACCEPTED(&rx, F(0), FL);
    REFUSED(&rx, F(0), FL, DEV_FR_REPLAY);
    ACCEPTED(&rx, F(1500), FL);
    ACCEPTED(&rx, F(1000), FL);                      /* 500 behind: within the window */
    REFUSED(&rx, F(1000), FL, DEV_FR_REPLAY);
    REFUSED(&rx, F(1500 - DEV_WINDOW_SIZE), FL, DEV_FR_TOO_OLD);
    ACCEPTED(&rx, F(1500 - DEV_WINDOW_SIZE + 1), FL); /* the oldest still inside */
    REFUSED(&rx, F(1), FL, DEV_FR_TOO_OLD);
    ACCEPTED(&rx, F(2099), FL);
    REFUSED(&rx, F(1000), FL, DEV_FR_TOO_OLD);         /* slid out of the window */
    REFUSED(&rx, F(1500), FL, DEV_FR_REPLAY);
    ACCEPTED(&rx, F(2099 - DEV_WINDOW_SIZE + 1), FL);
    REFUSED(&rx, F(2099), FL, DEV_FR_REPLAY);
    links_down(&tx, &rx);

    /* against a naive model (a set of seen numbers and the newest), over
     * 20000 deliveries jittered around a moving point, with repeats */
    link_up(&tx, &rx, &cfg);
    for (int i = 0; i < N; i++)
        send(&tx, DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 1, 1, 0, F(i));
    uint8_t *seen = calloc(N, 1);
    long top = -1;
    int disagree = 0, accepted = 0;
    for (int i = 0; i < 20000; i++) {
        long base = (long)i * (N - 1) / 20000;
        long s = base + (long)(sl_rng_u32(SEED, 7, (uint64_t)i) % 2400) - 1200;
        s = s < 0 ? 0 : s >= N ? N - 1 : s;
        int want_ok = !seen[s] && (top < 0 || s > top || top - s < DEV_WINDOW_SIZE);
        dev_frame_hdr h;
        int ok = dev_frame_decode(&rx, F(s), FL, &h, xout, 1, NULL) == 0;
        disagree += ok != want_ok;
        if (ok) {
            seen[s] = 1;
            top = s > top ? s : top;
            accepted++;
        } else {
            disagree += rx.last != (seen[s] && top - s < DEV_WINDOW_SIZE ? DEV_FR_REPLAY : DEV_FR_TOO_OLD);
        }
    }
    CHECKF(disagree == 0, "%d decisions differ from the model", disagree);
    CHECK(accepted > 1000 && rx.refused[DEV_FR_REPLAY] > 1000 && rx.refused[DEV_FR_TOO_OLD] > 100);
#undef F
    free(seen);
    free(frames);
    links_down(&tx, &rx);
}

static void test_lengths(void)
{
    dev_link_cfg cfg = cfg_of(1, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    size_t len = send(&tx, DEV_CODEC_FP16, DEV_DIR_ACTIVATION, 8, 16, 0, buf);
    const size_t cuts[] = {0, 1, 40, DEV_FRAME_HDR_LEN - 1, DEV_FRAME_HDR_LEN, len / 2, len - 16, len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
        REFUSED(&rx, buf, cuts[i], DEV_FR_TRUNCATED);
    buf[len] = 0;
    REFUSED(&rx, buf, len + 1, DEV_FR_LENGTH_MISMATCH); /* trailing bytes */

    /* a header for 8x16 with only the bytes of a 4x16 tensor behind it */
    size_t small = DEV_FRAME_HDR_LEN + 4 * 16 * 2 + DEV_FRAME_TAG_LEN;
    sl_err err;
    dev_frame_hdr h;
    CHECK(dev_frame_decode(&rx, buf, small, &h, xout, 4096, &err) == -1);
    CHECKF(rx.last == DEV_FR_TRUNCATED && strstr(err.msg, "header claims 272 payload bytes, 144 arrived"),
           "%s", err.msg);
    /* payload_len that disagrees with codec and shape */
    memcpy(bad, buf, len);
    dev_st32(bad + 60, dev_ld32(bad + 60) + 4);
    REFUSED(&rx, bad, len + 4, DEV_FR_LENGTH_MISMATCH);
    ACCEPTED(&rx, buf, len);
    links_down(&tx, &rx);
}

static void test_oversized(void)
{
    dev_link_cfg cfg = cfg_of(1, 1024);
    dev_link_tx tx, big_tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    sl_err err;
    dev_frame_hdr h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 16, 16, 0);
    size_t len;
    /* the sender refuses what the receiver would */
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &len, &err) == -1 &&
          strstr(err.msg, "oversized"));
    dev_link_cfg big = cfg_of(1, 0);
    CHECK(dev_link_tx_init(&big_tx, &big, &key_a, key_b.pk, &err) == 0);
    h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 16, 16, 0);
    CHECK(dev_frame_encode(&big_tx, &h, xin, NULL, buf, CAP, &len, &err) == 0);
    REFUSED(&rx, buf, len, DEV_FR_OVERSIZED);
    /* a shape of 2^32 elements, whatever the payload */
    memcpy(bad, buf, len);
    dev_st32(bad + 40, 65536);
    dev_st32(bad + 44, 65536);
    REFUSED(&rx, bad, len, DEV_FR_OVERSIZED);
    /* the buffer cap: refused, not consumed */
    h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 8, 8, 0);
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &len, &err) == 0);
    dev_frame_hdr g;
    CHECK(dev_frame_decode(&rx, buf, len, &g, xout, 63, &err) == -1 && rx.last == DEV_FR_CAPACITY);
    CHECK(dev_frame_decode(&rx, buf, len, &g, xout, 64, &err) == 0);
    /* an output buffer too small on the sending side */
    h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 8, 8, 0);
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, 100, &len, &err) == -1);
    dev_link_tx_free(&big_tx);
    links_down(&tx, &rx);
}

/* Rewrites fields of a plain frame (no tags to break) to every malformed
 * value; each is refused for its own reason. */
static void test_malformed(void)
{
    dev_link_cfg cfg = cfg_of(0, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    size_t len = send(&tx, DEV_CODEC_NONE, DEV_DIR_GRADIENT, 4, 8, 0, buf);
    struct { int off, size; uint32_t val; int reason; } cases[] = {
        {0, 4, 0x52464c54u, DEV_FR_BAD_MAGIC},
        {4, 1, 0, DEV_FR_BAD_VERSION},
        {4, 1, 1, DEV_FR_BAD_VERSION},
        {4, 1, 2, DEV_FR_BAD_VERSION},
        {4, 1, 4, DEV_FR_BAD_VERSION},
        {4, 1, 255, DEV_FR_BAD_VERSION},
        {5, 1, 0x02, DEV_FR_BAD_HEADER},          /* unknown flag */
        {6, 1, 0, DEV_FR_BAD_HEADER},             /* direction */
        {6, 1, 9, DEV_FR_BAD_HEADER},
        {6, 1, 255, DEV_FR_BAD_HEADER},
        {6, 1, DEV_DIR_MASK, DEV_FR_BAD_HEADER},  /* f32 where i32 belongs */
        {6, 1, DEV_DIR_ABORT, DEV_FR_BAD_HEADER},
        {7, 1, DEV_CODEC_COUNT, DEV_FR_BAD_HEADER},
        {8, 1, 0, DEV_FR_BAD_HEADER},             /* dtype */
        {8, 1, DEV_DTYPE_I32, DEV_FR_BAD_HEADER}, /* i32 on a gradient */
        {8, 1, 5, DEV_FR_BAD_HEADER},
        {9, 1, 0, DEV_FR_BAD_SHAPE},              /* ndim */
        {9, 1, 5, DEV_FR_BAD_SHAPE},
        {9, 1, 1, DEV_FR_BAD_SHAPE},              /* dims[1] left beyond ndim */
        {40, 4, 0, DEV_FR_BAD_SHAPE},             /* zero dim */
        {44, 4, 0, DEV_FR_BAD_SHAPE},
        {48, 4, 1, DEV_FR_BAD_SHAPE},             /* stray dims[2] */
        {52, 4, 7, DEV_FR_BAD_SHAPE},             /* stray dims[3] */
        {56, 4, 3, DEV_FR_BAD_SHAPE},             /* k on codec none */
        {40, 4, 8, DEV_FR_LENGTH_MISMATCH},       /* 8x8 needs 256 bytes, 128 sent */
        {60, 4, 0xffffffffu, DEV_FR_OVERSIZED},
        {80, 1, 1, DEV_FR_BAD_HEADER},            /* header tag on a plain frame */
        {95, 1, 1, DEV_FR_BAD_HEADER},
        {68, 4, 1, DEV_FR_BAD_HEADER},            /* reserved */
        {71, 1, 0x80, DEV_FR_BAD_HEADER},
        {72, 8, 1, DEV_FR_BAD_HEADER},            /* aux on a gradient */
        {64, 4, 2, DEV_FR_EPOCH},
        {64, 4, 4, DEV_FR_EPOCH},
        {10, 2, 0, DEV_FR_MISROUTED},
        {12, 2, 3, DEV_FR_MISROUTED},
        {16, 8, 78, DEV_FR_MISROUTED},
        {5, 1, 0x01, DEV_FR_LENGTH_MISMATCH},     /* sealed flag: needs the tag bytes */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, buf, len);
        if (cases[i].size == 1)
            bad[cases[i].off] = (uint8_t)cases[i].val;
        else if (cases[i].size == 2)
            dev_st16(bad + cases[i].off, (uint16_t)cases[i].val);
        else if (cases[i].size == 4)
            dev_st32(bad + cases[i].off, cases[i].val);
        else
            dev_st64(bad + cases[i].off, cases[i].val);
        expect_refused(&rx, bad, len, cases[i].reason, 1000 + (int)i);
    }
    /* topk: k = 0, k > n, and topk on an activation */
    len = send(&tx, DEV_CODEC_TOPK, DEV_DIR_GRADIENT, 4, 8, 4, buf);
    memcpy(bad, buf, len);
    dev_st32(bad + 56, 0);
    REFUSED(&rx, bad, len, DEV_FR_BAD_SHAPE);
    dev_st32(bad + 56, 33);
    REFUSED(&rx, bad, len, DEV_FR_BAD_SHAPE);
    memcpy(bad, buf, len);
    bad[6] = DEV_DIR_ACTIVATION;
    REFUSED(&rx, bad, len, DEV_FR_BAD_HEADER);
    /* authentic-looking but invalid codec data (possible on a plain link) */
    memcpy(bad, buf, len);
    dev_st32(bad + DEV_FRAME_HDR_LEN + 4, dev_ld32(bad + DEV_FRAME_HDR_LEN));
    REFUSED(&rx, bad, len, DEV_FR_BAD_PAYLOAD);
    ACCEPTED(&rx, buf, len);
    /* the sender refuses topk on activations and bad shapes itself */
    sl_err err;
    dev_frame_hdr h = hdr_of(DEV_CODEC_TOPK, DEV_DIR_ACTIVATION, 4, 8, 4);
    size_t n;
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &n, &err) == -1);
    h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 0, 0);
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &n, &err) == -1);
    CHECK(dev_frame_max_len(&h) == 0);
    h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 4, 8, 0);
    h.dims[3] = 2;
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &n, &err) == -1);
    links_down(&tx, &rx);
}

static void test_links_and_keys(void)
{
    sl_err err;
    dev_link_cfg sealed = cfg_of(1, 0), plain = cfg_of(0, 0);
    dev_link_tx tx, ptx, btx;
    dev_link_rx rx, prx, brx;
    link_up(&tx, &rx, &sealed);
    link_up(&ptx, &prx, &plain);
    size_t len = send(&tx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 8, 0, buf);
    REFUSED(&prx, buf, len, DEV_FR_SEAL_MISMATCH);
    size_t plen = send(&ptx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 8, 0, bad);
    REFUSED(&rx, bad, plen, DEV_FR_SEAL_MISMATCH);

    /* both ends derive the same keys for one direction ... */
    CHECK(memcmp(tx.key, rx.key, 32) == 0 && memcmp(tx.hdr_key, rx.hdr_key, 32) == 0);
    CHECK(memcmp(tx.key, tx.hdr_key, 32) != 0);
    /* ... and different ones for the reverse direction on the same stages */
    CHECK(dev_link_tx_init(&btx, &sealed, &key_b, key_a.pk, &err) == 0);
    CHECK(memcmp(btx.key, tx.key, 32) != 0);
    len = send(&btx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 8, 0, buf);
    REFUSED(&rx, buf, len, DEV_FR_TAMPERED_HEADER); /* b's frame where a's is expected */
    dev_link_tx_free(&btx);

    /* wrong peer key, other epoch (refused before the tag), other stages, other job */
    len = send(&tx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 8, 0, buf);
    CHECK(dev_link_rx_init(&brx, &sealed, &key_b, key_c.pk, &err) == 0);
    REFUSED(&brx, buf, len, DEV_FR_TAMPERED_HEADER);
    dev_link_rx_free(&brx);
    dev_link_cfg other = sealed;
    other.epoch = 4;
    CHECK(dev_link_rx_init(&brx, &other, &key_b, key_a.pk, &err) == 0);
    REFUSED(&brx, buf, len, DEV_FR_EPOCH);
    dev_link_rx_free(&brx);
    other = sealed;
    other.to_stage = 3;
    CHECK(dev_link_rx_init(&brx, &other, &key_b, key_a.pk, &err) == 0);
    REFUSED(&brx, buf, len, DEV_FR_MISROUTED);
    dev_link_rx_free(&brx);
    ACCEPTED(&rx, buf, len);

    /* bad configurations */
    uint8_t zero[32] = {0};
    CHECK(dev_link_tx_init(&btx, &sealed, &key_a, zero, &err) == -1 && err.code == SL_EAUTH);
    CHECK(dev_link_rx_init(&brx, &sealed, &key_b, NULL, &err) == -1);
    other = sealed;
    other.to_stage = other.from_stage;
    CHECK(dev_link_tx_init(&btx, &other, &key_a, key_b.pk, &err) == -1);
    dev_kx_keypair fresh;
    CHECK(dev_kx_keypair_generate(&fresh, &err) == 0 && memcmp(fresh.pk, key_a.pk, 32) != 0);

    /* sequence numbers never wrap */
    tx.next_seq = UINT64_MAX;
    dev_frame_hdr h = hdr_of(DEV_CODEC_NONE, DEV_DIR_ACTIVATION, 1, 1, 0);
    CHECK(dev_frame_encode(&tx, &h, xin, NULL, buf, CAP, &len, &err) == -1 && err.code == SL_ESTATE);
    for (int r = 0; r < DEV_FR_NREASONS; r++)
        CHECK(strcmp(dev_frame_reason_name(r), "?") != 0);
    CHECK(strcmp(dev_frame_reason_name(DEV_FR_NREASONS), "?") == 0);
    links_down(&tx, &rx);
    links_down(&ptx, &prx);
}

/* SQLite-style fault injection: 10k sealed frames of every direction, each
 * damaged at random (bit flips, byte overwrites, truncation, extension,
 * splices of two frames); every one must be refused with a reason and
 * counted. Then the
 * same damage on plain frames, where some pass (nothing authenticates them)
 * but none may crash or read out of bounds (ASan build). */
static void test_fault_injection(void)
{
    for (int sealed = 1; sealed >= 0; sealed--) {
        dev_link_cfg cfg = cfg_of(sealed, 4096);
        dev_link_tx tx;
        dev_link_rx rx;
        link_up(&tx, &rx, &cfg);
        int not_refused = 0, reasons_seen = 0;
        size_t prev_len = 0;
        static uint8_t prev[CAP];
        for (uint64_t it = 0; it < 10000; it++) {
            uint32_t r0 = sl_rng_u32(SEED, 50, it * 8), r1 = sl_rng_u32(SEED, 50, it * 8 + 1);
            int codec = (int)(r0 % DEV_CODEC_COUNT);
            uint32_t d0 = 1 + r1 % 7, d1 = 1 + (r1 >> 8) % 17;
            uint32_t k = codec == DEV_CODEC_TOPK ? 1 + (r1 >> 16) % (d0 * d1) : 0;
            int dir = (int)(r1 >> 24) % 12; /* 5 in 12 other kinds, the rest f32 gradients */
            size_t len = dir >= DEV_DIR_MASK && dir <= DEV_DIR_ABORT && dir != DEV_DIR_TIED
                             ? send_any(&tx, dir, d0, d1, dir == DEV_DIR_LABELS ? it : 0, buf)
                             : send(&tx, codec, DEV_DIR_GRADIENT, d0, d1, k, buf);
            memcpy(bad, buf, len);
            size_t blen = len;
            uint32_t r2 = sl_rng_u32(SEED, 50, it * 8 + 2), r3 = sl_rng_u32(SEED, 50, it * 8 + 3);
            switch (r0 >> 28 & 7) {
            case 0: case 1: /* flip 1..4 bits */
                for (uint32_t f = 0; f <= (r3 & 3); f++) {
                    uint32_t r = sl_rng_u32(SEED, 51, it * 4 + f);
                    bad[r % len] ^= (uint8_t)(1u << (r >> 29));
                }
                break;
            case 2: /* overwrite a byte with a different value */
                bad[r2 % len] ^= (uint8_t)(1 + r3 % 255);
                break;
            case 3: case 4: /* truncate */
                blen = r2 % len;
                break;
            case 5: /* extend with random bytes */
                blen = len + 1 + r2 % 64;
                for (size_t i = len; i < blen; i++)
                    bad[i] = (uint8_t)sl_rng_u32(SEED, 52, it * 64 + i);
                break;
            case 6: /* the header flipped in one place, the payload in another */
                bad[r2 % DEV_FRAME_HDR_LEN] ^= 0x10;
                bad[DEV_FRAME_HDR_LEN + r3 % (len - DEV_FRAME_HDR_LEN)] ^= 0x10;
                break;
            default: /* this frame's header on the previous frame's payload */
                if (prev_len > DEV_FRAME_HDR_LEN) {
                    memcpy(bad + DEV_FRAME_HDR_LEN, prev + DEV_FRAME_HDR_LEN, prev_len - DEV_FRAME_HDR_LEN);
                    blen = prev_len;
                    if (blen == len && memcmp(bad, buf, len) == 0)
                        bad[len - 1] ^= 1; /* identical payloads: damage it anyway */
                } else {
                    blen = len - 1;
                }
                break;
            }
            if (blen == len && memcmp(bad, buf, len) == 0)
                bad[len - 1] ^= 0x40; /* flips that cancelled out */
            if (!sealed) /* a damaged seq that got through would make all later ones too old */
                rx.have_top = 0;
            dev_frame_hdr h;
            sl_err err;
            int rc = dev_frame_decode_any(&rx, bad, blen, &h, dout, sizeof(dout), &err);
            if (rc == 0 || rx.last == DEV_FR_OK || rx.last == DEV_FR_CAPACITY)
                not_refused++;
            memcpy(prev, buf, len);
            prev_len = len;
        }
        uint64_t total = 0;
        for (int r = 0; r < DEV_FR_NREASONS; r++) {
            total += rx.refused[r];
            reasons_seen += rx.refused[r] > 0;
        }
        if (sealed) {
            CHECKF(not_refused == 0, "%d damaged sealed frames were not refused", not_refused);
            CHECK(total == 10000 && rx.frames == 0);
            CHECKF(reasons_seen >= 8, "only %d distinct reasons", reasons_seen);
        } else {
            printf("plain frames: %llu of 10000 damaged ones refused, %d reasons\n",
                   (unsigned long long)total, reasons_seen);
            CHECK(total + rx.frames == 10000 && total > 3000 && rx.frames > 1000);
        }
        links_down(&tx, &rx);
    }
}

int main(void)
{
    make_keys();
    RUN(test_round_trip);
    RUN(test_layout);
    RUN(test_kind_rules);
    RUN(test_kind_round_trips);
    RUN(test_dtype_capacity);
    RUN(test_aux_and_abort);
    RUN(test_epochs);
    RUN(test_tampered);
    RUN(test_replay_and_window);
    RUN(test_lengths);
    RUN(test_oversized);
    RUN(test_malformed);
    RUN(test_links_and_keys);
    RUN(test_fault_injection);
    return sl_test_done();
}
