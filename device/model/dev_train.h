/* dev_train.h - training on this machine: a chain of stages, each run by the
 * stage runner (dev_pipe.h). One stage runs on the calling thread with no
 * port (the single-device trainer, `skyloom train`); several run one thread
 * each over the in-process port (`skyloom train --stages`), in the 1F1B or
 * GPipe order the balancer simulates. Either way the result is bit for bit
 * the one-stage result (tests/test_stages.c).
 *
 * A federation (dev_train_open_fed, docs/federation.md) is R such chains,
 * the replicas, each with its own batch and cuts, every stage on a thread of
 * its own, meeting through the in-process replica sync (dev_sync.h): the
 * same runner, so the networked job equals it. */
#ifndef DEV_TRAIN_H
#define DEV_TRAIN_H

#include "dev_fed.h"
#include "dev_mlm.h"
#include "dev_pipe.h"
#include "dev_shard.h"
#include "dev_stage.h"

typedef struct dev_train dev_train;

typedef struct dev_train_opts {
    int schedule;      /* BAL_1F1B (default) or BAL_GPIPE */
    int stage_threads; /* OpenMP and BLAS threads of each stage thread when there are
                        * several stages; 0: the cores divided among them (at least 1) */
    const kn_be *be;   /* every stage's backend (NULL: the CPU) ... */
    const kn_be *const *stage_be; /* ... or one per stage (NULL: be for all) */
    unsigned flags;    /* dev_stage_create's flags */
} dev_train_opts;

/* bounds[0..n]: stage i owns units bounds[i] .. bounds[i+1]-1; bounds[0] = 0,
 * bounds[n] = L+2. B must be a multiple of micro. o may be NULL (defaults). */
dev_train *dev_train_open(const dev_config *c, const int *bounds, int nstages, int B, int T,
                          int micro, uint64_t seed, const dev_train_opts *o, sl_err *err);
/* The same with default options (CPU, 1F1B). */
dev_train *dev_train_create(const dev_config *c, const int *bounds, int nstages, int B, int T,
                            int micro, uint64_t seed, sl_err *err);
/* The same on backend `be` with dev_stage_create's flags. */
dev_train *dev_train_create_on(const dev_config *c, const int *bounds, int nstages, int B, int T,
                               int micro, uint64_t seed, const kn_be *be, unsigned flags,
                               sl_err *err);
void dev_train_free(dev_train *tr);
/* Replica 0's stages (the only replica outside a federation). */
int dev_train_nstages(const dev_train *tr);
dev_stage *dev_train_stage(dev_train *tr, int i);
dev_pipe *dev_train_pipe(dev_train *tr, int i);

/* One replica of a federation: its cut and its owner's batch. */
typedef struct dev_replica_cfg {
    const int *bounds;            /* bounds[0..nstages], as dev_train_open's */
    int nstages;
    int B;                        /* its sequences per step (a multiple of micro) */
    const kn_be *const *stage_be; /* one per stage, or NULL: the options' */
} dev_replica_cfg;

/* R replicas rep[0..R) of the model, replica r's stages seeded and
 * initialised alike (they start from the same weights), synchronised under
 * fed (its sync.replicas and weights are set here from the batches:
 * w_r = B_r / sum B). fed NULL: no federation, R must be 1 (dev_train_open). */
dev_train *dev_train_open_fed(const dev_config *c, const dev_replica_cfg *rep, int R, int T,
                              int micro, uint64_t seed, const dev_train_opts *o,
                              const dev_fed_cfg *fed, sl_err *err);
int dev_train_replicas(const dev_train *tr);
int dev_train_replica_nstages(const dev_train *tr, int r);
dev_stage *dev_train_replica_stage(dev_train *tr, int r, int i);
dev_pipe *dev_train_replica_pipe(dev_train *tr, int r, int i);
/* The federation's configuration, NULL outside one. */
const dev_fed_cfg *dev_train_fed(const dev_train *tr);
/* Replica r's last step (its loss, masked count, norm, learning rate). */
void dev_train_replica_info(const dev_train *tr, int r, dev_step_info *info);
/* Payload bytes the replicas have given to the sync since the start: what a
 * network port sends to each other replica (dev_fed_bytes, summed). */
uint64_t dev_train_sync_bytes(dev_train *tr);

/* Zeroes the gradients, runs every micro-batch forward and backward, sums the
 * tied embeddings (and under --sync step reduces them across replicas);
 * leaves the gradients in the stages. b[r] is replica r's batch (one batch
 * outside a federation). */
int dev_train_grads(dev_train *tr, const dev_batch *b, uint64_t step, dev_step_info *info,
                    sl_err *err);
/* dev_train_grads, then clipping and one optimizer step on every stage (and
 * under outer:H, at every multiple of H, the outer step). info: the
 * replicas' loss weighted as their gradients are (w_r), their masked tokens
 * summed, replica 0's norm and learning rate (dev_train_replica_info has
 * each). After a failure the stages may be out of step with each other:
 * stop, or load a checkpoint. */
int dev_train_step(dev_train *tr, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                   sl_err *err);
/* Forward only, dropout off, replica 0: sum of losses and number of masked
 * tokens. */
int dev_train_eval(dev_train *tr, const dev_batch *b, double *loss_sum, int *masked, sl_err *err);

/* A batch from the data part (dev_mlm.h) seen as a dev_batch. */
static inline dev_batch dev_batch_of(const dev_mlm_batch *m)
{
    dev_batch b = {.B = m->B, .T = m->T, .tokens = m->tokens, .segments = m->segments,
                   .valid = m->valid, .labels = m->labels};
    return b;
}
/* Refuses a shard the model cannot read: ids beyond vocab_size, sequences
 * longer than max_position_embeddings; to classify, a shard without labels
 * or with another count of them than num_labels. */
int dev_train_check_shard(const dev_config *c, const dev_shard *s, sl_err *err);

#endif
