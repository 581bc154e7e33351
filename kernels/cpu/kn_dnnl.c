/* bf16 products on the CPU through oneDNN (kn_gemm.h: kn_bgemm), and whether
 * this CPU runs them natively (kn_cpu_bf16_check).
 *
 * A product is a oneDNN matmul primitive, created once per shape (transposes,
 * sizes, leading dimensions, scale, output type, bias, accumulation) and kept
 * in a small cache shared by all threads; each call only wraps the caller's
 * pointers in memory objects and executes it on the calling thread's stream.
 *
 * The bits of a product depend on its shape only, never on the thread count,
 * as kn_sgemm's do (a pipeline stage with fewer threads must compute what
 * one stage computes): every primitive is created for one thread, so its
 * blocking (and the order of each output's sums) is fixed, and a large
 * product is cut into fixed panels, each computed by one thread of the
 * caller's OpenMP team (oneDNN runs a primitive inline inside a parallel
 * region). oneDNN's AMX/AVX512_BF16 kernels (brgemm) take dense matrices
 * only, and fall back to a generic kernel, several times slower, on
 * strided ones; so every panel is made dense: panels are rows of C when C
 * has enough of them, otherwise columns, computed into a dense scratch and
 * copied out; a panel's slice of a transposed A (rows) or of an untransposed
 * B (columns) is copied into a dense block first. */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_backend.h"
#include "kn_gemm.h"
#include "sl_float.h"
#include "sl_mem.h"

/* Panels: at most KN_BGEMM_PANELS, each at least KN_BGEMM_PANEL_MIN rows or
 * columns (half that for a product of KN_BGEMM_NARROW multiply-adds or more
 * that would otherwise be one panel); products under KN_BGEMM_SMALL
 * multiply-adds are one call on the calling thread. All constants: the cut
 * depends on the shape. */
#define KN_BGEMM_PANELS 8
#define KN_BGEMM_PANEL_MIN 256
#define KN_BGEMM_SMALL (1 << 22)
#define KN_BGEMM_NARROW (1 << 26)
#define KN_BGEMM_CACHE 256

static dnnl_engine_t g_engine;
static pthread_key_t g_stream_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_status = -1; /* dnnl_status_t of the engine's creation */

static void stream_free(void *s)
{
    dnnl_stream_destroy((dnnl_stream_t)s);
}

static void init_once(void)
{
    g_init_status = (int)dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    if (g_init_status == dnnl_success && pthread_key_create(&g_stream_key, stream_free) != 0) {
        dnnl_engine_destroy(g_engine);
        g_init_status = dnnl_out_of_memory;
    }
}

/* The calling thread's stream (oneDNN streams are not shared between
 * threads), made on first use and destroyed when the thread ends. */
static dnnl_stream_t my_stream(void)
{
    dnnl_stream_t s = pthread_getspecific(g_stream_key);
    if (!s && dnnl_stream_create(&s, g_engine, dnnl_stream_default_flags) == dnnl_success &&
        pthread_setspecific(g_stream_key, s) != 0) {
        dnnl_stream_destroy(s);
        s = NULL;
    }
    return s;
}

/* ---- the cache of primitives -------------------------------------------------- */

typedef struct bkey {
    int ta, tb, M, N, K, lda, ldb, ldc, c16, bias, acc;
    float alpha;
} bkey;

typedef struct bprim {
    bkey k;
    dnnl_primitive_t p;
    dnnl_memory_desc_t a, b, c, bias, scratch;
    size_t scratch_bytes;
    unsigned long tick; /* last use */
    int users;          /* calls running it now (never evicted while > 0) */
    int cached;         /* 0: made for one call only (the cache was full of running ones) */
} bprim;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static bprim *g_cache[KN_BGEMM_CACHE];
static int g_ncache;
static unsigned long g_tick;

static int key_eq(const bkey *x, const bkey *y)
{
    return x->ta == y->ta && x->tb == y->tb && x->M == y->M && x->N == y->N && x->K == y->K &&
           x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->c16 == y->c16 &&
           x->bias == y->bias && x->acc == y->acc && x->alpha == y->alpha;
}

static void prim_free(bprim *b)
{
    if (b) {
        dnnl_primitive_destroy(b->p);
        free(b);
    }
}

/* A 2-D row-major operand of `rows` x `cols` (after its transpose) with
 * leading dimension ld; trans: stored as cols x rows. */
