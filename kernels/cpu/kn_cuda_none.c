/* The CUDA probe of a build without nvcc: always "not compiled in". */
#include <stdio.h>

#include "kn_backend.h"

const kn_cuda_info *kn_cuda_probe(void)
{
    static kn_cuda_info info = {.compiled = false, .device_count = 0, .status = -1,
                                .reason = "CUDA not compiled in (build with -Dcuda=enabled and nvcc on PATH)"};
    return &info;
}

int kn_cuda_selftest(char *reason, size_t n)
{
    snprintf(reason, n, "%s", kn_cuda_probe()->reason);
    return -1;
}

#include "kn_be.h"

const kn_be *kn_be_cuda(void) { return NULL; }
