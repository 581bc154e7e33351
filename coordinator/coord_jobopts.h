/* coord_jobopts.h - a job's options, typed: parsed and checked once when the
 * job is submitted (or read back from the state), written back as the same
 * JSON (the jobs table's `options`, GetJob, the plan's `options`).
 *
 * Pure data: the state machine (coord_job.h) reads these fields; only
 * coord_jobopts.c knows JSON. */
#ifndef COORD_JOBOPTS_H
#define COORD_JOBOPTS_H

#include <stddef.h>
#include <stdint.h>

#define COORD_JOBOPTS_MAX_DEVICES 1024
#define COORD_DEV_ID_LEN 18 /* "d" + 16 hex + NUL, as CERT_ID_LEN */

typedef struct coord_jobopts {
    int steps, batch, micro_batches;
    char codec_act[16], codec_grad[32]; /* none, fp16, bf16, int8; gradients also topk:F */
    int sealed;
    char algo[16];        /* optimal, sky, even */
    char schedule[8];     /* 1f1b, gpipe */
    int checkpoint_every; /* 0: none */
    double lr;            /* -1: the optimizer's default */
    int warmup;           /* -1: 10% of the steps */
    int64_t seed;
    char optimizer[8];    /* adamw, lamb */
    char optim_state[8];  /* fp32, bf16 */
    double weight_decay, clip, mask_prob;
    int64_t first, sequences;
    int shuffle, recompute, recompute_attention, u_shape;
    double replan_margin; /* a joiner's plan is taken when faster by this share */
    char precision[8];    /* fp32, bf16: the products' (skyloom train --precision) */
    char task[12];        /* mlm, classify: the model's head (skyloom train --task) */
    /* a federation (several data owners): each owner's sequences per step
     * (n_owner_batch of them, in the owners' order; 0: one owner, `batch`),
     * and how the replicas meet: sync "step" or "outer:H" (sync_every H), the
     * codec of what they exchange, DiLoCo's outer SGD */
    int n_owner_batch;
    int owner_batch[8];
    char sync[24];
    int sync_every;       /* outer:H's H; 0 for step */
    char codec_sync[32];  /* none, fp16, bf16, int8, topk:F */
    double outer_lr, outer_momentum;
    /* how the devices are shared among the replicas: "balanced" (bal_fed_place)
     * or "equal" (bal_fed_even, the equal-share baseline) */
    char placement[12];
    char vocab_hash[65];  /* the vocabulary its data must have (hex BLAKE2b-256); "" any */
    int has_devices;      /* the submit named the devices the job may use */
    int n_devices;
    char (*devices)[COORD_DEV_ID_LEN];
} coord_jobopts;

/* Parses options JSON text ("" or NULL: every default; `steps` is required).
 * 0, or -1 with the reason ("options: ...") in why. o is filled either way
 * and freed with coord_jobopts_free. */
int coord_jobopts_parse(const char *text, coord_jobopts *o, char *why, size_t cap);
void coord_jobopts_free(coord_jobopts *o);
int coord_jobopts_copy(coord_jobopts *dst, const coord_jobopts *src);

/* The options as a JSON object (jansson's json_t), every option present. */
struct json_t *coord_jobopts_json(const coord_jobopts *o);
/* The options as JSON text: sorted keys, compact (indent 0) or indented. */
char *coord_jobopts_text(const coord_jobopts *o, int indent);

/* A data owner's policy as its heartbeats state it (OwnerPolicy): what a
 * job on its data must keep at home. known 0: never stated (nothing known). */
typedef struct coord_policy {
    int known;
    int home_layers;      /* encoder layers on the owner besides the embeddings */
    int allow_unsealed;   /* the job may be --no-seal */
    int allow_labels_out; /* the job may be --no-u-shape */
} coord_policy;

/* 0 if options o keep pol (or pol is unknown), else -1 with why, naming
 * the option at fault and the device option that would lift the rule. */
int coord_policy_check(const coord_policy *pol, const coord_jobopts *o, char *why, size_t cap);

/* The federation's options against its owners' count: owner_batch has one
 * entry per owner, each a multiple of micro_batches; sync's H at most the
 * steps; sync options need several owners. 0 or -1 with why. */
int coord_jobopts_check_owners(const coord_jobopts *o, int nowner, char *why, size_t cap);

/* The micro-batch the candidates time their units at: the largest owner's
 * (owner_batch / micro_batches) in a federation, else batch / micro_batches.
 * A replica of a smaller batch scales the times by its own over this. */
int coord_jobopts_profile_micro(const coord_jobopts *o);

/* The options' task as enum bal_task. */
int coord_jobopts_task(const coord_jobopts *o);

/* Whether the options let the job use device `id` (the owner always). */
int coord_jobopts_allows(const coord_jobopts *o, const char *owner, const char *id);

#endif
