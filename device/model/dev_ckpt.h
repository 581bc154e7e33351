/* dev_ckpt.h - checkpoints of a stage.
 *
 * Model: safetensors with Hugging Face BERT names (our fused qkv is split into
 * query/key/value). A full model holds bert.embeddings.*, bert.encoder.layer.N.*
 * and cls.predictions.*; the decoder weight is tied to the word embeddings and
 * only written by a stage that holds the head without unit 0. Loading checks
 * every tensor's presence, dtype and shape and names the one that is wrong;
 * tensors of units outside the stage are skipped (a stage loads its slice of a
 * full model), BERT's pooler and NSP head are ignored.
 *
 * Optimizer: our own file (docs/training.md): a fixed little-endian header
 * (magic "SKYOPT01", optimizer, step, unit range, model shape), a tensor table
 * (name, element count), the first and second moments, and a BLAKE2b-256 of
 * everything before it. */
#ifndef DEV_CKPT_H
#define DEV_CKPT_H

#include "dev_stage.h"
#include "sl_err.h"

int dev_ckpt_save_model(dev_stage *s, const char *path, sl_err *err);
int dev_ckpt_load_model(dev_stage *s, const char *path, sl_err *err);

int dev_ckpt_save_optim(dev_stage *s, int optim_kind, const char *path, sl_err *err);
/* Restores moments and step; refuses a file of another optimizer kind. */
int dev_ckpt_load_optim(dev_stage *s, int optim_kind, const char *path, sl_err *err);

/* DIR/model.safetensors, DIR/optim.bin, DIR/config.json, each atomic. The
 * model's __metadata__ carries "skyloom.step" and "skyloom.units". */
int dev_ckpt_save_dir(dev_stage *s, int optim_kind, const char *dir, sl_err *err);
/* Loads model and optimizer state of DIR and refuses a pair whose steps
 * differ (files of different saves). On failure the stage may hold the new
 * weights with its old optimizer state: callers stop (or reload). */
int dev_ckpt_load_dir(dev_stage *s, int optim_kind, const char *dir, sl_err *err);

#endif
