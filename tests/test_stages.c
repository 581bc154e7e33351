/* Splitting the model into 2, 3 and 5 stages run in sequence gives bit for
 * bit the loss, gradients and updated weights of one stage (same micro-
 * batches, dropout on, AdamW and LAMB, clipping); 4 micro-batches instead of
 * 1 give the same within 1e-6 (the sums are grouped differently). The two
 * copies of the tied word embeddings stay identical. */
#include <stdio.h>
#include <string.h>

#include "dev_testutil.h"
#include "kn_testutil.h"

static const dev_config cfg = {.hidden = 48, .layers = 3, .heads = 3, .intermediate = 80,
                               .vocab = 97, .max_pos = 32, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};
enum { B = 4, T = 24, STEPS = 2 };

typedef struct run {
    dev_train *tr;
    int steps;
    double loss[STEPS];
} run;

/* `steps` steps; the last leaves its gradients without updating. */
static void train(run *r, const int *bounds, int n, int micro, const dev_optim *o, int steps)
{
    r->steps = steps;
    sl_err err = {0};
    r->tr = dev_train_create(&cfg, bounds, n, B, T, micro, 7, &err);
    CHECKF(r->tr != NULL, "%s", err.msg);
    dt_batch b;
    for (int s = 0; s < steps && r->tr; s++) {
        dt_make_batch(&b, B, T, cfg.vocab, 100 + 10 * (uint64_t)s);
        dev_batch db = dt_view(&b, (uint64_t)s * B);
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
                CHECKF(e <= 1e-6, "%s: %s of %s: rel error %.3g", what,
                       grad ? "gradient" : "value", t[k].name, e);
            }
        }
    for (int i = 0; i < r->steps; i++) {
        if (bitwise)
            CHECKF(ref->loss[i] == r->loss[i], "%s: loss %.17g vs %.17g", what, r->loss[i],
                   ref->loss[i]);
        else
            CHECK_NEAR(r->loss[i], ref->loss[i], 1e-6 * ref->loss[i]);
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

/* The balancer's per-unit costs add up to the model. */
static void test_unit_costs(void)
{
    size_t params = 0;
    double flops = 0;
    for (int u = 0; u < dev_unit_count(&cfg); u++) {
        dev_unit_cost uc;
        dev_unit_cost_of(&cfg, u, T, 0.15, &uc);
        params += uc.param_bytes / 4;
        CHECK(uc.optim_bytes == 2 * uc.param_bytes && uc.fwd_flops > 0 && uc.bwd_flops >= uc.fwd_flops);
        CHECK(u == dev_unit_head(&cfg) ? uc.boundary_bytes == 0
                                       : uc.boundary_bytes == (size_t)T * cfg.hidden * 4);
        flops += uc.fwd_flops;
    }
    CHECK(params == dev_config_param_count(&cfg) + (size_t)cfg.vocab * cfg.hidden);
    CHECK(flops > 2.0 * T * dev_config_param_count(&cfg) * 0.5);
}

int main(void)
{
    RUN(test_unit_costs);
    RUN(test_adamw);
    RUN(test_lamb);
    return sl_test_done();
}
