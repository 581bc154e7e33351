/* dev_stage.h - a stage: a contiguous range of model units with its
 * parameters, gradients and optimizer state (each ONE flat allocation) and an
 * activation stash per in-flight micro-batch.
 *
 * The single-device trainer is one stage owning units 0..L+1. A pipeline runs
 * one stage per device: forward takes the boundary activation (B,T,C) from
 * the previous stage and gives one to the next; backward takes the gradient
 * of its output and gives the gradient of its input.
 *
 * One optimizer step of a pipeline, per stage (dev_pipe.h runs it):
 *   dev_stage_zero_grad
 *   for each micro-batch (1F1B or GPipe; a slot per micro-batch in flight):
 *     forward(slot), later backward(slot); backwards in micro-batch order,
 *     as gradients accumulate in the order they run
 *   dev_stage_grad_finish                      (local tied-embedding sum)
 *   tied exchange between the embed and head stages (see below)
 *   dev_stage_grad_sumsqs; global norm = sqrt(every stage's values in order)
 *   dev_stage_step(lr, dev_clip_scale(norm, max_norm))
 * With the same micro-batches, any split gives bit-for-bit the same result as
 * one stage (tests/test_stages.c proves it).
 *
 * Every stage needs the micro-batch's `valid` mask (attention padding); the
 * stage holding unit 0 needs tokens and segments, the one holding the head
 * needs labels: the MLM head's at the masked positions, or to classify
 * (config task DEV_TASK_CLASSIFY) each sequence's class at its position 0
 * ([CLS]) and -100 elsewhere. */
#ifndef DEV_STAGE_H
#define DEV_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "dev_config.h"
#include "dev_model.h"
#include "kn_be.h"
#include "sl_err.h"

/* What a stage needs to know about one micro-batch besides its input. */
typedef struct dev_micro {
    int B, T;
    const int32_t *tokens, *segments, *valid, *labels; /* (B,T); segments may be NULL;
                                                        * labels: -100 = none */
    uint64_t seq0;    /* the place in its step of the micro-batch's first sequence (dropout keys) */
    uint64_t step;    /* optimizer step (dropout keys) */
    uint64_t seed;    /* run seed (dropout keys) */
    float loss_scale; /* 1 / labels in the WHOLE batch (masked tokens, or classified sequences) */
    int train;        /* 0: dropout off (evaluation) */
    int replica;      /* a federation's replica (dropout keys; 0 keeps one owner's keys) */
} dev_micro;

enum dev_optim_kind { DEV_OPT_ADAMW = 0, DEV_OPT_LAMB = 1 };
typedef struct dev_optim {
    int kind;
    float lr, beta1, beta2, eps, wd;
    float clip;        /* global-norm clip; 0 disables */
    int warmup, total; /* linear warm-up for `warmup` steps, then linear decay to 0 at `total` */
} dev_optim;
/* Defaults: AdamW, lr 1e-4, betas 0.9/0.999, eps 1e-6, wd 0.01, clip 1.0. */
void dev_optim_default(dev_optim *o);
/* Learning rate at 1-based step t. */
float dev_optim_lr(const dev_optim *o, int t);
/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max / (norm + 1e-6)). */
float dev_clip_scale(double norm, float max_norm);

typedef struct dev_stage dev_stage;

/* --precision: "fp32" -> 0, "bf16" -> DEV_STAGE_BF16_COMPUTE, else -1. */
int dev_precision_flags(const char *name);
/* The name of the precision a stage's flags ask for ("fp32" or "bf16"). */
const char *dev_precision_name(unsigned flags);

/* Creation flags. RECOMPUTE: a slot keeps only each encoder layer's output
 * and backward re-runs the layer's forward into one shared work area first
 * (activation checkpointing per layer): the stash shrinks from ~10.5 C + 
 * NH T floats per token and layer to C, for one more forward of the layers.
 * Results are bit-identical (same ops, inputs and dropout keys). */
