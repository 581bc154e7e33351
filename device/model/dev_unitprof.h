/* dev_unitprof.h - how long each unit of a model takes here: the per-unit
 * forward and backward seconds of one micro-batch that the balancer plans
 * with (bal_device.unit_fwd_s / unit_bwd_s). Measured on this backend and
 * with the calling thread's OpenMP/BLAS thread count, so a device with fewer
 * cores, threads or a CPU quota measures as slower. The embeddings, one
 * encoder layer (all layers are the same) and the head are each run as a
 * stage of their own on random inputs; each time is the median of `reps`
 * runs after one warm-up. */
#ifndef DEV_UNITPROF_H
#define DEV_UNITPROF_H

#include "dev_config.h"
#include "kn_be.h"
#include "sl_err.h"

/* fwd and bwd get dev_unit_count(c) entries each. be NULL: the CPU. */
int dev_unit_times(const dev_config *c, int micro_batch, int T, const kn_be *be, int reps,
                   double *fwd, double *bwd, sl_err *err);

#endif
