/* skyloom eval: the mean MLM loss of a model on a shard (dropout off), or
 * with --task classify a classifier's metrics (cmd_eval_classify.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dev_ckpt.h"
#include "dev_order.h"
#include "dev_train.h"
#include "kn_be.h"
#include "sl_log.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: skyloom eval [--config config.json] --model model.safetensors|DIR --data SHARD\n"
               "                    [--task mlm|classify] [--batches K] [--batch B] [--first N]\n"
               "                    [--mask-prob P] [--seed S] [--device auto|cpu|cuda]\n"
               "                    [--precision fp32|bf16] [--logits FILE] [--json]\n\n"
               "Prints the mean masked-LM loss (and perplexity) of the model over K batches of\n"
               "B sequences starting at sequence N of the shard (defaults: K 10, B 8, N 0),\n"
               "masked as training masks them (15%%, seed S, default 1), dropout off.\n"
               "--model DIR takes a folder as skyloom job export writes it (or Hugging Face\n"
               "lays one out): DIR/model.safetensors, and DIR/config.json unless --config.\n"
               "--precision bf16 computes the matrix products in bf16 (as skyloom train\n"
               "--precision bf16 does), everything else in fp32.\n\n"
               "With --task classify the model is a sequence classifier (the config's\n"
               "num_labels) and the shard a labelled one: it prints the mean cross-entropy,\n"
               "the accuracy, macro-F1 (the mean F1 of the classes that are true or\n"
               "predicted at least once) and each class's precision, recall and F1 over\n"
               "every sequence from N to the end (or K batches of B); --json adds the\n"
               "confusion matrix (rows the true class, columns the predicted one).\n"
               "--logits writes each sequence's logits (sequences x classes, little-endian\n"
               "float32) to FILE.\n");
}

int cmd_eval(int argc, char **argv)
{
    const char *config = NULL, *model = NULL, *data = NULL, *device = "auto", *precision = "fp32";
    const char *task = "mlm", *logits = NULL;
    int batches = 0, B = 8, json = 0;
    int64_t first = 0, seed = 1;
    double mask_prob = 0.15;
    sl_err err = {0};
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
        if (i + 1 >= argc)
            return sl_cli_fail("eval", 2, "%s needs a value (see --help)", a);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--task"))
            task = v;
        else if (!strcmp(a, "--logits"))
            logits = v;
        else if (!strcmp(a, "--precision"))
            precision = v;
        else if (!strcmp(a, "--batches"))
            rc = sl_parse_int(a, v, 1, 1 << 24, &batches, &err);
        else if (!strcmp(a, "--batch"))
            rc = sl_parse_int(a, v, 1, 1 << 16, &B, &err);
        else if (!strcmp(a, "--first"))
            rc = sl_parse_i64(a, v, 0, INT64_MAX, &first, &err);
        else if (!strcmp(a, "--seed"))
            rc = sl_parse_i64(a, v, 0, INT64_MAX, &seed, &err);
        else if (!strcmp(a, "--mask-prob"))
            rc = sl_parse_double(a, v, 0.001, 0.999, &mask_prob, &err);
        else
            return sl_cli_fail("eval", 2, "unknown option '%s'", a);
        if (rc)
            return sl_cli_fail("eval", 2, "%s", err.msg);
    }
    cli_model_dir folder;
    cli_model_folder(&folder, &model, &config, NULL, NULL);
    if (!config || !model || !data)
        return sl_cli_fail("eval", 2, "--model and --data are required, and --config unless "
                           "--model is a folder (see --help)");
    if (!kn_be_name_ok(device))
        return sl_cli_fail("eval", 2, "--device must be auto, cpu or cuda, got '%s'", device);
    int pflags = dev_precision_flags(precision);
    if (pflags < 0)
        return sl_cli_fail("eval", 2, "--precision must be fp32 or bf16, got '%s'", precision);
    if (dev_task_parse(task) < 0)
        return sl_cli_fail("eval", 2, "--task must be mlm or classify, got '%s'", task);
    if (dev_task_parse(task) == DEV_TASK_CLASSIFY) {
        cli_eval_args ea = {.config = config, .model = model, .data = data, .device = device,
                            .precision = precision, .logits = logits, .batches = batches, .B = B,
                            .json = json, .first = first, .seed = seed};
        return cmd_eval_classify(&ea);
    }
    if (logits)
        return sl_cli_fail("eval", 2, "--logits goes with --task classify");
    if (!batches)
        batches = 10;
    dev_config cfg;
    if (dev_config_load(&cfg, config, &err))
        return sl_cli_fail("eval", 1, "%s", err.msg);
    dev_shard *shard = dev_shard_open(data, &err);
    if (!shard)
        return sl_cli_fail("eval", 1, "%s", err.msg);
    int status = 1;
    dev_train *tr = NULL;
    dev_mlm_batch mb = {0};
    if (dev_train_check_shard(&cfg, shard, &err)) {
        sl_cli_fail("eval", 1, "%s: %s", data, err.msg);
        goto out;
    }
    dev_order range; /* the same check train makes of --first */
    if (dev_order_init(&range, dev_shard_count(shard), (uint64_t)first, 0, 0, 0, &err)) {
        sl_cli_fail("eval", 1, "%s: %s", data, err.msg);
        goto out;
    }
    int T = dev_shard_seq_len(shard);
    int bounds[2] = {0, dev_unit_count(&cfg)};
    char why[512];
    const kn_be *be = kn_be_open(device, why, sizeof why, &err);
    if (!be) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    sl_log_info("eval", "device: %s", why);
    if (pflags && (!be->bf16_check || be->bf16_check(&err))) {
        sl_cli_fail("eval", 1, "--precision bf16 on %s: %s", be->name,
                    be->bf16_check ? err.msg : "no bf16 compute");
        goto out;
    }
    tr = dev_train_create_on(&cfg, bounds, 1, B, T, 1, (uint64_t)seed, be, (unsigned)pflags, &err);
    if (!tr || dev_ckpt_load_model(dev_train_stage(tr, 0), model, &err)) {
        sl_cli_fail("eval", 1, "%s", err.msg);
        goto out;
    }
    if (dev_mlm_batch_alloc(&mb, B, T)) {
        sl_cli_fail("eval", 1, "cannot allocate a batch of %dx%d", B, T);
        goto out;
    }
    dev_special sp = dev_shard_special(shard);
    uint64_t count = dev_shard_count(shard);
    double sum = 0;
    long masked = 0;
    for (int k = 0; k < batches; k++) {
        uint64_t seq0 = (uint64_t)first + (uint64_t)k * B;
        double s;
        int m;
        if (dev_mlm_make_batch(shard, &sp, cfg.vocab, (float)mask_prob, (uint64_t)seed,
                               seq0 / count, seq0 % count, &mb, &err)) {
            sl_cli_fail("eval", 1, "%s", err.msg);
            goto out;
        }
        dev_batch b = dev_batch_of(&mb);
        if (dev_train_eval(tr, &b, &s, &m, &err)) {
            sl_cli_fail("eval", 1, "%s", err.msg);
            goto out;
        }
        sum += s;
        masked += m;
    }
    double loss = masked ? sum / (double)masked : 0;
    if (json) {
        json_t *j = json_pack("{s:f, s:f, s:I, s:i, s:i, s:s}", "loss", loss, "perplexity",
                              exp(loss), "masked_tokens", (json_int_t)masked, "batches", batches,
                              "batch", B, "precision", precision);
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("loss %.4f  perplexity %.2f  (%ld masked tokens, %d batches of %d)\n", loss,
               exp(loss), masked, batches, B);
    }
    status = 0;
out:
    dev_mlm_batch_free(&mb);
    dev_train_free(tr);
    dev_shard_close(shard);
    return status;
}
