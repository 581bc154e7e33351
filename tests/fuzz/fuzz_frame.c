/* fuzz_frame.c - libFuzzer target for the frame decoder and opener.
 *
 * The first input byte picks a mode (byte % 4; mode 3 splits on bit 2):
 *   0  the rest is a frame for a plain link: decode it with decode_any and
 *      with the f32 decode (nothing may crash; an accepted frame fits the
 *      buffer; the two agree: the f32 one refuses exactly the other dtypes)
 *   1  the rest is a frame for a sealed link: decode it; it must be refused,
 *      as the fuzzer does not hold the key
 *   2  the rest describes an f32 tensor (codec, shape, k, values); encode it,
 *      decode it, check each codec's promise, then damage the frame where the
 *      input says and decode again: a sealed frame must be refused
 *   3  bit 2 clear: dev_frame_parse_header alone
 *      bit 2 set: the rest describes a frame of another kind (tied, mask,
 *      labels, gather, gather result, abort: dtype, shape, aux, elements);
 *      encode_any, decode_any bit for bit, refused on a link of another
 *      epoch and by the f32 decode, then damaged as in mode 2
 * Any broken property aborts, which libFuzzer reports as a crash.
 *
 * Built with -DFUZZ_FRAME_SEEDS this file is `frame_seeds DIR [--check]`,
 * which writes the seed corpus (tests/fuzz/corpus/frame/) for the links
 * below: valid plain frames of every kind (mode 0 and 3), sealed frames
 * under another key pair or epoch (mode 1: they get as far as the tag or
 * the epoch), tensor descriptions (modes 2 and 3). --check compares DIR
 * with what it would write (the test fuzz-seeds-frame), so a format change
 * that makes the seeds shallow fails until they are written again:
 *     build/tests/fuzz/frame_seeds tests/fuzz/corpus/frame */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_codec_hd.h"
#include "dev_frame.h"

#define CAPF (1u << 16)
#define FRAME_CAP (DEV_FRAME_HDR_LEN + 8u * CAPF + DEV_FRAME_TAG_LEN)
#define JOB 5
#define EPOCH 1

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
static dev_link_rx rx[2], rx_other_epoch[2];
/* aligned for every dtype: decode_any writes f64 frames into out_vals */
static _Alignas(8) float in_vals[CAPF], out_vals[CAPF], f32_vals[CAPF];
static uint8_t frame[FRAME_CAP];

static dev_link_cfg link_cfg(int sealed, uint32_t epoch)
{
    dev_link_cfg cfg = {.job_id = JOB, .epoch = epoch, .from_stage = 0, .to_stage = 1,
                        .sealed = sealed, .max_payload = FRAME_CAP};
    return cfg;
}

static void keypair(dev_kx_keypair *kp, uint8_t fill)
{
    uint8_t seed[32];
    sl_err err;
    memset(seed, fill, sizeof(seed));
    REQUIRE(dev_kx_keypair_from_seed(kp, seed, &err) == 0);
}

static void setup(void)
{
    static int done;
    if (done)
        return;
    sl_err err;
    keypair(&ka, 1);
    keypair(&kb, 2);
    for (int sealed = 0; sealed <= 1; sealed++) {
        dev_link_cfg cfg = link_cfg(sealed, EPOCH), other = link_cfg(sealed, EPOCH + 1);
        REQUIRE(dev_link_tx_init(&tx[sealed], &cfg, &ka, kb.pk, &err) == 0);
        REQUIRE(dev_link_rx_init(&rx[sealed], &cfg, &kb, ka.pk, &err) == 0);
        REQUIRE(dev_link_rx_init(&rx_other_epoch[sealed], &other, &kb, ka.pk, &err) == 0);
    }
    done = 1;
}

