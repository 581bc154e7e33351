/* cert.h - the site PKI on OpenSSL (cert_ prefix).
 *
 * A PKI directory (skyloom certs init --pki DIR) holds
 *   ca.crt, ca.key                   the project CA (EC P-256, self-signed)
 *   coordinator.crt, coordinator.key the coordinator's server certificate
 *                                    (the .crt is the chain: leaf, then CA)
 *   admin.crt, admin.key             a client certificate for operators
 *                                    (skyloom status), common name "skyloom-admin"
 *   spool/                           tokens and revocations waiting for the
 *                                    coordinator to import them into its state
 * Private keys are 0600, the directory 0700. Nothing is ever overwritten.
 *
 * Identities: a device's id is "d" + the first 16 hex digits of SHA-256 over
 * its public key (DER SubjectPublicKeyInfo); its certificate carries the id as
 * common name and as a DNS name, and the site as organizational unit.
 *
 * Tokens: "skyloom1.<CA SHA-256 fingerprint, 64 hex>.<secret, 64 hex>". The
 * coordinator stores only SHA-256(secret) with the site and expiry. */
#ifndef CERT_H
#define CERT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sl_err.h"

#define CERT_ADMIN_CN "skyloom-admin"
#define CERT_ID_LEN 18     /* "d" + 16 hex + NUL */
#define CERT_HEX_LEN 65    /* 64 hex + NUL */
#define CERT_TOKEN_LEN 140 /* "skyloom1." + 64 + "." + 64 + NUL, rounded up */
#define CERT_SITE_MAX 64

/* Joins dir and a file name; -1 if it does not fit. */
int cert_path(char *out, size_t cap, const char *dir, const char *file, sl_err *err);
/* Site names: 1..64 of [A-Za-z0-9._-]. */
int cert_valid_site(const char *s);
/* Device ids: "d" + 16 lower-case hex digits. */
int cert_valid_device_id(const char *s);

/* ---- the PKI directory ----------------------------------------------------- */

/* Creates the CA, the coordinator and admin certificates and the spool.
 * name: the coordinator's common name (NULL: "skyloom-coordinator"); sans:
 * "IP:10.0.0.1,DNS:coord.example" added to the defaults DNS:localhost,
 * IP:127.0.0.1 (NULL for none). Fails if any file exists already. */
int cert_pki_init(const char *dir, const char *name, const char *sans, sl_err *err);

typedef struct cert_ca cert_ca;
/* Loads DIR/ca.crt and DIR/ca.key (checks that they belong together). */
cert_ca *cert_ca_load(const char *dir, sl_err *err);
void cert_ca_free(cert_ca *ca);
/* SHA-256 over the CA certificate's DER, lower-case hex. */
const char *cert_ca_fingerprint(const cert_ca *ca);
/* The CA certificate as PEM (owned by ca). */
const char *cert_ca_pem(const cert_ca *ca);
/* Checks the CSR's own signature, derives the device id from its public key
 * and issues a certificate for it: CN=id, OU=site, DNS:id, client+server
 * auth, valid `days`. Whatever subject the CSR asks for is ignored.
 * *pem_out is malloc'd. */
int cert_ca_sign_csr(cert_ca *ca, const uint8_t *der, size_t len, const char *site, int days,
                     char id[CERT_ID_LEN], char **pem_out, sl_err *err);

/* ---- keys and requests (devices) ------------------------------------------- */

/* A new EC P-256 key written to path (0600, refuses to overwrite). */
int cert_key_generate(const char *path, sl_err *err);
/* A DER CSR signed by the key in key_path; *der is malloc'd. */
int cert_csr_create(const char *key_path, const char *cn, uint8_t **der, size_t *len, sl_err *err);
/* The device id the key in key_path gets. */
int cert_key_device_id(const char *key_path, char id[CERT_ID_LEN], sl_err *err);

/* ---- files ----------------------------------------------------------------- */

/* Writes data to path with the given mode, refusing to overwrite. */
int cert_write_new(const char *path, const void *data, size_t len, int mode, sl_err *err);
/* SHA-256 fingerprint (hex) of the first certificate in a PEM buffer. */
int cert_pem_fingerprint(const char *pem, size_t len, char hex[CERT_HEX_LEN], sl_err *err);
/* The common name of the first certificate in a PEM file (one with a NUL
 * inside is refused). */
int cert_file_cn(const char *path, char *cn, size_t cap, sl_err *err);
/* The same from a PEM buffer. */
int cert_pem_cn(const char *pem, size_t len, char *cn, size_t cap, sl_err *err);
/* Prints what a PEM file holds (certificates: subject, issuer, serial,
 * validity, names, fingerprint), as text or as one JSON document. */
int cert_show(const char *path, int json, FILE *out, sl_err *err);

/* ---- tokens and revocations ------------------------------------------------ */

typedef struct cert_token {
    char ca_fp[CERT_HEX_LEN];
    char secret[CERT_HEX_LEN];
} cert_token;

/* Makes a token for `site` valid ttl_s seconds from now and drops its hash
 * into DIR/spool; writes the token text to out. */
int cert_token_create(const char *dir, const char *site, int64_t ttl_s, char out[CERT_TOKEN_LEN],
                      sl_err *err);
int cert_token_parse(const char *s, cert_token *t, sl_err *err);
/* SHA-256 of the secret's hex text, in hex: what the coordinator stores. */
void cert_token_hash(const char *secret, char hash[CERT_HEX_LEN]);
/* Queues the revocation of a device id in DIR/spool. */
int cert_revoke(const char *dir, const char *device_id, sl_err *err);

enum cert_spool_kind { CERT_SPOOL_TOKEN, CERT_SPOOL_REVOKE };
/* Called for each spool entry: TOKEN (key = hash, site, t = expiry) or REVOKE
 * (key = device id, site = NULL, t = time of revocation). Returning 0 removes
 * the entry from the spool; -1 (with err set) keeps it and stops. */
typedef int (*cert_spool_fn)(void *ud, int kind, const char *key, const char *site, int64_t t,
                             sl_err *err);
/* Told of each malformed entry (renamed to *.bad) and why. */
typedef void (*cert_spool_bad_fn)(void *ud, const char *file, const char *why);
/* Imports and removes every entry in DIR/spool. Entries are opened without
 * blocking and must be small regular files; anything else (a FIFO, a
 * device, a link, a directory, a malformed body) is renamed to *.bad and
 * reported to bad_fn (may be NULL) and in *bad, the count. An import that
 * fails stops the drain with an error naming the entry and the cause. */
int cert_spool_drain(const char *dir, cert_spool_fn fn, cert_spool_bad_fn bad_fn, void *ud,
                     int *bad, sl_err *err);

/* ---- pinning the CA (devices, before they have a certificate) --------------- */

/* Connects to host:port with TLS, takes the certificate chain the server
 * presents, finds the CA whose SHA-256 equals want_fp and checks that it
 * signed the server certificate; writes that CA to out_path (PEM). A
 * mismatch fails with SL_EAUTH naming both fingerprints. The gRPC channel
 * that follows verifies the server against this CA as usual. */
int cert_fetch_ca(const char *host_port, const char *want_fp, const char *out_path,
                  int timeout_ms, sl_err *err);

#endif
