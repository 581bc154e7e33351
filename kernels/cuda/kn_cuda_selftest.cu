// A GPU smoke test: y = a*x + y on 4096 elements, checked on the host.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#include "kn_backend.h"
#include "kn_cuda.h"
}

__global__ static void saxpy_kernel(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

extern "C" int kn_cudart_selftest(char *reason, size_t n)
{
    const kn_cuda_info *info = kn_cudart_probe();
    if (info->device_count <= 0) {
        snprintf(reason, n, "%s", info->reason);
        return -1;
    }
    enum { N = 4096 };
    static float hx[N], hy[N];
    for (int i = 0; i < N; i++) {
        hx[i] = (float)i;
        hy[i] = 1.0f;
    }
    float *dx = NULL, *dy = NULL;
    int rc = -1;
    if (cudaMalloc(&dx, sizeof hx) != cudaSuccess || cudaMalloc(&dy, sizeof hy) != cudaSuccess) {
        snprintf(reason, n, "cudaMalloc failed");
        goto out;
    }
    cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice);
    cudaMemcpy(dy, hy, sizeof hy, cudaMemcpyHostToDevice);
    saxpy_kernel<<<(N + 255) / 256, 256>>>(N, 2.0f, dx, dy);
    if (cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(reason, n, "kernel or copy failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    for (int i = 0; i < N; i++)
        if (fabsf(hy[i] - (2.0f * i + 1.0f)) > 0.0f) {
            snprintf(reason, n, "wrong result at %d: %g", i, hy[i]);
            goto out;
        }
    snprintf(reason, n, "ok");
    rc = 0;
out:
    cudaFree(dx);
    cudaFree(dy);
    return rc;
}
