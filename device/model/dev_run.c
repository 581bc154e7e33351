/* dev_run.c - a training run's policy (dev_run.h). */
#include "dev_run.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bal.h"
#include "dev_ckpt.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

struct dev_feed {
    dev_shard *shard;
    dev_special sp;
    dev_order ord;
    dev_feed_opts o;
    int vocab, T;
    dev_mlm_batch mb;
    uint64_t *rows, *epochs; /* a step's shard sequences and their epochs */
};

const dev_shard *dev_feed_shard(const dev_feed *f) { return f->shard; }

void dev_feed_close(dev_feed *f)
{
    if (!f)
        return;
    dev_mlm_batch_free(&f->mb);
    free(f->rows);
    dev_shard_close(f->shard);
    free(f);
}

dev_feed *dev_feed_open(const char *shard_path, const dev_config *c, const dev_feed_opts *o,
                        sl_err *err)
{
    dev_feed *f = sl_xcalloc(1, sizeof *f);
    f->o = *o;
    f->vocab = c->vocab;
    if (!(f->shard = dev_shard_open(shard_path, err)))
        goto fail;
    if (dev_train_check_shard(c, f->shard, err) ||
        dev_order_init(&f->ord, dev_shard_count(f->shard), o->first, o->sequences, o->seed,
                       o->shuffle, err)) {
        sl_err_wrap(err, "%s", shard_path);
        goto fail;
    }
    f->T = dev_shard_seq_len(f->shard);
    f->sp = dev_shard_special(f->shard);
    if (o->batch < 1 || dev_mlm_batch_alloc(&f->mb, o->batch, f->T)) {
        sl_err_set(err, SL_ENOMEM, "cannot allocate a batch of %dx%d", o->batch, f->T);
        goto fail;
    }
    f->rows = sl_xmalloc((size_t)o->batch * 2 * sizeof *f->rows);
    f->epochs = f->rows + o->batch;
    return f;
fail:
    dev_feed_close(f);
    return NULL;
}

int dev_feed_seq_len(const dev_feed *f) { return f->T; }
const dev_order *dev_feed_order(const dev_feed *f) { return &f->ord; }

int dev_feed_batch(dev_feed *f, int step, dev_batch *b, sl_err *err)
{
    if (step < 1)
        return sl_err_set(err, SL_EINVAL, "step %d: steps count from 1", step);
    uint64_t seq0 = (uint64_t)(step - 1) * (uint64_t)f->o.batch;
    for (int r = 0; r < f->o.batch; r++)
        f->rows[r] = dev_order_seq(&f->ord, seq0 + (uint64_t)r, &f->epochs[r]);
    if (dev_mlm_make_rows(f->shard, &f->sp, f->vocab, f->o.mask_prob, f->o.seed, f->rows,
                          f->epochs, &f->mb, err))
        return -1;
    *b = dev_batch_of(&f->mb, seq0);
    return 0;
}

static json_t *data_json(const dev_feed *f)
{
    uint8_t sum[32];
    char hex[65];
    dev_shard_checksum(f->shard, sum);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", sum[i]);
    return json_pack("{s:s, s:I, s:I, s:b, s:I, s:i}", "shard", hex, "first",
                     (json_int_t)f->ord.first, "sequences", (json_int_t)f->ord.count, "shuffle",
                     f->ord.shuffle, "seed", (json_int_t)f->ord.seed, "batch", f->o.batch);
}

/* A record a checkpoint keeps of its run (data.json, schedule.json): the
 * keys a resumed run must match, each with the option that sets it; how the
 * mismatch message reads ("its run <verb> key=..., this one ... (option):
 * <why>"), and what cannot be checked without the file. */
typedef struct run_record {
    const char *name;
    const char *const *keys, *const *opts;
    int n;
    const char *verb, *why, *checks;
} run_record;

static const char *const data_keys[] = {"shard", "first", "sequences", "shuffle", "seed", "batch"};
static const char *const data_opts[] = {"--data: another shard", "--first", "--sequences",
                                        "--no-shuffle", "--seed", "--batch"};
static const run_record data_record = {
    "data.json", data_keys, data_opts, 6, "read",
    "the data would differ from the original run's; pass the same options",
    "this run reads the data the original would have"};

/* DIR/<r->name> holding j (taken). */
static int record_write(const run_record *r, json_t *j, const char *dir, sl_err *err)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, r->name);
    int rc = text ? sl_write_file_atomic(path, text, strlen(text), err)
                  : sl_err_set(err, SL_ENOMEM, "cannot encode %s", path);
    free(text);
    return rc;
}