static void decode_raw(int sealed, const uint8_t *data, size_t size)
{
    dev_frame_hdr h, g;
    sl_err err;
    dev_link_rx *r = &rx[sealed];
    r->have_top = 0; /* stateless: each input stands alone */
    int rc = dev_frame_decode_any(r, data, size, &h, out_vals, sizeof(out_vals), &err);
    int why = r->last;
    REQUIRE((rc == 0) == (why == DEV_FR_OK));
    REQUIRE(why >= 0 && why < DEV_FR_NREASONS);
    if (sealed)
        REQUIRE(rc == -1);
    if (rc == 0)
        REQUIRE(dev_frame_elems(&h) >= 1 &&
                dev_frame_elems(&h) * dev_frame_dtype_size(h.dtype) <= sizeof(out_vals) &&
                (size_t)DEV_FRAME_HDR_LEN + h.payload_len == size && h.epoch == EPOCH);
    /* the f32 decode: the same answer for f32 frames, a bad header for the rest */
    int parsed = dev_frame_parse_header(data, size, FRAME_CAP, &g, NULL, NULL) == 0;
    r->have_top = 0;
    int rc32 = dev_frame_decode(r, data, size, &g, f32_vals, CAPF, &err);
    if (parsed && g.dtype != DEV_DTYPE_F32) {
        REQUIRE(rc32 == -1 && r->last == DEV_FR_BAD_HEADER);
    } else {
        REQUIREF(rc32 == rc && r->last == why, "any: %d %s, f32: %d %s", rc,
                 dev_frame_reason_name(why), rc32, dev_frame_reason_name(r->last));
        if (rc == 0)
            REQUIRE(memcmp(out_vals, f32_vals, 4 * dev_frame_elems(&h)) == 0);
    }
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

/* Every element of a d0 x d1 tensor sent with codec (not topk). */
static void check_tensor(int codec, uint32_t d0, uint32_t d1)
{
    for (uint32_t r = 0; r < d0; r++) {
        float amax = 0;
        for (uint32_t j = 0; j < d1; j++)
            amax = fmaxf(amax, fabsf(in_vals[r * d1 + j]));
        float scale = dev_q8_scale(amax);
        for (uint32_t j = 0; j < d1; j++)
            check_element(codec, in_vals[r * d1 + j], out_vals[r * d1 + j], scale, amax);
    }
}

/* Only int8 and topk refuse input, and only non-finite input. */
static void check_encode_refusal(int codec, size_t n)
{
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(in_vals[i]);
    REQUIRE((codec == DEV_CODEC_INT8 || codec == DEV_CODEC_TOPK) && !finite);
}

/* Damages one byte of frame[0..len): a sealed frame must be refused, a
 * plain one must not crash. */
static void damage(int sealed, size_t len, uint32_t pos, uint8_t x)
{
    dev_frame_hdr g;
    sl_err err;
    if (x == 0)
        return;
    frame[pos % len] ^= x;
    rx[sealed].have_top = 0;
    int rc = dev_frame_decode_any(&rx[sealed], frame, len, &g, out_vals, sizeof(out_vals), &err);
    if (sealed)
        REQUIRE(rc == -1 && rx[sealed].last != DEV_FR_OK);
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
        check_encode_refusal(codec, n);
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
        check_tensor(codec, d0, d1);
    }
    damage(sealed, len, mut_pos, mut_xor);
}

static const uint8_t other_kinds[] = {DEV_DIR_TIED,   DEV_DIR_MASK,          DEV_DIR_LABELS,
                                      DEV_DIR_GATHER, DEV_DIR_GATHER_RESULT, DEV_DIR_ABORT};

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
        return DEV_DTYPE_U8;
    }
    return DEV_DTYPE_F32;
}

/* Input: [sealed | kind << 1 | tied codec << 4] [d0] [d1] [aux, 8] [mut_pos, 4]
 * [mut_xor] then the elements' bytes (zeros past the end). */
