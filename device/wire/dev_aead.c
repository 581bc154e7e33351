/* dev_aead.c - XChaCha20-Poly1305-IETF: HChaCha20 from libsodium, the bulk
 * ChaCha20-Poly1305 (RFC 8439) from OpenSSL's EVP. */
#include "dev_aead.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* OpenSSL 3.0's AVX-512 ChaCha20/Poly1305 code returns with the upper
 * halves of the vector registers dirty. Until something clears them, the
 * SSE code gcc makes for the rest of the program runs several times slower
 * (measured: the int8 codec after a seal, 1.7 ms -> 14 ms per 4 MiB, for
 * good; bench_frames showed it as "int8 encode" at 290 MB/s). VZEROUPPER
 * after every OpenSSL bulk call puts the registers back in the clean state. */
__attribute__((target("avx"))) static void upper_clear_avx(void)
{
    _mm256_zeroupper();
}

static void upper_clear(void)
{
    if (__builtin_cpu_supports("avx")) /* a load and a bit test */
        upper_clear_avx();
}
#else
static void upper_clear(void)
{
}
#endif

/* EVP lengths are int: feed larger buffers in pieces (ChaCha20-Poly1305 is
 * a stream: pieces of any size give the same output). */
#define PIECE (1 << 30)

static _Thread_local int fault_at;

void dev_aead_inject_fault(int nth)
{
    fault_at = nth > 0 ? nth : 0;
}

/* 1 if an OpenSSL call that returned rc succeeded (1), counting injected faults. */
static int ok(int rc)
{
    if (fault_at > 0 && --fault_at == 0)
        return 0;
    return rc == 1;
}

static int ossl_fail(sl_err *err, const char *what)
{
    char msg[256] = "no OpenSSL error queued";
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, msg, sizeof(msg));
    ERR_clear_error();
    return sl_err_set(err, SL_EINTERNAL, "aead: OpenSSL %s failed: %s", what, msg);
}

int dev_aead_init(dev_aead *a, sl_err *err)
{
    a->ctx = NULL;
    if (sodium_init() < 0)
        return sl_err_set(err, SL_EINTERNAL, "aead: libsodium failed to initialise");
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ok(ctx != NULL)) {
        EVP_CIPHER_CTX_free(ctx);
        return ossl_fail(err, "EVP_CIPHER_CTX_new");
    }
    if (!ok(EVP_CipherInit_ex(ctx, EVP_chacha20_poly1305(), NULL, NULL, NULL, 1))) {
        EVP_CIPHER_CTX_free(ctx);
        return ossl_fail(err, "EVP_CipherInit_ex (ChaCha20-Poly1305)");
    }
    a->ctx = ctx;
    return 0;
}

void dev_aead_free(dev_aead *a)
{
    EVP_CIPHER_CTX_free(a->ctx);
    a->ctx = NULL;
}

/* in[0..len) through the cipher into out (NULL: associated data). */
static int update(EVP_CIPHER_CTX *ctx, uint8_t *out, const uint8_t *in, size_t len, sl_err *err)
{
    while (len > 0) {
        int n = len > PIECE ? PIECE : (int)len, outl = 0;
        if (!ok(EVP_CipherUpdate(ctx, out, &outl, in, n)) || (out && outl != n))
            return ossl_fail(err, "EVP_CipherUpdate");
        in += n;
        if (out)
            out += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Subkey and IETF nonce from the extended nonce, then the associated data. */
static int start(dev_aead *a, int enc, const uint8_t nonce[DEV_AEAD_NONCE_LEN],
                 const uint8_t key[DEV_AEAD_KEY_LEN], const uint8_t *ad, size_t adlen, sl_err *err)
{
    uint8_t subkey[32], iv[12] = {0};
    if (!a->ctx)
        return sl_err_set(err, SL_ESTATE, "aead: not initialised");
    crypto_core_hchacha20(subkey, nonce, key, NULL);
    memcpy(iv + 4, nonce + 16, 8);
    int r = ok(EVP_CipherInit_ex(a->ctx, NULL, NULL, subkey, iv, enc));
    sodium_memzero(subkey, sizeof(subkey));
    if (!r)
        return ossl_fail(err, "EVP_CipherInit_ex");
    return update(a->ctx, NULL, ad, adlen, err);
}

static int seal(dev_aead *a, uint8_t *c, uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *m,
                size_t len, const uint8_t *ad, size_t adlen, const uint8_t nonce[DEV_AEAD_NONCE_LEN],
                const uint8_t key[DEV_AEAD_KEY_LEN], sl_err *err)
{
    uint8_t fin[16];
    int outl = 0;
    if (start(a, 1, nonce, key, ad, adlen, err) < 0 || update(a->ctx, c, m, len, err) < 0)
        goto fail;
    if (!ok(EVP_CipherFinal_ex(a->ctx, fin, &outl)) || outl != 0) {
        ossl_fail(err, "EVP_CipherFinal_ex");
        goto fail;
    }
    if (!ok(EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, DEV_AEAD_TAG_LEN, tag))) {
        ossl_fail(err, "EVP_CTRL_AEAD_GET_TAG");
        goto fail;
    }
    return 0;
fail:
    memset(tag, 0, DEV_AEAD_TAG_LEN);
    return -1;
}

static int open_(dev_aead *a, uint8_t *m, const uint8_t *c, size_t len,
                 const uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *ad, size_t adlen,
                 const uint8_t nonce[DEV_AEAD_NONCE_LEN], const uint8_t key[DEV_AEAD_KEY_LEN],
                 sl_err *err)
{
    uint8_t t[DEV_AEAD_TAG_LEN], fin[16];
    int outl = 0;
    memcpy(t, tag, sizeof(t));
    if (start(a, 0, nonce, key, ad, adlen, err) < 0)
        goto fail;
    if (!ok(EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, DEV_AEAD_TAG_LEN, t))) {
        ossl_fail(err, "EVP_CTRL_AEAD_SET_TAG");
        goto fail;
    }
    if (update(a->ctx, m, c, len, err) < 0)
        goto fail;
    /* Computes the tag and compares it with t in constant time. */
    if (!ok(EVP_CipherFinal_ex(a->ctx, fin, &outl))) {
        ERR_clear_error();
        sl_err_set(err, SL_EAUTH, "aead: tag does not verify");
        goto fail;
    }
    return 0;
fail:
    if (len > 0)
        memset(m, 0, len);
    return -1;
}

int dev_aead_seal(dev_aead *a, uint8_t *c, uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *m,
                  size_t len, const uint8_t *ad, size_t adlen,
                  const uint8_t nonce[DEV_AEAD_NONCE_LEN], const uint8_t key[DEV_AEAD_KEY_LEN],
                  sl_err *err)
{
    int rc = seal(a, c, tag, m, len, ad, adlen, nonce, key, err);
    upper_clear();
    return rc;
}

int dev_aead_open(dev_aead *a, uint8_t *m, const uint8_t *c, size_t len,
                  const uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *ad, size_t adlen,
                  const uint8_t nonce[DEV_AEAD_NONCE_LEN], const uint8_t key[DEV_AEAD_KEY_LEN],
                  sl_err *err)
{
    int rc = open_(a, m, c, len, tag, ad, adlen, nonce, key, err);
    upper_clear();
    return rc;
}