static dnnl_status_t md2(dnnl_memory_desc_t *md, int rows, int cols, int trans, int ld,
                         dnnl_data_type_t dt)
{
    dnnl_dims_t d = {rows, cols};
    dnnl_dims_t s = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, d, dt, s);
}

/* Creates the primitive of k for one thread (its blocking then does not
 * depend on the caller's thread count). */
static bprim *prim_make(const bkey *k)
{
    bprim *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->k = *k;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_post_ops_t po = NULL;
    int was = omp_get_max_threads();
    omp_set_num_threads(1);
    dnnl_status_t st = md2(&b->a, k->M, k->K, k->ta, k->lda, dnnl_bf16);
    if (st == dnnl_success)
        st = md2(&b->b, k->K, k->N, k->tb, k->ldb, dnnl_bf16);
    if (st == dnnl_success)
        st = md2(&b->c, k->M, k->N, 0, k->ldc, k->c16 ? dnnl_bf16 : dnnl_f32);
    if (st == dnnl_success && k->bias) {
        dnnl_dims_t d = {1, k->N};
        st = dnnl_memory_desc_init_by_tag(&b->bias, 2, d, dnnl_f32, dnnl_ab);
    }
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&md, &b->a, &b->b, k->bias ? &b->bias : NULL, &b->c);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && k->alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
    if (st == dnnl_success && k->acc) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_sum(po, 1.0f);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL);
    if (st == dnnl_success) {
        b->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        b->scratch_bytes = dnnl_memory_desc_get_size(&b->scratch);
        st = dnnl_primitive_create(&b->p, pd);
    }
    omp_set_num_threads(was);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_post_ops_destroy(po);
    if (st != dnnl_success) {
        free(b);
        return NULL;
    }
    return b;
}

/* The primitive of k, from the cache or made now; release it with prim_put. */
static bprim *prim_get(const bkey *k)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_ncache; i++)
        if (key_eq(&g_cache[i]->k, k)) {
            bprim *b = g_cache[i];
            b->users++;
            b->tick = ++g_tick;
            pthread_mutex_unlock(&g_mu);
            return b;
        }
    pthread_mutex_unlock(&g_mu);
    bprim *b = prim_make(k); /* outside the lock: it compiles kernels */
    if (!b)
        return NULL;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_ncache; i++)
        if (key_eq(&g_cache[i]->k, k)) { /* another thread made it meanwhile */
            bprim *c = g_cache[i];
            c->users++;
            c->tick = ++g_tick;
            pthread_mutex_unlock(&g_mu);
            prim_free(b);
            return c;
        }
    int slot = g_ncache < KN_BGEMM_CACHE ? g_ncache : -1;
    if (slot < 0) /* full: the least recently used one that nobody runs */
        for (int i = 0; i < g_ncache; i++)
            if (g_cache[i]->users == 0 && (slot < 0 || g_cache[i]->tick < g_cache[slot]->tick))
                slot = i;
    b->users = 1;
    b->tick = ++g_tick;
    if (slot >= 0) {
        if (slot < g_ncache)
            prim_free(g_cache[slot]);
        else
            g_ncache++;
        g_cache[slot] = b;
        b->cached = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return b;
}

static void prim_put(bprim *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&g_mu);
    b->users--;
    int drop = !b->cached;
    pthread_mutex_unlock(&g_mu);
    if (drop)
        prim_free(b);
}

/* Runs b on the calling thread's stream: C = op(A) op(B) (+ bias) (+ C). */
static int prim_run(const bprim *b, const void *A, const void *B, const float *bias, void *C,
                    void *scratch)
{
    dnnl_stream_t s = my_stream();
    if (!s)
        return -1;
    dnnl_memory_t m[5] = {NULL, NULL, NULL, NULL, NULL};
    int n = 0;
    dnnl_exec_arg_t args[5];
    const dnnl_memory_desc_t *mds[5] = {&b->a, &b->b, &b->c, &b->scratch, &b->bias};
    void *ptrs[5] = {(void *)A, (void *)B, C, scratch, (void *)bias};
    int ids[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD, DNNL_ARG_BIAS};
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < 5 && st == dnnl_success; i++) {
        if ((i == 3 && !b->scratch_bytes) || (i == 4 && !b->k.bias))
            continue;
        st = dnnl_memory_create(&m[n], mds[i], g_engine, ptrs[i]);
        if (st == dnnl_success) {
            args[n].arg = ids[i];
            args[n].memory = m[n];
            n++;
        }
    }
    if (st == dnnl_success)
        st = dnnl_primitive_execute(b->p, s, n, args);
    for (int i = 0; i < n; i++)
        dnnl_memory_destroy(m[i]);
    return st == dnnl_success ? 0 : -1;
}