static void kind_round_trip(const uint8_t *data, size_t size)
{
    if (size < 16)
        return;
    int sealed = data[0] & 1;
    int dir = other_kinds[(data[0] >> 1 & 7) % sizeof(other_kinds)];
    int dtype = dtype_of(dir);
    int codec = dir == DEV_DIR_TIED ? (data[0] >> 4) % 4 : DEV_CODEC_NONE; /* not topk */
    uint32_t d0 = 1 + data[1] % 64, d1 = 1 + data[2] % 64;
    uint64_t aux = 0;
    for (int i = 0; i < 8; i++)
        aux |= (uint64_t)data[3 + i] << (8 * i);
    if (dir == DEV_DIR_TIED || dir == DEV_DIR_ABORT || dir == DEV_DIR_MASK)
        aux = 0;
    uint32_t mut_pos = rd32(data, size, 11);
    uint8_t mut_xor = data[15];
    data += 16;
    size -= 16;
    dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = (uint8_t)codec, .dtype = (uint8_t)dtype,
                       .step = 2, .microbatch = 3, .ndim = 2, .dims = {d0, d1}, .aux = aux};
    if (dir == DEV_DIR_ABORT)
        h.ndim = 1, h.dims[0] = 1 + (d0 * d1 - 1) % DEV_FRAME_ABORT_MAX, h.dims[1] = 0;
    size_t n = dev_frame_elems(&h), bytes = n * dev_frame_dtype_size(dtype);
    uint8_t *in = (uint8_t *)in_vals;
    memset(in, 0, bytes);
    memcpy(in, data, size < bytes ? size : bytes);

    size_t len;
    sl_err err = {0};
    if (dev_frame_encode_any(&tx[sealed], &h, in, NULL, frame, FRAME_CAP, &len, &err) < 0) {
        if (dir == DEV_DIR_ABORT) {
            int ascii = 1;
            for (size_t i = 0; i < n; i++)
                ascii &= in[i] < 0x80;
            REQUIREF(!ascii && err.code == SL_EINVAL && strstr(err.msg, "UTF-8"), "%s", err.msg);
        } else {
            REQUIREF(dir == DEV_DIR_TIED, "%s", err.msg);
            check_encode_refusal(codec, n);
        }
        return;
    }
    REQUIRE(len <= dev_frame_max_len(&h));
    if (codec == DEV_CODEC_NONE)
        REQUIRE(len == DEV_FRAME_HDR_LEN + bytes + (sealed ? DEV_FRAME_TAG_LEN : 0));
    dev_frame_hdr g;
    rx_other_epoch[sealed].have_top = 0;
    REQUIRE(dev_frame_decode_any(&rx_other_epoch[sealed], frame, len, &g, out_vals, bytes, &err) ==
                -1 &&
            rx_other_epoch[sealed].last == DEV_FR_EPOCH);
    if (dtype != DEV_DTYPE_F32) {
        memset(out_vals, 0xa5, 4);
        rx[sealed].have_top = 0;
        REQUIRE(dev_frame_decode(&rx[sealed], frame, len, &g, out_vals, CAPF, &err) == -1 &&
                rx[sealed].last == DEV_FR_BAD_HEADER && dev_ld32((uint8_t *)out_vals) == 0xa5a5a5a5u);
    }
    rx[sealed].have_top = 0;
    REQUIRE(dev_frame_decode_any(&rx[sealed], frame, len, &g, out_vals, bytes - 1, &err) == -1 &&
            rx[sealed].last == DEV_FR_CAPACITY);
    REQUIREF(dev_frame_decode_any(&rx[sealed], frame, len, &g, out_vals, bytes, &err) == 0, "%s",
             err.msg);
    REQUIRE(dev_frame_hdr_equal(&g, &h) && g.aux == aux && g.epoch == EPOCH);
    if (dtype == DEV_DTYPE_F32)
        check_tensor(codec, d0, d1);
    else
        REQUIRE(memcmp(out_vals, in, bytes) == 0);
    damage(sealed, len, mut_pos, mut_xor);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0)
        return 0;
    int mode = data[0] % 4, kinds = data[0] & 4;
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
    default:
        if (kinds) {
            kind_round_trip(data, size);
        } else {
            dev_frame_hdr h;
            int reason = -1;
            int rc = dev_frame_parse_header(data, size, 0, &h, &reason, NULL);
            REQUIRE((rc == 0) == (reason == DEV_FR_OK));
        }
        break;
    }
    return 0;
}

#ifdef FUZZ_FRAME_SEEDS
#include <dirent.h>

typedef struct seed {
    char name[64];
    uint8_t *bytes;
    size_t len;
} seed;

static seed seeds[256];
static int nseeds;

static void add_seed(const char *name, uint8_t mode, const uint8_t *body, size_t len)
{
    REQUIRE(nseeds < (int)(sizeof(seeds) / sizeof(seeds[0])));
    seed *s = &seeds[nseeds++];
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->bytes = malloc(len + 1);
    REQUIRE(s->bytes != NULL);
    s->bytes[0] = mode;
    memcpy(s->bytes + 1, body, len);
    s->len = len + 1;
}

