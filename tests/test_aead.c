/* dev_aead against libsodium's crypto_aead_xchacha20poly1305_ietf_*_detached:
 * ciphertext and tag bit-identical on random keys, nonces, associated data
 * and lengths, each side opening the other's output; forgeries refused with
 * the plaintext wiped; every OpenSSL call made to fail in turn; sealed frames
 * opened by libsodium itself (the wire format did not change). */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dev_aead.h"
#include "dev_frame.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_test.h"

#define SEED 0xae4dull
#define BIG ((size_t)4 * 1024 * 1024 + 3)

static uint64_t draw; /* next stream of random words */

static void random_bytes(uint8_t *p, size_t n)
{
    uint64_t stream = draw++;
    size_t words = n / 4;
    uint32_t tail;
    uint32_t *w = sl_xmalloc((words + 1) * sizeof(uint32_t));
    sl_rng_fill_u32(SEED, stream, 0, words + 1, w);
    memcpy(p, w, words * 4);
    tail = w[words];
    memcpy(p + words * 4, &tail, n % 4);
    free(w);
}

static int all_zero(const uint8_t *p, size_t n)
{
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= p[i];
    return any == 0;
}

/* Buffers of the largest length, shared by the cases. */
static uint8_t *m, *c1, *c2, *p;

static void cross_check(dev_aead *a, size_t len, size_t adlen)
{
    uint8_t key[32], nonce[24], ad[128], tag1[16], tag2[16];
    sl_err err = {0};
    random_bytes(key, sizeof(key));
    random_bytes(nonce, sizeof(nonce));
    random_bytes(ad, adlen);
    random_bytes(m, len);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c1, tag1, NULL, m, len, ad, adlen, NULL,
                                                        nonce, key);
    CHECKF(dev_aead_seal(a, c2, tag2, m, len, ad, adlen, nonce, key, &err) == 0, "%s", err.msg);
    CHECKF(memcmp(c1, c2, len) == 0 && memcmp(tag1, tag2, 16) == 0,
           "len %zu adlen %zu: output differs from libsodium's", len, adlen);
    /* each opens the other's */
    memset(p, 0xee, len);
    CHECKF(dev_aead_open(a, p, c1, len, tag1, ad, adlen, nonce, key, &err) == 0, "%s", err.msg);
    CHECK(memcmp(p, m, len) == 0);
    memset(p, 0xee, len);
    CHECK(crypto_aead_xchacha20poly1305_ietf_decrypt_detached(p, NULL, c2, len, tag2, ad, adlen,
                                                              nonce, key) == 0);
    CHECK(memcmp(p, m, len) == 0);
    /* in place */
    memcpy(p, m, len);
    CHECK(dev_aead_seal(a, p, tag2, p, len, ad, adlen, nonce, key, &err) == 0);
    CHECK(memcmp(p, c1, len) == 0 && memcmp(tag1, tag2, 16) == 0);
    CHECK(dev_aead_open(a, p, p, len, tag2, ad, adlen, nonce, key, &err) == 0);
    CHECK(memcmp(p, m, len) == 0);
}