/* One product on the calling thread, with a scratchpad of its own. */
static int run_one(const bkey *k, const void *A, const void *B, const float *bias, void *C)
{
    bprim *b = prim_get(k);
    if (!b)
        return -1;
    void *sp = b->scratch_bytes ? sl_try_aligned_alloc(b->scratch_bytes) : NULL;
    int rc = b->scratch_bytes && !sp ? -1 : prim_run(b, A, B, bias, C, sp);
    sl_aligned_free(sp);
    prim_put(b);
    return rc;
}

int kn_bgemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
             const uint16_t *B, int ldb, const float *bias, int accumulate, void *C, int ldc,
             int c_bf16)
{
    if (M <= 0 || N <= 0)
        return 0;
    if (pthread_once(&g_once, init_once) != 0 || g_init_status != dnnl_success)
        return -1;
    size_t es = c_bf16 ? 2 : 4;
    if (K <= 0) { /* no products: C = bias (+ C) */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                size_t at = (size_t)i * ldc + j;
                float v = bias ? bias[j] : 0.0f;
                if (c_bf16)
                    ((uint16_t *)C)[at] = sl_f32_to_bf16(v);
                else
                    ((float *)C)[at] = v + (accumulate ? ((float *)C)[at] : 0.0f);
            }
        return 0;
    }
    bkey k = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
              .c16 = c_bf16, .bias = bias != NULL, .acc = accumulate, .alpha = alpha};
    if ((double)M * N * K < KN_BGEMM_SMALL) {
        int was = omp_get_max_threads();
        if (was > 1)
            omp_set_num_threads(1);
        int rc = run_one(&k, A, B, bias, C);
        if (was > 1)
            omp_set_num_threads(was);
        return rc;
    }
    int rows = M >= 2 * KN_BGEMM_PANEL_MIN, len = rows ? M : N;
    int per = (len + KN_BGEMM_PANELS - 1) / KN_BGEMM_PANELS;
    per = per < KN_BGEMM_PANEL_MIN ? KN_BGEMM_PANEL_MIN : (per + 63) / 64 * 64;
    /* too narrow for two panels of the minimum but large (a decoder's
     * input gradient: few rows and columns, K the vocabulary): half-width
     * panels rather than one thread */
    if (per >= len && len >= KN_BGEMM_PANEL_MIN && (double)M * N * K >= KN_BGEMM_NARROW)
        per = KN_BGEMM_PANEL_MIN / 2;
    int np = (len + per - 1) / per, fail = 0;
    /* a column panel goes to a dense (M, per) scratch, then into C */
    size_t dense = rows ? 0 : (size_t)M * per * es;
#pragma omp parallel for schedule(static) reduction(| : fail)
    for (int i = 0; i < np; i++) {
        int at = i * per, n = len - at < per ? len - at : per;
        bkey pk = k;
        const uint16_t *a = A, *b = B;
        char *c = C;
        /* the panel's slice of a transposed A or an untransposed B: the
         * columns at..at+n-1 of K stored rows, made a dense K x n block */
        const uint16_t *src = NULL;
        int ld = 0;
        if (rows) { /* rows at..at+n-1 of op(A) and C */
            pk.M = n;
            a = ta ? A + at : A + (size_t)at * lda;
            c = (char *)C + (size_t)at * ldc * es;
            if (ta && lda != n) {
                src = a;
                ld = lda;
                pk.lda = n;
            }
        } else { /* columns at..at+n-1 of op(B), bias and C */
            pk.N = n;
            pk.ldc = n;
            pk.acc = 0;
            b = tb ? B + (size_t)at * ldb : B + at;
            c = (char *)C + (size_t)at * es;
            if (!tb && ldb != n) {
                src = b;
                ld = ldb;
                pk.ldb = n;
            }
        }
        uint16_t *blk = src ? sl_try_aligned_alloc((size_t)K * n * sizeof(uint16_t)) : NULL;
        if (blk) {
            for (int r = 0; r < K; r++)
                memcpy(blk + (size_t)r * n, src + (size_t)r * ld, (size_t)n * sizeof(uint16_t));
            if (rows)
                a = blk;
            else
                b = blk;
        }
        void *out = rows ? (void *)c : sl_try_aligned_alloc(dense);
        if (!out || (src && !blk) ||
            run_one(&pk, a, b, bias ? bias + (rows ? 0 : at) : NULL, out)) {
            fail |= 1;
        } else if (!rows) {
            for (int r = 0; r < M; r++) {
                char *dst = c + (size_t)r * ldc * es, *src = (char *)out + (size_t)r * n * es;
                if (accumulate) { /* fp32 only: C += the product */
                    float *d = (float *)dst;
                    const float *x = (const float *)src;
                    for (int j = 0; j < n; j++)
                        d[j] += x[j];
                } else {
                    memcpy(dst, src, (size_t)n * es);
                }
            }
        }
        if (!rows)
            sl_aligned_free(out);
        sl_aligned_free(blk);
    }
    return fail ? -1 : 0;
}

