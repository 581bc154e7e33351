/* cert_pki.c - CA, certificates, keys and CSRs on OpenSSL 3. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "cert.h"
#include "cert_internal.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

struct cert_ca {
    X509 *crt;
    EVP_PKEY *key;
    char fp[CERT_HEX_LEN];
    char *pem;
};

int cert_ssl_err(sl_err *err, int code, const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[256] = "";
    if (e)
        ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return sl_err_set(err, code, "%s%s%s", what, e ? ": " : "", buf);
}

int cert_path(char *out, size_t cap, const char *dir, const char *file, sl_err *err)
{
    if (snprintf(out, cap, "%s/%s", dir, file) >= (int)cap)
        return sl_err_set(err, SL_EINVAL, "path too long: %s/%s", dir, file);
    return 0;
}

int cert_valid_site(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CERT_SITE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int cert_is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

int cert_valid_device_id(const char *s) { return s[0] == 'd' && cert_is_hex(s + 1, 16); }

void cert_hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

int cert_write_new(const char *path, const void *data, size_t len, int mode, sl_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return sl_err_set(err, SL_EIO, "cannot create %s: %s", path,
                          errno == EEXIST ? "it exists already (refusing to overwrite)"
                                          : strerror(errno));
    const uint8_t *p = data;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, p + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(path);
            return sl_err_set(err, SL_EIO, "writing %s: %s", path, strerror(e));
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(path);
        return sl_err_set(err, SL_EIO, "writing %s: %s", path, strerror(errno));
    }
    return 0;
}

/* PEM of an OpenSSL object, through a memory BIO; malloc'd, NUL-terminated. */
static char *bio_string(BIO *b, size_t *len)
{
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *s = sl_xmalloc((size_t)n + 1);
    memcpy(s, p, (size_t)n);
    s[n] = 0;
    if (len)
        *len = (size_t)n;
    return s;
}

static int write_key(const char *path, EVP_PKEY *k, sl_err *err)
{
    BIO *b = BIO_new(BIO_s_mem());
    if (!PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL)) {
        BIO_free(b);
        return cert_ssl_err(err, SL_EINTERNAL, "encoding a private key");
    }
    size_t n;
    char *s = bio_string(b, &n);
    BIO_free(b);
    int rc = cert_write_new(path, s, n, 0600, err);
    OPENSSL_cleanse(s, n);
    free(s);
    return rc;
}

static char *crt_pem(X509 *x)
{
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, x);
    char *s = bio_string(b, NULL);
    BIO_free(b);
    return s;
}

static EVP_PKEY *new_key(sl_err *err)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    if (!k)
        cert_ssl_err(err, SL_EINTERNAL, "generating an EC P-256 key");
    return k;
}

int cert_x509_fingerprint(X509 *x, char hex[CERT_HEX_LEN])
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (!X509_digest(x, EVP_sha256(), md, &n) || n != 32)
        return -1;
    cert_hex(md, 32, hex);
    return 0;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value, sl_err *err)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!e)
        return cert_ssl_err(err, SL_EINVAL, value);
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return 0;
}

/* How far notBefore lies before the moment of issue, to tolerate clock skew:
 * 5 minutes, or a tenth of a short lifetime. */
static long backdate(int64_t seconds)
{
    return seconds / 10 < 300 ? (long)(seconds / 10) : 300;
}

/* A certificate for `pub` signed by (issuer, ikey); issuer NULL: self-signed.
 * ou may be NULL; exts is a list of (nid, value) ended by nid 0; `copy`, if
 * not NULL, is an extension added as it is. Valid `seconds` from now. */
