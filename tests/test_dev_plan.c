/* test_dev_plan.c - the device's plan parser (dev_plan.h): the plans of real
 * jobs are accepted with what they say; every check refuses its field with a
 * message naming it; the devices a plan is read for. */
#include <dirent.h>
#include <jansson.h>
#include <string.h>

#include "dev_fed.h"
#include "dev_job.h"
#include "dev_plan.h"
#include "fuzz/fuzz_plan.h"
#include "sl_config.h"
#include "sl_file.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_test.h"

/* The plan `base` with `path` ("a.b.2.c") set to the JSON `value`, or
 * removed (value NULL), as text (caller frees). */
static char *edited_from(const char *base, const char *path, const char *value)
{
    json_error_t je;
    json_t *pl = json_loads(base, 0, &je), *at = pl;
    json_t *v = value ? json_loads(value, JSON_DECODE_ANY, &je) : NULL;
    if (!pl || (value && !v)) {
        fprintf(stderr, "edited(%s, %s): %s\n", path, value ? value : "-", je.text);
        abort();
    }
    char buf[96];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL, *key = strtok_r(buf, ".", &save);
    for (char *next; (next = strtok_r(NULL, ".", &save)); key = next)
        at = json_is_array(at) ? json_array_get(at, strtoul(key, NULL, 10)) : json_object_get(at, key);
    if (json_is_array(at)) {
        size_t i = strtoul(key, NULL, 10);
        if (v)
            json_array_set_new(at, i, v);
        else
            json_array_remove(at, i);
    } else if (v) {
        json_object_set_new(at, key, v);
    } else {
        json_object_del(at, key);
    }
    char *text = json_dumps(pl, JSON_COMPACT);
    json_decref(pl);
    return text;
}

static char *edited(const char *path, const char *value)
{
    return edited_from(fp_base_plan, path, value);
}

static int parse(const char *text, const char *self, dev_plan *p, sl_err *err)
{
    return dev_plan_parse(text, strlen(text), self, p, err);
}

static void test_base_plan(void)
{
    dev_plan p;
    sl_err err = {0};
    CHECKF(parse(fp_base_plan, FP_OWNER, &p, &err) == 0, "%s", err.msg);
    const char *broken = fp_plan_broken(&p, FP_OWNER);
    CHECKF(!broken, "%s", broken ? broken : "");
    CHECK(!strcmp(p.job, "j49d624e5ad535c6e") && p.job_num == 5320480578658851950ull && p.epoch == 1);
    CHECK(p.batch == 8 && p.micro_batches == 4 && p.seq == 24 && p.steps == 20 &&
          p.start_step == 1 && p.checkpoint_every == 10);
    CHECK(p.codec_act == DEV_CODEC_NONE && p.codec_grad == DEV_CODEC_NONE && p.topk == 0 &&
          p.sealed == 1 && p.schedule == BAL_1F1B);
    CHECK(p.config.layers == 3 && p.config.hidden == 32 && p.config.max_pos == 24);
    CHECK(p.options.optimizer == DEV_OPT_ADAMW && !p.options.bf16_state && p.options.lr == 0.002 &&
          p.options.weight_decay == 0.01 && p.options.clip == 1.0 && p.options.warmup == -1 &&
          p.options.seed == 1 && !p.options.recompute && !p.options.recompute_attention &&
          !p.options.bf16_compute); /* a plan without precision is fp32 */
    CHECK(!strcmp(p.dataset, "wiki") && p.options.first == 0 && p.options.sequences == 0 &&
          p.options.shuffle == 1 && p.options.mask_prob == 0.15);
    CHECK(p.n_stages == 4 && p.n_local == 2 && p.local[0] == 0 && p.local[1] == 3);
    static const int first[] = {0, 2, 3, 4}, last[] = {1, 2, 3, 4}, warm[] = {3, 3, 3, 0};
    for (int i = 0; i < 4 && p.n_stages == 4; i++)
        CHECK(p.stage[i].first_unit == first[i] && p.stage[i].last_unit == last[i] &&
              p.stage[i].warmup == warm[i] && p.stage[i].threads == 1);
    CHECK(!strcmp(p.stage[1].device, FP_MID) && !strcmp(p.stage[1].address, "127.0.0.1:46815"));
    CHECK(p.stage[0].link_key[0] == 0x7e && p.stage[0].link_key[31] == 0x4d &&
          !memcmp(p.stage[0].link_key, p.stage[3].link_key, 32));
    dev_plan_free(&p);
    CHECK(p.stage == NULL);
    CHECK(parse(fp_base_plan, FP_MID, &p, &err) == 0 && p.n_local == 1 && p.local[0] == 1);
    dev_plan_free(&p);
    CHECK(parse(fp_base_plan, FP_LAST, &p, &err) == 0 && p.n_local == 1 && p.local[0] == 2);
    dev_plan_free(&p);
}

