/* fuzz_plan.h - what the plan parser's fuzz target and its unit test share:
 * a plan as the coordinator signs it (from a real three-device job: four
 * stages, the data owner holding the first and the last; the balancer's
 * report left out, the parser does not read it), and the invariants every
 * accepted plan keeps, checked from the parsed struct alone. */
#ifndef FUZZ_PLAN_H
#define FUZZ_PLAN_H

#include <stdio.h>
#include <string.h>

#include "bal.h"
#include "cert.h"
#include "dev_codec.h"
#include "dev_config.h"
#include "dev_fed.h"
#include "dev_plan.h"
#include "dev_stage.h"

#define FP_OWNER "d74b2d1ed259278f2"   /* stages 0 and 3 */
#define FP_MID "d30f61cfbd34b94f9"     /* stage 1 */
#define FP_LAST "d0c756428a0e3801e"    /* stage 2 */
#define FP_STRANGER "d0123456789abcdef" /* none */

static const char fp_base_plan[] =
    "{\n"
    " \"batch\": 8,\n"
    " \"checkpoint_every\": 10,\n"
    " \"codec_act\": \"none\",\n"
    " \"codec_grad\": \"none\",\n"
    " \"config\": {\"attention_probs_dropout_prob\": 0.1, \"hidden_dropout_prob\": 0.1,\n"
    "  \"hidden_size\": 32, \"intermediate_size\": 48, \"max_position_embeddings\": 24,\n"
    "  \"num_attention_heads\": 2, \"num_hidden_layers\": 3, \"vocab_size\": 400},\n"
    " \"data\": {\"dataset\": \"wiki\", \"owner\": \"" FP_OWNER "\"},\n"
    " \"epoch\": 1,\n"
    " \"job\": \"j49d624e5ad535c6e\",\n"
    " \"job_num\": 5320480578658851950,\n"
    " \"micro_batches\": 4,\n"
    " \"options\": {\"algo\": \"even\", \"batch\": 8, \"checkpoint_every\": 10, \"clip\": 1.0,\n"
    "  \"codec_act\": \"none\", \"codec_grad\": \"none\",\n"
    "  \"devices\": [\"" FP_OWNER "\", \"" FP_MID "\", \"" FP_LAST "\"],\n"
    "  \"first\": 0, \"lr\": 0.002, \"mask_prob\": 0.15, \"micro_batches\": 4,\n"
    "  \"optim_state\": \"fp32\", \"optimizer\": \"adamw\", \"recompute\": false,\n"
    "  \"recompute_attention\": false, \"replan_margin\": 0.1, \"schedule\": \"1f1b\",\n"
    "  \"sealed\": true, \"seed\": 1, \"sequences\": 0, \"shuffle\": true, \"steps\": 20,\n"
    "  \"u_shape\": true, \"warmup\": -1, \"weight_decay\": 0.01},\n"
    " \"predicted_iteration_s\": 0.0018431859804832196,\n"
    " \"schedule\": \"1f1b\",\n"
    " \"sealed\": true,\n"
    " \"seq\": 24,\n"
    " \"stages\": [\n"
    "  {\"address\": \"127.0.0.1:45455\", \"device\": \"" FP_OWNER "\", \"first_unit\": 0,\n"
    "   \"index\": 0, \"last_unit\": 1, \"link_key\":\n"
    "   \"7e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d\",\n"
    "   \"threads\": 1, \"warmup\": 3},\n"
    "  {\"address\": \"127.0.0.1:46815\", \"device\": \"" FP_MID "\", \"first_unit\": 2,\n"
    "   \"index\": 1, \"last_unit\": 2, \"link_key\":\n"
    "   \"d6fea5278bba4daaf41462260f5a0160526e431022e11c126f262d54b3d7135f\",\n"
    "   \"threads\": 1, \"warmup\": 3},\n"
    "  {\"address\": \"127.0.0.1:45973\", \"device\": \"" FP_LAST "\", \"first_unit\": 3,\n"
    "   \"index\": 2, \"last_unit\": 3, \"link_key\":\n"
    "   \"fef5031a74023323ab3eb63e076b7b175506400164579d82033ec02c5ac7773d\",\n"
    "   \"threads\": 1, \"warmup\": 3},\n"
    "  {\"address\": \"127.0.0.1:45455\", \"device\": \"" FP_OWNER "\", \"first_unit\": 4,\n"
    "   \"index\": 3, \"last_unit\": 4, \"link_key\":\n"
    "   \"7e7124384c7bd5a0824b090c0b973826d140b50bffcf4063a769c5e58c5c524d\",\n"
    "   \"threads\": 1, \"warmup\": 0}\n"
    " ],\n"
    " \"start_step\": 1,\n"
    " \"steps\": 20\n"
    "}\n";

/* NULL when p keeps every promise of dev_plan.h for the device self, else
 * the first one it breaks. */
