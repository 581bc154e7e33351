/* bal_json.c - the three inputs (BERT config.json, devices, network) read
 * with Jansson. Every error names the file, the line and the field:
 *   "devices.json:7: devices[1].memory_gib: must be a number > 0".
 * Jansson reports lines only for syntax errors, so for a bad field we walk
 * the text again along the field's path to find the line it is on. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_file.h"
#include "sl_mem.h"

/* ---- finding a field's line in the raw text ---- */

typedef struct scan {
    const char *s;
    size_t i, n;
    int line;
} scan;

static void sc_ws(scan *c)
{
    while (c->i < c->n && strchr(" \t\r\n", c->s[c->i])) {
        if (c->s[c->i] == '\n')
            c->line++;
        c->i++;
    }
}

/* Skips a string at c->i; *a, *len: its raw contents. */
static int sc_string(scan *c, const char **a, size_t *len)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return -1;
    size_t st = ++c->i;
    while (c->i < c->n && c->s[c->i] != '"') {
        if (c->s[c->i] == '\\')
            c->i++;
        else if (c->s[c->i] == '\n')
            c->line++;
        c->i++;
    }
    if (c->i >= c->n)
        return -1;
    *a = c->s + st;
    *len = c->i - st;
    c->i++;
    return 0;
}

static int sc_value(scan *c, int depth)
{
    sc_ws(c);
    if (c->i >= c->n || depth > 64)
        return -1;
    char ch = c->s[c->i];
    if (ch == '"') {
        const char *a;
        size_t l;
        return sc_string(c, &a, &l);
    }
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->i++;
        sc_ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        for (;;) {
            if (ch == '{') {
                const char *a;
                size_t l;
                sc_ws(c);
                if (sc_string(c, &a, &l))
                    return -1;
                sc_ws(c);
                if (c->i >= c->n || c->s[c->i++] != ':')
                    return -1;
            }
            if (sc_value(c, depth + 1))
                return -1;
            sc_ws(c);
            if (c->i >= c->n)
                return -1;
            if (c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->s[c->i] == close) {
                c->i++;
                return 0;
            }
            return -1;
        }
    }
    while (c->i < c->n && !strchr(",}] \t\r\n", c->s[c->i]))
        c->i++;
    return 0;
}

/* Skips one value and the comma after it; -1 if no comma follows. */
static int sc_skip_item(scan *c)
{
    if (sc_value(c, 0))
        return -1;
    sc_ws(c);
    if (c->i >= c->n || c->s[c->i] != ',')
        return -1;
    c->i++;
    return 0;
}

typedef struct jpath {
    const char *key; /* NULL: array index */
    int idx;
} jpath;

/* Line of the value at path (or of the deepest part of it that exists). */
static int line_of(const char *text, size_t n, const jpath *path, int depth)
{
    scan c = {text, 0, n, 1};
    sc_ws(&c);
    int best = c.line;
    for (int k = 0; k < depth; k++) {
        sc_ws(&c);
        if (c.i >= c.n)
            return best;
        char ch = c.s[c.i];
        if (path[k].key && ch == '{') {
            c.i++;
            int found = 0;
            for (;;) {
                sc_ws(&c);
                const char *a;
                size_t l;
                if (sc_string(&c, &a, &l))
                    return best;
                int kl = c.line;
                sc_ws(&c);
                if (c.i >= c.n || c.s[c.i++] != ':')
                    return best;
                if (l == strlen(path[k].key) && !memcmp(a, path[k].key, l)) {
                    best = kl;
                    found = 1;
                    break;
                }
                if (sc_skip_item(&c))
                    return best;
            }
            if (!found)
                return best;
        } else if (!path[k].key && ch == '[') {
            c.i++;
            for (int j = 0; j < path[k].idx; j++)
                if (sc_skip_item(&c))
                    return best;
            sc_ws(&c);
            best = c.line;
        } else
            return best;
    }
    return best;
}

/* ---- messages: never raw control bytes from a file ---- */

/* Length of the valid UTF-8 sequence at p that is not a C1 control, else 0. */
static size_t utf8_ok(const unsigned char *p)
{
    size_t n = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (p[0] >= 0xf5 || !n)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if (n == 2 && p[0] == 0xc2 && p[1] < 0xa0) /* U+0080..U+009F */
        return 0;
    return n;
}

/* Rewrites the message with control bytes (and bytes that are not UTF-8)
 * as \xNN, so a file cannot put terminal escapes into our one-line errors. */
