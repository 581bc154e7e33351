/* be_testutil.h - training on a backend (kn_be.h) against the same training
 * on the CPU backend: shared by test_backend.c (the shadow backend, always,
 * bitwise) and test_dev_cuda.c (CUDA when a GPU exists, within tolerances).
 *
 * What it compares: per step the loss and the global gradient norm; after
 * the steps, every stage's parameters, gradients and optimizer state (pulled
 * to the host); an evaluation pass; checkpoints written from one backend and
 * read on the other (then one more step on both, which fails unless the
 * loaded state really reached the backend); and two stages driven directly
 * with two micro-batches in flight and the tied-embedding protocol. */
#ifndef BE_TESTUTIL_H
#define BE_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_ckpt.h"
#include "dev_testutil.h"
#include "kn_be.h"
#include "kn_testutil.h"

static const dev_config be_cfg = {.hidden = 48, .layers = 3, .heads = 3, .intermediate = 80,
                                  .vocab = 97, .max_pos = 32, .type_vocab = 2, .ln_eps = 1e-12f,
                                  .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                                  .init_range = 0.02f};
enum { BE_B = 4, BE_T = 24, BE_STEPS = 3 };

/* Relative tolerances (kt_rel); 0 means bit for bit. */
typedef struct be_tol {
    double loss, params, grads, moments;
} be_tol;

static int be_same(const char *what, const float *got, const float *want, size_t n, double tol)
{
    if (tol == 0) {
        int eq = kt_bitwise_equal(got, want, n);
        CHECKF(eq, "%s: not bit-identical (rel %.3g)", what, kt_rel(got, want, n));
        return eq;
    }
    double e = kt_rel(got, want, n);
    CHECKF(e <= tol, "%s: rel error %.3g > %g", what, e, tol);
    return e <= tol;
}

static void be_same_scalar(const char *what, double got, double want, double tol)
{
    if (tol == 0)
        CHECKF(got == want, "%s: %.17g vs %.17g", what, got, want);
    else
        CHECKF(fabs(got - want) <= tol * fabs(want), "%s: %.9g vs %.9g", what, got, want);
}

/* Every stage of `got` (on the backend) against `want` (CPU). */
static void be_same_state(const char *what, dev_train *got, dev_train *want, const be_tol *tol,
                          int grads)
{
    sl_err err = {0};
    for (int i = 0; i < dev_train_nstages(want); i++) {
        dev_stage *g = dev_train_stage(got, i), *w = dev_train_stage(want, i);
        CHECKF(dev_stage_pull(g, &err) == 0 && dev_stage_pull(w, &err) == 0, "%s", err.msg);
        size_t n;
        float *wp = dev_stage_params(w, &n);
        char buf[160];
        snprintf(buf, sizeof buf, "%s: stage %d parameters", what, i);
        be_same(buf, dev_stage_params(g, NULL), wp, n, tol->params);
        snprintf(buf, sizeof buf, "%s: stage %d optimizer state", what, i);
        be_same(buf, dev_stage_optim_state(g, NULL), dev_stage_optim_state(w, NULL), 2 * n,
                tol->moments);
        if (grads) {
            snprintf(buf, sizeof buf, "%s: stage %d gradients", what, i);
            be_same(buf, dev_stage_grads(g, NULL), dev_stage_grads(w, NULL), n, tol->grads);
        }
    }
}

static void be_one_step(dev_train *tr, const dev_optim *o, int s, dev_step_info *info)
{
    sl_err err = {0};
    dt_batch b;
    dt_make_batch(&b, BE_B, BE_T, be_cfg.vocab, 300 + 10 * (uint64_t)s);
    dev_batch db = dt_view(&b);
    memset(info, 0, sizeof *info);
    CHECKF(dev_train_step(tr, &db, o, info, &err) == 0, "step %d: %s", s, err.msg);
    dt_free_batch(&b);
}

/* BE_STEPS steps on the CPU and on `be` with `n` stages and `micro`
 * micro-batches; then evaluation; returns both trainers for more checks. */
