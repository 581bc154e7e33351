/* skyloom train: BERT training on this machine (MLM, or sequence
 * classification with --task classify): the whole model as one stage (the
 * single-device reference every distributed run must match), as a pipeline
 * of stages on threads, or as a federation of replicas, one per --data
 * (docs/federation.md). */
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
            "                     [--stage-device D,...] [--json]\n"
            "       skyloom train ... --data A.shard --data B.shard [--data C.shard ...]\n"
            "                     --owner-batch 16,16[,16...] [--sync step|outer:H]\n"
            "                     [--codec-sync none|fp16|bf16|int8|topk:F] [--outer-lr X]\n"
            "                     [--outer-momentum X] [--replica-stages SPEC;SPEC...]\n\n"
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
            "  --json              print a JSON summary at the end\n\n"
            "A federation (several --data): each data owner's shard trains its own replica\n"
            "of the model, keyed as that owner's one-owner run would be; replicas meet\n"
            "only through synchronisation (docs/federation.md).\n"
            "  --data SHARD        once per owner, in replica order (at most 16)\n"
            "  --owner-batch LIST  each owner's sequences per step, in --data order, each a\n"
            "                      multiple of --micro-batches (instead of --batch); the\n"
            "                      replicas are weighted by it\n"
            "  --sync S            step (default): every step's gradients averaged over the\n"
            "                      replicas before clipping and the optimizer; outer:H\n"
            "                      (DiLoCo): H steps apart, then the replicas' pseudo-\n"
            "                      gradients averaged and one outer Nesterov step, after\n"
            "                      which every replica holds the same parameters. With one\n"
            "                      --data: a federation of one\n"
            "  --codec-sync C      what replicas exchange: none (default), fp16, bf16, int8\n"
            "                      (per row) or topk:F (the fraction F of each tensor), with\n"
            "                      error feedback on the sender\n"
            "  --outer-lr X        outer step's learning rate (default 0.7)\n"
            "  --outer-momentum X  outer step's Nesterov momentum (default 0.5)\n"
            "  --replica-stages S  each replica's --stages SPEC, ';'-separated in --data\n"
            "                      order (replicas may be cut differently); --stages gives\n"
            "                      every replica the same cuts\n"
            "  --owner-absent R:S-E  under outer:H, replica R (0 for the first --data) takes\n"
            "                      no part in steps S..E, E an outer step; at E it rejoins\n"
            "                      with the model of that outer step (the reference of a\n"
            "                      job whose owner went away; repeat once per replica)\n");
}

enum { MAX_OWNERS = DEV_SYNC_MAX_REPLICAS };

