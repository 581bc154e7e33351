/* fuzz_stage.c - libFuzzer target: the Stage service's Ping handler and the
 * StageFrame unwrapping of Exchange messages.
 *
 * The first byte chooses the caller (no certificate, the admin, an enrolled
 * device, a revoked device, a name that is not a device id) and whether the
 * request claims the caller's own id (then the rest is the payload);
 * otherwise the rest is the request as it comes off the wire. The same bytes
 * go through rpc_frame_unwrap. Properties: Ping succeeds only for a device,
 * not revoked, claiming itself, and echoes the payload; a refusal has a
 * reason; an unwrapped frame is exactly the tail of the message. */
#include "cert.h"
#include "dev_stagesvc.h"
#include "fuzz_util.h"
#include "rpc.h"
#include "skyloom.pb-c.h"

#define REVOKED "d00000000000000bb"

static int is_revoked(void *ud, const char *id)
{
    (void)ud;
    return !strcmp(id, REVOKED);
}

static void unwrap(const uint8_t *msg, size_t len)
{
    const uint8_t *f;
    size_t n;
    if (rpc_frame_unwrap(msg, len, &f, &n) != 0)
        return;
    REQUIRE(f >= msg && f + n == msg + len);
    if (len) {
        uint8_t hdr[11];
        size_t h = rpc_frame_wrap(hdr, n);
        REQUIRE(h <= (size_t)(f - msg) && hdr[0] == msg[0]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_log_set_level(SL_LOG_OFF);
    if (!size)
        return 0;
    unwrap(data + 1, size - 1);
    static const char *const who[] = {"", CERT_ADMIN_CN, "d0123456789abcdef", REVOKED,
                                      "D0123456789ABCDEF"};
    int k = data[0] % 5;
    rpc_peer peer = {.authenticated = k != 0};
    snprintf(peer.identity, sizeof peer.identity, "%s", who[k]);
    snprintf(peer.address, sizeof peer.address, "ipv4:127.0.0.1:1");
    dev_stagesvc_opts o = {.revoked = is_revoked};
    rpc_buf in = {0}, resp = {0};
    int own = (data[0] / 5) & 1;
    if (own) {
        Skyloom__V1__PingRequest req = SKYLOOM__V1__PING_REQUEST__INIT;
        req.device_id = peer.identity;
        req.payload.data = (uint8_t *)data + 1;
        req.payload.len = size - 1;
        rpc_pack(&req, &in);
    }
    rpc_status st = {0};
    const uint8_t *msg = own ? in.data : data + 1;
    size_t len = own ? in.len : size - 1;
    int code = dev_stagesvc_handle_ping(&o, &peer, msg, len, &resp, &st);
    if (code == RPC_OK) {
        REQUIRE(k == 2);
        Skyloom__V1__PingRequest *r = rpc_unpack(&skyloom__v1__ping_request__descriptor, msg, len);
        Skyloom__V1__PingResponse *p =
            rpc_unpack(&skyloom__v1__ping_response__descriptor, resp.data, resp.len);
        REQUIRE(r && p && !strcmp(r->device_id, peer.identity));
        REQUIRE(p->payload.len == r->payload.len &&
                (!p->payload.len || !memcmp(p->payload.data, r->payload.data, p->payload.len)));
        rpc_unpacked_free(r);
        rpc_unpacked_free(p);
    } else {
        REQUIRE(st.details[0] && !resp.data);
        if (own && (k == 0 || k == 1 || k == 4))
            REQUIRE(code == RPC_PERMISSION_DENIED);
        if (own && k == 3)
            REQUIRE(code == RPC_UNAUTHENTICATED);
    }
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
    return 0;
}