static X509 *make_cert(EVP_PKEY *pub, const char *cn, const char *ou, X509 *issuer,
                       EVP_PKEY *ikey, int64_t seconds, const int *nids, const char *const *vals,
                       X509_EXTENSION *copy, sl_err *err)
{
    X509 *x = X509_new();
    X509_set_version(x, 2);
    uint8_t serial[16];
    if (RAND_bytes(serial, sizeof serial) != 1) {
        X509_free(x);
        cert_ssl_err(err, SL_EINTERNAL, "RAND_bytes");
        return NULL;
    }
    serial[0] &= 0x7f; /* positive */
    BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
    BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
    BN_free(bn);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"skyloom", -1, -1, 0);
    if (ou)
        X509_NAME_add_entry_by_txt(name, "OU", MBSTRING_ASC, (const unsigned char *)ou, -1, -1, 0);
    if (!X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0)) {
        X509_free(x);
        cert_ssl_err(err, SL_EINVAL, "bad common name");
        return NULL;
    }
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
    X509_gmtime_adj(X509_getm_notBefore(x), -backdate(seconds));
    X509_gmtime_adj(X509_getm_notAfter(x), (long)seconds);
    X509_set_pubkey(x, pub);
    for (int i = 0; nids[i]; i++)
        if (add_ext(x, issuer ? issuer : x, nids[i], vals[i], err)) {
            X509_free(x);
            return NULL;
        }
    if (copy && !X509_add_ext(x, copy, -1)) {
        X509_free(x);
        cert_ssl_err(err, SL_EINTERNAL, "copying an extension");
        return NULL;
    }
    if (!X509_sign(x, ikey, EVP_sha256())) {
        X509_free(x);
        cert_ssl_err(err, SL_EINTERNAL, "signing a certificate");
        return NULL;
    }
    return x;
}

/* A new key and a leaf for it signed by the CA: the key, and the chain (leaf,
 * then CA) as PEM in *chain (malloc'd). The subject alternative names are
 * `san` (text) or `san_copy` (an extension of another certificate), or none. */
static int issue_leaf(const char *cn, const char *ou, const char *eku, const char *san,
                      X509_EXTENSION *san_copy, X509 *ca, EVP_PKEY *cakey, int64_t seconds,
                      EVP_PKEY **key, char **chain, sl_err *err)
{
    EVP_PKEY *k = new_key(err);
    if (!k)
        return -1;
    /* 0-terminated; the subject alternative name, when there is one, in the
     * sixth place */
    int nids[7] = {NID_basic_constraints, NID_key_usage, NID_ext_key_usage,
                   NID_subject_key_identifier, NID_authority_key_identifier, 0, 0};
    const char *vals[7] = {"critical,CA:FALSE", "critical,digitalSignature", eku, "hash",
                           "keyid:always", NULL, NULL};
    if (san) {
        nids[5] = NID_subject_alt_name;
        vals[5] = san;
    }
    X509 *x = make_cert(k, cn, ou, ca, cakey, seconds, nids, vals, san ? NULL : san_copy, err);
    if (!x) {
        EVP_PKEY_free(k);
        return -1;
    }
    char *a = crt_pem(x), *b = crt_pem(ca);
    size_t na = strlen(a), nb = strlen(b);
    *chain = sl_xmalloc(na + nb + 1);
    memcpy(*chain, a, na);
    memcpy(*chain + na, b, nb + 1);
    free(a);
    free(b);
    X509_free(x);
    *key = k;
    return 0;
}

/* Issues a leaf for a new key and writes key and chain (leaf + CA) files. */
static int issue_pair(const char *dir, const char *stem, const char *cn, const char *ou,
                      const char *eku, const char *san, X509 *ca, EVP_PKEY *cakey, int days,
                      sl_err *err)
{
    EVP_PKEY *k;
    char *chain;
    if (issue_leaf(cn, ou, eku, san, NULL, ca, cakey, (int64_t)days * 86400, &k, &chain, err))
        return -1;
    char kp[4096], cp[4096], name[64];
    int rc = -1;
    snprintf(name, sizeof name, "%s.key", stem);
    if (!cert_path(kp, sizeof kp, dir, name, err)) {
        snprintf(name, sizeof name, "%s.crt", stem);
        if (!cert_path(cp, sizeof cp, dir, name, err) && !write_key(kp, k, err) &&
            !cert_write_new(cp, chain, strlen(chain), 0644, err))
            rc = 0;
    }
    free(chain);
    EVP_PKEY_free(k);
    return rc;
}

