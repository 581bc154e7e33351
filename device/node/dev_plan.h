/* dev_plan.h - the plan of one epoch of a job as a device reads it.
 *
 * The coordinator signs the plan (JSON); the device verifies the signature
 * (dev_job.c) and then parses and checks every field it runs on here, so
 * that nothing later sizes a buffer, loops or names a file from a value out
 * of range:
 *
 *   job, job_num      "j" + the 16 hex digits of job_num (0..2^63-1)
 *   epoch             1..2^32-1
 *   config            a BERT config.json object (dev_config_parse)
 *   batch             1..DEV_PLAN_MAX_BATCH; micro_batches divides it
 *   seq               1..the config's max_position_embeddings
 *   steps             1..DEV_PLAN_MAX_STEPS; start_step 1..steps
 *   checkpoint_every  0 (only the last step) ..INT_MAX
 *   codec_act         none, fp16, bf16 or int8; codec_grad those or topk:F,
 *                     0 < F <= 1
 *   sealed            a boolean
 *   schedule          1f1b or gpipe
 *   options           optimizer adamw|lamb, optim_state fp32|bf16 (bf16
 *                     with adamw only), lr, weight_decay and clip numbers,
 *                     warmup -1 (10% of the steps)..INT_MAX, seed an
 *                     integer, recompute and recompute_attention booleans,
 *                     precision fp32|bf16 (the products' precision,
 *                     skyloom train --precision; absent: fp32); task "mlm"
 *                     or "classify" (absent: mlm), which makes the config's
 *                     last unit the classification head: the config must
 *                     then be one (num_labels 2.., a single-label
 *                     problem_type or none)
 *   stages            1..DEV_PLAN_MAX_STAGES objects, stage i with index i,
 *                     a device id, an address (1..255 printable ASCII bytes,
 *                     no space), first_unit..last_unit, link_key (64 hex
 *                     digits: the device's X25519 public key), warmup
 *                     0..micro_batches, threads 1..DEV_PLAN_MAX_THREADS; the
 *                     ranges follow each other from unit 0 and end at the
 *                     head (L+1), so every unit is on exactly one stage
 *
 * and this device (its id) must hold 1..DEV_PLAN_MAX_LOCAL of the stages.
 *
 * A federation (several data owners, docs/federation.md) has besides
 *   replicas          2..DEV_PLAN_MAX_REPLICAS objects: owner (a device id,
 *                     the device of the replica's first stage), dataset (a
 *                     dataset name), batch (a multiple of micro_batches; the
 *                     replicas' batches add up to `batch`), first_stage and
 *                     stages: replica r's stages follow replica r-1's;
 *                     optional booleans away (its owner is gone: stages 0,
 *                     and no stage of it) and rejoin (its owner is back at
 *                     start_step - 1, an outer step), under sync outer only,
 *                     never every replica away
 *   stages[i].replica the replica stage i belongs to; each replica's stages
 *                     are a chain of their own (from unit 0 to the head)
 *   sync              mode "step" (every 1) or "outer" (every 1..steps),
 *                     codec none|fp16|bf16|int8|topk:F, outer_lr in
 *                     (0, 10], outer_momentum in [0, 1)
 * and every stage of this device must be of one replica. A plan with only
 * one of replicas and sync is refused.
 * Other fields (data, the balancer's report) are not read here. A refusal
 * names the field: "plan: stages[2].last_unit: 9 is past the head (unit 5)".
 * Messages never carry raw control bytes (sl_err escapes them). */
#ifndef DEV_PLAN_H
#define DEV_PLAN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "bal.h"
#include "dev_config.h"
#include "sl_err.h"

enum {
    DEV_PLAN_MAX_STAGES = BAL_MAX_LAYERS + 2, /* a stage holds at least one unit */
    DEV_PLAN_MAX_LOCAL = 8,                   /* stages one device holds at most */
    DEV_PLAN_MAX_BATCH = 65536,
    DEV_PLAN_MAX_STEPS = 1000000000,
    DEV_PLAN_MAX_THREADS = 65536,
    DEV_PLAN_MAX_REPLICAS = 16,               /* DEV_SYNC_MAX_REPLICAS */
};

typedef struct dev_plan_stage {
    char device[32];       /* a device id */
    char address[256];     /* where it serves Stage */
    uint8_t link_key[32];  /* its X25519 public key */
    int first_unit, last_unit; /* inclusive */
    int warmup;            /* 1F1B: forwards before the first backward */
    int threads;           /* the compute threads it trains with */
    int replica;           /* a federation's replica it belongs to; 0 without */
} dev_plan_stage;