/* BF16_STATE: the AdamW moments are stored as bf16 with stochastic rounding
 * (half the optimizer memory; the update itself is computed in fp32). The
 * rounding draws from the counter RNG keyed by (seed, step, tensor name,
 * element), so any split gives the same result. AdamW only. */
/* RECOMPUTE_ATTN: slots do not keep the attention probabilities and output
 * (B NH T^2 + B T C floats per layer); backward recomputes them from qkv.
 * Cheaper than RECOMPUTE (a few per cent of a BERT-base step, more for small
 * hidden sizes), bit-identical too. Implied by RECOMPUTE. */
/* BF16_COMPUTE (--precision bf16): mixed precision. Every matrix product
 * (the linear layers, attention's QK^T and PV, the decoder) takes bf16
 * operands with fp32 accumulation; the products' weights are a bf16 copy
 * of the fp32 parameters (master weights), made again after each update
 * (dev_stage_step) and each dev_stage_push; LayerNorm, softmax, GELU, the
 * loss, the gradients, their norm and the optimizer stay fp32. A layer keeps
 * qkv, the attention probabilities and output and the FFN's h in bf16
 * (what its products read anyway), r1, r2 and the statistics in fp32. The
 * backend must run bf16 natively (kn_be.bf16_check): creation fails with
 * the reason otherwise. Any split gives the one-stage bits, as in fp32. */
enum { DEV_STAGE_RECOMPUTE = 1u, DEV_STAGE_BF16_STATE = 2u, DEV_STAGE_RECOMPUTE_ATTN = 4u,
       DEV_STAGE_BF16_COMPUTE = 8u };

/* Units [u0, u1] inclusive; micro-batches of at most max_B sequences of
 * length T; `slots` in-flight micro-batches (1 for plain accumulation). The
 * parameters are initialised from `seed` (dev_model_init). Tensors live on
 * backend `be` (kn_be.h; NULL = the CPU). */
dev_stage *dev_stage_create(const dev_config *c, int u0, int u1, int max_B, int T, int slots,
                            uint64_t seed, const kn_be *be, unsigned flags, sl_err *err);
void dev_stage_free(dev_stage *s);

const dev_config *dev_stage_config(const dev_stage *s);
void dev_stage_units(const dev_stage *s, int *u0, int *u1);
const dev_tensor *dev_stage_tensors(const dev_stage *s, int *n);
const char *dev_stage_backend(const dev_stage *s);
/* Host views of the parameters, gradients and optimizer state (m then v, 2n
 * floats). On the CPU they ARE the stage's tensors. On a resident backend
 * (CUDA) they are host copies: dev_stage_pull refreshes all three from the
 * backend, and after changing parameters or optimizer state through them
 * (loading a checkpoint) dev_stage_push sends both back. On the CPU (fp32
 * moments) both calls do nothing, so callers always make them. With bf16
 * moments the optimizer state's view is fp32 (widened by pull, rounded to
 * nearest by push). */
float *dev_stage_params(dev_stage *s, size_t *n);
float *dev_stage_grads(dev_stage *s, size_t *n);
float *dev_stage_optim_state(dev_stage *s, size_t *n);
int dev_stage_pull(dev_stage *s, sl_err *err);
int dev_stage_push(dev_stage *s, sl_err *err);
/* The same for the gradients alone and the parameters alone (a replica
 * sync changes one of them every step, and should not move the moments). */
int dev_stage_pull_grads(dev_stage *s, sl_err *err);
int dev_stage_push_grads(dev_stage *s, sl_err *err);
int dev_stage_pull_params(dev_stage *s, sl_err *err);
int dev_stage_push_params(dev_stage *s, sl_err *err);
/* Frees host copies that only pull/push need (the moments' view of a bf16 or
 * resident stage: 8 bytes per parameter); the next pull makes them again.
 * dev_stage_optim_state is NULL until then. */
void dev_stage_drop_views(dev_stage *s);
/* 1 if the AdamW moments are kept in bf16 (DEV_STAGE_BF16_STATE). */
int dev_stage_bf16_state(const dev_stage *s);
int dev_stage_get_step(const dev_stage *s);
void dev_stage_set_step(dev_stage *s, int step);
/* Bytes held (parameters, gradients, optimizer state, stash, scratch). */
size_t dev_stage_bytes(const dev_stage *s);

