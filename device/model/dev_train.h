/* dev_train.h - training steps over a chain of stages run in sequence in this
 * process: the single-device trainer (one stage owning every unit) and the
 * reference that split runs are checked against (tests/test_stages.c).
 *
 * One step: the batch (B sequences) is split into M micro-batches of B/M;
 * each goes forward through the stages and back; the gradients accumulate
 * with the loss scale 1/(masked tokens in the whole batch), so the result is
 * the gradient of the batch's mean MLM loss. Then the tied embeddings are
 * summed, the global norm is combined from per-stage partial sums of squares,
 * gradients are clipped, and every stage steps its optimizer. */
#ifndef DEV_TRAIN_H
#define DEV_TRAIN_H

#include "dev_mlm.h"
#include "dev_shard.h"
#include "dev_stage.h"

typedef struct dev_batch {
    int B, T;
    const int32_t *tokens, *segments, *valid, *labels; /* (B,T) */
    uint64_t seq0; /* global index of the batch's first sequence (dropout keys) */
} dev_batch;

typedef struct dev_step_info {
    double loss;      /* mean MLM loss over the batch's masked tokens */
    int masked;       /* masked tokens in the batch */
    double grad_norm; /* before clipping */
    float lr;
} dev_step_info;

typedef struct dev_train dev_train;

/* bounds[0..n]: stage i owns units bounds[i] .. bounds[i+1]-1; bounds[0] = 0,
 * bounds[n] = L+2. B must be a multiple of micro. */
dev_train *dev_train_create(const dev_config *c, const int *bounds, int nstages, int B, int T,
                            int micro, uint64_t seed, sl_err *err);
/* The same with every stage's tensors on backend `be` (kn_be.h; NULL = CPU)
 * and dev_stage_create's `flags` (DEV_STAGE_RECOMPUTE). */
dev_train *dev_train_create_on(const dev_config *c, const int *bounds, int nstages, int B, int T,
                               int micro, uint64_t seed, const kn_be *be, unsigned flags,
                               sl_err *err);
void dev_train_free(dev_train *tr);
int dev_train_nstages(const dev_train *tr);
dev_stage *dev_train_stage(dev_train *tr, int i);

/* Zeroes the gradients, runs every micro-batch forward and backward, sums the
 * tied embeddings; leaves the gradients in the stages. */
int dev_train_grads(dev_train *tr, const dev_batch *b, uint64_t step, dev_step_info *info,
                    sl_err *err);
/* dev_train_grads, then clipping and one optimizer step on every stage. */
int dev_train_step(dev_train *tr, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                   sl_err *err);
/* Forward only, dropout off: sum of losses and number of masked tokens. */
int dev_train_eval(dev_train *tr, const dev_batch *b, double *loss_sum, int *masked, sl_err *err);

/* A batch from the data part (dev_mlm.h) seen as a dev_batch. */
static inline dev_batch dev_batch_of(const dev_mlm_batch *m, uint64_t seq0)
{
    dev_batch b = {.B = m->B, .T = m->T, .tokens = m->tokens, .segments = m->segments,
                   .valid = m->valid, .labels = m->labels, .seq0 = seq0};
    return b;
}
/* Refuses a shard the model cannot read: ids beyond vocab_size, sequences
 * longer than max_position_embeddings. */
int dev_train_check_shard(const dev_config *c, const dev_shard *s, sl_err *err);

#endif
