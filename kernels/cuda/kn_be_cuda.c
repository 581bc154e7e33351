/* The CUDA backend: device memory and the ops of kn_cuda.h, and the entry
 * point of the CUDA module (libskyloom_cuda.so) that kn_cuda_load.c opens. */
#include "kn_be.h"
#include "kn_cuda.h"

static const kn_be cuda_be = {
    .name = "cuda",
    .resident = 1,
    .init = kn_cuda_init,
    .alloc = kn_cuda_alloc,
    .free = kn_cuda_free,
    .upload = kn_cuda_upload,
    .download = kn_cuda_download,
    .copy = kn_cuda_copy,
    .zero = kn_cuda_zero,
    .sync = kn_cuda_sync,
    .embed_forward = kn_cuda_embed_forward,
    .embed_backward = kn_cuda_embed_backward,
    .layernorm_forward = kn_cuda_layernorm_forward,
    .layernorm_backward = kn_cuda_layernorm_backward,
    .matmul_forward = kn_cuda_matmul_forward,
    .matmul_backward = kn_cuda_matmul_backward,
    .attention_forward = kn_cuda_attention_forward,
    .attention_backward = kn_cuda_attention_backward,
    .gelu_forward = kn_cuda_gelu_forward,
    .gelu_backward = kn_cuda_gelu_backward,
    .residual_forward = kn_cuda_residual_forward,
    .residual_backward = kn_cuda_residual_backward,
    .dropout_forward = kn_cuda_dropout_forward,
    .dropout_backward = kn_cuda_dropout_backward,
    .gather_rows = kn_cuda_gather_rows,
    .scatter_rows = kn_cuda_scatter_rows,
    .crossentropy_forward = kn_cuda_crossentropy_forward,
    .crossentropy_backward = kn_cuda_crossentropy_backward,
    .adamw_update = kn_cuda_adamw_update,
    .adamw_update_bf16 = kn_cuda_adamw_update_bf16,
    .lamb_update = kn_cuda_lamb_update,
    .sumsq = kn_cuda_sumsq,
    .scale = kn_cuda_scale,
    .bf16_check = kn_cuda_bf16_check,
    .to_bf16 = kn_cuda_to_bf16,
    .layernorm_forward_bf16 = kn_cuda_layernorm_forward_bf16,
    .matmul_forward_bf16 = kn_cuda_matmul_forward_bf16,
    .matmul_backward_bf16 = kn_cuda_matmul_backward_bf16,
    .attention_forward_bf16 = kn_cuda_attention_forward_bf16,
    .attention_backward_bf16 = kn_cuda_attention_backward_bf16,
    .gelu_forward_bf16 = kn_cuda_gelu_forward_bf16,
    .gelu_backward_bf16 = kn_cuda_gelu_backward_bf16,
    .tanh_forward = kn_cuda_tanh_forward,
    .tanh_backward = kn_cuda_tanh_backward,
};

static const kn_cuda_module module = {
    .abi = KN_CUDA_MODULE_ABI,
    .probe = kn_cudart_probe,
    .selftest = kn_cudart_selftest,
    .be = &cuda_be,
};

__attribute__((visibility("default"))) const kn_cuda_module *skyloom_cuda_module(void)
{
    return &module;
}