/* ---- does this CPU run bf16 natively? ------------------------------------------- */

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2_VNNI";
    case dnnl_cpu_isa_avx512_mic: return "AVX512_MIC";
    case dnnl_cpu_isa_avx512_mic_4ops: return "AVX512_MIC_4OPS";
    case dnnl_cpu_isa_avx512_core: return "AVX512_CORE";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX512_CORE_VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX512_CORE_BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX512_CORE_AMX";
    default: return "none";
    }
}

/* CPUID: AVX512_BF16 (leaf 7 subleaf 1, EAX bit 5) and AMX-BF16 (leaf 7
 * subleaf 0, EDX bit 22). */
static void cpu_bf16(int *avx512_bf16, int *amx_bf16)
{
    *avx512_bf16 = *amx_bf16 = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7)
        return;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    *amx_bf16 = (d >> 22) & 1;
    unsigned sub = a;
    if (sub >= 1) {
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        *avx512_bf16 = (a >> 5) & 1;
    }
#endif
}

const char *kn_dnnl_isa(void)
{
    return isa_name(dnnl_get_effective_cpu_isa());
}

const char *kn_dnnl_version(void)
{
    static char v[32];
    const dnnl_version_t *x = dnnl_version();
    snprintf(v, sizeof v, "%d.%d.%d", x->major, x->minor, x->patch);
    return v;
}

int kn_cpu_bf16_check(sl_err *err)
{
    int avx, amx;
    cpu_bf16(&avx, &amx);
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    int native = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
                 (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if (!avx && !amx)
        return sl_err_set(err, SL_ENOTSUP, "bf16 needs the AVX512_BF16 or AMX-BF16 instructions, "
                          "which this CPU does not have (oneDNN's instruction set here: %s); "
                          "emulated bf16 products would be slower than fp32: use --precision fp32",
                          isa_name(isa));
    if (!native)
        return sl_err_set(err, SL_ENOTSUP, "bf16 needs oneDNN's AVX512_BF16 or AMX kernels, but "
                          "oneDNN is limited to %s here (DNNL_MAX_CPU_ISA=%s); this CPU has %s",
                          isa_name(isa), getenv("DNNL_MAX_CPU_ISA") ? getenv("DNNL_MAX_CPU_ISA") : "unset",
                          amx ? "AMX-BF16" : "AVX512_BF16");
    if (pthread_once(&g_once, init_once) != 0 || g_init_status != dnnl_success)
        return sl_err_set(err, SL_EINTERNAL, "oneDNN: cannot create a CPU engine (status %d)",
                          g_init_status);
    return 0;
}

/* ---- failures of the ops that use it -------------------------------------------- */

static _Thread_local char t_fail[160];

void kn_cpu_fail(const char *what)
{
    if (!t_fail[0])
        snprintf(t_fail, sizeof t_fail, "%s", what);
}

int kn_cpu_status(sl_err *err)
{
    if (!t_fail[0])
        return 0;
    sl_err_set(err, SL_EINTERNAL, "oneDNN: %s failed (out of memory, or a shape it refused)",
               t_fail);
    t_fail[0] = 0;
    return -1;
}