typedef struct opts {
    const char *config, *data, *init, *resume, *save, *metrics, *device, *optim_state, *precision;
    const char *datas[MAX_OWNERS];
    int ndata, batch_given;
    const char *owner_batch, *sync, *codec_sync, *replica_stages;
    const char *absent[MAX_OWNERS];
    int nabsent;
    double outer_lr, outer_momentum;
    int owner_b[MAX_OWNERS];
    int fed; /* a federation: several --data, or --sync */
    dev_fed_cfg fc;
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

/* --owner-absent R:S-E into the sync's away window of replica R. */
static int parse_absent(opts *o, const char *v)
{
    dev_sync_cfg *c = &o->fc.sync;
    int r, from, to, end = 0;
    if (!o->fed)
        return sl_cli_fail("train", 2, "--owner-absent applies to a federation (several --data)");
    if (o->fc.mode != DEV_SYNC_OUTER)
        return sl_cli_fail("train", 2, "--owner-absent %s needs --sync outer:H (under step every "
                           "step needs every replica)", v);
    if (sscanf(v, "%d:%d-%d%n", &r, &from, &to, &end) != 3 || v[end])
        return sl_cli_fail("train", 2, "--owner-absent %s: expected R:S-E (replica, first and "
                           "last step away)", v);
    if (r < 0 || r >= o->ndata)
        return sl_cli_fail("train", 2, "--owner-absent %s: replica %d of %d (0 is the first "
                           "--data)", v, r, o->ndata);
    if (from < 1 || to < from || to > o->steps)
        return sl_cli_fail("train", 2, "--owner-absent %s: steps 1 <= S <= E <= --steps %d", v,
                           o->steps);
    if (to % o->fc.every)
        return sl_cli_fail("train", 2, "--owner-absent %s: E = %d is not an outer step (a "
                           "multiple of H = %d): a replica rejoins at an outer step", v, to,
                           o->fc.every);
    if (c->away_to[r])
        return sl_cli_fail("train", 2, "--owner-absent %s: replica %d is already away", v, r);
    c->away_from[r] = (uint64_t)from;
    c->away_to[r] = (uint64_t)to;
    return 0;
}

/* The federation's options, once the others are read: a federation is
 * several --data, or one with --sync. 0, or the message printed. */
static int parse_fed(opts *o)
{
    sl_err err = {0};
    dev_fed_default(&o->fc);
    o->fed = o->ndata > 1 || o->sync;
    if (!o->fed) {
        const char *only = o->codec_sync ? "--codec-sync" : o->outer_lr > 0 ? "--outer-lr"
                           : o->outer_momentum >= 0 ? "--outer-momentum"
                           : o->replica_stages ? "--replica-stages" : NULL;
        if (only)
            return sl_cli_fail("train", 2, "%s applies to a federation (several --data, or --sync)",
                               only);
    }
    if (o->owner_batch && o->batch_given)
        return sl_cli_fail("train", 2, "--batch and --owner-batch exclude each other (--owner-batch "
                           "gives each owner's batch)");
    if (o->ndata > 1 && !o->owner_batch)
        return sl_cli_fail("train", 2, "%d --data need --owner-batch B1,B2,... (each owner's "
                           "sequences per step, in --data order)", o->ndata);
    if (o->owner_batch) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", o->owner_batch);
        int k = 0;
        for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
            if (k == MAX_OWNERS)
                return sl_cli_fail("train", 2, "--owner-batch %s: more than %d batches",
                                   o->owner_batch, MAX_OWNERS);
            if (sl_parse_int("--owner-batch", t, 1, 1 << 16, &o->owner_b[k], &err))
                return sl_cli_fail("train", 2, "%s", err.msg);
            if (o->owner_b[k] % o->micro)
                return sl_cli_fail("train", 2, "--owner-batch %s: owner %d's batch %d is not a "
                                   "multiple of --micro-batches (%d)", o->owner_batch, k + 1,
                                   o->owner_b[k], o->micro);
            k++;
        }
        if (k != o->ndata)
            return sl_cli_fail("train", 2, "--owner-batch %s lists %d batch%s for %d --data",
                               o->owner_batch, k, k == 1 ? "" : "es", o->ndata);
        o->batch = o->owner_b[0];
    } else
        o->owner_b[0] = o->batch;
    if (o->sync && dev_fed_parse_sync(o->sync, &o->fc, &err))
        return sl_cli_fail("train", 2, "%s", err.msg);
    if (o->codec_sync && dev_fed_parse_codec(o->codec_sync, &o->fc, &err))
        return sl_cli_fail("train", 2, "%s", err.msg);
    if (o->fc.mode == DEV_SYNC_OUTER && o->fc.every > o->steps)
        return sl_cli_fail("train", 2, "--sync %s: H is more than --steps %d (no outer step would "
                           "run)", o->sync, o->steps);
    if (o->fc.mode != DEV_SYNC_OUTER && (o->outer_lr > 0 || o->outer_momentum >= 0))
        return sl_cli_fail("train", 2, "%s applies to --sync outer:H",
                           o->outer_lr > 0 ? "--outer-lr" : "--outer-momentum");
    if (o->outer_lr > 0)
        o->fc.outer_lr = (float)o->outer_lr;
    if (o->outer_momentum >= 0)
        o->fc.outer_momentum = (float)o->outer_momentum;
    if (o->replica_stages && strcmp(o->stages, "1"))
        return sl_cli_fail("train", 2, "--stages and --replica-stages exclude each other");
    for (int i = 0; i < o->nabsent; i++)
        if (parse_absent(o, o->absent[i]))
            return 1;
    return 0;
}

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
    o->outer_momentum = -1;
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
        else if (!strcmp(a, "--data")) {
            if (o->ndata == MAX_OWNERS)
                return sl_cli_fail("train", 2, "--data: at most %d owners", MAX_OWNERS);
            o->datas[o->ndata++] = v;
            o->data = o->datas[0];
        } else if (!strcmp(a, "--owner-batch"))
            o->owner_batch = v;
        else if (!strcmp(a, "--sync"))
            o->sync = v;
        else if (!strcmp(a, "--codec-sync"))
            o->codec_sync = v;
        else if (!strcmp(a, "--replica-stages"))
            o->replica_stages = v;
        else if (!strcmp(a, "--owner-absent")) {
            if (o->nabsent == MAX_OWNERS)
                return sl_cli_fail("train", 2, "--owner-absent: at most %d", MAX_OWNERS);
            o->absent[o->nabsent++] = v;
        }
        else if (!strcmp(a, "--outer-lr"))
            rc = sl_parse_double(a, v, 1e-9, 10, &o->outer_lr, &err);
        else if (!strcmp(a, "--outer-momentum"))
            rc = sl_parse_double(a, v, 0, 0.999999, &o->outer_momentum, &err);
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
        else if (!strcmp(a, "--batch")) {
            rc = sl_parse_int(a, v, 1, 1 << 16, &o->batch, &err);
            o->batch_given = 1;
        }
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
    if (parse_fed(o))
        return 2;
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

