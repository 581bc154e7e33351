#include "dev_config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_file.h"
#include "kn_ops.h"

_Static_assert(DEV_LABELS_MAX == BAL_MAX_LABELS && DEV_LABEL_MAX_BYTES == BAL_MAX_LABEL_BYTES,
               "a label vocabulary's limits are the config's");

void dev_config_bert(const dev_config *c, bal_bert *b)
{
    *b = (bal_bert){.hidden = c->hidden, .layers = c->layers, .heads = c->heads,
                    .intermediate = c->intermediate, .vocab = c->vocab, .max_pos = c->max_pos,
                    .type_vocab = c->type_vocab, .ln_eps = c->ln_eps,
                    .act = c->gelu == KN_GELU_TANH ? BAL_ACT_GELU_TANH : BAL_ACT_GELU,
                    .hidden_dropout = c->hidden_dropout, .attn_dropout = c->attn_dropout,
                    .init_range = c->init_range, .task = c->task, .num_labels = c->num_labels,
                    .problem_type = c->problem_type, .classifier_dropout = c->cls_dropout};
}

int dev_task_parse(const char *name)
{
    if (!strcmp(name, "mlm"))
        return DEV_TASK_MLM;
    if (!strcmp(name, "classify"))
        return DEV_TASK_CLASSIFY;
    return -1;
}

const char *dev_task_name(int task) { return task == DEV_TASK_CLASSIFY ? "classify" : "mlm"; }

int dev_config_validate(const dev_config *c, sl_err *err)
{
    bal_bert b;
    dev_config_bert(c, &b);
    if (bal_bert_check(&b, err))
        return -1;
    if (!(c->ln_eps > 0 && c->ln_eps <= 0.5f))
        return sl_err_set(err, SL_EINVAL, "config: layer_norm_eps must be in (0, 0.5]");
    if (!(c->hidden_dropout >= 0 && c->hidden_dropout < 1) ||
        !(c->attn_dropout >= 0 && c->attn_dropout < 1))
        return sl_err_set(err, SL_EINVAL, "config: dropout probabilities must be in [0, 1)");
    if (c->gelu != KN_GELU_ERF && c->gelu != KN_GELU_TANH)
        return sl_err_set(err, SL_EINVAL, "config: bad hidden_act");
    return 0;
}

/* config.json's classification keys, as BertForSequenceClassification's
 * save_pretrained writes them. */
static int add_classes(const dev_config *c, json_t *o)
{
    json_t *ids = json_object(), *names = json_object();
    int rc = 0;
    for (int i = 0; i < c->num_labels; i++) {
        char key[16], dflt[32];
        snprintf(key, sizeof key, "%d", i);
        snprintf(dflt, sizeof dflt, "LABEL_%d", i);
        const char *name = c->label_names ? c->label_names[i] : dflt;
        rc |= json_object_set_new(ids, key, json_string(name));
        rc |= json_object_set_new(names, name, json_integer(i));
    }
    rc |= json_object_set_new(o, "architectures",
                              json_pack("[s]", "BertForSequenceClassification"));
    rc |= json_object_set_new(o, "num_labels", json_integer(c->num_labels));
    rc |= json_object_set_new(o, "id2label", ids);
    rc |= json_object_set_new(o, "label2id", names);
    rc |= json_object_set_new(o, "problem_type", json_string("single_label_classification"));
    rc |= json_object_set_new(o, "classifier_dropout", json_real((double)c->cls_dropout));
    return rc ? -1 : 0;
}

static void from_bert(dev_config *c, const bal_bert *b)
{
    *c = (dev_config){.hidden = b->hidden, .layers = b->layers, .heads = b->heads,
                      .intermediate = b->intermediate, .vocab = b->vocab, .max_pos = b->max_pos,
                      .type_vocab = b->type_vocab, .ln_eps = (float)b->ln_eps,
                      .gelu = b->act == BAL_ACT_GELU_TANH ? KN_GELU_TANH : KN_GELU_ERF,
                      .hidden_dropout = (float)b->hidden_dropout,
                      .attn_dropout = (float)b->attn_dropout, .init_range = (float)b->init_range,
                      .task = b->task, .num_labels = b->num_labels,
                      .problem_type = b->problem_type,
                      .cls_dropout = (float)b->classifier_dropout};
}