/* "IP:1.2.3.4,DNS:x" -> checked, appended to the defaults. */
static int build_sans(const char *extra, char *out, size_t cap, sl_err *err)
{
    int n = snprintf(out, cap, "DNS:localhost,IP:127.0.0.1");
    if (!extra || !*extra)
        return 0;
    char *copy = sl_xstrdup(extra), *save = NULL;
    int rc = 0;
    for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        if (strncmp(t, "IP:", 3) && strncmp(t, "DNS:", 4)) {
            rc = sl_err_set(err, SL_EINVAL, "--san entry '%s' must start with IP: or DNS:", t);
            break;
        }
        for (const char *c = t; *c && !rc; c++)
            if (*c <= ' ' || *c > '~')
                rc = sl_err_set(err, SL_EINVAL, "--san entry '%s' has a bad character", t);
        if (rc)
            break;
        n += snprintf(out + n, cap > (size_t)n ? cap - (size_t)n : 0, ",%s", t);
        if ((size_t)n >= cap)
            rc = sl_err_set(err, SL_EINVAL, "--san list too long");
    }
    free(copy);
    return rc;
}

int cert_pki_init(const char *dir, const char *name, const char *sans, sl_err *err)
{
    if (!name)
        name = "skyloom-coordinator";
    if (!*name || strlen(name) > 64)
        return sl_err_set(err, SL_EINVAL, "--name must be 1..64 characters");
    char san[2048], p[4096];
    if (build_sans(sans, san, sizeof san, err))
        return -1;
    mode_t old;
    int r = sl_private_dir(dir, &old, err);
    if (r < 0)
        return -1;
    if (r > 0)
        sl_log_warn("certs: the PKI directory was open to group or others; made it private",
                    "dir=%s old_mode=%04o mode=0700", dir, (unsigned)old);
    static const char *const files[] = {"ca.key", "ca.crt", "coordinator.key", "coordinator.crt",
                                        "admin.key", "admin.crt"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct stat sb;
        if (cert_path(p, sizeof p, dir, files[i], err))
            return -1;
        if (stat(p, &sb) == 0)
            return sl_err_set(err, SL_EIO, "%s exists already: refusing to overwrite a PKI", p);
    }
    EVP_PKEY *cakey = new_key(err);
    if (!cakey)
        return -1;
    static const int nids[] = {NID_basic_constraints, NID_key_usage, NID_subject_key_identifier, 0};
    static const char *const vals[] = {"critical,CA:TRUE,pathlen:0", "critical,keyCertSign,cRLSign",
                                       "hash"};
    char cn[96];
    snprintf(cn, sizeof cn, "skyloom CA (%s)", name);
    X509 *ca = make_cert(cakey, cn, NULL, NULL, cakey, (int64_t)3650 * 86400, nids, vals, NULL, err);
    int rc = -1;
    if (ca) {
        char *pem = crt_pem(ca);
        if (!cert_path(p, sizeof p, dir, "ca.key", err) && !write_key(p, cakey, err) &&
            !cert_path(p, sizeof p, dir, "ca.crt", err) &&
            !cert_write_new(p, pem, strlen(pem), 0644, err) &&
            !issue_pair(dir, "coordinator", name, "coordinator", "serverAuth,clientAuth", san, ca,
                        cakey, CERT_COORDINATOR_DAYS, err) &&
            !issue_pair(dir, "admin", CERT_ADMIN_CN, "admin", "clientAuth", NULL, ca, cakey,
                        CERT_COORDINATOR_DAYS, err) &&
            !cert_path(p, sizeof p, dir, "spool", err)) {
            if (!sl_mkdir(p, 0700, err))
                rc = 0;
        }
        free(pem);
        X509_free(ca);
    }
    EVP_PKEY_free(cakey);
    return rc;
}

/* ---- loading --------------------------------------------------------------- */

static int name_cn(X509_NAME *n, char *cn, size_t cap);

static X509 *read_crt(const char *path, sl_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!x)
        cert_ssl_err(err, SL_ECORRUPT, path);
    return x;
}

EVP_PKEY *cert_read_key(const char *path, sl_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        sl_err_set(err, SL_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!k)
        cert_ssl_err(err, SL_ECORRUPT, path);
    return k;
}

