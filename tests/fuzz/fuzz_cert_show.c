/* fuzz_cert_show.c - libFuzzer target: `skyloom certs show` on any file.
 *
 * First byte & 3: 0 the rest is the file; 1 the rest is DER, wrapped in
 * PEM; 2 a real certificate's DER with the rest written over it
 * (fu_overwrite), wrapped in PEM. Bit 2 asks for JSON. Property: the text
 * output holds no control bytes but line ends, whatever the certificate's
 * names contain. */
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "cert.h"
#include "fuzz_util.h"

static uint8_t *good_der;
static size_t good_len;

static void setup(void)
{
    if (good_der)
        return;
    const char *pki = fu_path("pki");
    sl_err err = {0};
    if (cert_pki_init(pki, NULL, "DNS:x.example", &err))
        fu_die("cert_pki_init", err.msg);
    char p[300];
    snprintf(p, sizeof p, "%s/coordinator.crt", pki);
    FILE *f = fopen(p, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    int n = x ? i2d_X509(x, &good_der) : -1;
    X509_free(x);
    if (n <= 0)
        fu_die("certificate", p);
    good_len = (size_t)n;
}

static void write_pem(const char *path, const uint8_t *der, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fu_die("fopen", path);
    PEM_write(f, "CERTIFICATE", "", der, (long)n); /* fails for n = 0: an empty file */
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (!size)
        return 0;
    const char *path = fu_path("t.pem");
    switch (data[0] & 3) {
    case 1:
        write_pem(path, data + 1, size - 1);
        break;
    case 2: {
        uint8_t *b = fu_overwrite(good_der, good_len, data + 1, size - 1);
        write_pem(path, b, good_len);
        free(b);
        break;
    }
    default:
        fu_write(path, data + 1, size - 1);
    }
    char *out = NULL;
    size_t n = 0;
    FILE *o = open_memstream(&out, &n);
    int json = (data[0] & 4) != 0;
    sl_err err = {0};
    int rc = cert_show(path, json, o, &err);
    fclose(o);
    if (rc != 0)
        REQUIRE(err.msg[0]);
    for (size_t i = 0; i < n; i++)
        REQUIREF((unsigned char)out[i] >= 0x20 || out[i] == '\n', "byte 0x%02x in the output",
                 (unsigned char)out[i]);
    free(out);
    return 0;
}
