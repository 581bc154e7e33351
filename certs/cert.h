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
 *   device-cert-seconds              the lifetime of device certificates
 *                                    (optional; CERT_DEVICE_DAYS without it)
 * Private keys are 0600, the directory 0700. Nothing is overwritten, except
 * the coordinator's pair by cert_pki_rotate_coordinator (the old one is kept
 * as coordinator.{key,crt}.prev).
 *
 * Identities: a device's id is "d" + the first 16 hex digits of SHA-256 over
 * the public key it enrolled with (DER SubjectPublicKeyInfo); its certificate
 * carries the id as common name and as a DNS name, and the site as
 * organizational unit. A renewed certificate is for a new key and keeps the id.
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
/* Certificate lifetimes. A device gets the lifetime its token names, else the
 * PKI's default (DIR/device-cert-seconds, written by certs init --cert-days),
 * else CERT_DEVICE_DAYS; it keeps that lifetime on renewal. */
#define CERT_DEVICE_DAYS 365
#define CERT_COORDINATOR_DAYS 825
#define CERT_MIN_SECONDS 5
#define CERT_MAX_SECONDS ((int64_t)3650 * 86400)

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
/* The same with the lifetime in seconds (CERT_MIN_SECONDS..CERT_MAX_SECONDS)
 * and, for a renewal, fixed_id: the certificate is for that device id
 * whatever the key, and the CSR's key must differ from the one of old_pem
 * (the device's current certificate; NULL: not checked). */
int cert_ca_issue(cert_ca *ca, const uint8_t *der, size_t len, const char *site, int64_t seconds,
                  const char *fixed_id, const char *old_pem, char id[CERT_ID_LEN], char **pem_out,
                  sl_err *err);

/* Writes the default lifetime of device certificates to DIR/device-cert-seconds. */
int cert_pki_set_device_seconds(const char *dir, int64_t seconds, sl_err *err);
/* That default: CERT_DEVICE_DAYS days when the file is absent. */
int cert_pki_device_seconds(const char *dir, int64_t *seconds, sl_err *err);
/* A new key and certificate for the coordinator from the same CA, with the
 * same common name and, unless sans is given (as for cert_pki_init), the same
 * subject alternative names; valid `days`. Replaces coordinator.key and
 * coordinator.crt (cert_pair_commit) and keeps the old ones as *.prev.
 * Devices need nothing: they trust the CA, not the certificate. */
int cert_pki_rotate_coordinator(const char *dir, const char *sans, int days, sl_err *err);

/* ---- replacing a key and its certificate together --------------------------- *
 * STEM.key and STEM.crt in DIR are replaced as a pair: the new key is written
 * to STEM.key.next, then the certificate to STEM.crt.next (atomically; its
 * presence marks a complete pair), then the two are renamed over STEM.key and
 * STEM.crt in that order. cert_pair_recover, run before the pair is used,
 * finishes a replacement a crash interrupted after STEM.crt.next was written
 * and drops a half-made one before. */
int cert_pair_path(char *out, size_t cap, const char *dir, const char *stem, const char *ext,
                   sl_err *err);
/* A new key in STEM.key.next (a stale one is replaced); its path to path. */
int cert_pair_new_key(const char *dir, const char *stem, char *path, size_t cap, sl_err *err);
int cert_pair_commit(const char *dir, const char *stem, const char *crt_pem, size_t len,
                     sl_err *err);
/* 0 nothing to do, 1 a replacement finished, 2 a half-made one dropped, -1 error. */
int cert_pair_recover(const char *dir, const char *stem, sl_err *err);

/* Checks the first certificate of a PEM buffer: signed by the CA in ca_path,
 * for the key in key_path (NULL: not checked), common name want_cn (NULL:
 * not checked); its validity (UNIX seconds) to *not_before / *not_after (may
 * be NULL). */
int cert_pem_check(const char *pem, size_t len, const char *ca_path, const char *key_path,
                   const char *want_cn, int64_t *not_before, int64_t *not_after, sl_err *err);
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
/* The same, the device enrolled with it getting certificates of cert_s
 * seconds (0: the PKI's default). */
int cert_token_create_ex(const char *dir, const char *site, int64_t ttl_s, int64_t cert_s,
                         char out[CERT_TOKEN_LEN], sl_err *err);
int cert_token_parse(const char *s, cert_token *t, sl_err *err);
/* SHA-256 of the secret's hex text, in hex: what the coordinator stores. */
void cert_token_hash(const char *secret, char hash[CERT_HEX_LEN]);
/* Queues the revocation of a device id in DIR/spool. */
int cert_revoke(const char *dir, const char *device_id, sl_err *err);

enum cert_spool_kind { CERT_SPOOL_TOKEN, CERT_SPOOL_REVOKE };
/* Called for each spool entry: TOKEN (key = hash, site, t = expiry, cert_s =
 * the lifetime of the device's certificates, 0 for the default) or REVOKE
 * (key = device id, site = NULL, t = time of revocation, cert_s = 0).
 * Returning 0 removes the entry from the spool; -1 (with err set) keeps it
 * and stops. */
typedef int (*cert_spool_fn)(void *ud, int kind, const char *key, const char *site, int64_t t,
                             int64_t cert_s, sl_err *err);
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

/* ---- signatures (the coordinator's plans) ------------------------------------ */

/* Signs data with the EC key in key_path: ECDSA over SHA-256, DER; *sig is
 * malloc'd. */
int cert_sign_data(const char *key_path, const void *data, size_t len, uint8_t **sig,
                   size_t *sig_len, sl_err *err);
/* SL_EAUTH unless signer_pem (the first certificate in it) chains to the CA
 * in ca_pem, may authenticate a server, is not a device's or the admin's,
 * and sig is its signature over data. */
int cert_verify_signed(const char *ca_pem, size_t ca_len, const char *signer_pem,
                       size_t signer_len, const void *data, size_t len, const uint8_t *sig,
                       size_t sig_len, sl_err *err);
/* SL_EAUTH unless pem (its first certificate) is one cert_verify_signed
 * would take as a signer (chains to the CA in ca_pem, may authenticate a
 * server, is not a device's or the admin's); then its notBefore (UNIX
 * seconds) and SHA-256 fingerprint (hex). */
int cert_coordinator_check(const char *ca_pem, size_t ca_len, const char *pem, size_t len,
                           int64_t *not_before, char fp[CERT_HEX_LEN], sl_err *err);

#endif
