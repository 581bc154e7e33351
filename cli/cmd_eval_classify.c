/* skyloom eval --task classify: a sequence classifier on a labelled shard,
 * as researchers report it: the mean cross-entropy, accuracy, macro-F1, each
 * class's precision and recall, and (--json) the confusion matrix. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dev_ckpt.h"
#include "dev_cls.h"
#include "dev_train.h"
#include "kn_be.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

/* What the predictions of one class came to. */
typedef struct class_score {
    uint64_t support, predicted, hits;
    double precision, recall, f1;
} class_score;

/* Precision, recall and F1 of each class from the confusion matrix
 * (conf[true * K + predicted]); an undefined ratio is 0 (scikit-learn's
 * zero_division=0). Returns macro-F1: the mean F1 over the classes that
 * occur as a true or a predicted class (scikit-learn's labels=None). */
static double score_classes(const uint64_t *conf, int K, class_score *cs)
{
    double f1_sum = 0;
    int present = 0;
    for (int c = 0; c < K; c++) {
        class_score *x = &cs[c];
        memset(x, 0, sizeof *x);
        for (int k = 0; k < K; k++) {
            x->support += conf[(size_t)c * K + k];
            x->predicted += conf[(size_t)k * K + c];
        }
        x->hits = conf[(size_t)c * K + c];
        x->precision = x->predicted ? (double)x->hits / (double)x->predicted : 0;
        x->recall = x->support ? (double)x->hits / (double)x->support : 0;
        double pr = x->precision + x->recall;
        x->f1 = pr > 0 ? 2 * x->precision * x->recall / pr : 0;
        if (x->support || x->predicted) {
            f1_sum += x->f1;
            present++;
        }
    }
    return present ? f1_sum / present : 0;
}

