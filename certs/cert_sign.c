/* cert_sign.c - the coordinator signs what it hands out (plans); devices
 * check the signature against a coordinator certificate that chains to the
 * CA they pinned. ECDSA P-256 over SHA-256, DER signatures. */
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cert.h"
#include "cert_internal.h"
#include "sl_file.h"

int cert_sign_data(const char *key_path, const void *data, size_t len, uint8_t **sig,
                   size_t *sig_len, sl_err *err)
{
    *sig = NULL;
    *sig_len = 0;
    EVP_PKEY *key = cert_read_key(key_path, err);
    if (!key)
        return -1;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    size_t n = 0;
    int rc = -1;
    if (!md || EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, key) != 1 ||
        EVP_DigestSign(md, NULL, &n, data, len) != 1) {
        cert_ssl_err(err, SL_EINTERNAL, "signing");
        goto out;
    }
    *sig = malloc(n ? n : 1);
    if (!*sig || EVP_DigestSign(md, *sig, &n, data, len) != 1) {
        free(*sig);
        *sig = NULL;
        cert_ssl_err(err, SL_EINTERNAL, "signing");
        goto out;
    }
    *sig_len = n;
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(key);
    return rc;
}

/* The first certificate of a PEM buffer. */
static X509 *pem_cert(const char *pem, size_t len)
{
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    return x;
}

/* x chains to the CA in ca_pem (one self-signed certificate) and may be
 * used for server authentication. */
static int verify_chain(X509 *x, const char *ca_pem, size_t ca_len, sl_err *err)
{
    X509 *ca = pem_cert(ca_pem, ca_len);
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    int rc = -1;
    if (!ca) {
        sl_err_set(err, SL_EINVAL, "the pinned CA certificate does not parse");
        goto out;
    }
    if (!store || !ctx || X509_STORE_add_cert(store, ca) != 1 ||
        X509_STORE_CTX_init(ctx, store, x, NULL) != 1) {
        cert_ssl_err(err, SL_EINTERNAL, "certificate store");
        goto out;
    }
    X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
    if (X509_verify_cert(ctx) != 1) {
        sl_err_set(err, SL_EAUTH, "the signer's certificate does not verify against the pinned "
                   "CA: %s", X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
        goto out;
    }
    rc = 0;
out:
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    X509_free(ca);
    return rc;
}

/* The signer's certificate: a coordinator's (not a device's, not the
 * admin's), chaining to the CA. */
static X509 *signer_cert(const char *ca_pem, size_t ca_len, const char *pem, size_t len, char *cn,
                         size_t cap, sl_err *err)
{
    X509 *x = len <= (1u << 20) ? pem_cert(pem, len) : NULL;
    if (!x) {
        sl_err_set(err, SL_EAUTH, "the signer's certificate does not parse");
        return NULL;
    }
    cn[0] = 0;
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, (int)cap);
    if (cert_valid_device_id(cn) || !strcmp(cn, CERT_ADMIN_CN)) {
        sl_err_set(err, SL_EAUTH, "signed by '%s', which is not the coordinator", cn);
        X509_free(x);
        return NULL;
    }
    if (verify_chain(x, ca_pem, ca_len, err)) {
        X509_free(x);
        return NULL;
    }
    return x;
}

int cert_coordinator_check(const char *ca_pem, size_t ca_len, const char *pem, size_t len,
                           int64_t *not_before, char fp[CERT_HEX_LEN], sl_err *err)
{
    ERR_clear_error();
    char cn[256];
    X509 *x = signer_cert(ca_pem, ca_len, pem, len, cn, sizeof cn, err);
    if (!x)
        return -1;
    struct tm tm;
    int rc = 0;
    if (ASN1_TIME_to_tm(X509_get0_notBefore(x), &tm) != 1 || cert_x509_fingerprint(x, fp)) {
        ERR_clear_error();
        rc = sl_err_set(err, SL_EAUTH, "the coordinator certificate's validity or fingerprint "
                        "cannot be read");
    } else {
        *not_before = (int64_t)timegm(&tm);
    }
    X509_free(x);
    return rc;
}

int cert_verify_signed(const char *ca_pem, size_t ca_len, const char *signer_pem,
                       size_t signer_len, const void *data, size_t len, const uint8_t *sig,
                       size_t sig_len, sl_err *err)
{
    ERR_clear_error();
    char cn[256];
    X509 *x = signer_cert(ca_pem, ca_len, signer_pem, signer_len, cn, sizeof cn, err);
    EVP_MD_CTX *md = NULL;
    int rc = -1;
    if (!x)
        goto out;
    EVP_PKEY *pub = X509_get0_pubkey(x);
    md = EVP_MD_CTX_new();
    if (!pub || !md || EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, pub) != 1) {
        cert_ssl_err(err, SL_EINTERNAL, "verifying");
        goto out;
    }
    if (EVP_DigestVerify(md, sig, sig_len, data, len) != 1) {
        ERR_clear_error();
        sl_err_set(err, SL_EAUTH, "the signature does not verify against the coordinator "
                   "certificate '%s'", cn);
        goto out;
    }
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    X509_free(x);
    return rc;
}
