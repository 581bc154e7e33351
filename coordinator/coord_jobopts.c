/* coord_jobopts.c - a job's options from and to JSON (coord_jobopts.h). */
#include "coord_jobopts.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "cert.h"
#include "sl_mem.h"

_Static_assert(COORD_DEV_ID_LEN == CERT_ID_LEN, "device ids as the PKI makes them");

/* The defaults, and the type each option must have. */
static json_t *defaults(void)
{
    return json_pack(
        "{s:i, s:i, s:s, s:s, s:b, s:s, s:s, s:i, s:f, s:i, s:I, s:s, s:s, s:f, s:f, s:f, s:I, "
        "s:I, s:b, s:b, s:b, s:b, s:f, s:s, s:[], s:s, s:s, s:f, s:f, s:s, s:s, s:s}",
        "batch", 8, "micro_batches", 1, "codec_act", "none", "codec_grad", "none", "sealed", 1,
        "algo", "optimal", "schedule", "1f1b", "checkpoint_every", 50, "lr", -1.0, "warmup", -1,
        "seed", (json_int_t)1, "optimizer", "adamw", "optim_state", "fp32", "weight_decay", 0.01,
        "clip", 1.0, "mask_prob", 0.15, "first", (json_int_t)0, "sequences", (json_int_t)0,
        "shuffle", 1, "recompute", 0, "recompute_attention", 0, "u_shape", 1, "replan_margin", 0.10,
        "precision", "fp32", "owner_batch", "sync", "step", "codec_sync", "none", "outer_lr", 0.7,
        "outer_momentum", 0.5, "task", "mlm", "vocab_hash", "", "placement", "balanced");
}

static int codec_ok(const char *s, int grad)
{
    if (!strcmp(s, "none") || !strcmp(s, "fp16") || !strcmp(s, "bf16") || !strcmp(s, "int8"))
        return 1;
    if (grad && !strncmp(s, "topk:", 5)) {
        char *end;
        double f = strtod(s + 5, &end);
        return *end == 0 && f > 0 && f <= 1;
    }
    return 0;
}

static int fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* The defaults overlaid with the options given, each of its default's type
 * (a number for a number). */
static json_t *merged(const char *text, char *why, size_t cap)
{
    json_error_t je;
    json_t *in = json_loads(text && *text ? text : "{}", 0, &je);
    if (!in || !json_is_object(in)) {
        fail(why, cap, "options: not a JSON object (%s)", je.text);
        json_decref(in);
        return NULL;
    }
    json_t *o = defaults();
    const char *key;
    json_t *v;
    json_object_foreach(in, key, v) {
        if (!strcmp(key, "steps") || !strcmp(key, "devices")) {
            json_object_set(o, key, v);
            continue;
        }
        json_t *def = json_object_get(o, key);
        int same = def && (json_typeof(def) == json_typeof(v) ||
                           (json_is_number(def) && json_is_number(v)) ||
                           (json_is_boolean(def) && json_is_boolean(v)));
        if (!same) {
            fail(why, cap, "options: '%.60s' is %s", key, def ? "of the wrong type" : "not an option");
            json_decref(in);
            json_decref(o);
            return NULL;
        }
        if (json_is_integer(def) && json_is_real(v) &&
            (fabs(json_real_value(v)) > 9e15 ||
             json_real_value(v) != (double)(json_int_t)json_real_value(v))) {
            fail(why, cap, "options: '%.60s' must be a whole number", key);
            json_decref(in);
            json_decref(o);
            return NULL;
        }
        if (json_is_real(def) && json_is_integer(v))
            json_object_set_new(o, key, json_real((double)json_integer_value(v)));
        else if (json_is_integer(def) && json_is_real(v))
            json_object_set_new(o, key, json_integer((json_int_t)json_real_value(v)));
        else
            json_object_set(o, key, v);
    }
    json_decref(in);
    return o;
}

