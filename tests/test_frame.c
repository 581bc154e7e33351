/* Frames: header round trips over every codec, sealed and plain; each way a
 * frame can be refused, with its exact reason and counter; the receive
 * window against a naive model; keys per direction; and 10k random faults
 * injected into sealed frames, every one refused cleanly. */
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
    for (size_t i = 0; i < 4096; i++)
        xin[i] = sl_rng_normal(SEED, 0, i);
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

/* Decoding in[0..len) is refused for `reason`, counted, and named in the message. */
static void expect_refused(dev_link_rx *rx, const uint8_t *in, size_t len, int reason, int line)
{
    dev_frame_hdr h;
    sl_err err = {0};
    uint64_t before = rx->refused[reason], frames = rx->frames;
    int rc = dev_frame_decode(rx, in, len, &h, xout, 4096, &err);
    CHECKF(rc == -1 && rx->last == reason, "line %d: rc %d, reason %s, wanted %s (%s)", line, rc,
           dev_frame_reason_name(rx->last), dev_frame_reason_name(reason), err.msg);
    CHECKF(rx->refused[reason] == before + 1, "line %d: counter", line);
    CHECK(rx->frames == frames);
    CHECKF(strstr(err.msg, dev_frame_reason_name(reason)) != NULL, "line %d: message '%s'", line,
           err.msg);
}
#define REFUSED(rx, in, len, reason) expect_refused(rx, in, len, reason, __LINE__)

static void expect_ok(dev_link_rx *rx, const uint8_t *in, size_t len, int line)
{
    dev_frame_hdr h;
    sl_err err = {0};
    int rc = dev_frame_decode(rx, in, len, &h, xout, 4096, &err);
    CHECKF(rc == 0 && rx->last == DEV_FR_OK, "line %d: %s", line, err.msg);
}
#define ACCEPTED(rx, in, len) expect_ok(rx, in, len, __LINE__)

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
            CHECK(dev_ld32(buf) == DEV_FRAME_MAGIC && buf[0] == 'S' && buf[3] == 'R');
            memset(xout, 0xff, sizeof(xout));
            CHECKF(dev_frame_decode(&rx, buf, len, &g, xout, 96, &err) == 0, "%s", err.msg);
            CHECK(dev_frame_hdr_equal(&g, &h));
            g.dims[3] = 1;
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

static void test_tampered(void)
{
    dev_link_cfg cfg = cfg_of(1, 0);
    dev_link_tx tx;
    dev_link_rx rx;
    link_up(&tx, &rx, &cfg);
    size_t len = send(&tx, DEV_CODEC_INT8, DEV_DIR_ACTIVATION, 4, 32, 0, buf);
    /* header fields covered only by the tags, and the header tag itself */
    const int hdr_bytes[] = {14, 25, 24, 31, 32, 39, 64, 79};
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
    bad[4] = 2;
    REFUSED(&rx, bad, len, DEV_FR_BAD_VERSION);
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
        {4, 1, 255, DEV_FR_BAD_VERSION},
        {5, 1, 0x02, DEV_FR_BAD_HEADER},          /* unknown flag */
        {6, 1, 0, DEV_FR_BAD_HEADER},             /* direction */
        {6, 1, 3, DEV_FR_BAD_HEADER},
        {7, 1, DEV_CODEC_COUNT, DEV_FR_BAD_HEADER},
        {8, 1, 2, DEV_FR_BAD_HEADER},             /* dtype */
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
        {64, 1, 1, DEV_FR_BAD_HEADER},            /* header tag on a plain frame */
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

    /* wrong peer key, other epoch, other stages, other job */
    len = send(&tx, DEV_CODEC_BF16, DEV_DIR_ACTIVATION, 2, 8, 0, buf);
    CHECK(dev_link_rx_init(&brx, &sealed, &key_b, key_c.pk, &err) == 0);
    REFUSED(&brx, buf, len, DEV_FR_TAMPERED_HEADER);
    dev_link_rx_free(&brx);
    dev_link_cfg other = sealed;
    other.epoch = 4;
    CHECK(dev_link_rx_init(&brx, &other, &key_b, key_a.pk, &err) == 0);
    REFUSED(&brx, buf, len, DEV_FR_TAMPERED_HEADER);
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

/* SQLite-style fault injection: 10k sealed frames, each damaged at random
 * (bit flips, byte overwrites, truncation, extension, splices of two
 * frames); every one must be refused with a reason and counted. Then the
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
            size_t len = send(&tx, codec, DEV_DIR_GRADIENT, d0, d1, k, buf);
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
            int rc = dev_frame_decode(&rx, bad, blen, &h, xout, 4096, &err);
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
    RUN(test_tampered);
    RUN(test_replay_and_window);
    RUN(test_lengths);
    RUN(test_oversized);
    RUN(test_malformed);
    RUN(test_links_and_keys);
    RUN(test_fault_injection);
    return sl_test_done();
}
