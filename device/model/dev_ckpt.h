/* dev_ckpt.h - checkpoints by tensor name, so that any cut loads from any
 * cut.
 *
 * Model: safetensors with Hugging Face BERT names (our fused qkv is split into
 * query/key/value). A full model holds bert.embeddings.*, bert.encoder.layer.N.*
 * and cls.predictions.*; the decoder weight is tied to the word embeddings and
 * only written by a stage that holds the head without unit 0. Loading checks
 * every tensor's presence, dtype and shape and names the one that is wrong;
 * tensors of units outside the stage are skipped (a stage loads its slice of a
 * full model), BERT's pooler and NSP head are ignored. To classify (the
 * config's task) the head is the pooler and classifier of
 * BertForSequenceClassification, and the pre-training heads (cls.*) are
 * ignored instead.
 *
 * A checkpoint directory (docs/training.md):
 *   manifest.json       written last: the step, the optimizer, and every file
 *                       of the checkpoint with its size and BLAKE2b-256
 *   model.safetensors   the parameters by HF name, or model.TAG.safetensors per
 *                       part when stages save separately (TAG names their units)
 *   optim.safetensors   the optimizer state by the same names: NAME.exp_avg and
 *                       NAME.exp_avg_sq (F32; bf16 moments are stored widened,
 *                       which is exact), or optim.TAG.safetensors per part
 *   config.json, and what the caller adds (data.json)
 * A stage loads exactly its tensors from every part listed, whichever cut
 * wrote them; the head's copy of the word embeddings (and its moments) comes
 * from the embeddings' when no part holds it (the two are equal bit for bit).
 * Every file's sum is checked before it is used, and every part must be of
 * the manifest's step. A directory with optim.bin and no manifest (the
 * earlier format) is read too: its moments are found by name as well. */
#ifndef DEV_CKPT_H
#define DEV_CKPT_H

#include <stdint.h>

#include "dev_stage.h"
#include "sl_err.h"

int dev_ckpt_save_model(dev_stage *s, const char *path, sl_err *err);
/* The parameters of s from one safetensors file (a full model or a part);
 * --init and eval. */
int dev_ckpt_load_model(dev_stage *s, const char *path, sl_err *err);
/* --init: dev_ckpt_load_model, except that to classify the head's tensors
 * (bert.pooler.*, classifier.*) may be missing from the file (an MLM
 * checkpoint starting a classifier): those keep the stage's initialisation
 * (normal(0, initializer_range), zero biases) and their names go to
 * `fresh` (comma-separated, "" if none; cut to cap bytes). */
int dev_ckpt_init_model(dev_stage *s, const char *path, char *fresh, size_t cap, sl_err *err);
/* Whether the file holds every parameter of config c with its shape (the
 * classification head's may be missing, as for dev_ckpt_init_model), and no
 * tensor the config does not know: what --init checks, without a stage or
 * the data. */
int dev_ckpt_check_model(const dev_config *c, const char *path, sl_err *err);

/* One file of a checkpoint as the manifest lists it. */
typedef struct dev_ckpt_file {
    char name[96];
    uint64_t bytes;
    uint8_t blake2b[32];
} dev_ckpt_file;

/* The parameters and moments of stages st[0..n) (one process's part of a
 * pipeline; any units) as DIR/model[.TAG].safetensors and
 * DIR/optim[.TAG].safetensors (tag NULL or "": no tag); files[0] and [1]
 * describe them. The stages must be at the same step. */
int dev_ckpt_write_part(dev_stage *const *st, int n, int optim_kind, const char *dir,
                        const char *tag, dev_ckpt_file files[2], sl_err *err);
/* The same a file per unit: model.TAG-uU.safetensors and
 * optim.TAG-uU.safetensors for each unit U the stages hold, so that a unit's
 * tensors can be handed to whoever runs it and to no one else. *files
 * (malloc'd, *nfiles of them) in unit order, the model's before the
 * optimizer's. */
int dev_ckpt_write_unit_parts(dev_stage *const *st, int n, int optim_kind, const char *dir,
                              const char *tag, dev_ckpt_file **files, int *nfiles, sl_err *err);
