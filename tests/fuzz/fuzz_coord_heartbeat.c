/* fuzz_coord_heartbeat.c - libFuzzer target: the coordinator's HeartbeatRequest handler
 * with each kind of caller (first byte), as raw bytes or with the caller's
 * own id claimed (second byte; fz_run_claimed). */
#include "fuzz_coord.h"
#include "skyloom.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_run_claimed(coord_handle_heartbeat, &skyloom__v1__heartbeat_request__descriptor, data, size);
    return 0;
}
