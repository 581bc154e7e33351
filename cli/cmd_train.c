/* skyloom train: BERT training on this machine (MLM, or sequence
 * classification with --task classify), as one stage or a pipeline of
 * stages on threads (the single-device reference every distributed run must
 * match). */
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dev_ckpt.h"
#include "dev_run.h"
#include "bal.h"
#include "dev_train.h"
#include "kn_be.h"
#include "kn_backend.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: skyloom train --config config.json --data SHARD --steps N --batch B\n"
            "                     [--task mlm|classify]\n"
            "                     [--micro-batches M] [--optimizer adamw|lamb] [--lr X]\n"
            "                     [--warmup N] [--weight-decay X] [--clip X] [--mask-prob P]\n"
            "                     [--init model.safetensors] [--resume DIR [--new-schedule]]\n"
            "                     [--save DIR] [--save-every N] [--metrics FILE] [--seed S]\n"
            "                     [--threads N] [--max-time SECONDS] [--stop-at N]\n"
            "                     [--device auto|cpu|cuda]\n"
            "                     [--recompute] [--recompute-attention]\n"
            "                     [--optim-state fp32|bf16] [--precision fp32|bf16]\n"
            "                     [--first N] [--sequences K] [--no-shuffle] [--log-every N]\n"
            "                     [--stages SPEC] [--schedule 1f1b|gpipe] [--stage-threads N]\n"
            "                     [--stage-device D,...] [--json]\n\n"
            "Trains a BERT (masked language model) on a token shard (skyloom data prepare).\n"
            "Each step reads B sequences, masks them (15%%), splits them into M micro-batches\n"
            "and accumulates their gradients: the step is the same for any M.\n"
            "With --task classify it fine-tunes a sequence classifier (Hugging Face's\n"
            "BertForSequenceClassification) on a labelled shard (data prepare --labels):\n"
            "each sequence's class from the [CLS] position through the pooler and the\n"
            "classifier, the loss the mean cross-entropy of the batch's sequences.\n\n"
            "  --config FILE       BERT config.json (hidden_size, num_hidden_layers, ...;\n"
            "                      to classify, num_labels or id2label: the shard's labels)\n"
            "  --data SHARD        token shard; its vocabulary must fit vocab_size\n"
            "  --task T            mlm (default) or classify\n"
            "  --steps N           train until step N\n"
            "  --batch B           sequences per step (default 8)\n"
            "  --micro-batches M   B/M sequences per forward/backward (default 1)\n"
            "  --optimizer O       adamw (default) or lamb\n"
            "  --lr X              peak learning rate (default 1e-4 adamw, 1e-3 lamb)\n"
            "  --warmup N          linear warm-up steps, then linear decay to 0 at --steps\n"
            "                      (default 10%% of the steps)\n"
            "  --weight-decay X    decoupled weight decay (default 0.01; never on biases\n"
            "                      and LayerNorm)\n"
            "  --clip X            global gradient-norm clip (default 1.0; 0 disables)\n"
            "  --init FILE         start from these weights (safetensors, HF BERT names); to\n"
            "                      classify, an MLM checkpoint too: the head it lacks\n"
            "                      (bert.pooler.dense, classifier) starts from normal(0,\n"
            "                      initializer_range) with zero biases, and the run says so\n"
            "  --resume DIR        continue a run saved with --save (weights, optimizer, step)\n"
            "                      with the same data and learning-rate options as it had\n"
            "  --new-schedule      with --resume: continue under this run's --steps, --lr,\n"
            "                      --warmup, ... instead (e.g. to train past the old end)\n"
            "  --save DIR          write DIR/step-N/{model,optim}.safetensors, config.json,\n"
            "                      data.json, schedule.json and manifest.json at the end\n"
            "                      (and every --save-every steps); DIR/latest names the\n"
            "                      newest.\n"
            "                      --resume reads them with any --stages\n"
            "  --metrics FILE      per-step CSV (default DIR/metrics.csv with --save, else\n"
            "                      metrics.csv)\n"
            "  --seed S            initialisation, masking and dropout seed (default 1)\n"
            "  --threads N         CPU threads (OpenMP and BLAS)\n"
            "  --max-time S        stop (and save) after the step that passes S seconds\n"
            "  --stop-at N         stop (and save) after step N; the learning-rate schedule\n"
            "                      stays the one of --steps (a run's first N steps)\n"
            "  --device D          auto (default: the GPU when one answers, else the CPU),\n"
            "                      cpu, or cuda (an error without a usable GPU)\n"
            "  --recompute         keep only each layer's output for backward and recompute\n"
            "                      the rest (less memory, one more forward; same results)\n"
            "  --recompute-attention  only the attention probabilities and output are\n"
            "                      recomputed (a few per cent slower; same results)\n"
            "  --precision P       fp32 (default) or bf16: mixed precision, every matrix\n"
            "                      product in bf16 with fp32 accumulation, the weights,\n"
            "                      gradients, optimizer, norms and softmax/LayerNorm/GELU/loss\n"
            "                      in fp32 (needs AVX512_BF16 or AMX on the CPU, compute\n"
            "                      capability 8.0 on a GPU); checkpoints are fp32 either way,\n"
            "                      so a run resumes in the other precision\n"
            "  --optim-state S     fp32 (default) or bf16: AdamW moments in bf16 with\n"
            "                      stochastic rounding (half the optimizer memory; the\n"
            "                      results differ from fp32 within rounding)\n"
            "  --first N           train on shard sequences N.. (default 0), e.g. to keep\n"
            "                      the rest for skyloom eval\n"
            "  --sequences K       ... and only K of them (default: to the end)\n"
            "  --no-shuffle        read them in shard order; by default every epoch reads\n"
            "                      them in a new order drawn from --seed (the same on resume)\n"
            "  --log-every N       without a terminal, a log line every N steps (default:\n"
            "                      about 100 lines per run) and at the last\n"
            "  --stages SPEC       run the model as a pipeline of stages, one thread each:\n"
            "                      a count N (the balancer's even split) or inclusive unit\n"
            "                      ranges 0-3,4-9,10-13 (unit 0 the embeddings, 1..L the\n"
            "                      layers, L+1 the head); the result is bit for bit the\n"
            "                      one-stage result. At most --micro-batches stages\n"
            "  --schedule S        1f1b (default) or gpipe: the order of the micro-batches'\n"
            "                      forwards and backwards on each stage\n"
            "  --stage-threads N   OpenMP/BLAS threads per stage (default: the cores divided\n"
            "                      among the stages)\n"
            "  --stage-device D    cpu or cuda (cuda:0) per stage, comma-separated, or one\n"
            "                      for all (default: --device)\n"
            "  --json              print a JSON summary at the end\n");
}

