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
#include "dev_cls.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"

struct dev_feed {
    dev_shard *shard;
    dev_special sp;
    dev_order ord;
    dev_feed_opts o;
    int vocab, T;
    int classify; /* each sequence with its class, unmasked (task classify) */
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
    f->classify = c->task == DEV_TASK_CLASSIFY;
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
const dev_labels *dev_feed_labels(const dev_feed *f) { return dev_shard_labels(f->shard); }
const dev_order *dev_feed_order(const dev_feed *f) { return &f->ord; }

int dev_feed_batch(dev_feed *f, int step, dev_batch *b, sl_err *err)
{
    if (step < 1)
        return sl_err_set(err, SL_EINVAL, "step %d: steps count from 1", step);
    uint64_t seq0 = (uint64_t)(step - 1) * (uint64_t)f->o.batch;
    for (int r = 0; r < f->o.batch; r++)
        f->rows[r] = dev_order_seq(&f->ord, seq0 + (uint64_t)r, &f->epochs[r]);
    if (f->classify ? dev_cls_make_rows(f->shard, f->rows, &f->mb, err)
                    : dev_mlm_make_rows(f->shard, &f->sp, f->vocab, f->o.mask_prob, f->o.seed,
                                        f->rows, f->epochs, &f->mb, err))
        return -1;
    *b = dev_batch_of(&f->mb);
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
/* A federation's owners: owner r's record is data.json (r = 0) or
 * data.replica-R.json, its batch set by --owner-batch. */
static const char *const owner_opts[] = {"--data: another shard for this owner", "--first",
                                         "--sequences", "--no-shuffle", "--seed", "--owner-batch"};

static run_record owner_record(int r, int owners, char *name, size_t n)
{
    run_record rec = data_record;
    if (owners > 1) {
        rec.opts = owner_opts;
        if (r > 0) {
            snprintf(name, n, "data.replica-%d.json", r);
            rec.name = name;
        }
    }
    return rec;
}

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

/* ---- a federation's record and state (docs/federation.md) -------------- */

static const char *const fed_keys[] = {"replicas", "owner_batch", "sync", "codec_sync",
                                       "outer_lr", "outer_momentum"};
static const char *const fed_opts[] = {"--data: the number of owners", "--owner-batch", "--sync",
                                       "--codec-sync", "--outer-lr", "--outer-momentum"};
static const run_record fed_record = {
    "fed.json", fed_keys, fed_opts, 6, "had",
    "the replicas would meet otherwise than in the original run; pass the same options",
    "this run is the federation the original was"};

#define FED_PART "fed.safetensors"

static json_t *fed_json(const dev_fed_cfg *c, const dev_feed *const *f, int nf)
{
    char sync[32], codec[32];
    dev_fed_sync_name(c, sync, sizeof sync);
    dev_fed_codec_name(c, codec, sizeof codec);
    json_t *b = json_array();
    for (int r = 0; r < nf; r++)
        json_array_append_new(b, json_integer(f[r]->o.batch));
    return json_pack("{s:i, s:o, s:s, s:s, s:f, s:f}", "replicas", nf, "owner_batch", b, "sync",
                     sync, "codec_sync", codec, "outer_lr", short_real(c->outer_lr),
                     "outer_momentum", short_real(c->outer_momentum));
}

int dev_run_fed_extras(dev_stage *st, dev_fed *f, int r, int save, char prefix[32],
                       dev_ckpt_extra x[DEV_RUN_FED_EXTRAS], const char **pprefix)
{
    const dev_fed_cfg *c = dev_fed_config(f);
    int n = 0, outer = c->mode == DEV_SYNC_OUTER;
    snprintf(prefix, 32, "replica.%d.", r);
    *pprefix = outer && r > 0 ? prefix : NULL;
    if (save && outer && r > 0) {
        size_t np;
        float *mv = dev_stage_optim_state(st, &np);
        x[n++] = (dev_ckpt_extra){st, prefix, "", dev_stage_params(st, NULL)};
        x[n++] = (dev_ckpt_extra){st, prefix, ".exp_avg", mv};
        x[n++] = (dev_ckpt_extra){st, prefix, ".exp_avg_sq", mv + np};
    }
    /* theta_outer and v are the same in every replica: replica 0's are saved */
    if (outer && (!save || r == 0)) {
        x[n++] = (dev_ckpt_extra){st, "outer.", "", dev_fed_outer_params(f)};
        x[n++] = (dev_ckpt_extra){st, "outer.", ".momentum", dev_fed_momentum(f)};
    }
    if (dev_fed_residual(f))
        x[n++] = (dev_ckpt_extra){st, prefix, ".residual", dev_fed_residual(f)};
    return n;
}

/* DIR/fed.safetensors: every replica's state but replica 0's model. */
static int fed_save(dev_train *tr, const char *dir, int step, sl_err *err)
{
    int R = dev_train_replicas(tr), total = 0;
    for (int r = 0; r < R; r++)
        total += dev_train_replica_nstages(tr, r);
    dev_ckpt_extra *x = sl_xcalloc((size_t)total * DEV_RUN_FED_EXTRAS + 1, sizeof *x);
    char (*prefix)[32] = sl_xcalloc((size_t)total + 1, sizeof *prefix);
    int n = 0, k = 0, rc = 0;
    for (int r = 0; r < R && !rc; r++)
        for (int i = 0; i < dev_train_replica_nstages(tr, r) && !rc; i++, k++) {
            const char *pp;
            dev_stage *st = dev_train_replica_stage(tr, r, i);
            rc = dev_stage_pull(st, err);
            n += dev_run_fed_extras(st, dev_pipe_fed(dev_train_replica_pipe(tr, r, i)), r, 1,
                                    prefix[k], x + n, &pp);
        }
    dev_ckpt_file file;
    if (!rc)
        rc = dev_ckpt_write_extra(dir, FED_PART, x, n, step, &file, err);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < dev_train_replica_nstages(tr, r); i++)
            dev_stage_drop_views(dev_train_replica_stage(tr, r, i));
    free(prefix);
    free(x);
    return rc;
}

int dev_run_save_feeds(dev_train *tr, const dev_optim *o, const dev_feed *const *f, int nf,
                       const char *root, int step, char *out, size_t outn, sl_err *err)
{
    char sub[64];
    snprintf(sub, sizeof sub, "step-%d", step);
    snprintf(out, outn, "%s/%s", root, sub);
    int n = dev_train_nstages(tr);
    dev_stage *st[512];
    if (n > 512)
        return sl_err_set(err, SL_EINVAL, "%d stages: at most 512 save together", n);
    if (nf != dev_train_replicas(tr))
        return sl_err_set(err, SL_EINVAL, "%d feeds for %d replicas", nf, dev_train_replicas(tr));
    for (int i = 0; i < n; i++)
        st[i] = dev_train_stage(tr, i);
    char names[DEV_SYNC_MAX_REPLICAS][40];
    const char *extra[DEV_SYNC_MAX_REPLICAS + 4];
    int nx = 0;
    if (sl_mkdir(root, 0755, err) || sl_mkdir(out, 0755, err))
        return -1;
    for (int r = 0; r < nf; r++) {
        run_record rec = owner_record(r, nf, names[r], sizeof names[r]);
        if (record_write(&rec, data_json(f[r]), out, err))
            return -1;
        extra[nx++] = rec.name;
    }
    extra[nx++] = schedule_record.name;
    if (record_write(&schedule_record, schedule_json(o), out, err))
        return -1;
    const dev_fed_cfg *fc = dev_train_fed(tr);
    if (fc) {
        extra[nx++] = fed_record.name;
        extra[nx++] = FED_PART;
        if (record_write(&fed_record, fed_json(fc, f, nf), out, err) ||
            fed_save(tr, out, dev_stage_get_step(st[0]), err))
            return -1;
    }
    if (dev_ckpt_save(st, n, o->kind, out, extra, nx, err))
        return -1;
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", root);
    size_t len = strlen(sub);
    sub[len] = '\n';
    return sl_write_file_atomic(latest, sub, len + 1, err);
}

int dev_run_save(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *root, int step,
                 char *out, size_t outn, sl_err *err)
{
    return dev_run_save_feeds(tr, o, &f, 1, root, step, out, outn, err);
}

int dev_run_resume_feeds(dev_train *tr, const dev_optim *o, const dev_feed *const *f, int nf,
                         const char *dir, int new_schedule, sl_err *err)
{
    if (nf != dev_train_replicas(tr))
        return sl_err_set(err, SL_EINVAL, "%d feeds for %d replicas", nf, dev_train_replicas(tr));
    const dev_fed_cfg *fc = dev_train_fed(tr);
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/%s", dir, fed_record.name);
    int was_fed = access(path, F_OK) == 0;
    if (was_fed != (fc != NULL))
        return sl_err_set(err, SL_EINVAL, was_fed
                          ? "resuming %s: its run was a federation (fed.json); pass its --data, "
                            "--owner-batch and --sync (or start from its model with --init)"
                          : "resuming %s: its run was not a federation (no fed.json): start from "
                            "its model with --init instead", dir);
    for (int r = 0; r < nf; r++) {
        char name[40];
        run_record rec = owner_record(r, nf, name, sizeof name);
        if (record_check(&rec, data_json(f[r]), dir, err))
            return -1;
    }
    if (!new_schedule && record_check(&schedule_record, schedule_json(o), dir, err))
        return -1;
    if (fc && record_check(&fed_record, fed_json(fc, f, nf), dir, err))
        return -1;
    for (int r = 0; r < nf; r++)
        for (int i = 0; i < dev_train_replica_nstages(tr, r); i++) {
            dev_stage *st = dev_train_replica_stage(tr, r, i);
            char prefix[32];
            dev_ckpt_extra x[DEV_RUN_FED_EXTRAS];
            const char *pp = NULL;
            dev_fed *fd = fc ? dev_pipe_fed(dev_train_replica_pipe(tr, r, i)) : NULL;
            int nx = fd ? dev_run_fed_extras(st, fd, r, 0, prefix, x, &pp) : 0;
            if (dev_ckpt_load_replica(st, o->kind, dir, pp, x, nx, 0, err))
                return nf > 1 ? sl_err_wrap(err, "replica %d stage %d", r, i)
                              : sl_err_wrap(err, "stage %d", i);
            if (fc)
                dev_fed_set_ready(dev_pipe_fed(dev_train_replica_pipe(tr, r, i)));
        }
    return 0;
}

int dev_run_resume(dev_train *tr, const dev_optim *o, const dev_feed *f, const char *dir,
                   int new_schedule, sl_err *err)
{
    return dev_run_resume_feeds(tr, o, &f, 1, dir, new_schedule, err);
}
