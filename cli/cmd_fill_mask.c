/* skyloom fill-mask: the most likely tokens at each [MASK] of a text, as
 * Hugging Face's fill-mask pipeline reports them. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dev_ckpt.h"
#include "dev_stage.h"
#include "dev_tok.h"
#include "dev_vocab.h"
#include "kn_be.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: skyloom fill-mask [--config config.json] --model model.safetensors|DIR\n"
            "                         [--vocab vocab.txt] --text TEXT [--top-k 5] [--cased]\n"
            "                         [--json] [--logits FILE] [--device auto|cpu|cuda]\n"
            "                         [--precision fp32|bf16]\n\n"
            "Prints the top-k tokens and their probabilities at each [MASK] of TEXT, as\n"
            "Hugging Face's fill-mask pipeline does: the text is tokenized as BERT does\n"
            "([CLS] text [SEP], segment 0; [MASK], [CLS], [SEP], [PAD] and [UNK] written\n"
            "in the text are those tokens), the model runs with dropout off, and each\n"
            "mask's scores are the softmax of the logits there. --json prints the\n"
            "pipeline's output: a list of {score, token, token_str, sequence} for one\n"
            "mask, a list of such lists for several. --logits writes the (masks, vocab)\n"
            "logits as little-endian float32, row by row in text order.\n"
            "Text is lower-cased and accent-stripped unless --cased. --precision bf16\n"
            "computes the matrix products in bf16 (as skyloom train --precision bf16).\n"
            "--model DIR takes a folder as skyloom job export writes it: model.safetensors,\n"
            "config.json and vocab.txt from it unless --config or --vocab are given, and\n"
            "its tokenizer_config.json's do_lower_case false as --cased.\n");
}

/* Hugging Face's clean_up_tokenization, applied to a decoded sequence. */
static void cleanup(char *s)
{
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's",
                                       " 've", " 're"};
    for (size_t k = 0; k < sizeof from / sizeof from[0]; k++) {
        size_t fl = strlen(from[k]);
        char *w = s;
        for (const char *r = s; *r;) {
            if (!strncmp(r, from[k], fl)) {
                /* drop the leading space (and the trailing one of " ' ") */
                size_t keep = fl - 1 - (k == 4);
                memmove(w, r + 1, keep);
                w += keep;
                r += fl;
            } else {
                *w++ = *r++;
            }
        }
        *w = 0;
    }
}

/* The sequence with position pos set to id, as the pipeline decodes it:
 * special tokens dropped when there is one mask, kept when several. */
static char *filled(const dev_vocab *v, const int32_t *ids, int n, int pos, int id, int single)
{
    dev_special sp = dev_vocab_special(v);
    int32_t *t = sl_xmalloc((size_t)n * sizeof *t);
    int m = 0;
    for (int i = 0; i < n; i++) {
        int32_t x = i == pos ? id : ids[i];
        if (x == sp.pad)
            continue;
        if (single && (x == sp.cls || x == sp.sep || x == sp.mask || x == sp.unk))
            continue;
        t[m++] = x;
    }
    char *s = dev_tok_decode(v, t, (size_t)m);
    free(t);
    cleanup(s);
    return s;
}