static inline const char *fp_plan_broken(const dev_plan *p, const char *self)
{
    char job[32];
    snprintf(job, sizeof job, "j%016llx", (unsigned long long)p->job_num);
    if (p->job_num > (uint64_t)INT64_MAX || strcmp(job, p->job))
        return "job is job_num's id, job_num < 2^63";
    if (p->epoch < 1)
        return "epoch >= 1";
    sl_err e = {0};
    if (dev_config_validate(&p->config, &e))
        return "the config is valid";
    if (p->batch < 1 || p->batch > DEV_PLAN_MAX_BATCH || p->micro_batches < 1 ||
        p->micro_batches > p->batch || p->batch % p->micro_batches)
        return "batch in range, micro_batches divides it";
    if (p->seq < 1 || p->seq > p->config.max_pos)
        return "seq within max_position_embeddings";
    if (p->steps < 1 || p->steps > DEV_PLAN_MAX_STEPS || p->start_step < 1 ||
        p->start_step > p->steps || p->checkpoint_every < 0)
        return "steps, start_step within 1..steps, checkpoint_every >= 0";
    if (p->codec_act < DEV_CODEC_NONE || p->codec_act > DEV_CODEC_INT8)
        return "codec_act is none, fp16, bf16 or int8";
    if (p->codec_grad < DEV_CODEC_NONE || p->codec_grad > DEV_CODEC_TOPK)
        return "codec_grad is a codec";
    if (p->codec_grad == DEV_CODEC_TOPK ? !(p->topk > 0 && p->topk <= 1) : p->topk != 0)
        return "topk's fraction in (0, 1], 0 for other codecs";
    if ((p->sealed != 0 && p->sealed != 1) || (p->schedule != BAL_1F1B && p->schedule != BAL_GPIPE))
        return "sealed a flag, schedule 1f1b or gpipe";
    const dev_plan_options *o = &p->options;
    if ((o->optimizer != DEV_OPT_ADAMW && o->optimizer != DEV_OPT_LAMB) ||
        (o->bf16_state && o->optimizer != DEV_OPT_ADAMW) || o->warmup < -1 ||
        (o->bf16_compute != 0 && o->bf16_compute != 1))
        return "options: optimizer, bf16 state with adamw only, warmup >= -1, precision a flag";
    int units = p->config.layers + 2, R = p->n_replicas ? p->n_replicas : 1;
    if (p->n_replicas == 1 || p->n_replicas > DEV_PLAN_MAX_REPLICAS)
        return "no replicas, or 2..DEV_PLAN_MAX_REPLICAS";
    if (p->n_stages < 1 || p->n_stages > units * R || !p->stage)
        return "1..units stages per replica";
    int total = 0;
    for (int r = 0; r < p->n_replicas; r++) {
        const dev_plan_replica *rp = &p->replica[r];
        if (rp->first_stage != (r ? p->replica[r - 1].first_stage + p->replica[r - 1].n_stages : 0) ||
            rp->n_stages < 1 || rp->batch < p->micro_batches || rp->batch % p->micro_batches ||
            strcmp(rp->owner, p->stage[rp->first_stage].device))
            return "replicas follow each other, their batches multiples of micro_batches, each "
                   "starting at its owner";
        total += rp->batch;
    }
    if (p->n_replicas && (total != p->batch ||
                          p->replica[R - 1].first_stage + p->replica[R - 1].n_stages != p->n_stages))
        return "the replicas' batches make the batch, their stages the plan's";
    if (p->n_replicas && ((p->sync.mode != DEV_SYNC_STEP && p->sync.mode != DEV_SYNC_OUTER) || p->sync.every < 1 ||
                          p->sync.every > p->steps || (p->sync.mode == DEV_SYNC_STEP && p->sync.every != 1) ||
                          !(p->sync.outer_lr > 0 && p->sync.outer_lr <= 10) ||
                          !(p->sync.outer_momentum >= 0 && p->sync.outer_momentum < 1)))
        return "sync: step every 1, outer every 1..steps, outer_lr and momentum in range";
    int next = 0, mine = 0;
    for (int i = 0; i < p->n_stages; i++) {
        const dev_plan_stage *s = &p->stage[i];
        int r = s->replica;
        if (p->n_replicas && (r < 0 || r >= R || i < p->replica[r].first_stage ||
                              i >= p->replica[r].first_stage + p->replica[r].n_stages))
            return "a stage's replica is the one whose stages hold it";
        if (p->n_replicas && i == p->replica[r].first_stage) {
            if (i > 0 && next != units)
                return "each replica's stages end at the head";
            next = 0;
        }
        if (s->first_unit != next || s->last_unit < s->first_unit)
            return "stage ranges follow each other from unit 0";
        if (!strcmp(s->device, self) && r != p->my_replica)
            return "this device's stages are all of its replica";
        next = s->last_unit + 1;
        if (!memchr(s->device, 0, sizeof s->device) || !cert_valid_device_id(s->device))
            return "a stage's device is a device id";
        size_t n = strnlen(s->address, sizeof s->address);
        if (n < 1 || n > 255)
            return "an address of 1..255 bytes";
        for (size_t k = 0; k < n; k++)
            if ((unsigned char)s->address[k] <= 0x20 || (unsigned char)s->address[k] >= 0x7f)
                return "an address of printable ASCII without spaces";
        if (s->warmup < 0 || s->warmup > p->micro_batches || s->threads < 1 ||
            s->threads > DEV_PLAN_MAX_THREADS)
            return "a stage's warmup and threads in range";
        if (!strcmp(s->device, self)) {
            if (mine >= p->n_local || p->local[mine] != i)
                return "local lists exactly this device's stages, ascending";
            mine++;
        }
    }
    if (next != units)
        return "the stages end at the head: every unit on exactly one stage";
    if (mine != p->n_local || mine < 1 || mine > DEV_PLAN_MAX_LOCAL)
        return "this device holds 1..DEV_PLAN_MAX_LOCAL stages";
    return NULL;
}

/* NULL when msg is a refusal's message: it names the plan and holds no
 * control byte. */
static inline const char *fp_refusal_broken(const char *msg)
{
    if (strncmp(msg, "plan: ", 6) || !msg[6])
        return "a refusal says 'plan: ' and why";
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
        if (*c < 0x20 || *c == 0x7f || (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f))
            return "a refusal holds no control byte (C0, DEL, C1)";
    return NULL;
}

#endif