static void be_train_pair(const kn_be *be, unsigned flags, const be_tol *tol, const int *bounds,
                          int n, int micro, const dev_optim *o, const char *what,
                          dev_train **cpu_out, dev_train **be_out)
{
    sl_err err = {0};
    /* bf16 moments change the numerics, so both sides have them; recompute
     * does not, so only the backend's side does */
    dev_train *c = dev_train_create_on(&be_cfg, bounds, n, BE_B, BE_T, micro, 7, NULL,
                                       flags & ~(DEV_STAGE_RECOMPUTE | DEV_STAGE_RECOMPUTE_ATTN),
                                       &err);
    dev_train *g = dev_train_create_on(&be_cfg, bounds, n, BE_B, BE_T, micro, 7, be, flags, &err);
    CHECKF(c && g, "%s: %s", what, err.msg);
    *cpu_out = c;
    *be_out = g;
    if (!c || !g)
        return;
    CHECK(!strcmp(dev_stage_backend(dev_train_stage(g, 0)), be->name));
    be_same_state(what, g, c, tol, 0); /* the same initial weights reached the backend */
    for (int s = 0; s < BE_STEPS; s++) {
        dev_step_info ic, ig;
        be_one_step(c, o, s, &ic);
        be_one_step(g, o, s, &ig);
        char buf[128];
        snprintf(buf, sizeof buf, "%s: loss of step %d", what, s + 1);
        be_same_scalar(buf, ig.loss, ic.loss, tol->loss);
        snprintf(buf, sizeof buf, "%s: gradient norm of step %d", what, s + 1);
        be_same_scalar(buf, ig.grad_norm, ic.grad_norm, tol->grads);
        CHECK(ig.masked == ic.masked && ic.masked > 0);
    }
    be_same_state(what, g, c, tol, 1);
    dt_batch b;
    dt_make_batch(&b, BE_B, BE_T, be_cfg.vocab, 999);
    dev_batch db = dt_view(&b);
    double lc = 0, lg = 0;
    int mc = 0, mg = 0;
    CHECKF(dev_train_eval(c, &db, &lc, &mc, &err) == 0, "%s", err.msg);
    CHECKF(dev_train_eval(g, &db, &lg, &mg, &err) == 0, "%s", err.msg);
    char buf[128];
    snprintf(buf, sizeof buf, "%s: evaluation loss", what);
    be_same_scalar(buf, lg, lc, tol->loss);
    CHECK(mc == mg && mc > 0);
    dt_free_batch(&b);
}

typedef struct be_case {
    const int *b;
    int n, micro, lamb;
    unsigned flags; /* of the backend's side; the CPU's never recomputes */
    const char *name;
} be_case;

static void be_run_cases(const kn_be *be, const be_tol *tol, const be_case *cases, size_t ncases);

/* Training on `be` against the CPU for several splits and optimizers. */
static void be_check_training(const kn_be *be, const be_tol *tol)
{
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5};
    static const be_case cases[] = {
        {one, 1, 1, 0, 0, "1 stage, adamw"},
        {one, 1, 2, 1, 0, "1 stage, 2 micro-batches, lamb"},
        {three, 3, 2, 0, 0, "3 stages, 2 micro-batches, adamw"},
        {three, 3, 2, 1, DEV_STAGE_RECOMPUTE, "3 stages, 2 micro, lamb, recompute"},
        {three, 3, 2, 0, DEV_STAGE_BF16_STATE | DEV_STAGE_RECOMPUTE_ATTN,
         "3 stages, 2 micro, bf16 state, attn"},
    };
    be_run_cases(be, tol, cases, sizeof cases / sizeof cases[0]);
}

/* The same in bf16 compute, on both sides (the CPU's needs AVX512_BF16 or
 * AMX: without them, nothing to compare with, said so). */
static void be_check_training_bf16(const kn_be *be, const be_tol *tol)
{
    static const int one[] = {0, 5}, three[] = {0, 2, 4, 5};
    static const be_case cases[] = {
        {one, 1, 1, 0, DEV_STAGE_BF16_COMPUTE, "bf16, 1 stage, adamw"},
        {three, 3, 2, 1, DEV_STAGE_BF16_COMPUTE | DEV_STAGE_RECOMPUTE,
         "bf16, 3 stages, 2 micro, lamb, recompute"},
        {three, 3, 2, 0, DEV_STAGE_BF16_COMPUTE | DEV_STAGE_BF16_STATE | DEV_STAGE_RECOMPUTE_ATTN,
         "bf16, 3 stages, bf16 state, attn"},
    };
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err)) {
        printf("    bf16 compute not compared: the CPU has none (%s)\n", err.msg);
        return;
    }
    be_run_cases(be, tol, cases, sizeof cases / sizeof cases[0]);
}

