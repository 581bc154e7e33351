/* Splitting the model into 2, 3 and 5 stages run in sequence gives bit for
 * bit the loss, gradients and updated weights of one stage (same micro-
 * batches, dropout on, AdamW and LAMB, clipping); 4 micro-batches instead of
 * 1 give the same within 1e-6 (the sums are grouped differently). The two
 * copies of the tied word embeddings stay identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "dev_unitprof.h"
#include "dev_testutil.h"
#include "kn_testutil.h"

static const dev_config cfg = {.hidden = 48, .layers = 3, .heads = 3, .intermediate = 80,
                               .vocab = 97, .max_pos = 32, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};
/* The same model with the sequence-classification head (7 classes; its
 * own dropout, 0.2, on the pooled [CLS] rows). */
static const dev_config ccfg = {.hidden = 48, .layers = 3, .heads = 3, .intermediate = 80,
                                .vocab = 97, .max_pos = 32, .type_vocab = 2, .ln_eps = 1e-12f,
                                .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                                .init_range = 0.02f, .task = DEV_TASK_CLASSIFY, .num_labels = 7,
                                .cls_dropout = 0.2f};
static const dev_config *train_cfg = &cfg; /* the model train() trains */
enum { B = 4, T = 24, STEPS = 2 };

typedef struct run {
    dev_train *tr;
    int steps;
    double loss[4]; /* STEPS, or 3 for test_bf16_state */
} run;

static unsigned train_flags;  /* dev_stage_create flags of train() */
static double micro_tol = 1e-6; /* compare()'s bound when not bitwise */
static int train_schedule;    /* BAL_1F1B (0) or BAL_GPIPE */

/* `steps` steps; the last leaves its gradients without updating. */
static void train(run *r, const int *bounds, int n, int micro, const dev_optim *o, int steps)
{
    r->steps = steps;
    sl_err err = {0};
    dev_train_opts to = {.schedule = train_schedule, .flags = train_flags};
    r->tr = dev_train_open(train_cfg, bounds, n, B, T, micro, 7, &to, &err);
    CHECKF(r->tr != NULL, "%s", err.msg);
    dt_batch b;
    for (int s = 0; s < steps && r->tr; s++) {
        dt_make_batch(&b, B, T, cfg.vocab, 100 + 10 * (uint64_t)s);
        if (train_cfg->task == DEV_TASK_CLASSIFY)
            dt_classify(&b, train_cfg->num_labels, 100 + 10 * (uint64_t)s);
        dev_batch db = dt_view(&b);
        dev_step_info info;
        /* the last step leaves its gradients for comparison, before the update */
        int rc = s + 1 < steps ? dev_train_step(r->tr, &db, o, &info, &err)
                               : dev_train_grads(r->tr, &db, (uint64_t)s + 1, &info, &err);
        CHECKF(rc == 0, "%s", err.msg);
        r->loss[s] = info.loss;
        dt_free_batch(&b);
    }
}

/* Every tensor of `ref` (one stage) against the same name in `r`: values and
 * gradients bitwise, or gradients within 1e-6 (then on the first step only,
 * from the same weights: after an update the runs differ by more than the
 * gradients did, since Adam's first steps are about sign(g) and an element
 * whose gradient is ~0 may move either way by lr). */
static void compare(run *ref, run *r, int bitwise, const char *what)
{
    dev_stage *s = dev_train_stage(ref->tr, 0);
    int nt;
    const dev_tensor *t = dev_stage_tensors(s, &nt);
    double worst = 0;
    int same = 1;
    for (int k = 0; k < nt; k++)
        for (int grad = bitwise ? 0 : 1; grad < 2; grad++) {
            size_t n;
            float *x = dt_find(r->tr, t[k].name, grad, &n);
            CHECKF(x && n == t[k].numel, "%s: %s missing", what, t[k].name);
            if (!x)
                continue;
            const float *want = (grad ? dev_stage_grads(s, NULL) : dev_stage_params(s, NULL)) +
                                t[k].offset;
            if (bitwise) {
                int eq = kt_bitwise_equal(x, want, n);
                CHECKF(eq, "%s: %s of %s differs", what, grad ? "gradient" : "value", t[k].name);
                same &= eq;
            } else {
                double e = kt_rel(x, want, n);
                worst = e > worst ? e : worst;
                CHECKF(e <= micro_tol, "%s: %s of %s: rel error %.3g", what,
                       grad ? "gradient" : "value", t[k].name, e);
            }
        }
    for (int i = 0; i < r->steps; i++) {
        if (bitwise)
            CHECKF(ref->loss[i] == r->loss[i], "%s: loss %.17g vs %.17g", what, r->loss[i],
                   ref->loss[i]);
        else
            CHECK_NEAR(r->loss[i], ref->loss[i], micro_tol * ref->loss[i]);
    }
    /* The head's copy of the word embeddings equals the embeddings. */
    size_t n1 = 0, n2 = 0;
    float *a = dt_find(r->tr, "bert.embeddings.word_embeddings.weight", 0, &n1);
    float *c = dt_find(r->tr, "cls.predictions.decoder.weight", 0, &n2);
    if (a && c && n1 == n2)
        CHECKF(kt_bitwise_equal(a, c, n1), "%s: tied copies differ", what);
    if (bitwise)
        printf("    %-34s %s\n", what, same ? "bitwise equal" : "DIFFERENT");
    else
        printf("    %-34s worst rel %.3g\n", what, worst);
}

