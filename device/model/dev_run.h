/* dev_run.h - the policy of a training run, shared by `skyloom train` and a
 * device that owns a job's data: which shard sequences each step reads and
 * how they are masked (dev_feed), the record of that saved with every
 * checkpoint (data.json) with the check that a resumed run would read the
 * same, the stage layout from a --stages spec, and the checkpoint directory
 * of a run (ROOT/step-N, ROOT/latest). */
#ifndef DEV_RUN_H
#define DEV_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "dev_ckpt.h"
#include "dev_order.h"
#include "dev_shard.h"
#include "dev_train.h"

/* ---- data: what step s reads ---- */

typedef struct dev_feed_opts {
    int batch;                 /* sequences per step */
    uint64_t first, sequences; /* the training range (sequences 0: to the end) */
    int shuffle;               /* a new order every epoch */
    uint64_t seed;             /* order, masking and dropout */
    float mask_prob;
} dev_feed_opts;

typedef struct dev_feed dev_feed;

/* Opens the shard and checks it against the model (vocabulary, sequence
 * length, range; to classify, its labels). The batches are masked for the
 * MLM head (mask_prob, seed), or to classify each sequence as stored with
 * its class (dev_cls.h). */
dev_feed *dev_feed_open(const char *shard_path, const dev_config *c, const dev_feed_opts *o,
                        sl_err *err);
void dev_feed_close(dev_feed *f);
int dev_feed_seq_len(const dev_feed *f);
/* The shard's label vocabulary (owned by the feed), NULL without labels. */
const dev_labels *dev_feed_labels(const dev_feed *f);
/* The shard it reads (its header: vocabulary hash, checksum, counts). */
const dev_shard *dev_feed_shard(const dev_feed *f);
const dev_order *dev_feed_order(const dev_feed *f);
/* The masked batch of 1-based step `step`; valid until the next call. */
int dev_feed_batch(dev_feed *f, int step, dev_batch *b, sl_err *err);
/* DIR/data.json: the shard's checksum, the range, order, seed and batch. */
int dev_feed_write_record(const dev_feed *f, const char *dir, sl_err *err);
/* Refuses a checkpoint whose data.json says its run read other data,
 * naming the option that differs; a checkpoint without one is accepted
 * with a warning. */
int dev_feed_check_record(const dev_feed *f, const char *dir, sl_err *err);

/* ---- the optimizer of a run ---- */

/* lr < 0: the kind's default (1e-4 AdamW, 1e-3 LAMB); warmup < 0: 10% of
 * the steps; linear decay to 0 at `steps`. */
void dev_optim_for_run(dev_optim *o, int kind, double lr, double wd, double clip, int steps,
                       int warmup);

/* ---- stages: --stages SPEC ---- */

/* SPEC is a count N (the balancer's even split of the units) or inclusive
 * unit ranges "0-3,4-9,10-13" (unit 0 the embeddings, 1..L the layers, L+1
 * the head) covering every unit once in order. Fills bounds[0..n] (stage i
 * owns units bounds[i]..bounds[i+1]-1), at most max stages. The error names
 * the range or unit that is wrong. */
int dev_stages_parse(const char *spec, int n_units, int *bounds, int max, int *n, sl_err *err);

/* ---- checkpoints of a run ---- */

/* ROOT/step-N: every stage of tr with data.json (what f reads) and
 * schedule.json (o's optimizer and learning-rate schedule); then
 * ROOT/latest names it. out gets the directory. */
int dev_run_save(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *root, int step,
                 char *out, size_t outn, sl_err *err);
/* Loads every stage of tr from checkpoint DIR (any cut, dev_ckpt.h) after
 * checking that f reads what the saved run read and, unless new_schedule,
 * that o is the saved run's schedule (its --steps included: the decay ends
 * there); the error names the option that differs. All stages end at the
 * same step. */
int dev_run_resume(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *dir,
                   int new_schedule, sl_err *err);
/* The same for a federation, replica r reading f[r] (nf = its replicas):
 * besides replica 0's model, optimizer state and data.json, each other
 * owner's data.replica-R.json, fed.json (the federation's options, checked
 * on resume like the others) and fed.safetensors (under outer:H each other
 * replica's parameters and moments, theta_outer and its momentum; with a
 * lossy codec every replica's error-feedback residuals), in the layout of
 * docs/federation.md. A resumed federation continues bit for bit, under any
 * cuts. */
/* What stage st of replica r (its federation state f) keeps in a
 * checkpoint besides its parameters and moments, as x[0..return) for
 * dev_ckpt_write_extra (save) or dev_ckpt_load_replica (load), and in
 * *pprefix the prefix its parameters and moments go by: NULL for replica 0
 * and under --sync step (model.safetensors, optim.safetensors), "replica.R."
 * for replica R of outer:H. Under outer:H theta_outer and v are written by
 * replica 0 only (every replica's are the same) and read by every replica.
 * Saving needs the stage pulled. prefix: storage for the names. What a
 * device of a networked federation saves and restores of its stages. */
#define DEV_RUN_FED_EXTRAS 6
int dev_run_fed_extras(dev_stage *st, dev_fed *f, int r, int save, char prefix[32],
                       dev_ckpt_extra x[DEV_RUN_FED_EXTRAS], const char **pprefix);
int dev_run_save_feeds(dev_train *tr, const dev_optim *o, const dev_feed *const *f, int nf,
                       const char *root, int step, char *out, size_t outn, sl_err *err);
int dev_run_resume_feeds(dev_train *tr, const dev_optim *o, const dev_feed *const *f, int nf,
                         const char *dir, int new_schedule, sl_err *err);

#endif
