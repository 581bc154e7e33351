/* cert_internal.h - helpers shared by the cert_ source files. */
#ifndef CERT_INTERNAL_H
#define CERT_INTERNAL_H

#include <openssl/evp.h>

#include "cert.h"

/* Fills err with `what` and OpenSSL's latest error; returns -1. */
int cert_ssl_err(sl_err *err, int code, const char *what);
void cert_hex(const uint8_t *b, size_t n, char *out);
/* SHA-256 of the certificate (DER) in hex; -1 if OpenSSL fails. */
int cert_x509_fingerprint(X509 *x, char hex[CERT_HEX_LEN]);
int cert_is_hex(const char *s, size_t n);
EVP_PKEY *cert_read_key(const char *path, sl_err *err);
int cert_pubkey_id(EVP_PKEY *k, char id[CERT_ID_LEN]);

#endif