static void splits(const dev_optim *o)
{
    static const int one[] = {0, 5}, two[] = {0, 3, 5}, three[] = {0, 2, 4, 5},
                     five[] = {0, 1, 2, 3, 4, 5};
    static const struct {
        const int *b;
        int n;
        const char *name;
    } sp[] = {{two, 2, "2 stages"}, {three, 3, "3 stages"}, {five, 5, "5 stages"}};
    for (int mi = 0; mi < 2; mi++) {
        int micro = mi ? 4 : 1;
        run ref = {0};
        train(&ref, one, 1, micro, o, STEPS);
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            run r = {0};
            train(&r, sp[i].b, sp[i].n, micro, o, STEPS);
            char what[64];
            snprintf(what, sizeof what, "%s, %d micro-batch%s", sp[i].name, micro,
                     micro > 1 ? "es" : "");
            if (ref.tr && r.tr)
                compare(&ref, &r, 1, what);
            dev_train_free(r.tr);
        }
        if (micro == 4) {
            run r1 = {0}, r4 = {0};
            train(&r1, one, 1, 1, o, 1);
            train(&r4, one, 1, 4, o, 1);
            if (r1.tr && r4.tr)
                compare(&r1, &r4, 0, "1 stage, 4 vs 1 micro-batches");
            dev_train_free(r1.tr);
            dev_train_free(r4.tr);
        }
        dev_train_free(ref.tr);
    }
}

static void test_adamw(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f; /* small enough to clip */
    splits(&o);
}

static void test_lamb(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.kind = DEV_OPT_LAMB;
    o.lr = 1e-3f;
    o.warmup = 1;
    o.total = 10;
    splits(&o);
}

/* The classification head: every split, 1 and 4 micro-batches, and 4 in
 * flight with recomputation, bit for bit the one stage (dropout on; the
 * head's on the [CLS] rows keyed by the global sequence, as every other). */
static void test_classify(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f;
    train_cfg = &ccfg;
    splits(&o);
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5}, head[] = {0, 4, 5};
    run ref = {0}, r = {0}, rh = {0};
    train(&ref, one, 1, 4, &o, STEPS);
    train_flags = DEV_STAGE_RECOMPUTE;
    train(&r, three, 3, 4, &o, STEPS);
    train_flags = 0;
    train(&rh, head, 2, 4, &o, STEPS); /* the head alone on a stage */
    if (ref.tr && r.tr)
        compare(&ref, &r, 1, "classify, 3 stages, 4 in flight");
    if (ref.tr && rh.tr)
        compare(&ref, &rh, 1, "classify, the head alone");
    /* no tied embeddings to exchange: no stage has a role */
    for (int i = 0; r.tr && i < 3; i++)
        CHECK(dev_stage_tied_role(dev_train_stage(r.tr, i)) == DEV_TIED_NONE);
    dev_train_free(ref.tr);
    dev_train_free(r.tr);
    dev_train_free(rh.tr);
    train_cfg = &cfg;
}

/* The runner on threads with several micro-batches in flight (one stash
 * slot each), in the 1F1B order (there with DEV_STAGE_RECOMPUTE: stash only
 * the layer outputs, recompute the rest in backward) and in the GPipe order
 * (with DEV_STAGE_RECOMPUTE_ATTN), gives bit for bit what one stage gives:
 * the stash keeps each micro-batch's activations apart, and the global norm
 * adds every stage's per-tensor sums in one order. */