int dev_config_parse(dev_config *c, const char *json_text, sl_err *err)
{
    bal_bert b;
    memset(c, 0, sizeof *c);
    if (bal_bert_parse(&b, json_text, "config", err))
        return -1;
    from_bert(c, &b);
    return dev_config_validate(c, err);
}

int dev_config_load(dev_config *c, const char *path, sl_err *err)
{
    bal_bert b;
    memset(c, 0, sizeof *c);
    if (bal_bert_load(&b, path, err))
        return -1;
    from_bert(c, &b);
    return dev_config_validate(c, err);
}

int dev_config_save(const dev_config *c, const char *path, sl_err *err)
{
    json_t *o = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:f, s:f, s:f}",
                          "architectures", "BertForMaskedLM", "model_type", "bert",
                          "hidden_size", c->hidden, "num_hidden_layers", c->layers,
                          "num_attention_heads", c->heads, "intermediate_size", c->intermediate,
                          "vocab_size", c->vocab, "max_position_embeddings", c->max_pos,
                          "type_vocab_size", c->type_vocab, "layer_norm_eps", (double)c->ln_eps,
                          "hidden_act", c->gelu == KN_GELU_TANH ? "gelu_new" : "gelu",
                          "hidden_dropout_prob", (double)c->hidden_dropout,
                          "attention_probs_dropout_prob", (double)c->attn_dropout,
                          "initializer_range", (double)c->init_range);
    if (o && c->task == DEV_TASK_CLASSIFY && add_classes(c, o)) {
        json_decref(o);
        o = NULL;
    }
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (!s)
        return sl_err_set(err, SL_ENOMEM, "config: cannot encode JSON");
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps allocates n+1; replace the NUL, write n+1 bytes */
    int rc = sl_write_file_atomic(path, s, n + 1, err);
    free(s);
    return rc;
}

size_t dev_config_param_count(const dev_config *c)
{
    size_t C = (size_t)c->hidden, F = (size_t)c->intermediate, V = (size_t)c->vocab;
    size_t K = (size_t)c->num_labels;
    size_t emb = V * C + (size_t)c->max_pos * C + (size_t)c->type_vocab * C + 2 * C;
    size_t layer = 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C + 2 * C;
    size_t head = c->task == DEV_TASK_CLASSIFY ? C * C + C + K * C + K : C * C + C + 2 * C + V;
    return emb + (size_t)c->layers * layer + head;
}

int dev_config_load_names(const char *path, char ***names, int *n, sl_err *err)
{
    char *text = NULL;
    size_t len = 0;
    *names = NULL;
    *n = 0;
    if (sl_read_file(path, 1u << 20, &text, &len, err))
        return -1;
    int rc = strlen(text) != len ? sl_err_set(err, SL_EINVAL, "%s: contains a NUL byte", path)
                                 : bal_bert_label_names(text, path, names, n, err);
    free(text);
    return rc;
}

void dev_config_free_names(char **names, int n)
{
    for (int i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

int dev_config_check_names(char *const *names, int n, const dev_labels *labels,
                           const char *config, sl_err *err)
{
    if (!names)
        return 0;
    int defaults = 1;
    for (int i = 0; i < n && defaults; i++) {
        char d[32];
        snprintf(d, sizeof d, "LABEL_%d", i);
        defaults = !strcmp(names[i], d);
    }
    if (defaults)
        return 0;
    if (n != dev_labels_count(labels))
        return sl_err_set(err, SL_EINVAL, "%s names %d classes, the shard has %d labels", config,
                          n, dev_labels_count(labels));
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], dev_labels_name(labels, i)))
            return sl_err_set(err, SL_EINVAL, "%s: id2label gives class %d the name '%.64s', the "
                              "shard's labels '%.64s': the classes would be mixed up",
                              config, i, names[i], dev_labels_name(labels, i));
    return 0;
}
