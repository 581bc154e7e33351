/* bench_train: one full training step (forward, backward, clipping, AdamW)
 * of BERT MLM on this CPU, in tokens/s, for the issue #4 configurations:
 *   a: L2 H128 A2 F512 V8192   b: L4 H256 A4 F1024 V8192   c: BERT-base
 * seq 128, batch 8, dropout 0.1, 15% of positions masked (decoder only at
 * those). Prints one JSON line: median step, tokens/s, share of the step in
 * the matrix multiplies and their GFLOP/s against plain cblas_sgemm on the
 * same shapes, peak RSS. bench/run.sh puts it side by side with PyTorch.
 * A fourth argument picks the backend (cpu, the default, or cuda). */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_util.h"
#include "dev_train.h"
#include "kn_backend.h"
#include "kn_gemm.h"
#include "sl_mem.h"
#include "sl_time.h"

/* The step's linear layers for N tokens and M masked rows, (rows, in, out):
 * per encoder layer qkv, the attention's projection and the FFN's two
 * products, then the head's transform and decoder; count: how many of each;
 * out16: the step keeps that product's output in bf16 (bf16 compute). */
enum { N_LINEAR = 6 };
static void step_linears(const dev_config *c, int N, int M, int shapes[N_LINEAR][3],
                         int count[N_LINEAR], int out16[N_LINEAR])
{
    int C = c->hidden, F = c->intermediate, V = c->vocab, L = c->layers;
    const int s[N_LINEAR][5] = {{N, C, 3 * C, L, 1}, {N, C, C, L, 0}, {N, C, F, L, 1},
                                {N, F, C, L, 0},     {M, C, C, 1, 0}, {M, C, V, 1, 0}};
    for (int i = 0; i < N_LINEAR; i++) {
        shapes[i][0] = s[i][0], shapes[i][1] = s[i][1], shapes[i][2] = s[i][2];
        count[i] = s[i][3];
        out16[i] = s[i][4];
    }
}

/* Plain sgemm on the step's shapes: per linear (N, IC, OC) one forward and
 * two backward products, as kn_matmul_* does them. Returns GFLOP/s. */
static double plain_sgemm(const dev_config *c, int N, int M, int reps)
{
    int C = c->hidden, F = c->intermediate, V = c->vocab;
    int shapes[N_LINEAR][3], count[N_LINEAR], out16[N_LINEAR];
    step_linears(c, N, M, shapes, count, out16);
    size_t big = (size_t)(N > M ? N : M) * (size_t)(F > V ? (F > 3 * C ? F : 3 * C) : V);
    float *a = sl_xaligned_alloc(big * 4), *b = sl_xaligned_alloc(big * 4),
          *o = sl_xaligned_alloc(big * 4);
    for (size_t i = 0; i < big; i++)
        a[i] = b[i] = o[i] = 0.01f * (float)(i % 97);
    double flops = 0, t0 = sl_now_s();
    for (int r = 0; r < reps; r++)
        for (int s = 0; s < N_LINEAR; s++)
            for (int k = 0; k < count[s]; k++) {
                int n = shapes[s][0], ic = shapes[s][1], oc = shapes[s][2];
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, ic, 1, a, ic, b, ic, 0,
                            o, oc);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, ic, oc, 1, a, oc, b, ic,
                            0, o, ic);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, ic, n, 1, a, oc, b, ic, 1,
                            o, ic);
                flops += 6.0 * n * ic * oc;
            }
    double dt = sl_now_s() - t0;
    sl_aligned_free(a);
    sl_aligned_free(b);
    sl_aligned_free(o);
    return flops / dt / 1e9;
}

/* The step's own bf16 linear-layer products, replayed in a loop as the step
 * calls them: each layer with its own weights, inputs, output gradients and
 * weight gradients (the step's working set, not one buffer that stays in
 * cache), the forward with its bias and, where the step keeps its output in
 * bf16 (qkv, the FFN's first product), a bf16 output; the backward's input
 * and weight gradients accumulating; the layers forward, then the head, then
 * backward in reverse. GFLOP/s. */