static void test_cross_check(void)
{
    static const size_t lens[] = {0, 1, 63, 64, 65, 4096, BIG};
    dev_aead a;
    sl_err err = {0};
    CHECKF(dev_aead_init(&a, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        int trials = lens[i] == BIG ? 2 : 8;
        for (int t = 0; t < trials; t++) {
            uint8_t r;
            random_bytes(&r, 1);
            size_t adlen = t == 0 ? 0 : t == 1 ? 64 : r % 128; /* 64: a frame header */
            cross_check(&a, lens[i], adlen);
        }
    }
    dev_aead_free(&a);
    dev_aead_free(&a); /* twice is fine */
}

/* Opening (c, tag) under (ad, nonce, key) is refused as a forgery and the
 * output wiped. */
static void expect_forged(dev_aead *a, const uint8_t *c, size_t len, const uint8_t tag[16],
                          const uint8_t *ad, size_t adlen, const uint8_t nonce[24],
                          const uint8_t key[32], int line)
{
    sl_err err = {0};
    memset(p, 0xee, len);
    int rc = dev_aead_open(a, p, c, len, tag, ad, adlen, nonce, key, &err);
    CHECKF(rc == -1 && err.code == SL_EAUTH, "line %d: rc %d code %d", line, rc, err.code);
    CHECKF(all_zero(p, len), "line %d: unverified plaintext left in the output", line);
    CHECKF(crypto_aead_xchacha20poly1305_ietf_decrypt_detached(p, NULL, c, len, tag, ad, adlen,
                                                               nonce, key) != 0,
           "line %d: libsodium accepts it", line);
}
#define FORGED(c, len, tag, ad, adlen, nonce, key) \
    expect_forged(&a, c, len, tag, ad, adlen, nonce, key, __LINE__)

static void test_tampered(void)
{
    static const size_t lens[] = {0, 1, 65, 4096};
    dev_aead a;
    sl_err err = {0};
    CHECK(dev_aead_init(&a, &err) == 0);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        size_t len = lens[i];
        uint8_t key[32], nonce[24], ad[64], tag[16], x[32];
        random_bytes(key, 32);
        random_bytes(nonce, 24);
        random_bytes(ad, 64);
        random_bytes(m, len);
        CHECK(dev_aead_seal(&a, c1, tag, m, len, ad, 64, nonce, key, &err) == 0);
        for (int bit = 0; bit < 128; bit += 37) { /* tag */
            tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            FORGED(c1, len, tag, ad, 64, nonce, key);
            tag[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        for (int at = 0; at < 64; at += 21) { /* associated data */
            ad[at] ^= 0x80;
            FORGED(c1, len, tag, ad, 64, nonce, key);
            ad[at] ^= 0x80;
        }
        FORGED(c1, len, tag, ad, 63, nonce, key); /* shorter associated data */
        if (len > 0) { /* ciphertext: first, last byte */
            c1[0] ^= 1;
            FORGED(c1, len, tag, ad, 64, nonce, key);
            c1[0] ^= 1;
            c1[len - 1] ^= 0x40;
            FORGED(c1, len, tag, ad, 64, nonce, key);
            c1[len - 1] ^= 0x40;
            FORGED(c1, len - 1, tag, ad, 64, nonce, key); /* truncated */
        }
        /* nonce: the HChaCha20 part and the IETF part; key */
        memcpy(x, nonce, 24);
        x[3] ^= 1;
        FORGED(c1, len, tag, ad, 64, x, key);
        memcpy(x, nonce, 24);
        x[20] ^= 1;
        FORGED(c1, len, tag, ad, 64, x, key);
        memcpy(x, key, 32);
        x[31] ^= 1;
        FORGED(c1, len, tag, ad, 64, nonce, x);
        /* untouched, it still opens */
        CHECK(dev_aead_open(&a, p, c1, len, tag, ad, 64, nonce, key, &err) == 0);
        CHECK(memcmp(p, m, len) == 0);
    }
    dev_aead_free(&a);
}

/* Every OpenSSL call of init, seal and open made to fail in turn: an error
 * (SL_EINTERNAL, or SL_EAUTH where OpenSSL itself cannot tell: the final tag
 * check), no crash, the output wiped, and the context usable afterwards. */
static void test_openssl_faults(void)
{
    uint8_t key[32], nonce[24], ad[64], tag[16], tag_ref[16];
    const size_t len = 1000;
    sl_err err = {0};
    dev_aead a;
    random_bytes(key, 32);
    random_bytes(nonce, 24);
    random_bytes(ad, 64);
    random_bytes(m, len);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c1, tag_ref, NULL, m, len, ad, 64, NULL,
                                                        nonce, key);
    for (int nth = 1; nth <= 2; nth++) {
        dev_aead_inject_fault(nth);
        CHECK(dev_aead_init(&a, &err) == -1 && err.code == SL_EINTERNAL && a.ctx == NULL);
        CHECK(strstr(err.msg, "OpenSSL") != NULL);
    }
    dev_aead_inject_fault(0);
    CHECK(dev_aead_init(&a, &err) == 0);

    int seal_fails = 0, open_fails = 0;
    for (int nth = 1; nth < 20; nth++) {
        dev_aead_inject_fault(nth);
        int rc = dev_aead_seal(&a, c2, tag, m, len, ad, 64, nonce, key, &err);
        dev_aead_inject_fault(0);
        if (rc == 0) {
            CHECK(memcmp(c2, c1, len) == 0 && memcmp(tag, tag_ref, 16) == 0);
            break;
        }
        seal_fails++;
        CHECK(err.code == SL_EINTERNAL && all_zero(tag, 16));
        CHECK(dev_aead_seal(&a, c2, tag, m, len, ad, 64, nonce, key, &err) == 0);
        CHECK(memcmp(c2, c1, len) == 0 && memcmp(tag, tag_ref, 16) == 0);
    }
    /* CipherInit, the associated data, the data, Final, GET_TAG */
    CHECKF(seal_fails == 5, "%d OpenSSL calls in seal", seal_fails);
    for (int nth = 1; nth < 20; nth++) {
        dev_aead_inject_fault(nth);
        memset(p, 0xee, len);
        int rc = dev_aead_open(&a, p, c1, len, tag_ref, ad, 64, nonce, key, &err);
        dev_aead_inject_fault(0);
        if (rc == 0) {
            CHECK(memcmp(p, m, len) == 0);
            break;
        }
        open_fails++;
        CHECK(all_zero(p, len));
        CHECKF(err.code == (nth == 5 ? SL_EAUTH : SL_EINTERNAL), "call %d: code %d", nth, err.code);
        CHECK(dev_aead_open(&a, p, c1, len, tag_ref, ad, 64, nonce, key, &err) == 0);
        CHECK(memcmp(p, m, len) == 0);
    }
    CHECKF(open_fails == 5, "%d OpenSSL calls in open", open_fails); /* + SET_TAG, - GET_TAG */
    dev_aead_free(&a);

    dev_aead never = {0};
    CHECK(dev_aead_seal(&never, c2, tag, m, len, ad, 64, nonce, key, &err) == -1 &&
          err.code == SL_ESTATE);
}

/* A sealed frame's payload is exactly what libsodium makes of the codec
 * payload (nonce = seq LE, epoch LE, 12 zero bytes; AD = header bytes 0..79); faults
 * in sealing and opening frames are errors that leave the link usable. */
static void test_frames(void)
{
    enum { D0 = 16, D1 = 64, NE = D0 * D1 };
    static float x[NE], y[NE];
    static uint8_t frame[DEV_FRAME_HDR_LEN + NE * 4 + 16], plain[NE * 4], resealed[NE * 4];
    uint8_t seed[32], nonce[24] = {0}, tag[16];
    dev_kx_keypair ka, kb;
    sl_err err = {0};
    memset(seed, 7, 32);
    CHECK(dev_kx_keypair_from_seed(&ka, seed, &err) == 0);
    memset(seed, 8, 32);
    CHECK(dev_kx_keypair_from_seed(&kb, seed, &err) == 0);
    for (int i = 0; i < NE; i++)
        x[i] = sl_rng_normal(SEED, 99, (uint64_t)i);
    dev_link_cfg cfg = {.job_id = 3, .epoch = 0x5a0c1e, .from_stage = 0, .to_stage = 1, .sealed = 1};
    dev_link_tx tx;
    dev_link_rx rx;
    CHECK(dev_link_tx_init(&tx, &cfg, &ka, kb.pk, &err) == 0);
    CHECK(dev_link_rx_init(&rx, &cfg, &kb, ka.pk, &err) == 0);
    for (int codec = DEV_CODEC_NONE; codec <= DEV_CODEC_INT8; codec++) {
        dev_frame_hdr h = {.direction = DEV_DIR_ACTIVATION, .codec = (uint8_t)codec, .ndim = 2,
                           .dims = {D0, D1}};
        size_t len;
        CHECKF(dev_frame_encode(&tx, &h, x, NULL, frame, sizeof(frame), &len, &err) == 0, "%s",
               err.msg);
        size_t n = h.payload_len - 16;
        const uint8_t *c = frame + DEV_FRAME_HDR_LEN;
        memset(nonce, 0, 24);
        for (int i = 0; i < 8; i++)
            nonce[i] = (uint8_t)(h.seq >> (8 * i));
        for (int i = 0; i < 4; i++)
            nonce[8 + i] = (uint8_t)(cfg.epoch >> (8 * i));
        CHECK(crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                  plain, NULL, c, n, c + n, frame, DEV_FRAME_FIELDS_LEN, nonce, tx.key) == 0);
        CHECK(dev_codec_encode(codec, x, NE, D1, 0, NULL, resealed, &err) == 0);
        CHECK(memcmp(plain, resealed, n) == 0);
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(resealed, tag, NULL, plain, n, frame,
                                                            DEV_FRAME_FIELDS_LEN, NULL, nonce,
                                                            tx.key);
        CHECK(memcmp(resealed, c, n) == 0 && memcmp(tag, c + n, 16) == 0);
        CHECKF(dev_frame_decode(&rx, frame, len, &h, y, NE, &err) == 0, "%s", err.msg);
    }

    /* a fault while sealing: an error, and the seq is not used again */
    dev_frame_hdr h = {.direction = DEV_DIR_ACTIVATION, .codec = DEV_CODEC_NONE, .ndim = 2,
                       .dims = {D0, D1}};
    size_t len;
    uint64_t seq = tx.next_seq;
    dev_aead_inject_fault(3);
    CHECK(dev_frame_encode(&tx, &h, x, NULL, frame, sizeof(frame), &len, &err) == -1 &&
          err.code == SL_EINTERNAL);
    dev_aead_inject_fault(0);
    CHECK(tx.next_seq == seq + 1 && tx.frames == 4);
    CHECK(dev_frame_encode(&tx, &h, x, NULL, frame, sizeof(frame), &len, &err) == 0 &&
          h.seq == seq + 1);
    /* a fault while opening: refused (the receiver failed, not the frame),
     * not consumed: the same frame decodes next time */
    dev_aead_inject_fault(1);
    CHECK(dev_frame_decode(&rx, frame, len, &h, y, NE, &err) == -1 && rx.last == DEV_FR_CAPACITY);
    dev_aead_inject_fault(0);
    CHECK(strstr(err.msg, "OpenSSL") != NULL);
    CHECKF(dev_frame_decode(&rx, frame, len, &h, y, NE, &err) == 0, "%s", err.msg);
    CHECK(memcmp(x, y, sizeof(x)) == 0);
    dev_link_tx_free(&tx);
    dev_link_rx_free(&rx);

    /* a link whose cipher context cannot be made: refused, nothing to free */
    dev_aead_inject_fault(1);
    CHECK(dev_link_tx_init(&tx, &cfg, &ka, kb.pk, &err) == -1 && err.code == SL_EINTERNAL);
    dev_aead_inject_fault(0);
    CHECK(tx.aead.ctx == NULL && all_zero(tx.key, 32) && all_zero(tx.hdr_key, 32));
}

int main(void)
{
    if (sodium_init() < 0) {
        fprintf(stderr, "libsodium failed to initialise\n");
        return 1;
    }
    m = sl_xmalloc(BIG);
    c1 = sl_xmalloc(BIG);
    c2 = sl_xmalloc(BIG);
    p = sl_xmalloc(BIG);
    RUN(test_cross_check);
    RUN(test_tampered);
    RUN(test_openssl_faults);
    RUN(test_frames);
    free(m);
    free(c1);
    free(c2);
    free(p);
    return sl_test_done();
}
