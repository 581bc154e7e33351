/* kn_backend.h - what compute backends this build and this machine have. */
#ifndef KN_BACKEND_H
#define KN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "sl_err.h"

typedef struct kn_cuda_info {
    bool compiled;       /* built with nvcc (HAVE_CUDA) */
    int device_count;    /* usable GPUs; 0 when none */
    int status;          /* cudaError_t of the probe (0 = success) */
    char reason[320];    /* why no GPU, or the GPU's name */
    size_t memory_bytes; /* global memory of device 0 */
} kn_cuda_info;

/* Probes the CUDA runtime once (cached). Never fails: "no GPU" is a result. */
const kn_cuda_info *kn_cuda_probe(void);
/* Runs a tiny kernel on device 0 and checks its result; -1 with reason when
 * no GPU or the result is wrong. */
int kn_cuda_selftest(char *reason, size_t n);

/* The CBLAS library in use: name and build string (OpenBLAS's config), and
 * the CPU kernels it runs (OpenBLAS's core name). */
const char *kn_blas_name(void);
const char *kn_blas_core(void);
/* The OpenBLAS core this CPU's instructions call for where OpenBLAS does
 * not know the model ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA,
 * NULL otherwise); see kn_blas.c. */
const char *kn_blas_core_for_cpu(void);
int kn_blas_threads(void);

/* bf16 compute on the CPU (oneDNN): 0 when the CPU has AVX512_BF16 or
 * AMX-BF16 and oneDNN uses them; else -1 naming what is missing (oneDNN
 * would emulate bf16, slower than fp32, and that is never done silently). */
int kn_cpu_bf16_check(sl_err *err);
/* oneDNN's version and the instruction set its kernels use here. */
const char *kn_dnnl_version(void);
const char *kn_dnnl_isa(void);
/* The first bf16 product failure on this thread since the last call: -1
 * with its message (then cleared), or 0 (the CPU backend's sync). */
int kn_cpu_status(sl_err *err);
void kn_blas_set_threads(int n);

#endif