/* Size and sum of DIR/name (config.json, data.json, a received part). */
int dev_ckpt_file_of(const char *dir, const char *name, dev_ckpt_file *out, sl_err *err);
/* Writes DIR/manifest.json (atomically) listing files[0..n): the
 * checkpoint is complete from here on. */
int dev_ckpt_write_manifest(const char *dir, int step, int optim_kind, int bf16_state,
                            const dev_ckpt_file *files, int n, sl_err *err);

/* A whole checkpoint of stages st[0..n) in one directory: the part (no tag),
 * config.json, the caller's files extra[0..n_extra) already in dir, then the
 * manifest. */
int dev_ckpt_save(dev_stage *const *st, int n, int optim_kind, const char *dir,
                  const char *const *extra, int n_extra, sl_err *err);
/* Loads parameters, moments and step of s from any checkpoint directory
 * (any cut, any number of parts, or the earlier format). Refuses another
 * optimizer or moment precision with the option to pass. On failure the
 * stage is unchanged. */
int dev_ckpt_load(dev_stage *s, int optim_kind, const char *dir, sl_err *err);
/* The same from the files of a checkpoint a device was given: a file the
 * manifest lists may be absent (units of others); every file present is
 * checked, and every tensor the stage needs must be in one. */
int dev_ckpt_load_fetched(dev_stage *s, int optim_kind, const char *dir, sl_err *err);

/* ---- a federation's state (docs/federation.md) ----
 * What replicas keep besides one model lives in fed parts,
 * fed[.TAG].safetensors, listed by the manifest like the others: arrays
 * laid out as a stage's parameters, each tensor under its Hugging Face name
 * with a prefix and a suffix naming the state ("replica.1." + name +
 * ".exp_avg", "outer." + name + ".momentum", ...). */
typedef struct dev_ckpt_extra {
    dev_stage *st;
    const char *prefix, *suffix; /* name = prefix + HF name + suffix */
    float *data;                 /* laid out as st's parameters (host memory) */
} dev_ckpt_extra;

/* Writes DIR/name (fed[.TAG].safetensors) holding x[0..n) at `step`;
 * *file describes it for the manifest. The head's copy of the word
 * embeddings is left out where the same state (prefix and suffix) of unit
 * 0 is written. Parameters and moments must have been pulled. */
int dev_ckpt_write_extra(const char *dir, const char *name, const dev_ckpt_extra *x, int n,
                         int step, dev_ckpt_file *file, sl_err *err);
/* The same with the tensors of one unit only (a device's checkpoint part
 * per unit, fed.TAG-uU.safetensors), the head's copy of the word embeddings
 * in the head's. */
int dev_ckpt_write_extra_unit(const char *dir, const char *name, const dev_ckpt_extra *x, int n,
                              int step, int unit, dev_ckpt_file *file, sl_err *err);
/* dev_ckpt_load (present_only: dev_ckpt_load_fetched) with the parameters
 * and moments of a replica: prefix NULL or "" reads them from the model and
 * optim parts, as dev_ckpt_load does; another prefix reads PREFIX + name
 * (+ ".exp_avg", ".exp_avg_sq") from the fed parts. Then x[0..nx) (of this
 * stage) from the fed parts. All or nothing: on failure the stage and the
 * extras are unchanged. */
int dev_ckpt_load_replica(dev_stage *s, int kind, const char *dir, const char *prefix,
                          const dev_ckpt_extra *x, int nx, int present_only, sl_err *err);

/* The step a checkpoint directory holds (its manifest's, or the earlier
 * format's model metadata); -1 with err set if it is not a checkpoint. */
int dev_ckpt_step(const char *dir, sl_err *err);
/* The task whose head a checkpoint directory holds: DEV_TASK_CLASSIFY when
 * a model part has classifier.weight, else DEV_TASK_MLM; -1 with err set if
 * its model cannot be read. (config.json does not say: the task is the
 * run's.) */
int dev_ckpt_task(const char *dir, sl_err *err);

#endif
