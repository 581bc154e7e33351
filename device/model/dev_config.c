#include "dev_config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_buf.h"
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

/* The shortest decimal that reads back as the same float: 1e-12, not the
 * 9.99999996e-13 that printing the float's double with 9 digits gives, and
 * always with a '.' or an exponent so that a JSON reader sees a real. */
static void float_text(float f, char *out, size_t cap)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(out, cap, "%.*g", p, (double)f);
        if (strtof(out, NULL) == f)
            break;
    }
    if (!strpbrk(out, ".eEn")) /* n: nan, inf have no JSON form anyway */
        snprintf(out + strlen(out), cap - strlen(out), ".0");
}

/* A JSON string for s into b (jansson's escaping); -1 if it cannot encode. */
static int json_text(sl_buf *b, const char *s)
{
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!t)
        return -1;
    sl_buf_printf(b, "%s", t);
    free(t);
    return 0;
}

/* config.json's classification keys, as BertForSequenceClassification's
 * save_pretrained writes them, each line ending ",\n" but the last. */
static int add_classes(const dev_config *c, sl_buf *b)
{
    int rc = 0;
    sl_buf_printf(b, "  \"num_labels\": %d,\n  \"id2label\": {", c->num_labels);
    for (int i = 0; i < c->num_labels; i++) {
        char dflt[32];
        snprintf(dflt, sizeof dflt, "LABEL_%d", i);
        sl_buf_printf(b, "%s\n    \"%d\": ", i ? "," : "", i);
        rc |= json_text(b, c->label_names ? c->label_names[i] : dflt);
    }
    sl_buf_printf(b, "\n  },\n  \"label2id\": {");
    for (int i = 0; i < c->num_labels; i++) {
        char dflt[32];
        snprintf(dflt, sizeof dflt, "LABEL_%d", i);
        sl_buf_printf(b, "%s\n    ", i ? "," : "");
        rc |= json_text(b, c->label_names ? c->label_names[i] : dflt);
        sl_buf_printf(b, ": %d", i);
    }
    char cd[32];
    float_text(c->cls_dropout, cd, sizeof cd);
    sl_buf_printf(b, "\n  },\n  \"problem_type\": \"single_label_classification\",\n"
                     "  \"classifier_dropout\": %s", cd);
    return rc;
}

int dev_config_save(const dev_config *c, const char *path, sl_err *err)
{
    char eps[32], hd[32], ad[32], ir[32];
    float_text(c->ln_eps, eps, sizeof eps);
    float_text(c->hidden_dropout, hd, sizeof hd);
    float_text(c->attn_dropout, ad, sizeof ad);
    float_text(c->init_range, ir, sizeof ir);
    int cls = c->task == DEV_TASK_CLASSIFY;
    sl_buf b = {0};
    sl_buf_printf(&b,
                  "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"bert\",\n"
                  "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
                  "  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
                  "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n"
                  "  \"type_vocab_size\": %d,\n  \"layer_norm_eps\": %s,\n"
                  "  \"hidden_act\": \"%s\",\n  \"hidden_dropout_prob\": %s,\n"
                  "  \"attention_probs_dropout_prob\": %s,\n  \"initializer_range\": %s",
                  cls ? "BertForSequenceClassification" : "BertForMaskedLM", c->hidden, c->layers,
                  c->heads, c->intermediate, c->vocab, c->max_pos, c->type_vocab, eps,
                  c->gelu == KN_GELU_TANH ? "gelu_new" : "gelu", hd, ad, ir);
    int rc = 0;
    if (cls) {
        sl_buf_printf(&b, ",\n");
        rc = add_classes(c, &b);
    }
    sl_buf_printf(&b, "\n}\n");
    if (rc)
        sl_err_set(err, SL_EINVAL, "config: a label name cannot be encoded as JSON");
    else
        rc = sl_write_file_atomic(path, b.s, b.n, err);
    free(b.s);
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
