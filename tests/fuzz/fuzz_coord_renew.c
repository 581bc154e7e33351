/* fuzz_coord_renew.c - libFuzzer target: the coordinator's RenewRequest handler
 * with each kind of caller (first byte), as raw bytes or with the caller's
 * own id claimed (second byte; fz_run_claimed), so that CSR parsing and
 * signing for an enrolled device are reached. */
#include "fuzz_coord.h"
#include "skyloom.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_run_claimed(coord_handle_renew, &skyloom__v1__renew_request__descriptor, data, size);
    return 0;
}