int cmd_fill_mask(int argc, char **argv)
{
    const char *config = NULL, *model = NULL, *vpath = NULL, *text = NULL, *device = "auto";
    const char *precision = "fp32";
    const char *topk_s = NULL, *logits_path = NULL;
    int json = 0, cased = 0, topk = 5;
    sl_err err = {0};
    const cli_opt table[] = {{"--config", &config}, {"--model", &model},   {"--vocab", &vpath},
                             {"--text", &text},     {"--top-k", &topk_s},  {"--device", &device},
                             {"--logits", &logits_path}, {"--precision", &precision},
                             {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--cased")) {
            cased = 1;
            continue;
        }
        int r = cli_opt_take("fill-mask", argc, argv, &i, table);
        if (r < 0)
            return 2;
        if (r == 0)
            return sl_cli_fail("fill-mask", 2, "unknown option '%s'", a);
    }
    cli_model_dir folder;
    cli_model_folder(&folder, &model, &config, &vpath, &cased);
    if (!config || !model || !vpath || !text)
        return sl_cli_fail("fill-mask", 2, "--model, --text, and --config and --vocab unless "
                           "--model is a folder that has them, are required");
    if (topk_s && sl_parse_int("--top-k", topk_s, 1, 1 << 30, &topk, &err))
        return sl_cli_fail("fill-mask", 2, "%s", err.msg);
    if (!kn_be_name_ok(device))
        return sl_cli_fail("fill-mask", 2, "--device must be auto, cpu or cuda, got '%s'", device);
    int pflags = dev_precision_flags(precision);
    if (pflags < 0)
        return sl_cli_fail("fill-mask", 2, "--precision must be fp32 or bf16, got '%s'", precision);
    size_t tl = strlen(text), bad = dev_utf8_check(text, tl);
    if (bad < tl)
        return sl_cli_fail("fill-mask", 2, "--text: invalid UTF-8 at byte offset %zu", bad);
    dev_config cfg;
    if (dev_config_load(&cfg, config, &err))
        return sl_cli_fail("fill-mask", 1, "%s", err.msg);
    dev_vocab *v = dev_vocab_load(vpath, &err);
    if (!v)
        return sl_cli_fail("fill-mask", 1, "%s", err.msg);
    int status = 1;
    dev_ids ids = {0};
    dev_stage *s = NULL;
    int32_t *seg = NULL, *valid = NULL, *labels = NULL;
    float *logits = NULL;
    json_t *out = NULL;
    dev_special sp = dev_vocab_special(v);
    int V = cfg.vocab;
    if (dev_vocab_size(v) != V) {
        sl_cli_fail("fill-mask", 1, "%s has %d tokens but the model's vocab_size is %d", vpath,
                    dev_vocab_size(v), V);
        goto out;
    }
    if (sp.cls < 0 || sp.sep < 0 || sp.mask < 0) {
        sl_cli_fail("fill-mask", 1, "%s lacks %s", vpath,
                    sp.cls < 0 ? "[CLS]" : sp.sep < 0 ? "[SEP]" : "[MASK]");
        goto out;
    }
    if (topk > V) {
        sl_cli_fail("fill-mask", 2, "--top-k %d exceeds the vocabulary (%d)", topk, V);
        status = 2;
        goto out;
    }
    dev_ids_push(&ids, sp.cls);
    if (cli_encode_text(v, cased, text, &ids, &err)) {
        sl_cli_fail("fill-mask", 1, "--text: %s", err.msg);
        goto out;
    }
    dev_ids_push(&ids, sp.sep);
    int T = (int)ids.n, M = 0;
    if (T > cfg.max_pos) {
        sl_cli_fail("fill-mask", 1, "the text is %d tokens with [CLS] and [SEP], more than the "
                    "model's max_position_embeddings (%d)", T, cfg.max_pos);
        goto out;
    }
    seg = sl_xcalloc((size_t)T, sizeof *seg);
    valid = sl_xmalloc((size_t)T * sizeof *valid);
    labels = sl_xmalloc((size_t)T * sizeof *labels);
    for (int i = 0; i < T; i++) {
        valid[i] = 1;
        labels[i] = ids.v[i] == sp.mask ? sp.mask : -100; /* the head runs where labels are set */
        M += ids.v[i] == sp.mask;
    }
    if (M == 0) {
        sl_cli_fail("fill-mask", 2, "--text has no [MASK]");
        status = 2;
        goto out;
    }
    char why[512];
    const kn_be *be = kn_be_open(device, why, sizeof why, &err);
    if (!be) {
        sl_cli_fail("fill-mask", 1, "%s", err.msg);
        goto out;
    }
    sl_log_debug("fill-mask", "device: %s", why);
    if (pflags && (!be->bf16_check || be->bf16_check(&err))) {
        sl_cli_fail("fill-mask", 1, "--precision bf16 on %s: %s", be->name,
                    be->bf16_check ? err.msg : "no bf16 compute");
        goto out;
    }
    s = dev_stage_create(&cfg, 0, dev_unit_head(&cfg), 1, T, 1, 1, be, (unsigned)pflags, &err);
    if (!s || dev_ckpt_load_model(s, model, &err)) {
        sl_cli_fail("fill-mask", 1, "%s", err.msg);
        goto out;
    }
    logits = sl_try_malloc((size_t)M * V * sizeof *logits);
    if (!logits) {
        sl_cli_fail("fill-mask", 1, "cannot allocate %d x %d logits", M, V);
        goto out;
    }
    dev_micro mb = {.B = 1, .T = T, .tokens = ids.v, .segments = seg, .valid = valid,
                    .labels = labels, .loss_scale = 1, .train = 0};
    double loss;
    int got;
    if (dev_stage_forward_logits(s, 0, &mb, NULL, logits, (size_t)M * V, &got, &loss, &err)) {
        sl_cli_fail("fill-mask", 1, "%s", err.msg);
        goto out;
    }
    if (logits_path &&
        sl_write_file_atomic(logits_path, logits, (size_t)M * V * sizeof *logits, &err)) {
        sl_cli_fail("fill-mask", 1, "%s", err.msg);
        goto out;
    }
    cli_scored *c = sl_xmalloc((size_t)V * sizeof *c);
    out = json_array();
    for (int j = 0, pos = 0; j < M; j++, pos++) {
        while (ids.v[pos] != sp.mask)
            pos++;
        const float *r = logits + (size_t)j * V;
        cli_softmax_ranked(r, V, c);
        json_t *row = json_array();
        if (!json && M > 1)
            printf("%s[MASK] %d of %d (token %d):\n", j ? "\n" : "", j + 1, M, pos);
        for (int k = 0; k < topk; k++) {
            const char *tok = dev_vocab_token(v, c[k].id);
            int32_t id = c[k].id;
            char *str = dev_tok_decode(v, &id, 1);
            char *seq = filled(v, ids.v, T, pos, c[k].id, M == 1);
            if (json)
                json_array_append_new(row, json_pack("{s:f, s:i, s:s, s:s}", "score", c[k].p,
                                                     "token", c[k].id, "token_str", str,
                                                     "sequence", seq));
            else
                printf("%8.4f  %-16s %6d  %s\n", c[k].p, tok, c[k].id, seq);
            free(str);
            free(seq);
        }
        json_array_append_new(out, row);
    }
    free(c);
    if (json) {
        json_t *j = M == 1 ? json_incref(json_array_get(out, 0)) : json_incref(out);
        char *txt = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        printf("%s\n", txt);
        free(txt);
        json_decref(j);
    }
    status = 0;
out:
    json_decref(out);
    free(logits);
    free(seg);
    free(valid);
    free(labels);
    dev_stage_free(s);
    dev_ids_free(&ids);
    dev_vocab_free(v);
    return status;
}
