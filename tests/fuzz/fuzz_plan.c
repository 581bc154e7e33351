/* fuzz_plan.c - libFuzzer target: the device's parsing of a job's plan
 * (dev_plan_parse), the JSON the coordinator signs and every device of the
 * job runs on.
 *
 * An input that starts with '{' is plan text (corpus/plan/: plans of real
 * jobs). Any other input edits the plan of fuzz_plan.h: every 3 bytes
 * (field, kind, value) set one field (top level, options, config, a stage,
 * or a whole stage) to an edge value from the tables below, or remove it,
 * so that the random inputs of `make test` reach every check. Either plan
 * is parsed for every device its stages name (up to four) and for a device
 * it does not name. Properties:
 *   - an accepted plan keeps every promise of dev_plan.h (fp_plan_broken)
 *     and says what the JSON says (numbers, units, devices, addresses, keys);
 *   - a device the plan does not name is refused;
 *   - every device the plan names with at most DEV_PLAN_MAX_LOCAL stages
 *     gets the same answer (the checks do not depend on who reads);
 *   - a refusal names the plan, says why, holds no control byte, and leaves
 *     nothing to free. */
#include <jansson.h>
#include <limits.h>
#include <sodium.h>

#include "dev_plan.h"
#include "fuzz_plan.h"
#include "fuzz_util.h"

/* ---- what the JSON says --------------------------------------------------------- */

static long long jint(const json_t *o, const char *key)
{
    return json_integer_value(json_object_get(o, key));
}

