/* fuzz_coord_list_devices.c - libFuzzer target: the coordinator's ListDevicesRequest handler
 * with each kind of caller (first byte), as raw bytes or with the caller's
 * own id claimed (second byte; fz_run_claimed). */
#include "fuzz_coord.h"
#include "skyloom.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_run_claimed(coord_handle_list_devices, &skyloom__v1__list_devices_request__descriptor, data, size);
    return 0;
}