static void test_in_flight(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f;
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5}, four[] = {0, 1, 3, 4, 5};
    run ref = {0}; /* one stage, so compare() sees every tensor */
    train(&ref, one, 1, 4, &o, STEPS);
    for (int sched = 0; sched < 2; sched++) {
        train_schedule = sched ? BAL_GPIPE : BAL_1F1B;
        train_flags = sched ? DEV_STAGE_RECOMPUTE_ATTN : DEV_STAGE_RECOMPUTE;
        run r = {0}, r4 = {0};
        train(&r, three, 3, 4, &o, STEPS);
        train(&r4, four, 4, 4, &o, STEPS);
        if (ref.tr && r.tr)
            compare(&ref, &r, 1, sched ? "3 stages, 4 in flight, GPipe, attn" : "3 stages, 4 in flight, 1F1B, recompute");
        if (ref.tr && r4.tr)
            compare(&ref, &r4, 1, sched ? "4 stages, GPipe, attn" : "4 stages, 1F1B, recompute");
        dev_train_free(r.tr);
        dev_train_free(r4.tr);
    }
    train_schedule = BAL_1F1B;
    train_flags = 0;
    dev_train_free(ref.tr);
}

/* bf16 moments with stochastic rounding keyed by tensor name, step and
 * element: every split still gives bit for bit the one-stage result (three
 * steps: two updates, the second from rounded moments, then gradients). */
static void test_bf16_state(void)
{
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f;
    static const int one[] = {0, 5}, two[] = {0, 3, 5}, five[] = {0, 1, 2, 3, 4, 5};
    train_flags = DEV_STAGE_BF16_STATE;
    run ref = {0}, r2 = {0}, r5 = {0};
    train(&ref, one, 1, 1, &o, 3);
    train(&r2, two, 2, 1, &o, 3);
    train(&r5, five, 5, 4, &o, 3);
    run ref4 = {0};
    train(&ref4, one, 1, 4, &o, 3);
    if (ref.tr && r2.tr)
        compare(&ref, &r2, 1, "bf16 state, 2 stages");
    if (ref4.tr && r5.tr)
        compare(&ref4, &r5, 1, "bf16 state, 5 stages, 4 micro");
    /* and LAMB is refused, not run with fp32 semantics */
    dev_optim l = o;
    l.kind = DEV_OPT_LAMB;
    dt_batch b;
    dt_make_batch(&b, B, T, cfg.vocab, 100);
    dev_batch db = dt_view(&b);
    dev_step_info info;
    sl_err err = {0};
    if (ref.tr)
        CHECK(dev_train_step(ref.tr, &db, &l, &info, &err) == -1 && err.code == SL_ENOTSUP &&
              strstr(err.msg, "AdamW only"));
    dt_free_batch(&b);
    train_flags = 0;
    dev_train_free(ref.tr);
    dev_train_free(r2.tr);
    dev_train_free(r5.tr);
    dev_train_free(ref4.tr);
}

/* bf16 compute (DEV_STAGE_BF16_COMPUTE): every split, in sequence and on
 * threads with micro-batches in flight (recomputing, in the 1F1B and GPipe
 * orders), with bf16 moments too, gives the one-stage bf16 result bit for
 * bit, as fp32 does: the same ops in the same order, the products' bits
 * fixed by their shapes. 4 micro-batches against 1: other shapes, so other
 * kernels may sum a row in another order, and a product's output rounded to
 * bf16 may then land on the other side of a tie; the bound allows that
 * (4e-3, a bf16 half-ulp of the largest gradient; measured here 3e-7, as in
 * fp32: no rounding point moved). A stage on a backend without bf16 is
 * refused. */
