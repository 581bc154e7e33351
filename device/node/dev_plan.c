/* dev_plan.c - the plan of one epoch of a job as a device reads it (dev_plan.h). */
#include "dev_plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cert.h"
#include "dev_codec.h"
#include "dev_fed.h"
#include "dev_model.h"
#include "dev_stage.h"
#include "sl_mem.h"

/* The field `key` of o (its path `at` + key in messages). */
static const json_t *field(const json_t *o, const char *at, const char *key, sl_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v)
        sl_err_set(err, SL_ECORRUPT, "plan: %s%s: missing", at, key);
    return v;
}

static int get_int(const json_t *o, const char *at, const char *key, long long lo, long long hi,
                   long long *out, sl_err *err)
{
    const json_t *v = field(o, at, key, err);
    if (!v)
        return -1;
    if (!json_is_integer(v))
        return sl_err_set(err, SL_ECORRUPT, "plan: %s%s: not an integer", at, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return sl_err_set(err, SL_ECORRUPT, "plan: %s%s: %lld is not in %lld..%lld", at, key, x,
                          lo, hi);
    *out = x;
    return 0;
}

/* get_int into an int (lo and hi within int). */
static int get_i(const json_t *o, const char *at, const char *key, long long lo, long long hi,
                 int *out, sl_err *err)
{
    long long x;
    if (get_int(o, at, key, lo, hi, &x, err))
        return -1;
    *out = (int)x;
    return 0;
}

static int get_num(const json_t *o, const char *at, const char *key, double *out, sl_err *err)
{
    const json_t *v = field(o, at, key, err);
    if (!v)
        return -1;
    if (!json_is_number(v))
        return sl_err_set(err, SL_ECORRUPT, "plan: %s%s: not a number", at, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(const json_t *o, const char *at, const char *key, int *out, sl_err *err)
{
    const json_t *v = field(o, at, key, err);
    if (!v)
        return -1;
    if (!json_is_boolean(v))
        return sl_err_set(err, SL_ECORRUPT, "plan: %s%s: not true or false", at, key);
    *out = json_is_true(v);
    return 0;
}

static const char *get_str(const json_t *o, const char *at, const char *key, sl_err *err)
{
    const json_t *v = field(o, at, key, err);
    if (v && !json_is_string(v)) {
        sl_err_set(err, SL_ECORRUPT, "plan: %s%s: not a string", at, key);
        return NULL;
    }
    return v ? json_string_value(v) : NULL;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 64 hex digits into 32 bytes. */
static int hex_key(const char *s, uint8_t out[32])
{
    if (strlen(s) != 64)
        return -1;
    for (int i = 0; i < 32; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* Where a device serves Stage: 1..255 printable ASCII bytes, no space. */
static int address_ok(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return 0;
    return n >= 1 && n <= 255;
}

int dev_plan_codec(const char *s, int grad, double *frac)
{
    *frac = 0;
    if (grad && !strncmp(s, "topk:", 5)) {
        char *end;
        double f = strtod(s + 5, &end);
        if (end == s + 5 || *end || !(f > 0 && f <= 1))
            return -1;
        *frac = f;
        return DEV_CODEC_TOPK;
    }
    int c = dev_codec_parse(s);
    return c == DEV_CODEC_TOPK ? -1 : c;
}

static int read_config(const json_t *pl, dev_config *c, sl_err *err)
{
    const json_t *v = field(pl, "", "config", err);
    if (!v)
        return -1;
    if (!json_is_object(v))
        return sl_err_set(err, SL_ECORRUPT, "plan: config: not an object");
    char *text = json_dumps(v, JSON_COMPACT);
    int rc = text ? dev_config_parse(c, text, err)
                  : sl_err_set(err, SL_ENOMEM, "plan: config: cannot write it out");
    free(text);
    return rc ? sl_err_wrap(err, "plan") : 0;
}

static int read_numbers(const json_t *pl, dev_plan *p, sl_err *err)
{
    long long num;
    const char *job = get_str(pl, "", "job", err);
    if (!job || get_int(pl, "", "job_num", 0, LLONG_MAX, &num, err))
        return -1;
    p->job_num = (uint64_t)num;
    snprintf(p->job, sizeof p->job, "j%016llx", (unsigned long long)num);
    if (strcmp(job, p->job))
        return sl_err_set(err, SL_ECORRUPT, "plan: job: '%.40s' is not job_num's id %s", job, p->job);
    long long epoch;
    if (get_int(pl, "", "epoch", 1, UINT32_MAX, &epoch, err) ||
        get_i(pl, "", "batch", 1, DEV_PLAN_MAX_BATCH, &p->batch, err) ||
        get_i(pl, "", "micro_batches", 1, p->batch, &p->micro_batches, err))
        return -1;
    p->epoch = (uint32_t)epoch;
    if (p->batch % p->micro_batches)
        return sl_err_set(err, SL_ECORRUPT, "plan: micro_batches: %d does not divide the batch %d",
                          p->micro_batches, p->batch);
    if (get_i(pl, "", "seq", 1, p->config.max_pos, &p->seq, err) ||
        get_i(pl, "", "steps", 1, DEV_PLAN_MAX_STEPS, &p->steps, err) ||
        get_i(pl, "", "start_step", 1, p->steps, &p->start_step, err) ||
        get_i(pl, "", "checkpoint_every", 0, INT_MAX, &p->checkpoint_every, err))
        return -1;
    return 0;
}

static int read_wire(const json_t *pl, dev_plan *p, sl_err *err)
{
    double frac;
    const char *ca = get_str(pl, "", "codec_act", err);
    if (!ca)
        return -1;
    if ((p->codec_act = dev_plan_codec(ca, 0, &frac)) < 0)
        return sl_err_set(err, SL_ECORRUPT, "plan: codec_act: '%.40s' is not none, fp16, bf16 or "
                          "int8", ca);
    const char *cg = get_str(pl, "", "codec_grad", err);
    if (!cg)
        return -1;
    if ((p->codec_grad = dev_plan_codec(cg, 1, &p->topk)) < 0)
        return sl_err_set(err, SL_ECORRUPT, "plan: codec_grad: '%.40s' is not none, fp16, bf16, "
                          "int8 or topk:F (0 < F <= 1)", cg);
    if (get_bool(pl, "", "sealed", &p->sealed, err))
        return -1;
    const char *sched = get_str(pl, "", "schedule", err);
    if (!sched)
        return -1;
    if ((p->schedule = bal_schedule_parse(sched)) < 0)
        return sl_err_set(err, SL_ECORRUPT, "plan: schedule: '%.40s' is not 1f1b or gpipe", sched);
    return 0;
}

static int read_options(const json_t *pl, dev_plan_options *o, sl_err *err)
{
    const json_t *v = field(pl, "", "options", err);
    if (!v)
        return -1;
    if (!json_is_object(v))
        return sl_err_set(err, SL_ECORRUPT, "plan: options: not an object");
    const char *at = "options.";
    const char *opt = get_str(v, at, "optimizer", err);
    if (!opt)
        return -1;
    if (strcmp(opt, "adamw") && strcmp(opt, "lamb"))
        return sl_err_set(err, SL_ECORRUPT, "plan: options.optimizer: '%.40s' is not adamw or lamb",
                          opt);
    o->optimizer = !strcmp(opt, "lamb") ? DEV_OPT_LAMB : DEV_OPT_ADAMW;
    const char *os = get_str(v, at, "optim_state", err);
    if (!os)
        return -1;
    if (strcmp(os, "fp32") && strcmp(os, "bf16"))
        return sl_err_set(err, SL_ECORRUPT, "plan: options.optim_state: '%.40s' is not fp32 or "
                          "bf16", os);
    o->bf16_state = !strcmp(os, "bf16");
    if (o->bf16_state && o->optimizer != DEV_OPT_ADAMW)
        return sl_err_set(err, SL_ECORRUPT, "plan: options.optim_state: bf16 is for adamw only");
    long long seed;
    if (get_num(v, at, "lr", &o->lr, err) || get_num(v, at, "weight_decay", &o->weight_decay, err) ||
        get_num(v, at, "clip", &o->clip, err) || get_i(v, at, "warmup", -1, INT_MAX, &o->warmup, err) ||
        get_int(v, at, "seed", LLONG_MIN, LLONG_MAX, &seed, err) ||
        get_bool(v, at, "recompute", &o->recompute, err) ||
        get_bool(v, at, "recompute_attention", &o->recompute_attention, err))
        return -1;
    o->seed = (uint64_t)seed;
    /* precision: optional, a plan without it is fp32 */
    if (json_object_get(v, "precision")) {
        const char *pr = get_str(v, at, "precision", err);
        if (!pr)
            return -1;
        int f = dev_precision_flags(pr);
        if (f < 0)
            return sl_err_set(err, SL_ECORRUPT, "plan: options.precision: '%.40s' is not fp32 or "
                              "bf16", pr);
        o->bf16_compute = f != 0;
    }
    /* the data owner's feed: plans from before these were written read as
     * the defaults */
    long long first = 0, sequences = 0;
    o->shuffle = 1;
    o->mask_prob = 0.15;
    if ((json_object_get(v, "first") && get_int(v, at, "first", 0, LLONG_MAX, &first, err)) ||
        (json_object_get(v, "sequences") && get_int(v, at, "sequences", 0, LLONG_MAX, &sequences, err)) ||
        (json_object_get(v, "shuffle") && get_bool(v, at, "shuffle", &o->shuffle, err)) ||
        (json_object_get(v, "mask_prob") && get_num(v, at, "mask_prob", &o->mask_prob, err)))
        return -1;
    if (!(o->mask_prob > 0 && o->mask_prob < 1))
        return sl_err_set(err, SL_ECORRUPT, "plan: options.mask_prob: %g is not in (0, 1)", o->mask_prob);
    o->first = (uint64_t)first;
    o->sequences = (uint64_t)sequences;
    o->task = DEV_TASK_MLM;
    if (json_object_get(v, "task")) {
        const char *task = get_str(v, at, "task", err);
        if (!task)
            return -1;
        if ((o->task = dev_task_parse(task)) < 0)
            return sl_err_set(err, SL_ECORRUPT, "plan: options.task: '%.40s' is not mlm or "
                              "classify", task);
    }
    return 0;
}

/* The task makes the config's last unit: the config must suit it. */
static int apply_task(dev_plan *p, sl_err *err)
{
    p->config.task = p->options.task;
    if (dev_config_validate(&p->config, err))
        return sl_err_wrap(err, "plan: options.task %s", dev_task_name(p->options.task));
    return 0;
}

/* A dataset's name: 1..64 letters, digits, '.', '_' or '-'. */
static int dataset_name_ok(const char *name)
{
    size_t n = strlen(name);
    int ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
             (name[i] >= '0' && name[i] <= '9') || name[i] == '.' || name[i] == '_' || name[i] == '-';
    return ok;
}

/* The data owner's dataset (owner 0's in a federation). */
static int read_data(const json_t *pl, dev_plan *p, sl_err *err)
{
    const json_t *d = field(pl, "", "data", err);
    if (!d)
        return -1;
    const char *name = get_str(d, "data.", "dataset", err);
    if (!name)
        return -1;
    if (!dataset_name_ok(name))
        return sl_err_set(err, SL_ECORRUPT, "plan: data.dataset: '%.70s' is not a dataset name", name);
    snprintf(p->dataset, sizeof p->dataset, "%s", name);
    return 0;
}

/* A federation's replicas and sync (both or neither), before the stages. */
static int read_replicas(const json_t *pl, dev_plan *p, sl_err *err)
{
    const json_t *reps = json_object_get(pl, "replicas"), *sy = json_object_get(pl, "sync");
    if (!reps && !sy)
        return 0;
    if (!reps || !sy)
        return sl_err_set(err, SL_ECORRUPT, "plan: %s without %s", reps ? "replicas" : "sync",
                          reps ? "sync" : "replicas");
    if (!json_is_array(reps))
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: not an array");
    size_t R = json_array_size(reps);
    if (R < 2 || R > DEV_PLAN_MAX_REPLICAS)
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: %zu, not 2..%d", R,
                          DEV_PLAN_MAX_REPLICAS);
    p->n_replicas = (int)R;
    long long total = 0;
    int first = 0, away = 0, rejoin = 0;
    for (int r = 0; r < p->n_replicas; r++) {
        const json_t *o = json_array_get(reps, (size_t)r);
        char at[32];
        snprintf(at, sizeof at, "replicas[%d].", r);
        if (!json_is_object(o))
            return sl_err_set(err, SL_ECORRUPT, "plan: replicas[%d]: not an object", r);
        dev_plan_replica *rp = &p->replica[r];
        const char *owner = get_str(o, at, "owner", err);
        if (!owner)
            return -1;
        if (!cert_valid_device_id(owner))
            return sl_err_set(err, SL_ECORRUPT, "plan: %sowner: '%.40s' is not a device id", at, owner);
        snprintf(rp->owner, sizeof rp->owner, "%s", owner);
        const char *ds = get_str(o, at, "dataset", err);
        if (!ds)
            return -1;
        if (!dataset_name_ok(ds))
            return sl_err_set(err, SL_ECORRUPT, "plan: %sdataset: '%.70s' is not a dataset name",
                              at, ds);
        snprintf(rp->dataset, sizeof rp->dataset, "%s", ds);
        /* an owner away: its replica has no stage this epoch (outer:H only) */
        if ((json_object_get(o, "away") && get_bool(o, at, "away", &rp->away, err)) ||
            (json_object_get(o, "rejoin") && get_bool(o, at, "rejoin", &rp->rejoin, err)))
            return -1;
        if (rp->away && rp->rejoin)
            return sl_err_set(err, SL_ECORRUPT, "plan: replicas[%d]: away and rejoining at once", r);
        if (get_i(o, at, "batch", p->micro_batches, DEV_PLAN_MAX_BATCH, &rp->batch, err) ||
            get_i(o, at, "first_stage", first, first, &rp->first_stage, err) ||
            get_i(o, at, "stages", rp->away ? 0 : 1, rp->away ? 0 : DEV_PLAN_MAX_STAGES,
                  &rp->n_stages, err))
            return -1;
        away += rp->away;
        rejoin += rp->rejoin;
        if (rp->batch % p->micro_batches)
            return sl_err_set(err, SL_ECORRUPT, "plan: %sbatch: %d is not a multiple of "
                              "micro_batches %d", at, rp->batch, p->micro_batches);
        total += rp->batch;
        first += rp->n_stages;
    }
    if (total != p->batch)
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: their batches add up to %lld, not "
                          "the batch %d", total, p->batch);
    if (!json_is_object(sy))
        return sl_err_set(err, SL_ECORRUPT, "plan: sync: not an object");
    dev_plan_sync *s = &p->sync;
    const char *mode = get_str(sy, "sync.", "mode", err);
    if (!mode)
        return -1;
    if (!strcmp(mode, "step")) {
        s->mode = DEV_SYNC_STEP;
        if (get_i(sy, "sync.", "every", 1, 1, &s->every, err))
            return -1;
    } else if (!strcmp(mode, "outer")) {
        s->mode = DEV_SYNC_OUTER;
        if (get_i(sy, "sync.", "every", 1, p->steps, &s->every, err))
            return -1;
    } else {
        return sl_err_set(err, SL_ECORRUPT, "plan: sync.mode: '%.40s' is not step or outer", mode);
    }
    const char *codec = get_str(sy, "sync.", "codec", err);
    if (!codec)
        return -1;
    if ((s->codec = dev_plan_codec(codec, 1, &s->topk)) < 0)
        return sl_err_set(err, SL_ECORRUPT, "plan: sync.codec: '%.40s' is not none, fp16, bf16, "
                          "int8 or topk:F (0 < F <= 1)", codec);
    if (get_num(sy, "sync.", "outer_lr", &s->outer_lr, err) ||
        get_num(sy, "sync.", "outer_momentum", &s->outer_momentum, err))
        return -1;
    if (!(s->outer_lr > 0 && s->outer_lr <= 10))
        return sl_err_set(err, SL_ECORRUPT, "plan: sync.outer_lr: %g is not in (0, 10]", s->outer_lr);
    if (!(s->outer_momentum >= 0 && s->outer_momentum < 1))
        return sl_err_set(err, SL_ECORRUPT, "plan: sync.outer_momentum: %g is not in [0, 1)",
                          s->outer_momentum);
    if ((away || rejoin) && s->mode != DEV_SYNC_OUTER)
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: one %s under sync step (every step "
                          "needs every replica)", away ? "away" : "rejoining");
    if (away == p->n_replicas)
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: every one is away");
    if (rejoin && (p->start_step < 2 || (p->start_step - 1) % s->every))
        return sl_err_set(err, SL_ECORRUPT, "plan: replicas: one rejoins at step %d, not after an "
                          "outer step (every %d)", p->start_step, s->every);
    return 0;
}

/* The replica stage i is in (the plan's replicas cover 0..n_stages-1). */
static int replica_of(const dev_plan *p, int i)
{
    for (int r = 0; r < p->n_replicas; r++)
        if (i >= p->replica[r].first_stage && i < p->replica[r].first_stage + p->replica[r].n_stages)
            return r;
    return 0;
}

static int read_stage(const json_t *s, int i, dev_plan *p, int next_unit, sl_err *err)
{
    int lead = i == 0 || (p->n_replicas && p->replica[replica_of(p, i)].first_stage == i);
    char at[32];
    snprintf(at, sizeof at, "stages[%d].", i);
    if (!json_is_object(s))
        return sl_err_set(err, SL_ECORRUPT, "plan: stages[%d]: not an object", i);
    dev_plan_stage *st = &p->stage[i];
    int index, head = dev_unit_head(&p->config);
    if (get_i(s, at, "index", i, i, &index, err))
        return -1;
    const char *dev = get_str(s, at, "device", err);
    if (!dev)
        return -1;
    if (!cert_valid_device_id(dev))
        return sl_err_set(err, SL_ECORRUPT, "plan: %sdevice: '%.40s' is not a device id", at, dev);
    snprintf(st->device, sizeof st->device, "%s", dev);
    const char *addr = get_str(s, at, "address", err);
    if (!addr)
        return -1;
    if (!address_ok(addr))
        return sl_err_set(err, SL_ECORRUPT, "plan: %saddress: '%.60s' is not 1 to 255 printable "
                          "characters without spaces", at, addr);
    snprintf(st->address, sizeof st->address, "%s", addr);
    const char *key = get_str(s, at, "link_key", err);
    if (!key)
        return -1;
    if (hex_key(key, st->link_key))
        return sl_err_set(err, SL_ECORRUPT, "plan: %slink_key: not 64 hex digits", at);
    if (get_i(s, at, "first_unit", 0, head, &st->first_unit, err) ||
        get_i(s, at, "last_unit", 0, INT_MAX, &st->last_unit, err))
        return -1;
    if (p->n_replicas) {
        int r = replica_of(p, i);
        if (get_i(s, at, "replica", r, r, &st->replica, err))
            return -1;
        if (lead && strcmp(st->device, p->replica[r].owner))
            return sl_err_set(err, SL_ECORRUPT, "plan: %sdevice: %s, but replica %d's owner is %s",
                              at, st->device, r, p->replica[r].owner);
    }
    if (st->first_unit != next_unit)
        return lead ? sl_err_set(err, SL_ECORRUPT, "plan: %sfirst_unit: %d, not unit 0 (the "
                                 "embeddings)", at, st->first_unit)
                    : sl_err_set(err, SL_ECORRUPT, "plan: %sfirst_unit: %d, but stage %d ends at "
                                 "unit %d", at, st->first_unit, i - 1, next_unit - 1);
    if (st->last_unit < st->first_unit)
        return sl_err_set(err, SL_ECORRUPT, "plan: %slast_unit: %d is before its first unit %d", at,
                          st->last_unit, st->first_unit);
    if (st->last_unit > head)
        return sl_err_set(err, SL_ECORRUPT, "plan: %slast_unit: %d is past the head (unit %d)", at,
                          st->last_unit, head);
    return get_i(s, at, "warmup", 0, p->micro_batches, &st->warmup, err) ||
                   get_i(s, at, "threads", 1, DEV_PLAN_MAX_THREADS, &st->threads, err)
               ? -1
               : 0;
}

static int read_stages(const json_t *pl, const char *self_id, dev_plan *p, sl_err *err)
{
    const json_t *st = field(pl, "", "stages", err);
    if (!st)
        return -1;
    if (!json_is_array(st))
        return sl_err_set(err, SL_ECORRUPT, "plan: stages: not an array");
    size_t n = json_array_size(st);
    int units = dev_unit_count(&p->config), R = p->n_replicas ? p->n_replicas : 1;
    if (n < 1 || n > (size_t)units * (size_t)R)
        return sl_err_set(err, SL_ECORRUPT, "plan: stages: %zu stages for %d units%s", n, units,
                          R > 1 ? " in each replica" : "");
    if (p->n_replicas) {
        const dev_plan_replica *last = &p->replica[R - 1];
        if ((size_t)(last->first_stage + last->n_stages) != n)
            return sl_err_set(err, SL_ECORRUPT, "plan: replicas: their stages are %d, the plan "
                              "has %zu", last->first_stage + last->n_stages, n);
    }
    p->n_stages = (int)n;
    p->stage = sl_xcalloc(n, sizeof *p->stage);
    int next_unit = 0, mine = 0;
    for (int i = 0; i < p->n_stages; i++) {
        int r = replica_of(p, i);
        if (p->n_replicas && i == p->replica[r].first_stage) {
            if (i > 0 && next_unit != units)
                return sl_err_set(err, SL_ECORRUPT, "plan: stages: replica %d ends at unit %d, not "
                                  "at the head (unit %d)", r - 1, next_unit - 1, units - 1);
            next_unit = 0;
        }
        if (read_stage(json_array_get(st, (size_t)i), i, p, next_unit, err))
            return -1;
        next_unit = p->stage[i].last_unit + 1;
        if (!strcmp(p->stage[i].device, self_id)) {
            if (mine > 0 && p->stage[i].replica != p->my_replica)
                return sl_err_set(err, SL_ECORRUPT, "plan: stages[%d]: this device (%.40s) is in "
                                  "replicas %d and %d: a device serves one replica", i, self_id,
                                  p->my_replica, p->stage[i].replica);
            p->my_replica = p->stage[i].replica;
            if (mine < DEV_PLAN_MAX_LOCAL)
                p->local[mine] = i;
            mine++;
        }
    }
    if (next_unit != units)
        return sl_err_set(err, SL_ECORRUPT, "plan: stages: the last stage ends at unit %d, not at "
                          "the head (unit %d)", next_unit - 1, units - 1);
    if (mine == 0)
        return sl_err_set(err, SL_ECORRUPT, "plan: stages: none is this device's (%.40s)", self_id);
    if (mine > DEV_PLAN_MAX_LOCAL)
        return sl_err_set(err, SL_ECORRUPT, "plan: stages: %d are this device's, more than %d",
                          mine, DEV_PLAN_MAX_LOCAL);
    p->n_local = mine;
    if (p->n_replicas)
        snprintf(p->dataset, sizeof p->dataset, "%s", p->replica[p->my_replica].dataset);
    return 0;
}

int dev_plan_from_json(const json_t *pl, const char *self_id, dev_plan *p, sl_err *err)
{
    memset(p, 0, sizeof *p);
    int rc;
    if (!json_is_object(pl))
        rc = sl_err_set(err, SL_ECORRUPT, "plan: not a JSON object");
    else
        rc = read_config(pl, &p->config, err) || read_numbers(pl, p, err) ||
                     read_wire(pl, p, err) || read_options(pl, &p->options, err) ||
                     apply_task(p, err) || read_data(pl, p, err) || read_replicas(pl, p, err) ||
                     read_stages(pl, self_id ? self_id : "", p, err)
                 ? -1
                 : 0;
    if (rc)
        dev_plan_free(p);
    return rc;
}

int dev_plan_parse(const char *text, size_t len, const char *self_id, dev_plan *p, sl_err *err)
{
    json_error_t je;
    json_t *pl = json_loadb(text, len, 0, &je);
    if (!pl) {
        memset(p, 0, sizeof *p);
        return sl_err_set(err, SL_ECORRUPT, "plan: not JSON: line %d: %s", je.line, je.text);
    }
    int rc = dev_plan_from_json(pl, self_id, p, err);
    json_decref(pl);
    return rc;
}

void dev_plan_free(dev_plan *p)
{
    free(p->stage);
    memset(p, 0, sizeof *p);
}

dev_policy dev_policy_default(void)
{
    return (dev_policy){.home_layers = DEV_POLICY_HOME_LAYERS};
}

int dev_policy_check_options(const dev_policy *pol, int sealed, int u_shape, sl_err *err)
{
    if (!sealed && !pol->allow_unsealed)
        return sl_err_set(err, SL_EAUTH, "this data owner's policy: frames to other devices are "
                          "sealed (the job is --no-seal; the owner's device lifts this with "
                          "--allow-unsealed)");
    if (!u_shape && !pol->allow_labels_out)
        return sl_err_set(err, SL_EAUTH, "this data owner's policy: its labels and the tied "
                          "embedding's gradient stay at home, the head on its device (the job is "
                          "--no-u-shape; the owner's device lifts this with --allow-labels-out)");
    return 0;
}

int dev_policy_check_plan(const dev_policy *pol, const dev_plan *p, const char *self_id, sl_err *err)
{
    /* the chain whose data this device owns: its replica's, or the plan's */
    int lo = 0, hi = p->n_stages - 1;
    if (p->n_replicas) {
        lo = p->replica[p->my_replica].first_stage;
        hi = lo + p->replica[p->my_replica].n_stages - 1;
    }
    if (p->n_stages < 1 || strcmp(p->stage[lo].device, self_id))
        return 0;
    int others = 0;
    for (int i = lo; i <= hi; i++)
        others |= strcmp(p->stage[i].device, self_id) != 0;
    const dev_plan_stage *last = &p->stage[hi];
    if (dev_policy_check_options(pol, p->sealed || !others, !strcmp(last->device, self_id), err))
        return -1;
    /* units 0..home, the embeddings and that many encoder layers, on this device */
    int home = pol->home_layers < p->config.layers ? pol->home_layers : p->config.layers;
    for (int i = lo; i <= hi && p->stage[i].first_unit <= home; i++)
        if (strcmp(p->stage[i].device, self_id))
            return sl_err_set(err, SL_EAUTH, "this data owner's policy: the embeddings and %d "
                              "encoder layer%s stay at home, but the plan runs unit %d on %.40s "
                              "(the owner's device lowers this with --home-layers)", home,
                              home == 1 ? "" : "s", p->stage[i].first_unit, p->stage[i].device);
    return 0;
}