typedef struct opts {
    const char *config, *data, *init, *resume, *save, *metrics, *device, *optim_state, *precision;
    const char *stages, *schedule, *stage_device, *task;
    int stage_threads;
    int steps, batch, micro, save_every, threads, json, warmup, recompute, recompute_attn;
    int no_shuffle, log_every, new_schedule;
    int64_t first, sequences;
    int64_t max_time;
    int stop_at;
    double lr, wd, clip, mask_prob;
    int64_t seed;
    int kind;
} opts;

static int parse(opts *o, int argc, char **argv, int *help)
{
    sl_err err = {0};
    memset(o, 0, sizeof *o);
    o->batch = 8;
    o->micro = 1;
    o->lr = -1;
    o->wd = 0.01;
    o->clip = 1.0;
    o->mask_prob = 0.15;
    o->seed = 1;
    o->warmup = -1;
    o->device = "auto";
    o->optim_state = "fp32";
    o->precision = "fp32";
    o->stages = "1";
    o->schedule = "1f1b";
    o->task = "mlm";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            return 0;
        }
        /* options without a value */
        const struct {
            const char *name;
            int *on;
        } flags[] = {{"--recompute", &o->recompute},
                     {"--recompute-attention", &o->recompute_attn},
                     {"--no-shuffle", &o->no_shuffle},
                     {"--new-schedule", &o->new_schedule},
                     {"--json", &o->json}};
        int flag = 0;
        for (size_t f = 0; f < sizeof flags / sizeof flags[0] && !flag; f++)
            if (!strcmp(a, flags[f].name))
                *flags[f].on = flag = 1;
        if (flag)
            continue;
        if (i + 1 >= argc)
            return sl_cli_fail("train", 2, "%s needs a value (see --help)", a);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--config"))
            o->config = v;
        else if (!strcmp(a, "--data"))
            o->data = v;
        else if (!strcmp(a, "--init"))
            o->init = v;
        else if (!strcmp(a, "--resume"))
            o->resume = v;
        else if (!strcmp(a, "--save"))
            o->save = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--optim-state"))
            o->optim_state = v;
        else if (!strcmp(a, "--precision"))
            o->precision = v;
        else if (!strcmp(a, "--metrics"))
            o->metrics = v;
        else if (!strcmp(a, "--stages"))
            o->stages = v;
        else if (!strcmp(a, "--schedule"))
            o->schedule = v;
        else if (!strcmp(a, "--stage-device"))
            o->stage_device = v;
        else if (!strcmp(a, "--task"))
            o->task = v;
        else if (!strcmp(a, "--stage-threads"))
            rc = sl_parse_int(a, v, 1, 1024, &o->stage_threads, &err);
        else if (!strcmp(a, "--steps"))
            rc = sl_parse_int(a, v, 1, 1 << 30, &o->steps, &err);
        else if (!strcmp(a, "--batch"))
            rc = sl_parse_int(a, v, 1, 1 << 16, &o->batch, &err);
        else if (!strcmp(a, "--micro-batches"))
            rc = sl_parse_int(a, v, 1, 1 << 16, &o->micro, &err);
        else if (!strcmp(a, "--save-every"))
            rc = sl_parse_int(a, v, 1, 1 << 30, &o->save_every, &err);
        else if (!strcmp(a, "--threads"))
            rc = sl_parse_int(a, v, 1, 1024, &o->threads, &err);
        else if (!strcmp(a, "--warmup"))
            rc = sl_parse_int(a, v, 0, 1 << 30, &o->warmup, &err);
        else if (!strcmp(a, "--lr"))
            rc = sl_parse_double(a, v, 0, 10, &o->lr, &err);
        else if (!strcmp(a, "--weight-decay"))
            rc = sl_parse_double(a, v, 0, 10, &o->wd, &err);
        else if (!strcmp(a, "--clip"))
            rc = sl_parse_double(a, v, 0, 1e9, &o->clip, &err);
        else if (!strcmp(a, "--mask-prob"))
            rc = sl_parse_double(a, v, 0.001, 0.999, &o->mask_prob, &err);
        else if (!strcmp(a, "--seed"))
            rc = sl_parse_i64(a, v, 0, INT64_MAX, &o->seed, &err);
        else if (!strcmp(a, "--first"))
            rc = sl_parse_i64(a, v, 0, INT64_MAX, &o->first, &err);
        else if (!strcmp(a, "--sequences"))
            rc = sl_parse_i64(a, v, 1, INT64_MAX, &o->sequences, &err);
        else if (!strcmp(a, "--log-every"))
            rc = sl_parse_int(a, v, 1, 1 << 30, &o->log_every, &err);
        else if (!strcmp(a, "--max-time"))
            rc = sl_parse_duration(a, v, &o->max_time, &err);
        else if (!strcmp(a, "--stop-at"))
            rc = sl_parse_int(a, v, 1, 1000000000, &o->stop_at, &err);
        else if (!strcmp(a, "--optimizer")) {
            if (!strcmp(v, "adamw"))
                o->kind = DEV_OPT_ADAMW;
            else if (!strcmp(v, "lamb"))
                o->kind = DEV_OPT_LAMB;
            else
                return sl_cli_fail("train", 2, "--optimizer must be adamw or lamb, got '%s'", v);
        } else
            return sl_cli_fail("train", 2, "unknown option '%s'", a);
        if (rc)
            return sl_cli_fail("train", 2, "%s", err.msg);
    }
    if (!o->config || !o->data || !o->steps)
        return sl_cli_fail("train", 2, "--config, --data and --steps are required (see --help)");
    if (o->batch % o->micro)
        return sl_cli_fail("train", 2, "--batch (%d) must be a multiple of --micro-batches (%d)",
                           o->batch, o->micro);
    if (o->stop_at > o->steps)
        return sl_cli_fail("train", 2, "--stop-at %d is after --steps %d", o->stop_at, o->steps);
    if (o->init && o->resume)
        return sl_cli_fail("train", 2, "--init and --resume exclude each other");
    if (o->new_schedule && !o->resume)
        return sl_cli_fail("train", 2, "--new-schedule applies to --resume only");
    if (!kn_be_name_ok(o->device))
        return sl_cli_fail("train", 2, "--device must be auto, cpu or cuda, got '%s'", o->device);
    if (strcmp(o->optim_state, "fp32") && strcmp(o->optim_state, "bf16"))
        return sl_cli_fail("train", 2, "--optim-state must be fp32 or bf16, got '%s'", o->optim_state);
    if (dev_precision_flags(o->precision) < 0)
        return sl_cli_fail("train", 2, "--precision must be fp32 or bf16, got '%s'", o->precision);
    if (!strcmp(o->optim_state, "bf16") && o->kind != DEV_OPT_ADAMW)
        return sl_cli_fail("train", 2, "--optim-state bf16 is implemented for adamw only");
    if (bal_schedule_parse(o->schedule) < 0)
        return sl_cli_fail("train", 2, "--schedule must be 1f1b or gpipe, got '%s'", o->schedule);
    if (dev_task_parse(o->task) < 0)
        return sl_cli_fail("train", 2, "--task must be mlm or classify, got '%s'", o->task);
    return 0;
}

