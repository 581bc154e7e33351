/* dev_config.h - the model configuration, read from a Hugging Face BERT
 * config.json by the balancer's reader (bal_bert_parse: the fields, their
 * defaults and the size limits are defined once, in balancer/bal.h). */
#ifndef DEV_CONFIG_H
#define DEV_CONFIG_H

#include <stddef.h>

#include "bal.h"
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

/* Parses a config.json text; fails naming the line and the field that is
 * missing, of the wrong type or out of range. */
int dev_config_parse(dev_config *c, const char *json_text, sl_err *err);
int dev_config_load(dev_config *c, const char *path, sl_err *err);
/* Checks ranges and consistency: the sizes as bal_bert_check, the rest here. */
int dev_config_validate(const dev_config *c, sl_err *err);
/* The same model as the balancer describes it (bal_bert_units). */
void dev_config_bert(const dev_config *c, bal_bert *b);
/* Writes the config as a BERT config.json (atomically), for exports. */
int dev_config_save(const dev_config *c, const char *path, sl_err *err);
/* Number of parameters of the whole model (tied decoder counted once). */
size_t dev_config_param_count(const dev_config *c);

#endif
