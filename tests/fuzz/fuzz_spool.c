/* fuzz_spool.c - libFuzzer target: enrollment tokens and the PKI spool.
 *
 * First byte 0: the rest is a token string for cert_token_parse; a token it
 * accepts has two 64-hex parts and prints back as the same string.
 * Otherwise the rest is a spool entry, its name up to the first '\n' (made
 * a valid file name) and its body after it; the first byte's bits 1..2 may
 * make it a FIFO, a directory or a symbolic link instead of a file. The
 * spool is drained: an entry handed to the importer has a well-formed key,
 * site and kind, nothing blocks, and nothing but *.bad is left behind. */
#include <dirent.h>
#include <sys/stat.h>

#include "cert.h"
#include "fuzz_util.h"

static int hex64(const char *s)
{
    if (strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

static int imported(void *ud, int kind, const char *key, const char *site, int64_t t,
                    int64_t cert_s, sl_err *err)
{
    (void)ud;
    (void)t;
    REQUIRE(cert_s >= 0);
    (void)err;
    if (kind == CERT_SPOOL_TOKEN)
        REQUIRE(hex64(key) && site && cert_valid_site(site));
    else
        REQUIRE(kind == CERT_SPOOL_REVOKE && cert_valid_device_id(key) && !site);
    return 0;
}

static void refused(void *ud, const char *file, const char *why)
{
    (void)ud;
    REQUIRE(file && why && why[0]);
}

static void token(const uint8_t *data, size_t size)
{
    char s[512];
    size_t n = size < sizeof s - 1 ? size : sizeof s - 1;
    memcpy(s, data, n);
    s[n] = 0;
    cert_token t;
    if (cert_token_parse(s, &t, NULL) != 0)
        return;
    REQUIRE(hex64(t.ca_fp) && hex64(t.secret));
    char back[CERT_TOKEN_LEN];
    snprintf(back, sizeof back, "skyloom1.%s.%s", t.ca_fp, t.secret);
    REQUIRE(!strcmp(back, s));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    if (data[0] == 0) {
        token(data + 1, size - 1);
        return 0;
    }
    const char *pki = fu_path("pki");
    char spool[300];
    snprintf(spool, sizeof spool, "%s/spool", pki);
    mkdir(pki, 0700);
    mkdir(spool, 0700);
    const uint8_t *in = data + 1, *nl = memchr(in, '\n', size - 1);
    size_t nlen = nl ? (size_t)(nl - in) : size - 1;
    char name[200];
    if (nlen > 150)
        nlen = 150;
    for (size_t i = 0; i < nlen; i++)
        name[i] = in[i] == '/' || in[i] == 0 ? '_' : (char)in[i];
    name[nlen] = 0;
    if (!nlen || !strcmp(name, ".") || !strcmp(name, ".."))
        snprintf(name, sizeof name, "x");
    char path[600];
    snprintf(path, sizeof path, "%s/%s", spool, name);
    const uint8_t *body = nl ? nl + 1 : in + size - 1;
    size_t blen = (size_t)(in + size - 1 - body);
    switch ((data[0] >> 1) & 3) {
    case 1:
        mkfifo(path, 0600);
        break;
    case 2:
        mkdir(path, 0700);
        break;
    case 3:
        symlink("/dev/zero", path);
        break;
    default:
        fu_write(path, body, blen);
    }
    int bad = 0;
    sl_err err = {0};
    REQUIRE(cert_spool_drain(pki, imported, refused, NULL, &bad, &err) == 0);
    DIR *d = opendir(spool);
    REQUIRE(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t l = strlen(e->d_name);
        REQUIREF(e->d_name[0] == '.' || (l >= 4 && !strcmp(e->d_name + l - 4, ".bad")),
                 "left in the spool: %s", e->d_name);
        char p[600];
        snprintf(p, sizeof p, "%s/%s", spool, e->d_name);
        if (remove(p) != 0)
            rmdir(p);
    }
    closedir(d);
    return 0;
}