static double replay_bgemm(const dev_config *c, int N, int M, int reps)
{
    int L = c->layers;
    int shapes[N_LINEAR][3], count[N_LINEAR], out16[N_LINEAR];
    step_linears(c, N, M, shapes, count, out16);
    typedef struct {
        const int *sh; /* rows, in, out */
        int c16;
        uint16_t *x16, *w16, *d16;
        float *bias, *dw;
    } product;
    int np = 4 * L + 2; /* the layers' four in order, layer after layer; the head's two */
    product *pr = sl_xcalloc((size_t)np, sizeof *pr);
    size_t most_out = 0, most_in = 0;
    for (int i = 0; i < np; i++) {
        int k = i < 4 * L ? i % 4 : 4 + (i - 4 * L);
        const int *sh = shapes[k];
        size_t n = (size_t)sh[0], ic = (size_t)sh[1], oc = (size_t)sh[2];
        pr[i].sh = sh;
        pr[i].c16 = out16[k];
        pr[i].x16 = sl_xaligned_alloc(n * ic * 2);
        pr[i].w16 = sl_xaligned_alloc(oc * ic * 2);
        pr[i].d16 = sl_xaligned_alloc(n * oc * 2);
        pr[i].bias = sl_xcalloc(oc, sizeof(float));
        pr[i].dw = sl_xcalloc(oc * ic, sizeof(float));
        for (size_t k = 0; k < n * ic; k++)
            pr[i].x16[k] = (uint16_t)(0x3c00 + k % 97); /* small positive bf16 values */
        for (size_t k = 0; k < oc * ic; k++)
            pr[i].w16[k] = (uint16_t)(0x3c00 + k % 89);
        for (size_t k = 0; k < n * oc; k++)
            pr[i].d16[k] = (uint16_t)(0x3c00 + k % 83);
        most_out = n * oc > most_out ? n * oc : most_out;
        most_in = n * ic > most_in ? n * ic : most_in;
    }
    float *out = sl_xcalloc(most_out, sizeof(float)), *dx = sl_xcalloc(most_in, sizeof(float));
    double flops = 0, t0 = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        if (r == 0)
            t0 = sl_now_s();
        for (int i = 0; i < np; i++) {
            const int *sh = pr[i].sh;
            kn_bgemm(0, 1, sh[0], sh[2], sh[1], 1.0f, pr[i].x16, sh[1], pr[i].w16, sh[1],
                     pr[i].bias, 0, out, sh[2], pr[i].c16);
        }
        for (int i = np - 1; i >= 0; i--) {
            const int *sh = pr[i].sh;
            kn_bgemm(0, 0, sh[0], sh[1], sh[2], 1.0f, pr[i].d16, sh[2], pr[i].w16, sh[1], NULL, 1,
                     dx, sh[1], 0);
            kn_bgemm(1, 0, sh[2], sh[1], sh[0], 1.0f, pr[i].d16, sh[2], pr[i].x16, sh[1], NULL, 1,
                     pr[i].dw, sh[1], 0);
        }
        if (r >= 0)
            for (int i = 0; i < np; i++)
                flops += 6.0 * pr[i].sh[0] * pr[i].sh[1] * pr[i].sh[2];
    }
    double gf = flops / (sl_now_s() - t0) / 1e9;
    for (int i = 0; i < np; i++) {
        sl_aligned_free(pr[i].x16);
        sl_aligned_free(pr[i].w16);
        sl_aligned_free(pr[i].d16);
        free(pr[i].bias);
        free(pr[i].dw);
    }
    free(pr);
    free(out);
    free(dx);
    return gf;
}

/* The same shapes in bf16 (bf16 compute), in a loop over one set of buffers
 * that stays in cache, without bias or bf16 outputs: through kn_bgemm (the
 * step's fixed panels on one thread each) into *ours, and as one oneDNN
 * matmul per product with oneDNN's own threads (bits that depend on the
 * thread count, which a pipeline stage cannot have) into *whole. GFLOP/s. */
