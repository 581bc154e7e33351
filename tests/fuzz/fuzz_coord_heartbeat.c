/* fuzz_coord_heartbeat.c - libFuzzer target: the coordinator's heartbeat handler with
 * arbitrary request bytes and each kind of caller (first byte). */
#include "fuzz_coord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_run(coord_handle_heartbeat, data, size);
    return 0;
}