static void be_run_cases(const kn_be *be, const be_tol *tol, const be_case *cases, size_t ncases)
{
    for (size_t i = 0; i < ncases; i++) {
        dev_optim o;
        dev_optim_default(&o);
        o.lr = 1e-3f;
        o.clip = 0.5f;
        if (cases[i].lamb) {
            o.kind = DEV_OPT_LAMB;
            o.warmup = 1;
            o.total = 10;
        }
        dev_train *c = NULL, *g = NULL;
        int before = sl_test_failures;
        be_train_pair(be, cases[i].flags, tol, cases[i].b, cases[i].n, cases[i].micro, &o,
                      cases[i].name, &c, &g);
        printf("    %-36s %s on %s\n", cases[i].name,
               sl_test_failures == before ? (tol->params == 0 ? "bitwise equal" : "within tolerance")
                                          : "DIFFERENT",
               be->name);
        dev_train_free(c);
        dev_train_free(g);
    }
}

/* Checkpoints cross backends: written on one, read on the other. */
static void be_check_ckpt(const kn_be *be, const be_tol *tol, const char *dir)
{
    static const int one[] = {0, 5};
    sl_err err = {0};
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    dev_train *c = NULL, *g = NULL;
    be_train_pair(be, 0, tol, one, 1, 1, &o, "checkpoint source", &c, &g);
    if (!c || !g) {
        dev_train_free(c);
        dev_train_free(g);
        return;
    }
    char dg[512], dc[512];
    snprintf(dg, sizeof dg, "%s/from-%s", dir, be->name);
    snprintf(dc, sizeof dc, "%s/from-cpu", dir);
    CHECKF(dev_ckpt_save((dev_stage *[]){dev_train_stage(g, 0)}, 1, DEV_OPT_ADAMW, dg, NULL, 0, &err) == 0, "%s", err.msg);
    CHECKF(dev_ckpt_save((dev_stage *[]){dev_train_stage(c, 0)}, 1, DEV_OPT_ADAMW, dc, NULL, 0, &err) == 0, "%s", err.msg);
    /* Fresh trainers (same seed: it also keys dropout) whose weights and
     * moments are then scrambled, then loaded with the other backend's file. */
    dev_train *c2 = dev_train_create_on(&be_cfg, one, 1, BE_B, BE_T, 1, 7, NULL, 0, &err);
    dev_train *g2 = dev_train_create_on(&be_cfg, one, 1, BE_B, BE_T, 1, 7, be, 0, &err);
    CHECKF(c2 && g2, "%s", err.msg);
    for (int k = 0; k < 2 && c2 && g2; k++) {
        dev_stage *s = dev_train_stage(k ? g2 : c2, 0);
        CHECKF(dev_stage_pull(s, &err) == 0, "%s", err.msg);
        size_t n;
        int nt;
        const dev_tensor *t = dev_stage_tensors(s, &nt);
        float *p = dev_stage_params(s, &n), *mv = dev_stage_optim_state(s, NULL);
        for (int j = 0; j < nt; j++) /* (the alignment padding between tensors is not saved) */
            for (size_t i = t[j].offset; i < t[j].offset + t[j].numel; i++)
                p[i] = mv[i] = mv[n + i] = 0.5f;
        CHECKF(dev_stage_push(s, &err) == 0, "%s", err.msg);
    }
    if (c2 && g2) {
        CHECKF(dev_ckpt_load(dev_train_stage(c2, 0), DEV_OPT_ADAMW, dg, &err) == 0, "%s",
               err.msg);
        CHECKF(dev_ckpt_load(dev_train_stage(g2, 0), DEV_OPT_ADAMW, dc, &err) == 0, "%s",
               err.msg);
        /* A file holds exactly what its stage held: bitwise on any backend. */
        be_tol exact = {0, 0, 0, 0};
        be_same_state("cpu loaded the backend's checkpoint", c2, g, &exact, 0);
        be_same_state("backend loaded the cpu's checkpoint", g2, c, &exact, 0);
        CHECK(dev_stage_get_step(dev_train_stage(g2, 0)) == BE_STEPS);
        /* One more step from the loaded state on both. */
        dev_step_info ic, ig;
        be_one_step(c, &o, BE_STEPS, &ic);
        be_one_step(g2, &o, BE_STEPS, &ig);
        be_same_scalar("step after loading: loss", ig.loss, ic.loss, tol->loss);
        be_same_state("step after loading", g2, c, tol, 1);
        printf("    %-36s %s\n", "checkpoints across backends", "loaded and stepped");
    }
    dev_train_free(c);
    dev_train_free(g);
    dev_train_free(c2);
    dev_train_free(g2);
}

/* Two stages driven directly, two micro-batches in flight (one stash slot
 * each, 1F1B order) and the tied-embedding exchange as two devices run it. */
