/* bal_int.h - the balancer's internals shared between its .c files. */
#ifndef BAL_INT_H
#define BAL_INT_H

#include <stdint.h>

#include "bal.h"

/* Optimizer step cost: AdamW touches every parameter a few times and is
 * memory-bound; we charge this many FLOPs per parameter at the device's rate. */
#define BAL_OPT_FLOPS_PER_PARAM 16.0

struct bal_problem {
    int n_units, n_dev;
    bal_unit *unit;
    bal_device *dev;
    double *tf, *tb;      /* [d * n_units + u] seconds */
    double *pre;          /* [d * (n_units + 1) + k] prefix of tf + tb */
    double *rate;         /* effective FLOP/s per device (optimizer estimate) */
    uint64_t *pstatic;    /* prefix of param + optim bytes, n_units + 1 */
    uint64_t *pstash;     /* prefix of stash bytes */
    uint64_t *pparam;     /* prefix of param bytes */
    int *site_of, *host_of;
    int n_sites;
    char (*site)[BAL_NAME_MAX];
    bal_link same_host;
    bal_link *inside;  /* n_sites */
    bal_link *between; /* n_sites * n_sites */
};

/* Stage time on device d for units [s, e). */
static inline double bal_time(const bal_problem *pb, int d, int s, int e)
{
    const double *p = pb->pre + (size_t)d * (pb->n_units + 1);
    return p[e] - p[s];
}

/* Stashed micro-batches on stage i of p with m micro-batches. */
static inline int bal_inflight(int schedule, int i, int p, int m)
{
    if (schedule == BAL_GPIPE)
        return m;
    return p - i < m ? p - i : m;
}

static inline int bal_fits(const bal_problem *pb, int d, int s, int e, int k)
{
    uint64_t st = pb->pstatic[e] - pb->pstatic[s];
    uint64_t sh = pb->pstash[e] - pb->pstash[s];
    uint64_t cap = pb->dev[d].mem_bytes;
    if (st > cap)
        return 0;
    return sh == 0 || (uint64_t)k <= (cap - st) / sh;
}

/* Serialization seconds of the boundary after unit e-1 on a link. */
static inline double bal_ser(const bal_problem *pb, bal_link l, int e)
{
    return (double)pb->unit[e - 1].out_bytes / l.bw;
}

/* bal_plan.c: a plan from a chain without validating it (cuts must be valid). */
bal_plan *bal_plan_build(const bal_problem *pb, int algo, const int *order, int p,
                         const int *cuts, int m, int schedule);
/* First stage whose memory is exceeded, or -1. */
int bal_plan_overflow(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                      int schedule);
/* Closed-form estimate: fill (first micro-batch's round trip) + (m-1) cycles + optimizer. */
double bal_estimate(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                    int schedule, double cycle);

/* The micro-batch count for a chain (o->micro_batches if set). */
int bal_choose_m(const bal_problem *pb, const int *order, int p, const int *cuts,
                 const bal_opts *o);
/* even or sky at m micro-batches (0: chosen). */
bal_plan *bal_plan_baseline(const bal_problem *pb, int algo, const bal_opts *o, int m,
                            sl_err *err);

/* bal_search.c */
bal_plan *bal_plan_optimal(const bal_problem *pb, const bal_opts *o, sl_err *err);

#endif