static void fmt_eta(char *buf, size_t n, double s)
{
    if (s < 0 || s > 1e8)
        snprintf(buf, n, "?");
    else if (s >= 3600)
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

/* --stage-device: one backend for every stage, or one per stage; with bf16
 * each must run bf16 products natively. */
static int stage_backends(const char *list, const char *fallback, int n, int bf16,
                          const kn_be **be, sl_err *err)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list ? list : fallback);
    int k = 0;
    const char *names[512];
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (k == 512)
            return sl_err_set(err, SL_EINVAL, "--stage-device: too many entries");
        names[k++] = t;
    }
    if (k != 1 && k != n)
        return sl_err_set(err, SL_EINVAL, "--stage-device lists %d devices for %d stages (give "
                          "one for all, or one per stage)", k, n);
    for (int i = 0; i < k; i++) {
        const char *name = names[i];
        char where[32] = "";
        if (k > 1)
            snprintf(where, sizeof where, "stage %d: ", i);
        if (!strcmp(name, "cuda:0"))
            name = "cuda";
        else if (!strncmp(name, "cuda:", 5))
            return sl_err_set(err, SL_ENOTSUP, "%s%s: one process drives one GPU (cuda:0); run a "
                              "device per GPU", where, name);
        if (!kn_be_name_ok(name))
            return sl_err_set(err, SL_EINVAL, "%sdevice '%s' is not auto, cpu, cuda or cuda:0",
                              where, name);
        char why[512];
        if (!(be[i] = kn_be_open(name, why, sizeof why, err)))
            return k > 1 ? sl_err_wrap(err, "stage %d", i) : -1;
        if (bf16 && (!be[i]->bf16_check || be[i]->bf16_check(err)))
            return be[i]->bf16_check ? sl_err_wrap(err, "--precision bf16 on %s%s", where, be[i]->name)
                                     : sl_err_set(err, SL_ENOTSUP, "--precision bf16: %s%s has no "
                                                  "bf16 compute", where, be[i]->name);
        sl_log_info("train", "%sdevice: %s", where, why);
    }
    for (int i = k; i < n; i++)
        be[i] = be[0];
    return 0;
}