static void msg_clean(sl_err *err)
{
    if (!err)
        return;
    char out[sizeof err->msg];
    const unsigned char *p = (const unsigned char *)err->msg;
    size_t n = 0, cap = sizeof out - 1;
    while (*p && n < cap) {
        size_t k = *p >= 0x80 ? utf8_ok(p) : (*p >= 0x20 && *p != 0x7f);
        if (k) {
            if (n + k > cap)
                break;
            memcpy(out + n, p, k);
            n += k;
            p += k;
        } else {
            if (n + 4 > cap)
                break;
            n += (size_t)snprintf(out + n, 5, "\\x%02x", *p++);
        }
    }
    out[n] = 0;
    memcpy(err->msg, out, n + 1);
}

/* ---- typed getters with path-aware errors ---- */

typedef struct jctx {
    const char *name, *text;
    size_t len;
    jpath path[8];
    int depth;
    sl_err *err;
} jctx;

static int jfail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(jctx *c, const char *fmt, ...)
{
    char where[160] = "", msg[300];
    size_t w = 0;
    for (int k = 0; k < c->depth && w < sizeof where - 1; k++) {
        if (c->path[k].key)
            w += (size_t)snprintf(where + w, sizeof where - w, "%s%s", k ? "." : "",
                                  c->path[k].key);
        else
            w += (size_t)snprintf(where + w, sizeof where - w, "[%d]", c->path[k].idx);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = line_of(c->text, c->len, c->path, c->depth);
    sl_err_set(c->err, SL_EINVAL, "%s:%d: %s: %s", c->name, line, c->depth ? where : "(top level)",
               msg);
    msg_clean(c->err);
    return -1;
}

static void jpush_key(jctx *c, const char *k)
{
    c->path[c->depth].key = k;
    c->path[c->depth++].idx = 0;
}

static void jpush_idx(jctx *c, int i)
{
    c->path[c->depth].key = NULL;
    c->path[c->depth++].idx = i;
}

/* Looks up o[k] and puts k on the path (the caller pops it). NULL when
 * absent: *r = 1, or an error if the field is required. */
static json_t *field(jctx *c, json_t *o, const char *k, int required, const char *what, int *r)
{
    json_t *v = json_object_get(o, k);
    jpush_key(c, k);
    *r = 0;
    if (!v)
        *r = required ? jfail(c, "missing (%s is required)", what) : 1;
    return v;
}

/* Typed fields: 0 ok, 1 absent (and not required), -1 error. */
static int get_num(jctx *c, json_t *o, const char *k, int required, double lo, double hi,
                   double *out)
{
    int r;
    json_t *v = field(c, o, k, required, "a number", &r);
    if (v && !json_is_number(v))
        r = jfail(c, "must be a number");
    else if (v && (!(json_number_value(v) >= lo && json_number_value(v) <= hi)))
        r = jfail(c, "must be between %g and %g, got %g", lo, hi, json_number_value(v));
    else if (v)
        *out = json_number_value(v);
    c->depth--;
    return r;
}

static int get_int(jctx *c, json_t *o, const char *k, int required, long long lo, long long hi,
                   long long *out)
{
    int r;
    json_t *v = field(c, o, k, required, "an integer", &r);
    if (v && !json_is_integer(v))
        r = jfail(c, "must be an integer");
    else if (v && (json_integer_value(v) < lo || json_integer_value(v) > hi))
        r = jfail(c, "must be between %lld and %lld, got %lld", lo, hi,
                  (long long)json_integer_value(v));
    else if (v)
        *out = json_integer_value(v);
    c->depth--;
    return r;
}

static int has_control(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = (const unsigned char *)s + i;
        if (*p < 0x20 || *p == 0x7f || (*p == 0xc2 && i + 1 < n && p[1] < 0xa0))
            return 1;
    }
    return 0;
}

static int get_str(jctx *c, json_t *o, const char *k, int required, char *buf, size_t size)
{
    int r;
    json_t *v = field(c, o, k, required, "a string", &r);
    if (v && !json_is_string(v))
        r = jfail(c, "must be a string");
    else if (v && (json_string_length(v) == 0 || json_string_length(v) >= size))
        r = jfail(c, "must be 1 to %zu characters", size - 1);
    else if (v && has_control(json_string_value(v), json_string_length(v)))
        r = jfail(c, "must not contain control characters");
    else if (v)
        memcpy(buf, json_string_value(v), json_string_length(v) + 1);
    c->depth--;
    return r;
}

/* Unknown keys are errors in our own formats: a typo must not pass silently. */
static int only_keys(jctx *c, json_t *o, const char *const *keys)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; keys[i]; i++)
            ok |= !strcmp(k, keys[i]);
        if (!ok) {
            jpush_key(c, k);
            jfail(c, "unknown field");
            c->depth--;
            return -1;
        }
    }
    return 0;
}