static void plain_bgemm(const dev_config *c, int N, int M, int reps, double *ours, double *whole)
{
    int C = c->hidden, F = c->intermediate, V = c->vocab;
    int shapes[N_LINEAR][3], count[N_LINEAR], out16[N_LINEAR];
    step_linears(c, N, M, shapes, count, out16);
    size_t big = (size_t)(N > M ? N : M) * (size_t)(F > V ? (F > 3 * C ? F : 3 * C) : V);
    uint16_t *a = sl_xaligned_alloc(big * 2), *b = sl_xaligned_alloc(big * 2);
    float *o = sl_xaligned_alloc(big * 4);
    for (size_t i = 0; i < big; i++) {
        a[i] = b[i] = (uint16_t)(0x3c00 + i % 97); /* small positive bf16 values */
        o[i] = 0;
    }
    /* the three products of a linear layer: out = x w^T, dx = dy w, dw = dy^T x */
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
    dnnl_primitive_t prim[N_LINEAR][3];
    for (int sh = 0; sh < N_LINEAR; sh++)
        for (int k = 0; k < 3; k++) {
            int n = shapes[sh][0], ic = shapes[sh][1], oc = shapes[sh][2];
            int m = k == 2 ? oc : n, nn = k == 0 ? oc : ic, kk = k == 0 ? ic : k == 1 ? oc : n;
            int ta = k == 2, tb = k == 0;
            dnnl_memory_desc_t ma, mb, mc;
            dnnl_dims_t da = {m, kk}, db = {kk, nn}, dc = {m, nn};
            dnnl_dims_t sa = {ta ? 1 : kk, ta ? m : 1}, sb = {tb ? 1 : nn, tb ? kk : 1},
                        sc = {nn, 1};
            dnnl_memory_desc_init_by_strides(&ma, 2, da, dnnl_bf16, sa);
            dnnl_memory_desc_init_by_strides(&mb, 2, db, dnnl_bf16, sb);
            dnnl_memory_desc_init_by_strides(&mc, 2, dc, dnnl_f32, sc);
            dnnl_matmul_desc_t md;
            dnnl_primitive_desc_t pd;
            dnnl_matmul_desc_init(&md, &ma, &mb, NULL, &mc);
            dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL);
            dnnl_primitive_create(&prim[sh][k], pd);
            dnnl_primitive_desc_destroy(pd);
        }
    for (int pass = 0; pass < 2; pass++) {
        double flops = 0, t0 = 0;
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            if (r == 0)
                t0 = sl_now_s();
            for (int sh = 0; sh < N_LINEAR; sh++)
                for (int rep = 0; rep < count[sh]; rep++) {
                    int n = shapes[sh][0], ic = shapes[sh][1], oc = shapes[sh][2];
                    if (pass == 0) {
                        kn_bgemm(0, 1, n, oc, ic, 1.0f, a, ic, b, ic, NULL, 0, o, oc, 0);
                        kn_bgemm(0, 0, n, ic, oc, 1.0f, a, oc, b, ic, NULL, 1, o, ic, 0);
                        kn_bgemm(1, 0, oc, ic, n, 1.0f, a, oc, b, ic, NULL, 1, o, ic, 0);
                    } else {
                        for (int k = 0; k < 3; k++) {
                            const_dnnl_primitive_desc_t pd;
                            dnnl_primitive_get_primitive_desc(prim[sh][k], &pd);
                            dnnl_memory_t m[3];
                            dnnl_memory_create(&m[0], dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), eng, a);
                            dnnl_memory_create(&m[1], dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), eng, b);
                            dnnl_memory_create(&m[2], dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), eng, o);
                            dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]},
                                                       {DNNL_ARG_DST, m[2]}};
                            dnnl_primitive_execute(prim[sh][k], strm, 3, args);
                            for (int x = 0; x < 3; x++)
                                dnnl_memory_destroy(m[x]);
                        }
                    }
                    if (r >= 0)
                        flops += 6.0 * n * ic * oc;
                }
        }
        double gf = flops / (sl_now_s() - t0) / 1e9;
        *(pass ? whole : ours) = gf;
    }
    for (int sh = 0; sh < N_LINEAR; sh++)
        for (int k = 0; k < 3; k++)
            dnnl_primitive_destroy(prim[sh][k]);
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    sl_aligned_free(a);
    sl_aligned_free(b);
    sl_aligned_free(o);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "a";
    /* "c+r": config c on a recomputing stage (DEV_STAGE_RECOMPUTE); "+a":
     * attention recomputed (DEV_STAGE_RECOMPUTE_ATTN); "+b": bf16 optimizer
     * moments (DEV_STAGE_BF16_STATE); combined as in "+ab" */
    const char *plus = strchr(which, '+');
    unsigned flags = 0;
    for (const char *q = plus ? plus + 1 : ""; *q; q++)
        flags |= *q == 'r'   ? DEV_STAGE_RECOMPUTE
                 : *q == 'a' ? DEV_STAGE_RECOMPUTE_ATTN
                 : *q == 'b' ? DEV_STAGE_BF16_STATE
                 : *q == 'p' ? DEV_STAGE_BF16_COMPUTE
                             : 0x100;
    char base[8];
    snprintf(base, sizeof base, "%.*s", (int)(plus ? (size_t)(plus - which) : strlen(which)), which);
    if (flags & 0x100)
        base[0] = 0; /* an unknown suffix: usage */
    int steps = argc > 2 ? atoi(argv[2]) : 10, threads = argc > 3 ? atoi(argv[3]) : 2;
    const char *device = argc > 4 ? argv[4] : "cpu";
    dev_config c = {.max_pos = 512, .type_vocab = 2, .ln_eps = 1e-12f, .gelu = 0,
                    .hidden_dropout = 0.1f, .attn_dropout = 0.1f, .init_range = 0.02f};
    if (!strcmp(base, "a")) {
        c.layers = 2, c.hidden = 128, c.heads = 2, c.intermediate = 512, c.vocab = 8192;
    } else if (!strcmp(base, "b")) {
        c.layers = 4, c.hidden = 256, c.heads = 4, c.intermediate = 1024, c.vocab = 8192;
    } else if (!strcmp(base, "c")) {
        c.layers = 12, c.hidden = 768, c.heads = 12, c.intermediate = 3072, c.vocab = 30522;
    } else {
        fprintf(stderr, "usage: bench_train a|b|c[+{r,a,b,p}...] [steps] [threads] [cpu|cuda]  (r: "
                        "recompute, a: recompute attention, b: bf16 optimizer state, p: bf16 "
                        "compute)\n");
        return 2;
    }
    if (steps < 1 || threads < 1) {
        fprintf(stderr, "steps and threads must be positive\n");
        return 2;
    }
    omp_set_num_threads(threads);
    kn_blas_set_threads(threads);
    enum { B = 8, T = 128 };
    size_t n = (size_t)B * T;
    int32_t *tok = sl_xmalloc(n * 4), *seg = sl_xcalloc(n, 4), *valid = sl_xmalloc(n * 4),
            *lab = sl_xmalloc(n * 4);
    int M = 0;
    for (size_t i = 0; i < n; i++) {
        tok[i] = 5 + (int32_t)((i * 2654435761u) % (uint32_t)(c.vocab - 5));
        valid[i] = 1;
        int r = (int)(i % 20);
        lab[i] = (r == 0 || r == 7 || r == 13) ? 5 + (int32_t)((i * 40503u) % (uint32_t)(c.vocab - 5)) : -100;
        M += lab[i] != -100;
    }
    sl_err err = {0};
    int bounds[2] = {0, dev_unit_count(&c)};
    const kn_be *be = kn_be_open(device, NULL, 0, &err);
    dev_train *tr = be ? dev_train_create_on(&c, bounds, 1, B, T, 1, 1, be, flags, &err) : NULL;
    if (!tr) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    dev_optim o;
    dev_optim_default(&o);
    dev_batch b = {.B = B, .T = T, .tokens = tok, .segments = seg, .valid = valid, .labels = lab};
    dev_step_info info;
    dev_stage *st = dev_train_stage(tr, 0);
    double *dt = sl_xmalloc((size_t)steps * sizeof *dt), *mm = sl_xmalloc((size_t)steps * sizeof *mm);
    double flops = 0;
    for (int s = -1; s < steps; s++) { /* s = -1: warm-up */
        dev_stage_prof(st, 1);
        double t0 = sl_now_s();
        if (dev_train_step(tr, &b, &o, &info, &err)) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        double t = sl_now_s() - t0;
        if (s >= 0) {
            dt[s] = t;
            dev_stage_prof_get(st, &mm[s], &flops);
        }
    }
    double mm_med_flops = flops;
    double step = bench_median(dt, steps), mms = bench_median(mm, steps);
    struct rusage ru; /* before plain_sgemm's own buffers */
    getrusage(RUSAGE_SELF, &ru);
    double plain = plain_sgemm(&c, (int)n, M, 3), ours = 0, whole = 0, replay = 0;
    if (flags & DEV_STAGE_BF16_COMPUTE) {
        replay = replay_bgemm(&c, (int)n, M, 3);
        plain_bgemm(&c, (int)n, M, 3, &ours, &whole);
    }
    printf("{\"impl\": \"skyloom\", \"config\": \"%s\", \"params\": %zu, \"step_s\": %.4f, "
           "\"tokens_per_s\": %.1f, \"sgemm_share\": %.3f, \"sgemm_gflops\": %.1f, "
           "\"plain_sgemm_gflops\": %.1f, \"peak_rss_mb\": %.1f, \"stage_mb\": %.1f, "
           "\"loss\": %.4f, \"steps\": %d, \"threads\": %d, \"device\": \"%s\", "
           "\"replay_bgemm_gflops\": %.1f, \"plain_bgemm_gflops\": %.1f, "
           "\"dnnl_whole_gflops\": %.1f}\n",
           which, dev_config_param_count(&c), step, (double)n / step, mms / step,
           mm_med_flops / mms / 1e9, plain, ru.ru_maxrss / 1024.0, dev_stage_bytes(st) / 1048576.0,
           info.loss, steps, threads, be->name, replay, ours, whole);
    dev_train_free(tr);
    free(dt);
    free(mm);
    free(tok);
    free(seg);
    free(valid);
    free(lab);
    return 0;
}
