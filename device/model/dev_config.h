/* dev_config.h - the model configuration, read from a Hugging Face BERT
 * config.json.
 *
 * Required fields: hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size, vocab_size. The rest default as in transformers'
 * BertConfig: max_position_embeddings 512, type_vocab_size 2, layer_norm_eps
 * 1e-12, hidden_act "gelu", hidden_dropout_prob 0.1,
 * attention_probs_dropout_prob 0.1, initializer_range 0.02. Fields we do not
 * use (architectures, model_type, pad_token_id, ...) are ignored. */
#ifndef DEV_CONFIG_H
#define DEV_CONFIG_H

#include <stddef.h>

#include "sl_err.h"

typedef struct dev_config {
    int hidden;       /* C */
    int layers;       /* L */
    int heads;        /* NH */
    int intermediate; /* F */
    int vocab;        /* V */
    int max_pos;      /* longest sequence */
    int type_vocab;   /* segment ids */
    float ln_eps;
    int gelu;         /* enum kn_gelu_kind */
    float hidden_dropout, attn_dropout;
    float init_range;
} dev_config;

/* Parses a config.json text; fails naming the field that is missing, of the
 * wrong type or out of range. */
int dev_config_parse(dev_config *c, const char *json_text, sl_err *err);
int dev_config_load(dev_config *c, const char *path, sl_err *err);
/* Checks ranges and consistency (hidden divisible by heads, sizes that fit). */
int dev_config_validate(const dev_config *c, sl_err *err);
/* Writes the config as a BERT config.json (atomically), for exports. */
int dev_config_save(const dev_config *c, const char *path, sl_err *err);
/* Number of parameters of the whole model (tied decoder counted once). */
size_t dev_config_param_count(const dev_config *c);

#endif