static void test_bf16_compute(void)
{
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err)) {
        printf("    skipped, this CPU has no bf16: %s\n", err.msg);
        return;
    }
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f;
    train_flags = DEV_STAGE_BF16_COMPUTE;
    micro_tol = 4e-3;
    splits(&o);
    micro_tol = 1e-6;
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5}, four[] = {0, 1, 3, 4, 5};
    run ref = {0}, r = {0}, r4 = {0}, refb = {0}, rb = {0};
    train(&ref, one, 1, 4, &o, STEPS);
    train_flags = DEV_STAGE_BF16_COMPUTE | DEV_STAGE_RECOMPUTE;
    train(&r, three, 3, 4, &o, STEPS);
    train_flags = DEV_STAGE_BF16_COMPUTE | DEV_STAGE_RECOMPUTE_ATTN;
    train_schedule = BAL_GPIPE;
    train(&r4, four, 4, 4, &o, STEPS);
    train_schedule = BAL_1F1B;
    train_flags = DEV_STAGE_BF16_COMPUTE | DEV_STAGE_BF16_STATE;
    train(&refb, one, 1, 1, &o, 3);
    train(&rb, three, 3, 1, &o, 3);
    if (ref.tr && r.tr)
        compare(&ref, &r, 1, "bf16, 3 stages, 4 in flight, recompute");
    if (ref.tr && r4.tr)
        compare(&ref, &r4, 1, "bf16, 4 stages, GPipe, attn");
    if (refb.tr && rb.tr)
        compare(&refb, &rb, 1, "bf16 compute and state, 3 stages");
    train_flags = 0;
    dev_train_free(ref.tr);
    dev_train_free(r.tr);
    dev_train_free(r4.tr);
    dev_train_free(refb.tr);
    dev_train_free(rb.tr);
    /* a backend without bf16 compute is refused with its reason */
    kn_be nobf = *kn_be_cpu();
    nobf.bf16_check = NULL;
    nobf.name = "plain";
    CHECK(dev_stage_create(&cfg, 0, 4, B, T, 1, 7, &nobf, DEV_STAGE_BF16_COMPUTE, &err) == NULL &&
          err.code == SL_ENOTSUP && strstr(err.msg, "plain"));
}

/* The classification head in bf16 compute: its two products on bf16
 * operands as the MLM head's are; every split, 4 in flight with
 * recomputation and the head alone give the one-stage bf16 result bit for
 * bit, and the first step's loss stays within 1% of fp32's (same weights,
 * same batch: only the products' rounding differs). */
static void test_classify_bf16(void)
{
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err)) {
        printf("    skipped, this CPU has no bf16: %s\n", err.msg);
        return;
    }
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    o.clip = 0.5f;
    train_cfg = &ccfg;
    train_flags = DEV_STAGE_BF16_COMPUTE;
    micro_tol = 4e-3; /* as test_bf16_compute's, for the same reason */
    splits(&o);
    micro_tol = 1e-6;
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5}, head[] = {0, 4, 5};
    run ref = {0}, r = {0}, rh = {0}, r32 = {0};
    train(&ref, one, 1, 4, &o, STEPS);
    train_flags = DEV_STAGE_BF16_COMPUTE | DEV_STAGE_RECOMPUTE;
    train(&r, three, 3, 4, &o, STEPS);
    train_flags = DEV_STAGE_BF16_COMPUTE;
    train(&rh, head, 2, 4, &o, STEPS);
    train_flags = 0;
    train(&r32, one, 1, 4, &o, STEPS);
    if (ref.tr && r.tr)
        compare(&ref, &r, 1, "bf16 classify, 3 stages, 4 in flight");
    if (ref.tr && rh.tr)
        compare(&ref, &rh, 1, "bf16 classify, the head alone");
    if (ref.tr && r32.tr) {
        double rel = fabs(ref.loss[0] - r32.loss[0]) / r32.loss[0];
        printf("    bf16 classify, first loss %.6f, fp32 %.6f (rel %.2g)\n", ref.loss[0],
               r32.loss[0], rel);
        CHECKF(rel < 0.01 && ref.loss[0] != r32.loss[0], "bf16 loss %.9g vs fp32 %.9g",
               ref.loss[0], r32.loss[0]);
    }
    dev_train_free(ref.tr);
    dev_train_free(r.tr);
    dev_train_free(rh.tr);
    dev_train_free(r32.tr);
    train_cfg = &cfg;
    /* the head alone, from the same input and weights: its own products
     * are bf16 (the logits differ from fp32's, within bf16's rounding) */
    int K = ccfg.num_labels, hu = dev_unit_head(&ccfg);
    dev_stage *h16 = dev_stage_create(&ccfg, hu, hu, B, T, 1, 7, NULL, DEV_STAGE_BF16_COMPUTE, &err);
    dev_stage *h32 = dev_stage_create(&ccfg, hu, hu, B, T, 1, 7, NULL, 0, &err);
    CHECKF(h16 && h32, "%s", err.msg);
    dt_batch b;
    dt_make_batch(&b, B, T, ccfg.vocab, 900);
    dt_classify(&b, K, 901);
    float *in = malloc((size_t)B * T * ccfg.hidden * sizeof *in);
    for (size_t i = 0; i < (size_t)B * T * ccfg.hidden; i++)
        in[i] = (float)sl_rng_u32(3, 4, i) / 4294967296.0f - 0.5f;
    dev_micro mb = {.B = B, .T = T, .tokens = b.tok, .segments = b.seg, .valid = b.valid,
                    .labels = b.lab, .seed = 7, .loss_scale = 1};
    float l16[B * 7], l32[B * 7];
    double s16 = 0, s32 = 0;
    int m16 = 0, m32 = 0;
    if (h16 && h32) {
        CHECKF(dev_stage_forward_logits(h16, 0, &mb, in, l16, B * 7, &m16, &s16, &err) == 0 &&
                   dev_stage_forward_logits(h32, 0, &mb, in, l32, B * 7, &m32, &s32, &err) == 0,
               "%s", err.msg);
        double e = kt_rel(l16, l32, (size_t)B * K);
        printf("    bf16 classify, the head's logits against fp32: rel %.3g\n", e);
        CHECKF(m16 == B && m32 == B && e > 0 && e < 2e-2, "logits rel %.3g", e);
    }
    free(in);
    dt_free_batch(&b);
    dev_stage_free(h16);
    dev_stage_free(h32);
}