static json_t *load(const char *text, const char *name, sl_err *err)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        sl_err_set(err, SL_EINVAL, "%s:%d: column %d: %s", name, je.line, je.column, je.text);
        msg_clean(err);
    }
    else if (!json_is_object(j) && !json_is_array(j)) {
        sl_err_set(err, SL_EINVAL, "%s:1: (top level): must be an object", name);
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* ---- the three formats ---- */

/* The keys a config.json may hold: the ones parse_config reads, then what
 * Hugging Face's BertConfig (with PretrainedConfig's and, in older
 * transformers, the generation defaults) writes, which this reader does not
 * need. Keys that start with '_' (_name_or_path, _commit_hash, ...) are
 * Hugging Face's bookkeeping. Any other key is refused: a misspelled key
 * would otherwise leave its field at the default without a word. */
static const char *const config_keys[] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
    /* BertConfig */
    "pad_token_id", "position_embedding_type", "use_cache", "classifier_dropout",
    "gradient_checkpointing", "directionality", "pooler_fc_size", "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "output_past", "xla_device",
    /* PretrainedConfig */
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_bfloat16",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "tf_legacy_loss",
    "pruned_heads", "tie_word_embeddings", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "num_labels", "problem_type", "tokenizer_class",
    "prefix", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params",
    /* generation defaults */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", NULL};

/* Edit distance (insertions, deletions, substitutions, swaps of
 * neighbours), capped: keys are short. */
static size_t key_distance(const char *a, const char *b)
{
    enum { MAXK = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXK || m >= MAXK)
        return MAXK;
    size_t d[MAXK + 1][MAXK + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t k = 0; k <= m; k++)
        d[0][k] = k;
    for (size_t i = 1; i <= n; i++)
        for (size_t k = 1; k <= m; k++) {
            size_t v = d[i - 1][k - 1] + (a[i - 1] != b[k - 1]);
            if (d[i - 1][k] + 1 < v)
                v = d[i - 1][k] + 1;
            if (d[i][k - 1] + 1 < v)
                v = d[i][k - 1] + 1;
            if (i > 1 && k > 1 && a[i - 1] == b[k - 2] && a[i - 2] == b[k - 1] &&
                d[i - 2][k - 2] + 1 < v)
                v = d[i - 2][k - 2] + 1;
            d[i][k] = v;
        }
    return d[n][m];
}

/* Every key of the config is one of config_keys (or starts with '_'); an
 * unknown one is named, with the nearest known key when one is close. */
static int config_known_keys(jctx *c, json_t *j)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        int ok = k[0] == '_';
        const char *best = NULL;
        size_t bd = (size_t)-1;
        for (int i = 0; config_keys[i] && !ok; i++) {
            size_t d = key_distance(k, config_keys[i]);
            ok = d == 0;
            if (d < bd) {
                bd = d;
                best = config_keys[i];
            }
        }
        if (ok)
            continue;
        jpush_key(c, k);
        if (best && bd <= 1 + strlen(k) / 5)
            jfail(c, "unknown key; did you mean %s?", best);
        else
            jfail(c, "unknown key (not a BERT config.json key)");
        c->depth--;
        return -1;
    }
    return 0;
}

/* A class name: 1..BAL_MAX_LABEL_BYTES bytes, no control characters. */
static int label_name_ok(const char *s, size_t n)
{
    return n >= 1 && n <= BAL_MAX_LABEL_BYTES && !has_control(s, n);
}

/* id2label's key for id k: its decimal digits, no sign or leading zero. */
static int id_key(const char *k, long long *id)
{
    if (!k[0] || (k[0] == '0' && k[1]) || strlen(k) > 9)
        return -1;
    long long v = 0;
    for (const char *p = k; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
    }
    *id = v;
    return 0;
}

/* id2label (with num_labels, when both are there, of the same count) and
 * label2id as its inverse. */