/* What the run resuming from DIR does (now, taken) against DIR/<r->name>,
 * key by key: the first that differs fails, naming the saved value, the
 * new one and its option. A checkpoint without the record (an older one)
 * passes with a warning. */
static int record_check(const run_record *r, json_t *now, const char *dir, sl_err *err)
{
    char path[4096 + 64], *buf = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, r->name);
    if (access(path, F_OK) != 0) {
        sl_log_warn("train", "%s: no %s (an older checkpoint): cannot check that %s", dir, r->name,
                    r->checks);
        json_decref(now);
        return 0;
    }
    if (sl_read_file(path, 1 << 16, &buf, &len, err)) {
        json_decref(now);
        return -1;
    }
    json_error_t je;
    json_t *was = json_loadb(buf, len, 0, &je);
    free(buf);
    int rc = 0;
    if (!was || !json_is_object(was))
        rc = sl_err_set(err, SL_ECORRUPT, "%s: not a JSON object (%s)", path, was ? "" : je.text);
    for (int i = 0; i < r->n && !rc; i++) {
        json_t *a = json_object_get(was, r->keys[i]), *b = json_object_get(now, r->keys[i]);
        if (a && json_equal(a, b))
            continue;
        size_t fl = JSON_ENCODE_ANY | JSON_REAL_PRECISION(9);
        char *sa = a ? json_dumps(a, fl) : NULL, *sb = b ? json_dumps(b, fl) : NULL;
        rc = sl_err_set(err, SL_EINVAL, "resuming %s: its run %s %s=%.80s, this one %.80s (%s): %s",
                        dir, r->verb, r->keys[i], sa ? sa : "(missing)", sb ? sb : "?",
                        r->opts[i], r->why);
        free(sa);
        free(sb);
    }
    json_decref(was);
    json_decref(now);
    return rc;
}

int dev_feed_write_record(const dev_feed *f, const char *dir, sl_err *err)
{
    return record_write(&data_record, data_json(f), dir, err);
}

int dev_feed_check_record(const dev_feed *f, const char *dir, sl_err *err)
{
    return record_check(&data_record, data_json(f), dir, err);
}

void dev_optim_for_run(dev_optim *o, int kind, double lr, double wd, double clip, int steps,
                       int warmup)
{
    dev_optim_default(o);
    o->kind = kind;
    o->lr = (float)(lr >= 0 ? lr : kind == DEV_OPT_LAMB ? 1e-3 : 1e-4);
    o->wd = (float)wd;
    o->clip = (float)clip;
    o->total = steps;
    o->warmup = warmup >= 0 ? warmup : steps / 10;
}

/* ---- --stages ------------------------------------------------------------ */

static const char *units_of(char *buf, size_t n, int a, int b)
{
    if (a == b)
        snprintf(buf, n, "unit %d", a);
    else
        snprintf(buf, n, "units %d-%d", a, b);
    return buf;
}

static int parse_uint(const char **p, int *out)
{
    if (!isdigit((unsigned char)**p))
        return -1;
    long v = 0;
    while (isdigit((unsigned char)**p)) {
        v = v * 10 + (**p - '0');
        if (v > 1000000)
            return -1;
        (*p)++;
    }
    *out = (int)v;
    return 0;
}

