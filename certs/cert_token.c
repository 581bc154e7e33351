/* cert_token.c - one-time enrollment tokens, revocations and the spool that
 * carries both from `skyloom certs` to the coordinator's state. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "cert.h"
#include "cert_internal.h"
#include "sl_time.h"

#define TOKEN_PREFIX "skyloom1."

void cert_token_hash(const char *secret, char hash[CERT_HEX_LEN])
{
    uint8_t md[32];
    unsigned n = 0;
    EVP_Digest(secret, strlen(secret), md, &n, EVP_sha256(), NULL);
    cert_hex(md, 32, hash);
}

int cert_token_parse(const char *s, cert_token *t, sl_err *err)
{
    size_t np = strlen(TOKEN_PREFIX);
    if (strncmp(s, TOKEN_PREFIX, np) != 0 || strlen(s) != np + 64 + 1 + 64 || s[np + 64] != '.')
        return sl_err_set(err, SL_EINVAL,
                          "malformed token (expected skyloom1.<64 hex>.<64 hex>, from skyloom "
                          "certs token)");
    memcpy(t->ca_fp, s + np, 64);
    t->ca_fp[64] = 0;
    memcpy(t->secret, s + np + 65, 64);
    t->secret[64] = 0;
    if (!cert_is_hex(t->ca_fp, 64) || !cert_is_hex(t->secret, 64))
        return sl_err_set(err, SL_EINVAL, "malformed token: not lower-case hex");
    return 0;
}

/* Writes spool/<name> atomically (temporary file, then rename). */
static int spool_put(const char *dir, const char *name, const char *body, sl_err *err)
{
    char sp[4096], tmp[4200], dst[4200];
    if (cert_path(sp, sizeof sp, dir, "spool", err))
        return -1;
    struct stat sb;
    if (stat(sp, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return sl_err_set(err, SL_EIO, "%s is missing: is %s a PKI directory (skyloom certs init)?",
                          sp, dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", sp, name);
    snprintf(dst, sizeof dst, "%s/%s", sp, name);
    unlink(tmp);
    if (cert_write_new(tmp, body, strlen(body), 0600, err))
        return -1;
    if (rename(tmp, dst) != 0) {
        unlink(tmp);
        return sl_err_set(err, SL_EIO, "rename %s: %s", dst, strerror(errno));
    }
    return 0;
}

int cert_token_create(const char *dir, const char *site, int64_t ttl_s, char out[CERT_TOKEN_LEN],
                      sl_err *err)
{
    return cert_token_create_ex(dir, site, ttl_s, 0, out, err);
}

int cert_token_create_ex(const char *dir, const char *site, int64_t ttl_s, int64_t cert_s,
                         char out[CERT_TOKEN_LEN], sl_err *err)
{
    if (cert_s && (cert_s < CERT_MIN_SECONDS || cert_s > CERT_MAX_SECONDS))
        return sl_err_set(err, SL_EINVAL, "certificate lifetime %lld s out of range",
                          (long long)cert_s);
    if (!cert_valid_site(site))
        return sl_err_set(err, SL_EINVAL, "site '%s' must be 1..64 of A-Z a-z 0-9 . _ -", site);
    cert_ca *ca = cert_ca_load(dir, err);
    if (!ca)
        return -1;
    uint8_t raw[32];
    if (RAND_bytes(raw, sizeof raw) != 1) {
        cert_ca_free(ca);
        return cert_ssl_err(err, SL_EINTERNAL, "RAND_bytes");
    }
    char secret[CERT_HEX_LEN], hash[CERT_HEX_LEN], name[80], body[160];
    cert_hex(raw, 32, secret);
    OPENSSL_cleanse(raw, sizeof raw);
    cert_token_hash(secret, hash);
    snprintf(name, sizeof name, "token-%s", hash);
    if (cert_s)
        snprintf(body, sizeof body, "%s %" PRId64 " %" PRId64 "\n", site, sl_unix_time() + ttl_s,
                 cert_s);
    else
        snprintf(body, sizeof body, "%s %" PRId64 "\n", site, sl_unix_time() + ttl_s);
    int rc = spool_put(dir, name, body, err);
    if (rc == 0)
        snprintf(out, CERT_TOKEN_LEN, TOKEN_PREFIX "%s.%s", cert_ca_fingerprint(ca), secret);
    OPENSSL_cleanse(secret, sizeof secret);
    cert_ca_free(ca);
    return rc;
}

int cert_revoke(const char *dir, const char *device_id, sl_err *err)
{
    if (!cert_valid_device_id(device_id))
        return sl_err_set(err, SL_EINVAL, "'%s' is not a device id (d + 16 hex digits)", device_id);
    char name[64], body[32];
    snprintf(name, sizeof name, "revoke-%s", device_id);
    snprintf(body, sizeof body, "%" PRId64 "\n", sl_unix_time());
    return spool_put(dir, name, body, err);
}

/* Reads a spool entry without ever blocking: a FIFO or device is refused
 * before any read. 0 ok, -1 with the reason in why. */
static int read_small(const char *path, char *buf, size_t cap, const char **why)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        *why = errno == ELOOP ? "a symbolic link" : strerror(errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        *why = "not a regular file";
        return -1;
    }
    if ((uint64_t)st.st_size >= cap) {
        close(fd);
        *why = "too large for a spool entry";
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *why = strerror(errno);
            close(fd);
            return -1;
        }
        if (r == 0 || (n += (size_t)r) == cap - 1)
            break;
    }
    close(fd);
    buf[n] = 0;
    if (memchr(buf, 0, n)) {
        *why = "a NUL byte in the body";
        return -1;
    }
    return 0;
}

/* Parses one spool entry; 0 ok, -1 malformed (the reason in why). */
static int parse_entry(const char *file, const char *body, int *kind, char *key, char *site,
                       int64_t *t, int64_t *cert_s, const char **why)
{
    long long v, cs = 0;
    char extra;
    *cert_s = 0;
    if (!strncmp(file, "token-", 6)) {
        *kind = CERT_SPOOL_TOKEN;
        snprintf(key, CERT_HEX_LEN, "%s", file + 6);
        *why = "the name is not token-<64 hex>";
        if (!cert_is_hex(file + 6, 64))
            return -1;
        char s[CERT_SITE_MAX + 2];
        *why = "the body is not \"SITE EXPIRY [CERT_SECONDS]\"";
        int n = sscanf(body, "%65s %lld %lld %c", s, &v, &cs, &extra);
        if ((n != 2 && n != 3) || !cert_valid_site(s))
            return -1;
        if (n == 3 && (cs < CERT_MIN_SECONDS || cs > CERT_MAX_SECONDS))
            return -1;
        *cert_s = cs;
        memcpy(site, s, strlen(s) + 1); /* valid: at most CERT_SITE_MAX */
    } else if (!strncmp(file, "revoke-", 7)) {
        *kind = CERT_SPOOL_REVOKE;
        snprintf(key, CERT_HEX_LEN, "%s", file + 7);
        *why = "the name is not revoke-<device id>";
        if (strlen(file + 7) != CERT_ID_LEN - 1 || !cert_valid_device_id(key))
            return -1;
        *why = "the body is not \"TIME\"";
        if (sscanf(body, "%lld %c", &v, &extra) != 1)
            return -1;
        site[0] = 0;
    } else {
        *why = "unknown entry (token-* or revoke-* expected)";
        return -1;
    }
    *t = v;
    return 0;
}

int cert_spool_drain(const char *dir, cert_spool_fn fn, cert_spool_bad_fn bad_fn, void *ud,
                     int *bad, sl_err *err)
{
    char sp[4096];
    *bad = 0;
    if (cert_path(sp, sizeof sp, dir, "spool", err))
        return -1;
    DIR *d = opendir(sp);
    if (!d)
        return sl_err_set(err, SL_EIO, "cannot open %s: %s", sp, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        const char *f = e->d_name;
        size_t fl = strlen(f);
        if (f[0] == '.' || (fl >= 4 && !strcmp(f + fl - 4, ".bad")))
            continue;
        char path[4400], body[256], key[CERT_HEX_LEN], site[CERT_SITE_MAX + 1];
        const char *why = "";
        int kind;
        int64_t t, cert_s;
        snprintf(path, sizeof path, "%s/%s", sp, f);
        if (read_small(path, body, sizeof body, &why) != 0 ||
            parse_entry(f, body, &kind, key, site, &t, &cert_s, &why) != 0) {
            char badp[4500];
            snprintf(badp, sizeof badp, "%s.bad", path);
            rename(path, badp);
            (*bad)++;
            if (bad_fn)
                bad_fn(ud, f, why);
            continue;
        }
        sl_err ierr = {0};
        if (fn(ud, kind, key, kind == CERT_SPOOL_TOKEN ? site : NULL, t, cert_s, &ierr) != 0) {
            rc = sl_err_set(err, ierr.code ? ierr.code : SL_EIO, "importing %s: %s", path,
                            ierr.msg[0] ? ierr.msg : "failed");
            break;
        }
        unlink(path);
    }
    closedir(d);
    return rc;
}