static int parse_labels(jctx *c, json_t *j, bal_bert *b, int num_given)
{
    json_t *ids = json_object_get(j, "id2label");
    if (ids && !json_is_null(ids)) {
        jpush_key(c, "id2label");
        if (!json_is_object(ids))
            return jfail(c, "must be an object {\"0\": name, ...}");
        size_t n = json_object_size(ids);
        if (n < 1 || n > BAL_MAX_LABELS)
            return jfail(c, "must have 1 to %d labels, has %zu", BAL_MAX_LABELS, n);
        if (num_given && (long long)n != b->num_labels)
            return jfail(c, "has %zu labels, num_labels says %d", n, b->num_labels);
        const char *k;
        json_t *v;
        json_object_foreach(ids, k, v) {
            long long id;
            jpush_key(c, k);
            if (id_key(k, &id) || id >= (long long)n)
                return jfail(c, "keys must be the ids 0..%zu", n - 1);
            if (!json_is_string(v) || !label_name_ok(json_string_value(v), json_string_length(v)))
                return jfail(c, "must be a name of 1 to %d bytes without control characters",
                             BAL_MAX_LABEL_BYTES);
            c->depth--;
        }
        b->num_labels = (int)n;
        c->depth--;
    }
    json_t *names = json_object_get(j, "label2id");
    if (names && !json_is_null(names)) {
        jpush_key(c, "label2id");
        if (!json_is_object(names))
            return jfail(c, "must be an object {name: id, ...}");
        if (!ids || json_is_null(ids))
            return jfail(c, "given without id2label");
        if (json_object_size(names) != json_object_size(ids))
            return jfail(c, "has %zu labels, id2label %zu", json_object_size(names),
                         json_object_size(ids));
        const char *k;
        json_t *v;
        json_object_foreach(names, k, v) {
            jpush_key(c, k);
            char key[16];
            json_t *back = NULL;
            if (json_is_integer(v) && json_integer_value(v) >= 0 &&
                json_integer_value(v) < b->num_labels) {
                snprintf(key, sizeof key, "%lld", (long long)json_integer_value(v));
                back = json_object_get(ids, key);
            }
            if (!back || strcmp(json_string_value(back), k))
                return jfail(c, "label2id must be the inverse of id2label");
            c->depth--;
        }
        c->depth--;
    }
    return 0;
}

/* num_labels, id2label, label2id, problem_type, classifier_dropout. */
static int parse_classes(jctx *c, json_t *j, bal_bert *b)
{
    long long k = 2;
    int r = get_int(c, j, "num_labels", 0, 1, BAL_MAX_LABELS, &k);
    if (r < 0)
        return -1;
    b->num_labels = (int)k;
    if (parse_labels(c, j, b, r == 0))
        return -1;
    b->problem_type = BAL_PROBLEM_NONE;
    json_t *pt = json_object_get(j, "problem_type");
    if (pt && !json_is_null(pt)) {
        static const char *const kinds[] = {"single_label_classification",
                                            "multi_label_classification", "regression"};
        static const int kind_of[] = {BAL_PROBLEM_SINGLE_LABEL, BAL_PROBLEM_MULTI_LABEL,
                                      BAL_PROBLEM_REGRESSION};
        for (int i = 0; i < 3 && json_is_string(pt); i++)
            if (!strcmp(json_string_value(pt), kinds[i]))
                b->problem_type = kind_of[i];
        if (b->problem_type == BAL_PROBLEM_NONE) {
            jpush_key(c, "problem_type");
            jfail(c, "must be null, single_label_classification, multi_label_classification "
                     "or regression");
            c->depth--;
            return -1;
        }
    }
    b->classifier_dropout = b->hidden_dropout;
    json_t *cd = json_object_get(j, "classifier_dropout");
    if (cd && !json_is_null(cd) &&
        get_num(c, j, "classifier_dropout", 0, 0, 0.99, &b->classifier_dropout) < 0)
        return -1;
    return 0;
}

static int parse_config(jctx *c, json_t *j, bal_bert *b)
{
    if (!json_is_object(j))
        return jfail(c, "must be an object");
    if (config_known_keys(c, j))
        return -1;
    static const char *const k[7] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size", "vocab_size",
                                     "max_position_embeddings", "type_vocab_size"};
    long long v[7] = {0, 0, 0, 0, 0, 512, 2};
    for (int i = 0; i < 7; i++)
        if (get_int(c, j, k[i], i < 5, bal_bert_min[i], bal_bert_max[i], &v[i]) < 0)
            return -1;
    if (v[0] % v[2]) {
        jpush_key(c, "num_attention_heads");
        jfail(c, "hidden_size %lld is not a multiple of num_attention_heads %lld", v[0], v[2]);
        c->depth--;
        return -1;
    }
    *b = (bal_bert){(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5], (int)v[6],
                    1e-12, BAL_ACT_GELU, 0.1, 0.1, 0.02, BAL_TASK_MLM, 2, BAL_PROBLEM_NONE, 0.1};
    if (get_num(c, j, "layer_norm_eps", 0, 1e-30, 0.5, &b->ln_eps) < 0 ||
        get_num(c, j, "hidden_dropout_prob", 0, 0, 0.99, &b->hidden_dropout) < 0 ||
        get_num(c, j, "attention_probs_dropout_prob", 0, 0, 0.99, &b->attn_dropout) < 0 ||
        get_num(c, j, "initializer_range", 0, 0, 10, &b->init_range) < 0)
        return -1;
    char act[32] = "gelu";
    int r = get_str(c, j, "hidden_act", 0, act, sizeof act);
    if (r < 0)
        return -1;
    if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"))
        b->act = BAL_ACT_GELU_TANH;
    else if (strcmp(act, "gelu")) {
        jpush_key(c, "hidden_act");
        jfail(c, "'%s' is not supported (gelu, gelu_new, gelu_pytorch_tanh)", act);
        c->depth--;
        return -1;
    }
    return parse_classes(c, j, b);
}

