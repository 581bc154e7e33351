/* dev_aead.h - XChaCha20-Poly1305-IETF with a detached tag, bit-identical to
 * libsodium's crypto_aead_xchacha20poly1305_ietf_{en,de}crypt_detached, but
 * with OpenSSL's ChaCha20-Poly1305 (AVX2/AVX-512 code) for the bulk:
 *
 *   subkey = HChaCha20(key, nonce[0..16))                  (libsodium)
 *   c, tag = ChaCha20-Poly1305-IETF (RFC 8439) under subkey,
 *            12-byte nonce = 4 zero bytes || nonce[16..24)  (OpenSSL EVP)
 *
 * libsodium 1.0.18 has no vectorised ChaCha20 for x86-64 beyond SSSE3/AVX2
 * and its Poly1305 is scalar; OpenSSL 3 runs the same construction several
 * times faster (docs/frames.md has the numbers).
 *
 *   dev_aead a;
 *   dev_aead_init(&a, &err);                     // once per link direction
 *   dev_aead_seal(&a, c, tag, m, len, ad, adlen, nonce, key, &err);
 *   dev_aead_open(&a, m, c, len, tag, ad, adlen, nonce, key, &err);  // -1, SL_EAUTH: forged
 *   dev_aead_free(&a);
 *
 * In place (c == m) is allowed. One dev_aead holds one OpenSSL cipher
 * context: not thread-safe, one per thread. Every OpenSSL failure is an
 * error (SL_EINTERNAL), never an abort. */
#ifndef DEV_AEAD_H
#define DEV_AEAD_H

#include <stddef.h>
#include <stdint.h>

#include "sl_err.h"

#define DEV_AEAD_KEY_LEN 32
#define DEV_AEAD_NONCE_LEN 24
#define DEV_AEAD_TAG_LEN 16

struct evp_cipher_ctx_st; /* OpenSSL's EVP_CIPHER_CTX */

typedef struct dev_aead {
    struct evp_cipher_ctx_st *ctx;
} dev_aead;

int dev_aead_init(dev_aead *a, sl_err *err);
/* Frees the context (OpenSSL cleanses its key state); a zeroed or already
 * freed dev_aead is fine. */
void dev_aead_free(dev_aead *a);

/* c[0..len) = encryption of m[0..len), tag = its Poly1305 tag over ad and c. */
int dev_aead_seal(dev_aead *a, uint8_t *c, uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *m,
                  size_t len, const uint8_t *ad, size_t adlen,
                  const uint8_t nonce[DEV_AEAD_NONCE_LEN], const uint8_t key[DEV_AEAD_KEY_LEN],
                  sl_err *err);

/* m[0..len) = decryption of c[0..len) if tag verifies (constant-time compare
 * in OpenSSL) over ad and c; else -1 with SL_EAUTH and m[0..len) zeroed (the
 * unverified plaintext is never left behind). Other failures: SL_EINTERNAL. */
int dev_aead_open(dev_aead *a, uint8_t *m, const uint8_t *c, size_t len,
                  const uint8_t tag[DEV_AEAD_TAG_LEN], const uint8_t *ad, size_t adlen,
                  const uint8_t nonce[DEV_AEAD_NONCE_LEN], const uint8_t key[DEV_AEAD_KEY_LEN],
                  sl_err *err);

/* Tests only: the nth OpenSSL call from now on (1 = the next) in this thread
 * fails as if OpenSSL had failed; 0 turns it off. */
void dev_aead_inject_fault(int nth);

#endif