/* Forward of one micro-batch into stash `slot`. `in` is the boundary
 * activation (B,T,C) (NULL when the stage starts at unit 0); `out` receives
 * the boundary activation (NULL when the stage ends with the head). When the
 * stage holds the head, *loss_sum gets the sum of the losses and *masked the
 * number of labels of this micro-batch (masked positions, or classified
 * sequences). */
int dev_stage_forward(dev_stage *s, int slot, const dev_micro *mb, const float *in, float *out,
                      double *loss_sum, int *masked, sl_err *err);
/* dev_stage_forward on a stage holding the head that also copies the (M, V)
 * logits at the masked positions (labels != -100, in position order; row j
 * is the j-th such position) into the host array `logits` of `cap` floats,
 * before the loss turns them into probabilities; *M gets M. The
 * classification head gives the (B, K) logits of every sequence, with a
 * class or without, and *M gets B (*loss_sum is over those with one). For
 * evaluation (mb->train 0, say); the slot may be backpropagated as after a
 * forward. */
int dev_stage_forward_logits(dev_stage *s, int slot, const dev_micro *mb, const float *in,
                             float *logits, size_t cap, int *M, double *loss_sum, sl_err *err);
/* Backward of the micro-batch in `slot` (same mb as its forward). `dout` is
 * the gradient of the output (NULL with the head); `din` receives the
 * gradient of the input (NULL with unit 0). Gradients accumulate. */
int dev_stage_backward(dev_stage *s, int slot, const dev_micro *mb, const float *dout, float *din,
                       sl_err *err);

int dev_stage_zero_grad(dev_stage *s, sl_err *err);
/* After the last backward of a step: when the stage holds both unit 0 and the
 * head, adds the head's part of the tied word-embedding gradient into the
 * embedding gradient. */
int dev_stage_grad_finish(dev_stage *s, sl_err *err);

/* Tied word embeddings across two stages. */
enum dev_tied_role {
    DEV_TIED_NONE = 0,  /* holds neither unit 0 nor the head */
    DEV_TIED_LOCAL = 1, /* holds both: dev_stage_grad_finish does it */
    DEV_TIED_EMBED = 2, /* holds unit 0 only */
    DEV_TIED_HEAD = 3,  /* holds the head only: its copy is cls.predictions.decoder.weight */
};
int dev_stage_tied_role(const dev_stage *s);
/* *g: a host view of the stage's partial gradient of the word embeddings
 * (V*C floats) for the EMBED and HEAD roles, else NULL; valid until the next
 * call on this stage. Exchange protocol: each side sends its partial and
 * calls dev_stage_tied_add(s, other's partial, err): both then hold
 * embed + head, bit-identical (addition is commutative), and both optimizer
 * copies stay identical. */
int dev_stage_tied_grad(dev_stage *s, const float **g, size_t *n, sl_err *err);
int dev_stage_tied_add(dev_stage *s, const float *other, sl_err *err);

/* Sums of squares of this stage's gradients, one per tensor in tensor order
 * (at most the tensor count; *n gets how many). The HEAD role's copy of the
 * word embeddings is left out so the global norm counts it once: the global
 * norm is the square root of every stage's values added in stage order,
 * which is the one-stage sum whatever the split. */
int dev_stage_grad_sumsqs(dev_stage *s, double *sumsq, int *n, sl_err *err);
/* Scales the gradients by grad_scale (clipping), then one optimizer update
 * with the learning rate of the next step; increments the step. */
int dev_stage_step(dev_stage *s, const dev_optim *o, float grad_scale, sl_err *err);

/* Benchmarks: time the matrix multiplies (on = 1 also resets the counters).
 * Host time around each call: meaningful on the CPU only (CUDA ops are
 * asynchronous). */
void dev_stage_prof(dev_stage *s, int on);
void dev_stage_prof_get(const dev_stage *s, double *mm_seconds, double *mm_flops);

#endif