int bal_bert_parse(bal_bert *b, const char *text, const char *name, sl_err *err)
{
    jctx c = {.name = name, .text = text, .len = strlen(text), .err = err};
    json_t *j = load(text, name, err);
    int rc = j ? parse_config(&c, j, b) : -1;
    json_decref(j);
    return rc;
}

int bal_bert_label_names(const char *text, const char *name, char ***names, int *n, sl_err *err)
{
    *names = NULL;
    *n = 0;
    bal_bert b;
    if (bal_bert_parse(&b, text, name, err))
        return -1;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    json_t *ids = json_object_get(j, "id2label");
    if (ids && json_is_object(ids)) {
        int k = (int)json_object_size(ids);
        char **out = sl_xcalloc((size_t)k, sizeof *out);
        for (int i = 0; i < k; i++) {
            char key[16];
            snprintf(key, sizeof key, "%d", i);
            out[i] = sl_xstrdup(json_string_value(json_object_get(ids, key)));
        }
        *names = out;
        *n = k;
    }
    json_decref(j);
    return 0;
}

/* One unit's seconds: [forward, backward] (b != NULL) or a number. */
static int parse_seconds(jctx *c, json_t *a, double *f, double *b)
{
    if (!b) {
        if (!json_is_number(a))
            return jfail(c, "must be the optimizer step's seconds");
        *f = json_number_value(a);
        if (!(*f >= 0 && *f < 1e6))
            return jfail(c, "seconds must be between 0 and 1e6");
        return 0;
    }
    if (!json_is_array(a) || json_array_size(a) != 2 || !json_is_number(json_array_get(a, 0)) ||
        !json_is_number(json_array_get(a, 1)))
        return jfail(c, "must be [forward seconds, backward seconds]");
    *f = json_number_value(json_array_get(a, 0));
    *b = json_number_value(json_array_get(a, 1));
    if (!(*f >= 0 && *b >= 0 && *f < 1e6 && *b < 1e6))
        return jfail(c, "seconds must be between 0 and 1e6");
    return 0;
}

/* unit_seconds (tb != NULL) or optim_seconds: per unit kind or per unit. */
static int parse_measured(jctx *c, json_t *us, const bal_unit *units, int n, double *tf,
                          double *tb)
{
    if (json_is_array(us)) {
        if ((int)json_array_size(us) != n)
            return jfail(c, "has %zu entries, the model has %d units", json_array_size(us), n);
        for (int u = 0; u < n; u++) {
            jpush_idx(c, u);
            int r = parse_seconds(c, json_array_get(us, (size_t)u), &tf[u], tb ? &tb[u] : NULL);
            c->depth--;
            if (r)
                return -1;
        }
        return 0;
    }
    if (!json_is_object(us))
        return jfail(c, "must be an object {embeddings, encoder, head} or an array per unit");
    static const char *const keys[] = {"embeddings", "encoder", "head", NULL};
    if (only_keys(c, us, keys))
        return -1;
    double f[3], b[3];
    for (int k = 0; k < 3; k++) {
        jpush_key(c, keys[k]);
        json_t *v = json_object_get(us, keys[k]);
        int r = v ? parse_seconds(c, v, &f[k], tb ? &b[k] : NULL) : jfail(c, "missing");
        c->depth--;
        if (r)
            return -1;
    }
    for (int u = 0; u < n; u++) {
        tf[u] = f[units[u].kind];
        if (tb)
            tb[u] = b[units[u].kind];
    }
    return 0;
}

