/* dev_model.h - BERT as a sequence of layer units and their parameter tensors.
 *
 * Units: 0 = embeddings (word + position + segment, LayerNorm, dropout),
 * 1..L = encoder layers (post-LN, as in BERT), L+1 = the head and its loss:
 * the MLM head (dense, GELU, LayerNorm, decoder tied to the word
 * embeddings, output bias), or to classify (dev_config.task) the pooler
 * (bert.pooler.dense, tanh) and the classifier (classifier.weight/.bias)
 * of BertForSequenceClassification, which share nothing with unit 0.
 * A tensor is named with its Hugging Face name, except the fused
 * attention projection, which we keep as one (3C, C) matrix (rows: query,
 * key, value) named "...attention.self.qkv.weight" and split into HF's
 * query/key/value on import and export (DEV_T_QKV).
 *
 * A stage holding the head but not unit 0 keeps its own copy of the word
 * embeddings, named "cls.predictions.decoder.weight" (DEV_T_TIED). */
#ifndef DEV_MODEL_H
#define DEV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dev_config.h"
#include "sl_err.h"

enum {
    DEV_T_DECAY = 1, /* weight decay applies (not biases, not LayerNorm: HF convention) */
    DEV_T_QKV = 2,   /* HF stores it as three tensors query/key/value */
    DEV_T_TIED = 4,  /* the head's copy of the word embeddings */
    DEV_T_LNW = 8,   /* LayerNorm weight: initialised to 1 */
};

typedef struct dev_tensor {
    char name[80];
    int unit;
    int rows, cols; /* cols == 0 for vectors */
    size_t offset;  /* in floats, into the stage's flat parameter array */
    size_t numel;
    unsigned flags;
} dev_tensor;

#define DEV_UNIT_EMBED 0
static inline int dev_unit_head(const dev_config *c) { return c->layers + 1; }
static inline int dev_unit_count(const dev_config *c) { return c->layers + 2; }

/* The tensors of units [u0, u1] (inclusive) in storage order. *out is
 * malloc'ed; *total the number of floats. */
int dev_model_layout(const dev_config *c, int u0, int u1, dev_tensor **out, int *n,
                     size_t *total, sl_err *err);
/* A tensor's random-stream key: FNV-1a of its name, the head's tied copy
 * hashing as the word embeddings (so both draw the same numbers). Keys the
 * initialisation and the bf16 moments' stochastic rounding. */
uint64_t dev_tensor_key(const dev_tensor *t);
/* BERT initialisation (normal(0, initializer_range) weights, zero biases,
 * LayerNorm weight 1): a pure function of (seed, tensor name, element), so
 * any split into stages starts from the same weights. */
void dev_model_init(const dev_tensor *t, int n, float *params, uint64_t seed, float std);

#endif
