/* bench_sbgemm: OpenBLAS's cblas_sbgemm (bf16 inputs, fp32 output) side by
 * side with oneDNN's bf16 matmul and fp32 cblas_sgemm, on BERT-base's
 * linear-layer products (forward, input gradient, weight gradient), with
 * the calling thread's OpenMP count; GFLOP/s (median of reps), the error
 * against a double-precision product of the same bf16 inputs, and whether
 * the bits change between 1 and 2 threads. For docs/dependencies.md.
 *
 * Debian's OpenBLAS is built without bf16 (no cblas_sbgemm symbol), so this
 * links an OpenBLAS built with BUILD_BFLOAT16=1: bench/sbgemm.sh builds
 * Debian's own 0.3.21 source that way and runs this. Not in `make bench`. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint16_t bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float widen(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

typedef struct prod {
    int ta, tb, M, N, K;
    const char *what;
} prod;

/* one oneDNN bf16 matmul, its own threads, row-major with dense operands */
static dnnl_primitive_t dnnl_make(dnnl_engine_t eng, const prod *p)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t da = {p->M, p->K}, db = {p->K, p->N}, dc = {p->M, p->N};
    dnnl_dims_t sa = {p->ta ? 1 : p->K, p->ta ? p->M : 1}, sb = {p->tb ? 1 : p->N, p->tb ? p->K : 1},
                sc = {p->N, 1};
    dnnl_memory_desc_init_by_strides(&a, 2, da, dnnl_bf16, sa);
    dnnl_memory_desc_init_by_strides(&b, 2, db, dnnl_bf16, sb);
    dnnl_memory_desc_init_by_strides(&c, 2, dc, dnnl_f32, sc);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim = NULL;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success)
        return NULL;
    dnnl_primitive_create(&prim, pd);
    dnnl_primitive_desc_destroy(pd);
    return prim;
}

static void dnnl_run(dnnl_engine_t eng, dnnl_stream_t s, dnnl_primitive_t prim, void *A, void *B,
                     float *C)
{
    const_dnnl_primitive_desc_t pd;
    dnnl_primitive_get_primitive_desc(prim, &pd);
    dnnl_memory_t m[3];
    dnnl_memory_create(&m[0], dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), eng, A);
    dnnl_memory_create(&m[1], dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), eng, B);
    dnnl_memory_create(&m[2], dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), eng, C);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
    dnnl_primitive_execute(prim, s, 3, args);
    for (int i = 0; i < 3; i++)
        dnnl_memory_destroy(m[i]);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    const prod ps[] = {
        {0, 1, 1024, 3072, 768, "ffn up, forward"},
        {0, 0, 1024, 768, 3072, "ffn up, input gradient"},
        {1, 0, 3072, 768, 1024, "ffn up, weight gradient"},
        {0, 1, 1024, 768, 768, "attention output, forward"},
    };
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
    int threads = omp_get_max_threads();
    printf("OpenBLAS %s, core %s; oneDNN; %d thread(s)\n", openblas_get_config(),
           openblas_get_corename(), threads);
    printf("| product | M x N x K | sgemm fp32 GFLOP/s | sbgemm GFLOP/s | oneDNN bf16 GFLOP/s | "
           "sbgemm rel. error | oneDNN rel. error | sbgemm bits 1 vs %d threads |\n", threads);
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        const prod *p = &ps[k];
        size_t na = (size_t)p->M * p->K, nb = (size_t)p->K * p->N, nc = (size_t)p->M * p->N;
        float *af = malloc(na * 4), *bf = malloc(nb * 4), *c = malloc(nc * 4), *c1 = malloc(nc * 4);
        uint16_t *a16 = malloc(na * 2), *b16 = malloc(nb * 2);
        for (size_t i = 0; i < na; i++)
            a16[i] = bf16((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f), af[i] = widen(a16[i]);
        for (size_t i = 0; i < nb; i++)
            b16[i] = bf16((float)((i * 40503u) % 1999) / 10000.0f - 0.1f), bf[i] = widen(b16[i]);
        int lda = p->ta ? p->M : p->K, ldb = p->tb ? p->K : p->N;
        CBLAS_TRANSPOSE tA = p->ta ? CblasTrans : CblasNoTrans, tB = p->tb ? CblasTrans : CblasNoTrans;
        double fl = 2.0 * p->M * p->N * p->K, t[3];
        double *dt = malloc((size_t)(reps + 1) * sizeof *dt);
        dnnl_primitive_t prim = dnnl_make(eng, p);
        for (int impl = 0; impl < 3; impl++) {
            for (int r = 0; r <= reps; r++) {
                double t0 = now();
                if (impl == 0)
                    cblas_sgemm(CblasRowMajor, tA, tB, p->M, p->N, p->K, 1.0f, af, lda, bf, ldb, 0.0f,
                                c, p->N);
                else if (impl == 1)
                    cblas_sbgemm(CblasRowMajor, tA, tB, p->M, p->N, p->K, 1.0f, (bfloat16 *)a16, lda,
                                 (bfloat16 *)b16, ldb, 0.0f, c, p->N);
                else
                    dnnl_run(eng, strm, prim, a16, b16, c);
                dt[r] = now() - t0;
            }
            qsort(dt + 1, (size_t)reps, sizeof *dt, cmpd);
            t[impl] = fl / dt[1 + reps / 2] / 1e9;
        }
        /* accuracy against double from the same bf16 values, sampled rows */
        double err[2] = {0, 0}, mx = 0;
        for (int impl = 0; impl < 2; impl++) {
            if (impl == 0)
                cblas_sbgemm(CblasRowMajor, tA, tB, p->M, p->N, p->K, 1.0f, (bfloat16 *)a16, lda,
                             (bfloat16 *)b16, ldb, 0.0f, c, p->N);
            else
                dnnl_run(eng, strm, prim, a16, b16, c);
            for (int i = 0; i < p->M; i += 61)
                for (int j = 0; j < p->N; j++) {
                    double s = 0;
                    for (int q = 0; q < p->K; q++)
                        s += (double)(p->ta ? af[(size_t)q * lda + i] : af[(size_t)i * lda + q]) *
                             (p->tb ? bf[(size_t)j * ldb + q] : bf[(size_t)q * ldb + j]);
                    err[impl] = fmax(err[impl], fabs(c[(size_t)i * p->N + j] - s));
                    mx = fmax(mx, fabs(s));
                }
        }
        /* the bits with 1 and with all threads */
        cblas_sbgemm(CblasRowMajor, tA, tB, p->M, p->N, p->K, 1.0f, (bfloat16 *)a16, lda,
                     (bfloat16 *)b16, ldb, 0.0f, c, p->N);
        openblas_set_num_threads(1);
        omp_set_num_threads(1);
        cblas_sbgemm(CblasRowMajor, tA, tB, p->M, p->N, p->K, 1.0f, (bfloat16 *)a16, lda,
                     (bfloat16 *)b16, ldb, 0.0f, c1, p->N);
        openblas_set_num_threads(threads);
        omp_set_num_threads(threads);
        printf("| %s | %d x %d x %d | %.0f | %.0f | %.0f | %.2g | %.2g | %s |\n", p->what, p->M, p->N,
               p->K, t[0], t[1], t[2], err[0] / mx, err[1] / mx,
               memcmp(c, c1, nc * 4) ? "differ" : "equal");
        dnnl_primitive_destroy(prim);
        free(af), free(bf), free(c), free(c1), free(a16), free(b16), free(dt);
    }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