cert_ca *cert_ca_load(const char *dir, sl_err *err)
{
    char p[4096];
    if (cert_path(p, sizeof p, dir, "ca.crt", err))
        return NULL;
    X509 *x = read_crt(p, err);
    if (!x)
        return NULL;
    if (cert_path(p, sizeof p, dir, "ca.key", err)) {
        X509_free(x);
        return NULL;
    }
    EVP_PKEY *k = cert_read_key(p, err);
    if (!k) {
        X509_free(x);
        return NULL;
    }
    if (X509_check_private_key(x, k) != 1) {
        X509_free(x);
        EVP_PKEY_free(k);
        cert_ssl_err(err, SL_ECORRUPT, "ca.key does not belong to ca.crt");
        return NULL;
    }
    cert_ca *ca = sl_xcalloc(1, sizeof *ca);
    ca->crt = x;
    ca->key = k;
    cert_x509_fingerprint(x, ca->fp);
    ca->pem = crt_pem(x);
    return ca;
}

void cert_ca_free(cert_ca *ca)
{
    if (!ca)
        return;
    X509_free(ca->crt);
    EVP_PKEY_free(ca->key);
    free(ca->pem);
    free(ca);
}

const char *cert_ca_fingerprint(const cert_ca *ca) { return ca->fp; }
const char *cert_ca_pem(const cert_ca *ca) { return ca->pem; }

int cert_pubkey_id(EVP_PKEY *k, char id[CERT_ID_LEN])
{
    uint8_t *der = NULL;
    int n = i2d_PUBKEY(k, &der);
    if (n <= 0)
        return -1;
    uint8_t md[32];
    unsigned mdn = 0;
    EVP_Digest(der, (size_t)n, md, &mdn, EVP_sha256(), NULL);
    OPENSSL_free(der);
    id[0] = 'd';
    cert_hex(md, 8, id + 1);
    return 0;
}

int cert_ca_issue(cert_ca *ca, const uint8_t *der, size_t len, const char *site, int64_t seconds,
                  const char *fixed_id, const char *old_pem, char id[CERT_ID_LEN], char **pem_out,
                  sl_err *err)
{
    *pem_out = NULL;
    if (len == 0 || len > 16384)
        return sl_err_set(err, SL_EINVAL, "CSR size %zu out of range", len);
    if (!cert_valid_site(site))
        return sl_err_set(err, SL_EINVAL, "bad site name");
    if (seconds < CERT_MIN_SECONDS || seconds > CERT_MAX_SECONDS)
        return sl_err_set(err, SL_EINVAL, "certificate lifetime %lld s out of range",
                          (long long)seconds);
    if (fixed_id && !cert_valid_device_id(fixed_id))
        return sl_err_set(err, SL_EINVAL, "'%s' is not a device id", fixed_id);
    const uint8_t *p = der;
    X509_REQ *req = d2i_X509_REQ(NULL, &p, (long)len);
    if (!req || p != der + len) {
        X509_REQ_free(req);
        return cert_ssl_err(err, SL_EINVAL, "CSR is not valid DER");
    }
    EVP_PKEY *pub = X509_REQ_get0_pubkey(req);
    X509 *old = NULL;
    if (old_pem) {
        BIO *b = BIO_new_mem_buf(old_pem, -1);
        old = PEM_read_bio_X509(b, NULL, NULL, NULL);
        BIO_free(b);
    }
    int rc = -1;
    if (!pub) {
        cert_ssl_err(err, SL_EINVAL, "CSR has no usable public key");
    } else if (X509_REQ_verify(req, pub) != 1) {
        cert_ssl_err(err, SL_EAUTH, "CSR signature does not verify");
    } else if (EVP_PKEY_get_base_id(pub) != EVP_PKEY_EC || EVP_PKEY_get_bits(pub) != 256) {
        sl_err_set(err, SL_EINVAL, "CSR key must be EC P-256");
    } else if (old_pem && !old) {
        cert_ssl_err(err, SL_ECORRUPT, "the current certificate does not parse");
    } else if (old && EVP_PKEY_eq(pub, X509_get0_pubkey(old)) == 1) {
        sl_err_set(err, SL_EINVAL, "the CSR is for the current key: a renewal needs a new key");
    } else if (cert_pubkey_id(pub, id) != 0) {
        cert_ssl_err(err, SL_EINVAL, "CSR public key");
    } else {
        if (fixed_id)
            memcpy(id, fixed_id, CERT_ID_LEN);
        char san[64];
        snprintf(san, sizeof san, "DNS:%s", id);
        static const int nids[] = {NID_basic_constraints, NID_key_usage, NID_ext_key_usage,
                                   NID_subject_key_identifier, NID_authority_key_identifier,
                                   NID_subject_alt_name, 0};
        const char *vals[] = {"critical,CA:FALSE", "critical,digitalSignature",
                              "clientAuth,serverAuth", "hash", "keyid:always", san};
        X509 *x = make_cert(pub, id, site, ca->crt, ca->key, seconds, nids, vals, NULL, err);
        if (x) {
            *pem_out = crt_pem(x);
            X509_free(x);
            rc = 0;
        }
    }
    X509_free(old);
    X509_REQ_free(req);
    return rc;
}

