/* dev_pipe.h - the stage runner: one stage's part of one training step.
 *
 * It runs the stage's ops in the order bal_stage_ops gives (the order the
 * simulator replays: 1F1B or GPipe), moving activations, gradients and side
 * data through a port (dev_port.h), then finishes the step: the tied
 * word-embedding gradient, the global gradient norm from every stage's
 * per-tensor sums of squares (added in stage order, so any split gives the
 * one-stage norm bit for bit), clipping and the optimizer update.
 *
 * The single-device trainer is this runner with one stage and no port;
 * `skyloom train --stages` runs one per thread over the in-process port; a
 * device in a job runs one per stage it holds over the network port. One
 * loop, three transports. A federation's replicas meet through a second
 * interface, the replica sync (dev_sync.h, dev_pipe_set_fed), with the same
 * three transports.
 *
 * A step: the batch (B sequences) is split into M micro-batches of B/M; each
 * goes forward through the stages and back; gradients accumulate with the
 * loss scale 1/(labels in the whole batch: masked tokens, or classified
 * sequences), so the result is the gradient of the batch's mean loss. */
#ifndef DEV_PIPE_H
#define DEV_PIPE_H

#include <pthread.h>
#include <stdint.h>

#include "dev_fed.h"
#include "dev_port.h"
#include "dev_stage.h"
#include "dev_sync.h"

typedef struct dev_batch {
    int B, T;
    const int32_t *tokens, *segments, *valid, *labels; /* (B,T) */
} dev_batch;

typedef struct dev_step_info {
    double loss;      /* mean loss over the batch's labels (masked tokens, or sequences) */
    int masked;       /* labels in the batch */
    double grad_norm; /* before clipping */
    float lr;
} dev_step_info;

typedef struct dev_pipe_cfg {
    int stages, index; /* p, and this stage's place in the chain */
    int schedule;      /* BAL_1F1B or BAL_GPIPE (bal.h) */
    int warmup;        /* 1F1B: forwards before the first backward; -1: p - index - 1 */
    int B, T, micro;   /* batch, sequence length, micro-batches (B % micro == 0) */
    uint64_t seed;     /* run seed (dropout keys) */
    int replica;       /* a federation's replica this stage belongs to (dropout keys) */
    /* Stages of one device that share its cores (a data owner's first and
     * last stage) share this lock: one computes at a time, with all the
     * device's threads, as the balancer models them. NULL: none. */
    pthread_mutex_t *compute_lock;
} dev_pipe_cfg;

/* Micro-batches the stage stashes at most under cfg: the slots to create
 * its stage with. -1 if cfg is invalid. */
int dev_pipe_slots(const dev_pipe_cfg *c);

/* Where the time of the last step went, for metrics and the measured
 * timeline (seconds). */
typedef struct dev_pipe_times {
    double fwd_s, bwd_s;   /* computing */
    double recv_s, send_s; /* in port calls (waiting for a neighbour included) */
    double finish_s;       /* tied exchange, norm, optimizer */
    double wait_s;         /* waiting for the device's compute lock */
    double replica_s;      /* the replica sync (dev_sync.h), waiting for the others included */
    double step_s;         /* the whole step */
} dev_pipe_times;

typedef struct dev_pipe dev_pipe;

/* st must hold units matching its place (unit 0 on stage 0, the head on the
 * last stage) and at least dev_pipe_slots(cfg) slots; port may be NULL when
 * stages == 1. Neither is owned. */
dev_pipe *dev_pipe_create(dev_stage *st, const dev_pipe_cfg *cfg, dev_port *port, sl_err *err);
void dev_pipe_free(dev_pipe *pp);
dev_stage *dev_pipe_stage(dev_pipe *pp);

/* Makes the stage part of a federation (dev_fed.h): under --sync step its
 * gradients are reduced across replicas through `sync` after the tied
 * exchange and before the global norm; under outer:H every H-th step ends
 * with an outer step. The runner keeps the stage's federation state
 * (dev_pipe_fed); the sync is not owned, and is aborted with the port when
 * the stage fails. */
int dev_pipe_set_fed(dev_pipe *pp, const dev_fed_cfg *c, dev_sync *sync, sl_err *err);
/* The stage's federation state, NULL outside a federation. */
dev_fed *dev_pipe_fed(dev_pipe *pp);

/* The gradients of step `step` (1-based), left in the stage; info gets the
 * batch's loss, masked count and global norm. `b` is the batch on stage 0
 * and NULL elsewhere. On failure the port is aborted, so the other stages'
 * calls fail too instead of waiting. */
int dev_pipe_grads(dev_pipe *pp, const dev_batch *b, uint64_t step, dev_step_info *info,
                   sl_err *err);
/* dev_pipe_grads for the stage's next step, then clipping and the update. */
int dev_pipe_step(dev_pipe *pp, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                  sl_err *err);
/* Forward only, dropout off: the batch's loss sum and masked count (on
 * every stage). */
int dev_pipe_eval(dev_pipe *pp, const dev_batch *b, double *loss_sum, int *masked, sl_err *err);
void dev_pipe_times_get(const dev_pipe *pp, dev_pipe_times *t);

/* What the stage did during its last step (or evaluation): each op in the
 * order it ran, with its start and end in seconds since the step began.
 * Always recorded (two clock reads per op); the gaps are idle time,
 * waiting for the device's compute lock included. */
enum dev_seg_kind {
    /* 0..5: enum bal_op_kind */
    DEV_SEG_RECV_ACT = 0, DEV_SEG_FWD, DEV_SEG_SEND_ACT, DEV_SEG_RECV_GRAD, DEV_SEG_BWD,
    DEV_SEG_SEND_GRAD,
    DEV_SEG_SEND_LABELS, /* the first stage's labels to the last */
    DEV_SEG_RECV_LABELS,
    DEV_SEG_SYNC,        /* gradient finish, tied-embedding exchange, the replica sync,
                          * the norm's gather (and an outer step's replica sync) */
    DEV_SEG_OPTIM,       /* clipping and the update */
    DEV_SEG_NKINDS
};
typedef struct dev_pipe_seg {
    int kind; /* enum dev_seg_kind */
    int mb;   /* micro-batch, -1 for the step-wide kinds */
    double start, end;
} dev_pipe_seg;
/* The last step's segments (owned by the runner, valid until its next
 * step); returns their count. */
int dev_pipe_segments(const dev_pipe *pp, const dev_pipe_seg **seg);

/* Tests: fn is called with each op (enum bal_op_kind, micro-batch) as it
 * starts. */
void dev_pipe_set_trace(dev_pipe *pp, void (*fn)(void *ud, int stage, int kind, int mb), void *ud);

#endif
