#include "dev_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sl_file.h"
#include "kn_ops.h"

static int get_int(json_t *root, const char *key, int required, int def, int min, int max,
                   int *out, sl_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        if (required)
            return sl_err_set(err, SL_EINVAL, "config: missing field '%s'", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return sl_err_set(err, SL_EINVAL, "config: '%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return sl_err_set(err, SL_EINVAL, "config: '%s' must be between %d and %d, got %lld", key,
                          min, max, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_float(json_t *root, const char *key, double def, double min, double max,
                     float *out, sl_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v))
        return sl_err_set(err, SL_EINVAL, "config: '%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < min || x > max)
        return sl_err_set(err, SL_EINVAL, "config: '%s' must be between %g and %g, got %g", key,
                          min, max, x);
    *out = (float)x;
    return 0;
}

int dev_config_validate(const dev_config *c, sl_err *err)
{
    if (c->hidden < 1 || c->hidden > 16384)
        return sl_err_set(err, SL_EINVAL, "config: hidden_size must be between 1 and 16384");
    if (c->layers < 1 || c->layers > 256)
        return sl_err_set(err, SL_EINVAL, "config: num_hidden_layers must be between 1 and 256");
    if (c->heads < 1 || c->hidden % c->heads != 0)
        return sl_err_set(err, SL_EINVAL,
                          "config: hidden_size (%d) must be a multiple of num_attention_heads (%d)",
                          c->hidden, c->heads);
    if (c->intermediate < 1 || c->intermediate > 65536)
        return sl_err_set(err, SL_EINVAL, "config: intermediate_size must be between 1 and 65536");
    if (c->vocab < 5 || c->vocab > (1 << 22))
        return sl_err_set(err, SL_EINVAL, "config: vocab_size must be between 5 and 4194304");
    if (c->max_pos < 1 || c->max_pos > 65536)
        return sl_err_set(err, SL_EINVAL,
                          "config: max_position_embeddings must be between 1 and 65536");
    if (c->type_vocab < 1 || c->type_vocab > 1024)
        return sl_err_set(err, SL_EINVAL, "config: type_vocab_size must be between 1 and 1024");
    if (!(c->ln_eps > 0 && c->ln_eps < 1))
        return sl_err_set(err, SL_EINVAL, "config: layer_norm_eps must be in (0, 1)");
    if (!(c->hidden_dropout >= 0 && c->hidden_dropout < 1) ||
        !(c->attn_dropout >= 0 && c->attn_dropout < 1))
        return sl_err_set(err, SL_EINVAL, "config: dropout probabilities must be in [0, 1)");
    if (c->gelu != KN_GELU_ERF && c->gelu != KN_GELU_TANH)
        return sl_err_set(err, SL_EINVAL, "config: bad hidden_act");
    return 0;
}

int dev_config_parse(dev_config *c, const char *json_text, sl_err *err)
{
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root)
        return sl_err_set(err, SL_EINVAL, "config: invalid JSON at line %d: %s", je.line, je.text);
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) {
        sl_err_set(err, SL_EINVAL, "config: top level must be a JSON object");
        goto out;
    }
    if (get_int(root, "hidden_size", 1, 0, 1, 16384, &c->hidden, err) ||
        get_int(root, "num_hidden_layers", 1, 0, 1, 256, &c->layers, err) ||
        get_int(root, "num_attention_heads", 1, 0, 1, 1024, &c->heads, err) ||
        get_int(root, "intermediate_size", 1, 0, 1, 65536, &c->intermediate, err) ||
        get_int(root, "vocab_size", 1, 0, 5, 1 << 22, &c->vocab, err) ||
        get_int(root, "max_position_embeddings", 0, 512, 1, 65536, &c->max_pos, err) ||
        get_int(root, "type_vocab_size", 0, 2, 1, 1024, &c->type_vocab, err) ||
        get_float(root, "layer_norm_eps", 1e-12, 1e-30, 0.5, &c->ln_eps, err) ||
        get_float(root, "hidden_dropout_prob", 0.1, 0, 0.99, &c->hidden_dropout, err) ||
        get_float(root, "attention_probs_dropout_prob", 0.1, 0, 0.99, &c->attn_dropout, err) ||
        get_float(root, "initializer_range", 0.02, 0, 10, &c->init_range, err))
        goto out;
    json_t *act = json_object_get(root, "hidden_act");
    c->gelu = KN_GELU_ERF;
    if (act) {
        const char *a = json_string_value(act);
        if (!a) {
            sl_err_set(err, SL_EINVAL, "config: 'hidden_act' must be a string");
            goto out;
        }
        if (!strcmp(a, "gelu"))
            c->gelu = KN_GELU_ERF;
        else if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh"))
            c->gelu = KN_GELU_TANH;
        else {
            sl_err_set(err, SL_EINVAL,
                       "config: hidden_act '%s' is not supported (gelu, gelu_new, "
                       "gelu_pytorch_tanh)",
                       a);
            goto out;
        }
    }
    rc = dev_config_validate(c, err);
out:
    json_decref(root);
    return rc;
}

int dev_config_load(dev_config *c, const char *path, sl_err *err)
{
    char *text = NULL;
    size_t n = 0;
    if (sl_read_file(path, 1 << 20, &text, &n, err))
        return -1;
    int rc = dev_config_parse(c, text, err);
    free(text);
    if (rc)
        sl_err_wrap(err, "%s", path);
    return rc;
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
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
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
    size_t emb = V * C + (size_t)c->max_pos * C + (size_t)c->type_vocab * C + 2 * C;
    size_t layer = 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C + 2 * C;
    size_t head = C * C + C + 2 * C + V;
    return emb + (size_t)c->layers * layer + head;
}
