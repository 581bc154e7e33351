/* dev_unitprof.h - how long each unit of a model takes here: the per-unit
 * forward and backward seconds of one micro-batch that the balancer plans
 * with (bal_device.unit_fwd_s / unit_bwd_s). Measured on this backend and
 * with the calling thread's OpenMP/BLAS thread count, so a device with fewer
 * cores, threads or a CPU quota measures as slower. The embeddings, one
 * encoder layer (all layers are the same) and the head (the config's
 * task's: the MLM head at 15% of the positions, or the classification head
 * at every sequence's [CLS] row) are each run as a stage of their own on
 * random inputs; each time is the median of `reps`
 * runs after one warm-up. The optimizer step is timed the same way, on the
 * gradients of the last backward. */
#ifndef DEV_UNITPROF_H
#define DEV_UNITPROF_H

#include "dev_config.h"
#include "dev_stage.h"
#include "kn_be.h"
#include "sl_err.h"

/* fwd and bwd get dev_unit_count(c) entries each. be NULL: the CPU. With
 * optim non-NULL (dev_unit_count entries too), also the optimizer step of
 * each unit under `o` (NULL: dev_optim_default; the gradient norm and the update; `stage_flags` as
 * for dev_stage_create, for bf16 optimizer state). */
int dev_unit_times(const dev_config *c, int micro_batch, int T, const kn_be *be, int reps,
                   const dev_optim *o, unsigned stage_flags, double *fwd, double *bwd,
                   double *optim, sl_err *err);

#endif
