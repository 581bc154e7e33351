/* cert_pair.c - replacing a key and its certificate together (device
 * renewal, coordinator rotation), checking a certificate before it is used,
 * and the PKI's default lifetime of device certificates. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "cert.h"
#include "cert_internal.h"
#include "sl_file.h"
#include "sl_time.h"

int cert_pair_path(char *out, size_t cap, const char *dir, const char *stem, const char *ext,
                   sl_err *err)
{
    if (snprintf(out, cap, "%s/%s%s", dir, stem, ext) >= (int)cap)
        return sl_err_set(err, SL_EINVAL, "path too long: %s/%s%s", dir, stem, ext);
    return 0;
}

static int sync_dir(const char *dir, sl_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return sl_err_set(err, SL_EIO, "fsync %s: %s", dir, strerror(e));
    }
    close(fd);
    return 0;
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

int cert_pair_new_key(const char *dir, const char *stem, char *path, size_t cap, sl_err *err)
{
    if (cert_pair_path(path, cap, dir, stem, ".key.next", err))
        return -1;
    if (unlink(path) != 0 && errno != ENOENT)
        return sl_err_set(err, SL_EIO, "cannot remove %s: %s", path, strerror(errno));
    return cert_key_generate(path, err);
}

/* Renames STEM.key.next (when there) and STEM.crt.next over the pair. */
static int finish(const char *dir, const char *stem, sl_err *err)
{
    char kn[4200], k[4200], cn[4200], c[4200];
    if (cert_pair_path(kn, sizeof kn, dir, stem, ".key.next", err) ||
        cert_pair_path(k, sizeof k, dir, stem, ".key", err) ||
        cert_pair_path(cn, sizeof cn, dir, stem, ".crt.next", err) ||
        cert_pair_path(c, sizeof c, dir, stem, ".crt", err))
        return -1;
    if (exists(kn) && rename(kn, k) != 0)
        return sl_err_set(err, SL_EIO, "rename %s: %s", kn, strerror(errno));
    if (rename(cn, c) != 0)
        return sl_err_set(err, SL_EIO, "rename %s: %s", cn, strerror(errno));
    return sync_dir(dir, err);
}

int cert_pair_commit(const char *dir, const char *stem, const char *crt_pem, size_t len,
                     sl_err *err)
{
    char kn[4200], cn[4200], tmp[4300];
    if (cert_pair_path(kn, sizeof kn, dir, stem, ".key.next", err) ||
        cert_pair_path(cn, sizeof cn, dir, stem, ".crt.next", err))
        return -1;
    if (!exists(kn))
        return sl_err_set(err, SL_ESTATE, "%s is missing: no new key to commit", kn);
    snprintf(tmp, sizeof tmp, "%s.tmp", cn);
    unlink(tmp);
    if (cert_write_new(tmp, crt_pem, len, 0644, err))
        return -1;
    if (rename(tmp, cn) != 0) {
        unlink(tmp);
        return sl_err_set(err, SL_EIO, "rename %s: %s", cn, strerror(errno));
    }
    if (sync_dir(dir, err))
        return -1;
    return finish(dir, stem, err);
}

int cert_pair_recover(const char *dir, const char *stem, sl_err *err)
{
    char kn[4200], cn[4200], tmp[4300];
    if (cert_pair_path(kn, sizeof kn, dir, stem, ".key.next", err) ||
        cert_pair_path(cn, sizeof cn, dir, stem, ".crt.next", err))
        return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp", cn);
    unlink(tmp);
    if (exists(cn))
        return finish(dir, stem, err) ? -1 : 1;
    if (exists(kn)) {
        if (unlink(kn) != 0)
            return sl_err_set(err, SL_EIO, "cannot remove %s: %s", kn, strerror(errno));
        return 2;
    }
    return 0;
}

static int64_t asn1_unix(const ASN1_TIME *t)
{
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) != 1)
        return -1;
    return (int64_t)timegm(&tm);
}