/* A frame of kind dir/codec on t into frame[], with inputs that every codec
 * and dtype accepts (small finite floats, ASCII). */
static size_t encode_seed(dev_link_tx *t, int dir, int codec)
{
    static const char text[] = "stage 1 stopped: out of memory";
    uint32_t d0 = 2, d1 = 8;
    dev_frame_hdr h = {.direction = (uint8_t)dir, .codec = (uint8_t)codec,
                       .dtype = (uint8_t)dtype_of(dir), .step = 7, .microbatch = 1, .ndim = 2,
                       .dims = {d0, d1}, .k = codec == DEV_CODEC_TOPK ? 3 : 0};
    if (dir == DEV_DIR_LABELS || dir == DEV_DIR_GATHER)
        h.aux = 40 + (uint64_t)dir;
    static int32_t ints[16];
    static double doubles[16];
    const void *data = in_vals;
    for (uint32_t i = 0; i < d0 * d1; i++) {
        in_vals[i] = (float)i * 0.25f - 1.5f;
        ints[i] = i % 3 == 0 ? -100 : (int32_t)i;
        doubles[i] = 1.0 / (i + 1);
    }
    if (h.dtype == DEV_DTYPE_I32)
        data = ints;
    if (h.dtype == DEV_DTYPE_F64)
        data = doubles;
    if (dir == DEV_DIR_ABORT) {
        h.ndim = 1, h.dims[0] = sizeof(text) - 1, h.dims[1] = 0;
        data = text;
    }
    size_t len;
    sl_err err;
    REQUIREF(dev_frame_encode_any(t, &h, data, NULL, frame, FRAME_CAP, &len, &err) == 0, "%s",
             err.msg);
    return len;
}

static const char *const dir_names[] = {"?", "activation", "gradient", "mask", "labels", "tied",
                                        "gather", "gather-result", "abort"};

static void make_seeds(void)
{
    static const char *const codec_names[] = {"none", "fp16", "bf16", "int8", "topk"};
    char name[64];
    sl_err err;
    /* sealed frames the fuzzer cannot forge: another sender's keys (refused
     * at the header tag) and another epoch (refused before it) */
    dev_kx_keypair stranger;
    keypair(&stranger, 3);
    dev_link_cfg sc = link_cfg(1, EPOCH), oc = link_cfg(1, EPOCH + 1);
    dev_link_tx stx, otx;
    REQUIRE(dev_link_tx_init(&stx, &sc, &stranger, kb.pk, &err) == 0);
    REQUIRE(dev_link_tx_init(&otx, &oc, &ka, kb.pk, &err) == 0);
    for (int dir = DEV_DIR_ACTIVATION; dir <= DEV_DIR_ABORT; dir++) {
        int f32 = dtype_of(dir) == DEV_DTYPE_F32;
        for (int codec = 0; codec < (f32 ? DEV_CODEC_COUNT : 1); codec++) {
            if (codec == DEV_CODEC_TOPK && dir != DEV_DIR_GRADIENT)
                continue;
            const char *suffix = f32 ? codec_names[codec] : "";
            size_t len = encode_seed(&tx[0], dir, codec);
            snprintf(name, sizeof(name), "plain-%s%s%s", dir_names[dir], f32 ? "-" : "", suffix);
            add_seed(name, 0, frame, len);
            snprintf(name, sizeof(name), "parse-%s%s%s", dir_names[dir], f32 ? "-" : "", suffix);
            add_seed(name, 3, frame, len);
            len = encode_seed(&stx, dir, codec);
            snprintf(name, sizeof(name), "sealed-stranger-%s%s%s", dir_names[dir], f32 ? "-" : "",
                     suffix);
            add_seed(name, 1, frame, len);
        }
        size_t len = encode_seed(&otx, dir, DEV_CODEC_NONE);
        snprintf(name, sizeof(name), "sealed-other-epoch-%s", dir_names[dir]);
        add_seed(name, 1, frame, len);
    }
    dev_link_tx_free(&stx);
    dev_link_tx_free(&otx);
    /* tensor descriptions: mode 2 (f32, each codec) and mode 3 (other kinds) */
    uint8_t body[16 + 4 * 64];
    for (int i = 0; i < (int)sizeof(body); i++)
        body[i] = (uint8_t)(0x3c + i * 7);
    for (int codec = 0; codec < DEV_CODEC_COUNT; codec++)
        for (int sealed = 0; sealed <= 1; sealed++) {
            uint8_t t[12 + 4 * 32] = {(uint8_t)(sealed | codec << 1), 3, 9, 5, 0, 0, 0, 77, 0, 0, 0,
                                      0x10};
            for (int i = 0; i < 32; i++)
                dev_st32(t + 12 + 4 * i, sl_f32_bits((float)(i - 11) * 0.37f));
            snprintf(name, sizeof(name), "tensor-%s-%s", codec_names[codec],
                     sealed ? "sealed" : "plain");
            add_seed(name, 2, t, sizeof(t));
        }
    for (int kind = 0; kind < (int)sizeof(other_kinds); kind++)
        for (int sealed = 0; sealed <= 1; sealed++) {
            body[0] = (uint8_t)(sealed | kind << 1 | 3 << 4);
            body[1] = 3;
            body[2] = 4;
            body[15] = 0x20;
            if (other_kinds[kind] == DEV_DIR_ABORT)
                for (int i = 16; i < (int)sizeof(body); i++)
                    body[i] = (uint8_t)('a' + i % 26);
            snprintf(name, sizeof(name), "kind-%s-%s", dir_names[other_kinds[kind]],
                     sealed ? "sealed" : "plain");
            add_seed(name, 7, body, sizeof(body));
        }
}

