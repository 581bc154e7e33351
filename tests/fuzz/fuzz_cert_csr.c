/* fuzz_cert_csr.c - libFuzzer target: the CA signing an arbitrary CSR (the
 * part of EnrollRequest that reaches OpenSSL's parsers). A certificate may
 * only come out with a device id. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_coord.h"

static cert_ca *fz_ca;
static void fz_ca_done(void) { cert_ca_free(fz_ca); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fz_ca) {
        fz_get();
        char pki[256];
        snprintf(pki, sizeof pki, "%s/pki", fz_root);
        sl_err err = {0};
        if (!(fz_ca = cert_ca_load(pki, &err)))
            fz_die("cert_ca_load", err.msg);
        atexit(fz_ca_done);
    }
    char id[CERT_ID_LEN], *pem = NULL;
    size_t len;
    uint8_t *csr = fz_mutated_csr(data, size, &len);
    int rc = cert_ca_sign_csr(fz_ca, csr, len, "lab", 1, id, &pem, NULL);
    free(csr);
    if (rc == 0) {
        if (!cert_valid_device_id(id) || !pem)
            abort();
        free(pem);
    } else if (pem) {
        abort();
    }
    return 0;
}
