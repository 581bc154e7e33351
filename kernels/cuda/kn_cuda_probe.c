/* The CUDA probe, compiled by the C compiler against the CUDA runtime.
 * Without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver (35)
 * and leaves the count unwritten, so it is initialised to 0 first. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>

#include "kn_backend.h"
#include "kn_cuda.h"

static kn_cuda_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void probe_once(void)
{
    g_info.compiled = true;
    int count = 0;
    cudaError_t st = cudaGetDeviceCount(&count);
    g_info.status = (int)st;
    if (st != cudaSuccess) {
        g_info.device_count = 0;
        const char *what = st == cudaErrorInsufficientDriver ? "CUDA driver missing"
                           : st == cudaErrorNoDevice         ? "no CUDA device"
                                                             : "CUDA unavailable";
        snprintf(g_info.reason, sizeof g_info.reason, "%s: cudaGetDeviceCount returned %d (%s)", what,
                 (int)st, cudaGetErrorString(st));
        return;
    }
    g_info.device_count = count;
    if (count == 0) {
        snprintf(g_info.reason, sizeof g_info.reason, "no CUDA device: cudaGetDeviceCount found 0");
        return;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        snprintf(g_info.reason, sizeof g_info.reason, "%s (sm_%d%d)", prop.name, prop.major,
                 prop.minor);
        g_info.memory_bytes = prop.totalGlobalMem;
    }
}

const kn_cuda_info *kn_cudart_probe(void)
{
    pthread_once(&g_once, probe_once);
    return &g_info;
}