/* What else is accepted: topk gradients, GPipe, LAMB, bf16 state, upper-case keys. */
static void test_accepted_variants(void)
{
    static const char *const cases[][2] = {
        {"codec_grad", "\"topk:0.25\""},
        {"codec_grad", "\"topk:1\""},
        {"codec_act", "\"int8\""},
        {"schedule", "\"gpipe\""},
        {"options.optimizer", "\"lamb\""},
        {"options.optim_state", "\"bf16\""},
        {"options.precision", "\"bf16\""},
        {"options.precision", "\"fp32\""},
        {"options.seed", "-1"},
        {"checkpoint_every", "0"},
        {"checkpoint_every", "50"},
        {"start_step", "20"},
        {"stages.1.warmup", "4"},
        {"stages.2.link_key", "\"FEF5031A74023323AB3EB63E076B7B175506400164579D82033EC02C5AC7773D\""},
        {"stages.2.address", "\"[::1]:7001\""},
        {"options.task", "\"mlm\""},
        {"options.task", "\"classify\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edited(cases[i][0], cases[i][1]);
        dev_plan p;
        sl_err err = {0};
        int rc = parse(text, FP_MID, &p, &err);
        CHECKF(rc == 0, "%s = %s: %s", cases[i][0], cases[i][1], err.msg);
        const char *broken = rc ? NULL : fp_plan_broken(&p, FP_MID);
        CHECKF(!broken, "%s = %s: %s", cases[i][0], cases[i][1], broken);
        if (!rc && !strcmp(cases[i][1], "\"topk:0.25\""))
            CHECK(p.codec_grad == DEV_CODEC_TOPK && p.topk == 0.25);
        if (!rc && !strcmp(cases[i][0], "options.task"))
            CHECK(p.options.task ==
                      (strstr(cases[i][1], "classify") ? DEV_TASK_CLASSIFY : DEV_TASK_MLM) &&
                  p.config.task == p.options.task && p.config.num_labels == 2);
        if (!rc && !strcmp(cases[i][0], "options.precision"))
            CHECK(p.options.bf16_compute == !strcmp(cases[i][1], "\"bf16\""));
        dev_plan_free(&p);
        free(text);
    }
}

/* Each check refuses its field, naming it; nothing to free after a refusal. */
static void test_refusals(void)
{
    static const struct {
        const char *path, *value, *msg;
    } cases[] = {
        {"steps", NULL, "plan: steps: missing"},
        {"steps", "0", "plan: steps: 0 is not in 1..1000000000"},
        {"steps", "1000000001", "plan: steps: 1000000001 is not in 1..1000000000"},
        {"steps", "\"20\"", "plan: steps: not an integer"},
        {"steps", "20.0", "plan: steps: not an integer"},
        {"start_step", "0", "plan: start_step: 0 is not in 1..20"},
        {"start_step", "21", "plan: start_step: 21 is not in 1..20"},
        {"batch", "0", "plan: batch: 0 is not in 1..65536"},
        {"batch", "65537", "plan: batch: 65537 is not in 1..65536"},
        {"micro_batches", "3", "plan: micro_batches: 3 does not divide the batch 8"},
        {"micro_batches", "16", "plan: micro_batches: 16 is not in 1..8"},
        {"seq", "25", "plan: seq: 25 is not in 1..24"},
        {"seq", "0", "plan: seq: 0 is not in 1..24"},
        {"epoch", "0", "plan: epoch: 0 is not in 1..4294967295"},
        {"epoch", "4294967296", "plan: epoch: 4294967296 is not in 1..4294967295"},
        {"job", "\"j0000000000000001\"", "plan: job: 'j0000000000000001' is not job_num's id j49d624e5ad535c6e"},
        {"job", "7", "plan: job: not a string"},
        {"job_num", "-1", "plan: job_num: -1 is not in 0..9223372036854775807"},
        {"checkpoint_every", "-1", "plan: checkpoint_every: -1 is not in 0..2147483647"},
        {"checkpoint_every", "10.5", "plan: checkpoint_every: not an integer"},
        {"codec_act", "\"topk:0.5\"", "plan: codec_act: 'topk:0.5' is not none, fp16, bf16 or int8"},
        {"codec_act", "\"fp8\"", "plan: codec_act: 'fp8' is not"},
        {"codec_grad", "\"topk\"", "plan: codec_grad: 'topk' is not"},
        {"codec_grad", "\"topk:0\"", "plan: codec_grad: 'topk:0' is not"},
        {"codec_grad", "\"topk:1.5\"", "plan: codec_grad: 'topk:1.5' is not"},
        {"codec_grad", "\"topk:0.5x\"", "plan: codec_grad: 'topk:0.5x' is not"},
        {"codec_grad", "\"topk:nan\"", "plan: codec_grad: 'topk:nan' is not"},
        {"sealed", "1", "plan: sealed: not true or false"},
        {"schedule", "\"zigzag\"", "plan: schedule: 'zigzag' is not 1f1b or gpipe"},
        {"config", "\"bert\"", "plan: config: not an object"},
        {"config", NULL, "plan: config: missing"},
        {"config.num_hidden_layers", "0", "plan: config"},
        {"options", "[]", "plan: options: not an object"},
        {"options.optimizer", "\"sgd\"", "plan: options.optimizer: 'sgd' is not adamw or lamb"},
        {"options.optim_state", "\"fp8\"", "plan: options.optim_state: 'fp8' is not fp32 or bf16"},
        {"options.precision", "\"fp16\"", "plan: options.precision: 'fp16' is not fp32 or bf16"},
        {"options.precision", "16", "plan: options.precision: not a string"},
        {"options.lr", "\"fast\"", "plan: options.lr: not a number"},
        {"options.clip", NULL, "plan: options.clip: missing"},
        {"options.warmup", "-2", "plan: options.warmup: -2 is not in -1..2147483647"},
        {"options.seed", "1.5", "plan: options.seed: not an integer"},
        {"options.recompute", "0", "plan: options.recompute: not true or false"},
        {"options.first", "-1", "plan: options.first: -1 is not in 0.."},
        {"options.sequences", "\"all\"", "plan: options.sequences: not an integer"},
        {"options.shuffle", "1", "plan: options.shuffle: not true or false"},
        {"options.mask_prob", "1.5", "plan: options.mask_prob: 1.5 is not in (0, 1)"},
        {"options.task", "\"regress\"", "plan: options.task: 'regress' is not mlm or classify"},
        {"options.task", "1", "plan: options.task: not a string"},
        {"data", NULL, "plan: data: missing"},
        {"data.dataset", "\"../etc\"", "plan: data.dataset: '../etc' is not a dataset name"},
        {"data.dataset", "7", "plan: data.dataset: not a string"},
        {"stages", "{}", "plan: stages: not an array"},
        {"stages", "[]", "plan: stages: 0 stages for 5 units"},
        {"stages.1", "5", "plan: stages[1]: not an object"},
        {"stages.1.index", "2", "plan: stages[1].index: 2 is not in 1..1"},
        {"stages.1.device", "\"skyloom-admin\"", "plan: stages[1].device: 'skyloom-admin' is not a device id"},
        {"stages.1.device", "\"D30F61CFBD34B94F9\"", "plan: stages[1].device: 'D30F61CFBD34B94F9' is not a device id"},
        {"stages.1.address", "\"\"", "plan: stages[1].address: '' is not 1 to 255"},
        {"stages.1.address", "\"a b:1\"", "plan: stages[1].address: 'a b:1' is not"},
        {"stages.1.address", "\"\\u001b[2J:1\"", "plan: stages[1].address: '\\x1b[2J:1' is not"},
        {"stages.1.link_key", "\"d6fea5\"", "plan: stages[1].link_key: not 64 hex digits"},
        {"stages.1.link_key", "\"-6fea5278bba4daaf41462260f5a0160526e431022e11c126f262d54b3d7135f\"",
         "plan: stages[1].link_key: not 64 hex digits"},
        {"stages.1.link_key", "\" 6fea5278bba4daaf41462260f5a0160526e431022e11c126f262d54b3d7135f\"",
         "plan: stages[1].link_key: not 64 hex digits"},
        {"stages.0.first_unit", "1", "plan: stages[0].first_unit: 1, not unit 0 (the embeddings)"},
        {"stages.2.first_unit", "4", "plan: stages[2].first_unit: 4, but stage 1 ends at unit 2"},
        {"stages.2.first_unit", "2", "plan: stages[2].first_unit: 2, but stage 1 ends at unit 2"},
        {"stages.1.first_unit", "9", "plan: stages[1].first_unit: 9 is not in 0..4"},
        {"stages.1.last_unit", "1", "plan: stages[1].last_unit: 1 is before its first unit 2"},
        {"stages.3.last_unit", "5", "plan: stages[3].last_unit: 5 is past the head (unit 4)"},
        {"stages.3", NULL, "plan: stages: the last stage ends at unit 3, not at the head (unit 4)"},
        {"stages.1.warmup", "5", "plan: stages[1].warmup: 5 is not in 0..4"},
        {"stages.1.warmup", "-1", "plan: stages[1].warmup: -1 is not in 0..4"},
        {"stages.1.threads", "0", "plan: stages[1].threads: 0 is not in 1..65536"},
        {"stages.1.threads", "65537", "plan: stages[1].threads: 65537 is not in 1..65536"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edited(cases[i].path, cases[i].value);
        dev_plan p;
        sl_err err = {0};
        int rc = parse(text, FP_OWNER, &p, &err);
        CHECKF(rc == -1 && strstr(err.msg, cases[i].msg) && p.stage == NULL && p.n_stages == 0,
               "%s = %s: rc %d, '%s', expected '%s'", cases[i].path,
               cases[i].value ? cases[i].value : "(removed)", rc, err.msg, cases[i].msg);
        const char *broken = fp_refusal_broken(err.msg);
        CHECKF(!broken, "%s: '%s'", broken ? broken : "", err.msg);
        free(text);
    }
    /* bf16 optimizer state is for AdamW only */
    json_error_t je;
    json_t *pl = json_loads(fp_base_plan, 0, &je);
    json_t *o = json_object_get(pl, "options");
    json_object_set_new(o, "optimizer", json_string("lamb"));
    json_object_set_new(o, "optim_state", json_string("bf16"));
    dev_plan p;
    sl_err err = {0};
    CHECK(dev_plan_from_json(pl, FP_OWNER, &p, &err) == -1 &&
          strstr(err.msg, "plan: options.optim_state: bf16 is for adamw only"));
    json_decref(pl);
    CHECK(parse("", FP_OWNER, &p, &err) == -1 && strstr(err.msg, "plan: not JSON"));
    CHECK(parse("[1, 2]", FP_OWNER, &p, &err) == -1 && strstr(err.msg, "plan: not a JSON object"));
    CHECK(dev_plan_parse("{\"job\": \"a\0b\"}", 14, FP_OWNER, &p, &err) == -1 &&
          strstr(err.msg, "plan: not JSON"));
}

/* Who reads it: a device the plan does not name is refused, and one device
 * holds at most DEV_PLAN_MAX_LOCAL stages. */
static void test_devices(void)
{
    dev_plan p;
    sl_err err = {0};
    CHECK(parse(fp_base_plan, FP_STRANGER, &p, &err) == -1 &&
          strstr(err.msg, "plan: stages: none is this device's (" FP_STRANGER ")"));
    CHECK(parse(fp_base_plan, "", &p, &err) == -1 && strstr(err.msg, "none is this device's"));
    /* ten units (8 layers), one stage each, nine of them the owner's */
    json_error_t je;
    json_t *pl = json_loads(fp_base_plan, 0, &je), *st = json_object_get(pl, "stages");
    json_object_set_new(json_object_get(pl, "config"), "num_hidden_layers", json_integer(8));
    json_t *own = json_deep_copy(json_array_get(st, 0)), *mid = json_deep_copy(json_array_get(st, 1));
    json_array_clear(st);
    for (int i = 0; i < 10; i++) {
        json_t *s = json_deep_copy(i == 4 ? mid : own);
        json_object_set_new(s, "index", json_integer(i));
        json_object_set_new(s, "first_unit", json_integer(i));
        json_object_set_new(s, "last_unit", json_integer(i));
        json_object_set_new(s, "warmup", json_integer(0));
        json_array_append_new(st, s);
    }
    CHECK(dev_plan_from_json(pl, FP_MID, &p, &err) == 0 && p.n_stages == 10 && p.n_local == 1 &&
          p.local[0] == 4);
    dev_plan_free(&p);
    CHECK(dev_plan_from_json(pl, FP_OWNER, &p, &err) == -1 &&
          strstr(err.msg, "plan: stages: 9 are this device's, more than 8"));
    /* eight are allowed */
    json_object_set_new(json_array_get(st, 5), "device", json_string(FP_LAST));
    CHECK(dev_plan_from_json(pl, FP_OWNER, &p, &err) == 0 && p.n_local == 8 && p.local[7] == 9);
    dev_plan_free(&p);
    json_decref(own);
    json_decref(mid);
    json_decref(pl);
}

/* The plans of real jobs (the fuzz target's seeds) are accepted for every
 * device they name. */
static void test_real_plans(void)
{
    const char *dir = SKYLOOM_SOURCE_ROOT "/tests/fuzz/corpus/plan";
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "%s", dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[4200], *text = NULL;
        size_t len = 0;
        sl_err err = {0};
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        CHECKF(sl_read_file(path, 1 << 20, &text, &len, &err) == 0, "%s", err.msg);
        json_error_t je;
        json_t *pl = text ? json_loadb(text, len, 0, &je) : NULL;
        json_t *st = json_object_get(pl, "stages");
        for (size_t i = 0; i < json_array_size(st); i++) {
            const char *dev = json_string_value(json_object_get(json_array_get(st, i), "device"));
            dev_plan p;
            CHECKF(dev_plan_parse(text, len, dev, &p, &err) == 0, "%s for %s: %s", e->d_name, dev,
                   err.msg);
            const char *broken = fp_plan_broken(&p, dev);
            CHECKF(!broken, "%s: %s", e->d_name, broken ? broken : "");
            dev_plan_free(&p);
        }
        n += json_array_size(st) > 0;
        json_decref(pl);
        free(text);
    }
    if (d)
        closedir(d);
    CHECKF(n >= 3, "%d plans", n);
}

/* options.task classify makes the config's head the classifier: a config
 * that cannot be one is refused, naming the task; without the task the
 * same config trains MLM. */
static void test_task(void)
{
    json_error_t je;
    json_t *pl = json_loads(fp_base_plan, 0, &je);
    json_object_set_new(json_object_get(pl, "config"), "num_labels", json_integer(1));
    char *mlm = json_dumps(pl, JSON_COMPACT);
    json_object_set_new(json_object_get(pl, "options"), "task", json_string("classify"));
    char *cls = json_dumps(pl, JSON_COMPACT);
    json_object_set_new(json_object_get(pl, "config"), "num_labels", json_integer(5));
    char *cls5 = json_dumps(pl, JSON_COMPACT);
    json_decref(pl);
    dev_plan p;
    sl_err err = {0};
    CHECKF(parse(mlm, FP_OWNER, &p, &err) == 0 && p.config.task == DEV_TASK_MLM, "%s", err.msg);
    dev_plan_free(&p);
    CHECK(parse(cls, FP_OWNER, &p, &err) == -1);
    CHECKF(strstr(err.msg, "plan: options.task classify") && strstr(err.msg, "num_labels"), "%s",
           err.msg);
    CHECKF(parse(cls5, FP_OWNER, &p, &err) == 0 && p.config.task == DEV_TASK_CLASSIFY &&
               p.config.num_labels == 5, "%s", err.msg);
    dev_plan_free(&p);
    free(mlm);
    free(cls);
    free(cls5);
}

/* The data owner's policy: a plan that keeps it passes; each rule refuses
 * the plan that breaks it, naming the option that lifts it; a plan read by
 * a device that is not its data owner is not the policy's business. */
static int policy_on(const char *edit, const char *value, const char *self, dev_policy pol,
                     sl_err *err)
{
    char *text = edit ? edited(edit, value) : sl_xstrdup(fp_base_plan);
    dev_plan p;
    int rc = parse(text, self, &p, err);
    CHECKF(rc == 0, "%s", err->msg);
    if (!rc)
        rc = dev_policy_check_plan(&pol, &p, self, err);
    if (!rc || p.n_stages)
        dev_plan_free(&p);
    free(text);
    return rc;
}

static void test_policy(void)
{
    sl_err err = {0};
    dev_policy def = dev_policy_default(), pol = def;
    CHECK(def.home_layers == DEV_POLICY_HOME_LAYERS && !def.allow_unsealed && !def.allow_labels_out);
    /* the base plan: the owner holds units 0..1 and the head, sealed */
    pol.home_layers = 1;
    CHECKF(policy_on(NULL, NULL, FP_OWNER, pol, &err) == 0, "%s", err.msg);
    pol.home_layers = 0;
    CHECK(policy_on(NULL, NULL, FP_OWNER, pol, &err) == 0);
    pol.home_layers = 2;
    CHECKF(policy_on(NULL, NULL, FP_OWNER, pol, &err) == -1 && err.code == SL_EAUTH &&
           strstr(err.msg, "the embeddings and 2 encoder layers stay at home, but the plan runs "
                  "unit 2 on " FP_MID) && strstr(err.msg, "--home-layers"), "%s", err.msg);
    /* more than the model has: every encoder layer */
    pol.home_layers = 200;
    CHECKF(policy_on(NULL, NULL, FP_OWNER, pol, &err) == -1 &&
           strstr(err.msg, "the embeddings and 3 encoder layers stay"), "%s", err.msg);
    /* a middle device reads the same plan: not its policy to apply */
    CHECK(policy_on(NULL, NULL, FP_MID, pol, &err) == 0);
    pol = def;
    pol.home_layers = 1;
    CHECKF(policy_on("sealed", "false", FP_OWNER, pol, &err) == -1 && err.code == SL_EAUTH &&
           strstr(err.msg, "sealed") && strstr(err.msg, "--allow-unsealed"), "%s", err.msg);
    pol.allow_unsealed = 1;
    CHECK(policy_on("sealed", "false", FP_OWNER, pol, &err) == 0);
    /* the head on another device */
    pol = def;
    pol.home_layers = 1;
    CHECKF(policy_on("stages.3.device", "\"" FP_LAST "\"", FP_OWNER, pol, &err) == -1 &&
           strstr(err.msg, "labels") && strstr(err.msg, "--allow-labels-out"), "%s", err.msg);
    pol.allow_labels_out = 1;
    CHECKF(policy_on("stages.3.device", "\"" FP_LAST "\"", FP_OWNER, pol, &err) == 0, "%s", err.msg);
    /* the same rules on a job's options, before any plan */
    pol = def;
    CHECK(dev_policy_check_options(&pol, 1, 1, &err) == 0);
    CHECK(dev_policy_check_options(&pol, 0, 1, &err) == -1 && strstr(err.msg, "--no-seal"));
    CHECK(dev_policy_check_options(&pol, 1, 0, &err) == -1 && strstr(err.msg, "--no-u-shape"));
    pol.allow_unsealed = pol.allow_labels_out = 1;
    CHECK(dev_policy_check_options(&pol, 0, 0, &err) == 0);
}


/* A federation of two owners made from the base plan: replica 0 is the
 * owner's (units 0..2 on it, 3..4 on MID), replica 1 LAST's alone (units
 * 0..4), batches 4 and 4; --sync outer:5, int8. */
static char *fed_plan(void)
{
    json_error_t je;
    json_t *pl = json_loads(fp_base_plan, 0, &je), *st = json_object_get(pl, "stages");
    json_t *s0 = json_deep_copy(json_array_get(st, 0)), *s1 = json_deep_copy(json_array_get(st, 1));
    json_t *s2 = json_deep_copy(json_array_get(st, 2));
    json_object_set_new(s0, "last_unit", json_integer(2));
    json_object_set_new(s0, "replica", json_integer(0));
    json_object_set_new(s1, "first_unit", json_integer(3));
    json_object_set_new(s1, "last_unit", json_integer(4));
    json_object_set_new(s1, "replica", json_integer(0));
    json_object_set_new(s2, "index", json_integer(2));
    json_object_set_new(s2, "first_unit", json_integer(0));
    json_object_set_new(s2, "last_unit", json_integer(4));
    json_object_set_new(s2, "replica", json_integer(1));
    json_object_set_new(pl, "stages", json_pack("[o, o, o]", s0, s1, s2));
    json_object_set_new(pl, "replicas", json_pack(
        "[{s:s, s:s, s:i, s:i, s:i}, {s:s, s:s, s:i, s:i, s:i}]", "owner", FP_OWNER, "dataset",
        "wiki", "batch", 4, "first_stage", 0, "stages", 2, "owner", FP_LAST, "dataset", "news",
        "batch", 4, "first_stage", 2, "stages", 1));
    json_object_set_new(pl, "sync", json_pack("{s:s, s:i, s:s, s:f, s:f}", "mode", "outer", "every",
                                              5, "codec", "int8", "outer_lr", 0.7,
                                              "outer_momentum", 0.9));
    char *text = json_dumps(pl, JSON_COMPACT);
    json_decref(pl);
    return text;
}

/* A federation's plan: its replicas and sync as dev_plan.h says, each
 * device in its replica with its owner's dataset; every check refuses its
 * field. */
static void test_federation(void)
{
    char *base = fed_plan();
    dev_plan p;
    sl_err err = {0};
    static const struct {
        const char *self, *dataset;
        int replica, nlocal, local0;
    } devs[] = {{FP_OWNER, "wiki", 0, 1, 0}, {FP_MID, "wiki", 0, 1, 1}, {FP_LAST, "news", 1, 1, 2}};
    for (int d = 0; d < 3; d++) {
        CHECKF(parse(base, devs[d].self, &p, &err) == 0, "%s: %s", devs[d].self, err.msg);
        const char *broken = fp_plan_broken(&p, devs[d].self);
        CHECKF(!broken, "%s", broken ? broken : "");
        CHECK(p.n_replicas == 2 && p.my_replica == devs[d].replica && p.n_local == devs[d].nlocal &&
              p.local[0] == devs[d].local0 && !strcmp(p.dataset, devs[d].dataset));
        CHECK(p.replica[0].batch == 4 && p.replica[1].batch == 4 && p.replica[1].first_stage == 2 &&
              p.replica[1].n_stages == 1 && !strcmp(p.replica[1].owner, FP_LAST));
        CHECK(p.sync.mode == DEV_SYNC_OUTER && p.sync.every == 5 && p.sync.codec == DEV_CODEC_INT8 &&
              p.sync.outer_lr == 0.7 && p.sync.outer_momentum == 0.9);
        CHECK(p.stage[2].replica == 1 && p.stage[2].first_unit == 0 && p.stage[1].replica == 0);
        dev_plan_free(&p);
    }
    /* a step sync with topk */
    char *t = edited_from(base, "sync", "{\"mode\": \"step\", \"every\": 1, \"codec\": \"topk:0.25\", "
                          "\"outer_lr\": 0.7, \"outer_momentum\": 0.9}");
    CHECKF(parse(t, FP_OWNER, &p, &err) == 0 && p.sync.mode == DEV_SYNC_STEP &&
           p.sync.codec == DEV_CODEC_TOPK && p.sync.topk == 0.25, "%s", err.msg);
    dev_plan_free(&p);
    free(t);
    static const struct {
        const char *path, *value, *msg;
    } cases[] = {
        {"sync", NULL, "plan: replicas without sync"},
        {"replicas", NULL, "plan: sync without replicas"},
        {"replicas", "{}", "plan: replicas: not an array"},
        {"replicas.1", NULL, "plan: replicas: 1, not 2..16"},
        {"replicas.1", "7", "plan: replicas[1]: not an object"},
        {"replicas.1.owner", "\"x\"", "plan: replicas[1].owner: 'x' is not a device id"},
        {"replicas.1.owner", "\"" FP_MID "\"", "plan: stages[2].device: " FP_LAST ", but replica 1's owner is " FP_MID},
        {"replicas.1.dataset", "\"../b\"", "plan: replicas[1].dataset: '../b' is not a dataset name"},
        {"replicas.1.batch", "2", "plan: replicas[1].batch: 2 is not in 4..65536"},
        {"replicas.1.batch", "6", "plan: replicas[1].batch: 6 is not a multiple of micro_batches 4"},
        {"replicas.1.batch", "8", "plan: replicas: their batches add up to 12, not the batch 8"},
        {"replicas.1.first_stage", "1", "plan: replicas[1].first_stage: 1 is not in 2..2"},
        {"replicas.1.stages", "2", "plan: replicas: their stages are 4, the plan has 3"},
        {"replicas.1.stages", "0", "plan: replicas[1].stages: 0 is not in 1.."},
        {"stages.2.replica", "0", "plan: stages[2].replica: 0 is not in 1..1"},
        {"stages.2.replica", NULL, "plan: stages[2].replica: missing"},
        {"stages.2.first_unit", "1", "plan: stages[2].first_unit: 1, not unit 0 (the embeddings)"},
        {"stages.1.last_unit", "3", "plan: stages: replica 0 ends at unit 3, not at the head (unit 4)"},
        {"stages.2.last_unit", "3", "plan: stages: the last stage ends at unit 3, not at the head"},
        {"stages.1.device", "\"" FP_LAST "\"", "this device (" FP_LAST ") is in replicas 0 and 1: a device serves one replica"},
        {"sync", "[]", "plan: sync: not an object"},
        {"sync.mode", "\"diloco\"", "plan: sync.mode: 'diloco' is not step or outer"},
        {"sync.mode", "\"step\"", "plan: sync.every: 5 is not in 1..1"},
        {"sync.every", "21", "plan: sync.every: 21 is not in 1..20"},
        {"sync.every", "0", "plan: sync.every: 0 is not in 1..20"},
        {"sync.codec", "\"int4\"", "plan: sync.codec: 'int4' is not none"},
        {"sync.codec", "\"topk:2\"", "plan: sync.codec: 'topk:2' is not none"},
        {"sync.outer_lr", "0", "plan: sync.outer_lr: 0 is not in (0, 10]"},
        {"sync.outer_lr", "\"x\"", "plan: sync.outer_lr: not a number"},
        {"sync.outer_momentum", "1", "plan: sync.outer_momentum: 1 is not in [0, 1)"},
        {"sync.outer_momentum", NULL, "plan: sync.outer_momentum: missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edited_from(base, cases[i].path, cases[i].value);
        const char *self = !strncmp(cases[i].path, "stages.1.device", 15) ? FP_LAST : FP_OWNER;
        int rc = parse(text, self, &p, &err);
        CHECKF(rc == -1 && strstr(err.msg, cases[i].msg) && p.stage == NULL && p.n_stages == 0,
               "%s = %s: rc %d, '%s', expected '%s'", cases[i].path,
               cases[i].value ? cases[i].value : "(removed)", rc, err.msg, cases[i].msg);
        const char *broken = fp_refusal_broken(err.msg);
        CHECKF(!broken, "%s: '%s'", broken ? broken : "", err.msg);
        free(text);
    }
    /* each owner's policy applies to its own replica: LAST holds all of its
     * replica; the owner of replica 0 keeps only units 0..2 and not the head */
    dev_policy pol = dev_policy_default();
    CHECK(parse(base, FP_LAST, &p, &err) == 0 && dev_policy_check_plan(&pol, &p, FP_LAST, &err) == 0);
    dev_plan_free(&p);
    CHECK(parse(base, FP_OWNER, &p, &err) == 0 &&
          dev_policy_check_plan(&pol, &p, FP_OWNER, &err) == -1 &&
          strstr(err.msg, "--allow-labels-out"));
    pol.allow_labels_out = 1;
    CHECKF(dev_policy_check_plan(&pol, &p, FP_OWNER, &err) == 0, "%s", err.msg);
    dev_plan_free(&p);
    free(base);
}

/* An owner away: replica 1 has no stage (stages 0, away) and replica 0
 * runs alone; then replica 1 rejoining after an outer step. */
static void test_away(void)
{
    char *base = fed_plan();
    json_error_t je;
    json_t *pl = json_loads(base, 0, &je), *st = json_object_get(pl, "stages");
    json_array_remove(st, 2);
    json_t *r1 = json_array_get(json_object_get(pl, "replicas"), 1);
    json_object_set_new(r1, "stages", json_integer(0));
    json_object_set_new(r1, "away", json_true());
    char *away = json_dumps(pl, JSON_COMPACT);
    json_decref(pl);
    dev_plan p;
    sl_err err = {0};
    CHECKF(parse(away, FP_OWNER, &p, &err) == 0, "%s", err.msg);
    CHECK(p.n_replicas == 2 && p.n_stages == 2 && p.replica[1].away && !p.replica[1].rejoin &&
          p.replica[1].n_stages == 0 && !p.replica[0].away && p.my_replica == 0);
    dev_plan_free(&p);
    CHECK(parse(away, FP_LAST, &p, &err) == -1 && strstr(err.msg, "none is this device's"));
    static const struct {
        const char *path, *value, *msg;
    } cases[] = {
        {"replicas.1.stages", "1", "plan: replicas[1].stages: 1 is not in 0..0"},
        {"replicas.1.away", "1", "plan: replicas[1].away: not true or false"},
        {"replicas.1.rejoin", "true", "plan: replicas[1]: away and rejoining at once"},
        {"replicas.0.away", "true", "plan: replicas[0].stages: 2 is not in 0..0"},
        {"sync.mode", "\"step\"", "plan: sync.every: 5 is not in 1..1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edited_from(away, cases[i].path, cases[i].value);
        int rc = parse(text, FP_OWNER, &p, &err);
        CHECKF(rc == -1 && strstr(err.msg, cases[i].msg), "%s = %s: rc %d, '%s', expected '%s'",
               cases[i].path, cases[i].value, rc, err.msg, cases[i].msg);
        free(text);
    }
    char *t = edited_from(away, "sync", "{\"mode\": \"step\", \"every\": 1, \"codec\": \"none\", "
                          "\"outer_lr\": 0.7, \"outer_momentum\": 0.9}");
    CHECKF(parse(t, FP_OWNER, &p, &err) == -1 && strstr(err.msg, "one away under sync step"),
           "%s", err.msg);
    free(t);
    /* rejoining: only after an outer step (every 5: start_step 6, 11, ...) */
    char *b6 = edited_from(base, "start_step", "6");
    t = edited_from(b6, "replicas.1.rejoin", "true");
    CHECKF(parse(t, FP_LAST, &p, &err) == 0 && p.replica[1].rejoin && p.my_replica == 1,
           "%s", err.msg);
    dev_plan_free(&p);
    free(t);
    char *b7 = edited_from(base, "start_step", "7");
    t = edited_from(b7, "replicas.1.rejoin", "true");
    CHECKF(parse(t, FP_LAST, &p, &err) == -1 &&
           strstr(err.msg, "one rejoins at step 7, not after an outer step (every 5)"), "%s", err.msg);
    free(t);
    t = edited_from(base, "replicas.1.rejoin", "true");
    CHECKF(parse(t, FP_LAST, &p, &err) == -1 && strstr(err.msg, "one rejoins at step 1"), "%s",
           err.msg);
    free(t);
    free(b6);
    free(b7);
    free(away);
    free(base);
}

/* The committed step in a run task's spec: a step in 0..2^31-1 is taken;
 * anything else from the coordinator's reply (not JSON, not an object, a
 * string, a fraction, a negative or too large number, null) reads as none. */
static void test_committed_step(void)
{
    CHECK(dev_task_committed_step("{\"committed_step\": 0}") == 0);
    CHECK(dev_task_committed_step("{\"committed_step\": 120, \"x\": [1]}") == 120);
    CHECK(dev_task_committed_step("{\"committed_step\": 2147483647}") == 2147483647);
    const char *bad[] = {NULL, "", "{", "[]", "7", "null", "{}", "{\"committed_step\": null}",
                         "{\"committed_step\": \"12\"}", "{\"committed_step\": 1.5}",
                         "{\"committed_step\": -1}", "{\"committed_step\": -7}", "{\"committed_step\": 2147483648}",
                         "{\"committed_step\": 99999999999999999999}",
                         "{\"committed_step\": [3]}", "{\"committed_step\": {\"n\": 3}}",
                         "{\"committed_step\": true}", "{\"step\": 3}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(dev_task_committed_step(bad[i]) == -1, "spec %s", bad[i] ? bad[i] : "(none)");
}

int main(void)
{
    sl_log_set_level(SL_LOG_OFF);
    RUN(test_base_plan);
    RUN(test_accepted_variants);
    RUN(test_refusals);
    RUN(test_task);
    RUN(test_devices);
    RUN(test_real_plans);
    RUN(test_policy);
    RUN(test_federation);
    RUN(test_away);
    RUN(test_committed_step);
    return sl_test_done();
}
