/* fuzz_coord_list_devices.c - libFuzzer target: the coordinator's ListDevicesRequest handler
 * with each kind of caller (first byte). When the second byte is odd and the
 * rest parses, device_id is set to the caller's identity first, so the calls
 * that pass authorization are fuzzed too (database paths). */
#include "fuzz_coord.h"
#include "skyloom.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || !(data[1] & 1)) {
        fz_run(coord_handle_list_devices, data, size);
        return 0;
    }
    coord *c = fz_get();
    rpc_peer peer;
    fz_peer(data, size, &peer);
    Skyloom__V1__ListDevicesRequest *r = rpc_unpack(&skyloom__v1__list_devices_request__descriptor, data + 2, size - 2);
    if (!r)
        return 0;
    char *orig = r->device_id;
    r->device_id = peer.identity;
    rpc_buf in, resp = {0};
    rpc_pack(r, &in);
    r->device_id = orig;
    rpc_unpacked_free(r);
    rpc_status st = {0};
    int code = coord_handle_list_devices(c, &peer, in.data, in.len, &resp, &st);
    if (code != RPC_OK && (resp.data || !st.details[0]))
        abort();
    rpc_buf_free(&in);
    rpc_buf_free(&resp);
    return 0;
}
