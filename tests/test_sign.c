/* Signed plans: the coordinator's key signs, a device verifies against the
 * CA it pinned. A changed byte, another CA's coordinator, a device's or the
 * admin's certificate, and a signature of other bytes are all refused. */
#include <stdlib.h>
#include <string.h>

#include "cert.h"
#include "sl_file.h"
#include "sl_test.h"
#include "trust_util.h"

static char root[256], pki[512], other[512];

static char *slurp(const char *dir, const char *name, size_t *n)
{
    char *buf = NULL;
    sl_err err = {0};
    CHECKF(sl_read_file(tu_path(dir, name), 1 << 20, &buf, n, &err) == 0, "%s", err.msg);
    return buf;
}

static void test_signatures(void)
{
    sl_err err = {0};
    CHECKF(cert_pki_init(pki, "coord", NULL, &err) == 0, "%s", err.msg);
    CHECKF(cert_pki_init(other, "elsewhere", NULL, &err) == 0, "%s", err.msg);
    const char plan[] = "{\"job\": \"j0123456789abcdef\", \"epoch\": 3, \"stages\": []}";
    uint8_t *sig = NULL, *osig = NULL, *asig = NULL;
    size_t sig_len = 0, osig_len = 0, asig_len = 0, ca_len, crt_len, ocrt_len, adm_len;
    CHECKF(cert_sign_data(tu_path(pki, "coordinator.key"), plan, strlen(plan), &sig, &sig_len, &err) == 0,
           "%s", err.msg);
    CHECK(cert_sign_data(tu_path(other, "coordinator.key"), plan, strlen(plan), &osig, &osig_len, &err) == 0);
    CHECK(cert_sign_data(tu_path(pki, "admin.key"), plan, strlen(plan), &asig, &asig_len, &err) == 0);
    char *ca = slurp(pki, "ca.crt", &ca_len), *crt = slurp(pki, "coordinator.crt", &crt_len);
    char *ocrt = slurp(other, "coordinator.crt", &ocrt_len), *adm = slurp(pki, "admin.crt", &adm_len);
    CHECKF(cert_verify_signed(ca, ca_len, crt, crt_len, plan, strlen(plan), sig, sig_len, &err) == 0,
           "the coordinator's own signature: %s", err.msg);
    char bent[sizeof plan];
    memcpy(bent, plan, sizeof plan);
    bent[30] ^= 1; /* the epoch */
    CHECK(cert_verify_signed(ca, ca_len, crt, crt_len, bent, strlen(bent), sig, sig_len, &err) == -1 &&
          err.code == SL_EAUTH && strstr(err.msg, "does not verify"));
    sig[sig_len / 2] ^= 0x40;
    CHECK(cert_verify_signed(ca, ca_len, crt, crt_len, plan, strlen(plan), sig, sig_len, &err) == -1 &&
          err.code == SL_EAUTH);
    CHECK(cert_verify_signed(ca, ca_len, ocrt, ocrt_len, plan, strlen(plan), osig, osig_len, &err) == -1 &&
          err.code == SL_EAUTH && strstr(err.msg, "pinned CA"));
    printf("    another CA's coordinator: %s\n", err.msg);
    CHECK(cert_verify_signed(ca, ca_len, adm, adm_len, plan, strlen(plan), asig, asig_len, &err) == -1 &&
          err.code == SL_EAUTH && strstr(err.msg, "not the coordinator"));
    printf("    the admin certificate: %s\n", err.msg);
    CHECK(cert_verify_signed(ca, ca_len, "junk", 4, plan, strlen(plan), osig, osig_len, &err) == -1 &&
          err.code == SL_EAUTH);
    free(sig);
    free(osig);
    free(asig);
    free(ca);
    free(crt);
    free(ocrt);
    free(adm);
}

int main(void)
{
    tu_tmpdir(root, sizeof root, "sign");
    snprintf(pki, sizeof pki, "%s/pki", root);
    snprintf(other, sizeof other, "%s/other", root);
    RUN(test_signatures);
    tu_rmtree(root);
    return sl_test_done();
}
