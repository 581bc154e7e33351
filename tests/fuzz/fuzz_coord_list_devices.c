/* fuzz_coord_list_devices.c - libFuzzer target: the coordinator's list_devices handler with
 * arbitrary request bytes and each kind of caller (first byte). */
#include "fuzz_coord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_run(coord_handle_list_devices, data, size);
    return 0;
}
