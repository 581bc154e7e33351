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

typedef struct unit_run {
    const dev_config *c;
    int Bm, T, reps;
    const kn_be *be;
    const dev_optim *o; /* NULL: the optimizer step is not timed */
    unsigned flags;
    const dev_micro *mb;
    const float *x, *dy;
    float *y, *dx;
} unit_run;

/* One unit as a stage of its own: reps forwards and backwards, timed, then
 * reps optimizer steps. */
static int time_unit(const unit_run *ur, int u, double *tf, double *tb, double *to, sl_err *err)
{
    const dev_config *c = ur->c;
    const kn_be *be = ur->be;
    int reps = ur->reps;
    dev_stage *st = dev_stage_create(c, u, u, ur->Bm, ur->T, 1, 1, be, ur->flags, err);
    if (!st)
        return -1;
    double *f = sl_xmalloc((size_t)(reps + 1) * 3 * sizeof *f), *b = f + reps + 1,
           *o = b + reps + 1;
    int rc = 0, head = u == dev_unit_head(c);
    for (int r = 0; r <= reps && !rc; r++) { /* r = 0: warm-up */
        double loss = 0;
        int masked = 0;
        double t0 = sl_now_s();
        rc = dev_stage_forward(st, 0, ur->mb, u ? ur->x : NULL, head ? NULL : ur->y, &loss,
                               &masked, err) ||
             (be && be->sync(err));
        double t1 = sl_now_s();
        rc = rc || dev_stage_backward(st, 0, ur->mb, head ? NULL : ur->dy, u ? ur->dx : NULL, err) ||
             (be && be->sync(err));
        double t2 = sl_now_s();
        f[r] = t1 - t0;
        b[r] = t2 - t1;
    }
    int nt = 0;
    dev_stage_tensors(st, &nt);
    double *sumsq = sl_xmalloc(((size_t)nt + 1) * sizeof *sumsq);
    for (int r = 0; ur->o && r <= reps && !rc; r++) {
        int n = 0;
        double t0 = sl_now_s();
        rc = dev_stage_grad_sumsqs(st, sumsq, &n, err) ||
             dev_stage_step(st, ur->o, 1.0f, err) || (be && be->sync(err));
        o[r] = sl_now_s() - t0;
    }
    if (!rc) {
        *tf = median(f + 1, reps);
        *tb = median(b + 1, reps);
        if (ur->o)
            *to = median(o + 1, reps);
    }
    free(f);
    free(sumsq);
    dev_stage_free(st);
    return rc ? -1 : 0;
}

int dev_unit_times(const dev_config *c, int Bm, int T, const kn_be *be, int reps,
                   const dev_optim *o, unsigned stage_flags, double *fwd, double *bwd,
                   double *optim, sl_err *err)
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
        if (c->task == DEV_TASK_CLASSIFY) /* each sequence's class at its [CLS] position */
            lab[i] = i % (size_t)T == 0 ? (int32_t)(sl_rng_u32(0x7E57, 2, i) % (uint32_t)c->num_labels)
                                        : -100;
        else
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
    dev_optim def;
    if (optim && !o) {
        dev_optim_default(&def);
        o = &def;
    }
    unit_run ur = {.c = c, .Bm = Bm, .T = T, .reps = reps, .be = be, .o = optim ? o : NULL,
                   .flags = stage_flags, .mb = &mb, .x = x, .dy = dy, .y = y, .dx = dx};
    int L = c->layers, H = L + 1, rc = 0;
    double lf = 0, lb = 0, lo = 0, eo = 0, ho = 0;
    rc = time_unit(&ur, 0, &fwd[0], &bwd[0], &eo, err) ||
         (L > 0 && time_unit(&ur, 1, &lf, &lb, &lo, err)) ||
         time_unit(&ur, H, &fwd[H], &bwd[H], &ho, err);
    for (int u = 1; u <= L; u++) {
        fwd[u] = lf;
        bwd[u] = lb;
    }
    if (optim) {
        optim[0] = eo;
        optim[H] = ho;
        for (int u = 1; u <= L; u++)
            optim[u] = lo;
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
