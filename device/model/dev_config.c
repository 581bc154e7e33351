#include "dev_config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_file.h"
#include "kn_ops.h"

void dev_config_bert(const dev_config *c, bal_bert *b)
{
    *b = (bal_bert){.hidden = c->hidden, .layers = c->layers, .heads = c->heads,
                    .intermediate = c->intermediate, .vocab = c->vocab, .max_pos = c->max_pos,
                    .type_vocab = c->type_vocab, .ln_eps = c->ln_eps,
                    .act = c->gelu == KN_GELU_TANH ? BAL_ACT_GELU_TANH : BAL_ACT_GELU,
                    .hidden_dropout = c->hidden_dropout, .attn_dropout = c->attn_dropout,
                    .init_range = c->init_range};
}

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
                      .attn_dropout = (float)b->attn_dropout, .init_range = (float)b->init_range};
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

int dev_config_save(const dev_config *c, const char *path, sl_err *err)
{
    char eps[32], hd[32], ad[32], ir[32];
    float_text(c->ln_eps, eps, sizeof eps);
    float_text(c->hidden_dropout, hd, sizeof hd);
    float_text(c->attn_dropout, ad, sizeof ad);
    float_text(c->init_range, ir, sizeof ir);
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "{\n  \"architectures\": [\"BertForMaskedLM\"],\n  \"model_type\": \"bert\",\n"
                     "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
                     "  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
                     "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n"
                     "  \"type_vocab_size\": %d,\n  \"layer_norm_eps\": %s,\n"
                     "  \"hidden_act\": \"%s\",\n  \"hidden_dropout_prob\": %s,\n"
                     "  \"attention_probs_dropout_prob\": %s,\n  \"initializer_range\": %s\n}\n",
                     c->hidden, c->layers, c->heads, c->intermediate, c->vocab, c->max_pos,
                     c->type_vocab, eps, c->gelu == KN_GELU_TANH ? "gelu_new" : "gelu", hd, ad, ir);
    if (n < 0 || (size_t)n >= sizeof buf)
        return sl_err_set(err, SL_ENOMEM, "config: cannot encode JSON");
    return sl_write_file_atomic(path, buf, (size_t)n, err);
}

size_t dev_config_param_count(const dev_config *c)
{
    size_t C = (size_t)c->hidden, F = (size_t)c->intermediate, V = (size_t)c->vocab;
    size_t emb = V * C + (size_t)c->max_pos * C + (size_t)c->type_vocab * C + 2 * C;
    size_t layer = 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C + 2 * C;
    size_t head = C * C + C + 2 * C + V;
    return emb + (size_t)c->layers * layer + head;
}