static int parse_devices(jctx *c, json_t *j, const bal_unit *units, int n, bal_device **out,
                         double **times, int *n_dev)
{
    json_t *arr = j;
    if (json_is_object(j)) {
        static const char *const keys[] = {"devices", NULL};
        if (only_keys(c, j, keys))
            return -1;
        arr = json_object_get(j, "devices");
        jpush_key(c, "devices");
        if (!arr)
            return jfail(c, "missing (an array of devices is required)");
    }
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > 100000)
        return jfail(c, "must be an array of 1 to 100000 devices");
    size_t nd = json_array_size(arr);
    if ((double)nd * n > 5e7)
        return jfail(c, "%zu devices x %d units is too large", nd, n);
    bal_device *dev = sl_try_malloc(nd * sizeof *dev);
    double *t = sl_try_malloc(nd * 3 * (size_t)n * sizeof(double));
    if (!dev || !t) {
        free(dev);
        free(t);
        return sl_err_set(c->err, SL_ENOMEM, "%s: out of memory for %zu devices", c->name, nd);
    }
    memset(dev, 0, nd * sizeof *dev);
    static const char *const keys[] = {"id",        "site",         "host",     "backend",
                                       "memory_bytes", "memory_gib", "flops", "unit_seconds",
                                       "cpu_pool",  "pool_cpus",    "cpus",     "net_ns",
                                       "optim_seconds", NULL};
    for (size_t i = 0; i < nd; i++) {
        json_t *o = json_array_get(arr, i);
        bal_device *d = &dev[i];
        jpush_idx(c, (int)i);
        if (!json_is_object(o)) {
            jfail(c, "must be an object");
            goto fail;
        }
        if (only_keys(c, o, keys) || get_str(c, o, "id", 1, d->id, sizeof d->id) < 0)
            goto fail;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(dev[k].id, d->id)) {
                jpush_key(c, "id");
                jfail(c, "'%s' is used twice", d->id);
                goto fail;
            }
        int r = get_str(c, o, "site", 0, d->site, sizeof d->site);
        if (r < 0)
            goto fail;
        if (r)
            strcpy(d->site, "default");
        if (get_str(c, o, "host", 0, d->host, sizeof d->host) < 0)
            goto fail;
        int rp = get_str(c, o, "cpu_pool", 0, d->cpu_pool, sizeof d->cpu_pool);
        int rpc = get_num(c, o, "pool_cpus", 0, 1e-3, 1e6, &d->pool_cpus);
        int rc = get_num(c, o, "cpus", 0, 1e-3, 1e6, &d->cpus);
        if (rp < 0 || rpc < 0 || rc < 0)
            goto fail;
        if (rp != rpc || rp != rc) {
            jpush_key(c, "cpu_pool");
            jfail(c, "give cpu_pool, pool_cpus and cpus together, or none of them");
            goto fail;
        }
        for (size_t k = 0; rp == 0 && k < i; k++)
            if (!strcmp(dev[k].cpu_pool, d->cpu_pool) && dev[k].pool_cpus != d->pool_cpus) {
                jpush_key(c, "pool_cpus");
                jfail(c, "%g, but device '%s' of cpu pool '%s' says %g", d->pool_cpus, dev[k].id,
                      d->cpu_pool, dev[k].pool_cpus);
                goto fail;
            }
        int rn = get_str(c, o, "net_ns", 0, d->net_ns, sizeof d->net_ns);
        if (rn < 0)
            goto fail;
        if (rn == 0 && rp) {
            jpush_key(c, "net_ns");
            jfail(c, "needs a cpu_pool: a namespace is one of a machine's");
            goto fail;
        }
        r = get_str(c, o, "backend", 0, d->backend, sizeof d->backend);
        if (r < 0)
            goto fail;
        if (r)
            strcpy(d->backend, "cpu");
        long long mb = 0;
        double gib = 0;
        int rb = get_int(c, o, "memory_bytes", 0, 1, 1ll << 50, &mb);
        int rg = get_num(c, o, "memory_gib", 0, 1e-9, 1 << 20, &gib);
        if (rb < 0 || rg < 0)
            goto fail;
        if (rb == rg) {
            jpush_key(c, rb ? "memory_bytes" : "memory_gib");
            jfail(c, "give exactly one of memory_bytes and memory_gib");
            goto fail;
        }
        d->mem_bytes = rb == 0 ? (uint64_t)mb : (uint64_t)(gib * 1073741824.0);
        json_t *us = json_object_get(o, "unit_seconds");
        r = get_num(c, o, "flops", 0, 1, 1e21, &d->flops);
        if (r < 0)
            goto fail;
        if ((r == 0) == (us != NULL)) {
            jpush_key(c, us ? "unit_seconds" : "flops");
            jfail(c, "give exactly one of flops (sustained FLOP/s) and unit_seconds");
            goto fail;
        }
        if (us) {
            jpush_key(c, "unit_seconds");
            double *tf = t + i * 3 * (size_t)n, *tb = tf + n;
            if (parse_measured(c, us, units, n, tf, tb))
                goto fail;
            double sum = 0;
            for (int u = 0; u < n; u++)
                sum += tf[u] + tb[u];
            if (!(sum > 0)) {
                jfail(c, "are all zero: a device that takes no time cannot be planned");
                goto fail;
            }
            c->depth--;
            d->unit_fwd_s = tf;
            d->unit_bwd_s = tb;
        }
        json_t *os = json_object_get(o, "optim_seconds");
        if (os) {
            jpush_key(c, "optim_seconds");
            double *to = t + (i * 3 + 2) * (size_t)n;
            if (parse_measured(c, os, units, n, to, NULL))
                goto fail;
            c->depth--;
            d->unit_optim_s = to;
        }
        c->depth--;
    }
    *out = dev;
    *times = t;
    *n_dev = (int)nd;
    return 0;