/* A federation's replica: one data owner's pipeline. */
typedef struct dev_plan_replica {
    char owner[32];        /* the device id of its first stage */
    char dataset[65];
    int batch;             /* its sequences per step */
    int first_stage, n_stages;
    int away;              /* its owner is away: no stage (n_stages 0), no payload */
    int rejoin;            /* back at this epoch's start, an outer step: its stages start
                            * from the lowest present replica's committed parameters and
                            * moments, with their error-feedback residual at 0 */
} dev_plan_replica;

/* How a federation's replicas meet (docs/federation.md). */
typedef struct dev_plan_sync {
    int mode;              /* enum dev_sync_mode: DEV_SYNC_STEP or DEV_SYNC_OUTER */
    int every;             /* outer: H; step: 1 */
    int codec;             /* enum dev_codec */
    double topk;           /* codec topk: the fraction kept */
    double outer_lr, outer_momentum;
} dev_plan_sync;

typedef struct dev_plan_options {
    int optimizer;         /* enum dev_optim_kind */
    int bf16_state;        /* optim_state "bf16" */
    double lr;             /* < 0: the optimizer's default */
    double weight_decay, clip;
    int warmup;            /* optimizer warm-up steps; -1: 10% of the steps */
    uint64_t seed;
    int recompute, recompute_attention;
    /* what the data owner reads: sequences first.. (sequences of them, 0:
     * to the end), shuffled per epoch or not, masked with mask_prob */
    uint64_t first, sequences;
    int shuffle;
    double mask_prob;
    int task;              /* enum dev_train_task; also in the plan's config */
    int bf16_compute;      /* precision "bf16" */
} dev_plan_options;

typedef struct dev_plan {
    char job[18];
    char dataset[65];      /* the data owner's dataset */
    uint64_t job_num;
    uint32_t epoch;
    dev_config config;
    int batch, seq, micro_batches;
    int steps, start_step, checkpoint_every;
    int codec_act, codec_grad; /* enum dev_codec */
    double topk;           /* codec_grad topk: the fraction kept; else 0 */
    int sealed;
    int schedule;          /* enum bal_schedule */
    dev_plan_options options;
    int n_stages;
    dev_plan_stage *stage; /* [n_stages] */
    int local[DEV_PLAN_MAX_LOCAL], n_local; /* this device's stages, ascending */
    int n_replicas;        /* 0: one data owner; else a federation of that many */
    dev_plan_replica replica[DEV_PLAN_MAX_REPLICAS];
    int my_replica;        /* the replica of this device's stages (0 without) */
    dev_plan_sync sync;    /* with replicas */
} dev_plan;

/* Parses plan text (JSON, as the coordinator signed it) for the device
 * self_id into p. 0, or -1 with the reason in err and p empty (nothing to
 * free). */
int dev_plan_parse(const char *text, size_t len, const char *self_id, dev_plan *p, sl_err *err);
/* The same from a loaded JSON value. */
int dev_plan_from_json(const json_t *plan, const char *self_id, dev_plan *p, sl_err *err);
void dev_plan_free(dev_plan *p);
/* A data owner's policy (skyloom device --home-layers, --allow-unsealed,
 * --allow-labels-out): what a job that reads its data must keep at home.
 * The defaults keep the most; docs/security.md says what a middle device
 * learns at them. */
typedef struct dev_policy {
    int home_layers;      /* encoder layers 1..N on this device besides the embeddings */
    int allow_unsealed;   /* frames to other devices may go unsealed */
    int allow_labels_out; /* the head (the labels, the tied embedding's gradient) may run elsewhere */
} dev_policy;
#define DEV_POLICY_HOME_LAYERS 1
#define DEV_POLICY_MAX_HOME_LAYERS BAL_MAX_LAYERS
dev_policy dev_policy_default(void);
/* 0 if plan p keeps pol for the device self_id, which holds its stage 0
 * (the data owner); else -1 with the rule it breaks and the option that
 * lifts it in err. A plan that does not read this device's data (stage 0
 * is another's) breaks nothing. */
int dev_policy_check_plan(const dev_policy *pol, const dev_plan *p, const char *self_id, sl_err *err);
/* The same for a job's options as a check task states them, before a plan:
 * sealed, u_shape (the owner holds the head). */
int dev_policy_check_options(const dev_policy *pol, int sealed, int u_shape, sl_err *err);

/* A codec by the name codec_act and codec_grad take (none, fp16, bf16,
 * int8; for gradients, grad != 0, also "topk:F" with 0 < F <= 1, F in
 * *frac, else 0): its enum dev_codec, or -1 for a name it is not. */
int dev_plan_codec(const char *name, int grad, double *frac);

#endif
