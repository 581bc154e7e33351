/* The CPU backend (host memory, kn_ops.h) and backend selection. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kn_backend.h"
#include "kn_be.h"
#include "sl_mem.h"

static void *cpu_alloc(size_t bytes, sl_err *err)
{
    void *p = sl_try_aligned_alloc(bytes ? bytes : 1);
    if (!p)
        sl_err_set(err, SL_ENOMEM, "cannot allocate %zu bytes", bytes);
    return p;
}

/* Large copies and zeroings (a stage's activations and their gradients,
 * megabytes each) are split over the calling thread's OpenMP team, in
 * chunks of KN_MOVE_CHUNK bytes; smaller ones, and overlapping moves, are
 * one call. */
#define KN_MOVE_CHUNK ((size_t)1 << 20)

static int cpu_move(void *dst, const void *src, size_t bytes, sl_err *err)
{
    (void)err;
    if (!bytes || dst == src)
        return 0;
    const char *s = src;
    char *d = dst;
    if (bytes < 2 * KN_MOVE_CHUNK || (d < s + bytes && s < d + bytes)) {
        memmove(dst, src, bytes);
        return 0;
    }
    size_t n = (bytes + KN_MOVE_CHUNK - 1) / KN_MOVE_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; k++) {
        size_t at = k * KN_MOVE_CHUNK, len = bytes - at < KN_MOVE_CHUNK ? bytes - at : KN_MOVE_CHUNK;
        memcpy(d + at, s + at, len);
    }
    return 0;
}

static int cpu_zero(void *p, size_t bytes, sl_err *err)
{
    (void)err;
    char *d = p;
    if (bytes < 2 * KN_MOVE_CHUNK) {
        memset(p, 0, bytes);
        return 0;
    }
    size_t n = (bytes + KN_MOVE_CHUNK - 1) / KN_MOVE_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; k++) {
        size_t at = k * KN_MOVE_CHUNK, len = bytes - at < KN_MOVE_CHUNK ? bytes - at : KN_MOVE_CHUNK;
        memset(d + at, 0, len);
    }
    return 0;
}

/* The ops run when called; only a failed bf16 product (oneDNN) is left to
 * report. */
static int cpu_sync(sl_err *err)
{
    return kn_cpu_status(err);
}

static const kn_be cpu_be = {
    .name = "cpu",
    .resident = 0,
    .init = NULL,
    .alloc = cpu_alloc,
    .free = sl_aligned_free,
    .upload = cpu_move,
    .download = cpu_move,
    .copy = cpu_move,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .embed_forward = kn_embed_forward,
    .embed_backward = kn_embed_backward,
    .layernorm_forward = kn_layernorm_forward,
    .layernorm_backward = kn_layernorm_backward,
    .matmul_forward = kn_matmul_forward,
    .matmul_backward = kn_matmul_backward,
    .attention_forward = kn_attention_forward,
    .attention_backward = kn_attention_backward,
    .gelu_forward = kn_gelu_forward,
    .gelu_backward = kn_gelu_backward,
    .residual_forward = kn_residual_forward,
    .residual_backward = kn_residual_backward,
    .dropout_forward = kn_dropout_forward,
    .dropout_backward = kn_dropout_backward,
    .gather_rows = kn_gather_rows,
    .scatter_rows = kn_scatter_rows,
    .crossentropy_forward = kn_crossentropy_forward,
    .crossentropy_backward = kn_crossentropy_backward,
    .adamw_update = kn_adamw_update,
    .adamw_update_bf16 = kn_adamw_update_bf16,
    .lamb_update = kn_lamb_update,
    .sumsq = kn_sumsq,
    .scale = kn_scale,
    .bf16_check = kn_cpu_bf16_check,
    .to_bf16 = kn_to_bf16,
    .layernorm_forward_bf16 = kn_layernorm_forward_bf16,
    .matmul_forward_bf16 = kn_matmul_forward_bf16,
    .matmul_backward_bf16 = kn_matmul_backward_bf16,
    .attention_forward_bf16 = kn_attention_forward_bf16,
    .attention_backward_bf16 = kn_attention_backward_bf16,
    .gelu_forward_bf16 = kn_gelu_forward_bf16,
    .gelu_backward_bf16 = kn_gelu_backward_bf16,
    .tanh_forward = kn_tanh_forward,
    .tanh_backward = kn_tanh_backward,
};

const kn_be *kn_be_cpu(void) { return &cpu_be; }

__attribute__((format(printf, 3, 4))) static void say(char *why, size_t n, const char *fmt, ...)
{
    if (!why || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

int kn_be_name_ok(const char *name)
{
    return name && (!strcmp(name, "auto") || !strcmp(name, "cpu") || !strcmp(name, "cuda"));
}

const kn_be *kn_be_open(const char *name, char *why, size_t why_n, sl_err *err)
{
    if (!name || !strcmp(name, "cpu")) {
        say(why, why_n, "cpu (asked for)");
        return kn_be_cpu();
    }
    int want_cuda = !strcmp(name, "cuda");
    if (!kn_be_name_ok(name)) {
        sl_err_set(err, SL_EINVAL, "unknown device '%s' (cpu, cuda or auto)", name);
        return NULL;
    }
    const kn_cuda_info *ci = kn_cuda_probe();
    const kn_be *g = kn_be_cuda();
    sl_err e;
    sl_err_clear(&e);
    int ok = g && ci->device_count > 0 && (!g->init || g->init(&e) == 0);
    const char *reason = !g || ci->device_count <= 0 ? ci->reason : e.msg;
    if (ok) {
        say(why, why_n, "cuda (%s)", ci->reason);
        return g;
    }
    if (want_cuda) {
        sl_err_set(err, SL_ENOTSUP, "--device cuda: %s", reason);
        return NULL;
    }
    say(why, why_n, "cpu (no GPU: %s)", reason);
    return kn_be_cpu();
}
