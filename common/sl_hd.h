/* sl_hd.h - one macro for math shared by CPU and CUDA code.
 *
 * Per-element and per-row bodies are written once as SL_HD functions: under
 * nvcc they become __host__ __device__, under the C compiler plain static
 * inline. A CPU test can then run the very body a CUDA kernel runs. */
#ifndef SL_HD_H
#define SL_HD_H

#ifdef __CUDACC__
#define SL_HD static inline __host__ __device__
#else
#define SL_HD static inline
#endif

#endif