static int same_file(const char *path, const seed *s)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    static uint8_t buf[FRAME_CAP];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    return n == s->len && memcmp(buf, s->bytes, n) == 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (argc == 3 && strcmp(argv[2], "--check") != 0) || argc > 3) {
        fprintf(stderr, "usage: frame_seeds DIR [--check]\n");
        return 2;
    }
    int check = argc == 3;
    setup();
    make_seeds();
    char path[4096];
    int bad = 0;
    for (int i = 0; i < nseeds; i++) {
        /* a seed breaks no property and gets as far as it should */
        const char *name = seeds[i].name;
        uint64_t accepted = rx[0].frames, forged = rx[1].refused[DEV_FR_TAMPERED_HEADER],
                 epoch = rx[1].refused[DEV_FR_EPOCH];
        LLVMFuzzerTestOneInput(seeds[i].bytes, seeds[i].len);
        if (strncmp(name, "plain-", 6) == 0)
            REQUIREF(rx[0].frames > accepted, "%s: not accepted", name);
        if (strncmp(name, "sealed-stranger-", 16) == 0)
            REQUIREF(rx[1].refused[DEV_FR_TAMPERED_HEADER] > forged, "%s: not at the tag", name);
        if (strncmp(name, "sealed-other-epoch-", 19) == 0)
            REQUIREF(rx[1].refused[DEV_FR_EPOCH] > epoch, "%s: not at the epoch", name);
        if (snprintf(path, sizeof(path), "%s/%s", argv[1], name) >= (int)sizeof(path)) {
            fprintf(stderr, "frame_seeds: path too long\n");
            return 2;
        }
        if (check) {
            if (!same_file(path, &seeds[i])) {
                fprintf(stderr, "frame_seeds: %s is missing or stale\n", path);
                bad++;
            }
            continue;
        }
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(seeds[i].bytes, 1, seeds[i].len, f) != seeds[i].len || fclose(f) != 0) {
            fprintf(stderr, "frame_seeds: cannot write %s\n", path);
            return 1;
        }
    }
    if (check) {
        DIR *d = opendir(argv[1]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            int known = e->d_name[0] == '.';
            for (int i = 0; i < nseeds && !known; i++)
                known = strcmp(e->d_name, seeds[i].name) == 0;
            if (!known) {
                fprintf(stderr, "frame_seeds: %s/%s is not a seed this version makes\n", argv[1],
                        e->d_name);
                bad++;
            }
        }
        if (d)
            closedir(d);
        if (bad)
            fprintf(stderr, "frame_seeds: write them again: frame_seeds %s\n", argv[1]);
    }
    printf("%d seeds %s\n", nseeds, check ? (bad ? "differ" : "up to date") : "written");
    return bad ? 1 : 0;
}
#endif