fail:
    free(dev);
    free(t);
    return -1;
}

static int parse_link(jctx *c, json_t *o, bal_link *l)
{
    if (!json_is_object(o))
        return jfail(c, "must be an object {bandwidth_gbps, latency_ms}");
    static const char *const keys[] = {"bandwidth_gbps", "latency_ms", "a", "b", NULL};
    if (only_keys(c, o, keys))
        return -1;
    double g = 0, ms = 0;
    if (get_num(c, o, "bandwidth_gbps", 1, 1e-6, 1e6, &g) < 0 ||
        get_num(c, o, "latency_ms", 1, 0, 1e6, &ms) < 0)
        return -1;
    l->bw = g * 1e9 / 8;
    l->lat = ms * 1e-3;
    return 0;
}

static int has_site(const bal_device *dev, int nd, const char *s)
{
    for (int i = 0; i < nd; i++)
        if (!strcmp(dev[i].site, s))
            return 1;
    return 0;
}

static int parse_network(jctx *c, json_t *j, const bal_device *dev, int nd, bal_network *net,
                         bal_site_inside **inside, bal_site_link **links)
{
    *net = bal_network_default();
    *inside = NULL;
    *links = NULL;
    if (!json_is_object(j))
        return jfail(c, "must be an object");
    static const char *const keys[] = {"same_host", "inside_site", "between_sites", "sites",
                                       "links", NULL};
    if (only_keys(c, j, keys))
        return -1;
    bal_link *dst[3] = {&net->same_host, &net->inside_site, &net->between_sites};
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(j, keys[k]);
        if (!v)
            continue;
        jpush_key(c, keys[k]);
        if (parse_link(c, v, dst[k]))
            return -1;
        c->depth--;
    }
    json_t *sites = json_object_get(j, "sites");
    if (sites) {
        jpush_key(c, "sites");
        if (!json_is_object(sites) || json_object_size(sites) > (size_t)nd)
            return jfail(c, "must be an object of site name -> link (sites that have devices)");
        *inside = sl_xcalloc(json_object_size(sites) + 1, sizeof **inside);
        const char *k;
        json_t *v;
        int i = 0;
        json_object_foreach(sites, k, v) {
            jpush_key(c, k);
            if (!has_site(dev, nd, k))
                return jfail(c, "no device is at site '%s'", k);
            if (strlen(k) >= BAL_NAME_MAX || parse_link(c, v, &(*inside)[i].link))
                return strlen(k) >= BAL_NAME_MAX ? jfail(c, "site name too long") : -1;
            strcpy((*inside)[i++].site, k);
            c->depth--;
        }
        net->n_inside = i;
        net->inside = *inside;
        c->depth--;
    }
    json_t *ls = json_object_get(j, "links");
    if (ls) {
        jpush_key(c, "links");
        if (!json_is_array(ls) || json_array_size(ls) > 100000)
            return jfail(c, "must be an array of {a, b, bandwidth_gbps, latency_ms}");
        size_t nl = json_array_size(ls);
        *links = sl_xcalloc(nl + 1, sizeof **links);
        for (size_t i = 0; i < nl; i++) {
            json_t *o = json_array_get(ls, i);
            bal_site_link *x = &(*links)[i];
            jpush_idx(c, (int)i);
            if (parse_link(c, o, &x->link) || get_str(c, o, "a", 1, x->a, sizeof x->a) < 0 ||
                get_str(c, o, "b", 1, x->b, sizeof x->b) < 0)
                return -1;
            const char *bad = !has_site(dev, nd, x->a) ? "a" : !has_site(dev, nd, x->b) ? "b" : NULL;
            if (bad) {
                jpush_key(c, bad);
                return jfail(c, "no device is at site '%s'", bad[0] == 'a' ? x->a : x->b);
            }
            if (!strcmp(x->a, x->b)) {
                jpush_key(c, "b");
                return jfail(c, "a link joins two different sites (use \"sites\" for inside one)");
            }
            for (size_t k = 0; k < i; k++) {
                const bal_site_link *y = &(*links)[k];
                if ((!strcmp(x->a, y->a) && !strcmp(x->b, y->b)) ||
                    (!strcmp(x->a, y->b) && !strcmp(x->b, y->a)))
                    return jfail(c, "links[%zu] already joins sites '%s' and '%s' (links are "
                                 "symmetric: give each pair once)", k, y->a, y->b);
            }
            c->depth--;
        }
        net->n_links = (int)nl;
        net->links = *links;
        c->depth--;
    }
    return 0;
}