static const char *jstr(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* An accepted plan holds the JSON's values. */
static void agrees(const dev_plan *p, const json_t *pl)
{
    REQUIRE(p->job_num == (uint64_t)jint(pl, "job_num") && p->epoch == (uint32_t)jint(pl, "epoch"));
    REQUIRE(!strcmp(p->job, jstr(pl, "job")));
    REQUIRE(p->batch == jint(pl, "batch") && p->micro_batches == jint(pl, "micro_batches") &&
            p->seq == jint(pl, "seq") && p->steps == jint(pl, "steps") &&
            p->start_step == jint(pl, "start_step") &&
            p->checkpoint_every == jint(pl, "checkpoint_every"));
    REQUIRE(p->sealed == json_is_true(json_object_get(pl, "sealed")));
    REQUIRE(!strcmp(bal_schedule_name(p->schedule), jstr(pl, "schedule")));
    REQUIRE(!strcmp(dev_codec_name(p->codec_act), jstr(pl, "codec_act")));
    if (p->codec_grad != DEV_CODEC_TOPK)
        REQUIRE(!strcmp(dev_codec_name(p->codec_grad), jstr(pl, "codec_grad")));
    const json_t *o = json_object_get(pl, "options");
    REQUIRE(p->options.warmup == jint(o, "warmup") && p->options.seed == (uint64_t)jint(o, "seed"));
    REQUIRE(p->options.lr == json_number_value(json_object_get(o, "lr")));
    const json_t *pr = json_object_get(o, "precision");
    REQUIRE(p->options.bf16_compute == (pr && !strcmp(json_string_value(pr), "bf16")));
    REQUIRE(p->config.layers == jint(json_object_get(pl, "config"), "num_hidden_layers"));
    const json_t *st = json_object_get(pl, "stages");
    REQUIRE((size_t)p->n_stages == json_array_size(st));
    for (int i = 0; i < p->n_stages; i++) {
        const json_t *s = json_array_get(st, (size_t)i);
        const dev_plan_stage *x = &p->stage[i];
        REQUIRE(x->first_unit == jint(s, "first_unit") && x->last_unit == jint(s, "last_unit") &&
                x->warmup == jint(s, "warmup") && x->threads == jint(s, "threads"));
        REQUIRE(!strcmp(x->device, jstr(s, "device")) && !strcmp(x->address, jstr(s, "address")));
        uint8_t key[32];
        size_t n = 0;
        const char *hex = jstr(s, "link_key");
        REQUIRE(sodium_hex2bin(key, sizeof key, hex, strlen(hex), NULL, &n, NULL) == 0 && n == 32);
        REQUIRE(!memcmp(key, x->link_key, 32));
    }
}

/* Parses text for self; checks the properties of either answer. Returns
 * the answer (0 accepted) and the refusal's message in why. */
static int parse_as(const char *text, size_t len, const json_t *pl, const char *self, char *why,
                    size_t cap)
{
    dev_plan p;
    sl_err err = {0};
    int rc = dev_plan_parse(text, len, self, &p, &err);
    if (rc == 0) {
        const char *broken = fp_plan_broken(&p, self);
        REQUIREF(!broken, "accepted for %s, but not: %s", self, broken);
        REQUIRE(pl != NULL);
        agrees(&p, pl);
        dev_plan_free(&p);
        why[0] = 0;
    } else {
        REQUIRE(rc == -1 && p.stage == NULL && p.n_stages == 0 && p.n_local == 0);
        const char *broken = fp_refusal_broken(err.msg);
        REQUIREF(!broken, "refusal '%s': %s", err.msg, broken);
        snprintf(why, cap, "%s", err.msg);
    }
    return rc;
}

/* The devices the plan's stages name (distinct strings, up to 4) and how
 * many stages each holds. */
static int named(const json_t *pl, const char *ids[4], int count[4])
{
    const json_t *st = json_object_get(pl, "stages");
    int n = 0;
    for (size_t i = 0; i < json_array_size(st); i++) {
        const char *d = jstr(json_array_get(st, i), "device");
        if (!d)
            continue;
        int k = 0;
        while (k < n && strcmp(ids[k], d))
            k++;
        if (k == n) {
            if (n == 4)
                continue;
            ids[n] = d;
            count[n++] = 0;
        }
        count[k]++;
    }
    return n;
}

static void check_text(const char *text, size_t len, const json_t *pl)
{
    char why[512], first_why[512] = "";
    if (!pl) {
        REQUIRE(parse_as(text, len, NULL, FP_OWNER, why, sizeof why) != 0);
        return;
    }
    const char *ids[4];
    int count[4], first = -2;
    int n = named(pl, ids, count);
    for (int k = 0; k < n; k++) {
        int rc = parse_as(text, len, pl, ids[k], why, sizeof why);
        if (count[k] > DEV_PLAN_MAX_LOCAL)
            continue;
        if (first == -2) {
            first = rc;
            snprintf(first_why, sizeof first_why, "%s", why);
        } else {
            REQUIREF(rc == first && !strcmp(why, first_why), "%s: '%s', another device: '%s'",
                     ids[k], why, first_why);
        }
    }
    int stranger = 1;
    for (int k = 0; k < n; k++)
        stranger &= strcmp(ids[k], FP_STRANGER) != 0;
    if (stranger)
        REQUIRE(parse_as(text, len, pl, FP_STRANGER, why, sizeof why) != 0);
}

/* ---- edits of the base plan ------------------------------------------------------- */

static const char *const fields[] = {
    "job", "job_num", "epoch", "config", "batch", "seq", "micro_batches", "steps",
    "start_step", "checkpoint_every", "codec_act", "codec_grad", "sealed", "schedule",
    "options", "stages",
    "options.optimizer", "options.optim_state", "options.lr", "options.weight_decay",
    "options.clip", "options.warmup", "options.seed", "options.recompute",
    "options.recompute_attention", "options.precision",
    "config.num_hidden_layers", "config.hidden_size", "config.num_attention_heads",
    "config.max_position_embeddings", "config.vocab_size", "config.intermediate_size",
};
#define NFIELDS (int)(sizeof fields / sizeof fields[0])
static const char *const stage_fields[] = {"index", "device", "address", "link_key",
                                           "first_unit", "last_unit", "warmup", "threads"};
#define NSTAGE_FIELDS 8
#define NSTAGES 4

static const long long ints[] = {
    -1, 0, 1, 2, 3, 4, 5, 8, 16, 24, 25, 255, 256, 257, 258, 65535, 65536, 65537,
    INT_MAX, (long long)INT_MAX + 1, UINT32_MAX, (long long)UINT32_MAX + 1, 1000000000,
    1000000001, LLONG_MAX, LLONG_MIN, -2, 5320480578658851950LL, 20, 21, 10, 7,
};
static const char *const strs[] = {
    "", "none", "fp16", "bf16", "int8", "topk", "topk:0.01", "topk:0", "topk:1", "topk:1.5",
    "topk:", "topk:nan", "topk:0.5x", "topk: 0.5", "1f1b", "gpipe", "adamw", "lamb", "fp32",
    "j49d624e5ad535c6e", "j0000000000000000", "J49D624E5AD535C6E", FP_OWNER, FP_MID, FP_LAST,
    FP_STRANGER, "skyloom-admin", "d74b2d1ed259278f", "127.0.0.1:1", "a b", "host\x01:1",
    "\x1b[2J", "caf\xc3\xa9:1", "\xc2\x85", "\xff\xfe",
    "7e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d",
    "7E7124384C7BD5A0824B090C0B973826D140B50BFFCF4063A769C5E58C5C524D",
    "7e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524",
    "7e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d0",
    "-e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d",
    " e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d",
    "0x7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d",
};
#define NINTS (int)(sizeof ints / sizeof ints[0])
#define NSTRS (int)(sizeof strs / sizeof strs[0])

/* The value of an edit (NULL: remove the field); `stages` for copies. */
static json_t *value_of(int kind, int v, const json_t *stages)
{
    switch (kind % 8) {
    case 0: return json_integer(ints[v % NINTS]);
    case 1: return json_string(strs[v % NSTRS]);
    case 2: return NULL;
    case 3: return json_real((v - 128) / 4.0);
    case 4: return v % 3 == 0 ? json_true() : v % 3 == 1 ? json_false() : json_null();
    case 5: return json_integer(v - 128);
    case 6: {
        const json_t *s = json_array_get(stages, (size_t)(v % NSTAGES));
        return v & 4 ? json_array() : s ? json_deep_copy(s) : json_object();
    }
    default: {
        char buf[400];
        int n = 1 + v % 300; /* a long string: addresses past 255 bytes */
        memset(buf, 'a' + v % 26, (size_t)n);
        buf[n] = 0;
        if (v & 1)
            snprintf(buf, sizeof buf, "%s", FP_OWNER);
        return json_string(buf);
    }
    }
}

/* Sets (or removes, v NULL) the field at path "a.b.2.c"; a missing parent
 * makes it a no-op. Takes v. */
static void set_path(json_t *root, const char *path, json_t *v)
{
    char buf[96];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *at = root;
    char *save = NULL, *key = strtok_r(buf, ".", &save);
    for (char *next; key && (next = strtok_r(NULL, ".", &save)); key = next) {
        at = json_is_array(at) ? json_array_get(at, strtoul(key, NULL, 10)) : json_object_get(at, key);
        if (!at) {
            json_decref(v);
            return;
        }
    }
    if (json_is_array(at)) {
        size_t i = strtoul(key, NULL, 10);
        if (!v)
            json_array_remove(at, i);
        else if (i < json_array_size(at))
            json_array_set_new(at, i, v);
        else
            json_array_append_new(at, v);
    } else if (json_is_object(at)) {
        if (v)
            json_object_set_new(at, key, v);
        else
            json_object_del(at, key);
    } else {
        json_decref(v);
    }
}

static void edit(json_t *pl, const uint8_t e[3])
{
    char path[64];
    int f = e[0] % (NFIELDS + (NSTAGES + 1) * (NSTAGE_FIELDS + 1));
    if (f < NFIELDS) {
        snprintf(path, sizeof path, "%s", fields[f]);
    } else {
        f -= NFIELDS;
        int s = f / (NSTAGE_FIELDS + 1), k = f % (NSTAGE_FIELDS + 1);
        if (k == NSTAGE_FIELDS) /* the whole stage; stage 4 is a new one */
            snprintf(path, sizeof path, "stages.%d", s);
        else
            snprintf(path, sizeof path, "stages.%d.%s", s, stage_fields[k]);
    }
    set_path(pl, path, value_of(e[1], e[2], json_object_get(pl, "stages")));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_log_set_level(SL_LOG_OFF);
    json_error_t je;
    if (size && data[0] == '{') {
        json_t *pl = json_loadb((const char *)data, size, 0, &je);
        check_text((const char *)data, size, pl);
        json_decref(pl);
        return 0;
    }
    json_t *pl = json_loads(fp_base_plan, 0, &je);
    if (!pl)
        fu_die("the base plan", je.text);
    for (size_t i = 0; i + 3 <= size && i < 3 * 64; i += 3)
        edit(pl, data + i);
    char *text = json_dumps(pl, JSON_COMPACT);
    if (!text)
        fu_die("json_dumps", "failed");
    check_text(text, strlen(text), pl);
    free(text);
    json_decref(pl);
    return 0;
}