/* The balancer's units (bal_bert_units, the one cost description) for c
 * at micro-batch bm x T. */
static bal_unit *units_of(const dev_config *c, int bm, int *n)
{
    bal_bert bb;
    dev_config_bert(c, &bb);
    bal_unit *bu = NULL;
    sl_err err = {0};
    CHECKF(bal_bert_units(&bb, bm, T, &bu, n, &err) == 0 && *n == dev_unit_count(c), "%s",
           err.msg);
    return bu;
}

/* The cost model's stash per micro-batch is what a stage really allocates
 * per in-flight slot. One case: stages u0..u1 with 1 and 3 slots; the
 * difference per slot is the stash, against the cost model's (plus the
 * input copy of a middle stage). */
static void stash_case(const dev_config *c, int u0, int u1, const char *what)
{
    sl_err err = {0};
    enum { BM = 2 };
    int n = 0;
    bal_unit *bu = units_of(c, BM, &n);
    dev_stage *s1 = dev_stage_create(c, u0, u1, BM, T, 1, 7, NULL, 0, &err);
    dev_stage *s3 = dev_stage_create(c, u0, u1, BM, T, 3, 7, NULL, 0, &err);
    CHECKF(s1 && s3, "%s", err.msg);
    if (s1 && s3 && bu) {
        double per_slot = (double)(dev_stage_bytes(s3) - dev_stage_bytes(s1)) / 2;
        double model = u0 > 0 ? (double)BM * T * c->hidden * 4 : 0; /* the input copy */
        for (int u = u0; u <= u1; u++)
            model += (double)bu[u].stash_bytes;
        printf("    %s, stash per slot: stage %.0f bytes, cost model %.0f\n", what, per_slot, model);
        /* (the stage pads every tensor to 16 floats) */
        CHECKF(per_slot >= model && per_slot <= model * 1.02, "%s: stage %.0f vs model %.0f",
               what, per_slot, model);
    }
    free(bu);
    dev_stage_free(s1);
    dev_stage_free(s3);
}

static void test_stash_cost(void)
{
    stash_case(&cfg, 1, cfg.layers, "middle stage");
    stash_case(&cfg, 0, cfg.layers, "first stage"); /* the embeddings' stash instead of an input copy */
    /* the classification head's rows are allocated with the slot */
    stash_case(&ccfg, 2, ccfg.layers + 1, "classification head");
    stash_case(&ccfg, ccfg.layers + 1, ccfg.layers + 1, "classification head alone");
}

/* The cost model's parameters per unit are the tensors a stage of that unit
 * holds (the head with its own copy of the word embeddings), its optimizer
 * state AdamW's two moments and the gradient, and the head runs at the
 * masked positions only. */