static void be_run_slots(const kn_be *be, unsigned flags, double *loss, dev_stage *st[2])
{
    enum { MICRO = 2, BM = BE_B / MICRO };
    static const int bounds[] = {0, 2, 5};
    sl_err err = {0};
    size_t nc = (size_t)BM * BE_T * be_cfg.hidden;
    float *act[MICRO], *grad[MICRO];
    for (int i = 0; i < 2; i++) {
        st[i] = dev_stage_create(&be_cfg, bounds[i], bounds[i + 1] - 1, BM, BE_T, MICRO, 7, be,
                                 flags, &err);
        CHECKF(st[i] != NULL, "%s", err.msg);
    }
    for (int m = 0; m < MICRO; m++) {
        act[m] = kt_alloc(nc);
        grad[m] = kt_alloc(nc);
    }
    *loss = 0;
    if (!st[0] || !st[1])
        goto out;
    dt_batch b;
    dt_make_batch(&b, BE_B, BE_T, be_cfg.vocab, 777);
    int total = 0;
    for (int k = 0; k < BE_B * BE_T; k++)
        total += b.lab[k] != -100;
    dev_micro mb[MICRO];
    for (int m = 0; m < MICRO; m++) {
        size_t off = (size_t)m * BM * BE_T;
        dev_micro x = {.B = BM, .T = BE_T, .tokens = b.tok + off, .segments = b.seg + off,
                       .valid = b.valid + off, .labels = b.lab + off, .seq0 = (uint64_t)m * BM,
                       .step = 1, .seed = 7, .loss_scale = 1.0f / (float)total, .train = 1};
        mb[m] = x;
    }
    for (int i = 0; i < 2; i++)
        CHECK(dev_stage_zero_grad(st[i], &err) == 0);
    static const int ops[] = {1, 2, -1, -2};
    for (int k = 0; k < 4; k++) {
        int m = abs(ops[k]) - 1;
        double l = 0;
        int msk = 0;
        if (ops[k] > 0) {
            CHECKF(dev_stage_forward(st[0], m, &mb[m], NULL, act[m], &l, &msk, &err) == 0, "%s",
                   err.msg);
            CHECKF(dev_stage_forward(st[1], m, &mb[m], act[m], NULL, &l, &msk, &err) == 0, "%s",
                   err.msg);
            *loss += l;
        } else {
            CHECKF(dev_stage_backward(st[1], m, &mb[m], NULL, grad[m], &err) == 0, "%s", err.msg);
            CHECKF(dev_stage_backward(st[0], m, &mb[m], grad[m], NULL, &err) == 0, "%s", err.msg);
        }
    }
    const float *ge, *gh;
    size_t ne, nh;
    CHECK(dev_stage_tied_grad(st[0], &ge, &ne, &err) == 0 && ge);
    float *sent_e = kt_alloc(ne);
    if (ge)
        memcpy(sent_e, ge, ne * sizeof(float));
    CHECK(dev_stage_tied_grad(st[1], &gh, &nh, &err) == 0 && gh);
    if (gh)
        CHECK(dev_stage_tied_add(st[0], gh, &err) == 0);
    CHECK(dev_stage_tied_add(st[1], sent_e, &err) == 0);
    free(sent_e);
    dt_free_batch(&b);
out:
    for (int m = 0; m < MICRO; m++) {
        free(act[m]);
        free(grad[m]);
    }
}

/* The sequence-classification head on `be` against the CPU: BE_STEPS steps
 * with one stage and with two (the head alone on the second), two
 * micro-batches, dropout on (the classifier's too); every stage's state;
 * then the logits a forward gives for every sequence. both: flags of both
 * sides (DEV_STAGE_BF16_COMPUTE). */