bal_problem *bal_problem_parse(const char *config_text, const char *config_name, int batch,
                               int seq, const char *devices_text, const char *devices_name,
                               const char *network_text, const char *network_name, sl_err *err)
{
    return bal_problem_parse_task(BAL_TASK_MLM, config_text, config_name, batch, seq,
                                  devices_text, devices_name, network_text, network_name, err);
}

bal_problem *bal_problem_parse_task(int task, const char *config_text, const char *config_name,
                                    int batch, int seq, const char *devices_text,
                                    const char *devices_name, const char *network_text,
                                    const char *network_name, sl_err *err)
{
    bal_problem *pb = NULL;
    bal_unit *units = NULL;
    bal_device *dev = NULL;
    double *times = NULL;
    bal_site_inside *inside = NULL;
    bal_site_link *links = NULL;
    json_t *jd = NULL, *jn = NULL;
    int n = 0, nd = 0;
    bal_bert b;
    bal_network net;
    jctx c;
    if (bal_bert_parse(&b, config_text, config_name, err))
        goto out;
    b.task = task;
    if (bal_bert_units(&b, batch, seq, &units, &n, err)) {
        sl_err_wrap(err, "%s", config_name);
        goto out;
    }
    c = (jctx){.name = devices_name, .text = devices_text, .len = strlen(devices_text), .err = err};
    if (!(jd = load(devices_text, devices_name, err)) ||
        parse_devices(&c, jd, units, n, &dev, &times, &nd))
        goto out;
    if (network_text) {
        c = (jctx){.name = network_name, .text = network_text, .len = strlen(network_text),
                   .err = err};
        if (!(jn = load(network_text, network_name, err)) ||
            parse_network(&c, jn, dev, nd, &net, &inside, &links))
            goto out;
    } else
        net = bal_network_default();
    pb = bal_problem_new(units, n, dev, nd, &net, err);
out:
    if (!pb)
        msg_clean(err);
    json_decref(jd);
    json_decref(jn);
    free(units);
    free(dev);
    free(times);
    free(inside);
    free(links);
    return pb;
}

/* Reads a whole file (at most `max` bytes) as a string. */
static char *read_text(const char *path, uint64_t max, sl_err *err)
{
    char *buf;
    size_t len;
    if (sl_read_file(path, max, &buf, &len, err))
        return NULL;
    if (strlen(buf) != len) {
        sl_err_set(err, SL_EINVAL, "%s: contains a NUL byte", path);
        free(buf);
        return NULL;
    }
    return buf;
}

int bal_bert_load(bal_bert *b, const char *path, sl_err *err)
{
    char *text = read_text(path, 1u << 20, err);
    int rc = text ? bal_bert_parse(b, text, path, err) : -1;
    free(text);
    return rc;
}

bal_problem *bal_problem_load(const char *config_path, int batch, int seq,
                              const char *devices_path, const char *network_path, sl_err *err)
{
    return bal_problem_load_task(BAL_TASK_MLM, config_path, batch, seq, devices_path,
                                 network_path, err);
}

bal_problem *bal_problem_load_task(int task, const char *config_path, int batch, int seq,
                                   const char *devices_path, const char *network_path,
                                   sl_err *err)
{
    char *ct = read_text(config_path, 1u << 20, err), *dt = NULL, *nt = NULL;
    bal_problem *pb = NULL;
    if (!ct || !(dt = read_text(devices_path, 64u << 20, err)))
        goto out;
    if (network_path && !(nt = read_text(network_path, 64u << 20, err)))
        goto out;
    pb = bal_problem_parse_task(task, ct, config_path, batch, seq, dt, devices_path, nt,
                                network_path, err);
out:
    free(ct);
    free(dt);
    free(nt);
    return pb;
}
