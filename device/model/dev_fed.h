/* dev_fed.h - one stage's part of a federation (docs/federation.md): what it
 * keeps besides its replica's stage, and the two ways replicas meet, both
 * through a dev_sync (dev_sync.h).
 *
 * --sync step: after every step's backward (and the tied exchange), the
 * stage's gradients are replaced by sum_r w_r C(g_r + e_r), the replicas'
 * weighted average, before the global norm, clipping and the optimizer:
 * every replica then holds the same gradients, parameters and moments.
 *
 * --sync outer:H (DiLoCo): each replica steps alone; after the optimizer
 * update of every step that is a multiple of H, per tensor
 *     D_r = theta_outer - theta_r
 *     c_r = C(D_r + e_r);  e_r <- D_r + e_r - decode(c_r)
 *     D   = sum_r w_r decode(c_r)              (dev_sync_combine)
 *     v   <- mu v + D
 *     theta_outer <- theta_outer - lr (D + mu v)   (Nesterov, as DiLoCo)
 *     theta_r <- theta_outer
 * in float, each operation rounded (no fused multiply-add). Every replica
 * keeps theta_outer and v and computes the same update from the same D, so
 * all hold the same bytes afterwards; nobody owns the outer model. A
 * replica whose owner is away at that round (dev_sync_present) gives no
 * payload and only receives: D averages the replicas present.
 *
 * C is the federation's codec (none, fp16, bf16, int8 in rows, topk:F) with
 * error feedback kept per replica on the sender (e_r, none with codec none,
 * where it would stay 0). The head's copy of the word embeddings only
 * receives: the embeddings' stage gives its replica's contribution. */
#ifndef DEV_FED_H
#define DEV_FED_H

#include <stddef.h>
#include <stdint.h>

#include "dev_stage.h"
#include "dev_sync.h"
#include "sl_err.h"

enum dev_sync_mode { DEV_SYNC_NONE = 0, DEV_SYNC_STEP = 1, DEV_SYNC_OUTER = 2 };

typedef struct dev_fed_cfg {
    int mode;                      /* enum dev_sync_mode */
    int every;                     /* outer: H, the inner steps between outer steps */
    float outer_lr, outer_momentum;
    dev_sync_cfg sync;             /* replicas, their weights, the codec */
} dev_fed_cfg;

/* step, codec none, outer lr 0.7 (DiLoCo's) and momentum 0.5 (not DiLoCo's 0.9:
 * docs/federation.md, Benchmark, measures both), one replica. */
void dev_fed_default(dev_fed_cfg *c);
/* --sync: "step" or "outer:H" (H >= 1). The error names the option. */
int dev_fed_parse_sync(const char *s, dev_fed_cfg *c, sl_err *err);
/* --codec-sync: none, fp16, bf16, int8 or topk:F (0 < F <= 1). */
int dev_fed_parse_codec(const char *s, dev_fed_cfg *c, sl_err *err);
/* The options' spellings back: "step", "outer:50"; "int8", "topk:0.01". */
void dev_fed_sync_name(const dev_fed_cfg *c, char *buf, size_t n);
void dev_fed_codec_name(const dev_fed_cfg *c, char *buf, size_t n);

typedef struct dev_fed dev_fed;

/* The state of stage st (of replica sync->replica) under c; the stage and
 * the sync are not owned. */
dev_fed *dev_fed_create(dev_stage *st, const dev_fed_cfg *c, dev_sync *sync, sl_err *err);
void dev_fed_free(dev_fed *f);
const dev_fed_cfg *dev_fed_config(const dev_fed *f);

/* A run's start: theta_outer <- the stage's parameters, v and e <- 0.
 * Until then (or until a checkpoint restored them, dev_fed_set_ready) the
 * state is not ready and the runner begins it before its first step. */
int dev_fed_begin(dev_fed *f, sl_err *err);
int dev_fed_ready(const dev_fed *f);
void dev_fed_set_ready(dev_fed *f);

/* --sync step: the stage's gradients of step `step` become the replicas'
 * weighted average (every participant calls it, once per step). */
int dev_fed_grads(dev_fed *f, uint64_t step, sl_err *err);
/* 1 if step `step` ends with an outer step. */
int dev_fed_outer_due(const dev_fed *f, uint64_t step);
/* --sync outer:H: the outer step after step `step`'s update. Uses the
 * stage's gradient buffer as scratch (the next step zeroes it). */
int dev_fed_outer(dev_fed *f, uint64_t step, sl_err *err);

/* The state a checkpoint keeps, laid out as the stage's parameters (host
 * memory); NULL where it is not kept: theta_outer and v under outer:H, the
 * error-feedback residual with a lossy codec. */
float *dev_fed_outer_params(dev_fed *f);
float *dev_fed_momentum(dev_fed *f);
float *dev_fed_residual(dev_fed *f);
/* Payload bytes this stage has given (what a network port sends to each
 * other replica), since it was created. */
uint64_t dev_fed_bytes(const dev_fed *f);

#endif