static void unit_costs(const dev_config *c)
{
    enum { BM = 4 };
    int n = 0;
    bal_unit *bu = units_of(c, BM, &n);
    size_t params = 0;
    for (int u = 0; u < n && bu; u++) {
        dev_tensor *ts = NULL;
        int nt = 0;
        size_t total = 0, numel = 0;
        sl_err err = {0};
        CHECKF(dev_model_layout(c, u, u, &ts, &nt, &total, &err) == 0, "%s", err.msg);
        for (int i = 0; i < nt; i++)
            numel += ts[i].numel;
        free(ts);
        CHECKF(bu[u].param_bytes == 4 * numel, "unit %d: parameters %llu, the stage holds %zu "
               "floats", u, (unsigned long long)bu[u].param_bytes, numel);
        CHECK(bu[u].optim_bytes == 3 * bu[u].param_bytes);
        CHECK(bu[u].fwd_flops > 0 && bu[u].bwd_flops >= bu[u].fwd_flops);
        CHECK(u == dev_unit_head(c) ? bu[u].out_bytes == 0
                                    : bu[u].out_bytes == (uint64_t)BM * T * c->hidden * 4);
        params += numel;
    }
    if (c->task == DEV_TASK_CLASSIFY) {
        /* the whole model; the head at the [CLS] rows: 2 B (H H + H K) */
        CHECK(params == dev_config_param_count(c));
        double H = c->hidden, K = c->num_labels;
        CHECKF(bu && bu[n - 1].fwd_flops >= 2 * BM * (H * H + H * K) &&
               bu[n - 1].fwd_flops < 2 * BM * T * H * H,
               "classification head forward %.3g FLOPs", bu ? bu[n - 1].fwd_flops : 0);
        free(bu);
        return;
    }
    /* the whole model, plus the head's copy of the word embeddings */
    CHECK(params == dev_config_param_count(c) + (size_t)c->vocab * c->hidden);
    /* the head's decoder at the masked positions: 2 M H V, not 2 N H V */
    if (bu) {
        double M = BAL_MASK_FRAC * BM * T, H = c->hidden, V = c->vocab;
        double h = bu[n - 1].fwd_flops;
        CHECKF(h >= 2 * M * H * V && h < 0.5 * 2 * BM * T * H * V, "head forward %.3g FLOPs", h);
    }
    free(bu);
}

static void test_unit_costs(void)
{
    unit_costs(&cfg);
    unit_costs(&ccfg);
}

/* dev_unit_times, the profile a device reports: every unit's forward,
 * backward and (when asked) optimizer step take time; every encoder layer
 * gets the one layer's; AdamW, LAMB and bf16 state all run. */
static void test_unit_times(void)
{
    enum { NU = 5 }; /* embeddings, 3 layers, head */
    double fwd[NU], bwd[NU], opt[NU];
    dev_optim o;
    dev_optim_default(&o);
    sl_err err = {0};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < NU; u++)
            fwd[u] = bwd[u] = opt[u] = 0;
        o.kind = k == 1 ? DEV_OPT_LAMB : DEV_OPT_ADAMW;
        unsigned flags = k == 2 ? DEV_STAGE_BF16_STATE : 0;
        CHECKF(dev_unit_times(&cfg, 2, T, NULL, 3, &o, flags, fwd, bwd, opt, &err) == 0, "%s",
               err.msg);
        for (int u = 0; u < NU; u++)
            CHECKF(fwd[u] > 0 && bwd[u] > 0 && opt[u] > 0 && opt[u] < 1, "case %d unit %d: %g %g %g",
                   k, u, fwd[u], bwd[u], opt[u]);
        CHECK(fwd[1] == fwd[3] && bwd[2] == bwd[3] && opt[1] == opt[3]);
    }
    /* the classification head's unit */
    for (int u = 0; u < NU; u++)
        fwd[u] = bwd[u] = opt[u] = 0;
    CHECKF(dev_unit_times(&ccfg, 2, T, NULL, 3, &o, 0, fwd, bwd, opt, &err) == 0, "%s", err.msg);
    CHECK(fwd[4] > 0 && bwd[4] > 0 && opt[4] > 0);
    /* without the optimizer: only forward and backward */
    CHECK(dev_unit_times(&cfg, 2, T, NULL, 1, NULL, 0, fwd, bwd, NULL, &err) == 0 && fwd[4] > 0);
    CHECK(dev_unit_times(&cfg, 0, T, NULL, 1, NULL, 0, fwd, bwd, opt, &err) != 0 &&
          strstr(err.msg, "micro-batch 0x24"));
}

int main(void)
{
    RUN(test_unit_costs);
    RUN(test_unit_times);
    RUN(test_stash_cost);
    RUN(test_bf16_state);
    RUN(test_in_flight);
    RUN(test_adamw);
    RUN(test_lamb);
    RUN(test_classify);
    RUN(test_bf16_compute);
    RUN(test_classify_bf16);
    return sl_test_done();
}