int dev_stages_parse(const char *spec, int n_units, int *bounds, int max, int *n, sl_err *err)
{
    const char *p = spec;
    int count;
    if (parse_uint(&p, &count) == 0 && *p == 0) {
        if (count < 1)
            return sl_err_set(err, SL_EINVAL, "--stages %s: at least one stage", spec);
        if (count > n_units || count > max)
            return sl_err_set(err, SL_EINVAL, "--stages %s: the model has %d units, so at most "
                              "%d stages", spec, n_units, n_units < max ? n_units : max);
        *n = bal_even_cuts(n_units, count, bounds);
        return 0;
    }
    int k = 0, next = 0;
    p = spec;
    for (;;) {
        const char *start = p;
        int a, b;
        if (parse_uint(&p, &a) || *p != '-' || (p++, parse_uint(&p, &b)) || (*p && *p != ','))
            return sl_err_set(err, SL_EINVAL, "--stages %s: '%.*s' is not a count or a range "
                              "FIRST-LAST of units", spec, (int)strcspn(start, ","), start);
        if (b < a)
            return sl_err_set(err, SL_EINVAL, "--stages %s: range %d-%d ends before it starts",
                              spec, a, b);
        if (b >= n_units)
            return sl_err_set(err, SL_EINVAL, "--stages %s: range %d-%d is out of range (units "
                              "0..%d: 0 the embeddings, 1..%d the layers, %d the head)", spec, a,
                              b, n_units - 1, n_units - 2, n_units - 1);
        char r[48];
        if (a > next)
            return sl_err_set(err, SL_EINVAL, "--stages %s: %s left out", spec,
                              units_of(r, sizeof r, next, a - 1));
        if (a < next)
            return sl_err_set(err, SL_EINVAL, "--stages %s: range %d-%d overlaps the one before "
                              "(units are in order, each in one stage)", spec, a, b);
        if (k >= max)
            return sl_err_set(err, SL_EINVAL, "--stages %s: more than %d stages", spec, max);
        bounds[k++] = a;
        next = b + 1;
        if (!*p)
            break;
        p++;
    }
    char r[48];
    if (next != n_units)
        return sl_err_set(err, SL_EINVAL, "--stages %s: %s left out (the model has units 0..%d)",
                          spec, units_of(r, sizeof r, next, n_units - 1), n_units - 1);
    bounds[k] = n_units;
    *n = k;
    return 0;
}

/* ---- checkpoints of a run ------------------------------------------------ */

/* The run's optimizer and learning-rate schedule (--steps before --warmup,
 * whose default follows it). */
static const char *const sched_keys[] = {"optimizer", "lr", "steps", "warmup", "weight_decay",
                                         "clip"};
static const char *const sched_opts[] = {"--optimizer", "--lr", "--steps", "--warmup",
                                         "--weight-decay", "--clip"};
static const run_record schedule_record = {
    "schedule.json", sched_keys, sched_opts, 6, "had",
    "the learning rate would change mid-run; pass the same value, or --new-schedule to continue "
    "under this run's schedule",
    "this run keeps the original's learning-rate schedule"};

/* A float as the double of its shortest decimal that reads back as it: the
 * file and the messages then say 0.0001, not 9.99999975e-05. */
static double short_real(float x)
{
    char buf[32];
    int digits = 1;
    for (; digits < 9; digits++) { /* 9 digits always read back as the float */
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x)
            break;
    }
    snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
    return strtod(buf, NULL);
}

static json_t *schedule_json(const dev_optim *o)
{
    return json_pack("{s:s, s:f, s:i, s:i, s:f, s:f}", "optimizer",
                     o->kind == DEV_OPT_LAMB ? "lamb" : "adamw", "lr", short_real(o->lr),
                     "steps", o->total, "warmup", o->warmup, "weight_decay", short_real(o->wd),
                     "clip", short_real(o->clip));
}

int dev_run_save(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *root, int step,
                 char *out, size_t outn, sl_err *err)
{
    char sub[64];
    snprintf(sub, sizeof sub, "step-%d", step);
    snprintf(out, outn, "%s/%s", root, sub);
    int n = dev_train_nstages(tr);
    dev_stage *st[512];
    if (n > 512)
        return sl_err_set(err, SL_EINVAL, "%d stages: at most 512 save together", n);
    for (int i = 0; i < n; i++)
        st[i] = dev_train_stage(tr, i);
    const char *const extra[] = {data_record.name, schedule_record.name};
    if (sl_mkdir(root, 0755, err) || sl_mkdir(out, 0755, err) ||
        dev_feed_write_record(f, out, err) ||
        record_write(&schedule_record, schedule_json(o), out, err) ||
        dev_ckpt_save(st, n, o->kind, out, extra, 2, err))
        return -1;
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", root);
    size_t len = strlen(sub);
    sub[len] = '\n';
    return sl_write_file_atomic(latest, sub, len + 1, err);
}

int dev_run_resume(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *dir,
                   int new_schedule, sl_err *err)
{
    if (dev_feed_check_record(f, dir, err))
        return -1;
    if (!new_schedule && record_check(&schedule_record, schedule_json(o), dir, err))
        return -1;
    for (int i = 0; i < dev_train_nstages(tr); i++)
        if (dev_ckpt_load(dev_train_stage(tr, i), o->kind, dir, err))
            return sl_err_wrap(err, "stage %d", i);
    return 0;
}
