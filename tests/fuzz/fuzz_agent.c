/* fuzz_agent.c - libFuzzer target: the device's parsing of the
 * coordinator's replies to Enroll and Heartbeat.
 *
 * First byte bit 0 picks the reply: Heartbeat (the rest as it comes off the
 * wire) or Enroll. For Enroll, bit 1 set: the rest as it comes off the
 * wire; clear: a valid reply (a real certificate for the expected id) with
 * the rest written over its certificate (fu_overwrite), so the PEM and
 * X.509 parsers see near-valid input. Properties: an accepted enrollment
 * holds a certificate whose common name is the expected id, an accepted
 * interval is within bounds, and the revoked list holds only device ids.
 *
 * First byte 0xa0..0xaf: a coordinator certificate, the rest written over
 * the PKI's real one, judged (dev_coord_cert_judge) as a plan's signer and
 * as a heartbeat's against none seen and against the real one: a certificate
 * taken is a coordinator's of this CA, and never one older than the newest
 * seen. */
#include "cert.h"
#include "dev_agent.h"
#include "fuzz_util.h"
#include "rpc.h"
#include "skyloom.pb-c.h"
#include "sl_file.h"

static char want[CERT_ID_LEN];
static char *good_pem, *coord_pem, *ca_pem;
static size_t good_len, coord_len, ca_len;

static void setup(void)
{
    if (good_pem)
        return;
    const char *pki = fu_path("pki"), *key = fu_path("dev.key");
    sl_err err = {0};
    if (cert_pki_init(pki, NULL, NULL, &err))
        fu_die("cert_pki_init", err.msg);
    cert_ca *ca = cert_ca_load(pki, &err);
    uint8_t *csr = NULL;
    size_t len = 0;
    if (!ca || cert_key_generate(key, &err) || cert_key_device_id(key, want, &err) ||
        cert_csr_create(key, want, &csr, &len, &err))
        fu_die("device key", err.msg);
    char id[CERT_ID_LEN];
    if (cert_ca_sign_csr(ca, csr, len, "lab", 1, id, &good_pem, &err))
        fu_die("sign", err.msg);
    good_len = strlen(good_pem);
    free(csr);
    cert_ca_free(ca);
    char p[4200];
    snprintf(p, sizeof p, "%s/coordinator.crt", pki);
    if (sl_read_file(p, 1 << 20, &coord_pem, &coord_len, &err))
        fu_die("coordinator.crt", err.msg);
    snprintf(p, sizeof p, "%s/ca.crt", pki);
    if (sl_read_file(p, 1 << 20, &ca_pem, &ca_len, &err))
        fu_die("ca.crt", err.msg);
}

static void coordinator_cert(const uint8_t *data, size_t size)
{
    uint8_t *pem = fu_overwrite((const uint8_t *)coord_pem, coord_len, data, size);
    dev_coord_seen none = {0}, real, out;
    REQUIRE(dev_coord_cert_judge(ca_pem, ca_len, &none, coord_pem, coord_len, 0, &real, NULL) ==
            DEV_COORD_NEWER);
    for (int hb = 0; hb <= 1; hb++) {
        int v = dev_coord_cert_judge(ca_pem, ca_len, &none, (const char *)pem, coord_len, hb, &out,
                                     NULL);
        REQUIRE(v == -1 || v == DEV_COORD_NEWER);
        if (v == DEV_COORD_NEWER) {
            int64_t nb;
            char fp[CERT_HEX_LEN];
            REQUIRE(cert_coordinator_check(ca_pem, ca_len, (const char *)pem, coord_len, &nb, fp,
                                           NULL) == 0);
            REQUIRE(out.have && nb == out.not_before && !strcmp(fp, out.fp));
        }
        v = dev_coord_cert_judge(ca_pem, ca_len, &real, (const char *)pem, coord_len, hb, &out,
                                 NULL);
        if (v == DEV_COORD_NEWER)
            REQUIRE(out.not_before > real.not_before || (hb && out.not_before == real.not_before));
        if (v == DEV_COORD_SAME)
            REQUIRE(out.not_before == real.not_before && !strcmp(out.fp, real.fp));
    }
    free(pem);
}

static void heartbeat(const uint8_t *data, size_t size)
{
    unsigned hb;
    char *revoked;
    if (dev_heartbeat_reply_parse(data, size, &hb, &revoked, NULL) != 0)
        return;
    REQUIRE(hb == 0 || (hb >= DEV_HEARTBEAT_MIN_MS && hb <= DEV_HEARTBEAT_MAX_MS));
    size_t n = strlen(revoked);
    REQUIRE(n % CERT_ID_LEN == 0);
    for (size_t i = 0; i < n; i += CERT_ID_LEN) {
        char id[CERT_ID_LEN];
        memcpy(id, revoked + i, CERT_ID_LEN - 1);
        id[CERT_ID_LEN - 1] = 0;
        REQUIRE(cert_valid_device_id(id) && revoked[i + CERT_ID_LEN - 1] == ' ');
    }
    free(revoked);
}

static void enroll(const uint8_t *reply, size_t len)
{
    unsigned hb;
    char *pem;
    size_t pem_len;
    if (dev_enroll_reply_check(reply, len, want, &hb, &pem, &pem_len, NULL) != 0) {
        REQUIRE(pem == NULL);
        return;
    }
    char cn[128];
    REQUIRE(cert_pem_cn(pem, pem_len, cn, sizeof cn, NULL) == 0 && !strcmp(cn, want));
    REQUIRE(hb == 0 || (hb >= DEV_HEARTBEAT_MIN_MS && hb <= DEV_HEARTBEAT_MAX_MS));
    free(pem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (!size)
        return 0;
    if ((data[0] & 0xf0) == 0xa0) {
        coordinator_cert(data + 1, size - 1);
        return 0;
    }
    if (data[0] & 1) {
        heartbeat(data + 1, size - 1);
        return 0;
    }
    if (data[0] & 2) {
        enroll(data + 1, size - 1);
        return 0;
    }
    uint8_t *pem = fu_overwrite((const uint8_t *)good_pem, good_len, data + 1, size - 1);
    Skyloom__V1__EnrollResponse r = SKYLOOM__V1__ENROLL_RESPONSE__INIT;
    r.device_id = (data[0] & 4) ? "d0123456789abcdef" : want;
    r.cert_pem.data = pem;
    r.cert_pem.len = good_len;
    r.heartbeat_ms = (uint32_t)data[0] << 16;
    rpc_buf in;
    rpc_pack(&r, &in);
    enroll(in.data, in.len);
    rpc_buf_free(&in);
    free(pem);
    return 0;
}