int cert_ca_sign_csr(cert_ca *ca, const uint8_t *der, size_t len, const char *site, int days,
                     char id[CERT_ID_LEN], char **pem_out, sl_err *err)
{
    return cert_ca_issue(ca, der, len, site, (int64_t)days * 86400, NULL, NULL, id, pem_out, err);
}

/* ---- rotating the coordinator's certificate ----------------------------------- */

int cert_pki_rotate_coordinator(const char *dir, const char *sans, int days, sl_err *err)
{
    if (days < 1 || days > 3650)
        return sl_err_set(err, SL_EINVAL, "--days must be 1..3650");
    char san[2048], p[4096];
    if (sans && build_sans(sans, san, sizeof san, err))
        return -1;
    if (cert_pair_recover(dir, "coordinator", err) < 0)
        return -1;
    cert_ca *ca = cert_ca_load(dir, err);
    if (!ca)
        return -1;
    X509 *old = NULL;
    if (!cert_path(p, sizeof p, dir, "coordinator.crt", err))
        old = read_crt(p, err);
    int rc = -1;
    char cn[128];
    EVP_PKEY *k = NULL;
    char *chain = NULL;
    if (!old)
        goto out;
    if (X509_verify(old, X509_get0_pubkey(ca->crt)) != 1) {
        ERR_clear_error();
        sl_err_set(err, SL_ECORRUPT, "%s was not signed by %s/ca.crt", p, dir);
        goto out;
    }
    if (name_cn(X509_get_subject_name(old), cn, sizeof cn)) {
        sl_err_set(err, SL_ECORRUPT, "%s: no common name", p);
        goto out;
    }
    int i = X509_get_ext_by_NID(old, NID_subject_alt_name, -1);
    X509_EXTENSION *old_san = i >= 0 ? X509_get_ext(old, i) : NULL;
    if (issue_leaf(cn, "coordinator", "serverAuth,clientAuth", sans ? san : NULL, old_san, ca->crt,
                   ca->key, (int64_t)days * 86400, &k, &chain, err))
        goto out;
    char kp[4096];
    if (cert_pair_path(kp, sizeof kp, dir, "coordinator", ".key.next", err))
        goto out;
    unlink(kp);
    if (write_key(kp, k, err))
        goto out;
    /* the pair in use stays next to the new one, as *.prev */
    static const char *const ext[2] = {".key", ".crt"};
    for (int e = 0; e < 2; e++) {
        char cur[4096], prev[4200];
        if (cert_pair_path(cur, sizeof cur, dir, "coordinator", ext[e], err))
            goto out;
        snprintf(prev, sizeof prev, "%s.prev", cur);
        unlink(prev);
        if (link(cur, prev) != 0) {
            sl_err_set(err, SL_EIO, "cannot keep %s as %s: %s", cur, prev, strerror(errno));
            goto out;
        }
    }
    rc = cert_pair_commit(dir, "coordinator", chain, strlen(chain), err);
out:
    free(chain);
    EVP_PKEY_free(k);
    X509_free(old);
    cert_ca_free(ca);
    return rc;
}