int cert_pem_check(const char *pem, size_t len, const char *ca_path, const char *key_path,
                   const char *want_cn, int64_t *not_before, int64_t *not_after, sl_err *err)
{
    if (len > (1u << 20))
        return sl_err_set(err, SL_EINVAL, "certificate of %zu bytes refused", len);
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    if (!x)
        return cert_ssl_err(err, SL_ECORRUPT, "not a PEM certificate");
    X509 *ca = NULL;
    EVP_PKEY *key = NULL;
    int rc = -1;
    char cn[CERT_ID_LEN + 64];
    FILE *f = fopen(ca_path, "r");
    if (!f) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", ca_path, strerror(errno));
        goto out;
    }
    ca = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!ca) {
        cert_ssl_err(err, SL_ECORRUPT, ca_path);
        goto out;
    }
    if (X509_verify(x, X509_get0_pubkey(ca)) != 1) {
        ERR_clear_error();
        sl_err_set(err, SL_EAUTH, "the certificate was not issued by the CA in %s", ca_path);
        goto out;
    }
    if (key_path) {
        if (!(key = cert_read_key(key_path, err)))
            goto out;
        if (X509_check_private_key(x, key) != 1) {
            ERR_clear_error();
            sl_err_set(err, SL_EAUTH, "the certificate is not for the key in %s", key_path);
            goto out;
        }
    }
    if (want_cn) {
        X509_NAME *n = X509_get_subject_name(x);
        int i = X509_NAME_get_index_by_NID(n, NID_commonName, -1);
        ASN1_STRING *s = i >= 0 ? X509_NAME_ENTRY_get_data(X509_NAME_get_entry(n, i)) : NULL;
        int l = s ? ASN1_STRING_length(s) : -1;
        if (l < 0 || (size_t)l >= sizeof cn) {
            sl_err_set(err, SL_EAUTH, "the certificate has no usable common name");
            goto out;
        }
        memcpy(cn, ASN1_STRING_get0_data(s), (size_t)l);
        cn[l] = 0;
        if (strcmp(cn, want_cn) != 0) {
            sl_err_set(err, SL_EAUTH, "the certificate is for '%s', not %s", cn, want_cn);
            goto out;
        }
    }
    int64_t nb = asn1_unix(X509_get0_notBefore(x)), na = asn1_unix(X509_get0_notAfter(x));
    if (nb < 0 || na <= nb) {
        sl_err_set(err, SL_ECORRUPT, "the certificate's validity does not parse");
        goto out;
    }
    if (not_before)
        *not_before = nb;
    if (not_after)
        *not_after = na;
    rc = 0;
out:
    EVP_PKEY_free(key);
    X509_free(ca);
    X509_free(x);
    return rc;
}

int cert_pki_set_device_seconds(const char *dir, int64_t seconds, sl_err *err)
{
    if (seconds < CERT_MIN_SECONDS || seconds > CERT_MAX_SECONDS)
        return sl_err_set(err, SL_EINVAL, "certificate lifetime %lld s out of range",
                          (long long)seconds);
    char p[4200], body[32];
    if (cert_path(p, sizeof p, dir, "device-cert-seconds", err))
        return -1;
    snprintf(body, sizeof body, "%" PRId64 "\n", seconds);
    return sl_write_file_atomic(p, body, strlen(body), err);
}

int cert_pki_device_seconds(const char *dir, int64_t *seconds, sl_err *err)
{
    char p[4200], *buf;
    size_t n;
    *seconds = (int64_t)CERT_DEVICE_DAYS * 86400;
    if (cert_path(p, sizeof p, dir, "device-cert-seconds", err))
        return -1;
    if (!exists(p))
        return 0;
    if (sl_read_file(p, 64, &buf, &n, err))
        return -1;
    long long v;
    char extra;
    int ok = sscanf(buf, "%lld %c", &v, &extra) == 1 && v >= CERT_MIN_SECONDS &&
             v <= CERT_MAX_SECONDS;
    free(buf);
    if (!ok)
        return sl_err_set(err, SL_ECORRUPT, "%s: not a lifetime in seconds (%d..%lld)", p,
                          CERT_MIN_SECONDS, (long long)CERT_MAX_SECONDS);
    *seconds = v;
    return 0;
}