static void be_check_classify(const kn_be *be, const be_tol *tol, unsigned both)
{
    dev_config cc = be_cfg;
    cc.task = DEV_TASK_CLASSIFY;
    cc.num_labels = 5;
    cc.cls_dropout = 0.2f;
    static const int one[] = {0, 5}, two[] = {0, 4, 5};
    dev_optim o;
    dev_optim_default(&o);
    o.lr = 1e-3f;
    sl_err err = {0};
    for (int k = 0; k < 2; k++) {
        const char *what = both ? (k ? "bf16, classify, 2 stages" : "bf16, classify, 1 stage")
                                : (k ? "classify, 2 stages" : "classify, 1 stage");
        dev_train *c = dev_train_create_on(&cc, k ? two : one, k + 1, BE_B, BE_T, 2, 7, NULL, both,
                                           &err);
        dev_train *g = dev_train_create_on(&cc, k ? two : one, k + 1, BE_B, BE_T, 2, 7, be, both,
                                           &err);
        CHECKF(c && g, "%s: %s", what, err.msg);
        for (int s = 0; c && g && s < BE_STEPS; s++) {
            dt_batch b;
            dt_make_batch(&b, BE_B, BE_T, cc.vocab, 600 + 10 * (uint64_t)s);
            dt_classify(&b, cc.num_labels, 601 + 10 * (uint64_t)s);
            dev_batch db = dt_view(&b);
            dev_step_info ic = {0}, ig = {0};
            CHECKF(dev_train_step(c, &db, &o, &ic, &err) == 0, "%s: %s", what, err.msg);
            CHECKF(dev_train_step(g, &db, &o, &ig, &err) == 0, "%s: %s", what, err.msg);
            be_same_scalar(what, ig.loss, ic.loss, tol->loss);
            be_same_scalar(what, ig.grad_norm, ic.grad_norm, tol->grads);
            CHECK(ig.masked == ic.masked && ic.masked == BE_B); /* a class for each */
            dt_free_batch(&b);
        }
        if (c && g)
            be_same_state(what, g, c, tol, 1);
        if (c && g && k == 0) {
            dt_batch b;
            dt_make_batch(&b, BE_B, BE_T, cc.vocab, 700);
            dt_classify(&b, cc.num_labels, 701);
            /* the stage's micro-batch: the first half */
            dev_micro mb = {.B = BE_B / 2, .T = BE_T, .tokens = b.tok, .segments = b.seg,
                            .valid = b.valid, .labels = b.lab, .seed = 7, .loss_scale = 1};
            float lc[BE_B * 5], lg[BE_B * 5];
            double sc, sg;
            int mc, mg;
            CHECKF(dev_stage_forward_logits(dev_train_stage(c, 0), 0, &mb, NULL, lc, BE_B * 5, &mc,
                                            &sc, &err) == 0 &&
                       dev_stage_forward_logits(dev_train_stage(g, 0), 0, &mb, NULL, lg, BE_B * 5,
                                                &mg, &sg, &err) == 0,
                   "%s", err.msg);
            CHECK(mc == BE_B / 2 && mg == BE_B / 2);
            /* a forward's output, as the loss */
            be_same("classify: logits", lg, lc, BE_B / 2 * 5, tol->loss);
            be_same_scalar("classify: loss of the logits", sg, sc, tol->loss);
            dt_free_batch(&b);
        }
        printf("    %-36s %s\n", what, "compared");
        dev_train_free(c);
        dev_train_free(g);
    }
}

/* both: flags of both sides (DEV_STAGE_BF16_COMPUTE) */
static void be_check_slots(const kn_be *be, const be_tol *tol, unsigned both)
{
    dev_stage *c[2] = {0}, *g[2] = {0};
    double lc, lg;
    be_run_slots(NULL, both, &lc, c);
    be_run_slots(be, both | DEV_STAGE_RECOMPUTE, &lg, g); /* two slots share one work area */
    be_same_scalar("two slots in flight: loss", lg, lc, tol->loss);
    sl_err err = {0};
    for (int i = 0; i < 2 && c[i] && g[i]; i++) {
        CHECKF(dev_stage_pull(g[i], &err) == 0, "%s", err.msg);
        size_t n;
        float *w = dev_stage_grads(c[i], &n);
        char buf[96];
        snprintf(buf, sizeof buf, "two slots in flight: stage %d gradients", i);
        be_same(buf, dev_stage_grads(g[i], NULL), w, n, tol->grads);
        const float *t1, *t2;
        size_t n1, n2;
        CHECK(dev_stage_tied_grad(g[i], &t1, &n1, &err) == 0 && t1);
        if (t1) {
            float *copy = kt_alloc(n1);
            memcpy(copy, t1, n1 * sizeof(float));
            CHECK(dev_stage_tied_grad(c[i], &t2, &n2, &err) == 0 && t2 && n1 == n2);
            snprintf(buf, sizeof buf, "two slots in flight: stage %d tied gradient", i);
            if (t2)
                be_same(buf, copy, t2, n1, tol->grads);
            free(copy);
        }
    }
    printf("    %-36s %s\n", both ? "bf16, 2 stages, 2 in flight, recompute, tied"
                                 : "2 stages, 2 in flight, recompute, tied", "compared");
    for (int i = 0; i < 2; i++) {
        dev_stage_free(c[i]);
        dev_stage_free(g[i]);
    }
}

#endif