int cmd_train(int argc, char **argv)
{
    opts o;
    int help = 0, rc = parse(&o, argc, argv, &help);
    if (help) {
        usage(stdout);
        return 0;
    }
    if (rc)
        return rc;
    if (o.threads) {
        omp_set_num_threads(o.threads);
        kn_blas_set_threads(o.threads);
    }
    sl_err err = {0};
    dev_config cfg;
    char **names = NULL;
    int nnames = 0;
    if (dev_config_load(&cfg, o.config, &err))
        return sl_cli_fail("train", 1, "%s", err.msg);
    cfg.task = dev_task_parse(o.task);
    if (dev_config_validate(&cfg, &err) ||
        (cfg.task == DEV_TASK_CLASSIFY && dev_config_load_names(o.config, &names, &nnames, &err)))
        return sl_cli_fail("train", 1, "%s: %s", o.config, err.msg);
    int bounds[513], nstages;
    if (dev_stages_parse(o.stages, dev_unit_count(&cfg), bounds, 512, &nstages, &err)) {
        dev_config_free_names(names, nnames);
        return sl_cli_fail("train", 2, "%s", err.msg);
    }
    if (nstages > o.micro) {
        dev_config_free_names(names, nnames);
        return sl_cli_fail("train", 2, "--stages %s: %d stages need at least %d micro-batches "
                           "(--micro-batches %d): a stage would have nothing to do", o.stages,
                           nstages, nstages, o.micro);
    }
    dev_feed_opts fo = {.batch = o.batch, .first = (uint64_t)o.first,
                        .sequences = (uint64_t)o.sequences, .shuffle = !o.no_shuffle,
                        .seed = (uint64_t)o.seed, .mask_prob = (float)o.mask_prob};
    dev_feed *feed = dev_feed_open(o.data, &cfg, &fo, &err);
    int status = 1;
    dev_train *tr = NULL;
    FILE *csv = NULL;
    json_t *fresh_all = json_array();
    const kn_be *be[512];
    if (!feed) {
        sl_cli_fail("train", 1, "%s", err.msg);
        goto out;
    }
    /* to classify, the shard's labels name the classes (the checkpoints'
     * id2label); a config that names them must name them alike */
    if (cfg.task == DEV_TASK_CLASSIFY) {
        if (dev_config_check_names(names, nnames, dev_feed_labels(feed), o.config, &err)) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        cfg.label_names = dev_labels_names(dev_feed_labels(feed));
    }
    unsigned pflags = (unsigned)dev_precision_flags(o.precision);
    if (stage_backends(o.stage_device, o.device, nstages, pflags != 0, be, &err)) {
        sl_cli_fail("train", 1, "%s", err.msg);
        goto out;
    }
    int T = dev_feed_seq_len(feed);
    dev_train_opts to = {
        .schedule = bal_schedule_parse(o.schedule),
        .stage_threads = o.stage_threads,
        .stage_be = be,
        .flags = (o.recompute ? DEV_STAGE_RECOMPUTE : 0) |
                 (o.recompute_attn ? DEV_STAGE_RECOMPUTE_ATTN : 0) |
                 (!strcmp(o.optim_state, "bf16") ? DEV_STAGE_BF16_STATE : 0) | pflags,
    };
    tr = dev_train_open(&cfg, bounds, nstages, o.batch, T, o.micro, (uint64_t)o.seed, &to, &err);
    if (!tr) {
        sl_cli_fail("train", 1, "%s", err.msg);
        goto out;
    }
    for (int i = 0; o.init && i < nstages; i++) {
        char fresh[1024];
        if (dev_ckpt_init_model(dev_train_stage(tr, i), o.init, fresh, sizeof fresh, &err)) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        if (fresh[0]) {
            sl_log_info("train: --init lacks the classification head; initialised",
                        "tensors=\"%s\" init=\"normal(0, %g), biases 0\" file=%s", fresh,
                        (double)cfg.init_range, o.init);
            for (char *sv = NULL, *t = strtok_r(fresh, ", ", &sv); t; t = strtok_r(NULL, ", ", &sv))
                json_array_append_new(fresh_all, json_string(t));
        }
    }
    dev_optim opt;
    dev_optim_for_run(&opt, o.kind, o.lr, o.wd, o.clip, o.steps, o.warmup);
    if (o.resume && dev_run_resume(tr, &opt, feed, o.resume, o.new_schedule, &err)) {
        sl_cli_fail("train", 1, "%s", err.msg);
        goto out;
    }
    dev_stage *st0 = dev_train_stage(tr, 0);
    char path[4096];
    if (o.metrics)
        snprintf(path, sizeof path, "%s", o.metrics);
    else if (o.save) {
        if (sl_mkdir(o.save, 0755, &err)) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        snprintf(path, sizeof path, "%s/metrics.csv", o.save);
    } else
        snprintf(path, sizeof path, "metrics.csv");
    int first = dev_stage_get_step(st0) + 1;
    csv = fopen(path, first > 1 ? "a" : "w");
    if (!csv) {
        sl_cli_fail("train", 1, "%s: %s", path, strerror(errno));
        goto out;
    }
    fseek(csv, 0, SEEK_END);
    if (ftell(csv) == 0) /* a new file (a resumed run appends to its old one) */
        fprintf(csv, "step,loss,masked,grad_norm,lr,seconds,tokens_per_s\n");
    int log_every = o.log_every ? o.log_every : (o.steps + 99) / 100;
    int tty = sl_cli_stdout_is_tty();
    const dev_order *ord = dev_feed_order(feed);
    size_t stage_bytes = 0;
    for (int i = 0; i < nstages; i++)
        stage_bytes += dev_stage_bytes(dev_train_stage(tr, i));
    sl_log_info("train", "task=%s params=%zu units=%d stages=%d schedule=%s batch=%d micro=%d "
                "seq=%d steps=%d optimizer=%s optim_state=%s precision=%s recompute=%s "
                "sequences=%llu..%llu order=%s stage_mb=%.1f", o.task,
                dev_config_param_count(&cfg), dev_unit_count(&cfg), nstages, o.schedule, o.batch,
                o.micro, T, o.steps, o.kind == DEV_OPT_LAMB ? "lamb" : "adamw", o.optim_state,
                o.precision,
                o.recompute ? "layer" : o.recompute_attn ? "attention" : "no",
                (unsigned long long)ord->first, (unsigned long long)(ord->first + ord->count - 1),
                ord->shuffle ? "shuffled" : "shard", stage_bytes / 1048576.0);
    double t_start = sl_now_s(), first_loss = -1, last_loss = 0, tok_s = 0;
    int last_step = first - 1;
    for (int step = first; step <= o.steps; step++) {
        double t0 = sl_now_s();
        dev_batch b;
        dev_step_info info;
        if (dev_feed_batch(feed, step, &b, &err)) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        if (dev_train_step(tr, &b, &opt, &info, &err)) {
            sl_cli_fail("train", 1, "step %d: %s", step, err.msg);
            goto out;
        }
        double dt = sl_now_s() - t0;
        tok_s = (double)o.batch * T / dt;
        if (first_loss < 0)
            first_loss = info.loss;
        last_loss = info.loss;
        fprintf(csv, "%d,%.6f,%d,%.6f,%.6g,%.4f,%.1f\n", step, info.loss, info.masked,
                info.grad_norm, (double)info.lr, dt, tok_s);
        double elapsed = sl_now_s() - t_start;
        char eta[32];
        fmt_eta(eta, sizeof eta, elapsed / (step - first + 1) * (o.steps - step));
        if (tty) {
            printf("\rstep %d/%d  loss %.4f  %.0f tok/s  ETA %s   ", step, o.steps, info.loss,
                   tok_s, eta);
            if (step == o.steps)
                printf("\n");
            fflush(stdout);
        } else if (!o.json && (step % log_every == 0 || step == o.steps || step == first)) {
            printf("step=%d loss=%.4f masked=%d grad_norm=%.4f lr=%.3g tokens_per_s=%.0f "
                   "eta=%s\n",
                   step, info.loss, info.masked, info.grad_norm, (double)info.lr, tok_s, eta);
            fflush(stdout);
        }
        int stop = ((o.max_time > 0 && elapsed >= (double)o.max_time) ||
                    (o.stop_at > 0 && step >= o.stop_at)) && step < o.steps;
        if (stop && tty)
            printf("\n");
        if (o.save && ((o.save_every && step % o.save_every == 0) || step == o.steps || stop)) {
            fflush(csv);
            if (dev_run_save(tr, &opt, feed, o.save, step, path, sizeof path, &err)) {
                sl_cli_fail("train", 1, "saving: %s", err.msg);
                goto out;
            }
            sl_log_info("checkpoint saved", "step=%d dir=%s", step, path);
        }
        last_step = step;
        if (stop) {
            sl_log_info(o.stop_at && step >= o.stop_at ? "stopped at --stop-at" : "time limit reached",
                        "step=%d seconds=%.0f", step, elapsed);
            break;
        }
    }
    double total = sl_now_s() - t_start;
    if (o.json) {
        json_t *j = json_pack("{s:i, s:f, s:f, s:f, s:f, s:s?, s:s, s:s, s:s, s:i}", "steps", last_step,
                              "first_loss", first_loss, "last_loss", last_loss, "seconds", total,
                              "tokens_per_s",
                              total > 0 ? (double)(last_step - first + 1) * o.batch * T / total : 0.0,
                              "checkpoint", o.save ? path : NULL, "device",
                              dev_stage_backend(st0), "optim_state", o.optim_state, "precision",
                              o.precision, "stages", nstages);
        json_object_set_new(j, "task", json_string(o.task));
        if (o.init)
            json_object_set_new(j, "initialised", json_incref(fresh_all));
        char *js = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        printf("%s\n", js);
        free(js);
        json_decref(j);
    }
    status = 0;
out:
    if (csv)
        fclose(csv);
    dev_train_free(tr);
    dev_feed_close(feed);
    dev_config_free_names(names, nnames);
    json_decref(fresh_all);
    return status;
}