/* Each replica's cut: --replica-stages "SPEC;SPEC;...", or --stages for all. */
static int replica_cuts(const opts *o, int units, int bounds[][513], int *n, sl_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", o->replica_stages ? o->replica_stages : "");
    char *save = NULL, *spec = o->replica_stages ? strtok_r(buf, ";", &save) : NULL;
    for (int r = 0; r < o->ndata; r++) {
        const char *sp = o->replica_stages ? spec : o->stages;
        if (!sp)
            return sl_err_set(err, SL_EINVAL, "--replica-stages %s lists %d cut%s for %d --data",
                              o->replica_stages, r, r == 1 ? "" : "s", o->ndata);
        if (dev_stages_parse(sp, units, bounds[r], 512, &n[r], err))
            return o->replica_stages ? sl_err_wrap(err, "--replica-stages: owner %d", r + 1) : -1;
        if (n[r] > o->micro)
            return sl_err_set(err, SL_EINVAL, "--stages %s: %d stages need at least %d "
                              "micro-batches (--micro-batches %d): a stage would have nothing "
                              "to do", sp, n[r], n[r], o->micro);
        spec = o->replica_stages ? strtok_r(NULL, ";", &save) : NULL;
    }
    if (spec)
        return sl_err_set(err, SL_EINVAL, "--replica-stages %s lists more cuts than the %d --data",
                          o->replica_stages, o->ndata);
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
    int R = o.ndata;
    int bounds[MAX_OWNERS][513];
    int nst[MAX_OWNERS];
    if (replica_cuts(&o, dev_unit_count(&cfg), bounds, nst, &err)) {
        dev_config_free_names(names, nnames);
        return sl_cli_fail("train", 2, "%s", err.msg);
    }
    int nstages = nst[0];
    int status = 1;
    dev_train *tr = NULL;
    FILE *csv = NULL;
    json_t *fresh_all = json_array();
    dev_feed *feeds[MAX_OWNERS] = {0};
    const kn_be *be[MAX_OWNERS][512];
    int T = 0, tokens = 0;
    for (int r = 0; r < R; r++) {
        dev_feed_opts fo = {.batch = o.owner_b[r], .first = (uint64_t)o.first,
                            .sequences = (uint64_t)o.sequences, .shuffle = !o.no_shuffle,
                            .seed = (uint64_t)o.seed, .mask_prob = (float)o.mask_prob};
        if (!(feeds[r] = dev_feed_open(o.datas[r], &cfg, &fo, &err))) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        if (r > 0 && dev_feed_seq_len(feeds[r]) != T) {
            sl_cli_fail("train", 1, "--data %s has sequences of %d tokens, %s of %d: every owner's "
                        "shard needs the same length", o.datas[r], dev_feed_seq_len(feeds[r]),
                        o.datas[0], T);
            goto out;
        }
        T = dev_feed_seq_len(feeds[r]);
        tokens += o.owner_b[r] * T;
    }
    dev_feed *feed = feeds[0];
    /* to classify, the shard's labels name the classes (the checkpoints'
     * id2label); a config that names them must name them alike, and every
     * owner's shard must have the same labels in the same order */
    if (cfg.task == DEV_TASK_CLASSIFY) {
        if (dev_config_check_names(names, nnames, dev_feed_labels(feed), o.config, &err)) {
            sl_cli_fail("train", 1, "%s", err.msg);
            goto out;
        }
        uint8_t h0[32], h[32];
        dev_labels_hash(dev_feed_labels(feed), h0);
        for (int r = 1; r < R; r++) {
            dev_labels_hash(dev_feed_labels(feeds[r]), h);
            if (memcmp(h, h0, sizeof h)) {
                sl_cli_fail("train", 1, "--data %s has other labels than %s (another labels.txt, "
                            "or the same names in another order): the owners of a federation "
                            "train one classifier", o.datas[r], o.datas[0]);
                goto out;
            }
        }
        cfg.label_names = dev_labels_names(dev_feed_labels(feed));
    }
    unsigned pflags = (unsigned)dev_precision_flags(o.precision);
    /* one backend list serves every replica unless stages are given one each */
    int per_replica = o.stage_device && strchr(o.stage_device, ',') && R > 1;
    int maxn = 0;
    for (int r = 0; r < R; r++)
        maxn = nst[r] > maxn ? nst[r] : maxn;
    for (int r = 0; r < R; r++) {
        if (r == 0 || per_replica) {
            if (stage_backends(o.stage_device, o.device, per_replica ? nst[r] : maxn, pflags != 0,
                               be[r], &err)) {
                if (per_replica)
                    sl_err_wrap(&err, "owner %d", r + 1);
                sl_cli_fail("train", 1, "%s", err.msg);
                goto out;
            }
        } else
            memcpy(be[r], be[0], sizeof be[0]);
    }
    dev_train_opts to = {
        .schedule = bal_schedule_parse(o.schedule),
        .stage_threads = o.stage_threads,
        .flags = (o.recompute ? DEV_STAGE_RECOMPUTE : 0) |
                 (o.recompute_attn ? DEV_STAGE_RECOMPUTE_ATTN : 0) |
                 (!strcmp(o.optim_state, "bf16") ? DEV_STAGE_BF16_STATE : 0) | pflags,
    };
    dev_replica_cfg rep[MAX_OWNERS];
    for (int r = 0; r < R; r++)
        rep[r] = (dev_replica_cfg){.bounds = bounds[r], .nstages = nst[r], .B = o.owner_b[r],
                                   .stage_be = be[r]};
    tr = dev_train_open_fed(&cfg, rep, R, T, o.micro, (uint64_t)o.seed, &to, o.fed ? &o.fc : NULL,
                            &err);
    if (!tr) {
        sl_cli_fail("train", 1, "%s", err.msg);
        goto out;
    }
    for (int r = 0; o.init && r < R; r++)
        for (int i = 0; i < nst[r]; i++) {
            char fresh[1024];
            if (dev_ckpt_init_model(dev_train_replica_stage(tr, r, i), o.init, fresh, sizeof fresh,
                                    &err)) {
                sl_cli_fail("train", 1, "%s", err.msg);
                goto out;
            }
            if (fresh[0] && r == 0) { /* every replica starts its head alike */
                sl_log_info("train: --init lacks the classification head; initialised",
                            "tensors=\"%s\" init=\"normal(0, %g), biases 0\" file=%s", fresh,
                            (double)cfg.init_range, o.init);
                for (char *sv = NULL, *tk = strtok_r(fresh, ", ", &sv); tk;
                     tk = strtok_r(NULL, ", ", &sv))
                    json_array_append_new(fresh_all, json_string(tk));
            }
        }
    dev_optim opt;
    dev_optim_for_run(&opt, o.kind, o.lr, o.wd, o.clip, o.steps, o.warmup);
    if (o.resume && dev_run_resume_feeds(tr, &opt, (const dev_feed *const *)feeds, R, o.resume,
                                         o.new_schedule, &err)) {
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
    if (ftell(csv) == 0) { /* a new file (a resumed run appends to its old one) */
        fprintf(csv, "step,loss,masked,grad_norm,lr,seconds,tokens_per_s");
        for (int r = 0; o.fed && r < R; r++)
            fprintf(csv, ",loss_%d", r);
        fprintf(csv, o.fed ? ",sync_bytes\n" : "\n");
    }
    int log_every = o.log_every ? o.log_every : (o.steps + 99) / 100;
    int tty = sl_cli_stdout_is_tty();
    const dev_order *ord = dev_feed_order(feed);
    size_t stage_bytes = 0;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < nst[r]; i++)
            stage_bytes += dev_stage_bytes(dev_train_replica_stage(tr, r, i));
    sl_log_info("train", "task=%s params=%zu units=%d stages=%d schedule=%s batch=%d micro=%d "
                "seq=%d steps=%d optimizer=%s optim_state=%s precision=%s recompute=%s "
                "sequences=%llu..%llu order=%s stage_mb=%.1f", o.task,
                dev_config_param_count(&cfg), dev_unit_count(&cfg), nstages, o.schedule, o.batch,
                o.micro, T, o.steps, o.kind == DEV_OPT_LAMB ? "lamb" : "adamw", o.optim_state,
                o.precision,
                o.recompute ? "layer" : o.recompute_attn ? "attention" : "no",
                (unsigned long long)ord->first, (unsigned long long)(ord->first + ord->count - 1),
                ord->shuffle ? "shuffled" : "shard", stage_bytes / 1048576.0);
    char sync_name[32] = "", codec_name[32] = "";
    if (o.fed) {
        dev_fed_sync_name(&o.fc, sync_name, sizeof sync_name);
        dev_fed_codec_name(&o.fc, codec_name, sizeof codec_name);
        sl_log_info("train: a federation", "replicas=%d owner_batch=%s sync=%s codec_sync=%s "
                    "outer_lr=%g outer_momentum=%g", R, o.owner_batch ? o.owner_batch : "-",
                    sync_name, codec_name, (double)o.fc.outer_lr, (double)o.fc.outer_momentum);
    }
    double t_start = sl_now_s(), first_loss = -1, last_loss = 0, tok_s = 0;
    int last_step = first - 1;
    uint64_t sync_before = dev_train_sync_bytes(tr);
    for (int step = first; step <= o.steps; step++) {
        double t0 = sl_now_s();
        dev_batch b[MAX_OWNERS];
        dev_step_info info;
        for (int r = 0; r < R; r++)
            if (dev_feed_batch(feeds[r], step, &b[r], &err)) {
                sl_cli_fail("train", 1, "%s", err.msg);
                goto out;
            }
        if (dev_train_step(tr, b, &opt, &info, &err)) {
            sl_cli_fail("train", 1, "step %d: %s", step, err.msg);
            goto out;
        }
        double dt = sl_now_s() - t0;
        tok_s = (double)tokens / dt;
        if (first_loss < 0)
            first_loss = info.loss;
        last_loss = info.loss;
        fprintf(csv, "%d,%.6f,%d,%.6f,%.6g,%.4f,%.1f", step, info.loss, info.masked,
                info.grad_norm, (double)info.lr, dt, tok_s);
        if (o.fed) {
            for (int r = 0; r < R; r++) {
                dev_step_info ri;
                dev_train_replica_info(tr, r, &ri);
                if (dev_sync_present(&o.fc.sync, r, (uint64_t)step))
                    fprintf(csv, ",%.6f", ri.loss);
                else /* its owner is away: no step of its counts */
                    fprintf(csv, ",");
            }
            uint64_t now = dev_train_sync_bytes(tr);
            fprintf(csv, ",%llu", (unsigned long long)(now - sync_before));
            sync_before = now;
        }
        fprintf(csv, "\n");
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
            if (dev_run_save_feeds(tr, &opt, (const dev_feed *const *)feeds, R, o.save, step, path,
                                   sizeof path, &err)) {
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
                              total > 0 ? (double)(last_step - first + 1) * tokens / total : 0.0,
                              "checkpoint", o.save ? path : NULL, "device",
                              dev_stage_backend(st0), "optim_state", o.optim_state, "precision",
                              o.precision, "stages", nstages);
        json_object_set_new(j, "task", json_string(o.task));
        if (o.init)
            json_object_set_new(j, "initialised", json_incref(fresh_all));
        if (o.fed) {
            json_t *losses = json_array();
            for (int r = 0; r < R; r++) {
                dev_step_info ri;
                dev_train_replica_info(tr, r, &ri);
                json_array_append_new(losses, json_real(ri.loss));
            }
            json_object_set_new(j, "replicas", json_integer(R));
            json_object_set_new(j, "sync", json_string(sync_name));
            json_object_set_new(j, "codec_sync", json_string(codec_name));
            json_object_set_new(j, "replica_last_loss", losses);
            json_object_set_new(j, "sync_bytes", json_integer((json_int_t)dev_train_sync_bytes(tr)));
        }
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
    for (int r = 0; r < R; r++)
        dev_feed_close(feeds[r]);
    dev_config_free_names(names, nnames);
    json_decref(fresh_all);
    return status;
}
