/* skyloom predict: the classes of texts with their probabilities, as Hugging
 * Face's text-classification pipeline reports them, from a sequence
 * classifier (skyloom train --task classify, or BertForSequenceClassification
 * from PyTorch). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dev_ckpt.h"
#include "dev_stage.h"
#include "kn_be.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: skyloom predict [--config config.json] --model model.safetensors|DIR\n"
            "                       [--vocab vocab.txt] --text TEXT [--text TEXT]...\n"
            "                       [--top-k K] [--cased] [--json] [--logits FILE]\n"
            "                       [--device auto|cpu|cuda] [--precision fp32|bf16]\n\n"
            "Classifies each TEXT with a sequence classifier (a config with num_labels and\n"
            "id2label; skyloom train --task classify writes both), as Hugging Face's\n"
            "text-classification pipeline does: the text is tokenized as BERT does\n"
            "([CLS] text [SEP], cut to max_position_embeddings), the model runs with\n"
            "dropout off, and the scores are the softmax of the logits. It prints the K\n"
            "most likely labels (default 1) with their scores; --json prints the\n"
            "pipeline's output: [{\"label\", \"score\"}] (top-k 1: one per text; top-k K:\n"
            "a list of K per text, a list of such lists for several texts). Labels are\n"
            "id2label's names (LABEL_0, ... without it). --logits writes the (texts,\n"
            "labels) logits as little-endian float32. Text is lower-cased and\n"
            "accent-stripped unless --cased. --precision bf16 computes the matrix\n"
            "products in bf16 (as skyloom train --precision bf16).\n"
            "--model DIR takes a folder as skyloom job export writes it: model.safetensors,\n"
            "config.json and vocab.txt from it unless --config or --vocab are given, and\n"
            "its tokenizer_config.json's do_lower_case false as --cased.\n");
}

#define MAX_TEXTS 4096

int cmd_predict(int argc, char **argv)
{
    const char *config = NULL, *model = NULL, *vpath = NULL, *device = "auto";
    const char *topk_s = NULL, *logits_path = NULL, *text = NULL, *precision = "fp32";
    const char **texts = sl_xmalloc(MAX_TEXTS * sizeof *texts);
    int ntext = 0, json = 0, cased = 0, topk = 1;
    sl_err err = {0};
    const cli_opt table[] = {{"--config", &config}, {"--model", &model},   {"--vocab", &vpath},
                             {"--text", &text},     {"--top-k", &topk_s},  {"--device", &device},
                             {"--logits", &logits_path}, {"--precision", &precision},
                             {NULL, NULL}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(texts);
            return 0;
        }
        if (!strcmp(a, "--json") || !strcmp(a, "--cased")) {
            *(a[2] == 'j' ? &json : &cased) = 1;
            continue;
        }
        text = NULL;
        int r = cli_opt_take("predict", argc, argv, &i, table);
        if (r < 0) {
            free(texts);
            return 2;
        }
        if (r == 0) {
            free(texts);
            return sl_cli_fail("predict", 2, "unknown option '%s'", a);
        }
        if (text) {
            if (ntext == MAX_TEXTS) {
                free(texts);
                return sl_cli_fail("predict", 2, "more than %d --text", MAX_TEXTS);
            }
            texts[ntext++] = text;
        }
    }
    cli_model_dir folder;
    cli_model_folder(&folder, &model, &config, &vpath, &cased);
    if (!config || !model || !vpath || !ntext) {
        free(texts);
        return sl_cli_fail("predict", 2, "--model, --text, and --config and --vocab unless "
                           "--model is a folder that has them, are required");
    }
    if (topk_s && sl_parse_int("--top-k", topk_s, 1, 1 << 30, &topk, &err)) {
        free(texts);
        return sl_cli_fail("predict", 2, "%s", err.msg);
    }
    if (!kn_be_name_ok(device)) {
        free(texts);
        return sl_cli_fail("predict", 2, "--device must be auto, cpu or cuda, got '%s'", device);
    }
    int pflags = dev_precision_flags(precision);
    if (pflags < 0) {
        free(texts);
        return sl_cli_fail("predict", 2, "--precision must be fp32 or bf16, got '%s'", precision);
    }
    for (int t = 0; t < ntext; t++) {
        size_t tl = strlen(texts[t]), bad = dev_utf8_check(texts[t], tl);
        if (bad < tl) {
            free(texts);
            return sl_cli_fail("predict", 2, "--text %d: invalid UTF-8 at byte offset %zu", t + 1,
                               bad);
        }
    }
    int status = 1, K = 0, T = 0;
    dev_config cfg;
    char **names = NULL;
    int nnames = 0;
    dev_vocab *v = NULL;
    dev_ids *ids = sl_xcalloc((size_t)ntext, sizeof *ids);
    dev_stage *s = NULL;
    int32_t *tok = NULL, *seg = NULL, *valid = NULL, *labels = NULL;
    float *logits = NULL;
    cli_scored *c = NULL;
    json_t *out = NULL;
    if (dev_config_load(&cfg, config, &err)) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    cfg.task = DEV_TASK_CLASSIFY;
    if (dev_config_validate(&cfg, &err) || dev_config_load_names(config, &names, &nnames, &err)) {
        sl_cli_fail("predict", 1, "%s: %s", config, err.msg);
        goto done;
    }
    K = cfg.num_labels;
    if (topk > K) {
        sl_cli_fail("predict", 2, "--top-k %d exceeds the model's %d labels", topk, K);
        status = 2;
        goto done;
    }
    if (!(v = dev_vocab_load(vpath, &err))) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    dev_special sp = dev_vocab_special(v);
    if (dev_vocab_size(v) != cfg.vocab) {
        sl_cli_fail("predict", 1, "%s has %d tokens but the model's vocab_size is %d", vpath,
                    dev_vocab_size(v), cfg.vocab);
        goto done;
    }
    if (sp.cls < 0 || sp.sep < 0) {
        sl_cli_fail("predict", 1, "%s lacks %s", vpath, sp.cls < 0 ? "[CLS]" : "[SEP]");
        goto done;
    }
    /* [CLS] text [SEP] each, cut to max_position_embeddings with its [SEP] */
    for (int t = 0; t < ntext; t++) {
        dev_ids_push(&ids[t], sp.cls);
        if (cli_encode_text(v, cased, texts[t], &ids[t], &err)) {
            sl_cli_fail("predict", 1, "--text %d: %s", t + 1, err.msg);
            goto done;
        }
        if (ids[t].n + 1 > (size_t)cfg.max_pos) {
            sl_log_warn("predict: text cut to the model's max_position_embeddings",
                        "text=%d tokens=%zu max=%d", t + 1, ids[t].n + 1, cfg.max_pos);
            ids[t].n = (size_t)cfg.max_pos - 1;
        }
        dev_ids_push(&ids[t], sp.sep);
        T = (int)ids[t].n > T ? (int)ids[t].n : T;
    }
    size_t NT = (size_t)ntext * T;
    tok = sl_xmalloc(NT * sizeof *tok);
    seg = sl_xcalloc(NT, sizeof *seg);
    valid = sl_xmalloc(NT * sizeof *valid);
    labels = sl_xmalloc(NT * sizeof *labels);
    for (int t = 0; t < ntext; t++)
        for (int i = 0; i < T; i++) {
            size_t k = (size_t)t * T + (size_t)i;
            int in = i < (int)ids[t].n;
            tok[k] = in ? ids[t].v[i] : (sp.pad >= 0 ? sp.pad : 0);
            valid[k] = in;
            labels[k] = -100; /* no class: logits only */
        }
    char why[512];
    const kn_be *be = kn_be_open(device, why, sizeof why, &err);
    if (!be) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    sl_log_debug("predict", "device: %s", why);
    if (pflags && (!be->bf16_check || be->bf16_check(&err))) {
        sl_cli_fail("predict", 1, "--precision bf16 on %s: %s", be->name,
                    be->bf16_check ? err.msg : "no bf16 compute");
        goto done;
    }
    s = dev_stage_create(&cfg, 0, dev_unit_head(&cfg), ntext, T, 1, 1, be, (unsigned)pflags, &err);
    if (!s || dev_ckpt_load_model(s, model, &err)) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    logits = sl_xmalloc((size_t)ntext * K * sizeof *logits);
    dev_micro mb = {.B = ntext, .T = T, .tokens = tok, .segments = seg, .valid = valid,
                    .labels = labels, .loss_scale = 1, .train = 0};
    double loss;
    int rows;
    if (dev_stage_forward_logits(s, 0, &mb, NULL, logits, (size_t)ntext * K, &rows, &loss, &err)) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    if (logits_path &&
        sl_write_file_atomic(logits_path, logits, (size_t)ntext * K * sizeof *logits, &err)) {
        sl_cli_fail("predict", 1, "%s", err.msg);
        goto done;
    }
    c = sl_xmalloc((size_t)K * sizeof *c);
    out = json_array();
    for (int t = 0; t < ntext; t++) {
        const float *r = logits + (size_t)t * K;
        cli_softmax_ranked(r, K, c);
        json_t *row = json_array();
        if (!json && ntext > 1)
            printf("%s%s\n", t ? "\n" : "", texts[t]);
        for (int k = 0; k < topk; k++) {
            char dflt[32];
            snprintf(dflt, sizeof dflt, "LABEL_%d", c[k].id);
            const char *label = names ? names[c[k].id] : dflt;
            if (json)
                json_array_append_new(row, json_pack("{s:s, s:f}", "label", label, "score",
                                                     c[k].p));
            else
                printf("%8.4f  %s\n", c[k].p, label);
        }
        /* top-k 1: the pipeline's one dict per text */
        json_array_append_new(out, topk == 1 ? json_incref(json_array_get(row, 0)) : json_incref(row));
        json_decref(row);
    }
    if (json) {
        /* one text with top-k K: its list itself, as the pipeline returns it */
        json_t *j = ntext == 1 && topk > 1 ? json_incref(json_array_get(out, 0)) : json_incref(out);
        char *txt = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        printf("%s\n", txt);
        free(txt);
        json_decref(j);
    }
    status = 0;
done:
    json_decref(out);
    free(c);
    free(logits);
    free(tok);
    free(seg);
    free(valid);
    free(labels);
    dev_stage_free(s);
    for (int t = 0; t < ntext; t++)
        dev_ids_free(&ids[t]);
    free(ids);
    dev_vocab_free(v);
    dev_config_free_names(names, nnames);
    free(texts);
    return status;
}