static json_int_t iget(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }
static double rget(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *sget(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static int bget(const json_t *o, const char *k) { return json_is_true(json_object_get(o, k)); }

/* "step": 0; "outer:H": H; anything else -1. */
static int sync_every(const char *s)
{
    if (!strcmp(s, "step"))
        return 0;
    if (strncmp(s, "outer:", 6) || !(s[6] >= '1' && s[6] <= '9'))
        return -1;
    char *end;
    long h = strtol(s + 6, &end, 10);
    return *end || h < 1 || h > 1000000000 ? -1 : (int)h;
}

static int check(const json_t *o, char *why, size_t cap)
{
    json_int_t steps = iget(o, "steps"), batch = iget(o, "batch"), micro = iget(o, "micro_batches");
    const char *ca = sget(o, "codec_act"), *cg = sget(o, "codec_grad");
    const char *opt = sget(o, "optimizer"), *os = sget(o, "optim_state");
    if (!json_is_integer(json_object_get(o, "steps")) || steps < 1 || steps > 1000000000)
        return fail(why, cap, "options: steps must be 1..1e9");
    json_t *obs = json_object_get(o, "owner_batch"), *ox;
    size_t ok_;
    json_array_foreach(obs, ok_, ox) if (json_is_integer(ox) && micro >= 1 &&
                                         json_integer_value(ox) % micro)
        return fail(why, cap, "options: owner_batch %lld is not a multiple of micro_batches %lld",
                    (long long)json_integer_value(ox), (long long)micro);
    if (batch < 1 || batch > 65536 || micro < 1 || micro > batch || batch % micro)
        return fail(why, cap, "options: batch %lld is not a multiple of micro_batches %lld",
                    (long long)batch, (long long)micro);
    if (!codec_ok(ca, 0))
        return fail(why, cap, "options: codec_act '%.40s' is not a codec for activations (none, "
                    "fp16, bf16, int8)", ca);
    if (!codec_ok(cg, 1))
        return fail(why, cap, "options: codec_grad '%.40s' is not a codec for gradients (none, "
                    "fp16, bf16, int8, topk:F with 0 < F <= 1)", cg);
    if (bal_algo_parse(sget(o, "algo")) < 0)
        return fail(why, cap, "options: algo must be optimal, sky or even");
    if (bal_schedule_parse(sget(o, "schedule")) < 0)
        return fail(why, cap, "options: schedule must be 1f1b or gpipe");
    if ((strcmp(opt, "adamw") && strcmp(opt, "lamb")) || (strcmp(os, "fp32") && strcmp(os, "bf16")) ||
        (!strcmp(os, "bf16") && strcmp(opt, "adamw")))
        return fail(why, cap, "options: optimizer adamw|lamb, optim_state fp32|bf16 (bf16 with "
                    "adamw only)");
    json_t *ob = json_object_get(o, "owner_batch"), *x;
    size_t k;
    int ob_ok = json_array_size(ob) <= 8;
    json_array_foreach(ob, k, x) ob_ok &= json_is_integer(x) && json_integer_value(x) >= 1 &&
                                          json_integer_value(x) <= 65536;
    if (!ob_ok)
        return fail(why, cap, "options: owner_batch must be a list of at most 8 whole numbers, "
                    "each 1..65536");
    if (sync_every(sget(o, "sync")) < 0)
        return fail(why, cap, "options: sync '%.40s' is not step or outer:H (H a whole number >= 1)",
                    sget(o, "sync"));
    if (!codec_ok(sget(o, "codec_sync"), 1))
        return fail(why, cap, "options: codec_sync '%.40s' is not none, fp16, bf16, int8 or topk:F "
                    "with 0 < F <= 1", sget(o, "codec_sync"));
    if (!(rget(o, "outer_lr") > 0 && rget(o, "outer_lr") <= 10) ||
        !(rget(o, "outer_momentum") >= 0 && rget(o, "outer_momentum") < 1))
        return fail(why, cap, "options: outer_lr must be in (0, 10], outer_momentum in [0, 1)");
    if (strcmp(sget(o, "placement"), "balanced") && strcmp(sget(o, "placement"), "equal"))
        return fail(why, cap, "options: placement '%.40s' is not balanced or equal",
                    sget(o, "placement"));
    if (strcmp(sget(o, "precision"), "fp32") && strcmp(sget(o, "precision"), "bf16"))
        return fail(why, cap, "options: precision must be fp32 or bf16");
    if (strcmp(sget(o, "task"), "mlm") && strcmp(sget(o, "task"), "classify"))
        return fail(why, cap, "options: task '%.40s' is not mlm or classify", sget(o, "task"));
    if (iget(o, "warmup") < -1 || iget(o, "warmup") > INT_MAX || iget(o, "checkpoint_every") > INT_MAX)
        return fail(why, cap, "options: warmup must be -1 (10%% of the steps) or more, and warmup "
                    "and checkpoint_every at most %d", INT_MAX);
    if (iget(o, "checkpoint_every") < 0 || iget(o, "first") < 0 || iget(o, "sequences") < 0 ||
        rget(o, "mask_prob") <= 0 || rget(o, "mask_prob") >= 1 || rget(o, "replan_margin") < 0 ||
        rget(o, "replan_margin") >= 1)
        return fail(why, cap, "options: checkpoint_every, first and sequences must not be negative, "
                    "mask_prob and replan_margin in (0, 1) and [0, 1)");
    const char *vh = sget(o, "vocab_hash");
    int hex = strlen(vh) == 64;
    for (size_t k = 0; hex && k < 64; k++)
        hex = (vh[k] >= '0' && vh[k] <= '9') || (vh[k] >= 'a' && vh[k] <= 'f');
    if (*vh && !hex)
        return fail(why, cap, "options: vocab_hash must be 64 lower-case hex digits (a vocabulary's "
                    "BLAKE2b-256, as skyloom data vocab prints it)");
    json_t *devs = json_object_get(o, "devices"), *d;
    size_t i;
    int ok = !devs || (json_is_array(devs) && json_array_size(devs) <= COORD_JOBOPTS_MAX_DEVICES);
    json_array_foreach(devs, i, d) ok &= json_is_string(d) && cert_valid_device_id(json_string_value(d));
    if (!ok)
        return fail(why, cap, "options: devices must be a list of device ids");
    return 0;
}

int coord_jobopts_parse(const char *text, coord_jobopts *o, char *why, size_t cap)
{
    memset(o, 0, sizeof *o);
    json_t *j = merged(text, why, cap);
    if (!j)
        return -1;
    /* a federation's step is its owners' sequences together */
    json_t *ob = json_object_get(j, "owner_batch"), *x;
    size_t k;
    json_int_t sum = 0;
    json_array_foreach(ob, k, x) sum += json_is_integer(x) && json_integer_value(x) > 0 &&
                                        json_integer_value(x) <= 65536 ? json_integer_value(x) : 0;
    if (sum)
        json_object_set_new(j, "batch", json_integer(sum));
    if (check(j, why, cap)) {
        json_decref(j);
        return -1;
    }
    o->steps = (int)iget(j, "steps");
    o->batch = (int)iget(j, "batch");
    o->micro_batches = (int)iget(j, "micro_batches");
    snprintf(o->codec_act, sizeof o->codec_act, "%s", sget(j, "codec_act"));
    snprintf(o->codec_grad, sizeof o->codec_grad, "%s", sget(j, "codec_grad"));
    o->sealed = bget(j, "sealed");
    snprintf(o->algo, sizeof o->algo, "%s", sget(j, "algo"));
    snprintf(o->schedule, sizeof o->schedule, "%s", sget(j, "schedule"));
    o->checkpoint_every = (int)iget(j, "checkpoint_every");
    o->lr = rget(j, "lr");
    o->warmup = (int)iget(j, "warmup");
    o->seed = (int64_t)iget(j, "seed");
    snprintf(o->optimizer, sizeof o->optimizer, "%s", sget(j, "optimizer"));
    snprintf(o->optim_state, sizeof o->optim_state, "%s", sget(j, "optim_state"));
    o->weight_decay = rget(j, "weight_decay");
    o->clip = rget(j, "clip");
    o->mask_prob = rget(j, "mask_prob");
    o->first = (int64_t)iget(j, "first");
    o->sequences = (int64_t)iget(j, "sequences");
    o->shuffle = bget(j, "shuffle");
    o->recompute = bget(j, "recompute");
    o->recompute_attention = bget(j, "recompute_attention");
    o->u_shape = bget(j, "u_shape");
    o->replan_margin = rget(j, "replan_margin");
    snprintf(o->precision, sizeof o->precision, "%s", sget(j, "precision"));
    snprintf(o->task, sizeof o->task, "%s", sget(j, "task"));
    json_array_foreach(ob, k, x) o->owner_batch[o->n_owner_batch++] = (int)json_integer_value(x);
    snprintf(o->sync, sizeof o->sync, "%s", sget(j, "sync"));
    o->sync_every = sync_every(o->sync);
    snprintf(o->codec_sync, sizeof o->codec_sync, "%s", sget(j, "codec_sync"));
    o->outer_lr = rget(j, "outer_lr");
    o->outer_momentum = rget(j, "outer_momentum");
    snprintf(o->vocab_hash, sizeof o->vocab_hash, "%s", sget(j, "vocab_hash"));
    snprintf(o->placement, sizeof o->placement, "%s", sget(j, "placement"));
    json_t *devs = json_object_get(j, "devices"), *d;
    size_t i;
    o->has_devices = devs != NULL;
    o->devices = sl_xcalloc(json_array_size(devs) + 1, sizeof *o->devices);
    json_array_foreach(devs, i, d)
        snprintf(o->devices[o->n_devices++], COORD_DEV_ID_LEN, "%s", json_string_value(d));
    json_decref(j);
    return 0;
}

void coord_jobopts_free(coord_jobopts *o)
{
    free(o->devices);
    memset(o, 0, sizeof *o);
}

int coord_jobopts_copy(coord_jobopts *dst, const coord_jobopts *src)
{
    *dst = *src;
    dst->devices = sl_xcalloc((size_t)src->n_devices + 1, sizeof *dst->devices);
    if (src->n_devices)
        memcpy(dst->devices, src->devices, (size_t)src->n_devices * sizeof *dst->devices);
    return 0;
}

json_t *coord_jobopts_json(const coord_jobopts *o)
{
    json_t *j = json_pack(
        "{s:i, s:i, s:i, s:s, s:s, s:b, s:s, s:s, s:i, s:f, s:i, s:I, s:s, s:s, s:f, s:f, s:f, "
        "s:I, s:I, s:b, s:b, s:b, s:b, s:f, s:s, s:[], s:s, s:s, s:f, s:f, s:s, s:s, s:s}",
        "steps", o->steps, "batch", o->batch, "micro_batches", o->micro_batches, "codec_act",
        o->codec_act, "codec_grad", o->codec_grad, "sealed", o->sealed, "algo", o->algo,
        "schedule", o->schedule, "checkpoint_every", o->checkpoint_every, "lr", o->lr, "warmup",
        o->warmup, "seed", (json_int_t)o->seed, "optimizer", o->optimizer, "optim_state",
        o->optim_state, "weight_decay", o->weight_decay, "clip", o->clip, "mask_prob",
        o->mask_prob, "first", (json_int_t)o->first, "sequences", (json_int_t)o->sequences,
        "shuffle", o->shuffle, "recompute", o->recompute, "recompute_attention",
        o->recompute_attention, "u_shape", o->u_shape, "replan_margin", o->replan_margin,
        "precision", o->precision, "owner_batch", "sync", o->sync, "codec_sync", o->codec_sync,
        "outer_lr", o->outer_lr, "outer_momentum", o->outer_momentum, "task", o->task,
        "vocab_hash", o->vocab_hash, "placement", o->placement);
    json_t *ob = json_object_get(j, "owner_batch");
    for (int i = 0; i < o->n_owner_batch; i++)
        json_array_append_new(ob, json_integer(o->owner_batch[i]));
    if (o->has_devices) {
        json_t *a = json_array();
        for (int i = 0; i < o->n_devices; i++)
            json_array_append_new(a, json_string(o->devices[i]));
        json_object_set_new(j, "devices", a);
    }
    return j;
}

char *coord_jobopts_text(const coord_jobopts *o, int indent)
{
    json_t *j = coord_jobopts_json(o);
    char *t = json_dumps(j, (indent ? JSON_INDENT(indent) : JSON_COMPACT) | JSON_SORT_KEYS);
    json_decref(j);
    return t ? t : sl_xstrdup("{}");
}

int coord_jobopts_profile_micro(const coord_jobopts *o)
{
    int b = o->n_owner_batch ? 0 : o->batch;
    for (int i = 0; i < o->n_owner_batch; i++)
        b = o->owner_batch[i] > b ? o->owner_batch[i] : b;
    return o->micro_batches > 0 ? b / o->micro_batches : b;
}

int coord_jobopts_task(const coord_jobopts *o)
{
    return strcmp(o->task, "classify") ? BAL_TASK_MLM : BAL_TASK_CLASSIFY;
}

int coord_jobopts_allows(const coord_jobopts *o, const char *owner, const char *id)
{
    if (!strcmp(id, owner) || o->n_devices == 0)
        return 1;
    for (int i = 0; i < o->n_devices; i++)
        if (!strcmp(o->devices[i], id))
            return 1;
    return 0;
}

int coord_policy_check(const coord_policy *pol, const coord_jobopts *o, char *why, size_t cap)
{
    if (!pol->known)
        return 0;
    if (!o->sealed && !pol->allow_unsealed) {
        snprintf(why, cap, "the data owner's policy keeps its frames sealed: drop --no-seal (or "
                 "its device runs with --allow-unsealed)");
        return -1;
    }
    if (!o->u_shape && !pol->allow_labels_out) {
        snprintf(why, cap, "the data owner's policy keeps its labels and the head at home: drop "
                 "--no-u-shape (or its device runs with --allow-labels-out)");
        return -1;
    }
    return 0;
}

int coord_jobopts_check_owners(const coord_jobopts *o, int nowner, char *why, size_t cap)
{
    if (nowner > 1 && o->n_owner_batch != nowner)
        return fail(why, cap, "options: owner_batch has %d entr%s for %d data owners (one each, "
                    "in the order of --data)", o->n_owner_batch, o->n_owner_batch == 1 ? "y" : "ies",
                    nowner);
    if (nowner == 1 && o->n_owner_batch > 1)
        return fail(why, cap, "options: owner_batch has %d entries for one data owner",
                    o->n_owner_batch);
    for (int i = 0; i < o->n_owner_batch; i++)
        if (o->owner_batch[i] % o->micro_batches)
            return fail(why, cap, "options: owner_batch %d is not a multiple of micro_batches %d",
                        o->owner_batch[i], o->micro_batches);
    if (nowner == 1 && (strcmp(o->sync, "step") || strcmp(o->codec_sync, "none")))
        return fail(why, cap, "options: sync and codec_sync are for several data owners");
    if (nowner == 1 && strcmp(o->placement, "balanced"))
        return fail(why, cap, "options: placement %s is for several data owners (it shares the "
                    "devices among their replicas)", o->placement);
    if (o->sync_every > o->steps)
        return fail(why, cap, "options: sync outer:%d syncs less often than the job's %d steps",
                    o->sync_every, o->steps);
    return 0;
}