int cmd_eval_classify(const cli_eval_args *a)
{
    sl_err err = {0};
    dev_config cfg;
    if (dev_config_load(&cfg, a->config, &err))
        return sl_cli_fail("eval", 1, "%s", err.msg);
    cfg.task = DEV_TASK_CLASSIFY;
    char **names = NULL;
    int nnames = 0;
    if (dev_config_validate(&cfg, &err) ||
        dev_config_load_names(a->config, &names, &nnames, &err))
        return sl_cli_fail("eval", 1, "%s: %s", a->config, err.msg);
    dev_shard *shard = dev_shard_open(a->data, &err);
    int status = 1, K = cfg.num_labels;
    dev_stage *st = NULL;
    dev_mlm_batch mb = {0};
    uint64_t *conf = NULL, *rows = NULL;
    float *logits = NULL, *all = NULL; /* a batch's logits; every sequence's (--logits) */
    class_score *cs = NULL;
    if (!shard) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    if (dev_train_check_shard(&cfg, shard, &err)) {
        sl_cli_fail("eval", 1, "%s: %s", a->data, err.msg);
        goto out;
    }
    const dev_labels *labels = dev_shard_labels(shard);
    if (dev_config_check_names(names, nnames, labels, a->config, &err)) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    uint64_t count = dev_shard_count(shard), first = (uint64_t)a->first;
    if (first >= count) {
        sl_cli_fail("eval", 1, "%s: --first %llu is past the shard's %llu sequences", a->data,
                    (unsigned long long)first, (unsigned long long)count);
        goto out;
    }
    /* every sequence from --first to the end, or --batches batches of them */
    uint64_t end = count;
    if (a->batches > 0 && first + (uint64_t)a->batches * (uint64_t)a->B < end)
        end = first + (uint64_t)a->batches * (uint64_t)a->B;
    int T = dev_shard_seq_len(shard);
    char why[512];
    const kn_be *be = kn_be_open(a->device, why, sizeof why, &err);
    if (!be) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    sl_log_info("eval", "device: %s", why);
    int pflags = dev_precision_flags(a->precision);
    if (pflags && (!be->bf16_check || be->bf16_check(&err))) {
        sl_cli_fail("eval", 1, "--precision bf16 on %s: %s", be->name,
                    be->bf16_check ? err.msg : "no bf16 compute");
        goto out;
    }
    st = dev_stage_create(&cfg, 0, dev_unit_head(&cfg), a->B, T, 1, (uint64_t)a->seed, be,
                          (unsigned)pflags, &err);
    if (!st || dev_ckpt_load_model(st, a->model, &err)) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    if (a->logits && !(all = sl_try_malloc((size_t)(end - first) * K * sizeof *all))) {
        sl_cli_fail("eval", 1, "cannot hold %llu x %d logits for --logits",
                    (unsigned long long)(end - first), K);
        goto out;
    }
    dev_mlm_batch_alloc(&mb, a->B, T);
    conf = sl_xcalloc((size_t)K * K, sizeof *conf);
    rows = sl_xmalloc((size_t)a->B * sizeof *rows);
    logits = sl_xmalloc((size_t)a->B * K * sizeof *logits);
    double loss = 0;
    uint64_t n = 0;
    int batches = 0;
    for (uint64_t s0 = first; s0 < end; s0 += (uint64_t)a->B, batches++) {
        int B = end - s0 < (uint64_t)a->B ? (int)(end - s0) : a->B;
        for (int b = 0; b < B; b++)
            rows[b] = s0 + (uint64_t)b;
        dev_mlm_batch part = mb; /* the first B rows */
        part.B = B;
        double sum;
        int got;
        if (dev_cls_make_rows(shard, rows, &part, &err)) {
            sl_cli_fail("eval", 1, "%s", err.msg);
            goto out;
        }
        dev_micro m = {.B = B, .T = T, .tokens = part.tokens, .segments = part.segments,
                       .valid = part.valid, .labels = part.labels, .seq0 = s0,
                       .seed = (uint64_t)a->seed, .loss_scale = 1, .train = 0};
        if (dev_stage_forward_logits(st, 0, &m, NULL, logits, (size_t)a->B * K, &got, &sum, &err)) {
            sl_cli_fail("eval", 1, "%s", err.msg);
            goto out;
        }
        if (all)
            memcpy(all + (size_t)(s0 - first) * K, logits, (size_t)B * K * sizeof *logits);
        loss += sum;
        for (int b = 0; b < B; b++) {
            const float *r = logits + (size_t)b * K;
            int best = 0;
            for (int k = 1; k < K; k++)
                best = r[k] > r[best] ? k : best; /* ties: the lower class, as argmax */
            conf[(size_t)part.labels[(size_t)b * T] * K + best]++;
        }
        n += (uint64_t)B;
    }
    if (all && sl_write_file_atomic(a->logits, all, (size_t)n * K * sizeof *all, &err)) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    cs = sl_xcalloc((size_t)K, sizeof *cs);
    double macro_f1 = score_classes(conf, K, cs);
    uint64_t hits = 0;
    for (int c = 0; c < K; c++)
        hits += cs[c].hits;
    double accuracy = (double)hits / (double)n, mean_loss = loss / (double)n;
    if (a->json) {
        json_t *per = json_array(), *cm = json_array(), *ln = json_array();
        for (int c = 0; c < K; c++) {
            json_t *row = json_array();
            for (int k = 0; k < K; k++)
                json_array_append_new(row, json_integer((json_int_t)conf[(size_t)c * K + k]));
            json_array_append_new(cm, row);
            json_array_append_new(ln, json_string(dev_labels_name(labels, c)));
            json_array_append_new(per, json_pack("{s:s, s:f, s:f, s:f, s:I, s:I}", "label",
                                                 dev_labels_name(labels, c), "precision",
                                                 cs[c].precision, "recall", cs[c].recall, "f1",
                                                 cs[c].f1, "support", (json_int_t)cs[c].support,
                                                 "predicted", (json_int_t)cs[c].predicted));
        }
        json_t *j = json_pack("{s:s, s:f, s:f, s:f, s:I, s:I, s:i, s:i, s:s, s:o, s:o, s:o}",
                              "task", "classify", "loss", mean_loss, "accuracy", accuracy,
                              "macro_f1", macro_f1, "sequences", (json_int_t)n, "first",
                              (json_int_t)first, "batches", batches, "batch", a->B, "precision",
                              a->precision, "labels", ln, "per_class", per, "confusion", cm);
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("loss %.4f  accuracy %.4f  macro-F1 %.4f  (%llu sequences from %llu, %d classes)\n",
               mean_loss, accuracy, macro_f1, (unsigned long long)n, (unsigned long long)first, K);
        printf("  %-24s %9s %9s %9s %9s\n", "class", "precision", "recall", "f1", "support");
        for (int c = 0; c < K; c++)
            printf("  %-24s %9.4f %9.4f %9.4f %9llu\n", dev_labels_name(labels, c),
                   cs[c].precision, cs[c].recall, cs[c].f1, (unsigned long long)cs[c].support);
    }
    status = 0;
out:
    free(all);
    free(cs);
    free(conf);
    free(rows);
    free(logits);
    dev_mlm_batch_free(&mb);
    dev_stage_free(st);
    dev_shard_close(shard);
    dev_config_free_names(names, nnames);
    return status;
}
