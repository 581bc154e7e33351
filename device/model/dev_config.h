/* dev_config.h - the model configuration, read from a Hugging Face BERT
 * config.json by the balancer's reader (bal_bert_parse: the fields, their
 * defaults and the size limits are defined once, in balancer/bal.h). */
#ifndef DEV_CONFIG_H
#define DEV_CONFIG_H

#include <stddef.h>

#include "bal.h"
#include "dev_labels.h"
#include "sl_err.h"

/* What the model's last unit is: the MLM head (BertForMaskedLM) or a
 * sequence-classification head (BertForSequenceClassification's pooler and
 * classifier). Not in config.json: the command or the job says. */
enum dev_train_task { DEV_TASK_MLM = BAL_TASK_MLM, DEV_TASK_CLASSIFY = BAL_TASK_CLASSIFY };

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
    int task;         /* enum dev_train_task; the parser leaves DEV_TASK_MLM */
    int num_labels;   /* K: classes of the classification head */
    int problem_type; /* enum bal_problem_type, as the file says */
    float cls_dropout; /* the classifier's dropout: classifier_dropout, else hidden_dropout */
    /* The K class names, for config.json's id2label (borrowed: they must
     * outlive every copy of the config); NULL: Hugging Face's LABEL_0, ... */
    const char *const *label_names;
} dev_config;

/* "mlm" or "classify" (--task, a job's "task" option): enum dev_train_task, or -1. */
int dev_task_parse(const char *name);
const char *dev_task_name(int task);

/* Parses a config.json text; fails naming the line and the field that is
 * missing, of the wrong type or out of range. */
int dev_config_parse(dev_config *c, const char *json_text, sl_err *err);
int dev_config_load(dev_config *c, const char *path, sl_err *err);
/* Checks ranges and consistency: the sizes as bal_bert_check, the rest here. */
int dev_config_validate(const dev_config *c, sl_err *err);
/* The same model as the balancer describes it (bal_bert_units). */
void dev_config_bert(const dev_config *c, bal_bert *b);
/* Writes the config as a BERT config.json (atomically), for exports. To
 * classify, also num_labels, id2label and label2id (from label_names, or
 * LABEL_i), problem_type single_label_classification and
 * classifier_dropout, as BertForSequenceClassification. */
int dev_config_save(const dev_config *c, const char *path, sl_err *err);
/* The class names of a config.json's id2label, in id order (*names NULL and
 * *n 0 when it has none); free with dev_config_free_names. */
int dev_config_load_names(const char *path, char ***names, int *n, sl_err *err);
void dev_config_free_names(char **names, int n);
/* Whether a config's class names (names[0..n), from dev_config_load_names;
 * NULL: none) are the labels of a labelled shard, in the same order; all of
 * Hugging Face's defaults (LABEL_0, LABEL_1, ...) stand for any names. The
 * error names the config and the first class that differs. */
int dev_config_check_names(char *const *names, int n, const dev_labels *labels,
                           const char *config, sl_err *err);
/* Number of parameters of the whole model (tied decoder counted once). */
size_t dev_config_param_count(const dev_config *c);

#endif
