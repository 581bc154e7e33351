/* fuzz_coord_enroll.c - libFuzzer target: the coordinator's Enroll handler.
 * Odd first byte: the rest is the request as it comes off the wire. Even:
 * the rest drives a well-formed request with the known token (so the token
 * check passes) around a mutated CSR, reaching CSR checks and signing. */
#include "fuzz_coord.h"
#include "skyloom.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || data[0] & 1) {
        fz_run(coord_handle_enroll, data, size);
        return 0;
    }
    coord *c = fz_get();
    char secret[65];
    memset(secret, '1', 64);
    secret[64] = 0;
    size_t len;
    uint8_t *csr = fz_mutated_csr(data + 1, size - 1, &len);
    Skyloom__V1__EnrollRequest req = SKYLOOM__V1__ENROLL_REQUEST__INIT;
    req.token = secret;
    req.site = (data[0] & 2) ? "lab" : "elsewhere";
    req.csr_der.data = csr;
    req.csr_der.len = len;
    rpc_buf in, resp = {0};
    rpc_pack(&req, &in);
    free(csr);
    rpc_peer peer = {0};
    rpc_status st = {0};
    int code = coord_handle_enroll(c, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0]))
        abort();
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
    return 0;
}