/* ---- device side ----------------------------------------------------------- */

int cert_key_generate(const char *path, sl_err *err)
{
    EVP_PKEY *k = new_key(err);
    if (!k)
        return -1;
    int rc = write_key(path, k, err);
    EVP_PKEY_free(k);
    return rc;
}

int cert_key_device_id(const char *key_path, char id[CERT_ID_LEN], sl_err *err)
{
    EVP_PKEY *k = cert_read_key(key_path, err);
    if (!k)
        return -1;
    int rc = cert_pubkey_id(k, id);
    EVP_PKEY_free(k);
    return rc ? cert_ssl_err(err, SL_EINTERNAL, "encoding a public key") : 0;
}

int cert_csr_create(const char *key_path, const char *cn, uint8_t **der, size_t *len, sl_err *err)
{
    *der = NULL;
    EVP_PKEY *k = cert_read_key(key_path, err);
    if (!k)
        return -1;
    X509_REQ *req = X509_REQ_new();
    X509_REQ_set_version(req, 0);
    X509_NAME *name = X509_REQ_get_subject_name(req);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0);
    X509_REQ_set_pubkey(req, k);
    int rc = -1;
    if (!X509_REQ_sign(req, k, EVP_sha256())) {
        cert_ssl_err(err, SL_EINTERNAL, "signing the CSR");
    } else {
        uint8_t *out = NULL;
        int n = i2d_X509_REQ(req, &out);
        if (n > 0) {
            *der = sl_xmalloc((size_t)n);
            memcpy(*der, out, (size_t)n);
            *len = (size_t)n;
            OPENSSL_free(out);
            rc = 0;
        } else {
            cert_ssl_err(err, SL_EINTERNAL, "encoding the CSR");
        }
    }
    X509_REQ_free(req);
    EVP_PKEY_free(k);
    return rc;
}

/* ---- inspection ------------------------------------------------------------ */

int cert_pem_fingerprint(const char *pem, size_t len, char hex[CERT_HEX_LEN], sl_err *err)
{
    if (len > (1u << 20))
        return sl_err_set(err, SL_EINVAL, "certificate larger than 1 MiB");
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    if (!x)
        return cert_ssl_err(err, SL_ECORRUPT, "not a PEM certificate");
    int rc = cert_x509_fingerprint(x, hex);
    X509_free(x);
    return rc ? sl_err_set(err, SL_EINTERNAL, "digest failed") : 0;
}

static int name_cn(X509_NAME *n, char *cn, size_t cap)
{
    int i = X509_NAME_get_index_by_NID(n, NID_commonName, -1);
    if (i < 0)
        return -1;
    ASN1_STRING *s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(n, i));
    int l = ASN1_STRING_length(s);
    if (l < 0 || (size_t)l >= cap || memchr(ASN1_STRING_get0_data(s), 0, (size_t)l))
        return -1; /* a NUL inside would make "id\0junk" compare equal to "id" */
    memcpy(cn, ASN1_STRING_get0_data(s), (size_t)l);
    cn[l] = 0;
    return 0;
}

int cert_pem_cn(const char *pem, size_t len, char *cn, size_t cap, sl_err *err)
{
    if (len > (1u << 20))
        return sl_err_set(err, SL_EINVAL, "certificate larger than 1 MiB");
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    if (!x)
        return cert_ssl_err(err, SL_ECORRUPT, "not a PEM certificate");
    int rc = name_cn(X509_get_subject_name(x), cn, cap);
    X509_free(x);
    return rc ? sl_err_set(err, SL_ECORRUPT, "the certificate has no (usable) common name") : 0;
}

int cert_file_cn(const char *path, char *cn, size_t cap, sl_err *err)
{
    X509 *x = read_crt(path, err);
    if (!x)
        return -1;
    int rc = name_cn(X509_get_subject_name(x), cn, cap);
    X509_free(x);
    return rc ? sl_err_set(err, SL_ECORRUPT, "%s: no common name", path) : 0;
}
