/* dev_unitprof.c - per-unit timing (dev_unitprof.h). */
#include "dev_unitprof.h"

#include <stdlib.h>
#include <string.h>

#include "dev_model.h"
#include "dev_stage.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_time.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One unit as a stage of its own: reps forwards and backwards, timed. */
static int time_unit(const dev_config *c, int u, int Bm, int T, const kn_be *be, int reps,
                     const dev_micro *mb, const float *x, float *y, const float *dy, float *dx,
                     double *tf, double *tb, sl_err *err)
{
    dev_stage *st = dev_stage_create(c, u, u, Bm, T, 1, 1, be, 0, err);
    if (!st)
        return -1;
    double *f = sl_xmalloc((size_t)(reps + 1) * 2 * sizeof *f), *b = f + reps + 1;
    int rc = 0, head = u == dev_unit_head(c);
    for (int r = 0; r <= reps && !rc; r++) { /* r = 0: warm-up */
        double loss = 0;
        int masked = 0;
        double t0 = sl_now_s();
        rc = dev_stage_forward(st, 0, mb, u ? x : NULL, head ? NULL : y, &loss, &masked, err) ||
             (be && be->sync(err));
        double t1 = sl_now_s();
        rc = rc || dev_stage_backward(st, 0, mb, head ? NULL : dy, u ? dx : NULL, err) ||
             (be && be->sync(err));
        double t2 = sl_now_s();
        f[r] = t1 - t0;
        b[r] = t2 - t1;
    }
    if (!rc) {
        *tf = median(f + 1, reps);
        *tb = median(b + 1, reps);
    }
    free(f);
    dev_stage_free(st);
    return rc ? -1 : 0;
}

int dev_unit_times(const dev_config *c, int Bm, int T, const kn_be *be, int reps, double *fwd,
                   double *bwd, sl_err *err)
{
    if (Bm < 1 || T < 1 || T > c->max_pos || reps < 1)
        return sl_err_set(err, SL_EINVAL, "unit timing: micro-batch %dx%d, %d repetitions", Bm, T,
                          reps);
    size_t N = (size_t)Bm * T, NC = N * (size_t)c->hidden;
    int32_t *tok = sl_xmalloc(N * 4), *seg = sl_xcalloc(N, 4), *valid = sl_xmalloc(N * 4),
            *lab = sl_xmalloc(N * 4);
    int masked = 0;
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(sl_rng_u32(0x7E57, 1, i) % (uint32_t)c->vocab);
        valid[i] = 1;
        lab[i] = sl_rng_u32(0x7E57, 2, i) % 100 < 15 ? tok[i] : -100;
        masked += lab[i] != -100;
    }
    float *x = sl_xaligned_alloc(NC * 4), *y = sl_xaligned_alloc(NC * 4),
          *dy = sl_xaligned_alloc(NC * 4), *dx = sl_xaligned_alloc(NC * 4);
    for (size_t i = 0; i < NC; i++) {
        x[i] = sl_rng_normal(0x7E57, 3, i);
        dy[i] = 1e-3f * sl_rng_normal(0x7E57, 4, i);
    }
    dev_micro mb = {.B = Bm, .T = T, .tokens = tok, .segments = seg, .valid = valid,
                    .labels = lab, .seq0 = 0, .step = 1, .seed = 1,
                    .loss_scale = masked ? 1.0f / (float)masked : 0.0f, .train = 1};
    int L = c->layers, rc = 0;
    double lf = 0, lb = 0;
    rc = time_unit(c, 0, Bm, T, be, reps, &mb, x, y, dy, dx, &fwd[0], &bwd[0], err) ||
         (L > 0 && time_unit(c, 1, Bm, T, be, reps, &mb, x, y, dy, dx, &lf, &lb, err)) ||
         time_unit(c, L + 1, Bm, T, be, reps, &mb, x, y, dy, dx, &fwd[L + 1], &bwd[L + 1], err);
    for (int u = 1; u <= L; u++) {
        fwd[u] = lf;
        bwd[u] = lb;
    }
    free(tok);
    free(seg);
    free(valid);
    free(lab);
    sl_aligned_free(x);
    sl_aligned_free(y);
    sl_aligned_free(dy);
    sl_aligned_free(dx);
    return rc ? -1 : 0;
}
